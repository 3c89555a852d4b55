/* Worker supervision: fork/exec with the signal mask restored and PDEATHSIG set, a signalfd polled
 * beside the ZeroMQ socket so a dead worker or a Ctrl-C interrupts any wait, READY and STOP
 * handshakes, and escalation (SIGTERM, then SIGKILL) for workers that do not stop. */
#include "launcher/run/supervise.h"

#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/base/check.h"

struct sup_worker {
    char name[16];
    pid_t pid;
    int alive;
    int ready;
    int stopping;     /* asked to stop: its exit is expected */
    int terminated;   /* sent SIGTERM at the stop because it could not be asked (not started) */
    int killed_stuck; /* killed for not answering within a request's deadline */
    int status;       /* waitpid status once reaped */
};

/* A request sent and not yet waited for; its reply is kept when it arrives first. */
struct outstanding {
    uint64_t seq; /* 0: free */
    int worker;
    int done;
    struct fy_desc reply;
    char what[64];
};

struct fy_sup {
    char run_dir[PATH_MAX];
    char bin_dir[PATH_MAX];
    struct fy_chan *chan;
    int sigfd;
    sigset_t old_mask;
    struct sup_worker w[FY_SUP_MAX_WORKERS];
    unsigned n;
    uint64_t seq;
    int interrupted;
    int continued; /* a SIGCONT read: this process was stopped (Ctrl-Z, SIGSTOP) for a while */
    volatile int *stop_flag; /* graceful: the first signal lands here (fy_sup_set_stop_flag) */
    int failed;              /* index of the first worker that died unexpectedly, or -1 */
    int stuck;               /* index of a worker killed for not answering in time, or -1 */
    struct outstanding out[FY_SUP_MAX_OUTSTANDING];
};

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static struct sup_worker *find(struct fy_sup *s, const char *name)
{
    for (unsigned i = 0; i < s->n; i++)
        if (strcmp(s->w[i].name, name) == 0)
            return &s->w[i];
    return NULL;
}

static void supervised_signals(sigset_t *mask)
{
    sigemptyset(mask);
    sigaddset(mask, SIGCHLD);
    sigaddset(mask, SIGINT);
    sigaddset(mask, SIGTERM);
    sigaddset(mask, SIGCONT); /* blocked, it still continues the process, and is read as news */
}

int fy_sup_block_signals(sigset_t *old_mask)
{
    /* An ignored SIGCHLD (inherited from whoever started us) would auto-reap the workers and hide
     * their deaths from waitpid; supervision needs the default disposition. */
    signal(SIGCHLD, SIG_DFL);
    sigset_t mask;
    supervised_signals(&mask);
    return pthread_sigmask(SIG_BLOCK, &mask, old_mask) == 0 ? 0 : -EINVAL;
}

int fy_sup_new(struct fy_sup **out, const char *run_dir, struct fy_chan *chan)
{
    *out = NULL;
    struct fy_sup *s = calloc(1, sizeof *s);
    if (s == NULL)
        return -ENOMEM;
    s->failed = -1;
    s->stuck = -1;
    s->sigfd = -1;
    s->chan = chan;
    snprintf(s->run_dir, sizeof s->run_dir, "%s", run_dir);
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len < 0) {
        int e = errno;
        free(s);
        fy_error("cannot find this program's directory (/proc/self/exe): %s", strerror(e));
        return -e;
    }
    exe[len] = 0;
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = 0;
    snprintf(s->bin_dir, sizeof s->bin_dir, "%s", exe);
    sigset_t mask;
    supervised_signals(&mask);
    if (fy_sup_block_signals(&s->old_mask) != 0 ||
        (s->sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK)) < 0) {
        int e = errno;
        free(s);
        fy_error("cannot set up signal handling (signalfd): %s", strerror(e));
        return -e;
    }
    *out = s;
    return 0;
}

