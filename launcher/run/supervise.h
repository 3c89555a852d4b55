/* Worker supervision for fuyou-launch: spawn the worker executables pinned by their run config,
 * wait for READY, exchange requests while watching for worker death (SIGCHLD) and SIGINT/SIGTERM
 * through a signalfd, and stop everything in order. */
#ifndef FY_SUPERVISE_H
#define FY_SUPERVISE_H

#include <signal.h>
#include <sys/types.h>

#include "common/chan.h"
#include "common/desc.h"

#define FY_SUP_MAX_WORKERS 12 /* io, opt and up to 8 gpu workers (--gpus), and a spare */
/* Requests in flight at once (sent, reply not yet waited for). */
#define FY_SUP_MAX_OUTSTANDING 64

struct fy_sup;

/* Blocks SIGCHLD, SIGINT and SIGTERM (and restores SIGCHLD's default disposition). Call it before
 * any thread exists (ZeroMQ starts I/O threads), so that no thread can take these signals with the
 * default action; the signalfd of fy_sup_new then reads them. old_mask may be NULL. */
int fy_sup_block_signals(sigset_t *old_mask);

/* Blocks the supervised signals (fy_sup_block_signals) and reads them from a signalfd. */
int fy_sup_new(struct fy_sup **out, const char *run_dir, struct fy_chan *chan);
/* Kills (SIGKILL) any worker still running, reaps it, and restores the signal mask. */
void fy_sup_destroy(struct fy_sup **s);

/* Starts BIN_DIR/fuyou-NAME-worker --run-dir RUN_DIR; it dies with the launcher (PDEATHSIG).
 * NAME "gpuR" (R >= 1) starts the gpu worker with --rank R. */
int fy_sup_spawn(struct fy_sup *s, const char *name);
/* Waits until every spawned worker said READY. -ETIMEDOUT names the ones that did not. */
int fy_sup_wait_ready(struct fy_sup *s, int timeout_ms);
/* Sends a request to a worker (seq assigned here) and waits for its DONE. Returns the reply's
 * status (0 or -errno from the worker), -ECHILD when a worker died, -EINTR on SIGINT/SIGTERM,
 * -ETIMEDOUT when the worker did not answer in time. */
int fy_sup_call(struct fy_sup *s, const char *name, struct fy_desc *req, unsigned n,
                struct fy_desc *reply, int timeout_ms);
/* Sends a request without waiting; returns a ticket (> 0) for fy_sup_wait, or -errno. `what` (may
 * be NULL) is added to messages about it. Replies to other requests that arrive while one is
 * waited for are kept, so requests to several workers can be in flight together. */
int64_t fy_sup_submit(struct fy_sup *s, const char *name, struct fy_desc *req, unsigned n,
                      const char *what);
/* Waits for a submitted request's reply; returns its status, as fy_sup_call does. A worker that
 * does not answer in time is taken for stuck and killed (SIGKILL). */
int fy_sup_wait(struct fy_sup *s, int64_t ticket, struct fy_desc *reply, int timeout_ms);
/* Whether a submitted request's reply has arrived, without blocking: 1 (it is kept for
 * fy_sup_wait), 0 (not yet), or -errno as fy_sup_wait returns. */
int fy_sup_poll(struct fy_sup *s, int64_t ticket);
/* Orderly stop: STOP to each live worker in spawn order, acknowledgements, exits; a worker that does
 * not comply within timeout_ms gets SIGTERM, then SIGKILL. Returns 0 when all stopped cleanly. */
int fy_sup_stop(struct fy_sup *s, int timeout_ms);

/* A graceful stop (training): with a flag given, the first SIGINT or SIGTERM only sets *flag to
 * the signal's number, for the caller to stop at its next step boundary, and waits go on; a second
 * one interrupts at once (-EINTR), as every one does without a flag (NULL). */
void fy_sup_set_stop_flag(struct fy_sup *s, volatile int *flag);
/* Waits ms milliseconds, or less where a supervised signal comes (it is left for the supervision
 * to read): a test hook's pause that a stop ends. */
void fy_sup_pause(struct fy_sup *s, int ms);
/* The signal that interrupted the run (SIGINT/SIGTERM), or 0. */
int fy_sup_interrupted(const struct fy_sup *s);
/* Name of the worker that fy_sup_wait killed for not answering within its timeout, or NULL. */
const char *fy_sup_timed_out_worker(const struct fy_sup *s);
/* Name of the first worker that died unexpectedly, or NULL. */
const char *fy_sup_failed_worker(const struct fy_sup *s);
/* Which worker ended a session early and how, for a caller deciding whether to start the workers
 * again (a worker that exited on its own said why, and would likely say so again). */
struct fy_sup_fault {
    char worker[16]; /* "": none failed */
    int stuck;       /* killed for not answering within a request's deadline */
    int signal;      /* died of this signal; 0 when it exited on its own, or was stuck */
};
void fy_sup_fault(const struct fy_sup *s, struct fy_sup_fault *out);
pid_t fy_sup_pid(const struct fy_sup *s, const char *name);
/* Writes "name pid" lines to path (atomically), for people and tools watching the run. */
int fy_sup_write_pids(const struct fy_sup *s, const char *path);

#endif
