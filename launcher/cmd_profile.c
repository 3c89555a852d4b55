/* fuyou-launch profile: the activation plan that train's --act-plan auto would take
 * (launcher/planact.h), measured and shown without training. */
#include <errno.h>
#include <stdlib.h>

#include "common/check.h"
#include "common/log.h"
#include "gpu_worker/backend.h"
#include "launcher/cmd.h"
#include "launcher/planact.h"
#include "launcher/runconf.h"
#include "launcher/train.h"

/* profile: what --act-plan auto measures and chooses for the run's model at --batch x --seq under
 * the given budgets (the optimizer state's residency planned as train plans it), without
 * training; the plan also goes to RUN/act_plan.json. */
int fy_cmd_profile(struct fy_options *o)
{
    FY_TRY(fy_options_require(o->run_dir, "--run-dir", "profile"));
    struct fy_config *mc = calloc(1, sizeof *mc);
    struct fy_gpt_config model;
    int rc = mc != NULL ? fy_runconf_load(o, mc, &model) : -ENOMEM;
    if (rc == 0 && (o->batch < 1 || o->batch > 65536 || o->seq < 1 || o->seq > model.ctx)) {
        fy_error("profile: --batch %llu --seq %llu: need a batch of 1 to 65536 and a sequence of "
                 "1 to the model's context of %u", (unsigned long long)o->batch,
                 (unsigned long long)o->seq, model.ctx);
        rc = -EINVAL;
    }
    o->backend = fy_backend_resolve(o->backend);
    o->act_plan = "auto";
    int act_dtype = fy_backend_preferred_act_dtype(o->backend), clip = o->clip_grad_norm > 0;
    int weight_dtype = fy_runconf_weight_dtype(o, o->backend);
    unsigned char *resident = rc == 0 ? calloc(fy_gpt_unit_count(&model), 1) : NULL;
    if (rc == 0 && resident == NULL)
        rc = -ENOMEM;
    if (rc == 0)
        fy_plan_resident(&model, (int)o->batch, (int)o->seq, act_dtype, o->cpu_mem, clip,
                         (unsigned)o->prefetch, 0, NULL, weight_dtype, resident);
    struct fy_gpt_profile prof;
    struct fy_actrun_in in;
    struct fy_actrun act = {0};
    if (rc == 0)
        rc = fy_planact_make(o, &model, act_dtype, clip, 0, resident, NULL, &prof, &in, &act);
    if (rc == 0)
        rc = fy_planact_save(o, &act, &in);
    fy_actrun_free(&act);
    free(resident);
    free(mc);
    return rc;
}
