/* The compact moments' block codecs: bf16 and 8-bit, scalar, AVX2 and AVX-512 (see moments.h). */
#include "opt_worker/moments.h"

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "common/base/dtype.h"
#include "opt_worker/quant8.h"
#include "opt_worker/simd.h"

static void fy_moments_widen_scalar(const uint16_t *h, float *f, size_t n)
{
    for (size_t i = 0; i < n; i++)
        f[i] = fy_bf16_to_f32(h[i]);
}

static void fy_moments_narrow_scalar(const float *f, uint16_t *h, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h[i] = fy_f32_to_bf16(f[i]);
}

static void fy_moments_dequant_scalar(const uint8_t *codes, float absmax, const float *map,
                                    float *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = map[codes[i]] * absmax;
}

/* quant8's own block quantization (binary search over the exact double midpoints). */
static int fy_moments_quant_exact(const float *x, size_t n, int is_signed, uint8_t *codes,
                                float *absmax)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 1;
    fy_quant8_quantize_block(x, n, is_signed, codes, absmax);
    return 0;
}

/* Number of midpoints < y, as quant8's nearest_code, on one float (the SIMD tails). */
static inline uint8_t fy_moments_code_below(const float *mid_below, float y)
{
    unsigned idx = 0;
    for (unsigned step = 128; step != 0; step >>= 1)
        if (mid_below[idx + step - 1] < y)
            idx += step;
    return (uint8_t)idx;
}

/* The midpoints rounded down (quant8.h), padded with T[255] = +inf (never < y), for the SIMD code
 * searches. AVX-512 holds them in registers as a 16 x 16 matrix T[16 row + c], stored by columns:
 * cols16[s][c][row]. */
static float fy_moments_cols16[2][16][16] __attribute__((aligned(64)));
static pthread_once_t fy_moments_cols_once = PTHREAD_ONCE_INIT;

/* The AVX2 search by buckets: |y| in [0, 1] cut by its float bits into FY_ADAMW_BUCKETS ranges,
 * 2^FY_ADAMW_BUCKET_BITS per binade from 2^(FY_ADAMW_BUCKET_EXP - 127) up (everything below in
 * bucket 0), for each sign of y. bucket_first[map][sign][bucket] is the number of midpoints below
 * the bucket's smallest y; when no bucket holds more than one midpoint (checked when the tables are
 * built: the relative spacing of the midpoints, >= 0.9/128, exceeds a bucket's 2^-8), the code of
 * every y in it is first + (mid[first] < y), one lookup and one compare. Bytes, read by 32-bit
 * gathers (hence the 3 bytes of padding) and masked. */
#define FY_ADAMW_BUCKET_BITS 8
#define FY_ADAMW_BUCKET_EXP (127 - 24)
#define FY_ADAMW_BUCKETS (((127 - FY_ADAMW_BUCKET_EXP) << FY_ADAMW_BUCKET_BITS) + 1)
static uint8_t fy_moments_bucket_first[2][2][FY_ADAMW_BUCKETS + 3];
static float fy_moments_mid256[2][256]; /* the midpoints rounded down, [255] = +inf */
static int fy_moments_buckets_ok;       /* 0: some bucket holds two midpoints (see below) */

