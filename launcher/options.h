/* fuyou-launch's options: one struct that every command reads (launcher/cmd.h), the parser that
 * fills it from the command line, and the usage text. */
#ifndef FY_OPTIONS_H
#define FY_OPTIONS_H

#include <limits.h>
#include <stdint.h>
#include <stdio.h>

struct fy_options {
    const char *run_dir, *ssd, *affinity, *backend, *adamw_impl, *data, *out, *export_path, *trace;
    const char *from_hf, *to_hf;
    const char *machine; /* plan: a machine profile's rates (JSON) */
    const char *tokenizer, *text_field, *prompt_field, *response_field; /* prepare */
    int jsonl;                                                           /* prepare */
    int hf_dtype;            /* export --to-hf --dtype: 0 (as the source), FY_ST_F32, FY_ST_BF16 */
    uint64_t max_shard_size; /* export --to-hf: shard above this many bytes of tensors */
    uint64_t params, steps, seed, cpu_mem, gpu_mem, queue_depth, block_size, stripe_unit;
    uint64_t layers, heads, embd, vocab, ctx, batch, seq, warmup, eval_every, eval_batches;
    uint64_t checkpoint_every, prefetch, grad_slots, max_restarts, state_copies, act_ahead;
    int ckpt_place; /* FY_CKPT_HOST, FY_CKPT_SSD, FY_CKPT_AUTO */
    const char *act_plan; /* --act-plan: auto, recompute, host or ssd (train, profile, plan) */
    int weights_dtype;    /* --weights-dtype: FY_DTYPE_F32, _BF16, or 0 (auto: the backend's) */
    double lr, weight_decay, min_lr_ratio, eval_fraction, clip_grad_norm;
    int grad_dtype, overwrite, inprocess, ready_timeout_s, timeout_s, overlap;
    int seed_set, lr_set, wd_set, steps_set, model_set, hf_opts_set, timeout_set;
    /* init --arch llama */
    const char *arch;
    uint64_t kv_heads, ffn; /* 0: --heads, 4 * --embd */
    double rope_theta, rms_eps;
    int tied;
    int ssd_rates_profile; /* --ssd-rates profile: plan from the profile's sample, not the record */
    int store_in_run_dir;        /* init: the store is RUN/store (no --ssd) */
    char ssd_here[PATH_MAX];     /* the store's paths as found from model.conf (fy_runconf_load) */
    /* train: its arguments, kept in RUN/train.args for resume once the workers are up (NULL:
     * resumed, or kept already) */
    int train_argc;
    char **train_argv;
};

/* --ckpt-place (launcher/dryrun.h takes the same values) */
enum { FY_CKPT_HOST, FY_CKPT_SSD, FY_CKPT_AUTO };

/* Parses argv (argv[0] the command) into *o; positional arguments (prepare's inputs) are left at
 * argv[optind..]. A value out of range or an unknown option is said on stderr: -EINVAL. */
int fy_options_parse(int argc, char **argv, struct fy_options *o);
/* The usage text. */
void fy_options_usage(FILE *f);
/* Every option's name, one "--name" a line (fuyou-launch help --options). */
void fy_options_list(FILE *f);
/* 0 where value is given; else says that `command` requires `option`: -EINVAL. */
int fy_options_require(const char *value, const char *option, const char *command);

#endif
