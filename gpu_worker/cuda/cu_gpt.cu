/* The GPT units on the GPU, composed from the kernels of cu_norm, cu_matmul and cu_attention.
 * A host-interface call uploads its inputs on the host-to-device stream into its own staging
 * buffers, computes on the compute stream and downloads its outputs on the device-to-host stream,
 * each stream waiting on the previous one's event, and returns without waiting: with two calls in
 * flight the second one's uploads run while the first computes. Nothing synchronises the device;
 * fy_cu_gpt_finish waits for one call's event. A Llama model's calls go through the same staging
 * and queue; their device work is cu_llama's units (the unit holds one, g->llama), and the
 * GPT-2-only parts (swapped internals, the planner's profile, per-op timing) refuse it or leave it
 * out. */
#include "cu_gpt.h"

#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/knobs.h"
#include "gpu_worker/cuda/cu_attention.h"
#include "gpu_worker/cuda/cu_flash.h"
#include "gpu_worker/cuda/cu_llama.h"
#include "gpu_worker/cuda/cu_matmul.h"
#include "gpu_worker/cuda/cu_norm.h"

/* Rows of logits per chunk of the head: large enough that its products run at full speed, small
 * enough that a chunk's logits stay within HEAD_CHUNK_BYTES however large the vocabulary. */
#define HEAD_CHUNK_BYTES (512u << 20)
#define HEAD_CHUNK_MIN 256
#define HEAD_CHUNK_MAX 4096
#define LT_WORKSPACE (32u << 20)

/* a block forward downloads y and up to 6 pieces of swapped internals (qkv, atty, the attention's
 * logsumexp, y1, fc, g); a head, 4 outputs */
#define STAGING_OUTS 8
/* a block backward uploads params, x, dy and up to those 6 pieces */
#define STAGING_UPLOADS 9
/* fy_cu_gpt_profile: timing events (a start and the two copy streams' ends), repetitions timed
 * after one warm-up, and the least host memory whose copies say something about the link */
#define PROFILE_EVENTS 3
#define PROFILE_REPS 3
#define PROFILE_HOST_MIN (1u << 20)

/* Device staging of one host-interface call in flight, and what finishing it still has to do. */
struct staging {
    /* wts, norm_wts: a call's weights as uploaded, f32 or bf16 (sized for f32) */
    void *wts, *norm_wts;
    float *grad, *in0, *in1, *out, *losses;
    int32_t *tokens, *targets;
    float *host_losses; /* pinned: the per-row losses come home without blocking the queueing */
    cudaEvent_t uploaded, computed, done;
    /* the device time of the copies: each upload between a pair of events (an upload may first
     * wait for another call's downloads, which is not copy time), the downloads together from
     * d2h_begin to done */
    cudaEvent_t up_ev[2 * STAGING_UPLOADS], d2h_begin;
    int n_up;
    /* the head's loss: mean of host_losses over the rows whose target is not ignored */
    const int32_t *targets_host;
    double *loss;
    /* host floats the head zeroes when finished: dembed's position part (GPT-2, untouched by the
     * tied head), or the whole dembed (a Llama head of its own, untied, adds nothing to it) */
    float *zero_host;
    size_t zero_n;
    /* the host ranges the call downloads into: a later call that uploads from one of them while
     * this call is in flight must wait for this call's downloads */
    struct {
        const char *p;
        size_t n;
    } outs[STAGING_OUTS];
    int n_outs;
    /* the call's activation output: host buffer and the device copy it came from */
    const void *act_out_host;
    const bf16 *act_out_dev;
    /* the internals of a block call given saved host buffers (fy_cu_gpt_swap_sets): the forward
     * computes into it and downloads from it, the backward uploads into it and recomputes the
     * rest there. One per staging, so a call's set is free again once the call is finished. */
    struct fy_cu_gpt_acts swap;
};

/* An activation input of a call (see act_in_queue). */
struct act_in {
    const void *host;
    void *staging; /* upload target (the host's dtype) */
    bf16 *dev;      /* where the kernels read it */
    const bf16 *from; /* set when it comes from the device copy of the call before */
};

struct fy_cu_gpt {
    struct fy_model_config c;
    struct fy_gpt2_block_layout lay;
    int B, T, N;
    int head_rows;   /* rows per chunk of the head */
    int flash;       /* flash-style attention (else the materialising version) */
    int fuse;        /* GELU and residual adds in the products' epilogues (else separate kernels) */
    int host_bf16;   /* activations in host buffers are bf16 (else f32) */
    int host_wbf16;  /* weights in host buffers are bf16 (else f32), for calls made from now on */
    size_t unit_max; /* floats of the largest unit */
    size_t block_n;  /* floats of a block unit */
    size_t grad_n;   /* floats of a staging's gradient: a unit's, or the head's two pieces */
    struct fy_cu_llama *llama; /* a Llama model's device units (NULL: GPT-2) */
    cudaStream_t compute, h2d, d2h;
    struct fy_cu_lt *lt;
    /* host-interface calls in flight: st[first] is the oldest of `pending` */
    struct staging st[FY_CU_GPT_QUEUE];
    int first, pending;
    int ready_fd; /* eventfd in semaphore mode: one count per call whose results are home */
    /* a unit's parameters on the device */
    bf16 *pbf, *lnf;
    float *ln_scratch;
    /* one block's input and output, and its internals when no kept set is given */
    bf16 *x, *y;
    struct fy_cu_gpt_acts own;
    /* kept internals of the top `n_kept` blocks (set i: block L - n_kept + 1 + i), of the model's
     * architecture, and whether a forward has filled a set that no backward has used since */
    union {
        struct fy_cu_gpt_acts gpt;
        struct fy_cu_llama_acts llama;
    } kept[FY_CU_GPT_MAX_KEPT];
    unsigned char kept_full[FY_CU_GPT_MAX_KEPT];
    int n_kept;
    int swap_ready; /* every staging has its swap set */
    /* the internals' gradients */
    bf16 *dy, *dy1, *dln2, *datty, *dln1, *dx, *dqkv, *dg, *dfc;
    void *head_scratch;
    /* profiling */
    int timing;
    cudaEvent_t t0, t1;
    struct fy_cu_gpt_op ops[FY_CU_GPT_MAX_OPS];
    int n_ops;
    cudaEvent_t prof_ev[PROFILE_EVENTS]; /* fy_cu_gpt_profile's, made on its first call */
};

/* The pieces of one set of block internals; returns how many. */
static int acts_plan(const struct fy_cu_gpt *g, struct fy_cu_gpt_acts *a, struct fy_cu_piece *p)
{
    const struct fy_model_config *c = &g->c;
    size_t N = (size_t)g->N, C = c->n_embd;
    int n = 0;
#define PIECE(field, count, type)                                                                  \
    (p[n++] = (struct fy_cu_piece){(count) * sizeof(type), (void **)&a->field})
    PIECE(ln1, N * C, bf16);
    PIECE(qkv, 3 * N * C, bf16);
    PIECE(atty, N * C, bf16);
    PIECE(y1, N * C, bf16);
    PIECE(ln2, N * C, bf16);
    PIECE(fc, 4 * N * C, bf16);
    PIECE(g, 4 * N * C, bf16);
    PIECE(mean1, N, float);
    PIECE(rstd1, N, float);
    PIECE(mean2, N, float);
    PIECE(rstd2, N, float);
    PIECE(attn, g->flash ? fy_cu_flash_scratch_bytes(g->B, g->T, (int)C, c->n_head)
                         : fy_cu_attention_scratch_bytes(g->B, g->T, (int)C, c->n_head),
          char);
#undef PIECE
    return n;
}

/* The unit's buffers; a Llama unit's own internals and gradients are cu_llama's, taken after. */
static int plan(struct fy_cu_gpt *g, struct fy_cu_piece *p, void **lt_ws)
{
    const struct fy_model_config *c = &g->c;
    size_t N = (size_t)g->N, C = c->n_embd, U = g->unit_max;
    int gpt = c->arch != FY_ARCH_LLAMA;
    int n = gpt ? acts_plan(g, &g->own, p) : 0;
#define PIECE(field, count, type)                                                                  \
    (p[n++] = (struct fy_cu_piece){(count) * sizeof(type), (void **)&g->field})
    for (int i = 0; i < FY_CU_GPT_QUEUE; i++) {
        PIECE(st[i].wts, U, float);
        PIECE(st[i].grad, g->grad_n, float);
        PIECE(st[i].norm_wts, 2 * C, float);
        PIECE(st[i].in0, N * C, float);
        PIECE(st[i].in1, N * C, float);
        PIECE(st[i].out, N * C, float);
        PIECE(st[i].losses, N, float);
        PIECE(st[i].tokens, N, int32_t);
        PIECE(st[i].targets, N, int32_t);
    }
    PIECE(pbf, U, bf16);
    PIECE(lnf, 2 * C, bf16);
    if (gpt)
        PIECE(ln_scratch, fy_cu_layernorm_backward_scratch(g->N, (int)C), float);
    PIECE(x, N * C, bf16);
    PIECE(y, N * C, bf16);
    PIECE(dy, N * C, bf16);
    if (gpt) {
        PIECE(dy1, N * C, bf16);
        PIECE(dln2, N * C, bf16);
        PIECE(datty, N * C, bf16);
        PIECE(dln1, N * C, bf16);
    }
    PIECE(dx, N * C, bf16);
    if (gpt) {
        PIECE(dqkv, 3 * N * C, bf16);
        PIECE(dg, 4 * N * C, bf16);
        PIECE(dfc, 4 * N * C, bf16);
    }
    PIECE(head_scratch, fy_cu_head_scratch_bytes(g->head_rows, c->vocab), char);
#undef PIECE
    p[n++] = (struct fy_cu_piece){LT_WORKSPACE, lt_ws};
    return n;
}

