/* A step's shape, placement and pool regions: launcher/plan/plan_layout.h. */
#include "launcher/plan/plan_layout.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"
#include "common/formats/ckpt.h"
#include "common/base/dtype.h"
#include "common/base/knobs.h"
#include "common/model/optstate.h"

static uint64_t align4k(uint64_t v) { return (v + 4095) / 4096 * 4096; }

int fy_plan_ranks(const struct fy_plan_shape *s) { return s->ranks > 1 ? s->ranks : 1; }

int fy_plan_rank_batch(const struct fy_plan_shape *s) { return s->B / fy_plan_ranks(s); }

uint64_t fy_plan_act_bytes(const struct fy_model_config *c, int B, int T, int act_dtype)
{
    return (uint64_t)B * T * c->n_embd * fy_dtype_size(act_dtype);
}

uint64_t fy_plan_embed_rows(const struct fy_model_config *c)
{
    return fy_model_unit_params(c, 0) / c->n_embd;
}

/* Two lists of the embeddings' rows (int32): those the batch's tokens do not touch, whose
 * gradient is final after the head, and the others (launcher/step/train.c, embed_update_early). */
static uint64_t embed_rows_bytes(const struct fy_model_config *c)
{
    return align4k(2 * fy_plan_embed_rows(c) * 4);
}

/* The embeddings' f32 gradient, 4 KiB padded: grads slot 0, which holds it from the head to the
 * embedding backward. */
static uint64_t embed_grad_bytes(const struct fy_model_config *c)
{
    return align4k(fy_model_unit_params(c, 0) * 4);
}

/* The final unit's gradient: from grads slot 1 on, where the head writes it and its update reads
 * it before any block's gradient comes (it can be larger than a block's: a Llama's untied head);
 * with clipping after the block slots, kept between the passes of a clipped step. */
static uint64_t dfinal_bytes(const struct fy_model_config *c)
{
    return align4k(fy_model_unit_params(c, c->n_layer + 1) * 4);
}

static uint64_t block_slot_bytes(const struct fy_model_config *c)
{
    return align4k(fy_model_unit_params(c, 1) * 4);
}

unsigned fy_plan_act_ahead(unsigned asked) { return asked ? asked : FY_PLAN_ACT_AHEAD_DEFAULT; }

unsigned fy_plan_spill_slots(unsigned act_ahead) { return fy_plan_act_ahead(act_ahead) + 2; }

uint64_t fy_plan_spill_extent_bytes(uint64_t item_bytes, unsigned count)
{
    return fy_scratch_bytes((uint64_t)(count ? count : 1) * item_bytes);
}

void fy_plan_swap_of(const unsigned char *place, unsigned n_layer,
                     const struct fy_actplan_sizes *sizes, unsigned act_ahead,
                     struct fy_plan_swap *out)
{
    memset(out, 0, sizeof *out);
    for (unsigned l = 0; place != NULL && l < n_layer; l++) {
        struct fy_actplan_region h, d; /* swappable kinds only: cannot fail */
        fy_actplan_region_of(sizes, fy_actplan_mask(place, (int)l, FY_ACT_HOST), &h);
        fy_actplan_region_of(sizes, fy_actplan_mask(place, (int)l, FY_ACT_SSD), &d);
        out->host_bytes += h.bytes;
        out->ssd_bytes += d.bytes;
        out->slot_bytes = d.bytes > out->slot_bytes ? d.bytes : out->slot_bytes;
    }
    out->slots = out->ssd_bytes ? fy_plan_spill_slots(act_ahead) : 0;
}

uint64_t fy_plan_swap_pool_bytes(const struct fy_plan_swap *swap)
{
    return swap->host_bytes + swap->slots * swap->slot_bytes;
}

uint64_t fy_plan_swap_store_bytes(const struct fy_plan_swap *swap, unsigned n_layer)
{
    return swap->ssd_bytes ? fy_plan_spill_extent_bytes(swap->slot_bytes, n_layer) : 0;
}

uint64_t fy_plan_block_inputs_store_bytes(const struct fy_plan_shape *s)
{
    uint64_t act = align4k(fy_plan_act_bytes(s->c, s->B, s->T, s->act_dtype));
    return fy_plan_spill_extent_bytes(act, s->c->n_layer);
}

