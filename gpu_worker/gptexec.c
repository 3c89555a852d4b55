/* GPT requests of the gpu worker: validation of each part against the run's model and batch, then
 * one backend call per request. Nothing in a descriptor is trusted: sizes are exact, tokens are
 * checked against the vocabulary before they index an embedding table. */
#include "gptexec.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"
#include "common/base/dtype.h"
#include "common/base/knobs.h"
#include "gpu_worker/ranks.h"

struct fy_gptexec {
    struct fy_backend *backend;
    struct fy_model_config cfg;
    int B, T;
    int act_dtype; /* of activations and their gradients in the pool (train.act_dtype) */
    uint64_t act_bytes, tok_bytes;
    struct fy_actplan_sizes saved_sizes; /* of the kinds in saved regions, the backend's layout */
    int queues; /* the backend queues calls (fy_backend_model_set_queued) */
    int holds;  /* block gradients held on the device (train.grad_hold) */
    /* several gpu workers (train.ranks): this one's rank, its share of every batch-shaped region
     * (B / ranks sequences, at rank x the share's bytes), and where the backend sums nothing
     * itself, the sum of the ranks' gradients through the pool (gpu_worker/ranks) */
    int rank, ranks;
    uint64_t act_share, tok_share;
    struct fy_ranks *sum;
    /* requests queued on the backend, oldest at `first`: where a head's loss lands */
    struct {
        int head;
        double loss;
    } queued[FY_BACKEND_QUEUE];
    unsigned first, count;
};

/* This worker joins the others of the run. Where the backend sums gradients itself (NCCL), rank 0
 * makes the group's id and puts it in the pool's ranks region (its length, then the id) and every
 * rank joins with it, each waiting for all; else the gradients are summed through the pool, which
 * needs room here for the largest unit's gradient. */
static int join_ranks(struct fy_gptexec *e, const struct fy_pool *pool)
{
    /* the longest a rank waits for the one before it: a backstop only, as long as the longest
     * request deadline the launcher sets (an hour), which finds a stuck worker first; a rank whose
     * process is gone is given up on at once (gpu_worker/ranks) */
    const int wait_ms = 3600 * 1000;
    /* the largest unit's, or the head's two (the final unit's and the embeddings') */
    size_t most = fy_model_unit_params(&e->cfg, 0) +
                  fy_model_unit_params(&e->cfg, e->cfg.n_layer + 1);
    for (unsigned u = 0; u < fy_model_unit_count(&e->cfg); u++) {
        size_t n = fy_model_unit_params(&e->cfg, u);
        most = n > most ? n : most;
    }
    int sums = fy_backend_model_sums_ranks(e->backend);
    struct fy_ranks *r;
    FY_TRY(fy_ranks_new(&r, pool, e->rank, e->ranks, sums ? 0 : most, wait_ms));
    if (!sums) {
        e->sum = r;
        return 0;
    }
    size_t room;
    uint64_t *area = fy_ranks_id_area(r, &room);
    int rc;
    if (e->rank == 0) {
        int len = fy_backend_model_rank_id(e->backend, area + 1, room - sizeof *area);
        FY_TRY_OUT(rc, len);
        area[0] = (uint64_t)len;
        FY_TRY_OUT(rc, fy_ranks_id_ready(r));
    } else {
        FY_TRY_OUT(rc, fy_ranks_id_wait(r));
    }
    if (area[0] > room - sizeof *area) {
        fy_error("gpu worker %d: the group id in the pool says %llu bytes, more than its %zu",
                 e->rank, (unsigned long long)area[0], room - sizeof *area);
        rc = -EPROTO;
        goto out;
    }
    FY_TRY_OUT(rc,
               fy_backend_model_ranks(e->backend, e->rank, e->ranks, area + 1, (size_t)area[0]));
    fy_info("gpu worker %d of %d: joined the group; the backend sums the gradients", e->rank,
            e->ranks);
out:
    fy_ranks_destroy(&r);
    return rc;
}

/* The run's model and batch (model.*, train.batch, train.seq), the activations' dtype in the pool
 * (train.act_dtype), and this worker's rank and share of the batch (train.ranks, train.rank). */
