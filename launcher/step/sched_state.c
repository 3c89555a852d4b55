/* A unit's optimizer state between the store's two copies and the pool:
 * launcher/step/sched_state.h. */
#include "launcher/step/sched_state.h"

#include <errno.h>

#include "common/base/check.h"
#include "common/ipc/desc.h"
#include "common/model/optstate.h"

int fy_sched_piece_io(struct fy_sched *r, int op, unsigned u, unsigned k, unsigned copy,
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
 * request a piece, answered as one ticket), with their digests (fy_sched_piece_io's `how`). */
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

unsigned fy_sched_copy_of(const struct fy_sched *r, unsigned u)
{
    return r->copies.at != NULL ? r->copies.at[u] : r->copies.read;
}

int fy_sched_state_read(struct fy_sched *r, unsigned u, unsigned s, struct fy_ticket *t)
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

/* Unit u's state at pool offset `from` to the copy being written (never the committed one). */
static int state_written(struct fy_sched *r, unsigned u, uint64_t from, struct fy_ticket *t)
{
    FY_REQUIRE(r->copies.at != NULL, -EPROTO, "schedule error: state written outside training");
    r->copies.at[u] = (unsigned char)r->copies.work;
    return state_io(r, FY_OP_IO_WRITE, u, r->copies.work, from, FY_SCHED_DIGEST_CHECK, t);
}

int fy_sched_state_write(struct fy_sched *r, unsigned u, unsigned s, struct fy_ticket *t)
{
    FY_REQUIRE(r->state_unit[s] == (int)u, -EPROTO,
               "schedule error: writing unit %u from state slot %u, which holds unit %d's state", u,
               s, r->state_unit[s]);
    if (r->resident != NULL && r->resident[u] != 0)
        return 0; /* stays in the pool; written to the store at checkpoints */
    return state_written(r, u, r->state_off[s], t);
}

int fy_sched_piece_move(struct fy_sched *r, int op, unsigned u, unsigned k, unsigned from,
                        unsigned s, struct fy_ticket *t)
{
    r->state_unit[s] = (int)u;
    r->state_off[s] = r->l.state + s * r->l.state_slot_bytes;
    return fy_sched_piece_io(r, op, u, k, op == FY_OP_IO_READ ? from : r->copies.work,
                             r->state_off[s], FY_SCHED_DIGEST_CHECK, t);
}

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

void fy_sched_copies_of_commit(struct fy_sched *r, const struct fy_storemeta *meta)
{
    r->copies.read = meta->copy;
    r->copies.work = meta->copies == 2 ? 1 - meta->copy : meta->copy; /* one: in place */
}