static void setup_shape(struct fy_cu_gpt *g, const struct fy_model_config *c, int B, int T)
{
    g->c = *c;
    fy_gpt2_block_layout(c, &g->lay);
    g->B = B;
    g->T = T;
    g->N = B * T;
    /* FUYOU_CUDA_ATTENTION=materialised selects the first version, for comparisons. */
    g->flash = fy_cu_flash_supported((int)c->n_embd, (int)c->n_head) &&
               !fy_knob_cuda_materialised_attention();
    /* FUYOU_CUDA_FUSE=0 runs GELU and the residual adds as separate kernels, for comparisons. */
    g->fuse = !fy_knob_cuda_unfused();
    size_t per_row = fy_cu_head_scratch_bytes(1, c->vocab);
    size_t rows = per_row ? HEAD_CHUNK_BYTES / per_row : HEAD_CHUNK_MAX;
    rows = rows < HEAD_CHUNK_MIN ? HEAD_CHUNK_MIN : rows > HEAD_CHUNK_MAX ? HEAD_CHUNK_MAX : rows;
    g->head_rows = (int)(rows < (size_t)g->N ? rows : (size_t)g->N);
    g->unit_max = 0;
    for (unsigned u = 0; u < fy_model_unit_count(c); u++)
        if (fy_model_unit_params(c, u) > g->unit_max)
            g->unit_max = fy_model_unit_params(c, u);
    g->block_n = fy_model_unit_params(c, 1);
    /* the head's gradients side by side: the head weight's [V][C] and the final norm's (2C at
     * most), which a GPT-2 embeddings unit (positions included) already covers */
    size_t head = (size_t)c->vocab * c->n_embd + 2 * (size_t)c->n_embd;
    g->grad_n = head > g->unit_max ? head : g->unit_max;
}

size_t fy_cu_gpt_arena_bytes(const struct fy_model_config *c, int B, int T)
{
    struct fy_cu_gpt g;
    memset(&g, 0, sizeof g);
    setup_shape(&g, c, B, T);
    struct fy_cu_piece p[64];
    void *ws;
    size_t total = fy_cu_arena_pieces_footprint(p, plan(&g, p, &ws));
    return total + (c->arch == FY_ARCH_LLAMA ? fy_cu_llama_arena_bytes(c, B, T) : 0);
}

int fy_cu_gpt_new(struct fy_cu_gpt **out, struct fy_cu_arena *arena, const struct fy_model_config *c,
                  int B, int T)
{
    *out = NULL;
    unsigned hs = c->n_embd / c->n_head;
    if (c->arch == FY_ARCH_LLAMA)
        FY_TRY(fy_cu_llama_check(c));
    if (c->n_embd % 8 != 0 || hs % 8 != 0) {
        fy_error("the CUDA backend needs n_embd (%u) and the head size (%u) to be multiples of 8",
                 c->n_embd, hs);
        return -EINVAL;
    }
    struct fy_cu_gpt *g = (struct fy_cu_gpt *)calloc(1, sizeof *g);
    if (g == NULL)
        return -ENOMEM;
    g->ready_fd = -1;
    setup_shape(g, c, B, T);
    struct fy_cu_piece p[64];
    void *lt_ws = NULL;
    size_t mark = arena->used; /* a failure below gives back what was carved */
    if (fy_cu_arena_take_pieces(arena, p, plan(g, p, &lt_ws)) < 0) {
        fy_error("the GPU arena (%.2f GiB) cannot hold the model's working buffers for batch "
                 "%d x %d (%.2f GiB): raise --gpu-mem or lower the batch",
                 (double)arena->size / (1 << 30), B, T,
                 (double)fy_cu_gpt_arena_bytes(c, B, T) / (1 << 30));
        free(g);
        return -ENOMEM;
    }
    g->ready_fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
    int rc = g->ready_fd < 0 ? -errno : 0;
    if (rc < 0)
        fy_error("cu_gpt: eventfd: %s", strerror(-rc));
    if (rc == 0)
        rc = fy_cu_lt_new(&g->lt, lt_ws, LT_WORKSPACE);
    if (rc == 0 && (cudaStreamCreateWithFlags(&g->compute, cudaStreamNonBlocking) != cudaSuccess ||
                    cudaStreamCreateWithFlags(&g->h2d, cudaStreamNonBlocking) != cudaSuccess ||
                    cudaStreamCreateWithFlags(&g->d2h, cudaStreamNonBlocking) != cudaSuccess ||
                    cudaEventCreate(&g->t0) != cudaSuccess || cudaEventCreate(&g->t1) != cudaSuccess)) {
        fy_error("CUDA: cannot create the backend's streams and events");
        rc = -EIO;
    }
    for (int i = 0; rc == 0 && i < FY_CU_GPT_QUEUE; i++) {
        struct staging *st = &g->st[i];
        if (cudaEventCreateWithFlags(&st->uploaded, cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&st->computed, cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreate(&st->done) != cudaSuccess || cudaEventCreate(&st->d2h_begin) != cudaSuccess ||
            cudaHostAlloc((void **)&st->host_losses, (size_t)g->N * sizeof(float),
                          cudaHostAllocDefault) != cudaSuccess) {
            fy_error("CUDA: cannot create the events and loss buffers of the backend's staging");
            rc = -EIO;
        }
        for (int k = 0; rc == 0 && k < 2 * STAGING_UPLOADS; k++)
            if (cudaEventCreate(&st->up_ev[k]) != cudaSuccess) {
                fy_error("CUDA: cannot create the upload timing events of the backend's staging");
                rc = -EIO;
            }
    }
    if (rc == 0 && c->arch == FY_ARCH_LLAMA) {
        struct fy_cu_llama_env env = {g->lt, g->compute, g->head_scratch, g->head_rows};
        rc = fy_cu_llama_new(&g->llama, arena, c, B, T, &env);
    }
    if (rc < 0) {
        fy_cu_gpt_destroy(&g);
        fy_cu_arena_reset(arena, mark);
        return rc;
    }
    *out = g;
    return 0;
}

void fy_cu_gpt_destroy(struct fy_cu_gpt **gp)
{
    if (gp == NULL || *gp == NULL)
        return;
    struct fy_cu_gpt *g = *gp;
    while (g->pending > 0 && fy_cu_gpt_finish(g, NULL) == 0) /* nothing may still write into buffers */
        ;                                                  /* about to be reused */
    fy_cu_llama_destroy(&g->llama);
    fy_cu_lt_destroy(&g->lt);
    for (int i = 0; i < FY_CU_GPT_QUEUE; i++) {
        struct staging *st = &g->st[i];
        if (st->uploaded)
            cudaEventDestroy(st->uploaded);
        if (st->computed)
            cudaEventDestroy(st->computed);
        if (st->done)
            cudaEventDestroy(st->done);
        for (int k = 0; k < 2 * STAGING_UPLOADS; k++)
            if (st->up_ev[k])
                cudaEventDestroy(st->up_ev[k]);
        if (st->d2h_begin)
            cudaEventDestroy(st->d2h_begin);
        if (st->host_losses)
            cudaFreeHost(st->host_losses);
    }
    if (g->ready_fd >= 0)
        close(g->ready_fd);
    if (g->t0)
        cudaEventDestroy(g->t0);
    if (g->t1)
        cudaEventDestroy(g->t1);
    for (int i = 0; i < PROFILE_EVENTS; i++)
        if (g->prof_ev[i])
            cudaEventDestroy(g->prof_ev[i]);
    if (g->compute)
        cudaStreamDestroy(g->compute);
    if (g->h2d)
        cudaStreamDestroy(g->h2d);
    if (g->d2h)
        cudaStreamDestroy(g->d2h);
    free(g);
    *gp = NULL;
}

/* ---- the host interface's transfers: each call stages through its own buffers ---- */

static int call_begin(struct fy_cu_gpt *g, struct staging **out)
{
    if (g->pending == FY_CU_GPT_QUEUE) {
        fy_error("cu_gpt: %d calls already in flight: finish one before queueing another",
                 g->pending);
        return -EBUSY;
    }
    struct staging *st = &g->st[(g->first + g->pending) % FY_CU_GPT_QUEUE];
    st->loss = NULL;
    st->targets_host = NULL;
    st->zero_host = NULL;
    st->n_outs = 0;
    st->n_up = 0;
    st->act_out_host = NULL;
    st->act_out_dev = NULL;
    *out = st;
    return 0;
}

/* Host input of a call that a call still in flight downloads into: the layer-by-layer pipeline
 * feeds each unit's output to the next unit, and the upload must not read it before it is home. */
static int order_after_writers(struct fy_cu_gpt *g, const void *host, size_t bytes)
{
    const char *lo = (const char *)host, *hi = lo + bytes;
    for (int i = 0; i < g->pending; i++) {
        struct staging *c = &g->st[(g->first + i) % FY_CU_GPT_QUEUE];
        for (int k = 0; k < c->n_outs; k++)
            if (lo < c->outs[k].p + c->outs[k].n && c->outs[k].p < hi) {
                FY_CUDA(cudaStreamWaitEvent(g->h2d, c->done, 0),
                        "ordering an upload after the downloads that produce its input");
                break;
            }
    }
    return 0;
}

static int upload(struct fy_cu_gpt *g, struct staging *st, void *dev, const void *host, size_t bytes)
{
    FY_REQUIRE(st->n_up < STAGING_UPLOADS, -EINVAL, "cu_gpt: more than %d uploads in one call",
               STAGING_UPLOADS);
    FY_TRY(order_after_writers(g, host, bytes));
    cudaEvent_t *ev = &st->up_ev[2 * st->n_up++];
    FY_CUDA(cudaEventRecord(ev[0], g->h2d), "recording an upload start");
    FY_CUDA(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, g->h2d), "upload of %zu bytes",
            bytes);
    FY_CUDA(cudaEventRecord(ev[1], g->h2d), "recording an upload end");
    return 0;
}

static size_t act_host_bytes(const struct fy_cu_gpt *g)
{
    return (size_t)g->N * g->c.n_embd * (g->host_bf16 ? sizeof(bf16) : sizeof(float));
}

