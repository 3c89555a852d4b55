/* Digested transfers: a synchronous read or write of a store extent that also gives the digest
 * (common/base/digest.h) of the bytes moved, in about the time of the transfer alone. */
#ifndef FY_XFER_H
#define FY_XFER_H

#include <stddef.h>
#include <stdint.h>

#include "io_worker/ring.h"
#include "io_worker/store.h"

/* The transfer is cut into FY_XFER_DIGEST_CHUNK pieces, and a piece is digested while the next
 * ones are on the disk (a write digests a piece, then queues it). The ring has fy_store_fds
 * registered in order. 0 with *digest set, or -errno. */
#define FY_XFER_DIGEST_CHUNK ((size_t)8 << 20)
int fy_xfer_digest(struct fy_store *s, struct fy_ring *r, uint32_t tensor, uint64_t offset,
                   void *buf, size_t len, enum fy_io_dir dir, int timeout_ms, uint64_t *digest);

#endif
