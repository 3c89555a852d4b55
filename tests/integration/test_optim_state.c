/* Integration tests of the optimizer state formats (init --optim-state bf16|int8) through the real
 * processes on the CPU backend: every invariant of fp32 holds with them. The overlapped schedule,
 * the serial one, the in-process run and state kept in the pool or streamed from the store give
 * the same bits; int8 with width 256 updates the embeddings in two row lists, with clipping in
 * two passes, the same bits again; `export` writes the masters the run holds; train and resume
 * refuse another format, and a model.conf that says another format than the store's records.
 * (Kills with int8: test_chaos; import: test_hf; plan's bytes: test_plan_cmd; the handler's
 * layouts bit for bit: tests/test_optstep.) */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/testutil.h"
#include "tests/trainutil.h"

#define CLIP_MAX 0.6

/* init of a GPT of width `embd` (2 heads, context 32, seed 4; 2 layers, 1 at width 256) in `run`
 * with --optim-state `format`. */
static void init_run(struct fy_test_fixture *f, const char *run, const char *embd,
                     const char *format)
{
    const char *layers = strcmp(embd, "256") == 0 ? "1" : "2";
    const char *init[] = {"init", "--run-dir", run, "--layers", layers, "--heads", "2", "--embd",
                          embd, "--ctx", "32", "--seed", "4", "--optim-state", format, NULL};
    assert_int_equal(fy_test_launch_in(f, init, 60), 0);
}

/* Inits `run` in `format`, trains it `steps` steps (in one process where inprocess) with the
 * `extra` options and compares its export and losses with the group's first run (or makes it the
 * first). */
static void train_same_bits(struct fy_test_fixture *f, struct fy_trainutil_same_bits *group,
                            const char *run,
                            const char *embd, const char *format, const char *steps,
                            int inprocess, const char *const *extra)
{
    char out[720], metrics[740];
    snprintf(out, sizeof out, "%s.fywt", run);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run);
    init_run(f, run, embd, format);
    assert_int_equal(fy_trainutil_train_with(f, run, f->data, steps, out, inprocess, extra), 0);
    size_t n;
    char *w = fy_test_slurp(out, &n), *l = fy_trainutil_losses(metrics);
    assert_non_null(w);
    assert_int_equal(fy_test_count_lines(l), atoi(steps));
    fy_trainutil_same_bits_add(group, w, n, l);
}

/* The runs of one format at width 64 that must agree: overlapped with the state streamed from the
 * store (the default here) and kept in the pool, serial, in one process; `extra_opt` (NULL or an
 * option and its value) given to each. Returns the group (the caller frees it). */
static struct fy_trainutil_same_bits format_agrees(struct fy_test_fixture *f, const char *format,
                                      const char *steps, const char *extra_opt,
                                      const char *extra_val)
{
    struct fy_trainutil_same_bits group = {0};
    const char *names[] = {"overlap", "resident", "serial", "inproc"};
    for (int i = 0; i < 4; i++) {
        char run[600];
        snprintf(run, sizeof run, "%s-%s%s", fy_test_in(f, format), names[i],
                 extra_opt ? "-x" : "");
        const char *extra[8] = {"--optim-state", format}; /* accepted: the run's own */
        int n = 2;
        if (i == 1) {
            extra[n++] = "--cpu-mem";
            extra[n++] = "1G";
        }
        if (i == 2) {
            extra[n++] = "--schedule";
            extra[n++] = "serial";
        }
        if (extra_opt != NULL) {
            extra[n++] = extra_opt;
            extra[n++] = extra_val;
        }
        extra[n] = NULL;
        train_same_bits(f, &group, run, "64", format, steps, i == 3, extra);
        if (i == 1)
            assert_true(fy_test_file_contains(f->log, "optimizer state of 4 of 4 units"));
    }
    return group;
}

/* bf16 and int8 each: overlap (streamed and resident), serial and in-process give the same bits;
 * the formats give other weights than each other and than fp32 (the format is in effect). With
 * int8 at width 64 the embeddings' rows would split the 8-bit blocks, so the schedule updates
 * them in one piece and says so. */
