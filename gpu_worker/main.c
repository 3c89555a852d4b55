/* fuyou-gpu-worker: owns the compute backend (CUDA, or the CPU reference where there is no GPU),
 * pins the shared pool for DMA and serves compute requests from the launcher. */
#include <errno.h>
#include <stdlib.h>

#include "common/check.h"
#include "common/dtype.h"
#include "common/worker.h"
#include "gpu_worker/backend.h"

static int gpu_init(struct fy_worker *w, void **state)
{
    const char *which = fy_config_get(w->cfg, "backend");
    uint64_t gpu_mem;
    FY_TRY(fy_config_get_u64(w->cfg, "gpu_mem", 0, 0, &gpu_mem));
    struct fy_backend *b = NULL;
    FY_TRY(fy_backend_open(&b, which ? which : "auto", gpu_mem));
    int rc = fy_backend_register_host(b, fy_pool_base(w->pool), fy_pool_size(w->pool));
    if (rc < 0) {
        fy_backend_close(&b);
        return rc;
    }
    *state = b;
    return 0;
}

static int gpu_handle(struct fy_worker *w, void *state, const struct fy_desc *req, unsigned n,
                      struct fy_desc *reply)
{
    struct fy_backend *b = state;
    switch (req[0].op) {
    case FY_OP_GPU_SYNTH_GRAD: {
        FY_REQUIRE(n == 1 && req[0].kind != FY_KIND_CONTROL, -EPROTO,
                   "gpu-synth-grad takes one region descriptor, got %u", n);
        size_t count = req[0].bytes / fy_dtype_size(req[0].dtype);
        return fy_backend_synth(b, req[0].arg, req[0].step, req[0].tensor, req[0].dtype, count,
                                fy_worker_region(w, &req[0]));
    }
    default:
        fy_error("gpu worker: op %s is not a gpu operation", fy_op_name(req[0].op));
        return -EPROTO;
    }
}

static void gpu_fini(struct fy_worker *w, void *state)
{
    struct fy_backend *b = state;
    fy_backend_close(&b);
}

int main(int argc, char **argv)
{
    static const struct fy_worker_ops ops = {gpu_init, gpu_handle, gpu_fini};
    return fy_worker_main(argc, argv, "gpu", &ops);
}
