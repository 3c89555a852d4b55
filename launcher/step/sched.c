/* The schedule of a training step over an executor (launcher/step/sched.h). */
#include "launcher/step/sched.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/dtype.h"
#include "common/knobs.h"
#include "common/log.h"
#include "common/optstate.h"
#include "launcher/step/commit.h"

static uint64_t align4k(uint64_t v) { return (v + 4095) / 4096 * 4096; }

/* Where unit u's master weights lie in its state at pool offset `state`. */
static uint64_t fy_sched_master(const struct fy_model_config *c, unsigned u, uint64_t state)
{
    struct fy_optstate_layout lay;
    fy_optstate_layout(c, u, &lay);
    return state + lay.section[FY_OPTSTATE_MASTER].offset;
}

static uint64_t fy_sched_act(const struct fy_plan_layout *l, unsigned i)
{
    return l->acts + i * align4k(l->act_bytes);
}
static uint64_t fy_sched_dact(const struct fy_plan_layout *l, unsigned i)
{
    return l->dacts + i * align4k(l->act_bytes);
}
static uint64_t fy_sched_wslot(const struct fy_plan_layout *l, unsigned i)
{
    return i == 0 ? l->weights : l->weights + l->wslot0_bytes + (i - 1) * l->wslot_bytes;
}
/* Grads slot 0 (the embeddings' gradient, a unit slot), 1..gslots (block-sized), and gslots + 1
 * (after them: clipping's final-unit gradient). */
static uint64_t fy_sched_gslot(const struct fy_plan_layout *l, unsigned i)
{
    return i == 0 ? l->grads : l->grads + l->slot_bytes + (i - 1) * l->bslot_bytes;
}
/* A unit's f32 gradient. */
static uint64_t fy_sched_grad_bytes(const struct fy_plan_layout *l, unsigned u)
{
    return fy_model_unit_params(l->c, u) * 4;
}

/* How a state transfer takes digests: a read unchecked, a read checked against the piece's
 * digest in r->copies.digest (a write: its digest into r->copies.digest), or a read whose digest goes to
 * r->copies.digest unchecked (the pieces of a unit whose record has their digests' digest alone). */
enum { FY_SCHED_DIGEST_NONE, FY_SCHED_DIGEST_CHECK, FY_SCHED_DIGEST_REPORT };

/* Piece k of unit u's state between the pool at pool_offset and its copy `copy` in the store. */
static int fy_sched_piece_io(struct fy_sched *r, int op, unsigned u, unsigned k, unsigned copy,
                             uint64_t pool_offset, int how, struct fy_ticket *t)
{
    struct fy_optstate_piece p;
    fy_optstate_piece(r->l.c, u, k, &p, NULL);
    struct fy_desc d[2];
    d[0] = fy_desc_region(op, FY_KIND_RAW, FY_DTYPE_NONE, pool_offset, p.layout.bytes,
                          how == FY_SCHED_DIGEST_NONE ? -1 : (int)u);
    d[0].tensor = FY_TENSOR_UNIT_STATE_COPY(u, copy);
    d[0].arg = p.offset;
    if (how == FY_SCHED_DIGEST_NONE)
        return fy_ticket_issue(&r->tk, FY_TICKET_IO, d, 1, t);
    uint64_t *digest = &r->copies.digest[r->copies.pfirst[u] + k];
    d[1] = fy_desc_region(op, FY_KIND_CONTROL, FY_DTYPE_NONE, 0, 0, (int)u);
    d[1].arg = *digest;
    d[1].step = how == FY_SCHED_DIGEST_REPORT ? FY_IO_DIGEST_REPORT : 0;
    t->digest_into = op == FY_OP_IO_WRITE || how == FY_SCHED_DIGEST_REPORT ? digest : NULL;
    return fy_ticket_issue(&r->tk, FY_TICKET_IO, d, 2, t);
}

/* A unit's whole state between the pool and its copy `copy` in the store, piece by piece (one
 * request a piece, answered as one ticket), with their digests (piece_io's `how`). */
static int state_io(struct fy_sched *r, int op, unsigned u, unsigned copy, uint64_t pool_offset,
                    int how, struct fy_ticket *t)
{
    for (unsigned k = 0, n = fy_optstate_piece_count(r->l.c, u); k < n; k++) {
        struct fy_optstate_piece p;
        fy_optstate_piece(r->l.c, u, k, &p, NULL);
        struct fy_ticket more = {0};
        FY_TRY(
            fy_sched_piece_io(r, op, u, k, copy, pool_offset + p.offset, how, k == 0 ? t : &more));
        if (k > 0)
            FY_TRY(fy_ticket_join(&r->tk, t, &more));
    }
    return 0;
}

/* The copy that holds unit u's latest state. */
static unsigned fy_sched_copy_of(const struct fy_sched *r, unsigned u)
{
    return r->copies.at != NULL ? r->copies.at[u] : r->copies.read;
}

static int fy_sched_has_copy(const struct fy_sched *r, unsigned u)
{
    return r->wcopy != NULL && r->wcopy[u] != 0;
}

static int fy_sched_bf16(const struct fy_sched *r) { return r->l.weight_dtype == FY_DTYPE_BF16; }

/* Whether unit u's state is in several pieces (common/optstate.h). */
static int fy_sched_in_pieces(const struct fy_sched *r, unsigned u)
{
    return fy_optstate_piece_count(r->l.c, u) > 1;
}

/* The weights the gpu worker is sent, and their element size. */
static int fy_sched_weight_dtype(const struct fy_sched *r)
{
    return fy_sched_bf16(r) ? FY_DTYPE_BF16 : FY_DTYPE_F32;
}

/* Whether unit u's weights are written into a weights slot by the opt worker for each gpu request
 * that reads them (opt-convert): with bf16 weights, a unit without a copy (fy_plan_converts),
 * rounded to bf16; with f32 weights, a unit in pieces, its pieces' masters copied together. */
static int fy_sched_converts(const struct fy_sched *r, unsigned u)
{
    return fy_sched_bf16(r) ? !fy_sched_has_copy(r, u) : fy_sched_in_pieces(r, u);
}

/* The first unit from u on that converts (the unit count: none), for the optimizer queue's hold
 * in the forward, which goes up the units. */
static unsigned fy_sched_next_converted(const struct fy_sched *r, unsigned u)
{
    unsigned units = fy_model_unit_count(r->l.c);
    while (u < units && !fy_sched_converts(r, u))
        u++;
    return u;
}

/* Weights slot `slot` about to be filled for unit u: the gpu request that read it last (in this
 * pass: wslot_user) done first, whatever the caller waited for already, so that no slot is
 * written while a request in flight reads it; then it is unit u's (weights_of checks it). */
static int fy_sched_wslot_claim(struct fy_sched *r, unsigned slot, unsigned u)
{
    if (r->wslot_user[slot] != NULL)
        FY_TRY(fy_ticket_wait(&r->tk, r->wslot_user[slot], NULL));
    r->wslot_user[slot] = NULL;
    r->wslot_unit[slot] = (int)u;
    return 0;
}

/* A gpu request (ticket t) reads weights slot `slot` until t is done. */
static void fy_sched_wslot_used_by(struct fy_sched *r, unsigned slot, struct fy_ticket *t)
{
    r->wslot_user[slot] = t;
}

/* The tickets of a pass are gone at its end, all waited for. */
static void fy_sched_wslot_forget_users(struct fy_sched *r)
{
    memset(r->wslot_user, 0, sizeof r->wslot_user);
}

/* Unit u's weights converted from its state at pool offset `state` (kept in the pool, or in a
 * state slot) into weights slot `slot` by the opt worker (opt-convert): its f32 master rounded to
 * bf16, or the masters of its pieces (a STATE part) rounded or copied into their places. The
 * queued updates of units up to u go to the opt worker first (fy_optq_send_through): it serves
 * requests in order, so the conversion reads the master u's update wrote. */
static int fy_sched_convert_into(struct fy_sched *r, unsigned u, uint64_t state, unsigned slot,
                                 struct fy_ticket *t)
{
    FY_TRY(fy_sched_wslot_claim(r, slot, u));
    uint64_t n = fy_model_unit_params(r->l.c, u);
    int wd = fy_sched_weight_dtype(r);
    r->wslot_off[slot] = fy_sched_wslot(&r->l, slot);
    struct fy_desc d[2] = {
        fy_sched_in_pieces(r, u) ? fy_desc_region(FY_OP_OPT_CONVERT, FY_KIND_STATE, FY_DTYPE_NONE,
                                                  state, fy_optstate_bytes(r->l.c, u), (int)u)
                                 : fy_desc_region(FY_OP_OPT_CONVERT, FY_KIND_MASTER, FY_DTYPE_F32,
                                                  fy_sched_master(r->l.c, u, state), n * 4, (int)u),
        fy_desc_region(FY_OP_OPT_CONVERT, FY_KIND_WEIGHTS, wd, fy_sched_wslot(&r->l, slot),
                       n * fy_dtype_size(wd), (int)u)};
    FY_TRY(fy_optq_send_through(&r->opt, u));
    return fy_ticket_issue(&r->tk, FY_TICKET_OPT, d, 2, t);
}

/* A chunk of a streamed unit's master on its way through the landing ring: `bytes` at byte `at` of
 * its state extent, holding its parameters [first, first + count). */
struct land_chunk {
    uint64_t at, bytes, first, count;
};

/* The chunks of unit u's master, piece by piece (a chunk never spans two pieces), into out (NULL:
 * only counted); returns how many. */
static uint64_t land_chunks(const struct fy_sched *r, unsigned u, struct land_chunk *out)
{
    uint64_t chunk = r->l.land_chunk, per = chunk / 4, i = 0;
    for (unsigned k = 0, n = fy_optstate_piece_count(r->l.c, u); k < n; k++) {
        struct fy_optstate_piece p;
        fy_optstate_piece(r->l.c, u, k, &p, NULL);
        const struct fy_optstate_section *m = &p.layout.section[FY_OPTSTATE_MASTER];
        for (uint64_t j = 0; j * chunk < m->padded; j++, i++)
            if (out != NULL)
                out[i] = (struct land_chunk){
                    .at = p.offset + m->offset + j * chunk,
                    .bytes = m->padded - j * chunk < chunk ? m->padded - j * chunk : chunk,
                    .first = p.begin + j * per,
                    .count = p.params - j * per < per ? p.params - j * per : per};
    }
    return i;
}

/* A streamed unit's master from the store into weights slot `slot` in the weights' dtype: read
 * chunk by chunk (each piece's master section in turn) into the landing ring's slots in turn,
 * each chunk converted by the opt worker into its place in the weights slot once read (rounded to
 * bf16, or copied: f32 weights of a unit in pieces), and a ring slot read into again once its
 * conversion is done, so that the io worker reads ahead while the opt worker converts. Returns
 * once the unit's weights are all in the slot. */
