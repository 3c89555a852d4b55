/* Integration tests of the Hugging Face Llama import (fuyou-launch init --from-hf of a
 * LlamaForCausalLM) on the CPU backend, against transformers (tests/reference/hf_llama.py): tiny
 * checkpoints written by save_pretrained (grouped-query attention in all; plain RoPE with an untied
 * head, llama3 scaling with an untied head, llama3 scaling with a tied head) give a first-step loss
 * equal to transformers' on the same batch within 1e-4; unsupported settings (another rope type,
 * biases) are refused with one line naming config.json. export --to-hf: without training the
 * export equals the source tensor by tensor, bit for bit (F32 and BF16, tied and untied heads);
 * after training, transformers loads the export with no missing or unexpected keys and its
 * held-out loss is the one train reported; a model made by init --arch llama (no source) exports
 * with a config.json written here, which transformers loads (same held-out loss) and init
 * --from-hf imports back. The Llama-like families (an explicit head_dim in Llama, Qwen2 with a tied
 * head, Qwen3 untied and tied, Mistral and Phi-3 with windows smaller than the sequence; odd widths, GQA 3:1 and
 * 4:1, vocabulary 1000), each made by transformers: the export without training equals the source
 * bit for bit (Phi-3's fused tensors split and fused again), the first step's loss is transformers'
 * within 1e-4, and after three steps transformers loads the export cleanly and reproduces the
 * held-out loss within 1e-4. The transformers tests skip, saying so, where python3 lacks torch or
 * transformers, except under CI (CI=true), where that is a failure. */
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
#include <sys/stat.h>
#include <unistd.h>

#include "tests/refmodel.h"
#include "tests/testutil.h"

#define LOSS_TOL 1e-4
#define BATCH "4"
#define SEQ "32"
#define EVAL_FRACTION "0.1"

static int have_transformers;
static int in_ci;
static char script[4096];

static int setup(void **state) { return fy_test_setup(state, "hfllama", NULL); }
static int teardown(void **state) { return fy_test_teardown(state); }

