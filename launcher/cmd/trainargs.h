/* RUN/train.args (the train command and resume: launcher/cmd/cmd_train.c, cmd_resume.c): the train
 * command's arguments (after "train") and the directory it ran in, for fuyou-launch resume. Line 1
 * "fuyou-train-args 1", line 2 the directory, then one per line. A train command writes them to
 * RUN/train.args.pending first, before anything starts, so that a launch stopped at start-up (a signal, a crash, kill -9) can be resumed; the file becomes
 * train.args once the command really trains (its workers are up and the store is short of
 * --steps), and is removed where the command fails with an error or has nothing to train, so a
 * bad command never replaces the last one that trained. A stop before the steps leaves it, and
 * resume takes it before train.args, saying so; a resume that trains renames it in turn, and one
 * that fails leaves it (its error may be its own options', or passing). A resume that trains with
 * options of its own writes its whole command (the record's, then its options) and renames it
 * once it trains, so that the next resume goes on with them. */
#ifndef FY_TRAINARGS_H
#define FY_TRAINARGS_H

#include "launcher/cli/options.h"

#define FY_TRAINARGS_MAGIC "fuyou-train-args 1"
#define FY_TRAINARGS "train.args"
#define FY_TRAINARGS_PENDING "train.args.pending"

/* RUN/train.args.pending written from this train command. *written: it was (an argument with a
 * line break cannot be, said). */
int fy_trainargs_save(const char *run_dir, int argc, char **argv, int *written);
/* RUN/train.args.pending renamed to train.args, made durable: the command trains. */
int fy_trainargs_promote(const char *run_dir);
/* At the end of a train command that did not train (`pending`: its RUN/train.args.pending is this
 * command's; `promoted`: it became train.args): removed where it failed with an error or had
 * nothing to train (the run's train.args stays the last command that trained), kept where a signal
 * stopped it before its steps (resume takes it). A resumed one is left as it is. */
void fy_trainargs_settle(const struct fy_options *o, int pending, int promoted, int rc);

#endif
