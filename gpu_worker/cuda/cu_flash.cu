/* Flash-style causal attention (the FlashAttention-2 algorithm) on tensor cores: forward and a
 * deterministic backward that never materialise the T x T scores. An alternative to the
 * materialising version in cu_attention.cu, whose scratch grows as B NH T^2; this one needs only
 * 8 B NH T bytes of scratch (rounded to 256).
 *
 * Products: mma.sync.m16n8k16 (bf16 operands, fp32 accumulators) through inline PTX; the
 * accumulators (O; dK, dV; dQ) and the score tiles (S/P, dP/dS) live in registers, in the
 * documented C/D fragment layout: thread lane (g = lane / 4, c = lane % 4) of a warp owning 16
 * rows holds, per 8-column n-tile, rows g and g + 8 at columns 2c, 2c + 1. Row reductions are
 * quad shuffles (xor 1, 2); an accumulator tile of P or dS is re-packed to bf16 as the A operand of
 * the next product without going through shared memory. Operand tiles are copied to shared memory
 * by cp.async (16 bytes; zero-filled rows t >= T and columns d >= hs) and fed to the MMAs by
 * ldmatrix (.trans where the reduction runs along the tile's rows: V in P V, dO in P^T dO, Q in
 * dS^T Q, K in dS K). Kernels are instantiated per hp = hs rounded up to 16 (16..128).
 *
 * Tiles: Br = Bc = 64 (FL_BLK), 4 warps (128 threads) per CTA, each warp 16 rows; shared tiles
 * [64][hp+8] bf16 (16-byte row padding: ldmatrix conflict-free for every hp); nblk = ceil(T/64);
 * scale = 1/sqrt(hs); exponentials as exp2f with log2(e) folded into the scale (fp32).
 *
 * Forward, CTA (query block i = nblk-1-blockIdx.x, heaviest first; b*NH+h): Q_i and K_0, V_0 ->
 *   smem, each warp's Q rows then kept as MMA A fragments in registers; for j = 0..i (K_{j+1},
 *   V_{j+1} prefetched into the other buffer while block j is used): S = Q_i K_j^T (registers),
 *   the diagonal block j = i masked (key > query -> -inf; keys t >= T are then masked too for
 *   every valid row), online softmax per row (m = running max of
 *   the raw scores, per-thread partial l), O = alpha O + P V_j. Block 0 holds key 0, valid for
 *   every row, so m is finite from block 0 on. End: l summed over the quad, out = O / l (bf16),
 *   L = m scale + log l (f32, scratch). Query rows t >= T are computed on zeros, never written.
 * Backward:
 *   fl_bwd_dot:  D[t] = sum_d dout[t][d] * out[t][d] (one warp per row, fixed shuffle tree);
 *   fl_bwd_dkdv, CTA (key block j, b*NKV+kvh), warp w owns keys 16w..16w+15 of the block; K_j,
 *     V_j in smem; for each query head h of kv head kvh in order, for i = j..nblk-1 in order (the
 *     next step's Q, dO, L, D prefetched): P^T = exp(K_j Q_i^T scale - L) (0 where key > query or
 *     query >= T, checked on the diagonal and the tail block), dV += P^T dO_i,
 *     dS^T = P^T (V_j dO_i^T - D), dK += dS^T Q_i;  dk = scale dK, dv = dV.
 *   fl_bwd_dq, CTA (query block i, heaviest first), warp w owns rows 16w..: Q_i, dO_i in smem, L, D
 *     of its rows in registers; for j = 0..i in order: P = exp(Q_i K_j^T scale - L) (diagonal
 *     masked), dS = P (dO_i V_j^T - D), dQ += dS K_j;  dq = scale dQ.
 *   P and dS are rounded to bf16 as MMA operands; the softmax math is fp32 throughout.
 * Determinism: no atomics. Every element of out, dq, dk, dv is accumulated in registers of one
 * thread, over the blocks in a fixed loop order, by MMAs (a fixed hardware reduction order); row
 * reductions are fixed shuffle trees: reruns are bit-identical.
 *
 * Shared memory per CTA (dynamic, + 128 bytes for aligning the base), tile = 128 (hp+8) bytes:
 *   forward 5 tiles (Q, K[2], V[2]); dk dv 6 tiles (K, V, Q[2], dO[2]) + 1 KiB (L[2], D[2]);
 *   dq 6 tiles (Q, dO, K[2], V[2]). hp 128: 87168 / 105600 / 104576 bytes; hp 80: 56448 / 68736 /
 *   67712; hp 64: 46208 / 56448 / 55424. Registers (ptxas, sm_90, no spills): forward 96..204,
 *   dk dv 126..255, dq 114..234 (hp 16..128), so 2 CTAs (8 warps) per SM at hp 128. The dk dv loop
 *   works on the 64 queries in two halves of 32 (not unrolled) to stay within 255 registers.
 *
 * Grouped-query attention (NKV kv heads, the layout is in cu_flash.h) changes only where the
 * tiles come from and the dk dv grid; with NKV = NH every kernel does what it did for multi-head
 * attention, in the same order.
 *
 * Masks (the kernels' MASK: FL_WIN, FL_DOC or both; 0 is the plain causal code above, instruction
 * for instruction). Sliding window W (FL_WIN; W < T): query t sees keys t - W < j <= t. The forward
 * and dq start at the key block holding q0 - W + 1 (blocks before it are wholly outside the band
 * and skipped), dk dv stop at the query block holding k0 + 63 + W - 1, and every tile is masked to
 * the band. Documents (FL_DOC; positions [B][T] of gpu_worker/backend_ops.h): query t sees keys
 * t - pos[t] <= j <= t, its own document's. The forward and dq also start no earlier than the key
 * block holding the least document start of the tile's queries (a shared minimum over the 64
 * rows), dk dv also stop at the query block holding the last query whose document starts within
 * the tile's 64 keys (a shared maximum over a scan of the row's later positions); each thread keeps
 * its rows' document starts in registers (forward, dq), or reads its query columns' positions from
 * shared memory, prefetched with L and D (dk dv). The blocks computed are exactly those in which
 * some query sees some key (tests/test_cu_flash_emu.cc counts them). A row may see no key of its
 * first block: its max stays -inf and that block adds nothing (alpha 1, p 0); its diagonal block
 * always holds the key t itself.
 *
 * Scratch layout (256-byte aligned pieces): L f32 [B*NH][T], then D f32 [B*NH][T]. */
#include "gpu_worker/cuda/cu_flash.h"

#include <math.h>

/* ---- PTX primitives (sm_80+): cp.async, ldmatrix, mma.sync m16n8k16 bf16 -> f32 ---- */

