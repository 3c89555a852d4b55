/* The training schedule over an executor: store initialisation, layer-major training steps (serial
 * or overlapped, with global-norm clipping in two backward passes) with per-unit version checks,
 * evaluation, metrics lines and export. */
#include "train.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/check.h"
#include "common/dtype.h"
#include "common/fsutil.h"
#include "common/knobs.h"
#include "common/optstate.h"
#include "launcher/commit.h"
#include "launcher/metrics.h"
#include "launcher/optq.h"
#include "launcher/progress.h"
#include "launcher/spill.h"
#include "launcher/ticket.h"

struct run {
    struct fy_tickets tk; /* the requests and their tickets, the times waited and busy */
    struct fy_pool *pool;
    struct fy_plan_layout l;
    /* Which unit each weights and state slot was last filled for: every use checks it, so a
     * schedule that reads a slot filled for another unit fails loudly instead of computing with
     * the wrong numbers. */
    int wslot_unit[FY_PLAN_PREFETCH_MAX + 2], state_unit[2];
    uint64_t wslot_off[FY_PLAN_PREFETCH_MAX + 2], state_off[2]; /* where the slot's contents are (a resident unit's own) */
    uint64_t *resident;                  /* per unit: its state's offset in the pool, or 0 */
    uint64_t *wcopy; /* per unit: its bf16 weights copy's offset in the pool, or 0 */
    /* Checkpoints (the blocks' inputs x_0..x_L): item i is x_i, in the acts region; with
     * --ckpt-place ssd x_0..x_{L-1} go through its slots to the store. */
    struct fy_spill ckpt;
    /* The blocks' swapped internals (fy_train_opts.act_place), per block 1..L: the kinds that stay
     * in the pool (host_mask, at host_off in the saved region) and those that go through the
     * saved ring's slots to the store (ssd_mask; block b is item b - 1). */
    unsigned *host_mask, *ssd_mask;
    uint64_t *host_off;
    struct fy_spill saved;
    struct fy_actplan_sizes saved_sizes;
    unsigned act_ahead; /* blocks whose items on the store the backward reads ahead (--act-ahead) */
    /* Clipping: on (two backward passes; pass 1 also completes the embedding gradient), where the
     * head writes the final unit's gradient (grads slot 1; with clipping the room after the
     * block gradient slots, where it survives pass 1), and this step's gradient scale (0: none)
     * for every opt-adamw. */
    int clip;
    uint64_t dfinal;
    double grad_scale;
    struct fy_optq opt; /* the AdamW updates queued and sent, and the gradient slots */
    /* The embeddings' update in two parts (without clipping, state in the pool): the rows the
     * batch's tokens do not touch, sent once the head's gradient is home (embed_early), and the
     * rest once the embedding backward is done; row_touched is the scratch that sorts them. 0 in
     * embed_split: one update after the backward (the test hook FUYOU_TEST_EMBED_WHOLE). */
    int embed_split;
    struct fy_ticket embed_early;
    unsigned char *row_touched;
    /* The two copies of the units' state (common/ckpt.h): the committed one is read_copy; a
     * training run writes the other (work_copy) and keeps per unit the copy its latest state is
     * in and that state's digest. NULL arrays (init, export): every unit is read from
     * read_copy. */
    unsigned read_copy, work_copy;
    unsigned char *at_copy;
    uint64_t *digest;
};

static uint64_t align4k(uint64_t v) { return (v + 4095) / 4096 * 4096; }

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Where unit u's master weights lie in its state at pool offset `state`. */
static uint64_t master_at(const struct fy_gpt_config *c, unsigned u, uint64_t state)
{
    struct fy_optstate_layout lay;
    fy_optstate_layout(c, u, &lay);
    return state + lay.section[FY_OPTSTATE_MASTER].offset;
}


static uint64_t act_at(const struct fy_plan_layout *l, unsigned i)
{
    return l->acts + i * align4k(l->act_bytes);
}
static uint64_t dact_at(const struct fy_plan_layout *l, unsigned i)
{
    return l->dacts + i * align4k(l->act_bytes);
}
static uint64_t wslot(const struct fy_plan_layout *l, unsigned i)
{
    return l->weights + i * l->wslot_bytes;
}
/* Grads slot 0 (the embeddings' gradient, a unit slot), 1..gslots (block-sized), and gslots + 1
 * (after them: clipping's final-unit gradient). */
static uint64_t gslot(const struct fy_plan_layout *l, unsigned i)
{
    return i == 0 ? l->grads : l->grads + l->slot_bytes + (i - 1) * l->bslot_bytes;
}
/* A unit's f32 gradient. */
static uint64_t unit_bytes(const struct fy_plan_layout *l, unsigned u)
{
    return fy_gpt_unit_params(l->c, u) * 4;
}


/* A unit's whole state between the pool and its copy `copy` in the store, with its digest: a read
 * checked against *digest (unchecked where `check` is 0), a write's digest left in *digest once
 * the ticket is waited for. */
static int state_io(struct run *r, int op, unsigned u, unsigned copy, uint64_t pool_offset,
                    uint64_t *digest, int check, struct fy_ticket *t)
{
    uint64_t bytes = fy_optstate_bytes(r->l.c, u);
    uint32_t extent = FY_TENSOR_UNIT_STATE_COPY(u, copy);
    if (op == FY_OP_IO_READ && !check)
        return fy_ticket_io_issue(&r->tk, op, extent, pool_offset, bytes, t);
    struct fy_desc d[2];
    d[0] = fy_desc_region(op, FY_KIND_RAW, FY_DTYPE_NONE, pool_offset, bytes, (int)u);
    d[0].tensor = extent;
    d[1] = fy_desc_region(op, FY_KIND_CONTROL, FY_DTYPE_NONE, 0, 0, (int)u);
    d[1].arg = *digest;
    t->digest_into = op == FY_OP_IO_WRITE ? digest : NULL;
    return fy_ticket_issue(&r->tk, FY_TICKET_IO, d, 2, t);
}

/* The copy that holds unit u's latest state. */
static unsigned copy_of(const struct run *r, unsigned u)
{
    return r->at_copy != NULL ? r->at_copy[u] : r->read_copy;
}

/* The master weights of a unit into a weights slot: the master section alone of its state in the
 * store (the gpu worker is sent them, or where the unit is kept in the pool with a bf16 copy,
 * that copy: weights_region). */
static int read_weights(struct run *r, unsigned unit, unsigned slot, struct fy_ticket *t)
{
    r->wslot_unit[slot] = (int)unit;
    if (r->resident != NULL && r->resident[unit] != 0) {
        /* its master weights are already in the pool */
        r->wslot_off[slot] = master_at(r->l.c, unit, r->resident[unit]);
        return 0;
    }
    struct fy_optstate_layout lay;
    fy_optstate_layout(r->l.c, unit, &lay);
    const struct fy_optstate_section *master = &lay.section[FY_OPTSTATE_MASTER];
    r->wslot_off[slot] = wslot(&r->l, slot);
    struct fy_desc d = fy_desc_region(FY_OP_IO_READ, FY_KIND_RAW, FY_DTYPE_NONE,
                                      wslot(&r->l, slot), master->padded, -1);
    d.tensor = FY_TENSOR_UNIT_STATE_COPY(unit, copy_of(r, unit));
    d.arg = master->offset;
    return fy_ticket_issue(&r->tk, FY_TICKET_IO, &d, 1, t);
}

/* Weights slot of unit u (a block, or the final unit) in the forward and backward: slots 1 to
 * wslots in turn, so that the weights of the next wslots - 1 units can be read while one computes. */
static unsigned block_wslot(const struct fy_plan_layout *l, unsigned u) { return 1 + u % l->wslots; }

/* The weights slot holding unit u, checked (see wslot_unit). */
static int weights_of(struct run *r, unsigned u, unsigned slot, uint64_t *offset)
{
    FY_REQUIRE(r->wslot_unit[slot] == (int)u, -EPROTO,
               "schedule error: unit %u's weights expected in slot %u, which holds unit %d's", u,
               slot, r->wslot_unit[slot]);
    *offset = r->wslot_off[slot];
    return 0;
}

static int has_copy(const struct run *r, unsigned u)
{
    return r->wcopy != NULL && r->wcopy[u] != 0;
}

/* Unit u's weights as a gpu request's part: its bf16 copy where it has one and copy_ok (the
 * weights of one request share a dtype), else its master weights at pool offset `master`. */
static struct fy_desc weights_region(const struct run *r, int op, unsigned u, uint64_t master,
                                     int layer, int copy_ok)
{
    struct fy_optstate_layout lay;
    fy_optstate_layout(r->l.c, u, &lay);
    if (copy_ok && has_copy(r, u))
        return fy_desc_region(op, FY_KIND_WEIGHTS, FY_OPTSTATE_COPY_DTYPE, r->wcopy[u],
                              lay.params * fy_dtype_size(FY_OPTSTATE_COPY_DTYPE), layer);
    const struct fy_optstate_section *m = &lay.section[FY_OPTSTATE_MASTER];
    return fy_desc_region(op, FY_KIND_WEIGHTS, m->dtype, master, m->bytes, layer);
}

