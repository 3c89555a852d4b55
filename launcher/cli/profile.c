/* The profile session (launcher/cli/profile.h): one block of the model timed by the gpu worker, the
 * SSD store through the io worker and AdamW on the opt worker. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"
#include "common/ipc/desc.h"
#include "common/base/dtype.h"
#include "common/base/log.h"
#include "common/model/optstate.h"
#include "launcher/cli/profile.h"
#include "launcher/cli/runconf.h"
#include "launcher/run/session.h"

/* One request of the profile session, waited for; *seconds (may be NULL) gets how long the worker
 * worked on it (the reply's timing). */
static int profile_call(const struct fy_options *o, struct fy_exec *x, const char *worker,
                        struct fy_desc *req, unsigned n, double *seconds)
{
    int64_t t = x->submit(x->ctx, worker, req, n);
    struct fy_desc reply;
    int rc = t < 0 ? (int)t : x->wait(x->ctx, t, &reply, o->timeout_s * 1000);
    if (rc == 0 && seconds != NULL)
        *seconds = (double)reply.bytes * 1e-9;
    return rc;
}

/* The rates the activation plan uses besides the block's: the SSD store written and read through
 * the io worker (a scratch extent of the copies' size, not state), the better of two runs each; and
 * AdamW on the opt worker over a gradient and a state laid out as a unit's in the copies region,
 * the median of PROFILE_ADAMW_RUNS after one that warms it up: on a shared machine single runs of
 * a few milliseconds spread by 2x, and the best of them is far above what a training step sees. */
#define PROFILE_ADAMW_RUNS 5

