/* AdamW kernels (scalar, AVX2, AVX-512F) over fp32, bf16 or 8-bit moments, and the gradient sum
 * of squares.
 * Bit-identity across the three rests on: the same float operations in the same order per
 * element (elements are independent, so vector width, peeling and tails don't matter), no FMA
 * (the vector code uses separate mul/add intrinsics and the build uses -ffp-contract=off, which
 * also keeps the compiler from fusing the scalar code), IEEE sqrt and division everywhere, and
 * per-call scalars computed once here in double. Clipping's gradient scale is one float multiply
 * of the loaded gradient, the same in every implementation, and none at all when the call asks for
 * no scaling. The test checks it. */
#include "opt_worker/adamw.h"

#include <errno.h>
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/check.h"
#include "common/dtype.h"
#include "common/log.h"
#include "opt_worker/quant8.h"
#include "opt_worker/threads.h"

#define FY_AVX2 __attribute__((target("avx2")))
#define FY_AVX2_INLINE static inline __attribute__((always_inline, target("avx2")))
#define FY_AVX512 __attribute__((target("avx512f,avx512bw")))
#define FY_AVX512_INLINE static inline __attribute__((always_inline, target("avx512f,avx512bw")))

/* The per-call float scalars, shared by all implementations. */
struct fy_adamw_k {
    float decay; /* 1 - lr*wd */
    float b1, omb1, b2, omb2;
    float step; /* lr / (1 - b1^t) */
    float bc2s; /* sqrt(1 - b2^t) */
    float eps;
    float gscale; /* gradient multiplier (clipping) */
    int scaled;   /* 0: gradients used as they are, gscale ignored */
};

typedef void (*fy_adamw_kernel)(const struct fy_adamw_k *k, const struct fy_adamw_tensor *x,
                                size_t begin, size_t end);

/* b^t by repeated squaring: exact IEEE double multiplies, so the same on every CPU (libm's pow
 * picks an FMA or non-FMA variant at load time). */
static double fy_adamw_powu(double b, uint64_t t)
{
    double r = 1.0;
    while (t != 0) {
        if (t & 1u)
            r *= b;
        b *= b;
        t >>= 1;
    }
    return r;
}

static void fy_adamw_consts(const struct fy_adamw_hparams *hp, uint64_t t, struct fy_adamw_k *k)
{
    double bc1 = 1.0 - fy_adamw_powu((double)hp->beta1, t);
    double bc2 = 1.0 - fy_adamw_powu((double)hp->beta2, t);
    k->decay = (float)(1.0 - (double)hp->lr * (double)hp->weight_decay);
    k->b1 = hp->beta1;
    k->omb1 = (float)(1.0 - (double)hp->beta1);
    k->b2 = hp->beta2;
    k->omb2 = (float)(1.0 - (double)hp->beta2);
    k->step = (float)((double)hp->lr / bc1);
    k->bc2s = (float)sqrt(bc2);
    k->eps = hp->eps;
}

/* The gradient scale, which belongs to the tensor's gradient rather than to the hyperparameters. */
static void fy_adamw_scale(const struct fy_adamw_tensor *x, struct fy_adamw_k *k)
{
    k->gscale = x->grad_scale;
    k->scaled = x->grad_scale != 0.0f && x->grad_scale != 1.0f;
}

/* One element; also the peel and tail of the vector kernels, which is what keeps them identical. */
static inline __attribute__((always_inline)) void
fy_adamw_elem(const struct fy_adamw_k *k, const struct fy_adamw_tensor *x, size_t i, float g)
{
    float *xm = x->m, *xv = x->v;
    float p = x->master[i] * k->decay;
    float m = k->b1 * xm[i] + k->omb1 * g;
    float v = k->b2 * xv[i] + k->omb2 * (g * g);
    float den = sqrtf(v) / k->bc2s + k->eps;
    p = p - (k->step * m) / den;
    x->master[i] = p;
    xm[i] = m;
    xv[i] = v;
    if (x->weight_bf16 != NULL)
        x->weight_bf16[i] = fy_f32_to_bf16(p);
}

static inline __attribute__((always_inline)) float fy_adamw_grad_at(const void *g, int bf16,
                                                                      size_t i)
{
    return bf16 ? fy_bf16_to_f32(((const uint16_t *)g)[i]) : ((const float *)g)[i];
}

/* The gradient element the update uses: the stored one, times the clipping scale when asked. */
static inline __attribute__((always_inline)) float
fy_adamw_grad_use(const struct fy_adamw_k *k, const void *g, int bf16, int scaled, size_t i)
{
    float v = fy_adamw_grad_at(g, bf16, i);
    return scaled ? v * k->gscale : v;
}

static void fy_adamw_k_scalar_f32(const struct fy_adamw_k *k, const struct fy_adamw_tensor *x,
                                  size_t begin, size_t end)
{
    int bf16 = x->grad_dtype == FY_DTYPE_BF16;
    for (size_t i = begin; i < end; i++)
        fy_adamw_elem(k, x, i, fy_adamw_grad_use(k, x->grad, bf16, k->scaled, i));
}

/* Elements to do one by one so that master + begin is aligned to `bytes` (the other arrays
 * usually share its alignment); capped at end - begin. */
static size_t fy_adamw_peel(const float *master, size_t begin, size_t end, size_t bytes)
{
    uintptr_t a = (uintptr_t)(master + begin);
    size_t peel = (a % 4u) ? 0 : ((bytes - a % bytes) % bytes) / 4u;
    return peel < end - begin ? peel : end - begin;
}

/* ---- AVX2 ---- */

struct fy_adamw_k8 {
    __m256 decay, b1, omb1, b2, omb2, step, bc2s, eps, gscale;
};

FY_AVX2_INLINE __m256 fy_adamw_avx2_grad(const void *g, int bf16, size_t i)
{
    if (bf16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)g + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_loadu_ps((const float *)g + i);
}

