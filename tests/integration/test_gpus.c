/* Integration tests of several gpu workers (--gpus N) through the real processes on the CPU
 * backend, each worker computing B / N sequences of every step and the gradients summed in rank
 * order through the pool: one worker is today's run bit for bit; two and three are the same run to
 * run, bit for bit, and within float rounding of one over 10 steps (losses, gradient norms,
 * weights), GPT-2 and Llama; placements and schedules do not change their bits, and one-pass
 * clipping is exact across them; what they cannot do is refused before any step. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/formats/ckpt.h"
#include "common/model/model.h"
#include "tests/testutil.h"
#include "tests/trainutil.h"

#define STEPS 10
#define BATCH "6" /* a multiple of 1, 2 and 3 */

/* What a run ends with: its exported weights (the file, and as floats), losses and gradient norms
 * (--clip-grad-norm 1e6 logs the norm and never clips) and last held-out loss. */
struct result {
    char *file;
    size_t file_n;
    float *w;
    uint64_t w_n;
    char *losses, *norms_text;
    double loss[STEPS], norm[STEPS], eval;
};

static void init_arch(struct fy_test_fixture *f, const char *run, const char *arch)
{
    if (strcmp(arch, "gpt") == 0) {
        fy_trainutil_init_model(f, run, "32", "5");
        return;
    }
    const char *init[] = {"init", "--run-dir", run, "--arch", "llama", "--layers", "2", "--heads",
                          "4", "--kv-heads", "2", "--embd", "32", "--ffn", "48", "--ctx", "32",
                          "--seed", "3", NULL};
    assert_int_equal(fy_test_launch_in(f, init, 60), 0);
}

/* A run `name` of `arch` to STEPS steps at batch 6 with `gpus` gpu workers (NULL: no --gpus) and
 * the options in `extra` (NULL-terminated, may be NULL). */
static struct result train(struct fy_test_fixture *f, const char *name, const char *arch,
                           const char *gpus, const char *const *extra)
{
    char *run = fy_test_in(f, name), out[700], metrics[700];
    snprintf(out, sizeof out, "%s.fywt", run);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run);
    init_arch(f, run, arch);
    const char *opts[24];
    int n = 0;
    opts[n++] = "--batch";
    opts[n++] = BATCH;
    opts[n++] = "--clip-grad-norm";
    opts[n++] = "1e6";
    opts[n++] = "--eval-every";
    opts[n++] = "5";
    if (gpus != NULL) {
        opts[n++] = "--gpus";
        opts[n++] = gpus;
    }
    for (int i = 0; extra != NULL && extra[i] != NULL; i++)
        opts[n++] = extra[i];
    opts[n] = NULL;
    assert_int_equal(fy_trainutil_train_with(f, run, f->data, FY_TRAINUTIL_STR(STEPS), out, 0, opts),
                     0);
    struct result r = {0};
    r.file = fy_test_slurp(out, &r.file_n);
    assert_non_null(r.file);
    struct fy_model_config c;
    uint64_t step;
    assert_int_equal(fy_weights_read(out, &c, &step, &r.w), 0);
    r.w_n = fy_model_total_params(&c);
    r.losses = fy_trainutil_losses(metrics);
    r.norms_text = fy_trainutil_field_values(metrics, "\"grad_norm\": ");
    assert_int_equal(fy_trainutil_field_numbers(metrics, "\"loss\": ", r.loss, STEPS), STEPS);
    assert_int_equal(fy_trainutil_field_numbers(metrics, "\"grad_norm\": ", r.norm, STEPS), STEPS);
    r.eval = fy_trainutil_last_eval_loss(metrics);
    return r;
}

static void result_free(struct result *r)
{
    free(r->file);
    free(r->w);
    free(r->losses);
    free(r->norms_text);
}

static void assert_same_bits(const struct result *a, const struct result *b)
{
    assert_string_equal(a->losses, b->losses);
    assert_string_equal(a->norms_text, b->norms_text);
    assert_int_equal(a->file_n, b->file_n);
    assert_memory_equal(a->file, b->file, a->file_n);
}

