/* The GPT units on the GPU: embeddings, a transformer block (forward, and backward either from the
 * internals its forward kept, from those it swapped to host memory plus what the block recomputes
 * around them, or with the block recomputed from its input), and the final LayerNorm with the tied
 * LM head and cross-entropy, over the host buffers of the backend interface (weights and
 * activations f32 or bf16, gradients f32). A unit made for a Llama model (arch FY_ARCH_LLAMA)
 * serves the same host interface with cu_llama's units (gpu_worker/cuda/cu_llama.h: the embedding
 * without positions, the decoder block, the final RMSNorm with the tied or untied head); its
 * blocks' internals are kept or recomputed, never swapped, and not profiled (-ENOTSUP, said), and
 * its ops are not timed one by one. Weights and activations are bf16 on the device with fp32
 * accumulation; weight gradients are fp32. Every device buffer comes from the arena, sized once
 * for the batch. Copies go on their own streams, ordered by events.
 *
 * The host-interface calls (host buffers pinned for full speed) queue their work and return
 * at once: up to FY_CU_GPT_QUEUE calls are in flight, each with its own staging buffers, so the
 * next call's uploads (the next layer's weights) run while the current one computes and its results
 * travel home. An input that a call in flight produces is taken from the device (the activation it
 * hands on) or uploaded once that call's download is done. Each call is completed, in order, by
 * fy_cu_gpt_finish; until then its host buffers must stay untouched and its outputs (the head's
 * loss too) are not yet written. */
#ifndef FY_CU_GPT_H
#define FY_CU_GPT_H

#include "common/model.h"
#include "gpu_worker/backend.h" /* struct fy_block_saved */
#include "gpu_worker/cuda/cu_arena.h"
#include "gpu_worker/cuda/cu_common.h"

struct fy_cu_gpt;

#define FY_CU_GPT_QUEUE 2

#define FY_CU_GPT_MAX_OPS 32
struct fy_cu_gpt_op {
    char name[32];
    float ms; /* summed over every call since timing was switched on */
};

/* Arena bytes the model pieces need for batches of B x T. */
size_t fy_cu_gpt_arena_bytes(const struct fy_model_config *c, int B, int T);
/* -EINVAL (said) for shapes the kernels do not take (n_embd and head size multiples of 8; Llama:
 * fy_cu_llama_check). */
int fy_cu_gpt_new(struct fy_cu_gpt **out, struct fy_cu_arena *arena, const struct fy_model_config *c,
                  int B, int T);
void fy_cu_gpt_destroy(struct fy_cu_gpt **g);

/* Activations (x, y, dx, dy: [B][T][C]) in the host buffers below are f32, or bf16 after
 * fy_cu_gpt_set_host_acts_bf16(g, 1): the device holds them in bf16 either way, so the two give
 * the same bits and bf16 moves half the bytes over PCIe. Gradients stay f32. With calls in
 * flight: -EBUSY (said). */
int fy_cu_gpt_set_host_acts_bf16(struct fy_cu_gpt *g, int on);
/* Weights (embed, params, final_params: a unit's layout of common/model.h) in the host buffers
 * below are f32, or bf16 after fy_cu_gpt_set_host_weights_bf16(g, 1), for the calls made from then
 * on; calls in flight keep the dtype they were made with. The device holds them in bf16 either
 * way, rounded to nearest even from f32 as common/dtype.h's fy_f32_to_bf16 rounds, so bf16 host
 * weights rounded that way give the same bits as their f32 originals, in half the bytes over
 * PCIe. Weight gradients stay f32. */
int fy_cu_gpt_set_host_weights_bf16(struct fy_cu_gpt *g, int on);
int fy_cu_gpt_embed_forward(struct fy_cu_gpt *g, const void *embed, const int32_t *tokens,
                            void *x);
int fy_cu_gpt_embed_backward(struct fy_cu_gpt *g, const int32_t *tokens, const void *dx,
                             float *dembed);
