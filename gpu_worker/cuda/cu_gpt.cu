/* The GPT units on the GPU, composed from the kernels of cu_norm, cu_matmul and cu_attention.
 * A host-interface call uploads its inputs on the host-to-device stream into its own staging
 * buffers, computes on the compute stream and downloads its outputs on the device-to-host stream,
 * each stream waiting on the previous one's event, and returns without waiting: with two calls in
 * flight the second one's uploads run while the first computes. Nothing synchronises the device;
 * fy_cu_gpt_finish waits for one call's event. */
#include "cu_gpt.h"

#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "gpu_worker/cuda/cu_attention.h"
#include "gpu_worker/cuda/cu_flash.h"
#include "gpu_worker/cuda/cu_matmul.h"
#include "gpu_worker/cuda/cu_norm.h"

/* Rows of logits per chunk of the head: large enough that its products run at full speed, small
 * enough that a chunk's logits stay within HEAD_CHUNK_BYTES however large the vocabulary. */
#define HEAD_CHUNK_BYTES (512u << 20)
#define HEAD_CHUNK_MIN 256
#define HEAD_CHUNK_MAX 4096
#define LT_WORKSPACE (32u << 20)

#define STAGING_OUTS 8
#define STAGING_UPLOADS 6

/* Device staging of one host-interface call in flight, and what finishing it still has to do. */
struct staging {
    float *p32, *grad, *lnf32, *in0, *in1, *out, *losses;
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
    float *wpe_grad; /* the head zeroes dembed's position part (untouched by the tied head) */
    size_t wpe_n;
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
};

/* An activation input of a call (see act_in_queue). */
struct act_in {
    const void *host;
    void *staging; /* upload target (the host's dtype) */
    bf16 *dev;      /* where the kernels read it */
    const bf16 *from; /* set when it comes from the device copy of the call before */
};

struct fy_cu_gpt {
    struct fy_gpt_config c;
    struct fy_gpt_block_layout lay;
    int B, T, N;
    int head_rows;   /* rows per chunk of the head */
    int flash;       /* flash-style attention (else the materialising version) */
    int fuse;        /* GELU and residual adds in the products' epilogues (else separate kernels) */
    int host_bf16;   /* activations in host buffers are bf16 (else f32) */
    size_t unit_max; /* floats of the largest unit */
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
    /* kept internals of the top `n_kept` blocks (set i: block L - n_kept + 1 + i), and whether a
     * forward has filled a set that no backward has used since */
    struct fy_cu_gpt_acts kept[FY_CU_GPT_MAX_KEPT];
    unsigned char kept_full[FY_CU_GPT_MAX_KEPT];
    int n_kept;
    /* the internals' gradients */
    bf16 *dy, *dy1, *dln2, *datty, *dln1, *dx, *dqkv, *dg, *dfc;
    void *head_scratch;
    /* profiling */
    int timing;
    cudaEvent_t t0, t1;
    struct fy_cu_gpt_op ops[FY_CU_GPT_MAX_OPS];
    int n_ops;
};

/* One list of every buffer, used both to size the arena and to carve it. */
struct piece {
    size_t bytes;
    void **ptr;
};

