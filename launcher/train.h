/* The training schedule: which descriptors go to which worker, in which order, for initialising a
 * model in the store, one training step, evaluation and export. It runs over an executor, so the
 * same schedule drives the worker processes (launcher/supervise) or, for tests and debugging, the
 * same handlers called in one process (launcher/inproc).
 *
 * A step is serial and layer-major: the whole batch goes through one unit before the next.
 * Forward: embed, blocks 1..L (each block's input kept in the pool as its checkpoint), head with
 * loss and its backward; then the final unit is updated; backward: for each block L..1, its
 * gradients, then its AdamW update (state read from the SSD store, written back); last the
 * embeddings (the tied head's wte gradient plus the lookup's). A unit's weights for step N+1 are read
 * only after step N has written them back; per-unit versions check this.
 *
 * Clipping by global norm (clip_grad_norm > 0) needs every gradient before the first update, but
 * the updates run beside the backward, so a clipped step runs the backward twice: pass 1 computes
 * each unit's gradient and its sum of squares (opt-sumsq), no update; the launcher adds the units'
 * sums in unit order, norm = sqrt(sum), scale = max / (norm + 1e-6); pass 2 is the backward with
 * its overlapped updates, each opt-adamw carrying the scale when it is below 1 (none otherwise,
 * so the update is the unclipped one bit for bit). The block inputs are still in the pool, so
 * there is no second forward; the head's outputs (dx_L, the final unit's gradient, the head's wte
 * gradient) are kept through pass 1, so the head and the embedding backward run once. The cost: every
 * block's backward and weights read twice. */
#ifndef FY_TRAIN_H
#define FY_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "common/actplan.h"
#include "common/ckpt.h"
#include "common/desc.h"
#include "common/model.h"
#include "common/pool.h"
#include "common/tokfile.h"
#include "launcher/diskrates.h"

struct fy_metrics;

struct fy_exec {
    void *ctx;
    /* Sends a request to a worker ("gpu", "io", "opt") without waiting; returns a ticket (> 0) or
     * -errno. Each worker serves its requests in the order they were sent. */
    int64_t (*submit)(void *ctx, const char *worker, struct fy_desc *req, unsigned n);
    /* Waits for a ticket's reply; returns the reply's status (0 or -errno). */
    int (*wait)(void *ctx, int64_t ticket, struct fy_desc *reply, int timeout_ms);
    /* Whether a ticket's reply is in, without blocking: 1 (then wait returns at once), 0, or
     * -errno. */
    int (*poll)(void *ctx, int64_t ticket);
};

struct fy_train_opts {
    uint64_t steps;       /* train until this step (total, counting steps already in the store) */
    int batch, seq;       /* B sequences of T tokens per step */
    double lr;            /* peak learning rate */
    uint64_t warmup;      /* linear warmup steps */
    double min_lr_ratio;  /* cosine decay to lr * min_lr_ratio at `steps` */
    uint64_t seed;        /* data order */
    uint64_t eval_every;  /* 0: only at the end */
    uint64_t eval_batches;
    uint64_t checkpoint_every; /* make the store durable every N steps (and at the end) */
    int timeout_ms;       /* per request */
    int overlap;          /* 1: overlap updates with the backward and prefetch weights; 0: serial */
    /* one JSON line per step appended there (NULL: none); lines of steps after the commit a
     * run starts from are dropped first, as those steps are trained again; too many lines
     * waiting for room there stop the run at a commit (launcher/metrics.h) */
    struct fy_metrics *metrics;
    FILE *trace;          /* Chrome trace-event JSON of every request (Perfetto); NULL: none */
    /* per unit: FY_TRAIN_STREAMED, _KEPT or _KEPT_BF16 (fy_train_plan_resident) */
    const unsigned char *resident;
    double clip_grad_norm; /* > 0: clip the global gradient norm to this (two backward passes) */
    int ckpt_ssd;          /* 1: the block-input checkpoints go to the SSD store (--ckpt-place ssd) */
    unsigned act_ahead;    /* --act-ahead: blocks whose activations on the store the backward reads
                              ahead (1..FY_TRAIN_ACT_AHEAD_MAX; 0: FY_TRAIN_ACT_AHEAD_DEFAULT) */
    int act_dtype;         /* activations in the pool: FY_DTYPE_F32 or _BF16, the backend's choice
                              (fy_backend_preferred_act_dtype; the gpu worker reads
                              train.act_dtype) */
    /* The blocks' swapped internals: place[l * FY_ACT_KINDS + k] for block l + 1 (common/
     * actplan.h): swappable kinds placed FY_ACT_HOST stay in the pool from the forward to the
     * backward, FY_ACT_SSD ones go to the store and come back; anything else is recomputed (NULL:
     * all). saved_sizes: the kinds' bytes in the backend's layout (fy_actplan_sizes_backend). The
     * pool must have been laid out with the fy_train_swap_of this gives. */
    const unsigned char *act_place;
    struct fy_actplan_sizes saved_sizes;
    const volatile int *stop; /* set asynchronously to stop at the next step boundary; may be NULL */
    /* What the activation plan predicted from the profile, set beside the session's second step
     * (its first is a warm-up) in the log's plan check: the step's seconds (0: not predicted, no
     * check), and the SSD's read and write rates (bytes/s) and AdamW's parameters/s it assumed. */
    double plan_step_s, plan_ssd_read, plan_ssd_write, plan_opt_params;
    int plan_ssd_from_steps; /* the plan's SSD rates were a past session's steps' (not the profile's) */
    /* counts the SSD's bytes and busy seconds of each step after the session's first (a warm-up)
     * for the next session's plan (launcher/diskrates.h); NULL: not counted */
    struct fy_diskrates *ssd_seen;
};

