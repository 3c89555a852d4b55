/* Requests through an executor and their tickets (launcher/step/ticket.h). */
#include "launcher/step/ticket.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/check.h"
#include "common/formats/ckpt.h"
#include "common/base/dtype.h"
#include "common/base/log.h"

static const char *const worker_names[FY_TICKET_WORKERS] = {"io", "gpu", "opt"};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void fy_ticket_step(struct fy_tickets *tk, uint64_t step)
{
    tk->step = step;
    memset(tk->wait_s, 0, sizeof tk->wait_s);
    memset(tk->busy_s, 0, sizeof tk->busy_s);
    memset(tk->busy_bytes, 0, sizeof tk->busy_bytes);
}

/* A finished request: its busy time, and a trace event. */
static void account(struct fy_tickets *tk, const struct fy_ticket *t)
{
    static const char *const tracks[FY_TICKET_WORKERS] = {"io worker", "gpu worker", "opt worker"};
    double seconds = (double)t->reply.bytes * 1e-9;
    int k = t->worker == FY_TICKET_GPU                          ? FY_TICKET_BUSY_GPU
            : t->worker == FY_TICKET_OPT                        ? FY_TICKET_BUSY_OPT
            : t->op == FY_OP_IO_WRITE || t->op == FY_OP_IO_SYNC ? FY_TICKET_BUSY_SSD_WRITE
                                                                : FY_TICKET_BUSY_SSD_READ;
    tk->busy_s[k] += seconds;
    tk->busy_bytes[k] += t->io_bytes;
    if (t->worker == FY_TICKET_GPU) { /* and the device time of its copies (0 on the CPU backend) */
        double h2d, d2h;
        fy_desc_copy_times(&t->reply, &h2d, &d2h);
        tk->busy_s[FY_TICKET_BUSY_H2D] += h2d;
        tk->busy_s[FY_TICKET_BUSY_D2H] += d2h;
        if (t->backward)
            tk->busy_s[FY_TICKET_BUSY_GPU_BACKWARD] += seconds;
    }
    if (tk->trace != NULL && t->reply.bytes > 0)
        fprintf(tk->trace,
                "{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, "
                "\"dur\": %.3f, \"pid\": 1, \"tid\": %d, \"args\": {\"step\": %llu, "
                "\"unit\": %d, \"seq\": %lld, \"tensor\": %u, \"at\": %llu, \"bytes\": %llu}},\n",
                fy_op_name(t->op), tracks[t->worker], (double)t->reply.offset * 1e-3,
                (double)t->reply.bytes * 1e-3, t->worker + 1, (unsigned long long)t->step, t->layer,
                (long long)t->id, t->tensor, (unsigned long long)t->at,
                (unsigned long long)t->io_bytes);
}

/* A read that the store answered with bytes other than were written there (a digest mismatch, an
 * I/O error): said with what it was, for the restart that goes back to the last commit. */
static void say_damage(const struct fy_tickets *tk, const struct fy_ticket *t)
{
    char what[64];
    uint32_t copy = t->tensor >= FY_TENSOR_UNIT_STATE_COPY(0, 1);
    uint32_t unit = t->tensor - FY_TENSOR_UNIT_STATE_COPY(0, copy);
    if (unit < tk->units)
        snprintf(what, sizeof what, "unit %u's state in copy %u", unit, copy);
    else
        snprintf(what, sizeof what, "extent %u", t->tensor);
    fy_error("step %llu: %s read back from the SSD store is damaged (%s): it is not what was "
             "written there",
             (unsigned long long)t->step, what, strerror(-t->status));
}

/* Ticket t for request `id` (its first descriptor req), just sent. */
static void ticket_fill(const struct fy_tickets *tk, struct fy_ticket *t, int64_t id, int worker,
                        const struct fy_desc *req, unsigned n)
{
    t->id = id;
    t->worker = worker;
    t->op = req->op;
    t->layer = req->layer;
    int io = t->op == FY_OP_IO_READ || t->op == FY_OP_IO_WRITE;
    t->tensor = io ? req->tensor : 0;
    t->at = io ? req->arg : 0;
    t->io_bytes = 0;
    for (unsigned i = 0; io && i < n; i++)
        t->io_bytes += req[i].bytes;
    /* an evaluation's head makes no gradient: it is not the backward's */
    t->backward = 0;
    for (unsigned i = 0; worker == FY_TICKET_GPU && i < n; i++)
        t->backward |= req[i].kind == FY_KIND_GRAD;
    t->step = tk->step;
    t->done = 0;
}

/* A ticket's own request waited for (not its group's). */
static void finish_one(struct fy_tickets *tk, struct fy_ticket *t)
{
    double t0 = now_s();
    t->status = tk->x->wait(tk->x->ctx, t->id, &t->reply, tk->timeout_ms);
    tk->wait_s[t->worker] += now_s() - t0;
    t->done = 1;
    if (t->step > 0 && t->op == FY_OP_IO_READ && fy_is_damage(t->status))
        say_damage(tk, t); /* in a step (opening a commit says what its check found) */
    if (t->status == 0 && t->digest_into != NULL)
        *t->digest_into = t->reply.arg;
    if (t->status == 0)
        account(tk, t);
}

