/* fuyou-launch's commands, one source file each (launcher/cmd/cmd_NAME.c): each takes the parsed
 * options (launcher/cli/options.h) and returns 0 or -errno, having said what failed, or -FY_EUSAGE
 * (common/base/check.h) where it refused the options' values; launcher/cmd/main.c maps that to the exit
 * status. */
#ifndef FY_CMD_H
#define FY_CMD_H

#include "launcher/cli/options.h"

/* prepare --out FILE INPUT...: the inputs are o->args (cmd_prepare.c). */
int fy_cmd_prepare(struct fy_options *o);
/* init --run-dir DIR [model options | --from-hf HF] (cmd_init.c). */
int fy_cmd_init(struct fy_options *o);
/* train --run-dir DIR --data FILE, and resume (cmd_train.c; resume: cmd_resume.c). */
int fy_cmd_train(struct fy_options *o);
/* resume RUN_DIR [options]: *argv becomes the run's train command with the options given here
 * after it (the last of a repeated option wins), run from the directory it ran in (its relative
 * paths, --data say, are as they were) on RUN_DIR itself, wherever the run directory has been
 * copied or moved since. The command is RUN/train.args.pending where a train stopped or was
 * killed before its steps began left one, else RUN/train.args (*from says which: enum
 * fy_train_args_from); *extended: options were given after RUN_DIR). *owned keeps the new argv,
 * every string of it its own: free it with fy_cmd_resume_args_free. -errno, said, where there is
 * no such run (cmd_resume.c). */
int fy_cmd_resume_args(int *argc, char ***argv, char ***owned, int *from, int *extended);
void fy_cmd_resume_args_free(char ***owned);
/* plan [--run-dir DIR | --from-hf HF | model options] (cmd_plan.c). */
int fy_cmd_plan(struct fy_options *o);
/* probe --ssd DIRS | --run-dir DIR (cmd_probe.c). */
int fy_cmd_probe(struct fy_options *o);
/* profile --run-dir DIR (cmd_profile.c). */
int fy_cmd_profile(struct fy_options *o);
/* report --run-dir DIR (cmd_report.c). */
int fy_cmd_report(struct fy_options *o);
/* export --run-dir DIR --out FILE | --to-hf HF (cmd_export.c). */
int fy_cmd_export(struct fy_options *o);
/* selftest --run-dir DIR --ssd DIR (cmd_selftest.c). */
int fy_cmd_selftest(struct fy_options *o);

/* What a command stopped by a signal (it returned -EINTR) leaves, said in one line that starts
 * "stopped by signal": what is committed or written, and what to run next. `removed` lists the
 * run directory and parents that main removed because this command had made them ("" for none). */
void fy_cmd_prepare_stopped(const struct fy_options *o, const char *removed);
void fy_cmd_probe_stopped(const struct fy_options *o, const char *removed);
void fy_cmd_init_stopped(const struct fy_options *o, const char *removed);
void fy_cmd_train_stopped(const struct fy_options *o, const char *removed);
void fy_cmd_profile_stopped(const struct fy_options *o, const char *removed);
void fy_cmd_export_stopped(const struct fy_options *o, const char *removed);
void fy_cmd_selftest_stopped(const struct fy_options *o, const char *removed);
void fy_cmd_report_stopped(const struct fy_options *o, const char *removed);

#endif
