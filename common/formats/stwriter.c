/* The safetensors writer (common/formats/stwriter.h): each file's header fixed from the
 * declarations, the data streamed into temporary files, renamed into place only once all of it is
 * written and synced; sharded with an index above a size, as Hugging Face writes them. The JSON is
 * printed by cJSON. */
#include "common/formats/stwriter.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/base/check.h"
#include "common/base/dtype.h"
#include "common/base/fsutil.h"
#include "common/formats/safetensors.h"

static int pwrite_all(int fd, const void *buf, size_t len, uint64_t off, const char *file,
                      const char *tensor)
{
    const uint8_t *p = buf;
    size_t done = 0;
    while (done < len) {
        ssize_t n = pwrite(fd, p + done, len - done, (off_t)(off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            fy_error("cannot write %s%s%s%s at offset %llu: %s%s", file, tensor ? " (tensor \"" : "",
                     tensor ? tensor : "", tensor ? "\")" : "", (unsigned long long)(off + done),
                     strerror(e),
                     e == ENOSPC || e == EFBIG ? " (disk full or file too large: free space or "
                                                 "choose another directory)"
                                               : "");
            return -e;
        }
        done += (size_t)n;
    }
    return 0;
}

struct st_decl {
    char *name;
    int dtype, ndim;
    uint64_t shape[FY_ST_MAX_DIMS];
    uint64_t nbytes, begin, filled;
    size_t shard;
};

struct st_out {
    char path[PATH_MAX], tmp[PATH_MAX + 8];
    int fd;
    int created, renamed;
    uint64_t data_start;
};

struct fy_st_writer {
    int sharded, overwrite;
    char target[PATH_MAX]; /* the file, or the directory of a sharded checkpoint */
    uint64_t max_shard;
    struct st_decl *d;
    size_t n, cap;
    struct st_decl **sorted;
    struct fy_st_meta *meta;
    size_t n_meta;
    struct st_out *out; /* the files, then (sharded, several files) the index last */
    size_t n_out, n_shards;
    int locked;
    int failed; /* -errno of an earlier failure: the writer can only be abandoned */
    uint16_t *stage;
};

static int cmp_decl_ptr(const void *a, const void *b)
{
    return strcmp((*(struct st_decl *const *)a)->name, (*(struct st_decl *const *)b)->name);
}

static int check_absent(const char *path, int overwrite)
{
    struct stat st;
    FY_REQUIRE(overwrite || lstat(path, &st) != 0, -EEXIST,
               "%s already exists: remove it or pass --overwrite", path);
    return 0;
}

static int check_dir(const char *dir, const char *for_path)
{
    struct stat st;
    int rc = stat(dir, &st) == 0 ? 0 : -errno;
    if (rc == 0 && !S_ISDIR(st.st_mode))
        rc = -ENOTDIR;
    FY_REQUIRE(rc == 0, rc, "cannot write %s: directory %s: %s (create it first)", for_path, dir,
               strerror(-rc));
    return 0;
}

static int writer_new(struct fy_st_writer **out, const char *target, int sharded,
                      uint64_t max_shard, int overwrite)
{
    *out = NULL;
    FY_REQUIRE(strlen(target) + 64 < PATH_MAX, -ENAMETOOLONG, "path too long: %.200s...", target);
    if (sharded) {
        FY_TRY(check_dir(target, target));
        FY_REQUIRE(max_shard > 0, -EINVAL, "%s: the shard size limit must be positive", target);
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", target, FY_ST_INDEX_NAME);
        FY_TRY(check_absent(p, overwrite));
        snprintf(p, sizeof p, "%s/%s", target, FY_ST_SINGLE_NAME);
        FY_TRY(check_absent(p, overwrite));
    } else {
        char copy[PATH_MAX];
        snprintf(copy, sizeof copy, "%s", target);
        FY_TRY(check_dir(dirname(copy), target));
        FY_TRY(check_absent(target, overwrite));
    }
    struct fy_st_writer *w = calloc(1, sizeof *w);
    FY_REQUIRE(w != NULL, -ENOMEM, "%s: out of memory", target);
    w->sharded = sharded;
    w->overwrite = overwrite;
    w->max_shard = max_shard;
    snprintf(w->target, sizeof w->target, "%s", target);
    *out = w;
    return 0;
}

int fy_st_writer_new(struct fy_st_writer **out, const char *path, int overwrite)
{
    return writer_new(out, path, 0, 0, overwrite);
}

int fy_st_writer_new_sharded(struct fy_st_writer **out, const char *dir, uint64_t max_shard_bytes,
                             int overwrite)
{
    return writer_new(out, dir, 1, max_shard_bytes, overwrite);
}

int fy_st_writer_declare(struct fy_st_writer *w, const char *name, int dtype, int ndim,
                         const uint64_t *shape)
{
    const char *where = w->target;
    FY_REQUIRE(!w->locked, -EINVAL,
               "%s: tensor \"%s\" declared after data was written: declare every tensor first",
               where, name);
    FY_REQUIRE(name[0] != 0 && strcmp(name, "__metadata__") != 0 && fy_st_utf8_ok(name), -EINVAL,
               "%s: tensor name \"%s\" is not allowed (empty, \"__metadata__\" or not UTF-8)",
               where, name);
    FY_REQUIRE(dtype == FY_ST_F32 || dtype == FY_ST_BF16, -EINVAL,
               "%s: tensor \"%s\": dtype %s cannot be written (F32 or BF16)", where, name,
               fy_st_dtype_name(dtype));
    FY_REQUIRE(ndim >= 0 && ndim <= FY_ST_MAX_DIMS && (ndim == 0 || shape != NULL), -EINVAL,
               "%s: tensor \"%s\": %d dimensions (0 to %d)", where, name, ndim, FY_ST_MAX_DIMS);
    struct st_decl d = {.dtype = dtype, .ndim = ndim};
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        d.shape[i] = shape[i];
        FY_REQUIRE(!__builtin_mul_overflow(numel, shape[i], &numel), -EINVAL,
                   "%s: tensor \"%s\": the shape's element count overflows", where, name);
    }
    FY_REQUIRE(!__builtin_mul_overflow(numel, (uint64_t)fy_st_dtype_size(dtype), &d.nbytes) &&
                   d.nbytes <= (uint64_t)FY_ST_MAX_JSON_INT,
               -EINVAL, "%s: tensor \"%s\": too large", where, name);
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        struct st_decl *nd = realloc(w->d, cap * sizeof *nd);
        FY_REQUIRE(nd != NULL, -ENOMEM, "%s: out of memory declaring tensors", where);
        w->d = nd;
        w->cap = cap;
    }
    d.name = strdup(name);
    FY_REQUIRE(d.name != NULL, -ENOMEM, "%s: out of memory declaring tensors", where);
    w->d[w->n++] = d;
    return 0;
}

