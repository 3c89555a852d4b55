/* fuyou-launch's options: the struct every command reads, the parser, and the usage text. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/actplan.h"
#include "common/check.h"
#include "common/config.h"
#include "common/dtype.h"
#include "common/safetensors.h"
#include "launcher/options.h"
#include "launcher/train.h"
#include "opt_worker/adamw.h"

void fy_options_usage(FILE *f)
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
int fy_options_parse(int argc, char **argv, struct fy_options *o)
{
    *o = (struct fy_options){.backend = "auto", .adamw_impl = "auto", .params = 1 << 20, .steps = 3,
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
                o->ckpt_place = FY_CKPT_HOST;
            } else if (strcmp(optarg, "ssd") == 0) {
                o->ckpt_place = FY_CKPT_SSD;
            } else if (strcmp(optarg, "auto") == 0) {
                o->ckpt_place = FY_CKPT_AUTO;
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
        case 'h': fy_options_usage(stdout); exit(0);
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

void fy_options_list(FILE *f)
{
    for (const struct option *opt = longopts; opt->name != NULL; opt++)
        fprintf(f, "--%s\n", opt->name);
}

int fy_options_require(const char *value, const char *option, const char *command)
{
    if (value != NULL)
        return 0;
    fprintf(stderr, "fuyou-launch %s: %s is required (see fuyou-launch help)\n", command, option);
    return -EINVAL;
}
