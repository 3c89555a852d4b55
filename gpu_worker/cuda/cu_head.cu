/* The LM head with cross-entropy on the GPU (the contract is cu_head.h): logits in chunks of rows
 * through cuBLASLt (fy_cu_matmul_batched: one algorithm per shape, no atomics), and kernels that
 * reduce in a fixed order (warp shuffles in a fixed tree, then shared memory in warp order), so
 * every result is bitwise reproducible.
 *
 * Scratch layout (256-byte aligned pieces):
 *   cnt     int32 [1] number of targets >= 0 in the call's rows, then f32 [1] 1/count (0 if count
 *           0), count being the caller's where it gives one (the whole batch of several gpu
 *           workers, of which these rows are a share), else that number
 *   logits  f32  [chunk_rows][V]  logits of one chunk
 *   dlog    bf16 [chunk_rows][V]  (softmax - onehot) / count of one chunk (backward only)
 * Per chunk of R <= chunk_rows rows, in order on the stream: logits = xn_chunk wte^T (cuBLASLt,
 * f32 out); a block per row computes max, sum of exp (fp32), the row loss and, with dxn, the bf16
 * dlogits; dxn_chunk = dlog wte (bf16, overwritten); dwte += dlog^T xn_chunk (f32, beta = 1).
 * V is not padded: cuBLASLt takes leading dimensions V that are not multiples of 8 (through slower
 * algorithms; see cu_matmul.cu). Targets must be < V; a target >= V gets loss NaN (visible) and no
 * one-hot term, never an out-of-bounds read. */
#include "gpu_worker/cuda/cu_head.h"

#include <math.h>

#include "gpu_worker/cuda/cu_reduce.h"

#define FY_HEAD_THREADS 256

static inline size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* ---- head kernels ---- */

/* One block: cnt[0] = number of targets >= 0 (exact integer sum), ((float *)cnt)[1] = 1/count or
 * 0, count being `given` where it is not 0, else cnt[0]. */
__global__ void head_count(int32_t *cnt, const int32_t *targets, int N, uint64_t given)
{
    __shared__ int part[FY_HEAD_THREADS];
    int c = 0;
    for (int i = threadIdx.x; i < N; i += blockDim.x)
        c += targets[i] >= 0;
    part[threadIdx.x] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        int total = 0;
        for (int i = 0; i < (int)blockDim.x; i++)
            total += part[i];
        cnt[0] = total;
        float count = given > 0 ? (float)given : (float)total;
        ((float *)cnt)[1] = count > 0 ? 1.0f / count : 0.0f;
    }
}

/* One block per row r of the chunk: losses[r] = logsumexp(z) - z[target] (0 when target < 0);
 * with dlog != NULL, dlog[r][v] = bf16((softmax(z)[v] - [v == target]) * inv_count), a zero row for
 * ignored targets. */
__global__ void head_softmax_loss(float *losses, bf16 *dlog, const float *logits,
                                  const int32_t *targets, const int32_t *cnt, int R, int V)
{
    __shared__ float sh[33];
    float inv_count = ((const float *)cnt)[1];
    for (int r = blockIdx.x; r < R; r += gridDim.x) {
        const float *z = logits + (size_t)r * V;
        int target = targets[r];
        if (target < 0) {
            if (threadIdx.x == 0)
                losses[r] = 0.0f;
            if (dlog)
                for (int v = threadIdx.x; v < V; v += blockDim.x)
                    dlog[(size_t)r * V + v] = __float2bfloat16(0.0f);
            continue;
        }
        float m = -INFINITY;
        for (int v = threadIdx.x; v < V; v += blockDim.x)
            m = fmaxf(m, z[v]);
        m = block_reduce<fy_op_max>(m, sh);
        float s = 0.0f;
        for (int v = threadIdx.x; v < V; v += blockDim.x)
            s += expf(z[v] - m);
        s = block_reduce<fy_op_sum>(s, sh);
        if (threadIdx.x == 0)
            losses[r] = target < V ? logf(s) + m - z[target] : NAN;
        if (dlog)
            for (int v = threadIdx.x; v < V; v += blockDim.x) {
                float g = expf(z[v] - m) / s - (v == target ? 1.0f : 0.0f);
                dlog[(size_t)r * V + v] = __float2bfloat16(g * inv_count);
            }
    }
}

