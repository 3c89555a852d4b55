/* Integration tests of Hugging Face GPT-2 import and export through fuyou-launch (init --from-hf,
 * export --to-hf) on the CPU backend, against transformers (tests/reference/hf_gpt2.py):
 *   - the loss of the first training step (computed before its update, on the imported weights)
 *     equals transformers' loss on the same batch within 1e-4, for F32 and BF16 checkpoints;
 *   - init then export, without training, gives the checkpoint back bit for bit, tensor by tensor
 *     (F32, BF16, a sharded checkpoint without the "transformer." prefix and with lm_head.weight
 *     and the mask buffers; F16 comes back as F32 of equal values);
 *   - after a few training steps, transformers loads the export and reproduces the held-out loss
 *     that train reported after its last update, i.e. on exactly the exported weights; the same
 *     for a run imported with --optim-state int8, whose import exports back bit for bit;
 *   - bad inputs (corrupt header, missing shard, shape mismatch with config.json, unsupported
 *     architecture, an untied LM head found while the store is being written) are refused with one
 *     error line naming the file and tensor or key, a non-zero exit and nothing left in the run
 *     directory (these need no Python: the checkpoints come from export --to-hf of a model made
 *     here); exports refuse a non-empty directory and replace only the model files with
 *     --overwrite;
 *   - init --overwrite builds the new model beside the previous one: an import that fails only
 *     while its data is read (an untied head), or a plain init whose store writes fail, leaves
 *     model.conf, RUN/hf and the store byte for byte as they were, and the run exports and trains
 *     as before; a successful one replaces the model (its export is the new checkpoint); neither
 *     leaves a staging directory or temporary file; staging left by a killed init is removed by
 *     the next one, and a run left without model.conf in the middle of a replacement is refused
 *     at its next use, saying so; the same for a store over two --ssd directories.
 * The transformers tests skip, saying so, where python3 lacks torch or transformers, except under CI
 * (CI=true), where .ci/run installs them and their absence is a failure. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/formats/safetensors.h"
#include "common/formats/stwriter.h"
#include "tests/refmodel.h"
#include "tests/testutil.h"

/* The loss tolerance of the issue: fp32 on both sides (measured: below 1e-6). */
#define LOSS_TOL 1e-4
#define BATCH "4"
#define SEQ "32"
#define EVAL_FRACTION "0.1"

static int have_transformers;
static int in_ci;
static char script[4096];

static int setup(void **state) { return fy_test_setup(state, "hf", NULL); }
static int teardown(void **state) { return fy_test_teardown(state); }


static void need_transformers(void)
{
    if (have_transformers)
        return;
    if (in_ci)
        fail_msg("python3 with torch and transformers is missing under CI: .ci/run installs them");
    printf("test_hf: skipped: python3 with torch and transformers is needed (pip install "
           "torch==2.5.1 transformers==5.17.0)\n");
    skip();
}

/* The reference script's commands in one Python process (fy_test_python_run); fails the test
 * when the script fails. */
static int python_run(const char *const *commands, double *losses, int max)
{
    int n = fy_test_python_run(script, commands, losses, max);
    assert_true(n >= 0);
    return n;
}

/* A command string for python_run, formatted. */
#define pycmd fy_test_fmt

#define LOSS_ARGS " --batch " BATCH " --seq " SEQ " --eval-fraction " EVAL_FRACTION " --seed 1"

static int init_hf(struct fy_test_fixture *f, const char *run, const char *src)
{
    const char *args[] = {"init", "--run-dir", run, "--from-hf", src, NULL};
    return fy_test_launch_in(f, args, 120);
}

static int export_hf(struct fy_test_fixture *f, const char *run, const char *out, const char *opt,
                     const char *value)
{
    const char *args[] = {"export", "--run-dir", run, "--to-hf", out, opt, value, NULL};
    return fy_test_launch_in(f, args, 120);
}

static int train(struct fy_test_fixture *f, const char *run, const char *steps)
{
    const char *args[] = {"train", "--run-dir", run, "--data", f->data, "--steps", steps,
                          "--batch", BATCH, "--seq", SEQ, "--eval-fraction", EVAL_FRACTION,
                          "--lr", "1e-3", "--warmup", "0", "--eval-batches", "2", "--seed", "1",
                          "--backend", "cpu", NULL};
    return fy_test_launch_in(f, args, 300);
}

/* A number after key on the metrics line of step `step`. */
static double metric(const char *run, int step, const char *key)
{
    char path[700], want[64];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    snprintf(want, sizeof want, "{\"step\": %d,", step);
    char *text = fy_test_slurp(path, NULL);
    assert_non_null(text);
    char *line = strstr(text, want);
    assert_non_null(line);
    char *end = strchr(line, '\n'), *at = strstr(line, key);
    if (at == NULL || (end != NULL && at > end))
        fail_msg("%s: step %d has no %s", path, step, key);
    double v = strtod(at + strlen(key), NULL);
    free(text);
    return v;
}

