/* fuyou-launch probe: measures this machine for the planner, in under a minute: the backend's
 * block compute rate and its copies to and from the device (each way and both at once: PCIe on
 * the CUDA backend, memory copies on the CPU one) and its GEMM rate, the SSD store's read and
 * write bandwidth through the io engine on each given path alone and over all of them together,
 * host memory copy bandwidth (one thread, and one per core), and AdamW's rate for each thread
 * count and each way of storing the moments (fp32, bf16, 8-bit). Saves a machine profile (JSON) that `plan --machine` and `train`
 * (RUN/machine.json) use instead of the reference machine's figures. */
#ifndef FY_PROBE_H
#define FY_PROBE_H

#include <stdint.h>

#include "launcher/plan/plan.h"

#define FY_PROBE_MAX_THREADS 16
#define FY_PROBE_MAX_PATHS 16

struct fy_probe_opts {
    const char *backend; /* "cpu" or "cuda" (resolved) */
    uint64_t gpu_mem;    /* the backend's arena (0: its default) */
    const char *ssd;     /* the store's directories, comma-separated */
    uint64_t io_bytes;   /* written and read back through the store (0: 1 GiB) */
};

struct fy_probe_result {
    struct fy_plan_rates rates; /* what plan and train predict from */
    double duplex_Bps;          /* copies both ways at once, summed */
    double gemm_flops;          /* the block's QKV product alone (the GEMM rate), FLOP/s */
    double memcpy_Bps;          /* host memory copy by one thread, bytes copied per second */
    double memcpy_all_Bps;      /* ... by memcpy_threads threads, one per core */
    unsigned memcpy_threads;
    char device[128];
    uint64_t gpu_free,
        gpu_total;      /* the GPU's free and total memory as probe began (CUDA; 0: none) */
    char host[256];     /* the machine's name (gethostname) */
    char probed_at[32]; /* when it began, UTC, as 2026-01-31T12:00:00Z */
    unsigned ssd_paths;
    /* each path's store alone (with one path: the store's figures) */
    char ssd_path[FY_PROBE_MAX_PATHS][256];
    double ssd_path_read[FY_PROBE_MAX_PATHS], ssd_path_write[FY_PROBE_MAX_PATHS];
    unsigned n_threads; /* AdamW measured with threads[0..n) */
    unsigned threads[FY_PROBE_MAX_THREADS];
    double opt_params[FY_PROBE_MAX_THREADS]; /* fp32 moments (rates.opt_params: the best) */
    /* by moments storage (enum fy_adamw_moments: fp32, bf16, 8-bit), parameters/s per thread
     * count ([0] = opt_params) and the best of each */
    double opt_params_by_moments[3][FY_PROBE_MAX_THREADS];
    double opt_params_best[3];
    double seconds; /* the probe's own time */
};

int fy_probe_run(const struct fy_probe_opts *o, struct fy_probe_result *r);
/* The machine profile: the six rates plan reads (launcher/plan/forecast.h), the GPU's free memory that
 * plan's --gpu-mem default takes, and the details; written to a
 * temporary file, fsynced, renamed. */
int fy_probe_save(const char *path, const struct fy_probe_opts *o, const struct fy_probe_result *r);

#endif
