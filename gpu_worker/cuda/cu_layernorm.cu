/* LayerNorm on the GPU (the contract is cu_layernorm.h), as GPT-2 normalises: forward, backward,
 * and the norms' weight gradients, which RMSNorm's backward (cu_rmsnorm) shares. Storage bf16
 * (activations) or f32 (statistics, gradients); all arithmetic fp32. Every reduction runs in a
 * fixed order that does not depend on timing, so results are bit-identical from run to run: warp
 * sums use the xor butterfly, sums over rows are done by one thread per output element looping
 * over rows in index order, and no atomics are used. Mirrors the fp32 CPU reference
 * gpu_worker/cpu/cpu_gpt2.c. Every function checks its arguments (-EINVAL, said), enqueues on
 * `stream` and returns 0, or -EIO when a launch failed. */
#include "gpu_worker/cuda/cu_layernorm.h"

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#define LN_EPS 1e-5f

/* Elementwise kernels: threads per block (grid-stride loops, so any n works with fy_cu_blocks). */
#define EW_THREADS 256
/* Row kernels: one warp per row, ROW_WARPS rows per block. */
#define ROW_WARPS 8
/* LayerNorm dw/db: rows summed by one block of the first pass, and channels per block. */
#define LN_ROWS_PER_BLOCK 64
#define LN_CH_THREADS 128
/* Largest grid y/z dimension. */
#define GRID_YZ_MAX 65535u

/* Blocks for `rows` rows at ROW_WARPS rows per block (rows > 0, int, so this fits a grid x). */
static unsigned row_blocks(int rows)
{
    return (unsigned)(((size_t)rows + ROW_WARPS - 1) / ROW_WARPS);
}

/* ---- LayerNorm forward ---- */

/* One warp per row: mean, then the biased variance around it (two passes: no cancellation), then
 * out = (x - mean) * rstd * w + b. */
static __global__ void layernorm_forward_kernel(bf16 *__restrict__ out, float *__restrict__ mean,
                                                float *__restrict__ rstd,
                                                const bf16 *__restrict__ inp,
                                                const bf16 *__restrict__ w,
                                                const bf16 *__restrict__ b, int N, int C)
{
    int lane = threadIdx.x % 32;
    int row = blockIdx.x * ROW_WARPS + threadIdx.x / 32;
    if (row >= N) /* the whole warp leaves together: row depends on the warp only */
        return;
    const bf16 *x = inp + (size_t)row * C;
    bf16 *y = out + (size_t)row * C;

    float s = 0.0f;
    for (int i = lane; i < C; i += 32)
        s += fy_cu_ld(x, i);
    float m = fy_cu_warp_sum(s) / (float)C;

    float v = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float d = fy_cu_ld(x, i) - m;
        v += d * d;
    }
    v = fy_cu_warp_sum(v) / (float)C;
    float r = 1.0f / sqrtf(v + LN_EPS);

    for (int i = lane; i < C; i += 32)
        y[i] = __float2bfloat16_rn((fy_cu_ld(x, i) - m) * r * fy_cu_ld(w, i) + fy_cu_ld(b, i));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

int fy_cu_layernorm_forward(bf16 *out, float *mean, float *rstd, const bf16 *inp, const bf16 *w,
                            const bf16 *b, int N, int C, cudaStream_t stream)
{
    FY_REQUIRE(N > 0 && C > 0, -EINVAL, "layernorm forward: bad shape N=%d C=%d", N, C);
    FY_REQUIRE(out && mean && rstd && inp && w && b, -EINVAL, "layernorm forward: NULL pointer");
    layernorm_forward_kernel<<<row_blocks(N), ROW_WARPS * 32, 0, stream>>>(out, mean, rstd, inp, w,
                                                                           b, N, C);
    FY_CUDA_LAUNCHED("layernorm_forward_kernel");
    return 0;
}

/* ---- LayerNorm backward ---- */

/* dinp += rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dout * w,
 * norm = (x - mean) * rstd; one warp per row. */
static __global__ void layernorm_backward_dinp_kernel(bf16 *__restrict__ dinp,
                                                      const bf16 *__restrict__ dout,
                                                      const bf16 *__restrict__ inp,
                                                      const bf16 *__restrict__ w,
                                                      const float *__restrict__ mean,
                                                      const float *__restrict__ rstd, int N, int C)
{
    int lane = threadIdx.x % 32;
    int row = blockIdx.x * ROW_WARPS + threadIdx.x / 32;
    if (row >= N)
        return;
    size_t base = (size_t)row * C;
    float m = mean[row], r = rstd[row];

    float sd = 0.0f, sdn = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float norm = (fy_cu_ld(inp, base + i) - m) * r;
        float dnorm = fy_cu_ld(dout, base + i) * fy_cu_ld(w, i);
        sd += dnorm;
        sdn += dnorm * norm;
    }
    float dnorm_mean = fy_cu_warp_sum(sd) / (float)C;
    float dnorm_norm_mean = fy_cu_warp_sum(sdn) / (float)C;

    for (int i = lane; i < C; i += 32) {
        float norm = (fy_cu_ld(inp, base + i) - m) * r;
        float dnorm = fy_cu_ld(dout, base + i) * fy_cu_ld(w, i);
        float g = r * (dnorm - dnorm_mean - norm * dnorm_norm_mean);
        dinp[base + i] = __float2bfloat16_rn(fy_cu_ld(dinp, base + i) + g);
    }
}