static float fy_moments_float_of(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Bucket b's first and count for y of the given sign, from the exact midpoints. */
static void fy_moments_bucket_build(const float *map, int negative, int b, int *first, int *count)
{
    uint32_t base = (uint32_t)FY_ADAMW_BUCKET_EXP << 23, width = 1u << (23 - FY_ADAMW_BUCKET_BITS);
    float lo = b == 0 ? 0.0f : fy_moments_float_of(base + (uint32_t)b * width);
    float hi = fy_moments_float_of(base + (uint32_t)(b + 1) * width - 1);
    double ymin = negative ? -(double)hi : (double)lo, ymax = negative ? -(double)lo : (double)hi;
    int below_min = 0, below_max = 0;
    for (int k = 0; k < FY_QUANT8_CODES - 1; k++) {
        double mid = ((double)map[k] + (double)map[k + 1]) / 2.0;
        below_min += mid < ymin;
        below_max += mid < ymax;
    }
    *first = below_min;
    *count = below_max - below_min;
}

/* Builds the tables once. Should a bucket ever hold two midpoints (it cannot with these maps),
 * fy_moments_buckets_ok stays 0 and the scalar and AVX2 paths quantize with quant8's search: the same
 * codes. */
static void fy_moments_cols_build(void)
{
    int ok = 1;
    for (int s = 0; s < 2; s++) {
        const float *mid = fy_quant8_midpoints_below(s);
        for (int k = 0; k < 256; k++) {
            float t = k < 255 ? mid[k] : INFINITY;
            fy_moments_cols16[s][k % 16][k / 16] = t;
            fy_moments_mid256[s][k] = t;
        }
        for (int neg = 0; neg < 2; neg++)
            for (int b = 0; b < FY_ADAMW_BUCKETS; b++) {
                int first, count;
                fy_moments_bucket_build(fy_quant8_map(s), neg, b, &first, &count);
                fy_moments_bucket_first[s][neg][b] = (uint8_t)first;
                ok &= count <= 1;
            }
    }
    fy_moments_buckets_ok = ok;
}

/* The code of one y by the buckets, as the AVX2 path computes it on 8 lanes. */
static inline uint8_t fy_moments_code_bucket(const uint8_t *first, const float *mid256, float y)
{
    uint32_t bits;
    memcpy(&bits, &y, sizeof bits);
    uint32_t mag = bits & 0x7fffffffu, base = (uint32_t)FY_ADAMW_BUCKET_EXP << 23;
    uint32_t b = mag < base ? 0 : (mag - base) >> (23 - FY_ADAMW_BUCKET_BITS);
    if (b > FY_ADAMW_BUCKETS - 1)
        b = FY_ADAMW_BUCKETS - 1;
    if (bits >> 31)
        b += FY_ADAMW_BUCKETS + 3;
    uint8_t idx = first[b];
    return (uint8_t)(idx + (mid256[idx] < y));
}

/* The scalar path: quant8's rule with the codes by the buckets (one compare each, no branchy
 * search); quant8's own search should the buckets be unusable. The tests hold it to quant8's codes
 * and to numpy's. */
static int fy_moments_quant_scalar(const float *x, size_t n, int is_signed, uint8_t *codes,
                                 float *absmax)
{
    pthread_once(&fy_moments_cols_once, fy_moments_cols_build);
    if (!fy_moments_buckets_ok)
        return fy_moments_quant_exact(x, n, is_signed, codes, absmax);
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i]))
            return 1;
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    *absmax = amax;
    if (amax == 0.0f) {
        memset(codes, fy_quant8_zero_code(is_signed), n);
        return 0;
    }
    const uint8_t *first = fy_moments_bucket_first[is_signed ? 1 : 0][0];
    const float *mid256 = fy_moments_mid256[is_signed ? 1 : 0];
    for (size_t i = 0; i < n; i++)
        codes[i] = fy_moments_code_bucket(first, mid256, x[i] / amax);
    return 0;
}

/* ---- AVX2 ---- */

FY_AVX2 static void fy_moments_widen_avx2(const uint16_t *h, float *f, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(f + i, fy_simd_avx2_load(h, 1, i));
    for (; i < n; i++)
        f[i] = fy_bf16_to_f32(h[i]);
}

FY_AVX2 static void fy_moments_narrow_avx2(const float *f, uint16_t *h, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i), fy_simd_avx2_bf16(_mm256_loadu_ps(f + i)));
    for (; i < n; i++)
        h[i] = fy_f32_to_bf16(f[i]);
}

FY_AVX2 static void fy_moments_dequant_avx2(const uint8_t *codes, float absmax, const float *map,
                                          float *out, size_t n)
{
    __m256 a = _mm256_set1_ps(absmax);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + i)));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_i32gather_ps(map, idx, 4), a));
    }
    for (; i < n; i++)
        out[i] = map[codes[i]] * absmax;
}

/* absmax of x[0..n) into *absmax; 1 if a value is NaN or infinite. The max is exact, so its
 * order does not matter. */
FY_AVX2_INLINE int fy_moments_absmax_avx2(const float *x, size_t n, float *absmax)
{
    __m256 amax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    const __m256 mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 big = _mm256_set1_ps(FLT_MAX);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), mask);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, big, _CMP_NLE_UQ));
        amax = _mm256_max_ps(amax, a);
    }
    if (_mm256_movemask_ps(bad) != 0)
        return 1;
    float lanes[8], m = 0.0f;
    _mm256_storeu_ps(lanes, amax);
    for (int l = 0; l < 8; l++)
        m = lanes[l] > m ? lanes[l] : m;
    for (; i < n; i++) {
        if (!isfinite(x[i]))
            return 1;
        float a = fabsf(x[i]);
        m = a > m ? a : m;
    }
    *absmax = m;
    return 0;
}

