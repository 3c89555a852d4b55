/* The status line and summary of a training run (launcher/step/progress.h). */
#include "launcher/step/progress.h"

#include <stdio.h>

#include "common/log.h"

static struct {
    uint64_t first, last, steps;
    double seconds, tokens, flops, gpu_busy_s, recent_s, fill;
    char data[256];
    double first_loss, last_loss, last_eval;
    int have_eval, restarts;
} run;

static void format_eta(double s, char *out, size_t len)
{
    if (s >= 3600)
        snprintf(out, len, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
    else if (s >= 60)
        snprintf(out, len, "%dm%02ds", (int)(s / 60), (int)s % 60);
    else
        snprintf(out, len, "%.0fs", s);
}

void fy_progress_step(const struct fy_progress_step *s, const char *line)
{
    if (run.steps == 0) {
        run.first = s->step;
        run.first_loss = s->loss;
        run.recent_s = s->seconds;
    }
    run.steps++;
    run.last = s->step;
    run.last_loss = s->loss;
    run.seconds += s->seconds;
    run.tokens += s->tokens;
    run.flops += s->flops;
    run.gpu_busy_s += s->gpu_busy_s;
    run.fill += s->fill;
    run.recent_s = 0.8 * run.recent_s + 0.2 * s->seconds; /* the ETA follows the recent pace */
    if (s->have_eval) {
        run.have_eval = 1;
        run.last_eval = s->eval;
    }
    char eta[32], eval[40] = "", epoch[48] = "", status[320];
    format_eta(run.recent_s * (double)(s->total > s->step ? s->total - s->step : 0), eta,
               sizeof eta);
    if (run.have_eval)
        snprintf(eval, sizeof eval, " (held-out %.4f)", run.last_eval);
    if (s->epoch > 0 && s->epochs > 0)
        snprintf(epoch, sizeof epoch, " | epoch %llu/%llu", (unsigned long long)s->epoch,
                 (unsigned long long)s->epochs);
    else if (s->epoch > 0)
        snprintf(epoch, sizeof epoch, " | epoch %llu", (unsigned long long)s->epoch);
    snprintf(
        status, sizeof status,
        "step %llu/%llu%s | loss %.4f%s | %.0f tok/s | %.4g TFLOP/s | GPU busy %.0f%% | ETA %s",
        (unsigned long long)s->step, (unsigned long long)s->total, epoch, s->loss, eval,
        s->seconds > 0 ? s->tokens / s->seconds : 0.0,
        s->seconds > 0 ? s->flops / s->seconds * 1e-12 : 0.0,
        s->seconds > 0 ? 100.0 * s->gpu_busy_s / s->seconds : 0.0, eta);
    if (fy_log_status(status))
        fy_log_file_info("%s", line);
    else
        fy_info("%s", line);
}

void fy_progress_data(const char *summary)
{
    snprintf(run.data, sizeof run.data, "%s", summary != NULL ? summary : "");
}

void fy_progress_restart(void) { run.restarts++; }

void fy_progress_end(void)
{
    fy_log_status(NULL);
    if (run.steps == 0)
        return;
    char eval[48] = "", data[320] = "";
    if (run.have_eval)
        snprintf(eval, sizeof eval, "; held-out loss %.4f", run.last_eval);
    if (run.data[0])
        snprintf(data, sizeof data, "; %s, fill %.1f%%", run.data,
                 100.0 * run.fill / (double)run.steps);
    fy_info("summary: steps %llu to %llu (%llu trained%s) in %.1f s: %.0f tokens/s, %.4g TFLOP/s, "
            "GPU busy %.0f%%; loss %.4f -> %.4f%s%s; %d restart%s",
            (unsigned long long)run.first, (unsigned long long)run.last,
            (unsigned long long)run.steps,
            run.steps > run.last - run.first + 1 ? ", some twice after a restart" : "", run.seconds,
            run.seconds > 0 ? run.tokens / run.seconds : 0.0,
            run.seconds > 0 ? run.flops / run.seconds * 1e-12 : 0.0,
            run.seconds > 0 ? 100.0 * run.gpu_busy_s / run.seconds : 0.0, run.first_loss,
            run.last_loss, eval, data, run.restarts, run.restarts == 1 ? "" : "s");
}
