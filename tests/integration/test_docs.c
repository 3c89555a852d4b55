/* The launcher's options and messages against the docs: docs/configuration.md describes every
 * option of the launcher's option table and no other; each command's --help lists, and its parser
 * takes, exactly the options the doc's "commands" column gives it, and refuses the others (exit 2,
 * one line naming the option and the command); and docs/troubleshooting.md has a row for every
 * message the sources print. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ctype.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/testutil.h"

/* The names "--x" of a text, one per line, found after `prefix` at a line's start. */
static int option_names(const char *text, const char *prefix, char names[][40], int max)
{
    int n = 0;
    size_t plen = strlen(prefix);
    for (const char *line = text; line != NULL && *line; line = strchr(line, '\n')) {
        if (*line == '\n')
            line++;
        if (strncmp(line, prefix, plen) != 0)
            continue;
        const char *name = line + plen;
        size_t len = strspn(name, "-abcdefghijklmnopqrstuvwxyz0123456789");
        if (len > 2 && len < 40 && n < max) {
            memcpy(names[n], name, len);
            names[n++][len] = 0;
        }
    }
    return n;
}

static int has_name(char names[][40], int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0)
            return 1;
    return 0;
}

/* docs/configuration.md describes every option of the launcher's option table (help --options)
 * and no other: an option added without its row, or a row left after its option went, fails. */
static void test_options_documented(void **state)
{
    (void)state;
    char *dir = fy_test_tmpdir("options"), *out = fy_test_path(dir, "options.txt");
    const char *args[] = {"help", "--options", NULL};
    assert_int_equal(fy_test_launch(out, args, 30), 0);
    char *table = fy_test_slurp(out, NULL), *doc = fy_test_slurp("docs/configuration.md", NULL);
    assert_non_null(table);
    assert_non_null(doc);
    static char have[128][40], documented[128][40];
    int nh = option_names(table, "", have, 128), nd = option_names(doc, "| `", documented, 128);
    assert_true(nh > 50);
    for (int i = 0; i < nh; i++)
        if (!has_name(documented, nd, have[i]))
            fail_msg("option %s is not in docs/configuration.md: add its row", have[i]);
    for (int i = 0; i < nd; i++)
        if (!has_name(have, nh, documented[i]))
            fail_msg("docs/configuration.md describes %s, which fuyou-launch does not have",
                     documented[i]);
    free(table);
    free(doc);
    fy_test_rmdir(dir);
    free(dir);
}

/* ---- each command takes the options docs/configuration.md's "commands" column gives it ------- */

static const char *const all_commands[] = {"prepare", "init",    "train",  "resume", "plan",
                                           "probe",   "profile", "report", "export", "selftest"};
#define N_COMMANDS ((int)(sizeof all_commands / sizeof all_commands[0]))

static unsigned command_bit(const char *name, size_t len)
{
    for (int c = 0; c < N_COMMANDS; c++)
        if (strlen(all_commands[c]) == len && strncmp(all_commands[c], name, len) == 0)
            return 1u << c;
    return 0;
}

/* The commands of a "commands" cell (one bit per all_commands[]): names separated by commas,
 * "train" with resume, "with workers" (the commands that start workers), "all", "all but X, Y";
 * parenthesised notes ignored. 0 where a word is none of these. */
static unsigned cell_commands(const char *cell, size_t len)
{
    const unsigned workers = command_bit("init", 4) | command_bit("train", 5) |
                             command_bit("resume", 6) | command_bit("profile", 7) |
                             command_bit("export", 6) | command_bit("selftest", 8);
    char text[256];
    size_t n = 0;
    for (size_t i = 0, depth = 0; i < len && n + 1 < sizeof text; i++) {
        depth += cell[i] == '(';
        if (depth == 0)
            text[n++] = cell[i];
        depth -= cell[i] == ')' && depth > 0;
    }
    text[n] = 0;
    unsigned set = 0, but = 0;
    for (char *save = NULL, *w = strtok_r(text, ",", &save); w != NULL;
         w = strtok_r(NULL, ",", &save)) {
        w += strspn(w, " ");
        size_t wl = strlen(w);
        while (wl > 0 && w[wl - 1] == ' ')
            wl--;
        w[wl] = 0;
        if (strncmp(w, "all but ", 8) == 0) {
            set = (1u << N_COMMANDS) - 1;
            but = 1;
            w += 8;
            wl -= 8;
        }
        unsigned bits = strcmp(w, "all") == 0            ? (1u << N_COMMANDS) - 1
                        : strcmp(w, "with workers") == 0 ? workers
                                                         : command_bit(w, wl);
        if (bits == 0)
            return 0;
        if (bits == command_bit("train", 5))
            bits |= command_bit("resume", 6);
        set = but ? set & ~bits : set | bits;
    }
    return set;
}

