/* GPU test of gpu_worker/cuda/cu_attention.cu and cu_head.cu: the materialising causal attention
 * forward/backward against the fp32 CPU reference (fy_cpu_attention_forward/backward) and the LM
 * head (logits, cross-entropy, dxn, dwte) against a CPU computation in fp64, on bf16-rounded
 * inputs (so both sides see the same values). Every call runs twice on poisoned outputs and
 * scratch, and the two results must be identical byte for byte. Skips (exit 77) where there is no
 * usable CUDA device.
 *
 * Tolerances (bf16 products with fp32 accumulation against an fp32/fp64 reference):
 *  - outputs: |gpu - cpu| <= 2^-6 |cpu| + 2e-2 rms(cpu) per element. The GPU rounds P to bf16 before
 *    P v and rounds the output to bf16 (2^-9 relative each); 2^-6 leaves 8x margin for that, and the
 *    rms term covers elements whose value is small because of cancellation.
 *  - gradients: relative Frobenius ||gpu - cpu|| / ||cpu|| < 2e-2. They pass through several bf16
 *    roundings (P, dS, dlogits, the outputs), each 2^-9 relative, plus cancellation in
 *    dS = P (dP - rowsum) which makes some elements small; a norm-wise bound is the stable measure.
 *  - loss: |gpu - ref| <= 1e-3 |ref| + 1e-5 per row. Logits are computed from the same bf16 values
 *    on both sides with fp32 accumulation (relative error ~1e-6), and the GPU's fp32 logsumexp
 *    differs from the fp64 reference by ~1e-6 relative; 1e-3 is loose for that but any real mistake
 *    (wrong max, wrong target column, wrong mask) moves a loss by O(1). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
extern "C" { /* this cmocka.h has no C++ guards of its own */
#include <cmocka.h>
}

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/dtype.h"
#include "gpu_worker/cpu/gpt2_cpu.h"
#include "gpu_worker/cuda/cu_attention.h"
#include "gpu_worker/cuda/cu_head.h"
#include "tests/testutil.h"

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t ck_err_ = (call);                                                              \
        if (ck_err_ != cudaSuccess)                                                                \
            fail_msg("%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call,                              \
                     cudaGetErrorString(ck_err_), cudaGetErrorName(ck_err_));                      \
    } while (0)

#define WORKSPACE_BYTES (32u << 20)

static struct fy_cu_lt *g_lt;
static cudaStream_t g_stream;

/* ---- helpers ---- */

/* n random bf16 values in [lo, hi): bits in hb, their exact float values in hf. */
static void rand_bf16(uint16_t *hb, float *hf, size_t n, uint64_t *st, float lo, float hi)
{
    for (size_t i = 0; i < n; i++) {
        hb[i] = fy_f32_to_bf16(fy_test_uniform(st, lo, hi));
        hf[i] = fy_bf16_to_f32(hb[i]);
    }
}

static void bf16_to_f32_array(float *out, const uint16_t *in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = fy_bf16_to_f32(in[i]);
}

/* ||gpu - ref|| / ||ref|| (0 when both are 0); *max_abs gets max |gpu - ref| (NaN shows as NaN). */
static double rel_frobenius(const float *gpu, const float *ref, size_t n, double *max_abs)
{
    double e = 0.0, r = 0.0, m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)gpu[i] - (double)ref[i];
        e += d * d;
        r += (double)ref[i] * ref[i];
        if (!(fabs(d) <= m)) /* NaN propagates into m */
            m = fabs(d);
    }
    if (max_abs)
        *max_abs = m;
    if (r == 0.0)
        return e == 0.0 ? 0.0 : INFINITY;
    return sqrt(e / r);
}

