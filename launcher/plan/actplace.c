/* A training run's plan for the blocks' internals: forced placements, and auto's choice between
 * keeping alone and keeping fewer while the planner swaps kinds of the rest. See actplace.h. */
#include "launcher/plan/actplace.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/arch/arch.h"
#include "common/base/check.h"
#include "common/base/config.h"
#include "common/base/knobs.h"
#include "common/base/log.h"
#include "common/model/optstate.h"
#include "common/base/synth.h"

/* Forced host or ssd: every swappable kind there, or the test hook's seeded mix. */
static int plan_forced(const struct fy_actplace_in *in, struct fy_actplace *out)
{
    unsigned L = in->c->n_layer;
    FY_USAGE(fy_model_arch(in->c)->swaps_internals,
             "--act-plan %s: %s blocks keep their internals on the GPU or recompute them, never "
             "swap them: use auto or recompute",
             fy_actplan_mode_name(in->mode), fy_model_arch(in->c)->label);
    out->place = calloc((size_t)L * FY_ACT_KINDS + 1, 1);
    FY_REQUIRE(out->place != NULL, -ENOMEM, "train: out of memory for the activation plan");
    uint64_t seed;
    const char *mix = fy_knob_test_act_mix(&seed);
    static const int choice[3] = {FY_ACT_HOST, FY_ACT_SSD, FY_ACT_RECOMPUTE};
    for (unsigned l = 0; l < L; l++)
        for (int k = 0; k < FY_ACT_KINDS; k++) {
            int at = k == FY_ACT_CKPT ? FY_ACT_HOST : FY_ACT_RECOMPUTE;
            if (fy_actplan_kind_swappable(k))
                at = in->mode == FY_ACTPLAN_HOST ? FY_ACT_HOST : FY_ACT_SSD;
            if (mix != NULL && fy_actplan_kind_swappable(k))
                at = choice[fy_synth_mix(seed * 1000003u + l * FY_ACT_KINDS + k) % 3];
            out->place[l * FY_ACT_KINDS + k] = (unsigned char)at;
        }
    out->keep = 0;
    out->swap_sets = 1;
    return 0;
}

/* Swapping is taken only when predicted at least this much faster than keeping alone: the cost
 * model takes each phase's busiest link as fully overlapped, but a forward whose copies out nearly
 * match its compute stalls a little at every block (on the H200, 1.3B at batch 64: predicted 4%
 * faster, measured 3.6% slower). */
#define SWAP_MARGIN 0.05

/* The head's products and its softmax over the vocabulary ran at half the QKV product's rate on
 * the H200 (1.3B, batch 64: 108 ms for 41 TFLOP), so it is estimated at that share. */
#define HEAD_RATE_SHARE 0.5

/* Host memory bytes an AdamW update moves per parameter: it reads the f32 gradient and the
 * state's sections and writes the latter (common/model/optstate.h: 28; a bf16 weights copy writes 2
 * more). The profile times AdamW alone, which gives host memory's bandwidth as this many bytes per
 * parameter at the measured rate: the copies to and from the pool share it with AdamW (actplan.h,
 * "mem"). */
static double adamw_bytes(const struct fy_model_config *c)
{
    return fy_optstate_update_param_bytes(FY_DTYPE_F32, c->optim_state);
}

static double mem_Bps(const struct fy_actplace_in *in)
{
    return in->rates.opt_params * adamw_bytes(in->c);
}

/* The opt worker's rate for the same bytes: as past steps ran AdamW where they measured it
 * (struct fy_plan_rates's opt_in_steps), so that its conversions slow down with its updates. */
static double opt_worker_Bps(const struct fy_actplace_in *in)
{
    return fy_plan_rates_opt_worker(&in->rates) * adamw_bytes(in->c);
}

static uint64_t unit_f32(const struct fy_model_config *c, unsigned u)
{
    return fy_model_unit_params(c, u) * 4;
}

static int ranks_of(const struct fy_actplace_in *in) { return in->ranks > 1 ? in->ranks : 1; }

/* Each gpu worker's sequences of a step. */
static int rank_batch(const struct fy_actplace_in *in) { return in->B / ranks_of(in); }

/* With several ranks, the gradients are reduced over NVLink (the CUDA backend), else each rank
 * adds its own in the pool. */
