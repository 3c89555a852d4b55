/* Safetensors checkpoints (format in safetensors.h). The reader checks every header completely at
 * open, so that loading a model never stops half-way on a bad entry, and then reads one tensor at a
 * time with pread. The writer fixes each file's header from the declarations, streams the data into
 * temporary files, and renames them into place only once all of it is written and synced. The JSON
 * is parsed and printed by cJSON. */
#include "safetensors.h"

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

#include "check.h"
#include "dtype.h"
#include "fsutil.h"

/* Tensor data is copied between the file and memory as is. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

/* Conversion buffer of the reader and of the writer's bf16 rounding. */
#define ST_CHUNK (1u << 20)
/* cJSON holds numbers as doubles: integers above 2^53 would not be exact (and mean 9 PB). */
#define ST_MAX_JSON_INT 9007199254740992.0
/* An index json is small (tens of kB for the largest models); a bound keeps a wrong file out. */
#define ST_MAX_INDEX FY_ST_MAX_HEADER
#define ST_SHAPE_CHARS (FY_ST_MAX_DIMS * 21 + 3)

const char *fy_st_dtype_name(int dtype)
{
    switch (dtype) {
    case FY_ST_F32: return "F32";
    case FY_ST_BF16: return "BF16";
    case FY_ST_F16: return "F16";
    default: return "unknown";
    }
}

size_t fy_st_dtype_size(int dtype)
{
    switch (dtype) {
    case FY_ST_F32: return 4;
    case FY_ST_BF16: return 2;
    case FY_ST_F16: return 2;
    default: return 0;
    }
}

static int dtype_from_name(const char *s)
{
    for (int d = FY_ST_F32; d <= FY_ST_F16; d++)
        if (strcmp(s, fy_st_dtype_name(d)) == 0)
            return d;
    return 0;
}

/* The other dtypes of the format, to tell "not supported here" from "not a dtype at all". */
static int is_format_dtype(const char *s)
{
    static const char *const known[] = {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16",
                                        "U16", "I32", "U32", "F64", "I64", "U64", "C64", "F4",
                                        "F6_E2M3", "F6_E3M2"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(s, known[i]) == 0)
            return 1;
    return 0;
}

/* Index of the first byte that is not part of valid UTF-8 (or is NUL), or n. */
static size_t utf8_bad(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c == 0)
            return i;
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if ((c & 0xe0) == 0xc0) {
            len = 2, cp = c & 0x1fu, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            len = 3, cp = c & 0x0fu, min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            len = 4, cp = c & 0x07u, min = 0x10000;
        } else {
            return i;
        }
        if (n - i < len)
            return i;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return i;
            cp = cp << 6 | (s[i + k] & 0x3fu);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return i;
        i += len;
    }
    return n;
}

static int utf8_ok(const char *s) { return utf8_bad((const uint8_t *)s, strlen(s)) == strlen(s); }

static int json_u64(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v))
        return -1;
    double d = v->valuedouble;
    if (!(d >= 0.0) || d > ST_MAX_JSON_INT || d != floor(d))
        return -1;
    *out = (uint64_t)d;
    return 0;
}

static void format_shape(char *buf, size_t cap, int ndim, const uint64_t *shape)
{
    size_t at = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%llu", i ? "," : "",
                               (unsigned long long)shape[i]);
    if (at < cap)
        snprintf(buf + at, cap - at, "]");
}

/* pread of exactly len bytes; -EBADMSG when the file ends first (it shrank, or lies). */
static int pread_full(int fd, void *buf, size_t len, uint64_t off, const char *path,
                      const char *tensor)
{
    uint8_t *p = buf;
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, p + done, len - done, (off_t)(off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            fy_error("%s: cannot read %s%s%s at offset %llu: %s", path, tensor ? "tensor \"" : "the header",
                     tensor ? tensor : "", tensor ? "\"" : "", (unsigned long long)(off + done),
                     strerror(e));
            return -e;
        }
        if (n == 0) {
            fy_error("%s: truncated: %s%s%s needs bytes up to offset %llu, the file ends at %llu "
                     "(copy or download it again)", path, tensor ? "tensor \"" : "the header",
                     tensor ? tensor : "", tensor ? "\"" : "", (unsigned long long)(off + len),
                     (unsigned long long)(off + done));
            return -EBADMSG;
        }
        done += (size_t)n;
    }
    return 0;
}

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

