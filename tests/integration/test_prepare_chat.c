/* `fuyou-launch prepare` of conversations (--messages-field) and of Parquet files:
 * - the chat templates of Qwen2.5, Qwen3 (as chat_template.jinja), Llama 3, Llama 3.2 and Mistral
 *   (tests/fixtures/chat/: each template as its model's public tokenizer_config.json has it), each
 *   with a tiny tokenizer.json that tests/reference/chat_ref.py builds with the family's special
 *   tokens: every token as transformers' apply_chat_template gives it, and every mask bit as
 *   transformers' own assistant mask (return_assistant_tokens_mask) of the template marked by hand
 *   with {% generation %} around each assistant content and the end-of-turn token after it (a
 *   message's keys whose value is null dropped first: with them Llama 3.2's template would take
 *   every message for a tool call);
 * - every refusal of a conversation: the options, a tokenizer without a template, each malformed
 *   message (one line naming FILE:LINE and what), a template's own exception, a template that
 *   renders the turn according to the content, one with no end-of-turn token;
 * - Parquet files of several row groups give byte for byte the token file of the same records as
 *   JSON lines (a text field, prompt/response pairs, conversations; byte-level and Hugging Face
 *   tokenizers; Llama 3.2's template for the conversations, whose list of structs gives every
 *   message every key), alone and mixed with JSONL; a missing column, a null value, a file that
 *   is not Parquet, Parquet mixed with text, and python3 without pyarrow are refused.
 * The tests skip (saying so) without python3's transformers (with tokenizers and jinja2) or
 * pyarrow, and fail under CI=true. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/formats/tokfile.h"
#include "tests/refmodel.h"
#include "tests/testutil.h"
#include "tests/trainutil.h"

#define RUN_TIMEOUT_S 180
#define CONVERSATIONS "tests/fixtures/chat/conversations.jsonl"

static char *dir;
static char log_path[512];
static char ref_script[4096];
static int have_chat, have_pyarrow, have_tokenizers, in_ci;

static const char *tpath(const char *name) { return fy_test_path(dir, name); }

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
}

static int launch(const char *const *args)
{
    int rc = fy_test_launch(log_path, args, RUN_TIMEOUT_S);
    if (rc < 0)
        fail_msg("fuyou-launch did not exit normally within %d s", RUN_TIMEOUT_S);
    return rc;
}

static int launch_ok(const char *const *args)
{
    int rc = launch(args);
    if (rc != 0) {
        char *text = fy_test_slurp(log_path, NULL);
        fail_msg("fuyou-launch %s exited %d:\n%s", args[0], rc, text ? text : "(no log)");
    }
    return rc;
}

/* Runs python3 with args (NULL-terminated); fails the test unless it exits 0. */
static void python(const char *const *args)
{
    char *argv[32];
    int n = 0;
    argv[n++] = "python3";
    for (; *args && n < 31; args++)
        argv[n++] = (char *)*args;
    argv[n] = NULL;
    assert_int_equal(fy_refmodel_run(argv, RUN_TIMEOUT_S), 0);
}

static int skip_without(int have, const char *what)
{
    if (have)
        return 0;
    if (in_ci)
        fail_msg("python3 %s is missing under CI: .ci/run installs it", what);
    printf("test_prepare_chat: skipped: python3 with %s is needed (pip install %s)\n", what,
           what);
    return 1;
}

static int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* Runs prepare with args; expects exit `status`, exactly one error line containing want, no
 * output. */
static void expect_refused_with(const char *const *args, const char *out, const char *want,
                                int status)
{
    int rc = launch(args);
    if (rc != status || !fy_test_file_contains(log_path, want) ||
        fy_test_count_matches(log_path, "error:") != 1) {
        char *text = fy_test_slurp(log_path, NULL);
        fail_msg("expected exit %d and one error line with '%s'; got exit %d and:\n%s", status,
                 want, rc, text ? text : "(no log)");
    }
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    assert_false(exists(out));
    assert_false(exists(tmp));
}