static int reduce_nvlink(const struct fy_actplace_in *in)
{
    return ranks_of(in) > 1 && in->backend != NULL && strcmp(in->backend, "cuda") == 0;
}

/* The f32 gradients of a phase: the head's in the forward, the blocks' and the embeddings' in a
 * backward pass. */
static uint64_t phase_grads(const struct fy_model_config *c, int forward)
{
    unsigned L = c->n_layer;
    return forward ? unit_f32(c, L + 1) + (uint64_t)c->vocab * c->n_embd * 4
                   : L * unit_f32(c, 1) + unit_f32(c, 0);
}

/* A phase's gradients reduced over NVLink with several ranks (0 otherwise). */
static double nvlink_s(const struct fy_actplace_in *in, uint64_t grads)
{
    int n = ranks_of(in);
    if (!reduce_nvlink(in) || !(in->rates.nvlink > 0))
        return 0;
    return (double)grads * (n - 1) / n / in->rates.nvlink;
}

/* The other ranks' copies through host memory in a phase that moves `grads` of gradients and
 * (for the planned blocks) `inputs` bytes of the blocks' input checkpoints each way: their weights
 * and activations, and with the gradients summed in the pool, their gradients and the sum read
 * back. */
static void other_ranks(const struct fy_actplace_in *in, uint64_t grads, uint64_t inputs,
                        struct fy_actplan_other *o)
{
    uint64_t others = (uint64_t)ranks_of(in) - 1;
    if (others == 0 || (o->h2d == 0 && o->d2h == 0))
        return;
    uint64_t copies = o->h2d + o->d2h + inputs;
    o->mem += reduce_nvlink(in) ? others * (copies - grads) : others * (copies + grads);
}

/* What the phases carry besides the planned blocks' internals, with `keep` top blocks kept and
 * `planned` blocks under the planner; *norm, what a two-pass clipped step's first backward pass
 * carries (all zero otherwise): a phase of its own, since no update may start before its norm. */
