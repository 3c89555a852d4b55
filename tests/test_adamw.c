/* Tests of the AdamW kernels: against a float64 reference of the same formula, every SIMD
 * implementation bit-identical to the scalar one (tails, misalignment and special values
 * included, with and without clipping's gradient scale), the scaled update equal to an unscaled
 * one on gradients multiplied first in float, the bf16 copy, thread-count independence, the
 * gradient sum of squares, bad input. */
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

#include "common/dtype.h"
#include "opt_worker/adamw.h"
#include "opt_worker/threads.h"
#include "tests/testutil.h"

static const size_t sizes[] = {1, 7, 15, 16, 17, 22, 63, 65, 1000, 1000003};
#define NSIZES (sizeof sizes / sizeof sizes[0])
static const uint64_t steps[] = {1, 2, 10, 1000};
#define NSTEPS (sizeof steps / sizeof steps[0])

static const struct fy_adamw_hparams HP = {
    .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f};

struct st {
    size_t n;
    int dtype;
    float *p, *m, *v;
    void *g;
    uint16_t *w;
    void *blocks[5];
};

/* off: elements by which the arrays start past a 64-byte boundary, to exercise peeling. */
static void st_alloc(struct st *s, size_t n, int dtype, size_t off)
{
    memset(s, 0, sizeof *s);
    s->n = n;
    s->dtype = dtype;
    size_t bytes = (n + off + 16) * 4;
    for (int i = 0; i < 5; i++) {
        assert_int_equal(posix_memalign(&s->blocks[i], 64, bytes), 0);
        memset(s->blocks[i], 0, bytes);
    }
    s->p = (float *)s->blocks[0] + off;
    s->m = (float *)s->blocks[1] + off;
    s->v = (float *)s->blocks[2] + off;
    s->g = dtype == FY_DTYPE_BF16 ? (void *)((uint16_t *)s->blocks[3] + off)
                                  : (void *)((float *)s->blocks[3] + off);
    s->w = (uint16_t *)s->blocks[4] + off;
}

static void st_free(struct st *s)
{
    for (int i = 0; i < 5; i++)
        free(s->blocks[i]);
}

static float st_grad(const struct st *s, size_t i)
{
    return s->dtype == FY_DTYPE_BF16 ? fy_bf16_to_f32(((const uint16_t *)s->g)[i])
                                     : ((const float *)s->g)[i];
}

static void st_set_grad(struct st *s, size_t i, float g)
{
    if (s->dtype == FY_DTYPE_BF16)
        ((uint16_t *)s->g)[i] = fy_f32_to_bf16(g);
    else
        ((float *)s->g)[i] = g;
}

/* Realistic values: weights O(1), gradients O(0.1), moments as a few steps would leave them
 * (zero when fresh, i.e. before step 1). */
static void st_fill(struct st *s, uint64_t seed, int fresh)
{
    for (size_t i = 0; i < s->n; i++) {
        s->p[i] = fy_test_uniform(&seed, -1.0f, 1.0f);
        float g = fy_test_uniform(&seed, -0.1f, 0.1f);
        if (i % 97 == 5)
            g = 0.0f;
        st_set_grad(s, i, g);
        s->m[i] = fresh ? 0.0f : fy_test_uniform(&seed, -0.01f, 0.01f);
        s->v[i] = fresh ? 0.0f : fy_test_uniform(&seed, 0.0f, 1e-4f);
    }
}

/* Adds special values: NaN/Inf/zero/denormal gradients and masters, masters at bf16 rounding
 * ties, huge values that round to bf16 infinity. Only for identity tests. */
