/* The CUDA backend of the gpu worker: one device arena of the budgeted size allocated once, the
 * shared pool pinned with cudaHostRegister so copies into it run at full PCIe speed, and the model
 * of cu_model (any family with CUDA units: cu_family.h), whose calls queue (compute, host-to-device
 * and device-to-host streams) and are completed by model_finish. With several gpu workers
 * (--gpus), the batch's loss count for the head and, where the build has NCCL, the workers' group
 * (cu_ranks), through which the model sums every gradient on the devices. Every CUDA call is
 * checked and reported with a hint. */
#include "cuda_backend.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/dtype.h"
#include "common/base/synth.h"
#include "gpu_worker/cuda/cu_arena.h"
#include "gpu_worker/cuda/cu_common.h"
#include "gpu_worker/cuda/cu_model.h"
#include "gpu_worker/cuda/cu_ranks.h"

/* Default arena when no budget is given: enough for staging, small enough for any GPU. */
static const uint64_t default_arena_bytes = 256ull << 20;

struct cuda_state {
    int device;
    uint64_t budget; /* --gpu-mem; 0: size the arena to what the work needs */
    struct fy_cu_arena arena;
    struct fy_cu_model *model;
    size_t model_mark; /* arena use before the model's buffers: released when preparing again */
    int weights_bf16; /* model_weights_bf16's switch, which outlives a model_prepare on either side */
    uint64_t loss_count;       /* model_loss_count's, which does too */
    struct fy_cu_ranks *ranks; /* model_ranks's group, handed to every model prepared */
    cudaStream_t compute;
    cudaStream_t d2h;
    cudaEvent_t computed;
};

static __device__ uint16_t device_f32_to_bf16(float f)
{
    uint32_t bits = __float_as_uint(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((bits >> 16) | 0x0040u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

static __global__ void synth_kernel(uint64_t seed, uint64_t step, uint32_t tensor, uint64_t first,
                                    size_t n, int bf16, void *out)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = fy_synth_value(seed, step, tensor, first + i);
        if (bf16)
            ((uint16_t *)out)[i] = device_f32_to_bf16(v);
        else
            ((float *)out)[i] = v;
    }
}

static void cuda_release(struct cuda_state *s)
{
    if (s->computed)
        cudaEventDestroy(s->computed);
    if (s->compute)
        cudaStreamDestroy(s->compute);
    if (s->d2h)
        cudaStreamDestroy(s->d2h);
    fy_cu_model_destroy(&s->model); /* its calls done: nothing of the group is in flight */
    fy_cu_ranks_destroy(&s->ranks);
    if (s->arena.base != NULL)
        fy_info("GPU arena: peak %.3f GiB of %.3f GiB", (double)s->arena.peak / (1 << 30),
                (double)s->arena.size / (1 << 30));
    fy_cu_arena_release(&s->arena);
    free(s);
}

static int cuda_init(struct cuda_state *s, uint64_t gpu_mem, char *device, size_t device_len)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        fy_info("CUDA: no usable device (%s)",
                err != cudaSuccess ? cudaGetErrorString(err) : "no device found");
        return -ENODEV;
    }
    FY_CUDA(cudaSetDevice(s->device), "selecting CUDA device %d", s->device);
    cudaDeviceProp prop;
    FY_CUDA(cudaGetDeviceProperties(&prop, s->device), "reading properties of device %d", s->device);
    size_t free_bytes = 0, total_bytes = 0;
    FY_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes), "reading memory of device %d", s->device);
    s->budget = gpu_mem;
    if (gpu_mem > free_bytes) {
        fy_error("--gpu-mem %llu bytes exceeds the %llu bytes free on %s: lower --gpu-mem",
                 (unsigned long long)gpu_mem, (unsigned long long)free_bytes, prop.name);
        return -ENOMEM;
    }
    if (gpu_mem > 0)
        FY_TRY(fy_cu_arena_init(&s->arena, gpu_mem));
    FY_CUDA(cudaStreamCreateWithFlags(&s->compute, cudaStreamNonBlocking), "creating compute stream");
    FY_CUDA(cudaStreamCreateWithFlags(&s->d2h, cudaStreamNonBlocking), "creating D2H stream");
    FY_CUDA(cudaEventCreateWithFlags(&s->computed, cudaEventDisableTiming), "creating event");
    snprintf(device, device_len, "%s (sm_%d%d, %.1f GiB; arena %s)", prop.name, prop.major,
             prop.minor, (double)total_bytes / (1 << 30),
             gpu_mem ? "the --gpu-mem budget" : "sized to the work");
    return 0;
}