static void describe_exit(const struct sup_worker *w, char *buf, size_t len)
{
    if (WIFSIGNALED(w->status))
        snprintf(buf, len, "was killed by signal %d (%s)", WTERMSIG(w->status),
                 strsignal(WTERMSIG(w->status)));
    else if (WIFEXITED(w->status) && WEXITSTATUS(w->status) == 127)
        snprintf(buf, len, "could not be started (exit 127)");
    else if (WIFEXITED(w->status))
        snprintf(buf, len, "exited with status %d", WEXITSTATUS(w->status));
    else
        snprintf(buf, len, "ended (wait status 0x%x)", w->status);
}

/* Reaps every child that has exited; returns how many unexpected deaths were found. */
static int reap(struct fy_sup *s)
{
    int unexpected = 0;
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0)
            break;
        for (unsigned i = 0; i < s->n; i++) {
            struct sup_worker *w = &s->w[i];
            if (w->pid != pid || !w->alive)
                continue;
            w->alive = 0;
            w->status = status;
            char how[128];
            describe_exit(w, how, sizeof how);
            int clean = (WIFEXITED(status) && WEXITSTATUS(status) == 0) ||
                        (w->terminated && WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
            if (w->stopping && clean) {
                fy_info("%s worker (pid %d) exited", w->name, (int)pid);
            } else if (w->killed_stuck) { /* its fault is that it stopped answering, said then */
                fy_info("%s worker (pid %d), killed for not answering, is gone", w->name, (int)pid);
            } else {
                fy_error("%s worker (pid %d) %s", w->name, (int)pid, how);
                if (!w->stopping) {
                    unexpected++;
                    if (s->failed < 0)
                        s->failed = (int)i;
                }
            }
        }
    }
    return unexpected;
}

/* Handles pending signals; returns -ECHILD on an unexpected worker death, and -EINTR once the run
 * was interrupted by SIGINT/SIGTERM unless `stopping` (the stop sequence itself must go on). */
static int drain_signals(struct fy_sup *s, int stopping)
{
    struct signalfd_siginfo si;
    int rc = 0;
    while (read(s->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGCHLD) {
            if (reap(s) > 0)
                rc = -ECHILD;
        } else if (si.ssi_signo == SIGCONT) {
            s->continued = 1;
        } else if (s->stop_flag != NULL && *s->stop_flag == 0 && !s->interrupted) {
            *s->stop_flag = (int)si.ssi_signo;
            fy_warn("%s received: stopping once this step is done and committed (again to stop "
                    "at once)",
                    strsignal((int)si.ssi_signo));
        } else if (!s->interrupted) {
            s->interrupted = (int)si.ssi_signo;
            fy_warn("%s received: stopping the run", strsignal((int)si.ssi_signo));
        }
    }
    /* SIGCHLD can be coalesced, or lost to a disposition inherited from the caller: reap anyway. */
    if (reap(s) > 0)
        rc = -ECHILD;
    if (rc == 0 && s->interrupted && !stopping)
        rc = -EINTR;
    return rc;
}

int fy_sup_spawn(struct fy_sup *s, const char *name)
{
    FY_REQUIRE(s->n < FY_SUP_MAX_WORKERS, -E2BIG, "too many workers");
    /* "gpuR": the gpu worker of rank R (--gpus) */
    char exe[PATH_MAX + 64], rank[16] = "";
    int ranked = strncmp(name, "gpu", 3) == 0 && name[3] >= '1' && name[3] <= '9';
    if (ranked)
        snprintf(rank, sizeof rank, "%s", name + 3);
    snprintf(exe, sizeof exe, "%s/fuyou-%s-worker", s->bin_dir, ranked ? "gpu" : name);
    FY_SYS(access(exe, X_OK), "cannot run %s (is it built next to fuyou-launch?)", exe);
    pid_t parent = getpid();
    pid_t pid = fork();
    FY_SYS(pid, "cannot start the %s worker (fork)", name);
    if (pid == 0) {
        sigset_t mask;
        supervised_signals(&mask);
        sigprocmask(SIG_UNBLOCK, &mask, NULL);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) /* the launcher died before PDEATHSIG was armed */
            _exit(1);
        if (ranked)
            execl(exe, exe, "--run-dir", s->run_dir, "--rank", rank, (char *)NULL);
        else
            execl(exe, exe, "--run-dir", s->run_dir, (char *)NULL);
        fprintf(stderr, "cannot execute %s: %s\n", exe, strerror(errno));
        _exit(127);
    }
    struct sup_worker *w = &s->w[s->n++];
    memset(w, 0, sizeof *w);
    snprintf(w->name, sizeof w->name, "%s", name);
    w->pid = pid;
    w->alive = 1;
    fy_info("started %s worker: pid %d", name, (int)pid);
    return 0;
}

