/* SwiGLU on the GPU (Llama's MLP activation) over the fused gate | up product: bf16 in and out,
 * fp32 arithmetic. Semantics match gpu_worker/cpu/cpu_llama.h. Both functions enqueue on `stream`
 * and return 0, -EINVAL (said) for bad arguments, or -EIO (launch failure, said). */
#ifndef FY_CU_SWIGLU_H
#define FY_CU_SWIGLU_H

#include "gpu_worker/cuda/cu_common.h"

/* gu [N][2I] (gate | up): out [N][I] = silu(gate) * up; the backward overwrites dgu [N][2I]. */
int fy_cu_swiglu_forward(bf16 *out, const bf16 *gu, int N, int I, cudaStream_t stream);
int fy_cu_swiglu_backward(bf16 *dgu, const bf16 *dout, const bf16 *gu, int N, int I,
                          cudaStream_t stream);

#endif
