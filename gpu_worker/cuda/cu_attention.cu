/* Causal multi-head attention, the first, materialising version (FUYOU_CUDA_ATTENTION=materialised;
 * cu_flash is the default). Products go through cuBLASLt (fy_cu_matmul_batched: one algorithm per
 * shape, no atomics); the kernels here are simple and reduce in a fixed order (warp shuffles in a
 * fixed tree, then shared memory in warp order), so every result is bitwise reproducible.
 *
 * Head-major copies are padded so that every leading dimension and batch stride given to cuBLASLt
 * is a multiple of 8 elements and every matrix starts 16-byte aligned (fast algorithms, one algorithm
 * class whatever the shape): Tp = T rounded up to 8, hsp = hs rounded up to 8 (hs = C / NH), and
 * BH = B * NH. Padded rows and columns are written as zeros by our kernels, so they add exactly
 * nothing to the products, and they are never copied out.
 *
 * Scratch layout (each piece starts at a multiple of 256 bytes from the base, in this order):
 *   qkvh  bf16 [3][BH][Tp][hsp]  q | k | v head-major (written by forward and again by backward)
 *   yh    bf16 [BH][Tp][hsp]     forward: y = P v;  backward: dout head-major (dY)
 *   dqkvh bf16 [3][BH][Tp][hsp]  backward: dq | dk | dv head-major
 *   att   f32  [BH][Tp][Tp]      forward: scores, then (in place) probabilities P; kept for backward
 *   attb  bf16 [BH][Tp][Tp]      forward: P in bf16 (operand of y = P v);
 *                                backward: P in bf16 again (re-rounded from att), then dS
 *   datt  f32  [BH][Tp][Tp]      backward: dP = dY V^T
 * Forward: qkvh <- qkv; att = scale q k^T; P = causal softmax(att) (att f32 and attb bf16, masked
 * and padded entries 0); yh = P v; out <- yh.
 * Backward (only att from the forward is used; q, k, v are permuted again from qkv): yh <- dout;
 * attb = bf16(P); dv = P^T dY; dP = dY V^T; dS = P * (dP - rowsum(dP * P)) (into attb);
 * dq = scale dS K; dk = scale dS^T Q; dqkv <- dqkvh. */
#include "gpu_worker/cuda/cu_attention.h"

#include <math.h>

#include "gpu_worker/cuda/cu_reduce.h"

#define FY_ATT_WARPS 8 /* warps per block of the row kernels (one warp per row) */

static inline size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }
static inline int round8(int n) { return (n + 7) & ~7; }

/* ---- attention kernels ---- */

/* qkvh[s][bh][t][d] = qkv[b][t][s*C + h*hs + d], zero where t >= T or d >= hs. */
__global__ void att_permute_qkv(bf16 *qkvh, const bf16 *qkv, int B, int T, int C, int NH, int Tp,
                                int hsp)
{
    int hs = C / NH;
    size_t BH = (size_t)B * NH, n = 3 * BH * Tp * hsp;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int d = (int)(i % hsp);
        int t = (int)((i / hsp) % Tp);
        size_t bh = (i / ((size_t)hsp * Tp)) % BH;
        int s = (int)(i / ((size_t)hsp * Tp * BH));
        int b = (int)(bh / NH), h = (int)(bh % NH);
        bf16 v = __float2bfloat16(0.0f);
        if (t < T && d < hs)
            v = qkv[((size_t)b * T + t) * 3 * C + (size_t)s * C + (size_t)h * hs + d];
        qkvh[i] = v;
    }
}

/* xh[bh][t][d] = x[b][t][h*hs + d] (x is [B][T][C]), zero where t >= T or d >= hs. */
__global__ void att_permute_btc(bf16 *xh, const bf16 *x, int B, int T, int C, int NH, int Tp,
                                int hsp)
{
    int hs = C / NH;
    size_t n = (size_t)B * NH * Tp * hsp;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int d = (int)(i % hsp);
        int t = (int)((i / hsp) % Tp);
        size_t bh = i / ((size_t)hsp * Tp);
        int b = (int)(bh / NH), h = (int)(bh % NH);
        bf16 v = __float2bfloat16(0.0f);
        if (t < T && d < hs)
            v = x[((size_t)b * T + t) * C + (size_t)h * hs + d];
        xh[i] = v;
    }
}

