/* What the fault-isolation tests share (see chaos.h). */
#include "tests/chaos.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/ipc/pool.h"
#include "io_worker/store.h"

int fy_chaos_start(const char *program)
{
    signal(SIGCHLD, SIG_DFL);
    if (access(fy_test_bin("fuyou-launch"), X_OK) != 0 || access(FY_CHAOS_SAMPLE_TEXT, R_OK) != 0) {
        fprintf(stderr, "%s: run from the repository root after make\n", program);
        return 1;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    return 0;
}

int fy_chaos_group_setup(void **state)
{
    struct fy_chaos *c = calloc(1, sizeof *c);
    if (c == NULL || fy_test_setup((void **)&c->f, "chaos", FY_CHAOS_SAMPLE_TEXT) != 0)
        return -1;
    *state = c;
    return 0;
}

int fy_chaos_group_teardown(void **state)
{
    struct fy_chaos *c = *state;
    free(c->ref_losses);
    free(c->ref_weights);
    fy_test_teardown((void **)&c->f);
    free(c);
    return 0;
}

void fy_chaos_reference_run(void **state) { fy_chaos_reference_run_in(*state, "reference"); }

void fy_chaos_reference_run_in(struct fy_chaos *c, const char *name)
{
    char *run = strdup(fy_test_in(c->f, name));
    char *out = strdup(fy_test_fmt("%s.fywt", run));
    assert_true(run != NULL && out != NULL);
    fy_chaos_init_model_with(c->f, run, c->optim_state, c->state_piece);
    const char *args[48];
    fy_chaos_run_args(c, args, run, FY_CHAOS_STEPS, out, NULL);
    assert_int_equal(fy_test_launch_in(c->f, args, 300), 0);
    c->ref_losses = fy_chaos_losses(fy_test_fmt("%s/metrics.jsonl", run));
    c->ref_weights = fy_test_slurp(out, &c->ref_len);
    assert_non_null(c->ref_weights);
    assert_int_equal(fy_test_count_matches(fy_test_fmt("%s/metrics.jsonl", run), "\"step\": "),
                     atoi(FY_CHAOS_STEPS));
    fy_chaos_assert_nothing_left(run);
    free(run);
    free(out);
}

void fy_chaos_init_model(struct fy_test_fixture *f, const char *run)
{
    fy_chaos_init_model_as(f, run, NULL);
}

void fy_chaos_init_model_as(struct fy_test_fixture *f, const char *run, const char *optim_state)
{
    fy_chaos_init_model_with(f, run, optim_state, NULL);
}

void fy_chaos_init_model_with(struct fy_test_fixture *f, const char *run, const char *optim_state,
                              const char *state_piece)
{
    const char *args[20] = {"init",   "--run-dir", run,     "--layers", "2",      "--heads", "2",
                            "--embd", "64",        "--ctx", "32",       "--seed", "5"};
    unsigned n = 13;
    if (optim_state != NULL) {
        args[n++] = "--optim-state";
        args[n++] = optim_state;
    }
    if (state_piece != NULL) {
        args[n++] = "--state-piece";
        args[n++] = state_piece;
    }
    args[n] = NULL;
    assert_int_equal(fy_test_launch_in(f, args, 60), 0);
}

void fy_chaos_train_args(const char **args, const char *run, const char *data, const char *steps,
                         const char *out, const char *const *extra)
{
    const char *base[] = {"train", "--run-dir", run, "--data", data, "--steps", steps, "--batch",
                          "8", "--seq", "32", "--lr", "3e-3", "--warmup", "20", "--eval-every",
                          "1000", "--checkpoint-every", "3", "--backend", "cpu", "--max-restarts",
                          "100", "--export", out,
                          /* every unit's state streamed, unclipped, as the kills are aimed: a
                           * test's own options come after and replace these */
                          "--cpu-mem", "0", "--clip-grad-norm", "0"};
    int n = 0;
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        args[n++] = base[i];
    for (int i = 0; extra != NULL && extra[i] != NULL; i++) {
        assert_true(n < 47); /* the callers' arrays hold 48 */
        args[n++] = extra[i];
    }
    args[n] = NULL;
}

void fy_chaos_run_args(const struct fy_chaos *c, const char **args, const char *run,
                       const char *steps, const char *out, const char *const *extra)
{
    const char *both[16];
    int n = 0;
    for (int i = 0; c->train_extra != NULL && c->train_extra[i] != NULL && n < 8; i++)
        both[n++] = c->train_extra[i];
    for (int i = 0; extra != NULL && extra[i] != NULL && n < 15; i++)
        both[n++] = extra[i];
    both[n] = NULL;
    fy_chaos_train_args(args, run, c->f->data, steps, out, both);
}

char *fy_chaos_losses(const char *metrics)
{
    char *text = fy_test_slurp(metrics, NULL);
    assert_non_null(text);
    size_t cap = strlen(text) + 1, n = 0;
    char *out = calloc(cap, 1);
    for (char *p = text; (p = strstr(p, "\"loss\": ")) != NULL; p++) {
        p += strlen("\"loss\": ");
        size_t len = strcspn(p, ",}");
        memcpy(out + n, p, len);
        n += len;
        out[n++] = '\n';
    }
    free(text);
    return out;
}

void fy_chaos_assert_nothing_left(const char *run)
{
    /* the processes whose command line names the run directory */
    for (int i = 0; i < 200 && fy_test_count_processes(run) > 0; i++)
        fy_test_pause_ms(10);
    assert_int_equal(fy_test_count_processes(run), 0);
    char pool[FY_POOL_NAME_MAX];
    assert_int_equal(fy_pool_name_for_run(run, pool, sizeof pool), 0);
    assert_int_not_equal(access(fy_test_fmt("/dev/shm%s", pool), F_OK), 0);
    DIR *d = opendir(run);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        assert_null(strstr(e->d_name, ".tmp"));
    closedir(d);
    assert_int_not_equal(access(fy_test_fmt("%s/workers.pid", run), F_OK), 0);
    assert_int_not_equal(access(fy_test_fmt("%s/ipc", run), F_OK), 0); /* its sockets */
}

struct fy_chaos_paths fy_chaos_new_run(struct fy_chaos *c, const char *name)
{
    struct fy_chaos_paths p;
    snprintf(p.run, sizeof p.run, "%s", fy_test_in(c->f, name));
    snprintf(p.out, sizeof p.out, "%s.fywt", p.run);
    snprintf(p.metrics, sizeof p.metrics, "%s/metrics.jsonl", p.run);
    snprintf(p.log, sizeof p.log, "%s.log", p.run);
    snprintf(p.store, sizeof p.store, "%s/store", p.run);
    snprintf(p.data, sizeof p.data, "%s/%s", p.store, FY_STORE_DATA_NAME);
    fy_chaos_init_model_with(c->f, p.run, c->optim_state, c->state_piece);
    return p;
}

int fy_chaos_start_run(struct fy_chaos *c, const struct fy_chaos_paths *rp,
                       const char *const *extra, const char *delay_ms)
{
    const char *args[48];
    fy_chaos_run_args(c, args, rp->run, FY_CHAOS_STEPS, rp->out, extra);
    unlink(rp->log);
    if (delay_ms != NULL)
        setenv("FUYOU_TEST_OPT_DELAY_MS", delay_ms, 1);
    int pid = fy_test_start("fuyou-launch", args, rp->log);
    unsetenv("FUYOU_TEST_OPT_DELAY_MS");
    assert_true(pid > 0);
    return pid;
}

void fy_chaos_assert_same_as_reference(const struct fy_chaos *c, const char *run, const char *out)
{
    char *l = fy_chaos_losses(fy_test_fmt("%s/metrics.jsonl", run));
    assert_string_equal(l, c->ref_losses);
    size_t n;
    char *w = fy_test_slurp(out, &n);
    assert_non_null(w);
    assert_int_equal(n, c->ref_len);
    assert_memory_equal(w, c->ref_weights, n);
    free(l);
    free(w);
}

int fy_chaos_train_to(struct fy_chaos *c, const char *run, const char *steps, const char *out)
{
    const char *args[48];
    fy_chaos_train_args(args, run, c->f->data, steps, out, NULL);
    unlink(out);
    int rc = fy_test_launch_in(c->f, args, 300);
    if (rc != 0) /* its log, to see why */
        fy_test_file_contains(c->f->log, "a line no log has");
    return rc;
}

int fy_chaos_worker_pid(const char *run, const char *name)
{
    FILE *f = fopen(fy_test_fmt("%s/workers.pid", run), "r");
    if (f == NULL)
        return -1;
    char have[32];
    int pid, found = -1;
    while (fscanf(f, "%31s %d", have, &pid) == 2)
        if (strcmp(have, name) == 0)
            found = pid;
    fclose(f);
    return found;
}

void fy_chaos_report_recoveries(const char *what, const char *log)
{
    char *text = fy_test_slurp(log, NULL);
    int n = 0;
    double max = 0, sum = 0;
    for (char *p = text; p != NULL && (p = strstr(p, "restarted in ")) != NULL; p++) {
        double s = atof(p + strlen("restarted in "));
        max = s > max ? s : max;
        sum += s;
        n++;
    }
    free(text);
    printf("chaos: %s: %d recoveries, mean %.2f s, longest %.2f s (workers started again and the "
           "last commit checked)\n",
           what, n, n ? sum / n : 0.0, max);
}

void fy_chaos_kill_worker(struct fy_chaos *c, const char *name, const char *run_name, uint64_t seed,
                          int kills_wanted)
{
    struct fy_chaos_paths rp = fy_chaos_new_run(c, run_name);
    const char *run = rp.run, *out = rp.out, *metrics = rp.metrics, *log = rp.log;
    int pid = fy_chaos_start_run(c, &rp, NULL, NULL);
    int kills = 0, last = -1, status = -1;
    int seen = fy_test_count_matches(metrics, "\"step\": ");
    double t0 = fy_test_now_s();
    while (fy_test_now_s() - t0 < 240) {
        if (waitpid(pid, &status, WNOHANG) == pid)
            break;
        int victim = fy_chaos_worker_pid(run, name);
        int done = fy_test_count_matches(metrics, "\"step\": ");
        if (kills < kills_wanted && victim > 0 && victim != last && done > seen) {
            fy_test_pause_ms((int)(fy_test_rand(&seed) % 120)); /* somewhere in a step */
            if (kill(victim, SIGKILL) == 0) {
                kills++;
                last = victim;
                seen = fy_test_count_matches(metrics, "\"step\": ");
            }
        }
        fy_test_pause_ms(5);
    }
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) != 0)
        fy_test_file_contains(log, "no such line: the log, to see why");
    assert_int_equal(WEXITSTATUS(status), 0);
    printf("chaos: %s worker killed %d times during a run of %s steps\n", name, kills,
           FY_CHAOS_STEPS);
    assert_int_equal(kills, kills_wanted);
    assert_int_equal(fy_test_count_matches(log, "restart "), kills);
    fy_chaos_report_recoveries(fy_test_fmt("%s worker", name), log);
    fy_chaos_assert_same_as_reference(c, run, out);
    fy_chaos_assert_nothing_left(run);
}