/* The checkpoints' placement for this run: the pool must have been laid out for it. */
static int ckpt_setup(struct run *r, int ssd)
{
    const struct fy_plan_layout *l = &r->l;
    unsigned L = l->c->n_layer;
    if (!ssd) {
        FY_REQUIRE(l->act_slots >= L + 1 && l->dact_slots >= 2, -EINVAL,
                   "shared pool: room for %u checkpoints and %u activation gradients, not the %u "
                   "and 2 this run keeps in the pool (laid out for --ckpt-place ssd?)",
                   l->act_slots, l->dact_slots, L + 1);
        fy_spill_in_pool(&r->ckpt, &r->tk, l->acts, align4k(l->act_bytes));
        return 0;
    }
    unsigned slots = fy_plan_spill_slots(r->act_ahead);
    FY_REQUIRE(l->act_slots >= slots && l->dact_slots >= 3, -EINVAL,
               "shared pool: room for %u checkpoints and %u activation gradients, not the %u and 3 "
               "of --ckpt-place ssd with --act-ahead %u", l->act_slots, l->dact_slots, slots,
               r->act_ahead);
    char what[64];
    snprintf(what, sizeof what, "checkpoints x_0..x_%u", L ? L - 1 : 0);
    return fy_spill_setup(&r->ckpt, &r->tk, l->acts, align4k(l->act_bytes), slots, L,
                          FY_TENSOR_CKPT_SPILL(0), what);
}

/* The blocks' swapped internals for this run (see struct run): masks per block, the pool-kept
 * regions one after another at the start of the "saved" region, the SSD slots after them. */
static int saved_setup(struct run *r, const struct fy_train_opts *o)
{
    unsigned L = r->l.c->n_layer;
    r->host_mask = calloc(L + 1, sizeof *r->host_mask);
    r->ssd_mask = calloc(L + 1, sizeof *r->ssd_mask);
    r->host_off = calloc(L + 1, sizeof *r->host_off);
    r->saved_sizes = o->saved_sizes;
    fy_spill_in_pool(&r->saved, &r->tk, 0, 0); /* none but those placed on the SSD below */
    FY_REQUIRE(r->host_mask && r->ssd_mask && r->host_off, -ENOMEM, "train: out of memory");
    struct fy_plan_swap swap;
    fy_plan_swap_of(o->act_place, L, &o->saved_sizes, r->act_ahead, &swap);
    if (fy_plan_swap_pool_bytes(&swap) == 0)
        return 0;
    uint64_t at, bytes;
    FY_TRY(fy_pool_region(r->pool, "saved", &at, &bytes));
    FY_REQUIRE(bytes >= fy_plan_swap_pool_bytes(&swap), -EINVAL,
               "shared pool: a saved region of %llu bytes, not the %llu this plan swaps (laid out "
               "by fy_plan_regions for another plan?)", (unsigned long long)bytes,
               (unsigned long long)fy_plan_swap_pool_bytes(&swap));
    for (unsigned b = 1; b <= L; b++) {
        r->host_mask[b] = fy_actplan_mask(o->act_place, (int)b - 1, FY_ACT_HOST);
        r->ssd_mask[b] = fy_actplan_mask(o->act_place, (int)b - 1, FY_ACT_SSD);
        struct fy_actplan_region reg;
        FY_TRY(fy_actplan_region_of(&o->saved_sizes, r->host_mask[b], &reg));
        r->host_off[b] = at;
        at += reg.bytes;
    }
    if (swap.ssd_bytes == 0)
        return 0;
    return fy_spill_setup(&r->saved, &r->tk, at, swap.slot_bytes, swap.slots, L,
                          FY_TENSOR_SAVED_SPILL(0), "the blocks' internals placed on the SSD");
}

/* Appends block b's saved parts to a request of n parts (the SSD one at ssd_off, which
 * fy_spill_out or fy_spill_in gave); returns the new count. */
static unsigned saved_parts(const struct run *r, unsigned b, int op, uint64_t ssd_off,
                            struct fy_desc *req, unsigned n)
{
    const unsigned mask[2] = {r->host_mask[b], r->ssd_mask[b]};
    const uint64_t off[2] = {r->host_off[b], ssd_off};
    for (int i = 0; i < 2; i++)
        if (mask[i] != 0) {
            struct fy_actplan_region reg;
            fy_actplan_region_of(&r->saved_sizes, mask[i], &reg);
            req[n] = fy_desc_region(op, FY_KIND_SAVED, FY_DTYPE_NONE, off[i], reg.bytes, (int)b);
            req[n++].arg = mask[i];
        }
    return n;
}

/* In a backward pass, after block b's request: the checkpoints and the SSD-placed internals of
 * the next act_ahead blocks on their way into their slots, nearest first (each slot's previous
 * item belongs to a block whose backward is done or is the request before b's). */
static int backward_ahead(struct run *r, unsigned b)
{
    for (unsigned a = b - 1; a >= 1 && a + r->act_ahead >= b; a--) {
        FY_TRY(fy_spill_in(&r->ckpt, a - 1, 0, NULL));
        if (r->ssd_mask[a])
            FY_TRY(fy_spill_in(&r->saved, a - 1, 0, NULL));
    }
    return 0;
}

/* Block b's backward, in either pass: its checkpoint (and its internals placed on the SSD) waited
 * for in their slots, its weights at w_off, dy in and dx out, its gradient into `grad`; then the
 * next blocks' inputs on their way. */
static int block_backward_issue(struct run *r, unsigned b, uint64_t w_off, uint64_t dy,
                                uint64_t dx, uint64_t grad, struct fy_ticket *t)
{
    const struct fy_plan_layout *l = &r->l;
    uint64_t x_off = 0, s_off = 0;
    FY_TRY(fy_spill_in(&r->ckpt, b - 1, 1, &x_off));
    if (r->ssd_mask[b])
        FY_TRY(fy_spill_in(&r->saved, b - 1, 1, &s_off));
    int op = FY_OP_GPT_BLOCK_BWD;
    struct fy_desc req[FY_DESC_MAX_PARTS];
    req[0] = weights_region(r, op, b, w_off, (int)b, 1);
    req[1] = fy_desc_region(op, FY_KIND_ACTIVATION, l->act_dtype, x_off, l->act_bytes, (int)b);
    req[2] = fy_desc_region(op, FY_KIND_GRAD, l->act_dtype, dy, l->act_bytes, (int)b);
    req[3] = fy_desc_region(op, FY_KIND_GRAD, l->act_dtype, dx, l->act_bytes, (int)b);
    req[4] = fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, grad, unit_bytes(l, b), (int)b);
    FY_TRY(fy_ticket_issue(&r->tk, FY_TICKET_GPU, req, saved_parts(r, b, op, s_off, req, 5), t));
    fy_spill_used_by(&r->ckpt, b - 1, t);
    if (r->ssd_mask[b])
        fy_spill_used_by(&r->saved, b - 1, t);
    return b >= 2 ? backward_ahead(r, b) : 0;
}

static int run_init(struct run *r, struct fy_pool *pool, const struct fy_plan_shape *s,
                    const struct fy_exec *x, int timeout_ms)
{
    memset(r, 0, sizeof *r);
    for (int i = 0; i < 3; i++)
        r->wslot_unit[i] = -1;
    r->state_unit[0] = r->state_unit[1] = -1;
    r->tk.x = x;
    r->tk.timeout_ms = timeout_ms;
    r->tk.units = fy_gpt_unit_count(s->c);
    r->pool = pool;
    FY_REQUIRE(s->act_dtype == FY_DTYPE_F32 || s->act_dtype == FY_DTYPE_BF16, -EINVAL,
               "training: activations in the pool are f32 or bf16, not %s (fy_train_opts.act_dtype)",
               fy_dtype_name(s->act_dtype));
    FY_TRY(fy_plan_layout_read(pool, s, &r->l));
    r->dfinal = gslot(&r->l, 1);
    return 0;
}

struct init_ctx {
    const struct fy_gpt_config *c;
    uint64_t seed;
};

static int init_unit(void *ctx, unsigned unit, float *master)
{
    const struct init_ctx *i = ctx;
    fy_gpt_init_unit(i->c, unit, i->seed, master);
    return 0;
}

int fy_train_init_store(const struct fy_exec *x, struct fy_pool *pool, const struct fy_gpt_config *c,
                        uint64_t seed, unsigned copies, int timeout_ms)
{
    struct run r;
    const struct fy_plan_shape one = {.c = c, .B = 1, .T = 1, .act_dtype = FY_DTYPE_F32};
    FY_TRY(run_init(&r, pool, &one, x, timeout_ms));
    struct init_ctx ctx = {c, seed};
    /* the two state slots, one unit's whole state each */
    const uint64_t bufs[2] = {r.l.state, r.l.state + r.l.state_slot_bytes};
    return fy_commit_create(x, pool, r.l.meta, bufs, c, seed, copies, init_unit, &ctx,
                            timeout_ms);
}

