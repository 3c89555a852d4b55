/* A unit's optimizer state between the store and the pool (part of a step's schedule:
 * launcher/step/sched.h): the store's two copies of each unit's state (struct fy_sched_copies:
 * the committed one read, the other written, and per unit the copy its latest state is in with
 * its pieces' digests), the two state slots a streamed unit's state is read into and written back
 * from, and the kept units' state loaded at start and written at commits. */
#ifndef FY_SCHED_STATE_H
#define FY_SCHED_STATE_H

#include <stdint.h>

#include "common/formats/ckpt.h"
#include "launcher/step/sched.h"

/* How a state transfer takes digests: a read unchecked, a read checked against the piece's
 * digest in copies.digest (a write: its digest into copies.digest), or a read whose digest goes
 * to copies.digest unchecked (the pieces of a unit whose record has their digests' digest
 * alone). */
enum { FY_SCHED_DIGEST_NONE, FY_SCHED_DIGEST_CHECK, FY_SCHED_DIGEST_REPORT };

/* Piece k of unit u's state between the pool at pool_offset and its copy `copy` in the store. */
int fy_sched_piece_io(struct fy_sched *r, int op, unsigned u, unsigned k, unsigned copy,
                      uint64_t pool_offset, int how, struct fy_ticket *t);
/* Piece k of unit u between state slot s and the store: read from copy `from` checked against its
 * digest, or written to the working copy with its digest kept. */
int fy_sched_piece_move(struct fy_sched *r, int op, unsigned u, unsigned k, unsigned from,
                        unsigned s, struct fy_ticket *t);
/* The copy that holds unit u's latest state. */
unsigned fy_sched_copy_of(const struct fy_sched *r, unsigned u);

/* Unit u's optimizer step, in three requests that the caller can interleave with other work: its
 * state into state slot s (fy_sched_state_read: a kept unit's where it stays), AdamW with the
 * gradient in a grads slot (launcher/step/sched_update.h), the state back to the working copy in
 * the store (fy_sched_state_write: nothing for a kept unit, written at commits). */
int fy_sched_state_read(struct fy_sched *r, unsigned u, unsigned s, struct fy_ticket *t);
int fy_sched_state_write(struct fy_sched *r, unsigned u, unsigned s, struct fy_ticket *t);

/* Every resident unit's state between the pool and the store: loaded from the committed copy at
 * start, each unit checked against its digest in the commit record (unit_digests; a unit in pieces
 * read piece by piece with its pieces' digests reported, and checked here against the record's),
 * written to the other at commits (unit_digests NULL). */
int fy_sched_resident_transfer(struct fy_sched *r, int op, const uint64_t *unit_digests);
/* Unit u's digest for a commit record: of its pieces' digests (fy_optstate_unit_digest). */
uint64_t fy_sched_unit_digest(const struct fy_sched *r, unsigned u);
/* The copies once meta is committed: meta's copy is the one read, the other the one written (a
 * store of one copy: the same, written in place). */
void fy_sched_copies_of_commit(struct fy_sched *r, const struct fy_storemeta *meta);

#endif
