/* fuyou-gpu-worker: owns the compute backend (CUDA, or the CPU reference where there is no GPU),
 * pins the shared pool for DMA and serves compute requests from the launcher: GPT forward and
 * backward unit by unit (gpu_worker/gptexec) when the run has a model, and synthetic tensors. */
#include <errno.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"
#include "common/base/dtype.h"
#include "common/base/knobs.h"
#include "common/ipc/worker.h"
#include "gpu_worker/backend.h"
#include "gpu_worker/gptexec.h"

struct gpu_state {
    struct fy_backend *backend;
    struct fy_gptexec *gpt; /* NULL when the run has no model (self-test) */
};

static void gpu_fini(struct fy_worker *w, void *state)
{
    struct gpu_state *s = state;
    if (s == NULL)
        return;
    fy_gptexec_destroy(&s->gpt);
    fy_backend_close(&s->backend);
    free(s);
}

/* With several gpu workers (train.ranks), rank R takes the R-th GPU that CUDA_VISIBLE_DEVICES
 * shows (all of them where it is unset), and CUDA then shows it that one alone. */
static int pick_device(struct fy_worker *w)
{
    uint64_t ranks = 1;
    FY_TRY(fy_config_get_u64(w->cfg, "train.ranks", 0, 1, &ranks));
    if (ranks <= 1)
        return 0;
    const char *visible = fy_knob_cuda_visible_devices();
    char mine[64];
    if (visible == NULL || visible[0] == 0) {
        snprintf(mine, sizeof mine, "%d", w->rank);
    } else {
        const char *at = visible;
        for (int k = 0; k < w->rank && at != NULL; k++)
            at = (at = strchr(at, ',')) ? at + 1 : NULL;
        FY_REQUIRE(at != NULL && *at != 0, -ENODEV,
                   "gpu worker %d: CUDA_VISIBLE_DEVICES=%s shows fewer than %llu GPUs: show one "
                   "per gpu worker, or lower --gpus", w->rank, visible, (unsigned long long)ranks);
        size_t len = strcspn(at, ",");
        snprintf(mine, sizeof mine, "%.*s", (int)(len < sizeof mine ? len : sizeof mine - 1), at);
    }
    char shown[256]; /* as it was: setenv may replace the string */
    snprintf(shown, sizeof shown, "%s", visible ? visible : "unset");
    FY_SYS(setenv("CUDA_VISIBLE_DEVICES", mine, 1), "gpu worker %d: setting CUDA_VISIBLE_DEVICES",
           w->rank);
    const char *backend = fy_config_get(w->cfg, "backend");
    int cpu = backend != NULL && strcmp(backend, "cpu") == 0;
    FY_REQUIRE(cpu || !fy_backend_cuda_built() || fy_backend_cuda_devices() > 0, -ENODEV,
               "gpu worker %d: no GPU %s on this machine (CUDA_VISIBLE_DEVICES=%s): --gpus %llu "
               "needs that many GPUs; lower --gpus", w->rank, mine, shown,
               (unsigned long long)ranks);
    return 0;
}

static int gpu_setup(struct fy_worker *w, struct gpu_state *s)
{
    /* OpenMP sized its team from the cpus the process had at start; the worker has since been
     * pinned to its own cpus, and more threads than cpus would only contend. The CPU backend's
     * results do not depend on the thread count. */
    int cpus = fy_cpulist_parse(w->cpus, NULL, 1 << 20);
    if (cpus > 0)
        omp_set_num_threads(cpus);
    FY_TRY(pick_device(w));
    const char *which = fy_config_get(w->cfg, "backend");
    uint64_t gpu_mem;
    FY_TRY(fy_config_get_u64(w->cfg, "gpu_mem", 0, 0, &gpu_mem));
    FY_TRY(fy_backend_open(&s->backend, which ? which : "auto", gpu_mem));
    FY_TRY(fy_backend_register_host(s->backend, fy_pool_base(w->pool), fy_pool_size(w->pool)));
    if (fy_config_get(w->cfg, "model.n_layer") != NULL)
        FY_TRY(fy_gptexec_new(&s->gpt, s->backend, w->cfg, w->pool));
    return 0;
}

static int gpu_init(struct fy_worker *w, void **state)
{
    struct gpu_state *s = calloc(1, sizeof *s);
    if (s == NULL)
        return -ENOMEM;
    int rc = gpu_setup(w, s);
    if (rc < 0) {
        gpu_fini(w, s);
        return rc;
    }
    *state = s;
    return 0;
}

static int gpu_handle(struct fy_worker *w, void *state, const struct fy_desc *req, unsigned n,
                      struct fy_desc *reply)
{
    struct gpu_state *s = state;
    if (fy_gptexec_handles(req[0].op)) {
        FY_REQUIRE(s->gpt != NULL, -EPROTO, "gpu worker: %s but the run config has no model",
                   fy_op_name(req[0].op));
        return fy_gptexec_handle(s->gpt, w->pool, req, n, reply);
    }
    FY_REQUIRE(req[0].op == FY_OP_GPU_SYNTH_GRAD, -EPROTO, "gpu worker: op %s is not a gpu operation",
               fy_op_name(req[0].op));
    fy_desc_set_copy_times(reply, 0, 0); /* not timed */
    FY_REQUIRE(n == 1 && req[0].kind != FY_KIND_CONTROL, -EPROTO,
               "gpu-synth-grad takes one region descriptor, got %u", n);
    size_t count = req[0].bytes / fy_dtype_size(req[0].dtype);
    return fy_backend_synth(s->backend, req[0].arg, req[0].step, req[0].tensor, req[0].dtype, count,
                            fy_worker_region(w, &req[0]));
}

/* GPT requests are queued on the backend where it queues (CUDA), so that the next request's
 * uploads run while this one computes; everything else is served whole. */
static int gpu_start(struct fy_worker *w, void *state, const struct fy_desc *req, unsigned n,
                     struct fy_desc *reply)
{
    struct gpu_state *s = state;
    if (s->gpt != NULL && fy_gptexec_handles(req[0].op))
        return fy_gptexec_start(s->gpt, w->pool, req, n, reply);
    return gpu_handle(w, state, req, n, reply);
}

static int gpu_finish(struct fy_worker *w, void *state, struct fy_desc *reply)
{
    (void)w;
    return fy_gptexec_finish(((struct gpu_state *)state)->gpt, reply);
}

static int gpu_ready_fd(void *state)
{
    struct gpu_state *s = state;
    return s->gpt != NULL ? fy_gptexec_ready_fd(s->gpt) : -1;
}

static unsigned gpu_queue_depth(void *state)
{
    struct gpu_state *s = state;
    return s->gpt != NULL ? fy_gptexec_queue_depth(s->gpt) : 1;
}

int main(int argc, char **argv)
{
    static const struct fy_worker_ops ops = {
        .init = gpu_init,
        .handle = gpu_handle,
        .fini = gpu_fini,
        .start = gpu_start,
        .finish = gpu_finish,
        .ready_fd = gpu_ready_fd,
        .queue_depth = gpu_queue_depth,
    };
    return fy_worker_main(argc, argv, "gpu", &ops);
}
