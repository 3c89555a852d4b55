/* fuyou-io-worker: owns the SSD store. Reads extents into the shared pool and writes pool regions
 * back through io_uring (separate read and write rings, O_DIRECT, the pool as fixed buffers), and
 * digests what it moves where asked (a second, control part): a write's reply carries the digest
 * of the bytes written, a read checks the bytes read against the digest the part names, or with
 * FY_IO_DIGEST_REPORT reports it. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"
#include "common/base/knobs.h"
#include "common/ipc/worker.h"
#include "io_worker/ring.h"
#include "io_worker/store.h"
#include "io_worker/xfer.h"

#define MAX_SSD_PATHS 16

struct io_state {
    struct fy_store *store;
    struct fy_ring *ring;
    int timeout_ms;
    /* test hook FUYOU_TEST_IO_ENOSPC_AFTER=N: every write after the first N fails as on a full
     * disk (-1: off), so the tests reach the launcher's handling of a full SSD */
    long long enospc_after, writes;
};

static int split_paths(char *list, const char **paths, unsigned max, unsigned *n)
{
    *n = 0;
    for (char *save = NULL, *p = strtok_r(list, ",", &save); p != NULL;
         p = strtok_r(NULL, ",", &save)) {
        FY_REQUIRE(*n < max, -E2BIG, "more than %u SSD paths given", max);
        paths[(*n)++] = p;
    }
    FY_REQUIRE(*n > 0, -EINVAL, "no SSD path given: pass --ssd DIR[,DIR...]");
    return 0;
}

static int io_open(struct fy_worker *w, struct io_state *s)
{
    const char *ssd = fy_config_get(w->cfg, "ssd");
    FY_REQUIRE(ssd != NULL, -EINVAL, "run config has no 'ssd' entry");
    char list[FY_CONFIG_VALUE_MAX];
    snprintf(list, sizeof list, "%s", ssd);
    const char *paths[MAX_SSD_PATHS];
    unsigned npaths;
    FY_TRY(split_paths(list, paths, MAX_SSD_PATHS, &npaths));
    uint64_t create, overwrite, read_only, stripe, qd, block, timeout;
    FY_TRY(fy_config_get_u64(w->cfg, "store_create", 0, 0, &create));
    FY_TRY(fy_config_get_u64(w->cfg, "store_read_only", 0, 0, &read_only));
    FY_TRY(fy_config_get_u64(w->cfg, "store_overwrite", 0, 0, &overwrite));
    FY_TRY(fy_config_get_u64(w->cfg, "stripe_unit", 0, 1 << 20, &stripe));
    FY_TRY(fy_config_get_u64(w->cfg, "queue_depth", 0, 32, &qd));
    FY_TRY(fy_config_get_u64(w->cfg, "block_size", 0, 1 << 20, &block));
    FY_TRY(fy_config_get_u64(w->cfg, "io_timeout_ms", 0, 120000, &timeout));
    s->timeout_ms = (int)timeout;
    s->enospc_after = fy_knob_test_io_enospc_after();
    if (s->enospc_after >= 0)
        fy_info("test hook: every write after the first %lld fails as on a full disk "
                "(FUYOU_TEST_IO_ENOSPC_AFTER)", s->enospc_after);
    struct fy_store_opts so = {.paths = paths, .npaths = npaths, .stripe_unit = stripe,
                               .create = (int)create, .overwrite = (int)overwrite,
                               .readonly = (int)read_only};
    FY_TRY(fy_store_open(&s->store, &so));
    struct fy_ring_opts ro = {.queue_depth = (unsigned)qd, .block_size = block};
    FY_TRY(fy_ring_new(&s->ring, &ro));
    FY_TRY(fy_ring_register_memory(s->ring, fy_pool_base(w->pool), fy_pool_size(w->pool)));
    FY_TRY(fy_ring_register_files(s->ring, fy_store_fds(s->store), fy_store_file_names(s->store),
                                  fy_store_file_count(s->store)));
    fy_info("store on %u path(s) (%s)%s, stripe unit %llu, queue depth %llu, block %llu", npaths,
            ssd, read_only ? ", read-only" : "", (unsigned long long)stripe,
            (unsigned long long)qd, (unsigned long long)block);
    return 0;
}

static void io_fini(struct fy_worker *w, void *state)
{
    struct io_state *s = state;
    if (s == NULL)
        return;
    fy_ring_destroy(&s->ring);
    fy_store_destroy(&s->store);
    free(s);
}

