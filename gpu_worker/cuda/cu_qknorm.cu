/* Per-head RMSNorm of q and k (contract: cu_qknorm.h), computed as cu_rmsnorm computes a row: the
 * mean square and its reciprocal square root in fp32, the head normalised in fp32, times the
 * weight, rounded once to bf16. One warp per (row, head); warp sums are xor butterflies. The
 * weights' gradients: pass 1 sums, per chunk of QKN_CHUNK rows, each column over the chunk's rows
 * and the group's heads in order (one thread per column); pass 2 sums the chunks in order. */
#include "gpu_worker/cuda/cu_qknorm.h"

#include <errno.h>
#include <math.h>

#define QKN_WARPS 8   /* (row, head) pairs per block of the row kernels */
#define QKN_CHUNK 32  /* rows per partial sum of the weight gradients */

/* Head j of row n: column j hd of the fused row; raw and rstd are packed [N][NH + NKV]. */
static __global__ void qknorm_forward_kernel(bf16 *qkv, bf16 *__restrict__ raw,
                                             float *__restrict__ rstd,
                                             const bf16 *__restrict__ qw,
                                             const bf16 *__restrict__ kw, int N, int S, int NH,
                                             int NKV, int hd, float eps)
{
    const int lane = threadIdx.x % 32, heads = NH + NKV;
    const size_t pair = (size_t)blockIdx.x * QKN_WARPS + threadIdx.x / 32;
    if (pair >= (size_t)N * heads) /* the whole warp leaves together */
        return;
    const size_t n = pair / heads;
    const int j = (int)(pair % heads);
    bf16 *x = qkv + n * S + (size_t)j * hd, *xr = raw + pair * hd;
    const bf16 *w = j < NH ? qw : kw;
    float ss = 0.0f;
    for (int i = lane; i < hd; i += 32)
        ss += fy_cu_ld(x, i) * fy_cu_ld(x, i);
    const float r = 1.0f / sqrtf(fy_cu_warp_sum(ss) / (float)hd + eps);
    for (int i = lane; i < hd; i += 32) {
        const float v = fy_cu_ld(x, i);
        xr[i] = x[i];
        x[i] = __float2bfloat16_rn(fy_cu_ld(w, i) * (v * r));
    }
    if (lane == 0)
        rstd[pair] = r;
}

/* With xhat = x r and g = dy w: dx = r (g - xhat mean(g xhat)), in place of dy. */
static __global__ void qknorm_backward_kernel(bf16 *dqkv, const bf16 *__restrict__ raw,
                                              const float *__restrict__ rstd,
                                              const bf16 *__restrict__ qw,
                                              const bf16 *__restrict__ kw, int N, int S, int NH,
                                              int NKV, int hd)
{
    const int lane = threadIdx.x % 32, heads = NH + NKV;
    const size_t pair = (size_t)blockIdx.x * QKN_WARPS + threadIdx.x / 32;
    if (pair >= (size_t)N * heads)
        return;
    const size_t n = pair / heads;
    const int j = (int)(pair % heads);
    bf16 *dy = dqkv + n * S + (size_t)j * hd;
    const bf16 *x = raw + pair * hd, *w = j < NH ? qw : kw;
    const float r = rstd[pair];
    float gx = 0.0f;
    for (int i = lane; i < hd; i += 32)
        gx += fy_cu_ld(dy, i) * fy_cu_ld(w, i) * (fy_cu_ld(x, i) * r);
    gx = fy_cu_warp_sum(gx) / (float)hd; /* every read of dy is before the writes below */
    for (int i = lane; i < hd; i += 32) {
        const float g = r * (fy_cu_ld(dy, i) * fy_cu_ld(w, i) - (fy_cu_ld(x, i) * r) * gx);
        dy[i] = __float2bfloat16_rn(g);
    }
}

/* partial[grp][chunk][d] = sum over rows n of the chunk, then heads j of the group (grp 0: the
 * query heads, 1: the key heads), of dy[n][j][d] x[n][j][d] rstd[n][j]. Block (chunk, grp), one
 * thread per column d. */