static int stream_weights(struct fy_sched *r, unsigned u, unsigned slot)
{
    const struct fy_plan_layout *l = &r->l;
    FY_REQUIRE(l->land_slots >= 2, -EINVAL,
               "shared pool: no landing ring for unit %u's weights (laid out for a plan that keeps "
               "every unit?)",
               u);
    FY_TRY(fy_sched_wslot_claim(r, slot, u));
    r->wslot_off[slot] = fy_sched_wslot(l, slot);
    uint64_t chunk = l->land_chunk, chunks = land_chunks(r, u, NULL), next = 0;
    struct land_chunk *c = malloc(chunks * sizeof *c);
    FY_REQUIRE(c != NULL, -ENOMEM, "train: out of memory");
    land_chunks(r, u, c);
    int wd = fy_sched_weight_dtype(r);
    size_t size = fy_dtype_size(wd);
    unsigned ring = l->land_slots < FY_PLAN_LAND_SLOTS ? l->land_slots : FY_PLAN_LAND_SLOTS;
    struct fy_ticket rd[FY_PLAN_LAND_SLOTS] = {{0}}, cv[FY_PLAN_LAND_SLOTS] = {{0}};
    int rc = fy_optq_send_through(&r->opt, u);
    for (uint64_t i = 0; rc == 0 && i < chunks; i++) {
        /* the reads up to ring - 1 chunks ahead, each into a ring slot whose conversion is done */
        for (; rc == 0 && next < chunks && next < i + ring; next++) {
            unsigned k = (unsigned)(next % ring);
            rc = fy_ticket_wait(&r->tk, &cv[k], NULL);
            struct fy_desc d = fy_desc_region(FY_OP_IO_READ, FY_KIND_RAW, FY_DTYPE_NONE,
                                              l->land + k * chunk, c[next].bytes, (int)u);
            d.tensor = FY_TENSOR_UNIT_STATE_COPY(u, fy_sched_copy_of(r, u));
            d.arg = c[next].at;
            if (rc == 0)
                rc = fy_ticket_issue(&r->tk, FY_TICKET_IO, &d, 1, &rd[k]);
        }
        unsigned k = (unsigned)(i % ring);
        if (rc == 0)
            rc = fy_ticket_wait(&r->tk, &rd[k], NULL);
        struct fy_desc d[2] = {fy_desc_region(FY_OP_OPT_CONVERT, FY_KIND_MASTER, FY_DTYPE_F32,
                                              l->land + k * chunk, c[i].count * 4, (int)u),
                               fy_desc_region(FY_OP_OPT_CONVERT, FY_KIND_WEIGHTS, wd,
                                              fy_sched_wslot(l, slot) + c[i].first * size,
                                              c[i].count * size, (int)u)};
        if (rc == 0)
            rc = fy_ticket_issue(&r->tk, FY_TICKET_OPT, d, 2, &cv[k]);
    }
    for (unsigned k = 0; k < FY_PLAN_LAND_SLOTS; k++) { /* nothing stays in flight */
        int w = fy_ticket_wait(&r->tk, &rd[k], NULL);
        w = w ? w : fy_ticket_wait(&r->tk, &cv[k], NULL);
        rc = rc ? rc : w;
    }
    free(c);
    return rc;
}

/* A unit's weights into weights slot `slot` for a gpu request, *t the request that brings them
 * (none: they are there). f32 weights: the master section alone of its state in the store, or
 * where the unit is kept in the pool its master there (nothing read). bf16 weights: a kept unit's
 * copy where it has one. Otherwise (bf16, or f32 of a unit in pieces) the master converted
 * (convert_into from where it is kept, stream_weights from the store). */
static int fy_sched_read_weights(struct fy_sched *r, unsigned unit, unsigned slot,
                                 struct fy_ticket *t)
{
    int kept = r->resident != NULL && r->resident[unit] != 0;
    if (fy_sched_bf16(r) && fy_sched_has_copy(r, unit)) {
        r->wslot_unit[slot] = (int)unit;
        r->wslot_off[slot] = r->wcopy[unit];
        return 0;
    }
    if (fy_sched_converts(r, unit) && kept)
        return fy_sched_convert_into(r, unit, r->resident[unit], slot, t);
    if (fy_sched_converts(r, unit))
        return stream_weights(r, unit, slot);
    r->wslot_unit[slot] = (int)unit;
    if (kept) { /* its master weights are already in the pool */
        r->wslot_off[slot] = fy_sched_master(r->l.c, unit, r->resident[unit]);
        return 0;
    }
    FY_TRY(fy_sched_wslot_claim(r, slot, unit));
    struct fy_optstate_layout lay;
    fy_optstate_layout(r->l.c, unit, &lay);
    const struct fy_optstate_section *master = &lay.section[FY_OPTSTATE_MASTER];
    r->wslot_off[slot] = fy_sched_wslot(&r->l, slot);
    struct fy_desc d = fy_desc_region(FY_OP_IO_READ, FY_KIND_RAW, FY_DTYPE_NONE,
                                      fy_sched_wslot(&r->l, slot), master->padded, -1);
    d.tensor = FY_TENSOR_UNIT_STATE_COPY(unit, fy_sched_copy_of(r, unit));
    d.arg = master->offset;
    return fy_ticket_issue(&r->tk, FY_TICKET_IO, &d, 1, t);
}

/* Weights slot of unit u (a block, or the final unit) in the forward and backward: slots 1 to
 * wslots in turn, so that the weights of the next wslots - 1 units can be read while one computes. */
static unsigned fy_sched_block_wslot(const struct fy_plan_layout *l, unsigned u)
{
    return 1 + u % l->wslots;
}

/* The weights slot holding unit u, checked (see wslot_unit). */
static int fy_sched_weights_of(struct fy_sched *r, unsigned u, unsigned slot, uint64_t *offset)
{
    FY_REQUIRE(r->wslot_unit[slot] == (int)u, -EPROTO,
               "schedule error: unit %u's weights expected in slot %u, which holds unit %d's", u,
               slot, r->wslot_unit[slot]);
    *offset = r->wslot_off[slot];
    return 0;
}

/* Unit u's weights at pool offset `at` as a gpu request's part: bf16 (a copy or a weights slot)
 * with bf16 weights, else its f32 master. */
static struct fy_desc fy_sched_weights_region(const struct fy_sched *r, int op, unsigned u,
                                              uint64_t at, int layer)
{
    struct fy_optstate_layout lay;
    fy_optstate_layout(r->l.c, u, &lay);
    if (fy_sched_bf16(r))
        return fy_desc_region(op, FY_KIND_WEIGHTS, FY_DTYPE_BF16, at,
                              lay.params * fy_dtype_size(FY_DTYPE_BF16), layer);
    const struct fy_optstate_section *m = &lay.section[FY_OPTSTATE_MASTER];
    return fy_desc_region(op, FY_KIND_WEIGHTS, m->dtype, at, m->bytes, layer);
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

/* The blocks' swapped internals for this run (see struct fy_sched): masks per block, the pool-kept
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

/* The batch's positions (the tokens region's third array: each token's position in its document),
 * the part that gpt-embed-fwd, gpt-embed-bwd, gpt-block-fwd and gpt-block-bwd carry right after
 * their fixed parts. */
static struct fy_desc fy_sched_positions_part(const struct fy_plan_layout *l, int op, int layer)
{
    return fy_desc_region(op, FY_KIND_TOKENS, FY_DTYPE_I32, l->positions, l->tok_bytes, layer);
}

/* Appends block b's saved parts to a request of n parts (the SSD one at ssd_off, which
 * fy_spill_out or fy_spill_in gave); returns the new count. */
static unsigned fy_sched_saved_parts(const struct fy_sched *r, unsigned b, int op, uint64_t ssd_off,
                                     struct fy_desc *req, unsigned n)
{
    const unsigned mask[2] = {r->swap.host_mask[b], r->swap.ssd_mask[b]};
    const uint64_t off[2] = {r->swap.host_off[b], ssd_off};
    for (int i = 0; i < 2; i++)
        if (mask[i] != 0) {
            struct fy_actplan_region reg;
            fy_actplan_region_of(&r->swap.sizes, mask[i], &reg);
            req[n] = fy_desc_region(op, FY_KIND_SAVED, FY_DTYPE_NONE, off[i], reg.bytes, (int)b);
            req[n++].arg = mask[i];
        }
    return n;
}

/* In a backward pass, after block b's request: the checkpoints and the SSD-placed internals of
 * the next act_ahead blocks on their way into their slots, nearest first (each slot's previous
 * item belongs to a block whose backward is done or is the request before b's). */
static int backward_ahead(struct fy_sched *r, unsigned b)
{
    for (unsigned a = b - 1; a >= 1 && a + r->act_ahead >= b; a--) {
        FY_TRY(fy_spill_in(&r->block_inputs, a - 1, 0, NULL));
        if (r->swap.ssd_mask[a])
            FY_TRY(fy_spill_in(&r->swap.ring, a - 1, 0, NULL));
    }
    return 0;
}

/* Block b's backward, in either pass: its checkpoint (and its internals placed on the SSD) waited
 * for in their slots, its weights at w_off, dy in and dx out, its gradient into `grad`; then the
 * next blocks' inputs on their way. */
static int fy_sched_block_backward(struct fy_sched *r, unsigned b, uint64_t w_off, uint64_t dy,
                                   uint64_t dx, uint64_t grad, int hold, struct fy_ticket *t)
{
    const struct fy_plan_layout *l = &r->l;
    uint64_t x_off = 0, s_off = 0;
    FY_TRY(fy_spill_in(&r->block_inputs, b - 1, 1, &x_off));
    if (r->swap.ssd_mask[b])
        FY_TRY(fy_spill_in(&r->swap.ring, b - 1, 1, &s_off));
    int op = FY_OP_GPT_BLOCK_BWD;
    struct fy_desc req[FY_DESC_MAX_PARTS];
    req[0] = fy_sched_weights_region(r, op, b, w_off, (int)b);
    req[1] = fy_desc_region(op, FY_KIND_ACTIVATION, l->act_dtype, x_off, l->act_bytes, (int)b);
    req[2] = fy_desc_region(op, FY_KIND_GRAD, l->act_dtype, dy, l->act_bytes, (int)b);
    req[3] = fy_desc_region(op, FY_KIND_GRAD, l->act_dtype, dx, l->act_bytes, (int)b);
    req[4] =
        fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, grad, fy_sched_grad_bytes(l, b), (int)b);
    req[4].arg = hold ? b : 0; /* and kept in the gpu worker's buffer b - 1 */
    req[5] = fy_sched_positions_part(l, op, (int)b);
    FY_TRY(fy_ticket_issue(&r->tk, FY_TICKET_GPU, req,
                           fy_sched_saved_parts(r, b, op, s_off, req, 6), t));
    fy_spill_used_by(&r->block_inputs, b - 1, t);
    if (r->swap.ssd_mask[b])
        fy_spill_used_by(&r->swap.ring, b - 1, t);
    return b >= 2 ? backward_ahead(r, b) : 0;
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
    /* the state slots as the plan took them: a unit's whole state, or a piece's */
    if (o->state_pieces && !r->l.state_pieces) {
        r->l.state_pieces = 1;
        r->l.state_slot_bytes = fy_optstate_max_piece_bytes(c);
    }
    FY_REQUIRE(o->state_pieces == r->l.state_pieces, -EINVAL,
               "shared pool: state slots of %llu bytes, not the whole units' this plan reads "
               "before their backward (laid out for the state in pieces?)",
               (unsigned long long)r->l.state_slot_bytes);
    FY_REQUIRE(r->l.gslots >= 2 || (r->l.state_pieces && !r->clip.on), -EINVAL,
               "shared pool: %u block gradient slot, where whole units' state or clipping takes "
               "two at least (laid out for another plan?)",
               r->l.gslots);
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
    FY_TRY(saved_setup(r, o));
    /* the kept units' state, and their copies: offsets 0 for the others (all where none is kept) */
    return fy_plan_resident_offsets(r->pool, c, o->resident, r->resident, r->wcopy);
}

