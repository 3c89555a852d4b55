/* The shared pool: POSIX shared memory laid out as a header followed by named 2 MiB-aligned regions,
 * each fenced by guard words; creation binds it to a NUMA node, asks for transparent huge pages and
 * reserves every page up front so a full /dev/shm is an error at start, not a SIGBUS mid-run. */
#include "common/ipc/pool.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "common/base/check.h"
#include "common/base/config.h"
#include "common/base/fsutil.h"
#include "common/ipc/topo.h"

struct region_entry {
    char name[FY_POOL_REGION_NAME];
    uint64_t offset;
    uint64_t bytes;
};

/* Lives at offset 0 of the shared object. Fields at fixed positions; version bumps on change. */
struct pool_header {
    uint32_t magic;
    uint32_t version;
    uint64_t size;
    int32_t owner_pid;
    int32_t region_count;
    uint64_t owner_start; /* start time of owner_pid in clock ticks since boot (pid reuse check) */
    uint64_t created_unix;
    char run_dir[512];
    struct region_entry regions[FY_POOL_MAX_REGIONS];
};

struct fy_pool {
    char name[FY_POOL_NAME_MAX];
    int owner;
    int huge;
    uint64_t size;
    uint8_t *base;
};

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* The guard pattern differs per region and side so a shifted copy is still caught. */
static uint64_t guard_word(unsigned region, int after, unsigned i)
{
    return 0xf0e1d2c3b4a59687ull ^ ((uint64_t)region << 32) ^ ((uint64_t)after << 31) ^ i;
}

int fy_pool_name_for_run(const char *run_dir, char *out, size_t len)
{
    char canon[PATH_MAX];
    if (realpath(run_dir, canon) == NULL) {
        int e = errno;
        fy_error("run directory %s: %s", run_dir, strerror(e));
        return -e;
    }
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const char *c = canon; *c; c++)
        h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    int n = snprintf(out, len, "/fuyou-%016llx", (unsigned long long)h);
    return n < (int)len ? 0 : -ENAMETOOLONG;
}

uint64_t fy_pool_layout_size(const struct fy_pool_region_spec *regions, unsigned n)
{
    uint64_t end = FY_POOL_ALIGN; /* the header owns the first 2 MiB */
    for (unsigned i = 0; i < n; i++) {
        uint64_t start = align_up(end + FY_POOL_GUARD_BYTES, FY_POOL_ALIGN);
        end = align_up(start + regions[i].bytes, FY_POOL_GUARD_BYTES) + FY_POOL_GUARD_BYTES;
    }
    return align_up(end, FY_POOL_ALIGN);
}

/* Field 22 of /proc/PID/stat: start time in clock ticks since boot; 0 if unreadable. */
static uint64_t process_start_time(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (fy_file_read_text(path, buf, sizeof buf, NULL) < 0)
        return 0;
    char *p = strrchr(buf, ')'); /* the command name may contain spaces */
    if (p == NULL || p[1] != ' ' || p[2] == 'Z' || p[2] == 'X')
        return 0; /* a zombie is as dead as a missing process */
    unsigned long long start = 0;
    /* after ')': state is field 3; skip fields 3..21 */
    int field = 2;
    for (char *tok = strtok(p + 1, " "); tok != NULL; tok = strtok(NULL, " ")) {
        if (++field == 22) {
            start = strtoull(tok, NULL, 10);
            break;
        }
    }
    return start;
}

static int owner_alive(const struct pool_header *h)
{
    if (h->owner_pid <= 0)
        return 0;
    if (kill(h->owner_pid, 0) != 0 && errno == ESRCH)
        return 0;
    uint64_t start = process_start_time(h->owner_pid);
    return start != 0 && start == h->owner_start;
}

static int remove_stale(const char *name, int say)
{
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) {
        if (errno == ENOENT)
            return 0;
        int e = errno;
        fy_error("cannot open shared memory %s to check it: %s", name, strerror(e));
        return -e;
    }
    struct stat st;
    int rc = fstat(fd, &st);
    struct pool_header h;
    memset(&h, 0, sizeof h);
    if (rc == 0 && (uint64_t)st.st_size >= sizeof h) {
        void *m = mmap(NULL, sizeof h, PROT_READ, MAP_SHARED, fd, 0);
        if (m != MAP_FAILED) {
            memcpy(&h, m, sizeof h);
            munmap(m, sizeof h);
        }
    }
    close(fd);
    if (h.magic == FY_POOL_MAGIC && owner_alive(&h)) {
        fy_error("shared memory %s belongs to a live run (pid %d, run directory %s): stop that run "
                 "first or use another run directory",
                 name, h.owner_pid, h.run_dir);
        return -EBUSY;
    }
    FY_SYS(shm_unlink(name), "cannot remove stale shared memory %s", name);
    if (say)
        fy_warn("removed stale shared memory %s left by a run that died (pid %d, run directory "
                "%s)", name, h.owner_pid, h.magic == FY_POOL_MAGIC ? h.run_dir : "unknown");
    return 1;
}

