/* Commit records and exported weight files: fixed int32 slots with magic, version and a
 * checksum, data 4 KiB aligned, files replaced atomically. */
#include "common/formats/ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/model/arch/arch.h"
#include "common/base/check.h"
#include "common/base/digest.h"
#include "common/base/fsutil.h"

enum { S_MAGIC, S_VERSION, S_LAYER, S_HEAD, S_EMBD, S_VOCAB, S_CTX, S_HASH_LO, S_HASH_HI,
       S_STEP_LO, S_STEP_HI, S_EXTRA0, S_EXTRA1, S_CHECKSUM, S_COUNT };
/* The family's id and its own fields (common/model/arch: FY_FAMILY_SLOTS of them) follow the
 * checksum; GPT-2 leaves them zero; the config hash in S_HASH_* covers them. */
enum { S_ARCH = S_COUNT, S_FAMILY /* the first FAMILY_NEAR of the family's slots */ };
/* The family's slots past the first FAMILY_NEAR lie from S_FAMILY_FAR on (zero in older headers). */
enum { FAMILY_NEAR = 14, S_FAMILY_FAR = 64 };
/* The commit record's fields after them, past one slot left zero (the version 1 metadata block's
 * flag, in stores before commit records). */
enum {
    S_COPY = S_FAMILY + FAMILY_NEAR + 1,
    S_SEQ_LO,
    S_SEQ_HI,
    S_UNITS,
    S_DIGEST_LO,
    S_DIGEST_HI,
    S_COPIES,
    S_OPTIM_STATE,
    S_STATE_PIECE
};

_Static_assert(S_FAMILY_FAR + FY_FAMILY_SLOTS - FAMILY_NEAR <= FY_CKPT_BLOCK / 4,
               "the family's slots fit the header block");

static int family_slot(int i) { return i < FAMILY_NEAR ? S_FAMILY + i : S_FAMILY_FAR + i - FAMILY_NEAR; }

static uint64_t align4k(uint64_t v) { return (v + FY_CKPT_BLOCK - 1) / FY_CKPT_BLOCK * FY_CKPT_BLOCK; }

static void put32(uint8_t *b, int slot, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b[4 * slot + i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *b, int slot)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)b[4 * slot + i] << (8 * i);
    return v;
}

static uint32_t checksum(const uint8_t *b)
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < 4 * S_CHECKSUM; i++)
        h = (h ^ b[i]) * 16777619u;
    return h;
}

static void encode_header(uint8_t *b, uint32_t magic, uint32_t version,
                          const struct fy_model_config *c, uint64_t step, uint32_t extra0,
                          uint32_t extra1)
{
    memset(b, 0, FY_CKPT_BLOCK);
    uint64_t hash = fy_model_config_hash(c);
    const uint32_t v[S_CHECKSUM] = {magic, version, c->n_layer, c->n_head, c->n_embd,
                                    c->vocab, c->ctx, (uint32_t)hash, (uint32_t)(hash >> 32),
                                    (uint32_t)step, (uint32_t)(step >> 32), extra0, extra1};
    for (int i = 0; i < S_CHECKSUM; i++)
        put32(b, i, v[i]);
    put32(b, S_CHECKSUM, checksum(b));
    const struct fy_arch *arch = fy_model_arch(c);
    uint32_t slots[FY_FAMILY_SLOTS] = {0};
    arch->slots_write(c, slots);
    put32(b, S_ARCH, arch->id);
    for (int i = 0; i < FY_FAMILY_SLOTS; i++)
        put32(b, family_slot(i), slots[i]);
}

static int decode_arch(const uint8_t *b, struct fy_model_config *c)
{
    const struct fy_arch *family = fy_arch_by_id(get32(b, S_ARCH));
    if (family == NULL)
        return -EBADMSG;
    c->arch = family;
    uint32_t slots[FY_FAMILY_SLOTS];
    for (int i = 0; i < FY_FAMILY_SLOTS; i++)
        slots[i] = get32(b, family_slot(i));
    family->slots_read(slots, c);
    return 0;
}

/* Validates magic, version, checksum, the model config and its hash. */
static int decode_header(const uint8_t *b, uint32_t magic, uint32_t want_version, const char *what,
                         const char *where, struct fy_model_config *c, uint64_t *step)
{
    FY_REQUIRE(get32(b, S_MAGIC) == magic, -EBADMSG, "%s: not a Fuyou %s (bad magic)", where, what);
    uint32_t version = get32(b, S_VERSION);
    FY_REQUIRE(version == want_version, -EBADMSG,
               "%s: %s version %u, this build reads version %u: made by another version of Fuyou?",
               where, what, version, want_version);
    FY_REQUIRE(get32(b, S_CHECKSUM) == checksum(b), -EBADMSG, "%s: %s header checksum mismatch (corrupt)",
               where, what);
    *c = (struct fy_model_config){.n_layer = get32(b, S_LAYER), .n_head = get32(b, S_HEAD),
                                .n_embd = get32(b, S_EMBD), .vocab = get32(b, S_VOCAB),
                                .ctx = get32(b, S_CTX)};
    FY_REQUIRE(decode_arch(b, c) == 0, -EBADMSG,
               "%s: %s names model family %u, which this build does not know: made by a newer "
               "Fuyou?", where, what, get32(b, S_ARCH));
    FY_REQUIRE(fy_model_config_validate(c) == 0, -EBADMSG, "%s: %s holds an invalid model config", where,
               what);
    uint64_t hash = get32(b, S_HASH_LO) | (uint64_t)get32(b, S_HASH_HI) << 32;
    FY_REQUIRE(hash == fy_model_config_hash(c), -EBADMSG, "%s: %s model hash mismatch (corrupt)", where,
               what);
    *step = get32(b, S_STEP_LO) | (uint64_t)get32(b, S_STEP_HI) << 32;
    return 0;
}

