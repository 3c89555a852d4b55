/* The backward of a step's schedule: launcher/step/sched_backward.h. */
#include "launcher/step/sched_backward.h"

#include <errno.h>
#include <stdlib.h>

#include "common/base/check.h"
#include "launcher/step/sched_embed.h"
#include "launcher/step/sched_gpu.h"
#include "launcher/step/sched_state.h"
#include "launcher/step/sched_update.h"
#include "launcher/step/sched_weights.h"

/* The backward's bookkeeping of write-backs: which blocks' have been issued, and per state slot
 * the block whose write-back from it was issued last (-1: none), which a read into the slot must
 * wait for. */
struct writebacks {
    struct fy_ticket *ws;
    unsigned char *issued;
    int slot_writer[2];
};

/* Block u's updated state back to the store once its AdamW is done (nothing to write for a
 * resident block: it is written at checkpoints). */
static int write_back(struct fy_sched *r, struct writebacks *wb, unsigned u)
{
    if (wb->issued[u])
        return 0;
    wb->issued[u] = 1;
    if (fy_sched_kept(r, u))
        return 0;
    FY_TRY(fy_optq_settle(&r->opt, u));
    FY_TRY(fy_sched_state_write(r, u, u & 1, &wb->ws[u]));
    wb->slot_writer[u & 1] = (int)u;
    return 0;
}

/* Block b's weights for its backward, its state at pool offset `state`: with bf16 weights its
 * copy, or its f32 master where it lies (one piece, f32 weights), or the master converted into the
 * block's weights slot (*cv: a conversion issued ahead, or none yet), waited for; *w_off where the
 * gpu request finds them. */
static int backward_weights(struct fy_sched *r, unsigned b, uint64_t state, struct fy_ticket *cv,
                            uint64_t *w_off)
{
    if (fy_sched_bf16(r) && fy_sched_has_copy(r, b)) {
        *w_off = r->wcopy[b];
        return 0;
    }
    if (!fy_sched_converts(r, b)) {
        *w_off = fy_sched_master(r->l.c, b, state);
        return 0;
    }
    unsigned slot = fy_sched_block_wslot(&r->l, b);
    if (cv->id == 0)
        FY_TRY(fy_sched_convert_into(r, b, state, slot, cv));
    FY_TRY(fy_ticket_wait(&r->tk, cv, NULL));
    return fy_sched_weights_of(r, b, slot, w_off);
}

/* What backward_blocks' loop shares: per block its backward (g), its state read (rs), its weights'
 * conversion (cv) and its gradient slot (slot_of); the write-backs; the embedding backward (e). */
struct backward {
    struct fy_ticket *g, *rs, *cv, e;
    unsigned *slot_of;
    struct writebacks wb;
};

/* Block b's state read into the state slot that block b+2 leaves, once its write-back from there
 * is done. */
static int read_into_left_slot(struct fy_sched *r, struct backward *bk, unsigned b)
{
    FY_TRY(write_back(r, &bk->wb, b + 2));
    if (bk->wb.slot_writer[b & 1] >= 0)
        FY_TRY(fy_ticket_wait(&r->tk, &bk->wb.ws[bk->wb.slot_writer[b & 1]], NULL));
    return fy_sched_state_read(r, b, b & 1, &bk->rs[b]);
}

/* Block b's backward: its state (with its weights) in its state slot or kept, its weights where
 * the gpu reads them, a free gradient slot; then a kept block below without a copy converted while
 * this one computes, and after block 1 (with `embed`) the embedding backward. */
