/* Packed batches on the CPU backend against transformers: documents packed in rows
 * (several a row, single-token ones, a row's leftover as padding: tokens whose target is -1), told
 * to the backend by their positions (gpu_worker/backend_ops.h), give each document what transformers
 * gives it alone (tests/reference/packed_ref.py: each document through the model by itself, in
 * float32, eager attention). For every family: GPT-2 (learned positions at the documents' own),
 * Llama, Qwen2 (q/k/v biases), Qwen3 (q/k norms, head_dim 14), Mistral (a window of 5 shorter than
 * most documents) and Phi-3 (a window of 7, untied head), 2 layers each, through the backend
 * interface as the gpu worker calls it (embeddings, blocks, logits, the head with its loss and
 * gradients, the blocks' and the embeddings' backward). Compared: every token's loss, from our
 * logits in double, within 1e-5 relative of transformers' (per-token cross-entropy; the padding's
 * 0); the batch's mean loss within 1e-5 relative; every parameter tensor's gradient (of the mean
 * over the batch's targets) per element within 1e-5 relative plus 1e-5 of the tensor's largest
 * (as tests/test_cpu_llama.c compares with transformers: fp32 both sides, other orders of
 * summation). And the checker can fail: the same batch without its positions is rejected.
 * Skipped, saying so, where python3 lacks torch or transformers, except under CI (CI=true), where
 * their absence is a failure. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/model/arch/arch.h"
#include "common/model/arch/gpt2.h"
#include "common/model/arch/llama.h"
#include "common/model/model.h"
#include "gpu_worker/backend.h"
#include "tests/refmodel.h"
#include "tests/testutil.h"

#define MAGIC 0x4B505946
#define LOSS_REL 1e-5
#define GRAD_REL 1e-5
#define GRAD_ABS 1e-5

static int have_transformers, in_ci;

struct packed_case {
    const char *name;
    const char *args; /* packed_ref.py's arguments after OUT */
    const struct fy_arch *arch;
};

/* The model a case's file describes (its header: see packed_ref.py). */
static struct fy_model_config case_config(const struct packed_case *pc, const int32_t *h)
{
    struct fy_model_config c = {.n_layer = (uint32_t)h[10],
                                .n_head = (uint32_t)h[6],
                                .n_embd = (uint32_t)h[5],
                                .vocab = (uint32_t)h[9],
                                .ctx = (uint32_t)h[11],
                                .arch = pc->arch};
    if (pc->arch == &fy_arch_gpt2)
        return c;
    *fy_llama_mut(&c) = (struct fy_llama_fields){.n_kv_head = (uint32_t)h[7],
                                                 .n_inter = (uint32_t)h[8],
                                                 .rms_eps = 1e-5f,
                                                 .rope_theta = 500000.0,
                                                 .rope_type = FY_ROPE_DEFAULT};
    const struct fy_family_options o = {.kv_heads = (uint64_t)h[7],
                                        .ffn = (uint64_t)h[8],
                                        .head_dim = (uint64_t)h[12],
                                        .tied = h[14],
                                        .rms_eps = 1e-5,
                                        .rope_theta = 500000.0};
    assert_int_equal(pc->arch->from_options(&o, &c), 0);
    fy_llama_mut(&c)->sliding_window = (uint32_t)h[13];
    fy_llama_mut(&c)->tied = (uint32_t)h[14];
    return c;
}

/* A tensor of a unit: its name and where it lies in the unit. */
struct tensor {
    char name[48];
    size_t at, n;
};