/* fy_f32_to_bf16 on 8 lanes. */
FY_AVX2_INLINE __m128i fy_adamw_avx2_bf16(__m256 f)
{
    __m256i b = _mm256_castps_si256(f);
    __m256i hi = _mm256_srli_epi32(b, 16);
    /* abs <= 0x7fffffff, so the signed compare is right */
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)),
                                                   lsb), 16);
    __m256i q = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, q, nan);
    /* every lane is < 65536, so the unsigned saturation never triggers */
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

FY_AVX2_INLINE void fy_adamw_avx2_vec(const struct fy_adamw_k8 *c,
                                      const struct fy_adamw_tensor *x, size_t i, int bf16, int out,
                                      int scaled)
{
    __m256 g = fy_adamw_avx2_grad(x->grad, bf16, i);
    if (scaled)
        g = _mm256_mul_ps(g, c->gscale);
    __m256 p = _mm256_mul_ps(_mm256_loadu_ps(x->master + i), c->decay);
    float *xm = x->m, *xv = x->v;
    __m256 m = _mm256_add_ps(_mm256_mul_ps(c->b1, _mm256_loadu_ps(xm + i)),
                             _mm256_mul_ps(c->omb1, g));
    __m256 v = _mm256_add_ps(_mm256_mul_ps(c->b2, _mm256_loadu_ps(xv + i)),
                             _mm256_mul_ps(c->omb2, _mm256_mul_ps(g, g)));
    __m256 den = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), c->bc2s), c->eps);
    p = _mm256_sub_ps(p, _mm256_div_ps(_mm256_mul_ps(c->step, m), den));
    _mm256_storeu_ps(x->master + i, p);
    _mm256_storeu_ps(xm + i, m);
    _mm256_storeu_ps(xv + i, v);
    if (out)
        _mm_storeu_si128((__m128i *)(x->weight_bf16 + i), fy_adamw_avx2_bf16(p));
}

FY_AVX2_INLINE void fy_adamw_avx2_loop(const struct fy_adamw_k *k,
                                       const struct fy_adamw_tensor *x, size_t begin, size_t end,
                                       int bf16, int out, int scaled)
{
    struct fy_adamw_k8 c = {
        _mm256_set1_ps(k->decay), _mm256_set1_ps(k->b1),   _mm256_set1_ps(k->omb1),
        _mm256_set1_ps(k->b2),    _mm256_set1_ps(k->omb2), _mm256_set1_ps(k->step),
        _mm256_set1_ps(k->bc2s),  _mm256_set1_ps(k->eps),  _mm256_set1_ps(k->gscale),
    };
    size_t i = begin, stop = begin + fy_adamw_peel(x->master, begin, end, 32);
    for (; i < stop; i++)
        fy_adamw_elem(k, x, i, fy_adamw_grad_use(k, x->grad, bf16, scaled, i));
    for (; i + 16 <= end; i += 16) {
        fy_adamw_avx2_vec(&c, x, i, bf16, out, scaled);
        fy_adamw_avx2_vec(&c, x, i + 8, bf16, out, scaled);
    }
    for (; i + 8 <= end; i += 8)
        fy_adamw_avx2_vec(&c, x, i, bf16, out, scaled);
    for (; i < end; i++)
        fy_adamw_elem(k, x, i, fy_adamw_grad_use(k, x->grad, bf16, scaled, i));
}

/* One specialised loop per case (gradient dtype, bf16 copy, scaling), so the inner loop has no
 * branches: the case number is bf16 * 4 + out * 2 + scaled. */
#define FY_ADAMW_CASES(loop)                                                                     \
    switch ((x->grad_dtype == FY_DTYPE_BF16) * 4 + (x->weight_bf16 != NULL) * 2 + k->scaled) { \
    case 0: loop(k, x, begin, end, 0, 0, 0); break;                                              \
    case 1: loop(k, x, begin, end, 0, 0, 1); break;                                              \
    case 2: loop(k, x, begin, end, 0, 1, 0); break;                                              \
    case 3: loop(k, x, begin, end, 0, 1, 1); break;                                              \
    case 4: loop(k, x, begin, end, 1, 0, 0); break;                                              \
    case 5: loop(k, x, begin, end, 1, 0, 1); break;                                              \
    case 6: loop(k, x, begin, end, 1, 1, 0); break;                                              \
    default: loop(k, x, begin, end, 1, 1, 1); break;                                             \
    }

FY_AVX2 static void fy_adamw_k_avx2_f32(const struct fy_adamw_k *k,
                                        const struct fy_adamw_tensor *x, size_t begin, size_t end)
{
    FY_ADAMW_CASES(fy_adamw_avx2_loop)
}

/* ---- AVX-512 ---- */

struct fy_adamw_k16 {
    __m512 decay, b1, omb1, b2, omb2, step, bc2s, eps, gscale;
};

FY_AVX512_INLINE __m512 fy_adamw_avx512_grad(const void *g, int bf16, size_t i)
{
    if (bf16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)g + i));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return _mm512_loadu_ps((const float *)g + i);
}

FY_AVX512_INLINE __m256i fy_adamw_avx512_bf16(__m512 f)
{
    __m512i b = _mm512_castps_si512(f);
    __m512i hi = _mm512_srli_epi32(b, 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)),
                                                   lsb), 16);
    r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r); /* lanes < 65536: truncation is exact */
}

FY_AVX512_INLINE void fy_adamw_avx512_vec(const struct fy_adamw_k16 *c,
                                          const struct fy_adamw_tensor *x, size_t i, int bf16,
                                          int out, int scaled)
{
    __m512 g = fy_adamw_avx512_grad(x->grad, bf16, i);
    if (scaled)
        g = _mm512_mul_ps(g, c->gscale);
    __m512 p = _mm512_mul_ps(_mm512_loadu_ps(x->master + i), c->decay);
    float *xm = x->m, *xv = x->v;
    __m512 m = _mm512_add_ps(_mm512_mul_ps(c->b1, _mm512_loadu_ps(xm + i)),
                             _mm512_mul_ps(c->omb1, g));
    __m512 v = _mm512_add_ps(_mm512_mul_ps(c->b2, _mm512_loadu_ps(xv + i)),
                             _mm512_mul_ps(c->omb2, _mm512_mul_ps(g, g)));
    __m512 den = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), c->bc2s), c->eps);
    p = _mm512_sub_ps(p, _mm512_div_ps(_mm512_mul_ps(c->step, m), den));
    _mm512_storeu_ps(x->master + i, p);
    _mm512_storeu_ps(xm + i, m);
    _mm512_storeu_ps(xv + i, v);
    if (out)
        _mm256_storeu_si256((__m256i *)(x->weight_bf16 + i), fy_adamw_avx512_bf16(p));
}

