/* Tests of the step rates record (launcher/plan/steprates): the SSD's rates summed over steps,
 * AdamW's from the opt worker's busy seconds against the plan's, the record written and read back
 * whole, and every record the reader refuses (with its reason), with no temporary file left
 * behind. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "launcher/plan/steprates.h"
#include "tests/testutil.h"

static char *tmpdir;

static int setup(void **state)
{
    tmpdir = fy_test_tmpdir("steprates");
    return tmpdir == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    fy_test_rmdir(tmpdir);
    free(tmpdir);
    tmpdir = NULL;
    return 0;
}

static const char *tpath(const char *name) { return fy_test_path(tmpdir, name); }

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* Bytes over busy seconds, summed over the steps each way (not a mean of the steps' rates). */
static void test_rates_sum_the_steps(void **state)
{
    struct fy_steprates d;
    fy_steprates_begin(&d, "/ssd/a,/ssd/b", 7, "auto");
    assert_int_equal(d.steps, 0);
    assert_true(fy_steprates_read_Bps(&d) == 0 && fy_steprates_write_Bps(&d) == 0);
    fy_steprates_add(&d, 5, 3000000000ull, 1.0, 0, 0.0, 0.0);
    fy_steprates_add(&d, 6, 1000000000ull, 1.0, 4000000000ull, 2.0, 0.0);
    assert_int_equal(d.steps, 2);
    assert_int_equal(d.first_step, 5);
    assert_int_equal(d.last_step, 6);
    assert_float_equal(fy_steprates_read_Bps(&d), 2e9, 1e-3); /* 4 GB in 2 s, not (3 + 1) / 2 */
    assert_float_equal(fy_steprates_write_Bps(&d), 2e9, 1e-3);
    assert_string_equal(d.ssd, "/ssd/a,/ssd/b");
    assert_string_equal(d.act_plan, "auto");
    assert_int_equal(d.batch, 7);
    /* no plan of AdamW's time: no rate of it, whatever the busy seconds */
    assert_true(fy_steprates_opt_params(&d) == 0);
}

/* AdamW's rate in the steps: the plan's, scaled by the seconds it gave them over the busy seconds
 * summed (the plan's opt time is the work over that rate), and none without either. */
static void test_opt_rate_from_busy_time(void **state)
{
    struct fy_steprates d;
    fy_steprates_begin(&d, "/store", 16, "auto");
    fy_steprates_plan_opt(&d, "int8", 6e9, 1.5); /* the plan: 1.5 s a step at 6 G/s */
    assert_string_equal(d.optim_state, "int8");
    assert_true(fy_steprates_opt_params(&d) == 0); /* no step yet */
    fy_steprates_add(&d, 2, 0, 0.0, 0, 0.0, 2.0);
    fy_steprates_add(&d, 3, 0, 0.0, 0, 0.0, 2.5);
    /* 3.0 s planned against 4.5 s busy: 6 G/s * 3.0 / 4.5 */
    assert_float_equal(fy_steprates_opt_params(&d), 4e9, 1e-3);
    /* a faster worker than planned raises it: the rate is what the steps ran at, either way */
    fy_steprates_add(&d, 4, 0, 0.0, 0, 0.0, 0.5);
    assert_float_equal(fy_steprates_opt_params(&d), 6e9 * 4.5 / 5.0, 1e-3);
    /* no busy time (an opt worker that did nothing): no rate */
    struct fy_steprates idle;
    fy_steprates_begin(&idle, "/store", 16, "auto");
    fy_steprates_plan_opt(&idle, "fp32", 3e9, 1.0);
    fy_steprates_add(&idle, 2, 4096, 1.0, 0, 0.0, 0.0);
    assert_true(fy_steprates_opt_params(&idle) == 0);
    assert_string_equal(fy_steprates_taken(0), "");
    assert_string_equal(fy_steprates_taken(FY_STEPRATES_SSD), "the SSD's");
    assert_string_equal(fy_steprates_taken(FY_STEPRATES_OPT), "AdamW's");
    assert_string_equal(fy_steprates_taken(FY_STEPRATES_SSD | FY_STEPRATES_OPT),
                        "the SSD's and AdamW's");
}

