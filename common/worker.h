/* What every worker process shares: argument parsing, the run config, pinning to its cpuset, the
 * pool attachment, the channel to the launcher, READY, and the descriptor loop with STOP/PING and
 * rejection of malformed messages. Each worker supplies init/handle/fini. */
#ifndef FY_WORKER_H
#define FY_WORKER_H

#include <limits.h>

#include "chan.h"
#include "config.h"
#include "desc.h"
#include "pool.h"
#include "topo.h"

struct fy_worker {
    const char *name; /* "gpu", "io", "opt" */
    char run_dir[PATH_MAX];
    struct fy_config *cfg;
    struct fy_topo *topo;
    struct fy_pool *pool;
    struct fy_chan *chan;
    char cpus[256]; /* the cpuset the process actually runs on */
};

struct fy_worker_ops {
    /* After pinning, attaching the pool and connecting; before READY. */
    int (*init)(struct fy_worker *w, void **state);
    /* One validated request of n descriptors; fill reply (pre-set to DONE with the request's seq,
     * step, layer and tensor) and return 0 or -errno, which becomes reply->status. */
    int (*handle)(struct fy_worker *w, void *state, const struct fy_desc *req, unsigned n,
                  struct fy_desc *reply);
    void (*fini)(struct fy_worker *w, void *state);
};

/* The whole life of a worker process; returns its exit code. */
int fy_worker_main(int argc, char **argv, const char *name, const struct fy_worker_ops *ops);

/* Pointer into the pool for a validated descriptor region. */
void *fy_worker_region(const struct fy_worker *w, const struct fy_desc *d);

#endif
