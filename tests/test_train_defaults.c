/* Tests of train's two sets of defaults (launcher/cli/options.h, fy_runconf_train_defaults):
 *   - a run whose model.conf says hf = 1 (init --from-hf) takes transformers' Trainer's values
 *     (lr 5e-5, no warmup, linear decay to 0, weight decay 0, betas 0.9/0.999, eps 1e-8, clipping
 *     1.0); one made by init takes the from-scratch values (lr 1e-3, warmup 10, cosine to lr x 0.1,
 *     weight decay 0.1, betas 0.9/0.95, eps 1e-8, clipping 1.0, as the Trainer, llm.c and nanoGPT);
 *   - every option given on the command line is kept whichever set applies, the last of a repeated
 *     one (resume appends its options to the saved command), and the others take the set's;
 *   - the line that says which set is in force names it, why, its values and the options given;
 *   - --gpu-mem on the CUDA backend, not given: the least free memory of the run's GPUs less the
 *     margin (a twentieth of the GPU's total, at least 1 GiB, at most half the free memory), said;
 *     given, 0 included, it keeps its value; the CPU backend's is left as it is, unsaid;
 *   - the linear schedule is transformers' get_linear_schedule_with_warmup after the warmup (the
 *     reference below is its lambda, written from its definition); cosine is as it was. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "common/base/config.h"
#include "launcher/cli/args.h"
#include "launcher/cli/options.h"
#include "launcher/cli/runconf.h"
#include "launcher/step/train.h"

#define MAX_ARGS 40

/* train's options parsed from `args` (NULL-terminated, after "train"), then the set of defaults of
 * a run imported (hf = 1 in its model.conf) or not resolved; the line said into said. */
static void parse_and_resolve(const char *const *args, int imported, struct fy_options *o,
                              char *said, size_t len)
{
    char *argv[MAX_ARGS] = {"train", "--run-dir", "RUN", "--data", "DATA"};
    int argc = 5;
    for (int i = 0; args != NULL && args[i] != NULL; i++)
        argv[argc++] = (char *)args[i];
    argv[argc] = NULL;
    optind = 0; /* getopt starts again */
    assert_int_equal(fy_args_parse(FY_CMD_TRAIN, argc, argv, o), 0);
    struct fy_config mc;
    fy_config_init(&mc);
    if (imported)
        assert_int_equal(fy_config_set(&mc, "hf", "1"), 0);
    fy_runconf_train_defaults(o, &mc, said, len);
}

static void assert_values(const struct fy_options *o, double lr, uint64_t warmup, int schedule,
                          double min_lr_ratio, double wd, double b1, double b2, double eps,
                          double clip)
{
    assert_true(o->lr == lr);
    assert_int_equal(o->warmup, warmup);
    assert_int_equal(o->lr_schedule, schedule);
    assert_true(o->min_lr_ratio == min_lr_ratio);
    assert_true(o->weight_decay == wd);
    assert_true(o->beta1 == b1);
    assert_true(o->beta2 == b2);
    assert_true(o->adam_eps == eps);
    assert_true(o->clip_grad_norm == clip);
}

static void test_scratch_set(void **state)
{
    (void)state;
    struct fy_options o;
    char said[1024];
    parse_and_resolve(NULL, 0, &o, said, sizeof said);
    assert_values(&o, 1e-3, 10, FY_LR_COSINE, 0.1, 0.1, 0.9, 0.95, 1e-8, 1.0);
    assert_string_equal(said, "from-scratch defaults (init made the model: RUN/model.conf has no "
                              "hf): lr 0.001, warmup 10, cosine decay to lr x 0.1, weight decay "
                              "0.1, betas 0.9/0.95, eps 1e-08, clipping 1.0 (as transformers' "
                              "Trainer, llm.c and nanoGPT clip; --clip-grad-norm 0 turns clipping "
                              "off); give any option to change its value");
}

