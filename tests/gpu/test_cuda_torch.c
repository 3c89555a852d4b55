/* The whole GPT model on the CUDA backend (bf16 inside) against PyTorch (tests/reference/
 * gpt_torch.py): the loss and the gradient of every named tensor of every unit, composed through
 * the backend interface as the gpu worker runs it (embeddings, blocks kept as checkpoints and
 * recomputed in their backward, the tied head with an ignored target, the embedding backward
 * accumulating onto the head's wte gradient; tests/refmodel.h).
 *
 * The reference is PyTorch in fp32 (no TF32, SDPA's math backend). PyTorch's own bf16 autocast run
 * of the same model calibrates what bf16 costs: for each tensor, our relative Frobenius error
 * against PyTorch-fp32 must be below max(3 x PyTorch-bf16's, 2e-2); the loss within 1e-2 relative.
 * The fp32 reference itself is checked against the float64 numpy reference (gpt_ref.py), so that a
 * TF32 or other precision leak in it cannot widen what we accept.
 *
 * Skips (exit 77) without the CUDA backend, without a CUDA device, or without python3 and torch. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/model/arch/gpt2.h"
#include "common/model/model.h"
#include "gpu_worker/backend.h"
#include "tests/refmodel.h"
#include "tests/testutil.h"

/* Small but GPT-3-style in shape, within what the CUDA kernels take (n_embd and the head size
 * multiples of 8): 2 layers, 4 heads of 32, 128 wide, 512 tokens, full context. */
static const struct fy_model_config CFG = {.n_layer = 2, .n_head = 4, .n_embd = 128, .vocab = 512,
                                         .ctx = 64};
enum { B = 4, T = 64, MAX_TENSORS = 64 };
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

/* Time limit of each run of a reference script (PyTorch's start-up included). */
#define SCRIPT_TIMEOUT_S 300

static char script[4096], ref_script[4096];
static struct fy_backend *cuda;

struct tensor {
    char name[32];
    unsigned unit;
    size_t off, n;
};

/* The named tensors of the model's units. */
struct tensors {
    struct tensor t[MAX_TENSORS];
    unsigned n;
};

/* fy_refmodel calls: a failure fails the test with the reason. */
static void check(int rc, const struct fy_refmodel *m)
{
    if (rc != 0)
        fail_msg("%s", m->err);
}

static void add_tensor(struct tensors *ts, unsigned unit, const char *name, size_t off, size_t n)
{
    assert_true(ts->n < MAX_TENSORS);
    struct tensor *t = &ts->t[ts->n++];
    if (fy_model_unit_kind(&CFG, unit) == FY_UNIT_BLOCK)
        snprintf(t->name, sizeof t->name, "block%u.%s", unit - 1, name);
    else
        snprintf(t->name, sizeof t->name, "%s", name);
    t->unit = unit;
    t->off = off;
    t->n = n;
}

