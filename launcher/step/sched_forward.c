/* The forward of a step's schedule: launcher/step/sched_forward.h. */
#include "launcher/step/sched_forward.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"
#include "common/base/log.h"
#include "launcher/step/sched_clip.h"
#include "launcher/step/sched_gpu.h"
#include "launcher/step/sched_weights.h"

/* What a forward's parts share: training or evaluating, the units of weights read ahead (depth),
 * per unit its weights' read (rw) and its gpu request (g; the embeddings' g_embed), and the
 * deferred updates' write-backs by state slot (fws). */
struct forward {
    int train;
    unsigned depth;
    struct fy_ticket *rw, *g, g_embed, fws[2];
};

/* A unit's weights for the forward, into weights slot `slot` (*t the request that brings them):
 * fy_sched_read_weights', or for a block whose update one-pass clipping deferred, its state
 * (fy_sched_deferred_read). The forward goes up the units, so the updates of the units from the
 * next one it converts on are held back in the optimizer's queue (launcher/step/optq.h). */
static int forward_read(struct fy_sched *r, struct forward *fw, unsigned u, unsigned slot,
                        struct fy_ticket *t)
{
    fy_optq_hold_from(&r->opt, fy_sched_next_converted(r, u + (r->clip.deferred[u] ? 0 : 1)));
    if (!r->clip.deferred[u])
        return fy_sched_read_weights(r, u, slot, t);
    return fy_sched_deferred_read(r, u, slot, t, fw->g, fw->fws);
}

/* A training forward needs every unit's weights to be the previous step's. */
static int check_versions(const struct fy_sched *r, uint64_t step)
{
    for (unsigned u = 0; u <= r->l.c->n_layer + 1; u++)
        FY_REQUIRE(r->version[u] == step - 1, -EPROTO,
                   "schedule error: unit %u holds step %llu's weights, step %llu needs step %llu's",
                   u, (unsigned long long)r->version[u], (unsigned long long)step,
                   (unsigned long long)(step - 1));
    return 0;
}

/* The embeddings' forward into x_0, once their weights are in slot 0 (*t_embed). */
static int forward_embed(struct fy_sched *r, struct forward *fw, struct fy_ticket *t_embed)
{
    uint64_t w_embed = 0, x_out = 0;
    FY_TRY(fy_ticket_wait(&r->tk, t_embed, NULL));
    FY_TRY(fy_sched_weights_of(r, 0, 0, &w_embed));
    /* the previous step's update of this unit, which may still be running */
    FY_TRY(fy_optq_settle(&r->opt, 0));
    FY_TRY(fy_spill_out(&r->block_inputs, 0, &x_out));
    FY_TRY(fy_sched_embed_forward(r, w_embed, x_out, &fw->g_embed));
    fy_spill_used_by(&r->block_inputs, 0, &fw->g_embed);
    fy_sched_wslot_used_by(r, 0, &fw->g_embed);
    return 0;
}

/* Block b's forward, x_{b-1} to x_b, once its weights are in (a deferred update made first);
 * training, x_{b-1} and block b-1's SSD-placed internals then go to the store. The weights of unit
 * b+depth are read into the slot block b-1 had, once that block has run. */
static int forward_block(struct fy_sched *r, struct forward *fw, unsigned b)
{
    const struct fy_plan_layout *l = &r->l;
    unsigned fin = l->c->n_layer + 1, slot = fy_sched_block_wslot(l, b);
    struct fy_ticket *g = fw->g;
    uint64_t w_off = 0, x_in = 0, x_out = 0;
    uint64_t s_off = 0; /* the slot of block b's internals on their way to the store */
    FY_TRY(fy_ticket_wait(&r->tk, &fw->rw[b], NULL));
    if (r->clip.deferred[b])
        FY_TRY(fy_sched_deferred_update(r, b, slot, fw->fws));
    FY_TRY(fy_sched_weights_of(r, b, slot, &w_off));
    FY_TRY(fy_optq_settle(&r->opt, b));
    FY_TRY(fy_spill_in(&r->block_inputs, b - 1, 0, &x_in)); /* the slot block b-1 just wrote */
    FY_TRY(fy_spill_out(&r->block_inputs, b, &x_out));
    int swaps = fw->train && r->swap.ssd_mask[b] != 0;
    if (swaps)
        FY_TRY(fy_spill_out(&r->swap.ring, b - 1, &s_off));
    FY_TRY(fy_sched_block_forward(r, b, w_off, x_in, x_out, fw->train, s_off, &g[b]));
    fy_sched_wslot_used_by(r, slot, &g[b]);
    fy_spill_used_by(&r->block_inputs, b - 1, &g[b]);
    fy_spill_used_by(&r->block_inputs, b, &g[b]);
    if (swaps)
        fy_spill_used_by(&r->swap.ring, b - 1, &g[b]);
    if (fw->train) /* x_{b-1} to the store once its block has written it */
        FY_TRY(fy_spill_write(&r->block_inputs, b - 1, b == 1 ? &fw->g_embed : &g[b - 1]));
    if (fw->train && b >= 2 && r->swap.ssd_mask[b - 1]) /* and block b-1's internals */
        FY_TRY(fy_spill_write(&r->swap.ring, b - 2, &g[b - 1]));
    /* unit b+depth goes into the slot block b-1 had: once that block has run */
    unsigned next = b + fw->depth;
    if (next <= fin && b >= 2)
        FY_TRY(fy_ticket_wait(&r->tk, &g[b - 1], NULL));
    if (next <= fin)
        FY_TRY(forward_read(r, fw, next, fy_sched_block_wslot(l, next), &fw->rw[next]));
    return 0;
}