/* Units of weights read ahead of the one the gpu computes (--prefetch): each costs a unit slot. */
#define FY_TRAIN_PREFETCH_MAX 8

/* Block gradients the pool holds at once: the gpu runs that many blocks, less one, ahead of the
 * optimizer in the backward; what the optimizer has not done when the backward ends it finishes
 * while the next step's forward runs. */
#define FY_TRAIN_GRAD_SLOTS_MIN 3
#define FY_TRAIN_GRAD_SLOTS_MAX 16

/* Activations on the SSD store (the block-input checkpoints with --ckpt-place ssd, the blocks'
 * SSD-placed internals) pass through pool slots taken in turn (item i in slot i % slots): written
 * to the store in the forward, read back in the backward up to act_ahead blocks ahead of use
 * (--act-ahead). A ring of act_ahead + 2 slots: the one the gpu request being issued reads, the
 * one the request before it may still read, and those being read ahead. */
#define FY_TRAIN_ACT_AHEAD_DEFAULT 2
#define FY_TRAIN_ACT_AHEAD_MAX 6
/* The slots of one ring at that depth (0: the default depth). */
unsigned fy_train_spill_slots(unsigned act_ahead);

/* What the blocks' swapped internals take (struct fy_train_opts.act_place). */
struct fy_train_swap {
    uint64_t host_bytes; /* saved regions that stay in the pool from forward to backward */
    uint64_t ssd_bytes;  /* those written to the SSD store in the forward and read back */
    uint64_t slot_bytes; /* one of the slots the SSD ones pass through */
    unsigned slots;      /* those slots (fy_train_spill_slots; 0: nothing on the SSD) */
};
/* From a placement (NULL: nothing swapped) of n_layer blocks, the backend's kind sizes and the
 * read-ahead depth (0: the default). */
void fy_train_swap_of(const unsigned char *place, unsigned n_layer,
                      const struct fy_actplan_sizes *sizes, unsigned act_ahead,
                      struct fy_train_swap *out);
/* Pool bytes of the "saved" region for it (0: none). */
uint64_t fy_train_swap_pool_bytes(const struct fy_train_swap *swap);
/* The store's scratch extents a run takes (0: none), as train makes them: the SSD-placed internals'
 * (one slot's size for each block), and the checkpoints' with --ckpt-place ssd. */
uint64_t fy_train_swap_store_bytes(const struct fy_train_swap *swap, unsigned n_layer);
uint64_t fy_train_ckpt_store_bytes(const struct fy_gpt_config *c, int B, int T, int act_dtype);