static void other_work(const struct fy_actplace_in *in, int keep, int planned,
                       struct fy_actplan_other *fwd, struct fy_actplan_other *bwd,
                       struct fy_actplan_other *norm)
{
    const struct fy_model_config *c = in->c;
    const struct fy_block_profile *p = in->prof;
    unsigned L = c->n_layer, units = fy_model_unit_count(c);
    /* one-pass clipping updates after the backward, under the next forward: the updates' state
     * traffic and AdamW go to the forward's phase */
    int hold = in->clip && in->clip_hold, two_pass = in->clip && !hold;
    struct fy_actplan_other *upd = hold ? fwd : bwd;
    double N = (double)rank_batch(in) * in->T; /* one gpu worker's */
    uint64_t act = fy_plan_act_bytes(c, rank_batch(in), in->T, in->act_dtype);
    memset(fwd, 0, sizeof *fwd);
    memset(bwd, 0, sizeof *bwd);
    memset(norm, 0, sizeof *norm);
    for (unsigned u = 0; u < units; u++) {
        fwd->h2d += fy_plan_upload_bytes(c, in->weight_dtype, u); /* every unit's, in the forward */
        if (in->resident == NULL || !in->resident[u]) {
            int block = fy_model_unit_kind(c, u) == FY_UNIT_BLOCK;
            uint64_t master = fy_optstate_master_bytes(c, u);
            fwd->ssd_read += master;
            upd->ssd_read += fy_optstate_bytes(c, u);
            /* the norm pass reads a block's master; one pass then updates the block in the next
             * forward, which reads its state in place of its master (with --prefetch up to 2;
             * not with the state in pieces, which updates after the backward) */
            (two_pass ? norm : bwd)->ssd_read += in->clip && block ? master : 0;
            fwd->ssd_read -= hold && block && !in->state_pieces ? master : 0;
            /* with the state in pieces, the backward that updates reads a block's master for its
             * weights, the state after */
            bwd->ssd_read += in->state_pieces && block && !hold ? master : 0;
            upd->ssd_write += fy_optstate_bytes(c, u);
        }
    }
    /* the head (forward and backward in one request): its gradients come home in the forward */
    uint64_t wte = (uint64_t)c->vocab * c->n_embd * 4;
    fwd->d2h += act + unit_f32(c, L + 1) + wte;
    if (hold && in->clip_hold == FY_HOLD_GPU) /* the held gradients sent for their updates */
        fwd->d2h += L * unit_f32(c, 1);
    double head_flops = 6.0 * N * c->n_embd * c->vocab;
    double rate = p->flops_per_s > 0 ? HEAD_RATE_SHARE * p->flops_per_s : INFINITY;
    fwd->gpu_s = keep * p->fwd_s + head_flops / rate;
    for (unsigned u = 1; u <= L; u++)
        bwd->h2d += fy_plan_upload_bytes(c, in->weight_dtype, u);
    bwd->d2h = (uint64_t)(L * (act + unit_f32(c, 1)) + unit_f32(c, 0));
    bwd->gpu_s = keep * p->bwd_s;
    double params = (double)fy_model_total_params(c);
    double grad = (double)fy_dtype_size(FY_DTYPE_F32); /* clipping's sums read the gradients */
    double update_s = params / fy_plan_rates_opt_worker(&in->rates);
    double sums_s = in->clip ? update_s * grad / adamw_bytes(c) : 0;
    upd->opt_s += update_s;
    if (two_pass) { /* the first pass: the same copies, the planned blocks recomputed in full */
        double full_recompute = 0;
        for (int k = 0; k < FY_ACT_KINDS; k++)
            full_recompute += p->recompute_s[k];
        norm->h2d = bwd->h2d;
        norm->d2h = bwd->d2h;
        norm->gpu_s = keep * p->bwd_s + planned * (p->bwd_s + full_recompute);
    }
    (two_pass ? norm : bwd)->opt_s += sums_s;
    /* bf16 weights: the opt worker converts each unit without a copy for the forward, and each
     * such block for every backward pass, at host memory's rate (mem_Bps) */
    double fwd_convert = 0, bwd_convert = 0;
    const struct fy_plan_shape shape = {.c = c, .weight_dtype = in->weight_dtype};
    for (unsigned u = 0; u < units; u++) {
        int converts = fy_plan_converts(&shape, in->resident, u);
        double bytes = converts ? (double)fy_model_unit_params(c, u) *
                                      (double)fy_plan_convert_param_bytes(&shape)
                                : 0;
        fwd_convert += bytes;
        bwd_convert += fy_model_unit_kind(c, u) == FY_UNIT_BLOCK ? bytes : 0;
    }
    fwd->opt_s += fwd_convert / opt_worker_Bps(in);
    bwd->opt_s += bwd_convert / opt_worker_Bps(in);
    if (two_pass)
        norm->opt_s += bwd_convert / opt_worker_Bps(in);
    fwd->mem = fwd->h2d + fwd->d2h + fwd->ssd_read + fwd->ssd_write + (uint64_t)fwd_convert;
    bwd->mem = bwd->h2d + bwd->d2h + bwd->ssd_read + bwd->ssd_write + (uint64_t)bwd_convert;
    norm->mem = norm->h2d + norm->d2h + norm->ssd_read + (two_pass ? (uint64_t)bwd_convert : 0);
    for (unsigned u = 0; u < units; u++) { /* the updates, copies written, clipping's sums */
        int copy = in->resident != NULL && in->resident[u] == FY_PLAN_KEPT_BF16;
        upd->mem += fy_model_unit_params(c, u) *
                    (adamw_bytes(c) + fy_dtype_size(FY_OPTSTATE_COPY_DTYPE) * copy);
        (two_pass ? norm : bwd)->mem +=
            fy_model_unit_params(c, u) * fy_dtype_size(FY_DTYPE_F32) * in->clip;
    }
}

/* The opt worker's busy seconds a step: what other_work gives its phases (the same whatever the
 * blocks' placement). */
static double step_opt_s(const struct fy_actplace_in *in)
{
    struct fy_actplan_other fwd, bwd, norm;
    other_work(in, 0, (int)in->c->n_layer, &fwd, &bwd, &norm);
    return fwd.opt_s + bwd.opt_s + norm.opt_s;
}

