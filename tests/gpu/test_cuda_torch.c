/* The whole GPT model on the CUDA backend (bf16 inside) against PyTorch (tests/reference/
 * gpt_torch.py): the loss and the gradient of every named tensor of every unit, composed through
 * the backend interface as the gpu worker runs it (embeddings, blocks kept as checkpoints and
 * recomputed in their backward, the tied head with an ignored target, the embedding backward
 * accumulating onto the head's wte gradient).
 *
 * The reference is PyTorch in fp32 (no TF32, SDPA's math backend). PyTorch's own bf16 autocast run
 * of the same model calibrates what bf16 costs: for each tensor, our relative Frobenius error
 * against PyTorch-fp32 must be below max(3 x PyTorch-bf16's, 2e-2); the loss within 1e-2 relative.
 * The fp32 reference itself is checked against the float64 numpy reference (gpt_ref.py), so that a
 * TF32 or other precision leak in it cannot widen what we accept.
 *
 * Skips (exit 77) without the CUDA backend, without a CUDA device, or without python3 and torch. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/model.h"
#include "gpu_worker/backend.h"
#include "tests/testutil.h"

#define REF_MAGIC 0x52475946 /* "FYGR" as little-endian bytes (gpt_ref.py's input format) */
#define REF_VERSION 1

/* Small but GPT-3-style in shape, within what the CUDA kernels take (n_embd and the head size
 * multiples of 8): 2 layers, 4 heads of 32, 128 wide, 512 tokens, full context. */
static const struct fy_gpt_config CFG = {.n_layer = 2, .n_head = 4, .n_embd = 128, .vocab = 512,
                                         .ctx = 64};
enum { B = 4, T = 64, MAX_UNITS = 8, MAX_TENSORS = 64 };
static const uint64_t SEED = 20240917;

/* Ours (bf16 inside) against PyTorch fp32: below max(BF16_FACTOR x PyTorch-bf16's error, FLOOR). */
#define BF16_FACTOR 3.0
#define FROB_FLOOR 2e-2
#define LOSS_RTOL 1e-2
/* PyTorch fp32 against the float64 numpy reference (as the CPU backend is held in
 * test_gpt_reference.c): fp32 rounding through the chain, nothing more. */
#define REF_LOSS_RTOL 1e-5
#define REF_FROB_RTOL 1e-4
/* Cross-entropy recomputed here in float64 from the logits PyTorch wrote, against its loss. */
#define LOGITS_LOSS_RTOL 1e-5

static char script[4096], ref_script[4096];
static struct fy_backend *cuda;