/* layer: the block's index (1..n_layer), which says whether its internals are kept
 * (fy_cu_gpt_keep_layers); 0 for a block that is never kept.
 * saved (may be NULL, or give no kind: the plain call): pinned host buffers for some of the
 * block's internals (struct fy_block_saved of gpu_worker/backend.h: QKV, ATTN, RESID, FC, GELU),
 * which needs fy_cu_gpt_swap_sets first (-EINVAL, said, before it). The forward computes into the
 * call's swap set (a kept block's set is left spent) and downloads each given kind there, bytes as
 * on the device: qkv bf16 [N][3C]; atty bf16 [N][C] then the flash attention's logsumexp
 * [B][NH][T] f32; y1 bf16 [N][C]; fc and g bf16 [N][4C] (fy_actplan_sizes_backend "cuda"). The
 * backward of the same block uploads them (after that forward's downloads, if it is still in
 * flight) and recomputes only the rest from x, with the same bits as recomputing everything; it
 * never writes to them, so a second backward may read them again. ATTN with the materialised
 * attention (FUYOU_CUDA_ATTENTION=materialised): -ENOTSUP, said; another kind: -EINVAL. */
int fy_cu_gpt_block_forward(struct fy_cu_gpt *g, int layer, const void *params, const void *x,
                            void *y, const struct fy_block_saved *saved);
int fy_cu_gpt_block_backward(struct fy_cu_gpt *g, int layer, const void *params, const void *x,
                             const void *dy, void *dx, float *dparams,
                             const struct fy_block_saved *saved);
/* Keeps the forward internals of up to max_layers blocks, the top ones, in sets taken from the
 * arena while they fit (none are taken once one does not); returns how many. Llama: sets of
 * fy_cu_llama_acts_bytes. The forward of a kept
 * block fills its set and the next backward of that block uses it instead of recomputing the
 * block (the same bits); a second backward without a forward in between recomputes. The sets go
 * with the arena memory after the model's working buffers. */
#define FY_CU_GPT_MAX_KEPT 256
int fy_cu_gpt_keep_layers(struct fy_cu_gpt *g, struct fy_cu_arena *arena, int max_layers);
/* Takes one set of internals per staging (FY_CU_GPT_QUEUE sets, fy_cu_gpt_acts_bytes each) from
 * the arena for block calls given saved host buffers: a call computes its block in its staging's
 * set, which is free again once the call is finished. Before fy_cu_gpt_keep_layers and with no
 * call in flight (-EBUSY, said); -ENOMEM (said, nothing taken) when they do not fit; a second
 * call takes nothing and returns 0. A Llama model's unit: -ENOTSUP (said), as for its block calls
 * given saved buffers. */
int fy_cu_gpt_swap_sets(struct fy_cu_gpt *g, struct fy_cu_arena *arena);
/* Measures one block of this batch shape for the activation planner (struct fy_block_profile of
 * gpu_worker/backend.h, all but magic and version), on values of its own, and completes before
 * returning. Times are medians of 3 runs after a warm-up: fwd_s the whole forward; bwd_s the
 * backward from the internals that forward kept; recompute_s[k] the forward op(s) producing kind
 * k, timed op by op in the backward's recompute (QKV: the qkv product; ATTN: the attention; RESID:
 * the attention's projection and its residual add; FC, GELU: the MLP-up product and the GELU, both
 * 0 when fused, since the fused product reruns unless both are kept; others 0); flops_per_s the
 * QKV product's rate. The link: copies of min(host_bytes, the unit's fc [N][4C] bf16) bytes
 * through `host` (pinned) each way on the copy streams, and both ways at once. gpu_free: what the
 * arena has left now; set_bytes: fy_cu_gpt_acts_bytes. Scratch only (the unit's parameters, x, y,
 * dy, dx, own internals and a staging's gradient, all rewritten by any later call before it reads
 * them): kept and swap sets and later calls' results are untouched, and so is the per-op timing
 * table and switch (fy_cu_gpt_set_timing) of a caller profiling too. -EBUSY (said) with calls in
 * flight; -EINVAL (said) for host_bytes under 1 MiB or host memory that is not pinned; -ENOTSUP
 * (said) for a Llama model's unit. */
int fy_cu_gpt_profile(struct fy_cu_gpt *g, struct fy_cu_arena *arena, void *host,
                      size_t host_bytes, struct fy_block_profile *out);
int fy_cu_gpt_head(struct fy_cu_gpt *g, const void *final_params, const void *embed,
                   const void *x, const int32_t *targets, double *loss, void *dx, float *dfinal,
                   float *dembed);

