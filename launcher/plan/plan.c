/* The planner of a training run (launcher/plan/plan.h). */
#include "launcher/plan/plan.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"
#include "common/formats/ckpt.h"
#include "common/base/config.h"
#include "common/base/dtype.h"
#include "common/base/knobs.h"
#include "common/base/log.h"
#include "common/model/optstate.h"
#include "gpu_worker/backend.h"

/* ---- the plan -------------------------------------------------------------------------------- */

/* Marks units of p->resident from FY_PLAN_STREAMED (or _KEPT) up to `mark`, unit 0 first, while a
 * pool with the gradient slots the floor took (plan_floor) still fits cpu_mem; returns how many it
 * marked. */
static unsigned plan_mark(const struct fy_plan_in *in, struct fy_plan *p, unsigned char mark)
{
    unsigned count = 0;
    struct fy_plan_place least = p->place;
    for (unsigned u = 0; u < fy_model_unit_count(in->shape.c); u++) {
        if (p->resident[u] != mark - 1)
            continue;
        p->resident[u] = mark;
        if (fy_plan_pool_bytes(&in->shape, &least) > in->cpu_mem)
            p->resident[u] = mark - 1;
        else
            count++;
    }
    return count;
}

/* The floor's tries, in order: state slots of a unit's whole state with FY_PLAN_GRAD_SLOTS_FLOOR
 * gradient slots, then two; state slots of a piece with the floor's slots, two, and without
 * clipping one (its norm pass and held gradients take slots 1 and 2); never more slots than
 * --grad-slots. Try i's placement into p->place (0 where the test hook has the state in pieces
 * and the try is of whole units). */
static const struct {
    int pieces;
    unsigned slots;
} floor_tries[] = {
    {0, FY_PLAN_GRAD_SLOTS_FLOOR}, {0, 2}, {1, FY_PLAN_GRAD_SLOTS_FLOOR}, {1, 2}, {1, 1}};
#define FLOOR_TRIES (sizeof floor_tries / sizeof floor_tries[0])

static int floor_try(const struct fy_plan_in *in, unsigned i, struct fy_plan *p)
{
    if (fy_knob_test_state_pieces() && !floor_tries[i].pieces) /* pieces whatever the room */
        return 0;
    unsigned asked =
        in->grad_slots >= FY_PLAN_GRAD_SLOTS_MIN ? in->grad_slots : FY_PLAN_GRAD_SLOTS_FLOOR;
    unsigned least = in->shape.clip ? 2 : 1, slots = floor_tries[i].slots;
    slots = slots < asked ? slots : asked;
    /* whole units' state slots take two gradient slots at least (backward_blocks) */
    slots = slots < least ? least : slots < 2 && !floor_tries[i].pieces ? 2 : slots;
    p->place.state_pieces = floor_tries[i].pieces;
    p->place.grad_slots = slots;
    return 1;
}

/* Whether try i's streaming regions with nothing kept fit cpu_mem (none given: they do). */
static int floor_fits(const struct fy_plan_in *in, unsigned i, struct fy_plan *p)
{
    return floor_try(in, i, p) &&
           (in->cpu_mem == 0 || fy_plan_pool_bytes(&in->shape, &p->place) <= in->cpu_mem);
}

/* The streaming regions with nothing kept (p->resident all streamed): the first try that fits
 * cpu_mem, the last where none does (the plan then does not fit). */
static void plan_floor(const struct fy_plan_in *in, struct fy_plan *p)
{
    for (unsigned i = 0; i < FLOOR_TRIES; i++)
        if (floor_fits(in, i, p))
            return;
}

/* The kept units, unit 0 first, with the streaming regions of p->place; returns how many. */
static unsigned plan_keep(const struct fy_plan_in *in, struct fy_plan *p)
{
    memset(p->resident, FY_PLAN_STREAMED, fy_model_unit_count(in->shape.c));
    unsigned kept = plan_mark(in, p, FY_PLAN_KEPT);
    if (in->shape.weight_dtype == FY_DTYPE_BF16)
        plan_mark(in, p, FY_PLAN_KEPT_BF16);
    return kept;
}

