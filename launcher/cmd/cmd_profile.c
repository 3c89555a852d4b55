/* fuyou-launch profile: the activation plan that train's --act-plan auto would take
 * (launcher/cli/actsetup.h), measured and shown without training. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>

#include "common/base/check.h"
#include "common/base/log.h"
#include "gpu_worker/backend.h"
#include "launcher/cmd/cmd.h"
#include "launcher/cli/actsetup.h"
#include "launcher/plan/plan.h"
#include "launcher/cli/runconf.h"

/* profile: what --act-plan auto measures and chooses for the run's model at --batch x --seq under
 * the given budgets (the optimizer state's residency planned as train plans it), without
 * training; the plan also goes to RUN/act_plan.json. */
int fy_cmd_profile(struct fy_options *o)
{
    FY_TRY(fy_options_require(o->run_dir, "--run-dir", "profile"));
    struct fy_config *mc = calloc(1, sizeof *mc);
    struct fy_model_config model;
    /* the plan's sequence as train's: the state's residency, then the activation plan in the
     * room it leaves (the checkpoints in the pool, as profile takes no --ckpt-place) */
    struct fy_plan_in in;
    struct fy_plan plan = {0};
    struct fy_actsetup act = {.o = o};
    int rc;
    FY_TRY_OUT(rc, mc != NULL ? fy_runconf_load(o, mc, &model) : -ENOMEM);
    if (o->batch < 1 || o->batch > 65536 || o->seq < 1 || o->seq > model.ctx) {
        fy_error("profile: --batch %llu --seq %llu: need a batch of 1 to 65536 and a sequence of "
                 "1 to the model's context of %u",
                 (unsigned long long)o->batch, (unsigned long long)o->seq, model.ctx);
        rc = -FY_EUSAGE;
        goto out;
    }
    char said[PATH_MAX + 1024]; /* the clipping is planned for */
    fy_runconf_train_defaults(o, mc, said, sizeof said);
    fy_info("profile: %s", said);
    fy_runconf_cpu_mem(o, said, sizeof said);
    fy_info("profile: %s", said);
    o->backend = fy_backend_resolve(o->backend);
    fy_runconf_gpu_mem(o, said, sizeof said);
    if (said[0])
        fy_info("profile: %s", said);
    o->act_plan = "auto";
    struct fy_plan_acts acts = fy_actsetup_acts(&act);
    FY_TRY_OUT(rc, fy_runconf_plan_in(o, &model, o->backend, &in));
    FY_TRY_OUT(rc, fy_plan_check_gpu(&in, NULL));
    FY_TRY_OUT(rc, fy_plan_make(&in, &acts, &plan));
    rc = fy_actsetup_save(&act);
out:
    fy_actsetup_release(&act);
    fy_plan_release(&plan);
    free(mc);
    return rc;
}

void fy_cmd_profile_stopped(const struct fy_options *o, const char *removed)
{
    (void)removed; /* profile makes no run directory */
    fy_warn("stopped by signal before the profile was done: nothing was written (%s/act_plan.json "
            "is as it was); run the profile again",
            o->run_dir);
}
