/* The GPT-2 family on the CPU backend (common/model/arch/gpt2.h): LayerNorm, causal multi-head
 * attention, the GELU MLP, learned positions and the tied LM head, in fp32 with OpenMP, written to
 * be read. The reference that the CUDA backend is checked against. Every function gives
 * bit-identical results whatever the number of OpenMP threads (as cpu_ops.h's do). The family's
 * table for the backend is fy_gpt2_cpu_family (cpu_family.h); it supports swapped internals and
 * the per-op profile.
 *
 * Shapes: B sequences of T tokens, C = n_embd, NH heads, V = vocab. Activations are [B][T][C].
 * Matrices are [out][in]: y = x W^T + b. Parameter layouts are those of the family's tensor table
 * (struct fy_gpt2_block_layout). */
#ifndef FY_GPT2_CPU_H
#define FY_GPT2_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "common/model/actplan.h"
#include "common/model/arch/gpt2.h"
#include "common/model/model.h"
#include "gpu_worker/cpu/cpu_family.h"
#include "gpu_worker/cpu/cpu_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- single operations (exported for the finite-difference tests) ---- */

/* LayerNorm over C with eps 1e-5; mean and rstd [N] are saved for backward. */
void fy_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                              const float *b, int N, int C);
/* dinp overwritten; dw, db accumulated. */
void fy_cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                               const float *w, const float *mean, const float *rstd, int N, int C);
/* Causal multi-head attention. qkv [B][T][3C] (q, k, v, each heads-major within C); out [B][T][C];
 * att [B][NH][T][T] holds the softmax probabilities (saved for backward; zero where masked).
 * positions [B][T] (NULL: t): token t sees tokens t - positions[b][t] .. t of its row, its own
 * document (gpu_worker/backend.h); NULL is plain causal attention. */
void fy_cpu_attention_forward(float *out, float *att, const float *qkv, const int32_t *positions,
                              int B, int T, int C, int NH);
/* dqkv overwritten; positions those of the forward. */
void fy_cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                               const int32_t *positions, int B, int T, int C, int NH);
/* GELU, tanh approximation. */
void fy_cpu_gelu_forward(float *out, const float *inp, size_t n);
/* dinp overwritten. */
void fy_cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);

/* ---- model pieces, one unit at a time (what the gpu worker runs layer by layer) ---- */

/* x[b][t] = wte[tokens[b][t]] + wpe[positions[b][t]] (positions NULL: wpe[t]); embed =
 * [wte V*C | wpe ctx*C]. Tokens must be < V. */
void fy_cpu_embed_forward(const struct fy_model_config *c, const float *embed,
                          const int32_t *tokens, const int32_t *positions, float *x, int B, int T);
/* dembed += gradient of the embedding lookup (wte rows, and the wpe rows of the positions). */
void fy_cpu_embed_backward(const struct fy_model_config *c, const int32_t *tokens,
                           const int32_t *positions, const float *dx, float *dembed, int B, int T);

/* Floats of scratch one block's forward or backward needs. */
size_t fy_cpu_block_scratch(const struct fy_model_config *c, int B, int T);
/* y = x + attn(ln1(x)); y = y + mlp(ln2(y)), the attention over the documents of positions (NULL:
 * causal; see fy_cpu_attention_forward). saved (may be NULL): FY_ACT_KINDS buffers, where the
 * forward copies the swappable internals whose entry is not NULL, in the CPU layout of
 * fy_actplan_sizes_backend (f32; ATTN is the attention output then its probabilities). */
void fy_cpu_block_forward(const struct fy_model_config *c, const float *params,
                          const int32_t *positions, const float *x, float *y, float *scratch,
                          void *const *saved, int B, int T);
/* Seconds each forward op of a block takes (the ops that produce each kind, as the backward
 * recomputes them; CKPT 0), for the activation planner's profile. */
void fy_cpu_block_op_times(const struct fy_model_config *c, const float *params, const float *x,
                           float *scratch, int B, int T, double op_s[FY_ACT_KINDS]);
/* Recomputes the block's internals from its input x (activation checkpointing), except those that
 * saved gives (as the forward wrote them; they are read, not changed), then back-propagates dy:
 * dx and dparams are overwritten (dparams in the block unit's layout). The same bits whatever
 * saved gives. */
void fy_cpu_block_backward(const struct fy_model_config *c, const float *params,
                           const int32_t *positions, const float *x, const float *dy, float *dx,
                           float *dparams, float *scratch, void *const *saved, int B, int T);

/* Floats of scratch the head needs (logits are processed in chunks of rows, never all at once). */
size_t fy_cpu_head_scratch(const struct fy_model_config *c, int B, int T);
/* Final LayerNorm, logits = lnf(x) wte^T, mean cross-entropy over the targets (a target < 0 is
 * ignored; the mean is over the others). Returns the loss. With dx != NULL also back-propagates:
 * dx overwritten, dfinal (final unit's layout) overwritten, and dembed overwritten with the head's
 * share of the wte gradient (its wpe part set to zero); the embedding backward then adds its own. */
float fy_cpu_head_forward_backward(const struct fy_model_config *c, const float *final_params,
                                   const float *embed, const float *x, const int32_t *targets,
                                   float *dx, float *dfinal, float *dembed, float *scratch, int B,
                                   int T);
/* logits [B*T][V] = lnf(x) wte^T (needs fy_cpu_head_scratch floats of scratch). */
void fy_cpu_logits(const struct fy_model_config *c, const float *final_params, const float *embed,
                   const float *x, float *logits, float *scratch, int B, int T);

/* The family's operations for the CPU backend. */
extern const struct fy_cpu_family fy_gpt2_cpu_family;

#ifdef __cplusplus
}
#endif

#endif
