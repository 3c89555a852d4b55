/* io_uring engine of the io worker: one ring for reads and one for writes, so reads that feed
 * compute never queue behind write-back. Transfers are split into block-size pieces, kept at up to
 * queue_depth pieces in flight per ring, and finished (short I/O resubmitted) before they are
 * reported. Single-threaded: one thread owns a fy_ring. */
#ifndef FY_RING_H
#define FY_RING_H

#include <stddef.h>
#include <stdint.h>

#include "io_worker/ioreq.h"

struct fy_ring;

struct fy_ring_opts {
    unsigned queue_depth; /* pieces in flight per ring; 0: 32 */
    size_t block_size;    /* piece size, a multiple of 4096; 0: 1 MiB */
};

int fy_ring_new(struct fy_ring **out, const struct fy_ring_opts *opts);
/* Waits (bounded) for pieces still in flight, then frees; sets *r = NULL; safe on NULL. */
void fy_ring_destroy(struct fy_ring **r);

/* Registers [base, base+len) as fixed buffers on both rings, in pieces of at most 1 GiB. base and
 * len must be 4 KiB aligned. May be called again with further disjoint ranges while the rings are
 * idle (all are registered again together). */
int fy_ring_register_memory(struct fy_ring *r, void *base, size_t len);

/* Registers file descriptors (opened O_DIRECT) on both rings; names appear in error messages.
 * Replaces any earlier set; only while idle. Files are then referred to by index. */
int fy_ring_register_files(struct fy_ring *r, const int *fds, const char *const *names, unsigned n);

/* Queues a transfer. file_offset, len and buf must be 4096-aligned, else -EINVAL (logged). A
 * transfer with len 0 completes at once. The buffer must stay valid until the transfer is
 * reported done. */
int fy_ring_submit(struct fy_ring *r, const struct fy_io_req *req);

/* Drives both rings; waits up to timeout_ms (<0: no limit, 0: no wait) until at least one whole
 * transfer has completed; fills done[] with up to max finished transfers and returns their count
 * (0 on timeout or when nothing is queued) or -errno. */
int fy_ring_poll(struct fy_ring *r, struct fy_io_done *done, unsigned max, int timeout_ms);

/* Submits n transfers and waits for all of them; returns 0 or the first error. timeout_ms is the
 * total limit (<0: none); on expiry returns -ETIMEDOUT naming a pending file and offset; pieces
 * already in flight then still complete into their buffers and are drained by later calls (or by
 * fy_ring_destroy), so do not free those buffers before. Completions of transfers queued with
 * fy_ring_submit are kept for fy_ring_poll. */
int fy_ring_run(struct fy_ring *r, const struct fy_io_req *reqs, unsigned n, int timeout_ms);

/* Transfers queued or in flight, not yet reported (both rings). */
unsigned fy_ring_pending(const struct fy_ring *r);
size_t fy_ring_block_size(const struct fy_ring *r);
unsigned fy_ring_queue_depth(const struct fy_ring *r);

#endif
