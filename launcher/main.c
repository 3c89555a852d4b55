/* fuyou-launch: the run's owner. Subcommands prepare data, create a model in the SSD store, train it
 * through the gpu, io and opt worker processes, export its weights, and self-test the data path. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "common/actplan.h"
#include "common/check.h"
#include "common/ckpt.h"
#include "common/config.h"
#include "common/dtype.h"
#include "common/fsutil.h"
#include "common/hfgpt2.h"
#include "common/knobs.h"
#include "common/model.h"
#include "common/optstate.h"
#include "common/safetensors.h"
#include "common/tokfile.h"
#include "gpu_worker/backend.h"
#include "io_worker/store.h"
#include "launcher/actrun.h"
#include "launcher/commit.h"
#include "launcher/diskrates.h"
#include "launcher/dryrun.h"
#include "launcher/inproc.h"
#include "launcher/metrics.h"
#include "launcher/probe.h"
#include "launcher/progress.h"
#include "launcher/report.h"
#include "launcher/prepare.h"
#include "launcher/selftest.h"
#include "launcher/session.h"
#include "launcher/staging.h"
#include "launcher/supervise.h"
#include "launcher/train.h"
#include "opt_worker/adamw.h"

enum { EXIT_OK = 0, EXIT_ERROR = 1, EXIT_USAGE = 2, EXIT_WORKER = 3, EXIT_INTERRUPTED = 130 };

struct options {
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
    int ckpt_place; /* CKPT_HOST, CKPT_SSD, CKPT_AUTO */
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
    char ssd_here[PATH_MAX];     /* the store's paths as found from model.conf (load_model_conf) */
    /* train: its arguments, kept in RUN/train.args for resume once the workers are up (NULL:
     * resumed, or kept already) */
    int train_argc;
    char **train_argv;
};

enum { CKPT_HOST, CKPT_SSD, CKPT_AUTO };

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fuyou-launch COMMAND [options]\n"
            "\n"
            "commands:\n"
            "  prepare  --out FILE INPUT...         text or JSONL files -> token file\n"
            "  init     --run-dir DIR [model]       create a model in the run's SSD store\n"
            "  init     --run-dir DIR --from-hf HF  import a Hugging Face GPT-2 or Llama model\n"
            "  train    --run-dir DIR --data FILE   train it (continues from the store's commit)\n"
            "  resume   DIR [options]               continue a run's train command from its last\n"
            "                                       commit (after a crash, a stop or a reboot)\n"
            "  plan     [--run-dir DIR | model]     what train would do, without training:\n"
            "                                       placement, budgets, bytes and time per\n"
            "                                       step, the bound, the largest batch and\n"
            "                                       model, advice (--machine FILE: rates)\n"
            "  probe    --ssd DIRS [--out FILE]     measure this machine in under a minute\n"
            "                                       (device, SSD store, memory, AdamW) into\n"
            "                                       a machine profile (RUN/machine.json)\n"
            "  report   --run-dir DIR [--out DIR]   PNG charts of the run's metrics (loss,\n"
            "                                       busy time, throughput; gnuplot)\n"
            "  profile  --run-dir DIR               measure a block at --batch x --seq and show the\n"
            "                                       activation plan train's --act-plan auto takes\n"
            "  export   --run-dir DIR --out FILE    write the weights to a file\n"
            "  export   --run-dir DIR --to-hf HF    write a Hugging Face model directory (GPT-2, Llama)\n"
            "  selftest --run-dir DIR --ssd DIR     data path SSD -> pool -> gpu -> AdamW -> SSD\n"
            "  help [--options]                     this text (--options: every option's name;\n"
            "                                       docs/configuration.md describes each)\n"
            "\n"
            "prepare:       byte-level (vocab 256) unless --tokenizer HF (a directory with\n"
            "               tokenizer.json, or the file; needs python3 with tokenizers)\n"
            "               --jsonl: one JSON object per line, --text-field NAME (text) trained\n"
            "               on, or --prompt-field P --response-field R: the prompt masked out of\n"
            "               the loss, the response and the EOS trained --overwrite\n"
            "model (init):  --layers N (4) --heads N (4) --embd N (128) --vocab N (256) --ctx N (128)\n"
            "               --seed N (1) --ssd DIR[,DIR...] (default DIR/store) --overwrite\n"
            "               --state-copies 2|1 (2) copies of the optimizer state on the SSD: two\n"
            "               keep the last commit whole whatever happens; one halves the space,\n"
            "               and a run stopped between commits (a crash) leaves the store unusable\n"
            "               --arch gpt2|llama (gpt2); llama: --kv-heads N (--heads) --ffn N\n"
            "               (4 x --embd) --rope-theta X (10000) --rms-eps X (1e-5) --tied (the LM\n"
            "               head shares the token embeddings; default: a separate lm_head)\n"
            "               --from-hf HF: config.json and model.safetensors (or shards with\n"
            "               model.safetensors.index.json) of a GPT2LMHeadModel or a\n"
            "               LlamaForCausalLM; sets the model\n"
            "to-hf export:  --dtype f32|bf16 (default: the source's; F16 is written as F32)\n"
            "               --max-shard-size SIZE (50000000000, as transformers) --overwrite\n"
            "               (replace the model files of a non-empty directory, keep the others)\n"
            "train:         --steps N (total, 200) --batch B (8) --seq T (64) --lr X (1e-3)\n"
            "               --warmup N (10) --min-lr-ratio X (0.1) --weight-decay X (0.1) --seed N (1)\n"
            "               --eval-every N (50) --eval-batches N (4) --eval-fraction X (0.1)\n"
            "               --checkpoint-every N (50) commit the step to the store every N steps\n"
            "               (and at the end and at Ctrl-C): a crash goes back to the last commit\n"
            "               --max-restarts N (5) a worker that dies or stops answering is\n"
            "               restarted, from the last commit, up to N times an hour (0: never)\n"
            "               --timeout S: a request not answered in S seconds is a stuck worker\n"
            "               (default: 20 predicted steps, at least 60 s; 300 s unpredicted)\n"
            "               --export FILE --inprocess (one process, memory)\n"
            "               --schedule overlap|serial (overlap: updates run beside the backward)\n"
            "               --prefetch N (1) units of weights read ahead of the gpu (1..8; each\n"
            "               costs a unit's fp32 weights of pool memory)\n"
            "               --ckpt-place host|ssd|auto (host) where the blocks' input checkpoints\n"
            "               wait for the backward: the pool, or the SSD store through pool slots\n"
            "               (written in the forward, read back ahead of each backward pass);\n"
            "               auto: the pool when all optimizer state fits --cpu-mem beside them,\n"
            "               else the SSD, leaving their room to optimizer state\n"
            "               --act-plan auto|recompute|host|ssd (auto) the blocks' forward\n"
            "               internals: auto keeps those of as many blocks as fit --gpu-mem beside\n"
            "               the working buffers (the top blocks), so their backward recomputes\n"
            "               nothing; recompute: every block's backward recomputes its forward;\n"
            "               host: the forward copies the internals (QKV, attention, residual, MLP\n"
            "               up and GELU outputs) into the pool and the backward reads them back\n"
            "               instead; ssd: likewise through pool slots to the SSD store (GPT-2\n"
            "               models; the same results whichever plan)\n"
            "               --act-ahead N (2) blocks whose activations on the SSD store (internals,\n"
            "               checkpoints) the backward reads back ahead of use (1..6): each kind\n"
            "               passes through N + 2 pool slots\n"
            "               --ssd-rates auto|profile (auto) the SSD rates the plan predicts with:\n"
            "               auto: those the last session's steps ran at on this store\n"
            "               (RUN/ssd_rates.json, written at the end of each session), else the\n"
            "               profile's 256 MiB sample; profile: always the sample\n"
            "               --grad-slots N (16) block gradients held at once (3..16, each a block's\n"
            "               fp32 gradient of pool memory): the optimizer may lag the backward by\n"
            "               N - 1 blocks and finish while the next forward runs; used only when all\n"
            "               optimizer state fits in --cpu-mem, and cut to what fits\n"
            "               --weights-dtype auto|f32|bf16 (auto) the weights the GPU is sent:\n"
            "               bf16: a bf16 copy of each kept unit's weights (2 bytes a parameter,\n"
            "               rewritten by AdamW) beside its state is sent: half the PCIe bytes;\n"
            "               auto: bf16 on CUDA (it computes in bf16: the same results), f32 on\n"
            "               the CPU backend (bf16 there rounds the weights first, as CUDA does)\n"
            "               --trace FILE (Chrome trace-event JSON of every request; open in Perfetto)\n"
            "               --clip-grad-norm MAX (0: off) clip the global gradient norm to MAX (a\n"
            "               second backward pass per step computes the norm before any update)\n"
            "               Ctrl-C or SIGTERM: the step in progress finishes and is committed,\n"
            "               then the run stops (exit 130; fuyou-launch resume DIR continues); a\n"
            "               second one stops at once (the last commit stays)\n"
            "common:        --backend auto|cpu|cuda --cpu-mem SIZE --gpu-mem SIZE\n"
            "               --affinity auto|SPEC (e.g. gpu=0,io=1,opt=2-15) --queue-depth N (32)\n"
            "               --block-size SIZE (1M) --stripe-unit SIZE (1M) --ready-timeout S (60)\n"
            "               --timeout S (300; train: derived from the plan, see train)\n"
            "selftest:      --params N (1M) --steps N (3) --grad-dtype bf16|f32 --lr X\n"
            "               --weight-decay X --adamw-impl auto|scalar|avx2|avx512 --overwrite\n"
            "\n"
            "Exit status: 0 done, 1 error (the message says what and where), 2 usage, 3 a worker\n"
            "failed, 130 interrupted. Logs: DIR/fuyou.log; per-step metrics: DIR/metrics.jsonl.\n");
}