__device__ static inline unsigned fl_sa(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

/* 16 (or, with bytes = 0, zero) bytes global -> shared, asynchronous; both 16-byte aligned. */
__device__ static inline void fl_cp16(void *dst, const void *src, int bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(fl_sa(dst)), "l"(src),
                 "r"(bytes)
                 : "memory");
}

/* 4 (or, with bytes = 0, zero) bytes global -> shared, asynchronous. */
__device__ static inline void fl_cp4(void *dst, const void *src, int bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(fl_sa(dst)), "l"(src),
                 "r"(bytes)
                 : "memory");
}

__device__ static inline void fl_cp_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* Waits for all of this thread's cp.async groups (a __syncthreads must follow before other threads
 * read the data). */
__device__ static inline void fl_cp_wait_all(void)
{
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

/* Four 8x8 bf16 matrices; lane l gives the address of row l % 8 of matrix l / 8 (16-byte aligned).
 * Register i of lane l: matrix i, row l / 4, columns 2 (l % 4), 2 (l % 4) + 1. */
__device__ static inline void fl_ldsm4(unsigned (&r)[4], const bf16 *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(fl_sa(p))
                 : "memory");
}

/* The same, transposed: register i of lane l holds matrix i, rows 2 (l % 4), 2 (l % 4) + 1 of
 * column l / 4. */
__device__ static inline void fl_ldsm4t(unsigned (&r)[4], const bf16 *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(fl_sa(p))
                 : "memory");
}

/* d (16x8 f32) += a (16x16 bf16, row) * b (16x8 bf16, col), fragment layouts of the PTX ISA. */
__device__ static inline void fl_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                     unsigned b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, "
                 "%6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* ---- EMU BEGIN: constants, tile movement, kernels (everything up to the host part) ---- */

#define FL_BLK 64      /* Br = Bc: query rows and keys per tile */
#define FL_THREADS 128 /* 4 warps, 16 query (or key) rows each */
#define FL_HS_MAX 128
#define FL_LOG2E 1.4426950408889634f

/* bf16 elements per shared-memory tile row: hp + 8 (16 bytes of padding; conflict-free ldmatrix) */
#define FL_LD(HP) ((HP) + 8)
#define FL_TILE(HP) (FL_BLK * FL_LD(HP)) /* bf16 elements per tile */

extern __shared__ unsigned char fl_smem_raw[];

/* The dynamic shared memory base rounded up to 128 bytes (in the shared window). */
__device__ static inline unsigned char *fl_smem_base(void)
{
    unsigned off = (unsigned)__cvta_generic_to_shared(fl_smem_raw);
    return fl_smem_raw + ((128u - (off & 127u)) & 127u);
}

__device__ static inline unsigned fl_pack2(float a, float b)
{
    return (unsigned)__bfloat16_as_ushort(__float2bfloat16(a)) |
           ((unsigned)__bfloat16_as_ushort(__float2bfloat16(b)) << 16);
}

/* dst [64][HP+8] (bf16, smem) <- rows t0..t0+63 of src (row t at src + t * row_stride, src at this
 * head's column 0) by cp.async: columns 0..hs-1 copied, hs..HP-1 and rows t >= T zero-filled. */
template <int HP>
__device__ static inline void fl_load_tile(bf16 *dst, const bf16 *src, size_t row_stride, int t0,
                                           int T, int hs)
{
    constexpr int chunks = HP / 8;
    for (int idx = threadIdx.x; idx < FL_BLK * chunks; idx += FL_THREADS) {
        const int r = idx / chunks, c8 = idx % chunks, t = t0 + r;
        const bool ok = t < T && c8 * 8 < hs;
        fl_cp16(dst + r * FL_LD(HP) + c8 * 8, ok ? src + (size_t)t * row_stride + c8 * 8 : src,
                ok ? 16 : 0);
    }
}

/* vec[r] <- src[t0 + r] (0 for t0 + r >= T), r < 64, by cp.async. */
__device__ static inline void fl_load_vec(float *vec, const float *src, int t0, int T)
{
    for (int r = threadIdx.x; r < FL_BLK; r += FL_THREADS) {
        const bool ok = t0 + r < T;
        fl_cp4(vec + r, ok ? src + t0 + r : src, ok ? 4 : 0);
    }
}

/* The same for positions (int32). */
__device__ static inline void fl_load_ivec(int *vec, const int32_t *src, int t0, int T)
{
    for (int r = threadIdx.x; r < FL_BLK; r += FL_THREADS) {
        const bool ok = t0 + r < T;
        fl_cp4(vec + r, ok ? src + t0 + r : src, ok ? 4 : 0);
    }
}

/* ---- warp-level products (mma.m16n8k16; "fragment" layouts of the PTX ISA) ----
 * Each warp owns 16 rows. Thread lane: g = lane / 4, c = lane % 4. An accumulator n-tile acc[n][4]
 * holds rows g (elements 0, 1) and g + 8 (elements 2, 3), columns 8n + 2c and 8n + 2c + 1. */

/* acc[N][4] (16 x 8N) = A (16 rows at A, [..][HP+8]) * B^T, B 8N rows at Bm (same layout): both
 * operands with the reduction dimension contiguous (non-transposed ldmatrix). N even. */
