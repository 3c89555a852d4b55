/* A model on the GPU behind the backend's host interface, for any family: the embeddings, a block
 * (forward, and backward either from the internals its forward kept, from those it swapped to host
 * memory plus what the block recomputes around them, or with the block recomputed from its input),
 * and the final norm with the LM head and cross-entropy, over host buffers (weights and
 * activations f32 or bf16, gradients f32). The device work is the family's units (cu_family.h,
 * chosen by the registry's name); what a family does not support (swapped internals, the planner's
 * profile) is refused naming the family. Weights and activations are bf16 on the device with fp32
 * accumulation; weight gradients are fp32. Every device buffer comes from the arena, sized once for
 * the batch.
 *
 * What the device holds does not grow with a unit beyond what one call's compute needs at once:
 * each call in flight has a bf16 copy of its unit's weights (f32 host weights are converted a
 * chunk at a time on their way up), its activations in bf16, and a block backward's f32 weight
 * gradients go home a piece at a time (a tensor, or a slice of rows of a large one: cu_grads.h)
 * through a ring of GRAD_RING piece buffers while it computes; only the head's gradients and the
 * embeddings' (which the head's computation and the lookup's accumulate into) are held whole, in
 * one buffer.
 *
 * The host-interface calls (host buffers pinned for full speed) queue their work and return at
 * once (cu_queue.h): up to FY_CU_QUEUE calls are in flight, so the next call's uploads run while
 * the current one computes and its results travel home. Each call is completed, in order, by
 * fy_cu_model_finish; until then its host buffers must stay untouched and its outputs (the head's
 * loss too) are not yet written. */
#ifndef FY_CU_MODEL_H
#define FY_CU_MODEL_H

#include "common/model/model.h"
#include "gpu_worker/backend.h" /* struct fy_block_saved, struct fy_block_profile */
#include "gpu_worker/cuda/cu_arena.h"
#include "gpu_worker/cuda/cu_common.h"
#include "gpu_worker/cuda/cu_family.h"
#include "gpu_worker/cuda/cu_queue.h"

struct fy_cu_model;

/* Arena bytes the model needs for batches of B x T (its working buffers and its units'). */
size_t fy_cu_model_arena_bytes(const struct fy_model_config *c, int B, int T);
/* Arena bytes of one set of a block's internals, kept or swap (0: a family without CUDA units). */
size_t fy_cu_model_set_bytes(const struct fy_model_config *c, int B, int T);
/* -EINVAL (said) for a family without CUDA units and for shapes the kernels do not take (n_embd
 * and head size multiples of 8, and the family's own checks); -ENOMEM (said) when the arena cannot
 * hold the buffers. */
int fy_cu_model_new(struct fy_cu_model **out, struct fy_cu_arena *arena,
                    const struct fy_model_config *c, int B, int T);
void fy_cu_model_destroy(struct fy_cu_model **m);

/* Activations (x, y, dx, dy: [B][T][C]) in the host buffers below are f32, or bf16 after
 * fy_cu_model_set_host_acts_bf16(m, 1): the device holds them in bf16 either way, so the two give
 * the same bits and bf16 moves half the bytes over PCIe. Gradients stay f32. With calls in
 * flight: -EBUSY (said). */
int fy_cu_model_set_host_acts_bf16(struct fy_cu_model *m, int on);
/* Weights (embed, params, final_params: a unit's layout of common/model/arch) in the host buffers below
 * are f32, or bf16 after fy_cu_model_set_host_weights_bf16(m, 1), for the calls made from then on;
 * calls in flight keep the dtype they were made with. The device holds them in bf16 either way,
 * rounded to nearest even from f32 as common/base/dtype.h's fy_f32_to_bf16 rounds, so bf16 host weights
 * rounded that way give the same bits as their f32 originals, in half the bytes over PCIe. Weight
 * gradients stay f32. */
int fy_cu_model_set_host_weights_bf16(struct fy_cu_model *m, int on);
/* The head calls made from now on average their loss and its gradients (dx, dfinal, dembed) over
 * `count` targets, the whole batch's of several gpu workers, instead of their own targets >= 0;
 * 0: their own. Calls in flight keep the count they were made with. */