static int run(char *const argv[])
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        execvp(argv[0], argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

struct tensor {
    char name[32];
    unsigned unit;
    size_t off, n;
};

struct model {
    unsigned n_units;
    size_t sizes[MAX_UNITS];
    float *params[MAX_UNITS];
    float *grads[MAX_UNITS]; /* ours (the CUDA backend) */
    double loss;
    int32_t tokens[B * T], targets[B * T];
    struct tensor tensors[MAX_TENSORS];
    unsigned n_tensors;
};

/* A reference's output (gpt_ref.py's OUT format): the loss and every unit's gradient. */
struct result {
    double loss;
    double *grads[MAX_UNITS];
};

static float *falloc(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}

static void add_tensor(struct model *m, unsigned unit, const char *name, size_t off, size_t n)
{
    assert_true(m->n_tensors < MAX_TENSORS);
    struct tensor *t = &m->tensors[m->n_tensors++];
    if (fy_gpt_unit_kind(&CFG, unit) == FY_UNIT_BLOCK)
        snprintf(t->name, sizeof t->name, "block%u.%s", unit - 1, name);
    else
        snprintf(t->name, sizeof t->name, "%s", name);
    t->unit = unit;
    t->off = off;
    t->n = n;
}

/* Every named tensor of every unit, in order, with its place in the unit (common/model.h). */
static void list_tensors(struct model *m)
{
    const size_t C = CFG.n_embd, V = CFG.vocab;
    struct fy_gpt_block_layout l;
    fy_gpt_block_layout(&CFG, &l);
    for (unsigned u = 0; u < m->n_units; u++) {
        switch (fy_gpt_unit_kind(&CFG, u)) {
        case FY_UNIT_EMBED:
            add_tensor(m, u, "wte", 0, V * C);
            add_tensor(m, u, "wpe", V * C, (size_t)CFG.ctx * C);
            break;
        case FY_UNIT_BLOCK:
            add_tensor(m, u, "ln1_w", l.ln1_w, C);
            add_tensor(m, u, "ln1_b", l.ln1_b, C);
            add_tensor(m, u, "qkv_w", l.qkv_w, 3 * C * C);
            add_tensor(m, u, "qkv_b", l.qkv_b, 3 * C);
            add_tensor(m, u, "attn_w", l.attn_w, C * C);
            add_tensor(m, u, "attn_b", l.attn_b, C);
            add_tensor(m, u, "ln2_w", l.ln2_w, C);
            add_tensor(m, u, "ln2_b", l.ln2_b, C);
            add_tensor(m, u, "fc_w", l.fc_w, 4 * C * C);
            add_tensor(m, u, "fc_b", l.fc_b, 4 * C);
            add_tensor(m, u, "proj_w", l.proj_w, 4 * C * C);
            add_tensor(m, u, "proj_b", l.proj_b, C);
            break;
        case FY_UNIT_FINAL:
            add_tensor(m, u, "lnf_w", 0, C);
            add_tensor(m, u, "lnf_b", C, C);
            break;
        }
    }
    size_t covered = 0, total = 0;
    for (unsigned i = 0; i < m->n_tensors; i++)
        covered += m->tensors[i].n;
    for (unsigned u = 0; u < m->n_units; u++)
        total += m->sizes[u];
    assert_int_equal(covered, total); /* the list covers every parameter */
}

/* GPT-2 init, then noise on every bias and LayerNorm parameter (which GPT-2 sets to 0 or 1) so that
 * their gradients, and the paths through them, are not trivial (as test_gpt_reference.c). */
static void model_init(struct model *m)
{
    memset(m, 0, sizeof *m);
    m->n_units = fy_gpt_unit_count(&CFG);
    assert_true(m->n_units <= MAX_UNITS);
    uint64_t rng = SEED;
    const size_t C = CFG.n_embd;
    struct fy_gpt_block_layout l;
    fy_gpt_block_layout(&CFG, &l);
    for (unsigned u = 0; u < m->n_units; u++) {
        m->sizes[u] = fy_gpt_unit_params(&CFG, u);
        m->params[u] = falloc(m->sizes[u]);
        m->grads[u] = falloc(m->sizes[u]);
        fy_gpt_init_unit(&CFG, u, SEED, m->params[u]);
        float *p = m->params[u];
        switch (fy_gpt_unit_kind(&CFG, u)) {
        case FY_UNIT_EMBED: break;
        case FY_UNIT_FINAL:
            for (size_t i = 0; i < C; i++) {
                p[i] += fy_test_uniform(&rng, -0.2f, 0.2f);
                p[C + i] += fy_test_uniform(&rng, -0.1f, 0.1f);
            }
            break;
        case FY_UNIT_BLOCK: {
            const struct {
                size_t at, n;
                float amp;
            } noise[] = {{l.ln1_w, C, 0.2f},     {l.ln1_b, C, 0.1f}, {l.qkv_b, 3 * C, 0.05f},
                         {l.attn_b, C, 0.05f},   {l.ln2_w, C, 0.2f}, {l.ln2_b, C, 0.1f},
                         {l.fc_b, 4 * C, 0.05f}, {l.proj_b, C, 0.05f}};
            for (size_t k = 0; k < sizeof noise / sizeof noise[0]; k++)
                for (size_t i = 0; i < noise[k].n; i++)
                    p[noise[k].at + i] += fy_test_uniform(&rng, -noise[k].amp, noise[k].amp);
            break;
        }
        }
    }
    for (int i = 0; i < B * T; i++) {
        m->tokens[i] = (int32_t)(fy_test_rand(&rng) % CFG.vocab);
        m->targets[i] = (int32_t)(fy_test_rand(&rng) % CFG.vocab);
    }
    m->targets[T + 3] = -1; /* ignored: out of the mean, no gradient */
    list_tensors(m);
}

static void model_free(struct model *m)
{
    for (unsigned u = 0; u < m->n_units; u++) {
        free(m->params[u]);
        free(m->grads[u]);
    }
}

static void result_free(struct result *r, unsigned n_units)
{
    for (unsigned u = 0; u < n_units; u++)
        free(r->grads[u]);
}

/* Forward and backward on the CUDA backend, unit by unit as the gpu worker runs them (the same
 * composition as test_gpt_reference.c's on the CPU backend). */
static void cuda_forward_backward(struct model *m)
{
    const unsigned L = CFG.n_layer;
    const size_t act = (size_t)B * T * CFG.n_embd;
    float *xs = falloc(act * (L + 1)); /* xs[l]: input of block l; xs[L]: input of the head */
    float *dx = falloc(act), *dy = falloc(act);

    assert_int_equal(fy_backend_gpt_prepare(cuda, &CFG, B, T), 0);
    assert_int_equal(fy_backend_gpt_embed_forward(cuda, m->params[0], m->tokens, xs), 0);
    for (unsigned l = 0; l < L; l++)
        assert_int_equal(
            fy_backend_gpt_block_forward(cuda, m->params[1 + l], xs + act * l, xs + act * (l + 1)),
            0);
    /* the head overwrites dembed with its share of the wte gradient (wpe part zero) */
    assert_int_equal(fy_backend_gpt_head(cuda, m->params[L + 1], m->params[0], xs + act * L,
                                         m->targets, &m->loss, dy, m->grads[L + 1], m->grads[0]),
                     0);
    for (unsigned l = L; l-- > 0;) {
        assert_int_equal(fy_backend_gpt_block_backward(cuda, m->params[1 + l], xs + act * l, dy, dx,
                                                       m->grads[1 + l]),
                         0);
        float *t = dx;
        dx = dy;
        dy = t; /* dy now holds the gradient of this block's input */
    }
    assert_int_equal(fy_backend_gpt_embed_backward(cuda, m->tokens, dy, m->grads[0]), 0);
    free(xs);
    free(dx);
    free(dy);
}

static void write_all(FILE *f, const void *p, size_t size, size_t n)
{
    assert_int_equal(fwrite(p, size, n, f), n);
}

/* The input format of gpt_ref.py (see its top comment), which gpt_torch.py reads too. */
static void write_input(const struct model *m, const char *path)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    const int32_t hdr[9] = {REF_MAGIC, REF_VERSION,          B,
                            T,         (int32_t)CFG.n_layer, (int32_t)CFG.n_head,
                            (int32_t)CFG.n_embd, (int32_t)CFG.vocab, (int32_t)CFG.ctx};
    write_all(f, hdr, sizeof hdr[0], 9);
    for (unsigned u = 0; u < m->n_units; u++)
        write_all(f, m->params[u], sizeof(float), m->sizes[u]);
    write_all(f, m->tokens, sizeof(int32_t), B * T);
    write_all(f, m->targets, sizeof(int32_t), B * T);
    assert_int_equal(fclose(f), 0);
}