/* Every named tensor of every unit, in order, with its place in the unit (common/model/model.h). */
static void list_tensors(const struct fy_refmodel *m, struct tensors *ts)
{
    const size_t C = CFG.n_embd, V = CFG.vocab;
    struct fy_gpt2_block_layout l;
    fy_gpt2_block_layout(&CFG, &l);
    ts->n = 0;
    for (unsigned u = 0; u < m->n_units; u++) {
        switch (fy_model_unit_kind(&CFG, u)) {
        case FY_UNIT_EMBED:
            add_tensor(ts, u, "wte", 0, V * C);
            add_tensor(ts, u, "wpe", V * C, (size_t)CFG.ctx * C);
            break;
        case FY_UNIT_BLOCK:
            add_tensor(ts, u, "ln1_w", l.ln1_w, C);
            add_tensor(ts, u, "ln1_b", l.ln1_b, C);
            add_tensor(ts, u, "qkv_w", l.qkv_w, 3 * C * C);
            add_tensor(ts, u, "qkv_b", l.qkv_b, 3 * C);
            add_tensor(ts, u, "attn_w", l.attn_w, C * C);
            add_tensor(ts, u, "attn_b", l.attn_b, C);
            add_tensor(ts, u, "ln2_w", l.ln2_w, C);
            add_tensor(ts, u, "ln2_b", l.ln2_b, C);
            add_tensor(ts, u, "fc_w", l.fc_w, 4 * C * C);
            add_tensor(ts, u, "fc_b", l.fc_b, 4 * C);
            add_tensor(ts, u, "proj_w", l.proj_w, 4 * C * C);
            add_tensor(ts, u, "proj_b", l.proj_b, C);
            break;
        case FY_UNIT_FINAL:
            add_tensor(ts, u, "lnf_w", 0, C);
            add_tensor(ts, u, "lnf_b", C, C);
            break;
        }
    }
    size_t covered = 0, total = 0;
    for (unsigned i = 0; i < ts->n; i++)
        covered += ts->t[i].n;
    for (unsigned u = 0; u < m->n_units; u++)
        total += m->sizes[u];
    assert_int_equal(covered, total); /* the list covers every parameter */
}

/* The model of this test, and its named tensors. */
static void model_init(struct fy_refmodel *m, struct tensors *ts)
{
    check(fy_refmodel_init(m, &CFG, B, T, SEED), m);
    list_tensors(m, ts);
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
static double loss_from_logits(const struct fy_refmodel *m, const char *path)
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
    struct fy_refmodel m;
    struct tensors ts;
    model_init(&m, &ts);
    check(fy_refmodel_write_input(&m, in), &m);
    assert_int_equal(truncate(in, (off_t)(9 * 4 + 4) - 1), 0); /* header plus 3 bytes */
    print_message("a malformed input is expected to be refused (the next line is its message):\n");
    char *argv[] = {"python3", script, "--dtype", "fp32", in, out, NULL};
    assert_int_equal(fy_refmodel_run(argv, SCRIPT_TIMEOUT_S), 2);
    assert_int_equal(access(out, F_OK), -1);
    fy_refmodel_free(&m);
    fy_test_rmdir(dir);
    free(dir);
}