/* The head once every block has run, on x_L, with the final unit's weights and the embeddings'
 * (slot 0 still holds them): the loss into *reply. */
static int forward_head(struct fy_sched *r, struct forward *fw, struct fy_desc *reply)
{
    const struct fy_plan_layout *l = &r->l;
    unsigned L = l->c->n_layer, fin = L + 1;
    uint64_t w_fin = 0, w_embed = 0, x_in = 0;
    struct fy_ticket head = {0};
    if (fw->train && L >= 1 && r->swap.ssd_mask[L])
        FY_TRY(fy_spill_write(&r->swap.ring, L - 1, &fw->g[L]));
    FY_TRY(fy_ticket_wait(&r->tk, &fw->rw[fin], NULL));
    for (unsigned b = 0; b <= L; b++)
        FY_TRY(fy_ticket_wait(&r->tk, b ? &fw->g[b] : &fw->g_embed, NULL));
    FY_TRY(fy_sched_weights_of(r, fin, fy_sched_block_wslot(l, fin), &w_fin));
    FY_TRY(fy_sched_weights_of(r, 0, 0, &w_embed));
    FY_TRY(fy_optq_settle(&r->opt, fin));
    FY_TRY(fy_spill_in(&r->block_inputs, L, 0, &x_in));
    FY_TRY(fy_sched_head(r, x_in, w_fin, w_embed, fw->train, &head));
    return fy_ticket_wait(&r->tk, &head, reply);
}

int fy_sched_forward(struct fy_sched *r, int train, uint64_t step, double *loss)
{
    const struct fy_plan_layout *l = &r->l;
    unsigned L = l->c->n_layer, fin = L + 1;
    struct fy_desc reply = {0};
    struct fy_ticket t_embed = {0};
    struct forward fw = {.train = train,
                         .depth = l->wslots - 1,
                         .rw = calloc(L + 2, sizeof *fw.rw),
                         .g = calloc(L + 2, sizeof *fw.g)};
    int rc = -ENOMEM;
    if (fw.rw == NULL || fw.g == NULL)
        goto out;
    if (train)
        FY_TRY_OUT(rc, check_versions(r, step));
    /* slot 0 keeps the embeddings until the tied head has used them; the blocks and then the
     * final unit take the other slots in turn */
    FY_TRY_OUT(rc, forward_read(r, &fw, 0, 0, &t_embed));
    for (unsigned u = 1; u <= fin && u <= fw.depth; u++)
        FY_TRY_OUT(rc, forward_read(r, &fw, u, fy_sched_block_wslot(l, u), &fw.rw[u]));
    FY_TRY_OUT(rc, forward_embed(r, &fw, &t_embed));
    for (unsigned b = 1; b <= L; b++)
        FY_TRY_OUT(rc, forward_block(r, &fw, b));
    FY_TRY_OUT(rc, forward_head(r, &fw, &reply));
out:
    for (int i = 0; i < 2; i++) { /* the deferred updates' write-backs */
        int w = fy_ticket_wait(&r->tk, &fw.fws[i], NULL);
        rc = rc ? rc : w;
    }
    /* the gpu requests were all waited for before the head; the backward converts in the order it
     * needs the weights, holding no update back */
    fy_spill_forget_users(&r->block_inputs);
    fy_spill_forget_users(&r->swap.ring);
    fy_sched_wslot_forget_users(r);
    fy_optq_hold_from(&r->opt, fy_model_unit_count(l->c));
    free(fw.rw);
    free(fw.g);
    FY_TRY(rc);
    memcpy(loss, &reply.arg, sizeof *loss);
    FY_REQUIRE(isfinite(*loss), -EDOM, "step %llu: the loss is %g: lower the learning rate",
               (unsigned long long)step, *loss);
    return 0;
}

int fy_sched_eval_loss(struct fy_sched *r, struct fy_sampler *data, uint64_t batches, double *loss)
{
    double sum = 0, weighted = 0;
    uint64_t trained_total = 0;
    int uniform = 1;
    for (uint64_t k = 0; k < batches; k++) {
        double one;
        struct fy_sampler_fill f;
        FY_TRY(fy_sched_load_batch(r, data, FY_TOKFILE_EVAL, k, &f));
        uint64_t n = f.targets;
        FY_TRY(fy_sched_forward(r, 0, 0, &one));
        sum += one;
        weighted += one * (double)n;
        trained_total += n;
        uniform &= n == (uint64_t)r->l.B * (uint64_t)r->l.T;
    }
    if (uniform)
        *loss = sum / (double)batches;
    else
        *loss = trained_total > 0 ? weighted / (double)trained_total : 0.0;
    return 0;
}
