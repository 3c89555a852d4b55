/* Clipping in a step's schedule: launcher/step/sched_clip.h. */
#include "launcher/step/sched_clip.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"
#include "launcher/step/sched_gpu.h"
#include "launcher/step/sched_state.h"
#include "launcher/step/sched_update.h"
#include "launcher/step/sched_weights.h"

int fy_sched_held_on_gpu(const struct fy_sched *r, unsigned u)
{
    return r->clip.hold_gpu && u >= 1 && u <= r->l.c->n_layer;
}

/* Where block b's gradient goes in a norm pass: its own place in the gradhold region (one-pass
 * clipping in the pool: kept for its update), else grads slots 1 and 2 in turn (with the
 * gradients held in the gpu worker, also where each comes back for its update:
 * fy_sched_grad_send). */
static uint64_t norm_grad(const struct fy_sched *r, unsigned b)
{
    return r->clip.one_pass && !r->clip.hold_gpu ? r->l.hold + (uint64_t)(b - 1) * r->l.bslot_bytes
                                                 : fy_sched_gslot(&r->l, 1 + (b & 1));
}

uint64_t fy_sched_clipped_grad(const struct fy_sched *r, unsigned u)
{
    unsigned fin = r->l.c->n_layer + 1;
    return u == 0 ? fy_sched_gslot(&r->l, 0) : u == fin ? r->dfinal : norm_grad(r, u);
}

/* ---- one-pass clipping's deferred updates, in the next forward ---------------------------- */

int fy_sched_deferred_read(struct fy_sched *r, unsigned u, unsigned slot, struct fy_ticket *t,
                           struct fy_ticket *g, struct fy_ticket *fws)
{
    unsigned s = u & 1;
    int last = r->state_unit[s];
    if (last >= 1 && (unsigned)last <= r->l.c->n_layer)
        FY_TRY(fy_ticket_wait(&r->tk, &g[last], NULL));
    FY_TRY(fy_ticket_wait(&r->tk, &fws[s], NULL));
    FY_TRY(fy_sched_state_read(r, u, s, t));
    /* grads slot 1 + s: its last block's update (fy_sched_deferred_update) was waited for */
    if (fy_sched_held_on_gpu(r, u))
        FY_TRY(fy_sched_grad_send(r, u, fy_sched_gslot(&r->l, 1 + s), &r->clip.gsend[s]));
    if (fy_sched_converts(r, u)) /* converted once updated (fy_sched_deferred_update) */
        return fy_sched_wslot_claim(r, slot, u);
    r->wslot_unit[slot] = (int)u;
    r->wslot_off[slot] = fy_sched_master(r->l.c, u, r->state_off[s]);
    return 0;
}

int fy_sched_deferred_update(struct fy_sched *r, unsigned b, unsigned slot, struct fy_ticket *fws)
{
    unsigned s = b & 1;
    uint64_t grad = fy_sched_clipped_grad(r, b);
    if (fy_sched_held_on_gpu(r, b)) { /* sent by fy_sched_deferred_read */
        FY_TRY(fy_ticket_wait(&r->tk, &r->clip.gsend[s], NULL));
        grad = fy_sched_gslot(&r->l, 1 + s);
    }
    FY_TRY(fy_sched_enqueue_scaled(r, b, s, grad, r->clip.deferred_step, r->clip.deferred_lr,
                                   r->clip.deferred_scale));
    FY_TRY(fy_optq_settle(&r->opt, b));
    if (fy_sched_converts(r, b)) {
        struct fy_ticket t = {0};
        FY_TRY(fy_sched_convert_into(r, b, r->state_off[s], slot, &t));
        FY_TRY(fy_ticket_wait(&r->tk, &t, NULL));
    }
    FY_TRY(fy_sched_state_write(r, b, s, &fws[s]));
    r->clip.deferred[b] = 0;
    return 0;
}

/* ---- the norm --------------------------------------------------------------------------- */

/* Unit u's gradient sum of squares on the opt worker (its gradient at pool offset grad). */
static int sumsq_issue(struct fy_sched *r, unsigned u, uint64_t grad, struct fy_ticket *t)
{
    struct fy_desc d = fy_desc_region(FY_OP_OPT_SUMSQ, FY_KIND_GRAD, FY_DTYPE_F32, grad,
                                      fy_sched_grad_bytes(&r->l, u), (int)u);
    return fy_ticket_issue(&r->tk, FY_TICKET_OPT, &d, 1, t);
}

