/* Token files (format in tokfile.h): an atomic streaming writer, byte-level preparation of text
 * inputs, and a reader that validates everything up front so training never meets a bad token,
 * with train/eval splits and batch sampling that is a pure function of its arguments. */
#include "tokfile.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "fsutil.h"

#define TOK_PATH_MAX 4096
/* Size of the writer's staging buffer and of the preparation's read chunks. */
#define TOK_CHUNK (1u << 20)

struct fy_tokfile {
    char path[TOK_PATH_MAX];
    const uint8_t *map; /* the whole file, read-only */
    size_t map_len;
    const uint8_t *tokens; /* map + header */
    uint64_t count;
    uint32_t width, vocab;
    uint64_t eval_start; /* first token of the eval split; == count when there is none */
};

static void put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint32_t fy_tokfile_header_checksum(const void *header)
{
    const uint8_t *p = header;
    uint32_t h = 0x811c9dc5u;
    for (int i = 0; i < 4 * FY_TOKFILE_SLOT_CHECKSUM; i++) {
        h ^= p[i];
        h *= 0x01000193u;
    }
    return h;
}

static uint32_t width_for_vocab(uint32_t vocab)
{
    if (vocab <= 256u)
        return 1;
    if (vocab <= 65536u)
        return 2;
    return 4;
}

/* ---- writer ---- */

struct tok_writer {
    char path[TOK_PATH_MAX], tmp[TOK_PATH_MAX + 8];
    int fd;
    uint32_t width, vocab;
    uint64_t count;
    uint64_t offset; /* bytes written to tmp so far */
    uint8_t *buf;
    size_t fill;
};

static int write_all(struct tok_writer *w, const void *data, size_t len)
{
    FY_TRY(fy_write_all(w->fd, data, len, w->tmp, w->offset));
    w->offset += len;
    return 0;
}

static int check_not_existing(const char *path, int overwrite)
{
    struct stat st;
    if (!overwrite && lstat(path, &st) == 0) {
        fy_error("%s already exists: remove it or pass --overwrite", path);
        return -EEXIST;
    }
    return 0;
}

static void writer_abort(struct tok_writer *w)
{
    if (w->fd >= 0) {
        close(w->fd);
        unlink(w->tmp);
    }
    w->fd = -1;
    free(w->buf);
    w->buf = NULL;
}

static int writer_begin(struct tok_writer *w, const char *path, uint32_t vocab, int overwrite)
{
    memset(w, 0, sizeof *w);
    w->fd = -1;
    FY_REQUIRE(strlen(path) < TOK_PATH_MAX, -ENAMETOOLONG, "token file path too long: %.200s...",
               path);
    FY_REQUIRE(vocab >= 1 && vocab <= (uint32_t)INT32_MAX, -EINVAL,
               "%s: vocabulary size %u out of range (1..%d)", path, vocab, INT32_MAX);
    FY_TRY(check_not_existing(path, overwrite));
    snprintf(w->path, sizeof w->path, "%s", path);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp", path);
    w->vocab = vocab;
    w->width = width_for_vocab(vocab);
    w->buf = malloc(TOK_CHUNK);
    FY_REQUIRE(w->buf != NULL, -ENOMEM, "%s: out of memory for a %u-byte write buffer", path,
               TOK_CHUNK);
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        int e = errno;
        free(w->buf);
        w->buf = NULL;
        fy_error("cannot create %s: %s (check that the directory exists and is writable)", w->tmp,
                 strerror(e));
        return -e;
    }
    /* The real header goes in last, once the count is known; a crash leaves only the .tmp. */
    memset(w->buf, 0, FY_TOKFILE_HEADER_BYTES);
    int rc = write_all(w, w->buf, FY_TOKFILE_HEADER_BYTES);
    if (rc < 0)
        writer_abort(w);
    return rc;
}

static int writer_flush(struct tok_writer *w)
{
    int rc = write_all(w, w->buf, w->fill);
    w->fill = 0;
    return rc;
}

static int writer_put(struct tok_writer *w, const uint32_t *tokens, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        if (w->fill + 4 > TOK_CHUNK)
            FY_TRY(writer_flush(w));
        uint8_t *p = w->buf + w->fill;
        uint32_t v = tokens[i];
        p[0] = (uint8_t)v;
        if (w->width >= 2)
            p[1] = (uint8_t)(v >> 8);
        if (w->width == 4) {
            p[2] = (uint8_t)(v >> 16);
            p[3] = (uint8_t)(v >> 24);
        }
        w->fill += w->width;
    }
    w->count += n;
    return 0;
}

