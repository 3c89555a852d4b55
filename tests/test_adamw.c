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

#include "common/base/dtype.h"
#include "opt_worker/adamw.h"
#include "opt_worker/quant8.h"
#include "opt_worker/threads.h"
#include "tests/refmodel.h"
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

/* ---- compact moments (bf16, 8-bit) ---- */

static size_t moment_size(int mode)
{
    return mode == FY_ADAMW_MOMENTS_Q8 ? 1 : mode == FY_ADAMW_MOMENTS_BF16 ? 2 : 4;
}

static const char *moment_name(int mode)
{
    return mode == FY_ADAMW_MOMENTS_Q8 ? "q8" : mode == FY_ADAMW_MOMENTS_BF16 ? "bf16" : "f32";
}

/* A run of several steps from one initial state: the input of the kernels and of adamw_ref.py. */
struct mcase {
    int mode, gdt; /* moments mode, gradient dtype */
    size_t n, nb, steps;
    uint64_t t0;
    struct fy_adamw_hparams hp;
    float gscale;
    float *p0, *ma0, *va0; /* master, and the 8-bit absmax */
    void *m0, *v0;         /* stored moments */
    void *grads;           /* steps gradients of n elements, one after another */
};

/* A tensor's state; its serialisation is adamw_ref.py's OUT format. */
struct mstate {
    float *p, *ma, *va;
    uint16_t *w;
    void *m, *v;
};

static void *xalloc(size_t bytes)
{
    void *p = NULL;
    assert_int_equal(posix_memalign(&p, 64, bytes + 64), 0);
    memset(p, 0, bytes + 64);
    return p;
}

enum { INIT_ZERO, INIT_RANDOM };

/* Stores fp32 moments m, v (n) in the case's mode. */
static void mcase_store(struct mcase *c, const float *m, const float *v)
{
    for (size_t i = 0; i < c->n; i++) {
        if (c->mode == FY_ADAMW_MOMENTS_F32) {
            ((float *)c->m0)[i] = m[i];
            ((float *)c->v0)[i] = v[i];
        } else if (c->mode == FY_ADAMW_MOMENTS_BF16) {
            ((uint16_t *)c->m0)[i] = fy_f32_to_bf16(m[i]);
            ((uint16_t *)c->v0)[i] = fy_f32_to_bf16(v[i]);
        }
    }
    if (c->mode == FY_ADAMW_MOMENTS_Q8) {
        assert_int_equal(fy_quant8_quantize(m, c->n, 1, c->m0, c->ma0), 0);
        assert_int_equal(fy_quant8_quantize(v, c->n, 0, c->v0, c->va0), 0);
    }
}

static void mcase_make(struct mcase *c, int mode, size_t n, int gdt, int init, uint64_t seed,
                       float gscale)
{
    memset(c, 0, sizeof *c);
    c->mode = mode;
    c->gdt = gdt;
    c->n = n;
    c->nb = fy_quant8_blocks(n);
    c->steps = 4;
    c->t0 = init == INIT_ZERO ? 1 : 10;
    c->hp = HP;
    c->gscale = gscale;
    c->p0 = xalloc(n * 4);
    c->m0 = xalloc(n * moment_size(mode));
    c->v0 = xalloc(n * moment_size(mode));
    c->ma0 = xalloc(c->nb * 4);
    c->va0 = xalloc(c->nb * 4);
    c->grads = xalloc(c->steps * n * fy_dtype_size(gdt));
    float *m = xalloc(n * 4), *v = xalloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        c->p0[i] = fy_test_uniform(&seed, -1.0f, 1.0f);
        m[i] = init == INIT_ZERO ? 0.0f : fy_test_uniform(&seed, -0.01f, 0.01f);
        v[i] = init == INIT_ZERO ? 0.0f : fy_test_uniform(&seed, 0.0f, 1e-4f);
        /* some blocks of small moments beside large ones: 8-bit blocks of varied scale */
        if (init != INIT_ZERO && (i / 256) % 3 == 1) {
            m[i] *= 1e-3f;
            v[i] *= 1e-4f;
        }
    }
    mcase_store(c, m, v);
    if (mode == FY_ADAMW_MOMENTS_Q8 && init == INIT_ZERO)
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(((uint8_t *)c->m0)[i], fy_quant8_zero_code(1));
            assert_int_equal(((uint8_t *)c->v0)[i], fy_quant8_zero_code(0));
        }
    for (size_t s = 0; s < c->steps; s++)
        for (size_t i = 0; i < n; i++) {
            float g = fy_test_uniform(&seed, -0.1f, 0.1f);
            if (i % 97 == 5)
                g = 0.0f;
            if ((i / 256) % 5 == 2)
                g *= 1e-3f;
            size_t at = s * n + i;
            if (gdt == FY_DTYPE_BF16)
                ((uint16_t *)c->grads)[at] = fy_f32_to_bf16(g);
            else
                ((float *)c->grads)[at] = g;
        }
    free(m);
    free(v);
}

