/* fuyou-launch init: a new model in a run directory's store, seeded (the model options) or
 * imported from a Hugging Face directory (--from-hf); built beside whatever is there and put in
 * place whole (launcher/run/staging.h). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"
#include "common/base/dtype.h"
#include "common/formats/hf.h"
#include "common/base/log.h"
#include "launcher/cmd/cmd.h"
#include "launcher/step/commit.h"
#include "launcher/cli/runconf.h"
#include "launcher/run/session.h"
#include "launcher/run/staging.h"
#include "launcher/step/train.h"

/* model.conf's record of where the store lives (init): a store inside the run directory as a
 * path relative to it (`store_in_run_dir = 1`), so that a copied or moved run directory trains
 * its own store; --ssd directories as absolute paths. */
static int model_conf_set_store(struct fy_config *mc, const struct fy_options *o)
{
    if (o->store_in_run_dir) {
        FY_TRY(fy_config_set(mc, "ssd", "store"));
        return fy_config_set(mc, "store_in_run_dir", "1");
    }
    char list[FY_CONFIG_VALUE_MAX] = "", copy[4096];
    snprintf(copy, sizeof copy, "%s", o->ssd);
    for (char *save = NULL, *p = strtok_r(copy, ",", &save); p != NULL;
         p = strtok_r(NULL, ",", &save)) {
        char abs[PATH_MAX];
        FY_SYS(realpath(p, abs) == NULL ? -1 : 0, "ssd path %s", p);
        size_t at = strlen(list);
        FY_USAGE(at + strlen(abs) + 2 < sizeof list,
                 "init: the --ssd paths are longer than model.conf holds (%zu bytes)",
                 sizeof list - 1);
        snprintf(list + at, sizeof list - at, "%s%s", at ? "," : "", abs);
    }
    return fy_config_set(mc, "ssd", list);
}

/* Points the io worker of an init at the staging directories, where it creates the new store. */
static int staged_store_config(const struct fy_options *o, const struct fy_staging *st,
                               struct fy_config *cfg)
{
    FY_TRY(fy_runconf_base(o, cfg, 1));
    FY_TRY(fy_config_set(cfg, "ssd", st->store_stage));
    return fy_config_set(cfg, "store_overwrite", "0");
}

/* RUN/model.conf of the staged model: the model, where its store lives, then `extra`'s entries
 * (key and value pairs, NULL-ended). */
static int save_model_conf(const struct fy_options *o, const struct fy_staging *st,
                           const struct fy_model_config *model, const char *const *extra)
{
    struct fy_config *mc = calloc(1, sizeof *mc);
    if (mc == NULL)
        return -ENOMEM;
    fy_config_init(mc);
    int rc;
    FY_TRY_OUT(rc, fy_model_config_to(model, mc));
    FY_TRY_OUT(rc, model_conf_set_store(mc, o));
    for (; *extra != NULL; extra += 2)
        FY_TRY_OUT(rc, fy_config_set(mc, extra[0], extra[1]));
    FY_TRY_OUT(rc, fy_config_save(mc, st->conf));
out:
    free(mc);
    return rc;
}

/* The start of an init: the staging directories beside the run's model (launcher/run/staging.h), and
 * o->ssd pointing at the staged store until init_end. */
static int init_begin(struct fy_options *o, struct fy_staging **out)
{
    struct fy_staging *st = malloc(sizeof *st);
    FY_REQUIRE(st != NULL, -ENOMEM, "init: out of memory");
    int rc = fy_staging_begin(st, o->run_dir, o->ssd);
    if (rc < 0) {
        free(st);
        return rc;
    }
    o->store_in_run_dir = o->ssd == NULL;
    o->ssd = st->store;
    *out = st;
    return 0;
}

/* The end of an init: the staged model put in place once the session that wrote its store closed
 * cleanly and model.conf is written (rc 0), or what was staged removed; o->ssd as given again. */
static int init_end(struct fy_options *o, struct fy_staging *st, const char *given_ssd, int rc)
{
    if (rc == 0)
        rc = fy_staging_replace(st);
    if (rc < 0)
        fy_staging_abort(st);
    o->ssd = given_ssd;
    free(st);
    return rc;
}

/* What writes an init's store, in the io worker's session: the units and commit of step 0. */
typedef int (*init_write_fn)(const struct fy_options *o, const struct fy_exec *x,
                             struct fy_pool *pool, void *ctx);

/* The new store written in a session of the io worker alone over `regions` (`what`: the pool's
 * use), by write. */
static int init_store(const struct fy_options *o, const struct fy_staging *st,
                      const struct fy_pool_region_spec *regions, unsigned n, const char *what,
                      init_write_fn write, void *ctx)
{
    static const char *const workers[] = {"io"};
    struct fy_session s;
    struct fy_session_opts so = fy_runconf_session(o);
    struct fy_config *cfg = calloc(1, sizeof *cfg);
    int rc;
    FY_TRY_OUT(rc, fy_session_open(&s, &so, regions, n, what));
    FY_TRY_OUT(rc, cfg ? staged_store_config(o, st, cfg) : -ENOMEM);
    FY_TRY_OUT(rc, fy_session_start(&s, cfg, workers, 1, so.ready_timeout_ms));
    struct fy_exec x = fy_session_exec(&s);
    rc = write(o, &x, s.pool, ctx);
out:
    rc = fy_session_close(&s, rc);
    free(cfg);
    return rc;
}

/* What an import writes: the checkpoint's model in the run's optimizer state format. */
struct hf_import {
    struct fy_hf_src *src;
    struct fy_model_config model;
};

/* A unit's master weights from the Hugging Face files (fy_commit_create's fill). */
static int read_unit(void *src, unsigned unit, float *master)
{
    return fy_hf_read_unit(src, unit, master);
}