/* (a) The first step's loss, computed before its update, against transformers on that batch. */
static void test_loss_matches_transformers(void **state)
{
    need_transformers();
    struct fy_test_fixture *f = *state;
    const char *dtypes[] = {"f32", "bf16"};
    const char *make[] = {pycmd("tokens %s --vocab 300 --count 4096 --seed 3", f->data),
                          pycmd("make %s --dtype f32 --seed 11", fy_test_in(f, "src-f32")),
                          pycmd("make %s --dtype bf16 --seed 11", fy_test_in(f, "src-bf16")), NULL};
    python_run(make, NULL, 0);
    double ours[2];
    for (int k = 0; k < 2; k++) {
        char name[32], run[32];
        snprintf(name, sizeof name, "src-%s", dtypes[k]);
        snprintf(run, sizeof run, "run-%s", dtypes[k]);
        char *r = fy_test_in(f, run);
        assert_int_equal(init_hf(f, r, fy_test_in(f, name)), 0);
        assert_int_equal(train(f, r, "1"), 0);
        ours[k] = metric(r, 1, "\"loss\": ");
    }
    const char *loss[] = {
        pycmd("loss %s %s --train-step 1" LOSS_ARGS, fy_test_in(f, "src-f32"), f->data),
        pycmd("loss %s %s --train-step 1" LOSS_ARGS, fy_test_in(f, "src-bf16"), f->data), NULL};
    double theirs[2];
    assert_int_equal(python_run(loss, theirs, 2), 2);
    for (int k = 0; k < 2; k++) {
        printf("test_hf: %s: step 1 loss %.9f here, %.9f in transformers (difference %.2e)\n",
               dtypes[k], ours[k], theirs[k], fabs(ours[k] - theirs[k]));
        assert_true(fabs(ours[k] - theirs[k]) <= LOSS_TOL);
        /* not a comparison of two constants: a random model is near ln(300) = 5.70 */
        assert_true(ours[k] > 5.0 && ours[k] < 6.5);
    }
    /* the two checkpoints differ (bf16 rounding), and so do their losses */
    assert_true(ours[0] != ours[1]);
}

/* (b) init then export without training: the checkpoint back bit for bit. */
static void test_roundtrip_bit_exact(void **state)
{
    need_transformers();
    struct fy_test_fixture *f = *state;
    struct {
        const char *name;
        const char *make_opts;
        const char *compare_opts;
        const char *export_opt, *export_value;
    } v[] = {
        {"f32", "--dtype f32", "", NULL, NULL},
        {"bf16", "--dtype bf16", "", NULL, NULL},
        /* GPT2Model names (no prefix), lm_head.weight, the old mask buffers, written sharded */
        {"base", "--dtype bf16 --base --lm-head --buffers", "", "--max-shard-size", "100K"},
        {"sharded", "--dtype f32 --shard-size 200000", "", NULL, NULL},
        {"f16", "--dtype f16", "--f16-as-f32", NULL, NULL},
    };
    enum { N = sizeof v / sizeof v[0] };
    const char *make[N + 1], *compare[N + 1];
    for (size_t k = 0; k < N; k++) {
        char src[64];
        snprintf(src, sizeof src, "src-%s", v[k].name);
        make[k] = pycmd("make %s %s", fy_test_in(f, src), v[k].make_opts);
    }
    make[N] = NULL;
    python_run(make, NULL, 0);
    for (size_t k = 0; k < N; k++) {
        char src[64], run[64], out[64];
        snprintf(src, sizeof src, "src-%s", v[k].name);
        snprintf(run, sizeof run, "run-%s", v[k].name);
        snprintf(out, sizeof out, "out-%s", v[k].name);
        assert_int_equal(init_hf(f, fy_test_in(f, run), fy_test_in(f, src)), 0);
        assert_int_equal(export_hf(f, fy_test_in(f, run), fy_test_in(f, out), v[k].export_opt,
                                   v[k].export_value),
                         0);
        if (strcmp(v[k].name, "f16") == 0)
            assert_true(fy_test_file_contains(f->log, "F16 tensors are written as F32"));
        compare[k] = pycmd("compare %s %s %s", fy_test_in(f, src), fy_test_in(f, out),
                           v[k].compare_opts);
    }
    compare[N] = NULL;
    python_run(compare, NULL, 0);
    /* the sharded export really is sharded, with its index */
    char p[700];
    snprintf(p, sizeof p, "%s/%s", fy_test_in(f, "out-base"), FY_ST_INDEX_NAME);
    assert_int_equal(access(p, F_OK), 0);
}

/* (c) Train, export; transformers reproduces the held-out loss train reported after its last
 * update, which is on exactly the weights the export holds (F32; and a BF16 checkpoint exported as
 * F32, since bf16 rounding would change the weights the loss was computed on). */
