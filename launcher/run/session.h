/* One launch of the workers for a run directory: lock the directory, clear what a dead run left,
 * place the workers (hwloc), create the shared pool, write run.conf, start and supervise the
 * workers, and at the end stop them in order and remove the pool and sockets, whatever happened. */
#ifndef FY_SESSION_H
#define FY_SESSION_H

#include <limits.h>

#include "common/ipc/chan.h"
#include "common/base/config.h"
#include "common/ipc/pool.h"
#include "common/ipc/affinity.h"
#include "common/ipc/topo.h"
#include "launcher/run/supervise.h"
#include "launcher/run/exec.h"

struct fy_session_opts {
    const char *run_dir;
    const char *affinity; /* --affinity spec or NULL */
    const char *ssd;      /* the store's paths (the io worker goes near the first one's disk) */
    int cpu_backend;      /* the gpu worker computes on the CPU: auto gives it the opt worker's
                              cores too */
    uint64_t cpu_mem;     /* cap on the pool, 0 = none */
    int ready_timeout_ms;
    /* a reader of the store (export): when another launch (a training run) holds the run
     * directory, work beside it instead, in RUN/reader-PID (its own lock, pool, sockets and
     * run.conf; the log still RUN/fuyou.log), removed at close; when the run directory is on a
     * read-only file system, where nothing can be training, work without its lock in a reader
     * directory of its own, $TMPDIR/fuyou-reader-PID (/tmp without TMPDIR), removed at close, the
     * workers logging to stderr alone */
    int reader;
};

struct fy_session {
    char run_dir[PATH_MAX]; /* where the session's files are: the run's, or a reader's */
    char log_dir[PATH_MAX]; /* of the workers' log (RUN/fuyou.log); "" where RUN is read-only */
    int beside;             /* a reader beside a training run, in RUN/reader-PID */
    int read_only;          /* a reader of a read-only run directory, in $TMPDIR/fuyou-reader-PID */
    int lock_fd;
    struct fy_topo *topo;
    struct fy_affinity aff;
    struct fy_pool *pool;
    struct fy_chan *chan;
    struct fy_sup *sup;
    char pool_name[FY_POOL_NAME_MAX];
    char endpoint[512];
    struct fy_sup_fault fault; /* set by fy_session_close: the worker that failed, if any */
    int ranks;                 /* gpu workers (the config's train.ranks; 1 without) */
    struct fy_gpus *gpus; /* with several: the executor that sends to each (launcher/run/gpus) */
};

/* Locks and prepares the run directory (which must exist), places the workers and creates the
 * pool; refuses a pool larger than cpu_mem with the numbers. `what` names the pool's use. First
 * removes what readers that died (an export killed beside a training run) left in RUN/reader-*:
 * their workers, pool, sockets and files, one line each. */
int fy_session_open(struct fy_session *s, const struct fy_session_opts *o,
                    const struct fy_pool_region_spec *regions, unsigned n, const char *what);
/* Adds the session's entries (pool, endpoint, affinity, log) to cfg, saves RUN/run.conf, binds the
 * channel and starts the named workers, waiting for each READY. With train.ranks = N > 1 in cfg,
 * "gpu" starts N gpu workers (gpu, gpu1, ...), each on the cpus nearest its GPU where hwloc sees
 * it (the CUDA backend), else on the gpu worker's. */
int fy_session_start(struct fy_session *s, struct fy_config *cfg, const char *const *workers,
                     unsigned n, int ready_timeout_ms);
/* The executor that sends requests to the workers. */
struct fy_exec fy_session_exec(struct fy_session *s);
/* Stops the workers (if any) and removes the pool, sockets and pid file. rc is the outcome so far;
 * the result is -ECHILD when a worker died or stopped answering (s->fault says which and how),
 * -EINTR when interrupted, else rc (or a stop failure). */
int fy_session_close(struct fy_session *s, int rc);

#endif