/* The state's residency (fy_plan_make) with the checkpoints and swap of p->place: the streaming
 * regions (the state slots and the gradient slots), p->resident, and the units kept. Of the
 * floor's tries that fit cpu_mem, the one with which the units kept in the room it leaves give the
 * fastest predicted step, the first of those that tie (whole units' state slots, more gradient
 * slots): state slots of a piece and fewer gradient slots leave room for more state, which can
 * save more SSD time than a block's master read twice and the wait for the updates cost. */
static unsigned plan_resident(const struct fy_plan_in *in, struct fy_plan *p)
{
    unsigned units = fy_model_unit_count(in->shape.c);
    memset(p->resident, FY_PLAN_STREAMED, units);
    plan_floor(in, p);
    if (in->cpu_mem == 0 || in->floor_only)
        return 0;
    unsigned char *best = malloc(units);
    if (best == NULL) /* the floor's slots alone */
        return plan_keep(in, p);
    struct fy_plan_place chosen = p->place;
    unsigned kept = 0;
    double best_s = INFINITY;
    for (unsigned i = 0; i < FLOOR_TRIES; i++) {
        if (!floor_fits(in, i, p))
            continue;
        unsigned k = plan_keep(in, p);
        struct fy_plan_prediction pr;
        fy_plan_predict(&in->shape, &p->place, &in->rates, &pr);
        if (pr.step_s < best_s * (1 - 1e-9)) {
            best_s = pr.step_s;
            chosen = p->place;
            kept = k;
            memcpy(best, p->resident, units);
        }
    }
    if (best_s < INFINITY) {
        p->place = chosen;
        memcpy(p->resident, best, units);
    } else { /* the floor did not fit: nothing kept */
        plan_floor(in, p);
        memset(p->resident, FY_PLAN_STREAMED, units);
    }
    free(best);
    return kept;
}

/* --ckpt-place: where the blocks' input checkpoints go (p->place.block_inputs_slots). auto:
 * everything in the pool when it all fits, no SSD traffic at all; otherwise the pool is better
 * spent on optimizer state: a streamed unit moves 28 bytes over the SSD per 12 of state each step
 * (weights read, state read and written), a checkpoint 2 per byte. */
static void plan_checkpoints(const struct fy_plan_in *in, struct fy_plan *p)
{
    int ssd = in->block_inputs_place == FY_BLOCK_INPUTS_SSD;
    if (in->block_inputs_place == FY_BLOCK_INPUTS_AUTO) {
        p->place.block_inputs_slots = 0;
        unsigned all = plan_resident(in, p);
        ssd = in->cpu_mem != 0 && all < fy_model_unit_count(in->shape.c);
        if (in->say)
            fy_info("plan: checkpoints %s (--ckpt-place auto: %s)",
                    ssd ? "on the SSD store" : "in the shared pool",
                    ssd ? "the optimizer state does not all fit --cpu-mem beside them"
                        : "they fit beside all the optimizer state");
    }
    p->place.block_inputs_slots = ssd ? fy_plan_spill_slots(in->act_ahead) : 0;
}

/* The block gradient slots, up to in->grad_slots: more than the floor's (plan_floor) only when
 * every unit's state is resident (then the optimizer is what the gpu may wait for, and more slots
 * let it lag behind the backward instead, its updates going lowest unit first), as many as still
 * fit cpu_mem, at most one per block. */
static unsigned plan_grad_slots(const struct fy_plan_in *in, const struct fy_plan *p)
{
    const struct fy_model_config *c = in->shape.c;
    unsigned units = fy_model_unit_count(c), slots = p->place.grad_slots;
    for (unsigned u = 0; u < units; u++)
        if (!p->resident[u])
            return slots; /* streamed blocks are paced by their two state slots anyway */
    unsigned most = c->n_layer < FY_PLAN_GRAD_SLOTS_MAX ? c->n_layer : FY_PLAN_GRAD_SLOTS_MAX;
    most = in->grad_slots < most ? in->grad_slots : most;
    struct fy_plan_place more = p->place;
    for (more.grad_slots = slots + 1; more.grad_slots <= most; more.grad_slots++) {
        if (fy_plan_pool_bytes(&in->shape, &more) > in->cpu_mem)
            break;
        slots = more.grad_slots;
    }
    return slots;
}

