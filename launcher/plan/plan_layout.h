/* What a training step is and where things live in it, for the planner (launcher/plan/plan.h) and
 * the schedule (launcher/step/sched.h): the step's shape, a placement (which units' state is kept,
 * the read-ahead, the gradient slots, the checkpoints' and internals' slots, where one-pass
 * clipping holds the gradients), the bytes each takes, and the shared pool's regions laid out for
 * them and found again. */
#ifndef FY_PLAN_LAYOUT_H
#define FY_PLAN_LAYOUT_H

#include <stdint.h>

#include "common/model/actplan.h"
#include "common/model/model.h"
#include "common/ipc/pool.h"

/* One training step's shape: what every count of the plan is of. */
struct fy_plan_shape {
    const struct fy_model_config *c;
    int B, T;      /* B sequences of T tokens a step (1 x 1: init and export) */
    int act_dtype; /* activations in the pool: FY_DTYPE_F32 or _BF16 (the backend's) */
    int clip;      /* the gradient norm clipped (one pass or two: fy_plan_place.grad_hold) */
    int ranks;     /* gpu workers (--gpus), each with B / ranks sequences; 0 or 1: one */
    /* the weights the gpu workers are sent (--weights-dtype): FY_DTYPE_BF16, every unit's (a kept
     * unit's bf16 copy where it has one, else converted from its f32 master by the opt worker into
     * a bf16 weights slot: fy_plan_converts); FY_DTYPE_F32, every unit's f32 master. 0: a session
     * that moves units alone (init, export): laid out as f32, and fy_plan_layout_read reads no
     * weights slots, so it reads a training pool of either */
    int weight_dtype;
};
/* The gpu workers of a step (1 where shape.ranks is 0) and the sequences each computes. */
int fy_plan_ranks(const struct fy_plan_shape *s);
int fy_plan_rank_batch(const struct fy_plan_shape *s);

/* The most gpu workers a run has (--gpus), and the pool region through which several of them
 * sum their gradients in rank order (gpu_worker/ranks.h: a 64-byte line per rank, then the
 * collective library's id). */
#define FY_PLAN_RANKS_MAX 8
#define FY_PLAN_RANKS_BYTES 4096

/* Units of weights read ahead of the one the gpu computes (--prefetch): each costs a unit slot. */
#define FY_PLAN_PREFETCH_MAX 8

/* With bf16 weights, a streamed unit's f32 master section comes from the store in chunks into the
 * landing ring (the pool's "landing" region, there where a unit streams): FY_PLAN_LAND_SLOTS chunk
 * slots taken in turn, so that the io worker reads the next chunks while the opt worker converts
 * one into the unit's bf16 weights slot. A chunk is a FY_PLAN_LAND_SLOTS-th of the largest master
 * section (4 KiB padded), at most FY_PLAN_LAND_CHUNK bytes (the test hook FUYOU_TEST_LAND_CHUNK
 * caps it lower): the ring takes no more than one f32 weights slot did, and 256 MiB at most. */
#define FY_PLAN_LAND_SLOTS 4
#define FY_PLAN_LAND_CHUNK (64ull << 20)
/* The landing ring's chunk bytes for model c (a multiple of 4096). */
uint64_t fy_plan_land_chunk(const struct fy_model_config *c);

/* Block gradients the pool holds at once: the gpu runs that many blocks, less one, ahead of the
 * optimizer in the backward; what the optimizer has not done when the backward ends it finishes
 * while the next step's forward runs. The plan takes FY_PLAN_GRAD_SLOTS_FLOOR where --cpu-mem has
 * room (the gpu's next block's gradient never waits for an update but the one two blocks up, and
 * two-pass clipping's norm pass and the gradients held on the GPU take slots 1 and 2 in turn), and
 * where it has not, two (each block's backward waits for the update of the block two up: the gpu
 * and the optimizer in step, a block apart) or, with the state in pieces and no clipping, one (each
 * block's backward waits for the update of the block above: the backward and the updates one after
 * the other, fy_plan_predict's serial bound). */
