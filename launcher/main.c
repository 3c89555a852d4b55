/* fuyou-launch: the run's owner. Its commands prepare data, create a model in the SSD store, train
 * it through the gpu, io and opt worker processes, export its weights, and self-test the data
 * path; each lives in launcher/cmd_NAME.c (launcher/cmd.h). This file finds the command, parses
 * its options, runs it and maps its outcome to the exit status. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/fsutil.h"
#include "common/log.h"
#include "launcher/cmd.h"
#include "launcher/options.h"
#include "launcher/supervise.h"

enum { EXIT_OK = 0, EXIT_ERROR = 1, EXIT_USAGE = 2, EXIT_WORKER = 3, EXIT_INTERRUPTED = 130 };

int main(int argc, char **argv)
{
    fy_log_init("launch", FY_LOG_INFO);
    signal(SIGPIPE, SIG_IGN); /* `fuyou-launch ... | head` must still clean up after itself */
    if (argc == 3 && strcmp(argv[1], "help") == 0 && strcmp(argv[2], "--options") == 0) {
        /* the option table, one name a line: docs/configuration.md is checked against it */
        fy_options_list(stdout);
        return EXIT_OK;
    }
    if (argc < 2 || strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "-h") == 0) {
        fy_options_usage(argc < 2 ? stderr : stdout);
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
        if (fy_cmd_resume_args(&argc, &argv, &resumed) < 0)
            return EXIT_USAGE;
        command = "train";
    }
    struct fy_options o;
    if (fy_options_parse(argc - 1, argv + 1, &o) < 0)
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
        rc = fy_cmd_selftest(&o);
    } else if (strcmp(command, "prepare") == 0) {
        rc = fy_cmd_prepare(&o, argc - 1, argv + 1);
    } else if (strcmp(command, "init") == 0) {
        rc = fy_cmd_init(&o);
    } else if (strcmp(command, "train") == 0) {
        if (resumed == NULL) { /* kept for resume once its workers are up (train_attempt) */
            o.train_argc = argc - 2;
            o.train_argv = argv + 2;
        }
        rc = fy_cmd_train(&o);
    } else if (strcmp(command, "profile") == 0) {
        rc = fy_cmd_profile(&o);
    } else if (strcmp(command, "plan") == 0) {
        rc = fy_cmd_plan(&o);
    } else if (strcmp(command, "report") == 0) {
        rc = fy_cmd_report(&o);
    } else if (strcmp(command, "probe") == 0) {
        rc = fy_cmd_probe(&o);
    } else {
        rc = fy_cmd_export(&o);
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
