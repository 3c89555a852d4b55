/* SwiGLU on the GPU (the contract is cu_swiglu.h): Llama's MLP activation silu(gate) * up over the
 * fused gate | up product, forward and backward, fp32 arithmetic rounded once to bf16. Mirrors the
 * fp32 CPU reference gpu_worker/cpu/cpu_llama.c. */
#include "gpu_worker/cuda/cu_swiglu.h"

#include <errno.h>
#include <math.h>

/* Elementwise kernels: threads per block (grid-stride loops). */
#define EW_THREADS 256

static __global__ void swiglu_forward_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ gu,
                                             size_t n, int I)
{
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        size_t at = k / I * 2 * I + k % I; /* the gate of element k; its up is I further */
        float g = fy_cu_ld(gu, at), u = fy_cu_ld(gu, at + I);
        out[k] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
    }
}

static __global__ void swiglu_backward_kernel(bf16 *__restrict__ dgu, const bf16 *__restrict__ dout,
                                              const bf16 *__restrict__ gu, size_t n, int I)
{
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        size_t at = k / I * 2 * I + k % I;
        float g = fy_cu_ld(gu, at), u = fy_cu_ld(gu, at + I), d = fy_cu_ld(dout, k);
        float e = 1.0f + expf(-g), s = 1.0f / e;
        dgu[at + I] = __float2bfloat16_rn(d * (g / e));
        dgu[at] = __float2bfloat16_rn(d * u * (s * (1.0f + g * (1.0f - s))));
    }
}

int fy_cu_swiglu_forward(bf16 *out, const bf16 *gu, int N, int I, cudaStream_t stream)
{
    FY_REQUIRE(N > 0 && I > 0, -EINVAL, "swiglu forward: bad shape N=%d I=%d", N, I);
    FY_REQUIRE(out && gu, -EINVAL, "swiglu forward: NULL pointer");
    size_t n = (size_t)N * I;
    swiglu_forward_kernel<<<fy_cu_blocks(n, EW_THREADS), EW_THREADS, 0, stream>>>(out, gu, n, I);
    FY_CUDA_LAUNCHED("swiglu_forward_kernel");
    return 0;
}

int fy_cu_swiglu_backward(bf16 *dgu, const bf16 *dout, const bf16 *gu, int N, int I,
                          cudaStream_t stream)
{
    FY_REQUIRE(N > 0 && I > 0, -EINVAL, "swiglu backward: bad shape N=%d I=%d", N, I);
    FY_REQUIRE(dgu && dout && gu, -EINVAL, "swiglu backward: NULL pointer");
    size_t n = (size_t)N * I;
    swiglu_backward_kernel<<<fy_cu_blocks(n, EW_THREADS), EW_THREADS, 0, stream>>>(dgu, dout, gu,
                                                                                   n, I);
    FY_CUDA_LAUNCHED("swiglu_backward_kernel");
    return 0;
}
