/* The CUDA backend's group of gpu workers through NCCL (contract: cu_ranks.h). Every NCCL call is
 * checked and reported with NCCL's own account of the failure. Built without NCCL, the same
 * functions refuse with the way to get it. */
#include "gpu_worker/cuda/cu_ranks.h"

#include <stdlib.h>
#include <string.h>

#ifdef FY_HAVE_NCCL
#include <nccl.h>

struct fy_cu_ranks {
    ncclComm_t comm;
    int rank, ranks;
};

/* An NCCL call that returns ncclResult_t: logged with NCCL's last message, -EIO returned. */
#define FY_NCCL(call, ...)                                                                         \
    do {                                                                                           \
        ncclResult_t fy_nccl_rc_ = (call);                                                         \
        if (fy_nccl_rc_ != ncclSuccess) {                                                          \
            char fy_what_[256];                                                                    \
            snprintf(fy_what_, sizeof fy_what_, __VA_ARGS__);                                      \
            const char *fy_last_ = ncclGetLastError(NULL);                                         \
            fy_error("%s: NCCL: %s%s%s (NCCL_DEBUG=WARN in the environment says more)", fy_what_,  \
                     ncclGetErrorString(fy_nccl_rc_), fy_last_ && *fy_last_ ? ": " : "",           \
                     fy_last_ ? fy_last_ : "");                                                    \
            return -EIO;                                                                           \
        }                                                                                          \
    } while (0)

int fy_cu_ranks_built(void) { return 1; }

int fy_cu_ranks_id(void *id, size_t len)
{
    ncclUniqueId u;
    FY_REQUIRE(len >= sizeof u, -ENOSPC,
               "cu_ranks: the NCCL group id takes %zu bytes, %zu given", sizeof u, len);
    FY_NCCL(ncclGetUniqueId(&u), "making the id of the gpu workers' NCCL group");
    memcpy(id, &u, sizeof u);
    return (int)sizeof u;
}

int fy_cu_ranks_new(struct fy_cu_ranks **out, int device, int rank, int ranks, const void *id,
                    size_t len)
{
    *out = NULL;
    ncclUniqueId u;
    FY_REQUIRE(ranks >= 1 && rank >= 0 && rank < ranks && len == sizeof u, -EINVAL,
               "cu_ranks: joining as rank %d of %d with an id of %zu bytes (NCCL's take %zu)",
               rank, ranks, len, sizeof u);
    memcpy(&u, id, sizeof u);
    FY_CUDA(cudaSetDevice(device), "selecting CUDA device %d for the NCCL group", device);
    struct fy_cu_ranks *r = (struct fy_cu_ranks *)calloc(1, sizeof *r);
    if (r == NULL)
        return -ENOMEM;
    ncclResult_t rc = ncclCommInitRank(&r->comm, ranks, u, rank);
    if (rc != ncclSuccess) {
        const char *last = ncclGetLastError(NULL);
        fy_error("gpu worker %d of %d: joining the NCCL group failed: NCCL: %s%s%s (every gpu "
                 "worker must join with rank 0's id; NCCL_DEBUG=WARN in the environment says "
                 "more)",
                 rank, ranks, ncclGetErrorString(rc), last && *last ? ": " : "",
                 last ? last : "");
        free(r);
        return -EIO;
    }
    r->rank = rank;
    r->ranks = ranks;
    *out = r;
    return 0;
}

void fy_cu_ranks_destroy(struct fy_cu_ranks **rp)
{
    if (rp == NULL || *rp == NULL)
        return;
    struct fy_cu_ranks *r = *rp;
    ncclResult_t rc = ncclCommDestroy(r->comm);
    if (rc != ncclSuccess)
        fy_warn("gpu worker %d of %d: leaving the NCCL group: NCCL: %s", r->rank, r->ranks,
                ncclGetErrorString(rc));
    free(r);
    *rp = NULL;
}

int fy_cu_ranks_rank(const struct fy_cu_ranks *r) { return r->rank; }

int fy_cu_ranks_count(const struct fy_cu_ranks *r) { return r->ranks; }

int fy_cu_ranks_sum(const struct fy_cu_ranks *r, float *buf, size_t n, cudaStream_t stream)
{
    FY_NCCL(ncclReduce(buf, buf, n, ncclFloat32, ncclSum, 0, r->comm, stream),
            "summing %zu gradient values over %d gpu workers (rank %d)", n, r->ranks, r->rank);
    return 0;
}

#else /* no NCCL in this build */

struct fy_cu_ranks {
    int rank, ranks;
};

/* -ENOTSUP, said: the build has no NCCL. */
static int no_nccl(void)
{
    fy_error("this build of the CUDA backend has no NCCL, which sums the gradients of several "
             "gpu workers: install libnccl-dev (Debian) or pip install nvidia-nccl-cu12, or set "
             "NCCL_HOME, and make again");
    return -ENOTSUP;
}

int fy_cu_ranks_built(void) { return 0; }

int fy_cu_ranks_id(void *id, size_t len) { return no_nccl(); }

int fy_cu_ranks_new(struct fy_cu_ranks **out, int device, int rank, int ranks, const void *id,
                    size_t len)
{
    *out = NULL;
    return no_nccl();
}

void fy_cu_ranks_destroy(struct fy_cu_ranks **rp)
{
    if (rp != NULL)
        *rp = NULL;
}

int fy_cu_ranks_rank(const struct fy_cu_ranks *r) { return r->rank; }

int fy_cu_ranks_count(const struct fy_cu_ranks *r) { return r->ranks; }

int fy_cu_ranks_sum(const struct fy_cu_ranks *r, float *buf, size_t n, cudaStream_t stream)
{
    return no_nccl();
}

#endif
