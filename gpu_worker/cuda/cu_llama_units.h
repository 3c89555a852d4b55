/* The Llama family's units on the GPU (the semantics of gpu_worker/cpu/llama_cpu.h): the embedding
 * lookup without positions, a decoder block forward and backward (RMSNorm, fused q/k/v product,
 * RoPE, grouped-query flash attention, o_proj with the residual, RMSNorm, fused gate/up product,
 * SwiGLU, down_proj with the residual), and the final RMSNorm with the tied or untied LM head and
 * cross-entropy. bf16 weights and activations, fp32 statistics and accumulation, fp32 weight
 * gradients; every reduction in a fixed order, so reruns are bit-identical.
 *
 * A struct fy_cu_llama holds the device buffers of one batch shape (from the arena) and the rotary
 * cos/sin table, computed on the host as the CPU reference computes it (fy_llama_rope_inv_freq,
 * fy_llama_rope_table) and uploaded once. It borrows the matrix-product handle, the stream and the
 * LM head's scratch of its owner (struct fy_cu_env of cu_family.h: cu_model, which queues the
 * host-interface calls and runs these units through the ops table fy_cu_family_llama). Everything
 * is queued on that stream; nothing synchronises. */
#ifndef FY_CU_LLAMA_UNITS_H
#define FY_CU_LLAMA_UNITS_H

#include "common/model/model.h"
#include "gpu_worker/cuda/cu_arena.h"
#include "gpu_worker/cuda/cu_common.h"
#include "gpu_worker/cuda/cu_family.h"

struct fy_cu_llama;

/* The Llama-like families these units compute, one ops table each (the same units; the registry
 * names differ): Llama, Qwen2 (q/k/v biases), Qwen3 (q/k norms, an explicit head_dim), Mistral and
 * Phi-3 (a sliding window). Every variation of struct fy_llama_fields is computed. */
extern const struct fy_cu_family fy_cu_family_llama;
extern const struct fy_cu_family fy_cu_family_qwen2;
extern const struct fy_cu_family fy_cu_family_qwen3;
extern const struct fy_cu_family fy_cu_family_mistral;
extern const struct fy_cu_family fy_cu_family_phi3;

/* 0 when the CUDA kernels take this config: a model of one of those families whose head size
 * (fy_llama_head_dim) is a multiple of 8, at most 128 (64 and 128 are those of the ~1B Llamas),
 * with n_kv_head dividing n_head; else -EINVAL with a message naming the problem. */
int fy_cu_llama_check(const struct fy_model_config *c);
/* Arena bytes of a unit's own buffers (one set of internals, the backward's gradients, the rotary
 * table, the norms' scratch) for batches of B x T. */
size_t fy_cu_llama_arena_bytes(const struct fy_model_config *c, int B, int T);
/* The unit's buffers from the arena and the rotary table uploaded (synchronously). -EINVAL for a
 * config fy_cu_llama_check refuses, -ENOMEM (nothing taken, not said: the caller knows what it was
 * for) when the arena is too small. */
int fy_cu_llama_new(struct fy_cu_llama **out, struct fy_cu_arena *arena,
                    const struct fy_model_config *c, int B, int T, const struct fy_cu_env *env);
void fy_cu_llama_destroy(struct fy_cu_llama **l);

/* A block's forward internals, kept for its backward (or the unit's own, rewritten by every call):
 * n1 = rmsnorm1(x) [N][C], qkv after RoPE [N][(NH + 2 NKV) hd] (after the q/k bias, then the q/k
 * norms, where the family has them), atty [N][NH hd], h (the residual after attention) [N][C],
 * n2 = rmsnorm2(h) [N][C], gu = gate | up [N][2I], act = silu(gate) up [N][I], all bf16; rstd1,
 * rstd2 [N] f32; attn the flash attention's logsumexp and the backward's scratch. With q/k norms
 * only (else NULL): qkr the q and k heads before their norms [N][(NH + NKV) hd] bf16, qk_rstd
 * [N][NH + NKV] f32. */
struct fy_cu_llama_acts {
    bf16 *n1, *qkv, *atty, *h, *n2, *gu, *act;
    float *rstd1, *rstd2;
    void *attn;
    bf16 *qkr;
    float *qk_rstd;
};
/* Arena bytes of one set for batches of B x T. */
size_t fy_cu_llama_acts_bytes(const struct fy_model_config *c, int B, int T);
/* One set from the arena; -ENOMEM (nothing taken, not logged) when it does not fit. */
int fy_cu_llama_acts_take(const struct fy_cu_llama *l, struct fy_cu_arena *arena,
                          struct fy_cu_llama_acts *a);

/* ---- the units (bf16 weights in the unit layouts of common/model/arch/llama.h; activations
 * [B][T][C] bf16; gradients f32) ---- */

/* x[b][t] = embed[tokens[b][t]] (tokens < V: the caller's to check). */
int fy_cu_llama_embed_forward(struct fy_cu_llama *l, const bf16 *embed, const int32_t *tokens,
                              bf16 *x);
/* dembed += the lookup's gradient (rows in order, no atomics). */
int fy_cu_llama_embed_backward(struct fy_cu_llama *l, const int32_t *tokens, const bf16 *dx,
                               float *dembed);
/* y = block(x). positions: [B][T] int32 on the device (the documents of gpu_worker/backend.h: q
 * and k rotated by positions[b][t], attention within each document), or NULL (positions t). keep:
 * where the internals go (NULL: the unit's own set). */
int fy_cu_llama_block_forward(struct fy_cu_llama *l, const bf16 *params, const int32_t *positions,
                              const bf16 *x, bf16 *y, struct fy_cu_llama_acts *keep);
/* dx (overwritten) and dparams (f32, the block's layout, overwritten) from dy. kept: the set this
 * block's forward filled from the same params and x, whose attention part the backward also uses
 * as scratch (so a set serves one backward); NULL: the forward is recomputed from x into the
 * unit's own set (up to the down product, whose output the backward does not read). The two give
 * bit-identical results. */
int fy_cu_llama_block_backward(struct fy_cu_llama *l, const bf16 *params, const int32_t *positions,
                               const bf16 *x, const bf16 *dy, bf16 *dx, float *dparams,
                               struct fy_cu_llama_acts *kept);
/* The final RMSNorm (norm_w [C]) of x into the unit's own buffer; *xn points at it (valid until
 * the next call). */
int fy_cu_llama_final_norm(struct fy_cu_llama *l, const bf16 *norm_w, const bf16 *x,
                           const bf16 **xn);
/* The head: logits = rmsnorm(x) head_w^T (head_w [V][C]: lm_head, or embed_tokens when tied),
 * losses [N] f32 per row (0 for a target < 0). With dx != NULL also dx (overwritten), dnorm [C]
 * and dhead [V][C] f32 (overwritten), of the mean over `count` targets (0: the targets >= 0
 * given; see fy_cu_head). */
int fy_cu_llama_head(struct fy_cu_llama *l, const bf16 *norm_w, const bf16 *head_w,
                     const bf16 *x, const int32_t *targets, float *losses, bf16 *dx, float *dnorm,
                     float *dhead, uint64_t count);

#endif
