/* The CUDA backend's model families: the ops table through which cu_model (the host interface's
 * queue, which names no family) runs one family's device units, and the one list of them
 * (cu_family.cu), looked up by the registry's name (common/model/arch/arch.h). A family's units compute
 * on device buffers: bf16 weights in the unit layouts of common/model/arch, activations [B][T][C] bf16,
 * fp32 weight gradients; everything is queued on the stream they were made with and nothing
 * synchronises. What a family does not support (swapped internals, the planner's profile) it
 * leaves NULL, and cu_model refuses it naming the family. Adding a family: its units file
 * (cu_<name>_units.cu, one ops table) and one line in cu_family.cu. */
#ifndef FY_CU_FAMILY_H
#define FY_CU_FAMILY_H

#include "common/model/model.h"
#include "gpu_worker/backend.h" /* struct fy_block_saved, struct fy_block_profile */
#include "gpu_worker/cuda/cu_arena.h"
#include "gpu_worker/cuda/cu_common.h"
#include "gpu_worker/cuda/cu_grads.h"
#include "gpu_worker/cuda/cu_matmul.h"

/* What units borrow from their owner: the products' handle and the stream (one host thread, one
 * stream), and the LM head's logits scratch (fy_cu_head_scratch_bytes(head_rows, V)) with its rows
 * per chunk. */
struct fy_cu_env {
    struct fy_cu_lt *lt;
    cudaStream_t stream;
    void *head_scratch;
    int head_rows;
};

/* One piece of a swapped kind: a tensor of a device set of internals and its place in the host
 * buffer (struct fy_block_saved). */
struct fy_cu_swap_piece {
    void *dev;
    char *host;
    size_t bytes;
};
#define FY_CU_SWAP_PIECES 6

/* A family whose blocks' internals can be swapped to host memory (common/model/actplan.h's kinds). */
struct fy_cu_swapping {
    /* 0 when these units can swap the kinds in mask; else -ENOTSUP, said. */
    int (*check)(void *units, unsigned mask);
    /* 0 when the host layout the planner sizes the saved regions with (fy_actplan_sizes_backend
     * "cuda") is the one the pieces take; else -EINVAL, said. */
    int (*layout_check)(void *units);
    /* The pieces of the kinds in mask between set and saved's host buffers, in that layout;
     * returns how many (at most FY_CU_SWAP_PIECES). */
    int (*pieces)(void *units, void *set, const struct fy_block_saved *saved, unsigned mask,
                  struct fy_cu_swap_piece *p);
    /* The backward's recompute of set from x around the kinds in `have`, which are already there
     * (uploaded): the same bits as recomputing everything. positions: the forward's. */
    int (*recompute)(void *units, const bf16 *params, const int32_t *positions, const bf16 *x,
                     void *set, unsigned have);
};

/* Device buffers of the model a profile may use as scratch: one block's parameters, its input,
 * output, output gradient and input gradient, and a sink for its parameter gradients that sends
 * nothing anywhere. */
struct fy_cu_profile_scratch {
    bf16 *params, *x, *y, *dy, *dx;
    const struct fy_cu_grads *grads;
};

#define FY_CU_PROFILE_EVENTS 3
#define FY_CU_PROFILE_REPS 3

/* A family whose blocks the activation planner profiles (struct fy_block_profile). */
struct fy_cu_profiling {
    /* One block's compute on values of its own in scratch, timed with ev (made by the caller):
     * fwd_s, bwd_s, recompute_s, flops_per_s and fc_gelu_fused of out; the per-op timing a caller
     * may have switched on is left as it was. *copy, *copy_bytes: a device buffer of the units'
     * own scratch, the size of the largest kind a block swaps, through which the caller times the
     * link. Returns with the compute queued. */
    int (*block)(void *units, const struct fy_cu_profile_scratch *s,
                 cudaEvent_t ev[FY_CU_PROFILE_EVENTS], struct fy_block_profile *out, void **copy,
                 size_t *copy_bytes);
};