static void test_finetune_set(void **state)
{
    (void)state;
    struct fy_options o;
    char said[1024];
    parse_and_resolve(NULL, 1, &o, said, sizeof said);
    assert_values(&o, 5e-5, 0, FY_LR_LINEAR, 0, 0, 0.9, 0.999, 1e-8, 1.0);
    assert_string_equal(said, "fine-tuning defaults (the model was imported from Hugging Face: "
                              "RUN/model.conf has hf = 1): lr 5e-05, no warmup, linear decay to 0, "
                              "weight decay 0, betas 0.9/0.999, eps 1e-08, clipping 1.0 "
                              "(transformers' Trainer's values; --clip-grad-norm 0 turns "
                              "clipping off); give any option to change its value");
}

/* An hf entry other than 1 is not an import (init writes hf = 1). */
static void test_hf_must_be_one(void **state)
{
    (void)state;
    struct fy_config mc;
    fy_config_init(&mc);
    assert_int_equal(fy_runconf_imported(&mc), 0);
    assert_int_equal(fy_config_set(&mc, "hf", "0"), 0);
    assert_int_equal(fy_runconf_imported(&mc), 0);
    assert_int_equal(fy_config_set(&mc, "hf", "1"), 0);
    assert_int_equal(fy_runconf_imported(&mc), 1);
}

/* Every option given is kept, on an imported run and on one made by init. */
static void test_given_options_kept(void **state)
{
    (void)state;
    const char *all[] = {"--lr", "2e-3", "--warmup", "7", "--lr-schedule", "cosine",
                         "--min-lr-ratio", "0.25", "--weight-decay", "0.05", "--adam-beta1", "0.8",
                         "--adam-beta2", "0.98", "--adam-eps", "1e-6", "--clip-grad-norm", "0",
                         NULL};
    struct fy_options o;
    char said[1024];
    parse_and_resolve(all, 1, &o, said, sizeof said);
    assert_values(&o, 2e-3, 7, FY_LR_COSINE, 0.25, 0.05, 0.8, 0.98, 1e-6, 0);
    assert_non_null(strstr(said, "; given: --lr, --warmup, --lr-schedule, --min-lr-ratio, "
                                 "--weight-decay, --adam-beta1, --adam-beta2, --adam-eps, "
                                 "--clip-grad-norm; give any option"));
    const char *scratch_all[] = {"--lr", "2e-3", "--warmup", "0", "--lr-schedule", "linear",
                                 "--min-lr-ratio", "0", "--weight-decay", "0", "--adam-beta1",
                                 "0.8", "--adam-beta2", "0.999", "--adam-eps", "1e-6",
                                 "--clip-grad-norm", "1", NULL};
    parse_and_resolve(scratch_all, 0, &o, said, sizeof said);
    assert_values(&o, 2e-3, 0, FY_LR_LINEAR, 0, 0, 0.8, 0.999, 1e-6, 1.0);
    /* one given: the rest are the set's */
    const char *lr_only[] = {"--lr", "1e-3", NULL};
    parse_and_resolve(lr_only, 1, &o, said, sizeof said);
    assert_values(&o, 1e-3, 0, FY_LR_LINEAR, 0, 0, 0.9, 0.999, 1e-8, 1.0);
    assert_non_null(strstr(said, "; given: --lr; give any option"));
    const char *clip_only[] = {"--clip-grad-norm", "0", NULL};
    parse_and_resolve(clip_only, 1, &o, said, sizeof said);
    assert_values(&o, 5e-5, 0, FY_LR_LINEAR, 0, 0, 0.9, 0.999, 1e-8, 0);
    /* resume: the saved command, then the options given to resume; the last one wins */
    const char *resumed[] = {"--lr", "1e-4", "--steps", "8", "--lr", "3e-4", NULL};
    parse_and_resolve(resumed, 1, &o, said, sizeof said);
    assert_values(&o, 3e-4, 0, FY_LR_LINEAR, 0, 0, 0.9, 0.999, 1e-8, 1.0);
}