static int read_batch(struct fy_gptexec *e, const struct fy_config *cfg)
{
    uint64_t B = 0, T = 0, rank = 0, ranks = 1;
    FY_TRY(fy_model_config_from(cfg, &e->cfg));
    FY_TRY(fy_config_get_u64(cfg, "train.batch", 1, 0, &B));
    FY_TRY(fy_config_get_u64(cfg, "train.seq", 1, 0, &T));
    FY_REQUIRE(B != 0 && T != 0 && B <= 1 << 20 && T <= e->cfg.ctx, -EINVAL,
               "%s: batch %llu x sequence %llu: need both >= 1 and sequence <= context %u",
               cfg->path, (unsigned long long)B, (unsigned long long)T, e->cfg.ctx);
    const char *act = fy_config_get(cfg, "train.act_dtype");
    e->act_dtype = act == NULL || strcmp(act, "f32") == 0 ? FY_DTYPE_F32
                   : strcmp(act, "bf16") == 0         ? FY_DTYPE_BF16
                                                      : FY_DTYPE_NONE;
    FY_REQUIRE(e->act_dtype != FY_DTYPE_NONE, -EINVAL, "%s: train.act_dtype = %s: use f32 or bf16",
               cfg->path, act);
    FY_TRY(fy_config_get_u64(cfg, "train.ranks", 0, 1, &ranks));
    FY_TRY(fy_config_get_u64(cfg, "train.rank", 0, 0, &rank));
    FY_REQUIRE(ranks >= 1 && rank < ranks && B % ranks == 0, -EINVAL,
               "%s: gpu worker of rank %llu of %llu with a batch of %llu: need rank < ranks and "
               "the batch a multiple of the ranks (--batch, --gpus)",
               cfg->path, (unsigned long long)rank, (unsigned long long)ranks,
               (unsigned long long)B);
    e->rank = (int)rank;
    e->ranks = (int)ranks;
    e->B = (int)(B / ranks); /* this worker's share */
    e->T = (int)T;
    e->act_bytes = (uint64_t)B * T * e->cfg.n_embd * fy_dtype_size(e->act_dtype);
    e->tok_bytes = (uint64_t)B * T * 4;
    e->act_share = e->act_bytes / ranks;
    e->tok_share = e->tok_bytes / ranks;
    return 0;
}

/* The backend prepared for this worker's share of the batch, and joined with the other workers. */
static int prepare(struct fy_gptexec *e, struct fy_backend *backend, const struct fy_pool *pool)
{
    e->backend = backend;
    FY_TRY(fy_backend_model_prepare(backend, &e->cfg, e->B, e->T));
    FY_TRY(fy_backend_model_act_dtype(backend, e->act_dtype));
    FY_TRY(
        fy_actplan_sizes_backend(&e->cfg, e->B, e->T, fy_backend_name(backend), &e->saved_sizes));
    return e->ranks > 1 ? join_ranks(e, pool) : 0;
}

/* train.grad_hold: one-pass clipping holds this many block gradients on the device, taken before
 * the swap and kept sets. */
static int hold_gradients(struct fy_gptexec *e, const struct fy_config *cfg)
{
    uint64_t hold = 0;
    FY_TRY(fy_config_get_u64(cfg, "train.grad_hold", 0, 0, &hold));
    FY_REQUIRE(hold == 0 || e->ranks <= 1, -EINVAL,
               "%s: train.grad_hold = %llu with %d gpu workers: gradients held on the GPUs are "
               "for one worker; use --clip-hold pool (or auto) with --gpus",
               cfg->path, (unsigned long long)hold, e->ranks);
    FY_REQUIRE(hold <= e->cfg.n_layer, -EINVAL,
               "%s: train.grad_hold = %llu: at most the model's %u blocks", cfg->path,
               (unsigned long long)hold, e->cfg.n_layer);
    if (hold > 0) {
        FY_TRY(fy_backend_model_hold(e->backend, (int)hold));
        fy_info("gpu worker: the gradients of %llu blocks held here from the norm pass to their "
                "updates (one-pass clipping, train.grad_hold)",
                (unsigned long long)hold);
    }
    e->holds = (int)hold;
    return 0;
}

/* The internals of at most `keep` top blocks kept in the device memory left over. */
static int keep_blocks(struct fy_gptexec *e, uint64_t keep)
{
    /* test hook: FUYOU_TEST_KEEP_LAYERS=N keeps at most N blocks, whatever fits */
    int most = (int)keep;
    if (fy_knob_test_keep_layers(&most))
        fy_info("test hook: at most %d blocks keep their internals (FUYOU_TEST_KEEP_LAYERS)", most);
    most = most < (int)keep ? most : (int)keep;
    int kept = most > 0 ? fy_backend_model_keep(e->backend, most) : 0;
    return kept < 0 ? kept : 0;
}

/* What the backend readies in device memory beside its working buffers, in the order it takes
 * it: held gradients (train.grad_hold), the swap sets and the kept sets (train.act_plan: "auto"
 * keeps the internals of the blocks that fit in the GPU budget, their backward then recomputing
 * nothing; "recompute" keeps none; "host" and "ssd" swap them through the pool). */
