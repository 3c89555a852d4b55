/* Tests of the run configuration (common/base/config): set/get, typed look-ups, size parsing and
 * formatting, and the file format with its atomic save. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/base/config.h"
#include "common/base/log.h"
#include "tests/testutil.h"

/* A struct fy_config is ~140 KB: keep it off the stack. */
static struct fy_config cfg, cfg2;

static void test_set_get_replace(void **state)
{
    fy_config_init(&cfg);
    assert_int_equal(cfg.count, 0);
    assert_null(fy_config_get(&cfg, "a"));
    assert_int_equal(fy_config_set(&cfg, "a", "1"), 0);
    assert_int_equal(fy_config_set(&cfg, "b", "two words"), 0);
    assert_int_equal(cfg.count, 2);
    assert_string_equal(fy_config_get(&cfg, "a"), "1");
    assert_string_equal(fy_config_get(&cfg, "b"), "two words");
    assert_null(fy_config_get(&cfg, "c"));
    assert_null(fy_config_get(&cfg, "A"));
    /* replace keeps one entry */
    assert_int_equal(fy_config_set(&cfg, "a", "replaced"), 0);
    assert_int_equal(cfg.count, 2);
    assert_string_equal(fy_config_get(&cfg, "a"), "replaced");
    assert_int_equal(fy_config_set(&cfg, "a", ""), 0);
    assert_string_equal(fy_config_get(&cfg, "a"), "");

    /* setf */
    assert_int_equal(fy_config_setf(&cfg, "n", "%d-%s-%llu", -5, "x", 123456789012ull), 0);
    assert_string_equal(fy_config_get(&cfg, "n"), "-5-x-123456789012");
    assert_int_equal(cfg.count, 3);

    /* too long key/value, multi-line value */
    char longkey[FY_CONFIG_KEY_MAX + 1];
    memset(longkey, 'k', sizeof longkey - 1);
    longkey[FY_CONFIG_KEY_MAX] = 0;
    assert_int_equal(fy_config_set(&cfg, longkey, "v"), -E2BIG);
    longkey[FY_CONFIG_KEY_MAX - 1] = 0; /* 63 chars: fits */
    assert_int_equal(fy_config_set(&cfg, longkey, "v"), 0);
    assert_string_equal(fy_config_get(&cfg, longkey), "v");
    static char longval[FY_CONFIG_VALUE_MAX + 1];
    memset(longval, 'v', sizeof longval - 1);
    longval[FY_CONFIG_VALUE_MAX] = 0;
    assert_int_equal(fy_config_set(&cfg, "lv", longval), -E2BIG);
    assert_int_equal(fy_config_setf(&cfg, "lv", "%s", longval), -E2BIG);
    assert_null(fy_config_get(&cfg, "lv"));
    assert_int_equal(fy_config_set(&cfg, "ml", "line1\nline2"), -E2BIG);
    assert_null(fy_config_get(&cfg, "ml"));

    /* the table fills up */
    fy_config_init(&cfg);
    for (int i = 0; i < FY_CONFIG_MAX_ENTRIES; i++)
        assert_int_equal(fy_config_setf(&cfg, "k", "%d", i), 0);
    assert_int_equal(cfg.count, 1);
    for (int i = 1; i < FY_CONFIG_MAX_ENTRIES; i++) {
        char key[32];
        snprintf(key, sizeof key, "key%d", i);
        assert_int_equal(fy_config_set(&cfg, key, "x"), 0);
    }
    assert_int_equal(cfg.count, FY_CONFIG_MAX_ENTRIES);
    assert_int_equal(fy_config_set(&cfg, "one-too-many", "x"), -E2BIG);
    /* replacing still works when full */
    assert_int_equal(fy_config_set(&cfg, "key5", "y"), 0);
    assert_string_equal(fy_config_get(&cfg, "key5"), "y");
}

