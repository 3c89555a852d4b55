/* fuyou-launch report: a run's metrics drawn into PNG charts (launcher/cmd/report.h). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "common/base/check.h"
#include "common/base/log.h"
#include "launcher/cmd/cmd.h"
#include "launcher/cmd/report.h"
#include "launcher/run/stopsig.h"

/* report: RUN/metrics.jsonl (and --compare's runs' on the loss chart) drawn into PNG charts in
 * --out (default RUN/report). */
int fy_cmd_report(struct fy_options *o)
{
    FY_TRY(fy_options_require(o->run_dir, "--run-dir", "report"));
    char out[PATH_MAX + 16], others[PATH_MAX * 4];
    if (o->out != NULL)
        snprintf(out, sizeof out, "%s", o->out);
    else
        snprintf(out, sizeof out, "%s/report", o->run_dir);
    const char *runs[FY_REPORT_MAX_RUNS] = {o->run_dir};
    int nruns = 1;
    if (o->compare != NULL) {
        FY_USAGE(strlen(o->compare) < sizeof others,
                 "report: --compare is too long: give fewer or shorter run directories");
        snprintf(others, sizeof others, "%s", o->compare);
        char *save = NULL;
        for (char *dir = strtok_r(others, ",", &save); dir != NULL;
             dir = strtok_r(NULL, ",", &save)) {
            FY_USAGE(nruns < FY_REPORT_MAX_RUNS,
                     "report: --compare %s: more than %d runs: chart at most %d beside --run-dir",
                     o->compare, FY_REPORT_MAX_RUNS - 1, FY_REPORT_MAX_RUNS - 1);
            runs[nruns++] = dir;
        }
    }
    FY_TRY(fy_stopsig_install()); /* a stop removes what it wrote (fy_report_write) */
    int steps = fy_report_write(runs, nruns, out);
    FY_TRY(steps);
    if (nruns > 1)
        fy_info("report: %d steps drawn into %s/loss.png (%d runs in all), busy.png and "
                "throughput.png",
                steps, out, nruns);
    else
        fy_info("report: %d steps drawn into %s/loss.png, busy.png and throughput.png", steps, out);
    return 0;
}

void fy_cmd_report_stopped(const struct fy_options *o, const char *removed)
{
    (void)removed; /* report makes no run directory */
    fy_warn("stopped by signal before report was done: the charts in %s%s are as they were (the "
            "data and script it wrote there are removed, and any directory made for --out); run "
            "it again",
            o->out != NULL       ? o->out
            : o->run_dir != NULL ? o->run_dir
                                 : "RUN",
            o->out != NULL ? "" : "/report");
}