/* ---- reader ---- */

struct st_file {
    char *path;
    int fd;
    uint64_t data_start, data_len;
};

struct st_meta {
    char *key, *value;
};

/* A weight_map entry: tensor name -> shard number. */
struct st_map {
    const char *name;
    size_t shard;
};

struct fy_st_reader {
    struct st_file *files;
    size_t n_files;
    struct fy_st_tensor *t;
    size_t *file_of; /* file index of each tensor */
    size_t n, cap;
    const struct fy_st_tensor **sorted; /* by name, for fy_st_find */
    struct st_meta *meta;
    size_t n_meta;
    void *chunk;
};

/* What a shard is checked against: the index and its weight_map. */
struct st_shard_ctx {
    const char *index_path;
    const struct st_map *map; /* sorted by name */
    size_t n_map;
    size_t shard;
    const char *shard_name;
};

static int cmp_map(const void *a, const void *b)
{
    return strcmp(((const struct st_map *)a)->name, ((const struct st_map *)b)->name);
}

static int cmp_tensor_ptr(const void *a, const void *b)
{
    return strcmp((*(const struct fy_st_tensor *const *)a)->name,
                  (*(const struct fy_st_tensor *const *)b)->name);
}

static const struct st_map *map_find(const struct st_shard_ctx *sc, const char *name)
{
    struct st_map key = {name, 0};
    return bsearch(&key, sc->map, sc->n_map, sizeof key, cmp_map);
}

static int parse_metadata(struct fy_st_reader *r, const char *path, const cJSON *m, int keep)
{
    FY_REQUIRE(cJSON_IsObject(m), -EBADMSG,
               "%s: \"__metadata__\" is not an object of strings: corrupt header", path);
    size_t count = 0;
    for (const cJSON *e = m->child; e; e = e->next) {
        FY_REQUIRE(cJSON_IsString(e), -EBADMSG,
                   "%s: \"__metadata__\" entry \"%s\" is not a string: corrupt header", path, e->string);
        count++;
    }
    if (!keep || count == 0)
        return 0;
    r->meta = calloc(count, sizeof *r->meta);
    FY_REQUIRE(r->meta != NULL, -ENOMEM, "%s: out of memory for the metadata", path);
    for (const cJSON *e = m->child; e; e = e->next) {
        struct st_meta *kv = &r->meta[r->n_meta];
        kv->key = strdup(e->string);
        kv->value = strdup(e->valuestring);
        r->n_meta++;
        FY_REQUIRE(kv->key && kv->value, -ENOMEM, "%s: out of memory for the metadata", path);
    }
    return 0;
}

static int add_tensor(struct fy_st_reader *r, const struct fy_st_tensor *t, size_t file)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 64;
        struct fy_st_tensor *nt = realloc(r->t, cap * sizeof *nt);
        if (nt)
            r->t = nt;
        size_t *nf = realloc(r->file_of, cap * sizeof *nf);
        if (nf)
            r->file_of = nf;
        FY_REQUIRE(nt && nf, -ENOMEM, "%s: out of memory listing tensors", r->files[file].path);
        r->cap = cap;
    }
    r->t[r->n] = *t;
    r->t[r->n].name = strdup(t->name);
    FY_REQUIRE(r->t[r->n].name != NULL, -ENOMEM, "%s: out of memory listing tensors",
               r->files[file].path);
    r->file_of[r->n++] = file;
    return 0;
}