/* A phase with no planned blocks: its slowest resource (the cost model of actplan.h, A = 0). */
static double phase_alone(const struct fy_actplan_other *o, const struct fy_actplace_in *in)
{
    const struct fy_block_profile *p = in->prof;
    double t[] = {o->gpu_s,
                  o->h2d / p->h2d_Bps,
                  o->d2h / p->d2h_Bps,
                  (o->h2d + o->d2h) / p->duplex_Bps,
                  o->ssd_read / in->rates.ssd_read + o->ssd_write / in->rates.ssd_write,
                  o->opt_s,
                  o->mem / mem_Bps(in)};
    double most = 0;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        most = t[i] > most ? t[i] : most;
    return most;
}

/* The planner over the `planned` bottom blocks with `keep` top blocks kept, in mode m; *plan NULL
 * and *step_s the prediction when no block is left to plan. *step_s counts a two-pass clipped
 * step's norm pass, which the planner does not see (*norm_s: that pass alone). */
static int plan_rest(const struct fy_actplace_in *in, const struct fy_actplan_sizes *sizes,
                     int keep, enum fy_actplan_mode m, uint64_t host_room, uint64_t ssd_room,
                     struct fy_actplan **plan, double *step_s, double *norm_s)
{
    int planned = (int)in->c->n_layer - keep;
    struct fy_actplan_profile prof = {0};
    struct fy_actplan_other norm;
    other_work(in, keep, planned, &prof.fwd, &prof.bwd, &norm);
    /* several ranks: the others' copies in host memory, each phase at least its NVLink reduce */
    uint64_t inputs = (uint64_t)planned * sizes->bytes[FY_ACT_CKPT];
    uint64_t head = phase_grads(in->c, 1), blocks = phase_grads(in->c, 0);
    other_ranks(in, head, inputs, &prof.fwd);
    other_ranks(in, blocks, inputs, &prof.bwd);
    other_ranks(in, blocks, 0, &norm);
    double nv_fwd = nvlink_s(in, head), nv_bwd = nvlink_s(in, blocks);
    *norm_s = phase_alone(&norm, in);
    if (*norm_s > 0)
        *norm_s = fmax(*norm_s, nv_bwd);
    *plan = NULL;
    if (planned == 0) {
        *step_s = fmax(phase_alone(&prof.fwd, in), nv_fwd) +
                  fmax(phase_alone(&prof.bwd, in), nv_bwd) + *norm_s;
        return 0;
    }
    struct fy_actplan_layer_prof *layer = calloc((size_t)planned, sizeof *layer);
    FY_REQUIRE(layer != NULL, -ENOMEM, "train: out of memory for the activation profile");
    for (int l = 0; l < planned; l++) {
        layer[l].fwd_s = in->prof->fwd_s;
        layer[l].bwd_s = in->prof->bwd_s;
        memcpy(layer[l].recompute_s, in->prof->recompute_s, sizeof layer[l].recompute_s);
    }
    prof.n_layer = planned;
    prof.layer = layer;
    prof.h2d_Bps = in->prof->h2d_Bps;
    prof.d2h_Bps = in->prof->d2h_Bps;
    prof.duplex_Bps = in->prof->duplex_Bps;
    prof.ssd_read_Bps = in->rates.ssd_read;
    prof.ssd_write_Bps = in->rates.ssd_write;
    prof.mem_Bps = mem_Bps(in);
    prof.gpu_bytes = 0; /* a block on the GPU keeps everything: the kept ones, outside the plan */
    prof.host_bytes = host_room + (uint64_t)planned * sizes->bytes[FY_ACT_CKPT];
    prof.ssd_bytes = ssd_room;
    int rc = fy_actplan_new(plan, &prof, sizes, m);
    /* one product writing FC and GELU reruns unless both are kept: one of the two placed alone
     * saves nothing, so it is recomputed too (fewer bytes moved), and the plan predicted again */
    int changed = 0;
    for (int l = 0; rc == 0 && in->prof->fc_gelu_fused && l < planned; l++) {
        unsigned char *fc = &(*plan)->place[l * FY_ACT_KINDS + FY_ACT_FC];
        unsigned char *ge = &(*plan)->place[l * FY_ACT_KINDS + FY_ACT_GELU];
        if ((*fc == FY_ACT_RECOMPUTE) != (*ge == FY_ACT_RECOMPUTE)) {
            *fc = *ge = FY_ACT_RECOMPUTE;
            changed = 1;
        }
    }
    if (rc == 0 && changed)
        rc = fy_actplan_predict(&prof, sizes, (*plan)->place, &(*plan)->pred);
    if (rc < 0)
        fy_actplan_destroy(plan);
    free(layer);
    if (rc == 0)
        *step_s = fmax((*plan)->pred.fwd.s, nv_fwd) + fmax((*plan)->pred.bwd.s, nv_bwd) + *norm_s;
    return rc;
}