FY_AVX512_INLINE void fy_adamw_avx512_loop(const struct fy_adamw_k *k,
                                           const struct fy_adamw_tensor *x, size_t begin,
                                           size_t end, int bf16, int out, int scaled)
{
    struct fy_adamw_k16 c = {
        _mm512_set1_ps(k->decay), _mm512_set1_ps(k->b1),   _mm512_set1_ps(k->omb1),
        _mm512_set1_ps(k->b2),    _mm512_set1_ps(k->omb2), _mm512_set1_ps(k->step),
        _mm512_set1_ps(k->bc2s),  _mm512_set1_ps(k->eps),  _mm512_set1_ps(k->gscale),
    };
    size_t i = begin, stop = begin + fy_adamw_peel(x->master, begin, end, 64);
    for (; i < stop; i++)
        fy_adamw_elem(k, x, i, fy_adamw_grad_use(k, x->grad, bf16, scaled, i));
    for (; i + 32 <= end; i += 32) {
        fy_adamw_avx512_vec(&c, x, i, bf16, out, scaled);
        fy_adamw_avx512_vec(&c, x, i + 16, bf16, out, scaled);
    }
    for (; i + 16 <= end; i += 16)
        fy_adamw_avx512_vec(&c, x, i, bf16, out, scaled);
    for (; i < end; i++)
        fy_adamw_elem(k, x, i, fy_adamw_grad_use(k, x->grad, bf16, scaled, i));
}

FY_AVX512 static void fy_adamw_k_avx512_f32(const struct fy_adamw_k *k,
                                            const struct fy_adamw_tensor *x, size_t begin,
                                            size_t end)
{
    FY_ADAMW_CASES(fy_adamw_avx512_loop)
}

/* ---- compact moments (bf16, block-wise 8-bit) ----
 * Blocks of FY_QUANT8_BLOCK elements: the stored moments are widened into two fp32 buffers on the
 * stack (they stay in L1), the fp32 kernel of the implementation updates the block with them (so
 * p, the bf16 copy and the new m, v get exactly the fp32 mode's arithmetic), and the new m, v are
 * narrowed back: one pass over memory. Widening is exact (bf16) or one fp32 multiply per element
 * (8-bit), narrowing is integer arithmetic (bf16) or quant8's rule, whose SIMD search compares with
 * the midpoints rounded down to float (equivalent to the exact compare: see quant8.h); so every
 * implementation gives the same bits. */

struct fy_adamw_ops {
    fy_adamw_kernel f32;
    void (*widen_bf16)(const uint16_t *h, float *f, size_t n);
    void (*narrow_bf16)(const float *f, uint16_t *h, size_t n);
    void (*dequant)(const uint8_t *codes, float absmax, const float *map, float *out, size_t n);
    /* quantizes n <= FY_QUANT8_BLOCK values as quant8 does; returns 0, or 1 if one is not
     * finite (then nothing is written) */
    int (*quant)(const float *x, size_t n, int is_signed, uint8_t *codes, float *absmax);
};

static void fy_adamw_widen_scalar(const uint16_t *h, float *f, size_t n)
{
    for (size_t i = 0; i < n; i++)
        f[i] = fy_bf16_to_f32(h[i]);
}

static void fy_adamw_narrow_scalar(const float *f, uint16_t *h, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h[i] = fy_f32_to_bf16(f[i]);
}

static void fy_adamw_dequant_scalar(const uint8_t *codes, float absmax, const float *map,
                                    float *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = map[codes[i]] * absmax;
}

/* quant8's own block quantization (binary search over the exact double midpoints). */
static int fy_adamw_quant_exact(const float *x, size_t n, int is_signed, uint8_t *codes,
                                float *absmax)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 1;
    fy_quant8_quantize_block(x, n, is_signed, codes, absmax);
    return 0;
}

/* Number of midpoints < y, as quant8's nearest_code, on one float (the SIMD tails). */
static inline uint8_t fy_adamw_code_below(const float *mid_below, float y)
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
static float fy_adamw_cols16[2][16][16] __attribute__((aligned(64)));
static pthread_once_t fy_adamw_cols_once = PTHREAD_ONCE_INIT;

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
static uint8_t fy_adamw_bucket_first[2][2][FY_ADAMW_BUCKETS + 3];
static float fy_adamw_mid256[2][256]; /* the midpoints rounded down, [255] = +inf */
static int fy_adamw_buckets_ok;       /* 0: some bucket holds two midpoints (see below) */

