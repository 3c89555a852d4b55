/* opt_worker/quant8: the dynamic maps' shape, nearest-code quantization checked against a brute-force
 * search, the round-trip error bound per block on random and adversarial inputs (map points,
 * midpoints, zero blocks, a huge value, a short last block, denormals, -0.0), the refusal of NaN/Inf,
 * and codes and absmax bit for bit against tests/reference/quant8_ref.py (numpy), which is skipped,
 * saying so, without python3 and numpy, except under CI (CI=true), where that is a failure. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "opt_worker/quant8.h"
#include "tests/refmodel.h"
#include "tests/testutil.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return rng_state;
}

static double rng_uniform(void) /* in (0, 1) */
{
    return ((double)(rng_next() >> 11) + 0.5) / 9007199254740992.0;
}

static double rng_normal(void)
{
    return sqrt(-2.0 * log(rng_uniform())) * cos(6.283185307179586 * rng_uniform());
}

enum dist { DIST_NORMAL, DIST_UNIFORM, DIST_LOGSPREAD, DIST_SPARSE, DIST_COUNT };

/* n values of a distribution; non-negative (squared) for the unsigned map, as v is. */
static void fill(float *x, size_t n, enum dist d, int is_signed)
{
    for (size_t i = 0; i < n; i++) {
        double v;
        switch (d) {
        case DIST_NORMAL: v = 1e-3 * rng_normal(); break;
        case DIST_UNIFORM: v = 2.0 * rng_uniform() - 1.0; break;
        case DIST_LOGSPREAD: /* magnitudes over 12 decades: all the map's levels */
            v = pow(10.0, -12.0 * rng_uniform()) * (rng_next() & 1 ? 1 : -1);
            break;
        default: v = rng_uniform() < 0.9 ? 0.0 : rng_normal(); break;
        }
        if (!is_signed)
            v = v * v;
        x[i] = (float)v;
    }
}

/* Half the largest gap between neighbouring map values; for the signed map, y = -1 lies outside it,
 * at 1 + map[0] from its nearest value (about the same: 0.9/128). */
static double half_max_gap(const float *map)
{
    double g = 0;
    for (int k = 0; k + 1 < FY_QUANT8_CODES; k++)
        if ((double)map[k + 1] - map[k] > g)
            g = (double)map[k + 1] - map[k];
    g /= 2;
    if (map[0] < 0 && 1.0 + map[0] > g)
        g = 1.0 + map[0];
    return g;
}

/* Index of the map value nearest to y by a full scan in long double (exact here), ties to the lower. */
static int brute_nearest(const float *map, float y)
{
    int best = 0;
    long double bd = fabsl((long double)y - map[0]);
    for (int k = 1; k < FY_QUANT8_CODES; k++) {
        long double d = fabsl((long double)y - map[k]);
        if (d < bd)
            bd = d, best = k;
    }
    return best;
}

/* Quantizes x[n], checks each code against the brute-force nearest and the round-trip error against
 * half the largest gap x absmax per block; returns the largest |x - deq| / absmax seen. */
static double check_roundtrip(const float *x, size_t n, int is_signed)
{
    const float *map = fy_quant8_map(is_signed);
    size_t nb = fy_quant8_blocks(n);
    uint8_t *codes = malloc(n);
    float *absmax = malloc(nb * sizeof *absmax), *out = malloc(n * sizeof *out);
    assert_non_null(codes), assert_non_null(absmax), assert_non_null(out);
    assert_int_equal(fy_quant8_quantize(x, n, is_signed, codes, absmax), 0);
    fy_quant8_dequantize(codes, absmax, n, is_signed, out);
    double hg = half_max_gap(map), worst = 0;
    for (size_t i = 0; i < n; i++) {
        size_t b = i / FY_QUANT8_BLOCK;
        float a = absmax[b];
        if (i % FY_QUANT8_BLOCK == 0) {
            float want = 0;
            for (size_t j = i; j < n && j < i + FY_QUANT8_BLOCK; j++)
                want = fabsf(x[j]) > want ? fabsf(x[j]) : want;
            assert_true(a == want);
        }
        if (a == 0) {
            assert_true(map[codes[i]] == 0.0f);
            assert_true(out[i] == 0.0f && !signbit(out[i]));
            continue;
        }
        int want = brute_nearest(map, x[i] / a);
        if (codes[i] != want)
            fail_msg("value %zu (%a, absmax %a): code %d, nearest %d", i, x[i], a, codes[i], want);
        double err = fabs((double)x[i] - out[i]);
        /* the fp32 division (y) and product (deq) each add at most half an ulp of a */
        if (err > hg * a + FLT_EPSILON * a + FLT_TRUE_MIN)
            fail_msg("value %zu (%a): round trip %a, error %g > %g x absmax %a", i, x[i], out[i], err, hg,
                     a);
        if (err / a > worst)
            worst = err / a;
    }
    free(codes), free(absmax), free(out);
    return worst;
}

