/* One gpu request to every rank's gpu worker, answered as one: see gpus.h. */
#include "launcher/run/gpus.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"

/* Group tickets are told from the inner executor's by this bit (the inner's are small). */
#define GROUP_BIT ((int64_t)1 << 62)
#define GROUPS_MAX 256 /* requests to the gpu workers in flight at once, at most */

struct group {
    int64_t id; /* 0: free */
    int op;
    int ranks; /* how many were sent the request */
    int64_t inner[FY_GPUS_MAX];
};

struct fy_gpus {
    struct fy_exec inner;
    int ranks;
    int64_t next;
    struct group g[GROUPS_MAX];
};

void fy_gpus_worker_name(int rank, char *buf, size_t len)
{
    if (rank == 0)
        snprintf(buf, len, "gpu");
    else
        snprintf(buf, len, "gpu%d", rank);
}

static struct group *group_of(struct fy_gpus *g, int64_t ticket)
{
    for (int i = 0; i < GROUPS_MAX; i++)
        if (g->g[i].id == ticket)
            return &g->g[i];
    return NULL;
}

static int64_t gpus_submit(void *ctx, const char *worker, struct fy_desc *req, unsigned n)
{
    struct fy_gpus *g = ctx;
    if (strcmp(worker, "gpu") != 0 || g->ranks == 1)
        return g->inner.submit(g->inner.ctx, worker, req, n);
    struct group *free_one = group_of(g, 0);
    FY_REQUIRE(free_one != NULL, -EBUSY,
               "gpu workers: %d requests in flight: wait for some before sending more", GROUPS_MAX);
    /* one rank measures the profile: each worker runs the same share of the batch */
    int ranks = req[0].op == FY_OP_GPT_PROFILE ? 1 : g->ranks;
    struct group grp = {.op = req[0].op, .ranks = ranks};
    for (int r = 0; r < ranks; r++) {
        char name[16];
        fy_gpus_worker_name(r, name, sizeof name);
        int64_t t = g->inner.submit(g->inner.ctx, name, req, n);
        if (t < 0) { /* those sent are answered and forgotten; the run fails on this error */
            for (int k = 0; k < r; k++)
                (void)g->inner.wait(g->inner.ctx, grp.inner[k], NULL, 1000);
            return t;
        }
        grp.inner[r] = t;
    }
    grp.id = GROUP_BIT | ++g->next;
    *free_one = grp;
    return grp.id;
}

/* The replies of every rank as one: the first failure's status; when the work ran, rank 0's (the
 * GPUs work side by side, each on an equal share, so the step's GPU busy time is one GPU's: rank
 * 0's, which waits for no other rank's share on the CPU backend); each copy time the longest
 * rank's (each GPU has its own link); a head's loss the sum of the ranks' shares in rank order
 * (each averaged over the whole batch). */
static int gpus_wait(void *ctx, int64_t ticket, struct fy_desc *reply, int timeout_ms)
{
    struct fy_gpus *g = ctx;
    if ((ticket & GROUP_BIT) == 0)
        return g->inner.wait(g->inner.ctx, ticket, reply, timeout_ms);
    struct group *grp = group_of(g, ticket);
    FY_REQUIRE(grp != NULL, -EINVAL, "gpu workers: no request %lld in flight",
               (long long)(ticket & ~GROUP_BIT));
    int status = 0;
    double loss = 0, h2d = 0, d2h = 0;
    struct fy_desc first = {0};
    for (int r = 0; r < grp->ranks; r++) {
        struct fy_desc one = {0};
        int rc = g->inner.wait(g->inner.ctx, grp->inner[r], &one, timeout_ms);
        status = status ? status : rc;
        if (rc != 0)
            continue;
        if (r == 0)
            first = one;
        double part, up, down;
        memcpy(&part, &one.arg, sizeof part);
        loss += part;
        fy_desc_copy_times(&one, &up, &down);
        h2d = up > h2d ? up : h2d;
        d2h = down > d2h ? down : d2h;
    }
    int op = grp->op;
    memset(grp, 0, sizeof *grp);
    if (reply != NULL && status == 0) {
        *reply = first;
        if (op == FY_OP_GPT_HEAD)
            memcpy(&reply->arg, &loss, sizeof loss);
        fy_desc_set_copy_times(reply, h2d, d2h);
    }
    return status;
}

static int gpus_poll(void *ctx, int64_t ticket)
{
    struct fy_gpus *g = ctx;
    if ((ticket & GROUP_BIT) == 0)
        return g->inner.poll(g->inner.ctx, ticket);
    struct group *grp = group_of(g, ticket);
    FY_REQUIRE(grp != NULL, -EINVAL, "gpu workers: no request %lld in flight",
               (long long)(ticket & ~GROUP_BIT));
    for (int r = 0; r < grp->ranks; r++) {
        int rc = g->inner.poll(g->inner.ctx, grp->inner[r]);
        if (rc <= 0)
            return rc;
    }
    return 1;
}

int fy_gpus_new(struct fy_gpus **out, const struct fy_exec *inner, int ranks)
{
    *out = NULL;
    FY_REQUIRE(ranks >= 1 && ranks <= FY_GPUS_MAX, -EINVAL,
               "gpu workers: %d: give 1 to %d (--gpus)", ranks, FY_GPUS_MAX);
    struct fy_gpus *g = calloc(1, sizeof *g);
    if (g == NULL)
        return -ENOMEM;
    g->inner = *inner;
    g->ranks = ranks;
    *out = g;
    return 0;
}

void fy_gpus_destroy(struct fy_gpus **g)
{
    if (g == NULL || *g == NULL)
        return;
    free(*g);
    *g = NULL;
}

struct fy_exec fy_gpus_exec(struct fy_gpus *g)
{
    return (struct fy_exec){.ctx = g, .submit = gpus_submit, .wait = gpus_wait, .poll = gpus_poll};
}
