/* Tests of the worker loop (common/ipc/worker) for a worker that queues requests, as the gpu worker
 * does on the CUDA backend: a real worker process (forked, running fy_worker_main with a fake
 * queueing worker) serves a ROUTER in this process through a real pool and run config.
 * The fake completes its queued requests only when it holds two, or when a request asks for it,
 * so the tests can tell that a second request was started while the first was in flight; finish
 * writes the reply's arg, so the tests can tell that replies come from finish, in order.
 * The worker's life beside its launcher: it waits for commands as long as its parent lives, even
 * silent or stopped, and exits when its parent dies. For those the worker is forked by a stand-in
 * launcher process (its parent) while this process, a child subreaper, keeps the ROUTER. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/ipc/chan.h"
#include "common/base/config.h"
#include "common/ipc/desc.h"
#include "common/base/dtype.h"
#include "common/base/log.h"
#include "common/ipc/pool.h"
#include "common/ipc/worker.h"
#include "tests/testutil.h"

#define WAIT_MS 20000
/* request arg bits understood by the fake worker */
#define ARG_COMPLETE 1 /* complete everything queued now */
#define ARG_FAIL 2     /* start fails */
#define ARG_INLINE 4   /* start completes the request itself */

/* ---- the fake worker (runs in the child) ---- */

struct fake {
    int fd; /* eventfd: readable when the oldest queued request is complete */
    unsigned queued, signalled;
};

static int fake_init(struct fy_worker *w, void **state)
{
    (void)w;
    struct fake *f = calloc(1, sizeof *f);
    if (f == NULL)
        return -ENOMEM;
    f->fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK | EFD_SEMAPHORE);
    if (f->fd < 0) {
        free(f);
        return -errno;
    }
    *state = f;
    return 0;
}

static void fake_fini(struct fy_worker *w, void *state)
{
    (void)w;
    struct fake *f = state;
    close(f->fd);
    free(f);
}

static int fake_handle(struct fy_worker *w, void *state, const struct fy_desc *req, unsigned n,
                       struct fy_desc *reply)
{
    (void)w, (void)state, (void)req, (void)n;
    reply->arg = 99;
    return 0;
}

static void signal_all(struct fake *f)
{
    uint64_t add = f->queued - f->signalled;
    if (add > 0 && write(f->fd, &add, sizeof add) == (ssize_t)sizeof add)
        f->signalled = f->queued;
}

static int fake_start(struct fy_worker *w, void *state, const struct fy_desc *req, unsigned n,
                      struct fy_desc *reply)
{
    struct fake *f = state;
    if (req[0].arg & ARG_FAIL)
        return -EIO;
    if (req[0].arg & ARG_INLINE)
        return fake_handle(w, state, req, n, reply);
    f->queued++;
    reply->arg = 0; /* finish fills it */
    if (f->queued == 2 || (req[0].arg & ARG_COMPLETE))
        signal_all(f);
    return 1;
}

static int fake_finish(struct fy_worker *w, void *state, struct fy_desc *reply)
{
    (void)w;
    struct fake *f = state;
    uint64_t one;
    if (read(f->fd, &one, sizeof one) == (ssize_t)sizeof one) /* done: consume its signal */
        f->signalled--;
    /* else it was not signalled: finishing waits for it, which the fake needs no time for */
    reply->arg = 1000 + f->queued; /* how many were in flight when it completed */
    f->queued--;
    return 0;
}

static int fake_ready_fd(void *state) { return ((struct fake *)state)->fd; }

static unsigned fake_depth(void *state)
{
    (void)state;
    return 2;
}

static const struct fy_worker_ops fake_ops = {
    .init = fake_init,
    .handle = fake_handle,
    .fini = fake_fini,
    .start = fake_start,
    .finish = fake_finish,
    .ready_fd = fake_ready_fd,
    .queue_depth = fake_depth,
};

/* ---- the launcher side ---- */

struct fixture {
    char *dir;
    struct fy_pool *pool;
    struct fy_chan *router;
    pid_t child;    /* the worker */
    pid_t launcher; /* the worker's parent when it is not this process, else 0 */
    uint64_t seq;
};

/* The worker's run.conf may carry one more entry; with via_launcher the worker is the child of a
 * stand-in launcher that only waits, so that the tests can stop or kill the worker's parent. */
