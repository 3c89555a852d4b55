/* The restarts of one train command (--max-restarts, so many an hour): after a launch of the
 * workers failed, whether to start them again from the last commit, said either way. */
#ifndef FY_RESTART_H
#define FY_RESTART_H

#include <stdint.h>

#include "launcher/run/supervise.h"

struct fy_restart {
    double at[64]; /* when each restart within the last hour began */
    unsigned n;
    uint64_t max;             /* --max-restarts */
    const char *run_dir;      /* for the message that gives up */
    const volatile int *stop; /* set on the first SIGINT or SIGTERM: no restart then */
};

void fy_restart_init(struct fy_restart *r, uint64_t max, const char *run_dir,
                     const volatile int *stop);
/* After a launch of the workers (the profile's or training's) failed with rc, whether to start
 * them again (the caller counts a restart for the summary: fy_progress_restart), counted against
 * --max-restarts an hour, and said either way. A worker that died or
 * stopped answering is restarted, and so is state read back damaged from the SSD in the steps
 * (`stepping`: they had begun; the restart goes back to the last commit, which is checked whole
 * first). Before the steps, a worker that exited on its own is not: it said why, and a bad
 * configuration or a full disk would fail it again. `since`: when the launch began (seconds,
 * fy_monotonic_ns's clock). */
int fy_restart_after(struct fy_restart *r, int rc, int stepping, const struct fy_sup_fault *f,
                     double since);

#endif