static void st_specials(struct st *s, uint64_t seed)
{
    static const uint32_t pbits[] = {0x7fc00000u, 0xff800000u, 0x7f800000u, 0x80000000u,
                                     0x00000001u, 0x3f808000u, 0x3f818000u, 0x7f7fffffu,
                                     0xff7fffffu, 0x7f800001u, 0x3f80ffffu, 0x00800000u};
    for (size_t i = 0; i < s->n; i++) {
        uint64_t r = fy_test_rand(&seed);
        if (r % 5 == 0) {
            uint32_t b = pbits[(r >> 8) % (sizeof pbits / sizeof pbits[0])];
            memcpy(&s->p[i], &b, 4);
        }
        if (r % 7 == 0) {
            uint32_t b = pbits[(r >> 16) % (sizeof pbits / sizeof pbits[0])];
            float g;
            memcpy(&g, &b, 4);
            st_set_grad(s, i, g);
        }
        if (r % 11 == 0) /* random bit patterns for the bf16 gradients */
            if (s->dtype == FY_DTYPE_BF16)
                ((uint16_t *)s->g)[i] = (uint16_t)(r >> 32);
    }
}

/* Master, moments and an empty bf16 copy from src (the gradient is left alone: its dtype may
 * differ). */
static void st_copy_state(struct st *dst, const struct st *src)
{
    memcpy(dst->p, src->p, src->n * 4);
    memcpy(dst->m, src->m, src->n * 4);
    memcpy(dst->v, src->v, src->n * 4);
    memset(dst->w, 0, src->n * 2);
}

static void st_copy(struct st *dst, const struct st *src)
{
    memcpy(dst->p, src->p, src->n * 4);
    memcpy(dst->m, src->m, src->n * 4);
    memcpy(dst->v, src->v, src->n * 4);
    memcpy(dst->g, src->g, src->n * fy_dtype_size(src->dtype));
    memset(dst->w, 0, src->n * 2);
}

static struct fy_adamw_tensor st_tensor(struct st *s, int with_bf16)
{
    struct fy_adamw_tensor x = {.master = s->p, .m = s->m, .v = s->v, .grad = s->g,
                                .grad_dtype = s->dtype, .weight_bf16 = with_bf16 ? s->w : NULL,
                                .n = s->n};
    return x;
}

static int st_same(const struct st *a, const struct st *b, int with_bf16)
{
    return memcmp(a->p, b->p, a->n * 4) == 0 && memcmp(a->m, b->m, a->n * 4) == 0 &&
           memcmp(a->v, b->v, a->n * 4) == 0 && (!with_bf16 || memcmp(a->w, b->w, a->n * 2) == 0);
}

static size_t st_first_diff(const struct st *a, const struct st *b)
{
    for (size_t i = 0; i < a->n; i++)
        if (memcmp(&a->p[i], &b->p[i], 4) || memcmp(&a->m[i], &b->m[i], 4) ||
            memcmp(&a->v[i], &b->v[i], 4) || a->w[i] != b->w[i])
            return i;
    return a->n;
}

/* One step of the formula in double, from the float state and float hyperparameters. */
static void ref_step(const struct fy_adamw_hparams *hp, uint64_t t, double *p, double *m,
                     double *v, double g, double *upd)
{
    double lr = hp->lr, b1 = hp->beta1, b2 = hp->beta2, eps = hp->eps, wd = hp->weight_decay;
    double bc1 = 1.0 - pow(b1, (double)t), bc2 = 1.0 - pow(b2, (double)t);
    *p -= lr * wd * *p;
    *m = b1 * *m + (1.0 - b1) * g;
    *v = b2 * *v + (1.0 - b2) * g * g;
    *upd = (lr / bc1) * *m / (sqrt(*v) / sqrt(bc2) + eps);
    *p -= *upd;
}

/* Tolerances for one float step against the double reference. Each float operation rounds by at
 * most 2^-24 relative, and the float constants (1-lr*wd, 1-b1, lr/bc1, sqrt(bc2)) each carry one
 * such rounding, so a correct kernel is within ~10 roundings (~6e-7) of the reference relative to
 * the magnitudes of the terms it adds. We allow:
 *   m: 1e-6 * (|b1*m0| + |(1-b1)*g|)     (terms can cancel, so relative to the terms, not m)
 *   v: 1e-6 * |v|                           (all terms >= 0)
 *   p: 1e-5 * |p| + 1e-6 * (|p0| + |upd|)   (relative 1e-5 as asked; the floor covers weights
 *      near zero where p0*(1-lr*wd) and the update cancel, and is still ~10x the rounding).
 * A wrong formula (missing bias correction, decay applied to the update, wrong eps placement,
 * bf16 conversion error) misses these by orders of magnitude. */
