/* GPU test of the kernels the Llama-like families add to the CUDA backend, against simple fp32/fp64
 * host references on the same bf16-rounded inputs:
 *  - cu_qknorm: Qwen3's per-head RMSNorm of q and k in place on fused q/k/v rows, forward (the
 *    normalised heads, rstd, the raw copy) and backward (the raw heads' gradient in place, the two
 *    weights' gradients added onto what was there), head sizes 64, 128 and 48, GQA 4:1; the value
 *    part of the rows left as it was; reruns bit-identical;
 *  - the q/k/v biases: the fused [Q + 2 KV] product with its bias epilogue, and the bias gradient
 *    (summed in a fixed order, added onto what was there);
 *  - cu_flash's sliding window: forward out and backward dq, dk, dv against the materialised banded
 *    softmax attention, for windows of 1, 16, 50 (T = 200: whole key and query blocks skipped), 64
 *    (one tile) and GQA; a window >= T gives the bytes of the plain causal kernels; reruns
 *    bit-identical;
 *  - cu_flash's documents (positions): each query seeing only its own document's keys, with
 *    documents starting mid-tile, single-token ones, ones across several tiles, on tile
 *    boundaries, one spanning the row, and with a window shorter than some of them; head sizes
 *    48, 64, 80 and 128, GQA up to 4:1; against the same reference, masked per document.
 * Tolerances (elementwise |gpu - ref| <= rtol |ref| + atol rms(ref), and ||gpu - ref|| / ||ref||
 * <= frob), as test_cu_llama.cu states them: a bf16 output computed in fp32 from bf16 inputs
 * (the norm's output, its input gradient) rtol 2^-7, atol 1e-3, frob 5e-3; fp32 statistics and
 * weight gradients of the same terms in another order (rstd, the norm weights' and the biases'
 * gradients) rtol 1e-4, atol 1e-4, frob 1e-4; a product with bf16 output (the biased q/k/v)
 * rtol 2^-6, atol 2e-2, frob 1e-2; attention out rtol 2^-6, atol 2e-2, frob 1e-2, dq dk dv frob
 * 2e-2. Outputs are poisoned (0xff: NaN) before each GPU call, so an element left unwritten fails.
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

#include "common/base/dtype.h"
#include "gpu_worker/cuda/cu_flash.h"
#include "gpu_worker/cuda/cu_matmul.h"
#include "gpu_worker/cuda/cu_qknorm.h"
#include "tests/testutil.h"

using std::vector;

#define LT_WORKSPACE (32u << 20)

static cudaStream_t g_s;
static struct fy_cu_lt *g_lt;
static void *g_ws;
static vector<void *> g_allocs; /* freed at the end of each case */
static int g_bad;                /* failed checks in the current test */

static void ck_at(cudaError_t e, const char *call, int line)
{
    if (e != cudaSuccess)
        fail_msg("test_cu_families.cu:%d: %s: %s (%s)", line, call, cudaGetErrorString(e),
                 cudaGetErrorName(e));
}

static void run_at(int rc, const char *call, int line)
{
    if (rc != 0)
        fail_msg("test_cu_families.cu:%d: %s returned %d", line, call, rc);
    ck_at(cudaStreamSynchronize(g_s), "waiting for it", line);
    ck_at(cudaGetLastError(), "after it", line);
}

#define CK(call) ck_at((call), #call, __LINE__)
#define RUN(call) run_at((call), #call, __LINE__)

/* ---- device buffers ---- */

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

template <typename E> static void dput(E *d, const vector<E> &h)
{
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(E), cudaMemcpyHostToDevice));
}

template <typename E> static void dpoison(E *d, size_t n) { CK(cudaMemset(d, 0xff, n * sizeof(E))); }

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

