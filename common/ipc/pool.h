/* The shared pool: one POSIX shared-memory object per run holding every pinned buffer the processes
 * exchange (named regions, 2 MiB aligned, with guard words), plus a fixed-size slot allocator.
 * The launcher creates it; workers attach by name; bytes move through it, never through messages. */
#ifndef FY_POOL_H
#define FY_POOL_H

#include <stddef.h>
#include <stdint.h>

#define FY_POOL_MAGIC 0x4c505946u /* "FYPL" */
#define FY_POOL_VERSION 1
#define FY_POOL_ALIGN (2u << 20)
#define FY_POOL_MAX_REGIONS 32
#define FY_POOL_REGION_NAME 32
#define FY_POOL_GUARD_BYTES 64
#define FY_POOL_NAME_MAX 64

struct fy_pool;
struct fy_topo;

struct fy_pool_region_spec {
    const char *name;
    uint64_t bytes;
};

struct fy_pool_opts {
    struct fy_topo *topo; /* NULL: no NUMA binding */
    int numa_node;        /* node to bind to; -1: none */
    const char *run_dir;  /* recorded in the header for messages */
};

/* "/fuyou-<16 hex>" from the canonical path of the run directory. */
int fy_pool_name_for_run(const char *run_dir, char *out, size_t len);
/* Bytes of shared memory that fy_pool_create needs for these regions (header, alignment, guards). */
uint64_t fy_pool_layout_size(const struct fy_pool_region_spec *regions, unsigned n);

/* Creates the object (mode 0600, exclusive). An object of that name left by a dead process is
 * removed first (logged); one whose creator is alive gives -EBUSY naming its pid. */
int fy_pool_create(struct fy_pool **out, const char *name, const struct fy_pool_region_spec *regions,
                   unsigned n, const struct fy_pool_opts *opts);
/* Maps an existing pool after checking its header (magic, version, size). */
int fy_pool_attach(struct fy_pool **out, const char *name);
/* Unmaps; the creator also unlinks the object. Sets *p = NULL; safe on NULL. */
void fy_pool_destroy(struct fy_pool **p);
/* Removes a pool left by a dead creator: 1 removed, 0 nothing there, -EBUSY creator alive. */
int fy_pool_remove_stale(const char *name);
/* The same without a word when it removes the pool (the caller's message says so); a live creator
 * and a failure are still said. */
int fy_pool_remove_stale_quietly(const char *name);

const char *fy_pool_name(const struct fy_pool *p);
void *fy_pool_base(const struct fy_pool *p);
uint64_t fy_pool_size(const struct fy_pool *p);
int fy_pool_uses_huge_pages(const struct fy_pool *p);
/* Pointer to a byte offset; NULL when [offset, offset+bytes) is not inside the pool. */
void *fy_pool_at(const struct fy_pool *p, uint64_t offset, uint64_t bytes);
/* 1 where the pool has a region of that name (an optional one), else 0; says nothing. */
int fy_pool_has_region(const struct fy_pool *p, const char *name);
/* Offset and size of a named region; -ENOENT (logged) when absent. */
int fy_pool_region(const struct fy_pool *p, const char *name, uint64_t *offset, uint64_t *bytes);
/* Checks every guard word; -EFAULT naming the first region whose neighbour was overwritten. */
int fy_pool_check_guards(const struct fy_pool *p);

/* Fixed-size slots carved from one region, 4 KiB aligned for O_DIRECT. The allocator lives in the
 * process that hands out slots (the launcher); ownership of a slot then travels in descriptors. */
struct fy_slots {
    uint64_t base;  /* pool offset of slot 0 */
    uint64_t slot_bytes;
    unsigned count;
    unsigned in_use;
    uint64_t *used; /* bitmap */
    char region[FY_POOL_REGION_NAME];
};

int fy_slots_init(struct fy_slots *s, const struct fy_pool *p, const char *region,
                  uint64_t slot_bytes);
void fy_slots_destroy(struct fy_slots *s);
/* -ENOSPC when all slots are taken. */
int fy_slots_alloc(struct fy_slots *s, uint64_t *offset);
/* -EINVAL when offset is not the start of a slot in use (double free, foreign offset). */
int fy_slots_free(struct fy_slots *s, uint64_t offset);

#endif
