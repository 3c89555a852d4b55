/* Pinned thread pool for the optimizer: a generation counter wakes the workers (futex after a
 * short spin, so repeated small runs stay cheap) and a pending counter tells the caller when the
 * last one is done. */
#include "opt_worker/threads.h"

#include <errno.h>
#include <hwloc.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/base/check.h"
#include "common/base/log.h"

#define FY_THREADS_MAX 4096u
/* Spin iterations before sleeping: a few microseconds, enough to catch back-to-back runs without
 * burning a core that another process (or an oversubscribed pool) needs. */
#define FY_THREADS_SPIN 200

struct fy_threads_worker {
    struct fy_threads *pool;
    unsigned index;
    pthread_t tid;
    int started;
};

struct fy_threads {
    unsigned n;
    int *cpus; /* NULL: unpinned */
    struct fy_threads_worker *workers; /* n entries; [0] is the caller */
    int *rc;                           /* per-thread return value of the current run */
    int *bound;                        /* per-thread: 1 if pinned */
    hwloc_topology_t topo;
    int have_topo;
    hwloc_cpuset_t caller_saved; /* caller's binding before fy_threads_new, NULL if unknown */
    pthread_t creator;

    _Atomic uint32_t gen;     /* futex word the workers sleep on; bumped per run and at stop */
    _Atomic uint32_t pending; /* workers still in the current run; futex word for the caller */
    int (*fn)(void *, unsigned, unsigned);
    void *arg;
    int stop;
};

static void fy_threads_futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
    /* EAGAIN (value changed) and EINTR just send the caller around its loop again. */
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void fy_threads_futex_wake(_Atomic uint32_t *addr, int count)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
}

static inline void fy_threads_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Binds the calling thread to one PU; 1 on success, 0 (with a warning) otherwise. */
static int fy_threads_bind_self(struct fy_threads *p, unsigned index)
{
    if (p->cpus == NULL)
        return 0;
    int cpu = p->cpus[index];
    hwloc_cpuset_t set = hwloc_bitmap_alloc();
    if (set == NULL) {
        fy_warn("threads: out of memory binding thread %u to core %d; it runs unpinned", index, cpu);
        return 0;
    }
    hwloc_bitmap_only(set, (unsigned)cpu);
    errno = 0;
    int rc = hwloc_set_cpubind(p->topo, set, HWLOC_CPUBIND_THREAD);
    int err = errno ? errno : EINVAL;
    hwloc_bitmap_free(set);
    if (rc < 0) {
        fy_warn("threads: cannot pin thread %u to core %d (%s); it runs unpinned. Give cores that "
                "exist and that this process may use (see taskset -p / the cgroup cpuset, hwloc-ls)",
                index, cpu, strerror(err));
        return 0;
    }
    return 1;
}

static void *fy_threads_main(void *argp)
{
    struct fy_threads_worker *w = argp;
    struct fy_threads *p = w->pool;
    p->bound[w->index] = fy_threads_bind_self(p, w->index);
    uint32_t seen = 0;
    for (;;) {
        uint32_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        for (int i = 0; g == seen && i < FY_THREADS_SPIN; i++) {
            fy_threads_pause();
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
        }
        while (g == seen) {
            fy_threads_futex_wait(&p->gen, seen);
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
        }
        seen = g;
        if (p->stop)
            break;
        p->rc[w->index] = p->fn(p->arg, w->index, p->n);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1)
            fy_threads_futex_wake(&p->pending, 1);
    }
    return NULL;
}

static int fy_threads_noop(void *arg, unsigned index, unsigned count)
{
    return 0;
}

static void fy_threads_free(struct fy_threads *p)
{
    if (p->have_topo)
        hwloc_topology_destroy(p->topo);
    if (p->caller_saved)
        hwloc_bitmap_free(p->caller_saved);
    free(p->cpus);
    free(p->workers);
    free(p->rc);
    free(p->bound);
    free(p);
}

/* Stops and joins the workers that were started. */
static void fy_threads_stop(struct fy_threads *p)
{
    p->stop = 1;
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    fy_threads_futex_wake(&p->gen, INT_MAX);
    for (unsigned i = 1; i < p->n; i++)
        if (p->workers[i].started)
            pthread_join(p->workers[i].tid, NULL);
}

