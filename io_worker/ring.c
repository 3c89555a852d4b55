/* io_uring engine: a read ring and a write ring, each fed from its own FIFO of transfers that are
 * cut into block-size pieces with at most queue_depth pieces in flight. Short and interrupted I/O is
 * resubmitted here so callers only ever see whole transfers succeed or fail. */
#include "io_worker/ring.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <liburing.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/base/check.h"
#include "common/base/log.h"
#include "io_worker/ring_impl.h"

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static const char *file_name(const struct fy_ring *r, unsigned file)
{
    return file < r->nfiles && r->names[file] ? r->names[file] : "(unregistered file)";
}

static const char *err_hint(int err)
{
    switch (err) {
    case ENOSPC:
        return "the filesystem is full: free space or give another --ssd path";
    case EINVAL:
        return "the kernel rejected the request: the file must be opened O_DIRECT on a filesystem "
               "that supports it, with offsets, lengths and buffers 4 KiB aligned";
    case EIO:
        return "the device reported an I/O error: check dmesg and the SSD's health";
    case EBADF:
        return "the file descriptor is not open for this direction: open the data files O_RDWR";
    case EFAULT:
        return "the buffer is not mapped: it must stay valid until the transfer completes";
    default:
        return "check the device and the filesystem";
    }
}

static void xfer_link_done(struct fy_ring *r, struct ring_xfer *x)
{
    x->next = NULL;
    if (r->done_tail)
        r->done_tail->next = x;
    else
        r->done_head = x;
    r->done_tail = x;
}

static void xfer_free(struct fy_ring *r, struct ring_xfer *x)
{
    if (x->live_prev)
        x->live_prev->live_next = x->live_next;
    else
        r->live = x->live_next;
    if (x->live_next)
        x->live_next->live_prev = x->live_prev;
    r->nlive--;
    free(x);
}

/* A transfer is finished once nothing of it is queued or in flight. */
static void xfer_maybe_finish(struct fy_ring *r, struct ring_xfer *x)
{
    if (x->queued || x->inflight > 0)
        return;
    if (x->group == GROUP_ORPHAN) {
        fy_debug("abandoned %s of %s at offset %" PRIu64 " finished (result %d)",
                 x->req.dir == FY_IO_READ ? "read" : "write", file_name(r, x->req.file),
                 x->req.file_offset, x->result);
        xfer_free(r, x);
        return;
    }
    xfer_link_done(r, x);
}

static void xfer_fail(struct fy_ring *r, struct ring_xfer *x, int err)
{
    if (x->result == 0)
        x->result = err;
}

static int find_iov(const struct fy_ring *r, const char *addr)
{
    unsigned lo = 0, hi = r->niov;
    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;
        const char *b = r->iov[mid].iov_base;
        if (addr < b)
            hi = mid;
        else if (addr >= b + r->iov[mid].iov_len)
            lo = mid + 1;
        else
            return (int)mid;
    }
    return -1;
}

static int piece_prep(struct fy_ring *r, struct ring_side *s, struct ring_piece *p)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
    if (sqe == NULL) {
        /* The SQ holds queue_depth entries and so do the pieces, so this only happens when an
         * earlier submit left entries behind; push them and try once more. */
        FY_URING(io_uring_submit(&s->ring), "%s ring: submitting to make room", s->what);
        sqe = io_uring_get_sqe(&s->ring);
        FY_REQUIRE(sqe != NULL, -EBUSY, "%s ring: no free submission entry after submit",
                   s->what);
    }
    const struct fy_io_req *q = &p->x->req;
    char *addr = (char *)q->buf + p->off;
    uint64_t off = q->file_offset + p->off;
    unsigned len = (unsigned)p->len;
    if (q->dir == FY_IO_READ) {
        if (p->buf_index >= 0)
            io_uring_prep_read_fixed(sqe, (int)q->file, addr, len, off, p->buf_index);
        else
            io_uring_prep_read(sqe, (int)q->file, addr, len, off);
    } else {
        if (p->buf_index >= 0)
            io_uring_prep_write_fixed(sqe, (int)q->file, addr, len, off, p->buf_index);
        else
            io_uring_prep_write(sqe, (int)q->file, addr, len, off);
    }
    sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, p);
    return 0;
}

