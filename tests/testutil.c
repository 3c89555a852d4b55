/* Helpers shared by the test programs: temporary directories, deterministic random data,
 * the build's executables, and counting leftovers in /dev/shm. */
#include "testutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/model/arch/arch.h"
#include "common/model/arch/llama.h"

char *fy_test_tmpdir(const char *tag)
{
    const char *base = getenv("TMPDIR");
    char *path = NULL;
    if (asprintf(&path, "%s/fuyou-test-%s-XXXXXX", base ? base : "/tmp", tag) < 0)
        return NULL;
    if (mkdtemp(path) == NULL) {
        free(path);
        return NULL;
    }
    return path;
}

void fy_test_rmdir(const char *path)
{
    if (path == NULL || strncmp(path, "/", 1) != 0 || strstr(path, "fuyou-test-") == NULL)
        return;
    char *cmd = NULL;
    if (asprintf(&cmd, "rm -rf '%s'", path) < 0)
        return;
    int ignored = system(cmd);
    (void)ignored;
    free(cmd);
}

char *fy_test_path(const char *dir, const char *name)
{
    static char buf[256][1024];
    static int next;
    char *p = buf[next++ % 256];
    snprintf(p, sizeof buf[0], "%s/%s", dir, name);
    return p;
}

int fy_test_count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

int fy_test_launch(const char *log, const char *const *args, int seconds)
{
    unlink(log);
    int status = fy_test_run("fuyou-launch", args, log, seconds);
    if (status == -1 || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

const char *fy_test_bin(const char *name)
{
    static char path[4096];
    const char *build = getenv("BUILD");
    snprintf(path, sizeof path, "%s/bin/%s", build ? build : "build", name);
    return path;
}

uint64_t fy_test_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float fy_test_uniform(uint64_t *state, float lo, float hi)
{
    return lo + (hi - lo) * (float)((fy_test_rand(state) >> 40) * (1.0 / 16777216.0));
}

int fy_test_count_shm(const char *prefix)
{
    DIR *d = opendir("/dev/shm");
    if (d == NULL)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
            n++;
    closedir(d);
    return n;
}

int fy_test_count_processes(const char *needle)
{
    DIR *d = opendir("/proc");
    int n = 0;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9' || atoi(e->d_name) == getpid())
            continue;
        size_t len;
        char *cmd = fy_test_slurp(fy_test_fmt("/proc/%s/cmdline", e->d_name), &len);
        for (size_t i = 0; cmd != NULL && i < len; i++)
            if (cmd[i] == 0)
                cmd[i] = ' ';
        if (cmd != NULL && len > 0 && strstr(cmd, needle) != NULL)
            n++;
        free(cmd);
    }
    if (d != NULL)
        closedir(d);
    return n;
}

char *fy_test_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) {
            char *bigger = realloc(buf, cap * 2);
            if (bigger == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = bigger;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        if (len)
            *len = n;
    }
    return buf;
}

const char *fy_test_desc_diff(const struct fy_desc *a, const struct fy_desc *b)
{
    if (a->kind != b->kind)
        return "kind";
    if (a->op != b->op)
        return "op";
    if (a->dtype != b->dtype)
        return "dtype";
    if (a->status != b->status)
        return "status";
    if (a->step != b->step)
        return "step";
    if (a->layer != b->layer)
        return "layer";
    if (a->tensor != b->tensor)
        return "tensor";
    if (a->offset != b->offset)
        return "offset";
    if (a->bytes != b->bytes)
        return "bytes";
    if (a->seq != b->seq)
        return "seq";
    if (a->arg != b->arg)
        return "arg";
    return "";
}

double fy_test_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

void fy_test_pause_ms(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&t, NULL);
}

int fy_test_start(const char *program, const char *const *args, const char *log)
{
    pid_t pid = fork();
    if (pid != 0)
        return (int)pid;
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd < 0)
        _exit(126);
    dup2(fd, 1);
    dup2(fd, 2);
    const char *argv[256];
    int n = 0;
    argv[n++] = fy_test_bin(program);
    for (; *args && n < 255; args++)
        argv[n++] = *args;
    argv[n] = NULL;
    if (*args != NULL) { /* not cut short silently */
        dprintf(fd, "fy_test_start: more than 254 arguments for %s\n", program);
        _exit(125);
    }
    execv(argv[0], (char *const *)argv);
    _exit(127);
}

