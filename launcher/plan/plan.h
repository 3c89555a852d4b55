/* The planner of a training run, one sequence for train, plan and profile (fy_plan_make): from the
 * run's shape, its options, its budgets and the machine's rates, where each unit's optimizer state
 * lives (kept in the shared pool, with or without a bf16 weights copy, or streamed from the SSD
 * store), where the checkpoints go, the blocks' swapped internals (the activation plan's part,
 * which the caller plugs in: launcher/cli/actsetup.h with the workers' profile), the block gradient
 * slots, the pool's regions, the bytes a step moves over the SSD and PCIe, what the store and the
 * GPU take, and the predicted time per resource. The training executor (launcher/step/train.h) finds
 * the regions again with fy_plan_layout_read. */
#ifndef FY_PLAN_H
#define FY_PLAN_H

#include <stdint.h>

#include "common/actplan.h"
#include "common/model.h"
#include "common/pool.h"

/* ---- the machine's rates -------------------------------------------------------------------- */

/* Rates a step's time is predicted from. */
struct fy_plan_rates {
    double gpu_flops;           /* model FLOP/s with blocks recomputed (0: compute not predicted) */
    double h2d, d2h;            /* PCIe bytes/s to and from the GPU */
    double ssd_read, ssd_write; /* bytes/s; reads and writes share the disk */
    double opt_params;          /* AdamW parameters/s with the run's optimizer state format */
    /* AdamW parameters/s by format (enum fy_optim_state; 0: not known) */
    double opt_by_format[FY_OPTIM_STATE_COUNT];
    /* With several GPUs (--gpus): bytes/s one NVLink link carries in the gradients' ring reduce
     * (the CUDA backend's), and bytes/s of host memory that all the GPUs' PCIe copies share
     * (0: not predicted) */
    double nvlink, host_mem;
};
/* The reference machine's (one H200, docs/benchmarks.md "The machine"): what train and plan
 * predict with where no machine profile (fuyou-launch probe) is given. */
extern const struct fy_plan_rates fy_plan_reference_rates;
/* The rates of a machine profile: a JSON object with gpu_flops (model FLOP/s with blocks
 * recomputed), h2d, d2h (bytes/s), ssd_read, ssd_write (bytes/s), opt_params (AdamW
 * parameters/s with fp32 optimizer state), all positive numbers, and optionally opt_params_bf16 and
 * opt_params_int8 (the same with bf16 and int8 state), nvlink and host_mem (bytes/s; absent: the
 * reference machine's); opt_params is fp32's until fy_plan_rates_select. -EINVAL (said, naming
 * the file and key) otherwise. */
int fy_plan_rates_load(const char *path, struct fy_plan_rates *out);
/* The GPU that probe measured for a machine profile: its free and total memory when probe began,
 * where it ran and when (fuyou-launch probe on the CUDA backend writes them). */
struct fy_plan_machine_gpu {
    uint64_t free_bytes, total_bytes; /* 0: the profile has none (the CPU backend's, or older) */
    char host[128], probed_at[64];    /* "" where the profile does not say */
};
/* Reads the profile's gpu_free, gpu_total, host and probed_at into *out; a profile without
 * gpu_free has none (not an error). -EINVAL (said) where gpu_free is there but it or gpu_total is
 * not a positive number of bytes, or gpu_free exceeds gpu_total. */
int fy_plan_machine_gpu_load(const char *path, struct fy_plan_machine_gpu *out);
/* Makes opt_params the rate of optimizer state format `format` (enum fy_optim_state): its entry
 * of opt_by_format. -EINVAL, said naming `from` (where the rates come from), where it is not
 * known. */
int fy_plan_rates_select(struct fy_plan_rates *r, int format, const char *from);

/* ---- what a step is and where things live ---------------------------------------------------- */

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

/* What the blocks' swapped internals take (the activation plan's placement, launcher/plan/actplace.h). */
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
    /* 1: the state slots hold a piece of a unit's state each (common/optstate.h), and a streamed
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
 * (common/optstate.h), whose master is not one contiguous range: its pieces' copied together. */
int fy_plan_converts(const struct fy_plan_shape *s, const unsigned char *resident, unsigned u);
/* Parameters the opt worker converts a step (fy_plan_converts' units): each one's in the forward,
 * and the blocks' once more per backward pass (twice with two-pass clipping). */
