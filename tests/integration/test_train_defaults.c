/* Integration tests of train's two sets of defaults through fuyou-launch and its workers (CPU
 * backend, a GPT of 2 layers of width 64, batch 8 x 32):
 *   - a model made by init trains with the from-scratch defaults: the log says so and why, the
 *     learning rate of metrics.jsonl warms up over 10 steps to 1e-3 (step k: 1e-4 k), every
 *     step's gradient norm is clipped to 1 (a grad_norm each step; the plan's line says what that
 *     costs a step and that --clip-grad-norm 0 turns it off), and the opt worker runs AdamW with
 *     betas 0.9/0.95, weight decay 0.1;
 *   - the same model exported to a Hugging Face directory and imported (init --from-hf) trains with
 *     the fine-tuning defaults, transformers' Trainer's: the log says so and why, step k of N takes
 *     5e-5 (N - k + 1) / N, every step's gradient norm is computed and clipped to 1, AdamW runs with
 *     betas 0.9/0.999 and no weight decay; resume, with more steps, takes the same set (the rate of
 *     the steps it adds is the linear schedule's to the new end, not the from-scratch warmup);
 *   - options given on an imported run are kept (--lr, --clip-grad-norm 0), and the log names them;
 *   - plan --run-dir says which set train would take for each run. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/testutil.h"
#include "tests/trainutil.h"

/* train `run` to `steps` with the defaults, then the options in extra (NULL-terminated; may be
 * NULL); the launcher's exit code. */