static void test_save_and_load(void **state)
{
    struct fy_steprates d, back;
    fy_steprates_begin(&d, "/store", 29, "recompute");
    fy_steprates_plan_opt(&d, "bf16", 5e9, 0.75);
    fy_steprates_add(&d, 11, 9000000000ull + 4096, 4.25, 7000000000ull, 2.5, 1.0);
    fy_steprates_add(&d, 12, 9000000000ull, 4.75, 7000000000ull + 8192, 2.0, 1.25);
    assert_int_equal(fy_steprates_save(tpath("rates.json"), &d), 0);
    assert_int_equal(access(tpath("rates.json.tmp"), F_OK), -1);
    char why[256] = "";
    assert_int_equal(fy_steprates_load(tpath("rates.json"), &back, why, sizeof why), 0);
    assert_int_equal(back.read_bytes, d.read_bytes);
    assert_int_equal(back.write_bytes, d.write_bytes);
    assert_float_equal(back.read_s, 9.0, 1e-9);
    assert_float_equal(back.write_s, 4.5, 1e-9);
    assert_int_equal(back.steps, 2);
    assert_int_equal(back.first_step, 11);
    assert_int_equal(back.last_step, 12);
    assert_int_equal(back.batch, 29);
    assert_string_equal(back.act_plan, "recompute");
    assert_string_equal(back.ssd, "/store");
    assert_string_equal(back.optim_state, "bf16");
    assert_float_equal(back.opt_plan_params, 5e9, 1e-3);
    assert_float_equal(back.opt_plan_step_s, 0.75, 1e-12);
    assert_float_equal(back.opt_busy_s, 2.25, 1e-12);
    assert_float_equal(fy_steprates_opt_params(&back), 5e9 * 1.5 / 2.25, 1e-3);
    time_t now = time(NULL);
    assert_true(back.written <= now && back.written > now - 60);
    assert_float_equal(fy_steprates_read_Bps(&back), fy_steprates_read_Bps(&d), 1e-3);
    /* the rates are in the file for people and tools as well */
    assert_true(fy_test_file_contains(tpath("rates.json"), "\"read_Bps\":"));
    assert_true(fy_test_file_contains(tpath("rates.json"), "\"write_Bps\":"));
    assert_true(fy_test_file_contains(tpath("rates.json"), "\"opt_params_per_s\":"));
    /* a second save replaces the first whole */
    fy_steprates_add(&d, 13, 1, 1.0, 1, 1.0, 1.0);
    assert_int_equal(fy_steprates_save(tpath("rates.json"), &d), 0);
    assert_int_equal(fy_steprates_load(tpath("rates.json"), &back, why, sizeof why), 0);
    assert_int_equal(back.steps, 3);
}

static void test_missing_record(void **state)
{
    struct fy_steprates d;
    char why[256] = "";
    assert_int_equal(fy_steprates_load(tpath("none.json"), &d, why, sizeof why), -ENOENT);
}

/* A save into a directory that is not there fails, said, and leaves nothing. */
static void test_save_refused(void **state)
{
    struct fy_steprates d;
    fy_steprates_begin(&d, "/store", 1, "auto");
    fy_steprates_add(&d, 2, 4096, 0.001, 4096, 0.001, 0.0);
    assert_int_equal(fy_steprates_save(tpath("no/such/dir/rates.json"), &d), -ENOENT);
}

