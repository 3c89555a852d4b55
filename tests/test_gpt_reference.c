/* The whole GPT-2 model on the CPU backend against an independent float64 reference in Python with
 * numpy (tests/reference/gpt_ref.py): the loss and the gradient of every parameter of every unit,
 * through embedding, blocks (with activation checkpointing, as the gpu worker runs them), the tied
 * head with an ignored target, and back. Also runs the reference's own finite-difference self-check
 * and checks that it refuses a malformed input. The model, its composition and the file formats:
 * tests/refmodel.h. Skips (exit 77) without python3 and numpy. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/model/model.h"
#include "gpu_worker/backend.h"
#include "tests/refmodel.h"
#include "tests/testutil.h"

/* Tiny, but with every feature present: 2 layers, 2 heads, T < ctx (unused wpe rows), V not a
 * multiple of anything. */
static const struct fy_model_config CFG = {.n_layer = 2, .n_head = 2, .n_embd = 8, .vocab = 13,
                                         .ctx = 8};
enum { B = 2, T = 7 };
static const uint64_t SEED = 20240611;

/* Tolerances. The C backend computes in fp32, the reference in float64; the gradients pass through
 * a deep chain (head softmax, final LN, two blocks of LN / attention softmax / GELU each, forward
 * then backward), so each element carries the accumulated fp32 rounding of that chain, a few 1e-7
 * relative to the magnitudes involved, amplified by cancellations (LayerNorm backward subtracts
 * means; small gradient elements are differences of large terms). Hence an absolute floor scaled
 * to the unit (atol = 1e-3 * max |ref| of the unit) plus rtol = 1e-3 for each element, and, to catch
 * a small systematic error spread over many elements that those bounds would let through, the
 * relative Frobenius error of the unit must be below 1e-4. The loss is one well-conditioned sum:
 * 1e-5 relative. A wrong formula gives errors of order 1 in relative terms, far above all this. */
#define LOSS_RTOL 1e-5
#define ELEM_RTOL 1e-3
#define ELEM_ATOL_FRAC 1e-3
#define FROB_RTOL 1e-4

/* Time limit of each run of the reference (it takes a few seconds). */
#define SCRIPT_TIMEOUT_S 300

static char script[4096];

static const char *unit_name(unsigned u, char *buf, size_t len)
{
    switch (fy_model_unit_kind(&CFG, u)) {
    case FY_UNIT_EMBED: snprintf(buf, len, "embed"); break;
    case FY_UNIT_FINAL: snprintf(buf, len, "final"); break;
    default: snprintf(buf, len, "block%u", u - 1); break;
    }
    return buf;
}

struct cmp {
    double max_abs_err, max_ref, frob_rel;
    size_t worst, n_bad; /* element of the largest excess over its bound, elements out of bounds */
};

/* Compares one unit's fp32 gradient with the reference; the bounds are those explained above. */
static struct cmp compare_unit(const float *c, const double *ref, size_t n)
{
    struct cmp r = {0};
    for (size_t i = 0; i < n; i++)
        r.max_ref = fmax(r.max_ref, fabs(ref[i]));
    const double atol = ELEM_ATOL_FRAC * r.max_ref;
    double err2 = 0, ref2 = 0, worst_excess = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)c[i] - ref[i]);
        double excess = e - (atol + ELEM_RTOL * fabs(ref[i]));
        if (!(excess <= 0)) /* also counts NaN */
            r.n_bad++;
        if (!(excess <= worst_excess)) {
            worst_excess = excess;
            r.worst = i;
        }
        r.max_abs_err = fmax(r.max_abs_err, e);
        if (isnan(e))
            r.max_abs_err = NAN;
        err2 += e * e;
        ref2 += ref[i] * ref[i];
    }
    r.frob_rel = ref2 > 0 ? sqrt(err2 / ref2) : (err2 > 0 ? INFINITY : 0);
    return r;
}

static int cmp_ok(const struct cmp *r) { return r->n_bad == 0 && r->frob_rel < FROB_RTOL; }

/* fy_refmodel calls: a failure fails the test with the reason. */
static void check(int rc, const struct fy_refmodel *m)
{
    if (rc != 0)
        fail_msg("%s", m->err);
}

static void test_self_check(void **state)
{
    char *argv[] = {"python3", script, "--self-check", NULL};
    int rc = fy_refmodel_run(argv, SCRIPT_TIMEOUT_S);
    if (rc != 0)
        fail_msg("%s --self-check exited %d: its backward disagrees with finite differences", script,
                 rc);
}