/* First pass of dw/db: block (rb, cb) sums rows [rb*rows_per_block, ...) in ascending order for the
 * channels of column block cb, one thread per channel, and writes its partial sums to
 * scratch[rb][c] (dw) and scratch[rb][C + c] (db). Every (rb, c) of the scratch is written. No
 * mean (NULL): RMSNorm's, x * rstd. */
static __global__ void layernorm_backward_partial_kernel(float *__restrict__ scratch,
                                                         const bf16 *__restrict__ dout,
                                                         const bf16 *__restrict__ inp,
                                                         const float *__restrict__ mean,
                                                         const float *__restrict__ rstd, int N,
                                                         int C, int rows_per_block)
{
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    int rb = blockIdx.x;
    int r0 = rb * rows_per_block;
    int r1 = N - r0 > rows_per_block ? r0 + rows_per_block : N; /* no int overflow */
    float gw = 0.0f, gb = 0.0f;
    for (int n = r0; n < r1; n++) {
        size_t k = (size_t)n * C + c;
        float dy = fy_cu_ld(dout, k);
        gw += dy * ((fy_cu_ld(inp, k) - (mean != NULL ? mean[n] : 0.0f)) * rstd[n]);
        gb += dy;
    }
    scratch[(size_t)rb * 2 * C + c] = gw;
    scratch[(size_t)rb * 2 * C + C + c] = gb;
}

/* Second pass: one thread per channel adds the partials of the row blocks in index order (db NULL:
 * no bias, its partials left). */
static __global__ void layernorm_backward_reduce_kernel(float *__restrict__ dw,
                                                        float *__restrict__ db,
                                                        const float *__restrict__ scratch,
                                                        int nblocks, int C)
{
    for (size_t c = blockIdx.x * (size_t)blockDim.x + threadIdx.x; c < (size_t)C;
         c += (size_t)gridDim.x * blockDim.x) {
        float gw = 0.0f, gb = 0.0f;
        for (int rb = 0; rb < nblocks; rb++) {
            gw += scratch[(size_t)rb * 2 * C + c];
            gb += scratch[(size_t)rb * 2 * C + C + c];
        }
        dw[c] += gw;
        if (db != NULL)
            db[c] += gb;
    }
}

/* Row blocks of the first pass. Rows per block grow past LN_ROWS_PER_BLOCK only for N > ~4M, which
 * keeps the count within int; the scratch size below uses the same numbers. */
static int ln_rows_per_block(int N)
{
    int rpb = LN_ROWS_PER_BLOCK;
    while ((N + (size_t)rpb - 1) / rpb > 65536u)
        rpb *= 2;
    return rpb;
}

static int ln_row_blocks(int N)
{
    int rpb = ln_rows_per_block(N);
    return (int)((N + (size_t)rpb - 1) / rpb);
}

size_t fy_cu_layernorm_backward_scratch(int N, int C)
{
    if (N <= 0 || C <= 0)
        return 0;
    return (size_t)ln_row_blocks(N) * 2 * (size_t)C;
}

int fy_cu_layernorm_weight_grads(float *dw, float *db, float *scratch, const bf16 *dout,
                                 const bf16 *inp, const float *mean, const float *rstd, int N,
                                 int C, cudaStream_t stream)
{
    FY_REQUIRE(N > 0 && C > 0, -EINVAL, "norm weight gradients: bad shape N=%d C=%d", N, C);
    FY_REQUIRE(dw && scratch && dout && inp && rstd, -EINVAL,
               "norm weight gradients: NULL pointer");
    unsigned ch_blocks = (unsigned)(((size_t)C + LN_CH_THREADS - 1) / LN_CH_THREADS);
    FY_REQUIRE(ch_blocks <= GRID_YZ_MAX, -EINVAL, "norm weight gradients: C=%d too wide", C);
    int rpb = ln_rows_per_block(N), nblocks = ln_row_blocks(N);
    dim3 grid((unsigned)nblocks, ch_blocks);
    layernorm_backward_partial_kernel<<<grid, LN_CH_THREADS, 0, stream>>>(scratch, dout, inp, mean,
                                                                          rstd, N, C, rpb);
    FY_CUDA_LAUNCHED("layernorm_backward_partial_kernel");
    layernorm_backward_reduce_kernel<<<fy_cu_blocks((size_t)C, EW_THREADS), EW_THREADS, 0,
                                       stream>>>(dw, db, scratch, nblocks, C);
    FY_CUDA_LAUNCHED("layernorm_backward_reduce_kernel");
    return 0;
}

int fy_cu_layernorm_backward(bf16 *dinp, float *dw, float *db, float *scratch, const bf16 *dout,
                             const bf16 *inp, const bf16 *w, const float *mean, const float *rstd,
                             int N, int C, cudaStream_t stream)
{
    FY_REQUIRE(N > 0 && C > 0, -EINVAL, "layernorm backward: bad shape N=%d C=%d", N, C);
    FY_REQUIRE(dinp && dw && db && scratch && dout && inp && w && mean && rstd, -EINVAL,
               "layernorm backward: NULL pointer");
    /* dw/db partials first: they only read the inputs. */
    int rc = fy_cu_layernorm_weight_grads(dw, db, scratch, dout, inp, mean, rstd, N, C, stream);
    if (rc)
        return rc;
    layernorm_backward_dinp_kernel<<<row_blocks(N), ROW_WARPS * 32, 0, stream>>>(dinp, dout, inp, w,
                                                                                 mean, rstd, N, C);
    FY_CUDA_LAUNCHED("layernorm_backward_dinp_kernel");
    return 0;
}
