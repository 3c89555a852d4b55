/* Training on the CUDA backend (bf16 inside) follows PyTorch's training of the same model: from
 * the same initial weights and the same S = 10 batches, the loss of every step (tests/reference/
 * gpt_torch_train.py, whose top comment documents the input format).
 *
 * Our side, each step: the whole model's forward and backward on the CUDA backend, composed through
 * the backend interface as the gpu worker runs it (tests/refmodel.h), then our AdamW kernel
 * (fy_adamw_update_range) on every unit, weight decay per fy_model_decay_segments segment, over fp32
 * master weights and moments kept here. PyTorch's side: torch.optim.AdamW with the same
 * hyperparameters and two parameter groups mirroring those segments, in fp32 (the reference: no
 * TF32, SDPA's math backend) and in bf16 autocast (to calibrate what bf16 costs). Per step:
 *   |ours - fp32| / fp32  <=  max(BF16_FACTOR x |bf16 - fp32| / fp32, LOSS_FLOOR)
 * and the loss must fall (last step below the first, on our side and on PyTorch fp32's). How far
 * the final weights moved, against PyTorch's, is printed but not held to a bound.
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

#include "common/base/dtype.h"
#include "common/model/model.h"
#include "gpu_worker/backend.h"
#include "opt_worker/adamw.h"
#include "tests/refmodel.h"
#include "tests/testutil.h"

#define NAME "test_cuda_torch_train"
#define BACKEND "cuda"

/* As test_cuda_torch.c: 2 layers, 4 heads of 32, 128 wide, 512 tokens, full context. */
static const struct fy_model_config CFG = {.n_layer = 2, .n_head = 4, .n_embd = 128, .vocab = 512,
                                         .ctx = 64};
enum { B = 4, T = 64, S = 10 };
static const uint64_t SEED = 20250311;

/* Constant lr, GPT-style betas; decay on matrices and embeddings only. */
static const struct fy_adamw_hparams HP = {
    .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};

/* The targets: a fixed function of the token (the residue of a multiple of it), so that there is
 * something to learn in 10 steps; one target per batch ignored (-1). */
#define TARGET_CLASSES 64

/* Ours (bf16 inside) against PyTorch fp32, per step: below max(BF16_FACTOR x PyTorch-bf16's
 * relative difference, LOSS_FLOOR). */
#define BF16_FACTOR 3.0
#define LOSS_FLOOR 1e-2

/* Time limit of each run of the script (PyTorch's start-up included). */
#define SCRIPT_TIMEOUT_S 300

/* gpt_torch_train.py's input format, version 1. */
#define TRAIN_MAGIC 0x54475946 /* "FYGT" as little-endian bytes */
#define TRAIN_VERSION 1

static char script[4096];
static struct fy_backend *backend;

struct batches {
    int32_t tokens[S][B * T], targets[S][B * T];
};

static void check(int rc, const struct fy_refmodel *m)
{
    if (rc != 0)
        fail_msg("%s", m->err);
}

static void make_batches(struct batches *d)
{
    uint64_t rng = SEED ^ 0x9e3779b97f4a7c15ull;
    for (int s = 0; s < S; s++) {
        for (int i = 0; i < B * T; i++) {
            d->tokens[s][i] = (int32_t)(fy_test_rand(&rng) % CFG.vocab);
            d->targets[s][i] = (int32_t)((d->tokens[s][i] * 7 + 3) % TARGET_CLASSES);
        }
        d->targets[s][fy_test_rand(&rng) % (B * T)] = -1; /* ignored */
    }
}

static int write_all(FILE *f, const void *p, size_t size, size_t n)
{
    return fwrite(p, size, n, f) == n ? 0 : -1;
}

/* The model's current parameters, the hyperparameters and the batches, in gpt_torch_train.py's
 * IN format. */
