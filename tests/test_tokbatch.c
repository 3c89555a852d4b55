/* Tests of token files' train/eval splits and deterministic batch sampling (common/formats/tokfile:
 * fy_tokfile_split, fy_tokfile_batch, fy_tokfile_eval_batch): which windows each side draws, the
 * same batches whatever is asked before, and the refusals of batches that do not fit. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/base/log.h"
#include "common/formats/tokfile.h"
#include "common/formats/tokwriter.h"
#include "tests/testutil.h"

static char *tmpdir;

static int setup(void **state)
{
    tmpdir = fy_test_tmpdir("tokbatch");
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

static char *capture_stderr(int (*fn)(void *), void *arg, int *rc)
{
    char *text = fy_test_capture_stderr(fn, arg, rc);
    assert_non_null(text);
    return text;
}

/* ---- splits and batches ---- */

/* A file whose first n_train tokens are 0,1,2,... and whose last n_eval are EVAL_BASE+0,1,...,
 * so a window's tokens tell where it came from. */
#define EVAL_BASE 40000u
static struct fy_tokfile *open_split_file(const char *name, uint64_t n_train, uint64_t n_eval)
{
    uint64_t n = n_train + n_eval;
    uint32_t *tok = malloc(n * sizeof *tok);
    assert_non_null(tok);
    for (uint64_t i = 0; i < n; i++)
        tok[i] = i < n_train ? (uint32_t)i : EVAL_BASE + (uint32_t)(i - n_train);
    const char *p = tpath(name);
    unlink(p);
    assert_int_equal(fy_tokfile_write(p, tok, n, 60000, 0), 0);
    free(tok);
    struct fy_tokfile *t = NULL;
    assert_int_equal(fy_tokfile_open(&t, p, 60000), 0);
    assert_int_equal(fy_tokfile_split(t, (double)n_eval / (double)n), 0);
    assert_int_equal(fy_tokfile_split_tokens(t, FY_TOKFILE_TRAIN), n_train);
    assert_int_equal(fy_tokfile_split_tokens(t, FY_TOKFILE_EVAL), n_eval);
    return t;
}

struct split_case {
    struct fy_tokfile *t;
    double f;
};

static int split_fn(void *arg)
{
    struct split_case *c = arg;
    return fy_tokfile_split(c->t, c->f);
}

static void test_split(void **state)
{
    uint32_t tok[100];
    for (int i = 0; i < 100; i++)
        tok[i] = (uint32_t)i;
    const char *p = tpath("split.tok");
    assert_int_equal(fy_tokfile_write(p, tok, 100, 256, 0), 0);
    struct fy_tokfile *t = NULL;
    assert_int_equal(fy_tokfile_open(&t, p, 256), 0);
    assert_int_equal(fy_tokfile_split_tokens(t, FY_TOKFILE_TRAIN), 100);
    assert_int_equal(fy_tokfile_split_tokens(t, FY_TOKFILE_EVAL), 0);
    assert_int_equal(fy_tokfile_split_tokens(t, 7), 0);

    assert_int_equal(fy_tokfile_split(t, 0.1), 0);
    assert_int_equal(fy_tokfile_split_tokens(t, FY_TOKFILE_TRAIN), 90);
    assert_int_equal(fy_tokfile_split_tokens(t, FY_TOKFILE_EVAL), 10);
    assert_int_equal(fy_tokfile_split(t, 0.015), 0); /* 1.5 rounds to 2 */
    assert_int_equal(fy_tokfile_split_tokens(t, FY_TOKFILE_EVAL), 2);
    assert_int_equal(fy_tokfile_split_tokens(t, FY_TOKFILE_TRAIN), 98);
    assert_int_equal(fy_tokfile_split(t, 0.98), 0);
    assert_int_equal(fy_tokfile_split_tokens(t, FY_TOKFILE_TRAIN), 2);
    assert_int_equal(fy_tokfile_split(t, 0.25), 0);

    struct split_case c = {t, 0.01};
    int rc = 0;
    char *log = capture_stderr(split_fn, &c, &rc);
    assert_int_equal(rc, -EINVAL);
    assert_non_null(strstr(log, "leaves 99 training and 1 eval tokens"));
    assert_non_null(strstr(log, p));
    free(log);
    double bad[] = {0.0, 0.99, 1.0, -0.1, 1.5, NAN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        c.f = bad[i];
        log = capture_stderr(split_fn, &c, &rc);
        assert_int_equal(rc, -EINVAL);
        assert_int_equal(fy_test_count_lines(log), 1);
        free(log);
    }
    /* a refused split leaves the previous one */
    assert_int_equal(fy_tokfile_split_tokens(t, FY_TOKFILE_TRAIN), 75);
    assert_int_equal(fy_tokfile_split_tokens(t, FY_TOKFILE_EVAL), 25);
    fy_tokfile_destroy(&t);
}

