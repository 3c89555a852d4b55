/* `fuyou-launch prepare` end to end, and training on what it writes:
 * - plain text with the byte tokenizer: the version 3 layout byte for byte (the bytes as tokens,
 *   the byte-level tokenizer, each text file a document);
 * - JSONL with the byte tokenizer: a text field, prompt/response pairs with the prompt masked;
 * - a real Hugging Face tokenizer.json (two tiny ones built by tests/reference/prepare_ref.py with
 *   the `tokenizers` library: a byte-level BPE with <s>/</s> and a word-level one without an EOS):
 *   text, JSONL text and prompt/response pairs, every token and mask bit against the library's own
 *   encoding, and the header's tokenizer identity;
 * - every bad input: one error line naming the file (and line), exit status 1, no file left;
 * - a prepare stopped by SIGINT or SIGTERM while the helper streams: exit status 130, one line that
 *   says so, no temporary file, the directories made for --out removed, a file it would replace
 *   untouched, the helper gone;
 * - training honours the mask: `train --inprocess` on a prepared prompt/response file reports the
 *   loss of a float64 reference (tests/reference/gpt_ref.py) given the same batch with the masked
 *   targets ignored, and a training split whose targets are all masked trains with loss 0, saying
 *   so once;
 * - train checks the data's tokenizer: a run imported with a tokenizer.json (RUN/hf/) refuses a
 *   token file of another tokenizer or of the byte-level one, naming both hashes and the fix, and
 *   trains on one of its own; a byte-level model made by init refuses a Hugging Face token file.
 * The tokenizer tests skip (saying so) without python3's `tokenizers`, and fail under CI=true; the
 * reference comparison skips without numpy likewise. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/model/model.h"
#include "common/formats/tokfile.h"
#include "common/formats/tokwriter.h"
#include "gpu_worker/backend.h"
#include "tests/refmodel.h"
#include "tests/testutil.h"

#define RUN_TIMEOUT_S 120

static char *dir;
static char log_path[512];
static char ref_script[4096], gpt_ref_script[4096];
static int have_tokenizers, have_numpy, in_ci;

static const char *tpath(const char *name) { return fy_test_path(dir, name); }

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
}

/* Runs fuyou-launch with args (NULL-terminated); its exit code, output in log_path. */
static int launch(const char *const *args)
{
    int rc = fy_test_launch(log_path, args, RUN_TIMEOUT_S);
    if (rc < 0)
        fail_msg("fuyou-launch did not exit normally within %d s", RUN_TIMEOUT_S);
    return rc;
}

