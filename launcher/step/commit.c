/* The store's commit records and the two copies of the units' state, over the io worker. */
#include "launcher/step/commit.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"
#include "common/ipc/desc.h"
#include "common/base/dtype.h"
#include "common/model/optstate.h"
#include "io_worker/store.h"

int fy_io_call(const struct fy_exec *x, int op, uint32_t tensor, uint64_t pool_offset,
               uint64_t bytes, uint64_t arg, int timeout_ms)
{
    struct fy_desc d = fy_desc_region(op, bytes ? FY_KIND_RAW : FY_KIND_CONTROL, FY_DTYPE_NONE,
                                      pool_offset, bytes, -1);
    d.tensor = tensor;
    d.arg = arg;
    int64_t ticket = x->submit(x->ctx, "io", &d, 1);
    return ticket < 0 ? (int)ticket : x->wait(x->ctx, ticket, NULL, timeout_ms);
}

/* An io read or write of `bytes` at pool_offset, at byte `at` of the extent, with its digest part
 * (the digest to check a read against, or with `report` none: the reply's digest of what was read
 * or written), submitted; the ticket or -errno. */
static int64_t io_submit_digest(const struct fy_exec *x, int op, uint32_t tensor, uint64_t at,
                                uint64_t pool_offset, uint64_t bytes, uint64_t digest, int report)
{
    struct fy_desc d[2];
    d[0] = fy_desc_region(op, FY_KIND_RAW, FY_DTYPE_NONE, pool_offset, bytes, -1);
    d[0].tensor = tensor;
    d[0].arg = at;
    d[1] = fy_desc_region(op, FY_KIND_CONTROL, FY_DTYPE_NONE, 0, 0, -1);
    d[1].arg = digest;
    d[1].step = report && op == FY_OP_IO_READ ? FY_IO_DIGEST_REPORT : 0;
    return x->submit(x->ctx, "io", d, 2);
}

/* The same, waited for: a read's or write's digest into *digest where it reports one. */
static int io_call_piece(const struct fy_exec *x, int op, uint32_t tensor, uint64_t at,
                         uint64_t pool_offset, uint64_t bytes, uint64_t *digest, int report,
                         int timeout_ms)
{
    struct fy_desc reply;
    int64_t ticket = io_submit_digest(x, op, tensor, at, pool_offset, bytes, *digest, report);
    int rc = ticket < 0 ? (int)ticket : x->wait(x->ctx, ticket, &reply, timeout_ms);
    if (rc == 0 && (op == FY_OP_IO_WRITE || report))
        *digest = reply.arg;
    return rc;
}

int fy_io_call_digest(const struct fy_exec *x, int op, uint32_t tensor, uint64_t pool_offset,
                      uint64_t bytes, uint64_t *digest, int timeout_ms)
{
    return io_call_piece(x, op, tensor, 0, pool_offset, bytes, digest, 0, timeout_ms);
}

int fy_commit_unit_io(const struct fy_exec *x, int op, const struct fy_model_config *c, unsigned u,
                      uint32_t tensor, uint64_t pool_offset, uint64_t unit_digest, uint64_t *pieces,
                      int timeout_ms)
{
    unsigned n = fy_optstate_piece_count(c, u);
    if (n == 1) { /* the whole extent, checked against the record's digest by the io worker */
        uint64_t d = unit_digest;
        FY_TRY(io_call_piece(x, op, tensor, 0, pool_offset, fy_optstate_bytes(c, u), &d, 0,
                             timeout_ms));
        if (pieces != NULL)
            pieces[0] = op == FY_OP_IO_WRITE ? d : unit_digest;
        return 0;
    }
    uint64_t *got = calloc(n, sizeof *got);
    FY_REQUIRE(got != NULL, -ENOMEM, "no memory for %u digests", n);
    int rc = 0;
    for (unsigned k = 0; k < n; k++) {
        struct fy_optstate_piece p;
        fy_optstate_piece(c, u, k, &p, NULL);
        FY_TRY_OUT(rc, io_call_piece(x, op, tensor, p.offset, pool_offset + p.offset,
                                     p.layout.bytes, &got[k], 1, timeout_ms));
    }
    if (op == FY_OP_IO_READ && fy_optstate_unit_digest(got, n) != unit_digest) {
        fy_error("unit %u's state, read back from the store piece by piece, does not match the "
                 "digest it was written with (%016llx, read %016llx): torn or corrupted on the SSD",
                 u, (unsigned long long)unit_digest,
                 (unsigned long long)fy_optstate_unit_digest(got, n));
        rc = -EBADMSG;
        goto out;
    }
    if (pieces != NULL)
        memcpy(pieces, got, n * sizeof *got);
out:
    free(got);
    return rc;
}

