/* Flash-style causal attention (the FlashAttention-2 algorithm) on tensor cores through WMMA (bf16
 * 16x16x16 fragments, fp32 accumulators): forward and a deterministic backward that never
 * materialise the T x T scores. An alternative to the materialising version in cu_attention.cu,
 * whose scratch grows as B NH T^2; this one needs only 8 B NH T bytes of scratch (rounded to 256).
 *
 * Notation: one (b, h) pair per CTA column (blockIdx.y = b*NH + h), hs = C / NH, hp = hs rounded up
 * to 16 (the WMMA k dimension; the extra columns are zeros and add nothing), tiles of 64 rows
 * (Br = Bc = 64), nblk = ceil(T / 64), scale = 1/sqrt(hs). q, k, v, dout are read straight from
 * the [B][T][3C] / [B][T][C] layouts (16-byte vector loads of 8 bf16; rows t >= T and columns
 * d >= hs are zero-filled in shared memory). Query rows t >= T of a tail block are computed on
 * zeros and never written; keys t >= T are always masked (a valid key satisfies tk <= tq < T).
 *
 * Forward, CTA (query block i, b*NH+h), 256 threads = 8 warps:
 *   Q_i -> smem (bf16); O = 0 (fp32 smem), m = -inf, l = 0 per row;
 *   for j = 0..i (the causal limit: Br = Bc, so block j > i is fully masked):
 *     K_j, V_j -> smem; S = Q_i K_j^T (WMMA, fp32);
 *     per row (one warp per row): s = S * scale, masked (tk > tq) to -inf; m' = max(m, max s);
 *       p = exp(s - m') (0 where masked); alpha = exp(m - m'); l = alpha l + sum p; m = m';
 *       P = bf16(p); O_row *= alpha;
 *     O += P V_j (WMMA).
 *   out = O / l (bf16), L = m + log(l) (f32, kept in scratch). Block j = 0 always holds key 0,
 *   which every row may see, so m is finite from the first block on (no -inf - -inf).
 * Backward:
 *   fl_bwd_dot:  D[t] = sum_d dout[t][d] * out[t][d] (one warp per row, fixed shuffle tree);
 *   fl_bwd_dkdv, CTA (key block j, b*NH+h): K_j, V_j -> smem; dK = dV = 0 (fp32 smem);
 *     for i = j..nblk-1 in order: Q_i, dO_i, L_i, D_i -> smem; S = Q_i K_j^T, dP = dO_i V_j^T;
 *       P = exp(S*scale - L) (0 where masked), dS = P (dP - D); dV += P^T dO_i; dK += dS^T Q_i;
 *     dk = scale dK, dv = dV written once.
 *   fl_bwd_dq, CTA (query block i, b*NH+h): Q_i, dO_i, L_i, D_i -> smem; dQ = 0;
 *     for j = 0..i in order: K_j, V_j -> smem; same S, P, dP, dS; dQ += dS K_j;  dq = scale dQ.
 *   P and dS are rounded to bf16 as WMMA operands; the softmax math is fp32 throughout.
 * Determinism: no atomics. Every element of out, dq, dk, dv is accumulated by exactly one warp of
 * one CTA, over the blocks in a fixed loop order, with WMMA (a fixed hardware reduction order), and
 * the row reductions are fixed xor-shuffle trees: reruns are bit-identical.
 *
 * Shared memory (dynamic; bytes incl. 128 for aligning the base; regions 128-byte aligned):
 *   bf16 tiles [64][hp+8] (Q, K, V, dO), fp32 tiles [64][68] (S, dP), bf16 [64][72] (P, dS),
 *   fp32 accumulators [64][hp+4] (O; dK, dV; dQ), two fp32 [64] vectors (m, l; L, D).
 *     hp:        16     32     48     64     80     96    112    128
 *     forward: 41600  51840  62080  72320  82560  92800 103040 113280
 *     dk dv:   76416  92800 109184 125568 141952 158336 174720 191104
 *     dq:      62080  74368  86656  98944 111232 123520 135808 148096
 *   All within Hopper's 227 KiB (232448 bytes) per block; the host checks the device's opt-in
 *   maximum and sets cudaFuncAttributeMaxDynamicSharedMemorySize. Leading dimensions hp+8 / 72
 *   (bf16, multiples of 8) and hp+4 / 68 (fp32, multiples of 4) satisfy WMMA's ldm rules, every
 *   fragment pointer is 32-byte aligned (tile offsets are multiples of 16 rows and 16 columns),
 *   and the padding staggers rows across banks.
 *
 * Scratch layout (256-byte aligned pieces): L f32 [B*NH][T], then D f32 [B*NH][T]. */