/* Queues an activation input. When it is the activation output of the call still in flight just
 * before this one (the pipeline's usual case: block b's output is block b+1's input, block b's dx is
 * block b-1's dy), it is taken from that call's device copy instead of crossing PCIe twice; the
 * values are the same bits (the host holds their exact fp32 widening). Otherwise it is uploaded. */
static int act_in_queue(struct fy_cu_gpt *g, struct staging *st, struct act_in *a)
{
    const struct staging *prev =
        g->pending > 0 ? &g->st[(g->first + g->pending - 1) % FY_CU_GPT_QUEUE] : NULL;
    a->from = prev != NULL && prev->act_out_host == a->host ? prev->act_out_dev : NULL;
    if (a->from != NULL)
        return 0;
    return upload(g, st, a->staging, a->host, act_host_bytes(g));
}

/* After uploads_done: the input onto its device buffer, on the compute stream. */
static int act_in_place(struct fy_cu_gpt *g, const struct act_in *a)
{
    size_t NC = (size_t)g->N * g->c.n_embd;
    if (a->from == NULL && !g->host_bf16)
        return fy_cu_f32_to_bf16(a->dev, (const float *)a->staging, NC, g->compute);
    const bf16 *from = a->from != NULL ? a->from : (const bf16 *)a->staging;
    if (from != a->dev)
        FY_CUDA(cudaMemcpyAsync(a->dev, from, NC * sizeof(bf16), cudaMemcpyDeviceToDevice,
                                g->compute),
                "forwarding an activation on the device");
    return 0;
}

/* A weight input of a call (a unit's parameters, the final norm, the head's weight): n values
 * uploaded into the call's staging in the host's dtype, then placed on the device weights, which
 * the call before may still be computing with until this call's compute starts. */
struct weights_in {
    const void *host;
    void *staging;
    bf16 *dev;
    size_t n;
    int host_bf16; /* the host's dtype when the call was queued */
};

static size_t weight_size(const struct fy_cu_gpt *g)
{
    return g->host_wbf16 ? sizeof(bf16) : sizeof(float);
}

/* Before uploads_done: the upload, of the bytes the host's dtype takes. */
static int weights_queue(struct fy_cu_gpt *g, struct staging *st, struct weights_in *w)
{
    w->host_bf16 = g->host_wbf16;
    return upload(g, st, w->staging, w->host, w->n * weight_size(g));
}

/* After uploads_done, on the compute stream: bf16 from the host is copied as it is, since it holds
 * the bits the conversion would give (both round f32 to nearest even). */
static int weights_place(struct fy_cu_gpt *g, const struct weights_in *w)
{
    if (!w->host_bf16)
        return fy_cu_f32_to_bf16(w->dev, (const float *)w->staging, w->n, g->compute);
    FY_CUDA(cudaMemcpyAsync(w->dev, w->staging, w->n * sizeof(bf16), cudaMemcpyDeviceToDevice,
                            g->compute),
            "placing %zu bf16 weights on the device", w->n);
    return 0;
}

static int uploads_done(struct fy_cu_gpt *g, struct staging *st)
{
    FY_CUDA(cudaEventRecord(st->uploaded, g->h2d), "recording the upload event");
    FY_CUDA(cudaStreamWaitEvent(g->compute, st->uploaded, 0), "ordering compute after uploads");
    return 0;
}

static int compute_done(struct fy_cu_gpt *g, struct staging *st)
{
    FY_CUDA(cudaEventRecord(st->computed, g->compute), "recording the compute event");
    FY_CUDA(cudaStreamWaitEvent(g->d2h, st->computed, 0), "ordering downloads after compute");
    FY_CUDA(cudaEventRecord(st->d2h_begin, g->d2h), "recording the download start");
    return 0;
}

/* On the compute stream: the call's activation output from its device buffer into the call's own
 * staging in the host's dtype (the device buffer is the next call's to overwrite). */
static int act_out_stage(struct fy_cu_gpt *g, struct staging *st, const bf16 *dev)
{
    size_t NC = (size_t)g->N * g->c.n_embd;
    if (!g->host_bf16)
        return fy_cu_bf16_to_f32(st->out, dev, NC, g->compute);
    FY_CUDA(cudaMemcpyAsync(st->out, dev, NC * sizeof(bf16), cudaMemcpyDeviceToDevice, g->compute),
            "staging an activation output");
    return 0;
}

static int download(struct fy_cu_gpt *g, struct staging *st, void *host, const void *dev,
                    size_t bytes)
{
    FY_REQUIRE(st->n_outs < STAGING_OUTS, -EINVAL, "cu_gpt: more than %d outputs in one call",
               STAGING_OUTS);
    st->outs[st->n_outs].p = (const char *)host;
    st->outs[st->n_outs].n = bytes;
    st->n_outs++;
    FY_CUDA(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, g->d2h),
            "download of %zu bytes", bytes);
    return 0;
}

static void CUDART_CB results_home(void *arg)
{
    /* runs on a CUDA thread: no CUDA calls here, only the wake-up of whoever polls ready_fd */
    struct fy_cu_gpt *g = (struct fy_cu_gpt *)arg;
    uint64_t one = 1;
    while (write(g->ready_fd, &one, sizeof one) < 0 && errno == EINTR)
        ;
}

/* Queues the end of a call whose body returned rc; a failed body's partial work is drained so
 * that its staging can be reused. */
static int call_end(struct fy_cu_gpt *g, struct staging *st, int rc)
{
    if (rc < 0) {
        cudaStreamSynchronize(g->h2d);
        cudaStreamSynchronize(g->compute);
        cudaStreamSynchronize(g->d2h);
        return rc;
    }
    FY_CUDA(cudaEventRecord(st->done, g->d2h), "recording the download event");
    FY_CUDA(cudaLaunchHostFunc(g->d2h, results_home, g), "queueing the completion signal");
    g->pending++;
    return 0;
}

int fy_cu_gpt_finish(struct fy_cu_gpt *g, struct fy_cu_gpt_copy_times *times)
{
    FY_REQUIRE(g->pending > 0, -EINVAL, "cu_gpt: finish without a call in flight");
    struct staging *st = &g->st[g->first];
    g->first = (g->first + 1) % FY_CU_GPT_QUEUE;
    g->pending--;
    FY_CUDA(cudaEventSynchronize(st->done), "waiting for the results of a GPT call");
    uint64_t count; /* the completion signal follows the event on the same stream */
    ssize_t got;
    while ((got = read(g->ready_fd, &count, sizeof count)) < 0 && errno == EINTR)
        ;
    FY_REQUIRE(got == (ssize_t)sizeof count, -EIO, "cu_gpt: reading the completion eventfd: %s",
               got < 0 ? strerror(errno) : "short read");
    if (times != NULL) {
        times->h2d_ms = 0;
        for (int k = 0; k < st->n_up; k++) {
            float ms = 0;
            FY_CUDA(cudaEventElapsedTime(&ms, st->up_ev[2 * k], st->up_ev[2 * k + 1]),
                    "reading an upload time");
            times->h2d_ms += ms;
        }
        FY_CUDA(cudaEventElapsedTime(&times->d2h_ms, st->d2h_begin, st->done),
                "reading the download time");
    }
    if (st->loss != NULL) {
        /* mean over the rows with a target, summed in row order (deterministic) */
        double sum = 0;
        long rows = 0;
        for (int i = 0; i < g->N; i++)
            if (st->targets_host[i] >= 0) {
                sum += st->host_losses[i];
                rows++;
            }
        *st->loss = rows ? sum / (double)rows : 0.0;
    }
    if (st->zero_host != NULL)
        memset(st->zero_host, 0, st->zero_n * sizeof(float));
    return 0;
}

int fy_cu_gpt_pending(const struct fy_cu_gpt *g) { return g->pending; }

int fy_cu_gpt_ready_fd(const struct fy_cu_gpt *g) { return g->ready_fd; }

#define P(field) (params + g->lay.field)
#define G(field) (dparams + g->lay.field)

/* Per-op timing for profiling (fy_cu_gpt_set_timing): events around each op, summed by name. */
#define OP(name, call)                                                                             \
    do {                                                                                           \
        int fy_op_slot_ = g->timing ? timing_begin(g, name) : -1;                                  \
        FY_TRY(call);                                                                              \
        if (fy_op_slot_ >= 0)                                                                      \
            FY_TRY(timing_end(g, fy_op_slot_));                                                    \
    } while (0)

static int timing_begin(struct fy_cu_gpt *g, const char *name)
{
    int slot = 0;
    while (slot < g->n_ops && strcmp(g->ops[slot].name, name) != 0)
        slot++;
    if (slot == g->n_ops) {
        if (g->n_ops == FY_CU_GPT_MAX_OPS)
            return -1;
        snprintf(g->ops[slot].name, sizeof g->ops[slot].name, "%s", name);
        g->ops[slot].ms = 0;
        g->n_ops++;
    }
    if (cudaEventRecord(g->t0, g->compute) != cudaSuccess)
        return -1;
    return slot;
}

static int timing_end(struct fy_cu_gpt *g, int slot)
{
    FY_CUDA(cudaEventRecord(g->t1, g->compute), "recording a timing event");
    FY_CUDA(cudaEventSynchronize(g->t1), "waiting for a timing event");
    float ms = 0;
    FY_CUDA(cudaEventElapsedTime(&ms, g->t0, g->t1), "reading a timing event");
    g->ops[slot].ms += ms;
    return 0;
}

/* The block's forward from x into y, keeping every internal in `a` for the backward. y == NULL:
 * the recompute for the backward, which stops before the MLP's down product (its output is never
 * read there; a third of the recomputed products' work). have: the kinds (FY_ACT_BIT of common/
 * actplan.h) already in `a`, uploaded from where the forward swapped them, whose ops are skipped;
 * every other op runs as in the full forward, on the same inputs, so the set ends up with the same
 * bits whatever the mix. LayerNorms always run (their outputs are never swapped). */
