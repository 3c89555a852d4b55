/* fuyou-launch selftest: the data path SSD -> pool -> gpu -> AdamW -> SSD on a synthetic model
 * (launcher/selftest.h), through the three workers. */
#include <errno.h>
#include <stdlib.h>

#include "common/check.h"
#include "common/log.h"
#include "launcher/cmd.h"
#include "launcher/runconf.h"
#include "launcher/selftest.h"
#include "launcher/session.h"

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
    struct fy_session s;
    struct fy_session_opts so = fy_runconf_session(o);
    int rc = fy_session_open(&s, &so, regions, 3, "the self-test");
    struct fy_config *cfg = calloc(1, sizeof *cfg);
    if (rc == 0)
        rc = cfg ? fy_runconf_base(o, cfg, 1) : -ENOMEM;
    /* the self-test's AdamW reference uses beta2 = 0.999 */
    if (rc == 0)
        rc = fy_config_set(cfg, "beta2", "0.999");
    static const char *const workers[] = {"gpu", "io", "opt"};
    if (rc == 0)
        rc = fy_session_start(&s, cfg, workers, 3, so.ready_timeout_ms);
    if (rc == 0) {
        struct fy_selftest_opts to = {.params = o->params, .steps = (unsigned)o->steps,
                                      .seed = o->seed, .grad_dtype = o->grad_dtype,
                                      .timeout_ms = o->timeout_s * 1000};
        rc = fy_selftest_run(s.sup, s.pool, &to);
    }
    free(cfg);
    return fy_session_close(&s, rc);
}