static void read_result(const struct model *m, const char *path, struct result *r)
{
    size_t len = 0, n = 1;
    for (unsigned u = 0; u < m->n_units; u++)
        n += m->sizes[u];
    char *buf = fy_test_slurp(path, &len);
    if (buf == NULL)
        fail_msg("cannot read %s", path);
    if (len != n * sizeof(double))
        fail_msg("%s: %zu bytes, expected %zu (loss + %zu gradients as float64)", path, len,
                 n * sizeof(double), n - 1);
    memset(r, 0, sizeof *r);
    const char *at = buf;
    memcpy(&r->loss, at, sizeof(double));
    at += sizeof(double);
    for (unsigned u = 0; u < m->n_units; u++) {
        r->grads[u] = malloc(m->sizes[u] * sizeof(double));
        assert_non_null(r->grads[u]);
        memcpy(r->grads[u], at, m->sizes[u] * sizeof(double));
        at += m->sizes[u] * sizeof(double);
    }
    free(buf);
}

/* Relative Frobenius error of a against ref (NaN anywhere gives infinity). */
static double frob_rel_f(const float *a, const double *ref, size_t n)
{
    double e2 = 0, r2 = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        e2 += d * d;
        r2 += ref[i] * ref[i];
    }
    double rel = r2 > 0 ? sqrt(e2 / r2) : (e2 > 0 ? INFINITY : 0);
    return isnan(rel) ? INFINITY : rel;
}

