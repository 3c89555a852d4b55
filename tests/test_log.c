/* Tests of the run log file (common/base/log): lines the file refuses are said once on stderr,
 * kept, and appended in order before the next line once it takes them, the rest of a short write
 * too; past the memory kept, lines are dropped and their count written into the log when it can be
 * written again; a process that ends with lines refused says how many the log lacks. The file refuses through the process's file size limit (RLIMIT_FSIZE, SIGXFSZ
 * ignored): the kernel's short write and EFBIG, as a full disk gives a short write and ENOSPC. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/base/log.h"
#include "tests/testutil.h"

static char *tmpdir;

static int setup(void **state)
{
    tmpdir = fy_test_tmpdir("log");
    fy_log_init("test", FY_LOG_INFO);
    signal(SIGXFSZ, SIG_IGN);
    return tmpdir == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    fy_test_rmdir(tmpdir);
    free(tmpdir);
    tmpdir = NULL;
    return 0;
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static int count(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; p != NULL && (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

/* Lines logged while the file may grow to `limit` bytes at most, stderr captured. */
struct window {
    long limit;
    int first, last; /* "line N" for N in first..last */
    int pad;         /* characters of padding in each */
};

static int log_refused(void *arg)
{
    struct window *w = arg;
    struct rlimit before, r;
    if (getrlimit(RLIMIT_FSIZE, &before) != 0)
        return -errno;
    r = (struct rlimit){(rlim_t)w->limit, before.rlim_max};
    if (setrlimit(RLIMIT_FSIZE, &r) != 0)
        return -errno;
    for (int i = w->first; i <= w->last; i++)
        fy_info("line %d %0*d", i, w->pad, 0);
    return setrlimit(RLIMIT_FSIZE, &before) == 0 ? 0 : -errno;
}

/* From `at`, the next needle's offset in text, or -1. */
static long find_from(const char *text, const char *needle, long at)
{
    const char *p = at >= 0 ? strstr(text + at, needle) : NULL;
    return p != NULL ? (long)(p - text) : -1;
}

/* The file refuses, first in the middle of a line (a short write): said once on stderr, where the
 * lines still are; then the next line logged with room puts the kept ones first, in order, each
 * once and whole, a note of how many went late, then itself. */
static void test_refused_lines_kept_and_appended(void **state)
{
    const char *log = fy_test_path(tmpdir, "fuyou.log");
    FILE *f = fopen(log, "w"); /* 64 KiB before: the limit stays above the capture of stderr */
    assert_non_null(f);
    for (int i = 0; i < 64; i++)
        fprintf(f, "earlier %01015d\n", 0);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(fy_log_set_file(log), 0);
    fy_info("line 1 before");
    struct window w = {file_size(log) + 30, 2, 5, 10};
    int rc = -1;
    char *said = fy_test_capture_stderr(log_refused, &w, &rc);
    assert_int_equal(rc, 0);
    assert_non_null(said);
    assert_int_equal(file_size(log), w.limit);
    char *again = fy_test_capture_stderr(log_refused, &(struct window){1L << 30, 6, 6, 0}, &rc);
    assert_int_equal(rc, 0);
    assert_non_null(again);
    char *text = fy_test_slurp(log, NULL);
    assert_non_null(text);
    const char *order[] = {"line 1 ", "line 2 ", "line 3 ", "line 4 ", "line 5 ",
                           "is written again", "line 6 "};
    long at = 0;
    for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
        assert_int_equal(count(text, order[i]), 1);
        at = find_from(text, order[i], at);
        assert_true(at >= 0);
    }
    assert_int_equal(count(said, "cannot write the run log"), 1);
    assert_non_null(strstr(said, fy_test_fmt("cannot write the run log %s: File too large: its "
                                             "lines are kept in memory", log)));
    for (int i = 2; i <= 5; i++) /* on stderr meanwhile */
        assert_int_equal(count(said, fy_test_fmt("line %d ", i)), 1);
    assert_non_null(strstr(again, "is written again: 4 lines that it refused (File too large) "
                                  "appended late"));
    free(said);
    free(again);
    int lines = 0;
    for (char *p = text; *p; p++)
        lines += *p == '\n';
    assert_int_equal(lines, 64 + 7); /* six lines and the note, each whole */
    free(text);
}