static void write_train_input(const struct fy_refmodel *m, const struct batches *d,
                              const char *path)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        fail_msg("cannot create %s", path);
    const int32_t hdr[10] = {TRAIN_MAGIC,           TRAIN_VERSION,         B,
                             T,                     (int32_t)CFG.n_layer,  (int32_t)CFG.n_head,
                             (int32_t)CFG.n_embd,   (int32_t)CFG.vocab,    (int32_t)CFG.ctx,
                             S};
    /* the float hyperparameters, widened exactly: PyTorch gets the values our kernel uses */
    const double hp[5] = {HP.lr, HP.beta1, HP.beta2, HP.eps, HP.weight_decay};
    int rc = write_all(f, hdr, sizeof hdr[0], 10);
    rc |= write_all(f, hp, sizeof hp[0], 5);
    for (unsigned u = 0; u < m->n_units; u++)
        rc |= write_all(f, m->params[u], sizeof(float), m->sizes[u]);
    for (int s = 0; s < S; s++) {
        rc |= write_all(f, d->tokens[s], sizeof(int32_t), B * T);
        rc |= write_all(f, d->targets[s], sizeof(int32_t), B * T);
    }
    rc |= fclose(f);
    if (rc != 0)
        fail_msg("cannot write %s", path);
}

/* n float64 values from a file of exactly that size. */
static void read_doubles(const char *path, double *out, size_t n)
{
    size_t len = 0;
    char *buf = fy_test_slurp(path, &len);
    if (buf == NULL)
        fail_msg("cannot read %s", path);
    if (len != n * sizeof(double))
        fail_msg("%s: %zu bytes, expected %zu (%zu float64)", path, len, n * sizeof(double), n);
    memcpy(out, buf, len);
    free(buf);
}

/* The parameters PyTorch wrote (float32, in the units' layout), into per-unit arrays. */
static float *read_params(const struct fy_refmodel *m, const char *path)
{
    size_t total = 0, len = 0;
    for (unsigned u = 0; u < m->n_units; u++)
        total += m->sizes[u];
    char *buf = fy_test_slurp(path, &len);
    if (buf == NULL)
        fail_msg("cannot read %s", path);
    if (len != total * sizeof(float))
        fail_msg("%s: %zu bytes, expected %zu (float32 parameters)", path, len,
                 total * sizeof(float));
    float *p = malloc(len);
    assert_non_null(p);
    memcpy(p, buf, len);
    free(buf);
    return p;
}

static double rel_diff(double a, double ref)
{
    double r = fabs(a - ref) / fabs(ref);
    return isnan(r) ? INFINITY : r;
}

/* Relative Frobenius difference of two updates (a - init against ref - init). */
static double update_rel(const float *a, const float *ref, const float *init, size_t n)
{
    double e2 = 0, r2 = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i], r = (double)ref[i] - init[i];
        e2 += d * d;
        r2 += r * r;
    }
    double rel = r2 > 0 ? sqrt(e2 / r2) : (e2 > 0 ? INFINITY : 0);
    return isnan(rel) ? INFINITY : rel;
}

/* S steps on our side: the losses into loss[], the final weights left in m->params. */
static void train_ours(struct fy_refmodel *m, const struct batches *d, double loss[S])
{
    const enum fy_adamw_impl impl = fy_adamw_best_impl();
    float *mom[FY_REFMODEL_MAX_UNITS] = {0}, *var[FY_REFMODEL_MAX_UNITS] = {0};
    for (unsigned u = 0; u < m->n_units; u++) {
        mom[u] = calloc(m->sizes[u], sizeof(float));
        var[u] = calloc(m->sizes[u], sizeof(float));
        assert_true(mom[u] != NULL && var[u] != NULL);
    }
    for (int s = 0; s < S; s++) {
        memcpy(m->tokens, d->tokens[s], sizeof d->tokens[s]);
        memcpy(m->targets, d->targets[s], sizeof d->targets[s]);
        check(fy_refmodel_forward_backward(m, backend), m);
        loss[s] = m->loss;
        if (!isfinite(loss[s]))
            fail_msg("step %d: our loss is not finite (%g)", s + 1, loss[s]);
        for (unsigned u = 0; u < m->n_units; u++) {
            const struct fy_adamw_tensor x = {.master = m->params[u], .m = mom[u], .v = var[u],
                                              .grad = m->grads[u], .grad_dtype = FY_DTYPE_F32,
                                              .weight_bf16 = NULL, .n = m->sizes[u]};
            struct fy_param_segment seg[FY_MODEL_MAX_SEGMENTS];
            int n_seg = fy_model_decay_segments(&CFG, u, seg);
            for (int k = 0; k < n_seg; k++) {
                struct fy_adamw_hparams hp = HP;
                if (!seg[k].decay)
                    hp.weight_decay = 0;
                assert_int_equal(fy_adamw_update_range(&hp, (uint64_t)s + 1, &x, seg[k].begin,
                                                       seg[k].end, impl),
                                 0);
            }
        }
    }
    for (unsigned u = 0; u < m->n_units; u++) {
        free(mom[u]);
        free(var[u]);
    }
}

