/* The SSD store: data files with a checked header in every SSD path, an index of extents in the
 * first path, and the striping arithmetic that turns an extent range into ring requests. Headers
 * and the index are checked on open so that a store is never used with a different path list. */
#include "io_worker/store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/base/check.h"
#include "common/base/fsutil.h"
#include "common/base/log.h"
#include "io_worker/direct.h"

#define ALIGN 4096u
#define MAX_PATHS 256u
/* Index file: 16 int32 header slots, then fixed-size records. */
#define IDX_HDR_BYTES 64u
#define IDX_REC_BYTES 32u
enum { IDX_MAGIC = 0, IDX_VERSION, IDX_COUNT, IDX_ID_LO, IDX_ID_HI, IDX_STRIPE_KIB, IDX_PATHS,
       IDX_CHECKSUM };

struct fy_store {
    unsigned n;
    char **dirs;
    char **names; /* data file paths, for messages and the ring */
    int *fds;
    uint64_t *fsize; /* current size of each data file */
    size_t su;
    uint64_t id;
    char *idx_path, *idx_tmp;
    struct fy_extent *ext; /* allocation order */
    unsigned *by_tensor;   /* indexes into ext, sorted by tensor id */
    unsigned count, cap;
    uint64_t next_logical;
    int readonly; /* fy_store_opts.readonly: writes and new extents refused */
};

static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static uint64_t get64(const unsigned char *p) { return get32(p) | (uint64_t)get32(p + 4) << 32; }

static void put64(unsigned char *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

/* FNV-1a over a buffer, with the 4-byte checksum slot at skip read as zero. */
static uint32_t checksum(const unsigned char *p, size_t n, size_t skip)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (i >= skip && i < skip + 4) ? 0 : p[i];
        h = (h ^ c) * 16777619u;
    }
    return h;
}

static uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

static char *join(const char *dir, const char *name)
{
    char *p = NULL;
    if (asprintf(&p, "%s/%s", dir, name) < 0)
        return NULL;
    return p;
}

static int stripe_check(size_t su)
{
    FY_REQUIRE(su >= ALIGN && su % ALIGN == 0 && (su & (su - 1)) == 0 && su <= ((size_t)1 << 30),
               -EINVAL,
               "store: stripe unit %zu bytes must be a power of two between 4 KiB and 1 GiB "
               "(e.g. 1M)",
               su);
    return 0;
}

static void hdr_build(unsigned char *h, unsigned index, unsigned n, size_t su, uint64_t id)
{
    memset(h, 0, FY_STORE_HEADER_BYTES);
    put32(h + 4 * FY_STORE_HDR_MAGIC, FY_STORE_MAGIC);
    put32(h + 4 * FY_STORE_HDR_VERSION, FY_STORE_VERSION);
    put32(h + 4 * FY_STORE_HDR_PATH_INDEX, index);
    put32(h + 4 * FY_STORE_HDR_PATH_COUNT, n);
    put32(h + 4 * FY_STORE_HDR_STRIPE_KIB, (uint32_t)(su / 1024));
    put32(h + 4 * FY_STORE_HDR_ID_LO, (uint32_t)id);
    put32(h + 4 * FY_STORE_HDR_ID_HI, (uint32_t)(id >> 32));
    put32(h + 4 * FY_STORE_HDR_CHECKSUM,
          checksum(h, FY_STORE_HEADER_BYTES, 4 * FY_STORE_HDR_CHECKSUM));
}

static const char *order_hint = "pass the same --ssd list in the same order as at creation";

