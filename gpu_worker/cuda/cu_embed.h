/* The embedding lookup on the GPU and its deterministic backward: token rows plus positions
 * (GPT-2's wte and wpe) or token rows alone (Llama's embed_tokens). Semantics match
 * gpu_worker/cpu/cpu_gpt2.h. Both functions enqueue on `stream` and return 0, -EINVAL (said) for
 * bad arguments, or -EIO (launch failure, said). */
#ifndef FY_CU_EMBED_H
#define FY_CU_EMBED_H

#include "gpu_worker/cuda/cu_common.h"

/* out[b][t] = wte[tokens[b][t]] + wpe[t]; wte [V][C], wpe [>=T][C] bf16. positions ([B][T] int32
 * on the device, each in 0..t; NULL: t): wpe[positions[b][t]] instead, the token's place in its
 * document. wpe NULL (no learned positions): out[b][t] = wte[tokens[b][t]]. */
int fy_cu_embed_forward(bf16 *out, const int32_t *tokens, const bf16 *wte, const bf16 *wpe,
                        const int32_t *positions, int B, int T, int C, cudaStream_t stream);
/* dwte [V][C], dwpe [T][C] f32 += the lookup's gradient, in a fixed order (no atomics); dwpe NULL:
 * no positions; positions as the forward's. */
int fy_cu_embed_backward(float *dwte, float *dwpe, const bf16 *dout, const int32_t *tokens,
                         const int32_t *positions, int B, int T, int C, int V, cudaStream_t stream);

#endif