struct doc_option {
    char name[40];  /* --x */
    char value[40]; /* a valid value for it ("" for a switch), from its placeholder */
    unsigned commands;
};

/* A valid value for an option from the placeholder of its row: the first of alternatives, a
 * count, a size, a number, or a name. */
static void value_for(const char *placeholder, size_t len, char *out, size_t cap)
{
    const char *bar = memchr(placeholder, '\\', len);
    if (len == 0)
        snprintf(out, cap, "%s", "");
    else if (bar != NULL)
        snprintf(out, cap, "%.*s", (int)(bar - placeholder), placeholder);
    else if (len == 4 && strncmp(placeholder, "SIZE", 4) == 0)
        snprintf(out, cap, "1M");
    else if (len == 1 && placeholder[0] == 'X')
        snprintf(out, cap, "0.5");
    else if (strspn(placeholder, "NBTSMAX") == len)
        snprintf(out, cap, "3");
    else
        snprintf(out, cap, "x");
}

/* The rows "| `--name VALUE` | commands | ..." of docs/configuration.md. */
static int doc_options(const char *doc, struct doc_option *out, int max)
{
    int n = 0;
    for (const char *line = doc; line != NULL && *line; line = strchr(line + 1, '\n')) {
        line += *line == '\n';
        if (strncmp(line, "| `--", 5) != 0 || n == max)
            continue;
        const char *name = line + 3, *end = strchr(line, '\n');
        size_t len = strspn(name, "-abcdefghijklmnopqrstuvwxyz0123456789");
        const char *cell = strstr(name, "` | ");
        assert_true(len < sizeof out[n].name && cell != NULL && (end == NULL || cell < end));
        snprintf(out[n].name, sizeof out[n].name, "%.*s", (int)len, name);
        const char *ph = name + len + (name[len] == ' ');
        value_for(ph, (size_t)(name[len] == ' ' ? strcspn(ph, "`") : 0), out[n].value,
                  sizeof out[n].value);
        cell += 4;
        out[n].commands = cell_commands(cell, strcspn(cell, "|"));
        if (out[n].commands == 0)
            fail_msg("docs/configuration.md, %s: the commands column '%.*s' names no command",
                     out[n].name, (int)strcspn(cell, "|"), cell);
        n++;
    }
    return n;
}