int fy_pool_remove_stale(const char *name) { return remove_stale(name, 1); }

int fy_pool_remove_stale_quietly(const char *name) { return remove_stale(name, 0); }

/* Transparent huge pages for shared memory depend on an admin setting; report what we get. */
static int shmem_thp_mode(char *mode, size_t len)
{
    snprintf(mode, len, "unavailable");
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
    if (f == NULL)
        return 0;
    char buf[256] = "";
    if (fgets(buf, sizeof buf, f) == NULL)
        buf[0] = 0;
    fclose(f);
    char *open = strchr(buf, '['), *close_ = open ? strchr(open, ']') : NULL;
    if (open == NULL || close_ == NULL)
        return 0;
    *close_ = 0;
    snprintf(mode, len, "%s", open + 1);
    return strcmp(mode, "always") == 0 || strcmp(mode, "within_size") == 0 ||
           strcmp(mode, "advise") == 0;
}

/* The guard after a region starts at its exact end (not the next aligned address), so a write even
 * one byte past the end is caught; memcpy because that address need not be aligned. */
static uint8_t *guard_at(uint8_t *base, const struct region_entry *e, int after)
{
    return after ? base + e->offset + e->bytes : base + e->offset - FY_POOL_GUARD_BYTES;
}

static void write_guards(uint8_t *base, const struct pool_header *h)
{
    for (int r = 0; r < h->region_count; r++)
        for (int after = 0; after < 2; after++)
            for (unsigned i = 0; i < FY_POOL_GUARD_BYTES / 8; i++) {
                uint64_t word = guard_word((unsigned)r, after, i);
                memcpy(guard_at(base, &h->regions[r], after) + 8 * i, &word, 8);
            }
}

static int map_and_reserve(int fd, const char *name, uint64_t size, const struct fy_pool_opts *opts,
                           uint8_t **base_out, int *huge_out)
{
    FY_SYS(ftruncate(fd, (off_t)size), "cannot size shared memory %s to %llu bytes", name,
           (unsigned long long)size);
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    FY_SYS(m == MAP_FAILED ? -1 : 0, "cannot map shared memory %s (%llu bytes)", name,
           (unsigned long long)size);
    char mode[32];
    *huge_out = 0;
    if (shmem_thp_mode(mode, sizeof mode)) {
        if (madvise(m, size, MADV_HUGEPAGE) == 0)
            *huge_out = 1;
        else
            fy_warn("madvise(MADV_HUGEPAGE) on %s failed: %s; using 4 KiB pages", name,
                    strerror(errno));
    } else {
        fy_info("huge pages for shared memory are %s on this machine (transparent_hugepage/"
                "shmem_enabled): using 4 KiB pages, pinning is slower",
                mode);
    }
    if (opts != NULL && opts->topo != NULL && opts->numa_node >= 0) {
        int rc = fy_topo_bind_memory(opts->topo, m, size, opts->numa_node);
        if (rc < 0)
            fy_warn("could not bind shared memory %s to NUMA node %d (%s): pages go where the "
                    "kernel puts them",
                    name, opts->numa_node, strerror(-rc));
    }
    /* Reserve every page now: a full /dev/shm then fails here with ENOSPC instead of a SIGBUS later. */
    int rc = posix_fallocate(fd, 0, (off_t)size);
    if (rc != 0) {
        struct statvfs vfs;
        char need[32], avail[32] = "unknown";
        fy_format_size(size, need, sizeof need);
        if (statvfs("/dev/shm", &vfs) == 0)
            fy_format_size((uint64_t)vfs.f_bavail * vfs.f_frsize, avail, sizeof avail);
        fy_error("cannot reserve %s of shared memory for %s: %s (/dev/shm has %s free): lower "
                 "--cpu-mem or enlarge /dev/shm",
                 need, name, strerror(rc), avail);
        munmap(m, size);
        return -rc;
    }
    *base_out = m;
    return 0;
}

