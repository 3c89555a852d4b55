/* The weights slots of a step's schedule: launcher/step/sched_weights.h. */
#include "launcher/step/sched_weights.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"
#include "common/base/dtype.h"
#include "common/model/optstate.h"
#include "launcher/step/sched_state.h"

unsigned fy_sched_next_converted(const struct fy_sched *r, unsigned u)
{
    unsigned units = fy_model_unit_count(r->l.c);
    while (u < units && !fy_sched_converts(r, u))
        u++;
    return u;
}

int fy_sched_wslot_claim(struct fy_sched *r, unsigned slot, unsigned u)
{
    if (r->wslot_user[slot] != NULL)
        FY_TRY(fy_ticket_wait(&r->tk, r->wslot_user[slot], NULL));
    r->wslot_user[slot] = NULL;
    r->wslot_unit[slot] = (int)u;
    return 0;
}

void fy_sched_wslot_used_by(struct fy_sched *r, unsigned slot, struct fy_ticket *t)
{
    r->wslot_user[slot] = t;
}

void fy_sched_wslot_forget_users(struct fy_sched *r)
{
    memset(r->wslot_user, 0, sizeof r->wslot_user);
}

int fy_sched_convert_into(struct fy_sched *r, unsigned u, uint64_t state, unsigned slot,
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
    int rc;
    FY_TRY_OUT(rc, fy_optq_send_through(&r->opt, u));
    for (uint64_t i = 0; i < chunks; i++) {
        /* the reads up to ring - 1 chunks ahead, each into a ring slot whose conversion is done */
        for (; next < chunks && next < i + ring; next++) {
            unsigned k = (unsigned)(next % ring);
            FY_TRY_OUT(rc, fy_ticket_wait(&r->tk, &cv[k], NULL));
            struct fy_desc d = fy_desc_region(FY_OP_IO_READ, FY_KIND_RAW, FY_DTYPE_NONE,
                                              l->land + k * chunk, c[next].bytes, (int)u);
            d.tensor = FY_TENSOR_UNIT_STATE_COPY(u, fy_sched_copy_of(r, u));
            d.arg = c[next].at;
            FY_TRY_OUT(rc, fy_ticket_issue(&r->tk, FY_TICKET_IO, &d, 1, &rd[k]));
        }
        unsigned k = (unsigned)(i % ring);
        FY_TRY_OUT(rc, fy_ticket_wait(&r->tk, &rd[k], NULL));
        struct fy_desc d[2] = {fy_desc_region(FY_OP_OPT_CONVERT, FY_KIND_MASTER, FY_DTYPE_F32,
                                              l->land + k * chunk, c[i].count * 4, (int)u),
                               fy_desc_region(FY_OP_OPT_CONVERT, FY_KIND_WEIGHTS, wd,
                                              fy_sched_wslot(l, slot) + c[i].first * size,
                                              c[i].count * size, (int)u)};
        FY_TRY_OUT(rc, fy_ticket_issue(&r->tk, FY_TICKET_OPT, d, 2, &cv[k]));
    }
out:
    for (unsigned k = 0; k < FY_PLAN_LAND_SLOTS; k++) { /* nothing stays in flight */
        int w = fy_ticket_wait(&r->tk, &rd[k], NULL);
        w = w ? w : fy_ticket_wait(&r->tk, &cv[k], NULL);
        rc = rc ? rc : w;
    }
    free(c);
    return rc;
}

int fy_sched_read_weights(struct fy_sched *r, unsigned unit, unsigned slot, struct fy_ticket *t)
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

int fy_sched_weights_of(struct fy_sched *r, unsigned u, unsigned slot, uint64_t *offset)
{
    FY_REQUIRE(r->wslot_unit[slot] == (int)u, -EPROTO,
               "schedule error: unit %u's weights expected in slot %u, which holds unit %d's", u,
               slot, r->wslot_unit[slot]);
    *offset = r->wslot_off[slot];
    return 0;
}

struct fy_desc fy_sched_weights_region(const struct fy_sched *r, int op, unsigned u, uint64_t at,
                                       int layer)
{
    struct fy_optstate_layout lay;
    fy_optstate_layout(r->l.c, u, &lay);
    if (fy_sched_bf16(r))
        return fy_desc_region(op, FY_KIND_WEIGHTS, FY_DTYPE_BF16, at,
                              lay.params * fy_dtype_size(FY_DTYPE_BF16), layer);
    const struct fy_optstate_section *m = &lay.section[FY_OPTSTATE_MASTER];
    return fy_desc_region(op, FY_KIND_WEIGHTS, m->dtype, at, m->bytes, layer);
}

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
