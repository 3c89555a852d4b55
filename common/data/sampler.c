/* The batches of a training run (sampler.h): windows through common/formats/tokfile, or the
 * documents cut into pieces, each epoch's pieces shuffled, sorted by length and packed first-fit
 * into rows (a max-tree over the rows' room finds the first row that holds a piece in log time),
 * the rows shuffled; the current epoch's packing and the held-out one kept. */
#include "common/data/sampler.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"

/* The pieces of a split in file order: document by document, a document's pieces in order. */
struct pieces {
    uint64_t *start; /* the piece's first token */
    uint32_t *len;   /* its predictions (positions it takes), 1..T */
    uint64_t n;
};

/* A pass's rows: row r holds items[first[r] .. first[r + 1]) in the order they were placed; the
 * batches take the rows in `order`. */
struct rows {
    uint64_t epoch; /* the epoch packed; UINT64_MAX: none */
    uint32_t *first, *items, *order;
    uint64_t n;
};

struct fy_sampler {
    struct fy_tokfile *data;
    struct fy_sampler_opts o; /* o.packing resolved */
    struct fy_sampler_split split[2];
    struct pieces pieces[2];
    struct rows rows[2];
};

const char *fy_sampler_packing_name(int packing)
{
    return packing == FY_PACKING_WINDOWS     ? "windows"
           : packing == FY_PACKING_DOCUMENTS ? "documents"
                                             : "auto";
}

const char *fy_sampler_long_docs_name(int long_docs)
{
    return long_docs == FY_LONG_DOCS_SPLIT ? "split" : "truncate";
}

static void rows_free(struct rows *r)
{
    free(r->first);
    free(r->items);
    free(r->order);
    memset(r, 0, sizeof *r);
    r->epoch = UINT64_MAX;
}

void fy_sampler_destroy(struct fy_sampler **sp)
{
    if (sp == NULL || *sp == NULL)
        return;
    struct fy_sampler *s = *sp;
    for (int i = 0; i < 2; i++) {
        free(s->pieces[i].start);
        free(s->pieces[i].len);
        rows_free(&s->rows[i]);
    }
    free(s);
    *sp = NULL;
}

int fy_sampler_packing(const struct fy_sampler *s) { return s->o.packing; }

const struct fy_sampler_split *fy_sampler_split_of(const struct fy_sampler *s, int split)
{
    return &s->split[split == FY_TOKFILE_EVAL];
}

uint64_t fy_sampler_epoch_steps(const struct fy_sampler *s)
{
    return s->split[FY_TOKFILE_TRAIN].batches;
}

/* ---- the documents as pieces ---- */

/* The pieces of documents [from, to) into p, counting in st what the cut did. */
static int cut_pieces(const struct fy_sampler *s, uint64_t from, uint64_t to, struct pieces *p,
                      struct fy_sampler_split *st)
{
    const struct fy_tokfile *t = s->data;
    const uint64_t T = (uint64_t)s->o.T;
    int split = s->o.long_docs == FY_LONG_DOCS_SPLIT;
    uint64_t n = 0;
    for (uint64_t d = from; d < to; d++) { /* first the count */
        uint64_t pred = fy_tokfile_document_end(t, d) - fy_tokfile_document_start(t, d) - 1;
        n += pred == 0 ? 0 : split ? (pred + T - 1) / T : 1;
    }
    FY_REQUIRE(n < UINT32_MAX, -E2BIG,
               "%llu pieces of documents to pack: at most %u are supported; train with "
               "--packing windows",
               (unsigned long long)n, UINT32_MAX - 1);
    p->start = malloc((n ? n : 1) * sizeof *p->start);
    p->len = malloc((n ? n : 1) * sizeof *p->len);
    FY_REQUIRE(p->start != NULL && p->len != NULL, -ENOMEM,
               "out of memory for the %llu pieces of documents to pack", (unsigned long long)n);
    memset(st, 0, sizeof *st);
    st->documents = to - from;
    for (uint64_t d = from; d < to; d++) {
        uint64_t at = fy_tokfile_document_start(t, d);
        uint64_t pred = fy_tokfile_document_end(t, d) - at - 1;
        if (pred == 0) {
            st->single++;
            continue;
        }
        if (pred > T && split)
            st->split++;
        if (pred > T && !split) {
            st->truncated++;
            st->dropped += pred - T;
            pred = T;
        }
        for (uint64_t k = 0; k < pred; k += T) {
            p->start[p->n] = at + k;
            p->len[p->n] = (uint32_t)(pred - k < T ? pred - k : T);
            st->tokens += p->len[p->n];
            p->n++;
        }
    }
    st->pieces = p->n;
    return 0;
}