static void check_vs_ref(size_t n, int dtype, uint64_t t, enum fy_adamw_impl impl, int threads)
{
    struct st s;
    st_alloc(&s, n, dtype, 0);
    st_fill(&s, 1000 + n * 7 + t, t == 1);
    double *p0 = malloc(n * sizeof *p0), *m0 = malloc(n * sizeof *m0), *v0 = malloc(n * sizeof *v0);
    assert_non_null(p0);
    assert_non_null(m0);
    assert_non_null(v0);
    for (size_t i = 0; i < n; i++) {
        p0[i] = s.p[i];
        m0[i] = s.m[i];
        v0[i] = s.v[i];
    }
    struct fy_threads *pool = NULL;
    if (threads > 1)
        assert_int_equal(fy_threads_new(&pool, NULL, (unsigned)threads), 0);
    struct fy_adamw_tensor x = st_tensor(&s, 1);
    assert_int_equal(fy_adamw_update(pool, &HP, t, &x, impl), 0);
    fy_threads_destroy(&pool);
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double g = st_grad(&s, i);
        double p = p0[i], m = m0[i], v = v0[i], upd;
        ref_step(&HP, t, &p, &m, &v, g, &upd);
        double tm = 1e-6 * (fabs(HP.beta1 * m0[i]) + fabs((1.0 - HP.beta1) * g));
        double tv = 1e-6 * fabs(v);
        double tp = 1e-5 * fabs(p) + 1e-6 * (fabs(p0[i]) + fabs(upd));
        if (!(fabs(s.m[i] - m) <= tm && fabs(s.v[i] - v) <= tv && fabs(s.p[i] - p) <= tp)) {
            print_error("n=%zu %s t=%llu i=%zu: p %.9g vs %.9g (tol %.3g), m %.9g vs %.9g (tol "
                        "%.3g), v %.9g vs %.9g (tol %.3g)\n",
                        n, fy_dtype_name(dtype), (unsigned long long)t, i, (double)s.p[i], p, tp,
                        (double)s.m[i], m, tm, (double)s.v[i], v, tv);
            fail();
        }
        if (s.w[i] != fy_f32_to_bf16(s.p[i])) {
            print_error("bf16 copy differs at %zu\n", i);
            fail();
        }
        double e = fabs(s.p[i] - p) / (fabs(p) + 1e-30);
        if (fabs(p) > 1e-3 && e > worst)
            worst = e;
    }
    if (n == 1000003)
        printf("  n=%zu %s t=%llu: worst relative error of weights (|p|>1e-3) %.2e\n", n,
               fy_dtype_name(dtype), (unsigned long long)t, worst);
    free(p0);
    free(m0);
    free(v0);
    st_free(&s);
}

static void test_vs_double_reference(void **state)
{
    for (size_t k = 0; k < NSIZES; k++)
        for (uint64_t j = 0; j < NSTEPS; j++) {
            check_vs_ref(sizes[k], FY_DTYPE_BF16, steps[j], FY_ADAMW_AUTO, 1);
            check_vs_ref(sizes[k], FY_DTYPE_F32, steps[j], FY_ADAMW_AUTO, 1);
        }
    /* the scalar path too (AUTO above is the best SIMD path here) */
    check_vs_ref(1000003, FY_DTYPE_BF16, 10, FY_ADAMW_SCALAR, 1);
}

