/* GPU integration test: training through the worker processes on the CUDA backend follows the CPU
 * backend's loss trajectory (bf16 against fp32: within 2e-3 relative per step over 15 steps; the
 * measured difference is about 4e-4), and two CUDA runs give identical losses and weights. The
 * overlapped and serial schedules, with the optimizer state all in the pool, all on the store or
 * split, and with the gpu worker's requests queued two deep or completed one at a time, all give
 * the same losses and weights, bit for bit; so do the kept units' weights sent as the bf16 copies
 * AdamW writes (--weights-dtype auto on CUDA) and the streamed units' sent as f32 masters. */
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
#include <unistd.h>

#include "gpu_worker/backend.h"
#include "tests/testutil.h"

#define STEPS "15"

static char *dir;

static int launch(const char *const *args)
{
    char log[600];
    snprintf(log, sizeof log, "%s/log", dir);
    unlink(log);
    int status = fy_test_run("fuyou-launch", args, log, 600);
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fy_test_file_contains(log, "(the run failed)");
        return -1;
    }
    return 0;
}

/* Inits a GPT of `layers` layers (4 heads, seed 3) of width `embd` and context `ctx` in DIR/NAME,
 * trains it with `opts` (NULL-terminated; the run directory, the data and --export DIR/NAME.fywt
 * are added) and returns its metrics text. */
static char *init_and_train(const char *name, const char *layers, const char *embd,
                            const char *ctx, const char *const *opts)
{
    char run_dir[600], data[600], out[600], metrics[700];
    snprintf(run_dir, sizeof run_dir, "%s/%s", dir, name);
    snprintf(data, sizeof data, "%s/sample.tok", dir);
    snprintf(out, sizeof out, "%s/%s.fywt", dir, name);
    const char *init[] = {"init", "--run-dir", run_dir, "--layers", layers, "--heads", "4",
                          "--embd", embd, "--ctx", ctx, "--seed", "3", NULL};
    assert_int_equal(launch(init), 0);
    const char *train[48] = {"train", "--run-dir", run_dir, "--data", data, "--export", out};
    int n = 7;
    for (int i = 0; opts[i] != NULL && n < 47; i++)
        train[n++] = opts[i];
    train[n] = NULL;
    assert_int_equal(launch(train), 0);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run_dir);
    char *text = fy_test_slurp(metrics, NULL);
    assert_non_null(text);
    return text;
}

/* Trains a fresh model on `backend` in DIR/NAME and returns its per-step losses. */
static void run(const char *name, const char *backend, double *loss, int n)
{
    const char *opts[] = {"--steps", STEPS, "--batch", "8", "--seq", "64", "--lr", "3e-3",
                          "--warmup", "5", "--eval-every", "0", "--eval-batches", "4",
                          "--backend", backend, NULL};
    char *text = init_and_train(name, "2", "64", "64", opts);
    int i = 0;
    for (char *p = text; i < n && (p = strstr(p, "\"loss\": ")) != NULL; p++)
        loss[i++] = strtod(p + strlen("\"loss\": "), NULL);
    assert_int_equal(i, n);
    free(text);
}

static void test_cuda_follows_cpu_and_repeats(void **state)
{
    const int n = atoi(STEPS);
    double cpu[64], cuda[64], again[64];
    run("cpu", "cpu", cpu, n);
    run("cuda", "cuda", cuda, n);
    run("cuda2", "cuda", again, n);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double rel = fabs(cuda[i] - cpu[i]) / cpu[i];
        print_message("step %2d  cpu %.5f  cuda %.5f  relative difference %.2e\n", i + 1, cpu[i],
                      cuda[i], rel);
        worst = rel > worst ? rel : worst;
        assert_true(cuda[i] == again[i]); /* deterministic */
    }
    assert_true(worst < 2e-3);
    assert_true(cuda[n - 1] < cuda[0] - 0.5); /* and it learns */
    char a[700], b[700];
    snprintf(a, sizeof a, "%s/cuda.fywt", dir);
    snprintf(b, sizeof b, "%s/cuda2.fywt", dir);
    size_t na, nb;
    char *wa = fy_test_slurp(a, &na), *wb = fy_test_slurp(b, &nb);
    assert_non_null(wa);
    assert_non_null(wb);
    assert_int_equal(na, nb);
    assert_memory_equal(wa, wb, na);
    free(wa);
    free(wb);
}

