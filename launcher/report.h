/* fuyou-launch report: charts of a run from its metrics (RUN/metrics.jsonl), drawn by gnuplot
 * (Debian's gnuplot-nox) as PNG files: the training and held-out loss over the steps, each
 * resource's busy seconds per step beside the step time, and the throughput (tokens/s, TFLOP/s). */
#ifndef FY_REPORT_H
#define FY_REPORT_H

/* Reads metrics_path and writes loss.png, busy.png and throughput.png (and the data and script
 * they were drawn from) into out_dir, created if missing; each PNG replaced atomically. Returns
 * the number of steps drawn, or -errno (said: no metrics, no gnuplot, a bad line). */
int fy_report_write(const char *metrics_path, const char *out_dir);

#endif