/* Width-1 tokens straight from bytes (the byte-level tokenizer). */
static int writer_put_bytes(struct tok_writer *w, const uint8_t *bytes, size_t n)
{
    FY_TRY(writer_flush(w));
    FY_TRY(write_all(w, bytes, n));
    w->count += n;
    return 0;
}


/* Pads, writes the header, syncs and renames into place. Aborts (removes the .tmp) on failure. */
static int writer_finish(struct tok_writer *w, int overwrite)
{
    int rc = writer_flush(w);
    if (rc == 0) {
        size_t pad = (size_t)((FY_TOKFILE_HEADER_BYTES - w->offset % FY_TOKFILE_HEADER_BYTES) %
                              FY_TOKFILE_HEADER_BYTES);
        memset(w->buf, 0, pad);
        rc = write_all(w, w->buf, pad);
    }
    if (rc == 0) {
        uint8_t *h = w->buf;
        memset(h, 0, FY_TOKFILE_HEADER_BYTES);
        put_le32(h + 4 * FY_TOKFILE_SLOT_MAGIC, FY_TOKFILE_MAGIC);
        put_le32(h + 4 * FY_TOKFILE_SLOT_VERSION, FY_TOKFILE_VERSION);
        put_le32(h + 4 * FY_TOKFILE_SLOT_WIDTH, w->width);
        put_le32(h + 4 * FY_TOKFILE_SLOT_VOCAB, w->vocab);
        put_le32(h + 4 * FY_TOKFILE_SLOT_COUNT_LO, (uint32_t)w->count);
        put_le32(h + 4 * FY_TOKFILE_SLOT_COUNT_HI, (uint32_t)(w->count >> 32));
        put_le32(h + 4 * FY_TOKFILE_SLOT_FLAGS, 0);
        put_le32(h + 4 * FY_TOKFILE_SLOT_CHECKSUM, fy_tokfile_header_checksum(h));
        ssize_t n = pwrite(w->fd, h, FY_TOKFILE_HEADER_BYTES, 0);
        if (n != FY_TOKFILE_HEADER_BYTES) {
            int e = n < 0 ? errno : EIO;
            fy_error("cannot write the header of %s: %s (disk full?)", w->tmp, strerror(e));
            rc = -e;
        }
    }
    if (rc == 0 && fsync(w->fd) != 0) {
        rc = -errno;
        fy_error("fsync of %s: %s (disk full or failing?)", w->tmp, strerror(-rc));
    }
    if (rc == 0) {
        int fd = w->fd;
        w->fd = -1;
        if (close(fd) != 0) {
            rc = -errno;
            fy_error("close of %s: %s (disk full?)", w->tmp, strerror(-rc));
            unlink(w->tmp);
        }
    }
    if (rc == 0) {
        /* RENAME_NOREPLACE closes the window between the existence check and the rename; fall
         * back to a plain rename on filesystems that do not support it. */
        int r = overwrite ? rename(w->tmp, w->path)
                          : renameat2(AT_FDCWD, w->tmp, AT_FDCWD, w->path, RENAME_NOREPLACE);
        if (r != 0 && !overwrite && (errno == EINVAL || errno == ENOSYS)) {
            struct stat st;
            if (lstat(w->path, &st) == 0)
                errno = EEXIST;
            else
                r = rename(w->tmp, w->path);
        }
        if (r != 0) {
            rc = -errno;
            if (rc == -EEXIST)
                fy_error("%s already exists: remove it or pass --overwrite", w->path);
            else
                fy_error("cannot rename %s to %s: %s", w->tmp, w->path, strerror(-rc));
            unlink(w->tmp);
        }
    }
    if (rc < 0 && w->fd >= 0) {
        writer_abort(w);
        return rc;
    }
    free(w->buf);
    w->buf = NULL;
    if (rc < 0)
        return rc;
    return fy_fsync_parent(w->path);
}