/* Checks the header of the data file given as path i of n. The first path fixes id and su. */
static int hdr_check(struct fy_store *s, const unsigned char *h, unsigned i)
{
    const char *name = s->names[i];
    uint32_t magic = get32(h + 4 * FY_STORE_HDR_MAGIC);
    FY_REQUIRE(magic == FY_STORE_MAGIC, -EINVAL,
               "%s at offset 0: magic 0x%08x is not a Fuyou store data file (0x%08x): the file is "
               "damaged or not ours; recreate the store (init with overwrite)",
               name, magic, FY_STORE_MAGIC);
    uint32_t version = get32(h + 4 * FY_STORE_HDR_VERSION);
    FY_REQUIRE(version == FY_STORE_VERSION, -EINVAL,
               "%s at offset 4: store version %u, this build reads version %d: use the matching "
               "Fuyou build or recreate the store",
               name, version, FY_STORE_VERSION);
    uint32_t want = get32(h + 4 * FY_STORE_HDR_CHECKSUM);
    uint32_t got = checksum(h, FY_STORE_HEADER_BYTES, 4 * FY_STORE_HDR_CHECKSUM);
    FY_REQUIRE(want == got, -EINVAL,
               "%s at offset 28: stored header checksum 0x%08x but the header sums to 0x%08x: "
               "the header is damaged; recreate the store",
               name, want, got);
    uint32_t count = get32(h + 4 * FY_STORE_HDR_PATH_COUNT);
    FY_REQUIRE(count == s->n, -EINVAL, "%s was created with %u paths, %u given: %s", name, count,
               s->n, order_hint);
    uint32_t index = get32(h + 4 * FY_STORE_HDR_PATH_INDEX);
    FY_REQUIRE(index == i, -EINVAL, "%s is path %u of its store but was given as path %u: %s",
               name, index + 1, i + 1, order_hint);
    uint64_t id = get32(h + 4 * FY_STORE_HDR_ID_LO) | (uint64_t)get32(h + 4 * FY_STORE_HDR_ID_HI)
                                                          << 32;
    size_t su = (size_t)get32(h + 4 * FY_STORE_HDR_STRIPE_KIB) * 1024;
    if (i == 0) {
        FY_TRY(stripe_check(su));
        FY_REQUIRE(s->su == 0 || s->su == su, -EINVAL,
                   "%s was created with stripe unit %zu KiB, %zu KiB given: give the same stripe "
                   "unit or none",
                   name, su / 1024, s->su / 1024);
        s->su = su;
        s->id = id;
        return 0;
    }
    FY_REQUIRE(id == s->id, -EINVAL,
               "%s belongs to store %016" PRIx64 " but %s belongs to store %016" PRIx64
               ": these paths hold different stores; %s",
               name, id, s->names[0], s->id, order_hint);
    FY_REQUIRE(su == s->su, -EINVAL, "%s has stripe unit %zu KiB but %s has %zu KiB: %s", name,
               su / 1024, s->names[0], s->su / 1024, order_hint);
    return 0;
}


static int sorted_pos(const struct fy_store *s, uint32_t tensor, int *found)
{
    unsigned lo = 0, hi = s->count;
    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;
        uint32_t t = s->ext[s->by_tensor[mid]].tensor;
        if (t < tensor)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = lo < s->count && s->ext[s->by_tensor[lo]].tensor == tensor;
    return (int)lo;
}

static int ext_append(struct fy_store *s, const struct fy_extent *e)
{
    int found;
    int pos = sorted_pos(s, e->tensor, &found);
    FY_REQUIRE(!found, -EEXIST, "store: tensor %u already has an extent", e->tensor);
    if (s->count == s->cap) {
        unsigned cap = s->cap ? s->cap * 2 : 64;
        struct fy_extent *ne = realloc(s->ext, cap * sizeof *ne);
        FY_REQUIRE(ne != NULL, -ENOMEM, "store: out of memory for %u extents", cap);
        s->ext = ne;
        unsigned *nb = realloc(s->by_tensor, cap * sizeof *nb);
        FY_REQUIRE(nb != NULL, -ENOMEM, "store: out of memory for %u extents", cap);
        s->by_tensor = nb;
        s->cap = cap;
    }
    s->ext[s->count] = *e;
    memmove(s->by_tensor + pos + 1, s->by_tensor + pos, (s->count - (unsigned)pos) * sizeof(unsigned));
    s->by_tensor[pos] = s->count;
    s->count++;
    return 0;
}

/* Drops the most recently appended extent (a failed add). */
static void ext_pop(struct fy_store *s)
{
    unsigned last = s->count - 1;
    for (unsigned i = 0; i < s->count; i++) {
        if (s->by_tensor[i] == last) {
            memmove(s->by_tensor + i, s->by_tensor + i + 1, (s->count - i - 1) * sizeof(unsigned));
            break;
        }
    }
    s->count--;
}