static void piece_release(struct fy_ring *r, struct ring_side *s, struct ring_piece *p)
{
    struct ring_xfer *x = p->x;
    p->x = NULL;
    p->next_free = s->free;
    s->free = p;
    s->inflight--;
    x->inflight--;
    xfer_maybe_finish(r, x);
}

/* Hands out pieces from the head of the issue queue while piece slots are free. */
static int side_fill(struct fy_ring *r, struct ring_side *s)
{
    while (s->qhead) {
        struct ring_xfer *x = s->qhead;
        if (x->result < 0 || x->issued == x->req.len) {
            s->qhead = x->next;
            if (s->qhead == NULL)
                s->qtail = NULL;
            x->queued = 0;
            xfer_maybe_finish(r, x);
            continue;
        }
        if (s->free == NULL)
            break;
        struct ring_piece *p = s->free;
        s->free = p->next_free;
        char *addr = (char *)x->req.buf + x->issued;
        size_t len = x->req.len - x->issued;
        if (len > r->block)
            len = r->block;
        p->buf_index = find_iov(r, addr);
        if (p->buf_index >= 0) {
            const struct iovec *v = &r->iov[p->buf_index];
            size_t room = (size_t)((char *)v->iov_base + v->iov_len - addr);
            if (len > room)
                len = room;
        }
        p->x = x;
        p->off = x->issued;
        p->len = len;
        p->retries = 0;
        x->issued += len;
        x->inflight++;
        s->inflight++;
        int rc = piece_prep(r, s, p);
        if (rc < 0) {
            xfer_fail(r, x, rc);
            piece_release(r, s, p);
            return rc;
        }
    }
    return 0;
}

static void piece_error(struct fy_ring *r, struct ring_side *s, struct ring_piece *p, int err,
                        const char *detail)
{
    const struct fy_io_req *q = &p->x->req;
    fy_error("%s of %s at offset %" PRIu64 " (%zu bytes, transfer tag %" PRIu64 ") failed: %s; %s",
             s->what, file_name(r, q->file), q->file_offset + p->off, p->len, q->tag,
             detail ? detail : strerror(err), err == ENODATA ? "the file is shorter than expected: "
             "was it truncated, or is this the wrong file?" : err_hint(err));
    xfer_fail(r, p->x, -err);
    piece_release(r, s, p);
}

static int piece_complete(struct fy_ring *r, struct ring_side *s, struct ring_piece *p, int res)
{
    const struct fy_io_req *q = &p->x->req;
    if (res == -EAGAIN || res == -EINTR) {
        if (++p->retries <= RING_MAX_RETRIES)
            return piece_prep(r, s, p);
        piece_error(r, s, p, -res, "kept failing with EAGAIN/EINTR");
        return 0;
    }
    if (res < 0) {
        piece_error(r, s, p, -res, NULL);
        return 0;
    }
    if (p->x->result < 0) {
        /* Another piece of this transfer already failed; do not pile on more I/O. */
        piece_release(r, s, p);
        return 0;
    }
    size_t done = (size_t)res;
    if (done >= p->len) {
        piece_release(r, s, p);
        return 0;
    }
    if (q->dir == FY_IO_READ && (done == 0 || done % FY_RING_ALIGN != 0)) {
        /* O_DIRECT reads come back short and unaligned only at end of file. */
        p->off += done;
        p->len -= done;
        piece_error(r, s, p, ENODATA, "reached end of file");
        return 0;
    }
    if (done == 0 || done % FY_RING_ALIGN != 0) {
        piece_error(r, s, p, EIO, "the write made no whole-block progress");
        return 0;
    }
    fy_debug("short %s of %s at offset %" PRIu64 ": %zu of %zu bytes; resubmitting the rest",
             s->what, file_name(r, q->file), q->file_offset + p->off, done, p->len);
    p->off += done;
    p->len -= done;
    p->retries = 0;
    return piece_prep(r, s, p);
}