/* Each row is T+1 consecutive tokens lying inside [lo, hi] (token values). */
static void check_rows(const int32_t *in, const int32_t *tg, int B, int T, int32_t lo, int32_t hi)
{
    for (int b = 0; b < B; b++)
        for (int j = 0; j < T; j++) {
            int32_t x = in[b * T + j], y = tg[b * T + j];
            assert_true(x >= lo && y <= hi);
            assert_int_equal(y, x + 1);
            if (j > 0)
                assert_int_equal(x, tg[b * T + j - 1]);
        }
}

static void test_batch(void **state)
{
    const uint64_t n_train = 1000, n_eval = 200;
    struct fy_tokfile *t = open_split_file("batch.tok", n_train, n_eval);
    enum { B = 8, T = 16 };
    int32_t in[B * T], tg[B * T], in2[B * T], tg2[B * T];

    assert_int_equal(fy_tokfile_batch(t, FY_TOKFILE_TRAIN, 42, 7, B, T, in, tg), 0);
    check_rows(in, tg, B, T, 0, (int32_t)n_train - 1);
    /* same arguments, same batch (no hidden state, even after other calls) */
    assert_int_equal(fy_tokfile_batch(t, FY_TOKFILE_TRAIN, 42, 8, B, T, in2, tg2), 0);
    assert_int_equal(fy_tokfile_batch(t, FY_TOKFILE_TRAIN, 42, 7, B, T, in2, tg2), 0);
    assert_memory_equal(in, in2, sizeof in);
    assert_memory_equal(tg, tg2, sizeof tg);
    /* golden starts: the generator must not change between builds or machines */
    static const int32_t golden[B] = {583, 636, 171, 593, 617, 387, 254, 914};
    for (int b = 0; b < B; b++)
        assert_int_equal(in[b * T], golden[b]);
    /* a different step, seed or split draws different windows */
    assert_int_equal(fy_tokfile_batch(t, FY_TOKFILE_TRAIN, 42, 8, B, T, in2, tg2), 0);
    assert_memory_not_equal(in, in2, sizeof in);
    assert_int_equal(fy_tokfile_batch(t, FY_TOKFILE_TRAIN, 43, 7, B, T, in2, tg2), 0);
    assert_memory_not_equal(in, in2, sizeof in);
    assert_int_equal(fy_tokfile_batch(t, FY_TOKFILE_EVAL, 42, 7, B, T, in2, tg2), 0);
    check_rows(in2, tg2, B, T, (int32_t)EVAL_BASE, (int32_t)(EVAL_BASE + n_eval - 1));
    /* rows of one batch differ */
    assert_memory_not_equal(in, in + T, T * sizeof(int32_t));

    /* over many steps: training windows never touch eval tokens, eval windows never touch training
     * tokens, and the starts reach both ends of each split */
    int32_t min_tr = INT32_MAX, max_tr = 0, min_ev = INT32_MAX, max_ev = 0;
    for (uint64_t step = 0; step < 2000; step++) {
        assert_int_equal(fy_tokfile_batch(t, FY_TOKFILE_TRAIN, 1, step, B, T, in, tg), 0);
        check_rows(in, tg, B, T, 0, (int32_t)n_train - 1);
        assert_int_equal(fy_tokfile_batch(t, FY_TOKFILE_EVAL, 1, step, B, T, in2, tg2), 0);
        check_rows(in2, tg2, B, T, (int32_t)EVAL_BASE, (int32_t)(EVAL_BASE + n_eval - 1));
        for (int b = 0; b < B; b++) {
            min_tr = in[b * T] < min_tr ? in[b * T] : min_tr;
            max_tr = tg[b * T + T - 1] > max_tr ? tg[b * T + T - 1] : max_tr;
            min_ev = in2[b * T] < min_ev ? in2[b * T] : min_ev;
            max_ev = tg2[b * T + T - 1] > max_ev ? tg2[b * T + T - 1] : max_ev;
        }
    }
    assert_int_equal(min_tr, 0);
    assert_int_equal(max_tr, n_train - 1);
    assert_int_equal(min_ev, EVAL_BASE);
    assert_int_equal(max_ev, EVAL_BASE + n_eval - 1);

    fy_tokfile_destroy(&t);
}