/* The digest of a whole record with its own digest slots taken as zero. */
static uint64_t record_digest(const uint8_t *record)
{
    return fy_digest_zeroing(record, FY_COMMIT_RECORD_BYTES, 4 * S_DIGEST_LO, 8);
}

/* Whether a record's stored digest is its digest. */
static int record_digest_ok(const uint8_t *record)
{
    uint64_t want = get32(record, S_DIGEST_LO) | (uint64_t)get32(record, S_DIGEST_HI) << 32;
    return record_digest(record) == want;
}

void fy_storemeta_encode(const struct fy_storemeta *m, uint8_t *record)
{
    memset(record, 0, FY_COMMIT_RECORD_BYTES);
    encode_header(record, FY_STOREMETA_MAGIC, FY_COMMIT_VERSION, &m->model, m->step,
                  (uint32_t)m->seed, (uint32_t)(m->seed >> 32));
    unsigned units = fy_model_unit_count(&m->model);
    put32(record, S_COPY, m->copy);
    put32(record, S_SEQ_LO, (uint32_t)m->seq);
    put32(record, S_SEQ_HI, (uint32_t)(m->seq >> 32));
    put32(record, S_UNITS, units);
    put32(record, S_COPIES, m->copies);
    put32(record, S_OPTIM_STATE, (uint32_t)m->model.optim_state);
    put32(record, S_STATE_PIECE, (uint32_t)(m->model.state_piece / 1024));
    for (unsigned u = 0; u < units && u < FY_COMMIT_MAX_UNITS; u++)
        for (int i = 0; i < 8; i++)
            record[FY_CKPT_BLOCK + 8 * u + i] = (uint8_t)(m->digest[u] >> (8 * i));
    uint64_t d = record_digest(record);
    put32(record, S_DIGEST_LO, (uint32_t)d);
    put32(record, S_DIGEST_HI, (uint32_t)(d >> 32));
}

int fy_storemeta_check(const uint8_t *record, size_t len)
{
    size_t zero = 0;
    while (zero < len && record[zero] == 0)
        zero++;
    if (len >= FY_CKPT_BLOCK && zero == len)
        return 1;
    if (len < FY_CKPT_BLOCK || get32(record, S_MAGIC) != FY_STOREMETA_MAGIC ||
        get32(record, S_CHECKSUM) != checksum(record))
        return -EBADMSG;
    if (get32(record, S_VERSION) != FY_COMMIT_VERSION || len < FY_COMMIT_RECORD_BYTES)
        return -EBADMSG;
    return record_digest_ok(record) ? 0 : -EBADMSG;
}

int fy_storemeta_decode(const uint8_t *record, size_t len, const char *where,
                        struct fy_storemeta *m)
{
    memset(m, 0, sizeof *m);
    FY_REQUIRE(len >= FY_CKPT_BLOCK, -EBADMSG, "%s: %zu bytes are too few for a commit record",
               where, len);
    FY_TRY(decode_header(record, FY_STOREMETA_MAGIC, FY_COMMIT_VERSION, "commit record", where,
                         &m->model, &m->step));
    m->seed = get32(record, S_EXTRA0) | (uint64_t)get32(record, S_EXTRA1) << 32;
    FY_REQUIRE(len >= FY_COMMIT_RECORD_BYTES, -EBADMSG,
               "%s: a commit record of version %d takes %d bytes, not %zu", where,
               FY_COMMIT_VERSION, (int)FY_COMMIT_RECORD_BYTES, len);
    FY_REQUIRE(record_digest_ok(record), -EBADMSG, "%s: commit record digest mismatch (torn or corrupt)",
               where);
    m->copy = get32(record, S_COPY);
    m->copies = get32(record, S_COPIES) ? get32(record, S_COPIES) : 2;
    FY_REQUIRE(m->copies <= 2 && m->copy < m->copies, -EBADMSG,
               "%s: commit record names copy %u of %u: corrupt", where, m->copy, m->copies);
    uint32_t format = get32(record, S_OPTIM_STATE);
    FY_REQUIRE(format < FY_OPTIM_STATE_COUNT, -EBADMSG,
               "%s: commit record names optimizer state format %u, which this build does not "
               "know: made by a newer Fuyou?", where, format);
    m->model.optim_state = (int)format;
    m->model.state_piece = (uint64_t)get32(record, S_STATE_PIECE) * 1024;
    FY_REQUIRE(fy_model_config_validate(&m->model) == 0, -EBADMSG,
               "%s: commit record names pieces of optimizer state of %llu KiB: corrupt", where,
               (unsigned long long)(m->model.state_piece / 1024));
    m->seq = get32(record, S_SEQ_LO) | (uint64_t)get32(record, S_SEQ_HI) << 32;
    unsigned units = get32(record, S_UNITS);
    FY_REQUIRE(m->copy <= 1 && units == fy_model_unit_count(&m->model), -EBADMSG,
               "%s: commit record names copy %u and %u units (the model has %u): corrupt", where,
               m->copy, units, fy_model_unit_count(&m->model));
    for (unsigned u = 0; u < units; u++)
        for (int i = 0; i < 8; i++)
            m->digest[u] |= (uint64_t)record[FY_CKPT_BLOCK + 8 * u + i] << (8 * i);
    return 0;
}

