/* A chat fine-tune end to end on the CPU backend, as a fine-tuner runs one: a tiny Qwen2 made by
 * transformers (tests/reference/hf_llama.py) with a tokenizer of Qwen2.5's chat template
 * (tests/reference/chat_ref.py), a few hundred conversations in a Parquet file of several row
 * groups, prepare --messages-field, init --from-hf, then train --epochs 2 through the workers:
 * each conversation a document, packed whole (the default for a file of records), the held-out
 * conversations evaluated whole, and the held-out loss falls. Skips (saying so) without python3's
 * torch, transformers, tokenizers and pyarrow, and fails under CI=true. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/formats/tokfile.h"
#include "tests/refmodel.h"
#include "tests/testutil.h"
#include "tests/trainutil.h"

#define RUN_TIMEOUT_S 300
#define CONVERSATIONS 300

static char *dir;
static char log_path[512];
static char chat_script[4096], llama_script[4096];
static int have_all, in_ci;

static const char *tpath(const char *name) { return fy_test_path(dir, name); }

static void launch_ok(const char *const *args)
{
    int rc = fy_test_launch(log_path, args, RUN_TIMEOUT_S);
    if (rc != 0) {
        char *text = fy_test_slurp(log_path, NULL);
        fail_msg("fuyou-launch %s exited %d:\n%s", args[0], rc, text ? text : "(no log)");
    }
}

static void python(const char *const *args)
{
    char *argv[40];
    int n = 0;
    argv[n++] = "python3";
    for (; *args && n < 39; args++)
        argv[n++] = (char *)*args;
    argv[n] = NULL;
    assert_int_equal(fy_refmodel_run(argv, RUN_TIMEOUT_S), 0);
}

/* Conversations a small model learns in two epochs: sums, colours and the days after a day, with
 * a system message in some. */
static void write_conversations(const char *path)
{
    static const char *const objects[] = {"sky", "grass", "snow", "coal", "sun", "rose"};
    static const char *const colours[] = {"blue", "green", "white", "black", "yellow", "red"};
    static const char *const days[] = {"Monday", "Tuesday",  "Wednesday", "Thursday",
                                       "Friday", "Saturday", "Sunday"};
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    uint64_t rs = 17;
    for (int i = 0; i < CONVERSATIONS; i++) {
        char user[128], answer[128];
        int kind = (int)(fy_test_rand(&rs) % 3);
        if (kind == 0) {
            int a = (int)(fy_test_rand(&rs) % 10), b = (int)(fy_test_rand(&rs) % 10);
            snprintf(user, sizeof user, "What is %d plus %d?", a, b);
            snprintf(answer, sizeof answer, "%d plus %d is %d.", a, b, a + b);
        } else if (kind == 1) {
            int o = (int)(fy_test_rand(&rs) % 6);
            snprintf(user, sizeof user, "What colour is the %s?", objects[o]);
            snprintf(answer, sizeof answer, "The %s is %s.", objects[o], colours[o]);
        } else {
            int d = (int)(fy_test_rand(&rs) % 7);
            snprintf(user, sizeof user, "Which day comes after %s?", days[d]);
            snprintf(answer, sizeof answer, "After %s comes %s.", days[d], days[(d + 1) % 7]);
        }
        fprintf(f,
                "{\"messages\": [%s{\"role\": \"user\", \"content\": \"%s\"}, {\"role\": "
                "\"assistant\", \"content\": \"%s\"}]}\n",
                i % 4 == 0 ? "{\"role\": \"system\", \"content\": \"Answer briefly.\"}, " : "",
                user, answer);
    }
    assert_int_equal(fclose(f), 0);
}

