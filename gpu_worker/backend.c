/* Backend selection for the gpu worker: "cpu", "cuda", or "auto", which takes CUDA when a device
 * is usable and otherwise says so and uses the CPU backend. */
#include "backend.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"
#include "common/base/config.h"
#include "common/base/dtype.h"
#include "common/base/knobs.h"
#include "common/base/log.h"
#include "gpu_worker/cpu/cpu_backend.h"
#ifdef FY_HAVE_CUDA
#include "gpu_worker/cuda/cuda_backend.h"
#endif

struct fy_backend {
    const struct fy_backend_ops *ops;
    void *state;
    void *registered;
    char device[128];
    int queued; /* gpt calls return once queued (fy_backend_model_set_queued) */
    int B, T;   /* the prepared batch (fy_backend_model_prepare) */
    int holds;  /* gradient buffers held on the device (fy_backend_model_hold) */
};

int fy_backend_cuda_built(void)
{
#ifdef FY_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

int fy_backend_cuda_devices(void)
{
#ifdef FY_HAVE_CUDA
    return fy_cuda_device_count();
#else
    return 0;
#endif
}

/* FUYOU_TEST_GPU_FREE's figures (knobs.h) for the first `ranks` GPUs, the least free kept. */
static int devices_free_given(const char *given, int ranks, uint64_t *free_bytes,
                              uint64_t *total_bytes, int *which)
{
    char copy[512];
    snprintf(copy, sizeof copy, "%s", given);
    int n = 0;
    for (char *save = NULL, *gpu = strtok_r(copy, ",", &save); gpu != NULL && n < ranks;
         gpu = strtok_r(NULL, ",", &save), n++) {
        char *slash = strchr(gpu, '/');
        uint64_t f, t;
        if (slash != NULL)
            *slash = 0;
        FY_REQUIRE(slash != NULL && fy_parse_size(gpu, &f) == 0 &&
                       fy_parse_size(slash + 1, &t) == 0 && f <= t,
                   -EINVAL,
                   "FUYOU_TEST_GPU_FREE=%s: each GPU is FREE/TOTAL, "
                   "sizes with FREE at most TOTAL",
                   given);
        if (n == 0 || f < *free_bytes) {
            *free_bytes = f;
            *total_bytes = t;
            *which = n;
        }
    }
    FY_REQUIRE(n == ranks, -ENODEV, "FUYOU_TEST_GPU_FREE=%s gives %d GPU%s, not the %d of the run",
               given, n, n == 1 ? "" : "s", ranks);
    fy_info("FUYOU_TEST_GPU_FREE: the GPUs' free memory taken from the environment, not CUDA");
    return 0;
}

int fy_backend_devices_free(int ranks, uint64_t *free_bytes, uint64_t *total_bytes, int *which)
{
    *free_bytes = *total_bytes = 0;
    *which = 0;
    const char *given = fy_knob_test_gpu_free();
    if (given != NULL)
        return devices_free_given(given, ranks, free_bytes, total_bytes, which);
#ifdef FY_HAVE_CUDA
    return fy_cuda_devices_free(ranks, free_bytes, total_bytes, which);
#else
    fy_error("the GPUs' free memory: this build has no CUDA backend (nvcc was not found when it "
             "was built)");
    return -ENODEV;
#endif
}

uint64_t fy_backend_gpu_mem_default(uint64_t free_bytes, uint64_t total_bytes, uint64_t *margin)
{
    uint64_t m = total_bytes / 20;
    if (m < FY_BACKEND_GPU_MARGIN_MIN)
        m = FY_BACKEND_GPU_MARGIN_MIN;
    if (m > free_bytes / 2)
        m = free_bytes / 2;
    *margin = m;
    return free_bytes - m;
}

static int backend_try(struct fy_backend *b, const struct fy_backend_ops *ops, uint64_t gpu_mem)
{
    b->ops = ops;
    return ops->open(&b->state, gpu_mem, b->device, sizeof b->device);
}

int fy_backend_open(struct fy_backend **out, const char *which, uint64_t gpu_mem)
{
    *out = NULL;
    struct fy_backend *b = calloc(1, sizeof *b);
    if (b == NULL)
        return -ENOMEM;
    int rc;
    if (strcmp(which, "cpu") == 0) {
        rc = backend_try(b, &fy_cpu_backend_ops, gpu_mem);
    } else if (strcmp(which, "cuda") == 0 || strcmp(which, "auto") == 0) {
#ifdef FY_HAVE_CUDA
        rc = backend_try(b, &fy_cuda_backend_ops, gpu_mem);
#else
        fy_error("this build has no CUDA backend (nvcc was not found when it was built)%s",
                 strcmp(which, "auto") == 0 ? "" : ": use --backend cpu or rebuild with nvcc");
        rc = -ENODEV;
#endif
        if (rc < 0 && strcmp(which, "auto") == 0) {
            fy_warn("no usable CUDA device: using the CPU backend (slow; for tests and laptops)");
            rc = backend_try(b, &fy_cpu_backend_ops, gpu_mem);
        }
    } else {
        fy_error("unknown backend '%s': use cpu, cuda or auto", which);
        rc = -EINVAL;
    }
    if (rc < 0) {
        free(b);
        return rc;
    }
    fy_info("backend %s on %s", b->ops->name, b->device);
    *out = b;
    return 0;
}

void fy_backend_close(struct fy_backend **bp)
{
    if (bp == NULL || *bp == NULL)
        return;
    struct fy_backend *b = *bp;
    if (b->registered != NULL)
        b->ops->unregister_host(b->state, b->registered);
    b->ops->close(b->state);
    free(b);
    *bp = NULL;
}

const char *fy_backend_name(const struct fy_backend *b) { return b->ops->name; }
const char *fy_backend_device(const struct fy_backend *b) { return b->device; }

int fy_backend_register_host(struct fy_backend *b, void *base, size_t len)
{
    FY_REQUIRE(b->registered == NULL, -EBUSY, "backend: host memory already registered");
    FY_TRY(b->ops->register_host(b->state, base, len));
    b->registered = base;
    return 0;
}

int fy_backend_synth(struct fy_backend *b, uint64_t seed, uint64_t step, uint32_t tensor, int dtype,
                     size_t n, void *out)
{
    return b->ops->synth(b->state, seed, step, tensor, dtype, n, out);
}

int fy_backend_model_prepare(struct fy_backend *b, const struct fy_model_config *c, int B, int T)
{
    FY_REQUIRE(b->ops->model_prepare != NULL, -ENOTSUP,
               "the %s backend cannot train models yet: use --backend cpu", b->ops->name);
    FY_TRY(b->ops->model_prepare(b->state, c, B, T));
    b->B = B;
    b->T = T;
    return 0;
}

int fy_backend_model_act_dtype(struct fy_backend *b, int dtype)
{
    FY_REQUIRE(dtype == FY_DTYPE_F32 || dtype == FY_DTYPE_BF16, -EINVAL,
               "activations in host memory are f32 or bf16, not %s", fy_dtype_name(dtype));
    if (b->ops->model_acts_bf16 == NULL) {
        FY_REQUIRE(dtype == FY_DTYPE_F32, -ENOTSUP,
                   "the %s backend computes activations in f32 and takes them only as f32, not "
                   "bf16 (train.act_dtype of the run config, which fuyou-launch train sets from "
                   "the backend it starts: start the run through it)", b->ops->name);
        return 0;
    }
    return b->ops->model_acts_bf16(b->state, dtype == FY_DTYPE_BF16);
}

int fy_backend_preferred_act_dtype(const char *backend_name)
{
    return strcmp(backend_name, "cuda") == 0 ? FY_DTYPE_BF16 : FY_DTYPE_F32;
}

int fy_backend_model_weight_dtype(struct fy_backend *b, int dtype)
{
    FY_REQUIRE(dtype == FY_DTYPE_F32 || dtype == FY_DTYPE_BF16, -EINVAL,
               "weights in host memory are f32 or bf16, not %s", fy_dtype_name(dtype));
    if (b->ops->model_weights_bf16 == NULL) {
        FY_REQUIRE(dtype == FY_DTYPE_F32, -ENOTSUP,
                   "the %s backend takes weights only as f32, not bf16 (--weights-dtype of "
                   "fuyou-launch train: use f32 or auto)", b->ops->name);
        return 0;
    }
    return b->ops->model_weights_bf16(b->state, dtype == FY_DTYPE_BF16);
}

int fy_backend_preferred_weight_dtype(const char *backend_name)
{
    return fy_backend_preferred_act_dtype(backend_name);
}

int fy_backend_gpu_bytes(const char *backend_name, const struct fy_model_config *c, int B, int T,
                         uint64_t *working, uint64_t *set)
{
    *working = *set = 0;
#ifdef FY_HAVE_CUDA
    if (strcmp(backend_name, "cuda") == 0) {
        fy_cuda_gpt_gpu_bytes(c, B, T, working, set);
        return 1;
    }
#endif
    (void)backend_name;
    (void)c;
    (void)B;
    (void)T;
    return 0;
}

const char *fy_backend_resolve(const char *which)
{
    if (strcmp(which, "auto") != 0)
        return which;
#ifdef FY_HAVE_CUDA
    if (fy_cuda_device_visible())
        return "cuda";
#endif
    return "cpu";
}

/* A call that rc says was queued completes here unless the caller asked to finish it later. */
static int completed(struct fy_backend *b, int rc)
{
    double h2d, d2h;
    if (rc == 0 && !b->queued && b->ops->model_finish != NULL)
        rc = b->ops->model_finish(b->state, &h2d, &d2h);
    return rc;
}

int fy_backend_model_set_queued(struct fy_backend *b, int on)
{
    b->queued = on && b->ops->model_finish != NULL;
    return b->queued;
}

int fy_backend_model_finish(struct fy_backend *b, double *h2d_s, double *d2h_s)
{
    FY_REQUIRE(b->queued, -EINVAL, "backend: finishing a call while not in queued mode");
    double h2d, d2h;
    FY_TRY(b->ops->model_finish(b->state, &h2d, &d2h));
    if (h2d_s != NULL)
        *h2d_s = h2d;
    if (d2h_s != NULL)
        *d2h_s = d2h;
    return 0;
}

int fy_backend_model_ready_fd(struct fy_backend *b)
{
    return b->queued ? b->ops->model_ready_fd(b->state) : -1;
}

int fy_backend_positions_are_windows(const int32_t *positions, int B, int T)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            if (positions[(size_t)b * T + t] != t)
                return 0;
    return 1;
}