static void test_typed_getters(void **state)
{
    fy_config_init(&cfg);
    fy_config_set(&cfg, "n", "4096");
    fy_config_set(&cfg, "mem", "24G");
    fy_config_set(&cfg, "lr", "1e-4");
    fy_config_set(&cfg, "neg", "-1");
    fy_config_set(&cfg, "junk", "12abc");
    fy_config_set(&cfg, "empty", "");
    fy_config_set(&cfg, "inf", "inf");
    fy_config_set(&cfg, "nan", "nan");

    uint64_t u = 0;
    assert_int_equal(fy_config_get_u64(&cfg, "n", 1, 0, &u), 0);
    assert_true(u == 4096);
    assert_int_equal(fy_config_get_u64(&cfg, "mem", 1, 0, &u), 0);
    assert_true(u == 24ull << 30);
    /* default when absent and optional */
    u = 1;
    assert_int_equal(fy_config_get_u64(&cfg, "absent", 0, 777, &u), 0);
    assert_true(u == 777);
    /* required and absent */
    u = 5;
    assert_int_equal(fy_config_get_u64(&cfg, "absent", 1, 777, &u), -ENOENT);
    /* malformed */
    assert_int_equal(fy_config_get_u64(&cfg, "neg", 1, 0, &u), -EINVAL);
    assert_int_equal(fy_config_get_u64(&cfg, "junk", 0, 3, &u), -EINVAL);
    assert_int_equal(fy_config_get_u64(&cfg, "empty", 0, 3, &u), -EINVAL);
    assert_int_equal(fy_config_get_u64(&cfg, "lr", 0, 3, &u), -EINVAL);

    double x = 0;
    assert_int_equal(fy_config_get_double(&cfg, "lr", 1, 0, &x), 0);
    assert_true(x == 1e-4);
    assert_int_equal(fy_config_get_double(&cfg, "neg", 1, 0, &x), 0);
    assert_true(x == -1.0);
    assert_int_equal(fy_config_get_double(&cfg, "n", 1, 0, &x), 0);
    assert_true(x == 4096.0);
    x = 0;
    assert_int_equal(fy_config_get_double(&cfg, "absent", 0, 0.5, &x), 0);
    assert_true(x == 0.5);
    assert_int_equal(fy_config_get_double(&cfg, "absent", 1, 0.5, &x), -ENOENT);
    assert_int_equal(fy_config_get_double(&cfg, "junk", 1, 0, &x), -EINVAL);
    assert_int_equal(fy_config_get_double(&cfg, "mem", 1, 0, &x), -EINVAL);
    assert_int_equal(fy_config_get_double(&cfg, "empty", 1, 0, &x), -EINVAL);
    assert_int_equal(fy_config_get_double(&cfg, "inf", 1, 0, &x), -EINVAL);
    assert_int_equal(fy_config_get_double(&cfg, "nan", 1, 0, &x), -EINVAL);
}

static void expect_size(const char *text, uint64_t want)
{
    uint64_t v = 0xdeadull;
    int rc = fy_parse_size(text, &v);
    if (rc != 0 || v != want)
        fail_msg("fy_parse_size(\"%s\") = %d, %llu; expected 0, %llu", text, rc,
                 (unsigned long long)v, (unsigned long long)want);
}

static void expect_bad_size(const char *text)
{
    uint64_t v = 0xdeadull;
    int rc = fy_parse_size(text, &v);
    if (rc >= 0)
        fail_msg("fy_parse_size(\"%s\") accepted (%llu)", text, (unsigned long long)v);
    assert_true(rc == -EINVAL || rc == -ERANGE);
    assert_true(v == 0xdeadull); /* out untouched on error */
}