/* out[b][t][h*hs + d] = yh[bh][t][d]. */
__global__ void att_unpermute_btc(bf16 *out, const bf16 *yh, int B, int T, int C, int NH, int Tp,
                                  int hsp)
{
    int hs = C / NH;
    size_t n = (size_t)B * T * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(i % C);
        int t = (int)((i / C) % T);
        int b = (int)(i / ((size_t)C * T));
        int h = c / hs, d = c % hs;
        out[i] = yh[(((size_t)b * NH + h) * Tp + t) * hsp + d];
    }
}

/* dqkv[b][t][s*C + h*hs + d] = dqkvh[s][bh][t][d]. */
__global__ void att_unpermute_qkv(bf16 *dqkv, const bf16 *dqkvh, int B, int T, int C, int NH,
                                  int Tp, int hsp)
{
    int hs = C / NH;
    size_t BH = (size_t)B * NH, C3 = 3 * (size_t)C, n = (size_t)B * T * C3;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int j = (int)(i % C3);
        int t = (int)((i / C3) % T);
        int b = (int)(i / (C3 * T));
        int s = j / C, c = j % C;
        int h = c / hs, d = c % hs;
        dqkv[i] = dqkvh[(((size_t)s * BH + (size_t)b * NH + h) * Tp + t) * hsp + d];
    }
}

/* One warp per row (bh, t) of att [BH][Tp][Tp] (scores in, probabilities out, in place); attb gets
 * them in bf16. Row t < T: p[j] = exp(s[j] - max) / sum over lo <= j <= t, 0 elsewhere, lo = 0 or
 * (DOC) the start of t's document, t - positions[b][t]; rows t >= T: 0. */
template <bool DOC>
__global__ void att_softmax_forward(float *att, bf16 *attb, size_t rows, int T, int Tp,
                                    const int32_t *positions, int NH)
{
    int lane = threadIdx.x & 31;
    for (size_t row = (size_t)blockIdx.x * FY_ATT_WARPS + (threadIdx.x >> 5); row < rows;
         row += (size_t)gridDim.x * FY_ATT_WARPS) {
        int t = (int)(row % Tp);
        float *s = att + row * Tp;
        bf16 *pb = attb + row * Tp;
        if (t >= T) {
            for (int j = lane; j < Tp; j += 32) {
                s[j] = 0.0f;
                pb[j] = __float2bfloat16(0.0f);
            }
            continue;
        }
        const int lo = DOC ? t - positions[(row / Tp / NH) * T + t] : 0;
        float m = -INFINITY;
        for (int j = lo + lane; j <= t; j += 32)
            m = fmaxf(m, s[j]);
        m = warp_reduce<fy_op_max>(m);
        float sum = 0.0f;
        for (int j = lo + lane; j <= t; j += 32)
            sum += expf(s[j] - m);
        sum = warp_reduce<fy_op_sum>(sum); /* also orders every read above before the writes */
        for (int j = lane; j < Tp; j += 32) {
            /* each lane rewrites what it read */
            float p = j >= lo && j <= t ? expf(s[j] - m) / sum : 0.0f;
            s[j] = p;
            pb[j] = __float2bfloat16(p);
        }
    }
}

/* One warp per row (bh, t): ds[j] = p[j] * (dp[j] - sum_{i<=t} p[i] dp[i]) for j <= t, else 0;
 * written in bf16. (Keys of another document have p 0: they add nothing to the sum and get 0.) */
__global__ void att_softmax_backward(bf16 *ds, const float *att, const float *datt, size_t rows,
                                     int T, int Tp)
{
    int lane = threadIdx.x & 31;
    for (size_t row = (size_t)blockIdx.x * FY_ATT_WARPS + (threadIdx.x >> 5); row < rows;
         row += (size_t)gridDim.x * FY_ATT_WARPS) {
        int t = (int)(row % Tp);
        const float *p = att + row * Tp, *dp = datt + row * Tp;
        bf16 *o = ds + row * Tp;
        if (t >= T) {
            for (int j = lane; j < Tp; j += 32)
                o[j] = __float2bfloat16(0.0f);
            continue;
        }
        float dot = 0.0f;
        for (int j = lane; j <= t; j += 32)
            dot += p[j] * dp[j];
        dot = warp_reduce<fy_op_sum>(dot);
        for (int j = lane; j < Tp; j += 32)
            o[j] = __float2bfloat16(j <= t ? p[j] * (dp[j] - dot) : 0.0f);
    }
}

