/* Deterministic reductions for the CUDA kernels (cu_attention, cu_head): over a warp by the xor
 * butterfly, over a block through shared memory in warp order, so every thread gets the same bits
 * on every run. C++ (nvcc) only. */
#ifndef FY_CU_REDUCE_H
#define FY_CU_REDUCE_H

#include <math.h>

#include "gpu_worker/cuda/cu_common.h"

struct fy_op_sum {
    __device__ static float id() { return 0.0f; }
    __device__ static float op(float a, float b) { return a + b; }
};
struct fy_op_max {
    __device__ static float id() { return -INFINITY; }
    __device__ static float op(float a, float b) { return fmaxf(a, b); }
};

/* All 32 lanes get the reduction (xor butterfly: a fixed order). */
template <class Op> __device__ float warp_reduce(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = Op::op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Every thread of the block gets the reduction; sh holds at least 33 floats. Called by all threads
 * of the block (uniform control flow). */
template <class Op> __device__ float block_reduce(float v, float *sh)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    v = warp_reduce<Op>(v);
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < nwarps ? sh[lane] : Op::id();
        w = warp_reduce<Op>(w);
        if (lane == 0)
            sh[32] = w;
    }
    __syncthreads();
    float r = sh[32];
    __syncthreads(); /* sh may be reused right after */
    return r;
}

#endif