void fy_sched_free(struct fy_sched *r)
{
    fy_optq_free(&r->opt);
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

/* Block b's gradient, held in the gpu worker since the norm pass, to the pool at `grad`. */
static int fy_sched_grad_send(struct fy_sched *r, unsigned b, uint64_t grad, struct fy_ticket *t)
{
    struct fy_desc d = fy_desc_region(FY_OP_GPT_GRAD_SEND, FY_KIND_GRAD, FY_DTYPE_F32, grad,
                                      fy_sched_grad_bytes(&r->l, b), (int)b);
    d.arg = b; /* the gpu worker's buffer b - 1 */
    return fy_ticket_issue(&r->tk, FY_TICKET_GPU, &d, 1, t);
}

/* Whether unit u's gradient is held in the gpu worker (a block, with r->clip.hold_gpu). */
static int fy_sched_held_on_gpu(const struct fy_sched *r, unsigned u)
{
    return r->clip.hold_gpu && u >= 1 && u <= r->l.c->n_layer;
}

static int fy_sched_state_read(struct fy_sched *r, unsigned u, unsigned s, struct fy_ticket *t);
static int fy_sched_state_write(struct fy_sched *r, unsigned u, unsigned s, struct fy_ticket *t);
static int fy_sched_enqueue_scaled(struct fy_sched *r, unsigned u, unsigned s, uint64_t grad,
                                   uint64_t step, double lr, double scale);
static uint64_t fy_sched_clipped_grad(const struct fy_sched *r, unsigned u);

/* A unit's weights for the forward, into weights slot `slot`: read_weights', or, for a block whose
 * update one-pass clipping deferred, its whole state into state slot u & 1, which forward_update
 * updates there and the forward takes the master from (with bf16 weights, converted from there
 * into the slot). The state slot's last block must be done with it first: its forward request (in
 * g) and its write-back (in fws). The forward goes up the units, so the updates of the units from
 * the next one it converts on are held back in the optimizer's queue (launcher/step/optq.h). */
static int forward_read(struct fy_sched *r, unsigned u, unsigned slot, struct fy_ticket *t,
                        struct fy_ticket *g, struct fy_ticket *fws)
{
    fy_optq_hold_from(&r->opt, fy_sched_next_converted(r, u + (r->clip.deferred[u] ? 0 : 1)));
    if (!r->clip.deferred[u])
        return fy_sched_read_weights(r, u, slot, t);
    unsigned s = u & 1;
    int last = r->state_unit[s];
    if (last >= 1 && (unsigned)last <= r->l.c->n_layer)
        FY_TRY(fy_ticket_wait(&r->tk, &g[last], NULL));
    FY_TRY(fy_ticket_wait(&r->tk, &fws[s], NULL));
    FY_TRY(fy_sched_state_read(r, u, s, t));
    /* grads slot 1 + s: its last block's update (forward_update) was waited for */
    if (fy_sched_held_on_gpu(r, u))
        FY_TRY(fy_sched_grad_send(r, u, fy_sched_gslot(&r->l, 1 + s), &r->clip.gsend[s]));
    if (fy_sched_converts(r, u)) /* converted once updated (forward_update) */
        return fy_sched_wslot_claim(r, slot, u);
    r->wslot_unit[slot] = (int)u;
    r->wslot_off[slot] = fy_sched_master(r->l.c, u, r->state_off[s]);
    return 0;
}

/* Block b's deferred update, its state read into state slot b & 1 (forward_read): AdamW there,
 * waited for, then the state written back while the forward reads the new master (with bf16
 * weights, converted into the block's weights slot `slot` first, waited for). */
static int fy_sched_deferred_update(struct fy_sched *r, unsigned b, unsigned slot,
                                    struct fy_ticket *fws)
{
    unsigned s = b & 1;
    uint64_t grad = fy_sched_clipped_grad(r, b);
    if (fy_sched_held_on_gpu(r, b)) { /* sent by forward_read */
        FY_TRY(fy_ticket_wait(&r->tk, &r->clip.gsend[s], NULL));
        grad = fy_sched_gslot(&r->l, 1 + s);
    }
    FY_TRY(fy_sched_enqueue_scaled(r, b, s, grad, r->clip.deferred_step, r->clip.deferred_lr,
                                   r->clip.deferred_scale));
    FY_TRY(fy_optq_settle(&r->opt, b));
    if (fy_sched_converts(r, b)) {
        struct fy_ticket t = {0};
        FY_TRY(fy_sched_convert_into(r, b, r->state_off[s], slot, &t));
        FY_TRY(fy_ticket_wait(&r->tk, &t, NULL));
    }
    FY_TRY(fy_sched_state_write(r, b, s, &fws[s]));
    r->clip.deferred[b] = 0;
    return 0;
}

/* Forward through every unit; with `train`, also the head's backward into dacts[0] and the grads.
 * The weights of the next units are read while the current block computes, as many ahead as the
 * prefetch depth (weights slots 1.. in turn). */
int fy_sched_forward(struct fy_sched *r, int train, uint64_t step, double *loss)
{
    const struct fy_plan_layout *l = &r->l;
    const struct fy_model_config *c = l->c;
    unsigned L = c->n_layer, fin = L + 1;
    struct fy_desc req[FY_DESC_MAX_PARTS], reply = {0};
    struct fy_ticket t_embed = {0}, g_embed = {0}, head = {0}, fws[2] = {{0}};
    struct fy_ticket *rw = calloc(L + 2, sizeof *rw), *g = calloc(L + 2, sizeof *g);
    unsigned depth = l->wslots - 1;
    int rc = rw && g ? 0 : -ENOMEM;
    for (unsigned u = 0; rc == 0 && u <= fin; u++)
        if (train && r->version[u] != step - 1) {
            fy_error(
                "schedule error: unit %u holds step %llu's weights, step %llu needs step %llu's", u,
                (unsigned long long)r->version[u], (unsigned long long)step,
                (unsigned long long)(step - 1));
            rc = -EPROTO;
        }
    /* slot 0 keeps the embeddings until the tied head has used them; the blocks and then the
     * final unit take the other slots in turn */
    if (rc == 0)
        rc = forward_read(r, 0, 0, &t_embed, g, fws);
    for (unsigned u = 1; rc == 0 && u <= fin && u <= depth; u++)
        rc = forward_read(r, u, fy_sched_block_wslot(l, u), &rw[u], g, fws);
    if (rc == 0)
        rc = fy_ticket_wait(&r->tk, &t_embed, NULL);
    uint64_t w_embed = 0;
    if (rc == 0)
        rc = fy_sched_weights_of(r, 0, 0, &w_embed);
    if (rc == 0) /* the previous step's update of this unit, which may still be running */
        rc = fy_optq_settle(&r->opt, 0);
    uint64_t x_out = 0, x_in = 0;
    if (rc == 0)
        rc = fy_spill_out(&r->block_inputs, 0, &x_out);
    if (rc == 0) {
        int op = FY_OP_GPT_EMBED_FWD;
        req[0] = fy_desc_region(op, FY_KIND_TOKENS, FY_DTYPE_I32, l->tokens, l->tok_bytes, 0);
        req[1] = fy_sched_weights_region(r, op, 0, w_embed, 0);
        req[2] = fy_desc_region(op, FY_KIND_ACTIVATION, l->act_dtype, x_out, l->act_bytes, 0);
        req[3] = fy_sched_positions_part(l, op, 0);
        rc = fy_ticket_issue(&r->tk, FY_TICKET_GPU, req, 4, &g_embed);
        fy_spill_used_by(&r->block_inputs, 0, &g_embed);
        fy_sched_wslot_used_by(r, 0, &g_embed);
    }
    for (unsigned b = 1; rc == 0 && b <= L; b++) {
        rc = fy_ticket_wait(&r->tk, &rw[b], NULL);
        uint64_t w_off = 0;
        if (rc == 0 && r->clip.deferred[b])
            rc = fy_sched_deferred_update(r, b, fy_sched_block_wslot(l, b), fws);
        if (rc == 0)
            rc = fy_sched_weights_of(r, b, fy_sched_block_wslot(l, b), &w_off);
        if (rc == 0)
            rc = fy_optq_settle(&r->opt, b);
        if (rc == 0)
            rc = fy_spill_in(&r->block_inputs, b - 1, 0, &x_in); /* the slot block b-1 just wrote */
        if (rc == 0)
            rc = fy_spill_out(&r->block_inputs, b, &x_out);
        uint64_t s_off = 0; /* the slot of block b's internals on their way to the store */
        int swaps = train && r->swap.ssd_mask[b] != 0;
        if (rc == 0 && swaps)
            rc = fy_spill_out(&r->swap.ring, b - 1, &s_off);
        int op = FY_OP_GPT_BLOCK_FWD;
        req[0] = fy_sched_weights_region(r, op, b, w_off, (int)b);
        req[1] = fy_desc_region(op, FY_KIND_ACTIVATION, l->act_dtype, x_in, l->act_bytes, (int)b);
        req[2] = fy_desc_region(op, FY_KIND_ACTIVATION, l->act_dtype, x_out, l->act_bytes, (int)b);
        req[3] = fy_sched_positions_part(l, op, (int)b);
        unsigned n = train ? fy_sched_saved_parts(r, b, op, s_off, req, 4) : 4;
        if (rc == 0)
            rc = fy_ticket_issue(&r->tk, FY_TICKET_GPU, req, n, &g[b]);
        fy_sched_wslot_used_by(r, fy_sched_block_wslot(l, b), &g[b]);
        fy_spill_used_by(&r->block_inputs, b - 1, &g[b]);
        fy_spill_used_by(&r->block_inputs, b, &g[b]);
        if (swaps)
            fy_spill_used_by(&r->swap.ring, b - 1, &g[b]);
        if (rc == 0 && train) /* x_{b-1} to the store once its block has written it */
            rc = fy_spill_write(&r->block_inputs, b - 1, b == 1 ? &g_embed : &g[b - 1]);
        if (rc == 0 && train && b >= 2 && r->swap.ssd_mask[b - 1]) /* and block b-1's internals */
            rc = fy_spill_write(&r->swap.ring, b - 2, &g[b - 1]);
        /* unit b+depth goes into the slot block b-1 had: once that block has run */
        unsigned next = b + depth;
        if (rc == 0 && next <= fin && b >= 2)
            rc = fy_ticket_wait(&r->tk, &g[b - 1], NULL);
        if (rc == 0 && next <= fin)
            rc = forward_read(r, next, fy_sched_block_wslot(l, next), &rw[next], g, fws);
    }
    if (rc == 0 && train && L >= 1 && r->swap.ssd_mask[L])
        rc = fy_spill_write(&r->swap.ring, L - 1, &g[L]);
    if (rc == 0)
        rc = fy_ticket_wait(&r->tk, &rw[fin], NULL);
    for (unsigned b = 0; rc == 0 && b <= L; b++)
        rc = fy_ticket_wait(&r->tk, b ? &g[b] : &g_embed, NULL);
    uint64_t w_fin = 0;
    if (rc == 0)
        rc = fy_sched_weights_of(r, fin, fy_sched_block_wslot(l, fin), &w_fin);
    if (rc == 0)
        rc = fy_sched_weights_of(r, 0, 0, &w_embed); /* slot 0 still holds the embeddings */
    if (rc == 0)
        rc = fy_optq_settle(&r->opt, fin);
    if (rc == 0)
        rc = fy_spill_in(&r->block_inputs, L, 0, &x_in);
    if (rc == 0) {
        int op = FY_OP_GPT_HEAD, f = (int)fin;
        req[0] = fy_desc_region(op, FY_KIND_ACTIVATION, l->act_dtype, x_in, l->act_bytes, f);
        req[1] = fy_desc_region(op, FY_KIND_TOKENS, FY_DTYPE_I32, l->targets, l->tok_bytes, f);
        req[2] = fy_sched_weights_region(r, op, fin, w_fin, f);
        req[3] = fy_sched_weights_region(r, op, 0, w_embed, f);
        req[4] =
            fy_desc_region(op, FY_KIND_GRAD, l->act_dtype, fy_sched_dact(l, 0), l->act_bytes, f);
        req[5] = fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, r->dfinal,
                                fy_sched_grad_bytes(l, fin), f);
        req[6] = fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, fy_sched_gslot(l, 0),
                                fy_sched_grad_bytes(l, 0), f);
        rc = fy_ticket_issue(&r->tk, FY_TICKET_GPU, req, train ? 7 : 4, &head);
    }
    if (rc == 0)
        rc = fy_ticket_wait(&r->tk, &head, &reply);
    for (int i = 0; i < 2; i++) { /* the deferred updates' write-backs */
        int w = fy_ticket_wait(&r->tk, &fws[i], NULL);
        rc = rc ? rc : w;
    }
    /* the gpu requests were all waited for before the head; the backward converts in the order it
     * needs the weights, holding no update back */
    fy_spill_forget_users(&r->block_inputs);
    fy_spill_forget_users(&r->swap.ring);
    fy_sched_wslot_forget_users(r);
    fy_optq_hold_from(&r->opt, fy_model_unit_count(c));
    free(rw);
    free(g);
    FY_TRY(rc);
    memcpy(loss, &reply.arg, sizeof *loss);
    FY_REQUIRE(isfinite(*loss), -EDOM, "step %llu: the loss is %g: lower the learning rate",
               (unsigned long long)step, *loss);
    return 0;
}