/* One CUDA run of 6 steps of a `layers` x 256 model with its checkpoints at `ckpt` (host or ssd);
 * returns its metrics text, *weights the export. */
static char *run_placement(const char *name, const char *layers, const char *ckpt,
                           const char *cpu_mem, const char *schedule, char **weights,
                           size_t *weights_n)
{
    const char *opts[] = {"--steps", "6", "--batch", "8", "--seq", "32", "--lr", "3e-3",
                          "--eval-every", "0", "--backend", "cuda", "--schedule", schedule,
                          "--ckpt-place", ckpt, cpu_mem ? "--cpu-mem" : NULL, cpu_mem, NULL};
    char *text = init_and_train(name, layers, "256", "32", opts), out[600];
    snprintf(out, sizeof out, "%s/%s.fywt", dir, name);
    *weights = fy_test_slurp(out, weights_n);
    assert_non_null(*weights);
    return text;
}

/* The losses of a metrics text, each as printed. */
static void losses_of(const char *metrics, char *out, size_t len)
{
    out[0] = 0;
    for (const char *p = metrics; (p = strstr(p, "\"loss\": ")) != NULL; p++) {
        size_t used = strlen(out);
        snprintf(out + used, len - used, "%.*s ", (int)strcspn(p + 8, ","), p + 8);
    }
}

/* Runs that must agree bit for bit: the first run's export and losses, which each later one must
 * equal. */
struct same_bits {
    char *first;
    size_t first_n;
    char losses[512];
};

/* Takes w (an export of n bytes, freed here or kept as the first) and the run's losses. */
static void same_bits_check(struct same_bits *g, char *w, size_t n, const char *losses)
{
    if (g->first == NULL) {
        assert_true(strlen(losses) > 0);
        g->first = w;
        g->first_n = n;
        snprintf(g->losses, sizeof g->losses, "%s", losses);
        return;
    }
    assert_string_equal(losses, g->losses);
    assert_int_equal(n, g->first_n);
    assert_memory_equal(w, g->first, n);
    free(w);
}

static void test_schedules_placements_and_queueing_agree(void **state)
{
    (void)state;
    /* 60M holds 3 of the 4 units' state with their bf16 copies (plan --backend cuda says so;
     * test_placement measures the same budget on the CPU) */
    const char *mems[3] = {NULL, "60M", "1G"};
    struct same_bits group = {0};
    for (int i = 0; i < 7; i++) {
        const char *mem = mems[i % 3], *schedule = i / 3 == 1 ? "serial" : "overlap";
        char name[32], losses[512];
        snprintf(name, sizeof name, "place%d", i);
        if (i == 6)
            setenv("FUYOU_GPU_QUEUE", "1", 1);
        size_t n;
        char *w, *metrics = run_placement(name, "2", "host", mem, schedule, &w, &n);
        unsetenv("FUYOU_GPU_QUEUE");
        char log[600];
        snprintf(log, sizeof log, "%s/log", dir);
        if (i % 3 == 1)
            assert_true(fy_test_file_contains(log, "optimizer state of 3 of 4 units"));
        if (i % 3 == 2) /* every unit kept, with its copy: bf16 weights only */
            assert_true(fy_test_file_contains(log, "weights to the GPU in bf16 for all 4 units: "
                                                   "4 from a bf16 copy"));
        losses_of(metrics, losses, sizeof losses);
        print_message("%-8s cpu-mem %-4s %-22s losses %s\n", schedule, mem ? mem : "none",
                      i == 6 ? "one request at a time" : "queued", losses);
        free(metrics);
        same_bits_check(&group, w, n, losses);
    }
    free(group.first);
}

/* --act-plan: the blocks' internals kept on the GPU for the backward (all six blocks within 1G, or
 * three with the test hook capping them, so kept and recomputed blocks mix), against every block
 * recomputed: the same bits, with both schedules and with clipping, in two backward passes (the
 * second must recompute the blocks whose kept set the first used) and in one (--clip-mode
 * one-pass, the gradients held in the pool or, --clip-hold gpu, in the GPU arena), whose runs give
 * the same bits as the two passes'. */