/* ---- head ---- */

struct head_layout {
    size_t off_cnt, off_logits, off_dlog, total;
};

static void head_carve(struct head_layout *L, int chunk_rows, int V)
{
    size_t off = 0;
    L->off_cnt = off;
    off += align256(2 * sizeof(int32_t));
    L->off_logits = off;
    off += align256((size_t)chunk_rows * V * sizeof(float));
    L->off_dlog = off;
    off += align256((size_t)chunk_rows * V * sizeof(bf16));
    L->total = off;
}

size_t fy_cu_head_scratch_bytes(int chunk_rows, int V)
{
    if (chunk_rows <= 0 || V <= 0)
        return 0;
    struct head_layout L;
    head_carve(&L, chunk_rows, V);
    return L.total;
}

int fy_cu_head(struct fy_cu_lt *lt, float *losses, bf16 *dxn, float *dwte, const bf16 *xn,
               const bf16 *wte, const int32_t *targets, uint64_t count, int N, int C, int V,
               int chunk_rows, void *scratch, cudaStream_t stream)
{
    if (N < 0 || C <= 0 || V <= 0 || chunk_rows <= 0 || (dxn && !dwte)) {
        fy_error("fy_cu_head: bad arguments N=%d C=%d V=%d chunk_rows=%d dxn=%p dwte=%p", N, C, V,
                 chunk_rows, (void *)dxn, (void *)dwte);
        return -EINVAL;
    }
    if (N == 0)
        return 0;
    struct head_layout L;
    head_carve(&L, chunk_rows, V);
    char *base = (char *)scratch;
    int32_t *cnt = (int32_t *)(base + L.off_cnt);
    float *logits = (float *)(base + L.off_logits);
    bf16 *dlog = dxn ? (bf16 *)(base + L.off_dlog) : NULL;

    head_count<<<1, FY_HEAD_THREADS, 0, stream>>>(cnt, targets, N, count);
    FY_CUDA_LAUNCHED("head_count");
    for (int r0 = 0; r0 < N; r0 += chunk_rows) {
        int R = N - r0 < chunk_rows ? N - r0 : chunk_rows;
        const bf16 *x = xn + (size_t)r0 * C;
        /* logits [R][V] = x [R][C] @ wte[V][C]^T, f32 */
        FY_MM(fy_cu_matmul_batched(lt, logits, 1, x, wte, R, V, C, 0, 1, 0, 0, 0, 1, 1.0f, 0.0f,
                                   stream),
              "head logits");
        unsigned blocks = (unsigned)(R < 65535 ? R : 65535);
        head_softmax_loss<<<blocks, FY_HEAD_THREADS, 0, stream>>>(losses + r0, dlog, logits,
                                                                  targets + r0, cnt, R, V);
        FY_CUDA_LAUNCHED("head_softmax_loss");
        if (!dxn)
            continue;
        /* dxn [R][C] = dlog [R][V] @ wte [V][C], bf16, overwritten */
        FY_MM(fy_cu_matmul_batched(lt, dxn + (size_t)r0 * C, 0, dlog, wte, R, C, V, 0, 0, 0, 0, 0, 1,
                                   1.0f, 0.0f, stream),
              "head dxn");
        /* dwte [V][C] += dlog^T [V][R] @ x [R][C], f32 */
        FY_MM(fy_cu_matmul_batched(lt, dwte, 1, dlog, x, V, C, R, 1, 0, 0, 0, 0, 1, 1.0f, 1.0f,
                                   stream),
              "head dwte");
    }
    return 0;
}