uint64_t fy_plan_upload_bytes(const struct fy_model_config *c, int weight_dtype, unsigned u)
{
    struct fy_optstate_layout lay;
    fy_optstate_layout(c, u, &lay);
    if (weight_dtype == FY_DTYPE_BF16)
        return lay.params * fy_dtype_size(FY_OPTSTATE_COPY_DTYPE);
    return lay.section[FY_OPTSTATE_MASTER].bytes;
}

int fy_plan_converts(const struct fy_plan_shape *s, const unsigned char *resident, unsigned u)
{
    if (s->weight_dtype != FY_DTYPE_BF16)
        return s->weight_dtype == FY_DTYPE_F32 && fy_optstate_piece_count(s->c, u) > 1;
    return resident == NULL || resident[u] != FY_PLAN_KEPT_BF16;
}

uint64_t fy_plan_convert_param_bytes(const struct fy_plan_shape *s)
{
    return s->weight_dtype == FY_DTYPE_BF16 ? FY_PLAN_CONVERT_PARAM_BYTES : 8;
}

uint64_t fy_plan_backward_passes(const struct fy_plan_shape *s, const struct fy_plan_place *p)
{
    return s->clip && !p->grad_hold ? 2 : 1;
}

uint64_t fy_plan_convert_params(const struct fy_plan_shape *s, const struct fy_plan_place *p)
{
    const struct fy_model_config *c = s->c;
    uint64_t params = 0;
    for (unsigned u = 0; u < fy_model_unit_count(c); u++)
        if (fy_plan_converts(s, p->resident, u))
            params += fy_model_unit_params(c, u) * (1 + (fy_model_unit_kind(c, u) == FY_UNIT_BLOCK
                                                             ? fy_plan_backward_passes(s, p)
                                                             : 0));
    return params;
}

uint64_t fy_plan_land_chunk(const struct fy_model_config *c)
{
    uint64_t most = fy_optstate_max_master_bytes(c), asked = fy_knob_test_land_chunk();
    uint64_t cap = asked > 0 ? asked : FY_PLAN_LAND_CHUNK;
    uint64_t share = align4k((most + FY_PLAN_LAND_SLOTS - 1) / FY_PLAN_LAND_SLOTS);
    return share < cap ? share : cap;
}

/* Unit u's weights as a weights slot holds them: its f32 master, or its bf16 weights (4 KiB
 * padded). */
static uint64_t unit_weights_bytes(const struct fy_model_config *c, int weight_dtype, unsigned u)
{
    if (weight_dtype == FY_DTYPE_BF16)
        return fy_optstate_copy_bytes(c, u);
    return align4k(fy_model_unit_params(c, u) * 4);
}

/* Weights slot 0, which holds the embeddings (from the forward's start until the tied head), and
 * the others, which the blocks and the final unit take in turn: the largest of those. */
static uint64_t wslot0_bytes(const struct fy_model_config *c, int weight_dtype)
{
    return unit_weights_bytes(c, weight_dtype, 0);
}

static uint64_t wslot_bytes(const struct fy_model_config *c, int weight_dtype)
{
    uint64_t most = 0;
    for (unsigned u = 1; u < fy_model_unit_count(c); u++)
        if (unit_weights_bytes(c, weight_dtype, u) > most)
            most = unit_weights_bytes(c, weight_dtype, u);
    return most;
}

/* Whether a streamed unit's master comes through the landing ring (resident NULL: every unit
 * streams): one whose weights the opt worker converts (fy_plan_converts). */
static int any_landing(const struct fy_plan_shape *s, const unsigned char *resident)
{
    for (unsigned u = 0; u < fy_model_unit_count(s->c); u++)
        if ((resident == NULL || !resident[u]) && fy_plan_converts(s, resident, u))
            return 1;
    return 0;
}

uint64_t fy_plan_state_slot_bytes(const struct fy_model_config *c, int pieces)
{
    return pieces ? fy_optstate_max_piece_bytes(c) : fy_optstate_max_bytes(c);
}

unsigned fy_plan_weight_copies(const struct fy_model_config *c, const unsigned char *resident)
{
    unsigned n = 0;
    for (unsigned u = 0; resident != NULL && u < fy_model_unit_count(c); u++)
        n += resident[u] == FY_PLAN_KEPT_BF16;
    return n;
}