struct batch_case {
    struct fy_tokfile *t;
    int split, B, T;
    int eval;
};

static int batch_fn(void *arg)
{
    struct batch_case *c = arg;
    static int32_t in[1 << 16], tg[1 << 16];
    if (c->eval)
        return fy_tokfile_eval_batch(c->t, 0, c->B, c->T, in, tg);
    return fy_tokfile_batch(c->t, c->split, 0, 0, c->B, c->T, in, tg);
}

static void test_batch_too_large(void **state)
{
    struct fy_tokfile *t = open_split_file("large.tok", 100, 20);
    const char *p = tpath("large.tok");
    int32_t in[2 * 99], tg[2 * 99];
    /* T+1 == split size is the largest that fits */
    assert_int_equal(fy_tokfile_batch(t, FY_TOKFILE_TRAIN, 0, 0, 2, 99, in, tg), 0);
    check_rows(in, tg, 2, 99, 0, 99);
    assert_int_equal(in[0], 0);
    assert_int_equal(fy_tokfile_batch(t, FY_TOKFILE_EVAL, 0, 0, 2, 19, in, tg), 0);
    assert_int_equal(in[0], EVAL_BASE);
    assert_int_equal(fy_tokfile_eval_batch(t, 3, 2, 19, in, tg), 0);
    assert_int_equal(in[0], EVAL_BASE);

    struct batch_case cases[] = {
        {t, FY_TOKFILE_TRAIN, 2, 100, 0},
        {t, FY_TOKFILE_EVAL, 1, 20, 0},
        {t, FY_TOKFILE_EVAL, 1, 20, 1},
    };
    const char *want[] = {"the training split has 100 tokens, a window needs T+1 = 101",
                          "the eval split has 20 tokens, a window needs T+1 = 21",
                          "the eval split has 20 tokens, a window needs T+1 = 21"};
    for (int i = 0; i < 3; i++) {
        int rc = 0;
        char *log = capture_stderr(batch_fn, &cases[i], &rc);
        assert_int_equal(rc, -EINVAL);
        assert_int_equal(fy_test_count_lines(log), 1);
        assert_non_null(strstr(log, "batch larger than the data"));
        assert_non_null(strstr(log, want[i]));
        assert_non_null(strstr(log, p));
        free(log);
    }
    /* bad arguments */
    assert_int_equal(fy_tokfile_batch(t, 2, 0, 0, 1, 4, in, tg), -EINVAL);
    assert_int_equal(fy_tokfile_batch(t, FY_TOKFILE_TRAIN, 0, 0, 0, 4, in, tg), -EINVAL);
    assert_int_equal(fy_tokfile_batch(t, FY_TOKFILE_TRAIN, 0, 0, 1, 0, in, tg), -EINVAL);
    assert_int_equal(fy_tokfile_eval_batch(t, 0, 1, -1, in, tg), -EINVAL);
    fy_tokfile_destroy(&t);

    /* without a split there is no eval data */
    assert_int_equal(fy_tokfile_open(&t, p, 60000), 0);
    assert_int_equal(fy_tokfile_eval_windows(t, 4), 0);
    assert_int_equal(fy_tokfile_eval_batch(t, 0, 1, 4, in, tg), -EINVAL);
    assert_int_equal(fy_tokfile_batch(t, FY_TOKFILE_EVAL, 0, 0, 1, 4, in, tg), -EINVAL);
    assert_int_equal(fy_tokfile_batch(t, FY_TOKFILE_TRAIN, 0, 0, 1, 119, in, tg), 0);
    fy_tokfile_destroy(&t);
}

