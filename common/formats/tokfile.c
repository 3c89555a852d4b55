/* Token files (format in tokfile.h): the header's checksums, and a reader that validates
 * everything up front so training never meets a bad token, with train/eval splits and batch
 * sampling that is a pure function of its arguments. The writers are tokwriter.c. */
#include "common/formats/tokfile.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/base/check.h"

#define TOK_PATH_MAX 4096

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

static uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
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

/* The header's identity: magic, version, checksum, token width and flags, each as this build
 * reads them. */
static int check_ident(const char *path, const uint8_t *h, uint32_t *version_out,
                       uint32_t *width_out, uint32_t *flags_out)
{
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
    *version_out = version;
    *width_out = width;
    *flags_out = flags;
    return 0;
}

/* Version 2 and 3: the tokenizer's identity and the masked tokens (none for version 1). */
static int read_source(struct fy_tokfile *t, const uint8_t *h, uint32_t version, uint32_t flags)
{
    const char *path = t->path;
    t->src = (struct fy_tokfile_source){FY_TOKENIZER_UNSPECIFIED, 0, FY_TOKFILE_NO_EOS, NULL};
    t->masked = 0;
    if (version < 2)
        return 0;
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
    return 0;
}

/* Where the sections lie (the tokens, the mask plane, the document index), each checked against
 * the file's size. */
static int check_sections(struct fy_tokfile *t, const uint8_t *h, uint64_t file_size,
                          uint32_t version, uint32_t width, uint32_t flags, uint64_t count)
{
    const char *path = t->path;
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
        t->mask_off = fy_tokfile_align(expected);
        expected = t->mask_off + (count + 7) / 8;
    }
    t->n_docs = 0;
    t->records = 0;
    if (version == 3) {
        t->n_docs = (uint64_t)get_le32(h + 4 * FY_TOKFILE_SLOT_DOCS_LO) |
                    (uint64_t)get_le32(h + 4 * FY_TOKFILE_SLOT_DOCS_HI) << 32;
        FY_REQUIRE(t->n_docs >= 1 && t->n_docs <= count, -EBADMSG,
                   "%s: the header counts %llu documents of %llu tokens (1 to the token count): "
                   "the file is corrupt, prepare it again",
                   path, (unsigned long long)t->n_docs, (unsigned long long)count);
        FY_REQUIRE(count < (1ull << 60), -EBADMSG,
                   "%s: truncated: %llu tokens with a document index cannot fit in %llu bytes",
                   path, (unsigned long long)count, (unsigned long long)file_size);
        t->docs_off = fy_tokfile_align(expected);
        expected = t->docs_off + t->n_docs * 8;
        t->records = (flags & FY_TOKFILE_FLAG_RECORDS) != 0;
    }
    FY_REQUIRE(file_size >= expected, -EBADMSG,
               "%s: truncated: expected %llu bytes, found %llu: copy or prepare it again", path,
               (unsigned long long)expected, (unsigned long long)file_size);
    return 0;
}

/* Validates the header and size of an opened file; fills t's fields. */
static int check_header(struct fy_tokfile *t, const uint8_t *h, uint64_t file_size,
                        uint32_t model_vocab)
{
    const char *path = t->path;
    uint32_t version, width, flags;
    FY_TRY(check_ident(path, h, &version, &width, &flags));
    FY_TRY(read_source(t, h, version, flags));
    uint32_t vocab = get_le32(h + 4 * FY_TOKFILE_SLOT_VOCAB);
    FY_REQUIRE(vocab >= 1 && vocab <= (uint32_t)INT32_MAX, -EBADMSG,
               "%s: bad vocabulary size %u in the header: prepare it again", path, vocab);
    uint64_t count = (uint64_t)get_le32(h + 4 * FY_TOKFILE_SLOT_COUNT_LO) |
                     (uint64_t)get_le32(h + 4 * FY_TOKFILE_SLOT_COUNT_HI) << 32;
    FY_REQUIRE(count > 0, -EBADMSG, "%s: the file holds no tokens: prepare it from non-empty text",
               path);
    FY_TRY(check_sections(t, h, file_size, version, width, flags, count));
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
        fy_tokfile_destroy(&t);
        return rc;
    }
    *out = t;
    return 0;
}

void fy_tokfile_destroy(struct fy_tokfile **t)
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

int fy_tokfile_eval_batch(const struct fy_tokfile *t, uint64_t index, int B, int T, int32_t *inputs,
                          int32_t *targets)
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
