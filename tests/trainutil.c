/* What the integration tests of GPT training share (see trainutil.h). */
#include "tests/trainutil.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int fy_trainutil_start(const char *program)
{
    signal(SIGCHLD, SIG_DFL);
    if (access(fy_test_bin("fuyou-launch"), X_OK) != 0 ||
        access(FY_TRAINUTIL_SAMPLE_TEXT, R_OK) != 0) {
        fprintf(stderr, "%s: run from the repository root after make\n", program);
        return 1;
    }
    return 0;
}

int fy_trainutil_setup(void **state)
{
    return fy_test_setup(state, "train", FY_TRAINUTIL_SAMPLE_TEXT);
}

int fy_trainutil_teardown(void **state) { return fy_test_teardown(state); }

void fy_trainutil_init_model(struct fy_test_fixture *f, const char *run, const char *embd,
                             const char *seed)
{
    const char *args[] = {"init", "--run-dir", run, "--layers", "2", "--heads", "2", "--embd", embd,
                          "--ctx", "32", "--seed", seed, NULL};
    assert_int_equal(fy_test_launch_in(f, args, 60), 0);
}

int fy_trainutil_train_with(struct fy_test_fixture *f, const char *run, const char *data,
                            const char *steps, const char *export_path, int inprocess,
                            const char *const *extra)
{
    const char *args[48];
    int n = 0;
    const char *base[] = {"train",
                          "--run-dir",
                          run,
                          "--data",
                          data,
                          "--steps",
                          steps,
                          "--batch",
                          FY_TRAINUTIL_STR(FY_TRAINUTIL_BATCH),
                          "--seq",
                          FY_TRAINUTIL_STR(FY_TRAINUTIL_SEQ),
                          "--lr",
                          FY_TRAINUTIL_STR(FY_TRAINUTIL_LR),
                          "--warmup",
                          FY_TRAINUTIL_STR(FY_TRAINUTIL_WARMUP),
                          "--eval-every",
                          "100",
                          "--eval-batches",
                          "8",
                          "--backend",
                          "cpu",
                          "--cpu-mem",
                          "0"};
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        args[n++] = base[i];
    if (export_path) {
        args[n++] = "--export";
        args[n++] = export_path;
    }
    if (inprocess)
        args[n++] = "--inprocess";
    for (int i = 0; extra != NULL && extra[i] != NULL && n < 47; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    return fy_test_launch_in(f, args, 300);
}

int fy_trainutil_train(struct fy_test_fixture *f, const char *run, const char *data,
                       const char *steps, const char *export_path, int inprocess,
                       const char *extra_flag, const char *extra_value)
{
    const char *extra[] = {extra_flag, extra_value, NULL};
    return fy_trainutil_train_with(f, run, data, steps, export_path, inprocess, extra);
}

int fy_trainutil_have_python(const char *what)
{
    if (system("python3 -c 'import json' 2>/dev/null") == 0)
        return 1;
    print_message("python3 missing: %s was not checked\n", what);
    return 0;
}

char *fy_trainutil_field_values(const char *metrics, const char *key)
{
    char *text = fy_test_slurp(metrics, NULL);
    assert_non_null(text);
    char *out = calloc(1, strlen(text) + 1);
    for (char *p = text; (p = strstr(p, key)) != NULL; p++) {
        size_t len = strcspn(p, ",}");
        strncat(out, p, len);
        strcat(out, "\n");
    }
    free(text);
    return out;
}

char *fy_trainutil_losses(const char *metrics)
{
    return fy_trainutil_field_values(metrics, "\"loss\": ");
}

int fy_trainutil_field_numbers(const char *metrics, const char *key, double *out, int max)
{
    char *text = fy_test_slurp(metrics, NULL);
    assert_non_null(text);
    int n = 0;
    for (char *p = text; n < max && (p = strstr(p, key)) != NULL; p++)
        out[n++] = strtod(p + strlen(key), NULL);
    free(text);
    return n;
}

double fy_trainutil_last_eval_loss(const char *metrics)
{
    char *text = fy_test_slurp(metrics, NULL);
    assert_non_null(text);
    char *last = NULL;
    for (char *p = text; (p = strstr(p, "\"eval_loss\": ")) != NULL; p++)
        last = p;
    assert_non_null(last);
    double v = strtod(last + strlen("\"eval_loss\": "), NULL);
    free(text);
    return v;
}

void fy_trainutil_same_bits_add(struct fy_trainutil_same_bits *group, char *w, size_t n, char *l)
{
    if (group->weights == NULL) {
        group->weights = w;
        group->losses = l;
        group->n = n;
        return;
    }
    assert_string_equal(l, group->losses);
    assert_int_equal(n, group->n);
    assert_memory_equal(w, group->weights, n);
    free(w);
    free(l);
}

void fy_trainutil_same_bits_free(struct fy_trainutil_same_bits *group)
{
    free(group->weights);
    free(group->losses);
}