/* An input refused: exit 1. */
static void expect_refused(const char *const *args, const char *out, const char *want)
{
    expect_refused_with(args, out, want, 1);
}

/* Options that do not go together: a usage error, exit 2. */
static void expect_usage(const char *const *args, const char *out, const char *want)
{
    expect_refused_with(args, out, want, 2);
}

/* A tokenizer directory for a family of tests/fixtures/chat/, in the scratch directory. */
static const char *build_family(const char *family)
{
    static char d[1024];
    char fixture[256];
    snprintf(d, sizeof d, "%s/tok-%s", dir, family);
    snprintf(fixture, sizeof fixture, "tests/fixtures/chat/%s", family);
    if (!exists(d)) {
        const char *b[] = {ref_script, "build", fixture, d, CONVERSATIONS, NULL};
        python(b);
    }
    return d;
}

/* The token file against chat_ref.py's expectation for the same inputs: every token and mask bit,
 * each conversation's first token a document start, the vocabulary, no end-of-sequence token, the
 * tokenizer's hash. */
static void check_chat(const char *tokdir, const char *family, const char *field,
                       const char *tokfile, const char *const *inputs)
{
    const char *exp = tpath("expect.txt");
    const char *args[16] = {ref_script, "expect", tokdir, family, field, exp};
    int n = 6;
    for (; *inputs; inputs++)
        args[n++] = *inputs;
    args[n] = NULL;
    python(args);
    FILE *f = fopen(exp, "r");
    assert_non_null(f);
    long vocab, eos;
    assert_int_equal(fscanf(f, "vocab %ld eos %ld", &vocab, &eos), 2);
    struct fy_tokfile *t;
    assert_int_equal(fy_tokfile_open(&t, tokfile, (uint32_t)vocab), 0);
    assert_int_equal(fy_tokfile_vocab(t), vocab);
    struct fy_tokfile_source src = fy_tokfile_source(t);
    assert_int_equal(src.tokenizer, FY_TOKENIZER_HF);
    assert_int_equal(src.eos, FY_TOKFILE_NO_EOS);
    char tj[1100];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", tokdir);
    uint64_t hash;
    assert_int_equal(fy_tokfile_hash_file(tj, &hash), 0);
    assert_true(src.hash == hash);
    char full[PATH_MAX];
    assert_non_null(realpath(tj, full));
    assert_non_null(src.name);
    assert_string_equal(src.name, full);
    uint64_t i = 0, masked = 0, docs = 0;
    long tok, m, start;
    assert_int_equal(fy_tokfile_documents_are_records(t), 1);
    while (fscanf(f, "%ld %ld %ld", &tok, &m, &start) == 3) {
        assert_true(i < fy_tokfile_count(t));
        if (fy_tokfile_token(t, i) != (uint32_t)tok || fy_tokfile_trained(t, i) != m)
            fail_msg("%s (%s): token %llu is %u mask %d, transformers says %ld mask %ld", tokfile,
                     family, (unsigned long long)i, fy_tokfile_token(t, i),
                     fy_tokfile_trained(t, i), tok, m);
        if (start) { /* each conversation a document */
            assert_true(docs < fy_tokfile_documents(t));
            assert_int_equal(fy_tokfile_document_start(t, docs), i);
            docs++;
        }
        masked += m == 0;
        i++;
    }
    fclose(f);
    assert_int_equal(i, fy_tokfile_count(t));
    assert_int_equal(masked, fy_tokfile_masked(t));
    assert_int_equal(docs, fy_tokfile_documents(t));
    print_message("%s: %llu tokens, %llu trained: every token as apply_chat_template's, every mask "
                  "bit as its assistant mask\n",
                  family, (unsigned long long)i, (unsigned long long)(i - masked));
    fy_tokfile_destroy(&t);
}