/* Waits for one message (any peer) or a signal until *deadline; returns descriptor count, or
 * negative: -ECHILD also when `watch` (if given) has exited, expected or not. Time this process
 * spent stopped (SIGSTOP, Ctrl-Z) is not the workers': *deadline moves on by it, so that a
 * launcher continued after its deadline reads the replies waiting for it instead of taking its
 * workers for stuck. A stop seen in the time between two polls moves it on too; one anywhere
 * else (before this wait, or while a reply was handled) is told by the SIGCONT that ended it,
 * and gives the wait its time again. */
static int wait_message(struct fy_sup *s, char peer[FY_CHAN_PEER_MAX], struct fy_desc *d,
                        int64_t *deadline, const char *awaiting, const char *from, int stopping,
                        const struct sup_worker *watch)
{
    const int64_t span = *deadline - now_ms();
    for (int64_t polled = now_ms();;) {
        int rc = drain_signals(s, stopping);
        if (rc < 0)
            return rc;
        if (s->continued) {
            s->continued = 0;
            int64_t again = now_ms() + (span > 0 ? span : 0);
            *deadline = *deadline > again ? *deadline : again;
        }
        if (watch != NULL && !watch->alive)
            return -ECHILD;
        int64_t left = *deadline - now_ms();
        if (left <= 0) {
            fy_error("timed out waiting for %s from %s%s", awaiting, from,
                     strcmp(awaiting, "READY") == 0
                         ? ": a slow start (CUDA, pinning a large pool)? raise --ready-timeout S; "
                           "the worker's own lines above say what it was doing"
                         : "");
            return -ETIMEDOUT;
        }
        zmq_pollitem_t items[2] = {
            {.socket = fy_chan_socket(s->chan), .events = ZMQ_POLLIN},
            {.socket = NULL, .fd = s->sigfd, .events = ZMQ_POLLIN},
        };
        long wait = left < 1000 ? (long)left : 1000;
        int64_t before = now_ms();
        int ready = zmq_poll(items, 2, wait);
        int64_t stopped = now_ms() - before - wait, since = before - polled;
        polled = now_ms();
        if (stopped > 1000 || since > 2000) /* this process did not run for a while */
            *deadline += (stopped > 1000 ? stopped : 0) + (since > 2000 ? since : 0);
        if (ready < 0 && zmq_errno() == EINTR)
            continue;
        FY_ZMQ(ready, "launcher: polling for %s from %s", awaiting, from);
        if (items[0].revents & ZMQ_POLLIN)
            return fy_chan_recv(s->chan, peer, d, FY_DESC_MAX_PARTS, 0, awaiting, from);
    }
}

int fy_sup_wait_ready(struct fy_sup *s, int timeout_ms)
{
    int64_t deadline = now_ms() + timeout_ms;
    for (;;) {
        char waiting[128] = "";
        for (unsigned i = 0; i < s->n; i++)
            if (!s->w[i].ready)
                snprintf(waiting + strlen(waiting), sizeof waiting - strlen(waiting), "%s%s",
                         waiting[0] ? ", " : "", s->w[i].name);
        if (waiting[0] == 0)
            return 0;
        char peer[FY_CHAN_PEER_MAX];
        struct fy_desc d[FY_DESC_MAX_PARTS];
        int n = wait_message(s, peer, d, &deadline, "READY", waiting, 0, NULL);
        if (n == -EBADMSG || n == -EPROTO || n == -ERANGE)
            continue;
        if (n < 0)
            return n;
        struct sup_worker *w = find(s, peer);
        if (w == NULL || d[0].op != FY_OP_READY) {
            fy_warn("unexpected %s from '%s' while waiting for READY: ignored", fy_op_name(d[0].op),
                    peer);
            continue;
        }
        w->ready = 1;
        fy_info("%s worker ready", w->name);
    }
}

