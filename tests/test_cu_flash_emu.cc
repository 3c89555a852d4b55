/* cu_flash.cu's attention kernels run on the CPU (no GPU needed): the kernels themselves, the part
 * of cu_flash.cu between "EMU BEGIN" and "---- host ----" (the Makefile extracts it into
 * cu_flash_kernels.inc), compiled with g++ against an emulation of what they use: each CTA's 128
 * threads are fibers (ucontext) run round robin in one OS thread, switching only at the kernels'
 * synchronisation points (__syncthreads, and the warp primitives: ldmatrix, mma.sync m16n8k16
 * bf16 -> f32, shfl.xor, each done as a collective of the warp's 32 lanes from the fragment
 * layouts of the PTX ISA); cp.async copies at once (the kernels wait before reading anyway);
 * shared memory is a buffer per CTA, CTAs run one after another. Every thread of a CTA must reach
 * the same sequence of synchronisation points, which holds for the attention kernels (fl_bwd_dot,
 * whose warps loop unevenly, is not run: D is computed here).
 *
 * Checked against a double-precision reference of masked attention on the same bf16 inputs
 * (forward out, backward dq, dk, dv; per element |emu - ref| <= 2e-2 |ref| + 1e-2 max|ref|, the
 * bf16 roundings of P, dS and the outputs as on the GPU):
 *   - the plain causal and sliding-window kernels (known good on the GPU: tests/gpu/test_cu_flash,
 *     test_cu_families), which also checks the emulation;
 *   - the documents' kernels (FL_DOC, alone and with a window; gpu_worker/backend_ops.h's positions):
 *     documents starting mid-tile, single-token ones, one across several tiles, ones on tile
 *     boundaries, GQA 2:1, head size 24 (padded to 32);
 *   - the tiles computed: counted from the MMAs issued, every kernel computes exactly the (query
 *     tile, key tile) pairs in which some query sees some key (blocks the mask empties skipped,
 *     none that it does not empty skipped);
 *   - the checker can fail: the causal kernels given a batch of documents are rejected.
 * The numbers (bf16, another order of the MMAs' sums) are not the GPU's bits; the GPU tests hold
 * those. */
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ucontext.h>
#include <vector>

extern "C" { /* this cmocka.h has no C++ guards of its own */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
}

using std::max;
using std::min;

struct bf16 {
    uint16_t x;
};
static inline float __bfloat162float(bf16 v)
{
    uint32_t u = (uint32_t)v.x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline bf16 __float2bfloat16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    bf16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.x = (uint16_t)((u >> 16) | 0x40);
        return r;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    r.x = (uint16_t)(u >> 16);
    return r;
}
static inline unsigned short __bfloat16_as_ushort(bf16 v) { return v.x; }
struct float2 {
    float x, y;
};
struct int2 {
    int x, y;
};
static inline int2 make_int2(int x, int y)
{
    int2 r = {x, y};
    return r;
}
struct dim3e {
    unsigned x, y, z;
};
static dim3e threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __shared__ static
#define __launch_bounds__(a, b)
#define __forceinline__ inline
#define __restrict__ __restrict
static inline size_t __cvta_generic_to_shared(const void *p) { return (size_t)p; }
static inline int atomicMin(int *p, int v)
{
    int o = *p;
    if (v < o)
        *p = v;
    return o;
}
static inline int atomicMax(int *p, int v)
{
    int o = *p;
    if (v > o)
        *p = v;
    return o;
}
static unsigned char *fl_smem_raw;

/* ---- fibers ---- */
#define EMU_MAX_THREADS 256
static ucontext_t emu_sched, emu_fib[EMU_MAX_THREADS];
static int emu_cur, emu_done[EMU_MAX_THREADS];
static void emu_sync(void) { swapcontext(&emu_fib[emu_cur], &emu_sched); }
static void __syncthreads(void) { emu_sync(); }

static uintptr_t emu_addr[EMU_MAX_THREADS];
static unsigned emu_u[EMU_MAX_THREADS][6];
static float emu_f[EMU_MAX_THREADS][4];

static float __shfl_xor_sync(unsigned, float v, int o)
{
    int me = emu_cur;
    emu_f[me][0] = v;
    emu_sync();
    float r = emu_f[(me & ~31) | ((me & 31) ^ o)][0];
    emu_sync();
    return r;
}

