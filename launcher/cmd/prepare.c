/* `fuyou-launch prepare` (see prepare.h): options checked, the tokenizer helper found and run, its
 * record stream (documented in launcher/fuyou_tokenize.py) validated and written out. */
#include "launcher/cmd/prepare.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/base/check.h"
#include "common/base/knobs.h"
#include "common/formats/tokfile.h"
#include "common/formats/tokwriter.h"
#include "launcher/run/stopsig.h"

extern char **environ;

enum {
    REC_BEGIN = 1,
    REC_TRAINED = 2,
    REC_MASKED = 3,
    REC_ERROR = 4,
    REC_END = 5,
    REC_DOCUMENT = 6
};
#define STREAM_VERSION 2          /* the helper's STREAM_VERSION */
#define REC_TOKENS_MAX (1u << 20) /* the helper's RECORD_MAX */
#define REC_MESSAGE_MAX 4096
#define HELPER "fuyou_tokenize.py"

/* Where the helper lies: $FUYOU_TOKENIZE_SCRIPT, beside the executable, or launcher/ of the source
 * tree the executable was built in (BUILD/bin/fuyou-launch). */
static int find_helper(char *buf, size_t len)
{
    const char *env = fy_knob_tokenize_script();
    if (env != NULL) {
        FY_REQUIRE(access(env, R_OK) == 0, -ENOENT,
                   "FUYOU_TOKENIZE_SCRIPT=%s: %s: point it at launcher/" HELPER, env,
                   strerror(errno));
        snprintf(buf, len, "%s", env);
        return 0;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    FY_REQUIRE(n > 0, -ENOENT, "cannot find this program's directory (/proc/self/exe): %s",
               strerror(errno));
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash != NULL)
        *slash = 0;
    static const char *const tries[] = {"%s/" HELPER, "%s/../../launcher/" HELPER,
                                        "%s/../launcher/" HELPER, "%s/../share/fuyou/" HELPER};
    for (size_t i = 0; i < sizeof tries / sizeof tries[0]; i++) {
        snprintf(buf, len, tries[i], exe);
        if (access(buf, R_OK) == 0)
            return 0;
    }
    fy_error("cannot find the tokenizer helper " HELPER " beside %s or in its source tree's "
             "launcher/: set FUYOU_TOKENIZE_SCRIPT to its path",
             exe);
    return -ENOENT;
}

/* A tokenizer.json, or a directory holding one. */
static int resolve_tokenizer(const char *given, char *buf, size_t len)
{
    struct stat st;
    if (stat(given, &st) != 0) {
        int e = errno;
        fy_error("--tokenizer %s: %s: give the model's directory or its tokenizer.json", given,
                 strerror(e));
        return -e;
    }
    if (S_ISDIR(st.st_mode)) {
        snprintf(buf, len, "%s/tokenizer.json", given);
        if (stat(buf, &st) != 0) {
            fy_error("--tokenizer %s: the directory has no tokenizer.json (a Hugging Face fast "
                     "tokenizer; models with only a slow tokenizer can save one with "
                     "AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR))",
                     given);
            return -ENOENT;
        }
    } else {
        snprintf(buf, len, "%s", given);
    }
    FY_REQUIRE(S_ISREG(st.st_mode), -EINVAL, "--tokenizer %s is not a regular file", buf);
    return 0;
}

static int check_inputs(const char *const *inputs, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        struct stat st;
        if (stat(inputs[i], &st) != 0) {
            int e = errno;
            fy_error("cannot read input %s: %s (check the path and its permissions)", inputs[i],
                     strerror(e));
            return -e;
        }
        FY_REQUIRE(S_ISREG(st.st_mode), S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL,
                   "input %s is %s, not a regular file: give text, JSONL or Parquet files",
                   inputs[i], S_ISDIR(st.st_mode) ? "a directory" : "a special file");
        FY_REQUIRE(access(inputs[i], R_OK) == 0, -EACCES, "cannot read input %s: %s", inputs[i],
                   strerror(EACCES));
    }
    return 0;
}

/* An input read as Parquet: its name ends in .parquet (in any case). The helper's is_parquet. */
static int is_parquet(const char *path)
{
    size_t n = strlen(path);
    return n >= 8 && strcasecmp(path + n - 8, ".parquet") == 0;
}