int fy_tokfile_write(const char *path, const uint32_t *tokens, uint64_t count, uint32_t vocab,
                     int overwrite)
{
    FY_REQUIRE(count > 0, -EINVAL, "%s: no tokens to write; give at least one token", path);
    FY_REQUIRE(vocab >= 1 && vocab <= (uint32_t)INT32_MAX, -EINVAL,
               "%s: vocabulary size %u out of range (1..%d)", path, vocab, INT32_MAX);
    /* Check everything before creating anything, so a refusal leaves no file behind. */
    for (uint64_t i = 0; i < count; i++)
        FY_REQUIRE(tokens[i] < vocab, -EINVAL,
                   "%s: token %u at index %llu is outside the vocabulary of %u: fix the tokenizer "
                   "or the vocabulary size",
                   path, tokens[i], (unsigned long long)i, vocab);
    struct tok_writer w;
    FY_TRY(writer_begin(&w, path, vocab, overwrite));
    int rc = writer_put(&w, tokens, count);
    if (rc < 0) {
        writer_abort(&w);
        return rc;
    }
    return writer_finish(&w, overwrite);
}

/* ---- byte-level preparation ---- */

/* Opens an input for reading and checks it is a regular file; returns the fd or -errno. */
static int open_input(const char *in, uint64_t *size)
{
    int fd = open(in, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        fy_error("cannot read input %s: %s (check the path and its permissions)", in, strerror(e));
        return -e;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        fy_error("cannot stat input %s: %s", in, strerror(e));
        return -e;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        fy_error("input %s is %s, not a regular file: give text files", in,
                 S_ISDIR(st.st_mode) ? "a directory" : "a special file");
        return S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
    }
    *size = (uint64_t)st.st_size;
    return fd;
}

int fy_tokfile_prepare_bytes(const char *out_path, const char *const *inputs, unsigned n_inputs,
                             int overwrite, uint64_t *count_out)
{
    FY_REQUIRE(n_inputs > 0, -EINVAL, "%s: no input files given: name at least one text file",
               out_path);
    /* First pass: every input readable and the total non-empty before anything is created. */
    uint64_t total = 0;
    for (unsigned i = 0; i < n_inputs; i++) {
        uint64_t size = 0;
        int fd = open_input(inputs[i], &size);
        if (fd < 0)
            return fd;
        close(fd);
        total += size;
    }
    FY_REQUIRE(total > 0, -EINVAL, "%s: the %u input file(s) are empty: nothing to prepare",
               out_path, n_inputs);

    struct tok_writer w;
    FY_TRY(writer_begin(&w, out_path, FY_TOKFILE_BYTE_VOCAB, overwrite));
    uint8_t *chunk = malloc(TOK_CHUNK);
    int rc = chunk != NULL ? 0 : -ENOMEM;
    if (rc < 0)
        fy_error("%s: out of memory for a %u-byte read buffer", out_path, TOK_CHUNK);
    for (unsigned i = 0; rc == 0 && i < n_inputs; i++) {
        uint64_t size = 0;
        int fd = open_input(inputs[i], &size);
        if (fd < 0) {
            rc = fd;
            break;
        }
        uint64_t off = 0;
        for (;;) {
            ssize_t n = read(fd, chunk, TOK_CHUNK);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0) {
                rc = -errno;
                fy_error("cannot read input %s at offset %llu: %s", inputs[i],
                         (unsigned long long)off, strerror(-rc));
                break;
            }
            if (n == 0)
                break;
            rc = writer_put_bytes(&w, chunk, (size_t)n);
            if (rc < 0)
                break;
            off += (uint64_t)n;
        }
        close(fd);
    }
    free(chunk);
    if (rc == 0 && w.count == 0) {
        /* The inputs were emptied between the two passes. */
        fy_error("%s: the input files are empty: nothing to prepare", out_path);
        rc = -EINVAL;
    }
    if (rc < 0) {
        writer_abort(&w);
        return rc;
    }
    uint64_t count = w.count;
    FY_TRY(writer_finish(&w, overwrite));
    if (count_out != NULL)
        *count_out = count;
    return 0;
}

/* ---- reader ---- */

uint32_t fy_tokfile_token(const struct fy_tokfile *t, uint64_t i)
{
    const uint8_t *p = t->tokens + i * t->width;
    switch (t->width) {
    case 1:
        return p[0];
    case 2:
        return (uint32_t)p[0] | (uint32_t)p[1] << 8;
    default:
        return get_le32(p);
    }
}