__global__ void f32_to_bf16(bf16 *out, const float *in, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(in[i]);
}

/* ---- attention ---- */

struct att_layout {
    int hs, Tp, hsp, BH;
    size_t E;  /* elements of one head-major tensor [BH][Tp][hsp] */
    size_t TT; /* elements of [BH][Tp][Tp] */
    size_t off_qkvh, off_yh, off_dqkvh, off_att, off_attb, off_datt, total;
};

static int att_carve(struct att_layout *L, int B, int T, int C, int NH)
{
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || C % NH != 0)
        return -EINVAL;
    L->hs = C / NH;
    L->Tp = round8(T);
    L->hsp = round8(L->hs);
    L->BH = B * NH;
    L->E = (size_t)L->BH * L->Tp * L->hsp;
    L->TT = (size_t)L->BH * L->Tp * L->Tp;
    size_t off = 0;
    L->off_qkvh = off;
    off += align256(3 * L->E * sizeof(bf16));
    L->off_yh = off;
    off += align256(L->E * sizeof(bf16));
    L->off_dqkvh = off;
    off += align256(3 * L->E * sizeof(bf16));
    L->off_att = off;
    off += align256(L->TT * sizeof(float));
    L->off_attb = off;
    off += align256(L->TT * sizeof(bf16));
    L->off_datt = off;
    off += align256(L->TT * sizeof(float));
    L->total = off;
    return 0;
}

size_t fy_cu_attention_scratch_bytes(int B, int T, int C, int NH)
{
    struct att_layout L;
    return att_carve(&L, B, T, C, NH) ? 0 : L.total;
}

static unsigned row_blocks(size_t rows)
{
    return fy_cu_blocks(rows, FY_ATT_WARPS); /* one warp per row, FY_ATT_WARPS rows per block */
}

int fy_cu_attention_forward(struct fy_cu_lt *lt, bf16 *out, const bf16 *qkv,
                            const int32_t *positions, void *scratch, int B, int T, int C, int NH,
                            cudaStream_t stream)
{
    struct att_layout L;
    if (att_carve(&L, B, T, C, NH)) {
        fy_error("fy_cu_attention_forward: bad shape B=%d T=%d C=%d NH=%d", B, T, C, NH);
        return -EINVAL;
    }
    char *base = (char *)scratch;
    bf16 *qkvh = (bf16 *)(base + L.off_qkvh), *yh = (bf16 *)(base + L.off_yh);
    float *att = (float *)(base + L.off_att);
    bf16 *attb = (bf16 *)(base + L.off_attb);
    const bf16 *q = qkvh, *k = qkvh + L.E, *v = qkvh + 2 * L.E;
    int Tp = L.Tp, hsp = L.hsp;
    long long sh = (long long)Tp * hsp, st = (long long)Tp * Tp;
    float scale = 1.0f / sqrtf((float)L.hs);

    att_permute_qkv<<<fy_cu_blocks(3 * L.E, 256), 256, 0, stream>>>(qkvh, qkv, B, T, C, NH, Tp,
                                                                     hsp);
    FY_CUDA_LAUNCHED("att_permute_qkv");
    /* att = scale * q k^T: [Tp][hsp] x [Tp][hsp]^T, f32 */
    FY_MM(fy_cu_matmul_batched(lt, att, 1, q, k, Tp, Tp, hsp, 0, 1, sh, sh, st, L.BH, scale, 0.0f,
                               stream),
          "attention forward q k^T");
    size_t rows = (size_t)L.BH * Tp;
    if (positions != NULL)
        att_softmax_forward<true><<<row_blocks(rows), 32 * FY_ATT_WARPS, 0, stream>>>(
            att, attb, rows, T, Tp, positions, NH);
    else
        att_softmax_forward<false><<<row_blocks(rows), 32 * FY_ATT_WARPS, 0, stream>>>(
            att, attb, rows, T, Tp, positions, NH);
    FY_CUDA_LAUNCHED("att_softmax_forward");
    /* yh = P v: [Tp][Tp] x [Tp][hsp], bf16 */
    FY_MM(fy_cu_matmul_batched(lt, yh, 0, attb, v, Tp, hsp, Tp, 0, 0, st, sh, sh, L.BH, 1.0f, 0.0f,
                               stream),
          "attention forward P v");
    att_unpermute_btc<<<fy_cu_blocks((size_t)B * T * C, 256), 256, 0, stream>>>(out, yh, B, T, C,
                                                                                 NH, Tp, hsp);
    FY_CUDA_LAUNCHED("att_unpermute_btc");
    return 0;
}