uint64_t fy_plan_resident_bytes(const struct fy_model_config *c, const unsigned char *resident)
{
    uint64_t bytes = 0;
    for (unsigned u = 0; resident != NULL && u < fy_model_unit_count(c); u++)
        if (resident[u])
            bytes += fy_optstate_bytes(c, u) +
                     (resident[u] == FY_PLAN_KEPT_BF16 ? fy_optstate_copy_bytes(c, u) : 0);
    return bytes;
}

/* ---- the pool's regions ---------------------------------------------------------------------- */

void fy_plan_regions(const struct fy_plan_shape *s, const struct fy_plan_place *p,
                     struct fy_pool_region_spec out[FY_PLAN_REGIONS_MAX], unsigned *n)
{
    const struct fy_model_config *c = s->c;
    uint64_t act = align4k(fy_plan_act_bytes(c, s->B, s->T, s->act_dtype));
    uint64_t tok = align4k((uint64_t)s->B * s->T * 4);
    unsigned i = 0, block_inputs_slots = p->block_inputs_slots;
    out[i++] = (struct fy_pool_region_spec){"meta", FY_COMMIT_RECORD_BYTES};
    /* inputs, targets, positions (each [B][T] int32), then the embeddings' row lists */
    out[i++] = (struct fy_pool_region_spec){"tokens", 3 * tok + embed_rows_bytes(c)};
    /* the checkpoints x_0..x_L, or the slots they take in turn on their way to the store; two
     * activation gradients (with the store a third: clipping's pass 1 can no longer borrow x_L's
     * room) */
    out[i++] = (struct fy_pool_region_spec){
        "acts", (block_inputs_slots ? block_inputs_slots : c->n_layer + 1) * act};
    out[i++] = (struct fy_pool_region_spec){"dacts", (block_inputs_slots ? 3 : 2) * act};
    /* weights: slot 0 keeps the embeddings for the tied head, the blocks and the final unit take
     * the other prefetch + 1 in turn, so the next units' weights arrive while one computes; grads:
     * slot 0 holds the embedding gradient through the backward, the blocks take grad_slots
     * block-sized slots in turn so the gpu can run grad_slots - 1 blocks ahead of the optimizer;
     * the final unit's gradient from slot 1 on (room for it where it is larger than the block
     * slots), and with clipping after them (it must outlive pass 1, whose blocks use slots 1 and
     * 2); state: two units' whole state, or two pieces' (common/model/optstate.h), so one is updated
     * while the next is read */
    unsigned prefetch = p->prefetch, grad_slots = p->grad_slots;
    if (prefetch < 1 || prefetch > FY_PLAN_PREFETCH_MAX)
        prefetch = 1; /* the option parser refuses these; the layout stays sane anyway */
    if (grad_slots < FY_PLAN_GRAD_SLOTS_MIN || grad_slots > FY_PLAN_GRAD_SLOTS_MAX)
        grad_slots = FY_PLAN_GRAD_SLOTS_FLOOR;
    out[i++] = (struct fy_pool_region_spec){"weights",
                                            wslot0_bytes(c, s->weight_dtype) +
                                                (1 + prefetch) * wslot_bytes(c, s->weight_dtype)};
    /* a streamed unit's master on its way from the store to the weights slots, chunk by chunk */
    if (any_landing(s, p->resident))
        out[i++] =
            (struct fy_pool_region_spec){"landing", FY_PLAN_LAND_SLOTS * fy_plan_land_chunk(c)};
    uint64_t blocks = grad_slots * block_slot_bytes(c), fin = dfinal_bytes(c);
    out[i++] = (struct fy_pool_region_spec){"grads", embed_grad_bytes(c) + (s->clip ? blocks + fin
                                                                            : blocks > fin ? blocks
                                                                                           : fin)};
    out[i++] =
        (struct fy_pool_region_spec){"state", 2 * fy_plan_state_slot_bytes(c, p->state_pieces)};
    if (s->clip && p->grad_hold == FY_HOLD_POOL) /* one-pass clipping's held block gradients */
        out[i++] = (struct fy_pool_region_spec){"gradhold", fy_plan_hold_bytes(c)};
    uint64_t kept = fy_plan_resident_bytes(c, p->resident);
    if (kept > 0) /* optimizer state that stays in the pool across steps */
        out[i++] = (struct fy_pool_region_spec){"resident", kept};
    if (s->ranks > 1) /* the gpu workers' rank-order reduction: a line each (fy_plan_layout) */
        out[i++] = (struct fy_pool_region_spec){"ranks", FY_PLAN_RANKS_BYTES};
    if (fy_plan_swap_pool_bytes(&p->swap) > 0) /* the blocks' swapped internals */
        out[i++] = (struct fy_pool_region_spec){"saved", fy_plan_swap_pool_bytes(&p->swap)};
    *n = i;
}

