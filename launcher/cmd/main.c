/* fuyou-launch: the run's owner. Its commands prepare data, create a model in the SSD store, train
 * it through the gpu, io and opt worker processes, export its weights, and self-test the data
 * path; each lives in launcher/cmd/cmd_NAME.c (launcher/cmd/cmd.h). This file finds the command, parses
 * its options, runs it and maps its outcome to the exit status. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/base/check.h"
#include "common/base/fsutil.h"
#include "common/base/knobs.h"
#include "common/base/log.h"
#include "launcher/cmd/cmd.h"
#include "launcher/cli/args.h"
#include "launcher/run/supervise.h"

enum { EXIT_OK = 0, EXIT_ERROR = 1, EXIT_USAGE = 2, EXIT_WORKER = 3, EXIT_INTERRUPTED = 130 };

/* Each command: its function, whether it starts workers (unless --inprocess), whether it
 * creates its --run-dir (and removes it again where it fails), and what it says when a signal
 * stopped it (-EINTR; NULL: a bare "stopped by signal"). */
static const struct {
    int (*run)(struct fy_options *o);
    int workers, makes_run_dir;
    void (*stopped)(const struct fy_options *o, const char *removed);
} commands[FY_CMD_COUNT] = {
    [FY_CMD_PREPARE] = {fy_cmd_prepare, 0, 0, fy_cmd_prepare_stopped},
    [FY_CMD_INIT] = {fy_cmd_init, 1, 1, fy_cmd_init_stopped},
    [FY_CMD_TRAIN] = {fy_cmd_train, 1, 0, fy_cmd_train_stopped},
    [FY_CMD_RESUME] = {fy_cmd_train, 1, 0, fy_cmd_train_stopped},
    [FY_CMD_PLAN] = {fy_cmd_plan, 0, 0, NULL},
    [FY_CMD_PROBE] = {fy_cmd_probe, 0, 0, fy_cmd_probe_stopped},
    [FY_CMD_PROFILE] = {fy_cmd_profile, 1, 0, fy_cmd_profile_stopped},
    [FY_CMD_REPORT] = {fy_cmd_report, 0, 0, fy_cmd_report_stopped},
    [FY_CMD_EXPORT] = {fy_cmd_export, 1, 0, fy_cmd_export_stopped},
    [FY_CMD_SELFTEST] = {fy_cmd_selftest, 1, 1, fy_cmd_selftest_stopped},
};

/* fuyou-launch help [--options | COMMAND], or no command at all: the exit status. */
static int help(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[2], "--options") == 0) {
        /* the option table, one name a line: docs/configuration.md is checked against it */
        fy_args_list(stdout);
        return EXIT_OK;
    }
    int cmd = argc == 3 ? fy_args_command(argv[2]) : -1;
    if (cmd >= 0)
        fy_args_help(cmd, stdout);
    else
        fy_args_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? EXIT_USAGE : EXIT_OK;
}

/* The log goes to RUN/fuyou.log once the run directory is there. Only the commands that make a
 * run directory create it, with its missing parents, as an output directory (*made records what
 * was made, for the removal after a failure): any other names one that must exist, and a
 * mistyped or moved one is refused without leaving a directory behind. */
static int open_run_log(const struct fy_options *o, int makes_run_dir, struct fy_made_dirs *made)
{
    made->n = 0;
    if (o->run_dir == NULL)
        return 0;
    char log_path[PATH_MAX + 16];
    struct stat st;
    int have = stat(o->run_dir, &st) == 0;
    if (!have && makes_run_dir) {
        int rc = fy_mkdirs(o->run_dir, 0700, "run directory", made);
        if (rc < 0)
            return rc;
        have = 1;
    }
    snprintf(log_path, sizeof log_path, "%s/fuyou.log", o->run_dir);
    if (have && fy_log_set_file(log_path) < 0)
        fy_warn("cannot append to %s: logging to stderr only", log_path);
    return 0;
}

/* After the command: the run directory removed where this failed command made it, the exit code. */
static int finish(int cmd, const struct fy_options *o, struct fy_made_dirs *made, int rc)
{
    const char *name = fy_args_command_name(cmd);
    char removed[PATH_MAX * 2] = "";
    /* the run directory with what the command wrote in it, then the parents made for it (said
     * here, or in the line of a stop) */
    if (rc < 0 && made->n > 0 && fy_remove_tree(o->run_dir) == 0 &&
        fy_made_dirs_undo(made, removed, sizeof removed) > 0 && rc != -EINTR)
        fy_info("removed %s, which this failed %s had created", removed, name);
    if (rc == -ECHILD)
        return EXIT_WORKER;
    if (rc == -EINTR) {
        if (commands[cmd].stopped != NULL)
            commands[cmd].stopped(o, removed);
        else
            fy_warn("stopped by signal");
        return EXIT_INTERRUPTED;
    }
    return rc == -FY_EUSAGE ? EXIT_USAGE : rc < 0 ? EXIT_ERROR : EXIT_OK;
}

int main(int argc, char **argv)
{
    fy_log_init("launch", fy_knob_log_level_or(FY_LOG_INFO));
    signal(SIGPIPE, SIG_IGN); /* `fuyou-launch ... | head` must still clean up after itself */
    if (argc < 2 || strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "-h") == 0)
        return help(argc, argv);
    int cmd = fy_args_command(argv[1]);
    if (cmd < 0) {
        fprintf(stderr, "fuyou-launch: unknown command '%s' (see fuyou-launch help)\n", argv[1]);
        return EXIT_USAGE;
    }
    if (fy_args_asks_help(argc, argv)) { /* resume DIR --help too: before DIR is needed */
        fy_args_help(cmd, stdout);
        return EXIT_OK;
    }
    char **resumed = NULL;
    int from = FY_TRAIN_ARGS_GIVEN, extended = 0;
    if (cmd == FY_CMD_RESUME && fy_cmd_resume_args(&argc, &argv, &resumed, &from, &extended) < 0)
        return EXIT_USAGE; /* argv is now the run's own train command, continued */
    struct fy_options o;
    int parsed = fy_args_parse(cmd, argc - 1, argv + 1, &o);
    if (parsed != 0) {
        fy_cmd_resume_args_free(&resumed);
        return parsed == FY_ARGS_HELP ? EXIT_OK : EXIT_USAGE;
    }
    /* Before any thread exists (ZeroMQ's), so supervision owns these signals. */
    if (commands[cmd].workers && !o.inprocess && fy_sup_block_signals(NULL) != 0) {
        fy_error("cannot block SIGCHLD/SIGINT/SIGTERM for supervision");
        fy_cmd_resume_args_free(&resumed);
        return EXIT_ERROR;
    }
    struct fy_made_dirs made;
    if (open_run_log(&o, commands[cmd].makes_run_dir, &made) < 0) {
        fy_cmd_resume_args_free(&resumed);
        return EXIT_ERROR;
    }
    if (cmd == FY_CMD_TRAIN || cmd == FY_CMD_RESUME) { /* kept for resume (trainargs.h) */
        o.train_argc = argc - 2;
        o.train_argv = argv + 2;
        o.train_args_from = from;
        o.train_args_extended = extended;
    }
    int rc = commands[cmd].run(&o);
    int code = finish(cmd, &o, &made, rc); /* o's strings may be resumed's */
    fy_cmd_resume_args_free(&resumed);
    return code;
}