static void test_chat_templates(void **state)
{
    if (skip_without(have_chat, "transformers"))
        skip();
    static const char *const families[] = {"qwen2.5", "qwen3", "llama3", "llama3.2", "mistral"};
    for (size_t k = 0; k < sizeof families / sizeof *families; k++) {
        const char *d = build_family(families[k]);
        char tokdir[1024], tj[1100], out[1100];
        snprintf(tokdir, sizeof tokdir, "%s", d);
        snprintf(tj, sizeof tj, "%s/tokenizer.json", tokdir);
        snprintf(out, sizeof out, "%s/chat-%s.tok", dir, families[k]);
        /* the directory, and for one family the file itself */
        const char *args[] = {"prepare", "--out", out, "--tokenizer", k == 0 ? tj : tokdir,
                              "--jsonl", "--messages-field", "messages", CONVERSATIONS, NULL};
        launch_ok(args);
        assert_int_equal(fy_test_count_matches(log_path, "end-of-sequence token"), 0);
        const char *inputs[] = {CONVERSATIONS, NULL};
        check_chat(tokdir, families[k], "messages", out, inputs);
    }
    /* two inputs, another field name */
    write_text(tpath("dialogs.jsonl"),
               "{\"dialog\": [{\"role\": \"user\", \"content\": \"hello there\"}, "
               "{\"role\": \"assistant\", \"content\": \"hello world\"}]}\n");
    const char *d = build_family("qwen2.5");
    char tokdir[1024];
    snprintf(tokdir, sizeof tokdir, "%s", d);
    const char *two[] = {"prepare", "--out", tpath("two.tok"), "--tokenizer", tokdir, "--jsonl",
                         "--messages-field", "dialog", tpath("dialogs.jsonl"),
                         tpath("dialogs.jsonl"), NULL};
    launch_ok(two);
    const char *inputs[] = {tpath("dialogs.jsonl"), tpath("dialogs.jsonl"), NULL};
    check_chat(tokdir, "qwen2.5", "dialog", tpath("two.tok"), inputs);
}

/* A directory with the tokenizer.json of `family` and this tokenizer_config.json. */
static const char *with_config(const char *name, const char *family, const char *config)
{
    static char d[1024];
    char from[1100], to[1100];
    const char *src = build_family(family);
    snprintf(from, sizeof from, "%s/tokenizer.json", src);
    snprintf(d, sizeof d, "%s/%s", dir, name);
    assert_int_equal(mkdir(d, 0700), 0);
    snprintf(to, sizeof to, "%s/tokenizer.json", d);
    char *text = fy_test_slurp(from, NULL);
    assert_non_null(text);
    write_text(to, text);
    free(text);
    snprintf(to, sizeof to, "%s/tokenizer_config.json", d);
    write_text(to, config);
    return d;
}

