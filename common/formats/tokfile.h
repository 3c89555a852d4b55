/* Pre-tokenized training data: the token file format, and a validating reader with train/eval
 * splits and deterministic batch sampling (the writers and the built-in byte-level preparation:
 * common/formats/tokwriter.h).
 *
 * Token file format (all integers little-endian). Version 1:
 *   bytes 0..4095: header of int32 slots, the rest zero
 *     [0] magic 0x4B4F5446 ("FTOK" as bytes F T O K)
 *     [1] version, 1
 *     [2] token width in bytes: 1, 2 or 4 (the writer picks the smallest that holds vocab-1)
 *     [3] vocabulary size the tokens were made for, 1..INT32_MAX; every token is < it
 *     [4] token count, low 32 bits
 *     [5] token count, high 32 bits (count >= 1)
 *     [6] flags, 0 (bit 0 was reserved for a loss-mask plane: a version 1 file with it is refused)
 *     [7] header checksum: 32-bit FNV-1a over bytes 0..27 (slots 0..6 as stored)
 *   bytes 4096..: count tokens, unsigned, `width` bytes each
 *   then zeros up to a multiple of 4096 bytes (readers accept a file without that padding).
 * Version 2 (the tokenizer's identity and an optional loss mask), slots 0..6 as version 1 but:
 *     [1] version, 2
 *     [6] flags; bit 0 = a loss-mask plane follows the tokens; other bits 0
 *     [7] tokenizer: 0 unspecified, 1 the built-in byte level, 2 a Hugging Face tokenizer.json
 *     [8] tokenizer hash, low 32 bits: 64-bit FNV-1a of the tokenizer.json bytes (0 unless [7] = 2)
 *     [9] tokenizer hash, high 32 bits
 *     [10] the end-of-sequence token appended after each document, 0xFFFFFFFF for none
 *     [11] masked tokens (mask bit 0), low 32 bits; 0 unless flags bit 0
 *     [12] masked tokens, high 32 bits
 *     [13] header checksum: 32-bit FNV-1a over bytes 0..51 (slots 0..12 as stored)
 *     bytes 64..1087: where known, the path of the tokenizer.json (as prepare resolved it),
 *     NUL-terminated UTF-8, zeros otherwise; for messages only, so not covered by the checksum (a
 *     reader ignores a value without its NUL or with control characters)
 *   bytes 4096..: the tokens as in version 1, zero-padded to a multiple of 4096 bytes
 *   with flags bit 0, then the mask plane: ceil(count / 8) bytes, bit (i % 8) of byte i / 8 (least
 *   significant first) is token i's mask: 1 = trained (predicting token i from the tokens before it
 *   counts in the loss), 0 = masked (token i is an input only, its prediction is not trained); the
 *   bits after the last token are 0; then zeros to a multiple of 4096 bytes. A file has a plane
 *   only when at least one token is masked, and at least one token is trained.
 * Version 3 (where each document starts), slots 0..12 as version 2 but:
 *     [1] version, 3
 *     [6] flags; bit 0 = a loss-mask plane; bit 1 = the documents are records (a JSONL line, a
 *         Parquet row: a text field, a prompt/response pair, a conversation), else whole text
 *         files; other bits 0
 *     [13] document count, low 32 bits
 *     [14] document count, high 32 bits (count >= 1)
 *     [15] header checksum: 32-bit FNV-1a over bytes 0..59 (slots 0..14 as stored)
 *     bytes 64..1087: the tokenizer's path, as version 2
 *   bytes 4096..: the tokens, then (with flags bit 0) the mask plane, each as version 2 and
 *   zero-padded to a multiple of 4096 bytes; then the document index: `document count` uint64s,
 *   the index of each document's first token, strictly increasing from 0, each below the token
 *   count; then zeros to a multiple of 4096 bytes. Document i is the tokens from its start to the
 *   next document's (the last: to the end).
 * The writers write version 3 for a file whose documents were recorded (fy_tokwriter_document,
 * fy_tokfile_prepare_bytes), else version 1 for a file with neither a mask nor a tokenizer
 * identity (byte for byte what earlier builds wrote) and version 2 otherwise. Readers read all
 * three; a version 1 or 2 file records no documents (one stream). In batches, the target of a
 * masked token is -1 (ignored by the loss).
 */
#ifndef FY_TOKFILE_H
#define FY_TOKFILE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FY_TOKFILE_MAGIC 0x4B4F5446u
#define FY_TOKFILE_VERSION 3 /* the newest this build reads and writes */
#define FY_TOKFILE_HEADER_BYTES 4096
#define FY_TOKFILE_FLAG_LOSS_MASK 1u
#define FY_TOKFILE_FLAG_RECORDS 2u /* version 3: the documents are records, not text files */
#define FY_TOKFILE_NO_EOS 0xFFFFFFFFu
#define FY_TOKFILE_NAME_OFFSET 64  /* version 2: the tokenizer's path */
#define FY_TOKFILE_NAME_MAX 1024   /* its bytes, the NUL included */