int64_t fy_sup_submit(struct fy_sup *s, const char *name, struct fy_desc *req, unsigned n,
                      const char *what)
{
    struct sup_worker *w = find(s, name);
    FY_REQUIRE(w != NULL, -ENOENT, "no worker named '%s'", name);
    if (!w->alive)
        return -ECHILD;
    struct outstanding *slot = NULL;
    for (unsigned i = 0; i < FY_SUP_MAX_OUTSTANDING && slot == NULL; i++)
        if (s->out[i].seq == 0)
            slot = &s->out[i];
    FY_REQUIRE(slot != NULL, -EBUSY, "more than %d requests in flight: wait for some first",
               FY_SUP_MAX_OUTSTANDING);
    uint64_t seq = ++s->seq;
    for (unsigned i = 0; i < n; i++)
        req[i].seq = seq;
    int rc = fy_chan_send(s->chan, name, req, n);
    if (rc < 0) {
        /* A send failure is usually a worker that just died: give its exit a moment to be seen,
         * so the failure is reported as the death it is. */
        for (int i = 0; i < 100 && w->alive; i++) {
            struct timespec pause = {0, 20 * 1000000};
            nanosleep(&pause, NULL);
            reap(s);
        }
        int sig = drain_signals(s, 0);
        return sig < 0 ? sig : !w->alive ? -ECHILD : rc;
    }
    memset(slot, 0, sizeof *slot);
    slot->seq = seq;
    slot->worker = (int)(w - s->w);
    snprintf(slot->what, sizeof slot->what, "%s #%llu%s%s", fy_op_name(req[0].op),
             (unsigned long long)seq, what ? " " : "", what ? what : "");
    return (int64_t)seq;
}

static struct outstanding *outstanding_find(struct fy_sup *s, uint64_t seq)
{
    for (unsigned i = 0; i < FY_SUP_MAX_OUTSTANDING; i++)
        if (s->out[i].seq == seq)
            return &s->out[i];
    return NULL;
}

/* A received message: the reply of the request it names, kept until that request is waited for. */
static void take_reply(struct fy_sup *s, const char *peer, const struct fy_desc *d,
                       const char *awaiting)
{
    struct outstanding *hit = d[0].op == FY_OP_DONE ? outstanding_find(s, d[0].seq) : NULL;
    if (hit == NULL || strcmp(peer, s->w[hit->worker].name) != 0) {
        fy_warn("unexpected %s #%llu from '%s' while waiting for %s: ignored", fy_op_name(d[0].op),
                (unsigned long long)d[0].seq, peer, awaiting);
        return;
    }
    hit->reply = d[0];
    hit->done = 1;
}

int fy_sup_poll(struct fy_sup *s, int64_t ticket)
{
    struct outstanding *o = ticket > 0 ? outstanding_find(s, (uint64_t)ticket) : NULL;
    FY_REQUIRE(o != NULL, -EINVAL, "polling request #%lld, which is not in flight",
               (long long)ticket);
    struct sup_worker *w = &s->w[o->worker];
    char awaiting[96];
    snprintf(awaiting, sizeof awaiting, "the reply to %s", o->what);
    while (!o->done) {
        FY_TRY(drain_signals(s, 0));
        if (!w->alive)
            return -ECHILD;
        zmq_pollitem_t item = {.socket = fy_chan_socket(s->chan), .events = ZMQ_POLLIN};
        int ready = zmq_poll(&item, 1, 0);
        if (ready < 0 && zmq_errno() == EINTR)
            continue;
        FY_ZMQ(ready, "launcher: polling for %s", awaiting);
        if (!(item.revents & ZMQ_POLLIN))
            return 0;
        char peer[FY_CHAN_PEER_MAX];
        struct fy_desc d[FY_DESC_MAX_PARTS];
        char from[48];
        snprintf(from, sizeof from, "the %s worker", w->name);
        int got = fy_chan_recv(s->chan, peer, d, FY_DESC_MAX_PARTS, 0, awaiting, from);
        if (got == -EBADMSG || got == -EPROTO || got == -ERANGE)
            continue;
        FY_TRY(got);
        take_reply(s, peer, d, awaiting);
    }
    return 1;
}