/* Largest token in [from, to); a branch-free loop the compiler can vectorise. */
static uint32_t max_token(const struct fy_tokfile *t, uint64_t from, uint64_t to)
{
    uint32_t m = 0;
    if (t->width == 1) {
        for (uint64_t i = from; i < to; i++)
            m = t->tokens[i] > m ? t->tokens[i] : m;
    } else if (t->width == 2) {
        for (uint64_t i = from; i < to; i++) {
            uint32_t v = (uint32_t)t->tokens[2 * i] | (uint32_t)t->tokens[2 * i + 1] << 8;
            m = v > m ? v : m;
        }
    } else {
        for (uint64_t i = from; i < to; i++) {
            uint32_t v = get_le32(t->tokens + 4 * i);
            m = v > m ? v : m;
        }
    }
    return m;
}

/* Every token must be below the model's vocabulary and the file's own; names the first that is
 * not. */
static int check_tokens(const struct fy_tokfile *t, uint32_t model_vocab)
{
    uint32_t limit = t->vocab;
    if (model_vocab != 0 && model_vocab < limit)
        limit = model_vocab;
    const uint64_t block = 1u << 16;
    for (uint64_t from = 0; from < t->count; from += block) {
        uint64_t to = from + block < t->count ? from + block : t->count;
        if (max_token(t, from, to) < limit)
            continue;
        for (uint64_t i = from; i < to; i++) {
            uint32_t v = fy_tokfile_token(t, i);
            if (model_vocab != 0 && v >= model_vocab) {
                fy_error("%s: token %u at index %llu is outside the model's vocabulary of %u: "
                         "prepare the data with the model's tokenizer",
                         t->path, v, (unsigned long long)i, model_vocab);
                return -ERANGE;
            }
            if (v >= t->vocab) {
                fy_error("%s: token %u at index %llu is outside the file's vocabulary of %u: the "
                         "file is corrupt, prepare it again",
                         t->path, v, (unsigned long long)i, t->vocab);
                return -EBADMSG;
            }
        }
    }
    return 0;
}

/* Validates the header and size of an opened file; fills t's fields. */
static int check_header(struct fy_tokfile *t, const uint8_t *h, uint64_t file_size,
                        uint32_t model_vocab)
{
    const char *path = t->path;
    FY_REQUIRE(get_le32(h + 4 * FY_TOKFILE_SLOT_MAGIC) == FY_TOKFILE_MAGIC, -EBADMSG,
               "%s: not a Fuyou token file: prepare it with fuyou-launch prepare", path);
    uint32_t version = get_le32(h + 4 * FY_TOKFILE_SLOT_VERSION);
    FY_REQUIRE(version == FY_TOKFILE_VERSION, -EBADMSG,
               "%s: token file version %u, this build reads version %d: prepare it again with this "
               "build's fuyou-launch prepare",
               path, version, FY_TOKFILE_VERSION);
    uint32_t stored = get_le32(h + 4 * FY_TOKFILE_SLOT_CHECKSUM);
    uint32_t computed = fy_tokfile_header_checksum(h);
    FY_REQUIRE(stored == computed, -EBADMSG,
               "%s: bad header checksum (stored 0x%08x, computed 0x%08x): the file is corrupt, "
               "prepare it again",
               path, stored, computed);
    uint32_t width = get_le32(h + 4 * FY_TOKFILE_SLOT_WIDTH);
    FY_REQUIRE(width == 1 || width == 2 || width == 4, -EBADMSG,
               "%s: bad token width %u in the header (expected 1, 2 or 4): prepare it again", path,
               width);
    uint32_t flags = get_le32(h + 4 * FY_TOKFILE_SLOT_FLAGS);
    FY_REQUIRE((flags & FY_TOKFILE_FLAG_LOSS_MASK) == 0, -ENOTSUP,
               "%s: the file has a loss-mask plane (flags 0x%x), which this build does not "
               "support: prepare it without a loss mask",
               path, flags);
    FY_REQUIRE(flags == 0, -ENOTSUP,
               "%s: unknown flags 0x%x in the header: written by a newer build? prepare it again",
               path, flags);
    uint32_t vocab = get_le32(h + 4 * FY_TOKFILE_SLOT_VOCAB);
    FY_REQUIRE(vocab >= 1 && vocab <= (uint32_t)INT32_MAX, -EBADMSG,
               "%s: bad vocabulary size %u in the header: prepare it again", path, vocab);
    uint64_t count = (uint64_t)get_le32(h + 4 * FY_TOKFILE_SLOT_COUNT_LO) |
                     (uint64_t)get_le32(h + 4 * FY_TOKFILE_SLOT_COUNT_HI) << 32;
    FY_REQUIRE(count > 0, -EBADMSG, "%s: the file holds no tokens: prepare it from non-empty text",
               path);
    uint64_t data_max = (UINT64_MAX - FY_TOKFILE_HEADER_BYTES) / width;
    if (count > data_max) {
        fy_error("%s: truncated: expected more than 2^64 bytes for %llu tokens, found %llu", path,
                 (unsigned long long)count, (unsigned long long)file_size);
        return -EBADMSG;
    }
    uint64_t expected = FY_TOKFILE_HEADER_BYTES + count * width;
    FY_REQUIRE(file_size >= expected, -EBADMSG,
               "%s: truncated: expected %llu bytes, found %llu: copy or prepare it again", path,
               (unsigned long long)expected, (unsigned long long)file_size);
    FY_REQUIRE(model_vocab == 0 || vocab <= model_vocab, -ERANGE,
               "%s: made for vocabulary %u, the model has %u: prepare the data with the model's "
               "tokenizer",
               path, vocab, model_vocab);
    t->width = width;
    t->vocab = vocab;
    t->count = count;
    t->eval_start = count;
    return 0;
}

