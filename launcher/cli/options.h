/* fuyou-launch's commands and options: one struct that every command reads (launcher/cmd/cmd.h),
 * filled from the command line (launcher/cli/args.h) after the table of options
 * (launcher/cli/optable.h); the training values' two sets of defaults. The code that reads this
 * struct is launcher/cli/ and the commands (launcher/cmd/): the layers below take what they need
 * as their own structs (launcher/cli/runconf.h makes them). */
#ifndef FY_OPTIONS_H
#define FY_OPTIONS_H

#include <limits.h>
#include <stdint.h>
#include <stdio.h>

enum fy_command {
    FY_CMD_PREPARE,
    FY_CMD_INIT,
    FY_CMD_TRAIN,
    FY_CMD_RESUME, /* takes train's options */
    FY_CMD_PLAN,
    FY_CMD_PROBE,
    FY_CMD_PROFILE,
    FY_CMD_REPORT,
    FY_CMD_EXPORT,
    FY_CMD_SELFTEST,
    FY_CMD_COUNT
};

struct fy_options {
    const char *run_dir, *ssd, *affinity, *backend, *adamw_impl, *data, *out, *export_path, *trace;
    const char *from_hf, *to_hf;
    const char *machine; /* plan: a machine profile's rates (JSON) */
    const char *compare; /* report: other runs' directories, comma-separated */
    const char *tokenizer, *text_field, *prompt_field, *response_field; /* prepare */
    const char *messages_field;                                         /* prepare */
    int jsonl;                                                          /* prepare */
    int hf_dtype;            /* export --to-hf --dtype: 0 (as the source), FY_ST_F32, FY_ST_BF16 */
    uint64_t max_shard_size; /* export --to-hf: shard above this many bytes of tensors */
    uint64_t params, steps, seed, cpu_mem, gpu_mem, queue_depth, block_size, stripe_unit;
    uint64_t layers, heads, embd, vocab, ctx, batch, seq, warmup, eval_every, eval_batches;
    uint64_t checkpoint_every, prefetch, grad_slots, max_restarts, state_copies, act_ahead;
    uint64_t gpus; /* --gpus: gpu workers, each with B / gpus of every step */
    uint64_t
        state_piece; /* init --state-piece: bytes of optimizer state a piece (0: whole units) */
    int block_inputs_place; /* --ckpt-place: FY_BLOCK_INPUTS_* (launcher/plan/plan.h) */
    const char *act_plan; /* --act-plan: auto, recompute, host or ssd (train, plan) */
    int optim_state;      /* --optim-state: enum fy_optim_state, or -1 (not given) */
    int weights_dtype;    /* --weights-dtype: FY_DTYPE_F32, _BF16, or 0 (auto: the backend's) */
    double lr, weight_decay, min_lr_ratio, eval_fraction, clip_grad_norm;
    double beta1, beta2, adam_eps; /* AdamW's (--adam-beta1, --adam-beta2, --adam-eps) */
    int lr_schedule;               /* --lr-schedule: enum fy_lr_schedule (launcher/step/train.h) */
    int clip_mode;                 /* --clip-mode: FY_CLIP_AUTO, _ONE_PASS, _TWO_PASS (plan.h) */
    int clip_hold;                 /* --clip-hold: FY_CLIP_HOLD_AUTO, _POOL, _GPU (plan.h) */
    /* The training values given on the command line: those not given take the run's set of
     * defaults (fy_runconf_train_defaults: from scratch, or fine-tuning an imported model). */
    struct {
        int lr, warmup, min_lr_ratio, weight_decay, beta1, beta2, eps, clip, schedule;
    } given;
    int grad_dtype, overwrite, inprocess, ready_timeout_s, timeout_s, overlap;
    int seed_set, steps_set, model_set, hf_opts_set, timeout_set; /* given on the command line */
    int cpu_mem_set, gpu_mem_set;                                 /* ... */
    /* train: the batches (common/data/sampler.h): --packing (enum fy_packing; 0 not given: the data's
     * default), --long-docs (enum fy_long_docs), --epochs (epochs_set); of --steps and --epochs,
     * which the command line gave last (epochs_last), and whether it gave --eval-batches */
    int packing, long_docs, epochs_set, epochs_last, eval_batches_set;
    uint64_t epochs;
    /* init --arch llama */
    const char *arch;
    uint64_t kv_heads, ffn, head_dim; /* 0: --heads, 4 * --embd, --embd / --heads */
    double rope_theta, rms_eps;
    int tied;
    int step_rates_profile; /* --step-rates profile: plan from the profile's sample, not the record */
    char **args;           /* the arguments after the options (prepare's inputs) */
    int n_args;
    int store_in_run_dir;    /* init: the store is RUN/store (no --ssd) */
    char ssd_here[PATH_MAX]; /* the store's paths as found from model.conf (fy_runconf_load) */
    /* train and resume: the train command's arguments after "train" (resume: the run's recorded
     * command with resume's own options after it), and where they come from (enum
     * fy_train_args_from): a train's are kept for resume (launcher/cmd/trainargs.h) */
    int train_argc;
    char **train_argv;
    int train_args_from;
    int train_args_extended; /* resume with options of its own: recorded once it trains */
};

/* Where the arguments of a train command come from. */
enum fy_train_args_from {
    FY_TRAIN_ARGS_GIVEN,    /* train: its command line */
    FY_TRAIN_ARGS_RECORDED, /* resume: RUN/train.args, the last train command that trained */
    FY_TRAIN_ARGS_PENDING,  /* resume: RUN/train.args.pending, one stopped before its steps */
};

/* The training values a run takes where its command line does not give them: from scratch, for a
 * model made by init; fine-tuning, transformers' Trainer's, for a model imported from Hugging
 * Face (a small model's rate and warmup wreck a pretrained one in its first steps). */
struct fy_train_set {
    double lr;
    uint64_t warmup;
    int schedule; /* enum fy_lr_schedule */
    double min_lr_ratio, weight_decay, beta1, beta2, eps, clip_grad_norm;
};
extern const struct fy_train_set fy_train_scratch, fy_train_finetune;

/* Sets each training value that o->given says the command line did not give to the fine-tuning
 * set's (finetune) or the from-scratch set's. */
void fy_options_train_defaults(struct fy_options *o, int finetune);
/* The set in force, for the log: its name, `why` it applies, its values, the options given instead
 * of them (o->given), in one line into out. */
void fy_options_describe_train_defaults(const struct fy_options *o, int finetune, const char *why,
                                        char *out, size_t len);
/* 0 where value is given; else says that `command` requires `option`: -FY_EUSAGE (a usage
 * error). */
int fy_options_require(const char *value, const char *option, const char *command);

#endif
