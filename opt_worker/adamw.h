/* AdamW as torch.optim.AdamW computes it (decoupled weight decay, bias correction) over fp32 master
 * weights and moments stored in fp32, bf16 or block-wise 8-bit, with bf16 or fp32 gradients, in scalar, AVX2 and AVX-512 versions that give
 * bit-identical results, so a run reproduces whichever CPU it lands on. Also the gradient
 * sum of squares for global norm clipping. */
#ifndef FY_ADAMW_H
#define FY_ADAMW_H

#include <stddef.h>
#include <stdint.h>

enum fy_adamw_impl { FY_ADAMW_AUTO = 0, FY_ADAMW_SCALAR, FY_ADAMW_AVX2, FY_ADAMW_AVX512 };

struct fy_adamw_hparams {
    float lr, beta1, beta2, eps, weight_decay;
};

/* How a tensor's Adam moments are stored. */
enum fy_adamw_moments {
    FY_ADAMW_MOMENTS_F32 = 0, /* float m[n], v[n] (the zero-initialised default) */
    FY_ADAMW_MOMENTS_BF16,    /* uint16_t m[n], v[n]: bf16, read as exact f32, written rounded to
                                 nearest even (fy_f32_to_bf16) */
    FY_ADAMW_MOMENTS_Q8,      /* uint8_t m[n]: codes of quant8's signed map; uint8_t v[n]: codes of
                                 the unsigned map; float m_absmax[fy_quant8_blocks(n)], v_absmax[...]:
                                 blocks of FY_QUANT8_BLOCK from element 0 */
};

struct fy_adamw_tensor {
    float *master;
    void *m; /* typed by `moments` */
    void *v;
    float *m_absmax; /* FY_ADAMW_MOMENTS_Q8 only */
    float *v_absmax; /* FY_ADAMW_MOMENTS_Q8 only */
    int moments;     /* enum fy_adamw_moments */
    const void *grad;
    int grad_dtype;        /* FY_DTYPE_F32 or FY_DTYPE_BF16 */
    uint16_t *weight_bf16; /* bf16 copy of the updated master (round to nearest even); may be NULL */
    size_t n;
    /* Gradient clipping: 0 (the zero-initialised default) or 1 uses every gradient as it is, with
     * no multiply (the results are those of an unclipped update, bit for bit); any other value
     * (finite, > 0) multiplies each gradient by it, in float, before the update uses it. */
    float grad_scale;
};

/* Per element, in float, in this order (scalars from the hparams and t computed once per call in
 * double, then rounded to float; b^t by repeated squaring, not libm pow, whose result may depend
 * on the CPU):
 *   g = g * grad_scale                      (only when grad_scale is neither 0 nor 1)
 *   p = p * (1 - lr*wd)
 *   m = b1*m + (1-b1)*g
 *   v = b2*v + (1-b2)*(g*g)
 *   p = p - ((lr/(1-b1^t)) * m) / (sqrt(v)/sqrt(1-b2^t) + eps)
 * This is PyTorch's single-tensor AdamW up to its use of lerp for m.
 *
 * The old m, v are the stored values widened to float (bf16: exactly; Q8: map[code] * absmax of the
 * element's block, one fp32 multiply, as fy_quant8_dequantize). The new p is computed from the new
 * fp32 m, v exactly as with fp32 moments; then the new m, v are stored:
 *   BF16: fy_f32_to_bf16 (round to nearest even).
 *   Q8:   block by block (FY_QUANT8_BLOCK elements from element 0, the last block may be shorter):
 *         absmax = max |m| (max v) over the block's new values, codes by quant8's rule (y = x/absmax
 *         in fp32, nearest map value by exact midpoints, ties to the lower index; absmax 0: the
 *         code of 0), as fy_quant8_quantize. A block whose new m (or v) holds a NaN or an Inf
 *         (a non-finite gradient) stores absmax = NaN for that moment and the code of 0 for all its
 *         elements, so it dequantizes to NaN as fp32 moments would hold NaN; nothing fails. Q8
 *         ranges must start on a block boundary and end on one or at n. */

/* Best implementation this CPU supports (never FY_ADAMW_AUTO). */
enum fy_adamw_impl fy_adamw_best_impl(void);
/* 1 if impl can run here (AUTO and SCALAR always can), else 0. */
int fy_adamw_impl_supported(enum fy_adamw_impl impl);
/* "auto", "scalar", "avx2", "avx512" or "unknown". */
const char *fy_adamw_impl_name(enum fy_adamw_impl impl);
/* Parses a name of fy_adamw_impl_name; -EINVAL (logged) if unknown. */
int fy_adamw_impl_parse(const char *name, enum fy_adamw_impl *out);

/* Checks hparams (finite, lr >= 0, 0 <= beta < 1, eps >= 0, weight_decay >= 0) and t >= 1;
 * 0 or -EINVAL with a log line. */
int fy_adamw_check_hparams(const struct fy_adamw_hparams *hp, uint64_t t);

/* Updates elements [begin, end) of x in place; t is the 1-based step count of this tensor.
 * Returns 0 or -EINVAL (bad dtype, moments mode, range (for Q8 moments: begin not a multiple of
 * FY_QUANT8_BLOCK, or end neither a multiple nor n), NULL buffer, grad_scale not finite or < 0,
 * unsupported impl, bad hparams), logged. */
int fy_adamw_update_range(const struct fy_adamw_hparams *hp, uint64_t t,
                          const struct fy_adamw_tensor *x, size_t begin, size_t end,
                          enum fy_adamw_impl impl);

struct fy_threads;
/* Whole tensor, split across the pool's threads (chunk boundaries multiples of FY_QUANT8_BLOCK
 * elements, in every moments mode), so the result is the same for any pool. pool == NULL: the calling thread alone. */
int fy_adamw_update(struct fy_threads *pool, const struct fy_adamw_hparams *hp, uint64_t t,
                    const struct fy_adamw_tensor *x, enum fy_adamw_impl impl);

/* Rows rows[0..nrows) of x only, row r being elements [r * row_len, (r + 1) * row_len): the same
 * bits for those elements as fy_adamw_update gives, the others untouched (a unit's update done in
 * parts, each part once its gradient is final). -EINVAL (logged) for a row outside x, with Q8
 * moments a row_len that is not a multiple of FY_QUANT8_BLOCK, or the checks of fy_adamw_update. */
int fy_adamw_update_rows(struct fy_threads *pool, const struct fy_adamw_hparams *hp, uint64_t t,
                         const struct fy_adamw_tensor *x, const int32_t *rows, size_t nrows,
                         size_t row_len, enum fy_adamw_impl impl);

/* Elements per sum-of-squares chunk: each chunk is summed in double into 16 lanes (element j of
 * the chunk into lane j % 16), lanes combined pairwise, chunks added in index order. The result
 * therefore depends only on the data, not on the thread count or the SIMD width. */
#define FY_ADAMW_SUMSQ_CHUNK 65536

/* *out = sum over i of grad[i]^2, in double. pool == NULL: the calling thread alone.
 * Returns 0, -EINVAL (bad dtype, NULL pointers) or -ENOMEM, logged. */
int fy_adamw_sumsq(struct fy_threads *pool, const void *grad, int grad_dtype, size_t n,
                   double *out);
/* The same with a chosen implementation (for tests and benchmarks; the result is the same). */
int fy_adamw_sumsq_impl(struct fy_threads *pool, const void *grad, int grad_dtype, size_t n,
                        enum fy_adamw_impl impl, double *out);

#endif