static int ready_device_memory(struct fy_gptexec *e, const struct fy_config *cfg)
{
    const char *plan = fy_config_get(cfg, "train.act_plan");
    enum fy_actplan_mode mode = FY_ACTPLAN_AUTO;
    FY_REQUIRE(plan == NULL || fy_actplan_mode_parse(plan, &mode) >= 0, -EINVAL,
               "%s: train.act_plan = %s: use auto, recompute, host or ssd", cfg->path, plan);
    /* auto: the launcher's plan says whether blocks swap (train.act_swap) and how many top blocks
     * to keep at most (train.act_keep; absent: as many as fit) */
    uint64_t swap = 0, keep = e->cfg.n_layer;
    if (mode == FY_ACTPLAN_AUTO) {
        FY_TRY(fy_config_get_u64(cfg, "train.act_swap", 0, 0, &swap));
        FY_TRY(fy_config_get_u64(cfg, "train.act_keep", 0, e->cfg.n_layer, &keep));
    }
    FY_TRY(hold_gradients(e, cfg));
    int swaps = mode == FY_ACTPLAN_HOST || mode == FY_ACTPLAN_SSD || swap;
    FY_REQUIRE(!swaps || e->ranks <= 1, -ENOTSUP,
               "%s: blocks' internals swapped through the pool (train.act_plan %s) with %d gpu "
               "workers: not supported; use --act-plan auto or recompute with --gpus",
               cfg->path, plan ? plan : "auto", e->ranks);
    if (swaps)
        FY_TRY(fy_backend_model_swap(e->backend));
    return plan != NULL && mode == FY_ACTPLAN_AUTO ? keep_blocks(e, keep) : 0;
}

/* Whether requests queue on the backend (FUYOU_GPU_QUEUE=1 completes every request before taking
 * the next, for comparisons). */
static int queue_mode(struct fy_gptexec *e, const struct fy_config *cfg)
{
    int one_at_a_time = fy_knob_gpu_one_at_a_time();
    if (one_at_a_time)
        fy_info("FUYOU_GPU_QUEUE=1: each GPT request completes before the next one starts");
    e->queues = fy_backend_model_set_queued(e->backend, !one_at_a_time);
    FY_REQUIRE(!e->queues || e->sum == NULL, -ENOTSUP, /* the sum needs each call complete */
               "%s: the %s backend of this build has no NCCL to sum the gradients of several "
               "gpu workers: install NCCL (Debian libnccl-dev, or pip install nvidia-nccl-cu12, "
               "or set NCCL_HOME) and rebuild with make, or use --gpus 1",
               cfg->path, fy_backend_name(e->backend));
    return 0;
}

int fy_gptexec_new(struct fy_gptexec **out, struct fy_backend *backend, const struct fy_config *cfg,
                   const struct fy_pool *pool)
{
    *out = NULL;
    struct fy_gptexec *e = calloc(1, sizeof *e);
    if (e == NULL)
        return -ENOMEM;
    int rc;
    FY_TRY_OUT(rc, read_batch(e, cfg));
    FY_TRY_OUT(rc, prepare(e, backend, pool));
    FY_TRY_OUT(rc, ready_device_memory(e, cfg));
    FY_TRY_OUT(rc, queue_mode(e, cfg));
    *out = e;
    return 0;
out:
    fy_gptexec_destroy(&e);
    return rc;
}

void fy_gptexec_destroy(struct fy_gptexec **ep)
{
    if (ep == NULL || *ep == NULL)
        return;
    fy_ranks_destroy(&(*ep)->sum);
    free(*ep);
    *ep = NULL;
}

int fy_gptexec_handles(int op)
{
    return (op >= FY_OP_GPT_EMBED_FWD && op <= FY_OP_GPT_EMBED_BWD) || op == FY_OP_GPT_PROFILE ||
           op == FY_OP_GPT_GRAD_SEND;
}