/* The pieces of one set of block internals; returns how many. */
static int acts_plan(const struct fy_cu_gpt *g, struct fy_cu_gpt_acts *a, struct piece *p)
{
    const struct fy_gpt_config *c = &g->c;
    size_t N = (size_t)g->N, C = c->n_embd;
    int n = 0;
#define PIECE(field, count, type) (p[n++] = (struct piece){(count) * sizeof(type), (void **)&a->field})
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

static int plan(struct fy_cu_gpt *g, struct piece *p, void **lt_ws)
{
    const struct fy_gpt_config *c = &g->c;
    size_t N = (size_t)g->N, C = c->n_embd, U = g->unit_max;
    int n = acts_plan(g, &g->own, p);
#define PIECE(field, count, type) (p[n++] = (struct piece){(count) * sizeof(type), (void **)&g->field})
    for (int i = 0; i < FY_CU_GPT_QUEUE; i++) {
        PIECE(st[i].p32, U, float);
        PIECE(st[i].grad, U, float);
        PIECE(st[i].lnf32, 2 * C, float);
        PIECE(st[i].in0, N * C, float);
        PIECE(st[i].in1, N * C, float);
        PIECE(st[i].out, N * C, float);
        PIECE(st[i].losses, N, float);
        PIECE(st[i].tokens, N, int32_t);
        PIECE(st[i].targets, N, int32_t);
    }
    PIECE(pbf, U, bf16);
    PIECE(lnf, 2 * C, bf16);
    PIECE(ln_scratch, fy_cu_layernorm_backward_scratch(g->N, (int)C), float);
    PIECE(x, N * C, bf16);
    PIECE(y, N * C, bf16);
    PIECE(dy, N * C, bf16);
    PIECE(dy1, N * C, bf16);
    PIECE(dln2, N * C, bf16);
    PIECE(datty, N * C, bf16);
    PIECE(dln1, N * C, bf16);
    PIECE(dx, N * C, bf16);
    PIECE(dqkv, 3 * N * C, bf16);
    PIECE(dg, 4 * N * C, bf16);
    PIECE(dfc, 4 * N * C, bf16);
    PIECE(head_scratch, fy_cu_head_scratch_bytes(g->head_rows, c->vocab), char);
#undef PIECE
    p[n++] = (struct piece){LT_WORKSPACE, lt_ws};
    return n;
}

static void setup_shape(struct fy_cu_gpt *g, const struct fy_gpt_config *c, int B, int T)
{
    g->c = *c;
    fy_gpt_block_layout(c, &g->lay);
    g->B = B;
    g->T = T;
    g->N = B * T;
    /* FUYOU_CUDA_ATTENTION=materialised selects the first version, for comparisons. */
    const char *attn = getenv("FUYOU_CUDA_ATTENTION");
    g->flash = fy_cu_flash_supported((int)c->n_embd, (int)c->n_head) &&
               !(attn != NULL && strcmp(attn, "materialised") == 0);
    /* FUYOU_CUDA_FUSE=0 runs GELU and the residual adds as separate kernels, for comparisons. */
    const char *fuse = getenv("FUYOU_CUDA_FUSE");
    g->fuse = !(fuse != NULL && strcmp(fuse, "0") == 0);
    size_t per_row = fy_cu_head_scratch_bytes(1, c->vocab);
    size_t rows = per_row ? HEAD_CHUNK_BYTES / per_row : HEAD_CHUNK_MAX;
    rows = rows < HEAD_CHUNK_MIN ? HEAD_CHUNK_MIN : rows > HEAD_CHUNK_MAX ? HEAD_CHUNK_MAX : rows;
    g->head_rows = (int)(rows < (size_t)g->N ? rows : (size_t)g->N);
    g->unit_max = 0;
    for (unsigned u = 0; u < fy_gpt_unit_count(c); u++)
        if (fy_gpt_unit_params(c, u) > g->unit_max)
            g->unit_max = fy_gpt_unit_params(c, u);
}

size_t fy_cu_gpt_arena_bytes(const struct fy_gpt_config *c, int B, int T)
{
    struct fy_cu_gpt g;
    memset(&g, 0, sizeof g);
    setup_shape(&g, c, B, T);
    struct piece p[64];
    void *ws;
    int n = plan(&g, p, &ws);
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += fy_cu_arena_footprint(p[i].bytes);
    return total;
}

int fy_cu_gpt_new(struct fy_cu_gpt **out, struct fy_cu_arena *arena, const struct fy_gpt_config *c,
                  int B, int T)
{
    *out = NULL;
    unsigned hs = c->n_embd / c->n_head;
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
    struct piece p[64];
    void *lt_ws = NULL;
    int n = plan(g, p, &lt_ws);
    for (int i = 0; i < n; i++) {
        *p[i].ptr = fy_cu_arena_take(arena, p[i].bytes);
        if (*p[i].ptr == NULL) {
            fy_error("the GPU arena (%.2f GiB) cannot hold the model's working buffers for batch "
                     "%d x %d (%.2f GiB): raise --gpu-mem or lower the batch",
                     (double)arena->size / (1 << 30), B, T,
                     (double)fy_cu_gpt_arena_bytes(c, B, T) / (1 << 30));
            free(g);
            return -ENOMEM;
        }
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
    if (rc < 0) {
        fy_cu_gpt_destroy(&g);
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
    st->wpe_grad = NULL;
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
    if (st->wpe_grad != NULL)
        memset(st->wpe_grad, 0, st->wpe_n * sizeof(float));
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
 * read there; a third of the recomputed products' work). */
static int block_forward_device(struct fy_cu_gpt *g, const bf16 *params, const bf16 *x, bf16 *y,
                                struct fy_cu_gpt_acts *a)
{
    int N = g->N, C = (int)g->c.n_embd, NH = (int)g->c.n_head;
    size_t NC = (size_t)N * C;
    cudaStream_t s = g->compute;
    OP("layernorm fwd", fy_cu_layernorm_forward(a->ln1, a->mean1, a->rstd1, x, P(ln1_w), P(ln1_b), N, C, s));
    OP("matmul qkv fwd", fy_cu_matmul_forward(g->lt, a->qkv, a->ln1, P(qkv_w), P(qkv_b), N, C, 3 * C, s));
    if (g->flash)
        OP("attention fwd", fy_cu_flash_forward(a->atty, a->qkv, a->attn, g->B, g->T, C, NH, s));
    else
        OP("attention fwd", fy_cu_attention_forward(g->lt, a->atty, a->qkv, a->attn, g->B, g->T, C, NH, s));
    if (g->fuse) {
        OP("matmul attn-proj fwd", fy_cu_matmul_forward_ex(g->lt, a->y1, a->atty, P(attn_w), P(attn_b),
                                                           x, NULL, N, C, C, s));
    } else {
        OP("matmul attn-proj fwd", fy_cu_matmul_forward(g->lt, a->y1, a->atty, P(attn_w), P(attn_b), N, C, C, s));
        OP("residual fwd", fy_cu_residual_forward(a->y1, a->y1, x, NC, s));
    }
    OP("layernorm fwd", fy_cu_layernorm_forward(a->ln2, a->mean2, a->rstd2, a->y1, P(ln2_w), P(ln2_b), N, C, s));
    if (g->fuse) {
        OP("matmul fc fwd", fy_cu_matmul_forward_ex(g->lt, a->g, a->ln2, P(fc_w), P(fc_b), NULL, a->fc,
                                                    N, C, 4 * C, s));
        if (y == NULL)
            return 0;
        OP("matmul proj fwd", fy_cu_matmul_forward_ex(g->lt, y, a->g, P(proj_w), P(proj_b), a->y1, NULL,
                                                      N, 4 * C, C, s));
        return 0;
    }
    OP("matmul fc fwd", fy_cu_matmul_forward(g->lt, a->fc, a->ln2, P(fc_w), P(fc_b), N, C, 4 * C, s));
    OP("gelu fwd", fy_cu_gelu_forward(a->g, a->fc, 4 * NC, s));
    if (y == NULL)
        return 0;
    OP("matmul proj fwd", fy_cu_matmul_forward(g->lt, y, a->g, P(proj_w), P(proj_b), N, 4 * C, C, s));
    OP("residual fwd", fy_cu_residual_forward(y, y, a->y1, NC, s));
    return 0;
}

size_t fy_cu_gpt_acts_bytes(const struct fy_gpt_config *c, int B, int T)
{
    struct fy_cu_gpt g;
    memset(&g, 0, sizeof g);
    setup_shape(&g, c, B, T);
    struct piece p[16];
    struct fy_cu_gpt_acts a;
    int n = acts_plan(&g, &a, p);
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += fy_cu_arena_footprint(p[i].bytes);
    return total;
}

int fy_cu_gpt_acts_take(struct fy_cu_gpt *g, struct fy_cu_arena *arena, struct fy_cu_gpt_acts *a)
{
    struct piece p[16];
    size_t mark = arena->used;
    int n = acts_plan(g, a, p);
    for (int i = 0; i < n; i++) {
        *p[i].ptr = fy_cu_arena_take(arena, p[i].bytes);
        if (*p[i].ptr == NULL) {
            fy_cu_arena_reset(arena, mark);
            memset(a, 0, sizeof *a);
            return -ENOMEM; /* the caller knows what it was planning and says so */
        }
    }
    return 0;
}

int fy_cu_gpt_dev_block_forward(struct fy_cu_gpt *g, const bf16 *params, const bf16 *x, bf16 *y,
                                struct fy_cu_gpt_acts *keep)
{
    FY_REQUIRE(y != NULL, -EINVAL, "fy_cu_gpt_dev_block_forward: no output buffer");
    return block_forward_device(g, params, x, y, keep != NULL ? keep : &g->own);
}

int fy_cu_gpt_dev_block_backward(struct fy_cu_gpt *g, const bf16 *params, const bf16 *x,
                                 const bf16 *dy, bf16 *dx, float *dparams, struct fy_cu_gpt_acts *kept)
{
    int N = g->N, C = (int)g->c.n_embd, NH = (int)g->c.n_head;
    size_t NC = (size_t)N * C;
    cudaStream_t s = g->compute;
    struct fy_cu_gpt_acts *a = kept;
    if (a == NULL) { /* recompute from the checkpoint x */
        a = &g->own;
        FY_TRY(block_forward_device(g, params, x, NULL, a));
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

/* The kept set of block `layer` (1..L), or NULL where that block is recomputed. */
static int kept_index(const struct fy_cu_gpt *g, int layer)
{
    int first = (int)g->c.n_layer - g->n_kept + 1;
    return layer >= first && layer <= (int)g->c.n_layer ? layer - first : -1;
}

static int block_forward_call(struct fy_cu_gpt *g, struct staging *st, int layer,
                              const float *params, const void *x, void *y)
{
    size_t P = g->lay.total;
    cudaStream_t s = g->compute;
    struct act_in in_x = {x, st->in0, g->x, NULL};
    FY_TRY(upload(g, st, st->p32, params, P * sizeof(float)));
    FY_TRY(act_in_queue(g, st, &in_x));
    FY_TRY(uploads_done(g, st));
    FY_TRY(fy_cu_f32_to_bf16(g->pbf, st->p32, P, s));
    FY_TRY(act_in_place(g, &in_x));
    /* a set counts as filled only once the whole forward is queued: a failure part way leaves it
     * spent, so the next backward recomputes */
    int k = kept_index(g, layer);
    if (k >= 0)
        g->kept_full[k] = 0;
    FY_TRY(block_forward_device(g, g->pbf, g->x, g->y, k >= 0 ? &g->kept[k] : &g->own));
    if (k >= 0)
        g->kept_full[k] = 1;
    FY_TRY(act_out_stage(g, st, g->y));
    FY_TRY(compute_done(g, st));
    st->act_out_host = y;
    st->act_out_dev = g->y;
    return download(g, st, y, st->out, act_host_bytes(g));
}

int fy_cu_gpt_block_forward(struct fy_cu_gpt *g, int layer, const float *params, const void *x,
                            void *y)
{
    struct staging *st;
    FY_TRY(call_begin(g, &st));
    return call_end(g, st, block_forward_call(g, st, layer, params, x, y));
}

static int block_backward_call(struct fy_cu_gpt *g, struct staging *st, int layer,
                               const float *params, const void *x, const void *dy, void *dx,
                               float *dparams)
{
    size_t P = g->lay.total;
    cudaStream_t s = g->compute;
    struct act_in in_x = {x, st->in0, g->x, NULL}, in_dy = {dy, st->in1, g->dy, NULL};
    FY_TRY(upload(g, st, st->p32, params, P * sizeof(float)));
    FY_TRY(act_in_queue(g, st, &in_x));
    FY_TRY(act_in_queue(g, st, &in_dy));
    FY_TRY(uploads_done(g, st));
    FY_TRY(fy_cu_f32_to_bf16(g->pbf, st->p32, P, s));
    FY_TRY(act_in_place(g, &in_x));
    FY_TRY(act_in_place(g, &in_dy));
    /* a set is used once: the backward also uses its attention part as scratch, so a second
     * backward of the same forward (clipping's second pass) recomputes */
    int k = kept_index(g, layer);
    struct fy_cu_gpt_acts *kept = k >= 0 && g->kept_full[k] ? &g->kept[k] : NULL;
    if (k >= 0)
        g->kept_full[k] = 0;
    FY_TRY(fy_cu_gpt_dev_block_backward(g, g->pbf, g->x, g->dy, g->dx, st->grad, kept));
    FY_TRY(act_out_stage(g, st, g->dx));
    FY_TRY(compute_done(g, st));
    st->act_out_host = dx;
    st->act_out_dev = g->dx;
    FY_TRY(download(g, st, dx, st->out, act_host_bytes(g)));
    return download(g, st, dparams, st->grad, P * sizeof(float));
}

int fy_cu_gpt_block_backward(struct fy_cu_gpt *g, int layer, const float *params, const void *x,
                             const void *dy, void *dx, float *dparams)
{
    struct staging *st;
    FY_TRY(call_begin(g, &st));
    return call_end(g, st, block_backward_call(g, st, layer, params, x, dy, dx, dparams));
}

int fy_cu_gpt_dev_embed_forward(struct fy_cu_gpt *g, const bf16 *wte, const bf16 *wpe,
                                const int32_t *tokens, bf16 *x)
{
    OP("embed fwd", fy_cu_embed_forward(x, tokens, wte, wpe, g->B, g->T, (int)g->c.n_embd, g->compute));
    return 0;
}

int fy_cu_gpt_dev_embed_backward(struct fy_cu_gpt *g, const int32_t *tokens, const bf16 *dx,
                                 float *dwte, float *dwpe)
{
    OP("embed bwd", fy_cu_embed_backward(dwte, dwpe, dx, tokens, g->B, g->T, (int)g->c.n_embd,
                                         (int)g->c.vocab, g->compute));
    return 0;
}

int fy_cu_gpt_dev_head(struct fy_cu_gpt *g, const bf16 *lnf, const bf16 *wte, const bf16 *x,
                       const int32_t *targets, float *losses, bf16 *dx, float *dlnf, float *dwte)
{
    const struct fy_gpt_config *c = &g->c;
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

static int embed_forward_call(struct fy_cu_gpt *g, struct staging *st, const float *embed,
                              const int32_t *tokens, void *x)
{
    const struct fy_gpt_config *c = &g->c;
    size_t n = fy_gpt_unit_params(c, 0);
    cudaStream_t s = g->compute;
    FY_TRY(upload(g, st, st->tokens, tokens, (size_t)g->N * sizeof(int32_t)));
    FY_TRY(upload(g, st, st->p32, embed, n * sizeof(float)));
    FY_TRY(uploads_done(g, st));
    FY_TRY(fy_cu_f32_to_bf16(g->pbf, st->p32, n, s));
    const bf16 *wte = g->pbf, *wpe = g->pbf + (size_t)c->vocab * c->n_embd;
    FY_TRY(fy_cu_gpt_dev_embed_forward(g, wte, wpe, st->tokens, g->x));
    FY_TRY(act_out_stage(g, st, g->x));
    FY_TRY(compute_done(g, st));
    st->act_out_host = x;
    st->act_out_dev = g->x;
    return download(g, st, x, st->out, act_host_bytes(g));
}

int fy_cu_gpt_embed_forward(struct fy_cu_gpt *g, const float *embed, const int32_t *tokens, void *x)
{
    struct staging *st;
    FY_TRY(call_begin(g, &st));
    return call_end(g, st, embed_forward_call(g, st, embed, tokens, x));
}

static int embed_backward_call(struct fy_cu_gpt *g, struct staging *st, const int32_t *tokens,
                               const void *dx, float *dembed)
{
    const struct fy_gpt_config *c = &g->c;
    size_t n = fy_gpt_unit_params(c, 0);
    struct act_in in_dx = {dx, st->in1, g->dx, NULL};
    FY_TRY(upload(g, st, st->tokens, tokens, (size_t)g->N * sizeof(int32_t)));
    FY_TRY(upload(g, st, st->grad, dembed, n * sizeof(float)));
    FY_TRY(act_in_queue(g, st, &in_dx));
    FY_TRY(uploads_done(g, st));
    FY_TRY(act_in_place(g, &in_dx));
    float *dwte = st->grad, *dwpe = st->grad + (size_t)c->vocab * c->n_embd;
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

static int head_call(struct fy_cu_gpt *g, struct staging *st, const float *final_params,
                     const float *embed, const void *x, const int32_t *targets, double *loss,
                     void *dx, float *dfinal, float *dembed)
{
    const struct fy_gpt_config *c = &g->c;
    int N = g->N, C = (int)c->n_embd, V = (int)c->vocab;
    size_t wte_n = (size_t)V * C;
    cudaStream_t s = g->compute;
    FY_TRY(upload(g, st, st->targets, targets, (size_t)N * sizeof(int32_t)));
    FY_TRY(upload(g, st, st->lnf32, final_params, 2 * (size_t)C * sizeof(float)));
    struct act_in in_x = {x, st->in0, g->x, NULL};
    FY_TRY(upload(g, st, st->p32, embed, wte_n * sizeof(float))); /* only wte: the head is tied to it */
    FY_TRY(act_in_queue(g, st, &in_x));
    FY_TRY(uploads_done(g, st));
    FY_TRY(fy_cu_f32_to_bf16(g->lnf, st->lnf32, 2 * (size_t)C, s));
    FY_TRY(fy_cu_f32_to_bf16(g->pbf, st->p32, wte_n, s));
    FY_TRY(act_in_place(g, &in_x));
    int backward = dx != NULL;
    float *dlnf = st->grad + wte_n;
    FY_TRY(fy_cu_gpt_dev_head(g, g->lnf, g->pbf, g->x, st->targets, st->losses,
                              backward ? g->dx : NULL, dlnf, st->grad));
    if (backward)
        FY_TRY(act_out_stage(g, st, g->dx));
    FY_TRY(compute_done(g, st));
    if (backward) {
        st->act_out_host = dx;
        st->act_out_dev = g->dx;
        FY_TRY(download(g, st, dx, st->out, act_host_bytes(g)));
        FY_TRY(download(g, st, dfinal, dlnf, 2 * (size_t)C * sizeof(float)));
        FY_TRY(download(g, st, dembed, st->grad, wte_n * sizeof(float)));
        st->wpe_grad = dembed + wte_n;
        st->wpe_n = (size_t)c->ctx * C;
    }
    FY_TRY(download(g, st, st->host_losses, st->losses, (size_t)N * sizeof(float)));
    st->targets_host = targets;
    st->loss = loss;
    return 0;
}

int fy_cu_gpt_head(struct fy_cu_gpt *g, const float *final_params, const float *embed,
                   const void *x, const int32_t *targets, double *loss, void *dx, float *dfinal,
                   float *dembed)
{
    struct staging *st;
    FY_TRY(call_begin(g, &st));
    return call_end(g, st, head_call(g, st, final_params, embed, x, targets, loss, dx, dfinal, dembed));
}

int fy_cu_gpt_logits(struct fy_cu_gpt *g, const float *final_params, const float *embed,
                     const void *x, float *logits)
{
    const struct fy_gpt_config *c = &g->c;
    int N = g->N, C = (int)c->n_embd, V = (int)c->vocab;
    cudaStream_t s = g->compute;
    while (g->pending > 0) /* synchronous: whatever was queued completes first */
        FY_TRY(fy_cu_gpt_finish(g, NULL));
    struct staging *st = &g->st[g->first];
    st->n_up = 0; /* the staging's last call is finished: its counts start over */
    st->n_outs = 0;
    FY_TRY(upload(g, st, st->lnf32, final_params, 2 * (size_t)C * sizeof(float)));
    FY_TRY(upload(g, st, st->p32, embed, (size_t)V * C * sizeof(float)));
    struct act_in in_x = {x, st->in0, g->x, NULL};
    FY_TRY(upload(g, st, st->in0, x, act_host_bytes(g)));
    FY_TRY(uploads_done(g, st));
    FY_TRY(fy_cu_f32_to_bf16(g->lnf, st->lnf32, 2 * (size_t)C, s));
    FY_TRY(fy_cu_f32_to_bf16(g->pbf, st->p32, (size_t)V * C, s));
    FY_TRY(act_in_place(g, &in_x));
    struct fy_cu_gpt_acts *a = &g->own;
    FY_TRY(fy_cu_layernorm_forward(a->ln1, a->mean1, a->rstd1, g->x, g->lnf, g->lnf + C, N, C, s));
    /* the head's scratch holds at least head_rows x V f32 logits */
    float *chunk = (float *)g->head_scratch;
    for (int r0 = 0; r0 < N; r0 += g->head_rows) {
        int rows = N - r0 < g->head_rows ? N - r0 : g->head_rows;
        FY_TRY(fy_cu_matmul_batched(g->lt, chunk, 1, a->ln1 + (size_t)r0 * C, g->pbf, rows, V, C, 0, 1,
                                    0, 0, 0, 1, 1.0f, 0.0f, s));
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

int fy_cu_gpt_keep_layers(struct fy_cu_gpt *g, struct fy_cu_arena *arena, int max_layers)
{
    FY_REQUIRE(g->pending == 0 && g->n_kept == 0, -EBUSY,
               "cu_gpt: keeping internals with calls in flight or sets already taken");
    int most = max_layers < (int)g->c.n_layer ? max_layers : (int)g->c.n_layer;
    most = most < FY_CU_GPT_MAX_KEPT ? most : FY_CU_GPT_MAX_KEPT;
    while (g->n_kept < most && fy_cu_gpt_acts_take(g, arena, &g->kept[g->n_kept]) == 0)
        g->kept_full[g->n_kept++] = 0;
    /* the sets were taken in order, but the top blocks are the ones kept: renumbering is only
     * kept_index's arithmetic */
    return g->n_kept;
}
