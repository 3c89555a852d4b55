/* Integration tests of Llama training through the real processes on the CPU backend (init --arch
 * llama; train --backend cpu): the overlapped schedule, the serial one and the in-process run give
 * the same losses and weights bit for bit, untied and tied heads, with gradient clipping too; the
 * loss falls; the model.conf and the store header carry the architecture; the export is a weights
 * file of the Llama; and the CUDA backend refuses a Llama with one clear line. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/model/arch/arch.h"
#include "common/formats/ckpt.h"
#include "common/base/config.h"
#include "common/model/arch/llama.h"
#include "common/model/model.h"
#include "tests/testutil.h"

#define SAMPLE_TEXT "tests/fixtures/sample.txt"

static int setup(void **state) { return fy_test_setup(state, "llama", SAMPLE_TEXT); }
static int teardown(void **state) { return fy_test_teardown(state); }

/* A tiny Llama: 2 layers, 4 heads over 2 kv heads (grouped-query), 32 wide, MLP 48, context 32. */
static void init_llama(struct fy_test_fixture *f, const char *run, int tied)
{
    const char *args[] = {"init", "--run-dir", run, "--arch", "llama", "--layers", "2", "--heads", "4",
                          "--kv-heads", "2", "--embd", "32", "--ffn", "48", "--ctx", "32",
                          "--rope-theta", "500000", "--seed", "3", tied ? "--tied" : NULL, NULL};
    assert_int_equal(fy_test_launch(f->log, args, 60), 0);
}

/* Trains `steps` steps with the options in `extra` (NULL-terminated, may be NULL), exporting to
 * `export_path`. */
static int train(struct fy_test_fixture *f, const char *run, const char *steps,
                 const char *export_path, const char *const *extra)
{
    const char *args[40];
    int n = 0;
    const char *base[] = {"train", "--run-dir", run, "--data", f->data, "--steps", steps,
                          "--batch", "4", "--seq", "32", "--lr", "3e-3", "--warmup", "5",
                          "--eval-every", "100", "--eval-batches", "4", "--backend", "cpu",
                          "--export", export_path};
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        args[n++] = base[i];
    for (int i = 0; extra != NULL && extra[i] != NULL && n < 39; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    return fy_test_launch(f->log, args, 300);
}

/* The "loss" values of a metrics file, as text, one per line. */
static char *losses(const char *run)
{
    char metrics[600];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run);
    char *text = fy_test_slurp(metrics, NULL);
    assert_non_null(text);
    char *out = calloc(1, strlen(text) + 1);
    for (char *p = text; (p = strstr(p, "\"loss\": ")) != NULL; p++) {
        strncat(out, p, strcspn(p, ",}"));
        strcat(out, "\n");
    }
    free(text);
    return out;
}

static double first_value(const char *lines) { return strtod(lines + strlen("\"loss\": "), NULL); }

static double last_value(const char *lines)
{
    const char *last = lines;
    for (const char *p = lines; (p = strstr(p, "\"loss\": ")) != NULL; p++)
        last = p;
    return strtod(last + strlen("\"loss\": "), NULL);
}

/* Three runs of the same model (overlap, serial, in one process) with the options in `extra`:
 * the same losses, every printed digit, and the same exported bits; the loss falls. */
static void schedules_agree(struct fy_test_fixture *f, int tied, const char *steps,
                            const char *clip)
{
    const char *names[3] = {"overlap", "serial", "inproc"};
    char *loss[3], *weights[3];
    size_t len[3];
    for (int i = 0; i < 3; i++) {
        char run[64], exp[64];
        snprintf(run, sizeof run, "%s-%s", names[i], tied ? "tied" : "untied");
        snprintf(exp, sizeof exp, "%s.fywt", run);
        char *dir = fy_test_in(f, run), *out = fy_test_in(f, exp);
        init_llama(f, dir, tied);
        const char *extra[6] = {NULL};
        int n = 0;
        if (i == 1) {
            extra[n++] = "--schedule";
            extra[n++] = "serial";
        }
        if (i == 2)
            extra[n++] = "--inprocess";
        if (clip != NULL) {
            extra[n++] = "--clip-grad-norm";
            extra[n++] = clip;
        }
        assert_int_equal(train(f, dir, steps, out, extra), 0);
        loss[i] = losses(dir);
        weights[i] = fy_test_slurp(out, &len[i]);
        assert_non_null(weights[i]);
        if (i == 0) {
            /* the export is this Llama at the last step, its blocks trained away from the init */
            struct fy_model_config c;
            uint64_t step;
            float *params = NULL;
            assert_int_equal(fy_weights_read(out, &c, &step, &params), 0);
            assert_int_equal(step, strtoull(steps, NULL, 10));
            assert_ptr_equal(c.arch, &fy_arch_llama);
            assert_int_equal(fy_llama(&c)->n_kv_head, 2);
            assert_int_equal(fy_llama(&c)->n_inter, 48);
            assert_int_equal(fy_llama(&c)->tied, tied);
            assert_true(fy_llama(&c)->rope_theta == 500000.0);
            size_t n1 = fy_model_unit_params(&c, 1);
            float *init = malloc(n1 * sizeof *init);
            fy_model_init_unit(&c, 1, 3, init);
            assert_memory_not_equal(params + fy_model_unit_params(&c, 0), init, n1 * sizeof *init);
            free(init);
            free(params);
        }
    }
    fprintf(stderr, "llama (%s head%s) losses:\n%s", tied ? "tied" : "untied",
            clip ? ", clipped" : "", loss[0]);
    assert_true(strlen(loss[0]) > 0);
    for (int i = 1; i < 3; i++) {
        assert_string_equal(loss[0], loss[i]);
        assert_int_equal(len[0], len[i]);
        assert_memory_equal(weights[0], weights[i], len[0]);
    }
    double first = first_value(loss[0]), last = last_value(loss[0]);
    assert_true(fabs(first - log(256.0)) < 0.1); /* N(0, 0.02) weights: close to uniform */
    assert_true(last < first - 0.5);
    for (int i = 0; i < 3; i++) {
        free(loss[i]);
        free(weights[i]);
    }
}