static int parse_tensor(struct fy_st_reader *r, size_t file, const cJSON *e)
{
    const struct st_file *f = &r->files[file];
    const char *path = f->path, *name = e->string;
    FY_REQUIRE(cJSON_IsObject(e), -EBADMSG,
               "%s: tensor \"%s\": the entry is not an object with dtype, shape and data_offsets: "
               "corrupt header", path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    FY_REQUIRE(cJSON_IsString(dt), -EBADMSG, "%s: tensor \"%s\": no \"dtype\" string: corrupt header",
               path, name);
    struct fy_st_tensor t = {.name = name, .file = path};
    t.dtype = dtype_from_name(dt->valuestring);
    FY_REQUIRE(t.dtype != 0 || !is_format_dtype(dt->valuestring), -ENOTSUP,
               "%s: tensor \"%s\": dtype %s is not supported (only F32, BF16 and F16 are read)",
               path, name, dt->valuestring);
    FY_REQUIRE(t.dtype != 0, -EBADMSG,
               "%s: tensor \"%s\": unknown dtype \"%.40s\" (not a safetensors dtype): corrupt header",
               path, name, dt->valuestring);
    FY_REQUIRE(cJSON_IsArray(sh), -EBADMSG, "%s: tensor \"%s\": no \"shape\" list: corrupt header",
               path, name);
    int ndim = cJSON_GetArraySize(sh);
    FY_REQUIRE(ndim <= FY_ST_MAX_DIMS, -EBADMSG,
               "%s: tensor \"%s\": %d dimensions, more than the %d this reader takes", path, name,
               ndim, FY_ST_MAX_DIMS);
    t.ndim = ndim;
    t.numel = 1;
    int i = 0;
    for (const cJSON *d = sh->child; d; d = d->next, i++) {
        FY_REQUIRE(json_u64(d, &t.shape[i]) == 0, -EBADMSG,
                   "%s: tensor \"%s\": shape dimension %d is not a non-negative integer: corrupt "
                   "header", path, name, i);
        FY_REQUIRE(!__builtin_mul_overflow(t.numel, t.shape[i], &t.numel), -EBADMSG,
                   "%s: tensor \"%s\": the shape's element count overflows: corrupt header", path,
                   name);
    }
    FY_REQUIRE(!__builtin_mul_overflow(t.numel, (uint64_t)fy_st_dtype_size(t.dtype), &t.nbytes),
               -EBADMSG, "%s: tensor \"%s\": the shape's byte size overflows: corrupt header", path,
               name);
    uint64_t begin, end;
    FY_REQUIRE(cJSON_IsArray(off) && cJSON_GetArraySize(off) == 2 &&
                   json_u64(cJSON_GetArrayItem(off, 0), &begin) == 0 &&
                   json_u64(cJSON_GetArrayItem(off, 1), &end) == 0,
               -EBADMSG,
               "%s: tensor \"%s\": \"data_offsets\" is not a list of two non-negative integers: "
               "corrupt header", path, name);
    FY_REQUIRE(begin <= end, -EBADMSG,
               "%s: tensor \"%s\": data_offsets [%llu, %llu] end before they begin: corrupt header",
               path, name, (unsigned long long)begin, (unsigned long long)end);
    char shape[ST_SHAPE_CHARS];
    format_shape(shape, sizeof shape, t.ndim, t.shape);
    FY_REQUIRE(end - begin == t.nbytes, -EBADMSG,
               "%s: tensor \"%s\": shape %s of %s needs %llu bytes but data_offsets [%llu, %llu] "
               "hold %llu: corrupt header", path, name, shape, fy_st_dtype_name(t.dtype),
               (unsigned long long)t.nbytes, (unsigned long long)begin, (unsigned long long)end,
               (unsigned long long)(end - begin));
    FY_REQUIRE(end <= f->data_len, -EBADMSG,
               "%s: tensor \"%s\": data_offsets [%llu, %llu] run past the end of the data (%llu "
               "bytes): the file is truncated or corrupt (copy or download it again)", path, name,
               (unsigned long long)begin, (unsigned long long)end, (unsigned long long)f->data_len);
    t.offset = f->data_start + begin;
    return add_tensor(r, &t, file);
}

struct st_span {
    uint64_t begin, end;
    size_t idx;
};

static int cmp_span(const void *a, const void *b)
{
    const struct st_span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

/* Tensors first..n of one file must not share bytes (empty tensors hold none). */
static int check_overlaps(struct fy_st_reader *r, size_t first, const char *path)
{
    size_t n = r->n - first, m = 0;
    if (n < 2)
        return 0;
    struct st_span *s = malloc(n * sizeof *s);
    FY_REQUIRE(s != NULL, -ENOMEM, "%s: out of memory checking offsets", path);
    for (size_t i = first; i < r->n; i++)
        if (r->t[i].nbytes > 0)
            s[m++] = (struct st_span){r->t[i].offset, r->t[i].offset + r->t[i].nbytes, i};
    qsort(s, m, sizeof *s, cmp_span);
    size_t last = 0; /* the span reaching furthest so far */
    for (size_t i = 1; i < m; i++) {
        if (s[i].begin < s[last].end) {
            const struct fy_st_tensor *a = &r->t[s[last].idx], *b = &r->t[s[i].idx];
            uint64_t ds = r->files[r->file_of[s[i].idx]].data_start;
            fy_error("%s: tensors \"%s\" and \"%s\" overlap (data_offsets [%llu, %llu] and [%llu, "
                     "%llu]): corrupt header", path, a->name, b->name,
                     (unsigned long long)(a->offset - ds), (unsigned long long)(a->offset - ds + a->nbytes),
                     (unsigned long long)(b->offset - ds), (unsigned long long)(b->offset - ds + b->nbytes));
            free(s);
            return -EBADMSG;
        }
        if (s[i].end > s[last].end)
            last = i;
    }
    free(s);
    return 0;
}

static int parse_entries(struct fy_st_reader *r, size_t file, const cJSON *root,
                         const struct st_shard_ctx *sc)
{
    const char *path = r->files[file].path;
    FY_REQUIRE(cJSON_IsObject(root), -EBADMSG,
               "%s: the header is not a JSON object: not a safetensors file", path);
    size_t first = r->n;
    int saw_meta = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            FY_REQUIRE(!saw_meta, -EBADMSG, "%s: \"__metadata__\" appears twice: corrupt header",
                       path);
            saw_meta = 1;
            FY_TRY(parse_metadata(r, path, e, file == 0));
            continue;
        }
        FY_TRY(parse_tensor(r, file, e));
        if (sc != NULL) {
            const struct st_map *m = map_find(sc, e->string);
            FY_REQUIRE(m != NULL, -EBADMSG,
                       "%s: tensor \"%s\" is in shard %s but not in the index: the index and the "
                       "shards do not belong together", sc->index_path, e->string, sc->shard_name);
            FY_REQUIRE(m->shard == sc->shard, -EBADMSG,
                       "%s: tensor \"%s\" is in shard %s but the index maps it to another shard: "
                       "the index and the shards do not belong together", sc->index_path,
                       e->string, sc->shard_name);
        }
    }
    return check_overlaps(r, first, path);
}