/* The tensors of unit u in layout order; returns how many. */
static int unit_tensors(const struct fy_model_config *c, unsigned u, struct tensor *t)
{
    size_t n = fy_model_unit_params(c, u);
    int k = 0;
    if (u >= 1 && u <= c->n_layer) {
        size_t at[16];
        const char *names[16];
        if (c->arch == &fy_arch_gpt2) {
            struct fy_gpt2_block_layout l;
            fy_gpt2_block_layout(c, &l);
            const char *nm[] = {"ln1_w", "ln1_b", "qkv_w", "qkv_b", "attn_w", "attn_b",
                                "ln2_w", "ln2_b", "fc_w",  "fc_b",  "proj_w", "proj_b"};
            size_t of[] = {l.ln1_w, l.ln1_b, l.qkv_w, l.qkv_b, l.attn_w, l.attn_b,
                           l.ln2_w, l.ln2_b, l.fc_w,  l.fc_b,  l.proj_w, l.proj_b};
            for (int i = 0; i < 12; i++)
                names[k] = nm[i], at[k++] = of[i];
        } else {
            struct fy_llama_unit_layout l;
            fy_llama_unit_layout(c, &l);
            const char *nm[] = {"input_norm", "q_proj",    "k_proj",  "v_proj",
                                "qkv_bias",   "o_proj",    "q_norm",  "k_norm",
                                "post_norm",  "gate_proj", "up_proj", "down_proj"};
            size_t of[] = {l.input_norm, l.q_proj,    l.k_proj,  l.v_proj,
                           l.q_bias,     l.o_proj,    l.q_norm,  l.k_norm,
                           l.post_norm,  l.gate_proj, l.up_proj, l.down_proj};
            for (int i = 0; i < 12; i++)
                if (of[i] != FY_LLAMA_ABSENT)
                    names[k] = nm[i], at[k++] = of[i];
        }
        for (int i = 0; i < k; i++) {
            snprintf(t[i].name, sizeof t[i].name, "block %u d%s", u, names[i]);
            t[i].at = at[i];
            t[i].n = (i + 1 < k ? at[i + 1] : n) - at[i];
        }
        return k;
    }
    size_t VC = (size_t)c->vocab * c->n_embd;
    if (u == 0 && c->arch == &fy_arch_gpt2) {
        t[0] = (struct tensor){"dwte", 0, VC};
        t[1] = (struct tensor){"dwpe", VC, n - VC};
        return 2;
    }
    if (u == 0) {
        t[0] = (struct tensor){"dembed_tokens", 0, n};
        return 1;
    }
    size_t norm = n > VC && c->arch != &fy_arch_gpt2 && !fy_llama(c)->tied ? n - VC : n;
    t[0] = (struct tensor){"dfinal norm", 0, norm};
    if (norm < n)
        t[k = 1] = (struct tensor){"dlm_head", norm, n - norm};
    return k + 1;
}

/* Per element |ours - ref| <= rel |ref| + abs max|ref|; prints one line, returns the bad count. */
static int compare(const char *what, const float *ours, const float *ref, size_t n, double rel,
                   double abs_floor)
{
    double scale = 0.0, worst = 0.0;
    size_t worst_i = 0;
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs((double)ref[i]));
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)ours[i] - ref[i]);
        if (!(err <= rel * fabs((double)ref[i]) + abs_floor * scale))
            bad++;
        if (!(err <= worst))
            worst = err, worst_i = i;
    }
    printf("  %-26s %6zu, max|ref| %.3e, worst |d| %.2e (%.1e of max) at %zu (ours %.8g, ref "
           "%.8g)%s\n",
           what, n, scale, worst, scale > 0 ? worst / scale : 0.0, worst_i, (double)ours[worst_i],
           (double)ref[worst_i], bad ? "  FAIL" : "");
    return bad;
}

/* The whole model on the CPU backend, unit by unit as the gpu worker runs it, with the positions
 * given (NULL: none): token_loss [N] from the logits (double log-softmax), *loss the head's, grads
 * [P] every unit's in order. */
