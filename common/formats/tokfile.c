/* Token files (format in tokfile.h): an atomic streaming writer, byte-level preparation of text
 * inputs, and a reader that validates everything up front so training never meets a bad token,
 * with train/eval splits and batch sampling that is a pure function of its arguments. */
#include "common/formats/tokfile.h"

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

#include "common/base/check.h"
#include "common/base/fsutil.h"

#define TOK_PATH_MAX 4096
/* Size of the writer's staging buffer and of the preparation's read chunks. */
#define TOK_CHUNK (1u << 20)

struct fy_tokfile {
    char path[TOK_PATH_MAX];
    const uint8_t *map; /* the whole file, read-only */
    size_t map_len;
    const uint8_t *tokens; /* map + header */
    const uint8_t *mask;   /* the loss-mask plane, NULL when there is none */
    uint64_t mask_off;     /* its offset in the file, 0 when there is none */
    const uint8_t *docs;   /* the document index (version 3), NULL when there is none */
    uint64_t docs_off, n_docs;
    int records; /* the documents are records (flags bit 1) */
    uint64_t count, masked;
    uint32_t width, vocab, version;
    struct fy_tokfile_source src;
    uint64_t eval_start; /* first token of the eval split; == count when there is none */
    uint64_t eval_doc;   /* first document of the eval split; == n_docs when there is none */
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

static void put_le64(uint8_t *p, uint64_t v)
{
    put_le32(p, (uint32_t)v);
    put_le32(p + 4, (uint32_t)(v >> 32));
}

static uint64_t get_le64(const uint8_t *p)
{
    return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32;
}

static uint32_t fnv1a32(const uint8_t *p, size_t n)
{
    uint32_t h = 0x811c9dc5u;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x01000193u;
    }
    return h;
}

uint32_t fy_tokfile_header_checksum(const void *header)
{
    return fnv1a32(header, 4 * FY_TOKFILE_SLOT_CHECKSUM);
}

uint32_t fy_tokfile_header_checksum_v2(const void *header)
{
    return fnv1a32(header, 4 * FY_TOKFILE_V2_SLOT_CHECKSUM);
}

uint32_t fy_tokfile_header_checksum_v3(const void *header)
{
    return fnv1a32(header, 4 * FY_TOKFILE_V3_SLOT_CHECKSUM);
}

int fy_tokfile_hash_file(const char *path, uint64_t *hash)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        fy_error("cannot read %s: %s", path, strerror(e));
        return -e;
    }
    uint8_t buf[1 << 16];
    uint64_t h = 0xcbf29ce484222325ull;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            close(fd);
            fy_error("cannot read %s: %s", path, strerror(e));
            return -e;
        }
        if (n == 0)
            break;
        for (ssize_t i = 0; i < n; i++) {
            h ^= buf[i];
            h *= 0x100000001b3ull;
        }
    }
    close(fd);
    *hash = h;
    return 0;
}

static uint32_t width_for_vocab(uint32_t vocab)
{
    if (vocab <= 256u)
        return 1;
    if (vocab <= 65536u)
        return 2;
    return 4;
}

static uint64_t align4k(uint64_t n)
{
    return (n + FY_TOKFILE_HEADER_BYTES - 1) / FY_TOKFILE_HEADER_BYTES * FY_TOKFILE_HEADER_BYTES;
}

/* ---- writer ---- */

struct tok_writer {
    char path[TOK_PATH_MAX], tmp[TOK_PATH_MAX + 8], mtmp[TOK_PATH_MAX + 16];
    char dtmp[TOK_PATH_MAX + 16];
    int fd;
    uint32_t width, vocab;
    struct fy_tokfile_source src; /* src.name NULL: the copy is name */
    char name[FY_TOKFILE_NAME_MAX];
    uint64_t count, masked;
    uint64_t offset; /* bytes written to tmp so far */
    uint8_t *buf;
    size_t fill;
    /* the mask bits, when the writer keeps them: mbuf holds mbits bits, the earlier ones went to
     * the unlinked side file mfd (moff bytes) */
    int mfd;
    uint8_t *mbuf;
    uint64_t mbits, moff;
    /* the document starts, once the writer is told of documents (dbuf non-NULL): dbuf holds
     * dfill bytes of them, the earlier ones went to the unlinked side file dfd (doff bytes);
     * doc_next: the next token put begins a document */
    int dfd, records, doc_next;
    uint8_t *dbuf;
    size_t dfill;
    uint64_t doff, n_docs;
};