/* The positions a backend is given: NULL for the windows' (t everywhere), whose code is the one
 * of before positions existed (the same bits by construction, not by the arithmetic agreeing). */
static const int32_t *documents(const struct fy_backend *b, const int32_t *positions)
{
    return positions != NULL && !fy_backend_positions_are_windows(positions, b->B, b->T) ? positions
                                                                                         : NULL;
}

/* model_prepare succeeded, so the backend has every gpt operation. */
int fy_backend_model_embed_forward(struct fy_backend *b, const void *embed, const int32_t *tokens,
                                   const int32_t *positions, void *x)
{
    return completed(
        b, b->ops->model_embed_forward(b->state, embed, tokens, documents(b, positions), x));
}

int fy_backend_model_embed_backward(struct fy_backend *b, const int32_t *tokens,
                                    const int32_t *positions, const void *dx, float *dembed)
{
    return completed(
        b, b->ops->model_embed_backward(b->state, tokens, documents(b, positions), dx, dembed));
}

int fy_backend_model_block_forward(struct fy_backend *b, int layer, const void *params,
                                   const int32_t *positions, const void *x, void *y,
                                   const struct fy_block_saved *saved)
{
    return completed(b, b->ops->model_block_forward(b->state, layer, params,
                                                    documents(b, positions), x, y, saved));
}