/* Opens one file, checks its header and lists its tensors. `sc` is NULL for a single file. */
static int load_file(struct fy_st_reader *r, const char *path, const struct st_shard_ctx *sc,
                     const char *first_tensor)
{
    struct st_file *nf = realloc(r->files, (r->n_files + 1) * sizeof *nf);
    FY_REQUIRE(nf != NULL, -ENOMEM, "%s: out of memory", path);
    r->files = nf;
    size_t file = r->n_files;
    struct st_file *f = &r->files[file];
    *f = (struct st_file){.fd = -1, .path = strdup(path)};
    r->n_files++;
    FY_REQUIRE(f->path != NULL, -ENOMEM, "%s: out of memory", path);
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        int e = errno;
        if (sc != NULL)
            fy_error("%s: shard %s (holding tensor \"%s\") cannot be opened: %s (the checkpoint is "
                     "incomplete: copy or download the missing shard)", sc->index_path, path,
                     first_tensor, strerror(e));
        else
            fy_error("cannot open safetensors file %s: %s (check the path)", path, strerror(e));
        return -e;
    }
    struct stat st;
    FY_SYS(fstat(f->fd, &st), "cannot stat %s", path);
    FY_REQUIRE(S_ISREG(st.st_mode), -EINVAL, "%s is not a regular file: give a .safetensors file",
               path);
    uint64_t size = (uint64_t)st.st_size;
    FY_REQUIRE(size >= 8, -EBADMSG,
               "%s: %llu bytes, shorter than the 8-byte header length: truncated or not a "
               "safetensors file", path, (unsigned long long)size);
    uint8_t lenbuf[8];
    FY_TRY(pread_full(f->fd, lenbuf, 8, 0, path, NULL));
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | lenbuf[i];
    FY_REQUIRE(hlen >= 2 && hlen <= FY_ST_MAX_HEADER, -EBADMSG,
               "%s: header length %llu is not between 2 and %u bytes: corrupt or not a safetensors "
               "file", path, (unsigned long long)hlen, FY_ST_MAX_HEADER);
    FY_REQUIRE(hlen <= size - 8, -EBADMSG,
               "%s: header length %llu runs past the end of the file (%llu bytes): truncated or "
               "not a safetensors file", path, (unsigned long long)hlen, (unsigned long long)size);
    f->data_start = 8 + hlen;
    f->data_len = size - f->data_start;

    char *hdr = malloc(hlen);
    FY_REQUIRE(hdr != NULL, -ENOMEM, "%s: out of memory for a %llu-byte header", path,
               (unsigned long long)hlen);
    int rc = pread_full(f->fd, hdr, hlen, 8, path, NULL);
    if (rc == 0) {
        size_t bad = utf8_bad((const uint8_t *)hdr, hlen);
        if (bad < hlen) {
            fy_error("%s: the header is not UTF-8 text (byte %zu of %llu): corrupt or not a "
                     "safetensors file", path, bad, (unsigned long long)hlen);
            rc = -EBADMSG;
        }
    }
    cJSON *root = NULL;
    if (rc == 0) {
        const char *end = NULL;
        root = cJSON_ParseWithLengthOpts(hdr, hlen, &end, 0);
        if (root == NULL) {
            size_t at = end && end >= hdr && end <= hdr + hlen ? (size_t)(end - hdr) : 0;
            fy_error("%s: the header is not valid JSON (near byte %zu of %llu): corrupt or not a "
                     "safetensors file", path, at, (unsigned long long)hlen);
            rc = -EBADMSG;
        } else {
            for (const char *p = end; p < hdr + hlen; p++)
                if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
                    fy_error("%s: text after the header's JSON object (byte %zu): corrupt header",
                             path, (size_t)(p - hdr));
                    rc = -EBADMSG;
                    break;
                }
        }
    }
    if (rc == 0)
        rc = parse_entries(r, file, root, sc);
    cJSON_Delete(root);
    free(hdr);
    return rc;
}

