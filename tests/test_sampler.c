/* Tests of the batches (common/data/sampler): packed documents, each training document once an
 * epoch and never split across rows, the positions and padding, the fill, truncation and split
 * counts, the held-out split by whole documents each evaluated once a pass, the first-fit rule on a
 * hand example, a step's batch the same asked cold (a resume) or in turn, every batch as
 * tests/reference/batch_ref.py rebuilds it from docs/usage.md's rules alone; windows as
 * fy_tokfile_batch draws them with positions 0..T-1; which packing a file gets by default. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/base/log.h"
#include "common/data/sampler.h"
#include "common/formats/tokfile.h"
#include "common/formats/tokwriter.h"
#include "tests/refmodel.h"
#include "tests/testutil.h"

static char *tmpdir;

static int setup(void **state)
{
    tmpdir = fy_test_tmpdir("sampler");
    return tmpdir == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    fy_test_rmdir(tmpdir);
    free(tmpdir);
    tmpdir = NULL;
    return 0;
}

static const char *tpath(const char *name) { return fy_test_path(tmpdir, name); }

/* Document d's token j is 1 + d * STRIDE + j, so a token tells its document and place (and
 * padding's input 0 none). */
#define STRIDE 64
#define MAX_DOCS 200

/* A file of documents of lens[d] tokens each (records), trained[] per token (NULL: all). */
static const char *write_docs(const char *name, const unsigned *lens, unsigned n,
                              const uint8_t *masked_doc)
{
    const char *p = tpath(name);
    unlink(p);
    struct fy_tokwriter *w;
    assert_int_equal(fy_tokwriter_begin(&w, p, MAX_DOCS * STRIDE + 1, NULL, 0), 0);
    for (unsigned d = 0; d < n; d++) {
        assert_true(lens[d] >= 1 && lens[d] <= STRIDE);
        uint32_t tok[STRIDE];
        for (unsigned j = 0; j < lens[d]; j++)
            tok[j] = 1 + d * STRIDE + j;
        assert_int_equal(fy_tokwriter_document(w, 1), 0);
        /* a document of masked_doc: its first half masked (a prompt), the rest trained */
        unsigned prompt = masked_doc != NULL && masked_doc[d] ? lens[d] / 2 : 0;
        if (prompt > 0)
            assert_int_equal(fy_tokwriter_put(w, tok, prompt, 0), 0);
        assert_int_equal(fy_tokwriter_put(w, tok + prompt, lens[d] - prompt, 1), 0);
    }
    assert_int_equal(fy_tokwriter_finish(&w, NULL, NULL), 0);
    return p;
}

static struct fy_sampler *new_sampler(struct fy_tokfile *t, int packing, int long_docs, int B,
                                      int T, uint64_t seed, double frac)
{
    struct fy_sampler_opts o = {.packing = packing,
                                .long_docs = long_docs,
                                .B = B,
                                .T = T,
                                .seed = seed,
                                .eval_fraction = frac};
    struct fy_sampler *s = NULL;
    assert_int_equal(fy_sampler_new(&s, t, &o), 0);
    return s;
}

/* What a pass saw: per document, the predictions seen of each of its tokens (bit j: the
 * prediction of token j + 1). */
struct seen {
    uint64_t pred[MAX_DOCS];
    unsigned pieces[MAX_DOCS];
    uint64_t tokens, targets;
};

/* Checks one batch's rows: documents as contiguous runs with positions 0, 1, ..., each a
 * document's consecutive tokens (inputs 1 + d*STRIDE + j, targets the next token or -1 where
 * masked), then padding to the row's end (input 0, target -1, position 0); records what it saw. */