static void test_parse_size(void **state)
{
    expect_size("0", 0);
    expect_size("4096", 4096);
    expect_size("64K", 64ull << 10);
    expect_size("64k", 64ull << 10);
    expect_size("1M", 1ull << 20);
    expect_size("24G", 24ull << 30);
    expect_size("2T", 2ull << 40);
    expect_size("1GiB", 1ull << 30);
    expect_size("1GB", 1ull << 30);
    expect_size("512MiB", 512ull << 20);
    expect_size(" 8K", 8ull << 10);
    expect_size("18446744073709551615", UINT64_MAX);
    expect_size("16777215T", 16777215ull << 40);

    expect_bad_size("");
    expect_bad_size("x");
    expect_bad_size("-1");
    expect_bad_size("+1");
    expect_bad_size("1X");
    expect_bad_size("1.5G");
    expect_bad_size("1G ");
    expect_bad_size("1Gi");
    expect_bad_size("1GiBx");
    expect_bad_size("K");
    expect_bad_size("12abc");
    expect_bad_size("18446744073709551616"); /* 2^64 */
    assert_int_equal(fy_parse_size("99999999999T", &(uint64_t){0}), -ERANGE);
    assert_int_equal(fy_parse_size("16777216T", &(uint64_t){0}), -ERANGE); /* exactly 2^64 */
    expect_bad_size("99999999999T");
    assert_int_equal(fy_parse_size("1X", &(uint64_t){0}), -EINVAL);
    assert_int_equal(fy_parse_size("", &(uint64_t){0}), -EINVAL);
}

static void test_format_size(void **state)
{
    char buf[64];
    fy_format_size(0, buf, sizeof buf);
    assert_string_equal(buf, "0 B");
    fy_format_size(1023, buf, sizeof buf);
    assert_string_equal(buf, "1023 B");
    fy_format_size(1024, buf, sizeof buf);
    assert_string_equal(buf, "1.0 KiB");
    fy_format_size(3ull << 29, buf, sizeof buf);
    assert_string_equal(buf, "1.5 GiB");
    fy_format_size(24ull << 30, buf, sizeof buf);
    assert_string_equal(buf, "24.0 GiB");
    fy_format_size(2ull << 40, buf, sizeof buf);
    assert_string_equal(buf, "2.0 TiB");
    fy_format_size(2048ull << 40, buf, sizeof buf); /* TiB is the largest unit */
    assert_string_equal(buf, "2048.0 TiB");
    /* a short buffer is terminated, not overrun */
    char small[6];
    memset(small, 'z', sizeof small);
    fy_format_size(3ull << 29, small, 4);
    assert_string_equal(small, "1.5");
    assert_int_equal(small[4], 'z');
}

static char *write_file(const char *dir, const char *name, const char *text)
{
    char *path = NULL;
    assert_true(asprintf(&path, "%s/%s", dir, name) > 0);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    return path;
}

static int count_tmp_files(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l >= 4 && strcmp(e->d_name + l - 4, ".tmp") == 0)
            n++;
    }
    closedir(d);
    return n;
}

static void test_save_load(void **state)
{
    char *dir = fy_test_tmpdir("config");
    assert_non_null(dir);
    char *path = NULL;
    assert_true(asprintf(&path, "%s/run.conf", dir) > 0);

    fy_config_init(&cfg);
    fy_config_set(&cfg, "cpu_mem", "24G");
    fy_config_set(&cfg, "lr", "0.0001");
    fy_config_set(&cfg, "name", "a value with spaces");
    fy_config_set(&cfg, "eq", "x=y");
    fy_config_set(&cfg, "empty", "");
    assert_int_equal(fy_config_save(&cfg, path), 0);
    assert_int_equal(count_tmp_files(dir), 0);

    size_t len = 0;
    char *text = fy_test_slurp(path, &len);
    assert_non_null(text);
    assert_true(strncmp(text, "# fuyou run config v1\n", 22) == 0);
    assert_non_null(strstr(text, "cpu_mem = 24G\n"));
    free(text);

    assert_int_equal(fy_config_load(&cfg2, path), 0);
    assert_int_equal(cfg2.count, cfg.count);
    for (unsigned i = 0; i < cfg.count; i++) {
        const char *v = fy_config_get(&cfg2, cfg.entries[i].key);
        assert_non_null(v);
        assert_string_equal(v, cfg.entries[i].value);
    }
    assert_string_equal(cfg2.path, path);
    uint64_t mem = 0;
    assert_int_equal(fy_config_get_u64(&cfg2, "cpu_mem", 1, 0, &mem), 0);
    assert_true(mem == 24ull << 30);

    /* Saving again replaces the file (no stale keys, no .tmp left). */
    fy_config_init(&cfg);
    fy_config_set(&cfg, "only", "this");
    assert_int_equal(fy_config_save(&cfg, path), 0);
    assert_int_equal(count_tmp_files(dir), 0);
    assert_int_equal(fy_config_load(&cfg2, path), 0);
    assert_int_equal(cfg2.count, 1);
    assert_string_equal(fy_config_get(&cfg2, "only"), "this");
    assert_null(fy_config_get(&cfg2, "cpu_mem"));

    /* An empty config saves and loads as empty. */
    fy_config_init(&cfg);
    assert_int_equal(fy_config_save(&cfg, path), 0);
    assert_int_equal(fy_config_load(&cfg2, path), 0);
    assert_int_equal(cfg2.count, 0);

    /* Hand-written file: comments, blank lines, surrounding spaces. */
    char *hand = write_file(dir, "hand.conf",
                            "# fuyou run config v1\n\n# a comment\n  key1 =  v1  \nkey2=v2\n\t\n");
    assert_int_equal(fy_config_load(&cfg2, hand), 0);
    assert_int_equal(cfg2.count, 2);
    assert_string_equal(fy_config_get(&cfg2, "key1"), "v1");
    assert_string_equal(fy_config_get(&cfg2, "key2"), "v2");
    free(hand);

    free(path);
    fy_test_rmdir(dir);
    free(dir);
}