static void mcase_set_grad(struct mcase *c, size_t step, size_t i, float g)
{
    if (c->gdt == FY_DTYPE_BF16)
        ((uint16_t *)c->grads)[step * c->n + i] = fy_f32_to_bf16(g);
    else
        ((float *)c->grads)[step * c->n + i] = g;
}

static void mcase_free(struct mcase *c)
{
    free(c->p0), free(c->m0), free(c->v0), free(c->ma0), free(c->va0), free(c->grads);
}

static size_t mstate_bytes(const struct mcase *c)
{
    size_t q8 = c->mode == FY_ADAMW_MOMENTS_Q8;
    return c->n * 6 + 2 * (c->n * moment_size(c->mode) + q8 * c->nb * 4);
}

/* Appends the bytes of one array to out at *at. */
static void put(char *out, size_t *at, const void *a, size_t bytes)
{
    memcpy(out + *at, a, bytes);
    *at += bytes;
}

enum { RUN_WHOLE, RUN_THREADS, RUN_RANGES };

/* The case's steps by impl (RUN_WHOLE: fy_adamw_update alone; RUN_THREADS: with 2 threads;
 * RUN_RANGES: fy_adamw_update_range in two parts split on a block boundary); the final state
 * serialised into a malloc'd buffer of mstate_bytes. */
static char *mcase_run(const struct mcase *c, enum fy_adamw_impl impl, int how)
{
    size_t ms = moment_size(c->mode), gs = fy_dtype_size(c->gdt);
    struct mstate s = {.p = xalloc(c->n * 4), .w = xalloc(c->n * 2), .m = xalloc(c->n * ms),
                       .v = xalloc(c->n * ms), .ma = xalloc(c->nb * 4), .va = xalloc(c->nb * 4)};
    memcpy(s.p, c->p0, c->n * 4);
    memcpy(s.m, c->m0, c->n * ms);
    memcpy(s.v, c->v0, c->n * ms);
    memcpy(s.ma, c->ma0, c->nb * 4);
    memcpy(s.va, c->va0, c->nb * 4);
    struct fy_threads *pool = NULL;
    if (how == RUN_THREADS)
        assert_int_equal(fy_threads_new(&pool, NULL, 2), 0);
    for (size_t k = 0; k < c->steps; k++) {
        struct fy_adamw_tensor x = {.master = s.p, .m = s.m, .v = s.v, .m_absmax = s.ma,
                                    .v_absmax = s.va, .moments = c->mode,
                                    .grad = (const char *)c->grads + k * c->n * gs,
                                    .grad_dtype = c->gdt, .weight_bf16 = s.w, .n = c->n,
                                    .grad_scale = c->gscale};
        uint64_t t = c->t0 + k;
        if (how == RUN_RANGES) {
            size_t mid = c->n / 2 / FY_QUANT8_BLOCK * FY_QUANT8_BLOCK;
            assert_int_equal(fy_adamw_update_range(&c->hp, t, &x, mid, c->n, impl), 0);
            assert_int_equal(fy_adamw_update_range(&c->hp, t, &x, 0, mid, impl), 0);
        } else {
            assert_int_equal(fy_adamw_update(pool, &c->hp, t, &x, impl), 0);
        }
    }
    fy_threads_destroy(&pool);
    char *out = malloc(mstate_bytes(c));
    assert_non_null(out);
    size_t at = 0, q8 = c->mode == FY_ADAMW_MOMENTS_Q8;
    put(out, &at, s.p, c->n * 4);
    put(out, &at, s.w, c->n * 2);
    put(out, &at, s.m, c->n * ms);
    put(out, &at, s.ma, q8 * c->nb * 4);
    put(out, &at, s.v, c->n * ms);
    put(out, &at, s.va, q8 * c->nb * 4);
    assert_int_equal(at, mstate_bytes(c));
    free(s.p), free(s.w), free(s.m), free(s.v), free(s.ma), free(s.va);
    return out;
}