/* Record i into the pool and what it holds: 0 (decoded into *m), 1 (never written), -ENOENT (no
 * such extent) or -EBADMSG (damaged); `why` says which. */
static int read_record(const struct fy_exec *x, struct fy_pool *pool, uint64_t record_off,
                       uint32_t tensor, uint64_t bytes, const char *where, struct fy_storemeta *m,
                       const char **why, int timeout_ms)
{
    uint8_t *rec = fy_pool_at(pool, record_off, bytes);
    memset(rec, 0, bytes);
    int rc = fy_io_call(x, FY_OP_IO_READ, tensor, record_off, bytes, 0, timeout_ms);
    if (rc == -ENOENT || rc == -ERANGE) {
        *why = "absent";
        return -ENOENT;
    }
    FY_TRY(rc);
    rc = fy_storemeta_check(rec, bytes);
    *why = rc == 1 ? "never written" : rc < 0 ? "damaged: torn write or corruption" : "intact";
    if (rc != 0)
        return rc;
    return fy_storemeta_decode(rec, bytes, where, m);
}

int fy_commit_read(const struct fy_exec *x, struct fy_pool *pool, uint64_t record_off,
                   const char *where, uint64_t below_seq, struct fy_storemeta *m, int timeout_ms)
{
    struct fy_storemeta *rec[2] = {malloc(sizeof *m), malloc(sizeof *m)};
    const char *why[2] = {"", ""};
    int got[2] = {-ENOENT, -ENOENT}, rc = rec[0] && rec[1] ? 0 : -ENOMEM;
    for (int i = 0; rc == 0 && i < 2; i++) {
        got[i] = read_record(x, pool, record_off, FY_TENSOR_COMMIT(i), FY_COMMIT_RECORD_BYTES,
                             where, rec[i], &why[i], timeout_ms);
        if (got[i] == -ENOMEM || got[i] == -ETIMEDOUT || got[i] == -ECHILD || got[i] == -EINTR)
            rc = got[i];
    }
    int best = -1;
    for (int i = 0; rc == 0 && i < 2; i++)
        if (got[i] == 0 && rec[i]->seq < below_seq && (best < 0 || rec[i]->seq > rec[best]->seq))
            best = i;
    if (rc == 0 && best >= 0) {
        int other = 1 - best;
        if (got[other] == -EBADMSG)
            fy_warn("%s: commit record %d is %s; using record %d (step %llu)", where, other,
                    why[other], best, (unsigned long long)rec[best]->step);
        memcpy(m, rec[best], sizeof *m);
    } else if (rc == 0 && got[0] == -ENOENT && got[1] == -ENOENT) {
        /* a store from before commit records has its version 1 metadata block there */
        int old =
            fy_io_call(x, FY_OP_IO_READ, FY_TENSOR_META, record_off, FY_CKPT_BLOCK, 0, timeout_ms);
        if (old == 0)
            fy_error("%s: a store made by a version of Fuyou from before commit records (it has "
                     "a version 1 metadata block), which this version no longer reads: train or "
                     "export it with the Fuyou build that made it, or initialise the run again "
                     "(fuyou-launch init --overwrite, or --from-hf DIR from an export)",
                     where);
        else
            fy_error("%s: no commit record: is it a store made by fuyou-launch init?", where);
        rc = -ENOENT;
    } else if (rc == 0) {
        fy_error("%s: no intact committed step%s (commit record 0: %s, record 1: %s): the store "
                 "cannot be used; initialise a new one (fuyou-launch init --overwrite) or train "
                 "from an exported checkpoint",
                 where, below_seq != UINT64_MAX ? " before the damaged one" : "", why[0], why[1]);
        rc = -ENOENT;
    }
    free(rec[0]);
    free(rec[1]);
    return rc;
}

