/* Digested transfers over the store's striping (fy_store_map) and the ring: each chunk's pieces
 * are queued under one tag per chunk, and reaped as they finish, so that digesting overlaps the
 * disk. */
#include "io_worker/xfer.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/check.h"
#include "common/base/digest.h"
#include "common/base/log.h"

/* The pieces of chunk k of a digested transfer, queued on the ring with tag id | k. */
static int digest_chunk_submit(struct fy_store *s, struct fy_ring *r, uint32_t tensor,
                               uint64_t offset, char *buf, size_t len, enum fy_io_dir dir,
                               uint64_t id, unsigned k, struct fy_io_req *reqs, unsigned max,
                               unsigned *pieces)
{
    uint64_t at = (uint64_t)k * FY_XFER_DIGEST_CHUNK;
    size_t n = len - at < FY_XFER_DIGEST_CHUNK ? len - at : FY_XFER_DIGEST_CHUNK;
    int got = fy_store_map(s, tensor, offset + at, n, buf + at, dir, id | k, reqs, max);
    FY_TRY(got);
    for (int i = 0; i < got; i++)
        FY_TRY(fy_ring_submit(r, &reqs[i]));
    pieces[k] = (unsigned)got;
    return 0;
}

/* Collects finished pieces of transfer `id` (waiting up to wait_ms for one); others' are left
 * over from a transfer that timed out, and dropped. The first error goes to *err. */
static int digest_reap(struct fy_ring *r, uint64_t id, unsigned *pieces, unsigned chunks,
                       int wait_ms, int *err)
{
    struct fy_io_done done[64];
    int n = fy_ring_poll(r, done, 64, wait_ms);
    FY_TRY(n);
    for (int i = 0; i < n; i++) {
        unsigned k = (unsigned)(done[i].tag & 0xffffffffu);
        if ((done[i].tag & ~(uint64_t)0xffffffffu) != id || k >= chunks || pieces[k] == 0)
            continue;
        pieces[k]--;
        if (done[i].result < 0 && *err == 0)
            *err = done[i].result;
    }
    return n;
}

/* Waits until chunk k's pieces are all in, within timeout_ms of t0 (<= 0: no limit). */
static int digest_wait(struct fy_ring *r, uint64_t id, unsigned *pieces, unsigned chunks,
                       unsigned k, const struct timespec *t0, int timeout_ms, int *err)
{
    while (pieces[k] > 0) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        long spent = (t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
        if (timeout_ms > 0 && spent >= timeout_ms)
            return -ETIMEDOUT;
        int wait_ms = timeout_ms > 0 ? timeout_ms - (int)spent : -1;
        FY_TRY(digest_reap(r, id, pieces, chunks, wait_ms, err));
    }
    return 0;
}

int fy_xfer_digest(struct fy_store *s, struct fy_ring *r, uint32_t tensor, uint64_t offset,
                   void *buf, size_t len, enum fy_io_dir dir, int timeout_ms, uint64_t *digest)
{
    static uint64_t serial; /* in the tags: pieces of an abandoned transfer are told apart */
    uint64_t id = ++serial << 32;
    unsigned chunks = (unsigned)((len + FY_XFER_DIGEST_CHUNK - 1) / FY_XFER_DIGEST_CHUNK);
    unsigned max = (unsigned)(FY_XFER_DIGEST_CHUNK / fy_store_stripe_unit(s)) + 2;
    unsigned *pieces = calloc(chunks + 1, sizeof *pieces);
    struct fy_io_req *reqs = malloc(max * sizeof *reqs);
    struct fy_digest_state *d = fy_digest_begin();
    int rc = pieces && reqs && d ? 0 : -ENOMEM, err = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char *b = buf;
    if (rc == 0 && dir == FY_IO_READ) /* all queued; the ring keeps its queue depth busy */
        for (unsigned k = 0; rc == 0 && k < chunks; k++)
            rc = digest_chunk_submit(s, r, tensor, offset, b, len, dir, id, k, reqs, max, pieces);
    for (unsigned k = 0; rc == 0 && k < chunks; k++) {
        uint64_t at = (uint64_t)k * FY_XFER_DIGEST_CHUNK;
        size_t n = len - at < FY_XFER_DIGEST_CHUNK ? len - at : FY_XFER_DIGEST_CHUNK;
        if (dir == FY_IO_WRITE) { /* digested, then queued; the ring kept moving between */
            fy_digest_update(d, b + at, n);
            rc = digest_chunk_submit(s, r, tensor, offset, b, len, dir, id, k, reqs, max, pieces);
            if (rc == 0)
                rc = digest_reap(r, id, pieces, chunks, 0, &err);
            rc = rc < 0 ? rc : 0;
        } else { /* in order, while the later chunks are read */
            rc = digest_wait(r, id, pieces, chunks, k, &t0, timeout_ms, &err);
            if (rc == 0 && err == 0)
                fy_digest_update(d, b + at, n);
        }
    }
    for (unsigned k = 0; rc == 0 && k < chunks; k++) /* the writes still on the disk */
        rc = digest_wait(r, id, pieces, chunks, k, &t0, timeout_ms, &err);
    if (rc == -ETIMEDOUT)
        fy_error("store: %s of tensor %u (%zu bytes) not finished after %d ms: the device is too "
                 "slow or stalled; check it, or raise the timeout",
                 dir == FY_IO_READ ? "read" : "write", tensor, len, timeout_ms);
    else if (rc == 0 && err != 0)
        fy_error("store: %s of tensor %u at offset %" PRIu64 " (%zu bytes) failed: %s",
                 dir == FY_IO_READ ? "read" : "write", tensor, offset, len, strerror(-err));
    rc = rc ? rc : err;
    if (d != NULL) {
        uint64_t v = fy_digest_end(d);
        if (rc == 0)
            *digest = v;
    }
    free(pieces);
    free(reqs);
    return rc;
}