/* Columns [col, col + w) of every row of [rows][S] into [rows][w]. */
static vector<float> columns(const vector<float> &a, size_t rows, int S, int col, int w)
{
    vector<float> o(rows * w);
    for (size_t r = 0; r < rows; r++)
        memcpy(&o[r * w], &a[r * S + col], (size_t)w * sizeof(float));
    return o;
}

/* ---- checking ---- */

struct tol {
    double rtol, atol, frob; /* atol is relative to rms(ref); rtol < 0: no elementwise check */
};
static const struct tol BF16_OUT = {1.0 / 128, 1e-3, 5e-3};
static const struct tol F32_SUM = {1e-4, 1e-4, 1e-4};
static const struct tol PRODUCT = {1.0 / 64, 2e-2, 1e-2};
static const struct tol ATT_OUT = {1.0 / 64, 2e-2, 1e-2};
static const struct tol GRAD = {-1, 0, 2e-2};

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
    print_message("%-4s %-22s %-34s n=%-8zu max_abs_err %.3e at [%zu] (gpu %.7g ref %.7g) "
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
    print_message("%-4s %-22s %-34s identical bytes (%zu)\n", same ? "ok" : "FAIL", what, shape,
                  bytes);
    if (!same)
        g_bad++;
}

/* ---- q/k norms ---- */

/* The host reference of one direction over every (row, head) of the q and k parts. */
struct qkn_ref {
    vector<float> y, rstd, dx, dqw, dkw;
};

static qkn_ref qknorm_reference(const vector<float> &qkv, const vector<float> &dy,
                                const vector<float> &qw, const vector<float> &kw,
                                const vector<float> &dqw0, const vector<float> &dkw0, int N, int S,
                                int NH, int NKV, int hd, float eps)
{
    const int heads = NH + NKV;
    qkn_ref r;
    r.y.assign(qkv.begin(), qkv.end());
    r.dx.assign(dy.begin(), dy.end());
    r.rstd.resize((size_t)N * heads);
    vector<double> dq(hd, 0.0), dk(hd, 0.0);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < heads; j++) {
            const float *x = &qkv[(size_t)n * S + (size_t)j * hd];
            const float *g = &dy[(size_t)n * S + (size_t)j * hd];
            const float *w = j < NH ? qw.data() : kw.data();
            double ss = 0;
            for (int i = 0; i < hd; i++)
                ss += (double)x[i] * x[i];
            double rs = 1.0 / sqrt(ss / hd + eps), gx = 0;
            r.rstd[(size_t)n * heads + j] = (float)rs;
            for (int i = 0; i < hd; i++) {
                r.y[(size_t)n * S + (size_t)j * hd + i] = (float)(w[i] * x[i] * rs);
                gx += (double)g[i] * w[i] * x[i] * rs;
                (j < NH ? dq : dk)[i] += (double)g[i] * x[i] * rs;
            }
            gx /= hd;
            for (int i = 0; i < hd; i++)
                r.dx[(size_t)n * S + (size_t)j * hd + i] =
                    (float)(rs * ((double)g[i] * w[i] - x[i] * rs * gx));
        }
    r.dqw.resize(hd);
    r.dkw.resize(hd);
    for (int i = 0; i < hd; i++) {
        r.dqw[i] = (float)(dqw0[i] + dq[i]);
        r.dkw[i] = (float)(dkw0[i] + dk[i]);
    }
    return r;
}