template <int HP, int N>
__device__ static inline void fl_mm_nt(float (&acc)[N][4], const bf16 *A, const bf16 *Bm, int lane)
{
#pragma unroll
    for (int n = 0; n < N; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[n][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < HP / 16; ks++) {
        unsigned a[4];
        fl_ldsm4(a, A + (lane & 15) * FL_LD(HP) + ks * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int np = 0; np < N / 2; np++) {
            unsigned b[4];
            fl_ldsm4(b, Bm + (np * 16 + (lane & 7) + (lane >> 4) * 8) * FL_LD(HP) + ks * 16 +
                            ((lane >> 3) & 1) * 8);
            fl_mma(acc[2 * np], a, b[0], b[1]);
            fl_mma(acc[2 * np + 1], a, b[2], b[3]);
        }
    }
}

/* The same with A held in registers: qa[ks] = the A fragments of columns 16ks..16ks+15 (loaded by
 * fl_load_afrag). */
template <int HP, int N>
__device__ static inline void fl_mm_nt_ra(float (&acc)[N][4], const unsigned (&qa)[HP / 16][4],
                                          const bf16 *Bm, int lane)
{
#pragma unroll
    for (int n = 0; n < N; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[n][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < HP / 16; ks++) {
#pragma unroll
        for (int np = 0; np < N / 2; np++) {
            unsigned b[4];
            fl_ldsm4(b, Bm + (np * 16 + (lane & 7) + (lane >> 4) * 8) * FL_LD(HP) + ks * 16 +
                            ((lane >> 3) & 1) * 8);
            fl_mma(acc[2 * np], qa[ks], b[0], b[1]);
            fl_mma(acc[2 * np + 1], qa[ks], b[2], b[3]);
        }
    }
}

/* qa[ks] <- A fragments of the 16 rows at A ([..][HP+8]), columns 16ks..16ks+15. */
template <int HP>
__device__ static inline void fl_load_afrag(unsigned (&qa)[HP / 16][4], const bf16 *A, int lane)
{
#pragma unroll
    for (int ks = 0; ks < HP / 16; ks++)
        fl_ldsm4(qa[ks], A + (lane & 15) * FL_LD(HP) + ks * 16 + (lane >> 4) * 8);
}

/* acc[HP/8][4] (16 x HP) += P (16 x 8N, in accumulator layout p[N][4], rounded to bf16) * B,
 * B 8N rows x HP at Bm ([..][HP+8], the reduction dimension = rows: transposed ldmatrix). */
template <int HP, int N>
__device__ static inline void fl_mm_pv(float (&acc)[HP / 8][4], const float (&p)[N][4],
                                       const bf16 *Bm, int lane)
{
#pragma unroll
    for (int ks = 0; ks < N / 2; ks++) {
        unsigned a[4];
        a[0] = fl_pack2(p[2 * ks][0], p[2 * ks][1]);
        a[1] = fl_pack2(p[2 * ks][2], p[2 * ks][3]);
        a[2] = fl_pack2(p[2 * ks + 1][0], p[2 * ks + 1][1]);
        a[3] = fl_pack2(p[2 * ks + 1][2], p[2 * ks + 1][3]);
#pragma unroll
        for (int dp = 0; dp < HP / 16; dp++) {
            unsigned b[4];
            fl_ldsm4t(b, Bm + (ks * 16 + (lane & 15)) * FL_LD(HP) + dp * 16 + (lane >> 4) * 8);
            fl_mma(acc[2 * dp], a, b[0], b[1]);
            fl_mma(acc[2 * dp + 1], a, b[2], b[3]);
        }
    }
}

/* Rows row0 + g, row0 + g + 8 (< T only) of dst (row t at dst + t * row_stride), columns < hs:
 * bf16(acc * mul0) (row g), bf16(acc * mul1) (row g + 8), 4-byte stores. */
template <int HP>
__device__ static inline void fl_store_acc(bf16 *dst, size_t row_stride,
                                           const float (&acc)[HP / 8][4], float mul0, float mul1,
                                           int row0, int T, int hs, int lane)
{
    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int t = row0 + g + 8 * i;
        if (t >= T)
            continue;
        const float mul = i ? mul1 : mul0;
        bf16 *d = dst + (size_t)t * row_stride + 2 * c;
#pragma unroll
        for (int n = 0; n < HP / 8; n++)
            if (n * 8 < hs)
                *(unsigned *)(d + n * 8) = fl_pack2(acc[n][2 * i] * mul, acc[n][2 * i + 1] * mul);
    }
}

/* ---- where a head's rows lie ----
 * The fused qkv of grouped-query attention is [B][T][S], S = (NH + 2 NKV) hs: query head h at
 * columns h hs, then the NKV key heads, then the NKV value heads; query head h reads kv head
 * h / (NH / NKV). Multi-head attention (GPT-2's [B][T][3C]) is NKV = NH. out and dout are
 * [B][T][NH hs]. */

__device__ static inline size_t fl_qkv_row(int NH, int NKV, int hs)
{
    return (size_t)(NH + 2 * NKV) * hs;
}

/* Row 0 of head h of sequence b in a [B][T][S] tensor whose heads start at column 0. */
__device__ static inline const bf16 *fl_query(const bf16 *base, int b, int h, int T, size_t S,
                                              int hs)
{
    return base + (size_t)b * T * S + (size_t)h * hs;
}

/* Row 0 of the keys of kv head kvh of sequence b (its values are NKV hs further on). */
__device__ static inline const bf16 *fl_keys(const bf16 *qkv, int b, int kvh, int T, size_t S,
                                             int NH, int hs)
{
    return qkv + (size_t)b * T * S + (size_t)(NH + kvh) * hs;
}

/* ---- masks (the kernels' MASK, a union of bits): FL_WIN, the sliding window (query q attends to
 * keys k with q - W < k <= q), and FL_DOC, the documents of positions [B][T] (query q attends to
 * keys k >= q - pos[q], the start of its document, and <= q). MASK 0 is the plain causal kernels,
 * instruction for instruction: every masked branch below is behind `if (MASK)` or MASK's bits.
 * Key blocks that the mask empties for every query of a tile are skipped, not computed: the
 * forward and dq start at the key block holding the tile's earliest visible key, dk dv stop at the
 * query block holding the last query that sees a key of the tile. ---- */

#define FL_WIN 1
#define FL_DOC 2

__device__ static inline bool fl_in_band(int q, int k, int W) { return k <= q && k > q - W; }

/* Whether query q, whose document starts at key s (FL_DOC), sees key k (MASK != 0). */
template <int MASK> __device__ static inline bool fl_sees(int q, int k, int W, int s)
{
    const bool ok = (MASK & FL_WIN) ? fl_in_band(q, k, W) : k <= q;
    return (MASK & FL_DOC) ? ok && k >= s : ok;
}

/* The least document start (q - pos[q]) of the queries q0..q0+63 (< T) of row pos: every thread of
 * the CTA calls it (it synchronises them). */
__device__ static inline int fl_doc_first_start(const int32_t *pos, int q0, int T)
{
    __shared__ int first;
    if (threadIdx.x == 0)
        first = q0; /* query q0's start is at most q0 */
    __syncthreads();
    const int t = q0 + (int)threadIdx.x;
    if (threadIdx.x < FL_BLK && t < T)
        atomicMin(&first, t - pos[t]);
    __syncthreads();
    return first;
}

/* The last query q >= k0 of row pos whose document starts at or before key k0 + 63 (the last that
 * may see a key of the block at k0): every thread of the CTA calls it. Any positions work; those
 * of contiguous documents make the queries that see the block one run. */
__device__ static inline int fl_doc_last_query(const int32_t *pos, int k0, int T)
{
    __shared__ int last;
    if (threadIdx.x == 0)
        last = k0; /* query k0 sees key k0 */
    __syncthreads();
    int mine = k0;
    for (int q = k0 + FL_BLK + (int)threadIdx.x; q < T; q += FL_THREADS)
        if (q - pos[q] <= k0 + FL_BLK - 1)
            mine = q;
    if (mine > k0)
        atomicMax(&last, mine);
    __syncthreads();
    return last;
}

/* The first key block a query block starting at q0 sees: the one holding key q0 - W + 1 with a
 * window, and no earlier than the one holding the earliest start of its queries' documents. */
template <int MASK>
__device__ static inline int fl_first_key_block(int q0, int W, const int32_t *pos, int T)
{
    if (!(MASK & FL_DOC)) {
        const int k = (MASK & FL_WIN) ? q0 - W + 1 : 0;
        return k > 0 ? k / FL_BLK : 0;
    }
    int k = fl_doc_first_start(pos, q0, T);
    if (MASK & FL_WIN)
        k = max(k, q0 - W + 1);
    return k / FL_BLK;
}

/* The last query block that sees a key of key block kb: the one holding query k0 + 63 + W - 1
 * with a window, and no later than the one holding the last query whose document starts within
 * the block. */
template <int MASK>
__device__ static inline int fl_last_query_block(int kb, int nblk, int W, const int32_t *pos, int T)
{
    const int k0 = kb * FL_BLK;
    int qb = nblk - 1;
    if (MASK & FL_WIN)
        qb = min(qb, (k0 + FL_BLK - 2 + W) / FL_BLK);
    if (MASK & FL_DOC)
        qb = min(qb, fl_doc_last_query(pos, k0, T) / FL_BLK);
    return qb;
}

/* The document starts of this thread's rows q0 + wr + g and + 8 (FL_DOC; 0 for rows >= T, which
 * are computed on zeros and never written). */
template <int MASK>
__device__ static inline void fl_row_starts(int (&st)[2], const int32_t *pos, int row0, int T)
{
    st[0] = st[1] = 0;
    if (MASK & FL_DOC)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int t = row0 + 8 * i;
            st[i] = t < T ? t - pos[t] : 0;
        }
}