/* Reads a whole small file (the index) into a NUL-terminated buffer. */
static int slurp(const char *path, char **out, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    FY_SYS(fd, "cannot open %s (check the path)", path);
    struct stat st;
    int rc = fstat(fd, &st) == 0 ? 0 : -errno;
    if (rc < 0)
        fy_error("cannot stat %s: %s", path, strerror(-rc));
    if (rc == 0 && (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > ST_MAX_INDEX)) {
        fy_error("%s: not a regular file of at most %u bytes: not a safetensors index", path,
                 ST_MAX_INDEX);
        rc = -EBADMSG;
    }
    char *buf = rc == 0 ? malloc((size_t)st.st_size + 1) : NULL;
    if (rc == 0 && buf == NULL) {
        fy_error("%s: out of memory", path);
        rc = -ENOMEM;
    }
    if (rc == 0)
        rc = pread_full(fd, buf, (size_t)st.st_size, 0, path, NULL);
    close(fd);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    buf[st.st_size] = 0;
    *out = buf;
    *len = (size_t)st.st_size;
    return 0;
}

static int load_shards(struct fy_st_reader *r, const char *index_path, const cJSON *wm)
{
    size_t n_map = (size_t)cJSON_GetArraySize(wm);
    FY_REQUIRE(n_map > 0, -EBADMSG, "%s: the weight_map is empty: no tensors to read", index_path);
    struct st_map *map = calloc(n_map, sizeof *map);
    const char **shards = calloc(n_map, sizeof *shards);
    char *dir = strdup(index_path);
    char *path = malloc(PATH_MAX);
    int rc = map && shards && dir && path ? 0 : -ENOMEM;
    if (rc < 0)
        fy_error("%s: out of memory", index_path);
    size_t n_shards = 0, i = 0;
    for (const cJSON *e = wm->child; rc == 0 && e; e = e->next, i++) {
        const char *s = cJSON_IsString(e) ? e->valuestring : NULL;
        /* Shards live beside the index; a path elsewhere would read outside the model directory. */
        if (s == NULL || s[0] == 0 || strchr(s, '/') != NULL || strcmp(s, "..") == 0 ||
            strcmp(s, ".") == 0) {
            fy_error("%s: tensor \"%s\": the weight_map value is not a shard file name in the "
                     "index's directory: corrupt index", index_path, e->string);
            rc = -EBADMSG;
            break;
        }
        size_t k = 0;
        while (k < n_shards && strcmp(shards[k], s) != 0)
            k++;
        if (k == n_shards)
            shards[n_shards++] = s;
        map[i] = (struct st_map){e->string, k};
    }
    if (rc == 0) {
        qsort(map, n_map, sizeof *map, cmp_map);
        for (i = 1; i < n_map; i++)
            if (strcmp(map[i - 1].name, map[i].name) == 0) {
                fy_error("%s: tensor \"%s\" appears twice in the weight_map: corrupt index",
                         index_path, map[i].name);
                rc = -EBADMSG;
                break;
            }
    }
    const char *d = rc == 0 ? dirname(dir) : NULL;
    for (size_t k = 0; rc == 0 && k < n_shards; k++) {
        snprintf(path, PATH_MAX, "%s/%s", d, shards[k]);
        const char *first = NULL;
        for (const cJSON *e = wm->child; e && first == NULL; e = e->next)
            if (strcmp(e->valuestring, shards[k]) == 0)
                first = e->string;
        struct st_shard_ctx sc = {index_path, map, n_map, k, shards[k]};
        rc = load_file(r, path, &sc, first);
    }
    /* Every tensor the shards hold is in the index under its own shard (checked while parsing);
     * now every tensor of the index must be in some shard. */
    if (rc == 0) {
        r->sorted = malloc((r->n ? r->n : 1) * sizeof *r->sorted);
        if (r->sorted == NULL) {
            fy_error("%s: out of memory", index_path);
            rc = -ENOMEM;
        }
    }
    if (rc == 0) {
        for (i = 0; i < r->n; i++)
            r->sorted[i] = &r->t[i];
        qsort(r->sorted, r->n, sizeof *r->sorted, cmp_tensor_ptr);
        for (i = 0; i < n_map; i++)
            if (fy_st_find(r, map[i].name) == NULL) {
                fy_error("%s: tensor \"%s\" is mapped to shard %s, which does not hold it: the "
                         "index and the shards do not belong together", index_path, map[i].name,
                         shards[map[i].shard]);
                rc = -EBADMSG;
                break;
            }
    }
    free(map);
    free(shards);
    free(dir);
    free(path);
    return rc;
}