/* Arrangement B with `keep` top blocks kept: the planner over the others, in a pool room that
 * must also hold the SSD-placed kinds' slots, and an SSD room that must hold their scratch extent
 * (a slot's size for each block, rounded up to its size class), neither of which the planner
 * sees: when they do not fit, it plans again with that much less room, and last with no SSD at
 * all. *plan NULL when nothing fits. */
static int plan_swapping(const struct fy_actplace_in *in, const struct fy_actplan_sizes *sizes,
                         int keep, struct fy_actplan **plan, double *step_s, double *norm_s,
                         unsigned char **place, struct fy_plan_swap *swap)
{
    int L = (int)in->c->n_layer, planned = L - keep;
    uint64_t room = in->host_bytes, ssd = in->ssd_bytes;
    *plan = NULL;
    *place = calloc((size_t)L * FY_ACT_KINDS + 1, 1);
    FY_REQUIRE(*place != NULL, -ENOMEM, "train: out of memory for the activation plan");
    for (int tries = 0; tries < 3; tries++) {
        fy_actplan_destroy(plan);
        int rc = plan_rest(in, sizes, keep, FY_ACTPLAN_AUTO, room, ssd, plan, step_s, norm_s);
        if (rc == -ENOSPC) /* not even the checkpoints: no swapping */
            break;
        if (rc < 0) {
            free(*place);
            *place = NULL;
            return rc;
        }
        memcpy(*place, (*plan)->place, (size_t)planned * FY_ACT_KINDS);
        for (int l = planned; l < L; l++)
            for (int k = 0; k < FY_ACT_KINDS; k++)
                (*place)[l * FY_ACT_KINDS + k] = k == FY_ACT_CKPT               ? FY_ACT_HOST
                                                 : fy_actplan_kind_swappable(k) ? FY_ACT_GPU
                                                                                : FY_ACT_RECOMPUTE;
        fy_plan_swap_of(*place, (unsigned)L, sizes, in->act_ahead, swap);
        uint64_t store = fy_plan_swap_store_bytes(swap, (unsigned)L);
        if (fy_plan_swap_pool_bytes(swap) <= in->host_bytes && store <= in->ssd_bytes)
            return 0;
        uint64_t slots = (uint64_t)swap->slots * swap->slot_bytes;
        room = in->host_bytes > slots && tries == 0 ? in->host_bytes - slots : in->host_bytes;
        if (tries > 0)
            ssd = 0;
        else if (store > in->ssd_bytes) /* the sum it counted, shrunk by the extent's excess */
            ssd = (uint64_t)((double)ssd * (double)in->ssd_bytes / (double)store);
    }
    fy_actplan_destroy(plan);
    free(*place);
    *place = NULL;
    return 0;
}