/* Fails, naming the first differing array and element, unless got equals want bit for bit. */
static void mstate_expect(const struct mcase *c, const char *got, const char *want,
                          const char *what)
{
    if (memcmp(got, want, mstate_bytes(c)) == 0)
        return;
    size_t ms = moment_size(c->mode), q8 = c->mode == FY_ADAMW_MOMENTS_Q8;
    const struct { const char *name; size_t elems, size; } parts[] = {
        {"master", c->n, 4}, {"bf16 copy", c->n, 2}, {"m", c->n, ms},
        {"m_absmax", q8 * c->nb, 4}, {"v", c->n, ms}, {"v_absmax", q8 * c->nb, 4}};
    size_t at = 0;
    for (size_t k = 0; k < 6; k++) {
        for (size_t i = 0; i < parts[k].elems; i++, at += parts[k].size)
            if (memcmp(got + at, want + at, parts[k].size) != 0) {
                uint32_t a = 0, b = 0;
                memcpy(&a, got + at, parts[k].size);
                memcpy(&b, want + at, parts[k].size);
                fail_msg("%s: %s moments, n=%zu, %s grads, t0=%llu, scale %g: %s[%zu] is 0x%x, "
                         "expected 0x%x",
                         what, moment_name(c->mode), c->n, fy_dtype_name(c->gdt),
                         (unsigned long long)c->t0, (double)c->gscale, parts[k].name, i, a, b);
            }
    }
    fail_msg("%s: states differ", what);
}

static void mcase_write_input(const struct mcase *c, const char *path)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint32_t h[4] = {(uint32_t)c->mode, (uint32_t)c->n, (uint32_t)c->steps,
                     c->gdt == FY_DTYPE_BF16 ? 0u : 1u};
    float hf[6] = {c->hp.lr, c->hp.beta1, c->hp.beta2, c->hp.eps, c->hp.weight_decay, c->gscale};
    size_t ms = moment_size(c->mode), q8 = c->mode == FY_ADAMW_MOMENTS_Q8;
    int ok = fwrite(h, 4, 4, f) == 4 && fwrite(&c->t0, 8, 1, f) == 1 && fwrite(hf, 4, 6, f) == 6 &&
             fwrite(c->p0, 4, c->n, f) == c->n && fwrite(c->m0, ms, c->n, f) == c->n &&
             fwrite(c->ma0, 4, q8 * c->nb, f) == q8 * c->nb &&
             fwrite(c->v0, ms, c->n, f) == c->n &&
             fwrite(c->va0, 4, q8 * c->nb, f) == q8 * c->nb &&
             fwrite(c->grads, fy_dtype_size(c->gdt), c->steps * c->n, f) == c->steps * c->n;
    assert_true(ok);
    assert_int_equal(fclose(f), 0);
}

static const enum fy_adamw_impl all_impls[] = {FY_ADAMW_SCALAR, FY_ADAMW_AVX2, FY_ADAMW_AVX512};

/* Every implementation this CPU has, whole, threaded and in ranges, against want; the ones it
 * lacks are said once per test. */
static void mcase_check_all(const struct mcase *c, const char *want, int *said_missing)
{
    for (size_t k = 0; k < 3; k++) {
        if (!fy_adamw_impl_supported(all_impls[k])) {
            if (!*said_missing)
                printf("  %s: not on this CPU, not checked\n", fy_adamw_impl_name(all_impls[k]));
            continue;
        }
        for (int how = RUN_WHOLE; how <= RUN_RANGES; how++) {
            char *got = mcase_run(c, all_impls[k], how);
            char what[64];
            snprintf(what, sizeof what, "%s %s", fy_adamw_impl_name(all_impls[k]),
                     how == RUN_WHOLE ? "whole" : how == RUN_THREADS ? "2 threads" : "ranges");
            mstate_expect(c, got, want, what);
            free(got);
        }
    }
    *said_missing = 1;
}

/* Gradients that put 8-bit values exactly on midpoints: with beta1 = beta2 = 0 the new m is the
 * gradient itself, and element 0 of each block is 1.0 so absmax is 1 and y = m exactly: map
 * values, midpoints that are floats (ties, which go to the lower code), their neighbouring floats,
 * and their negations. f32 gradients, one step, lr 0 (p keeps its value up to the decay). */