static int start(void **state, const char *key, const char *value, int via_launcher)
{
    struct fixture *fx = calloc(1, sizeof *fx);
    assert_non_null(fx);
    fx->dir = fy_test_tmpdir("worker");
    assert_non_null(fx->dir);
    char name[64], endpoint[256], path[512];
    snprintf(path, sizeof path, "%s/ipc", fx->dir);
    assert_int_equal(mkdir(path, 0700), 0);
    assert_int_equal(fy_pool_name_for_run(fx->dir, name, sizeof name), 0);
    struct fy_pool_region_spec region = {"data", 1 << 20};
    struct fy_pool_opts opts = {NULL, -1, fx->dir};
    assert_int_equal(fy_pool_create(&fx->pool, name, &region, 1, &opts), 0);
    assert_int_equal(fy_chan_endpoint(fx->dir, "test", endpoint, sizeof endpoint), 0);
    assert_int_equal(fy_chan_bind(&fx->router, endpoint, "launcher"), 0);
    fy_chan_set_pool_size(fx->router, 1 << 20);
    struct fy_config cfg;
    fy_config_init(&cfg);
    assert_int_equal(fy_config_set(&cfg, "pool", name), 0);
    assert_int_equal(fy_config_set(&cfg, "endpoint", endpoint), 0);
    if (key != NULL)
        assert_int_equal(fy_config_set(&cfg, key, value), 0);
    snprintf(path, sizeof path, "%s/run.conf", fx->dir);
    assert_int_equal(fy_config_save(&cfg, path), 0);
    /* a worker orphaned by its stand-in launcher comes to this process, to be waited for */
    assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0 && via_launcher && fork() != 0) {
        for (;;) /* the stand-in launcher: alive, silent, never waits for its worker */
            pause();
    }
    if (pid == 0) {
        char *argv[] = {"fake-worker", "--run-dir", fx->dir, NULL};
        _exit(fy_worker_main(3, argv, "gpu", &fake_ops));
    }
    if (via_launcher)
        fx->launcher = pid;
    else
        fx->child = pid;
    struct fy_desc ready;
    char peer[FY_CHAN_PEER_MAX];
    assert_int_equal(fy_chan_recv(fx->router, peer, &ready, 1, WAIT_MS, "READY", "the worker"), 1);
    assert_int_equal(ready.op, FY_OP_READY);
    fx->child = (pid_t)ready.arg; /* READY carries the worker's pid */
    *state = fx;
    return 0;
}

static int setup(void **state) { return start(state, NULL, NULL, 0); }

/* worker_idle_timeout_s = 1: the key of a limit on a worker's wait for a command, which workers
 * do not read; set so that a worker that honoured such a limit would be gone within the waits. */
static int setup_silent(void **state) { return start(state, "worker_idle_timeout_s", "1", 0); }

static int setup_stopped(void **state) { return start(state, "worker_idle_timeout_s", "1", 1); }

static int setup_orphaned(void **state) { return start(state, NULL, NULL, 1); }

static int teardown(void **state)
{
    struct fixture *fx = *state;
    if (fx->launcher > 0) { /* first, so that the worker is this process's child, to be waited */
        kill(fx->launcher, SIGKILL);
        waitpid(fx->launcher, NULL, 0);
    }
    if (fx->child > 0) {
        kill(fx->child, SIGKILL);
        waitpid(fx->child, NULL, 0);
    }
    fy_chan_destroy(&fx->router);
    fy_pool_destroy(&fx->pool);
    fy_test_rmdir(fx->dir);
    free(fx->dir);
    free(fx);
    return 0;
}

static uint64_t send_request(struct fixture *fx, uint64_t arg)
{
    struct fy_desc d = fy_desc_region(FY_OP_GPU_SYNTH_GRAD, FY_KIND_GRAD, FY_DTYPE_F32, 0, 4096, 0);
    d.seq = ++fx->seq;
    d.arg = arg;
    assert_int_equal(fy_chan_send(fx->router, "gpu", &d, 1), 0);
    return d.seq;
}

static struct fy_desc receive(struct fixture *fx)
{
    struct fy_desc d;
    char peer[FY_CHAN_PEER_MAX];
    assert_int_equal(fy_chan_recv(fx->router, peer, &d, 1, WAIT_MS, "a reply", "the worker"), 1);
    assert_int_equal(d.op, FY_OP_DONE);
    return d;
}

static void test_second_request_starts_while_first_in_flight(void **state)
{
    struct fixture *fx = *state;
    uint64_t a = send_request(fx, 0), b = send_request(fx, 0);
    struct fy_desc ra = receive(fx), rb = receive(fx);
    assert_int_equal(ra.seq, a);
    assert_int_equal(rb.seq, b);
    assert_int_equal(ra.status, 0);
    /* a completed with two in flight: b had been started before a was finished */
    assert_int_equal(ra.arg, 1002);
    assert_int_equal(rb.arg, 1001);
    /* busy times do not overlap: b counts from when a completed */
    assert_true(rb.offset >= ra.offset + ra.bytes);
}