static void qknorm_case(int N, int NH, int NKV, int hd, uint64_t seed)
{
    const int S = (NH + 2 * NKV) * hd, heads = NH + NKV, QK = heads * hd;
    const size_t n = (size_t)N * S;
    const float eps = 1e-6f;
    char shape[96];
    snprintf(shape, sizeof shape, "N=%d NH=%d NKV=%d hd=%d", N, NH, NKV, hd);
    uint64_t rng = seed;
    bvals qkv = rnd(n, -3, 3, &rng), dy = rnd(n, -1, 1, &rng);
    bvals qw = rnd(hd, 0.5f, 1.5f, &rng), kw = rnd(hd, 0.5f, 1.5f, &rng);
    vector<float> dqw0(hd), dkw0(hd);
    for (int i = 0; i < hd; i++) { /* the gradients add onto what is there */
        dqw0[i] = fy_test_uniform(&rng, -1, 1);
        dkw0[i] = fy_test_uniform(&rng, -1, 1);
    }
    qkn_ref ref = qknorm_reference(qkv.f, dy.f, qw.f, kw.f, dqw0, dkw0, N, S, NH, NKV, hd, eps);
    bf16 *d_qkv = (bf16 *)dalloc<uint16_t>(n), *d_dy = (bf16 *)dalloc<uint16_t>(n);
    bf16 *d_raw = (bf16 *)dalloc<uint16_t>((size_t)N * QK);
    float *d_rstd = dalloc<float>((size_t)N * heads);
    bf16 *d_qw = (bf16 *)dcopy(qw.b), *d_kw = (bf16 *)dcopy(kw.b);
    float *d_dqw = dalloc<float>(hd), *d_dkw = dalloc<float>(hd);
    size_t ns = fy_cu_qknorm_scratch_floats(N, hd);
    assert_true(ns > 0);
    float *d_scratch = dalloc<float>(ns);
    vector<uint16_t> first_y, first_dx;
    vector<float> first_dqw;
    for (int run = 0; run < 2; run++) {
        dput((uint16_t *)d_qkv, qkv.b);
        dput((uint16_t *)d_dy, dy.b);
        dput(d_dqw, dqw0);
        dput(d_dkw, dkw0);
        dpoison(d_raw, (size_t)N * QK);
        dpoison(d_rstd, (size_t)N * heads);
        dpoison(d_scratch, ns);
        RUN(fy_cu_qknorm_forward(d_qkv, d_raw, d_rstd, d_qw, d_kw, N, S, NH, NKV, hd, eps, g_s));
        RUN(fy_cu_qknorm_backward(d_dy, d_dqw, d_dkw, d_scratch, d_raw, d_rstd, d_qw, d_kw, N, S,
                                  NH, NKV, hd, g_s));
        vector<uint16_t> y = hcopy((const uint16_t *)d_qkv, n);
        vector<uint16_t> dx = hcopy((const uint16_t *)d_dy, n);
        vector<float> dqw = hcopy(d_dqw, hd), dkw = hcopy(d_dkw, hd);
        if (run == 1) {
            check_same_bytes("qknorm y rerun", shape, y.data(), first_y.data(), n * 2);
            check_same_bytes("qknorm dx rerun", shape, dx.data(), first_dx.data(), n * 2);
            check_same_bytes("qknorm dqw rerun", shape, dqw.data(), first_dqw.data(), hd * 4);
            break;
        }
        first_y = y;
        first_dx = dx;
        first_dqw = dqw;
        vector<float> yf = widen(y), dxf = widen(dx);
        check("qknorm y (q, k)", shape, columns(yf, N, S, 0, QK).data(),
              columns(ref.y, N, S, 0, QK).data(), (size_t)N * QK, BF16_OUT);
        /* the values' columns are not touched in either direction */
        int same_v = 1;
        for (int r = 0; r < N; r++)
            same_v &= memcmp(&y[(size_t)r * S + QK], &qkv.b[(size_t)r * S + QK],
                             (size_t)(S - QK) * 2) == 0 &&
                      memcmp(&dx[(size_t)r * S + QK], &dy.b[(size_t)r * S + QK],
                             (size_t)(S - QK) * 2) == 0;
        print_message("%-4s %-22s %-34s v columns untouched\n", same_v ? "ok" : "FAIL",
                      "qknorm v", shape);
        g_bad += !same_v;
        vector<uint16_t> raw = hcopy((const uint16_t *)d_raw, (size_t)N * QK);
        int same_raw = 1;
        for (int r = 0; r < N; r++)
            same_raw &= memcmp(&raw[(size_t)r * QK], &qkv.b[(size_t)r * S], (size_t)QK * 2) == 0;
        print_message("%-4s %-22s %-34s raw copy exact\n", same_raw ? "ok" : "FAIL",
                      "qknorm raw", shape);
        g_bad += !same_raw;
        check("qknorm rstd", shape, hcopy(d_rstd, (size_t)N * heads).data(), ref.rstd.data(),
              (size_t)N * heads, F32_SUM);
        check("qknorm dx (q, k)", shape, columns(dxf, N, S, 0, QK).data(),
              columns(ref.dx, N, S, 0, QK).data(), (size_t)N * QK, BF16_OUT);
        check("qknorm dq_norm", shape, dqw.data(), ref.dqw.data(), hd, F32_SUM);
        check("qknorm dk_norm", shape, dkw.data(), ref.dkw.data(), hd, F32_SUM);
    }
    free_all();
}