/* Unit u's optimizer step, in three requests that the caller can interleave with other work: its
 * state into state slot s, AdamW with the gradient in grads slot g, the state back to the store. */
static int fy_sched_state_read(struct fy_sched *r, unsigned u, unsigned s, struct fy_ticket *t)
{
    r->state_unit[s] = (int)u;
    if (r->resident != NULL && r->resident[u] != 0) {
        r->state_off[s] = r->resident[u]; /* updated in place, where it stays */
        return 0;
    }
    r->state_off[s] = r->l.state + s * r->l.state_slot_bytes;
    if (r->copies.at == NULL)
        return state_io(r, FY_OP_IO_READ, u, r->copies.read, r->state_off[s], FY_SCHED_DIGEST_NONE,
                        t);
    return state_io(r, FY_OP_IO_READ, u, r->copies.at[u], r->state_off[s], FY_SCHED_DIGEST_CHECK,
                    t);
}

/* Unit u's AdamW request parts: req[0] the gradient at pool offset `grad`, then each section of
 * the state at `state` (common/optstate.h: master, m, v); the clipping scale (0: none) in the grad
 * part's arg, the learning rate in the master part's; then, where the unit has a bf16 weights
 * copy, a part for it (AdamW rewrites it from the new master). Returns the number of parts. */
static unsigned fy_sched_adamw_parts(const struct fy_sched *r, unsigned u, uint64_t grad,
                                     uint64_t state, uint64_t step, double lr, double scale,
                                     struct fy_desc *req)
{
    const struct fy_plan_layout *l = &r->l;
    struct fy_optstate_layout lay;
    fy_optstate_layout(l->c, u, &lay);
    int op = FY_OP_OPT_ADAMW;
    req[0] =
        fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, grad, fy_sched_grad_bytes(l, u), (int)u);
    memcpy(&req[0].arg, &scale, sizeof scale);
    unsigned parts = 2;
    if (fy_sched_in_pieces(r, u)) /* the unit's pieces all, updated one after another */
        req[1] = fy_desc_region(op, FY_KIND_STATE, FY_DTYPE_NONE, state, fy_optstate_bytes(l->c, u),
                                (int)u);
    else
        parts = 1 + fy_optstate_parts(&lay, state, (int)u, req + 1);
    memcpy(&req[1 + FY_OPTSTATE_MASTER].arg, &lr, sizeof lr);
    if (fy_sched_has_copy(r, u))
        req[parts++] = fy_sched_weights_region(r, op, u, r->wcopy[u], (int)u);
    for (unsigned i = 0; i < parts; i++)
        req[i].step = step;
    return parts;
}

/* The part that limits an update of unit u to the `count` rows listed (int32, each n_embd
 * elements) at pool offset `list`. */
static struct fy_desc fy_sched_rows_part(const struct fy_plan_layout *l, unsigned u, uint64_t list,
                                         uint64_t count, uint64_t step)
{
    struct fy_desc d =
        fy_desc_region(FY_OP_OPT_ADAMW, FY_KIND_TOKENS, FY_DTYPE_I32, list, count * 4, (int)u);
    d.step = step;
    d.arg = l->c->n_embd;
    return d;
}

/* Unit u's update as requests (adamw_parts, with this step's clipping scale r->clip.scale); state
 * in state slot s. Queued, not sent. */
static int fy_sched_enqueue_scaled(struct fy_sched *r, unsigned u, unsigned s, uint64_t grad,
                                   uint64_t step, double lr, double scale)
{
    FY_REQUIRE(r->state_unit[s] == (int)u, -EPROTO,
               "schedule error: AdamW of unit %u on state slot %u, which holds unit %d's state", u,
               s, r->state_unit[s]);
    struct fy_desc req[FY_OPTQ_PARTS_MAX];
    unsigned n = fy_sched_adamw_parts(r, u, grad, r->state_off[s], step, lr, scale, req);
    return fy_optq_push(&r->opt, u, req, n);
}

static int fy_sched_enqueue(struct fy_sched *r, unsigned u, unsigned s, uint64_t grad,
                            uint64_t step, double lr)
{
    return fy_sched_enqueue_scaled(r, u, s, grad, step, lr, r->clip.scale);
}

/* Unit u's state at pool offset `from` to the copy being written (never the committed one). */
static int state_written(struct fy_sched *r, unsigned u, uint64_t from, struct fy_ticket *t)
{
    FY_REQUIRE(r->copies.at != NULL, -EPROTO, "schedule error: state written outside training");
    r->copies.at[u] = (unsigned char)r->copies.work;
    return state_io(r, FY_OP_IO_WRITE, u, r->copies.work, from, FY_SCHED_DIGEST_CHECK, t);
}

static int fy_sched_state_write(struct fy_sched *r, unsigned u, unsigned s, struct fy_ticket *t)
{
    FY_REQUIRE(r->state_unit[s] == (int)u, -EPROTO,
               "schedule error: writing unit %u from state slot %u, which holds unit %d's state", u,
               s, r->state_unit[s]);
    if (r->resident != NULL && r->resident[u] != 0)
        return 0; /* stays in the pool; written to the store at checkpoints */
    return state_written(r, u, r->state_off[s], t);
}

/* ---- the state in pieces (l.state_pieces): a streamed unit updated piece by piece ---------- */

/* Piece k of unit u between state slot s and the store: read from copy `from` checked against its
 * digest, or written to the working copy with its digest kept. */
static int fy_sched_piece_move(struct fy_sched *r, int op, unsigned u, unsigned k, unsigned from,
                               unsigned s, struct fy_ticket *t)
{
    r->state_unit[s] = (int)u;
    r->state_off[s] = r->l.state + s * r->l.state_slot_bytes;
    return fy_sched_piece_io(r, op, u, k, op == FY_OP_IO_READ ? from : r->copies.work,
                             r->state_off[s], FY_SCHED_DIGEST_CHECK, t);
}

/* AdamW of piece k of unit u in state slot s, its gradient's range from the unit's at `grad`. */
static int piece_adamw(struct fy_sched *r, unsigned u, unsigned k, unsigned s, uint64_t grad,
                       uint64_t step, double lr, double scale, struct fy_ticket *t)
{
    FY_REQUIRE(r->state_unit[s] == (int)u, -EPROTO,
               "schedule error: AdamW of unit %u on state slot %u, which holds unit %d's state", u,
               s, r->state_unit[s]);
    struct fy_optstate_piece p;
    fy_optstate_piece(r->l.c, u, k, &p, NULL);
    int op = FY_OP_OPT_ADAMW;
    struct fy_desc req[FY_DESC_MAX_PARTS];
    req[0] =
        fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, grad + p.begin * 4, p.params * 4, (int)u);
    memcpy(&req[0].arg, &scale, sizeof scale);
    unsigned n = 1 + fy_optstate_parts(&p.layout, r->state_off[s], (int)u, req + 1);
    memcpy(&req[1 + FY_OPTSTATE_MASTER].arg, &lr, sizeof lr);
    req[1 + FY_OPTSTATE_MASTER].tensor = k;
    for (unsigned i = 0; i < n; i++)
        req[i].step = step;
    return fy_ticket_issue(&r->tk, FY_TICKET_OPT, req, n, t);
}

