/* Rotary position embeddings on the GPU (Llama's q and k), in place on bf16 rows. Semantics match
 * gpu_worker/cpu/cpu_llama.h (fy_cpu_llama_rope_forward, with the table of fy_cpu_llama_rope_table). Both
 * functions enqueue on `stream` and return 0, -EINVAL (said) for bad arguments, or -EIO (launch
 * failure, said). */
#ifndef FY_CU_ROPE_H
#define FY_CU_ROPE_H

#include "gpu_worker/cuda/cu_common.h"

/* In place on NHx heads of hd values at column col of rows of `stride` values, [B][T][stride]:
 * rotate_half RoPE at position t, or positions[b][t] ([B][T] int32 on the device, each in 0..t:
 * a document's own positions; NULL: t), with the table cos_t, sin_t [T][hd/2] f32 on the device;
 * the backward rotates by the opposite angle (the transpose). */
int fy_cu_rope_forward(bf16 *x, int stride, int col, int NHx, int hd, const float *cos_t,
                       const float *sin_t, const int32_t *positions, int B, int T,
                       cudaStream_t stream);
int fy_cu_rope_backward(bf16 *dx, int stride, int col, int NHx, int hd, const float *cos_t,
                        const float *sin_t, const int32_t *positions, int B, int T,
                        cudaStream_t stream);

#endif
