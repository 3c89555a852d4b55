/* The host memory this process may still take, and the --cpu-mem default (hostmem.h). */
#include "common/base/hostmem.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include "common/base/check.h"
#include "common/base/config.h"
#include "common/base/knobs.h"
#include "common/base/log.h"

/* path under FUYOU_TEST_HOST_ROOT where a test set it, else as it is. */
static void host_path(char *buf, size_t len, const char *path)
{
    const char *root = fy_knob_test_host_root();
    snprintf(buf, len, "%s%s", root ? root : "", path);
}

/* The first number of the file (a cgroup's limit or usage); 0 where the file cannot be read, holds
 * no number or "max" (no limit): *value is then UINT64_MAX. */
static int read_u64_file(const char *path, uint64_t *value)
{
    *value = UINT64_MAX;
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    char line[64];
    int ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (!ok)
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(line, &end, 10);
    if (end == line || errno != 0)
        return 0; /* "max" */
    *value = v;
    return 0;
}

static uint64_t cgroup_room(const struct fy_hostmem *m)
{
    return m->cgroup_limit > m->cgroup_used ? m->cgroup_limit - m->cgroup_used : 0;
}

/* One cgroup level: dir's limit and usage files; kept in m where its room is the least yet. */
static void cgroup_level(struct fy_hostmem *m, const char *dir, const char *limit_name,
                         const char *usage_name)
{
    char limit_path[320], usage_path[320];
    snprintf(limit_path, sizeof limit_path, "%s/%s", dir, limit_name);
    snprintf(usage_path, sizeof usage_path, "%s/%s", dir, usage_name);
    uint64_t limit, used;
    /* v1 writes "no limit" as the largest page-aligned signed value */
    if (read_u64_file(limit_path, &limit) < 0 || limit >= (1ull << 62))
        return;
    if (read_u64_file(usage_path, &used) < 0 || used == UINT64_MAX)
        used = 0;
    uint64_t room = limit > used ? limit - used : 0;
    if (m->cgroup && room >= cgroup_room(m))
        return;
    m->cgroup = 1;
    m->cgroup_limit = limit;
    m->cgroup_used = used;
    snprintf(m->cgroup_file, sizeof m->cgroup_file, "%s", limit_path);
}

/* Every level of the hierarchy mounted at `mount` from the process's cgroup `path` up to the
 * root (a level whose directory is not there, as in a cgroup namespace, is skipped). */
static void cgroup_walk(struct fy_hostmem *m, const char *mount, const char *path,
                        const char *limit_name, const char *usage_name)
{
    char rel[256];
    snprintf(rel, sizeof rel, "%s", path);
    for (;;) {
        size_t n = strlen(rel);
        while (n > 0 && rel[n - 1] == '/')
            rel[--n] = 0;
        char dir[320];
        snprintf(dir, sizeof dir, "%s%s", mount, rel);
        cgroup_level(m, dir, limit_name, usage_name);
        char *slash = strrchr(rel, '/');
        if (slash == NULL || n == 0)
            break;
        *slash = 0;
    }
}

/* The process's cgroups (/proc/self/cgroup): v2's "0::PATH" and v1's memory controller's
 * "N:...memory...:PATH". */
static void read_cgroups(struct fy_hostmem *m)
{
    char path[320];
    host_path(path, sizeof path, "/proc/self/cgroup");
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    char line[512];
    while (fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\n")] = 0;
        char *controllers = strchr(line, ':');
        char *at = controllers ? strchr(controllers + 1, ':') : NULL;
        if (at == NULL)
            continue;
        *at++ = 0;
        *controllers++ = 0; /* line: the hierarchy's number */
        char mount[320];
        if (strcmp(line, "0") == 0 && controllers[0] == 0) {
            /* v2: mounted at /sys/fs/cgroup, or at /sys/fs/cgroup/unified beside v1's */
            host_path(mount, sizeof mount, "/sys/fs/cgroup");
            cgroup_walk(m, mount, at, "memory.max", "memory.current");
            host_path(mount, sizeof mount, "/sys/fs/cgroup/unified");
            cgroup_walk(m, mount, at, "memory.max", "memory.current");
            continue;
        }
        for (char *save = NULL, *c = strtok_r(controllers, ",", &save); c != NULL;
             c = strtok_r(NULL, ",", &save))
            if (strcmp(c, "memory") == 0) {
                host_path(mount, sizeof mount, "/sys/fs/cgroup/memory");
                cgroup_walk(m, mount, at, "memory.limit_in_bytes", "memory.usage_in_bytes");
            }
    }
    fclose(f);
}

int fy_hostmem_read(struct fy_hostmem *m)
{
    memset(m, 0, sizeof *m);
    char path[320];
    host_path(path, sizeof path, "/proc/meminfo");
    FILE *f = fopen(path, "r");
    FY_REQUIRE(f != NULL, -errno, "cannot read %s for the machine's free memory: %s", path,
               strerror(errno));
    char line[256];
    int found = 0;
    while (!found && fgets(line, sizeof line, f) != NULL) {
        unsigned long long kib;
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
            m->available = (uint64_t)kib << 10;
            found = 1;
        }
    }
    fclose(f);
    FY_REQUIRE(found, -ENOENT,
               "%s has no MemAvailable line (a kernel before 3.14?): the "
               "machine's free memory is not known",
               path);
    read_cgroups(m);
    m->room = m->available;
    if (m->cgroup && cgroup_room(m) < m->room)
        m->room = cgroup_room(m);
    struct statvfs vfs;
    host_path(path, sizeof path, "/dev/shm");
    m->shm_free = statvfs(path, &vfs) == 0 ? (uint64_t)vfs.f_bavail * vfs.f_frsize : UINT64_MAX;
    if (m->shm_free < m->room)
        m->room = m->shm_free;
    return 0;
}

uint64_t fy_hostmem_default_cap(const struct fy_hostmem *m, char *said, size_t len)
{
    uint64_t margin = m->room / 10;
    if (margin < FY_HOSTMEM_MARGIN_MIN)
        margin = FY_HOSTMEM_MARGIN_MIN;
    if (margin > m->room / 2)
        margin = m->room / 2;
    uint64_t cap = m->room - margin;
    char avail[32], lim[32], used[32], marg[32];
    fy_format_size(m->available, avail, sizeof avail);
    fy_format_size(margin, marg, sizeof marg);
    if (m->shm_free == m->room && m->shm_free < m->available &&
        !(m->cgroup && cgroup_room(m) == m->room)) {
        char shm[32];
        fy_format_size(m->shm_free, shm, sizeof shm);
        snprintf(said, len,
                 "/dev/shm's free %s, where the pool lives (MemAvailable %s) less a "
                 "margin of %s",
                 shm, avail, marg);
    } else if (m->cgroup && cgroup_room(m) == m->room && cgroup_room(m) < m->available) {
        fy_format_size(m->cgroup_limit, lim, sizeof lim);
        fy_format_size(m->cgroup_used, used, sizeof used);
        snprintf(said, len,
                 "the cgroup's limit %s less its use %s (%s; MemAvailable %s) less a "
                 "margin of %s",
                 lim, used, m->cgroup_file, avail, marg);
    } else {
        snprintf(said, len, "MemAvailable %s less a margin of %s", avail, marg);
    }
    return cap;
}
