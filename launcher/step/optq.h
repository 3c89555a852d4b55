/* The optimizer's queue: AdamW requests prepared per unit, held back in sending order and sent to
 * the opt worker. The opt worker gets at most FY_OPTQ_AHEAD updates ahead of the one it is running,
 * so the rest can still be reordered, and the next one sent is always the lowest unit queued: the
 * one the next forward needs first (earliest deadline first). In the backward that is the newest
 * gradient, so while the backward outruns AdamW the top blocks' updates wait in their gradient
 * slots and run during the next forward, below which the forward waits for each unit's own update
 * only (fy_optq_settle): AdamW then works through the forward instead of idling in it. The block
 * gradient slots (grads slots 1..gslots, launcher/plan/plan.h) are freed by those updates, so the queue
 * hands them out too.
 *
 * The opt worker also converts weights to bf16 for the gpu worker (opt-convert,
 * launcher/step/sched_weights.c).
 * A conversion is sent at once, never queued here: a gpu request waits for it. The opt worker
 * serves its requests in order, so a conversion runs after every update sent before it. Two rules
 * keep that line short and in deadline order: a conversion of unit u is sent after the queued
 * updates of units up to u (fy_optq_send_through: u's own update first, since the conversion reads
 * the master it writes), and while the forward converts, the updates of the units from the next
 * one it converts upwards are held back (fy_optq_hold_from) rather than sent ahead of it: at most
 * FY_OPTQ_AHEAD + 1 updates of later units, sent before the hold was set, can stand in front of a
 * forward's conversion. */
#ifndef FY_OPTQ_H
#define FY_OPTQ_H

#include "common/model/optstate.h"
#include "launcher/plan/plan.h"
#include "launcher/step/ticket.h"

#define FY_OPTQ_AHEAD 2
/* An AdamW request: the gradient, the state's sections, a bf16 weights copy, a row list. */
#define FY_OPTQ_PARTS_MAX (1 + FY_OPTSTATE_PARTS + 2)

struct fy_optq {
    struct fy_tickets *tk;
    unsigned units;
    /* per unit: its update's parts (req, parts), and once sent its ticket (sent; one that may
     * outlive its step: the next forward waits for it) */
    struct fy_desc (*req)[FY_OPTQ_PARTS_MAX];
    unsigned char *parts;
    struct fy_ticket *sent;
    unsigned *queue, queued; /* the units whose update is held back, in the order queued */
    /* pump and send_all leave the updates of units from hold on queued (fy_optq_hold_from) */
    unsigned hold;
    /* Grads slots 1..gslots in the backward (fy_optq_take_gslot): the block whose gradient each
     * holds until that block's update is done (0: none; blocks count from 1), and whether that
     * update has been queued (before, the gradient is still on its way home). */
    unsigned gslots;
    unsigned gslot_holder[FY_PLAN_GRAD_SLOTS_MAX + 1];
    unsigned char gslot_queued[FY_PLAN_GRAD_SLOTS_MAX + 1];
};

/* A queue for `units` units and `gslots` block gradient slots (-ENOMEM). A queue all zeros (a run
 * that does not train) has nothing to settle or drain. */
int fy_optq_init(struct fy_optq *q, struct fy_tickets *tk, unsigned units, unsigned gslots);
void fy_optq_release(struct fy_optq *q);
/* Whether unit u's update is queued, not sent. */
int fy_optq_queued(const struct fy_optq *q, unsigned u);
/* Queues unit u's update of n parts; its previous one must be done (-EPROTO, said, otherwise). */
int fy_optq_push(struct fy_optq *q, unsigned u, const struct fy_desc *req, unsigned n);
/* Adds a part to unit u's queued update (the rows it is limited to). */
void fy_optq_add_part(struct fy_optq *q, unsigned u, struct fy_desc part);
/* Sends the lowest unit's queued update. */
int fy_optq_send_next(struct fy_optq *q);
/* Sends queued updates, lowest unit first and below the hold, while fewer than FY_OPTQ_AHEAD + 1
 * are unfinished in the opt worker. */
int fy_optq_pump(struct fy_optq *q);
/* From now on pump and send_all leave the updates of units `from` and above queued (the next
 * forward converts unit `from`'s weights on the opt worker: its conversion must not wait behind
 * later units' updates); settle, send_through and drain still send them. `from` >= the unit
 * count: nothing held (a new queue's). */
void fy_optq_hold_from(struct fy_optq *q, unsigned from);
/* Sends the queued updates of units up to u, lowest first, whatever the hold (before a conversion
 * of unit u, which the opt worker then runs after them). */
int fy_optq_send_through(struct fy_optq *q, unsigned u);
/* Unit u's update done: sent first if still queued (with those queued before it). */
int fy_optq_settle(struct fy_optq *q, unsigned u);
/* The backward is done: the updates left go in the next forward's order, all at once, but those
 * held back (fy_optq_hold_from). */
int fy_optq_send_all(struct fy_optq *q);
/* Every update sent and done. */
int fy_optq_drain(struct fy_optq *q);
/* At a backward's start: the slots whose block's update was waited for are free. */
void fy_optq_release_gslots(struct fy_optq *q);
/* A free grads slot (1..gslots) for block b's gradient into *slot. A slot is free once its block's
 * update is done; when none is, this waits for the update the opt worker finishes first (the
 * earliest sent; tickets count up), sending the next queued one when none holding a slot is in
 * flight. */
int fy_optq_take_gslot(struct fy_optq *q, unsigned b, unsigned *slot);

#endif