/* Bytes of one activation [B][T][C] in the pool. */
uint64_t fy_train_act_bytes(const struct fy_gpt_config *c, int B, int T, int act_dtype);

/* Pool regions for a model and batch (B = T = 1 for init/export), with a "resident" region for the
 * optimizer state of the units marked in `resident` (may be NULL), weights slots for `prefetch`
 * units read ahead (1..FY_TRAIN_PREFETCH_MAX), `grad_slots` block gradients (FY_TRAIN_GRAD_SLOTS_MIN
 * to _MAX) and, with `clip`, room for the final unit's gradient between the two backward passes of
 * a clipped step, the checkpoints (x_0..x_L, or with ckpt_slots > 0 the slots they pass through on
 * their way to the store: fy_train_spill_slots), and with swap (may be NULL) the "saved" region of
 * the blocks' swapped internals. n receives the count (<= 10). */
void fy_train_regions(const struct fy_gpt_config *c, int B, int T, int act_dtype,
                      const unsigned char *resident, int clip, unsigned prefetch,
                      unsigned grad_slots, unsigned ckpt_slots, const struct fy_train_swap *swap,
                      struct fy_pool_region_spec out[10], unsigned *n);
/* Where a unit's optimizer state lives (fy_train_opts.resident): streamed from the store, kept in
 * the pool across steps, or kept with a bf16 copy of its weights beside it, which AdamW writes
 * with the master and the gpu worker reads instead of the master: half the bytes over PCIe, and
 * the same bits where the backend computes in bf16 anyway (fy_backend_preferred_weight_dtype). */
enum { FY_TRAIN_STREAMED = 0, FY_TRAIN_KEPT = 1, FY_TRAIN_KEPT_BF16 = 2 };
/* The memory plan under --cpu-mem: marks, unit 0 first, every unit whose optimizer state (master,
 * m, v) still fits in a pool of at most cpu_mem bytes together with the streaming regions; those
 * units' state stays in the pool across steps (no SSD traffic, written to the store at
 * checkpoints), the others stream from the store. With weight_dtype FY_DTYPE_BF16 the kept units
 * then get their bf16 copies, unit 0 first, while those fit too (a copy saves PCIe time, a kept
 * unit SSD time, which is dearer). cpu_mem 0: none. ckpt_slots as fy_train_regions takes it.
 * Returns how many units are kept. */
unsigned fy_train_plan_resident(const struct fy_gpt_config *c, int B, int T, int act_dtype,
                                uint64_t cpu_mem, int clip, unsigned prefetch, unsigned ckpt_slots,
                                const struct fy_train_swap *swap, int weight_dtype,
                                unsigned char *resident);
/* Units with a bf16 copy of their weights in the plan. */
unsigned fy_train_weight_copies(const struct fy_gpt_config *c, const unsigned char *resident);
/* Bytes of unit u's weights that the gpu worker is sent: its bf16 copy's, or its f32 master's. */
uint64_t fy_train_upload_bytes(const struct fy_gpt_config *c, const unsigned char *resident,
                               unsigned u);
/* The block gradient slots for that plan, up to `wanted`: more than the minimum only when every
 * unit's state is resident (then the optimizer is what the gpu may wait for, and more slots let it
 * lag behind the backward instead, its updates going lowest unit first), as many as still fit
 * cpu_mem, at most one per block. */
unsigned fy_train_plan_grad_slots(const struct fy_gpt_config *c, int B, int T, int act_dtype,
                                  uint64_t cpu_mem, int clip, unsigned prefetch, unsigned ckpt_slots,
                                  const struct fy_train_swap *swap, const unsigned char *resident,
                                  unsigned wanted);
/* Bytes a training step reads from and writes to the SSD store, from the state's layout
 * (common/optstate.h): the streamed units' master sections in the forward (a block's once more with
 * clipping, for the norm pass), their whole state read once, which also gives a block its weights
 * in the backward, and written once; with ckpt_ssd the
 * checkpoints x_0..x_{L-1} written in the forward and read in each backward pass; with swap the
 * blocks' SSD-placed internals likewise (at most: the last ones may still be in their slots). */
void fy_train_ssd_bytes(const struct fy_gpt_config *c, int B, int T, int act_dtype, int clip,
                        int ckpt_ssd, const struct fy_train_swap *swap,
                        const unsigned char *resident, uint64_t *read, uint64_t *write);

