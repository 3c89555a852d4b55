/* GPU test of the --gpu-mem default: fy_backend_devices_free reads a free figure between 0 and the
 * device's total on GPU 0 and refuses more GPUs than CUDA shows; an arena of the default (the
 * free memory less the margin) opens beside the backend's own context; train on the CUDA backend
 * without --gpu-mem says the default and where it came from on its start line and trains in it,
 * and keeps a --gpu-mem given. Skips without a usable CUDA device. */
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
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_worker/backend.h"
#include "tests/testutil.h"

static char *dir;

static int launch(const char *const *args, const char *log)
{
    unlink(log);
    int status = fy_test_run("fuyou-launch", args, log, 300);
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fy_test_file_contains(log, "(the run failed)"); /* prints the log */
        return -1;
    }
    return 0;
}

static void test_devices_free(void **state)
{
    (void)state;
    uint64_t free_bytes = 0, total_bytes = 0, margin = 0;
    int which = -1;
    unsetenv("FUYOU_TEST_GPU_FREE");
    assert_int_equal(fy_backend_devices_free(1, &free_bytes, &total_bytes, &which), 0);
    assert_int_equal(which, 0);
    assert_true(free_bytes > 0);
    assert_true(free_bytes <= total_bytes);
    printf("GPU 0: %.2f GiB free of %.2f GiB\n", (double)free_bytes / (1 << 30),
           (double)total_bytes / (1 << 30));
    uint64_t budget = fy_backend_gpu_mem_default(free_bytes, total_bytes, &margin);
    assert_true(margin >= (1ull << 30) || margin == free_bytes / 2);
    assert_int_equal(budget + margin, free_bytes);
    /* the launcher's reading left no context behind: the default's arena fits beside the
     * backend's own context and cuBLAS */
    struct fy_backend *b = NULL;
    assert_int_equal(fy_backend_open(&b, "cuda", budget), 0);
    fy_backend_destroy(&b);
    int shown = fy_backend_cuda_devices();
    assert_int_equal(fy_backend_devices_free(shown + 1, &free_bytes, &total_bytes, &which),
                     -ENODEV);
}

/* A small GPT trained 2 steps on the CUDA backend: the start line states the default (or the
 * --gpu-mem given), and the run fits in it. */
static void test_train_states_default(void **state)
{
    (void)state;
    char run_dir[600], data[600], log[600];
    snprintf(run_dir, sizeof run_dir, "%s/run", dir);
    snprintf(data, sizeof data, "%s/sample.tok", dir);
    snprintf(log, sizeof log, "%s/train.log", dir);
    const char *init[] = {"init",   "--run-dir", run_dir, "--layers", "2",      "--heads", "4",
                          "--embd", "64",        "--ctx", "64",       "--seed", "3",       NULL};
    assert_int_equal(launch(init, log), 0);
    const char *train[] = {"train", "--run-dir", run_dir, "--data", data, "--steps",
                           "2",     "--batch",   "4",     "--seq",  "64", "--eval-every",
                           "0",     "--backend", "cuda",  NULL};
    assert_int_equal(launch(train, log), 0);
    assert_true(fy_test_file_contains(log, "train: --gpu-mem "));
    assert_true(fy_test_file_contains(log, "(the default: GPU 0's free memory "));
    assert_true(fy_test_file_contains(log, "less a margin of "));
    const char *given[] = {"train", "--run-dir", run_dir, "--data",    data, "--steps",
                           "3",     "--batch",   "4",     "--seq",     "64", "--eval-every",
                           "0",     "--backend", "cuda",  "--gpu-mem", "1G", NULL};
    assert_int_equal(launch(given, log), 0);
    assert_true(fy_test_file_contains(log, "train: --gpu-mem 1.0 GiB (given)"));
}

int main(void)
{
    signal(SIGCHLD, SIG_DFL);
    struct fy_backend *probe = NULL;
    if (!fy_backend_cuda_built() || fy_backend_open(&probe, "cuda", 0) < 0) {
        printf("test_cuda_gpumem: SKIPPED: no CUDA backend or no usable CUDA device\n");
        return FY_TEST_SKIP;
    }
    fy_backend_destroy(&probe);
    dir = fy_test_tmpdir("cuda-gpumem");
    char data[600], log[600];
    snprintf(data, sizeof data, "%s/sample.tok", dir);
    snprintf(log, sizeof log, "%s/log", dir);
    const char *prep[] = {"prepare", "--out", data, "tests/fixtures/sample.txt", NULL};
    if (launch(prep, log) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_devices_free),
        cmocka_unit_test(test_train_states_default),
    };
    int failed = cmocka_run_group_tests_name("cuda --gpu-mem default", tests, NULL, NULL);
    fy_test_rmdir(dir);
    free(dir);
    return failed;
}