/* Read from the store itself rather than from a copy of the step the launcher could keep in the
 * run directory at each commit: the store is the one record of what is committed (a copy written
 * after each commit lags it across a crash, and knows nothing of a store restored or moved), and
 * two records are two small reads. */
int fy_commit_peek(const char *ssd, struct fy_storemeta *m)
{
    char list[4096];
    FY_REQUIRE(strlen(ssd) < sizeof list, -ENAMETOOLONG, "the store's paths are too long: %.200s",
               ssd);
    snprintf(list, sizeof list, "%s", ssd);
    const char *paths[256];
    unsigned n = 0;
    for (char *save = NULL, *p = strtok_r(list, ",", &save); p != NULL && n < 256;
         p = strtok_r(NULL, ",", &save))
        paths[n++] = p;
    struct fy_store_opts so = {.paths = paths, .npaths = n, .readonly = 1};
    struct fy_store *store = NULL;
    FY_TRY(fy_store_open(&store, &so));
    uint8_t *rec = NULL;
    struct fy_storemeta *one = malloc(sizeof *one);
    int rc = one != NULL && posix_memalign((void **)&rec, 4096, FY_COMMIT_RECORD_BYTES) == 0
                 ? -ENOENT
                 : -ENOMEM;
    int found = 0;
    for (int i = 0; rc != -ENOMEM && i < 2; i++) {
        if (fy_store_find(store, FY_TENSOR_COMMIT(i), NULL) != 0)
            continue; /* a store from before commit records, or not made by init */
        int got = fy_store_pread(store, FY_TENSOR_COMMIT(i), 0, rec, FY_COMMIT_RECORD_BYTES);
        if (got == 0 && fy_storemeta_check(rec, FY_COMMIT_RECORD_BYTES) == 0 &&
            fy_storemeta_decode(rec, FY_COMMIT_RECORD_BYTES, ssd, one) == 0 &&
            (!found || one->seq > m->seq)) {
            memcpy(m, one, sizeof *m);
            found = 1;
        }
    }
    if (rc == -ENOENT && found)
        rc = 0;
    else if (rc == -ENOENT)
        fy_error("%s: no intact commit record", ssd);
    free(rec);
    free(one);
    fy_store_destroy(&store);
    return rc;
}

int fy_commit_write(const struct fy_exec *x, struct fy_pool *pool, uint64_t record_off,
                    const struct fy_storemeta *next, int timeout_ms)
{
    FY_TRY(fy_io_call(x, FY_OP_IO_SYNC, 0, 0, 0, 0, timeout_ms));
    fy_storemeta_encode(next, fy_pool_at(pool, record_off, FY_COMMIT_RECORD_BYTES));
    FY_TRY(fy_io_call(x, FY_OP_IO_WRITE, FY_TENSOR_COMMIT(next->seq % 2), record_off,
                      FY_COMMIT_RECORD_BYTES, 0, timeout_ms));
    return fy_io_call(x, FY_OP_IO_SYNC, 0, 0, 0, 0, timeout_ms);
}

/* The extents a store needs besides each unit's first copy: both records' and, with two copies,
 * every unit's second copy. */