static void test_malformed_input_refused(void **state)
{
    char *dir = fy_test_tmpdir("gptref");
    assert_non_null(dir);
    char in[4200], out[4200];
    snprintf(in, sizeof in, "%s/in.bin", dir);
    snprintf(out, sizeof out, "%s/out.bin", dir);
    struct fy_refmodel m;
    check(fy_refmodel_init(&m, &CFG, B, T, SEED), &m);
    check(fy_refmodel_write_input(&m, in), &m);
    /* one byte short */
    assert_int_equal(truncate(in, (off_t)(9 * 4 + 4) - 1), 0);
    print_message("a malformed input is expected to be refused (the next line is its message):\n");
    char *argv[] = {"python3", script, in, out, NULL};
    assert_int_equal(fy_refmodel_run(argv, SCRIPT_TIMEOUT_S), 2);
    assert_int_equal(access(out, F_OK), -1);
    fy_refmodel_free(&m);
    fy_test_rmdir(dir);
    free(dir);
}

static void test_model_vs_reference(void **state)
{
    struct fy_refmodel m;
    check(fy_refmodel_init(&m, &CFG, B, T, SEED), &m);
    struct fy_backend *cpu;
    assert_int_equal(fy_backend_open(&cpu, "cpu", 0), 0);
    check(fy_refmodel_forward_backward(&m, cpu), &m);
    fy_backend_close(&cpu);

    char *dir = fy_test_tmpdir("gptref");
    assert_non_null(dir);
    char in[4200], out[4200];
    snprintf(in, sizeof in, "%s/in.bin", dir);
    snprintf(out, sizeof out, "%s/out.bin", dir);
    check(fy_refmodel_write_input(&m, in), &m);
    char *argv[] = {"python3", script, in, out, NULL};
    int rc = fy_refmodel_run(argv, SCRIPT_TIMEOUT_S);
    if (rc != 0)
        fail_msg("%s %s %s exited %d", script, in, out, rc);
    struct fy_refmodel_output ref;
    check(fy_refmodel_read_output(&m, out, &ref), &m);

    double loss_rel = fabs(m.loss - ref.loss) / fabs(ref.loss);
    print_message("loss: C %.9f, reference %.9f, relative error %.2e (bound %.0e)\n", m.loss,
                  ref.loss, loss_rel, LOSS_RTOL);
    int ok = loss_rel <= LOSS_RTOL;
    for (unsigned u = 0; u < m.n_units; u++) {
        char name[32];
        struct cmp r = compare_unit(m.grads[u], ref.grads[u], m.sizes[u]);
        print_message("%-7s %5zu grads: max|ref| %.3e, max abs error %.3e (%.2e of max|ref|), "
                      "relative Frobenius error %.2e, %zu out of bounds%s\n",
                      unit_name(u, name, sizeof name), m.sizes[u], r.max_ref, r.max_abs_err,
                      r.max_abs_err / r.max_ref, r.frob_rel, r.n_bad, cmp_ok(&r) ? "" : "  FAILED");
        if (!cmp_ok(&r))
            print_message("        worst: element %zu, C %.9g, reference %.9g\n", r.worst,
                          (double)m.grads[u][r.worst], ref.grads[u][r.worst]);
        ok &= cmp_ok(&r);

        /* The comparison can fail: 1% off on the unit's largest gradient element is caught. */
        size_t big = 0;
        for (size_t i = 0; i < m.sizes[u]; i++)
            if (fabs(ref.grads[u][i]) > fabs(ref.grads[u][big]))
                big = i;
        float keep = m.grads[u][big];
        m.grads[u][big] = (float)(ref.grads[u][big] * 1.01);
        struct cmp bad = compare_unit(m.grads[u], ref.grads[u], m.sizes[u]);
        m.grads[u][big] = keep;
        assert_false(cmp_ok(&bad));
    }
    /* positions past T never appear: their wpe rows get exactly no gradient */
    const size_t C = CFG.n_embd, wpe = (size_t)CFG.vocab * C;
    for (size_t i = wpe + (size_t)T * C; i < m.sizes[0]; i++)
        assert_true(m.grads[0][i] == 0.0f);
    if (!ok)
        fail_msg("the CPU backend disagrees with the float64 reference (see the lines above); its "
                 "input is kept in %s",
                 in);

    fy_refmodel_output_free(&m, &ref);
    fy_refmodel_free(&m);
    fy_test_rmdir(dir);
    free(dir);
}

int main(void)
{
    if (!fy_refmodel_little_endian()) {
        printf("test_gpt_reference: skipped: the reference's file format is little-endian\n");
        return FY_TEST_SKIP;
    }
    if (!fy_refmodel_python_has("numpy")) {
        printf("test_gpt_reference: skipped: python3 with numpy is needed (pip install "
               "numpy==2.2.6)\n");
        return FY_TEST_SKIP;
    }
    if (fy_refmodel_script("gpt_ref.py", script, sizeof script) != 0) {
        printf("test_gpt_reference: cannot read %s (run from the repository root, or set "
               "FUYOU_SRC to it)\n",
               script);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_self_check),
        cmocka_unit_test(test_malformed_input_refused),
        cmocka_unit_test(test_model_vs_reference),
    };
    return cmocka_run_group_tests_name("gpt vs float64 reference", tests, NULL, NULL);
}