/* ---- forward ----
 * CTA (query block nblk-1-blockIdx.x, the heaviest first; b*NH+h), 4 warps of 16 query rows.
 * Shared: Q, K[2], V[2] tiles (K, V double-buffered, loaded by cp.async one block ahead). */
template <int HP, int MASK>
__global__ void __launch_bounds__(FL_THREADS, 1)
    fl_forward_kernel(bf16 *out, float *Lse, const bf16 *qkv, int T, int NH, int NKV, int hs,
                      float scale, int W, const int32_t *pos)
{
    bf16 *Qs = (bf16 *)fl_smem_base();
    bf16 *Ks = Qs + FL_TILE(HP), *Vs = Qs + 3 * FL_TILE(HP); /* buffer u at + u * FL_TILE */
    const int nblk = (T + FL_BLK - 1) / FL_BLK, qb = nblk - 1 - (int)blockIdx.x;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = qb * FL_BLK, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3, wr = warp * 16; /* this warp's rows wr..wr+15 */
    const size_t S = fl_qkv_row(NH, NKV, hs), QC = (size_t)NH * hs;
    const bf16 *qs = fl_query(qkv, b, h, T, S, hs); /* this head's q at row 0 */
    const bf16 *ks = fl_keys(qkv, b, h / (NH / NKV), T, S, NH, hs), *vs = ks + (size_t)NKV * hs;
    const float sl2 = scale * FL_LOG2E;
    const int32_t *pb = (MASK & FL_DOC) ? pos + (size_t)b * T : pos; /* this row's positions */
    const int kb0 = fl_first_key_block<MASK>(q0, W, pb, T);          /* 0 without a mask */
    int st[2];
    fl_row_starts<MASK>(st, pb, q0 + wr + g, T);

    fl_load_tile<HP>(Qs, qs, S, q0, T, hs);
    fl_load_tile<HP>(Ks, ks, S, kb0 * FL_BLK, T, hs);
    fl_load_tile<HP>(Vs, vs, S, kb0 * FL_BLK, T, hs);
    fl_cp_commit();

    float o[HP / 8][4];
#pragma unroll
    for (int n = 0; n < HP / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            o[n][e] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* raw-score max, partial sums */
    unsigned qa[HP / 16][4]; /* this warp's Q rows as MMA A fragments, kept in registers */
    fl_cp_wait_all();
    __syncthreads();
    fl_load_afrag<HP>(qa, Qs + wr * FL_LD(HP), lane);

    for (int kb = kb0; kb <= qb; kb++) {
        fl_cp_wait_all();
        __syncthreads(); /* block kb in place for all; buffer (kb-kb0+1)&1 no longer read */
        if (kb < qb) {
            const int u = (kb - kb0 + 1) & 1;
            fl_load_tile<HP>(Ks + u * FL_TILE(HP), ks, S, (kb + 1) * FL_BLK, T, hs);
            fl_load_tile<HP>(Vs + u * FL_TILE(HP), vs, S, (kb + 1) * FL_BLK, T, hs);
            fl_cp_commit();
        }
        const int ub = (kb - kb0) & 1;
        const bf16 *Kb = Ks + ub * FL_TILE(HP), *Vb = Vs + ub * FL_TILE(HP);
        float s[8][4];
        fl_mm_nt_ra<HP, 8>(s, qa, Kb, lane);
        if (MASK) { /* what the query does not see (outside the band, another document): masked */
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (!fl_sees<MASK>(q0 + wr + g + 8 * (e >> 1),
                                       kb * FL_BLK + n * 8 + 2 * c + (e & 1), W, st[e >> 1]))
                        s[n][e] = -INFINITY;
        } else if (kb == qb) { /* the diagonal block: key k0 + col > query q0 + row is masked */
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (n * 8 + 2 * c + (e & 1) > wr + g + 8 * (e >> 1))
                        s[n][e] = -INFINITY;
        }
        /* online softmax on rows g (i = 0) and g + 8 (i = 1); the quad (4 lanes) shares a row */
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float mx = m[i];
#pragma unroll
            for (int n = 0; n < 8; n++)
                mx = fmaxf(mx, fmaxf(s[n][2 * i], s[n][2 * i + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            /* mx is finite: block 0 holds key 0, valid for every row */
            float alpha = exp2f((m[i] - mx) * sl2); /* 0 on block 0 (m = -inf) */
            float ms = mx * sl2;
            if (MASK && mx == -INFINITY) { /* no key this row sees yet: nothing to add */
                alpha = 1.0f;
                ms = 0.0f;
            }
            m[i] = mx;
            float rs = 0.0f;
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const float p = exp2f(fmaf(s[n][2 * i + j], sl2, -ms)); /* 0 where masked */
                    s[n][2 * i + j] = p;
                    rs += p;
                }
            l[i] = l[i] * alpha + rs;
#pragma unroll
            for (int n = 0; n < HP / 8; n++) {
                o[n][2 * i] *= alpha;
                o[n][2 * i + 1] *= alpha;
            }
        }
        fl_mm_pv<HP, 8>(o, s, Vb, lane);
    }
    float inv[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        inv[i] = 1.0f / l[i];
        const int t = q0 + wr + g + 8 * i;
        if (c == 0 && t < T)
            Lse[(size_t)bh * T + t] = m[i] * scale + logf(l[i]);
    }
    fl_store_acc<HP>(out + (size_t)b * T * QC + (size_t)h * hs, QC, o, inv[0], inv[1], q0 + wr,
                     T, hs, lane);
}

/* ---- backward ---- */

/* D[bh][t] = sum_d dout[b][t][h*hs + d] * out[b][t][h*hs + d]: one warp per row. */
__global__ void fl_bwd_dot(float *D, const bf16 *dout, const bf16 *out, int B, int T, int NH,
                           int hs)
{
    const size_t QC = (size_t)NH * hs;
    const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    const size_t rows = (size_t)B * NH * T;
    for (size_t row = (size_t)blockIdx.x * wpb + (threadIdx.x >> 5); row < rows;
         row += (size_t)gridDim.x * wpb) {
        const int t = (int)(row % T);
        const size_t bh = row / T;
        const int b = (int)(bh / NH), h = (int)(bh % NH);
        const size_t base = ((size_t)b * T + t) * QC + (size_t)h * hs;
        float acc = 0.0f;
        for (int d = lane; d < hs; d += 32)
            acc += __bfloat162float(dout[base + d]) * __bfloat162float(out[base + d]);
        for (int o = 16; o > 0; o >>= 1)
            acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0)
            D[row] = acc;
    }
}

/* The query side of one step of the dk dv loop, by cp.async into the buffers given: query head h's
 * q and dout tiles of rows q0..q0+63 and their L and D (and with FL_DOC their positions, pb being
 * the row's). */
template <int HP, int MASK>
__device__ static inline void
fl_load_query_side(bf16 *Qd, bf16 *dOd, float *Ld, float *Dd, int *Pd, const bf16 *qkv,
                   const bf16 *dout, const float *Lse, const float *Dg, const int32_t *pb, int b,
                   int h, int q0, int T, int NH, size_t S, int hs)
{
    const size_t bh = (size_t)b * NH + h;
    fl_load_tile<HP>(Qd, fl_query(qkv, b, h, T, S, hs), S, q0, T, hs);
    fl_load_tile<HP>(dOd, fl_query(dout, b, h, T, (size_t)NH * hs, hs), (size_t)NH * hs, q0, T,
                     hs);
    fl_load_vec(Ld, Lse + bh * T, q0, T);
    fl_load_vec(Dd, Dg + bh * T, q0, T);
    if (MASK & FL_DOC)
        fl_load_ivec(Pd, pb, q0, T);
}

/* CTA (key block blockIdx.x, b*NKV+kvh): dk, dv of keys k0..k0+63 of kv head kvh, summed over its
 * query heads h = kvh rep .. kvh rep + rep - 1 (rep = NH / NKV) in that order, each over its query
 * blocks j..nblk-1 in order: one loop of rep (nblk - j) steps, the next step's query side
 * prefetched across the change of head. Warp w owns keys k0+16w..+15 and works on transposed
 * tiles (rows = keys, columns = the 64 queries of the current block).
 * Shared: K, V, then Q[2], dO[2] tiles, then L[2], D[2] vectors of 64 floats (and with FL_DOC
 * P[2], the queries' positions, 64 ints each). */
template <int HP, int MASK>
__global__ void __launch_bounds__(FL_THREADS, 1)
    fl_bwd_dkdv(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *Lse, const float *Dg,
                int T, int NH, int NKV, int hs, float scale, int W, const int32_t *pos)
{
    bf16 *Ks = (bf16 *)fl_smem_base();
    bf16 *Vs = Ks + FL_TILE(HP), *Qs = Ks + 2 * FL_TILE(HP), *dOs = Ks + 4 * FL_TILE(HP);
    float *Lv = (float *)(Ks + 6 * FL_TILE(HP)), *Dv = Lv + 2 * FL_BLK; /* buffer u at + 64u */
    int *Pv = (int *)(Dv + 2 * FL_BLK);                                 /* FL_DOC only */
    const int kb = blockIdx.x, b = blockIdx.y / NKV, kvh = blockIdx.y % NKV, rep = NH / NKV;
    const int k0 = kb * FL_BLK, nblk = (T + FL_BLK - 1) / FL_BLK;
    const int32_t *pb = (MASK & FL_DOC) ? pos + (size_t)b * T : pos; /* this row's positions */
    /* with a mask, the last query block that sees a key of this block */
    const int nq = MASK ? fl_last_query_block<MASK>(kb, nblk, W, pb, T) - kb + 1 : nblk - kb;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3, wr = warp * 16;
    const size_t S = fl_qkv_row(NH, NKV, hs);
    const bf16 *ks = fl_keys(qkv, b, kvh, T, S, NH, hs);
    const float sl2 = scale * FL_LOG2E;

    fl_load_tile<HP>(Ks, ks, S, k0, T, hs);
    fl_load_tile<HP>(Vs, ks + (size_t)NKV * hs, S, k0, T, hs);
    fl_load_query_side<HP, MASK>(Qs, dOs, Lv, Dv, Pv, qkv, dout, Lse, Dg, pb, b, kvh * rep, k0, T,
                                 NH, S, hs);
    fl_cp_commit();

    float dk[HP / 8][4], dv[HP / 8][4];
#pragma unroll
    for (int n = 0; n < HP / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            dk[n][e] = 0.0f;
            dv[n][e] = 0.0f;
        }
    for (int it = 0; it < rep * nq; it++) {
        const int qb = kb + it % nq, q0 = qb * FL_BLK, u = it & 1;
        fl_cp_wait_all();
        __syncthreads(); /* step it in buffer u for all; buffer u^1 no longer read */
        if (it + 1 < rep * nq) {
            const int h1 = kvh * rep + (it + 1) / nq, q1 = (kb + (it + 1) % nq) * FL_BLK;
            fl_load_query_side<HP, MASK>(Qs + (u ^ 1) * FL_TILE(HP), dOs + (u ^ 1) * FL_TILE(HP),
                                         Lv + (u ^ 1) * FL_BLK, Dv + (u ^ 1) * FL_BLK,
                                         Pv + (u ^ 1) * FL_BLK, qkv, dout, Lse, Dg, pb, b, h1, q1,
                                         T, NH, S, hs);
            fl_cp_commit();
        }
        const bf16 *Qb = Qs + u * FL_TILE(HP), *dOb = dOs + u * FL_TILE(HP);
        const float *Lb = Lv + u * FL_BLK, *Db = Dv + u * FL_BLK;
        const int *Pb = Pv + u * FL_BLK;
        const bool edge = MASK || qb == kb || q0 + FL_BLK > T;
        /* two halves of 32 queries each (fewer live registers): for queries q0 + 32hq .. + 31 */
#pragma unroll 1
        for (int hq = 0; hq < 2; hq++) {
            const int qo = hq * 32;
            /* P^T = exp(K Q^T * scale - L[query]), 0 where masked (query >= T, key > query, or
             * what the mask hides) */
            float p[4][4];
            fl_mm_nt<HP, 4>(p, Ks + wr * FL_LD(HP), Qb + qo * FL_LD(HP), lane);
#pragma unroll
            for (int n = 0; n < 4; n++) {
                const float2 lq = *(const float2 *)(Lb + qo + n * 8 + 2 * c);
                int2 pq = make_int2(0, 0); /* the two queries' positions (FL_DOC) */
                if (MASK & FL_DOC)
                    pq = *(const int2 *)(Pb + qo + n * 8 + 2 * c);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int tq = q0 + qo + n * 8 + 2 * c + (e & 1),
                              tk = k0 + wr + g + 8 * (e >> 1);
                    float v = exp2f(fmaf(p[n][e], sl2, -((e & 1) ? lq.y : lq.x) * FL_LOG2E));
                    if (edge &&
                        (tq >= T || (MASK ? !fl_sees<MASK>(tq, tk, W, tq - ((e & 1) ? pq.y : pq.x))
                                          : tk > tq)))
                        v = 0.0f;
                    p[n][e] = v;
                }
            }
            /* dV += P^T dO */
            fl_mm_pv<HP, 4>(dv, p, dOb + qo * FL_LD(HP), lane);
            /* dS^T = P^T (V dO^T - D[query]) */
            float ds[4][4];
            fl_mm_nt<HP, 4>(ds, Vs + wr * FL_LD(HP), dOb + qo * FL_LD(HP), lane);
#pragma unroll
            for (int n = 0; n < 4; n++) {
                const float2 dd = *(const float2 *)(Db + qo + n * 8 + 2 * c);
#pragma unroll
                for (int e = 0; e < 4; e++)
                    ds[n][e] = p[n][e] * (ds[n][e] - ((e & 1) ? dd.y : dd.x));
            }
            /* dK += dS^T Q */
            fl_mm_pv<HP, 4>(dk, ds, Qb + qo * FL_LD(HP), lane);
        }
    }
    bf16 *dks = dqkv + (ks - qkv); /* kv head kvh's keys in dqkv, its values NKV hs further */
    fl_store_acc<HP>(dks, S, dk, scale, scale, k0 + wr, T, hs, lane);
    fl_store_acc<HP>(dks + (size_t)NKV * hs, S, dv, 1.0f, 1.0f, k0 + wr, T, hs, lane);
}

