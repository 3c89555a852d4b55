/* Element type conversion on the GPU, for the host interface and master weights: f32 <-> bf16
 * (round to nearest even). Both functions enqueue on `stream` and return 0, -EINVAL (said) for
 * bad arguments, or -EIO (launch failure, said). */
#ifndef FY_CU_CONVERT_H
#define FY_CU_CONVERT_H

#include "gpu_worker/cuda/cu_common.h"

int fy_cu_f32_to_bf16(bf16 *out, const float *in, size_t n, cudaStream_t stream);
int fy_cu_bf16_to_f32(float *out, const bf16 *in, size_t n, cudaStream_t stream);

#endif