/* Writes the index to a temporary file, fsyncs it, renames it over the index, fsyncs the dir. */
static int index_write(struct fy_store *s)
{
    size_t len = IDX_HDR_BYTES + (size_t)s->count * IDX_REC_BYTES;
    unsigned char *b = calloc(1, len);
    FY_REQUIRE(b != NULL, -ENOMEM, "store: out of memory for the index (%zu bytes)", len);
    put32(b + 4 * IDX_MAGIC, FY_STORE_INDEX_MAGIC);
    put32(b + 4 * IDX_VERSION, FY_STORE_VERSION);
    put32(b + 4 * IDX_COUNT, s->count);
    put32(b + 4 * IDX_ID_LO, (uint32_t)s->id);
    put32(b + 4 * IDX_ID_HI, (uint32_t)(s->id >> 32));
    put32(b + 4 * IDX_STRIPE_KIB, (uint32_t)(s->su / 1024));
    put32(b + 4 * IDX_PATHS, s->n);
    for (unsigned i = 0; i < s->count; i++) {
        unsigned char *r = b + IDX_HDR_BYTES + (size_t)i * IDX_REC_BYTES;
        put32(r, s->ext[i].tensor);
        put64(r + 8, s->ext[i].logical_offset);
        put64(r + 16, s->ext[i].bytes);
    }
    put32(b + 4 * IDX_CHECKSUM, checksum(b, len, 4 * IDX_CHECKSUM));
    int fd = open(s->idx_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        free(b);
        fy_error("store: creating %s: %s; the first ssd path must be writable", s->idx_tmp,
                 strerror(e));
        return -e;
    }
    int rc = fy_write_all(fd, b, len, s->idx_tmp, 0);
    free(b);
    if (rc == 0 && fsync(fd) < 0) {
        rc = -errno;
        fy_error("store: fsync %s: %s; check the device", s->idx_tmp, strerror(-rc));
    }
    close(fd);
    if (rc == 0 && rename(s->idx_tmp, s->idx_path) < 0) {
        rc = -errno;
        fy_error("store: renaming %s to %s: %s", s->idx_tmp, s->idx_path, strerror(-rc));
    }
    if (rc < 0) {
        unlink(s->idx_tmp);
        return rc;
    }
    return fy_fsync_dir(s->dirs[0]);
}

