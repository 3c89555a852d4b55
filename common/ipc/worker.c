/* The life of a worker process: parse --run-dir, read the run config, pin to the configured cpuset,
 * attach the shared pool, connect to the launcher, say READY, then serve descriptors until STOP,
 * SIGTERM or the launcher's death. A worker waits for commands as long as its launcher lives, with
 * no limit: the schedule may have nothing for it for a long time (the io worker when every unit's
 * state is in memory, between commits), and a launcher stopped (SIGSTOP, Ctrl-Z) is not gone.
 * Hangs are the launcher's to find, by the deadlines of its requests. */
#include "common/ipc/worker.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <zmq.h>

#include "common/base/check.h"
#include "common/base/knobs.h"

static volatile sig_atomic_t worker_terminate;

static void on_sigterm(int sig) { worker_terminate = sig; }

int fy_worker_terminating(void) { return worker_terminate != 0; }

static void usage(const char *name)
{
    fprintf(stderr,
            "usage: fuyou-%s-worker --run-dir DIR [--rank R]\n"
            "Started by fuyou-launch, which writes DIR/run.conf; not meant to be run by hand.\n"
            "--rank R: the gpu worker of rank R of several (--gpus), named gpuR (0: gpu)\n",
            name);
}

static int parse_args(int argc, char **argv, struct fy_worker *w)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--run-dir") == 0 && i + 1 < argc) {
            snprintf(w->run_dir, sizeof w->run_dir, "%s", argv[++i]);
        } else if (strcmp(argv[i], "--rank") == 0 && i + 1 < argc && strcmp(w->name, "gpu") == 0) {
            char *end = NULL;
            long r = strtol(argv[++i], &end, 10);
            if (end == argv[i] || *end != 0 || r < 0 || r >= 64) {
                fprintf(stderr, "fuyou-%s-worker: --rank %s: give 0 to 63\n", w->name, argv[i]);
                return -EINVAL;
            }
            w->rank = (int)r;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(w->name);
            return 1;
        } else {
            fprintf(stderr, "fuyou-%s-worker: unknown argument '%s'\n", w->name, argv[i]);
            usage(w->name);
            return -EINVAL;
        }
    }
    if (w->run_dir[0] == 0) {
        usage(w->name);
        return -EINVAL;
    }
    return 0;
}

static int worker_setup(struct fy_worker *w)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/run.conf", w->run_dir);
    FY_TRY(fy_config_load(w->cfg, path));
    if (w->rank > 0) /* which share of the batch the gpu worker computes (gpu_worker/gptexec) */
        FY_TRY(fy_config_setf(w->cfg, "train.rank", "%d", w->rank));
    const char *log_file = fy_config_get(w->cfg, "log_file");
    if (log_file != NULL && fy_log_set_file(log_file) < 0)
        fy_warn("cannot append to the run log %s: logging to stderr only", log_file);
    FY_TRY(fy_topo_load(&w->topo));
    char key[64];
    snprintf(key, sizeof key, "affinity.%s", w->name);
    const char *cpus = fy_config_get(w->cfg, key);
    if (cpus != NULL && cpus[0] != 0) {
        FY_TRY(fy_topo_bind_self(w->topo, cpus, w->cpus, sizeof w->cpus));
    } else {
        fy_topo_get_binding(w->topo, w->cpus, sizeof w->cpus);
        fy_warn("no %s in %s: running unpinned", key, path);
    }
    const char *pool = fy_config_get(w->cfg, "pool");
    const char *endpoint = fy_config_get(w->cfg, "endpoint");
    FY_REQUIRE(pool != NULL && endpoint != NULL, -EINVAL, "%s: 'pool' and 'endpoint' are required",
               path);
    FY_TRY(fy_pool_attach(&w->pool, pool));
    FY_TRY(fy_chan_connect(&w->chan, endpoint, w->name));
    fy_chan_set_pool_size(w->chan, fy_pool_size(w->pool));
    return 0;
}

void *fy_worker_region(const struct fy_worker *w, const struct fy_desc *d)
{
    return fy_pool_at(w->pool, d->offset, d->bytes);
}

static int send_reply(struct fy_worker *w, struct fy_desc *reply)
{
    return fy_chan_send(w->chan, NULL, reply, 1);
}

