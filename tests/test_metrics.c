/* Tests of a train command's metrics file (launcher/step/metrics): lines appended; lines the file
 * refuses kept in memory, in order, the rest of a short write too, said once, and appended before
 * the next line once it takes them; the rollback to a commit, which drops the later steps' lines
 * from the file and from memory alike; the cap on what waits; and the lines said lost at the end.
 * The file system refuses through the process's file size limit (RLIMIT_FSIZE, SIGXFSZ ignored):
 * the kernel's own short write and EFBIG, as a full disk gives a short write and ENOSPC; the
 * integration test test_chaos_store fills a real file system. */
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
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/config.h"
#include "launcher/step/metrics.h"
#include "tests/testutil.h"

static char *tmpdir;

static int setup(void **state)
{
    tmpdir = fy_test_tmpdir("metrics");
    return tmpdir == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    fy_test_rmdir(tmpdir);
    free(tmpdir);
    tmpdir = NULL;
    return 0;
}

static const char *metrics_path(void) { return fy_test_path(tmpdir, "metrics.jsonl"); }

/* Step's line (no line break) as train writes one: the step first, some 300 bytes in all. */
static const char *line_of(uint64_t step, int variant)
{
    static char line[400];
    snprintf(line, sizeof line, "{\"step\": %llu, \"loss\": %d.%03llu, \"pad\": \"%0250d\"}",
             (unsigned long long)step, 3 + variant, (unsigned long long)(step * 7 % 1000), 0);
    return line;
}

/* The text of the lines of steps first..last, each with its line break. */
static char *lines_text(uint64_t first, uint64_t last, int variant)
{
    char *text = calloc(1, 400 * (last - first + 2));
    assert_non_null(text);
    for (uint64_t s = first; s <= last; s++) {
        strcat(text, line_of(s, variant));
        strcat(text, "\n");
    }
    return text;
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static void assert_file_is(const char *path, const char *want)
{
    size_t n;
    char *have = fy_test_slurp(path, &n);
    assert_non_null(have);
    if (n != strlen(want) || memcmp(have, want, n) != 0)
        fprintf(stderr, "%s holds %zu bytes:\n%s\nwanted %zu:\n%s\n", path, n, have, strlen(want),
                want);
    assert_int_equal(n, strlen(want));
    assert_memory_equal(have, want, n);
    free(have);
}

static struct rlimit fsize_before;

/* Files of this process can grow to `bytes` at most: a write past it is short, then EFBIG. */
static void refuse_past(long bytes)
{
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &fsize_before), 0);
    struct rlimit r = {(rlim_t)bytes, fsize_before.rlim_max};
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &r), 0);
}

static void room_again(void) { assert_int_equal(setrlimit(RLIMIT_FSIZE, &fsize_before), 0); }

