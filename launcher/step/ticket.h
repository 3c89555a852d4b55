/* The requests a schedule sends to the workers through an executor, and their tickets: sent in turn
 * (overlapped) or each waited for at once (serial), with the time the schedule waits for each
 * worker, each resource's busy time from the workers' own timing of each request, and one Chrome
 * trace event (Perfetto) per request, over an executor (launcher/run/exec.h). */
#ifndef FY_TICKET_H
#define FY_TICKET_H

#include <stdint.h>
#include <stdio.h>

#include "common/ipc/desc.h"
#include "launcher/run/exec.h"

/* The worker a request goes to, which the time waited for it counts to. */
enum { FY_TICKET_IO, FY_TICKET_GPU, FY_TICKET_OPT, FY_TICKET_WORKERS };
/* Busy time of each resource, from the workers' own timing of each request. */
enum {
    FY_TICKET_BUSY_GPU,
    FY_TICKET_BUSY_SSD_READ,
    FY_TICKET_BUSY_SSD_WRITE,
    FY_TICKET_BUSY_OPT,
    FY_TICKET_BUSY_H2D,
    FY_TICKET_BUSY_D2H,
    /* the part of FY_TICKET_BUSY_GPU that is the backward pass, the gpu requests that make
     * gradients (the head with its loss, the blocks' backward with any recompute, the embedding's,
     * the gradients sent home): what a clipped step must finish before its first update */
    FY_TICKET_BUSY_GPU_BACKWARD,
    FY_TICKET_BUSY_COUNT
};

/* A request in flight and the worker its waiting time counts to; id 0: nothing to wait for. */
struct fy_ticket {
    int64_t id;
    int worker;
    int op, layer;
    uint32_t tensor; /* an io request's extent and byte offset in it, for the trace */
    uint64_t at;
    uint64_t step;     /* the step it belongs to (an update can finish in the next step) */
    uint64_t io_bytes; /* an io read's or write's bytes, all its descriptors' */
    int backward;      /* a gpu request that makes gradients: part of the backward pass */
    int done;          /* already waited for (serial mode): status and reply kept here */
    int status;
    struct fy_desc reply;
    uint64_t *digest_into; /* an io write's: where its reply's digest goes */
    /* requests answered as one with this one (fy_ticket_join: the pieces of a unit's state moved
     * together), waited for with it; NULL: none */
    struct fy_ticket *group;
    unsigned group_n;
};

/* A schedule's requests. */
struct fy_tickets {
    const struct fy_exec *x;
    int overlap;    /* 0: wait for every request before sending the next (the serial order) */
    int timeout_ms; /* per request */
    unsigned units; /* the model's, to name a damaged unit's state */
    FILE *trace;    /* Chrome trace-event JSON, or NULL */
    int traced;     /* the trace's opening is written (fy_ticket_trace_begin) */
    uint64_t step;  /* the step the requests sent now belong to */
    /* since fy_ticket_step: the time waited for each worker, each resource's busy time and what
     * the io requests behind it moved (the SSD's) */
    double wait_s[FY_TICKET_WORKERS];
    double busy_s[FY_TICKET_BUSY_COUNT];
    uint64_t busy_bytes[FY_TICKET_BUSY_COUNT];
};

/* The requests sent from now on belong to `step`; the times and bytes start again from 0. */
void fy_ticket_step(struct fy_tickets *tk, uint64_t step);
/* Sends a request of n parts to `worker`; in serial mode also waits for it (its status returned,
 * the ticket done). */
int fy_ticket_issue(struct fy_tickets *tk, int worker, struct fy_desc *req, unsigned n,
                    struct fy_ticket *t);
/* Adds the request of ticket `more` (sent) to t's, which is then answered once both are (its
 * status the first failure's, its reply t's own); `more` is cleared. -ENOMEM (said, `more` waited
 * for). */
int fy_ticket_join(struct fy_tickets *tk, struct fy_ticket *t, struct fy_ticket *more);
/* Waits for ticket t (nothing where its id is 0), its reply into *reply (may be NULL); the ticket
 * is cleared. Returns the reply's status. */
int fy_ticket_wait(struct fy_tickets *tk, struct fy_ticket *t, struct fy_desc *reply);
/* Waits for t's reply and keeps it in the ticket (done), to be taken by fy_ticket_wait. */
void fy_ticket_finish(struct fy_tickets *tk, struct fy_ticket *t);
/* 1 when the request behind ticket t (in flight or done) has finished, its status then kept in
 * the ticket until waited for; 0 while it runs; -errno when polling fails. */
int fy_ticket_finished(struct fy_tickets *tk, struct fy_ticket *t);
/* One request to the io worker, waited for: `bytes` at pool offset `pool_offset` (none: a control
 * request) of extent `tensor`, `arg` its offset or size there. */
int fy_ticket_io(struct fy_tickets *tk, int op, uint32_t tensor, uint64_t pool_offset,
                 uint64_t bytes, uint64_t arg);
/* One read or write of `bytes` at pool offset `pool_offset` from or to the start of extent
 * `tensor`, sent. */
int fy_ticket_io_issue(struct fy_tickets *tk, int op, uint32_t tensor, uint64_t pool_offset,
                       uint64_t bytes, struct fy_ticket *t);
/* The trace's opening (a JSON array and a track per worker), and its end where it was opened;
 * nothing without a trace. */
void fy_ticket_trace_begin(struct fy_tickets *tk);
void fy_ticket_trace_end(struct fy_tickets *tk);

#endif