static void test_kept_internals_agree(void **state)
{
    (void)state;
    char log[600];
    snprintf(log, sizeof log, "%s/log", dir);
    struct same_bits group = {0};
    /* none, two passes, one pass with the gradients in the pool, one with them on the GPU */
    for (int clip = 0; clip < 4; clip++) {
        if (clip < 2) { /* one pass is checked against the two passes' bits */
            free(group.first);
            group = (struct same_bits){0};
        }
        for (int i = 0; i < 4; i++) {
            const char *plan = i == 0 ? "recompute" : "auto";
            const char *schedule = i == 3 ? "serial" : "overlap";
            const char *cap = i == 2 ? "3" : NULL;
            char name[32], losses[512], out[600];
            snprintf(name, sizeof name, "keep%d-%d", clip, i);
            const char *opts[] = {"--steps", "6", "--batch", "8", "--seq", "32", "--lr", "3e-3",
                                  "--eval-every", "0", "--backend", "cuda", "--gpu-mem", "1G",
                                  "--schedule", schedule, "--act-plan", plan,
                                  "--clip-grad-norm", clip ? "0.05" : "0", "--clip-mode",
                                  clip >= 2 ? "one-pass" : "two-pass", "--clip-hold",
                                  clip == 3 ? "gpu" : "pool", NULL};
            if (cap != NULL)
                setenv("FUYOU_TEST_KEEP_LAYERS", cap, 1);
            char *metrics = init_and_train(name, "6", "256", "32", opts);
            unsetenv("FUYOU_TEST_KEEP_LAYERS");
            const char *expect = i == 0 ? NULL : i == 2 ? "internals of 3 blocks kept"
                                                        : "internals of 6 blocks kept";
            if (expect != NULL)
                assert_true(fy_test_file_contains(log, expect));
            else
                assert_false(fy_test_file_contains(log, "blocks kept"));
            snprintf(out, sizeof out, "%s/%s.fywt", dir, name);
            size_t n;
            char *w = fy_test_slurp(out, &n);
            assert_non_null(w);
            losses_of(metrics, losses, sizeof losses);
            print_message("act-plan %-9s %-8s clip %d kept %-4s losses %s\n", plan, schedule, clip,
                          i == 0 ? "none" : cap ? cap : "all", losses);
            free(metrics);
            same_bits_check(&group, w, n, losses);
        }
    }
    free(group.first);
}

/* The checkpoints through four pool slots and the SSD store (six blocks, so the slots are reused,
 * and read back in the backward) give the bits of the checkpoints in the pool, queued or not. */
static void test_checkpoints_on_ssd_agree(void **state)
{
    (void)state;
    struct same_bits group = {0};
    for (int i = 0; i < 4; i++) {
        const char *ckpt = i == 0 ? "host" : "ssd", *schedule = i == 2 ? "serial" : "overlap";
        char name[32], losses[512];
        snprintf(name, sizeof name, "ckpt%d", i);
        if (i == 3)
            setenv("FUYOU_GPU_QUEUE", "1", 1);
        size_t n;
        char *w, *metrics = run_placement(name, "6", ckpt, "1G", schedule, &w, &n);
        unsetenv("FUYOU_GPU_QUEUE");
        losses_of(metrics, losses, sizeof losses);
        print_message("checkpoints %-4s %-8s %-22s losses %s\n", ckpt, schedule,
                      i == 3 ? "one request at a time" : "queued", losses);
        free(metrics);
        same_bits_check(&group, w, n, losses);
    }
    free(group.first);
}

int main(void)
{
    signal(SIGCHLD, SIG_DFL);
    struct fy_backend *probe = NULL;
    if (!fy_backend_cuda_built() || fy_backend_open(&probe, "cuda", 0) < 0) {
        printf("test_cuda_train: SKIPPED: no CUDA backend or no usable CUDA device\n");
        return FY_TEST_SKIP;
    }
    fy_backend_destroy(&probe);
    dir = fy_test_tmpdir("cuda-train");
    char data[600], log[600];
    snprintf(data, sizeof data, "%s/sample.tok", dir);
    snprintf(log, sizeof log, "%s/log", dir);
    const char *prep[] = {"prepare", "--out", data, "tests/fixtures/sample.txt", NULL};
    int status = fy_test_run("fuyou-launch", prep, log, 60);
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_follows_cpu_and_repeats),
        cmocka_unit_test(test_schedules_placements_and_queueing_agree),
        cmocka_unit_test(test_checkpoints_on_ssd_agree),
        cmocka_unit_test(test_kept_internals_agree),
    };
    int failed = cmocka_run_group_tests_name("cuda training", tests, NULL, NULL);
    fy_test_rmdir(dir);
    free(dir);
    return failed;
}