int fy_st_writer_metadata(struct fy_st_writer *w, const char *key, const char *value)
{
    FY_REQUIRE(!w->locked, -EINVAL,
               "%s: metadata \"%s\" given after data was written: give metadata first", w->target,
               key);
    FY_REQUIRE(fy_st_utf8_ok(key) && fy_st_utf8_ok(value), -EINVAL, "%s: metadata \"%s\" is not UTF-8",
               w->target, key);
    for (size_t i = 0; i < w->n_meta; i++)
        FY_REQUIRE(strcmp(w->meta[i].key, key) != 0, -EINVAL, "%s: metadata \"%s\" given twice",
                   w->target, key);
    struct fy_st_meta *nm = realloc(w->meta, (w->n_meta + 1) * sizeof *nm);
    FY_REQUIRE(nm != NULL, -ENOMEM, "%s: out of memory", w->target);
    w->meta = nm;
    nm[w->n_meta] = (struct fy_st_meta){strdup(key), strdup(value)};
    w->n_meta++;
    FY_REQUIRE(nm[w->n_meta - 1].key && nm[w->n_meta - 1].value, -ENOMEM, "%s: out of memory",
               w->target);
    return 0;
}

/* The header of file `shard`: its tensors in declaration order, packed from offset 0, padded
 * with spaces to a multiple of 8 bytes as Hugging Face's writer does. Sets each decl's begin. */
