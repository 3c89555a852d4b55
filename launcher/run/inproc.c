/* In-process executor: descriptors are validated as if received, then dispatched to the gpu and opt
 * handlers directly; io requests go to extents held in memory. */
#include "launcher/run/inproc.h"

#include <errno.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/digest.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/gptexec.h"
#include "opt_worker/optstep.h"

struct mem_extent {
    uint32_t tensor;
    uint64_t bytes;
    uint8_t *data;
};

/* Requests run when submitted (in submission order, as the workers would serve them); their
 * replies wait here for the ticket. */
#define INPROC_MAX_TICKETS 64

struct done_request {
    int64_t ticket; /* 0: free */
    struct fy_desc reply;
};

struct fy_inproc {
    struct fy_pool *pool;
    int64_t next_ticket;
    struct done_request done[INPROC_MAX_TICKETS];
    struct fy_backend *backend;
    struct fy_gptexec *gpt;
    struct fy_optstep *opt;
    struct mem_extent *extents;
    unsigned n_extents;
};

int fy_inproc_new(struct fy_inproc **out, struct fy_pool *pool, const struct fy_config *cfg,
                  const char *cpus)
{
    *out = NULL;
    struct fy_inproc *p = calloc(1, sizeof *p);
    if (p == NULL)
        return -ENOMEM;
    p->pool = pool;
    int rc = fy_backend_open(&p->backend, "cpu", 0);
    if (rc == 0)
        rc = fy_gptexec_new(&p->gpt, p->backend, cfg, p->pool);
    if (rc == 0)
        rc = fy_optstep_new(&p->opt, cfg, cpus);
    /* The optimizer's pool pinned this thread to one cpu, and OpenMP teams inherit that: one thread
     * then, rather than several contending for it (results do not depend on the count). */
    omp_set_num_threads(1);
    if (rc < 0) {
        fy_inproc_destroy(&p);
        return rc;
    }
    *out = p;
    return 0;
}

void fy_inproc_destroy(struct fy_inproc **pp)
{
    if (pp == NULL || *pp == NULL)
        return;
    struct fy_inproc *p = *pp;
    fy_optstep_destroy(&p->opt);
    fy_gptexec_destroy(&p->gpt);
    fy_backend_close(&p->backend);
    for (unsigned i = 0; i < p->n_extents; i++)
        free(p->extents[i].data);
    free(p->extents);
    free(p);
    *pp = NULL;
}

static struct mem_extent *find_extent(struct fy_inproc *p, uint32_t tensor)
{
    for (unsigned i = 0; i < p->n_extents; i++)
        if (p->extents[i].tensor == tensor)
            return &p->extents[i];
    return NULL;
}

/* An I/O request; with `digest` (the io worker's second, control part) a write's reply carries
 * the digest of the bytes written and a read must have the digest *want. */
static int mem_io(struct fy_inproc *p, const struct fy_desc *d, const struct fy_desc *digest,
                  struct fy_desc *reply)
{
    if (d->op == FY_OP_IO_SYNC)
        return 0;
    if (d->op == FY_OP_IO_ALLOC) { /* idempotent for the same size, as the io worker's */
        struct mem_extent *have = find_extent(p, d->tensor);
        FY_REQUIRE(have == NULL || have->bytes == d->arg, -EEXIST,
                   "memory store: extent %u exists with another size", d->tensor);
        if (have != NULL)
            return 0;
        struct mem_extent *grown = realloc(p->extents, (p->n_extents + 1) * sizeof *grown);
        if (grown == NULL)
            return -ENOMEM;
        p->extents = grown;
        struct mem_extent *e = &p->extents[p->n_extents];
        e->tensor = d->tensor;
        e->bytes = d->arg;
        e->data = calloc(1, d->arg ? d->arg : 1);
        if (e->data == NULL)
            return -ENOMEM;
        p->n_extents++;
        return 0;
    }
    FY_REQUIRE(d->op == FY_OP_IO_READ || d->op == FY_OP_IO_WRITE, -EPROTO,
               "memory store: op %s is not an I/O operation", fy_op_name(d->op));
    struct mem_extent *e = find_extent(p, d->tensor);
    FY_REQUIRE(e != NULL, -ENOENT, "memory store: no extent %u", d->tensor);
    FY_REQUIRE(d->arg <= e->bytes && d->bytes <= e->bytes - d->arg, -ERANGE,
               "memory store: [%llu, +%llu) outside extent %u of %llu bytes",
               (unsigned long long)d->arg, (unsigned long long)d->bytes, d->tensor,
               (unsigned long long)e->bytes);
    uint8_t *region = fy_pool_at(p->pool, d->offset, d->bytes);
    if (d->op == FY_OP_IO_READ)
        memcpy(region, e->data + d->arg, d->bytes);
    else
        memcpy(e->data + d->arg, region, d->bytes);
    if (digest == NULL)
        return 0;
    reply->arg = fy_digest(region, d->bytes);
    FY_REQUIRE(
        d->op == FY_OP_IO_WRITE || digest->step == FY_IO_DIGEST_REPORT || reply->arg == digest->arg,
        -EBADMSG, "memory store: extent %u read back with another digest than it was written with",
        d->tensor);
    return 0;
}