#define FY_PLAN_GRAD_SLOTS_MIN 1
#define FY_PLAN_GRAD_SLOTS_FLOOR 3
#define FY_PLAN_GRAD_SLOTS_MAX 16

/* Activations on the SSD store (the block-input checkpoints with --ckpt-place ssd, the blocks'
 * SSD-placed internals) pass through pool slots taken in turn (item i in slot i % slots): written
 * to the store in the forward, read back in the backward up to act_ahead blocks ahead of use
 * (--act-ahead). A ring of act_ahead + 2 slots: the one the gpu request being issued reads, the
 * one the request before it may still read, and those being read ahead. */
#define FY_PLAN_ACT_AHEAD_DEFAULT 2
#define FY_PLAN_ACT_AHEAD_MAX 6
/* --act-ahead as given, 0 meaning the default. */
unsigned fy_plan_act_ahead(unsigned asked);
/* The slots of one ring at that depth (0: the default depth). */
unsigned fy_plan_spill_slots(unsigned act_ahead);
/* The scratch extent on the store of `count` items (at least one) of item_bytes each. */
uint64_t fy_plan_spill_extent_bytes(uint64_t item_bytes, unsigned count);

/* What the blocks' swapped internals take (the activation plan's placement,
 * launcher/plan/actplace.h). */
struct fy_plan_swap {
    uint64_t host_bytes; /* saved regions that stay in the pool from forward to backward */
    uint64_t ssd_bytes;  /* those written to the SSD store in the forward and read back */
    uint64_t slot_bytes; /* one of the slots the SSD ones pass through */
    unsigned slots;      /* those slots (fy_plan_spill_slots; 0: nothing on the SSD) */
};
/* From a placement (NULL: nothing swapped) of n_layer blocks, the backend's kind sizes and the
 * read-ahead depth (0: the default). */
void fy_plan_swap_of(const unsigned char *place, unsigned n_layer,
                     const struct fy_actplan_sizes *sizes, unsigned act_ahead,
                     struct fy_plan_swap *out);
/* Pool bytes of the "saved" region for it (0: none). */
uint64_t fy_plan_swap_pool_bytes(const struct fy_plan_swap *swap);
/* The store's scratch extents a run takes (0: none), as train makes them: the SSD-placed internals'
 * (one slot's size for each block), and the checkpoints' with --ckpt-place ssd. */
uint64_t fy_plan_swap_store_bytes(const struct fy_plan_swap *swap, unsigned n_layer);
uint64_t fy_plan_block_inputs_store_bytes(const struct fy_plan_shape *s);

/* Where a unit's optimizer state lives (struct fy_plan_place.resident): streamed from the store,
 * kept in the pool across steps, or (with bf16 weights) kept with a bf16 copy of its weights
 * beside it, which AdamW writes with the master and the gpu worker reads in place of the master's
 * conversion to bf16 before each use (fy_plan_converts): the same bits, the conversions' host
 * memory saved for 2 bytes a parameter of pool. */
enum { FY_PLAN_STREAMED = 0, FY_PLAN_KEPT = 1, FY_PLAN_KEPT_BF16 = 2 };