static void check_batch(const int32_t *in, const int32_t *tg, const int32_t *pos, int B, int T,
                        const uint8_t *masked_doc, const unsigned *lens, struct seen *s)
{
    for (int b = 0; b < B; b++) {
        int t = 0;
        while (t < T && in[b * T + t] != 0) {
            /* a piece: from a position 0 while the positions count up */
            assert_int_equal(pos[b * T + t], 0);
            unsigned d = (unsigned)(in[b * T + t] - 1) / STRIDE;
            unsigned j0 = (unsigned)(in[b * T + t] - 1) % STRIDE;
            assert_true(d < MAX_DOCS);
            int k = 0;
            for (; t + k < T && in[b * T + t + k] != 0 && pos[b * T + t + k] == k; k++) {
                int i = b * T + t + k;
                unsigned j = j0 + (unsigned)k;
                assert_int_equal(in[i], (int32_t)(1 + d * STRIDE + j));
                assert_true(j + 1 < lens[d]); /* never the document's last token as an input */
                int masked = masked_doc != NULL && masked_doc[d] && j + 1 < lens[d] / 2;
                assert_int_equal(tg[i], masked ? -1 : (int32_t)(1 + d * STRIDE + j + 1));
                assert_false(s->pred[d] >> j & 1); /* each prediction once */
                s->pred[d] |= 1ull << j;
                s->targets += tg[i] >= 0;
            }
            s->pieces[d]++;
            s->tokens += (uint64_t)k;
            t += k;
        }
        for (; t < T; t++) { /* padding to the end */
            assert_int_equal(in[b * T + t], 0);
            assert_int_equal(tg[b * T + t], -1);
            assert_int_equal(pos[b * T + t], 0);
        }
    }
}

/* Lengths of 1 to 40 tokens: some of one token, some longer than T + 1 = 17. */
static unsigned doc_lens(unsigned *lens, unsigned n, uint64_t seed)
{
    for (unsigned d = 0; d < n; d++)
        lens[d] = 1 + (unsigned)(fy_test_rand(&seed) % 40);
    lens[3] = 1;
    lens[4] = 40;
    return n;
}

/* Each training document once an epoch, whole (truncated to T + 1 tokens), never the held-out
 * ones nor those of one token; the counts and the fill as the sampler says; another order each
 * epoch. */