static int load_index(struct fy_st_reader *r, const char *index_path)
{
    char *text = NULL;
    size_t len = 0;
    FY_TRY(slurp(index_path, &text, &len));
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len + 1, &end, 1); /* with the NUL */
    int rc = 0;
    if (root == NULL) {
        fy_error("%s: not valid JSON (near byte %zu): corrupt index", index_path,
                 end && end >= text ? (size_t)(end - text) : (size_t)0);
        rc = -EBADMSG;
    }
    const cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (rc == 0 && (!cJSON_IsObject(root) || !cJSON_IsObject(wm))) {
        fy_error("%s: no \"weight_map\" object: not a safetensors index", index_path);
        rc = -EBADMSG;
    }
    if (rc == 0)
        rc = load_shards(r, index_path, wm);
    cJSON_Delete(root);
    free(text);
    return rc;
}

int fy_st_open(struct fy_st_reader **out, const char *path)
{
    *out = NULL;
    struct stat st;
    FY_SYS(stat(path, &st), "cannot open safetensors checkpoint %s (check the path)", path);
    struct fy_st_reader *r = calloc(1, sizeof *r);
    FY_REQUIRE(r != NULL, -ENOMEM, "%s: out of memory", path);
    char buf[PATH_MAX];
    const char *file = path;
    int is_index = 0;
    if (S_ISDIR(st.st_mode)) {
        snprintf(buf, sizeof buf, "%s/%s", path, FY_ST_INDEX_NAME);
        is_index = access(buf, F_OK) == 0;
        if (!is_index)
            snprintf(buf, sizeof buf, "%s/%s", path, FY_ST_SINGLE_NAME);
        if (!is_index && access(buf, F_OK) != 0) {
            fy_error("%s: neither %s nor %s is there: not a Hugging Face model directory", path,
                     FY_ST_INDEX_NAME, FY_ST_SINGLE_NAME);
            free(r);
            return -ENOENT;
        }
        file = buf;
    } else {
        size_t n = strlen(path);
        is_index = n >= 5 && strcmp(path + n - 5, ".json") == 0;
    }
    int rc = is_index ? load_index(r, file) : load_file(r, file, NULL, NULL);
    if (rc == 0 && r->sorted == NULL) {
        r->sorted = malloc((r->n ? r->n : 1) * sizeof *r->sorted);
        if (r->sorted == NULL) {
            fy_error("%s: out of memory", file);
            rc = -ENOMEM;
        } else {
            for (size_t i = 0; i < r->n; i++)
                r->sorted[i] = &r->t[i];
            qsort(r->sorted, r->n, sizeof *r->sorted, cmp_tensor_ptr);
        }
    }
    /* A single header cannot repeat a name (checked here because cJSON keeps duplicate keys). */
    for (size_t i = 1; rc == 0 && i < r->n; i++)
        if (strcmp(r->sorted[i - 1]->name, r->sorted[i]->name) == 0) {
            fy_error("%s: tensor \"%s\" appears twice: corrupt header", r->sorted[i]->file,
                     r->sorted[i]->name);
            rc = -EBADMSG;
        }
    if (rc < 0) {
        fy_st_close(&r);
        return rc;
    }
    *out = r;
    return 0;
}

