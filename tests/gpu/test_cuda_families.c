/* GPU test of the CUDA backend's Llama-like families (Qwen2, Qwen3, Mistral, Phi-3, and Llama with
 * an explicit head_dim) against the CPU backend (the fp32 reference) through the backend interface
 * the gpu worker uses. Each model is small (2 layers, 256 wide) and exercises its family's
 * variation: Qwen2 q/k/v biases (GQA 2:1, tied head); Qwen3 q/k norms with head_dim 64 != 256 / 8
 * and GQA 4:1; Mistral a sliding window smaller than T (16 of T = 37, and 40 of T = 160, where the
 * flash kernels skip whole key blocks) and one not smaller (64 of T = 37: plain causal); Phi-3 a
 * window of 24 with an untied head; Llama head_dim 48 (not 256 / 4, padded to 48 in the kernels).
 * Per model: one op at a time on the CPU's inputs (embedding, block forward, head with loss and
 * gradients, block backward and each tensor of the block's gradient, by name, including q/k/v
 * biases and the q/k norm weights), the whole model's loss, logits and every unit's gradient,
 * a rerun of the block backward giving the same bytes, and the loss over 3 SGD steps taken on each
 * backend from its own gradients. The whole model again with its rows packed with documents
 * (gpu_worker/backend_ops.h's positions: up to 2T/3 tokens each, single-token ones, each row's last
 * target ignored), against the CPU backend given the same documents, every family.
 * Tolerances (bf16 weights and activations, fp32 accumulation, against fp32; as test_cuda_llama):
 * relative Frobenius error of every output and gradient tensor below 3e-2 (2^-8 per bf16 rounding,
 * several per block); the bias and norm-weight gradients, sums over all rows of bf16 products,
 * the same bound; the loss within 5e-3 relative, each step of the trajectory within 1e-2. Also:
 * a head size the kernels do not take (136) refused with -EINVAL. Skips (77) without a CUDA build
 * or device. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/arch/arch.h"
#include "common/model/arch/llama.h"
#include "common/model/model.h"
#include "gpu_worker/backend.h"
#include "tests/refmodel.h"
#include "tests/testutil.h"

static struct fy_backend *cuda, *cpu;

#define rel_err fy_refmodel_rel_err

static float *falloc(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

/* One model of the cases: the shape, then what its family varies. */
struct family_case {
    const char *what;
    const struct fy_arch *arch;
    int T;
    uint32_t n_head, n_kv_head, head_dim, qkv_bias, qk_norm, window, tied;
};

static const struct family_case cases[] = {
    {"qwen2 q/k/v biases", &fy_arch_qwen2, 37, 4, 2, 0, 1, 0, 0, 1},
    {"qwen3 q/k norms, head_dim 64, GQA 4:1", &fy_arch_qwen3, 37, 8, 2, 64, 0, 1, 0, 1},
    {"mistral window 16 < T 37", &fy_arch_mistral, 37, 4, 1, 0, 0, 0, 16, 0},
    {"mistral window 40 < T 160 (key blocks skipped)", &fy_arch_mistral, 160, 4, 2, 0, 0, 0, 40,
     0},
    {"mistral window 64 >= T 37", &fy_arch_mistral, 37, 4, 2, 0, 0, 0, 64, 0},
    {"phi3 window 24, untied", &fy_arch_phi3, 37, 4, 4, 0, 0, 0, 24, 0},
    {"llama head_dim 48", &fy_arch_llama, 37, 4, 2, 48, 0, 0, 0, 0},
};
enum { N_CASES = sizeof cases / sizeof cases[0], B = 3 };

static struct fy_model_config case_config(const struct family_case *k)
{
    struct fy_model_config c = {
        .n_layer = 2,
        .n_head = k->n_head,
        .n_embd = 256,
        .vocab = 300,
        .ctx = 256,
        .arch = k->arch,
        .family = fy_llama_family((struct fy_llama_fields){.n_kv_head = k->n_kv_head,
                                                           .n_inter = 344,
                                                           .tied = k->tied,
                                                           .rope_type = FY_ROPE_DEFAULT,
                                                           .rms_eps = 1e-6f,
                                                           .rope_theta = 10000.0,
                                                           .head_dim = k->head_dim,
                                                           .qkv_bias = k->qkv_bias,
                                                           .qk_norm = k->qk_norm,
                                                           .sliding_window = k->window})};
    return c;
}

/* The block's tensors present in this family, in layout order, each to the next one's offset. */
struct part {
    const char *name;
    size_t at, end;
};
static int block_parts(const struct fy_model_config *c, struct part *p)
{
    struct fy_llama_unit_layout l;
    fy_llama_unit_layout(c, &l);
    const struct part all[] = {
        {"d input_norm", l.input_norm, 0}, {"d q_proj", l.q_proj, 0},
        {"d k_proj", l.k_proj, 0},         {"d v_proj", l.v_proj, 0},
        {"d qkv bias", l.q_bias, 0},       {"d o_proj", l.o_proj, 0},
        {"d q_norm", l.q_norm, 0},         {"d k_norm", l.k_norm, 0},
        {"d post_norm", l.post_norm, 0},   {"d gate_proj", l.gate_proj, 0},
        {"d up_proj", l.up_proj, 0},       {"d down_proj", l.down_proj, 0}};
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i].at != FY_LLAMA_ABSENT)
            p[n++] = all[i];
    for (int i = 0; i < n; i++)
        p[i].end = i + 1 < n ? p[i + 1].at : l.total;
    return n;
}