static int open_into(struct fy_tokfile *t, const char *path, uint32_t model_vocab)
{
    FY_REQUIRE(strlen(path) < TOK_PATH_MAX, -ENAMETOOLONG, "token file path too long: %.200s...",
               path);
    FY_REQUIRE(model_vocab <= (uint32_t)INT32_MAX, -EINVAL,
               "%s: model vocabulary %u out of range (at most %d)", path, model_vocab, INT32_MAX);
    snprintf(t->path, sizeof t->path, "%s", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        fy_error("cannot open token file %s: %s (check the path, or prepare it with fuyou-launch "
                 "prepare)",
                 path, strerror(e));
        return -e;
    }
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0) {
        rc = -errno;
        fy_error("cannot stat token file %s: %s", path, strerror(-rc));
    } else if (!S_ISREG(st.st_mode)) {
        rc = -EINVAL;
        fy_error("token file %s is not a regular file: give the prepared token file", path);
    } else if ((uint64_t)st.st_size < FY_TOKFILE_HEADER_BYTES) {
        rc = -EBADMSG;
        fy_error("%s: %llu bytes, shorter than the %d-byte header: not a Fuyou token file or "
                 "truncated; prepare it with fuyou-launch prepare",
                 path, (unsigned long long)st.st_size, FY_TOKFILE_HEADER_BYTES);
    }
    if (rc == 0) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            rc = -errno;
            fy_error("cannot map token file %s (%llu bytes): %s", path,
                     (unsigned long long)st.st_size, strerror(-rc));
        } else {
            t->map = m;
            t->map_len = (size_t)st.st_size;
            t->tokens = t->map + FY_TOKFILE_HEADER_BYTES;
        }
    }
    close(fd);
    if (rc < 0)
        return rc;
    FY_TRY(check_header(t, t->map, (uint64_t)st.st_size, model_vocab));
    return check_tokens(t, model_vocab);
}

int fy_tokfile_open(struct fy_tokfile **out, const char *path, uint32_t model_vocab)
{
    *out = NULL;
    struct fy_tokfile *t = calloc(1, sizeof *t);
    FY_REQUIRE(t != NULL, -ENOMEM, "%s: out of memory opening the token file", path);
    int rc = open_into(t, path, model_vocab);
    if (rc < 0) {
        fy_tokfile_close(&t);
        return rc;
    }
    *out = t;
    return 0;
}

void fy_tokfile_close(struct fy_tokfile **t)
{
    if (t == NULL || *t == NULL)
        return;
    if ((*t)->map != NULL)
        munmap((void *)(*t)->map, (*t)->map_len);
    free(*t);
    *t = NULL;
}

uint64_t fy_tokfile_count(const struct fy_tokfile *t) { return t->count; }
uint32_t fy_tokfile_vocab(const struct fy_tokfile *t) { return t->vocab; }
uint32_t fy_tokfile_width(const struct fy_tokfile *t) { return t->width; }

/* ---- splits and sampling ---- */

int fy_tokfile_split(struct fy_tokfile *t, double eval_fraction)
{
    FY_REQUIRE(eval_fraction >= 0.0 && eval_fraction <= 1.0, -EINVAL,
               "%s: eval fraction %g is outside [0, 1]: give e.g. 0.05", t->path, eval_fraction);
    /* Round half up; truncation is floor here since the value is non-negative. */
    uint64_t n_eval = (uint64_t)((double)t->count * eval_fraction + 0.5);
    if (n_eval > t->count)
        n_eval = t->count;
    uint64_t n_train = t->count - n_eval;
    FY_REQUIRE(n_train >= 2 && n_eval >= 2, -EINVAL,
               "%s: eval fraction %g of %llu tokens leaves %llu training and %llu eval tokens; "
               "each split needs at least 2: change the fraction or use more data",
               t->path, eval_fraction, (unsigned long long)t->count, (unsigned long long)n_train,
               (unsigned long long)n_eval);
    t->eval_start = n_train;
    return 0;
}

