/* fuyou-launch's options as every command reads them (launcher/cli/options.h): the training
 * values' two sets of defaults, and a required option's refusal. */
#include "launcher/cli/options.h"

#include <errno.h>
#include <stdio.h>

#include "common/base/check.h"
#include "launcher/step/trainopts.h"

/* ---- the training defaults ------------------------------------------------------------------ */

const struct fy_train_set fy_train_scratch = {.lr = 1e-3,
                                              .warmup = 10,
                                              .schedule = FY_LR_COSINE,
                                              .min_lr_ratio = 0.1,
                                              .weight_decay = 0.1,
                                              .beta1 = 0.9,
                                              .beta2 = 0.95,
                                              .eps = 1e-8,
                                              .clip_grad_norm = 1.0};

/* transformers' TrainingArguments' defaults: learning_rate, warmup_steps, lr_scheduler_type linear
 * (to 0), weight_decay, adam_beta1, adam_beta2, adam_epsilon, max_grad_norm */
const struct fy_train_set fy_train_finetune = {.lr = 5e-5,
                                               .warmup = 0,
                                               .schedule = FY_LR_LINEAR,
                                               .min_lr_ratio = 0,
                                               .weight_decay = 0,
                                               .beta1 = 0.9,
                                               .beta2 = 0.999,
                                               .eps = 1e-8,
                                               .clip_grad_norm = 1.0};

void fy_options_train_defaults(struct fy_options *o, int finetune)
{
    const struct fy_train_set *d = finetune ? &fy_train_finetune : &fy_train_scratch;
    if (!o->given.lr)
        o->lr = d->lr;
    if (!o->given.warmup)
        o->warmup = d->warmup;
    if (!o->given.schedule)
        o->lr_schedule = d->schedule;
    if (!o->given.min_lr_ratio)
        o->min_lr_ratio = d->min_lr_ratio;
    if (!o->given.weight_decay)
        o->weight_decay = d->weight_decay;
    if (!o->given.beta1)
        o->beta1 = d->beta1;
    if (!o->given.beta2)
        o->beta2 = d->beta2;
    if (!o->given.eps)
        o->adam_eps = d->eps;
    if (!o->given.clip)
        o->clip_grad_norm = d->clip_grad_norm;
}

void fy_options_describe_train_defaults(const struct fy_options *o, int finetune, const char *why,
                                        char *out, size_t len)
{
    const struct fy_train_set *d = finetune ? &fy_train_finetune : &fy_train_scratch;
    char warmup[48], decay[64], clip[160], given[160] = "";
    if (d->warmup == 0)
        snprintf(warmup, sizeof warmup, "no warmup");
    else
        snprintf(warmup, sizeof warmup, "warmup %llu", (unsigned long long)d->warmup);
    if (d->min_lr_ratio == 0)
        snprintf(decay, sizeof decay, "%s decay to 0", fy_train_lr_schedule_name(d->schedule));
    else
        snprintf(decay, sizeof decay, "%s decay to lr x %g", fy_train_lr_schedule_name(d->schedule),
                 d->min_lr_ratio);
    if (d->clip_grad_norm > 0)
        snprintf(clip, sizeof clip, "clipping %.1f (%s; --clip-grad-norm 0 turns clipping off)",
                 d->clip_grad_norm,
                 finetune ? "transformers' Trainer's values"
                          : "as transformers' Trainer, llm.c and nanoGPT clip");
    else
        snprintf(clip, sizeof clip, "no clipping");
    const struct {
        int given;
        const char *name;
    } opts[] = {{o->given.lr, "--lr"},
                {o->given.warmup, "--warmup"},
                {o->given.schedule, "--lr-schedule"},
                {o->given.min_lr_ratio, "--min-lr-ratio"},
                {o->given.weight_decay, "--weight-decay"},
                {o->given.beta1, "--adam-beta1"},
                {o->given.beta2, "--adam-beta2"},
                {o->given.eps, "--adam-eps"},
                {o->given.clip, "--clip-grad-norm"}};
    size_t at = 0;
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
        if (opts[i].given && at < sizeof given)
            at += (size_t)snprintf(given + at, sizeof given - at, "%s%s",
                                   at ? ", " : "; given: ", opts[i].name);
    snprintf(out, len,
             "%s defaults (%s): lr %g, %s, %s, weight decay %g, betas %g/%g, eps %g, "
             "%s%s; give any option to change its value",
             finetune ? "fine-tuning" : "from-scratch", why, d->lr, warmup, decay, d->weight_decay,
             d->beta1, d->beta2, d->eps, clip, given);
}

int fy_options_require(const char *value, const char *option, const char *command)
{
    if (value != NULL)
        return 0;
    fprintf(stderr, "fuyou-launch %s: %s is required (see fuyou-launch %s --help)\n", command,
            option, command);
    return -FY_EUSAGE;
}
