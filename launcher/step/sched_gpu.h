/* The gpu worker's requests of a step's schedule (launcher/step/sched.h), each made of the pool's
 * regions where the schedule put its inputs: the embeddings', each block's and the head's forward,
 * a block's and the embeddings' backward, and a held gradient sent to the pool. A block's requests
 * carry its swapped internals (struct fy_sched_swap); its backward first waits for its checkpoint
 * and internals on the store to be in their slots, and starts the next blocks' on their way. */
#ifndef FY_SCHED_GPU_H
#define FY_SCHED_GPU_H

#include <stdint.h>

#include "common/ipc/desc.h"
#include "launcher/step/sched.h"

/* The batch's positions (the tokens region's third array: each token's position in its document),
 * the part that gpt-embed-fwd, gpt-embed-bwd, gpt-block-fwd and gpt-block-bwd carry right after
 * their fixed parts. */
struct fy_desc fy_sched_positions_part(const struct fy_plan_layout *l, int op, int layer);
/* Appends block b's saved parts to a request of n parts (the SSD one at ssd_off, which
 * fy_spill_out or fy_spill_in gave); returns the new count. */
unsigned fy_sched_saved_parts(const struct fy_sched *r, unsigned b, int op, uint64_t ssd_off,
                              struct fy_desc *req, unsigned n);

/* The embeddings' forward: the batch's tokens through the embeddings (weights at w_embed) into the
 * checkpoint at x_out. */
int fy_sched_embed_forward(struct fy_sched *r, uint64_t w_embed, uint64_t x_out,
                           struct fy_ticket *t);
/* Block b's forward (weights at w_off), x_in to x_out; with `train` its swapped internals too
 * (the SSD-placed ones into the slot at s_off). */
int fy_sched_block_forward(struct fy_sched *r, unsigned b, uint64_t w_off, uint64_t x_in,
                           uint64_t x_out, int train, uint64_t s_off, struct fy_ticket *t);
/* The head (the final unit's weights at w_fin, the embeddings' at w_embed for a tied head) on x_in
 * with the loss over the targets; with `train` also its backward: dx_L into dacts[0], the final
 * unit's gradient at dfinal, the head's wte gradient into grads slot 0. */
int fy_sched_head(struct fy_sched *r, uint64_t x_in, uint64_t w_fin, uint64_t w_embed, int train,
                  struct fy_ticket *t);

/* Block b's backward, in either pass: its checkpoint (and its internals placed on the SSD) waited
 * for in their slots, its weights at w_off, dy in and dx out, its gradient into `grad` (with
 * `hold`, kept in the gpu worker too); then the next blocks' inputs on their way: the checkpoints
 * and SSD-placed internals of the next act_ahead blocks into their slots, nearest first. */
int fy_sched_block_backward(struct fy_sched *r, unsigned b, uint64_t w_off, uint64_t dy,
                            uint64_t dx, uint64_t grad, int hold, struct fy_ticket *t);
/* The embedding lookup's gradient (dx0 at pool offset dx0) added to the head's wte gradient in
 * grads slot 0; fy_sched_embed_backward waits for it. */
int fy_sched_embed_backward_issue(struct fy_sched *r, uint64_t dx0, struct fy_ticket *t);
int fy_sched_embed_backward(struct fy_sched *r, uint64_t dx0);
/* Block b's gradient, held in the gpu worker since the norm pass, to the pool at `grad`. */
int fy_sched_grad_send(struct fy_sched *r, unsigned b, uint64_t grad, struct fy_ticket *t);

#endif