static int index_read(struct fy_store *s)
{
    size_t len = 0;
    int fd = open(s->idx_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        fy_error("store: opening the index %s: %s; it lives in the first ssd path: %s",
                 s->idx_path, strerror(e), order_hint);
        return -e;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        fy_error("store: fstat %s: %s", s->idx_path, strerror(e));
        return -e;
    }
    len = (size_t)st.st_size;
    unsigned char *b = malloc(len ? len : 1);
    if (b == NULL) {
        close(fd);
        fy_error("store: out of memory reading %s (%zu bytes)", s->idx_path, len);
        return -ENOMEM;
    }
    size_t got = 0;
    int rc = 0;
    while (got < len) {
        ssize_t r = pread(fd, b + got, len - got, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = r < 0 ? -errno : -EIO;
            fy_error("store: reading %s at offset %zu: %s", s->idx_path, got,
                     r < 0 ? strerror(-rc) : "unexpected end of file");
            break;
        }
        got += (size_t)r;
    }
    close(fd);
    if (rc < 0)
        goto out;
    rc = -EINVAL;
    if (len < IDX_HDR_BYTES || get32(b + 4 * IDX_MAGIC) != FY_STORE_INDEX_MAGIC) {
        fy_error("store: %s at offset 0 is not a Fuyou store index (size %zu, bad magic): "
                 "recreate the store",
                 s->idx_path, len);
        goto out;
    }
    if (get32(b + 4 * IDX_VERSION) != FY_STORE_VERSION) {
        fy_error("store: %s at offset 4: index version %u, this build reads %d: use the matching "
                 "build or recreate the store",
                 s->idx_path, get32(b + 4 * IDX_VERSION), FY_STORE_VERSION);
        goto out;
    }
    uint32_t count = get32(b + 4 * IDX_COUNT);
    if (len != IDX_HDR_BYTES + (size_t)count * IDX_REC_BYTES ||
        get32(b + 4 * IDX_CHECKSUM) != checksum(b, len, 4 * IDX_CHECKSUM)) {
        fy_error("store: %s is damaged (%zu bytes for %u records, or checksum mismatch): "
                 "recreate the store",
                 s->idx_path, len, count);
        goto out;
    }
    uint64_t id = get32(b + 4 * IDX_ID_LO) | (uint64_t)get32(b + 4 * IDX_ID_HI) << 32;
    if (id != s->id || (size_t)get32(b + 4 * IDX_STRIPE_KIB) * 1024 != s->su ||
        get32(b + 4 * IDX_PATHS) != s->n) {
        fy_error("store: %s belongs to store %016" PRIx64 " (%u paths, stripe %u KiB) but the data "
                 "files to store %016" PRIx64 " (%u paths, stripe %zu KiB): %s",
                 s->idx_path, id, get32(b + 4 * IDX_PATHS), get32(b + 4 * IDX_STRIPE_KIB), s->id,
                 s->n, s->su / 1024, order_hint);
        goto out;
    }
    uint64_t end = 0;
    for (uint32_t i = 0; i < count; i++) {
        const unsigned char *r = b + IDX_HDR_BYTES + (size_t)i * IDX_REC_BYTES;
        struct fy_extent e = {.tensor = get32(r), .logical_offset = get64(r + 8),
                              .bytes = get64(r + 16)};
        if (e.logical_offset % s->su != 0 || e.logical_offset < end ||
            e.bytes > UINT64_MAX / 2) {
            fy_error("store: %s record %u at offset %zu (tensor %u, offset %" PRIu64
                     ") is out of order or misaligned: the index is damaged; recreate the store",
                     s->idx_path, i, IDX_HDR_BYTES + (size_t)i * IDX_REC_BYTES, e.tensor,
                     e.logical_offset);
            goto out;
        }
        rc = ext_append(s, &e);
        if (rc < 0) {
            fy_error("store: %s lists tensor %u twice: the index is damaged", s->idx_path,
                     e.tensor);
            goto out;
        }
        rc = -EINVAL;
        end = e.logical_offset + round_up(e.bytes, ALIGN);
        if (end > s->next_logical)
            s->next_logical = round_up(end, s->su);
    }
    rc = 0;
out:
    free(b);
    return rc;
}

void fy_store_destroy(struct fy_store **sp)
{
    if (sp == NULL || *sp == NULL)
        return;
    struct fy_store *s = *sp;
    for (unsigned i = 0; i < s->n; i++) {
        if (s->fds && s->fds[i] >= 0)
            close(s->fds[i]);
        if (s->dirs)
            free(s->dirs[i]);
        if (s->names)
            free(s->names[i]);
    }
    free(s->dirs);
    free(s->names);
    free(s->fds);
    free(s->fsize);
    free(s->idx_path);
    free(s->idx_tmp);
    free(s->ext);
    free(s->by_tensor);
    free(s);
    *sp = NULL;
}

static int store_alloc(struct fy_store *s, const struct fy_store_opts *o)
{
    s->n = o->npaths;
    s->dirs = calloc(s->n, sizeof *s->dirs);
    s->names = calloc(s->n, sizeof *s->names);
    s->fds = malloc(s->n * sizeof *s->fds);
    s->fsize = calloc(s->n, sizeof *s->fsize);
    FY_REQUIRE(s->dirs && s->names && s->fds && s->fsize, -ENOMEM, "store: out of memory");
    for (unsigned i = 0; i < s->n; i++)
        s->fds[i] = -1;
    for (unsigned i = 0; i < s->n; i++) {
        s->dirs[i] = strdup(o->paths[i]);
        s->names[i] = join(o->paths[i], FY_STORE_DATA_NAME);
        FY_REQUIRE(s->dirs[i] && s->names[i], -ENOMEM, "store: out of memory");
    }
    s->idx_path = join(o->paths[0], FY_STORE_INDEX_NAME);
    s->idx_tmp = join(o->paths[0], FY_STORE_INDEX_NAME ".tmp");
    FY_REQUIRE(s->idx_path && s->idx_tmp, -ENOMEM, "store: out of memory");
    return 0;
}