static void test_chat_refused(void **state)
{
    char out[1024];
    snprintf(out, sizeof out, "%s", tpath("bad.tok"));
    /* the options, refused before any Python runs */
    const char *with_text[] = {"prepare", "--out", out, "--tokenizer", tpath("x"), "--jsonl",
                               "--messages-field", "m", "--text-field", "t", CONVERSATIONS, NULL};
    expect_usage(with_text, out, "--messages-field takes the whole conversation");
    const char *with_pair[] = {"prepare", "--out", out, "--tokenizer", tpath("x"), "--jsonl",
                               "--messages-field", "m", "--prompt-field", "p", "--response-field",
                               "r", CONVERSATIONS, NULL};
    expect_usage(with_pair, out, "--messages-field takes the whole conversation");
    const char *no_jsonl[] = {"prepare", "--out", out, "--tokenizer", tpath("x"),
                              "--messages-field", "m", CONVERSATIONS, NULL};
    expect_usage(no_jsonl, out, "need --jsonl, or Parquet inputs");
    const char *no_tok[] = {"prepare", "--out", out, "--jsonl", "--messages-field", "m",
                            CONVERSATIONS, NULL};
    expect_usage(no_tok, out, "--messages-field needs --tokenizer");
    const char *other_cmd[] = {"train", "--messages-field", "m", NULL};
    assert_int_equal(launch(other_cmd), 2);
    assert_true(fy_test_file_contains(log_path, "--messages-field does not apply to train"));

    if (skip_without(have_chat, "transformers"))
        skip();
    char qwen[1024], tj[1100];
    snprintf(qwen, sizeof qwen, "%s", build_family("qwen2.5"));
    snprintf(tj, sizeof tj, "%s/tokenizer.json", qwen);

    /* a tokenizer without a chat template */
    const char *plain = with_config("notemplate", "qwen2.5", "{\"eos_token\": \"<|im_end|>\"}");
    const char *nt[] = {"prepare", "--out", out, "--tokenizer", plain, "--jsonl",
                        "--messages-field", "messages", CONVERSATIONS, NULL};
    expect_refused(nt, out, "the tokenizer has no chat template");

    /* malformed lines: each one line naming the file, the line and what */
    static const struct {
        const char *line, *want;
    } bad[] = {
        {"{\"other\": 1}", "bad.jsonl:2: no field 'messages' (the line has: other)"},
        {"{\"messages\": \"hi\"}", "bad.jsonl:2: field 'messages' is str, not a list of messages"},
        {"{\"messages\": []}", "bad.jsonl:2: field 'messages' is an empty list"},
        {"{\"messages\": [\"hi\"]}", "bad.jsonl:2: message 1 is str, not an object with a role"},
        {"{\"messages\": [{\"content\": \"hi\"}]}", "bad.jsonl:2: message 1 has no 'role' (it has: "
                                                  "content)"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
         "\"content\": null}]}",
         "bad.jsonl:2: message 2 has no 'content' (it has: role)"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": [\"hi\"]}, {\"role\": \"assistant\", "
         "\"content\": \"hello\"}]}",
         "bad.jsonl:2: message 1: 'content' is list, not a string"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
         "\"content\": \" \\n\"}]}",
         "bad.jsonl:2: message 2 (assistant): the content is empty"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}",
         "bad.jsonl:2: the conversation has no assistant message"},
    };
    const char *good = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": "
                       "\"assistant\", \"content\": \"hello\"}]}\n";
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char text[1024];
        snprintf(text, sizeof text, "%s%s\n", good, bad[i].line);
        write_text(tpath("bad.jsonl"), text);
        const char *args[] = {"prepare", "--out", out, "--tokenizer", qwen, "--jsonl",
                              "--messages-field", "messages", tpath("bad.jsonl"), NULL};
        expect_refused(args, out, bad[i].want);
    }

    /* the template's own exception: Mistral's roles must alternate */
    write_text(tpath("twice.jsonl"),
               "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"user\", "
               "\"content\": \"again\"}, {\"role\": \"assistant\", \"content\": \"hello\"}]}\n");
    const char *alt[] = {"prepare", "--out", out, "--tokenizer", build_family("mistral"),
                         "--jsonl", "--messages-field", "messages", tpath("twice.jsonl"), NULL};
    expect_refused(alt, out, "twice.jsonl:1: the chat template of ");
    assert_true(fy_test_file_contains(log_path, "refuses the conversation: After the optional "
                                                "system message, conversation roles must "
                                                "alternate"));

    /* Qwen3 renders the last turn according to a <think> block in the content */
    write_text(tpath("think.jsonl"),
               "{\"messages\": [{\"role\": \"user\", \"content\": \"3+4?\"}, {\"role\": "
               "\"assistant\", \"content\": \"<think>three plus four</think>Seven.\"}]}\n");
    const char *think[] = {"prepare", "--out", out, "--tokenizer", build_family("qwen3"),
                           "--jsonl", "--messages-field", "messages", tpath("think.jsonl"), NULL};
    expect_refused(think, out, "think.jsonl:1: near message 2 (assistant): the chat template "
                               "changes the content");

    /* a template whose assistant turns end with no special token */
    const char *base = with_config(
        "noend", "qwen2.5",
        "{\"chat_template\": \"{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\\n"
        "{% endfor %}\"}");
    const char *ne[] = {"prepare", "--out", out, "--tokenizer", base, "--jsonl",
                        "--messages-field", "messages", CONVERSATIONS, NULL};
    expect_refused(ne, out, "conversations.jsonl:1: message 2 (assistant): the chat template "
                            "follows its content with '\\n', not with a special token");

    /* a tokenizer file of another name */
    char *text = fy_test_slurp(tj, NULL);
    assert_non_null(text);
    write_text(tpath("other.json"), text);
    free(text);
    const char *named[] = {"prepare", "--out", out, "--tokenizer", tpath("other.json"), "--jsonl",
                           "--messages-field", "messages", CONVERSATIONS, NULL};
    expect_refused(named, out, "other.json: --messages-field loads the tokenizer from its "
                               "directory");

    /* transformers missing: a module of that name that fails to import shadows it */
    assert_int_equal(mkdir(tpath("shadow"), 0700), 0);
    write_text(tpath("shadow/transformers.py"), "raise ImportError('shadowed by the test')\n");
    setenv("PYTHONPATH", tpath("shadow"), 1);
    const char *nt2[] = {"prepare", "--out", out, "--tokenizer", qwen, "--jsonl",
                         "--messages-field", "messages", CONVERSATIONS, NULL};
    expect_refused(nt2, out, "cannot import the package 'transformers'");
    unsetenv("PYTHONPATH");
}