int fy_train_read_meta(const struct fy_exec *x, struct fy_pool *pool, const char *where,
                       struct fy_storemeta *meta, int timeout_ms)
{
    uint64_t off, bytes;
    FY_TRY(fy_pool_region(pool, "meta", &off, &bytes));
    FY_REQUIRE(bytes >= FY_COMMIT_RECORD_BYTES, -EINVAL,
               "shared pool: the meta region of %llu bytes does not hold a commit record",
               (unsigned long long)bytes);
    return fy_commit_read(x, pool, off, where, UINT64_MAX, meta, timeout_ms);
}

double fy_train_lr(const struct fy_train_opts *o, uint64_t step)
{
    if (o->warmup > 0 && step <= o->warmup)
        return o->lr * (double)step / (double)o->warmup;
    double min_lr = o->lr * o->min_lr_ratio;
    if (o->steps <= o->warmup)
        return o->lr;
    double progress = (double)(step - o->warmup) / (double)(o->steps - o->warmup);
    if (progress > 1.0)
        progress = 1.0;
    return min_lr + (o->lr - min_lr) * 0.5 * (1.0 + cos(3.141592653589793 * progress));
}

/* Forward through every unit; with `train`, also the head's backward into dacts[0] and the grads.
 * The weights of the next units are read while the current block computes, as many ahead as the
 * prefetch depth (weights slots 1.. in turn). */
static int forward(struct run *r, int train, uint64_t step, const uint64_t *version, double *loss)
{
    const struct fy_plan_layout *l = &r->l;
    const struct fy_gpt_config *c = l->c;
    unsigned L = c->n_layer, fin = L + 1;
    struct fy_desc req[FY_DESC_MAX_PARTS], reply = {0};
    struct fy_ticket t_embed = {0}, g_embed = {0}, head = {0};
    struct fy_ticket *rw = calloc(L + 2, sizeof *rw), *g = calloc(L + 2, sizeof *g);
    unsigned depth = l->wslots - 1;
    int rc = rw && g ? 0 : -ENOMEM;
    for (unsigned u = 0; rc == 0 && u <= fin; u++)
        if (train && version[u] != step - 1) {
            fy_error("schedule error: unit %u holds step %llu's weights, step %llu needs step %llu's",
                     u, (unsigned long long)version[u], (unsigned long long)step,
                     (unsigned long long)(step - 1));
            rc = -EPROTO;
        }
    /* slot 0 keeps the embeddings until the tied head has used them; the blocks and then the
     * final unit take the other slots in turn */
    if (rc == 0)
        rc = read_weights(r, 0, 0, &t_embed);
    for (unsigned u = 1; rc == 0 && u <= fin && u <= depth; u++)
        rc = read_weights(r, u, block_wslot(l, u), &rw[u]);
    if (rc == 0)
        rc = fy_ticket_wait(&r->tk, &t_embed, NULL);
    uint64_t w_embed = 0;
    if (rc == 0)
        rc = weights_of(r, 0, 0, &w_embed);
    if (rc == 0) /* the previous step's update of this unit, which may still be running */
        rc = fy_optq_settle(&r->opt, 0);
    uint64_t x_out = 0, x_in = 0;
    if (rc == 0)
        rc = fy_spill_out(&r->ckpt, 0, &x_out);
    if (rc == 0) {
        int op = FY_OP_GPT_EMBED_FWD;
        req[0] = fy_desc_region(op, FY_KIND_TOKENS, FY_DTYPE_I32, l->tokens, l->tok_bytes, 0);
        req[1] = weights_region(r, op, 0, w_embed, 0, 1);
        req[2] = fy_desc_region(op, FY_KIND_ACTIVATION, l->act_dtype, x_out, l->act_bytes, 0);
        rc = fy_ticket_issue(&r->tk, FY_TICKET_GPU, req, 3, &g_embed);
        fy_spill_used_by(&r->ckpt, 0, &g_embed);
    }
    for (unsigned b = 1; rc == 0 && b <= L; b++) {
        rc = fy_ticket_wait(&r->tk, &rw[b], NULL);
        uint64_t w_off = 0;
        if (rc == 0)
            rc = weights_of(r, b, block_wslot(l, b), &w_off);
        if (rc == 0)
            rc = fy_optq_settle(&r->opt, b);
        if (rc == 0)
            rc = fy_spill_in(&r->ckpt, b - 1, 0, &x_in); /* the slot block b-1 just wrote */
        if (rc == 0)
            rc = fy_spill_out(&r->ckpt, b, &x_out);
        uint64_t s_off = 0; /* the slot of block b's internals on their way to the store */
        int swaps = train && r->ssd_mask[b] != 0;
        if (rc == 0 && swaps)
            rc = fy_spill_out(&r->saved, b - 1, &s_off);
        int op = FY_OP_GPT_BLOCK_FWD;
        req[0] = weights_region(r, op, b, w_off, (int)b, 1);
        req[1] = fy_desc_region(op, FY_KIND_ACTIVATION, l->act_dtype, x_in, l->act_bytes, (int)b);
        req[2] = fy_desc_region(op, FY_KIND_ACTIVATION, l->act_dtype, x_out, l->act_bytes, (int)b);
        unsigned n = train ? saved_parts(r, b, op, s_off, req, 3) : 3;
        if (rc == 0)
            rc = fy_ticket_issue(&r->tk, FY_TICKET_GPU, req, n, &g[b]);
        fy_spill_used_by(&r->ckpt, b - 1, &g[b]);
        fy_spill_used_by(&r->ckpt, b, &g[b]);
        if (swaps)
            fy_spill_used_by(&r->saved, b - 1, &g[b]);
        if (rc == 0 && train) /* x_{b-1} to the store once its block has written it */
            rc = fy_spill_write(&r->ckpt, b - 1, b == 1 ? &g_embed : &g[b - 1]);
        if (rc == 0 && train && b >= 2 && r->ssd_mask[b - 1]) /* and block b-1's internals */
            rc = fy_spill_write(&r->saved, b - 2, &g[b - 1]);
        /* unit b+depth goes into the slot block b-1 had: once that block has run */
        unsigned next = b + depth;
        if (rc == 0 && next <= fin && b >= 2)
            rc = fy_ticket_wait(&r->tk, &g[b - 1], NULL);
        if (rc == 0 && next <= fin)
            rc = read_weights(r, next, block_wslot(l, next), &rw[next]);
    }
    if (rc == 0 && train && L >= 1 && r->ssd_mask[L])
        rc = fy_spill_write(&r->saved, L - 1, &g[L]);
    if (rc == 0)
        rc = fy_ticket_wait(&r->tk, &rw[fin], NULL);
    for (unsigned b = 0; rc == 0 && b <= L; b++)
        rc = fy_ticket_wait(&r->tk, b ? &g[b] : &g_embed, NULL);
    uint64_t w_fin = 0;
    if (rc == 0)
        rc = weights_of(r, fin, block_wslot(l, fin), &w_fin);
    if (rc == 0)
        rc = weights_of(r, 0, 0, &w_embed); /* slot 0 still holds the embeddings */
    if (rc == 0)
        rc = fy_optq_settle(&r->opt, fin);
    if (rc == 0)
        rc = fy_spill_in(&r->ckpt, L, 0, &x_in);
    if (rc == 0) {
        int op = FY_OP_GPT_HEAD, f = (int)fin, copies = has_copy(r, 0) && has_copy(r, fin);
        req[0] = fy_desc_region(op, FY_KIND_ACTIVATION, l->act_dtype, x_in, l->act_bytes, f);
        req[1] = fy_desc_region(op, FY_KIND_TOKENS, FY_DTYPE_I32, l->targets, l->tok_bytes, f);
        req[2] = weights_region(r, op, fin, w_fin, f, copies);
        req[3] = weights_region(r, op, 0, w_embed, f, copies);
        req[4] = fy_desc_region(op, FY_KIND_GRAD, l->act_dtype, dact_at(l, 0), l->act_bytes, f);
        req[5] = fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, r->dfinal, unit_bytes(l, fin), f);
        req[6] = fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, gslot(l, 0), unit_bytes(l, 0), f);
        rc = fy_ticket_issue(&r->tk, FY_TICKET_GPU, req, train ? 7 : 4, &head);
    }
    if (rc == 0)
        rc = fy_ticket_wait(&r->tk, &head, &reply);
    /* the gpu requests were all waited for before the head */
    fy_spill_forget_users(&r->ckpt);
    fy_spill_forget_users(&r->saved);
    free(rw);
    free(g);
    FY_TRY(rc);
    memcpy(loss, &reply.arg, sizeof *loss);
    FY_REQUIRE(isfinite(*loss), -EDOM, "step %llu: the loss is %g: lower the learning rate",
               (unsigned long long)step, *loss);
    return 0;
}

/* Unit u's optimizer step, in three requests that the caller can interleave with other work: its
 * state into state slot s, AdamW with the gradient in grads slot g, the state back to the store. */
static int state_read(struct run *r, unsigned u, unsigned s, struct fy_ticket *t)
{
    r->state_unit[s] = (int)u;
    if (r->resident != NULL && r->resident[u] != 0) {
        r->state_off[s] = r->resident[u]; /* updated in place, where it stays */
        return 0;
    }
    r->state_off[s] = r->l.state + s * r->l.state_slot_bytes;
    if (r->at_copy == NULL)
        return state_io(r, FY_OP_IO_READ, u, r->read_copy, r->state_off[s], NULL, 0, t);
    return state_io(r, FY_OP_IO_READ, u, r->at_copy[u], r->state_off[s], &r->digest[u], 1, t);
}