int fy_cu_model_set_loss_count(struct fy_cu_model *m, uint64_t count);
/* A group of gpu workers (cu_ranks.h, the caller's, which must outlive the model or be unset
 * first; NULL: none). From then on every gradient a call computes (a block's dparams, the head's
 * dfinal and dembed, the embeddings' dembed) is summed over the ranks on the device before it is
 * downloaded, and only rank 0 downloads it: the other ranks leave the host gradient buffers
 * untouched (the head does not zero them either), and their embedding backward adds the lookup's
 * gradient to zeros instead of uploading dembed. Every rank must then make the same calls in the
 * same order. With calls in flight: -EBUSY (said); with held gradients (fy_cu_model_hold) and more
 * than one rank: -ENOTSUP (said), as fy_cu_model_hold refuses in such a group. */
struct fy_cu_ranks;
int fy_cu_model_set_ranks(struct fy_cu_model *m, const struct fy_cu_ranks *ranks);
/* positions (host, [B][T], NULL: t): the documents of gpu_worker/backend.h, uploaded with the
 * call's other inputs into its staging (a call keeps its own; the host buffer must stay untouched
 * until the call is finished). A block's backward takes its forward's positions, and a kept set
 * serves a backward of the same positions (the caller's to keep so, as for x). */
int fy_cu_model_embed_forward(struct fy_cu_model *m, const void *embed, const int32_t *tokens,
                              const int32_t *positions, void *x);
int fy_cu_model_embed_backward(struct fy_cu_model *m, const int32_t *tokens,
                               const int32_t *positions, const void *dx, float *dembed);
/* layer: the block's index (1..n_layer), which says whether its internals are kept
 * (fy_cu_model_keep_layers); 0 for a block that is never kept.
 * saved (may be NULL, or give no kind: the plain call): pinned host buffers for some of the
 * block's internals (struct fy_block_saved of gpu_worker/backend.h: QKV, ATTN, RESID, FC, GELU),
 * for a family that swaps them (-ENOTSUP, said, for one that does not), which needs
 * fy_cu_model_swap_sets first (-EINVAL, said, before it). The forward computes into the call's
 * swap set (a kept block's set is left spent) and downloads each given kind there, in the layout
 * of fy_actplan_sizes_backend "cuda" (GPT-2: qkv bf16 [N][3C]; atty bf16 [N][C] then the flash
 * attention's logsumexp [B][NH][T] f32; y1 bf16 [N][C]; fc and g bf16 [N][4C]). The backward of
 * the same block uploads them (after that forward's downloads, if it is still in flight) and
 * recomputes only the rest from x, with the same bits as recomputing everything; it never writes
 * to them, so a second backward may read them again. A kind the family cannot swap as configured
 * (GPT-2: ATTN with FUYOU_CUDA_ATTENTION=materialised): -ENOTSUP, said; a kind never swapped:
 * -EINVAL, said. */
int fy_cu_model_block_forward(struct fy_cu_model *m, int layer, const void *params,
                              const int32_t *positions, const void *x, void *y,
                              const struct fy_block_saved *saved);
int fy_cu_model_block_backward(struct fy_cu_model *m, int layer, const void *params,
                               const int32_t *positions, const void *x, const void *dy, void *dx,
                               float *dparams, const struct fy_block_saved *saved);
/* Keeps the forward internals of up to max_layers blocks, the top ones, in sets taken from the
 * arena while they fit (none are taken once one does not); returns how many. The forward of a kept
 * block fills its set and the next backward of that block uses it instead of recomputing the
 * block (the same bits); a second backward without a forward in between recomputes. The sets go
 * with the arena memory after the model's working buffers. */
#define FY_CU_MODEL_MAX_KEPT 256
int fy_cu_model_keep_layers(struct fy_cu_model *m, struct fy_cu_arena *arena, int max_layers);
/* Takes one set of internals per staging (FY_CU_QUEUE sets, fy_cu_model_set_bytes each) from the
 * arena for block calls given saved host buffers: a call computes its block in its staging's set,
 * which is free again once the call is finished. Before fy_cu_model_keep_layers and with no call
 * in flight (-EBUSY, said); -ENOMEM (said, nothing taken) when they do not fit; a second call takes
 * nothing and returns 0. A family that does not swap: -ENOTSUP (said), as for its block calls
 * given saved buffers. */