/* ---- Parquet ---- */

static void to_parquet(const char *jsonl, const char *parquet)
{
    const char *args[] = {ref_script, "parquet", jsonl, parquet, "2", NULL};
    python(args);
}

static void assert_same_file(const char *a, const char *b)
{
    size_t la = 0, lb = 0;
    char *ta = fy_test_slurp(a, &la), *tb = fy_test_slurp(b, &lb);
    assert_non_null(ta);
    assert_non_null(tb);
    if (la != lb || memcmp(ta, tb, la) != 0)
        fail_msg("%s (%zu bytes) and %s (%zu bytes) differ", a, la, b, lb);
    free(ta);
    free(tb);
}

/* prepare `opts` of the Parquet file and of its JSON lines: the same token file, byte for byte. */
static void same_as_jsonl(const char *name, const char *jsonl, const char *parquet,
                          const char *const *opts)
{
    char a[1100], b[1100];
    snprintf(a, sizeof a, "%s/%s-jsonl.tok", dir, name);
    snprintf(b, sizeof b, "%s/%s-parquet.tok", dir, name);
    const char *args[24] = {"prepare", "--out", a, "--jsonl"};
    int n = 4;
    for (const char *const *o = opts; *o; o++)
        args[n++] = *o;
    args[n] = jsonl;
    launch_ok(args);
    /* the Parquet file without --jsonl */
    args[2] = b;
    for (int i = 3; i < n; i++)
        args[i] = args[i + 1];
    args[n - 1] = parquet;
    args[n] = NULL;
    launch_ok(args);
    assert_same_file(a, b);
    struct fy_tokfile *t;
    assert_int_equal(fy_tokfile_open(&t, b, 0), 0);
    print_message("%s: %s and %s give the same %llu tokens (%llu masked)\n", name, jsonl, parquet,
                  (unsigned long long)fy_tokfile_count(t),
                  (unsigned long long)fy_tokfile_masked(t));
    fy_tokfile_destroy(&t);
}

