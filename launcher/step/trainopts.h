/* A training run's settings (struct fy_train_opts: what launcher/step/train runs and
 * launcher/step/sched schedules) and its learning rate at each step (--lr-schedule). */
#ifndef FY_TRAINOPTS_H
#define FY_TRAINOPTS_H

#include <stdint.h>
#include <stdio.h>

#include "common/model/actplan.h"

struct fy_metrics;
struct fy_steprates;

/* The learning rate's decay after the warmup (--lr-schedule). */
enum fy_lr_schedule { FY_LR_COSINE, FY_LR_LINEAR };

struct fy_train_opts {
    uint64_t steps;      /* train until this step (total, counting steps already in the store) */
    int batch, seq;      /* B sequences of T tokens per step */
    int ranks;           /* gpu workers, each with batch / ranks sequences (--gpus) */
    double lr;           /* peak learning rate */
    uint64_t warmup;     /* linear warmup steps */
    double min_lr_ratio; /* the decay's floor: lr * min_lr_ratio */
    enum fy_lr_schedule schedule; /* the decay after the warmup (cosine: 0) */
    uint64_t seed;                /* data order */
    /* the progress line's epoch: steps an epoch (fy_sampler_epoch_steps), and the epochs of
     * --epochs (0: counted in steps); documents: the batches pack documents (its line says the
     * epoch even without --epochs) */
    uint64_t epoch_steps, epochs;
    int documents;
    uint64_t eval_every; /* 0: only at the end */
    uint64_t eval_batches;
    uint64_t checkpoint_every; /* make the store durable every N steps (and at the end) */
    int timeout_ms;            /* per request */
    int overlap; /* 1: overlap updates with the backward and prefetch weights; 0: serial */
    /* one JSON line per step appended there (NULL: none); lines of steps after the commit a
     * run starts from are dropped first, as those steps are trained again; too many lines
     * waiting for room there stop the run at a commit (launcher/step/metrics.h) */
    struct fy_metrics *metrics;
    FILE *trace; /* Chrome trace-event JSON of every request (Perfetto); NULL: none */
    /* per unit: FY_PLAN_STREAMED, _KEPT or _KEPT_BF16 (struct fy_plan.resident) */
    const unsigned char *resident;
    double clip_grad_norm; /* > 0: clip the global gradient norm to this */
    /* one-pass clipping (a pool laid out with a gradhold region) holds the blocks' gradients in
     * the gpu worker instead (train.grad_hold in its configuration), each sent to a grads slot
     * when its update runs */
    int grad_hold_gpu;
    /* the state slots hold a piece each (struct fy_plan_place's state_pieces): a streamed unit's
     * state read, updated and written piece by piece after its gradient is in */
    int state_pieces;
    /* 1: the blocks' input checkpoints go to the SSD store (--ckpt-place ssd) */
    int block_inputs_ssd;
    unsigned act_ahead; /* --act-ahead: blocks whose activations on the store the backward reads
                              ahead (1..FY_PLAN_ACT_AHEAD_MAX; 0: FY_PLAN_ACT_AHEAD_DEFAULT) */
    int act_dtype;      /* activations in the pool: FY_DTYPE_F32 or _BF16, the backend's choice
                              (fy_backend_preferred_act_dtype; the gpu worker reads
                              train.act_dtype) */
    /* the weights the gpu worker is sent (struct fy_plan_shape.weight_dtype): FY_DTYPE_BF16, every
     * unit's in bf16 (its copy, or converted by the opt worker into a weights slot); else f32 */
    int weight_dtype;
    /* The blocks' swapped internals: place[l * FY_ACT_KINDS + k] for block l + 1 (common/
     * actplan.h): swappable kinds placed FY_ACT_HOST stay in the pool from the forward to the
     * backward, FY_ACT_SSD ones go to the store and come back; anything else is recomputed (NULL:
     * all). saved_sizes: the kinds' bytes in the backend's layout (fy_actplan_sizes_backend). The
     * pool must have been laid out with the fy_plan_swap_of this gives. */
    const unsigned char *act_place;
    struct fy_actplan_sizes saved_sizes;
    const volatile int
        *stop; /* set asynchronously to stop at the next step boundary; may be NULL */
    /* What the activation plan predicted from the profile, set beside the session's second step
     * (its first is a warm-up) in the log's plan check: the step's seconds (0: not predicted, no
     * check), the SSD's read and write rates (bytes/s) and AdamW's parameters/s it assumed, and
     * the opt worker's busy seconds it gave the step (AdamW, clipping's sums, the conversions of
     * weights for the GPU). */
    double plan_step_s, plan_ssd_read, plan_ssd_write, plan_opt_params, plan_opt_s;
    int plan_ssd_from_steps; /* the plan's SSD rates were a past session's steps' (not the profile's) */
    int plan_opt_from_steps; /* its AdamW rate too (not the profile's, of AdamW alone) */
    /* counts the SSD's bytes and busy seconds of each step after the session's first (a warm-up)
     * for the next session's plan (launcher/plan/steprates.h); NULL: not counted */
    struct fy_steprates *steps_seen;
};

/* Learning rate at a step (1-based): linear warmup to lr at step o->warmup, then the decay toward
 * min = lr * min_lr_ratio. Cosine reaches min at step o->steps. Linear is transformers' linear
 * schedule: the first step after the warmup takes lr, and each following one (lr - min) /
 * (steps - warmup) less, so that the step after o->steps would take min (with no warmup, step k of
 * N takes min + (lr - min) * (N - k + 1) / N). */
double fy_train_lr(const struct fy_train_opts *o, uint64_t step);
/* The schedule's name (cosine, linear) and back: 0, or -EINVAL for another name. */
const char *fy_train_lr_schedule_name(enum fy_lr_schedule s);
int fy_train_lr_schedule_parse(const char *name, enum fy_lr_schedule *out);

#endif