/* Out-of-range values of the new options are refused at parsing. */
static void test_bad_values_refused(void **state)
{
    (void)state;
    const char *bad[][2] = {{"--adam-beta1", "1"},  {"--adam-beta2", "-0.1"},
                            {"--adam-beta2", "x"},  {"--adam-eps", "-1e-8"},
                            {"--adam-eps", "inf"},  {"--lr-schedule", "step"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *argv[] = {"train", (char *)bad[i][0], (char *)bad[i][1], NULL};
        struct fy_options o;
        optind = 0;
        assert_int_equal(fy_args_parse(FY_CMD_TRAIN, 3, argv, &o), -EINVAL);
    }
}

/* transformers' get_linear_schedule_with_warmup: the multiplier of the peak rate at optimizer step
 * s (0-based, the scheduler's count before the step). */
static double hf_linear_lambda(uint64_t s, uint64_t warmup, uint64_t total)
{
    if (s < warmup)
        return (double)s / (double)(warmup > 1 ? warmup : 1);
    double left = ((double)total - (double)s) / (double)(total - warmup > 1 ? total - warmup : 1);
    return left > 0 ? left : 0;
}

static void test_linear_schedule_is_trainers(void **state)
{
    (void)state;
    /* the fine-tuning set: step 1 takes the peak rate, then down by lr / N a step */
    struct fy_train_opts o = {.steps = 4, .lr = 5e-5, .warmup = 0, .min_lr_ratio = 0,
                              .schedule = FY_LR_LINEAR};
    const double want[4] = {5e-5, 3.75e-5, 2.5e-5, 1.25e-5};
    for (uint64_t k = 1; k <= 4; k++)
        assert_true(fabs(fy_train_lr(&o, k) - want[k - 1]) <= 1e-18);
    /* against the scheduler's lambda, with and without a floor, after a warmup (where ours and
     * Trainer's count from 1 and 0), and steps beyond --steps stay at the floor */
    const uint64_t totals[] = {1, 4, 37, 200}, warmups[] = {0, 3, 10};
    const double floors[] = {0, 0.1};
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 3; b++)
            for (size_t c = 0; c < 2; c++) {
                o = (struct fy_train_opts){.steps = totals[a], .lr = 1e-3, .warmup = warmups[b],
                                           .min_lr_ratio = floors[c], .schedule = FY_LR_LINEAR};
                if (o.steps <= o.warmup)
                    continue;
                for (uint64_t k = o.warmup + 1; k <= o.steps + 2; k++) {
                    double min = o.lr * o.min_lr_ratio;
                    double ref = min + (o.lr - min) * hf_linear_lambda(k - 1, o.warmup, o.steps);
                    if (fabs(fy_train_lr(&o, k) - ref) > 1e-15)
                        fail_msg("steps %llu warmup %llu floor %g: step %llu lr %.17g, Trainer's "
                                 "%.17g", (unsigned long long)o.steps,
                                 (unsigned long long)o.warmup, o.min_lr_ratio,
                                 (unsigned long long)k, fy_train_lr(&o, k), ref);
                }
                for (uint64_t k = 1; k <= o.warmup; k++) /* the warmup reaches lr at its last */
                    assert_true(fabs(fy_train_lr(&o, k) - o.lr * (double)k / (double)o.warmup) <=
                                1e-18);
            }
}

/* The from-scratch schedule (cosine) is the one train has always had. */
static void test_cosine_schedule(void **state)
{
    (void)state;
    const struct fy_train_opts o = {.steps = 110, .lr = 1e-3, .warmup = 10, .min_lr_ratio = 0.1};
    assert_true(fabs(fy_train_lr(&o, 5) - 5e-4) <= 1e-18);
    assert_true(fabs(fy_train_lr(&o, 10) - 1e-3) <= 1e-18);
    assert_true(fabs(fy_train_lr(&o, 60) - 5.5e-4) <= 1e-15); /* half way: the mean */
    assert_true(fabs(fy_train_lr(&o, 110) - 1e-4) <= 1e-18);
    assert_true(fabs(fy_train_lr(&o, 200) - 1e-4) <= 1e-18);
}

/* fy_runconf_gpu_mem for train's options `args` on `backend`, the GPUs' figures faked through
 * FUYOU_TEST_GPU_FREE (`gpus`: NULL unset); the budget returned, the line into said. */