static int plan_auto(const struct fy_actplace_in *in, struct fy_actplace *out)
{
    const struct fy_block_profile *p = in->prof;
    int L = (int)in->c->n_layer;
    out->keep = -1; /* without a profile: as many as fit, nothing swapped */
    if (p == NULL)
        return 0;
    uint64_t set = p->set_bytes;
    int keep_a = set ? (int)(p->gpu_free / set < (uint64_t)L ? p->gpu_free / set : (uint64_t)L) : 0;
    struct fy_actplan *plan_a = NULL, *plan_b = NULL;
    double step_a = 0, step_b = INFINITY, norm_a = 0, norm_b = 0;
    FY_TRY(plan_rest(in, &out->sizes, keep_a, FY_ACTPLAN_RECOMPUTE, in->host_bytes, in->ssd_bytes,
                     &plan_a, &step_a, &norm_a));
    /* swapping costs the gpu worker one set per call in flight; not with several ranks */
    int can_swap = fy_model_arch(in->c)->swaps_internals && ranks_of(in) == 1 &&
                   (set == 0 || p->gpu_free >= 2 * set);
    int keep_b = 0;
    if (can_swap && set) {
        uint64_t room = (p->gpu_free - 2 * set) / set;
        keep_b = room < (uint64_t)L ? (int)room : L;
    }
    struct fy_plan_swap swap_b = {0};
    unsigned char *place_b = NULL;
    if (can_swap && keep_b < L) {
        int rc =
            plan_swapping(in, &out->sizes, keep_b, &plan_b, &step_b, &norm_b, &place_b, &swap_b);
        if (rc < 0) {
            fy_actplan_destroy(&plan_a);
            return rc;
        }
    }
    out->keep_a = keep_a;
    out->step_a = step_a;
    out->keep_b = plan_b != NULL ? keep_b : -1;
    out->step_b = plan_b != NULL ? step_b : 0;
    /* B only when it swaps something and is predicted clearly faster */
    if (plan_b != NULL && swap_b.host_bytes + swap_b.ssd_bytes > 0 &&
        step_b < (1 - SWAP_MARGIN) * step_a) {
        out->place = place_b;
        out->swap = swap_b;
        out->keep = keep_b;
        out->swap_sets = 1;
        out->predicted_s = step_b;
        out->norm_s = norm_b;
        out->plan = plan_b;
        fy_actplan_destroy(&plan_a);
        return 0;
    }
    free(place_b);
    fy_actplan_destroy(&plan_b);
    out->keep = keep_a;
    out->predicted_s = step_a;
    out->norm_s = norm_a;
    out->plan = plan_a;
    return 0;
}

struct fy_actplace_in fy_actplace_in_of_plan(const struct fy_plan_in *in, const struct fy_plan *p)
{
    return (struct fy_actplace_in){.c = in->shape.c,
                                   .B = in->shape.B,
                                   .T = in->shape.T,
                                   .ranks = in->shape.ranks,
                                   .mode = in->act_mode,
                                   .backend = in->backend,
                                   .act_dtype = in->shape.act_dtype,
                                   .clip = in->shape.clip,
                                   .clip_hold = p->place.grad_hold,
                                   .state_pieces = p->place.state_pieces,
                                   .act_ahead = in->act_ahead};
}

int fy_actplace_plan(const struct fy_actplace_in *in, struct fy_actplace *out)
{
    memset(out, 0, sizeof *out);
    /* a gpu worker's internals: of its own sequences */
    FY_TRY(fy_actplan_sizes_backend(in->c, rank_batch(in), in->T, in->backend, &out->sizes));
    int rc = 0;
    if (in->mode == FY_ACTPLAN_HOST || in->mode == FY_ACTPLAN_SSD)
        rc = plan_forced(in, out);
    else if (in->mode == FY_ACTPLAN_AUTO)
        rc = plan_auto(in, out);
    if (rc < 0) {
        fy_actplace_release(out);
        /* the planner's "does not fit": the budgets the options give (--cpu-mem, --gpu-mem, the
         * batch) do not hold the activations, said */
        return rc == -ENOSPC ? -FY_EUSAGE : rc;
    }
    fy_plan_swap_of(out->place, in->c->n_layer, &out->sizes, in->act_ahead, &out->swap);
    if (out->predicted_s > 0)
        out->opt_s = step_opt_s(in);
    return 0;
}

int fy_actplace_predict(const struct fy_actplace_in *in, struct fy_actplace *r)
{
    if (in->prof == NULL || in->mode == FY_ACTPLAN_AUTO)
        return 0;
    /* the planner's forced placement of every block is the one plan_forced made (a test's mix
     * aside); the budgets were checked there and by the pool's layout, so they are not binding */
    const uint64_t ample = UINT64_MAX / 4;
    struct fy_actplan *plan = NULL;
    double step, norm_s;
    FY_TRY(plan_rest(in, &r->sizes, 0, (enum fy_actplan_mode)in->mode, ample, ample, &plan, &step,
                     &norm_s));
    fy_actplan_destroy(&r->plan);
    r->plan = plan;
    r->predicted_s = step;
    r->norm_s = norm_s;
    r->opt_s = step_opt_s(in);
    char text[1024];
    fy_actplan_describe(plan, text, sizeof text);
    char *phases = strstr(text, "predicted step");
    if (phases != NULL)
        phases[strcspn(phases, "\n")] = '\0';
    fy_info("plan: activations (%s): %s, from the measured block profile",
            fy_actplan_mode_name(in->mode), phases != NULL ? phases : "predicted");
    return 0;
}