/* Ten steps from a fresh state against ten double steps: rounding compounds a little. */
static void test_multistep_vs_reference(void **state)
{
    const size_t n = 4099;
    struct st s;
    st_alloc(&s, n, FY_DTYPE_BF16, 0);
    st_fill(&s, 77, 1);
    double *p = malloc(n * 8), *m = calloc(n, 8), *v = calloc(n, 8);
    assert_non_null(p);
    assert_non_null(m);
    assert_non_null(v);
    for (size_t i = 0; i < n; i++)
        p[i] = s.p[i];
    uint64_t seed = 5;
    for (uint64_t t = 1; t <= 10; t++) {
        for (size_t i = 0; i < n; i++)
            st_set_grad(&s, i, fy_test_uniform(&seed, -0.1f, 0.1f));
        struct fy_adamw_tensor x = st_tensor(&s, 1);
        assert_int_equal(fy_adamw_update(NULL, &HP, t, &x, FY_ADAMW_AUTO), 0);
        for (size_t i = 0; i < n; i++) {
            double upd;
            ref_step(&HP, t, &p[i], &m[i], &v[i], st_grad(&s, i), &upd);
        }
    }
    /* 10 steps: ten times the one-step allowance, relative to the weight scale (O(1)) */
    for (size_t i = 0; i < n; i++)
        assert_true(fabs(s.p[i] - p[i]) <= 1e-5 * fabs(p[i]) + 1e-6);
    free(p);
    free(m);
    free(v);
    st_free(&s);
}

/* impl against scalar: bit-identical p, m, v and bf16 copy over three steps, for every size, both
 * dtypes, misaligned starts, partial ranges, and special values; with a gradient scale (clipping)
 * when scale is not 0. */
static void check_identical_scaled(enum fy_adamw_impl impl, float scale)
{
    for (size_t k = 0; k < NSIZES; k++)
        for (int d = 0; d < 2; d++)
            for (size_t off = 0; off < 3; off += 2) {
                size_t n = sizes[k];
                int dtype = d ? FY_DTYPE_BF16 : FY_DTYPE_F32;
                struct st a, b;
                st_alloc(&a, n, dtype, off);
                st_alloc(&b, n, dtype, 0);
                st_fill(&a, 31 * n + (uint64_t)d, 0);
                if (off)
                    st_specials(&a, 99 + n);
                st_copy(&b, &a);
                struct fy_adamw_tensor xa = st_tensor(&a, 1), xb = st_tensor(&b, 1);
                xa.grad_scale = xb.grad_scale = scale;
                for (uint64_t t = 1; t <= 3; t++) {
                    uint64_t tt = t == 3 ? 1000 : t;
                    assert_int_equal(fy_adamw_update_range(&HP, tt, &xa, 0, n, FY_ADAMW_SCALAR),
                                     0);
                    assert_int_equal(fy_adamw_update_range(&HP, tt, &xb, 0, n, impl), 0);
                }
                /* a range that starts and ends off the vector grid */
                if (n > 10) {
                    assert_int_equal(fy_adamw_update_range(&HP, 4, &xa, 3, n - 2, FY_ADAMW_SCALAR),
                                     0);
                    assert_int_equal(fy_adamw_update_range(&HP, 4, &xb, 3, n - 2, impl), 0);
                }
                if (!st_same(&a, &b, 1)) {
                    size_t i = st_first_diff(&a, &b);
                    print_error("%s differs from scalar: n=%zu %s off=%zu scale %g first at %zu: p "
                                "%a vs %a m %a vs %a v %a vs %a w %04x vs %04x\n",
                                fy_adamw_impl_name(impl), n, fy_dtype_name(dtype), off,
                                (double)scale, i,
                                (double)a.p[i], (double)b.p[i], (double)a.m[i], (double)b.m[i],
                                (double)a.v[i], (double)b.v[i], a.w[i], b.w[i]);
                    fail();
                }
                /* and without the bf16 copy */
                st_copy(&b, &a);
                xb.weight_bf16 = NULL;
                xa.weight_bf16 = NULL;
                assert_int_equal(fy_adamw_update_range(&HP, 7, &xa, 0, n, FY_ADAMW_SCALAR), 0);
                assert_int_equal(fy_adamw_update_range(&HP, 7, &xb, 0, n, impl), 0);
                assert_true(st_same(&a, &b, 0));
                st_free(&a);
                st_free(&b);
            }
}

/* Clipping's scales: none, a typical one, one that makes gradients subnormal or overflow them
 * (the specials include the largest floats). */
static const float scales[] = {0.0f, 0.37f, 1e-30f, 3.0f};
#define NSCALES (sizeof scales / sizeof scales[0])