/* ---- the helper's stream ---- */

struct stream {
    int fd;
    const char *what; /* for messages */
};

/* SIGINT or SIGTERM while preparing (fy_prepare_stop_on_signals): the stream's reads and the
 * token file's writes stop with -EINTR, and the preparation aborts. */
int fy_prepare_stop_on_signals(void)
{
    FY_TRY(fy_stopsig_install()); /* no SA_RESTART: a read from the helper returns EINTR */
    fy_tokwriter_stop_on(fy_stopsig_flag());
    return 0;
}

/* Exactly len bytes; 1 at a clean end of stream before any byte, 0 done, < 0 error (-EINTR: a
 * stop signal came, nothing said). */
static int read_full(struct stream *s, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        FY_TRY(fy_stopsig_check());
        ssize_t n = read(s->fd, (char *)buf + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            fy_error("reading from %s: %s", s->what, strerror(e));
            return -e;
        }
        if (n == 0) /* the helper gone: by the same signal (a terminal's Ctrl-C reaches both)? */
            return fy_stopsig_raised() ? -EINTR : got == 0 ? 1 : -EPIPE;
        got += (size_t)n;
    }
    return 0;
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Reads the records into the writer (begun at BEGIN). Returns 0 after END, -EBADMSG when the helper
 * reported an input error (already logged), -EPIPE when the stream ended early (the caller says
 * why from the exit status), other negatives for our own failures (logged). */
