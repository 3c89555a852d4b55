/* Fault isolation of long runs, through the real processes on the CPU backend: workers and the
 * launcher killed (SIGKILL) at seeded random moments, a worker that stops answering, the launcher
 * stopped and continued, a store of one copy of the state, and exports beside a training run, one
 * of them killed. Each run must end with the losses and final weights of a run never disturbed, bit
 * for bit, and leave no process, shared memory or temporary file behind. The kills and recovery
 * times are printed for the record; the kills again with int8 optimizer state and with bf16 weights
 * converted by the opt worker. (The store damaged,
 * full or moved: test_chaos_store.) */
#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/ipc/pool.h"
#include "io_worker/store.h"
#include "tests/chaos.h"
#include "tests/testutil.h"

static void test_reference_run(void **state) { fy_chaos_reference_run(state); }
#define KILLS_PER_WORKER 8
#define LAUNCHER_KILLS 8

/* Waits until the metrics file holds at least `lines` steps' lines. */
static void wait_steps(const char *metrics, int lines)
{
    while (fy_test_count_matches(metrics, "\"step\": ") < lines)
        fy_test_pause_ms(5);
}

static void kill_worker_in(struct fy_chaos *c, const char *name, const char *run_name, uint64_t seed)
{
    fy_chaos_kill_worker(c, name, run_name, seed, KILLS_PER_WORKER);
}

static void kill_worker_during_run(struct fy_chaos *c, const char *name, uint64_t seed)
{
    kill_worker_in(c, name, name, seed);
}

static void test_gpu_worker_killed(void **state) { kill_worker_during_run(*state, "gpu", 11); }
static void test_io_worker_killed(void **state) { kill_worker_during_run(*state, "io", 12); }
static void test_opt_worker_killed(void **state) { kill_worker_during_run(*state, "opt", 13); }

/* The launcher killed outright, at random moments, and the run resumed each time
 * (fuyou-launch resume): the workers it leaves die with it, the next launch clears the rest. */