static void write_records(void)
{
    write_text(tpath("text.jsonl"), "{\"body\": \"the quick brown fox\", \"n\": 1}\n"
                                    "{\"body\": \"jumps over\", \"n\": 2}\n"
                                    "{\"body\": \"the lazy dog\", \"n\": 3}\n"
                                    "{\"body\": \"caf\\u00e9 \\u2014 na\\u00efve\", \"n\": 4}\n"
                                    "{\"body\": \"hello world\", \"n\": 5}\n");
    write_text(tpath("pairs.jsonl"),
               "{\"prompt\": \"what is two plus two?\", \"response\": \"It is four.\"}\n"
               "{\"prompt\": \"\", \"response\": \"the lazy dog\"}\n"
               "{\"prompt\": \"say hello\", \"response\": \"hello world\"}\n");
}

static void test_parquet_like_jsonl(void **state)
{
    if (skip_without(have_pyarrow, "pyarrow"))
        skip();
    write_records();
    to_parquet(tpath("text.jsonl"), tpath("text.parquet"));
    to_parquet(tpath("pairs.jsonl"), tpath("pairs.parquet"));
    const char *body[] = {"--text-field", "body", NULL};
    same_as_jsonl("bytes-text", tpath("text.jsonl"), tpath("text.parquet"), body);
    const char *pair[] = {"--prompt-field", "prompt", "--response-field", "response", NULL};
    same_as_jsonl("bytes-pair", tpath("pairs.jsonl"), tpath("pairs.parquet"), pair);

    /* JSONL and Parquet in one run with --jsonl: as the JSONL twice */
    const char *mixed[] = {"prepare", "--out", tpath("mixed.tok"), "--jsonl", "--text-field",
                           "body", tpath("text.parquet"), tpath("text.jsonl"), NULL};
    launch_ok(mixed);
    const char *twice[] = {"prepare", "--out", tpath("twice.tok"), "--jsonl", "--text-field",
                           "body", tpath("text.jsonl"), tpath("text.jsonl"), NULL};
    launch_ok(twice);
    assert_same_file(tpath("mixed.tok"), tpath("twice.tok"));

    if (skip_without(have_tokenizers, "tokenizers"))
        skip();
    char qwen[1024];
    snprintf(qwen, sizeof qwen, "%s", build_family("qwen2.5"));
    const char *hf_text[] = {"--tokenizer", qwen, "--text-field", "body", NULL};
    same_as_jsonl("hf-text", tpath("text.jsonl"), tpath("text.parquet"), hf_text);
    const char *hf_pair[] = {"--tokenizer", qwen, "--prompt-field", "prompt", "--response-field",
                             "response", NULL};
    same_as_jsonl("hf-pair", tpath("pairs.jsonl"), tpath("pairs.parquet"), hf_pair);

    if (skip_without(have_chat, "transformers"))
        skip();
    /* conversations: a list of structs, whose keys absent from a message are nulls */
    to_parquet(CONVERSATIONS, tpath("conversations.parquet"));
    char tok[1024];
    snprintf(tok, sizeof tok, "%s", build_family("llama3.2"));
    const char *chat[] = {"--tokenizer", tok, "--messages-field", "messages", NULL};
    same_as_jsonl("chat-llama3.2", CONVERSATIONS, tpath("conversations.parquet"), chat);
}