int fy_backend_model_block_backward(struct fy_backend *b, int layer, const void *params,
                                    const int32_t *positions, const void *x, const void *dy,
                                    void *dx, float *dparams, const struct fy_block_saved *saved)
{
    return completed(b,
                     b->ops->model_block_backward(b->state, layer, params, documents(b, positions),
                                                  x, dy, dx, dparams, saved));
}

int fy_backend_model_hold(struct fy_backend *b, int count)
{
    FY_REQUIRE(b->ops->model_hold != NULL, -ENOTSUP,
               "the %s backend cannot hold gradients on its device: use --clip-hold pool",
               b->ops->name);
    FY_REQUIRE(count > 0 && b->holds == 0, -EINVAL,
               "backend: holding %d gradients (%d held already): once, at least one", count,
               b->holds);
    FY_TRY(b->ops->model_hold(b->state, count));
    b->holds = count;
    return 0;
}

/* Slot `slot` of the held gradients, said when there is none. */
static int hold_slot(const struct fy_backend *b, int slot)
{
    FY_REQUIRE(slot >= 0 && slot < b->holds, -EINVAL,
               "backend: held gradient %d of %d: outside the buffers taken", slot, b->holds);
    return 0;
}

int fy_backend_model_hold_next(struct fy_backend *b, int slot)
{
    FY_TRY(hold_slot(b, slot));
    return b->ops->model_hold_next(b->state, slot);
}

