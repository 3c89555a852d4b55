/* GELU on the GPU (the contract is cu_gelu.h): the tanh approximation GPT-2 uses, forward and
 * backward, computed in fp32 from bf16 and rounded once. Mirrors gpu_worker/cpu/cpu_gpt2.c. */
#include "gpu_worker/cuda/cu_gelu.h"

#include <errno.h>

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi), as in cpu_gpt2.c */
#define GELU_A 0.044715f

/* Elementwise kernels: threads per block (grid-stride loops, so any n works with fy_cu_blocks). */
#define EW_THREADS 256

static __global__ void gelu_forward_kernel(bf16 *out, const bf16 *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = fy_cu_ld(inp, i);
        out[i] = __float2bfloat16_rn(0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_A * x * x * x))));
    }
}

/* Not __restrict__: dinp may alias dout (each element is read before it is written, by the same
 * thread). */
static __global__ void gelu_backward_kernel(bf16 *dinp, const bf16 *inp, const bf16 *dout, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = fy_cu_ld(inp, i), dy = fy_cu_ld(dout, i);
        float th = tanhf(GELU_K * (x + GELU_A * x * x * x));
        float dth = (1.0f - th * th) * GELU_K * (1.0f + 3.0f * GELU_A * x * x);
        dinp[i] = __float2bfloat16_rn(dy * (0.5f * (1.0f + th) + 0.5f * x * dth));
    }
}

int fy_cu_gelu_forward(bf16 *out, const bf16 *inp, size_t n, cudaStream_t stream)
{
    FY_REQUIRE(n > 0, -EINVAL, "gelu forward: n=0");
    FY_REQUIRE(out && inp, -EINVAL, "gelu forward: NULL pointer");
    gelu_forward_kernel<<<fy_cu_blocks(n, EW_THREADS), EW_THREADS, 0, stream>>>(out, inp, n);
    FY_CUDA_LAUNCHED("gelu_forward_kernel");
    return 0;
}

int fy_cu_gelu_backward(bf16 *dinp, const bf16 *inp, const bf16 *dout, size_t n,
                        cudaStream_t stream)
{
    FY_REQUIRE(n > 0, -EINVAL, "gelu backward: n=0");
    FY_REQUIRE(dinp && inp && dout, -EINVAL, "gelu backward: NULL pointer");
    gelu_backward_kernel<<<fy_cu_blocks(n, EW_THREADS), EW_THREADS, 0, stream>>>(dinp, inp, dout,
                                                                                 n);
    FY_CUDA_LAUNCHED("gelu_backward_kernel");
    return 0;
}
