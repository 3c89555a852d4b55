/* The residual add on the GPU (the contract is cu_residual.h), for the products whose epilogue
 * does not add it (FUYOU_CUDA_FUSE=0). */
#include "gpu_worker/cuda/cu_residual.h"

#include <errno.h>

/* Elementwise kernels: threads per block (grid-stride loops, so any n works with fy_cu_blocks). */
#define EW_THREADS 256

/* Not __restrict__: out may alias a or b. */
static __global__ void residual_forward_kernel(bf16 *out, const bf16 *a, const bf16 *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(fy_cu_ld(a, i) + fy_cu_ld(b, i));
}

int fy_cu_residual_forward(bf16 *out, const bf16 *a, const bf16 *b, size_t n, cudaStream_t stream)
{
    FY_REQUIRE(n > 0, -EINVAL, "residual forward: n=0");
    FY_REQUIRE(out && a && b, -EINVAL, "residual forward: NULL pointer");
    residual_forward_kernel<<<fy_cu_blocks(n, EW_THREADS), EW_THREADS, 0, stream>>>(out, a, b, n);
    FY_CUDA_LAUNCHED("residual_forward_kernel");
    return 0;
}