static void run_model(const struct fy_model_config *c, int B, int T, const float *params,
                      const int32_t *tokens, const int32_t *targets, const int32_t *positions,
                      float *token_loss, double *loss, float *grads)
{
    unsigned L = c->n_layer, units = fy_model_unit_count(c);
    size_t N = (size_t)B * T, C = c->n_embd, NC = N * C, V = c->vocab, off[units + 1];
    off[0] = 0;
    for (unsigned u = 0; u < units; u++)
        off[u + 1] = off[u] + fy_model_unit_params(c, u);
    float *xs = malloc((L + 1) * NC * sizeof *xs), *dx = malloc(NC * sizeof *dx);
    float *dy = malloc(NC * sizeof *dy), *logits = malloc(N * V * sizeof *logits);
    assert_true(xs && dx && dy && logits);
    struct fy_backend *b = NULL;
    assert_int_equal(fy_backend_open(&b, "cpu", 0), 0);
    assert_int_equal(fy_backend_model_prepare(b, c, B, T), 0);
    const float *fin = params + off[L + 1];
    assert_int_equal(fy_backend_model_embed_forward(b, params, tokens, positions, xs), 0);
    for (unsigned l = 0; l < L; l++)
        assert_int_equal(fy_backend_model_block_forward(b, 1 + l, params + off[1 + l], positions,
                                                        xs + l * NC, xs + (l + 1) * NC, NULL),
                         0);
    assert_int_equal(fy_backend_model_logits(b, fin, params, xs + L * NC, logits), 0);
    for (size_t n = 0; n < N; n++) {
        const float *z = logits + n * V;
        double mx = -INFINITY, sum = 0.0;
        for (size_t v = 0; v < V; v++)
            mx = fmax(mx, z[v]);
        for (size_t v = 0; v < V; v++)
            sum += exp((double)z[v] - mx);
        token_loss[n] = targets[n] < 0 ? 0.0f : (float)(mx + log(sum) - z[targets[n]]);
    }
    assert_int_equal(fy_backend_model_head(b, fin, params, xs + L * NC, targets, loss, dy,
                                           grads + off[L + 1], grads),
                     0);
    for (unsigned l = L; l-- > 0;) {
        assert_int_equal(fy_backend_model_block_backward(b, 1 + l, params + off[1 + l], positions,
                                                         xs + l * NC, dy, dx, grads + off[1 + l],
                                                         NULL),
                         0);
        float *t = dx;
        dx = dy, dy = t;
    }
    assert_int_equal(fy_backend_model_embed_backward(b, tokens, positions, dy, grads), 0);
    fy_backend_destroy(&b);
    free(xs), free(dx), free(dy), free(logits);
}

/* Runs packed_ref.py once for every case, then compares each; returns the bad elements of all.
 * without_positions: our side runs without them (the checker's own test). */
static int packed_cases(const struct packed_case *cases, int n, int without_positions)
{
    if (!have_transformers) {
        if (in_ci)
            fail_msg(
                "python3 with torch and transformers is missing under CI: .ci/run installs them");
        printf("test_packed_cpu: skipped: python3 with torch and transformers is needed "
               "(make deps-python)\n");
        skip();
    }
    char script[4096];
    if (fy_refmodel_script("packed_ref.py", script, sizeof script) != 0)
        fail_msg("cannot read %s (run from the repository root)", script);
    char *dir = fy_test_tmpdir("packed");
    assert_non_null(dir);
    char paths[8][600], args[8][1024];
    char *argv[8 + 4];
    assert_true(n <= 8);
    argv[0] = "python3", argv[1] = script, argv[2] = "run";
    for (int i = 0; i < n; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/case%d.bin", dir, i);
        snprintf(args[i], sizeof args[i], "%s %s", paths[i], cases[i].args);
        argv[3 + i] = args[i];
    }
    argv[3 + n] = NULL;
    int st = fy_refmodel_run(argv, 300);
    if (st != 0)
        fail_msg("%s: exit status %d", script, st);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        char *buf = fy_test_slurp(paths[i], &len);
        assert_non_null(buf);
        int32_t h[16];
        assert_true(len >= sizeof h);
        memcpy(h, buf, sizeof h);
        assert_int_equal(h[0], MAGIC);
        assert_int_equal(h[1], 1);
        struct fy_model_config c = case_config(&cases[i], h);
        assert_int_equal(fy_model_config_validate(&c), 0);
        int B = h[3], T = h[4];
        size_t N = (size_t)B * T, P = 0;
        for (unsigned u = 0; u < fy_model_unit_count(&c); u++)
            P += fy_model_unit_params(&c, u);
        assert_int_equal((size_t)h[15], P);
        assert_int_equal(len, sizeof h + (2 * P + 1 + N) * sizeof(float) + 3 * N * sizeof(int32_t));
        const float *params = (const float *)(buf + sizeof h);
        const int32_t *tokens = (const int32_t *)(params + P), *targets = tokens + N;
        const int32_t *positions = targets + N;
        const float *loss_ref = (const float *)(positions + N), *grads_ref = loss_ref + N + 1;
        float *token_loss = malloc(N * sizeof *token_loss), *grads = calloc(P, sizeof *grads);
        assert_true(token_loss && grads);
        int docs = 0, padding = 0;
        for (size_t k = 0; k < N; k++) {
            docs += positions[k] == 0 && targets[k] >= 0;
            padding += positions[k] == 0 && targets[k] < 0 &&
                       (k % T == (size_t)T - 1 || positions[k + 1] == 0);
        }
        printf(
            " %s: B %d x T %d, %d documents with targets, %d single tokens without (padding)%s\n",
            cases[i].name, B, T, docs, padding, without_positions ? ", run without positions" : "");
        double loss;
        run_model(&c, B, T, params, tokens, targets, without_positions ? NULL : positions,
                  token_loss, &loss, grads);
        bad += compare("per-token loss", token_loss, loss_ref, N, LOSS_REL, 0.0);
        float lossf = (float)loss;
        bad += compare("loss", &lossf, loss_ref + N, 1, LOSS_REL, 0.0);
        size_t at = 0;
        for (unsigned u = 0; u < fy_model_unit_count(&c); u++) {
            struct tensor t[16];
            int k = unit_tensors(&c, u, t);
            for (int j = 0; j < k; j++)
                bad += compare(t[j].name, grads + at + t[j].at, grads_ref + at + t[j].at, t[j].n,
                               GRAD_REL, GRAD_ABS);
            at += fy_model_unit_params(&c, u);
        }
        free(token_loss), free(grads), free(buf);
    }
    fy_test_rmdir(dir);
    free(dir);
    return bad;
}