static void test_trained_export_reproduces_loss(void **state)
{
    need_transformers();
    struct fy_test_fixture *f = *state;
    const char *dtypes[] = {"f32", "bf16"};
    const char *make[] = {pycmd("tokens %s --vocab 300 --count 4096 --seed 3", f->data),
                          pycmd("make %s --dtype f32 --seed 12", fy_test_in(f, "src-f32")),
                          pycmd("make %s --dtype bf16 --seed 12", fy_test_in(f, "src-bf16")), NULL};
    python_run(make, NULL, 0);
    double ours[2];
    for (int k = 0; k < 2; k++) {
        char name[32], run[32], out[32];
        snprintf(name, sizeof name, "src-%s", dtypes[k]);
        snprintf(run, sizeof run, "run-%s", dtypes[k]);
        snprintf(out, sizeof out, "out-%s", dtypes[k]);
        char *r = fy_test_in(f, run);
        assert_int_equal(init_hf(f, r, fy_test_in(f, name)), 0);
        assert_int_equal(train(f, r, "3"), 0);
        ours[k] = metric(r, 3, "\"eval_loss\": ");
        assert_int_equal(export_hf(f, r, fy_test_in(f, out), k == 1 ? "--dtype" : NULL, "f32"), 0);
        assert_true(fy_test_file_contains(f->log, "exported step 3"));
    }
    const char *cmds[] = {
        pycmd("loss %s %s --eval-batches 2" LOSS_ARGS, fy_test_in(f, "out-f32"), f->data),
        pycmd("loss %s %s --eval-batches 2" LOSS_ARGS, fy_test_in(f, "out-bf16"), f->data),
        pycmd("loss %s %s --eval-batches 2" LOSS_ARGS, fy_test_in(f, "src-f32"), f->data),
        pycmd("loss %s %s --eval-batches 2" LOSS_ARGS, fy_test_in(f, "src-bf16"), f->data),
        /* the export holds the trained weights, not the imported ones */
        pycmd("compare %s %s --expect-different", fy_test_in(f, "src-f32"),
              fy_test_in(f, "out-f32")),
        NULL};
    double theirs[4];
    assert_int_equal(python_run(cmds, theirs, 4), 4);
    for (int k = 0; k < 2; k++) {
        printf("test_hf: %s: held-out loss after step 3 %.9f here, %.9f in transformers on the "
               "export (difference %.2e); the imported model's: %.9f\n",
               dtypes[k], ours[k], theirs[k], fabs(ours[k] - theirs[k]), theirs[2 + k]);
        assert_true(fabs(ours[k] - theirs[k]) <= LOSS_TOL);
        assert_true(fabs(theirs[2 + k] - theirs[k]) > 10 * LOSS_TOL);
    }
}

/* init --from-hf --optim-state int8 --state-piece 16K: the import records the format and the
 * piece (model.conf), exports the checkpoint back bit for bit before training, trains 3 steps with
 * 8-bit moments, and its export loads in transformers, which reproduces the held-out loss train
 * reported after step 3. */
static void test_int8_import_trains_and_exports(void **state)
{
    need_transformers();
    struct fy_test_fixture *f = *state;
    char *src = strdup(fy_test_in(f, "src")), *run = strdup(fy_test_in(f, "run-int8"));
    char *fresh = strdup(fy_test_in(f, "fresh")), *out = strdup(fy_test_in(f, "out"));
    const char *make[] = {pycmd("tokens %s --vocab 300 --count 4096 --seed 3", f->data),
                          pycmd("make %s --dtype f32 --seed 12", src), NULL};
    python_run(make, NULL, 0);
    /* in pieces of 16 KiB (init --state-piece): each unit written piece by piece from its
     * weights read whole, and exported by putting its masters together again */
    const char *init[] = {"init", "--run-dir",     run,   "--from-hf", src, "--optim-state",
                          "int8", "--state-piece", "16K", NULL};
    assert_int_equal(fy_test_launch_in(f, init, 120), 0);
    assert_true(fy_test_file_contains(fy_test_fmt("%s/model.conf", run), "model.optim_state = int8"));
    assert_true(
        fy_test_file_contains(fy_test_fmt("%s/model.conf", run), "model.state_piece = 16384"));
    assert_int_equal(export_hf(f, run, fresh, NULL, NULL), 0);
    assert_int_equal(train(f, run, "3"), 0);
    double ours = metric(run, 3, "\"eval_loss\": ");
    assert_int_equal(export_hf(f, run, out, NULL, NULL), 0);
    assert_true(fy_test_file_contains(f->log, "exported step 3"));
    const char *cmds[] = {pycmd("compare %s %s", src, fresh),
                          pycmd("compare %s %s --expect-different", src, out),
                          pycmd("loss %s %s --eval-batches 2" LOSS_ARGS, out, f->data), NULL};
    double theirs;
    assert_int_equal(python_run(cmds, &theirs, 1), 1);
    printf("test_hf: int8 optimizer state: held-out loss after step 3 %.9f here, %.9f in "
           "transformers on the export (difference %.2e)\n", ours, theirs, fabs(ours - theirs));
    assert_true(fabs(ours - theirs) <= LOSS_TOL);
    free(src);
    free(run);
    free(fresh);
    free(out);
}

/* ---- bad inputs (no Python needed) ---- */

/* Error lines in the last log; the log must also contain each of want (NULL-terminated). */
static void expect_one_error(struct fy_test_fixture *f, const char *const *want)
{
    char *text = fy_test_slurp(f->log, NULL);
    assert_non_null(text);
    int errors = 0;
    for (char *p = text; (p = strstr(p, "] error: ")) != NULL; p++)
        errors++;
    if (errors != 1)
        fail_msg("expected one error line, got %d: %s", errors, text);
    free(text);
    for (int i = 0; want[i] != NULL; i++)
        assert_true(fy_test_file_contains(f->log, want[i]));
}

/* The run directory holds no model: nothing but the log (and what a session leaves: its lock,
 * run.conf), no model.conf, no hf record, no store files. */
static void expect_no_model(const char *run)
{
    DIR *d = opendir(run);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (strcmp(n, ".") == 0 || strcmp(n, "..") == 0 || strcmp(n, "fuyou.log") == 0 ||
            strcmp(n, "launch.lock") == 0 || strcmp(n, "run.conf") == 0 || strcmp(n, "ipc") == 0)
            continue;
        fail_msg("%s holds %s after a refused import", run, n);
    }
    closedir(d);
}

static void refused_init(struct fy_test_fixture *f, const char *run, const char *src,
                         const char *const *want)
{
    assert_int_equal(init_hf(f, run, src), 1);
    expect_one_error(f, want);
    expect_no_model(run);
}