static void mcase_make_ties(struct mcase *c, size_t n)
{
    mcase_make(c, FY_ADAMW_MOMENTS_Q8, n, FY_DTYPE_F32, INIT_ZERO, 5, 0.0f);
    c->steps = 1;
    c->hp.beta1 = 0.0f;
    c->hp.beta2 = 0.0f;
    c->hp.lr = 0.0f;
    const float *map = fy_quant8_map(1);
    for (size_t i = 0; i < n; i++) {
        size_t k = (i * 7) % 255;
        double mid = ((double)map[k] + map[k + 1]) / 2;
        float f = (float)mid, g;
        switch ((i / 3) % 4) {
        case 0: g = map[k]; break;
        case 1: g = (double)f == mid ? f : nextafterf(f, INFINITY); break;
        case 2: g = nextafterf(f, -INFINITY); break;
        default: g = nextafterf(f, INFINITY); break;
        }
        if (i % 2)
            g = -g;
        if (i % FY_QUANT8_BLOCK == 0)
            g = 1.0f;
        mcase_set_grad(c, 0, i, g);
    }
}

/* The ties case without numpy: the 8-bit m codes are quant8's codes of the gradients, v's those
 * of their squares, whatever the implementation. */
static void test_q8_ties_like_quant8(void **state)
{
    struct mcase c;
    const size_t n = 3 * FY_QUANT8_BLOCK + 77;
    mcase_make_ties(&c, n);
    const float *g = c.grads;
    float *sq = malloc(n * 4), *ma = malloc(c.nb * 4), *va = malloc(c.nb * 4);
    uint8_t *mc = malloc(n), *vc = malloc(n);
    assert_non_null(sq), assert_non_null(ma), assert_non_null(va);
    assert_non_null(mc), assert_non_null(vc);
    for (size_t i = 0; i < n; i++)
        sq[i] = g[i] * g[i];
    assert_int_equal(fy_quant8_quantize(g, n, 1, mc, ma), 0);
    assert_int_equal(fy_quant8_quantize(sq, n, 0, vc, va), 0);
    size_t ties = 0;
    const float *map = fy_quant8_map(1);
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 255; k++)
            ties += ((double)map[k] + map[k + 1]) / 2 == (double)g[i];
    assert_true(ties > 50); /* the case does test ties */
    for (size_t k = 0; k < 3; k++) {
        if (!fy_adamw_impl_supported(all_impls[k]))
            continue;
        char *got = mcase_run(&c, all_impls[k], RUN_WHOLE);
        const char *m = got + n * 6, *v = m + n + c.nb * 4;
        assert_memory_equal(m, mc, n);
        assert_memory_equal(m + n, ma, c.nb * 4);
        assert_memory_equal(v, vc, n);
        assert_memory_equal(v + n, va, c.nb * 4);
        free(got);
    }
    free(sq), free(ma), free(va), free(mc), free(vc);
    mcase_free(&c);
}

/* The 8-bit codes of m = g (beta1 = beta2 = 0, absmax 1) and v = g*g for the given f32 gradients
 * (element 0 of each block must be 1.0 or -1.0) equal quant8's, for every implementation. */
static void check_q8_codes_like_quant8(struct mcase *c)
{
    size_t n = c->n;
    const float *g = c->grads;
    float *sq = malloc(n * 4), *ma = malloc(c->nb * 4), *va = malloc(c->nb * 4);
    uint8_t *mc = malloc(n), *vc = malloc(n);
    assert_non_null(sq), assert_non_null(ma), assert_non_null(va);
    assert_non_null(mc), assert_non_null(vc);
    for (size_t i = 0; i < n; i++)
        sq[i] = g[i] * g[i];
    assert_int_equal(fy_quant8_quantize(g, n, 1, mc, ma), 0);
    assert_int_equal(fy_quant8_quantize(sq, n, 0, vc, va), 0);
    for (size_t k = 0; k < 3; k++) {
        if (!fy_adamw_impl_supported(all_impls[k]))
            continue;
        char *got = mcase_run(c, all_impls[k], RUN_WHOLE);
        const uint8_t *m = (const uint8_t *)got + n * 6, *v = m + n + c->nb * 4;
        for (size_t i = 0; i < n; i++)
            if (m[i] != mc[i] || v[i] != vc[i])
                fail_msg("%s: g = %a: m code %d (quant8: %d), v code %d (quant8: %d)",
                         fy_adamw_impl_name(all_impls[k]), (double)g[i], m[i], mc[i], v[i], vc[i]);
        assert_memory_equal(m + n, ma, c->nb * 4);
        assert_memory_equal(v + n, va, c->nb * 4);
        free(got);
    }
    free(sq), free(ma), free(va), free(mc), free(vc);
}

/* Values on and beside every 2^-8 step of every binade from 2^-26 to 1, both signs: the edges of
 * any table the SIMD code searches may cut [-1, 1] into, each of their codes as quant8 gives it. */