static inline float bf_lo(unsigned u)
{
    bf16 b;
    b.x = (uint16_t)(u & 0xffff);
    return __bfloat162float(b);
}
static inline float bf_hi(unsigned u)
{
    bf16 b;
    b.x = (uint16_t)(u >> 16);
    return __bfloat162float(b);
}
static inline unsigned pk(uint16_t a, uint16_t b) { return (unsigned)a | ((unsigned)b << 16); }

static void fl_cp16(void *dst, const void *src, int bytes)
{
    if (bytes)
        memcpy(dst, src, 16);
    else
        memset(dst, 0, 16);
}
static void fl_cp4(void *dst, const void *src, int bytes)
{
    if (bytes)
        memcpy(dst, src, 4);
    else
        memset(dst, 0, 4);
}
static void fl_cp_commit(void) {}
static void fl_cp_wait_all(void) {}

static void fl_ldsm4(unsigned (&r)[4], const bf16 *p)
{
    int me = emu_cur, base = me & ~31, l = me & 31;
    emu_addr[me] = (uintptr_t)p;
    emu_sync();
    for (int i = 0; i < 4; i++) {
        const uint16_t *row = (const uint16_t *)emu_addr[base + i * 8 + l / 4];
        r[i] = pk(row[2 * (l % 4)], row[2 * (l % 4) + 1]);
    }
    emu_sync();
}

static void fl_ldsm4t(unsigned (&r)[4], const bf16 *p)
{
    int me = emu_cur, base = me & ~31, l = me & 31;
    emu_addr[me] = (uintptr_t)p;
    emu_sync();
    for (int i = 0; i < 4; i++) {
        const uint16_t *r0 = (const uint16_t *)emu_addr[base + i * 8 + 2 * (l % 4)];
        const uint16_t *r1 = (const uint16_t *)emu_addr[base + i * 8 + 2 * (l % 4) + 1];
        r[i] = pk(r0[l / 4], r1[l / 4]);
    }
    emu_sync();
}

static long emu_mmas;
static void fl_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1)
{
    emu_mmas++;
    int me = emu_cur, base = me & ~31, l = me & 31;
    for (int i = 0; i < 4; i++)
        emu_u[me][i] = a[i];
    emu_u[me][4] = b0;
    emu_u[me][5] = b1;
    emu_sync();
    int g = l / 4, c = l % 4;
    for (int e = 0; e < 4; e++) {
        int row = g + 8 * (e >> 1), col = 2 * c + (e & 1);
        float acc = 0.0f;
        for (int k = 0; k < 16; k++) {
            int al = base + (row % 8) * 4 + (k % 8) / 2, areg = (row / 8) + 2 * (k / 8);
            unsigned au = emu_u[al][areg];
            float av = (k & 1) ? bf_hi(au) : bf_lo(au);
            int bl = base + col * 4 + (k % 8) / 2, breg = 4 + k / 8;
            unsigned bu = emu_u[bl][breg];
            float bv = (k & 1) ? bf_hi(bu) : bf_lo(bu);
            acc += av * bv;
        }
        d[e] += acc;
    }
    emu_sync();
}

/* ---- the kernels, as cu_flash.cu has them ---- */
#include "cu_flash_kernels.inc"

/* ---- launching ---- */
static void (*emu_body)(void);
static void emu_trampoline(void)
{
    emu_body();
    emu_done[emu_cur] = 1;
}

static void emu_cta(unsigned threads, size_t smem)
{
    static std::vector<char> stacks;
    const size_t stack = 256 << 10;
    stacks.resize(threads * stack);
    std::vector<unsigned char> sm(smem + 256);
    fl_smem_raw = (unsigned char *)(((uintptr_t)sm.data() + 127) & ~(uintptr_t)127);
    memset(sm.data(), 0xff, sm.size()); /* stale shared memory: NaN-ish bf16 */
    for (unsigned k = 0; k < threads; k++) {
        getcontext(&emu_fib[k]);
        emu_fib[k].uc_stack.ss_sp = &stacks[k * stack];
        emu_fib[k].uc_stack.ss_size = stack;
        emu_fib[k].uc_link = &emu_sched;
        makecontext(&emu_fib[k], emu_trampoline, 0);
        emu_done[k] = 0;
    }
    for (;;) {
        int alive = 0, done_now = 0;
        for (unsigned k = 0; k < threads; k++) {
            if (emu_done[k])
                continue;
            alive++;
            emu_cur = (int)k;
            threadIdx.x = k;
            threadIdx.y = threadIdx.z = 0;
            swapcontext(&emu_sched, &emu_fib[k]);
            done_now += emu_done[k];
        }
        if (!alive)
            break;
        if (done_now && done_now != alive) {
            fprintf(stderr, "emu: threads of a CTA ended at different synchronisation points\n");
            exit(1);
        }
    }
}