/* Copies src's files into a new directory dst. */
static void copy_dir(const char *src, const char *dst)
{
    assert_int_equal(mkdir(dst, 0755), 0);
    DIR *d = opendir(src);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char a[700], b[700];
        snprintf(a, sizeof a, "%s/%s", src, e->d_name);
        snprintf(b, sizeof b, "%s/%s", dst, e->d_name);
        size_t len;
        char *bytes = fy_test_slurp(a, &len);
        assert_non_null(bytes);
        FILE *fp = fopen(b, "wb");
        assert_non_null(fp);
        assert_int_equal(fwrite(bytes, 1, len, fp), len);
        assert_int_equal(fclose(fp), 0);
        free(bytes);
    }
    closedir(d);
}

/* Replaces the first occurrence of `from` in a text file by `to`. */
static void edit(const char *path, const char *from, const char *to)
{
    char *text = fy_test_slurp(path, NULL);
    assert_non_null(text);
    char *at = strstr(text, from);
    assert_non_null(at);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fprintf(fp, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    assert_int_equal(fclose(fp), 0);
    free(text);
}

/* A copy of the checkpoint in src with lm_head.weight = wte.weight, one element changed. */
static void add_untied_head(const char *src, const char *dst)
{
    assert_int_equal(mkdir(dst, 0755), 0);
    char p[700];
    snprintf(p, sizeof p, "%s/config.json", src);
    char *cfg = fy_test_slurp(p, NULL);
    assert_non_null(cfg);
    snprintf(p, sizeof p, "%s/config.json", dst);
    FILE *fp = fopen(p, "w");
    assert_non_null(fp);
    fputs(cfg, fp);
    assert_int_equal(fclose(fp), 0);
    free(cfg);
    struct fy_st_reader *r = NULL;
    assert_int_equal(fy_st_open(&r, src), 0);
    struct fy_st_writer *w = NULL;
    snprintf(p, sizeof p, "%s/model.safetensors", dst);
    assert_int_equal(fy_st_writer_new(&w, p, 0), 0);
    assert_int_equal(fy_st_writer_metadata(w, "format", "pt"), 0);
    for (size_t i = 0; i < fy_st_count(r); i++) {
        const struct fy_st_tensor *t = fy_st_tensor_at(r, i);
        assert_int_equal(fy_st_writer_declare(w, t->name, FY_ST_F32, t->ndim, t->shape), 0);
    }
    const struct fy_st_tensor *wte = fy_st_find(r, "transformer.wte.weight");
    assert_non_null(wte);
    assert_int_equal(fy_st_writer_declare(w, "lm_head.weight", FY_ST_F32, 2, wte->shape), 0);
    for (size_t i = 0; i < fy_st_count(r); i++) {
        const struct fy_st_tensor *t = fy_st_tensor_at(r, i);
        float *v = malloc(t->numel * sizeof *v);
        assert_non_null(v);
        assert_int_equal(fy_st_read_f32(r, t, v, t->numel), 0);
        assert_int_equal(fy_st_writer_put_f32(w, t->name, v, t->numel), 0);
        if (t == wte) {
            v[5] += 1.0f;
            assert_int_equal(fy_st_writer_put_f32(w, "lm_head.weight", v, t->numel), 0);
        }
        free(v);
    }
    assert_int_equal(fy_st_writer_finish(&w), 0);
    fy_st_destroy(&r);
}

static int count_entries(const char *dir)
{
    int n = fy_test_count_entries(dir);
    assert_true(n >= 0);
    return n;
}

static void test_bad_inputs_refused(void **state)
{
    struct fy_test_fixture *f = *state;
    /* A valid checkpoint made without Python: a model made here, exported (sharded too). */
    char *made = fy_test_in(f, "made");
    const char *init[] = {"init", "--run-dir", made, "--layers", "2", "--heads", "2", "--embd", "32",
                          "--vocab", "300", "--ctx", "32", NULL};
    assert_int_equal(fy_test_launch_in(f, init, 60), 0);
    char *good = fy_test_in(f, "good"), *shards = fy_test_in(f, "shards");
    assert_int_equal(export_hf(f, made, good, NULL, NULL), 0);
    assert_int_equal(export_hf(f, made, shards, "--max-shard-size", "20K"), 0);
    assert_true(count_entries(shards) > 3);
    /* the good one imports */
    char *ok = strdup(fy_test_in(f, "ok"));
    assert_int_equal(init_hf(f, ok, good), 0);
    /* and refuses --inprocess, which would start from a seeded random model instead */
    const char *prep[] = {"prepare", "--out", f->data, "tests/fixtures/sample.txt", NULL};
    assert_int_equal(fy_test_launch_in(f, prep, 60), 0);
    const char *inproc[] = {"train", "--run-dir", ok, "--data", f->data, "--steps", "1",
                            "--batch", "2", "--seq", "16", "--backend", "cpu", "--inprocess", NULL};
    assert_int_equal(fy_test_launch_in(f, inproc, 60), 2);
    assert_true(fy_test_file_contains(f->log, "drop --inprocess"));
    free(ok);
    char p[700];

    /* dropout in config.json: imported, and said (training here has none) */
    assert_false(fy_test_file_contains(f->log, "runs without dropout"));
    char *dropout = fy_test_in(f, "dropout");
    copy_dir(good, dropout);
    snprintf(p, sizeof p, "%s/config.json", dropout);
    edit(p, "\"resid_pdrop\": 0.0", "\"resid_pdrop\": 0.1");
    edit(p, "\"attn_pdrop\": 0.0", "\"attn_pdrop\": 0.05");
    assert_int_equal(init_hf(f, fy_test_in(f, "with-dropout"), dropout), 0);
    assert_true(fy_test_file_contains(f->log, fy_test_fmt("%s: \"resid_pdrop\" 0.1, \"attn_pdrop\" "
                                                          "0.05: training here runs without "
                                                          "dropout", p)));

    /* corrupt header: the JSON's opening brace overwritten */
    char *corrupt = fy_test_in(f, "corrupt");
    copy_dir(good, corrupt);
    snprintf(p, sizeof p, "%s/model.safetensors", corrupt);
    FILE *fp = fopen(p, "r+b");
    assert_non_null(fp);
    assert_int_equal(fseek(fp, 8, SEEK_SET), 0);
    assert_int_equal(fputc('#', fp), '#');
    assert_int_equal(fclose(fp), 0);
    const char *w1[] = {p, "JSON", NULL};
    refused_init(f, fy_test_in(f, "r1"), corrupt, w1);

    /* missing shard */
    char *missing = fy_test_in(f, "missing");
    copy_dir(shards, missing);
    snprintf(p, sizeof p, "%s/model-00002-of-%05d.safetensors", missing, count_entries(missing) - 2);
    assert_int_equal(unlink(p), 0);
    const char *w2[] = {"model-00002-of-", "missing", "transformer.", NULL};
    refused_init(f, fy_test_in(f, "r2"), missing, w2);

    /* shape mismatch with config.json */
    char *shape = fy_test_in(f, "shape");
    copy_dir(good, shape);
    snprintf(p, sizeof p, "%s/config.json", shape);
    edit(p, "\"n_positions\": 32", "\"n_positions\": 64");
    const char *w3[] = {"transformer.wpe.weight", "[32, 32]", "[64, 32]", "config.json", NULL};
    refused_init(f, fy_test_in(f, "r3"), shape, w3);

    /* unsupported architecture */
    char *llama = fy_test_in(f, "llama");
    copy_dir(good, llama);
    snprintf(p, sizeof p, "%s/config.json", llama);
    edit(p, "\"GPT2LMHeadModel\"", "\"LlamaForCausalLM\"");
    edit(p, "\"gpt2\"", "\"llama\"");
    const char *w4[] = {p, "LlamaForCausalLM", "not supported", NULL};
    refused_init(f, fy_test_in(f, "r4"), llama, w4);

    /* an untied head, found only when unit 0 is read: the store was being written, and is
     * removed with everything else of the import */
    char *untied = fy_test_in(f, "untied");
    add_untied_head(good, untied);
    const char *w5[] = {"lm_head.weight", "untied", NULL};
    refused_init(f, fy_test_in(f, "r5"), untied, w5);
    assert_true(fy_test_file_contains(f->log, "partly written files were removed"));

    /* the model comes from config.json: model options are refused, not ignored */
    const char *layers[] = {"init", "--run-dir", fy_test_in(f, "r6"), "--from-hf", good,
                            "--layers", "3", NULL};
    assert_int_equal(fy_test_launch_in(f, layers, 30), 2);
    const char *w6[] = {"drop --layers", NULL};
    expect_one_error(f, w6);
    expect_no_model(fy_test_in(f, "r6"));

    /* a run that has a model is not replaced without --overwrite */
    assert_int_equal(init_hf(f, fy_test_in(f, "ok"), good), 1);
    assert_true(fy_test_file_contains(f->log, "--overwrite"));
}

/* A directory's plain files, sorted by name, as one buffer (name, size, bytes of each); *len its
 * length. Subdirectories are listed by name only. */
static char *snapshot(const char *dir, size_t *len)
{
    struct dirent **names;
    int n = scandir(dir, &names, NULL, alphasort);
    assert_true(n >= 0);
    char *buf = NULL;
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        char p[700];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]->d_name);
        struct stat st;
        assert_int_equal(lstat(p, &st), 0);
        size_t flen = 0;
        char *bytes = S_ISREG(st.st_mode) ? fy_test_slurp(p, &flen) : NULL;
        assert_true(bytes != NULL || !S_ISREG(st.st_mode));
        size_t head = strlen(names[i]->d_name) + 32;
        buf = realloc(buf, used + head + flen);
        assert_non_null(buf);
        used += (size_t)snprintf(buf + used, head, "%s %zu\n", names[i]->d_name, flen);
        if (flen > 0)
            memcpy(buf + used, bytes, flen);
        used += flen;
        free(bytes);
        free(names[i]);
    }
    free(names);
    *len = used;
    return buf;
}

