/* fuyou-opt-worker: AdamW on the CPU over regions of the shared pool, with one pinned thread per
 * core of its cpuset and the fastest SIMD kernel this CPU supports (opt_worker/optstep). */
#include "common/worker.h"
#include "opt_worker/optstep.h"

static int opt_init(struct fy_worker *w, void **state)
{
    struct fy_optstep *o = NULL;
    int rc = fy_optstep_new(&o, w->cfg, w->cpus);
    *state = o;
    return rc;
}

static int opt_handle(struct fy_worker *w, void *state, const struct fy_desc *req, unsigned n,
                      struct fy_desc *reply)
{
    return fy_optstep_handle(state, w->pool, req, n, reply);
}

static void opt_fini(struct fy_worker *w, void *state)
{
    struct fy_optstep *o = state;
    fy_optstep_destroy(&o);
}

int main(int argc, char **argv)
{
    static const struct fy_worker_ops ops = {.init = opt_init, .handle = opt_handle, .fini = opt_fini};
    return fy_worker_main(argc, argv, "opt", &ops);
}
