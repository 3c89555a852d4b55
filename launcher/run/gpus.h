/* Several gpu workers (--gpus N): an executor over the workers' own that sends each request for
 * "gpu" to every rank's worker (gpu, gpu1, ..., named by their rank) and answers it once all have:
 * the same descriptors, each worker computing its share of the batch and the gradients summed in
 * rank order (gpu_worker/ranks). A profile goes to rank 0 alone. */
#ifndef FY_GPUS_H
#define FY_GPUS_H

#include "launcher/run/exec.h"

/* the planner's FY_PLAN_RANKS_MAX (launcher/cli/runconf.c checks that they agree) */
#define FY_GPUS_MAX 8

struct fy_gpus;

/* An executor over `inner` for `ranks` gpu workers (1..FY_GPUS_MAX; 1 passes everything on). */
int fy_gpus_new(struct fy_gpus **out, const struct fy_exec *inner, int ranks);
void fy_gpus_destroy(struct fy_gpus **g);
struct fy_exec fy_gpus_exec(struct fy_gpus *g);
/* The worker name of rank r: "gpu" for 0, else "gpuR", into buf. */
void fy_gpus_worker_name(int rank, char *buf, size_t len);

#endif