static float fy_adamw_float_of(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Bucket b's first and count for y of the given sign, from the exact midpoints. */
static void fy_adamw_bucket_build(const float *map, int negative, int b, int *first, int *count)
{
    uint32_t base = (uint32_t)FY_ADAMW_BUCKET_EXP << 23, width = 1u << (23 - FY_ADAMW_BUCKET_BITS);
    float lo = b == 0 ? 0.0f : fy_adamw_float_of(base + (uint32_t)b * width);
    float hi = fy_adamw_float_of(base + (uint32_t)(b + 1) * width - 1);
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
 * fy_adamw_buckets_ok stays 0 and the scalar and AVX2 paths quantize with quant8's search: the same
 * codes. */
static void fy_adamw_cols_build(void)
{
    int ok = 1;
    for (int s = 0; s < 2; s++) {
        const float *mid = fy_quant8_midpoints_below(s);
        for (int k = 0; k < 256; k++) {
            float t = k < 255 ? mid[k] : INFINITY;
            fy_adamw_cols16[s][k % 16][k / 16] = t;
            fy_adamw_mid256[s][k] = t;
        }
        for (int neg = 0; neg < 2; neg++)
            for (int b = 0; b < FY_ADAMW_BUCKETS; b++) {
                int first, count;
                fy_adamw_bucket_build(fy_quant8_map(s), neg, b, &first, &count);
                fy_adamw_bucket_first[s][neg][b] = (uint8_t)first;
                ok &= count <= 1;
            }
    }
    fy_adamw_buckets_ok = ok;
}

/* The code of one y by the buckets, as the AVX2 path computes it on 8 lanes. */
static inline uint8_t fy_adamw_code_bucket(const uint8_t *first, const float *mid256, float y)
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
static int fy_adamw_quant_scalar(const float *x, size_t n, int is_signed, uint8_t *codes,
                                 float *absmax)
{
    pthread_once(&fy_adamw_cols_once, fy_adamw_cols_build);
    if (!fy_adamw_buckets_ok)
        return fy_adamw_quant_exact(x, n, is_signed, codes, absmax);
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
    const uint8_t *first = fy_adamw_bucket_first[is_signed ? 1 : 0][0];
    const float *mid256 = fy_adamw_mid256[is_signed ? 1 : 0];
    for (size_t i = 0; i < n; i++)
        codes[i] = fy_adamw_code_bucket(first, mid256, x[i] / amax);
    return 0;
}

/* ---- AVX2 ---- */

FY_AVX2 static void fy_adamw_widen_avx2(const uint16_t *h, float *f, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(f + i, fy_adamw_avx2_grad(h, 1, i));
    for (; i < n; i++)
        f[i] = fy_bf16_to_f32(h[i]);
}

FY_AVX2 static void fy_adamw_narrow_avx2(const float *f, uint16_t *h, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i), fy_adamw_avx2_bf16(_mm256_loadu_ps(f + i)));
    for (; i < n; i++)
        h[i] = fy_f32_to_bf16(f[i]);
}

FY_AVX2 static void fy_adamw_dequant_avx2(const uint8_t *codes, float absmax, const float *map,
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
FY_AVX2_INLINE int fy_adamw_absmax_avx2(const float *x, size_t n, float *absmax)
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

/* Codes of 8 values y by the buckets (fy_adamw_bucket_first). */
FY_AVX2_INLINE __m256i fy_adamw_avx2_codes_bucket(const uint8_t *first, const float *mid256,
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

FY_AVX2 static int fy_adamw_quant_avx2(const float *x, size_t n, int is_signed, uint8_t *codes,
                                       float *absmax)
{
    pthread_once(&fy_adamw_cols_once, fy_adamw_cols_build);
    if (!fy_adamw_buckets_ok)
        return fy_adamw_quant_exact(x, n, is_signed, codes, absmax);
    const float *mid_below = fy_quant8_midpoints_below(is_signed);
    uint8_t zero_code = fy_quant8_zero_code(is_signed);
    float amax;
    if (fy_adamw_absmax_avx2(x, n, &amax))
        return 1;
    *absmax = amax;
    if (amax == 0.0f) {
        memset(codes, zero_code, n);
        return 0;
    }
    const uint8_t *first = fy_adamw_bucket_first[is_signed ? 1 : 0][0];
    const float *mid256 = fy_adamw_mid256[is_signed ? 1 : 0];
    const __m256 a = _mm256_set1_ps(amax);
    /* the low byte of each 32-bit lane to the lane's first 4 bytes, then lanes 0 and 4 together */
    const __m256i bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                           -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                           -1, -1);
    const __m256i join = _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 y = _mm256_div_ps(_mm256_loadu_ps(x + i), a);
        __m256i idx = fy_adamw_avx2_codes_bucket(first, mid256, y);
        __m256i b = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(idx, bytes), join);
        _mm_storel_epi64((__m128i *)(codes + i), _mm256_castsi256_si128(b));
    }
    for (; i < n; i++)
        codes[i] = fy_adamw_code_below(mid_below, x[i] / amax);
    return 0;
}

/* ---- AVX-512 ---- */

FY_AVX512 static void fy_adamw_widen_avx512(const uint16_t *h, float *f, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(f + i, fy_adamw_avx512_grad(h, 1, i));
    for (; i < n; i++)
        f[i] = fy_bf16_to_f32(h[i]);
}

FY_AVX512 static void fy_adamw_narrow_avx512(const float *f, uint16_t *h, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(h + i), fy_adamw_avx512_bf16(_mm512_loadu_ps(f + i)));
    for (; i < n; i++)
        h[i] = fy_f32_to_bf16(f[i]);
}

