/* Integration tests of GPT training through the real processes on the CPU backend: a run with the
 * SSD store is bit-identical to the same schedule in one process with everything in memory; the
 * held-out loss falls well below ln(256) on the bundled sample text; export; and bad inputs are
 * refused with one line that names the file, a non-zero exit, and nothing overwritten. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/ckpt.h"
#include "common/model.h"
#include "common/tokfile.h"
#include "tests/testutil.h"

/* A snapshot of the project's own docs and sources, fixed so the loss bound below stays valid. */
#define SAMPLE_TEXT "tests/fixtures/sample.txt"

struct fixture {
    char *dir;
    char data[512];
    char log[512];
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    f->dir = fy_test_tmpdir("train");
    assert_non_null(f->dir);
    snprintf(f->data, sizeof f->data, "%s/sample.tok", f->dir);
    snprintf(f->log, sizeof f->log, "%s/log", f->dir);
    const char *args[] = {"prepare", "--out", f->data, SAMPLE_TEXT, NULL};
    int status = fy_test_run("fuyou-launch", args, f->log, 30);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    fy_test_rmdir(f->dir);
    free(f->dir);
    free(f);
    return 0;
}

static char *path_in(struct fixture *f, const char *name)
{
    static char bufs[8][600];
    static int next;
    char *p = bufs[next++ % 8];
    snprintf(p, 600, "%s/%s", f->dir, name);
    return p;
}

/* Runs fuyou-launch with a fresh log; returns the exit code (-1 if it did not exit normally). */
static int launch(struct fixture *f, const char *const *args, int seconds)
{
    unlink(f->log);
    int status = fy_test_run("fuyou-launch", args, f->log, seconds);
    if (status == -1 || !WIFEXITED(status)) {
        fy_test_file_contains(f->log, "(exit)");
        return -1;
    }
    return WEXITSTATUS(status);
}

static void init_model(struct fixture *f, const char *run, const char *embd, const char *seed)
{
    const char *args[] = {"init", "--run-dir", run, "--layers", "2", "--heads", "2", "--embd", embd,
                          "--ctx", "32", "--seed", seed, NULL};
    assert_int_equal(launch(f, args, 60), 0);
}

static int train(struct fixture *f, const char *run, const char *data, const char *steps,
                 const char *export_path, int inprocess, const char *extra_flag, const char *extra_value)
{
    const char *args[40];
    int n = 0;
    const char *base[] = {"train", "--run-dir", run, "--data", data, "--steps", steps, "--batch", "8",
                          "--seq", "32", "--lr", "3e-3", "--warmup", "20", "--eval-every", "100",
                          "--eval-batches", "8", "--backend", "cpu"};
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        args[n++] = base[i];
    if (export_path) {
        args[n++] = "--export";
        args[n++] = export_path;
    }
    if (inprocess)
        args[n++] = "--inprocess";
    if (extra_flag) {
        args[n++] = extra_flag;
        if (extra_value)
            args[n++] = extra_value;
    }
    args[n] = NULL;
    return launch(f, args, 300);
}

/* The "loss" values of a metrics file, as text, one per line. */
static char *losses(const char *metrics)
{
    char *text = fy_test_slurp(metrics, NULL);
    assert_non_null(text);
    char *out = calloc(1, strlen(text) + 1);
    for (char *p = text; (p = strstr(p, "\"loss\": ")) != NULL; p++) {
        char *end = strchr(p, ',');
        strncat(out, p, (size_t)(end - p));
        strcat(out, "\n");
    }
    free(text);
    return out;
}

static double last_eval_loss(const char *metrics)
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