int fy_sup_wait(struct fy_sup *s, int64_t ticket, struct fy_desc *reply, int timeout_ms)
{
    struct outstanding *o = ticket > 0 ? outstanding_find(s, (uint64_t)ticket) : NULL;
    FY_REQUIRE(o != NULL, -EINVAL, "waiting for request #%lld, which is not in flight",
               (long long)ticket);
    struct sup_worker *w = &s->w[o->worker];
    int64_t deadline = now_ms() + timeout_ms;
    char awaiting[96], from[48];
    snprintf(awaiting, sizeof awaiting, "the reply to %s", o->what);
    snprintf(from, sizeof from, "the %s worker", w->name);
    while (!o->done) {
        char peer[FY_CHAN_PEER_MAX];
        struct fy_desc d[FY_DESC_MAX_PARTS];
        int got = wait_message(s, peer, d, &deadline, awaiting, from, 0, w);
        if (got == -EBADMSG || got == -EPROTO || got == -ERANGE)
            continue;
        if (got == -ETIMEDOUT && w->alive && w->pid > 0) {
            /* stuck: killed now, so that stopping the others does not wait on it as well */
            fy_error("the %s worker (pid %d) is stuck: no reply to %s within %d s; killing it",
                     w->name, (int)w->pid, o->what, timeout_ms / 1000);
            kill(w->pid, SIGKILL);
            w->killed_stuck = 1;
            s->stuck = o->worker;
        }
        if (got < 0) {
            o->seq = 0; /* the run is failing: forget the request */
            return got;
        }
        take_reply(s, peer, d, awaiting);
    }
    if (reply != NULL)
        *reply = o->reply;
    int status = o->reply.status;
    o->seq = 0;
    return status;
}

int fy_sup_call(struct fy_sup *s, const char *name, struct fy_desc *req, unsigned n,
                struct fy_desc *reply, int timeout_ms)
{
    int64_t ticket = fy_sup_submit(s, name, req, n, NULL);
    if (ticket < 0)
        return (int)ticket;
    return fy_sup_wait(s, ticket, reply, timeout_ms);
}

static int any_alive(const struct fy_sup *s)
{
    for (unsigned i = 0; i < s->n; i++)
        if (s->w[i].alive)
            return 1;
    return 0;
}

/* Waits for live workers to exit until the deadline; the signals keep being drained. */
static void wait_exits(struct fy_sup *s, int64_t deadline)
{
    while (any_alive(s) && now_ms() < deadline) {
        reap(s);
        if (!any_alive(s))
            break;
        struct timespec pause = {0, 20 * 1000000};
        nanosleep(&pause, NULL);
    }
}

int fy_sup_stop(struct fy_sup *s, int timeout_ms)
{
    int rc = 0;
    for (unsigned i = 0; i < s->n; i++) {
        struct sup_worker *w = &s->w[i];
        if (!w->alive)
            continue;
        struct fy_desc stop = {.op = FY_OP_STOP, .kind = FY_KIND_CONTROL, .layer = -1};
        uint64_t seq = ++s->seq;
        stop.seq = seq;
        w->stopping = 1;
        if (!w->ready) { /* still starting (a launch that failed): no request in flight, no
                            channel to ask it on; waiting for it would only cost the timeout */
            w->terminated = 1;
            kill(w->pid, SIGTERM);
            continue;
        }
        if (fy_chan_send(s->chan, w->name, &stop, 1) < 0) {
            rc = -EIO;
            w->terminated = 1;
            kill(w->pid, SIGTERM);
            continue;
        }
        int64_t deadline = now_ms() + timeout_ms;
        for (;;) {
            char peer[FY_CHAN_PEER_MAX];
            struct fy_desc d[FY_DESC_MAX_PARTS];
            int got =
                wait_message(s, peer, d, &deadline, "the stop acknowledgement", w->name, 1, w);
            if (got == -ECHILD) {
                if (!w->alive)
                    break;
                continue; /* another worker died meanwhile: keep stopping in order */
            }
            if (got < 0) {
                rc = got;
                break;
            }
            if (strcmp(peer, w->name) == 0 && d[0].op == FY_OP_DONE && d[0].seq == seq)
                break;
        }
    }
    wait_exits(s, now_ms() + timeout_ms);
    for (int sig = SIGTERM; any_alive(s); sig = SIGKILL) {
        for (unsigned i = 0; i < s->n; i++)
            if (s->w[i].alive) {
                fy_warn("%s worker (pid %d) did not stop: sending %s", s->w[i].name,
                        (int)s->w[i].pid, sig == SIGTERM ? "SIGTERM" : "SIGKILL");
                kill(s->w[i].pid, sig);
            }
        wait_exits(s, now_ms() + (sig == SIGTERM ? 5000 : 60000));
        rc = rc ? rc : -ETIMEDOUT;
        if (sig == SIGKILL)
            break;
    }
    for (unsigned i = 0; i < s->n; i++)
        if (!(WIFEXITED(s->w[i].status) && WEXITSTATUS(s->w[i].status) == 0) && rc == 0)
            rc = -ECHILD;
    return rc;
}