static int block_issue(struct fy_sched *r, struct backward *bk, unsigned b, unsigned *cur,
                       int embed)
{
    const struct fy_plan_layout *l = &r->l;
    uint64_t w_off = 0, st = fy_sched_kept(r, b) ? r->resident[b] : 0;
    if (!fy_sched_kept(r, b)) {
        FY_TRY(fy_ticket_wait(&r->tk, &bk->rs[b], NULL));
        FY_REQUIRE(r->state_unit[b & 1] == (int)b, -EPROTO,
                   "schedule error: block %u's weights expected in state slot %u, which holds unit "
                   "%d's state",
                   b, b & 1, r->state_unit[b & 1]);
        st = r->state_off[b & 1];
    }
    FY_TRY(backward_weights(r, b, st, &bk->cv[b], &w_off));
    FY_TRY(fy_optq_take_gslot(&r->opt, b, &bk->slot_of[b]));
    FY_TRY(fy_sched_block_backward(r, b, w_off, fy_sched_dact(l, *cur), fy_sched_dact(l, *cur ^ 1),
                                   fy_sched_gslot(l, bk->slot_of[b]), 0, &bk->g[b]));
    if (fy_sched_converts(r, b))
        fy_sched_wslot_used_by(r, fy_sched_block_wslot(l, b), &bk->g[b]);
    /* a kept block below without a copy: its weights converted while this one computes */
    if (b >= 2 && fy_sched_converts(r, b - 1) && fy_sched_kept(r, b - 1))
        FY_TRY(fy_sched_convert_into(r, b - 1, r->resident[b - 1], fy_sched_block_wslot(l, b - 1),
                                     &bk->cv[b - 1]));
    *cur ^= 1;
    if (b == 1 && embed) {
        /* the early part reads the gradient this rewrites; dx0 is block 1's dx */
        FY_TRY(fy_ticket_wait(&r->tk, &r->embed.early, NULL));
        FY_TRY(fy_sched_embed_backward_issue(r, fy_sched_dact(l, *cur), &bk->e));
    }
    return 0;
}

/* Block u's update queued once its backward and its state's read are done. */
static int queue_update(struct fy_sched *r, struct backward *bk, unsigned u, uint64_t step,
                        double lr)
{
    FY_TRY(fy_ticket_wait(&r->tk, &bk->g[u], NULL));
    FY_TRY(fy_ticket_wait(&r->tk, &bk->rs[u], NULL));
    FY_TRY(fy_sched_enqueue(r, u, u & 1, fy_sched_gslot(&r->l, bk->slot_of[u]), step, lr));
    r->opt.gslot_queued[bk->slot_of[u]] = 1;
    FY_TRY(fy_optq_pump(&r->opt));
    r->version[u] = step;
    return 0;
}

/* Backward through the blocks with each block's update overlapped with the backward of the blocks
 * below. A streamed block's weights come with its state: its master, m and v are read into a state
 * slot before its backward, which takes the master from there, and AdamW updates them in place
 * after it, so the master crosses from the SSD once in backward, not twice; the read goes into
 * the slot that block b+2 leaves once written back (state slots 0 and 1 alternate). A resident
 * block's weights and state are where they stay. Block b's backward is issued once a gradient
 * slot is free (fy_optq_take_gslot: at least three, so the gpu can run two blocks ahead of the
 * optimizer, and with more the optimizer can fall behind and finish in the next forward); block
 * b+1's AdamW is queued, not waited for, once its gradient is in. Every reuse of a slot waits for
 * its previous user. With bf16 weights, a block without a copy has its master converted into its
 * weights slot before its backward: a streamed block's once its state is read, a kept one's while
 * the gpu computes the block above (the weights slots taken in turn, as in the forward). With
 * `embed`, the embedding backward follows block 1's on the gpu while the last blocks are
 * updated. */