uint64_t fy_tokfile_split_tokens(const struct fy_tokfile *t, int split)
{
    if (split == FY_TOKFILE_TRAIN)
        return t->eval_start;
    if (split == FY_TOKFILE_EVAL)
        return t->count - t->eval_start;
    return 0;
}

static const char *split_name(int split) { return split == FY_TOKFILE_EVAL ? "eval" : "training"; }

static int check_window(const struct fy_tokfile *t, int split, int B, int T)
{
    FY_REQUIRE(split == FY_TOKFILE_TRAIN || split == FY_TOKFILE_EVAL, -EINVAL,
               "%s: unknown split %d (use FY_TOKFILE_TRAIN or FY_TOKFILE_EVAL)", t->path, split);
    FY_REQUIRE(B > 0 && T > 0, -EINVAL, "%s: batch size %d and sequence length %d must be positive",
               t->path, B, T);
    uint64_t n = fy_tokfile_split_tokens(t, split);
    FY_REQUIRE(n >= (uint64_t)T + 1, -EINVAL,
               "%s: batch larger than the data: the %s split has %llu tokens, a window needs T+1 = "
               "%llu; use a shorter sequence length or more data",
               t->path, split_name(split), (unsigned long long)n, (unsigned long long)T + 1);
    return 0;
}

/* Copies the window of T+1 tokens at absolute index start into row b. */
static void fill_row(const struct fy_tokfile *t, uint64_t start, int b, int T, int32_t *inputs,
                     int32_t *targets)
{
    int32_t *in = inputs + (size_t)b * (size_t)T, *tg = targets + (size_t)b * (size_t)T;
    uint32_t prev = fy_tokfile_token(t, start);
    for (int j = 0; j < T; j++) {
        uint32_t next = fy_tokfile_token(t, start + (uint64_t)j + 1);
        in[j] = (int32_t)prev; /* tokens < vocab <= INT32_MAX, checked at open */
        tg[j] = (int32_t)next;
        prev = next;
    }
}

/* splitmix64's finaliser: a bijective mixer with good avalanche, integer-only so every machine
 * gets the same bits. */
static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int fy_tokfile_batch(const struct fy_tokfile *t, int split, uint64_t seed, uint64_t step, int B,
                     int T, int32_t *inputs, int32_t *targets)
{
    FY_TRY(check_window(t, split, B, T));
    uint64_t base = split == FY_TOKFILE_EVAL ? t->eval_start : 0;
    uint64_t starts = fy_tokfile_split_tokens(t, split) - (uint64_t)T; /* >= 1 */
    uint64_t key = mix64(mix64(mix64(seed) ^ (uint64_t)split) ^ step);
    for (int b = 0; b < B; b++) {
        /* Modulo bias is at most starts / 2^64: negligible. */
        uint64_t r = mix64(key ^ (uint64_t)b);
        fill_row(t, base + r % starts, b, T, inputs, targets);
    }
    return 0;
}

uint64_t fy_tokfile_eval_windows(const struct fy_tokfile *t, int T)
{
    uint64_t n = fy_tokfile_split_tokens(t, FY_TOKFILE_EVAL);
    if (T <= 0 || n < (uint64_t)T + 1)
        return 0;
    return (n - 1) / (uint64_t)T;
}

int fy_tokfile_eval_batch(const struct fy_tokfile *t, uint64_t index, int B, int T,
                          int32_t *inputs, int32_t *targets)
{
    FY_TRY(check_window(t, FY_TOKFILE_EVAL, B, T));
    uint64_t windows = fy_tokfile_eval_windows(t, T);
    /* (index*B + b) mod windows without overflowing index*B. */
    uint64_t k = (uint64_t)((unsigned __int128)index * (unsigned)B % windows);
    for (int b = 0; b < B; b++) {
        fill_row(t, t->eval_start + k * (uint64_t)T, b, T, inputs, targets);
        k = k + 1 == windows ? 0 : k + 1;
    }
    return 0;
}