static char *build_header(struct fy_st_writer *w, size_t shard, size_t *len)
{
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    if (ok && w->n_meta > 0) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        ok = m != NULL;
        for (size_t i = 0; ok && i < w->n_meta; i++)
            ok = cJSON_AddStringToObject(m, w->meta[i].key, w->meta[i].value) != NULL;
    }
    uint64_t at = 0;
    for (size_t i = 0; ok && i < w->n; i++) {
        struct st_decl *d = &w->d[i];
        if (d->shard != shard)
            continue;
        d->begin = at;
        at += d->nbytes;
        /* Integers printed by hand: cJSON prints doubles, which turn into exponents past 1e15. */
        char shape[FY_ST_SHAPE_CHARS], offs[48];
        fy_st_format_shape(shape, sizeof shape, d->ndim, d->shape);
        snprintf(offs, sizeof offs, "[%llu,%llu]", (unsigned long long)d->begin,
                 (unsigned long long)(d->begin + d->nbytes));
        cJSON *t = cJSON_AddObjectToObject(root, d->name);
        ok = t != NULL && cJSON_AddStringToObject(t, "dtype", fy_st_dtype_name(d->dtype)) &&
             cJSON_AddRawToObject(t, "shape", shape) &&
             cJSON_AddRawToObject(t, "data_offsets", offs);
    }
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (text == NULL)
        return NULL;
    size_t n = strlen(text), padded = (n + 7) / 8 * 8;
    char *out = realloc(text, padded + 1);
    if (out == NULL) {
        free(text);
        return NULL;
    }
    memset(out + n, ' ', padded - n);
    out[padded] = 0;
    *len = padded;
    return out;
}

static int create_out(struct fy_st_writer *w, struct st_out *o)
{
    snprintf(o->tmp, sizeof o->tmp, "%s.tmp", o->path);
    FY_TRY(check_absent(o->path, w->overwrite));
    o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    FY_SYS(o->fd, "cannot create %s (check that the directory exists and is writable)", o->tmp);
    o->created = 1;
    return 0;
}

/* Fixes the layout: assigns shards, names the files, writes each header to its temporary file. */
/* Shard k's header at the start of its file o: the length, then the JSON. */
static int write_header(struct fy_st_writer *w, size_t k, struct st_out *o)
{
    size_t len = 0;
    char *h = build_header(w, k, &len);
    FY_REQUIRE(h != NULL, -ENOMEM, "%s: out of memory building the header", o->path);
    uint8_t lenbuf[8];
    for (int i = 0; i < 8; i++)
        lenbuf[i] = (uint8_t)((uint64_t)len >> (8 * i));
    int rc = 0;
    FY_TRY_OUT(rc, pwrite_all(o->fd, lenbuf, 8, 0, o->tmp, NULL));
    FY_TRY_OUT(rc, pwrite_all(o->fd, h, len, 8, o->tmp, NULL));
    o->data_start = 8 + len;
out:
    free(h);
    return rc;
}

static int lock(struct fy_st_writer *w)
{
    w->locked = 1;
    w->sorted = malloc((w->n ? w->n : 1) * sizeof *w->sorted);
    FY_REQUIRE(w->sorted != NULL, -ENOMEM, "%s: out of memory", w->target);
    for (size_t i = 0; i < w->n; i++)
        w->sorted[i] = &w->d[i];
    qsort(w->sorted, w->n, sizeof *w->sorted, cmp_decl_ptr);
    for (size_t i = 1; i < w->n; i++)
        FY_REQUIRE(strcmp(w->sorted[i - 1]->name, w->sorted[i]->name) != 0, -EINVAL,
                   "%s: tensor \"%s\" declared twice", w->target, w->sorted[i]->name);
    /* Greedy in declaration order, as Hugging Face splits: a new shard when the next tensor
     * would overflow a non-empty one. */
    size_t shard = 0;
    uint64_t fill = 0;
    for (size_t i = 0; i < w->n; i++) {
        if (w->sharded && fill > 0 &&
            (fill >= w->max_shard || w->d[i].nbytes > w->max_shard - fill)) {
            shard++;
            fill = 0;
        }
        w->d[i].shard = shard;
        fill += w->d[i].nbytes;
    }
    w->n_shards = shard + 1;
    w->n_out = w->n_shards + (w->n_shards > 1);
    w->out = calloc(w->n_out, sizeof *w->out);
    FY_REQUIRE(w->out != NULL, -ENOMEM, "%s: out of memory", w->target);
    for (size_t k = 0; k < w->n_out; k++)
        w->out[k].fd = -1;
    for (size_t k = 0; k < w->n_out; k++) {
        struct st_out *o = &w->out[k];
        if (!w->sharded)
            snprintf(o->path, sizeof o->path, "%s", w->target);
        else if (w->n_shards == 1)
            snprintf(o->path, sizeof o->path, "%s/%s", w->target, FY_ST_SINGLE_NAME);
        else if (k < w->n_shards)
            snprintf(o->path, sizeof o->path, "%s/model-%05zu-of-%05zu.safetensors", w->target,
                     k + 1, w->n_shards);
        else
            snprintf(o->path, sizeof o->path, "%s/%s", w->target, FY_ST_INDEX_NAME);
        FY_TRY(create_out(w, o));
        if (k < w->n_shards)
            FY_TRY(write_header(w, k, o));
    }
    return 0;
}