static void test_untied_schedules_agree(void **state) { schedules_agree(*state, 0, "20", NULL); }

static void test_tied_clipped_schedules_agree(void **state) { schedules_agree(*state, 1, "20", "0.5"); }

/* An untied head's final unit (the norm and lm_head) is larger than a block here, as in the small
 * Llamas people fine-tune: clipping's room for its gradient must not be taken for a block slot. */
static void test_untied_clipped_schedules_agree(void **state)
{
    schedules_agree(*state, 0, "20", "0.5");
}

/* model.conf names the architecture and its fields; the store's header does too (its config hash
 * differs from the GPT-2 of the same sizes); a GPT-2 model.conf has none of the new keys. */
static void test_model_conf_and_hash(void **state)
{
    struct fy_test_fixture *f = *state;
    char *run = fy_test_in(f, "conf");
    init_llama(f, run, 0);
    char mc_path[600];
    snprintf(mc_path, sizeof mc_path, "%s/model.conf", run);
    assert_true(fy_test_file_contains(mc_path, "model.arch"));
    struct fy_config *cfg = malloc(sizeof *cfg);
    assert_non_null(cfg);
    fy_config_init(cfg);
    assert_int_equal(fy_config_load(cfg, mc_path), 0);
    struct fy_model_config c;
    assert_int_equal(fy_model_config_from(cfg, &c), 0);
    assert_ptr_equal(c.arch, &fy_arch_llama);
    assert_int_equal(c.n_head, 4);
    assert_int_equal(fy_llama(&c)->n_kv_head, 2);
    assert_int_equal(fy_llama(&c)->n_inter, 48);
    assert_int_equal(fy_llama(&c)->tied, 0);
    assert_true(fy_llama(&c)->rope_theta == 500000.0);
    assert_true(fy_llama(&c)->rms_eps == 1e-5f);
    free(cfg);
    struct fy_model_config g = {.n_layer = 2, .n_head = 4, .n_embd = 32, .vocab = 256, .ctx = 32};
    assert_true(fy_model_config_hash(&g) != fy_model_config_hash(&c));

    char *gpt = fy_test_in(f, "gpt");
    const char *args[] = {"init", "--run-dir", gpt, "--layers", "1", "--heads", "2", "--embd", "16",
                          "--ctx", "16", NULL};
    assert_int_equal(fy_test_launch(f->log, args, 60), 0);
    snprintf(mc_path, sizeof mc_path, "%s/model.conf", gpt);
    assert_false(fy_test_file_contains(mc_path, "model.arch"));
    /* Llama options without --arch llama are refused */
    char *bad = fy_test_in(f, "bad");
    const char *wrong[] = {"init", "--run-dir", bad, "--kv-heads", "2", NULL};
    assert_int_equal(fy_test_launch(f->log, wrong, 60), 2);
    assert_true(fy_test_file_contains(f->log, "not options of --arch gpt2"));
}

int main(void)
{
    signal(SIGCHLD, SIG_DFL);
    if (access(fy_test_bin("fuyou-launch"), X_OK) != 0 || access(SAMPLE_TEXT, R_OK) != 0) {
        fprintf(stderr, "test_llama_train: run from the repository root after make\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_model_conf_and_hash, setup, teardown),
        cmocka_unit_test_setup_teardown(test_untied_schedules_agree, setup, teardown),
        cmocka_unit_test_setup_teardown(test_untied_clipped_schedules_agree, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tied_clipped_schedules_agree, setup, teardown),
    };
    return cmocka_run_group_tests_name("llama training (integration)", tests, NULL, NULL);
}