/* Unit u's AdamW request parts: req[0] the gradient at pool offset `grad`, then each section of
 * the state at `state` (common/optstate.h: master, m, v); the clipping scale (0: none) in the grad
 * part's arg, the learning rate in the master part's; then, where the unit has a bf16 weights
 * copy, a part for it (AdamW rewrites it from the new master). Returns the number of parts. */
static unsigned adamw_parts(const struct run *r, unsigned u, uint64_t grad, uint64_t state,
                            uint64_t step, double lr, double scale, struct fy_desc *req)
{
    const struct fy_plan_layout *l = &r->l;
    struct fy_optstate_layout lay;
    fy_optstate_layout(l->c, u, &lay);
    int op = FY_OP_OPT_ADAMW;
    req[0] = fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, grad, unit_bytes(l, u), (int)u);
    memcpy(&req[0].arg, &scale, sizeof scale);
    unsigned parts = 1 + fy_optstate_parts(&lay, state, (int)u, req + 1);
    memcpy(&req[1 + FY_OPTSTATE_MASTER].arg, &lr, sizeof lr);
    if (has_copy(r, u))
        req[parts++] = weights_region(r, op, u, master_at(l->c, u, state), (int)u, 1);
    for (unsigned i = 0; i < parts; i++)
        req[i].step = step;
    return parts;
}

/* The part that limits an update of unit u to the `count` rows listed (int32, each n_embd
 * elements) at pool offset `list`. */
static struct fy_desc rows_part(const struct fy_plan_layout *l, unsigned u, uint64_t list,
                                uint64_t count, uint64_t step)
{
    struct fy_desc d = fy_desc_region(FY_OP_OPT_ADAMW, FY_KIND_TOKENS, FY_DTYPE_I32, list,
                                      count * 4, (int)u);
    d.step = step;
    d.arg = l->c->n_embd;
    return d;
}

/* Unit u's update as requests (adamw_parts, with this step's clipping scale r->grad_scale); state
 * in state slot s. Queued, not sent. */
static int opt_enqueue(struct run *r, unsigned u, unsigned s, uint64_t grad, uint64_t step,
                       double lr)
{
    FY_REQUIRE(r->state_unit[s] == (int)u, -EPROTO,
               "schedule error: AdamW of unit %u on state slot %u, which holds unit %d's state", u, s,
               r->state_unit[s]);
    struct fy_desc req[FY_OPTQ_PARTS_MAX];
    unsigned n = adamw_parts(r, u, grad, r->state_off[s], step, lr, r->grad_scale, req);
    return fy_optq_push(&r->opt, u, req, n);
}

/* Unit u's state at pool offset `from` to the copy being written (never the committed one). */
static int state_written(struct run *r, unsigned u, uint64_t from, struct fy_ticket *t)
{
    FY_REQUIRE(r->at_copy != NULL, -EPROTO, "schedule error: state written outside training");
    r->at_copy[u] = (unsigned char)r->work_copy;
    return state_io(r, FY_OP_IO_WRITE, u, r->work_copy, from, &r->digest[u], 1, t);
}

static int state_write(struct run *r, unsigned u, unsigned s, struct fy_ticket *t)
{
    FY_REQUIRE(r->state_unit[s] == (int)u, -EPROTO,
               "schedule error: writing unit %u from state slot %u, which holds unit %d's state", u,
               s, r->state_unit[s]);
    if (r->resident != NULL && r->resident[u] != 0)
        return 0; /* stays in the pool; written to the store at checkpoints */
    return state_written(r, u, r->state_off[s], t);
}

/* The whole update of one unit (its gradient at pool offset `grad`), waited for. */
static int update_unit(struct run *r, unsigned u, uint64_t grad, uint64_t step, double lr)
{
    struct fy_ticket t = {0};
    FY_TRY(state_read(r, u, 0, &t));
    FY_TRY(fy_ticket_wait(&r->tk, &t, NULL));
    FY_TRY(opt_enqueue(r, u, 0, grad, step, lr));
    FY_TRY(fy_optq_settle(&r->opt, u));
    FY_TRY(state_write(r, u, 0, &t));
    return fy_ticket_wait(&r->tk, &t, NULL);
}

/* The embedding lookup's gradient (dx0 at pool offset dx0) added to the head's wte gradient in
 * grads slot 0. */
static int embed_backward_issue(struct run *r, uint64_t dx0, struct fy_ticket *t)
{
    const struct fy_plan_layout *l = &r->l;
    int op = FY_OP_GPT_EMBED_BWD;
    struct fy_desc req[3];
    req[0] = fy_desc_region(op, FY_KIND_TOKENS, FY_DTYPE_I32, l->tokens, l->tok_bytes, 0);
    req[1] = fy_desc_region(op, FY_KIND_GRAD, l->act_dtype, dx0, l->act_bytes, 0);
    req[2] = fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, gslot(l, 0), unit_bytes(l, 0), 0);
    return fy_ticket_issue(&r->tk, FY_TICKET_GPU, req, 3, t);
}

static int embed_backward(struct run *r, uint64_t dx0)
{
    struct fy_ticket t = {0};
    FY_TRY(embed_backward_issue(r, dx0, &t));
    return fy_ticket_wait(&r->tk, &t, NULL);
}

static int is_resident(const struct run *r, unsigned u)
{
    return r->resident != NULL && r->resident[u] != 0;
}

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
static int write_back(struct run *r, struct writebacks *wb, unsigned u)
{
    if (wb->issued[u])
        return 0;
    wb->issued[u] = 1;
    if (is_resident(r, u))
        return 0;
    FY_TRY(fy_optq_settle(&r->opt, u));
    FY_TRY(state_write(r, u, u & 1, &wb->ws[u]));
    wb->slot_writer[u & 1] = (int)u;
    return 0;
}

/* Backward through the blocks with each block's update overlapped with the backward of the blocks
 * below. A streamed block's weights come with its state: its master, m and v are read into a state
 * slot before its backward, which takes the master from there, and AdamW updates them in place
 * after it, so the master crosses from the SSD once in backward, not twice; the read goes into
 * the slot that block b+2 leaves once written back (state slots 0 and 1 alternate). A resident
 * block's weights and state are where they stay. Block b's backward is issued once a gradient
 * slot is free (fy_optq_take_gslot: at least three, so the gpu can run two blocks ahead of the optimizer,
 * and with more the optimizer can fall behind and finish in the next forward); block b+1's AdamW is
 * queued, not waited for, once its gradient is in. Every reuse of a slot waits for its previous
 * user. With `embed`, the embedding backward follows block 1's on the gpu while the last blocks are
 * updated. */