/* A run directory that resume can read (RUN/train.args with no arguments, started here). */
static void resumable_dir(const char *dir)
{
    char cwd[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    FILE *f = fopen(fy_test_path(dir, "train.args"), "w");
    assert_non_null(f);
    fprintf(f, "fuyou-train-args 1\n%s\n", cwd);
    assert_int_equal(fclose(f), 0);
}

/* Every command's --help lists exactly the options the doc's "commands" column gives it (the
 * parser's table), and the parser takes them: all of them with valid values, before an unknown
 * option, get as far as the unknown one; one it does not take (a different one for each command)
 * is refused, naming the option and the command (exit 2). Nothing runs: each launch stops at its
 * options. */
static void test_options_per_command(void **state)
{
    (void)state;
    char *dir = fy_test_tmpdir("percmd"), *out = fy_test_path(dir, "out.txt");
    char *run = fy_test_path(dir, "run");
    assert_int_equal(mkdir(run, 0700), 0);
    resumable_dir(run);
    char *doc = fy_test_slurp("docs/configuration.md", NULL);
    assert_non_null(doc);
    static struct doc_option opts[128];
    int n = doc_options(doc, opts, 128);
    assert_true(n > 50);
    for (int c = 0; c < N_COMMANDS; c++) {
        const char *cmd = all_commands[c], *help[] = {cmd, "--help", NULL};
        assert_int_equal(fy_test_launch(out, help, 30), 0);
        char *text = fy_test_slurp(out, NULL);
        assert_non_null(text);
        assert_non_null(strstr(text, fy_test_fmt("usage: fuyou-launch %s ", cmd)));
        static char listed[128][40];
        int nl = option_names(text, "  ", listed, 128);
        for (int i = 0; i < n; i++) {
            int takes = (opts[i].commands >> c) & 1, shown = has_name(listed, nl, opts[i].name);
            if (takes != shown)
                fail_msg("fuyou-launch %s --help %s %s, which docs/configuration.md says it %s",
                         cmd, shown ? "lists" : "does not list", opts[i].name,
                         takes ? "takes" : "does not take");
        }
        free(text);
        /* every option it takes at once, then an unknown one; one of those it does not take */
        const char *args[200];
        int k = 0, refused = 0;
        args[k++] = cmd;
        if (strcmp(cmd, "resume") == 0)
            args[k++] = run;
        for (int i = 0; i < n; i++) {
            if (strcmp(opts[i].name, "--help") == 0)
                continue;
            if (((opts[i].commands >> c) & 1) == 0) {
                refused++;
                continue;
            }
            assert_true(k + 3 < (int)(sizeof args / sizeof args[0]));
            args[k++] = opts[i].name;
            if (opts[i].value[0] != 0)
                args[k++] = opts[i].value;
        }
        args[k++] = "--no-such-option";
        args[k] = NULL;
        assert_int_equal(fy_test_launch(out, args, 30), 2);
        if (!fy_test_file_contains(out, "unknown or incomplete option '--no-such-option'"))
            fail_msg("fuyou-launch %s refused one of the options docs/configuration.md gives it",
                     cmd);
        for (int i = 0, seen = 0; i < n && refused > 0; i++) {
            if (((opts[i].commands >> c) & 1) != 0 || strcmp(opts[i].name, "--help") == 0 ||
                seen++ != c * 7 % refused)
                continue;
            k = strcmp(cmd, "resume") == 0 ? 2 : 1;
            args[k++] = opts[i].name;
            if (opts[i].value[0] != 0)
                args[k++] = opts[i].value;
            args[k] = NULL;
            assert_int_equal(fy_test_launch(out, args, 30), 2);
            assert_true(fy_test_file_contains(
                out, fy_test_fmt("fuyou-launch %s: %s does not apply to %s (see fuyou-launch %s "
                                 "--help)", cmd, opts[i].name, cmd, cmd)));
        }
    }
    free(doc);
    fy_test_rmdir(dir);
    free(dir);
}

/* An option a command does not take is refused before anything starts: init --batch creates no
 * run directory and exits 2 with one line naming the option and the command. --help and -h print
 * the command's own usage (resume's without its run directory), as help COMMAND does. */
static void test_command_help_and_refusal(void **state)
{
    (void)state;
    char *dir = fy_test_tmpdir("refuse"), *out = fy_test_path(dir, "out.txt");
    char *run = fy_test_path(dir, "r");
    const char *init[] = {"init", "--run-dir", run, "--batch", "4", NULL};
    assert_int_equal(fy_test_launch(out, init, 30), 2);
    assert_true(fy_test_file_contains(out, "fuyou-launch init: --batch does not apply to init"));
    assert_int_equal(fy_test_count_matches(out, "\n"), 1);
    assert_int_equal(access(run, F_OK), -1);
    const char *two[] = {"init", "--run-dir", run, "--layers", "2", "--clip-grad-norm", "3", NULL};
    assert_int_equal(fy_test_launch(out, two, 30), 2);
    assert_true(fy_test_file_contains(out, "--clip-grad-norm does not apply to init"));
    assert_int_equal(access(run, F_OK), -1);
    const char *resume[] = {"resume", "--help", NULL};
    assert_int_equal(fy_test_launch(out, resume, 30), 0);
    assert_true(fy_test_file_contains(out, "usage: fuyou-launch resume DIR"));
    assert_false(fy_test_count_matches(out, "give the run directory") > 0);
    for (int c = 0; c < N_COMMANDS; c++) {
        const char *h[] = {all_commands[c], "-h", NULL}, *hc[] = {"help", all_commands[c], NULL};
        assert_int_equal(fy_test_launch(out, h, 30), 0);
        char *mine = fy_test_slurp(out, NULL);
        assert_int_equal(fy_test_launch(out, hc, 30), 0);
        char *by_help = fy_test_slurp(out, NULL);
        assert_non_null(mine);
        assert_non_null(by_help);
        assert_string_equal(mine, by_help);
        assert_non_null(strstr(mine, fy_test_fmt("usage: fuyou-launch %s ", all_commands[c])));
        free(mine);
        free(by_help);
    }
    fy_test_rmdir(dir);
    free(dir);
}

/* ---- every message the tool prints is in docs/troubleshooting.md ---------------------------- */

/* Where the messages are, from the repository root (where the tests run). */
static const char *const msg_roots[] = {"common", "launcher", "gpu_worker", "io_worker",
                                        "opt_worker"};
#define MSG_KEY_MIN 10 /* a literal run this long keys its message alone */
#define MSG_MAX_RUNS 32
#define MSG_RUN_MAX 256

struct msg_logger {
    char name[64];
    int fmt_arg; /* which argument is the format: fy_error's 0, FY_REQUIRE's 2, ... */
};

struct msg_scan {
    struct msg_logger loggers[64];
    int nloggers;
    char *files[512], *texts[512]; /* each source and its text with the comments blanked */
    int python[512];
    int nfiles;
    char **spans; /* the doc's code spans, whitespace-normalised */
    int nspans, messages, missing;
};

static int msg_ident_char(char c) { return c == '_' || isalnum((unsigned char)c); }

/* Past the string (or char) literal opening at p; Python's strings may be triple-quoted. */
static const char *msg_skip_literal(const char *p, int python)
{
    char q = *p;
    if (python && p[1] == q && p[2] == q) {
        const char *end = strstr(p + 3, q == '"' ? "\"\"\"" : "'''");
        return end != NULL ? end + 3 : p + strlen(p);
    }
    for (p++; *p && *p != q && *p != '\n'; p++)
        if (*p == '\\' && p[1])
            p++;
    return *p == q ? p + 1 : p;
}

/* Blanks the comments of a C or Python text in place, keeping newlines and literals. */
static void msg_blank_comments(char *t, int python)
{
    for (char *p = t; *p;) {
        if (*p == '"' || *p == '\'') {
            p = (char *)msg_skip_literal(p, python);
        } else if ((python && *p == '#') || (!python && p[0] == '/' && p[1] == '/')) {
            while (*p && *p != '\n')
                *p++ = ' ';
        } else if (!python && p[0] == '/' && p[1] == '*') {
            char *end = strstr(p + 2, "*/");
            end = end != NULL ? end + 2 : p + strlen(p);
            for (; p < end; p++)
                if (*p != '\n')
                    *p = ' ';
        } else {
            p++;
        }
    }
}

static void msg_list(struct msg_scan *s, const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        fail_msg("cannot open %s: run the test from the repository root", dir);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(path, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            msg_list(s, path);
            continue;
        }
        const char *ext = strrchr(e->d_name, '.');
        int python = ext != NULL && strcmp(ext, ".py") == 0;
        if (ext == NULL || (!python && strcmp(ext, ".c") && strcmp(ext, ".h") &&
                            strcmp(ext, ".cu") && strcmp(ext, ".cuh")))
            continue;
        assert_true(s->nfiles < 512);
        s->files[s->nfiles] = strdup(path);
        s->texts[s->nfiles] = fy_test_slurp(path, NULL);
        assert_non_null(s->texts[s->nfiles]);
        msg_blank_comments(s->texts[s->nfiles], python);
        s->python[s->nfiles++] = python;
    }
    closedir(d);
}

