/* The forward of a step's schedule (launcher/step/sched.h): the embeddings, the blocks and the
 * head, with the weights of the next units read ahead into the weights slots (as many as the
 * prefetch depth), each block's input kept as its checkpoint (in the pool, or through slots to the
 * store) and its swapped internals; one-pass clipping's deferred updates made on the way. With
 * training, the head's backward too. Evaluation is forwards alone. */
#ifndef FY_SCHED_FORWARD_H
#define FY_SCHED_FORWARD_H

#include <stdint.h>

#include "common/data/sampler.h"
#include "launcher/step/sched.h"

/* Forward through every unit into *loss; with `train`, also the head's backward and its
 * gradients, each unit's weights checked to be step - 1's. */
int fy_sched_forward(struct fy_sched *r, int train, uint64_t step, double *loss);
/* The mean loss over the eval batches' trained targets: with no loss mask every batch counts B*T
 * targets and this is the mean of the batch losses; with one, each batch weighs by its trained
 * targets (a batch without any adds nothing; none at all gives 0). */
int fy_sched_eval_loss(struct fy_sched *r, struct fy_sampler *data, uint64_t batches, double *loss);

#endif