static void check_identical(enum fy_adamw_impl impl)
{
    for (size_t k = 0; k < NSCALES; k++)
        check_identical_scaled(impl, scales[k]);
}

static void test_avx2_identical(void **state)
{
    if (!fy_adamw_impl_supported(FY_ADAMW_AVX2)) {
        printf("skipping: this CPU has no AVX2\n");
        skip();
    }
    check_identical(FY_ADAMW_AVX2);
}

static void test_avx512_identical(void **state)
{
    if (!fy_adamw_impl_supported(FY_ADAMW_AVX512)) {
        printf("skipping: this CPU has no AVX-512F/BW, so the AVX-512 kernel is not checked here "
               "(run this test on an AVX-512 machine)\n");
        skip();
    }
    check_identical(FY_ADAMW_AVX512);
}

/* The scaled update (grad_scale s) equals the scalar kernel's unscaled update of f32 gradients that
 * were multiplied by s first, in float: bit for bit, for every implementation, both gradient
 * dtypes, special values included. And a scale of exactly 1 is no scaling at all (0 too). */
static void test_scaled_equals_prescaled(void **state)
{
    static const enum fy_adamw_impl impls[] = {FY_ADAMW_SCALAR, FY_ADAMW_AVX2, FY_ADAMW_AVX512};
    static const size_t ns[] = {1, 17, 1000, 65536 + 33};
    for (size_t m = 0; m < 3; m++) {
        if (!fy_adamw_impl_supported(impls[m]))
            continue;
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
            for (int d = 0; d < 2; d++)
                for (size_t j = 0; j < NSCALES + 1; j++) {
                    float scale = j < NSCALES ? scales[j] : 1.0f;
                    size_t n = ns[k];
                    int dtype = d ? FY_DTYPE_BF16 : FY_DTYPE_F32;
                    struct st a, b;
                    st_alloc(&a, n, dtype, 1);
                    st_alloc(&b, n, FY_DTYPE_F32, 0);
                    st_fill(&a, 5 * n + (uint64_t)d, 0);
                    st_specials(&a, 7 + n);
                    st_copy_state(&b, &a);
                    /* the reference: multiply first (in float), then the unscaled scalar update */
                    for (size_t i = 0; i < n; i++) {
                        float g = st_grad(&a, i);
                        ((float *)b.g)[i] = scale != 0.0f && scale != 1.0f ? g * scale : g;
                    }
                    struct fy_adamw_tensor xa = st_tensor(&a, 1), xb = st_tensor(&b, 1);
                    xa.grad_scale = scale;
                    assert_int_equal(fy_adamw_update_range(&HP, 3, &xa, 0, n, impls[m]), 0);
                    assert_int_equal(fy_adamw_update_range(&HP, 3, &xb, 0, n, FY_ADAMW_SCALAR), 0);
                    if (!st_same(&a, &b, 1)) {
                        size_t i = st_first_diff(&a, &b);
                        print_error("%s, scale %g, n=%zu %s: differs from multiplying first at "
                                    "%zu: p %a vs %a\n",
                                    fy_adamw_impl_name(impls[m]), (double)scale, n,
                                    fy_dtype_name(dtype), i, (double)a.p[i], (double)b.p[i]);
                        fail();
                    }
                    st_free(&a);
                    st_free(&b);
                }
    }
    /* and a scaled update does differ from the unscaled one */
    struct st a, b;
    st_alloc(&a, 1000, FY_DTYPE_F32, 0);
    st_alloc(&b, 1000, FY_DTYPE_F32, 0);
    st_fill(&a, 3, 0);
    st_copy(&b, &a);
    struct fy_adamw_tensor xa = st_tensor(&a, 1), xb = st_tensor(&b, 1);
    xa.grad_scale = 0.5f;
    assert_int_equal(fy_adamw_update(NULL, &HP, 2, &xa, FY_ADAMW_AUTO), 0);
    assert_int_equal(fy_adamw_update(NULL, &HP, 2, &xb, FY_ADAMW_AUTO), 0);
    assert_false(st_same(&a, &b, 1));
    st_free(&a);
    st_free(&b);
}