static int inproc_run(struct fy_inproc *p, const char *worker, struct fy_desc *req, unsigned n,
                      struct fy_desc *reply)
{
    char why[256];
    for (unsigned i = 0; i < n; i++) {
        int rc = fy_desc_validate(&req[i], fy_pool_size(p->pool), why, sizeof why);
        FY_REQUIRE(rc == 0, rc, "in-process %s request rejected: %s", worker, why);
    }
    memset(reply, 0, sizeof *reply);
    reply->op = FY_OP_DONE;
    reply->seq = req[0].seq;
    int rc;
    uint64_t started = fy_monotonic_ns();
    if (strcmp(worker, "gpu") == 0)
        rc = fy_gptexec_handle(p->gpt, p->pool, req, n, reply);
    else if (strcmp(worker, "opt") == 0)
        rc = fy_optstep_handle(p->opt, p->pool, req, n, reply);
    else if (strcmp(worker, "io") == 0 && n == 1)
        rc = mem_io(p, &req[0], NULL, reply);
    else if (strcmp(worker, "io") == 0 && n == 2 && req[1].kind == FY_KIND_CONTROL)
        rc = mem_io(p, &req[0], &req[1], reply);
    else {
        fy_error("in-process executor: no worker '%s' for %s", worker, fy_op_name(req[0].op));
        rc = -EPROTO;
    }
    reply->status = rc;
    fy_desc_set_timing(reply, started, fy_monotonic_ns());
    return rc;
}

static int64_t inproc_submit(void *ctx, const char *worker, struct fy_desc *req, unsigned n)
{
    struct fy_inproc *p = ctx;
    struct done_request *slot = NULL;
    for (unsigned i = 0; i < INPROC_MAX_TICKETS && slot == NULL; i++)
        if (p->done[i].ticket == 0)
            slot = &p->done[i];
    FY_REQUIRE(slot != NULL, -EBUSY, "in-process executor: more than %d requests in flight",
               INPROC_MAX_TICKETS);
    inproc_run(p, worker, req, n, &slot->reply); /* the status travels in the reply */
    slot->ticket = ++p->next_ticket;
    return slot->ticket;
}

static int inproc_wait(void *ctx, int64_t ticket, struct fy_desc *reply, int timeout_ms)
{
    struct fy_inproc *p = ctx;
    for (unsigned i = 0; i < INPROC_MAX_TICKETS; i++)
        if (p->done[i].ticket == ticket && ticket > 0) {
            if (reply != NULL)
                *reply = p->done[i].reply;
            p->done[i].ticket = 0;
            return p->done[i].reply.status;
        }
    fy_error("in-process executor: no request #%lld in flight", (long long)ticket);
    return -EINVAL;
}

/* Requests run when submitted, so every ticket in flight is done. */
static int inproc_poll(void *ctx, int64_t ticket) { return 1; }

struct fy_exec fy_inproc_exec(struct fy_inproc *p)
{
    return (struct fy_exec){
        .ctx = p, .submit = inproc_submit, .wait = inproc_wait, .poll = inproc_poll};
}
