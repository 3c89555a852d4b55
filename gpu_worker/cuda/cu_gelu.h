/* GELU on the GPU (tanh approximation, GPT-2's MLP): bf16 in and out, fp32 arithmetic. Semantics
 * match gpu_worker/cpu/cpu_gpt2.h. Both functions enqueue on `stream` and return 0, -EINVAL (said)
 * for bad arguments, or -EIO (launch failure, said). */
#ifndef FY_CU_GELU_H
#define FY_CU_GELU_H

#include "gpu_worker/cuda/cu_common.h"

int fy_cu_gelu_forward(bf16 *out, const bf16 *inp, size_t n, cudaStream_t stream);
/* dinp = gelu'(inp) * dout (overwritten; may alias dout). */
int fy_cu_gelu_backward(bf16 *dinp, const bf16 *inp, const bf16 *dout, size_t n,
                        cudaStream_t stream);

#endif
