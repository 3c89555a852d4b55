/* The machine's rates that the planner predicts a step's time from (launcher/plan/plan.h): the
 * reference machine's, or a machine profile's (fuyou-launch probe writes one), with the GPU that
 * probe found. */
#ifndef FY_PLAN_RATES_H
#define FY_PLAN_RATES_H

#include <stdint.h>

#include "common/model/optstate.h"

/* Rates a step's time is predicted from. */
struct fy_plan_rates {
    double gpu_flops;           /* model FLOP/s with blocks recomputed (0: compute not predicted) */
    double h2d, d2h;            /* PCIe bytes/s to and from the GPU */
    double ssd_read, ssd_write; /* bytes/s; reads and writes share the disk */
    double opt_params;          /* AdamW parameters/s with the run's optimizer state format */
    /* AdamW parameters/s on the opt worker as a past session's steps ran it, beside the copies and
     * the disk's transfers that share host memory with it (RUN/step_rates.json); 0: opt_params.
     * opt_params alone, a sample of AdamW by itself, stays the measure of host memory's rate. */
    double opt_in_steps;
    /* AdamW parameters/s by format (enum fy_optim_state; 0: not known) */
    double opt_by_format[FY_OPTIM_STATE_COUNT];
    /* With several GPUs (--gpus): bytes/s one NVLink link carries in the gradients' ring reduce
     * (the CUDA backend's), and bytes/s of host memory that all the GPUs' PCIe copies share
     * (0: not predicted) */
    double nvlink, host_mem;
};
/* The reference machine's (one H200, docs/benchmarks.md "The machine"): what train and plan
 * predict with where no machine profile (fuyou-launch probe) is given. */
extern const struct fy_plan_rates fy_plan_reference_rates;
/* The rates of a machine profile: a JSON object with gpu_flops (model FLOP/s with blocks
 * recomputed), h2d, d2h (bytes/s), ssd_read, ssd_write (bytes/s), opt_params (AdamW
 * parameters/s with fp32 optimizer state), all positive numbers, and optionally opt_params_bf16 and
 * opt_params_int8 (the same with bf16 and int8 state), nvlink and host_mem (bytes/s; absent: the
 * reference machine's); opt_params is fp32's until fy_plan_rates_select. -EINVAL (said, naming
 * the file and key) otherwise. */
int fy_plan_rates_load(const char *path, struct fy_plan_rates *out);
/* The GPU that probe measured for a machine profile: its free and total memory when probe began,
 * where it ran and when (fuyou-launch probe on the CUDA backend writes them). */
struct fy_plan_machine_gpu {
    uint64_t free_bytes, total_bytes; /* 0: the profile has none (the CPU backend's, or older) */
    char host[128], probed_at[64];    /* "" where the profile does not say */
};
/* Reads the profile's gpu_free, gpu_total, host and probed_at into *out; a profile without
 * gpu_free has none (not an error). -EINVAL (said) where gpu_free is there but it or gpu_total is
 * not a positive number of bytes, or gpu_free exceeds gpu_total. */
int fy_plan_machine_gpu_load(const char *path, struct fy_plan_machine_gpu *out);
/* Makes opt_params the rate of optimizer state format `format` (enum fy_optim_state): its entry
 * of opt_by_format. -EINVAL, said naming `from` (where the rates come from), where it is not
 * known. */
int fy_plan_rates_select(struct fy_plan_rates *r, int format, const char *from);
/* The AdamW rate the opt worker's time is predicted at: opt_in_steps where a session's steps
 * measured it, else opt_params. */
double fy_plan_rates_opt_worker(const struct fy_plan_rates *r);

#endif