/* The saved parts from part `first` on (none, one or two) into *saved; *any = whether there were. */
static int saved_parts(const struct fy_gptexec *e, const struct fy_pool *pool,
                       const struct fy_desc *req, unsigned n, unsigned first,
                       struct fy_block_saved *saved, int *any)
{
    memset(saved, 0, sizeof *saved);
    *any = n > first;
    FY_REQUIRE(n <= first + 2, -EPROTO, "%s: %u parts: at most %u (two saved regions)",
               fy_op_name(req[0].op), n, first + 2);
    unsigned seen = 0;
    for (unsigned i = first; i < n; i++) {
        const struct fy_desc *d = &req[i];
        unsigned mask = (unsigned)d->arg;
        struct fy_actplan_region reg;
        FY_REQUIRE(d->kind == FY_KIND_SAVED && d->arg == mask && mask != 0 &&
                       (mask & ~FY_ACT_SWAPPABLE) == 0 && (mask & seen) == 0,
                   -EPROTO, "%s part %u: expected a saved region of new swappable kinds, got %s "
                   "with kinds 0x%llx", fy_op_name(req[0].op), i, fy_kind_name(d->kind),
                   (unsigned long long)d->arg);
        FY_TRY(fy_actplan_region_of(&e->saved_sizes, mask, &reg));
        FY_REQUIRE(d->bytes == reg.bytes, -EPROTO,
                   "%s part %u: a saved region of kinds 0x%x is %llu bytes, not %llu",
                   fy_op_name(req[0].op), i, mask, (unsigned long long)reg.bytes,
                   (unsigned long long)d->bytes);
        char *base = fy_pool_at(pool, d->offset, d->bytes);
        FY_REQUIRE(base != NULL, -ERANGE, "%s part %u: region outside the pool",
                   fy_op_name(req[0].op), i);
        for (int k = 0; k < FY_ACT_KINDS; k++)
            if (mask & FY_ACT_BIT(k))
                saved->at[k] = base + reg.offset[k];
        seen |= mask;
    }
    return 0;
}

/* Checks part i of the request and returns its address in the pool. */
static int part(const struct fy_pool *pool, const struct fy_desc *req, unsigned n, unsigned i,
                int kind, int dtype, uint64_t bytes, void **ptr)
{
    FY_REQUIRE(i < n, -EPROTO, "%s: part %u missing (%u parts given)", fy_op_name(req[0].op), i, n);
    const struct fy_desc *d = &req[i];
    FY_REQUIRE(d->kind == kind && d->dtype == dtype && d->bytes == bytes, -EPROTO,
               "%s part %u: expected %s %s of %llu bytes, got %s %s of %llu bytes",
               fy_op_name(req[0].op), i, fy_kind_name(kind), fy_dtype_name(dtype),
               (unsigned long long)bytes, fy_kind_name(d->kind), fy_dtype_name(d->dtype),
               (unsigned long long)d->bytes);
    *ptr = fy_pool_at(pool, d->offset, d->bytes);
    FY_REQUIRE(*ptr != NULL, -ERANGE, "%s part %u: region outside the pool", fy_op_name(req[0].op), i);
    return 0;
}

/* The weights' dtype of a request (f32, or bf16: half the bytes, for a backend that computes in
 * bf16), from its part i, which the backend is switched to for this call; every weights part of
 * the request must have it (part() checks). */
static int weights_dtype(struct fy_gptexec *e, const struct fy_desc *req, unsigned n, unsigned i,
                         int *dtype)
{
    FY_REQUIRE(i < n, -EPROTO, "%s: part %u missing (%u parts given)", fy_op_name(req[0].op), i, n);
    *dtype = req[i].dtype;
    FY_REQUIRE(*dtype == FY_DTYPE_F32 || *dtype == FY_DTYPE_BF16, -EPROTO,
               "%s part %u: weights must be f32 or bf16, not %s", fy_op_name(req[0].op), i,
               fy_dtype_name(*dtype));
    return fy_backend_model_weight_dtype(e->backend, *dtype);
}

/* The device buffer of held gradients that part i's arg names (k > 0: buffer k - 1) into *held,
 * -1 for none where `optional`. */
static int held_buffer(const struct fy_gptexec *e, const struct fy_desc *req, unsigned i,
                       int optional, int *held)
{
    uint64_t k = req[i].arg;
    *held = (int)k - 1;
    FY_REQUIRE((k == 0 && optional) || (k >= 1 && k <= (uint64_t)e->holds), -EPROTO,
               "%s part %u: held gradient buffer %llu, but the worker holds %d (train.grad_hold)",
               fy_op_name(req[0].op), i, (unsigned long long)k, e->holds);
    return 0;
}

static int check_tokens(const int32_t *tok, size_t n, uint32_t vocab, int allow_ignored,
                        const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (tok[i] >= (int32_t)vocab || (tok[i] < 0 && !allow_ignored)) {
            fy_error("%s: token %d at position %zu is outside the vocabulary of %u", what, tok[i], i,
                     vocab);
            return -EINVAL;
        }
    return 0;
}

/* This worker's share of a batch-shaped part (tokens, activations, their gradients) at p, whose
 * whole is `bytes`: the rank-th of the ranks' equal shares. */
static void *share(const struct fy_gptexec *e, void *p, uint64_t bytes)
{
    return (char *)p + (uint64_t)e->rank * (bytes / (uint64_t)e->ranks);
}