static int block_forward_device(struct fy_cu_gpt *g, const bf16 *params, const bf16 *x, bf16 *y,
                                struct fy_cu_gpt_acts *a, unsigned have)
{
    int N = g->N, C = (int)g->c.n_embd, NH = (int)g->c.n_head;
    size_t NC = (size_t)N * C;
    cudaStream_t s = g->compute;
    OP("layernorm fwd", fy_cu_layernorm_forward(a->ln1, a->mean1, a->rstd1, x, P(ln1_w), P(ln1_b),
                                                N, C, s));
    if (!(have & FY_ACT_BIT(FY_ACT_QKV)))
        OP("matmul qkv fwd", fy_cu_matmul_forward(g->lt, a->qkv, a->ln1, P(qkv_w), P(qkv_b), N, C,
                                                  3 * C, s));
    if (!(have & FY_ACT_BIT(FY_ACT_ATTN))) {
        if (g->flash)
            OP("attention fwd", fy_cu_flash_forward(a->atty, a->qkv, a->attn, g->B, g->T, C, NH,
                                                    s));
        else
            OP("attention fwd", fy_cu_attention_forward(g->lt, a->atty, a->qkv, a->attn, g->B, g->T,
                                                        C, NH, s));
    }
    if (!(have & FY_ACT_BIT(FY_ACT_RESID))) {
        if (g->fuse) {
            OP("matmul attn-proj fwd", fy_cu_matmul_forward_ex(g->lt, a->y1, a->atty, P(attn_w),
                                                               P(attn_b), x, NULL, N, C, C, s));
        } else {
            OP("matmul attn-proj fwd", fy_cu_matmul_forward(g->lt, a->y1, a->atty, P(attn_w),
                                                            P(attn_b), N, C, C, s));
            OP("residual fwd", fy_cu_residual_forward(a->y1, a->y1, x, NC, s));
        }
    }
    OP("layernorm fwd", fy_cu_layernorm_forward(a->ln2, a->mean2, a->rstd2, a->y1, P(ln2_w),
                                                P(ln2_b), N, C, s));
    unsigned mlp = FY_ACT_BIT(FY_ACT_FC) | FY_ACT_BIT(FY_ACT_GELU);
    if (g->fuse) {
        /* one product writes both fc and g: it runs unless both are given, and rewriting the given
         * one leaves it as it was (the same inputs through the same algorithm) */
        if ((have & mlp) != mlp)
            OP("matmul fc fwd", fy_cu_matmul_forward_ex(g->lt, a->g, a->ln2, P(fc_w), P(fc_b), NULL,
                                                        a->fc, N, C, 4 * C, s));
        if (y == NULL)
            return 0;
        OP("matmul proj fwd", fy_cu_matmul_forward_ex(g->lt, y, a->g, P(proj_w), P(proj_b), a->y1,
                                                      NULL, N, 4 * C, C, s));
        return 0;
    }
    if (!(have & FY_ACT_BIT(FY_ACT_FC)))
        OP("matmul fc fwd", fy_cu_matmul_forward(g->lt, a->fc, a->ln2, P(fc_w), P(fc_b), N, C,
                                                 4 * C, s));
    if (!(have & FY_ACT_BIT(FY_ACT_GELU)))
        OP("gelu fwd", fy_cu_gelu_forward(a->g, a->fc, 4 * NC, s));
    if (y == NULL)
        return 0;
    OP("matmul proj fwd", fy_cu_matmul_forward(g->lt, y, a->g, P(proj_w), P(proj_b), N, 4 * C, C,
                                               s));
    OP("residual fwd", fy_cu_residual_forward(y, y, a->y1, NC, s));
    return 0;
}

size_t fy_cu_gpt_acts_bytes(const struct fy_model_config *c, int B, int T)
{
    if (c->arch == FY_ARCH_LLAMA)
        return fy_cu_llama_acts_bytes(c, B, T);
    struct fy_cu_gpt g;
    memset(&g, 0, sizeof g);
    setup_shape(&g, c, B, T);
    struct fy_cu_piece p[16];
    struct fy_cu_gpt_acts a;
    return fy_cu_arena_pieces_footprint(p, acts_plan(&g, &a, p));
}

/* The GPT-2 units on a Llama model's unit would use buffers it does not have. */
static int gpt2_only(const struct fy_cu_gpt *g, const char *what)
{
    FY_REQUIRE(g->llama == NULL, -EINVAL,
               "%s: this unit holds a Llama model, whose device units are cu_llama's", what);
    return 0;
}

int fy_cu_gpt_acts_take(struct fy_cu_gpt *g, struct fy_cu_arena *arena, struct fy_cu_gpt_acts *a)
{
    FY_TRY(gpt2_only(g, "fy_cu_gpt_acts_take"));
    struct fy_cu_piece p[16];
    /* -ENOMEM: the caller knows what it was planning and says so */
    return fy_cu_arena_take_pieces(arena, p, acts_plan(g, a, p));
}

/* Kept set k of the model's architecture from the arena (-ENOMEM, nothing taken, when it does not
 * fit). */
static int kept_take(struct fy_cu_gpt *g, struct fy_cu_arena *arena, int k)
{
    if (g->llama != NULL)
        return fy_cu_llama_acts_take(g->llama, arena, &g->kept[k].llama);
    return fy_cu_gpt_acts_take(g, arena, &g->kept[k].gpt);
}

int fy_cu_gpt_dev_block_forward(struct fy_cu_gpt *g, const bf16 *params, const bf16 *x, bf16 *y,
                                struct fy_cu_gpt_acts *keep)
{
    FY_TRY(gpt2_only(g, "fy_cu_gpt_dev_block_forward"));
    FY_REQUIRE(y != NULL, -EINVAL, "fy_cu_gpt_dev_block_forward: no output buffer");
    return block_forward_device(g, params, x, y, keep != NULL ? keep : &g->own, 0);
}

int fy_cu_gpt_dev_block_backward(struct fy_cu_gpt *g, const bf16 *params, const bf16 *x,
                                 const bf16 *dy, bf16 *dx, float *dparams, struct fy_cu_gpt_acts *kept)
{
    FY_TRY(gpt2_only(g, "fy_cu_gpt_dev_block_backward"));
    int N = g->N, C = (int)g->c.n_embd, NH = (int)g->c.n_head;
    size_t NC = (size_t)N * C;
    cudaStream_t s = g->compute;
    struct fy_cu_gpt_acts *a = kept;
    if (a == NULL) { /* recompute from the checkpoint x */
        a = &g->own;
        FY_TRY(block_forward_device(g, params, x, NULL, a, 0));
    }
    FY_CUDA(cudaMemsetAsync(dparams, 0, g->lay.total * sizeof(float), s), "zeroing gradients");
    /* MLP branch: y = y1 + proj(gelu(fc(ln2(y1)))) */
    /* GELU's backward stays a kernel of its own: cuBLASLt's DGELU epilogue made this product
     * slower (494 against 762 TFLOP/s at 2.7B) than the separate kernel costs. */
    OP("matmul proj bwd", fy_cu_matmul_backward(g->lt, g->dg, G(proj_w), G(proj_b), dy, a->g,
                                                P(proj_w), N, 4 * C, C, s));
    OP("gelu bwd", fy_cu_gelu_backward(g->dfc, a->fc, g->dg, 4 * NC, s));
    OP("matmul fc bwd", fy_cu_matmul_backward(g->lt, g->dln2, G(fc_w), G(fc_b), g->dfc, a->ln2, P(fc_w), N, C,
                                 4 * C, s));
    FY_CUDA(cudaMemcpyAsync(g->dy1, dy, NC * sizeof(bf16), cudaMemcpyDeviceToDevice, s),
            "copying the residual gradient");
    OP("layernorm bwd", fy_cu_layernorm_backward(g->dy1, G(ln2_w), G(ln2_b), g->ln_scratch, g->dln2, a->y1,
                                    P(ln2_w), a->mean2, a->rstd2, N, C, s));
    /* attention branch: y1 = x + attn_proj(attention(qkv(ln1(x)))) */
    OP("matmul attn-proj bwd", fy_cu_matmul_backward(g->lt, g->datty, G(attn_w), G(attn_b), g->dy1, a->atty, P(attn_w),
                                 N, C, C, s));
    if (g->flash)
        OP("attention bwd", fy_cu_flash_backward(g->dqkv, g->datty, a->atty, a->qkv, a->attn,
                                                 g->B, g->T, C, NH, s));
    else
        OP("attention bwd", fy_cu_attention_backward(g->lt, g->dqkv, g->datty, a->qkv, a->attn,
                                                     g->B, g->T, C, NH, s));
    OP("matmul qkv bwd", fy_cu_matmul_backward(g->lt, g->dln1, G(qkv_w), G(qkv_b), g->dqkv, a->ln1, P(qkv_w), N,
                                 C, 3 * C, s));
    FY_CUDA(cudaMemcpyAsync(dx, g->dy1, NC * sizeof(bf16), cudaMemcpyDeviceToDevice, s),
            "copying the residual gradient");
    OP("layernorm bwd", fy_cu_layernorm_backward(dx, G(ln1_w), G(ln1_b), g->ln_scratch, g->dln1, x,
                                    P(ln1_w), a->mean1, a->rstd1, N, C, s));
    return 0;
}

/* ---- swapped internals: pieces of a block's set in host buffers (struct fy_block_saved) ---- */

/* The Llama blocks' internals are not the GPT-2 kinds that common/actplan.h names: they are kept on
 * the GPU or recomputed, never swapped. */
static int llama_not_swapped(const struct fy_cu_gpt *g)
{
    FY_REQUIRE(g->llama == NULL, -ENOTSUP,
               "the CUDA backend's Llama blocks keep their internals on the GPU or recompute "
               "them, never swap them: train Llama models with --act-plan auto or recompute");
    return 0;
}

