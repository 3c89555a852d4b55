/* A run's new model (init, init --from-hf) built beside the one it replaces, put in place only
 * when complete. The new store is created in a staging directory inside each of the store's paths
 * (PATH/fuyou-store.new-PID: the same file system, so a rename moves its files), the new RUN/hf and
 * model.conf in RUN/init.new-PID. Once every unit is written, step 0 committed and the session
 * closed, fy_staging_replace moves the previous RUN/model.conf aside (from then on the run has no
 * model, so a crash is refused at the next use instead of trained on), renames the new store files
 * over the old ones, swaps RUN/hf, puts the new model.conf in place last and fsyncs each directory.
 * A failed build removes what was staged and leaves the previous model as it was; staging left by
 * an init that was killed is removed by the next init of the run. */
#ifndef FY_STAGING_H
#define FY_STAGING_H

#include <limits.h>

#include "common/base/config.h"

#define FY_STAGING_RUN_PREFIX "init.new-"          /* RUN/init.new-PID */
#define FY_STAGING_STORE_PREFIX "fuyou-store.new-" /* PATH/fuyou-store.new-PID */

struct fy_staging {
    char run_dir[PATH_MAX];
    char dir[PATH_MAX];                    /* RUN/init.new-PID: the new hf/ and model.conf */
    char hf_dir[PATH_MAX];                 /* dir/hf */
    char conf[PATH_MAX];                   /* dir/model.conf */
    char store[FY_CONFIG_VALUE_MAX];       /* the store's paths, as given or RUN/store */
    char store_stage[FY_CONFIG_VALUE_MAX]; /* each path's staging directory, in the same order */
    char made_store[PATH_MAX];             /* RUN/store when this init created it, else "" */
    int had_model;                         /* RUN/model.conf existed when the build began */
    int touched; /* fy_staging_replace began moving the previous model's files */
};

/* Refuses, with one line, to replace an existing model (RUN/model.conf) or store (in ssd's paths,
 * or RUN/store when ssd is NULL) without overwrite. */
int fy_staging_check_target(const char *run_dir, const char *ssd, int overwrite);

/* Creates the run directory (and RUN/store when ssd is NULL), removes staging left by an init of
 * this run that died (said in a log line), and creates this init's staging directories. The
 * store's paths must exist. On failure nothing of this init is left. */
int fy_staging_begin(struct fy_staging *st, const char *run_dir, const char *ssd);

/* Puts the staged model in place (see the top of this file) and removes the staging directories.
 * The caller has written the whole store in st->store_stage, st->conf and, for an import,
 * st->hf_dir. On failure the caller calls fy_staging_abort. */
int fy_staging_replace(struct fy_staging *st);

/* After a failed build or replace: removes what was staged (and RUN/store if this init made it),
 * and says in one line whether the previous model is intact. */
void fy_staging_abort(struct fy_staging *st);

/* Where RUN/model.conf is missing: if an init of the run is running or stopped before it finished
 * (its staging directory is there), says so in one error line naming what to do, and returns 1;
 * else 0 (nothing said). */
int fy_staging_explain_missing(const char *run_dir, const char *model_conf);

#endif