static void test_q8_codes_every_step(void **state)
{
    const size_t per = 26 * 256 * 4, n = per + per / 255 + 2;
    struct mcase c;
    mcase_make(&c, FY_ADAMW_MOMENTS_Q8, n, FY_DTYPE_F32, INIT_ZERO, 7, 0.0f);
    c.steps = 1;
    c.hp.beta1 = c.hp.beta2 = c.hp.lr = 0.0f;
    size_t at = 0;
    for (int e = -26; e < 0; e++)
        for (uint32_t top = 0; top < 256; top++)
            for (int k = 0; k < 4; k++) {
                uint32_t bits = ((uint32_t)(e + 127) << 23) | (top << 15) |
                                (k % 2 ? 0x7fffu : 0u) | (k >= 2 ? 0x80000000u : 0u);
                float g;
                memcpy(&g, &bits, 4);
                if (at % FY_QUANT8_BLOCK == 0) {
                    mcase_set_grad(&c, 0, at, (at / FY_QUANT8_BLOCK) % 2 ? -1.0f : 1.0f);
                    at++;
                }
                mcase_set_grad(&c, 0, at, g);
                at++;
            }
    for (; at < n; at++)
        mcase_set_grad(&c, 0, at, at % FY_QUANT8_BLOCK == 0 ? 1.0f : 0.0f);
    check_q8_codes_like_quant8(&c);
    mcase_free(&c);
}

/* Every implementation gives the scalar one's bits with compact moments, NaN and Inf gradients
 * included (no numpy needed). */
static void test_moments_identical(void **state)
{
    static const size_t ns[] = {1, 100, 256, 257, 1000, 131372};
    int said = 0;
    for (int mode = FY_ADAMW_MOMENTS_BF16; mode <= FY_ADAMW_MOMENTS_Q8; mode++)
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
            for (int init = INIT_ZERO; init <= INIT_RANDOM; init++) {
                struct mcase c;
                mcase_make(&c, mode, ns[k], init ? FY_DTYPE_BF16 : FY_DTYPE_F32, init,
                           3 * ns[k] + (uint64_t)mode, init ? 0.37f : 0.0f);
                if (ns[k] > 300) {
                    mcase_set_grad(&c, 1, 300, NAN);
                    mcase_set_grad(&c, 2, ns[k] - 1, INFINITY);
                }
                char *want = mcase_run(&c, FY_ADAMW_SCALAR, RUN_WHOLE);
                mcase_check_all(&c, want, &said);
                free(want);
                mcase_free(&c);
            }
}

static int in_ci, have_numpy;

/* (a) Bit for bit against tests/reference/adamw_ref.py over several steps, for each moments mode,
 * sizes below, at and off the block size, from the zero state and from a random one, with and
 * without a clipping scale, bf16 and f32 gradients, NaN/Inf gradients, 8-bit ties; every
 * implementation here, threaded and not. */