/* What a run's model is made of, byte for byte: model.conf, RUN/hf's files, the store's files. */
struct model_bytes {
    char *conf, *hf, *store;
    size_t conf_len, hf_len, store_len;
};

static struct model_bytes model_bytes(const char *run)
{
    struct model_bytes m;
    char p[700];
    snprintf(p, sizeof p, "%s/model.conf", run);
    m.conf = fy_test_slurp(p, &m.conf_len);
    assert_non_null(m.conf);
    snprintf(p, sizeof p, "%s/hf", run);
    m.hf = snapshot(p, &m.hf_len);
    snprintf(p, sizeof p, "%s/store", run);
    m.store = snapshot(p, &m.store_len);
    return m;
}

static void free_model_bytes(struct model_bytes *m)
{
    free(m->conf);
    free(m->hf);
    free(m->store);
}

static void assert_same_bytes(const char *what, const char *a, size_t alen, const char *b,
                              size_t blen)
{
    if (alen != blen || memcmp(a, b, alen) != 0)
        fail_msg("%s changed (%zu bytes before, %zu after)", what, alen, blen);
}

static void assert_model_unchanged(const char *run, const struct model_bytes *before)
{
    struct model_bytes now = model_bytes(run);
    assert_same_bytes("model.conf", before->conf, before->conf_len, now.conf, now.conf_len);
    assert_same_bytes("RUN/hf", before->hf, before->hf_len, now.hf, now.hf_len);
    assert_same_bytes("the store", before->store, before->store_len, now.store, now.store_len);
    free_model_bytes(&now);
}

