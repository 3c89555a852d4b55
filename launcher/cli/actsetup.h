/* The activation plan of a train or profile command (the blocks' internals: launcher/plan/actplace.h):
 * the block profiled in a session of the workers (launcher/cli/profile.h), the room the pool and the
 * store leave for swapped internals, the SSD rates of the run's last session's steps
 * (RUN/ssd_rates.json, --ssd-rates), and the plan kept in RUN/act_plan.json. */
#ifndef FY_ACTSETUP_H
#define FY_ACTSETUP_H

#include <stddef.h>

#include "common/model/model.h"
#include "launcher/plan/actplace.h"
#include "launcher/cli/options.h"
#include "launcher/plan/plan.h"
#include "launcher/run/restart.h"

/* RUN/ssd_rates.json: the SSD's rates in a past session's steps (launcher/plan/diskrates.h). */
void fy_actsetup_ssd_rates_path(const struct fy_options *o, char *path, size_t len);
/* --ssd-rates auto: the plan takes the SSD's rates from the run directory's record of the last
 * session's steps on this store, where there is one, in place of `instead` (the profile's sample;
 * for `plan`, the machine profile's or the reference machine's); each way that the steps moved
 * nothing keeps the rate it had. Returns 1 where it took them, else 0. */
int fy_actsetup_ssd_rates(const struct fy_options *o, struct fy_plan_rates *rates,
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
