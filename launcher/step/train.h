/* Training over an executor: initialising a model in the store, a run of training steps from the
 * store's last intact commit with its commits and log, evaluation and export. The executor is the
 * worker processes (launcher/run/supervise) or, for tests and debugging, the same handlers called in
 * one process (launcher/run/inproc); which descriptors go to which worker in a step, in which order,
 * is launcher/step/sched's; the pool's layout is the plan's (launcher/plan/plan.h).
 *
 * A step is serial and layer-major: the whole batch goes through one unit before the next.
 * Forward: embed, blocks 1..L (each block's input kept in the pool as its checkpoint), head with
 * loss and its backward; then the final unit is updated; backward: for each block L..1, its
 * gradients, then its AdamW update (state read from the SSD store, written back); last the
 * embeddings (the tied head's wte gradient plus the lookup's). A unit's weights for step N+1 are read
 * only after step N has written them back; per-unit versions check this.
 *
 * Clipping by global norm (clip_grad_norm > 0) needs every gradient before the first update, but
 * the updates run beside the backward, so a clipped step runs the backward twice: pass 1 computes
 * each unit's gradient and its sum of squares (opt-sumsq), no update; the launcher adds the units'
 * sums in unit order, norm = sqrt(sum), scale = max / (norm + 1e-6); pass 2 is the backward with
 * its overlapped updates, each opt-adamw carrying the scale when it is below 1 (none otherwise,
 * so the update is the unclipped one bit for bit). The block inputs are still in the pool, so
 * there is no second forward; the head's outputs (dx_L, the final unit's gradient, the head's wte
 * gradient) are kept through pass 1, so the head and the embedding backward run once. The cost: every
 * block's backward and weights read twice. */
#ifndef FY_TRAIN_H
#define FY_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "common/formats/ckpt.h"
#include "common/model/model.h"
#include "common/ipc/pool.h"
#include "common/data/sampler.h"
#include "launcher/run/exec.h"
#include "launcher/step/trainopts.h"

/* Creates every extent of the model in the store (`copies` of each unit's state, 2 or 1, and both
 * commit records), writes the initial weights (zero moments) and commits them as step 0. */
int fy_train_init_store(const struct fy_exec *x, struct fy_pool *pool,
                        const struct fy_model_config *c, uint64_t seed, unsigned copies,
                        int timeout_ms);
/* The store's current commit (launcher/step/commit.h, fy_commit_read); `where` names the store in
 * messages. */
int fy_train_read_meta(const struct fy_exec *x, struct fy_pool *pool, const char *where,
                       struct fy_storemeta *meta, int timeout_ms);
/* Trains from the committed step in meta (its state checked against the record's digests first;
 * where damaged, from the commit before it) to o->steps, committing every o->checkpoint_every
 * steps, at the end and at a stop; meta follows the commits. */
int fy_train_run(const struct fy_exec *x, struct fy_pool *pool, struct fy_storemeta *meta,
                 struct fy_sampler *data, const struct fy_train_opts *o);
/* Writes the master weights of the committed step in meta to a weights file (common/formats/ckpt.h),
 * each unit checked against the commit record's digest. A training run may go on meanwhile
 * (`beside`: the export works beside it, fy_session.beside): when it commits over the copy being
 * read, the export starts again from the newer step; where the step's state is damaged, from the
 * commit before it (fy_commit_export_next; at most FY_TRAIN_EXPORT_RETRIES times); meta follows. */
#define FY_TRAIN_EXPORT_RETRIES 3
int fy_train_export_store(const struct fy_exec *x, struct fy_pool *pool, struct fy_storemeta *meta,
                          const char *path, int overwrite, int beside, int timeout_ms);
/* The same from the session that holds the run directory (nothing trains beside it). */
int fy_train_export(const struct fy_exec *x, struct fy_pool *pool, struct fy_storemeta *meta,
                    const char *path, int overwrite, int timeout_ms);

#endif