static void test_documents_once_an_epoch(void **state)
{
    enum { D = 60, B = 3, T = 16 };
    unsigned lens[D];
    doc_lens(lens, D, 11);
    uint8_t masked_doc[D] = {0};
    for (unsigned d = 0; d < D; d += 5)
        masked_doc[d] = 1;
    struct fy_tokfile *t;
    assert_int_equal(fy_tokfile_open(&t, write_docs("d.tok", lens, D, masked_doc), 0), 0);
    struct fy_sampler *s = new_sampler(t, FY_PACKING_AUTO, FY_LONG_DOCS_TRUNCATE, B, T, 9, 0.1);
    assert_int_equal(fy_sampler_packing(s), FY_PACKING_DOCUMENTS); /* records: documents */
    const struct fy_sampler_split *tr = fy_sampler_split_of(s, FY_TOKFILE_TRAIN);
    const struct fy_sampler_split *ev = fy_sampler_split_of(s, FY_TOKFILE_EVAL);
    assert_int_equal(tr->documents, 54); /* round(60 x 0.1) = 6 held out: the last */
    assert_int_equal(ev->documents, 6);
    unsigned single = 0, truncated = 0;
    uint64_t dropped = 0, tokens = 0;
    for (unsigned d = 0; d < 54; d++) {
        unsigned pred = lens[d] - 1;
        single += pred == 0;
        truncated += pred > T;
        dropped += pred > T ? pred - T : 0;
        tokens += pred > T ? T : pred;
    }
    assert_int_equal(tr->single, single);
    assert_int_equal(tr->truncated, truncated);
    assert_true(truncated > 0 && single > 0);
    assert_int_equal(tr->dropped, dropped);
    assert_int_equal(tr->tokens, tokens);
    assert_int_equal(tr->pieces, 54 - single);
    uint64_t per = fy_sampler_epoch_steps(s);
    assert_int_equal(per, (tr->rows + B - 1) / B);
    assert_true(tr->rows * T >= tokens && (tr->rows - 1) * T < tokens * 2); /* first fit: dense */

    int32_t in[B * T], tg[B * T], pos[B * T], first[3][B * T];
    for (uint64_t epoch = 0; epoch < 3; epoch++) {
        struct seen seen = {0};
        uint64_t fill_tokens = 0, fill_targets = 0;
        for (uint64_t j = 0; j < per; j++) {
            struct fy_sampler_fill f;
            assert_int_equal(fy_sampler_train_batch(s, epoch * per + j + 1, in, tg, pos, &f), 0);
            check_batch(in, tg, pos, B, T, masked_doc, lens, &seen);
            fill_tokens += f.tokens;
            fill_targets += f.targets;
            if (j == 0)
                memcpy(first[epoch], in, sizeof in);
        }
        for (unsigned d = 0; d < D; d++) {
            unsigned pred = lens[d] - 1, want = pred > T ? T : pred;
            uint64_t all = want == 64 ? ~0ull : (1ull << want) - 1;
            if (d < 54 && pred > 0) { /* once, whole: the first `want` predictions */
                assert_int_equal(seen.pieces[d], 1);
                assert_true(seen.pred[d] == all);
            } else {
                assert_int_equal(seen.pieces[d], 0);
            }
        }
        assert_int_equal(seen.tokens, tokens);
        assert_int_equal(fill_tokens, tokens);
        assert_int_equal(fill_targets, seen.targets);
    }
    assert_memory_not_equal(first[0], first[1], sizeof first[0]);
    assert_memory_not_equal(first[1], first[2], sizeof first[1]);

    /* asked cold, as a resumed run asks: the same batch */
    int32_t in2[B * T], tg2[B * T], pos2[B * T];
    uint64_t step = per + 2;
    assert_int_equal(fy_sampler_train_batch(s, step, in, tg, pos, NULL), 0);
    struct fy_sampler *cold = new_sampler(t, FY_PACKING_AUTO, FY_LONG_DOCS_TRUNCATE, B, T, 9, 0.1);
    assert_int_equal(fy_sampler_train_batch(cold, step, in2, tg2, pos2, NULL), 0);
    assert_memory_equal(in, in2, sizeof in);
    assert_memory_equal(tg, tg2, sizeof tg);
    assert_memory_equal(pos, pos2, sizeof pos);
    fy_sampler_destroy(&cold);
    /* another seed: another order */
    struct fy_sampler *other =
        new_sampler(t, FY_PACKING_AUTO, FY_LONG_DOCS_TRUNCATE, B, T, 10, 0.1);
    assert_int_equal(fy_sampler_train_batch(other, 1, in2, tg2, pos2, NULL), 0);
    assert_memory_not_equal(first[0], in2, sizeof in2);
    fy_sampler_destroy(&other);
    fy_sampler_destroy(&s);
    assert_null(s);
    fy_sampler_destroy(&s); /* safe on NULL */
    fy_tokfile_destroy(&t);
}

/* --long-docs split: every prediction of a long document once, in pieces of T, each a document of
 * its own (positions from 0). */
