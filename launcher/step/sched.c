/* A step's schedule, what its parts share (launcher/step/sched.h): made for a run, the pool's
 * slots, what each unit is, and the batch loaded. */
#include "launcher/step/sched.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"
#include "common/formats/ckpt.h"
#include "common/base/dtype.h"
#include "common/base/knobs.h"
#include "common/base/log.h"
#include "common/model/optstate.h"

static uint64_t align4k(uint64_t v) { return (v + 4095) / 4096 * 4096; }

uint64_t fy_sched_master(const struct fy_model_config *c, unsigned u, uint64_t state)
{
    struct fy_optstate_layout lay;
    fy_optstate_layout(c, u, &lay);
    return state + lay.section[FY_OPTSTATE_MASTER].offset;
}

uint64_t fy_sched_act(const struct fy_plan_layout *l, unsigned i)
{
    return l->acts + i * align4k(l->act_bytes);
}

uint64_t fy_sched_dact(const struct fy_plan_layout *l, unsigned i)
{
    return l->dacts + i * align4k(l->act_bytes);
}

uint64_t fy_sched_wslot(const struct fy_plan_layout *l, unsigned i)
{
    return i == 0 ? l->weights : l->weights + l->wslot0_bytes + (i - 1) * l->wslot_bytes;
}

uint64_t fy_sched_gslot(const struct fy_plan_layout *l, unsigned i)
{
    return i == 0 ? l->grads : l->grads + l->slot_bytes + (i - 1) * l->bslot_bytes;
}

uint64_t fy_sched_grad_bytes(const struct fy_plan_layout *l, unsigned u)
{
    return fy_model_unit_params(l->c, u) * 4;
}

int fy_sched_has_copy(const struct fy_sched *r, unsigned u)
{
    return r->wcopy != NULL && r->wcopy[u] != 0;
}

int fy_sched_bf16(const struct fy_sched *r) { return r->l.weight_dtype == FY_DTYPE_BF16; }

int fy_sched_in_pieces(const struct fy_sched *r, unsigned u)
{
    return fy_optstate_piece_count(r->l.c, u) > 1;
}

int fy_sched_weight_dtype(const struct fy_sched *r)
{
    return fy_sched_bf16(r) ? FY_DTYPE_BF16 : FY_DTYPE_F32;
}

int fy_sched_converts(const struct fy_sched *r, unsigned u)
{
    return fy_sched_bf16(r) ? !fy_sched_has_copy(r, u) : fy_sched_in_pieces(r, u);
}

unsigned fy_sched_block_wslot(const struct fy_plan_layout *l, unsigned u)
{
    return 1 + u % l->wslots;
}

int fy_sched_kept(const struct fy_sched *r, unsigned u)
{
    return r->resident != NULL && r->resident[u] != 0;
}

/* The checkpoints' placement for this run: the pool must have been laid out for it. */
static int block_inputs_setup(struct fy_sched *r, int ssd)
{
    const struct fy_plan_layout *l = &r->l;
    unsigned L = l->c->n_layer;
    if (!ssd) {
        FY_REQUIRE(l->act_slots >= L + 1 && l->dact_slots >= 2, -EINVAL,
                   "shared pool: room for %u checkpoints and %u activation gradients, not the %u "
                   "and 2 this run keeps in the pool (laid out for --ckpt-place ssd?)",
                   l->act_slots, l->dact_slots, L + 1);
        fy_spill_in_pool(&r->block_inputs, &r->tk, l->acts, align4k(l->act_bytes));
        return 0;
    }
    unsigned slots = fy_plan_spill_slots(r->act_ahead);
    FY_REQUIRE(l->act_slots >= slots && l->dact_slots >= 3, -EINVAL,
               "shared pool: room for %u checkpoints and %u activation gradients, not the %u and 3 "
               "of --ckpt-place ssd with --act-ahead %u",
               l->act_slots, l->dact_slots, slots, r->act_ahead);
    char what[64];
    snprintf(what, sizeof what, "checkpoints x_0..x_%u", L ? L - 1 : 0);
    return fy_spill_setup(&r->block_inputs, &r->tk, l->acts, align4k(l->act_bytes), slots, L,
                          FY_TENSOR_CKPT_SPILL(0), what);
}

/* The blocks' swapped internals for this run (struct fy_sched_swap): masks per block, the pool-kept
 * regions one after another at the start of the "saved" region, the SSD slots after them. */
