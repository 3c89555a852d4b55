/* The AdamW requests of a step's schedule (launcher/step/sched.h): a unit's update as the opt
 * worker's request parts, queued in the optimizer's queue (launcher/step/optq.h) or sent, whole or
 * piece by piece through the two state slots, and the queue's order for the next forward. */
#ifndef FY_SCHED_UPDATE_H
#define FY_SCHED_UPDATE_H

#include <stdint.h>

#include "common/ipc/desc.h"
#include "launcher/step/sched.h"

/* Unit u's AdamW request parts: req[0] the gradient at pool offset `grad`, then each section of
 * the state at `state` (common/model/optstate.h: master, m, v); the clipping scale (0: none) in the grad
 * part's arg, the learning rate in the master part's; then, where the unit has a bf16 weights
 * copy, a part for it (AdamW rewrites it from the new master). Returns the number of parts. */
unsigned fy_sched_adamw_parts(const struct fy_sched *r, unsigned u, uint64_t grad, uint64_t state,
                              uint64_t step, double lr, double scale, struct fy_desc *req);
/* The part that limits an update of unit u to the `count` rows listed (int32, each n_embd
 * elements) at pool offset `list`. */
struct fy_desc fy_sched_rows_part(const struct fy_plan_layout *l, unsigned u, uint64_t list,
                                  uint64_t count, uint64_t step);
/* Unit u's update as requests (fy_sched_adamw_parts) with clipping scale `scale`; state in state
 * slot s. Queued, not sent. fy_sched_enqueue: with this step's scale (clip.scale). */
int fy_sched_enqueue_scaled(struct fy_sched *r, unsigned u, unsigned s, uint64_t grad,
                            uint64_t step, double lr, double scale);
int fy_sched_enqueue(struct fy_sched *r, unsigned u, unsigned s, uint64_t grad, uint64_t step,
                     double lr);
/* A streamed unit's update piece by piece through the two state slots in turn (its gradient at
 * pool offset `grad`): piece k + 1 read while piece k is updated, piece k written back while k + 1
 * is updated; every request done when it returns. The pieces are read from the copy the unit's
 * state was in, whatever was written meanwhile, and written to the working copy. */
int fy_sched_update_in_pieces(struct fy_sched *r, unsigned u, uint64_t grad, uint64_t step,
                              double lr, double scale);
/* The whole update of one unit (its gradient at pool offset `grad`), waited for. */
int fy_sched_update_unit(struct fy_sched *r, unsigned u, uint64_t grad, uint64_t step, double lr);
/* The backward is done: the updates left go to the opt worker in the next forward's order, all
 * but those of the units from the first one the forward converts on (with bf16 weights), which
 * the forward sends as it goes, so that its conversions do not queue behind them. */
int fy_sched_send_for_forward(struct fy_sched *r);

#endif