static void test_split_long_documents(void **state)
{
    enum { D = 40, B = 2, T = 8 };
    unsigned lens[D];
    doc_lens(lens, D, 5);
    struct fy_tokfile *t;
    assert_int_equal(fy_tokfile_open(&t, write_docs("s.tok", lens, D, NULL), 0), 0);
    struct fy_sampler *s = new_sampler(t, FY_PACKING_DOCUMENTS, FY_LONG_DOCS_SPLIT, B, T, 3, 0.1);
    const struct fy_sampler_split *tr = fy_sampler_split_of(s, FY_TOKFILE_TRAIN);
    unsigned split = 0, pieces = 0;
    uint64_t tokens = 0;
    for (unsigned d = 0; d < 36; d++) {
        unsigned pred = lens[d] - 1;
        split += pred > T;
        pieces += (pred + T - 1) / T;
        tokens += pred;
    }
    assert_int_equal(tr->split, split);
    assert_int_equal(tr->truncated, 0);
    assert_int_equal(tr->pieces, pieces);
    assert_int_equal(tr->tokens, tokens);
    uint64_t per = fy_sampler_epoch_steps(s);
    int32_t in[B * T], tg[B * T], pos[B * T];
    struct seen seen = {0};
    for (uint64_t j = 0; j < per; j++) {
        assert_int_equal(fy_sampler_train_batch(s, per + j + 1, in, tg, pos, NULL), 0);
        check_batch(in, tg, pos, B, T, NULL, lens, &seen);
    }
    for (unsigned d = 0; d < 36; d++) {
        unsigned pred = lens[d] - 1;
        assert_int_equal(seen.pieces[d], (pred + T - 1) / T);
        assert_true(seen.pred[d] == (pred == 64 ? ~0ull : (1ull << pred) - 1));
    }
    fy_sampler_destroy(&s);
    fy_tokfile_destroy(&t);
}

/* The held-out split is the last documents, whole; a pass evaluates each once (in file order,
 * unshuffled) and the batches after it wrap around; no training batch holds one. */
static void test_eval_split_whole_documents(void **state)
{
    enum { D = 50, B = 2, T = 16 };
    unsigned lens[D];
    doc_lens(lens, D, 21);
    lens[44] = 1; /* a held-out document of one token: nothing to evaluate */
    struct fy_tokfile *t;
    assert_int_equal(fy_tokfile_open(&t, write_docs("e.tok", lens, D, NULL), 0), 0);
    struct fy_sampler *s =
        new_sampler(t, FY_PACKING_DOCUMENTS, FY_LONG_DOCS_TRUNCATE, B, T, 1, 0.25);
    const struct fy_sampler_split *ev = fy_sampler_split_of(s, FY_TOKFILE_EVAL);
    assert_int_equal(ev->documents, 13); /* round(12.5) */
    assert_int_equal(fy_tokfile_eval_first_document(t), 37);
    assert_int_equal(fy_tokfile_split_tokens(t, FY_TOKFILE_EVAL),
                     fy_tokfile_count(t) - fy_tokfile_document_start(t, 37));
    assert_int_equal(ev->single, 1);
    int32_t in[B * T], tg[B * T], pos[B * T], again[B * T];
    struct seen seen = {0};
    for (uint64_t k = 0; k < ev->batches; k++) {
        assert_int_equal(fy_sampler_eval_batch(s, k, in, tg, pos, NULL), 0);
        check_batch(in, tg, pos, B, T, NULL, lens, &seen);
    }
    for (unsigned d = 0; d < D; d++)
        assert_int_equal(seen.pieces[d], d >= 37 && lens[d] > 1 ? 1 : 0);
    assert_int_equal(fy_sampler_eval_batch(s, 0, in, tg, pos, NULL), 0);
    assert_int_equal(fy_sampler_eval_batch(s, ev->batches, again, tg, pos, NULL), 0);
    assert_memory_equal(in, again, sizeof in);
    /* training batches: never a held-out document */
    struct seen train = {0};
    for (uint64_t j = 0; j < 2 * fy_sampler_epoch_steps(s); j++) {
        assert_int_equal(fy_sampler_train_batch(s, j + 1, in, tg, pos, NULL), 0);
        memset(&train.pred, 0, sizeof train.pred); /* two epochs: each once per epoch */
        check_batch(in, tg, pos, B, T, NULL, lens, &train);
    }
    for (unsigned d = 37; d < D; d++)
        assert_int_equal(train.pieces[d], 0);
    fy_sampler_destroy(&s);
    fy_tokfile_destroy(&t);
}

/* The rule on a hand example: predictions 7, 5, 4, 3, 3, 2, 6 (documents of one more token) in
 * rows of T = 10 go, longest first, each into the first row with room: {7, 3}, {6, 4}, {5, 3, 2}
 * (a full fill), in some order; B = 2 gives two steps, the second with one padding row. */