/* A streamed unit's update piece by piece through the two state slots in turn (its gradient at
 * pool offset `grad`): piece k + 1 read while piece k is updated, piece k written back while k + 1
 * is updated; every request done when it returns. The pieces are read from the copy the unit's
 * state was in, whatever was written meanwhile, and written to the working copy. */
static int fy_sched_update_in_pieces(struct fy_sched *r, unsigned u, uint64_t grad, uint64_t step,
                                     double lr, double scale)
{
    FY_REQUIRE(r->copies.at != NULL, -EPROTO, "schedule error: state written outside training");
    unsigned n = fy_optstate_piece_count(r->l.c, u), from = r->copies.at[u];
    struct fy_ticket rd[2] = {{0}}, wr[2] = {{0}}, op = {0};
    int rc = fy_sched_piece_move(r, FY_OP_IO_READ, u, 0, from, 0, &rd[0]);
    for (unsigned k = 0; rc == 0 && k < n; k++) {
        unsigned s = k & 1;
        if (k + 1 < n) { /* the next piece into the slot its write-back left */
            rc = fy_ticket_wait(&r->tk, &wr[s ^ 1], NULL);
            if (rc == 0)
                rc = fy_sched_piece_move(r, FY_OP_IO_READ, u, k + 1, from, s ^ 1, &rd[s ^ 1]);
        }
        if (rc == 0)
            rc = fy_ticket_wait(&r->tk, &rd[s], NULL);
        if (rc == 0)
            rc = piece_adamw(r, u, k, s, grad, step, lr, scale, &op);
        if (rc == 0)
            rc = fy_ticket_wait(&r->tk, &op, NULL);
        if (rc == 0) {
            r->state_unit[s] = (int)u; /* the slot the read of piece k + 1 did not take */
            r->state_off[s] = r->l.state + s * r->l.state_slot_bytes;
            rc = fy_sched_piece_io(r, FY_OP_IO_WRITE, u, k, r->copies.work, r->state_off[s],
                                   FY_SCHED_DIGEST_CHECK, &wr[s]);
        }
    }
    for (int i = 0; i < 2; i++) { /* nothing stays in flight */
        int w = fy_ticket_wait(&r->tk, &rd[i], NULL);
        w = w ? w : fy_ticket_wait(&r->tk, &wr[i], NULL);
        rc = rc ? rc : w;
    }
    int w = fy_ticket_wait(&r->tk, &op, NULL);
    rc = rc ? rc : w;
    if (rc == 0)
        r->copies.at[u] = (unsigned char)r->copies.work;
    return rc;
}

static int fy_sched_kept(const struct fy_sched *r, unsigned u);

/* The whole update of one unit (its gradient at pool offset `grad`), waited for. */
static int fy_sched_update_unit(struct fy_sched *r, unsigned u, uint64_t grad, uint64_t step,
                                double lr)
{
    if (r->l.state_pieces && !fy_sched_kept(r, u))
        return fy_sched_update_in_pieces(r, u, grad, step, lr, r->clip.scale);
    struct fy_ticket t = {0};
    FY_TRY(fy_sched_state_read(r, u, 0, &t));
    FY_TRY(fy_ticket_wait(&r->tk, &t, NULL));
    FY_TRY(fy_sched_enqueue(r, u, 0, grad, step, lr));
    FY_TRY(fy_optq_settle(&r->opt, u));
    FY_TRY(fy_sched_state_write(r, u, 0, &t));
    return fy_ticket_wait(&r->tk, &t, NULL);
}

/* The embedding lookup's gradient (dx0 at pool offset dx0) added to the head's wte gradient in
 * grads slot 0. */
static int fy_sched_embed_backward_issue(struct fy_sched *r, uint64_t dx0, struct fy_ticket *t)
{
    const struct fy_plan_layout *l = &r->l;
    int op = FY_OP_GPT_EMBED_BWD;
    struct fy_desc req[4];
    req[0] = fy_desc_region(op, FY_KIND_TOKENS, FY_DTYPE_I32, l->tokens, l->tok_bytes, 0);
    req[1] = fy_desc_region(op, FY_KIND_GRAD, l->act_dtype, dx0, l->act_bytes, 0);
    req[2] = fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, fy_sched_gslot(l, 0),
                            fy_sched_grad_bytes(l, 0), 0);
    req[3] = fy_sched_positions_part(l, op, 0);
    return fy_ticket_issue(&r->tk, FY_TICKET_GPU, req, 4, t);
}

static int fy_sched_embed_backward(struct fy_sched *r, uint64_t dx0)
{
    struct fy_ticket t = {0};
    FY_TRY(fy_sched_embed_backward_issue(r, dx0, &t));
    return fy_ticket_wait(&r->tk, &t, NULL);
}

static int fy_sched_kept(const struct fy_sched *r, unsigned u)
{
    return r->resident != NULL && r->resident[u] != 0;
}

/* The backward's bookkeeping of write-backs: which blocks' have been issued, and per state slot
 * the block whose write-back from it was issued last (-1: none), which a read into the slot must
 * wait for. */
struct writebacks {
    struct fy_ticket *ws;
    unsigned char *issued;
    int slot_writer[2];
};

/* Block u's updated state back to the store once its AdamW is done (nothing to write for a
 * resident block: it is written at checkpoints). */
static int write_back(struct fy_sched *r, struct writebacks *wb, unsigned u)
{
    if (wb->issued[u])
        return 0;
    wb->issued[u] = 1;
    if (fy_sched_kept(r, u))
        return 0;
    FY_TRY(fy_optq_settle(&r->opt, u));
    FY_TRY(fy_sched_state_write(r, u, u & 1, &wb->ws[u]));
    wb->slot_writer[u & 1] = (int)u;
    return 0;
}

/* Block b's weights for its backward, its state at pool offset `state`: with bf16 weights its
 * copy, or its f32 master where it lies (one piece, f32 weights), or the master converted into the
 * block's weights slot (*cv: a conversion issued ahead, or none yet), waited for; *w_off where the
 * gpu request finds them. */
static int backward_weights(struct fy_sched *r, unsigned b, uint64_t state, struct fy_ticket *cv,
                            uint64_t *w_off)
{
    if (fy_sched_bf16(r) && fy_sched_has_copy(r, b)) {
        *w_off = r->wcopy[b];
        return 0;
    }
    if (!fy_sched_converts(r, b)) {
        *w_off = fy_sched_master(r->l.c, b, state);
        return 0;
    }
    unsigned slot = fy_sched_block_wslot(&r->l, b);
    if (cv->id == 0)
        FY_TRY(fy_sched_convert_into(r, b, state, slot, cv));
    FY_TRY(fy_ticket_wait(&r->tk, cv, NULL));
    return fy_sched_weights_of(r, b, slot, w_off);
}

/* Backward through the blocks with each block's update overlapped with the backward of the blocks
 * below. A streamed block's weights come with its state: its master, m and v are read into a state
 * slot before its backward, which takes the master from there, and AdamW updates them in place
 * after it, so the master crosses from the SSD once in backward, not twice; the read goes into
 * the slot that block b+2 leaves once written back (state slots 0 and 1 alternate). A resident
 * block's weights and state are where they stay. Block b's backward is issued once a gradient
 * slot is free (fy_optq_take_gslot: at least three, so the gpu can run two blocks ahead of the
 * optimizer, and with more the optimizer can fall behind and finish in the next forward); block
 * b+1's AdamW is queued, not waited for, once its gradient is in. Every reuse of a slot waits for
 * its previous user. With bf16 weights, a block without a copy has its master converted into its
 * weights slot before its backward: a streamed block's once its state is read, a kept one's while
 * the gpu computes the block above (the weights slots taken in turn, as in the forward). With
 * `embed`, the embedding backward follows block 1's on the gpu while the last blocks are
 * updated. */
