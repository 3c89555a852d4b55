/* Tests of common/base/knobs, the environment variables the programs read:
 *   - every variable has its row in docs/configuration.md's "Environment variables", and every
 *     FUYOU_ variable there is one the programs read; the test hooks are the FUYOU_TEST_ ones, and
 *     their rows say that they are test hooks;
 *   - no source of the programs calls getenv but common/base/knobs.c;
 *   - each variable parsed as its reader had it: the values that switch it on, those that do not,
 *     and the refusals. (Run from the repository root.) */
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

#include "common/base/knobs.h"
#include "common/base/log.h"
#include "tests/testutil.h"

/* The "## Environment variables" section of the configuration reference. */
static char *env_section(char *doc)
{
    char *at = strstr(doc, "\n## Environment variables\n");
    assert_non_null(at);
    char *end = strstr(at + 1, "\n## ");
    if (end != NULL)
        *end = 0;
    return at;
}

static void test_documented(void **state)
{
    (void)state;
    char *doc = fy_test_slurp("docs/configuration.md", NULL);
    assert_non_null(doc);
    char *sec = env_section(doc);
    unsigned n;
    const struct fy_knob *k = fy_knobs(&n);
    assert_true(n >= 13);
    for (unsigned i = 0; i < n; i++) {
        char row[96];
        snprintf(row, sizeof row, "\n| `%s", k[i].name);
        char *at = strstr(sec, row);
        if (at == NULL)
            fail_msg("%s is not in docs/configuration.md's Environment variables: add its row",
                     k[i].name);
        int hook = strncmp(k[i].name, "FUYOU_TEST_", 11) == 0;
        assert_int_equal(hook, k[i].kind == FY_KNOB_TEST);
        char *eol = strchr(at + 1, '\n');
        if (eol != NULL)
            *eol = 0;
        if (hook && strcasestr(at, "test hook") == NULL)
            fail_msg("docs/configuration.md: the row of %s does not say it is a test hook",
                     k[i].name);
        if (eol != NULL)
            *eol = '\n';
    }
    for (char *p = sec; (p = strstr(p, "\n| `FUYOU_")) != NULL; p++) {
        char name[64];
        size_t len = strcspn(p + 4, "`=");
        snprintf(name, sizeof name, "%.*s", (int)len, p + 4);
        int found = 0;
        for (unsigned i = 0; i < n; i++)
            found |= strcmp(k[i].name, name) == 0;
        if (!found)
            fail_msg("docs/configuration.md describes %s, which no program reads", name);
    }
    free(doc);
}

/* Calls of getenv in the sources under dir, but common/base/knobs.c's. */
static int getenv_calls(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    int calls = 0;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t len = strlen(e->d_name);
        int source = len > 2 && (strcmp(e->d_name + len - 2, ".c") == 0 ||
                                 strcmp(e->d_name + len - 2, ".h") == 0 ||
                                 (len > 3 && strcmp(e->d_name + len - 3, ".cu") == 0) ||
                                 (len > 4 && strcmp(e->d_name + len - 4, ".cuh") == 0));
        if (e->d_type == DT_DIR) {
            calls += getenv_calls(path);
        } else if (source && strcmp(path, "common/base/knobs.c") != 0) {
            char *text = fy_test_slurp(path, NULL);
            assert_non_null(text);
            for (char *p = text; (p = strstr(p, "getenv(")) != NULL; p++) {
                print_message("%s calls getenv: read the variable through common/base/knobs.h\n",
                              path);
                calls++;
            }
            free(text);
        }
    }
    closedir(d);
    return calls;
}

static void test_read_in_one_place(void **state)
{
    (void)state;
    static const char *const roots[] = {"common", "launcher", "gpu_worker", "io_worker",
                                        "opt_worker"};
    int calls = 0;
    for (size_t i = 0; i < sizeof roots / sizeof roots[0]; i++)
        calls += getenv_calls(roots[i]);
    assert_int_equal(calls, 0);
}