/* The positions of this worker's share (rows of T), checked: each in 0..t (t its token's place in
 * the row) and below the context, and each either 0 (a document's first token) or one more than
 * the position before it (a document is a contiguous run of a row). */
static int check_positions(const struct fy_gptexec *e, const int32_t *pos, const char *op)
{
    for (int r = 0; r < e->B; r++)
        for (int t = 0; t < e->T; t++) {
            int32_t p = pos[(size_t)r * e->T + t];
            if (p < 0 || p > t || (uint32_t)p >= e->cfg.ctx) {
                fy_error("%s positions: row %d (of this worker's %d), token %d has position %d: a "
                         "token's position in its document is in 0..%d (its place in the row) and "
                         "below the model's context %u",
                         op, r, e->B, t, (int)p, t, e->cfg.ctx);
                return -EINVAL;
            }
            if (p != 0 && p != pos[(size_t)r * e->T + t - 1] + 1) {
                fy_error("%s positions: row %d (of this worker's %d), token %d has position %d "
                         "after %d: a document's positions run 0, 1, 2, ... (a new document "
                         "starts at 0)",
                         op, r, e->B, t, (int)p, (int)pos[(size_t)r * e->T + t - 1]);
                return -EINVAL;
            }
        }
    return 0;
}

/* The optional positions part at index `at` (FY_KIND_TOKENS, I32, the whole batch's B x T, this
 * worker's share taken and checked) into *pos, NULL where the request has none (positions t: the
 * windows of the token stream); *next: the index of the part after it. */
static int positions_part(const struct fy_gptexec *e, const struct fy_pool *pool,
                          const struct fy_desc *req, unsigned n, unsigned at, const int32_t **pos,
                          unsigned *next)
{
    *pos = NULL;
    *next = at;
    if (at >= n || req[at].kind != FY_KIND_TOKENS)
        return 0;
    void *p;
    FY_TRY(part(pool, req, n, at, FY_KIND_TOKENS, FY_DTYPE_I32, e->tok_bytes, &p));
    p = share(e, p, e->tok_bytes);
    FY_TRY(check_positions(e, p, fy_op_name(req[0].op)));
    *pos = p;
    *next = at + 1;
    return 0;
}

/* Where this worker computes a gradient of n floats bound for pool memory `to` (fy_ranks_target;
 * `to` itself with one worker or a backend that sums). */
static float *grad_target(struct fy_gptexec *e, void *to, uint64_t n, int accumulates, size_t at)
{
    return e->sum != NULL ? fy_ranks_target(e->sum, to, n, accumulates, at) : to;
}

/* After the backend computed gradients at grad_target's addresses: summed into `to` in rank order
 * (nothing with one worker or a backend that sums). */
static int grad_sum(struct fy_gptexec *e, int rc, void *to, uint64_t n, size_t at)
{
    return rc == 0 && e->sum != NULL ? fy_ranks_sum(e->sum, to, n, at) : rc;
}

/* The targets >= 0 of the whole batch, which every worker's head averages over. */
static uint64_t batch_targets(const struct fy_gptexec *e, const int32_t *targets)
{
    uint64_t n = 0, all = e->tok_bytes / 4;
    for (uint64_t i = 0; i < all; i++)
        n += targets[i] >= 0;
    return n;
}

/* The sizes of the model's units: floats of the embeddings, a block and the final unit. */
struct unit_sizes {
    uint64_t embed_n, block_n, final_n;
};

static struct unit_sizes sizes_of(const struct fy_model_config *c)
{
    return (struct unit_sizes){fy_model_unit_params(c, 0), fy_model_unit_params(c, 1),
                               fy_model_unit_params(c, c->n_layer + 1)};
}

/* gpt-embed-fwd: tokens, W embed, A x0 (out) [, P]. */
static int embed_forward_request(struct fy_gptexec *e, const struct fy_pool *pool,
                                 const struct fy_desc *req, unsigned n)
{
    uint64_t embed_n = sizes_of(&e->cfg).embed_n;
    void *tokens, *embed, *x;
    const int32_t *pos;
    unsigned next;
    int WT;
    FY_TRY(part(pool, req, n, 0, FY_KIND_TOKENS, FY_DTYPE_I32, e->tok_bytes, &tokens));
    FY_TRY(weights_dtype(e, req, n, 1, &WT));
    FY_TRY(part(pool, req, n, 1, FY_KIND_WEIGHTS, WT, embed_n * fy_dtype_size(WT), &embed));
    FY_TRY(part(pool, req, n, 2, FY_KIND_ACTIVATION, e->act_dtype, e->act_bytes, &x));
    tokens = share(e, tokens, e->tok_bytes);
    x = share(e, x, e->act_bytes);
    FY_TRY(check_tokens(tokens, (size_t)e->B * e->T, e->cfg.vocab, 0, "gpt-embed-fwd inputs"));
    FY_TRY(positions_part(e, pool, req, n, 3, &pos, &next));
    FY_REQUIRE(n == next, -EPROTO,
               "gpt-embed-fwd: %u parts, expected %u (tokens, weights, x0, "
               "optionally positions)",
               n, next);
    return fy_backend_model_embed_forward(e->backend, embed, tokens, pos, x);
}