static void test_parquet_refused(void **state)
{
    char out[1024];
    snprintf(out, sizeof out, "%s", tpath("bad.tok"));
    write_text(tpath("doc.txt"), "some text\n");
    write_text(tpath("fake.parquet"), "not parquet\n");
    /* Parquet with text, without --jsonl: refused before any Python runs */
    const char *mixed[] = {"prepare", "--out", out, tpath("fake.parquet"), tpath("doc.txt"), NULL};
    expect_usage(mixed, out, "fake.parquet is Parquet and ");
    assert_true(fy_test_file_contains(log_path, "doc.txt is not: give --jsonl"));

    if (skip_without(have_pyarrow, "pyarrow"))
        skip();
    const char *fake[] = {"prepare", "--out", out, tpath("fake.parquet"), NULL};
    expect_refused(fake, out, "fake.parquet: not a Parquet file pyarrow reads");

    write_records();
    to_parquet(tpath("pairs.jsonl"), tpath("pairs.parquet"));
    const char *nocol[] = {"prepare", "--out", out, "--prompt-field", "question",
                           "--response-field", "response", tpath("pairs.parquet"), NULL};
    expect_refused(nocol, out, "pairs.parquet: no column 'question' (the file has: prompt, "
                               "response)");
    const char *notext[] = {"prepare", "--out", out, tpath("pairs.parquet"), NULL};
    expect_refused(notext, out, "pairs.parquet: no column 'text' (the file has: prompt, response)");

    write_text(tpath("nulls.jsonl"), "{\"prompt\": \"a\", \"response\": \"b\"}\n"
                                     "{\"prompt\": \"c\", \"response\": \"d\"}\n"
                                     "{\"prompt\": null, \"response\": \"e\"}\n");
    to_parquet(tpath("nulls.jsonl"), tpath("nulls.parquet"));
    const char *nulls[] = {"prepare", "--out", out, "--prompt-field", "prompt", "--response-field",
                           "response", tpath("nulls.parquet"), NULL};
    expect_refused(nulls, out, "nulls.parquet: row 3: field 'prompt' is null, not a string");

    /* pyarrow missing: a package of that name that fails to import shadows it */
    assert_int_equal(mkdir(tpath("noarrow"), 0700), 0);
    assert_int_equal(mkdir(tpath("noarrow/pyarrow"), 0700), 0);
    write_text(tpath("noarrow/pyarrow/__init__.py"), "raise ImportError('shadowed by the test')\n");
    setenv("PYTHONPATH", tpath("noarrow"), 1);
    const char *noarrow[] = {"prepare", "--out", out, "--prompt-field", "prompt",
                             "--response-field", "response", tpath("pairs.parquet"), NULL};
    expect_refused(noarrow, out, "cannot import the package 'pyarrow'");
    unsetenv("PYTHONPATH");
}

int main(void)
{
    if (fy_trainutil_start("test_prepare_chat") != 0)
        return 1;
    dir = fy_test_tmpdir("prepare-chat");
    if (dir == NULL) {
        fprintf(stderr, "test_prepare_chat: cannot create a temporary directory\n");
        return 1;
    }
    snprintf(log_path, sizeof log_path, "%s/launch.log", dir);
    in_ci = fy_test_in_ci();
    if (fy_refmodel_script("chat_ref.py", ref_script, sizeof ref_script) != 0 ||
        access(CONVERSATIONS, R_OK) != 0) {
        fprintf(stderr, "test_prepare_chat: tests/reference/ or tests/fixtures/ not found: run "
                        "from the repository root\n");
        return 1;
    }
    have_tokenizers = fy_refmodel_python_has("tokenizers");
    have_chat = have_tokenizers && fy_refmodel_python_has("transformers, jinja2");
    have_pyarrow = fy_refmodel_python_has("pyarrow");
    if (!have_chat || !have_pyarrow)
        printf("test_prepare_chat: python3 cannot import %s%s%s: those tests %s\n",
               have_chat ? "" : "transformers (with tokenizers and jinja2)",
               !have_chat && !have_pyarrow ? " and " : "", have_pyarrow ? "" : "pyarrow",
               in_ci ? "FAIL under CI" : "are skipped");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_templates),
        cmocka_unit_test(test_chat_refused),
        cmocka_unit_test(test_parquet_like_jsonl),
        cmocka_unit_test(test_parquet_refused),
    };
    struct CMUnitTest run[sizeof tests / sizeof tests[0]];
    size_t wanted = 0;
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (fy_test_wanted(tests[i].name))
            run[wanted++] = tests[i];
    int failed = _cmocka_run_group_tests("prepare_chat (integration)", run, wanted, NULL, NULL);
    if (failed == 0)
        fy_test_rmdir(dir);
    free(dir);
    return failed ? 1 : 0;
}