static void test_eval_batches(void **state)
{
    const uint64_t n_eval = 103;
    struct fy_tokfile *t = open_split_file("eval.tok", 500, n_eval);
    enum { B = 4, T = 10 };
    assert_int_equal(fy_tokfile_eval_windows(t, T), 10); /* (103-1)/10 */
    assert_int_equal(fy_tokfile_eval_windows(t, 102), 1);
    assert_int_equal(fy_tokfile_eval_windows(t, 103), 0);
    assert_int_equal(fy_tokfile_eval_windows(t, 0), 0);
    int32_t in[B * T], tg[B * T], in2[B * T], tg2[B * T];

    /* one pass, ceil(10/4) = 3 batches: windows 0..9 then wrapping to 0, 1 */
    int32_t seen_in[12 * T], seen_tg[12 * T];
    for (uint64_t index = 0; index < 3; index++) {
        assert_int_equal(fy_tokfile_eval_batch(t, index, B, T, in, tg), 0);
        check_rows(in, tg, B, T, (int32_t)EVAL_BASE, (int32_t)(EVAL_BASE + n_eval - 1));
        memcpy(seen_in + index * B * T, in, sizeof in);
        memcpy(seen_tg + index * B * T, tg, sizeof tg);
        /* deterministic */
        assert_int_equal(fy_tokfile_eval_batch(t, index, B, T, in2, tg2), 0);
        assert_memory_equal(in, in2, sizeof in);
        assert_memory_equal(tg, tg2, sizeof tg);
    }
    /* the inputs of windows 0..9 are eval tokens 0..99 in order, the targets 1..100 */
    for (int i = 0; i < 10 * T; i++) {
        assert_int_equal(seen_in[i], (int32_t)EVAL_BASE + i);
        assert_int_equal(seen_tg[i], (int32_t)EVAL_BASE + i + 1);
    }
    /* wrap-around */
    for (int i = 0; i < 2 * T; i++)
        assert_int_equal(seen_in[10 * T + i], (int32_t)EVAL_BASE + i);
    /* batch index 5 starts at window (5*4) mod 10 = 0; index 6 at 4 */
    assert_int_equal(fy_tokfile_eval_batch(t, 5, B, T, in, tg), 0);
    assert_int_equal(in[0], (int32_t)EVAL_BASE);
    assert_int_equal(fy_tokfile_eval_batch(t, 6, B, T, in, tg), 0);
    assert_int_equal(in[0], (int32_t)EVAL_BASE + 4 * T);
    /* huge indices do not overflow */
    assert_int_equal(fy_tokfile_eval_batch(t, UINT64_MAX, B, T, in, tg), 0);
    /* (2^64-1)*4 mod 10: (2^64-1) mod 10 = 5, times 4 = 20, mod 10 = 0 */
    assert_int_equal(in[0], (int32_t)EVAL_BASE);
    fy_tokfile_destroy(&t);
}

int main(void)
{
    fy_log_init("test", FY_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_split, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_too_large, setup, teardown),
        cmocka_unit_test_setup_teardown(test_eval_batches, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