static void test_store_run_matches_inprocess(void **state)
{
    struct fixture *f = *state;
    char *a = path_in(f, "a"), *b = path_in(f, "b"), *serial = path_in(f, "c");
    init_model(f, a, "32", "5");
    init_model(f, b, "32", "5");
    init_model(f, serial, "32", "5");
    /* a: the overlapped schedule (the default); b: in one process; serial: the serial schedule */
    assert_int_equal(train(f, a, f->data, "10", path_in(f, "a.fywt"), 0, NULL, NULL), 0);
    assert_int_equal(train(f, b, f->data, "10", path_in(f, "b.fywt"), 1, NULL, NULL), 0);
    assert_int_equal(train(f, serial, f->data, "10", path_in(f, "c.fywt"), 0, "--schedule", "serial"), 0);
    char ma[600], mb[600];
    snprintf(ma, sizeof ma, "%s/metrics.jsonl", a);
    snprintf(mb, sizeof mb, "%s/metrics.jsonl", b);
    char mc[600];
    snprintf(mc, sizeof mc, "%s/metrics.jsonl", serial);
    char *la = losses(ma), *lb = losses(mb), *lc = losses(mc);
    assert_int_equal(strlen(la) > 0, 1);
    assert_string_equal(la, lb); /* all 10 losses, every printed digit */
    assert_string_equal(la, lc);
    size_t na, nb, nc;
    char *wa = fy_test_slurp(path_in(f, "a.fywt"), &na), *wb = fy_test_slurp(path_in(f, "b.fywt"), &nb);
    char *wc = fy_test_slurp(path_in(f, "c.fywt"), &nc);
    assert_non_null(wa);
    assert_non_null(wb);
    assert_non_null(wc);
    assert_int_equal(na, nb);
    assert_memory_equal(wa, wb, na);
    assert_int_equal(na, nc);
    assert_memory_equal(wa, wc, na);
    free(lc);
    free(wc);
    /* and the export is a readable weights file of the trained model at step 10 */
    struct fy_gpt_config c;
    uint64_t step;
    float *params = NULL;
    assert_int_equal(fy_weights_read(path_in(f, "a.fywt"), &c, &step, &params), 0);
    assert_int_equal(step, 10);
    assert_int_equal(c.n_embd, 32);
    assert_int_equal(c.n_layer, 2);
    float *init = malloc(fy_gpt_unit_params(&c, 1) * sizeof(float));
    fy_gpt_init_unit(&c, 1, 5, init);
    assert_memory_not_equal(params + fy_gpt_unit_params(&c, 0), init, fy_gpt_unit_params(&c, 1) * 4);
    free(init);
    free(params);
    free(la);
    free(lb);
    free(wa);
    free(wb);
}

/* --cpu-mem keeps as much optimizer state in the pool as fits: nothing, some or all of it resident
 * gives the same bits as streaming everything from the store. */
static void test_resident_state_matches_streaming(void **state)
{
    struct fixture *f = *state;
    const char *mems[3] = {NULL, "64M", "1G"}; /* 64M holds 3 of the 4 units (measured) */
    const char *names[3] = {"stream", "some", "all"};
    char *first = NULL;
    size_t first_n = 0;
    for (int i = 0; i < 3; i++) {
        char *run = path_in(f, names[i]), out[700];
        snprintf(out, sizeof out, "%s.fywt", run);
        const char *init[] = {"init", "--run-dir", run, "--layers", "2", "--heads", "4", "--embd",
                              "256", "--ctx", "32", "--seed", "3", NULL};
        assert_int_equal(launch(f, init, 60), 0);
        assert_int_equal(train(f, run, f->data, "6", out, 0, mems[i] ? "--cpu-mem" : NULL, mems[i]), 0);
        if (i == 1)
            assert_true(fy_test_file_contains(f->log, "optimizer state of 3 of 4 units"));
        if (i == 2)
            assert_true(fy_test_file_contains(f->log, "optimizer state of 4 of 4 units"));
        size_t n;
        char *w = fy_test_slurp(out, &n);
        assert_non_null(w);
        if (first == NULL) {
            first = w;
            first_n = n;
        } else {
            assert_int_equal(n, first_n);
            assert_memory_equal(w, first, n);
            free(w);
        }
    }
    free(first);
    /* a cap below what the streaming regions alone need is refused before any work, with numbers */
    char *small = path_in(f, "small");
    const char *init[] = {"init", "--run-dir", small, "--layers", "2", "--heads", "4", "--embd", "256",
                          "--ctx", "32", NULL};
    assert_int_equal(launch(f, init, 60), 0);
    assert_int_equal(train(f, small, f->data, "6", NULL, 0, "--cpu-mem", "30M"), 1);
    assert_true(fy_test_file_contains(f->log, "plan does not fit"));
    assert_true(fy_test_file_contains(f->log, "--cpu-mem is 30.0 MiB"));
}