uint64_t fy_plan_convert_params(const struct fy_plan_shape *s, const struct fy_plan_place *p);
/* Host-memory bytes a parameter's conversion moves: its f32 read, its bf16 written (f32 weights:
 * 8, its f32 written). */
#define FY_PLAN_CONVERT_PARAM_BYTES 6
uint64_t fy_plan_convert_param_bytes(const struct fy_plan_shape *s);
/* Bytes of the kept units' state and weight copies: the "resident" region. */
uint64_t fy_plan_resident_bytes(const struct fy_model_config *c, const unsigned char *resident);

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
     * (common/optstate.h) */
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

/* ---- traffic and prediction ------------------------------------------------------------------ */

/* What a step moves. With several gpu workers (shape.ranks), to_gpu and from_gpu are the busiest
 * link's, rank 0's: every GPU is sent every unit's weights over its own PCIe link (not broadcast
 * over NVLink) and moves the activations of its B / ranks sequences, while the f32 gradients go
 * down rank 0's link alone where they are reduced over NVLink (FY_REDUCE_NVLINK: nvlink is what
 * each link of the ring carries, (ranks - 1) / ranks of them), and down every link where each
 * worker adds its own into the pool; host_mem counts every link's copies, and with
 * FY_REDUCE_POOL the ranks after the first reading the pool's sum before adding to it. With one
 * gpu worker nvlink and host_mem are 0.
 * SSD: the streamed units' master sections in the forward (a block's once more
 * with clipping, for the norm pass, except where one pass defers the block's update to the next
 * forward, which reads its whole state in place of its master), their whole state read once,
 * which also gives a block its weights in the backward, and written once (common/optstate.h); the
 * checkpoints x_0..x_{L-1} on the store written in the forward and read in each backward pass; the
 * blocks' SSD-placed internals likewise (at most: the last ones may still be in their slots).
 * PCIe, through the gpu worker's host interface: weights as fy_plan_upload_bytes, f32 gradients,
 * activations in the shape's dtype, with two-pass clipping the second backward pass too, the
 * swapped internals down in the forward and up in each backward pass, every input uploaded (at
 * most: the CUDA backend hands a unit's output to the next unit on the device when the two are in
 * flight together). With bf16 weights, the head's final unit and embeddings go up in bf16 too. */
struct fy_plan_traffic {
    uint64_t ssd_read, ssd_write;
    uint64_t to_gpu, from_gpu;
    uint64_t nvlink, host_mem;
    /* host memory the opt worker's conversions to bf16 read and write (fy_plan_convert_params x
     * FY_PLAN_CONVERT_PARAM_BYTES); in host_mem too with several gpu workers */
    uint64_t convert;
};
/* The f32 gradients a step's gpu workers produce (each rank's, and what is summed over them):
 * every unit's, the blocks' and the embeddings' once per backward pass. */
uint64_t fy_plan_grad_bytes(const struct fy_plan_shape *s, const struct fy_plan_place *p);
void fy_plan_traffic(const struct fy_plan_shape *s, const struct fy_plan_place *p,
                     struct fy_plan_traffic *out);

/* Predicted seconds per step of each resource and the largest (the bound) and its name. */
struct fy_plan_prediction {
    double gpu_s, h2d_s, d2h_s, ssd_s, opt_s, step_s;
    double convert_s; /* of opt_s, the conversions to bf16 */
    const char *bound;
    double nvlink_s, host_mem_s; /* with several gpu workers (0 with one) */
};
/* The GPU's compute from the model FLOPs (with clipping, the blocks' backward once more) at
 * gpu_flops, the traffic at its rates (SSD reads and writes share the disk), the opt worker's
 * AdamW over every parameter (with clipping, the sums of squares too) and its conversions to bf16:
 * the host-memory bytes they move at the rate AdamW moves its own, opt_params x
 * fy_optstate_update_param_bytes a second. With several gpu workers: each GPU's
 * compute of its B / ranks sequences, each link's PCIe (rank 0's, the busiest), the NVLink
 * reduce at rates->nvlink and every link's copies at rates->host_mem (each 0 where its rate is
 * 0). */
void fy_plan_predict(const struct fy_plan_shape *s, const struct fy_plan_place *p,
                     const struct fy_plan_rates *rates, struct fy_plan_prediction *out);
