/* Clipping by the global gradient norm in a step's schedule (launcher/step/sched.h; struct
 * fy_sched_clip; launcher/step/train.h says why a clipped step is scheduled so). Two passes: a norm
 * pass of the blocks' backward that sums the gradients' squares, then the backward with its
 * updates, each AdamW scaled. One pass: the norm pass keeps every block's gradient (in the pool's
 * gradhold region, or in the gpu worker), then every unit's update in the order the next forward
 * needs them; a streamed block's update is deferred to the next forward, which reads its state
 * anyway (fy_sched_deferred_read, fy_sched_deferred_update). Results bit-identical either way. */
#ifndef FY_SCHED_CLIP_H
#define FY_SCHED_CLIP_H

#include <stdint.h>

#include "launcher/step/sched.h"

/* Pass 1 of a clipped step and the scale it gives (clip.scale), as
 * torch.nn.utils.clip_grad_norm_ computes it: norm = sqrt(sum of every gradient element squared),
 * in double; scale = max / (norm + 1e-6), applied (as a float, by the opt worker) only when below
 * 1. */
int fy_sched_clip_scale(struct fy_sched *r, uint64_t step, double max_norm, double *norm);
/* A clipped step's backward in one pass (clip.one_pass): every block's gradient kept in the pool's
 * gradhold region (or in the gpu worker: clip.hold_gpu) while the opt worker sums their squares,
 * the norm and scale as fy_sched_clip_scale computes them (*norm), then every unit's update in the
 * order the next forward needs them, each forward unit waiting for its own. Results bit-identical
 * to the two passes. */
int fy_sched_clipped_backward(struct fy_sched *r, uint64_t step, double lr, double max_norm,
                              double *norm);
/* Every update of the steps so far done: one-pass clipping's deferred ones (read, updated, written
 * back), then the queued ones waited for. Before an evaluation or a commit. */
int fy_sched_finish_updates(struct fy_sched *r);

/* Whether unit u's gradient is held in the gpu worker (a block, with clip.hold_gpu). */
int fy_sched_held_on_gpu(const struct fy_sched *r, unsigned u);
/* Where one-pass clipping left unit u's gradient. */
uint64_t fy_sched_clipped_grad(const struct fy_sched *r, unsigned u);

/* In the forward, unit u's weights for weights slot `slot` where its update was deferred: its whole
 * state into state slot u & 1 (*t), the forward taking its master from there once
 * fy_sched_deferred_update has updated it (with bf16 weights, converted into the slot). The state
 * slot's last block must be done with it first: its forward request (in g) and its write-back (in
 * fws). */
int fy_sched_deferred_read(struct fy_sched *r, unsigned u, unsigned slot, struct fy_ticket *t,
                           struct fy_ticket *g, struct fy_ticket *fws);
/* Block b's deferred update, its state read into state slot b & 1 (fy_sched_deferred_read): AdamW
 * there, waited for, then the state written back while the forward reads the new master (with
 * bf16 weights, converted into the block's weights slot `slot` first, waited for). */
int fy_sched_deferred_update(struct fy_sched *r, unsigned b, unsigned slot, struct fy_ticket *fws);

#endif