FY_AVX512 static void fy_adamw_dequant_avx512(const uint8_t *codes, float absmax,
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
FY_AVX512_INLINE __m512i fy_adamw_avx512_codes(const __m512 *col, __m512 y)
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

FY_AVX512 static int fy_adamw_quant_avx512(const float *x, size_t n, int is_signed,
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
    pthread_once(&fy_adamw_cols_once, fy_adamw_cols_build);
    __m512 col[16];
    for (int c = 0; c < 16; c++)
        col[c] = _mm512_load_ps(fy_adamw_cols16[is_signed ? 1 : 0][c]);
    const __m512 a = _mm512_set1_ps(amax);
    const float *mid_below = fy_quant8_midpoints_below(is_signed);
    for (i = 0; i + 16 <= n; i += 16) {
        __m512i idx = fy_adamw_avx512_codes(col, _mm512_div_ps(_mm512_loadu_ps(x + i), a));
        _mm_storeu_si128((__m128i *)(codes + i), _mm512_cvtepi32_epi8(idx));
    }
    for (; i < n; i++)
        codes[i] = fy_adamw_code_below(mid_below, x[i] / amax);
    return 0;
}

static const struct fy_adamw_ops fy_adamw_ops_scalar = {
    fy_adamw_k_scalar_f32, fy_adamw_widen_scalar, fy_adamw_narrow_scalar,
    fy_adamw_dequant_scalar, fy_adamw_quant_scalar};
static const struct fy_adamw_ops fy_adamw_ops_avx2 = {
    fy_adamw_k_avx2_f32, fy_adamw_widen_avx2, fy_adamw_narrow_avx2, fy_adamw_dequant_avx2,
    fy_adamw_quant_avx2};
static const struct fy_adamw_ops fy_adamw_ops_avx512 = {
    fy_adamw_k_avx512_f32, fy_adamw_widen_avx512, fy_adamw_narrow_avx512,
    fy_adamw_dequant_avx512, fy_adamw_quant_avx512};

/* The new m or v of one 8-bit block into codes and *absmax, with the NaN rule of adamw.h. */
static void fy_adamw_q8_store(const struct fy_adamw_ops *ops, const float *x, size_t n,
                              int is_signed, uint8_t *codes, float *absmax)
{
    if (ops->quant(x, n, is_signed, codes, absmax) != 0) {
        *absmax = NAN;
        memset(codes, fy_quant8_zero_code(is_signed), n);
    }
}

/* Elements [begin, end) of a tensor with bf16 or 8-bit moments (8-bit: begin on a block boundary,
 * checked by the caller). */
static void fy_adamw_blocked(const struct fy_adamw_ops *ops, const struct fy_adamw_k *k,
                             const struct fy_adamw_tensor *x, size_t begin, size_t end)
{
    float mb[FY_QUANT8_BLOCK] __attribute__((aligned(64)));
    float vb[FY_QUANT8_BLOCK] __attribute__((aligned(64)));
    size_t gsize = x->grad_dtype == FY_DTYPE_BF16 ? 2 : 4;
    int q8 = x->moments == FY_ADAMW_MOMENTS_Q8;
    const float *map_s = q8 ? fy_quant8_map(1) : NULL, *map_u = q8 ? fy_quant8_map(0) : NULL;
    struct fy_adamw_tensor view = *x;
    view.m = mb;
    view.v = vb;
    view.moments = FY_ADAMW_MOMENTS_F32;
    for (size_t b = begin; b < end;) {
        size_t len = end - b < FY_QUANT8_BLOCK ? end - b : FY_QUANT8_BLOCK;
        size_t blk = b / FY_QUANT8_BLOCK;
        if (q8) {
            ops->dequant((const uint8_t *)x->m + b, x->m_absmax[blk], map_s, mb, len);
            ops->dequant((const uint8_t *)x->v + b, x->v_absmax[blk], map_u, vb, len);
        } else {
            ops->widen_bf16((const uint16_t *)x->m + b, mb, len);
            ops->widen_bf16((const uint16_t *)x->v + b, vb, len);
        }
        view.master = x->master + b;
        view.grad = (const char *)x->grad + b * gsize;
        view.weight_bf16 = x->weight_bf16 != NULL ? x->weight_bf16 + b : NULL;
        view.n = len;
        ops->f32(k, &view, 0, len);
        if (q8) {
            fy_adamw_q8_store(ops, mb, len, 1, (uint8_t *)x->m + b, &x->m_absmax[blk]);
            fy_adamw_q8_store(ops, vb, len, 0, (uint8_t *)x->v + b, &x->v_absmax[blk]);
        } else {
            ops->narrow_bf16(mb, (uint16_t *)x->m + b, len);
            ops->narrow_bf16(vb, (uint16_t *)x->v + b, len);
        }
        b += len;
    }
}

/* Elements [begin, end) of x with the implementation ops, whatever its moments. */
static void fy_adamw_run(const struct fy_adamw_ops *ops, const struct fy_adamw_k *k,
                         const struct fy_adamw_tensor *x, size_t begin, size_t end)
{
    if (x->moments == FY_ADAMW_MOMENTS_F32)
        ops->f32(k, x, begin, end);
    else
        fy_adamw_blocked(ops, k, x, begin, end);
}

/* ---- selection ---- */

int fy_adamw_impl_supported(enum fy_adamw_impl impl)
{
    switch (impl) {
    case FY_ADAMW_AUTO:
    case FY_ADAMW_SCALAR:
        return 1;
    case FY_ADAMW_AVX2:
        return __builtin_cpu_supports("avx2") ? 1 : 0;
    case FY_ADAMW_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") ? 1 : 0;
    }
    return 0;
}

enum fy_adamw_impl fy_adamw_best_impl(void)
{
    if (fy_adamw_impl_supported(FY_ADAMW_AVX512))
        return FY_ADAMW_AVX512;
    if (fy_adamw_impl_supported(FY_ADAMW_AVX2))
        return FY_ADAMW_AVX2;
    return FY_ADAMW_SCALAR;
}

const char *fy_adamw_impl_name(enum fy_adamw_impl impl)
{
    switch (impl) {
    case FY_ADAMW_AUTO: return "auto";
    case FY_ADAMW_SCALAR: return "scalar";
    case FY_ADAMW_AVX2: return "avx2";
    case FY_ADAMW_AVX512: return "avx512";
    }
    return "unknown";
}

int fy_adamw_impl_parse(const char *name, enum fy_adamw_impl *out)
{
    static const enum fy_adamw_impl all[] = {FY_ADAMW_AUTO, FY_ADAMW_SCALAR, FY_ADAMW_AVX2,
                                             FY_ADAMW_AVX512};
    for (size_t i = 0; name != NULL && i < sizeof all / sizeof all[0]; i++)
        if (strcasecmp(name, fy_adamw_impl_name(all[i])) == 0) {
            *out = all[i];
            return 0;
        }
    fy_error("adamw: unknown implementation '%s'; use auto, scalar, avx2 or avx512",
             name ? name : "(null)");
    return -EINVAL;
}

static int fy_adamw_kernel_for(enum fy_adamw_impl impl, const struct fy_adamw_ops **out)
{
    if (impl == FY_ADAMW_AUTO)
        impl = fy_adamw_best_impl();
    FY_REQUIRE(impl >= FY_ADAMW_SCALAR && impl <= FY_ADAMW_AVX512, -EINVAL,
               "adamw: unknown implementation %d; use enum fy_adamw_impl", (int)impl);
    FY_REQUIRE(fy_adamw_impl_supported(impl), -EINVAL,
               "adamw: this CPU lacks %s; use --adamw-impl auto (best here: %s)",
               fy_adamw_impl_name(impl), fy_adamw_impl_name(fy_adamw_best_impl()));
    *out = impl == FY_ADAMW_AVX512 ? &fy_adamw_ops_avx512
           : impl == FY_ADAMW_AVX2 ? &fy_adamw_ops_avx2
                                   : &fy_adamw_ops_scalar;
    return 0;
}

int fy_adamw_check_hparams(const struct fy_adamw_hparams *hp, uint64_t t)
{
    FY_REQUIRE(hp != NULL, -EINVAL, "adamw: hparams is NULL");
    FY_REQUIRE(t >= 1, -EINVAL, "adamw: step count t is 0; it starts at 1 for the first update");
    FY_REQUIRE(isfinite(hp->lr) && hp->lr >= 0.0f, -EINVAL,
               "adamw: lr = %g; it must be finite and >= 0", (double)hp->lr);
    FY_REQUIRE(isfinite(hp->beta1) && hp->beta1 >= 0.0f && hp->beta1 < 1.0f, -EINVAL,
               "adamw: beta1 = %g; it must be in [0, 1)", (double)hp->beta1);
    FY_REQUIRE(isfinite(hp->beta2) && hp->beta2 >= 0.0f && hp->beta2 < 1.0f, -EINVAL,
               "adamw: beta2 = %g; it must be in [0, 1)", (double)hp->beta2);
    FY_REQUIRE(isfinite(hp->eps) && hp->eps >= 0.0f, -EINVAL,
               "adamw: eps = %g; it must be finite and >= 0", (double)hp->eps);
    FY_REQUIRE(isfinite(hp->weight_decay) && hp->weight_decay >= 0.0f, -EINVAL,
               "adamw: weight_decay = %g; it must be finite and >= 0", (double)hp->weight_decay);
    return 0;
}

static int fy_adamw_check_tensor(const struct fy_adamw_tensor *x, size_t begin, size_t end)
{
    FY_REQUIRE(x != NULL, -EINVAL, "adamw: tensor is NULL");
    FY_REQUIRE(x->grad_dtype == FY_DTYPE_F32 || x->grad_dtype == FY_DTYPE_BF16, -EINVAL,
               "adamw: gradient dtype %d (%s) unsupported; use FY_DTYPE_F32 or FY_DTYPE_BF16",
               x->grad_dtype, fy_dtype_name(x->grad_dtype));
    FY_REQUIRE(begin <= end && end <= x->n, -EINVAL,
               "adamw: range [%zu, %zu) is not inside the tensor's %zu elements", begin, end, x->n);
    FY_REQUIRE(x->n == 0 || (x->master && x->m && x->v && x->grad), -EINVAL,
               "adamw: master, m, v and grad must all be set for a tensor of %zu elements", x->n);
    FY_REQUIRE(x->moments == FY_ADAMW_MOMENTS_F32 || x->moments == FY_ADAMW_MOMENTS_BF16 ||
                   x->moments == FY_ADAMW_MOMENTS_Q8, -EINVAL,
               "adamw: moments mode %d unknown; use enum fy_adamw_moments", x->moments);
    if (x->moments == FY_ADAMW_MOMENTS_Q8) {
        FY_REQUIRE(x->n == 0 || (x->m_absmax && x->v_absmax), -EINVAL,
                   "adamw: 8-bit moments without m_absmax or v_absmax for a tensor of %zu "
                   "elements", x->n);
        FY_REQUIRE(begin % FY_QUANT8_BLOCK == 0 && (end % FY_QUANT8_BLOCK == 0 || end == x->n),
                   -EINVAL,
                   "adamw: range [%zu, %zu) of a tensor with 8-bit moments (%zu elements) does not "
                   "start on a block of %d elements or end on one or at the end; split updates at "
                   "multiples of FY_QUANT8_BLOCK", begin, end, x->n, FY_QUANT8_BLOCK);
    }
    FY_REQUIRE(isfinite(x->grad_scale) && x->grad_scale >= 0.0f, -EINVAL,
               "adamw: grad_scale = %g; it must be finite and >= 0 (0: no scaling)",
               (double)x->grad_scale);
    return 0;
}

/* What every update does first: the checks (elements [begin, end) of x), the kernel for impl, and
 * the step's constants. */
static int fy_adamw_begin(const struct fy_adamw_hparams *hp, uint64_t t,
                          const struct fy_adamw_tensor *x, size_t begin, size_t end,
                          enum fy_adamw_impl impl, const struct fy_adamw_ops **kern, struct fy_adamw_k *k)
{
    FY_TRY(fy_adamw_check_hparams(hp, t));
    FY_TRY(fy_adamw_check_tensor(x, begin, end));
    FY_TRY(fy_adamw_kernel_for(impl, kern));
    fy_adamw_consts(hp, t, k);
    fy_adamw_scale(x, k);
    return 0;
}

int fy_adamw_update_range(const struct fy_adamw_hparams *hp, uint64_t t,
                          const struct fy_adamw_tensor *x, size_t begin, size_t end,
                          enum fy_adamw_impl impl)
{
    const struct fy_adamw_ops *kern;
    struct fy_adamw_k k;
    FY_TRY(fy_adamw_begin(hp, t, x, begin, end, impl, &kern, &k));
    if (begin < end)
        fy_adamw_run(kern, &k, x, begin, end);
    return 0;
}

/* Threads take chunks of the tensor from a shared counter rather than one fixed share each: a
 * core that another process (the gpu or io worker, the launcher, the kernel's copies) takes for a
 * while then delays only its current chunk, not the whole update. Every element gets the same
 * arithmetic wherever it falls, so the bits do not depend on who ran which chunk. */
struct fy_adamw_job {
    const struct fy_adamw_k *k;
    const struct fy_adamw_tensor *x;
    const struct fy_adamw_ops *kern;
    size_t chunk; /* elements, a multiple of FY_QUANT8_BLOCK (8-bit moments' blocks) */
    atomic_size_t next;
};

/* About 8 chunks per thread, none below 16K elements (per-chunk costs stay negligible). */
static size_t fy_adamw_chunk_size(size_t n, unsigned threads)
{
    size_t want = n / ((size_t)threads * 8);
    if (want < 16384)
        want = 16384;
    return (want + FY_QUANT8_BLOCK - 1) / FY_QUANT8_BLOCK * FY_QUANT8_BLOCK;
}

static int fy_adamw_job_run(void *arg, unsigned index, unsigned count)
{
    struct fy_adamw_job *j = arg;
    size_t n = j->x->n;
    for (;;) {
        size_t c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (c >= (n + j->chunk - 1) / j->chunk)
            return 0;
        size_t b = c * j->chunk, e = n - b < j->chunk ? n : b + j->chunk;
        fy_adamw_run(j->kern, j->k, j->x, b, e);
    }
}

int fy_adamw_update(struct fy_threads *pool, const struct fy_adamw_hparams *hp, uint64_t t,
                    const struct fy_adamw_tensor *x, enum fy_adamw_impl impl)
{
    const struct fy_adamw_ops *kern;
    struct fy_adamw_k k;
    FY_REQUIRE(x != NULL, -EINVAL, "adamw: tensor is NULL");
    FY_TRY(fy_adamw_begin(hp, t, x, 0, x->n, impl, &kern, &k));
    unsigned threads = pool != NULL ? fy_threads_count(pool) : 1;
    struct fy_adamw_job job = {.k = &k, .x = x, .kern = kern,
                               .chunk = fy_adamw_chunk_size(x->n, threads)};
    atomic_init(&job.next, 0);
    if (pool == NULL || x->n == 0)
        return fy_adamw_job_run(&job, 0, 1);
    return fy_threads_run(pool, fy_adamw_job_run, &job);
}

/* The rows variant: threads take runs of rows from the shared counter, each row its own range. */
struct fy_adamw_rows_job {
    const struct fy_adamw_k *k;
    const struct fy_adamw_tensor *x;
    const struct fy_adamw_ops *kern;
    const int32_t *rows;
    size_t nrows, row_len, per_take;
    atomic_size_t next;
};

static int fy_adamw_rows_run(void *arg, unsigned index, unsigned count)
{
    struct fy_adamw_rows_job *j = arg;
    for (;;) {
        size_t first = atomic_fetch_add_explicit(&j->next, j->per_take, memory_order_relaxed);
        if (first >= j->nrows)
            return 0;
        size_t last = j->nrows - first < j->per_take ? j->nrows : first + j->per_take;
        for (size_t i = first; i < last; i++) {
            size_t b = (size_t)j->rows[i] * j->row_len;
            fy_adamw_run(j->kern, j->k, j->x, b, b + j->row_len);
        }
    }
}

int fy_adamw_update_rows(struct fy_threads *pool, const struct fy_adamw_hparams *hp, uint64_t t,
                         const struct fy_adamw_tensor *x, const int32_t *rows, size_t nrows,
                         size_t row_len, enum fy_adamw_impl impl)
{
    const struct fy_adamw_ops *kern;
    struct fy_adamw_k k;
    FY_REQUIRE(x != NULL && (rows != NULL || nrows == 0) && row_len > 0, -EINVAL,
               "adamw: rows update without a tensor, a row list or a row length");
    FY_REQUIRE(x->moments != FY_ADAMW_MOMENTS_Q8 || row_len % FY_QUANT8_BLOCK == 0, -EINVAL,
               "adamw: rows of %zu elements in a tensor with 8-bit moments; a row must be a "
               "multiple of %d elements (the quantization block) to be updated on its own",
               row_len, FY_QUANT8_BLOCK);
    for (size_t i = 0; i < nrows; i++)
        FY_REQUIRE(rows[i] >= 0 && ((size_t)rows[i] + 1) * row_len <= x->n, -EINVAL,
                   "adamw: row %d (of %zu elements) lies outside the tensor's %zu elements",
                   rows[i], row_len, x->n);
    FY_TRY(fy_adamw_begin(hp, t, x, 0, x->n, impl, &kern, &k));
    size_t per_take = (16384 + row_len - 1) / row_len; /* like the chunks above: 16K elements */
    struct fy_adamw_rows_job job = {.k = &k, .x = x, .kern = kern, .rows = rows, .nrows = nrows,
                                    .row_len = row_len, .per_take = per_take};
    atomic_init(&job.next, 0);
    if (pool == NULL || nrows == 0)
        return fy_adamw_rows_run(&job, 0, 1);
    return fy_threads_run(pool, fy_adamw_rows_run, &job);
}

/* ---- sum of squares ---- */

#define FY_SUMSQ_LANES 16

static double fy_adamw_lanes_sum(double *acc)
{
    for (int w = FY_SUMSQ_LANES / 2; w >= 1; w /= 2)
        for (int i = 0; i < w; i++)
            acc[i] = acc[i] + acc[i + w];
    return acc[0];
}

/* Adds elements [i, n) of a chunk (g points at its start) into their lanes acc[j % 16]. */
static void fy_adamw_sumsq_tail(const void *g, int bf16, size_t i, size_t n, double *acc)
{
    for (; i < n; i++) {
        double d = (double)fy_adamw_grad_at(g, bf16, i);
        acc[i % FY_SUMSQ_LANES] += d * d;
    }
}

static double fy_adamw_sumsq_scalar(const void *g, int bf16, size_t n)
{
    double acc[FY_SUMSQ_LANES] = {0};
    fy_adamw_sumsq_tail(g, bf16, 0, n, acc);
    return fy_adamw_lanes_sum(acc);
}

FY_AVX2_INLINE __m256d fy_adamw_avx2_sq(__m128 f)
{
    __m256d d = _mm256_cvtps_pd(f);
    return _mm256_mul_pd(d, d);
}

FY_AVX2 static double fy_adamw_sumsq_avx2(const void *g, int bf16, size_t n)
{
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 lo = fy_adamw_avx2_grad(g, bf16, i), hi = fy_adamw_avx2_grad(g, bf16, i + 8);
        a0 = _mm256_add_pd(a0, fy_adamw_avx2_sq(_mm256_castps256_ps128(lo)));
        a1 = _mm256_add_pd(a1, fy_adamw_avx2_sq(_mm256_extractf128_ps(lo, 1)));
        a2 = _mm256_add_pd(a2, fy_adamw_avx2_sq(_mm256_castps256_ps128(hi)));
        a3 = _mm256_add_pd(a3, fy_adamw_avx2_sq(_mm256_extractf128_ps(hi, 1)));
    }
    double acc[FY_SUMSQ_LANES];
    _mm256_storeu_pd(acc, a0);
    _mm256_storeu_pd(acc + 4, a1);
    _mm256_storeu_pd(acc + 8, a2);
    _mm256_storeu_pd(acc + 12, a3);
    fy_adamw_sumsq_tail(g, bf16, i, n, acc);
    return fy_adamw_lanes_sum(acc);
}