static int backward_blocks(struct fy_sched *r, uint64_t step, double lr, unsigned *cur, int embed)
{
    const struct fy_plan_layout *l = &r->l;
    unsigned L = l->c->n_layer;
    struct fy_ticket *g = calloc(L + 4, sizeof *g), *rs = calloc(L + 4, sizeof *rs);
    struct fy_ticket *ws = calloc(L + 4, sizeof *ws), *cv = calloc(L + 4, sizeof *cv), e = {0};
    unsigned char *issued = calloc(L + 4, 1);
    unsigned *slot_of = calloc(L + 4, sizeof *slot_of);
    int rc = g && rs && ws && cv && issued && slot_of ? 0 : -ENOMEM;
    struct writebacks wb = {ws, issued, {-1, -1}};
    fy_optq_release_gslots(&r->opt); /* the last step's updates were all waited for */
    if (rc == 0 && embed && L == 0)  /* it reads the gradient this overwrites */
        rc = fy_ticket_wait(&r->tk, &r->embed.early, NULL);
    if (rc == 0 && embed && L == 0)
        rc = fy_sched_embed_backward_issue(r, fy_sched_dact(l, *cur), &e);
    if (rc == 0 && L >= 1) /* the two state slots start with blocks L and L-1 */
        rc = fy_sched_state_read(r, L, L & 1, &rs[L]);
    if (rc == 0 && L >= 2)
        rc = fy_sched_state_read(r, L - 1, (L - 1) & 1, &rs[L - 1]);
    for (unsigned b = L; rc == 0; b--) {
        int later_read = b >= 1 && b + 2 <= L; /* block b's state is not read yet */
        rc = fy_optq_pump(&r->opt);
        if (later_read && !fy_sched_kept(r, b)) { /* into the slot block b+2 leaves */
            rc = write_back(r, &wb, b + 2);
            if (rc == 0 && wb.slot_writer[b & 1] >= 0)
                rc = fy_ticket_wait(&r->tk, &ws[wb.slot_writer[b & 1]], NULL);
            if (rc == 0)
                rc = fy_sched_state_read(r, b, b & 1, &rs[b]);
        }
        if (rc == 0 && b >= 1) {
            uint64_t w_off = 0, st = fy_sched_kept(r, b) ? r->resident[b] : 0;
            if (!fy_sched_kept(r, b)) {
                rc = fy_ticket_wait(&r->tk, &rs[b], NULL);
                FY_REQUIRE(rc != 0 || r->state_unit[b & 1] == (int)b, -EPROTO,
                           "schedule error: block %u's weights expected in state slot %u, which "
                           "holds unit %d's state",
                           b, b & 1, r->state_unit[b & 1]);
                st = r->state_off[b & 1];
            }
            if (rc == 0)
                rc = backward_weights(r, b, st, &cv[b], &w_off);
            if (rc == 0)
                rc = fy_optq_take_gslot(&r->opt, b, &slot_of[b]);
            if (rc == 0) {
                rc = fy_sched_block_backward(r, b, w_off, fy_sched_dact(l, *cur),
                                             fy_sched_dact(l, *cur ^ 1),
                                             fy_sched_gslot(l, slot_of[b]), 0, &g[b]);
            }
            if (fy_sched_converts(r, b))
                fy_sched_wslot_used_by(r, fy_sched_block_wslot(l, b), &g[b]);
            /* a kept block below without a copy: its weights converted while this one computes */
            if (rc == 0 && b >= 2 && fy_sched_converts(r, b - 1) && fy_sched_kept(r, b - 1))
                rc = fy_sched_convert_into(r, b - 1, r->resident[b - 1],
                                           fy_sched_block_wslot(l, b - 1), &cv[b - 1]);
            *cur ^= 1;
            if (rc == 0 && b == 1 && embed) /* the early part reads the gradient this rewrites */
                rc = fy_ticket_wait(&r->tk, &r->embed.early, NULL);
            if (rc == 0 && b == 1 && embed) /* dx0 is block 1's dx */
                rc = fy_sched_embed_backward_issue(r, fy_sched_dact(l, *cur), &e);
        }
        if (rc == 0 && b + 1 <= L) { /* block b+1's update, while the gpu runs block b */
            unsigned u = b + 1;
            rc = fy_ticket_wait(&r->tk, &g[u], NULL);
            if (rc == 0)
                rc = fy_ticket_wait(&r->tk, &rs[u], NULL);
            if (rc == 0)
                rc = fy_sched_enqueue(r, u, u & 1, fy_sched_gslot(l, slot_of[u]), step, lr);
            if (rc == 0) {
                r->opt.gslot_queued[slot_of[u]] = 1;
                rc = fy_optq_pump(&r->opt);
            }
            r->version[u] = step;
        }
        if (rc == 0 && b + 2 <= L) /* block b+2's write-back (issued above if block b needed it) */
            rc = write_back(r, &wb, b + 2);
        if (rc == 0 && later_read && fy_sched_kept(r, b)) /* in place: only the bookkeeping */
            rc = fy_sched_state_read(r, b, b & 1, &rs[b]);
        if (b == 0)
            break;
    }
    if (rc == 0 && L >= 1) /* block 1's write-back */
        rc = write_back(r, &wb, 1);
    int we = fy_ticket_wait(&r->tk, &e, NULL);
    rc = rc ? rc : we;
    /* nothing stays in flight but resident blocks' updates, which the next forward waits for */
    for (unsigned u = 0; u <= L + 3; u++) {
        int w = fy_ticket_wait(&r->tk, &ws[u], NULL);
        w = w ? w : fy_ticket_wait(&r->tk, &g[u], NULL);
        w = w ? w : fy_ticket_wait(&r->tk, &rs[u], NULL);
        w = w ? w : fy_ticket_wait(&r->tk, &cv[u], NULL);
        rc = rc ? rc : w;
    }
    fy_spill_forget_users(&r->block_inputs);
    fy_spill_forget_users(&r->swap.ring);
    fy_sched_wslot_forget_users(r);
    free(g);
    free(rs);
    free(ws);
    free(cv);
    free(issued);
    free(slot_of);
    return rc;
}

/* Block u's update once its backward (g[u]) is done, its gradient in grads slot slot_of[u]: a kept
 * block's queued as backward_blocks queues it, a streamed block's state read, updated and written
 * back piece by piece (update_in_pieces), its gradient slot free again after. */
static int update_block(struct fy_sched *r, unsigned u, struct fy_ticket *g,
                        const unsigned *slot_of, uint64_t step, double lr)
{
    FY_TRY(fy_ticket_wait(&r->tk, &g[u], NULL));
    uint64_t grad = fy_sched_gslot(&r->l, slot_of[u]);
    if (fy_sched_kept(r, u)) {
        struct fy_ticket none = {0};
        FY_TRY(fy_sched_state_read(r, u, u & 1, &none));
        FY_TRY(fy_sched_enqueue(r, u, u & 1, grad, step, lr));
        r->opt.gslot_queued[slot_of[u]] = 1;
        FY_TRY(fy_optq_pump(&r->opt));
    } else {
        FY_TRY(fy_sched_update_in_pieces(r, u, grad, step, lr, r->clip.scale));
        r->opt.gslot_holder[slot_of[u]] = 0; /* its update is done */
    }
    r->version[u] = step;
    return 0;
}

/* The backward with the state in pieces (l.state_pieces). Each block's weights are read ahead into
 * the weights slots in turn as in the norm pass (a streamed block's from its masters, as in the
 * forward); once block b's backward is issued, the weights of the block `depth` below are read
 * and block b+1's update runs (update_block) while the gpu computes block b. With one gradient
 * slot, block b+1's update comes before block b's backward, whose gradient takes its slot. With
 * `embed`, the embedding backward follows block 1's on the gpu. */
static int backward_pieces(struct fy_sched *r, uint64_t step, double lr, unsigned *cur, int embed)
{
    const struct fy_plan_layout *l = &r->l;
    unsigned L = l->c->n_layer, depth = l->wslots - 1;
    struct fy_ticket *g = calloc(L + 2, sizeof *g), *rw = calloc(L + 2, sizeof *rw), e = {0};
    unsigned *slot_of = calloc(L + 2, sizeof *slot_of);
    int rc = g && rw && slot_of ? 0 : -ENOMEM;
    fy_optq_release_gslots(&r->opt); /* the last step's updates were all waited for */
    if (rc == 0 && embed && L == 0)  /* it reads the gradient this overwrites */
        rc = fy_ticket_wait(&r->tk, &r->embed.early, NULL);
    if (rc == 0 && embed && L == 0)
        rc = fy_sched_embed_backward_issue(r, fy_sched_dact(l, *cur), &e);
    for (unsigned u = L; rc == 0 && u >= 1 && u + depth > L; u--) /* the first blocks' weights */
        rc = fy_sched_read_weights(r, u, fy_sched_block_wslot(l, u), &rw[u]);
    for (unsigned b = L; rc == 0 && b >= 1; b--) {
        if (l->gslots == 1 && b + 1 <= L) /* its gradient slot is block b's */
            rc = update_block(r, b + 1, g, slot_of, step, lr);
        if (rc == 0)
            rc = fy_optq_pump(&r->opt);
        uint64_t w_off = 0;
        if (rc == 0)
            rc = fy_ticket_wait(&r->tk, &rw[b], NULL);
        if (rc == 0)
            rc = fy_sched_weights_of(r, b, fy_sched_block_wslot(l, b), &w_off);
        if (rc == 0)
            rc = fy_optq_take_gslot(&r->opt, b, &slot_of[b]);
        if (rc == 0)
            rc = fy_sched_block_backward(r, b, w_off, fy_sched_dact(l, *cur),
                                         fy_sched_dact(l, *cur ^ 1), fy_sched_gslot(l, slot_of[b]),
                                         0, &g[b]);
        fy_sched_wslot_used_by(r, fy_sched_block_wslot(l, b), &g[b]);
        *cur ^= 1;
        if (rc == 0 && b == 1 && embed) /* the early part reads the gradient this rewrites */
            rc = fy_ticket_wait(&r->tk, &r->embed.early, NULL);
        if (rc == 0 && b == 1 && embed) /* dx0 is block 1's dx */
            rc = fy_sched_embed_backward_issue(r, fy_sched_dact(l, *cur), &e);
        if (rc == 0 && b > depth) /* into the slot block b+1 leaves */
            rc = fy_sched_read_weights(r, b - depth, fy_sched_block_wslot(l, b - depth),
                                       &rw[b - depth]);
        if (rc == 0 && l->gslots > 1 && b + 1 <= L) /* while the gpu runs block b */
            rc = update_block(r, b + 1, g, slot_of, step, lr);
    }
    if (rc == 0 && L >= 1)
        rc = update_block(r, 1, g, slot_of, step, lr);
    int we = fy_ticket_wait(&r->tk, &e, NULL);
    rc = rc ? rc : we;
    /* nothing stays in flight but kept blocks' updates, which the next forward waits for */
    for (unsigned u = 0; g != NULL && rw != NULL && u <= L + 1; u++) {
        int w = fy_ticket_wait(&r->tk, &g[u], NULL);
        w = w ? w : fy_ticket_wait(&r->tk, &rw[u], NULL);
        rc = rc ? rc : w;
    }
    fy_spill_forget_users(&r->block_inputs);
    fy_spill_forget_users(&r->swap.ring);
    fy_sched_wslot_forget_users(r);
    free(g);
    free(rw);
    free(slot_of);
    return rc;
}

/* Unit u's gradient sum of squares on the opt worker (its gradient at pool offset grad). */
static int sumsq_issue(struct fy_sched *r, unsigned u, uint64_t grad, struct fy_ticket *t)
{
    struct fy_desc d = fy_desc_region(FY_OP_OPT_SUMSQ, FY_KIND_GRAD, FY_DTYPE_F32, grad,
                                      fy_sched_grad_bytes(&r->l, u), (int)u);
    return fy_ticket_issue(&r->tk, FY_TICKET_OPT, &d, 1, t);
}

/* Waits for a sum-of-squares request, its result into *out (nothing when none is in flight). */
static int sumsq_wait(struct fy_sched *r, struct fy_ticket *t, double *out)
{
    if (t->id == 0)
        return 0;
    struct fy_desc reply;
    FY_TRY(fy_ticket_wait(&r->tk, t, &reply));
    memcpy(out, &reply.arg, sizeof *out);
    return 0;
}

/* Where block b's gradient goes in a norm pass: its own place in the gradhold region (one-pass
 * clipping in the pool: kept for its update), else grads slots 1 and 2 in turn (with the
 * gradients held in the gpu worker, also where each comes back for its update: grad_send). */
static uint64_t norm_grad(const struct fy_sched *r, unsigned b)
{
    return r->clip.one_pass && !r->clip.hold_gpu ? r->l.hold + (uint64_t)(b - 1) * r->l.bslot_bytes
                                                 : fy_sched_gslot(&r->l, 1 + (b & 1));
}

