/* The CUDA backend's group of gpu workers (--gpus N) through NCCL: rank 0 makes the group's id,
 * every worker joins as its rank on its device, and a gradient on the device is summed over the
 * ranks into rank 0's copy (ncclReduce, in place), queued on a stream like a kernel. Every rank
 * must make the same calls in the same order: each one waits on the device for the others.
 * Without NCCL in the build (FY_HAVE_NCCL unset) fy_cu_ranks_built is 0 and the others refuse,
 * saying so; the backend then leaves its model_rank_id and model_ranks out. */
#ifndef FY_CU_RANKS_H
#define FY_CU_RANKS_H

#include <stddef.h>

#include "gpu_worker/cuda/cu_common.h"

struct fy_cu_ranks;

/* 1 when this build has NCCL. */
int fy_cu_ranks_built(void);
/* A new group's id (ncclGetUniqueId) into id (at most len bytes; -ENOSPC, said, where it does
 * not fit); returns its length (NCCL_UNIQUE_ID_BYTES, 128). Rank 0 makes it and hands it to the
 * others. */
int fy_cu_ranks_id(void *id, size_t len);
/* Joins the group of id as `rank` of `ranks` on CUDA device `device` (ncclCommInitRank: waits
 * until every rank has joined). -EINVAL (said) for a rank outside 0..ranks-1 or an id of another
 * length; -EIO (said) where NCCL fails. */
int fy_cu_ranks_new(struct fy_cu_ranks **out, int device, int rank, int ranks, const void *id,
                    size_t len);
/* Leaves the group (ncclCommDestroy) once the work queued on the device is done. */
void fy_cu_ranks_destroy(struct fy_cu_ranks **r);
int fy_cu_ranks_rank(const struct fy_cu_ranks *r);
int fy_cu_ranks_count(const struct fy_cu_ranks *r);
/* Queued on stream: buf [n] f32 of rank 0 becomes the sum of every rank's buf, in NCCL's order
 * (fixed for a group, so the same inputs give the same bits); the other ranks' buf are left as
 * they were. */
int fy_cu_ranks_sum(const struct fy_cu_ranks *r, float *buf, size_t n, cudaStream_t stream);

#endif