static void test_first_fit_rule(void **state)
{
    enum { D = 8, B = 2, T = 10 };
    const unsigned lens[D] = {8, 6, 5, 4, 4, 3, 7, 2}; /* the last one held out */
    struct fy_tokfile *t;
    assert_int_equal(fy_tokfile_open(&t, write_docs("h.tok", lens, D, NULL), 0), 0);
    struct fy_sampler *s =
        new_sampler(t, FY_PACKING_DOCUMENTS, FY_LONG_DOCS_TRUNCATE, B, T, 4, 0.1);
    const struct fy_sampler_split *tr = fy_sampler_split_of(s, FY_TOKFILE_TRAIN);
    assert_int_equal(tr->documents, 7);
    assert_int_equal(tr->rows, 3);
    assert_int_equal(tr->tokens, 30);
    assert_int_equal(fy_sampler_epoch_steps(s), 2);
    for (uint64_t epoch = 0; epoch < 4; epoch++) {
        int rows_seen[3] = {0}, padding_rows = 0;
        uint64_t filled = 0;
        for (uint64_t j = 0; j < 2; j++) {
            int32_t in[B * T], tg[B * T], pos[B * T];
            struct fy_sampler_fill f;
            assert_int_equal(fy_sampler_train_batch(s, epoch * 2 + j + 1, in, tg, pos, &f), 0);
            for (int b = 0; b < B; b++) {
                /* the row's lengths in order: its pieces run from each position 0 */
                unsigned row[4] = {0}, n = 0;
                for (int k = 0; k < T; k++)
                    if (tg[b * T + k] >= 0) {
                        if (pos[b * T + k] == 0)
                            n++;
                        row[n - 1]++;
                    }
                if (n == 0) {
                    padding_rows++;
                    continue;
                }
                if (n == 2 && row[0] == 7 && row[1] == 3)
                    rows_seen[0]++;
                else if (n == 2 && row[0] == 6 && row[1] == 4)
                    rows_seen[1]++;
                else if (n == 3 && row[0] == 5 && row[1] == 3 && row[2] == 2)
                    rows_seen[2]++;
                else
                    fail_msg("epoch %llu: a row of %u pieces (%u, %u, %u) not first-fit's",
                             (unsigned long long)epoch, n, row[0], row[1], row[2]);
            }
            filled += f.tokens;
        }
        assert_int_equal(filled, 30);
        assert_int_equal(padding_rows, 1);
        for (int r = 0; r < 3; r++)
            assert_int_equal(rows_seen[r], 1);
    }
    fy_sampler_destroy(&s);
    fy_tokfile_destroy(&t);
}

/* Reads B*T "input target position" lines for each of n batches. */
static void read_ref(const char *path, int n, int B, int T, int32_t *in, int32_t *tg, int32_t *pos)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    for (int i = 0; i < n * B * T; i++)
        assert_int_equal(fscanf(f, "%d %d %d", &in[i], &tg[i], &pos[i]), 3);
    fclose(f);
}

/* Every batch as tests/reference/batch_ref.py rebuilds it from docs/usage.md's rules, for
 * training steps over three epochs and a pass of held-out batches, truncating and splitting. */