/* Within float rounding: each step's loss and gradient norm to 1e-6 relative, the held-out loss
 * likewise, and every weight to 1e-5 of the largest weight (sums of the same terms in another
 * order, through 10 AdamW steps, whose normalised updates can amplify a rounding difference in a
 * near-zero gradient element; measured: 6e-8, 2e-7 and 1.3e-6). */
static void assert_close(const struct result *a, const struct result *b, const char *what)
{
    double worst_loss = 0, worst_norm = 0, worst_w = 0, largest = 0;
    for (int k = 0; k < STEPS; k++) {
        worst_loss = fmax(worst_loss, fabs(a->loss[k] - b->loss[k]) / fabs(a->loss[k]));
        worst_norm = fmax(worst_norm, fabs(a->norm[k] - b->norm[k]) / fabs(a->norm[k]));
    }
    assert_int_equal(a->w_n, b->w_n);
    for (uint64_t i = 0; i < a->w_n; i++) {
        worst_w = fmax(worst_w, fabs((double)a->w[i] - b->w[i]));
        largest = fmax(largest, fabs((double)a->w[i]));
    }
    printf("%s: losses within %.2g, gradient norms within %.2g (relative), weights within %.2g "
           "of the largest (%.3g); held-out %.6f against %.6f\n", what, worst_loss, worst_norm,
           worst_w / largest, largest, b->eval, a->eval);
    assert_true(worst_loss < 1e-6);
    assert_true(worst_norm < 1e-6);
    assert_true(fabs(a->eval - b->eval) / a->eval < 1e-6);
    assert_true(worst_w < 1e-5 * largest);
}

/* --gpus 1 is the run without it, bit for bit (one worker, no share, no sum). */
static void test_one_gpu_is_the_plain_run(void **state)
{
    struct fy_test_fixture *f = *state;
    struct result plain = train(f, "plain", "gpt", NULL, NULL);
    struct result one = train(f, "one", "gpt", "1", NULL);
    assert_same_bits(&plain, &one);
    assert_false(fy_test_file_contains(f->log, "started gpu1 worker"));
    result_free(&plain);
    result_free(&one);
}

/* Two and three workers: each run twice gives the same bits, and each is within float rounding of
 * one worker; GPT-2 and Llama (an untied head: its gradient summed as the embeddings' is). */
static void test_several_gpus_deterministic_and_close(void **state)
{
    struct fy_test_fixture *f = *state;
    static const char *const archs[] = {"gpt", "llama"};
    for (int a = 0; a < 2; a++) {
        struct result one = train(f, fy_test_fmt("%s-1", archs[a]), archs[a], "1", NULL);
        for (int n = 2; n <= 3; n++) {
            char gpus[4];
            snprintf(gpus, sizeof gpus, "%d", n);
            struct result x = train(f, fy_test_fmt("%s-%d", archs[a], n), archs[a], gpus, NULL);
            struct result again =
                train(f, fy_test_fmt("%s-%d-again", archs[a], n), archs[a], gpus, NULL);
            assert_true(fy_test_file_contains(f->log, fy_test_fmt("started gpu%d worker", n - 1)));
            assert_same_bits(&x, &again);
            assert_close(&one, &x, fy_test_fmt("%s, %d gpu workers against one", archs[a], n));
            assert_memory_not_equal(one.file, x.file, one.file_n); /* a sum of shares, not one */
            result_free(&x);
            result_free(&again);
        }
        result_free(&one);
    }
}

/* With two workers, where the state lives (kept in the pool, streamed from the store) and the
 * schedule (overlapped, serial) change no bit, as with one. */
static void test_two_gpus_placements_same_bits(void **state)
{
    struct fy_test_fixture *f = *state;
    static const char *const kept[] = {"--cpu-mem", "1G", NULL};
    static const char *const serial[] = {"--schedule", "serial", NULL};
    struct result streamed = train(f, "streamed", "gpt", "2", NULL);
    struct result in_pool = train(f, "kept", "gpt", "2", kept);
    struct result one_at_a_time = train(f, "serial", "gpt", "2", serial);
    assert_same_bits(&streamed, &in_pool);
    assert_same_bits(&streamed, &one_at_a_time);
    result_free(&streamed);
    result_free(&in_pool);
    result_free(&one_at_a_time);
}

