/* GPU test of the Llama family on the CUDA backend: its units (gpu_worker/cuda/cu_llama_units.cu),
 * its kernels (cu_rmsnorm, cu_rope, cu_swiglu) and the grouped-query flash attention of
 * cu_flash.cu, against the fp32 CPU reference gpu_worker/cpu/cpu_llama.c, on the same inputs:
 * random values rounded to bf16 on the host, so both sides see identical weights and activations.
 * Each kernel forward and backward (RMSNorm, RoPE with plain and llama3-scaled frequencies,
 * SwiGLU, attention with NKV < NH and NKV = NH, T not a multiple of the 64-row tile), the head
 * (tied and untied), and whole decoder blocks forward and backward (head sizes 64 and 128). Outputs are poisoned (0xff:
 * NaN) before every GPU call, so an element left unwritten fails. A block's backward from its kept
 * internals and from a recompute give the same bytes, and reruns are bit-identical. Every check
 * prints its max abs error and relative Frobenius error, so one GPU run shows what is wrong.
 *
 * Tolerances (elementwise |gpu - ref| <= rtol |ref| + atol rms(ref), and ||gpu - ref|| / ||ref||
 * <= frob), and why:
 *  - single kernels with a bf16 output computed in fp32 from the same bf16 inputs (RMSNorm out,
 *    RoPE, SwiGLU, RMSNorm dinp): rtol 2^-7, atol 1e-3, frob 5e-3. The GPU rounds once (RNE, half
 *    an ulp = 2^-9 relative); the rest is fp32 summation order and FMA contraction (~1e-6).
 *  - fp32 statistics and weight gradients of the same fp32 terms in another order (rstd, RMSNorm
 *    dw): rtol 1e-4, atol 1e-4, frob 1e-4 (~sqrt(N) 2^-24 in practice; a lost row is ~1/N).
 *  - attention: out rtol 2^-6, atol 2e-2, frob 1e-2; dq, dk, dv frob 2e-2 (as test_cu_flash: P and
 *    dS rounded to bf16 as tensor-core operands, several bf16 outputs; dk and dv add NH/NKV query
 *    heads' shares, which a missing or doubled head would move by far more).
 *  - the head: loss within 2e-3 relative (bf16 normalised rows and logits products against fp32);
 *    dx, dnorm and the head weight's gradient frob 2e-2 (the logits' gradient is rounded to bf16).
 *  - a whole block (a dozen bf16 roundings on the way): y frob 2e-2 (rtol 2^-5, atol 3e-2); dx and
 *    every parameter tensor's gradient frob 3e-2, as test_cuda_gpt states for the GPT-2 block.
 * Exits 77 (skipped) without a usable CUDA device. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
extern "C" { /* this cmocka.h has no C++ guards of its own */
#include <cmocka.h>
}

#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "common/model/arch/arch.h"
#include "common/base/dtype.h"
#include "common/model/arch/llama.h"
#include "common/model/model.h"
#include "gpu_worker/cpu/cpu_llama.h"
#include "gpu_worker/cuda/cu_flash.h"
#include "gpu_worker/cuda/cu_head.h"
#include "gpu_worker/cuda/cu_layernorm.h"
#include "gpu_worker/cuda/cu_llama_units.h"
#include "gpu_worker/cuda/cu_matmul.h"
#include "gpu_worker/cuda/cu_rmsnorm.h"
#include "gpu_worker/cuda/cu_rope.h"
#include "gpu_worker/cuda/cu_swiglu.h"
#include "tests/testutil.h"

using std::vector;

#define LT_WORKSPACE (32u << 20)

static cudaStream_t g_s;

/* A CUDA runtime call (CK) must succeed; a device call of the code under test (RUN) must return 0,
 * and is then waited for, so that an asynchronous failure shows where it was queued. */
static void ck_at(cudaError_t e, const char *call, int line)
{
    if (e != cudaSuccess)
        fail_msg("test_cu_llama.cu:%d: %s: %s (%s)", line, call, cudaGetErrorString(e),
                 cudaGetErrorName(e));
}

static void run_at(int rc, const char *call, int line)
{
    if (rc != 0)
        fail_msg("test_cu_llama.cu:%d: %s returned %d", line, call, rc);
    ck_at(cudaStreamSynchronize(g_s), "waiting for it", line);
    ck_at(cudaGetLastError(), "after it", line);
}

#define CK(call) ck_at((call), #call, __LINE__)
#define RUN(call) run_at((call), #call, __LINE__)

static struct fy_cu_lt *g_lt;
static void *g_ws;
static vector<void *> g_allocs; /* freed at the end of each test */
static int g_bad;                /* failed checks in the current test */

/* ---- device buffers ---- */

/* n elements, poisoned (0xff). */
template <typename E> static E *dalloc(size_t n)
{
    void *p = NULL;
    CK(cudaMalloc(&p, n * sizeof(E) + 16));
    g_allocs.push_back(p);
    CK(cudaMemset(p, 0xff, n * sizeof(E) + 16));
    return (E *)p;
}

template <typename E> static E *dcopy(const vector<E> &h)
{
    E *d = dalloc<E>(h.size());
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(E), cudaMemcpyHostToDevice));
    return d;
}