void fy_actplace_release(struct fy_actplace *r)
{
    free(r->place);
    r->place = NULL;
    fy_actplan_destroy(&r->plan);
}

/* Block b's kinds at a placement, as "qkv,attn" ("-" for none). */
static void kinds_at(const struct fy_actplace *r, unsigned b, int place, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    unsigned mask = fy_actplan_mask(r->place, (int)b - 1, place);
    for (int k = 0; k < FY_ACT_KINDS; k++)
        if (mask & FY_ACT_BIT(k))
            at += (size_t)snprintf(buf + at, at < len ? len - at : 0, "%s%s", at ? "," : "",
                                   fy_actplan_kind_name(k));
    if (buf[0] == '\0')
        snprintf(buf, len, "-");
}

void fy_actplace_log(const struct fy_actplace *r, const struct fy_actplace_in *in)
{
    char host[32], ssd[32], slot[32];
    fy_format_size(r->swap.host_bytes, host, sizeof host);
    fy_format_size(r->swap.ssd_bytes, ssd, sizeof ssd);
    fy_format_size(r->swap.slot_bytes, slot, sizeof slot);
    uint64_t seed;
    const char *mix = fy_knob_test_act_mix(&seed);
    if (mix != NULL && r->plan == NULL && r->place != NULL)
        fy_info("test hook: FUYOU_TEST_ACT_MIX=%s: the blocks' internals mixed", mix);
    if (in->mode == FY_ACTPLAN_AUTO && in->prof == NULL)
        fy_info("plan: activations (auto, not profiled): the gpu worker keeps the internals of "
                "as many top blocks as fit, the others are recomputed");
    else if (r->keep != 0 || r->place != NULL)
        fy_info(
            "plan: activations (%s): the internals of %d top block%s kept on the GPU; of the "
            "others, swapped instead of recomputed: %s in the pool from forward to backward, %s "
            "to the SSD store through %u pool slots of %s",
            fy_actplan_mode_name(in->mode), r->keep, r->keep == 1 ? "" : "s", host, ssd,
            fy_plan_spill_slots(in->act_ahead), slot);
    else
        fy_info("plan: activations (%s): every block's backward recomputes its internals",
                fy_actplan_mode_name(in->mode));
    for (unsigned b = 1; r->place != NULL && b <= in->c->n_layer; b++) {
        char h[64], d[64];
        kinds_at(r, b, FY_ACT_HOST, h, sizeof h);
        kinds_at(r, b, FY_ACT_SSD, d, sizeof d);
        if (strcmp(h, "-") != 0 || strcmp(d, "-") != 0)
            fy_info("plan:   block %u: pool %s, ssd %s", b, h, d);
    }
    if (r->plan != NULL) {
        char text[1024];
        fy_actplan_describe(r->plan, text, sizeof text);
        for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n"))
            fy_info("plan:   %s", line);
    }
    if (r->norm_s > 0)
        fy_info("plan:     and before that backward, clipping's norm pass (--clip-mode two-pass): "
                "%.1f ms, which no update overlaps",
                r->norm_s * 1e3);
    if (in->mode == FY_ACTPLAN_AUTO && in->prof != NULL) {
        char b[128] = "not planned (no room for the two sets swapping computes in)";
        if (r->keep_b >= 0)
            snprintf(b, sizeof b, "%.3f s", r->step_b);
        fy_info("plan: auto: keeping %d blocks and recomputing the others is predicted %.3f s a "
                "step; keeping %d and swapping, %s",
                r->keep_a, r->step_a, r->keep_b >= 0 ? r->keep_b : 0, b);
    }
    if (ranks_of(in) > 1) {
        char nv[160] = "the gradients summed in the pool, each gpu worker adding its own in turn";
        uint64_t grads = phase_grads(in->c, 1) + phase_grads(in->c, 0);
        if (reduce_nvlink(in))
            snprintf(nv, sizeof nv,
                     "the gradients reduced over NVLink, %.1f ms a step at %.0f "
                     "GB/s (a reference rate, not measured)",
                     nvlink_s(in, grads) * 1e3, in->rates.nvlink * 1e-9);
        fy_info("plan: activations with %d GPUs: each gpu worker's %d sequences, as profiled; "
                "nothing swapped (not supported across GPUs); %s",
                ranks_of(in), rank_batch(in), nv);
    }
    if (r->predicted_s > 0)
        fy_info("plan: predicted step %.3f s from the measured block profile", r->predicted_s);
}

