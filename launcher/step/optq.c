/* The optimizer's queue (launcher/step/optq.h). */
#include "launcher/step/optq.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"

int fy_optq_init(struct fy_optq *q, struct fy_tickets *tk, unsigned units, unsigned gslots)
{
    memset(q, 0, sizeof *q);
    q->tk = tk;
    q->units = units;
    q->gslots = gslots;
    q->hold = units;
    q->req = calloc(units, sizeof *q->req);
    q->parts = calloc(units, 1);
    q->sent = calloc(units, sizeof *q->sent);
    q->queue = calloc(units, sizeof *q->queue);
    return q->req && q->parts && q->sent && q->queue ? 0 : -ENOMEM;
}

void fy_optq_release(struct fy_optq *q)
{
    free(q->req);
    free(q->parts);
    free(q->sent);
    free(q->queue);
    memset(q, 0, sizeof *q);
}

int fy_optq_queued(const struct fy_optq *q, unsigned u)
{
    for (unsigned i = 0; i < q->queued; i++)
        if (q->queue[i] == u)
            return 1;
    return 0;
}

int fy_optq_push(struct fy_optq *q, unsigned u, const struct fy_desc *req, unsigned n)
{
    FY_REQUIRE(q->sent[u].id == 0 && !fy_optq_queued(q, u), -EPROTO,
               "schedule error: unit %u's previous update is still queued or in flight", u);
    memcpy(q->req[u], req, n * sizeof *req);
    q->parts[u] = (unsigned char)n;
    q->queue[q->queued++] = u;
    return 0;
}

void fy_optq_add_part(struct fy_optq *q, unsigned u, struct fy_desc part)
{
    q->req[u][q->parts[u]] = part;
    q->parts[u]++;
}

/* The index in the queue of its lowest unit (the queue must not be empty). */
static unsigned lowest(const struct fy_optq *q)
{
    unsigned first = 0;
    for (unsigned i = 1; i < q->queued; i++)
        if (q->queue[i] < q->queue[first])
            first = i;
    return first;
}

int fy_optq_send_next(struct fy_optq *q)
{
    unsigned first = lowest(q);
    unsigned u = q->queue[first];
    memmove(q->queue + first, q->queue + first + 1, (--q->queued - first) * sizeof *q->queue);
    return fy_ticket_issue(q->tk, FY_TICKET_OPT, q->req[u], q->parts[u], &q->sent[u]);
}

void fy_optq_hold_from(struct fy_optq *q, unsigned from) { q->hold = from; }

int fy_optq_send_through(struct fy_optq *q, unsigned u)
{
    while (q->queued > 0 && q->queue[lowest(q)] <= u)
        FY_TRY(fy_optq_send_next(q));
    return 0;
}

int fy_optq_pump(struct fy_optq *q)
{
    while (q->queued > 0 && q->queue[lowest(q)] < q->hold) {
        unsigned busy = 0;
        for (unsigned u = 0; u < q->units; u++) {
            struct fy_ticket *t = &q->sent[u];
            if (t->id == 0)
                continue;
            int in = fy_ticket_finished(q->tk, t);
            FY_TRY(in);
            busy += !in;
        }
        if (busy > FY_OPTQ_AHEAD)
            return 0;
        FY_TRY(fy_optq_send_next(q));
    }
    return 0;
}

int fy_optq_settle(struct fy_optq *q, unsigned u)
{
    if (q->sent == NULL) /* a run that does not train */
        return 0;
    while (fy_optq_queued(q, u))
        FY_TRY(fy_optq_send_next(q));
    FY_TRY(fy_ticket_wait(q->tk, &q->sent[u], NULL));
    return fy_optq_pump(q);
}

int fy_optq_send_all(struct fy_optq *q)
{
    while (q->queued > 0 && q->queue[lowest(q)] < q->hold)
        FY_TRY(fy_optq_send_next(q));
    return 0;
}

int fy_optq_drain(struct fy_optq *q)
{
    int rc = 0;
    while (rc == 0 && q->queued > 0)
        rc = fy_optq_send_next(q);
    for (unsigned u = 0; q->sent != NULL && u < q->units; u++) {
        int w = fy_ticket_wait(q->tk, &q->sent[u], NULL);
        rc = rc ? rc : w;
    }
    return rc;
}

void fy_optq_release_gslots(struct fy_optq *q)
{
    for (unsigned s = 1; s <= q->gslots; s++) {
        unsigned b = q->gslot_holder[s];
        if (b != 0 && !fy_optq_queued(q, b) && q->sent[b].id == 0)
            q->gslot_holder[s] = 0;
    }
}

int fy_optq_take_gslot(struct fy_optq *q, unsigned b, unsigned *slot)
{
    for (;;) {
        struct fy_ticket *first = NULL;
        for (unsigned s = 1; s <= q->gslots; s++) {
            unsigned holder = q->gslot_holder[s];
            if (holder != 0 && (!q->gslot_queued[s] || fy_optq_queued(q, holder)))
                continue; /* its gradient is not home yet, or its update not sent */
            struct fy_ticket *t = holder != 0 ? &q->sent[holder] : NULL;
            /* a 0 id: waited for */
            int done = t == NULL || t->id == 0 ? 1 : fy_ticket_finished(q->tk, t);
            FY_TRY(done);
            if (done && t != NULL && t->id != 0 && t->status != 0)
                return t->status;
            if (done) {
                q->gslot_holder[s] = b;
                q->gslot_queued[s] = 0;
                *slot = s;
                return 0;
            }
            if (first == NULL || t->id < first->id)
                first = t;
        }
        if (first != NULL)
            fy_ticket_finish(q->tk, first);
        else if (q->queued > 0)
            FY_TRY(fy_optq_send_next(q));
        else
            FY_REQUIRE(0, -EPROTO,
                       "schedule error: every gradient slot is taken and no update "
                       "that would free one is pending");
    }
}
