/* Flash-style causal attention (FlashAttention-2 algorithm) on tensor cores (mma.sync, bf16
 * operands, fp32 accumulation): the T x T scores are never materialised. Multi-head (GPT-2): the
 * layouts and results of fy_cu_attention_forward/backward (gpu_worker/cuda/cu_attention.h): qkv
 * [B][T][3C] with q | k | v, head h at columns h*hs..(h+1)*hs-1 of each; out [B][T][C]; scale
 * 1/sqrt(hs); causal. Grouped-query (Llama, the layout of gpu_worker/cpu/cpu_llama.h): qkv
 * [B][T][(NH + 2 NKV) hs] with NH query heads, then NKV key heads, then NKV value heads; query
 * head h reads kv head h / (NH / NKV); out [B][T][NH hs]; the dk and dv of a kv head are the sums
 * over its query heads. Multi-head is grouped-query with NKV = NH, to the same bits.
 * Deterministic: no atomics, every output element is accumulated by one CTA in a fixed order (a kv
 * head's query heads in index order), so reruns are bit-identical. All pointers must be 16-byte
 * aligned. */
#ifndef FY_CU_FLASH_H
#define FY_CU_FLASH_H

#include "gpu_worker/cuda/cu_common.h"

/* 1 when the head size hs = C / NH is a multiple of 8 and at most 128 (it is padded internally
 * with zeros to a multiple of 16 for the WMMA k dimension: hs = 24 -> 32, hs = 80 stays 80). */
int fy_cu_flash_supported(int C, int NH);
/* Scratch bytes: logsumexp L [B][NH][T] f32 (written by the forward, read by the backward) and
 * D [B][NH][T] f32 (backward), each 256-byte aligned. 0 for a bad or unsupported shape. */
size_t fy_cu_flash_scratch_bytes(int B, int T, int C, int NH);
/* out = softmax(q k^T / sqrt(hs), causal) v (overwritten); saves L in scratch for the backward. */
int fy_cu_flash_forward(bf16 *out, const bf16 *qkv, void *scratch, int B, int T, int C, int NH,
                        cudaStream_t stream);
/* dqkv overwritten. out is the forward's output and scratch still holds its L (same inputs). */
int fy_cu_flash_backward(bf16 *dqkv, const bf16 *dout, const bf16 *out, const bf16 *qkv,
                         void *scratch, int B, int T, int C, int NH, cudaStream_t stream);

/* Grouped-query attention. Supported: NKV divides NH, and the head size hs a multiple of 8, at
 * most 128. Scratch: fy_cu_flash_scratch_bytes(B, T, NH * hs, NH) (L and D are per query head). */
int fy_cu_flash_gqa_supported(int NH, int NKV, int hs);
int fy_cu_flash_gqa_forward(bf16 *out, const bf16 *qkv, void *scratch, int B, int T, int NH,
                            int NKV, int hs, cudaStream_t stream);
int fy_cu_flash_gqa_backward(bf16 *dqkv, const bf16 *dout, const bf16 *out, const bf16 *qkv,
                             void *scratch, int B, int T, int NH, int NKV, int hs,
                             cudaStream_t stream);
/* The same with a sliding window, and documents: query t attends to keys t - window < j <= t (a
 * banded causal mask; window <= 0, or window >= T: every earlier key) and, with positions ([B][T]
 * int32 on the device, 4-byte aligned; NULL: none), only to keys j >= t - positions[b][t], the
 * start of its own document (gpu_worker/backend_ops.h). Key blocks that the mask leaves empty for a
 * whole tile are skipped, not computed (a small window, or short documents, cost less). Neither
 * window nor positions: plain causal attention (the kernels above, to the same bits). */
int fy_cu_flash_window_forward(bf16 *out, const bf16 *qkv, void *scratch, int B, int T, int NH,
                               int NKV, int hs, int window, const int32_t *positions,
                               cudaStream_t stream);
int fy_cu_flash_window_backward(bf16 *dqkv, const bf16 *dout, const bf16 *out, const bf16 *qkv,
                                void *scratch, int B, int T, int NH, int NKV, int hs, int window,
                                const int32_t *positions, cudaStream_t stream);

#endif
