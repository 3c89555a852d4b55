/* The store's commit protocol, over the io worker: which of the two commit records is current,
 * writing the next one after the state it names is durable, giving a store the extents that
 * commits need, and checking a committed step's state against its digests. The record format and
 * the two copies of each unit's state are in common/formats/ckpt.h; docs/architecture.md ("Durability")
 * says what a crash can and cannot lose. */
#ifndef FY_COMMIT_H
#define FY_COMMIT_H

#include <stdint.h>

#include "common/formats/ckpt.h"
#include "common/ipc/pool.h"
#include "common/model/model.h"
#include "launcher/run/exec.h"

/* One request to the io worker, waited for: `bytes` at pool offset `pool_offset` (none: a control
 * request), extent offset or size in `arg`. Returns the reply's status. */
int fy_io_call(const struct fy_exec *x, int op, uint32_t tensor, uint64_t pool_offset,
               uint64_t bytes, uint64_t arg, int timeout_ms);
/* The same for a read or write with a digest: a write's digest goes to *digest; a read fails with
 * -EBADMSG unless what it read has the digest *digest. */
int fy_io_call_digest(const struct fy_exec *x, int op, uint32_t tensor, uint64_t pool_offset,
                      uint64_t bytes, uint64_t *digest, int timeout_ms);

/* The current commit: the intact record with the highest sequence number below `below_seq`
 * (UINT64_MAX: any), read through the pool region at record_off (FY_COMMIT_RECORD_BYTES). A
 * damaged record beside an intact one is reported and passed over. `where` names the store in
 * messages. -ENOENT (said) when no intact record is left, and for a store with no record at all:
 * one made before commit records (common/formats/ckpt.h), which is refused, or not a store of ours. */
int fy_commit_read(const struct fy_exec *x, struct fy_pool *pool, uint64_t record_off,
                   const char *where, uint64_t below_seq, struct fy_storemeta *m, int timeout_ms);

/* The current commit, as fy_commit_read finds it, read straight from the store's files in `ssd`
 * (its comma-separated paths) by the launcher itself: for a command whose workers are not up that
 * must still say what is committed (a stop at start-up). Read-only: nothing is written, no worker
 * started. -ENOENT where no record is intact, or the store's error (said). */
int fy_commit_peek(const char *ssd, struct fy_storemeta *m);

/* Makes `next` the current commit: every data file synced (so the state it names is durable),
 * the record written over the older one (record next->seq % 2), synced again. */
int fy_commit_write(const struct fy_exec *x, struct fy_pool *pool, uint64_t record_off,
                    const struct fy_storemeta *next, int timeout_ms);

/* A new store's step 0: both records' extents and, with two copies, every unit's second copy;
 * then each unit's state extent in copy 0 written piece by piece through the pool: the master as
 * fill(ctx, unit, master) writes it (a unit in pieces: into memory, each piece's range copied into
 * its state), the moments zero; then the first commit (sequence 1, copy 0, every unit's digest)
 * through the pool at record_off. Pieces take the buffers at buf_off[0] and buf_off[1] in turn
 * (each with room for the largest piece's state), so one is filled while the other's write runs;
 * the two offsets may be equal (one buffer: each write is waited for before the next fill). */
int fy_commit_create(const struct fy_exec *x, struct fy_pool *pool, uint64_t record_off,
                     const uint64_t buf_off[2], const struct fy_model_config *c, uint64_t seed,
                     unsigned copies, int (*fill)(void *ctx, unsigned unit, float *master),
                     void *ctx, int timeout_ms);

/* Reads the state of every unit not marked in `skip` (may be NULL) from the committed copy,
 * piece by piece through the pool region at buf_off (at least the largest piece's state,
 * fy_optstate_max_piece_bytes), and checks it against the record's digests; each piece's digest
 * into pieces (may be NULL; every unit's pieces in unit order, those of skipped units left as
 * they are). 0, or -EBADMSG with *bad the first unit that does not match (said). */
int fy_commit_verify(const struct fy_exec *x, struct fy_pool *pool, const struct fy_storemeta *m,
                     uint64_t buf_off, const unsigned char *skip, uint64_t *pieces, unsigned *bad,
                     int timeout_ms);

/* Unit u's state between the pool at pool_offset (room for its whole extent) and extent `tensor`:
 * a unit in one piece in one transfer (a read checked against unit_digest by the io worker), one in
 * pieces piece by piece (a read checked here against unit_digest, from its pieces' digests);
 * each piece's digest, read or written, into pieces (may be NULL). -EBADMSG where a read does not
 * match (said). */
int fy_commit_unit_io(const struct fy_exec *x, int op, const struct fy_model_config *c, unsigned u,
                      uint32_t tensor, uint64_t pool_offset, uint64_t unit_digest, uint64_t *pieces,
                      int timeout_ms);

/* Unit u's master weights of the committed step in m (fy_model_unit_params floats) into master,
 * its state read piece by piece through the pool at buf_off (room for the largest piece's state:
 * all of it is read, to check it against the record's digest). -EBADMSG where it does not match:
 * a training run may have committed a later step over that copy meanwhile, or the state is
 * damaged (fy_commit_export_next tells and finds what to export instead). */
int fy_commit_read_master(const struct fy_exec *x, struct fy_pool *pool,
                          const struct fy_storemeta *m, unsigned u, uint64_t buf_off, float *master,
                          int timeout_ms);
/* What an export has passed over so far (fy_commit_export_next); zeroed before it starts. */
struct fy_commit_export {
    int fell_back;         /* it went back from a damaged commit, */
    uint64_t damaged_seq;  /* this one, */
    uint64_t damaged_step; /* of this step */
};
/* After an export's read of the commit in *m failed its digest (fy_commit_read_unit): 1 with *m
 * the commit to export instead, said: the newer one when a training run committed meanwhile (its
 * copy was being overwritten), else, once, the intact commit before m, m's state being damaged on
 * the SSD. -EBADMSG (said) when there is none: a one-copy store's state overwritten (`beside`:
 * the export works beside a training run, fy_session.beside; else a run stopped between commits
 * left it so), or the commit before the damaged one damaged too. */
int fy_commit_export_next(const struct fy_exec *x, struct fy_pool *pool, uint64_t record_off,
                          const char *where, int beside, struct fy_commit_export *e,
                          struct fy_storemeta *m, int timeout_ms);

#endif