static void emu_launch(unsigned gx, unsigned gy, unsigned threads, size_t smem, void (*body)(void))
{
    emu_body = body;
    gridDim = {gx, gy, 1};
    blockDim = {threads, 1, 1};
    for (unsigned y = 0; y < gy; y++)
        for (unsigned x = 0; x < gx; x++) {
            blockIdx = {x, y, 0};
            emu_cta(threads, smem);
        }
}

/* ---- one case ---- */
struct args {
    bf16 *out, *dout, *qkv, *dqkv;
    float *L, *D;
    int T, NH, NKV, hs, W;
    float scale;
    const int32_t *pos;
} A;

template <int HP, int MASK> static void run_fwd(void)
{
    fl_forward_kernel<HP, MASK>(A.out, A.L, A.qkv, A.T, A.NH, A.NKV, A.hs, A.scale, A.W, A.pos);
}
template <int HP, int MASK> static void run_dkdv(void)
{
    fl_bwd_dkdv<HP, MASK>(A.dqkv, A.dout, A.qkv, A.L, A.D, A.T, A.NH, A.NKV, A.hs, A.scale, A.W,
                          A.pos);
}
template <int HP, int MASK> static void run_dq(void)
{
    fl_bwd_dq<HP, MASK>(A.dqkv, A.dout, A.qkv, A.L, A.D, A.T, A.NH, A.NKV, A.hs, A.scale, A.W,
                        A.pos);
}

