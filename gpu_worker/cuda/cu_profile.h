/* Timing for the activation planner's profile of a block on the CUDA backend (struct
 * fy_block_profile): the medians of a few timed runs after a warm-up, the seconds between two
 * events, and the rates of the links between pinned host memory and the device. Used by cu_model
 * and by the families' profiles (cu_family.h's struct fy_cu_profiling). */
#ifndef FY_CU_PROFILE_H
#define FY_CU_PROFILE_H

#include <stddef.h>

#include "gpu_worker/backend_ops.h" /* struct fy_block_profile */
#include "gpu_worker/cuda/cu_common.h"

/* Events a profile records, and the timed runs it takes the median of (after one to warm up). */
#define FY_CU_PROFILE_EVENTS 3
#define FY_CU_PROFILE_REPS 3

/* The median of n values (sorted in place). */
double fy_cu_profile_median(double *v, int n);
/* The seconds between two events, once the later one has happened. */
int fy_cu_profile_elapsed(cudaEvent_t from, cudaEvent_t to, double *s);
/* The links' rates into out (h2d_Bps, d2h_Bps, duplex_Bps): copies of `bytes` between pinned `host`
 * and the device buffer `dev`, each way alone on its own stream (h2d, d2h), then both at once, half
 * the bytes each way (disjoint halves), from one start event on the idle `compute` stream to the
 * later of the two ends; the medians of FY_CU_PROFILE_REPS, timed with ev. */
int fy_cu_profile_links(cudaStream_t h2d, cudaStream_t d2h, cudaStream_t compute,
                        cudaEvent_t ev[FY_CU_PROFILE_EVENTS], char *host, char *dev, size_t bytes,
                        struct fy_block_profile *out);

#endif
