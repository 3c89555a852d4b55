/* The batches of a training run, made from a token file (common/formats/tokfile.h): windows of the
 * token stream, or whole documents packed into rows, each batch with its positions array beside the
 * inputs and targets; the held-out split and its batches; epochs. docs/usage.md ("How a batch is
 * made") states the rules precisely enough to rebuild any batch outside this program.
 *
 * A batch is B rows of T positions: inputs[r*T + t], targets[r*T + t] (-1: no loss) and
 * positions[r*T + t], the position of token t of row r inside its own document (0 at a document's
 * first token, +1 for each next one); a document is a contiguous run of a row.
 *
 * Windows (FY_PACKING_WINDOWS): fy_tokfile_batch's random windows of T+1 tokens, positions t.
 * Documents (FY_PACKING_DOCUMENTS): the file's documents (fy_tokfile_documents), the last
 * round(documents * eval_fraction) held out. A document of n tokens is trained as n - 1
 * predictions: its tokens but the last as inputs, its tokens but the first as targets, in n - 1
 * positions of a row (as a window of T+1 tokens fills T). One of more than T + 1 tokens is cut to
 * its first T + 1 (FY_LONG_DOCS_TRUNCATE) or into pieces of T + 1 tokens overlapping by one, each
 * a document of its own (FY_LONG_DOCS_SPLIT); one of a single token has nothing to predict and is
 * left out. Each epoch, the training pieces are shuffled from the seed, sorted by length (longest
 * first, a stable sort) and packed first-fit into rows of T positions (never split), the rows
 * shuffled from the seed; the epoch's batches are its rows B at a time, the last batch's missing
 * rows padding. A row's positions after its documents are padding: input 0, target -1, position
 * 0. The held-out pieces are packed the same way in file order, unshuffled: one pass evaluates
 * every held-out document once.
 *
 * Every batch is a pure function of the token file, the options and the step (its epoch is
 * (step - 1) / steps an epoch), so a run resumed at any step draws what an uninterrupted run
 * draws. */
#ifndef FY_SAMPLER_H
#define FY_SAMPLER_H

#include <stdint.h>

#include "common/formats/tokfile.h"

enum fy_packing {
    FY_PACKING_AUTO = 0, /* documents for a file whose documents are records, else windows */
    FY_PACKING_WINDOWS = 1,
    FY_PACKING_DOCUMENTS = 2,
};

/* A document longer than T + 1 tokens (--long-docs). */
enum fy_long_docs { FY_LONG_DOCS_TRUNCATE = 0, FY_LONG_DOCS_SPLIT = 1 };

/* The shuffles' salts: key = mix64(mix64(mix64(seed) ^ salt) ^ epoch) (fy_tokfile_mix64). */
#define FY_SAMPLER_SALT_PIECES 0x706965636573ull /* "pieces" */
#define FY_SAMPLER_SALT_ROWS 0x726f7773ull       /* "rows" */

struct fy_sampler_opts {
    int packing;   /* enum fy_packing */
    int long_docs; /* enum fy_long_docs */
    int B, T;
    uint64_t seed;
    double eval_fraction;
};

/* A split as packed: its documents, what the packing did to them, and the rows a pass takes (the
 * same every epoch: first-fit over the pieces sorted by length depends on their lengths alone). */
struct fy_sampler_split {
    uint64_t documents; /* documents: windows: 0 */
    uint64_t pieces;    /* what is packed: the documents, or with split their pieces */
    uint64_t truncated; /* documents cut to T + 1 tokens (FY_LONG_DOCS_TRUNCATE) */
    uint64_t dropped;   /* the predictions truncation left out */
    uint64_t split;     /* documents cut into pieces (FY_LONG_DOCS_SPLIT) */
    uint64_t single;    /* documents of one token, left out */
    uint64_t rows;      /* rows a pass takes */
    uint64_t tokens;    /* positions the pieces fill in a pass (predictions trained) */
    uint64_t batches;   /* batches a pass takes: ceil(rows / B); windows: see fy_sampler_new */
};

/* What one batch holds. */
struct fy_sampler_fill {
    uint64_t tokens;  /* positions holding documents (not padding): B * T for windows */
    uint64_t targets; /* targets the loss counts (>= 0) */
};

struct fy_sampler;

/* The batches of `data` (kept open by the caller while s lives) under o: the split made
 * (fy_tokfile_split for windows, fy_tokfile_split_documents for documents) and checked to hold a
 * batch, the held-out pieces packed, the first epoch's packing made. FY_PACKING_AUTO resolves as
 * said above; FY_PACKING_DOCUMENTS of a file that records no documents is refused (-EINVAL, said).
 * For windows, a pass over the training split is ceil(floor((n - 1) / T) / B) steps of its n
 * tokens (the steps that draw as many windows as the split holds side by side; an epoch of
 * --epochs) and over the eval split ceil(fy_tokfile_eval_windows / B) batches. */
int fy_sampler_new(struct fy_sampler **out, struct fy_tokfile *data,
                   const struct fy_sampler_opts *o);
/* Frees; sets *s to NULL; safe on NULL. */
void fy_sampler_destroy(struct fy_sampler **s);

/* FY_PACKING_WINDOWS or FY_PACKING_DOCUMENTS, as resolved. */
int fy_sampler_packing(const struct fy_sampler *s);
const char *fy_sampler_packing_name(int packing);
const char *fy_sampler_long_docs_name(int long_docs);
/* The split (FY_TOKFILE_TRAIN or FY_TOKFILE_EVAL) as packed. */
const struct fy_sampler_split *fy_sampler_split_of(const struct fy_sampler *s, int split);
/* Steps an epoch: the training split's batches a pass (>= 1). */
uint64_t fy_sampler_epoch_steps(const struct fy_sampler *s);

/* Training batch of step `step` (1-based) into inputs, targets, positions (each B*T int32); *fill
 * (may be NULL) gets what it holds. */
int fy_sampler_train_batch(struct fy_sampler *s, uint64_t step, int32_t *inputs, int32_t *targets,
                           int32_t *positions, struct fy_sampler_fill *fill);
/* Held-out batch `index` of the pass (taken modulo the pass's batches), likewise. */
int fy_sampler_eval_batch(struct fy_sampler *s, uint64_t index, int32_t *inputs, int32_t *targets,
                          int32_t *positions, struct fy_sampler_fill *fill);

#endif
