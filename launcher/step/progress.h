/* Training progress for people. On a terminal one status line stays at the bottom (step, loss,
 * tokens/s, TFLOP/s, GPU busy, ETA), updated every step, with the full step line in the log file;
 * elsewhere (a pipe, a file, CI) the full step line is logged as before. At the end a summary of
 * the run. One training run per process. */
#ifndef FY_PROGRESS_H
#define FY_PROGRESS_H

#include <stdint.h>

struct fy_progress_step {
    uint64_t step, total;
    uint64_t epoch, epochs; /* the step's epoch (1-based; 0: not said) and --epochs (0: none) */
    double fill;            /* the batch's positions that hold documents, over B x T */
    double loss, seconds, tokens, flops, gpu_busy_s;
    int have_eval;
    double eval;
};

/* One step done; `line` is its full log line's text. */
void fy_progress_step(const struct fy_progress_step *s, const char *line);
/* What the summary says of the batches (NULL or "": nothing): the packing, its fill, the documents
 * truncated. */
void fy_progress_data(const char *summary);
/* A restart from the last commit (counted for the summary). */
void fy_progress_restart(void);
/* The summary, and the status line taken away; nothing when no step was trained. */
void fy_progress_end(void);

#endif