int fy_pool_create(struct fy_pool **out, const char *name, const struct fy_pool_region_spec *regions,
                   unsigned n, const struct fy_pool_opts *opts)
{
    *out = NULL;
    FY_REQUIRE(n <= FY_POOL_MAX_REGIONS, -E2BIG, "pool %s: %u regions, at most %d", name, n,
               FY_POOL_MAX_REGIONS);
    FY_REQUIRE(strlen(name) < FY_POOL_NAME_MAX && name[0] == '/', -EINVAL,
               "pool name '%s' must start with '/' and be shorter than %d", name, FY_POOL_NAME_MAX);
    for (unsigned i = 0; i < n; i++) {
        FY_REQUIRE(strlen(regions[i].name) < FY_POOL_REGION_NAME && regions[i].name[0], -EINVAL,
                   "pool region name '%s' is empty or too long", regions[i].name);
        for (unsigned j = 0; j < i; j++)
            FY_REQUIRE(strcmp(regions[i].name, regions[j].name) != 0, -EINVAL,
                       "pool region '%s' named twice", regions[i].name);
    }
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST) {
        FY_TRY(fy_pool_remove_stale(name));
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    }
    FY_SYS(fd, "cannot create shared memory %s (is /dev/shm mounted and writable?)", name);
    /* shm_open applies the umask; make the mode exactly 0600 whatever it is. */
    if (fchmod(fd, 0600) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(name);
        fy_error("cannot set mode 0600 on shared memory %s: %s", name, strerror(e));
        return -e;
    }
    uint64_t size = fy_pool_layout_size(regions, n);
    uint8_t *base = NULL;
    int huge = 0;
    int rc = map_and_reserve(fd, name, size, opts, &base, &huge);
    close(fd);
    if (rc < 0) {
        shm_unlink(name);
        return rc;
    }
    struct pool_header *h = (struct pool_header *)base;
    memset(h, 0, sizeof *h);
    h->version = FY_POOL_VERSION;
    h->size = size;
    h->owner_pid = (int32_t)getpid();
    h->owner_start = process_start_time(getpid());
    h->created_unix = (uint64_t)time(NULL);
    if (opts != NULL && opts->run_dir != NULL)
        snprintf(h->run_dir, sizeof h->run_dir, "%s", opts->run_dir);
    uint64_t end = FY_POOL_ALIGN;
    for (unsigned i = 0; i < n; i++) {
        uint64_t start = align_up(end + FY_POOL_GUARD_BYTES, FY_POOL_ALIGN);
        snprintf(h->regions[i].name, FY_POOL_REGION_NAME, "%s", regions[i].name);
        h->regions[i].offset = start;
        h->regions[i].bytes = regions[i].bytes;
        end = align_up(start + regions[i].bytes, FY_POOL_GUARD_BYTES) + FY_POOL_GUARD_BYTES;
    }
    h->region_count = (int32_t)n;
    write_guards(base, h);
    __atomic_store_n(&h->magic, FY_POOL_MAGIC, __ATOMIC_RELEASE); /* published last */

    struct fy_pool *p = calloc(1, sizeof *p);
    if (p == NULL) {
        munmap(base, size);
        shm_unlink(name);
        return -ENOMEM;
    }
    snprintf(p->name, sizeof p->name, "%s", name);
    p->owner = 1;
    p->huge = huge;
    p->size = size;
    p->base = base;
    char human[32];
    fy_format_size(size, human, sizeof human);
    fy_info("shared pool %s: %s in %u regions, %s pages%s", name, human, n,
            huge ? "huge (THP)" : "4 KiB",
            opts && opts->numa_node >= 0 ? ", NUMA-bound" : "");
    *out = p;
    return 0;
}

int fy_pool_attach(struct fy_pool **out, const char *name)
{
    *out = NULL;
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    FY_SYS(fd, "cannot open shared pool %s (did the launcher start this run?)", name);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        fy_error("fstat of shared pool %s: %s", name, strerror(e));
        return -e;
    }
    if ((uint64_t)st.st_size < sizeof(struct pool_header)) {
        close(fd);
        fy_error("shared pool %s is %lld bytes, too small for a pool header", name,
                 (long long)st.st_size);
        return -EBADMSG;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    FY_REQUIRE(m != MAP_FAILED, -e, "cannot map shared pool %s: %s", name, strerror(e));
    const struct pool_header *h = m;
    const char *bad = NULL;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != FY_POOL_MAGIC)
        bad = "bad magic";
    else if (h->version != FY_POOL_VERSION)
        bad = "pool version differs from this build (mixed builds? rebuild and restart the run)";
    else if (h->size != (uint64_t)st.st_size)
        bad = "size in header differs from the object's size";
    else if (h->region_count < 0 || h->region_count > FY_POOL_MAX_REGIONS)
        bad = "bad region count";
    if (bad != NULL) {
        munmap(m, (size_t)st.st_size);
        fy_error("shared pool %s: %s", name, bad);
        return -EBADMSG;
    }
    struct fy_pool *p = calloc(1, sizeof *p);
    if (p == NULL) {
        munmap(m, (size_t)st.st_size);
        return -ENOMEM;
    }
    snprintf(p->name, sizeof p->name, "%s", name);
    p->size = h->size;
    p->base = m;
    *out = p;
    return 0;
}