#define SHAPE "--batch 2 --seq 24 --layers 2 --vocab 300 "
static const struct packed_case all_families[] = {
    {"GPT-2 (learned positions)", SHAPE "--family gpt2 --embd 32 --heads 4 --seed 31",
     &fy_arch_gpt2},
    {"Llama, GQA 2:1", SHAPE "--family llama --embd 32 --heads 4 --kv-heads 2 --inter 40 --seed 32",
     &fy_arch_llama},
    {"Qwen2, q/k/v biases, tied",
     SHAPE "--family qwen2 --embd 36 --heads 6 --kv-heads 2 "
           "--inter 40 --tied --seed 33",
     &fy_arch_qwen2},
    {"Qwen3, q/k norms, head_dim 14",
     SHAPE "--family qwen3 --embd 44 --heads 4 --kv-heads 1 "
           "--inter 40 --head-dim 14 --seed 34",
     &fy_arch_qwen3},
    {"Mistral, window 5 < most documents",
     SHAPE "--family mistral --embd 36 --heads 3 "
           "--kv-heads 1 --inter 40 --head-dim 8 --window 5 --seed 35",
     &fy_arch_mistral},
    {"Phi-3, window 7, untied",
     SHAPE "--family phi3 --embd 40 --heads 4 --kv-heads 1 --inter 36 "
           "--window 7 --seed 36",
     &fy_arch_phi3},
};
#undef SHAPE

static void test_packed_matches_documents_alone(void **state)
{
    (void)state;
    int n = (int)(sizeof all_families / sizeof all_families[0]);
    assert_int_equal(packed_cases(all_families, n, 0), 0);
}

/* The comparison sees the documents: the same packed batch run without its positions (each row
 * one sequence) is rejected. */
static void test_checker_catches_missing_positions(void **state)
{
    (void)state;
    assert_true(packed_cases(&all_families[1], 1, 1) > 0);
}

int main(void)
{
    in_ci = fy_test_in_ci();
    have_transformers = fy_refmodel_python_has("torch, transformers");
    if (!have_transformers)
        printf("test_packed_cpu: python3 with torch and transformers not found: the tests against "
               "transformers are %s (make deps-python)\n",
               in_ci ? "FAILED under CI" : "skipped");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packed_matches_documents_alone),
        cmocka_unit_test(test_checker_catches_missing_positions),
    };
    return cmocka_run_group_tests_name("packed_cpu", tests, NULL, NULL);
}
