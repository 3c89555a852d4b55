/* fuyou-opt-worker: AdamW on the CPU over regions of the shared pool, with one pinned thread per
 * core of its cpuset and the fastest SIMD kernel this CPU supports (opt_worker/optstep). */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "common/base/knobs.h"
#include "common/base/log.h"
#include "common/ipc/worker.h"
#include "opt_worker/optstep.h"

/* Test hook: FUYOU_TEST_OPT_DELAY_MS makes every AdamW request take that much longer, so that tests
 * can make the optimizer the slowest stage and check what the schedule does then. */
static long test_delay_ms;

static int opt_init(struct fy_worker *w, void **state)
{
    int rc = fy_knob_test_opt_delay_ms(&test_delay_ms);
    if (rc < 0)
        return rc;
    if (rc > 0)
        fy_warn("test hook: every AdamW request is delayed by %ld ms (FUYOU_TEST_OPT_DELAY_MS)",
                test_delay_ms);
    struct fy_optstep *o = NULL;
    rc = fy_optstep_new(&o, w->cfg, w->cpus);
    *state = o;
    return rc;
}

static int opt_handle(struct fy_worker *w, void *state, const struct fy_desc *req, unsigned n,
                      struct fy_desc *reply)
{
    if (test_delay_ms > 0 && n > 0 && req[0].op == FY_OP_OPT_ADAMW) {
        struct timespec pause = {test_delay_ms / 1000, (test_delay_ms % 1000) * 1000000};
        while (nanosleep(&pause, &pause) != 0 && errno == EINTR)
            ;
    }
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
