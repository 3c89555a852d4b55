/* The plan for a training run's block internals (--act-plan; the planner is common/model/actplan.h):
 * which top blocks the gpu worker keeps on the device, which kinds of the other blocks the schedule
 * swaps to the pool or the SSD store (the rest are recomputed), and the predicted step.
 *
 * auto, from a measured block profile (struct fy_block_profile): two arrangements are planned and
 * B is taken only when predicted at least 5% faster than A (the cost model leaves out the small
 * stalls of a nearly balanced phase; see SWAP_MARGIN).
 *   A. no swapping: as many top blocks kept as the device memory left after the working buffers
 *      holds (profile gpu_free / set_bytes), the others recomputed;
 *   B. swapping: two sets fewer kept (the gpu worker computes swapped blocks in one set per call
 *      in flight), and the planner's auto placement for the other blocks.
 * The planner sees only the blocks that are not kept (n_layer of its profile = L - kept, no GPU
 * budget: a kept block keeps everything); the kept blocks' compute, the head's (estimated from the
 * profile's matmul rate), the weights, gradients and optimizer state traffic and the optimizer's
 * time go into the phases' other work (one-pass clipping's updates into the forward's; two-pass
 * clipping's norm pass is a phase of its own, added to the planner's step: no update overlaps it). The checkpoints are placed by the planner for its
 * accounting only: the schedule keeps them where --ckpt-place says. Where one product writes FC
 * and GELU (fc_gelu_fused), a block with one of the two swapped and the other not gets both
 * recomputed after planning (keeping one alone saves nothing) and is predicted again.
 * Forced modes: recompute keeps nothing and swaps nothing; host and ssd swap every swappable kind of
 * every block (FUYOU_TEST_ACT_MIX=SEED: a seeded mix of host, ssd and recompute per block and kind
 * instead, for tests) and keep nothing. No profile: auto keeps as many blocks as fit, swaps none.
 * Several gpu workers (ranks > 1): the profile is one worker's at its B / ranks sequences; every
 * phase takes at least its gradients' ring reduce over NVLink (CUDA: (ranks - 1) / ranks of them
 * at rates.nvlink), and host memory carries the other ranks' copies too (their weights and
 * activations, and where the gradients are summed in the pool, their gradients and the sum read
 * back); auto plans arrangement A alone (swapping is not supported across ranks). */
#ifndef FY_ACTPLACE_H
#define FY_ACTPLACE_H

#include <stdint.h>
#include <stdio.h>

#include "common/model/actplan.h"
#include "common/model/model.h"
#include "gpu_worker/backend.h"
#include "launcher/plan/plan.h"

struct fy_actplace_in {
    const struct fy_model_config *c;
    int B, T;  /* the step's batch (each gpu worker's: B / ranks) */
    int ranks; /* gpu workers (--gpus; 0 or 1: one). With several, the
                                           profile is one worker's at B / ranks; the GPUs' and
                                           each link's work is of that share, the weights, the
                                           gradients, the SSD's and the optimizer's the step's;
                                           nothing is swapped (auto keeps or recomputes) */
    enum fy_actplan_mode mode;
    const char *backend;                 /* "cpu" or "cuda": the saved regions' layout */
    const struct fy_block_profile *prof; /* auto: the measured block; NULL: none */
    int act_dtype, clip;
    int clip_hold;                 /* clipping in one pass: where the gradients are held
                                           (struct fy_plan_place.grad_hold: FY_HOLD_POOL, _GPU) */
    const unsigned char *resident; /* units whose optimizer state stays in the pool */
    int state_pieces;              /* the state slots hold pieces (struct fy_plan_place's):
                                           a streamed block's backward reads its master again,
                                           and one pass defers no update to the forward */
    int weight_dtype;              /* the weights sent to the gpu (struct fy_plan_shape's):
                                           with bf16, the units without a copy are converted on
                                           the opt worker for each pass */
    struct fy_plan_rates rates;    /* the SSD's and the optimizer's */
    int ssd_rates_from_steps;      /* rates.ssd_* are a past session's steps' (else the
                                           profile's: launcher/plan/steprates.h) */
    int opt_rate_from_steps;       /* rates.opt_params is too (else AdamW alone's) */
    uint64_t host_bytes;           /* pool room for swapped internals (beyond the checkpoints) */
    uint64_t ssd_bytes;            /* store room for them */
    unsigned act_ahead;            /* --act-ahead (0: the default): the SSD slots' count */
};

struct fy_actplace {
    /* [L][FY_ACT_KINDS] for blocks 1..L (NULL: nothing swapped); a kept block's kinds FY_ACT_GPU */
    unsigned char *place;
    struct fy_actplan_sizes sizes;
    struct fy_plan_swap swap;
    int keep;           /* top blocks the gpu worker keeps; -1: as many as fit (no profile) */
    int swap_sets;      /* the gpu worker readies swapping */
    double predicted_s; /* the step the planner predicts; 0: not predicted */
    double norm_s;      /* in it, a two-pass clipped step's norm pass (0: none) */
    /* the opt worker's busy seconds in it: AdamW, clipping's sums and the weights' conversions
     * for the GPU (0: not predicted) */
    double opt_s;
    /* auto's two arrangements (see above): kept blocks and predicted step of each (B: keep -1
     * when it was not planned) */
    int keep_a, keep_b;
    double step_a, step_b;
    /* auto: the planner's result over the blocks not kept (or NULL); a forced mode: its
     * placement's prediction (fy_actplace_predict) */
    struct fy_actplan *plan;
};

/* -EINVAL, -FY_EUSAGE (a usage error: activations that do not fit the budgets, forced or not even
 * auto's checkpoints), -ENOMEM, said. */
/* The fields a plan (launcher/plan/plan.h) decides: the shape, the mode, the backend, clipping and
 * where one pass holds the gradients, the state's pieces, --act-ahead; the rest zero for the
 * caller to fill. */
struct fy_actplace_in fy_actplace_in_of_plan(const struct fy_plan_in *in, const struct fy_plan *p);
int fy_actplace_plan(const struct fy_actplace_in *in, struct fy_actplace *out);
/* A forced mode's (recompute, host, ssd) predicted step, from the profile (none without one)
 * under in->resident as it is now (the optimizer state's residency is planned after a forced
 * placement): r->predicted_s and r->plan (its phases, for fy_actplace_log), said in one line. */
int fy_actplace_predict(const struct fy_actplace_in *in, struct fy_actplace *r);
void fy_actplace_release(struct fy_actplace *r);
/* The plan for people, one fy_info line each. */
void fy_actplace_log(const struct fy_actplace *r, const struct fy_actplace_in *in);
/* The plan as JSON (mode, kept blocks, masks per block; when auto, the block profile, the rates
 * and both arrangements' predictions it came from, and the planner's object). */
int fy_actplace_write_json(const struct fy_actplace *r, const struct fy_actplace_in *in, FILE *f);

#endif