static int side_reap(struct fy_ring *r, struct ring_side *s, unsigned *reaped)
{
    struct io_uring_cqe *cqe;
    unsigned head, n = 0;
    int rc = 0;
    io_uring_for_each_cqe(&s->ring, head, cqe)
    {
        struct ring_piece *p = io_uring_cqe_get_data(cqe);
        n++;
        if (p == NULL)
            continue; /* a cancel request's own completion */
        int prc = piece_complete(r, s, p, cqe->res);
        if (prc < 0 && rc == 0)
            rc = prc;
    }
    io_uring_cq_advance(&s->ring, n);
    *reaped += n;
    return rc;
}

static int side_submit(struct ring_side *s)
{
    if (io_uring_sq_ready(&s->ring) == 0)
        return 0;
    int rc = io_uring_submit(&s->ring);
    if (rc == -EAGAIN || rc == -EBUSY || rc == -EINTR)
        return 0; /* left in the SQ; the next pass submits them */
    FY_URING(rc, "%s ring: io_uring_submit", s->what);
    return 0;
}

/* One pass: reap, refill, submit; if nothing was reaped, wait up to wait_ms for a completion.
 * Returns 1 if something is still in flight, 0 if idle, or -errno. */
static int ring_drive(struct fy_ring *r, int wait_ms)
{
    unsigned reaped = 0;
    for (int d = 0; d < 2; d++) {
        struct ring_side *s = &r->side[d];
        FY_TRY(side_reap(r, s, &reaped));
        FY_TRY(side_fill(r, s));
        FY_TRY(side_submit(s));
    }
    int busy0 = r->side[0].inflight > 0, busy1 = r->side[1].inflight > 0;
    if (!busy0 && !busy1)
        return 0;
    if (reaped > 0 || wait_ms == 0)
        return 1;
    if (busy0 != busy1) {
        struct ring_side *s = &r->side[busy0 ? 0 : 1];
        struct io_uring_cqe *cqe;
        struct __kernel_timespec ts = {.tv_sec = wait_ms / 1000,
                                       .tv_nsec = (long long)(wait_ms % 1000) * 1000000};
        int rc = io_uring_wait_cqe_timeout(&s->ring, &cqe, wait_ms < 0 ? NULL : &ts);
        if (rc == -ETIME || rc == -EINTR || rc == -EAGAIN)
            return 1;
        FY_URING(rc, "%s ring: waiting for completions", s->what);
        return 1;
    }
    /* Both rings busy: their fds turn readable when completions are posted. */
    struct pollfd pfd[2] = {{.fd = r->side[0].ring.ring_fd, .events = POLLIN},
                            {.fd = r->side[1].ring.ring_fd, .events = POLLIN}};
    int rc = poll(pfd, 2, wait_ms);
    if (rc < 0 && errno != EINTR)
        FY_SYS(rc, "poll on the read and write rings");
    return 1;
}

static int remaining_ms(uint64_t deadline, int timeout_ms)
{
    if (timeout_ms < 0)
        return -1;
    uint64_t now = now_ms();
    if (now >= deadline)
        return 0;
    uint64_t left = deadline - now;
    return left > INT_MAX ? INT_MAX : (int)left;
}

/* Time the process did not run (stopped by SIGSTOP or Ctrl-Z, a suspended machine) is not the
 * device's: a pass of a wait loop that took longer than the wait it asked for (waited_ms, 0 for
 * none) by more than this gives the loop's deadline the whole pass back (when the stop began in
 * the pass is unknown), so a run stopped and continued does not find its transfers overdue before
 * it has even submitted them; a device that stalls makes each wait take what it asked, and times
 * out as before. */
#define STOPPED_SLACK_MS 250

static void deadline_skip_stopped(uint64_t *deadline, uint64_t *mark, int waited_ms)
{
    uint64_t now = now_ms(), took = now - *mark;
    uint64_t asked = waited_ms > 0 ? (uint64_t)waited_ms : 0;
    if (*deadline != 0 && took > asked + STOPPED_SLACK_MS)
        *deadline += took;
    *mark = now;
}

