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

#include "common/base/check.h"
#include "common/base/dtype.h"
#include "common/base/log.h"
#include "opt_worker/moments.h"
#include "opt_worker/quant8.h"
#include "opt_worker/simd.h"
#include "opt_worker/threads.h"

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

FY_AVX2_INLINE void fy_adamw_avx2_vec(const struct fy_adamw_k8 *c,
                                      const struct fy_adamw_tensor *x, size_t i, int bf16, int out,
                                      int scaled)
{
    __m256 g = fy_simd_avx2_load(x->grad, bf16, i);
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
        _mm_storeu_si128((__m128i *)(x->weight_bf16 + i), fy_simd_avx2_bf16(p));
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

FY_AVX512_INLINE void fy_adamw_avx512_vec(const struct fy_adamw_k16 *c,
                                          const struct fy_adamw_tensor *x, size_t i, int bf16,
                                          int out, int scaled)
{
    __m512 g = fy_simd_avx512_load(x->grad, bf16, i);
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
        _mm256_storeu_si256((__m256i *)(x->weight_bf16 + i), fy_simd_avx512_bf16(p));
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

/* An implementation: its f32 kernel and its compact moments' codec. */
struct fy_adamw_ops {
    fy_adamw_kernel f32;
    const struct fy_moments_codec *codec;
};

static const struct fy_adamw_ops fy_adamw_ops_scalar = {fy_adamw_k_scalar_f32, &fy_moments_scalar};
static const struct fy_adamw_ops fy_adamw_ops_avx2 = {fy_adamw_k_avx2_f32, &fy_moments_avx2};
static const struct fy_adamw_ops fy_adamw_ops_avx512 = {fy_adamw_k_avx512_f32,
                                                        &fy_moments_avx512};

/* The new m or v of one 8-bit block into codes and *absmax, with the NaN rule of adamw.h. */
static void fy_adamw_q8_store(const struct fy_adamw_ops *ops, const float *x, size_t n,
                              int is_signed, uint8_t *codes, float *absmax)
{
    if (ops->codec->quant(x, n, is_signed, codes, absmax) != 0) {
        *absmax = NAN;
        memset(codes, fy_quant8_zero_code(is_signed), n);
    }
}

/* Elements [begin, end) of a tensor with bf16 or 8-bit moments (8-bit: begin on a block boundary,
 * checked by the caller), block by block: the stored moments widened into two f32 buffers on the
 * stack (they stay in L1), the block updated by the implementation's f32 kernel (so p, its bf16
 * copy and the new m, v get exactly the fp32 mode's arithmetic), the new m, v narrowed back: one
 * pass over memory, and the same bits in every implementation. */
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
            ops->codec->dequant((const uint8_t *)x->m + b, x->m_absmax[blk], map_s, mb, len);
            ops->codec->dequant((const uint8_t *)x->v + b, x->v_absmax[blk], map_u, vb, len);
        } else {
            ops->codec->widen_bf16((const uint16_t *)x->m + b, mb, len);
            ops->codec->widen_bf16((const uint16_t *)x->v + b, vb, len);
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
            ops->codec->narrow_bf16(mb, (uint16_t *)x->m + b, len);
            ops->codec->narrow_bf16(vb, (uint16_t *)x->v + b, len);
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
        __m256 lo = fy_simd_avx2_load(g, bf16, i), hi = fy_simd_avx2_load(g, bf16, i + 8);
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
        __m512 f = fy_simd_avx512_load(g, bf16, i);
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
