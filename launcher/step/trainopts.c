/* A training run's learning rate at each step: launcher/step/trainopts.h. */
#include "launcher/step/trainopts.h"

#include <errno.h>
#include <math.h>
#include <string.h>

double fy_train_lr(const struct fy_train_opts *o, uint64_t step)
{
    if (o->warmup > 0 && step <= o->warmup)
        return o->lr * (double)step / (double)o->warmup;
    double min_lr = o->lr * o->min_lr_ratio;
    if (o->steps <= o->warmup)
        return o->lr;
    double span = (double)(o->steps - o->warmup);
    if (o->schedule == FY_LR_LINEAR) { /* the steps after the warmup counted from 0, as Trainer's */
        double left = 1.0 - (double)(step - o->warmup - 1) / span;
        return min_lr + (o->lr - min_lr) * (left < 0.0 ? 0.0 : left);
    }
    double progress = (double)(step - o->warmup) / span;
    if (progress > 1.0)
        progress = 1.0;
    return min_lr + (o->lr - min_lr) * 0.5 * (1.0 + cos(3.141592653589793 * progress));
}

static const char *const lr_schedule_names[] = {
    [FY_LR_COSINE] = "cosine", [FY_LR_LINEAR] = "linear"};

const char *fy_train_lr_schedule_name(enum fy_lr_schedule s)
{
    return (unsigned)s < 2 ? lr_schedule_names[s] : "?";
}

int fy_train_lr_schedule_parse(const char *name, enum fy_lr_schedule *out)
{
    for (int i = 0; i < 2; i++)
        if (strcmp(name, lr_schedule_names[i]) == 0) {
            *out = (enum fy_lr_schedule)i;
            return 0;
        }
    return -EINVAL;
}