FY_AVX512 static double fy_adamw_sumsq_avx512(const void *g, int bf16, size_t n)
{
    __m512d a0 = _mm512_setzero_pd(), a1 = a0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 f = fy_adamw_avx512_grad(g, bf16, i);
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(f));
        __m512d hi = _mm512_cvtps_pd(
            _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)));
        a0 = _mm512_add_pd(a0, _mm512_mul_pd(lo, lo));
        a1 = _mm512_add_pd(a1, _mm512_mul_pd(hi, hi));
    }
    double acc[FY_SUMSQ_LANES];
    _mm512_storeu_pd(acc, a0);
    _mm512_storeu_pd(acc + 8, a1);
    fy_adamw_sumsq_tail(g, bf16, i, n, acc);
    return fy_adamw_lanes_sum(acc);
}

/* Chunks taken from a shared counter like the update's; each chunk's sum lands in its own slot and
 * the slots are added in order, so the total does not depend on the threads. */
struct fy_adamw_sumsq_job {
    const void *grad;
    int bf16;
    size_t n, chunks;
    double *part;
    double (*chunk)(const void *g, int bf16, size_t n);
    atomic_size_t next;
};

static int fy_adamw_sumsq_run(void *arg, unsigned index, unsigned count)
{
    struct fy_adamw_sumsq_job *j = arg;
    size_t esz = j->bf16 ? 2 : 4;
    for (;;) {
        size_t c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (c >= j->chunks)
            return 0;
        size_t lo = c * FY_ADAMW_SUMSQ_CHUNK;
        size_t len = j->n - lo < FY_ADAMW_SUMSQ_CHUNK ? j->n - lo : FY_ADAMW_SUMSQ_CHUNK;
        j->part[c] = j->chunk((const char *)j->grad + lo * esz, j->bf16, len);
    }
}