static int commit_extents(const struct fy_exec *x, const struct fy_model_config *c, unsigned copies,
                          int timeout_ms)
{
    FY_REQUIRE(copies == 1 || copies == 2, -EINVAL,
               "the store keeps 1 or 2 copies of the state, not %u", copies);
    FY_REQUIRE(fy_model_unit_count(c) <= FY_COMMIT_MAX_UNITS, -EINVAL,
               "model: %u units, commit records hold %u", fy_model_unit_count(c),
               FY_COMMIT_MAX_UNITS);
    for (int i = 0; i < 2; i++)
        FY_TRY(fy_io_call(x, FY_OP_IO_ALLOC, FY_TENSOR_COMMIT(i), 0, 0, FY_COMMIT_RECORD_BYTES,
                          timeout_ms));
    for (unsigned u = 0; copies == 2 && u < fy_model_unit_count(c); u++)
        FY_TRY(fy_io_call(x, FY_OP_IO_ALLOC, FY_TENSOR_UNIT_STATE_COPY(u, 1), 0, 0,
                          fy_optstate_bytes(c, u), timeout_ms));
    return 0;
}

/* A piece's state write in flight from one of fy_commit_create's buffers (ticket 0: none), its
 * digest for *into. */
struct unit_write {
    int64_t ticket;
    uint64_t buf;
    uint64_t *into;
};

/* Waits for a piece's state write, its digest into its place (nothing when none is in flight). */
static int unit_write_wait(const struct fy_exec *x, struct unit_write *w, int timeout_ms)
{
    if (w->ticket == 0)
        return 0;
    struct fy_desc reply;
    int rc = x->wait(x->ctx, w->ticket, &reply, timeout_ms);
    w->ticket = 0;
    if (rc == 0)
        *w->into = reply.arg;
    return rc;
}

/* The master weights of the unit being made and its pieces' digests, for a unit in pieces. */
struct unit_make {
    float *master;
    uint64_t *digest;
};

int fy_commit_create(const struct fy_exec *x, struct fy_pool *pool, uint64_t record_off,
                     const uint64_t buf_off[2], const struct fy_model_config *c, uint64_t seed,
                     unsigned copies, int (*fill)(void *ctx, unsigned unit, float *master),
                     void *ctx, int timeout_ms)
{
    struct fy_storemeta *m = calloc(1, sizeof *m);
    FY_REQUIRE(m != NULL, -ENOMEM, "init: no memory for the commit record");
    *m = (struct fy_storemeta){
        .model = *c, .step = 0, .seed = seed, .seq = 1, .copy = 0, .copies = copies};
    struct unit_write w[2] = {{0}, {0}};
    struct unit_make mk = {0};
    int rc;
    FY_TRY_OUT(rc, commit_extents(x, c, copies, timeout_ms));
    /* every extent first: the io worker would answer an allocation only after the write ahead */
    for (unsigned u = 0; u < fy_model_unit_count(c); u++)
        FY_TRY_OUT(rc, fy_io_call(x, FY_OP_IO_ALLOC, FY_TENSOR_UNIT_STATE(u), 0, 0,
                                  fy_optstate_bytes(c, u), timeout_ms));
    unsigned next = 0; /* the buffer the next piece takes */
    for (unsigned u = 0; u < fy_model_unit_count(c); u++) {
        unsigned n = fy_optstate_piece_count(c, u);
        if (n > 1) { /* the unit's master whole in memory, each piece's state made from it */
            mk.master = malloc(fy_model_unit_params(c, u) * sizeof *mk.master);
            mk.digest = calloc(n, sizeof *mk.digest);
            rc = mk.master && mk.digest ? fill(ctx, u, mk.master) : -ENOMEM;
            if (rc == -ENOMEM)
                fy_error("init: no memory for unit %u's %zu weights", u,
                         fy_model_unit_params(c, u));
            if (rc < 0)
                goto out;
        }
        for (unsigned k = 0; k < n; k++) {
            struct fy_optstate_piece p;
            fy_optstate_piece(c, u, k, &p, NULL);
            uint64_t buf = buf_off[next];
            for (int i = 0; i < 2; i++) /* the write still reading this buffer */
                if (w[i].ticket != 0 && w[i].buf == buf)
                    FY_TRY_OUT(rc, unit_write_wait(x, &w[i], timeout_ms));
            uint8_t *state = fy_pool_at(pool, buf, p.layout.bytes);
            float *master = (float *)(state + p.layout.section[FY_OPTSTATE_MASTER].offset);
            fy_optstate_zero_moments(&p.layout, state); /* Adam's moments start at zero */
            if (n == 1)
                FY_TRY_OUT(rc, fill(ctx, u, master));
            else
                memcpy(master, mk.master + p.begin, p.params * sizeof *master);
            /* written (and its digest taken) while the next is filled */
            int64_t ticket = io_submit_digest(x, FY_OP_IO_WRITE, FY_TENSOR_UNIT_STATE(u), p.offset,
                                              buf, p.layout.bytes, 0, 0);
            FY_TRY_OUT(rc, ticket < 0 ? (int)ticket : 0);
            w[next] = (struct unit_write){ticket, buf, n == 1 ? &m->digest[u] : &mk.digest[k]};
            next ^= 1;
        }
        if (n > 1) { /* its pieces' digests all in: the unit's */
            for (int i = 0; i < 2; i++)
                FY_TRY_OUT(rc, unit_write_wait(x, &w[i], timeout_ms));
            m->digest[u] = fy_optstate_unit_digest(mk.digest, n);
            free(mk.master);
            free(mk.digest);
            mk = (struct unit_make){0};
        }
    }
out:
    for (int i = 0; i < 2; i++) { /* nothing stays in flight, whatever failed */
        int done = unit_write_wait(x, &w[i], timeout_ms);
        rc = rc ? rc : done;
    }
    free(mk.master);
    free(mk.digest);
    if (rc == 0)
        rc = fy_commit_write(x, pool, record_off, m, timeout_ms);
    free(m);
    return rc;
}

