/* The residual add on the GPU, where the matrix product's epilogue does not add it
 * (FUYOU_CUDA_FUSE=0): bf16, one fp32 add, rounded once. Enqueues on `stream`; returns 0, -EINVAL
 * (said) for bad arguments, or -EIO (launch failure, said). */
#ifndef FY_CU_RESIDUAL_H
#define FY_CU_RESIDUAL_H

#include "gpu_worker/cuda/cu_common.h"

/* out = a + b (out may alias a or b). */
int fy_cu_residual_forward(bf16 *out, const bf16 *a, const bf16 *b, size_t n, cudaStream_t stream);

#endif