/* The bf16 copy equals fy_f32_to_bf16 of the new master, including NaN, Inf and rounding ties. */
static void test_bf16_output(void **state)
{
    static const enum fy_adamw_impl impls[] = {FY_ADAMW_SCALAR, FY_ADAMW_AVX2, FY_ADAMW_AVX512};
    for (size_t k = 0; k < 3; k++) {
        if (!fy_adamw_impl_supported(impls[k]))
            continue;
        struct st s;
        st_alloc(&s, 1000, FY_DTYPE_BF16, 1);
        st_fill(&s, 3, 0);
        st_specials(&s, 4);
        struct fy_adamw_tensor x = st_tensor(&s, 1);
        assert_int_equal(fy_adamw_update_range(&HP, 5, &x, 0, s.n, impls[k]), 0);
        int nans = 0;
        for (size_t i = 0; i < s.n; i++) {
            assert_int_equal(s.w[i], fy_f32_to_bf16(s.p[i]));
            nans += isnan(s.p[i]) ? 1 : 0;
        }
        assert_true(nans > 0); /* the specials did reach the output */
        st_free(&s);
    }
}

static void test_threads_identical(void **state)
{
    static const size_t ns[] = {65 * 64 + 3, 1000003};
    for (size_t k = 0; k < 2; k++) {
        struct st a, b;
        st_alloc(&a, ns[k], FY_DTYPE_BF16, 0);
        st_alloc(&b, ns[k], FY_DTYPE_BF16, 0);
        st_fill(&a, 11, 0);
        struct st orig;
        st_alloc(&orig, ns[k], FY_DTYPE_BF16, 0);
        st_copy(&orig, &a);
        struct fy_adamw_tensor xa = st_tensor(&a, 1);
        assert_int_equal(fy_adamw_update(NULL, &HP, 3, &xa, FY_ADAMW_AUTO), 0);
        for (unsigned nt = 1; nt <= 4; nt++) {
            struct fy_threads *pool = NULL;
            assert_int_equal(fy_threads_new(&pool, NULL, nt), 0);
            st_copy(&b, &orig);
            struct fy_adamw_tensor xb = st_tensor(&b, 1);
            assert_int_equal(fy_adamw_update(pool, &HP, 3, &xb, FY_ADAMW_AUTO), 0);
            assert_true(st_same(&a, &b, 1));
            fy_threads_destroy(&pool);
        }
        st_free(&a);
        st_free(&b);
        st_free(&orig);
    }
}

/* An update by rows: the listed rows get exactly fy_adamw_update's bits (whatever the thread
 * count), every other element keeps its value, and a row outside the tensor is refused. */
static void test_rows_update(void **state)
{
    const size_t row = 96, rows = 1000, n = row * rows;
    struct st whole, orig, part;
    st_alloc(&whole, n, FY_DTYPE_F32, 0);
    st_alloc(&orig, n, FY_DTYPE_F32, 0);
    st_alloc(&part, n, FY_DTYPE_F32, 0);
    st_fill(&whole, 21, 0);
    st_copy(&orig, &whole);
    struct fy_adamw_tensor xw = st_tensor(&whole, 1);
    assert_int_equal(fy_adamw_update(NULL, &HP, 5, &xw, FY_ADAMW_AUTO), 0);
    int32_t *list = malloc(rows * sizeof *list);
    assert_non_null(list);
    size_t count = 0;
    for (size_t r = 0; r < rows; r++)
        if (r % 3 == 0 || r % 7 == 2)
            list[count++] = (int32_t)r;
    for (unsigned nt = 1; nt <= 4; nt += 3) {
        struct fy_threads *pool = NULL;
        if (nt > 1)
            assert_int_equal(fy_threads_new(&pool, NULL, nt), 0);
        st_copy(&part, &orig);
        struct fy_adamw_tensor xp = st_tensor(&part, 1);
        assert_int_equal(fy_adamw_update_rows(pool, &HP, 5, &xp, list, count, row, FY_ADAMW_AUTO),
                         0);
        for (size_t r = 0, k = 0; r < rows; r++) {
            int listed = k < count && list[k] == (int32_t)r;
            k += listed;
            const struct st *want = listed ? &whole : &orig;
            size_t at = r * row;
            assert_memory_equal(part.p + at, want->p + at, row * 4);
            assert_memory_equal(part.m + at, want->m + at, row * 4);
            assert_memory_equal(part.v + at, want->v + at, row * 4);
        }
        fy_threads_destroy(&pool);
    }
    int32_t outside = (int32_t)rows;
    struct fy_adamw_tensor xp = st_tensor(&part, 1);
    assert_int_equal(fy_adamw_update_rows(NULL, &HP, 5, &xp, &outside, 1, row, FY_ADAMW_AUTO),
                     -EINVAL);
    free(list);
    st_free(&whole);
    st_free(&orig);
    st_free(&part);
}