static int consume(struct stream *s, const struct fy_prepare_opts *o,
                   const struct fy_tokfile_source *src0, struct fy_tokwriter **w,
                   struct fy_prepare_result *res)
{
    uint32_t *tok = malloc((size_t)REC_TOKENS_MAX * 4);
    FY_REQUIRE(tok != NULL, -ENOMEM, "out of memory for the token stream");
    int rc = 0, begun = 0;
    for (;;) {
        uint8_t head[8];
        rc = read_full(s, head, sizeof head);
        if (rc != 0) {
            rc = rc == 1 ? -EPIPE : rc;
            break;
        }
        uint32_t type = le32(head), n = le32(head + 4);
        if (type == REC_ERROR) {
            char msg[REC_MESSAGE_MAX + 1];
            uint32_t keep = n < REC_MESSAGE_MAX ? n : REC_MESSAGE_MAX;
            rc = read_full(s, msg, keep);
            msg[rc == 0 ? keep : 0] = 0;
            fy_error("%s", msg[0] ? msg : "the tokenizer helper failed without a message");
            rc = -EBADMSG;
            break;
        }
        if (!begun) {
            uint8_t p[12];
            if (type != REC_BEGIN || n != 3 || read_full(s, p, sizeof p) != 0) {
                fy_error("%s: a malformed stream (record %u before the start): is %s the helper "
                         "of this build?",
                         s->what, type, s->what);
                rc = -EPROTO;
                break;
            }
            struct fy_tokfile_source src = *src0;
            uint32_t version = le32(p), vocab = le32(p + 4);
            src.eos = le32(p + 8);
            if (version != STREAM_VERSION) {
                fy_error("%s: stream version %u, expected %u: is it the helper of this build?",
                         s->what, version, STREAM_VERSION);
                rc = -EPROTO;
                break;
            }
            res->vocab = vocab;
            res->eos = src.eos;
            rc = fy_tokwriter_begin(w, o->out, vocab, &src, o->overwrite);
            if (rc < 0)
                break;
            begun = 1;
            continue;
        }
        if (type == REC_TRAINED || type == REC_MASKED) {
            if (n == 0 || n > REC_TOKENS_MAX) {
                fy_error("%s: a record of %u tokens (1..%u expected)", s->what, n, REC_TOKENS_MAX);
                rc = -EPROTO;
                break;
            }
            rc = read_full(s, tok, (size_t)n * 4);
            if (rc != 0) {
                rc = rc == 1 ? -EPIPE : rc;
                break;
            }
            for (uint32_t i = 0; i < n; i++)
                tok[i] = le32((const uint8_t *)&tok[i]);
            rc = fy_tokwriter_put(*w, tok, n, type == REC_TRAINED);
            if (rc < 0)
                break;
            continue;
        }
        if (type == REC_DOCUMENT && n == 1) {
            uint8_t p[4];
            rc = read_full(s, p, sizeof p);
            if (rc != 0) {
                rc = rc == 1 ? -EPIPE : rc;
                break;
            }
            rc = fy_tokwriter_document(*w, le32(p) != 0);
            if (rc < 0)
                break;
            res->documents++; /* the helper says one only before a document's tokens */
            res->records = le32(p) != 0;
            continue;
        }
        if (type == REC_END && n == 2) {
            uint8_t p[8];
            rc = read_full(s, p, sizeof p);
            uint64_t total = (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
            if (rc == 0 && total != fy_tokwriter_count(*w)) {
                fy_error("%s: the stream ended after %llu tokens, it announced %llu", s->what,
                         (unsigned long long)fy_tokwriter_count(*w), (unsigned long long)total);
                rc = -EPROTO;
            }
            rc = rc == 1 ? -EPIPE : rc;
            break;
        }
        fy_error("%s: unknown record type %u: is it the helper of this build?", s->what, type);
        rc = -EPROTO;
        break;
    }
    free(tok);
    return rc;
}

static void describe_status(int status, char *buf, size_t len)
{
    if (WIFEXITED(status))
        snprintf(buf, len, "exit status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, len, "killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        snprintf(buf, len, "status 0x%x", status);
}

/* records: some inputs are JSONL or Parquet, whose records the field options select. */
static int run_helper(const struct fy_prepare_opts *o, const char *tokenizer_json, int records,
                      const struct fy_tokfile_source *src, struct fy_prepare_result *res)
{
    char script[PATH_MAX];
    FY_TRY(find_helper(script, sizeof script));
    const char *text_field = o->text_field;
    if (text_field == NULL && o->prompt_field == NULL && o->messages_field == NULL)
        text_field = "text";
    size_t argc_max = 16 + o->n_inputs;
    const char **argv = calloc(argc_max, sizeof *argv);
    FY_REQUIRE(argv != NULL, -ENOMEM, "out of memory for the helper's arguments");
    size_t a = 0;
    argv[a++] = "python3";
    argv[a++] = script;
    if (tokenizer_json != NULL) {
        argv[a++] = "--tokenizer";
        argv[a++] = tokenizer_json;
    } else {
        argv[a++] = "--bytes";
    }
    if (o->jsonl)
        argv[a++] = "--jsonl";
    if (records && o->messages_field != NULL) {
        argv[a++] = "--messages-field";
        argv[a++] = o->messages_field;
    } else if (records && o->prompt_field != NULL) {
        argv[a++] = "--prompt-field";
        argv[a++] = o->prompt_field;
        argv[a++] = "--response-field";
        argv[a++] = o->response_field;
    } else if (records) {
        argv[a++] = "--text-field";
        argv[a++] = text_field;
    }
    argv[a++] = "--";
    for (unsigned i = 0; i < o->n_inputs; i++)
        argv[a++] = o->inputs[i];
    argv[a] = NULL;

    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        int e = errno;
        free(argv);
        fy_error("cannot create a pipe for the tokenizer helper: %s", strerror(e));
        return -e;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pfd[1], STDOUT_FILENO);
    pid_t pid;
    int e = posix_spawnp(&pid, "python3", &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    free(argv);
    close(pfd[1]);
    if (e != 0) {
        close(pfd[0]);
        if (e == ENOENT)
            fy_error("prepare%s needs python3 on PATH%s: it was not found; install python3 "
                     "(Debian package python3)",
                     tokenizer_json ? " --tokenizer"
                     : o->jsonl     ? " --jsonl"
                                    : " of Parquet files",
                     tokenizer_json ? " with the package tokenizers (pip install tokenizers)" : "");
        else
            fy_error("cannot start python3 for the tokenizer helper %s: %s", script, strerror(e));
        return -e;
    }
    char what[PATH_MAX + 16];
    snprintf(what, sizeof what, "python3 %s", script);
    struct stream s = {.fd = pfd[0], .what = what};
    struct fy_tokwriter *w = NULL;
    int rc = consume(&s, o, src, &w, res);
    if (rc == 0) {
        /* nothing may follow END */
        uint8_t extra;
        int r = read_full(&s, &extra, 1);
        if (r != 1) {
            fy_error("%s: data after the end of the stream", what);
            rc = -EPROTO;
        }
    }
    if (rc < 0 && rc != -EPIPE)
        kill(pid, SIGTERM); /* our own child; it may be blocked writing to the pipe */
    close(pfd[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (rc == -EPIPE || (rc == 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))) {
        char st[96];
        describe_status(status, st, sizeof st);
        fy_error("the tokenizer helper (%s) stopped before the end of the stream (%s): its "
                 "messages are above",
                 what, st);
        rc = -EPIPE;
    }
    if (rc < 0) {
        fy_tokwriter_abort(&w);
        return rc;
    }
    return fy_tokwriter_finish(&w, &res->count, &res->masked);
}

int fy_prepare(const struct fy_prepare_opts *o, struct fy_prepare_result *res)
{
    memset(res, 0, sizeof *res);
    res->eos = FY_TOKFILE_NO_EOS;
    FY_USAGE(o->n_inputs > 0, "prepare: give one or more input files after the options");
    const char *parquet = NULL, *other = NULL; /* an input of each kind */
    for (unsigned i = 0; i < o->n_inputs; i++) {
        if (is_parquet(o->inputs[i]) && parquet == NULL)
            parquet = o->inputs[i];
        else if (!is_parquet(o->inputs[i]) && other == NULL)
            other = o->inputs[i];
    }
    int records = o->jsonl || parquet != NULL;
    FY_USAGE(records || (o->text_field == NULL && o->prompt_field == NULL &&
                         o->response_field == NULL && o->messages_field == NULL),
             "prepare: --text-field, --prompt-field, --response-field and --messages-field need "
             "--jsonl, or Parquet inputs (*.parquet)");
    FY_USAGE(o->jsonl || parquet == NULL || other == NULL,
             "prepare: %s is Parquet and %s is not: give --jsonl to read the others as JSON "
             "lines, or prepare them apart",
             parquet, other);
    FY_USAGE((o->prompt_field == NULL) == (o->response_field == NULL),
             "prepare: give --prompt-field and --response-field together");
    FY_USAGE(o->text_field == NULL || o->prompt_field == NULL,
             "prepare: give --text-field, or --prompt-field with --response-field, not both");
    FY_USAGE(o->messages_field == NULL || (o->text_field == NULL && o->prompt_field == NULL),
             "prepare: --messages-field takes the whole conversation: give it without "
             "--text-field, --prompt-field and --response-field");
    FY_USAGE(o->messages_field == NULL || o->tokenizer != NULL,
             "prepare --messages-field needs --tokenizer: conversations are rendered with the "
             "model's chat template, found beside its tokenizer.json");
    if (o->tokenizer == NULL && !records) {
        FY_TRY(fy_tokfile_prepare_bytes(o->out, o->inputs, o->n_inputs, o->overwrite, &res->count));
        res->vocab = FY_TOKFILE_BYTE_VOCAB;
        for (unsigned i = 0; i < o->n_inputs; i++) { /* a non-empty input is a document */
            struct stat in;
            res->documents += stat(o->inputs[i], &in) == 0 && in.st_size > 0;
        }
        snprintf(res->tokenizer, sizeof res->tokenizer, "byte-level");
        return 0;
    }
    FY_TRY(check_inputs(o->inputs, o->n_inputs));
    struct stat st;
    FY_REQUIRE(o->overwrite || lstat(o->out, &st) != 0, -EEXIST,
               "%s already exists: remove it or pass --overwrite", o->out);
    struct fy_tokfile_source src = {FY_TOKENIZER_BYTES, 0, FY_TOKFILE_NO_EOS, NULL};
    char tj[PATH_MAX], full[PATH_MAX];
    if (o->tokenizer != NULL) {
        FY_TRY(resolve_tokenizer(o->tokenizer, tj, sizeof tj));
        src.tokenizer = FY_TOKENIZER_HF;
        FY_TRY(fy_tokfile_hash_file(tj, &src.hash));
        src.name = realpath(tj, full) != NULL ? full : tj; /* recorded, for train's messages */
    }
    FY_TRY(run_helper(o, o->tokenizer ? tj : NULL, records, &src, res));
    if (o->tokenizer != NULL)
        snprintf(res->tokenizer, sizeof res->tokenizer, "%.80s, hash %016llx", tj,
                 (unsigned long long)src.hash);
    else
        snprintf(res->tokenizer, sizeof res->tokenizer, "byte-level");
    return 0;
}