static void launcher_killed_in(struct fy_chaos *c, const char *run_name)
{
    struct fy_chaos_paths rp = fy_chaos_new_run(c, run_name);
    const char *run = rp.run, *out = rp.out, *metrics = rp.metrics, *log = rp.log;
    const char *args[48], *resume[] = {"resume", run, NULL};
    fy_chaos_run_args(c, args, run, FY_CHAOS_STEPS, out, NULL);
    unlink(log);
    uint64_t seed = 14;
    int kills = 0, status = -1;
    double resumed_max = 0;
    for (int launch = 0; launch < 100; launch++) {
        int starts = fy_test_count_matches(log, "starting at step");
        double t0 = fy_test_now_s();
        int pid = fy_test_start("fuyou-launch", launch == 0 ? args : resume, log);
        assert_true(pid > 0);
        while (fy_test_count_matches(log, "starting at step") == starts &&
               fy_test_now_s() - t0 < 60 && waitpid(pid, &status, WNOHANG) == 0)
            fy_test_pause_ms(5);
        if (launch > 0 && fy_test_now_s() - t0 > resumed_max)
            resumed_max = fy_test_now_s() - t0;
        if (kills == LAUNCHER_KILLS) {
            status = fy_test_wait(pid, 240);
            break;
        }
        int seen = fy_test_count_matches(metrics, "\"step\": ");
        while (fy_test_count_matches(metrics, "\"step\": ") <= seen && fy_test_now_s() - t0 < 60)
            fy_test_pause_ms(5);
        fy_test_pause_ms((int)(fy_test_rand(&seed) % 120));
        assert_int_equal(kill(pid, SIGKILL), 0);
        assert_true(fy_test_wait(pid, 30) != -1);
        kills++;
    }
    assert_true(status != -1 && WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    printf("chaos: launcher killed %d times, resumed each time; the longest resume took %.2f s "
           "from the command to its first step\n", kills, resumed_max);
    fy_chaos_assert_same_as_reference(c, run, out);
    fy_chaos_assert_nothing_left(run);
}

static void test_launcher_killed(void **state) { launcher_killed_in(*state, "launcher"); }

/* int8 optimizer state (init --optim-state int8): the opt worker killed in the middle of updates
 * that rewrite codes and block absmax in place, and the launcher killed and resumed from the last
 * commit, each end with the losses and weights of an undisturbed int8 run, bit for bit; which
 * differ from the fp32 reference's (the format was in effect). */
static void test_int8_killed(void **state)
{
    struct fy_chaos *c = *state;
    struct fy_chaos c8 = {.f = c->f, .optim_state = "int8"};
    fy_chaos_reference_run_in(&c8, "reference-int8");
    if (c->ref_weights != NULL) {
        assert_int_equal(c8.ref_len, c->ref_len);
        assert_memory_not_equal(c8.ref_weights, c->ref_weights, c->ref_len);
    }
    kill_worker_in(&c8, "opt", "opt-int8", 15);
    launcher_killed_in(&c8, "launcher-int8");
    free(c8.ref_losses);
    free(c8.ref_weights);
}

/* bf16 weights (--weights-dtype bf16), every unit's state streamed: each unit's master read from the
 * store through the landing ring in chunks and converted by the opt worker into its weights slot.
 * The opt worker killed amid conversions and AdamW: the run ends with the losses and weights of an
 * undisturbed bf16 run, bit for bit; which differ from the f32 reference's (the gpu worker computed
 * with weights rounded to bf16). */
static void test_bf16_weights_killed(void **state)
{
    struct fy_chaos *c = *state;
    static const char *const bf16[] = {"--weights-dtype", "bf16", NULL}; /* no --cpu-mem */
    struct fy_chaos cb = {.f = c->f, .train_extra = bf16};
    fy_chaos_reference_run_in(&cb, "reference-bf16");
    assert_true(fy_test_file_contains(c->f->log, "weights to the GPU in bf16 for all 4 units: 0 "
                                                 "from a bf16 copy"));
    if (c->ref_weights != NULL) {
        assert_int_equal(cb.ref_len, c->ref_len);
        assert_memory_not_equal(cb.ref_weights, c->ref_weights, c->ref_len);
    }
    kill_worker_in(&cb, "opt", "opt-bf16", 23);
    free(cb.ref_losses);
    free(cb.ref_weights);
}

/* Clipping in one backward pass (every step clipped, every unit's state streamed, so each block's
 * update is deferred to the next forward): the opt and io workers killed while the squares are
 * summed or the updates run, and the launcher killed, end on the weights of
 * an undisturbed run with the same clipping; that run differs from the unclipped one. */
static void test_clipped_one_pass_killed(void **state)
{
    struct fy_chaos *c = *state;
    static const char *const clip[] = {"--clip-grad-norm", "0.6", "--clip-mode", "one-pass",
                                       NULL}; /* no --cpu-mem: every unit streamed */
    struct fy_chaos cc = {.f = c->f, .train_extra = clip};
    fy_chaos_reference_run_in(&cc, "reference-clipped");
    assert_true(fy_test_file_contains(c->f->log, "plan: clipping in one backward pass"));
    if (c->ref_weights != NULL) {
        assert_int_equal(cc.ref_len, c->ref_len);
        assert_memory_not_equal(cc.ref_weights, c->ref_weights, c->ref_len);
    }
    kill_worker_in(&cc, "opt", "opt-clipped", 16);
    kill_worker_in(&cc, "io", "io-clipped", 17);
    launcher_killed_in(&cc, "launcher-clipped");
    free(cc.ref_losses);
    free(cc.ref_weights);
}

/* The same with the blocks' gradients held in the gpu worker between the norm pass and their
 * updates (--clip-hold gpu): the gpu worker killed (its held gradients lost with it) and the opt
 * worker killed, each run bit-identical to an undisturbed one. */
static void test_clipped_gpu_hold_killed(void **state)
{
    struct fy_chaos *c = *state;
    static const char *const clip[] = {"--clip-grad-norm", "0.6", "--clip-mode", "one-pass",
                                       "--clip-hold", "gpu", NULL};
    struct fy_chaos cc = {.f = c->f, .train_extra = clip};
    fy_chaos_reference_run_in(&cc, "reference-gpu-hold");
    assert_true(fy_test_file_contains(c->f->log, "held in the GPU arena (each sent to the pool "
                                                 "for its update)"));
    kill_worker_in(&cc, "gpu", "gpu-hold-gpu", 18);
    kill_worker_in(&cc, "opt", "gpu-hold-opt", 19);
    free(cc.ref_losses);
    free(cc.ref_weights);
}

/* Two gpu workers (--gpus 2): the second one (gpu1) killed at random moments, and the first one:
 * each time the run restarts from the last commit and ends as the undisturbed two-worker run does,
 * bit for bit. */
static void test_second_gpu_worker_killed(void **state)
{
    struct fy_chaos *c = *state;
    static const char *const two[] = {"--gpus", "2", NULL};
    struct fy_chaos cc = {.f = c->f, .train_extra = two};
    fy_chaos_reference_run_in(&cc, "reference-gpus");
    assert_true(fy_test_file_contains(c->f->log, "started gpu1 worker"));
    kill_worker_in(&cc, "gpu1", "gpus-gpu1", 21);
    kill_worker_in(&cc, "gpu", "gpus-gpu", 22);
    free(cc.ref_losses);
    free(cc.ref_weights);
}

/* A worker that stops answering (SIGSTOP) is found when its request passes the deadline
 * (--timeout 2 here), killed and restarted; the run goes on. Each time the log says it stopped
 * answering, never that it died (which depended on when its exit was seen). */
static void test_stuck_worker_restarted(void **state)
{
    struct fy_chaos *c = *state;
    struct fy_chaos_paths rp = fy_chaos_new_run(c, "stuck");
    const char *run = rp.run, *out = rp.out, *metrics = rp.metrics, *log = rp.log;
    const char *extra[] = {"--timeout", "2", NULL};
    int pid = fy_chaos_start_run(c, &rp, extra, NULL);
    double longest = 0;
    for (int stop = 0; stop < 3; stop++) {
        wait_steps(metrics, fy_test_count_matches(metrics, "\"step\": ") + 5);
        int opt = fy_chaos_worker_pid(run, "opt");
        assert_true(opt > 0);
        double t0 = fy_test_now_s();
        assert_int_equal(kill(opt, SIGSTOP), 0);
        while (fy_test_count_matches(log, "restarted in") == stop && fy_test_now_s() - t0 < 60)
            fy_test_pause_ms(10);
        longest = fy_test_now_s() - t0 > longest ? fy_test_now_s() - t0 : longest;
    }
    int status = fy_test_wait(pid, 240);
    assert_true(status != -1 && WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(fy_test_count_matches(log, "is stuck"), 3);
    assert_int_equal(fy_test_count_matches(log, "the opt worker stopped answering (a request "
                                                "passed its deadline)"), 3);
    assert_int_equal(fy_test_count_matches(log, "worker died"), 0);
    printf("chaos: a stopped opt worker was found, killed and the run restarted, three times, at "
           "most %.2f s after it stopped (deadline 2 s)\n", longest);
    assert_true(longest < 10);
    fy_chaos_assert_same_as_reference(c, run, out);
    fy_chaos_assert_nothing_left(run);
}

/* The launcher stopped (SIGSTOP) for longer than the requests' deadline, alone and then with its
 * workers (as Ctrl-Z stops them all), and continued: the time it did not run is not taken for its
 * workers' (no worker is taken for stuck), and the run ends as the undisturbed run does. */
static void test_launcher_stopped_and_continued(void **state)
{
    struct fy_chaos *c = *state;
    struct fy_chaos_paths rp = fy_chaos_new_run(c, "paused");
    const char *run = rp.run, *out = rp.out, *metrics = rp.metrics, *log = rp.log;
    const char *extra[] = {"--timeout", "2", NULL};
    int pid = fy_chaos_start_run(c, &rp, extra, NULL);
    static const char *const workers[] = {"gpu", "io", "opt"};
    for (int all = 0; all < 2; all++) {
        wait_steps(metrics, fy_test_count_matches(metrics, "\"step\": ") + 5);
        assert_int_equal(kill(pid, SIGSTOP), 0);
        for (int w = 0; all && w < 3; w++)
            assert_int_equal(kill(fy_chaos_worker_pid(run, workers[w]), SIGSTOP), 0);
        fy_test_pause_ms(4000);
        for (int w = 0; all && w < 3; w++)
            assert_int_equal(kill(fy_chaos_worker_pid(run, workers[w]), SIGCONT), 0);
        assert_int_equal(kill(pid, SIGCONT), 0);
    }
    int status = fy_test_wait(pid, 240);
    assert_true(status != -1 && WIFEXITED(status));
    if (WEXITSTATUS(status) != 0)
        fy_test_file_contains(log, "no such line: the log, to see why");
    assert_int_equal(WEXITSTATUS(status), 0);
    int restarts = fy_test_count_matches(log, "restart ");
    if (restarts != 0 || fy_test_count_matches(log, "is stuck") != 0)
        fy_test_file_contains(log, "no such line: the log, to see why the run restarted");
    assert_int_equal(fy_test_count_matches(log, "is stuck"), 0);
    assert_int_equal(restarts, 0);
    fy_chaos_assert_same_as_reference(c, run, out);
    fy_chaos_assert_nothing_left(run);
}

/* Workers killed before the run's first step (in the profile that plans the activations, while
 * starting, or before any step) are restarted as any other, within --max-restarts. */
static void test_worker_killed_before_first_step(void **state)
{
    struct fy_chaos *c = *state;
    struct fy_chaos_paths rp = fy_chaos_new_run(c, "early");
    const char *run = rp.run, *out = rp.out, *metrics = rp.metrics, *log = rp.log;
    int pid = fy_chaos_start_run(c, &rp, NULL, NULL);
    int kills = 0, last = -1, status = -1, ended = 0;
    double t0 = fy_test_now_s();
    while (kills < 3 && fy_test_count_matches(metrics, "\"step\": ") == 0 &&
           !(ended = waitpid(pid, &status, WNOHANG) == pid) && fy_test_now_s() - t0 < 60) {
        int victim = fy_chaos_worker_pid(run, "gpu");
        if (victim > 0 && victim != last && kill(victim, SIGKILL) == 0) {
            kills++;
            last = victim;
        }
        fy_test_pause_ms(1);
    }
    if (!ended)
        status = fy_test_wait(pid, 240);
    assert_true(status != -1 && WIFEXITED(status));
    if (WEXITSTATUS(status) != 0)
        fy_test_file_contains(log, "no such line: the log, to see why");
    assert_int_equal(WEXITSTATUS(status), 0);
    int restarts = fy_test_count_matches(log, "restart ");
    printf("chaos: the gpu worker killed %d times before the first step: %d restarts (a worker "
           "killed as its launch stops counts for none)\n", kills, restarts);
    assert_true(kills >= 2);
    assert_true(restarts >= 1 && restarts <= kills);
    assert_true(fy_test_file_contains(log, "restart 1: the gpu worker died"));
    fy_chaos_assert_same_as_reference(c, run, out);
    fy_chaos_assert_nothing_left(run);
}

/* A store with one copy of the state (init --state-copies 1): half the state's space on the SSD,
 * the same bits as with two; a clean stop (a commit) resumes, but a worker killed between commits
 * leaves the store unusable, which the restart says instead of training on mixed steps. */
static void test_one_copy_store(void **state)
{
    struct fy_chaos *c = *state;
    char *run = fy_test_in(c->f, "onecopy"), out[600], metrics[600], log[600];
    snprintf(out, sizeof out, "%s.fywt", run);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run);
    snprintf(log, sizeof log, "%s.log", run);
    const char *init[] = {"init", "--run-dir", run, "--layers", "2", "--heads", "2", "--embd",
                          "64", "--ctx", "32", "--seed", "5", "--state-copies", "1", NULL};
    assert_int_equal(fy_test_launch_in(c->f, init, 60), 0);
    struct stat one, two;
    assert_int_equal(stat(fy_test_fmt("%s/store/%s", run, FY_STORE_DATA_NAME), &one), 0);
    assert_int_equal(stat(fy_test_fmt("%s/store/%s", fy_test_in(c->f, "reference"),
                                      FY_STORE_DATA_NAME), &two), 0);
    assert_true(one.st_size < two.st_size * 2 / 3); /* the second copy is most of it */
    /* in the warmup: the same learning rates */
    assert_int_equal(fy_chaos_train_to(c, run, "18", out), 0);
    unlink(out);
    const char *resume[] = {"resume", run, "--steps", FY_CHAOS_STEPS, NULL};
    assert_int_equal(fy_test_launch_in(c->f, resume, 300), 0);
    fy_chaos_assert_same_as_reference(c, run, out);

    /* killed between commits (--checkpoint-every 1000): no going back */
    const char *args[48], *extra[] = {"--checkpoint-every", "1000", NULL};
    fy_chaos_train_args(args, run, c->f->data, "400", out, extra);
    int pid = fy_test_start("fuyou-launch", args, log);
    assert_true(pid > 0);
    int lines = fy_test_count_matches(metrics, "\"step\": ");
    while (fy_test_count_matches(metrics, "\"step\": ") < lines + 3)
        fy_test_pause_ms(5);
    assert_int_equal(kill(fy_chaos_worker_pid(run, "io"), SIGKILL), 0);
    int status = fy_test_wait(pid, 120);
    assert_true(status != -1 && WIFEXITED(status));
    assert_int_not_equal(WEXITSTATUS(status), 0);
    assert_true(fy_test_file_contains(log, "this store keeps one copy of the state (init "
                                           "--state-copies 1), so a run stopped between commits"));
    assert_int_equal(fy_test_count_matches(log, "restart 2:"), 0); /* it stops at once */
    /* an export now finds the same, with nothing training: it says what to do instead */
    char *left = fy_test_in(c->f, "onecopy-left.fywt");
    const char *exp[] = {"export", "--run-dir", run, "--out", left, NULL};
    assert_int_not_equal(fy_test_launch_in(c->f, exp, 120), 0);
    assert_true(fy_test_file_contains(c->f->log, "no run is training: this store keeps one copy "
                                                 "of the state (init --state-copies 1), and a "
                                                 "run stopped between commits"));
    assert_int_equal(fy_test_count_matches(c->f->log, "stop the training run"), 0);
    assert_int_not_equal(access(left, F_OK), 0);
    fy_chaos_assert_nothing_left(run);
}

/* An export while a training run goes on: it works beside the run (its own pool and sockets),
 * writes the step last committed, and that file equals the export of a run trained to that step
 * alone (the learning rate is still in its warmup, the same for both). The run is not disturbed. */
static void test_export_while_training(void **state)
{
    struct fy_chaos *c = *state;
    struct fy_chaos_paths rp = fy_chaos_new_run(c, "busy");
    const char *run = rp.run, *out = rp.out, *metrics = rp.metrics, *log = rp.log;
    const char *args[48];
    fy_chaos_train_args(args, run, c->f->data, FY_CHAOS_STEPS, out, NULL);
    setenv("FUYOU_TEST_OPT_DELAY_MS", "40", 1); /* slower steps: the export lands mid-run */
    int pid = fy_test_start("fuyou-launch", args, log);
    unsetenv("FUYOU_TEST_OPT_DELAY_MS");
    assert_true(pid > 0);
    while (fy_test_count_matches(metrics, "\"step\": ") < 4)
        fy_test_pause_ms(5);
    char *snap = fy_test_in(c->f, "busy-snapshot.fywt");
    const char *exp[] = {"export", "--run-dir", run, "--out", snap, NULL};
    assert_int_equal(fy_test_launch_in(c->f, exp, 120), 0);
    assert_true(fy_test_file_contains(c->f->log, "in use by another launch"));
    char *text = fy_test_slurp(c->f->log, NULL), *at = strstr(text, "exported step ");
    assert_non_null(at);
    int step = atoi(at + strlen("exported step "));
    free(text);
    assert_true(step >= 3 && step % 3 == 0 && step < 20);
    char *hf = fy_test_in(c->f, "busy-hf"); /* a Hugging Face directory, the same way */
    const char *exp_hf[] = {"export", "--run-dir", run, "--to-hf", hf, NULL};
    assert_int_equal(fy_test_launch_in(c->f, exp_hf, 120), 0);
    assert_int_equal(access(fy_test_fmt("%s/model.safetensors", hf), R_OK), 0);
    assert_int_equal(access(fy_test_fmt("%s/config.json", hf), R_OK), 0);
    assert_true(waitpid(pid, NULL, WNOHANG) == 0); /* still training */
    int status = fy_test_wait(pid, 240);
    assert_true(status != -1 && WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    fy_chaos_assert_same_as_reference(c, run, out);
    fy_chaos_assert_nothing_left(run);

    char *alone = fy_test_in(c->f, "alone"), alone_out[600];
    snprintf(alone_out, sizeof alone_out, "%s.fywt", alone);
    fy_chaos_init_model(c->f, alone);
    assert_int_equal(fy_chaos_train_to(c, alone, fy_test_fmt("%d", step), alone_out), 0);
    size_t n, an;
    char *w = fy_test_slurp(snap, &n), *aw = fy_test_slurp(alone_out, &an);
    assert_int_equal(n, an);
    assert_memory_equal(w, aw, n);
    free(w);
    free(aw);
    DIR *d = opendir(run);
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        assert_null(strstr(e->d_name, "reader-"));
    closedir(d);
}

/* Whether a process has ended (a zombie no one reaps counts as ended). */
static int process_gone(int pid)
{
    char *stat = fy_test_slurp(fy_test_fmt("/proc/%d/stat", pid), NULL);
    char *end = stat != NULL ? strrchr(stat, ')') : NULL;
    int gone = end == NULL || end[1] != ' ' || end[2] == 'Z' || end[2] == 'X';
    free(stat);
    return gone;
}

/* What an export killed beside a training run left: its reader directory, its pool in /dev/shm
 * and its io worker. */
struct killed_export {
    char dir[600];
    char shm[FY_POOL_NAME_MAX + 16];
    int io;
};

/* Starts an export of `run` beside its training run that waits once its io worker is up (the
 * test hook FUYOU_TEST_EXPORT_PAUSE_MS), sees its reader directory, pool and io worker there, and
 * kills it outright (SIGKILL); with stop_io, its io worker is stopped (SIGSTOP) first, so that it
 * outlives the launcher (its PDEATHSIG waits) and the launch that cleans up must kill it. */
static struct killed_export kill_export_beside(struct fy_chaos *c, const char *run, int stop_io)
{
    struct killed_export k;
    char *log = fy_test_in(c->f, "killed-export.log"), *out = fy_test_in(c->f, "killed.fywt");
    const char *exp[] = {"export", "--run-dir", run, "--out", out, NULL};
    unlink(log);
    setenv("FUYOU_TEST_EXPORT_PAUSE_MS", "60000", 1);
    int pid = fy_test_start("fuyou-launch", exp, log);
    unsetenv("FUYOU_TEST_EXPORT_PAUSE_MS");
    assert_true(pid > 0);
    double t0 = fy_test_now_s();
    while (fy_test_count_matches(log, "FUYOU_TEST_EXPORT_PAUSE_MS") == 0 &&
           fy_test_now_s() - t0 < 60 && waitpid(pid, NULL, WNOHANG) == 0)
        fy_test_pause_ms(5);
    assert_true(fy_test_file_contains(log, "works beside it in"));
    snprintf(k.dir, sizeof k.dir, "%s/reader-%d", run, pid);
    char pool[FY_POOL_NAME_MAX];
    assert_int_equal(fy_pool_name_for_run(k.dir, pool, sizeof pool), 0);
    snprintf(k.shm, sizeof k.shm, "/dev/shm%s", pool);
    assert_int_equal(access(k.shm, F_OK), 0);
    k.io = fy_chaos_worker_pid(k.dir, "io");
    assert_true(k.io > 0 && !process_gone(k.io));
    if (stop_io)
        assert_int_equal(kill(k.io, SIGSTOP), 0);
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_true(fy_test_wait(pid, 30) != -1);
    assert_int_equal(access(k.dir, F_OK), 0); /* what it leaves */
    return k;
}

/* Nothing of a killed export is left; the log of the launch that removed it says so. */
static void assert_export_removed(const struct killed_export *k, const char *log)
{
    assert_int_not_equal(access(k->dir, F_OK), 0);
    assert_int_not_equal(access(k->shm, F_OK), 0);
    for (int i = 0; i < 200 && !process_gone(k->io); i++)
        fy_test_pause_ms(10);
    assert_true(process_gone(k->io));
    assert_true(fy_test_file_contains(log, fy_test_fmt("removed %s, left by an export that died",
                                                       k->dir)));
    assert_true(fy_test_file_contains(log, k->shm + strlen("/dev/shm")));
}

/* An export killed outright beside a training run leaves its reader directory, pool and worker;
 * the next launch on the run directory removes them (a worker still running killed), an export
 * beside the run as well as the training run's own resume. The run ends as the undisturbed one
 * does. */
static void test_export_killed_beside_training(void **state)
{
    struct fy_chaos *c = *state;
    struct fy_chaos_paths rp = fy_chaos_new_run(c, "readers");
    const char *run = rp.run, *out = rp.out, *metrics = rp.metrics, *log = rp.log;
    const char *args[48];
    fy_chaos_train_args(args, run, c->f->data, FY_CHAOS_STEPS, out, NULL);
    unlink(log);
    setenv("FUYOU_TEST_OPT_DELAY_MS", "40", 1); /* slower steps: the exports land mid-run */
    int pid = fy_test_start("fuyou-launch", args, log);
    unsetenv("FUYOU_TEST_OPT_DELAY_MS");
    assert_true(pid > 0);
    while (fy_test_count_matches(metrics, "\"step\": ") < 4)
        fy_test_pause_ms(5);

    /* removed by the next export */
    struct killed_export k = kill_export_beside(c, run, 1);
    char *snap = fy_test_in(c->f, "readers-snapshot.fywt");
    const char *exp[] = {"export", "--run-dir", run, "--out", snap, NULL};
    assert_int_equal(fy_test_launch_in(c->f, exp, 120), 0);
    assert_true(fy_test_file_contains(c->f->log, "in use by another launch"));
    assert_true(fy_test_file_contains(c->f->log, "exported step "));
    assert_export_removed(&k, c->f->log);
    assert_true(fy_test_file_contains(c->f->log, fy_test_fmt("the io worker (pid %d) of a launcher "
                                                             "that died is still running: "
                                                             "killing it", k.io)));

    /* exports at once beside the run, each cleaning as it starts: none disturbs another */
    int many[3];
    for (int i = 0; i < 3; i++) {
        const char *one[] = {"export", "--run-dir", run, "--out",
                             fy_test_in(c->f, fy_test_fmt("readers-%d.fywt", i)), NULL};
        many[i] = fy_test_start("fuyou-launch", one, fy_test_in(c->f, "readers-many.log"));
        assert_true(many[i] > 0);
    }
    for (int i = 0; i < 3; i++) {
        int status = fy_test_wait(many[i], 120);
        assert_true(status != -1 && WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    assert_int_equal(fy_test_count_matches(fy_test_in(c->f, "readers-many.log"), "exported step"),
                     3);
    assert_int_equal(fy_test_count_matches(fy_test_in(c->f, "readers-many.log"), "removed "), 0);

    /* removed by the training run's resume (its launcher killed too) */
    k = kill_export_beside(c, run, 0);
    assert_true(waitpid(pid, NULL, WNOHANG) == 0); /* still training */
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_true(fy_test_wait(pid, 30) != -1);
    printf("chaos: exports killed beside a training run; the run's launcher killed after %d of %s "
           "steps, then resumed\n",
           fy_test_count_matches(metrics, "\"step\": "), FY_CHAOS_STEPS);
    const char *resume[] = {"resume", run, NULL};
    assert_int_equal(fy_test_launch_in(c->f, resume, 300), 0);
    assert_export_removed(&k, c->f->log);
    fy_chaos_assert_same_as_reference(c, run, out);
    fy_chaos_assert_nothing_left(run);
    DIR *d = opendir(run);
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        assert_null(strstr(e->d_name, "reader-"));
    closedir(d);
}

int main(void)
{
    if (fy_chaos_start("test_chaos") != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_run),
        cmocka_unit_test(test_gpu_worker_killed),
        cmocka_unit_test(test_io_worker_killed),
        cmocka_unit_test(test_opt_worker_killed),
        cmocka_unit_test(test_launcher_killed),
        cmocka_unit_test(test_int8_killed),
        cmocka_unit_test(test_bf16_weights_killed),
        cmocka_unit_test(test_clipped_one_pass_killed),
        cmocka_unit_test(test_clipped_gpu_hold_killed),
        cmocka_unit_test(test_second_gpu_worker_killed),
        cmocka_unit_test(test_stuck_worker_restarted),
        cmocka_unit_test(test_launcher_stopped_and_continued),
        cmocka_unit_test(test_worker_killed_before_first_step),
        cmocka_unit_test(test_export_while_training),
        cmocka_unit_test(test_export_killed_beside_training),
        cmocka_unit_test(test_one_copy_store),
    };
    struct CMUnitTest run[sizeof tests / sizeof tests[0]];
    size_t wanted = 0; /* FY_TEST_ONLY: a few of them, by name (comma-separated globs) */
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (fy_test_wanted(tests[i].name))
            run[wanted++] = tests[i];
    return _cmocka_run_group_tests("chaos (integration)", run, wanted, fy_chaos_group_setup,
                                   fy_chaos_group_teardown);
}
