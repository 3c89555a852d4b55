/* fuyou-launch export: the store's last commit written out, as a weights file (--out) or a
 * Hugging Face model directory (--to-hf); beside a training run of the same directory. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/base/check.h"
#include "common/base/dtype.h"
#include "common/model/arch/arch.h"
#include "common/base/fsutil.h"
#include "common/formats/hf.h"
#include "common/formats/hfexport.h"
#include "common/base/knobs.h"
#include "common/base/log.h"
#include "launcher/cmd/cmd.h"
#include "launcher/step/commit.h"
#include "launcher/cli/runconf.h"
#include "launcher/run/session.h"
#include "launcher/step/train.h"

/* What the export command did, for the line of a stop (fy_cmd_export_stopped). */
static struct {
    int written;                /* the output is in place */
    uint64_t step;              /* ... with this step */
    char removed[PATH_MAX * 2]; /* the output's directories it made and removed again */
} export_outcome;

/* Ends an export: its session closed (the worker's fault said), and where it failed before its
 * output was in place, the directories it made removed again. Returns rc or the close's error. */
static int export_close(struct fy_session *s, struct fy_made_dirs *made, int rc)
{
    rc = fy_session_close(s, rc);
    if (rc < 0 && !export_outcome.written)
        fy_made_dirs_undo(made, export_outcome.removed, sizeof export_outcome.removed);
    return rc;
}

/* The exports' session: the io worker alone over a pool of the given regions, and the store's
 * metadata, checked against the run's model. */
static int export_session(const struct fy_options *o, struct fy_config *cfg,
                          const struct fy_model_config *model,
                          const struct fy_pool_region_spec *regions, unsigned n,
                          struct fy_session *s, struct fy_exec *x, struct fy_storemeta *meta)
{
    static const char *const workers[] = {"io"};
    struct fy_session_opts so = fy_runconf_session(o);
    so.reader = 1; /* from the last commit, while a training run goes on; or read-only */
    FY_TRY(fy_session_open(s, &so, regions, n, "export"));
    FY_TRY(fy_runconf_base(o, cfg, 0));
    FY_TRY(fy_config_set(cfg, "store_read_only", "1")); /* a reader: the store's files O_RDONLY */
    FY_TRY(fy_session_start(s, cfg, workers, 1, so.ready_timeout_ms));
    *x = fy_session_exec(s);
    int pause_ms = fy_knob_test_export_pause_ms();
    if (pause_ms > 0) { /* a test hook: time to kill the export mid-way */
        fy_info("test hook: the export waits %d ms with its worker started "
                "(FUYOU_TEST_EXPORT_PAUSE_MS)",
                pause_ms);
        struct timespec t = {pause_ms / 1000, pause_ms % 1000 * 1000000L};
        while (nanosleep(&t, &t) != 0 && errno == EINTR)
            ;
    }
    FY_TRY(fy_train_read_meta(x, s->pool, o->ssd, meta, o->timeout_s * 1000));
    return fy_runconf_check_store(meta, model, o->ssd);
}

/* Every unit's master weights of the commit in meta, read through the pool at `off` into
 * `master` (room for the largest unit's), into the writer. */
static int put_units(struct fy_hf_writer *w, const struct fy_model_config *model,
                     const struct fy_exec *x, struct fy_pool *pool, const struct fy_storemeta *meta,
                     uint64_t off, float *master, int timeout_ms)
{
    for (unsigned u = 0; u < fy_model_unit_count(model); u++) {
        FY_TRY(fy_commit_read_master(x, pool, meta, u, off, master, timeout_ms));
        FY_TRY(fy_hf_writer_put_unit(w, u, master));
    }
    return 0;
}

