/* What every worker process shares: argument parsing, the run config, pinning to its cpuset, the
 * pool attachment, the channel to the launcher, READY, and the descriptor loop with STOP/PING,
 * rejection of malformed messages and, for workers that queue work, requests in flight. Each worker
 * supplies init/handle/fini (and start/finish to queue). */
#ifndef FY_WORKER_H
#define FY_WORKER_H

#include <limits.h>

#include "common/ipc/chan.h"
#include "common/base/config.h"
#include "common/ipc/desc.h"
#include "common/ipc/pool.h"
#include "common/ipc/topo.h"

struct fy_worker {
    const char *name; /* "gpu", "io", "opt"; the gpu worker of rank R > 0: "gpuR" */
    int rank;         /* --rank: which of several gpu workers (0: the first, or the only one) */
    char rank_name[16];
    char run_dir[PATH_MAX];
    struct fy_config *cfg;
    struct fy_topo *topo;
    struct fy_pool *pool;
    struct fy_chan *chan;
    char cpus[256]; /* the cpuset the process actually runs on */
};

/* Whether the process got SIGTERM (the launcher's stop of a worker that did not answer STOP): a
 * handler that waits for long checks it and gives up. */
int fy_worker_terminating(void);

struct fy_worker_ops {
    /* After pinning, attaching the pool and connecting; before READY. */
    int (*init)(struct fy_worker *w, void **state);
    /* One validated request of n descriptors; fill reply (pre-set to DONE with the request's seq,
     * step, layer and tensor) and return 0 or -errno, which becomes reply->status. */
    int (*handle)(struct fy_worker *w, void *state, const struct fy_desc *req, unsigned n,
                  struct fy_desc *reply);
    void (*fini)(struct fy_worker *w, void *state);
    /* Optional (NULL: handle serves every request whole). For a worker that works on the next
     * request while the current one completes: start returns 1 when it queued the request, 0 when
     * it completed it (reply filled), or -errno; finish completes the oldest queued request and
     * fills its reply; ready_fd is readable when that needs no waiting; queue_depth is how many may
     * be queued at once. Replies go out in the order requests complete. */
    int (*start)(struct fy_worker *w, void *state, const struct fy_desc *req, unsigned n,
                 struct fy_desc *reply);
    int (*finish)(struct fy_worker *w, void *state, struct fy_desc *reply);
    int (*ready_fd)(void *state);
    unsigned (*queue_depth)(void *state);
};

/* The whole life of a worker process; returns its exit code. */
int fy_worker_main(int argc, char **argv, const char *name, const struct fy_worker_ops *ops);

/* Pointer into the pool for a validated descriptor region. */
void *fy_worker_region(const struct fy_worker *w, const struct fy_desc *d);

#endif