/* Nothing staged or temporary left in the run directory or its store. */
static void assert_no_staging(const char *run)
{
    const char *dirs[] = {run, fy_test_path(run, "store")};
    for (int k = 0; k < 2; k++) {
        DIR *d = opendir(dirs[k]);
        assert_non_null(d);
        struct dirent *e;
        while ((e = readdir(d)) != NULL)
            if (strstr(e->d_name, ".new-") != NULL || strstr(e->d_name, ".tmp") != NULL ||
                strstr(e->d_name, ".old") != NULL)
                fail_msg("%s/%s is left", dirs[k], e->d_name);
        closedir(d);
    }
    assert_int_equal(count_entries(fy_test_path(run, "store")), 2); /* data and index */
}

/* Two safetensors directories hold the same tensors: names, shapes and f32 values. */
static void assert_same_tensors(const char *a_dir, const char *b_dir)
{
    struct fy_st_reader *a = NULL, *b = NULL;
    assert_int_equal(fy_st_open(&a, a_dir), 0);
    assert_int_equal(fy_st_open(&b, b_dir), 0);
    assert_int_equal(fy_st_count(a), fy_st_count(b));
    for (size_t i = 0; i < fy_st_count(a); i++) {
        const struct fy_st_tensor *t = fy_st_tensor_at(a, i), *u = fy_st_find(b, t->name);
        if (u == NULL)
            fail_msg("%s has no tensor %s", b_dir, t->name);
        assert_int_equal(t->numel, u->numel);
        float *x = malloc(t->numel * sizeof *x), *y = malloc(t->numel * sizeof *y);
        assert_true(x != NULL && y != NULL);
        assert_int_equal(fy_st_read_f32(a, t, x, t->numel), 0);
        assert_int_equal(fy_st_read_f32(b, u, y, u->numel), 0);
        if (memcmp(x, y, t->numel * sizeof *x) != 0)
            fail_msg("tensor %s differs between %s and %s", t->name, a_dir, b_dir);
        free(x);
        free(y);
    }
    fy_st_destroy(&a);
    fy_st_destroy(&b);
}

static int export_out(struct fy_test_fixture *f, const char *run, const char *out)
{
    const char *args[] = {"export", "--run-dir", run, "--out", out, NULL};
    return fy_test_launch_in(f, args, 120);
}

/* A pid that no process has: a child's, once it has exited and been reaped. */
static long dead_pid(void)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(0);
    assert_int_equal(waitpid(pid, NULL, 0), pid);
    return (long)pid;
}