struct fy_tokwriter {
    struct tok_writer w;
    int overwrite;
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
    if (w->mfd >= 0)
        close(w->mfd); /* unlinked at creation */
    w->mfd = -1;
    if (w->dfd >= 0)
        close(w->dfd); /* likewise */
    w->dfd = -1;
    free(w->buf);
    w->buf = NULL;
    free(w->mbuf);
    w->mbuf = NULL;
    free(w->dbuf);
    w->dbuf = NULL;
}

/* keep_mask: the writer records a mask bit per token (fy_tokwriter); otherwise every token is
 * trained. */
static int writer_begin(struct tok_writer *w, const char *path, uint32_t vocab,
                        const struct fy_tokfile_source *src, int keep_mask, int overwrite)
{
    memset(w, 0, sizeof *w);
    w->fd = -1;
    w->mfd = -1;
    w->dfd = -1;
    FY_REQUIRE(strlen(path) < TOK_PATH_MAX, -ENAMETOOLONG, "token file path too long: %.200s...",
               path);
    FY_REQUIRE(vocab >= 1 && vocab <= (uint32_t)INT32_MAX, -EINVAL,
               "%s: vocabulary size %u out of range (1..%d)", path, vocab, INT32_MAX);
    if (src != NULL)
        FY_REQUIRE(src->tokenizer <= FY_TOKENIZER_HF &&
                       (src->eos == FY_TOKFILE_NO_EOS || src->eos < vocab),
                   -EINVAL, "%s: bad tokenizer identity (kind %u, end-of-sequence token %u of %u)",
                   path, src->tokenizer, src->eos, vocab);
    FY_TRY(check_not_existing(path, overwrite));
    snprintf(w->path, sizeof w->path, "%s", path);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp", path);
    snprintf(w->mtmp, sizeof w->mtmp, "%s.tmp.mask", path);
    snprintf(w->dtmp, sizeof w->dtmp, "%s.tmp.docs", path);
    w->vocab = vocab;
    w->width = width_for_vocab(vocab);
    w->src = src != NULL ? *src
                         : (struct fy_tokfile_source){FY_TOKENIZER_UNSPECIFIED, 0,
                                                      FY_TOKFILE_NO_EOS, NULL};
    if (w->src.name != NULL && strlen(w->src.name) < sizeof w->name)
        memcpy(w->name, w->src.name, strlen(w->src.name) + 1);
    w->src.name = NULL;
    w->buf = malloc(TOK_CHUNK);
    if (keep_mask)
        w->mbuf = calloc(1, TOK_CHUNK);
    if (w->buf == NULL || (keep_mask && w->mbuf == NULL)) {
        writer_abort(w);
        fy_error("%s: out of memory for the write buffers", path);
        return -ENOMEM;
    }
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        int e = errno;
        writer_abort(w);
        fy_error("cannot create %s: %s (check that the directory exists and is writable)", w->tmp,
                 strerror(e));
        return -e;
    }
    if (keep_mask) {
        /* Unlinked at once: a crash leaves nothing of it. */
        w->mfd = open(w->mtmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (w->mfd < 0) {
            int e = errno;
            writer_abort(w);
            fy_error("cannot create %s: %s", w->mtmp, strerror(e));
            return -e;
        }
        unlink(w->mtmp);
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

/* Appends n mask bits of value `trained`; full chunks go to the side file. */
static int mask_put(struct tok_writer *w, uint64_t n, int trained)
{
    if (!trained)
        w->masked += n;
    while (n > 0) {
        if (w->mbits == (uint64_t)TOK_CHUNK * 8) {
            FY_TRY(fy_write_all(w->mfd, w->mbuf, TOK_CHUNK, w->mtmp, w->moff));
            w->moff += TOK_CHUNK;
            memset(w->mbuf, 0, TOK_CHUNK);
            w->mbits = 0;
        }
        uint64_t room = (uint64_t)TOK_CHUNK * 8 - w->mbits;
        uint64_t k = n < room ? n : room;
        if (trained) {
            uint64_t i = w->mbits, end = w->mbits + k;
            for (; i < end && (i & 7); i++)
                w->mbuf[i >> 3] |= (uint8_t)(1u << (i & 7));
            if (end - i >= 8) {
                memset(w->mbuf + (i >> 3), 0xff, (size_t)((end - i) >> 3));
                i += (end - i) & ~(uint64_t)7;
            }
            for (; i < end; i++)
                w->mbuf[i >> 3] |= (uint8_t)(1u << (i & 7));
        }
        w->mbits += k;
        n -= k;
    }
    return 0;
}

/* From now on the writer keeps document starts; `record` says what a document is. */
static int docs_begin(struct tok_writer *w, int record)
{
    if (w->dbuf != NULL) {
        FY_REQUIRE(!w->records == !record, -EINVAL,
                   "%s: documents of two kinds (records and whole text files) in one file",
                   w->path);
        return 0;
    }
    w->dbuf = malloc(TOK_CHUNK);
    FY_REQUIRE(w->dbuf != NULL, -ENOMEM, "%s: out of memory for the document index", w->path);
    w->records = record != 0;
    w->doc_next = w->count == 0; /* tokens put before: a first document, started at 0 */
    if (w->count > 0) {
        put_le64(w->dbuf, 0);
        w->dfill = 8;
        w->n_docs = 1;
    }
    return 0;
}

/* Records a document starting at the next token, where one is due; full chunks of starts go to
 * the side file (created, and unlinked at once, on the first). */
static int doc_start_if_due(struct tok_writer *w)
{
    if (w->dbuf == NULL || !w->doc_next)
        return 0;
    if (w->dfill == TOK_CHUNK) {
        if (w->dfd < 0) {
            w->dfd = open(w->dtmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
            if (w->dfd < 0) {
                int e = errno;
                fy_error("cannot create %s: %s", w->dtmp, strerror(e));
                return -e;
            }
            unlink(w->dtmp);
        }
        FY_TRY(fy_write_all(w->dfd, w->dbuf, TOK_CHUNK, w->dtmp, w->doff));
        w->doff += TOK_CHUNK;
        w->dfill = 0;
    }
    put_le64(w->dbuf + w->dfill, w->count);
    w->dfill += 8;
    w->n_docs++;
    w->doc_next = 0;
    return 0;
}

static int writer_put(struct tok_writer *w, const uint32_t *tokens, uint64_t n)
{
    if (n > 0)
        FY_TRY(doc_start_if_due(w));
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
    if (n > 0)
        FY_TRY(doc_start_if_due(w));
    FY_TRY(writer_flush(w));
    FY_TRY(write_all(w, bytes, n));
    w->count += n;
    return 0;
}

static int write_padding(struct tok_writer *w)
{
    size_t pad = (size_t)(align4k(w->offset) - w->offset);
    memset(w->buf, 0, pad);
    return write_all(w, w->buf, pad);
}

/* Pads what is written so far, then appends a section kept aside: `spilled` bytes of the side
 * file fd, then `tail` bytes of `rest`. */
static int write_section(struct tok_writer *w, int fd, uint64_t spilled, const uint8_t *rest,
                         size_t tail, const char *what)
{
    FY_TRY(write_padding(w));
    for (uint64_t off = 0; off < spilled;) {
        size_t len = spilled - off < TOK_CHUNK ? (size_t)(spilled - off) : TOK_CHUNK;
        ssize_t n = pread(fd, w->buf, len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            fy_error("cannot read back the %s of %s at offset %llu: %s", what, w->tmp,
                     (unsigned long long)off, strerror(e));
            return -e;
        }
        FY_TRY(write_all(w, w->buf, (size_t)n));
        off += (uint64_t)n;
    }
    return write_all(w, rest, tail);
}

/* The mask plane: the side file's bytes and the bits still in mbuf. */
static int write_mask_plane(struct tok_writer *w)
{
    return write_section(w, w->mfd, w->moff, w->mbuf, (size_t)((w->mbits + 7) / 8), "mask bits");
}

/* Pads, writes the header, syncs and renames into place. Aborts (removes the .tmp) on failure. */
static int writer_finish(struct tok_writer *w, int overwrite)
{
    int rc = writer_flush(w);
    int plane = w->mbuf != NULL && w->masked > 0;
    if (rc == 0 && w->masked == w->count && w->count > 0) {
        fy_error("%s: every one of the %llu tokens is masked out of the loss: nothing to train on",
                 w->path, (unsigned long long)w->count);
        rc = -EINVAL;
    }
    if (rc == 0 && plane)
        rc = write_mask_plane(w);
    int docs = w->dbuf != NULL && w->n_docs > 0;
    if (rc == 0 && docs)
        rc = write_section(w, w->dfd, w->doff, w->dbuf, w->dfill, "document starts");
    if (rc == 0)
        rc = write_padding(w);
    if (rc == 0) {
        uint8_t *h = w->buf;
        int v1 = !plane && !docs && w->src.tokenizer == FY_TOKENIZER_UNSPECIFIED;
        uint32_t flags = (plane ? FY_TOKFILE_FLAG_LOSS_MASK : 0) |
                         (docs && w->records ? FY_TOKFILE_FLAG_RECORDS : 0);
        memset(h, 0, FY_TOKFILE_HEADER_BYTES);
        put_le32(h + 4 * FY_TOKFILE_SLOT_MAGIC, FY_TOKFILE_MAGIC);
        put_le32(h + 4 * FY_TOKFILE_SLOT_VERSION, v1 ? 1 : docs ? 3 : 2);
        put_le32(h + 4 * FY_TOKFILE_SLOT_WIDTH, w->width);
        put_le32(h + 4 * FY_TOKFILE_SLOT_VOCAB, w->vocab);
        put_le32(h + 4 * FY_TOKFILE_SLOT_COUNT_LO, (uint32_t)w->count);
        put_le32(h + 4 * FY_TOKFILE_SLOT_COUNT_HI, (uint32_t)(w->count >> 32));
        put_le32(h + 4 * FY_TOKFILE_SLOT_FLAGS, flags);
        if (v1) {
            put_le32(h + 4 * FY_TOKFILE_SLOT_CHECKSUM, fy_tokfile_header_checksum(h));
        } else {
            uint64_t masked = plane ? w->masked : 0;
            put_le32(h + 4 * FY_TOKFILE_SLOT_TOKENIZER, w->src.tokenizer);
            put_le32(h + 4 * FY_TOKFILE_SLOT_TOKHASH_LO, (uint32_t)w->src.hash);
            put_le32(h + 4 * FY_TOKFILE_SLOT_TOKHASH_HI, (uint32_t)(w->src.hash >> 32));
            put_le32(h + 4 * FY_TOKFILE_SLOT_EOS, w->src.eos);
            put_le32(h + 4 * FY_TOKFILE_SLOT_MASKED_LO, (uint32_t)masked);
            put_le32(h + 4 * FY_TOKFILE_SLOT_MASKED_HI, (uint32_t)(masked >> 32));
            if (docs) {
                put_le32(h + 4 * FY_TOKFILE_SLOT_DOCS_LO, (uint32_t)w->n_docs);
                put_le32(h + 4 * FY_TOKFILE_SLOT_DOCS_HI, (uint32_t)(w->n_docs >> 32));
                put_le32(h + 4 * FY_TOKFILE_V3_SLOT_CHECKSUM, fy_tokfile_header_checksum_v3(h));
            } else {
                put_le32(h + 4 * FY_TOKFILE_V2_SLOT_CHECKSUM, fy_tokfile_header_checksum_v2(h));
            }
            memcpy(h + FY_TOKFILE_NAME_OFFSET, w->name, strlen(w->name));
        }
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
    writer_abort(w); /* the .tmp is gone by now unless something failed before the rename */
    if (rc < 0)
        return rc;
    return fy_fsync_parent(w->path);
}

static int check_vocab(const char *path, const uint32_t *tokens, uint64_t count, uint64_t first,
                       uint32_t vocab)
{
    for (uint64_t i = 0; i < count; i++)
        FY_REQUIRE(tokens[i] < vocab, -EINVAL,
                   "%s: token %u at index %llu is outside the vocabulary of %u: fix the tokenizer "
                   "or the vocabulary size",
                   path, tokens[i], (unsigned long long)(first + i), vocab);
    return 0;
}

int fy_tokfile_write_masked(const char *path, const uint32_t *tokens, const uint8_t *trained,
                            uint64_t count, uint32_t vocab, const struct fy_tokfile_source *src,
                            int overwrite)
{
    FY_REQUIRE(count > 0, -EINVAL, "%s: no tokens to write; give at least one token", path);
    FY_REQUIRE(vocab >= 1 && vocab <= (uint32_t)INT32_MAX, -EINVAL,
               "%s: vocabulary size %u out of range (1..%d)", path, vocab, INT32_MAX);
    /* Check everything before creating anything, so a refusal leaves no file behind. */
    FY_TRY(check_vocab(path, tokens, count, 0, vocab));
    struct tok_writer w;
    FY_TRY(writer_begin(&w, path, vocab, src, trained != NULL, overwrite));
    int rc = 0;
    for (uint64_t i = 0; rc == 0 && i < count;) {
        uint64_t j = i + 1;
        while (trained != NULL && j < count && !trained[j] == !trained[i])
            j++;
        rc = writer_put(&w, tokens + i, j - i);
        if (rc == 0 && trained != NULL)
            rc = mask_put(&w, j - i, trained[i] != 0);
        i = j;
    }
    if (rc < 0) {
        writer_abort(&w);
        return rc;
    }
    return writer_finish(&w, overwrite);
}

int fy_tokfile_write(const char *path, const uint32_t *tokens, uint64_t count, uint32_t vocab,
                     int overwrite)
{
    return fy_tokfile_write_masked(path, tokens, NULL, count, vocab, NULL, overwrite);
}

/* ---- the streaming writer ---- */

int fy_tokwriter_begin(struct fy_tokwriter **out, const char *path, uint32_t vocab,
                       const struct fy_tokfile_source *src, int overwrite)
{
    *out = NULL;
    struct fy_tokwriter *t = calloc(1, sizeof *t);
    FY_REQUIRE(t != NULL, -ENOMEM, "%s: out of memory for a token writer", path);
    int rc = writer_begin(&t->w, path, vocab, src, 1, overwrite);
    if (rc < 0) {
        free(t);
        return rc;
    }
    t->overwrite = overwrite;
    *out = t;
    return 0;
}

int fy_tokwriter_put(struct fy_tokwriter *t, const uint32_t *tokens, uint64_t n, int trained)
{
    FY_TRY(check_vocab(t->w.path, tokens, n, t->w.count, t->w.vocab));
    FY_TRY(writer_put(&t->w, tokens, n));
    return mask_put(&t->w, n, trained);
}

int fy_tokwriter_document(struct fy_tokwriter *t, int record)
{
    FY_TRY(docs_begin(&t->w, record));
    t->w.doc_next = 1;
    return 0;
}

uint64_t fy_tokwriter_count(const struct fy_tokwriter *t) { return t->w.count; }

int fy_tokwriter_finish(struct fy_tokwriter **tp, uint64_t *count, uint64_t *masked)
{
    struct fy_tokwriter *t = *tp;
    *tp = NULL;
    int rc = 0;
    if (t->w.count == 0) {
        fy_error("%s: no tokens: nothing to prepare", t->w.path);
        writer_abort(&t->w);
        rc = -EINVAL;
    } else {
        if (count != NULL)
            *count = t->w.count;
        if (masked != NULL)
            *masked = t->w.masked;
        rc = writer_finish(&t->w, t->overwrite);
    }
    free(t);
    return rc;
}

void fy_tokwriter_abort(struct fy_tokwriter **tp)
{
    if (tp == NULL || *tp == NULL)
        return;
    writer_abort(&(*tp)->w);
    free(*tp);
    *tp = NULL;
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
    const struct fy_tokfile_source bytes = {FY_TOKENIZER_BYTES, 0, FY_TOKFILE_NO_EOS, NULL};
    FY_TRY(writer_begin(&w, out_path, FY_TOKFILE_BYTE_VOCAB, &bytes, 0, overwrite));
    uint8_t *chunk = malloc(TOK_CHUNK);
    int rc = chunk != NULL ? 0 : -ENOMEM;
    if (rc < 0)
        fy_error("%s: out of memory for a %u-byte read buffer", out_path, TOK_CHUNK);
    if (rc == 0)
        rc = docs_begin(&w, 0);
    for (unsigned i = 0; rc == 0 && i < n_inputs; i++) {
        uint64_t size = 0;
        int fd = open_input(inputs[i], &size);
        if (fd < 0) {
            rc = fd;
            break;
        }
        w.doc_next = 1; /* each input a document (an empty one none) */
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
    FY_REQUIRE(version >= 1 && version <= 3, -EBADMSG,
               "%s: token file version %u, this build reads versions 1 to 3: written by a newer "
               "build? prepare it again with this build's fuyou-launch prepare",
               path, version);
    int v2 = version >= 2, v3 = version == 3; /* v2: the slots version 2 and 3 share */
    uint32_t stored = get_le32(h + 4 * (v3   ? FY_TOKFILE_V3_SLOT_CHECKSUM
                                        : v2 ? FY_TOKFILE_V2_SLOT_CHECKSUM
                                             : FY_TOKFILE_SLOT_CHECKSUM));
    uint32_t computed = v3   ? fy_tokfile_header_checksum_v3(h)
                        : v2 ? fy_tokfile_header_checksum_v2(h)
                             : fy_tokfile_header_checksum(h);
    FY_REQUIRE(stored == computed, -EBADMSG,
               "%s: bad header checksum (stored 0x%08x, computed 0x%08x): the file is corrupt, "
               "prepare it again",
               path, stored, computed);
    uint32_t width = get_le32(h + 4 * FY_TOKFILE_SLOT_WIDTH);
    FY_REQUIRE(width == 1 || width == 2 || width == 4, -EBADMSG,
               "%s: bad token width %u in the header (expected 1, 2 or 4): prepare it again", path,
               width);
    uint32_t flags = get_le32(h + 4 * FY_TOKFILE_SLOT_FLAGS);
    FY_REQUIRE(v2 || (flags & FY_TOKFILE_FLAG_LOSS_MASK) == 0, -ENOTSUP,
               "%s: a version 1 header with the loss-mask flag (flags 0x%x): version 1 files have "
               "no loss mask; prepare it again with this build's fuyou-launch prepare",
               path, flags);
    uint32_t known = FY_TOKFILE_FLAG_LOSS_MASK | (v3 ? FY_TOKFILE_FLAG_RECORDS : 0);
    FY_REQUIRE((flags & ~known) == 0, -ENOTSUP,
               "%s: unknown flags 0x%x in the header: written by a newer build? prepare it again",
               path, flags);
    t->src = (struct fy_tokfile_source){FY_TOKENIZER_UNSPECIFIED, 0, FY_TOKFILE_NO_EOS, NULL};
    t->masked = 0;
    if (v2) {
        t->src.tokenizer = get_le32(h + 4 * FY_TOKFILE_SLOT_TOKENIZER);
        t->src.hash = (uint64_t)get_le32(h + 4 * FY_TOKFILE_SLOT_TOKHASH_LO) |
                      (uint64_t)get_le32(h + 4 * FY_TOKFILE_SLOT_TOKHASH_HI) << 32;
        t->src.eos = get_le32(h + 4 * FY_TOKFILE_SLOT_EOS);
        t->masked = (uint64_t)get_le32(h + 4 * FY_TOKFILE_SLOT_MASKED_LO) |
                    (uint64_t)get_le32(h + 4 * FY_TOKFILE_SLOT_MASKED_HI) << 32;
        const char *name = (const char *)h + FY_TOKFILE_NAME_OFFSET;
        const char *end = memchr(name, 0, FY_TOKFILE_NAME_MAX);
        int printable = end != NULL && end > name;
        for (const char *c = name; printable && c < end; c++)
            printable = (unsigned char)*c >= 0x20 && *c != 0x7f;
        t->src.name = printable ? name : NULL;
        FY_REQUIRE(t->src.tokenizer <= FY_TOKENIZER_HF, -ENOTSUP,
                   "%s: unknown tokenizer kind %u in the header: written by a newer build? "
                   "prepare it again",
                   path, t->src.tokenizer);
        FY_REQUIRE((flags & FY_TOKFILE_FLAG_LOSS_MASK) || t->masked == 0, -EBADMSG,
                   "%s: %llu masked tokens but no mask plane: the file is corrupt, prepare it "
                   "again",
                   path, (unsigned long long)t->masked);
    }
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
    if (flags & FY_TOKFILE_FLAG_LOSS_MASK) {
        FY_REQUIRE(count < (1ull << 60), -EBADMSG,
                   "%s: truncated: %llu tokens with a mask plane cannot fit in %llu bytes", path,
                   (unsigned long long)count, (unsigned long long)file_size);
        FY_REQUIRE(t->masked > 0 && t->masked < count, -EBADMSG,
                   "%s: the header counts %llu masked tokens of %llu (a mask plane needs at least "
                   "one masked and one trained token): the file is corrupt, prepare it again",
                   path, (unsigned long long)t->masked, (unsigned long long)count);
        t->mask_off = align4k(expected);
        expected = t->mask_off + (count + 7) / 8;
    }
    t->n_docs = 0;
    t->records = 0;
    if (v3) {
        t->n_docs = (uint64_t)get_le32(h + 4 * FY_TOKFILE_SLOT_DOCS_LO) |
                    (uint64_t)get_le32(h + 4 * FY_TOKFILE_SLOT_DOCS_HI) << 32;
        FY_REQUIRE(t->n_docs >= 1 && t->n_docs <= count, -EBADMSG,
                   "%s: the header counts %llu documents of %llu tokens (1 to the token count): "
                   "the file is corrupt, prepare it again",
                   path, (unsigned long long)t->n_docs, (unsigned long long)count);
        FY_REQUIRE(count < (1ull << 60), -EBADMSG,
                   "%s: truncated: %llu tokens with a document index cannot fit in %llu bytes",
                   path, (unsigned long long)count, (unsigned long long)file_size);
        t->docs_off = align4k(expected);
        expected = t->docs_off + t->n_docs * 8;
        t->records = (flags & FY_TOKFILE_FLAG_RECORDS) != 0;
    }
    FY_REQUIRE(file_size >= expected, -EBADMSG,
               "%s: truncated: expected %llu bytes, found %llu: copy or prepare it again", path,
               (unsigned long long)expected, (unsigned long long)file_size);
    FY_REQUIRE(t->src.eos == FY_TOKFILE_NO_EOS || t->src.eos < vocab, -EBADMSG,
               "%s: end-of-sequence token %u outside the file's vocabulary of %u: the file is "
               "corrupt, prepare it again",
               path, t->src.eos, vocab);
    if (model_vocab != 0 && vocab > model_vocab) {
        char who[FY_TOKFILE_NAME_MAX + 64];
        fy_tokfile_describe_source(&t->src, who, sizeof who);
        fy_error("%s: made for vocabulary %u, the model has %u (the file's: %s): prepare the "
                 "data with the model's tokenizer (fuyou-launch prepare --tokenizer MODEL_DIR)",
                 path, vocab, model_vocab, who);
        return -ERANGE;
    }
    t->width = width;
    t->vocab = vocab;
    t->count = count;
    t->version = version;
    t->eval_start = count;
    t->eval_doc = t->n_docs;
    return 0;
}

/* The document index: the first start 0, each next one larger, all below the token count. */
static int check_docs(const struct fy_tokfile *t)
{
    uint64_t prev = 0;
    for (uint64_t i = 0; i < t->n_docs; i++) {
        uint64_t at = get_le64(t->docs + 8 * i);
        if ((i == 0 && at != 0) || (i > 0 && at <= prev) || at >= t->count) {
            fy_error("%s: document %llu starts at token %llu (after %llu, of %llu tokens): the "
                     "document index is corrupt, prepare the file again",
                     t->path, (unsigned long long)i, (unsigned long long)at,
                     (unsigned long long)prev, (unsigned long long)t->count);
            return -EBADMSG;
        }
        prev = at;
    }
    return 0;
}

/* The mask plane's zero bits must number what the header says, and the bits after the last token
 * must be 0. */
static int check_mask(const struct fy_tokfile *t)
{
    uint64_t full = t->count / 8, ones = 0;
    for (uint64_t i = 0; i < full; i++)
        ones += (uint64_t)__builtin_popcount(t->mask[i]);
    unsigned rest = (unsigned)(t->count % 8);
    if (rest) {
        uint8_t last = t->mask[full];
        FY_REQUIRE((last >> rest) == 0, -EBADMSG,
                   "%s: mask bits set after the last token: the file is corrupt, prepare it again",
                   t->path);
        ones += (uint64_t)__builtin_popcount(last);
    }
    FY_REQUIRE(t->count - ones == t->masked, -EBADMSG,
               "%s: the mask plane has %llu masked tokens, the header says %llu: the file is "
               "corrupt, prepare it again",
               t->path, (unsigned long long)(t->count - ones), (unsigned long long)t->masked);
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
    if (t->mask_off != 0) {
        t->mask = t->map + t->mask_off;
        FY_TRY(check_mask(t));
    }
    if (t->n_docs != 0) {
        t->docs = t->map + t->docs_off;
        FY_TRY(check_docs(t));
    }
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
uint32_t fy_tokfile_version(const struct fy_tokfile *t) { return t->version; }
uint64_t fy_tokfile_documents(const struct fy_tokfile *t) { return t->n_docs; }
int fy_tokfile_documents_are_records(const struct fy_tokfile *t) { return t->records; }

uint64_t fy_tokfile_document_start(const struct fy_tokfile *t, uint64_t i)
{
    return get_le64(t->docs + 8 * i);
}

uint64_t fy_tokfile_document_end(const struct fy_tokfile *t, uint64_t i)
{
    return i + 1 < t->n_docs ? get_le64(t->docs + 8 * (i + 1)) : t->count;
}

void fy_tokfile_describe_source(const struct fy_tokfile_source *src, char *buf, size_t len)
{
    if (src->tokenizer == FY_TOKENIZER_HF)
        snprintf(buf, len, "Hugging Face tokenizer.json %016llx%s%s%s",
                 (unsigned long long)src->hash, src->name ? " (" : "", src->name ? src->name : "",
                 src->name ? ")" : "");
    else if (src->tokenizer == FY_TOKENIZER_BYTES)
        snprintf(buf, len, "byte-level tokenizer");
    else
        snprintf(buf, len, "tokenizer not recorded");
}
struct fy_tokfile_source fy_tokfile_source(const struct fy_tokfile *t) { return t->src; }
uint64_t fy_tokfile_masked(const struct fy_tokfile *t) { return t->masked; }

int fy_tokfile_trained(const struct fy_tokfile *t, uint64_t i)
{
    return t->mask == NULL || (t->mask[i >> 3] >> (i & 7) & 1u);
}

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
    t->eval_doc = t->n_docs;
    return 0;
}

int fy_tokfile_split_documents(struct fy_tokfile *t, double eval_fraction)
{
    FY_REQUIRE(eval_fraction >= 0.0 && eval_fraction <= 1.0, -EINVAL,
               "%s: eval fraction %g is outside [0, 1]: give e.g. 0.05", t->path, eval_fraction);
    FY_REQUIRE(t->n_docs > 0, -EINVAL,
               "%s: the file records no documents (a version %u token file): prepare it again "
               "with this build's fuyou-launch prepare, or train with --packing windows",
               t->path, t->version);
    /* Round half up, as the split by tokens. */
    uint64_t n_eval = (uint64_t)((double)t->n_docs * eval_fraction + 0.5);
    if (n_eval > t->n_docs)
        n_eval = t->n_docs;
    uint64_t n_train = t->n_docs - n_eval;
    FY_REQUIRE(n_train >= 1 && n_eval >= 1, -EINVAL,
               "%s: eval fraction %g of %llu documents leaves %llu training and %llu held-out "
               "documents; each split needs at least 1: change --eval-fraction or use more data",
               t->path, eval_fraction, (unsigned long long)t->n_docs, (unsigned long long)n_train,
               (unsigned long long)n_eval);
    t->eval_doc = n_train;
    t->eval_start = fy_tokfile_document_start(t, n_train);
    return 0;
}

uint64_t fy_tokfile_eval_first_document(const struct fy_tokfile *t) { return t->eval_doc; }

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
        tg[j] = fy_tokfile_trained(t, start + (uint64_t)j + 1) ? (int32_t)next : -1;
        prev = next;
    }
}

/* splitmix64's finaliser: a bijective mixer with good avalanche, integer-only so every machine
 * gets the same bits. */
uint64_t fy_tokfile_mix64(uint64_t z)
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
    uint64_t key = fy_tokfile_mix64(seed) ^ (uint64_t)split;
    key = fy_tokfile_mix64(fy_tokfile_mix64(key) ^ step);
    for (int b = 0; b < B; b++) {
        /* Modulo bias is at most starts / 2^64: negligible. */
        uint64_t r = fy_tokfile_mix64(key ^ (uint64_t)b);
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
