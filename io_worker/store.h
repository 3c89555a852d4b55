/* The SSD store: named extents (tensor id -> logical range) striped over one or more directories
 * ("SSD paths"). Each path holds DIR/fuyou-store.data (a 4 KiB header, then data); the first path
 * also holds the index DIR/fuyou-store.idx, rewritten atomically whenever extents are added.
 * Logical address L lives in path (L/su) % npaths at file offset 4096 + (L/su/npaths)*su + L%su. */
#ifndef FY_STORE_H
#define FY_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "io_worker/ring.h"

#define FY_STORE_DATA_NAME "fuyou-store.data"
#define FY_STORE_INDEX_NAME "fuyou-store.idx"
#define FY_STORE_MAGIC 0x53595546u       /* "FUYS" little-endian, data file header */
#define FY_STORE_INDEX_MAGIC 0x49595546u /* "FUYI" little-endian, index file header */
#define FY_STORE_VERSION 1
#define FY_STORE_HEADER_BYTES 4096u
#define FY_STORE_DEFAULT_STRIPE ((size_t)1 << 20)

/* int32 slots of the data file header (the rest of its 4096 bytes is zero). */
enum fy_store_hdr_slot {
    FY_STORE_HDR_MAGIC = 0,
    FY_STORE_HDR_VERSION = 1,
    FY_STORE_HDR_PATH_INDEX = 2,
    FY_STORE_HDR_PATH_COUNT = 3,
    FY_STORE_HDR_STRIPE_KIB = 4,
    FY_STORE_HDR_ID_LO = 5,
    FY_STORE_HDR_ID_HI = 6,
    FY_STORE_HDR_CHECKSUM = 7, /* FNV-1a over the 4096 bytes with this slot zero */
};

struct fy_store;

struct fy_store_opts {
    const char *const *paths;
    unsigned npaths;
    size_t stripe_unit; /* power of two, multiple of 4096; 0: 1 MiB at create, the stored one at open */
    int create;         /* 1: create a new store (refused if one exists unless overwrite); 0: open */
    int overwrite;
    /* open an existing store to read it only (an export, the launcher's look at its commit
     * records): its files opened read-only, no probe file written (fy_direct_check), writes
     * and new extents refused (-EROFS, said); fy_store_pread reads it */
    int readonly;
};

struct fy_extent {
    uint32_t tensor;
    uint64_t logical_offset;
    uint64_t bytes; /* as requested; the allocation is padded to 4 KiB */
};

int fy_store_open(struct fy_store **out, const struct fy_store_opts *o);
void fy_store_destroy(struct fy_store **s); /* sets *s = NULL; safe on NULL */

/* Allocates an extent at the next stripe-aligned logical offset, grows the data files and
 * persists the index atomically. -EEXIST if the tensor has one. */
int fy_store_add_extent(struct fy_store *s, uint32_t tensor, uint64_t bytes);
int fy_store_find(const struct fy_store *s, uint32_t tensor, struct fy_extent *out); /* -ENOENT */
unsigned fy_store_extent_count(const struct fy_store *s);
/* The i-th extent in allocation order (i < fy_store_extent_count). */
int fy_store_extent_at(const struct fy_store *s, unsigned i, struct fy_extent *out);

unsigned fy_store_file_count(const struct fy_store *s);
const int *fy_store_fds(const struct fy_store *s);
const char *const *fy_store_file_names(const struct fy_store *s);
size_t fy_store_stripe_unit(const struct fy_store *s);
uint64_t fy_store_id(const struct fy_store *s);

/* Expands [offset, offset+len) of an extent (4096-aligned; may reach into the 4 KiB padding) into
 * ring requests, one per stripe-unit piece, merged where contiguous in one file. File indexes
 * follow the order of paths. Returns the number of requests written or -errno: -ENOENT (no such
 * tensor), -ERANGE (outside the extent), -ENOSPC (max too small), -EINVAL (misaligned), -EROFS (a
 * write to a store opened read-only). */
int fy_store_map(const struct fy_store *s, uint32_t tensor, uint64_t offset, size_t len, void *buf,
                 enum fy_io_dir dir, uint64_t tag, struct fy_io_req *reqs, unsigned max);

/* Synchronous transfers over a ring that has fy_store_fds registered in order. */
int fy_store_read(struct fy_store *s, struct fy_ring *r, uint32_t tensor, uint64_t offset,
                  void *buf, size_t len, int timeout_ms);
int fy_store_write(struct fy_store *s, struct fy_ring *r, uint32_t tensor, uint64_t offset,
                   const void *buf, size_t len, int timeout_ms);
int fy_store_sync(struct fy_store *s); /* fsync every data file */
/* A synchronous read without a ring (pread of each stripe piece), for a reader that has no io
 * worker, such as the launcher's look at the commit records (launcher/step/commit.h,
 * fy_commit_peek); the range and buf are 4096-aligned as fy_store_map needs. 0 or -errno, said. */
int fy_store_pread(const struct fy_store *s, uint32_t tensor, uint64_t offset, void *buf,
                   size_t len);

#endif
