/* RMSNorm on the GPU (the contract is cu_rmsnorm.h), as transformers computes Llama's: the mean
 * square and its reciprocal square root in fp32, the row normalised in fp32, then times the weight,
 * rounded once to bf16. Warp sums are xor butterflies (every lane ends with the same bits); the
 * weight gradient's sums over rows run in a fixed order (cu_layernorm's two passes); no atomics.
 * Mirrors the fp32 CPU reference gpu_worker/cpu/cpu_llama.c. */
#include "gpu_worker/cuda/cu_rmsnorm.h"

#include <errno.h>
#include <math.h>

#include "gpu_worker/cuda/cu_layernorm.h"

/* Row kernels: one warp per row. */
#define ROW_WARPS 8

static __global__ void rmsnorm_forward_kernel(bf16 *__restrict__ out, float *__restrict__ rstd,
                                              const bf16 *__restrict__ inp,
                                              const bf16 *__restrict__ w, int N, int C, float eps)
{
    int lane = threadIdx.x % 32, row = blockIdx.x * ROW_WARPS + threadIdx.x / 32;
    if (row >= N) /* the whole warp leaves together */
        return;
    const bf16 *x = inp + (size_t)row * C;
    float ss = 0.0f;
    for (int i = lane; i < C; i += 32)
        ss += fy_cu_ld(x, i) * fy_cu_ld(x, i);
    float r = 1.0f / sqrtf(fy_cu_warp_sum(ss) / (float)C + eps);
    bf16 *y = out + (size_t)row * C;
    for (int i = lane; i < C; i += 32)
        y[i] = __float2bfloat16_rn(fy_cu_ld(w, i) * (fy_cu_ld(x, i) * r));
    if (lane == 0)
        rstd[row] = r;
}

/* With xhat = x r and g = dout w: dinp += r (g - xhat mean(g xhat)); each element of dinp is read
 * and written by the same thread. */
static __global__ void rmsnorm_backward_kernel(bf16 *dinp, const bf16 *__restrict__ dout,
                                               const bf16 *__restrict__ inp,
                                               const bf16 *__restrict__ w,
                                               const float *__restrict__ rstd, int N, int C)
{
    int lane = threadIdx.x % 32, row = blockIdx.x * ROW_WARPS + threadIdx.x / 32;
    if (row >= N)
        return;
    size_t base = (size_t)row * C;
    float r = rstd[row], gx = 0.0f;
    for (int i = lane; i < C; i += 32)
        gx += fy_cu_ld(dout, base + i) * fy_cu_ld(w, i) * (fy_cu_ld(inp, base + i) * r);
    gx = fy_cu_warp_sum(gx) / (float)C;
    for (int i = lane; i < C; i += 32) {
        float g =
            r * (fy_cu_ld(dout, base + i) * fy_cu_ld(w, i) - (fy_cu_ld(inp, base + i) * r) * gx);
        dinp[base + i] = __float2bfloat16_rn(fy_cu_ld(dinp, base + i) + g);
    }
}

static unsigned row_blocks(int rows) { return (unsigned)((rows + ROW_WARPS - 1) / ROW_WARPS); }

int fy_cu_rmsnorm_forward(bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int N, int C,
                          float eps, cudaStream_t stream)
{
    FY_REQUIRE(N > 0 && C > 0 && eps > 0.0f, -EINVAL, "rmsnorm forward: bad shape N=%d C=%d eps=%g",
               N, C, (double)eps);
    FY_REQUIRE(out && rstd && inp && w, -EINVAL, "rmsnorm forward: NULL pointer");
    rmsnorm_forward_kernel<<<row_blocks(N), ROW_WARPS * 32, 0, stream>>>(out, rstd, inp, w, N, C,
                                                                         eps);
    FY_CUDA_LAUNCHED("rmsnorm_forward_kernel");
    return 0;
}

int fy_cu_rmsnorm_backward(bf16 *dinp, float *dw, float *scratch, const bf16 *dout,
                           const bf16 *inp, const bf16 *w, const float *rstd, int N, int C,
                           cudaStream_t stream)
{
    FY_REQUIRE(N > 0 && C > 0, -EINVAL, "rmsnorm backward: bad shape N=%d C=%d", N, C);
    FY_REQUIRE(dinp && dw && scratch && dout && inp && w && rstd, -EINVAL,
               "rmsnorm backward: NULL pointer");
    /* dw += sum over rows of dout (x rstd): the LayerNorm's passes without a mean or a bias */
    FY_TRY(fy_cu_layernorm_weight_grads(dw, NULL, scratch, dout, inp, NULL, rstd, N, C, stream));
    rmsnorm_backward_kernel<<<row_blocks(N), ROW_WARPS * 32, 0, stream>>>(dinp, dout, inp, w, rstd,
                                                                          N, C);
    FY_CUDA_LAUNCHED("rmsnorm_backward_kernel");
    return 0;
}