static void test_parsing(void **state)
{
    (void)state;
    unsetenv("FUYOU_LOG");
    assert_int_equal(fy_knob_log_level(), -1);
    setenv("FUYOU_LOG", "DEBUG", 1);
    assert_int_equal(fy_knob_log_level(), FY_LOG_DEBUG);
    setenv("FUYOU_LOG", "warn", 1);
    assert_int_equal(fy_knob_log_level(), FY_LOG_WARN);
    assert_int_equal(fy_knob_log_level_or(FY_LOG_INFO), FY_LOG_WARN);
    setenv("FUYOU_LOG", "loud", 1);
    assert_int_equal(fy_knob_log_level(), -1);
    assert_int_equal(fy_knob_log_level_or(FY_LOG_INFO), FY_LOG_INFO);
    unsetenv("FUYOU_LOG");
    assert_int_equal(fy_knob_log_level_or(FY_LOG_ERROR), FY_LOG_ERROR);

    setenv("FUYOU_TOKENIZE_SCRIPT", "", 1);
    assert_null(fy_knob_tokenize_script());
    setenv("FUYOU_TOKENIZE_SCRIPT", "/x/fuyou_tokenize.py", 1);
    assert_string_equal(fy_knob_tokenize_script(), "/x/fuyou_tokenize.py");
    unsetenv("FUYOU_TOKENIZE_SCRIPT");

    /* the switches: on for one value only */
    static const struct {
        const char *name, *on, *off;
        int (*get)(void);
    } switches[] = {
        {"FUYOU_CUDA_ATTENTION", "materialised", "flash", fy_knob_cuda_materialised_attention},
        {"FUYOU_CUDA_FUSE", "0", "1", fy_knob_cuda_unfused},
        {"FUYOU_GPU_QUEUE", "1", "0", fy_knob_gpu_one_at_a_time},
        {"FUYOU_TEST_PROFILE_FAIL", "1", "yes", fy_knob_test_profile_fail},
        {"FUYOU_TEST_EMBED_WHOLE", "1", "0", fy_knob_test_embed_whole},
    };
    for (size_t i = 0; i < sizeof switches / sizeof switches[0]; i++) {
        unsetenv(switches[i].name);
        assert_int_equal(switches[i].get(), 0);
        setenv(switches[i].name, switches[i].on, 1);
        assert_int_equal(switches[i].get(), 1);
        setenv(switches[i].name, switches[i].off, 1);
        assert_int_equal(switches[i].get(), 0);
        unsetenv(switches[i].name);
    }

    int most = -5;
    assert_int_equal(fy_knob_test_keep_layers(&most), 0);
    assert_int_equal(most, -5);
    setenv("FUYOU_TEST_KEEP_LAYERS", "3", 1);
    assert_int_equal(fy_knob_test_keep_layers(&most), 1);
    assert_int_equal(most, 3);
    unsetenv("FUYOU_TEST_KEEP_LAYERS");

    assert_true(fy_knob_test_io_enospc_after() == -1);
    setenv("FUYOU_TEST_IO_ENOSPC_AFTER", "150", 1);
    assert_true(fy_knob_test_io_enospc_after() == 150);
    unsetenv("FUYOU_TEST_IO_ENOSPC_AFTER");

    uint64_t seed = 99;
    assert_null(fy_knob_test_act_mix(&seed));
    assert_true(seed == 0);
    setenv("FUYOU_TEST_ACT_MIX", "7", 1);
    assert_string_equal(fy_knob_test_act_mix(&seed), "7");
    assert_true(seed == 7);
    unsetenv("FUYOU_TEST_ACT_MIX");

    assert_int_equal(fy_knob_test_export_pause_ms(), 0);
    setenv("FUYOU_TEST_EXPORT_PAUSE_MS", "250", 1);
    assert_int_equal(fy_knob_test_export_pause_ms(), 250);
    unsetenv("FUYOU_TEST_EXPORT_PAUSE_MS");

    assert_int_equal(fy_knob_test_start_pause_ms(), 0);
    setenv("FUYOU_TEST_START_PAUSE_MS", "400", 1);
    assert_int_equal(fy_knob_test_start_pause_ms(), 400);
    unsetenv("FUYOU_TEST_START_PAUSE_MS");

    size_t bytes = 17;
    assert_int_equal(fy_knob_test_metrics_pending_max(&bytes), 0);
    assert_int_equal(bytes, 17);
    setenv("FUYOU_TEST_METRICS_PENDING_MAX", "1000", 1);
    assert_int_equal(fy_knob_test_metrics_pending_max(&bytes), 1);
    assert_int_equal(bytes, 1000);
    static const char *const bad_bytes[] = {"0", "12k", "-3", ""};
    for (size_t i = 0; i < sizeof bad_bytes / sizeof bad_bytes[0]; i++) {
        setenv("FUYOU_TEST_METRICS_PENDING_MAX", bad_bytes[i], 1);
        assert_int_equal(fy_knob_test_metrics_pending_max(&bytes), -EINVAL);
    }
    unsetenv("FUYOU_TEST_METRICS_PENDING_MAX");

    long ms = 5;
    assert_int_equal(fy_knob_test_opt_delay_ms(&ms), 0);
    assert_int_equal(ms, 0);
    setenv("FUYOU_TEST_OPT_DELAY_MS", "", 1);
    assert_int_equal(fy_knob_test_opt_delay_ms(&ms), 0);
    setenv("FUYOU_TEST_OPT_DELAY_MS", "40", 1);
    assert_int_equal(fy_knob_test_opt_delay_ms(&ms), 1);
    assert_int_equal(ms, 40);
    static const char *const bad_ms[] = {"10001", "-1", "4x"};
    for (size_t i = 0; i < sizeof bad_ms / sizeof bad_ms[0]; i++) {
        setenv("FUYOU_TEST_OPT_DELAY_MS", bad_ms[i], 1);
        assert_int_equal(fy_knob_test_opt_delay_ms(&ms), -EINVAL);
    }
    unsetenv("FUYOU_TEST_OPT_DELAY_MS");
}

int main(void)
{
    fy_log_init("test", FY_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_documented),
        cmocka_unit_test(test_read_in_one_place),
        cmocka_unit_test(test_parsing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