/* The kinds `saved` gives, as a mask (0 for NULL or nothing given, which is the plain call), after
 * checking that this unit can take them now. */
static int saved_mask(const struct fy_cu_gpt *g, const struct fy_block_saved *saved, unsigned *mask)
{
    *mask = 0;
    for (int k = 0; saved != NULL && k < FY_ACT_KINDS; k++)
        if (saved->at[k] != NULL)
            *mask |= FY_ACT_BIT(k);
    FY_REQUIRE((*mask & ~FY_ACT_SWAPPABLE) == 0, -EINVAL,
               "cu_gpt: saved internals of kinds 0x%x, which are never swapped (only qkv, attn, "
               "resid, fc and gelu are)", *mask & ~FY_ACT_SWAPPABLE);
    if (*mask == 0)
        return 0;
    FY_TRY(llama_not_swapped(g));
    FY_REQUIRE(g->swap_ready, -EINVAL,
               "cu_gpt: a block call with swapped internals before their device sets were taken "
               "(fy_cu_gpt_swap_sets, the backend's model_swap, after preparing)");
    /* the materialised attention's statistics are the whole B x NH x T x T probabilities, which
     * the host layout of ATTN (fy_actplan_sizes_backend) has no room for */
    FY_REQUIRE(g->flash || !(*mask & FY_ACT_BIT(FY_ACT_ATTN)), -ENOTSUP,
               "cu_gpt: the attention's internals (attn) cannot be swapped with the materialised "
               "attention (FUYOU_CUDA_ATTENTION=materialised): recompute them or use the flash "
               "attention");
    return 0;
}

/* One piece of a swapped kind: a tensor of a device set and its place in the host buffer. */
struct swap_piece {
    void *dev;
    char *host;
    size_t bytes;
};

/* Bytes of the flash attention's logsumexp L [B][NH][T] f32, the start of its scratch: all of the
 * scratch a backward reads (D after it is the backward's own). */
static size_t lse_bytes(const struct fy_cu_gpt *g)
{
    return (size_t)g->B * g->c.n_head * (size_t)g->T * sizeof(float);
}

/* The pieces of the kinds in mask between set `a` and the host buffers of `saved`, in the layout
 * of fy_actplan_sizes_backend "cuda": each kind's tensor as on the device, ATTN's attention output
 * with the logsumexp right after it. Returns how many (at most SWAP_PIECES). */
#define SWAP_PIECES 6
static int swap_pieces(const struct fy_cu_gpt *g, const struct fy_cu_gpt_acts *a,
                       const struct fy_block_saved *saved, unsigned mask, struct swap_piece *p)
{
    size_t NC = (size_t)g->N * g->c.n_embd * sizeof(bf16);
    char *at[FY_ACT_KINDS];
    for (int k = 0; k < FY_ACT_KINDS; k++)
        at[k] = (char *)saved->at[k];
    int n = 0;
    if (mask & FY_ACT_BIT(FY_ACT_QKV))
        p[n++] = (struct swap_piece){a->qkv, at[FY_ACT_QKV], 3 * NC};
    if (mask & FY_ACT_BIT(FY_ACT_ATTN)) {
        p[n++] = (struct swap_piece){a->atty, at[FY_ACT_ATTN], NC};
        p[n++] = (struct swap_piece){a->attn, at[FY_ACT_ATTN] + NC, lse_bytes(g)};
    }
    if (mask & FY_ACT_BIT(FY_ACT_RESID))
        p[n++] = (struct swap_piece){a->y1, at[FY_ACT_RESID], NC};
    if (mask & FY_ACT_BIT(FY_ACT_FC))
        p[n++] = (struct swap_piece){a->fc, at[FY_ACT_FC], 4 * NC};
    if (mask & FY_ACT_BIT(FY_ACT_GELU))
        p[n++] = (struct swap_piece){a->g, at[FY_ACT_GELU], 4 * NC};
    return n;
}

/* The kept set of block `layer` (1..L), or NULL where that block is recomputed. */
static int kept_index(const struct fy_cu_gpt *g, int layer)
{
    int first = (int)g->c.n_layer - g->n_kept + 1;
    return layer >= first && layer <= (int)g->c.n_layer ? layer - first : -1;
}

static int block_forward_call(struct fy_cu_gpt *g, struct staging *st, int layer,
                              const void *params, const void *x, void *y,
                              const struct fy_block_saved *saved, unsigned mask)
{
    struct weights_in w = {params, st->wts, g->pbf, g->block_n, 0};
    struct act_in in_x = {x, st->in0, g->x, NULL};
    FY_TRY(weights_queue(g, st, &w));
    FY_TRY(act_in_queue(g, st, &in_x));
    FY_TRY(uploads_done(g, st));
    FY_TRY(weights_place(g, &w));
    FY_TRY(act_in_place(g, &in_x));
    /* a set counts as filled only once the whole forward is queued: a failure part way leaves it
     * spent, so the next backward recomputes. A block whose internals are swapped computes into
     * the call's own set instead, which its downloads read after this call's compute while the
     * next call may already compute into g->own or a kept set; a kept block's set is left spent. */
    int k = kept_index(g, layer);
    if (k >= 0)
        g->kept_full[k] = 0;
    struct fy_cu_gpt_acts *a = mask ? &st->swap : k >= 0 ? &g->kept[k].gpt : &g->own;
    if (g->llama != NULL)
        FY_TRY(fy_cu_llama_dev_block_forward(g->llama, g->pbf, g->x, g->y,
                                             k >= 0 ? &g->kept[k].llama : NULL));
    else
        FY_TRY(block_forward_device(g, g->pbf, g->x, g->y, a, 0));
    if (k >= 0 && !mask)
        g->kept_full[k] = 1;
    FY_TRY(act_out_stage(g, st, g->y));
    FY_TRY(compute_done(g, st));
    st->act_out_host = y;
    st->act_out_dev = g->y;
    FY_TRY(download(g, st, y, st->out, act_host_bytes(g)));
    /* recorded in st->outs like y, so a backward queued while this call is in flight uploads
     * them only once they are home; an earlier call still uploading from the same host buffers
     * is ahead of these downloads anyway (they follow this call's compute, which follows every
     * upload queued before it on the in-order host-to-device stream) */
    struct swap_piece pieces[SWAP_PIECES];
    int n = mask ? swap_pieces(g, a, saved, mask, pieces) : 0;
    for (int i = 0; i < n; i++)
        FY_TRY(download(g, st, pieces[i].host, pieces[i].dev, pieces[i].bytes));
    return 0;
}

int fy_cu_gpt_block_forward(struct fy_cu_gpt *g, int layer, const void *params, const void *x,
                            void *y, const struct fy_block_saved *saved)
{
    unsigned mask;
    FY_TRY(saved_mask(g, saved, &mask));
    struct staging *st;
    FY_TRY(call_begin(g, &st));
    return call_end(g, st, block_forward_call(g, st, layer, params, x, y, saved, mask));
}

static int block_backward_call(struct fy_cu_gpt *g, struct staging *st, int layer,
                               const void *params, const void *x, const void *dy, void *dx,
                               float *dparams, const struct fy_block_saved *saved, unsigned mask)
{
    struct weights_in w = {params, st->wts, g->pbf, g->block_n, 0};
    struct act_in in_x = {x, st->in0, g->x, NULL}, in_dy = {dy, st->in1, g->dy, NULL};
    FY_TRY(weights_queue(g, st, &w));
    FY_TRY(act_in_queue(g, st, &in_x));
    FY_TRY(act_in_queue(g, st, &in_dy));
    /* the swapped kinds into the call's own set: the host buffers are only read, so a second
     * backward from the same saved (clipping's second pass) finds them as they were */
    struct swap_piece pieces[SWAP_PIECES];
    int n = mask ? swap_pieces(g, &st->swap, saved, mask, pieces) : 0;
    for (int i = 0; i < n; i++)
        FY_TRY(upload(g, st, pieces[i].dev, pieces[i].host, pieces[i].bytes));
    FY_TRY(uploads_done(g, st));
    FY_TRY(weights_place(g, &w));
    FY_TRY(act_in_place(g, &in_x));
    FY_TRY(act_in_place(g, &in_dy));
    /* a set is used once: the backward also uses its attention part as scratch, so a second
     * backward of the same forward (clipping's second pass) recomputes */
    int k = kept_index(g, layer), full = k >= 0 && g->kept_full[k];
    if (k >= 0)
        g->kept_full[k] = 0;
    if (g->llama != NULL) {
        FY_TRY(fy_cu_llama_dev_block_backward(g->llama, g->pbf, g->x, g->dy, g->dx, st->grad,
                                              full ? &g->kept[k].llama : NULL));
    } else {
        struct fy_cu_gpt_acts *kept = full ? &g->kept[k].gpt : NULL;
        if (mask) { /* the rest of the call's set recomputed from x around what came from the
                       host */
            kept = &st->swap;
            FY_TRY(block_forward_device(g, g->pbf, g->x, NULL, kept, mask));
        }
        FY_TRY(fy_cu_gpt_dev_block_backward(g, g->pbf, g->x, g->dy, g->dx, st->grad, kept));
    }
    FY_TRY(act_out_stage(g, st, g->dx));
    FY_TRY(compute_done(g, st));
    st->act_out_host = dx;
    st->act_out_dev = g->dx;
    FY_TRY(download(g, st, dx, st->out, act_host_bytes(g)));
    return download(g, st, dparams, st->grad, g->block_n * sizeof(float));
}

int fy_cu_gpt_block_backward(struct fy_cu_gpt *g, int layer, const void *params, const void *x,
                             const void *dy, void *dx, float *dparams,
                             const struct fy_block_saved *saved)
{
    unsigned mask;
    FY_TRY(saved_mask(g, saved, &mask));
    struct staging *st;
    FY_TRY(call_begin(g, &st));
    return call_end(g, st,
                    block_backward_call(g, st, layer, params, x, dy, dx, dparams, saved, mask));
}