/* A backward pass that sums the gradients' squares, after the forward (whose head request ran the
 * head's backward), no update: pass 1 of a clipped step, or one-pass clipping's only backward
 * (r->clip.one_pass), which keeps every block's gradient (norm_grad). Pass 1 leaves what pass 2 needs
 * where pass 2 finds it: dx_L in dacts[0] (the blocks' dx alternate between dacts[1] and acts[L],
 * the head's input, which nothing reads any more this step). Either leaves the final unit's
 * gradient after the grads slots, and the complete embedding gradient (the lookup's share added to
 * the head's) in grads slot 0. Overlapped like the backward: while the gpu computes block b, the
 * opt worker sums block b+1's squares; the weights slots are taken in turn, and a reused grads
 * slot waits for its previous user. *total = the units' sums added in unit order, whatever the
 * schedule. */
static int norm_pass(struct fy_sched *r, double *total)
{
    const struct fy_plan_layout *l = &r->l;
    unsigned L = l->c->n_layer, fin = L + 1;
    struct fy_ticket *rw = calloc(L + 3, sizeof *rw), *g = calloc(L + 3, sizeof *g);
    struct fy_ticket *sq = calloc(L + 3, sizeof *sq);
    double *part = calloc(L + 3, sizeof *part);
    int rc = rw && g && sq && part ? 0 : -ENOMEM;
    /* x_L's room is free after the head; with the checkpoints in slots, a third dacts buffer;
     * one pass needs no dx_L afterwards */
    const uint64_t scratch[2] = {fy_sched_dact(l, 1), r->clip.one_pass     ? fy_sched_dact(l, 0)
                                                      : r->block_inputs.on ? fy_sched_dact(l, 2)
                                                                           : fy_sched_act(l, L)};
    uint64_t dy = fy_sched_dact(l, 0); /* dL/d(output of the block being processed) */
    unsigned depth = l->wslots - 1;
    if (rc == 0)
        rc = sumsq_issue(r, fin, r->dfinal, &sq[fin]);
    for (unsigned u = L; rc == 0 && u >= 1 && u + depth > L; u--) /* the first blocks' weights */
        rc = fy_sched_read_weights(r, u, fy_sched_block_wslot(l, u), &rw[u]);
    for (unsigned b = L; rc == 0 && b >= 1; b--) {
        uint64_t dx = scratch[(L - b) & 1], w_off = 0;
        rc = fy_ticket_wait(&r->tk, &rw[b], NULL);
        if (rc == 0)
            rc = fy_sched_weights_of(r, b, fy_sched_block_wslot(l, b), &w_off);
        if (rc == 0 && b + 2 <= L && (!r->clip.one_pass || r->clip.hold_gpu))
            rc = sumsq_wait(r, &sq[b + 2], &part[b + 2]); /* its gradient slot */
        if (rc == 0)
            rc = fy_sched_block_backward(r, b, w_off, dy, dx, norm_grad(r, b), r->clip.hold_gpu,
                                         &g[b]);
        fy_sched_wslot_used_by(r, fy_sched_block_wslot(l, b), &g[b]);
        dy = dx;
        /* block b+1's gradient is complete: its squares, and its weights slot is free for block
         * b-depth */
        if (rc == 0 && b + 1 <= L)
            rc = fy_ticket_wait(&r->tk, &g[b + 1], NULL);
        if (rc == 0 && b + 1 <= L)
            rc = sumsq_issue(r, b + 1, norm_grad(r, b + 1), &sq[b + 1]);
        if (rc == 0 && b > depth)
            rc = fy_sched_read_weights(r, b - depth, fy_sched_block_wslot(l, b - depth),
                                       &rw[b - depth]);
    }
    if (rc == 0 && L >= 1)
        rc = fy_ticket_wait(&r->tk, &g[1], NULL);
    if (rc == 0 && L >= 1)
        rc = sumsq_issue(r, 1, norm_grad(r, 1), &sq[1]);
    if (rc == 0)
        rc = fy_sched_embed_backward(r, dy);
    if (rc == 0)
        rc = sumsq_issue(r, 0, fy_sched_gslot(l, 0), &sq[0]);
    for (unsigned u = 0; u <= L + 2; u++) { /* nothing stays in flight */
        int w = sumsq_wait(r, &sq[u], &part[u]);
        w = w ? w : fy_ticket_wait(&r->tk, &g[u], NULL);
        w = w ? w : fy_ticket_wait(&r->tk, &rw[u], NULL);
        rc = rc ? rc : w;
    }
    fy_spill_forget_users(&r->block_inputs);
    fy_spill_forget_users(&r->swap.ring);
    fy_sched_wslot_forget_users(r);
    double sum = 0.0;
    for (unsigned u = 0; u <= fin; u++)
        sum += part[u];
    *total = sum;
    free(rw);
    free(g);
    free(sq);
    free(part);
    return rc;
}

/* The embeddings' update, first part: the rows no token of the batch touches, whose gradient (the
 * head's alone; none for an untied head) is final once the head is done. Sent now, it runs during
 * the backward, and only the touched rows and the positions are left for the stretch between the
 * backward and the next forward, which waits for them. The two row lists go to the pool (the
 * untouched rows, then the rest); *late gets the second one's length. */
static int fy_sched_embed_update_early(struct fy_sched *r, uint64_t step, double lr, uint64_t *late)
{
    const struct fy_plan_layout *l = &r->l;
    const struct fy_model_config *c = l->c;
    uint64_t rows = fy_plan_embed_rows(c), tokens = (uint64_t)l->B * l->T;
    const int32_t *tok = fy_pool_at(r->pool, l->tokens, l->tok_bytes);
    int32_t *early = fy_pool_at(r->pool, l->embed_rows, 2 * rows * 4), *rest = early + rows;
    FY_REQUIRE(tok != NULL && early != NULL, -ERANGE,
               "schedule error: the batch or the embeddings' row lists lie outside the pool");
    memset(r->embed.row_touched, 0, c->vocab);
    for (uint64_t i = 0; i < tokens; i++) {
        FY_REQUIRE(tok[i] >= 0 && (uint64_t)tok[i] < c->vocab, -EINVAL,
                   "train: token %d at %llu is outside the vocabulary of %llu", tok[i],
                   (unsigned long long)i, (unsigned long long)c->vocab);
        r->embed.row_touched[tok[i]] = 1;
    }
    uint64_t n_early = 0, n_rest = 0;
    for (uint64_t v = 0; v < rows; v++) {
        if (v < c->vocab && !r->embed.row_touched[v])
            early[n_early++] = (int32_t)v;
        else
            rest[n_rest++] = (int32_t)v; /* touched, or a position's row */
    }
    *late = n_rest;
    if (n_early == 0)
        return 0;
    struct fy_desc req[FY_OPTQ_PARTS_MAX];
    unsigned n = fy_sched_adamw_parts(r, 0, fy_sched_gslot(l, 0), r->resident[0], step, lr, 0.0,
                                      req); /* unclipped */
    req[n++] = fy_sched_rows_part(l, 0, l->embed_rows, n_early, step);
    return fy_ticket_issue(&r->tk, FY_TICKET_OPT, req, n, &r->embed.early);
}

/* The backward is done: the updates left go to the opt worker in the next forward's order, all
 * but those of the units from the first one the forward converts on (with bf16 weights), which
 * the forward sends as it goes (forward_read), so that its conversions do not queue behind them. */
static int fy_sched_send_for_forward(struct fy_sched *r)
{
    fy_optq_hold_from(&r->opt, fy_sched_next_converted(r, 0));
    return fy_optq_send_all(&r->opt);
}

