/* The whole GPT-2 model on the CPU backend against an independent float64 reference in Python with
 * numpy (tests/reference/gpt_ref.py): the loss and the gradient of every parameter of every unit,
 * through embedding, blocks (with activation checkpointing, as the gpu worker runs them), the tied
 * head with an ignored target, and back. Also runs the reference's own finite-difference self-check
 * and checks that it refuses a malformed input. Skips (exit 77) without python3 and numpy. */
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
#include "gpu_worker/cpu/gpt_cpu.h"
#include "tests/testutil.h"

#define REF_MAGIC 0x52475946 /* "FYGR" as little-endian bytes */
#define REF_VERSION 1

/* Tiny, but with every feature present: 2 layers, 2 heads, T < ctx (unused wpe rows), V not a
 * multiple of anything. */
static const struct fy_gpt_config CFG = {.n_layer = 2, .n_head = 2, .n_embd = 8, .vocab = 13,
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

static char script[4096];

/* Runs argv (argv[0] looked up in PATH), stdout and stderr passed through; its exit status, or -1. */
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

static int python_has_numpy(void)
{
    return system("python3 -c 'import numpy' >/dev/null 2>&1") == 0;
}

static void find_script(void)
{
    const char *src = getenv("FUYOU_SRC");
    snprintf(script, sizeof script, "%s/tests/reference/gpt_ref.py", src ? src : ".");
}

struct model {
    unsigned n_units;
    size_t sizes[16];
    float *params[16]; /* per unit */
    float *grads[16];  /* per unit, the C backend's */
    double *ref[16];   /* per unit, the reference's */
    double loss_c, loss_ref;
    int32_t tokens[B * T], targets[B * T];
};

static float *falloc(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}

/* GPT-2 init, then noise on every bias and LayerNorm parameter (which GPT-2 sets to 0 or 1) so that
 * their gradients, and the paths through them, are not trivial. */
static void model_init(struct model *m)
{
    memset(m, 0, sizeof *m);
    m->n_units = fy_gpt_unit_count(&CFG);
    assert_true(m->n_units <= 16);
    uint64_t rng = SEED;
    const size_t C = CFG.n_embd;
    struct fy_gpt_block_layout l;
    fy_gpt_block_layout(&CFG, &l);
    for (unsigned u = 0; u < m->n_units; u++) {
        m->sizes[u] = fy_gpt_unit_params(&CFG, u);
        m->params[u] = falloc(m->sizes[u]);
        m->grads[u] = falloc(m->sizes[u]);
        m->ref[u] = calloc(m->sizes[u], sizeof(double));
        assert_non_null(m->ref[u]);
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
}

static void model_free(struct model *m)
{
    for (unsigned u = 0; u < m->n_units; u++) {
        free(m->params[u]);
        free(m->grads[u]);
        free(m->ref[u]);
    }
}

/* Forward and backward on the CPU backend, unit by unit as the gpu worker runs them: each block's
 * input kept as its checkpoint, blocks recomputed in their backward. */
static void cpu_forward_backward(struct model *m)
{
    const unsigned L = CFG.n_layer;
    const size_t act = (size_t)B * T * CFG.n_embd;
    float *xs = falloc(act * (L + 1)); /* xs[l]: input of block l; xs[L]: input of the head */
    float *dx = falloc(act), *dy = falloc(act);
    float *bscratch = falloc(fy_cpu_block_scratch(&CFG, B, T));
    float *hscratch = falloc(fy_cpu_head_scratch(&CFG, B, T));

    fy_cpu_embed_forward(&CFG, m->params[0], m->tokens, xs, B, T);
    for (unsigned l = 0; l < L; l++)
        fy_cpu_block_forward(&CFG, m->params[1 + l], xs + act * l, xs + act * (l + 1), bscratch, B,
                             T);
    float loss = fy_cpu_head_forward_backward(&CFG, m->params[L + 1], m->params[0], xs + act * L,
                                              m->targets, dy, m->grads[L + 1], m->grads[0],
                                              hscratch, B, T);
    m->loss_c = loss;
    for (unsigned l = L; l-- > 0;) {
        fy_cpu_block_backward(&CFG, m->params[1 + l], xs + act * l, dy, dx, m->grads[1 + l],
                              bscratch, B, T);
        float *t = dx;
        dx = dy;
        dy = t; /* dy now holds the gradient of this block's input */
    }
    fy_cpu_embed_backward(&CFG, m->tokens, dy, m->grads[0], B, T);
    free(xs);
    free(dx);
    free(dy);
    free(bscratch);
    free(hscratch);
}

static void write_all(FILE *f, const void *p, size_t size, size_t n)
{
    assert_int_equal(fwrite(p, size, n, f), n);
}

/* The input format of gpt_ref.py (see its top comment); this host is little-endian (checked in
 * main), as the format is. */
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

static void read_output(struct model *m, const char *path)
{
    size_t len = 0, n = 1;
    for (unsigned u = 0; u < m->n_units; u++)
        n += m->sizes[u];
    char *buf = fy_test_slurp(path, &len);
    assert_non_null(buf);
    if (len != n * sizeof(double))
        fail_msg("%s: %zu bytes, expected %zu (loss + %zu gradients as float64)", path, len,
                 n * sizeof(double), n - 1);
    const char *at = buf;
    memcpy(&m->loss_ref, at, sizeof(double));
    at += sizeof(double);
    for (unsigned u = 0; u < m->n_units; u++) {
        memcpy(m->ref[u], at, m->sizes[u] * sizeof(double));
        at += m->sizes[u] * sizeof(double);
    }
    free(buf);
}

static const char *unit_name(unsigned u, char *buf, size_t len)
{
    switch (fy_gpt_unit_kind(&CFG, u)) {
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

static void test_self_check(void **state)
{
    char *argv[] = {"python3", script, "--self-check", NULL};
    int rc = run(argv);
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
    struct model m;
    model_init(&m);
    write_input(&m, in);
    /* one byte short */
    assert_int_equal(truncate(in, (off_t)(9 * 4 + 4) - 1), 0);
    print_message("a malformed input is expected to be refused (the next line is its message):\n");
    char *argv[] = {"python3", script, in, out, NULL};
    assert_int_equal(run(argv), 2);
    assert_int_equal(access(out, F_OK), -1);
    model_free(&m);
    fy_test_rmdir(dir);
    free(dir);
}

static void test_model_vs_reference(void **state)
{
    struct model m;
    model_init(&m);
    cpu_forward_backward(&m);

    char *dir = fy_test_tmpdir("gptref");
    assert_non_null(dir);
    char in[4200], out[4200];
    snprintf(in, sizeof in, "%s/in.bin", dir);
    snprintf(out, sizeof out, "%s/out.bin", dir);
    write_input(&m, in);
    char *argv[] = {"python3", script, in, out, NULL};
    int rc = run(argv);
    if (rc != 0)
        fail_msg("%s %s %s exited %d", script, in, out, rc);
    read_output(&m, out);

    double loss_rel = fabs(m.loss_c - m.loss_ref) / fabs(m.loss_ref);
    print_message("loss: C %.9f, reference %.9f, relative error %.2e (bound %.0e)\n", m.loss_c,
                  m.loss_ref, loss_rel, LOSS_RTOL);
    int ok = loss_rel <= LOSS_RTOL;
    for (unsigned u = 0; u < m.n_units; u++) {
        char name[32];
        struct cmp r = compare_unit(m.grads[u], m.ref[u], m.sizes[u]);
        print_message("%-7s %5zu grads: max|ref| %.3e, max abs error %.3e (%.2e of max|ref|), "
                      "relative Frobenius error %.2e, %zu out of bounds%s\n",
                      unit_name(u, name, sizeof name), m.sizes[u], r.max_ref, r.max_abs_err,
                      r.max_abs_err / r.max_ref, r.frob_rel, r.n_bad, cmp_ok(&r) ? "" : "  FAILED");
        if (!cmp_ok(&r))
            print_message("        worst: element %zu, C %.9g, reference %.9g\n", r.worst,
                          (double)m.grads[u][r.worst], m.ref[u][r.worst]);
        ok &= cmp_ok(&r);

        /* The comparison can fail: 1% off on the unit's largest gradient element is caught. */
        size_t big = 0;
        for (size_t i = 0; i < m.sizes[u]; i++)
            if (fabs(m.ref[u][i]) > fabs(m.ref[u][big]))
                big = i;
        float keep = m.grads[u][big];
        m.grads[u][big] = (float)(m.ref[u][big] * 1.01);
        struct cmp bad = compare_unit(m.grads[u], m.ref[u], m.sizes[u]);
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
        printf("test_gpt_reference: skipped: the reference's file format is little-endian\n");
        return FY_TEST_SKIP;
    }
    if (!python_has_numpy()) {
        printf("test_gpt_reference: skipped: python3 with numpy is needed (pip install "
               "numpy==2.2.6)\n");
        return FY_TEST_SKIP;
    }
    find_script();
    if (access(script, R_OK) != 0) {
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
