/* Causal multi-head attention on the GPU, the materialising version (GPT-2 blocks with
 * FUYOU_CUDA_ATTENTION=materialised; cu_flash.h is the default). Layouts match
 * gpu_worker/cpu/cpu_gpt2.h: qkv [B][T][3C] with q | k | v, head h at columns h*hs..(h+1)*hs-1 of
 * each; out [B][T][C]. Deterministic (no atomics). */
#ifndef FY_CU_ATTENTION_H
#define FY_CU_ATTENTION_H

#include "gpu_worker/cuda/cu_common.h"
#include "gpu_worker/cuda/cu_matmul.h"

/* Scratch bytes the attention forward + backward need (scores and probabilities [B][NH][T][T]
 * in this first, materialising version, and head-major copies of q, k, v). */
size_t fy_cu_attention_scratch_bytes(int B, int T, int C, int NH);
/* out = softmax(q k^T / sqrt(hs), causal) v; att_probs (inside scratch) is kept for backward.
 * positions ([B][T] int32 on the device; NULL: none): token t attends only to its own document,
 * tokens t - positions[b][t] .. t (the scores of the others are computed, then masked: this
 * version skips nothing). */
int fy_cu_attention_forward(struct fy_cu_lt *lt, bf16 *out, const bf16 *qkv,
                            const int32_t *positions, void *scratch, int B, int T, int C, int NH,
                            cudaStream_t stream);
/* dqkv overwritten; uses what the forward left in scratch (call right after it, same inputs). */
int fy_cu_attention_backward(struct fy_cu_lt *lt, bf16 *dqkv, const bf16 *dout, const bf16 *qkv,
                             void *scratch, int B, int T, int C, int NH, cudaStream_t stream);

#endif
