/* Safetensors checkpoints (format in safetensors.h). The reader checks every header completely at
 * open, so that loading a model never stops half-way on a bad entry, and then reads one tensor at a
 * time with pread; the writer is common/formats/stwriter. The JSON is parsed by cJSON. */
#include "common/formats/safetensors.h"

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

/* Tensor data is copied between the file and memory as is. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

/* An index json is small (tens of kB for the largest models); a bound keeps a wrong file out. */
#define ST_MAX_INDEX FY_ST_MAX_HEADER

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

int fy_st_utf8_ok(const char *s) { return utf8_bad((const uint8_t *)s, strlen(s)) == strlen(s); }

static int json_u64(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v))
        return -1;
    double d = v->valuedouble;
    if (!(d >= 0.0) || d > FY_ST_MAX_JSON_INT || d != floor(d))
        return -1;
    *out = (uint64_t)d;
    return 0;
}

void fy_st_format_shape(char *buf, size_t cap, int ndim, const uint64_t *shape)
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

/* ---- reader ---- */

struct st_file {
    char *path;
    int fd;
    uint64_t data_start, data_len;
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
    struct fy_st_meta *meta;
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
        struct fy_st_meta *kv = &r->meta[r->n_meta];
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
    char shape[FY_ST_SHAPE_CHARS];
    fy_st_format_shape(shape, sizeof shape, t.ndim, t.shape);
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
    cJSON *root = NULL;
    int rc = 0;
    FY_TRY_OUT(rc, pread_full(f->fd, hdr, hlen, 8, path, NULL));
    size_t bad = utf8_bad((const uint8_t *)hdr, hlen);
    FY_REQUIRE_OUT(rc, bad == hlen, -EBADMSG,
                   "%s: the header is not UTF-8 text (byte %zu of %llu): corrupt or not a "
                   "safetensors file",
                   path, bad, (unsigned long long)hlen);
    const char *end = NULL;
    root = cJSON_ParseWithLengthOpts(hdr, hlen, &end, 0);
    size_t at = end && end >= hdr && end <= hdr + hlen ? (size_t)(end - hdr) : 0;
    FY_REQUIRE_OUT(rc, root != NULL, -EBADMSG,
                   "%s: the header is not valid JSON (near byte %zu of %llu): corrupt or not a "
                   "safetensors file",
                   path, at, (unsigned long long)hlen);
    const char *p = end;
    while (p < hdr + hlen && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    FY_REQUIRE_OUT(rc, p == hdr + hlen, -EBADMSG,
                   "%s: text after the header's JSON object (byte %zu): corrupt header", path,
                   (size_t)(p - hdr));
    rc = parse_entries(r, file, root, sc);
out:
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
    int rc = 0;
    FY_REQUIRE_OUT(rc, map && shards && dir && path, -ENOMEM, "%s: out of memory", index_path);
    size_t n_shards = 0, i = 0;
    for (const cJSON *e = wm->child; e; e = e->next, i++) {
        const char *s = cJSON_IsString(e) ? e->valuestring : NULL;
        /* Shards live beside the index; a path elsewhere would read outside the model directory. */
        FY_REQUIRE_OUT(rc,
                       s != NULL && s[0] != 0 && strchr(s, '/') == NULL && strcmp(s, "..") != 0 &&
                           strcmp(s, ".") != 0,
                       -EBADMSG,
                       "%s: tensor \"%s\": the weight_map value is not a shard file name in the "
                       "index's directory: corrupt index",
                       index_path, e->string);
        size_t k = 0;
        while (k < n_shards && strcmp(shards[k], s) != 0)
            k++;
        if (k == n_shards)
            shards[n_shards++] = s;
        map[i] = (struct st_map){e->string, k};
    }
    qsort(map, n_map, sizeof *map, cmp_map);
    for (i = 1; i < n_map; i++)
        FY_REQUIRE_OUT(rc, strcmp(map[i - 1].name, map[i].name) != 0, -EBADMSG,
                       "%s: tensor \"%s\" appears twice in the weight_map: corrupt index",
                       index_path, map[i].name);
    const char *d = dirname(dir);
    for (size_t k = 0; k < n_shards; k++) {
        snprintf(path, PATH_MAX, "%s/%s", d, shards[k]);
        const char *first = NULL;
        for (const cJSON *e = wm->child; e && first == NULL; e = e->next)
            if (strcmp(e->valuestring, shards[k]) == 0)
                first = e->string;
        struct st_shard_ctx sc = {index_path, map, n_map, k, shards[k]};
        FY_TRY_OUT(rc, load_file(r, path, &sc, first));
    }
    /* Every tensor the shards hold is in the index under its own shard (checked while parsing);
     * now every tensor of the index must be in some shard. */
    r->sorted = malloc((r->n ? r->n : 1) * sizeof *r->sorted);
    FY_REQUIRE_OUT(rc, r->sorted != NULL, -ENOMEM, "%s: out of memory", index_path);
    for (i = 0; i < r->n; i++)
        r->sorted[i] = &r->t[i];
    qsort(r->sorted, r->n, sizeof *r->sorted, cmp_tensor_ptr);
    for (i = 0; i < n_map; i++)
        FY_REQUIRE_OUT(rc, fy_st_find(r, map[i].name) != NULL, -EBADMSG,
                       "%s: tensor \"%s\" is mapped to shard %s, which does not hold it: the "
                       "index and the shards do not belong together",
                       index_path, map[i].name, shards[map[i].shard]);
out:
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
        fy_st_destroy(&r);
        return rc;
    }
    *out = r;
    return 0;
}

void fy_st_destroy(struct fy_st_reader **rp)
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
        r->chunk = malloc(FY_ST_CHUNK);
        FY_REQUIRE(r->chunk != NULL, -ENOMEM, "%s: out of memory for a read buffer", t->file);
    }
    const uint16_t *h = r->chunk;
    for (uint64_t done = 0; done < n;) {
        uint64_t k = n - done < FY_ST_CHUNK / 2 ? n - done : FY_ST_CHUNK / 2;
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

