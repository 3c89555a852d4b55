/* The schedule of a training step (launcher/step/train.h says what a step does): which descriptors go
 * to which worker, in which order, over the pool's regions as the plan laid them out
 * (launcher/plan/plan.h): the forward, the backward with each block's update overlapped, clipping's
 * norm pass, the embeddings' update in two parts, evaluation; and moving the kept units' state
 * between the pool and the store. struct fy_sched is what the steps of a run share; the run
 * around them (the commits, the step loop, its log) is launcher/step/train.c's. */
#ifndef FY_SCHED_H
#define FY_SCHED_H

#include <stdint.h>

#include "common/actplan.h"
#include "common/pool.h"
#include "common/sampler.h"
#include "common/tokfile.h"
#include "launcher/step/optq.h"
#include "launcher/plan/plan.h"
#include "launcher/step/spill.h"
#include "launcher/step/ticket.h"
#include "launcher/step/trainopts.h"

/* The blocks' swapped internals (fy_train_opts.act_place), per block 1..L: the kinds that stay in
 * the pool (host_mask, at host_off in the saved region) and those that go through the ring's slots
 * to the store (ssd_mask; block b is item b - 1); sizes, the kinds' bytes in the backend's layout.
 * Set up with the schedule (fy_sched_setup); the requests' parts are fy_sched_saved_parts'. */
struct fy_sched_swap {
    unsigned *host_mask, *ssd_mask;
    uint64_t *host_off;
    struct fy_spill ring;
    struct fy_actplan_sizes sizes;
};

/* Clipping (launcher/step/sched_clip.c): on (one backward pass or two; the norm pass also
 * completes the embedding gradient), and this step's gradient scale (0: none) for every
 * opt-adamw. */
struct fy_sched_clip {
    int on;
    double scale;
    /* Clipping in one backward pass (the pool's "gradhold" region: fy_sched_clipped_backward) in
     * place of two. It defers a streamed block's update to the next forward, which reads the
     * block's whole state (its weights with it) into a state slot, updates it there and writes it
     * back, so its master crosses from the SSD once a step, as without clipping: per unit 1 while
     * deferred, and the deferred updates' step, learning rate and scale. */
    int one_pass;
    unsigned char *deferred;
    uint64_t deferred_step;
    double deferred_lr, deferred_scale;
    /* one pass with the blocks' gradients held in the gpu worker (fy_train_opts.grad_hold_gpu):
     * each sent to grads slot 1 or 2 (gpt-grad-send) when its update runs; gsend, the sends for
     * the deferred updates, by state slot */
    int hold_gpu;
    struct fy_ticket gsend[2];
};

/* The embeddings' update in two parts (launcher/step/sched_embed.c; without clipping, state in the
 * pool): the rows the batch's tokens do not touch, sent once the head's gradient is home (early),
 * and the rest once the embedding backward is done; row_touched is the scratch that sorts them.
 * split 0: one update after the backward (the test hook FUYOU_TEST_EMBED_WHOLE, or int8 optimizer
 * state with rows that split its blocks). */
struct fy_sched_embed {
    int split;
    struct fy_ticket early;
    unsigned char *row_touched;
};

/* The two copies of the units' state in the store (common/ckpt.h; launcher/step/sched_state.c):
 * the committed one is `read`; a training run writes the other (`work`) and keeps per unit the
 * copy its latest state is in (at) and that state's digest. NULL arrays (init, export): every unit
 * is read from `read`. */
struct fy_sched_copies {
    unsigned read, work;
    unsigned char *at;
    /* per piece of each unit's state (common/optstate.h), unit u's from pfirst[u] (pfirst[units]:
     * every unit's pieces): its digest in the copy its latest state is in (a unit in one piece:
     * the unit's digest) */
    unsigned *pfirst;
    uint64_t *digest;
};