template <typename E> static void dpoison(E *d, size_t n)
{
    CK(cudaMemset(d, 0xff, n * sizeof(E)));
}

template <typename E> static vector<E> hcopy(const E *d, size_t n)
{
    vector<E> h(n);
    CK(cudaStreamSynchronize(g_s));
    CK(cudaMemcpy(h.data(), d, n * sizeof(E), cudaMemcpyDeviceToHost));
    return h;
}

static void free_all(void)
{
    for (void *p : g_allocs)
        cudaFree(p);
    g_allocs.clear();
}

/* ---- values ---- */

/* Values in [lo, hi) rounded to bf16: their bits (b) and the same values as floats (f). */
struct bvals {
    vector<uint16_t> b;
    vector<float> f;
};

static bvals rnd(size_t n, float lo, float hi, uint64_t *rng)
{
    bvals v;
    v.b.resize(n);
    v.f.resize(n);
    for (size_t i = 0; i < n; i++) {
        v.b[i] = fy_f32_to_bf16(fy_test_uniform(rng, lo, hi));
        v.f[i] = fy_bf16_to_f32(v.b[i]);
    }
    return v;
}

static vector<float> widen(const vector<uint16_t> &b)
{
    vector<float> f(b.size());
    for (size_t i = 0; i < b.size(); i++)
        f[i] = fy_bf16_to_f32(b[i]);
    return f;
}

/* A device bf16 tensor as floats. */
static vector<float> hfloats(const bf16 *d, size_t n)
{
    vector<uint16_t> b(n);
    CK(cudaStreamSynchronize(g_s));
    CK(cudaMemcpy(b.data(), d, n * 2, cudaMemcpyDeviceToHost));
    return widen(b);
}

/* ---- checking ---- */

struct tol {
    double rtol, atol, frob; /* atol is relative to rms(ref); rtol < 0: no elementwise check */
};
static const struct tol BF16_OUT = {1.0 / 128, 1e-3, 5e-3};
static const struct tol F32_SUM = {1e-4, 1e-4, 1e-4};
static const struct tol ATT_OUT = {1.0 / 64, 2e-2, 1e-2};
static const struct tol GRAD = {-1, 0, 2e-2};
static const struct tol BLOCK_Y = {1.0 / 32, 3e-2, 2e-2};
static const struct tol BLOCK_GRAD = {-1, 0, 3e-2};

/* gpu against ref (n values); prints one line and, on failure, the first offending elements. */
static void check(const char *what, const char *shape, const float *gpu, const float *ref,
                  size_t n, struct tol t)
{
    double se = 0, sr = 0, worst = 0;
    size_t at = 0, bad = 0;
    for (size_t i = 0; i < n; i++)
        sr += (double)ref[i] * ref[i];
    double rms = n ? sqrt(sr / (double)n) : 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)gpu[i] - ref[i]);
        if (e != e)
            e = INFINITY;
        se += e * e;
        if (e > worst || (i == 0 && e == worst)) {
            worst = e;
            at = i;
        }
        if (t.rtol >= 0 && !(e <= t.rtol * fabs((double)ref[i]) + t.atol * rms)) {
            if (bad < 6)
                print_message("  bad %s %s [%zu]: gpu %.8g ref %.8g |err| %.3e > %.3e\n", what,
                              shape, i, (double)gpu[i], (double)ref[i], e,
                              t.rtol * fabs((double)ref[i]) + t.atol * rms);
            bad++;
        }
    }
    double frob = sr > 0 ? sqrt(se / sr) : sqrt(se);
    int ok = bad == 0 && frob <= t.frob;
    print_message("%-4s %-22s %-30s n=%-8zu max_abs_err %.3e at [%zu] (gpu %.7g ref %.7g) "
                  "rel_frob %.3e (limit %.0e)%s\n",
                  ok ? "ok" : "FAIL", what, shape, n, worst, n ? at : 0,
                  n ? (double)gpu[at] : 0.0, n ? (double)ref[at] : 0.0, frob, t.frob,
                  bad ? " elements out of tolerance (above)" : "");
    if (!ok)
        g_bad++;
}

static void check_same_bytes(const char *what, const char *shape, const void *a, const void *b,
                             size_t bytes)
{
    int same = memcmp(a, b, bytes) == 0;
    print_message("%-4s %-22s %-30s identical bytes (%zu)\n", same ? "ok" : "FAIL", what, shape,
                  bytes);
    if (!same)
        g_bad++;
}

/* ---- RMSNorm ---- */