int fy_sched_backward_and_update(struct fy_sched *r, uint64_t step, double lr)
{
    const struct fy_plan_layout *l = &r->l;
    unsigned L = l->c->n_layer, fin = L + 1;
    FY_TRY(fy_sched_update_unit(r, fin, r->dfinal, step, lr));
    r->version[fin] = step;
    int split = r->embed.split && !r->clip.on && fy_sched_kept(r, 0);
    uint64_t late = 0;
    if (split)
        FY_TRY(fy_sched_embed_update_early(r, step, lr, &late));
    unsigned cur = 0; /* dacts[cur] holds dL/d(output of the unit being processed) */
    /* with clipping, pass 1 has completed the embedding gradient already */
    int rc = r->l.state_pieces ? backward_pieces(r, step, lr, &cur, !r->clip.on)
                               : backward_blocks(r, step, lr, &cur, !r->clip.on);
    /* done before the embedding backward */
    int early = fy_ticket_wait(&r->tk, &r->embed.early, NULL);
    FY_TRY(rc ? rc : early);
    if (fy_sched_kept(r, 0)) { /* updated in place: the next forward waits for it */
        struct fy_ticket none = {0};
        FY_TRY(fy_sched_state_read(r, 0, 0, &none));
        FY_TRY(fy_sched_enqueue(r, 0, 0, fy_sched_gslot(l, 0), step, lr));
        if (split)
            fy_optq_add_part(
                &r->opt, 0,
                fy_sched_rows_part(l, 0, l->embed_rows + fy_plan_embed_rows(l->c) * 4, late, step));
    } else {
        FY_TRY(fy_sched_update_unit(r, 0, fy_sched_gslot(l, 0), step, lr));
    }
    r->version[0] = step;
    return fy_sched_send_for_forward(r);
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

/* The mean loss over the eval batches' trained targets: with no loss mask every batch counts B*T
 * targets and this is the mean of the batch losses; with one, each batch weighs by its trained
 * targets (a batch without any adds nothing; none at all gives 0). */
int fy_sched_eval_loss(struct fy_sched *r, struct fy_sampler *data, uint64_t batches, double *loss)
{
    double sum = 0, weighted = 0;
    uint64_t trained_total = 0;
    int uniform = 1;
    for (uint64_t k = 0; k < batches; k++) {
        double one;
        struct fy_sampler_fill f;
        FY_TRY(fy_sched_load_batch(r, data, FY_TOKFILE_EVAL, k, &f));
        uint64_t n = f.targets;
        FY_TRY(fy_sched_forward(r, 0, 0, &one));
        sum += one;
        weighted += one * (double)n;
        trained_total += n;
        uniform &= n == (uint64_t)r->l.B * (uint64_t)r->l.T;
    }
    if (uniform)
        *loss = sum / (double)batches;
    else
        *loss = trained_total > 0 ? weighted / (double)trained_total : 0.0;
    return 0;
}

/* Pass 1 of a clipped step and the scale it gives, as torch.nn.utils.clip_grad_norm_ computes it:
 * norm = sqrt(sum of every gradient element squared), in double; scale = max / (norm + 1e-6),
 * applied (as a float, by the opt worker) only when below 1. */
static int clip_scale_of(struct fy_sched *r, uint64_t step, double max_norm, double sumsq,
                         double *norm)
{
    *norm = sqrt(sumsq);
    FY_REQUIRE(isfinite(*norm), -EDOM,
               "step %llu: the gradient norm is %g: lower the learning rate",
               (unsigned long long)step, *norm);
    double scale = max_norm / (*norm + 1e-6);
    r->clip.scale = scale < 1.0 ? scale : 0.0;
    return 0;
}

int fy_sched_clip_scale(struct fy_sched *r, uint64_t step, double max_norm, double *norm)
{
    double sumsq;
    FY_TRY(norm_pass(r, &sumsq));
    return clip_scale_of(r, step, max_norm, sumsq, norm);
}

/* The first unit from u on to update in update_streamed's turn (past the final unit: none): one
 * whose state streams and whose update is not deferred, or with `deferred`, one whose update is. */
static unsigned next_to_update(const struct fy_sched *r, unsigned u, int deferred)
{
    unsigned fin = r->l.c->n_layer + 1;
    while (u <= fin &&
           (deferred ? !r->clip.deferred[u] : fy_sched_kept(r, u) || r->clip.deferred[u]))
        u++;
    return u;
}

/* Where one-pass clipping left unit u's gradient. */
static uint64_t fy_sched_clipped_grad(const struct fy_sched *r, unsigned u)
{
    unsigned fin = r->l.c->n_layer + 1;
    return u == 0 ? fy_sched_gslot(&r->l, 0) : u == fin ? r->dfinal : norm_grad(r, u);
}

/* Streamed units' updates (next_to_update's, in unit order) with the given step, rate and scale:
 * each one's state read, updated and written back, the next one's read while one is updated
 * (state slots 0 and 1 in turn, a slot's read waiting for the write-back from it). */
/* update_streamed with the state in pieces: each unit's update piece by piece in turn (its
 * gradient held in the gpu worker sent to grads slot 1 first). */
static int update_streamed_pieces(struct fy_sched *r, int deferred, uint64_t step, double lr,
                                  double scale)
{
    unsigned fin = r->l.c->n_layer + 1;
    for (unsigned u = next_to_update(r, 0, deferred); u <= fin;
         u = next_to_update(r, u + 1, deferred)) {
        uint64_t grad = fy_sched_clipped_grad(r, u);
        if (fy_sched_held_on_gpu(r, u)) {
            struct fy_ticket sent = {0};
            grad = fy_sched_gslot(&r->l, 1);
            FY_TRY(fy_sched_grad_send(r, u, grad, &sent));
            FY_TRY(fy_ticket_wait(&r->tk, &sent, NULL));
        }
        FY_TRY(fy_sched_update_in_pieces(r, u, grad, step, lr, scale));
        r->clip.deferred[u] = 0;
    }
    return 0;
}

static int update_streamed(struct fy_sched *r, int deferred, uint64_t step, double lr, double scale)
{
    if (r->l.state_pieces)
        return update_streamed_pieces(r, deferred, step, lr, scale);
    unsigned fin = r->l.c->n_layer + 1, slot = 0;
    struct fy_ticket rs[2] = {{0}}, ws[2] = {{0}}, gs[2] = {{0}};
    int rc = 0;
    unsigned u = next_to_update(r, 0, deferred);
    if (u <= fin)
        rc = fy_sched_state_read(r, u, 0, &rs[0]);
    if (rc == 0 && u <= fin && fy_sched_held_on_gpu(r, u)) /* its gradient into grads slot 1 */
        rc = fy_sched_grad_send(r, u, fy_sched_gslot(&r->l, 1), &gs[0]);
    while (rc == 0 && u <= fin) {
        unsigned next = next_to_update(r, u + 1, deferred), other = slot ^ 1;
        if (next <= fin) {
            rc = fy_ticket_wait(&r->tk, &ws[other], NULL);
            if (rc == 0)
                rc = fy_sched_state_read(r, next, other, &rs[other]);
            /* grads slot 1 + other: its last unit's update was waited for */
            if (rc == 0 && fy_sched_held_on_gpu(r, next))
                rc = fy_sched_grad_send(r, next, fy_sched_gslot(&r->l, 1 + other), &gs[other]);
        }
        if (rc == 0)
            rc = fy_ticket_wait(&r->tk, &rs[slot], NULL);
        uint64_t grad = fy_sched_clipped_grad(r, u);
        if (rc == 0 && fy_sched_held_on_gpu(r, u)) {
            rc = fy_ticket_wait(&r->tk, &gs[slot], NULL);
            grad = fy_sched_gslot(&r->l, 1 + slot);
        }
        if (rc == 0)
            rc = fy_sched_enqueue_scaled(r, u, slot, grad, step, lr, scale);
        if (rc == 0)
            rc = fy_optq_settle(&r->opt, u);
        if (rc == 0)
            rc = fy_sched_state_write(r, u, slot, &ws[slot]);
        if (rc == 0)
            r->clip.deferred[u] = 0;
        u = next;
        slot = other;
    }
    for (int i = 0; i < 2; i++) { /* nothing stays in flight */
        int w = fy_ticket_wait(&r->tk, &ws[i], NULL);
        w = w ? w : fy_ticket_wait(&r->tk, &rs[i], NULL);
        w = w ? w : fy_ticket_wait(&r->tk, &gs[i], NULL);
        rc = rc ? rc : w;
    }
    return rc;
}

int fy_sched_clipped_backward(struct fy_sched *r, uint64_t step, double lr, double max_norm,
                              double *norm)
{
    const struct fy_plan_layout *l = &r->l;
    unsigned L = l->c->n_layer, fin = L + 1;
    FY_REQUIRE(r->clip.one_pass, -EPROTO,
               "schedule error: one-pass clipping without a gradhold region or held gradients");
    double sumsq;
    FY_TRY(norm_pass(r, &sumsq));
    FY_TRY(clip_scale_of(r, step, max_norm, sumsq, norm));
    /* A streamed block's update waits for the next forward (forward_read), which reads its state
     * anyway, where the forward reads at most two units ahead (the two state slots); the other
     * streamed units are updated now, the next forward reading them from the store; then the kept
     * units' updates are queued in the forward's order, which waits for each one's own. */
    int defer = l->wslots - 1 <= 2 && !l->state_pieces;
    for (unsigned b = 1; defer && b <= L; b++)
        r->clip.deferred[b] = !fy_sched_kept(r, b);
    r->clip.deferred_step = step;
    r->clip.deferred_lr = lr;
    r->clip.deferred_scale = r->clip.scale;
    FY_TRY(update_streamed(r, 0, step, lr, r->clip.scale));
    /* with the gradients in the gpu worker, each kept block's comes to grads slot 1 or 2 in turn
     * once the slot's last update is done, and all are done before the forward, whose deferred
     * updates take the same slots */
    int prev[2] = {-1, -1}, turn = 0;
    for (unsigned u = 0; u <= fin; u++) {
        r->version[u] = step;
        if (!fy_sched_kept(r, u))
            continue;
        uint64_t grad = fy_sched_clipped_grad(r, u);
        if (fy_sched_held_on_gpu(r, u)) {
            struct fy_ticket sent = {0};
            if (prev[turn] >= 0)
                FY_TRY(fy_optq_settle(&r->opt, (unsigned)prev[turn]));
            grad = fy_sched_gslot(&r->l, 1 + turn);
            FY_TRY(fy_sched_grad_send(r, u, grad, &sent));
            FY_TRY(fy_ticket_wait(&r->tk, &sent, NULL));
            prev[turn] = (int)u;
            turn ^= 1;
        }
        struct fy_ticket none = {0};
        FY_TRY(fy_sched_state_read(r, u, 0, &none));
        FY_TRY(fy_sched_enqueue(r, u, 0, grad, step, lr));
        FY_TRY(fy_optq_pump(&r->opt));
    }
    return r->clip.hold_gpu ? fy_optq_drain(&r->opt) : fy_sched_send_for_forward(r);
}

int fy_sched_finish_updates(struct fy_sched *r)
{
    FY_TRY(
        update_streamed(r, 1, r->clip.deferred_step, r->clip.deferred_lr, r->clip.deferred_scale));
    return fy_optq_drain(&r->opt);
}

/* Every resident unit's state between the pool and the store: loaded from the committed copy
 * (checked against its digest) at start, written to the other at commits. A unit in pieces is read
 * with its pieces' digests reported, and checked here against the record's. */
int fy_sched_resident_transfer(struct fy_sched *r, int op, const uint64_t *unit_digests)
{
    for (unsigned u = 0; r->resident != NULL && u < fy_model_unit_count(r->l.c); u++)
        if (r->resident[u] != 0) {
            struct fy_ticket t = {0};
            int pieces = fy_sched_in_pieces(r, u);
            if (op == FY_OP_IO_READ && !pieces)
                r->copies.digest[r->copies.pfirst[u]] = unit_digests[u];
            if (op == FY_OP_IO_READ)
                FY_TRY(state_io(r, op, u, r->copies.at[u], r->resident[u],
                                pieces ? FY_SCHED_DIGEST_REPORT : FY_SCHED_DIGEST_CHECK, &t));
            else
                FY_TRY(state_written(r, u, r->resident[u], &t));
            FY_TRY(fy_ticket_wait(&r->tk, &t, NULL));
            FY_REQUIRE(op != FY_OP_IO_READ || fy_sched_unit_digest(r, u) == unit_digests[u],
                       -EBADMSG,
                       "unit %u's state (copy %u), read back from the store piece by "
                       "piece, does not match its commit record: torn or corrupted on the SSD",
                       u, r->copies.at[u]);
        }
    return 0;
}

uint64_t fy_sched_unit_digest(const struct fy_sched *r, unsigned u)
{
    return fy_optstate_unit_digest(r->copies.digest + r->copies.pfirst[u],
                                   r->copies.pfirst[u + 1] - r->copies.pfirst[u]);
}

/* The resident units' bf16 weight copies from their masters, the bits AdamW writes them with
 * (fy_f32_to_bf16): at start, once the committed state is in the pool. */
int fy_sched_fill_copies(struct fy_sched *r)
{
    for (unsigned u = 0; u < fy_model_unit_count(r->l.c); u++) {
        if (!fy_sched_has_copy(r, u))
            continue;
        for (unsigned k = 0, n = fy_optstate_piece_count(r->l.c, u); k < n; k++) {
            struct fy_optstate_piece p;
            fy_optstate_piece(r->l.c, u, k, &p, NULL);
            size_t m = p.params;
            const float *master = fy_pool_at(
                r->pool, r->resident[u] + p.offset + p.layout.section[FY_OPTSTATE_MASTER].offset,
                m * 4);
            uint16_t *copy = fy_pool_at(r->pool, r->wcopy[u] + p.begin * 2, m * 2);
            FY_REQUIRE(master != NULL && copy != NULL, -ERANGE,
                       "schedule error: unit %u's state or weights copy lies outside the pool", u);
#pragma omp parallel for schedule(static) if (m >= (1u << 16))
            for (size_t i = 0; i < m; i++)
                copy[i] = fy_f32_to_bf16(master[i]);
        }
    }
    return 0;
}
