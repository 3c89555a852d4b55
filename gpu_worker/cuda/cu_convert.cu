/* Element type conversion on the GPU (the contract is cu_convert.h): f32 <-> bf16, for the host
 * interface's transfers and master weights. */
#include "gpu_worker/cuda/cu_convert.h"

#include <errno.h>

/* Elementwise kernels: threads per block (grid-stride loops, so any n works with fy_cu_blocks). */
#define EW_THREADS 256

static __global__ void f32_to_bf16_kernel(bf16 *__restrict__ out, const float *__restrict__ in,
                                          size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(in[i]);
}

static __global__ void bf16_to_f32_kernel(float *__restrict__ out, const bf16 *__restrict__ in,
                                          size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __bfloat162float(in[i]);
}

int fy_cu_f32_to_bf16(bf16 *out, const float *in, size_t n, cudaStream_t stream)
{
    FY_REQUIRE(n > 0, -EINVAL, "f32_to_bf16: n=0");
    FY_REQUIRE(out && in, -EINVAL, "f32_to_bf16: NULL pointer");
    f32_to_bf16_kernel<<<fy_cu_blocks(n, EW_THREADS), EW_THREADS, 0, stream>>>(out, in, n);
    FY_CUDA_LAUNCHED("f32_to_bf16_kernel");
    return 0;
}

int fy_cu_bf16_to_f32(float *out, const bf16 *in, size_t n, cudaStream_t stream)
{
    FY_REQUIRE(n > 0, -EINVAL, "bf16_to_f32: n=0");
    FY_REQUIRE(out && in, -EINVAL, "bf16_to_f32: NULL pointer");
    bf16_to_f32_kernel<<<fy_cu_blocks(n, EW_THREADS), EW_THREADS, 0, stream>>>(out, in, n);
    FY_CUDA_LAUNCHED("bf16_to_f32_kernel");
    return 0;
}