/* Waits for a sum-of-squares request, its result into *out (nothing when none is in flight). */
static int sumsq_wait(struct fy_sched *r, struct fy_ticket *t, double *out)
{
    if (t->id == 0)
        return 0;
    struct fy_desc reply;
    FY_TRY(fy_ticket_wait(&r->tk, t, &reply));
    memcpy(out, &reply.arg, sizeof *out);
    return 0;
}

/* A backward pass that sums the gradients' squares, after the forward (whose head request ran the
 * head's backward), no update: pass 1 of a clipped step, or one-pass clipping's only backward
 * (clip.one_pass), which keeps every block's gradient (norm_grad). Pass 1 leaves what pass 2
 * needs where pass 2 finds it: dx_L in dacts[0] (the blocks' dx alternate between dacts[1] and
 * acts[L], the head's input, which nothing reads any more this step). Either leaves the final
 * unit's gradient after the grads slots, and the complete embedding gradient (the lookup's share
 * added to the head's) in grads slot 0. Overlapped like the backward: while the gpu computes block
 * b, the opt worker sums block b+1's squares; the weights slots are taken in turn, and a reused
 * grads slot waits for its previous user. *total = the units' sums added in unit order, whatever
 * the schedule. */
static int norm_pass(struct fy_sched *r, double *total)
{
    const struct fy_plan_layout *l = &r->l;
    unsigned L = l->c->n_layer, fin = L + 1;
    struct fy_ticket *rw = calloc(L + 3, sizeof *rw), *g = calloc(L + 3, sizeof *g);
    struct fy_ticket *sq = calloc(L + 3, sizeof *sq);
    double *part = calloc(L + 3, sizeof *part);
    int all = rw && g && sq && part, rc = -ENOMEM;
    if (!all)
        goto out;
    /* x_L's room is free after the head; with the checkpoints in slots, a third dacts buffer;
     * one pass needs no dx_L afterwards */
    const uint64_t scratch[2] = {fy_sched_dact(l, 1), r->clip.one_pass     ? fy_sched_dact(l, 0)
                                                      : r->block_inputs.on ? fy_sched_dact(l, 2)
                                                                           : fy_sched_act(l, L)};
    uint64_t dy = fy_sched_dact(l, 0); /* dL/d(output of the block being processed) */
    unsigned depth = l->wslots - 1;
    FY_TRY_OUT(rc, sumsq_issue(r, fin, r->dfinal, &sq[fin]));
    for (unsigned u = L; u >= 1 && u + depth > L; u--) /* the first blocks' weights */
        FY_TRY_OUT(rc, fy_sched_read_weights(r, u, fy_sched_block_wslot(l, u), &rw[u]));
    for (unsigned b = L; b >= 1; b--) {
        uint64_t dx = scratch[(L - b) & 1], w_off = 0;
        FY_TRY_OUT(rc, fy_ticket_wait(&r->tk, &rw[b], NULL));
        FY_TRY_OUT(rc, fy_sched_weights_of(r, b, fy_sched_block_wslot(l, b), &w_off));
        if (b + 2 <= L && (!r->clip.one_pass || r->clip.hold_gpu))
            FY_TRY_OUT(rc, sumsq_wait(r, &sq[b + 2], &part[b + 2])); /* its gradient slot */
        FY_TRY_OUT(rc, fy_sched_block_backward(r, b, w_off, dy, dx, norm_grad(r, b),
                                               r->clip.hold_gpu, &g[b]));
        fy_sched_wslot_used_by(r, fy_sched_block_wslot(l, b), &g[b]);
        dy = dx;
        /* block b+1's gradient is complete: its squares, and its weights slot is free for block
         * b-depth */
        if (b + 1 <= L) {
            FY_TRY_OUT(rc, fy_ticket_wait(&r->tk, &g[b + 1], NULL));
            FY_TRY_OUT(rc, sumsq_issue(r, b + 1, norm_grad(r, b + 1), &sq[b + 1]));
        }
        if (b > depth)
            FY_TRY_OUT(rc, fy_sched_read_weights(r, b - depth, fy_sched_block_wslot(l, b - depth),
                                                 &rw[b - depth]));
    }
    if (L >= 1) {
        FY_TRY_OUT(rc, fy_ticket_wait(&r->tk, &g[1], NULL));
        FY_TRY_OUT(rc, sumsq_issue(r, 1, norm_grad(r, 1), &sq[1]));
    }
    FY_TRY_OUT(rc, fy_sched_embed_backward(r, dy));
    FY_TRY_OUT(rc, sumsq_issue(r, 0, fy_sched_gslot(l, 0), &sq[0]));
out:
    for (unsigned u = 0; all && u <= L + 2; u++) { /* nothing stays in flight */
        int w = sumsq_wait(r, &sq[u], &part[u]);
        w = w ? w : fy_ticket_wait(&r->tk, &g[u], NULL);
        w = w ? w : fy_ticket_wait(&r->tk, &rw[u], NULL);
        rc = rc ? rc : w;
    }
    fy_spill_forget_users(&r->block_inputs);
    fy_spill_forget_users(&r->swap.ring);
    fy_sched_wslot_forget_users(r);
    double sum = 0.0;
    for (unsigned u = 0; all && u <= fin; u++)
        sum += part[u];
    *total = sum;
    free(rw);
    free(g);
    free(sq);
    free(part);
    return rc;
}