static void test_malformed_input_refused(void **state)
{
    (void)state;
    char *dir = fy_test_tmpdir("torchtrain");
    assert_non_null(dir);
    char in[4200], out[4200];
    snprintf(in, sizeof in, "%s/in.bin", dir);
    snprintf(out, sizeof out, "%s/out.bin", dir);
    struct fy_refmodel m;
    check(fy_refmodel_init(&m, &CFG, B, T, SEED), &m);
    static struct batches d;
    make_batches(&d);
    write_train_input(&m, &d, in);
    assert_int_equal(truncate(in, (off_t)(10 * 4 + 5 * 8 + 4) - 1), 0); /* header, hp, 3 bytes */
    print_message("a malformed input is expected to be refused (the next line is its message):\n");
    char *argv[] = {"python3", script, "--dtype", "fp32", in, out, NULL};
    assert_int_equal(fy_refmodel_run(argv, SCRIPT_TIMEOUT_S), 2);
    assert_int_equal(access(out, F_OK), -1);
    fy_refmodel_free(&m);
    fy_test_rmdir(dir);
    free(dir);
}

static void test_training_vs_torch(void **state)
{
    (void)state;
    struct fy_refmodel m;
    check(fy_refmodel_init(&m, &CFG, B, T, SEED), &m);
    static struct batches d;
    make_batches(&d);

    char *dir = fy_test_tmpdir("torchtrain");
    assert_non_null(dir);
    char in[4200], out32[4200], out16[4200], par32[4200], par16[4200];
    snprintf(in, sizeof in, "%s/in.bin", dir);
    snprintf(out32, sizeof out32, "%s/losses_fp32.bin", dir);
    snprintf(out16, sizeof out16, "%s/losses_bf16.bin", dir);
    snprintf(par32, sizeof par32, "%s/params_fp32.bin", dir);
    snprintf(par16, sizeof par16, "%s/params_bf16.bin", dir);
    write_train_input(&m, &d, in); /* the initial weights */

    /* the initial weights, kept to measure how far each side moved them */
    float *init[FY_REFMODEL_MAX_UNITS] = {0};
    for (unsigned u = 0; u < m.n_units; u++) {
        init[u] = malloc(m.sizes[u] * sizeof(float));
        assert_non_null(init[u]);
        memcpy(init[u], m.params[u], m.sizes[u] * sizeof(float));
    }

    char *argv32[] = {"python3", script, "--dtype", "fp32", "--params", par32, in, out32, NULL};
    char *argv16[] = {"python3", script, "--dtype", "bf16", "--params", par16, in, out16, NULL};
    int rc;
    if ((rc = fy_refmodel_run(argv32, SCRIPT_TIMEOUT_S)) != 0)
        fail_msg("%s --dtype fp32 exited %d (input kept in %s)", script, rc, in);
    if ((rc = fy_refmodel_run(argv16, SCRIPT_TIMEOUT_S)) != 0)
        fail_msg("%s --dtype bf16 exited %d (input kept in %s)", script, rc, in);
    double t32[S], t16[S], ours[S];
    read_doubles(out32, t32, S);
    read_doubles(out16, t16, S);

    train_ours(&m, &d, ours);

    int ok = 1;
    double worst = 0, worst16 = 0;
    print_message("%s backend, %d AdamW steps (lr %g constant, betas %g %g, eps %g, wd %g on "
                  "matrices and embeddings), batch %d x %d:\n",
                  BACKEND, S, (double)HP.lr, (double)HP.beta1, (double)HP.beta2, (double)HP.eps,
                  (double)HP.weight_decay, B, T);
    print_message("%4s %12s %12s %12s %13s %13s %10s\n", "step", "ours", "torch fp32",
                  "torch bf16", "ours vs fp32", "bf16 vs fp32", "bound");
    for (int s = 0; s < S; s++) {
        double e = rel_diff(ours[s], t32[s]), e16 = rel_diff(t16[s], t32[s]);
        double bound = fmax(BF16_FACTOR * e16, LOSS_FLOOR);
        if (isinf(bound))
            bound = LOSS_FLOOR; /* PyTorch bf16 broken at this step: do not accept anything */
        int pass = e <= bound;
        ok &= pass;
        worst = fmax(worst, e);
        worst16 = fmax(worst16, e16);
        print_message("%4d %12.6f %12.6f %12.6f %13.3e %13.3e %10.2e  %s\n", s + 1, ours[s], t32[s],
                      t16[s], e, e16, bound, pass ? "pass" : "FAIL");
    }
    print_message("worst per-step relative difference: ours vs fp32 %.3e, PyTorch bf16 vs fp32 "
                  "%.3e\n",
                  worst, worst16);
    int falls = ours[S - 1] < ours[0] && t32[S - 1] < t32[0];
    print_message("the loss falls: ours %.6f -> %.6f, PyTorch fp32 %.6f -> %.6f%s\n", ours[0],
                  ours[S - 1], t32[0], t32[S - 1], falls ? "" : "  FAILED: it does not");
    ok &= falls;

    /* How far the weights moved, against PyTorch fp32's move (informational). */
    float *p32 = read_params(&m, par32), *p16 = read_params(&m, par16);
    size_t at = 0;
    print_message("%-8s %9s %20s %20s  (relative Frobenius difference of the updates)\n", "unit",
                  "n", "ours vs fp32", "bf16 vs fp32");
    for (unsigned u = 0; u < m.n_units; u++) {
        char name[16];
        switch (fy_model_unit_kind(&CFG, u)) {
        case FY_UNIT_EMBED: snprintf(name, sizeof name, "embed"); break;
        case FY_UNIT_BLOCK: snprintf(name, sizeof name, "block%u", u - 1); break;
        default: snprintf(name, sizeof name, "final"); break;
        }
        print_message("%-8s %9zu %20.3e %20.3e\n", name, m.sizes[u],
                      update_rel(m.params[u], p32 + at, init[u], m.sizes[u]),
                      update_rel(p16 + at, p32 + at, init[u], m.sizes[u]));
        at += m.sizes[u];
    }
    free(p32);
    free(p16);

    if (!ok)
        fail_msg("training on the %s backend does not follow PyTorch's (see above); the files are "
                 "kept in %s",
                 BACKEND, dir);
    for (unsigned u = 0; u < m.n_units; u++)
        free(init[u]);
    fy_refmodel_free(&m);
    fy_test_rmdir(dir);
    free(dir);
}