#include "gpu_worker/cuda/cu_flash.h"

#include <math.h>
#include <mma.h>

using namespace nvcuda;

#define FL_BLK 64      /* Br = Bc: rows of every tile */
#define FL_THREADS 256 /* 8 warps per CTA */
#define FL_WARPS (FL_THREADS / 32)
#define FL_LDS 68 /* fp32 [64][64] tiles S, dP: leading dimension */
#define FL_LDP 72 /* bf16 [64][64] tiles P, dS: leading dimension */
#define FL_HS_MAX 128

enum { FL_FWD = 0, FL_BWD_KV = 1, FL_BWD_Q = 2 };

/* ---- shared-memory layout (host and device compute the same offsets) ---- */

struct fl_layout {
    unsigned q, k, v, dout; /* bf16 [64][hp+8] */
    unsigned s, dp;         /* f32 [64][FL_LDS] */
    unsigned p, ds;         /* bf16 [64][FL_LDP] */
    unsigned acc0, acc1;    /* f32 [64][hp+4]: fwd O; kv dK, dV; q dQ */
    unsigned vec0, vec1;    /* f32 [64]: fwd m, l; bwd L, D */
    unsigned total;         /* bytes from the aligned base */
};

__host__ __device__ static inline unsigned fl_al128(unsigned n) { return (n + 127u) & ~127u; }
__host__ __device__ static inline int fl_ldb(int hp) { return hp + 8; }
__host__ __device__ static inline int fl_ldf(int hp) { return hp + 4; }

/* Regions a kernel does not use get size 0 (their offset equals the next one's): never touched. */
__host__ __device__ static inline struct fl_layout fl_carve(int kind, int hp)
{
    struct fl_layout L;
    unsigned tileb = fl_al128((unsigned)(FL_BLK * fl_ldb(hp) * 2));
    unsigned accf = fl_al128((unsigned)(FL_BLK * fl_ldf(hp) * 4));
    unsigned sf = fl_al128(FL_BLK * FL_LDS * 4), pb = fl_al128(FL_BLK * FL_LDP * 2);
    unsigned vec = fl_al128(FL_BLK * 4);
    int bwd = kind != FL_FWD;
    unsigned off = 0;
    L.q = off;
    off += tileb;
    L.k = off;
    off += tileb;
    L.v = off;
    off += tileb;
    L.dout = off;
    off += bwd ? tileb : 0;
    L.s = off;
    off += sf;
    L.dp = off;
    off += bwd ? sf : 0;
    L.p = off;
    off += kind != FL_BWD_Q ? pb : 0;
    L.ds = off;
    off += bwd ? pb : 0;
    L.acc0 = off;
    off += accf;
    L.acc1 = off;
    off += kind == FL_BWD_KV ? accf : 0;
    L.vec0 = off;
    off += vec;
    L.vec1 = off;
    off += vec;
    L.total = off;
    return L;
}

/* Dynamic shared memory bytes to request: the layout plus room to align its base to 128. */
static unsigned fl_smem_bytes(int kind, int hp) { return fl_carve(kind, hp).total + 128u; }

extern __shared__ unsigned char fl_smem_raw[];

/* The dynamic shared memory base rounded up to 128 bytes (in the shared window). */
__device__ static inline unsigned char *fl_smem_base(void)
{
    unsigned off = (unsigned)__cvta_generic_to_shared(fl_smem_raw);
    return fl_smem_raw + ((128u - (off & 127u)) & 127u);
}

/* ---- reductions (fixed xor-butterfly order; all 32 lanes get the result) ---- */

__device__ static inline float fl_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ static inline float fl_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* ---- tile movement ---- */

