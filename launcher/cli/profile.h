/* The profile for --act-plan auto (train, profile): a session of the workers over a small pool,
 * before the training session's pool is laid out for the plan. The gpu worker measures one block
 * on the training batch (gpt-profile; with --gpus N, on one worker's B / N sequences); the SSD
 * store's write and read rates through the io worker
 * and AdamW's on the opt worker are timed too. */
#ifndef FY_PROFILE_H
#define FY_PROFILE_H

#include "common/model.h"
#include "gpu_worker/backend.h"
#include "launcher/cli/options.h"
#include "launcher/run/supervise.h"
#include "launcher/plan/plan.h"

/* Fills *out (the block) and rates' ssd_read, ssd_write and opt_params (where timing the store
 * and AdamW fails, said, rates keeps what it had). *fault: the worker that failed, if any. */
int fy_profile_run(const struct fy_options *o, const struct fy_model_config *model, int act_dtype,
                   struct fy_block_profile *out, struct fy_plan_rates *rates,
                   struct fy_sup_fault *fault);

#endif
