/* The table of fuyou-launch's options (launcher/cli/optable.h): each with the commands that take it
 * (docs/configuration.md's "commands" column), its value's parser and its help. */
#include "launcher/cli/optable.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/arch/arch.h"
#include "common/model/actplan.h"
#include "common/base/check.h"
#include "common/base/config.h"
#include "common/base/dtype.h"
#include "common/base/log.h"
#include "common/formats/safetensors.h"
#include "common/data/sampler.h"
#include "gpu_worker/backend.h"
#include "launcher/plan/plan.h"
#include "launcher/step/trainopts.h"
#include "opt_worker/adamw.h"

#define C(cmd) (1u << FY_CMD_##cmd)
#define TRAINS (C(TRAIN) | C(RESUME))
#define WORKERS (C(INIT) | TRAINS | C(PROFILE) | C(EXPORT) | C(SELFTEST)) /* they start workers */
#define MODEL (C(INIT) | C(PLAN))
#define PLANS (TRAINS | C(PLAN) | C(PROFILE))
#define ALL ((1u << FY_CMD_COUNT) - 1)
/* The offset of field f of struct fy_options, which must be of type T (checked when compiled). */
#define TYPED(f, T)                                                                                \
    (offsetof(struct fy_options, f) +                                                              \
     0 * sizeof(struct {                                                                           \
         _Static_assert(_Generic(((struct fy_options *)0)->f, T : 1, default : 0),                 \
                        "struct fy_options." #f " is not " #T);                                    \
         int x;                                                                                    \
     }))
#define STR(f) TYPED(f, const char *)
#define INT(f) TYPED(f, int)
#define U64(f) TYPED(f, uint64_t)
#define DBL(f) TYPED(f, double)
#define NOTED(f) (TYPED(f, int) + 1) /* an int set to 1 where the option is given */

static int parse_size_opt(const char *name, const char *text, uint64_t *out)
{
    if (fy_parse_size(text, out) < 0) {
        fprintf(stderr,
                "fuyou-launch: %s '%s' is not a number or size (examples: 4096, 64K, 24G)\n", name,
                text);
        return -EINVAL;
    }
    return 0;
}

/* A count from lo to hi of `what` (--prefetch, --act-ahead, --grad-slots). */
static int parse_count_opt(const char *name, const char *text, uint64_t lo, uint64_t hi,
                           const char *what, uint64_t *out)
{
    FY_TRY(parse_size_opt(name, text, out));
    if (*out < lo || *out > hi) {
        fprintf(stderr, "fuyou-launch: %s %s: give %llu to %llu %s\n", name, text,
                (unsigned long long)lo, (unsigned long long)hi, what);
        return -EINVAL;
    }
    return 0;
}

static int parse_double_opt(const char *name, const char *text, double *out)
{
    char *end = NULL;
    *out = strtod(text, &end);
    if (end == text || *end != 0) {
        fprintf(stderr, "fuyou-launch: %s '%s' is not a number\n", name, text);
        return -EINVAL;
    }
    return 0;
}

/* --NAME V where V is one of names[0..n-1]: *out = its index; else said with the values, in
 * their order ("give a, b or c"). */
static int parse_choice(const char *name, const char *v, const char *const *names, int n, int *out)
{
    for (int i = 0; i < n; i++)
        if (strcmp(v, names[i]) == 0) {
            *out = i;
            return 0;
        }
    char give[160] = "";
    size_t at = 0;
    for (int i = 0; i < n && at < sizeof give; i++)
        at += (size_t)snprintf(give + at, sizeof give - at, "%s%s",
                               i == 0       ? ""
                               : i == n - 1 ? " or "
                                            : ", ",
                               names[i]);
    fprintf(stderr, "fuyou-launch: --%s %s: give %s\n", name, v, give);
    return -EINVAL;
}

static int parse_backend(struct fy_options *o, const char *v)
{
    static const char *const names[] = {"auto", "cpu", "cuda"};
    int i;
    o->backend = v;
    return parse_choice("backend", v, names, 3, &i);
}

static int parse_grad_dtype(struct fy_options *o, const char *v)
{
    if (strcmp(v, "bf16") != 0 && strcmp(v, "f32") != 0) {
        fprintf(stderr, "fuyou-launch: --grad-dtype must be bf16 or f32\n");
        return -EINVAL;
    }
    o->grad_dtype = v[0] == 'b' ? FY_DTYPE_BF16 : FY_DTYPE_F32;
    return 0;
}

static int parse_adamw_impl(struct fy_options *o, const char *v)
{
    enum fy_adamw_impl impl;
    o->adamw_impl = v;
    return fy_adamw_impl_parse(v, &impl); /* says what it takes */
}

static int parse_ready_timeout(struct fy_options *o, const char *v)
{
    uint64_t s;
    FY_TRY(parse_size_opt("--ready-timeout", v, &s));
    o->ready_timeout_s = (int)s;
    return 0;
}

static int parse_timeout(struct fy_options *o, const char *v)
{
    uint64_t s;
    FY_TRY(parse_size_opt("--timeout", v, &s));
    o->timeout_s = (int)s;
    o->timeout_set = 1;
    return 0;
}

static int parse_step_rates(struct fy_options *o, const char *v)
{
    static const char *const names[] = {"auto", "profile"};
    return parse_choice("step-rates", v, names, 2, &o->step_rates_profile);
}

static int parse_state_copies(struct fy_options *o, const char *v)
{
    FY_TRY(parse_size_opt("--state-copies", v, &o->state_copies));
    if (o->state_copies != 1 && o->state_copies != 2) {
        fprintf(stderr, "fuyou-launch: --state-copies is 1 or 2, not %s\n", v);
        return -EINVAL;
    }
    return 0;
}

static int parse_state_piece(struct fy_options *o, const char *v)
{
    FY_TRY(parse_size_opt("--state-piece", v, &o->state_piece));
    if (o->state_piece != 0 &&
        (o->state_piece < FY_MODEL_STATE_PIECE_MIN || o->state_piece % 1024 != 0)) {
        fprintf(stderr,
                "fuyou-launch: --state-piece %s: give 0 (whole units) or a multiple of 1K "
                "from %dK\n",
                v, FY_MODEL_STATE_PIECE_MIN / 1024);
        return -EINVAL;
    }
    return 0;
}

static int parse_clip(struct fy_options *o, const char *v)
{
    FY_TRY(parse_double_opt("--clip-grad-norm", v, &o->clip_grad_norm));
    if (!(isfinite(o->clip_grad_norm) && o->clip_grad_norm >= 0)) {
        fprintf(stderr,
                "fuyou-launch: --clip-grad-norm '%s' must be a finite number >= 0 "
                "(0: no clipping)\n",
                v);
        return -EINVAL;
    }
    return 0;
}

static int parse_clip_mode(struct fy_options *o, const char *v)
{
    static const char *const modes[] = {"auto", "one-pass", "two-pass"};
    return parse_choice("clip-mode", v, modes, 3, &o->clip_mode); /* FY_CLIP_AUTO, _ONE_PASS, ... */
}

static int parse_clip_hold(struct fy_options *o, const char *v)
{
    static const char *const places[] = {"auto", "pool", "gpu"};
    return parse_choice("clip-hold", v, places, 3, &o->clip_hold); /* FY_CLIP_HOLD_AUTO, ... */
}

static int parse_lr_schedule(struct fy_options *o, const char *v)
{
    enum fy_lr_schedule schedule;
    if (fy_train_lr_schedule_parse(v, &schedule) != 0) {
        fprintf(stderr, "fuyou-launch: --lr-schedule %s: give cosine or linear\n", v);
        return -EINVAL;
    }
    o->lr_schedule = (int)schedule;
    return 0;
}

/* --adam-beta1 and --adam-beta2: in [0, 1), as AdamW takes them. */
static int parse_beta(const char *name, const char *v, double *out)
{
    FY_TRY(parse_double_opt(name, v, out));
    if (!(*out >= 0.0 && *out < 1.0)) {
        fprintf(stderr, "fuyou-launch: %s '%s' must be in [0, 1)\n", name, v);
        return -EINVAL;
    }
    return 0;
}

static int parse_beta1(struct fy_options *o, const char *v)
{
    return parse_beta("--adam-beta1", v, &o->beta1);
}

static int parse_beta2(struct fy_options *o, const char *v)
{
    return parse_beta("--adam-beta2", v, &o->beta2);
}

static int parse_adam_eps(struct fy_options *o, const char *v)
{
    FY_TRY(parse_double_opt("--adam-eps", v, &o->adam_eps));
    if (!(isfinite(o->adam_eps) && o->adam_eps >= 0)) {
        fprintf(stderr, "fuyou-launch: --adam-eps '%s' must be a finite number >= 0\n", v);
        return -EINVAL;
    }
    return 0;
}

static int parse_prefetch(struct fy_options *o, const char *v)
{
    return parse_count_opt("--prefetch", v, 1, FY_PLAN_PREFETCH_MAX, "units", &o->prefetch);
}

/* --gpus N, or all: every GPU CUDA shows (CUDA_VISIBLE_DEVICES), at most FY_PLAN_RANKS_MAX; one
 * where it shows none. */
static int parse_gpus(struct fy_options *o, const char *v)
{
    if (strcmp(v, "all") != 0)
        return parse_count_opt("--gpus", v, 1, FY_PLAN_RANKS_MAX, "gpu workers (or all)", &o->gpus);
    int n = fy_backend_cuda_devices();
    o->gpus = n < 1 ? 1 : n > FY_PLAN_RANKS_MAX ? FY_PLAN_RANKS_MAX : (uint64_t)n;
    return 0;
}

static int parse_act_ahead(struct fy_options *o, const char *v)
{
    return parse_count_opt("--act-ahead", v, 1, FY_PLAN_ACT_AHEAD_MAX, "blocks", &o->act_ahead);
}

static int parse_grad_slots(struct fy_options *o, const char *v)
{
    return parse_count_opt("--grad-slots", v, FY_PLAN_GRAD_SLOTS_MIN, FY_PLAN_GRAD_SLOTS_MAX,
                           "block gradients", &o->grad_slots);
}

static int parse_block_inputs_place(struct fy_options *o, const char *v)
{
    static const char *const names[] = {[FY_BLOCK_INPUTS_HOST] = "host",
                                        [FY_BLOCK_INPUTS_SSD] = "ssd",
                                        [FY_BLOCK_INPUTS_AUTO] = "auto"};
    return parse_choice("ckpt-place", v, names, 3, &o->block_inputs_place);
}

static int parse_act_plan(struct fy_options *o, const char *v)
{
    enum fy_actplan_mode mode;
    o->act_plan = v;
    return fy_actplan_mode_parse(v, &mode);
}

static int parse_optim_state(struct fy_options *o, const char *v)
{
    if (fy_optim_state_parse(v, &o->optim_state) != 0) {
        fprintf(stderr, "fuyou-launch: --optim-state %s: give fp32, bf16 or int8\n", v);
        return -EINVAL;
    }
    return 0;
}

static int parse_weights_dtype(struct fy_options *o, const char *v)
{
    static const char *const names[] = {"auto", "f32", "bf16"};
    static const int dtypes[] = {0, FY_DTYPE_F32, FY_DTYPE_BF16};
    int i;
    FY_TRY(parse_choice("weights-dtype", v, names, 3, &i));
    o->weights_dtype = dtypes[i];
    return 0;
}

static int parse_steps(struct fy_options *o, const char *v)
{
    FY_TRY(parse_size_opt("--steps", v, &o->steps));
    o->steps_set = 1;
    o->epochs_last = 0;
    return 0;
}

static int parse_epochs(struct fy_options *o, const char *v)
{
    FY_TRY(parse_count_opt("--epochs", v, 1, 1000000, "epochs", &o->epochs));
    o->epochs_set = 1;
    o->epochs_last = 1;
    return 0;
}

static int parse_packing(struct fy_options *o, const char *v)
{
    static const char *const names[] = {"documents", "windows"};
    int i;
    FY_TRY(parse_choice("packing", v, names, 2, &i));
    o->packing = i == 0 ? FY_PACKING_DOCUMENTS : FY_PACKING_WINDOWS;
    return 0;
}

static int parse_long_docs(struct fy_options *o, const char *v)
{
    static const char *const names[] = {"truncate", "split"};
    int i;
    FY_TRY(parse_choice("long-docs", v, names, 2, &i));
    o->long_docs = i == 0 ? FY_LONG_DOCS_TRUNCATE : FY_LONG_DOCS_SPLIT;
    return 0;
}

static int parse_schedule(struct fy_options *o, const char *v)
{
    if (strcmp(v, "overlap") != 0 && strcmp(v, "serial") != 0) {
        fprintf(stderr, "fuyou-launch: --schedule must be overlap or serial\n");
        return -EINVAL;
    }
    o->overlap = v[0] == 'o';
    return 0;
}

static int parse_arch(struct fy_options *o, const char *v)
{
    o->arch = v;
    if (fy_arch_by_name(v) == NULL) {
        char names[128];
        fy_arch_names(names, sizeof names, 0);
        fy_error("--arch %s: expected one of %s", v, names);
        return -EINVAL;
    }
    return 0;
}

static int parse_hf_dtype(struct fy_options *o, const char *v)
{
    if (strcmp(v, "f32") != 0 && strcmp(v, "bf16") != 0) {
        fprintf(stderr, "fuyou-launch: --dtype must be f32 or bf16\n");
        return -EINVAL;
    }
    o->hf_dtype = v[0] == 'b' ? FY_ST_BF16 : FY_ST_F32;
    return 0;
}

static int parse_max_shard(struct fy_options *o, const char *v)
{
    FY_TRY(parse_size_opt("--max-shard-size", v, &o->max_shard_size));
    if (o->max_shard_size == 0) {
        fprintf(stderr, "fuyou-launch: --max-shard-size must be positive\n");
        return -EINVAL;
    }
    return 0;
}

/* In the order of docs/configuration.md's tables. A help ends with the default in parentheses. */
/* a table: its strings as written */
/* clang-format off */
const struct fy_optable_spec fy_optable[] = {
    /* the run and its storage */
    {"run-dir", "DIR", ALL & ~C(PREPARE), FY_OPT_STRING, STR(run_dir), 0, NULL,
     "the run directory: model.conf, fuyou.log, metrics.jsonl, the store in DIR/store (required)"},
    {"ssd", "DIR[,DIR...]", ALL & ~(C(PREPARE) | C(REPORT)), FY_OPT_STRING, STR(ssd), 0, NULL,
     "the store's directories, one per SSD, where they are not those init recorded in model.conf"},
    {"overwrite", NULL, C(INIT) | C(EXPORT) | C(PREPARE) | C(SELFTEST) | TRAINS, FY_OPT_SWITCH,
     INT(overwrite), 0, NULL, "replace what exists"},
    {"state-copies", "2|1", C(INIT) | C(PLAN), FY_OPT_PARSE, 0, 0, parse_state_copies,
     "copies of the optimizer state in the store: two keep the last commit whole whatever "
     "happens; one halves the space, and a run stopped between commits (a crash) leaves the "
     "store unusable (2)"},
    {"state-piece", "SIZE", C(INIT) | C(PLAN), FY_OPT_PARSE, 0, 0, parse_state_piece,
     "the most optimizer state one piece of a unit holds: a unit's state larger than this is cut "
     "into pieces, so that --cpu-mem below one unit's state still trains, its pieces streamed "
     "one at a time; 0 keeps every unit whole. init sets it; plan predicts with it (init's) (1G)"},
    {"optim-state", "fp32|bf16|int8", C(INIT) | C(PLAN) | TRAINS, FY_OPT_PARSE, 0, 0, parse_optim_state,
     "how the store keeps Adam's moments: fp32; bf16 (8 bytes of state a parameter instead of "
     "12); int8, block-wise 8-bit with f32 for tensors under 4096 values (about 6). init sets "
     "it; train and resume check it against the run's; plan predicts with it (init's, or fp32)"},
    {"stripe-unit", "SIZE", WORKERS, FY_OPT_SIZE, U64(stripe_unit), 0, NULL,
     "the stripe unit the store was created with: another is refused (1M)"},
    {"queue-depth", "N", WORKERS, FY_OPT_SIZE, U64(queue_depth), 0, NULL,
     "io_uring requests in flight on each of the io worker's rings (32)"},
    {"block-size", "SIZE", WORKERS, FY_OPT_SIZE, U64(block_size), 0, NULL,
     "the largest piece one io_uring request moves (1M)"},
    /* memory, devices and processes */
    {"cpu-mem", "SIZE", WORKERS | C(PLAN), FY_OPT_SIZE, U64(cpu_mem), NOTED(cpu_mem_set), NULL,
     "cap on the shared pool of pinned host memory; a pool that does not fit is refused "
     "(0: no cap)"},
    {"gpu-mem", "SIZE", PLANS | C(PROBE) | C(SELFTEST), FY_OPT_SIZE, U64(gpu_mem), NOTED(gpu_mem_set),
     NULL,
     "the GPU arena: working buffers, kept blocks' internals, swap sets (CUDA: the GPUs' free "
     "memory less a margin; 0: the working buffers alone)"},
    {"gpus", "all|N", PLANS, FY_OPT_PARSE, 0, 0, parse_gpus,
     "gpu workers, one per GPU, each computing B / N sequences of every step, their gradients "
     "summed in a fixed order; all: every GPU CUDA shows (1)"},
    {"backend", "auto|cpu|cuda", PLANS | C(PROBE) | C(SELFTEST), FY_OPT_PARSE, 0, 0, parse_backend,
     "the gpu worker's backend: auto is CUDA where a device is visible and the build has it, else "
     "the CPU reference (auto)"},
    {"affinity", "auto|SPEC", WORKERS, FY_OPT_STRING, STR(affinity), 0, NULL,
     "the workers' CPUs: auto places them with hwloc; SPEC such as gpu=0,io=1,opt=2-15 (auto)"},
    {"ready-timeout", "S", WORKERS, FY_OPT_PARSE, 0, 0, parse_ready_timeout,
     "seconds a worker may take to start (60)"},
    {"timeout", "S", WORKERS, FY_OPT_PARSE, 0, 0, parse_timeout,
     "a request not answered in S seconds is a stuck worker (300)"},
    {"inprocess", NULL, TRAINS, FY_OPT_SWITCH, INT(inprocess), 0, NULL,
     "the CPU backend inside the launcher, the store in memory (tests, debugging)"},
    /* the model */
    {"arch", "NAME", MODEL, FY_OPT_PARSE, 0, NOTED(model_set), parse_arch,
     "the model family: gpt2, llama, qwen2, qwen3, mistral or phi3 (gpt2)"},
    {"layers", "N", MODEL, FY_OPT_SIZE, U64(layers), NOTED(model_set), NULL, "transformer blocks (4)"},
    {"heads", "N", MODEL, FY_OPT_SIZE, U64(heads), NOTED(model_set), NULL, "attention heads (4)"},
    {"embd", "N", MODEL, FY_OPT_SIZE, U64(embd), NOTED(model_set), NULL,
     "model width, a multiple of --heads (128)"},
    {"vocab", "N", MODEL, FY_OPT_SIZE, U64(vocab), NOTED(model_set), NULL,
     "vocabulary size; 256: the byte tokenizer (256)"},
    {"ctx", "N", MODEL, FY_OPT_SIZE, U64(ctx), NOTED(model_set), NULL,
     "context length, the longest --seq (128)"},
    {"kv-heads", "N", MODEL, FY_OPT_SIZE, U64(kv_heads), NOTED(model_set), NULL,
     "llama-like: key/value heads, grouped-query attention (--heads)"},
    {"head-dim", "N", MODEL, FY_OPT_SIZE, U64(head_dim), NOTED(model_set), NULL,
     "llama-like: the head size (--embd / --heads)"},
    {"ffn", "N", MODEL, FY_OPT_SIZE, U64(ffn), NOTED(model_set), NULL,
     "llama-like: the SwiGLU MLP's inner width (4 x --embd)"},
    {"rope-theta", "X", MODEL, FY_OPT_NUMBER, DBL(rope_theta), NOTED(model_set), NULL,
     "llama-like: the rotary embeddings' base (10000)"},
    {"rms-eps", "X", MODEL, FY_OPT_NUMBER, DBL(rms_eps), NOTED(model_set), NULL,
     "llama-like: RMSNorm's epsilon (1e-5)"},
    {"tied", NULL, MODEL, FY_OPT_SWITCH, INT(tied), NOTED(model_set), NULL,
     "llama-like: the LM head shares the token embeddings (a separate lm_head)"},
    {"seed", "N", C(INIT) | TRAINS | C(SELFTEST), FY_OPT_SIZE, U64(seed), NOTED(seed_set), NULL,
     "the random seed (1)"},
    {"from-hf", "HF", MODEL, FY_OPT_STRING, STR(from_hf), 0, NULL,
     "a Hugging Face GPT2LMHeadModel or LlamaForCausalLM directory (config.json, safetensors or "
     "shards): the model"},
    /* training */
    {"data", "FILE", TRAINS, FY_OPT_STRING, STR(data), 0, NULL,
     "the token file (fuyou-launch prepare; required)"},
    {"steps", "N", TRAINS | C(SELFTEST), FY_OPT_PARSE, 0, 0, parse_steps,
     "train until this step, the total counting the steps already committed (200)"},
    {"epochs", "N", TRAINS, FY_OPT_PARSE, 0, 0, parse_epochs,
     "train N passes over the training documents instead of --steps: N x the steps an epoch "
     "takes, counting those already committed"},
    {"packing", "documents|windows", TRAINS, FY_OPT_PARSE, 0, 0, parse_packing,
     "documents: whole documents packed into rows, each alone; windows: random windows of the "
     "token stream (documents for a token file of records, windows for text files)"},
    {"long-docs", "truncate|split", TRAINS, FY_OPT_PARSE, 0, 0, parse_long_docs,
     "--packing documents: a document longer than --seq is cut to its first --seq predictions, "
     "or split into pieces of --seq (truncate)"},
    {"batch", "B", PLANS, FY_OPT_SIZE, U64(batch), 0, NULL, "sequences per step (8)"},
    {"seq", "T", PLANS, FY_OPT_SIZE, U64(seq), 0, NULL,
     "tokens per sequence, at most the model's context (64)"},
    {"lr", "X", TRAINS | C(SELFTEST), FY_OPT_NUMBER, DBL(lr), NOTED(given.lr), NULL,
     "peak learning rate (1e-3; an imported model's: 5e-5)"},
    {"warmup", "N", TRAINS, FY_OPT_SIZE, U64(warmup), NOTED(given.warmup), NULL,
     "linear warmup steps (10; an imported model's: 0)"},
    {"lr-schedule", "cosine|linear", TRAINS, FY_OPT_PARSE, 0, NOTED(given.schedule), parse_lr_schedule,
     "the decay after the warmup, to lr x --min-lr-ratio: cosine, reached at --steps; linear, "
     "transformers' (cosine; an imported model's: linear)"},
    {"min-lr-ratio", "X", TRAINS, FY_OPT_NUMBER, DBL(min_lr_ratio), NOTED(given.min_lr_ratio), NULL,
     "the decay's end: lr x X (0.1; an imported model's: 0)"},
    {"weight-decay", "X", TRAINS | C(SELFTEST), FY_OPT_NUMBER, DBL(weight_decay),
     NOTED(given.weight_decay), NULL,
     "AdamW's decoupled weight decay, matrices only (0.1; an imported model's: 0)"},
    {"adam-beta1", "X", TRAINS, FY_OPT_PARSE, 0, NOTED(given.beta1), parse_beta1,
     "AdamW's beta1, in [0, 1) (0.9)"},
    {"adam-beta2", "X", TRAINS, FY_OPT_PARSE, 0, NOTED(given.beta2), parse_beta2,
     "AdamW's beta2, in [0, 1) (0.95; an imported model's: 0.999)"},
    {"adam-eps", "X", TRAINS, FY_OPT_PARSE, 0, NOTED(given.eps), parse_adam_eps,
     "AdamW's epsilon (1e-8)"},
    {"clip-grad-norm", "MAX", PLANS, FY_OPT_PARSE, 0, NOTED(given.clip), parse_clip,
     "clip the global gradient norm to MAX, exactly as torch's clip_grad_norm_; 0: off (1)"},
    {"clip-mode", "auto|one-pass|two-pass", PLANS, FY_OPT_PARSE, 0, 0, parse_clip_mode,
     "how clipping learns the norm before the first update: one-pass holds every block's "
     "gradient in the pool through the backward and updates after it; two-pass runs the "
     "backward twice; auto: one-pass where the --cpu-mem given holds the gradients and the plan "
     "predicts it no slower (auto)"},
    {"clip-hold", "auto|pool|gpu", PLANS, FY_OPT_PARSE, 0, 0, parse_clip_hold,
     "where one-pass clipping holds the blocks' gradients: the pool (4 bytes a block parameter "
     "of --cpu-mem), or the GPU arena (of --gpu-mem; each sent to the pool when its update "
     "runs); auto: the pool where it has room beside the kept state, else the GPU where it has "
     "room (auto)"},
    {"eval-every", "N", TRAINS, FY_OPT_SIZE, U64(eval_every), 0, NULL,
     "held-out loss every N steps and at the end (50)"},
    {"eval-batches", "N", TRAINS, FY_OPT_SIZE, U64(eval_batches), NOTED(eval_batches_set), NULL,
     "held-out batches per evaluation (4; --packing documents: the whole held-out split)"},
    {"eval-fraction", "X", TRAINS, FY_OPT_NUMBER, DBL(eval_fraction), 0, NULL,
     "the share of the token file held out for evaluation, its end: of its tokens, or with "
     "--packing documents of its documents (0.1)"},
    {"checkpoint-every", "N", TRAINS, FY_OPT_SIZE, U64(checkpoint_every), 0, NULL,
     "commit the step to the store every N steps, at the end and at Ctrl-C: a crash goes back "
     "to the last commit (50)"},
    {"max-restarts", "N", TRAINS, FY_OPT_SIZE, U64(max_restarts), 0, NULL,
     "a worker that dies or stops answering is restarted from the last commit, up to N times an "
     "hour (5; 0: never)"},
    {"export", "FILE", TRAINS, FY_OPT_STRING, STR(export_path), 0, NULL,
     "after training, write the weights file (as export --out)"},
    {"schedule", "overlap|serial", TRAINS, FY_OPT_PARSE, 0, 0, parse_schedule,
     "overlap: the updates run beside the backward and weights are read ahead; serial: one "
     "request at a time, the same bits (overlap)"},
    {"prefetch", "N", PLANS, FY_OPT_PARSE, 0, 0, parse_prefetch,
     "units of weights read ahead of the gpu, 1 to 8, each a unit's fp32 weights of pool "
     "memory (1)"},
    {"grad-slots", "N", PLANS, FY_OPT_PARSE, 0, 0, parse_grad_slots,
     "block gradients held at once, 1 to 16, cut to what --cpu-mem holds: the optimizer may lag "
     "the backward by N - 1 blocks; more than 3 only when all optimizer state fits --cpu-mem, "
     "fewer only where it has no room for 3 (16)"},
    {"weights-dtype", "auto|f32|bf16", PLANS, FY_OPT_PARSE, 0, 0, parse_weights_dtype,
     "the weights the GPU is sent: bf16 keeps a bf16 copy beside each kept unit's state (2 bytes "
     "a parameter), half the PCIe bytes; auto: bf16 on CUDA (the same results), f32 on the CPU "
     "backend (auto)"},
    {"ckpt-place", "host|ssd|auto", TRAINS | C(PLAN), FY_OPT_PARSE, 0, 0, parse_block_inputs_place,
     "where the blocks' input checkpoints wait for the backward: the pool, or the SSD store "
     "through --act-ahead + 2 pool slots; auto: the pool when all optimizer state fits --cpu-mem "
     "beside them, else the SSD (host)"},
    {"act-plan", "auto|recompute|host|ssd", TRAINS | C(PLAN), FY_OPT_PARSE, 0, 0, parse_act_plan,
     "the blocks' forward internals: auto keeps those of as many blocks as fit --gpu-mem and "
     "picks the rest's place from a profile; recompute: every backward recomputes its forward; "
     "host, ssd: swapped to the pool, or through it to the SSD store (auto)"},
    {"step-rates", "auto|profile", PLANS, FY_OPT_PARSE, 0, 0, parse_step_rates,
     "the SSD's and AdamW's rates the plan predicts with: auto, those the last session's steps "
     "ran at (RUN/step_rates.json: the SSD's on this store, AdamW's with this --optim-state), "
     "else the profile's samples; profile: always the samples (auto)"},
    {"act-ahead", "N", PLANS, FY_OPT_PARSE, 0, 0, parse_act_ahead,
     "blocks whose activations on the SSD store the backward reads back ahead of use, 1 to 6; "
     "each kind passes through N + 2 pool slots (2)"},
    {"trace", "FILE", TRAINS, FY_OPT_STRING, STR(trace), 0, NULL,
     "a Chrome trace-event JSON of every request (open it in Perfetto)"},
    /* data preparation */
    {"out", "FILE", C(PREPARE) | C(EXPORT) | C(REPORT) | C(PROBE), FY_OPT_STRING, STR(out), 0, NULL,
     "the file to write"},
    {"compare", "DIR[,DIR...]", C(REPORT), FY_OPT_STRING, STR(compare), 0, NULL,
     "other runs' directories whose training and held-out loss loss.png draws beside this run's"},
    {"tokenizer", "HF", C(PREPARE), FY_OPT_STRING, STR(tokenizer), 0, NULL,
     "a Hugging Face tokenizer.json or its directory, through python3's tokenizers (byte level)"},
    {"jsonl", NULL, C(PREPARE), FY_OPT_SWITCH, INT(jsonl), 0, NULL,
     "the inputs are JSON lines, one object a line (a .parquet input is read as Parquet)"},
    {"text-field", "NAME", C(PREPARE), FY_OPT_STRING, STR(text_field), 0, NULL,
     "with --jsonl or Parquet: the field trained on whole (text)"},
    {"prompt-field", "NAME", C(PREPARE), FY_OPT_STRING, STR(prompt_field), 0, NULL,
     "with --jsonl or Parquet: the prompt, masked out of the loss"},
    {"response-field", "NAME", C(PREPARE), FY_OPT_STRING, STR(response_field), 0, NULL,
     "with --jsonl or Parquet: the response, trained on, then the end-of-sequence token"},
    {"messages-field", "NAME", C(PREPARE), FY_OPT_STRING, STR(messages_field), 0, NULL,
     "with --jsonl or Parquet, and --tokenizer: a conversation ([{role, content}, ...]) "
     "rendered with the model's chat template, the loss on the assistant's messages only"},
    /* export */
    {"to-hf", "HF", C(EXPORT), FY_OPT_STRING, STR(to_hf), 0, NULL,
     "write a Hugging Face model directory (safetensors, config.json, the imported tokenizer "
     "files)"},
    {"dtype", "f32|bf16", C(EXPORT), FY_OPT_PARSE, 0, NOTED(hf_opts_set), parse_hf_dtype,
     "--to-hf's tensors' dtype; F16 sources are written as F32 (the source's)"},
    {"max-shard-size", "SIZE", C(EXPORT), FY_OPT_PARSE, 0, NOTED(hf_opts_set), parse_max_shard,
     "shard --to-hf's safetensors above this many bytes, as transformers does (50000000000)"},
    /* the data-path self-test */
    {"params", "N", C(SELFTEST), FY_OPT_SIZE, U64(params), 0, NULL,
     "parameters of the synthetic model (1M)"},
    {"grad-dtype", "bf16|f32", C(SELFTEST), FY_OPT_PARSE, 0, 0, parse_grad_dtype,
     "the synthetic gradients' dtype (bf16)"},
    {"adamw-impl", "auto|scalar|avx2|avx512", TRAINS | C(PROFILE) | C(SELFTEST), FY_OPT_PARSE, 0, 0,
     parse_adamw_impl, "the opt worker's AdamW kernel; auto: the best the CPU has (auto)"},
    /* planning */
    {"machine", "FILE", C(PLAN), FY_OPT_STRING, STR(machine), 0, NULL,
     "a machine profile's rates, JSON (RUN/machine.json where probe wrote one, else the "
     "reference machine's)"},
    {"help", NULL, ALL, FY_OPT_SWITCH, 0, 0, NULL, "this text"},
};
/* clang-format on */

const size_t fy_optable_count = sizeof fy_optable / sizeof fy_optable[0];
_Static_assert(sizeof fy_optable / sizeof fy_optable[0] <= FY_OPTABLE_MAX,
               "more options than FY_OPTABLE_MAX");

/* An option whose help differs for some of its commands. */
struct opt_note {
    const char *name;
    unsigned commands;
    const char *help;
};

/* a table: its strings as written */
/* clang-format off */
static const struct opt_note notes[] = {
    {"run-dir", C(PLAN), "the run whose model, store and machine profile to plan for"},
    {"run-dir", C(PROBE), "write RUN/machine.json, and measure RUN/store where --ssd is not given"},
    {"run-dir", C(RESUME), "the run directory, where it is not given as DIR"},
    {"ssd", C(INIT),
     "the SSD store's directories, one per SSD; they must exist and take "
     "O_DIRECT; recorded in model.conf (DIR/store)"},
    {"ssd", C(SELFTEST), "the store's directories, one per SSD (required)"},
    {"ssd", C(PROBE), "the directories to measure, one per SSD (RUN/store)"},
    {"ssd", C(PLAN), "the store's directories, for their free space (the run's)"},
    {"overwrite", C(INIT),
     "replace the run's model and store: the new one is built beside them "
     "and put in place when complete"},
    {"overwrite", C(EXPORT),
     "replace the output file, or the model files of a non-empty --to-hf "
     "directory (the others are kept)"},
    {"overwrite", C(PREPARE), "replace the output file"},
    {"overwrite", C(SELFTEST), "replace a store in --ssd"},
    {"overwrite", TRAINS, "replace --export's file"},
    {"stripe-unit", C(INIT) | C(SELFTEST),
     "bytes on one SSD path before the next: a power of "
     "two, a multiple of 4K (1M)"},
    {"timeout", TRAINS,
     "a request not answered in S seconds is a stuck worker, killed and "
     "restarted (20 predicted steps, at least 60 s; 300 s unpredicted)"},
    {"seed", C(INIT), "the weights' initialisation (1)"},
    {"seed", TRAINS, "the order of the training batches (1)"},
    {"seed", C(SELFTEST), "the synthetic weights' and gradients' (1)"},
    {"lr", C(SELFTEST), "AdamW's learning rate (1e-3)"},
    {"weight-decay", C(SELFTEST), "AdamW's decoupled weight decay (0.1)"},
    {"steps", C(SELFTEST), "steps of the self-test (3)"},
    {"from-hf", C(PLAN), "the model of a Hugging Face directory's config.json"},
    {"out", C(PREPARE), "the token file to write (required)"},
    {"out", C(EXPORT), "the weights file (f32) to write"},
    {"out", C(REPORT), "the charts' directory (RUN/report)"},
    {"out", C(PROBE),
     "the machine profile to write (RUN/machine.json with --run-dir, else "
     "./machine.json)"},
    {"cpu-mem", PLANS,
     "cap on the shared pool of pinned host memory: as much optimizer state as "
     "fits stays in it, the rest streams from the store; a plan that does not "
     "fit is refused; 0: no cap and no state kept (what this machine can give: "
     "MemAvailable, or a cgroup's limit less its use where less, less a margin "
     "of a tenth, at least 2 GiB)"},
};
/* clang-format on */

const char *fy_optable_help(const struct fy_optable_spec *s, enum fy_command cmd)
{
    for (size_t i = 0; i < sizeof notes / sizeof notes[0]; i++)
        if (strcmp(notes[i].name, s->name) == 0 && (notes[i].commands & (1u << cmd)))
            return notes[i].help;
    return s->help;
}

void fy_optable_defaults(struct fy_options *o)
{
    *o = (struct fy_options){/* steps: selftest's; train's is 200 (fy_cmd_train) */
                             .backend = "auto",
                             .adamw_impl = "auto",
                             .params = 1 << 20,
                             .steps = 3,
                             .seed = 1,
                             .grad_dtype = FY_DTYPE_BF16,
                             .queue_depth = 32,
                             .block_size = 1 << 20,
                             .stripe_unit = 1 << 20,
                             .ready_timeout_s = 60,
                             .timeout_s = 300,
                             .layers = 4,
                             .heads = 4,
                             .embd = 128,
                             .vocab = 256,
                             .ctx = 128,
                             .batch = 8,
                             .seq = 64,
                             .eval_every = 50,
                             .eval_batches = 4,
                             .eval_fraction = 0.1,
                             .checkpoint_every = 50,
                             .overlap = 1,
                             .prefetch = 1,
                             .gpus = 1,
                             .act_ahead = FY_PLAN_ACT_AHEAD_DEFAULT,
                             .grad_slots = FY_PLAN_GRAD_SLOTS_MAX,
                             .max_shard_size = 50000000000ull,
                             .arch = "gpt2",
                             .rope_theta = 10000.0,
                             .rms_eps = 1e-5,
                             .act_plan = "auto",
                             .max_restarts = 5,
                             .state_copies = 2,
                             .optim_state = -1,
                             .state_piece = FY_MODEL_STATE_PIECE_DEFAULT};
    fy_options_train_defaults(o, 0); /* train and plan take the run's set (fy_runconf) */
}

int fy_optable_set(const struct fy_optable_spec *s, const char *value, struct fy_options *o)
{
    char *at = (char *)o + s->field, flag[64];
    snprintf(flag, sizeof flag, "--%s", s->name);
    int rc = 0;
    switch (s->kind) {
    case FY_OPT_STRING:
        *(const char **)at = value;
        break;
    case FY_OPT_SWITCH:
        *(int *)at = 1;
        break;
    case FY_OPT_SIZE:
        rc = parse_size_opt(flag, value, (uint64_t *)at);
        break;
    case FY_OPT_NUMBER:
        rc = parse_double_opt(flag, value, (double *)at);
        break;
    case FY_OPT_PARSE:
        rc = s->parse(o, value);
        break;
    }
    if (s->noted != 0)
        *(int *)((char *)o + s->noted - 1) = 1;
    return rc;
}