int fy_threads_new(struct fy_threads **out, const int *cpus, unsigned n)
{
    FY_REQUIRE(out != NULL, -EINVAL, "fy_threads_new: out is NULL");
    *out = NULL;
    FY_REQUIRE(n >= 1 && n <= FY_THREADS_MAX, -EINVAL,
               "fy_threads_new: %u threads asked; give between 1 and %u", n, FY_THREADS_MAX);
    if (cpus != NULL)
        for (unsigned i = 0; i < n; i++)
            FY_REQUIRE(cpus[i] >= 0, -EINVAL,
                       "fy_threads_new: cpu %d for thread %u is negative; give os indexes of cores",
                       cpus[i], i);

    struct fy_threads *p = calloc(1, sizeof *p);
    FY_REQUIRE(p != NULL, -ENOMEM, "fy_threads_new: out of memory");
    p->n = n;
    p->workers = calloc(n, sizeof *p->workers);
    p->rc = calloc(n, sizeof *p->rc);
    p->bound = calloc(n, sizeof *p->bound);
    if (p->workers == NULL || p->rc == NULL || p->bound == NULL)
        goto nomem;
    if (cpus != NULL) {
        p->cpus = malloc(n * sizeof *p->cpus);
        if (p->cpus == NULL)
            goto nomem;
        memcpy(p->cpus, cpus, n * sizeof *cpus);
        if (hwloc_topology_init(&p->topo) < 0) {
            fy_error("fy_threads_new: hwloc_topology_init failed; check the hwloc installation");
            fy_threads_free(p);
            return -ENOMEM;
        }
        if (hwloc_topology_load(p->topo) < 0) {
            int err = errno ? errno : EINVAL;
            fy_error("fy_threads_new: hwloc_topology_load: %s; check the hwloc installation "
                     "(HWLOC_* environment variables, /sys mounted)", strerror(err));
            hwloc_topology_destroy(p->topo);
            p->have_topo = 0;
            fy_threads_free(p);
            return -err;
        }
        p->have_topo = 1;
        p->caller_saved = hwloc_bitmap_alloc();
        if (p->caller_saved != NULL &&
            hwloc_get_cpubind(p->topo, p->caller_saved, HWLOC_CPUBIND_THREAD) < 0) {
            hwloc_bitmap_free(p->caller_saved);
            p->caller_saved = NULL;
        }
    }
    p->creator = pthread_self();
    for (unsigned i = 0; i < n; i++) {
        p->workers[i].pool = p;
        p->workers[i].index = i;
    }
    p->bound[0] = fy_threads_bind_self(p, 0);

    for (unsigned i = 1; i < n; i++) {
        int rc = pthread_create(&p->workers[i].tid, NULL, fy_threads_main, &p->workers[i]);
        if (rc != 0) {
            fy_error("fy_threads_new: pthread_create for thread %u of %u: %s; lower the thread "
                     "count or raise the process/thread limits (ulimit -u)", i, n, strerror(rc));
            fy_threads_stop(p);
            fy_threads_free(p);
            return -rc;
        }
        p->workers[i].started = 1;
    }
    /* One empty run so that every worker has bound itself before we return. */
    fy_threads_run(p, fy_threads_noop, NULL);
    *out = p;
    return 0;

nomem:
    fy_error("fy_threads_new: out of memory for %u threads", n);
    fy_threads_free(p);
    return -ENOMEM;
}

void fy_threads_destroy(struct fy_threads **pp)
{
    if (pp == NULL || *pp == NULL)
        return;
    struct fy_threads *p = *pp;
    fy_threads_stop(p);
    if (p->caller_saved != NULL && pthread_equal(p->creator, pthread_self()))
        hwloc_set_cpubind(p->topo, p->caller_saved, HWLOC_CPUBIND_THREAD);
    fy_threads_free(p);
    *pp = NULL;
}

unsigned fy_threads_count(const struct fy_threads *p)
{
    return p ? p->n : 0;
}

unsigned fy_threads_pinned(const struct fy_threads *p)
{
    unsigned k = 0;
    for (unsigned i = 0; p != NULL && i < p->n; i++)
        k += p->bound[i] ? 1u : 0u;
    return k;
}

int fy_threads_run(struct fy_threads *p, int (*fn)(void *arg, unsigned index, unsigned count),
                   void *arg)
{
    FY_REQUIRE(p != NULL && fn != NULL, -EINVAL, "fy_threads_run: pool or function is NULL");
    if (p->n > 1) {
        p->fn = fn;
        p->arg = arg;
        atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
        fy_threads_futex_wake(&p->gen, INT_MAX);
    }
    p->rc[0] = fn(arg, 0, p->n);
    if (p->n > 1) {
        uint32_t left = atomic_load_explicit(&p->pending, memory_order_acquire);
        for (int i = 0; left != 0 && i < FY_THREADS_SPIN; i++) {
            fy_threads_pause();
            left = atomic_load_explicit(&p->pending, memory_order_acquire);
        }
        while (left != 0) {
            fy_threads_futex_wait(&p->pending, left);
            left = atomic_load_explicit(&p->pending, memory_order_acquire);
        }
    }
    for (unsigned i = 0; i < p->n; i++)
        if (p->rc[i] < 0)
            return p->rc[i];
    return 0;
}

void fy_threads_split(size_t n, size_t align, unsigned index, unsigned count, size_t *begin,
                      size_t *end)
{
    if (align == 0)
        align = 1;
    if (count == 0 || index >= count) {
        *begin = *end = n;
        return;
    }
    size_t blocks = n / align + (n % align != 0);
    size_t base = blocks / count, rem = blocks % count;
    size_t b0 = index * base + (index < rem ? index : rem);
    size_t b1 = b0 + base + (index < rem ? 1 : 0);
    size_t lo = b0 * align, hi = b1 * align;
    *begin = lo < n ? lo : n;
    *end = hi < n ? hi : n;
}
