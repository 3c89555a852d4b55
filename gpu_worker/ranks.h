/* Several gpu workers (--gpus), each computing a share of every batch: where a worker's share of a
 * batch-shaped region lies, and the sum of the ranks' gradients in rank order through the pool's
 * "ranks" region, for a backend that sums nothing itself (the CPU backend): rank 0 writes its
 * gradient into the request's pool region and says so on its line of the region; rank r waits for
 * rank r - 1's line, adds its own gradient (computed into memory of its own) and says so on its
 * line. The sum is ((g0 + g1) + g2) + ..., the same whatever the timing. Every rank serves the same
 * requests in the same order, so a count of sums names each one on every line. */
#ifndef FY_RANKS_H
#define FY_RANKS_H

#include <stddef.h>
#include <stdint.h>

#include "common/ipc/pool.h"

struct fy_ranks;

/* Rank `rank` of `ranks` (2..16) over the pool's "ranks" region, with room of its own for
 * gradients of up to max_floats floats (rank > 0). timeout_ms: the longest wait for the rank
 * before (a rank that died is the launcher's to see; this only bounds the wait). */
int fy_ranks_new(struct fy_ranks **out, const struct fy_pool *pool, int rank, int ranks,
                 size_t max_floats, int timeout_ms);
void fy_ranks_destroy(struct fy_ranks **r);
/* Where this rank computes a gradient of n floats bound for pool memory `to`: `to` itself for rank
 * 0, else its own room from float `at` on (two gradients of one call take two places), zeroed
 * where the computation adds to what is there (`accumulates`). */
float *fy_ranks_target(struct fy_ranks *r, float *to, size_t n, int accumulates, size_t at);
/* After the gradient is computed at fy_ranks_target's address: rank 0 says it is in `to`; rank r
 * waits for rank r - 1, adds its own (from `at`) to `to` and says so. */
int fy_ranks_sum(struct fy_ranks *r, float *to, size_t n, size_t at);
/* The pool region's bytes after the ranks' lines: the collective library's id (a backend that
 * sums itself), its length, and a line that says it is there. */
void *fy_ranks_id_area(const struct fy_ranks *r, size_t *len);
/* Rank 0: the id is written. Others: wait until it is. */
int fy_ranks_id_ready(struct fy_ranks *r);
int fy_ranks_id_wait(struct fy_ranks *r);

#endif
