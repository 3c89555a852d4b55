/* The restarts of one train command: launcher/run/restart.h. */
#include <errno.h>
#include <stdio.h>

#include "common/base/check.h"
#include "common/ipc/desc.h"
#include "common/base/log.h"
#include "launcher/run/restart.h"

void fy_restart_init(struct fy_restart *r, uint64_t max, const char *run_dir,
                     const volatile int *stop)
{
    *r = (struct fy_restart){.max = max, .run_dir = run_dir, .stop = stop};
}

int fy_restart_after(struct fy_restart *r, int rc, int stepping, const struct fy_sup_fault *f,
                     double since)
{
    int worker = rc == -ECHILD || rc == -ETIMEDOUT, damage = stepping && fy_is_damage(rc);
    if (*r->stop || !(worker || damage) ||
        (worker && !stepping && f->worker[0] != 0 && !f->stuck && f->signal == 0))
        return 0;
    char what[128];
    if (damage)
        snprintf(what, sizeof what, "state read back from the SSD store was damaged (above)");
    else if (f->worker[0] == 0)
        snprintf(what, sizeof what, "a worker did not answer in time");
    else
        snprintf(what, sizeof what, "the %s worker %s", f->worker,
                 f->stuck ? "stopped answering (a request passed its deadline)" : "died");
    double now = fy_monotonic_ns() * 1e-9;
    unsigned recent = 0;
    for (unsigned i = 0; i < r->n; i++)
        if (now - r->at[i] < 3600)
            r->at[recent++] = r->at[i];
    r->n = recent;
    if (r->n >= r->max || r->n == sizeof r->at / sizeof r->at[0]) {
        fy_error("%s after %llu restart%s within the hour (--max-restarts %llu): giving up; find "
                 "the cause in %s/fuyou.log, then continue with fuyou-launch resume %s",
                 what, (unsigned long long)r->n, r->n == 1 ? "" : "s", (unsigned long long)r->max,
                 r->run_dir, r->run_dir);
        return 0;
    }
    r->at[r->n++] = now;
    fy_warn("restart %u: %s %.1f s into this attempt; going back to the last commit and starting "
            "the workers again",
            r->n, what, now - since);
    return 1;
}