static double frob_rel_d(const double *a, const double *ref, size_t n)
{
    double e2 = 0, r2 = 0;
    for (size_t i = 0; i < n; i++) {
        double d = a[i] - ref[i];
        e2 += d * d;
        r2 += ref[i] * ref[i];
    }
    double rel = r2 > 0 ? sqrt(e2 / r2) : (e2 > 0 ? INFINITY : 0);
    return isnan(rel) ? INFINITY : rel;
}

static double norm_d(const double *a, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * a[i];
    return sqrt(s);
}

static double rel_diff(double a, double ref)
{
    double r = fabs(a - ref) / fabs(ref);
    return isnan(r) ? INFINITY : r;
}

/* Mean cross-entropy over the targets >= 0, in float64, from a logits file (float32 [B*T][V]). */
static double loss_from_logits(const struct model *m, const char *path)
{
    const size_t V = CFG.vocab;
    size_t len = 0;
    char *buf = fy_test_slurp(path, &len);
    if (buf == NULL)
        fail_msg("cannot read %s", path);
    if (len != (size_t)B * T * V * sizeof(float))
        fail_msg("%s: %zu bytes, expected %zu (float32 logits [%d][%zu])", path, len,
                 (size_t)B * T * V * sizeof(float), B * T, V);
    float *row = malloc(V * sizeof *row);
    assert_non_null(row);
    double sum = 0;
    int n = 0;
    for (int i = 0; i < B * T; i++) {
        memcpy(row, buf + (size_t)i * V * sizeof(float), V * sizeof(float));
        if (m->targets[i] < 0)
            continue;
        double mx = -INFINITY, se = 0;
        for (size_t v = 0; v < V; v++)
            mx = fmax(mx, (double)row[v]);
        for (size_t v = 0; v < V; v++)
            se += exp((double)row[v] - mx);
        sum += mx + log(se) - (double)row[m->targets[i]];
        n++;
    }
    free(row);
    free(buf);
    return n ? sum / n : 0;
}

static void paths(char *dir, char in[], char out32[], char out16[], char out64[], char lg32[],
                  char lg16[])
{
    const size_t len = 4200;
    snprintf(in, len, "%s/in.bin", dir);
    snprintf(out32, len, "%s/torch_fp32.bin", dir);
    snprintf(out16, len, "%s/torch_bf16.bin", dir);
    snprintf(out64, len, "%s/numpy_f64.bin", dir);
    snprintf(lg32, len, "%s/logits_fp32.bin", dir);
    snprintf(lg16, len, "%s/logits_bf16.bin", dir);
}

static void test_malformed_input_refused(void **state)
{
    char *dir = fy_test_tmpdir("cudatorch");
    assert_non_null(dir);
    char in[4200], out[4200];
    snprintf(in, sizeof in, "%s/in.bin", dir);
    snprintf(out, sizeof out, "%s/out.bin", dir);
    struct model m;
    model_init(&m);
    write_input(&m, in);
    assert_int_equal(truncate(in, (off_t)(9 * 4 + 4) - 1), 0); /* header plus 3 bytes */
    print_message("a malformed input is expected to be refused (the next line is its message):\n");
    char *argv[] = {"python3", script, "--dtype", "fp32", in, out, NULL};
    assert_int_equal(run(argv), 2);
    assert_int_equal(access(out, F_OK), -1);
    model_free(&m);
    fy_test_rmdir(dir);
    free(dir);
}