static void test_maps(void **state)
{
    (void)state;
    for (int s = 0; s < 2; s++) {
        const float *m = fy_quant8_map(s);
        for (int k = 0; k + 1 < FY_QUANT8_CODES; k++)
            assert_true(m[k] < m[k + 1]); /* strictly ascending: 256 distinct values */
        assert_true(m[255] == 1.0f);
        printf("test_quant8: %s map: [0] %.9g, [1] %.9g, [254] %.9g, [255] %.9g, half the largest gap "
               "%.9g\n", s ? "signed" : "unsigned", m[0], m[1], m[254], m[255], half_max_gap(m));
    }
    const float *sm = fy_quant8_map(1), *um = fy_quant8_map(0);
    assert_true(sm[127] == 0.0f);
    for (int k = 0; k < 127; k++) /* symmetric except 1.0 */
        assert_true(sm[k] == -sm[254 - k]);
    assert_float_equal(sm[0], -0.99296875, 1e-7);
    assert_float_equal(sm[128], 5.5e-7, 1e-13);
    assert_float_equal(sm[254], 0.99296875, 1e-7);
    assert_true(um[0] == 0.0f);
    assert_float_equal(um[1], 3.25e-7, 1e-13);
    assert_float_equal(um[254], 0.996484375, 1e-7);
    /* decades: each of the 7 levels [10^(e-6) * 0.1, 10^(e-6)) holds 2^e (signed, per sign) or
     * 2^(e+1) (unsigned) values */
    for (int e = 0; e < 7; e++) {
        double lo = pow(10.0, e - 7), hi = pow(10.0, e - 6);
        int ns = 0, nu = 0;
        for (int k = 0; k < 256; k++) {
            ns += sm[k] > lo && sm[k] < hi;
            nu += um[k] > lo && um[k] < hi;
        }
        assert_int_equal(ns, 1 << e);
        assert_int_equal(nu, 1 << (e + 1));
    }
}

static void test_random(void **state)
{
    (void)state;
    enum { N = 256 * 40 + 77 };
    float *x = malloc(N * sizeof *x);
    assert_non_null(x);
    for (int s = 0; s < 2; s++) {
        double worst = 0;
        for (int d = 0; d < DIST_COUNT; d++) {
            fill(x, N, (enum dist)d, s);
            double w = check_roundtrip(x, N, s);
            worst = w > worst ? w : worst;
        }
        printf("test_quant8: %s map: largest |x - deq(q(x))| / absmax over %d random values: %.9g "
               "(bound %.9g, plus fp32 rounding)\n", s ? "signed" : "unsigned", N * DIST_COUNT, worst,
               half_max_gap(fy_quant8_map(s)));
    }
    free(x);
}

/* Map points and the floats either side of every midpoint, in blocks whose absmax is 1, so y = x. */
static void test_points_and_midpoints(void **state)
{
    (void)state;
    for (int s = 0; s < 2; s++) {
        const float *m = fy_quant8_map(s);
        uint8_t codes[256];
        float absmax[1], x[256];
        memcpy(x, m, sizeof x);
        assert_int_equal(fy_quant8_quantize(x, 256, s, codes, absmax), 0);
        assert_true(absmax[0] == 1.0f);
        for (int k = 0; k < 256; k++)
            assert_int_equal(codes[k], k);
        int exact_ties = 0;
        for (int k = 0; k + 1 < 256; k++) {
            double mid = ((double)m[k] + m[k + 1]) / 2;
            float below = (float)mid;
            if (below > mid)
                below = nextafterf(below, -INFINITY);
            float above = nextafterf(below, INFINITY);
            exact_ties += below == mid;
            float v[3] = {below, above, 1.0f};
            uint8_t c[3];
            assert_int_equal(fy_quant8_quantize(v, 3, s, c, absmax), 0);
            assert_int_equal(c[0], k); /* on the midpoint: the lower index */
            assert_int_equal(c[1], k + 1);
            assert_int_equal(c[2], 255);
        }
        printf("test_quant8: %s map: %d of 255 midpoints are floats (ties, to the lower code)\n",
               s ? "signed" : "unsigned", exact_ties);
        assert_true(exact_ties > 100);
    }
    float minus_one = -1.0f;
    uint8_t c;
    float a;
    assert_int_equal(fy_quant8_quantize(&minus_one, 1, 1, &c, &a), 0);
    assert_int_equal(c, 0); /* no -1 in the signed map: the nearest is -0.99296875 */
}

