/* LayerNorm on the GPU (GPT-2's norms), and the norms' weight gradients that RMSNorm shares. bf16
 * activations, fp32 arithmetic, fp32 statistics and weight gradients; every reduction in a fixed
 * order, so results are bit-identical from run to run. Semantics match gpu_worker/cpu/cpu_gpt2.h.
 * All functions enqueue on `stream` and return 0, -EINVAL (said) for bad arguments, or -EIO
 * (launch failure, said). */
#ifndef FY_CU_LAYERNORM_H
#define FY_CU_LAYERNORM_H

#include "gpu_worker/cuda/cu_common.h"

/* out [N][C] bf16, mean/rstd [N] f32 (saved for backward); w, b [C] bf16; eps 1e-5. */
int fy_cu_layernorm_forward(bf16 *out, float *mean, float *rstd, const bf16 *inp, const bf16 *w,
                            const bf16 *b, int N, int C, cudaStream_t stream);
/* dinp (bf16) += the input gradient; dw, db (f32 [C]) += the parameter gradients. scratch: f32 of
 * fy_cu_layernorm_backward_scratch(N, C) elements (per-row-block partial sums, reduced in order). */
size_t fy_cu_layernorm_backward_scratch(int N, int C);
int fy_cu_layernorm_backward(bf16 *dinp, float *dw, float *db, float *scratch, const bf16 *dout,
                             const bf16 *inp, const bf16 *w, const float *mean, const float *rstd,
                             int N, int C, cudaStream_t stream);
/* The norm's weight gradients alone: dw[c] += sum over rows n of dout[n][c] (inp[n][c] - mean[n])
 * rstd[n] and db[c] += sum of dout[n][c], in a fixed order through scratch (as above). mean NULL:
 * RMSNorm's (x rstd, nothing subtracted); db NULL: no bias. */
int fy_cu_layernorm_weight_grads(float *dw, float *db, float *scratch, const bf16 *dout,
                                 const bf16 *inp, const float *mean, const float *rstd, int N,
                                 int C, cudaStream_t stream);

#endif