static int side_init(struct ring_side *s, unsigned qd, const char *what)
{
    s->what = what;
    /* SINGLE_ISSUER and COOP_TASKRUN are left out on purpose: the io worker may create the ring
     * on one thread and drive it on another, and we wait with poll() on the ring fds, which
     * relies on task work being run promptly. */
    FY_URING(io_uring_queue_init(qd, &s->ring, 0),
             "%s ring: io_uring_queue_init(%u entries); if this is EPERM io_uring may be disabled "
             "(sysctl kernel.io_uring_disabled) or blocked by a seccomp profile",
             what, qd);
    s->ring_ok = 1;
    s->pieces = calloc(qd, sizeof *s->pieces);
    FY_REQUIRE(s->pieces != NULL, -ENOMEM, "%s ring: out of memory for %u pieces", what, qd);
    for (unsigned i = 0; i < qd; i++) {
        s->pieces[i].next_free = s->free;
        s->free = &s->pieces[i];
    }
    return 0;
}

int fy_ring_new(struct fy_ring **out, const struct fy_ring_opts *opts)
{
    *out = NULL;
    unsigned qd = opts && opts->queue_depth ? opts->queue_depth : RING_DEFAULT_QD;
    size_t block = opts && opts->block_size ? opts->block_size : RING_DEFAULT_BLOCK;
    FY_REQUIRE(qd <= 4096, -EINVAL, "ring: queue depth %u is too large: use at most 4096", qd);
    FY_REQUIRE(block % FY_RING_ALIGN == 0 && block <= RING_MAX_IOV, -EINVAL,
               "ring: block size %zu must be a multiple of 4096 and at most 1 GiB", block);
    struct fy_ring *r = calloc(1, sizeof *r);
    FY_REQUIRE(r != NULL, -ENOMEM, "ring: out of memory");
    r->qd = qd;
    r->block = block;
    int rc = side_init(&r->side[FY_IO_READ], qd, "read");
    if (rc == 0)
        rc = side_init(&r->side[FY_IO_WRITE], qd, "write");
    if (rc < 0) {
        fy_ring_destroy(&r);
        return rc;
    }
    *out = r;
    return 0;
}

/* Tries to cancel what is in flight and waits for it so the kernel no longer writes into buffers
 * that the caller is about to free. */
static void side_drain(struct fy_ring *r, struct ring_side *s)
{
    if (!s->ring_ok || s->inflight == 0)
        return;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
    if (sqe) {
        io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
        io_uring_sqe_set_data(sqe, NULL);
    }
    uint64_t deadline = now_ms() + DESTROY_WAIT_MS;
    io_uring_submit(&s->ring);
    while (s->inflight > 0) {
        int left = remaining_ms(deadline, DESTROY_WAIT_MS);
        if (left == 0) {
            fy_warn("%s ring: %u pieces still in flight after %d ms at shutdown; closing anyway",
                    s->what, s->inflight, DESTROY_WAIT_MS);
            return;
        }
        struct io_uring_cqe *cqe;
        struct __kernel_timespec ts = {.tv_sec = left / 1000,
                                       .tv_nsec = (long long)(left % 1000) * 1000000};
        int rc = io_uring_wait_cqe_timeout(&s->ring, &cqe, &ts);
        if (rc < 0 && rc != -ETIME && rc != -EINTR) {
            fy_warn("%s ring: waiting for in-flight pieces at shutdown: %s", s->what,
                    strerror(-rc));
            return;
        }
        unsigned head, n = 0;
        io_uring_for_each_cqe(&s->ring, head, cqe)
        {
            struct ring_piece *p = io_uring_cqe_get_data(cqe);
            n++;
            if (p && p->x) {
                p->x->inflight--;
                p->x = NULL;
                s->inflight--;
            }
        }
        io_uring_cq_advance(&s->ring, n);
    }
}

void fy_ring_destroy(struct fy_ring **rp)
{
    if (rp == NULL || *rp == NULL)
        return;
    struct fy_ring *r = *rp;
    for (int d = 0; d < 2; d++) {
        struct ring_side *s = &r->side[d];
        side_drain(r, s);
        if (s->ring_ok)
            io_uring_queue_exit(&s->ring);
        free(s->pieces);
    }
    while (r->live)
        xfer_free(r, r->live);
    for (unsigned i = 0; i < r->nfiles; i++)
        free(r->names[i]);
    free(r->names);
    free(r->fds);
    free(r->iov);
    free(r);
    *rp = NULL;
}

