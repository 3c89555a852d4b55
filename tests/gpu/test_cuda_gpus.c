/* GPU integration test of several GPUs (--gpus 2) on the CUDA backend, through the worker
 * processes: two gpu workers, each on its own GPU computing half of every batch, the gradients
 * summed with NCCL, follow one GPU's loss trajectory within bf16 tolerance (2e-3 relative per step
 * over 10 steps, as CUDA against the CPU backend in test_cuda_train), and two runs give the same
 * losses and weights, bit for bit; the state kept in the pool and streamed from the store alike.
 * Skips, saying why, without the CUDA backend, NCCL or two GPUs. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "gpu_worker/backend.h"
#include "tests/testutil.h"

#define STEPS 10
#define STEPS_TEXT "10"

static char *dir;

static int launch(const char *const *args)
{
    char log[600];
    snprintf(log, sizeof log, "%s/log", dir);
    int status = fy_test_run("fuyou-launch", args, log, 600);
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fy_test_file_contains(log, "(the run failed)");
        return -1;
    }
    return 0;
}

/* A GPT of 2 blocks of width 128 (4 heads, seed 3) in DIR/NAME, trained STEPS steps at batch 8
 * on `gpus` GPUs with --cpu-mem `mem` (NULL: none, the state streamed); its losses into loss,
 * its export into *w (*n bytes). */
static void run(const char *name, const char *gpus, const char *mem, double *loss, char **w,
                size_t *n)
{
    char run_dir[600], data[600], out[600], metrics[700];
    snprintf(run_dir, sizeof run_dir, "%s/%s", dir, name);
    snprintf(data, sizeof data, "%s/sample.tok", dir);
    snprintf(out, sizeof out, "%s/%s.fywt", dir, name);
    const char *init[] = {"init", "--run-dir", run_dir, "--layers", "2", "--heads", "4",
                          "--embd", "128", "--ctx", "64", "--seed", "3", NULL};
    assert_int_equal(launch(init), 0);
    const char *train[40] = {"train", "--run-dir", run_dir, "--data", data, "--export", out,
                             "--steps", STEPS_TEXT, "--batch", "8", "--seq", "64",
                             "--lr", "3e-3", "--warmup", "5", "--eval-every", "0",
                             "--backend", "cuda", "--gpus", gpus};
    int k = 23;
    if (mem != NULL) {
        train[k++] = "--cpu-mem";
        train[k++] = mem;
    }
    train[k] = NULL;
    assert_int_equal(launch(train), 0);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run_dir);
    char *text = fy_test_slurp(metrics, NULL);
    assert_non_null(text);
    int i = 0;
    for (char *p = text; i < STEPS && (p = strstr(p, "\"loss\": ")) != NULL; p++)
        loss[i++] = strtod(p + strlen("\"loss\": "), NULL);
    assert_int_equal(i, STEPS);
    free(text);
    *w = fy_test_slurp(out, n);
    assert_non_null(*w);
}

static void test_two_gpus_follow_one_and_repeat(void **state)
{
    (void)state;
    static const char *const mems[2] = {"1G", NULL};
    for (int m = 0; m < 2; m++) {
        double one[STEPS], two[STEPS], again[STEPS];
        char *w1, *w2, *w3;
        size_t n1, n2, n3;
        const char *tag = mems[m] ? "kept" : "streamed";
        run(fy_test_fmt("one-%s", tag), "1", mems[m], one, &w1, &n1);
        run(fy_test_fmt("two-%s", tag), "2", mems[m], two, &w2, &n2);
        run(fy_test_fmt("two-again-%s", tag), "2", mems[m], again, &w3, &n3);
        double worst = 0;
        for (int i = 0; i < STEPS; i++) {
            double rel = fabs(two[i] - one[i]) / one[i];
            print_message("%s step %2d  one GPU %.5f  two %.5f  relative difference %.2e\n", tag,
                          i + 1, one[i], two[i], rel);
            worst = rel > worst ? rel : worst;
            assert_true(two[i] == again[i]); /* the same bits run to run */
        }
        assert_true(worst < 2e-3);
        assert_int_equal(n2, n3);
        assert_memory_equal(w2, w3, n2);
        free(w1);
        free(w2);
        free(w3);
    }
}

int main(void)
{
    signal(SIGCHLD, SIG_DFL);
    struct fy_backend *probe = NULL;
    if (!fy_backend_cuda_built() || fy_backend_open(&probe, "cuda", 0) < 0) {
        printf("test_cuda_gpus: SKIPPED: no CUDA backend or no usable CUDA device\n");
        return FY_TEST_SKIP;
    }
    int nccl = fy_backend_model_sums_ranks(probe);
    fy_backend_destroy(&probe);
    int gpus = fy_backend_cuda_devices();
    if (!nccl || gpus < 2) {
        printf("test_cuda_gpus: SKIPPED: %s\n",
               !nccl ? "this build has no NCCL (make check-deps)"
                     : fy_test_fmt("two GPUs needed, this machine shows %d", gpus));
        return FY_TEST_SKIP;
    }
    dir = fy_test_tmpdir("cuda-gpus");
    char data[600], log[600];
    snprintf(data, sizeof data, "%s/sample.tok", dir);
    snprintf(log, sizeof log, "%s/log", dir);
    const char *prep[] = {"prepare", "--out", data, "tests/fixtures/sample.txt", NULL};
    int status = fy_test_run("fuyou-launch", prep, log, 60);
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_gpus_follow_one_and_repeat),
    };
    int failed = cmocka_run_group_tests_name("cuda, two gpus", tests, NULL, NULL);
    fy_test_rmdir(dir);
    free(dir);
    return failed;
}