enum {
    FY_TOKFILE_SLOT_MAGIC = 0,
    FY_TOKFILE_SLOT_VERSION = 1,
    FY_TOKFILE_SLOT_WIDTH = 2,
    FY_TOKFILE_SLOT_VOCAB = 3,
    FY_TOKFILE_SLOT_COUNT_LO = 4,
    FY_TOKFILE_SLOT_COUNT_HI = 5,
    FY_TOKFILE_SLOT_FLAGS = 6,
    FY_TOKFILE_SLOT_CHECKSUM = 7 /* version 1 */,
    /* version 2 */
    FY_TOKFILE_SLOT_TOKENIZER = 7,
    FY_TOKFILE_SLOT_TOKHASH_LO = 8,
    FY_TOKFILE_SLOT_TOKHASH_HI = 9,
    FY_TOKFILE_SLOT_EOS = 10,
    FY_TOKFILE_SLOT_MASKED_LO = 11,
    FY_TOKFILE_SLOT_MASKED_HI = 12,
    FY_TOKFILE_V2_SLOT_CHECKSUM = 13,
    /* version 3 */
    FY_TOKFILE_SLOT_DOCS_LO = 13,
    FY_TOKFILE_SLOT_DOCS_HI = 14,
    FY_TOKFILE_V3_SLOT_CHECKSUM = 15
};

/* What made the tokens (version 2, slot 7). */
enum { FY_TOKENIZER_UNSPECIFIED = 0, FY_TOKENIZER_BYTES = 1, FY_TOKENIZER_HF = 2 };

/* The tokenizer's identity as a version 2 header records it. */
struct fy_tokfile_source {
    uint32_t tokenizer; /* FY_TOKENIZER_* */
    uint64_t hash;      /* FNV-1a 64 of tokenizer.json (FY_TOKENIZER_HF), else 0 */
    uint32_t eos;       /* FY_TOKFILE_NO_EOS for none */
    /* The tokenizer.json's path (FY_TOKENIZER_HF), NULL where unknown. A writer copies it (one of
     * FY_TOKFILE_NAME_MAX bytes or more is not recorded); fy_tokfile_source's points into the
     * open file. */
    const char *name;
};

/* Splits, for fy_tokfile_batch and fy_tokfile_split_tokens. */
enum { FY_TOKFILE_TRAIN = 0, FY_TOKFILE_EVAL = 1 };

/* Vocabulary of the built-in byte-level tokenizer: a token is a byte value. */
#define FY_TOKFILE_BYTE_VOCAB 256

/* FNV-1a checksum of header slots 0..6 (the first 28 bytes of `header`), as stored in slot 7 of a
 * version 1 header. */
uint32_t fy_tokfile_header_checksum(const void *header);
/* FNV-1a checksum of header slots 0..12, as stored in slot 13 of a version 2 header. */
uint32_t fy_tokfile_header_checksum_v2(const void *header);

/* FNV-1a checksum of header slots 0..14, as stored in slot 15 of a version 3 header. */
uint32_t fy_tokfile_header_checksum_v3(const void *header);

/* Where a section starts: n rounded up to a multiple of 4096 bytes. */
static inline uint64_t fy_tokfile_align(uint64_t n)
{
    return (n + FY_TOKFILE_HEADER_BYTES - 1) / FY_TOKFILE_HEADER_BYTES * FY_TOKFILE_HEADER_BYTES;
}

/* 64-bit FNV-1a of a file's bytes (the tokenizer hash of slots 8..9), read in chunks. */
int fy_tokfile_hash_file(const char *path, uint64_t *hash);

struct fy_tokfile;

/* Maps path read-only and validates it against a model of model_vocab tokens (0: no model, check
 * against the file's own vocabulary only): header fields, checksum, size, and every token. Before
 * fy_tokfile_split, the training split is the whole file and the eval split is empty. */
int fy_tokfile_open(struct fy_tokfile **out, const char *path, uint32_t model_vocab);
/* Unmaps and frees; sets *t to NULL; safe on NULL. */
void fy_tokfile_destroy(struct fy_tokfile **t);

uint64_t fy_tokfile_count(const struct fy_tokfile *t);
uint32_t fy_tokfile_vocab(const struct fy_tokfile *t);
uint32_t fy_tokfile_width(const struct fy_tokfile *t);
/* The header's version (1, 2 or 3). */
uint32_t fy_tokfile_version(const struct fy_tokfile *t);
/* Documents the file records (0 for a version 1 or 2 file: one stream of tokens). */
uint64_t fy_tokfile_documents(const struct fy_tokfile *t);
/* 1 when the documents are records (JSONL lines, Parquet rows), 0 when whole text files (or none
 * are recorded). */