/* Device time of a call's copies: its uploads' summed (without any wait for another call's
 * downloads), and the span of its downloads from when the device-to-host stream reached them. */
struct fy_cu_gpt_copy_times {
    float h2d_ms, d2h_ms;
};
/* Waits for the oldest call in flight and completes it (-EINVAL when none is in flight); times
 * (may be NULL) gets the device time of its copies. */
int fy_cu_gpt_finish(struct fy_cu_gpt *g, struct fy_cu_gpt_copy_times *times);
/* Calls in flight. */
int fy_cu_gpt_pending(const struct fy_cu_gpt *g);
/* Readable (an eventfd) when the oldest call in flight can be finished without waiting. */
int fy_cu_gpt_ready_fd(const struct fy_cu_gpt *g);

/* logits [N][V] f32 (host) = lnf(x) wte^T, computed and copied back in chunks of rows; completes
 * every call in flight first, and itself before returning. */
int fy_cu_gpt_logits(struct fy_cu_gpt *g, const void *final_params, const void *embed,
                     const void *x, float *logits);

/* Device-level units, for drivers that keep weights and activations on the GPU (bf16 weights in the
 * unit layout of common/model.h; activations [B][T][C] bf16; gradients f32, overwritten except where
 * noted). Everything is queued on the compute stream (fy_cu_gpt_stream); nothing synchronises.
 * GPT-2 only: on a Llama model's unit they refuse (-EINVAL, said). */
int fy_cu_gpt_dev_embed_forward(struct fy_cu_gpt *g, const bf16 *wte, const bf16 *wpe,
                                const int32_t *tokens, bf16 *x);
/* dwte, dwpe += the lookup's gradient. */
int fy_cu_gpt_dev_embed_backward(struct fy_cu_gpt *g, const int32_t *tokens, const bf16 *dx,
                                 float *dwte, float *dwpe);
/* A block's forward internals, kept for its backward: activation memory instead of recomputing
 * the block (8/6 of the step's work) when the GPU has room for one set per layer. */
struct fy_cu_gpt_acts {
    bf16 *ln1, *qkv, *atty, *y1, *ln2, *fc, *g;
    float *mean1, *rstd1, *mean2, *rstd2;
    void *attn; /* the attention's saved statistics, and its backward's scratch */
};
/* Arena bytes of one set for batches of B x T (a Llama config's: fy_cu_llama_acts_bytes). */
size_t fy_cu_gpt_acts_bytes(const struct fy_model_config *c, int B, int T);
/* One set from the arena; -ENOMEM (nothing taken, not logged) when it does not fit. */
int fy_cu_gpt_acts_take(struct fy_cu_gpt *g, struct fy_cu_arena *arena, struct fy_cu_gpt_acts *a);
/* keep: where the internals go (NULL: the unit's own scratch, overwritten by the next call). */
int fy_cu_gpt_dev_block_forward(struct fy_cu_gpt *g, const bf16 *params, const bf16 *x, bf16 *y,
                                struct fy_cu_gpt_acts *keep);
/* kept: the set this block's forward filled from the same params and x, used as they are (the
 * attention part is also the backward's scratch); NULL: the forward is recomputed from x. The two
 * give bit-identical results. */
int fy_cu_gpt_dev_block_backward(struct fy_cu_gpt *g, const bf16 *params, const bf16 *x,
                                 const bf16 *dy, bf16 *dx, float *dparams,
                                 struct fy_cu_gpt_acts *kept);
/* losses [N] f32 per row; with dx != NULL also dx, dlnf [2C] and dwte [V][C] (overwritten). */
int fy_cu_gpt_dev_head(struct fy_cu_gpt *g, const bf16 *lnf, const bf16 *wte, const bf16 *x,
                       const int32_t *targets, float *losses, bf16 *dx, float *dlnf, float *dwte);
cudaStream_t fy_cu_gpt_stream(const struct fy_cu_gpt *g);
/* Profiling: with timing on, each op is bracketed by events (serialising the stream) and its time
 * summed by name; fy_cu_gpt_timings returns the table. */
void fy_cu_gpt_set_timing(struct fy_cu_gpt *g, int on);
int fy_cu_gpt_timings(const struct fy_cu_gpt *g, const struct fy_cu_gpt_op **ops);

#endif