static int backward_blocks(struct fy_sched *r, uint64_t step, double lr, unsigned *cur, int embed)
{
    const struct fy_plan_layout *l = &r->l;
    unsigned L = l->c->n_layer;
    struct backward bk = {.g = calloc(L + 4, sizeof *bk.g),
                          .rs = calloc(L + 4, sizeof *bk.rs),
                          .cv = calloc(L + 4, sizeof *bk.cv),
                          .slot_of = calloc(L + 4, sizeof *bk.slot_of),
                          .wb = {calloc(L + 4, sizeof *bk.wb.ws), calloc(L + 4, 1), {-1, -1}}};
    int all = bk.g && bk.rs && bk.cv && bk.slot_of && bk.wb.ws && bk.wb.issued, rc = -ENOMEM;
    fy_optq_release_gslots(&r->opt); /* the last step's updates were all waited for */
    if (!all)
        goto out;
    if (embed && L == 0) { /* it reads the gradient this overwrites */
        FY_TRY_OUT(rc, fy_ticket_wait(&r->tk, &r->embed.early, NULL));
        FY_TRY_OUT(rc, fy_sched_embed_backward_issue(r, fy_sched_dact(l, *cur), &bk.e));
    }
    if (L >= 1) /* the two state slots start with blocks L and L-1 */
        FY_TRY_OUT(rc, fy_sched_state_read(r, L, L & 1, &bk.rs[L]));
    if (L >= 2)
        FY_TRY_OUT(rc, fy_sched_state_read(r, L - 1, (L - 1) & 1, &bk.rs[L - 1]));
    for (unsigned b = L;; b--) {
        int later_read = b >= 1 && b + 2 <= L; /* block b's state is not read yet */
        FY_TRY_OUT(rc, fy_optq_pump(&r->opt));
        if (later_read && !fy_sched_kept(r, b)) /* into the slot block b+2 leaves */
            FY_TRY_OUT(rc, read_into_left_slot(r, &bk, b));
        if (b >= 1)
            FY_TRY_OUT(rc, block_issue(r, &bk, b, cur, embed));
        if (b + 1 <= L) /* block b+1's update, while the gpu runs block b */
            FY_TRY_OUT(rc, queue_update(r, &bk, b + 1, step, lr));
        if (b + 2 <= L) /* block b+2's write-back (issued above if block b needed it) */
            FY_TRY_OUT(rc, write_back(r, &bk.wb, b + 2));
        if (later_read && fy_sched_kept(r, b)) /* in place: only the bookkeeping */
            FY_TRY_OUT(rc, fy_sched_state_read(r, b, b & 1, &bk.rs[b]));
        if (b == 0)
            break;
    }
    if (L >= 1) /* block 1's write-back */
        FY_TRY_OUT(rc, write_back(r, &bk.wb, 1));
out:;
    int we = fy_ticket_wait(&r->tk, &bk.e, NULL);
    rc = rc ? rc : we;
    /* nothing stays in flight but resident blocks' updates, which the next forward waits for */
    for (unsigned u = 0; all && u <= L + 3; u++) {
        int w = fy_ticket_wait(&r->tk, &bk.wb.ws[u], NULL);
        w = w ? w : fy_ticket_wait(&r->tk, &bk.g[u], NULL);
        w = w ? w : fy_ticket_wait(&r->tk, &bk.rs[u], NULL);
        w = w ? w : fy_ticket_wait(&r->tk, &bk.cv[u], NULL);
        rc = rc ? rc : w;
    }
    fy_spill_forget_users(&r->block_inputs);
    fy_spill_forget_users(&r->swap.ring);
    fy_sched_wslot_forget_users(r);
    free(bk.g);
    free(bk.rs);
    free(bk.wb.ws);
    free(bk.cv);
    free(bk.wb.issued);
    free(bk.slot_of);
    return rc;
}

/* Block u's update once its backward (g[u]) is done, its gradient in grads slot slot_of[u]: a kept
 * block's queued as backward_blocks queues it, a streamed block's state read, updated and written
 * back piece by piece (fy_sched_update_in_pieces), its gradient slot free again after. */
static int update_block(struct fy_sched *r, unsigned u, struct fy_ticket *g,
                        const unsigned *slot_of, uint64_t step, double lr)
{
    FY_TRY(fy_ticket_wait(&r->tk, &g[u], NULL));
    uint64_t grad = fy_sched_gslot(&r->l, slot_of[u]);
    if (fy_sched_kept(r, u)) {
        struct fy_ticket none = {0};
        FY_TRY(fy_sched_state_read(r, u, u & 1, &none));
        FY_TRY(fy_sched_enqueue(r, u, u & 1, grad, step, lr));
        r->opt.gslot_queued[slot_of[u]] = 1;
        FY_TRY(fy_optq_pump(&r->opt));
    } else {
        FY_TRY(fy_sched_update_in_pieces(r, u, grad, step, lr, r->clip.scale));
        r->opt.gslot_holder[slot_of[u]] = 0; /* its update is done */
    }
    r->version[u] = step;
    return 0;
}

/* The backward with the state in pieces (l.state_pieces). Each block's weights are read ahead into
 * the weights slots in turn as in the norm pass (a streamed block's from its masters, as in the
 * forward); once block b's backward is issued, the weights of the block `depth` below are read
 * and block b+1's update runs (update_block) while the gpu computes block b. With one gradient
 * slot, block b+1's update comes before block b's backward, whose gradient takes its slot. With
 * `embed`, the embedding backward follows block 1's on the gpu. */