static int io_init(struct fy_worker *w, void **state)
{
    struct io_state *s = calloc(1, sizeof *s);
    if (s == NULL)
        return -ENOMEM;
    int rc = io_open(w, s);
    if (rc < 0) {
        io_fini(w, s);
        return rc;
    }
    *state = s;
    return 0;
}

/* A read with the digest of what it read checked against `want`. */
static int read_checked(struct fy_worker *w, struct io_state *s, const struct fy_desc *d,
                        uint64_t want, struct fy_desc *reply)
{
    FY_TRY(fy_xfer_digest(s->store, s->ring, d->tensor, d->arg, fy_worker_region(w, d), d->bytes,
                          FY_IO_READ, s->timeout_ms, &reply->arg));
    FY_REQUIRE(reply->arg == want, -EBADMSG,
               "io worker: tensor %u, bytes %llu..%llu read back from the store do not match the "
               "digest they were written with (%016llx, read %016llx): torn or corrupted on the "
               "SSD",
               d->tensor, (unsigned long long)d->arg, (unsigned long long)(d->arg + d->bytes),
               (unsigned long long)want, (unsigned long long)reply->arg);
    return 0;
}

static int io_handle(struct fy_worker *w, void *state, const struct fy_desc *req, unsigned n,
                     struct fy_desc *reply)
{
    struct io_state *s = state;
    const struct fy_desc *d = &req[0];
    int digest = n == 2 && (d->op == FY_OP_IO_READ || d->op == FY_OP_IO_WRITE) &&
                 req[1].kind == FY_KIND_CONTROL;
    FY_REQUIRE(n == 1 || digest, -EPROTO,
               "io worker: %s takes one descriptor (reads and writes: and a control part for "
               "their digest), got %u", fy_op_name(d->op), n);
    if (d->op == FY_OP_IO_WRITE && s->enospc_after >= 0 && ++s->writes > s->enospc_after) {
        fy_error("io worker: write of tensor %u failed: %s (test hook "
                 "FUYOU_TEST_IO_ENOSPC_AFTER=%lld)", d->tensor, strerror(ENOSPC),
                 s->enospc_after);
        return -ENOSPC;
    }
    if (digest && d->op == FY_OP_IO_READ) {
        FY_REQUIRE(d->kind != FY_KIND_CONTROL, -EPROTO, "io-read needs a pool region");
        if (req[1].step == FY_IO_DIGEST_REPORT) /* the digest read goes to the reply */
            return fy_xfer_digest(s->store, s->ring, d->tensor, d->arg, fy_worker_region(w, d),
                                  d->bytes, FY_IO_READ, s->timeout_ms, &reply->arg);
        return read_checked(w, s, d, req[1].arg, reply);
    }
    if (digest) {
        FY_REQUIRE(d->kind != FY_KIND_CONTROL, -EPROTO, "io-write needs a pool region");
        return fy_xfer_digest(s->store, s->ring, d->tensor, d->arg, fy_worker_region(w, d),
                              d->bytes, FY_IO_WRITE, s->timeout_ms, &reply->arg);
    }
    switch (d->op) {
    case FY_OP_IO_ALLOC: { /* idempotent: an extent of that tensor and size is already there */
        struct fy_extent e;
        if (fy_store_find(s->store, d->tensor, &e) == 0) {
            FY_REQUIRE(e.bytes == d->arg, -EEXIST,
                       "io worker: tensor %u has an extent of %llu bytes, not the %llu asked for",
                       d->tensor, (unsigned long long)e.bytes, (unsigned long long)d->arg);
            return 0;
        }
        return fy_store_add_extent(s->store, d->tensor, d->arg);
    }
    case FY_OP_IO_READ:
        FY_REQUIRE(d->kind != FY_KIND_CONTROL, -EPROTO, "io-read needs a pool region");
        return fy_store_read(s->store, s->ring, d->tensor, d->arg, fy_worker_region(w, d),
                             d->bytes, s->timeout_ms);
    case FY_OP_IO_WRITE:
        FY_REQUIRE(d->kind != FY_KIND_CONTROL, -EPROTO, "io-write needs a pool region");
        return fy_store_write(s->store, s->ring, d->tensor, d->arg, fy_worker_region(w, d),
                              d->bytes, s->timeout_ms);
    case FY_OP_IO_SYNC:
        return fy_store_sync(s->store);
    default:
        fy_error("io worker: op %s is not an I/O operation", fy_op_name(d->op));
        return -EPROTO;
    }
}

int main(int argc, char **argv)
{
    static const struct fy_worker_ops ops = {.init = io_init, .handle = io_handle, .fini = io_fini};
    return fy_worker_main(argc, argv, "io", &ops);
}
