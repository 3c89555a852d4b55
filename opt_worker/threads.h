/* A fixed pool of worker threads, each pinned to one core, running one function on all of them.
 * How the work is split is the function's: fy_threads_split gives a static partition; AdamW takes
 * chunks from a shared counter instead, which is reproducible because each element's arithmetic
 * does not depend on which thread runs it. */
#ifndef FY_THREADS_H
#define FY_THREADS_H

#include <stddef.h>

struct fy_threads;

/* cpus: os indexes of the cores, one thread each; the caller's thread counts as thread 0 and is
 * bound to cpus[0] here (its previous binding is restored by fy_threads_destroy when that is
 * called from the same thread). cpus == NULL: n unpinned threads.
 * A core that cannot be bound (not present, not allowed by the cpuset) is not an error: a warning
 * names it and that thread runs unpinned; fy_threads_pinned tells how many threads got pinned.
 * Returns 0, -EINVAL (n == 0, n > 4096, a negative cpu), -ENOMEM, or the pthread_create error. */
int fy_threads_new(struct fy_threads **out, const int *cpus, unsigned n);
/* Stops and joins the workers; *p becomes NULL. NULL or *p == NULL: nothing. */
void fy_threads_destroy(struct fy_threads **p);
unsigned fy_threads_count(const struct fy_threads *p);
/* Threads (caller included) that were bound to their core. */
unsigned fy_threads_pinned(const struct fy_threads *p);

/* Runs fn(arg, index, count) once on every thread (index 0 on the caller) and returns when all
 * have finished: the negative return value of the lowest index that failed, else 0.
 * Not reentrant: fn must not call fy_threads_run on the same pool, and one caller at a time. */
int fy_threads_run(struct fy_threads *p, int (*fn)(void *arg, unsigned index, unsigned count),
                   void *arg);

/* Splits [0,n) into count contiguous ranges whose boundaries are multiples of align (except the
 * last end, n), as equal as the alignment allows; gives the range of `index` (may be empty).
 * align == 0 counts as 1. */
void fy_threads_split(size_t n, size_t align, unsigned index, unsigned count, size_t *begin,
                      size_t *end);

#endif
