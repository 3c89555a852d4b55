/* A model on the GPU behind the host interface (contract: cu_model.h). Each call goes through
 * cu_queue's staging: its inputs uploaded straight into its staging's device buffers, its device
 * work done by the family's units (cu_family.h: one ops table per family, chosen by the registry's
 * name), its outputs downloaded; a block backward's weight gradients go home a piece at a time
 * through a ring of device buffers (cu_gradsink.h) while it computes. Names no family: what a family
 * lacks (swapped internals, the planner's profile) is refused with its label. */
#include "gpu_worker/cuda/cu_model.h"

#include <stdlib.h>
#include <string.h>

#include "common/model/arch/arch.h"
#include "common/model/model.h"
#include "common/base/knobs.h"
#include "gpu_worker/cuda/cu_families.h"
#include "gpu_worker/cuda/cu_gradsink.h"
#include "gpu_worker/cuda/cu_head.h"
#include "gpu_worker/cuda/cu_matmul.h"
#include "gpu_worker/cuda/cu_profile.h"
#include "gpu_worker/cuda/cu_ranks.h"
#include "common/base/check.h"

/* Rows of logits per chunk of the head: large enough that its products run at full speed, small
 * enough that a chunk's logits stay within HEAD_CHUNK_BYTES however large the vocabulary. */
#define HEAD_CHUNK_BYTES (512u << 20)
#define HEAD_CHUNK_MIN 256
#define HEAD_CHUNK_MAX 4096
#define LT_WORKSPACE (32u << 20)
/* the least host memory whose copies say something about the link (fy_cu_model_profile) */
#define PROFILE_HOST_MIN (1u << 20)

struct fy_cu_model {
    struct fy_model_config c;
    const struct fy_cu_family *fam;
    void *units; /* the family's */
    int B, T, N;
    int head_rows;     /* rows per chunk of the head */
    size_t unit_max;   /* floats of the largest unit */
    size_t block_n;    /* floats of a block unit */
    size_t unit_grad_n; /* floats of the head's gradients, or the embeddings' */
    size_t piece_n;    /* floats of a gradient piece's buffer */
    size_t ring_n;     /* floats of a conversion chunk (cu_queue) */
    struct fy_cu_lt *lt;
    struct fy_cu_queue q;
    void *head_scratch;
    /* the weight gradients' buffers (unit_grad_n floats for the head's or the embeddings', piece_n
     * a block's piece), the held gradients and the group */
    struct fy_cu_gradsink sink;
    /* the family's sets of block internals (fam->set_size bytes each): FY_CU_MODEL_MAX_KEPT kept
     * sets, then one swap set per staging (the staging's swap points there) */
    char *sets;
    /* kept internals of the top `n_kept` blocks (set i: block L - n_kept + 1 + i), and whether a
     * forward has filled a set that no backward has used since */
    unsigned char kept_full[FY_CU_MODEL_MAX_KEPT];
    int n_kept;
    int swap_ready; /* every staging has its swap set */
    /* fy_cu_model_set_loss_count: the targets the head's mean is over (0: its own call's) */
    uint64_t loss_count;
    cudaEvent_t prof_ev[FY_CU_PROFILE_EVENTS]; /* fy_cu_model_profile's, made on its first call */
};

static const char *family_label(const struct fy_cu_model *m)
{
    return fy_model_arch(&m->c)->label;
}

static void *kept_set(const struct fy_cu_model *m, int k)
{
    return m->sets + (size_t)k * m->fam->set_size;
}

/* A head of its own: its weight [V][C] follows the norm in the final unit; else the head is the
 * embeddings' token rows (the first V x C of the embeddings unit). */
static int untied_head(const struct fy_model_config *c)
{
    return !fy_model_arch(c)->head_tied(c);
}

/* Floats of the final unit's norm: the whole unit but an untied head's weight. */
static size_t final_norm_n(const struct fy_model_config *c)
{
    size_t n = fy_model_unit_params(c, c->n_layer + 1);
    return untied_head(c) ? n - (size_t)c->vocab * c->n_embd : n;
}

/* ---- shape and buffers ---- */

/* The model's working buffers (the family's units take theirs after); returns how many. */
static int plan(struct fy_cu_model *m, struct fy_cu_piece *p, void **lt_ws)
{
    const struct fy_model_config *c = &m->c;
    size_t N = (size_t)m->N, C = c->n_embd, NC = N * C;
    int n = 0;
#define PIECE(field, count, type)                                                                  \
    (p[n++] = (struct fy_cu_piece){(count) * sizeof(type), (void **)&m->field})
    for (int i = 0; i < FY_CU_QUEUE; i++) {
        PIECE(q.st[i].wts, m->unit_max, bf16);
        PIECE(q.st[i].norm_wts, 2 * C, bf16);
        PIECE(q.st[i].x, NC, bf16);
        PIECE(q.st[i].dy, NC, bf16);
        PIECE(q.st[i].out, NC, bf16);
        PIECE(q.st[i].losses, N, float);
        PIECE(q.st[i].tokens, N, int32_t);
        PIECE(q.st[i].targets, N, int32_t);
        PIECE(q.st[i].positions, N, int32_t);
    }
    PIECE(sink.unit, m->unit_grad_n, float);
    for (int i = 0; i < FY_CU_GRAD_RING; i++)
        PIECE(sink.piece[i], m->piece_n, float);
    for (int i = 0; i < 2; i++) {
        PIECE(q.up.chunk[i], m->ring_n, float);
        PIECE(q.down.chunk[i], m->ring_n, float);
    }
    PIECE(head_scratch, fy_cu_head_scratch_bytes(m->head_rows, c->vocab), char);
#undef PIECE
    p[n++] = (struct fy_cu_piece){LT_WORKSPACE, lt_ws};
    return n;
}

