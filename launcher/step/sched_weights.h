/* The weights slots of a step's schedule (launcher/step/sched.h): which unit each holds, the gpu
 * request that reads each until it is done, and a unit's weights brought into one for a gpu
 * request: read from the store, found where the unit is kept, converted by the opt worker from
 * its master (opt-convert), or streamed from the store through the landing ring chunk by chunk,
 * each chunk converted once read. */
#ifndef FY_SCHED_WEIGHTS_H
#define FY_SCHED_WEIGHTS_H

#include <stdint.h>

#include "common/ipc/desc.h"
#include "launcher/step/sched.h"

/* Weights slot `slot` about to be filled for unit u: the gpu request that read it last (in this
 * pass: wslot_user) done first, whatever the caller waited for already, so that no slot is
 * written while a request in flight reads it; then it is unit u's (fy_sched_weights_of checks
 * it). */
int fy_sched_wslot_claim(struct fy_sched *r, unsigned slot, unsigned u);
/* A gpu request (ticket t) reads weights slot `slot` until t is done. */
void fy_sched_wslot_used_by(struct fy_sched *r, unsigned slot, struct fy_ticket *t);
/* The tickets of a pass are gone at its end, all waited for. */
void fy_sched_wslot_forget_users(struct fy_sched *r);
/* The weights slot holding unit u, checked (see wslot_unit). */
int fy_sched_weights_of(struct fy_sched *r, unsigned u, unsigned slot, uint64_t *offset);

/* A unit's weights into weights slot `slot` for a gpu request, *t the request that brings them
 * (none: they are there). f32 weights: the master section alone of its state in the store, or
 * where the unit is kept in the pool its master there (nothing read). bf16 weights: a kept unit's
 * copy where it has one. Otherwise (bf16, or f32 of a unit in pieces) the master converted
 * (fy_sched_convert_into from where it is kept; from the store, streamed through the landing
 * ring, returning once the weights are all in the slot). */
int fy_sched_read_weights(struct fy_sched *r, unsigned unit, unsigned slot, struct fy_ticket *t);
/* Unit u's weights converted from its state at pool offset `state` (kept in the pool, or in a
 * state slot) into weights slot `slot` by the opt worker (opt-convert): its f32 master rounded to
 * bf16, or the masters of its pieces (a STATE part) rounded or copied into their places. The
 * queued updates of units up to u go to the opt worker first (fy_optq_send_through): it serves
 * requests in order, so the conversion reads the master u's update wrote. */
int fy_sched_convert_into(struct fy_sched *r, unsigned u, uint64_t state, unsigned slot,
                          struct fy_ticket *t);
/* The first unit from u on that converts (the unit count: none), for the optimizer queue's hold
 * in the forward, which goes up the units. */
unsigned fy_sched_next_converted(const struct fy_sched *r, unsigned u);

/* Unit u's weights at pool offset `at` as a gpu request's part: bf16 (a copy or a weights slot)
 * with bf16 weights, else its f32 master. */
struct fy_desc fy_sched_weights_region(const struct fy_sched *r, int op, unsigned u, uint64_t at,
                                       int layer);
/* The resident units' bf16 weight copies from their masters, the bits AdamW writes them with
 * (fy_f32_to_bf16): at start, once the committed state is in the pool. */
int fy_sched_fill_copies(struct fy_sched *r);

#endif
