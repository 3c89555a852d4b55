/* The ranks' gradient sum in rank order through the pool: see ranks.h. */
#include "ranks.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/base/check.h"
#include "common/ipc/desc.h"
#include "common/ipc/worker.h"

#define LINE 64        /* bytes: one cache line per rank, so ranks do not share one */
#define RANKS_MAX 16
#define ID_AT (RANKS_MAX * LINE) /* the id's ready line, then the id */

struct fy_ranks {
    int rank, ranks, timeout_ms;
    char *base;   /* the pool's "ranks" region */
    size_t bytes;
    uint64_t sums; /* sums made so far: the number on the lines */
    float *own;    /* rank > 0: its gradients, max_floats of them */
    size_t max_floats;
};

/* Rank `rank`'s line: the number of sums it has made, then its process id. */
static _Atomic uint64_t *line(const struct fy_ranks *r, int rank)
{
    return (_Atomic uint64_t *)(r->base + (size_t)rank * LINE);
}

static _Atomic int64_t *pid_of(const struct fy_ranks *r, int rank)
{
    return (_Atomic int64_t *)(r->base + (size_t)rank * LINE + sizeof(uint64_t));
}

int fy_ranks_new(struct fy_ranks **out, const struct fy_pool *pool, int rank, int ranks,
                 size_t max_floats, int timeout_ms)
{
    *out = NULL;
    FY_REQUIRE(ranks >= 2 && ranks <= RANKS_MAX && rank >= 0 && rank < ranks, -EINVAL,
               "gpu worker: rank %d of %d: need 0 <= rank < ranks <= %d", rank, ranks, RANKS_MAX);
    uint64_t off = 0, bytes = 0;
    FY_TRY(fy_pool_region(pool, "ranks", &off, &bytes));
    FY_REQUIRE(bytes >= ID_AT + 2 * LINE, -EINVAL,
               "gpu worker: the pool's ranks region is %llu bytes, not the %d it needs",
               (unsigned long long)bytes, ID_AT + 2 * LINE);
    struct fy_ranks *r = calloc(1, sizeof *r);
    if (r == NULL)
        return -ENOMEM;
    r->rank = rank;
    r->ranks = ranks;
    r->timeout_ms = timeout_ms;
    r->base = fy_pool_at(pool, off, bytes);
    r->bytes = bytes;
    r->max_floats = max_floats;
    atomic_store_explicit(pid_of(r, rank), (int64_t)getpid(), memory_order_release);
    if (rank > 0 && (r->own = malloc(max_floats * sizeof(float))) == NULL) {
        fy_error("gpu worker %d: no memory for its share of a gradient (%zu floats)", rank,
                 max_floats);
        free(r);
        return -ENOMEM;
    }
    *out = r;
    return 0;
}

void fy_ranks_destroy(struct fy_ranks **r)
{
    if (r == NULL || *r == NULL)
        return;
    free((*r)->own);
    free(*r);
    *r = NULL;
}

float *fy_ranks_target(struct fy_ranks *r, float *to, size_t n, int accumulates, size_t at)
{
    if (r->rank == 0 || at + n > r->max_floats)
        return to; /* fy_ranks_sum refuses the latter */
    if (accumulates)
        memset(r->own + at, 0, n * sizeof(float));
    return r->own + at;
}

/* Waits until *at, which rank `from` sets, reaches `value`, sleeping a little between looks (the
 * other ranks compute meanwhile; a spin would take their cores). Gives up when that rank's process
 * is gone (the launcher then restarts the run, and this worker must answer its stop) or this one
 * got SIGTERM, and after the timeout. */
static int wait_for(const struct fy_ranks *r, _Atomic uint64_t *at, uint64_t value, int from,
                    const char *what)
{
    uint64_t start = fy_monotonic_ns(), limit = (uint64_t)r->timeout_ms * 1000000u;
    for (unsigned spins = 0; atomic_load_explicit(at, memory_order_acquire) < value; spins++) {
        if (fy_monotonic_ns() - start > limit) {
            fy_error("gpu worker %d: waited %d s for %s: is that gpu worker alive? (the launcher "
                     "restarts the run if not)", r->rank, r->timeout_ms / 1000, what);
            return -ETIMEDOUT;
        }
        if (spins <= 64)
            continue;
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
        if (spins % 256 != 0) /* every few milliseconds: is the other rank still there? */
            continue;
        int64_t pid = atomic_load_explicit(pid_of(r, from), memory_order_acquire);
        if ((pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH) || fy_worker_terminating()) {
            fy_warn("gpu worker %d: stopped waiting for %s: %s", r->rank, what,
                    fy_worker_terminating() ? "asked to stop (SIGTERM)"
                                            : "that gpu worker is gone");
            return -ECANCELED;
        }
    }
    return 0;
}

int fy_ranks_sum(struct fy_ranks *r, float *to, size_t n, size_t at)
{
    FY_REQUIRE(at + n <= r->max_floats, -EINVAL,
               "gpu worker %d: a gradient of %zu floats at %zu, past the %zu it has room for",
               r->rank, n, at, r->max_floats);
    uint64_t sum = ++r->sums;
    if (r->rank > 0) {
        char what[64];
        snprintf(what, sizeof what, "gpu worker %d's share of gradient sum %llu", r->rank - 1,
                 (unsigned long long)sum);
        FY_TRY(wait_for(r, line(r, r->rank - 1), sum, r->rank - 1, what));
        const float *own = r->own + at;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++)
            to[i] += own[i];
    }
    atomic_store_explicit(line(r, r->rank), sum, memory_order_release);
    return 0;
}

void *fy_ranks_id_area(const struct fy_ranks *r, size_t *len)
{
    *len = r->bytes - ID_AT - LINE;
    return r->base + ID_AT + LINE;
}

int fy_ranks_id_ready(struct fy_ranks *r)
{
    atomic_store_explicit((_Atomic uint64_t *)(r->base + ID_AT), 1, memory_order_release);
    return 0;
}

int fy_ranks_id_wait(struct fy_ranks *r)
{
    return wait_for(r, (_Atomic uint64_t *)(r->base + ID_AT), 1, 0, "gpu worker 0's group id");
}