static int msg_logger(const struct msg_scan *s, const char *name, size_t len)
{
    for (int i = 0; i < s->nloggers; i++)
        if (strlen(s->loggers[i].name) == len && strncmp(s->loggers[i].name, name, len) == 0)
            return i;
    return -1;
}

/* Whether text holds a call of a known logger. */
static int msg_calls_logger(const struct msg_scan *s, const char *text)
{
    for (const char *p = text; *p; p++) {
        if (!msg_ident_char(*p) || (p > text && msg_ident_char(p[-1])))
            continue;
        size_t len = 1;
        while (msg_ident_char(p[len]))
            len++;
        const char *after = p + len;
        while (*after == ' ' || *after == '\t')
            after++;
        if (*after == '(' && msg_logger(s, p, len) >= 0)
            return 1;
        p += len - 1;
    }
    return 0;
}

/* Whether `at` is the name of a "#define", at its line's start. */
static int msg_after_define(const char *text, const char *at)
{
    const char *p = at;
    while (p > text && (p[-1] == ' ' || p[-1] == '\t'))
        p--;
    if (p - text < 6 || strncmp(p - 6, "define", 6) != 0)
        return 0;
    for (p -= 6; p > text && (p[-1] == ' ' || p[-1] == '\t'); p--)
        ;
    return p > text && p[-1] == '#';
}

