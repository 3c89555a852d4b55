/* CUDA kernels of the GPT block outside the matrix products (the contract is cu_norm.h): LayerNorm
 * forward and backward, GELU (tanh approximation), residual add, the embedding lookup and its
 * backward, and f32 <-> bf16 conversion. They mirror the fp32 CPU reference gpu_worker/cpu/gpt_cpu.c.
 *
 * Written to be obviously right first, fast second:
 *  - storage is bf16 (activations) or f32 (statistics, gradients); all arithmetic is fp32;
 *  - every reduction runs in a fixed order that does not depend on timing, so the results are
 *    bit-identical from run to run: warp sums use the xor butterfly (IEEE addition is commutative,
 *    so every lane ends with the same bits), sums over rows are done by one thread per output
 *    element looping over rows in index order, and no atomics are used anywhere;
 *  - the embedding backward adds in exactly the order of the CPU reference (rows n = b*T + t
 *    ascending), so its results equal the CPU's bit for bit.
 *
 * Every function checks its arguments (returns -EINVAL, logged, for nonsense such as N <= 0 or a
 * NULL pointer), enqueues its kernels on `stream` and returns 0, or -EIO when a launch failed. Errors
 * inside a kernel show up at the caller's next synchronisation, as usual in CUDA. */
#include "gpu_worker/cuda/cu_norm.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#define LN_EPS 1e-5f
#define GELU_K 0.7978845608028654f /* sqrt(2 / pi), as in gpt_cpu.c */
#define GELU_A 0.044715f

/* Elementwise kernels: threads per block (grid-stride loops, so any n works with fy_cu_blocks). */
#define EW_THREADS 256
/* Row kernels: one warp per row, ROW_WARPS rows per block. */
#define ROW_WARPS 8
/* LayerNorm dw/db: rows summed by one block of the first pass, and channels per block. */
#define LN_ROWS_PER_BLOCK 64
#define LN_CH_THREADS 128
/* Largest grid y/z dimension. */
#define GRID_YZ_MAX 65535u

/* ---- helpers ---- */

/* Sum over the 32 lanes of a full warp; every lane gets the same bits (see the top comment). */
static __device__ __forceinline__ float warp_sum(float v)
{
    for (int m = 16; m > 0; m >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

static __device__ __forceinline__ float ld(const bf16 *p, size_t i)
{
    return __bfloat162float(p[i]);
}

#define CHECK_ARG(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fy_error(__VA_ARGS__);                                                                 \
            return -EINVAL;                                                                        \
        }                                                                                          \
    } while (0)

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
        s += ld(x, i);
    float m = warp_sum(s) / (float)C;

    float v = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float d = ld(x, i) - m;
        v += d * d;
    }
    v = warp_sum(v) / (float)C;
    float r = 1.0f / sqrtf(v + LN_EPS);

    for (int i = lane; i < C; i += 32)
        y[i] = __float2bfloat16_rn((ld(x, i) - m) * r * ld(w, i) + ld(b, i));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

