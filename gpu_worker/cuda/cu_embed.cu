/* The embedding lookup on the GPU and its backward (the contract is cu_embed.h): token rows plus
 * positions (GPT-2) or token rows alone (Llama). The backward adds in exactly the order of the CPU
 * reference (rows n = b*T + t ascending), one thread per output element and no atomics, so its
 * results equal the CPU's bit for bit. */
#include "gpu_worker/cuda/cu_embed.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>

/* Elementwise kernels: threads per block (grid-stride loops, so any n works with fy_cu_blocks). */
#define EW_THREADS 256

/* One element of [B*T][C] per iteration: out[n][c] = wte[tokens[n]][c] + wpe[n % T][c], or (DOC)
 * + wpe[positions[n]][c] (no wpe: the token's row alone). */
template <bool DOC>
static __global__ void
embed_forward_kernel(bf16 *__restrict__ out, const int32_t *__restrict__ tokens,
                     const bf16 *__restrict__ wte, const bf16 *__restrict__ wpe, int T, int C,
                     size_t total, const int32_t *__restrict__ positions)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / (size_t)C, c = i % (size_t)C;
        size_t tok = (size_t)(uint32_t)tokens[n]; /* validity is the caller's (as on the CPU) */
        size_t t = DOC ? (size_t)positions[n] : n % (size_t)T;
        out[i] = wpe != NULL
                     ? __float2bfloat16_rn(fy_cu_ld(wte, tok * C + c) + fy_cu_ld(wpe, t * C + c))
                     : wte[tok * C + c];
    }
}

int fy_cu_embed_forward(bf16 *out, const int32_t *tokens, const bf16 *wte, const bf16 *wpe,
                        const int32_t *positions, int B, int T, int C, cudaStream_t stream)
{
    FY_REQUIRE(B > 0 && T > 0 && C > 0, -EINVAL, "embed forward: bad shape B=%d T=%d C=%d", B, T,
               C);
    FY_REQUIRE(out && tokens && wte, -EINVAL, "embed forward: NULL pointer");
    size_t total = (size_t)B * T * C;
    if (positions != NULL && wpe != NULL)
        embed_forward_kernel<true><<<fy_cu_blocks(total, EW_THREADS), EW_THREADS, 0, stream>>>(
            out, tokens, wte, wpe, T, C, total, positions);
    else
        embed_forward_kernel<false><<<fy_cu_blocks(total, EW_THREADS), EW_THREADS, 0, stream>>>(
            out, tokens, wte, wpe, T, C, total, NULL);
    FY_CUDA_LAUNCHED("embed_forward_kernel");
    return 0;
}

/* dwte: one thread per channel c walks all rows n = b*T + t in ascending order, doing
 * dwte[tokens[n]][c] += dout[n][c]. Column c of dwte is touched by that thread alone, so this is
 * race-free, and the order of the additions is the CPU reference's. Tokens outside [0, V) are
 * skipped (they would be out-of-bounds writes; the CPU reference requires tokens < V). */
static __global__ void embed_backward_wte_kernel(float *__restrict__ dwte,
                                                 const bf16 *__restrict__ dout,
                                                 const int32_t *__restrict__ tokens, int BT, int C,
                                                 int V)
{
    for (size_t c = blockIdx.x * (size_t)blockDim.x + threadIdx.x; c < (size_t)C;
         c += (size_t)gridDim.x * blockDim.x) {
        for (int n = 0; n < BT; n++) {
            int tok = tokens[n];
            if (tok < 0 || tok >= V)
                continue;
            dwte[(size_t)tok * C + c] += fy_cu_ld(dout, (size_t)n * C + c);
        }
    }
}

/* dwpe: one thread per (t, c) adds dout[b][t][c] for b ascending (the CPU's order for that
 * element), starting from the value already there. */
static __global__ void embed_backward_wpe_kernel(float *__restrict__ dwpe,
                                                 const bf16 *__restrict__ dout, int B, int T, int C)
{
    size_t TC = (size_t)T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < TC;
         i += (size_t)gridDim.x * blockDim.x) {
        float acc = dwpe[i];
        for (int b = 0; b < B; b++)
            acc += fy_cu_ld(dout, (size_t)b * TC + i);
        dwpe[i] = acc;
    }
}

/* dwpe at positions: one thread per channel c walks all rows n ascending, doing
 * dwpe[positions[n]][c] += dout[n][c] (a position repeats across the documents of a batch): the
 * CPU reference's order, as for dwte. */
static __global__ void embed_backward_wpe_at_kernel(float *__restrict__ dwpe,
                                                    const bf16 *__restrict__ dout,
                                                    const int32_t *__restrict__ positions, int BT,
                                                    int C)
{
    for (size_t c = blockIdx.x * (size_t)blockDim.x + threadIdx.x; c < (size_t)C;
         c += (size_t)gridDim.x * blockDim.x)
        for (int n = 0; n < BT; n++)
            dwpe[(size_t)positions[n] * C + c] += fy_cu_ld(dout, (size_t)n * C + c);
}

int fy_cu_embed_backward(float *dwte, float *dwpe, const bf16 *dout, const int32_t *tokens,
                         const int32_t *positions, int B, int T, int C, int V, cudaStream_t stream)
{
    FY_REQUIRE(B > 0 && T > 0 && C > 0 && V > 0, -EINVAL,
               "embed backward: bad shape B=%d T=%d C=%d V=%d", B, T, C, V);
    FY_REQUIRE((size_t)B * T <= (size_t)INT_MAX, -EINVAL, "embed backward: B*T too large");
    FY_REQUIRE(dwte && dout && tokens, -EINVAL, "embed backward: NULL pointer");
    /* Small blocks: there are only C threads in all, spread them over as many SMs as possible. */
    embed_backward_wte_kernel<<<fy_cu_blocks((size_t)C, 32), 32, 0, stream>>>(dwte, dout, tokens,
                                                                             B * T, C, V);
    FY_CUDA_LAUNCHED("embed_backward_wte_kernel");
    if (dwpe == NULL)
        return 0;
    if (positions != NULL) {
        embed_backward_wpe_at_kernel<<<fy_cu_blocks((size_t)C, 32), 32, 0, stream>>>(
            dwpe, dout, positions, B * T, C);
        FY_CUDA_LAUNCHED("embed_backward_wpe_at_kernel");
        return 0;
    }
    size_t TC = (size_t)T * C;
    embed_backward_wpe_kernel<<<fy_cu_blocks(TC, EW_THREADS), EW_THREADS, 0, stream>>>(dwpe, dout,
                                                                                        B, T, C);
    FY_CUDA_LAUNCHED("embed_backward_wpe_kernel");
    return 0;
}