/* What the GPU arena takes (each GPU's, for its B / ranks sequences), where the backend's memory
 * is modelled (returns 1; 0 where it is not, or no backend is named): its working buffers, a
 * block's internals (a set), and what the plan needs: the working buffers, a set per call in
 * flight with every block's internals swapped (--act-plan host or ssd), and with `hold` one
 * pass's held gradients. */
static int gpu_bytes(const struct fy_plan_in *in, int hold, uint64_t *working, uint64_t *set,
                     uint64_t *need)
{
    const struct fy_plan_shape *s = &in->shape;
    *working = *set = *need = 0;
    if (in->backend == NULL ||
        !fy_backend_gpu_bytes(in->backend, s->c, fy_plan_rank_batch(s), s->T, working, set))
        return 0;
    int forced = in->act_mode == FY_ACTPLAN_HOST || in->act_mode == FY_ACTPLAN_SSD;
    *need =
        *working + (forced ? FY_BACKEND_QUEUE * *set : 0) + (hold ? fy_plan_hold_bytes(s->c) : 0);
    return 1;
}

/* Room in the GPU arena for one pass's held gradients beside what the plan needs there: within
 * the --gpu-mem given where the backend's memory is modelled (without one, the arena is sized to
 * the working buffers alone); the CPU backend holds them in the gpu worker's own memory. Never
 * with several gpu workers: gradients held on the GPUs are not summed across them. */
static int hold_fits_gpu(const struct fy_plan_in *in)
{
    uint64_t working, set, need;
    if (in->backend == NULL || fy_plan_ranks(&in->shape) > 1)
        return 0;
    if (!gpu_bytes(in, 1, &working, &set, &need))
        return 1;
    return in->gpu_mem > 0 && need <= in->gpu_mem;
}

/* --clip-mode one-pass with --clip-hold auto: the held gradients in the pool where it has room for
 * them beside the kept state, else in the GPU arena where it has room, else in the pool with fewer
 * units kept (refused where even that does not fit). */
static void one_pass_hold(const struct fy_plan_in *in, struct fy_plan *p)
{
    p->place.grad_hold = FY_HOLD_POOL;
    if (in->cpu_mem == 0 || fy_plan_pool_bytes(&in->shape, &p->place) <= in->cpu_mem)
        return;
    if (hold_fits_gpu(in)) {
        p->place.grad_hold = FY_HOLD_GPU;
        return;
    }
    p->kept = plan_resident(in, p);
}

/* With clipping and --clip-mode auto, one backward pass or two (p->place.grad_hold), where one
 * pass is predicted no slower than two: the gradients held in the pool where it has room for them
 * beside the kept state within --cpu-mem (--clip-hold auto or pool); else in the GPU arena where it
 * has room (auto or gpu); else, with --cpu-mem, in the pool in place of some kept units' state
 * where that is predicted faster than two passes keeping them (auto or pool). Without --cpu-mem,
 * not in the pool: 4 bytes a parameter of pinned memory (27 GiB at 7B) that no budget allowed.
 * One pass in the pool leaves the gradient slots unused but for the embeddings' and the final
 * unit's. What did not fit is kept for the plan to say (one_pass_pool_bytes, one_pass_gpu_short). */