static void test_formats_overlap_matches_serial(void **state)
{
    struct fy_test_fixture *f = *state;
    struct fy_trainutil_same_bits bf16 = format_agrees(f, "bf16", "4", NULL, NULL);
    struct fy_trainutil_same_bits int8 = format_agrees(f, "int8", "4", NULL, NULL);
    assert_true(fy_test_file_contains(f->log, "with int8 optimizer state their rows of 64 values"));
    struct fy_trainutil_same_bits fp32 = {0};
    train_same_bits(f, &fp32, fy_test_in(f, "fp32"), "64", "fp32", "4", 0, NULL);
    assert_int_equal(bf16.n, fp32.n);
    assert_int_equal(int8.n, fp32.n);
    assert_memory_not_equal(bf16.weights, fp32.weights, fp32.n);
    assert_memory_not_equal(int8.weights, fp32.weights, fp32.n);
    assert_memory_not_equal(int8.weights, bf16.weights, fp32.n);
    fy_trainutil_same_bits_free(&bf16);
    fy_trainutil_same_bits_free(&int8);
    fy_trainutil_same_bits_free(&fp32);
}

/* int8 at width 256, state in the pool: the embeddings' update in two row lists (8-bit blocks of
 * whole rows) in the overlapped and the serial schedules gives the bits of one update after the
 * backward (FUYOU_TEST_EMBED_WHOLE). */
static void test_int8_embed_rows_in_two_parts(void **state)
{
    struct fy_test_fixture *f = *state;
    struct fy_trainutil_same_bits group = {0};
    const char *runs[][2] = {{"whole", "overlap"}, {"split", "overlap"}, {"split-serial", "serial"}};
    for (int i = 0; i < 3; i++) {
        int whole = i == 0;
        if (whole)
            assert_int_equal(setenv("FUYOU_TEST_EMBED_WHOLE", "1", 1), 0);
        const char *extra[] = {"--schedule", runs[i][1], "--cpu-mem", "1G", NULL};
        train_same_bits(f, &group, fy_test_in(f, runs[i][0]), "256", "int8", "3", 0, extra);
        unsetenv("FUYOU_TEST_EMBED_WHOLE");
        assert_int_equal(fy_test_file_contains(f->log, "the embeddings are updated in one piece"),
                         whole);
    }
    fy_trainutil_same_bits_free(&group);
}

/* int8 with clipping on every step (--clip-grad-norm, two backward passes): overlap, resident,
 * serial and in-process agree, and clipping did engage: the norms exceed the bound, the weights
 * differ from an unclipped run's. */
static void test_int8_clipped_agrees(void **state)
{
    struct fy_test_fixture *f = *state;
    struct fy_trainutil_same_bits group =
        format_agrees(f, "int8", "4", "--clip-grad-norm", FY_TRAINUTIL_STR(CLIP_MAX));
    double norms[8];
    int n = fy_trainutil_field_numbers(fy_test_fmt("%s/metrics.jsonl", fy_test_in(f, "int8-inproc-x")),
                                       "\"grad_norm\": ", norms, 8);
    assert_int_equal(n, 4);
    for (int i = 0; i < n; i++)
        assert_true(norms[i] > CLIP_MAX);
    struct fy_trainutil_same_bits plain = {0};
    train_same_bits(f, &plain, fy_test_in(f, "unclipped"), "64", "int8", "4", 1, NULL);
    assert_int_equal(plain.n, group.n);
    assert_memory_not_equal(plain.weights, group.weights, group.n);
    fy_trainutil_same_bits_free(&plain);
    fy_trainutil_same_bits_free(&group);
}

/* `export` of an int8 run (the masters read from the store's last commit) writes the weights the
 * run exported at its end and the in-process run (state in memory, no store) ends with. */
