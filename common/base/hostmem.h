/* The host memory this process may still take: MemAvailable of /proc/meminfo, the room its
 * cgroups leave (v2 memory.max less memory.current, v1 memory.limit_in_bytes less
 * memory.usage_in_bytes, each level from the process's own up to the root) and the free space of
 * /dev/shm, where the shared pool lives, and the --cpu-mem
 * default made from them less a stated margin. The files are read under FUYOU_TEST_HOST_ROOT
 * where a test sets it (common/base/knobs.h). */
#ifndef FY_HOSTMEM_H
#define FY_HOSTMEM_H

#include <stddef.h>
#include <stdint.h>

/* The margin the --cpu-mem default leaves: the larger of a tenth of the room and this, at most
 * half the room. */
#define FY_HOSTMEM_MARGIN_MIN (2ull << 30)

struct fy_hostmem {
    uint64_t available;    /* MemAvailable */
    int cgroup;            /* a cgroup limit was found (the fields below) */
    uint64_t cgroup_limit; /* the limit of the tightest level */
    uint64_t cgroup_used;  /* its usage */
    char cgroup_file[320]; /* its limit's file, as read */
    uint64_t shm_free;     /* /dev/shm's free space, where the pool lives (UINT64_MAX: unknown) */
    uint64_t room;         /* the least of available, the tightest cgroup's limit - usage and
                             * shm_free */
};

/* Reads the machine's memory into *m. -errno (said) where /proc/meminfo cannot be read or has no
 * MemAvailable; a cgroup file that cannot be read is taken as no limit at that level. */
int fy_hostmem_read(struct fy_hostmem *m);

/* The --cpu-mem default of m: its room less the margin (a tenth of the room, at least
 * FY_HOSTMEM_MARGIN_MIN, at most half the room); *said gets where it came from, as "MemAvailable
 * 103.4 GiB less a margin of 10.3 GiB". */
uint64_t fy_hostmem_default_cap(const struct fy_hostmem *m, char *said, size_t len);

#endif
