/* Token files' writers (tokwriter.h; the format is tokfile.h): an atomic streaming writer whose
 * memory stays bounded (mask bits and document starts spill to unlinked side files), the one-call
 * writers over it, and the byte-level preparation of text inputs. */
#include "common/formats/tokwriter.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/base/check.h"
#include "common/base/fsutil.h"

#define TOK_PATH_MAX 4096
/* Size of the writer's staging buffer and of the preparation's read chunks. */
#define TOK_CHUNK (1u << 20)

static void put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static void put_le64(uint8_t *p, uint64_t v)
{
    put_le32(p, (uint32_t)v);
    put_le32(p + 4, (uint32_t)(v >> 32));
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

static const volatile sig_atomic_t *stop_flag; /* fy_tokwriter_stop_on */

void fy_tokwriter_stop_on(const volatile sig_atomic_t *flag) { stop_flag = flag; }

static int write_all(struct tok_writer *w, const void *data, size_t len)
{
    if (stop_flag != NULL && *stop_flag)
        return -EINTR;
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
    w->src = src != NULL
                 ? *src
                 : (struct fy_tokfile_source){FY_TOKENIZER_UNSPECIFIED, 0, FY_TOKFILE_NO_EOS, NULL};
    if (w->src.name != NULL && strlen(w->src.name) < sizeof w->name)
        memcpy(w->name, w->src.name, strlen(w->src.name) + 1);
    w->src.name = NULL;
    int rc = 0;
    w->buf = malloc(TOK_CHUNK);
    if (keep_mask)
        w->mbuf = calloc(1, TOK_CHUNK);
    FY_REQUIRE_OUT(rc, w->buf != NULL && (!keep_mask || w->mbuf != NULL), -ENOMEM,
                   "%s: out of memory for the write buffers", path);
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        rc = -errno;
        fy_error("cannot create %s: %s (check that the directory exists and is writable)", w->tmp,
                 strerror(-rc));
        goto out;
    }
    if (keep_mask) {
        /* Unlinked at once: a crash leaves nothing of it. */
        w->mfd = open(w->mtmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (w->mfd < 0) {
            rc = -errno;
            fy_error("cannot create %s: %s", w->mtmp, strerror(-rc));
            goto out;
        }
        unlink(w->mtmp);
    }
    /* The real header goes in last, once the count is known; a crash leaves only the .tmp. */
    memset(w->buf, 0, FY_TOKFILE_HEADER_BYTES);
    FY_TRY_OUT(rc, write_all(w, w->buf, FY_TOKFILE_HEADER_BYTES));
out:
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
    size_t pad = (size_t)(fy_tokfile_align(w->offset) - w->offset);
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

/* The header (version 1 for a file with neither a mask, documents nor a tokenizer identity,
 * version 3 with documents, else 2), written over the zeros at the file's start. */
static int write_header(struct tok_writer *w, int plane, int docs)
{
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
        return -e;
    }
    return 0;
}

/* Syncs and closes the .tmp, then renames it to the token file's name (not over an existing file
 * unless overwrite); the .tmp is removed where this fails after closing it. */
static int put_in_place(struct tok_writer *w, int overwrite)
{
    if (fsync(w->fd) != 0) {
        int rc = -errno;
        fy_error("fsync of %s: %s (disk full or failing?)", w->tmp, strerror(-rc));
        return rc;
    }
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0) {
        int rc = -errno;
        fy_error("close of %s: %s (disk full?)", w->tmp, strerror(-rc));
        unlink(w->tmp);
        return rc;
    }
    /* RENAME_NOREPLACE closes the window between the existence check and the rename; fall back to
     * a plain rename on filesystems that do not support it. */
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
        int rc = -errno;
        if (rc == -EEXIST)
            fy_error("%s already exists: remove it or pass --overwrite", w->path);
        else
            fy_error("cannot rename %s to %s: %s", w->tmp, w->path, strerror(-rc));
        unlink(w->tmp);
        return rc;
    }
    return 0;
}

/* Pads, writes the header, syncs and renames into place. Aborts (removes the .tmp) on failure. */
static int writer_finish(struct tok_writer *w, int overwrite)
{
    int rc = 0;
    int plane = w->mbuf != NULL && w->masked > 0;
    int docs = w->dbuf != NULL && w->n_docs > 0;
    FY_TRY_OUT(rc, writer_flush(w));
    FY_REQUIRE_OUT(
        rc, !(w->count > 0 && w->masked == w->count), -EINVAL,
        "%s: every one of the %llu tokens is masked out of the loss: nothing to train on", w->path,
        (unsigned long long)w->count);
    if (plane)
        FY_TRY_OUT(rc, write_mask_plane(w));
    if (docs)
        FY_TRY_OUT(rc, write_section(w, w->dfd, w->doff, w->dbuf, w->dfill, "document starts"));
    FY_TRY_OUT(rc, write_padding(w));
    FY_TRY_OUT(rc, write_header(w, plane, docs));
    FY_TRY_OUT(rc, put_in_place(w, overwrite));
out:
    writer_abort(w); /* the .tmp is gone by now unless something failed before the rename */
    return rc < 0 ? rc : fy_fsync_parent(w->path);
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

/* Appends one input's bytes, a document of its own (an empty input none), read in chunks. */
static int put_input(struct tok_writer *w, const char *in, uint8_t *chunk)
{
    uint64_t size = 0;
    int fd = open_input(in, &size);
    if (fd < 0)
        return fd;
    w->doc_next = 1;
    int rc = 0;
    uint64_t off = 0;
    for (;;) {
        ssize_t n = read(fd, chunk, TOK_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = -errno;
            fy_error("cannot read input %s at offset %llu: %s", in, (unsigned long long)off,
                     strerror(-rc));
            break;
        }
        if (n == 0)
            break;
        rc = writer_put_bytes(w, chunk, (size_t)n);
        if (rc < 0)
            break;
        off += (uint64_t)n;
    }
    close(fd);
    return rc;
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
    int rc = 0;
    uint8_t *chunk = malloc(TOK_CHUNK);
    FY_REQUIRE_OUT(rc, chunk != NULL, -ENOMEM, "%s: out of memory for a %u-byte read buffer",
                   out_path, TOK_CHUNK);
    FY_TRY_OUT(rc, docs_begin(&w, 0));
    for (unsigned i = 0; i < n_inputs; i++)
        FY_TRY_OUT(rc, put_input(&w, inputs[i], chunk));
    /* The inputs were emptied between the two passes. */
    FY_REQUIRE_OUT(rc, w.count > 0, -EINVAL, "%s: the input files are empty: nothing to prepare",
                   out_path);
    uint64_t count = w.count;
    FY_TRY_OUT(rc, writer_finish(&w, overwrite));
    if (count_out != NULL)
        *count_out = count;
out:
    free(chunk);
    writer_abort(&w); /* after writer_finish, nothing is left to release */
    return rc;
}