void fy_plan_unit_regions(const struct fy_model_config *c,
                          struct fy_pool_region_spec out[FY_PLAN_REGIONS_MAX], unsigned *n)
{
    /* a commit record, and two pieces' state that a unit moves through piece by piece */
    out[0] = (struct fy_pool_region_spec){"meta", FY_COMMIT_RECORD_BYTES};
    out[1] = (struct fy_pool_region_spec){"state", 2 * fy_plan_state_slot_bytes(c, 1)};
    *n = 2;
}

uint64_t fy_plan_pool_bytes(const struct fy_plan_shape *s, const struct fy_plan_place *p)
{
    struct fy_pool_region_spec regions[FY_PLAN_REGIONS_MAX];
    unsigned n;
    fy_plan_regions(s, p, regions, &n);
    return fy_pool_layout_size(regions, n);
}

/* The state region: two units' whole state, or two pieces' (l->state_pieces, state_slot_bytes). */
static int layout_state(const struct fy_pool *p, const struct fy_model_config *c,
                        struct fy_plan_layout *l)
{
    uint64_t bytes;
    FY_TRY(fy_pool_region(p, "state", &l->state, &bytes));
    l->state_pieces = bytes < 2 * fy_plan_state_slot_bytes(c, 0);
    l->state_slot_bytes = fy_plan_state_slot_bytes(c, l->state_pieces);
    FY_REQUIRE(bytes >= 2 * l->state_slot_bytes, -EINVAL,
               "shared pool: a state region of %llu bytes does not hold two pieces' state",
               (unsigned long long)bytes);
    return 0;
}