static void test_adversarial_blocks(void **state)
{
    (void)state;
    enum { N = 256 * 6 + 17 }; /* short last block */
    float *x = calloc(N, sizeof *x);
    assert_non_null(x);
    for (int s = 0; s < 2; s++) {
        fill(x, N, DIST_NORMAL, s);
        memset(x + 256, 0, 256 * sizeof *x); /* block 1: all zero */
        x[512 + 100] = s ? -3e30f : 3e30f;   /* block 2: one huge value */
        for (int i = 768; i < 1024; i++)     /* block 3: denormals */
            x[i] = (float)(i - 768 + 1) * FLT_TRUE_MIN * (s && i % 2 ? -1 : 1);
        for (int i = 1024; i < 1280; i++) /* block 4: -0.0 among small values */
            x[i] = i % 3 ? -0.0f : 1e-20f * (float)(i - 1024);
        for (int i = 1280; i < 1536; i++) /* block 5: -0.0 only */
            x[i] = -0.0f;
        check_roundtrip(x, N, s);
        uint8_t *codes = malloc(N);
        float absmax[7], *out = malloc(N * sizeof *out);
        assert_int_equal(fy_quant8_quantize(x, N, s, codes, absmax), 0);
        fy_quant8_dequantize(codes, absmax, N, s, out);
        assert_true(absmax[1] == 0.0f && absmax[5] == 0.0f);
        assert_true(absmax[3] == 256 * FLT_TRUE_MIN);
        for (int i = 1024; i < 1536; i++)
            if (x[i] == 0.0f)
                assert_true(out[i] == 0.0f && !signbit(out[i])); /* -0.0 comes back +0.0 */
        for (int i = 512; i < 768; i++)                           /* the huge value swamps its block */
            if (i != 612)
                assert_true(fy_quant8_map(s)[codes[i]] == 0.0f);
        free(codes), free(out);
    }
    free(x);
}

static void test_refused(void **state)
{
    (void)state;
    float bad[4][300];
    float specials[4] = {NAN, INFINITY, -INFINITY, -1e-30f};
    for (int t = 0; t < 4; t++) {
        for (int i = 0; i < 300; i++)
            bad[t][i] = 0.5f;
        bad[t][299] = specials[t]; /* in the second block: nothing of the first may be written */
        for (int s = 0; s < 2; s++) {
            uint8_t codes[300];
            float absmax[2] = {-7, -7};
            memset(codes, 0xab, sizeof codes);
            int rc = fy_quant8_quantize(bad[t], 300, s, codes, absmax);
            if (t == 3 && s) { /* a negative value is fine for the signed map */
                assert_int_equal(rc, 0);
                continue;
            }
            assert_int_equal(rc, -EINVAL);
            for (int i = 0; i < 300; i++)
                assert_int_equal(codes[i], 0xab);
            assert_true(absmax[0] == -7 && absmax[1] == -7);
        }
    }
    float mz = -0.0f; /* -0.0 is not negative: the unsigned map takes it */
    uint8_t c;
    float a;
    assert_int_equal(fy_quant8_quantize(&mz, 1, 0, &c, &a), 0);
    assert_true(a == 0.0f && c == 0);
    assert_int_equal(fy_quant8_quantize(NULL, 0, 1, NULL, NULL), 0);
    assert_int_equal(fy_quant8_blocks(0), 0);
    assert_int_equal(fy_quant8_blocks(256), 1);
    assert_int_equal(fy_quant8_blocks(257), 2);
}

static int in_ci, have_numpy;