static void test_batches_as_documented(void **state)
{
    enum { D = 120, B = 3, T = 12, STEPS = 80 };
    unsigned lens[D];
    doc_lens(lens, D, 77);
    uint8_t masked_doc[D] = {0};
    for (unsigned d = 1; d < D; d += 3)
        masked_doc[d] = 1;
    const char *file = write_docs("r.tok", lens, D, masked_doc);
    char script[1024];
    snprintf(script, sizeof script, "%s", "tests/reference/batch_ref.py");
    if (access(script, R_OK) != 0)
        fail_msg("run from the repository root: %s not found", script);
    struct fy_tokfile *t;
    assert_int_equal(fy_tokfile_open(&t, file, 0), 0);
    for (int split = 0; split < 2; split++) {
        const char *how = split ? "split" : "truncate";
        struct fy_sampler *s = new_sampler(t, FY_PACKING_DOCUMENTS, split, B, T, 12345, 0.15);
        uint64_t per = fy_sampler_epoch_steps(s), eval = fy_sampler_split_of(s, 1)->batches;
        assert_true(per < STEPS); /* past an epoch's end */
        static int32_t in[STEPS * B * T], tg[STEPS * B * T], pos[STEPS * B * T];
        static int32_t rin[STEPS * B * T], rtg[STEPS * B * T], rpos[STEPS * B * T];
        for (int which = 0; which < 2; which++) {
            int n = which == 0 ? STEPS : (int)eval;
            assert_true(n <= STEPS);
            char *argv[12 + STEPS];
            char num[STEPS][24];
            int a = 0;
            argv[a++] = "python3";
            argv[a++] = script;
            argv[a++] = which == 0 ? "train" : "eval";
            argv[a++] = (char *)file;
            argv[a++] = "3";
            argv[a++] = "12";
            argv[a++] = "12345";
            argv[a++] = "0.15";
            argv[a++] = (char *)how;
            char out[1024];
            snprintf(out, sizeof out, "%s", tpath("ref.txt"));
            argv[a++] = out;
            for (int k = 0; k < n; k++) {
                snprintf(num[k], sizeof num[k], "%d", which == 0 ? k + 1 : k);
                argv[a++] = num[k];
            }
            argv[a] = NULL;
            assert_int_equal(fy_refmodel_run(argv, 60), 0);
            read_ref(out, n, B, T, rin, rtg, rpos);
            for (int k = 0; k < n; k++) {
                size_t at = (size_t)k * B * T;
                if (which == 0)
                    assert_int_equal(fy_sampler_train_batch(s, (uint64_t)k + 1, in + at, tg + at,
                                                            pos + at, NULL),
                                     0);
                else
                    assert_int_equal(
                        fy_sampler_eval_batch(s, (uint64_t)k, in + at, tg + at, pos + at, NULL), 0);
            }
            for (int i = 0; i < n * B * T; i++)
                if (in[i] != rin[i] || tg[i] != rtg[i] || pos[i] != rpos[i])
                    fail_msg("%s, %s batch %d position %d: sampler %d %d %d, batch_ref.py %d %d %d",
                             how, which ? "held-out" : "training", i / (B * T) + (which == 0),
                             i % (B * T), in[i], tg[i], pos[i], rin[i], rtg[i], rpos[i]);
        }
        print_message("--long-docs %s: %d training steps (%llu an epoch) and %llu held-out "
                      "batches as batch_ref.py rebuilds them\n",
                      how, STEPS, (unsigned long long)per, (unsigned long long)eval);
        fy_sampler_destroy(&s);
    }
    fy_tokfile_destroy(&t);
}

/* Windows: fy_tokfile_batch's and fy_tokfile_eval_batch's batches, positions 0..T-1 in every row,
 * a full fill; the default for a file without documents, or whose documents are text files;
 * --packing documents refused for one without them and taken for text files. */