int main(void)
{
    if (!fy_refmodel_little_endian()) {
        printf(NAME ": SKIPPED: the reference's file format is little-endian\n");
        return FY_TEST_SKIP;
    }
    if (!fy_backend_cuda_built()) {
        printf(NAME ": SKIPPED: this build has no CUDA backend (nvcc not found)\n");
        return FY_TEST_SKIP;
    }
    if (fy_backend_open(&backend, BACKEND, 0) < 0) {
        printf(NAME ": SKIPPED: no usable CUDA device on this machine\n");
        return FY_TEST_SKIP;
    }
    if (!fy_refmodel_python_has("torch, numpy")) {
        printf(NAME ": SKIPPED: python3 with torch and numpy is needed (pip install torch numpy)\n");
        fy_backend_close(&backend);
        return FY_TEST_SKIP;
    }
    if (fy_refmodel_script("gpt_torch_train.py", script, sizeof script) != 0) {
        printf(NAME ": cannot read %s (run from the repository root, or set FUYOU_SRC to it)\n",
               script);
        fy_backend_close(&backend);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed_input_refused),
        cmocka_unit_test(test_training_vs_torch),
    };
    int failed = cmocka_run_group_tests_name("cuda GPT training vs PyTorch", tests, NULL, NULL);
    fy_backend_close(&backend);
    return failed;
}