/* --trace writes Chrome trace-event JSON with every worker's requests; metrics carry busy times. */
static void test_trace_and_busy_metrics(void **state)
{
    struct fixture *f = *state;
    char *run = path_in(f, "run");
    init_model(f, run, "32", "1");
    char *trace = path_in(f, "trace.json");
    assert_int_equal(train(f, run, f->data, "3", NULL, 0, "--trace", trace), 0);
    char *text = fy_test_slurp(trace, NULL);
    assert_non_null(text);
    assert_true(text[0] == '[');
    assert_non_null(strstr(text, "\"name\": \"gpt-block-bwd\""));
    assert_non_null(strstr(text, "\"name\": \"opt-adamw\""));
    assert_non_null(strstr(text, "\"name\": \"io-read\""));
    assert_non_null(strstr(text, "\"cat\": \"gpu worker\""));
    free(text);
    if (system("python3 -c 'import json' 2>/dev/null") == 0) { /* the whole file parses as JSON */
        char cmd[800];
        snprintf(cmd, sizeof cmd,
                 "python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
                 "sys.exit(0 if sum(1 for e in d if e.get(\"ph\")==\"X\" and e[\"dur\"]>0) > 30 else 1)' %s",
                 trace);
        assert_int_equal(system(cmd), 0);
    } else {
        print_message("python3 missing: the trace's JSON syntax was not checked\n");
    }
    char metrics[600];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run);
    assert_true(fy_test_file_contains(metrics, "\"busy_gpu_s\": "));
    assert_true(fy_test_file_contains(metrics, "\"busy_ssd_read_s\": "));
    assert_true(fy_test_file_contains(metrics, "\"gpu_idle\": "));
}

static void test_heldout_loss_falls(void **state)
{
    struct fixture *f = *state;
    char *run = path_in(f, "run");
    init_model(f, run, "32", "1");
    assert_int_equal(train(f, run, f->data, "200", NULL, 0, NULL, NULL), 0);
    char metrics[600];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run);
    double eval = last_eval_loss(metrics);
    print_message("held-out loss after 200 steps: %.4f (ln 256 = 5.545)\n", eval);
    /* Measured 2.752 on the CI machine kind (deterministic); 3.0 leaves margin for libm differences. */
    assert_true(eval < 3.0);
    /* continuing to 210 resumes from the store's step 200 */
    assert_int_equal(train(f, run, f->data, "210", NULL, 0, NULL, NULL), 0);
    assert_true(fy_test_file_contains(f->log, "starting at step 200"));
    assert_true(fy_test_file_contains(f->log, "step 210/210"));
}

/* Bytes of a file, for "nothing was overwritten" checks. */
static char *snapshot(const char *path, size_t *len)
{
    char *s = fy_test_slurp(path, len);
    assert_non_null(s);
    return s;
}

struct store_snap {
    char *data, *idx, *metrics;
    size_t ndata, nidx, nmetrics;
};

static void take(struct fixture *f, const char *run, struct store_snap *s)
{
    char p[700];
    snprintf(p, sizeof p, "%s/store/fuyou-store.data", run);
    s->data = snapshot(p, &s->ndata);
    snprintf(p, sizeof p, "%s/store/fuyou-store.idx", run);
    s->idx = snapshot(p, &s->nidx);
    snprintf(p, sizeof p, "%s/metrics.jsonl", run);
    s->metrics = fy_test_slurp(p, &s->nmetrics);
}

static void assert_unchanged(struct fixture *f, const char *run, struct store_snap *before)
{
    struct store_snap after;
    take(f, run, &after);
    assert_int_equal(before->ndata, after.ndata);
    assert_memory_equal(before->data, after.data, before->ndata);
    assert_int_equal(before->nidx, after.nidx);
    assert_memory_equal(before->idx, after.idx, before->nidx);
    assert_true((before->metrics == NULL) == (after.metrics == NULL));
    if (before->metrics)
        assert_int_equal(before->nmetrics, after.nmetrics);
    free(after.data);
    free(after.idx);
    free(after.metrics);
    free(before->data);
    free(before->idx);
    free(before->metrics);
}

/* One refused training: exit 1, one error line naming `name` and `problem`, the store untouched. */
static void refused(struct fixture *f, const char *run, const char *data, const char *name,
                    const char *problem, const char *flag, const char *value)
{
    struct store_snap before;
    take(f, run, &before);
    assert_int_equal(train(f, run, data, "5", NULL, 0, flag, value), 1);
    char *text = fy_test_slurp(f->log, NULL);
    assert_non_null(text);
    int errors = 0;
    for (char *p = text; (p = strstr(p, "] error: ")) != NULL; p++)
        errors++;
    free(text);
    assert_int_equal(errors, 1);
    assert_true(fy_test_file_contains(f->log, name));
    assert_true(fy_test_file_contains(f->log, problem));
    assert_unchanged(f, run, &before);
}