static int backward_blocks(struct run *r, uint64_t step, double lr, uint64_t *version, unsigned *cur,
                           int embed)
{
    const struct fy_plan_layout *l = &r->l;
    unsigned L = l->c->n_layer;
    struct fy_ticket *g = calloc(L + 4, sizeof *g), *rs = calloc(L + 4, sizeof *rs);
    struct fy_ticket *ws = calloc(L + 4, sizeof *ws), e = {0};
    unsigned char *issued = calloc(L + 4, 1);
    unsigned *slot_of = calloc(L + 4, sizeof *slot_of);
    int rc = g && rs && ws && issued && slot_of ? 0 : -ENOMEM;
    struct writebacks wb = {ws, issued, {-1, -1}};
    fy_optq_release_gslots(&r->opt); /* the last step's updates were all waited for */
    if (rc == 0 && embed && L == 0) /* it reads the gradient this overwrites */
        rc = fy_ticket_wait(&r->tk, &r->embed_early, NULL);
    if (rc == 0 && embed && L == 0)
        rc = embed_backward_issue(r, dact_at(l, *cur), &e);
    if (rc == 0 && L >= 1) /* the two state slots start with blocks L and L-1 */
        rc = state_read(r, L, L & 1, &rs[L]);
    if (rc == 0 && L >= 2)
        rc = state_read(r, L - 1, (L - 1) & 1, &rs[L - 1]);
    for (unsigned b = L; rc == 0; b--) {
        int later_read = b >= 1 && b + 2 <= L; /* block b's state is not read yet */
        rc = fy_optq_pump(&r->opt);
        if (later_read && !is_resident(r, b)) { /* into the slot block b+2 leaves */
            rc = write_back(r, &wb, b + 2);
            if (rc == 0 && wb.slot_writer[b & 1] >= 0)
                rc = fy_ticket_wait(&r->tk, &ws[wb.slot_writer[b & 1]], NULL);
            if (rc == 0)
                rc = state_read(r, b, b & 1, &rs[b]);
        }
        if (rc == 0 && b >= 1) {
            uint64_t w_off = is_resident(r, b) ? master_at(l->c, b, r->resident[b]) : 0;
            if (!is_resident(r, b)) {
                rc = fy_ticket_wait(&r->tk, &rs[b], NULL);
                FY_REQUIRE(rc != 0 || r->state_unit[b & 1] == (int)b, -EPROTO,
                           "schedule error: block %u's weights expected in state slot %u, which "
                           "holds unit %d's state", b, b & 1, r->state_unit[b & 1]);
                w_off = master_at(l->c, b, r->state_off[b & 1]);
            }
            if (rc == 0)
                rc = fy_optq_take_gslot(&r->opt, b, &slot_of[b]);
            if (rc == 0) {
                rc = block_backward_issue(r, b, w_off, dact_at(l, *cur), dact_at(l, *cur ^ 1),
                                          gslot(l, slot_of[b]), &g[b]);
            }
            *cur ^= 1;
            if (rc == 0 && b == 1 && embed) /* the early part reads the gradient this rewrites */
                rc = fy_ticket_wait(&r->tk, &r->embed_early, NULL);
            if (rc == 0 && b == 1 && embed) /* dx0 is block 1's dx */
                rc = embed_backward_issue(r, dact_at(l, *cur), &e);
        }
        if (rc == 0 && b + 1 <= L) { /* block b+1's update, while the gpu runs block b */
            unsigned u = b + 1;
            rc = fy_ticket_wait(&r->tk, &g[u], NULL);
            if (rc == 0)
                rc = fy_ticket_wait(&r->tk, &rs[u], NULL);
            if (rc == 0)
                rc = opt_enqueue(r, u, u & 1, gslot(l, slot_of[u]), step, lr);
            if (rc == 0) {
                r->opt.gslot_queued[slot_of[u]] = 1;
                rc = fy_optq_pump(&r->opt);
            }
            version[u] = step;
        }
        if (rc == 0 && b + 2 <= L) /* block b+2's write-back (issued above if block b needed it) */
            rc = write_back(r, &wb, b + 2);
        if (rc == 0 && later_read && is_resident(r, b)) /* in place: only the bookkeeping */
            rc = state_read(r, b, b & 1, &rs[b]);
        if (b == 0)
            break;
    }
    if (rc == 0 && L >= 1) /* block 1's write-back */
        rc = write_back(r, &wb, 1);
    int we = fy_ticket_wait(&r->tk, &e, NULL);
    rc = rc ? rc : we;
    /* nothing stays in flight but resident blocks' updates, which the next forward waits for */
    for (unsigned u = 0; u <= L + 3; u++) {
        int w = fy_ticket_wait(&r->tk, &ws[u], NULL);
        w = w ? w : fy_ticket_wait(&r->tk, &g[u], NULL);
        w = w ? w : fy_ticket_wait(&r->tk, &rs[u], NULL);
        rc = rc ? rc : w;
    }
    fy_spill_forget_users(&r->ckpt);
    fy_spill_forget_users(&r->saved);
    free(g);
    free(rs);
    free(ws);
    free(issued);
    free(slot_of);
    return rc;
}

/* Unit u's gradient sum of squares on the opt worker (its gradient at pool offset grad). */
static int sumsq_issue(struct run *r, unsigned u, uint64_t grad, struct fy_ticket *t)
{
    struct fy_desc d = fy_desc_region(FY_OP_OPT_SUMSQ, FY_KIND_GRAD, FY_DTYPE_F32, grad,
                                      unit_bytes(&r->l, u), (int)u);
    return fy_ticket_issue(&r->tk, FY_TICKET_OPT, &d, 1, t);
}

/* Waits for a sum-of-squares request, its result into *out (nothing when none is in flight). */
static int sumsq_wait(struct run *r, struct fy_ticket *t, double *out)
{
    if (t->id == 0)
        return 0;
    struct fy_desc reply;
    FY_TRY(fy_ticket_wait(&r->tk, t, &reply));
    memcpy(out, &reply.arg, sizeof *out);
    return 0;
}

/* Pass 1 of a clipped step, after the forward (whose head request ran the head's backward): every
 * unit's gradient and its sum of squares, no update. It leaves what pass 2 needs where pass 2
 * finds it: dx_L in dacts[0] (the blocks' dx alternate between dacts[1] and acts[L], the head's
 * input, which nothing reads any more this step), the final unit's gradient after the grads slots,
 * and the complete embedding gradient (the lookup's share added to the head's) in grads slot 0.
 * Overlapped like the backward: while the gpu computes block b, the opt worker sums block b+1's
 * squares; grads slots 1 and 2 alternate and the weights slots are taken in turn, each reuse
 * waiting for its previous user. *total = the units' sums added in unit order, whatever the schedule. */
static int norm_pass(struct run *r, double *total)
{
    const struct fy_plan_layout *l = &r->l;
    unsigned L = l->c->n_layer, fin = L + 1;
    struct fy_ticket *rw = calloc(L + 3, sizeof *rw), *g = calloc(L + 3, sizeof *g);
    struct fy_ticket *sq = calloc(L + 3, sizeof *sq);
    double *part = calloc(L + 3, sizeof *part);
    int rc = rw && g && sq && part ? 0 : -ENOMEM;
    /* x_L's room is free after the head; with the checkpoints in slots, a third dacts buffer */
    const uint64_t scratch[2] = {dact_at(l, 1), r->ckpt.on ? dact_at(l, 2) : act_at(l, L)};
    uint64_t dy = dact_at(l, 0); /* dL/d(output of the block being processed) */
    unsigned depth = l->wslots - 1;
    if (rc == 0)
        rc = sumsq_issue(r, fin, r->dfinal, &sq[fin]);
    for (unsigned u = L; rc == 0 && u >= 1 && u + depth > L; u--) /* the first blocks' weights */
        rc = read_weights(r, u, block_wslot(l, u), &rw[u]);
    for (unsigned b = L; rc == 0 && b >= 1; b--) {
        uint64_t dx = scratch[(L - b) & 1], w_off = 0;
        rc = fy_ticket_wait(&r->tk, &rw[b], NULL);
        if (rc == 0)
            rc = weights_of(r, b, block_wslot(l, b), &w_off);
        if (rc == 0 && b + 2 <= L)
            rc = sumsq_wait(r, &sq[b + 2], &part[b + 2]); /* its gradient slot */
        if (rc == 0)
            rc = block_backward_issue(r, b, w_off, dy, dx, gslot(l, 1 + (b & 1)), &g[b]);
        dy = dx;
        /* block b+1's gradient is complete: its squares, and its weights slot is free for block
         * b-depth */
        if (rc == 0 && b + 1 <= L)
            rc = fy_ticket_wait(&r->tk, &g[b + 1], NULL);
        if (rc == 0 && b + 1 <= L)
            rc = sumsq_issue(r, b + 1, gslot(l, 1 + ((b + 1) & 1)), &sq[b + 1]);
        if (rc == 0 && b > depth)
            rc = read_weights(r, b - depth, block_wslot(l, b - depth), &rw[b - depth]);
    }
    if (rc == 0 && L >= 1)
        rc = fy_ticket_wait(&r->tk, &g[1], NULL);
    if (rc == 0 && L >= 1)
        rc = sumsq_issue(r, 1, gslot(l, 2), &sq[1]);
    if (rc == 0)
        rc = embed_backward(r, dy);
    if (rc == 0)
        rc = sumsq_issue(r, 0, gslot(l, 0), &sq[0]);
    for (unsigned u = 0; u <= L + 2; u++) { /* nothing stays in flight */
        int w = sumsq_wait(r, &sq[u], &part[u]);
        w = w ? w : fy_ticket_wait(&r->tk, &g[u], NULL);
        w = w ? w : fy_ticket_wait(&r->tk, &rw[u], NULL);
        rc = rc ? rc : w;
    }
    fy_spill_forget_users(&r->ckpt);
    fy_spill_forget_users(&r->saved);
    double sum = 0.0;
    for (unsigned u = 0; u <= fin; u++)
        sum += part[u];
    *total = sum;
    free(rw);
    free(g);
    free(sq);
    free(part);
    return rc;
}

/* The embeddings' update, first part: the rows no token of the batch touches, whose gradient (the
 * head's alone; none for an untied head) is final once the head is done. Sent now, it runs during
 * the backward, and only the touched rows and the positions are left for the stretch between the
 * backward and the next forward, which waits for them. The two row lists go to the pool (the
 * untouched rows, then the rest); *late gets the second one's length. */
static int embed_update_early(struct run *r, uint64_t step, double lr, uint64_t *late)
{
    const struct fy_plan_layout *l = &r->l;
    const struct fy_gpt_config *c = l->c;
    uint64_t rows = fy_plan_embed_rows(c), tokens = (uint64_t)l->B * l->T;
    const int32_t *tok = fy_pool_at(r->pool, l->tokens, l->tok_bytes);
    int32_t *early = fy_pool_at(r->pool, l->embed_rows, 2 * rows * 4), *rest = early + rows;
    FY_REQUIRE(tok != NULL && early != NULL, -ERANGE,
               "schedule error: the batch or the embeddings' row lists lie outside the pool");
    memset(r->row_touched, 0, c->vocab);
    for (uint64_t i = 0; i < tokens; i++) {
        FY_REQUIRE(tok[i] >= 0 && (uint64_t)tok[i] < c->vocab, -EINVAL,
                   "train: token %d at %llu is outside the vocabulary of %llu", tok[i],
                   (unsigned long long)i, (unsigned long long)c->vocab);
        r->row_touched[tok[i]] = 1;
    }
    uint64_t n_early = 0, n_rest = 0;
    for (uint64_t v = 0; v < rows; v++) {
        if (v < c->vocab && !r->row_touched[v])
            early[n_early++] = (int32_t)v;
        else
            rest[n_rest++] = (int32_t)v; /* touched, or a position's row */
    }
    *late = n_rest;
    if (n_early == 0)
        return 0;
    struct fy_desc req[FY_OPTQ_PARTS_MAX];
    unsigned n = adamw_parts(r, 0, gslot(l, 0), r->resident[0], step, lr, 0.0, req); /* unclipped */
    req[n++] = rows_part(l, 0, l->embed_rows, n_early, step);
    return fy_ticket_issue(&r->tk, FY_TICKET_OPT, req, n, &r->embed_early);
}

