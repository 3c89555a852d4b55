/* Block-wise 8-bit quantization with the dynamic (non-linear) maps of Dettmers et al., "8-bit
 * Optimizers via Block-wise Quantization" (ICLR 2022), as bitsandbytes' AdamW8bit stores its moments:
 * the building block of compact AdamW moment storage (m with the signed map, v with the unsigned one).
 *
 * The maps (256 fp32 values each, sorted ascending, built once at first use):
 *   Dynamic exponent + fraction, 7 exponent levels e = 0..6 with decade scale s_e = 10^(e-6) (the
 *   literals 1e-6, 1e-5, ..., 1). Level e has F_e fraction values: F_e = 2^e (signed) or 2^(e+1)
 *   (unsigned); they are the midpoints of F_e+1 evenly spaced boundaries over [0.1, 1]:
 *       frac_j = 0.1 + 0.9 * (2j + 1) / (2 * F_e),  j = 0..F_e-1   (in double)
 *   and the map holds (float)(frac_j * s_e) (one rounding to fp32, from double), and its negation for
 *   the signed map; then 0 and 1.0. Signed: 2*127 + 2 = 256 values; unsigned: 254 + 2 = 256.
 *   This is bitsandbytes' create_dynamic_map(signed, max_exponent_bits=7, total_bits=8); bitsandbytes
 *   computes the fractions in fp32 through torch.linspace, so its tables may differ from these in
 *   the last bits of some entries (ours are the exact values rounded once).
 *   Signed map:   [0] = -0.99296875 (-(1 - 0.9/128)), [127] = 0, [128] = 5.5e-7, [254] = 0.99296875,
 *                 [255] = 1.0. Symmetric (map[k] = -map[254-k], k = 0..254) except 1.0, which has no
 *                 negative counterpart: -1 is quantized to [0].
 *   Unsigned map: [0] = 0, [1] = 3.25e-7, [254] = 0.996484375 (1 - 0.9/256), [255] = 1.0.
 *
 * Quantization: blocks of FY_QUANT8_BLOCK values (the last may be shorter); absmax of a block =
 * max |x| over it (fp32); each value's y = x / absmax (fp32 division, so |y| <= 1) is given the code
 * of the NEAREST map value, comparing y exactly with the exact midpoints between neighbours (computed
 * in double, where they are exact); a y exactly on a midpoint takes the LOWER index. An all-zero block
 * has absmax 0 and every code is that of 0. -0.0 is treated as 0: it gets the code of 0 and
 * dequantizes to +0.0. NaN or +-Inf anywhere, or (unsigned map) a value < 0, is refused with -EINVAL
 * before anything is written. Dequantization: map[code] * absmax in fp32.
 * Results depend only on the input (one scalar path, no threads, no reassociation). The AdamW
 * kernels (opt_worker/adamw.c) quantize their 8-bit moments with SIMD searches over
 * fy_quant8_midpoints_below that give the same codes, tested against this one. */
#ifndef FY_QUANT8_H
#define FY_QUANT8_H

#include <stddef.h>
#include <stdint.h>

#define FY_QUANT8_BLOCK 256
#define FY_QUANT8_CODES 256

/* The map (256 ascending fp32 values): signed (is_signed != 0, for m) or unsigned (for v). */
const float *fy_quant8_map(int is_signed);
/* Number of blocks for n values: ceil(n / FY_QUANT8_BLOCK), the length of absmax. */
size_t fy_quant8_blocks(size_t n);
/* codes[n], absmax[fy_quant8_blocks(n)] from x[n]; 0, or -EINVAL (nothing written) for NaN, Inf, or a
 * negative value with the unsigned map. */
int fy_quant8_quantize(const float *x, size_t n, int is_signed, uint8_t *codes, float *absmax);
/* out[i] = map[codes[i]] * absmax[i / FY_QUANT8_BLOCK]. */
void fy_quant8_dequantize(const uint8_t *codes, const float *absmax, size_t n, int is_signed,
                          float *out);
/* The code of 0 (what an all-zero block stores, with absmax 0): 127 in the signed map, 0 in the
 * unsigned one. The initial state m = v = 0 of 8-bit AdamW moments is these codes with absmax 0. */
uint8_t fy_quant8_zero_code(int is_signed);

/* For the AdamW kernels, which quantize the moments block by block as they update them. */
/* One block of len values (len <= FY_QUANT8_BLOCK), all finite (and >= 0 for the unsigned map:
 * the caller checks): *absmax and codes[len] as fy_quant8_quantize gives them. */
void fy_quant8_quantize_block(const float *x, size_t len, int is_signed, uint8_t *codes,
                              float *absmax);
/* The 255 midpoints each rounded DOWN to fp32 (the largest float <= the exact midpoint). For a
 * float y, exact midpoint < y if and only if its rounded-down float < y: where the midpoint is a
 * float the two are equal; where it is not, it lies strictly between the rounded-down float f and
 * the next float f+, and a float y is > f exactly when y >= f+ > midpoint. So SIMD code may search
 * these floats with float compares and find the codes of the exact search. */
const float *fy_quant8_midpoints_below(int is_signed);

#endif