static void write_file(const char *path, const void *bytes, size_t len)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(bytes, 1, len, fp), len);
    fclose(fp);
}

static void test_bad_inputs_refused(void **state)
{
    struct fixture *f = *state;
    char *run = path_in(f, "run");
    init_model(f, run, "32", "1");

    /* a token file with a wrong magic */
    char *bad = path_in(f, "bad-magic.tok");
    size_t n;
    char *good = fy_test_slurp(f->data, &n);
    good[0] ^= 0x55;
    write_file(bad, good, n);
    refused(f, run, bad, bad, "not a Fuyou token file", NULL, NULL);

    /* a truncated token file */
    good[0] ^= 0x55;
    char *trunc = path_in(f, "truncated.tok");
    write_file(trunc, good, n / 2);
    refused(f, run, trunc, trunc, "truncated", NULL, NULL);
    free(good);

    /* tokens outside the model's vocabulary (a file made for a larger vocabulary) */
    uint32_t tokens[400];
    for (int i = 0; i < 400; i++)
        tokens[i] = (uint32_t)(i * 7 % 300);
    char *big = path_in(f, "vocab300.tok");
    assert_int_equal(fy_tokfile_write(big, tokens, 400, 300, 0), 0);
    refused(f, run, big, big, "vocabulary", NULL, NULL);

    /* a batch larger than the data */
    char *tiny = path_in(f, "tiny.tok");
    assert_int_equal(fy_tokfile_write(tiny, tokens, 30, 256, 0), 0);
    refused(f, run, tiny, tiny, "larger than", NULL, NULL);

    /* a store made for another model config */
    char *other = path_in(f, "other");
    init_model(f, other, "16", "1");
    char other_store[600];
    snprintf(other_store, sizeof other_store, "%s/store", other);
    refused(f, run, f->data, other_store, "made for another model", "--ssd", other_store);

    /* a missing SSD directory */
    char *missing = path_in(f, "no-such-ssd");
    refused(f, run, f->data, missing, "No such file or directory", "--ssd", missing);

    /* the run is still fine after all of that */
    assert_int_equal(train(f, run, f->data, "3", NULL, 0, NULL, NULL), 0);
}

static void test_export_and_init_refuse_overwrite(void **state)
{
    struct fixture *f = *state;
    char *run = path_in(f, "run");
    init_model(f, run, "32", "1");
    /* a second init of the same run directory is refused */
    const char *again[] = {"init", "--run-dir", run, NULL};
    assert_int_equal(launch(f, again, 60), 1);
    assert_true(fy_test_file_contains(f->log, "already has a model"));
    char *out = path_in(f, "w.fywt");
    const char *exp[] = {"export", "--run-dir", run, "--out", out, NULL};
    assert_int_equal(launch(f, exp, 60), 0);
    size_t n1;
    char *first = fy_test_slurp(out, &n1);
    assert_int_equal(launch(f, exp, 60), 1); /* exists: refused */
    assert_true(fy_test_file_contains(f->log, "exists"));
    size_t n2;
    char *second = fy_test_slurp(out, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(first, second, n1);
    /* the export of a fresh store holds the GPT-2 initialisation */
    struct fy_gpt_config c;
    uint64_t step;
    float *params = NULL;
    assert_int_equal(fy_weights_read(out, &c, &step, &params), 0);
    assert_int_equal(step, 0);
    float *init = malloc(fy_gpt_unit_params(&c, 0) * sizeof(float));
    fy_gpt_init_unit(&c, 0, 1, init);
    assert_memory_equal(params, init, fy_gpt_unit_params(&c, 0) * 4);
    free(init);
    free(params);
    free(first);
    free(second);
}

int main(void)
{
    signal(SIGCHLD, SIG_DFL);
    if (access(fy_test_bin("fuyou-launch"), X_OK) != 0 || access(SAMPLE_TEXT, R_OK) != 0) {
        fprintf(stderr, "test_train: run from the repository root after make\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_store_run_matches_inprocess, setup, teardown),
        cmocka_unit_test_setup_teardown(test_heldout_loss_falls, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trace_and_busy_metrics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resident_state_matches_streaming, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_inputs_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_export_and_init_refuse_overwrite, setup, teardown),
    };
    return cmocka_run_group_tests_name("train (integration)", tests, NULL, NULL);
}
