/* fuyou-launch report: a run's metrics drawn into PNG charts (launcher/report.h). */
#include <limits.h>
#include <stdio.h>

#include "common/check.h"
#include "common/log.h"
#include "launcher/cmd.h"
#include "launcher/report.h"

/* report: RUN/metrics.jsonl drawn into PNG charts in --out (default RUN/report). */
int fy_cmd_report(struct fy_options *o)
{
    FY_TRY(fy_options_require(o->run_dir, "--run-dir", "report"));
    char metrics[PATH_MAX + 16], out[PATH_MAX + 16];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", o->run_dir);
    if (o->out != NULL)
        snprintf(out, sizeof out, "%s", o->out);
    else
        snprintf(out, sizeof out, "%s/report", o->run_dir);
    int steps = fy_report_write(metrics, out);
    FY_TRY(steps);
    fy_info("report: %d steps drawn into %s/loss.png, busy.png and throughput.png", steps, out);
    return 0;
}