static void test_int8_export_is_the_master(void **state)
{
    struct fy_test_fixture *f = *state;
    struct fy_trainutil_same_bits group = {0};
    char *run = fy_test_in(f, "exported");
    train_same_bits(f, &group, fy_test_in(f, "alone"), "64", "int8", "3", 1, NULL);
    train_same_bits(f, &group, run, "64", "int8", "3", 0, NULL);
    char *out = fy_test_in(f, "later.fywt");
    const char *exp[] = {"export", "--run-dir", run, "--out", out, NULL};
    assert_int_equal(fy_test_launch_in(f, exp, 60), 0);
    size_t n;
    char *w = fy_test_slurp(out, &n);
    assert_non_null(w);
    assert_int_equal(n, group.n);
    assert_memory_equal(w, group.weights, n);
    free(w);
    fy_trainutil_same_bits_free(&group);
}

/* train and resume with another --optim-state than init's are refused with the documented line,
 * and so is a model.conf whose model.optim_state says another format than the store's records
 * (edited, or the line removed: fp32); the run trains on once model.conf is put back. */
static void test_other_format_refused(void **state)
{
    struct fy_test_fixture *f = *state;
    char *run = fy_test_in(f, "int8");
    init_run(f, run, "64", "int8");
    assert_int_equal(fy_trainutil_train(f, run, f->data, "2", NULL, 0, NULL, NULL), 0);
    assert_int_equal(fy_trainutil_train(f, run, f->data, "3", NULL, 0, "--optim-state", "fp32"), 2);
    assert_true(fy_test_file_contains(
        f->log, "train --optim-state fp32: the run keeps int8 optimizer state (init --optim-state "
                "int8), and a store's format is not converted"));
    const char *resume[] = {"resume", run, "--steps", "3", "--optim-state", "bf16", NULL};
    assert_int_equal(fy_test_launch_in(f, resume, 60), 2);
    assert_true(fy_test_file_contains(f->log, "--optim-state bf16: the run keeps int8 optimizer "
                                              "state"));
    /* model.conf edited: bf16, then no line at all (fp32) */
    char *conf_path = strdup(fy_test_fmt("%s/model.conf", run));
    size_t len;
    char *conf = fy_test_slurp(conf_path, &len);
    assert_non_null(conf);
    char *line = strstr(conf, "model.optim_state = int8");
    assert_non_null(line);
    const char *edits[][2] = {{"model.optim_state = bf16", "bf16"}, {"", "fp32"}};
    for (int i = 0; i < 2; i++) {
        FILE *out = fopen(conf_path, "w");
        assert_non_null(out);
        fwrite(conf, 1, (size_t)(line - conf), out);
        fputs(edits[i][0], out);
        fputs(line + strlen("model.optim_state = int8"), out);
        assert_int_equal(fclose(out), 0);
        assert_int_equal(fy_trainutil_train(f, run, f->data, "3", NULL, 0, NULL, NULL), 1);
        assert_true(fy_test_file_contains(
            f->log, fy_test_fmt("keeps int8 optimizer state, the run's model.conf says %s "
                                "(model.optim_state)", edits[i][1])));
    }
    FILE *out = fopen(conf_path, "w");
    assert_non_null(out);
    fwrite(conf, 1, len, out);
    assert_int_equal(fclose(out), 0);
    assert_int_equal(fy_trainutil_train(f, run, f->data, "3", NULL, 0, NULL, NULL), 0);
    assert_int_equal(fy_test_count_matches(fy_test_fmt("%s/metrics.jsonl", run), "\"step\": "), 3);
    free(conf);
    free(conf_path);
}

int main(void)
{
    if (fy_trainutil_start("test_optim_state") != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        FY_TRAINUTIL_TEST(test_formats_overlap_matches_serial),
        FY_TRAINUTIL_TEST(test_int8_embed_rows_in_two_parts),
        FY_TRAINUTIL_TEST(test_int8_clipped_agrees),
        FY_TRAINUTIL_TEST(test_int8_export_is_the_master),
        FY_TRAINUTIL_TEST(test_other_format_refused),
    };
    struct CMUnitTest run[sizeof tests / sizeof tests[0]];
    size_t wanted = 0; /* FY_TEST_ONLY: a few of them, by name (comma-separated globs) */
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (fy_test_wanted(tests[i].name))
            run[wanted++] = tests[i];
    return _cmocka_run_group_tests("optim-state (integration)", run, wanted, NULL, NULL);
}
