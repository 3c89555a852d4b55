/* CUDA kernels of the GPT block outside the matrix products: LayerNorm forward and backward, GELU
 * (tanh approximation), residual add, embedding lookup and its deterministic backward. bf16
 * activations, fp32 arithmetic and fp32 weight gradients; every reduction in a fixed order, so
 * results are bit-identical from run to run. Semantics match gpu_worker/cpu/gpt_cpu.h. All
 * functions enqueue on `stream` and return 0 or -EIO (launch failure, logged). */
#ifndef FY_CU_NORM_H
#define FY_CU_NORM_H

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
int fy_cu_norm_weight_grads(float *dw, float *db, float *scratch, const bf16 *dout,
                            const bf16 *inp, const float *mean, const float *rstd, int N, int C,
                            cudaStream_t stream);
int fy_cu_gelu_forward(bf16 *out, const bf16 *inp, size_t n, cudaStream_t stream);
/* dinp = gelu'(inp) * dout (overwritten; may alias dout). */
int fy_cu_gelu_backward(bf16 *dinp, const bf16 *inp, const bf16 *dout, size_t n,
                        cudaStream_t stream);
/* out = a + b (out may alias a or b). */
int fy_cu_residual_forward(bf16 *out, const bf16 *a, const bf16 *b, size_t n, cudaStream_t stream);
/* out[b][t] = wte[tokens[b][t]] + wpe[t]; wte [V][C], wpe [>=T][C] bf16. wpe NULL (Llama, no
 * positions): out[b][t] = wte[tokens[b][t]]. */
int fy_cu_embed_forward(bf16 *out, const int32_t *tokens, const bf16 *wte, const bf16 *wpe, int B,
                        int T, int C, cudaStream_t stream);
/* dwte [V][C], dwpe [T][C] f32 += the lookup's gradient, in a fixed order (no atomics); dwpe NULL:
 * no positions. */
int fy_cu_embed_backward(float *dwte, float *dwpe, const bf16 *dout, const int32_t *tokens, int B,
                         int T, int C, int V, cudaStream_t stream);
/* Element type conversion (for the host interface and master weights): f32 <-> bf16 (RNE). */
int fy_cu_f32_to_bf16(bf16 *out, const float *in, size_t n, cudaStream_t stream);
int fy_cu_bf16_to_f32(float *out, const bf16 *in, size_t n, cudaStream_t stream);

#endif