static void plan_clip_mode(const struct fy_plan_in *in, struct fy_plan *p)
{
    if (!in->shape.clip || in->clip_mode == FY_CLIP_TWO_PASS)
        return;
    if (in->clip_mode == FY_CLIP_ONE_PASS) {
        if (in->clip_hold == FY_CLIP_HOLD_AUTO) /* the pool beside the kept state, the GPU, or the
                                                   pool before the kept state */
            one_pass_hold(in, p);
        return; /* pool or gpu: placed before the kept state */
    }
    struct fy_plan_place one = p->place;
    struct fy_plan_prediction once, twice;
    fy_plan_predict(&in->shape, &p->place, &in->rates, &twice);
    if (in->clip_hold != FY_CLIP_HOLD_GPU) {
        one.grad_hold = FY_HOLD_POOL;
        uint64_t bytes = fy_plan_pool_bytes(&in->shape, &one);
        if (in->cpu_mem != 0 && bytes <= in->cpu_mem) {
            fy_plan_predict(&in->shape, &one, &in->rates, &once);
            p->place.grad_hold = once.step_s <= twice.step_s ? FY_HOLD_POOL : FY_HOLD_NONE;
            return;
        }
        p->one_pass_pool_bytes = bytes;
    }
    if (in->clip_hold != FY_CLIP_HOLD_POOL) {
        one.grad_hold = FY_HOLD_GPU;
        if (hold_fits_gpu(in)) {
            fy_plan_predict(&in->shape, &one, &in->rates, &once);
            p->place.grad_hold = once.step_s <= twice.step_s ? FY_HOLD_GPU : FY_HOLD_NONE;
            p->one_pass_pool_bytes = 0;
            return;
        }
        p->one_pass_gpu_short = fy_plan_ranks(&in->shape) == 1; /* several: not a matter of room */
    }
    if (in->clip_hold == FY_CLIP_HOLD_GPU || in->cpu_mem == 0)
        return;
    /* no room beside the kept state: one pass with the held gradients planned first, fewer units
     * kept, where that is predicted faster than two passes with them all */
    unsigned units = fy_model_unit_count(in->shape.c), kept = p->kept;
    unsigned char *was = malloc(units);
    if (was == NULL) /* two passes, as planned */
        return;
    memcpy(was, p->resident, units);
    struct fy_plan_shape unclipped = in->shape;
    unclipped.clip = 0;
    struct fy_plan_prediction none;
    fy_plan_predict(&unclipped, &p->place, &in->rates, &none); /* with every unit kept that fits */
    p->place.grad_hold = FY_HOLD_POOL;
    unsigned fewer = plan_resident(in, p);
    fy_plan_predict(&in->shape, &p->place, &in->rates, &once);
    if (fy_plan_pool_bytes(&in->shape, &p->place) <= in->cpu_mem && once.step_s < twice.step_s) {
        p->kept = fewer;
        p->clip_kept_fewer = kept - fewer;
        p->two_pass_step_s = twice.step_s;
        p->unclipped_step_s = none.step_s;
        p->one_pass_pool_bytes = 0;
        p->one_pass_gpu_short = 0;
    } else {
        memcpy(p->resident, was, units);
        p->place.grad_hold = FY_HOLD_NONE;
    }
    free(was);
}

static uint64_t store_bytes(const struct fy_plan_in *in, const struct fy_plan *p)
{
    const struct fy_model_config *c = in->shape.c;
    uint64_t state = 0;
    for (unsigned u = 0; u < fy_model_unit_count(c); u++)
        state += fy_optstate_bytes(c, u);
    return state * in->state_copies + 2 * FY_COMMIT_RECORD_BYTES +
           fy_plan_swap_store_bytes(&p->place.swap, c->n_layer) +
           (p->place.block_inputs_slots ? fy_plan_block_inputs_store_bytes(&in->shape) : 0);
}

/* The GPU arena against --gpu-mem (gpu_bytes). */
static void plan_gpu(const struct fy_plan_in *in, struct fy_plan *p)
{
    int hold = in->shape.clip && p->place.grad_hold == FY_HOLD_GPU;
    p->gpu_modelled = gpu_bytes(in, hold, &p->gpu_working, &p->gpu_set, &p->gpu_need);
    p->fits_gpu = !p->gpu_modelled || in->gpu_mem == 0 || p->gpu_need <= in->gpu_mem;
}

/* What several gpu workers cannot do (yet): -FY_EUSAGE, said. */
static int check_ranks(const struct fy_plan_in *in)
{
    const struct fy_plan_shape *s = &in->shape;
    int ranks = fy_plan_ranks(s);
    if (ranks == 1)
        return 0;
    FY_USAGE(s->B % ranks == 0,
             "--gpus %d: the batch of %d sequences does not split evenly over "
             "%d GPUs (each computes B / N of every step): give a --batch that %d divides, such as "
             "%d",
             ranks, s->B, ranks, ranks, (s->B + ranks - 1) / ranks * ranks);
    FY_USAGE(!(s->clip && in->clip_hold == FY_CLIP_HOLD_GPU),
             "--clip-hold gpu with --gpus %d: "
             "gradients held on the GPUs are not summed across them (not supported): use "
             "--clip-hold auto or pool",
             ranks);
    FY_USAGE(in->act_mode != FY_ACTPLAN_HOST && in->act_mode != FY_ACTPLAN_SSD,
             "--act-plan %s with --gpus %d: swapping the blocks' internals is not supported with "
             "several GPUs yet: use --act-plan auto or recompute",
             fy_actplan_mode_name(in->act_mode), ranks);
    return 0;
}