static uint64_t gpu_mem_for(const char *const *args, const char *backend, const char *gpus,
                            char *said, size_t len)
{
    struct fy_options o;
    parse_and_resolve(args, 0, &o, said, len);
    o.backend = backend;
    if (gpus != NULL)
        assert_int_equal(setenv("FUYOU_TEST_GPU_FREE", gpus, 1), 0);
    else
        unsetenv("FUYOU_TEST_GPU_FREE");
    fy_runconf_gpu_mem(&o, said, len);
    unsetenv("FUYOU_TEST_GPU_FREE");
    return o.gpu_mem;
}

static void test_gpu_mem_default(void **state)
{
    (void)state;
    char said[1024];
    const uint64_t GiB = 1ull << 30;
    /* an 80 GiB GPU with 79 GiB free: a margin of 4 GiB (a twentieth) */
    assert_int_equal(gpu_mem_for(NULL, "cuda", "79G/80G", said, sizeof said), 75 * GiB);
    assert_string_equal(said, "--gpu-mem 75.0 GiB (the default: GPU 0's free memory 79.0 GiB of "
                              "80.0 GiB less a margin of 4.0 GiB for the CUDA context, cuBLAS and "
                              "NCCL outside the arena); --gpu-mem SIZE sets another, 0 an arena "
                              "sized to the working buffers alone");
    /* a 16 GiB GPU: the margin's least, 1 GiB; a GPU nearly full: at most half what is free */
    assert_int_equal(gpu_mem_for(NULL, "cuda", "10G/16G", said, sizeof said), 9 * GiB);
    assert_int_equal(gpu_mem_for(NULL, "cuda", "1G/80G", said, sizeof said), GiB / 2);
    assert_non_null(strstr(said, "less a margin of 512.0 MiB"));
    /* --gpus 3: the least free of the first three GPUs CUDA shows (the fourth is not the run's) */
    const char *three[] = {"--gpus", "3", "--batch", "6", NULL};
    assert_int_equal(
        gpu_mem_for(three, "cuda", "70G/80G,60G/80G,75G/80G,1G/80G", said, sizeof said), 56 * GiB);
    assert_non_null(strstr(said, "--gpu-mem 56.0 GiB (the default: GPU 1's, the least free of the "
                                 "3 the gpu workers take, free memory 60.0 GiB of 80.0 GiB less a "
                                 "margin of 4.0 GiB"));
    /* fewer GPUs than gpu workers: not known, the arena sized to the work */
    const char *two[] = {"--gpus", "2", NULL};
    assert_int_equal(gpu_mem_for(two, "cuda", "70G/80G", said, sizeof said), 0);
    assert_non_null(strstr(said, "--gpu-mem not given and the GPU's free memory not known "
                                 "(above): the GPU arena sized to the working buffers alone"));
    /* given, 0 too, it keeps its value whatever the GPU has */
    const char *given[] = {"--gpu-mem", "24G", NULL}, *zero[] = {"--gpu-mem", "0", NULL};
    assert_int_equal(gpu_mem_for(given, "cuda", "79G/80G", said, sizeof said), 24 * GiB);
    assert_string_equal(said, "--gpu-mem 24.0 GiB (given)");
    assert_int_equal(gpu_mem_for(zero, "cuda", "79G/80G", said, sizeof said), 0);
    assert_non_null(strstr(said, "--gpu-mem 0 (given): the GPU arena sized to the working buffers "
                                 "alone, no room beside them"));
    /* the CPU backend: nothing asked, nothing said */
    assert_int_equal(gpu_mem_for(NULL, "cpu", "79G/80G", said, sizeof said), 0);
    assert_string_equal(said, "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scratch_set),
        cmocka_unit_test(test_finetune_set),
        cmocka_unit_test(test_hf_must_be_one),
        cmocka_unit_test(test_given_options_kept),
        cmocka_unit_test(test_bad_values_refused),
        cmocka_unit_test(test_linear_schedule_is_trainers),
        cmocka_unit_test(test_cosine_schedule),
        cmocka_unit_test(test_gpu_mem_default),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