static int train(struct fy_test_fixture *f, const char *run, const char *steps,
                 const char *const *extra)
{
    const char *args[32] = {"train", "--run-dir", run, "--data", f->data, "--steps", steps,
                            "--batch", "8", "--seq", "32", "--eval-every", "100",
                            "--eval-batches", "1", "--backend", "cpu"};
    int n = 17;
    for (int i = 0; extra != NULL && extra[i] != NULL && n < 31; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    return fy_test_launch_in(f, args, 300);
}

/* The values of `key` in run's metrics.jsonl, one per step; how many (at most max). */
static int metric_values(const char *run, const char *key, double *out, int max)
{
    char path[600];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    return fy_trainutil_field_numbers(path, key, out, max);
}

static void assert_lrs(const char *run, const double *want, int n)
{
    double lr[16];
    assert_int_equal(metric_values(run, "\"lr\": ", lr, 16), n);
    for (int k = 0; k < n; k++)
        if (fabs(lr[k] - want[k]) > 1e-8 * want[k])
            fail_msg("%s: step %d's lr is %.9g, expected %.9g", run, k + 1, lr[k], want[k]);
}

/* Whether the run's log (RUN/fuyou.log) or the last launch's output holds needle. */
static int logged(struct fy_test_fixture *f, const char *run, const char *needle)
{
    char path[600];
    snprintf(path, sizeof path, "%s/fuyou.log", run);
    return fy_test_file_contains(f->log, needle) || fy_test_file_contains(path, needle);
}

static void test_scratch_and_imported_defaults(void **state)
{
    struct fy_test_fixture *f = *state;
    char *scratch = strdup(fy_test_in(f, "scratch")), *hf = strdup(fy_test_in(f, "hf"));
    char *ft = strdup(fy_test_in(f, "ft"));
    fy_trainutil_init_model(f, scratch, "64", "1");

    /* from scratch: the from-scratch defaults, clipped to 1 as every run is by default */
    assert_int_equal(train(f, scratch, "4", NULL), 0);
    assert_true(fy_test_file_contains(
        f->log,
        fy_test_fmt(
            "train: from-scratch defaults (init made the model: %s/model.conf has no hf): lr "
            "0.001, "
            "warmup 10, cosine decay to lr x 0.1, weight decay 0.1, betas 0.9/0.95, eps 1e-08, "
            "clipping 1.0 (as transformers' Trainer, llm.c and nanoGPT clip; --clip-grad-norm 0 "
            "turns clipping off); give any option to change its value",
            scratch)));
    assert_true(logged(f, scratch, "betas (0.9, 0.95) eps 1e-08 weight decay 0.1"));
    assert_true(fy_test_file_contains(f->log, "gradient norm clipped to 1;"));
    assert_true(fy_test_file_contains(f->log, " s without clipping ("));
    assert_true(fy_test_file_contains(f->log, " s a step); --clip-grad-norm 1 (the default), 0 "
                                              "turns clipping off"));
    const double warm[4] = {1e-4, 2e-4, 3e-4, 4e-4};
    assert_lrs(scratch, warm, 4);
    double norms[8];
    assert_int_equal(metric_values(scratch, "\"grad_norm\": ", norms, 8), 4);
    const char *plan_scratch[] = {"plan", "--run-dir", scratch, "--seq", "32", "--backend", "cpu", NULL};
    assert_int_equal(fy_test_launch_in(f, plan_scratch, 60), 0);
    assert_true(fy_test_file_contains(f->log, "plan: train would take the from-scratch defaults "
                                              "(init made the model"));
    assert_true(fy_test_file_contains(f->log, " s a step); --clip-grad-norm 1 (the default), 0 "
                                              "turns clipping off"));
    const char *plan_off[] = {"plan", "--run-dir",        scratch, "--seq", "32", "--backend",
                              "cpu",  "--clip-grad-norm", "0",     NULL};
    assert_int_equal(fy_test_launch_in(f, plan_off, 60), 0);
    assert_false(fy_test_file_contains(f->log, "plan: clipping in "));

    /* the same model through Hugging Face: the fine-tuning defaults */
    const char *exp[] = {"export", "--run-dir", scratch, "--to-hf", hf, NULL};
    assert_int_equal(fy_test_launch_in(f, exp, 120), 0);
    const char *imp[] = {"init", "--run-dir", ft, "--from-hf", hf, NULL};
    assert_int_equal(fy_test_launch_in(f, imp, 120), 0);
    const char *plan_ft[] = {"plan", "--run-dir", ft, "--seq", "32", "--backend", "cpu", NULL};
    assert_int_equal(fy_test_launch_in(f, plan_ft, 60), 0);
    assert_true(fy_test_file_contains(f->log, fy_test_fmt(
        "plan: train would take the fine-tuning defaults (the model was imported from Hugging "
        "Face: %s/model.conf has hf = 1)", ft)));
    assert_int_equal(train(f, ft, "4", NULL), 0);
    assert_true(fy_test_file_contains(f->log, fy_test_fmt(
        "train: fine-tuning defaults (the model was imported from Hugging Face: %s/model.conf has "
        "hf = 1): lr 5e-05, no warmup, linear decay to 0, weight decay 0, betas 0.9/0.999, eps "
        "1e-08, clipping 1.0 (transformers' Trainer's values; --clip-grad-norm 0 turns "
        "clipping off); give any option to change its value",
        ft)));
    assert_true(logged(f, ft, "betas (0.9, 0.999) eps 1e-08 weight decay 0"));
    assert_true(fy_test_file_contains(f->log, "gradient norm clipped to 1;"));
    assert_true(fy_test_file_contains(f->log, "plan: clipping in "));
    const double linear[4] = {5e-5, 3.75e-5, 2.5e-5, 1.25e-5};
    assert_lrs(ft, linear, 4);
    assert_int_equal(metric_values(ft, "\"grad_norm\": ", norms, 8), 4);

    /* resume to step 6 takes the same set: steps 5 and 6 of a linear decay over 6 */
    const char *resume[] = {"resume", ft, "--steps", "6", NULL};
    assert_int_equal(fy_test_launch_in(f, resume, 300), 0);
    assert_true(fy_test_file_contains(f->log, "train: fine-tuning defaults (the model was "
                                              "imported from Hugging Face"));
    const double resumed[6] = {5e-5, 3.75e-5, 2.5e-5, 1.25e-5, 5e-5 * 2 / 6, 5e-5 / 6};
    assert_lrs(ft, resumed, 6);
    assert_int_equal(metric_values(ft, "\"grad_norm\": ", norms, 8), 6);
    free(scratch);
    free(hf);
    free(ft);
}

/* An imported run's given options are kept, and named in the log. */
static void test_given_options_kept(void **state)
{
    struct fy_test_fixture *f = *state;
    char *scratch = strdup(fy_test_in(f, "scratch")), *hf = strdup(fy_test_in(f, "hf"));
    char *ft = strdup(fy_test_in(f, "ft"));
    fy_trainutil_init_model(f, scratch, "64", "1");
    const char *exp[] = {"export", "--run-dir", scratch, "--to-hf", hf, NULL};
    assert_int_equal(fy_test_launch_in(f, exp, 120), 0);
    const char *imp[] = {"init", "--run-dir", ft, "--from-hf", hf, NULL};
    assert_int_equal(fy_test_launch_in(f, imp, 120), 0);
    const char *given[] = {"--lr", "2e-4", "--clip-grad-norm", "0", "--adam-beta2", "0.98", NULL};
    assert_int_equal(train(f, ft, "2", given), 0);
    assert_true(fy_test_file_contains(f->log, "; given: --lr, --adam-beta2, --clip-grad-norm; "
                                              "give any option to change its value"));
    assert_true(logged(f, ft, "betas (0.9, 0.98) eps 1e-08 weight decay 0"));
    const double lrs[2] = {2e-4, 1e-4}; /* the set's linear decay from the given rate */
    assert_lrs(ft, lrs, 2);
    double norms[4];
    assert_int_equal(metric_values(ft, "\"grad_norm\": ", norms, 4), 0);
    free(scratch);
    free(hf);
    free(ft);
}

int main(void)
{
    if (fy_trainutil_start("test_train_defaults") != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        FY_TRAINUTIL_TEST(test_scratch_and_imported_defaults),
        FY_TRAINUTIL_TEST(test_given_options_kept),
    };
    struct CMUnitTest run[sizeof tests / sizeof tests[0]];
    size_t wanted = 0; /* FY_TEST_ONLY: a few of them, by name (comma-separated globs) */
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (fy_test_wanted(tests[i].name))
            run[wanted++] = tests[i];
    return _cmocka_run_group_tests("train defaults (integration)", run, wanted, NULL, NULL);
}
