/* fuyou-launch selftest: the data path SSD -> pool -> gpu -> AdamW -> SSD on a synthetic model
 * (launcher/cmd/selftest.h), through the three workers. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/base/check.h"
#include "common/base/log.h"
#include "io_worker/store.h"
#include "launcher/cmd/cmd.h"
#include "launcher/cli/runconf.h"
#include "launcher/cmd/selftest.h"
#include "launcher/run/session.h"

int fy_cmd_selftest(struct fy_options *o)
{
    FY_TRY(fy_options_require(o->run_dir, "--run-dir", "selftest"));
    FY_TRY(fy_options_require(o->ssd, "--ssd", "selftest"));
    FY_TRY(fy_runconf_check_ssd(o->ssd));
    FY_USAGE(o->params > 0 && o->steps > 0, "--params and --steps must be positive");
    struct fy_selftest_layout layout;
    fy_selftest_layout(o->params, o->grad_dtype, &layout);
    struct fy_pool_region_spec regions[3];
    fy_selftest_regions(&layout, regions);
    fy_info("plan: %llu parameters, %llu steps; store on %s", (unsigned long long)o->params,
            (unsigned long long)o->steps, o->ssd);
    static const char *const workers[] = {"gpu", "io", "opt"};
    struct fy_session s;
    struct fy_session_opts so = fy_runconf_session(o);
    struct fy_config *cfg = calloc(1, sizeof *cfg);
    int rc;
    FY_TRY_OUT(rc, fy_session_open(&s, &so, regions, 3, "the self-test"));
    FY_TRY_OUT(rc, cfg ? fy_runconf_base(o, cfg, 1) : -ENOMEM);
    /* the self-test's AdamW reference uses beta2 = 0.999 */
    FY_TRY_OUT(rc, fy_config_set(cfg, "beta2", "0.999"));
    FY_TRY_OUT(rc, fy_session_start(&s, cfg, workers, 3, so.ready_timeout_ms));
    struct fy_selftest_opts to = {.params = o->params,
                                  .steps = (unsigned)o->steps,
                                  .seed = o->seed,
                                  .grad_dtype = o->grad_dtype,
                                  .timeout_ms = o->timeout_s * 1000};
    rc = fy_selftest_run(s.sup, s.pool, &to);
out:
    free(cfg);
    return fy_session_close(&s, rc);
}

void fy_cmd_selftest_stopped(const struct fy_options *o, const char *removed)
{
    char first[PATH_MAX] = "", data[PATH_MAX + 32];
    if (o->ssd != NULL)
        snprintf(first, sizeof first, "%.*s", (int)strcspn(o->ssd, ","), o->ssd);
    snprintf(data, sizeof data, "%s/%s", first, FY_STORE_DATA_NAME);
    int store_left = first[0] != 0 && access(data, F_OK) == 0;
    fy_warn("stopped by signal before the self-test was done%s%s%s%s: run it again%s",
            removed[0] ? " (removed " : "", removed, removed[0] ? ", which it had created)" : "",
            store_left ? "; its store stays in the --ssd directory" : "",
            store_left ? " with --overwrite" : "");
}