static void test_qknorm(void **state)
{
    (void)state;
    g_bad = 0;
    qknorm_case(74, 8, 2, 64, 11);  /* Qwen3-like: GQA 4:1 */
    qknorm_case(111, 4, 4, 128, 12); /* 111 rows: the last chunk partial */
    qknorm_case(5, 2, 1, 48, 13);    /* hd not a multiple of 32 */
    print_message("(an error line about a bad q/k norm shape is expected next)\n");
    assert_int_equal(fy_cu_qknorm_forward(NULL, NULL, NULL, NULL, NULL, 4, 64, 4, 2, 64, 1e-6f,
                                          g_s),
                     -EINVAL);
    assert_int_equal(g_bad, 0);
}

/* ---- q/k/v biases ---- */

static void bias_case(int N, int C, int NH, int NKV, int hd, uint64_t seed)
{
    const int S = (NH + 2 * NKV) * hd;
    char shape[96];
    snprintf(shape, sizeof shape, "N=%d C=%d S=%d", N, C, S);
    uint64_t rng = seed;
    bvals inp = rnd((size_t)N * C, -1, 1, &rng), w = rnd((size_t)S * C, -0.1f, 0.1f, &rng);
    bvals bias = rnd(S, -1, 1, &rng), dout = rnd((size_t)N * S, -1, 1, &rng);
    vector<float> out((size_t)N * S), dbias0(S), dbias(S);
    for (int o = 0; o < S; o++) {
        dbias0[o] = fy_test_uniform(&rng, -1, 1);
        double acc = dbias0[o];
        for (int r = 0; r < N; r++)
            acc += dout.f[(size_t)r * S + o];
        dbias[o] = (float)acc;
    }
    for (int r = 0; r < N; r++)
        for (int o = 0; o < S; o++) {
            double acc = bias.f[o];
            for (int i = 0; i < C; i++)
                acc += (double)inp.f[(size_t)r * C + i] * w.f[(size_t)o * C + i];
            out[(size_t)r * S + o] = (float)acc;
        }
    bf16 *d_inp = (bf16 *)dcopy(inp.b), *d_w = (bf16 *)dcopy(w.b), *d_b = (bf16 *)dcopy(bias.b);
    bf16 *d_out = (bf16 *)dalloc<uint16_t>((size_t)N * S), *d_dout = (bf16 *)dcopy(dout.b);
    bf16 *d_dinp = (bf16 *)dalloc<uint16_t>((size_t)N * C);
    float *d_dw = dalloc<float>((size_t)S * C), *d_dbias = dcopy(dbias0);
    CK(cudaMemset(d_dw, 0, (size_t)S * C * sizeof(float)));
    RUN(fy_cu_matmul_forward(g_lt, d_out, d_inp, d_w, d_b, N, C, S, g_s));
    check("qkv with bias", shape, widen(hcopy((const uint16_t *)d_out, (size_t)N * S)).data(),
          out.data(), (size_t)N * S, PRODUCT);
    RUN(fy_cu_matmul_backward(g_lt, d_dinp, d_dw, d_dbias, d_dout, d_inp, d_w, N, C, S, g_s));
    check("qkv dbias", shape, hcopy(d_dbias, S).data(), dbias.data(), S, F32_SUM);
    free_all();
}

