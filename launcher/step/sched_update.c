/* The AdamW requests of a step's schedule: launcher/step/sched_update.h. */
#include "launcher/step/sched_update.h"

#include <errno.h>
#include <string.h>

#include "common/base/check.h"
#include "common/model/optstate.h"
#include "launcher/step/sched_state.h"
#include "launcher/step/sched_weights.h"

unsigned fy_sched_adamw_parts(const struct fy_sched *r, unsigned u, uint64_t grad, uint64_t state,
                              uint64_t step, double lr, double scale, struct fy_desc *req)
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

struct fy_desc fy_sched_rows_part(const struct fy_plan_layout *l, unsigned u, uint64_t list,
                                  uint64_t count, uint64_t step)
{
    struct fy_desc d =
        fy_desc_region(FY_OP_OPT_ADAMW, FY_KIND_TOKENS, FY_DTYPE_I32, list, count * 4, (int)u);
    d.step = step;
    d.arg = l->c->n_embd;
    return d;
}

int fy_sched_enqueue_scaled(struct fy_sched *r, unsigned u, unsigned s, uint64_t grad,
                            uint64_t step, double lr, double scale)
{
    FY_REQUIRE(r->state_unit[s] == (int)u, -EPROTO,
               "schedule error: AdamW of unit %u on state slot %u, which holds unit %d's state", u,
               s, r->state_unit[s]);
    struct fy_desc req[FY_OPTQ_PARTS_MAX];
    unsigned n = fy_sched_adamw_parts(r, u, grad, r->state_off[s], step, lr, scale, req);
    return fy_optq_push(&r->opt, u, req, n);
}

int fy_sched_enqueue(struct fy_sched *r, unsigned u, unsigned s, uint64_t grad, uint64_t step,
                     double lr)
{
    return fy_sched_enqueue_scaled(r, u, s, grad, step, lr, r->clip.scale);
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

int fy_sched_update_in_pieces(struct fy_sched *r, unsigned u, uint64_t grad, uint64_t step,
                              double lr, double scale)
{
    FY_REQUIRE(r->copies.at != NULL, -EPROTO, "schedule error: state written outside training");
    unsigned n = fy_optstate_piece_count(r->l.c, u), from = r->copies.at[u];
    struct fy_ticket rd[2] = {{0}}, wr[2] = {{0}}, op = {0};
    int rc;
    FY_TRY_OUT(rc, fy_sched_piece_move(r, FY_OP_IO_READ, u, 0, from, 0, &rd[0]));
    for (unsigned k = 0; k < n; k++) {
        unsigned s = k & 1;
        if (k + 1 < n) { /* the next piece into the slot its write-back left */
            FY_TRY_OUT(rc, fy_ticket_wait(&r->tk, &wr[s ^ 1], NULL));
            FY_TRY_OUT(rc,
                       fy_sched_piece_move(r, FY_OP_IO_READ, u, k + 1, from, s ^ 1, &rd[s ^ 1]));
        }
        FY_TRY_OUT(rc, fy_ticket_wait(&r->tk, &rd[s], NULL));
        FY_TRY_OUT(rc, piece_adamw(r, u, k, s, grad, step, lr, scale, &op));
        FY_TRY_OUT(rc, fy_ticket_wait(&r->tk, &op, NULL));
        r->state_unit[s] = (int)u; /* the slot the read of piece k + 1 did not take */
        r->state_off[s] = r->l.state + s * r->l.state_slot_bytes;
        FY_TRY_OUT(rc, fy_sched_piece_io(r, FY_OP_IO_WRITE, u, k, r->copies.work, r->state_off[s],
                                         FY_SCHED_DIGEST_CHECK, &wr[s]));
    }
out:
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

int fy_sched_update_unit(struct fy_sched *r, unsigned u, uint64_t grad, uint64_t step, double lr)
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

int fy_sched_send_for_forward(struct fy_sched *r)
{
    fy_optq_hold_from(&r->opt, fy_sched_next_converted(r, 0));
    return fy_optq_send_all(&r->opt);
}