static void need_transformers(void)
{
    if (have_transformers)
        return;
    if (in_ci)
        fail_msg("python3 with torch and transformers is missing under CI: .ci/run installs them");
    printf("test_hf_llama: skipped: python3 with torch and transformers is needed (pip install "
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

static int init_hf(struct fy_test_fixture *f, const char *run, const char *src)
{
    const char *args[] = {"init", "--run-dir", run, "--from-hf", src, NULL};
    return fy_test_launch(f->log, args, 120);
}

static int export_hf(struct fy_test_fixture *f, const char *run, const char *out, const char *opt,
                     const char *value)
{
    const char *args[] = {"export", "--run-dir", run, "--to-hf", out, opt, value, NULL};
    return fy_test_launch(f->log, args, 120);
}

static int train(struct fy_test_fixture *f, const char *run, const char *steps)
{
    const char *args[] = {"train", "--run-dir", run, "--data", f->data, "--steps", steps,
                          "--batch", BATCH, "--seq", SEQ, "--eval-fraction", EVAL_FRACTION,
                          "--lr", "1e-3", "--warmup", "0", "--eval-batches", "2", "--seed", "1",
                          "--backend", "cpu", NULL};
    return fy_test_launch(f->log, args, 300);
}

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

#define CASES 3
static const char *const case_names[CASES] = {"plain-untied", "llama3-untied", "llama3-tied"};
static const char *const case_flags[CASES] = {"", "--llama3", "--llama3 --tied"};

/* The first step's loss, computed before its update, against transformers on that batch. */
static void test_loss_matches_transformers(void **state)
{
    need_transformers();
    struct fy_test_fixture *f = *state;
    const char *make[CASES + 2] = {pycmd("tokens %s --vocab 300 --count 4096 --seed 3", f->data)};
    for (int k = 0; k < CASES; k++)
        make[k + 1] = pycmd("make %s --seed %d %s", fy_test_in(f, case_names[k]), 11 + k,
                            case_flags[k]);
    make[CASES + 1] = NULL;
    python_run(make, NULL, 0);
    double ours[CASES], theirs[CASES];
    const char *loss[CASES + 1];
    for (int k = 0; k < CASES; k++) {
        char run[64];
        snprintf(run, sizeof run, "run-%s", case_names[k]);
        char *r = fy_test_in(f, run);
        assert_int_equal(init_hf(f, r, fy_test_in(f, case_names[k])), 0);
        assert_int_equal(train(f, r, "1"), 0);
        ours[k] = metric(r, 1, "\"loss\": ");
        loss[k] = pycmd("loss %s %s --train-step 1 --batch " BATCH " --seq " SEQ
                        " --eval-fraction " EVAL_FRACTION " --seed 1",
                        fy_test_in(f, case_names[k]), f->data);
    }
    loss[CASES] = NULL;
    assert_int_equal(python_run(loss, theirs, CASES), CASES);
    for (int k = 0; k < CASES; k++) {
        printf("test_hf_llama: %s: step 1 loss %.9f here, %.9f in transformers (difference "
               "%.2e)\n", case_names[k], ours[k], theirs[k], fabs(ours[k] - theirs[k]));
        assert_true(fabs(ours[k] - theirs[k]) <= LOSS_TOL);
        assert_true(ours[k] > 5.0 && ours[k] < 6.5); /* a random model: near ln(300) = 5.70 */
    }
}

/* init --from-hf then export --to-hf, no training: the same names, dtypes, shapes and bytes, and
 * the same config.json. */
static void test_roundtrip_bit_exact(void **state)
{
    need_transformers();
    struct fy_test_fixture *f = *state;
    static const char *const names[] = {"f32-untied", "bf16-untied-llama3", "f32-tied-llama3",
                                        "bf16-tied"};
    static const char *const flags[] = {"--dtype f32", "--dtype bf16 --llama3",
                                        "--dtype f32 --llama3 --tied", "--dtype bf16 --tied"};
    enum { N = sizeof names / sizeof names[0] };
    const char *make[N + 1], *compare[N + 1];
    for (int k = 0; k < N; k++) {
        char src[64];
        snprintf(src, sizeof src, "src-%s", names[k]);
        make[k] = pycmd("make %s --seed %d %s", fy_test_in(f, src), 21 + k, flags[k]);
    }
    make[N] = NULL;
    python_run(make, NULL, 0);
    for (int k = 0; k < N; k++) {
        char src[64], run[64], out[64];
        snprintf(src, sizeof src, "src-%s", names[k]);
        snprintf(run, sizeof run, "run-%s", names[k]);
        snprintf(out, sizeof out, "out-%s", names[k]);
        assert_int_equal(init_hf(f, fy_test_in(f, run), fy_test_in(f, src)), 0);
        assert_int_equal(export_hf(f, fy_test_in(f, run), fy_test_in(f, out), NULL, NULL), 0);
        assert_true(fy_test_file_contains(f->log, "a Hugging Face Llama directory"));
        compare[k] = pycmd("compare %s %s", fy_test_in(f, src), fy_test_in(f, out));
    }
    compare[N] = NULL;
    python_run(compare, NULL, 0);
    printf("test_hf_llama: %d Llama exports equal their sources bit for bit\n", N);
}

#define LOSS_ARGS " --batch " BATCH " --seq " SEQ " --eval-fraction " EVAL_FRACTION " --seed 1"

/* Train, export; transformers loads the export cleanly and reproduces the held-out loss train
 * reported after its last update, on exactly the weights exported (F32; the BF16 source exported
 * with --dtype f32, since bf16 rounding would change the weights the loss was computed on). */
static void test_trained_export_reproduces_loss(void **state)
{
    need_transformers();
    struct fy_test_fixture *f = *state;
    static const char *const names[] = {"f32-untied", "bf16-tied-llama3"};
    const char *make[] = {pycmd("tokens %s --vocab 300 --count 4096 --seed 3", f->data),
                          pycmd("make %s --seed 31 --dtype f32", fy_test_in(f, "src-f32-untied")),
                          pycmd("make %s --seed 32 --dtype bf16 --tied --llama3",
                                fy_test_in(f, "src-bf16-tied-llama3")),
                          NULL};
    python_run(make, NULL, 0);
    double ours[2];
    const char *cmds[6];
    for (int k = 0; k < 2; k++) {
        char src[64], run[64], out[64];
        snprintf(src, sizeof src, "src-%s", names[k]);
        snprintf(run, sizeof run, "run-%s", names[k]);
        snprintf(out, sizeof out, "out-%s", names[k]);
        char *r = fy_test_in(f, run);
        assert_int_equal(init_hf(f, r, fy_test_in(f, src)), 0);
        assert_int_equal(train(f, r, "3"), 0);
        ours[k] = metric(r, 3, "\"eval_loss\": ");
        assert_int_equal(export_hf(f, r, fy_test_in(f, out), k == 1 ? "--dtype" : NULL, "f32"), 0);
        assert_true(fy_test_file_contains(f->log, "exported step 3"));
        cmds[k] = pycmd("loss %s %s --eval-batches 2" LOSS_ARGS, fy_test_in(f, out), f->data);
        cmds[2 + k] = pycmd("loss %s %s --eval-batches 2" LOSS_ARGS, fy_test_in(f, src), f->data);
    }
    /* the export holds the trained weights, not the imported ones (checked on the tensors: the
     * tokens are uniformly random, so the held-out loss of a near-uniform model barely moves in
     * three steps and is only printed) */
    cmds[4] = pycmd("compare %s %s --expect-different", fy_test_in(f, "src-f32-untied"),
                    fy_test_in(f, "out-f32-untied"));
    cmds[5] = NULL;
    double theirs[4];
    assert_int_equal(python_run(cmds, theirs, 4), 4);
    for (int k = 0; k < 2; k++) {
        printf("test_hf_llama: %s: held-out loss after step 3 %.9f here, %.9f in transformers on "
               "the export (difference %.2e); the imported model's: %.9f\n",
               names[k], ours[k], theirs[k], fabs(ours[k] - theirs[k]), theirs[2 + k]);
        assert_true(fabs(ours[k] - theirs[k]) <= LOSS_TOL);
    }
}

/* A Llama made by init --arch llama (no Hugging Face source): the export's config.json is written
 * here; transformers loads it cleanly and reproduces train's held-out loss (so the rotary theta,
 * the epsilon, grouped-query heads and the tied or untied head are stated right), and init
 * --from-hf of the export reads that config back into the same model (exported again: bit for
 * bit the same). */
static void test_plain_init_export(void **state)
{
    need_transformers();
    struct fy_test_fixture *f = *state;
    const char *tok[] = {pycmd("tokens %s --vocab 300 --count 4096 --seed 3", f->data), NULL};
    python_run(tok, NULL, 0);
    static const char *const names[] = {"made-untied", "made-tied"};
    double ours[2];
    const char *cmds[4];
    for (int k = 0; k < 2; k++) {
        char run[64], out[64], again[64], back[64];
        snprintf(run, sizeof run, "run-%s", names[k]);
        snprintf(out, sizeof out, "out-%s", names[k]);
        snprintf(again, sizeof again, "again-%s", names[k]);
        snprintf(back, sizeof back, "back-%s", names[k]);
        char *r = fy_test_in(f, run);
        const char *init[] = {"init", "--run-dir", r, "--arch", "llama", "--layers", "2",
                              "--heads", "4", "--kv-heads", "2", "--embd", "32", "--ffn", "48",
                              "--vocab", "300", "--ctx", "64", "--rope-theta", "500000",
                              "--rms-eps", "1e-6", k == 1 ? "--tied" : NULL, NULL};
        assert_int_equal(fy_test_launch(f->log, init, 60), 0);
        assert_int_equal(train(f, r, "2"), 0);
        ours[k] = metric(r, 2, "\"eval_loss\": ");
        assert_int_equal(export_hf(f, r, fy_test_in(f, out), NULL, NULL), 0);
        assert_true(fy_test_file_contains(f->log, "config.json made here"));
        char cfg[700];
        snprintf(cfg, sizeof cfg, "%s/config.json", fy_test_in(f, out));
        assert_true(fy_test_file_contains(cfg, "\"LlamaForCausalLM\""));
        assert_true(fy_test_file_contains(cfg, "\"rope_theta\": 500000.0"));
        assert_true(fy_test_file_contains(cfg, k == 1 ? "\"tie_word_embeddings\": true"
                                                      : "\"tie_word_embeddings\": false"));
        cmds[k] = pycmd("loss %s %s --eval-batches 2" LOSS_ARGS, fy_test_in(f, out), f->data);
        /* the written config.json imports back into the same model */
        assert_int_equal(init_hf(f, fy_test_in(f, back), fy_test_in(f, out)), 0);
        assert_int_equal(export_hf(f, fy_test_in(f, back), fy_test_in(f, again), NULL, NULL), 0);
        cmds[2 + k] = pycmd("compare %s %s", fy_test_in(f, out), fy_test_in(f, again));
    }
    const char *losses[] = {cmds[0], cmds[1], cmds[2], cmds[3], NULL};
    double theirs[2];
    assert_int_equal(python_run(losses, theirs, 2), 2);
    for (int k = 0; k < 2; k++) {
        printf("test_hf_llama: %s (init --arch llama): held-out loss after step 2 %.9f here, %.9f "
               "in transformers on the export (difference %.2e)\n",
               names[k], ours[k], theirs[k], fabs(ours[k] - theirs[k]));
        assert_true(fabs(ours[k] - theirs[k]) <= LOSS_TOL);
    }
}

/* The Llama-like families, as hf_llama.py's make makes them (2 layers, context 64). */
static const struct {
    const char *name, *flags;
} families[] = {
    {"llama-head-dim", "--family llama --embd 36 --heads 3 --kv-heads 1 --head-dim 10 --ffn 40"},
    {"qwen2-tied", "--family qwen2 --tied --embd 36 --heads 6 --kv-heads 2 --ffn 40"},
    {"qwen3-untied", "--family qwen3 --embd 44 --heads 4 --kv-heads 1 --head-dim 14 --ffn 40"},
    {"qwen3-tied", "--family qwen3 --tied --embd 36 --heads 6 --kv-heads 2 --head-dim 4 --ffn 40"},
    {"mistral-window", "--family mistral --embd 36 --heads 3 --kv-heads 1 --head-dim 8 --window 8 "
     "--ffn 40"},
    {"phi3-window", "--family phi3 --embd 40 --heads 4 --kv-heads 1 --window 16 --ffn 40"},
};
enum { FAMILIES = sizeof families / sizeof families[0] };

/* Each family: imported and exported untrained, bit for bit its source; imported and trained
 * three steps, its first loss transformers' on that batch and its held-out loss after the last
 * step transformers' on the export, which loads cleanly. */
static void test_families(void **state)
{
    need_transformers();
    struct fy_test_fixture *f = *state;
    const char *make[FAMILIES + 2] = {pycmd("tokens %s --vocab 1000 --count 4096 --seed 3",
                                            f->data)};
    for (int k = 0; k < FAMILIES; k++) {
        char src[64];
        snprintf(src, sizeof src, "src-%s", families[k].name);
        make[k + 1] = pycmd("make %s --seed %d --vocab 1000 --ctx 64 %s", fy_test_in(f, src),
                            41 + k, families[k].flags);
    }
    make[FAMILIES + 1] = NULL;
    python_run(make, NULL, 0);
    double first[FAMILIES], held_out[FAMILIES];
    /* more commands than pycmd's ring of buffers holds: copied here */
    static char text[3 * FAMILIES][1024];
    const char *cmds[3 * FAMILIES + 1];
    for (int k = 0; k < FAMILIES; k++) {
        char src[64], same[64], same_out[64], run[64], out[64];
        snprintf(src, sizeof src, "src-%s", families[k].name);
        snprintf(same, sizeof same, "same-%s", families[k].name);
        snprintf(same_out, sizeof same_out, "same-out-%s", families[k].name);
        snprintf(run, sizeof run, "run-%s", families[k].name);
        snprintf(out, sizeof out, "out-%s", families[k].name);
        char *s = fy_test_in(f, src), *r = fy_test_in(f, run);
        assert_int_equal(init_hf(f, fy_test_in(f, same), s), 0);
        assert_int_equal(export_hf(f, fy_test_in(f, same), fy_test_in(f, same_out), NULL, NULL), 0);
        assert_int_equal(init_hf(f, r, s), 0);
        assert_int_equal(train(f, r, "3"), 0);
        first[k] = metric(r, 1, "\"loss\": ");
        held_out[k] = metric(r, 3, "\"eval_loss\": ");
        assert_int_equal(export_hf(f, r, fy_test_in(f, out), NULL, NULL), 0);
        snprintf(text[k], sizeof text[k], "loss %s %s --train-step 1" LOSS_ARGS, s, f->data);
        snprintf(text[FAMILIES + k], sizeof text[0], "loss %s %s --eval-batches 2" LOSS_ARGS,
                 fy_test_in(f, out), f->data);
        snprintf(text[2 * FAMILIES + k], sizeof text[0], "compare %s %s", s,
                 fy_test_in(f, same_out));
    }
    for (int i = 0; i < 3 * FAMILIES; i++)
        cmds[i] = text[i];
    cmds[3 * FAMILIES] = NULL;
    double theirs[2 * FAMILIES];
    assert_int_equal(python_run(cmds, theirs, 2 * FAMILIES), 2 * FAMILIES);
    int bad = 0;
    for (int k = 0; k < FAMILIES; k++) {
        double d1 = fabs(first[k] - theirs[k]), d3 = fabs(held_out[k] - theirs[FAMILIES + k]);
        printf("test_hf_llama: %s: step 1 loss %.9f here, %.9f in transformers (difference "
               "%.2e); held-out loss after step 3 %.9f here, %.9f on the export (difference "
               "%.2e); the untrained export equals its source\n",
               families[k].name, first[k], theirs[k], d1, held_out[k], theirs[FAMILIES + k], d3);
        bad += !(d1 <= LOSS_TOL) + !(d3 <= LOSS_TOL);
        bad += !(first[k] > 6.0 && first[k] < 8.0); /* a random model: near ln(1000) = 6.91 */
    }
    assert_int_equal(bad, 0);
}

static void write_text(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

/* Unsupported configs are refused with one line naming config.json and the key. */
static void test_bad_configs_refused(void **state)
{
    struct fy_test_fixture *f = *state;
    static const struct {
        const char *extra, *needle;
    } bad[] = {
        {"\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 10000.0, \"factor\": 4.0},",
         "rope_type \"yarn\" is not supported"},
        {"\"attention_bias\": true,", "\"attention_bias\": true is not supported"},
        {"\"mlp_bias\": true,", "\"mlp_bias\": true is not supported"},
        {"\"hidden_act\": \"gelu\",", "\"hidden_act\": \"gelu\" is not supported"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "bad%zu", i);
        char *src = fy_test_in(f, name);
        assert_int_equal(mkdir(src, 0755), 0);
        char cfg[700], text[2048];
        snprintf(cfg, sizeof cfg, "%s/config.json", src);
        snprintf(text, sizeof text,
                 "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", %s "
                 "\"hidden_size\": 32, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                 "\"intermediate_size\": 48, \"num_hidden_layers\": 2, \"vocab_size\": 300, "
                 "\"max_position_embeddings\": 64}\n",
                 bad[i].extra);
        write_text(cfg, text);
        char run[64];
        snprintf(run, sizeof run, "run-bad%zu", i);
        char *r = fy_test_in(f, run);
        assert_int_equal(init_hf(f, r, src), 1);
        if (!fy_test_file_contains(f->log, bad[i].needle) || !fy_test_file_contains(f->log, cfg))
            fail_msg("case %zu: the log lacks \"%s\" naming %s", i, bad[i].needle, cfg);
        char mc[700];
        snprintf(mc, sizeof mc, "%s/model.conf", r);
        assert_int_not_equal(access(mc, F_OK), 0);
    }
}

int main(void)
{
    signal(SIGCHLD, SIG_DFL);
    if (access(fy_test_bin("fuyou-launch"), X_OK) != 0) {
        fprintf(stderr, "test_hf_llama: run from the repository root after make\n");
        return 1;
    }
    in_ci = fy_test_in_ci();
    have_transformers = fy_refmodel_python_has("torch, transformers, safetensors");
    if (fy_refmodel_script("hf_llama.py", script, sizeof script) != 0) {
        fprintf(stderr, "test_hf_llama: cannot read %s (run from the repository root)\n", script);
        return 1;
    }
    if (!have_transformers)
        printf("test_hf_llama: python3 with torch and transformers not found: the tests against "
               "transformers are %s (pip install torch==2.5.1 transformers==5.17.0)\n",
               in_ci ? "FAILED under CI" : "skipped");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_loss_matches_transformers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_roundtrip_bit_exact, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trained_export_reproduces_loss, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plain_init_export, setup, teardown),
        cmocka_unit_test_setup_teardown(test_families, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_configs_refused, setup, teardown),
    };
    return cmocka_run_group_tests_name("hf llama (integration)", tests, NULL, NULL);
}