int fy_tokfile_documents_are_records(const struct fy_tokfile *t);
/* Document i's first token and its end (one past its last token); i < fy_tokfile_documents(t). */
uint64_t fy_tokfile_document_start(const struct fy_tokfile *t, uint64_t i);
uint64_t fy_tokfile_document_end(const struct fy_tokfile *t, uint64_t i);
/* The tokenizer's identity (unspecified for a version 1 file); its name, if any, is valid while t
 * is open. */
struct fy_tokfile_source fy_tokfile_source(const struct fy_tokfile *t);
/* "Hugging Face tokenizer.json 0123abcd..." (then " (NAME)" where recorded), "byte-level
 * tokenizer" or "tokenizer not recorded". */
void fy_tokfile_describe_source(const struct fy_tokfile_source *src, char *buf, size_t len);
/* Tokens whose mask is 0 (0 without a mask plane). */
uint64_t fy_tokfile_masked(const struct fy_tokfile *t);
/* Token i of the whole file; i < fy_tokfile_count(t). */
uint32_t fy_tokfile_token(const struct fy_tokfile *t, uint64_t i);
/* 1 when token i is trained (its mask bit is 1, or the file has no mask), else 0. */
int fy_tokfile_trained(const struct fy_tokfile *t, uint64_t i);

/* The last round(count * eval_fraction) tokens become the eval split, the rest the training split.
 * Refuses (-EINVAL) a fraction outside [0, 1] or a split with fewer than 2 tokens. */
int fy_tokfile_split(struct fy_tokfile *t, double eval_fraction);
/* The split by whole documents (a file that records them): the last round(documents *
 * eval_fraction) documents become the eval split, the rest the training split. Refuses (-EINVAL) a
 * fraction outside [0, 1], a file without documents, and a split that leaves either side without
 * a document. */
int fy_tokfile_split_documents(struct fy_tokfile *t, double eval_fraction);
/* The first document of the eval split (fy_tokfile_split_documents; fy_tokfile_documents before
 * it, or after a split by tokens). */
uint64_t fy_tokfile_eval_first_document(const struct fy_tokfile *t);
/* Tokens in FY_TOKFILE_TRAIN or FY_TOKFILE_EVAL (0 for anything else). */
uint64_t fy_tokfile_split_tokens(const struct fy_tokfile *t, int split);

/* The generator every batch order is drawn from: splitmix64's finaliser (z += 0x9e3779b97f4a7c15;
 * z = (z ^ z >> 30) * 0xbf58476d1ce4e5b9; z = (z ^ z >> 27) * 0x94d049bb133111eb; z ^ z >> 31), a
 * bijective mixer, integer-only so that every machine draws the same. */
uint64_t fy_tokfile_mix64(uint64_t z);

/* B windows of T+1 consecutive tokens of the split: inputs[b*T + j] = w[j], targets[b*T + j] =
 * w[j+1], or -1 when w[j+1] is masked (fy_tokfile_trained is 0). Row b's window starts at token
 * base + mix64(key ^ b) mod (n - T) of the split's n tokens (base 0 for the training split, its
 * first token for the eval split), key = mix64(mix64(mix64(seed) ^ split) ^ step): a pure function
 * of (seed, split, step, b) (a counter-based generator, no hidden state), so a restarted run draws
 * the same batches on any machine. -EINVAL when the split has fewer than T+1 tokens. */
int fy_tokfile_batch(const struct fy_tokfile *t, int split, uint64_t seed, uint64_t step, int B,
                     int T, int32_t *inputs, int32_t *targets);

/* Eval windows per pass over the eval split for sequence length T: windows start at 0, T, 2T, ...
 * (inputs do not overlap; every eval token but the first is a target exactly once, save a tail
 * shorter than T). 0 when the eval split has fewer than T+1 tokens. */
uint64_t fy_tokfile_eval_windows(const struct fy_tokfile *t, int T);
/* Batch `index` of the deterministic eval pass: window k = index*B + b, taken modulo
 * fy_tokfile_eval_windows (so the pass wraps around); layout as fy_tokfile_batch. A full pass is
 * ceil(windows / B) batches. -EINVAL when the eval split has fewer than T+1 tokens. */
int fy_tokfile_eval_batch(const struct fy_tokfile *t, uint64_t index, int B, int T,
                          int32_t *inputs, int32_t *targets);

#ifdef __cplusplus
}
#endif

#endif