int fy_actplace_write_json(const struct fy_actplace *r, const struct fy_actplace_in *in, FILE *f)
{
    fprintf(f,
            "{\"mode\": \"%s\", \"backend\": \"%s\", \"batch\": %d, \"seq\": %d, "
            "\"ranks\": %d, \"kept_blocks\": %d, \"swap_sets\": %d, \"predicted_step_s\": %.6f, "
            "\"predicted_opt_s\": %.9g, \"host_bytes\": %llu, \"ssd_bytes\": %llu, \"ssd_slots\": "
            "%u, \"blocks\": [",
            fy_actplan_mode_name(in->mode), in->backend, in->B, in->T, ranks_of(in), r->keep,
            r->swap_sets, r->predicted_s, r->opt_s, (unsigned long long)r->swap.host_bytes,
            (unsigned long long)r->swap.ssd_bytes, r->swap.slots);
    for (unsigned b = 1; r->place != NULL && b <= in->c->n_layer; b++) {
        char h[64], d[64];
        kinds_at(r, b, FY_ACT_HOST, h, sizeof h);
        kinds_at(r, b, FY_ACT_SSD, d, sizeof d);
        fprintf(f, "%s{\"block\": %u, \"host\": \"%s\", \"ssd\": \"%s\"}", b > 1 ? ", " : "", b, h,
                d);
    }
    fprintf(f, "], ");
    const struct fy_block_profile *p = in->prof;
    if (p != NULL) { /* what the plan came from, for people and tools */
        fprintf(f, "\"block_profile\": {\"fwd_s\": %.9g, \"bwd_s\": %.9g, \"recompute_s\": {",
                p->fwd_s, p->bwd_s);
        for (int k = 0, first = 1; k < FY_ACT_KINDS; k++)
            if (fy_actplan_kind_swappable(k)) {
                fprintf(f, "%s\"%s\": %.9g", first ? "" : ", ", fy_actplan_kind_name(k),
                        p->recompute_s[k]);
                first = 0;
            }
        fprintf(f,
                "}, \"fc_gelu_fused\": %u, \"flops_per_s\": %.6g, \"h2d_Bps\": %.6g, "
                "\"d2h_Bps\": %.6g, \"duplex_Bps\": %.6g, \"gpu_free\": %llu, "
                "\"set_bytes\": %llu}, \"rates\": {\"ssd_read_Bps\": %.6g, "
                "\"ssd_write_Bps\": %.6g, \"ssd_rates_from\": \"%s\", "
                "\"opt_params_per_s\": %.6g, \"opt_rate_from\": \"%s\"}, \"arrangements\": "
                "{\"keep_a\": %d, "
                "\"step_a_s\": %.6f, \"keep_b\": %d, \"step_b_s\": %.6f}, ",
                p->fc_gelu_fused, p->flops_per_s, p->h2d_Bps, p->d2h_Bps, p->duplex_Bps,
                (unsigned long long)p->gpu_free, (unsigned long long)p->set_bytes,
                in->rates.ssd_read, in->rates.ssd_write,
                in->ssd_rates_from_steps ? "steps" : "profile",
                fy_plan_rates_opt_worker(&in->rates), in->opt_rate_from_steps ? "steps" : "profile",
                r->keep_a, r->step_a, r->keep_b, r->step_b);
    }
    fprintf(f, "\"planner\": ");
    if (r->plan != NULL)
        FY_TRY(fy_actplan_write_json(r->plan, f));
    else
        fprintf(f, "null\n");
    errno = 0;
    int bad = fprintf(f, "}\n") < 0 || fflush(f) != 0;
    FY_REQUIRE(!bad, errno ? -errno : -EIO, "writing the activation plan: %s",
               strerror(errno ? errno : EIO));
    return 0;
}