static void test_sumsq(void **state)
{
    static const size_t ns[] = {0, 1, 15, 17, 1000, 65536, 65536 + 17, 1000003};
    static const enum fy_adamw_impl impls[] = {FY_ADAMW_SCALAR, FY_ADAMW_AVX2, FY_ADAMW_AVX512};
    struct fy_threads *pools[4] = {NULL};
    for (unsigned t = 1; t < 4; t++)
        assert_int_equal(fy_threads_new(&pools[t], NULL, t + 1), 0);
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
        for (int d = 0; d < 2; d++) {
            struct st s;
            st_alloc(&s, ns[k], d ? FY_DTYPE_BF16 : FY_DTYPE_F32, 0);
            st_fill(&s, 17 + k, 1);
            /* reference: long double, sequential; each square is exact in double */
            long double ref = 0;
            for (size_t i = 0; i < s.n; i++)
                ref += (long double)st_grad(&s, i) * st_grad(&s, i);
            double first;
            assert_int_equal(fy_adamw_sumsq(NULL, s.g, s.dtype, s.n, &first), 0);
            /* double accumulation of up to 1e6 positive terms: error <= n * 2^-53 relative in the
             * worst case, ~1e-10; the chunked, laned order is far better than that bound */
            assert_true(fabsl(first - ref) <= 1e-10L * ref);
            for (size_t m = 0; m < 3; m++) {
                if (!fy_adamw_impl_supported(impls[m]))
                    continue;
                for (unsigned t = 0; t < 4; t++) {
                    double again = -1;
                    assert_int_equal(
                        fy_adamw_sumsq_impl(pools[t], s.g, s.dtype, s.n, impls[m], &again), 0);
                    assert_memory_equal(&again, &first, sizeof first);
                }
            }
            st_free(&s);
        }
    for (unsigned t = 1; t < 4; t++)
        fy_threads_destroy(&pools[t]);
}