/* ---- packing ---- */

static uint64_t shuffle_key(uint64_t seed, uint64_t salt, uint64_t epoch)
{
    return fy_tokfile_mix64(fy_tokfile_mix64(fy_tokfile_mix64(seed) ^ salt) ^ epoch);
}

/* Fisher-Yates from the last element down: element i swaps with j = mix64(key ^ i) mod (i + 1)
 * (the bias of the modulo is below n / 2^64: none that a run can see). */
static void shuffle(uint32_t *a, uint64_t n, uint64_t key)
{
    for (uint64_t i = n; i-- > 1;) {
        uint64_t j = fy_tokfile_mix64(key ^ i) % (i + 1);
        uint32_t x = a[i];
        a[i] = a[j];
        a[j] = x;
    }
}

/* The leftmost leaf of the max-tree (leaves from `leaves`) whose room holds len; the root's room
 * must. */
static uint64_t first_fit(const uint32_t *tree, uint64_t leaves, uint32_t len)
{
    uint64_t i = 1;
    while (i < leaves)
        i = tree[2 * i] >= len ? 2 * i : 2 * i + 1;
    return i - leaves;
}

static void take_room(uint32_t *tree, uint64_t leaves, uint64_t row, uint32_t len)
{
    uint64_t i = leaves + row;
    tree[i] -= len;
    for (i /= 2; i >= 1; i /= 2)
        tree[i] = tree[2 * i] > tree[2 * i + 1] ? tree[2 * i] : tree[2 * i + 1];
}

/* Packs split's pieces into r: with `shuffled`, in epoch's order (the pieces shuffled, then the
 * rows), else in file order with the rows as opened. */
static int pack(const struct fy_sampler *s, int split, uint64_t epoch, int shuffled, struct rows *r)
{
    const struct pieces *p = &s->pieces[split];
    const uint32_t T = (uint32_t)s->o.T;
    uint64_t n = p->n, leaves = 1;
    while (leaves < n)
        leaves *= 2;
    rows_free(r);
    uint32_t *order = malloc((n + 1) * sizeof *order), *sorted = malloc((n + 1) * sizeof *sorted);
    uint32_t *row_of = malloc((n + 1) * sizeof *row_of);
    uint32_t *tree = calloc(2 * leaves, sizeof *tree);
    uint64_t *count = calloc((size_t)T + 2, sizeof *count);
    r->first = calloc(n + 2, sizeof *r->first);
    r->items = malloc((n + 1) * sizeof *r->items);
    r->order = malloc((n + 1) * sizeof *r->order);
    int rc = order && sorted && row_of && tree && count && r->first && r->items && r->order
                 ? 0
                 : -ENOMEM;
    if (rc < 0) {
        fy_error("out of memory packing %llu pieces of documents", (unsigned long long)n);
        goto out;
    }
    for (uint64_t i = 0; i < n; i++)
        order[i] = (uint32_t)i;
    if (shuffled)
        shuffle(order, n, shuffle_key(s->o.seed, FY_SAMPLER_SALT_PIECES, epoch));
    /* longest first, a stable counting sort: equal lengths keep the shuffled order */
    for (uint64_t i = 0; i < n; i++)
        count[p->len[i]]++;
    uint64_t at = 0;
    for (uint32_t len = T; len >= 1; len--) {
        uint64_t c = count[len];
        count[len] = at;
        at += c;
    }
    for (uint64_t i = 0; i < n; i++)
        sorted[count[p->len[order[i]]]++] = order[i];
    /* first fit: every row has room T until used; n rows always suffice */
    for (uint64_t i = 0; i < n; i++)
        tree[leaves + i] = T;
    for (uint64_t i = leaves - 1; i >= 1; i--)
        tree[i] = tree[2 * i] > tree[2 * i + 1] ? tree[2 * i] : tree[2 * i + 1];
    uint64_t rows = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t len = p->len[sorted[i]];
        uint64_t row = first_fit(tree, leaves, len);
        take_room(tree, leaves, row, len);
        row_of[i] = (uint32_t)row;
        rows = row + 1 > rows ? row + 1 : rows;
    }
    for (uint64_t i = 0; i < n; i++)
        r->first[row_of[i] + 1]++;
    for (uint64_t k = 0; k < rows; k++)
        r->first[k + 1] += r->first[k];
    /* each row's pieces in the order they were placed */
    uint32_t *next = calloc(rows + 1, sizeof *next);
    if (next == NULL) {
        rc = -ENOMEM;
        fy_error("out of memory packing %llu pieces of documents", (unsigned long long)n);
        goto out;
    }
    for (uint64_t i = 0; i < n; i++)
        r->items[r->first[row_of[i]] + next[row_of[i]]++] = sorted[i];
    free(next);
    for (uint64_t k = 0; k < rows; k++)
        r->order[k] = (uint32_t)k;
    if (shuffled)
        shuffle(r->order, rows, shuffle_key(s->o.seed, FY_SAMPLER_SALT_ROWS, epoch));
    r->n = rows;
    r->epoch = epoch;