static int count_lines_with(const char *path, const char *needle)
{
    char *text = fy_test_slurp(path, NULL);
    int n = 0;
    for (char *p = text; p != NULL && (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    free(text);
    return n;
}

static int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

static void le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static int python(const char *const *args)
{
    char *argv[32];
    int n = 0;
    argv[n++] = "python3";
    for (; *args && n < 31; args++)
        argv[n++] = (char *)*args;
    argv[n] = NULL;
    return fy_refmodel_run(argv, RUN_TIMEOUT_S);
}

static int skip_without(int have, const char *what)
{
    if (have)
        return 0;
    if (in_ci)
        fail_msg("python3 %s is missing under CI: .ci/run installs it", what);
    printf("test_prepare: skipped: python3 with %s is needed\n", what);
    return 1;
}

/* ---- byte tokenizer ---- */

/* A JSONL file of `lines` records, large enough that the helper streams for a few seconds. */
static void write_big_jsonl(const char *path, int lines)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (int i = 0; i < lines; i++)
        assert_true(fprintf(f,
                            "{\"text\": \"record %d: some words to tokenize byte by byte, and "
                            "more words after them to make the line long\"}\n",
                            i) > 0);
    assert_int_equal(fclose(f), 0);
}

/* prepare --jsonl through the helper, stopped by `sig` once its temporary file exists: exit 130,
 * "stopped by signal", nothing left of the run (no .tmp, no directory made for --out), the file
 * that --overwrite would have replaced as it was, and no helper left. */
static void stop_prepare_with(int sig, const char *out, const char *made_dir)
{
    char tmp[600], input[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    snprintf(input, sizeof input, "%s", tpath("prepare-stop.jsonl"));
    const char *args[] = {"prepare", "--jsonl", "--overwrite", "--out", out, input, NULL};
    unlink(log_path);
    int pid = fy_test_start("fuyou-launch", args, log_path);
    assert_true(pid > 0);
    double t0 = fy_test_now_s();
    while (!exists(tmp) && fy_test_now_s() - t0 < 60)
        fy_test_pause_ms(5);
    assert_true(exists(tmp)); /* the helper began streaming: the token file is being written */
    assert_int_equal(kill(pid, sig), 0);
    int status = fy_test_wait(pid, RUN_TIMEOUT_S);
    assert_true(status != -1 && WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 130); /* not 0: the input takes seconds to stream */
    assert_int_equal(count_lines_with(log_path, "stopped by signal before prepare was done: "), 1);
    assert_false(exists(tmp));
    if (made_dir != NULL)
        assert_false(exists(made_dir));
    /* the tokenizer helper, whose command line names the input (the launcher has exited) */
    for (int i = 0; i < 200 && fy_test_count_processes(input) > 0; i++)
        fy_test_pause_ms(10); /* it ends on the launcher's SIGTERM */
    assert_int_equal(fy_test_count_processes(input), 0);
}

static void test_stopped_by_signal(void **state)
{
    write_big_jsonl(tpath("prepare-stop.jsonl"), 800000);
    /* --out in directories that do not exist yet: made, then removed again */
    char made[600], out[700];
    snprintf(made, sizeof made, "%s", tpath("stop-made"));
    snprintf(out, sizeof out, "%s/deeper/data.tok", made);
    stop_prepare_with(SIGINT, out, made);
    /* a file --overwrite would replace stays as it was */
    write_text(tpath("stop-old.tok"), "not a token file, but the user's");
    stop_prepare_with(SIGTERM, tpath("stop-old.tok"), NULL);
    char *kept = fy_test_slurp(tpath("stop-old.tok"), NULL);
    assert_non_null(kept);
    assert_string_equal(kept, "not a token file, but the user's");
    free(kept);
    unlink(tpath("stop-old.tok"));
    unlink(tpath("prepare-stop.jsonl"));
}

static void test_bytes_text_layout(void **state)
{
    const char *a = "First file.\n", *b = "Second \xc3\xa9 file, no newline";
    write_text(tpath("a.txt"), a);
    write_text(tpath("b.txt"), b);
    const char *args[] = {"prepare", "--out", tpath("ab.tok"), tpath("a.txt"), tpath("b.txt"), NULL};
    assert_int_equal(launch(args), 0);
    assert_true(fy_test_file_contains(log_path, "tokens (byte-level, vocabulary 256)"));
    assert_true(fy_test_file_contains(log_path, "2 documents, each a whole text file"));

    /* The version 3 layout, byte for byte: header slots (the byte-level tokenizer, no EOS, two
     * documents of text files), the bytes and zeros to 4 KiB, the document index likewise. */
    size_t n = strlen(a) + strlen(b), len = 0;
    uint8_t want[12288] = {0};
    le32(want + 0, FY_TOKFILE_MAGIC);
    le32(want + 4, 3);
    le32(want + 8, 1);
    le32(want + 12, 256);
    le32(want + 16, (uint32_t)n);
    le32(want + 28, FY_TOKENIZER_BYTES);
    le32(want + 40, FY_TOKFILE_NO_EOS);
    le32(want + 52, 2);
    le32(want + 60, fy_tokfile_header_checksum_v3(want));
    memcpy(want + 4096, a, strlen(a));
    memcpy(want + 4096 + strlen(a), b, strlen(b));
    le32(want + 8192 + 8, (uint32_t)strlen(a));
    uint8_t *got = (uint8_t *)fy_test_slurp(tpath("ab.tok"), &len);
    assert_non_null(got);
    assert_int_equal(len, sizeof want);
    assert_memory_equal(got, want, sizeof want);
    free(got);
}

static void test_bytes_jsonl(void **state)
{
    write_text(tpath("t.jsonl"), "{\"text\": \"ab\"}\n\n{\"text\": \"\\u00e9\", \"other\": 1}\n");
    const char *args[] = {"prepare", "--out", tpath("t.tok"), "--jsonl", tpath("t.jsonl"), NULL};
    assert_int_equal(launch(args), 0);
    struct fy_tokfile *t;
    assert_int_equal(fy_tokfile_open(&t, tpath("t.tok"), 256), 0);
    assert_int_equal(fy_tokfile_version(t), 3);
    assert_int_equal(fy_tokfile_source(t).tokenizer, FY_TOKENIZER_BYTES);
    /* each line a document (a record); the blank line none */
    assert_int_equal(fy_tokfile_documents(t), 2);
    assert_int_equal(fy_tokfile_documents_are_records(t), 1);
    assert_int_equal(fy_tokfile_document_start(t, 1), 2);
    assert_int_equal(fy_tokfile_source(t).eos, FY_TOKFILE_NO_EOS);
    const uint8_t want[] = {'a', 'b', 0xc3, 0xa9};
    assert_int_equal(fy_tokfile_count(t), sizeof want);
    assert_int_equal(fy_tokfile_masked(t), 0);
    for (size_t i = 0; i < sizeof want; i++)
        assert_int_equal(fy_tokfile_token(t, i), want[i]);
    fy_tokfile_destroy(&t);

    write_text(tpath("p.jsonl"), "{\"q\": \"Hi?\", \"a\": \"Yo\"}\n{\"q\": \"\", \"a\": \"Z\"}\n");
    const char *pargs[] = {"prepare", "--out", tpath("p.tok"), "--jsonl", "--prompt-field", "q",
                           "--response-field", "a", tpath("p.jsonl"), NULL};
    assert_int_equal(launch(pargs), 0);
    assert_true(fy_test_file_contains(log_path, "6 tokens, 3 of them masked out of the loss"));
    assert_int_equal(fy_tokfile_open(&t, tpath("p.tok"), 256), 0);
    const char *toks = "Hi?YoZ";
    const int mask[] = {0, 0, 0, 1, 1, 1};
    assert_int_equal(fy_tokfile_count(t), 6);
    assert_int_equal(fy_tokfile_masked(t), 3);
    for (int i = 0; i < 6; i++) {
        assert_int_equal(fy_tokfile_token(t, (uint64_t)i), (uint8_t)toks[i]);
        assert_int_equal(fy_tokfile_trained(t, (uint64_t)i), mask[i]);
    }
    fy_tokfile_destroy(&t);
}

/* ---- Hugging Face tokenizers ---- */

/* Compares a prepared file with prepare_ref.py's expectation for the same inputs. */
static void check_against_reference(const char *tok_json, const char *mode, const char *tokfile,
                                    const char *const *inputs)
{
    const char *exp = tpath("expect.txt");
    const char *args[16] = {ref_script, "expect", tok_json, mode, exp};
    int n = 5;
    for (; *inputs; inputs++)
        args[n++] = *inputs;
    args[n] = NULL;
    assert_int_equal(python(args), 0);
    FILE *f = fopen(exp, "r");
    assert_non_null(f);
    long vocab, eos;
    assert_int_equal(fscanf(f, "vocab %ld eos %ld", &vocab, &eos), 2);
    struct fy_tokfile *t;
    assert_int_equal(fy_tokfile_open(&t, tokfile, (uint32_t)vocab), 0);
    assert_int_equal(fy_tokfile_vocab(t), vocab);
    struct fy_tokfile_source src = fy_tokfile_source(t);
    assert_int_equal(src.tokenizer, FY_TOKENIZER_HF);
    assert_int_equal(src.eos, eos < 0 ? FY_TOKFILE_NO_EOS : (uint32_t)eos);
    uint64_t hash;
    assert_int_equal(fy_tokfile_hash_file(tok_json, &hash), 0);
    assert_true(src.hash == hash);
    char full[PATH_MAX];
    assert_non_null(realpath(tok_json, full));
    assert_non_null(src.name);
    assert_string_equal(src.name, full);
    uint64_t i = 0, masked = 0, docs = 0;
    long tok, m, start;
    /* every document where it starts: a text file, or a record */
    assert_int_equal(fy_tokfile_documents_are_records(t), strcmp(mode, "text") != 0);
    while (fscanf(f, "%ld %ld %ld", &tok, &m, &start) == 3) {
        assert_true(i < fy_tokfile_count(t));
        if (fy_tokfile_token(t, i) != (uint32_t)tok || fy_tokfile_trained(t, i) != m)
            fail_msg("%s (%s): token %llu is %u mask %d, the tokenizer says %ld mask %ld", tokfile,
                     mode, (unsigned long long)i, fy_tokfile_token(t, i), fy_tokfile_trained(t, i),
                     tok, m);
        if (start) {
            assert_true(docs < fy_tokfile_documents(t));
            if (fy_tokfile_document_start(t, docs) != i)
                fail_msg("%s (%s): document %llu starts at token %llu, not %llu", tokfile, mode,
                         (unsigned long long)docs,
                         (unsigned long long)fy_tokfile_document_start(t, docs),
                         (unsigned long long)i);
            docs++;
        }
        masked += m == 0;
        i++;
    }
    fclose(f);
    assert_int_equal(i, fy_tokfile_count(t));
    assert_int_equal(masked, fy_tokfile_masked(t));
    assert_int_equal(docs, fy_tokfile_documents(t));
    print_message("%s, %s: %llu tokens (%llu masked) in %llu documents, vocabulary %ld, eos %ld: "
                  "every token, mask bit and document start as the tokenizer's own encoding\n",
                  tok_json, mode, (unsigned long long)i, (unsigned long long)masked,
                  (unsigned long long)docs, vocab, eos);
    fy_tokfile_destroy(&t);
}

static void prepare_and_check(const char *kind, const char *tok_arg, const char *tok_json)
{
    char out[1024];
    const char *text[] = {tpath("doc1.txt"), tpath("doc2.txt"), NULL};
    snprintf(out, sizeof out, "%s", tpath("hf-text.tok"));
    const char *a1[] = {"prepare", "--overwrite", "--out", out, "--tokenizer", tok_arg,
                        text[0], text[1], NULL};
    assert_int_equal(launch(a1), 0);
    check_against_reference(tok_json, "text", out, text);

    const char *jt[] = {tpath("docs.jsonl"), NULL};
    const char *a2[] = {"prepare", "--overwrite", "--out", out, "--tokenizer", tok_arg,
                        "--jsonl", "--text-field", "text", jt[0], NULL};
    assert_int_equal(launch(a2), 0);
    check_against_reference(tok_json, "jsonl-text", out, jt);

    const char *jp[] = {tpath("pairs.jsonl"), tpath("pairs2.jsonl"), NULL};
    const char *a3[] = {"prepare", "--overwrite", "--out", out, "--tokenizer", tok_arg, "--jsonl",
                        "--prompt-field", "prompt", "--response-field", "response", jp[0], jp[1],
                        NULL};
    assert_int_equal(launch(a3), 0);
    check_against_reference(tok_json, "jsonl-pair", out, jp);
    (void)kind;
}

static void write_hf_inputs(void)
{
    write_text(tpath("doc1.txt"), "the quick brown fox\njumps over the lazy dog\n\nhello world\n");
    write_text(tpath("doc2.txt"), "caf\xc3\xa9 na\xc3\xafve: what is two plus two?");
    write_text(tpath("docs.jsonl"), "{\"text\": \"hello there, world\"}\n"
                                    "{\"text\": \"It is four.\", \"id\": 7}\n\n");
    write_text(tpath("pairs.jsonl"),
               "{\"prompt\": \"what is two plus two?\", \"response\": \"It is four.\"}\n"
               "{\"prompt\": \"\", \"response\": \"the lazy dog\"}\n");
    write_text(tpath("pairs2.jsonl"),
               "{\"response\": \"hello world\", \"prompt\": \"caf\\u00e9 \\u2014 unicode?\"}\n");
}

static void test_hf_tokenizers(void **state)
{
    if (skip_without(have_tokenizers, "the package tokenizers"))
        skip();
    write_hf_inputs();
    const char *kinds[] = {"bpe", "wordlevel"};
    for (int k = 0; k < 2; k++) {
        char d[1024], tj[1100];
        snprintf(d, sizeof d, "%s/tok-%s", dir, kinds[k]);
        assert_int_equal(mkdir(d, 0700), 0);
        const char *b[] = {ref_script, "build", d, kinds[k], NULL};
        assert_int_equal(python(b), 0);
        snprintf(tj, sizeof tj, "%s/tokenizer.json", d);
        /* the directory for the BPE one (its tokenizer_config.json names the EOS), the file for
         * the word-level one */
        prepare_and_check(kinds[k], k == 0 ? d : tj, tj);
    }
}

/* ---- bad inputs ---- */

/* Runs prepare with args; expects exit `status`, exactly one error line containing want, no
 * output. */
static void expect_refused_with(const char *const *args, const char *out, const char *want,
                                int status)
{
    int rc = launch(args);
    if (rc != status || !fy_test_file_contains(log_path, want) ||
        count_lines_with(log_path, "error:") != 1) {
        char *text = fy_test_slurp(log_path, NULL);
        fail_msg("expected exit %d and one error line with '%s'; got exit %d and:\n%s", status,
                 want, rc, text ? text : "(no log)");
    }
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    assert_false(exists(out));
    assert_false(exists(tmp));
    snprintf(tmp, sizeof tmp, "%s.tmp.mask", out);
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

static void test_bad_inputs(void **state)
{
    char out[1024];
    snprintf(out, sizeof out, "%s", tpath("bad.tok"));
    struct {
        const char *name, *content, *want;
        int pair;
    } cases[] = {
        {"badjson.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"no end}\n", "badjson.jsonl:2: invalid JSON", 0},
        {"nofield.jsonl", "{\"text\": \"ok\"}\n\n{\"body\": \"x\"}\n", "nofield.jsonl:3: no field 'text' (the line has: body)", 0},
        {"notstr.jsonl", "{\"text\": 12}\n", "notstr.jsonl:1: field 'text' is int, not a string", 0},
        {"empty.jsonl", "{\"text\": \"\"}\n", "empty.jsonl:1: field 'text' is empty", 0},
        {"list.jsonl", "[1, 2]\n", "list.jsonl:1: expected a JSON object, got list", 0},
        {"blank.jsonl", "\n  \n", "blank.jsonl: the input hold no text", 0},
        {"utf8.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"\xff\"}\n", "utf8.jsonl:2: not valid UTF-8", 0},
        {"noresp.jsonl", "{\"prompt\": \"p\", \"response\": \"r\"}\n{\"prompt\": \"p\"}\n",
         "noresp.jsonl:2: no field 'response' (the line has: prompt)", 1},
        {"emptyresp.jsonl", "{\"prompt\": \"p\", \"response\": \"\"}\n",
         "emptyresp.jsonl:1: field 'response' is empty", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_text(tpath(cases[i].name), cases[i].content);
        const char *text[] = {"prepare", "--out", out, "--jsonl", tpath(cases[i].name), NULL};
        const char *pair[] = {"prepare", "--out", out, "--jsonl", "--prompt-field", "prompt",
                              "--response-field", "response", tpath(cases[i].name), NULL};
        expect_refused(cases[i].pair ? pair : text, out, cases[i].want);
    }
    /* an empty JSONL file; a missing input */
    write_text(tpath("zero.jsonl"), "");
    const char *zero[] = {"prepare", "--out", out, "--jsonl", tpath("zero.jsonl"), NULL};
    expect_refused(zero, out, "zero.jsonl: the input hold no text: nothing to prepare");
    const char *missing[] = {"prepare", "--out", out, "--jsonl", tpath("nope.jsonl"), NULL};
    expect_refused(missing, out, "nope.jsonl: No such file or directory");
    /* options that do not go together: usage errors */
    const char *nojsonl[] = {"prepare", "--out", out, "--text-field", "x", tpath("zero.jsonl"), NULL};
    expect_usage(nojsonl, out, "need --jsonl");
    const char *half[] = {"prepare", "--out", out, "--jsonl", "--prompt-field", "p",
                          tpath("zero.jsonl"), NULL};
    expect_usage(half, out, "--prompt-field and --response-field together");
    /* an existing output is kept */
    write_text(tpath("keep.tok"), "keep");
    write_text(tpath("ok.jsonl"), "{\"text\": \"ok\"}\n");
    const char *keep[] = {"prepare", "--out", tpath("keep.tok"), "--jsonl", tpath("ok.jsonl"), NULL};
    assert_int_equal(launch(keep), 1);
    assert_true(fy_test_file_contains(log_path, "keep.tok already exists"));
    assert_true(fy_test_file_contains(tpath("keep.tok"), "keep"));

    /* tokenizer paths */
    assert_int_equal(mkdir(tpath("emptydir"), 0700), 0);
    const char *nodir[] = {"prepare", "--out", out, "--tokenizer", tpath("emptydir"),
                           tpath("ok.jsonl"), NULL};
    expect_refused(nodir, out, "the directory has no tokenizer.json");
    const char *notok[] = {"prepare", "--out", out, "--tokenizer", tpath("missing-model"),
                           tpath("ok.jsonl"), NULL};
    expect_refused(notok, out, "missing-model: No such file or directory");

    /* python3 missing: PATH without it */
    const char *path = getenv("PATH");
    char *saved = path ? strdup(path) : NULL;
    setenv("PATH", tpath("emptydir"), 1);
    const char *nopy[] = {"prepare", "--out", out, "--jsonl", tpath("ok.jsonl"), NULL};
    expect_refused(nopy, out, "needs python3 on PATH");
    if (saved)
        setenv("PATH", saved, 1);
    free(saved);

    /* the package tokenizers missing: a module of that name that fails to import shadows it */
    assert_int_equal(mkdir(tpath("shadow"), 0700), 0);
    write_text(tpath("shadow/tokenizers.py"), "raise ImportError('shadowed by test_prepare')\n");
    write_text(tpath("tokenizer.json"), "{}");
    setenv("PYTHONPATH", tpath("shadow"), 1);
    const char *notokz[] = {"prepare", "--out", out, "--tokenizer", tpath("tokenizer.json"),
                            tpath("ok.jsonl"), NULL};
    expect_refused(notokz, out, "cannot import the package 'tokenizers'");
    unsetenv("PYTHONPATH");
}

static void test_bad_tokenizer_inputs(void **state)
{
    if (skip_without(have_tokenizers, "the package tokenizers"))
        skip();
    char out[1024];
    snprintf(out, sizeof out, "%s", tpath("bad.tok"));
    assert_int_equal(mkdir(tpath("broken"), 0700), 0);
    write_text(tpath("broken/tokenizer.json"), "{\"version\": \"1.0\", \"model\": 3}");
    write_text(tpath("ok2.txt"), "hello\n");
    const char *broken[] = {"prepare", "--out", out, "--tokenizer", tpath("broken"),
                            tpath("ok2.txt"), NULL};
    expect_refused(broken, out, "not a tokenizer.json the tokenizers library loads");

    assert_int_equal(mkdir(tpath("wl"), 0700), 0);
    const char *b[] = {ref_script, "build", tpath("wl"), "wordlevel", NULL};
    assert_int_equal(python(b), 0);
    write_text(tpath("latin1.txt"), "fine line\nna\xefve\n");
    const char *latin[] = {"prepare", "--out", out, "--tokenizer", tpath("wl"),
                           tpath("latin1.txt"), NULL};
    expect_refused(latin, out, "latin1.txt:2: not valid UTF-8");
}

/* ---- training on a masked file ---- */

static const struct fy_model_config CFG = {.n_layer = 2, .n_head = 2, .n_embd = 16, .vocab = 256,
                                         .ctx = 16};
enum { B = 4, T = 16 };

static double metrics_loss(const char *run, int step)
{
    char p[1100], key[64];
    snprintf(p, sizeof p, "%s/metrics.jsonl", run);
    char *text = fy_test_slurp(p, NULL);
    assert_non_null(text);
    snprintf(key, sizeof key, "{\"step\": %d, \"loss\": ", step);
    char *at = strstr(text, key);
    assert_non_null(at);
    double v = strtod(at + strlen(key), NULL);
    free(text);
    return v;
}

static void test_masked_training_vs_reference(void **state)
{
    if (skip_without(have_numpy, "numpy"))
        skip();
    /* prompt/response pairs: about half the tokens masked */
    FILE *f = fopen(tpath("qa.jsonl"), "w");
    assert_non_null(f);
    for (int i = 0; i < 60; i++)
        fprintf(f, "{\"prompt\": \"what is %d plus %d? \", \"response\": \"%d.\"}\n", i, i, 2 * i);
    fclose(f);
    const char *prep[] = {"prepare", "--out", tpath("qa.tok"), "--jsonl", "--prompt-field",
                          "prompt", "--response-field", "response", tpath("qa.jsonl"), NULL};
    assert_int_equal(launch(prep), 0);
    const char *run = tpath("run");
    const char *init[] = {"init", "--run-dir", run, "--layers", "2", "--heads", "2", "--embd", "16",
                          "--vocab", "256", "--ctx", "16", "--seed", "7", NULL};
    assert_int_equal(launch(init), 0);
    /* windows: the batch fy_tokfile_batch draws, which the reference is given */
    const char *train[] = {
        "train",   "--run-dir", run,       "--data",      tpath("qa.tok"),  "--steps", "1",
        "--batch", "4",         "--seq",   "16",          "--eval-batches", "0",       "--seed",
        "5",       "--packing", "windows", "--inprocess", "--backend",      "cpu",     NULL};
    assert_int_equal(launch(train), 0);
    double ours = metrics_loss(run, 1);

    /* The same batch as train's step 1 (seed 5, the default eval fraction 0.1), the init weights,
     * through the float64 reference. */
    struct fy_refmodel m;
    assert_int_equal(fy_refmodel_init(&m, &CFG, B, T, 1), 0);
    for (unsigned u = 0; u < m.n_units; u++)
        fy_model_init_unit(&CFG, u, 7, m.params[u]);
    struct fy_tokfile *t;
    assert_int_equal(fy_tokfile_open(&t, tpath("qa.tok"), CFG.vocab), 0);
    assert_true(fy_tokfile_masked(t) > 0);
    assert_int_equal(fy_tokfile_split(t, 0.1), 0);
    assert_int_equal(fy_tokfile_batch(t, FY_TOKFILE_TRAIN, 5, 1, B, T, m.tokens, m.targets), 0);
    int ignored = 0;
    for (int i = 0; i < B * T; i++)
        ignored += m.targets[i] < 0;
    assert_true(ignored > 0 && ignored < B * T);
    char in[1100], outp[1100];
    snprintf(in, sizeof in, "%s", tpath("ref-in.bin"));
    snprintf(outp, sizeof outp, "%s", tpath("ref-out.bin"));
    assert_int_equal(fy_refmodel_write_input(&m, in), 0);
    char *argv[] = {"python3", gpt_ref_script, in, outp, NULL};
    assert_int_equal(fy_refmodel_run(argv, RUN_TIMEOUT_S), 0);
    struct fy_refmodel_output ref;
    assert_int_equal(fy_refmodel_read_output(&m, outp, &ref), 0);
    /* and the loss with every target counted (the same tokens without a mask, the same batch):
     * the mask must make a difference */
    uint64_t n = fy_tokfile_count(t);
    uint32_t *all = malloc(n * sizeof *all);
    assert_non_null(all);
    for (uint64_t i = 0; i < n; i++)
        all[i] = fy_tokfile_token(t, i);
    assert_int_equal(fy_tokfile_write(tpath("qa-nomask.tok"), all, n, 256, 0), 0);
    free(all);
    struct fy_tokfile *u;
    assert_int_equal(fy_tokfile_open(&u, tpath("qa-nomask.tok"), CFG.vocab), 0);
    assert_int_equal(fy_tokfile_split(u, 0.1), 0);
    assert_int_equal(fy_tokfile_batch(u, FY_TOKFILE_TRAIN, 5, 1, B, T, m.tokens, m.targets), 0);
    fy_tokfile_destroy(&u);
    for (int i = 0; i < B * T; i++)
        assert_true(m.targets[i] >= 0);
    struct fy_backend *cpu;
    assert_int_equal(fy_backend_open(&cpu, "cpu", 0), 0);
    assert_int_equal(fy_refmodel_forward_backward(&m, cpu), 0);
    double unmasked = m.loss;
    fy_backend_destroy(&cpu);
    double rel = fabs(ours - ref.loss) / fabs(ref.loss);
    print_message("masked training loss at step 1: train %.9g, float64 reference %.9g (relative "
                  "%.2e, bound 1e-5); %d of %d targets masked; with every target counted it "
                  "would be %.6g\n",
                  ours, ref.loss, rel, ignored, B * T, unmasked);
    assert_true(rel < 1e-5);
    assert_true(fabs(unmasked - ref.loss) > 1e-3);
    fy_refmodel_output_free(&m, &ref);
    fy_refmodel_free(&m);
    fy_tokfile_destroy(&t);
}

/* ---- train against the run's tokenizer ---- */

/* Runs train; expects exit 1 and one error line containing each of want (NULL-terminated). */
static void expect_train_refused(const char *run, const char *data, const char *const *want)
{
    const char *args[] = {"train", "--run-dir", run, "--data", data, "--steps", "1", "--batch",
                          "2", "--seq", "8", "--eval-batches", "0", "--backend", "cpu", NULL};
    int rc = launch(args), ok = rc == 1 && count_lines_with(log_path, "error:") == 1;
    for (; ok && *want; want++)
        ok = fy_test_file_contains(log_path, *want);
    if (!ok) {
        char *text = fy_test_slurp(log_path, NULL);
        fail_msg("train on %s: expected exit 1 and one error line saying so; got exit %d and:\n%s",
                 data, rc, text ? text : "(no log)");
    }
}

static void train_one_step(const char *run, const char *data, int inprocess)
{
    const char *args[] = {"train", "--run-dir", run, "--data", data, "--steps", "1", "--batch",
                          "2", "--seq", "8", "--eval-batches", "0", "--backend", "cpu",
                          inprocess ? "--inprocess" : NULL, NULL};
    int rc = launch(args);
    if (rc != 0) {
        char *text = fy_test_slurp(log_path, NULL);
        fail_msg("train on %s: exit %d:\n%s", data, rc, text ? text : "(no log)");
    }
}

static const char *fmt_hash(const char *tokenizer_json)
{
    uint64_t h;
    assert_int_equal(fy_tokfile_hash_file(tokenizer_json, &h), 0);
    return fy_test_fmt("%016llx", (unsigned long long)h);
}

static void copy_file(const char *from, const char *to)
{
    size_t len = 0;
    char *text = fy_test_slurp(from, &len);
    assert_non_null(text);
    FILE *f = fopen(to, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
    free(text);
}

/* A run imported from Hugging Face keeps its tokenizer.json in RUN/hf/: train takes a token file
 * of that tokenizer (prepared with it, or with RUN/hf itself), and refuses one of another
 * tokenizer or of the byte-level one (version 2, and version 1 of vocabulary 256), naming both
 * hashes; a version 1 file of another vocabulary is said unchecked. A run made by init keeps the
 * vocabulary check, and a byte-level one (vocabulary 256) refuses a Hugging Face token file. */
static void test_train_checks_tokenizer(void **state)
{
    if (skip_without(have_tokenizers, "the package tokenizers"))
        skip();
    char a[1024], b[1024], hf[1024], run[1024], run_tok[1100], run_hf[1100];
    snprintf(a, sizeof a, "%s", tpath("tokA"));
    snprintf(b, sizeof b, "%s", tpath("tokB"));
    snprintf(hf, sizeof hf, "%s", tpath("hfmodel"));
    snprintf(run, sizeof run, "%s", tpath("hfrun"));
    snprintf(run_hf, sizeof run_hf, "%s/hf", run);
    snprintf(run_tok, sizeof run_tok, "%s/hf/tokenizer.json", run);
    assert_int_equal(mkdir(a, 0700), 0);
    assert_int_equal(mkdir(b, 0700), 0);
    const char *ba[] = {ref_script, "build", a, "bpe", NULL};
    const char *bb[] = {ref_script, "build", b, "wordlevel", NULL};
    assert_int_equal(python(ba), 0);
    assert_int_equal(python(bb), 0);
    /* a model made here, exported with tokenizer A's files beside it, imported */
    const char *init[] = {"init", "--run-dir", tpath("made"), "--layers", "1", "--heads", "2",
                          "--embd", "16", "--vocab", "384", "--ctx", "16", NULL};
    assert_int_equal(launch(init), 0);
    const char *exp[] = {"export", "--run-dir", tpath("made"), "--to-hf", hf, NULL};
    assert_int_equal(launch(exp), 0);
    copy_file(fy_test_fmt("%s/tokenizer.json", a), fy_test_fmt("%s/tokenizer.json", hf));
    copy_file(fy_test_fmt("%s/tokenizer_config.json", a),
              fy_test_fmt("%s/tokenizer_config.json", hf));
    const char *imp[] = {"init", "--run-dir", run, "--from-hf", hf, NULL};
    assert_int_equal(launch(imp), 0);
    assert_true(exists(run_tok));

    FILE *f = fopen(tpath("corpus.txt"), "w");
    assert_non_null(f);
    for (int i = 0; i < 20; i++)
        fprintf(f, "the quick brown fox jumps over the lazy dog\n");
    fclose(f);
    f = fopen(tpath("corpus.jsonl"), "w"); /* five records: one held out, packed documents */
    assert_non_null(f);
    for (int i = 0; i < 5; i++)
        fprintf(f, "{\"text\": \"the quick brown fox jumps over the lazy dog, the quick brown "
                   "fox jumps over the lazy dog\"}\n");
    fclose(f);
    struct {
        const char *name, *tokenizer;
        int jsonl;
    } made[] = {{"a.tok", a, 0}, {"run.tok", run_hf, 0}, {"b.tok", b, 0},
                {"bytes1.tok", NULL, 0}, {"bytes2.tok", NULL, 1}};
    for (size_t i = 0; i < sizeof made / sizeof *made; i++) {
        const char *args[] = {"prepare", "--out", tpath(made[i].name),
                              made[i].jsonl ? "--jsonl" : tpath("corpus.txt"),
                              made[i].jsonl ? tpath("corpus.jsonl") : NULL, NULL, NULL, NULL};
        if (made[i].tokenizer != NULL) {
            args[4] = "--tokenizer";
            args[5] = made[i].tokenizer;
        }
        assert_int_equal(launch(args), 0);
    }
    char tok_a[1100], tok_b[PATH_MAX];
    snprintf(tok_a, sizeof tok_a, "%s/tokenizer.json", a);
    assert_non_null(realpath(fy_test_fmt("%s/tokenizer.json", b), tok_b)); /* as recorded */
    const char *hash_a = fmt_hash(tok_a), *hash_b = fmt_hash(tok_b);

    const char *other[] = {tpath("b.tok"),
                           fy_test_fmt("was made with another tokenizer than the run's: with %s "
                                       "(hash %s), the run's is %s (hash %s)",
                                       tok_b, hash_b, run_tok, hash_a),
                           fy_test_fmt("prepare the data again with --tokenizer %s", run_tok),
                           NULL};
    expect_train_refused(run, tpath("b.tok"), other);
    for (int v = 1; v <= 2; v++) {
        const char *data = tpath(v == 1 ? "bytes1.tok" : "bytes2.tok");
        const char *bytes[] = {data, "was made with the byte-level tokenizer",
                               fy_test_fmt("the run's model with %s (hash %s)", run_tok, hash_a),
                               NULL};
        expect_train_refused(run, data, bytes);
    }
    /* a version 1 file of vocabulary 300 (another tool's): said unchecked, then refused here
     * only for being shorter than a batch (no training needed to see the warning) */
    const uint32_t few[] = {1, 2, 3, 299};
    assert_int_equal(fy_tokfile_write(tpath("raw.tok"), few, 4, 300, 0), 0);
    const char *raw[] = {"eval fraction 0.1 of 4 tokens", NULL};
    expect_train_refused(run, tpath("raw.tok"), raw);
    assert_true(fy_test_file_contains(log_path, "does not record its tokenizer (a version 1 file "
                                                "of vocabulary 300)"));
    /* the run's own tokenizer, as given to prepare or as RUN/hf */
    train_one_step(run, tpath("a.tok"), 0);
    train_one_step(run, tpath("run.tok"), 0);

    /* runs made by init: the vocabulary check only, but a byte-level model refuses a Hugging
     * Face token file */
    const char *init256[] = {"init", "--run-dir", tpath("byterun"), "--layers", "1", "--heads",
                             "2", "--embd", "16", "--ctx", "16", NULL};
    assert_int_equal(launch(init256), 0);
    const char *byte_model[] = {tpath("b.tok"),
                                fy_test_fmt("the Hugging Face tokenizer %s (hash %s)", tok_b, hash_b),
                                "the byte-level vocabulary of 256",
                                "prepare the data without --tokenizer", NULL};
    expect_train_refused(tpath("byterun"), tpath("b.tok"), byte_model);
    train_one_step(tpath("byterun"), tpath("bytes1.tok"), 1);
    train_one_step(tpath("made"), tpath("a.tok"), 1);
    train_one_step(tpath("made"), tpath("bytes2.tok"), 1);
}

/* Every training target masked (the trained tokens are all in the eval split): loss 0 at every
 * step, said once; the eval loss is the held-out trained targets'. */
static void test_fully_masked_training(void **state)
{
    enum { N = 400 };
    uint32_t tok[N];
    uint8_t tr[N];
    for (int i = 0; i < N; i++) {
        tok[i] = (uint32_t)(i * 37 % 251);
        tr[i] = i >= 370; /* eval split: the last 40 tokens */
    }
    struct fy_tokfile_source src = {FY_TOKENIZER_BYTES, 0, FY_TOKFILE_NO_EOS, NULL};
    assert_int_equal(fy_tokfile_write_masked(tpath("allmasked.tok"), tok, tr, N, 256, &src, 0), 0);
    const char *run = tpath("run2");
    const char *init[] = {"init", "--run-dir", run, "--layers", "1", "--heads", "2", "--embd", "16",
                          "--ctx", "16", NULL};
    assert_int_equal(launch(init), 0);
    const char *train[] = {"train", "--run-dir", run, "--data", tpath("allmasked.tok"), "--steps",
                           "3", "--batch", "2", "--seq", "8", "--eval-every", "3",
                           "--eval-batches", "2", "--inprocess", "--backend", "cpu", NULL};
    assert_int_equal(launch(train), 0);
    for (int s = 1; s <= 3; s++)
        assert_true(metrics_loss(run, s) == 0.0);
    assert_int_equal(count_lines_with(log_path, "every target is masked out of the loss"), 1);
    assert_true(fy_test_file_contains(log_path, "training batch 1: every target is masked"));
    char p[1100];
    snprintf(p, sizeof p, "%s/metrics.jsonl", run);
    assert_true(fy_test_file_contains(p, "\"eval_loss\": "));
    assert_int_equal(count_lines_with(p, "\"eval_loss\": 0,"), 0);
}

int main(void)
{
    dir = fy_test_tmpdir("prepare");
    if (dir == NULL) {
        fprintf(stderr, "test_prepare: cannot create a temporary directory\n");
        return 1;
    }
    snprintf(log_path, sizeof log_path, "%s/launch.log", dir);
    in_ci = fy_test_in_ci();
    if (fy_refmodel_script("prepare_ref.py", ref_script, sizeof ref_script) != 0 ||
        fy_refmodel_script("gpt_ref.py", gpt_ref_script, sizeof gpt_ref_script) != 0) {
        fprintf(stderr, "test_prepare: tests/reference/ not found: run from the source tree or "
                        "set FUYOU_SRC\n");
        return 1;
    }
    have_tokenizers = fy_refmodel_python_has("tokenizers");
    have_numpy = fy_refmodel_python_has("numpy") && fy_refmodel_little_endian();
    if (!have_tokenizers)
        printf("test_prepare: python3 cannot import tokenizers: the Hugging Face tokenizer tests "
               "%s\n", in_ci ? "FAIL under CI" : "are skipped");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes_text_layout),
        cmocka_unit_test(test_bytes_jsonl),
        cmocka_unit_test(test_hf_tokenizers),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_stopped_by_signal),
        cmocka_unit_test(test_bad_tokenizer_inputs),
        cmocka_unit_test(test_masked_training_vs_reference),
        cmocka_unit_test(test_fully_masked_training),
        cmocka_unit_test(test_train_checks_tokenizer),
    };
    struct CMUnitTest run[sizeof tests / sizeof tests[0]];
    size_t wanted = 0; /* FY_TEST_ONLY: a few of them, by name (comma-separated globs) */
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (fy_test_wanted(tests[i].name))
            run[wanted++] = tests[i];
    int failed = _cmocka_run_group_tests("prepare (integration)", run, wanted, NULL, NULL);
    if (failed == 0)
        fy_test_rmdir(dir);
    free(dir);
    return failed ? 1 : 0;
}
