/* The host interface's queue of the CUDA backend (contract: cu_queue.h): each call stages through
 * its own buffers, its uploads, compute and downloads on three streams ordered by events, and
 * returns without waiting; nothing synchronises the device but fy_cu_queue_finish, which waits for
 * one call's event. */
#include "gpu_worker/cuda/cu_queue.h"

#include <errno.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "gpu_worker/cuda/cu_convert.h"

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
        cudaStreamCreateWithFlags(&q->d2h, cudaStreamNonBlocking) != cudaSuccess) {
        fy_error("CUDA: cannot create the backend's streams");
        return -EIO;
    }
    for (int i = 0; i < FY_CU_QUEUE; i++) {
        struct fy_cu_staging *st = &q->st[i];
        if (cudaEventCreateWithFlags(&st->uploaded, cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&st->computed, cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreate(&st->done) != cudaSuccess ||
            cudaEventCreate(&st->d2h_begin) != cudaSuccess ||
            cudaHostAlloc((void **)&st->host_losses, (size_t)N * sizeof(float),
                          cudaHostAllocDefault) != cudaSuccess) {
            fy_error("CUDA: cannot create the events and loss buffers of the backend's staging");
            return -EIO;
        }
        for (int k = 0; k < 2 * FY_CU_STAGING_UPLOADS; k++)
            if (cudaEventCreate(&st->up_ev[k]) != cudaSuccess) {
                fy_error("CUDA: cannot create the upload timing events of the backend's staging");
                return -EIO;
            }
    }
    return 0;
}

void fy_cu_queue_drain(struct fy_cu_queue *q)
{
    while (q->pending > 0 && fy_cu_queue_finish(q, NULL) == 0)
        ;
}

void fy_cu_queue_release(struct fy_cu_queue *q)
{
    fy_cu_queue_drain(q);
    for (int i = 0; i < FY_CU_QUEUE; i++) {
        struct fy_cu_staging *st = &q->st[i];
        if (st->uploaded)
            cudaEventDestroy(st->uploaded);
        if (st->computed)
            cudaEventDestroy(st->computed);
        if (st->done)
            cudaEventDestroy(st->done);
        for (int k = 0; k < 2 * FY_CU_STAGING_UPLOADS; k++)
            if (st->up_ev[k])
                cudaEventDestroy(st->up_ev[k]);
        if (st->d2h_begin)
            cudaEventDestroy(st->d2h_begin);
        if (st->host_losses)
            cudaFreeHost(st->host_losses);
    }
    if (q->ready_fd >= 0)
        close(q->ready_fd);
    q->ready_fd = -1;
    if (q->compute)
        cudaStreamDestroy(q->compute);
    if (q->h2d)
        cudaStreamDestroy(q->h2d);
    if (q->d2h)
        cudaStreamDestroy(q->d2h);
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
    st->n_up = 0;
    st->act_out_host = NULL;
    st->act_out_dev = NULL;
    *out = st;
    return 0;
}

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
    FY_REQUIRE(st->n_up < FY_CU_STAGING_UPLOADS, -EINVAL,
               "cu_queue: more than %d uploads in one call", FY_CU_STAGING_UPLOADS);
    FY_TRY(order_after_writers(q, host, bytes));
    cudaEvent_t *ev = &st->up_ev[2 * st->n_up++];
    FY_CUDA(cudaEventRecord(ev[0], q->h2d), "recording an upload start");
    FY_CUDA(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, q->h2d),
            "upload of %zu bytes", bytes);
    FY_CUDA(cudaEventRecord(ev[1], q->h2d), "recording an upload end");
    return 0;
}

size_t fy_cu_queue_act_bytes(const struct fy_cu_queue *q)
{
    return q->NC * (q->host_bf16 ? sizeof(bf16) : sizeof(float));
}

int fy_cu_queue_act_in(struct fy_cu_queue *q, struct fy_cu_staging *st, struct fy_cu_act_in *a)
{
    const struct fy_cu_staging *prev =
        q->pending > 0 ? &q->st[(q->first + q->pending - 1) % FY_CU_QUEUE] : NULL;
    a->from = prev != NULL && prev->act_out_host == a->host ? prev->act_out_dev : NULL;
    if (a->from != NULL)
        return 0;
    return fy_cu_queue_upload(q, st, a->staging, a->host, fy_cu_queue_act_bytes(q));
}