out:
    free(order);
    free(sorted);
    free(row_of);
    free(tree);
    free(count);
    if (rc < 0)
        rows_free(r);
    return rc;
}

/* ---- batches ---- */

static void pad_row(int32_t *in, int32_t *tg, int32_t *pos, int from, int T)
{
    for (int t = from; t < T; t++) {
        in[t] = 0;
        tg[t] = -1;
        pos[t] = 0;
    }
}

/* Rows [row0, row0 + B) of r (past its end: padding) into the batch. */
static void fill_batch(const struct fy_sampler *s, int split, const struct rows *r, uint64_t row0,
                       int32_t *inputs, int32_t *targets, int32_t *positions,
                       struct fy_sampler_fill *fill)
{
    const struct fy_tokfile *t = s->data;
    const struct pieces *p = &s->pieces[split];
    const int B = s->o.B, T = s->o.T;
    struct fy_sampler_fill f = {0};
    for (int b = 0; b < B; b++) {
        int32_t *in = inputs + (size_t)b * T, *tg = targets + (size_t)b * T;
        int32_t *pos = positions + (size_t)b * T;
        uint64_t row = row0 + (uint64_t)b;
        int at = 0;
        if (row < r->n) {
            uint32_t k = r->order[row];
            for (uint32_t i = r->first[k]; i < r->first[k + 1]; i++) {
                uint64_t start = p->start[r->items[i]];
                uint32_t len = p->len[r->items[i]];
                for (uint32_t j = 0; j < len; j++) {
                    in[at + (int)j] = (int32_t)fy_tokfile_token(t, start + j);
                    tg[at + (int)j] = fy_tokfile_trained(t, start + j + 1)
                                          ? (int32_t)fy_tokfile_token(t, start + j + 1)
                                          : -1;
                    pos[at + (int)j] = (int32_t)j;
                }
                at += (int)len;
            }
        }
        f.tokens += (uint64_t)at;
        pad_row(in, tg, pos, at, T);
    }
    for (size_t i = 0; i < (size_t)B * (size_t)T; i++)
        f.targets += targets[i] >= 0;
    if (fill != NULL)
        *fill = f;
}

static void window_fill(const struct fy_sampler *s, const int32_t *targets, int32_t *positions,
                        struct fy_sampler_fill *fill)
{
    const int B = s->o.B, T = s->o.T;
    struct fy_sampler_fill f = {.tokens = (uint64_t)B * (uint64_t)T};
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            positions[(size_t)b * T + t] = t;
    for (size_t i = 0; i < (size_t)B * (size_t)T; i++)
        f.targets += targets[i] >= 0;
    if (fill != NULL)
        *fill = f;
}

int fy_sampler_train_batch(struct fy_sampler *s, uint64_t step, int32_t *inputs, int32_t *targets,
                           int32_t *positions, struct fy_sampler_fill *fill)
{
    if (s->o.packing == FY_PACKING_WINDOWS) {
        FY_TRY(fy_tokfile_batch(s->data, FY_TOKFILE_TRAIN, s->o.seed, step, s->o.B, s->o.T, inputs,
                                targets));
        window_fill(s, targets, positions, fill);
        return 0;
    }
    uint64_t per = fy_sampler_epoch_steps(s), k = step > 0 ? step - 1 : 0;
    uint64_t epoch = k / per, j = k % per;
    struct rows *r = &s->rows[FY_TOKFILE_TRAIN];
    if (r->epoch != epoch)
        FY_TRY(pack(s, FY_TOKFILE_TRAIN, epoch, 1, r));
    fill_batch(s, FY_TOKFILE_TRAIN, r, j * (uint64_t)s->o.B, inputs, targets, positions, fill);
    return 0;
}