static int parse_size_opt(const char *name, const char *text, uint64_t *out)
{
    if (fy_parse_size(text, out) < 0) {
        fprintf(stderr, "fuyou-launch: %s '%s' is not a number or size (examples: 4096, 64K, 24G)\n",
                name, text);
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

enum {
    O_RUN = 256, O_SSD, O_OVERWRITE, O_CPU_MEM, O_GPU_MEM, O_BACKEND, O_AFFINITY, O_PARAMS, O_STEPS,
    O_SEED, O_GRAD_DTYPE, O_LR, O_WD, O_IMPL, O_QD, O_BLOCK, O_STRIPE, O_READY, O_TIMEOUT, O_DATA,
    O_OUT, O_EXPORT, O_LAYERS, O_HEADS, O_EMBD, O_VOCAB, O_CTX, O_BATCH, O_SEQ, O_WARMUP,
    O_MIN_LR, O_EVAL_EVERY, O_EVAL_BATCHES, O_EVAL_FRACTION, O_CKPT_EVERY, O_INPROC, O_SCHEDULE, O_TRACE,
    O_CLIP, O_PREFETCH, O_GRAD_SLOTS, O_CKPT_PLACE, O_ACT_PLAN, O_FROM_HF, O_TO_HF, O_DTYPE,
    O_MAX_SHARD, O_WEIGHTS_DTYPE, O_ACT_AHEAD,
    O_TOKENIZER, O_JSONL, O_TEXT_FIELD, O_PROMPT_FIELD, O_RESPONSE_FIELD,
    O_ARCH, O_KV_HEADS, O_FFN, O_ROPE_THETA, O_RMS_EPS, O_TIED, O_MAX_RESTARTS, O_STATE_COPIES,
    O_MACHINE, O_SSD_RATES
};

static const struct option longopts[] = {
    {"run-dir", required_argument, 0, O_RUN},        {"ssd", required_argument, 0, O_SSD},
    {"overwrite", no_argument, 0, O_OVERWRITE},      {"cpu-mem", required_argument, 0, O_CPU_MEM},
    {"gpu-mem", required_argument, 0, O_GPU_MEM},    {"backend", required_argument, 0, O_BACKEND},
    {"affinity", required_argument, 0, O_AFFINITY},  {"params", required_argument, 0, O_PARAMS},
    {"steps", required_argument, 0, O_STEPS},        {"seed", required_argument, 0, O_SEED},
    {"grad-dtype", required_argument, 0, O_GRAD_DTYPE}, {"lr", required_argument, 0, O_LR},
    {"weight-decay", required_argument, 0, O_WD},    {"adamw-impl", required_argument, 0, O_IMPL},
    {"queue-depth", required_argument, 0, O_QD},     {"block-size", required_argument, 0, O_BLOCK},
    {"stripe-unit", required_argument, 0, O_STRIPE}, {"ready-timeout", required_argument, 0, O_READY},
    {"timeout", required_argument, 0, O_TIMEOUT},    {"data", required_argument, 0, O_DATA},
    {"out", required_argument, 0, O_OUT},            {"export", required_argument, 0, O_EXPORT},
    {"layers", required_argument, 0, O_LAYERS},      {"heads", required_argument, 0, O_HEADS},
    {"embd", required_argument, 0, O_EMBD},          {"vocab", required_argument, 0, O_VOCAB},
    {"ctx", required_argument, 0, O_CTX},            {"batch", required_argument, 0, O_BATCH},
    {"seq", required_argument, 0, O_SEQ},            {"warmup", required_argument, 0, O_WARMUP},
    {"min-lr-ratio", required_argument, 0, O_MIN_LR},
    {"eval-every", required_argument, 0, O_EVAL_EVERY},
    {"eval-batches", required_argument, 0, O_EVAL_BATCHES},
    {"eval-fraction", required_argument, 0, O_EVAL_FRACTION},
    {"checkpoint-every", required_argument, 0, O_CKPT_EVERY},
    {"inprocess", no_argument, 0, O_INPROC},         {"schedule", required_argument, 0, O_SCHEDULE},
    {"trace", required_argument, 0, O_TRACE},
    {"clip-grad-norm", required_argument, 0, O_CLIP},
    {"prefetch", required_argument, 0, O_PREFETCH},
    {"act-ahead", required_argument, 0, O_ACT_AHEAD},
    {"grad-slots", required_argument, 0, O_GRAD_SLOTS},
    {"weights-dtype", required_argument, 0, O_WEIGHTS_DTYPE},
    {"ckpt-place", required_argument, 0, O_CKPT_PLACE},
    {"act-plan", required_argument, 0, O_ACT_PLAN},
    {"from-hf", required_argument, 0, O_FROM_HF},    {"to-hf", required_argument, 0, O_TO_HF},
    {"dtype", required_argument, 0, O_DTYPE},
    {"max-shard-size", required_argument, 0, O_MAX_SHARD},
    {"tokenizer", required_argument, 0, O_TOKENIZER}, {"jsonl", no_argument, 0, O_JSONL},
    {"text-field", required_argument, 0, O_TEXT_FIELD},
    {"prompt-field", required_argument, 0, O_PROMPT_FIELD},
    {"response-field", required_argument, 0, O_RESPONSE_FIELD},
    {"arch", required_argument, 0, O_ARCH},          {"kv-heads", required_argument, 0, O_KV_HEADS},
    {"ffn", required_argument, 0, O_FFN},            {"rope-theta", required_argument, 0, O_ROPE_THETA},
    {"rms-eps", required_argument, 0, O_RMS_EPS},    {"tied", no_argument, 0, O_TIED},
    {"max-restarts", required_argument, 0, O_MAX_RESTARTS},
    {"state-copies", required_argument, 0, O_STATE_COPIES},
    {"machine", required_argument, 0, O_MACHINE},
    {"ssd-rates", required_argument, 0, O_SSD_RATES},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

/* Parses options; positional arguments (prepare's inputs) are left at argv[optind..]. */
static int parse_options(int argc, char **argv, struct options *o)
{
    *o = (struct options){.backend = "auto", .adamw_impl = "auto", .params = 1 << 20, .steps = 3,
                          .seed = 1, .grad_dtype = FY_DTYPE_BF16, .lr = 1e-3, .weight_decay = 0.1,
                          .queue_depth = 32, .block_size = 1 << 20, .stripe_unit = 1 << 20,
                          .ready_timeout_s = 60, .timeout_s = 300, .layers = 4, .heads = 4,
                          .embd = 128, .vocab = 256, .ctx = 128, .batch = 8, .seq = 64,
                          .warmup = 10, .min_lr_ratio = 0.1, .eval_every = 50, .eval_batches = 4,
                          .eval_fraction = 0.1, .checkpoint_every = 50, .overlap = 1,
                          .prefetch = 1, .act_ahead = FY_TRAIN_ACT_AHEAD_DEFAULT, .grad_slots = FY_TRAIN_GRAD_SLOTS_MAX, .max_shard_size = 50000000000ull,
                          .arch = "gpt2", .rope_theta = 10000.0, .rms_eps = 1e-5,
                          .act_plan = "auto", .max_restarts = 5, .state_copies = 2};
    int c, rc = 0;
    uint64_t v;
    opterr = 0;
    while (rc == 0 && (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case O_RUN: o->run_dir = optarg; break;
        case O_SSD: o->ssd = optarg; break;
        case O_OVERWRITE: o->overwrite = 1; break;
        case O_CPU_MEM: rc = parse_size_opt("--cpu-mem", optarg, &o->cpu_mem); break;
        case O_GPU_MEM: rc = parse_size_opt("--gpu-mem", optarg, &o->gpu_mem); break;
        case O_BACKEND:
            o->backend = optarg;
            if (strcmp(optarg, "auto") != 0 && strcmp(optarg, "cpu") != 0 &&
                strcmp(optarg, "cuda") != 0) {
                fprintf(stderr, "fuyou-launch: --backend %s: give auto, cpu or cuda\n", optarg);
                rc = -EINVAL;
            }
            break;
        case O_AFFINITY: o->affinity = optarg; break;
        case O_PARAMS: rc = parse_size_opt("--params", optarg, &o->params); break;
        case O_STEPS: rc = parse_size_opt("--steps", optarg, &o->steps); o->steps_set = 1; break;
        case O_SEED: rc = parse_size_opt("--seed", optarg, &o->seed); o->seed_set = 1; break;
        case O_GRAD_DTYPE:
            if (strcmp(optarg, "bf16") == 0 || strcmp(optarg, "f32") == 0)
                o->grad_dtype = optarg[0] == 'b' ? FY_DTYPE_BF16 : FY_DTYPE_F32;
            else {
                fprintf(stderr, "fuyou-launch: --grad-dtype must be bf16 or f32\n");
                rc = -EINVAL;
            }
            break;
        case O_LR: rc = parse_double_opt("--lr", optarg, &o->lr); o->lr_set = 1; break;
        case O_WD: rc = parse_double_opt("--weight-decay", optarg, &o->weight_decay); o->wd_set = 1; break;
        case O_IMPL: {
            enum fy_adamw_impl impl;
            o->adamw_impl = optarg;
            rc = fy_adamw_impl_parse(optarg, &impl); /* says what it takes */
            break;
        }
        case O_QD: rc = parse_size_opt("--queue-depth", optarg, &o->queue_depth); break;
        case O_BLOCK: rc = parse_size_opt("--block-size", optarg, &o->block_size); break;
        case O_STRIPE: rc = parse_size_opt("--stripe-unit", optarg, &o->stripe_unit); break;
        case O_READY: rc = parse_size_opt("--ready-timeout", optarg, &v); o->ready_timeout_s = (int)v; break;
        case O_TIMEOUT:
            rc = parse_size_opt("--timeout", optarg, &v);
            o->timeout_s = (int)v;
            o->timeout_set = 1;
            break;
        case O_MAX_RESTARTS: rc = parse_size_opt("--max-restarts", optarg, &o->max_restarts); break;
        case O_MACHINE: o->machine = optarg; break;
        case O_SSD_RATES:
            if (strcmp(optarg, "auto") == 0 || strcmp(optarg, "profile") == 0) {
                o->ssd_rates_profile = optarg[0] == 'p';
            } else {
                fprintf(stderr, "fuyou-launch: --ssd-rates %s: give auto or profile\n", optarg);
                rc = -EINVAL;
            }
            break;
        case O_STATE_COPIES:
            rc = parse_size_opt("--state-copies", optarg, &o->state_copies);
            if (rc == 0 && o->state_copies != 1 && o->state_copies != 2) {
                fprintf(stderr, "fuyou-launch: --state-copies is 1 or 2, not %s\n", optarg);
                rc = -EINVAL;
            }
            break;
        case O_DATA: o->data = optarg; break;
        case O_OUT: o->out = optarg; break;
        case O_EXPORT: o->export_path = optarg; break;
        case O_LAYERS: rc = parse_size_opt("--layers", optarg, &o->layers); o->model_set = 1; break;
        case O_HEADS: rc = parse_size_opt("--heads", optarg, &o->heads); o->model_set = 1; break;
        case O_EMBD: rc = parse_size_opt("--embd", optarg, &o->embd); o->model_set = 1; break;
        case O_VOCAB: rc = parse_size_opt("--vocab", optarg, &o->vocab); o->model_set = 1; break;
        case O_CTX: rc = parse_size_opt("--ctx", optarg, &o->ctx); o->model_set = 1; break;
        case O_BATCH: rc = parse_size_opt("--batch", optarg, &o->batch); break;
        case O_SEQ: rc = parse_size_opt("--seq", optarg, &o->seq); break;
        case O_WARMUP: rc = parse_size_opt("--warmup", optarg, &o->warmup); break;
        case O_MIN_LR: rc = parse_double_opt("--min-lr-ratio", optarg, &o->min_lr_ratio); break;
        case O_EVAL_EVERY: rc = parse_size_opt("--eval-every", optarg, &o->eval_every); break;
        case O_EVAL_BATCHES: rc = parse_size_opt("--eval-batches", optarg, &o->eval_batches); break;
        case O_EVAL_FRACTION: rc = parse_double_opt("--eval-fraction", optarg, &o->eval_fraction); break;
        case O_CKPT_EVERY: rc = parse_size_opt("--checkpoint-every", optarg, &o->checkpoint_every); break;
        case O_INPROC: o->inprocess = 1; break;
        case O_TRACE: o->trace = optarg; break;
        case O_CLIP:
            rc = parse_double_opt("--clip-grad-norm", optarg, &o->clip_grad_norm);
            if (rc == 0 && !(isfinite(o->clip_grad_norm) && o->clip_grad_norm >= 0)) {
                fprintf(stderr, "fuyou-launch: --clip-grad-norm '%s' must be a finite number >= 0 "
                                "(0: no clipping)\n", optarg);
                rc = -EINVAL;
            }
            break;
        case O_PREFETCH:
            rc = parse_count_opt("--prefetch", optarg, 1, FY_TRAIN_PREFETCH_MAX, "units",
                                 &o->prefetch);
            break;
        case O_ACT_AHEAD:
            rc = parse_count_opt("--act-ahead", optarg, 1, FY_TRAIN_ACT_AHEAD_MAX, "blocks",
                                 &o->act_ahead);
            break;
        case O_CKPT_PLACE:
            if (strcmp(optarg, "host") == 0) {
                o->ckpt_place = CKPT_HOST;
            } else if (strcmp(optarg, "ssd") == 0) {
                o->ckpt_place = CKPT_SSD;
            } else if (strcmp(optarg, "auto") == 0) {
                o->ckpt_place = CKPT_AUTO;
            } else {
                fprintf(stderr, "fuyou-launch: --ckpt-place %s: give host, ssd or auto\n", optarg);
                rc = -EINVAL;
            }
            break;
        case O_ACT_PLAN: {
            enum fy_actplan_mode mode;
            o->act_plan = optarg;
            rc = fy_actplan_mode_parse(optarg, &mode);
            break;
        }
        case O_GRAD_SLOTS:
            rc = parse_count_opt("--grad-slots", optarg, FY_TRAIN_GRAD_SLOTS_MIN,
                                 FY_TRAIN_GRAD_SLOTS_MAX, "block gradients", &o->grad_slots);
            break;
        case O_WEIGHTS_DTYPE:
            if (strcmp(optarg, "auto") == 0 || strcmp(optarg, "f32") == 0 ||
                strcmp(optarg, "bf16") == 0) {
                o->weights_dtype = optarg[0] == 'a' ? 0 : optarg[0] == 'f' ? FY_DTYPE_F32
                                                                            : FY_DTYPE_BF16;
            } else {
                fprintf(stderr, "fuyou-launch: --weights-dtype %s: give auto, f32 or bf16\n",
                        optarg);
                rc = -EINVAL;
            }
            break;
        case O_SCHEDULE:
            if (strcmp(optarg, "overlap") == 0 || strcmp(optarg, "serial") == 0)
                o->overlap = optarg[0] == 'o';
            else {
                fprintf(stderr, "fuyou-launch: --schedule must be overlap or serial\n");
                rc = -EINVAL;
            }
            break;
        case O_FROM_HF: o->from_hf = optarg; break;
        case O_ARCH:
            o->arch = optarg;
            o->model_set = 1;
            if (strcmp(optarg, "gpt2") != 0 && strcmp(optarg, "llama") != 0) {
                fy_error("--arch %s: expected gpt2 or llama", optarg);
                rc = -EINVAL;
            }
            break;
        case O_KV_HEADS: rc = parse_size_opt("--kv-heads", optarg, &o->kv_heads); o->model_set = 1; break;
        case O_FFN: rc = parse_size_opt("--ffn", optarg, &o->ffn); o->model_set = 1; break;
        case O_ROPE_THETA: rc = parse_double_opt("--rope-theta", optarg, &o->rope_theta); o->model_set = 1; break;
        case O_RMS_EPS: rc = parse_double_opt("--rms-eps", optarg, &o->rms_eps); o->model_set = 1; break;
        case O_TIED: o->tied = 1; o->model_set = 1; break;
        case O_TO_HF: o->to_hf = optarg; break;
        case O_DTYPE:
            o->hf_opts_set = 1;
            if (strcmp(optarg, "f32") == 0 || strcmp(optarg, "bf16") == 0)
                o->hf_dtype = optarg[0] == 'b' ? FY_ST_BF16 : FY_ST_F32;
            else {
                fprintf(stderr, "fuyou-launch: --dtype must be f32 or bf16\n");
                rc = -EINVAL;
            }
            break;
        case O_MAX_SHARD:
            o->hf_opts_set = 1;
            rc = parse_size_opt("--max-shard-size", optarg, &o->max_shard_size);
            if (rc == 0 && o->max_shard_size == 0) {
                fprintf(stderr, "fuyou-launch: --max-shard-size must be positive\n");
                rc = -EINVAL;
            }
            break;
        case O_TOKENIZER: o->tokenizer = optarg; break;
        case O_JSONL: o->jsonl = 1; break;
        case O_TEXT_FIELD: o->text_field = optarg; break;
        case O_PROMPT_FIELD: o->prompt_field = optarg; break;
        case O_RESPONSE_FIELD: o->response_field = optarg; break;
        case 'h': usage(stdout); exit(EXIT_OK);
        default:
            fprintf(stderr, "fuyou-launch: unknown or incomplete option '%s' (see fuyou-launch help)\n",
                    argv[optind - 1]);
            rc = -EINVAL;
        }
    }
    if (rc == 0 && (o->ready_timeout_s <= 0 || o->timeout_s <= 0)) {
        fprintf(stderr, "fuyou-launch: timeouts must be positive\n");
        rc = -EINVAL;
    }
    return rc;
}

static int require(const char *value, const char *option, const char *command)
{
    if (value != NULL)
        return 0;
    fprintf(stderr, "fuyou-launch %s: %s is required (see fuyou-launch help)\n", command, option);
    return -EINVAL;
}

static struct fy_session_opts session_opts(const struct options *o)
{
    /* train and profile have resolved the backend; the other commands leave "auto" as it is (no
     * CUDA call in the launcher), which is the CPU backend where CUDA is not built */
    int cpu_backend = strcmp(o->backend, "cpu") == 0 ||
                      (strcmp(o->backend, "auto") == 0 && !fy_backend_cuda_built());
    return (struct fy_session_opts){.run_dir = o->run_dir, .affinity = o->affinity,
                                    .ssd = o->ssd, .cpu_mem = o->cpu_mem,
                                    .cpu_backend = cpu_backend,
                                    .ready_timeout_ms = o->ready_timeout_s * 1000};
}

/* Entries every worker reads: the store, the backend, AdamW settings. */
static int base_config(const struct options *o, struct fy_config *c, int create_store)
{
    fy_config_init(c);
    FY_TRY(fy_config_set(c, "ssd", o->ssd));
    FY_TRY(fy_config_setf(c, "store_create", "%d", create_store));
    FY_TRY(fy_config_setf(c, "store_overwrite", "%d", o->overwrite));
    FY_TRY(fy_config_setf(c, "stripe_unit", "%llu", (unsigned long long)o->stripe_unit));
    FY_TRY(fy_config_setf(c, "queue_depth", "%llu", (unsigned long long)o->queue_depth));
    FY_TRY(fy_config_setf(c, "block_size", "%llu", (unsigned long long)o->block_size));
    FY_TRY(fy_config_setf(c, "io_timeout_ms", "%d", o->timeout_s * 1000));
    FY_TRY(fy_config_set(c, "backend", o->backend));
    FY_TRY(fy_config_setf(c, "gpu_mem", "%llu", (unsigned long long)o->gpu_mem));
    FY_TRY(fy_config_set(c, "adamw_impl", o->adamw_impl));
    FY_TRY(fy_config_setf(c, "lr", "%.9g", o->lr));
    FY_TRY(fy_config_setf(c, "weight_decay", "%.9g", o->weight_decay));
    FY_TRY(fy_config_set(c, "beta1", "0.9"));
    FY_TRY(fy_config_set(c, "beta2", "0.95"));
    FY_TRY(fy_config_set(c, "eps", "1e-8"));
    return 0;
}

/* Every --ssd directory must exist before any worker starts, so a typo costs one clear line. */
static int check_ssd_paths(const char *list)
{
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", list);
    for (char *save = NULL, *p = strtok_r(copy, ",", &save); p != NULL; p = strtok_r(NULL, ",", &save)) {
        struct stat st;
        if (stat(p, &st) != 0) {
            int e = errno;
            fy_error("ssd path %s: %s: create it, or pass the --ssd directories of this run's store",
                     p, strerror(e));
            return -e;
        }
        FY_REQUIRE(S_ISDIR(st.st_mode), -ENOTDIR, "ssd path %s is not a directory", p);
    }
    return 0;
}

static int cmd_selftest(struct options *o)
{
    FY_TRY(require(o->run_dir, "--run-dir", "selftest"));
    FY_TRY(require(o->ssd, "--ssd", "selftest"));
    FY_TRY(check_ssd_paths(o->ssd));
    FY_REQUIRE(o->params > 0 && o->steps > 0, -EINVAL, "--params and --steps must be positive");
    struct fy_selftest_layout layout;
    fy_selftest_layout(o->params, o->grad_dtype, &layout);
    struct fy_pool_region_spec regions[3];
    fy_selftest_regions(&layout, regions);
    fy_info("plan: %llu parameters, %llu steps; store on %s", (unsigned long long)o->params,
            (unsigned long long)o->steps, o->ssd);
    struct fy_session s;
    struct fy_session_opts so = session_opts(o);
    int rc = fy_session_open(&s, &so, regions, 3, "the self-test");
    struct fy_config *cfg = calloc(1, sizeof *cfg);
    if (rc == 0)
        rc = cfg ? base_config(o, cfg, 1) : -ENOMEM;
    /* the self-test's AdamW reference uses beta2 = 0.999 */
    if (rc == 0)
        rc = fy_config_set(cfg, "beta2", "0.999");
    static const char *const workers[] = {"gpu", "io", "opt"};
    if (rc == 0)
        rc = fy_session_start(&s, cfg, workers, 3, so.ready_timeout_ms);
    if (rc == 0) {
        struct fy_selftest_opts to = {.params = o->params, .steps = (unsigned)o->steps,
                                      .seed = o->seed, .grad_dtype = o->grad_dtype,
                                      .timeout_ms = o->timeout_s * 1000};
        rc = fy_selftest_run(s.sup, s.pool, &to);
    }
    free(cfg);
    return fy_session_close(&s, rc);
}

static int cmd_prepare(struct options *o, int argc, char **argv)
{
    FY_TRY(require(o->out, "--out", "prepare"));
    FY_REQUIRE(optind < argc, -EINVAL, "prepare: give one or more input files after the options");
    struct fy_prepare_opts po = {.out = o->out, .tokenizer = o->tokenizer, .jsonl = o->jsonl,
                                 .text_field = o->text_field, .prompt_field = o->prompt_field,
                                 .response_field = o->response_field,
                                 .inputs = (const char *const *)argv + optind,
                                 .n_inputs = (unsigned)(argc - optind), .overwrite = o->overwrite};
    struct fy_prepare_result res;
    FY_TRY(fy_prepare(&po, &res));
    char eos[48] = "";
    if (res.eos != FY_TOKFILE_NO_EOS)
        snprintf(eos, sizeof eos, ", end-of-sequence token %u", res.eos);
    char masked[96] = "";
    if (res.masked > 0)
        snprintf(masked, sizeof masked, ", %llu of them masked out of the loss",
                 (unsigned long long)res.masked);
    fy_info("wrote %s: %llu tokens%s (%s, vocabulary %u%s) from %d file(s)", o->out,
            (unsigned long long)res.count, masked, res.tokenizer, res.vocab, eos, argc - optind);
    return 0;
}

static void model_conf_path(const char *run_dir, char *out, size_t len)
{
    snprintf(out, len, "%s/model.conf", run_dir);
}

/* model.conf's record of where the store lives (init): a store inside the run directory as a
 * path relative to it (`store_in_run_dir = 1`), so that a copied or moved run directory trains
 * its own store; --ssd directories as absolute paths. */
static int model_conf_set_store(struct fy_config *mc, const struct options *o)
{
    if (o->store_in_run_dir) {
        FY_TRY(fy_config_set(mc, "ssd", "store"));
        return fy_config_set(mc, "store_in_run_dir", "1");
    }
    char list[FY_CONFIG_VALUE_MAX] = "", copy[4096];
    snprintf(copy, sizeof copy, "%s", o->ssd);
    for (char *save = NULL, *p = strtok_r(copy, ",", &save); p != NULL;
         p = strtok_r(NULL, ",", &save)) {
        char abs[PATH_MAX];
        FY_SYS(realpath(p, abs) == NULL ? -1 : 0, "ssd path %s", p);
        size_t at = strlen(list);
        FY_REQUIRE(at + strlen(abs) + 2 < sizeof list, -E2BIG,
                   "init: the --ssd paths are longer than model.conf holds (%zu bytes)",
                   sizeof list - 1);
        snprintf(list + at, sizeof list - at, "%s%s", at ? "," : "", abs);
    }
    return fy_config_set(mc, "ssd", list);
}

/* The store of the run in o->run_dir as model.conf records it, into o->ssd_here. A model.conf
 * written before stores were recorded relative to their run directory names the store of the
 * directory it was made in: where that is another directory's store/ and this one has its own
 * (a copy or a move), this one's is taken, and said. */
static void find_store(struct options *o, const struct fy_config *mc, const char *recorded)
{
    const char *in_run = fy_config_get(mc, "store_in_run_dir");
    if (in_run != NULL && strcmp(in_run, "1") == 0) { /* absolute: one name whatever the cwd */
        char dir[PATH_MAX];
        snprintf(o->ssd_here, sizeof o->ssd_here, "%s/%s",
                 realpath(o->run_dir, dir) != NULL ? dir : o->run_dir, recorded);
        return;
    }
    snprintf(o->ssd_here, sizeof o->ssd_here, "%s", recorded);
    size_t len = strlen(recorded);
    char own[PATH_MAX + 32], own_data[PATH_MAX + 64], theirs[PATH_MAX], here[PATH_MAX];
    snprintf(own, sizeof own, "%s/store", o->run_dir);
    snprintf(own_data, sizeof own_data, "%s/%s", own, FY_STORE_DATA_NAME);
    if (strchr(recorded, ',') != NULL || len < 6 || strcmp(recorded + len - 6, "/store") != 0 ||
        access(own_data, F_OK) != 0)
        return;
    snprintf(theirs, sizeof theirs, "%.*s", (int)(len - 6), recorded);
    if (realpath(o->run_dir, here) == NULL)
        return;
    char theirs_real[PATH_MAX];
    if (realpath(theirs, theirs_real) != NULL && strcmp(theirs_real, here) == 0)
        return; /* its own store after all */
    fy_info("%s/model.conf names the store %s, of the run directory it was made in; this one "
            "has its own: using %s", o->run_dir, recorded, own);
    snprintf(o->ssd_here, sizeof o->ssd_here, "%s", own);
}

/* Reads RUN/model.conf (written by init): the model and where its store lives. */
static int load_model_conf(struct options *o, struct fy_config *mc, struct fy_gpt_config *model)
{
    char path[PATH_MAX];
    model_conf_path(o->run_dir, path, sizeof path);
    if (access(path, F_OK) != 0) {
        if (fy_staging_explain_missing(o->run_dir, path)) /* an init unfinished, or running */
            return -ENOENT;
        fy_error("%s: no model in this run directory: create one with fuyou-launch init --run-dir %s",
                 path, o->run_dir);
        return -ENOENT;
    }
    FY_TRY(fy_config_load(mc, path));
    FY_TRY(fy_gpt_config_from(mc, model));
    if (o->ssd != NULL) /* --ssd: the store is where the command says */
        return check_ssd_paths(o->ssd);
    const char *recorded = fy_config_get(mc, "ssd");
    FY_REQUIRE(recorded != NULL, -EINVAL, "%s has no 'ssd' entry: pass --ssd", path);
    find_store(o, mc, recorded);
    o->ssd = o->ssd_here;
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", o->ssd);
    for (char *save = NULL, *p = strtok_r(copy, ",", &save); p != NULL;
         p = strtok_r(NULL, ",", &save)) {
        struct stat st;
        int e = stat(p, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
        if (e != 0) {
            fy_error("the store of %s is missing (%s: ssd = %s): %s: %s; mount or restore it "
                     "there, or pass --ssd with the store's directories", o->run_dir, path,
                     recorded, p, strerror(e));
            return -e;
        }
    }
    return 0;
}

/* The store must hold the model this run describes. */
static int check_store_model(const struct fy_storemeta *meta, const struct fy_gpt_config *model,
                             const char *ssd)
{
    if (fy_gpt_config_hash(&meta->model) == fy_gpt_config_hash(model))
        return 0;
    char have[160], want[160];
    fy_gpt_config_describe(&meta->model, have, sizeof have);
    fy_gpt_config_describe(model, want, sizeof want);
    fy_error("store %s was made for another model (%s) than this run's (%s): pass the --ssd of "
             "this run's store",
             ssd, have, want);
    return -EINVAL;
}

static int cmd_init_hf(struct options *o);

/* The model that init's options describe (--arch, --layers, ...), validated. */
static int model_from_options(const struct options *o, struct fy_gpt_config *out)
{
    struct fy_gpt_config model = {.n_layer = (uint32_t)o->layers, .n_head = (uint32_t)o->heads,
                                  .n_embd = (uint32_t)o->embd, .vocab = (uint32_t)o->vocab,
                                  .ctx = (uint32_t)o->ctx};
    FY_REQUIRE(o->layers <= UINT32_MAX && o->heads <= UINT32_MAX && o->embd <= UINT32_MAX &&
                   o->vocab <= UINT32_MAX && o->ctx <= UINT32_MAX && o->kv_heads <= UINT32_MAX &&
                   o->ffn <= UINT32_MAX && 4 * o->embd <= UINT32_MAX,
               -EINVAL, "init: model dimensions too large");
    if (strcmp(o->arch, "llama") == 0) {
        model.arch = FY_ARCH_LLAMA;
        model.n_kv_head = (uint32_t)(o->kv_heads != 0 ? o->kv_heads : o->heads);
        model.n_inter = (uint32_t)(o->ffn != 0 ? o->ffn : 4 * o->embd);
        model.tied = (uint32_t)o->tied;
        model.rms_eps = (float)o->rms_eps;
        model.rope_theta = o->rope_theta;
    } else {
        FY_REQUIRE(o->kv_heads == 0 && o->ffn == 0 && !o->tied && o->rope_theta == 10000.0 &&
                       o->rms_eps == 1e-5,
                   -EINVAL, "init: --kv-heads, --ffn, --rope-theta, --rms-eps and --tied are "
                   "options of --arch llama");
    }
    FY_TRY(fy_gpt_config_validate(&model));
    *out = model;
    return 0;
}

/* Points the io worker of an init at the staging directories, where it creates the new store. */
static int staged_store_config(const struct options *o, const struct fy_staging *st,
                               struct fy_config *cfg)
{
    FY_TRY(base_config(o, cfg, 1));
    FY_TRY(fy_config_set(cfg, "ssd", st->store_stage));
    return fy_config_set(cfg, "store_overwrite", "0");
}

/* The end of an init: the staged model put in place once the session that wrote its store closed
 * cleanly (rc 0), or what was staged removed. */
static int finish_init(struct fy_staging *st, int rc)
{
    if (rc == 0)
        rc = fy_staging_replace(st);
    if (rc < 0)
        fy_staging_abort(st);
    return rc;
}

static int cmd_init(struct options *o)
{
    FY_TRY(require(o->run_dir, "--run-dir", "init"));
    if (o->from_hf != NULL)
        return cmd_init_hf(o);
    FY_TRY(fy_staging_check_target(o->run_dir, o->ssd, o->overwrite));
    struct fy_gpt_config model;
    FY_TRY(model_from_options(o, &model));
    if (o->ssd != NULL)
        FY_TRY(check_ssd_paths(o->ssd));
    struct fy_staging *st = malloc(sizeof *st);
    FY_REQUIRE(st != NULL, -ENOMEM, "init: out of memory");
    int rc = fy_staging_begin(st, o->run_dir, o->ssd);
    if (rc < 0) {
        free(st);
        return rc;
    }
    const char *given_ssd = o->ssd;
    o->ssd = st->store; /* until st is freed */
    o->store_in_run_dir = given_ssd == NULL;
    char described[160];
    fy_gpt_config_describe(&model, described, sizeof described);
    fy_info("init: %s; seed %llu; store on %s", described, (unsigned long long)o->seed, o->ssd);
    struct fy_pool_region_spec regions[10];
    unsigned n;
    fy_train_regions(&model, 1, 1, FY_DTYPE_F32, NULL, 0, 1, FY_TRAIN_GRAD_SLOTS_MIN, 0, NULL,
                     regions, &n);
    struct fy_session s;
    struct fy_session_opts so = session_opts(o);
    rc = fy_session_open(&s, &so, regions, n, "model initialisation");
    struct fy_config *cfg = calloc(1, sizeof *cfg);
    if (rc == 0)
        rc = cfg ? staged_store_config(o, st, cfg) : -ENOMEM;
    static const char *const workers[] = {"io"};
    if (rc == 0)
        rc = fy_session_start(&s, cfg, workers, 1, so.ready_timeout_ms);
    if (rc == 0) {
        struct fy_exec x = fy_session_exec(&s);
        rc = fy_train_init_store(&x, s.pool, &model, o->seed, (unsigned)o->state_copies,
                                 o->timeout_s * 1000);
    }
    rc = fy_session_close(&s, rc);
    if (rc == 0) {
        fy_config_init(cfg);
        rc = fy_gpt_config_to(&model, cfg);
        if (rc == 0)
            rc = model_conf_set_store(cfg, o);
        if (rc == 0)
            rc = fy_config_setf(cfg, "seed", "%llu", (unsigned long long)o->seed);
        if (rc == 0)
            rc = fy_config_save(cfg, st->conf);
    }
    free(cfg);
    rc = finish_init(st, rc);
    if (rc == 0)
        fy_info("init: model written to the store at step 0 (%s/model.conf)", o->run_dir);
    o->ssd = given_ssd;
    free(st);
    return rc;
}

/* Pool regions for moving a model unit by unit between a Hugging Face directory and the store:
 * a commit record and one unit's state (read whole on export, to check its digest). */
static void hf_regions(const struct fy_gpt_config *c, struct fy_pool_region_spec out[2])
{
    out[0] = (struct fy_pool_region_spec){"meta", FY_COMMIT_RECORD_BYTES};
    out[1] = (struct fy_pool_region_spec){"unit", fy_optstate_max_bytes(c)};
}

/* A unit's master weights from the Hugging Face files (fy_commit_create's fill). */
static int read_unit(void *src, unsigned unit, float *master)
{
    return fy_hfgpt2_read_unit(src, unit, master);
}

/* Each unit's state extent [master | m | v] from the checkpoint, one unit in the pool at a time:
 * the master section read from the Hugging Face files, zeros for the moments; then step 0
 * committed with the units' digests. */
static int import_units(const struct fy_exec *x, struct fy_pool *pool, struct fy_hfgpt2_src *src,
                        unsigned copies, int timeout_ms)
{
    uint64_t off, bytes, meta_off, meta_bytes;
    FY_TRY(fy_pool_region(pool, "unit", &off, &bytes));
    FY_TRY(fy_pool_region(pool, "meta", &meta_off, &meta_bytes));
    const uint64_t one_buffer[2] = {off, off}; /* a large vocabulary's unit is gigabytes */
    return fy_commit_create(x, pool, meta_off, one_buffer, fy_hfgpt2_model(src), 0, copies,
                            read_unit, src, timeout_ms);
}

/* init --from-hf: every header, name and shape is checked before anything is created; then the
 * store is written unit by unit beside the run's model, RUN/hf records what export needs, and the
 * whole is put in place with model.conf last (launcher/staging.h). */
static int cmd_init_hf(struct options *o)
{
    FY_TRY(fy_staging_check_target(o->run_dir, o->ssd, o->overwrite));
    FY_REQUIRE(!o->model_set && !o->seed_set, -EINVAL,
               "init --from-hf takes the model from %s/config.json: drop --layers, --heads, "
               "--embd, --vocab, --ctx and --seed",
               o->from_hf);
    struct fy_hfgpt2_src *src = NULL;
    FY_TRY(fy_hfgpt2_open(&src, o->from_hf));
    const struct fy_gpt_config *model = fy_hfgpt2_model(src);
    int rc = o->ssd != NULL ? check_ssd_paths(o->ssd) : 0;
    struct fy_staging *st = rc == 0 ? malloc(sizeof *st) : NULL;
    if (rc == 0 && st == NULL) {
        fy_error("init: out of memory");
        rc = -ENOMEM;
    }
    if (rc == 0)
        rc = fy_staging_begin(st, o->run_dir, o->ssd);
    if (rc < 0) {
        free(st);
        fy_hfgpt2_close(&src);
        return rc;
    }
    const char *given_ssd = o->ssd;
    o->ssd = st->store; /* until st is freed */
    o->store_in_run_dir = given_ssd == NULL;
    char described[160];
    fy_gpt_config_describe(model, described, sizeof described);
    fy_info("init: importing %s (%s, %s); store on %s", fy_hfgpt2_path(src), described,
            fy_hfgpt2_dtype(src), o->ssd);
    struct fy_pool_region_spec regions[2];
    hf_regions(model, regions);
    struct fy_session s;
    struct fy_session_opts so = session_opts(o);
    rc = fy_session_open(&s, &so, regions, 2, "model import");
    struct fy_config *cfg = calloc(1, sizeof *cfg);
    if (rc == 0)
        rc = cfg ? staged_store_config(o, st, cfg) : -ENOMEM;
    static const char *const workers[] = {"io"};
    if (rc == 0)
        rc = fy_session_start(&s, cfg, workers, 1, so.ready_timeout_ms);
    if (rc == 0) {
        struct fy_exec x = fy_session_exec(&s);
        rc = import_units(&x, s.pool, src, (unsigned)o->state_copies, o->timeout_s * 1000);
    }
    rc = fy_session_close(&s, rc);
    if (rc == 0)
        rc = fy_hfgpt2_save_source(src, st->hf_dir);
    if (rc == 0) {
        fy_config_init(cfg);
        rc = fy_gpt_config_to(model, cfg);
        if (rc == 0)
            rc = model_conf_set_store(cfg, o);
        if (rc == 0)
            rc = fy_config_set(cfg, "hf", "1");
        if (rc == 0)
            rc = fy_config_set(cfg, "hf_source", o->from_hf);
        if (rc == 0)
            rc = fy_config_save(cfg, st->conf);
    }
    free(cfg);
    rc = finish_init(st, rc);
    if (rc == 0)
        fy_info("init: %s imported into the store at step 0 (%s/model.conf; %s/hf records its "
                "names, dtypes and config for export --to-hf)",
                o->from_hf, o->run_dir, o->run_dir);
    o->ssd = given_ssd;
    free(st);
    fy_hfgpt2_close(&src);
    return rc;
}

static int open_data(const struct options *o, const struct fy_gpt_config *model,
                     struct fy_tokfile **data)
{
    FY_TRY(fy_tokfile_open(data, o->data, model->vocab));
    FY_TRY(fy_tokfile_split(*data, o->eval_fraction));
    /* Refuse a batch larger than the data now, before any worker starts. */
    size_t n = (size_t)o->batch * o->seq;
    int32_t *in = malloc(n * sizeof *in), *tg = malloc(n * sizeof *tg);
    int rc = in && tg ? 0 : -ENOMEM;
    if (rc == 0)
        rc = fy_tokfile_batch(*data, FY_TOKFILE_TRAIN, o->seed, 1, (int)o->batch, (int)o->seq, in, tg);
    if (rc == 0 && o->eval_batches > 0)
        rc = fy_tokfile_eval_batch(*data, 0, (int)o->batch, (int)o->seq, in, tg);
    free(in);
    free(tg);
    return rc;
}

static int train_config(const struct options *o, const struct fy_gpt_config *model, int act_dtype,
                        struct fy_config *cfg)
{
    FY_TRY(base_config(o, cfg, 0));
    FY_TRY(fy_gpt_config_to(model, cfg));
    FY_TRY(fy_config_setf(cfg, "train.batch", "%llu", (unsigned long long)o->batch));
    FY_TRY(fy_config_setf(cfg, "train.seq", "%llu", (unsigned long long)o->seq));
    FY_TRY(fy_config_set(cfg, "train.act_dtype", fy_dtype_name(act_dtype)));
    FY_TRY(fy_config_set(cfg, "train.act_plan", o->act_plan));
    return 0;
}

/* Set by the supervisor on the first SIGINT or SIGTERM of a training run. */
static volatile int train_stop;

/* The restarts of one train command, for --max-restarts (so many an hour). */
struct restarts {
    double at[64];
    unsigned n;
};

/* After a launch of the workers (the profile's or training's) failed with rc, whether to start
 * them again, counted against --max-restarts an hour, and said either way. A worker that died or
 * stopped answering is restarted, and so is state read back damaged from the SSD in the steps
 * (`stepping`: they had begun; the restart goes back to the last commit, which is checked whole
 * first). Before the steps, a worker that exited on its own is not: it said why, and a bad
 * configuration or a full disk would fail it again. `since`: when the launch began. */
static int restart_after(const struct options *o, struct restarts *r, int rc, int stepping,
                         const struct fy_sup_fault *f, double since)
{
    int worker = rc == -ECHILD || rc == -ETIMEDOUT, damage = stepping && fy_commit_is_damage(rc);
    if (train_stop || !(worker || damage) || (worker && !stepping && f->worker[0] != 0 &&
                                              !f->stuck && f->signal == 0))
        return 0;
    char what[128];
    if (damage)
        snprintf(what, sizeof what, "state read back from the SSD store was damaged (above)");
    else if (f->worker[0] == 0)
        snprintf(what, sizeof what, "a worker did not answer in time");
    else
        snprintf(what, sizeof what, "the %s worker %s", f->worker,
                 f->stuck ? "stopped answering (a request passed its deadline)" : "died");
    double now = fy_monotonic_ns() * 1e-9;
    unsigned recent = 0;
    for (unsigned i = 0; i < r->n; i++)
        if (now - r->at[i] < 3600)
            r->at[recent++] = r->at[i];
    r->n = recent;
    if (r->n >= o->max_restarts || r->n == sizeof r->at / sizeof r->at[0]) {
        fy_error("%s after %llu restart%s within the hour (--max-restarts %llu): giving up; find "
                 "the cause in %s/fuyou.log, then continue with fuyou-launch resume %s", what,
                 (unsigned long long)r->n, r->n == 1 ? "" : "s",
                 (unsigned long long)o->max_restarts, o->run_dir, o->run_dir);
        return 0;
    }
    r->at[r->n++] = now;
    fy_progress_restart();
    fy_warn("restart %u: %s %.1f s into this attempt; going back to the last commit and starting "
            "the workers again", r->n, what, now - since);
    return 1;
}

/* One request of the profile session, waited for; *seconds (may be NULL) gets how long the worker
 * worked on it (the reply's timing). */
static int profile_call(const struct options *o, struct fy_exec *x, const char *worker,
                        struct fy_desc *req, unsigned n, double *seconds)
{
    int64_t t = x->submit(x->ctx, worker, req, n);
    struct fy_desc reply;
    int rc = t < 0 ? (int)t : x->wait(x->ctx, t, &reply, o->timeout_s * 1000);
    if (rc == 0 && seconds != NULL)
        *seconds = (double)reply.bytes * 1e-9;
    return rc;
}

/* The rates the activation plan uses besides the block's: the SSD store written and read through
 * the io worker (a scratch extent of the copies' size, not state), the better of two runs each; and
 * AdamW on the opt worker over a gradient and a state laid out as a unit's in the copies region,
 * the median of PROFILE_ADAMW_RUNS after one that warms it up: on a shared machine single runs of
 * a few milliseconds spread by 2x, and the best of them is far above what a training step sees. */
#define PROFILE_ADAMW_RUNS 5

static int double_order(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int profile_links(const struct options *o, struct fy_exec *x, uint64_t at, uint64_t bytes,
                         struct fy_train_rates *rates)
{
    unsigned cls = fy_scratch_class(bytes);
    struct fy_desc d = fy_desc_region(FY_OP_IO_ALLOC, FY_KIND_CONTROL, FY_DTYPE_NONE, 0, 0, -1);
    d.tensor = FY_TENSOR_PROBE(cls);
    d.arg = fy_scratch_class_bytes(cls);
    FY_TRY(profile_call(o, x, "io", &d, 1, NULL));
    double best[2] = {INFINITY, INFINITY}, sec, adamw[PROFILE_ADAMW_RUNS];
    /* AdamW over `params` parameters: their f32 gradient, then their state laid out as a unit's
     * (common/optstate.h); a multiple of 4096 parameters, so that no section needs padding */
    uint64_t params = bytes / (4 + fy_optstate_param_bytes()) / 4096 * 4096;
    for (int rep = 0; rep < 2; rep++) {
        const int ops[2] = {FY_OP_IO_WRITE, FY_OP_IO_READ};
        for (int i = 0; i < 2; i++) {
            d = fy_desc_region(ops[i], FY_KIND_RAW, FY_DTYPE_NONE, at, bytes, -1);
            d.tensor = FY_TENSOR_PROBE(cls);
            FY_TRY(profile_call(o, x, "io", &d, 1, &sec));
            best[i] = sec < best[i] ? sec : best[i];
        }
    }
    struct fy_optstate_layout st;
    fy_optstate_layout_params(params, &st);
    struct fy_desc req[1 + FY_OPTSTATE_PARTS];
    req[0] = fy_desc_region(FY_OP_OPT_ADAMW, FY_KIND_GRAD, FY_DTYPE_F32, at, params * 4, -1);
    unsigned parts = 1 + fy_optstate_parts(&st, at + params * 4, -1, req + 1);
    for (unsigned k = 0; k < parts; k++)
        req[k].step = 1;
    for (int run = -1; run < PROFILE_ADAMW_RUNS; run++) {
        FY_TRY(profile_call(o, x, "opt", req, parts, &sec));
        if (run >= 0)
            adamw[run] = sec;
    }
    qsort(adamw, PROFILE_ADAMW_RUNS, sizeof adamw[0], double_order);
    rates->ssd_write = (double)bytes / best[0];
    rates->ssd_read = (double)bytes / best[1];
    rates->opt_params = (double)params / adamw[PROFILE_ADAMW_RUNS / 2];
    fy_info("profile: the SSD store %.2f GB/s written, %.2f read (%llu MiB through the io "
            "worker); AdamW %.2f G parameters/s on the opt worker (median of %d runs, %.2f to "
            "%.2f)", 1e-9 * rates->ssd_write, 1e-9 * rates->ssd_read,
            (unsigned long long)(bytes >> 20), 1e-9 * rates->opt_params, PROFILE_ADAMW_RUNS,
            1e-9 * (double)params / adamw[PROFILE_ADAMW_RUNS - 1], 1e-9 * (double)params / adamw[0]);
    return 0;
}

/* The profile for --act-plan auto: a session of the workers over a small pool, before the training
 * session's pool is laid out for the plan. The gpu worker measures one block on the training batch
 * (gpt-profile); the SSD store and AdamW are timed too (profile_links). */
static int profile_run(const struct options *o, const struct fy_gpt_config *model, int act_dtype,
                       struct fy_gpt_profile *out, struct fy_train_rates *rates,
                       struct fy_sup_fault *fault)
{
    /* enough to time PCIe at full speed; the CPU backend's copies are memory to memory */
    uint64_t copies = strcmp(o->backend, "cpu") == 0 ? 16ull << 20 : 256ull << 20;
    if (o->cpu_mem != 0 && copies > o->cpu_mem / 4)
        copies = o->cpu_mem / 4 / 4096 * 4096;
    copies = copies < (1u << 20) ? 1u << 20 : copies;
    struct fy_pool_region_spec regions[2] = {{"profile", 4096}, {"copies", copies}};
    struct fy_config *cfg = calloc(1, sizeof *cfg);
    int rc = cfg != NULL ? train_config(o, model, act_dtype, cfg) : -ENOMEM;
    if (rc == 0) /* nothing kept or readied: the profile measures the bare working buffers */
        rc = fy_config_set(cfg, "train.act_plan", "recompute");
    struct fy_session s = {.lock_fd = -1};
    struct fy_session_opts so = session_opts(o);
    if (rc == 0)
        rc = fy_session_open(&s, &so, regions, 2, "the profile");
    static const char *const workers[] = {"gpu", "io", "opt"};
    if (rc == 0)
        rc = fy_session_start(&s, cfg, workers, 3, so.ready_timeout_ms);
    uint64_t at_result = 0, at_copies = 0, bytes;
    if (rc == 0)
        rc = fy_pool_region(s.pool, "profile", &at_result, &bytes);
    if (rc == 0)
        rc = fy_pool_region(s.pool, "copies", &at_copies, &bytes);
    struct fy_exec x = fy_session_exec(&s);
    if (rc == 0) {
        struct fy_desc req[2] = {
            fy_desc_region(FY_OP_GPT_PROFILE, FY_KIND_RAW, FY_DTYPE_NONE, at_copies, copies, -1),
            fy_desc_region(FY_OP_GPT_PROFILE, FY_KIND_RAW, FY_DTYPE_NONE, at_result, 4096, -1)};
        rc = profile_call(o, &x, "gpu", req, 2, NULL);
    }
    if (rc == 0) {
        memcpy(out, fy_pool_at(s.pool, at_result, sizeof *out), sizeof *out);
        if (out->magic != FY_GPT_PROFILE_MAGIC || out->version != FY_GPT_PROFILE_VERSION) {
            fy_error("the gpu worker's block profile has magic 0x%x version %u, not 0x%x %u: "
                     "the workers come from another build (rebuild with make)",
                     out->magic, out->version, FY_GPT_PROFILE_MAGIC, FY_GPT_PROFILE_VERSION);
            rc = -EPROTO;
        }
    }
    if (rc == 0 && profile_links(o, &x, at_copies, copies, rates) < 0) {
        if (fy_sup_interrupted(s.sup))
            rc = -EINTR;
        else /* the store's disk may be full, say: the block's figures still hold */
            fy_warn("timing the SSD store and AdamW failed (above): the plan uses the reference "
                    "machine's rates for them");
    }
    free(cfg);
    rc = fy_session_close(&s, rc);
    *fault = s.fault;
    return rc;
}

/* Room for swapped internals beside the pool's other regions: what --cpu-mem leaves, or without
 * it half the machine's memory less that pool; and on the store, what its filesystem has free
 * less 1 GiB and less `reserved` (the checkpoints' scratch extent, where they go there). */
static void swap_room(const struct options *o, uint64_t pool_bytes, uint64_t reserved,
                      uint64_t *host, uint64_t *ssd)
{
    uint64_t cap = o->cpu_mem;
    if (cap == 0) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        cap = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 2 : 0;
    }
    /* the saved region is 2 MiB aligned in the pool */
    *host = cap > pool_bytes + (2u << 20) ? cap - pool_bytes - (2u << 20) : 0;
    char first[PATH_MAX];
    snprintf(first, sizeof first, "%s", o->ssd);
    char *comma = strchr(first, ',');
    if (comma != NULL)
        *comma = '\0';
    struct statvfs fs;
    uint64_t avail = statvfs(first, &fs) == 0 ? (uint64_t)fs.f_bavail * fs.f_frsize : 0;
    *ssd = avail > (1ull << 30) + reserved ? avail - (1ull << 30) - reserved : 0;
}

/* The dtype of the weights the gpu worker of `backend` is sent (--weights-dtype, auto: the
 * backend's). */
static int weight_dtype_of(const struct options *o, const char *backend)
{
    return o->weights_dtype ? o->weights_dtype : fy_backend_preferred_weight_dtype(backend);
}

/* RUN/ssd_rates.json: the SSD's rates in a past session's steps (launcher/diskrates.h). */
static void ssd_rates_path(const struct options *o, char *path, size_t len)
{
    snprintf(path, len, "%s/ssd_rates.json", o->run_dir);
}

/* --ssd-rates auto: the plan takes the SSD's rates from the run directory's record of the last
 * session's steps on this store, where there is one, in place of `instead` (the profile's sample;
 * for `plan`, the machine profile's or the reference machine's); each way that the steps moved
 * nothing keeps the rate it had. Returns 1 where it took them, else 0. */
static int plan_ssd_rates(const struct options *o, struct fy_train_rates *rates,
                          const char *instead)
{
    if (o->ssd_rates_profile || o->run_dir == NULL || o->ssd == NULL)
        return 0;
    char path[PATH_MAX], why[256];
    ssd_rates_path(o, path, sizeof path);
    struct fy_diskrates d;
    int rc = fy_diskrates_load(path, &d, why, sizeof why);
    if (rc == -ENOENT)
        return 0;
    if (rc < 0) {
        fy_warn("%s: %s: the plan's SSD rates are %s (a training session's steps will replace "
                "the record)", path, why, instead);
        return 0;
    }
    if (strcmp(d.ssd, o->ssd) != 0) {
        fy_info("plan: %s holds the rates of the store at %s, not this run's %s: the plan's SSD "
                "rates are %s", path, d.ssd, o->ssd, instead);
        return 0;
    }
    double rd = fy_diskrates_read_Bps(&d), wr = fy_diskrates_write_Bps(&d);
    if (!(rd > 0) && !(wr > 0))
        return 0;
    double age_s = difftime(time(NULL), (time_t)d.written);
    char age[48], r[32], w[32];
    if (age_s < 2 * 3600)
        snprintf(age, sizeof age, "%.0f minutes ago", age_s < 0 ? 0 : age_s / 60);
    else if (age_s < 2 * 86400)
        snprintf(age, sizeof age, "%.0f hours ago", age_s / 3600);
    else
        snprintf(age, sizeof age, "%.0f days ago", age_s / 86400);
    fy_info("plan: SSD rates as the last session's %llu step%s ran at (steps %llu to %llu, batch "
            "%d, --act-plan %s, %s; %s): read %s, write %s GB/s, in place of %s (read %.2f, "
            "write %.2f): a short sample misjudges a disk under training traffic (--ssd-rates "
            "profile plans without the record)",
            (unsigned long long)d.steps, d.steps == 1 ? "" : "s",
            (unsigned long long)d.first_step, (unsigned long long)d.last_step, d.batch, d.act_plan,
            age, path, fy_diskrates_gbps(rd, "as before", r, sizeof r),
            fy_diskrates_gbps(wr, "as before", w, sizeof w),
            instead, rates->ssd_read * 1e-9, rates->ssd_write * 1e-9);
    if (rd > 0)
        rates->ssd_read = rd;
    if (wr > 0)
        rates->ssd_write = wr;
    return 1;
}

/* The plan for the blocks' internals (launcher/actrun.h): every mode profiles a block first on a
 * backend that can (not the Llama blocks); auto plans from the profile within the room the pool
 * and the store leave, the forced modes are placed as they are (and predicted from the profile
 * once the state's residency is planned, fy_actrun_predict). ckpt_slots: the checkpoints' pool
 * slots on their way to the store, 0 where they stay in the pool (fy_train_regions). */
static int plan_activations(const struct options *o, const struct fy_gpt_config *model,
                            int act_dtype, int clip, unsigned ckpt_slots,
                            const unsigned char *resident, struct restarts *restarts,
                            struct fy_gpt_profile *prof, struct fy_actrun_in *in,
                            struct fy_actrun *run)
{
    enum fy_actplan_mode mode;
    FY_TRY(fy_actplan_mode_parse(o->act_plan, &mode));
    *in = (struct fy_actrun_in){.c = model, .B = (int)o->batch, .T = (int)o->seq, .mode = mode,
                                .backend = o->backend, .act_dtype = act_dtype, .clip = clip,
                                .resident = resident, .rates = fy_train_reference_rates(),
                                .act_ahead = (unsigned)o->act_ahead};
    /* every mode is profiled: auto plans from it, the forced ones are predicted from it */
    if (model->arch != FY_ARCH_LLAMA && !o->inprocess) {
        struct fy_sup_fault fault;
        int rc;
        for (;;) { /* a worker that fails here is restarted as in training (restarts: train's) */
            double t0 = fy_monotonic_ns() * 1e-9;
            rc = profile_run(o, model, act_dtype, prof, &in->rates, &fault);
            if (restarts == NULL || !restart_after(o, restarts, rc, 0, &fault, t0))
                break;
        }
        /* interrupted, a worker that failed, a run directory in use: said, and no plan */
        if (rc == -EINTR || rc == -ECHILD || rc == -ETIMEDOUT || rc == -EBUSY)
            return rc;
        if (rc < 0 && mode == FY_ACTPLAN_AUTO) /* loudly, and on with what needs no profile */
            fy_warn("--act-plan auto: profiling a block failed (above): planning without it, the "
                    "gpu worker keeps the internals of what fits and nothing is swapped");
        else if (rc < 0)
            fy_warn("--act-plan %s: profiling a block failed (above): the step is not predicted",
                    o->act_plan);
        in->prof = rc == 0 ? prof : NULL;
        if (rc == 0)
            in->ssd_rates_from_steps = plan_ssd_rates(o, &in->rates, "the profile's sample");
        if (mode == FY_ACTPLAN_AUTO) { /* the room that state and streaming leave */
            struct fy_pool_region_spec regions[10];
            unsigned n;
            fy_train_regions(model, in->B, in->T, act_dtype, resident, clip,
                             (unsigned)o->prefetch, FY_TRAIN_GRAD_SLOTS_MIN, ckpt_slots, NULL,
                             regions, &n);
            uint64_t ckpts =
                ckpt_slots ? fy_train_ckpt_store_bytes(model, in->B, in->T, act_dtype) : 0;
            swap_room(o, fy_pool_layout_size(regions, n), ckpts, &in->host_bytes, &in->ssd_bytes);
        }
    } else if (mode == FY_ACTPLAN_AUTO && model->arch == FY_ARCH_LLAMA) {
        fy_info("--act-plan auto: a Llama model's blocks are neither profiled nor swapped: %s",
                strcmp(o->backend, "cuda") == 0
                    ? "the gpu worker keeps the internals of the top blocks that fit the GPU and "
                      "recomputes the others in their backward"
                    : "the CPU backend keeps no block's internals, every backward recomputes them");
    }
    FY_TRY(fy_actrun_plan(in, run));
    fy_actrun_log(run, in);
    return 0;
}

/* The plan for people and tools: RUN/act_plan.json, replaced whole. */
static int save_act_plan(const struct options *o, const struct fy_actrun *run,
                         const struct fy_actrun_in *in)
{
    char path[PATH_MAX], tmp[PATH_MAX + 8];
    snprintf(path, sizeof path, "%s/act_plan.json", o->run_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    FY_REQUIRE(f != NULL, -errno, "cannot create %s: %s", tmp, strerror(errno));
    int rc = fy_actrun_write_json(run, in, f);
    if (fclose(f) != 0 && rc == 0) {
        rc = -errno;
        fy_error("writing %s: %s", tmp, strerror(-rc));
    }
    if (rc == 0 && rename(tmp, path) != 0) {
        rc = -errno;
        fy_error("cannot rename %s to %s: %s", tmp, path, strerror(-rc));
    }
    return rc;
}

/* profile: what --act-plan auto measures and chooses for the run's model at --batch x --seq under
 * the given budgets (the optimizer state's residency planned as train plans it), without
 * training; the plan also goes to RUN/act_plan.json. */
/* plan: the model of --run-dir (its model.conf), of --from-hf DIR's config.json, or of the model
 * options; the budgets, batch and store of train's options; printed, nothing run. */
static int cmd_plan(struct options *o)
{
    enum fy_actplan_mode act_mode;
    FY_TRY(fy_actplan_mode_parse(o->act_plan, &act_mode));
    struct fy_dryrun_in in = {.B = (int)o->batch, .T = (int)o->seq, .clip = o->clip_grad_norm > 0,
                              .act_mode = act_mode,
                              .prefetch = (unsigned)o->prefetch, .ckpt_place = o->ckpt_place,
                              .act_ahead = (unsigned)o->act_ahead,
                              .copies = (unsigned)o->state_copies, .cpu_mem = o->cpu_mem,
                              .gpu_mem = o->gpu_mem, .ssd = o->ssd};
    char mc_path[PATH_MAX];
    int rc;
    static struct fy_config mc; /* o->ssd points into it */
    if (o->run_dir != NULL) {
        rc = load_model_conf(o, &mc, &in.model);
        in.ssd = o->ssd;
    } else if (o->from_hf != NULL) {
        snprintf(mc_path, sizeof mc_path, "%s/config.json", o->from_hf);
        rc = fy_hfgpt2_read_config(mc_path, &in.model);
    } else {
        rc = model_from_options(o, &in.model);
    }
    FY_TRY(rc);
    FY_REQUIRE(o->batch >= 1 && o->batch <= 65536 && o->seq >= 1 && o->seq <= in.model.ctx,
               -EINVAL, "plan: --batch %llu --seq %llu: need a batch of 1 to 65536 and a sequence "
               "of 1 to the model's context of %u", (unsigned long long)o->batch,
               (unsigned long long)o->seq, in.model.ctx);
    /* for the machine it plans for, not this one: auto is CUDA wherever the build has it */
    in.backend = strcmp(o->backend, "auto") == 0 ? (fy_backend_cuda_built() ? "cuda" : "cpu")
                                                 : o->backend;
    in.weight_dtype = weight_dtype_of(o, in.backend);
    char probed[PATH_MAX + 16] = "";
    if (o->machine == NULL && o->run_dir != NULL) {
        snprintf(probed, sizeof probed, "%s/machine.json", o->run_dir);
        if (access(probed, R_OK) == 0)
            o->machine = probed; /* fuyou-launch probe's, for this run */
    }
    if (o->machine != NULL) {
        FY_TRY(fy_dryrun_load_rates(o->machine, &in.rates));
        in.rates_from = o->machine;
    } else {
        in.rates = fy_train_reference_rates();
        in.rates_from = "the reference machine (one H200; fuyou-launch plan --machine FILE for "
                        "another)";
    }
    char rates_from[PATH_MAX + 160];
    if (plan_ssd_rates(o, &in.rates, o->machine ? "the machine profile's rates"
                                                : "the reference machine's rates")) {
        snprintf(rates_from, sizeof rates_from, "%s; the SSD's as the last session's steps ran "
                 "(%s/ssd_rates.json)", in.rates_from, o->run_dir);
        in.rates_from = rates_from;
    }
    rc = fy_dryrun_print(stdout, &in);
    return rc == 1 ? -ENOSPC : rc;
}

/* report: RUN/metrics.jsonl drawn into PNG charts in --out (default RUN/report). */
static int cmd_report(struct options *o)
{
    FY_TRY(require(o->run_dir, "--run-dir", "report"));
    char metrics[PATH_MAX + 16], out[PATH_MAX + 16];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", o->run_dir);
    if (o->out != NULL)
        snprintf(out, sizeof out, "%s", o->out);
    else
        snprintf(out, sizeof out, "%s/report", o->run_dir);
    int steps = fy_report_write(metrics, out);
    FY_TRY(steps);
    fy_info("report: %d steps drawn into %s/loss.png, busy.png and throughput.png", steps, out);
    return 0;
}

/* probe: the machine profile, into --out, or RUN/machine.json with --run-dir (where train and
 * plan find it), or ./machine.json. */
static int cmd_probe(struct options *o)
{
    char ssd[PATH_MAX + 16], out[PATH_MAX + 16];
    if (o->ssd == NULL && o->run_dir != NULL) {
        snprintf(ssd, sizeof ssd, "%s/store", o->run_dir);
        o->ssd = ssd;
    }
    FY_REQUIRE(o->ssd != NULL, -EINVAL,
               "probe: give the SSD directories to measure (--ssd DIR[,DIR...]) or a --run-dir "
               "whose store is in DIR/store");
    FY_TRY(check_ssd_paths(o->ssd));
    if (o->out != NULL)
        snprintf(out, sizeof out, "%s", o->out);
    else if (o->run_dir != NULL)
        snprintf(out, sizeof out, "%s/machine.json", o->run_dir);
    else
        snprintf(out, sizeof out, "machine.json");
    struct fy_probe_opts po = {.backend = fy_backend_resolve(o->backend), .gpu_mem = o->gpu_mem,
                               .ssd = o->ssd};
    fy_info("probe: measuring this machine (under a minute): the %s backend's block and copies, "
            "the SSD store on %s, memory copies, AdamW per thread count", po.backend, o->ssd);
    struct fy_probe_result r;
    FY_TRY(fy_probe_run(&po, &r));
    fy_info("probe: %s: %.4g TFLOP/s (a block, recomputed as in training), %.4g TFLOP/s its QKV "
            "product alone; copies to %.1f GB/s, from %.1f GB/s, both ways %.1f GB/s", r.device,
            r.rates.gpu_flops * 1e-12, r.gemm_flops * 1e-12, r.rates.h2d * 1e-9,
            r.rates.d2h * 1e-9, r.duplex_Bps * 1e-9);
    for (unsigned i = 0; r.ssd_paths > 1 && i < r.ssd_paths; i++)
        fy_info("probe: SSD path %s alone: read %.2f GB/s, write %.2f GB/s", r.ssd_path[i],
                r.ssd_path_read[i] * 1e-9, r.ssd_path_write[i] * 1e-9);
    fy_info("probe: SSD store on %u path%s: read %.2f GB/s, write %.2f GB/s; memory copy %.1f "
            "GB/s by one thread, %.1f GB/s by %u", r.ssd_paths, r.ssd_paths == 1 ? "" : "s",
            r.rates.ssd_read * 1e-9, r.rates.ssd_write * 1e-9, r.memcpy_Bps * 1e-9,
            r.memcpy_all_Bps * 1e-9, r.memcpy_threads);
    char per[512] = "";
    for (unsigned i = 0; i < r.n_threads; i++)
        snprintf(per + strlen(per), sizeof per - strlen(per), "%s%u: %.2f", i ? ", " : "",
                 r.threads[i], r.opt_params[i] * 1e-9);
    fy_info("probe: AdamW G parameters/s by threads: %s", per);
    FY_TRY(fy_probe_save(out, &po, &r));
    fy_info("probe: took %.1f s; machine profile written to %s (plan --machine %s; train reads "
            "RUN/machine.json)", r.seconds, out, out);
    return 0;
}

static int cmd_profile(struct options *o)
{
    FY_TRY(require(o->run_dir, "--run-dir", "profile"));
    struct fy_config *mc = calloc(1, sizeof *mc);
    struct fy_gpt_config model;
    int rc = mc != NULL ? load_model_conf(o, mc, &model) : -ENOMEM;
    if (rc == 0 && (o->batch < 1 || o->batch > 65536 || o->seq < 1 || o->seq > model.ctx)) {
        fy_error("profile: --batch %llu --seq %llu: need a batch of 1 to 65536 and a sequence of "
                 "1 to the model's context of %u", (unsigned long long)o->batch,
                 (unsigned long long)o->seq, model.ctx);
        rc = -EINVAL;
    }
    o->backend = fy_backend_resolve(o->backend);
    o->act_plan = "auto";
    int act_dtype = fy_backend_preferred_act_dtype(o->backend), clip = o->clip_grad_norm > 0;
    int weight_dtype = weight_dtype_of(o, o->backend);
    unsigned char *resident = rc == 0 ? calloc(fy_gpt_unit_count(&model), 1) : NULL;
    if (rc == 0 && resident == NULL)
        rc = -ENOMEM;
    if (rc == 0)
        fy_train_plan_resident(&model, (int)o->batch, (int)o->seq, act_dtype, o->cpu_mem, clip,
                               (unsigned)o->prefetch, 0, NULL, weight_dtype, resident);
    struct fy_gpt_profile prof;
    struct fy_actrun_in in;
    struct fy_actrun act = {0};
    if (rc == 0)
        rc = plan_activations(o, &model, act_dtype, clip, 0, resident, NULL, &prof, &in, &act);
    if (rc == 0)
        rc = save_act_plan(o, &act, &in);
    fy_actrun_free(&act);
    free(resident);
    free(mc);
    return rc;
}

/* The SSD's rates in this session's steps, for the next session's plan (--ssd-rates auto): kept
 * where the steps after the first moved anything on the SSD; a record that cannot be written is
 * said, and the run goes on (the next plan uses its profile). */
static void save_ssd_seen(const struct options *o, const struct fy_diskrates *d)
{
    if (d->steps == 0 || (d->read_bytes == 0 && d->write_bytes == 0))
        return;
    char path[PATH_MAX], r[32], w[32];
    ssd_rates_path(o, path, sizeof path);
    if (fy_diskrates_save(path, d) < 0) {
        fy_warn("the SSD rates of this session's steps were not kept (above): the next session "
                "plans from its profile's sample");
        return;
    }
    fy_info("the SSD ran at read %s, write %s GB/s in this session's %llu step%s after the first "
            "(kept in %s for the next session's plan)",
            fy_diskrates_gbps(fy_diskrates_read_Bps(d), "-", r, sizeof r),
            fy_diskrates_gbps(fy_diskrates_write_Bps(d), "-", w, sizeof w),
            (unsigned long long)d->steps, d->steps == 1 ? "" : "s", path);
}

/* RUN/train.args: the train command's arguments (after "train") and the directory it ran in, for
 * fuyou-launch resume. Line 1 "fuyou-train-args 1", line 2 the directory, then one per line. */
#define TRAIN_ARGS_MAGIC "fuyou-train-args 1"

static int save_train_args(const char *run_dir, int argc, char **argv)
{
    if (run_dir == NULL)
        return 0; /* cmd_train refuses it with a message */
    char path[PATH_MAX], tmp[PATH_MAX + 8], cwd[PATH_MAX];
    snprintf(path, sizeof path, "%s/train.args", run_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FY_SYS(getcwd(cwd, sizeof cwd) == NULL ? -1 : 0, "cannot get the working directory");
    for (int i = 0; i < argc; i++)
        if (strchr(argv[i], '\n') != NULL) {
            fy_warn("an argument holds a line break: %s is not written, so fuyou-launch resume "
                    "will not know this command", path);
            return 0;
        }
    FILE *f = fopen(tmp, "w");
    FY_SYS(f == NULL ? -1 : 0, "cannot create %s", tmp);
    fprintf(f, "%s\n%s\n", TRAIN_ARGS_MAGIC, cwd);
    for (int i = 0; i < argc; i++)
        fprintf(f, "%s\n", argv[i]);
    return fy_file_replace(f, tmp, path);
}

/* One launch of the workers for training: the store's current commit (a restart goes back to it;
 * the metrics of later steps are dropped, as they will be trained again), the steps up to
 * --steps, and the export. *fault says which worker failed and how; *stepping whether training
 * had begun (the commit was opened). The train command's arguments are kept for resume once the
 * workers are up: a command that fails before that leaves the run's last one in place. */
static int train_attempt(struct options *o, struct fy_config *mc, struct fy_config *cfg,
                         const struct fy_gpt_config *model, const struct fy_tokfile *data,
                         const struct fy_pool_region_spec *regions, unsigned n,
                         struct fy_train_opts *to, struct fy_storemeta *meta, int attempt,
                         struct fy_sup_fault *fault, int *stepping)
{
    *stepping = 0;
    double t0 = fy_monotonic_ns() * 1e-9;
    struct fy_session s;
    struct fy_session_opts so = session_opts(o);
    int rc = fy_session_open(&s, &so, regions, n, "training");
    struct fy_inproc *inproc = NULL;
    struct fy_exec x = {0};
    static const char *const workers[] = {"gpu", "io", "opt"};
    if (rc == 0 && o->inprocess && fy_config_get(mc, "hf") != NULL) {
        fy_error("train --inprocess starts from the run's seeded initialisation in memory, and %s "
                 "holds an imported Hugging Face model: drop --inprocess to train it through the "
                 "workers", o->run_dir);
        rc = -EINVAL;
    }
    if (rc == 0 && o->inprocess) {
        rc = fy_inproc_new(&inproc, s.pool, cfg, s.aff.opt);
        if (rc == 0) {
            x = fy_inproc_exec(inproc);
            uint64_t seed;
            rc = fy_config_get_u64(mc, "seed", 1, 0, &seed);
            if (rc == 0)
                rc = fy_train_init_store(&x, s.pool, model, seed, 2, o->timeout_s * 1000);
        }
    } else if (rc == 0) {
        rc = fy_session_start(&s, cfg, workers, 3, so.ready_timeout_ms);
        x = fy_session_exec(&s);
        if (rc == 0) /* Ctrl-C or SIGTERM: stop at the next step boundary, committed */
            fy_sup_set_stop_flag(s.sup, &train_stop);
    }
    if (rc == 0 && o->train_argv != NULL) {
        rc = save_train_args(o->run_dir, o->train_argc, o->train_argv);
        o->train_argv = NULL;
    }
    if (rc == 0)
        rc = fy_train_read_meta(&x, s.pool, o->ssd, meta, o->timeout_s * 1000);
    if (rc == 0)
        rc = check_store_model(meta, model, o->ssd);
    FILE *trace = NULL;
    if (rc == 0 && o->trace != NULL && (trace = fopen(o->trace, "w")) == NULL) {
        rc = -errno;
        fy_error("cannot create the trace file %s: %s", o->trace, strerror(-rc));
    }
    if (rc == 0) {
        to->trace = trace;
        if (attempt > 0)
            fy_info("restarted in %.2f s: the workers are up again, the store's last commit is "
                    "step %llu", fy_monotonic_ns() * 1e-9 - t0, (unsigned long long)meta->step);
        *stepping = 1;
        rc = fy_train_run(&x, s.pool, meta, data, to);
        to->trace = NULL;
    }
    if (rc == 0 && !train_stop && o->export_path != NULL) {
        rc = fy_train_export(&x, s.pool, meta, o->export_path, o->overwrite, o->timeout_s * 1000);
        if (rc == 0)
            fy_info("exported step %llu to %s", (unsigned long long)meta->step, o->export_path);
    }
    if (rc == -ENOSPC || rc == -EDQUOT || rc == -EFBIG)
        fy_error("the SSD store (%s) is full: training stopped; the last commit, step %llu, is "
                 "intact; free space there (or add an SSD path), then continue with fuyou-launch "
                 "resume %s", o->ssd, (unsigned long long)meta->step, o->run_dir);
    if (trace != NULL && fclose(trace) != 0)
        fy_warn("writing the trace file %s failed: %s", o->trace, strerror(errno));
    fy_inproc_destroy(&inproc);
    rc = fy_session_close(&s, rc);
    *fault = s.fault;
    return rc;
}

/* Training writes its log, metrics, commits and (in RUN/store) the store in the run directory:
 * one it cannot write is refused before anything starts. */
static int check_run_dir_writable(const char *run_dir)
{
    struct statvfs fs;
    int e = statvfs(run_dir, &fs) != 0          ? errno
            : (fs.f_flag & ST_RDONLY) != 0      ? EROFS
            : access(run_dir, W_OK | X_OK) != 0 ? errno
                                                : 0;
    if (e == 0)
        return 0;
    fy_error("run directory %s cannot be written (%s): training writes its log, metrics and "
             "commits there; copy it somewhere writable (cp -a) and train or resume the copy",
             run_dir, strerror(e));
    return -e;
}

static int cmd_train(struct options *o)
{
    FY_TRY(require(o->run_dir, "--run-dir", "train"));
    FY_TRY(require(o->data, "--data", "train"));
    if (!o->steps_set)
        o->steps = 200;
    struct restarts restarts = {.n = 0};
    FY_REQUIRE(o->batch >= 1 && o->batch <= 65536 && o->seq >= 1, -EINVAL,
               "train: --batch %llu --seq %llu: need a batch of 1 to 65536 sequences and a positive "
               "sequence length", (unsigned long long)o->batch, (unsigned long long)o->seq);
    struct fy_config *mc = calloc(1, sizeof *mc), *cfg = calloc(1, sizeof *cfg);
    struct fy_gpt_config model;
    struct fy_tokfile *data = NULL;
    int rc = mc && cfg ? load_model_conf(o, mc, &model) : -ENOMEM;
    if (rc == 0)
        rc = check_run_dir_writable(o->run_dir);
    if (rc == 0 && o->seq > model.ctx) {
        fy_error("train: --seq %llu exceeds the model's context of %u tokens",
                 (unsigned long long)o->seq, model.ctx);
        rc = -EINVAL;
    }
    if (rc == 0)
        rc = open_data(o, &model, &data);
    /* "auto" is settled here, not in the gpu worker: the activations' dtype in the pool follows the
     * backend (bf16 where the device computes in bf16: the same bits, half the bytes) */
    const char *asked = o->backend;
    if (rc == 0 && o->inprocess && strcmp(asked, "cuda") == 0) {
        fy_error("train --inprocess runs the CPU backend inside the launcher: drop --backend cuda, "
                 "or drop --inprocess to train on the GPU through the workers");
        rc = -EINVAL;
    }
    o->backend = o->inprocess ? "cpu" : fy_backend_resolve(o->backend);
    if (!o->inprocess && strcmp(asked, "auto") == 0 && strcmp(o->backend, "cpu") == 0)
        fy_warn("--backend auto: %s: using the CPU backend (slow; for tests and laptops)",
                fy_backend_cuda_built() ? "no CUDA device is visible"
                                        : "this build has no CUDA backend (nvcc was not found)");
    int act_dtype = fy_backend_preferred_act_dtype(o->backend);
    int weight_dtype = weight_dtype_of(o, o->backend);
    if (rc == 0)
        rc = train_config(o, &model, act_dtype, cfg);
    if (rc < 0) {
        fy_tokfile_close(&data);
        free(mc);
        free(cfg);
        return rc;
    }
    char described[160];
    fy_gpt_config_describe(&model, described, sizeof described);
    char clip[96] = "";
    if (o->clip_grad_norm > 0)
        snprintf(clip, sizeof clip, ", gradient norm clipped to %g (two backward passes)",
                 o->clip_grad_norm);
    fy_info("train: %s; batch %llu x %llu tokens, steps to %llu, lr %g (warmup %llu, cosine to %g), "
            "weight decay %g%s; %s schedule, weights read %llu unit%s ahead; data %s (%llu training, "
            "%llu held-out tokens)%s",
            described, (unsigned long long)o->batch, (unsigned long long)o->seq,
            (unsigned long long)o->steps, o->lr, (unsigned long long)o->warmup,
            o->lr * o->min_lr_ratio, o->weight_decay, clip, o->overlap ? "overlapped" : "serial",
            (unsigned long long)o->prefetch, o->prefetch == 1 ? "" : "s", o->data,
            (unsigned long long)fy_tokfile_split_tokens(data, FY_TOKFILE_TRAIN),
            (unsigned long long)fy_tokfile_split_tokens(data, FY_TOKFILE_EVAL),
            o->inprocess ? "; in one process, state in memory" : "");
    unsigned char *resident = calloc(fy_gpt_unit_count(&model), 1);
    struct fy_gpt_profile prof;
    struct fy_actrun_in act_in;
    struct fy_actrun act = {0};
    enum fy_actplan_mode act_mode = FY_ACTPLAN_AUTO;
    rc = resident != NULL ? fy_actplan_mode_parse(o->act_plan, &act_mode) : -ENOMEM;
    /* forced swapping puts the internals in the pool first, the state's residency after */
    int forced = act_mode == FY_ACTPLAN_HOST || act_mode == FY_ACTPLAN_SSD;
    int clipping = o->clip_grad_norm > 0;
    if (rc == 0 && forced)
        rc = plan_activations(o, &model, act_dtype, clipping, 0, resident, &restarts, &prof,
                              &act_in, &act);
    if (rc < 0) {
        free(resident);
        fy_tokfile_close(&data);
        free(mc);
        free(cfg);
        return rc;
    }
    struct fy_train_swap swap = act.swap;
    int ckpt_ssd = o->ckpt_place == CKPT_SSD;
    if (o->ckpt_place == CKPT_AUTO) {
        /* Everything in the pool when it all fits: no SSD traffic at all. Otherwise the pool is
         * better spent on optimizer state: a streamed unit moves 28 bytes over the SSD per 12 of
         * state each step (weights read, state read and written), a checkpoint 2 per byte. */
        unsigned all = fy_train_plan_resident(&model, (int)o->batch, (int)o->seq, act_dtype,
                                              o->cpu_mem, clipping, (unsigned)o->prefetch, 0,
                                              &swap, weight_dtype, resident);
        ckpt_ssd = o->cpu_mem != 0 && all < fy_gpt_unit_count(&model);
        fy_info("plan: checkpoints %s (--ckpt-place auto: %s)",
                ckpt_ssd ? "on the SSD store" : "in the shared pool",
                ckpt_ssd ? "the optimizer state does not all fit --cpu-mem beside them"
                         : "they fit beside all the optimizer state");
    }
    unsigned ckpt_slots = ckpt_ssd ? fy_train_spill_slots((unsigned)o->act_ahead) : 0;
    unsigned kept = fy_train_plan_resident(&model, (int)o->batch, (int)o->seq, act_dtype,
                                           o->cpu_mem, clipping, (unsigned)o->prefetch, ckpt_slots,
                                           &swap, weight_dtype, resident);
    if (!forced) { /* auto profiles and plans in the room that state and streaming leave */
        rc = plan_activations(o, &model, act_dtype, clipping, ckpt_slots, resident, &restarts,
                              &prof, &act_in, &act);
        swap = act.swap;
    }
    if (rc == 0 && act_mode != FY_ACTPLAN_AUTO) /* with the residency just planned */
        rc = fy_actrun_predict(&act_in, &act);
    if (rc == 0)
        rc = fy_config_setf(cfg, "train.act_keep", "%d", act.keep < 0 ? (int)model.n_layer
                                                                       : act.keep);
    if (rc == 0)
        rc = fy_config_setf(cfg, "train.act_swap", "%d", act.swap_sets);
    if (rc == 0)
        rc = save_act_plan(o, &act, &act_in);
    if (rc < 0) {
        fy_actrun_free(&act);
        free(resident);
        fy_tokfile_close(&data);
        free(mc);
        free(cfg);
        return rc;
    }
    char kept_size[32];
    fy_format_size(fy_train_resident_bytes(&model, resident), kept_size, sizeof kept_size);
    uint64_t ssd_read, ssd_write;
    fy_train_ssd_bytes(&model, (int)o->batch, (int)o->seq, act_dtype, clipping, ckpt_ssd, &swap,
                       resident, &ssd_read, &ssd_write);
    char rd[32], wr[32], up[32], down[32];
    fy_format_size(ssd_read, rd, sizeof rd);
    fy_format_size(ssd_write, wr, sizeof wr);
    uint64_t to_gpu, from_gpu;
    fy_train_pcie_bytes(&model, (int)o->batch, (int)o->seq, act_dtype, clipping, &swap, resident,
                        &to_gpu, &from_gpu);
    fy_format_size(to_gpu, up, sizeof up);
    fy_format_size(from_gpu, down, sizeof down);
    fy_info("plan: optimizer state of %u of %u units (%s) stays in the shared pool across steps; "
            "%s streams from the SSD store each step (reads %s, writes %s per step)%s; PCIe per "
            "step: at most %s to the GPU (less where a unit's output stays on the GPU for the "
            "next), %s back",
            kept, fy_gpt_unit_count(&model), kept_size,
            kept == fy_gpt_unit_count(&model) ? "nothing" : "the rest", rd, wr,
            o->cpu_mem ? "" : " (give --cpu-mem to keep state in memory)", up, down);
    unsigned copies = fy_train_weight_copies(&model, resident);
    if (weight_dtype == FY_DTYPE_BF16)
        fy_info("plan: weights to the GPU in bf16 for %u of the %u kept units (a bf16 copy beside "
                "each one's state, rewritten by AdamW)%s", copies, kept,
                copies < kept ? "; the others' in f32: --cpu-mem holds no more copies" : "");
    else
        fy_info("plan: weights to the GPU in f32 (--weights-dtype %s)",
                o->weights_dtype ? "f32" : "auto, on the CPU backend");
    struct fy_train_rates rates = fy_train_reference_rates();
    char probed[PATH_MAX + 16], at[PATH_MAX + 96];
    snprintf(probed, sizeof probed, "%s/machine.json", o->run_dir);
    snprintf(at, sizeof at, "predicted per step at the rates measured on the reference machine "
                            "(one H200");
    int have_probe = access(probed, R_OK) == 0 && fy_dryrun_load_rates(probed, &rates) == 0;
    if (have_probe) /* fuyou-launch probe measured this machine */
        snprintf(at, sizeof at, "predicted per step at this machine's rates (%s", probed);
    struct fy_train_prediction p;
    fy_train_predict(&model, (int)o->batch, (int)o->seq, act_dtype, clipping, ckpt_ssd, &swap,
                     resident, &rates, &p);
    double step_flops = (double)o->batch * (double)o->seq *
                        fy_gpt_flops_per_token(&model, (unsigned)o->seq);
    if (act.predicted_s > 0) /* measured here: the reference machine's figures would mislead */
        fy_info("plan: per step, as the activation plan above predicts from this machine's "
                "profile: %.3f s (%.3g TFLOP/s)", act.predicted_s,
                step_flops / act.predicted_s * 1e-12);
    else if (strcmp(o->backend, "cpu") == 0 && !have_probe) /* not the H200's compute */
        fy_info("plan: %s: SSD %.1f/%.1f GB/s, AdamW %.1f G parameters/s): SSD %.3f s, optimizer "
                "%.3f s; compute not predicted on the CPU backend",
                at, rates.ssd_read * 1e-9, rates.ssd_write * 1e-9, rates.opt_params * 1e-9, p.ssd_s,
                p.opt_s);
    else
        fy_info("plan: %s: %.0f TFLOP/s with blocks recomputed, PCIe %.0f/%.0f GB/s, SSD "
                "%.1f/%.1f GB/s, AdamW %.1f G parameters/s; yours may differ): GPU compute %.3f s, "
                "PCIe to the GPU at most %.3f s, from it %.3f s, SSD %.3f s, optimizer %.3f s; "
                "bound %.3f s by the %s (%.0f TFLOP/s)",
                at, rates.gpu_flops * 1e-12, rates.h2d * 1e-9, rates.d2h * 1e-9,
                rates.ssd_read * 1e-9, rates.ssd_write * 1e-9, rates.opt_params * 1e-9, p.gpu_s,
                p.h2d_s, p.d2h_s, p.ssd_s, p.opt_s, p.step_s, p.bound,
                step_flops / p.step_s * 1e-12);
    struct fy_pool_region_spec regions[10];
    unsigned n;
    unsigned grad_slots = fy_train_plan_grad_slots(&model, (int)o->batch, (int)o->seq, act_dtype,
                                                   o->cpu_mem, clipping, (unsigned)o->prefetch,
                                                   ckpt_slots, &swap, resident,
                                                   (unsigned)o->grad_slots);
    fy_info("plan: %u block gradients in the pool at once (--grad-slots %llu): the optimizer can "
            "fall %u blocks behind the backward and finish while the next forward runs",
            grad_slots, (unsigned long long)o->grad_slots, grad_slots - 1);
    fy_train_regions(&model, (int)o->batch, (int)o->seq, act_dtype, resident, clipping,
                     (unsigned)o->prefetch, grad_slots, ckpt_slots, &swap, regions, &n);
    struct fy_train_opts to = {
        .steps = o->steps, .batch = (int)o->batch, .seq = (int)o->seq, .lr = o->lr,
        .warmup = o->warmup, .min_lr_ratio = o->min_lr_ratio, .seed = o->seed,
        .eval_every = o->eval_every, .eval_batches = o->eval_batches,
        .checkpoint_every = o->checkpoint_every, .timeout_ms = o->timeout_s * 1000,
        .overlap = o->overlap, .resident = resident, .clip_grad_norm = o->clip_grad_norm,
        .ckpt_ssd = ckpt_ssd, .act_ahead = (unsigned)o->act_ahead, .act_dtype = act_dtype,
        .act_place = act.place,
        .saved_sizes = act.sizes, .stop = &train_stop, .plan_step_s = act.predicted_s,
        .plan_ssd_read = act_in.rates.ssd_read, .plan_ssd_write = act_in.rates.ssd_write,
        .plan_opt_params = act_in.rates.opt_params,
        .plan_ssd_from_steps = act_in.ssd_rates_from_steps};
    struct fy_diskrates ssd_seen;
    fy_diskrates_begin(&ssd_seen, o->ssd, (int)o->batch, o->act_plan);
    to.ssd_seen = &ssd_seen;
    if (!o->timeout_set) { /* a stuck worker is one that takes far longer than the plan says */
        double predicted = act.predicted_s > 0 ? act.predicted_s
                           : strcmp(o->backend, "cpu") != 0 ? p.step_s : 0;
        if (predicted > 0) {
            double deadline = 20 * predicted < 60 ? 60 : 20 * predicted;
            to.timeout_ms = deadline > 3600 ? 3600 * 1000 : (int)(deadline * 1000);
        }
        fy_info("plan: a request not answered within %d s counts as a stuck worker (%s; "
                "--timeout to set it)", to.timeout_ms / 1000,
                predicted > 0 ? "20 predicted steps, at least a minute" : "the default");
    }
    struct fy_storemeta *meta = calloc(1, sizeof *meta);
    rc = meta != NULL ? 0 : -ENOMEM;
    struct fy_metrics *metrics = NULL; /* kept across restarts: lines wait there for room */
    if (rc == 0)
        rc = fy_metrics_open(&metrics, o->run_dir);
    to.metrics = metrics;
    /* A worker that dies or hangs costs the steps since the last commit, not the run: the
     * workers start again and the run goes on from that commit, up to --max-restarts times an
     * hour (restart_after). */
    for (int attempt = 0; rc == 0; attempt++) {
        double t0 = fy_monotonic_ns() * 1e-9;
        struct fy_sup_fault fault;
        int stepping;
        rc = train_attempt(o, mc, cfg, &model, data, regions, n, &to, meta, attempt, &fault,
                           &stepping);
        if (!restart_after(o, &restarts, rc, stepping, &fault, t0))
            break;
        rc = 0;
    }
    fy_progress_end();
    save_ssd_seen(o, &ssd_seen);
    if (rc == 0 && train_stop) {
        fy_warn("stopped after step %llu, which is committed: fuyou-launch resume %s continues "
                "from there (nothing exported)", (unsigned long long)meta->step, o->run_dir);
        rc = -EINTR;
    }
    int lost = fy_metrics_close(&metrics, meta != NULL ? meta->step : 0);
    rc = rc ? rc : lost;
    free(meta);
    fy_actrun_free(&act);
    free(resident);
    fy_tokfile_close(&data);
    free(mc);
    free(cfg);
    return rc;
}

/* The exports' session: the io worker alone over a pool of the given regions, and the store's
 * metadata, checked against the run's model. */
static int export_session(const struct options *o, struct fy_config *cfg,
                          const struct fy_gpt_config *model,
                          const struct fy_pool_region_spec *regions, unsigned n,
                          struct fy_session *s, struct fy_exec *x, struct fy_storemeta *meta)
{
    static const char *const workers[] = {"io"};
    struct fy_session_opts so = session_opts(o);
    so.beside_other = 1; /* from the last commit, while a training run goes on */
    FY_TRY(fy_session_open(s, &so, regions, n, "export"));
    FY_TRY(base_config(o, cfg, 0));
    FY_TRY(fy_session_start(s, cfg, workers, 1, so.ready_timeout_ms));
    *x = fy_session_exec(s);
    int pause_ms = fy_knob_test_export_pause_ms();
    if (pause_ms > 0) { /* a test hook: time to kill the export mid-way */
        fy_info("test hook: the export waits %d ms with its worker started "
                "(FUYOU_TEST_EXPORT_PAUSE_MS)", pause_ms);
        struct timespec t = {pause_ms / 1000, pause_ms % 1000 * 1000000L};
        while (nanosleep(&t, &t) != 0 && errno == EINTR)
            ;
    }
    FY_TRY(fy_train_read_meta(x, s->pool, o->ssd, meta, o->timeout_s * 1000));
    return check_store_model(meta, model, o->ssd);
}

/* export --to-hf: the store's committed weights, unit by unit, into a Hugging Face directory. */
static int cmd_export_hf(struct options *o)
{
    struct fy_config *mc = calloc(1, sizeof *mc), *cfg = calloc(1, sizeof *cfg);
    struct fy_gpt_config model;
    int rc = mc && cfg ? load_model_conf(o, mc, &model) : -ENOMEM;
    char hf_dir[PATH_MAX];
    snprintf(hf_dir, sizeof hf_dir, "%s/hf", o->run_dir);
    const char *hf = rc == 0 ? fy_config_get(mc, "hf") : NULL;
    struct fy_hfgpt2_export_opts eo = {.source = hf && strcmp(hf, "1") == 0 ? hf_dir : NULL,
                                       .dtype = o->hf_dtype, .max_shard_bytes = o->max_shard_size,
                                       .overwrite = o->overwrite};
    struct fy_hfgpt2_writer *w = NULL;
    if (rc == 0)
        rc = fy_hfgpt2_writer_new(&w, o->to_hf, &model, &eo);
    struct fy_pool_region_spec regions[2];
    if (rc == 0)
        hf_regions(&model, regions);
    struct fy_session s = {.lock_fd = -1};
    struct fy_exec x = {0};
    struct fy_storemeta *meta = calloc(1, sizeof *meta);
    if (rc == 0 && meta == NULL)
        rc = -ENOMEM;
    if (rc == 0)
        rc = export_session(o, cfg, &model, regions, 2, &s, &x, meta);
    uint64_t off = 0, meta_off = 0, bytes;
    if (rc == 0)
        rc = fy_pool_region(s.pool, "unit", &off, &bytes);
    if (rc == 0)
        rc = fy_pool_region(s.pool, "meta", &meta_off, &bytes);
    struct fy_commit_export passed = {0};
    /* a run training meanwhile can commit over it; damaged state: the commit before */
    for (int moved = 0; rc == 0; moved++) {
        for (unsigned u = 0; rc == 0 && u < fy_gpt_unit_count(&model); u++) {
            rc = fy_commit_read_unit(&x, meta, u, off, o->timeout_s * 1000);
            if (rc == 0)
                rc = fy_hfgpt2_writer_put_unit(w, u, fy_commit_unit_master(s.pool, meta, u, off));
        }
        if (!fy_commit_is_damage(rc) || moved == FY_TRAIN_EXPORT_RETRIES)
            break;
        rc = fy_commit_export_next(&x, s.pool, meta_off, o->to_hf, s.beside, &passed, meta,
                                   o->timeout_s * 1000);
        fy_hfgpt2_writer_destroy(&w);
        if (rc == 1)
            rc = fy_hfgpt2_writer_new(&w, o->to_hf, &model, &eo);
    }
    char dtype[8] = "";
    if (w != NULL)
        snprintf(dtype, sizeof dtype, "%s", fy_hfgpt2_writer_dtype(w));
    if (rc == 0)
        rc = fy_hfgpt2_writer_finish(&w);
    fy_hfgpt2_writer_destroy(&w);
    if (rc == 0)
        fy_info("exported step %llu to %s (a Hugging Face %s directory, %s%s)",
                (unsigned long long)meta->step, o->to_hf,
                model.arch == FY_ARCH_LLAMA ? "Llama" : "GPT-2", dtype,
                eo.source ? ", names and config of the imported model" : ", config.json made here");
    free(meta);
    free(mc);
    free(cfg);
    return fy_session_close(&s, rc);
}

static int cmd_export(struct options *o)
{
    FY_TRY(require(o->run_dir, "--run-dir", "export"));
    FY_REQUIRE((o->out != NULL) != (o->to_hf != NULL), -EINVAL,
               "export: give --out FILE (weights file) or --to-hf DIR (Hugging Face directory)");
    if (o->to_hf != NULL)
        return cmd_export_hf(o);
    FY_REQUIRE(!o->hf_opts_set, -EINVAL,
               "export: --dtype and --max-shard-size are options of --to-hf (a weights file is f32)");
    struct fy_config *mc = calloc(1, sizeof *mc), *cfg = calloc(1, sizeof *cfg);
    struct fy_gpt_config model;
    int rc = mc && cfg ? load_model_conf(o, mc, &model) : -ENOMEM;
    if (rc == 0 && !o->overwrite && access(o->out, F_OK) == 0) {
        fy_error("%s exists: remove it or pass --overwrite", o->out);
        rc = -EEXIST;
    }
    struct fy_pool_region_spec regions[10];
    unsigned n = 0;
    if (rc == 0) /* the model is only known once model.conf has been read */
        fy_train_regions(&model, 1, 1, FY_DTYPE_F32, NULL, 0, 1, FY_TRAIN_GRAD_SLOTS_MIN, 0, NULL,
                         regions, &n);
    struct fy_session s = {.lock_fd = -1};
    struct fy_exec x = {0};
    struct fy_storemeta meta;
    if (rc == 0)
        rc = export_session(o, cfg, &model, regions, n, &s, &x, &meta);
    if (rc == 0)
        rc = fy_train_export_store(&x, s.pool, &meta, o->out, o->overwrite, s.beside,
                                   o->timeout_s * 1000);
    if (rc == 0)
        fy_info("exported step %llu to %s", (unsigned long long)meta.step, o->out);
    free(mc);
    free(cfg);
    return fy_session_close(&s, rc);
}

/* resume RUN_DIR [options]: argv becomes the run's train command (RUN/train.args) with the
 * options given here after it (the last of a repeated option wins), run from the directory it
 * ran in (its relative paths, --data say, are as they were) on RUN_DIR itself, wherever the run
 * directory has been copied or moved since. *owned keeps the new argv's storage. */
static int resume_args(int *argc, char ***argv, char ***owned)
{
    const char *dir = *argc >= 3 && (*argv)[2][0] != '-' ? (*argv)[2] : NULL;
    int extra_at = dir != NULL ? 3 : 2;
    for (int i = 2; dir == NULL && i + 1 < *argc; i++)
        if (strcmp((*argv)[i], "--run-dir") == 0)
            dir = (*argv)[i + 1];
    if (dir == NULL) {
        fprintf(stderr, "fuyou-launch resume: give the run directory: fuyou-launch resume "
                        "RUN_DIR [options]\n");
        return -EINVAL;
    }
    static char run_dir[PATH_MAX]; /* argv's --run-dir, as named here, before the chdir */
    if (realpath(dir, run_dir) == NULL) {
        fprintf(stderr, "fuyou-launch resume: run directory %s: %s\n", dir, strerror(errno));
        return -ENOENT;
    }
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/train.args", run_dir);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "fuyou-launch resume: %s: %s: only a run started with fuyou-launch train "
                        "can be resumed\n", path, strerror(errno));
        return -ENOENT;
    }
    char *line = NULL, cwd[PATH_MAX] = "";
    size_t cap = 0;
    ssize_t len;
    int n = 0, rc = 0;
    char **args = calloc((size_t)*argc + 4, sizeof *args);
    size_t max = (size_t)*argc + 4;
    while (rc == 0 && args != NULL && (len = getline(&line, &cap, f)) >= 0) {
        if (len > 0 && line[len - 1] == '\n')
            line[--len] = 0;
        if (n == 0 && strcmp(line, TRAIN_ARGS_MAGIC) != 0) {
            fprintf(stderr, "fuyou-launch resume: %s is not a train.args file of this version\n",
                    path);
            rc = -EBADMSG;
        } else if (n == 1) {
            snprintf(cwd, sizeof cwd, "%s", line);
        } else if (n >= 2) {
            if ((size_t)n + (size_t)*argc + 2 >= max) {
                char **grown = realloc(args, (max *= 2) * sizeof *args);
                if (grown == NULL) {
                    rc = -ENOMEM;
                    break;
                }
                args = grown;
            }
            args[n] = strdup(line); /* args[0..1] become the program and "train" */
        }
        n++;
    }
    free(line);
    fclose(f);
    if (rc == 0 && (args == NULL || n < 2))
        rc = args == NULL ? -ENOMEM : -EBADMSG;
    if (rc == 0 && chdir(cwd) != 0) /* the run was started elsewhere, or on another machine */
        fprintf(stderr, "fuyou-launch resume: cannot enter %s, where the run was started (%s): "
                        "its train command's relative paths are taken from here; give them "
                        "again after RUN_DIR where they differ\n", cwd, strerror(errno));
    if (rc < 0) {
        for (int i = 2; args != NULL && i < n; i++)
            free(args[i]);
        free(args);
        return rc;
    }
    args[0] = (*argv)[0];
    args[1] = "train";
    args[n++] = "--run-dir"; /* this run directory, not the one it was started in */
    args[n++] = run_dir;
    for (int i = extra_at; i < *argc; i++)
        args[n++] = (*argv)[i];
    args[n] = NULL;
    *argc = n;
    *argv = args;
    *owned = args;
    return 0;
}

int main(int argc, char **argv)
{
    fy_log_init("launch", FY_LOG_INFO);
    signal(SIGPIPE, SIG_IGN); /* `fuyou-launch ... | head` must still clean up after itself */
    if (argc == 3 && strcmp(argv[1], "help") == 0 && strcmp(argv[2], "--options") == 0) {
        /* the option table, one name a line: docs/configuration.md is checked against it */
        for (const struct option *opt = longopts; opt->name != NULL; opt++)
            printf("--%s\n", opt->name);
        return EXIT_OK;
    }
    if (argc < 2 || strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? EXIT_USAGE : EXIT_OK;
    }
    const char *command = argv[1];
    static const char *const commands[] = {"selftest", "prepare", "init", "train", "export",
                                           "profile", "resume", "plan", "report", "probe"};
    int known = 0;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        known |= strcmp(command, commands[i]) == 0;
    if (!known) {
        fprintf(stderr, "fuyou-launch: unknown command '%s' (see fuyou-launch help)\n", command);
        return EXIT_USAGE;
    }
    char **resumed = NULL;
    if (strcmp(command, "resume") == 0) { /* the run's own train command, continued */
        if (resume_args(&argc, &argv, &resumed) < 0)
            return EXIT_USAGE;
        command = "train";
    }
    struct options o;
    if (parse_options(argc - 1, argv + 1, &o) < 0)
        return EXIT_USAGE;
    int uses_workers = strcmp(command, "prepare") != 0 && strcmp(command, "plan") != 0 &&
                       strcmp(command, "report") != 0 && strcmp(command, "probe") != 0 &&
                       !o.inprocess;
    /* Before any thread exists (ZeroMQ's), so supervision owns these signals. */
    if (uses_workers && fy_sup_block_signals(NULL) != 0) {
        fy_error("cannot block SIGCHLD/SIGINT/SIGTERM for supervision");
        return EXIT_ERROR;
    }
    /* Only the commands that make a run directory create it: any other names one that must
     * exist, and a mistyped or moved one is refused without leaving a directory behind. */
    int makes_run_dir = strcmp(command, "init") == 0 || strcmp(command, "selftest") == 0;
    int made_run_dir = 0;
    if (o.run_dir != NULL && strcmp(command, "prepare") != 0) {
        char log_path[PATH_MAX + 16];
        struct stat st;
        int have = stat(o.run_dir, &st) == 0;
        if (!have && makes_run_dir && mkdir(o.run_dir, 0700) == 0)
            have = made_run_dir = 1;
        snprintf(log_path, sizeof log_path, "%s/fuyou.log", o.run_dir);
        if (have && fy_log_set_file(log_path) < 0)
            fy_warn("cannot append to %s: logging to stderr only", log_path);
    }
    int rc;
    if (strcmp(command, "selftest") == 0) {
        if (!o.steps_set)
            o.steps = 3;
        rc = cmd_selftest(&o);
    } else if (strcmp(command, "prepare") == 0) {
        rc = cmd_prepare(&o, argc - 1, argv + 1);
    } else if (strcmp(command, "init") == 0) {
        rc = cmd_init(&o);
    } else if (strcmp(command, "train") == 0) {
        if (resumed == NULL) { /* kept for resume once its workers are up (train_attempt) */
            o.train_argc = argc - 2;
            o.train_argv = argv + 2;
        }
        rc = cmd_train(&o);
    } else if (strcmp(command, "profile") == 0) {
        rc = cmd_profile(&o);
    } else if (strcmp(command, "plan") == 0) {
        rc = cmd_plan(&o);
    } else if (strcmp(command, "report") == 0) {
        rc = cmd_report(&o);
    } else if (strcmp(command, "probe") == 0) {
        rc = cmd_probe(&o);
    } else {
        rc = cmd_export(&o);
    }
    free(resumed);
    if (rc < 0 && made_run_dir && fy_remove_tree(o.run_dir) == 0)
        fy_info("removed %s, which this failed %s had created", o.run_dir, command);
    if (rc == -ECHILD)
        return EXIT_WORKER;
    if (rc == -EINTR) {
        fy_warn("stopped by signal");
        return EXIT_INTERRUPTED;
    }
    return rc < 0 ? EXIT_ERROR : EXIT_OK;
}