/* export --to-hf: the store's committed weights, unit by unit, into a Hugging Face directory. */
static int export_hf(struct fy_options *o)
{
    struct fy_config *mc = calloc(1, sizeof *mc), *cfg = calloc(1, sizeof *cfg);
    struct fy_storemeta *meta = calloc(1, sizeof *meta);
    struct fy_model_config model;
    char hf_dir[PATH_MAX];
    snprintf(hf_dir, sizeof hf_dir, "%s/hf", o->run_dir);
    struct fy_hf_export_opts eo = {
        .dtype = o->hf_dtype, .max_shard_bytes = o->max_shard_size, .overwrite = o->overwrite};
    struct fy_hf_writer *w = NULL;
    struct fy_made_dirs made = {0}; /* --to-hf's missing parents, removed again where it fails */
    struct fy_pool_region_spec regions[2];
    struct fy_session s = {.lock_fd = -1};
    struct fy_exec x = {0};
    struct fy_commit_export passed = {0};
    uint64_t off = 0, meta_off = 0, bytes;
    float *master = NULL;
    int rc = -ENOMEM;
    if (mc == NULL || cfg == NULL || meta == NULL)
        goto out;
    FY_TRY_OUT(rc, fy_runconf_load(o, mc, &model));
    const char *hf = fy_config_get(mc, "hf");
    eo.source = hf && strcmp(hf, "1") == 0 ? hf_dir : NULL;
    FY_TRY_OUT(rc, fy_mkdirs_for(o->to_hf, "the directory that holds the export", &made));
    FY_TRY_OUT(rc, fy_hf_writer_new(&w, o->to_hf, &model, &eo));
    fy_runconf_unit_regions(&model, regions);
    FY_TRY_OUT(rc, export_session(o, cfg, &model, regions, 2, &s, &x, meta));
    FY_TRY_OUT(rc, fy_pool_region(s.pool, "unit", &off, &bytes));
    FY_TRY_OUT(rc, fy_pool_region(s.pool, "meta", &meta_off, &bytes));
    size_t most = 0; /* the largest unit's weights, gathered from its pieces */
    for (unsigned u = 0; u < fy_model_unit_count(&model); u++)
        most = fy_model_unit_params(&model, u) > most ? fy_model_unit_params(&model, u) : most;
    master = malloc(most * sizeof *master);
    if (master == NULL) {
        fy_error("export: no memory for a unit's %zu weights", most);
        rc = -ENOMEM;
        goto out;
    }
    /* a run training meanwhile can commit over it; damaged state: the commit before */
    for (int moved = 0;; moved++) {
        rc = put_units(w, &model, &x, s.pool, meta, off, master, o->timeout_s * 1000);
        if (!fy_is_damage(rc) || moved == FY_TRAIN_EXPORT_RETRIES)
            break;
        rc = fy_commit_export_next(&x, s.pool, meta_off, o->to_hf, s.beside, &passed, meta,
                                   o->timeout_s * 1000);
        fy_hf_writer_destroy(&w);
        if (rc != 1)
            break;
        FY_TRY_OUT(rc, fy_hf_writer_new(&w, o->to_hf, &model, &eo));
    }
    if (rc < 0)
        goto out;
    char dtype[8];
    snprintf(dtype, sizeof dtype, "%s", fy_hf_writer_dtype(w));
    FY_TRY_OUT(rc, fy_hf_writer_finish(&w));
    fy_info("exported step %llu to %s (a Hugging Face %s directory, %s%s)",
            (unsigned long long)meta->step, o->to_hf, fy_model_arch(&model)->label, dtype,
            eo.source ? ", names and config of the imported model" : ", config.json made here");
    export_outcome.written = 1;
    export_outcome.step = meta->step;
out:
    fy_hf_writer_destroy(&w);
    free(master);
    free(meta);
    free(mc);
    free(cfg);
    rc = export_close(&s, &made, rc);
    return rc;
}

int fy_cmd_export(struct fy_options *o)
{
    FY_TRY(fy_options_require(o->run_dir, "--run-dir", "export"));
    FY_USAGE((o->out != NULL) != (o->to_hf != NULL),
             "export: give --out FILE (weights file) or --to-hf DIR (Hugging Face directory)");
    if (o->to_hf != NULL)
        return export_hf(o);
    FY_USAGE(!o->hf_opts_set,
             "export: --dtype and --max-shard-size are options of --to-hf (a weights file is f32)");
    struct fy_config *mc = calloc(1, sizeof *mc), *cfg = calloc(1, sizeof *cfg);
    struct fy_model_config model;
    struct fy_made_dirs made = {0}; /* --out's missing directories, removed again where it fails */
    struct fy_pool_region_spec regions[FY_PLAN_REGIONS_MAX];
    unsigned n = 0;
    struct fy_session s = {.lock_fd = -1};
    struct fy_exec x = {0};
    struct fy_storemeta meta;
    int rc = -ENOMEM;
    if (mc == NULL || cfg == NULL)
        goto out;
    FY_TRY_OUT(rc, fy_runconf_load(o, mc, &model));
    if (!o->overwrite && access(o->out, F_OK) == 0) {
        fy_error("%s exists: remove it or pass --overwrite", o->out);
        rc = -EEXIST;
        goto out;
    }
    FY_TRY_OUT(rc, fy_mkdirs_for(o->out, "the directory of the export", &made));
    fy_plan_unit_regions(&model, regions, &n); /* the model is known once model.conf is read */
    FY_TRY_OUT(rc, export_session(o, cfg, &model, regions, n, &s, &x, &meta));
    FY_TRY_OUT(rc, fy_train_export_store(&x, s.pool, &meta, o->out, o->overwrite, s.beside,
                                         o->timeout_s * 1000));
    fy_info("exported step %llu to %s", (unsigned long long)meta.step, o->out);
    export_outcome.written = 1;
    export_outcome.step = meta.step;
out:
    free(mc);
    free(cfg);
    rc = export_close(&s, &made, rc);
    return rc;
}

void fy_cmd_export_stopped(const struct fy_options *o, const char *removed)
{
    (void)removed; /* export makes no run directory */
    const char *out = o->to_hf != NULL ? o->to_hf : o->out;
    if (export_outcome.written) /* the signal came as its workers stopped */
        fy_warn("stopped by signal once the export was written: %s holds step %llu", out,
                (unsigned long long)export_outcome.step);
    else
        fy_warn("stopped by signal: nothing was exported (%s is as it was%s%s%s)", out,
                export_outcome.removed[0] ? "; removed " : "", export_outcome.removed,
                export_outcome.removed[0] ? ", made for it" : "");
}