/* Where things live in a step: a plan's placement (struct fy_plan), or one a caller gives. */
struct fy_plan_place {
    /* per unit FY_PLAN_STREAMED, _KEPT or _KEPT_BF16 (NULL: all streamed) */
    const unsigned char *resident;
    unsigned prefetch;   /* units of weights read ahead, 1..FY_PLAN_PREFETCH_MAX */
    unsigned grad_slots; /* block gradients, FY_PLAN_GRAD_SLOTS_MIN.._MAX */
    /* 1: the state slots hold a piece of a unit's state each (common/model/optstate.h), and a streamed
     * unit's state is read, updated and written back piece by piece after its gradient is in
     * (a streamed block's weights for the backward read again from its masters, as in the
     * forward); 0: they hold a unit's whole state, read before the block's backward, which takes
     * its weights from there */
    int state_pieces;
    /* 0: the checkpoints x_0..x_L stay in the pool; else x_0..x_{L-1} go to the store through
     * these slots (fy_plan_spill_slots) */
    unsigned block_inputs_slots;
    struct fy_plan_swap swap; /* the blocks' swapped internals (all 0: none) */
    /* with clipping: FY_HOLD_POOL or _GPU, one backward pass (every block's gradient held in the
     * pool's "gradhold" region, or in the GPU arena, until the norm is known, the updates after
     * the backward); FY_HOLD_NONE, two passes (the first computes the norm alone) */
    int grad_hold;
    /* with several gpu workers, how each unit's gradient is summed over them: FY_REDUCE_POOL
     * (each worker adds its own into the pool, in rank order: the CPU backend's) or
     * FY_REDUCE_NVLINK (reduced to rank 0 over NVLink, which alone sends it to the pool: the
     * CUDA backend's); fy_plan_make sets it from the backend */
    int reduce;
};
enum { FY_REDUCE_POOL = 0, FY_REDUCE_NVLINK = 1 };

/* Bytes of one activation [B][T][C] in the pool. */
uint64_t fy_plan_act_bytes(const struct fy_model_config *c, int B, int T, int act_dtype);
/* Rows of the embeddings unit (GPT-2: the token rows, then the positions'), each n_embd floats. */
uint64_t fy_plan_embed_rows(const struct fy_model_config *c);
/* Units with a bf16 copy of their weights (NULL: none). */
unsigned fy_plan_weight_copies(const struct fy_model_config *c, const unsigned char *resident);
/* Bytes of unit u's weights that the gpu worker is sent: 2 a parameter with bf16 weights (its copy
 * or its slot), else its f32 master section's. */
uint64_t fy_plan_upload_bytes(const struct fy_model_config *c, int weight_dtype, unsigned u);
/* Whether the opt worker converts unit u's weights into a weights slot for each gpu request that
 * reads them: with bf16 weights, every unit without a bf16 copy (a streamed one, or a kept one the
 * budget had no room for a copy of), rounded to bf16; with f32 weights, every unit in pieces
 * (common/model/optstate.h), whose master is not one contiguous range: its pieces' copied together. */
int fy_plan_converts(const struct fy_plan_shape *s, const unsigned char *resident, unsigned u);
/* Parameters the opt worker converts a step (fy_plan_converts' units): each one's in the forward,
 * and the blocks' once more per backward pass (twice with two-pass clipping). */
uint64_t fy_plan_convert_params(const struct fy_plan_shape *s, const struct fy_plan_place *p);
/* Host-memory bytes a parameter's conversion moves: its f32 read, its bf16 written (f32 weights:
 * 8, its f32 written). */
#define FY_PLAN_CONVERT_PARAM_BYTES 6
uint64_t fy_plan_convert_param_bytes(const struct fy_plan_shape *s);
/* Backward passes through the blocks and the embeddings: two with two-pass clipping. */
uint64_t fy_plan_backward_passes(const struct fy_plan_shape *s, const struct fy_plan_place *p);
/* A state slot: the largest unit's whole state, or with the state in pieces the largest piece's. */
uint64_t fy_plan_state_slot_bytes(const struct fy_model_config *c, int pieces);
/* Bytes of the kept units' state and weight copies: the "resident" region. */
uint64_t fy_plan_resident_bytes(const struct fy_model_config *c, const unsigned char *resident);

/* Where one pass holds the gradients: struct fy_plan_place.grad_hold, and --clip-hold (auto: the
 * pool where it has room beside the kept state, else the GPU arena where it has room). */
enum { FY_HOLD_NONE = 0, FY_HOLD_POOL = 1, FY_HOLD_GPU = 2 };
/* The bytes one-pass clipping holds the blocks' gradients in (the pool's region; the GPU
 * arena's buffers take no more). */
uint64_t fy_plan_hold_bytes(const struct fy_model_config *c);

/* ---- the pool's regions ---------------------------------------------------------------------- */