void fy_sup_destroy(struct fy_sup **sp)
{
    if (sp == NULL || *sp == NULL)
        return;
    struct fy_sup *s = *sp;
    for (unsigned i = 0; i < s->n; i++)
        if (s->w[i].alive) {
            kill(s->w[i].pid, SIGKILL);
            waitpid(s->w[i].pid, NULL, 0);
            s->w[i].alive = 0;
        }
    if (s->sigfd >= 0)
        close(s->sigfd);
    sigprocmask(SIG_SETMASK, &s->old_mask, NULL);
    free(s);
    *sp = NULL;
}

void fy_sup_set_stop_flag(struct fy_sup *s, volatile int *flag) { s->stop_flag = flag; }

void fy_sup_pause(struct fy_sup *s, int ms)
{
    for (int64_t end = now_ms() + ms, left = ms; left > 0; left = end - now_ms()) {
        struct pollfd p = {.fd = s->sigfd, .events = POLLIN};
        if (poll(&p, 1, (int)left) != 0 && errno != EINTR)
            return; /* a signal to read (or poll failed: no pause) */
    }
}

int fy_sup_interrupted(const struct fy_sup *s) { return s->interrupted; }

const char *fy_sup_timed_out_worker(const struct fy_sup *s)
{
    return s->stuck >= 0 ? s->w[s->stuck].name : NULL;
}

const char *fy_sup_failed_worker(const struct fy_sup *s)
{
    return s->failed >= 0 ? s->w[s->failed].name : NULL;
}

void fy_sup_fault(const struct fy_sup *s, struct fy_sup_fault *out)
{
    memset(out, 0, sizeof *out);
    int i = s->stuck >= 0 ? s->stuck : s->failed;
    if (i < 0)
        return;
    snprintf(out->worker, sizeof out->worker, "%s", s->w[i].name);
    out->stuck = i == s->stuck;
    if (!out->stuck && !s->w[i].alive && WIFSIGNALED(s->w[i].status))
        out->signal = WTERMSIG(s->w[i].status);
}

pid_t fy_sup_pid(const struct fy_sup *s, const char *name)
{
    for (unsigned i = 0; i < s->n; i++)
        if (strcmp(s->w[i].name, name) == 0)
            return s->w[i].pid;
    return -1;
}

int fy_sup_write_pids(const struct fy_sup *s, const char *path)
{
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    FY_SYS(f == NULL ? -1 : 0, "cannot write %s", tmp);
    fprintf(f, "launch %d\n", (int)getpid());
    for (unsigned i = 0; i < s->n; i++)
        fprintf(f, "%s %d\n", s->w[i].name, (int)s->w[i].pid);
    int failed = fclose(f) != 0;
    FY_SYS(failed ? -1 : 0, "cannot write %s", tmp);
    FY_SYS(rename(tmp, path), "cannot rename %s to %s", tmp, path);
    return 0;
}