/* The norm from the units' sums of squares, as torch.nn.utils.clip_grad_norm_ computes it:
 * norm = sqrt(sum of every gradient element squared), in double; the scale, max / (norm + 1e-6),
 * applied (as a float, by the opt worker) only when below 1 (clip.scale). */
static int clip_scale_of(struct fy_sched *r, uint64_t step, double max_norm, double sumsq,
                         double *norm)
{
    *norm = sqrt(sumsq);
    FY_REQUIRE(isfinite(*norm), -EDOM,
               "step %llu: the gradient norm is %g: lower the learning rate",
               (unsigned long long)step, *norm);
    double scale = max_norm / (*norm + 1e-6);
    r->clip.scale = scale < 1.0 ? scale : 0.0;
    return 0;
}

int fy_sched_clip_scale(struct fy_sched *r, uint64_t step, double max_norm, double *norm)
{
    double sumsq;
    FY_TRY(norm_pass(r, &sumsq));
    return clip_scale_of(r, step, max_norm, sumsq, norm);
}

/* ---- one-pass clipping's updates -------------------------------------------------------- */

/* The first unit from u on to update in update_streamed's turn (past the final unit: none): one
 * whose state streams and whose update is not deferred, or with `deferred`, one whose update is. */
static unsigned next_to_update(const struct fy_sched *r, unsigned u, int deferred)
{
    unsigned fin = r->l.c->n_layer + 1;
    while (u <= fin &&
           (deferred ? !r->clip.deferred[u] : fy_sched_kept(r, u) || r->clip.deferred[u]))
        u++;
    return u;
}

/* update_streamed with the state in pieces: each unit's update piece by piece in turn (its
 * gradient held in the gpu worker sent to grads slot 1 first). */
static int update_streamed_pieces(struct fy_sched *r, int deferred, uint64_t step, double lr,
                                  double scale)
{
    unsigned fin = r->l.c->n_layer + 1;
    for (unsigned u = next_to_update(r, 0, deferred); u <= fin;
         u = next_to_update(r, u + 1, deferred)) {
        uint64_t grad = fy_sched_clipped_grad(r, u);
        if (fy_sched_held_on_gpu(r, u)) {
            struct fy_ticket sent = {0};
            grad = fy_sched_gslot(&r->l, 1);
            FY_TRY(fy_sched_grad_send(r, u, grad, &sent));
            FY_TRY(fy_ticket_wait(&r->tk, &sent, NULL));
        }
        FY_TRY(fy_sched_update_in_pieces(r, u, grad, step, lr, scale));
        r->clip.deferred[u] = 0;
    }
    return 0;
}

/* Streamed units' updates (next_to_update's, in unit order) with the given step, rate and scale:
 * each one's state read, updated and written back, the next one's read while one is updated
 * (state slots 0 and 1 in turn, a slot's read waiting for the write-back from it). */
