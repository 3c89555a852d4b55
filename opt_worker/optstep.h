/* Optimizer requests: AdamW over the regions an opt-adamw request names, on the pinned threads of
 * the opt worker, with the step's learning rate from the request and GPT-2 weight-decay rules when
 * the request is about a model unit; the sum of squares of a gradient, from which the launcher
 * computes the global gradient norm for clipping; and weights rounded to bf16 for the gpu worker. Serves the opt worker process and in-process runs
 * alike.
 *
 * opt-adamw parts (any order, each kind once): GRAD (f32 or bf16), MASTER, ADAM_M, ADAM_V (f32)
 * and optionally WEIGHTS (bf16 copy out). step = Adam's t (>= 1); layer = model unit (weight decay
 * on matrices only, per fy_model_decay_segments) or -1 (decay on every element). For a unit whose
 * state is in pieces (common/model/optstate.h) the sections are those of one piece, its index in the
 * MASTER part's tensor (0 for a unit in one piece), and GRAD and WEIGHTS hold that piece's range;
 * or in place of the sections one STATE part, the unit's whole extent, which is updated piece by
 * piece (a row list too): the bits of the unit's update in one piece either way. The arg of a part
 * is about that part, as IEEE double bits:
 *   MASTER  the learning rate (0: the run config's lr; a STATE part's arg likewise);
 *   GRAD    the gradient scale of global-norm clipping, min(1, max_norm / (norm + 1e-6)) as the
 *           launcher computes it: every gradient element is multiplied by (float)scale before
 *           AdamW uses it (fy_adamw_tensor.grad_scale). 0, or 1, means no clipping: no multiply at
 *           all, so the update is bit for bit the unclipped one. Otherwise it must be finite and
 *           > 0 as a float; anything else is refused (-EPROTO) before any element changes;
 *   others  unused (0).
 *
 * opt-sumsq: one GRAD part (f32 or bf16); layer = model unit (its size is checked) or -1. The
 * reply's arg is sum(g^2) in double (fy_adamw_sumsq: the same bits whatever the thread count or
 * SIMD width). Nothing is written.
 *
 * opt-convert: a MASTER part (f32) and a WEIGHTS part (bf16) of the same element count (at least
 * one), not overlapping; layer = the model unit they are (a piece) of, checked to hold that many
 * parameters, or -1. The weights part gets fy_f32_to_bf16 of every value (opt_worker/convert.h):
 * the bf16 weights a gpu request reads, the bits a kept unit's copy has. An f32 WEIGHTS part gets
 * the values copied; a STATE part in place of MASTER (a unit's pieces) has each piece's master
 * converted or copied into its place: the weights of a unit in pieces, whose master is not one
 * contiguous range. */
#ifndef FY_OPTSTEP_H
#define FY_OPTSTEP_H

#include "common/base/config.h"
#include "common/ipc/desc.h"
#include "common/ipc/pool.h"

struct fy_optstep;

/* Reads lr, beta1, beta2, eps, weight_decay, adamw_impl, opt_threads and model.* (optional) from
 * the run config; one pinned thread per cpu of `cpus` (a cpu list), at most opt_threads. */
int fy_optstep_new(struct fy_optstep **out, const struct fy_config *cfg, const char *cpus);
void fy_optstep_destroy(struct fy_optstep **o);
int fy_optstep_handle(struct fy_optstep *o, const struct fy_pool *pool, const struct fy_desc *req,
                      unsigned n, struct fy_desc *reply);

#endif
