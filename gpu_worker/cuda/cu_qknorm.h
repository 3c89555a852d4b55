/* Per-head RMSNorm of q and k on the GPU (Qwen3's q_norm and k_norm, transformers' Qwen3Attention:
 * after the projections, before RoPE), in place on the fused q/k/v rows of the Llama-like blocks:
 * qkv [N][S] with NH query heads of hd values at column 0, then NKV key heads (then the values,
 * untouched). One weight [hd] for all query heads, one for all key heads. bf16 storage, fp32
 * statistics and arithmetic, fp32 weight gradients summed over rows in a fixed order (no atomics):
 * reruns are bit-identical. Both functions enqueue on `stream` and return 0, -EINVAL (said) for bad
 * arguments, or -EIO (launch failure, said). */
#ifndef FY_CU_QKNORM_H
#define FY_CU_QKNORM_H

#include "gpu_worker/cuda/cu_common.h"

/* Floats of scratch the backward needs for N rows of head size hd. */
size_t fy_cu_qknorm_scratch_floats(int N, int hd);
/* Each of the NH + NKV heads of every row: raw [N][(NH + NKV) hd] <- the head as it was, rstd
 * [N][NH + NKV] <- 1 / sqrt(mean(x^2) + eps), and in place x <- bf16(w * (x rstd)) with w = qw for
 * query heads, kw for key heads. */
int fy_cu_qknorm_forward(bf16 *qkv, bf16 *raw, float *rstd, const bf16 *qw, const bf16 *kw, int N,
                         int S, int NH, int NKV, int hd, float eps, cudaStream_t stream);
/* dqkv's q and k parts hold the gradient of the normalised heads; overwritten in place by that of
 * the raw heads. dqw, dkw [hd] f32 += the weights' gradients (rows, then heads, summed in order). */
int fy_cu_qknorm_backward(bf16 *dqkv, float *dqw, float *dkw, float *scratch, const bf16 *raw,
                          const float *rstd, const bf16 *qw, const bf16 *kw, int N, int S, int NH,
                          int NKV, int hd, cudaStream_t stream);

#endif