static void reply_for(const struct fy_desc *req, struct fy_desc *reply)
{
    memset(reply, 0, sizeof *reply);
    reply->op = FY_OP_DONE;
    reply->kind = FY_KIND_CONTROL;
    reply->seq = req->seq;
    reply->step = req->step;
    reply->layer = req->layer;
    reply->tensor = req->tensor;
}

#define QUEUE_MAX 8

/* Requests started and not yet finished, oldest first, with their replies. */
struct inflight {
    struct fy_desc req0[QUEUE_MAX], reply[QUEUE_MAX];
    uint64_t started_ns[QUEUE_MAX];
    unsigned first, count;
    uint64_t last_end_ns; /* when the previous request completed */
};

/* The reply carries when the work ran (CLOCK_MONOTONIC, comparable across the run's processes) for
 * the launcher's busy-time metrics and trace. A request queued behind another counts from when the
 * one before it completed, so that the busy times of overlapping requests add up to the time the
 * worker was busy, not more. */
static int reply_done(struct fy_worker *w, struct inflight *f, const struct fy_desc *req0,
                      struct fy_desc *reply, uint64_t started_ns)
{
    uint64_t end = fy_monotonic_ns();
    uint64_t begin = started_ns > f->last_end_ns ? started_ns : f->last_end_ns;
    fy_desc_set_timing(reply, begin < end ? begin : end, end);
    f->last_end_ns = end;
    if (reply->status < 0) {
        char what[256];
        fy_desc_format(req0, what, sizeof what);
        fy_error("request failed (%s): %s", strerror(-reply->status), what);
    }
    return send_reply(w, reply);
}

static int finish_oldest(struct fy_worker *w, const struct fy_worker_ops *ops, void *state,
                         struct inflight *f)
{
    unsigned i = f->first;
    f->first = (f->first + 1) % QUEUE_MAX;
    f->count--;
    int rc = ops->finish(w, state, &f->reply[i]);
    if (rc < 0)
        f->reply[i].status = rc;
    return reply_done(w, f, &f->req0[i], &f->reply[i], f->started_ns[i]);
}

static int finish_all(struct fy_worker *w, const struct fy_worker_ops *ops, void *state,
                      struct inflight *f)
{
    while (f->count > 0)
        FY_TRY(finish_oldest(w, ops, state, f));
    return 0;
}

/* One request that is not a control message: queued when the worker queues, else served whole. */
static int serve_request(struct fy_worker *w, const struct fy_worker_ops *ops, void *state,
                         struct inflight *f, const struct fy_desc *req, unsigned n,
                         struct fy_desc *reply)
{
    uint64_t started = fy_monotonic_ns();
    if (ops->start == NULL) {
        reply->status = ops->handle(w, state, req, n, reply);
        return reply_done(w, f, &req[0], reply, started);
    }
    int rc = ops->start(w, state, req, n, reply);
    if (rc != 1) {
        reply->status = rc < 0 ? rc : 0;
        return reply_done(w, f, &req[0], reply, started);
    }
    unsigned i = (f->first + f->count) % QUEUE_MAX;
    f->req0[i] = req[0];
    f->reply[i] = *reply;
    f->started_ns[i] = started;
    f->count++;
    return 0;
}

