/* Causal multi-head attention and the fused LM head with cross-entropy on the GPU. Layouts match
 * gpu_worker/cpu/gpt_cpu.h: qkv [B][T][3C] with q | k | v, head h at columns h*hs..(h+1)*hs-1 of
 * each; out [B][T][C]. Deterministic (no atomics). */
#ifndef FY_CU_ATTENTION_H
#define FY_CU_ATTENTION_H

#include "gpu_worker/cuda/cu_common.h"
#include "gpu_worker/cuda/cu_matmul.h"

/* Scratch bytes the attention forward + backward need (scores and probabilities [B][NH][T][T]
 * in this first, materialising version, and head-major copies of q, k, v). */
size_t fy_cu_attention_scratch_bytes(int B, int T, int C, int NH);
/* out = softmax(q k^T / sqrt(hs), causal) v; att_probs (inside scratch) is kept for backward. */
int fy_cu_attention_forward(struct fy_cu_lt *lt, bf16 *out, const bf16 *qkv, void *scratch, int B,
                            int T, int C, int NH, cudaStream_t stream);
/* dqkv overwritten; uses what the forward left in scratch (call right after it, same inputs). */
int fy_cu_attention_backward(struct fy_cu_lt *lt, bf16 *dqkv, const bf16 *dout, const bf16 *qkv,
                             void *scratch, int B, int T, int C, int NH, cudaStream_t stream);

/* The LM head tied to wte [V][C] bf16 on normalised inputs xn [N][C] bf16, with mean cross-entropy
 * over targets (< 0 ignored). Logits are computed in chunks of `chunk_rows` rows, never all at once.
 * losses: f32 [N] per-row losses (0 for ignored rows). With dxn != NULL also: dxn [N][C] bf16
 * (overwritten), dwte [V][C] f32 (+=). scratch: fy_cu_head_scratch_bytes(chunk_rows, V). */
size_t fy_cu_head_scratch_bytes(int chunk_rows, int V);
int fy_cu_head(struct fy_cu_lt *lt, float *losses, bf16 *dxn, float *dwte, const bf16 *xn,
               const bf16 *wte, const int32_t *targets, int N, int C, int V, int chunk_rows,
               void *scratch, cudaStream_t stream);

#endif