static void test_numpy_reference(void **state)
{
    if (!have_numpy) {
        if (in_ci)
            fail_msg("python3 with numpy is missing under CI: .ci/run installs it");
        printf("test_adamw: skipped: python3 with numpy is needed for adamw_ref.py\n");
        skip();
    }
    assert_true(fy_refmodel_little_endian());
    char script[4096];
    if (fy_refmodel_script("adamw_ref.py", script, sizeof script) != 0)
        fail_msg("cannot read %s (run from the repository root)", script);
    char *dir = fy_test_tmpdir("adamw_ref");
    assert_non_null(dir);
    static const size_t ns[] = {1, 100, 255, 256, 257, 1000, 4096, 131372};
    enum { NS = sizeof ns / sizeof ns[0], MAXC = 3 * NS * 2 + 4 };
    static struct mcase cases[MAXC];
    size_t nc = 0;
    for (int mode = FY_ADAMW_MOMENTS_F32; mode <= FY_ADAMW_MOMENTS_Q8; mode++)
        for (size_t k = 0; k < NS; k++)
            for (int init = INIT_ZERO; init <= INIT_RANDOM; init++) {
                struct mcase *c = &cases[nc++];
                mcase_make(c, mode, ns[k], ns[k] == 257 ? FY_DTYPE_F32 : FY_DTYPE_BF16, init,
                           11 * ns[k] + 7 * (uint64_t)mode + (uint64_t)init,
                           init == INIT_RANDOM ? 0.37f : 0.0f);
            }
    /* NaN and Inf gradients (the 8-bit NaN rule), in a bf16 and an 8-bit case */
    for (int mode = FY_ADAMW_MOMENTS_BF16; mode <= FY_ADAMW_MOMENTS_Q8; mode++) {
        struct mcase *c = &cases[nc++];
        mcase_make(c, mode, 1000, FY_DTYPE_BF16, INIT_RANDOM, 99, 0.0f);
        mcase_set_grad(c, 0, 300, NAN);
        mcase_set_grad(c, 1, 700, INFINITY);
        mcase_set_grad(c, 2, 999, -INFINITY);
    }
    mcase_make_ties(&cases[nc++], 3 * FY_QUANT8_BLOCK + 77);
    assert_true(nc <= MAXC);
    char **argv = calloc(2 * nc + 3, sizeof *argv);
    assert_non_null(argv);
    argv[0] = "python3";
    argv[1] = script;
    for (size_t i = 0; i < nc; i++) {
        char name[32];
        snprintf(name, sizeof name, "in%zu.bin", i);
        argv[2 + 2 * i] = strdup(fy_test_path(dir, name));
        snprintf(name, sizeof name, "out%zu.bin", i);
        argv[3 + 2 * i] = strdup(fy_test_path(dir, name));
        mcase_write_input(&cases[i], argv[2 + 2 * i]);
    }
    assert_int_equal(fy_refmodel_run(argv, 600), 0);
    int said = 0;
    for (size_t i = 0; i < nc; i++) {
        size_t len = 0;
        char *want = fy_test_slurp(argv[3 + 2 * i], &len);
        assert_non_null(want);
        assert_int_equal(len, mstate_bytes(&cases[i]));
        mcase_check_all(&cases[i], want, &said);
        free(want);
        mcase_free(&cases[i]);
        free(argv[2 + 2 * i]);
        free(argv[3 + 2 * i]);
    }
    printf("test_adamw: %zu cases (f32, bf16 and 8-bit moments) equal to numpy's bit for bit\n",
           nc);
    free(argv);
    fy_test_rmdir(dir);
    free(dir);
}

/* (b) 8-bit ranges must follow the blocks; rows must be whole blocks. */
static void test_q8_ranges(void **state)
{
    struct mcase c;
    const size_t n = 4 * FY_QUANT8_BLOCK + 10;
    mcase_make(&c, FY_ADAMW_MOMENTS_Q8, n, FY_DTYPE_BF16, INIT_RANDOM, 4, 0.0f);
    struct fy_adamw_tensor x = {.master = c.p0, .m = c.m0, .v = c.v0, .m_absmax = c.ma0,
                                .v_absmax = c.va0, .moments = FY_ADAMW_MOMENTS_Q8,
                                .grad = c.grads, .grad_dtype = c.gdt, .n = n};
    char *keep = malloc(n * 10);
    assert_non_null(keep);
    memcpy(keep, c.p0, n * 4);
    memcpy(keep + n * 4, c.m0, n);
    assert_int_equal(fy_adamw_update_range(&HP, 1, &x, 1, n, FY_ADAMW_SCALAR), -EINVAL);
    assert_int_equal(fy_adamw_update_range(&HP, 1, &x, 100, 256, FY_ADAMW_AUTO), -EINVAL);
    assert_int_equal(fy_adamw_update_range(&HP, 1, &x, 0, 300, FY_ADAMW_AUTO), -EINVAL);
    assert_int_equal(fy_adamw_update_range(&HP, 1, &x, 256, n - 1, FY_ADAMW_AUTO), -EINVAL);
    int32_t row = 1;
    assert_int_equal(fy_adamw_update_rows(NULL, &HP, 1, &x, &row, 1, 96, FY_ADAMW_AUTO), -EINVAL);
    assert_int_equal(fy_adamw_update_rows(NULL, &HP, 1, &x, &row, 1, 384, FY_ADAMW_AUTO), -EINVAL);
    x.m_absmax = NULL;
    assert_int_equal(fy_adamw_update_range(&HP, 1, &x, 0, n, FY_ADAMW_AUTO), -EINVAL);
    x.m_absmax = c.ma0;
    x.moments = 3;
    assert_int_equal(fy_adamw_update_range(&HP, 1, &x, 0, n, FY_ADAMW_AUTO), -EINVAL);
    x.moments = FY_ADAMW_MOMENTS_Q8;
    /* nothing was written by any refused call */
    assert_memory_equal(keep, c.p0, n * 4);
    assert_memory_equal(keep + n * 4, c.m0, n);
    /* aligned ranges, one ending at n, and whole-block rows are accepted */
    assert_int_equal(fy_adamw_update_range(&HP, 1, &x, 256, 512, FY_ADAMW_AUTO), 0);
    assert_int_equal(fy_adamw_update_range(&HP, 1, &x, 1024, n, FY_ADAMW_AUTO), 0);
    assert_int_equal(fy_adamw_update_range(&HP, 1, &x, 512, 512, FY_ADAMW_AUTO), 0);
    assert_int_equal(fy_adamw_update_rows(NULL, &HP, 1, &x, &row, 1, 256, FY_ADAMW_AUTO), 0);
    free(keep);
    mcase_free(&c);
}

