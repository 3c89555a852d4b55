/* fuyou-launch resume: the run's train command again (launcher/cmd/cmd.h, fy_cmd_resume_args), from
 * its record in the run directory (launcher/cmd/trainargs.h); the command then runs as train
 * does (cmd_train.c). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launcher/cmd/cmd.h"
#include "launcher/cmd/trainargs.h"

int fy_cmd_resume_args(int *argc, char ***argv, char ***owned, int *from, int *extended)
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
    /* options of its own, beyond --run-dir DIR (resume names the run directory anyway) */
    *extended = *argc - extra_at > (extra_at == 2 ? 2 : 0);
    static char run_dir[PATH_MAX]; /* argv's --run-dir, as named here, before the chdir */
    if (realpath(dir, run_dir) == NULL) {
        fprintf(stderr, "fuyou-launch resume: run directory %s: %s\n", dir, strerror(errno));
        return -ENOENT;
    }
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", run_dir, FY_TRAINARGS_PENDING);
    FILE *f = fopen(path, "r");
    *from = FY_TRAIN_ARGS_PENDING;
    if (f == NULL && errno == ENOENT) {
        snprintf(path, sizeof path, "%s/%s", run_dir, FY_TRAINARGS);
        f = fopen(path, "r");
        *from = FY_TRAIN_ARGS_RECORDED;
    }
    if (f == NULL) {
        fprintf(stderr,
                "fuyou-launch resume: %s: %s: only a run started with fuyou-launch train "
                "can be resumed\n",
                path, strerror(errno));
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
        if (n == 0 && strcmp(line, FY_TRAINARGS_MAGIC) != 0) {
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
        fprintf(stderr,
                "fuyou-launch resume: cannot enter %s, where the run was started (%s): "
                "its train command's relative paths are taken from here; give them "
                "again after RUN_DIR where they differ\n",
                cwd, strerror(errno));
    if (rc < 0) {
        for (int i = 2; args != NULL && i < n; i++)
            free(args[i]);
        free(args);
        return rc;
    }
    args[0] = strdup((*argv)[0]);
    args[1] = strdup("train");
    args[n++] = strdup("--run-dir"); /* this run directory, not the one it was started in */
    args[n++] = strdup(run_dir);
    for (int i = extra_at; i < *argc; i++)
        args[n++] = strdup((*argv)[i]);
    args[n] = NULL;
    for (int i = 0; i < n; i++)
        if (args[i] == NULL) {
            for (int k = 0; k < n; k++)
                free(args[k]);
            free(args);
            fprintf(stderr, "fuyou-launch resume: out of memory\n");
            return -ENOMEM;
        }
    *argc = n;
    *argv = args;
    *owned = args;
    return 0;
}

void fy_cmd_resume_args_free(char ***owned)
{
    for (char **a = *owned; a != NULL && *a != NULL; a++)
        free(*a);
    free(*owned);
    *owned = NULL;
}