#define MODEL_PIECES (9 * FY_CU_QUEUE + 1 + FY_CU_GRAD_RING + 4 + 2)

static void setup_shape(struct fy_cu_model *m, const struct fy_model_config *c,
                        const struct fy_cu_family *f, int B, int T)
{
    m->c = *c;
    m->B = B;
    m->T = T;
    m->N = B * T;
    size_t per_row = fy_cu_head_scratch_bytes(1, c->vocab);
    size_t rows = per_row ? HEAD_CHUNK_BYTES / per_row : HEAD_CHUNK_MAX;
    rows = rows < HEAD_CHUNK_MIN ? HEAD_CHUNK_MIN : rows > HEAD_CHUNK_MAX ? HEAD_CHUNK_MAX : rows;
    m->head_rows = (int)(rows < (size_t)m->N ? rows : (size_t)m->N);
    m->unit_max = 0;
    for (unsigned u = 0; u < fy_model_unit_count(c); u++)
        if (fy_model_unit_params(c, u) > m->unit_max)
            m->unit_max = fy_model_unit_params(c, u);
    m->block_n = fy_model_unit_params(c, 1);
    /* the head's gradients side by side (the norm's and the head weight's [V][C]), or the
     * embeddings' (the whole unit, which the lookup's gradient is added to) */
    size_t head = final_norm_n(c) + (size_t)c->vocab * c->n_embd;
    size_t embed = fy_model_unit_params(c, 0);
    m->unit_grad_n = head > embed ? head : embed;
    /* test hook: FUYOU_TEST_GRAD_PIECE_FLOATS=N slices what is larger than N floats */
    size_t cap = fy_knob_test_grad_piece_floats();
    m->piece_n = f != NULL ? f->grad_piece_max(c, cap ? cap : FY_CU_GRAD_PIECE_CAP) : 1;
    size_t nc = (size_t)m->N * c->n_embd;
    m->ring_n = fy_cu_queue_ring_floats(m->unit_max > nc ? m->unit_max : nc);
}

size_t fy_cu_model_arena_bytes(const struct fy_model_config *c, int B, int T)
{
    struct fy_cu_model m;
    memset(&m, 0, sizeof m);
    const struct fy_cu_family *f = fy_cu_family_of(c);
    setup_shape(&m, c, f, B, T);
    struct fy_cu_piece p[MODEL_PIECES];
    void *ws;
    size_t total = fy_cu_arena_pieces_footprint(p, plan(&m, p, &ws));
    return total + (f != NULL ? f->arena_bytes(c, B, T) : 0);
}

size_t fy_cu_model_set_bytes(const struct fy_model_config *c, int B, int T)
{
    const struct fy_cu_family *f = fy_cu_family_of(c);
    return f != NULL ? f->set_bytes(c, B, T) : 0;
}

/* What the kernels of every family take; then the family's own checks. */
static int model_check(const struct fy_model_config *c, const struct fy_cu_family *f)
{
    FY_REQUIRE(f != NULL, -EINVAL,
               "the CUDA backend has no units for %s models: train them with --backend cpu",
               fy_model_arch(c)->label);
    if (f->check != NULL)
        FY_TRY(f->check(c));
    unsigned hs = fy_model_head_size(c);
    FY_REQUIRE(c->n_embd % 8 == 0 && hs % 8 == 0, -EINVAL,
               "the CUDA backend needs n_embd (%u) and the head size (%u) to be multiples of 8",
               c->n_embd, hs);
    return 0;
}

/* The streams, the products' handle, the sink's events and the family's units, once the buffers
 * are carved. */
static int model_start(struct fy_cu_model *m, struct fy_cu_arena *arena, void *lt_ws)
{
    m->q.ring_n = m->ring_n;
    FY_TRY(fy_cu_queue_init(&m->q, m->N, (size_t)m->N * m->c.n_embd));
    FY_TRY(fy_cu_lt_new(&m->lt, lt_ws, LT_WORKSPACE));
    FY_TRY(fy_cu_gradsink_init(&m->sink, &m->q, m->piece_n, m->block_n));
    struct fy_cu_env env = {m->lt, m->q.compute, m->head_scratch, m->head_rows};
    return m->fam->create(&m->units, arena, &m->c, m->B, m->T, &env);
}

/* -ENOMEM, said: the arena cannot hold the model's buffers. */
static int arena_short(const struct fy_cu_arena *arena, const struct fy_model_config *c, int B,
                       int T)
{
    fy_error("the GPU arena (%.2f GiB, %.2f GiB free) cannot hold the model's working buffers for "
             "batch %d x %d (%.2f GiB): raise --gpu-mem or lower the batch",
             (double)arena->size / (1 << 30), (double)(arena->size - arena->used) / (1 << 30), B,
             T, (double)fy_cu_model_arena_bytes(c, B, T) / (1 << 30));
    return -ENOMEM;
}

