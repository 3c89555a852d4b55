/* Weights from f32 to bf16 on the opt worker's threads: what the gpu worker is sent for a unit whose
 * weights have no bf16 copy in the pool (its master read from the SSD store chunk by chunk into the
 * landing ring, or kept in the pool), converted into its weights slot before the gpu request that
 * reads it. Round to nearest even, NaN kept quiet: bit for bit common/base/dtype.h's fy_f32_to_bf16,
 * which AdamW writes the kept units' copies with, so the gpu worker gets the same bits either way.
 * Scalar, AVX2 and AVX-512 versions (opt_worker/simd.h), dispatched as AdamW's are. */
#ifndef FY_CONVERT_H
#define FY_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "opt_worker/adamw.h"

/* Elements each thread takes at least: below twice this the calling thread converts alone (a
 * thread's start costs more than converting a few hundred KiB). */
#define FY_CONVERT_MIN_PER_THREAD (1u << 18)

/* dst[i] = fy_f32_to_bf16(src[i]) for i < n, split over the pool's threads (NULL: the calling
 * thread alone) with implementation `impl` (FY_ADAMW_AUTO: the best this CPU has). src and dst must
 * not overlap. 0, or -EINVAL (an implementation this CPU lacks, NULL buffers), logged. */
int fy_convert_to_bf16(struct fy_threads *pool, const float *src, uint16_t *dst, size_t n,
                       enum fy_adamw_impl impl);

/* dst[i] = src[i] for i < n, split over the pool's threads as fy_convert_to_bf16: a unit's f32
 * weights gathered from its pieces' master sections (f32 weights). */
int fy_convert_copy_f32(struct fy_threads *pool, const float *src, float *dst, size_t n);

#endif