static void copy_file(const char *from, const char *to)
{
    size_t len;
    char *text = fy_test_slurp(from, &len);
    assert_non_null(text);
    FILE *f = fopen(to, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
    free(text);
}

static void test_chat_fine_tune(void **state)
{
    if (!have_all) {
        if (in_ci)
            fail_msg("python3 torch, transformers, tokenizers or pyarrow is missing under CI: "
                     ".ci/run installs them");
        printf("test_chat_train: skipped: python3 with torch, transformers, tokenizers and "
               "pyarrow is needed\n");
        skip();
    }
    /* the conversations, as a Parquet file of several row groups */
    char jsonl[1024], parquet[1024], tokdir[1024], model[1024], tokfile[1024], run[1024];
    snprintf(jsonl, sizeof jsonl, "%s", tpath("chat.jsonl"));
    snprintf(parquet, sizeof parquet, "%s", tpath("chat.parquet"));
    snprintf(tokdir, sizeof tokdir, "%s", tpath("tok"));
    snprintf(model, sizeof model, "%s", tpath("model"));
    snprintf(tokfile, sizeof tokfile, "%s", tpath("chat.tok"));
    snprintf(run, sizeof run, "%s", tpath("run"));
    write_conversations(jsonl);
    const char *pq[] = {chat_script, "parquet", jsonl, parquet, "128", NULL};
    python(pq);
    /* a tokenizer with Qwen2.5's chat template, then the token file */
    const char *tok[] = {chat_script, "build", "tests/fixtures/chat/qwen2.5", tokdir, jsonl, NULL};
    python(tok);
    const char *prep[] = {"prepare",          "--out",    tokfile, "--tokenizer", tokdir,
                          "--messages-field", "messages", parquet, NULL};
    launch_ok(prep);
    assert_true(
        fy_test_file_contains(log_path, fy_test_fmt("%d documents, each a record", CONVERSATIONS)));
    struct fy_tokfile *t;
    assert_int_equal(fy_tokfile_open(&t, tokfile, 0), 0);
    assert_int_equal(fy_tokfile_documents(t), CONVERSATIONS);
    uint32_t vocab = fy_tokfile_vocab(t);
    fy_tokfile_destroy(&t);

    /* a tiny Qwen2 of that vocabulary, the tokenizer beside it, imported */
    char v[16];
    snprintf(v, sizeof v, "%u", vocab);
    const char *make[] = {llama_script, "make",    model, "--family",   "qwen2", "--layers",
                          "2",          "--heads", "4",   "--kv-heads", "2",     "--embd",
                          "64",         "--ffn",   "128", "--vocab",    v,       "--ctx",
                          "128",        "--seed",  "3",   NULL};
    python(make);
    copy_file(fy_test_fmt("%s/tokenizer.json", tokdir), fy_test_fmt("%s/tokenizer.json", model));
    copy_file(fy_test_fmt("%s/tokenizer_config.json", tokdir),
              fy_test_fmt("%s/tokenizer_config.json", model));
    const char *init[] = {"init", "--run-dir", run, "--from-hf", model, NULL};
    launch_ok(init);

    /* two epochs; evaluated every 4 steps and at the end, each time every held-out conversation */
    const char *train[] = {"train", "--run-dir",
                           run,     "--data",
                           tokfile, "--epochs",
                           "2",     "--batch",
                           "4",     "--seq",
                           "128",   "--lr",
                           "3e-3",  "--warmup",
                           "2",     "--eval-every",
                           "4",     "--checkpoint-every",
                           "1000",  "--backend",
                           "cpu",   NULL};
    launch_ok(train);
    assert_true(fy_test_file_contains(log_path, "batches: documents packed whole, each alone (the "
                                                "data's documents are records): 270 training "
                                                "documents"));
    assert_true(fy_test_file_contains(log_path, "the 30 held-out documents"));
    assert_true(fy_test_file_contains(log_path, "| epoch 2/2 |"));
    char metrics[1100];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run);
    double eval[64], fill[256];
    int n = fy_trainutil_field_numbers(metrics, "\"eval_loss\": ", eval, 64);
    int steps = fy_trainutil_field_numbers(metrics, "\"fill\": ", fill, 256);
    assert_true(n >= 3);
    double mean_fill = 0;
    for (int i = 0; i < steps; i++)
        mean_fill += fill[i] / steps;
    print_message("chat fine-tune: %d conversations (Parquet), %d steps over 2 epochs, fill "
                  "%.1f%%; held-out loss %.4f at step 4 -> %.4f at the end (%d evaluations)\n",
                  CONVERSATIONS, steps, 100 * mean_fill, eval[0], eval[n - 1], n);
    assert_true(eval[n - 1] < 0.7 * eval[0]);
    for (int i = 1; i < n; i++)
        assert_true(eval[i] < eval[0]);
}

int main(void)
{
    if (fy_trainutil_start("test_chat_train") != 0)
        return 1;
    dir = fy_test_tmpdir("chat-train");
    if (dir == NULL) {
        fprintf(stderr, "test_chat_train: cannot create a temporary directory\n");
        return 1;
    }
    snprintf(log_path, sizeof log_path, "%s/launch.log", dir);
    in_ci = fy_test_in_ci();
    if (fy_refmodel_script("chat_ref.py", chat_script, sizeof chat_script) != 0 ||
        fy_refmodel_script("hf_llama.py", llama_script, sizeof llama_script) != 0) {
        fprintf(stderr, "test_chat_train: tests/reference/ not found: run from the repository "
                        "root\n");
        return 1;
    }
    have_all = fy_refmodel_python_has("torch, transformers, tokenizers, jinja2, pyarrow");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_fine_tune),
    };
    int failed = cmocka_run_group_tests_name("chat_train (integration)", tests, NULL, NULL);
    if (failed == 0)
        fy_test_rmdir(dir);
    free(dir);
    return failed;
}
