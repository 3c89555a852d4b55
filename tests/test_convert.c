/* Tests of the opt worker's f32 -> bf16 conversion (opt_worker/convert): every implementation
 * (scalar, AVX2, AVX-512 where this CPU has them), on the calling thread and split over threads,
 * gives fy_f32_to_bf16's bits for every sign and exponent with the low halves that decide the
 * rounding (ties to even, just above and below a tie, the carry into the exponent and to
 * infinity), NaNs quiet or signalling with their payloads, infinities, zeros and denormals, at
 * sizes that leave SIMD tails and at offsets that misalign the buffers; nothing is written past n;
 * bad input is refused. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/base/dtype.h"
#include "opt_worker/adamw.h"
#include "opt_worker/convert.h"
#include "opt_worker/threads.h"
#include "tests/testutil.h"

static const enum fy_adamw_impl impls[] = {FY_ADAMW_SCALAR, FY_ADAMW_AVX2, FY_ADAMW_AVX512,
                                           FY_ADAMW_AUTO};
#define NIMPLS (sizeof impls / sizeof impls[0])

static float from_bits(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* Converts src with impl (on `pool`, may be NULL) into a buffer guarded by a canary past n, and
 * checks every element against fy_f32_to_bf16 and the canary untouched. */
static void check_against_scalar(struct fy_threads *pool, const float *src, size_t n,
                                 enum fy_adamw_impl impl)
{
    uint16_t *dst = malloc((n + 8) * sizeof *dst);
    assert_non_null(dst);
    for (size_t i = 0; i < n + 8; i++)
        dst[i] = 0xbeef;
    assert_int_equal(fy_convert_to_bf16(pool, src, dst, n, impl), 0);
    for (size_t i = 0; i < n; i++)
        if (dst[i] != fy_f32_to_bf16(src[i]))
            fail_msg("%s, %zu elements: element %zu (bits 0x%08x) gave 0x%04x, not 0x%04x",
                     fy_adamw_impl_name(impl), n, i, (unsigned)((const uint32_t *)src)[i],
                     dst[i], fy_f32_to_bf16(src[i]));
    for (size_t i = n; i < n + 8; i++)
        assert_int_equal(dst[i], 0xbeef);
    free(dst);
}

/* Every high half (sign, exponent, the kept mantissa) with each low half that matters to the
 * rounding: 65536 x 12 values, which cover ties, their neighbours, denormals, the largest finite
 * values (which round to infinity), infinities and NaNs of every payload's top bits. */
static void test_awkward_values(void **state)
{
    (void)state;
    static const uint16_t lows[] = {0x0000, 0x0001, 0x0002, 0x3fff, 0x7ffe, 0x7fff,
                                    0x8000, 0x8001, 0xbfff, 0xc000, 0xfffe, 0xffff};
    size_t n = 65536 * (sizeof lows / sizeof lows[0]);
    float *src = malloc(n * sizeof *src);
    assert_non_null(src);
    size_t k = 0;
    for (uint32_t hi = 0; hi < 65536; hi++)
        for (size_t j = 0; j < sizeof lows / sizeof lows[0]; j++)
            src[k++] = from_bits(hi << 16 | lows[j]);
    /* spot checks of the reference itself: a tie to even down and up, a NaN kept quiet, the
     * largest finite float rounding to infinity, a denormal tie */
    assert_int_equal(fy_f32_to_bf16(from_bits(0x3f808000u)), 0x3f80);
    assert_int_equal(fy_f32_to_bf16(from_bits(0x3f818000u)), 0x3f82);
    assert_int_equal(fy_f32_to_bf16(from_bits(0x7f800001u)), 0x7fc0);
    assert_int_equal(fy_f32_to_bf16(from_bits(0x7f7fffffu)), 0x7f80);
    assert_int_equal(fy_f32_to_bf16(from_bits(0x00008000u)), 0x0000);
    struct fy_threads *pool = NULL;
    assert_int_equal(fy_threads_new(&pool, NULL, 3), 0);
    for (size_t i = 0; i < NIMPLS; i++) {
        if (!fy_adamw_impl_supported(impls[i]))
            continue;
        check_against_scalar(NULL, src, n, impls[i]);
        check_against_scalar(pool, src, n, impls[i]);
    }
    fy_threads_destroy(&pool);
    free(src);
}

/* Sizes around the SIMD widths and the threading threshold, from misaligned addresses. */
static void test_sizes_and_offsets(void **state)
{
    (void)state;
    const size_t sizes[] = {1, 7, 8, 9, 15, 16, 17, 31, 33, 1000,
                            2 * FY_CONVERT_MIN_PER_THREAD - 1, 2 * FY_CONVERT_MIN_PER_THREAD + 5};
    size_t most = sizes[sizeof sizes / sizeof sizes[0] - 1] + 3;
    float *buf = malloc(most * sizeof *buf);
    assert_non_null(buf);
    uint64_t seed = 7;
    for (size_t i = 0; i < most; i++) /* any bits: NaNs and denormals among them */
        buf[i] = from_bits((uint32_t)fy_test_rand(&seed));
    struct fy_threads *pool = NULL;
    assert_int_equal(fy_threads_new(&pool, NULL, 4), 0);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (size_t off = 0; off < 3; off++)
            for (size_t i = 0; i < NIMPLS; i++)
                if (fy_adamw_impl_supported(impls[i]))
                    check_against_scalar(off == 1 ? NULL : pool, buf + off, sizes[s], impls[i]);
    fy_threads_destroy(&pool);
    free(buf);
}

static void test_bad_input(void **state)
{
    (void)state;
    float src[4] = {1, 2, 3, 4};
    uint16_t dst[4] = {0};
    assert_int_equal(fy_convert_to_bf16(NULL, NULL, dst, 4, FY_ADAMW_SCALAR), -EINVAL);
    assert_int_equal(fy_convert_to_bf16(NULL, src, NULL, 4, FY_ADAMW_SCALAR), -EINVAL);
    assert_int_equal(fy_convert_to_bf16(NULL, src, dst, 0, FY_ADAMW_SCALAR), 0);
    for (size_t i = 0; i < 4; i++)
        assert_int_equal(dst[i], 0);
    if (!fy_adamw_impl_supported(FY_ADAMW_AVX512))
        assert_int_equal(fy_convert_to_bf16(NULL, src, dst, 4, FY_ADAMW_AVX512), -EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_awkward_values),
        cmocka_unit_test(test_sizes_and_offsets),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests_name("convert", tests, NULL, NULL);
}