/* CTA (query block nblk-1-blockIdx.x, b*NH+h): dq of rows q0..q0+63, from the keys and values of
 * kv head h / (NH / NKV); warp w owns rows q0+16w..+15. Shared: Q, dO, then K[2], V[2] tiles. */
template <int HP, int MASK>
__global__ void __launch_bounds__(FL_THREADS, 1)
    fl_bwd_dq(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *Lse, const float *Dg,
              int T, int NH, int NKV, int hs, float scale, int W, const int32_t *pos)
{
    bf16 *Qs = (bf16 *)fl_smem_base();
    bf16 *dOs = Qs + FL_TILE(HP), *Ks = Qs + 2 * FL_TILE(HP), *Vs = Qs + 4 * FL_TILE(HP);
    const int nblk = (T + FL_BLK - 1) / FL_BLK, qb = nblk - 1 - (int)blockIdx.x;
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH, q0 = qb * FL_BLK;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3, wr = warp * 16;
    const size_t S = fl_qkv_row(NH, NKV, hs), QC = (size_t)NH * hs;
    const bf16 *qs = fl_query(qkv, b, h, T, S, hs);
    const bf16 *ks = fl_keys(qkv, b, h / (NH / NKV), T, S, NH, hs), *vs = ks + (size_t)NKV * hs;
    const float sl2 = scale * FL_LOG2E;
    const int32_t *pb = (MASK & FL_DOC) ? pos + (size_t)b * T : pos; /* this row's positions */
    const int kb0 = fl_first_key_block<MASK>(q0, W, pb, T);          /* 0 without a mask */
    int st[2];
    fl_row_starts<MASK>(st, pb, q0 + wr + g, T);

    fl_load_tile<HP>(Qs, qs, S, q0, T, hs);
    fl_load_tile<HP>(dOs, fl_query(dout, b, h, T, QC, hs), QC, q0, T, hs);
    fl_load_tile<HP>(Ks, ks, S, kb0 * FL_BLK, T, hs);
    fl_load_tile<HP>(Vs, vs, S, kb0 * FL_BLK, T, hs);
    fl_cp_commit();
    float lr[2], dr[2]; /* L * log2(e) and D of rows g, g + 8 (0 for rows >= T) */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int t = q0 + wr + g + 8 * i;
        lr[i] = t < T ? Lse[(size_t)bh * T + t] * FL_LOG2E : 0.0f;
        dr[i] = t < T ? Dg[(size_t)bh * T + t] : 0.0f;
    }

    float dq[HP / 8][4];