/* Codes of 8 values y by the buckets (fy_moments_bucket_first). */
FY_AVX2_INLINE __m256i fy_moments_avx2_codes_bucket(const uint8_t *first, const float *mid256,
                                                  __m256 y)
{
    __m256i bits = _mm256_castps_si256(y);
    __m256i mag = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
    __m256i b = _mm256_srli_epi32(
        _mm256_max_epi32(_mm256_sub_epi32(mag, _mm256_set1_epi32(FY_ADAMW_BUCKET_EXP << 23)),
                         _mm256_setzero_si256()),
        23 - FY_ADAMW_BUCKET_BITS);
    b = _mm256_min_epi32(b, _mm256_set1_epi32(FY_ADAMW_BUCKETS - 1));
    /* the negative table follows the positive one */
    b = _mm256_add_epi32(b, _mm256_and_si256(_mm256_srai_epi32(bits, 31),
                                             _mm256_set1_epi32(FY_ADAMW_BUCKETS + 3)));
    __m256i idx = _mm256_and_si256(_mm256_i32gather_epi32((const int *)first, b, 1),
                                   _mm256_set1_epi32(0xff));
    __m256 c = _mm256_i32gather_ps(mid256, idx, 4);
    return _mm256_sub_epi32(idx, _mm256_castps_si256(_mm256_cmp_ps(c, y, _CMP_LT_OQ)));
}

FY_AVX2 static int fy_moments_quant_avx2(const float *x, size_t n, int is_signed, uint8_t *codes,
                                       float *absmax)
{
    pthread_once(&fy_moments_cols_once, fy_moments_cols_build);
    if (!fy_moments_buckets_ok)
        return fy_moments_quant_exact(x, n, is_signed, codes, absmax);
    const float *mid_below = fy_quant8_midpoints_below(is_signed);
    uint8_t zero_code = fy_quant8_zero_code(is_signed);
    float amax;
    if (fy_moments_absmax_avx2(x, n, &amax))
        return 1;
    *absmax = amax;
    if (amax == 0.0f) {
        memset(codes, zero_code, n);
        return 0;
    }
    const uint8_t *first = fy_moments_bucket_first[is_signed ? 1 : 0][0];
    const float *mid256 = fy_moments_mid256[is_signed ? 1 : 0];
    const __m256 a = _mm256_set1_ps(amax);
    /* the low byte of each 32-bit lane to the lane's first 4 bytes, then lanes 0 and 4 together */
    const __m256i bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                           -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                           -1, -1);
    const __m256i join = _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 y = _mm256_div_ps(_mm256_loadu_ps(x + i), a);
        __m256i idx = fy_moments_avx2_codes_bucket(first, mid256, y);
        __m256i b = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(idx, bytes), join);
        _mm_storel_epi64((__m128i *)(codes + i), _mm256_castsi256_si128(b));
    }
    for (; i < n; i++)
        codes[i] = fy_moments_code_below(mid_below, x[i] / amax);
    return 0;
}

/* ---- AVX-512 ---- */

FY_AVX512 static void fy_moments_widen_avx512(const uint16_t *h, float *f, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(f + i, fy_simd_avx512_load(h, 1, i));
    for (; i < n; i++)
        f[i] = fy_bf16_to_f32(h[i]);
}

FY_AVX512 static void fy_moments_narrow_avx512(const float *f, uint16_t *h, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(h + i), fy_simd_avx512_bf16(_mm512_loadu_ps(f + i)));
    for (; i < n; i++)
        h[i] = fy_f32_to_bf16(f[i]);
}

FY_AVX512 static void fy_moments_dequant_avx512(const uint8_t *codes, float absmax,
                                              const float *map, float *out, size_t n)
{
    __m512 a = _mm512_set1_ps(absmax);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + i)));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_i32gather_ps(idx, map, 4), a));
    }
    for (; i < n; i++)
        out[i] = map[codes[i]] * absmax;
}

/* Codes of 16 values y: the number of midpoints < y. First the row: how many of T[16 r + 15],
 * r = 0..14, are < y (a branchless binary search over column 15, whose last entry is +inf), so
 * every entry of the rows before is < y and T[16 row + 15] is not; then the column: the same search
 * over T[16 row + c], c = 0..14, where the entry a step probes in each lane comes from one of a few
 * columns (chosen by the bits of c found so far) looked up at the lane's row. */
