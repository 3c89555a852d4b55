/* Flash-style causal multi-head attention (FlashAttention-2 algorithm) on tensor cores (WMMA, bf16
 * operands, fp32 accumulation): the T x T scores are never materialised. Same layouts and results
 * as fy_cu_attention_forward/backward (gpu_worker/cuda/cu_attention.h): qkv [B][T][3C] with
 * q | k | v, head h at columns h*hs..(h+1)*hs-1 of each; out [B][T][C]; scale 1/sqrt(hs); causal.
 * Deterministic: no atomics, every output element is accumulated by one CTA in a fixed order, so
 * reruns are bit-identical. All pointers must be 16-byte aligned. */
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

#endif