/* The 8-bit update by rows of 256 gives fy_adamw_update's bits for the rows listed and leaves the
 * others alone. */
static void test_q8_rows(void **state)
{
    struct mcase c;
    const size_t row = 512, rows = 40, n = row * rows;
    mcase_make(&c, FY_ADAMW_MOMENTS_Q8, n, FY_DTYPE_BF16, INIT_RANDOM, 8, 0.0f);
    c.steps = 1;
    char *whole = mcase_run(&c, FY_ADAMW_AUTO, RUN_WHOLE);
    int32_t list[rows];
    size_t count = 0;
    for (size_t r = 0; r < rows; r++)
        if (r % 3 == 0)
            list[count++] = (int32_t)r;
    struct fy_threads *pool = NULL;
    assert_int_equal(fy_threads_new(&pool, NULL, 2), 0);
    float *ma = malloc(c.nb * 4), *va = malloc(c.nb * 4);
    uint8_t *m = malloc(n), *v = malloc(n);
    float *p = malloc(n * 4);
    assert_non_null(ma), assert_non_null(va), assert_non_null(m), assert_non_null(v);
    assert_non_null(p);
    memcpy(p, c.p0, n * 4), memcpy(m, c.m0, n), memcpy(v, c.v0, n);
    memcpy(ma, c.ma0, c.nb * 4), memcpy(va, c.va0, c.nb * 4);
    struct fy_adamw_tensor x = {.master = p, .m = m, .v = v, .m_absmax = ma, .v_absmax = va,
                                .moments = FY_ADAMW_MOMENTS_Q8, .grad = c.grads,
                                .grad_dtype = c.gdt, .n = n};
    assert_int_equal(fy_adamw_update_rows(pool, &HP, c.t0, &x, list, count, row, FY_ADAMW_AUTO),
                     0);
    fy_threads_destroy(&pool);
    const float *wp = (const float *)whole;
    const uint8_t *wm = (const uint8_t *)whole + n * 6, *wv = wm + n + c.nb * 4;
    const float *wma = (const float *)(wm + n), *wva = (const float *)(wv + n);
    for (size_t r = 0, k = 0; r < rows; r++) {
        int listed = k < count && list[k] == (int32_t)r;
        k += listed;
        size_t at = r * row, b = at / FY_QUANT8_BLOCK, nb = row / FY_QUANT8_BLOCK;
        assert_memory_equal(p + at, listed ? wp + at : c.p0 + at, row * 4);
        assert_memory_equal(m + at, listed ? wm + at : (uint8_t *)c.m0 + at, row);
        assert_memory_equal(v + at, listed ? wv + at : (uint8_t *)c.v0 + at, row);
        assert_memory_equal(ma + b, listed ? wma + b : c.ma0 + b, nb * 4);
        assert_memory_equal(va + b, listed ? wva + b : c.va0 + b, nb * 4);
    }
    free(ma), free(va), free(m), free(v), free(p), free(whole);
    mcase_free(&c);
}

/* (c) A NaN or Inf gradient: its block's absmax becomes NaN with the code of 0 everywhere (for m
 * and v), other blocks stay finite, and the block's moments dequantize to NaN afterwards. */