static int count(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; p != NULL && (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

/* A window of appends while the file refuses, its stderr captured (the limit stays above what
 * the capture file holds, so the warning itself is written). */
struct window {
    struct fy_metrics *m;
    uint64_t first, last; /* steps appended */
    int variant;
    long limit;
};

static int append_refused(void *arg)
{
    struct window *w = arg;
    refuse_past(w->limit);
    int rc = 0;
    for (uint64_t s = w->first; s <= w->last && rc == 0; s++)
        rc = fy_metrics_append(w->m, s, line_of(s, w->variant));
    room_again();
    return rc;
}

/* Lines go into the file as they come, each with its line break; nothing waits. */
static void test_append_writes_lines(void **state)
{
    struct fy_metrics *m = NULL;
    assert_int_equal(fy_metrics_open(&m, tmpdir), 0);
    assert_string_equal(fy_metrics_path(m), metrics_path());
    for (uint64_t s = 1; s <= 5; s++) {
        assert_int_equal(fy_metrics_append(m, s, line_of(s, 0)), 0);
        assert_int_equal(fy_metrics_pending_lines(m), 0);
    }
    char *want = lines_text(1, 5, 0);
    assert_file_is(metrics_path(), want); /* written at once, not at close */
    assert_int_equal(fy_metrics_close(&m, 5), 0);
    assert_null(m);
    assert_file_is(metrics_path(), want);
    free(want);
}

/* The file refuses in the middle of step 11's line: its first bytes go in (the short write), its
 * rest and the next lines wait in memory, said once; with room again the next append puts them
 * all in order before its own line, said once, and the file is each line once. */
static void test_refused_lines_wait_and_go_out_in_order(void **state)
{
    signal(SIGXFSZ, SIG_IGN);
    struct fy_metrics *m = NULL;
    assert_int_equal(fy_metrics_open(&m, tmpdir), 0);
    for (uint64_t s = 1; s <= 10; s++)
        assert_int_equal(fy_metrics_append(m, s, line_of(s, 0)), 0);
    long full = file_size(metrics_path()) + 100;
    struct window w = {m, 11, 14, 0, full};
    int rc = -1;
    char *said = fy_test_capture_stderr(append_refused, &w, &rc);
    assert_non_null(said);
    assert_int_equal(rc, 0);
    assert_int_equal(count(said, "cannot write"), 1);
    assert_int_equal(count(said, "File too large"), 1);
    assert_true(strstr(said, "kept in memory") != NULL);
    assert_true(strstr(said, fy_test_fmt("free space on the file system of %s", tmpdir)) != NULL);
    free(said);
    assert_int_equal(file_size(metrics_path()), full); /* step 11's first 100 bytes */
    assert_int_equal(fy_metrics_pending_lines(m), 4);
    char *pending = lines_text(11, 14, 0);
    assert_int_equal(fy_metrics_pending_bytes(m), strlen(pending) - 100);
    free(pending);
    assert_false(fy_metrics_over_cap(m));

    struct window w2 = {m, 15, 15, 0, 1L << 30}; /* room again */
    said = fy_test_capture_stderr(append_refused, &w2, &rc);
    assert_non_null(said);
    assert_int_equal(rc, 0);
    assert_int_equal(count(said, "cannot write"), 0);
    assert_true(strstr(said, "4 metrics lines kept in memory (steps 11 to 14) appended late") !=
                NULL);
    free(said);
    assert_int_equal(fy_metrics_pending_lines(m), 0);
    char *want = lines_text(1, 15, 0);
    assert_file_is(metrics_path(), want);

    /* a second time: said again, once; the end puts what waits in */
    struct window w3 = {m, 16, 17, 0, file_size(metrics_path())};
    said = fy_test_capture_stderr(append_refused, &w3, &rc);
    assert_int_equal(count(said, "cannot write"), 1);
    free(said);
    assert_file_is(metrics_path(), want);
    assert_int_equal(fy_metrics_close(&m, 17), 0);
    free(want);
    want = lines_text(1, 17, 0);
    assert_file_is(metrics_path(), want);
    free(want);
}

/* Going back to a commit drops the later steps' lines wherever they are: in the file (cut at its
 * tail), in memory, and the start of a line in the file whose rest is in memory; the commit's own
 * lines stay, the rest of a short write included, and complete the file once there is room. */
static void test_rollback_drops_file_and_kept_lines(void **state)
{
    signal(SIGXFSZ, SIG_IGN);
    struct fy_metrics *m = NULL;
    assert_int_equal(fy_metrics_open(&m, tmpdir), 0);
    for (uint64_t s = 1; s <= 10; s++)
        assert_int_equal(fy_metrics_append(m, s, line_of(s, 0)), 0);
    struct window w = {m, 11, 14, 0, file_size(metrics_path()) + 100};
    int rc = -1;
    free(fy_test_capture_stderr(append_refused, &w, &rc));
    assert_int_equal(fy_metrics_pending_lines(m), 4);

    /* back to step 12: 13 and 14 go from memory; 11's start stays in the file, its rest waits */
    assert_int_equal(fy_metrics_rollback(m, 12), 2);
    assert_int_equal(fy_metrics_pending_lines(m), 2);
    assert_int_equal(fy_metrics_append(m, 13, line_of(13, 1)), 0); /* trained again: room now */
    char *want = lines_text(1, 12, 0), *again = lines_text(13, 13, 1);
    want = realloc(want, strlen(want) + strlen(again) + 1);
    strcat(want, again);
    assert_file_is(metrics_path(), want);
    free(want);
    free(again);

    /* back to step 10 with 11's start in the file: cut from the file with 12 and 13 (file lines),
     * 14 and 15 (waiting) */
    w = (struct window){m, 14, 15, 0, file_size(metrics_path()) + 50};
    free(fy_test_capture_stderr(append_refused, &w, &rc));
    assert_int_equal(fy_metrics_pending_lines(m), 2);
    assert_int_equal(fy_metrics_rollback(m, 10), 5);
    assert_int_equal(fy_metrics_pending_lines(m), 0);
    want = lines_text(1, 10, 0);
    assert_file_is(metrics_path(), want);
    assert_int_equal(fy_metrics_append(m, 11, line_of(11, 2)), 0);
    assert_int_equal(fy_metrics_close(&m, 11), 0);
    again = lines_text(11, 11, 2);
    want = realloc(want, strlen(want) + strlen(again) + 1);
    strcat(want, again);
    assert_file_is(metrics_path(), want);
    free(want);
    free(again);
}

static int rollback_fresh(void *arg)
{
    struct fy_metrics *m = NULL;
    int rc = fy_metrics_open(&m, tmpdir);
    if (rc == 0)
        rc = fy_metrics_rollback(m, *(uint64_t *)arg);
    int closed = fy_metrics_close(&m, 0);
    return rc < 0 ? rc : closed < 0 ? closed : rc;
}

/* A file written otherwise: lines after the commit that are not its tail (the file is rewritten
 * without them), lines without a step (kept), and an incomplete last line that no launcher of this
 * command wrote (removed, said). */
static void test_rollback_of_other_files(void **state)
{
    char *text = lines_text(1, 2, 0), *later = lines_text(5, 5, 0), *three = lines_text(3, 3, 0);
    FILE *f = fopen(metrics_path(), "w");
    assert_non_null(f);
    fprintf(f, "%s%snot a step\n%s{\"step\": 4, \"lo", text, later, three);
    assert_int_equal(fclose(f), 0);
    uint64_t step = 3;
    int rc = -1;
    char *said = fy_test_capture_stderr(rollback_fresh, &step, &rc);
    assert_int_equal(rc, 2); /* step 5's line and step 4's start */
    assert_null(strstr(said, "incomplete last line"));
    free(said);
    char *want = calloc(1, 4096);
    snprintf(want, 4096, "%snot a step\n%s", text, three);
    assert_file_is(metrics_path(), want);
    assert_int_not_equal(access(fy_test_fmt("%s.tmp", metrics_path()), F_OK), 0);

    f = fopen(metrics_path(), "a"); /* a committed step's line cut short by a killed launcher */
    fprintf(f, "{\"step\": 3, \"lo");
    fclose(f);
    said = fy_test_capture_stderr(rollback_fresh, &step, &rc);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(said, "its incomplete last line (a launcher stopped while writing it) "
                                 "was removed"));
    free(said);
    assert_file_is(metrics_path(), want);
    free(want);
    free(text);
    free(later);
    free(three);
}

struct stop {
    struct fy_metrics *m;
    uint64_t committed;
};

static int say_stopped(void *arg)
{
    struct stop *st = arg;
    return fy_metrics_stopped(st->m, st->committed);
}

/* Past the cap, the run must stop at a commit: said with what waits, the file, what to free and
 * how to go on. */
static void test_cap_stops_the_run(void **state)
{
    signal(SIGXFSZ, SIG_IGN);
    struct fy_metrics *m = NULL;
    assert_int_equal(fy_metrics_open(&m, tmpdir), 0);
    char *three = lines_text(11, 13, 0);
    size_t cap = strlen(three);
    free(three);
    fy_metrics_set_cap(m, cap);
    for (uint64_t s = 1; s <= 10; s++)
        assert_int_equal(fy_metrics_append(m, s, line_of(s, 0)), 0);
    struct window w = {m, 11, 13, 0, file_size(metrics_path())};
    int rc = -1;
    free(fy_test_capture_stderr(append_refused, &w, &rc));
    assert_int_equal(fy_metrics_pending_lines(m), 3);
    assert_int_equal(fy_metrics_pending_bytes(m), cap);
    assert_false(fy_metrics_over_cap(m)); /* up to the cap: on */
    w = (struct window){m, 14, 14, 0, file_size(metrics_path())};
    free(fy_test_capture_stderr(append_refused, &w, &rc));
    assert_true(fy_metrics_over_cap(m));
    char waiting[32], kept[32];
    fy_format_size(fy_metrics_pending_bytes(m), waiting, sizeof waiting);
    fy_format_size(cap, kept, sizeof kept);
    struct stop st = {m, 14};
    char *said = fy_test_capture_stderr(say_stopped, &st, &rc);
    assert_int_equal(rc, -ENOBUFS);
    assert_non_null(strstr(said, fy_test_fmt(
        "%s: %s of metrics lines (steps 11 to 14) wait in memory for room on its file system "
        "(File too large), more than the %s kept: training stopped at step 14, which is "
        "committed; free space on the file system of %s, then continue with fuyou-launch resume "
        "%s", metrics_path(), waiting, kept, tmpdir, tmpdir)));
    free(said);
    assert_int_equal(fy_metrics_close(&m, 14), 0); /* room at the end: nothing lost */
    char *want = lines_text(1, 14, 0);
    assert_file_is(metrics_path(), want);
    free(want);
}

static int close_refused(void *arg)
{
    struct fy_metrics **m = arg;
    refuse_past(file_size(metrics_path()));
    int rc = fy_metrics_close(m, 12);
    room_again();
    return rc;
}

/* At the end, what still cannot be written is said lost (how many lines, which steps), the start
 * of a line whose rest is lost is cut from the file, and the lines after the last commit go
 * unsaid (they are trained again). */
static void test_close_says_lost_lines(void **state)
{
    signal(SIGXFSZ, SIG_IGN);
    struct fy_metrics *m = NULL;
    assert_int_equal(fy_metrics_open(&m, tmpdir), 0);
    for (uint64_t s = 1; s <= 10; s++)
        assert_int_equal(fy_metrics_append(m, s, line_of(s, 0)), 0);
    struct window w = {m, 11, 13, 0, file_size(metrics_path()) + 120};
    int rc = -1;
    free(fy_test_capture_stderr(append_refused, &w, &rc));
    char *said = fy_test_capture_stderr(close_refused, &m, &rc);
    assert_int_equal(rc, -EFBIG);
    assert_null(m);
    assert_non_null(strstr(said, "2 metrics lines of committed steps (11 to 12) could not be "
                                 "written (File too large) and are lost"));
    free(said);
    char *want = lines_text(1, 10, 0);
    assert_file_is(metrics_path(), want); /* step 11's start cut */
    free(want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_append_writes_lines, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_lines_wait_and_go_out_in_order, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_rollback_drops_file_and_kept_lines, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rollback_of_other_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cap_stops_the_run, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_says_lost_lines, setup, teardown),
    };
    return cmocka_run_group_tests_name("metrics", tests, NULL, NULL);
}