#pragma unroll
    for (int n = 0; n < HP / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dq[n][e] = 0.0f;
    for (int kb = kb0; kb <= qb; kb++) {
        fl_cp_wait_all();
        __syncthreads();
        if (kb < qb) {
            const int u = (kb - kb0 + 1) & 1;
            fl_load_tile<HP>(Ks + u * FL_TILE(HP), ks, S, (kb + 1) * FL_BLK, T, hs);
            fl_load_tile<HP>(Vs + u * FL_TILE(HP), vs, S, (kb + 1) * FL_BLK, T, hs);
            fl_cp_commit();
        }
        const int ub = (kb - kb0) & 1;
        const bf16 *Kb = Ks + ub * FL_TILE(HP), *Vb = Vs + ub * FL_TILE(HP);
        float p[8][4], ds[8][4];
        fl_mm_nt<HP, 8>(p, Qs + wr * FL_LD(HP), Kb, lane);
        fl_mm_nt<HP, 8>(ds, dOs + wr * FL_LD(HP), Vb, lane);
        const bool diag = kb == qb;
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = e >> 1;
                float v = exp2f(fmaf(p[n][e], sl2, -lr[i]));
                if (MASK ? !fl_sees<MASK>(q0 + wr + g + 8 * i,
                                          kb * FL_BLK + n * 8 + 2 * c + (e & 1), W, st[i])
                         : diag && n * 8 + 2 * c + (e & 1) > wr + g + 8 * i)
                    v = 0.0f;
                ds[n][e] = v * (ds[n][e] - dr[i]);
            }
        /* dQ += dS K */
        fl_mm_pv<HP, 8>(dq, ds, Kb, lane);
    }
    fl_store_acc<HP>(dqkv + (qs - qkv), S, dq, scale, scale, q0 + wr, T, hs, lane);
}