int fy_test_wait(int pid, int seconds)
{
    for (int i = 0; i < seconds * 50; i++) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid)
            return status;
        struct timespec pause = {0, 20 * 1000000};
        nanosleep(&pause, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

int fy_test_run(const char *program, const char *const *args, const char *log, int seconds)
{
    int pid = fy_test_start(program, args, log);
    return pid < 0 ? -1 : fy_test_wait(pid, seconds);
}

int fy_test_run_read_only(const char *dir, const char *ro, const char *command, const char *log)
{
    const char *ns = geteuid() == 0 ? "unshare -m" : "unshare -rm";
    struct rlimit lim;
    if (geteuid() != 0 && (getrlimit(RLIMIT_MEMLOCK, &lim) != 0 ||
                           (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < (256u << 20)))) {
        printf("read-only bind mount: not made: a user namespace needs RLIMIT_MEMLOCK of 256 MiB "
               "for the io worker's pool (ulimit -l), or root\n");
        return -1;
    }
    char mount[3000], line[8192];
    snprintf(mount, sizeof mount, "mount --bind '%s' '%s' && mount -o remount,ro,bind '%s' && "
             "! touch '%s/.probe' 2>/dev/null", dir, ro, ro, ro);
    snprintf(line, sizeof line, "%s sh -c \"%s\" >/dev/null 2>&1", ns, mount);
    if (system(line) != 0) {
        printf("read-only bind mount: not made: %s cannot bind-mount read-only here (no mount "
               "namespace, or mount is not allowed)\n", ns);
        return -1;
    }
    snprintf(line, sizeof line, "%s sh -c \"%s && exec %s\" >'%s' 2>&1", ns, mount, command,
             log);
    int status = system(line);
    if (status == -1)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int fy_test_file_contains(const char *path, const char *needle)
{
    char *text = fy_test_slurp(path, NULL);
    int found = text != NULL && strstr(text, needle) != NULL;
    if (!found)
        fprintf(stderr, "--- %s does not contain '%s'; it says:\n%s\n", path, needle,
                text ? text : "(unreadable)");
    free(text);
    return found;
}

int fy_test_count_matches(const char *path, const char *needle)
{
    char *text = fy_test_slurp(path, NULL);
    int n = 0;
    for (char *p = text; p != NULL && (p = strstr(p, needle)) != NULL; p++)
        n++;
    free(text);
    return n;
}

char *fy_test_capture_stderr(int (*fn)(void *), void *arg, int *rc)
{
    char tmpl[] = "/tmp/fuyou-test-stderr-XXXXXX";
    int cfd = mkstemp(tmpl);
    if (cfd < 0)
        return NULL;
    int saved = dup(STDERR_FILENO);
    if (saved < 0 || dup2(cfd, STDERR_FILENO) < 0) {
        close(cfd);
        unlink(tmpl);
        return NULL;
    }
    *rc = fn(arg);
    int restored = dup2(saved, STDERR_FILENO) >= 0;
    close(saved);
    close(cfd);
    char *text = fy_test_slurp(tmpl, NULL);
    unlink(tmpl);
    if (!restored) {
        free(text);
        return NULL;
    }
    if (text != NULL)
        fputs(text, stderr);
    return text;
}

int fy_test_python_run(const char *script, const char *const *commands, double *losses, int max)
{
    size_t cap = 16384, len = 0;
    char *cmd = malloc(cap);
    if (cmd == NULL)
        return -1;
    len += (size_t)snprintf(cmd + len, cap - len, "python3 '%s' run", script);
    for (int i = 0; commands[i] != NULL && len < cap; i++) {
        if (strchr(commands[i], '\'') != NULL) {
            fprintf(stderr, "fy_test_python_run: a quote in command %s\n", commands[i]);
            free(cmd);
            return -1;
        }
        len += (size_t)snprintf(cmd + len, cap - len, " '%s'", commands[i]);
    }
    if (len >= cap) {
        fprintf(stderr, "fy_test_python_run: commands longer than %zu bytes\n", cap);
        free(cmd);
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    FILE *p = popen(cmd, "r");
    if (p == NULL) {
        perror("fy_test_python_run: popen");
        free(cmd);
        return -1;
    }
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, p) != NULL) {
        if (strncmp(line, "loss ", 5) == 0 && n < max)
            losses[n++] = strtod(line + 5, NULL);
        else
            fputs(line, stderr);
    }
    int st = pclose(p);
    if (st != 0) {
        fprintf(stderr, "%s: exit status %d\n", cmd, st);
        n = -1;
    }
    free(cmd);
    return n;
}

const char *fy_test_fmt(const char *fmt, ...)
{
    static char bufs[16][1024];
    static int next;
    char *b = bufs[next++ % 16];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof bufs[0], fmt, ap);
    va_end(ap);
    return b;
}