static void test_inline_failed_and_single_requests(void **state)
{
    struct fixture *fx = *state;
    uint64_t c = send_request(fx, ARG_COMPLETE);
    struct fy_desc rc = receive(fx);
    assert_int_equal(rc.seq, c);
    assert_int_equal(rc.arg, 1001);
    uint64_t d = send_request(fx, ARG_FAIL);
    struct fy_desc rd = receive(fx);
    assert_int_equal(rd.seq, d);
    assert_int_equal(rd.status, -EIO);
    uint64_t e = send_request(fx, ARG_INLINE);
    struct fy_desc re = receive(fx);
    assert_int_equal(re.seq, e);
    assert_int_equal(re.status, 0);
    assert_int_equal(re.arg, 99);
}

static void test_stop_finishes_what_is_in_flight(void **state)
{
    struct fixture *fx = *state;
    uint64_t e = send_request(fx, 0); /* queued, never signalled */
    struct fy_desc stop;
    memset(&stop, 0, sizeof stop);
    stop.op = FY_OP_STOP;
    stop.kind = FY_KIND_CONTROL;
    stop.layer = -1;
    stop.seq = ++fx->seq;
    assert_int_equal(fy_chan_send(fx->router, "gpu", &stop, 1), 0);
    struct fy_desc re = receive(fx), rs = receive(fx);
    assert_int_equal(re.seq, e);
    assert_int_equal(re.arg, 1001);
    assert_int_equal(rs.seq, stop.seq);
    int status = 0;
    assert_int_equal(waitpid(fx->child, &status, 0), fx->child);
    fx->child = 0;
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void pause_s(int seconds)
{
    struct timespec t = {seconds, 0};
    while (nanosleep(&t, &t) != 0 && errno == EINTR)
        ;
}

/* A launcher with nothing to ask (every optimizer state in memory, a long step) is not a fault:
 * its worker waits past any limit and answers the next request. */
static void test_worker_waits_for_a_silent_launcher(void **state)
{
    struct fixture *fx = *state;
    pause_s(3);
    int status = 0;
    pid_t gone = waitpid(fx->child, &status, WNOHANG);
    if (gone == fx->child)
        fx->child = 0;
    assert_int_equal(gone, 0); /* still running */
    uint64_t a = send_request(fx, ARG_INLINE);
    struct fy_desc ra = receive(fx);
    assert_int_equal(ra.seq, a);
    assert_int_equal(ra.status, 0);
    assert_int_equal(ra.arg, 99);
}

/* A launcher stopped (kill -STOP, Ctrl-Z) is alive: its worker stays and serves. The requests come
 * from this process, so the worker is seen answering while its parent is stopped. */
static void test_worker_stays_while_launcher_stopped(void **state)
{
    struct fixture *fx = *state;
    assert_int_equal(kill(fx->launcher, SIGSTOP), 0);
    pause_s(3);
    uint64_t a = send_request(fx, ARG_INLINE);
    struct fy_desc ra = receive(fx);
    assert_int_equal(ra.seq, a);
    assert_int_equal(ra.status, 0);
    assert_int_equal(kill(fx->launcher, SIGCONT), 0);
    uint64_t b = send_request(fx, ARG_INLINE);
    struct fy_desc rb = receive(fx);
    assert_int_equal(rb.seq, b);
    assert_int_equal(rb.status, 0);
}

/* A launcher that dies takes its worker with it (the worker sees its parent change within a
 * second; the real launcher also arms PDEATHSIG), whatever the worker was waiting for. */
static void test_worker_exits_when_launcher_dies(void **state)
{
    struct fixture *fx = *state;
    uint64_t a = send_request(fx, ARG_INLINE);
    assert_int_equal(receive(fx).seq, a);
    assert_int_equal(kill(fx->launcher, SIGKILL), 0);
    assert_int_equal(waitpid(fx->launcher, NULL, 0), fx->launcher);
    fx->launcher = 0;
    int status = fy_test_wait(fx->child, 10); /* the orphan is this subreaper's child now */
    fx->child = 0;
    assert_int_not_equal(status, -1); /* exited by itself, not killed at the time limit */
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 1); /* "the launcher (pid N) is gone: exiting" */
}

int main(void)
{
    fy_log_init("test_worker", FY_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_second_request_starts_while_first_in_flight, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_inline_failed_and_single_requests, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_finishes_what_is_in_flight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_worker_waits_for_a_silent_launcher, setup_silent,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_worker_stays_while_launcher_stopped, setup_stopped,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_worker_exits_when_launcher_dies, setup_orphaned,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
