/* RMSNorm on the GPU (Llama's norms): bf16 activations and weights, fp32 arithmetic and statistics,
 * fp32 weight gradients reduced in a fixed order. Semantics match gpu_worker/cpu/cpu_llama.h. Both
 * functions enqueue on `stream` and return 0, -EINVAL (said) for bad arguments, or -EIO (launch
 * failure, said). */
#ifndef FY_CU_RMSNORM_H
#define FY_CU_RMSNORM_H

#include "gpu_worker/cuda/cu_common.h"

/* out = w * (x * rstd) rounded once to bf16, rstd = 1 / sqrt(mean(x^2) + eps) in fp32 (saved). */
int fy_cu_rmsnorm_forward(bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int N, int C,
                          float eps, cudaStream_t stream);
/* dinp (bf16) += the input gradient, dw (f32 [C]) += the weight gradient (rows summed in a fixed
 * order through scratch: fy_cu_layernorm_backward_scratch(N, C) floats of cu_layernorm.h). */
int fy_cu_rmsnorm_backward(bf16 *dinp, float *dw, float *scratch, const bf16 *dout,
                           const bf16 *inp, const bf16 *w, const float *rstd, int N, int C,
                           cudaStream_t stream);

#endif