static int ensure_locked(struct fy_st_writer *w)
{
    if (w->failed)
        return w->failed;
    if (!w->locked) {
        int rc = lock(w);
        if (rc < 0)
            w->failed = rc;
        return rc;
    }
    return 0;
}

static int find_decl(struct fy_st_writer *w, const char *name, struct st_decl **out)
{
    struct st_decl key = {.name = (char *)name};
    struct st_decl *kp = &key;
    struct st_decl **hit = bsearch(&kp, w->sorted, w->n, sizeof *w->sorted, cmp_decl_ptr);
    FY_REQUIRE(hit != NULL, -EINVAL, "%s: tensor \"%s\" was not declared: declare it first",
               w->target, name);
    *out = *hit;
    return 0;
}

static int put_bytes(struct fy_st_writer *w, struct st_decl *d, const void *src, uint64_t nbytes)
{
    struct st_out *o = &w->out[d->shard];
    int rc = pwrite_all(o->fd, src, nbytes, o->data_start + d->begin + d->filled, o->tmp, d->name);
    if (rc < 0) {
        w->failed = rc;
        return rc;
    }
    d->filled += nbytes;
    return 0;
}

static int check_room(const struct fy_st_writer *w, const struct st_decl *d, uint64_t nbytes)
{
    FY_REQUIRE(nbytes <= d->nbytes - d->filled, -EINVAL,
               "%s: tensor \"%s\": %llu more bytes given, but only %llu of its %llu remain",
               w->out[d->shard].path, d->name, (unsigned long long)nbytes,
               (unsigned long long)(d->nbytes - d->filled), (unsigned long long)d->nbytes);
    return 0;
}

int fy_st_writer_put_raw(struct fy_st_writer *w, const char *name, const void *src, uint64_t nbytes)
{
    FY_TRY(ensure_locked(w));
    struct st_decl *d;
    FY_TRY(find_decl(w, name, &d));
    FY_REQUIRE(nbytes % fy_st_dtype_size(d->dtype) == 0, -EINVAL,
               "%s: tensor \"%s\": %llu bytes is not a whole number of %s elements", w->target,
               name, (unsigned long long)nbytes, fy_st_dtype_name(d->dtype));
    FY_TRY(check_room(w, d, nbytes));
    return put_bytes(w, d, src, nbytes);
}

int fy_st_writer_put_f32(struct fy_st_writer *w, const char *name, const float *src, uint64_t n)
{
    FY_TRY(ensure_locked(w));
    struct st_decl *d;
    FY_TRY(find_decl(w, name, &d));
    FY_REQUIRE(n <= UINT64_MAX / 4, -EINVAL, "%s: tensor \"%s\": %llu elements is too many",
               w->target, name, (unsigned long long)n);
    FY_TRY(check_room(w, d, n * fy_st_dtype_size(d->dtype)));
    if (d->dtype == FY_ST_F32)
        return put_bytes(w, d, src, n * 4);
    if (w->stage == NULL) {
        w->stage = malloc(FY_ST_CHUNK);
        FY_REQUIRE(w->stage != NULL, -ENOMEM, "%s: out of memory for a write buffer", w->target);
    }
    for (uint64_t done = 0; done < n;) {
        uint64_t k = n - done < FY_ST_CHUNK / 2 ? n - done : FY_ST_CHUNK / 2;
        for (uint64_t i = 0; i < k; i++)
            w->stage[i] = fy_f32_to_bf16(src[done + i]);
        FY_TRY(put_bytes(w, d, w->stage, k * 2));
        done += k;
    }
    return 0;
}

static void writer_free(struct fy_st_writer *w)
{
    for (size_t i = 0; i < w->n; i++)
        free(w->d[i].name);
    for (size_t i = 0; i < w->n_meta; i++) {
        free(w->meta[i].key);
        free(w->meta[i].value);
    }
    free(w->d);
    free(w->sorted);
    free(w->meta);
    free(w->out);
    free(w->stage);
    free(w);
}

/* Closes and removes every temporary file, and every file this writer already renamed into place
 * (a checkpoint is only whole with all its files). */
