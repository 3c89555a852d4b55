/* The io_uring engine's internals (io_worker/ring.h is its interface), shared by its two sources:
 * ring.c (transfers cut into pieces, submitted, reaped, finished) and ring_reg.c (the memory and
 * files registered with both rings). */
#ifndef FY_RING_IMPL_H
#define FY_RING_IMPL_H

#include <limits.h>
#include <liburing.h>
#include <sys/uio.h>

#include "io_worker/ioreq.h"

#define RING_DEFAULT_QD 32u
#define RING_DEFAULT_BLOCK ((size_t)1 << 20)
/* The kernel refuses a single registered iovec above 1 GiB. */
#define RING_MAX_IOV ((size_t)1 << 30)
/* A device that keeps answering EAGAIN this often is not going to recover by retrying. */
#define RING_MAX_RETRIES 10000u
/* Group of transfers abandoned by a timed-out fy_ring_run: freed silently when they finish. */
#define GROUP_ORPHAN UINT_MAX
/* How long fy_ring_destroy waits for pieces still in flight before it gives up on them. */
#define DESTROY_WAIT_MS 10000

struct ring_xfer {
    struct fy_io_req req;
    size_t issued;     /* bytes handed out as pieces */
    unsigned inflight; /* pieces in flight */
    int result;
    unsigned group;    /* 0: reported by fy_ring_poll; else owned by one fy_ring_run */
    int queued;        /* still in its side's issue queue */
    struct ring_xfer *next; /* issue queue or done queue */
    struct ring_xfer *live_prev,
        *live_next; /* every allocated transfer, so destroy can free them */
};

struct ring_piece {
    struct ring_xfer *x;
    uint64_t off; /* from the start of the transfer */
    size_t len;
    int buf_index; /* registered buffer, or -1 for a plain read/write */
    unsigned retries;
    struct ring_piece *next_free;
};

struct ring_side {
    struct io_uring ring;
    int ring_ok;
    const char *what; /* "read" or "write" */
    struct ring_piece *pieces;
    struct ring_piece *free;
    unsigned inflight;
    struct ring_xfer *qhead, *qtail;
};

struct fy_ring {
    unsigned qd;
    size_t block;
    struct ring_side side[2];
    struct iovec *iov; /* registered buffers, sorted by address */
    unsigned niov;
    int *fds;
    char **names;
    unsigned nfiles;
    struct ring_xfer *done_head, *done_tail;
    struct ring_xfer *live;
    unsigned nlive;
    unsigned next_group;
};

/* Nothing queued or in flight on either ring: what registering needs. */
static inline int ring_idle(const struct fy_ring *r)
{
    return r->side[0].inflight == 0 && r->side[1].inflight == 0 && r->side[0].qhead == NULL &&
           r->side[1].qhead == NULL;
}

#endif