static int update_streamed(struct fy_sched *r, int deferred, uint64_t step, double lr, double scale)
{
    if (r->l.state_pieces)
        return update_streamed_pieces(r, deferred, step, lr, scale);
    unsigned fin = r->l.c->n_layer + 1, slot = 0;
    struct fy_ticket rs[2] = {{0}}, ws[2] = {{0}}, gs[2] = {{0}};
    int rc = 0;
    unsigned u = next_to_update(r, 0, deferred);
    if (u <= fin) {
        FY_TRY_OUT(rc, fy_sched_state_read(r, u, 0, &rs[0]));
        if (fy_sched_held_on_gpu(r, u)) /* its gradient into grads slot 1 */
            FY_TRY_OUT(rc, fy_sched_grad_send(r, u, fy_sched_gslot(&r->l, 1), &gs[0]));
    }
    while (u <= fin) {
        unsigned next = next_to_update(r, u + 1, deferred), other = slot ^ 1;
        if (next <= fin) {
            FY_TRY_OUT(rc, fy_ticket_wait(&r->tk, &ws[other], NULL));
            FY_TRY_OUT(rc, fy_sched_state_read(r, next, other, &rs[other]));
            /* grads slot 1 + other: its last unit's update was waited for */
            if (fy_sched_held_on_gpu(r, next))
                FY_TRY_OUT(
                    rc, fy_sched_grad_send(r, next, fy_sched_gslot(&r->l, 1 + other), &gs[other]));
        }
        FY_TRY_OUT(rc, fy_ticket_wait(&r->tk, &rs[slot], NULL));
        uint64_t grad = fy_sched_clipped_grad(r, u);
        if (fy_sched_held_on_gpu(r, u)) {
            FY_TRY_OUT(rc, fy_ticket_wait(&r->tk, &gs[slot], NULL));
            grad = fy_sched_gslot(&r->l, 1 + slot);
        }
        FY_TRY_OUT(rc, fy_sched_enqueue_scaled(r, u, slot, grad, step, lr, scale));
        FY_TRY_OUT(rc, fy_optq_settle(&r->opt, u));
        FY_TRY_OUT(rc, fy_sched_state_write(r, u, slot, &ws[slot]));
        r->clip.deferred[u] = 0;
        u = next;
        slot = other;
    }
out:
    for (int i = 0; i < 2; i++) { /* nothing stays in flight */
        int w = fy_ticket_wait(&r->tk, &ws[i], NULL);
        w = w ? w : fy_ticket_wait(&r->tk, &rs[i], NULL);
        w = w ? w : fy_ticket_wait(&r->tk, &gs[i], NULL);
        rc = rc ? rc : w;
    }
    return rc;
}

/* The kept units' updates of a one-pass clipped step, queued in the forward's order, which waits
 * for each one's own. With the gradients in the gpu worker, each kept block's comes to grads slot 1
 * or 2 in turn once the slot's last update is done, and all are done before the forward, whose
 * deferred updates take the same slots. */
static int update_kept(struct fy_sched *r, uint64_t step, double lr)
{
    unsigned fin = r->l.c->n_layer + 1;
    int prev[2] = {-1, -1}, turn = 0;
    for (unsigned u = 0; u <= fin; u++) {
        r->version[u] = step;
        if (!fy_sched_kept(r, u))
            continue;
        uint64_t grad = fy_sched_clipped_grad(r, u);
        if (fy_sched_held_on_gpu(r, u)) {
            struct fy_ticket sent = {0};
            if (prev[turn] >= 0)
                FY_TRY(fy_optq_settle(&r->opt, (unsigned)prev[turn]));
            grad = fy_sched_gslot(&r->l, 1 + turn);
            FY_TRY(fy_sched_grad_send(r, u, grad, &sent));
            FY_TRY(fy_ticket_wait(&r->tk, &sent, NULL));
            prev[turn] = (int)u;
            turn ^= 1;
        }
        struct fy_ticket none = {0};
        FY_TRY(fy_sched_state_read(r, u, 0, &none));
        FY_TRY(fy_sched_enqueue(r, u, 0, grad, step, lr));
        FY_TRY(fy_optq_pump(&r->opt));
    }
    return 0;
}

int fy_sched_clipped_backward(struct fy_sched *r, uint64_t step, double lr, double max_norm,
                              double *norm)
{
    const struct fy_plan_layout *l = &r->l;
    unsigned L = l->c->n_layer;
    FY_REQUIRE(r->clip.one_pass, -EPROTO,
               "schedule error: one-pass clipping without a gradhold region or held gradients");
    double sumsq;
    FY_TRY(norm_pass(r, &sumsq));
    FY_TRY(clip_scale_of(r, step, max_norm, sumsq, norm));
    /* A streamed block's update waits for the next forward (fy_sched_deferred_read), which reads
     * its state anyway, where the forward reads at most two units ahead (the two state slots); the
     * other streamed units are updated now, the next forward reading them from the store; then
     * the kept units' updates are queued. */
    int defer = l->wslots - 1 <= 2 && !l->state_pieces;
    for (unsigned b = 1; defer && b <= L; b++)
        r->clip.deferred[b] = !fy_sched_kept(r, b);
    r->clip.deferred_step = step;
    r->clip.deferred_lr = lr;
    r->clip.deferred_scale = r->clip.scale;
    FY_TRY(update_streamed(r, 0, step, lr, r->clip.scale));
    FY_TRY(update_kept(r, step, lr));
    return r->clip.hold_gpu ? fy_optq_drain(&r->opt) : fy_sched_send_for_forward(r);
}

int fy_sched_finish_updates(struct fy_sched *r)
{
    FY_TRY(
        update_streamed(r, 1, r->clip.deferred_step, r->clip.deferred_lr, r->clip.deferred_scale));
    return fy_optq_drain(&r->opt);
}