static void test_qkv_bias(void **state)
{
    (void)state;
    g_bad = 0;
    bias_case(74, 256, 4, 2, 64, 21);  /* Qwen2-like: [Q + 2 KV] = 512 */
    bias_case(37, 128, 7, 1, 16, 22);  /* S = 144, 37 rows */
    assert_int_equal(g_bad, 0);
}

/* ---- the sliding window, and documents ---- */

/* Materialised banded softmax attention in double: out [B][T][NH hd], dqkv [B][T][S]. pos (empty:
 * none): the documents of gpu_worker/backend.h, query t seeing keys from t - pos[b][t] on. */
static void window_reference(vector<float> &out, vector<float> &dqkv, const vector<float> &qkv,
                             const vector<float> &dout, int B, int T, int NH, int NKV, int hd,
                             int W, const vector<int32_t> &pos)
{
    const int S = (NH + 2 * NKV) * hd, QC = NH * hd, rep = NH / NKV;
    const double scale = 1.0 / sqrt((double)hd);
    out.assign((size_t)B * T * QC, 0.0f);
    dqkv.assign((size_t)B * T * S, 0.0f);
    vector<double> acc((size_t)B * T * S, 0.0), oacc((size_t)B * T * QC, 0.0), p(T), dp(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const int kq = h * hd, kk = (NH + h / rep) * hd, kv = (NH + NKV + h / rep) * hd;
            for (int t = 0; t < T; t++) {
                const float *q = &qkv[((size_t)b * T + t) * S + kq];
                int j0 = W > 0 && t - W + 1 > 0 ? t - W + 1 : 0;
                if (!pos.empty() && t - pos[(size_t)b * T + t] > j0)
                    j0 = t - pos[(size_t)b * T + t];
                double mx = -INFINITY, sum = 0, dot = 0;
                for (int j = j0; j <= t; j++) {
                    const float *k = &qkv[((size_t)b * T + j) * S + kk];
                    double s = 0;
                    for (int d = 0; d < hd; d++)
                        s += (double)q[d] * k[d];
                    p[j] = s * scale;
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int j = j0; j <= t; j++)
                    sum += (p[j] = exp(p[j] - mx));
                const float *go = &dout[((size_t)b * T + t) * QC + kq];
                for (int j = j0; j <= t; j++) {
                    p[j] /= sum;
                    const float *v = &qkv[((size_t)b * T + j) * S + kv];
                    double s = 0;
                    for (int d = 0; d < hd; d++) {
                        oacc[((size_t)b * T + t) * QC + kq + d] += p[j] * v[d];
                        s += (double)go[d] * v[d];
                        acc[((size_t)b * T + j) * S + kv + d] += p[j] * go[d];
                    }
                    dp[j] = s;
                    dot += p[j] * s;
                }
                for (int j = j0; j <= t; j++) {
                    const double ds = p[j] * (dp[j] - dot) * scale;
                    const float *k = &qkv[((size_t)b * T + j) * S + kk];
                    for (int d = 0; d < hd; d++) {
                        acc[((size_t)b * T + t) * S + kq + d] += ds * k[d];
                        acc[((size_t)b * T + j) * S + kk + d] += ds * q[d];
                    }
                }
            }
        }
    for (size_t i = 0; i < acc.size(); i++)
        dqkv[i] = (float)acc[i];
    for (size_t i = 0; i < oacc.size(); i++)
        out[i] = (float)oacc[i];
}

/* Positions of documents packed in rows of T, the lengths of each row from `lens` in turn (row b
 * starting at lens[b % n]), the last cut at the row's end. */