/* A macro whose variadic arguments reach a logger (FY_REQUIRE, FY_SYS, FY_CUDA, a file's own
 * CHECK_ARG, ...) is a logger too, its format at the place of its "...": repeated until no more
 * are found, so that a macro over such a macro counts. */
static void msg_define_loggers(struct msg_scan *s)
{
    for (int added = 1; added;) {
        added = 0;
        for (int f = 0; f < s->nfiles; f++) {
            const char *t = s->texts[f];
            for (const char *p = t; !s->python[f] && (p = strstr(p, "define")) != NULL; p += 6) {
                const char *name = p + 6;
                while (*name == ' ' || *name == '\t')
                    name++;
                size_t len = 0;
                while (msg_ident_char(name[len]))
                    len++;
                if (!msg_after_define(t, name) || len == 0 || len >= 64 || name[len] != '(' ||
                    msg_logger(s, name, len) >= 0)
                    continue;
                const char *close = strchr(name, ')');
                if (close == NULL || close - name < 4 || strncmp(close - 3, "...", 3) != 0)
                    continue;
                int params = 0;
                for (const char *c = name; c < close; c++)
                    params += *c == ',';
                const char *end = close; /* the body: to the line's end without a backslash */
                while (*end && !(*end == '\n' && end[-1] != '\\'))
                    end++;
                char *body = strndup(close + 1, (size_t)(end - close - 1));
                assert_non_null(body);
                if (strstr(body, "__VA_ARGS__") != NULL && msg_calls_logger(s, body) &&
                    s->nloggers < 64) {
                    struct msg_logger *l = &s->loggers[s->nloggers++];
                    memcpy(l->name, name, len);
                    l->name[len] = 0;
                    l->fmt_arg = params;
                    added = 1;
                }
                free(body);
            }
        }
    }
}

/* The start of argument `index` of the call whose "(" is at p; NULL when it has fewer. */
static const char *msg_arg(const char *p, int index, int python)
{
    int depth = 0;
    for (const char *at = p; *at;) {
        if (*at == '"' || *at == '\'') {
            at = msg_skip_literal(at, python);
            continue;
        }
        if (*at == '(' || *at == '[' || *at == '{')
            depth++;
        else if (*at == ')' || *at == ']' || *at == '}') {
            if (--depth == 0)
                return NULL;
        } else if (*at == ',' && depth == 1 && --index == 0) {
            return at + 1;
        }
        if (depth == 1 && index == 0 && at == p)
            return at + 1;
        at++;
    }
    return NULL;
}

/* The format starting at p: adjacent string literals, an identifier between them (PRIu64, a
 * macro's string) cutting it like a conversion (\x01); "" when the argument is no literal. */
static void msg_format(const char *p, int python, char *out, size_t cap)
{
    size_t n = 0;
    int literal = 0;
    for (;;) {
        while (isspace((unsigned char)*p))
            p++;
        if (*p == '"' || (python && *p == '\'')) {
            char q = *p++;
            for (; *p && *p != q && *p != '\n'; p++) {
                char c = *p;
                if (c == '\\' && p[1]) {
                    c = *++p;
                    c = c == 'n' || c == 't' ? ' ' : c;
                }
                if (n + 1 < cap)
                    out[n++] = c;
            }
            p += *p == q;
            literal = 1;
        } else if (literal && msg_ident_char(*p)) {
            while (msg_ident_char(*p))
                p++;
            if (n + 1 < cap)
                out[n++] = '\x01';
        } else {
            break;
        }
    }
    out[literal ? n : 0] = 0;
}

