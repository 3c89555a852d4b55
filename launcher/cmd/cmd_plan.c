/* fuyou-launch plan: what train would do with these options, printed, nothing run
 * (launcher/plan/forecast.h). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/model/actplan.h"
#include "common/base/check.h"
#include "common/formats/hf.h"
#include "gpu_worker/backend.h"
#include "launcher/cmd/cmd.h"
#include "launcher/plan/forecast.h"
#include "launcher/cli/actsetup.h"
#include "launcher/plan/steprates.h"
#include "launcher/cli/runconf.h"

/* plan: the model of --run-dir (its model.conf), of --from-hf DIR's config.json, or of the model
 * options; the budgets, batch and store of train's options; printed, nothing run. */
int fy_cmd_plan(struct fy_options *o)
{
    struct fy_forecast_in in = {.ssd = o->ssd};
    char mc_path[PATH_MAX];
    int rc;
    static struct fy_config mc; /* o->ssd points into it */
    if (o->run_dir != NULL) {
        rc = fy_runconf_load(o, &mc, &in.model);
        in.ssd = o->ssd;
    } else if (o->from_hf != NULL) {
        snprintf(mc_path, sizeof mc_path, "%s/config.json", o->from_hf);
        rc = fy_hf_read_config(mc_path, &in.model);
        in.model.state_piece = o->state_piece; /* what init --from-hf would make */
    } else {
        rc = fy_runconf_model(o, &in.model);
    }
    FY_TRY(rc);
    char said[PATH_MAX +
              1024]; /* the clipping is planned for: the set of defaults train would take */
    if (o->run_dir != NULL) {
        fy_runconf_train_defaults(o, &mc, said, sizeof said);
    } else {
        int imported = o->from_hf != NULL;
        fy_options_train_defaults(o, imported);
        fy_options_describe_train_defaults(o, imported,
                                           imported ? "--from-hf: a model imported "
                                                      "from Hugging Face"
                                                    : "the model options: a model "
                                                      "made by init",
                                           said, sizeof said);
    }
    if (o->optim_state >= 0) /* what train would do in that format */
        in.model.optim_state = o->optim_state;
    FY_USAGE(o->batch >= 1 && o->batch <= 65536 && o->seq >= 1 && o->seq <= in.model.ctx,
             "plan: --batch %llu --seq %llu: need a batch of 1 to 65536 and a sequence of 1 to "
             "the model's context of %u",
             (unsigned long long)o->batch, (unsigned long long)o->seq, in.model.ctx);
    printf("plan: train would take the %s\n", said);
    /* for the machine it plans for, not this one: auto is CUDA wherever the build has it */
    const char *backend = strcmp(o->backend, "auto") != 0 ? o->backend
                          : fy_backend_cuda_built()       ? "cuda"
                                                          : "cpu";
    char probed[PATH_MAX + 16] = "";
    if (o->machine == NULL && o->run_dir != NULL) {
        snprintf(probed, sizeof probed, "%s/machine.json", o->run_dir);
        if (access(probed, R_OK) == 0)
            o->machine = probed; /* fuyou-launch probe's, for this run */
    }
    char cpu_mem[768];
    fy_runconf_cpu_mem(o, cpu_mem, sizeof cpu_mem);
    if (!o->cpu_mem_set && o->machine != NULL) /* a profile may be another machine's */
        printf("plan: %s (this machine's memory, as train here would take it, whatever machine "
               "%s describes: give --cpu-mem to plan for another)\n",
               cpu_mem, o->machine);
    else
        printf("plan: %s\n", cpu_mem);
    char gpu_mem[PATH_MAX + 768];
    FY_TRY(fy_runconf_plan_gpu_mem(o, backend, gpu_mem, sizeof gpu_mem));
    if (gpu_mem[0])
        printf("plan: %s\n", gpu_mem);
    FY_TRY(fy_runconf_plan_in(o, &in.model, backend, &in.plan));
    if (o->machine != NULL) {
        FY_TRY(fy_plan_rates_load(o->machine, &in.plan.rates));
        in.rates_from = o->machine;
    } else { /* fy_runconf_plan_in's */
        in.rates_from = "the reference machine (one H200; fuyou-launch plan --machine FILE for "
                        "another)";
    }
    FY_TRY(fy_plan_rates_select(&in.plan.rates, in.model.optim_state,
                                o->machine ? o->machine : "the reference machine"));
    char rates_from[PATH_MAX + 160];
    int took = fy_actsetup_step_rates(o, in.model.optim_state, &in.plan.rates,
                                      o->machine ? "the machine profile's rates"
                                                 : "the reference machine's rates");
    if (took) {
        snprintf(rates_from, sizeof rates_from,
                 "%s; %s as the last session's steps ran (%s/step_rates.json)", in.rates_from,
                 fy_steprates_taken(took), o->run_dir);
        in.rates_from = rates_from;
    }
    rc = fy_forecast_print(stdout, &in);
    return rc == 1 ? -FY_EUSAGE : rc; /* does not fit: as train refuses it */
}