int fy_cu_model_swap_sets(struct fy_cu_model *m, struct fy_cu_arena *arena);
/* One-pass clipping's gradients held on the device: fy_cu_model_hold takes `count` buffers of a
 * block's f32 gradient from the arena (before any kept set, with no call in flight: -EBUSY, said;
 * -ENOMEM, said, where they do not fit; -ENOTSUP, said, in a group of more than one rank, whose
 * gradients would be held unsummed). fy_cu_model_hold_next: the next block backward also copies its
 * gradient, piece by piece, into buffer `slot` on the compute stream. fy_cu_model_hold_send is a
 * call like the others (finished by fy_cu_model_finish): buffer `slot` downloaded into the host
 * buffer dparams once every call queued before it has computed. */
int fy_cu_model_hold(struct fy_cu_model *m, struct fy_cu_arena *arena, int count);
int fy_cu_model_hold_next(struct fy_cu_model *m, int slot);
int fy_cu_model_hold_send(struct fy_cu_model *m, int slot, float *dparams);
/* Measures one block of this batch shape for the activation planner (struct fy_block_profile of
 * gpu_worker/backend.h, all but magic and version), on values of its own, and completes before
 * returning. The compute is the family's (GPT-2: medians of 3 runs after a warm-up: fwd_s the whole
 * forward; bwd_s the backward from the internals that forward kept; recompute_s[k] the forward
 * op(s) producing kind k, timed op by op in the backward's recompute; flops_per_s the QKV
 * product's rate). The link: copies of min(host_bytes, the family's largest swapped kind) bytes
 * through `host` (pinned) each way on the copy streams, and both ways at once. gpu_free: what the
 * arena has left now; set_bytes: fy_cu_model_set_bytes. Scratch only (the unit's parameters, x, y,
 * dy, dx, the units' own internals and the gradient pieces' buffers, all rewritten by any later
 * call before it reads them): kept and swap sets and later calls' results are untouched, and so is the
 * family's per-op timing of a caller profiling too. -EBUSY (said) with calls in flight; -EINVAL
 * (said) for host_bytes under 1 MiB or host memory that is not pinned; -ENOTSUP (said) for a
 * family whose blocks are not profiled. */
int fy_cu_model_profile(struct fy_cu_model *m, struct fy_cu_arena *arena, void *host,
                        size_t host_bytes, struct fy_block_profile *out);
/* The final norm and the head on x (head weight: the embeddings' token rows where the head is
 * tied, else the final unit's own); dx == NULL: the loss only. */
int fy_cu_model_head(struct fy_cu_model *m, const void *final_params, const void *embed,
                     const void *x, const int32_t *targets, double *loss, void *dx, float *dfinal,
                     float *dembed);

/* Waits for the oldest call in flight and completes it (-EINVAL when none is in flight); times
 * (may be NULL) gets the device time of its copies. */
int fy_cu_model_finish(struct fy_cu_model *m, struct fy_cu_copy_times *times);
/* Calls in flight. */
int fy_cu_model_pending(const struct fy_cu_model *m);
/* Readable (an eventfd) when the oldest call in flight can be finished without waiting. */
int fy_cu_model_ready_fd(const struct fy_cu_model *m);

/* logits [N][V] f32 (host) = the head's logits of x, computed and copied back in chunks of rows;
 * completes every call in flight first, and itself before returning. */
int fy_cu_model_logits(struct fy_cu_model *m, const void *final_params, const void *embed,
                       const void *x, float *logits);

/* The compute stream, on which the family's units queue their work. */
cudaStream_t fy_cu_model_stream(const struct fy_cu_model *m);
/* The family's units, for tests and benchmarks that drive them on the device (cast to the family's
 * struct: cu_gpt2_units.h, cu_llama_units.h); NULL (said) when the model is of another family. */
void *fy_cu_model_units(const struct fy_cu_model *m, const struct fy_cu_family *family);

#endif
