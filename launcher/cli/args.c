/* fuyou-launch's command line (launcher/cli/args.h): the commands, the parser that fills struct
 * fy_options from the table of options (launcher/cli/optable.h), and the usage texts. */
#include "launcher/cli/args.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "launcher/cli/optable.h"

struct command_spec {
    const char *name;
    const char *forms[2][2]; /* each way to call it: its arguments, and what it does (short) */
    const char *about;       /* what it does, for its --help */
};

/* a table: its strings as written */
/* clang-format off */
static const struct command_spec commands[FY_CMD_COUNT] = {
    [FY_CMD_PREPARE] = {"prepare", {{"--out FILE INPUT...",
                                     "text, JSONL or Parquet files -> token file"}},
        "Tokenizes text files, JSON lines with --jsonl, or Parquet files (named *.parquet) into a "
        "token file for train: byte-level (vocabulary 256) unless --tokenizer names a Hugging Face "
        "tokenizer (python3 with the tokenizers package). A JSON line or a Parquet row is one "
        "document: --text-field is trained on whole; or --prompt-field and --response-field, the "
        "prompt masked out of the loss, the response and the end-of-sequence token trained on; or "
        "--messages-field, a conversation rendered with the model's chat template (transformers), "
        "the loss on the assistant's messages and the token that ends each."},
    [FY_CMD_INIT] = {"init", {{"--run-dir DIR [model]", "create a model in the run's SSD store"},
                              {"--run-dir DIR --from-hf HF",
                               "import a Hugging Face model"}},
        "Creates the run's model in its SSD store at step 0: initialised from --seed with the model "
        "options, or imported from a Hugging Face directory (config.json and model.safetensors, or "
        "shards with model.safetensors.index.json, of GPT-2, Llama, Qwen2, Qwen3, Mistral or Phi-3), "
        "which sets the model. The new model is built beside what the run holds and put in place "
        "whole: an init that fails leaves the old one as it was."},
    [FY_CMD_TRAIN] = {"train", {{"--run-dir DIR --data FILE",
                                 "train it (continues from the store's commit)"}},
        "Trains the run's model through the gpu, io and opt workers from the store's last commit "
        "up to --steps, committing every --checkpoint-every steps; the plan (what lives where, the "
        "predicted step) is printed first. Ctrl-C or SIGTERM: the step in progress finishes and is "
        "committed, then the run stops (exit 130; fuyou-launch resume DIR continues); a second one "
        "stops at once (the last commit stays)."},
    [FY_CMD_RESUME] = {"resume", {{"DIR [options]", "continue a run's train command from its last "
                                                    "commit (after a crash, a stop or a reboot)"}},
        "Runs the run's train command again (kept in DIR/train.args), from the directory it was "
        "started in, on DIR wherever it has been copied or moved since; options given here follow "
        "the saved ones (the last of a repeated option wins). Takes train's options."},
    [FY_CMD_PLAN] = {"plan", {{"[--run-dir DIR | model]",
                               "what train would do, without training: placement, budgets, bytes "
                               "and time per step, the bound, the largest batch and model, advice "
                               "(--machine FILE: rates)"}},
        "Prints what train would do with these options, without running anything: where the "
        "optimizer state and the checkpoints live, the pool, GPU arena and store against their "
        "budgets, the bytes and predicted time per step and the bound, the largest batch and model "
        "that fit, and what to change. The model is --run-dir's, --from-hf's config.json or the "
        "model options'; the rates are --machine's, RUN/machine.json's (probe) or the reference "
        "machine's."},
    [FY_CMD_PROBE] = {"probe", {{"--ssd DIRS [--out FILE]",
                                 "measure this machine in under a minute (device, SSD store, "
                                 "memory, AdamW) into a machine profile (RUN/machine.json)"}},
        "Measures this machine in under a minute: the backend's block compute and copies, the SSD "
        "store on each --ssd path alone and on all of them, memory copies, and AdamW for each "
        "thread count; written as a machine profile (JSON) that plan --machine and train "
        "(RUN/machine.json) predict from."},
    [FY_CMD_PROFILE] = {"profile", {{"--run-dir DIR",
                                     "measure a block at --batch x --seq and show the activation "
                                     "plan train's --act-plan auto takes"}},
        "Measures one block of the run's model at --batch x --seq, and the SSD store and AdamW, in "
        "a session of the workers, and shows the activation plan that train's --act-plan auto "
        "takes under these budgets, without training; the plan also goes to RUN/act_plan.json."},
    [FY_CMD_REPORT] = {"report", {{"--run-dir DIR [--out DIR] [--compare DIRS]",
                                   "PNG charts of the run's metrics (loss, busy time, throughput; "
                                   "gnuplot), its loss beside other runs'"}},
        "Draws the run's metrics (RUN/metrics.jsonl) into loss.png, busy.png and throughput.png "
        "with gnuplot; with --compare, loss.png also draws those runs' training and held-out loss, "
        "each titled by its directory's name."},
    [FY_CMD_EXPORT] = {"export", {{"--run-dir DIR --out FILE", "write the weights to a file"},
                                  {"--run-dir DIR --to-hf HF",
                                   "write a Hugging Face model directory"}},
        "Writes the weights of the store's last commit: a weights file (f32), or a Hugging Face "
        "model directory (safetensors, config.json, and the imported model's names and files). It "
        "works beside a training run of the same directory."},
    [FY_CMD_SELFTEST] = {"selftest", {{"--run-dir DIR --ssd DIR",
                                       "data path SSD -> pool -> gpu -> AdamW -> SSD"}},
        "Moves a synthetic model of --params parameters through the data path, SSD -> pool -> gpu "
        "-> AdamW -> SSD, for --steps steps with the three workers: a check of this machine."},
};
/* clang-format on */