int fy_cu_queue_act_place(struct fy_cu_queue *q, const struct fy_cu_act_in *a)
{
    size_t NC = q->NC;
    if (a->from == NULL && !q->host_bf16)
        return fy_cu_f32_to_bf16(a->dev, (const float *)a->staging, NC, q->compute);
    const bf16 *from = a->from != NULL ? a->from : (const bf16 *)a->staging;
    if (from != a->dev)
        FY_CUDA(cudaMemcpyAsync(a->dev, from, NC * sizeof(bf16), cudaMemcpyDeviceToDevice,
                                q->compute),
                "forwarding an activation on the device");
    return 0;
}

size_t fy_cu_queue_weight_size(const struct fy_cu_queue *q)
{
    return q->host_wbf16 ? sizeof(bf16) : sizeof(float);
}

int fy_cu_queue_weights_in(struct fy_cu_queue *q, struct fy_cu_staging *st,
                           struct fy_cu_weights_in *w)
{
    w->host_bf16 = q->host_wbf16;
    return fy_cu_queue_upload(q, st, w->staging, w->host, w->n * fy_cu_queue_weight_size(q));
}

int fy_cu_queue_weights_place(struct fy_cu_queue *q, const struct fy_cu_weights_in *w)
{
    if (!w->host_bf16)
        return fy_cu_f32_to_bf16(w->dev, (const float *)w->staging, w->n, q->compute);
    FY_CUDA(cudaMemcpyAsync(w->dev, w->staging, w->n * sizeof(bf16), cudaMemcpyDeviceToDevice,
                            q->compute),
            "placing %zu bf16 weights on the device", w->n);
    return 0;
}

int fy_cu_queue_uploads_done(struct fy_cu_queue *q, struct fy_cu_staging *st)
{
    FY_CUDA(cudaEventRecord(st->uploaded, q->h2d), "recording the upload event");
    FY_CUDA(cudaStreamWaitEvent(q->compute, st->uploaded, 0), "ordering compute after uploads");
    return 0;
}

int fy_cu_queue_compute_done(struct fy_cu_queue *q, struct fy_cu_staging *st)
{
    FY_CUDA(cudaEventRecord(st->computed, q->compute), "recording the compute event");
    FY_CUDA(cudaStreamWaitEvent(q->d2h, st->computed, 0), "ordering downloads after compute");
    FY_CUDA(cudaEventRecord(st->d2h_begin, q->d2h), "recording the download start");
    return 0;
}

int fy_cu_queue_act_out(struct fy_cu_queue *q, struct fy_cu_staging *st, const bf16 *dev)
{
    size_t NC = q->NC;
    if (!q->host_bf16)
        return fy_cu_bf16_to_f32(st->out, dev, NC, q->compute);
    FY_CUDA(cudaMemcpyAsync(st->out, dev, NC * sizeof(bf16), cudaMemcpyDeviceToDevice, q->compute),
            "staging an activation output");
    return 0;
}

int fy_cu_queue_download(struct fy_cu_queue *q, struct fy_cu_staging *st, void *host,
                         const void *dev, size_t bytes)
{
    FY_REQUIRE(st->n_outs < FY_CU_STAGING_OUTS, -EINVAL,
               "cu_queue: more than %d outputs in one call", FY_CU_STAGING_OUTS);
    st->outs[st->n_outs].p = (const char *)host;
    st->outs[st->n_outs].n = bytes;
    st->n_outs++;
    FY_CUDA(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, q->d2h),
            "download of %zu bytes", bytes);
    return 0;
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
        cudaStreamSynchronize(q->compute);
        cudaStreamSynchronize(q->d2h);
        return rc;
    }
    FY_CUDA(cudaEventRecord(st->done, q->d2h), "recording the download event");
    FY_CUDA(cudaLaunchHostFunc(q->d2h, results_home, q), "queueing the completion signal");
    q->pending++;
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
