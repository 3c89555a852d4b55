/* Charts of a run's metrics through gnuplot (launcher/cmd/report.h). */
#include "launcher/cmd/report.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/base/check.h"
#include "common/base/fsutil.h"
#include "launcher/run/stopsig.h"

/* The columns of the data file, in order: the metrics line's keys (NaN where absent). */
static const char *const columns[] = {
    "step",       "loss",       "eval_loss",  "tokens_per_s",    "tflops",           "step_s",
    "busy_gpu_s", "busy_h2d_s", "busy_d2h_s", "busy_ssd_read_s", "busy_ssd_write_s", "busy_opt_s"};
#define NCOLS (sizeof columns / sizeof columns[0])

/* metrics.jsonl -> a whitespace table for gnuplot; the number of steps. */
static int write_data(const char *metrics_path, const char *data_path)
{
    FILE *in = fopen(metrics_path, "r");
    FY_SYS(in == NULL ? -1 : 0, "report: cannot open %s (a run's metrics: train writes them)",
           metrics_path);
    FILE *out = fopen(data_path, "w");
    if (out == NULL) {
        int e = errno;
        fclose(in);
        fy_error("report: cannot create %s: %s", data_path, strerror(e));
        return -e;
    }
    fprintf(out, "#");
    for (size_t i = 0; i < NCOLS; i++)
        fprintf(out, " %s", columns[i]);
    fprintf(out, "\n");
    char *line = NULL;
    size_t cap = 0;
    int steps = 0, rc = 0, lineno = 0;
    while (rc == 0 && getline(&line, &cap, in) >= 0) {
        if (++lineno % 4096 == 0) /* a stop (fy_stopsig): the caller removes what it wrote */
            rc = fy_stopsig_check();
        if (rc != 0)
            break;
        cJSON *j = cJSON_Parse(line);
        const cJSON *step = j != NULL ? cJSON_GetObjectItemCaseSensitive(j, "step") : NULL;
        if (!cJSON_IsNumber(step)) {
            fy_error("report: %s line %d is not a metrics line (JSON with a \"step\")",
                     metrics_path, lineno);
            rc = -EBADMSG;
        }
        for (size_t i = 0; rc == 0 && i < NCOLS; i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, columns[i]);
            fprintf(out, "%s%.9g", i ? " " : "", cJSON_IsNumber(v) ? v->valuedouble : NAN);
        }
        if (rc == 0) {
            fprintf(out, "\n");
            steps++;
        }
        cJSON_Delete(j);
    }
    free(line);
    fclose(in);
    if (fclose(out) != 0 && rc == 0)
        rc = -errno;
    FY_REQUIRE(rc != 0 || steps > 0, -ENODATA, "report: %s has no steps yet", metrics_path);
    return rc < 0 ? rc : steps;
}

/* The loss chart's plot command: one run's training and held-out loss, or with several runs each
 * run's, in one colour a run, titled by the run's name. */
static void write_loss_plot(FILE *f, const char *const *data, const char *const *names, int nruns)
{
    if (nruns == 1) {
        fprintf(f,
                "plot '%s' using 1:2 with lines lw 2 title 'training', "
                "'' using 1:3 with linespoints pt 7 lw 2 title 'held-out'\n",
                data[0]);
        return;
    }
    fprintf(f, "plot ");
    for (int i = 0; i < nruns; i++)
        fprintf(f,
                "%s'%s' using 1:2 with lines lw 1 lc %d title '%s training', "
                "'' using 1:3 with linespoints pt 7 lw 2 lc %d title '%s held-out'",
                i ? ", " : "", data[i], i + 1, names[i], i + 1, names[i]);
    fprintf(f, "\n");
}

static int write_script(const char *path, const char *dir, const char *const *data,
                        const char *const *names, int nruns)
{
    FILE *f = fopen(path, "w");
    FY_SYS(f == NULL ? -1 : 0, "report: cannot create %s", path);
    fprintf(f,
            "set terminal pngcairo size 1000,600 font 'sans,10'\n"
            "set datafile missing NaN\n"
            "set grid\n"
            "set key outside right top\n"
            "set xlabel 'step'\n"
            "set output '%s/loss.png.tmp'\n"
            "set title 'loss'\n"
            "set ylabel 'cross-entropy'\n",
            dir);
    write_loss_plot(f, data, names, nruns);
    fprintf(f,
            "set output '%s/busy.png.tmp'\n"
            "set title 'where each step''s time goes: busy seconds per resource%s%s'\n"
            "set ylabel 'seconds'\n"
            "plot '%s' using 1:6 with lines lw 3 lc rgb 'black' title 'step', "
            "'' using 1:7 with lines lw 2 title 'GPU compute', "
            "'' using 1:8 with lines title 'PCIe to the GPU', "
            "'' using 1:9 with lines title 'PCIe from the GPU', "
            "'' using 1:10 with lines title 'SSD read', "
            "'' using 1:11 with lines title 'SSD write', "
            "'' using 1:12 with lines title 'AdamW'\n"
            "set output '%s/throughput.png.tmp'\n"
            "set title 'throughput%s%s'\n"
            "set ylabel 'tokens/s'\n"
            "set y2label 'model TFLOP/s'\n"
            "set ytics nomirror\n"
            "set y2tics\n"
            "plot '%s' using 1:4 with lines lw 2 axes x1y1 title 'tokens/s', "
            "'' using 1:5 with lines lw 2 axes x1y2 title 'TFLOP/s'\n"
            "set output\n",
            dir, nruns > 1 ? ": " : "", nruns > 1 ? names[0] : "", data[0], dir,
            nruns > 1 ? ": " : "", nruns > 1 ? names[0] : "", data[0]);
    FY_SYS(fclose(f), "report: writing %s", path);
    return 0;
}