void fy_st_close(struct fy_st_reader **rp)
{
    struct fy_st_reader *r = rp ? *rp : NULL;
    if (r == NULL)
        return;
    for (size_t i = 0; i < r->n_files; i++) {
        if (r->files[i].fd >= 0)
            close(r->files[i].fd);
        free(r->files[i].path);
    }
    for (size_t i = 0; i < r->n; i++)
        free((char *)r->t[i].name);
    for (size_t i = 0; i < r->n_meta; i++) {
        free(r->meta[i].key);
        free(r->meta[i].value);
    }
    free(r->files);
    free(r->t);
    free(r->file_of);
    free(r->sorted);
    free(r->meta);
    free(r->chunk);
    free(r);
    *rp = NULL;
}

size_t fy_st_count(const struct fy_st_reader *r) { return r->n; }

const struct fy_st_tensor *fy_st_tensor_at(const struct fy_st_reader *r, size_t i)
{
    return i < r->n ? &r->t[i] : NULL;
}

const struct fy_st_tensor *fy_st_find(const struct fy_st_reader *r, const char *name)
{
    struct fy_st_tensor key = {.name = name};
    const struct fy_st_tensor *kp = &key;
    const struct fy_st_tensor **hit = bsearch(&kp, r->sorted, r->n, sizeof *r->sorted, cmp_tensor_ptr);
    return hit ? *hit : NULL;
}

size_t fy_st_metadata_count(const struct fy_st_reader *r) { return r->n_meta; }

void fy_st_metadata_at(const struct fy_st_reader *r, size_t i, const char **key, const char **value)
{
    *key = i < r->n_meta ? r->meta[i].key : NULL;
    *value = i < r->n_meta ? r->meta[i].value : NULL;
}

const char *fy_st_metadata(const struct fy_st_reader *r, const char *key)
{
    for (size_t i = 0; i < r->n_meta; i++)
        if (strcmp(r->meta[i].key, key) == 0)
            return r->meta[i].value;
    return NULL;
}

static int tensor_file(const struct fy_st_reader *r, const struct fy_st_tensor *t, size_t *file)
{
    FY_REQUIRE(t >= r->t && t < r->t + r->n, -EINVAL,
               "tensor \"%s\" does not come from this reader: look it up with fy_st_find", t->name);
    *file = r->file_of[t - r->t];
    return 0;
}