FY_AVX512_INLINE __m512i fy_moments_avx512_codes(const __m512 *col, __m512 y)
{
    __m512i row = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int step = 8; step != 0; step >>= 1) {
        __m512 c = _mm512_permutexvar_ps(_mm512_add_epi32(row, _mm512_set1_epi32(step - 1)),
                                         col[15]);
        row = _mm512_mask_add_epi32(row, _mm512_cmp_ps_mask(c, y, _CMP_LT_OQ), row,
                                    _mm512_set1_epi32(step));
    }
    /* c so far: bits 3, 2, 1 of the column found; the probes are column c + step - 1 */
    const __m512i b16 = _mm512_set1_epi32(16);
    /* step 8: column 7 */
    __mmask16 k8 = _mm512_cmp_ps_mask(_mm512_permutexvar_ps(row, col[7]), y, _CMP_LT_OQ);
    /* step 4: column 3 or 11 (bit 3); permutex2var takes the second table where index bit 4 is set */
    __m512i i4 = _mm512_mask_or_epi32(row, k8, row, b16);
    __mmask16 k4 = _mm512_cmp_ps_mask(_mm512_permutex2var_ps(col[3], i4, col[11]), y, _CMP_LT_OQ);
    /* step 2: columns 1, 5 | 9, 13: bit 2 picks within a pair, bit 3 the pair */
    __m512i i2 = _mm512_mask_or_epi32(row, k4, row, b16);
    __m512 p2 = _mm512_mask_blend_ps(k8, _mm512_permutex2var_ps(col[1], i2, col[5]),
                                     _mm512_permutex2var_ps(col[9], i2, col[13]));
    __mmask16 k2 = _mm512_cmp_ps_mask(p2, y, _CMP_LT_OQ);
    /* step 1: columns 0, 2 | 4, 6 | 8, 10 | 12, 14: bit 1 within a pair, bits 2 and 3 the pair */
    __m512i i1 = _mm512_mask_or_epi32(row, k2, row, b16);
    __m512 lo = _mm512_mask_blend_ps(k4, _mm512_permutex2var_ps(col[0], i1, col[2]),
                                     _mm512_permutex2var_ps(col[4], i1, col[6]));
    __m512 hi = _mm512_mask_blend_ps(k4, _mm512_permutex2var_ps(col[8], i1, col[10]),
                                     _mm512_permutex2var_ps(col[12], i1, col[14]));
    __mmask16 k1 = _mm512_cmp_ps_mask(_mm512_mask_blend_ps(k8, lo, hi), y, _CMP_LT_OQ);
    __m512i code = _mm512_slli_epi32(row, 4);
    code = _mm512_mask_add_epi32(code, k8, code, _mm512_set1_epi32(8));
    code = _mm512_mask_add_epi32(code, k4, code, _mm512_set1_epi32(4));
    code = _mm512_mask_add_epi32(code, k2, code, _mm512_set1_epi32(2));
    return _mm512_mask_add_epi32(code, k1, code, _mm512_set1_epi32(1));
}

FY_AVX512 static int fy_moments_quant_avx512(const float *x, size_t n, int is_signed,
                                           uint8_t *codes, float *absmax)
{
    __m512 amaxv = _mm512_setzero_ps();
    const __m512 big = _mm512_set1_ps(FLT_MAX);
    __mmask16 bad = 0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_abs_ps(_mm512_loadu_ps(x + i));
        bad |= _mm512_cmp_ps_mask(v, big, _CMP_NLE_UQ);
        amaxv = _mm512_max_ps(amaxv, v);
    }
    if (bad != 0)
        return 1;
    float amax = _mm512_reduce_max_ps(amaxv); /* exact, so its order does not matter */
    for (; i < n; i++) {
        if (!isfinite(x[i]))
            return 1;
        float v = fabsf(x[i]);
        amax = v > amax ? v : amax;
    }
    *absmax = amax;
    if (amax == 0.0f) {
        memset(codes, fy_quant8_zero_code(is_signed), n);
        return 0;
    }
    pthread_once(&fy_moments_cols_once, fy_moments_cols_build);
    __m512 col[16];
    for (int c = 0; c < 16; c++)
        col[c] = _mm512_load_ps(fy_moments_cols16[is_signed ? 1 : 0][c]);
    const __m512 a = _mm512_set1_ps(amax);
    const float *mid_below = fy_quant8_midpoints_below(is_signed);
    for (i = 0; i + 16 <= n; i += 16) {
        __m512i idx = fy_moments_avx512_codes(col, _mm512_div_ps(_mm512_loadu_ps(x + i), a));
        _mm_storeu_si128((__m128i *)(codes + i), _mm512_cvtepi32_epi8(idx));
    }
    for (; i < n; i++)
        codes[i] = fy_moments_code_below(mid_below, x[i] / amax);
    return 0;
}

const struct fy_moments_codec fy_moments_scalar = {
    fy_moments_widen_scalar, fy_moments_narrow_scalar, fy_moments_dequant_scalar,
    fy_moments_quant_scalar};
const struct fy_moments_codec fy_moments_avx2 = {
    fy_moments_widen_avx2, fy_moments_narrow_avx2, fy_moments_dequant_avx2, fy_moments_quant_avx2};
const struct fy_moments_codec fy_moments_avx512 = {
    fy_moments_widen_avx512, fy_moments_narrow_avx512, fy_moments_dequant_avx512,
    fy_moments_quant_avx512};