int fy_sampler_eval_batch(struct fy_sampler *s, uint64_t index, int32_t *inputs, int32_t *targets,
                          int32_t *positions, struct fy_sampler_fill *fill)
{
    if (s->o.packing == FY_PACKING_WINDOWS) {
        FY_TRY(fy_tokfile_eval_batch(s->data, index, s->o.B, s->o.T, inputs, targets));
        window_fill(s, targets, positions, fill);
        return 0;
    }
    const struct fy_sampler_split *e = &s->split[FY_TOKFILE_EVAL];
    FY_REQUIRE(e->batches > 0, -EINVAL,
               "the %llu held-out documents have nothing to predict (each one token): hold out "
               "more (--eval-fraction) or evaluate none (--eval-batches 0)",
               (unsigned long long)e->documents);
    fill_batch(s, FY_TOKFILE_EVAL, &s->rows[FY_TOKFILE_EVAL], index % e->batches * s->o.B, inputs,
               targets, positions, fill);
    return 0;
}

/* ---- set-up ---- */

static uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

static int new_windows(struct fy_sampler *s)
{
    FY_TRY(fy_tokfile_split(s->data, s->o.eval_fraction));
    const uint64_t T = (uint64_t)s->o.T, B = (uint64_t)s->o.B;
    uint64_t n = fy_tokfile_split_tokens(s->data, FY_TOKFILE_TRAIN);
    struct fy_sampler_split *tr = &s->split[FY_TOKFILE_TRAIN], *ev = &s->split[FY_TOKFILE_EVAL];
    tr->rows = n > T ? (n - 1) / T : 0;
    tr->tokens = tr->rows * T;
    tr->batches = tr->rows > 0 ? ceil_div(tr->rows, B) : 1;
    ev->rows = fy_tokfile_eval_windows(s->data, s->o.T);
    ev->tokens = ev->rows * T;
    ev->batches = ceil_div(ev->rows, B);
    return 0;
}

static int new_documents(struct fy_sampler *s)
{
    struct fy_tokfile *t = s->data;
    FY_TRY(fy_tokfile_split_documents(t, s->o.eval_fraction));
    uint64_t first_eval = fy_tokfile_eval_first_document(t), docs = fy_tokfile_documents(t);
    struct fy_sampler_split *tr = &s->split[FY_TOKFILE_TRAIN], *ev = &s->split[FY_TOKFILE_EVAL];
    FY_TRY(cut_pieces(s, 0, first_eval, &s->pieces[FY_TOKFILE_TRAIN], tr));
    FY_TRY(cut_pieces(s, first_eval, docs, &s->pieces[FY_TOKFILE_EVAL], ev));
    FY_REQUIRE(tr->pieces > 0, -EINVAL,
               "the %llu training documents have nothing to predict (each is one token): "
               "prepare the data again",
               (unsigned long long)tr->documents);
    FY_TRY(pack(s, FY_TOKFILE_EVAL, 0, 0, &s->rows[FY_TOKFILE_EVAL]));
    FY_TRY(pack(s, FY_TOKFILE_TRAIN, 0, 1, &s->rows[FY_TOKFILE_TRAIN]));
    tr->rows = s->rows[FY_TOKFILE_TRAIN].n;
    ev->rows = s->rows[FY_TOKFILE_EVAL].n;
    tr->batches = ceil_div(tr->rows, (uint64_t)s->o.B);
    ev->batches = ceil_div(ev->rows, (uint64_t)s->o.B);
    return 0;
}

int fy_sampler_new(struct fy_sampler **out, struct fy_tokfile *data,
                   const struct fy_sampler_opts *o)
{
    *out = NULL;
    FY_REQUIRE(o->B > 0 && o->T > 0, -EINVAL,
               "batch size %d and sequence length %d must be positive", o->B, o->T);
    struct fy_sampler *s = calloc(1, sizeof *s);
    FY_REQUIRE(s != NULL, -ENOMEM, "out of memory for the batch sampler");
    s->data = data;
    s->o = *o;
    s->rows[0].epoch = s->rows[1].epoch = UINT64_MAX;
    int records = fy_tokfile_documents(data) > 0 && fy_tokfile_documents_are_records(data);
    if (s->o.packing == FY_PACKING_AUTO)
        s->o.packing = records ? FY_PACKING_DOCUMENTS : FY_PACKING_WINDOWS;
    int rc = s->o.packing == FY_PACKING_DOCUMENTS ? new_documents(s) : new_windows(s);
    if (rc < 0) {
        fy_sampler_destroy(&s);
        return rc;
    }
    *out = s;
    return 0;
}