int fy_cu_model_new(struct fy_cu_model **out, struct fy_cu_arena *arena,
                    const struct fy_model_config *c, int B, int T)
{
    *out = NULL;
    const struct fy_cu_family *f = fy_cu_family_of(c);
    FY_TRY(model_check(c, f));
    /* the units' buffers too, which they take after the model's */
    if (fy_cu_model_arena_bytes(c, B, T) > arena->size - arena->used)
        return arena_short(arena, c, B, T);
    struct fy_cu_model *m = (struct fy_cu_model *)calloc(1, sizeof *m);
    if (m == NULL)
        return -ENOMEM;
    m->q.ready_fd = -1;
    m->fam = f;
    setup_shape(m, c, f, B, T);
    struct fy_cu_piece p[MODEL_PIECES];
    void *lt_ws = NULL;
    size_t mark = arena->used; /* a failure below gives back what was carved */
    int rc = 0;
    m->sets = (char *)calloc(FY_CU_MODEL_MAX_KEPT + FY_CU_QUEUE, f->set_size);
    if (m->sets == NULL) {
        rc = -ENOMEM;
        goto out;
    }
    for (int i = 0; i < FY_CU_QUEUE; i++)
        m->q.st[i].swap = kept_set(m, FY_CU_MODEL_MAX_KEPT + i);
    if (fy_cu_arena_take_pieces(arena, p, plan(m, p, &lt_ws)) < 0) {
        rc = arena_short(arena, c, B, T);
        goto out;
    }
    FY_TRY_OUT(rc, model_start(m, arena, lt_ws));
    *out = m;
    return 0;
out:
    fy_cu_model_destroy(&m);
    fy_cu_arena_reset(arena, mark);
    return rc;
}

void fy_cu_model_destroy(struct fy_cu_model **mp)
{
    if (mp == NULL || *mp == NULL)
        return;
    struct fy_cu_model *m = *mp;
    fy_cu_queue_drain(&m->q); /* nothing may still write into buffers about to be reused */
    if (m->q.d2h) /* gradient pieces of a failed call */
        cudaStreamSynchronize(m->q.d2h);
    if (m->units != NULL)
        m->fam->destroy(&m->units);
    fy_cu_lt_destroy(&m->lt);
    fy_cu_queue_release(&m->q);
    fy_cu_gradsink_release(&m->sink);
    for (int i = 0; i < FY_CU_PROFILE_EVENTS; i++)
        if (m->prof_ev[i])
            cudaEventDestroy(m->prof_ev[i]);
    free(m->sets);
    free(m);
    *mp = NULL;
}

int fy_cu_model_set_host_acts_bf16(struct fy_cu_model *m, int on)
{
    FY_REQUIRE(m->q.pending == 0, -EBUSY,
               "cu_model: changing the activations' host dtype with %d calls in flight",
               m->q.pending);
    m->q.host_bf16 = on != 0;
    return 0;
}

int fy_cu_model_set_host_weights_bf16(struct fy_cu_model *m, int on)
{
    /* each call reads the dtype while queueing (fy_cu_queue_weights_in): those in flight are not
     * affected */
    m->q.host_wbf16 = on != 0;
    return 0;
}

int fy_cu_model_set_loss_count(struct fy_cu_model *m, uint64_t count)
{
    /* each head call passes the count to its kernels while queueing: those in flight keep theirs */
    m->loss_count = count;
    return 0;
}

/* Held gradients (one-pass clipping) would be each rank's own share, never summed. */
static int holds_refused(int holds, int ranks)
{
    FY_REQUIRE(holds == 0 || ranks <= 1, -ENOTSUP,
               "one-pass clipping with the gradients held on the GPU is not supported with %d gpu "
               "workers: use --clip-hold pool or --clip-mode two-pass",
               ranks);
    return 0;
}

int fy_cu_model_set_ranks(struct fy_cu_model *m, const struct fy_cu_ranks *ranks)
{
    FY_REQUIRE(m->q.pending == 0, -EBUSY, "cu_model: joining a group with %d calls in flight",
               m->q.pending);
    FY_TRY(holds_refused(m->sink.holds, ranks != NULL ? fy_cu_ranks_count(ranks) : 1));
    m->sink.ranks = ranks;
    return 0;
}

int fy_cu_model_finish(struct fy_cu_model *m, struct fy_cu_copy_times *times)
{
    return fy_cu_queue_finish(&m->q, times);
}

int fy_cu_model_pending(const struct fy_cu_model *m) { return m->q.pending; }

int fy_cu_model_ready_fd(const struct fy_cu_model *m) { return m->q.ready_fd; }

cudaStream_t fy_cu_model_stream(const struct fy_cu_model *m) { return m->q.compute; }

void *fy_cu_model_units(const struct fy_cu_model *m, const struct fy_cu_family *family)
{
    if (m->fam != family) {
        fy_error("cu_model: units of another family asked of a %s model", family_label(m));
        return NULL;
    }
    return m->units;
}

/* ---- kept and swapped internals ---- */

/* The kept set of block `layer` (1..L), or -1 where that block is recomputed. */
static int kept_index(const struct fy_cu_model *m, int layer)
{
    int first = (int)m->c.n_layer - m->n_kept + 1;
    return layer >= first && layer <= (int)m->c.n_layer ? layer - first : -1;
}

/* A family whose blocks' internals are kept or recomputed, never swapped. */
static int swap_supported(const struct fy_cu_model *m)
{
    FY_REQUIRE(m->fam->swap != NULL, -ENOTSUP,
               "the CUDA backend's %s blocks keep their internals on the GPU or recompute them, "
               "never swap them: train %s models with --act-plan auto or recompute",
               family_label(m), family_label(m));
    return 0;
}