static void write_floats(const char *path, const float *x, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(x, sizeof *x, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void test_numpy_reference(void **state)
{
    (void)state;
    if (!have_numpy) {
        if (in_ci)
            fail_msg("python3 with numpy is missing under CI: .ci/run installs it");
        printf("test_quant8: skipped: python3 with numpy is needed for quant8_ref.py\n");
        skip();
    }
    assert_true(fy_refmodel_little_endian());
    char script[4096];
    if (fy_refmodel_script("quant8_ref.py", script, sizeof script) != 0)
        fail_msg("cannot read %s (run from the repository root)", script);
    char *dir = fy_test_tmpdir("quant8");
    assert_non_null(dir);
    enum { PER = 256 * 3 + 100 };
    size_t n = PER * (DIST_COUNT + 1);
    float *x = malloc(n * sizeof *x);
    uint8_t *codes = malloc(n);
    float *absmax = malloc(fy_quant8_blocks(n) * sizeof *absmax);
    assert_non_null(x), assert_non_null(codes), assert_non_null(absmax);
    for (int s = 0; s < 2; s++) {
        const float *m = fy_quant8_map(s);
        char sign[2] = {(char)('0' + s), 0};
        char *mpath = fy_test_path(dir, "map.bin"), *in = fy_test_path(dir, "in.bin"),
             *outp = fy_test_path(dir, "out.bin");
        char *argv_map[] = {"python3", script, "map", sign, mpath, NULL};
        assert_int_equal(fy_refmodel_run(argv_map, 120), 0);
        size_t len = 0;
        char *ref = fy_test_slurp(mpath, &len);
        assert_non_null(ref);
        assert_int_equal(len, 256 * sizeof(float));
        assert_memory_equal(ref, m, len);
        free(ref);
        for (int d = 0; d < DIST_COUNT; d++)
            fill(x + (size_t)d * PER, PER, (enum dist)d, s);
        /* adversarial: map points, floats on and next to midpoints (scaled), zeros, denormals */
        float *adv = x + (size_t)DIST_COUNT * PER;
        for (int i = 0; i < PER; i++) {
            int k = i % 255;
            double mid = ((double)m[k] + m[k + 1]) / 2;
            float f = (float)mid;
            switch (i / 256) {
            case 0: adv[i] = i == 0 ? 1.0f : m[k]; break;
            case 1: adv[i] = i == 256 ? 1.0f : (i % 2 ? f : nextafterf(f, INFINITY)); break;
            case 2: adv[i] = (i % 2 ? 0.0f : (float)(i % 50) * FLT_TRUE_MIN); break;
            default: adv[i] = i % 2 ? -0.0f : 3.0f * m[k];
            }
            if (!s && adv[i] < 0)
                adv[i] = -adv[i];
        }
        write_floats(in, x, n);
        char *argv_q[] = {"python3", script, "quantize", sign, in, outp, NULL};
        assert_int_equal(fy_refmodel_run(argv_q, 120), 0);
        ref = fy_test_slurp(outp, &len);
        assert_non_null(ref);
        size_t nb = fy_quant8_blocks(n);
        assert_int_equal(len, 4 + n + nb * sizeof(float));
        uint32_t rn;
        memcpy(&rn, ref, 4);
        assert_int_equal(rn, n);
        assert_int_equal(fy_quant8_quantize(x, n, s, codes, absmax), 0);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            if (codes[i] != (uint8_t)ref[4 + i] && bad++ < 5)
                printf("test_quant8: value %zu (%a): code %d, numpy %d\n", i, x[i], codes[i],
                       (uint8_t)ref[4 + i]);
        assert_int_equal(bad, 0);
        assert_memory_equal(ref + 4 + n, absmax, nb * sizeof(float));
        printf("test_quant8: %s map: %zu codes and %zu absmax equal to numpy's bit for bit\n",
               s ? "signed" : "unsigned", n, nb);
        free(ref);
    }
    free(x), free(codes), free(absmax);
    fy_test_rmdir(dir);
    free(dir);
}

int main(void)
{
    in_ci = fy_test_in_ci();
    have_numpy = fy_refmodel_python_has("numpy");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_maps),          cmocka_unit_test(test_random),
        cmocka_unit_test(test_points_and_midpoints), cmocka_unit_test(test_adversarial_blocks),
        cmocka_unit_test(test_refused),       cmocka_unit_test(test_numpy_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
