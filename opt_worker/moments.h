/* The compact Adam moments' block codecs (--optim-state bf16 and int8): bf16 widened to f32 and
 * narrowed back (round to nearest even), and 8-bit codes dequantized (map[code] x absmax) and
 * quantized by quant8's rule (opt_worker/quant8.h), in scalar, AVX2 and AVX-512 versions that give
 * the same bits. The AdamW kernels (opt_worker/adamw) widen a block of stored moments into f32,
 * update it with the f32 kernel and narrow it back; the SIMD code search compares y with the
 * midpoints rounded down to float, which is equivalent to the exact comparison (quant8.h). */
#ifndef FY_MOMENTS_H
#define FY_MOMENTS_H

#include <stddef.h>
#include <stdint.h>

struct fy_moments_codec {
    void (*widen_bf16)(const uint16_t *h, float *f, size_t n);
    void (*narrow_bf16)(const float *f, uint16_t *h, size_t n);
    /* out[i] = map[codes[i]] * absmax, one fp32 multiply */
    void (*dequant)(const uint8_t *codes, float absmax, const float *map, float *out, size_t n);
    /* quantizes n <= FY_QUANT8_BLOCK values as fy_quant8_quantize does; returns 0, or 1 if one
     * is not finite (then nothing is written) */
    int (*quant)(const float *x, size_t n, int is_signed, uint8_t *codes, float *absmax);
};

/* The codec of each implementation (the SIMD ones only where the CPU has their instructions). */
extern const struct fy_moments_codec fy_moments_scalar, fy_moments_avx2, fy_moments_avx512;

#endif