static int backward_and_update(struct run *r, uint64_t step, double lr, uint64_t *version)
{
    const struct fy_plan_layout *l = &r->l;
    unsigned L = l->c->n_layer, fin = L + 1;
    FY_TRY(update_unit(r, fin, r->dfinal, step, lr));
    version[fin] = step;
    int split = r->embed_split && !r->clip && is_resident(r, 0);
    uint64_t late = 0;
    if (split)
        FY_TRY(embed_update_early(r, step, lr, &late));
    unsigned cur = 0; /* dacts[cur] holds dL/d(output of the unit being processed) */
    /* with clipping, pass 1 has completed the embedding gradient already */
    int rc = backward_blocks(r, step, lr, version, &cur, !r->clip);
    /* done before the embedding backward */
    int early = fy_ticket_wait(&r->tk, &r->embed_early, NULL);
    FY_TRY(rc ? rc : early);
    if (is_resident(r, 0)) { /* updated in place: the next forward waits for it */
        struct fy_ticket none = {0};
        FY_TRY(state_read(r, 0, 0, &none));
        FY_TRY(opt_enqueue(r, 0, 0, gslot(l, 0), step, lr));
        if (split)
            fy_optq_add_part(&r->opt, 0,
                             rows_part(l, 0, l->embed_rows + fy_plan_embed_rows(l->c) * 4, late,
                                       step));
    } else {
        FY_TRY(update_unit(r, 0, gslot(l, 0), step, lr));
    }
    version[0] = step;
    return fy_optq_send_all(&r->opt);
}

/* Said once per process: a batch whose targets the token file's loss mask all masks out. */
static int warned_no_trained_target;

/* Samples batch `index` of the split into the pool; *trained (may be NULL) gets the number of
 * targets the loss counts (a target whose token the file's loss mask masks is -1, ignored). */
static int load_batch(struct run *r, const struct fy_tokfile *data, int split, uint64_t seed,
                      uint64_t index, uint64_t *trained)
{
    int32_t *in = fy_pool_at(r->pool, r->l.tokens, r->l.tok_bytes);
    int32_t *tg = fy_pool_at(r->pool, r->l.targets, r->l.tok_bytes);
    if (split == FY_TOKFILE_EVAL)
        FY_TRY(fy_tokfile_eval_batch(data, index, r->l.B, r->l.T, in, tg));
    else
        FY_TRY(fy_tokfile_batch(data, FY_TOKFILE_TRAIN, seed, index, r->l.B, r->l.T, in, tg));
    uint64_t n = 0;
    for (size_t i = 0; i < (size_t)r->l.B * (size_t)r->l.T; i++)
        n += tg[i] >= 0;
    if (n == 0 && !warned_no_trained_target) {
        warned_no_trained_target = 1;
        fy_warn("%s batch %llu: every target is masked out of the loss by the token file's loss "
                "mask: its loss is 0 and its gradients are 0 (said once)",
                split == FY_TOKFILE_EVAL ? "eval" : "training", (unsigned long long)index);
    }
    if (trained != NULL)
        *trained = n;
    return 0;
}

/* The mean loss over the eval batches' trained targets: with no loss mask every batch counts B*T
 * targets and this is the mean of the batch losses; with one, each batch weighs by its trained
 * targets (a batch without any adds nothing; none at all gives 0). */