/* dst [64][ldb] (bf16, smem) <- rows t0..t0+63 of src, where row t starts at src + t * row_stride
 * (src already points at this head's column 0). Columns 0..hs-1 are copied, hs..hp-1 zeroed, rows
 * t >= T zeroed. hs and hp are multiples of 8: each 8-column chunk is either all in or all out.
 * Called by all threads; the caller synchronises before use. */
__device__ static void fl_load_tile(bf16 *dst, int ldb, const bf16 *src, size_t row_stride, int t0,
                                    int T, int hs, int hp)
{
    int chunks = hp / 8;
    for (int idx = threadIdx.x; idx < FL_BLK * chunks; idx += blockDim.x) {
        int r = idx / chunks, c8 = idx % chunks, t = t0 + r;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (t < T && c8 * 8 < hs)
            val = *(const uint4 *)(src + (size_t)t * row_stride + c8 * 8);
        *(uint4 *)(dst + r * ldb + c8 * 8) = val;
    }
}

/* vec[r] = src[t0 + r] for t0 + r < T, else 0 (64 floats). */
__device__ static void fl_load_vec(float *vec, const float *src, int t0, int T)
{
    for (int r = threadIdx.x; r < FL_BLK; r += blockDim.x)
        vec[r] = t0 + r < T ? src[t0 + r] : 0.0f;
}

__device__ static inline unsigned fl_pack2(float a, float b)
{
    return (unsigned)__bfloat16_as_ushort(__float2bfloat16(a)) |
           ((unsigned)__bfloat16_as_ushort(__float2bfloat16(b)) << 16);
}

/* Rows t0..t0+63 (t < T only), columns 0..hs-1 of dst (row t at dst + t * row_stride) <-
 * bf16(acc[r][d] * mul * (rowmul ? rowmul[r] : 1)), 8 columns per 16-byte store. */
__device__ static void fl_store_tile(bf16 *dst, size_t row_stride, const float *acc, int ldf,
                                     const float *rowmul, float mul, int t0, int T, int hs)
{
    int chunks = hs / 8;
    for (int idx = threadIdx.x; idx < FL_BLK * chunks; idx += blockDim.x) {
        int r = idx / chunks, c8 = idx % chunks, t = t0 + r;
        if (t >= T)
            continue;
        float f = rowmul ? mul * rowmul[r] : mul;
        const float *a = acc + r * ldf + c8 * 8;
        uint4 w = make_uint4(fl_pack2(a[0] * f, a[1] * f), fl_pack2(a[2] * f, a[3] * f),
                             fl_pack2(a[4] * f, a[5] * f), fl_pack2(a[6] * f, a[7] * f));
        *(uint4 *)(dst + (size_t)t * row_stride + c8 * 8) = w;
    }
}

/* ---- WMMA products on shared-memory tiles (called by all threads; no synchronisation inside) ---- */

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fl_frag_a;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> fl_frag_at;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> fl_frag_b;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fl_frag_bt;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> fl_frag_c;

/* C [64][64] f32 (ldc) = A [64][K] B [64][K]^T, A and B bf16 (lda, ldb), K = kdim (multiple of 16).
 * 16 output tiles of 16x16; warp w computes tiles w, w + 8. B^T as a col-major matrix_b: element
 * (k, n) of B^T is B[n][k] at B + n*ldb + k. */
__device__ static void fl_mm_abt(float *C, int ldc, const bf16 *A, int lda, const bf16 *B, int ldb,
                                 int kdim)
{
    int warp = threadIdx.x >> 5;
    for (int tile = warp; tile < 16; tile += FL_WARPS) {
        int tm = tile / 4, tn = tile % 4;
        fl_frag_c acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int kk = 0; kk < kdim; kk += 16) {
            fl_frag_a a;
            fl_frag_bt bt;
            wmma::load_matrix_sync(a, A + tm * 16 * lda + kk, lda);
            wmma::load_matrix_sync(bt, B + tn * 16 * ldb + kk, ldb);
            wmma::mma_sync(acc, a, bt, acc);
        }
        wmma::store_matrix_sync(C + tm * 16 * ldc + tn * 16, acc, ldc, wmma::mem_row_major);
    }
}

/* Acc [64][hp] f32 (ldacc) += A [64][64] B [64][hp], A bf16 (lda), B bf16 (ldb). 4 * hp/16 tiles;
 * warp w owns tiles w, w + 8, ... (load the accumulator, 4 MMAs over k, store it back). */