/* One op at a time on the same inputs (the CPU's outputs feed both). */
static void units_case(const struct family_case *k)
{
    struct fy_model_config c = case_config(k);
    const int T = k->T;
    struct fy_refmodel m;
    assert_int_equal(fy_model_config_validate(&c), 0);
    assert_int_equal(fy_refmodel_init(&m, &c, B, T, 43), 0);
    assert_int_equal(fy_backend_model_prepare(cuda, &c, B, T), 0);
    assert_int_equal(fy_backend_model_prepare(cpu, &c, B, T), 0);
    size_t N = (size_t)B * T, C = c.n_embd, NC = N * C;
    size_t ne = m.sizes[0], nb = m.sizes[1], nf = m.sizes[3];
    float *embed = m.params[0], *block = m.params[1], *fin = m.params[3];
    float *x[2] = {falloc(NC), falloc(NC)}, *y[2] = {falloc(NC), falloc(NC)};
    float *dx[2] = {falloc(NC), falloc(NC)}, *dfin[2] = {falloc(nf), falloc(nf)};
    float *demb[2] = {falloc(ne), falloc(ne)}, *dxb[2] = {falloc(NC), falloc(NC)};
    float *dp[2] = {falloc(nb), falloc(nb)};
    double loss[2];
    struct fy_backend *be[2] = {cuda, cpu};
    for (int b = 1; b >= 0; b--) { /* the CPU first: its x, y and dx are both backends' inputs */
        assert_int_equal(fy_backend_model_embed_forward(be[b], embed, m.tokens, NULL, x[b]), 0);
        assert_int_equal(fy_backend_model_block_forward(be[b], 1, block, NULL, x[1], y[b], NULL),
                         0);
        assert_int_equal(fy_backend_model_head(be[b], fin, embed, y[1], m.targets, &loss[b], dx[b],
                                             dfin[b], demb[b]),
                         0);
        assert_int_equal(fy_backend_model_block_backward(be[b], 1, block, NULL, x[1], dx[1], dxb[b],
                                                         dp[b], NULL),
                         0);
    }
    print_message("%s: units, loss gpu %.7f cpu %.7f\n", k->what, loss[0], loss[1]);
    assert_true(rel_err(x[0], x[1], NC, "embed forward") < 3e-2);
    assert_true(rel_err(y[0], y[1], NC, "block forward") < 3e-2);
    assert_true(fabs(loss[0] - loss[1]) <= 5e-3 * fabs(loss[1]));
    assert_true(rel_err(dx[0], dx[1], NC, "head dx") < 3e-2);
    assert_true(rel_err(dfin[0], dfin[1], nf, "head dnorm (and dlm_head)") < 3e-2);
    if (k->tied) /* the tied head's share of the embedding gradient */
        assert_true(rel_err(demb[0], demb[1], ne, "head dembed") < 3e-2);
    assert_true(rel_err(dxb[0], dxb[1], NC, "block backward dx") < 3e-2);
    struct part parts[16];
    int np = block_parts(&c, parts);
    for (int i = 0; i < np; i++)
        assert_true(rel_err(dp[0] + parts[i].at, dp[1] + parts[i].at, parts[i].end - parts[i].at,
                            parts[i].name) < 3e-2);
    /* determinism: the same backward again, the same bytes */
    float *dp_again = falloc(nb), *dx_again = falloc(NC);
    assert_int_equal(fy_backend_model_block_backward(cuda, 1, block, NULL, x[1], dx[1], dx_again,
                                                     dp_again, NULL),
                     0);
    assert_memory_equal(dp_again, dp[0], nb * sizeof(float));
    assert_memory_equal(dx_again, dxb[0], NC * sizeof(float));
    for (int b = 0; b < 2; b++) {
        free(x[b]), free(y[b]), free(dx[b]), free(dfin[b]), free(demb[b]), free(dxb[b]);
        free(dp[b]);
    }
    free(dp_again);
    free(dx_again);
    fy_refmodel_free(&m);
}

/* The whole model on both backends: the loss, the logits and every unit's gradient; packed: the rows
 * packed with documents of up to max_len tokens (each attending only to itself, at its own
 * positions). */