/* Past the memory kept, lines are dropped (said on stderr when it happens); when the file takes
 * lines again, the kept ones go in and a note says how many were dropped. */
static void test_overflow_counted(void **state)
{
    const char *log = fy_test_path(tmpdir, "fuyou.log");
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    /* a sparse 64 MiB file: the limit at its end refuses every line, while the capture of
     * stderr (more than the 4 MiB kept) stays below it */
    assert_int_equal(ftruncate(fd, 64 << 20), 0);
    close(fd);
    assert_int_equal(fy_log_set_file(log), 0);
    int n = 2 * (FY_LOG_KEPT_MAX / 1000);
    struct window w = {64 << 20, 1, n, 950};
    int rc = -1;
    char *said = fy_test_capture_stderr(log_refused, &w, &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(count(said, "cannot write the run log"), 1);
    assert_int_equal(count(said, "fill their 4 MiB: later ones are dropped"), 1);
    free(said);
    assert_int_equal(file_size(log), 64 << 20);
    said = fy_test_capture_stderr(log_refused, &(struct window){1L << 30, n + 1, n + 1, 0}, &rc);
    free(said);
    fd = open(log, O_RDONLY);
    assert_true(fd >= 0);
    long tail = file_size(log) - (64 << 20);
    char *text = calloc(1, (size_t)tail + 1);
    assert_int_equal(pread(fd, text, (size_t)tail, 64 << 20), tail);
    close(fd);
    int kept = count(text, "] info: line ");
    assert_true(kept > 1000 && kept < n);
    for (int i = 1; i <= kept - 1; i++) /* the first ones, in order */
        assert_non_null(strstr(text, fy_test_fmt("] info: line %d ", i)));
    assert_non_null(strstr(text, fy_test_fmt("; %d lines dropped here, past the 4 MiB kept in "
                                             "memory", n - (kept - 1))));
    assert_non_null(strstr(text, fy_test_fmt("] info: line %d ", n + 1)));
    free(text);
}

/* A process that ends while the file still refuses lines says at exit, on stderr, how many the
 * run log lacks: a child logs two lines past its file size limit and exits with the limit still
 * on; the file keeps the line before them (and the start of the next, a short write), and the
 * child's stderr has both and the count. */
static void test_lines_lacking_at_exit(void **state)
{
    const char *log = fy_test_path(tmpdir, "fuyou.log");
    const char *err = fy_test_path(tmpdir, "stderr.txt");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* the log 64 KiB before: the limit stays above what stderr's file takes */
        FILE *f = fopen(log, "w");
        for (int i = 0; f != NULL && i < 64; i++)
            fprintf(f, "earlier %01015d\n", 0);
        if (f == NULL || fclose(f) != 0)
            _exit(2);
        int fd = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || dup2(fd, STDERR_FILENO) < 0 || fy_log_set_file(log) != 0)
            _exit(3);
        fy_info("line 1 before");
        struct rlimit r;
        if (getrlimit(RLIMIT_FSIZE, &r) != 0)
            _exit(4);
        r.rlim_cur = (rlim_t)file_size(log) + 10;
        if (setrlimit(RLIMIT_FSIZE, &r) != 0)
            _exit(5);
        fy_info("line 2 refused");
        fy_info("line 3 refused");
        exit(0); /* the log's atexit handler tries the kept lines once more */
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    char *text = fy_test_slurp(log, NULL), *said = fy_test_slurp(err, NULL);
    assert_non_null(text);
    assert_non_null(said);
    assert_int_equal(count(text, "line 1 before\n"), 1);
    assert_null(strstr(text, "refused\n"));
    assert_int_equal(count(said, "line 2 refused"), 1);
    assert_int_equal(count(said, "line 3 refused"), 1);
    assert_non_null(strstr(said, fy_test_fmt("the run log %s lacks 2 lines of this process (File "
                                             "too large): stderr has them, but for a terminal's "
                                             "per-step lines",
                                             log)));
    free(text);
    free(said);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_refused_lines_kept_and_appended, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overflow_counted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lines_lacking_at_exit, setup, teardown),
    };
    return cmocka_run_group_tests_name("log", tests, NULL, NULL);
}