static uint64_t rng = 88172645463325252ull;
static float urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* Does query t of row b see key k? (the reference's mask) */
static bool sees(const int32_t *pos, int b, int T, int t, int k, int W)
{
    int lo = pos ? t - pos[b * T + t] : 0;
    if (W > 0 && t - W + 1 > lo)
        lo = t - W + 1;
    return k >= lo && k <= t;
}

template <int HP, int MASK>
static int one_case(const char *name, int B, int T, int NH, int NKV, int hs, int W,
                    const std::vector<int32_t> &positions)
{
    const int32_t *pos = positions.empty() ? nullptr : positions.data();
    size_t S = (size_t)(NH + 2 * NKV) * hs, QC = (size_t)NH * hs;
    std::vector<bf16> qkv(B * T * S), dout(B * T * QC), out(B * T * QC), dqkv(B * T * S);
    for (auto &v : qkv)
        v = __float2bfloat16(2.0f * urand());
    for (auto &v : dout)
        v = __float2bfloat16(urand());
    for (auto &v : out)
        v.x = 0x7fc0; /* NaN: unwritten shows */
    for (auto &v : dqkv)
        v.x = 0x7fc0;
    std::vector<float> L(B * NH * T, NAN), D(B * NH * T);
    A = {out.data(), dout.data(), qkv.data(), dqkv.data(), L.data(), D.data(),
         T,          NH,          NKV,        hs,          W,        1.0f / sqrtf((float)hs),
         pos};
    int nblk = (T + 63) / 64;
    unsigned tile = 64 * (HP + 8) * 2;
    /* tile pairs (query block, key block) with a visible pair: what the kernels must compute */
    long pairs = 0;
    for (int b = 0; b < B; b++)
        for (int qb = 0; qb < nblk; qb++)
            for (int kb = 0; kb <= qb; kb++) {
                bool any = false;
                for (int t = qb * 64; t < std::min(T, qb * 64 + 64) && !any; t++)
                    for (int k = kb * 64; k < kb * 64 + 64 && !any; k++)
                        any = sees(pos, b, T, t, k, W);
                pairs += any;
            }
    emu_mmas = 0;
    emu_launch(nblk, B * NH, 128, 5 * tile + 128, run_fwd<HP, MASK>);
    long fwd_blocks = emu_mmas / (128L * HP);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                float acc = 0;
                for (int d = 0; d < hs; d++)
                    acc += __bfloat162float(dout[(b * T + t) * QC + h * hs + d]) *
                           __bfloat162float(out[(b * T + t) * QC + h * hs + d]);
                D[(b * NH + h) * T + t] = acc;
            }
    emu_mmas = 0;
    emu_launch(nblk, B * NKV, 128, 6 * tile + 6 * 64 * 4 + 128, run_dkdv<HP, MASK>);
    long kv_blocks = emu_mmas / (128L * 2 * HP);
    emu_mmas = 0;
    emu_launch(nblk, B * NH, 128, 6 * tile + 128, run_dq<HP, MASK>);
    long dq_blocks = emu_mmas * 2 / (128L * 3 * HP);

    /* reference in double on the bf16 inputs */
    std::vector<double> ro(B * T * QC, 0), rd(B * T * S, 0);
    int rep = NH / NKV;
    double scale = 1.0 / sqrt((double)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            int kv = h / rep;
            auto q = [&](int t, int d) {
                return (double)__bfloat162float(qkv[(b * T + t) * S + h * hs + d]);
            };
            auto k = [&](int t, int d) {
                return (double)__bfloat162float(qkv[(b * T + t) * S + (NH + kv) * hs + d]);
            };
            auto v = [&](int t, int d) {
                return (double)__bfloat162float(qkv[(b * T + t) * S + (NH + NKV + kv) * hs + d]);
            };
            auto g = [&](int t, int d) {
                return (double)__bfloat162float(dout[(b * T + t) * QC + h * hs + d]);
            };
            for (int t = 0; t < T; t++) {
                std::vector<double> p(T, 0.0);
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < T; j++)
                    if (sees(pos, b, T, t, j, W)) {
                        double s = 0;
                        for (int d = 0; d < hs; d++)
                            s += q(t, d) * k(j, d);
                        p[j] = s * scale;
                        mx = std::max(mx, p[j]);
                    }
                for (int j = 0; j < T; j++)
                    if (sees(pos, b, T, t, j, W))
                        sum += (p[j] = exp(p[j] - mx));
                    else
                        p[j] = 0;
                for (int j = 0; j < T; j++)
                    p[j] /= sum;
                for (int d = 0; d < hs; d++) {
                    double a = 0;
                    for (int j = 0; j < T; j++)
                        a += p[j] * v(j, d);
                    ro[(b * T + t) * QC + h * hs + d] = a;
                }
                /* backward */
                std::vector<double> dp(T, 0.0);
                double dot = 0;
                for (int j = 0; j < T; j++) {
                    if (p[j] == 0)
                        continue;
                    double s = 0;
                    for (int d = 0; d < hs; d++)
                        s += g(t, d) * v(j, d);
                    dp[j] = s;
                    dot += p[j] * s;
                }
                for (int j = 0; j < T; j++) {
                    if (p[j] == 0)
                        continue;
                    double ds = p[j] * (dp[j] - dot) * scale;
                    for (int d = 0; d < hs; d++) {
                        rd[(b * T + t) * S + h * hs + d] += ds * k(j, d);
                        rd[(b * T + j) * S + (NH + kv) * hs + d] += ds * q(t, d);
                        rd[(b * T + j) * S + (NH + NKV + kv) * hs + d] += p[j] * g(t, d);
                    }
                }
            }
        }
    auto cmp = [&](const char *what, const bf16 *ours, const double *ref, size_t n, size_t stride,
                   size_t off, size_t width) {
        double scale_ = 0, worst = 0;
        int bad = 0;
        for (size_t r = 0; r < n; r++)
            for (size_t c = 0; c < width; c++)
                scale_ = std::max(scale_, fabs(ref[r * stride + off + c]));
        for (size_t r = 0; r < n; r++)
            for (size_t c = 0; c < width; c++) {
                double o = __bfloat162float(ours[r * stride + off + c]),
                       e = ref[r * stride + off + c];
                double err = fabs(o - e);
                if (!(err <= 2e-2 * fabs(e) + 1e-2 * scale_))
                    bad++;
                if (!(err <= worst))
                    worst = err;
            }
        printf("  %-4s worst |d| %.2e of max %.2e%s\n", what, worst, scale_, bad ? "  FAIL" : "");
        return bad;
    };
    printf("%s (B %d T %d NH %d NKV %d hs %d W %d, mask %d)\n", name, B, T, NH, NKV, hs, W, MASK);
    printf("  tiles computed: forward %ld, dk dv %ld, dq %ld; with a visible pair %ld of %d%s\n",
           fwd_blocks, kv_blocks, dq_blocks, pairs * NH, B * NH * nblk * (nblk + 1) / 2,
           fwd_blocks == pairs * NH && kv_blocks == pairs * NH && dq_blocks == pairs * NH
               ? ""
               : "  (not exact)");
    int bad = cmp("out", out.data(), ro.data(), (size_t)B * T, QC, 0, QC);
    bad += MASK && (fwd_blocks != pairs * NH || kv_blocks != pairs * NH || dq_blocks != pairs * NH);
    bad += cmp("dq", dqkv.data(), rd.data(), (size_t)B * T, S, 0, QC);
    bad += cmp("dk", dqkv.data(), rd.data(), (size_t)B * T, S, QC, (size_t)NKV * hs);
    bad += cmp("dv", dqkv.data(), rd.data(), (size_t)B * T, S, QC + (size_t)NKV * hs,
               (size_t)NKV * hs);
    return bad;
}