void fy_pool_destroy(struct fy_pool **pp)
{
    if (pp == NULL || *pp == NULL)
        return;
    struct fy_pool *p = *pp;
    munmap(p->base, p->size);
    if (p->owner && shm_unlink(p->name) != 0 && errno != ENOENT)
        fy_warn("cannot remove shared memory %s: %s; remove /dev/shm%s by hand", p->name,
                strerror(errno), p->name);
    free(p);
    *pp = NULL;
}

const char *fy_pool_name(const struct fy_pool *p) { return p->name; }
void *fy_pool_base(const struct fy_pool *p) { return p->base; }
uint64_t fy_pool_size(const struct fy_pool *p) { return p->size; }
int fy_pool_uses_huge_pages(const struct fy_pool *p) { return p->huge; }

void *fy_pool_at(const struct fy_pool *p, uint64_t offset, uint64_t bytes)
{
    if (offset > p->size || bytes > p->size - offset)
        return NULL;
    return p->base + offset;
}

int fy_pool_has_region(const struct fy_pool *p, const char *name)
{
    const struct pool_header *h = (const struct pool_header *)p->base;
    for (int i = 0; i < h->region_count; i++)
        if (strcmp(h->regions[i].name, name) == 0)
            return 1;
    return 0;
}

int fy_pool_region(const struct fy_pool *p, const char *name, uint64_t *offset, uint64_t *bytes)
{
    const struct pool_header *h = (const struct pool_header *)p->base;
    for (int i = 0; i < h->region_count; i++)
        if (strcmp(h->regions[i].name, name) == 0) {
            *offset = h->regions[i].offset;
            *bytes = h->regions[i].bytes;
            return 0;
        }
    fy_error("shared pool %s has no region '%s'", p->name, name);
    return -ENOENT;
}

int fy_pool_check_guards(const struct fy_pool *p)
{
    const struct pool_header *h = (const struct pool_header *)p->base;
    for (int r = 0; r < h->region_count; r++)
        for (int after = 0; after < 2; after++)
            for (unsigned i = 0; i < FY_POOL_GUARD_BYTES / 8; i++) {
                uint64_t word;
                memcpy(&word, guard_at(p->base, &h->regions[r], after) + 8 * i, 8);
                if (word == guard_word((unsigned)r, after, i))
                    continue;
                fy_error("shared pool %s: guard %s region '%s' overwritten (a write ran %s)",
                         p->name, after ? "after" : "before", h->regions[r].name,
                         after ? "past its end" : "before its start");
                return -EFAULT;
            }
    return 0;
}

int fy_slots_init(struct fy_slots *s, const struct fy_pool *p, const char *region,
                  uint64_t slot_bytes)
{
    memset(s, 0, sizeof *s);
    uint64_t off, bytes;
    FY_TRY(fy_pool_region(p, region, &off, &bytes));
    FY_REQUIRE(slot_bytes > 0, -EINVAL, "slots of region '%s': slot size 0", region);
    s->slot_bytes = align_up(slot_bytes, 4096);
    uint64_t count = bytes / s->slot_bytes;
    FY_REQUIRE(count > 0 && count < (1u << 30), -EINVAL,
               "region '%s' (%llu bytes) cannot hold slots of %llu bytes", region,
               (unsigned long long)bytes, (unsigned long long)s->slot_bytes);
    s->base = off;
    s->count = (unsigned)count;
    s->used = calloc((count + 63) / 64, sizeof *s->used);
    if (s->used == NULL)
        return -ENOMEM;
    snprintf(s->region, sizeof s->region, "%s", region);
    return 0;
}

void fy_slots_destroy(struct fy_slots *s)
{
    free(s->used);
    memset(s, 0, sizeof *s);
}

int fy_slots_alloc(struct fy_slots *s, uint64_t *offset)
{
    for (unsigned i = 0; i < s->count; i++) {
        if (!(s->used[i / 64] & (1ull << (i % 64)))) {
            s->used[i / 64] |= 1ull << (i % 64);
            s->in_use++;
            *offset = s->base + (uint64_t)i * s->slot_bytes;
            return 0;
        }
    }
    return -ENOSPC;
}

int fy_slots_free(struct fy_slots *s, uint64_t offset)
{
    if (offset < s->base || (offset - s->base) % s->slot_bytes != 0 ||
        (offset - s->base) / s->slot_bytes >= s->count) {
        fy_error("slot free in region '%s': offset %llu is not the start of a slot", s->region,
                 (unsigned long long)offset);
        return -EINVAL;
    }
    unsigned i = (unsigned)((offset - s->base) / s->slot_bytes);
    if (!(s->used[i / 64] & (1ull << (i % 64)))) {
        fy_error("slot free in region '%s': slot %u is not in use (freed twice?)", s->region, i);
        return -EINVAL;
    }
    s->used[i / 64] &= ~(1ull << (i % 64));
    s->in_use--;
    return 0;
}