int fy_plan_layout_read(const struct fy_pool *p, const struct fy_plan_shape *s,
                        struct fy_plan_layout *l)
{
    const struct fy_model_config *c = s->c;
    int B = s->B, T = s->T;
    uint64_t bytes;
    memset(l, 0, sizeof *l);
    l->c = c;
    l->B = B;
    l->T = T;
    l->act_dtype = s->act_dtype;
    l->act_bytes = fy_plan_act_bytes(c, B, T, s->act_dtype);
    l->tok_bytes = (uint64_t)B * T * 4;
    l->slot_bytes = embed_grad_bytes(c);
    l->weight_dtype = s->weight_dtype == FY_DTYPE_BF16 ? FY_DTYPE_BF16 : FY_DTYPE_F32;
    l->wslot0_bytes = wslot0_bytes(c, l->weight_dtype);
    l->wslot_bytes = wslot_bytes(c, l->weight_dtype);
    FY_TRY(fy_pool_region(p, "meta", &l->meta, &bytes));
    /* a session that moves units alone (weight_dtype 0: init, export) has the state slots alone
     * (fy_plan_unit_regions) */
    if (s->weight_dtype == 0)
        return layout_state(p, c, l);
    FY_TRY(fy_pool_region(p, "tokens", &l->tokens, &bytes));
    l->targets = l->tokens + align4k(l->tok_bytes);
    l->positions = l->tokens + 2 * align4k(l->tok_bytes);
    l->embed_rows = l->tokens + 3 * align4k(l->tok_bytes);
    FY_REQUIRE(bytes >= 3 * align4k(l->tok_bytes) + embed_rows_bytes(c), -EINVAL,
               "pool too small for batch %d x %d", B, T);
    FY_TRY(fy_pool_region(p, "acts", &l->acts, &bytes));
    l->act_slots = (unsigned)(bytes / align4k(l->act_bytes));
    FY_REQUIRE(l->act_slots >= 1, -EINVAL, "pool too small for batch %d x %d", B, T);
    FY_TRY(fy_pool_region(p, "dacts", &l->dacts, &bytes));
    l->dact_slots = (unsigned)(bytes / align4k(l->act_bytes));
    FY_TRY(fy_pool_region(p, "weights", &l->weights, &bytes));
    /* slot 0 for the embeddings, then the prefetch depth + 1 that the units take in turn */
    uint64_t others = bytes > l->wslot0_bytes ? (bytes - l->wslot0_bytes) / l->wslot_bytes : 0;
    l->wslots = (unsigned)others;
    FY_REQUIRE(others >= 2 && l->wslots <= FY_PLAN_PREFETCH_MAX + 1, -EINVAL,
               "shared pool: a weights region of %llu bytes is not 3 to %d unit slots of %s "
               "weights",
               (unsigned long long)bytes, FY_PLAN_PREFETCH_MAX + 2, fy_dtype_name(l->weight_dtype));
    if (fy_pool_has_region(p, "landing")) {
        FY_TRY(fy_pool_region(p, "landing", &l->land, &bytes));
        l->land_chunk = fy_plan_land_chunk(c);
        l->land_slots = (unsigned)(bytes / l->land_chunk);
        FY_REQUIRE(l->land_slots >= 2, -EINVAL,
                   "shared pool: a landing region of %llu bytes does not hold two chunks of %llu",
                   (unsigned long long)bytes, (unsigned long long)l->land_chunk);
    }
    FY_TRY(fy_pool_region(p, "grads", &l->grads, &l->grads_bytes));
    /* the block slots, less clipping's final-unit gradient after them (without clipping it lies
     * from slot 1 on, over the block slots and past them where it is the larger) */
    l->bslot_bytes = block_slot_bytes(c);
    l->dfinal_bytes = dfinal_bytes(c);
    uint64_t fixed = l->slot_bytes + (s->clip ? l->dfinal_bytes : 0);
    uint64_t gslots = l->grads_bytes >= fixed ? (l->grads_bytes - fixed) / l->bslot_bytes : 0;
    gslots = gslots > FY_PLAN_GRAD_SLOTS_MAX ? FY_PLAN_GRAD_SLOTS_MAX : gslots;
    FY_REQUIRE(gslots >= FY_PLAN_GRAD_SLOTS_MIN &&
                   (s->clip || l->grads_bytes >= l->slot_bytes + l->dfinal_bytes),
               -EINVAL,
               "shared pool: a grads region of %llu bytes does not hold %d to %d block gradients "
               "and the final unit's",
               (unsigned long long)l->grads_bytes, FY_PLAN_GRAD_SLOTS_MIN, FY_PLAN_GRAD_SLOTS_MAX);
    l->gslots = (unsigned)gslots;
    FY_TRY(layout_state(p, c, l));
    if (s->clip && fy_pool_has_region(p, "gradhold")) {
        FY_TRY(fy_pool_region(p, "gradhold", &l->hold, &bytes));
        FY_REQUIRE(bytes >= fy_plan_hold_bytes(c), -EINVAL,
                   "shared pool: a gradhold region of %llu bytes does not hold the %u blocks' "
                   "gradients",
                   (unsigned long long)bytes, c->n_layer);
    }
    return 0;
}

int fy_plan_resident_offsets(const struct fy_pool *p, const struct fy_model_config *c,
                             const unsigned char *resident, uint64_t *offsets, uint64_t *copies)
{
    unsigned units = fy_model_unit_count(c);
    memset(offsets, 0, units * sizeof *offsets);
    memset(copies, 0, units * sizeof *copies);
    if (fy_plan_resident_bytes(c, resident) == 0)
        return 0;
    uint64_t start, bytes, at;
    FY_TRY(fy_pool_region(p, "resident", &start, &bytes));
    at = start;
    for (unsigned u = 0; u < units; u++)
        if (resident[u]) {
            offsets[u] = at;
            at += fy_optstate_bytes(c, u);
            if (resident[u] == FY_PLAN_KEPT_BF16) {
                copies[u] = at;
                at += fy_optstate_copy_bytes(c, u);
            }
        }
    FY_REQUIRE(at - start <= bytes, -EINVAL,
               "shared pool: a resident region of %llu bytes does not hold the plan's %llu (made "
               "by fy_plan_regions for another plan?)",
               (unsigned long long)bytes, (unsigned long long)(at - start));
    return 0;
}

uint64_t fy_plan_hold_bytes(const struct fy_model_config *c)
{
    return (uint64_t)c->n_layer * block_slot_bytes(c);
}