static int saved_setup(struct fy_sched *r, const struct fy_train_opts *o)
{
    unsigned L = r->l.c->n_layer;
    r->swap.host_mask = calloc(L + 1, sizeof *r->swap.host_mask);
    r->swap.ssd_mask = calloc(L + 1, sizeof *r->swap.ssd_mask);
    r->swap.host_off = calloc(L + 1, sizeof *r->swap.host_off);
    r->swap.sizes = o->saved_sizes;
    fy_spill_in_pool(&r->swap.ring, &r->tk, 0, 0); /* none but those placed on the SSD below */
    FY_REQUIRE(r->swap.host_mask && r->swap.ssd_mask && r->swap.host_off, -ENOMEM,
               "train: out of memory");
    struct fy_plan_swap swap;
    fy_plan_swap_of(o->act_place, L, &o->saved_sizes, r->act_ahead, &swap);
    if (fy_plan_swap_pool_bytes(&swap) == 0)
        return 0;
    uint64_t at, bytes;
    FY_TRY(fy_pool_region(r->pool, "saved", &at, &bytes));
    FY_REQUIRE(bytes >= fy_plan_swap_pool_bytes(&swap), -EINVAL,
               "shared pool: a saved region of %llu bytes, not the %llu this plan swaps (laid out "
               "by fy_plan_regions for another plan?)",
               (unsigned long long)bytes, (unsigned long long)fy_plan_swap_pool_bytes(&swap));
    for (unsigned b = 1; b <= L; b++) {
        r->swap.host_mask[b] = fy_actplan_mask(o->act_place, (int)b - 1, FY_ACT_HOST);
        r->swap.ssd_mask[b] = fy_actplan_mask(o->act_place, (int)b - 1, FY_ACT_SSD);
        struct fy_actplan_region reg;
        FY_TRY(fy_actplan_region_of(&o->saved_sizes, r->swap.host_mask[b], &reg));
        r->swap.host_off[b] = at;
        at += reg.bytes;
    }
    if (swap.ssd_bytes == 0)
        return 0;
    return fy_spill_setup(&r->swap.ring, &r->tk, at, swap.slot_bytes, swap.slots, L,
                          FY_TENSOR_SAVED_SPILL(0), "the blocks' internals placed on the SSD");
}

/* Clipping for this run (struct fy_sched_clip): one pass or two, and where the head's final-unit
 * gradient goes, in a pool laid out for it. */
static int clip_setup(struct fy_sched *r, const struct fy_train_opts *o)
{
    FY_REQUIRE(isfinite(o->clip_grad_norm) && o->clip_grad_norm >= 0, -EINVAL,
               "train: the clipping norm %g must be finite and >= 0 (0: no clipping)",
               o->clip_grad_norm);
    if (o->clip_grad_norm > 0) {
        r->clip.on = 1;
        r->clip.hold_gpu = o->grad_hold_gpu;
        r->clip.one_pass = r->l.hold != 0 || r->clip.hold_gpu;
        FY_REQUIRE(!(r->l.hold != 0 && r->clip.hold_gpu), -EINVAL,
                   "train: one-pass clipping's gradients held both in the pool and the gpu worker");
        r->dfinal = fy_sched_gslot(&r->l, r->l.gslots + 1);
        FY_REQUIRE(r->l.grads_bytes >= r->dfinal - r->l.grads + r->l.dfinal_bytes, -EINVAL,
                   "train: the pool has no room for clipping's final-unit gradient (made by "
                   "fy_plan_regions without clip)");
    }
    return 0;
}

/* The state slots as the plan took them, a unit's whole state or a piece's, and the gradient slots
 * they need. */
static int state_slots_setup(struct fy_sched *r, const struct fy_train_opts *o)
{
    if (o->state_pieces && !r->l.state_pieces) {
        r->l.state_pieces = 1;
        r->l.state_slot_bytes = fy_optstate_max_piece_bytes(r->l.c);
    }
    FY_REQUIRE(o->state_pieces == r->l.state_pieces, -EINVAL,
               "shared pool: state slots of %llu bytes, not the whole units' this plan reads "
               "before their backward (laid out for the state in pieces?)",
               (unsigned long long)r->l.state_slot_bytes);
    FY_REQUIRE(r->l.gslots >= 2 || (r->l.state_pieces && !r->clip.on), -EINVAL,
               "shared pool: %u block gradient slot, where whole units' state or clipping takes "
               "two at least (laid out for another plan?)",
               r->l.gslots);
    return 0;
}

/* Whether the embeddings' update goes in two parts (struct fy_sched_embed). */
static void embed_setup(struct fy_sched *r)
{
    const struct fy_model_config *c = r->l.c;
    r->embed.split = !fy_knob_test_embed_whole();
    if (!r->embed.split)
        fy_info("test hook: the embeddings are updated in one piece after the backward "
                "(FUYOU_TEST_EMBED_WHOLE=1)");
    /* int8 moments are quantized in blocks of 256 values, which rows must not split */
    if (r->embed.split && c->optim_state == FY_OPTIM_STATE_INT8 &&
        c->n_embd % FY_OPTSTATE_INT8_BLOCK != 0) {
        r->embed.split = 0;
        fy_info("plan: the embeddings are updated in one piece after the backward: with int8 "
                "optimizer state their rows of %u values would split its blocks of %d",
                c->n_embd, FY_OPTSTATE_INT8_BLOCK);
    }
}

