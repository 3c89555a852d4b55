/* RUN/metrics.jsonl of one train command: one JSON line per step, appended as the steps finish,
 * across the command's restarts from the last commit. A line that cannot be written (a full file
 * system, a quota, an I/O error) is not lost: it waits in memory, in order, and goes out before
 * the next line once there is room; the failure is said once, and the lines that went out late
 * once they have. Past FY_METRICS_PENDING_MAX bytes waiting, the run stops at a commit (the
 * caller asks fy_metrics_over_cap at each step boundary); what still waits when the command ends
 * is said as lost. */
#ifndef FY_METRICS_H
#define FY_METRICS_H

#include <stddef.h>
#include <stdint.h>

/* Lines kept in memory at most before the run stops: about 100 000 steps' lines (some 600 bytes
 * each), days of training on a real model, for a launcher whose other memory is the pool. */
#define FY_METRICS_PENDING_MAX ((size_t)64 << 20)

struct fy_metrics;

/* RUN/metrics.jsonl for appending (created by the first line that goes out); 0 or -errno (said).
 * The test hook FUYOU_TEST_METRICS_PENDING_MAX=BYTES sets the cap (said). */
int fy_metrics_open(struct fy_metrics **m, const char *run_dir);
/* The file's path. */
const char *fy_metrics_path(const struct fy_metrics *m);
/* Bytes waiting in memory past which fy_metrics_over_cap holds (FY_METRICS_PENDING_MAX unless
 * set; tests set less). */
void fy_metrics_set_cap(struct fy_metrics *m, size_t bytes);
/* Goes back to the commit at `step` (a run starting or restarting from it trains the later steps
 * again): the lines of later steps leave the file and memory. The file is cut where those lines
 * are its tail (no room needed on a full disk), else rewritten atomically. An incomplete last line
 * that this process did not write (a launcher killed mid-line) goes too, said. Returns how many
 * lines of steps after `step` went, or -errno (said). */
int fy_metrics_rollback(struct fy_metrics *m, uint64_t step);
/* Appends step's line (text without its line break): what waits goes first, then this line; what
 * the file does not take waits in memory. 0, or -ENOMEM (said). */
int fy_metrics_append(struct fy_metrics *m, uint64_t step, const char *line);
/* Bytes and lines waiting in memory. */
size_t fy_metrics_pending_bytes(const struct fy_metrics *m);
size_t fy_metrics_pending_lines(const struct fy_metrics *m);
/* Whether more than the cap waits: the run must stop at a commit. */
int fy_metrics_over_cap(const struct fy_metrics *m);
/* Says why training stopped after the commit at `committed` (over the cap); returns -ENOBUFS. */
int fy_metrics_stopped(const struct fy_metrics *m, uint64_t committed);
/* The end of the command, whose last commit is `committed`: the waiting lines of later steps go
 * (a resume trains those steps again), the rest is tried once more; lines still not written are
 * said as lost (how many, which steps) and an incomplete line of theirs is cut from the file.
 * Frees *m (NULL: nothing); returns 0, or the write's -errno where lines were lost. */
int fy_metrics_close(struct fy_metrics **m, uint64_t committed);

#endif