static vector<int32_t> doc_positions(int B, int T, const vector<int> &lens)
{
    vector<int32_t> pos((size_t)B * T);
    size_t k = 0;
    for (int b = 0; b < B; b++) {
        k = (size_t)b % lens.size();
        for (int t = 0, p = 0, len = lens[k]; t < T; t++, p++) {
            if (p == len) {
                p = 0;
                len = lens[++k % lens.size()];
            }
            pos[(size_t)b * T + t] = p;
        }
    }
    return pos;
}

/* pos (empty: none): documents too (key blocks wholly before a tile's documents skipped). */
static void window_case(int B, int T, int NH, int NKV, int hd, int W, uint64_t seed,
                        const vector<int32_t> &pos = vector<int32_t>())
{
    const int S = (NH + 2 * NKV) * hd, QC = NH * hd;
    const size_t rows = (size_t)B * T, nqkv = rows * S, nout = rows * QC;
    char shape[96];
    snprintf(shape, sizeof shape, "B=%d T=%d NH=%d NKV=%d hd=%d W=%d%s", B, T, NH, NKV, hd, W,
             pos.empty() ? "" : " documents");
    uint64_t rng = seed;
    bvals qkv = rnd(nqkv, -2, 2, &rng), dout = rnd(nout, -1, 1, &rng);
    vector<float> out, dqkv;
    window_reference(out, dqkv, qkv.f, dout.f, B, T, NH, NKV, hd, W, pos);
    const int32_t *d_pos = pos.empty() ? NULL : dcopy(pos);
    size_t sbytes = fy_cu_flash_scratch_bytes(B, T, QC, NH);
    assert_true(sbytes > 0);
    bf16 *d_qkv = (bf16 *)dcopy(qkv.b), *d_dout = (bf16 *)dcopy(dout.b);
    bf16 *d_out = (bf16 *)dalloc<uint16_t>(nout), *d_dqkv = (bf16 *)dalloc<uint16_t>(nqkv);
    char *scratch = dalloc<char>(sbytes);
    vector<uint16_t> first_out, first_dqkv;
    for (int run = 0; run < 2; run++) { /* the second run on fresh poison: the same bytes */
        dpoison(d_out, nout);
        dpoison(d_dqkv, nqkv);
        dpoison(scratch, sbytes);
        RUN(fy_cu_flash_window_forward(d_out, d_qkv, scratch, B, T, NH, NKV, hd, W, d_pos, g_s));
        RUN(fy_cu_flash_window_backward(d_dqkv, d_dout, d_out, d_qkv, scratch, B, T, NH, NKV, hd, W,
                                        d_pos, g_s));
        vector<uint16_t> go = hcopy((const uint16_t *)d_out, nout);
        vector<uint16_t> gd = hcopy((const uint16_t *)d_dqkv, nqkv);
        if (run == 1) {
            check_same_bytes("window out rerun", shape, go.data(), first_out.data(), nout * 2);
            check_same_bytes("window dqkv rerun", shape, gd.data(), first_dqkv.data(), nqkv * 2);
            break;
        }
        first_out = go;
        first_dqkv = gd;
        check("window out", shape, widen(go).data(), out.data(), nout, ATT_OUT);
        vector<float> g = widen(gd);
        const char *names[3] = {"window dq", "window dk", "window dv"};
        int col[3] = {0, QC, QC + NKV * hd}, w[3] = {QC, NKV * hd, NKV * hd};
        for (int p = 0; p < 3; p++)
            check(names[p], shape, columns(g, rows, S, col[p], w[p]).data(),
                  columns(dqkv, rows, S, col[p], w[p]).data(), rows * w[p], GRAD);
    }
    if (W >= T && pos.empty()) { /* the plain causal kernels' bytes */
        dpoison(d_out, nout);
        dpoison(d_dqkv, nqkv);
        RUN(fy_cu_flash_gqa_forward(d_out, d_qkv, scratch, B, T, NH, NKV, hd, g_s));
        RUN(fy_cu_flash_gqa_backward(d_dqkv, d_dout, d_out, d_qkv, scratch, B, T, NH, NKV, hd,
                                     g_s));
        check_same_bytes("W >= T: causal out", shape, hcopy((const uint16_t *)d_out, nout).data(),
                         first_out.data(), nout * 2);
        check_same_bytes("W >= T: causal dqkv", shape,
                         hcopy((const uint16_t *)d_dqkv, nqkv).data(), first_dqkv.data(),
                         nqkv * 2);
    }
    free_all();
}

