/* The executor: what the step engine (launcher/step/) sends its requests through, to the worker
 * processes (launcher/run/session, several gpu workers through launcher/run/gpus) or, for tests
 * and debugging, to the same handlers called in one process (launcher/run/inproc). A request is
 * a worker's name and its descriptors (common/ipc/desc.h); its reply one descriptor with a status. */
#ifndef FY_EXEC_H
#define FY_EXEC_H

#include <stdint.h>

#include "common/ipc/desc.h"

struct fy_exec {
    void *ctx;
    /* Sends a request to a worker ("gpu", "io", "opt") without waiting; returns a ticket (> 0) or
     * -errno. Each worker serves its requests in the order they were sent. */
    int64_t (*submit)(void *ctx, const char *worker, struct fy_desc *req, unsigned n);
    /* Waits for a ticket's reply; returns the reply's status (0 or -errno). */
    int (*wait)(void *ctx, int64_t ticket, struct fy_desc *reply, int timeout_ms);
    /* Whether a ticket's reply is in, without blocking: 1 (then wait returns at once), 0, or
     * -errno. */
    int (*poll)(void *ctx, int64_t ticket);
};

#endif