static int eval_loss(struct run *r, const struct fy_tokfile *data, uint64_t batches, double *loss)
{
    double sum = 0, weighted = 0;
    uint64_t trained_total = 0;
    int uniform = 1;
    for (uint64_t k = 0; k < batches; k++) {
        double one;
        uint64_t n;
        FY_TRY(load_batch(r, data, FY_TOKFILE_EVAL, 0, k, &n));
        FY_TRY(forward(r, 0, 0, NULL, &one));
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

/* The plan check: one step (the session's second; the first warms up) beside what the activation
 * plan predicted at the start, with the rates the disk and AdamW ran at in it beside those the plan
 * assumed (the profile's, or for the disk a past session's steps'), so that a prediction that
 * misses says which resource was misjudged. */
static void log_plan_check(const struct fy_train_opts *o, const struct fy_gpt_config *c,
                           uint64_t step, double seconds, const double *busy,
                           const uint64_t *bytes)
{
    char rd[32], wr[32], opt[32];
    double params = (double)fy_gpt_total_params(c);
    snprintf(opt, sizeof opt, busy[FY_TICKET_BUSY_OPT] > 0 ? "%.2f" : "-",
             busy[FY_TICKET_BUSY_OPT] > 0 ? params / busy[FY_TICKET_BUSY_OPT] * 1e-9 : 0.0);
    fy_info("plan check, step %llu: %.3f s against the %.3f s predicted (%+.1f%%); in it the SSD "
            "read %s GB/s and wrote %s (the plan's: %.2f and %.2f, from %s), AdamW %s G "
            "parameters/s (the profile: %.2f)",
            (unsigned long long)step, seconds, o->plan_step_s,
            100.0 * (o->plan_step_s / seconds - 1.0),
            fy_diskrates_gbps(fy_diskrates_rate(bytes[FY_TICKET_BUSY_SSD_READ], busy[FY_TICKET_BUSY_SSD_READ]), "-",
                              rd, sizeof rd),
            fy_diskrates_gbps(fy_diskrates_rate(bytes[FY_TICKET_BUSY_SSD_WRITE], busy[FY_TICKET_BUSY_SSD_WRITE]), "-",
                              wr, sizeof wr),
            o->plan_ssd_read * 1e-9, o->plan_ssd_write * 1e-9,
            o->plan_ssd_from_steps ? "the last session's steps" : "the profile", opt,
            o->plan_opt_params * 1e-9);
}

/* grad_norm < 0: not computed (no clipping: computing it would cost a backward pass). */
static int log_step(const struct fy_train_opts *o, const struct fy_gpt_config *c, uint64_t step,
                    double loss, double lr, double grad_norm, double seconds, const double *phase,
                    const double *busy, const uint64_t *bytes, int have_eval, double eval)
{
    double tokens = (double)o->batch * o->seq;
    double tps = tokens / seconds;
    double tflops = tps * fy_gpt_flops_per_token(c, (unsigned)o->seq) / 1e12;
    char ev[48] = "", gn[64] = "";
    if (have_eval)
        snprintf(ev, sizeof ev, " | eval %.4f", eval);
    if (grad_norm >= 0)
        snprintf(gn, sizeof gn, " | grad norm %.4f%s", grad_norm,
                 o->clip_grad_norm / (grad_norm + 1e-6) < 1.0 ? " (clipped)" : "");
    double gpu_idle = seconds > 0 ? 1.0 - busy[FY_TICKET_BUSY_GPU] / seconds : 0.0;
    char line[512];
    snprintf(line, sizeof line,
             "step %llu/%llu | loss %.4f%s%s | lr %.2e | %.0f tok/s | %.4f TFLOP/s | %.0f ms | "
             "busy: gpu %.0f (h2d %.0f, d2h %.0f), ssd read %.0f, ssd write %.0f, opt %.0f ms | "
             "gpu idle %.0f%%",
             (unsigned long long)step, (unsigned long long)o->steps, loss, ev, gn, lr, tps, tflops,
             1e3 * seconds, 1e3 * busy[FY_TICKET_BUSY_GPU], 1e3 * busy[FY_TICKET_BUSY_H2D], 1e3 * busy[FY_TICKET_BUSY_D2H],
             1e3 * busy[FY_TICKET_BUSY_SSD_READ], 1e3 * busy[FY_TICKET_BUSY_SSD_WRITE], 1e3 * busy[FY_TICKET_BUSY_OPT],
             100.0 * gpu_idle);
    struct fy_progress_step ps = {.step = step, .total = o->steps, .loss = loss,
                                  .seconds = seconds, .tokens = tokens,
                                  .flops = tokens * fy_gpt_flops_per_token(c, (unsigned)o->seq),
                                  .gpu_busy_s = busy[FY_TICKET_BUSY_GPU], .have_eval = have_eval,
                                  .eval = eval};
    fy_progress_step(&ps, line);
    if (o->metrics == NULL)
        return 0;
    char json[1024];
    int n = snprintf(json, sizeof json,
            "{\"step\": %llu, \"loss\": %.9g, \"lr\": %.9g, \"tokens_per_s\": %.1f, \"tflops\": %.6f, "
            "\"step_s\": %.6f, \"wait_io_s\": %.6f, \"wait_gpu_s\": %.6f, \"wait_opt_s\": %.6f, "
            "\"busy_gpu_s\": %.6f, \"busy_ssd_read_s\": %.6f, \"busy_ssd_write_s\": %.6f, "
            "\"busy_opt_s\": %.6f, \"busy_h2d_s\": %.6f, \"busy_d2h_s\": %.6f, \"gpu_idle\": %.4f, "
            "\"ssd_read_bytes\": %llu, \"ssd_write_bytes\": %llu",
            (unsigned long long)step, loss, lr, tps, tflops, seconds, phase[FY_TICKET_IO], phase[FY_TICKET_GPU],
            phase[FY_TICKET_OPT], busy[FY_TICKET_BUSY_GPU], busy[FY_TICKET_BUSY_SSD_READ], busy[FY_TICKET_BUSY_SSD_WRITE],
            busy[FY_TICKET_BUSY_OPT], busy[FY_TICKET_BUSY_H2D], busy[FY_TICKET_BUSY_D2H], gpu_idle,
            (unsigned long long)bytes[FY_TICKET_BUSY_SSD_READ], (unsigned long long)bytes[FY_TICKET_BUSY_SSD_WRITE]);
    if (grad_norm >= 0)
        n += snprintf(json + n, sizeof json - (size_t)n, ", \"grad_norm\": %.9g", grad_norm);
    if (have_eval)
        n += snprintf(json + n, sizeof json - (size_t)n, ", \"eval_loss\": %.9g", eval);
    snprintf(json + n, sizeof json - (size_t)n, "}");
    return fy_metrics_append(o->metrics, step, json);
}

/* Pass 1 of a clipped step and the scale it gives, as torch.nn.utils.clip_grad_norm_ computes it:
 * norm = sqrt(sum of every gradient element squared), in double; scale = max / (norm + 1e-6),
 * applied (as a float, by the opt worker) only when below 1. */
static int clip_scale(struct run *r, uint64_t step, double max_norm, double *norm)
{
    double sumsq;
    FY_TRY(norm_pass(r, &sumsq));
    *norm = sqrt(sumsq);
    FY_REQUIRE(isfinite(*norm), -EDOM,
               "step %llu: the gradient norm is %g: lower the learning rate",
               (unsigned long long)step, *norm);
    double scale = max_norm / (*norm + 1e-6);
    r->grad_scale = scale < 1.0 ? scale : 0.0;
    return 0;
}

/* Every resident unit's state between the pool and the store: loaded from the committed copy
 * (checked against its digest) at start, written to the other at commits. */
static int resident_transfer(struct run *r, int op)
{
    for (unsigned u = 0; r->resident != NULL && u < fy_gpt_unit_count(r->l.c); u++)
        if (r->resident[u] != 0) {
            struct fy_ticket t = {0};
            if (op == FY_OP_IO_READ)
                FY_TRY(state_io(r, op, u, r->at_copy[u], r->resident[u], &r->digest[u], 1,
                                &t));
            else
                FY_TRY(state_written(r, u, r->resident[u], &t));
            FY_TRY(fy_ticket_wait(&r->tk, &t, NULL));
        }
    return 0;
}

/* The resident units' bf16 weight copies from their masters, the bits AdamW writes them with
 * (fy_f32_to_bf16): at start, once the committed state is in the pool. */
static int fill_copies(struct run *r)
{
    for (unsigned u = 0; u < fy_gpt_unit_count(r->l.c); u++) {
        if (!has_copy(r, u))
            continue;
        size_t n = fy_gpt_unit_params(r->l.c, u);
        const float *master = fy_pool_at(r->pool, master_at(r->l.c, u, r->resident[u]), n * 4);
        uint16_t *copy = fy_pool_at(r->pool, r->wcopy[u], n * 2);
        FY_REQUIRE(master != NULL && copy != NULL, -ERANGE,
                   "schedule error: unit %u's state or weights copy lies outside the pool", u);
#pragma omp parallel for schedule(static) if (n >= (1u << 16))
        for (size_t i = 0; i < n; i++)
            copy[i] = fy_f32_to_bf16(master[i]);
    }
    return 0;
}

/* Commits the step in meta (its updates done, every streamed unit's written back): the resident
 * state written to the working copy, then a commit record naming that copy once it is durable
 * (fy_commit_write). The committed copy becomes the working one for the steps that follow. */
static int commit(struct run *r, struct fy_storemeta *meta, uint64_t step)
{
    FY_TRY(resident_transfer(r, FY_OP_IO_WRITE));
    struct fy_storemeta *next = malloc(sizeof *next);
    FY_REQUIRE(next != NULL, -ENOMEM, "commit: no memory for the record");
    *next = *meta;
    next->step = step;
    next->seq = meta->seq + 1;
    next->copy = r->work_copy;
    int rc = 0;
    for (unsigned u = 0; u < fy_gpt_unit_count(r->l.c); u++) {
        next->digest[u] = r->digest[u];
        if (r->at_copy[u] != r->work_copy) {
            fy_error("schedule error: unit %u's state of step %llu is not in copy %u to commit",
                     u, (unsigned long long)step, r->work_copy);
            rc = -EPROTO;
        }
    }
    if (rc == 0)
        rc = fy_commit_write(r->tk.x, r->pool, r->l.meta, next, r->tk.timeout_ms);
    if (rc == 0) {
        *meta = *next;
        r->read_copy = meta->copy;
        r->work_copy = meta->copies == 2 ? 1 - meta->copy : meta->copy; /* one: in place */
    }
    free(next);
    return rc;
}

/* Starts from the committed step in meta: the resident units' state loaded and every other unit's
 * read once, all checked against the record's digests (a torn or corrupted copy is found here,
 * before anything is written over the copy that the previous commit left). Where the step's state
 * is damaged, the previous commit is taken instead when it is intact; meta follows. */
static int open_committed(struct run *r, struct fy_storemeta *meta,
                          const unsigned char *resident)
{
    unsigned units = fy_gpt_unit_count(r->l.c);
    uint64_t damaged = 0, damaged_seq = 0;
    for (int attempt = 0;; attempt++) {
        r->read_copy = meta->copy;
        r->work_copy = meta->copies == 2 ? 1 - meta->copy : meta->copy; /* one: in place */
        memset(r->at_copy, (int)meta->copy, units);
        memcpy(r->digest, meta->digest, units * sizeof *r->digest);
        double t0 = now_s();
        unsigned bad = 0;
        int rc = resident_transfer(r, FY_OP_IO_READ);
        if (rc == 0)
            rc = fy_commit_verify(r->tk.x, meta, r->l.state, resident, &bad, r->tk.timeout_ms);
        if (rc == 0)
            fy_info("step %llu's state checked against its commit record in %.1f s",
                    (unsigned long long)meta->step, now_s() - t0);
        /* no intact commit left: -ENOENT, not the damage itself, which in the steps means
         * "go back to the last commit" (a restart) */
        if (fy_commit_is_damage(rc) && meta->copies == 1) {
            fy_error("step %llu's state no longer matches its commit: this store keeps one copy "
                     "of the state (init --state-copies 1), so a run stopped between commits "
                     "(killed, crashed, a second Ctrl-C) leaves it unusable; initialise it again, "
                     "or from an export", (unsigned long long)meta->step);
            return -ENOENT;
        }
        if (fy_commit_is_damage(rc) && attempt > 0) {
            fy_error("neither commit of the store is intact: the state of step %llu (commit "
                     "record %llu) and that of step %llu (record %llu) do not match their records "
                     "(the units are named above), so nothing was trained: restore the store's "
                     "files from a copy, or start the run again (fuyou-launch init --overwrite, "
                     "--from-hf DIR for a model exported with export --to-hf)",
                     (unsigned long long)damaged, (unsigned long long)(damaged_seq % 2),
                     (unsigned long long)meta->step, (unsigned long long)(meta->seq % 2));
            return -ENOENT;
        }
        if (!fy_commit_is_damage(rc))
            return rc;
        damaged = meta->step;
        damaged_seq = meta->seq;
        FY_TRY(fy_commit_read(r->tk.x, r->pool, r->l.meta, "the store", meta->seq, meta,
                              r->tk.timeout_ms));
        fy_warn("step %llu's state is damaged on the SSD; going back to the commit before it, "
                "step %llu", (unsigned long long)damaged, (unsigned long long)meta->step);
    }
}

int fy_train_run(const struct fy_exec *x, struct fy_pool *pool, struct fy_storemeta *meta,
                 const struct fy_tokfile *data, const struct fy_train_opts *o)
{
    struct run r;
    const struct fy_plan_shape shape = {.c = &meta->model, .B = o->batch, .T = o->seq,
                                        .act_dtype = o->act_dtype,
                                        .clip = o->clip_grad_norm > 0};
    FY_TRY(run_init(&r, pool, &shape, x, o->timeout_ms));
    r.tk.overlap = o->overlap;
    r.act_ahead = fy_plan_act_ahead(o->act_ahead);
    FY_REQUIRE(r.act_ahead <= FY_PLAN_ACT_AHEAD_MAX, -EINVAL,
               "train: --act-ahead %u: give 1 to %d blocks", r.act_ahead, FY_PLAN_ACT_AHEAD_MAX);
    FY_TRY(ckpt_setup(&r, o->ckpt_ssd));
    r.tk.trace = o->trace;
    FY_REQUIRE(isfinite(o->clip_grad_norm) && o->clip_grad_norm >= 0, -EINVAL,
               "train: the clipping norm %g must be finite and >= 0 (0: no clipping)",
               o->clip_grad_norm);
    if (o->clip_grad_norm > 0) {
        r.clip = 1;
        r.dfinal = gslot(&r.l, r.l.gslots + 1);
        FY_REQUIRE(r.l.grads_bytes >= r.dfinal - r.l.grads + r.l.dfinal_bytes, -EINVAL,
                   "train: the pool has no room for clipping's final-unit gradient (made by "
                   "fy_plan_regions without clip)");
    }
    fy_ticket_trace_begin(&r.tk);
    unsigned units = fy_gpt_unit_count(&meta->model);
    uint64_t *version = calloc(units, sizeof *version);
    uint64_t *resident = calloc(units, sizeof *resident), *wcopy = calloc(units, sizeof *wcopy);
    int queue = fy_optq_init(&r.opt, &r.tk, units, r.l.gslots);
    r.row_touched = calloc(meta->model.vocab, 1);
    r.at_copy = calloc(units, 1);
    r.digest = calloc(units, sizeof *r.digest);
    int rc = queue == 0 && version && resident && wcopy && r.row_touched && r.at_copy && r.digest
                 ? 0
                 : -ENOMEM;
    r.embed_split = !fy_knob_test_embed_whole();
    if (!r.embed_split)
        fy_info("test hook: the embeddings are updated in one piece after the backward "
                "(FUYOU_TEST_EMBED_WHOLE=1)");
    if (rc == 0)
        rc = saved_setup(&r, o);
    if (rc == 0 && fy_plan_resident_bytes(&meta->model, o->resident) > 0) {
        rc = fy_plan_resident_offsets(pool, &meta->model, o->resident, resident, wcopy);
        r.resident = resident;
        r.wcopy = wcopy;
    }
    if (rc == 0)
        rc = open_committed(&r, meta, o->resident);
    if (rc == 0)
        rc = fill_copies(&r);
    for (unsigned u = 0; rc == 0 && u < units; u++)
        version[u] = meta->step;
    if (rc == 0 && meta->step >= o->steps)
        fy_info("the store is already at step %llu (--steps %llu): nothing to train",
                (unsigned long long)meta->step, (unsigned long long)o->steps);
    if (rc == 0 && o->metrics != NULL) { /* what was logged past the commit is trained again */
        int dropped = fy_metrics_rollback(o->metrics, meta->step);
        rc = dropped < 0 ? dropped : 0;
        if (dropped > 0)
            fy_info("%s: dropped %d line%s of steps after the last commit (step %llu), which are "
                    "trained again", fy_metrics_path(o->metrics), dropped, dropped == 1 ? "" : "s",
                    (unsigned long long)meta->step);
    }
    if (rc == 0)
        fy_info("starting at step %llu", (unsigned long long)meta->step);
    uint64_t done = meta->step; /* the last step trained; meta->step is the last committed */
    const uint64_t first = meta->step + 1; /* this session's first step */
    int metrics_full = 0; /* too many metrics lines wait for room: stopped at a commit */
    for (uint64_t step = meta->step + 1; rc == 0 && step <= o->steps; step++) {
        if (o->stop != NULL && *o->stop) {
            fy_warn("stopping at the step boundary before step %llu", (unsigned long long)step);
            break;
        }
        if (o->metrics != NULL && fy_metrics_over_cap(o->metrics)) { /* as a full store */
            metrics_full = 1;
            break;
        }
        double t0 = now_s(), loss = 0, lr = fy_train_lr(o, step), eval = 0, grad_norm = -1;
        fy_ticket_step(&r.tk, step);
        rc = load_batch(&r, data, FY_TOKFILE_TRAIN, o->seed, step, NULL);
        if (rc == 0)
            rc = forward(&r, 1, step, version, &loss);
        r.grad_scale = 0.0;
        if (rc == 0 && r.clip)
            rc = clip_scale(&r, step, o->clip_grad_norm, &grad_norm);
        if (rc == 0)
            rc = backward_and_update(&r, step, lr, version);
        if (rc == 0)
            done = step;
        int durable = step == o->steps || (o->checkpoint_every && step % o->checkpoint_every == 0);
        int do_eval = rc == 0 && (step == o->steps || (o->eval_every && step % o->eval_every == 0));
        if (rc == 0 && (durable || do_eval)) /* the updates still running, done */
            rc = fy_optq_drain(&r.opt);
        double seconds = now_s() - t0;
        double phase[FY_TICKET_WORKERS], busy[FY_TICKET_BUSY_COUNT];
        uint64_t bytes[FY_TICKET_BUSY_COUNT];
        memcpy(phase, r.tk.wait_s, sizeof phase);
        memcpy(busy, r.tk.busy_s, sizeof busy);
        memcpy(bytes, r.tk.busy_bytes, sizeof bytes);
        if (rc == 0 && do_eval && o->eval_batches > 0)
            rc = eval_loss(&r, data, o->eval_batches, &eval);
        /* The step's metrics line goes before its commit: a commit that a crash cuts off after
         * its record is durable still counts, and the line must be there for it (a line past the
         * last commit is dropped when the run goes back). The commit's time is its own. */
        if (rc == 0)
            rc = log_step(o, &meta->model, step, loss, lr, grad_norm, seconds, phase, busy, bytes,
                          do_eval && o->eval_batches > 0, eval);
        if (rc == 0 && o->plan_step_s > 0 && step == first + 1 && seconds > 0)
            log_plan_check(o, &meta->model, step, seconds, busy, bytes);
        if (rc == 0 && o->ssd_seen != NULL && step > first)
            fy_diskrates_add(o->ssd_seen, step, bytes[FY_TICKET_BUSY_SSD_READ], busy[FY_TICKET_BUSY_SSD_READ],
                             bytes[FY_TICKET_BUSY_SSD_WRITE], busy[FY_TICKET_BUSY_SSD_WRITE]);
        if (rc == 0 && durable) {
            double c0 = now_s();
            rc = commit(&r, meta, step);
            if (rc == 0 && now_s() - c0 > 1.0)
                fy_info("step %llu committed in %.1f s", (unsigned long long)step, now_s() - c0);
        }
    }
    int drained = fy_optq_drain(&r.opt); /* a stop at a step boundary leaves updates running */
    rc = rc ? rc : drained;
    if (rc == 0 && done > meta->step) { /* stopped early: the last step committed, as at the end */
        rc = commit(&r, meta, done);
        if (rc == 0)
            fy_info("step %llu committed to the store", (unsigned long long)meta->step);
    }
    if (rc == 0 && metrics_full)
        rc = fy_metrics_stopped(o->metrics, meta->step);
    drained = fy_spill_drain(&r.ckpt);
    rc = rc ? rc : drained;
    drained = fy_spill_drain(&r.saved);
    rc = rc ? rc : drained;
    fy_ticket_trace_end(&r.tk);
    free(version);
    free(resident);
    free(wcopy);
    fy_optq_free(&r.opt);
    free(r.row_touched);
    free(r.host_mask);
    free(r.ssd_mask);
    free(r.host_off);
    free(r.at_copy);
    free(r.digest);
    return rc;
}

struct export_ctx {
    struct run *r;
    const struct fy_storemeta *meta;
};

static int export_unit(void *ctx, unsigned unit, float *params)
{
    const struct export_ctx *e = ctx;
    struct run *r = e->r;
    FY_TRY(fy_commit_read_unit(r->tk.x, e->meta, unit, r->l.state, r->tk.timeout_ms));
    memcpy(params, fy_commit_unit_master(r->pool, e->meta, unit, r->l.state),
           fy_gpt_unit_params(r->l.c, unit) * sizeof *params);
    return 0;
}

int fy_train_export_store(const struct fy_exec *x, struct fy_pool *pool,
                          struct fy_storemeta *meta, const char *path, int overwrite, int beside,
                          int timeout_ms)
{
    struct run r;
    const struct fy_plan_shape one = {.c = &meta->model, .B = 1, .T = 1, .act_dtype = FY_DTYPE_F32};
    FY_TRY(run_init(&r, pool, &one, x, timeout_ms));
    struct fy_commit_export passed = {0};
    /* a run training meanwhile can commit over what is read; damaged state: the commit before */
    for (int moved = 0;; moved++) {
        struct export_ctx ctx = {&r, meta};
        int rc = fy_weights_write(path, &meta->model, meta->step, overwrite, export_unit, &ctx);
        if (!fy_commit_is_damage(rc) || moved == FY_TRAIN_EXPORT_RETRIES)
            return rc;
        FY_TRY(fy_commit_export_next(x, pool, r.l.meta, path, beside, &passed, meta,
                                     timeout_ms));
    }
}

int fy_train_export(const struct fy_exec *x, struct fy_pool *pool, struct fy_storemeta *meta,
                    const char *path, int overwrite, int timeout_ms)
{
    return fy_train_export_store(x, pool, meta, path, overwrite, 0, timeout_ms);
}