static int paths_distinct(const struct fy_store_opts *o)
{
    struct stat a, b;
    for (unsigned i = 0; i < o->npaths; i++) {
        FY_SYS(stat(o->paths[i], &a), "ssd path %s", o->paths[i]);
        for (unsigned j = 0; j < i; j++) {
            FY_SYS(stat(o->paths[j], &b), "ssd path %s", o->paths[j]);
            FY_REQUIRE(a.st_dev != b.st_dev || a.st_ino != b.st_ino, -EINVAL,
                       "ssd paths %s and %s are the same directory: give each path once",
                       o->paths[j], o->paths[i]);
        }
    }
    return 0;
}

static int store_create(struct fy_store *s, const struct fy_store_opts *o)
{
    if (!o->overwrite) {
        for (unsigned i = 0; i < s->n; i++)
            FY_REQUIRE(access(s->names[i], F_OK) != 0, -EEXIST,
                       "ssd path %s already holds a Fuyou store (%s): open it instead, or create "
                       "with overwrite to replace it (its data is lost)",
                       s->dirs[i], s->names[i]);
        FY_REQUIRE(access(s->idx_path, F_OK) != 0, -EEXIST,
                   "ssd path %s already holds a Fuyou store index (%s): open it instead, or create "
                   "with overwrite to replace it",
                   s->dirs[0], s->idx_path);
    }
    s->su = o->stripe_unit ? o->stripe_unit : FY_STORE_DEFAULT_STRIPE;
    FY_TRY(stripe_check(s->su));
    ssize_t g = getrandom(&s->id, sizeof s->id, 0);
    FY_REQUIRE(g == (ssize_t)sizeof s->id, g < 0 ? -errno : -EIO,
               "store: getrandom for the store id failed");
    unsigned char *h = NULL;
    FY_REQUIRE(posix_memalign((void **)&h, ALIGN, FY_STORE_HEADER_BYTES) == 0, -ENOMEM,
               "store: out of memory");
    int rc = 0;
    for (unsigned i = 0; i < s->n && rc == 0; i++) {
        s->fds[i] = open(s->names[i], O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
        if (s->fds[i] < 0) {
            rc = -errno;
            fy_error("store: creating %s: %s", s->names[i], strerror(-rc));
            break;
        }
        hdr_build(h, i, s->n, s->su, s->id);
        ssize_t w = pwrite(s->fds[i], h, FY_STORE_HEADER_BYTES, 0);
        if (w != (ssize_t)FY_STORE_HEADER_BYTES) {
            rc = w < 0 ? -errno : -EIO;
            fy_error("store: writing the header of %s at offset 0: %s", s->names[i],
                     w < 0 ? strerror(-rc) : "short write");
            break;
        }
        if (fsync(s->fds[i]) < 0) {
            rc = -errno;
            fy_error("store: fsync %s: %s", s->names[i], strerror(-rc));
        }
        s->fsize[i] = FY_STORE_HEADER_BYTES;
    }
    free(h);
    FY_TRY(rc);
    FY_TRY(index_write(s));
    fy_info("store: created store %016" PRIx64 " over %u paths (stripe unit %zu KiB)", s->id, s->n,
            s->su / 1024);
    return 0;
}

static int store_load(struct fy_store *s, const struct fy_store_opts *o)
{
    s->su = o->stripe_unit;
    if (s->su)
        FY_TRY(stripe_check(s->su));
    unsigned char *h = NULL;
    FY_REQUIRE(posix_memalign((void **)&h, ALIGN, FY_STORE_HEADER_BYTES) == 0, -ENOMEM,
               "store: out of memory");
    int rc = 0;
    for (unsigned i = 0; i < s->n && rc == 0; i++) {
        s->fds[i] = open(s->names[i], (o->readonly ? O_RDONLY : O_RDWR) | O_DIRECT | O_CLOEXEC);
        if (s->fds[i] < 0) {
            rc = -errno;
            if (rc == -ENOENT)
                fy_error("store: ssd path %s holds no Fuyou store (%s is missing): create one "
                         "first, or %s",
                         s->dirs[i], s->names[i], order_hint);
            else
                fy_error("store: opening %s: %s", s->names[i], strerror(-rc));
            break;
        }
        struct stat st;
        if (fstat(s->fds[i], &st) < 0) {
            rc = -errno;
            fy_error("store: fstat %s: %s", s->names[i], strerror(-rc));
            break;
        }
        s->fsize[i] = (uint64_t)st.st_size;
        ssize_t r = st.st_size >= FY_STORE_HEADER_BYTES
                        ? pread(s->fds[i], h, FY_STORE_HEADER_BYTES, 0)
                        : 0;
        if (r != (ssize_t)FY_STORE_HEADER_BYTES) {
            rc = r < 0 ? -errno : -EINVAL;
            fy_error("store: reading the header of %s at offset 0: %s", s->names[i],
                     r < 0 ? strerror(-rc) : "file shorter than a header; recreate the store");
            break;
        }
        rc = hdr_check(s, h, i);
    }
    free(h);
    FY_TRY(rc);
    return index_read(s);
}

int fy_store_open(struct fy_store **out, const struct fy_store_opts *o)
{
    *out = NULL;
    FY_REQUIRE(o && o->paths && o->npaths > 0 && o->npaths <= MAX_PATHS, -EINVAL,
               "store: give between 1 and %u ssd paths", MAX_PATHS);
    FY_REQUIRE(!o->readonly || !o->create, -EINVAL, "store: a store opened read-only is not "
               "created");
    for (unsigned i = 0; i < o->npaths; i++) {
        FY_REQUIRE(o->paths[i] && o->paths[i][0], -EINVAL, "store: ssd path %u is empty", i + 1);
        if (!o->readonly) /* a reader writes nothing, not even the probe */
            FY_TRY(fy_direct_check(o->paths[i]));
    }
    FY_TRY(paths_distinct(o));
    struct fy_store *s = calloc(1, sizeof *s);
    FY_REQUIRE(s != NULL, -ENOMEM, "store: out of memory");
    s->readonly = o->readonly;
    int rc = store_alloc(s, o);
    if (rc == 0)
        rc = o->create ? store_create(s, o) : store_load(s, o);
    if (rc < 0) {
        fy_store_destroy(&s);
        return rc;
    }
    *out = s;
    return 0;
}

/* Size data file p must have so that every byte of logical [0, end) striped to it exists. */
static uint64_t file_need(const struct fy_store *s, unsigned p, uint64_t end)
{
    if (end == 0)
        return FY_STORE_HEADER_BYTES;
    uint64_t last = (end - 1) / s->su;
    if (last < p)
        return FY_STORE_HEADER_BYTES;
    uint64_t up = last - (last - p) % s->n;
    uint64_t in_unit = up == last ? (end - 1) % s->su + 1 : s->su;
    return FY_STORE_HEADER_BYTES + (up / s->n) * s->su + in_unit;
}

static int file_grow(struct fy_store *s, unsigned p, uint64_t need)
{
    if (need <= s->fsize[p])
        return 0;
    uint64_t have = s->fsize[p];
    if (fallocate(s->fds[p], 0, (off_t)have, (off_t)(need - have)) < 0) {
        int e = errno;
        if (e != EOPNOTSUPP) {
            /* a failed fallocate can keep what it got: given back, so the disk is as before */
            if (ftruncate(s->fds[p], (off_t)have) != 0)
                fy_warn("store: cannot cut %s back to %" PRIu64 " bytes: %s", s->names[p], have,
                        strerror(errno));
            fy_error("store: growing %s from %" PRIu64 " to %" PRIu64 " bytes: %s; %s",
                     s->names[p], have, need, strerror(e),
                     e == ENOSPC ? "the SSD is full: free space or add another ssd path"
                                 : "check the filesystem");
            return -e;
        }
        fy_debug("store: fallocate not supported for %s; extending with ftruncate", s->names[p]);
        FY_SYS(ftruncate(s->fds[p], (off_t)need), "store: growing %s to %" PRIu64 " bytes",
               s->names[p], need);
    }
    s->fsize[p] = need;
    return 0;
}

int fy_store_add_extent(struct fy_store *s, uint32_t tensor, uint64_t bytes)
{
    FY_REQUIRE(!s->readonly, -EROFS, "store: no extent is added to a store opened read-only (by "
               "an export), tensor %u", tensor);
    FY_REQUIRE(bytes <= UINT64_MAX / 4, -EINVAL, "store: extent of %" PRIu64 " bytes is too big",
               bytes);
    struct fy_extent e = {.tensor = tensor, .logical_offset = s->next_logical, .bytes = bytes};
    uint64_t end = e.logical_offset + round_up(bytes, ALIGN);
    for (unsigned p = 0; p < s->n; p++)
        FY_TRY(file_grow(s, p, file_need(s, p, end)));
    FY_TRY(ext_append(s, &e));
    uint64_t prev_next = s->next_logical;
    s->next_logical = round_up(end, s->su);
    int rc = index_write(s);
    if (rc < 0) {
        ext_pop(s);
        s->next_logical = prev_next;
        return rc;
    }
    return 0;
}

int fy_store_find(const struct fy_store *s, uint32_t tensor, struct fy_extent *out)
{
    int found;
    int pos = sorted_pos(s, tensor, &found);
    if (!found)
        return -ENOENT;
    if (out)
        *out = s->ext[s->by_tensor[pos]];
    return 0;
}

unsigned fy_store_extent_count(const struct fy_store *s) { return s->count; }

int fy_store_extent_at(const struct fy_store *s, unsigned i, struct fy_extent *out)
{
    FY_REQUIRE(i < s->count, -ERANGE, "store: extent %u asked for, %u exist", i, s->count);
    *out = s->ext[i];
    return 0;
}

unsigned fy_store_file_count(const struct fy_store *s) { return s->n; }
const int *fy_store_fds(const struct fy_store *s) { return s->fds; }
const char *const *fy_store_file_names(const struct fy_store *s)
{
    return (const char *const *)s->names;
}
size_t fy_store_stripe_unit(const struct fy_store *s) { return s->su; }
uint64_t fy_store_id(const struct fy_store *s) { return s->id; }

int fy_store_map(const struct fy_store *s, uint32_t tensor, uint64_t offset, size_t len, void *buf,
                 enum fy_io_dir dir, uint64_t tag, struct fy_io_req *reqs, unsigned max)
{
    FY_REQUIRE(dir != FY_IO_WRITE || !s->readonly, -EROFS,
               "store: tensor %u is not written: the store is opened read-only (by an export)",
               tensor);
    struct fy_extent e;
    int rc = fy_store_find(s, tensor, &e);
    FY_REQUIRE(rc == 0, rc, "store: tensor %u has no extent in the store: add it first", tensor);
    FY_REQUIRE(offset % ALIGN == 0 && len % ALIGN == 0 && (uintptr_t)buf % ALIGN == 0, -EINVAL,
               "store: tensor %u range at offset %" PRIu64 " (%zu bytes, buffer %p) is not "
               "4096-aligned: O_DIRECT needs aligned ranges and buffers",
               tensor, offset, len, buf);
    uint64_t padded = round_up(e.bytes, ALIGN);
    FY_REQUIRE(offset <= padded && len <= padded - offset, -ERANGE,
               "store: range [%" PRIu64 ", %" PRIu64 ") is outside tensor %u's extent of %" PRIu64
               " bytes (%" PRIu64 " padded)",
               offset, offset + len, tensor, e.bytes, padded);
    unsigned n = 0;
    uint64_t start = e.logical_offset + offset, L = start, stop = start + len;
    while (L < stop) {
        uint64_t u = L / s->su, within = L % s->su;
        uint64_t chunk = s->su - within;
        if (chunk > stop - L)
            chunk = stop - L;
        unsigned p = (unsigned)(u % s->n);
        uint64_t foff = FY_STORE_HEADER_BYTES + (u / s->n) * s->su + within;
        char *b = (char *)buf + (L - start);
        struct fy_io_req *prev = n ? &reqs[n - 1] : NULL;
        if (prev && prev->file == p && prev->file_offset + prev->len == foff &&
            (char *)prev->buf + prev->len == b) {
            prev->len += (size_t)chunk;
        } else {
            FY_REQUIRE(n < max, -ENOSPC,
                       "store: tensor %u range at offset %" PRIu64 " (%zu bytes) needs more than "
                       "%u requests: pass a larger request array",
                       tensor, offset, len, max);
            reqs[n] = (struct fy_io_req){.dir = dir, .file = p, .file_offset = foff, .buf = b,
                                         .len = (size_t)chunk, .tag = tag};
            n++;
        }
        L += chunk;
    }
    return (int)n;
}

int fy_store_pread(const struct fy_store *s, uint32_t tensor, uint64_t offset, void *buf,
                   size_t len)
{
    unsigned max = (unsigned)(len / s->su) + 2;
    struct fy_io_req *reqs = malloc(max * sizeof *reqs);
    FY_REQUIRE(reqs != NULL, -ENOMEM, "store: out of memory for %u requests", max);
    int n = fy_store_map(s, tensor, offset, len, buf, FY_IO_READ, tensor, reqs, max), rc = 0;
    for (int i = 0; n > 0 && i < n && rc == 0; i++) {
        for (size_t done = 0; done < reqs[i].len && rc == 0;) {
            ssize_t got = pread(s->fds[reqs[i].file], (char *)reqs[i].buf + done,
                                reqs[i].len - done, (off_t)(reqs[i].file_offset + done));
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0) {
                rc = got < 0 ? -errno : -EIO;
                fy_error("store: reading tensor %u of %s at offset %" PRIu64 ": %s", tensor,
                         s->names[reqs[i].file], reqs[i].file_offset + done,
                         got < 0 ? strerror(-rc) : "the file ends there: the store is cut short");
            }
            done += got > 0 ? (size_t)got : 0;
        }
    }
    free(reqs);
    return n < 0 ? n : rc;
}