/* A run's name in the charts: the last component of its directory. */
static void run_name(const char *run_dir, char *out, size_t len)
{
    size_t end = strlen(run_dir);
    while (end > 1 && run_dir[end - 1] == '/')
        end--;
    size_t start = end;
    while (start > 0 && run_dir[start - 1] != '/')
        start--;
    snprintf(out, len, "%.*s", (int)(end - start), run_dir + start);
}

static int draw(const char *const *run_dirs, int nruns, const char *out_dir);

/* The charts draw makes, each NAME.png in out_dir (through NAME.png.tmp). */
static const char *const charts[] = {"loss", "busy", "throughput"};
#define NCHARTS (sizeof charts / sizeof charts[0])

/* Run i's data file in out_dir: metrics.dat for the first, metrics-I.dat for the others. */
static void data_path(const char *out_dir, int i, char *path, size_t len)
{
    if (i == 0)
        snprintf(path, len, "%s/metrics.dat", out_dir);
    else
        snprintf(path, len, "%s/metrics-%d.dat", out_dir, i);
}

/* What draw writes in out_dir for `nruns` runs: the data files, the script and the charts'
 * temporary files; removed where a stop cuts it short (the charts before stay as they were). */
static void remove_drawn(const char *out_dir, int nruns)
{
    char path[PATH_MAX + 32];
    for (int i = 0; i < nruns; i++) {
        data_path(out_dir, i, path, sizeof path);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/charts.gnuplot", out_dir);
    unlink(path);
    for (size_t i = 0; i < NCHARTS; i++) {
        snprintf(path, sizeof path, "%s/%s.png.tmp", out_dir, charts[i]);
        unlink(path);
    }
}

/* gnuplot's exit status; a stop (fy_stopsig) while it draws ends it too: -EINTR. */
static int wait_gnuplot(pid_t pid, int *status)
{
    int stopping = 0;
    for (;;) {
        if (waitpid(pid, status, 0) == pid)
            return stopping || fy_stopsig_raised() ? -EINTR : 0;
        FY_SYS(errno == EINTR ? 0 : -1, "report: waiting for gnuplot");
        if (fy_stopsig_raised() && !stopping) /* a SIGTERM reaches the launcher alone */
            stopping = kill(pid, SIGTERM) == 0 || errno == ESRCH;
    }
}

int fy_report_write(const char *const *run_dirs, int nruns, const char *out_dir)
{
    FY_REQUIRE(nruns >= 1 && nruns <= FY_REPORT_MAX_RUNS, -EINVAL,
               "report: %d runs given: chart 1 to %d at a time", nruns, FY_REPORT_MAX_RUNS);
    FY_USAGE(strchr(out_dir, '\'') == NULL,
             "report: %s: a directory whose name has a single quote cannot be given to gnuplot: "
             "pass --out another",
             out_dir);
    struct fy_made_dirs made;
    FY_TRY(fy_mkdirs(out_dir, 0755, "the report's directory", &made));
    int steps = draw(run_dirs, nruns, out_dir);
    if (steps == -EINTR)
        remove_drawn(out_dir, nruns);
    if (steps < 0)
        fy_made_dirs_undo(&made, NULL, 0);
    return steps;
}

/* fy_report_write in out_dir, which is there. */
static int draw(const char *const *run_dirs, int nruns, const char *out_dir)
{
    char data[FY_REPORT_MAX_RUNS][PATH_MAX], names[FY_REPORT_MAX_RUNS][256], script[PATH_MAX];
    const char *data_of[FY_REPORT_MAX_RUNS], *name_of[FY_REPORT_MAX_RUNS];
    int steps = 0;
    for (int i = 0; i < nruns; i++) {
        run_name(run_dirs[i], names[i], sizeof names[i]);
        FY_REQUIRE(strchr(names[i], '\'') == NULL, -EINVAL,
                   "report: %s: a run whose name has a single quote cannot be charted by gnuplot: "
                   "rename its directory",
                   run_dirs[i]);
        data_path(out_dir, i, data[i], sizeof data[i]);
        char metrics[PATH_MAX + 16];
        snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run_dirs[i]);
        int n = write_data(metrics, data[i]);
        FY_TRY(n);
        FY_TRY(fy_stopsig_check());
        if (i == 0)
            steps = n;
        data_of[i] = data[i];
        name_of[i] = names[i];
    }
    snprintf(script, sizeof script, "%s/charts.gnuplot", out_dir);
    FY_TRY(write_script(script, out_dir, data_of, name_of, nruns));
    pid_t pid = fork();
    FY_SYS(pid, "report: fork");
    if (pid == 0) {
        execlp("gnuplot", "gnuplot", script, (char *)NULL);
        _exit(127);
    }
    int status;
    FY_TRY(wait_gnuplot(pid, &status));
    FY_REQUIRE(!(WIFEXITED(status) && WEXITSTATUS(status) == 127), -ENOENT,
               "report: gnuplot is not installed: install the Debian package gnuplot-nox");
    FY_REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0, -EIO,
               "report: gnuplot failed on %s (its message is above)", script);
    for (size_t i = 0; i < NCHARTS; i++) {
        char tmp[PATH_MAX + 16], png[PATH_MAX + 16];
        snprintf(png, sizeof png, "%s/%s.png", out_dir, charts[i]);
        snprintf(tmp, sizeof tmp, "%s.tmp", png);
        FY_SYS(rename(tmp, png), "report: cannot rename %s to %s", tmp, png);
    }
    return steps;
}
