/* The planner of a training run: where each unit's optimizer state lives (kept in the shared pool,
 * with or without a bf16 weights copy, or streamed from the SSD store), where the checkpoints go,
 * the block gradient slots, the pool's regions and how the executor finds them again, the bytes a
 * step moves over the SSD and PCIe, the store's scratch, and the predicted time per resource at a
 * machine's rates (the reference machine's, or a machine profile's). */
#ifndef FY_PLAN_H
#define FY_PLAN_H

#include <stdint.h>

#include "common/actplan.h"
#include "common/model.h"
#include "common/pool.h"

/* Units of weights read ahead of the one the gpu computes (--prefetch): each costs a unit slot. */
#define FY_PLAN_PREFETCH_MAX 8

/* Block gradients the pool holds at once: the gpu runs that many blocks, less one, ahead of the
 * optimizer in the backward; what the optimizer has not done when the backward ends it finishes
 * while the next step's forward runs. */
#define FY_PLAN_GRAD_SLOTS_MIN 3
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

/* What the blocks' swapped internals take (the activation plan's placement, launcher/actrun.h). */
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
uint64_t fy_plan_ckpt_store_bytes(const struct fy_gpt_config *c, int B, int T, int act_dtype);

/* Bytes of one activation [B][T][C] in the pool. */
uint64_t fy_plan_act_bytes(const struct fy_gpt_config *c, int B, int T, int act_dtype);
/* Rows of the embeddings unit (GPT-2: the token rows, then the positions'), each n_embd floats. */
uint64_t fy_plan_embed_rows(const struct fy_gpt_config *c);

/* Pool regions for a model and batch (B = T = 1 for init/export), with a "resident" region for the
 * optimizer state of the units marked in `resident` (may be NULL), weights slots for `prefetch`
 * units read ahead (1..FY_PLAN_PREFETCH_MAX), `grad_slots` block gradients (FY_PLAN_GRAD_SLOTS_MIN
 * to _MAX) and, with `clip`, room for the final unit's gradient between the two backward passes of
 * a clipped step, the checkpoints (x_0..x_L, or with ckpt_slots > 0 the slots they pass through on
 * their way to the store: fy_plan_spill_slots), and with swap (may be NULL) the "saved" region of
 * the blocks' swapped internals. n receives the count (<= 10). */
void fy_plan_regions(const struct fy_gpt_config *c, int B, int T, int act_dtype,
                     const unsigned char *resident, int clip, unsigned prefetch,
                     unsigned grad_slots, unsigned ckpt_slots, const struct fy_plan_swap *swap,
                     struct fy_pool_region_spec out[10], unsigned *n);

/* Where everything lives in the pool, as fy_plan_regions laid it out (fy_plan_layout_read). */
struct fy_plan_layout {
    const struct fy_gpt_config *c;
    int B, T;
    int act_dtype; /* activations and their gradients (FY_DTYPE_F32 or _BF16) */
    uint64_t act_bytes, tok_bytes;
    uint64_t meta, tokens, targets;
    uint64_t embed_rows; /* the embeddings' update in two parts: two row lists */
    uint64_t acts, dacts, weights, grads, state;
    uint64_t slot_bytes;  /* one unit's f32 gradient, 4 KiB padded (grads slot 0) */
    uint64_t wslot_bytes; /* a weights slot: the largest unit's master section */
    uint64_t state_slot_bytes; /* a state slot: the largest unit's state (common/optstate.h) */
    unsigned wslots;      /* weights slots that blocks and the final unit take in turn */
    /* the grads region: one unit slot for the embeddings' gradient, gslots block-sized slots that
     * the blocks (and the final unit) take in turn, and with clipping the final unit's gradient
     * (dfinal_bytes) */
    uint64_t grads_bytes, bslot_bytes, dfinal_bytes;
    unsigned gslots;
    unsigned act_slots, dact_slots; /* activations the acts and dacts regions hold */
};
/* The layout of a pool laid out by fy_plan_regions for this model and batch (and `clip`): its
 * regions found and checked against what the steps need (-EINVAL, said, where they fall short). */
int fy_plan_layout_read(const struct fy_pool *p, const struct fy_gpt_config *c, int B, int T,
                        int act_dtype, int clip, struct fy_plan_layout *l);
/* Offsets of the resident units' state in the pool (0: streamed from the store), and of their
 * bf16 weight copies, each after its unit's state (0: none). */
int fy_plan_resident_offsets(const struct fy_pool *p, const struct fy_gpt_config *c,
                             const unsigned char *resident, uint64_t *offsets, uint64_t *copies);

/* Where a unit's optimizer state lives (fy_train_opts.resident): streamed from the store, kept in
 * the pool across steps, or kept with a bf16 copy of its weights beside it, which AdamW writes
 * with the master and the gpu worker reads instead of the master: half the bytes over PCIe, and
 * the same bits where the backend computes in bf16 anyway (fy_backend_preferred_weight_dtype). */