/* positions of documents of the given lengths, row after row (each row's lengths sum to T) */
static std::vector<int32_t> docs(int T, std::vector<std::vector<int>> rows)
{
    std::vector<int32_t> p;
    for (auto &r : rows) {
        int n = 0;
        for (int len : r)
            for (int i = 0; i < len; i++, n++)
                p.push_back(i);
        if (n != T) {
            fprintf(stderr, "bad docs\n");
            exit(2);
        }
    }
    return p;
}

static const std::vector<int32_t> no_documents;

/* The emulation, on the kernels the GPU tests hold: plain causal, and a sliding window. */
static void test_plain_and_window_kernels(void **state)
{
    (void)state;
    assert_int_equal((one_case<16, 0>("causal", 1, 150, 2, 1, 16, 0, no_documents)), 0);
    assert_int_equal((one_case<32, FL_WIN>("window 70", 1, 200, 2, 2, 24, 70, no_documents)), 0);
}

/* documents starting mid-tile, single-token ones, a long one across tiles, and padding */
static std::vector<int32_t> mixed(void)
{
    return docs(200, {{1, 5, 60, 1, 90, 40, 1, 1, 1}, {200}});
}

static void test_documents(void **state)
{
    (void)state;
    std::vector<int32_t> p1 = mixed();
    assert_int_equal((one_case<16, FL_DOC>("documents", 2, 200, 2, 1, 16, 0, p1)), 0);
    assert_int_equal((one_case<32, FL_DOC>("documents, GQA 2:1, hs 24", 2, 200, 4, 2, 24, 0, p1)),
                     0);
    std::vector<int32_t> p2 = docs(300, {{64, 64, 128, 44}, {20, 200, 1, 1, 78}});
    assert_int_equal((one_case<16, FL_DOC>("documents at tile edges", 2, 300, 2, 2, 16, 0, p2)), 0);
}

static void test_documents_and_window(void **state)
{
    (void)state;
    std::vector<int32_t> p1 = mixed();
    assert_int_equal(
        (one_case<32, FL_WIN | FL_DOC>("documents, window 50", 2, 200, 2, 1, 32, 50, p1)), 0);
    std::vector<int32_t> p2 = docs(300, {{64, 64, 128, 44}, {20, 200, 1, 1, 78}});
    assert_int_equal((one_case<16, FL_WIN | FL_DOC>("documents at tile edges, window 65", 2, 300, 2,
                                                    2, 16, 65, p2)),
                     0);
}

/* The checker sees the documents: the causal kernels given them are rejected. */
static void test_checker_catches_causal_kernels(void **state)
{
    (void)state;
    printf("expected to fail (the causal kernels given documents):\n");
    assert_true((one_case<16, 0>("causal kernels, documents", 2, 200, 2, 1, 16, 0, mixed())) > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_and_window_kernels),
        cmocka_unit_test(test_documents),
        cmocka_unit_test(test_documents_and_window),
        cmocka_unit_test(test_checker_catches_causal_kernels),
    };
    return cmocka_run_group_tests_name("cu_flash emulated", tests, NULL, NULL);
}