#define FY_PLAN_REGIONS_MAX 12
/* Pool regions for a step of shape s (B = T = 1 for init and export) with placement p: the
 * streaming regions (meta, tokens, the checkpoints or their slots, activation gradients, the
 * weights slots (each a unit's f32 master, or with bf16 weights its bf16 weights), with bf16
 * weights and a unit streamed the landing ring, the gradient slots with clipping's final-unit
 * gradient after them, two state slots), then the kept state ("resident") and the swapped
 * internals ("saved") where there are any. n receives the count. */
void fy_plan_regions(const struct fy_plan_shape *s, const struct fy_plan_place *p,
                     struct fy_pool_region_spec out[FY_PLAN_REGIONS_MAX], unsigned *n);
/* The same for a session that moves the model unit by unit through them (init, export): a step of
 * one token with f32 activations, nothing kept, nothing swapped. */
void fy_plan_unit_regions(const struct fy_model_config *c,
                          struct fy_pool_region_spec out[FY_PLAN_REGIONS_MAX], unsigned *n);

/* The pool that placement p takes for a step of shape s (its regions laid out). */
uint64_t fy_plan_pool_bytes(const struct fy_plan_shape *s, const struct fy_plan_place *p);

/* Where everything lives in the pool, as fy_plan_regions laid it out (fy_plan_layout_read). */
struct fy_plan_layout {
    const struct fy_model_config *c;
    int B, T;
    int act_dtype; /* activations and their gradients (FY_DTYPE_F32 or _BF16) */
    uint64_t act_bytes, tok_bytes;
    /* the tokens region: inputs, targets and positions (each [B][T] int32, tok_bytes) */
    uint64_t meta, tokens, targets, positions;
    uint64_t embed_rows; /* the embeddings' update in two parts: two row lists */
    uint64_t acts, dacts, weights, grads, state;
    uint64_t slot_bytes; /* the embeddings' f32 gradient, 4 KiB padded (grads slot 0) */
    /* weights slot 0 (the embeddings'), and each other one: the largest other unit's f32 weights,
     * or with bf16 weights (weight_dtype) its bf16 weights, 4 KiB padded */
    uint64_t wslot0_bytes, wslot_bytes;
    int weight_dtype; /* FY_DTYPE_F32 or _BF16: the weights the gpu worker is sent */
    /* the landing ring of bf16 weights (0 where the pool has none): land_slots chunks of
     * land_chunk bytes from pool offset land */
    uint64_t land, land_chunk;
    unsigned land_slots;
    /* a state slot: the largest unit's state, or (state_pieces) the largest piece's
     * (common/model/optstate.h) */
    uint64_t state_slot_bytes;
    int state_pieces;
    unsigned wslots; /* weights slots that blocks and the final unit take in turn */
    /* the grads region: one unit slot for the embeddings' gradient, gslots block-sized slots that
     * the blocks (and the final unit) take in turn, and with clipping the final unit's gradient
     * (dfinal_bytes) */
    uint64_t grads_bytes, bslot_bytes, dfinal_bytes;
    unsigned gslots;
    /* one-pass clipping's held block gradients, block b's at hold + (b - 1) * bslot_bytes (0: no
     * such region) */
    uint64_t hold;
    unsigned act_slots, dact_slots; /* activations the acts and dacts regions hold */
};
/* The layout of a pool that fy_plan_regions laid out for a step of shape s: its regions found and
 * checked against what the steps need (-EINVAL, said, where they fall short); no weights slots
 * (wslots 0) where s->weight_dtype is 0. */
int fy_plan_layout_read(const struct fy_pool *pool, const struct fy_plan_shape *s,
                        struct fy_plan_layout *l);
/* Offsets of the resident units' state in the pool (0: streamed from the store), and of their
 * bf16 weight copies, each after its unit's state (0: none). */
int fy_plan_resident_offsets(const struct fy_pool *pool, const struct fy_model_config *c,
                             const unsigned char *resident, uint64_t *offsets, uint64_t *copies);

#endif