unsigned fy_scratch_class(uint64_t bytes)
{
    unsigned k = 0;
    while (k < 8 * 43 - 1 && fy_scratch_class_bytes(k) < bytes) /* the last: 15 x 2^59 bytes */
        k++;
    return k;
}

int fy_weights_write(const char *path, const struct fy_model_config *c, uint64_t step, int overwrite,
                     int (*next)(void *ctx, unsigned unit, float *params), void *ctx)
{
    if (!overwrite && access(path, F_OK) == 0) {
        fy_error("%s exists: remove it or pass --overwrite", path);
        return -EEXIST;
    }
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    FY_SYS(fd, "cannot create %s (does its directory exist?)", tmp);
    uint8_t *header = calloc(1, FY_CKPT_BLOCK);
    size_t max_unit = 0;
    for (unsigned u = 0; u < fy_model_unit_count(c); u++)
        if (fy_model_unit_params(c, u) > max_unit)
            max_unit = fy_model_unit_params(c, u);
    float *buf = calloc(align4k(max_unit * 4) / 4, sizeof(float));
    int rc = header && buf ? 0 : -ENOMEM;
    if (rc == 0) {
        encode_header(header, FY_WEIGHTS_MAGIC, FY_WEIGHTS_VERSION, c, step, 1,
                      fy_model_unit_count(c));
        rc = fy_write_all(fd, header, FY_CKPT_BLOCK, tmp, 0);
    }
    uint64_t at = FY_CKPT_BLOCK;
    for (unsigned u = 0; rc == 0 && u < fy_model_unit_count(c); u++) {
        size_t n = fy_model_unit_params(c, u);
        memset(buf, 0, align4k(n * 4));
        rc = next(ctx, u, buf);
        if (rc == 0)
            rc = fy_write_all(fd, buf, align4k(n * 4), tmp, at);
        at += align4k(n * 4);
    }
    if (rc == 0 && fsync(fd) != 0) {
        rc = -errno;
        fy_error("fsync %s: %s", tmp, strerror(-rc));
    }
    close(fd);
    free(header);
    free(buf);
    if (rc == 0 && rename(tmp, path) != 0) {
        rc = -errno;
        fy_error("cannot rename %s to %s: %s", tmp, path, strerror(-rc));
    }
    if (rc < 0) {
        unlink(tmp);
        return rc;
    }
    return fy_fsync_parent(path);
}

int fy_weights_read(const char *path, struct fy_model_config *c, uint64_t *step, float **params)
{
    *params = NULL;
    FILE *f = fopen(path, "rb");
    FY_SYS(f == NULL ? -1 : 0, "cannot open weights file %s", path);
    uint8_t header[FY_CKPT_BLOCK];
    int rc = fread(header, 1, sizeof header, f) == sizeof header ? 0 : -EBADMSG;
    if (rc < 0)
        fy_error("%s: shorter than a weights file header", path);
    if (rc == 0)
        rc = decode_header(header, FY_WEIGHTS_MAGIC, FY_WEIGHTS_VERSION, "weights file", path, c,
                           step);
    size_t total = rc == 0 ? fy_model_total_params(c) : 0;
    float *all = rc == 0 ? malloc(total * sizeof(float)) : NULL;
    if (rc == 0 && all == NULL)
        rc = -ENOMEM;
    size_t at = 0;
    for (unsigned u = 0; rc == 0 && u < fy_model_unit_count(c); u++) {
        size_t n = fy_model_unit_params(c, u);
        size_t padded = align4k(n * 4);
        if (fread(all + at, 4, n, f) != n || fseek(f, (long)(padded - n * 4), SEEK_CUR) != 0) {
            fy_error("%s: truncated in unit %u", path, u);
            rc = -EBADMSG;
        }
        at += n;
    }
    fclose(f);
    if (rc < 0) {
        free(all);
        return rc;
    }
    *params = all;
    return 0;
}
