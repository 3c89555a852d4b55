/* Tests of the output directories' helper (common/base/fsutil): fy_mkdirs makes a directory and its
 * missing parents and records exactly those, so that fy_made_dirs_undo removes them again,
 * deepest first and only while they are empty; an existing directory is no error and nothing is
 * recorded; a failure part-way leaves nothing it made. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/base/fsutil.h"
#include "common/base/log.h"
#include "tests/testutil.h"

static char *tmpdir;

static int setup(void **state)
{
    (void)state;
    tmpdir = fy_test_tmpdir("fsutil");
    fy_log_init("test", FY_LOG_INFO);
    return tmpdir == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    fy_test_rmdir(tmpdir);
    free(tmpdir);
    tmpdir = NULL;
    return 0;
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Missing parents made and recorded; the undo removes them deepest first, says them, and leaves
 * the directory that was there. */
static void test_parents_made_and_undone(void **state)
{
    (void)state;
    struct fy_made_dirs made;
    char *deep = fy_test_path(tmpdir, "runs/a//exp1/");
    assert_int_equal(fy_mkdirs(deep, 0700, "run directory", &made), 0);
    assert_int_equal(made.n, 3);
    assert_true(is_dir(fy_test_path(tmpdir, "runs/a/exp1")));
    struct stat st;
    assert_int_equal(stat(fy_test_path(tmpdir, "runs/a/exp1"), &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    char said[1024];
    assert_int_equal(fy_made_dirs_undo(&made, said, sizeof said), 3);
    char *want = strdup(fy_test_fmt("%s/runs/a//exp1, %s/runs/a, %s/runs", tmpdir, tmpdir, tmpdir));
    assert_string_equal(said, want);
    free(want);
    assert_false(is_dir(fy_test_path(tmpdir, "runs")));
    assert_true(is_dir(tmpdir));
    assert_int_equal(made.n, 0);

    /* there already: nothing made, nothing to undo */
    assert_int_equal(fy_mkdirs(tmpdir, 0700, "run directory", &made), 0);
    assert_int_equal(made.n, 0);
    assert_int_equal(fy_made_dirs_undo(&made, said, sizeof said), 0);
    assert_string_equal(said, "");
}

/* A directory that holds something stays, with every directory above it. */
static void test_undo_keeps_what_is_not_empty(void **state)
{
    (void)state;
    struct fy_made_dirs made;
    assert_int_equal(fy_mkdirs_for(fy_test_path(tmpdir, "out/x/w.fywt"), "export", &made), 0);
    assert_int_equal(made.n, 2);
    assert_true(is_dir(fy_test_path(tmpdir, "out/x")));
    FILE *fp = fopen(fy_test_path(tmpdir, "out/x/w.fywt"), "w");
    assert_non_null(fp);
    fclose(fp);
    assert_int_equal(fy_made_dirs_undo(&made, NULL, 0), 0);
    assert_true(is_dir(fy_test_path(tmpdir, "out/x")));

    /* a file's own directory is the working directory: nothing to make */
    assert_int_equal(fy_mkdirs_for("w.fywt", "export", &made), 0);
    assert_int_equal(made.n, 0);
}

/* A file where a parent should be: refused, and the parents made before it removed again. */
static void test_failure_leaves_nothing(void **state)
{
    (void)state;
    assert_int_equal(mkdir(fy_test_path(tmpdir, "a"), 0700), 0);
    FILE *fp = fopen(fy_test_path(tmpdir, "a/file"), "w");
    assert_non_null(fp);
    fclose(fp);
    struct fy_made_dirs made;
    assert_int_equal(fy_mkdirs(fy_test_path(tmpdir, "a/b/c"), 0700, "run directory", &made), 0);
    assert_int_equal(made.n, 2);
    assert_int_equal(fy_made_dirs_undo(&made, NULL, 0), 2);
    assert_int_equal(fy_mkdirs(fy_test_path(tmpdir, "a/file/c/d"), 0700, "run directory", &made),
                     -ENOTDIR);
    assert_int_equal(made.n, 0);
    assert_int_equal(fy_mkdirs(fy_test_path(tmpdir, "a/file"), 0700, "run directory", &made),
                     -ENOTDIR);
    /* a parent made, then a name too long for the file system: the parent goes again */
    char name[300];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = 0;
    char *past = strdup(fy_test_fmt("%s/a/new/%s/run", tmpdir, name));
    assert_int_equal(fy_mkdirs(past, 0700, "run directory", &made), -ENAMETOOLONG);
    free(past);
    assert_int_equal(made.n, 0);
    assert_int_equal(fy_test_count_entries(fy_test_path(tmpdir, "a")), 1);
}

/* A small file read whole: its bytes, NUL-terminated; one longer than the buffer gives what fits
 * and says it is incomplete; one that is missing gives -ENOENT and leaves the buffer alone. */
static void test_read_text(void **state)
{
    (void)state;
    const char *path = fy_test_path(tmpdir, "record");
    assert_int_equal(fy_file_write_text(path, "0123456789"), 0); /* and a line break */
    char buf[16];
    int incomplete = -1;
    assert_int_equal(fy_file_read_text(path, buf, sizeof buf, &incomplete), 11);
    assert_string_equal(buf, "0123456789\n");
    assert_int_equal(incomplete, 0);
    assert_int_equal(fy_file_read_text(path, buf, 12, &incomplete), 11); /* exactly fits */
    assert_int_equal(incomplete, 0);
    assert_int_equal(fy_file_read_text(path, buf, 6, &incomplete), 5);
    assert_string_equal(buf, "01234");
    assert_int_equal(incomplete, 1);
    assert_int_equal(fy_file_read_text(path, buf, 6, NULL), 5);
    strcpy(buf, "kept");
    assert_int_equal(fy_file_read_text(fy_test_path(tmpdir, "none"), buf, sizeof buf, &incomplete),
                     -ENOENT);
    assert_string_equal(buf, "kept");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_parents_made_and_undone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_undo_keeps_what_is_not_empty, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failure_leaves_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_text, setup, teardown),
    };
    return cmocka_run_group_tests_name("fsutil", tests, NULL, NULL);
}
