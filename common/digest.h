/* Checksums of state on the SSD store: a 64-bit XXH3 digest (libxxhash, header-only), fast enough
 * to run over every optimizer-state transfer. Detects torn and corrupted data; not a MAC. */
#ifndef FY_DIGEST_H
#define FY_DIGEST_H

#include <stddef.h>
#include <stdint.h>

uint64_t fy_digest(const void *data, size_t len);

#endif