/* ---- host ---- */

int fy_cu_flash_supported(int C, int NH)
{
    if (C <= 0 || NH <= 0 || C % NH != 0)
        return 0;
    return fy_cu_flash_gqa_supported(NH, NH, C / NH);
}

int fy_cu_flash_gqa_supported(int NH, int NKV, int hs)
{
    return NH > 0 && NKV > 0 && NH % NKV == 0 && hs > 0 && hs % 8 == 0 && hs <= FL_HS_MAX;
}

static size_t fl_align256(size_t n) { return (n + 255) & ~(size_t)255; }

static int fl_shape_ok(int B, int T, int NH, int NKV, int hs)
{
    return B > 0 && T > 0 && fy_cu_flash_gqa_supported(NH, NKV, hs) && (long long)B * NH <= 65535;
}

size_t fy_cu_flash_scratch_bytes(int B, int T, int C, int NH)
{
    if (!fy_cu_flash_supported(C, NH) || !fl_shape_ok(B, T, NH, NH, C / NH))
        return 0;
    return 2 * fl_align256((size_t)B * NH * T * sizeof(float));
}

static int fl_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Dynamic shared memory (bytes, incl. 128 for aligning the base): forward Q, K[2], V[2] tiles;
 * dk dv K, V, Q[2], dO[2] tiles and L[2], D[2] vectors; dq Q, dO, K[2], V[2] tiles. */
static unsigned fl_tile_bytes(int hp) { return (unsigned)(FL_BLK * (hp + 8) * 2); }
static unsigned fl_smem_fwd(int hp) { return 5 * fl_tile_bytes(hp) + 128u; }
static unsigned fl_smem_dkdv(int hp, int mask)
{
    return 6 * fl_tile_bytes(hp) + ((mask & FL_DOC) ? 6 : 4) * FL_BLK * 4 + 128u;
}
static unsigned fl_smem_dq(int hp) { return 6 * fl_tile_bytes(hp) + 128u; }

/* Allows `kernel` `need` bytes of dynamic shared memory (a fixed value per kernel instantiation, so
 * concurrent callers agree) after checking the device's opt-in limit. */
static int fl_prepare(const void *kernel, unsigned need, const char *what)
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
    FY_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)need),
            "%s: setting max dynamic shared memory to %u", what, need);
    return 0;
}

/* One call's shape and operands, for the kernels of one padded head size. */
struct fl_call {
    bf16 *out;           /* forward: out; backward: dqkv */
    const bf16 *dout;    /* backward */
    const bf16 *qkv;
    float *Lse, *D;
    int B, T, NH, NKV, hs;
    float scale;
    cudaStream_t stream;
    int window; /* W > 0 and W < T: a banded causal mask; 0: plain causal */
    const int32_t *pos; /* [B][T] on the device: documents (FL_DOC); NULL: none */
};

template <int HP, int MASK> static int fl_forward_hp(const struct fl_call *a)
{
    const unsigned smem = fl_smem_fwd(HP);
    int rc = fl_prepare((const void *)fl_forward_kernel<HP, MASK>, smem, "fy_cu_flash_forward");
    if (rc)
        return rc;
    const int nblk = (a->T + FL_BLK - 1) / FL_BLK;
    fl_forward_kernel<HP, MASK>
        <<<dim3((unsigned)nblk, (unsigned)(a->B * a->NH)), FL_THREADS, smem, a->stream>>>(
            a->out, a->Lse, a->qkv, a->T, a->NH, a->NKV, a->hs, a->scale, a->window, a->pos);
    FY_CUDA_LAUNCHED("fl_forward_kernel");
    return 0;
}

/* dk dv: one CTA per key block and kv head (each sums its query heads); dq: one per query block
 * and query head. */
template <int HP, int MASK> static int fl_backward_hp(const struct fl_call *a)
{
    const unsigned smem_kv = fl_smem_dkdv(HP, MASK), smem_q = fl_smem_dq(HP);
    int rc = fl_prepare((const void *)fl_bwd_dkdv<HP, MASK>, smem_kv, "fy_cu_flash_backward dk dv");
    if (rc)
        return rc;
    rc = fl_prepare((const void *)fl_bwd_dq<HP, MASK>, smem_q, "fy_cu_flash_backward dq");
    if (rc)
        return rc;
    const unsigned nblk = (unsigned)((a->T + FL_BLK - 1) / FL_BLK);
    fl_bwd_dkdv<HP, MASK>
        <<<dim3(nblk, (unsigned)(a->B * a->NKV)), FL_THREADS, smem_kv, a->stream>>>(
            a->out, a->dout, a->qkv, a->Lse, a->D, a->T, a->NH, a->NKV, a->hs, a->scale, a->window,
            a->pos);
    FY_CUDA_LAUNCHED("fl_bwd_dkdv");
    fl_bwd_dq<HP, MASK><<<dim3(nblk, (unsigned)(a->B * a->NH)), FL_THREADS, smem_q, a->stream>>>(
        a->out, a->dout, a->qkv, a->Lse, a->D, a->T, a->NH, a->NKV, a->hs, a->scale, a->window,
        a->pos);
    FY_CUDA_LAUNCHED("fl_bwd_dq");
    return 0;
}

/* The kernels of each padded head size hp = 16, 32, .., 128 (hs rounded up to 16), at index
 * hp / 16 - 1, for each mask: [0] plain causal, [FL_WIN] a sliding window, [FL_DOC] documents,
 * [FL_WIN | FL_DOC] both. */