/* gpt-block-fwd: W block, A x, A y (out) [, P] [, S saved (out)...]; gpt-block-bwd: W block, A x,
 * G dy, G dx (out), G dparams (out) [, P] [, S saved (in)...]. */
static int block_request(struct fy_gptexec *e, const struct fy_pool *pool,
                         const struct fy_desc *req, unsigned n)
{
    const struct fy_model_config *c = &e->cfg;
    const int A = FY_KIND_ACTIVATION, G = FY_KIND_GRAD, ACT = e->act_dtype;
    uint64_t block_n = sizes_of(c).block_n;
    int layer = req[0].layer, forward = req[0].op == FY_OP_GPT_BLOCK_FWD, WT, held, any;
    void *p[5];
    const int32_t *pos;
    unsigned next;
    struct fy_block_saved saved;
    FY_REQUIRE(layer >= 1 && (uint32_t)layer <= c->n_layer, -EPROTO,
               "%s: layer %d is not a block (1..%u)", fy_op_name(req[0].op), layer, c->n_layer);
    FY_TRY(weights_dtype(e, req, n, 0, &WT));
    FY_TRY(part(pool, req, n, 0, FY_KIND_WEIGHTS, WT, block_n * fy_dtype_size(WT), &p[0]));
    FY_TRY(part(pool, req, n, 1, A, ACT, e->act_bytes, &p[1]));
    p[1] = share(e, p[1], e->act_bytes);
    /* the fixed parts, then the positions where given, then any saved parts */
    FY_TRY(positions_part(e, pool, req, n, forward ? 3u : 5u, &pos, &next));
    FY_REQUIRE(e->ranks == 1 || n <= next, -EPROTO,
               "%s: saved internals with %d gpu workers: not supported", fy_op_name(req[0].op),
               e->ranks);
    if (forward) {
        FY_TRY(part(pool, req, n, 2, A, ACT, e->act_bytes, &p[2]));
        p[2] = share(e, p[2], e->act_bytes);
        FY_TRY(saved_parts(e, pool, req, n, next, &saved, &any));
        return fy_backend_model_block_forward(e->backend, layer, p[0], pos, p[1], p[2],
                                              any ? &saved : NULL);
    }
    FY_TRY(part(pool, req, n, 2, G, ACT, e->act_bytes, &p[2]));
    FY_TRY(part(pool, req, n, 3, G, ACT, e->act_bytes, &p[3]));
    FY_TRY(part(pool, req, n, 4, G, FY_DTYPE_F32, block_n * 4, &p[4]));
    FY_TRY(saved_parts(e, pool, req, n, next, &saved, &any));
    FY_TRY(held_buffer(e, req, 4, 1, &held));
    p[2] = share(e, p[2], e->act_bytes);
    p[3] = share(e, p[3], e->act_bytes);
    float *dparams = grad_target(e, p[4], block_n, 0, 0);
    if (held >= 0) /* this backward's gradient is kept in the buffer too */
        FY_TRY(fy_backend_model_hold_next(e->backend, held));
    return grad_sum(e,
                    fy_backend_model_block_backward(e->backend, layer, p[0], pos, p[1], p[2], p[3],
                                                    dparams, any ? &saved : NULL),
                    p[4], block_n, 0);
}

/* gpt-grad-send: G dparams (out), the held buffer named in its arg. */
static int grad_send_request(struct fy_gptexec *e, const struct fy_pool *pool,
                             const struct fy_desc *req, unsigned n)
{
    const struct fy_model_config *c = &e->cfg;
    int layer = req[0].layer, held;
    void *dparams;
    FY_REQUIRE(n == 1 && layer >= 1 && (uint32_t)layer <= c->n_layer, -EPROTO,
               "gpt-grad-send takes one part for a block (1..%u), got %u for layer %d", c->n_layer,
               n, layer);
    FY_TRY(part(pool, req, n, 0, FY_KIND_GRAD, FY_DTYPE_F32, sizes_of(c).block_n * 4, &dparams));
    FY_TRY(held_buffer(e, req, 0, 0, &held));
    return fy_backend_model_hold_send(e->backend, held, dparams);
}