/* The blocks' updates one after another, as the backward waits for them with one gradient slot:
 * each block's the longer of its AdamW and, streamed, its state read and written. */
double fy_plan_block_updates_s(const struct fy_plan_shape *s, const struct fy_plan_place *p,
                               const struct fy_plan_rates *rates);

/* ---- the plan -------------------------------------------------------------------------------- */

/* --clip-mode: how a clipped step learns the gradient norm before its first update. One pass
 * holds every block's f32 gradient in the pool through the backward (fy_plan_hold_bytes) and
 * updates after it; two passes run the backward twice, the first for the norm alone. auto: one
 * pass where the pool has room for the held gradients within --cpu-mem. */
enum { FY_CLIP_AUTO = 0, FY_CLIP_ONE_PASS = 1, FY_CLIP_TWO_PASS = 2 };
/* Where one pass holds the gradients: struct fy_plan_place.grad_hold, and --clip-hold (auto: the
 * pool where it has room beside the kept state, else the GPU arena where it has room). */
enum { FY_HOLD_NONE = 0, FY_HOLD_POOL = 1, FY_HOLD_GPU = 2 };
enum { FY_CLIP_HOLD_AUTO = 0, FY_CLIP_HOLD_POOL = 1, FY_CLIP_HOLD_GPU = 2 };
/* The bytes one-pass clipping holds the blocks' gradients in (the pool's region; the GPU
 * arena's buffers take no more). */
uint64_t fy_plan_hold_bytes(const struct fy_model_config *c);

/* --ckpt-place: where the blocks' input checkpoints go (struct fy_plan_in.block_inputs_place): the
 * pool, the SSD store, or auto (fy_plan_make). */
enum { FY_BLOCK_INPUTS_HOST, FY_BLOCK_INPUTS_SSD, FY_BLOCK_INPUTS_AUTO };

/* What a plan is made from: the step, the options that place things, the budgets, the rates. */
struct fy_plan_in {
    struct fy_plan_shape shape;
    const char *backend; /* "cpu" or "cuda", resolved: its GPU memory model */
    unsigned prefetch;   /* --prefetch */
    unsigned grad_slots; /* --grad-slots: the most block gradients wanted */
    unsigned act_ahead;  /* --act-ahead (0: the default) */
    /* --ckpt-place, the blocks' input checkpoints: FY_BLOCK_INPUTS_HOST, _SSD or _AUTO */
    int block_inputs_place;
    enum fy_actplan_mode act_mode; /* --act-plan */
    uint64_t cpu_mem;              /* the pool's cap (0: none, and no state kept) */
    uint64_t gpu_mem;              /* the GPU arena's (0: the working buffers alone, not checked) */
    unsigned state_copies;         /* of the optimizer state in the store: 2 or 1 */
    int clip_mode;                 /* --clip-mode: FY_CLIP_AUTO, _ONE_PASS or _TWO_PASS */
    int clip_hold;                 /* --clip-hold: FY_CLIP_HOLD_AUTO, _POOL or _GPU */
    double clip_max;               /* --clip-grad-norm (shape.clip: above 0), for what is said */
    int clip_given;                /* ... given on the command line (else the default) */
    struct fy_plan_rates rates;
    int say; /* say --ckpt-place auto's choice in the log as it is made (train) */
    /* keep no unit's state: the least pool under cpu_mem alone (plan's searches of the largest
     * batch and model, which ask whether that fits) */
    int floor_only;
};