static int cuda_open(void **state, uint64_t gpu_mem, char *device, size_t device_len)
{
    *state = NULL;
    struct cuda_state *s = (struct cuda_state *)calloc(1, sizeof *s);
    if (s == NULL)
        return -ENOMEM;
    int rc = cuda_init(s, gpu_mem, device, device_len);
    if (rc < 0) {
        cuda_release(s);
        return rc;
    }
    *state = s;
    return 0;
}

static void cuda_close(void *state)
{
    if (state != NULL)
        cuda_release((struct cuda_state *)state);
}

static int cuda_register_host(void *state, void *base, size_t len)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    FY_CUDA(cudaHostRegister(base, len, cudaHostRegisterPortable),
            "pinning %zu bytes of the shared pool (check RLIMIT_MEMLOCK: ulimit -l)", len);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    fy_info("pinned %.2f GiB of shared pool for DMA in %.2f s", (double)len / (1 << 30),
            (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    return 0;
}

static int cuda_unregister_host(void *state, void *base)
{
    FY_CUDA(cudaHostUnregister(base), "unpinning the shared pool");
    return 0;
}

static int cuda_synth(void *state, uint64_t seed, uint64_t step, uint32_t tensor, int dtype,
                      size_t n, void *out)
{
    struct cuda_state *s = (struct cuda_state *)state;
    size_t elem = fy_dtype_size(dtype);
    if (dtype != FY_DTYPE_F32 && dtype != FY_DTYPE_BF16) {
        fy_error("synthetic tensor: dtype %s not supported", fy_dtype_name(dtype));
        return -EINVAL;
    }
    if (s->arena.base == NULL)
        FY_TRY(fy_cu_arena_init(&s->arena, default_arena_bytes));
    /* Two halves of what is free in the arena: compute into one while the other drains. */
    size_t mark = s->arena.used, half_bytes = (s->arena.size - s->arena.used) / 2 / 4096 * 4096;
    char *staging = (char *)fy_cu_arena_take(&s->arena, 2 * half_bytes);
    if (staging == NULL || half_bytes < elem) {
        fy_error("the GPU arena has no room to stage a synthetic tensor: raise --gpu-mem");
        return -ENOMEM;
    }
    size_t chunk = half_bytes / elem;
    for (size_t first = 0, half = 0; first < n; first += chunk, half ^= 1) {
        size_t count = n - first < chunk ? n - first : chunk;
        char *dev = staging + half * half_bytes;
        synth_kernel<<<264, 256, 0, s->compute>>>(seed, step, tensor, first, count,
                                                  dtype == FY_DTYPE_BF16, dev);
        FY_CUDA(cudaGetLastError(), "launching the synthetic-tensor kernel");
        FY_CUDA(cudaEventRecord(s->computed, s->compute), "recording event");
        FY_CUDA(cudaStreamWaitEvent(s->d2h, s->computed, 0), "ordering D2H after compute");
        FY_CUDA(cudaMemcpyAsync((char *)out + first * elem, dev, count * elem,
                                cudaMemcpyDeviceToHost, s->d2h),
                "copying %zu bytes to the pool", count * elem);
        /* The next kernel reuses the other half; the one after this half must wait for its copy. */
        FY_CUDA(cudaEventRecord(s->computed, s->d2h), "recording event");
        FY_CUDA(cudaStreamWaitEvent(s->compute, s->computed, 0), "ordering compute after D2H");
    }
    FY_CUDA(cudaStreamSynchronize(s->d2h), "waiting for the copy to the pool");
    fy_cu_arena_reset(&s->arena, mark);
    return 0;
}

static int cuda_model_prepare(void *state, const struct fy_model_config *c, int B, int T)
{
    struct cuda_state *s = (struct cuda_state *)state;
    size_t need = fy_cu_model_arena_bytes(c, B, T);
    if (s->arena.base == NULL)
        FY_TRY(fy_cu_arena_init(&s->arena, need));
    /* Preparing again (another batch shape, or the same one) replaces the previous buffers. */
    if (s->model != NULL) {
        fy_cu_model_destroy(&s->model);
        fy_cu_arena_reset(&s->arena, s->model_mark);
    }
    s->model_mark = s->arena.used;
    if (need > s->arena.size - s->arena.used) {
        fy_error("plan does not fit the GPU: the model's working buffers for batch %d x %d need "
                 "%.3f GiB but --gpu-mem is %.3f GiB (%.3f GiB in use): raise --gpu-mem or lower "
                 "the batch",
                 B, T, (double)need / (1 << 30), (double)s->arena.size / (1 << 30),
                 (double)s->arena.used / (1 << 30));
        return -ENOMEM;
    }
    FY_TRY(fy_cu_model_new(&s->model, &s->arena, c, B, T));
    FY_TRY(fy_cu_model_set_host_weights_bf16(s->model, s->weights_bf16));
    FY_TRY(fy_cu_model_set_loss_count(s->model, s->loss_count));
    FY_TRY(fy_cu_model_set_ranks(s->model, s->ranks));
    fy_info("GPU arena: %.3f GiB for the model's working buffers (batch %d x %d), %.3f GiB budget",
            (double)need / (1 << 30), B, T, (double)s->arena.size / (1 << 30));
    return 0;
}

static int cuda_embed_forward(void *state, const void *embed, const int32_t *tokens,
                              const int32_t *positions, void *x)
{
    return fy_cu_model_embed_forward(((struct cuda_state *)state)->model, embed, tokens, positions,
                                     x);
}

static int cuda_embed_backward(void *state, const int32_t *tokens, const int32_t *positions,
                               const void *dx, float *dembed)
{
    return fy_cu_model_embed_backward(((struct cuda_state *)state)->model, tokens, positions, dx,
                                      dembed);
}

static int cuda_block_forward(void *state, int layer, const void *params, const int32_t *positions,
                              const void *x, void *y, const struct fy_block_saved *saved)
{
    return fy_cu_model_block_forward(((struct cuda_state *)state)->model, layer, params, positions,
                                     x, y, saved);
}

static int cuda_block_backward(void *state, int layer, const void *params, const int32_t *positions,
                               const void *x, const void *dy, void *dx, float *dparams,
                               const struct fy_block_saved *saved)
{
    return fy_cu_model_block_backward(((struct cuda_state *)state)->model, layer, params, positions,
                                      x, dy, dx, dparams, saved);
}

static int cuda_head(void *state, const void *final_params, const void *embed, const void *x,
                     const int32_t *targets, double *loss, void *dx, float *dfinal, float *dembed)
{
    return fy_cu_model_head(((struct cuda_state *)state)->model, final_params, embed, x, targets,
                            loss, dx, dfinal, dembed);
}

static int cuda_logits(void *state, const void *final_params, const void *embed, const void *x,
                       float *logits)
{
    return fy_cu_model_logits(((struct cuda_state *)state)->model, final_params, embed, x, logits);
}

static int cuda_finish(void *state, double *h2d_s, double *d2h_s)
{
    struct fy_cu_copy_times t;
    FY_TRY(fy_cu_model_finish(((struct cuda_state *)state)->model, &t));
    *h2d_s = 1e-3 * t.h2d_ms;
    *d2h_s = 1e-3 * t.d2h_ms;
    return 0;
}

static int cuda_ready_fd(void *state)
{
    return fy_cu_model_ready_fd(((struct cuda_state *)state)->model);
}

static int cuda_keep(void *state, int max_layers)
{
    struct cuda_state *s = (struct cuda_state *)state;
    size_t before = s->arena.used;
    int kept = fy_cu_model_keep_layers(s->model, &s->arena, max_layers);
    if (kept >= 0)
        fy_info("GPU arena: the internals of %d blocks kept for their backward (the top ones, of "
                "%d asked; %.3f GiB), the others recomputed from their inputs; %.3f of %.3f GiB "
                "in use",
                kept, max_layers, (double)(s->arena.used - before) / (1 << 30),
                (double)s->arena.used / (1 << 30), (double)s->arena.size / (1 << 30));
    return kept;
}

static int cuda_swap(void *state)
{
    struct cuda_state *s = (struct cuda_state *)state;
    FY_REQUIRE(s->model != NULL, -EINVAL,
               "cuda backend: readying swapped blocks before model_prepare");
    size_t before = s->arena.used;
    FY_TRY(fy_cu_model_swap_sets(s->model, &s->arena));
    fy_info("GPU arena: %.3f GiB for the block internals that swapped blocks compute in (one set "
            "per call in flight); %.3f of %.3f GiB in use",
            (double)(s->arena.used - before) / (1 << 30), (double)s->arena.used / (1 << 30),
            (double)s->arena.size / (1 << 30));
    return 0;
}

static int cuda_hold(void *state, int count)
{
    struct cuda_state *s = (struct cuda_state *)state;
    FY_REQUIRE(s->model != NULL, -EINVAL, "cuda backend: holding gradients before model_prepare");
    size_t before = s->arena.used;
    FY_TRY(fy_cu_model_hold(s->model, &s->arena, count));
    fy_info("GPU arena: %.3f GiB for %d blocks' gradients, held until the norm is known "
            "(one-pass clipping); %.3f of %.3f GiB in use",
            (double)(s->arena.used - before) / (1 << 30), count,
            (double)s->arena.used / (1 << 30), (double)s->arena.size / (1 << 30));
    return 0;
}

static int cuda_hold_next(void *state, int slot)
{
    return fy_cu_model_hold_next(((struct cuda_state *)state)->model, slot);
}

static int cuda_hold_send(void *state, int slot, float *dparams)
{
    return fy_cu_model_hold_send(((struct cuda_state *)state)->model, slot, dparams);
}

static int cuda_profile(void *state, void *host, size_t host_bytes, struct fy_block_profile *out)
{
    struct cuda_state *s = (struct cuda_state *)state;
    FY_REQUIRE(s->model != NULL, -EINVAL, "cuda backend: profiling blocks before model_prepare");
    FY_TRY(fy_cu_model_profile(s->model, &s->arena, host, host_bytes, out));
    char kinds[160] = "";
    size_t len = 0;
    for (int k = 0; k < FY_ACT_KINDS && len < sizeof kinds; k++)
        if (fy_actplan_kind_swappable(k))
            len += (size_t)snprintf(kinds + len, sizeof kinds - len, " %s %.3f",
                                    fy_actplan_kind_name(k), 1e3 * out->recompute_s[k]);
    fy_info("profiled one block: forward %.3f ms, backward %.3f ms (from kept internals); "
            "recompute ms:%s; PCIe %.1f GB/s up, %.1f down, %.1f both ways; %.3f GiB free for "
            "internals, %.3f GiB a set",
            1e3 * out->fwd_s, 1e3 * out->bwd_s, kinds, 1e-9 * out->h2d_Bps, 1e-9 * out->d2h_Bps,
            1e-9 * out->duplex_Bps, (double)out->gpu_free / (1 << 30),
            (double)out->set_bytes / (1 << 30));
    return 0;
}

static int cuda_acts_bf16(void *state, int on)
{
    struct cuda_state *s = (struct cuda_state *)state;
    FY_REQUIRE(s->model != NULL, -EINVAL,
               "cuda backend: choosing the activations' host dtype before model_prepare");
    return fy_cu_model_set_host_acts_bf16(s->model, on);
}

/* Unlike the activations' dtype, this may come before model_prepare, as on the CPU backend. */
static int cuda_weights_bf16(void *state, int on)
{
    struct cuda_state *s = (struct cuda_state *)state;
    s->weights_bf16 = on != 0;
    return s->model != NULL ? fy_cu_model_set_host_weights_bf16(s->model, s->weights_bf16) : 0;
}

/* Like the weights' dtype, this may come before model_prepare. */
static int cuda_loss_count(void *state, uint64_t count)
{
    struct cuda_state *s = (struct cuda_state *)state;
    s->loss_count = count;
    return s->model != NULL ? fy_cu_model_set_loss_count(s->model, count) : 0;
}

#ifdef FY_HAVE_NCCL
static int cuda_rank_id(void *state, void *id, size_t len)
{
    return fy_cu_ranks_id(id, len);
}

/* Before or after model_prepare; once. A model that cannot take the group (held gradients) has it
 * left again at once, as every rank does, since they all made the same calls. */
static int cuda_ranks(void *state, int rank, int ranks, const void *id, size_t len)
{
    struct cuda_state *s = (struct cuda_state *)state;
    FY_REQUIRE(s->ranks == NULL, -EBUSY,
               "cuda backend: joining a group of gpu workers a second time (rank %d of %d)", rank,
               ranks);
    FY_TRY(fy_cu_ranks_new(&s->ranks, s->device, rank, ranks, id, len));
    int rc = s->model != NULL ? fy_cu_model_set_ranks(s->model, s->ranks) : 0;
    if (rc < 0) {
        fy_cu_ranks_destroy(&s->ranks);
        return rc;
    }
    fy_info("gpu worker %d of %d: gradients summed over the workers on the devices (NCCL)", rank,
            ranks);
    return 0;
}
#else /* no NCCL: model_rank_id and model_ranks left out */
#define cuda_rank_id NULL
#define cuda_ranks NULL
#endif

extern "C" void fy_cuda_gpt_gpu_bytes(const struct fy_model_config *c, int B, int T,
                                      uint64_t *working, uint64_t *set)
{
    *working = fy_cu_model_arena_bytes(c, B, T);
    *set = fy_cu_model_set_bytes(c, B, T);
}

extern "C" int fy_cuda_device_count(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

extern "C" int fy_cuda_devices_free(int ranks, uint64_t *free_bytes, uint64_t *total_bytes,
                                    int *which)
{
    int count = fy_cuda_device_count();
    FY_REQUIRE(count >= ranks, -ENODEV,
               "the GPUs' free memory: CUDA shows %d GPU%s, the run takes "
               "%d: show one per gpu worker (CUDA_VISIBLE_DEVICES), or lower --gpus",
               count, count == 1 ? "" : "s", ranks);
    int rc = 0;
    for (int d = 0; d < ranks && rc == 0; d++) {
        size_t f = 0, t = 0;
        cudaError_t err = cudaSetDevice(d);
        if (err == cudaSuccess)
            err = cudaMemGetInfo(&f, &t);
        if (err != cudaSuccess) {
            fy_error("reading the free memory of GPU %d: CUDA: %s (%s)", d, cudaGetErrorString(err),
                     cudaGetErrorName(err));
            rc = -EIO;
        } else if (d == 0 || f < *free_bytes) {
            *free_bytes = f;
            *total_bytes = t;
            *which = d;
        }
        cudaDeviceReset(); /* the primary context this made, gone: the workers start clean */
    }
    return rc;
}

extern "C" int fy_cuda_device_visible(void) { return fy_cuda_device_count() > 0; }

static_assert(FY_CU_QUEUE == FY_BACKEND_QUEUE, "queue depths of the interface and cu_queue");

extern "C" const struct fy_backend_ops fy_cuda_backend_ops = {
    "cuda",          cuda_open,          cuda_close,          cuda_register_host,
    cuda_unregister_host, cuda_synth,    cuda_model_prepare,    cuda_embed_forward,
    cuda_embed_backward, cuda_block_forward, cuda_block_backward, cuda_head, cuda_logits,
    cuda_finish,     cuda_ready_fd,      cuda_acts_bf16,      cuda_keep,          cuda_swap,
    cuda_profile,    cuda_weights_bf16,  cuda_hold,           cuda_hold_next,     cuda_hold_send,
    cuda_loss_count, cuda_rank_id,       cuda_ranks,
};