static void writer_discard(struct fy_st_writer *w)
{
    for (size_t k = 0; k < w->n_out; k++) {
        struct st_out *o = &w->out[k];
        if (o->fd >= 0)
            close(o->fd);
        o->fd = -1;
        if (o->created && !o->renamed)
            unlink(o->tmp);
        if (o->renamed)
            unlink(o->path);
    }
}

void fy_st_writer_destroy(struct fy_st_writer **wp)
{
    struct fy_st_writer *w = wp ? *wp : NULL;
    if (w == NULL)
        return;
    writer_discard(w);
    writer_free(w);
    *wp = NULL;
}

static int write_index(struct fy_st_writer *w, struct st_out *o)
{
    uint64_t total = 0;
    for (size_t i = 0; i < w->n; i++)
        total += w->d[i].nbytes;
    char num[24];
    snprintf(num, sizeof num, "%llu", (unsigned long long)total);
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = root ? cJSON_AddObjectToObject(root, "metadata") : NULL;
    int ok = meta != NULL && cJSON_AddRawToObject(meta, "total_size", num);
    cJSON *map = ok ? cJSON_AddObjectToObject(root, "weight_map") : NULL;
    ok = map != NULL;
    for (size_t i = 0; ok && i < w->n; i++) {
        const char *file = strrchr(w->out[w->d[i].shard].path, '/') + 1;
        ok = cJSON_AddStringToObject(map, w->d[i].name, file) != NULL;
    }
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    FY_REQUIRE(text != NULL, -ENOMEM, "%s: out of memory building the index", o->path);
    size_t len = strlen(text);
    text[len] = '\n'; /* overwrites the terminator: the length is what counts from here */
    int rc = pwrite_all(o->fd, text, len + 1, 0, o->tmp, NULL);
    free(text);
    return rc;
}

static int finish(struct fy_st_writer *w)
{
    FY_TRY(ensure_locked(w));
    for (size_t i = 0; i < w->n; i++) {
        const struct st_decl *d = &w->d[i];
        FY_REQUIRE(d->filled == d->nbytes, -EINVAL,
                   "%s: tensor \"%s\" has %llu of its %llu bytes: write all of it before finishing",
                   w->out[d->shard].path, d->name, (unsigned long long)d->filled,
                   (unsigned long long)d->nbytes);
    }
    if (w->n_out > w->n_shards)
        FY_TRY(write_index(w, &w->out[w->n_shards]));
    for (size_t k = 0; k < w->n_out; k++) {
        struct st_out *o = &w->out[k];
        FY_SYS(fsync(o->fd), "fsync of %s (disk full or failing?)", o->tmp);
        int fd = o->fd;
        o->fd = -1;
        FY_SYS(close(fd), "close of %s (disk full?)", o->tmp);
    }
    /* Shards first, the index last: a reader that finds the index finds its shards. */
    for (size_t k = 0; k < w->n_out; k++) {
        struct st_out *o = &w->out[k];
        /* RENAME_NOREPLACE closes the window between the existence check and the rename; fall
         * back to a checked plain rename where the filesystem lacks it. */
        int r = w->overwrite ? rename(o->tmp, o->path)
                             : renameat2(AT_FDCWD, o->tmp, AT_FDCWD, o->path, RENAME_NOREPLACE);
        if (r != 0 && !w->overwrite && (errno == EINVAL || errno == ENOSYS)) {
            struct stat st;
            if (lstat(o->path, &st) == 0)
                errno = EEXIST;
            else
                r = rename(o->tmp, o->path);
        }
        if (r != 0) {
            int e = errno;
            FY_REQUIRE(e != EEXIST, -EEXIST, "%s already exists: remove it or pass --overwrite",
                       o->path);
            fy_error("cannot rename %s to %s: %s", o->tmp, o->path, strerror(e));
            return -e;
        }
        o->renamed = 1;
    }
    /* Every file is whole and in place: keep them even if the directory sync fails. */
    char dirpath[PATH_MAX];
    snprintf(dirpath, sizeof dirpath, "%s", w->out[0].path);
    w->n_out = 0;
    return fy_fsync_parent(dirpath);
}

int fy_st_writer_finish(struct fy_st_writer **wp)
{
    struct fy_st_writer *w = *wp;
    int rc = finish(w);
    if (rc < 0)
        writer_discard(w);
    writer_free(w);
    *wp = NULL;
    return rc;
}