int fy_plan_make(const struct fy_plan_in *in, const struct fy_plan_acts *acts, struct fy_plan *p)
{
    const struct fy_plan_shape *s = &in->shape;
    memset(p, 0, sizeof *p);
    FY_TRY(check_ranks(in));
    p->resident = calloc(fy_model_unit_count(s->c), 1);
    FY_REQUIRE(p->resident != NULL, -ENOMEM, "plan: out of memory");
    p->place.resident = p->resident;
    p->place.prefetch = in->prefetch;
    p->place.reduce =
        in->backend != NULL && strcmp(in->backend, "cuda") == 0 ? FY_REDUCE_NVLINK : FY_REDUCE_POOL;
    int forced = in->act_mode == FY_ACTPLAN_HOST || in->act_mode == FY_ACTPLAN_SSD;
    if (forced && acts != NULL) /* placed whatever the room; the residency plans around them */
        FY_TRY(acts->place(acts->ctx, in, p));
    /* --clip-mode one-pass with --clip-hold pool or gpu: the held gradients in the pool before
     * the kept state, which takes what is left, or on the GPU (auto: plan_clip_mode) */
    if (s->clip && in->clip_mode == FY_CLIP_ONE_PASS && in->clip_hold != FY_CLIP_HOLD_AUTO)
        p->place.grad_hold = in->clip_hold == FY_CLIP_HOLD_GPU ? FY_HOLD_GPU : FY_HOLD_POOL;
    plan_checkpoints(in, p);
    p->kept = plan_resident(in, p);
    plan_clip_mode(in, p);       /* before auto's activations, which take the room left */
    if (!forced && acts != NULL) /* in the room that the kept state and the streaming leave */
        FY_TRY(acts->place(acts->ctx, in, p));
    p->place.grad_slots = plan_grad_slots(in, p);
    p->weight_copies = fy_plan_weight_copies(s->c, p->resident);
    p->resident_bytes = fy_plan_resident_bytes(s->c, p->resident);
    fy_plan_regions(s, &p->place, p->regions, &p->n_regions);
    p->pool_bytes = fy_pool_layout_size(p->regions, p->n_regions);
    p->fits_cpu = in->cpu_mem == 0 || p->pool_bytes <= in->cpu_mem;
    p->store_bytes = store_bytes(in, p);
    plan_gpu(in, p);
    fy_plan_traffic(s, &p->place, &p->traffic);
    fy_plan_predict(s, &p->place, &in->rates, &p->predicted);
    return 0;
}

int fy_plan_check_gpu(const struct fy_plan_in *in, const struct fy_plan *p)
{
    const struct fy_plan_shape *s = &in->shape;
    uint64_t working, set, need;
    if (p != NULL) {
        working = p->gpu_working;
        need = p->gpu_need;
        if (p->fits_gpu)
            return 0;
    } else {
        if (in->gpu_mem == 0 || in->backend == NULL ||
            !fy_backend_gpu_bytes(in->backend, s->c, fy_plan_rank_batch(s), s->T, &working, &set))
            return 0;
        need = working;
        if (need <= in->gpu_mem)
            return 0;
    }
    char need_s[32], working_s[32], budget[32];
    fy_format_size(need, need_s, sizeof need_s);
    fy_format_size(working, working_s, sizeof working_s);
    fy_format_size(in->gpu_mem, budget, sizeof budget);
    fy_error("plan does not fit the GPU: batch %d x %d needs %s of GPU memory (the model's working "
             "buffers %s%s) but --gpu-mem is %s: raise --gpu-mem or lower the batch (fuyou-launch "
             "plan prints the largest batch that fits)",
             fy_plan_rank_batch(s), s->T, need_s, working_s,
             need > working ? ", with the swapped internals' sets or the held gradients" : "",
             budget);
    return -FY_EUSAGE;
}

void fy_plan_release(struct fy_plan *p)
{
    free(p->resident);
    p->resident = NULL;
    p->place.resident = NULL;
}