int fy_test_setup(void **state, const char *tag, const char *text)
{
    struct fy_test_fixture *f = calloc(1, sizeof *f);
    if (f == NULL || (f->dir = fy_test_tmpdir(tag)) == NULL) {
        free(f);
        return -1;
    }
    snprintf(f->log, sizeof f->log, "%s/log", f->dir);
    snprintf(f->data, sizeof f->data, "%s/data.tok", f->dir);
    *state = f;
    if (text == NULL)
        return 0;
    const char *args[] = {"prepare", "--out", f->data, text, NULL};
    int status = fy_test_run("fuyou-launch", args, f->log, 30);
    if (status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    fprintf(stderr, "fuyou-launch prepare of %s failed (log %s)\n", text, f->log);
    fy_test_teardown(state); /* cmocka runs no teardown after a failed setup */
    return -1;
}

const char *fy_test_docs_data(struct fy_test_fixture *f, const char *text, int lines)
{
    char *jsonl = fy_test_in(f, "docs.jsonl"), *tok = fy_test_in(f, "docs.tok");
    FILE *in = fopen(text, "r"), *out = fopen(jsonl, "w");
    if (in == NULL || out == NULL) {
        fprintf(stderr, "cannot read %s or write %s\n", text, jsonl);
        if (in != NULL)
            fclose(in);
        if (out != NULL)
            fclose(out);
        return NULL;
    }
    char line[4096];
    for (int n = 0; n < lines && fgets(line, sizeof line, in) != NULL;) {
        line[strcspn(line, "\n")] = 0;
        if (line[0] == 0)
            continue;
        fputs("{\"text\": \"", out);
        for (const char *c = line; *c; c++) /* JSON: quotes, backslashes and controls escaped */
            if (*c == '"' || *c == '\\')
                fprintf(out, "\\%c", *c);
            else if ((unsigned char)*c < 0x20)
                fprintf(out, "\\u%04x", (unsigned char)*c);
            else
                fputc(*c, out);
        fputs("\"}\n", out);
        n++;
    }
    fclose(in);
    if (fclose(out) != 0)
        return NULL;
    unlink(tok);
    const char *args[] = {"prepare", "--out", tok, "--jsonl", jsonl, NULL};
    int status = fy_test_run("fuyou-launch", args, f->log, 60);
    if (status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return tok;
    fprintf(stderr, "fuyou-launch prepare of %s failed (log %s)\n", jsonl, f->log);
    return NULL;
}

int fy_test_teardown(void **state)
{
    struct fy_test_fixture *f = *state;
    if (f == NULL)
        return 0;
    fy_test_rmdir(f->dir);
    free(f->dir);
    free(f);
    *state = NULL;
    return 0;
}

char *fy_test_in(struct fy_test_fixture *f, const char *name)
{
    return fy_test_path(f->dir, name);
}

int fy_test_launch_in(struct fy_test_fixture *f, const char *const *args, int seconds)
{
    return fy_test_launch(f->log, args, seconds);
}

int fy_test_wanted(const char *name)
{
    const char *only = getenv("FY_TEST_ONLY");
    if (only == NULL)
        return 1;
    char globs[1024];
    snprintf(globs, sizeof globs, "%s", only);
    for (char *save = NULL, *g = strtok_r(globs, ",", &save); g != NULL;
         g = strtok_r(NULL, ",", &save))
        if (fnmatch(g, name, 0) == 0)
            return 1;
    return 0;
}

int fy_test_in_ci(void)
{
    const char *ci = getenv("CI");
    return ci != NULL && strcmp(ci, "true") == 0;
}

int fy_test_same_model(const struct fy_model_config *a, const struct fy_model_config *b)
{
    return a->n_layer == b->n_layer && a->n_head == b->n_head && a->n_embd == b->n_embd &&
           a->vocab == b->vocab && a->ctx == b->ctx && fy_model_arch(a) == fy_model_arch(b) &&
           memcmp(fy_llama(a), fy_llama(b), sizeof(struct fy_llama_fields)) == 0;
}

int fy_test_count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}
