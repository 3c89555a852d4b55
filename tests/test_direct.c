/* Tests of the O_DIRECT probe of an SSD path (io_worker/direct): a directory that suits passes and
 * keeps no probe file; a missing path, a file and tmpfs are refused, tmpfs with one line naming it. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>

#include "common/base/log.h"
#include "io_worker/direct.h"
#include "tests/testutil.h"

static void test_suitable_dir(void **state)
{
    char *dir = fy_test_tmpdir("direct");
    assert_non_null(dir);
    assert_int_equal(fy_direct_check(dir), 0);
    /* The probe file is gone afterwards. */
    assert_int_equal(fy_test_count_entries(dir), 0);
    fy_test_rmdir(dir);
    free(dir);
}

static void test_bad_paths(void **state)
{
    char *dir = fy_test_tmpdir("direct");
    assert_non_null(dir);
    char missing[4200];
    snprintf(missing, sizeof missing, "%s/does-not-exist", dir);
    assert_int_equal(fy_direct_check(missing), -ENOENT);
    char *file = fy_test_path(dir, "a-file");
    FILE *fp = fopen(file, "w");
    assert_non_null(fp);
    fclose(fp);
    assert_int_equal(fy_direct_check(file), -ENOTDIR);
    fy_test_rmdir(dir);
    free(dir);
}

static void test_tmpfs_refused(void **state)
{
    struct statfs sf;
    if (statfs("/dev/shm", &sf) != 0 || sf.f_type != 0x01021994) {
        fprintf(stderr, "skipping the tmpfs case: /dev/shm is not tmpfs here\n");
        skip();
    }
    char dir[] = "/dev/shm/fuyou-test-direct-XXXXXX";
    assert_non_null(mkdtemp(dir));
    int rc;
    char *log = fy_test_capture_stderr((int (*)(void *))fy_direct_check, dir, &rc);
    assert_non_null(log);
    assert_int_equal(rc, -EINVAL);
    assert_non_null(strstr(log, dir));
    assert_non_null(strstr(log, "ext4 or xfs"));
    /* One clear line. */
    assert_non_null(strchr(log, '\n'));
    assert_null(strchr(strchr(log, '\n') + 1, '\n'));
    free(log);
    fy_test_rmdir(dir);
}

int main(void)
{
    fy_log_init("test", FY_LOG_INFO);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_suitable_dir),
        cmocka_unit_test(test_bad_paths),
        cmocka_unit_test(test_tmpfs_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
