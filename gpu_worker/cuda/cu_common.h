/* Shared definitions of the CUDA backend's kernels: the bf16 type, the CUDA error check that logs
 * what failed and returns -EIO, launch-size helpers, and the device helpers the elementwise and row
 * kernels share. C++ (nvcc) only. */
#ifndef FY_CU_COMMON_H
#define FY_CU_COMMON_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>

#include "common/base/check.h"
#include "common/base/log.h"

typedef __nv_bfloat16 bf16;

#define FY_CUDA(call, ...)                                                                         \
    do {                                                                                           \
        cudaError_t fy_cuda_err_ = (call);                                                         \
        if (fy_cuda_err_ != cudaSuccess) {                                                         \
            char fy_what_[256];                                                                    \
            snprintf(fy_what_, sizeof fy_what_, __VA_ARGS__);                                      \
            fy_error("%s: CUDA: %s (%s)", fy_what_, cudaGetErrorString(fy_cuda_err_),              \
                     cudaGetErrorName(fy_cuda_err_));                                              \
            return -EIO;                                                                           \
        }                                                                                          \
    } while (0)

/* After a kernel launch: a launch error (bad configuration) is reported where it happened. */
#define FY_CUDA_LAUNCHED(what) FY_CUDA(cudaGetLastError(), "launching %s", what)

static inline unsigned fy_cu_blocks(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 65535u * 32u ? (b ? b : 1) : 65535u * 32u);
}

/* Element i of a bf16 array, as fp32. */
static __device__ __forceinline__ float fy_cu_ld(const bf16 *p, size_t i)
{
    return __bfloat162float(p[i]);
}

/* Sum over the 32 lanes of a full warp; every lane gets the same bits (the xor butterfly: IEEE
 * addition is commutative, so each lane adds the same pairs in the same order). */
static __device__ __forceinline__ float fy_cu_warp_sum(float v)
{
    for (int m = 16; m > 0; m >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

#endif
