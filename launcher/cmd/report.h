/* fuyou-launch report: charts of a run from its metrics (RUN/metrics.jsonl), drawn by gnuplot
 * (Debian's gnuplot-nox) as PNG files: the training and held-out loss over the steps (beside other
 * runs' where some are given, to compare them), each resource's busy seconds per step beside the
 * step time, and the throughput (tokens/s, TFLOP/s). */
#ifndef FY_REPORT_H
#define FY_REPORT_H

/* The most runs one report charts (the first and those it is compared with). */
#define FY_REPORT_MAX_RUNS 8

/* Reads run_dirs[i]/metrics.jsonl and writes loss.png, busy.png and throughput.png (and the data
 * and script they were drawn from: metrics.dat for the first run, metrics-I.dat for the others)
 * into out_dir, created with its missing parents where it is missing (those left empty by a
 * failure removed again); each PNG replaced atomically. loss.png draws every run's
 * training and held-out loss, titled by the last component of its directory; busy.png and
 * throughput.png the first run's. Returns the number of the first run's steps drawn, or -errno
 * (said: no metrics, no gnuplot, a bad line). With fy_stopsig installed a stop by signal ends it
 * (gnuplot too) with -EINTR, nothing said: what it wrote is removed, the charts before stay. */
int fy_report_write(const char *const *run_dirs, int nruns, const char *out_dir);

#endif