/* Rates a step's time is predicted from. */
struct fy_train_rates {
    double gpu_flops;           /* model FLOP/s with blocks recomputed (0: compute not predicted) */
    double h2d, d2h;            /* PCIe bytes/s to and from the GPU */
    double ssd_read, ssd_write; /* bytes/s; reads and writes share the disk */
    double opt_params;          /* AdamW parameters/s */
};
/* The rates measured on the reference machine (one H200, docs/benchmarks.md): bench-gpu's model
 * FLOP/s with blocks recomputed, PCIe one way at a time, the io engine on its disk, AdamW beside
 * the copies in bench-pipeline. */
struct fy_train_rates fy_train_reference_rates(void);

/* Predicted seconds per step of each resource and the largest (the bound) and its name. */
struct fy_train_prediction {
    double gpu_s, h2d_s, d2h_s, ssd_s, opt_s, step_s;
    const char *bound;
};
void fy_train_predict(const struct fy_gpt_config *c, int B, int T, int act_dtype, int clip,
                      int ckpt_ssd, const struct fy_train_swap *swap,
                      const unsigned char *resident, const struct fy_train_rates *rates,
                      struct fy_train_prediction *out);

/* Bytes a training step moves to the GPU and back over PCIe through the gpu worker's host
 * interface (weights as fy_train_upload_bytes, fp32 gradients, activations in act_dtype; with
 * clipping the second backward pass too; swap's internals down in the forward and up in each
 * backward pass), every input uploaded: the CUDA backend hands a unit's output to the next unit on
 * the device when the two are in flight together, which spares those uploads. */
void fy_train_pcie_bytes(const struct fy_gpt_config *c, int B, int T, int act_dtype, int clip,
                         const struct fy_train_swap *swap, const unsigned char *resident,
                         uint64_t *to_gpu, uint64_t *from_gpu);
uint64_t fy_train_resident_bytes(const struct fy_gpt_config *c, const unsigned char *resident);

/* Learning rate at a step (1-based): linear warmup, then cosine to lr * min_lr_ratio at o->steps. */
double fy_train_lr(const struct fy_train_opts *o, uint64_t step);

/* Creates every extent of the model in the store (`copies` of each unit's state, 2 or 1, and both
 * commit records), writes the initial weights (zero moments) and commits them as step 0. */
int fy_train_init_store(const struct fy_exec *x, struct fy_pool *pool, const struct fy_gpt_config *c,
                        uint64_t seed, unsigned copies, int timeout_ms);
/* The store's current commit (launcher/commit.h, fy_commit_read); `where` names the store in
 * messages. */
int fy_train_read_meta(const struct fy_exec *x, struct fy_pool *pool, const char *where,
                       struct fy_storemeta *meta, int timeout_ms);
/* Trains from the committed step in meta (its state checked against the record's digests first;
 * where damaged, from the commit before it) to o->steps, committing every o->checkpoint_every
 * steps, at the end and at a stop; meta follows the commits. */
int fy_train_run(const struct fy_exec *x, struct fy_pool *pool, struct fy_storemeta *meta,
                 const struct fy_tokfile *data, const struct fy_train_opts *o);
/* Writes the master weights of the committed step in meta to a weights file (common/ckpt.h),
 * each unit checked against the commit record's digest. A training run may go on meanwhile
 * (`beside`: the export works beside it, fy_session.beside): when it commits over the copy being
 * read, the export starts again from the newer step; where the step's state is damaged, from the
 * commit before it (fy_commit_export_next; at most FY_TRAIN_EXPORT_RETRIES times); meta follows. */
#define FY_TRAIN_EXPORT_RETRIES 3
int fy_train_export_store(const struct fy_exec *x, struct fy_pool *pool,
                          struct fy_storemeta *meta, const char *path, int overwrite, int beside,
                          int timeout_ms);
/* The same from the session that holds the run directory (nothing trains beside it). */
int fy_train_export(const struct fy_exec *x, struct fy_pool *pool, struct fy_storemeta *meta,
                    const char *path, int overwrite, int timeout_ms);

#endif