int fy_cu_gpt_dev_embed_forward(struct fy_cu_gpt *g, const bf16 *wte, const bf16 *wpe,
                                const int32_t *tokens, bf16 *x)
{
    FY_TRY(gpt2_only(g, "fy_cu_gpt_dev_embed_forward"));
    OP("embed fwd", fy_cu_embed_forward(x, tokens, wte, wpe, g->B, g->T, (int)g->c.n_embd, g->compute));
    return 0;
}

int fy_cu_gpt_dev_embed_backward(struct fy_cu_gpt *g, const int32_t *tokens, const bf16 *dx,
                                 float *dwte, float *dwpe)
{
    FY_TRY(gpt2_only(g, "fy_cu_gpt_dev_embed_backward"));
    OP("embed bwd", fy_cu_embed_backward(dwte, dwpe, dx, tokens, g->B, g->T, (int)g->c.n_embd,
                                         (int)g->c.vocab, g->compute));
    return 0;
}

int fy_cu_gpt_dev_head(struct fy_cu_gpt *g, const bf16 *lnf, const bf16 *wte, const bf16 *x,
                       const int32_t *targets, float *losses, bf16 *dx, float *dlnf, float *dwte)
{
    FY_TRY(gpt2_only(g, "fy_cu_gpt_dev_head"));
    const struct fy_model_config *c = &g->c;
    int N = g->N, C = (int)c->n_embd, V = (int)c->vocab;
    size_t NC = (size_t)N * C;
    cudaStream_t s = g->compute;
    struct fy_cu_gpt_acts *a = &g->own;
    OP("layernorm fwd", fy_cu_layernorm_forward(a->ln1, a->mean1, a->rstd1, x, lnf, lnf + C, N, C, s));
    if (dx != NULL) {
        FY_CUDA(cudaMemsetAsync(dwte, 0, (size_t)V * C * sizeof(float), s), "zeroing gradients");
        FY_CUDA(cudaMemsetAsync(dlnf, 0, 2 * (size_t)C * sizeof(float), s), "zeroing gradients");
    }
    OP("head (logits, loss, grads)", fy_cu_head(g->lt, losses, dx ? g->dln1 : NULL, dwte, a->ln1, wte, targets, N, C, V,
                                  g->head_rows, g->head_scratch, s));
    if (dx != NULL) {
        FY_CUDA(cudaMemsetAsync(dx, 0, NC * sizeof(bf16), s), "zeroing dx");
        OP("layernorm bwd", fy_cu_layernorm_backward(dx, dlnf, dlnf + C, g->ln_scratch, g->dln1, x, lnf,
                                                     a->mean1, a->rstd1, N, C, s));
    }
    return 0;
}

void fy_cu_gpt_set_timing(struct fy_cu_gpt *g, int on)
{
    g->timing = on;
    g->n_ops = 0;
}

int fy_cu_gpt_timings(const struct fy_cu_gpt *g, const struct fy_cu_gpt_op **ops)
{
    *ops = g->ops;
    return g->n_ops;
}

cudaStream_t fy_cu_gpt_stream(const struct fy_cu_gpt *g) { return g->compute; }

static int embed_forward_call(struct fy_cu_gpt *g, struct staging *st, const void *embed,
                              const int32_t *tokens, void *x)
{
    const struct fy_model_config *c = &g->c;
    struct weights_in w = {embed, st->wts, g->pbf, fy_model_unit_params(c, 0), 0};
    FY_TRY(upload(g, st, st->tokens, tokens, (size_t)g->N * sizeof(int32_t)));
    FY_TRY(weights_queue(g, st, &w));
    FY_TRY(uploads_done(g, st));
    FY_TRY(weights_place(g, &w));
    const bf16 *wte = g->pbf, *wpe = g->pbf + (size_t)c->vocab * c->n_embd;
    if (g->llama != NULL) /* no positions */
        FY_TRY(fy_cu_llama_dev_embed_forward(g->llama, wte, st->tokens, g->x));
    else
        FY_TRY(fy_cu_gpt_dev_embed_forward(g, wte, wpe, st->tokens, g->x));
    FY_TRY(act_out_stage(g, st, g->x));
    FY_TRY(compute_done(g, st));
    st->act_out_host = x;
    st->act_out_dev = g->x;
    return download(g, st, x, st->out, act_host_bytes(g));
}

int fy_cu_gpt_embed_forward(struct fy_cu_gpt *g, const void *embed, const int32_t *tokens, void *x)
{
    struct staging *st;
    FY_TRY(call_begin(g, &st));
    return call_end(g, st, embed_forward_call(g, st, embed, tokens, x));
}

static int embed_backward_call(struct fy_cu_gpt *g, struct staging *st, const int32_t *tokens,
                               const void *dx, float *dembed)
{
    const struct fy_model_config *c = &g->c;
    size_t n = fy_model_unit_params(c, 0);
    struct act_in in_dx = {dx, st->in1, g->dx, NULL};
    FY_TRY(upload(g, st, st->tokens, tokens, (size_t)g->N * sizeof(int32_t)));
    FY_TRY(upload(g, st, st->grad, dembed, n * sizeof(float)));
    FY_TRY(act_in_queue(g, st, &in_dx));
    FY_TRY(uploads_done(g, st));
    FY_TRY(act_in_place(g, &in_dx));
    float *dwte = st->grad, *dwpe = st->grad + (size_t)c->vocab * c->n_embd;
    if (g->llama != NULL)
        FY_TRY(fy_cu_llama_dev_embed_backward(g->llama, st->tokens, g->dx, dwte));
    else
        FY_TRY(fy_cu_gpt_dev_embed_backward(g, st->tokens, g->dx, dwte, dwpe));
    FY_TRY(compute_done(g, st));
    return download(g, st, dembed, st->grad, n * sizeof(float));
}

int fy_cu_gpt_embed_backward(struct fy_cu_gpt *g, const int32_t *tokens, const void *dx,
                             float *dembed)
{
    struct staging *st;
    FY_TRY(call_begin(g, &st));
    return call_end(g, st, embed_backward_call(g, st, tokens, dx, dembed));
}

/* Floats of the final unit's norm: GPT-2's LayerNorm weight and bias, Llama's RMSNorm weight. */
static size_t final_norm_n(const struct fy_cu_gpt *g)
{
    return (g->llama != NULL ? 1 : 2) * (size_t)g->c.n_embd;
}

/* An untied Llama head: its lm_head [V][C] follows the norm in the final unit. */
static int untied_head(const struct fy_cu_gpt *g) { return g->llama != NULL && !g->c.tied; }

/* The head's weight [V][C] in the host's dtype: the embeddings' token rows (GPT-2's wte, a tied
 * Llama's embed_tokens), or an untied Llama's lm_head. */
static const void *head_weight(const struct fy_cu_gpt *g, const void *final_params,
                               const void *embed)
{
    return untied_head(g) ? (const char *)final_params + g->c.n_embd * weight_size(g) : embed;
}

/* The final unit's weights: its norm's into g->lnf, the head's into g->pbf. */
static void final_weights(const struct fy_cu_gpt *g, struct staging *st, const void *final_params,
                          const void *embed, struct weights_in *norm, struct weights_in *head)
{
    *norm = (struct weights_in){final_params, st->norm_wts, g->lnf, final_norm_n(g), 0};
    *head = (struct weights_in){head_weight(g, final_params, embed), st->wts, g->pbf,
                                (size_t)g->c.vocab * g->c.n_embd, 0};
}

static int head_call(struct fy_cu_gpt *g, struct staging *st, const void *final_params,
                     const void *embed, const void *x, const int32_t *targets, double *loss,
                     void *dx, float *dfinal, float *dembed)
{
    const struct fy_model_config *c = &g->c;
    int N = g->N, C = (int)c->n_embd, V = (int)c->vocab;
    size_t wte_n = (size_t)V * C, norm_n = final_norm_n(g);
    struct weights_in norm, head;
    final_weights(g, st, final_params, embed, &norm, &head);
    FY_TRY(upload(g, st, st->targets, targets, (size_t)N * sizeof(int32_t)));
    FY_TRY(weights_queue(g, st, &norm));
    struct act_in in_x = {x, st->in0, g->x, NULL};
    /* only the head's weight of the embeddings (wte: no positions) */
    FY_TRY(weights_queue(g, st, &head));
    FY_TRY(act_in_queue(g, st, &in_x));
    FY_TRY(uploads_done(g, st));
    FY_TRY(weights_place(g, &norm));
    FY_TRY(weights_place(g, &head));
    FY_TRY(act_in_place(g, &in_x));
    int backward = dx != NULL, untied = untied_head(g);
    /* the gradients: an untied head's in the final unit's layout (norm, then lm_head), in one
     * piece; otherwise the head weight's (the embeddings') then the norm's */
    float *dnorm = untied ? st->grad : st->grad + wte_n;
    float *dhead = untied ? st->grad + C : st->grad;
    if (g->llama != NULL)
        FY_TRY(fy_cu_llama_dev_head(g->llama, g->lnf, g->pbf, g->x, st->targets, st->losses,
                                    backward ? g->dx : NULL, dnorm, dhead));
    else
        FY_TRY(fy_cu_gpt_dev_head(g, g->lnf, g->pbf, g->x, st->targets, st->losses,
                                  backward ? g->dx : NULL, dnorm, dhead));
    if (backward)
        FY_TRY(act_out_stage(g, st, g->dx));
    FY_TRY(compute_done(g, st));
    if (backward) {
        st->act_out_host = dx;
        st->act_out_dev = g->dx;
        FY_TRY(download(g, st, dx, st->out, act_host_bytes(g)));
        if (untied) { /* and the embeddings get nothing from the head */
            FY_TRY(download(g, st, dfinal, st->grad, (norm_n + wte_n) * sizeof(float)));
            st->zero_host = dembed;
            st->zero_n = wte_n;
        } else {
            FY_TRY(download(g, st, dfinal, dnorm, norm_n * sizeof(float)));
            FY_TRY(download(g, st, dembed, dhead, wte_n * sizeof(float)));
            st->zero_host = g->llama != NULL ? NULL : dembed + wte_n; /* GPT-2's positions */
            st->zero_n = (size_t)c->ctx * C;
        }
    }
    FY_TRY(download(g, st, st->host_losses, st->losses, (size_t)N * sizeof(float)));
    st->targets_host = targets;
    st->loss = loss;
    return 0;
}

