/* Where cu_model's weight gradients go on the device (contract: cu_gradsink.h). */
#include "gpu_worker/cuda/cu_gradsink.h"

#include "gpu_worker/cuda/cu_ranks.h"

static int sink_take(void *ctx, size_t off, size_t n, float **dev)
{
    struct fy_cu_gradsink *s = (struct fy_cu_gradsink *)ctx;
    FY_REQUIRE(n <= s->grads.piece_max && off + n <= s->block_n, -EINVAL,
               "cu_model: a gradient piece of %zu floats at %zu (buffers of %zu, a block of %zu)",
               n, off, s->grads.piece_max, s->block_n);
    int i = s->next;
    s->next = (i + 1) % FY_CU_GRAD_RING;
    if (s->used[i]) /* its last piece is home */
        FY_CUDA(cudaStreamWaitEvent(s->q->compute, s->done[i], 0),
                "waiting for a gradient buffer to be free");
    s->used[i] = 0;
    FY_CUDA(cudaMemsetAsync(s->piece[i], 0, n * sizeof(float), s->q->compute),
            "zeroing a gradient piece");
    s->taking = i;
    *dev = s->piece[i];
    return 0;
}

/* The piece just computed: summed over the ranks, kept in the held buffer the call names, sent
 * home on the device-to-host stream once computed. */
static int sink_put(void *ctx, size_t off, size_t n)
{
    struct fy_cu_gradsink *s = (struct fy_cu_gradsink *)ctx;
    struct fy_cu_queue *q = s->q;
    int i = s->taking;
    if (s->discard)
        return 0;
    FY_TRY(fy_cu_gradsink_sum(s, s->piece[i], n));
    if (s->hold_next >= 0)
        FY_CUDA(cudaMemcpyAsync(s->held + (size_t)s->hold_next * s->block_n + off, s->piece[i],
                                n * sizeof(float), cudaMemcpyDeviceToDevice, q->compute),
                "keeping a gradient piece on the device");
    if (!fy_cu_gradsink_home(s))
        return 0;
    FY_CUDA(cudaEventRecord(s->ready[i], q->compute), "recording a gradient piece");
    FY_CUDA(cudaStreamWaitEvent(q->d2h, s->ready[i], 0),
            "ordering a gradient piece's download after its compute");
    FY_TRY(fy_cu_queue_download_within(q, s->st, s->host + off, s->piece[i], n * sizeof(float)));
    FY_CUDA(cudaEventRecord(s->done[i], q->d2h), "recording a gradient piece's download");
    s->used[i] = 1;
    return 0;
}

int fy_cu_gradsink_init(struct fy_cu_gradsink *s, struct fy_cu_queue *q, size_t piece_n,
                        size_t block_n)
{
    s->q = q;
    s->block_n = block_n;
    s->hold_next = -1;
    if (cudaEventCreateWithFlags(&s->unit_free, cudaEventDisableTiming) != cudaSuccess) {
        fy_error("CUDA: cannot create the model's gradient events");
        return -EIO;
    }
    for (int i = 0; i < FY_CU_GRAD_RING; i++)
        if (cudaEventCreateWithFlags(&s->ready[i], cudaEventDisableTiming) != cudaSuccess ||
            cudaEventCreateWithFlags(&s->done[i], cudaEventDisableTiming) != cudaSuccess) {
            fy_error("CUDA: cannot create the model's gradient events");
            return -EIO;
        }
    s->grads = (struct fy_cu_grads){sink_take, sink_put, s, piece_n};
    return 0;
}

void fy_cu_gradsink_release(struct fy_cu_gradsink *s)
{
    if (s->unit_free)
        cudaEventDestroy(s->unit_free);
    for (int i = 0; i < FY_CU_GRAD_RING; i++) {
        if (s->ready[i])
            cudaEventDestroy(s->ready[i]);
        if (s->done[i])
            cudaEventDestroy(s->done[i]);
    }
}

int fy_cu_gradsink_home(const struct fy_cu_gradsink *s)
{
    return s->ranks == NULL || fy_cu_ranks_rank(s->ranks) == 0;
}

int fy_cu_gradsink_sum(const struct fy_cu_gradsink *s, float *grad, size_t n)
{
    return s->ranks != NULL ? fy_cu_ranks_sum(s->ranks, grad, n, s->q->compute) : 0;
}

int fy_cu_gradsink_unit_wait(const struct fy_cu_gradsink *s, cudaStream_t stream)
{
    if (s->unit_used)
        FY_CUDA(cudaStreamWaitEvent(stream, s->unit_free, 0),
                "waiting for the last download of the unit gradients");
    return 0;
}

int fy_cu_gradsink_unit_sent(struct fy_cu_gradsink *s)
{
    FY_CUDA(cudaEventRecord(s->unit_free, s->q->d2h), "recording the unit gradients' download");
    s->unit_used = 1;
    return 0;
}