int fy_cu_attention_backward(struct fy_cu_lt *lt, bf16 *dqkv, const bf16 *dout, const bf16 *qkv,
                             void *scratch, int B, int T, int C, int NH, cudaStream_t stream)
{
    struct att_layout L;
    if (att_carve(&L, B, T, C, NH)) {
        fy_error("fy_cu_attention_backward: bad shape B=%d T=%d C=%d NH=%d", B, T, C, NH);
        return -EINVAL;
    }
    char *base = (char *)scratch;
    bf16 *qkvh = (bf16 *)(base + L.off_qkvh), *dy = (bf16 *)(base + L.off_yh);
    bf16 *dqkvh = (bf16 *)(base + L.off_dqkvh);
    float *att = (float *)(base + L.off_att), *datt = (float *)(base + L.off_datt);
    bf16 *attb = (bf16 *)(base + L.off_attb);
    const bf16 *q = qkvh, *k = qkvh + L.E, *v = qkvh + 2 * L.E;
    bf16 *dq = dqkvh, *dk = dqkvh + L.E, *dv = dqkvh + 2 * L.E;
    int Tp = L.Tp, hsp = L.hsp;
    long long sh = (long long)Tp * hsp, st = (long long)Tp * Tp;
    float scale = 1.0f / sqrtf((float)L.hs);
    size_t rows = (size_t)L.BH * Tp;

    att_permute_qkv<<<fy_cu_blocks(3 * L.E, 256), 256, 0, stream>>>(qkvh, qkv, B, T, C, NH, Tp,
                                                                     hsp);
    FY_CUDA_LAUNCHED("att_permute_qkv");
    att_permute_btc<<<fy_cu_blocks(L.E, 256), 256, 0, stream>>>(dy, dout, B, T, C, NH, Tp, hsp);
    FY_CUDA_LAUNCHED("att_permute_btc");
    f32_to_bf16<<<fy_cu_blocks(L.TT, 256), 256, 0, stream>>>(attb, att, L.TT);
    FY_CUDA_LAUNCHED("f32_to_bf16");
    /* dv = P^T dY: op(A) = P^T with P stored [Tp][Tp] */
    FY_MM(fy_cu_matmul_batched(lt, dv, 0, attb, dy, Tp, hsp, Tp, 1, 0, st, sh, sh, L.BH, 1.0f, 0.0f,
                               stream),
          "attention backward P^T dY");
    /* dP = dY V^T, f32 */
    FY_MM(fy_cu_matmul_batched(lt, datt, 1, dy, v, Tp, Tp, hsp, 0, 1, sh, sh, st, L.BH, 1.0f, 0.0f,
                               stream),
          "attention backward dY V^T");
    att_softmax_backward<<<row_blocks(rows), 32 * FY_ATT_WARPS, 0, stream>>>(attb, att, datt, rows,
                                                                             T, Tp);
    FY_CUDA_LAUNCHED("att_softmax_backward");
    /* dq = scale dS K; dk = scale dS^T Q */
    FY_MM(fy_cu_matmul_batched(lt, dq, 0, attb, k, Tp, hsp, Tp, 0, 0, st, sh, sh, L.BH, scale, 0.0f,
                               stream),
          "attention backward dS K");
    FY_MM(fy_cu_matmul_batched(lt, dk, 0, attb, q, Tp, hsp, Tp, 1, 0, st, sh, sh, L.BH, scale, 0.0f,
                               stream),
          "attention backward dS^T Q");
    att_unpermute_qkv<<<fy_cu_blocks((size_t)B * T * 3 * C, 256), 256, 0, stream>>>(
        dqkv, dqkvh, B, T, C, NH, Tp, hsp);
    FY_CUDA_LAUNCHED("att_unpermute_qkv");
    return 0;
}