static void test_load_rejects(void **state)
{
    char *dir = fy_test_tmpdir("config");
    assert_non_null(dir);

    char *p = write_file(dir, "noheader.conf", "key = value\n");
    assert_int_equal(fy_config_load(&cfg2, p), -EBADMSG);
    free(p);
    p = write_file(dir, "wrongheader.conf", "# some other file\nkey = value\n");
    assert_int_equal(fy_config_load(&cfg2, p), -EBADMSG);
    free(p);
    p = write_file(dir, "empty.conf", "");
    assert_int_equal(fy_config_load(&cfg2, p), -EBADMSG);
    free(p);
    p = write_file(dir, "noeq.conf", "# fuyou run config v1\nkey = value\njust a line\n");
    assert_int_equal(fy_config_load(&cfg2, p), -EINVAL);
    free(p);
    p = write_file(dir, "header-only.conf", "# fuyou run config v1\n");
    assert_int_equal(fy_config_load(&cfg2, p), 0);
    assert_int_equal(cfg2.count, 0);
    free(p);

    char *missing = NULL;
    assert_true(asprintf(&missing, "%s/does-not-exist.conf", dir) > 0);
    assert_int_equal(fy_config_load(&cfg2, missing), -ENOENT);
    free(missing);

    fy_test_rmdir(dir);
    free(dir);
}

static void test_save_errors(void **state)
{
    char *dir = fy_test_tmpdir("config");
    assert_non_null(dir);
    fy_config_init(&cfg);
    fy_config_set(&cfg, "a", "1");

    char *path = NULL;
    assert_true(asprintf(&path, "%s/no/such/dir/run.conf", dir) > 0);
    int rc = fy_config_save(&cfg, path);
    assert_true(rc < 0);
    assert_int_equal(rc, -ENOENT);
    free(path);

    /* Replacing an existing file that has different content. */
    assert_true(asprintf(&path, "%s/run.conf", dir) > 0);
    char *old = write_file(dir, "run.conf", "old content\n");
    free(old);
    assert_int_equal(fy_config_save(&cfg, path), 0);
    char *text = fy_test_slurp(path, NULL);
    assert_non_null(text);
    assert_string_equal(text, "# fuyou run config v1\na = 1\n");
    free(text);
    assert_int_equal(count_tmp_files(dir), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    free(path);

    fy_test_rmdir(dir);
    free(dir);
}

int main(void)
{
    fy_log_init("test", FY_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_set_get_replace),
        cmocka_unit_test(test_typed_getters),
        cmocka_unit_test(test_parse_size),
        cmocka_unit_test(test_format_size),
        cmocka_unit_test(test_save_load),
        cmocka_unit_test(test_load_rejects),
        cmocka_unit_test(test_save_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