static int req_check(const struct fy_ring *r, const struct fy_io_req *q)
{
    FY_REQUIRE(q->dir == FY_IO_READ || q->dir == FY_IO_WRITE, -EINVAL,
               "ring: transfer tag %" PRIu64 " has direction %d: use FY_IO_READ or FY_IO_WRITE",
               q->tag, (int)q->dir);
    FY_REQUIRE(q->file < r->nfiles, -EINVAL,
               "ring: transfer tag %" PRIu64 " names file %u but %u files are registered: "
               "call fy_ring_register_files first",
               q->tag, q->file, r->nfiles);
    FY_REQUIRE(q->file_offset % FY_RING_ALIGN == 0 && q->len % FY_RING_ALIGN == 0 &&
                   (uintptr_t)q->buf % FY_RING_ALIGN == 0,
               -EINVAL,
               "ring: %s of %s at offset %" PRIu64 " (%zu bytes, buffer %p) is not 4096-aligned: "
               "O_DIRECT needs aligned offsets, lengths and buffers; pad the extent to 4 KiB",
               q->dir == FY_IO_READ ? "read" : "write", file_name(r, q->file), q->file_offset,
               q->len, q->buf);
    FY_REQUIRE(q->len == 0 || q->buf != NULL, -EINVAL,
               "ring: %s of %s at offset %" PRIu64 " has no buffer",
               q->dir == FY_IO_READ ? "read" : "write", file_name(r, q->file), q->file_offset);
    return 0;
}

static int ring_enqueue(struct fy_ring *r, const struct fy_io_req *q, unsigned group)
{
    struct ring_xfer *x = calloc(1, sizeof *x);
    FY_REQUIRE(x != NULL, -ENOMEM, "ring: out of memory queueing a transfer");
    x->req = *q;
    x->group = group;
    x->live_next = r->live;
    if (r->live)
        r->live->live_prev = x;
    r->live = x;
    r->nlive++;
    if (q->len == 0) {
        xfer_link_done(r, x);
        return 0;
    }
    struct ring_side *s = &r->side[q->dir];
    x->queued = 1;
    if (s->qtail)
        s->qtail->next = x;
    else
        s->qhead = x;
    s->qtail = x;
    return 0;
}

int fy_ring_submit(struct fy_ring *r, const struct fy_io_req *req)
{
    FY_TRY(req_check(r, req));
    FY_TRY(ring_enqueue(r, req, 0));
    /* Start the I/O now rather than at the next poll, so the device is never idle meanwhile. */
    struct ring_side *s = &r->side[req->dir];
    if (s->free) {
        FY_TRY(side_fill(r, s));
        FY_TRY(side_submit(s));
    }
    return 0;
}

int fy_ring_poll(struct fy_ring *r, struct fy_io_done *done, unsigned max, int timeout_ms)
{
    uint64_t deadline = timeout_ms > 0 ? now_ms() + (uint64_t)timeout_ms : 0, mark = now_ms();
    int waited = 0;
    for (;;) {
        int busy = ring_drive(r, 0);
        deadline_skip_stopped(&deadline, &mark, waited);
        FY_TRY(busy);
        unsigned n = 0;
        struct ring_xfer **link = &r->done_head, *prev = NULL;
        while (*link && n < max) {
            struct ring_xfer *x = *link;
            if (x->group != 0) {
                prev = x;
                link = &x->next;
                continue;
            }
            *link = x->next;
            if (r->done_tail == x)
                r->done_tail = prev;
            done[n].tag = x->req.tag;
            done[n].result = x->result;
            n++;
            xfer_free(r, x);
        }
        if (n > 0 || max == 0 || !busy)
            return (int)n;
        int left = remaining_ms(deadline, timeout_ms);
        if (left == 0)
            return 0;
        FY_TRY(ring_drive(r, left));
        waited = left;
    }
}

