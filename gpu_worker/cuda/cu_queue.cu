/* The host interface's queue of the CUDA backend (contract: cu_queue.h): each call stages through
 * its own buffers, its uploads, compute and downloads on three streams ordered by events (and f32
 * uploads' conversions on a fourth), and returns without waiting; nothing synchronises the device
 * but fy_cu_queue_finish, which waits for one call's event. */
#include "gpu_worker/cuda/cu_queue.h"

#include <errno.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "gpu_worker/cuda/cu_convert.h"

size_t fy_cu_queue_ring_floats(size_t most)
{
    size_t n = most < FY_CU_RING_MAX_FLOATS ? most : FY_CU_RING_MAX_FLOATS;
    return n ? n : 1;
}

static int ring_events(struct fy_cu_ring *r)
{
    for (int i = 0; i < 2; i++)
        if (cudaEventCreateWithFlags(&r->ready[i], cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&r->free[i], cudaEventDisableTiming) != cudaSuccess) {
            fy_error("CUDA: cannot create the events of the backend's conversion rings");
            return -EIO;
        }
    return 0;
}

static void ring_release(struct fy_cu_ring *r)
{
    for (int i = 0; i < 2; i++) {
        if (r->ready[i])
            cudaEventDestroy(r->ready[i]);
        if (r->free[i])
            cudaEventDestroy(r->free[i]);
    }
}