static void test_overwrite_builds_beside(void **state)
{
    struct fy_test_fixture *f = *state;
    /* two valid checkpoints made here (no Python), and the second with an untied head */
    char *good[2], p[700];
    for (int k = 0; k < 2; k++) {
        char made[32], seed[8], name[32];
        snprintf(made, sizeof made, "made%d", k);
        snprintf(seed, sizeof seed, "%d", k + 1);
        snprintf(name, sizeof name, "good%d", k);
        const char *init[] = {"init", "--run-dir", fy_test_in(f, made), "--layers", "2",
                              "--heads", "2", "--embd", "32", "--vocab", "300", "--ctx", "32",
                              "--seed", seed, NULL};
        assert_int_equal(fy_test_launch_in(f, init, 60), 0);
        good[k] = strdup(fy_test_in(f, name));
        assert_int_equal(export_hf(f, fy_test_in(f, made), good[k], NULL, NULL), 0);
    }
    char *untied = strdup(fy_test_in(f, "untied"));
    add_untied_head(good[1], untied);
    const char *prep[] = {"prepare", "--out", f->data, "tests/fixtures/sample.txt", NULL};
    assert_int_equal(fy_test_launch_in(f, prep, 60), 0);

    /* a run imported from the first, trained two steps, exported */
    char *run = strdup(fy_test_in(f, "run"));
    char *before = strdup(fy_test_in(f, "before.fywt")), *after = strdup(fy_test_in(f, "after.fywt"));
    assert_int_equal(init_hf(f, run, good[0]), 0);
    assert_int_equal(train(f, run, "2"), 0);
    assert_int_equal(export_out(f, run, before), 0);
    struct model_bytes was = model_bytes(run);

    /* the import fails only while unit 0 is read: the previous model stays as it was */
    const char *bad[] = {"init", "--run-dir", run, "--from-hf", untied, "--overwrite", NULL};
    assert_int_equal(fy_test_launch_in(f, bad, 120), 1);
    assert_model_unchanged(run, &was);
    assert_no_staging(run);
    const char *w1[] = {"lm_head.weight", "untied",
                        fy_test_fmt("the previous model of %s is intact", run), NULL};
    expect_one_error(f, w1);
    assert_int_equal(export_out(f, run, after), 0);
    size_t blen, alen;
    char *b = fy_test_slurp(before, &blen), *a = fy_test_slurp(after, &alen);
    assert_true(a != NULL && b != NULL);
    assert_same_bytes("the export", b, blen, a, alen);
    free(a);
    free(b);

    /* a plain init whose store writes fail (a full disk, by the io worker's test hook) too */
    const char *plain[] = {"init", "--run-dir", run, "--layers", "2", "--heads", "2", "--embd",
                           "32", "--vocab", "300", "--ctx", "32", "--overwrite", NULL};
    setenv("FUYOU_TEST_IO_ENOSPC_AFTER", "2", 1);
    int rc = fy_test_launch_in(f, plain, 120);
    unsetenv("FUYOU_TEST_IO_ENOSPC_AFTER");
    assert_int_equal(rc, 1);
    assert_model_unchanged(run, &was);
    assert_no_staging(run);
    assert_true(fy_test_file_contains(f->log, "No space left on device"));
    assert_true(fy_test_file_contains(f->log, fy_test_fmt("the previous model of %s is intact", run)));
    free_model_bytes(&was);
    /* and the run still trains */
    assert_int_equal(train(f, run, "3"), 0);

    /* staging left by an init that was killed, and a replacement it stopped in the middle of:
     * model.conf moved aside. The run is refused at its next use, saying why */
    long pid = dead_pid();
    char stage[700], store_stage[700];
    snprintf(stage, sizeof stage, "%s/init.new-%ld", run, pid);
    snprintf(store_stage, sizeof store_stage, "%s/store/fuyou-store.new-%ld", run, pid);
    assert_int_equal(mkdir(stage, 0700), 0);
    assert_int_equal(mkdir(store_stage, 0700), 0);
    snprintf(p, sizeof p, "%s/%s", store_stage, "fuyou-store.data");
    FILE *fp = fopen(p, "w");
    assert_non_null(fp);
    assert_int_equal(fclose(fp), 0);
    char conf[700], old[760];
    snprintf(conf, sizeof conf, "%s/model.conf", run);
    snprintf(old, sizeof old, "%s/model.conf.old", stage);
    assert_int_equal(rename(conf, old), 0);
    assert_int_equal(train(f, run, "4"), 1);
    const char *w2[] = {fy_test_fmt("init --overwrite (pid %ld) stopped while it replaced the "
                                    "previous model", pid),
                        NULL};
    expect_one_error(f, w2);

    /* a successful import replaces the model: its export is the new checkpoint */
    assert_int_equal(init_hf(f, run, good[1]), 1); /* a store is there: --overwrite needed */
    assert_true(fy_test_file_contains(f->log, "already holds a Fuyou store"));
    const char *ok[] = {"init", "--run-dir", run, "--from-hf", good[1], "--overwrite", NULL};
    char args_path[700], metrics_path[700];
    snprintf(args_path, sizeof args_path, "%s/train.args", run);
    snprintf(metrics_path, sizeof metrics_path, "%s/metrics.jsonl", run);
    assert_int_equal(access(args_path, F_OK), 0); /* the previous model's training left them */
    assert_int_equal(access(metrics_path, F_OK), 0);
    assert_int_equal(fy_test_launch_in(f, ok, 120), 0);
    /* and they went with it: resume would train the new model with the old command */
    assert_int_not_equal(access(args_path, F_OK), 0);
    assert_int_not_equal(access(metrics_path, F_OK), 0);
    assert_true(fy_test_file_contains(f->log, "train.args and metrics.jsonl went with it"));
    assert_true(fy_test_file_contains(f->log, fy_test_fmt("removed %s, left by an init (pid %ld) "
                                                          "that did not finish", stage, pid)));
    assert_true(fy_test_file_contains(f->log, fy_test_fmt("removed %s, left by an init (pid %ld) "
                                                          "that did not finish", store_stage, pid)));
    assert_no_staging(run);
    char *out = strdup(fy_test_in(f, "out"));
    assert_int_equal(export_hf(f, run, out, NULL, NULL), 0);
    assert_true(fy_test_file_contains(f->log, "exported step 0"));
    assert_same_tensors(good[1], out);
    snprintf(p, sizeof p, "%s/hf/config.json", run);
    char *have = fy_test_slurp(p, NULL);
    snprintf(p, sizeof p, "%s/config.json", good[1]);
    char *want = fy_test_slurp(p, NULL);
    assert_true(have != NULL && want != NULL);
    assert_string_equal(have, want);
    free(have);
    free(want);

    /* a plain init over it replaces the imported model and its RUN/hf */
    assert_int_equal(fy_test_launch_in(f, plain, 120), 0);
    assert_no_staging(run);
    snprintf(p, sizeof p, "%s/hf", run);
    assert_int_not_equal(access(p, F_OK), 0);
    have = fy_test_slurp(conf, NULL);
    assert_non_null(have);
    assert_null(strstr(have, "hf = 1"));
    free(have);
    free(out);
    free(run);
    free(before);
    free(after);
    free(untied);
    free(good[0]);
    free(good[1]);
}

/* The same for a store over two --ssd directories: the new store is built in a staging directory
 * inside each; a failure leaves both directories' files as they were, a success replaces them, and
 * neither leaves anything beside the store's files. */