static void test_bad_records_refused(void **state)
{
    static const struct {
        const char *text, *why;
    } bad[] = {
        {"not json", "not a JSON object"},
        {"[1, 2]", "not a JSON object"},
        {"{\"version\": 2, \"read_bytes\": 1, \"read_seconds\": 1, \"write_bytes\": 1, "
         "\"write_seconds\": 1, \"steps\": 1, \"first_step\": 2, \"last_step\": 2, \"batch\": 1, "
         "\"written_unix\": 0, "
         "\"opt_plan_params_per_s\": 0, \"opt_plan_seconds_per_step\": 0, \"opt_busy_seconds\": 0, "
         "\"act_plan\": \"auto\", \"ssd\": \"/s\", \"optim_state\": \"fp32\"}",
         "version 2, this build reads version 1"},
        {"{\"version\": 1, \"read_bytes\": -1, \"read_seconds\": 1, \"write_bytes\": 1, "
         "\"write_seconds\": 1, \"steps\": 1, \"first_step\": 2, \"last_step\": 2, \"batch\": 1, "
         "\"written_unix\": 0, "
         "\"opt_plan_params_per_s\": 0, \"opt_plan_seconds_per_step\": 0, \"opt_busy_seconds\": 0, "
         "\"act_plan\": \"auto\", \"ssd\": \"/s\", \"optim_state\": \"fp32\"}",
         "\"read_bytes\" is not a number >= 0"},
        {"{\"version\": 1, \"read_bytes\": 1, \"read_seconds\": 1, \"write_bytes\": 1, "
         "\"write_seconds\": 1, \"steps\": 1, \"first_step\": 2, \"last_step\": 2, \"batch\": 1, "
         "\"opt_plan_params_per_s\": 0, \"opt_plan_seconds_per_step\": 0, \"opt_busy_seconds\": 0, "
         "\"act_plan\": \"auto\", \"ssd\": \"/s\", \"optim_state\": \"fp32\"}",
         "\"written_unix\" is not a number >= 0"},
        {"{\"version\": 1, \"read_bytes\": 1, \"read_seconds\": 1, \"write_bytes\": 1, "
         "\"write_seconds\": 1, \"steps\": 1, \"first_step\": 2, \"last_step\": 2, \"batch\": 1, "
         "\"written_unix\": 0, "
         "\"opt_plan_params_per_s\": 0, \"opt_plan_seconds_per_step\": 0, \"opt_busy_seconds\": 0, "
         "\"act_plan\": 3, \"ssd\": \"/s\", \"optim_state\": \"fp32\"}",
         "\"act_plan\", \"ssd\" or \"optim_state\" is not a string"},
        {"{\"version\": 1, \"read_bytes\": 1, \"read_seconds\": 1, \"write_bytes\": 1, "
         "\"write_seconds\": 1, \"steps\": 0, \"first_step\": 2, \"last_step\": 2, \"batch\": 1, "
         "\"written_unix\": 0, "
         "\"opt_plan_params_per_s\": 0, \"opt_plan_seconds_per_step\": 0, \"opt_busy_seconds\": 0, "
         "\"act_plan\": \"auto\", \"ssd\": \"/s\", \"optim_state\": \"fp32\"}",
         "it counts no step"},
        {"{\"version\": 1, \"read_bytes\": 4096, \"read_seconds\": 0, \"write_bytes\": 1, "
         "\"write_seconds\": 1, \"steps\": 1, \"first_step\": 2, \"last_step\": 2, \"batch\": 1, "
         "\"written_unix\": 0, "
         "\"opt_plan_params_per_s\": 0, \"opt_plan_seconds_per_step\": 0, \"opt_busy_seconds\": 0, "
         "\"act_plan\": \"auto\", \"ssd\": \"/s\", \"optim_state\": \"fp32\"}",
         "bytes without seconds"},
        /* a record without AdamW's fields */
        {"{\"version\": 1, \"read_bytes\": 1, \"read_seconds\": 1, \"write_bytes\": 1, "
         "\"write_seconds\": 1, \"steps\": 1, \"first_step\": 2, \"last_step\": 2, \"batch\": 1, "
         "\"written_unix\": 0, \"opt_plan_params_per_s\": 0, \"opt_plan_seconds_per_step\": 0, "
         "\"act_plan\": \"auto\", \"ssd\": \"/s\", \"optim_state\": \"fp32\"}",
         "\"opt_busy_seconds\" is not a number >= 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(tpath("bad.json"), bad[i].text);
        struct fy_steprates d;
        char why[256] = "";
        assert_int_equal(fy_steprates_load(tpath("bad.json"), &d, why, sizeof why), -EINVAL);
        if (strstr(why, bad[i].why) == NULL)
            fail_msg("record %zu: reason '%s', expected '%s'", i, why, bad[i].why);
    }
    /* one with every field and nothing moved one way loads: that way keeps the profile's rate */
    write_text(
        tpath("reads.json"),
        "{\"version\": 1, \"read_bytes\": 8192, \"read_seconds\": 0.5, \"write_bytes\": 0, "
        "\"write_seconds\": 0, \"steps\": 1, \"first_step\": 2, \"last_step\": 2, "
        "\"batch\": 1, \"written_unix\": 0, "
        "\"opt_plan_params_per_s\": 0, \"opt_plan_seconds_per_step\": 0, \"opt_busy_seconds\": 0, "
        "\"act_plan\": \"auto\", \"ssd\": \"/s\", \"optim_state\": \"fp32\"}");
    struct fy_steprates d;
    char why[256] = "";
    assert_int_equal(fy_steprates_load(tpath("reads.json"), &d, why, sizeof why), 0);
    assert_float_equal(fy_steprates_read_Bps(&d), 16384, 1e-9);
    assert_true(fy_steprates_write_Bps(&d) == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rates_sum_the_steps),
        cmocka_unit_test(test_opt_rate_from_busy_time),
        cmocka_unit_test_setup_teardown(test_save_and_load, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_record, setup, teardown),
        cmocka_unit_test_setup_teardown(test_save_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_records_refused, setup, teardown),
    };
    return cmocka_run_group_tests_name("steprates", tests, NULL, NULL);
}
