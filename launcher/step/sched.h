/* The schedule of a training step (launcher/step/train.h says what a step does): which descriptors go
 * to which worker, in which order, over the pool's regions as the plan laid them out
 * (launcher/plan/plan.h). struct fy_sched is what the steps of a run share; this file makes it and
 * names what every part of the schedule uses (the pool's slots, what each unit is). Each concern
 * of a step has a file of its own, each over the ones before it:
 *   sched_state     a unit's optimizer state between the store's two copies and the state slots
 *   sched_weights   the weights slots: weights read, converted, or streamed through the landing
 *                   ring
 *   sched_update    the AdamW requests: a unit's update, whole or piece by piece
 *   sched_gpu       the gpu worker's requests that several passes send (a block's backward)
 *   sched_embed     the embeddings' update in two parts
 *   sched_clip      clipping: the norm pass, one-pass clipping and its deferred updates
 *   sched_backward  the backward with each block's update overlapped
 *   sched_forward   the forward, and evaluation
 * The run around the steps (the commits, the step loop, its log) is launcher/step/train.c's. */
#ifndef FY_SCHED_H
#define FY_SCHED_H

#include <stdint.h>

#include "common/model/actplan.h"
#include "common/ipc/pool.h"
#include "common/data/sampler.h"
#include "common/formats/tokfile.h"
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

/* The two copies of the units' state in the store (common/formats/ckpt.h; launcher/step/sched_state.c):
 * the committed one is `read`; a training run writes the other (`work`) and keeps per unit the
 * copy its latest state is in (at) and that state's digest. NULL arrays (init, export): every unit
 * is read from `read`. */
struct fy_sched_copies {
    unsigned read, work;
    unsigned char *at;
    /* per piece of each unit's state (common/model/optstate.h), unit u's from pfirst[u] (pfirst[units]:
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
 * have been laid out for that plan (-EINVAL, said, otherwise). fy_sched_release frees it whatever
 * happened. */
int fy_sched_setup(struct fy_sched *r, const struct fy_train_opts *o);
void fy_sched_release(struct fy_sched *r);

/* Batch `index` of the split (a training batch: the step's) into the pool's tokens region: inputs,
 * targets and positions; *fill (may be NULL) gets what it holds: the positions of documents and
 * the targets the loss counts (a masked token's, or padding's, is -1, ignored). */
int fy_sched_load_batch(struct fy_sched *r, struct fy_sampler *data, int split, uint64_t index,
                        struct fy_sampler_fill *fill);

/* ---- where things are in the pool (fy_plan_regions' layout) -------------------------------- */

/* Activation i in the acts region, and in the dacts region. */
uint64_t fy_sched_act(const struct fy_plan_layout *l, unsigned i);
uint64_t fy_sched_dact(const struct fy_plan_layout *l, unsigned i);
/* Weights slot i: 0 the embeddings', the others a block's or the final unit's. */
uint64_t fy_sched_wslot(const struct fy_plan_layout *l, unsigned i);
/* Weights slot of unit u (a block, or the final unit) in the forward and backward: slots 1 to
 * wslots in turn, so that the weights of the next wslots - 1 units can be read while one computes. */
unsigned fy_sched_block_wslot(const struct fy_plan_layout *l, unsigned u);
/* Grads slot 0 (the embeddings' gradient, a unit slot), 1..gslots (block-sized), and gslots + 1
 * (after them: clipping's final-unit gradient). */
uint64_t fy_sched_gslot(const struct fy_plan_layout *l, unsigned i);
/* Bytes of unit u's f32 gradient. */
uint64_t fy_sched_grad_bytes(const struct fy_plan_layout *l, unsigned u);
/* Where unit u's master weights lie in its state at pool offset `state`. */
uint64_t fy_sched_master(const struct fy_model_config *c, unsigned u, uint64_t state);

/* ---- what a unit is ------------------------------------------------------------------------ */

/* Whether unit u's state is kept in the pool (resident), not streamed from the store. */
int fy_sched_kept(const struct fy_sched *r, unsigned u);
/* Whether unit u has a bf16 copy of its weights in the pool. */
int fy_sched_has_copy(const struct fy_sched *r, unsigned u);
/* Whether the gpu worker is sent bf16 weights; the weights' dtype. */
int fy_sched_bf16(const struct fy_sched *r);
int fy_sched_weight_dtype(const struct fy_sched *r);
/* Whether unit u's state is in several pieces (common/model/optstate.h). */
int fy_sched_in_pieces(const struct fy_sched *r, unsigned u);
/* Whether unit u's weights are written into a weights slot by the opt worker for each gpu request
 * that reads them (opt-convert): with bf16 weights, a unit without a copy (fy_plan_converts),
 * rounded to bf16; with f32 weights, a unit in pieces, its pieces' masters copied together. */
int fy_sched_converts(const struct fy_sched *r, unsigned u);

#endif