static void test_windows_and_defaults(void **state)
{
    enum { N = 3000, B = 4, T = 32 };
    uint32_t *tok = malloc(N * sizeof *tok);
    assert_non_null(tok);
    for (int i = 0; i < N; i++)
        tok[i] = (uint32_t)(i % 251);
    const char *v1 = tpath("v1.tok");
    assert_int_equal(fy_tokfile_write(v1, tok, N, 256, 0), 0);
    struct fy_tokfile *t;
    assert_int_equal(fy_tokfile_open(&t, v1, 256), 0);
    struct fy_sampler *s = new_sampler(t, FY_PACKING_AUTO, 0, B, T, 7, 0.1);
    assert_int_equal(fy_sampler_packing(s), FY_PACKING_WINDOWS);
    /* an epoch: the windows the 2700 training tokens hold side by side, B at a time */
    assert_int_equal(fy_sampler_epoch_steps(s), (2699 / T + B - 1) / B);
    int32_t in[B * T], tg[B * T], pos[B * T], rin[B * T], rtg[B * T];
    for (uint64_t step = 1; step < 5; step++) {
        struct fy_sampler_fill f;
        assert_int_equal(fy_sampler_train_batch(s, step, in, tg, pos, &f), 0);
        assert_int_equal(fy_tokfile_batch(t, FY_TOKFILE_TRAIN, 7, step, B, T, rin, rtg), 0);
        assert_memory_equal(in, rin, sizeof in);
        assert_memory_equal(tg, rtg, sizeof tg);
        for (int i = 0; i < B * T; i++)
            assert_int_equal(pos[i], i % T);
        assert_int_equal(f.tokens, B * T);
        assert_int_equal(f.targets, B * T);
        assert_int_equal(fy_sampler_eval_batch(s, step, in, tg, pos, NULL), 0);
        assert_int_equal(fy_tokfile_eval_batch(t, step, B, T, rin, rtg), 0);
        assert_memory_equal(in, rin, sizeof in);
        assert_memory_equal(tg, rtg, sizeof tg);
    }
    fy_sampler_destroy(&s);
    /* documents of a file that records none: refused */
    struct fy_sampler_opts o = {
        .packing = FY_PACKING_DOCUMENTS, .B = B, .T = T, .seed = 1, .eval_fraction = 0.1};
    assert_int_equal(fy_sampler_new(&s, t, &o), -EINVAL);
    assert_null(s);
    fy_tokfile_destroy(&t);

    /* text files (prepare_bytes: each a document): windows unless asked */
    FILE *f = fopen(tpath("a.txt"), "w");
    assert_non_null(f);
    for (int i = 0; i < 40; i++)
        fprintf(f, "line %d of the first file\n", i);
    fclose(f);
    f = fopen(tpath("b.txt"), "w");
    assert_non_null(f);
    for (int i = 0; i < 40; i++)
        fprintf(f, "line %d of the second file\n", i);
    fclose(f);
    char a[1024], b[1024], c[1024];
    snprintf(a, sizeof a, "%s", tpath("a.txt"));
    snprintf(b, sizeof b, "%s", tpath("b.txt"));
    snprintf(c, sizeof c, "%s", tpath("c.txt"));
    f = fopen(c, "w");
    assert_non_null(f);
    fprintf(f, "a short third file\n");
    fclose(f);
    const char *inputs[] = {a, b, c};
    assert_int_equal(fy_tokfile_prepare_bytes(tpath("text.tok"), inputs, 3, 0, NULL), 0);
    assert_int_equal(fy_tokfile_open(&t, tpath("text.tok"), 256), 0);
    s = new_sampler(t, FY_PACKING_AUTO, 0, B, T, 7, 0.3);
    assert_int_equal(fy_sampler_packing(s), FY_PACKING_WINDOWS);
    fy_sampler_destroy(&s);
    s = new_sampler(t, FY_PACKING_DOCUMENTS, FY_LONG_DOCS_TRUNCATE, B, T, 7, 0.3);
    assert_int_equal(fy_sampler_split_of(s, FY_TOKFILE_TRAIN)->documents, 2);
    assert_int_equal(fy_sampler_split_of(s, FY_TOKFILE_TRAIN)->truncated, 2);
    assert_int_equal(fy_sampler_split_of(s, FY_TOKFILE_EVAL)->documents, 1);
    fy_sampler_destroy(&s);
    fy_tokfile_destroy(&t);
    free(tok);
}

int main(void)
{
    fy_log_init("test", FY_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_documents_once_an_epoch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_split_long_documents, setup, teardown),
        cmocka_unit_test_setup_teardown(test_eval_split_whole_documents, setup, teardown),
        cmocka_unit_test_setup_teardown(test_first_fit_rule, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batches_as_documented, setup, teardown),
        cmocka_unit_test_setup_teardown(test_windows_and_defaults, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
