/* The backward of a step's schedule (launcher/step/sched.h), with each unit's update: the final
 * unit's first, each block's overlapped with the backward of the blocks below (a streamed block's
 * state read before its backward, which takes its weights from there; with the state in pieces,
 * its weights read ahead and its update piece by piece), the embeddings' last. What the optimizer
 * has not done is sent for the next forward. */
#ifndef FY_SCHED_BACKWARD_H
#define FY_SCHED_BACKWARD_H

#include <stdint.h>

#include "launcher/step/sched.h"

/* The backward with each unit's update, after a training forward (and with two-pass clipping its
 * norm pass, which leaves the scale in clip.scale). */
int fy_sched_backward_and_update(struct fy_sched *r, uint64_t step, double lr);

#endif