/* Serves requests until STOP; returns 0 on an orderly stop, negative on failure. */
static int serve(struct fy_worker *w, const struct fy_worker_ops *ops, void *state)
{
    unsigned depth = ops->start != NULL && ops->queue_depth != NULL ? ops->queue_depth(state) : 1;
    FY_REQUIRE(depth >= 1 && depth <= QUEUE_MAX, -EINVAL, "%s worker: queue depth %u outside 1..%d",
               w->name, depth, QUEUE_MAX);
    struct inflight f;
    memset(&f, 0, sizeof f);
    pid_t launcher = getppid();
    for (;;) {
        if (worker_terminate) {
            fy_info("terminated by signal %d", (int)worker_terminate);
            return -EINTR;
        }
        if (getppid() != launcher) {
            fy_error("the launcher (pid %d) is gone: exiting", (int)launcher);
            return -EPIPE;
        }
        /* take commands while there is room; finish the oldest request when it is done */
        zmq_pollitem_t items[2];
        int n_items = 0, cmd = -1, done = -1;
        if (f.count < depth) {
            cmd = n_items;
            items[n_items++] = (zmq_pollitem_t){.socket = fy_chan_socket(w->chan), .events = ZMQ_POLLIN};
        }
        if (f.count > 0) {
            int fd = ops->ready_fd(state);
            if (fd < 0) { /* nothing to wait on: complete it now */
                FY_TRY(finish_oldest(w, ops, state, &f));
                continue;
            }
            done = n_items;
            items[n_items++] = (zmq_pollitem_t){.socket = NULL, .fd = fd, .events = ZMQ_POLLIN};
        }
        int ready = zmq_poll(items, n_items, 1000);
        if (ready < 0 && zmq_errno() == EINTR)
            continue;
        FY_ZMQ(ready, "%s worker: polling for commands", w->name);
        if (done >= 0 && (items[done].revents & ZMQ_POLLIN)) {
            FY_TRY(finish_oldest(w, ops, state, &f));
            continue;
        }
        /* nothing within the poll's second: look at the launcher again, wait on */
        if (cmd < 0 || !(items[cmd].revents & ZMQ_POLLIN))
            continue;
        struct fy_desc req[FY_DESC_MAX_PARTS], reply;
        int n = fy_chan_recv(w->chan, NULL, req, FY_DESC_MAX_PARTS, 0, "a command", "the launcher");
        if (n < 0 && n != -EBADMSG && n != -EPROTO && n != -ERANGE)
            return n;
        reply_for(&req[0], &reply);
        if (n < 0) { /* malformed: already logged as rejected; answer so the sender does not hang */
            reply.status = n;
            FY_TRY(send_reply(w, &reply));
            continue;
        }
        switch (req[0].op) {
        case FY_OP_STOP:
            FY_TRY(finish_all(w, ops, state, &f));
            FY_TRY(send_reply(w, &reply));
            fy_info("stop requested: exiting");
            return 0;
        case FY_OP_PING:
            FY_TRY(send_reply(w, &reply));
            continue;
        default:
            FY_TRY(serve_request(w, ops, state, &f, req, (unsigned)n, &reply));
        }
    }
}

int fy_worker_main(int argc, char **argv, const char *name, const struct fy_worker_ops *ops)
{
    struct fy_worker w;
    memset(&w, 0, sizeof w);
    w.name = name;
    fy_log_init(name, fy_knob_log_level_or(FY_LOG_INFO));
    int rc = parse_args(argc, argv, &w);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    if (w.rank > 0) {
        snprintf(w.rank_name, sizeof w.rank_name, "%s%d", name, w.rank);
        w.name = w.rank_name;
        fy_log_init(w.name, fy_knob_log_level_or(FY_LOG_INFO));
    }
    /* Ctrl-C reaches the whole process group; the launcher decides how to stop, so ignore it. */
    signal(SIGINT, SIG_IGN);
    signal(SIGPIPE, SIG_IGN); /* a closed log pipe must not kill a worker mid-write */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigterm;
    sigaction(SIGTERM, &sa, NULL);
    w.cfg = calloc(1, sizeof *w.cfg);
    void *state = NULL;
    int initialised = 0;
    if (w.cfg == NULL) {
        rc = -ENOMEM;
        goto out;
    }
    FY_TRY_OUT(rc, worker_setup(&w));
    FY_TRY_OUT(rc, ops->init(&w, &state));
    initialised = 1;
    fy_info("ready: pid %d on cpus %s, pool %s (%llu bytes)", (int)getpid(), w.cpus,
            fy_pool_name(w.pool), (unsigned long long)fy_pool_size(w.pool));
    struct fy_desc ready;
    memset(&ready, 0, sizeof ready);
    ready.op = FY_OP_READY;
    ready.kind = FY_KIND_CONTROL;
    ready.arg = (uint64_t)getpid();
    FY_TRY_OUT(rc, fy_chan_send(w.chan, NULL, &ready, 1));
    rc = serve(&w, ops, state);
out:
    if (initialised)
        ops->fini(&w, state);
    fy_chan_destroy(&w.chan);
    fy_pool_destroy(&w.pool);
    fy_topo_destroy(&w.topo);
    free(w.cfg);
    if (rc < 0 && rc != -EINTR)
        fy_error("%s worker failed: %s", name, strerror(-rc));
    return rc == 0 || rc == -EINTR ? 0 : 1;
}