/* The kinds `saved` gives, as a mask (0 for NULL or nothing given, which is the plain call), after
 * checking that this model can take them now. */
static int saved_mask(const struct fy_cu_model *m, const struct fy_block_saved *saved,
                      unsigned *mask)
{
    *mask = 0;
    for (int k = 0; saved != NULL && k < FY_ACT_KINDS; k++)
        if (saved->at[k] != NULL)
            *mask |= FY_ACT_BIT(k);
    FY_REQUIRE((*mask & ~FY_ACT_SWAPPABLE) == 0, -EINVAL,
               "cu_model: saved internals of kinds 0x%x, which are never swapped (only qkv, attn, "
               "resid, fc and gelu are)", *mask & ~FY_ACT_SWAPPABLE);
    if (*mask == 0)
        return 0;
    FY_TRY(swap_supported(m));
    FY_REQUIRE(m->swap_ready, -EINVAL,
               "cu_model: a block call with swapped internals before their device sets were taken "
               "(fy_cu_model_swap_sets, the backend's model_swap, after preparing)");
    return m->fam->swap->check(m->units, *mask);
}

int fy_cu_model_keep_layers(struct fy_cu_model *m, struct fy_cu_arena *arena, int max_layers)
{
    FY_REQUIRE(m->q.pending == 0 && m->n_kept == 0, -EBUSY,
               "cu_model: keeping internals with calls in flight or sets already taken");
    int most = max_layers < (int)m->c.n_layer ? max_layers : (int)m->c.n_layer;
    most = most < FY_CU_MODEL_MAX_KEPT ? most : FY_CU_MODEL_MAX_KEPT;
    while (m->n_kept < most && m->fam->set_take(m->units, arena, kept_set(m, m->n_kept)) == 0)
        m->kept_full[m->n_kept++] = 0;
    /* the sets were taken in order, but the top blocks are the ones kept: renumbering is only
     * kept_index's arithmetic */
    return m->n_kept;
}

int fy_cu_model_hold(struct fy_cu_model *m, struct fy_cu_arena *arena, int count)
{
    FY_REQUIRE(m->q.pending == 0 && m->n_kept == 0 && m->sink.holds == 0 && count > 0, -EBUSY,
               "cu_model: holding gradients with calls in flight, after kept sets were taken "
               "(they come first) or a second time");
    FY_TRY(holds_refused(count, m->sink.ranks != NULL ? fy_cu_ranks_count(m->sink.ranks) : 1));
    size_t bytes = (size_t)count * m->block_n * sizeof(float);
    m->sink.held = (float *)fy_cu_arena_take(arena, bytes);
    FY_REQUIRE(m->sink.held != NULL, -ENOMEM,
               "GPU arena: no room for %d blocks' gradients (%.3f GiB) beside the working buffers "
               "(%.3f of %.3f GiB in use): raise --gpu-mem, or use --clip-hold pool",
               count, (double)bytes / (1 << 30), (double)arena->used / (1 << 30),
               (double)arena->size / (1 << 30));
    m->sink.holds = count;
    return 0;
}

int fy_cu_model_hold_next(struct fy_cu_model *m, int slot)
{
    FY_REQUIRE(slot >= 0 && slot < m->sink.holds, -EINVAL, "cu_model: holding gradient %d of %d %s",
               slot, m->sink.holds, m->sink.holds ? "outside the buffers" : "without buffers");
    m->sink.hold_next = slot;
    return 0;
}

static int hold_send_call(struct fy_cu_model *m, struct fy_cu_staging *st, int slot, float *dparams)
{
    FY_TRY(fy_cu_queue_uploads_done(&m->q, st));
    /* the download waits for every kernel queued before it, the pieces' copies too */
    FY_TRY(fy_cu_queue_compute_done(&m->q, st));
    return fy_cu_queue_download(&m->q, st, dparams, m->sink.held + (size_t)slot * m->block_n,
                                m->block_n * sizeof(float));
}

int fy_cu_model_hold_send(struct fy_cu_model *m, int slot, float *dparams)
{
    FY_REQUIRE(slot >= 0 && slot < m->sink.holds, -EINVAL,
               "cu_model: sending held gradient %d of %d", slot, m->sink.holds);
    struct fy_cu_staging *st;
    FY_TRY(fy_cu_queue_begin(&m->q, &st));
    return fy_cu_queue_end(&m->q, st, hold_send_call(m, st, slot, dparams));
}

int fy_cu_model_swap_sets(struct fy_cu_model *m, struct fy_cu_arena *arena)
{
    FY_TRY(swap_supported(m));
    if (m->swap_ready)
        return 0;
    /* before any kept set: those take what is left, and a later reset must not split them */
    FY_REQUIRE(m->q.pending == 0 && m->n_kept == 0, -EBUSY,
               "cu_model: taking the swap sets with calls in flight or after kept sets were taken "
               "(they come first)");
    FY_TRY(m->fam->swap->layout_check(m->units));
    size_t mark = arena->used, set = m->fam->set_bytes(&m->c, m->B, m->T);
    for (int i = 0; i < FY_CU_QUEUE; i++)
        if (m->fam->set_take(m->units, arena, m->q.st[i].swap) < 0) {
            fy_cu_arena_reset(arena, mark);
            for (int j = 0; j < FY_CU_QUEUE; j++)
                memset(m->q.st[j].swap, 0, m->fam->set_size);
            fy_error("the GPU arena cannot hold the %d sets of block internals that swapped "
                     "blocks compute in (%.3f GiB needed, %.3f GiB free of %.3f): raise "
                     "--gpu-mem or lower the batch",
                     FY_CU_QUEUE, (double)(FY_CU_QUEUE * set) / (1 << 30),
                     (double)(arena->size - arena->used) / (1 << 30),
                     (double)arena->size / (1 << 30));
            return -ENOMEM;
        }
    m->swap_ready = 1;
    return 0;
}
/* ---- the calls ---- */

