/* The activation plan of a train or profile command (the blocks' internals: launcher/plan/actplace.h):
 * the block profiled in a session of the workers (launcher/cli/profile.h), the room the pool and the
 * store leave for swapped internals, the SSD rates of the run's last session's steps
 * (RUN/step_rates.json, --step-rates), and the plan kept in RUN/act_plan.json. */
#ifndef FY_ACTSETUP_H
#define FY_ACTSETUP_H

#include <stddef.h>

#include "common/model/model.h"
#include "launcher/plan/actplace.h"
#include "launcher/cli/options.h"
#include "launcher/plan/plan.h"
#include "launcher/run/restart.h"

/* RUN/step_rates.json: the rates of a past session's steps (launcher/plan/steprates.h). */
void fy_actsetup_step_rates_path(const struct fy_options *o, char *path, size_t len);
/* --step-rates auto: the plan takes the rates of the run directory's record of the last session's
 * steps, where there is one, in place of `instead` (the profile's sample and AdamW alone; for
 * `plan`, the machine profile's or the reference machine's): the SSD's where the record is of
 * this store (each way that the steps moved nothing keeps the rate it had), AdamW's where it is of
 * this state format (enum fy_optim_state). Returns FY_STEPRATES_SSD | FY_STEPRATES_OPT, those it
 * took. */
int fy_actsetup_step_rates(const struct fy_options *o, int optim_state, struct fy_plan_rates *rates,
                           const char *instead);
/* An activation plan of a train or profile command, made as fy_plan_make's activation step
 * (launcher/plan/plan.h): the command's options, the block's profile, the planner's input and its
 * result. */
struct fy_actsetup {
    const struct fy_options *o;
    struct fy_restart *restarts; /* train's, for a worker that fails in the profile; NULL: none */
    struct fy_block_profile prof;
    struct fy_actplace_in in;
    struct fy_actplace run;
};
/* The activation step for fy_plan_make: every mode profiles a block first on a backend that can
 * (not the Llama blocks; not with --inprocess); auto plans from the profile within the room the
 * pool and the store leave, the forced modes are placed as they are (and are predicted from the
 * profile once the plan is made: fy_actplace_predict). The plan is said in the log. */
struct fy_plan_acts fy_actsetup_acts(struct fy_actsetup *a);
/* The plan for people and tools: RUN/act_plan.json, replaced whole. */
int fy_actsetup_save(const struct fy_actsetup *a);
void fy_actsetup_release(struct fy_actsetup *a);

#endif