int fy_adamw_sumsq(struct fy_threads *pool, const void *grad, int grad_dtype, size_t n,
                   double *out)
{
    return fy_adamw_sumsq_impl(pool, grad, grad_dtype, n, FY_ADAMW_AUTO, out);
}

int fy_adamw_sumsq_impl(struct fy_threads *pool, const void *grad, int grad_dtype, size_t n,
                        enum fy_adamw_impl impl, double *out)
{
    const struct fy_adamw_ops *unused;
    FY_TRY(fy_adamw_kernel_for(impl, &unused));
    if (impl == FY_ADAMW_AUTO)
        impl = fy_adamw_best_impl();
    FY_REQUIRE(out != NULL, -EINVAL, "adamw_sumsq: out is NULL");
    FY_REQUIRE(grad_dtype == FY_DTYPE_F32 || grad_dtype == FY_DTYPE_BF16, -EINVAL,
               "adamw_sumsq: gradient dtype %d (%s) unsupported; use FY_DTYPE_F32 or FY_DTYPE_BF16",
               grad_dtype, fy_dtype_name(grad_dtype));
    FY_REQUIRE(n == 0 || grad != NULL, -EINVAL, "adamw_sumsq: grad is NULL for %zu elements", n);
    *out = 0.0;
    if (n == 0)
        return 0;
    struct fy_adamw_sumsq_job j = {
        .grad = grad,
        .bf16 = grad_dtype == FY_DTYPE_BF16,
        .n = n,
        .chunks = (n + FY_ADAMW_SUMSQ_CHUNK - 1) / FY_ADAMW_SUMSQ_CHUNK,
        .chunk = impl == FY_ADAMW_AVX512 ? fy_adamw_sumsq_avx512
                 : impl == FY_ADAMW_AVX2 ? fy_adamw_sumsq_avx2
                                         : fy_adamw_sumsq_scalar,
    };
    atomic_init(&j.next, 0);
    double one;
    j.part = j.chunks == 1 ? &one : malloc(j.chunks * sizeof *j.part);
    FY_REQUIRE(j.part != NULL, -ENOMEM, "adamw_sumsq: out of memory for %zu partial sums",
               j.chunks);
    int rc = pool == NULL || j.chunks == 1 ? fy_adamw_sumsq_run(&j, 0, 1)
                                           : fy_threads_run(pool, fy_adamw_sumsq_run, &j);
    double s = 0.0;
    for (size_t c = 0; rc == 0 && c < j.chunks; c++)
        s += j.part[c];
    if (j.part != &one)
        free(j.part);
    if (rc == 0)
        *out = s;
    return rc;
}