void fy_ticket_finish(struct fy_tickets *tk, struct fy_ticket *t)
{
    if (!t->done)
        finish_one(tk, t);
    for (unsigned i = 0; i < t->group_n; i++) {
        if (!t->group[i].done)
            finish_one(tk, &t->group[i]);
        if (t->status == 0)
            t->status = t->group[i].status;
    }
}

int fy_ticket_join(struct fy_tickets *tk, struct fy_ticket *t, struct fy_ticket *more)
{
    struct fy_ticket *grown = realloc(t->group, (t->group_n + 1) * sizeof *grown);
    if (grown == NULL) { /* waited for here, so that nothing stays in flight untracked */
        fy_ticket_wait(tk, more, NULL);
        fy_error("no memory to join a request to a ticket");
        return -ENOMEM;
    }
    t->group = grown;
    t->group[t->group_n++] = *more;
    memset(more, 0, sizeof *more);
    return 0;
}

int fy_ticket_wait(struct fy_tickets *tk, struct fy_ticket *t, struct fy_desc *reply)
{
    if (t->id == 0)
        return 0;
    fy_ticket_finish(tk, t);
    if (reply != NULL)
        *reply = t->reply;
    int rc = t->status;
    free(t->group);
    memset(t, 0, sizeof *t);
    return rc;
}

int fy_ticket_finished(struct fy_tickets *tk, struct fy_ticket *t)
{
    int in = t->done ? 1 : tk->x->poll(tk->x->ctx, t->id);
    if (in > 0 && !t->done)
        finish_one(tk, t);
    for (unsigned i = 0; in > 0 && i < t->group_n; i++) {
        if (!t->group[i].done) {
            in = tk->x->poll(tk->x->ctx, t->group[i].id);
            if (in > 0)
                finish_one(tk, &t->group[i]);
        }
        if (in > 0 && t->status == 0)
            t->status = t->group[i].status;
    }
    return in;
}

int fy_ticket_issue(struct fy_tickets *tk, int worker, struct fy_desc *req, unsigned n,
                    struct fy_ticket *t)
{
    double t0 = now_s();
    int64_t id = tk->x->submit(tk->x->ctx, worker_names[worker], req, n);
    tk->wait_s[worker] += now_s() - t0;
    if (id < 0)
        return (int)id;
    ticket_fill(tk, t, id, worker, req, n);
    if (tk->overlap)
        return 0;
    fy_ticket_finish(tk, t);
    return t->status;
}

int fy_ticket_io(struct fy_tickets *tk, int op, uint32_t tensor, uint64_t pool_offset,
                 uint64_t bytes, uint64_t arg)
{
    struct fy_desc d = fy_desc_region(op, bytes ? FY_KIND_RAW : FY_KIND_CONTROL, FY_DTYPE_NONE,
                                      pool_offset, bytes, -1);
    d.tensor = tensor;
    d.arg = arg;
    struct fy_ticket t;
    memset(&t, 0, sizeof t);
    int64_t id = tk->x->submit(tk->x->ctx, worker_names[FY_TICKET_IO], &d, 1);
    if (id < 0)
        return (int)id;
    ticket_fill(tk, &t, id, FY_TICKET_IO, &d, 1);
    return fy_ticket_wait(tk, &t, NULL);
}

int fy_ticket_io_issue(struct fy_tickets *tk, int op, uint32_t tensor, uint64_t pool_offset,
                       uint64_t bytes, struct fy_ticket *t)
{
    struct fy_desc d = fy_desc_region(op, FY_KIND_RAW, FY_DTYPE_NONE, pool_offset, bytes, -1);
    d.tensor = tensor;
    return fy_ticket_issue(tk, FY_TICKET_IO, &d, 1, t);
}

void fy_ticket_trace_begin(struct fy_tickets *tk)
{
    tk->traced = tk->trace != NULL;
    if (tk->traced) /* Chrome trace-event JSON array; one track per worker */
        fprintf(tk->trace, "[\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 1, "
                           "\"args\": {\"name\": \"io worker (SSD)\"}},\n"
                           "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 2, "
                           "\"args\": {\"name\": \"gpu worker\"}},\n"
                           "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 3, "
                           "\"args\": {\"name\": \"opt worker (AdamW)\"}},\n");
}

void fy_ticket_trace_end(struct fy_tickets *tk)
{
    if (!tk->traced)
        return;
    /* close the array (a trailing event carries no comma) */
    fprintf(tk->trace,
            "{\"name\": \"end\", \"ph\": \"i\", \"s\": \"g\", \"pid\": 1, \"tid\": 1, "
            "\"ts\": %.3f}\n]\n",
            (double)fy_monotonic_ns() * 1e-3);
    fflush(tk->trace);
}