int fy_args_command(const char *name)
{
    for (int i = 0; i < FY_CMD_COUNT; i++)
        if (strcmp(name, commands[i].name) == 0)
            return i;
    return -1;
}

const char *fy_args_command_name(enum fy_command cmd) { return commands[cmd].name; }

int fy_args_asks_help(int argc, char **argv)
{
    for (int i = 2; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return 1;
    return 0;
}

int fy_args_parse(enum fy_command cmd, int argc, char **argv, struct fy_options *o)
{
    fy_optable_defaults(o);
    const char *name = commands[cmd].name;
    enum { FIRST = 256 }; /* getopt's value of fy_optable[i]: FIRST + i */
    struct option longopts[FY_OPTABLE_MAX + 1];
    for (size_t i = 0; i < fy_optable_count; i++)
        longopts[i] = (struct option){
            fy_optable[i].name, fy_optable[i].value ? required_argument : no_argument, NULL,
            strcmp(fy_optable[i].name, "help") == 0 ? 'h' : FIRST + (int)i};
    longopts[fy_optable_count] = (struct option){0};
    int c, rc = 0;
    opterr = 0;
    while (rc == 0 && (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (c == 'h') {
            fy_args_help(cmd, stdout);
            return FY_ARGS_HELP;
        }
        if (c < FIRST || c >= FIRST + (int)fy_optable_count) {
            fprintf(stderr,
                    "fuyou-launch: unknown or incomplete option '%s' (see fuyou-launch %s "
                    "--help)\n",
                    argv[optind - 1], name);
            return -EINVAL;
        }
        const struct fy_optable_spec *s = &fy_optable[c - FIRST];
        if ((s->commands & (1u << cmd)) == 0) {
            fprintf(stderr,
                    "fuyou-launch %s: --%s does not apply to %s (see fuyou-launch %s "
                    "--help)\n",
                    name, s->name, name, name);
            return -EINVAL;
        }
        rc = fy_optable_set(s, optarg, o);
    }
    if (rc == 0 && (o->ready_timeout_s <= 0 || o->timeout_s <= 0)) {
        fprintf(stderr, "fuyou-launch: timeouts must be positive\n");
        rc = -EINVAL;
    }
    o->args = argv + optind;
    o->n_args = argc - optind;
    return rc;
}

#define WIDTH 100 /* columns of the usage texts */

/* text, its words wrapped at WIDTH: from column `at` (where the line is), continued at `indent`. */
static void print_wrapped(FILE *f, const char *text, int at, int indent)
{
    int col = at, fresh = 1;
    for (const char *p = text + strspn(text, " "); *p != 0; p += strspn(p, " ")) {
        int len = (int)strcspn(p, " ");
        if (!fresh && col + 1 + len > WIDTH) {
            fprintf(f, "\n%*s", indent, "");
            col = indent;
            fresh = 1;
        }
        fprintf(f, "%s%.*s", fresh ? "" : " ", len, p);
        col += len + !fresh;
        fresh = 0;
        p += len;
    }
    fputc('\n', f);
}

void fy_args_usage(FILE *f)
{
    fprintf(f, "usage: fuyou-launch COMMAND [options]\n\ncommands:\n");
    for (int c = 0; c < FY_CMD_COUNT; c++)
        for (int k = 0; k < 2 && commands[c].forms[k][0] != NULL; k++) {
            fprintf(f, "  %-8s %-28s ", commands[c].name, commands[c].forms[k][0]);
            print_wrapped(f, commands[c].forms[k][1], 40, 40);
        }
    fprintf(f, "  %-37s ", "help [COMMAND | --options]");
    print_wrapped(f,
                  "this text; COMMAND: its usage and options (as COMMAND --help); --options: "
                  "every option's name",
                  40, 40);
    fprintf(f, "\n");
    print_wrapped(f,
                  "fuyou-launch COMMAND --help: the command's usage and the options it takes; "
                  "docs/configuration.md describes each option.",
                  0, 0);
    fprintf(f, "\n");
    print_wrapped(f,
                  "Exit status: 0 done, 1 error (the message says what and where), 2 usage, 3 a "
                  "worker failed, 130 interrupted. Logs: DIR/fuyou.log; per-step metrics: "
                  "DIR/metrics.jsonl.",
                  0, 0);
}

void fy_args_help(enum fy_command cmd, FILE *f)
{
    const struct command_spec *c = &commands[cmd];
    for (int k = 0; k < 2 && c->forms[k][0] != NULL; k++)
        fprintf(f, "%s fuyou-launch %s %s%s\n", k ? "      " : "usage:", c->name, c->forms[k][0],
                strstr(c->forms[k][0], "options") ? "" : " [options]");
    fprintf(f, "\n");
    print_wrapped(f, c->about, 0, 0);
    fprintf(f, "\noptions (docs/configuration.md describes each):\n");
    for (size_t i = 0; i < fy_optable_count; i++) {
        const struct fy_optable_spec *s = &fy_optable[i];
        if ((s->commands & (1u << cmd)) == 0)
            continue;
        char opt[64];
        snprintf(opt, sizeof opt, "--%s%s%s", s->name, s->value ? " " : "",
                 s->value                       ? s->value
                 : strcmp(s->name, "help") == 0 ? ", -h"
                                                : "");
        int col = fprintf(f, "  %s", opt);
        if (col > 29) {
            fprintf(f, "\n%30s", "");
            col = 30;
        } else {
            col += fprintf(f, "%*s", 30 - col, "");
        }
        print_wrapped(f, fy_optable_help(s, cmd), col, 30);
    }
}

void fy_args_list(FILE *f)
{
    for (size_t i = 0; i < fy_optable_count; i++)
        fprintf(f, "--%s\n", fy_optable[i].name);
}