static __global__ void qknorm_wgrad_partial(float *__restrict__ partial, const bf16 *dqkv,
                                            const bf16 *__restrict__ raw,
                                            const float *__restrict__ rstd, int N, int S, int NH,
                                            int NKV, int hd)
{
    const int d = threadIdx.x, chunk = blockIdx.x, grp = blockIdx.y, heads = NH + NKV;
    if (d >= hd)
        return;
    const int j0 = grp ? NH : 0, j1 = grp ? heads : NH;
    const int n0 = chunk * QKN_CHUNK, n1 = min(N, n0 + QKN_CHUNK);
    float acc = 0.0f;
    for (int n = n0; n < n1; n++)
        for (int j = j0; j < j1; j++) {
            const size_t pair = (size_t)n * heads + j;
            acc += fy_cu_ld(dqkv, (size_t)n * S + (size_t)j * hd + d) *
                   (fy_cu_ld(raw, pair * hd + d) * rstd[pair]);
        }
    partial[((size_t)grp * gridDim.x + chunk) * hd + d] = acc;
}

/* dw[d] += the chunks' partial sums in chunk order; block grp (0: dqw, 1: dkw). */
static __global__ void qknorm_wgrad_sum(float *dqw, float *dkw, const float *__restrict__ partial,
                                        int chunks, int hd)
{
    const int grp = blockIdx.x;
    float *dw = grp ? dkw : dqw;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int ch = 0; ch < chunks; ch++)
            acc += partial[((size_t)grp * chunks + ch) * hd + d];
        dw[d] += acc;
    }
}

static int qkn_chunks(int N) { return (N + QKN_CHUNK - 1) / QKN_CHUNK; }

size_t fy_cu_qknorm_scratch_floats(int N, int hd)
{
    return N > 0 && hd > 0 ? 2 * (size_t)qkn_chunks(N) * hd : 0;
}

static unsigned pair_blocks(int N, int heads)
{
    return (unsigned)(((size_t)N * heads + QKN_WARPS - 1) / QKN_WARPS);
}

/* The shape both directions take: heads within the row, hd a whole number of warps' work. */
static int qkn_shape_ok(int N, int S, int NH, int NKV, int hd)
{
    return N > 0 && NH > 0 && NKV > 0 && hd > 0 && hd <= 1024 && (size_t)(NH + NKV) * hd <= (size_t)S;
}

int fy_cu_qknorm_forward(bf16 *qkv, bf16 *raw, float *rstd, const bf16 *qw, const bf16 *kw, int N,
                         int S, int NH, int NKV, int hd, float eps, cudaStream_t stream)
{
    FY_REQUIRE(qkn_shape_ok(N, S, NH, NKV, hd) && eps > 0.0f, -EINVAL,
               "q/k norm: bad shape N=%d S=%d NH=%d NKV=%d hd=%d eps=%g", N, S, NH, NKV, hd,
               (double)eps);
    FY_REQUIRE(qkv && raw && rstd && qw && kw, -EINVAL, "q/k norm: NULL pointer");
    qknorm_forward_kernel<<<pair_blocks(N, NH + NKV), QKN_WARPS * 32, 0, stream>>>(
        qkv, raw, rstd, qw, kw, N, S, NH, NKV, hd, eps);
    FY_CUDA_LAUNCHED("qknorm_forward_kernel");
    return 0;
}

int fy_cu_qknorm_backward(bf16 *dqkv, float *dqw, float *dkw, float *scratch, const bf16 *raw,
                          const float *rstd, const bf16 *qw, const bf16 *kw, int N, int S, int NH,
                          int NKV, int hd, cudaStream_t stream)
{
    FY_REQUIRE(qkn_shape_ok(N, S, NH, NKV, hd), -EINVAL,
               "q/k norm: bad shape N=%d S=%d NH=%d NKV=%d hd=%d", N, S, NH, NKV, hd);
    FY_REQUIRE(dqkv && dqw && dkw && scratch && raw && rstd && qw && kw, -EINVAL,
               "q/k norm: NULL pointer");
    /* the weights' gradients first: they read dy, which the input gradient then overwrites */
    const int chunks = qkn_chunks(N);
    qknorm_wgrad_partial<<<dim3((unsigned)chunks, 2), (unsigned)((hd + 31) / 32 * 32), 0,
                           stream>>>(scratch, dqkv, raw, rstd, N, S, NH, NKV, hd);
    FY_CUDA_LAUNCHED("qknorm_wgrad_partial");
    qknorm_wgrad_sum<<<2, 128, 0, stream>>>(dqw, dkw, scratch, chunks, hd);
    FY_CUDA_LAUNCHED("qknorm_wgrad_sum");
    qknorm_backward_kernel<<<pair_blocks(N, NH + NKV), QKN_WARPS * 32, 0, stream>>>(
        dqkv, raw, rstd, qw, kw, N, S, NH, NKV, hd);
    FY_CUDA_LAUNCHED("qknorm_backward_kernel");
    return 0;
}