/* Abandons the unfinished transfers of a timed-out run; names one of them in the error. */
static void run_abandon(struct fy_ring *r, unsigned group, int timeout_ms)
{
    const struct ring_xfer *first = NULL;
    unsigned left = 0;
    for (struct ring_xfer *x = r->live; x; x = x->live_next) {
        if (x->group != group)
            continue;
        left++;
        if (first == NULL || x->req.file_offset < first->req.file_offset)
            first = x;
    }
    if (first)
        fy_error("ring: %u transfers not finished after %d ms; one is the %s of %s at offset %" PRIu64
                 " (%zu bytes): the device is too slow or stalled; check it, or raise the timeout",
                 left, timeout_ms, first->req.dir == FY_IO_READ ? "read" : "write",
                 file_name(r, first->req.file), first->req.file_offset, first->req.len);
    struct ring_xfer *next;
    for (struct ring_xfer *x = r->live; x; x = next) {
        next = x->live_next;
        if (x->group != group)
            continue;
        x->group = GROUP_ORPHAN;
        xfer_fail(r, x, -ETIMEDOUT);
    }
    /* Take abandoned transfers off the issue queues so none of their pieces start. */
    for (int d = 0; d < 2; d++) {
        struct ring_side *s = &r->side[d];
        struct ring_xfer **link = &s->qhead, *prev = NULL;
        while (*link) {
            struct ring_xfer *x = *link;
            if (x->group == GROUP_ORPHAN) {
                *link = x->next;
                if (s->qtail == x)
                    s->qtail = prev;
                x->queued = 0;
                xfer_maybe_finish(r, x);
            } else {
                prev = x;
                link = &x->next;
            }
        }
    }
    /* Orphans that already finished sit in the done queue. */
    struct ring_xfer **link = &r->done_head, *prev = NULL;
    while (*link) {
        struct ring_xfer *x = *link;
        if (x->group == GROUP_ORPHAN) {
            *link = x->next;
            if (r->done_tail == x)
                r->done_tail = prev;
            xfer_free(r, x);
        } else {
            prev = x;
            link = &x->next;
        }
    }
}

int fy_ring_run(struct fy_ring *r, const struct fy_io_req *reqs, unsigned n, int timeout_ms)
{
    if (n == 0)
        return 0;
    for (unsigned i = 0; i < n; i++)
        FY_TRY(req_check(r, &reqs[i]));
    uint64_t deadline = timeout_ms > 0 ? now_ms() + (uint64_t)timeout_ms : 0;
    if (++r->next_group == GROUP_ORPHAN)
        r->next_group = 1;
    unsigned group = r->next_group;
    for (unsigned i = 0; i < n; i++) {
        int rc = ring_enqueue(r, &reqs[i], group);
        if (rc < 0) {
            run_abandon(r, group, timeout_ms);
            return rc;
        }
    }
    unsigned left = n;
    int first_err = 0;
    uint64_t mark = now_ms();
    for (;;) {
        int wait = remaining_ms(deadline, timeout_ms);
        int busy = ring_drive(r, wait);
        deadline_skip_stopped(&deadline, &mark, wait);
        if (busy < 0) {
            run_abandon(r, group, timeout_ms);
            return busy;
        }
        struct ring_xfer **link = &r->done_head, *prev = NULL;
        while (*link) {
            struct ring_xfer *x = *link;
            if (x->group != group) {
                prev = x;
                link = &x->next;
                continue;
            }
            *link = x->next;
            if (r->done_tail == x)
                r->done_tail = prev;
            if (x->result < 0 && first_err == 0)
                first_err = x->result;
            left--;
            xfer_free(r, x);
        }
        if (left == 0)
            return first_err;
        if (remaining_ms(deadline, timeout_ms) == 0) {
            run_abandon(r, group, timeout_ms);
            return -ETIMEDOUT;
        }
    }
}

unsigned fy_ring_pending(const struct fy_ring *r)
{
    unsigned n = 0;
    for (const struct ring_xfer *x = r->live; x; x = x->live_next)
        n += x->group != GROUP_ORPHAN;
    return n;
}

size_t fy_ring_block_size(const struct fy_ring *r) { return r->block; }
unsigned fy_ring_queue_depth(const struct fy_ring *r) { return r->qd; }