__device__ static void fl_mm_acc_ab(float *Acc, int ldacc, const bf16 *A, int lda, const bf16 *B,
                                    int ldb, int hp)
{
    int warp = threadIdx.x >> 5, nt = hp / 16;
    for (int tile = warp; tile < 4 * nt; tile += FL_WARPS) {
        int tm = tile / nt, tn = tile % nt;
        float *cp = Acc + tm * 16 * ldacc + tn * 16;
        fl_frag_c acc;
        wmma::load_matrix_sync(acc, cp, ldacc, wmma::mem_row_major);
        for (int kk = 0; kk < FL_BLK; kk += 16) {
            fl_frag_a a;
            fl_frag_b b;
            wmma::load_matrix_sync(a, A + tm * 16 * lda + kk, lda);
            wmma::load_matrix_sync(b, B + kk * ldb + tn * 16, ldb);
            wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(cp, acc, ldacc, wmma::mem_row_major);
    }
}

/* Acc [64][hp] f32 (ldacc) += A [64][64]^T B [64][hp]. A^T as a col-major matrix_a: element (m, k)
 * of A^T is A[k][m] at A + k*lda + m, so the tile (m0, k0) starts at A + k0*lda + m0. */
__device__ static void fl_mm_acc_atb(float *Acc, int ldacc, const bf16 *A, int lda, const bf16 *B,
                                     int ldb, int hp)
{
    int warp = threadIdx.x >> 5, nt = hp / 16;
    for (int tile = warp; tile < 4 * nt; tile += FL_WARPS) {
        int tm = tile / nt, tn = tile % nt;
        float *cp = Acc + tm * 16 * ldacc + tn * 16;
        fl_frag_c acc;
        wmma::load_matrix_sync(acc, cp, ldacc, wmma::mem_row_major);
        for (int kk = 0; kk < FL_BLK; kk += 16) {
            fl_frag_at at;
            fl_frag_b b;
            wmma::load_matrix_sync(at, A + kk * lda + tm * 16, lda);
            wmma::load_matrix_sync(b, B + kk * ldb + tn * 16, ldb);
            wmma::mma_sync(acc, at, b, acc);
        }
        wmma::store_matrix_sync(cp, acc, ldacc, wmma::mem_row_major);
    }
}

__device__ static void fl_zero(float *p, int n)
{
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        p[i] = 0.0f;
}

/* ---- forward ---- */

__global__ void __launch_bounds__(FL_THREADS)
    fl_forward_kernel(bf16 *out, float *Lse, const bf16 *qkv, int T, int C, int NH, int hs, int hp,
                      float scale)
{
    unsigned char *sm = fl_smem_base();
    const struct fl_layout lay = fl_carve(FL_FWD, hp);
    const int ldb = fl_ldb(hp), ldf = fl_ldf(hp);
    bf16 *Qs = (bf16 *)(sm + lay.q), *Ks = (bf16 *)(sm + lay.k), *Vs = (bf16 *)(sm + lay.v);
    float *Ss = (float *)(sm + lay.s);
    bf16 *Ps = (bf16 *)(sm + lay.p);
    float *Os = (float *)(sm + lay.acc0);
    float *mrow = (float *)(sm + lay.vec0), *lrow = (float *)(sm + lay.vec1);

    const int qb = blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = qb * FL_BLK, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t C3 = 3 * (size_t)C;
    const bf16 *seq = qkv + (size_t)b * T * C3 + (size_t)h * hs; /* this head's q at row 0 */

    fl_load_tile(Qs, ldb, seq, C3, q0, T, hs, hp);
    fl_zero(Os, FL_BLK * ldf);
    for (int r = threadIdx.x; r < FL_BLK; r += blockDim.x) {
        mrow[r] = -INFINITY;
        lrow[r] = 0.0f;
    }
    for (int kb = 0; kb <= qb; kb++) {
        const int k0 = kb * FL_BLK;
        fl_load_tile(Ks, ldb, seq + C, C3, k0, T, hs, hp);
        fl_load_tile(Vs, ldb, seq + 2 * (size_t)C, C3, k0, T, hs, hp);
        __syncthreads(); /* Q, K, V (and, first time, O, m, l) in place; previous P V done */
        fl_mm_abt(Ss, FL_LDS, Qs, ldb, Ks, ldb, hp);
        __syncthreads();
        /* online softmax: warp w owns rows w, w + 8, ...; lane owns columns lane, lane + 32 */
        for (int r = warp; r < FL_BLK; r += FL_WARPS) {
            const int tq = q0 + r;
            const float m_old = mrow[r], l_old = lrow[r];
            const int c0 = lane, c1 = lane + 32;
            const bool v0 = k0 + c0 <= tq && k0 + c0 < T, v1 = k0 + c1 <= tq && k0 + c1 < T;
            const float x0 = v0 ? Ss[r * FL_LDS + c0] * scale : -INFINITY;
            const float x1 = v1 ? Ss[r * FL_LDS + c1] * scale : -INFINITY;
            const float m_new = fmaxf(m_old, fl_warp_max(fmaxf(x0, x1)));
            /* m_new is finite: block 0 holds key 0, valid for every row */
            const float p0 = v0 ? expf(x0 - m_new) : 0.0f, p1 = v1 ? expf(x1 - m_new) : 0.0f;
            const float rs = fl_warp_sum(p0 + p1);
            const float alpha = expf(m_old - m_new); /* 0 on the first block (m_old = -inf) */
            Ps[r * FL_LDP + c0] = __float2bfloat16(p0);
            Ps[r * FL_LDP + c1] = __float2bfloat16(p1);
            for (int d = lane; d < hp; d += 32)
                Os[r * ldf + d] *= alpha;
            __syncwarp(); /* every lane has read m_old, l_old before lane 0 writes */
            if (lane == 0) {
                mrow[r] = m_new;
                lrow[r] = alpha * l_old + rs;
            }
        }
        __syncthreads();
        fl_mm_acc_ab(Os, ldf, Ps, FL_LDP, Vs, ldb, hp);
        __syncthreads(); /* O complete; K, V, P free for the next block */
    }
    /* L = m + log(l); then l becomes 1/l for the output scaling (same thread per row) */
    for (int r = threadIdx.x; r < FL_BLK; r += blockDim.x) {
        float l = lrow[r];
        if (q0 + r < T)
            Lse[(size_t)bh * T + q0 + r] = mrow[r] + logf(l);
        lrow[r] = 1.0f / l;
    }
    __syncthreads();
    fl_store_tile(out + (size_t)b * T * C + (size_t)h * hs, (size_t)C, Os, ldf, lrow, 1.0f, q0, T,
                  hs);
}

/* ---- backward ---- */

/* D[bh][t] = sum_d dout[b][t][h*hs + d] * out[b][t][h*hs + d]: one warp per row. */
__global__ void fl_bwd_dot(float *D, const bf16 *dout, const bf16 *out, int B, int T, int C, int NH,
                           int hs)
{
    const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    const size_t rows = (size_t)B * NH * T;
    for (size_t row = (size_t)blockIdx.x * wpb + (threadIdx.x >> 5); row < rows;
         row += (size_t)gridDim.x * wpb) {
        const int t = (int)(row % T);
        const size_t bh = row / T;
        const int b = (int)(bh / NH), h = (int)(bh % NH);
        const size_t base = ((size_t)b * T + t) * C + (size_t)h * hs;
        float acc = 0.0f;
        for (int d = lane; d < hs; d += 32)
            acc += __bfloat162float(dout[base + d]) * __bfloat162float(out[base + d]);
        acc = fl_warp_sum(acc);
        if (lane == 0)
            D[row] = acc;
    }
}

/* From S = Q K^T (raw) and dP = dO V^T of the block pair (q0, k0): P = exp(S*scale - L) and
 * dS = P (dP - D), 0 where masked (tq >= T or tk > tq); written in bf16 (Pb may be NULL). */
__device__ static void fl_softmax_bwd(bf16 *Pb, bf16 *dSb, const float *Ss, const float *dPs,
                                      const float *Lr, const float *Dr, int q0, int k0, int T,
                                      float scale)
{
    for (int idx = threadIdx.x; idx < FL_BLK * FL_BLK; idx += blockDim.x) {
        const int r = idx / FL_BLK, c = idx % FL_BLK, tq = q0 + r, tk = k0 + c;
        float p = 0.0f, ds = 0.0f;
        if (tq < T && tk <= tq) {
            p = expf(Ss[r * FL_LDS + c] * scale - Lr[r]);
            ds = p * (dPs[r * FL_LDS + c] - Dr[r]);
        }
        if (Pb)
            Pb[r * FL_LDP + c] = __float2bfloat16(p);
        dSb[r * FL_LDP + c] = __float2bfloat16(ds);
    }
}

/* CTA (key block kb, bh): dk, dv of rows k0..k0+63. */
__global__ void __launch_bounds__(FL_THREADS)
    fl_bwd_dkdv(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *Lse, const float *Dg,
                int T, int C, int NH, int hs, int hp, float scale)
{
    unsigned char *sm = fl_smem_base();
    const struct fl_layout lay = fl_carve(FL_BWD_KV, hp);
    const int ldb = fl_ldb(hp), ldf = fl_ldf(hp);
    bf16 *Qs = (bf16 *)(sm + lay.q), *Ks = (bf16 *)(sm + lay.k), *Vs = (bf16 *)(sm + lay.v);
    bf16 *dOs = (bf16 *)(sm + lay.dout);
    float *Ss = (float *)(sm + lay.s), *dPs = (float *)(sm + lay.dp);
    bf16 *Pb = (bf16 *)(sm + lay.p), *dSb = (bf16 *)(sm + lay.ds);
    float *dK = (float *)(sm + lay.acc0), *dV = (float *)(sm + lay.acc1);
    float *Lr = (float *)(sm + lay.vec0), *Dr = (float *)(sm + lay.vec1);

    const int kb = blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int k0 = kb * FL_BLK, nblk = (T + FL_BLK - 1) / FL_BLK;
    const size_t C3 = 3 * (size_t)C;
    const bf16 *seq = qkv + (size_t)b * T * C3 + (size_t)h * hs;
    const bf16 *dseq = dout + (size_t)b * T * C + (size_t)h * hs;
    const float *Lbh = Lse + (size_t)bh * T, *Dbh = Dg + (size_t)bh * T;

    fl_load_tile(Ks, ldb, seq + C, C3, k0, T, hs, hp);
    fl_load_tile(Vs, ldb, seq + 2 * (size_t)C, C3, k0, T, hs, hp);
    fl_zero(dK, FL_BLK * ldf);
    fl_zero(dV, FL_BLK * ldf);
    for (int qb = kb; qb < nblk; qb++) {
        const int q0 = qb * FL_BLK;
        fl_load_tile(Qs, ldb, seq, C3, q0, T, hs, hp);
        fl_load_tile(dOs, ldb, dseq, (size_t)C, q0, T, hs, hp);
        fl_load_vec(Lr, Lbh, q0, T);
        fl_load_vec(Dr, Dbh, q0, T);
        __syncthreads();
        fl_mm_abt(Ss, FL_LDS, Qs, ldb, Ks, ldb, hp);
        fl_mm_abt(dPs, FL_LDS, dOs, ldb, Vs, ldb, hp);
        __syncthreads();
        fl_softmax_bwd(Pb, dSb, Ss, dPs, Lr, Dr, q0, k0, T, scale);
        __syncthreads();
        fl_mm_acc_atb(dV, ldf, Pb, FL_LDP, dOs, ldb, hp);
        fl_mm_acc_atb(dK, ldf, dSb, FL_LDP, Qs, ldb, hp);
        __syncthreads(); /* Q, dO, P, dS free for the next block */
    }
    bf16 *dseq_kv = dqkv + (size_t)b * T * C3 + (size_t)h * hs;
    fl_store_tile(dseq_kv + C, C3, dK, ldf, NULL, scale, k0, T, hs);
    fl_store_tile(dseq_kv + 2 * (size_t)C, C3, dV, ldf, NULL, 1.0f, k0, T, hs);
}

/* CTA (query block qb, bh): dq of rows q0..q0+63. */
__global__ void __launch_bounds__(FL_THREADS)
    fl_bwd_dq(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *Lse, const float *Dg,
              int T, int C, int NH, int hs, int hp, float scale)
{
    unsigned char *sm = fl_smem_base();
    const struct fl_layout lay = fl_carve(FL_BWD_Q, hp);
    const int ldb = fl_ldb(hp), ldf = fl_ldf(hp);
    bf16 *Qs = (bf16 *)(sm + lay.q), *Ks = (bf16 *)(sm + lay.k), *Vs = (bf16 *)(sm + lay.v);
    bf16 *dOs = (bf16 *)(sm + lay.dout);
    float *Ss = (float *)(sm + lay.s), *dPs = (float *)(sm + lay.dp);
    bf16 *dSb = (bf16 *)(sm + lay.ds);
    float *dQ = (float *)(sm + lay.acc0);
    float *Lr = (float *)(sm + lay.vec0), *Dr = (float *)(sm + lay.vec1);

    const int qb = blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = qb * FL_BLK;
    const size_t C3 = 3 * (size_t)C;
    const bf16 *seq = qkv + (size_t)b * T * C3 + (size_t)h * hs;
    const bf16 *dseq = dout + (size_t)b * T * C + (size_t)h * hs;

    fl_load_tile(Qs, ldb, seq, C3, q0, T, hs, hp);
    fl_load_tile(dOs, ldb, dseq, (size_t)C, q0, T, hs, hp);
    fl_load_vec(Lr, Lse + (size_t)bh * T, q0, T);
    fl_load_vec(Dr, Dg + (size_t)bh * T, q0, T);
    fl_zero(dQ, FL_BLK * ldf);
    for (int kb = 0; kb <= qb; kb++) {
        const int k0 = kb * FL_BLK;
        fl_load_tile(Ks, ldb, seq + C, C3, k0, T, hs, hp);
        fl_load_tile(Vs, ldb, seq + 2 * (size_t)C, C3, k0, T, hs, hp);
        __syncthreads();
        fl_mm_abt(Ss, FL_LDS, Qs, ldb, Ks, ldb, hp);
        fl_mm_abt(dPs, FL_LDS, dOs, ldb, Vs, ldb, hp);
        __syncthreads();
        fl_softmax_bwd(NULL, dSb, Ss, dPs, Lr, Dr, q0, k0, T, scale);
        __syncthreads();
        fl_mm_acc_ab(dQ, ldf, dSb, FL_LDP, Ks, ldb, hp);
        __syncthreads(); /* K, V, dS free for the next block */
    }
    fl_store_tile(dqkv + (size_t)b * T * C3 + (size_t)h * hs, C3, dQ, ldf, NULL, scale, q0, T, hs);
}

/* ---- host ---- */

int fy_cu_flash_supported(int C, int NH)
{
    if (C <= 0 || NH <= 0 || C % NH != 0)
        return 0;
    int hs = C / NH;
    return hs % 8 == 0 && hs <= FL_HS_MAX;
}

static size_t fl_align256(size_t n) { return (n + 255) & ~(size_t)255; }

static int fl_shape_ok(int B, int T, int C, int NH)
{
    return B > 0 && T > 0 && fy_cu_flash_supported(C, NH) && (long long)B * NH <= 65535;
}

size_t fy_cu_flash_scratch_bytes(int B, int T, int C, int NH)
{
    if (!fl_shape_ok(B, T, C, NH))
        return 0;
    return 2 * fl_align256((size_t)B * NH * T * sizeof(float));
}

static int fl_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Allows `kernel` the dynamic shared memory of its largest configuration that this device can
 * give (the same value on every call, so concurrent callers never lower it under each other) and
 * checks that `need` fits. */
static int fl_prepare(const void *kernel, int kind, unsigned need, const char *what)
{
    int dev = 0, optin = 0;
    FY_CUDA(cudaGetDevice(&dev), "%s: cudaGetDevice", what);
    FY_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
            "%s: shared memory opt-in limit", what);
    if (need > (unsigned)optin) {
        fy_error("%s: needs %u bytes of shared memory per block, device %d allows %d", what, need,
                 dev, optin);
        return -ENOTSUP;
    }
    unsigned cap = fl_smem_bytes(kind, FL_HS_MAX);
    if (cap > (unsigned)optin)
        cap = (unsigned)optin;
    FY_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cap),
            "%s: setting max dynamic shared memory to %u", what, cap);
    return 0;
}

