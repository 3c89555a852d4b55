/* fuyou-launch plan: what a training run would do on this machine, without running it. For a
 * model, budgets and batch: where the optimizer state and the checkpoints live, what the shared
 * pool, the GPU arena and the SSD store take against their budgets, the bytes per step over PCIe
 * and the SSD, the predicted time per resource and the bound, tokens/s and TFLOP/s, the largest
 * batch and model that fit, and what to change to go faster. The rates are a machine profile's
 * (a JSON file) or the reference machine's. */
#ifndef FY_FORECAST_H
#define FY_FORECAST_H

#include <stdint.h>
#include <stdio.h>

#include "common/model/model.h"
#include "launcher/plan/plan.h"

struct fy_forecast_in {
    struct fy_model_config model;
    /* what the planner is given (plan.shape.c: &model; the batch, the options, the budgets and the
     * rates); plan.act_mode host and ssd swap every block's internals, as train's forced
     * placements do (their pool, slots, swap sets on the GPU, traffic and store extents), auto
     * and recompute are planned with the blocks recomputed */
    struct fy_plan_in plan;
    const char *ssd; /* the store's directories (comma list), for their free space; or NULL */
    const char *rates_from; /* where the rates come from, for the output */
};

/* Prints the plan, one "plan: ..." line each, to out. Returns 0 when it fits every budget, 1 when
 * it does not (said), or -errno. */
int fy_forecast_print(FILE *out, const struct fy_forecast_in *in);

#endif