/* The call's positions (host, NULL: t) uploaded into its staging with its other inputs; *dev is
 * where its kernels read them (NULL without). */
static int positions_in(struct fy_cu_model *m, struct fy_cu_staging *st, const int32_t *positions,
                        const int32_t **dev)
{
    *dev = NULL;
    if (positions == NULL)
        return 0;
    FY_TRY(fy_cu_queue_upload(&m->q, st, st->positions, positions, (size_t)m->N * sizeof(int32_t)));
    *dev = st->positions;
    return 0;
}

static int block_forward_call(struct fy_cu_model *m, struct fy_cu_staging *st, int layer,
                              const void *params, const int32_t *positions, const void *x, void *y,
                              const struct fy_block_saved *saved, unsigned mask)
{
    struct fy_cu_queue *q = &m->q;
    struct fy_cu_act_in in_x = {x, st->x, NULL};
    const int32_t *pos;
    FY_TRY(fy_cu_queue_weights_in(q, st, st->wts, params, m->block_n));
    FY_TRY(fy_cu_queue_act_in(q, st, &in_x));
    FY_TRY(positions_in(m, st, positions, &pos));
    FY_TRY(fy_cu_queue_uploads_done(q, st));
    /* a set counts as filled only once the whole forward is queued: a failure part way leaves it
     * spent, so the next backward recomputes. A block whose internals are swapped computes into
     * the call's own set instead, which its downloads read after this call's compute while the
     * next call may already compute into the units' own set or a kept set; a kept block's set is
     * left spent. */
    int k = kept_index(m, layer);
    if (k >= 0)
        m->kept_full[k] = 0;
    void *set = mask ? st->swap : k >= 0 ? kept_set(m, k) : NULL;
    FY_TRY(m->fam->block_forward(m->units, st->wts, pos, in_x.at, st->out, set));
    if (k >= 0 && !mask)
        m->kept_full[k] = 1;
    FY_TRY(fy_cu_queue_compute_done(q, st));
    FY_TRY(fy_cu_queue_act_out(q, st, y, st->out));
    /* recorded in st->outs like y, so a backward queued while this call is in flight uploads
     * them only once they are home; an earlier call still uploading from the same host buffers
     * is ahead of these downloads anyway (they follow this call's compute, which follows every
     * upload queued before it on the in-order host-to-device stream) */
    struct fy_cu_swap_piece pieces[FY_CU_SWAP_PIECES];
    int n = mask ? m->fam->swap->pieces(m->units, set, saved, mask, pieces) : 0;
    for (int i = 0; i < n; i++)
        FY_TRY(fy_cu_queue_download(q, st, pieces[i].host, pieces[i].dev, pieces[i].bytes));
    return 0;
}

int fy_cu_model_block_forward(struct fy_cu_model *m, int layer, const void *params,
                              const int32_t *positions, const void *x, void *y,
                              const struct fy_block_saved *saved)
{
    unsigned mask;
    FY_TRY(saved_mask(m, saved, &mask));
    struct fy_cu_staging *st;
    FY_TRY(fy_cu_queue_begin(&m->q, &st));
    return fy_cu_queue_end(&m->q, st,
                           block_forward_call(m, st, layer, params, positions, x, y, saved, mask));
}

static int block_backward_call(struct fy_cu_model *m, struct fy_cu_staging *st, int layer,
                               const void *params, const int32_t *positions, const void *x,
                               const void *dy, void *dx, float *dparams,
                               const struct fy_block_saved *saved, unsigned mask)
{
    struct fy_cu_queue *q = &m->q;
    struct fy_cu_act_in in_x = {x, st->x, NULL}, in_dy = {dy, st->dy, NULL};
    const int32_t *pos;
    FY_TRY(fy_cu_queue_weights_in(q, st, st->wts, params, m->block_n));
    FY_TRY(fy_cu_queue_act_in(q, st, &in_x));
    FY_TRY(fy_cu_queue_act_in(q, st, &in_dy));
    FY_TRY(positions_in(m, st, positions, &pos));
    /* the swapped kinds into the call's own set: the host buffers are only read, so a second
     * backward from the same saved (clipping's second pass) finds them as they were */
    struct fy_cu_swap_piece pieces[FY_CU_SWAP_PIECES];
    int n = mask ? m->fam->swap->pieces(m->units, st->swap, saved, mask, pieces) : 0;
    for (int i = 0; i < n; i++)
        FY_TRY(fy_cu_queue_upload(q, st, pieces[i].dev, pieces[i].host, pieces[i].bytes));
    FY_TRY(fy_cu_queue_uploads_done(q, st));
    /* a set is used once: the backward also uses its attention part as scratch, so a second
     * backward of the same forward (clipping's second pass) recomputes */
    int k = kept_index(m, layer), full = k >= 0 && m->kept_full[k];
    if (k >= 0)
        m->kept_full[k] = 0;
    void *kept = full ? kept_set(m, k) : NULL;
    if (mask) { /* the rest of the call's set recomputed from x around what came from the host */
        kept = st->swap;
        FY_TRY(m->fam->swap->recompute(m->units, st->wts, pos, in_x.at, kept, mask));
    }
    /* the gradient comes home a piece at a time while the backward goes on (cu_gradsink) */
    if (fy_cu_gradsink_home(&m->sink))
        FY_TRY(fy_cu_queue_note_out(q, st, dparams, m->block_n * sizeof(float)));
    m->sink.st = st;
    m->sink.host = dparams;
    int rc = m->fam->block_backward(m->units, st->wts, pos, in_x.at, in_dy.at, st->out,
                                    &m->sink.grads, kept);
    m->sink.hold_next = -1;
    FY_TRY(rc);
    FY_TRY(fy_cu_queue_compute_done(q, st));
    return fy_cu_queue_act_out(q, st, dx, st->out);
}