static void test_model_vs_torch(void **state)
{
    struct model m;
    model_init(&m);
    cuda_forward_backward(&m);

    char *dir = fy_test_tmpdir("cudatorch");
    assert_non_null(dir);
    char in[4200], out32[4200], out16[4200], out64[4200], lg32[4200], lg16[4200];
    paths(dir, in, out32, out16, out64, lg32, lg16);
    write_input(&m, in);

    char *argv32[] = {"python3", script, "--dtype", "fp32", "--logits", lg32, in, out32, NULL};
    char *argv16[] = {"python3", script, "--dtype", "bf16", "--logits", lg16, in, out16, NULL};
    char *argv64[] = {"python3", ref_script, in, out64, NULL};
    int rc;
    if ((rc = run(argv32)) != 0)
        fail_msg("%s --dtype fp32 exited %d (input kept in %s)", script, rc, in);
    if ((rc = run(argv16)) != 0)
        fail_msg("%s --dtype bf16 exited %d (input kept in %s)", script, rc, in);
    if ((rc = run(argv64)) != 0)
        fail_msg("%s exited %d (input kept in %s)", ref_script, rc, in);
    struct result r32, r16, r64;
    read_result(&m, out32, &r32);
    read_result(&m, out16, &r16);
    read_result(&m, out64, &r64);
    int ok = 1;

    /* 1. The reference: PyTorch fp32 against float64 numpy. */
    double ref_loss_rel = rel_diff(r32.loss, r64.loss);
    double ref_worst = 0;
    const char *ref_worst_name = "";
    for (unsigned i = 0; i < m.n_tensors; i++) {
        const struct tensor *t = &m.tensors[i];
        double e = frob_rel_d(r32.grads[t->unit] + t->off, r64.grads[t->unit] + t->off, t->n);
        if (!(e <= ref_worst)) {
            ref_worst = e;
            ref_worst_name = t->name;
        }
    }
    int ref_ok = ref_loss_rel <= REF_LOSS_RTOL && ref_worst < REF_FROB_RTOL;
    print_message("reference check, PyTorch fp32 vs float64 numpy: loss relative error %.2e (bound "
                  "%.0e), worst tensor %s %.2e (bound %.0e)%s\n",
                  ref_loss_rel, REF_LOSS_RTOL, ref_worst_name, ref_worst, REF_FROB_RTOL,
                  ref_ok ? "" : "  FAILED: the fp32 reference is not fp32-accurate (TF32?)");
    ok &= ref_ok;

    /* 2. Logits: the CUDA backend has no logits output (its head returns the loss and gradients
     * only), so a logits comparison against it needs a logits output that the backend does not
     * have yet. Here PyTorch's logits are checked for self-consistency: their cross-entropy,
     * recomputed in float64, must give PyTorch's loss; our side is compared through the loss. */
    double ce32 = loss_from_logits(&m, lg32), ce16 = loss_from_logits(&m, lg16);
    double ce32_rel = rel_diff(ce32, r32.loss), ce16_rel = rel_diff(ce16, r16.loss);
    print_message("logits self-consistency: cross-entropy of the fp32 logits %.9f vs loss %.9f "
                  "(%.2e), of the bf16 logits %.9f vs loss %.9f (%.2e), bound %.0e\n",
                  ce32, r32.loss, ce32_rel, ce16, r16.loss, ce16_rel, LOGITS_LOSS_RTOL);
    if (!(ce32_rel <= LOGITS_LOSS_RTOL && ce16_rel <= LOGITS_LOSS_RTOL)) {
        print_message("  FAILED: the logits written do not give the loss reported\n");
        ok = 0;
    }

    /* 3. Ours against PyTorch fp32, calibrated by PyTorch bf16. */
    double loss_rel = rel_diff(m.loss, r32.loss), loss16_rel = rel_diff(r16.loss, r32.loss);
    int loss_ok = loss_rel <= LOSS_RTOL;
    print_message("loss: ours %.6f, PyTorch fp32 %.6f, PyTorch bf16 %.6f; ours vs fp32 %.2e, "
                  "bf16 vs fp32 %.2e (bound %.0e)%s\n",
                  m.loss, r32.loss, r16.loss, loss_rel, loss16_rel, LOSS_RTOL,
                  loss_ok ? "" : "  FAILED");
    ok &= loss_ok;
    print_message("%-16s %9s %11s %13s %13s %10s  %s\n", "tensor", "n", "|fp32 grad|",
                  "ours vs fp32", "bf16 vs fp32", "bound", "");
    unsigned n_fail = 0;
    for (unsigned i = 0; i < m.n_tensors; i++) {
        const struct tensor *t = &m.tensors[i];
        const double *ref = r32.grads[t->unit] + t->off;
        double ours = frob_rel_f(m.grads[t->unit] + t->off, ref, t->n);
        double torch16 = frob_rel_d(r16.grads[t->unit] + t->off, ref, t->n);
        double bound = fmax(BF16_FACTOR * torch16, FROB_FLOOR);
        if (isinf(bound))
            bound = FROB_FLOOR; /* PyTorch bf16 broken on this tensor: do not accept anything */
        int pass = ours < bound;
        n_fail += !pass;
        print_message("%-16s %9zu %11.3e %13.3e %13.3e %10.2e  %s%s\n", t->name, t->n,
                      norm_d(ref, t->n), ours, torch16, bound, pass ? "pass" : "FAIL",
                      bound > 0.1 ? " (bound loose: PyTorch bf16 is far off here)" : "");
    }
    if (n_fail) {
        print_message("%u of %u tensors out of bounds\n", n_fail, m.n_tensors);
        ok = 0;
    }
    if (!ok)
        fail_msg("the CUDA backend disagrees with PyTorch (see above); the files are kept in %s",
                 dir);

    result_free(&r32, m.n_units);
    result_free(&r16, m.n_units);
    result_free(&r64, m.n_units);
    model_free(&m);
    fy_test_rmdir(dir);
    free(dir);
}

