/* The planner of a training run, one sequence for train, plan and profile (fy_plan_make): from the
 * run's shape, its options, its budgets and the machine's rates, where each unit's optimizer state
 * lives (kept in the shared pool, with or without a bf16 weights copy, or streamed from the SSD
 * store), where the checkpoints go, the blocks' swapped internals (the activation plan's part,
 * which the caller plugs in: launcher/cli/actsetup.h with the workers' profile), the block gradient
 * slots, the pool's regions, the bytes a step moves over the SSD and PCIe, what the store and the
 * GPU take, and the predicted time per resource. Its parts: the step's shape, the placement and
 * the pool's regions (launcher/plan/plan_layout.h, which the training schedule reads the regions
 * back with: fy_plan_layout_read), the machine's rates (plan_rates.h), the traffic and prediction
 * (plan_traffic.h), and the plan said for people (plan_describe.h). */
#ifndef FY_PLAN_H
#define FY_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "common/model/actplan.h"
#include "common/model/model.h"
#include "launcher/plan/plan_layout.h"
#include "launcher/plan/plan_rates.h"
#include "launcher/plan/plan_traffic.h"

/* --clip-mode: how a clipped step learns the gradient norm before its first update. One pass
 * holds every block's f32 gradient in the pool through the backward (fy_plan_hold_bytes) and
 * updates after it; two passes run the backward twice, the first for the norm alone. auto: one
 * pass where the pool has room for the held gradients within --cpu-mem. */
enum { FY_CLIP_AUTO = 0, FY_CLIP_ONE_PASS = 1, FY_CLIP_TWO_PASS = 2 };
/* --clip-hold: where one pass holds the gradients (FY_HOLD_*, launcher/plan/plan_layout.h). */
enum { FY_CLIP_HOLD_AUTO = 0, FY_CLIP_HOLD_POOL = 1, FY_CLIP_HOLD_GPU = 2 };

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
    unsigned char *resident; /* per unit, FY_PLAN_*: place.resident (fy_plan_release frees it) */
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
void fy_plan_release(struct fy_plan *p);
/* The GPU against --gpu-mem where the backend's memory is modelled, as the gpu worker would find
 * it, but before any worker starts: with p NULL the working buffers of one gpu worker's share of
 * the batch (before the plan, whose activation step profiles a block on the GPU), else p's whole
 * need (p->fits_gpu). 0, or -FY_EUSAGE (said: raise --gpu-mem or lower the batch). */
int fy_plan_check_gpu(const struct fy_plan_in *in, const struct fy_plan *p);

#endif