/* Unit u's state of the commit in m read piece by piece through the pool at buf_off (room for
 * its largest piece) and checked against the record's digest: each piece's digest into pieces
 * (may be NULL), each piece's master into master (may be NULL). A unit in one piece is read whole
 * and checked by the io worker. -EBADMSG where it does not match (said). */
static int read_through(const struct fy_exec *x, struct fy_pool *pool, const struct fy_storemeta *m,
                        unsigned u, uint64_t buf_off, uint64_t *pieces, float *master,
                        int timeout_ms)
{
    const struct fy_model_config *c = &m->model;
    uint32_t tensor = FY_TENSOR_UNIT_STATE_COPY(u, m->copy);
    unsigned n = fy_optstate_piece_count(c, u);
    uint64_t *got = n > 1 ? calloc(n, sizeof *got) : NULL;
    FY_REQUIRE(n == 1 || got != NULL, -ENOMEM, "no memory for %u digests", n);
    int rc = 0;
    for (unsigned k = 0; k < n; k++) {
        struct fy_optstate_piece p;
        fy_optstate_piece(c, u, k, &p, NULL);
        uint64_t digest = m->digest[u];
        FY_TRY_OUT(rc, io_call_piece(x, FY_OP_IO_READ, tensor, p.offset, buf_off, p.layout.bytes,
                                     n == 1 ? &digest : &got[k], n > 1, timeout_ms));
        const struct fy_optstate_section *ms = &p.layout.section[FY_OPTSTATE_MASTER];
        if (master != NULL)
            memcpy(master + p.begin, fy_pool_at(pool, buf_off + ms->offset, ms->bytes), ms->bytes);
    }
    if (n > 1 && fy_optstate_unit_digest(got, n) != m->digest[u]) {
        fy_error("step %llu's state of unit %u (copy %u), read piece by piece, does not match its "
                 "commit record (%016llx, read %016llx): torn or corrupted on the SSD",
                 (unsigned long long)m->step, u, m->copy, (unsigned long long)m->digest[u],
                 (unsigned long long)fy_optstate_unit_digest(got, n));
        rc = -EBADMSG;
        goto out;
    }
    if (pieces != NULL) {
        if (n == 1)
            pieces[0] = m->digest[u];
        else
            memcpy(pieces, got, n * sizeof *got);
    }
out:
    free(got);
    return rc;
}