int fy_cu_flash_forward(bf16 *out, const bf16 *qkv, void *scratch, int B, int T, int C, int NH,
                        cudaStream_t stream)
{
    if (!fl_shape_ok(B, T, C, NH)) {
        fy_error("fy_cu_flash_forward: unsupported shape B=%d T=%d C=%d NH=%d (hs must be a "
                 "multiple of 8, at most %d; B*NH at most 65535)",
                 B, T, C, NH, FL_HS_MAX);
        return -EINVAL;
    }
    if (!fl_aligned16(out) || !fl_aligned16(qkv) || !fl_aligned16(scratch)) {
        fy_error("fy_cu_flash_forward: out, qkv and scratch must be 16-byte aligned");
        return -EINVAL;
    }
    int hs = C / NH, hp = (hs + 15) & ~15, nblk = (T + FL_BLK - 1) / FL_BLK;
    float scale = 1.0f / sqrtf((float)hs);
    float *Lse = (float *)scratch;
    unsigned smem = fl_smem_bytes(FL_FWD, hp);
    int rc = fl_prepare((const void *)fl_forward_kernel, FL_FWD, smem, "fy_cu_flash_forward");
    if (rc)
        return rc;
    fl_forward_kernel<<<dim3((unsigned)nblk, (unsigned)(B * NH)), FL_THREADS, smem, stream>>>(
        out, Lse, qkv, T, C, NH, hs, hp, scale);
    FY_CUDA_LAUNCHED("fl_forward_kernel");
    return 0;
}

