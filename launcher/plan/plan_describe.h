/* A plan (launcher/plan/plan.h) described for people, a line each: how the weights go to the GPU,
 * where the state takes less pool than it would with room, how a clipped step learns the norm.
 * train's log and plan's output say them. */
#ifndef FY_PLAN_DESCRIBE_H
#define FY_PLAN_DESCRIBE_H

#include <stddef.h>

#include "launcher/plan/plan.h"

/* How the weights go to the GPU (shape s, plan p): with bf16 weights, how many units from their
 * copies and how many converted by the opt worker, with the host memory that takes a step; else
 * "weights to the GPU in f32". */
void fy_plan_weights_describe(const struct fy_plan_shape *s, const struct fy_plan *p, char *buf,
                              size_t len);
/* Where the plan takes less pool than it would with room: the state slots in pieces (their size
 * against a unit's whole state, the SSD reads and the predicted step this adds), fewer gradient
 * slots than FY_PLAN_GRAD_SLOTS_FLOOR (the wait and the step it adds); empty where neither. */
void fy_plan_state_describe(const struct fy_plan_in *in, const struct fy_plan *p, char *buf,
                            size_t len);
/* One line on how a clipped step learns the norm (nothing where in does not clip): one pass with
 * the blocks' gradients held in the pool, or two passes and, with --clip-mode auto, why; and what
 * clipping adds to the predicted step. */
void fy_plan_clip_describe(const struct fy_plan_in *in, const struct fy_plan *p, char *buf,
                           size_t len);

#endif