/* The literal runs of a format, cut at its conversions, whitespace collapsed and trimmed. */
static int msg_runs(const char *fmt, char runs[][MSG_RUN_MAX], int max)
{
    int nr = 0;
    char cur[MSG_RUN_MAX];
    size_t n = 0;
    for (size_t i = 0;; i++) {
        char c = fmt[i];
        int cut = c == 0 || c == '\x01';
        if (c == '%' && fmt[i + 1] == '%') {
            i++;
        } else if (c == '%') {
            for (i++; fmt[i] && strchr("-+ #0123456789.*hljztL", fmt[i]) != NULL; i++)
                ;
            i -= fmt[i] == 0; /* the conversion's letter (or \x01) ends it */
            cut = 1;
        }
        if (cut) {
            n -= n > 0 && cur[n - 1] == ' ';
            if (n > 0 && nr < max) {
                memcpy(runs[nr], cur, n);
                runs[nr++][n] = 0;
            }
            n = 0;
            if (c == 0)
                return nr;
        } else if (isspace((unsigned char)c)) {
            if (n > 0 && cur[n - 1] != ' ' && n + 1 < sizeof cur)
                cur[n++] = ' ';
        } else if (n + 1 < sizeof cur) {
            cur[n++] = c;
        }
    }
}

/* The code spans of a Markdown text (`...` or ``...`` within a line, a table's "\|" as "|"),
 * their whitespace collapsed and trimmed. */
static void msg_doc_spans(struct msg_scan *s, const char *doc)
{
    int cap = 0;
    for (const char *p = doc; (p = strchr(p, '`')) != NULL;) {
        size_t ticks = strspn(p, "`");
        const char *start = p + ticks, *end = start;
        while ((end = strchr(end, '`')) != NULL && strspn(end, "`") != ticks)
            end += strspn(end, "`");
        if (end == NULL || memchr(start, '\n', (size_t)(end - start)) != NULL) {
            p = start;
            continue;
        }
        char *span = malloc((size_t)(end - start) + 1);
        assert_non_null(span);
        size_t n = 0;
        for (const char *c = start; c < end; c++) {
            if (c[0] == '\\' && c[1] == '|')
                continue;
            if (!isspace((unsigned char)*c))
                span[n++] = *c;
            else if (n > 0 && span[n - 1] != ' ')
                span[n++] = ' ';
        }
        n -= n > 0 && span[n - 1] == ' ';
        span[n] = 0;
        if (s->nspans == cap) {
            cap = cap ? 2 * cap : 1024;
            s->spans = realloc(s->spans, (size_t)cap * sizeof *s->spans);
            assert_non_null(s->spans);
        }
        s->spans[s->nspans++] = span;
        p = end + ticks;
    }
}

/* Whether one code span holds the message's key: its longest run when that has MSG_KEY_MIN
 * characters, else all its runs in order. */
static int msg_documented(const struct msg_scan *s, char runs[][MSG_RUN_MAX], int nr)
{
    int longest = 0;
    for (int i = 1; i < nr; i++)
        if (strlen(runs[i]) > strlen(runs[longest]))
            longest = i;
    int whole = strlen(runs[longest]) < MSG_KEY_MIN;
    for (int sp = 0; sp < s->nspans; sp++) {
        const char *at = s->spans[sp];
        int i = whole ? 0 : longest, last = whole ? nr - 1 : longest;
        for (; i <= last && (at = strstr(at, runs[i])) != NULL; i++)
            at += strlen(runs[i]);
        if (i > last)
            return 1;
    }
    return 0;
}

/* Checks each call of a logger in file f (fprintf's to stderr and, in Python, InputError's). */
static void msg_check_file(struct msg_scan *s, int f)
{
    const char *t = s->texts[f];
    int line = 1, python = s->python[f];
    for (const char *p = t; *p;) {
        if (*p == '"' || *p == '\'') {
            const char *end = msg_skip_literal(p, python);
            for (; p < end; p++)
                line += *p == '\n';
            continue;
        }
        if (!msg_ident_char(*p) || (p > t && msg_ident_char(p[-1]))) {
            line += *p++ == '\n';
            continue;
        }
        size_t len = 0;
        while (msg_ident_char(p[len]))
            len++;
        const char *name = p, *open = p + len;
        p += len;
        while (*open == ' ' || *open == '\t')
            open++;
        int logger = python ? -1 : msg_logger(s, name, len), fmt_arg = -1;
        if (logger >= 0)
            fmt_arg = s->loggers[logger].fmt_arg;
        else if (!python && len == 7 && strncmp(name, "fprintf", 7) == 0)
            fmt_arg = 1;
        else if (python && len == 10 && strncmp(name, "InputError", 10) == 0)
            fmt_arg = 0;
        if (fmt_arg < 0 || *open != '(' || msg_after_define(t, name))
            continue;
        const char *arg = msg_arg(open, fmt_arg, python);
        if (arg == NULL)
            continue;
        if (logger < 0 && !python) { /* fprintf: only to stderr */
            const char *to = msg_arg(open, 0, 0);
            while (isspace((unsigned char)*to))
                to++;
            if (strncmp(to, "stderr", 6) != 0 || msg_ident_char(to[6]))
                continue;
        }
        char fmt[2048], runs[MSG_MAX_RUNS][MSG_RUN_MAX];
        msg_format(arg, python, fmt, sizeof fmt);
        int nr = msg_runs(fmt, runs, MSG_MAX_RUNS), letters = 0;
        for (int i = 0; i < nr; i++)
            for (const char *c = runs[i]; *c; c++)
                letters |= isalpha((unsigned char)*c);
        if (!letters) /* no literal or no words: it prints what the caller made */
            continue;
        s->messages++;
        if (msg_documented(s, runs, nr))
            continue;
        s->missing++;
        for (char *c = fmt; *c; c++)
            *c = *c == '\x01' ? '~' : *c == '\n' ? ' ' : *c;
        fprintf(stderr, "%s:%d: not in docs/troubleshooting.md: \"%s\"\n", s->files[f], line,
                fmt);
    }
}