int fy_cu_gpt_head(struct fy_cu_gpt *g, const void *final_params, const void *embed,
                   const void *x, const int32_t *targets, double *loss, void *dx, float *dfinal,
                   float *dembed)
{
    struct staging *st;
    FY_TRY(call_begin(g, &st));
    return call_end(g, st, head_call(g, st, final_params, embed, x, targets, loss, dx, dfinal, dembed));
}

int fy_cu_gpt_logits(struct fy_cu_gpt *g, const void *final_params, const void *embed,
                     const void *x, float *logits)
{
    const struct fy_model_config *c = &g->c;
    int N = g->N, C = (int)c->n_embd, V = (int)c->vocab;
    cudaStream_t s = g->compute;
    while (g->pending > 0) /* synchronous: whatever was queued completes first */
        FY_TRY(fy_cu_gpt_finish(g, NULL));
    struct staging *st = &g->st[g->first];
    st->n_up = 0; /* the staging's last call is finished: its counts start over */
    st->n_outs = 0;
    struct weights_in norm, head;
    final_weights(g, st, final_params, embed, &norm, &head);
    FY_TRY(weights_queue(g, st, &norm));
    FY_TRY(weights_queue(g, st, &head));
    struct act_in in_x = {x, st->in0, g->x, NULL};
    FY_TRY(upload(g, st, st->in0, x, act_host_bytes(g)));
    FY_TRY(uploads_done(g, st));
    FY_TRY(weights_place(g, &norm));
    FY_TRY(weights_place(g, &head));
    FY_TRY(act_in_place(g, &in_x));
    const bf16 *xn = g->own.ln1;
    if (g->llama != NULL)
        FY_TRY(fy_cu_llama_dev_final_norm(g->llama, g->lnf, g->x, &xn));
    else
        FY_TRY(fy_cu_layernorm_forward(g->own.ln1, g->own.mean1, g->own.rstd1, g->x, g->lnf,
                                       g->lnf + C, N, C, s));
    /* the head's scratch holds at least head_rows x V f32 logits */
    float *chunk = (float *)g->head_scratch;
    for (int r0 = 0; r0 < N; r0 += g->head_rows) {
        int rows = N - r0 < g->head_rows ? N - r0 : g->head_rows;
        FY_TRY(fy_cu_matmul_batched(g->lt, chunk, 1, xn + (size_t)r0 * C, g->pbf, rows, V, C, 0,
                                    1, 0, 0, 0, 1, 1.0f, 0.0f, s));
        FY_TRY(compute_done(g, st));
        st->n_outs = 0; /* synchronous: nothing queued after it needs ordering */
        FY_TRY(download(g, st, logits + (size_t)r0 * V, chunk, (size_t)rows * V * sizeof(float)));
        /* the chunk buffer is reused by the next rows */
        FY_CUDA(cudaStreamSynchronize(g->d2h), "waiting for a chunk of logits");
    }
    return 0;
}

int fy_cu_gpt_set_host_acts_bf16(struct fy_cu_gpt *g, int on)
{
    FY_REQUIRE(g->pending == 0, -EBUSY,
               "cu_gpt: changing the activations' host dtype with %d calls in flight", g->pending);
    g->host_bf16 = on != 0;
    return 0;
}

int fy_cu_gpt_set_host_weights_bf16(struct fy_cu_gpt *g, int on)
{
    /* each call reads the dtype while queueing (weights_queue): those in flight are not affected */
    g->host_wbf16 = on != 0;
    return 0;
}

int fy_cu_gpt_keep_layers(struct fy_cu_gpt *g, struct fy_cu_arena *arena, int max_layers)
{
    FY_REQUIRE(g->pending == 0 && g->n_kept == 0, -EBUSY,
               "cu_gpt: keeping internals with calls in flight or sets already taken");
    int most = max_layers < (int)g->c.n_layer ? max_layers : (int)g->c.n_layer;
    most = most < FY_CU_GPT_MAX_KEPT ? most : FY_CU_GPT_MAX_KEPT;
    while (g->n_kept < most && kept_take(g, arena, g->n_kept) == 0)
        g->kept_full[g->n_kept++] = 0;
    /* the sets were taken in order, but the top blocks are the ones kept: renumbering is only
     * kept_index's arithmetic */
    return g->n_kept;
}

int fy_cu_gpt_swap_sets(struct fy_cu_gpt *g, struct fy_cu_arena *arena)
{
    FY_TRY(llama_not_swapped(g));
    if (g->swap_ready)
        return 0;
    /* before any kept set: those take what is left, and a later reset must not split them */
    FY_REQUIRE(g->pending == 0 && g->n_kept == 0, -EBUSY,
               "cu_gpt: taking the swap sets with calls in flight or after kept sets were taken "
               "(they come first)");
    /* the host layout the planner sizes the saved regions with must be the one copied here */
    struct fy_actplan_sizes sizes;
    FY_TRY(fy_actplan_sizes_backend(&g->c, g->B, g->T, "cuda", &sizes));
    size_t NC = (size_t)g->N * g->c.n_embd * sizeof(bf16);
    size_t mine[FY_ACT_KINDS] = {0};
    mine[FY_ACT_QKV] = 3 * NC;
    mine[FY_ACT_ATTN] = NC + lse_bytes(g);
    mine[FY_ACT_RESID] = NC;
    mine[FY_ACT_FC] = 4 * NC;
    mine[FY_ACT_GELU] = 4 * NC;
    for (int k = 0; k < FY_ACT_KINDS; k++)
        FY_REQUIRE(!(FY_ACT_SWAPPABLE & FY_ACT_BIT(k)) || sizes.bytes[k] == mine[k] ||
                       (k == FY_ACT_ATTN && !g->flash),
                   -EINVAL, "cu_gpt: swapped %s takes %zu bytes here but %llu in the planner's "
                   "layout (fy_actplan_sizes_backend)", fy_actplan_kind_name(k), mine[k],
                   (unsigned long long)sizes.bytes[k]);
    size_t mark = arena->used, set = fy_cu_gpt_acts_bytes(&g->c, g->B, g->T);
    for (int i = 0; i < FY_CU_GPT_QUEUE; i++)
        if (fy_cu_gpt_acts_take(g, arena, &g->st[i].swap) < 0) {
            fy_cu_arena_reset(arena, mark);
            for (int j = 0; j < FY_CU_GPT_QUEUE; j++)
                memset(&g->st[j].swap, 0, sizeof g->st[j].swap);
            fy_error("the GPU arena cannot hold the %d sets of block internals that swapped "
                     "blocks compute in (%.3f GiB needed, %.3f GiB free of %.3f): raise "
                     "--gpu-mem or lower the batch",
                     FY_CU_GPT_QUEUE, (double)(FY_CU_GPT_QUEUE * set) / (1 << 30),
                     (double)(arena->size - arena->used) / (1 << 30),
                     (double)arena->size / (1 << 30));
            return -ENOMEM;
        }
    g->swap_ready = 1;
    return 0;
}

/* ---- the activation planner's profile of one block (struct fy_block_profile) ---- */

/* Small values from the index alone, base + scale * [-1, 1): finite through every op, so the
 * kernels run on ordinary data, and the same on every call. */
static __global__ void profile_fill_kernel(bf16 *p, size_t n, uint32_t seed, float base,
                                           float scale)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = ((uint32_t)i ^ seed) * 2654435761u;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = __float2bfloat16(base + scale * ((float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f));
    }
}

static int profile_fill(bf16 *p, size_t n, uint32_t seed, float base, float scale, cudaStream_t s)
{
    profile_fill_kernel<<<fy_cu_blocks(n, 256), 256, 0, s>>>(p, n, seed, base, scale);
    FY_CUDA_LAUNCHED("the profile's fill kernel");
    return 0;
}

/* The block's parameters (GPT-2-like scale, LayerNorm weights 1), its input and its output
 * gradient, in buffers that every later call rewrites before reading: pbf is placed from the
 * call's uploaded parameters, x and dy are placed from the call's inputs. */
static int profile_inputs(struct fy_cu_gpt *g)
{
    size_t C = g->c.n_embd, NC = (size_t)g->N * C;
    cudaStream_t s = g->compute;
    FY_TRY(profile_fill(g->pbf, g->lay.total, 1, 0.0f, 0.02f, s));
    FY_TRY(profile_fill(g->pbf + g->lay.ln1_w, C, 2, 1.0f, 0.0f, s));
    FY_TRY(profile_fill(g->pbf + g->lay.ln2_w, C, 3, 1.0f, 0.0f, s));
    FY_TRY(profile_fill(g->x, NC, 4, 0.0f, 1.0f, s));
    return profile_fill(g->dy, NC, 5, 0.0f, 1.0f, s);
}

/* The middle of n values (sorted in place). */
static double profile_median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v[n / 2];
}

static int profile_elapsed(cudaEvent_t from, cudaEvent_t to, double *s)
{
    float ms = 0;
    FY_CUDA(cudaEventSynchronize(to), "waiting for a profiling event");
    FY_CUDA(cudaEventElapsedTime(&ms, from, to), "reading a profiling event");
    *s = 1e-3 * ms;
    return 0;
}

/* Seconds the per-op table holds for one name (0 where that op did not run). */
static double profile_op_s(const struct fy_cu_gpt *g, const char *name)
{
    for (int i = 0; i < g->n_ops; i++)
        if (strcmp(g->ops[i].name, name) == 0)
            return 1e-3 * g->ops[i].ms;
    return 0;
}