static void test_rmsnorm(void **state)
{
    (void)state;
    g_bad = 0;
    static const int shapes[][2] = {{1, 8}, {74, 256}, {111, 2048}, {37, 4097}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int N = shapes[k][0], C = shapes[k][1];
        size_t NC = (size_t)N * C;
        float eps = k % 2 ? 1e-6f : 1e-5f;
        char shape[64];
        snprintf(shape, sizeof shape, "N=%d C=%d", N, C);
        uint64_t rng = 100 + k;
        bvals x = rnd(NC, -2, 2, &rng), w = rnd(C, 0.5f, 1.5f, &rng);
        bvals dout = rnd(NC, -1, 1, &rng), pre = rnd(NC, -0.5f, 0.5f, &rng);
        vector<float> dw_pre(C);
        for (int i = 0; i < C; i++)
            dw_pre[i] = fy_test_uniform(&rng, -1, 1);
        /* the reference: forward, then backward (dinp overwritten, dw accumulated) */
        vector<float> out(NC), rstd(N), dinp(NC), dw = dw_pre;
        fy_cpu_llama_rmsnorm_forward(out.data(), rstd.data(), x.f.data(), w.f.data(), N, C, eps);
        fy_cpu_llama_rmsnorm_backward(dinp.data(), dw.data(), dout.f.data(), x.f.data(), w.f.data(),
                                      rstd.data(), N, C);
        bf16 *dx = (bf16 *)dcopy(x.b), *dwb = (bf16 *)dcopy(w.b), *dy = dalloc<bf16>(NC);
        float *drstd = dalloc<float>(N);
        RUN(fy_cu_rmsnorm_forward(dy, drstd, dx, dwb, N, C, eps, g_s));
        check("rmsnorm fwd out", shape, hfloats(dy, NC).data(), out.data(), NC, BF16_OUT);
        check("rmsnorm fwd rstd", shape, hcopy(drstd, N).data(), rstd.data(), N, F32_SUM);
        /* the backward from the reference's rstd (both sides the same statistics), twice */
        CK(cudaMemcpy(drstd, rstd.data(), N * sizeof(float), cudaMemcpyHostToDevice));
        bf16 *ddout = (bf16 *)dcopy(dout.b), *ddinp = dalloc<bf16>(NC);
        float *ddw = dalloc<float>(C);
        float *scratch = dalloc<float>(fy_cu_layernorm_backward_scratch(N, C));
        vector<uint16_t> first_dinp;
        vector<float> first_dw;
        for (int run = 0; run < 2; run++) {
            CK(cudaMemcpy(ddinp, pre.b.data(), NC * 2, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(ddw, dw_pre.data(), C * sizeof(float), cudaMemcpyHostToDevice));
            dpoison(scratch, fy_cu_layernorm_backward_scratch(N, C));
            RUN(fy_cu_rmsnorm_backward(ddinp, ddw, scratch, ddout, dx, dwb, drstd, N, C,
                                             g_s));
            vector<uint16_t> gd = hcopy((const uint16_t *)ddinp, NC);
            vector<float> gw = hcopy(ddw, C);
            if (run == 1) {
                check_same_bytes("rmsnorm bwd rerun", shape, gd.data(), first_dinp.data(), NC * 2);
                check_same_bytes("rmsnorm bwd dw rerun", shape, gw.data(), first_dw.data(),
                                 C * sizeof(float));
                break;
            }
            vector<float> want(NC);
            for (size_t i = 0; i < NC; i++)
                want[i] = pre.f[i] + dinp[i]; /* the GPU adds onto dinp */
            check("rmsnorm bwd dinp", shape, widen(gd).data(), want.data(), NC, BF16_OUT);
            check("rmsnorm bwd dw", shape, gw.data(), dw.data(), C, F32_SUM);
            first_dinp = gd;
            first_dw = gw;
        }
        free_all();
    }
    assert_int_equal(g_bad, 0);
}

/* ---- RoPE ---- */

/* A Llama config of the given shape; llama3: rope theta 500000 and llama3 scaling with an original
 * context of 8, below T, so every branch of the scaling is used (as hf_llama.py --llama3). */
static struct fy_model_config llama_cfg(unsigned C, unsigned NH, unsigned NKV, unsigned I,
                                      unsigned V, int llama3, int tied)
{
    /* the scaling's fields are read only with llama3 */
    struct fy_model_config c = {1, NH, C, V, 1024};
    c.arch = &fy_arch_llama;
    fy_llama_mut(&c)->n_kv_head = NKV;
    fy_llama_mut(&c)->n_inter = I;
    fy_llama_mut(&c)->tied = (uint32_t)tied;
    fy_llama_mut(&c)->rope_type = llama3 ? (uint32_t)FY_ROPE_LLAMA3 : (uint32_t)FY_ROPE_DEFAULT;
    fy_llama_mut(&c)->rope_orig_max_pos = 8;
    fy_llama_mut(&c)->rms_eps = 1e-5f;
    fy_llama_mut(&c)->rope_theta = llama3 ? 500000.0 : 10000.0;
    fy_llama_mut(&c)->rope_factor = 8.0;
    fy_llama_mut(&c)->rope_low_freq_factor = 1.0;
    fy_llama_mut(&c)->rope_high_freq_factor = 4.0;
    return c;
}

/* The reference's rotary table for config c at T positions, on the host (cos, then sin). */
static vector<float> rope_table(const struct fy_model_config *c, int T)
{
    int half = (int)(c->n_embd / c->n_head) / 2;
    vector<float> inv(half), t(2 * (size_t)T * half);
    fy_cpu_llama_rope_inv_freq(c, inv.data());
    fy_cpu_llama_rope_table(t.data(), t.data() + (size_t)T * half, inv.data(), T, half);
    return t;
}

/* Positions of documents packed in rows of T (gpu_worker/backend_ops.h): lengths drawn from 1 to
 * max_len, the last cut at the row's end. */
static vector<int32_t> packed_positions(int B, int T, int max_len, uint64_t *rng)
{
    vector<int32_t> pos((size_t)B * T);
    for (int b = 0; b < B; b++)
        for (int t = 0, p = 0, len = 0; t < T; t++, p++) {
            if (p == len) {
                p = 0;
                len = 1 + (int)(fy_test_rand(rng) % (uint64_t)max_len);
            }
            pos[(size_t)b * T + t] = p;
        }
    return pos;
}

/* Each case at positions t (NULL) and at the positions of documents. */
static void test_rope(void **state)
{
    (void)state;
    g_bad = 0;
    /* head size 64 with llama3 scaling, 128 plain; T not a multiple of anything */
    static const struct {
        unsigned C, NH, NKV;
        int llama3, B, T;
    } cases[] = {{256, 4, 2, 1, 2, 37}, {256, 2, 1, 0, 1, 70}};
    const size_t ncases = sizeof cases / sizeof cases[0];
    for (size_t k = 0; k < 2 * ncases; k++) {
        int docs = k >= ncases;
        struct fy_model_config c =
            llama_cfg(cases[k % ncases].C, cases[k % ncases].NH, cases[k % ncases].NKV, 64, 64,
                      cases[k % ncases].llama3, 0);
        int B = cases[k % ncases].B, T = cases[k % ncases].T, NH = (int)c.n_head;
        int NKV = (int)fy_llama(&c)->n_kv_head;
        int hd = (int)(c.n_embd / c.n_head), S = (NH + 2 * NKV) * hd, half = hd / 2;
        size_t n = (size_t)B * T * S;
        char shape[96];
        snprintf(shape, sizeof shape, "B=%d T=%d NH=%d NKV=%d hd=%d %s%s", B, T, NH, NKV, hd,
                 cases[k % ncases].llama3 ? "llama3" : "plain", docs ? " documents" : "");
        uint64_t rng = 200 + k;
        bvals x = rnd(n, -2, 2, &rng);
        vector<int32_t> pos = packed_positions(B, T, 12, &rng);
        const int32_t *hpos = docs ? pos.data() : NULL, *gpos = docs ? dcopy(pos) : NULL;
        vector<float> table = rope_table(&c, T);
        float *dcos = dcopy(table), *dsin = dcos + (size_t)T * half;
        for (int dir = 0; dir < 2; dir++) {
            vector<float> ref = x.f; /* q and k heads rotated, v untouched */
            bf16 *dx = (bf16 *)dcopy(x.b);
            if (dir == 0) {
                fy_cpu_llama_rope_forward(ref.data(), S, 0, NH + NKV, hd, table.data(),
                                          table.data() + (size_t)T * half, hpos, B, T);
                RUN(fy_cu_rope_forward(dx, S, 0, NH + NKV, hd, dcos, dsin, gpos, B, T, g_s));
            } else {
                fy_cpu_llama_rope_backward(ref.data(), S, 0, NH + NKV, hd, table.data(),
                                           table.data() + (size_t)T * half, hpos, B, T);
                RUN(fy_cu_rope_backward(dx, S, 0, NH + NKV, hd, dcos, dsin, gpos, B, T, g_s));
            }
            vector<float> got = hfloats(dx, n);
            check(dir ? "rope bwd" : "rope fwd", shape, got.data(), ref.data(), n, BF16_OUT);
            /* the v heads are not touched, to the bit */
            size_t moved = 0;
            for (size_t r = 0; r < (size_t)B * T; r++)
                for (int i = (NH + NKV) * hd; i < S; i++)
                    moved += memcmp(&got[r * S + i], &x.f[r * S + i], sizeof(float)) != 0;
            if (moved) {
                print_message("FAIL rope %s: %zu values of the v heads changed\n", shape, moved);
                g_bad++;
            }
        }
        free_all();
    }
    assert_int_equal(g_bad, 0);
}

/* ---- SwiGLU ---- */

static void test_swiglu(void **state)
{
    (void)state;
    g_bad = 0;
    static const int shapes[][2] = {{1, 1}, {74, 200}, {37, 8192}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int N = shapes[k][0], I = shapes[k][1];
        size_t n = (size_t)N * I;
        char shape[64];
        snprintf(shape, sizeof shape, "N=%d I=%d", N, I);
        uint64_t rng = 300 + k;
        bvals gu = rnd(2 * n, -6, 6, &rng), dout = rnd(n, -1, 1, &rng);
        vector<float> out(n), dgu(2 * n);
        fy_cpu_llama_swiglu_forward(out.data(), gu.f.data(), N, I);
        fy_cpu_llama_swiglu_backward(dgu.data(), dout.f.data(), gu.f.data(), N, I);
        bf16 *dg = (bf16 *)dcopy(gu.b), *dd = (bf16 *)dcopy(dout.b);
        bf16 *dout_d = dalloc<bf16>(n), *ddgu = dalloc<bf16>(2 * n);
        RUN(fy_cu_swiglu_forward(dout_d, dg, N, I, g_s));
        RUN(fy_cu_swiglu_backward(ddgu, dd, dg, N, I, g_s));
        check("swiglu fwd", shape, hfloats(dout_d, n).data(), out.data(), n, BF16_OUT);
        check("swiglu bwd", shape, hfloats(ddgu, 2 * n).data(), dgu.data(), 2 * n, BF16_OUT);
        free_all();
    }
    assert_int_equal(g_bad, 0);
}

/* ---- grouped-query attention ---- */

/* Columns [col, col + w) of every row of [rows][S] into [rows][w]. */
static vector<float> columns(const vector<float> &a, size_t rows, int S, int col, int w)
{
    vector<float> o(rows * w);
    for (size_t r = 0; r < rows; r++)
        memcpy(&o[r * w], &a[r * S + col], (size_t)w * sizeof(float));
    return o;
}

static void test_gqa_attention(void **state)
{
    (void)state;
    g_bad = 0;
    static const int cases[][5] = {
        /* B, T, NH, NKV, hd */
        {2, 37, 4, 2, 64}, {2, 100, 4, 1, 128}, {1, 70, 2, 2, 64}, {2, 130, 8, 2, 32}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int B = cases[k][0], T = cases[k][1], NH = cases[k][2], NKV = cases[k][3];
        int hd = cases[k][4], S = (NH + 2 * NKV) * hd, QC = NH * hd;
        size_t rows = (size_t)B * T, nqkv = rows * S, nout = rows * QC;
        char shape[96];
        snprintf(shape, sizeof shape, "B=%d T=%d NH=%d NKV=%d hd=%d", B, T, NH, NKV, hd);
        uint64_t rng = 400 + k;
        bvals qkv = rnd(nqkv, -2, 2, &rng), dout = rnd(nout, -1, 1, &rng);
        vector<float> out(nout), att((size_t)B * NH * T * T), dqkv(nqkv);
        fy_cpu_llama_attention_forward(out.data(), att.data(), qkv.f.data(), B, T, NH, NKV, hd);
        fy_cpu_llama_attention_backward(dqkv.data(), dout.f.data(), qkv.f.data(), att.data(), B, T,
                                        NH, NKV, hd);
        size_t sbytes = fy_cu_flash_scratch_bytes(B, T, QC, NH);
        assert_true(sbytes > 0);
        bf16 *dq = (bf16 *)dcopy(qkv.b), *dd = (bf16 *)dcopy(dout.b);
        bf16 *dout_d = dalloc<bf16>(nout), *ddqkv = dalloc<bf16>(nqkv);
        char *scratch = dalloc<char>(sbytes);
        vector<uint16_t> first_out, first_dqkv;
        for (int run = 0; run < 2; run++) { /* the second run on fresh poison: the same bytes */
            dpoison(dout_d, nout);
            dpoison(ddqkv, nqkv);
            dpoison(scratch, sbytes);
            RUN(fy_cu_flash_gqa_forward(dout_d, dq, scratch, B, T, NH, NKV, hd, g_s));
            RUN(fy_cu_flash_gqa_backward(ddqkv, dd, dout_d, dq, scratch, B, T, NH, NKV, hd, g_s));
            vector<uint16_t> go = hcopy((const uint16_t *)dout_d, nout);
            vector<uint16_t> gd = hcopy((const uint16_t *)ddqkv, nqkv);
            if (run == 1) {
                check_same_bytes("gqa out rerun", shape, go.data(), first_out.data(), nout * 2);
                check_same_bytes("gqa dqkv rerun", shape, gd.data(), first_dqkv.data(), nqkv * 2);
                break;
            }
            first_out = go;
            first_dqkv = gd;
            check("gqa out", shape, widen(go).data(), out.data(), nout, ATT_OUT);
            vector<float> g = widen(gd);
            const char *names[3] = {"gqa dq", "gqa dk", "gqa dv"};
            int col[3] = {0, QC, QC + NKV * hd}, w[3] = {QC, NKV * hd, NKV * hd};
            for (int p = 0; p < 3; p++)
                check(names[p], shape, columns(g, rows, S, col[p], w[p]).data(),
                      columns(dqkv, rows, S, col[p], w[p]).data(), rows * w[p], GRAD);
        }
        free_all();
    }
    /* what it refuses: a head size that is not a multiple of 8 or over 128, NKV not dividing NH */
    assert_false(fy_cu_flash_gqa_supported(4, 3, 64));
    assert_false(fy_cu_flash_gqa_supported(4, 2, 12));
    assert_false(fy_cu_flash_gqa_supported(4, 2, 136));
    assert_true(fy_cu_flash_gqa_supported(32, 8, 64));
    assert_true(fy_cu_flash_gqa_supported(32, 4, 128));
    print_message("(an error line about an unsupported shape is expected next)\n");
    assert_int_equal(fy_cu_flash_gqa_forward(NULL, NULL, NULL, 1, 8, 4, 3, 64, g_s), -EINVAL);
    assert_int_equal(g_bad, 0);
}

/* ---- a unit: the head and whole blocks ---- */

struct unit {
    struct fy_cu_arena arena;
    struct fy_cu_llama *l;
    void *head_scratch;
};

static void unit_new(struct unit *u, const struct fy_model_config *c, int B, int T, size_t extra)
{
    int rows = B * T;
    size_t hs = fy_cu_head_scratch_bytes(rows, (int)c->vocab);
    u->head_scratch = dalloc<char>(hs);
    assert_int_equal(fy_cu_arena_init(&u->arena, fy_cu_llama_arena_bytes(c, B, T) + extra), 0);
    struct fy_cu_env env = {g_lt, g_s, u->head_scratch, rows};
    assert_int_equal(fy_cu_llama_new(&u->l, &u->arena, c, B, T, &env), 0);
}

static void unit_free(struct unit *u)
{
    fy_cu_llama_destroy(&u->l);
    fy_cu_arena_release(&u->arena);
}

static void head_case(int tied)
{
    struct fy_model_config c = llama_cfg(256, 4, 2, 64, 300, 0, tied);
    int B = 2, T = 37, N = B * T, C = (int)c.n_embd, V = (int)c.vocab;
    size_t NC = (size_t)N * C, VC = (size_t)V * C, nf = fy_model_unit_params(&c, 2);
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d C=%d V=%d %s", N, C, V, tied ? "tied" : "untied");
    uint64_t rng = tied ? 500 : 501;
    bvals x = rnd(NC, -2, 2, &rng), embed = rnd(VC, -0.1f, 0.1f, &rng);
    bvals fin = rnd(nf, -0.1f, 0.1f, &rng), norm = rnd(C, 0.5f, 1.5f, &rng);
    memcpy(fin.b.data(), norm.b.data(), C * 2); /* the norm's weight, then lm_head when untied */
    memcpy(fin.f.data(), norm.f.data(), C * sizeof(float));
    vector<int32_t> targets(N);
    for (int i = 0; i < N; i++)
        targets[i] = (int32_t)(fy_test_rand(&rng) % V);
    targets[T + 3] = -1; /* ignored: out of the mean, no gradient */
    vector<float> dx(NC), dfin(nf), dembed(VC), scratch(fy_cpu_llama_head_scratch(&c, B, T));
    double loss = fy_cpu_llama_head_forward_backward(&c, fin.f.data(), embed.f.data(), x.f.data(),
                                                     targets.data(), dx.data(), dfin.data(),
                                                     dembed.data(), scratch.data(), B, T);
    struct unit u;
    unit_new(&u, &c, B, T, 0);
    bf16 *dxin = (bf16 *)dcopy(x.b), *dfin_b = (bf16 *)dcopy(fin.b), *demb = (bf16 *)dcopy(embed.b);
    const bf16 *head_w = tied ? demb : dfin_b + C;
    int32_t *dtg = dcopy(targets);
    float *losses = dalloc<float>(N), *dnorm = dalloc<float>(C), *dhead = dalloc<float>(VC);
    bf16 *ddx = dalloc<bf16>(NC);
    RUN(fy_cu_llama_head(u.l, dfin_b, head_w, dxin, dtg, losses, ddx, dnorm, dhead, 0));
    vector<float> hl = hcopy(losses, N);
    double sum = 0;
    int counted = 0;
    for (int i = 0; i < N; i++)
        if (targets[i] >= 0) {
            sum += hl[i];
            counted++;
        }
    double gl = sum / counted;
    int ok = fabs(gl - loss) <= 2e-3 * fabs(loss);
    print_message("%-4s %-22s %-30s loss gpu %.7f cpu %.7f (|diff| %.2e, limit 2e-3 relative)\n",
                  ok ? "ok" : "FAIL", "head loss", shape, gl, loss, fabs(gl - loss));
    g_bad += !ok;
    check("head dx", shape, hfloats(ddx, NC).data(), dx.data(), NC, GRAD);
    check("head dnorm", shape, hcopy(dnorm, C).data(), dfin.data(), C, GRAD);
    check("head dhead", shape, hcopy(dhead, VC).data(), tied ? dembed.data() : dfin.data() + C,
          VC, GRAD);
    /* loss only: the same losses */
    float *losses2 = dalloc<float>(N);
    RUN(fy_cu_llama_head(u.l, dfin_b, head_w, dxin, dtg, losses2, NULL, NULL, NULL, 0));
    check_same_bytes("head loss only", shape, hcopy(losses2, N).data(), hl.data(),
                     N * sizeof(float));
    unit_free(&u);
    free_all();
}

static void test_head(void **state)
{
    (void)state;
    g_bad = 0;
    head_case(1);
    head_case(0);
    assert_int_equal(g_bad, 0);
}

/* Names and ranges of a block's parameter tensors. */
struct part {
    const char *name;
    size_t at, n;
};

static int block_parts(const struct fy_model_config *c, struct part *p)
{
    struct fy_llama_unit_layout l;
    fy_llama_unit_layout(c, &l);
    const struct part all[] = {
        {"d input_norm", l.input_norm, l.q_proj - l.input_norm},
        {"d q_proj", l.q_proj, l.k_proj - l.q_proj},
        {"d k_proj", l.k_proj, l.v_proj - l.k_proj},
        {"d v_proj", l.v_proj, l.o_proj - l.v_proj},
        {"d o_proj", l.o_proj, l.post_norm - l.o_proj},
        {"d post_norm", l.post_norm, l.gate_proj - l.post_norm},
        {"d gate_proj", l.gate_proj, l.up_proj - l.gate_proj},
        {"d up_proj", l.up_proj, l.down_proj - l.up_proj},
        {"d down_proj", l.down_proj, l.total - l.down_proj},
    };
    memcpy(p, all, sizeof all);
    return (int)(sizeof all / sizeof all[0]);
}

/* Weights of a block: the norms' U(0.8, 1.2), every matrix U(-a, a) with a = 1.5 / sqrt(its
 * inputs: C, or I for down_proj), so that activations stay O(1) and the attention is far from
 * uniform. */
static bvals block_params(const struct fy_model_config *c, uint64_t *rng)
{
    struct fy_llama_unit_layout l;
    fy_llama_unit_layout(c, &l);
    bvals p = rnd(l.total, -1, 1, rng);
    for (size_t i = 0; i < l.total; i++) {
        int norm = i < l.q_proj || (i >= l.post_norm && i < l.gate_proj);
        double fan_in = i >= l.down_proj ? fy_llama(c)->n_inter : c->n_embd;
        float v = norm ? 1.0f + 0.2f * p.f[i] : (float)(1.5 / sqrt(fan_in) * p.f[i]);
        p.b[i] = fy_f32_to_bf16(v);
        p.f[i] = fy_bf16_to_f32(p.b[i]);
    }
    return p;
}

/* docs: documents of up to docs tokens packed in the rows (0: positions t). */
static void block_case(const struct fy_model_config *c, int B, int T, uint64_t seed, int docs)
{
    int C = (int)c->n_embd;
    size_t NC = (size_t)B * T * C, P = fy_model_unit_params(c, 1);
    char shape[128];
    snprintf(shape, sizeof shape, "B=%d T=%d C=%d NH=%d NKV=%d I=%u %s W=%u%s", B, T, C,
             (int)c->n_head, (int)fy_llama(c)->n_kv_head, fy_llama(c)->n_inter,
             fy_llama(c)->rope_type == FY_ROPE_LLAMA3 ? "llama3" : "plain",
             fy_llama(c)->sliding_window, docs ? " documents" : "");
    uint64_t rng = seed;
    bvals p = block_params(c, &rng), x = rnd(NC, -1, 1, &rng), dy = rnd(NC, -1, 1, &rng);
    vector<int32_t> pos = packed_positions(B, T, docs ? docs : 1, &rng);
    const int32_t *hpos = docs ? pos.data() : NULL, *gpos = docs ? dcopy(pos) : NULL;
    vector<float> y(NC), dx(NC), dp(P, 0.0f), scratch(fy_cpu_llama_block_scratch(c, B, T));
    fy_cpu_llama_block_forward(c, p.f.data(), hpos, x.f.data(), y.data(), scratch.data(), B, T);
    fy_cpu_llama_block_backward(c, p.f.data(), hpos, x.f.data(), dy.f.data(), dx.data(), dp.data(),
                                scratch.data(), B, T);
    struct unit u;
    unit_new(&u, c, B, T, fy_cu_llama_acts_bytes(c, B, T));
    struct fy_cu_llama_acts kept;
    assert_int_equal(fy_cu_llama_acts_take(u.l, &u.arena, &kept), 0);
    bf16 *dparams = (bf16 *)dcopy(p.b), *dx_in = (bf16 *)dcopy(x.b), *ddy = (bf16 *)dcopy(dy.b);
    bf16 *dyo = dalloc<bf16>(NC), *ddx = dalloc<bf16>(NC);
    float *ddp = dalloc<float>(P);
    /* recomputing: forward, then backward from x */
    RUN(fy_cu_llama_block_forward(u.l, dparams, gpos, dx_in, dyo, NULL));
    vector<uint16_t> gy = hcopy((const uint16_t *)dyo, NC);
    RUN(fy_cu_llama_block_backward(u.l, dparams, gpos, dx_in, ddy, ddx, ddp, NULL));
    vector<uint16_t> gdx = hcopy((const uint16_t *)ddx, NC);
    vector<float> gdp = hcopy(ddp, P);
    check("block y", shape, widen(gy).data(), y.data(), NC, BLOCK_Y);
    check("block dx", shape, widen(gdx).data(), dx.data(), NC, BLOCK_GRAD);
    struct part parts[9];
    for (int k = 0, n = block_parts(c, parts); k < n; k++)
        check(parts[k].name, shape, gdp.data() + parts[k].at, dp.data() + parts[k].at, parts[k].n,
              BLOCK_GRAD);
    /* from a kept set, on fresh poison and after another forward into the unit's own set: the
     * same bytes */
    dpoison(dyo, NC);
    dpoison(ddx, NC);
    dpoison(ddp, P);
    RUN(fy_cu_llama_block_forward(u.l, dparams, gpos, dx_in, dyo, &kept));
    bf16 *other = dalloc<bf16>(NC);
    RUN(fy_cu_llama_block_forward(u.l, dparams, gpos, ddy, other, NULL));
    check_same_bytes("block y kept", shape, hcopy((const uint16_t *)dyo, NC).data(), gy.data(),
                     NC * 2);
    RUN(fy_cu_llama_block_backward(u.l, dparams, gpos, dx_in, ddy, ddx, ddp, &kept));
    check_same_bytes("block dx kept", shape, hcopy((const uint16_t *)ddx, NC).data(), gdx.data(),
                     NC * 2);
    check_same_bytes("block dparams kept", shape, hcopy(ddp, P).data(), gdp.data(),
                     P * sizeof(float));
    unit_free(&u);
    free_all();
}

static void test_block(void **state)
{
    (void)state;
    g_bad = 0;
    /* head size 64, grouped (4 heads, 2 kv), llama3 rope */
    struct fy_model_config a = llama_cfg(256, 4, 2, 688, 300, 1, 0);
    block_case(&a, 2, 37, 600, 0);
    /* head size 128, one kv head per head, plain rope, another epsilon */
    struct fy_model_config b = llama_cfg(256, 2, 2, 512, 300, 0, 0);
    fy_llama_mut(&b)->rms_eps = 1e-6f;
    block_case(&b, 1, 70, 601, 0);
    /* documents in the rows (RoPE at their positions, attention within each), alone and with a
     * sliding window shorter than some of them */
    block_case(&a, 2, 150, 602, 70);
    struct fy_model_config w = a;
    fy_llama_mut(&w)->sliding_window = 40;
    block_case(&w, 2, 150, 603, 70);
    assert_int_equal(g_bad, 0);
}

/* The embedding: the lookup exact (a copy of bf16 rows), its gradient the reference's sums to the
 * bit. */
static void test_embedding(void **state)
{
    (void)state;
    g_bad = 0;
    struct fy_model_config c = llama_cfg(256, 4, 2, 64, 300, 0, 1);
    int B = 2, T = 37, N = B * T, C = (int)c.n_embd, V = (int)c.vocab;
    size_t NC = (size_t)N * C, VC = (size_t)V * C;
    uint64_t rng = 700;
    bvals emb = rnd(VC, -1, 1, &rng), dx = rnd(NC, -1, 1, &rng);
    vector<int32_t> tokens(N);
    for (int i = 0; i < N; i++)
        tokens[i] = (int32_t)(fy_test_rand(&rng) % 17); /* repeats: rows summed */
    vector<float> x(NC), demb(VC);
    for (size_t i = 0; i < VC; i++)
        demb[i] = fy_test_uniform(&rng, -1, 1);
    vector<float> demb_pre = demb;
    fy_cpu_llama_embed_forward(&c, emb.f.data(), tokens.data(), x.data(), B, T);
    fy_cpu_llama_embed_backward(&c, tokens.data(), dx.f.data(), demb.data(), B, T);
    struct unit u;
    unit_new(&u, &c, B, T, 0);
    bf16 *de = (bf16 *)dcopy(emb.b), *ddx = (bf16 *)dcopy(dx.b), *dxo = dalloc<bf16>(NC);
    int32_t *dt = dcopy(tokens);
    float *dd = dcopy(demb_pre);
    RUN(fy_cu_llama_embed_forward(u.l, de, dt, dxo));
    RUN(fy_cu_llama_embed_backward(u.l, dt, ddx, dd));
    check_same_bytes("embed fwd", "N=74 C=256", hfloats(dxo, NC).data(), x.data(),
                     NC * sizeof(float));
    /* the reference's additions in its order (rows ascending): the same bits */
    check_same_bytes("embed bwd", "N=74 C=256 V=300", hcopy(dd, VC).data(), demb.data(),
                     VC * sizeof(float));
    unit_free(&u);
    free_all();
    assert_int_equal(g_bad, 0);
}

/* What the CUDA backend refuses, with a message: head sizes that are not multiples of 8 or are
 * over 128, and a GPT-2 config. */
static void test_refusals(void **state)
{
    (void)state;
    struct fy_model_config ok = llama_cfg(2048, 32, 8, 8192, 1000, 1, 1);
    assert_int_equal(fy_cu_llama_check(&ok), 0);
    struct fy_model_config tiny = llama_cfg(2048, 16, 4, 5632, 1000, 0, 0); /* hd 128 */
    assert_int_equal(fy_cu_llama_check(&tiny), 0);
    print_message("(three error lines about unsupported Llama shapes are expected next)\n");
    struct fy_model_config odd = llama_cfg(48, 4, 2, 64, 300, 0, 0); /* hd 12 */
    assert_int_equal(fy_cu_llama_check(&odd), -EINVAL);
    struct fy_model_config wide = llama_cfg(544, 2, 1, 64, 300, 0, 0); /* hd 272 */
    assert_int_equal(fy_cu_llama_check(&wide), -EINVAL);
    struct fy_model_config gpt = {2, 4, 64, 300, 64};
    assert_int_equal(fy_cu_llama_check(&gpt), -EINVAL);
}

int main(void)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        printf("test_cu_llama: SKIPPED: no usable CUDA device (cudaGetDeviceCount: %s, %d "
               "devices)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "ok", count);
        return FY_TEST_SKIP;
    }
    if (cudaStreamCreate(&g_s) != cudaSuccess || cudaMalloc(&g_ws, LT_WORKSPACE) != cudaSuccess ||
        fy_cu_lt_new(&g_lt, g_ws, LT_WORKSPACE) != 0) {
        printf("test_cu_llama: cannot set up the stream and cuBLASLt\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm),       cmocka_unit_test(test_rope),
        cmocka_unit_test(test_swiglu),        cmocka_unit_test(test_gqa_attention),
        cmocka_unit_test(test_head),          cmocka_unit_test(test_block),
        cmocka_unit_test(test_embedding),     cmocka_unit_test(test_refusals),
    };
    int failed = cmocka_run_group_tests_name("cu_llama", tests, NULL, NULL);
    fy_cu_lt_destroy(&g_lt);
    cudaFree(g_ws);
    cudaStreamDestroy(g_s);
    return failed;
}