static int store_io(struct fy_store *s, struct fy_ring *r, uint32_t tensor, uint64_t offset,
                    void *buf, size_t len, enum fy_io_dir dir, int timeout_ms)
{
    unsigned max = (unsigned)(len / s->su) + 2;
    struct fy_io_req stackreqs[16];
    struct fy_io_req *reqs = max <= 16 ? stackreqs : malloc(max * sizeof *reqs);
    FY_REQUIRE(reqs != NULL, -ENOMEM, "store: out of memory for %u requests", max);
    int n = fy_store_map(s, tensor, offset, len, buf, dir, tensor, reqs, max);
    int rc = n < 0 ? n : fy_ring_run(r, reqs, (unsigned)n, timeout_ms);
    if (reqs != stackreqs)
        free(reqs);
    if (rc < 0 && n >= 0)
        fy_error("store: %s of tensor %u at offset %" PRIu64 " (%zu bytes) failed: %s",
                 dir == FY_IO_READ ? "read" : "write", tensor, offset, len, strerror(-rc));
    return rc;
}

int fy_store_read(struct fy_store *s, struct fy_ring *r, uint32_t tensor, uint64_t offset,
                  void *buf, size_t len, int timeout_ms)
{
    return store_io(s, r, tensor, offset, buf, len, FY_IO_READ, timeout_ms);
}

int fy_store_write(struct fy_store *s, struct fy_ring *r, uint32_t tensor, uint64_t offset,
                   const void *buf, size_t len, int timeout_ms)
{
    /* The ring only reads from buf for a write. */
    return store_io(s, r, tensor, offset, (void *)buf, len, FY_IO_WRITE, timeout_ms);
}

int fy_store_sync(struct fy_store *s)
{
    for (unsigned i = 0; i < s->n; i++)
        FY_SYS(fsync(s->fds[i]), "store: fsync %s", s->names[i]);
    return 0;
}