int fy_cu_model_block_backward(struct fy_cu_model *m, int layer, const void *params,
                               const int32_t *positions, const void *x, const void *dy, void *dx,
                               float *dparams, const struct fy_block_saved *saved)
{
    unsigned mask;
    FY_TRY(saved_mask(m, saved, &mask));
    struct fy_cu_staging *st;
    FY_TRY(fy_cu_queue_begin(&m->q, &st));
    return fy_cu_queue_end(
        &m->q, st,
        block_backward_call(m, st, layer, params, positions, x, dy, dx, dparams, saved, mask));
}

static int embed_forward_call(struct fy_cu_model *m, struct fy_cu_staging *st, const void *embed,
                              const int32_t *tokens, const int32_t *positions, void *x)
{
    struct fy_cu_queue *q = &m->q;
    const int32_t *pos;
    FY_TRY(fy_cu_queue_upload(q, st, st->tokens, tokens, (size_t)m->N * sizeof(int32_t)));
    FY_TRY(positions_in(m, st, positions, &pos));
    FY_TRY(fy_cu_queue_weights_in(q, st, st->wts, embed, fy_model_unit_params(&m->c, 0)));
    FY_TRY(fy_cu_queue_uploads_done(q, st));
    FY_TRY(m->fam->embed_forward(m->units, st->wts, st->tokens, pos, st->out));
    FY_TRY(fy_cu_queue_compute_done(q, st));
    return fy_cu_queue_act_out(q, st, x, st->out);
}

int fy_cu_model_embed_forward(struct fy_cu_model *m, const void *embed, const int32_t *tokens,
                              const int32_t *positions, void *x)
{
    struct fy_cu_staging *st;
    FY_TRY(fy_cu_queue_begin(&m->q, &st));
    return fy_cu_queue_end(&m->q, st, embed_forward_call(m, st, embed, tokens, positions, x));
}

static int embed_backward_call(struct fy_cu_model *m, struct fy_cu_staging *st,
                               const int32_t *tokens, const int32_t *positions, const void *dx,
                               float *dembed)
{
    struct fy_cu_queue *q = &m->q;
    size_t n = fy_model_unit_params(&m->c, 0);
    struct fy_cu_act_in in_dx = {dx, st->x, NULL};
    const int32_t *pos;
    FY_TRY(fy_cu_queue_upload(q, st, st->tokens, tokens, (size_t)m->N * sizeof(int32_t)));
    FY_TRY(positions_in(m, st, positions, &pos));
    /* the lookup's gradient adds to the host's dembed (the head's share); in a group only rank
     * 0's is read, the others add theirs to zeros, and the sum of all comes home to rank 0 */
    int home = fy_cu_gradsink_home(&m->sink);
    FY_TRY(fy_cu_gradsink_unit_wait(&m->sink, home ? q->h2d : q->compute));
    if (home)
        FY_TRY(fy_cu_queue_upload(q, st, m->sink.unit, dembed, n * sizeof(float)));
    FY_TRY(fy_cu_queue_act_in(q, st, &in_dx));
    FY_TRY(fy_cu_queue_uploads_done(q, st));
    if (!home)
        FY_CUDA(cudaMemsetAsync(m->sink.unit, 0, n * sizeof(float), q->compute),
                "zeroing the embeddings' gradient");
    FY_TRY(m->fam->embed_backward(m->units, st->tokens, pos, in_dx.at, m->sink.unit));
    FY_TRY(fy_cu_gradsink_sum(&m->sink, m->sink.unit, n));
    FY_TRY(fy_cu_queue_compute_done(q, st));
    if (!home)
        return 0;
    FY_TRY(fy_cu_queue_download(q, st, dembed, m->sink.unit, n * sizeof(float)));
    return fy_cu_gradsink_unit_sent(&m->sink);
}

int fy_cu_model_embed_backward(struct fy_cu_model *m, const int32_t *tokens,
                               const int32_t *positions, const void *dx, float *dembed)
{
    struct fy_cu_staging *st;
    FY_TRY(fy_cu_queue_begin(&m->q, &st));
    return fy_cu_queue_end(&m->q, st, embed_backward_call(m, st, tokens, positions, dx, dembed));
}

/* ---- the head ---- */

