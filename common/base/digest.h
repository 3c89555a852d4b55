/* Checksums of state on the SSD store: a 64-bit XXH3 digest (libxxhash, header-only), fast enough
 * to run over every optimizer-state transfer. Detects torn and corrupted data; not a MAC. */
#ifndef FY_DIGEST_H
#define FY_DIGEST_H

#include <stddef.h>
#include <stdint.h>

uint64_t fy_digest(const void *data, size_t len);
/* fy_digest of data with bytes [hole, hole + hole_len) read as zero (hole_len <= 64): a record's
 * digest over itself, its own digest field left out. */
uint64_t fy_digest_zeroing(const void *data, size_t len, size_t hole, size_t hole_len);

/* fy_digest of n values as 8-byte little-endian words one after another. */
uint64_t fy_digest_u64s(const uint64_t *values, size_t n);

/* The same digest over data given in pieces, in order (equal to fy_digest of them joined). */
struct fy_digest_state;
struct fy_digest_state *fy_digest_begin(void); /* NULL when out of memory */
void fy_digest_update(struct fy_digest_state *d, const void *data, size_t len);
uint64_t fy_digest_end(struct fy_digest_state *d); /* frees d */

#endif