int fy_cu_queue_init(struct fy_cu_queue *q, int N, size_t NC)
{
    q->N = N;
    q->NC = NC;
    q->ready_fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
    if (q->ready_fd < 0) {
        int rc = -errno;
        fy_error("cu_queue: eventfd: %s", strerror(-rc));
        return rc;
    }
    if (cudaStreamCreateWithFlags(&q->compute, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(&q->h2d, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(&q->d2h, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(&q->conv, cudaStreamNonBlocking) != cudaSuccess) {
        fy_error("CUDA: cannot create the backend's streams");
        return -EIO;
    }
    for (int i = 0; i < FY_CU_QUEUE; i++) {
        struct fy_cu_staging *st = &q->st[i];
        if (cudaEventCreateWithFlags(&st->uploaded, cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&st->converted, cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&st->computed, cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreate(&st->done) != cudaSuccess ||
            cudaHostAlloc((void **)&st->host_losses, (size_t)N * sizeof(float),
                          cudaHostAllocDefault) != cudaSuccess) {
            fy_error("CUDA: cannot create the events and loss buffers of the backend's staging");
            return -EIO;
        }
        for (int k = 0; k < 2 * FY_CU_STAGING_TIMED; k++)
            if (cudaEventCreate(&st->ev[k]) != cudaSuccess) {
                fy_error("CUDA: cannot create the copy timing events of the backend's staging");
                return -EIO;
            }
    }
    FY_TRY(ring_events(&q->up));
    return ring_events(&q->down);
}

void fy_cu_queue_drain(struct fy_cu_queue *q)
{
    while (q->pending > 0 && fy_cu_queue_finish(q, NULL) == 0)
        ;
}

void fy_cu_queue_release(struct fy_cu_queue *q)
{
    fy_cu_queue_drain(q);
    if (q->conv) /* conversions no call waits for any more (a failed call's) */
        cudaStreamSynchronize(q->conv);
    for (int i = 0; i < FY_CU_QUEUE; i++) {
        struct fy_cu_staging *st = &q->st[i];
        cudaEvent_t *evs[] = {&st->uploaded, &st->converted, &st->computed, &st->done};
        for (size_t k = 0; k < sizeof evs / sizeof evs[0]; k++)
            if (*evs[k])
                cudaEventDestroy(*evs[k]);
        for (int k = 0; k < 2 * FY_CU_STAGING_TIMED; k++)
            if (st->ev[k])
                cudaEventDestroy(st->ev[k]);
        if (st->host_losses)
            cudaFreeHost(st->host_losses);
    }
    ring_release(&q->up);
    ring_release(&q->down);
    if (q->ready_fd >= 0)
        close(q->ready_fd);
    q->ready_fd = -1;
    cudaStream_t *streams[] = {&q->compute, &q->h2d, &q->d2h, &q->conv};
    for (size_t k = 0; k < sizeof streams / sizeof streams[0]; k++)
        if (*streams[k])
            cudaStreamDestroy(*streams[k]);
}

int fy_cu_queue_begin(struct fy_cu_queue *q, struct fy_cu_staging **out)
{
    if (q->pending == FY_CU_QUEUE) {
        fy_error("cu_queue: %d calls already in flight: finish one before queueing another",
                 q->pending);
        return -EBUSY;
    }
    struct fy_cu_staging *st = &q->st[(q->first + q->pending) % FY_CU_QUEUE];
    st->loss = NULL;
    st->targets_host = NULL;
    st->loss_count = 0;
    st->zero_host = NULL;
    st->n_outs = 0;
    st->n_ev = 0;
    st->timed_up = st->timed_down = st->untimed_up = st->untimed_down = 0;
    st->converts = 0;
    st->act_out_host = NULL;
    st->act_out_dev = NULL;
    *out = st;
    return 0;
}

/* ---- timing: a pair of events around a copy (or a run of them) on its stream ---- */

/* The first event of a timed copy of `bytes` on stream s, or -1 where the pairs are used up (the
 * copy is then counted untimed). */
static int timed_begin(struct fy_cu_staging *st, cudaStream_t s, int up, uint64_t bytes)
{
    if (st->n_ev == FY_CU_STAGING_TIMED) {
        *(up ? &st->untimed_up : &st->untimed_down) += bytes;
        return -1;
    }
    int k = st->n_ev++;
    st->up_pairs[k] = up;
    *(up ? &st->timed_up : &st->timed_down) += bytes;
    FY_CUDA(cudaEventRecord(st->ev[2 * k], s), "recording a copy start");
    return k;
}

static int timed_end(struct fy_cu_staging *st, cudaStream_t s, int k)
{
    if (k >= 0)
        FY_CUDA(cudaEventRecord(st->ev[2 * k + 1], s), "recording a copy end");
    return 0;
}

/* ---- uploads ---- */

/* Host input of a call that a call still in flight downloads into: the layer-by-layer pipeline
 * feeds each unit's output to the next unit, and the upload must not read it before it is home. */
static int order_after_writers(struct fy_cu_queue *q, const void *host, size_t bytes)
{
    const char *lo = (const char *)host, *hi = lo + bytes;
    for (int i = 0; i < q->pending; i++) {
        struct fy_cu_staging *c = &q->st[(q->first + i) % FY_CU_QUEUE];
        for (int k = 0; k < c->n_outs; k++)
            if (lo < c->outs[k].p + c->outs[k].n && c->outs[k].p < hi) {
                FY_CUDA(cudaStreamWaitEvent(q->h2d, c->done, 0),
                        "ordering an upload after the downloads that produce its input");
                break;
            }
    }
    return 0;
}

int fy_cu_queue_upload(struct fy_cu_queue *q, struct fy_cu_staging *st, void *dev,
                       const void *host, size_t bytes)
{
    FY_TRY(order_after_writers(q, host, bytes));
    int k = timed_begin(st, q->h2d, 1, bytes);
    FY_TRY(k < -1 ? k : 0);
    FY_CUDA(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, q->h2d),
            "upload of %zu bytes", bytes);
    return timed_end(st, q->h2d, k);
}

/* n f32 values from host into the bf16 device buffer dev, a chunk at a time through the upload
 * ring: each chunk copied on the host-to-device stream once the conversion of the chunk that used
 * its slot before is done, and converted on the conversion stream. Timed as one copy (with the
 * waits for those conversions, which are short beside the copies). */
static int upload_converted(struct fy_cu_queue *q, struct fy_cu_staging *st, bf16 *dev,
                            const float *host, size_t n)
{
    struct fy_cu_ring *r = &q->up;
    FY_TRY(order_after_writers(q, host, n * sizeof(float)));
    int k = timed_begin(st, q->h2d, 1, n * sizeof(float));
    FY_TRY(k < -1 ? k : 0);
    for (size_t off = 0; off < n; off += q->ring_n) {
        size_t cnt = n - off < q->ring_n ? n - off : q->ring_n;
        int i = r->next;
        r->next ^= 1;
        if (r->used[i])
            FY_CUDA(cudaStreamWaitEvent(q->h2d, r->free[i], 0),
                    "waiting for a conversion chunk to be free");
        FY_CUDA(cudaMemcpyAsync(r->chunk[i], host + off, cnt * sizeof(float),
                                cudaMemcpyHostToDevice, q->h2d),
                "upload of %zu f32 values to convert", cnt);
        FY_CUDA(cudaEventRecord(r->ready[i], q->h2d), "recording a conversion chunk's upload");
        FY_CUDA(cudaStreamWaitEvent(q->conv, r->ready[i], 0),
                "ordering a conversion after its upload");
        FY_TRY(fy_cu_f32_to_bf16(dev + off, r->chunk[i], cnt, q->conv));
        FY_CUDA(cudaEventRecord(r->free[i], q->conv), "recording a conversion's end");
        r->used[i] = 1;
    }
    st->converts = 1;
    return timed_end(st, q->h2d, k);
}

size_t fy_cu_queue_act_bytes(const struct fy_cu_queue *q)
{
    return q->NC * (q->host_bf16 ? sizeof(bf16) : sizeof(float));
}

int fy_cu_queue_act_in(struct fy_cu_queue *q, struct fy_cu_staging *st, struct fy_cu_act_in *a)
{
    const struct fy_cu_staging *prev =
        q->pending > 0 ? &q->st[(q->first + q->pending - 1) % FY_CU_QUEUE] : NULL;
    if (prev != NULL && prev->act_out_host == a->host) {
        a->at = prev->act_out_dev;
        return 0;
    }
    a->at = a->buf;
    if (q->host_bf16)
        return fy_cu_queue_upload(q, st, a->buf, a->host, q->NC * sizeof(bf16));
    return upload_converted(q, st, a->buf, (const float *)a->host, q->NC);
}

size_t fy_cu_queue_weight_size(const struct fy_cu_queue *q)
{
    return q->host_wbf16 ? sizeof(bf16) : sizeof(float);
}

int fy_cu_queue_weights_in(struct fy_cu_queue *q, struct fy_cu_staging *st, bf16 *dev,
                           const void *host, size_t n)
{
    if (q->host_wbf16)
        return fy_cu_queue_upload(q, st, dev, host, n * sizeof(bf16));
    return upload_converted(q, st, dev, (const float *)host, n);
}

int fy_cu_queue_uploads_done(struct fy_cu_queue *q, struct fy_cu_staging *st)
{
    FY_CUDA(cudaEventRecord(st->uploaded, q->h2d), "recording the upload event");
    FY_CUDA(cudaStreamWaitEvent(q->compute, st->uploaded, 0), "ordering compute after uploads");
    if (!st->converts)
        return 0;
    FY_CUDA(cudaEventRecord(st->converted, q->conv), "recording the conversion event");
    FY_CUDA(cudaStreamWaitEvent(q->compute, st->converted, 0),
            "ordering compute after the uploads' conversions");
    return 0;
}

/* ---- downloads ---- */

int fy_cu_queue_compute_done(struct fy_cu_queue *q, struct fy_cu_staging *st)
{
    FY_CUDA(cudaEventRecord(st->computed, q->compute), "recording the compute event");
    FY_CUDA(cudaStreamWaitEvent(q->d2h, st->computed, 0), "ordering downloads after compute");
    return 0;
}

int fy_cu_queue_note_out(struct fy_cu_queue *q, struct fy_cu_staging *st, const void *host,
                         size_t bytes)
{
    FY_REQUIRE(st->n_outs < FY_CU_STAGING_OUTS, -EINVAL,
               "cu_queue: more than %d outputs in one call", FY_CU_STAGING_OUTS);
    st->outs[st->n_outs].p = (const char *)host;
    st->outs[st->n_outs].n = bytes;
    st->n_outs++;
    return 0;
}

int fy_cu_queue_download_within(struct fy_cu_queue *q, struct fy_cu_staging *st, void *host,
                                const void *dev, size_t bytes)
{
    int k = timed_begin(st, q->d2h, 0, bytes);
    FY_TRY(k < -1 ? k : 0);
    FY_CUDA(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, q->d2h),
            "download of %zu bytes", bytes);
    return timed_end(st, q->d2h, k);
}

int fy_cu_queue_download(struct fy_cu_queue *q, struct fy_cu_staging *st, void *host,
                         const void *dev, size_t bytes)
{
    FY_TRY(fy_cu_queue_note_out(q, st, host, bytes));
    return fy_cu_queue_download_within(q, st, host, dev, bytes);
}

/* n bf16 values of dev home into host as f32, a chunk at a time through the download ring:
 * converted on the compute stream (after the call's compute) once the download of the chunk that
 * used its slot before is done, and copied on the device-to-host stream. Timed as one copy. */
static int download_converted(struct fy_cu_queue *q, struct fy_cu_staging *st, float *host,
                              const bf16 *dev, size_t n)
{
    struct fy_cu_ring *r = &q->down;
    FY_TRY(fy_cu_queue_note_out(q, st, host, n * sizeof(float)));
    int k = timed_begin(st, q->d2h, 0, n * sizeof(float));
    FY_TRY(k < -1 ? k : 0);
    for (size_t off = 0; off < n; off += q->ring_n) {
        size_t cnt = n - off < q->ring_n ? n - off : q->ring_n;
        int i = r->next;
        r->next ^= 1;
        if (r->used[i])
            FY_CUDA(cudaStreamWaitEvent(q->compute, r->free[i], 0),
                    "waiting for a conversion chunk to be free");
        FY_TRY(fy_cu_bf16_to_f32(r->chunk[i], dev + off, cnt, q->compute));
        FY_CUDA(cudaEventRecord(r->ready[i], q->compute), "recording a conversion's end");
        FY_CUDA(cudaStreamWaitEvent(q->d2h, r->ready[i], 0),
                "ordering a download after its conversion");
        FY_CUDA(cudaMemcpyAsync(host + off, r->chunk[i], cnt * sizeof(float),
                                cudaMemcpyDeviceToHost, q->d2h),
                "download of %zu converted values", cnt);
        FY_CUDA(cudaEventRecord(r->free[i], q->d2h), "recording a conversion chunk's download");
        r->used[i] = 1;
    }
    return timed_end(st, q->d2h, k);
}

int fy_cu_queue_act_out(struct fy_cu_queue *q, struct fy_cu_staging *st, void *host,
                        const bf16 *dev)
{
    st->act_out_host = host;
    st->act_out_dev = dev;
    if (q->host_bf16)
        return fy_cu_queue_download(q, st, host, dev, q->NC * sizeof(bf16));
    return download_converted(q, st, (float *)host, dev, q->NC);
}

static void CUDART_CB results_home(void *arg)
{
    /* runs on a CUDA thread: no CUDA calls here, only the wake-up of whoever polls ready_fd */
    struct fy_cu_queue *q = (struct fy_cu_queue *)arg;
    uint64_t one = 1;
    while (write(q->ready_fd, &one, sizeof one) < 0 && errno == EINTR)
        ;
}

int fy_cu_queue_end(struct fy_cu_queue *q, struct fy_cu_staging *st, int rc)
{
    if (rc < 0) {
        cudaStreamSynchronize(q->h2d);
        cudaStreamSynchronize(q->conv);
        cudaStreamSynchronize(q->compute);
        cudaStreamSynchronize(q->d2h);
        return rc;
    }
    FY_CUDA(cudaEventRecord(st->done, q->d2h), "recording the download event");
    FY_CUDA(cudaLaunchHostFunc(q->d2h, results_home, q), "queueing the completion signal");
    q->pending++;
    return 0;
}

/* The copies' device time: each timed pair summed by direction, and the untimed bytes at the rate
 * of the timed ones. */
static int copy_times(const struct fy_cu_staging *st, struct fy_cu_copy_times *times)
{
    float ms[2] = {0, 0};
    for (int k = 0; k < st->n_ev; k++) {
        float t = 0;
        FY_CUDA(cudaEventElapsedTime(&t, st->ev[2 * k], st->ev[2 * k + 1]), "reading a copy time");
        ms[st->up_pairs[k]] += t;
    }
    times->h2d_ms = ms[1];
    times->d2h_ms = ms[0];
    if (st->untimed_up > 0 && st->timed_up > 0)
        times->h2d_ms += ms[1] * (float)((double)st->untimed_up / (double)st->timed_up);
    if (st->untimed_down > 0 && st->timed_down > 0)
        times->d2h_ms += ms[0] * (float)((double)st->untimed_down / (double)st->timed_down);
    return 0;
}

int fy_cu_queue_finish(struct fy_cu_queue *q, struct fy_cu_copy_times *times)
{
    FY_REQUIRE(q->pending > 0, -EINVAL, "cu_queue: finish without a call in flight");
    struct fy_cu_staging *st = &q->st[q->first];
    q->first = (q->first + 1) % FY_CU_QUEUE;
    q->pending--;
    FY_CUDA(cudaEventSynchronize(st->done), "waiting for the results of a call");
    uint64_t count; /* the completion signal follows the event on the same stream */
    ssize_t got;
    while ((got = read(q->ready_fd, &count, sizeof count)) < 0 && errno == EINTR)
        ;
    FY_REQUIRE(got == (ssize_t)sizeof count, -EIO, "cu_queue: reading the completion eventfd: %s",
               got < 0 ? strerror(errno) : "short read");
    if (times != NULL)
        FY_TRY(copy_times(st, times));
    if (st->loss != NULL) {
        /* mean over the rows with a target, summed in row order (deterministic) */
        double sum = 0;
        long rows = 0;
        for (int i = 0; i < q->N; i++)
            if (st->targets_host[i] >= 0) {
                sum += st->host_losses[i];
                rows++;
            }
        double count = st->loss_count ? (double)st->loss_count : (double)rows;
        *st->loss = count > 0 ? sum / count : 0.0;
    }
    if (st->zero_host != NULL)
        memset(st->zero_host, 0, st->zero_n * sizeof(float));
    return 0;
}
