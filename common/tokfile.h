/* Pre-tokenized training data: the token file format, its writer, the built-in byte-level
 * preparation, and a validating reader with train/eval splits and deterministic batch sampling.
 *
 * Token file format, version 1 (all integers little-endian):
 *   bytes 0..4095: header of int32 slots, the rest zero
 *     [0] magic 0x4B4F5446 ("FTOK" as bytes F T O K)
 *     [1] version, 1
 *     [2] token width in bytes: 1, 2 or 4 (the writer picks the smallest that holds vocab-1)
 *     [3] vocabulary size the tokens were made for, 1..INT32_MAX; every token is < it
 *     [4] token count, low 32 bits
 *     [5] token count, high 32 bits (count >= 1)
 *     [6] flags; bit 0 = a loss-mask plane follows the tokens (reserved: readers refuse it)
 *     [7] header checksum: 32-bit FNV-1a over bytes 0..27 (slots 0..6 as stored)
 *   bytes 4096..: count tokens, unsigned, `width` bytes each
 *   then zeros up to a multiple of 4096 bytes (readers accept a file without that padding).
 */
#ifndef FY_TOKFILE_H
#define FY_TOKFILE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FY_TOKFILE_MAGIC 0x4B4F5446u
#define FY_TOKFILE_VERSION 1
#define FY_TOKFILE_HEADER_BYTES 4096
#define FY_TOKFILE_FLAG_LOSS_MASK 1u

enum { FY_TOKFILE_SLOT_MAGIC = 0, FY_TOKFILE_SLOT_VERSION = 1, FY_TOKFILE_SLOT_WIDTH = 2,
       FY_TOKFILE_SLOT_VOCAB = 3, FY_TOKFILE_SLOT_COUNT_LO = 4, FY_TOKFILE_SLOT_COUNT_HI = 5,
       FY_TOKFILE_SLOT_FLAGS = 6, FY_TOKFILE_SLOT_CHECKSUM = 7 };

/* Splits, for fy_tokfile_batch and fy_tokfile_split_tokens. */
enum { FY_TOKFILE_TRAIN = 0, FY_TOKFILE_EVAL = 1 };

/* Vocabulary of the built-in byte-level tokenizer: a token is a byte value. */
#define FY_TOKFILE_BYTE_VOCAB 256

/* FNV-1a checksum of header slots 0..6 (the first 28 bytes of `header`), as stored in slot 7. */
uint32_t fy_tokfile_header_checksum(const void *header);

/* Writes count tokens (each < vocab) to path atomically (temporary file path.tmp, fsync, rename,
 * fsync of the directory). An existing path is refused with -EEXIST unless overwrite. */
int fy_tokfile_write(const char *path, const uint32_t *tokens, uint64_t count, uint32_t vocab,
                     int overwrite);

/* Byte-level preparation: the bytes of the inputs (regular files), concatenated in order, become
 * the tokens of out_path (vocab 256, width 1). Inputs are streamed, not held in memory. An empty
 * total is refused. *count_out (may be NULL) receives the token count. */
int fy_tokfile_prepare_bytes(const char *out_path, const char *const *inputs, unsigned n_inputs,
                             int overwrite, uint64_t *count_out);

struct fy_tokfile;

/* Maps path read-only and validates it against a model of model_vocab tokens (0: no model, check
 * against the file's own vocabulary only): header fields, checksum, size, and every token. Before
 * fy_tokfile_split, the training split is the whole file and the eval split is empty. */
int fy_tokfile_open(struct fy_tokfile **out, const char *path, uint32_t model_vocab);
/* Unmaps and frees; sets *t to NULL; safe on NULL. */
void fy_tokfile_close(struct fy_tokfile **t);

uint64_t fy_tokfile_count(const struct fy_tokfile *t);
uint32_t fy_tokfile_vocab(const struct fy_tokfile *t);
uint32_t fy_tokfile_width(const struct fy_tokfile *t);
/* Token i of the whole file; i < fy_tokfile_count(t). */
uint32_t fy_tokfile_token(const struct fy_tokfile *t, uint64_t i);

/* The last round(count * eval_fraction) tokens become the eval split, the rest the training split.
 * Refuses (-EINVAL) a fraction outside [0, 1] or a split with fewer than 2 tokens. */
int fy_tokfile_split(struct fy_tokfile *t, double eval_fraction);
/* Tokens in FY_TOKFILE_TRAIN or FY_TOKFILE_EVAL (0 for anything else). */
uint64_t fy_tokfile_split_tokens(const struct fy_tokfile *t, int split);

/* B windows of T+1 consecutive tokens of the split: inputs[b*T + j] = w[j], targets[b*T + j] =
 * w[j+1]. Window starts are a pure function of (seed, split, step, b) (a counter-based generator,
 * no hidden state), so a restarted run draws the same batches on any machine. -EINVAL when the
 * split has fewer than T+1 tokens. */
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