static int backward_pieces(struct fy_sched *r, uint64_t step, double lr, unsigned *cur, int embed)
{
    const struct fy_plan_layout *l = &r->l;
    unsigned L = l->c->n_layer, depth = l->wslots - 1;
    struct fy_ticket *g = calloc(L + 2, sizeof *g), *rw = calloc(L + 2, sizeof *rw), e = {0};
    unsigned *slot_of = calloc(L + 2, sizeof *slot_of);
    int rc = -ENOMEM;
    fy_optq_release_gslots(&r->opt); /* the last step's updates were all waited for */
    if (!g || !rw || !slot_of)
        goto out;
    if (embed && L == 0) { /* it reads the gradient this overwrites */
        FY_TRY_OUT(rc, fy_ticket_wait(&r->tk, &r->embed.early, NULL));
        FY_TRY_OUT(rc, fy_sched_embed_backward_issue(r, fy_sched_dact(l, *cur), &e));
    }
    rc = 0;
    for (unsigned u = L; u >= 1 && u + depth > L; u--) /* the first blocks' weights */
        FY_TRY_OUT(rc, fy_sched_read_weights(r, u, fy_sched_block_wslot(l, u), &rw[u]));
    for (unsigned b = L; b >= 1; b--) {
        if (l->gslots == 1 && b + 1 <= L) /* its gradient slot is block b's */
            FY_TRY_OUT(rc, update_block(r, b + 1, g, slot_of, step, lr));
        FY_TRY_OUT(rc, fy_optq_pump(&r->opt));
        uint64_t w_off = 0;
        FY_TRY_OUT(rc, fy_ticket_wait(&r->tk, &rw[b], NULL));
        FY_TRY_OUT(rc, fy_sched_weights_of(r, b, fy_sched_block_wslot(l, b), &w_off));
        FY_TRY_OUT(rc, fy_optq_take_gslot(&r->opt, b, &slot_of[b]));
        FY_TRY_OUT(rc, fy_sched_block_backward(r, b, w_off, fy_sched_dact(l, *cur),
                                               fy_sched_dact(l, *cur ^ 1),
                                               fy_sched_gslot(l, slot_of[b]), 0, &g[b]));
        fy_sched_wslot_used_by(r, fy_sched_block_wslot(l, b), &g[b]);
        *cur ^= 1;
        if (b == 1 && embed) {
            /* the early part reads the gradient this rewrites; dx0 is block 1's dx */
            FY_TRY_OUT(rc, fy_ticket_wait(&r->tk, &r->embed.early, NULL));
            FY_TRY_OUT(rc, fy_sched_embed_backward_issue(r, fy_sched_dact(l, *cur), &e));
        }
        if (b > depth) /* into the slot block b+1 leaves */
            FY_TRY_OUT(rc, fy_sched_read_weights(r, b - depth, fy_sched_block_wslot(l, b - depth),
                                                 &rw[b - depth]));
        if (l->gslots > 1 && b + 1 <= L) /* while the gpu runs block b */
            FY_TRY_OUT(rc, update_block(r, b + 1, g, slot_of, step, lr));
    }
    if (L >= 1)
        FY_TRY_OUT(rc, update_block(r, 1, g, slot_of, step, lr));
out:;
    int we = fy_ticket_wait(&r->tk, &e, NULL);
    rc = rc ? rc : we;
    /* nothing stays in flight but kept blocks' updates, which the next forward waits for */
    for (unsigned u = 0; g != NULL && rw != NULL && u <= L + 1; u++) {
        int w = fy_ticket_wait(&r->tk, &g[u], NULL);
        w = w ? w : fy_ticket_wait(&r->tk, &rw[u], NULL);
        rc = rc ? rc : w;
    }
    fy_spill_forget_users(&r->block_inputs);
    fy_spill_forget_users(&r->swap.ring);
    fy_sched_wslot_forget_users(r);
    free(g);
    free(rw);
    free(slot_of);
    return rc;
}

int fy_sched_backward_and_update(struct fy_sched *r, uint64_t step, double lr)
{
    const struct fy_plan_layout *l = &r->l;
    unsigned L = l->c->n_layer, fin = L + 1;
    FY_TRY(fy_sched_update_unit(r, fin, r->dfinal, step, lr));
    r->version[fin] = step;
    int split = fy_sched_embed_split(r);
    uint64_t late = 0;
    if (split)
        FY_TRY(fy_sched_embed_update_early(r, step, lr, &late));
    unsigned cur = 0; /* dacts[cur] holds dL/d(output of the unit being processed) */
    /* with clipping, pass 1 has completed the embedding gradient already */
    int rc = r->l.state_pieces ? backward_pieces(r, step, lr, &cur, !r->clip.on)
                               : backward_blocks(r, step, lr, &cur, !r->clip.on);
    /* done before the embedding backward */
    int early = fy_ticket_wait(&r->tk, &r->embed.early, NULL);
    FY_TRY(rc ? rc : early);
    FY_TRY(fy_sched_embed_update(r, step, lr, split, late));
    r->version[0] = step;
    return fy_sched_send_for_forward(r);
}