int main(void)
{
    const uint16_t one = 1;
    uint8_t first;
    memcpy(&first, &one, 1);
    if (first != 1) {
        printf("test_cuda_torch: SKIPPED: the reference's file format is little-endian\n");
        return FY_TEST_SKIP;
    }
    if (!fy_backend_cuda_built()) {
        printf("test_cuda_torch: SKIPPED: this build has no CUDA backend (nvcc not found)\n");
        return FY_TEST_SKIP;
    }
    if (fy_backend_open(&cuda, "cuda", 0) < 0) {
        printf("test_cuda_torch: SKIPPED: no usable CUDA device on this machine\n");
        return FY_TEST_SKIP;
    }
    if (system("python3 -c 'import torch, numpy' >/dev/null 2>&1") != 0) {
        printf("test_cuda_torch: SKIPPED: python3 with torch and numpy is needed (pip install "
               "torch numpy)\n");
        fy_backend_close(&cuda);
        return FY_TEST_SKIP;
    }
    const char *src = getenv("FUYOU_SRC");
    snprintf(script, sizeof script, "%s/tests/reference/gpt_torch.py", src ? src : ".");
    snprintf(ref_script, sizeof ref_script, "%s/tests/reference/gpt_ref.py", src ? src : ".");
    if (access(script, R_OK) != 0 || access(ref_script, R_OK) != 0) {
        printf("test_cuda_torch: cannot read %s or %s (run from the repository root, or set "
               "FUYOU_SRC to it)\n",
               script, ref_script);
        fy_backend_close(&cuda);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed_input_refused),
        cmocka_unit_test(test_model_vs_torch),
    };
    int failed = cmocka_run_group_tests_name("cuda GPT vs PyTorch", tests, NULL, NULL);
    fy_backend_close(&cuda);
    return failed;
}