enum { FY_PLAN_STREAMED = 0, FY_PLAN_KEPT = 1, FY_PLAN_KEPT_BF16 = 2 };
/* The memory plan under --cpu-mem: marks, unit 0 first, every unit whose optimizer state (master,
 * m, v) still fits in a pool of at most cpu_mem bytes together with the streaming regions; those
 * units' state stays in the pool across steps (no SSD traffic, written to the store at
 * checkpoints), the others stream from the store. With weight_dtype FY_DTYPE_BF16 the kept units
 * then get their bf16 copies, unit 0 first, while those fit too (a copy saves PCIe time, a kept
 * unit SSD time, which is dearer). cpu_mem 0: none. ckpt_slots as fy_plan_regions takes it.
 * Returns how many units are kept. */
unsigned fy_plan_resident(const struct fy_gpt_config *c, int B, int T, int act_dtype,
                          uint64_t cpu_mem, int clip, unsigned prefetch, unsigned ckpt_slots,
                          const struct fy_plan_swap *swap, int weight_dtype,
                          unsigned char *resident);
/* Units with a bf16 copy of their weights in the plan. */
unsigned fy_plan_weight_copies(const struct fy_gpt_config *c, const unsigned char *resident);
/* Bytes of unit u's weights that the gpu worker is sent: its bf16 copy's, or its f32 master's. */
uint64_t fy_plan_upload_bytes(const struct fy_gpt_config *c, const unsigned char *resident,
                              unsigned u);
/* Bytes of the kept units' state and weight copies (the "resident" region). */
uint64_t fy_plan_resident_bytes(const struct fy_gpt_config *c, const unsigned char *resident);
/* The block gradient slots for that plan, up to `wanted`: more than the minimum only when every
 * unit's state is resident (then the optimizer is what the gpu may wait for, and more slots let it
 * lag behind the backward instead, its updates going lowest unit first), as many as still fit
 * cpu_mem, at most one per block. */
unsigned fy_plan_grad_slots(const struct fy_gpt_config *c, int B, int T, int act_dtype,
                            uint64_t cpu_mem, int clip, unsigned prefetch, unsigned ckpt_slots,
                            const struct fy_plan_swap *swap, const unsigned char *resident,
                            unsigned wanted);
/* Bytes a training step reads from and writes to the SSD store, from the state's layout
 * (common/optstate.h): the streamed units' master sections in the forward (a block's once more with
 * clipping, for the norm pass), their whole state read once, which also gives a block its weights
 * in the backward, and written once; with ckpt_ssd the
 * checkpoints x_0..x_{L-1} written in the forward and read in each backward pass; with swap the
 * blocks' SSD-placed internals likewise (at most: the last ones may still be in their slots). */
void fy_plan_ssd_bytes(const struct fy_gpt_config *c, int B, int T, int act_dtype, int clip,
                       int ckpt_ssd, const struct fy_plan_swap *swap,
                       const unsigned char *resident, uint64_t *read, uint64_t *write);
/* Bytes a training step moves to the GPU and back over PCIe through the gpu worker's host
 * interface (weights as fy_plan_upload_bytes, fp32 gradients, activations in act_dtype; with
 * clipping the second backward pass too; swap's internals down in the forward and up in each
 * backward pass), every input uploaded: the CUDA backend hands a unit's output to the next unit on
 * the device when the two are in flight together, which spares those uploads. */
void fy_plan_pcie_bytes(const struct fy_gpt_config *c, int B, int T, int act_dtype, int clip,
                        const struct fy_plan_swap *swap, const unsigned char *resident,
                        uint64_t *to_gpu, uint64_t *from_gpu);

/* Rates a step's time is predicted from. */
struct fy_plan_rates {
    double gpu_flops;           /* model FLOP/s with blocks recomputed (0: compute not predicted) */
    double h2d, d2h;            /* PCIe bytes/s to and from the GPU */
    double ssd_read, ssd_write; /* bytes/s; reads and writes share the disk */
    double opt_params;          /* AdamW parameters/s */
};
/* The rates measured on the reference machine (one H200, docs/benchmarks.md): bench-gpu's model
 * FLOP/s with blocks recomputed, PCIe one way at a time, the io engine on its disk, AdamW beside
 * the copies in bench-pipeline. */
struct fy_plan_rates fy_plan_reference_rates(void);
/* The rates of a machine profile: a JSON object with gpu_flops (model FLOP/s with blocks
 * recomputed), h2d, d2h (bytes/s), ssd_read, ssd_write (bytes/s), opt_params (AdamW
 * parameters/s), all positive numbers. -EINVAL (said, naming the file and key) otherwise. */
int fy_plan_rates_load(const char *path, struct fy_plan_rates *out);

/* Predicted seconds per step of each resource and the largest (the bound) and its name. */
struct fy_plan_prediction {
    double gpu_s, h2d_s, d2h_s, ssd_s, opt_s, step_s;
    const char *bound;
};
void fy_plan_predict(const struct fy_gpt_config *c, int B, int T, int act_dtype, int clip,
                     int ckpt_ssd, const struct fy_plan_swap *swap,
                     const unsigned char *resident, const struct fy_plan_rates *rates,
                     struct fy_plan_prediction *out);

#endif