/* Clipping by the global norm with two workers (a bound every step reaches): one backward pass
 * (the gradients held in the pool) gives the bits of two, the state kept or streamed; the norm
 * is the whole batch's. */
static void test_two_gpus_clipping_exact(void **state)
{
    struct fy_test_fixture *f = *state;
    static const char *const cases[2][8] = {
        {"--clip-grad-norm", "0.6", "--cpu-mem", "1G", "--clip-mode", NULL, NULL, NULL},
        {"--clip-grad-norm", "0.6", "--clip-mode", NULL, NULL, NULL, NULL, NULL}};
    static const char *const modes[2] = {"two-pass", "one-pass"};
    for (int c = 0; c < 2; c++) {
        struct result r[2];
        for (int m = 0; m < 2; m++) {
            const char *opts[8];
            int n = 0;
            for (; cases[c][n] != NULL; n++)
                opts[n] = cases[c][n];
            opts[n++] = modes[m];
            opts[n] = NULL;
            r[m] = train(f, fy_test_fmt("clip-%d-%s", c, modes[m]), "gpt", "2", opts);
            for (int k = 0; k < STEPS; k++)
                assert_true(r[m].norm[k] > 0.6); /* clipped every step */
        }
        assert_same_bits(&r[0], &r[1]);
        result_free(&r[0]);
        result_free(&r[1]);
    }
}

/* What several workers cannot do is refused before any step, saying what to change. */
static void test_gpus_refused(void **state)
{
    struct fy_test_fixture *f = *state;
    char *run = fy_test_in(f, "refused");
    fy_trainutil_init_model(f, run, "32", "5");
    const char *uneven[] = {"--batch", "5", "--gpus", "2", NULL};
    assert_int_not_equal(fy_trainutil_train_with(f, run, f->data, "2", NULL, 0, uneven), 0);
    assert_true(fy_test_file_contains(f->log, "--batch 5 over --gpus 2"));
    const char *many[] = {"--gpus", "9", NULL};
    assert_int_not_equal(fy_trainutil_train_with(f, run, f->data, "2", NULL, 0, many), 0);
    assert_true(fy_test_file_contains(f->log, "--gpus 9: give 1 to 8"));
    const char *none[] = {"--gpus", "0", NULL};
    assert_int_not_equal(fy_trainutil_train_with(f, run, f->data, "2", NULL, 0, none), 0);
    const char *inproc[] = {"--gpus", "2", NULL};
    assert_int_not_equal(fy_trainutil_train_with(f, run, f->data, "2", NULL, 1, inproc), 0);
    assert_true(fy_test_file_contains(f->log, "drop --gpus 2 or --inprocess"));
    const char *swapped[] = {"--gpus", "2", "--act-plan", "host", NULL};
    assert_int_not_equal(fy_trainutil_train_with(f, run, f->data, "2", NULL, 0, swapped), 0);
    assert_true(fy_test_file_contains(f->log, "--act-plan host with --gpus 2: swapping"));
    const char *held[] = {"--gpus", "2", "--clip-grad-norm", "1", "--clip-mode", "one-pass",
                          "--clip-hold", "gpu", NULL};
    assert_int_not_equal(fy_trainutil_train_with(f, run, f->data, "2", NULL, 0, held), 0);
    assert_true(fy_test_file_contains(f->log, "--clip-hold gpu with --gpus 2: gradients held"));
}

int main(void)
{
    if (fy_trainutil_start("test_gpus") != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        FY_TRAINUTIL_TEST(test_one_gpu_is_the_plain_run),
        FY_TRAINUTIL_TEST(test_several_gpus_deterministic_and_close),
        FY_TRAINUTIL_TEST(test_two_gpus_placements_same_bits),
        FY_TRAINUTIL_TEST(test_two_gpus_clipping_exact),
        FY_TRAINUTIL_TEST(test_gpus_refused),
    };
    struct CMUnitTest run[sizeof tests / sizeof tests[0]];
    size_t wanted = 0; /* FY_TEST_ONLY: a few of them, by name (comma-separated globs) */
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (fy_test_wanted(tests[i].name))
            run[wanted++] = tests[i];
    return _cmocka_run_group_tests("gpus (integration)", run, wanted, NULL, NULL);
}