int fy_backend_model_hold_send(struct fy_backend *b, int slot, float *dparams)
{
    FY_TRY(hold_slot(b, slot));
    return completed(b, b->ops->model_hold_send(b->state, slot, dparams));
}

int fy_backend_model_loss_count(struct fy_backend *b, uint64_t count)
{
    FY_REQUIRE(b->ops->model_loss_count != NULL, -ENOTSUP,
               "the %s backend cannot share a batch between gpu workers: use --gpus 1",
               b->ops->name);
    return b->ops->model_loss_count(b->state, count);
}

int fy_backend_model_sums_ranks(const struct fy_backend *b)
{
    return b->ops->model_ranks != NULL && b->ops->model_rank_id != NULL;
}

int fy_backend_model_rank_id(struct fy_backend *b, void *id, size_t len)
{
    FY_REQUIRE(fy_backend_model_sums_ranks(b), -ENOTSUP,
               "the %s backend has no collective library for several gpu workers", b->ops->name);
    return b->ops->model_rank_id(b->state, id, len);
}

int fy_backend_model_ranks(struct fy_backend *b, int rank, int ranks, const void *id, size_t len)
{
    FY_REQUIRE(fy_backend_model_sums_ranks(b), -ENOTSUP,
               "the %s backend has no collective library for several gpu workers", b->ops->name);
    return b->ops->model_ranks(b->state, rank, ranks, id, len);
}

int fy_backend_model_keep(struct fy_backend *b, int max_layers)
{
    return b->ops->model_keep != NULL && max_layers > 0 ? b->ops->model_keep(b->state, max_layers) : 0;
}

int fy_backend_model_swap(struct fy_backend *b)
{
    return b->ops->model_swap != NULL ? b->ops->model_swap(b->state) : 0;
}

int fy_backend_model_profile(struct fy_backend *b, void *host, size_t host_bytes,
                           struct fy_block_profile *out)
{
    FY_REQUIRE(b->ops->model_profile != NULL, -ENOTSUP,
               "the %s backend cannot profile its blocks", b->ops->name);
    memset(out, 0, sizeof *out);
    FY_TRY(b->ops->model_profile(b->state, host, host_bytes, out));
    out->magic = FY_BLOCK_PROFILE_MAGIC;
    out->version = FY_BLOCK_PROFILE_VERSION;
    return 0;
}

int fy_backend_model_head(struct fy_backend *b, const void *final_params, const void *embed,
                        const void *x, const int32_t *targets, double *loss, void *dx,
                        float *dfinal, float *dembed)
{
    return completed(b, b->ops->model_head(b->state, final_params, embed, x, targets, loss, dx, dfinal, dembed));
}

int fy_backend_model_logits(struct fy_backend *b, const void *final_params, const void *embed,
                          const void *x, float *logits)
{
    return b->ops->model_logits(b->state, final_params, embed, x, logits);
}