/* The head's weight [V][C] in the host's dtype. */
static const void *head_weight(const struct fy_cu_model *m, const void *final_params,
                               const void *embed)
{
    return untied_head(&m->c) ? (const char *)final_params +
                                    final_norm_n(&m->c) * fy_cu_queue_weight_size(&m->q)
                              : embed;
}

/* The final unit's weights: its norm's into the staging's norm_wts, the head's into its wts. */
static int final_weights_in(struct fy_cu_model *m, struct fy_cu_staging *st,
                            const void *final_params, const void *embed)
{
    FY_TRY(fy_cu_queue_weights_in(&m->q, st, st->norm_wts, final_params, final_norm_n(&m->c)));
    return fy_cu_queue_weights_in(&m->q, st, st->wts, head_weight(m, final_params, embed),
                                  (size_t)m->c.vocab * m->c.n_embd);
}

/* The head's gradients home: an untied head's in the final unit's layout (norm, then its weight),
 * in one piece, the embeddings getting nothing from it; otherwise the norm's, and the head
 * weight's into the embeddings' token rows, the rest of the embeddings (positions) getting
 * nothing. The host ranges that get nothing are zeroed when the call is finished. */
static int head_gradients_home(struct fy_cu_model *m, struct fy_cu_staging *st, float *dfinal,
                               float *dembed, const float *dnorm, const float *dhead)
{
    struct fy_cu_queue *q = &m->q;
    size_t wte_n = (size_t)m->c.vocab * m->c.n_embd, norm_n = final_norm_n(&m->c);
    size_t embed_n = fy_model_unit_params(&m->c, 0);
    if (untied_head(&m->c)) {
        FY_TRY(fy_cu_queue_download(q, st, dfinal, m->sink.unit, (norm_n + wte_n) * sizeof(float)));
        st->zero_host = dembed;
        st->zero_n = embed_n;
        return fy_cu_gradsink_unit_sent(&m->sink);
    }
    FY_TRY(fy_cu_queue_download(q, st, dfinal, dnorm, norm_n * sizeof(float)));
    FY_TRY(fy_cu_queue_download(q, st, dembed, dhead, wte_n * sizeof(float)));
    st->zero_host = embed_n > wte_n ? dembed + wte_n : NULL;
    st->zero_n = embed_n - wte_n;
    return fy_cu_gradsink_unit_sent(&m->sink);
}

static int head_call(struct fy_cu_model *m, struct fy_cu_staging *st, const void *final_params,
                     const void *embed, const void *x, const int32_t *targets, double *loss,
                     void *dx, float *dfinal, float *dembed)
{
    struct fy_cu_queue *q = &m->q;
    int N = m->N;
    size_t wte_n = (size_t)m->c.vocab * m->c.n_embd;
    FY_TRY(fy_cu_queue_upload(q, st, st->targets, targets, (size_t)N * sizeof(int32_t)));
    struct fy_cu_act_in in_x = {x, st->x, NULL};
    FY_TRY(final_weights_in(m, st, final_params, embed));
    FY_TRY(fy_cu_queue_act_in(q, st, &in_x));
    FY_TRY(fy_cu_queue_uploads_done(q, st));
    int backward = dx != NULL, untied = untied_head(&m->c);
    /* the gradients: an untied head's in the final unit's layout (norm, then the head's weight),
     * in one piece; otherwise the head weight's (the embeddings') then the norm's */
    float *dnorm = untied ? m->sink.unit : m->sink.unit + wte_n;
    float *dhead = untied ? m->sink.unit + final_norm_n(&m->c) : m->sink.unit;
    if (backward)
        FY_TRY(fy_cu_gradsink_unit_wait(&m->sink, q->compute));
    /* the mean's count goes with the call (its kernels and its loss), whatever is set later */
    st->loss_count = m->loss_count;
    FY_TRY(m->fam->head(m->units, st->norm_wts, st->wts, in_x.at, st->targets, st->losses,
                        backward ? st->out : NULL, dnorm, dhead, st->loss_count));
    if (backward) /* the norm's and the head weight's pieces lie side by side either way */
        FY_TRY(fy_cu_gradsink_sum(&m->sink, m->sink.unit, final_norm_n(&m->c) + wte_n));
    FY_TRY(fy_cu_queue_compute_done(q, st));
    if (backward) {
        FY_TRY(fy_cu_queue_act_out(q, st, dx, st->out));
        /* in a group, the other ranks neither download nor zero: the host ranges are rank 0's */
        if (fy_cu_gradsink_home(&m->sink))
            FY_TRY(head_gradients_home(m, st, dfinal, dembed, dnorm, dhead));
    }
    FY_TRY(fy_cu_queue_download(q, st, st->host_losses, st->losses, (size_t)N * sizeof(float)));
    st->targets_host = targets;
    st->loss = loss;
    return 0;
}

int fy_cu_model_head(struct fy_cu_model *m, const void *final_params, const void *embed,
                     const void *x, const int32_t *targets, double *loss, void *dx, float *dfinal,
                     float *dembed)
{
    struct fy_cu_staging *st;
    FY_TRY(fy_cu_queue_begin(&m->q, &st));
    return fy_cu_queue_end(
        &m->q, st, head_call(m, st, final_params, embed, x, targets, loss, dx, dfinal, dembed));
}

