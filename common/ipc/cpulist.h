/* Cpu lists: OS PU indexes written "0", "2-15", "0,2,4-6", read into and written from hwloc
 * bitmaps, for the topology (common/ipc/topo.h), the placement (common/ipc/affinity.h) and the
 * workers' thread counts. */
#ifndef FY_CPULIST_H
#define FY_CPULIST_H

#include <stddef.h>

struct hwloc_bitmap_s; /* hwloc_bitmap_t */

/* Parses a cpu list into ascending os indexes; returns the count (<= max) or -EINVAL with a
 * message. Spaces around items are accepted; duplicates, empty items and backwards ranges are
 * not. cpus may be NULL to only count (max is then ignored). */
int fy_cpulist_parse(const char *list, int *cpus, int max);

/* A whole comma-separated list into set (cleared first); -EINVAL (-ENOMEM) with why in err,
 * nothing logged. */
int fy_cpulist_to_set(const char *list, struct hwloc_bitmap_s *set, char *err, size_t errlen);
/* One item "N" or "N-M" in [b, e), added to set; on error writes why into err. */
int fy_cpulist_item(const char *b, const char *e, struct hwloc_bitmap_s *set, char *err,
                    size_t errlen);
/* set as a list into buf; -ERANGE where it does not fit, -EINVAL where hwloc cannot print it. */
int fy_cpulist_of_set(const struct hwloc_bitmap_s *set, char *buf, size_t len);
/* The first character of [p, end) that is not a space or a tab (end where none). */
const char *fy_cpulist_skip_spaces(const char *p, const char *end);

/* hwloc_bitmap_alloc into var, else "out of memory", -ENOMEM into rc and to the function's
 * unwind at `out` (common/base/check.h). */
#define FY_CPUSET_ALLOC_OUT(rc, var)                                                               \
    FY_REQUIRE_OUT(rc, ((var) = hwloc_bitmap_alloc()) != NULL, -ENOMEM,                            \
                   "hwloc_bitmap_alloc: out of memory")

#endif