static int double_order(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int profile_links(const struct fy_options *o, struct fy_exec *x, int format, uint64_t at,
                         uint64_t bytes, struct fy_plan_rates *rates)
{
    unsigned cls = fy_scratch_class(bytes);
    struct fy_desc d = fy_desc_region(FY_OP_IO_ALLOC, FY_KIND_CONTROL, FY_DTYPE_NONE, 0, 0, -1);
    d.tensor = FY_TENSOR_PROBE(cls);
    d.arg = fy_scratch_class_bytes(cls);
    FY_TRY(profile_call(o, x, "io", &d, 1, NULL));
    double best[2] = {INFINITY, INFINITY}, sec, adamw[PROFILE_ADAMW_RUNS];
    /* AdamW over `params` parameters: their f32 gradient, then their state laid out as a unit's
     * in the run's format (common/model/optstate.h); a multiple of 4096 parameters */
    double per_param = 4 + fy_optstate_param_bytes(format);
    uint64_t params = (uint64_t)((double)(bytes - 8 * 4096) / per_param) / 4096 * 4096;
    for (int rep = 0; rep < 2; rep++) {
        const int ops[2] = {FY_OP_IO_WRITE, FY_OP_IO_READ};
        for (int i = 0; i < 2; i++) {
            d = fy_desc_region(ops[i], FY_KIND_RAW, FY_DTYPE_NONE, at, bytes, -1);
            d.tensor = FY_TENSOR_PROBE(cls);
            FY_TRY(profile_call(o, x, "io", &d, 1, &sec));
            best[i] = sec < best[i] ? sec : best[i];
        }
    }
    struct fy_optstate_layout st;
    fy_optstate_layout_params(params, format, &st);
    struct fy_desc req[1 + FY_OPTSTATE_PARTS];
    req[0] = fy_desc_region(FY_OP_OPT_ADAMW, FY_KIND_GRAD, FY_DTYPE_F32, at, params * 4, -1);
    unsigned parts = 1 + fy_optstate_parts(&st, at + params * 4, -1, req + 1);
    for (unsigned k = 0; k < parts; k++)
        req[k].step = 1;
    for (int run = -1; run < PROFILE_ADAMW_RUNS; run++) {
        FY_TRY(profile_call(o, x, "opt", req, parts, &sec));
        if (run >= 0)
            adamw[run] = sec;
    }
    qsort(adamw, PROFILE_ADAMW_RUNS, sizeof adamw[0], double_order);
    rates->ssd_write = (double)bytes / best[0];
    rates->ssd_read = (double)bytes / best[1];
    rates->opt_params = (double)params / adamw[PROFILE_ADAMW_RUNS / 2];
    fy_info("profile: the SSD store %.2f GB/s written, %.2f read (%llu MiB through the io "
            "worker); AdamW %.2f G parameters/s on the opt worker with %s state (median of %d "
            "runs, %.2f to %.2f)",
            1e-9 * rates->ssd_write, 1e-9 * rates->ssd_read, (unsigned long long)(bytes >> 20),
            1e-9 * rates->opt_params, fy_optim_state_name(format), PROFILE_ADAMW_RUNS,
            1e-9 * (double)params / adamw[PROFILE_ADAMW_RUNS - 1],
            1e-9 * (double)params / adamw[0]);
    return 0;
}

/* The profile for --act-plan auto: a session of the workers over a small pool, before the training
 * session's pool is laid out for the plan. The gpu worker measures one block on the training batch
 * (gpt-profile), with --gpus N on its own share, B / N sequences (one gpu worker, as one of N
 * computes them; the plan scales nothing); the SSD store and AdamW are timed too
 * (profile_links). */
int fy_profile_run(const struct fy_options *o, const struct fy_model_config *model, int act_dtype,
                   struct fy_block_profile *out, struct fy_plan_rates *rates,
                   struct fy_sup_fault *fault)
{
    /* enough to time PCIe at full speed; the CPU backend's copies are memory to memory */
    uint64_t copies = strcmp(o->backend, "cpu") == 0 ? 16ull << 20 : 256ull << 20;
    if (o->cpu_mem != 0 && copies > o->cpu_mem / 4)
        copies = o->cpu_mem / 4 / 4096 * 4096;
    copies = copies < (1u << 20) ? 1u << 20 : copies;
    struct fy_pool_region_spec regions[2] = {{"profile", 4096}, {"copies", copies}};
    static const char *const workers[] = {"gpu", "io", "opt"};
    struct fy_config *cfg = calloc(1, sizeof *cfg);
    struct fy_session s = {.lock_fd = -1};
    struct fy_session_opts so = fy_runconf_session(o);
    uint64_t at_result = 0, at_copies = 0, bytes;
    int rc;
    FY_TRY_OUT(rc, cfg != NULL ? fy_runconf_train(o, model, act_dtype, cfg) : -ENOMEM);
    /* nothing kept or readied: the profile measures the bare working buffers */
    FY_TRY_OUT(rc, fy_config_set(cfg, "train.act_plan", "recompute"));
    if (o->gpus > 1) { /* one gpu worker of several: its share of the batch, alone */
        FY_TRY_OUT(rc, fy_config_setf(cfg, "train.batch", "%llu",
                                      (unsigned long long)(o->batch / o->gpus)));
        FY_TRY_OUT(rc, fy_config_set(cfg, "train.ranks", "1"));
    }
    FY_TRY_OUT(rc, fy_session_open(&s, &so, regions, 2, "the profile"));
    FY_TRY_OUT(rc, fy_session_start(&s, cfg, workers, 3, so.ready_timeout_ms));
    FY_TRY_OUT(rc, fy_pool_region(s.pool, "profile", &at_result, &bytes));
    FY_TRY_OUT(rc, fy_pool_region(s.pool, "copies", &at_copies, &bytes));
    struct fy_exec x = fy_session_exec(&s);
    struct fy_desc req[2] = {
        fy_desc_region(FY_OP_GPT_PROFILE, FY_KIND_RAW, FY_DTYPE_NONE, at_copies, copies, -1),
        fy_desc_region(FY_OP_GPT_PROFILE, FY_KIND_RAW, FY_DTYPE_NONE, at_result, 4096, -1)};
    FY_TRY_OUT(rc, profile_call(o, &x, "gpu", req, 2, NULL));
    memcpy(out, fy_pool_at(s.pool, at_result, sizeof *out), sizeof *out);
    if (out->magic != FY_BLOCK_PROFILE_MAGIC || out->version != FY_BLOCK_PROFILE_VERSION) {
        fy_error("the gpu worker's block profile has magic 0x%x version %u, not 0x%x %u: "
                 "the workers come from another build (rebuild with make)",
                 out->magic, out->version, FY_BLOCK_PROFILE_MAGIC, FY_BLOCK_PROFILE_VERSION);
        rc = -EPROTO;
        goto out;
    }
    if (profile_links(o, &x, model->optim_state, at_copies, copies, rates) < 0) {
        if (fy_sup_interrupted(s.sup))
            rc = -EINTR;
        else /* the store's disk may be full, say: the block's figures still hold */
            fy_warn("timing the SSD store and AdamW failed (above): the plan uses the reference "
                    "machine's rates for them");
    }
out:
    free(cfg);
    rc = fy_session_close(&s, rc);
    *fault = s.fault;
    return rc;
}