static void test_overwrite_two_paths(void **state)
{
    struct fy_test_fixture *f = *state;
    char *dirs[2] = {strdup(fy_test_in(f, "ssd-a")), strdup(fy_test_in(f, "ssd-b"))};
    char *run = strdup(fy_test_in(f, "run")), list[1400];
    for (int k = 0; k < 2; k++)
        assert_int_equal(mkdir(dirs[k], 0700), 0);
    snprintf(list, sizeof list, "%s,%s", dirs[0], dirs[1]);
    const char *init[] = {"init", "--run-dir", run, "--layers", "2", "--heads", "2", "--embd", "32",
                          "--vocab", "300", "--ctx", "32", "--ssd", list, "--overwrite", NULL};
    assert_int_equal(fy_test_launch_in(f, init, 60), 0);
    char *was[2], *conf_was;
    size_t was_len[2], conf_len;
    for (int k = 0; k < 2; k++)
        was[k] = snapshot(dirs[k], &was_len[k]);
    conf_was = fy_test_slurp(fy_test_path(run, "model.conf"), &conf_len);
    assert_non_null(conf_was);
    assert_int_equal(count_entries(dirs[0]), 2); /* data and index */
    assert_int_equal(count_entries(dirs[1]), 1); /* data */

    setenv("FUYOU_TEST_IO_ENOSPC_AFTER", "2", 1);
    int rc = fy_test_launch_in(f, init, 60);
    unsetenv("FUYOU_TEST_IO_ENOSPC_AFTER");
    assert_int_equal(rc, 1);
    for (int k = 0; k < 2; k++) {
        size_t len;
        char *now = snapshot(dirs[k], &len);
        assert_same_bytes(dirs[k], was[k], was_len[k], now, len);
        free(now);
    }
    size_t len;
    char *conf = fy_test_slurp(fy_test_path(run, "model.conf"), &len);
    assert_non_null(conf);
    assert_same_bytes("model.conf", conf_was, conf_len, conf, len);
    free(conf);
    assert_true(fy_test_file_contains(f->log, fy_test_fmt("the previous model of %s is intact", run)));

    assert_int_equal(fy_test_launch_in(f, init, 60), 0);
    assert_int_equal(count_entries(dirs[0]), 2);
    assert_int_equal(count_entries(dirs[1]), 1);
    for (int k = 0; k < 2; k++) {
        char *now = snapshot(dirs[k], &len);
        assert_true(len != was_len[k] || memcmp(now, was[k], len) != 0); /* a new store id */
        free(now);
        free(was[k]);
        free(dirs[k]);
    }
    assert_int_equal(export_out(f, run, fy_test_in(f, "two.fywt")), 0);
    assert_true(fy_test_file_contains(f->log, "exported step 0"));
    free(conf_was);
    free(run);
}

static void test_export_directories(void **state)
{
    struct fy_test_fixture *f = *state;
    char *made = fy_test_in(f, "made");
    const char *init[] = {"init", "--run-dir", made, "--layers", "1", "--heads", "2", "--embd", "16",
                          "--vocab", "64", "--ctx", "16", NULL};
    assert_int_equal(fy_test_launch_in(f, init, 60), 0);
    char *out = fy_test_in(f, "out");
    assert_int_equal(mkdir(out, 0755), 0);
    char p[700];
    snprintf(p, sizeof p, "%s/tokenizer.json", out);
    FILE *fp = fopen(p, "w");
    assert_non_null(fp);
    fputs("{}", fp);
    assert_int_equal(fclose(fp), 0);
    /* refused: not empty; nothing changed, nothing left beside it */
    assert_int_equal(export_hf(f, made, out, NULL, NULL), 1);
    const char *w[] = {out, "not empty", NULL};
    expect_one_error(f, w);
    assert_int_equal(count_entries(out), 1);
    assert_int_equal(count_entries(f->dir), 3); /* log, made, out: no temporary beside out */
    /* --overwrite: the model files are written, the tokenizer kept */
    assert_int_equal(export_hf(f, made, out, "--overwrite", NULL), 0);
    assert_int_equal(count_entries(out), 3);
    assert_int_equal(access(p, F_OK), 0);
    /* --out and --to-hf together are refused */
    const char *both[] = {"export", "--run-dir", made, "--to-hf", out, "--out", p, NULL};
    assert_int_equal(fy_test_launch_in(f, both, 30), 2);
}

int main(void)
{
    signal(SIGCHLD, SIG_DFL);
    if (access(fy_test_bin("fuyou-launch"), X_OK) != 0) {
        fprintf(stderr, "test_hf: run from the repository root after make\n");
        return 1;
    }
    in_ci = fy_test_in_ci();
    have_transformers = fy_refmodel_python_has("torch, transformers, safetensors");
    if (fy_refmodel_script("hf_gpt2.py", script, sizeof script) != 0) {
        fprintf(stderr, "test_hf: cannot read %s (run from the repository root)\n", script);
        return 1;
    }
    if (!have_transformers)
        printf("test_hf: python3 with torch and transformers not found: the tests against "
               "transformers are %s (pip install torch==2.5.1 transformers==5.17.0)\n",
               in_ci ? "FAILED under CI" : "skipped");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_loss_matches_transformers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_roundtrip_bit_exact, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trained_export_reproduces_loss, setup, teardown),
        cmocka_unit_test_setup_teardown(test_int8_import_trains_and_exports, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_inputs_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overwrite_builds_beside, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overwrite_two_paths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_export_directories, setup, teardown),
    };
    struct CMUnitTest run[sizeof tests / sizeof tests[0]];
    size_t wanted = 0; /* FY_TEST_ONLY: a few of them, by name (comma-separated globs) */
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (fy_test_wanted(tests[i].name))
            run[wanted++] = tests[i];
    return _cmocka_run_group_tests("hf (integration)", run, wanted, NULL, NULL);
}