int fy_cu_flash_backward(bf16 *dqkv, const bf16 *dout, const bf16 *out, const bf16 *qkv,
                         void *scratch, int B, int T, int C, int NH, cudaStream_t stream)
{
    if (!fl_shape_ok(B, T, C, NH)) {
        fy_error("fy_cu_flash_backward: unsupported shape B=%d T=%d C=%d NH=%d (hs must be a "
                 "multiple of 8, at most %d; B*NH at most 65535)",
                 B, T, C, NH, FL_HS_MAX);
        return -EINVAL;
    }
    if (!fl_aligned16(dqkv) || !fl_aligned16(dout) || !fl_aligned16(out) || !fl_aligned16(qkv) ||
        !fl_aligned16(scratch)) {
        fy_error("fy_cu_flash_backward: dqkv, dout, out, qkv and scratch must be 16-byte aligned");
        return -EINVAL;
    }
    int hs = C / NH, hp = (hs + 15) & ~15, nblk = (T + FL_BLK - 1) / FL_BLK;
    float scale = 1.0f / sqrtf((float)hs);
    const float *Lse = (const float *)scratch;
    float *D = (float *)((char *)scratch + fl_align256((size_t)B * NH * T * sizeof(float)));
    unsigned smem_kv = fl_smem_bytes(FL_BWD_KV, hp), smem_q = fl_smem_bytes(FL_BWD_Q, hp);
    int rc = fl_prepare((const void *)fl_bwd_dkdv, FL_BWD_KV, smem_kv, "fy_cu_flash_backward dk dv");
    if (rc)
        return rc;
    rc = fl_prepare((const void *)fl_bwd_dq, FL_BWD_Q, smem_q, "fy_cu_flash_backward dq");
    if (rc)
        return rc;

    size_t rows = (size_t)B * NH * T;
    fl_bwd_dot<<<fy_cu_blocks(rows, 8), 256, 0, stream>>>(D, dout, out, B, T, C, NH, hs);
    FY_CUDA_LAUNCHED("fl_bwd_dot");
    dim3 grid((unsigned)nblk, (unsigned)(B * NH));
    fl_bwd_dkdv<<<grid, FL_THREADS, smem_kv, stream>>>(dqkv, dout, qkv, Lse, D, T, C, NH, hs, hp,
                                                        scale);
    FY_CUDA_LAUNCHED("fl_bwd_dkdv");
    fl_bwd_dq<<<grid, FL_THREADS, smem_q, stream>>>(dqkv, dout, qkv, Lse, D, T, C, NH, hs, hp,
                                                     scale);
    FY_CUDA_LAUNCHED("fl_bwd_dq");
    return 0;
}