struct fy_sched {
    struct fy_tickets tk; /* the requests and their tickets, the times waited and busy */
    struct fy_pool *pool;
    struct fy_plan_layout l;
    /* Which unit each weights and state slot was last filled for: every use checks it, so a
     * schedule that reads a slot filled for another unit fails loudly instead of computing with
     * the wrong numbers; and where the slot's contents are (a resident unit's own). */
    int wslot_unit[FY_PLAN_PREFETCH_MAX + 2], state_unit[2];
    uint64_t wslot_off[FY_PLAN_PREFETCH_MAX + 2], state_off[2];
    /* The gpu request of this pass that read each weights slot last (NULL: none), waited for
     * before anything is read or converted into the slot. */
    struct fy_ticket *wslot_user[FY_PLAN_PREFETCH_MAX + 2];
    uint64_t *resident; /* per unit: its state's offset in the pool, or 0 */
    uint64_t *wcopy;    /* per unit: its bf16 weights copy's offset in the pool, or 0 */
    uint64_t *version;  /* per unit: the step whose weights it holds */
    /* Checkpoints (the blocks' inputs x_0..x_L): item i is x_i, in the acts region; with
     * --ckpt-place ssd x_0..x_{L-1} go through its slots to the store. */
    struct fy_spill block_inputs;
    struct fy_sched_swap swap;
    unsigned act_ahead; /* blocks whose items on the store the backward reads ahead (--act-ahead) */
    /* where the head writes the final unit's gradient: grads slot 1; with clipping the room after
     * the block gradient slots, where it survives pass 1 */
    uint64_t dfinal;
    struct fy_sched_clip clip;
    struct fy_optq opt; /* the AdamW updates queued and sent, and the gradient slots */
    struct fy_sched_embed embed;
    struct fy_sched_copies copies;
};

/* A schedule over a pool laid out for steps of shape s (1 x 1 for init and export, which move
 * units alone); requests through x, each answered within timeout_ms. */
int fy_sched_init(struct fy_sched *r, struct fy_pool *pool, const struct fy_plan_shape *s,
                  const struct fy_exec *x, int timeout_ms);
/* The rest for training with o: the schedule (overlapped or serial), the trace, the checkpoints'
 * and internals' places, clipping, the optimizer's queue, the kept units' offsets. The pool must
 * have been laid out for that plan (-EINVAL, said, otherwise). fy_sched_free frees it whatever
 * happened. */
int fy_sched_setup(struct fy_sched *r, const struct fy_train_opts *o);
void fy_sched_free(struct fy_sched *r);

/* Batch `index` of the split (a training batch: the step's) into the pool's tokens region: inputs,
 * targets and positions; *fill (may be NULL) gets what it holds: the positions of documents and
 * the targets the loss counts (a masked token's, or padding's, is -1, ignored). */
int fy_sched_load_batch(struct fy_sched *r, struct fy_sampler *data, int split, uint64_t index,
                        struct fy_sampler_fill *fill);
/* Forward through every unit into *loss; with `train`, also the head's backward and its
 * gradients, each unit's weights checked to be step - 1's. */
int fy_sched_forward(struct fy_sched *r, int train, uint64_t step, double *loss);
/* Pass 1 of a clipped step and the scale it gives (r->grad_scale), as
 * torch.nn.utils.clip_grad_norm_ computes it: norm = sqrt(sum of every gradient element squared),
 * in double; scale = max / (norm + 1e-6), applied (as a float, by the opt worker) only when below
 * 1. */
int fy_sched_clip_scale(struct fy_sched *r, uint64_t step, double max_norm, double *norm);
/* A clipped step's backward in one pass (r->one_pass): every block's gradient kept in the pool's
 * gradhold region (or in the gpu worker: r->hold_gpu) while the opt worker sums their squares,
 * the norm and scale as
 * fy_sched_clip_scale computes them (*norm), then every unit's update in the order the next
 * forward needs them, each forward unit waiting for its own. Results bit-identical to the two
 * passes. */
int fy_sched_clipped_backward(struct fy_sched *r, uint64_t step, double lr, double max_norm,
                              double *norm);
/* Every update of the steps so far done: one-pass clipping's deferred ones (read, updated, written
 * back), then the queued ones waited for. Before an evaluation or a commit. */
int fy_sched_finish_updates(struct fy_sched *r);
/* The backward with each unit's update: the final unit's, each block's overlapped with the blocks
 * below, the embeddings' last; what the optimizer has not done is sent for the next forward. */
int fy_sched_backward_and_update(struct fy_sched *r, uint64_t step, double lr);
/* The mean loss over the eval batches' trained targets. */
int fy_sched_eval_loss(struct fy_sched *r, struct fy_sampler *data, uint64_t batches, double *loss);
/* Every resident unit's state between the pool and the store: loaded from the committed copy at
 * start, each unit checked against its digest in the commit record (unit_digests; a unit in pieces
 * read piece by piece, its pieces' digests kept), written to the other at commits (unit_digests
 * NULL). */
int fy_sched_resident_transfer(struct fy_sched *r, int op, const uint64_t *unit_digests);
/* Unit u's digest for a commit record: of its pieces' digests (fy_optstate_unit_digest). */
uint64_t fy_sched_unit_digest(const struct fy_sched *r, unsigned u);
/* The resident units' bf16 weight copies from their masters, the bits AdamW writes them with
 * (fy_f32_to_bf16): at start, once the committed state is in the pool. */
int fy_sched_fill_copies(struct fy_sched *r);

#endif
