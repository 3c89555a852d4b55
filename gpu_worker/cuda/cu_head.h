/* The LM head with cross-entropy on the GPU, for every family: logits of normalised rows against a
 * head weight (GPT-2's wte, a Llama's embed_tokens or lm_head), chunk by chunk, with the per-row
 * losses and, for a backward, the gradients. Deterministic (no atomics). */
#ifndef FY_CU_HEAD_H
#define FY_CU_HEAD_H

#include "gpu_worker/cuda/cu_common.h"
#include "gpu_worker/cuda/cu_matmul.h"

/* The LM head tied to wte [V][C] bf16 on normalised inputs xn [N][C] bf16, with mean cross-entropy
 * over targets (< 0 ignored). Logits are computed in chunks of `chunk_rows` rows, never all at once.
 * losses: f32 [N] per-row losses (0 for ignored rows). With dxn != NULL also: dxn [N][C] bf16
 * (overwritten), dwte [V][C] f32 (+=), the gradients of the mean over `count` targets (the whole
 * batch's of several gpu workers) or, with count 0, over the targets >= 0 given. scratch:
 * fy_cu_head_scratch_bytes(chunk_rows, V). */
size_t fy_cu_head_scratch_bytes(int chunk_rows, int V);
int fy_cu_head(struct fy_cu_lt *lt, float *losses, bf16 *dxn, float *dwte, const bf16 *xn,
               const bf16 *wte, const int32_t *targets, uint64_t count, int N, int C, int V,
               int chunk_rows, void *scratch, cudaStream_t stream);

#endif