typedef int (*fl_run)(const struct fl_call *);
#define FL_BY_HP(run, MASK)                                                                        \
    {                                                                                              \
        run<16, MASK>, run<32, MASK>, run<48, MASK>, run<64, MASK>, run<80, MASK>, run<96, MASK>,  \
            run<112, MASK>, run<128, MASK>                                                         \
    }
static const fl_run fl_forward_by_hp[4][FL_HS_MAX / 16] = {
    FL_BY_HP(fl_forward_hp, 0), FL_BY_HP(fl_forward_hp, FL_WIN), FL_BY_HP(fl_forward_hp, FL_DOC),
    FL_BY_HP(fl_forward_hp, FL_WIN | FL_DOC)};
static const fl_run fl_backward_by_hp[4][FL_HS_MAX / 16] = {
    FL_BY_HP(fl_backward_hp, 0), FL_BY_HP(fl_backward_hp, FL_WIN), FL_BY_HP(fl_backward_hp, FL_DOC),
    FL_BY_HP(fl_backward_hp, FL_WIN | FL_DOC)};
#undef FL_BY_HP

/* The window the kernels take: 0 (plain causal) for none (W <= 0) and for W >= T, where the band is the
 * whole causal triangle. */
static int fl_window(int window, int T) { return window > 0 && window < T ? window : 0; }

static int fl_hp_index(int hs) { return ((hs + 15) & ~15) / 16 - 1; }

/* The kernels' mask: a window W (fl_window's) and documents where positions are given. */
static int fl_mask(int W, const int32_t *positions)
{
    return (W > 0 ? FL_WIN : 0) | (positions != NULL ? FL_DOC : 0);
}

/* The shape and the operands' alignment, said with `what` when wrong. */
static int fl_check(const char *what, int B, int T, int NH, int NKV, int hs, const void *const *p,
                    int n)
{
    if (!fl_shape_ok(B, T, NH, NKV, hs)) {
        fy_error("%s: unsupported shape B=%d T=%d NH=%d NKV=%d hs=%d (hs must be a multiple of 8, "
                 "at most %d; NKV must divide NH; B*NH at most 65535)",
                 what, B, T, NH, NKV, hs, FL_HS_MAX);
        return -EINVAL;
    }
    for (int i = 0; i < n; i++)
        if (!fl_aligned16(p[i])) {
            fy_error("%s: every operand and the scratch must be 16-byte aligned", what);
            return -EINVAL;
        }
    return 0;
}

int fy_cu_flash_gqa_forward(bf16 *out, const bf16 *qkv, void *scratch, int B, int T, int NH,
                            int NKV, int hs, cudaStream_t stream)
{
    return fy_cu_flash_window_forward(out, qkv, scratch, B, T, NH, NKV, hs, 0, NULL, stream);
}

int fy_cu_flash_window_forward(bf16 *out, const bf16 *qkv, void *scratch, int B, int T, int NH,
                               int NKV, int hs, int window, const int32_t *positions,
                               cudaStream_t stream)
{
    const void *p[] = {out, qkv, scratch};
    int rc = fl_check("fy_cu_flash_forward", B, T, NH, NKV, hs, p, 3);
    if (rc)
        return rc;
    FY_REQUIRE(((uintptr_t)positions & 3u) == 0, -EINVAL,
               "fy_cu_flash_forward: positions must be 4-byte aligned");
    const int W = fl_window(window, T);
    struct fl_call a = {out, NULL, qkv, (float *)scratch,        NULL,   B, T,
                        NH,  NKV,  hs,  1.0f / sqrtf((float)hs), stream, W, positions};
    return fl_forward_by_hp[fl_mask(W, positions)][fl_hp_index(hs)](&a);
}

int fy_cu_flash_gqa_backward(bf16 *dqkv, const bf16 *dout, const bf16 *out, const bf16 *qkv,
                             void *scratch, int B, int T, int NH, int NKV, int hs,
                             cudaStream_t stream)
{
    return fy_cu_flash_window_backward(dqkv, dout, out, qkv, scratch, B, T, NH, NKV, hs, 0, NULL,
                                       stream);
}

int fy_cu_flash_window_backward(bf16 *dqkv, const bf16 *dout, const bf16 *out, const bf16 *qkv,
                                void *scratch, int B, int T, int NH, int NKV, int hs, int window,
                                const int32_t *positions, cudaStream_t stream)
{
    const void *p[] = {dqkv, dout, out, qkv, scratch};
    int rc = fl_check("fy_cu_flash_backward", B, T, NH, NKV, hs, p, 5);
    if (rc)
        return rc;
    FY_REQUIRE(((uintptr_t)positions & 3u) == 0, -EINVAL,
               "fy_cu_flash_backward: positions must be 4-byte aligned");
    const int W = fl_window(window, T);
    float *D = (float *)((char *)scratch + fl_align256((size_t)B * NH * T * sizeof(float)));
    size_t rows = (size_t)B * NH * T;
    fl_bwd_dot<<<fy_cu_blocks(rows, 8), 256, 0, stream>>>(D, dout, out, B, T, NH, hs);
    FY_CUDA_LAUNCHED("fl_bwd_dot");
    struct fl_call a = {dqkv, dout, qkv, (float *)scratch,        D,      B, T,
                        NH,   NKV,  hs,  1.0f / sqrtf((float)hs), stream, W, positions};
    return fl_backward_by_hp[fl_mask(W, positions)][fl_hp_index(hs)](&a);
}

/* Multi-head attention: the grouped-query kernels with one kv head per query head. */
static int fl_heads_of(const char *what, int C, int NH)
{
    if (C > 0 && NH > 0 && C % NH == 0)
        return 0;
    fy_error("%s: unsupported shape C=%d NH=%d (NH must divide C)", what, C, NH);
    return -EINVAL;
}

int fy_cu_flash_forward(bf16 *out, const bf16 *qkv, void *scratch, int B, int T, int C, int NH,
                        cudaStream_t stream)
{
    int rc = fl_heads_of("fy_cu_flash_forward", C, NH);
    return rc ? rc : fy_cu_flash_gqa_forward(out, qkv, scratch, B, T, NH, NH, C / NH, stream);
}

int fy_cu_flash_backward(bf16 *dqkv, const bf16 *dout, const bf16 *out, const bf16 *qkv,
                         void *scratch, int B, int T, int C, int NH, cudaStream_t stream)
{
    int rc = fl_heads_of("fy_cu_flash_backward", C, NH);
    return rc ? rc
              : fy_cu_flash_gqa_backward(dqkv, dout, out, qkv, scratch, B, T, NH, NH, C / NH,
                                         stream);
}