static void test_q8_nan_rule(void **state)
{
    const size_t n = 3 * FY_QUANT8_BLOCK + 5;
    for (size_t k = 0; k < 3; k++) {
        if (!fy_adamw_impl_supported(all_impls[k]))
            continue;
        for (int which = 0; which < 3; which++) {
            struct mcase c;
            mcase_make(&c, FY_ADAMW_MOMENTS_Q8, n, FY_DTYPE_F32, INIT_RANDOM, 6, 0.0f);
            c.steps = 1;
            size_t bad = which == 2 ? n - 1 : 300;
            mcase_set_grad(&c, 0, bad, which == 0 ? NAN : which == 1 ? INFINITY : -INFINITY);
            char *got = mcase_run(&c, all_impls[k], RUN_WHOLE);
            const uint8_t *m = (const uint8_t *)got + n * 6, *v = m + n + c.nb * 4;
            float ma[4], va[4];
            memcpy(ma, m + n, c.nb * 4);
            memcpy(va, v + n, c.nb * 4);
            size_t bb = bad / FY_QUANT8_BLOCK;
            for (size_t b = 0; b < c.nb; b++) {
                assert_true(b == bb ? isnan(ma[b]) && isnan(va[b])
                                    : isfinite(ma[b]) && isfinite(va[b]) && ma[b] > 0);
            }
            size_t end = (bb + 1) * FY_QUANT8_BLOCK < n ? (bb + 1) * FY_QUANT8_BLOCK : n;
            for (size_t i = bb * FY_QUANT8_BLOCK; i < end; i++) {
                assert_int_equal(m[i], fy_quant8_zero_code(1));
                assert_int_equal(v[i], fy_quant8_zero_code(0));
            }
            float deq[FY_QUANT8_BLOCK];
            fy_quant8_dequantize(m + bb * FY_QUANT8_BLOCK, &ma[bb], end - bb * FY_QUANT8_BLOCK,
                                 1, deq);
            assert_true(isnan(deq[0]) && isnan(deq[end - bb * FY_QUANT8_BLOCK - 1]));
            free(got);
            mcase_free(&c);
        }
    }
}

/* (d) the zero state: the codes of 0 and absmax 0 are m = v = 0, so the first step gives the fp32
 * moments' p and the quantized fp32 moments of that step. */
static void test_q8_zero_state(void **state)
{
    assert_int_equal(fy_quant8_zero_code(1), 127);
    assert_int_equal(fy_quant8_zero_code(0), 0);
    assert_true(fy_quant8_map(1)[127] == 0.0f && fy_quant8_map(0)[0] == 0.0f);
    const size_t n = 2 * FY_QUANT8_BLOCK + 33;
    struct mcase q, f;
    mcase_make(&q, FY_ADAMW_MOMENTS_Q8, n, FY_DTYPE_BF16, INIT_ZERO, 12, 0.0f);
    mcase_make(&f, FY_ADAMW_MOMENTS_F32, n, FY_DTYPE_BF16, INIT_ZERO, 12, 0.0f);
    q.steps = f.steps = 1;
    char *gq = mcase_run(&q, FY_ADAMW_AUTO, RUN_WHOLE), *gf = mcase_run(&f, FY_ADAMW_AUTO,
                                                                        RUN_WHOLE);
    assert_memory_equal(gq, gf, n * 6); /* master and its bf16 copy */
    uint8_t *codes = malloc(n);
    float *absmax = malloc(q.nb * 4);
    assert_non_null(codes), assert_non_null(absmax);
    /* the moments follow master and its bf16 copy (n * 6 bytes): copied out to be aligned */
    float *fm = malloc(n * 8), *fv = fm + n;
    assert_non_null(fm);
    memcpy(fm, gf + n * 6, n * 8);
    const char *qm = gq + n * 6, *qv = qm + n + q.nb * 4;
    assert_int_equal(fy_quant8_quantize(fm, n, 1, codes, absmax), 0);
    assert_memory_equal(qm, codes, n);
    assert_memory_equal(qm + n, absmax, q.nb * 4);
    assert_int_equal(fy_quant8_quantize(fv, n, 0, codes, absmax), 0);
    assert_memory_equal(qv, codes, n);
    assert_memory_equal(qv + n, absmax, q.nb * 4);
    free(codes), free(absmax), free(gq), free(gf), free(fm);
    mcase_free(&q);
    mcase_free(&f);
}

int main(void)
{
    in_ci = fy_test_in_ci();
    have_numpy = fy_refmodel_python_has("numpy");
    printf("best AdamW implementation on this CPU: %s\n", fy_adamw_impl_name(fy_adamw_best_impl()));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vs_double_reference), cmocka_unit_test(test_multistep_vs_reference),
        cmocka_unit_test(test_avx2_identical),      cmocka_unit_test(test_avx512_identical),
        cmocka_unit_test(test_bf16_output),         cmocka_unit_test(test_threads_identical),
        cmocka_unit_test(test_scaled_equals_prescaled), cmocka_unit_test(test_rows_update),
        cmocka_unit_test(test_sumsq),               cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_moments_identical),   cmocka_unit_test(test_q8_ties_like_quant8),
        cmocka_unit_test(test_q8_ranges),           cmocka_unit_test(test_q8_rows),
        cmocka_unit_test(test_q8_nan_rule),         cmocka_unit_test(test_q8_zero_state),
        cmocka_unit_test(test_q8_codes_every_step), cmocka_unit_test(test_numpy_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