/* gpt-head: A x, tokens targets, W final, W embed [, G dx (out), G dfinal (out), G dembed (out)];
 * the loss into *loss. */
static int head_request(struct fy_gptexec *e, const struct fy_pool *pool, const struct fy_desc *req,
                        unsigned n, double *loss)
{
    const int A = FY_KIND_ACTIVATION, G = FY_KIND_GRAD, W = FY_KIND_WEIGHTS, F32 = FY_DTYPE_F32;
    struct unit_sizes u = sizes_of(&e->cfg);
    void *p[7];
    int WT;
    FY_REQUIRE(n == 4 || n == 7, -EPROTO,
               "gpt-head takes 4 parts (loss) or 7 (with gradients), got %u", n);
    FY_TRY(part(pool, req, n, 0, A, e->act_dtype, e->act_bytes, &p[0]));
    FY_TRY(part(pool, req, n, 1, FY_KIND_TOKENS, FY_DTYPE_I32, e->tok_bytes, &p[1]));
    FY_TRY(weights_dtype(e, req, n, 2, &WT));
    FY_TRY(part(pool, req, n, 2, W, WT, u.final_n * fy_dtype_size(WT), &p[2]));
    FY_TRY(part(pool, req, n, 3, W, WT, u.embed_n * fy_dtype_size(WT), &p[3]));
    if (e->ranks > 1) /* every worker's share averaged over the whole batch's targets */
        FY_TRY(fy_backend_model_loss_count(e->backend, batch_targets(e, p[1])));
    p[0] = share(e, p[0], e->act_bytes);
    p[1] = share(e, p[1], e->tok_bytes);
    FY_TRY(check_tokens(p[1], (size_t)e->B * e->T, e->cfg.vocab, 1, "gpt-head targets"));
    p[4] = p[5] = p[6] = NULL;
    float *dfinal = NULL, *dembed = NULL;
    if (n == 7) {
        FY_TRY(part(pool, req, n, 4, G, e->act_dtype, e->act_bytes, &p[4]));
        FY_TRY(part(pool, req, n, 5, G, F32, u.final_n * 4, &p[5]));
        FY_TRY(part(pool, req, n, 6, G, F32, u.embed_n * 4, &p[6]));
        p[4] = share(e, p[4], e->act_bytes);
        /* a worker of rank > 0 has room for both: the final unit's, then the embeddings' */
        dfinal = grad_target(e, p[5], u.final_n, 0, 0);
        dembed = grad_target(e, p[6], u.embed_n, 0, u.final_n);
    }
    int rc = fy_backend_model_head(e->backend, p[2], p[3], p[0], p[1], loss, p[4], dfinal, dembed);
    if (n == 7)
        rc = grad_sum(e, grad_sum(e, rc, p[5], u.final_n, 0), p[6], u.embed_n, u.final_n);
    return rc;
}

/* gpt-profile: raw (copied through to time the links), raw (out: struct fy_block_profile). */
static int profile_request(struct fy_gptexec *e, const struct fy_pool *pool,
                           const struct fy_desc *req, unsigned n)
{
    FY_REQUIRE(n == 2 && req[0].kind == FY_KIND_RAW && req[1].kind == FY_KIND_RAW &&
                   req[1].bytes >= sizeof(struct fy_block_profile),
               -EPROTO,
               "gpt-profile takes 2 raw parts (copies, then >= %zu bytes for the "
               "result), got %u",
               sizeof(struct fy_block_profile), n);
    void *copies = fy_pool_at(pool, req[0].offset, req[0].bytes);
    void *result = fy_pool_at(pool, req[1].offset, req[1].bytes);
    FY_REQUIRE(copies != NULL && result != NULL, -ERANGE, "gpt-profile: region outside the pool");
    struct fy_block_profile prof;
    FY_TRY(fy_backend_model_profile(e->backend, copies, req[0].bytes, &prof));
    memcpy(result, &prof, sizeof prof);
    return 0;
}