struct fy_cu_family {
    const char *arch; /* the registry's name: fy_model_arch(c)->name */
    size_t set_size;  /* bytes of the family's struct that holds one set of block internals */
    /* 0 when the kernels take this config; else -EINVAL, said. (cu_model checks for every family
     * that n_embd and the head size are multiples of 8.) */
    int (*check)(const struct fy_model_config *c);
    /* Arena bytes of the units' own buffers, and of one set of block internals, for B x T. */
    size_t (*arena_bytes)(const struct fy_model_config *c, int B, int T);
    size_t (*set_bytes)(const struct fy_model_config *c, int B, int T);
    /* The units' buffers from the arena; -ENOMEM, nothing taken and nothing said (cu_model checks
     * the room first and says so), when they do not fit. */
    int (*create)(void **units, struct fy_cu_arena *arena, const struct fy_model_config *c, int B,
                  int T, const struct fy_cu_env *env);
    void (*destroy)(void **units);
    /* One set of internals from the arena into *set (set_size bytes); -ENOMEM, nothing taken and
     * nothing said, when it does not fit. */
    int (*set_take)(void *units, struct fy_cu_arena *arena, void *set);
    /* positions below: [B][T] int32 on the device, the documents of gpu_worker/backend.h (learned
     * positions looked up there, RoPE by them, attention within each document), or NULL
     * (positions t: the kernels of plain causal attention). */
    /* x = the embeddings unit (its layout) looked up at tokens; dembed += the lookup's gradient. */
    int (*embed_forward)(void *units, const bf16 *embed, const int32_t *tokens,
                         const int32_t *positions, bf16 *x);
    int (*embed_backward)(void *units, const int32_t *tokens, const int32_t *positions,
                          const bf16 *dx, float *dembed);
    /* y = block(x); keep: the set the internals go to (NULL: the units' own). */
    int (*block_forward)(void *units, const bf16 *params, const int32_t *positions, const bf16 *x,
                         bf16 *y, void *keep);
    /* dx (overwritten) from dy, and the parameters' f32 gradients through the sink, piece by
     * piece (cu_grads.h: a piece a tensor, or a slice of one, or a norm's weight and bias); kept:
     * the set this block's forward filled from the same params, positions and x, used once (NULL:
     * the forward recomputed). The same bits either way. */
    int (*block_backward)(void *units, const bf16 *params, const int32_t *positions, const bf16 *x,
                          const bf16 *dy, bf16 *dx, const struct fy_cu_grads *grads, void *kept);
    /* The largest piece block_backward takes from a sink whose piece_max is cap. */
    size_t (*grad_piece_max)(const struct fy_model_config *c, size_t cap);
    /* The final norm (norm: the final unit's norm weights) of x into the units' own buffer; *xn
     * points at it until the next call. */
    int (*final_norm)(void *units, const bf16 *norm, const bf16 *x, const bf16 **xn);
    /* The final norm and the head (head_w [V][C]): losses [N] f32 per row (0 for a target < 0);
     * with dx != NULL also dx, dnorm (the norm's gradients) and dhead [V][C] f32, overwritten, of
     * the mean over `count` targets (0: the targets >= 0 given). */
    int (*head)(void *units, const bf16 *norm, const bf16 *head_w, const bf16 *x,
                const int32_t *targets, float *losses, bf16 *dx, float *dnorm, float *dhead,
                uint64_t count);
    const struct fy_cu_swapping *swap;     /* NULL: internals kept or recomputed, never swapped */
    const struct fy_cu_profiling *profile; /* NULL: blocks not profiled */
};

/* The CUDA units of c's family, by the registry's name; NULL when the backend has none. */
const struct fy_cu_family *fy_cu_family_of(const struct fy_model_config *c);

/* For the profiles: the median of n values (sorted in place), and the seconds between two events
 * once the later one has happened. */
double fy_cu_profile_median(double *v, int n);
int fy_cu_profile_elapsed(cudaEvent_t from, cudaEvent_t to, double *s);

#endif