/* Element-wise output check; returns the number of violations and prints the first few. */
static size_t check_elementwise(const char *what, const float *gpu, const float *ref, size_t n)
{
    double ss = 0.0;
    for (size_t i = 0; i < n; i++)
        ss += (double)ref[i] * ref[i];
    double rms = sqrt(ss / (double)n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double tol = ldexp(fabs((double)ref[i]), -6) + 2e-2 * rms;
        double d = fabs((double)gpu[i] - (double)ref[i]);
        if (!(d <= tol)) {
            if (bad < 5)
                print_message("  %s[%zu]: gpu %.7g cpu %.7g |diff| %.3g > tol %.3g\n", what, i,
                              (double)gpu[i], (double)ref[i], d, tol);
            bad++;
        }
    }
    return bad;
}

/* ---- attention ---- */

static void attention_case(int B, int T, int C, int NH, uint64_t seed)
{
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    size_t natt = (size_t)B * NH * T * T;
    uint64_t st = seed;
    uint16_t *qkv_b = (uint16_t *)malloc(nqkv * 2), *dout_b = (uint16_t *)malloc(nout * 2);
    float *qkv_f = (float *)malloc(nqkv * 4), *dout_f = (float *)malloc(nout * 4);
    float *out_ref = (float *)malloc(nout * 4), *att_ref = (float *)malloc(natt * 4);
    float *dqkv_ref = (float *)malloc(nqkv * 4);
    uint16_t *out_g[2], *dqkv_g[2];
    for (int k = 0; k < 2; k++) {
        out_g[k] = (uint16_t *)malloc(nout * 2);
        dqkv_g[k] = (uint16_t *)malloc(nqkv * 2);
        assert_non_null(out_g[k]);
        assert_non_null(dqkv_g[k]);
    }
    float *out_f = (float *)malloc(nout * 4), *dqkv_f = (float *)malloc(nqkv * 4);
    assert_true(qkv_b && dout_b && qkv_f && dout_f && out_ref && att_ref && dqkv_ref && out_f &&
                dqkv_f);
    rand_bf16(qkv_b, qkv_f, nqkv, &st, -2.0f, 2.0f);
    rand_bf16(dout_b, dout_f, nout, &st, -1.0f, 1.0f);

    fy_cpu_attention_forward(out_ref, att_ref, qkv_f, NULL, B, T, C, NH);
    fy_cpu_attention_backward(dqkv_ref, dout_f, qkv_f, att_ref, NULL, B, T, C, NH);

    size_t sbytes = fy_cu_attention_scratch_bytes(B, T, C, NH);
    assert_true(sbytes > 0);
    assert_int_equal(sbytes % 256, 0);
    bf16 *d_qkv, *d_out, *d_dout, *d_dqkv;
    void *d_scratch;
    CK(cudaMalloc(&d_qkv, nqkv * 2));
    CK(cudaMalloc(&d_out, nout * 2));
    CK(cudaMalloc(&d_dout, nout * 2));
    CK(cudaMalloc(&d_dqkv, nqkv * 2));
    CK(cudaMalloc(&d_scratch, sbytes));
    CK(cudaMemcpy(d_qkv, qkv_b, nqkv * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_dout, dout_b, nout * 2, cudaMemcpyHostToDevice));

    for (int k = 0; k < 2; k++) {
        /* poison: 0xffff is a bf16 NaN, 0xffffffff an f32 NaN */
        CK(cudaMemsetAsync(d_out, 0xff, nout * 2, g_stream));
        CK(cudaMemsetAsync(d_dqkv, 0xff, nqkv * 2, g_stream));
        CK(cudaMemsetAsync(d_scratch, 0xff, sbytes, g_stream));
        assert_int_equal(
            fy_cu_attention_forward(g_lt, d_out, d_qkv, NULL, d_scratch, B, T, C, NH, g_stream), 0);
        assert_int_equal(fy_cu_attention_backward(g_lt, d_dqkv, d_dout, d_qkv, d_scratch, B, T, C,
                                                  NH, g_stream),
                         0);
        CK(cudaStreamSynchronize(g_stream));
        CK(cudaGetLastError());
        CK(cudaMemcpy(out_g[k], d_out, nout * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(dqkv_g[k], d_dqkv, nqkv * 2, cudaMemcpyDeviceToHost));
    }

    bf16_to_f32_array(out_f, out_g[0], nout);
    bf16_to_f32_array(dqkv_f, dqkv_g[0], nqkv);
    double out_max, out_rel = rel_frobenius(out_f, out_ref, nout, &out_max);
    size_t out_bad = check_elementwise("out", out_f, out_ref, nout);

    /* dq, dk, dv separately: gather each third of the columns */
    const char *names[3] = {"dq", "dk", "dv"};
    double rel[3], mx[3];
    float *g3 = (float *)malloc(nout * 4), *r3 = (float *)malloc(nout * 4);
    assert_true(g3 && r3);
    for (int s = 0; s < 3; s++) {
        for (size_t bt = 0; bt < (size_t)B * T; bt++)
            for (int c = 0; c < C; c++) {
                g3[bt * C + c] = dqkv_f[bt * 3 * C + (size_t)s * C + c];
                r3[bt * C + c] = dqkv_ref[bt * 3 * C + (size_t)s * C + c];
            }
        rel[s] = rel_frobenius(g3, r3, nout, &mx[s]);
    }
    int same_out = memcmp(out_g[0], out_g[1], nout * 2) == 0;
    int same_dqkv = memcmp(dqkv_g[0], dqkv_g[1], nqkv * 2) == 0;
    print_message("attention B=%d T=%d C=%d NH=%d: out max_abs_err %.3g rel_frob %.3g (%zu over "
                  "tol); dq max_abs %.3g rel_frob %.3g; dk max_abs %.3g rel_frob %.3g; dv max_abs "
                  "%.3g rel_frob %.3g; rerun identical: out %s dqkv %s\n",
                  B, T, C, NH, out_max, out_rel, out_bad, mx[0], rel[0], mx[1], rel[1], mx[2],
                  rel[2], same_out ? "yes" : "NO", same_dqkv ? "yes" : "NO");
    assert_int_equal(out_bad, 0);
    for (int s = 0; s < 3; s++)
        if (!(rel[s] < 2e-2))
            fail_msg("attention B=%d T=%d C=%d NH=%d: %s relative Frobenius %.3g >= 2e-2", B, T, C,
                     NH, names[s], rel[s]);
    assert_true(same_out);
    assert_true(same_dqkv);

    CK(cudaFree(d_qkv));
    CK(cudaFree(d_out));
    CK(cudaFree(d_dout));
    CK(cudaFree(d_dqkv));
    CK(cudaFree(d_scratch));
    free(g3);
    free(r3);
    for (int k = 0; k < 2; k++) {
        free(out_g[k]);
        free(dqkv_g[k]);
    }
    free(qkv_b);
    free(dout_b);
    free(qkv_f);
    free(dout_f);
    free(out_ref);
    free(att_ref);
    free(dqkv_ref);
    free(out_f);
    free(dqkv_f);
}

static void test_attention(void **state)
{
    (void)state;
    attention_case(1, 1, 8, 2, 101);
    attention_case(2, 7, 16, 2, 102);
    attention_case(2, 65, 64, 4, 103);
    attention_case(1, 256, 128, 2, 104);
}

/* ---- head ---- */

#define DWTE_INIT 0.25f /* dwte starts here: checks that the head adds (+=) rather than overwrites */

/* The reference: fp32 logits from the same bf16 values, fp64 softmax, loss and gradients (dwte's
 * increment), over count targets. */
static void head_reference(int N, int C, int V, const float *xn_f, const float *wte_f,
                           const int32_t *targets, int count, double *loss_ref, float *dxn_ref,
                           float *dwte_ref)
{
    float *logits = (float *)malloc((size_t)N * V * 4);
    double *dl = (double *)malloc((size_t)N * V * sizeof(double));
    assert_true(logits && dl);
    fy_cpu_matmul_forward(logits, xn_f, wte_f, NULL, N, C, V);
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * V;
        double *g = dl + (size_t)n * V;
        int t = targets[n];
        if (t < 0) {
            loss_ref[n] = 0.0;
            for (int v = 0; v < V; v++)
                g[v] = 0.0;
            continue;
        }
        double m = z[0];
        for (int v = 1; v < V; v++)
            m = z[v] > m ? z[v] : m;
        double s = 0.0;
        for (int v = 0; v < V; v++)
            s += exp((double)z[v] - m);
        loss_ref[n] = log(s) + m - z[t];
        for (int v = 0; v < V; v++)
            g[v] = (exp((double)z[v] - m) / s - (v == t ? 1.0 : 0.0)) / count;
    }
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double a = 0.0;
            for (int v = 0; v < V; v++)
                a += dl[(size_t)n * V + v] * wte_f[(size_t)v * C + c];
            dxn_ref[(size_t)n * C + c] = (float)a;
        }
    for (int v = 0; v < V; v++)
        for (int c = 0; c < C; c++) {
            double a = 0.0;
            for (int n = 0; n < N; n++)
                a += dl[(size_t)n * V + v] * xn_f[(size_t)n * C + c];
            dwte_ref[(size_t)v * C + c] = (float)a; /* the increment */
        }
    free(logits);
    free(dl);
}