/* Forward and backward of the whole block with timing off (the ops overlap as in training), then
 * the forward ops that produce each kind, alone (per-op events). */
static int profile_compute(struct fy_cu_gpt *g, struct fy_block_profile *out)
{
    cudaStream_t s = g->compute;
    cudaEvent_t *ev = g->prof_ev;
    double fwd[PROFILE_REPS], bwd[PROFILE_REPS], kind[FY_ACT_KINDS][PROFILE_REPS];
    memset(kind, 0, sizeof kind);
    g->timing = 0;
    /* r = -1 warms up (cuBLASLt's plans, caches); each run is waited for, so that every one
     * starts on an idle device */
    for (int r = -1; r < PROFILE_REPS; r++) {
        double t_fwd, t_bwd;
        FY_CUDA(cudaEventRecord(ev[0], s), "recording a profiling event");
        FY_TRY(block_forward_device(g, g->pbf, g->x, g->y, &g->own, 0));
        FY_CUDA(cudaEventRecord(ev[1], s), "recording a profiling event");
        /* from the set the forward just filled: the backward without recomputation */
        FY_TRY(fy_cu_gpt_dev_block_backward(g, g->pbf, g->x, g->dy, g->dx, g->st[0].grad,
                                            &g->own));
        FY_CUDA(cudaEventRecord(ev[2], s), "recording a profiling event");
        FY_TRY(profile_elapsed(ev[0], ev[1], &t_fwd));
        FY_TRY(profile_elapsed(ev[1], ev[2], &t_bwd));
        if (r >= 0) {
            fwd[r] = t_fwd;
            bwd[r] = t_bwd;
        }
    }
    /* The recompute forward (y NULL), as a backward reruns it: it stops before the MLP's down
     * product, whose residual add would otherwise share the name "residual fwd" with the
     * attention's. */
    g->timing = 1;
    for (int r = -1; r < PROFILE_REPS; r++) {
        g->n_ops = 0;
        FY_TRY(block_forward_device(g, g->pbf, g->x, NULL, &g->own, 0));
        if (r < 0)
            continue;
        kind[FY_ACT_QKV][r] = profile_op_s(g, "matmul qkv fwd");
        kind[FY_ACT_ATTN][r] = profile_op_s(g, "attention fwd");
        /* fused, the residual add is the product's epilogue and has no op of its own */
        kind[FY_ACT_RESID][r] = profile_op_s(g, "matmul attn-proj fwd") +
                                profile_op_s(g, "residual fwd");
        /* fused, one product writes fc and g and reruns unless both are kept: half its time
         * each, with fc_gelu_fused telling the planner to place the two together */
        kind[FY_ACT_FC][r] = profile_op_s(g, "matmul fc fwd");
        kind[FY_ACT_GELU][r] = profile_op_s(g, "gelu fwd");
        if (g->fuse)
            kind[FY_ACT_FC][r] = kind[FY_ACT_GELU][r] = kind[FY_ACT_FC][r] / 2;
    }
    g->timing = 0;
    out->fc_gelu_fused = g->fuse != 0;
    out->fwd_s = profile_median(fwd, PROFILE_REPS);
    out->bwd_s = profile_median(bwd, PROFILE_REPS);
    for (int k = 0; k < FY_ACT_KINDS; k++)
        out->recompute_s[k] = profile_median(kind[k], PROFILE_REPS);
    double N = g->N, C = g->c.n_embd;
    FY_REQUIRE(out->recompute_s[FY_ACT_QKV] > 0, -EIO,
               "cu_gpt: profiling timed the QKV product at 0 s");
    out->flops_per_s = 2 * N * C * 3 * C / out->recompute_s[FY_ACT_QKV];
    return 0;
}

/* Copies of `bytes` between `host` and the device buffer `dev`: each way alone on its own stream,
 * then both at once, half the bytes each way (disjoint halves), from one start event on the idle
 * compute stream to the later of the two ends. */
static int profile_copies(struct fy_cu_gpt *g, char *host, char *dev, size_t bytes,
                          struct fy_block_profile *out)
{
    cudaEvent_t *ev = g->prof_ev;
    size_t half = bytes / 2;
    double up[PROFILE_REPS], down[PROFILE_REPS], both[PROFILE_REPS];
    for (int r = -1; r < PROFILE_REPS; r++) {
        double t_up, t_down, t_a, t_b;
        FY_CUDA(cudaEventRecord(ev[0], g->h2d), "recording a profiling event");
        FY_CUDA(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, g->h2d),
                "profiling an upload of %zu bytes", bytes);
        FY_CUDA(cudaEventRecord(ev[1], g->h2d), "recording a profiling event");
        FY_TRY(profile_elapsed(ev[0], ev[1], &t_up));
        FY_CUDA(cudaEventRecord(ev[0], g->d2h), "recording a profiling event");
        FY_CUDA(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, g->d2h),
                "profiling a download of %zu bytes", bytes);
        FY_CUDA(cudaEventRecord(ev[1], g->d2h), "recording a profiling event");
        FY_TRY(profile_elapsed(ev[0], ev[1], &t_down));
        FY_CUDA(cudaEventRecord(ev[0], g->compute), "recording a profiling event");
        FY_CUDA(cudaStreamWaitEvent(g->h2d, ev[0], 0), "starting the profile's copies together");
        FY_CUDA(cudaStreamWaitEvent(g->d2h, ev[0], 0), "starting the profile's copies together");
        FY_CUDA(cudaMemcpyAsync(dev, host, half, cudaMemcpyHostToDevice, g->h2d),
                "profiling an upload of %zu bytes", half);
        FY_CUDA(cudaMemcpyAsync(host + half, dev + half, half, cudaMemcpyDeviceToHost, g->d2h),
                "profiling a download of %zu bytes", half);
        FY_CUDA(cudaEventRecord(ev[1], g->h2d), "recording a profiling event");
        FY_CUDA(cudaEventRecord(ev[2], g->d2h), "recording a profiling event");
        FY_TRY(profile_elapsed(ev[0], ev[1], &t_a));
        FY_TRY(profile_elapsed(ev[0], ev[2], &t_b));
        if (r < 0)
            continue;
        up[r] = t_up;
        down[r] = t_down;
        both[r] = t_a > t_b ? t_a : t_b;
    }
    out->h2d_Bps = (double)bytes / profile_median(up, PROFILE_REPS);
    out->d2h_Bps = (double)bytes / profile_median(down, PROFILE_REPS);
    out->duplex_Bps = (double)(2 * half) / profile_median(both, PROFILE_REPS);
    return 0;
}

static int profile_run(struct fy_cu_gpt *g, void *host, size_t host_bytes,
                       struct fy_block_profile *out)
{
    for (int i = 0; i < PROFILE_EVENTS; i++)
        if (g->prof_ev[i] == NULL)
            FY_CUDA(cudaEventCreate(&g->prof_ev[i]), "creating the profiling events");
    FY_TRY(profile_inputs(g));
    FY_TRY(profile_compute(g, out));
    /* the copies go through the unit's own fc: the size of the largest kind a block swaps, and
     * scratch that the next forward or recompute rewrites */
    size_t dev_bytes = 4 * (size_t)g->N * g->c.n_embd * sizeof(bf16);
    FY_CUDA(cudaStreamSynchronize(g->compute), "waiting for the profile's compute");
    return profile_copies(g, (char *)host, (char *)g->own.fc,
                          host_bytes < dev_bytes ? host_bytes : dev_bytes, out);
}

static int profile_sync(struct fy_cu_gpt *g)
{
    FY_CUDA(cudaStreamSynchronize(g->compute), "waiting for the profile's compute");
    FY_CUDA(cudaStreamSynchronize(g->h2d), "waiting for the profile's uploads");
    FY_CUDA(cudaStreamSynchronize(g->d2h), "waiting for the profile's downloads");
    return 0;
}

int fy_cu_gpt_profile(struct fy_cu_gpt *g, struct fy_cu_arena *arena, void *host,
                      size_t host_bytes, struct fy_block_profile *out)
{
    FY_REQUIRE(g->llama == NULL, -ENOTSUP,
               "cu_gpt: a Llama model's blocks are not profiled: the planner's profile times the "
               "GPT-2 internals that swapping moves, and Llama blocks keep theirs on the GPU or "
               "recompute them (--act-plan auto keeps what fits)");
    FY_REQUIRE(g->pending == 0, -EBUSY,
               "cu_gpt: profiling with %d calls in flight (finish them first)", g->pending);
    FY_REQUIRE(host != NULL && host_bytes >= PROFILE_HOST_MIN, -EINVAL,
               "cu_gpt: profiling the copies needs at least %u bytes of pinned host memory, not "
               "%zu", PROFILE_HOST_MIN, host != NULL ? host_bytes : 0);
    /* pageable memory would be copied through a bounce buffer, at a speed training never sees */
    cudaPointerAttributes attr;
    FY_CUDA(cudaPointerGetAttributes(&attr, host), "looking up the profile's host memory");
    FY_REQUIRE(attr.type == cudaMemoryTypeHost, -EINVAL,
               "cu_gpt: profiling the copies through host memory that is not pinned (register "
               "it with the backend first)");
    memset(out, 0, sizeof *out);
    /* a caller profiling the ops itself finds its table and switch as they were */
    int timing = g->timing, n_ops = g->n_ops;
    struct fy_cu_gpt_op ops[FY_CU_GPT_MAX_OPS];
    memcpy(ops, g->ops, sizeof ops);
    int rc = profile_run(g, host, host_bytes, out);
    g->timing = timing;
    g->n_ops = n_ops;
    memcpy(g->ops, ops, sizeof ops);
    /* nothing of the profile may still run when the next call rewrites its buffers */
    int sync = profile_sync(g);
    if (rc < 0)
        return rc;
    FY_TRY(sync);
    out->gpu_free = arena->size - arena->used;
    out->set_bytes = fy_cu_gpt_acts_bytes(&g->c, g->B, g->T);
    return 0;
}