static void whole_model_case(const struct family_case *k, int max_len)
{
    struct fy_model_config c = case_config(k);
    struct fy_refmodel on_gpu, on_cpu;
    assert_int_equal(fy_refmodel_init(&on_gpu, &c, B, k->T, 41), 0);
    assert_int_equal(fy_refmodel_init(&on_cpu, &c, B, k->T, 41), 0);
    if (max_len > 0) {
        assert_int_equal(fy_refmodel_pack(&on_gpu, max_len, 44), 0);
        assert_int_equal(fy_refmodel_pack(&on_cpu, max_len, 44), 0);
    }
    if (fy_refmodel_forward_backward(&on_gpu, cuda) != 0)
        fail_msg("cuda: %s", on_gpu.err);
    if (fy_refmodel_forward_backward(&on_cpu, cpu) != 0)
        fail_msg("cpu: %s", on_cpu.err);
    print_message("%s%s: model, loss gpu %.7f cpu %.7f\n", k->what,
                  max_len > 0 ? ", packed documents" : "", on_gpu.loss, on_cpu.loss);
    assert_true(fabs(on_gpu.loss - on_cpu.loss) <= 5e-3 * fabs(on_cpu.loss));
    assert_true(rel_err(on_gpu.logits, on_cpu.logits, (size_t)B * k->T * c.vocab,
                        "model logits") < 3e-2);
    for (unsigned u = 0; u < on_gpu.n_units; u++) {
        char what[48];
        snprintf(what, sizeof what, "model grad unit %u", u);
        assert_true(rel_err(on_gpu.grads[u], on_cpu.grads[u], on_gpu.sizes[u], what) < 3e-2);
    }
    fy_refmodel_free(&on_gpu);
    fy_refmodel_free(&on_cpu);
}

/* 3 SGD steps (lr 0.05) on each backend from its own gradients: the losses stay together. */
static void trajectory_case(const struct family_case *k)
{
    struct fy_model_config c = case_config(k);
    struct fy_refmodel run[2];
    struct fy_backend *be[2] = {cuda, cpu};
    double loss[2][3];
    for (int b = 0; b < 2; b++) {
        assert_int_equal(fy_refmodel_init(&run[b], &c, B, k->T, 61), 0);
        for (int step = 0; step < 3; step++) {
            if (fy_refmodel_forward_backward(&run[b], be[b]) != 0)
                fail_msg("%s: %s", b ? "cpu" : "cuda", run[b].err);
            loss[b][step] = run[b].loss;
            for (unsigned u = 0; u < run[b].n_units; u++)
                for (size_t i = 0; i < run[b].sizes[u]; i++)
                    run[b].params[u][i] -= 0.05f * run[b].grads[u][i];
        }
    }
    print_message("%s: losses gpu %.6f %.6f %.6f cpu %.6f %.6f %.6f\n", k->what, loss[0][0],
                  loss[0][1], loss[0][2], loss[1][0], loss[1][1], loss[1][2]);
    for (int step = 0; step < 3; step++)
        assert_true(fabs(loss[0][step] - loss[1][step]) <= 1e-2 * fabs(loss[1][step]));
    assert_true(loss[1][2] < loss[1][0]); /* the steps do train: the comparison means something */
    fy_refmodel_free(&run[0]);
    fy_refmodel_free(&run[1]);
}

static void test_units_match_cpu(void **state)
{
    for (int i = 0; i < N_CASES; i++)
        units_case(&cases[i]);
}

static void test_whole_model_matches_cpu(void **state)
{
    for (int i = 0; i < N_CASES; i++)
        whole_model_case(&cases[i], 0);
}

/* Documents of up to 2T/3 tokens (T 160: several tiles, documents starting mid-tile; Mistral's
 * windows shorter than some of them), every family. */
static void test_packed_matches_cpu(void **state)
{
    for (int i = 0; i < N_CASES; i++)
        whole_model_case(&cases[i], 2 * cases[i].T / 3);
}

static void test_loss_trajectory_matches_cpu(void **state)
{
    for (int i = 0; i < N_CASES; i++)
        trajectory_case(&cases[i]);
}

/* A head_dim beyond the flash kernels' 128: refused with a line, nothing prepared. */
static void test_refuses_large_head_dim(void **state)
{
    struct fy_model_config c = case_config(&cases[1]);
    fy_llama_mut(&c)->head_dim = 136;
    assert_int_equal(fy_model_config_validate(&c), 0);
    print_message("(an error line about the head size is expected next)\n");
    assert_int_equal(fy_backend_model_prepare(cuda, &c, B, cases[1].T), -EINVAL);
}

int main(void)
{
    if (!fy_backend_cuda_built()) {
        printf("test_cuda_families: SKIPPED: this build has no CUDA backend (nvcc not found)\n");
        return FY_TEST_SKIP;
    }
    if (fy_backend_open(&cuda, "cuda", 2ull << 30) < 0) { /* 2 GiB: room for every case */
        printf("test_cuda_families: SKIPPED: no usable CUDA device on this machine\n");
        return FY_TEST_SKIP;
    }
    if (fy_backend_open(&cpu, "cpu", 0) < 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_units_match_cpu),
        cmocka_unit_test(test_whole_model_matches_cpu),
        cmocka_unit_test(test_packed_matches_cpu),
        cmocka_unit_test(test_loss_trajectory_matches_cpu),
        cmocka_unit_test(test_refuses_large_head_dim),
    };
    int failed = cmocka_run_group_tests_name("cuda Llama-like families", tests, NULL, NULL);
    fy_backend_destroy(&cuda);
    fy_backend_destroy(&cpu);
    return failed;
}