int fy_sched_init(struct fy_sched *r, struct fy_pool *pool, const struct fy_plan_shape *s,
                  const struct fy_exec *x, int timeout_ms)
{
    memset(r, 0, sizeof *r);
    for (int i = 0; i < FY_PLAN_PREFETCH_MAX + 2; i++)
        r->wslot_unit[i] = -1;
    r->state_unit[0] = r->state_unit[1] = -1;
    r->tk.x = x;
    r->tk.timeout_ms = timeout_ms;
    r->tk.units = fy_model_unit_count(s->c);
    r->pool = pool;
    r->copies.pfirst = calloc(r->tk.units + 1, sizeof *r->copies.pfirst);
    FY_REQUIRE(r->copies.pfirst != NULL, -ENOMEM, "train: out of memory");
    for (unsigned u = 0; u < r->tk.units; u++)
        r->copies.pfirst[u + 1] = r->copies.pfirst[u] + fy_optstate_piece_count(s->c, u);
    FY_REQUIRE(
        s->act_dtype == FY_DTYPE_F32 || s->act_dtype == FY_DTYPE_BF16, -EINVAL,
        "training: activations in the pool are f32 or bf16, not %s (fy_train_opts.act_dtype)",
        fy_dtype_name(s->act_dtype));
    int rc = fy_plan_layout_read(pool, s, &r->l);
    if (rc < 0) {
        free(r->copies.pfirst);
        r->copies.pfirst = NULL;
        return rc;
    }
    r->dfinal = fy_sched_gslot(&r->l, 1);
    return 0;
}

int fy_sched_setup(struct fy_sched *r, const struct fy_train_opts *o)
{
    const struct fy_model_config *c = r->l.c;
    FY_REQUIRE(r->l.wslots >= 2, -EINVAL,
               "train: the pool's weights slots were not read (fy_train_opts.weight_dtype unset)");
    r->tk.overlap = o->overlap;
    r->act_ahead = fy_plan_act_ahead(o->act_ahead);
    FY_REQUIRE(r->act_ahead <= FY_PLAN_ACT_AHEAD_MAX, -EINVAL,
               "train: --act-ahead %u: give 1 to %d blocks", r->act_ahead, FY_PLAN_ACT_AHEAD_MAX);
    FY_TRY(block_inputs_setup(r, o->block_inputs_ssd));
    r->tk.trace = o->trace;
    FY_TRY(clip_setup(r, o));
    FY_TRY(state_slots_setup(r, o));
    fy_ticket_trace_begin(&r->tk);
    unsigned units = fy_model_unit_count(c);
    r->version = calloc(units, sizeof *r->version);
    r->clip.deferred = calloc(units, 1);
    r->resident = calloc(units, sizeof *r->resident);
    r->wcopy = calloc(units, sizeof *r->wcopy);
    int queue = fy_optq_init(&r->opt, &r->tk, units, r->l.gslots);
    r->embed.row_touched = calloc(c->vocab, 1);
    r->copies.at = calloc(units, 1);
    r->copies.digest = calloc(r->copies.pfirst[units], sizeof *r->copies.digest);
    FY_REQUIRE(queue == 0 && r->version && r->clip.deferred && r->resident && r->wcopy &&
                   r->embed.row_touched && r->copies.at && r->copies.digest,
               -ENOMEM, "train: out of memory");
    embed_setup(r);
    FY_TRY(saved_setup(r, o));
    /* the kept units' state, and their copies: offsets 0 for the others (all where none is kept) */
    return fy_plan_resident_offsets(r->pool, c, o->resident, r->resident, r->wcopy);
}

void fy_sched_release(struct fy_sched *r)
{
    fy_optq_release(&r->opt);
    free(r->version);
    free(r->clip.deferred);
    free(r->resident);
    free(r->wcopy);
    free(r->embed.row_touched);
    free(r->swap.host_mask);
    free(r->swap.ssd_mask);
    free(r->swap.host_off);
    free(r->copies.at);
    free(r->copies.pfirst);
    free(r->copies.digest);
}

/* Said once per process: a batch whose targets the token file's loss mask all masks out. */
static int warned_no_trained_target;

int fy_sched_load_batch(struct fy_sched *r, struct fy_sampler *data, int split, uint64_t index,
                        struct fy_sampler_fill *fill)
{
    int32_t *in = fy_pool_at(r->pool, r->l.tokens, r->l.tok_bytes);
    int32_t *tg = fy_pool_at(r->pool, r->l.targets, r->l.tok_bytes);
    int32_t *pos = fy_pool_at(r->pool, r->l.positions, r->l.tok_bytes);
    FY_REQUIRE(in != NULL && tg != NULL && pos != NULL, -ERANGE,
               "schedule error: the batch lies outside the pool");
    struct fy_sampler_fill f;
    if (split == FY_TOKFILE_EVAL)
        FY_TRY(fy_sampler_eval_batch(data, index, in, tg, pos, &f));
    else
        FY_TRY(fy_sampler_train_batch(data, index, in, tg, pos, &f));
    uint64_t n = f.targets;
    if (n == 0 && !warned_no_trained_target) {
        warned_no_trained_target = 1;
        fy_warn("%s batch %llu: every target is masked out of the loss by the token file's loss "
                "mask: its loss is 0 and its gradients are 0 (said once)",
                split == FY_TOKFILE_EVAL ? "eval" : "training", (unsigned long long)index);
    }
    if (fill != NULL)
        *fill = f;
    return 0;
}
