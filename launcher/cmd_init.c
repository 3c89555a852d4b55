/* fuyou-launch init: a new model in a run directory's store, seeded (the model options) or
 * imported from a Hugging Face directory (--from-hf); built beside whatever is there and put in
 * place whole (launcher/staging.h). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/dtype.h"
#include "common/hfgpt2.h"
#include "common/log.h"
#include "launcher/cmd.h"
#include "launcher/commit.h"
#include "launcher/runconf.h"
#include "launcher/session.h"
#include "launcher/staging.h"
#include "launcher/train.h"

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
        FY_REQUIRE(at + strlen(abs) + 2 < sizeof list, -E2BIG,
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

/* The end of an init: the staged model put in place once the session that wrote its store closed
 * cleanly (rc 0), or what was staged removed. */
static int finish_init(struct fy_staging *st, int rc)
{
    if (rc == 0)
        rc = fy_staging_replace(st);
    if (rc < 0)
        fy_staging_abort(st);
    return rc;
}

/* A unit's master weights from the Hugging Face files (fy_commit_create's fill). */
static int read_unit(void *src, unsigned unit, float *master)
{
    return fy_hfgpt2_read_unit(src, unit, master);
}

/* Each unit's state extent [master | m | v] from the checkpoint, one unit in the pool at a time:
 * the master section read from the Hugging Face files, zeros for the moments; then step 0
 * committed with the units' digests. */
static int import_units(const struct fy_exec *x, struct fy_pool *pool, struct fy_hfgpt2_src *src,
                        unsigned copies, int timeout_ms)
{
    uint64_t off, bytes, meta_off, meta_bytes;
    FY_TRY(fy_pool_region(pool, "unit", &off, &bytes));
    FY_TRY(fy_pool_region(pool, "meta", &meta_off, &meta_bytes));
    const uint64_t one_buffer[2] = {off, off}; /* a large vocabulary's unit is gigabytes */
    return fy_commit_create(x, pool, meta_off, one_buffer, fy_hfgpt2_model(src), 0, copies,
                            read_unit, src, timeout_ms);
}

/* init --from-hf: every header, name and shape is checked before anything is created; then the
 * store is written unit by unit beside the run's model, RUN/hf records what export needs, and the
 * whole is put in place with model.conf last (launcher/staging.h). */
static int init_hf(struct fy_options *o)
{
    FY_TRY(fy_staging_check_target(o->run_dir, o->ssd, o->overwrite));
    FY_REQUIRE(!o->model_set && !o->seed_set, -EINVAL,
               "init --from-hf takes the model from %s/config.json: drop --layers, --heads, "
               "--embd, --vocab, --ctx and --seed",
               o->from_hf);
    struct fy_hfgpt2_src *src = NULL;
    FY_TRY(fy_hfgpt2_open(&src, o->from_hf));
    const struct fy_gpt_config *model = fy_hfgpt2_model(src);
    int rc = o->ssd != NULL ? fy_runconf_check_ssd(o->ssd) : 0;
    struct fy_staging *st = rc == 0 ? malloc(sizeof *st) : NULL;
    if (rc == 0 && st == NULL) {
        fy_error("init: out of memory");
        rc = -ENOMEM;
    }
    if (rc == 0)
        rc = fy_staging_begin(st, o->run_dir, o->ssd);
    if (rc < 0) {
        free(st);
        fy_hfgpt2_close(&src);
        return rc;
    }
    const char *given_ssd = o->ssd;
    o->ssd = st->store; /* until st is freed */
    o->store_in_run_dir = given_ssd == NULL;
    char described[160];
    fy_gpt_config_describe(model, described, sizeof described);
    fy_info("init: importing %s (%s, %s); store on %s", fy_hfgpt2_path(src), described,
            fy_hfgpt2_dtype(src), o->ssd);
    struct fy_pool_region_spec regions[2];
    fy_runconf_unit_regions(model, regions);
    struct fy_session s;
    struct fy_session_opts so = fy_runconf_session(o);
    rc = fy_session_open(&s, &so, regions, 2, "model import");
    struct fy_config *cfg = calloc(1, sizeof *cfg);
    if (rc == 0)
        rc = cfg ? staged_store_config(o, st, cfg) : -ENOMEM;
    static const char *const workers[] = {"io"};
    if (rc == 0)
        rc = fy_session_start(&s, cfg, workers, 1, so.ready_timeout_ms);
    if (rc == 0) {
        struct fy_exec x = fy_session_exec(&s);
        rc = import_units(&x, s.pool, src, (unsigned)o->state_copies, o->timeout_s * 1000);
    }
    rc = fy_session_close(&s, rc);
    if (rc == 0)
        rc = fy_hfgpt2_save_source(src, st->hf_dir);
    if (rc == 0) {
        fy_config_init(cfg);
        rc = fy_gpt_config_to(model, cfg);
        if (rc == 0)
            rc = model_conf_set_store(cfg, o);
        if (rc == 0)
            rc = fy_config_set(cfg, "hf", "1");
        if (rc == 0)
            rc = fy_config_set(cfg, "hf_source", o->from_hf);
        if (rc == 0)
            rc = fy_config_save(cfg, st->conf);
    }
    free(cfg);
    rc = finish_init(st, rc);
    if (rc == 0)
        fy_info("init: %s imported into the store at step 0 (%s/model.conf; %s/hf records its "
                "names, dtypes and config for export --to-hf)",
                o->from_hf, o->run_dir, o->run_dir);
    o->ssd = given_ssd;
    free(st);
    fy_hfgpt2_close(&src);
    return rc;
}