static void test_window_attention(void **state)
{
    (void)state;
    g_bad = 0;
    window_case(2, 37, 4, 2, 64, 16, 31);  /* Mistral-like, one tile */
    window_case(1, 200, 4, 1, 128, 50, 32); /* whole key and query blocks outside the band */
    window_case(2, 130, 8, 2, 32, 64, 33);  /* a window of exactly one tile */
    window_case(1, 70, 2, 2, 48, 1, 34);    /* each position sees only itself */
    window_case(2, 150, 4, 2, 64, 100, 35); /* rows whose first key block is wholly masked */
    window_case(2, 37, 4, 2, 64, 37, 36);   /* W = T: plain causal */
    window_case(1, 100, 4, 4, 80, 4096, 37);
    assert_int_equal(g_bad, 0);
}

/* Documents packed in rows (gpu_worker/backend.h's positions): each query sees only the keys of
 * its own document, the flash kernels skipping the key blocks a tile's documents do not reach. */
static void test_document_attention(void **state)
{
    (void)state;
    g_bad = 0;
    /* documents starting mid-tile, single-token ones (padding), one across several tiles */
    vector<int32_t> mixed = doc_positions(2, 300, {1, 5, 60, 1, 90, 40, 1, 1, 1, 100});
    window_case(2, 300, 4, 2, 64, 0, 41, mixed);
    window_case(2, 300, 8, 2, 128, 0, 42, mixed);
    window_case(2, 300, 4, 4, 48, 0, 43, mixed);
    /* documents on tile boundaries, and a whole row of single tokens */
    window_case(2, 256, 4, 1, 80, 0, 44, doc_positions(2, 256, {64, 64, 128}));
    window_case(1, 130, 2, 2, 64, 0, 45, doc_positions(1, 130, {1}));
    /* one document the whole row: plain causal through the documents' kernels */
    window_case(1, 200, 4, 2, 64, 0, 46, doc_positions(1, 200, {200}));
    /* a window shorter than some documents (Mistral's and Phi-3's), rows whose first tile of
     * keys the window or the documents empty */
    window_case(2, 300, 4, 2, 64, 50, 47, mixed);
    window_case(2, 300, 4, 1, 128, 65, 48, doc_positions(2, 300, {64, 64, 128, 44}));
    assert_int_equal(g_bad, 0);
}

int main(void)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        printf("test_cu_families: SKIPPED: no usable CUDA device (cudaGetDeviceCount: %s, %d "
               "devices)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "ok", count);
        return FY_TEST_SKIP;
    }
    if (cudaStreamCreate(&g_s) != cudaSuccess || cudaMalloc(&g_ws, LT_WORKSPACE) != cudaSuccess ||
        fy_cu_lt_new(&g_lt, g_ws, LT_WORKSPACE) != 0) {
        printf("test_cu_families: cannot set up the stream and cuBLASLt\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qknorm),
        cmocka_unit_test(test_qkv_bias),
        cmocka_unit_test(test_window_attention),
        cmocka_unit_test(test_document_attention),
    };
    int failed = cmocka_run_group_tests_name("cu families' kernels", tests, NULL, NULL);
    fy_cu_lt_destroy(&g_lt);
    cudaFree(g_ws);
    cudaStreamDestroy(g_s);
    return failed;
}