/* Each unit's state extent (common/model/optstate.h) from the checkpoint, one unit in the pool at a
 * time: the master section read from the Hugging Face files, zero moments; then step 0 committed
 * with the units' digests. */
static int import_units(const struct fy_options *o, const struct fy_exec *x, struct fy_pool *pool,
                        void *ctx)
{
    struct hf_import *imp = ctx;
    uint64_t off, bytes, meta_off, meta_bytes;
    FY_TRY(fy_pool_region(pool, "unit", &off, &bytes));
    FY_TRY(fy_pool_region(pool, "meta", &meta_off, &meta_bytes));
    const uint64_t one_buffer[2] = {off, off}; /* a large vocabulary's unit is gigabytes */
    return fy_commit_create(x, pool, meta_off, one_buffer, &imp->model, 0,
                            (unsigned)o->state_copies, read_unit, imp->src, o->timeout_s * 1000);
}

/* The model (ctx) initialised from --seed, committed as step 0. */
static int seed_units(const struct fy_options *o, const struct fy_exec *x, struct fy_pool *pool,
                      void *ctx)
{
    return fy_train_init_store(x, pool, ctx, o->seed, (unsigned)o->state_copies,
                               o->timeout_s * 1000);
}

/* The imported model staged: its store, RUN/hf (what export needs), model.conf. */
static int import_staged(const struct fy_options *o, const struct fy_staging *st,
                         struct hf_import *imp)
{
    struct fy_pool_region_spec regions[2];
    fy_runconf_unit_regions(&imp->model, regions);
    FY_TRY(init_store(o, st, regions, 2, "model import", import_units, imp));
    FY_TRY(fy_hf_save_source(imp->src, st->hf_dir));
    const char *const extra[] = {"hf", "1", "hf_source", o->from_hf, NULL};
    return save_model_conf(o, st, &imp->model, extra);
}

/* init --from-hf: every header, name and shape is checked before anything is created; then the
 * store is written unit by unit beside the run's model, RUN/hf records what export needs, and the
 * whole is put in place with model.conf last (launcher/run/staging.h). */
static int init_hf(struct fy_options *o)
{
    FY_TRY(fy_staging_check_target(o->run_dir, o->ssd, o->overwrite));
    FY_USAGE(!o->model_set && !o->seed_set,
             "init --from-hf takes the model from %s/config.json: drop --layers, --heads, "
             "--embd, --vocab, --ctx and --seed",
             o->from_hf);
    struct fy_hf_src *src = NULL;
    FY_TRY(fy_hf_open(&src, o->from_hf));
    struct hf_import imp = {src, *fy_hf_model(src)};
    imp.model.optim_state = fy_runconf_optim_state(o);
    imp.model.state_piece = o->state_piece;
    const struct fy_model_config *model = &imp.model;
    const char *given_ssd = o->ssd;
    struct fy_staging *st = NULL;
    int rc = 0;
    if (o->ssd != NULL)
        FY_TRY_OUT(rc, fy_runconf_check_ssd(o->ssd));
    FY_TRY_OUT(rc, init_begin(o, &st));
    char described[160];
    fy_model_config_describe(model, described, sizeof described);
    fy_info("init: importing %s (%s, %s); store on %s", fy_hf_path(src), described,
            fy_hf_dtype(src), o->ssd);
    rc = init_end(o, st, given_ssd, import_staged(o, st, &imp));
    if (rc == 0)
        fy_info("init: %s imported into the store at step 0 (%s/model.conf; %s/hf records its "
                "names, dtypes and config for export --to-hf)",
                o->from_hf, o->run_dir, o->run_dir);
out:
    fy_hf_destroy(&src);
    return rc;
}

/* The model made from --seed staged: its store and model.conf. */
static int seed_staged(const struct fy_options *o, const struct fy_staging *st,
                       struct fy_model_config *model)
{
    struct fy_pool_region_spec regions[FY_PLAN_REGIONS_MAX];
    unsigned n;
    fy_plan_unit_regions(model, regions, &n);
    FY_TRY(init_store(o, st, regions, n, "model initialisation", seed_units, model));
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)o->seed);
    const char *const extra[] = {"seed", seed, NULL};
    return save_model_conf(o, st, model, extra);
}

int fy_cmd_init(struct fy_options *o)
{
    FY_TRY(fy_options_require(o->run_dir, "--run-dir", "init"));
    if (o->from_hf != NULL)
        return init_hf(o);
    FY_TRY(fy_staging_check_target(o->run_dir, o->ssd, o->overwrite));
    struct fy_model_config model;
    FY_TRY(fy_runconf_model(o, &model));
    if (o->ssd != NULL)
        FY_TRY(fy_runconf_check_ssd(o->ssd));
    const char *given_ssd = o->ssd;
    struct fy_staging *st;
    FY_TRY(init_begin(o, &st));
    char described[160];
    fy_model_config_describe(&model, described, sizeof described);
    fy_info("init: %s; seed %llu; store on %s", described, (unsigned long long)o->seed, o->ssd);
    int rc = init_end(o, st, given_ssd, seed_staged(o, st, &model));
    if (rc == 0)
        fy_info("init: model written to the store at step 0 (%s/model.conf)", o->run_dir);
    return rc;
}

void fy_cmd_init_stopped(const struct fy_options *o, const char *removed)
{
    /* the staging is removed (init_end) and a stop comes only from the session that builds the
     * store, before the new model is put in place: nothing of it is kept */
    fy_warn("stopped by signal before the new model was in place: nothing of it was kept%s%s%s; "
            "run the init again (fuyou-launch init --run-dir %s ...)",
            removed[0] ? " (removed " : "", removed,
            removed[0] ? ", which this init had created)" : "", o->run_dir);
}
