/* GPT requests of the gpu worker: checks every part of a request (kind, dtype and exact size for
 * the run's model and batch) and runs the backend on the pool regions it names. The same code serves
 * the gpu worker process and the launcher's in-process runs.
 *
 * Parts, in order (A = activation [B][T][C] f32, W = weights of the unit, f32 or bf16 (the
 * weights parts of one request alike; the backend is switched to that dtype for the call, and a
 * backend without bf16 weights refuses them), G = gradient f32):
 *   gpt-embed-fwd  (layer 0):        tokens[B*T] i32, W embed, A x0 (out) [, P]
 *   gpt-block-fwd  (layer l):        W block l, A x (in), A y (out) [, P] [, S saved (out)...]
 *   gpt-head       (layer L+1):      A x, tokens targets, W final, W embed
 *                                    [, G dx (out), G dfinal (out), G dembed (out)]; reply arg = loss
 *   gpt-block-bwd  (layer l):        W block l, A x (checkpoint), G dy, G dx (out), G dparams (out)
 *                                    [, P] [, S saved (in)...]
 *   gpt-embed-bwd  (layer 0):        tokens, G dx0, G dembed (accumulated) [, P]
 *   gpt-profile:                     raw (copied through to time the links), raw (out: struct
 *                                    fy_block_profile); on the prepared batch, before any swap
 * P: the positions, optional: FY_KIND_TOKENS i32 [B*T] (the whole batch's, as the tokens; each
 * worker takes its share), token t of a row at position P[t] of its document, which starts at
 * t - P[t] (gpu_worker/backend.h); checked: each in 0..t and below the context, each 0 (a
 * document's first token) or one more than the one before. Absent: positions t, the windows of the
 * token stream (the backend's code of before, to the same bits); so are positions t given.
 * S: up to two FY_KIND_SAVED parts (one in the pool for good, one in a slot on its way to or from
 * the SSD store), each holding the kinds of the mask in its arg, laid out by fy_actplan_region_of
 * over the backend's sizes (fy_actplan_sizes_backend); the masks are disjoint. A block's backward
 * must name the same kinds as its forward wrote (the schedule's business: the backend cannot tell
 * and would compute with whatever the region holds).
 *
 * train.act_plan selects what the backend readies: "auto" keeps the internals of the top blocks
 * that fit the GPU budget, at most train.act_keep of them, and with train.act_swap = 1 readies
 * swapping first (the launcher's plan swaps some kinds of the others); "recompute" nothing;
 * "host" and "ssd" ready swapping (model_swap) and keep none. */
#ifndef FY_GPTEXEC_H
#define FY_GPTEXEC_H

#include "common/base/config.h"
#include "common/ipc/desc.h"
#include "common/model/model.h"
#include "common/ipc/pool.h"
#include "gpu_worker/backend.h"

struct fy_gptexec;

/* Reads model.* and train.batch / train.seq from the run config and prepares the backend; with
 * train.ranks > 1, for this worker's share of the batch (train.rank), joined with the others
 * through the pool's ranks region (gpu_worker/ranks). */
int fy_gptexec_new(struct fy_gptexec **out, struct fy_backend *backend, const struct fy_config *cfg,
                   const struct fy_pool *pool);
void fy_gptexec_destroy(struct fy_gptexec **e);
/* 1 when op is one of the gpt-* operations. */
int fy_gptexec_handles(int op);
/* The whole request: checked, computed, reply filled (the head's loss in reply->arg). */
int fy_gptexec_handle(struct fy_gptexec *e, const struct fy_pool *pool, const struct fy_desc *req,
                      unsigned n, struct fy_desc *reply);
/* The same in two halves, so that a worker can take the next request while this one computes:
 * start returns 1 when the request was queued on the backend (complete it, in order, with
 * fy_gptexec_finish, which fills its reply), 0 when it already completed (reply filled), or -errno.
 * At most fy_gptexec_queue_depth requests are queued at once. */
int fy_gptexec_start(struct fy_gptexec *e, const struct fy_pool *pool, const struct fy_desc *req,
                     unsigned n, struct fy_desc *reply);
int fy_gptexec_finish(struct fy_gptexec *e, struct fy_desc *reply);
unsigned fy_gptexec_queue_depth(const struct fy_gptexec *e);
/* Readable when the oldest queued request can be finished without waiting; -1 if none queue. */
int fy_gptexec_ready_fd(const struct fy_gptexec *e);

#endif
