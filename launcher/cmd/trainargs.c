/* A train command's record in its run directory: launcher/cmd/trainargs.h. */
#include "launcher/cmd/trainargs.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/base/check.h"
#include "common/base/fsutil.h"
#include "common/base/log.h"

int fy_trainargs_save(const char *run_dir, int argc, char **argv, int *written)
{
    *written = 0;
    char path[PATH_MAX], tmp[PATH_MAX + 8], cwd[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", run_dir, FY_TRAINARGS_PENDING);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FY_SYS(getcwd(cwd, sizeof cwd) == NULL ? -1 : 0, "cannot get the working directory");
    for (int i = 0; i < argc; i++)
        if (strchr(argv[i], '\n') != NULL) {
            fy_warn("an argument holds a line break: %s/%s is not written, so fuyou-launch resume "
                    "will not know this command",
                    run_dir, FY_TRAINARGS);
            return 0;
        }
    FILE *f = fopen(tmp, "w");
    FY_SYS(f == NULL ? -1 : 0, "cannot create %s", tmp);
    fprintf(f, "%s\n%s\n", FY_TRAINARGS_MAGIC, cwd);
    for (int i = 0; i < argc; i++)
        fprintf(f, "%s\n", argv[i]);
    FY_TRY(fy_file_replace(f, tmp, path));
    *written = 1;
    return 0;
}

int fy_trainargs_promote(const char *run_dir)
{
    char from[PATH_MAX], to[PATH_MAX];
    snprintf(from, sizeof from, "%s/%s", run_dir, FY_TRAINARGS_PENDING);
    snprintf(to, sizeof to, "%s/%s", run_dir, FY_TRAINARGS);
    FY_SYS(rename(from, to), "cannot rename %s to %s", from, to);
    return fy_fsync_dir(run_dir);
}

void fy_trainargs_settle(const struct fy_options *o, int pending, int promoted, int rc)
{
    if (!pending || promoted || rc == -EINTR || o->train_args_from != FY_TRAIN_ARGS_GIVEN)
        return;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", o->run_dir, FY_TRAINARGS_PENDING);
    if (unlink(path) != 0 && errno != ENOENT)
        fy_warn("cannot remove %s: %s: fuyou-launch resume would run this command; remove it", path,
                strerror(errno));
    else if (rc == 0)
        fy_info("nothing trained: %s/%s is left as it was", o->run_dir, FY_TRAINARGS);
}
