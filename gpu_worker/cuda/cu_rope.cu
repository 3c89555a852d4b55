/* Rotary position embeddings on the GPU (the contract is cu_rope.h): rotate_half RoPE as
 * transformers applies it to Llama's q and k, with a cos/sin table the caller computes; the
 * backward rotates by the opposite angle. fp32 arithmetic, each element rounded once to bf16.
 * Mirrors the fp32 CPU reference gpu_worker/cpu/cpu_llama.c. */
#include "gpu_worker/cuda/cu_rope.h"

#include <errno.h>

/* Elementwise kernels: threads per block (grid-stride loops). */
#define EW_THREADS 256

/* One rotated pair (i, i + hd/2) of one head of one row per iteration; sign -1 rotates back. Row n
 * is at position n % T, or (DOC) positions[n]. */
template <bool DOC>
static __global__ void rope_kernel(bf16 *x, int stride, int col, int NHx, int hd,
                                   const float *__restrict__ cos_t, const float *__restrict__ sin_t,
                                   int T, size_t pairs, float sign,
                                   const int32_t *__restrict__ positions)
{
    int half = hd / 2;
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < pairs;
         p += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(p % half);
        size_t head = p / half, n = head / NHx;
        bf16 *v = x + n * stride + col + (head % NHx) * hd;
        size_t at = (DOC ? (size_t)positions[n] : n % T) * half + i;
        float cs = cos_t[at], sn = sign * sin_t[at], a = fy_cu_ld(v, i),
              b = fy_cu_ld(v, i + half);
        v[i] = __float2bfloat16_rn(a * cs - b * sn);
        v[i + half] = __float2bfloat16_rn(b * cs + a * sn);
    }
}

static int rope(bf16 *x, int stride, int col, int NHx, int hd, const float *cos_t,
                const float *sin_t, const int32_t *positions, int B, int T, float sign,
                cudaStream_t stream)
{
    FY_REQUIRE(B > 0 && T > 0 && NHx > 0 && hd > 0 && hd % 2 == 0 && col >= 0 &&
                   col + (size_t)NHx * hd <= (size_t)stride,
               -EINVAL, "rope: bad shape B=%d T=%d NHx=%d hd=%d col=%d stride=%d", B, T, NHx, hd,
               col, stride);
    FY_REQUIRE(x && cos_t && sin_t, -EINVAL, "rope: NULL pointer");
    size_t pairs = (size_t)B * T * NHx * (hd / 2);
    if (positions != NULL)
        rope_kernel<true><<<fy_cu_blocks(pairs, EW_THREADS), EW_THREADS, 0, stream>>>(
            x, stride, col, NHx, hd, cos_t, sin_t, T, pairs, sign, positions);
    else
        rope_kernel<false><<<fy_cu_blocks(pairs, EW_THREADS), EW_THREADS, 0, stream>>>(
            x, stride, col, NHx, hd, cos_t, sin_t, T, pairs, sign, positions);
    FY_CUDA_LAUNCHED("rope_kernel");
    return 0;
}

int fy_cu_rope_forward(bf16 *x, int stride, int col, int NHx, int hd, const float *cos_t,
                       const float *sin_t, const int32_t *positions, int B, int T,
                       cudaStream_t stream)
{
    return rope(x, stride, col, NHx, hd, cos_t, sin_t, positions, B, T, 1.0f, stream);
}

int fy_cu_rope_backward(bf16 *dx, int stride, int col, int NHx, int hd, const float *cos_t,
                        const float *sin_t, const int32_t *positions, int B, int T,
                        cudaStream_t stream)
{
    return rope(dx, stride, col, NHx, hd, cos_t, sin_t, positions, B, T, -1.0f, stream);
}
