/* A model's config as every family shares it (model_config.h): the optimizer state formats' names
 * and the kinds of units. */
#include "common/model/model_config.h"

#include <errno.h>
#include <string.h>

static const char *const optim_state_names[FY_OPTIM_STATE_COUNT] = {"fp32", "bf16", "int8"};

const char *fy_optim_state_name(int format)
{
    return format >= 0 && format < FY_OPTIM_STATE_COUNT ? optim_state_names[format] : "unknown";
}

int fy_optim_state_parse(const char *name, int *out)
{
    for (int i = 0; i < FY_OPTIM_STATE_COUNT; i++)
        if (strcmp(name, optim_state_names[i]) == 0) {
            *out = i;
            return 0;
        }
    return -EINVAL;
}

unsigned fy_model_unit_count(const struct fy_model_config *c) { return c->n_layer + 2; }

enum fy_unit_kind fy_model_unit_kind(const struct fy_model_config *c, unsigned unit)
{
    return unit == 0 ? FY_UNIT_EMBED : unit <= c->n_layer ? FY_UNIT_BLOCK : FY_UNIT_FINAL;
}