int fy_commit_verify(const struct fy_exec *x, struct fy_pool *pool, const struct fy_storemeta *m,
                     uint64_t buf_off, const unsigned char *skip, uint64_t *pieces, unsigned *bad,
                     int timeout_ms)
{
    unsigned at = 0;
    for (unsigned u = 0; u < fy_model_unit_count(&m->model); u++) {
        unsigned n = fy_optstate_piece_count(&m->model, u);
        at += n;
        if (skip != NULL && skip[u])
            continue;
        int rc =
            read_through(x, pool, m, u, buf_off, pieces ? pieces + at - n : NULL, NULL, timeout_ms);
        if (fy_is_damage(rc)) {
            *bad = u;
            fy_warn("step %llu's state of unit %u (copy %u) does not match its commit record",
                    (unsigned long long)m->step, u, m->copy);
        }
        FY_TRY(rc);
    }
    return 0;
}

int fy_commit_read_master(const struct fy_exec *x, struct fy_pool *pool,
                          const struct fy_storemeta *m, unsigned u, uint64_t buf_off, float *master,
                          int timeout_ms)
{
    return read_through(x, pool, m, u, buf_off, NULL, master, timeout_ms);
}

int fy_commit_export_next(const struct fy_exec *x, struct fy_pool *pool, uint64_t record_off,
                          const char *where, int beside, struct fy_commit_export *e,
                          struct fy_storemeta *m, int timeout_ms)
{
    struct fy_storemeta *now = malloc(sizeof *now);
    FY_REQUIRE(now != NULL, -ENOMEM, "no memory for a commit record");
    uint64_t failed_seq = e->fell_back ? e->damaged_seq : m->seq; /* the newest commit tried */
    int rc = fy_commit_read(x, pool, record_off, where, UINT64_MAX, now, timeout_ms);
    if (rc == 0 && now->seq > failed_seq) {
        fy_info("%s: step %llu was committed meanwhile, over the copy being read: going on from "
                "step %llu instead of %llu",
                where, (unsigned long long)now->step, (unsigned long long)now->step,
                (unsigned long long)m->step);
        memcpy(m, now, sizeof *m);
        rc = 1;
    } else if (rc == 0 && m->copies == 1 && beside) {
        fy_error("%s: step %llu's state no longer matches its commit: this store keeps one copy "
                 "of the state (init --state-copies 1), which training overwrites in place; stop "
                 "the training run to export",
                 where, (unsigned long long)m->step);
        rc = -EBADMSG;
    } else if (rc == 0 && m->copies == 1) {
        fy_error("%s: step %llu's state no longer matches its commit and no run is training: "
                 "this store keeps one copy of the state (init --state-copies 1), and a run "
                 "stopped between commits (killed, crashed, a second Ctrl-C) left it unusable; "
                 "initialise it again (init --overwrite), or from an earlier export (init "
                 "--from-hf DIR)",
                 where, (unsigned long long)m->step);
        rc = -EBADMSG;
    } else if (rc == 0 && !e->fell_back) {
        rc = fy_commit_read(x, pool, record_off, where, m->seq, now, timeout_ms);
        if (rc == 0) {
            fy_warn("%s: step %llu's state is damaged on the SSD; exporting the commit before it, "
                    "step %llu",
                    where, (unsigned long long)m->step, (unsigned long long)now->step);
            *e = (struct fy_commit_export){
                .fell_back = 1, .damaged_seq = m->seq, .damaged_step = m->step};
            memcpy(m, now, sizeof *m);
            rc = 1;
        }
    } else if (rc == 0) {
        fy_error("%s: step %llu's state is damaged on the SSD, and so is step %llu's, the commit "
                 "before it: nothing intact to export; %s",
                 where, (unsigned long long)e->damaged_step, (unsigned long long)m->step,
                 beside ? "the training run writes over the older commit's copy: export again "
                          "once it has committed a newer step"
                        : "initialise the store anew (init --overwrite), or from an earlier "
                          "export (init --from-hf DIR)");
        rc = -EBADMSG;
    }
    free(now);
    return rc;
}