/* A plan. */
struct fy_plan {
    unsigned char *resident;      /* per unit, FY_PLAN_*: place.resident (fy_plan_free frees it) */
    struct fy_plan_place place;   /* where things live, the gradient slots as many as fit */
    unsigned kept, weight_copies; /* units whose state is kept; of those, with a bf16 copy */
    uint64_t resident_bytes;      /* the kept state and copies */
    struct fy_pool_region_spec regions[FY_PLAN_REGIONS_MAX];
    unsigned n_regions;
    uint64_t pool_bytes; /* the regions laid out (fy_pool_layout_size) */
    /* the store: the state's copies, both commit records, the scratch extents of the checkpoints
     * and internals placed there */
    uint64_t store_bytes;
    /* the GPU arena (where the backend's memory is modelled, gpu_modelled): its working buffers,
     * a block's internals (a set), and what the plan needs: the working buffers, and with every
     * block's internals swapped a set per call in flight */
    int gpu_modelled;
    uint64_t gpu_working, gpu_set, gpu_need;
    int fits_cpu, fits_gpu; /* pool_bytes within cpu_mem (or none); gpu_need within gpu_mem */
    /* with clipping and --clip-mode auto where one pass does not fit: the pool bytes one pass
     * would take (place.grad_hold says which was taken) */
    uint64_t one_pass_pool_bytes;
    int one_pass_gpu_short; /* and where the GPU arena had no room for them */
    /* with --clip-mode auto: where one pass took the room of kept state, the units it took it from
     * and two passes' predicted step with them kept */
    unsigned clip_kept_fewer;
    double two_pass_step_s, unclipped_step_s;
    struct fy_plan_traffic traffic;
    struct fy_plan_prediction predicted; /* at in->rates */
};

/* The activation plan's step in the sequence, which places the blocks' internals in p->place.swap:
 * called before the state's residency is planned for --act-plan host and ssd (every block's
 * internals placed whatever the room; the residency plans around them), after it for auto and
 * recompute (auto plans in the room that the kept state and the streaming leave: p->resident and
 * p->place.block_inputs_slots as planned). Returns 0 or -errno (said). NULL: nothing swapped. */
struct fy_plan_acts {
    int (*place)(void *ctx, const struct fy_plan_in *in, struct fy_plan *p);
    void *ctx;
};

/* The plan, in one sequence: the forced activation placement; the checkpoints' place (--ckpt-place
 * auto: the pool when all optimizer state fits --cpu-mem beside them, else the store); the state's
 * residency (unit 0 first, every unit whose state still fits --cpu-mem with the streaming regions
 * is kept in the pool across steps, the others stream from the store; with bf16 weights the kept
 * units then get their copies, unit 0 first, while those fit too, each saving its conversions); the activation plan of auto
 * and recompute; the gradient slots (more than the minimum only when every unit's state is kept:
 * as many as --grad-slots asks and the budget holds, one per block at most); the regions; the
 * store, the GPU, the traffic and the prediction. acts may be NULL. -errno (said) where the
 * activation plan fails or memory runs out; a plan that does not fit its budgets is made all the
 * same (fits_cpu, fits_gpu). With several gpu workers (shape.ranks > 1), -FY_EUSAGE (said) for a
 * batch they do not divide, for --clip-hold gpu with clipping and for --act-plan host or ssd
 * (not supported across ranks); --clip-hold auto never holds on the GPU then. */
int fy_plan_make(const struct fy_plan_in *in, const struct fy_plan_acts *acts, struct fy_plan *p);
void fy_plan_free(struct fy_plan *p);
/* The GPU against --gpu-mem where the backend's memory is modelled, as the gpu worker would find
 * it, but before any worker starts: with p NULL the working buffers of one gpu worker's share of
 * the batch (before the plan, whose activation step profiles a block on the GPU), else p's whole
 * need (p->fits_gpu). 0, or -FY_EUSAGE (said: raise --gpu-mem or lower the batch). */
int fy_plan_check_gpu(const struct fy_plan_in *in, const struct fy_plan *p);
/* How the weights go to the GPU (shape s, plan p): with bf16 weights, how many units from their
 * copies and how many converted by the opt worker, with the host memory that takes a step; else
 * "weights to the GPU in f32". */
void fy_plan_weights_describe(const struct fy_plan_shape *s, const struct fy_plan *p, char *buf,
                              size_t len);
/* Where the plan takes less pool than it would with room: the state slots in pieces (their size
 * against a unit's whole state, the SSD reads and the predicted step this adds), fewer gradient
 * slots than FY_PLAN_GRAD_SLOTS_FLOOR (the wait and the step it adds); empty where neither. */
void fy_plan_state_describe(const struct fy_plan_in *in, const struct fy_plan *p, char *buf,
                            size_t len);
/* One line on how a clipped step learns the norm (nothing where in does not clip): one pass with
 * the blocks' gradients held in the pool, or two passes and, with --clip-mode auto, why; and what
 * clipping adds to the predicted step. */
void fy_plan_clip_describe(const struct fy_plan_in *in, const struct fy_plan *p, char *buf,
                           size_t len);

#endif