int fy_cu_layernorm_forward(bf16 *out, float *mean, float *rstd, const bf16 *inp, const bf16 *w,
                            const bf16 *b, int N, int C, cudaStream_t stream)
{
    CHECK_ARG(N > 0 && C > 0, "layernorm forward: bad shape N=%d C=%d", N, C);
    CHECK_ARG(out && mean && rstd && inp && w && b, "layernorm forward: NULL pointer");
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
        float norm = (ld(inp, base + i) - m) * r;
        float dnorm = ld(dout, base + i) * ld(w, i);
        sd += dnorm;
        sdn += dnorm * norm;
    }
    float dnorm_mean = warp_sum(sd) / (float)C;
    float dnorm_norm_mean = warp_sum(sdn) / (float)C;

    for (int i = lane; i < C; i += 32) {
        float norm = (ld(inp, base + i) - m) * r;
        float dnorm = ld(dout, base + i) * ld(w, i);
        float g = r * (dnorm - dnorm_mean - norm * dnorm_norm_mean);
        dinp[base + i] = __float2bfloat16_rn(ld(dinp, base + i) + g);
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
        float dy = ld(dout, k);
        gw += dy * ((ld(inp, k) - (mean != NULL ? mean[n] : 0.0f)) * rstd[n]);
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

int fy_cu_norm_weight_grads(float *dw, float *db, float *scratch, const bf16 *dout,
                            const bf16 *inp, const float *mean, const float *rstd, int N, int C,
                            cudaStream_t stream)
{
    CHECK_ARG(N > 0 && C > 0, "norm weight gradients: bad shape N=%d C=%d", N, C);
    CHECK_ARG(dw && scratch && dout && inp && rstd, "norm weight gradients: NULL pointer");
    unsigned ch_blocks = (unsigned)(((size_t)C + LN_CH_THREADS - 1) / LN_CH_THREADS);
    CHECK_ARG(ch_blocks <= GRID_YZ_MAX, "norm weight gradients: C=%d too wide", C);
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
    CHECK_ARG(N > 0 && C > 0, "layernorm backward: bad shape N=%d C=%d", N, C);
    CHECK_ARG(dinp && dw && db && scratch && dout && inp && w && mean && rstd,
              "layernorm backward: NULL pointer");
    /* dw/db partials first: they only read the inputs. */
    int rc = fy_cu_norm_weight_grads(dw, db, scratch, dout, inp, mean, rstd, N, C, stream);
    if (rc)
        return rc;
    layernorm_backward_dinp_kernel<<<row_blocks(N), ROW_WARPS * 32, 0, stream>>>(dinp, dout, inp, w,
                                                                                 mean, rstd, N, C);
    FY_CUDA_LAUNCHED("layernorm_backward_dinp_kernel");
    return 0;
}

/* ---- GELU ---- */

static __global__ void gelu_forward_kernel(bf16 *out, const bf16 *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = ld(inp, i);
        out[i] = __float2bfloat16_rn(0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_A * x * x * x))));
    }
}

/* Not __restrict__: dinp may alias dout (each element is read before it is written, by the same
 * thread). */
static __global__ void gelu_backward_kernel(bf16 *dinp, const bf16 *inp, const bf16 *dout, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = ld(inp, i), dy = ld(dout, i);
        float th = tanhf(GELU_K * (x + GELU_A * x * x * x));
        float dth = (1.0f - th * th) * GELU_K * (1.0f + 3.0f * GELU_A * x * x);
        dinp[i] = __float2bfloat16_rn(dy * (0.5f * (1.0f + th) + 0.5f * x * dth));
    }
}

int fy_cu_gelu_forward(bf16 *out, const bf16 *inp, size_t n, cudaStream_t stream)
{
    CHECK_ARG(n > 0, "gelu forward: n=0");
    CHECK_ARG(out && inp, "gelu forward: NULL pointer");
    gelu_forward_kernel<<<fy_cu_blocks(n, EW_THREADS), EW_THREADS, 0, stream>>>(out, inp, n);
    FY_CUDA_LAUNCHED("gelu_forward_kernel");
    return 0;
}

int fy_cu_gelu_backward(bf16 *dinp, const bf16 *inp, const bf16 *dout, size_t n,
                        cudaStream_t stream)
{
    CHECK_ARG(n > 0, "gelu backward: n=0");
    CHECK_ARG(dinp && inp && dout, "gelu backward: NULL pointer");
    gelu_backward_kernel<<<fy_cu_blocks(n, EW_THREADS), EW_THREADS, 0, stream>>>(dinp, inp, dout, n);
    FY_CUDA_LAUNCHED("gelu_backward_kernel");
    return 0;
}

/* ---- residual ---- */

/* Not __restrict__: out may alias a or b. */
static __global__ void residual_forward_kernel(bf16 *out, const bf16 *a, const bf16 *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(ld(a, i) + ld(b, i));
}

int fy_cu_residual_forward(bf16 *out, const bf16 *a, const bf16 *b, size_t n, cudaStream_t stream)
{
    CHECK_ARG(n > 0, "residual forward: n=0");
    CHECK_ARG(out && a && b, "residual forward: NULL pointer");
    residual_forward_kernel<<<fy_cu_blocks(n, EW_THREADS), EW_THREADS, 0, stream>>>(out, a, b, n);
    FY_CUDA_LAUNCHED("residual_forward_kernel");
    return 0;
}