static void test_model_vs_torch(void **state)
{
    struct fy_refmodel m;
    struct tensors ts;
    model_init(&m, &ts);
    check(fy_refmodel_forward_backward(&m, cuda), &m);

    char *dir = fy_test_tmpdir("cudatorch");
    assert_non_null(dir);
    char in[4200], out32[4200], out16[4200], out64[4200], lg32[4200], lg16[4200];
    paths(dir, in, out32, out16, out64, lg32, lg16);
    check(fy_refmodel_write_input(&m, in), &m);

    char *argv32[] = {"python3", script, "--dtype", "fp32", "--logits", lg32, in, out32, NULL};
    char *argv16[] = {"python3", script, "--dtype", "bf16", "--logits", lg16, in, out16, NULL};
    char *argv64[] = {"python3", ref_script, in, out64, NULL};
    int rc;
    if ((rc = fy_refmodel_run(argv32, SCRIPT_TIMEOUT_S)) != 0)
        fail_msg("%s --dtype fp32 exited %d (input kept in %s)", script, rc, in);
    if ((rc = fy_refmodel_run(argv16, SCRIPT_TIMEOUT_S)) != 0)
        fail_msg("%s --dtype bf16 exited %d (input kept in %s)", script, rc, in);
    if ((rc = fy_refmodel_run(argv64, SCRIPT_TIMEOUT_S)) != 0)
        fail_msg("%s exited %d (input kept in %s)", ref_script, rc, in);
    struct fy_refmodel_output r32, r16, r64;
    check(fy_refmodel_read_output(&m, out32, &r32), &m);
    check(fy_refmodel_read_output(&m, out16, &r16), &m);
    check(fy_refmodel_read_output(&m, out64, &r64), &m);
    int ok = 1;

    /* 1. The reference: PyTorch fp32 against float64 numpy. */
    double ref_loss_rel = rel_diff(r32.loss, r64.loss);
    double ref_worst = 0;
    const char *ref_worst_name = "";
    for (unsigned i = 0; i < ts.n; i++) {
        const struct tensor *t = &ts.t[i];
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

    /* 2. Logits. PyTorch's are checked for self-consistency first (their cross-entropy, recomputed
     * in float64, gives PyTorch's loss); then ours (the backend's logits output on the head's
     * input) against PyTorch fp32's, with the same calibrated bound as the gradients. */
    double ce32 = loss_from_logits(&m, lg32), ce16 = loss_from_logits(&m, lg16);
    double ce32_rel = rel_diff(ce32, r32.loss), ce16_rel = rel_diff(ce16, r16.loss);
    print_message("logits self-consistency: cross-entropy of the fp32 logits %.9f vs loss %.9f "
                  "(%.2e), of the bf16 logits %.9f vs loss %.9f (%.2e), bound %.0e\n",
                  ce32, r32.loss, ce32_rel, ce16, r16.loss, ce16_rel, LOGITS_LOSS_RTOL);
    if (!(ce32_rel <= LOGITS_LOSS_RTOL && ce16_rel <= LOGITS_LOSS_RTOL)) {
        print_message("  FAILED: the logits written do not give the loss reported\n");
        ok = 0;
    }
    {
        size_t nl = (size_t)B * T * CFG.vocab, len32 = 0, len16 = 0;
        char *l32 = fy_test_slurp(lg32, &len32), *l16 = fy_test_slurp(lg16, &len16);
        assert_true(l32 != NULL && l16 != NULL && len32 == nl * 4 && len16 == nl * 4);
        double *ref = malloc(nl * sizeof *ref);
        float *theirs16 = malloc(nl * sizeof *theirs16);
        assert_true(ref != NULL && theirs16 != NULL);
        for (size_t i = 0; i < nl; i++) {
            float v;
            memcpy(&v, l32 + 4 * i, 4);
            ref[i] = v;
        }
        memcpy(theirs16, l16, nl * 4);
        double ours_err = frob_rel_f(m.logits, ref, nl), bf16_err = frob_rel_f(theirs16, ref, nl);
        double bound = fmax(BF16_FACTOR * bf16_err, FROB_FLOOR);
        int logits_ok = ours_err < bound;
        print_message("logits [%d][%u]: ours vs fp32 %.3e, bf16 vs fp32 %.3e, bound %.2e %s\n", B * T,
                      CFG.vocab, ours_err, bf16_err, bound, logits_ok ? "pass" : "FAIL");
        ok &= logits_ok;
        free(ref);
        free(theirs16);
        free(l32);
        free(l16);
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
    for (unsigned i = 0; i < ts.n; i++) {
        const struct tensor *t = &ts.t[i];
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
        print_message("%u of %u tensors out of bounds\n", n_fail, ts.n);
        ok = 0;
    }
    if (!ok)
        fail_msg("the CUDA backend disagrees with PyTorch (see above); the files are kept in %s",
                 dir);

    fy_refmodel_output_free(&m, &r32);
    fy_refmodel_output_free(&m, &r16);
    fy_refmodel_output_free(&m, &r64);
    fy_refmodel_free(&m);
    fy_test_rmdir(dir);
    free(dir);
}

int main(void)
{
    if (!fy_refmodel_little_endian()) {
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
    if (!fy_refmodel_python_has("torch, numpy")) {
        printf("test_cuda_torch: SKIPPED: python3 with torch and numpy is needed (pip install "
               "torch numpy)\n");
        fy_backend_close(&cuda);
        return FY_TEST_SKIP;
    }
    int unreadable = fy_refmodel_script("gpt_torch.py", script, sizeof script);
    unreadable |= fy_refmodel_script("gpt_ref.py", ref_script, sizeof ref_script);
    if (unreadable) {
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