/* gpt-embed-bwd: tokens, G dx0, G dembed (accumulated) [, P]. */
static int embed_backward_request(struct fy_gptexec *e, const struct fy_pool *pool,
                                  const struct fy_desc *req, unsigned n)
{
    uint64_t embed_n = sizes_of(&e->cfg).embed_n;
    void *tokens, *dx, *dembed_pool;
    const int32_t *pos;
    unsigned next;
    FY_TRY(part(pool, req, n, 0, FY_KIND_TOKENS, FY_DTYPE_I32, e->tok_bytes, &tokens));
    FY_TRY(part(pool, req, n, 1, FY_KIND_GRAD, e->act_dtype, e->act_bytes, &dx));
    FY_TRY(part(pool, req, n, 2, FY_KIND_GRAD, FY_DTYPE_F32, embed_n * 4, &dembed_pool));
    tokens = share(e, tokens, e->tok_bytes);
    dx = share(e, dx, e->act_bytes);
    FY_TRY(check_tokens(tokens, (size_t)e->B * e->T, e->cfg.vocab, 0, "gpt-embed-bwd inputs"));
    FY_TRY(positions_part(e, pool, req, n, 3, &pos, &next));
    FY_REQUIRE(n == next, -EPROTO,
               "gpt-embed-bwd: %u parts, expected %u (tokens, dx0, dembed, "
               "optionally positions)",
               n, next);
    float *dembed = grad_target(e, dembed_pool, embed_n, 1, 0);
    return grad_sum(e, fy_backend_model_embed_backward(e->backend, tokens, pos, dx, dembed),
                    dembed_pool, embed_n, 0);
}

/* Checks the request and calls the backend, which may only queue the work; a head's loss goes to
 * *loss (written when the call completes). With several workers, each computes its share of the
 * batch and the gradients are summed over them. */
static int dispatch(struct fy_gptexec *e, const struct fy_pool *pool, const struct fy_desc *req,
                    unsigned n, double *loss)
{
    switch (req[0].op) {
    case FY_OP_GPT_EMBED_FWD:
        return embed_forward_request(e, pool, req, n);
    case FY_OP_GPT_BLOCK_FWD:
    case FY_OP_GPT_BLOCK_BWD:
        return block_request(e, pool, req, n);
    case FY_OP_GPT_GRAD_SEND:
        return grad_send_request(e, pool, req, n);
    case FY_OP_GPT_HEAD:
        return head_request(e, pool, req, n, loss);
    case FY_OP_GPT_PROFILE:
        return profile_request(e, pool, req, n);
    case FY_OP_GPT_EMBED_BWD:
        return embed_backward_request(e, pool, req, n);
    default:
        fy_error("gpu worker: op %s is not a GPT operation", fy_op_name(req[0].op));
        return -EPROTO;
    }
}

int fy_gptexec_start(struct fy_gptexec *e, const struct fy_pool *pool, const struct fy_desc *req,
                     unsigned n, struct fy_desc *reply)
{
    if (req[0].op == FY_OP_GPT_PROFILE) { /* measured on the spot, never queued */
        FY_TRY(dispatch(e, pool, req, n, NULL));
        fy_desc_set_copy_times(reply, 0, 0);
        return 0;
    }
    FY_REQUIRE(e->count < FY_BACKEND_QUEUE, -EBUSY,
               "gpu worker: %u requests already queued: finish one first", e->count);
    unsigned slot = (e->first + e->count) % FY_BACKEND_QUEUE;
    e->queued[slot].head = req[0].op == FY_OP_GPT_HEAD;
    e->queued[slot].loss = 0;
    FY_TRY(dispatch(e, pool, req, n, &e->queued[slot].loss));
    if (!e->queues) { /* completed already, with no device copies timed */
        fy_desc_set_copy_times(reply, 0, 0);
        if (e->queued[slot].head)
            memcpy(&reply->arg, &e->queued[slot].loss, sizeof(double));
        return 0;
    }
    e->count++;
    return 1;
}

int fy_gptexec_finish(struct fy_gptexec *e, struct fy_desc *reply)
{
    FY_REQUIRE(e->count > 0, -EINVAL, "gpu worker: finishing with no request queued");
    unsigned slot = e->first;
    e->first = (e->first + 1) % FY_BACKEND_QUEUE;
    e->count--;
    double h2d_s, d2h_s;
    FY_TRY(fy_backend_model_finish(e->backend, &h2d_s, &d2h_s));
    fy_desc_set_copy_times(reply, h2d_s, d2h_s);
    if (e->queued[slot].head)
        memcpy(&reply->arg, &e->queued[slot].loss, sizeof(double));
    return 0;
}

int fy_gptexec_handle(struct fy_gptexec *e, const struct fy_pool *pool, const struct fy_desc *req,
                      unsigned n, struct fy_desc *reply)
{
    int rc = fy_gptexec_start(e, pool, req, n, reply);
    return rc == 1 ? fy_gptexec_finish(e, reply) : rc;
}

unsigned fy_gptexec_queue_depth(const struct fy_gptexec *e) { return e->queues ? FY_BACKEND_QUEUE : 1; }

int fy_gptexec_ready_fd(const struct fy_gptexec *e) { return fy_backend_model_ready_fd(e->backend); }