int fy_cmd_init(struct fy_options *o)
{
    FY_TRY(fy_options_require(o->run_dir, "--run-dir", "init"));
    if (o->from_hf != NULL)
        return init_hf(o);
    FY_TRY(fy_staging_check_target(o->run_dir, o->ssd, o->overwrite));
    struct fy_gpt_config model;
    FY_TRY(fy_runconf_model(o, &model));
    if (o->ssd != NULL)
        FY_TRY(fy_runconf_check_ssd(o->ssd));
    struct fy_staging *st = malloc(sizeof *st);
    FY_REQUIRE(st != NULL, -ENOMEM, "init: out of memory");
    int rc = fy_staging_begin(st, o->run_dir, o->ssd);
    if (rc < 0) {
        free(st);
        return rc;
    }
    const char *given_ssd = o->ssd;
    o->ssd = st->store; /* until st is freed */
    o->store_in_run_dir = given_ssd == NULL;
    char described[160];
    fy_gpt_config_describe(&model, described, sizeof described);
    fy_info("init: %s; seed %llu; store on %s", described, (unsigned long long)o->seed, o->ssd);
    struct fy_pool_region_spec regions[10];
    unsigned n;
    fy_train_regions(&model, 1, 1, FY_DTYPE_F32, NULL, 0, 1, FY_TRAIN_GRAD_SLOTS_MIN, 0, NULL,
                     regions, &n);
    struct fy_session s;
    struct fy_session_opts so = fy_runconf_session(o);
    rc = fy_session_open(&s, &so, regions, n, "model initialisation");
    struct fy_config *cfg = calloc(1, sizeof *cfg);
    if (rc == 0)
        rc = cfg ? staged_store_config(o, st, cfg) : -ENOMEM;
    static const char *const workers[] = {"io"};
    if (rc == 0)
        rc = fy_session_start(&s, cfg, workers, 1, so.ready_timeout_ms);
    if (rc == 0) {
        struct fy_exec x = fy_session_exec(&s);
        rc = fy_train_init_store(&x, s.pool, &model, o->seed, (unsigned)o->state_copies,
                                 o->timeout_s * 1000);
    }
    rc = fy_session_close(&s, rc);
    if (rc == 0) {
        fy_config_init(cfg);
        rc = fy_gpt_config_to(&model, cfg);
        if (rc == 0)
            rc = model_conf_set_store(cfg, o);
        if (rc == 0)
            rc = fy_config_setf(cfg, "seed", "%llu", (unsigned long long)o->seed);
        if (rc == 0)
            rc = fy_config_save(cfg, st->conf);
    }
    free(cfg);
    rc = finish_init(st, rc);
    if (rc == 0)
        fy_info("init: model written to the store at step 0 (%s/model.conf)", o->run_dir);
    o->ssd = given_ssd;
    free(st);
    return rc;
}