/* Runs 0 and 1: forward + backward; run 2: forward only (dxn NULL), each on poisoned outputs and
 * scratch, dwte starting at dwte_init. */
static void head_gpu_runs(int N, int C, int V, int chunk_rows, const uint16_t *xn_b,
                          const uint16_t *wte_b, const int32_t *targets, const float *dwte_init,
                          float *losses_g[3], uint16_t *dxn_g[2], float *dwte_g[2])
{
    size_t nx = (size_t)N * C, nw = (size_t)V * C;
    size_t sbytes = fy_cu_head_scratch_bytes(chunk_rows, V);
    assert_true(sbytes > 0);
    bf16 *d_xn, *d_wte, *d_dxn;
    float *d_losses, *d_dwte;
    int32_t *d_targets;
    void *d_scratch;
    CK(cudaMalloc(&d_xn, nx * 2));
    CK(cudaMalloc(&d_wte, nw * 2));
    CK(cudaMalloc(&d_dxn, nx * 2));
    CK(cudaMalloc(&d_losses, (size_t)N * 4));
    CK(cudaMalloc(&d_dwte, nw * 4));
    CK(cudaMalloc(&d_targets, (size_t)N * 4));
    CK(cudaMalloc(&d_scratch, sbytes));
    CK(cudaMemcpy(d_xn, xn_b, nx * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_wte, wte_b, nw * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_targets, targets, (size_t)N * 4, cudaMemcpyHostToDevice));
    for (int k = 0; k < 3; k++) {
        int bwd = k < 2;
        CK(cudaMemsetAsync(d_losses, 0xff, (size_t)N * 4, g_stream));
        CK(cudaMemsetAsync(d_dxn, 0xff, nx * 2, g_stream));
        CK(cudaMemsetAsync(d_scratch, 0xff, sbytes, g_stream));
        CK(cudaMemcpyAsync(d_dwte, dwte_init, nw * 4, cudaMemcpyHostToDevice, g_stream));
        assert_int_equal(fy_cu_head(g_lt, d_losses, bwd ? d_dxn : NULL, bwd ? d_dwte : NULL, d_xn,
                                    d_wte, d_targets, 0, N, C, V, chunk_rows, d_scratch, g_stream),
                         0);
        CK(cudaStreamSynchronize(g_stream));
        CK(cudaGetLastError());
        CK(cudaMemcpy(losses_g[k], d_losses, (size_t)N * 4, cudaMemcpyDeviceToHost));
        if (bwd) {
            CK(cudaMemcpy(dxn_g[k], d_dxn, nx * 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(dwte_g[k], d_dwte, nw * 4, cudaMemcpyDeviceToHost));
        } else {
            /* forward only: dwte untouched */
            float *w = (float *)malloc(nw * 4);
            assert_non_null(w);
            CK(cudaMemcpy(w, d_dwte, nw * 4, cudaMemcpyDeviceToHost));
            assert_memory_equal(w, dwte_init, nw * 4);
            free(w);
        }
    }
    CK(cudaFree(d_xn));
    CK(cudaFree(d_wte));
    CK(cudaFree(d_dxn));
    CK(cudaFree(d_losses));
    CK(cudaFree(d_dwte));
    CK(cudaFree(d_targets));
    CK(cudaFree(d_scratch));
}

/* all_ignored: every target -1 (count 0: all losses and gradients must be exactly 0). */
static void head_case(int N, int C, int V, int chunk_rows, int all_ignored, uint64_t seed)
{
    uint64_t st = seed;
    size_t nx = (size_t)N * C, nw = (size_t)V * C;
    uint16_t *xn_b = (uint16_t *)malloc(nx * 2), *wte_b = (uint16_t *)malloc(nw * 2);
    float *xn_f = (float *)malloc(nx * 4), *wte_f = (float *)malloc(nw * 4);
    int32_t *targets = (int32_t *)malloc((size_t)N * 4);
    double *loss_ref = (double *)malloc((size_t)N * sizeof(double));
    float *dxn_ref = (float *)malloc(nx * 4), *dwte_ref = (float *)malloc(nw * 4);
    assert_true(xn_b && wte_b && xn_f && wte_f && targets && loss_ref && dxn_ref && dwte_ref);
    rand_bf16(xn_b, xn_f, nx, &st, -1.0f, 1.0f);
    rand_bf16(wte_b, wte_f, nw, &st, -0.5f, 0.5f);
    for (int n = 0; n < N; n++)
        targets[n] = all_ignored ? -1 : (int32_t)(fy_test_rand(&st) % (uint64_t)V);
    if (!all_ignored) {
        targets[N / 2] = -1;  /* one ignored row in the middle */
        targets[0] = V - 1;   /* the last vocabulary column is reachable */
    }
    int count = 0;
    for (int n = 0; n < N; n++)
        count += targets[n] >= 0;

    head_reference(N, C, V, xn_f, wte_f, targets, count, loss_ref, dxn_ref, dwte_ref);
    float *dwte_init = (float *)malloc(nw * 4);
    assert_non_null(dwte_init);
    for (size_t i = 0; i < nw; i++)
        dwte_init[i] = DWTE_INIT;

    float *losses_g[3];
    uint16_t *dxn_g[2];
    float *dwte_g[2];
    for (int k = 0; k < 3; k++) {
        losses_g[k] = (float *)malloc((size_t)N * 4);
        assert_non_null(losses_g[k]);
    }
    for (int k = 0; k < 2; k++) {
        dxn_g[k] = (uint16_t *)malloc(nx * 2);
        dwte_g[k] = (float *)malloc(nw * 4);
        assert_true(dxn_g[k] && dwte_g[k]);
    }
    head_gpu_runs(N, C, V, chunk_rows, xn_b, wte_b, targets, dwte_init, losses_g, dxn_g, dwte_g);

    /* losses */
    size_t loss_bad = 0;
    double loss_max = 0.0, sum_g = 0.0, sum_r = 0.0;
    for (int n = 0; n < N; n++) {
        double g = losses_g[0][n], r = loss_ref[n], d = fabs(g - r);
        sum_g += g;
        sum_r += r;
        if (!(d <= loss_max))
            loss_max = d;
        int ok = targets[n] < 0 ? g == 0.0 : d <= 1e-3 * fabs(r) + 1e-5;
        if (!ok) {
            if (loss_bad < 5)
                print_message("  loss[%d] (target %d): gpu %.7g ref %.7g\n", n, targets[n], g, r);
            loss_bad++;
        }
    }
    float *dxn_f = (float *)malloc(nx * 4), *inc = (float *)malloc(nw * 4);
    assert_true(dxn_f && inc);
    bf16_to_f32_array(dxn_f, dxn_g[0], nx);
    for (size_t i = 0; i < nw; i++)
        inc[i] = dwte_g[0][i] - DWTE_INIT;
    double dxn_max, dxn_rel = rel_frobenius(dxn_f, dxn_ref, nx, &dxn_max);
    double dw_max, dw_rel = rel_frobenius(inc, dwte_ref, nw, &dw_max);
    int same_loss = memcmp(losses_g[0], losses_g[1], (size_t)N * 4) == 0;
    int same_fwd = memcmp(losses_g[0], losses_g[2], (size_t)N * 4) == 0;
    int same_dxn = memcmp(dxn_g[0], dxn_g[1], nx * 2) == 0;
    int same_dwte = memcmp(dwte_g[0], dwte_g[1], nw * 4) == 0;
    print_message("head N=%d C=%d V=%d chunk_rows=%d count=%d: loss max_abs_err %.3g (%zu over tol, "
                  "mean gpu %.7g ref %.7g); dxn max_abs %.3g rel_frob %.3g; dwte max_abs %.3g "
                  "rel_frob %.3g; rerun identical: loss %s dxn %s dwte %s; forward-only loss "
                  "identical %s\n",
                  N, C, V, chunk_rows, count, loss_max, loss_bad, count ? sum_g / count : 0.0,
                  count ? sum_r / count : 0.0, dxn_max, dxn_rel, dw_max, dw_rel,
                  same_loss ? "yes" : "NO", same_dxn ? "yes" : "NO", same_dwte ? "yes" : "NO",
                  same_fwd ? "yes" : "NO");
    assert_int_equal(loss_bad, 0);
    if (count == 0) {
        /* no targets: gradients exactly zero (dwte exactly unchanged) */
        for (size_t i = 0; i < nx; i++)
            assert_int_equal(dxn_g[0][i] & 0x7fff, 0);
        assert_memory_equal(dwte_g[0], dwte_init, nw * 4);
    } else {
        if (!(dxn_rel < 2e-2))
            fail_msg("head V=%d: dxn relative Frobenius %.3g >= 2e-2", V, dxn_rel);
        if (!(dw_rel < 2e-2))
            fail_msg("head V=%d: dwte relative Frobenius %.3g >= 2e-2", V, dw_rel);
    }
    assert_true(same_loss);
    assert_true(same_fwd);
    assert_true(same_dxn);
    assert_true(same_dwte);

    for (int k = 0; k < 3; k++)
        free(losses_g[k]);
    for (int k = 0; k < 2; k++) {
        free(dxn_g[k]);
        free(dwte_g[k]);
    }
    free(dxn_f);
    free(inc);
    free(dwte_init);
    free(xn_b);
    free(wte_b);
    free(xn_f);
    free(wte_f);
    free(targets);
    free(loss_ref);
    free(dxn_ref);
    free(dwte_ref);
}

static void test_head(void **state)
{
    (void)state;
    head_case(7, 16, 11, 3, 0, 201);      /* chunks 3, 3, 1 */
    head_case(130, 64, 50, 32, 0, 202);   /* chunks of 32 and a tail of 2 */
    head_case(130, 32, 1000, 48, 0, 203); /* 48, 48, 34 */
    head_case(7, 16, 1000, 4, 0, 204);
    head_case(7, 16, 50, 3, 1, 205);      /* every target ignored: count 0 */
}

int main(void)
{
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("test_cu_attention: SKIPPED: no usable CUDA device\n");
        return FY_TEST_SKIP;
    }
    void *ws = NULL;
    if (cudaMalloc(&ws, WORKSPACE_BYTES) != cudaSuccess || cudaStreamCreate(&g_stream) != cudaSuccess ||
        fy_cu_lt_new(&g_lt, ws, WORKSPACE_BYTES) != 0) {
        printf("test_cu_attention: FAILED: cannot set up the workspace, stream or cuBLASLt handle\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_head),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fy_cu_lt_destroy(&g_lt);
    cudaStreamDestroy(g_stream);
    cudaFree(ws);
    return rc;
}
