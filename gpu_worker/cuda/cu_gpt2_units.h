/* The GPT-2 family's units on the GPU (the semantics of gpu_worker/cpu/gpt2_cpu.h): the embeddings
 * with positions, a transformer block forward and backward (LayerNorm, fused QKV product, flash or
 * materialised attention, projection with the residual, LayerNorm, MLP up with GELU, down with the
 * residual), and the final LayerNorm with the LM head tied to wte and cross-entropy. bf16 weights
 * (the unit layouts of common/model/arch/gpt2.h) and activations [B][T][C], fp32 accumulation and weight
 * gradients. The ops table fy_cu_family_gpt2 serves cu_model, with swapped internals and the
 * planner's profile; the functions below serve tests and benchmarks that keep weights and
 * activations on the GPU. Everything is queued on the stream the units were made with; nothing
 * synchronises.
 *
 * FUYOU_CUDA_ATTENTION=materialised selects the first, materialising attention (cu_attention) and
 * FUYOU_CUDA_FUSE=0 runs GELU and the residual adds as separate kernels, for comparisons; both are
 * read when the units are made (and when their sizes are asked). */
#ifndef FY_CU_GPT2_UNITS_H
#define FY_CU_GPT2_UNITS_H

#include "common/model/model.h"
#include "gpu_worker/cuda/cu_arena.h"
#include "gpu_worker/cuda/cu_common.h"
#include "gpu_worker/cuda/cu_family.h"

extern const struct fy_cu_family fy_cu_family_gpt2;

struct fy_cu_gpt2;

/* A block's forward internals, kept for its backward: activation memory instead of recomputing
 * the block (8/6 of the step's work) when the GPU has room for one set per layer. */
struct fy_cu_gpt2_acts {
    bf16 *ln1, *qkv, *atty, *y1, *ln2, *fc, *g;
    float *mean1, *rstd1, *mean2, *rstd2;
    void *attn; /* the attention's saved statistics, and its backward's scratch */
};
/* Arena bytes of one set for batches of B x T. */
size_t fy_cu_gpt2_acts_bytes(const struct fy_model_config *c, int B, int T);
/* One set from the arena; -ENOMEM (nothing taken, not logged) when it does not fit. */
int fy_cu_gpt2_acts_take(struct fy_cu_gpt2 *u, struct fy_cu_arena *arena,
                         struct fy_cu_gpt2_acts *a);

/* positions: [B][T] int32 on the device (the documents of gpu_worker/backend.h: wpe looked up at
 * positions[b][t], attention within each document), or NULL (positions t). */
int fy_cu_gpt2_embed_forward(struct fy_cu_gpt2 *u, const bf16 *wte, const bf16 *wpe,
                             const int32_t *tokens, const int32_t *positions, bf16 *x);
/* dwte, dwpe += the lookup's gradient. */
int fy_cu_gpt2_embed_backward(struct fy_cu_gpt2 *u, const int32_t *tokens, const int32_t *positions,
                              const bf16 *dx, float *dwte, float *dwpe);
/* keep: where the internals go (NULL: the units' own scratch, overwritten by the next call). */
int fy_cu_gpt2_block_forward(struct fy_cu_gpt2 *u, const bf16 *params, const int32_t *positions,
                             const bf16 *x, bf16 *y, struct fy_cu_gpt2_acts *keep);
/* kept: the set this block's forward filled from the same params, positions and x, used as they
 * are (the attention part is also the backward's scratch); NULL: the forward is recomputed from x.
 * The two give bit-identical results. dx and dparams are overwritten. */
int fy_cu_gpt2_block_backward(struct fy_cu_gpt2 *u, const bf16 *params, const int32_t *positions,
                              const bf16 *x, const bf16 *dy, bf16 *dx, float *dparams,
                              struct fy_cu_gpt2_acts *kept);
/* losses [N] f32 per row; with dx != NULL also dx, dlnf [2C] and dwte [V][C] (overwritten), of the
 * mean over `count` targets (0: the targets >= 0 given; see fy_cu_head). */
int fy_cu_gpt2_head(struct fy_cu_gpt2 *u, const bf16 *lnf, const bf16 *wte, const bf16 *x,
                    const int32_t *targets, float *losses, bf16 *dx, float *dlnf, float *dwte,
                    uint64_t count);

/* Profiling: with timing on, each op is bracketed by events (serialising the stream) and its time
 * summed by name; fy_cu_gpt2_timings returns the table. The units' calls through cu_model are
 * timed too. */
#define FY_CU_GPT2_MAX_OPS 32
struct fy_cu_gpt2_op {
    char name[32];
    float ms; /* summed over every call since timing was switched on */
};
void fy_cu_gpt2_set_timing(struct fy_cu_gpt2 *u, int on);
int fy_cu_gpt2_timings(const struct fy_cu_gpt2 *u, const struct fy_cu_gpt2_op **ops);

#endif
