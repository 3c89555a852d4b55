/* fuyou-launch probe: this machine measured into a machine profile (launcher/cmd/probe.h). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/base/check.h"
#include "common/base/fsutil.h"
#include "common/base/log.h"
#include "gpu_worker/backend.h"
#include "launcher/cmd/cmd.h"
#include "launcher/cmd/probe.h"
#include "launcher/cli/runconf.h"
#include "launcher/run/stopsig.h"

/* probe: the machine profile, into --out, or RUN/machine.json with --run-dir (where train and
 * plan find it), or ./machine.json. */
int fy_cmd_probe(struct fy_options *o)
{
    char ssd[PATH_MAX + 16], out[PATH_MAX + 16], mc_path[PATH_MAX + 16];
    if (o->ssd == NULL && o->run_dir != NULL) {
        snprintf(mc_path, sizeof mc_path, "%s/model.conf", o->run_dir);
        if (access(mc_path, F_OK) == 0) { /* the run's store, wherever init put it */
            static struct fy_config mc;   /* o->ssd may point into it */
            struct fy_model_config model;
            FY_TRY(fy_runconf_load(o, &mc, &model));
        } else {
            snprintf(ssd, sizeof ssd, "%s/store", o->run_dir);
            o->ssd = ssd;
        }
    }
    FY_USAGE(o->ssd != NULL,
             "probe: give the SSD directories to measure (--ssd DIR[,DIR...]) or a --run-dir "
             "whose store is in DIR/store");
    FY_TRY(fy_runconf_check_ssd(o->ssd));
    if (o->out != NULL)
        snprintf(out, sizeof out, "%s", o->out);
    else if (o->run_dir != NULL)
        snprintf(out, sizeof out, "%s/machine.json", o->run_dir);
    else
        snprintf(out, sizeof out, "machine.json");
    struct fy_probe_opts po = {
        .backend = fy_backend_resolve(o->backend), .gpu_mem = o->gpu_mem, .ssd = o->ssd};
    fy_info("probe: measuring this machine (under a minute): the %s backend's block and copies, "
            "the SSD store on %s, memory copies, AdamW per thread count and moments storage",
            po.backend, o->ssd);
    struct fy_probe_result r;
    /* --out's missing directories, removed again where it fails (the run directory is not made:
     * only init and selftest make one) */
    struct fy_made_dirs made = {0};
    FY_TRY(fy_stopsig_install()); /* a stop removes the SSD's scratch files (fy_probe_run) */
    if (o->out != NULL)
        FY_TRY(fy_mkdirs_for(out, "the directory of the machine profile", &made));
    int rc = fy_probe_run(&po, &r);
    if (rc < 0) {
        fy_made_dirs_undo(&made, NULL, 0);
        return rc;
    }
    fy_info("probe: %s: %.4g TFLOP/s (a block, recomputed as in training), %.4g TFLOP/s its QKV "
            "product alone; copies to %.1f GB/s, from %.1f GB/s, both ways %.1f GB/s",
            r.device, r.rates.gpu_flops * 1e-12, r.gemm_flops * 1e-12, r.rates.h2d * 1e-9,
            r.rates.d2h * 1e-9, r.duplex_Bps * 1e-9);
    if (r.gpu_total > 0) {
        char free_s[32], total_s[32];
        fy_format_size(r.gpu_free, free_s, sizeof free_s);
        fy_format_size(r.gpu_total, total_s, sizeof total_s);
        fy_info("probe: GPU memory %s free of %s (plan's --gpu-mem default takes it)", free_s,
                total_s);
    }
    for (unsigned i = 0; r.ssd_paths > 1 && i < r.ssd_paths; i++)
        fy_info("probe: SSD path %s alone: read %.2f GB/s, write %.2f GB/s", r.ssd_path[i],
                r.ssd_path_read[i] * 1e-9, r.ssd_path_write[i] * 1e-9);
    fy_info("probe: SSD store on %u path%s: read %.2f GB/s, write %.2f GB/s; memory copy %.1f "
            "GB/s by one thread, %.1f GB/s by %u",
            r.ssd_paths, r.ssd_paths == 1 ? "" : "s", r.rates.ssd_read * 1e-9,
            r.rates.ssd_write * 1e-9, r.memcpy_Bps * 1e-9, r.memcpy_all_Bps * 1e-9,
            r.memcpy_threads);
    static const char *const moments[3] = {"fp32", "bf16", "8-bit"};
    for (int mode = 0; mode < 3; mode++) {
        char per[512] = "";
        for (unsigned i = 0; i < r.n_threads; i++)
            snprintf(per + strlen(per), sizeof per - strlen(per), "%s%u: %.2f", i ? ", " : "",
                     r.threads[i], r.opt_params_by_moments[mode][i] * 1e-9);
        fy_info("probe: AdamW G parameters/s by threads, %s moments: %s", moments[mode], per);
    }
    rc = fy_probe_save(out, &po, &r);
    if (rc < 0) {
        fy_made_dirs_undo(&made, NULL, 0);
        return rc;
    }
    fy_info("probe: took %.1f s; machine profile written to %s (plan --machine %s; train reads "
            "RUN/machine.json)",
            r.seconds, out, out);
    return 0;
}

void fy_cmd_probe_stopped(const struct fy_options *o, const char *removed)
{
    (void)o;       /* o->ssd may have named a buffer of the command's, gone by now */
    (void)removed; /* probe makes no run directory */
    fy_warn("stopped by signal before probe was done: nothing was written (the machine profile is "
            "as it was; the scratch files it made on the SSD paths are removed, and any directory "
            "made for --out); run it again");
}