static void test_invalid(void **state)
{
    struct st s;
    st_alloc(&s, 100, FY_DTYPE_BF16, 0);
    st_fill(&s, 1, 0);
    struct st keep;
    st_alloc(&keep, 100, FY_DTYPE_BF16, 0);
    st_copy(&keep, &s);
    struct fy_adamw_tensor x = st_tensor(&s, 1);
    struct fy_adamw_hparams hp = HP;

    x.grad_dtype = FY_DTYPE_I32;
    assert_int_equal(fy_adamw_update_range(&hp, 1, &x, 0, 100, FY_ADAMW_AUTO), -EINVAL);
    assert_int_equal(fy_adamw_update(NULL, &hp, 1, &x, FY_ADAMW_AUTO), -EINVAL);
    x.grad_dtype = FY_DTYPE_BF16;
    assert_int_equal(fy_adamw_update_range(&hp, 1, &x, 50, 40, FY_ADAMW_AUTO), -EINVAL);
    assert_int_equal(fy_adamw_update_range(&hp, 1, &x, 0, 101, FY_ADAMW_AUTO), -EINVAL);
    assert_int_equal(fy_adamw_update_range(&hp, 0, &x, 0, 100, FY_ADAMW_AUTO), -EINVAL);
    assert_int_equal(fy_adamw_update_range(&hp, 1, &x, 0, 100, (enum fy_adamw_impl)99), -EINVAL);
    assert_int_equal(fy_adamw_update_range(&hp, 1, NULL, 0, 0, FY_ADAMW_AUTO), -EINVAL);
    assert_int_equal(fy_adamw_update_range(NULL, 1, &x, 0, 100, FY_ADAMW_AUTO), -EINVAL);
    if (!fy_adamw_impl_supported(FY_ADAMW_AVX512))
        assert_int_equal(fy_adamw_update_range(&hp, 1, &x, 0, 100, FY_ADAMW_AVX512), -EINVAL);
    hp.lr = NAN;
    assert_int_equal(fy_adamw_update_range(&hp, 1, &x, 0, 100, FY_ADAMW_AUTO), -EINVAL);
    hp = HP;
    hp.eps = INFINITY;
    assert_int_equal(fy_adamw_update_range(&hp, 1, &x, 0, 100, FY_ADAMW_AUTO), -EINVAL);
    hp = HP;
    hp.beta1 = 1.0f;
    assert_int_equal(fy_adamw_update(NULL, &hp, 1, &x, FY_ADAMW_AUTO), -EINVAL);
    hp = HP;
    hp.beta2 = -0.5f;
    assert_int_equal(fy_adamw_update(NULL, &hp, 1, &x, FY_ADAMW_AUTO), -EINVAL);
    hp = HP;
    hp.weight_decay = NAN;
    assert_int_equal(fy_adamw_update(NULL, &hp, 1, &x, FY_ADAMW_AUTO), -EINVAL);
    static const float bad_scales[] = {-0.5f, NAN, INFINITY, -INFINITY};
    for (size_t k = 0; k < sizeof bad_scales / sizeof bad_scales[0]; k++) {
        x.grad_scale = bad_scales[k];
        assert_int_equal(fy_adamw_update(NULL, &HP, 1, &x, FY_ADAMW_AUTO), -EINVAL);
        assert_int_equal(fy_adamw_update_range(&HP, 1, &x, 0, 100, FY_ADAMW_SCALAR), -EINVAL);
    }
    x.grad_scale = 0.0f;
    x.grad = NULL;
    assert_int_equal(fy_adamw_update(NULL, &HP, 1, &x, FY_ADAMW_AUTO), -EINVAL);
    /* nothing was written by any rejected call */
    assert_true(st_same(&s, &keep, 0));

    double out;
    assert_int_equal(fy_adamw_sumsq(NULL, s.g, FY_DTYPE_U8, 100, &out), -EINVAL);
    assert_int_equal(fy_adamw_sumsq(NULL, NULL, FY_DTYPE_BF16, 100, &out), -EINVAL);
    assert_int_equal(fy_adamw_sumsq(NULL, s.g, FY_DTYPE_BF16, 100, NULL), -EINVAL);

    enum fy_adamw_impl impl;
    assert_int_equal(fy_adamw_impl_parse("avx2", &impl), 0);
    assert_int_equal(impl, FY_ADAMW_AVX2);
    assert_int_equal(fy_adamw_impl_parse("sse9", &impl), -EINVAL);
    assert_string_equal(fy_adamw_impl_name(FY_ADAMW_AVX512), "avx512");
    assert_true(fy_adamw_best_impl() != FY_ADAMW_AUTO);
    st_free(&s);
    st_free(&keep);
}

int main(void)
{
    printf("best AdamW implementation on this CPU: %s\n", fy_adamw_impl_name(fy_adamw_best_impl()));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vs_double_reference), cmocka_unit_test(test_multistep_vs_reference),
        cmocka_unit_test(test_avx2_identical),      cmocka_unit_test(test_avx512_identical),
        cmocka_unit_test(test_bf16_output),         cmocka_unit_test(test_threads_identical),
        cmocka_unit_test(test_scaled_equals_prescaled), cmocka_unit_test(test_rows_update),
        cmocka_unit_test(test_sumsq),               cmocka_unit_test(test_invalid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