/* ---- embeddings ---- */

/* One element of [B*T][C] per iteration: out[n][c] = wte[tokens[n]][c] + wpe[n % T][c] (no wpe:
 * the token's row alone). */
static __global__ void embed_forward_kernel(bf16 *__restrict__ out,
                                            const int32_t *__restrict__ tokens,
                                            const bf16 *__restrict__ wte,
                                            const bf16 *__restrict__ wpe, int T, int C, size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / (size_t)C, c = i % (size_t)C;
        size_t tok = (size_t)(uint32_t)tokens[n]; /* validity is the caller's (as on the CPU) */
        size_t t = n % (size_t)T;
        out[i] = wpe != NULL ? __float2bfloat16_rn(ld(wte, tok * C + c) + ld(wpe, t * C + c))
                             : wte[tok * C + c];
    }
}

int fy_cu_embed_forward(bf16 *out, const int32_t *tokens, const bf16 *wte, const bf16 *wpe, int B,
                        int T, int C, cudaStream_t stream)
{
    CHECK_ARG(B > 0 && T > 0 && C > 0, "embed forward: bad shape B=%d T=%d C=%d", B, T, C);
    CHECK_ARG(out && tokens && wte, "embed forward: NULL pointer");
    size_t total = (size_t)B * T * C;
    embed_forward_kernel<<<fy_cu_blocks(total, EW_THREADS), EW_THREADS, 0, stream>>>(
        out, tokens, wte, wpe, T, C, total);
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
            dwte[(size_t)tok * C + c] += ld(dout, (size_t)n * C + c);
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
            acc += ld(dout, (size_t)b * TC + i);
        dwpe[i] = acc;
    }
}

int fy_cu_embed_backward(float *dwte, float *dwpe, const bf16 *dout, const int32_t *tokens, int B,
                         int T, int C, int V, cudaStream_t stream)
{
    CHECK_ARG(B > 0 && T > 0 && C > 0 && V > 0, "embed backward: bad shape B=%d T=%d C=%d V=%d", B,
              T, C, V);
    CHECK_ARG((size_t)B * T <= (size_t)INT_MAX, "embed backward: B*T too large");
    CHECK_ARG(dwte && dout && tokens, "embed backward: NULL pointer");
    /* Small blocks: there are only C threads in all, spread them over as many SMs as possible. */
    embed_backward_wte_kernel<<<fy_cu_blocks((size_t)C, 32), 32, 0, stream>>>(dwte, dout, tokens,
                                                                             B * T, C, V);
    FY_CUDA_LAUNCHED("embed_backward_wte_kernel");
    if (dwpe == NULL)
        return 0;
    size_t TC = (size_t)T * C;
    embed_backward_wpe_kernel<<<fy_cu_blocks(TC, EW_THREADS), EW_THREADS, 0, stream>>>(dwpe, dout,
                                                                                        B, T, C);
    FY_CUDA_LAUNCHED("embed_backward_wpe_kernel");
    return 0;
}

/* ---- conversion ---- */

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
    CHECK_ARG(n > 0, "f32_to_bf16: n=0");
    CHECK_ARG(out && in, "f32_to_bf16: NULL pointer");
    f32_to_bf16_kernel<<<fy_cu_blocks(n, EW_THREADS), EW_THREADS, 0, stream>>>(out, in, n);
    FY_CUDA_LAUNCHED("f32_to_bf16_kernel");
    return 0;
}

int fy_cu_bf16_to_f32(float *out, const bf16 *in, size_t n, cudaStream_t stream)
{
    CHECK_ARG(n > 0, "bf16_to_f32: n=0");
    CHECK_ARG(out && in, "bf16_to_f32: NULL pointer");
    bf16_to_f32_kernel<<<fy_cu_blocks(n, EW_THREADS), EW_THREADS, 0, stream>>>(out, in, n);
    FY_CUDA_LAUNCHED("bf16_to_f32_kernel");
    return 0;
}
