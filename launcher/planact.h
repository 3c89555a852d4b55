/* The activation plan of a train or profile command (the blocks' internals: launcher/actrun.h):
 * the block profiled in a session of the workers (launcher/profile.h), the room the pool and the
 * store leave for swapped internals, the SSD rates of the run's last session's steps
 * (RUN/ssd_rates.json, --ssd-rates), and the plan kept in RUN/act_plan.json. */
#ifndef FY_PLANACT_H
#define FY_PLANACT_H

#include <stddef.h>

#include "common/model.h"
#include "launcher/actrun.h"
#include "launcher/options.h"
#include "launcher/restart.h"
#include "launcher/train.h"

/* RUN/ssd_rates.json: the SSD's rates in a past session's steps (launcher/diskrates.h). */
void fy_planact_ssd_rates_path(const struct fy_options *o, char *path, size_t len);
/* --ssd-rates auto: the plan takes the SSD's rates from the run directory's record of the last
 * session's steps on this store, where there is one, in place of `instead` (the profile's sample;
 * for `plan`, the machine profile's or the reference machine's); each way that the steps moved
 * nothing keeps the rate it had. Returns 1 where it took them, else 0. */
int fy_planact_ssd_rates(const struct fy_options *o, struct fy_plan_rates *rates,
                         const char *instead);
/* The plan for the blocks' internals: every mode profiles a block first on a backend that can
 * (not the Llama blocks); auto plans from the profile within the room the pool and the store
 * leave, the forced modes are placed as they are (and predicted from the profile once the
 * state's residency is planned, fy_actrun_predict). ckpt_slots: the checkpoints' pool slots on
 * their way to the store, 0 where they stay in the pool (fy_plan_regions). restarts: train's,
 * for a worker that fails in the profile; NULL: none. */
int fy_planact_make(const struct fy_options *o, const struct fy_gpt_config *model, int act_dtype,
                    int clip, unsigned ckpt_slots, const unsigned char *resident,
                    struct fy_restart *restarts, struct fy_gpt_profile *prof,
                    struct fy_actrun_in *in, struct fy_actrun *run);
/* The plan for people and tools: RUN/act_plan.json, replaced whole. */
int fy_planact_save(const struct fy_options *o, const struct fy_actrun *run,
                    const struct fy_actrun_in *in);

#endif