/* docs/troubleshooting.md lists every message the tool prints. Each call of fy_error, fy_warn, a
 * macro that passes its "..." on to them (found in the sources: FY_REQUIRE, FY_SYS, FY_CUDA, a
 * file's CHECK_ARG, ...), fprintf(stderr, ...) and the tokenizer helper's InputError gives a
 * format: its string literals, adjacent ones joined, an identifier between them (PRIu64, a
 * macro's string) cutting it as a conversion does. Its key is its longest literal run between
 * conversions, whitespace collapsed, when that has MSG_KEY_MIN characters; for a format mostly
 * of conversions ("fsync %s: %s") all its runs, in order. The key must lie within one code span
 * of the doc, where FILE, N, ... stand for the conversions. Not seen: a format without words
 * ("%s: %s", a wrapper's own: its callers' formats are checked), a message built in a buffer
 * and logged through "%s", a format that is not a literal; a short key may be matched by the row
 * of another message, and a row whose message is gone does not fail. */
static void test_messages_documented(void **state)
{
    (void)state;
    static struct msg_scan s;
    memset(&s, 0, sizeof s);
    s.loggers[s.nloggers++] = (struct msg_logger){"fy_error", 0};
    s.loggers[s.nloggers++] = (struct msg_logger){"fy_warn", 0};
    for (size_t i = 0; i < sizeof msg_roots / sizeof *msg_roots; i++)
        msg_list(&s, msg_roots[i]);
    char *doc = fy_test_slurp("docs/troubleshooting.md", NULL);
    assert_non_null(doc);
    msg_doc_spans(&s, doc);
    msg_define_loggers(&s);
    assert_true(msg_logger(&s, "FY_REQUIRE", 10) >= 0);
    for (int f = 0; f < s.nfiles; f++)
        msg_check_file(&s, f);
    assert_true(s.messages > 300); /* fewer: the scan broke */
    int missing = s.missing;
    for (int f = 0; f < s.nfiles; f++) {
        free(s.files[f]);
        free(s.texts[f]);
    }
    for (int i = 0; i < s.nspans; i++)
        free(s.spans[i]);
    free(s.spans);
    free(doc);
    if (missing > 0)
        fail_msg("%d of the %d messages are not in docs/troubleshooting.md (listed above): "
                 "add their rows", missing, s.messages);
}

int main(void)
{
    signal(SIGCHLD, SIG_DFL); /* waitpid must see our children, whatever we inherited */
    if (access(fy_test_bin("fuyou-launch"), X_OK) != 0) {
        fprintf(stderr, "test_docs: %s not built (run make first)\n", fy_test_bin("fuyou-launch"));
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options_documented),
        cmocka_unit_test(test_options_per_command),
        cmocka_unit_test(test_command_help_and_refusal),
        cmocka_unit_test(test_messages_documented),
    };
    struct CMUnitTest run[sizeof tests / sizeof tests[0]];
    size_t wanted = 0; /* FY_TEST_ONLY: a few of them, by name (comma-separated globs) */
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (fy_test_wanted(tests[i].name))
            run[wanted++] = tests[i];
    return _cmocka_run_group_tests("docs (integration)", run, wanted, NULL, NULL);
}