int fy_cu_model_logits(struct fy_cu_model *m, const void *final_params, const void *embed,
                       const void *x, float *logits)
{
    struct fy_cu_queue *q = &m->q;
    int N = m->N, C = (int)m->c.n_embd, V = (int)m->c.vocab;
    cudaStream_t s = q->compute;
    while (q->pending > 0) /* synchronous: whatever was queued completes first */
        FY_TRY(fy_cu_queue_finish(q, NULL));
    struct fy_cu_staging *st; /* a call of its own, never counted as in flight */
    FY_TRY(fy_cu_queue_begin(q, &st));
    struct fy_cu_act_in in_x = {x, st->x, NULL};
    FY_TRY(final_weights_in(m, st, final_params, embed));
    FY_TRY(fy_cu_queue_act_in(q, st, &in_x));
    FY_TRY(fy_cu_queue_uploads_done(q, st));
    const bf16 *xn;
    FY_TRY(m->fam->final_norm(m->units, st->norm_wts, in_x.at, &xn));
    /* the head's scratch holds at least head_rows x V f32 logits */
    float *chunk = (float *)m->head_scratch;
    for (int r0 = 0; r0 < N; r0 += m->head_rows) {
        int rows = N - r0 < m->head_rows ? N - r0 : m->head_rows;
        FY_TRY(fy_cu_matmul_batched(m->lt, chunk, 1, xn + (size_t)r0 * C, st->wts, rows, V, C, 0,
                                    1, 0, 0, 0, 1, 1.0f, 0.0f, s));
        FY_TRY(fy_cu_queue_compute_done(q, st));
        FY_TRY(fy_cu_queue_download_within(q, st, logits + (size_t)r0 * V, chunk,
                                           (size_t)rows * V * sizeof(float)));
        /* the chunk buffer is reused by the next rows */
        FY_CUDA(cudaStreamSynchronize(q->d2h), "waiting for a chunk of logits");
    }
    return 0;
}

/* ---- the activation planner's profile of one block (struct fy_block_profile) ---- */

/* The family's compute on the model's scratch (the unit's parameters, x, y, dy, dx and a
 * staging's gradient, all rewritten by any later call before it reads them), then the link. */
static int profile_run(struct fy_cu_model *m, void *host, size_t host_bytes,
                       struct fy_block_profile *out)
{
    for (int i = 0; i < FY_CU_PROFILE_EVENTS; i++)
        if (m->prof_ev[i] == NULL)
            FY_CUDA(cudaEventCreate(&m->prof_ev[i]), "creating the profiling events");
    /* the backward's gradient pieces go through the ring and nowhere else */
    struct fy_cu_grads discard = m->sink.grads;
    m->sink.discard = 1;
    struct fy_cu_staging *s0 = &m->q.st[0], *s1 = &m->q.st[1];
    struct fy_cu_profile_scratch sc = {s0->wts, s0->x, s0->out, s0->dy, s1->out, &discard};
    void *dev = NULL;
    size_t dev_bytes = 0;
    int rc = m->fam->profile->block(m->units, &sc, m->prof_ev, out, &dev, &dev_bytes);
    m->sink.discard = 0;
    FY_TRY(rc);
    FY_CUDA(cudaStreamSynchronize(m->q.compute), "waiting for the profile's compute");
    return fy_cu_profile_links(m->q.h2d, m->q.d2h, m->q.compute, m->prof_ev, (char *)host,
                               (char *)dev, host_bytes < dev_bytes ? host_bytes : dev_bytes, out);
}

static int profile_sync(struct fy_cu_model *m)
{
    FY_CUDA(cudaStreamSynchronize(m->q.compute), "waiting for the profile's compute");
    FY_CUDA(cudaStreamSynchronize(m->q.h2d), "waiting for the profile's uploads");
    FY_CUDA(cudaStreamSynchronize(m->q.d2h), "waiting for the profile's downloads");
    return 0;
}

int fy_cu_model_profile(struct fy_cu_model *m, struct fy_cu_arena *arena, void *host,
                        size_t host_bytes, struct fy_block_profile *out)
{
    FY_REQUIRE(m->fam->profile != NULL, -ENOTSUP,
               "the CUDA backend does not profile %s blocks: the planner's profile times the "
               "internals that swapping moves, and %s blocks keep theirs on the GPU or recompute "
               "them (--act-plan auto keeps what fits)", family_label(m), family_label(m));
    FY_REQUIRE(m->q.pending == 0, -EBUSY,
               "cu_model: profiling with %d calls in flight (finish them first)", m->q.pending);
    FY_REQUIRE(host != NULL && host_bytes >= PROFILE_HOST_MIN, -EINVAL,
               "cu_model: profiling the copies needs at least %u bytes of pinned host memory, not "
               "%zu", PROFILE_HOST_MIN, host != NULL ? host_bytes : 0);
    /* pageable memory would be copied through a bounce buffer, at a speed training never sees */
    cudaPointerAttributes attr;
    FY_CUDA(cudaPointerGetAttributes(&attr, host), "looking up the profile's host memory");
    FY_REQUIRE(attr.type == cudaMemoryTypeHost, -EINVAL,
               "cu_model: profiling the copies through host memory that is not pinned (register "
               "it with the backend first)");
    memset(out, 0, sizeof *out);
    int rc = profile_run(m, host, host_bytes, out);
    /* nothing of the profile may still run when the next call rewrites its buffers */
    int sync = profile_sync(m);
    if (rc < 0)
        return rc;
    FY_TRY(sync);
    out->gpu_free = arena->size - arena->used;
    out->set_bytes = m->fam->set_bytes(&m->c, m->B, m->T);
    return 0;
}
