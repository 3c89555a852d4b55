/* The embeddings' update of a step's schedule (launcher/step/sched.h), in two parts where their
 * state is kept in the pool and the step is not clipped (struct fy_sched_embed): the rows the
 * batch's tokens do not touch, whose gradient (the head's alone; none for an untied head) is
 * final once the head is done, sent early to run during the backward; the touched rows and the
 * positions' after the embedding backward, which the next forward waits for. */
#ifndef FY_SCHED_EMBED_H
#define FY_SCHED_EMBED_H

#include <stdint.h>

#include "launcher/step/sched.h"

/* Whether this step's embeddings' update goes in two parts. */
int fy_sched_embed_split(const struct fy_sched *r);
/* The first part: the two row lists to the pool (the untouched rows, then the rest), the
 * untouched rows' update sent (embed.early, unclipped); *late gets the second list's length. */
int fy_sched_embed_update_early(struct fy_sched *r, uint64_t step, double lr, uint64_t *late);
/* After the embedding backward (and the first part done): the embeddings' update, of the `late`
 * rows alone where `split`. A kept unit's is queued for the next forward; a streamed one's done. */
int fy_sched_embed_update(struct fy_sched *r, uint64_t step, double lr, int split, uint64_t late);

#endif
