/* An executor that runs the training schedule in one process: the gpu worker's GPT requests on the
 * CPU backend, the opt worker's AdamW, and an in-memory store in place of the io worker, all through
 * the same request handlers the worker processes use. For tests (a multi-process run with the SSD
 * store must match it bit for bit) and for debugging. */
#ifndef FY_INPROC_H
#define FY_INPROC_H

#include "common/base/config.h"
#include "common/ipc/pool.h"
#include "launcher/run/exec.h"

struct fy_inproc;

/* cfg: the run config the workers would read (model.*, train.batch, train.seq, AdamW settings);
 * cpus: the cpu list for the optimizer's threads. */
int fy_inproc_new(struct fy_inproc **out, struct fy_pool *pool, const struct fy_config *cfg,
                  const char *cpus);
void fy_inproc_destroy(struct fy_inproc **p);
/* The executor over this in-process state. */
struct fy_exec fy_inproc_exec(struct fy_inproc *p);

#endif