int fy_st_read_raw(struct fy_st_reader *r, const struct fy_st_tensor *t, void *dst, uint64_t nbytes)
{
    size_t file;
    FY_TRY(tensor_file(r, t, &file));
    FY_REQUIRE(nbytes == t->nbytes, -EINVAL,
               "%s: tensor \"%s\" holds %llu bytes, the buffer given for it %llu", t->file, t->name,
               (unsigned long long)t->nbytes, (unsigned long long)nbytes);
    return pread_full(r->files[file].fd, dst, nbytes, t->offset, t->file, t->name);
}

int fy_st_read_f32(struct fy_st_reader *r, const struct fy_st_tensor *t, float *dst, uint64_t n)
{
    size_t file;
    FY_TRY(tensor_file(r, t, &file));
    FY_REQUIRE(n == t->numel, -EINVAL,
               "%s: tensor \"%s\" holds %llu elements, the buffer given for it %llu", t->file,
               t->name, (unsigned long long)t->numel, (unsigned long long)n);
    int fd = r->files[file].fd;
    if (t->dtype == FY_ST_F32)
        return pread_full(fd, dst, t->nbytes, t->offset, t->file, t->name);
    if (r->chunk == NULL) {
        r->chunk = malloc(ST_CHUNK);
        FY_REQUIRE(r->chunk != NULL, -ENOMEM, "%s: out of memory for a read buffer", t->file);
    }
    const uint16_t *h = r->chunk;
    for (uint64_t done = 0; done < n;) {
        uint64_t k = n - done < ST_CHUNK / 2 ? n - done : ST_CHUNK / 2;
        FY_TRY(pread_full(fd, r->chunk, k * 2, t->offset + done * 2, t->file, t->name));
        if (t->dtype == FY_ST_BF16)
            for (uint64_t i = 0; i < k; i++)
                dst[done + i] = fy_bf16_to_f32(h[i]);
        else
            for (uint64_t i = 0; i < k; i++)
                dst[done + i] = fy_f16_to_f32(h[i]);
        done += k;
    }
    return 0;
}

/* ---- writer ---- */

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
    struct st_meta *meta;
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
    FY_REQUIRE(name[0] != 0 && strcmp(name, "__metadata__") != 0 && utf8_ok(name), -EINVAL,
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
                   d.nbytes <= (uint64_t)ST_MAX_JSON_INT,
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
    FY_REQUIRE(utf8_ok(key) && utf8_ok(value), -EINVAL, "%s: metadata \"%s\" is not UTF-8",
               w->target, key);
    for (size_t i = 0; i < w->n_meta; i++)
        FY_REQUIRE(strcmp(w->meta[i].key, key) != 0, -EINVAL, "%s: metadata \"%s\" given twice",
                   w->target, key);
    struct st_meta *nm = realloc(w->meta, (w->n_meta + 1) * sizeof *nm);
    FY_REQUIRE(nm != NULL, -ENOMEM, "%s: out of memory", w->target);
    w->meta = nm;
    nm[w->n_meta] = (struct st_meta){strdup(key), strdup(value)};
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
        char shape[ST_SHAPE_CHARS], offs[48];
        format_shape(shape, sizeof shape, d->ndim, d->shape);
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
        if (k >= w->n_shards)
            continue;
        size_t len = 0;
        char *h = build_header(w, k, &len);
        FY_REQUIRE(h != NULL, -ENOMEM, "%s: out of memory building the header", o->path);
        uint8_t lenbuf[8];
        for (int i = 0; i < 8; i++)
            lenbuf[i] = (uint8_t)((uint64_t)len >> (8 * i));
        int rc = pwrite_all(o->fd, lenbuf, 8, 0, o->tmp, NULL);
        if (rc == 0)
            rc = pwrite_all(o->fd, h, len, 8, o->tmp, NULL);
        free(h);
        FY_TRY(rc);
        o->data_start = 8 + len;
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
        w->stage = malloc(ST_CHUNK);
        FY_REQUIRE(w->stage != NULL, -ENOMEM, "%s: out of memory for a write buffer", w->target);
    }
    for (uint64_t done = 0; done < n;) {
        uint64_t k = n - done < ST_CHUNK / 2 ? n - done : ST_CHUNK / 2;
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
