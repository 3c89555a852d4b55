/* GPU test of the CUDA backend's kernels outside the matrix products and attention, against the
 * fp32 CPU reference gpu_worker/cpu/gpt2_cpu.c: LayerNorm forward/backward (cu_layernorm), GELU
 * forward/backward (cu_gelu), residual add (cu_residual), embedding forward/backward (cu_embed),
 * f32 <-> bf16 conversion (cu_convert), and argument checking.
 *
 * Method: random inputs are rounded to bf16 on the host, so the CPU reference (fp32, on the rounded
 * values) and the GPU see identical inputs. Outputs the op overwrites are poisoned (0xff bytes: NaN
 * in f32 and bf16) before every GPU call, so an element that is not written fails; accumulators
 * (+=) are pre-filled with known random values and the expectation is prefill + CPU result. Every
 * device buffer has a poisoned guard zone after it that must survive (no out-of-bounds writes).
 * LayerNorm backward and embedding backward run twice and must give bit-identical results.
 *
 * Tolerances (and why):
 *  - bf16 outputs: |gpu - ref| <= 2^-7 |ref| + atol, atol = max(1e-3 * rms(ref), 1e-4), rms over
 *    the row (LayerNorm) or over the whole tensor (elementwise ops); and
 *    ||gpu - ref|| / ||ref|| <= 5e-3 (enforced for tensors of >= 1000 elements).
 *    The GPU computes in fp32 like the CPU and rounds once to bf16 (RNE): that rounding is at most
 *    half an ulp = 2^-8 |value|; 2^-7 allows twice that. The only other difference is fp32
 *    rounding order (warp-tree vs sequential sums, FMA contraction, CUDA tanhf within 2 ulp), which
 *    is ~1e-6 of the row's magnitude; atol = 1e-3 * rms covers it with a wide margin where |ref| is
 *    near 0 (cancellation). The floor 1e-4 (inputs are O(1), so 1e-4 of the typical magnitude)
 *    covers tiny cases such as GELU on n = 1 in its tail, where 1 + tanh cancels and an ulp of
 *    tanhf moves gelu' by up to ~2e-6 absolute. The Frobenius bound: bf16 rounding alone is
 *    <= 2^-8 = 3.9e-3 relative.
 *  - fp32 gradients of LayerNorm (dw, db): ||gpu - ref|| / ||ref - prefill|| < 1e-3 and, per
 *    element, |gpu - ref| <= 1e-4 * (sum over rows of |term| + |prefill|). Both sides sum the same
 *    fp32 terms in different orders; the error of such a sum is bounded by ~N * 2^-24 * sum|term|
 *    (6e-5 for N = 1000) and is ~sqrt(N) * 2^-24 (about 2e-6) in practice, so these bounds (tighter
 *    than 1e-2) still leave a margin of ~100x while catching a lost or doubled row.
 *  - LayerNorm mean: |err| <= 1e-4 * max|x| of the row; rstd: relative 1e-4 (sums of <= 4097 terms;
 *    a different mean only moves the two-pass variance to second order).
 *  - Exact (bit-identical) where the arithmetic is identical by construction: residual add and
 *    embedding forward (one fp32 add, then RNE, on both sides), embedding backward (the same fp32
 *    additions in the same order as the CPU), and the conversions (bf16 -> f32 is exact; f32 ->
 *    bf16 is RNE on both sides; a NaN must stay a NaN, its payload may differ).
 *
 * Each case prints: op, shape, max abs error (where, gpu and ref values), relative Frobenius error,
 * and on failure the first offending elements. Exits 77 (skipped) without a usable CUDA device. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
extern "C" {
#include <cmocka.h>
}

#include <cuda_runtime.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "common/base/dtype.h"
#include "gpu_worker/cpu/gpt2_cpu.h"
#include "gpu_worker/cuda/cu_convert.h"
#include "gpu_worker/cuda/cu_embed.h"
#include "gpu_worker/cuda/cu_gelu.h"
#include "gpu_worker/cuda/cu_layernorm.h"
#include "gpu_worker/cuda/cu_residual.h"
#include "tests/testutil.h"

using std::vector;

/* ---- CUDA plumbing ---- */

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t ck_err_ = (call);                                                              \
        if (ck_err_ != cudaSuccess)                                                                \
            fail_msg("%s:%d: %s: CUDA error %s (%s)", __FILE__, __LINE__, #call,                   \
                     cudaGetErrorString(ck_err_), cudaGetErrorName(ck_err_));                      \
    } while (0)

static cudaStream_t g_stream;

/* Runs an op (must return 0), waits for it, and surfaces any asynchronous kernel error. */
#define OP(call)                                                                                   \
    do {                                                                                           \
        int op_rc_ = (call);                                                                       \
        if (op_rc_ != 0)                                                                           \
            fail_msg("%s:%d: %s returned %d", __FILE__, __LINE__, #call, op_rc_);                  \
        CK(cudaStreamSynchronize(g_stream));                                                       \
        CK(cudaGetLastError());                                                                    \
    } while (0)

#define GUARD_BYTES 512

/* A device buffer with a guard zone after it; freed by free_all() at the end of each test. */
struct dbuf {
    char *p;
    size_t bytes;
};
static vector<void *> g_allocs;

static dbuf dnew(size_t bytes)
{
    dbuf b = {NULL, bytes};
    CK(cudaMalloc((void **)&b.p, bytes + GUARD_BYTES));
    g_allocs.push_back(b.p);
    CK(cudaMemsetAsync(b.p, 0xff, bytes + GUARD_BYTES, g_stream));
    CK(cudaStreamSynchronize(g_stream));
    return b;
}

static void free_all(void)
{
    vector<void *> a;
    a.swap(g_allocs); /* cleared first: a failing cudaFree does not free twice later */
    for (size_t i = 0; i < a.size(); i++)
        CK(cudaFree(a[i]));
}

/* The whole buffer and its guard to 0xff (NaN in f32 and bf16). */
static void poison(const dbuf &b)
{
    CK(cudaMemsetAsync(b.p, 0xff, b.bytes + GUARD_BYTES, g_stream));
    CK(cudaStreamSynchronize(g_stream));
}

static void up(const dbuf &b, const void *host, size_t bytes)
{
    if (bytes > b.bytes)
        fail_msg("test bug: upload of %zu bytes into a %zu-byte buffer", bytes, b.bytes);
    CK(cudaMemcpyAsync(b.p, host, bytes, cudaMemcpyHostToDevice, g_stream));
    CK(cudaStreamSynchronize(g_stream));
}

static void down(void *host, const dbuf &b, size_t bytes)
{
    CK(cudaMemcpyAsync(host, b.p, bytes, cudaMemcpyDeviceToHost, g_stream));
    CK(cudaStreamSynchronize(g_stream));
}

static bf16 *B16(const dbuf &b) { return (bf16 *)b.p; }
static float *F32(const dbuf &b) { return (float *)b.p; }

/* ---- checking ---- */

static int g_failures; /* failed checks in the current test; asserted 0 at its end */

static void fail_check(void) { g_failures++; }

/* Guard zone after buffer `b` still all 0xff. */
static void check_guard(const char *op, const char *shape, const char *name, const dbuf &b)
{
    unsigned char g[GUARD_BYTES];
    CK(cudaMemcpyAsync(g, b.p + b.bytes, GUARD_BYTES, cudaMemcpyDeviceToHost, g_stream));
    CK(cudaStreamSynchronize(g_stream));
    for (size_t i = 0; i < GUARD_BYTES; i++)
        if (g[i] != 0xff) {
            print_message("FAIL %s %s: %s: written past its end: byte %zu after the last element is "
                          "0x%02x (poison 0xff)\n",
                          op, shape, name, i, g[i]);
            fail_check();
            return;
        }
}

static double bf(uint16_t h) { return (double)fy_bf16_to_f32(h); }

/* bf16 results: |gpu - ref| <= 2^-7 |ref| + max(1e-3 * rms(ref over each `row` elements), 1e-4),
 * and relative Frobenius error <= 5e-3 (see the top comment). */
static void check_bf16(const char *op, const char *shape, const uint16_t *gpu, const double *ref,
                       size_t n, size_t row)
{
    const double rtol = 1.0 / 128, atol_frac = 1e-3, atol_floor = 1e-4, frob_limit = 5e-3;
    double max_err = 0, se = 0, sr = 0;
    size_t at = 0, bad = 0;
    for (size_t r0 = 0; r0 < n; r0 += row) {
        size_t r1 = r0 + row < n ? r0 + row : n;
        double rr = 0;
        for (size_t i = r0; i < r1; i++)
            rr += ref[i] * ref[i];
        double atol = fmax(atol_frac * sqrt(rr / (double)(r1 - r0)), atol_floor);
        for (size_t i = r0; i < r1; i++) {
            double g = bf(gpu[i]), e = fabs(g - ref[i]);
            if (e != e)
                e = INFINITY;
            double tol = rtol * fabs(ref[i]) + atol;
            if (e > max_err) {
                max_err = e;
                at = i;
            }
            se += e * e;
            sr += ref[i] * ref[i];
            if (!(e <= tol)) {
                if (bad < 8)
                    print_message("  bad %s %s [%zu] (row %zu, col %zu): gpu %.9g ref %.9g |err| "
                                  "%.3e > tol %.3e\n",
                                  op, shape, i, i / row, i % row, g, ref[i], e, tol);
                bad++;
            }
        }
    }
    double frob = sr > 0 ? sqrt(se / sr) : sqrt(se);
    /* The Frobenius bound is a statistic: enforced from 1000 elements on, so that one tiny element
     * (where only atol applies) cannot dominate it. */
    bool frob_bad = n >= 1000 && !(frob <= frob_limit);
    print_message("%-4s %-20s %-26s max_abs_err %.3e at [%zu] (gpu %.9g ref %.9g) rel_frob %.3e "
                  "[bf16: |err|<=2^-7|ref|+max(1e-3*rms,1e-4), frob<=%.0e%s]%s\n",
                  bad || frob_bad ? "FAIL" : "ok", op, shape, max_err, at, bf(gpu[at]), ref[at],
                  frob, frob_limit, n >= 1000 ? "" : " not enforced, n<1000",
                  bad ? " (elements out of tolerance, see above)" : "");
    if (bad || frob_bad)
        fail_check();
}

/* f32 results with a per-element bound tol[i]; Frobenius error relative to ||contrib|| (the part
 * the op added, or the whole reference when contrib is NULL). */
static void check_f32(const char *op, const char *shape, const float *gpu, const double *ref,
                      const double *contrib, const double *tol, size_t n, double frob_limit)
{
    double max_err = 0, se = 0, sr = 0;
    size_t at = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)gpu[i] - ref[i]);
        if (e != e)
            e = INFINITY;
        if (e > max_err) {
            max_err = e;
            at = i;
        }
        double c = contrib ? contrib[i] : ref[i];
        se += e * e;
        sr += c * c;
        if (!(e <= tol[i])) {
            if (bad < 8)
                print_message("  bad %s %s [%zu]: gpu %.9g ref %.9g |err| %.3e > tol %.3e\n", op,
                              shape, i, (double)gpu[i], ref[i], e, tol[i]);
            bad++;
        }
    }
    double frob = sr > 0 ? sqrt(se / sr) : sqrt(se);
    print_message("%-4s %-20s %-26s max_abs_err %.3e at [%zu] (gpu %.9g ref %.9g tol %.3e) "
                  "rel_frob %.3e [frob<%.0e]%s\n",
                  bad || !(frob < frob_limit) ? "FAIL" : "ok", op, shape, max_err, at,
                  (double)gpu[at], ref[at], tol[at], frob, frob_limit,
                  bad ? " (elements out of tolerance, see above)" : "");
    if (bad || !(frob < frob_limit))
        fail_check();
}

/* Bit-identical arrays of `esize`-byte elements (2 or 4). */
static void check_bits(const char *op, const char *shape, const char *what, const void *gpu,
                       const void *ref, size_t n, size_t esize)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t g = 0, r = 0;
        memcpy(&g, (const char *)gpu + i * esize, esize);
        memcpy(&r, (const char *)ref + i * esize, esize);
        if (g != r) {
            if (bad < 8)
                print_message("  bad %s %s %s [%zu]: gpu bits 0x%0*x, expected 0x%0*x\n", op, shape,
                              what, i, (int)esize * 2, g, (int)esize * 2, r);
            bad++;
        }
    }
    print_message("%-4s %-20s %-26s %s: %zu of %zu elements differ\n", bad ? "FAIL" : "ok", op,
                  shape, what, bad, n);
    if (bad)
        fail_check();
}

/* Random values in [lo, hi) rounded to bf16: the bits, and the same values as floats. */
static void rand_bf16(vector<uint16_t> &h, vector<float> &f, size_t n, float lo, float hi,
                      uint64_t *rng)
{
    h.resize(n);
    f.resize(n);
    for (size_t i = 0; i < n; i++) {
        h[i] = fy_f32_to_bf16(fy_test_uniform(rng, lo, hi));
        f[i] = fy_bf16_to_f32(h[i]);
    }
}

static void rand_f32(vector<float> &f, size_t n, float lo, float hi, uint64_t *rng)
{
    f.resize(n);
    for (size_t i = 0; i < n; i++)
        f[i] = fy_test_uniform(rng, lo, hi);
}

/* LayerNorm inputs: rows of U(-2,2); every third row offset by 8 (U(7,9): a large mean that a
 * one-pass variance would get wrong); the middle row constant (variance exactly 0) when N > 2. */
static void ln_inputs(vector<uint16_t> &h, vector<float> &f, int N, int C, uint64_t *rng)
{
    rand_bf16(h, f, (size_t)N * C, -2.0f, 2.0f, rng);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++) {
            size_t k = (size_t)n * C + i;
            float v;
            if (N > 2 && n == N / 2)
                v = 0.75f;
            else if (n % 3 == 1)
                v = 8.0f + fy_test_uniform(rng, -1.0f, 1.0f);
            else
                continue;
            h[k] = fy_f32_to_bf16(v);
            f[k] = fy_bf16_to_f32(h[k]);
        }
}

static const int LN_SHAPES[][2] = {{1, 8},     {7, 37},   {33, 1},   {65, 4097},
                                   {129, 768}, {1000, 1024}, {3000, 64}};
#define NSHAPES(a) (sizeof(a) / sizeof((a)[0]))

/* ---- LayerNorm ---- */

static void test_layernorm_forward(void **state)
{
    (void)state;
    g_failures = 0;
    for (size_t k = 0; k < NSHAPES(LN_SHAPES); k++) {
        int N = LN_SHAPES[k][0], C = LN_SHAPES[k][1];
        size_t NC = (size_t)N * C;
        char shape[64];
        snprintf(shape, sizeof shape, "N=%d C=%d", N, C);
        uint64_t rng = 1000 + k;
        vector<uint16_t> xh, wh, bh;
        vector<float> xf, wf, bfl;
        ln_inputs(xh, xf, N, C, &rng);
        rand_bf16(wh, wf, C, -1.5f, 1.5f, &rng);
        rand_bf16(bh, bfl, C, -0.5f, 0.5f, &rng);

        vector<float> out(NC), mean(N), rstd(N);
        fy_cpu_layernorm_forward(out.data(), mean.data(), rstd.data(), xf.data(), wf.data(),
                                 bfl.data(), N, C);

        dbuf dx = dnew(NC * 2), dw = dnew((size_t)C * 2), db = dnew((size_t)C * 2);
        dbuf dout = dnew(NC * 2), dmean = dnew((size_t)N * 4), drstd = dnew((size_t)N * 4);
        up(dx, xh.data(), NC * 2);
        up(dw, wh.data(), (size_t)C * 2);
        up(db, bh.data(), (size_t)C * 2);
        poison(dout);
        poison(dmean);
        poison(drstd);
        OP(fy_cu_layernorm_forward(B16(dout), F32(dmean), F32(drstd), B16(dx), B16(dw), B16(db), N,
                                   C, g_stream));
        vector<uint16_t> gout(NC);
        vector<float> gmean(N), grstd(N);
        down(gout.data(), dout, NC * 2);
        down(gmean.data(), dmean, (size_t)N * 4);
        down(grstd.data(), drstd, (size_t)N * 4);

        vector<double> ref(NC), rm(N), rr(N), tm(N), tr(N), mx(N);
        for (size_t i = 0; i < NC; i++)
            ref[i] = out[i];
        for (int n = 0; n < N; n++) {
            mx[n] = 0;
            for (int i = 0; i < C; i++)
                mx[n] = fmax(mx[n], fabs((double)xf[(size_t)n * C + i]));
            rm[n] = mean[n];
            rr[n] = rstd[n];
            tm[n] = 1e-4 * mx[n];
            tr[n] = 1e-4 * fabs((double)rstd[n]);
        }
        check_bf16("ln_fwd out", shape, gout.data(), ref.data(), NC, (size_t)C);
        /* mean: Frobenius relative to the rows' max|x| (a mean can be ~0) */
        check_f32("ln_fwd mean", shape, gmean.data(), rm.data(), mx.data(), tm.data(), (size_t)N,
                  1e-4);
        check_f32("ln_fwd rstd", shape, grstd.data(), rr.data(), NULL, tr.data(), (size_t)N, 1e-4);
        check_guard("ln_fwd", shape, "out", dout);
        check_guard("ln_fwd", shape, "mean", dmean);
        check_guard("ln_fwd", shape, "rstd", drstd);
        free_all();
    }
    assert_int_equal(g_failures, 0);
}

static void test_layernorm_backward(void **state)
{
    (void)state;
    g_failures = 0;
    for (size_t k = 0; k < NSHAPES(LN_SHAPES); k++) {
        int N = LN_SHAPES[k][0], C = LN_SHAPES[k][1];
        size_t NC = (size_t)N * C;
        char shape[64];
        snprintf(shape, sizeof shape, "N=%d C=%d", N, C);
        uint64_t rng = 2000 + k;
        vector<uint16_t> xh, wh, bh, douth, dinp_pre;
        vector<float> xf, wf, bfl, doutf, dinp_pre_f, dw_pre, db_pre;
        ln_inputs(xh, xf, N, C, &rng);
        rand_bf16(wh, wf, C, -1.5f, 1.5f, &rng);
        rand_bf16(bh, bfl, C, -0.5f, 0.5f, &rng);
        rand_bf16(douth, doutf, NC, -1.0f, 1.0f, &rng);
        /* dinp prefill: zero for even cases (a clean look at the gradient), random for odd ones. */
        float amp = (k % 2) ? 0.5f : 0.0f;
        rand_bf16(dinp_pre, dinp_pre_f, NC, -amp, amp, &rng);
        rand_f32(dw_pre, C, -1.0f, 1.0f, &rng);
        rand_f32(db_pre, C, -1.0f, 1.0f, &rng);

        /* Saved statistics from the CPU forward, given to both sides. */
        vector<float> ln(NC), mean(N), rstd(N);
        fy_cpu_layernorm_forward(ln.data(), mean.data(), rstd.data(), xf.data(), wf.data(),
                                 bfl.data(), N, C);
        vector<float> cdx(NC), cdw(C, 0.0f), cdb(C, 0.0f);
        fy_cpu_layernorm_backward(cdx.data(), cdw.data(), cdb.data(), doutf.data(), xf.data(),
                                  wf.data(), mean.data(), rstd.data(), N, C);

        size_t ns = fy_cu_layernorm_backward_scratch(N, C);
        if (ns < 2 * (size_t)C) {
            print_message("FAIL ln_bwd %s: scratch size %zu < 2*C\n", shape, ns);
            fail_check();
            free_all();
            continue;
        }
        dbuf ddinp = dnew(NC * 2), ddw = dnew((size_t)C * 4), ddb = dnew((size_t)C * 4);
        dbuf dscr = dnew(ns * 4), ddout = dnew(NC * 2), dx = dnew(NC * 2), dw = dnew((size_t)C * 2);
        dbuf dmean = dnew((size_t)N * 4), drstd = dnew((size_t)N * 4);
        up(ddout, douth.data(), NC * 2);
        up(dx, xh.data(), NC * 2);
        up(dw, wh.data(), (size_t)C * 2);
        up(dmean, mean.data(), (size_t)N * 4);
        up(drstd, rstd.data(), (size_t)N * 4);

        vector<uint16_t> gdinp[2];
        vector<float> gdw[2], gdb[2];
        for (int run = 0; run < 2; run++) {
            poison(ddinp); /* restores the guards too; then the prefills */
            poison(ddw);
            poison(ddb);
            poison(dscr); /* an unwritten partial would turn dw/db into NaN */
            up(ddinp, dinp_pre.data(), NC * 2);
            up(ddw, dw_pre.data(), (size_t)C * 4);
            up(ddb, db_pre.data(), (size_t)C * 4);
            OP(fy_cu_layernorm_backward(B16(ddinp), F32(ddw), F32(ddb), F32(dscr), B16(ddout),
                                        B16(dx), B16(dw), F32(dmean), F32(drstd), N, C, g_stream));
            gdinp[run].resize(NC);
            gdw[run].resize(C);
            gdb[run].resize(C);
            down(gdinp[run].data(), ddinp, NC * 2);
            down(gdw[run].data(), ddw, (size_t)C * 4);
            down(gdb[run].data(), ddb, (size_t)C * 4);
        }

        vector<double> rdinp(NC), rdw(C), rdb(C), cw(C), cb(C), tw(C), tb(C);
        for (size_t i = 0; i < NC; i++)
            rdinp[i] = (double)dinp_pre_f[i] + (double)cdx[i];
        for (int c = 0; c < C; c++) {
            double aw = 0, ab = 0;
            for (int n = 0; n < N; n++) {
                size_t i = (size_t)n * C + c;
                double dy = doutf[i];
                aw += fabs(dy * (((double)xf[i] - mean[n]) * rstd[n]));
                ab += fabs(dy);
            }
            cw[c] = cdw[c];
            cb[c] = cdb[c];
            rdw[c] = (double)dw_pre[c] + cw[c];
            rdb[c] = (double)db_pre[c] + cb[c];
            tw[c] = 1e-4 * (aw + fabs((double)dw_pre[c]));
            tb[c] = 1e-4 * (ab + fabs((double)db_pre[c]));
        }
        char what[96];
        snprintf(what, sizeof what, "%s %s", shape, k % 2 ? "(dinp+=)" : "(dinp=0+)");
        check_bf16("ln_bwd dinp", what, gdinp[0].data(), rdinp.data(), NC, (size_t)C);
        check_f32("ln_bwd dw", shape, gdw[0].data(), rdw.data(), cw.data(), tw.data(), (size_t)C,
                  1e-3);
        check_f32("ln_bwd db", shape, gdb[0].data(), rdb.data(), cb.data(), tb.data(), (size_t)C,
                  1e-3);
        check_bits("ln_bwd determinism", shape, "dinp run1 vs run2", gdinp[0].data(),
                   gdinp[1].data(), NC, 2);
        check_bits("ln_bwd determinism", shape, "dw run1 vs run2", gdw[0].data(), gdw[1].data(),
                   (size_t)C, 4);
        check_bits("ln_bwd determinism", shape, "db run1 vs run2", gdb[0].data(), gdb[1].data(),
                   (size_t)C, 4);
        check_guard("ln_bwd", shape, "dinp", ddinp);
        check_guard("ln_bwd", shape, "dw", ddw);
        check_guard("ln_bwd", shape, "db", ddb);
        check_guard("ln_bwd", shape, "scratch", dscr);
        free_all();
    }
    assert_int_equal(g_failures, 0);
}

/* ---- GELU ---- */

static const size_t EW_SIZES[] = {1, 7, 129, 1000, 100003};

static void test_gelu(void **state)
{
    (void)state;
    g_failures = 0;
    for (size_t k = 0; k < NSHAPES(EW_SIZES); k++) {
        size_t n = EW_SIZES[k];
        char shape[64];
        snprintf(shape, sizeof shape, "n=%zu", n);
        uint64_t rng = 3000 + k;
        vector<uint16_t> xh, dyh;
        vector<float> xf, dyf;
        rand_bf16(xh, xf, n, -6.0f, 6.0f, &rng);
        rand_bf16(dyh, dyf, n, -2.0f, 2.0f, &rng);
        vector<float> cy(n), cdx(n);
        fy_cpu_gelu_forward(cy.data(), xf.data(), n);
        fy_cpu_gelu_backward(cdx.data(), xf.data(), dyf.data(), n);
        vector<double> ry(n), rdx(n);
        for (size_t i = 0; i < n; i++) {
            ry[i] = cy[i];
            rdx[i] = cdx[i];
        }

        dbuf dx = dnew(n * 2), dy = dnew(n * 2), dout = dnew(n * 2), ddinp = dnew(n * 2);
        up(dx, xh.data(), n * 2);
        poison(dout);
        OP(fy_cu_gelu_forward(B16(dout), B16(dx), n, g_stream));
        vector<uint16_t> g(n);
        down(g.data(), dout, n * 2);
        check_bf16("gelu_fwd", shape, g.data(), ry.data(), n, n);
        check_guard("gelu_fwd", shape, "out", dout);

        /* backward: separate output (poisoned), then in place (dinp aliases dout) */
        up(dy, dyh.data(), n * 2);
        poison(ddinp);
        OP(fy_cu_gelu_backward(B16(ddinp), B16(dx), B16(dy), n, g_stream));
        down(g.data(), ddinp, n * 2);
        check_bf16("gelu_bwd", shape, g.data(), rdx.data(), n, n);
        check_guard("gelu_bwd", shape, "dinp", ddinp);
        OP(fy_cu_gelu_backward(B16(dy), B16(dx), B16(dy), n, g_stream));
        down(g.data(), dy, n * 2);
        check_bf16("gelu_bwd in-place", shape, g.data(), rdx.data(), n, n);
        check_guard("gelu_bwd in-place", shape, "dinp", dy);
        free_all();
    }
    assert_int_equal(g_failures, 0);
}

/* ---- residual ---- */

static void test_residual(void **state)
{
    (void)state;
    g_failures = 0;
    for (size_t k = 0; k < NSHAPES(EW_SIZES); k++) {
        size_t n = EW_SIZES[k];
        char shape[64];
        snprintf(shape, sizeof shape, "n=%zu", n);
        uint64_t rng = 4000 + k;
        vector<uint16_t> ah, bh, expect(n);
        vector<float> af, bfl;
        rand_bf16(ah, af, n, -4.0f, 4.0f, &rng);
        rand_bf16(bh, bfl, n, -4.0f, 4.0f, &rng);
        vector<double> ref(n);
        for (size_t i = 0; i < n; i++) {
            float s = af[i] + bfl[i]; /* the fp32 sum, as the kernel computes it */
            ref[i] = s;
            expect[i] = fy_f32_to_bf16(s);
        }
        dbuf da = dnew(n * 2), db = dnew(n * 2), dout = dnew(n * 2);
        vector<uint16_t> g(n);
        /* 0: separate output; 1: out aliases a; 2: out aliases b */
        const char *names[3] = {"residual", "residual out=a", "residual out=b"};
        for (int mode = 0; mode < 3; mode++) {
            poison(dout);
            up(da, ah.data(), n * 2);
            up(db, bh.data(), n * 2);
            const dbuf &o = mode == 0 ? dout : mode == 1 ? da : db;
            OP(fy_cu_residual_forward(B16(o), B16(da), B16(db), n, g_stream));
            down(g.data(), o, n * 2);
            check_bf16(names[mode], shape, g.data(), ref.data(), n, n);
            check_bits(names[mode], shape, "vs RNE(fp32 a+b)", g.data(), expect.data(), n, 2);
            check_guard(names[mode], shape, "out", o);
        }
        free_all();
    }
    assert_int_equal(g_failures, 0);
}

/* ---- embeddings ---- */

static const int EMB_SHAPES[][4] = {/* B, T, C, V */
                                    {1, 1, 8, 1},      {2, 7, 37, 5},   {4, 129, 768, 50},
                                    {3, 100, 1024, 3000}, {8, 1024, 64, 7}};

/* Positions of documents packed in rows of T (gpu_worker/backend.h): lengths drawn from 1 to 40,
 * the last cut at the row's end. */
static vector<int32_t> packed_positions(int B, int T, uint64_t *rng)
{
    vector<int32_t> pos((size_t)B * T);
    for (int b = 0; b < B; b++)
        for (int t = 0, p = 0, len = 0; t < T; t++, p++) {
            if (p == len) {
                p = 0;
                len = 1 + (int)(fy_test_rand(rng) % 40);
            }
            pos[(size_t)b * T + t] = p;
        }
    return pos;
}

/* Every shape twice: positions t (NULL), and documents (learned positions at their own). */
static void test_embed_forward(void **state)
{
    (void)state;
    g_failures = 0;
    for (size_t k = 0; k < 2 * NSHAPES(EMB_SHAPES); k++) {
        int docs = k >= NSHAPES(EMB_SHAPES);
        const int *sh = EMB_SHAPES[k % NSHAPES(EMB_SHAPES)];
        int B = sh[0], T = sh[1], C = sh[2], V = sh[3];
        int ctx = T + 3; /* wpe has more rows than T */
        size_t BT = (size_t)B * T, n = BT * C;
        char shape[80];
        snprintf(shape, sizeof shape, "B=%d T=%d C=%d V=%d%s", B, T, C, V,
                 docs ? " documents" : "");
        uint64_t rng = 5000 + k;
        vector<int32_t> tok(BT);
        for (size_t i = 0; i < BT; i++)
            tok[i] = (int32_t)(fy_test_rand(&rng) % (uint64_t)V);
        vector<int32_t> pos = packed_positions(B, T, &rng);
        dbuf dpos = dnew(BT * 4);
        up(dpos, pos.data(), BT * 4);
        const int32_t *hpos = docs ? pos.data() : NULL;
        const int32_t *gpos = docs ? (const int32_t *)dpos.p : NULL;
        vector<uint16_t> eh;
        vector<float> ef; /* [wte V*C | wpe ctx*C], the CPU layout */
        rand_bf16(eh, ef, ((size_t)V + ctx) * C, -1.0f, 1.0f, &rng);
        struct fy_model_config cfg = {1, 1, (uint32_t)C, (uint32_t)V, (uint32_t)ctx};
        vector<float> cx(n);
        fy_cpu_embed_forward(&cfg, ef.data(), tok.data(), hpos, cx.data(), B, T);
        vector<double> ref(n);
        vector<uint16_t> expect(n);
        for (size_t i = 0; i < n; i++) {
            ref[i] = cx[i];
            expect[i] = fy_f32_to_bf16(cx[i]);
        }

        dbuf dtok = dnew(BT * 4), dwte = dnew((size_t)V * C * 2), dwpe = dnew((size_t)ctx * C * 2);
        dbuf dout = dnew(n * 2);
        up(dtok, tok.data(), BT * 4);
        up(dwte, eh.data(), (size_t)V * C * 2);
        up(dwpe, eh.data() + (size_t)V * C, (size_t)ctx * C * 2);
        poison(dout);
        OP(fy_cu_embed_forward(B16(dout), (const int32_t *)dtok.p, B16(dwte), B16(dwpe), gpos, B, T,
                               C, g_stream));
        vector<uint16_t> g(n);
        down(g.data(), dout, n * 2);
        check_bf16("embed_fwd", shape, g.data(), ref.data(), n, (size_t)C);
        check_bits("embed_fwd", shape, "vs RNE(CPU fp32)", g.data(), expect.data(), n, 2);
        check_guard("embed_fwd", shape, "out", dout);
        free_all();
    }
    assert_int_equal(g_failures, 0);
}

/* Every shape twice: positions t (NULL), and documents (the wpe gradient at their positions, which
 * repeat: bit for bit the CPU's order). */
static void test_embed_backward(void **state)
{
    (void)state;
    g_failures = 0;
    for (size_t k = 0; k < 2 * NSHAPES(EMB_SHAPES); k++) {
        int docs = k >= NSHAPES(EMB_SHAPES);
        const int *sh = EMB_SHAPES[k % NSHAPES(EMB_SHAPES)];
        int B = sh[0], T = sh[1], C = sh[2], V = sh[3];
        size_t BT = (size_t)B * T, n = BT * C, VC = (size_t)V * C, TC = (size_t)T * C;
        char shape[80];
        snprintf(shape, sizeof shape, "B=%d T=%d C=%d V=%d%s", B, T, C, V,
                 docs ? " documents" : "");
        uint64_t rng = 6000 + k;
        vector<int32_t> tok(BT);
        for (size_t i = 0; i < BT; i++)
            tok[i] = (int32_t)(fy_test_rand(&rng) % (uint64_t)V);
        vector<int32_t> pos = packed_positions(B, T, &rng);
        dbuf dpos = dnew(BT * 4);
        up(dpos, pos.data(), BT * 4);
        const int32_t *hpos = docs ? pos.data() : NULL;
        const int32_t *gpos = docs ? (const int32_t *)dpos.p : NULL;
        vector<uint16_t> dyh;
        vector<float> dyf, pre; /* prefill, CPU layout [dwte V*C | dwpe T*C] */
        rand_bf16(dyh, dyf, n, -1.0f, 1.0f, &rng);
        rand_f32(pre, VC + TC, -1.0f, 1.0f, &rng);
        struct fy_model_config cfg = {1, 1, (uint32_t)C, (uint32_t)V, (uint32_t)T};
        vector<float> cpu(pre);
        fy_cpu_embed_backward(&cfg, tok.data(), hpos, dyf.data(), cpu.data(), B, T);

        dbuf dtok = dnew(BT * 4), ddy = dnew(n * 2), ddwte = dnew(VC * 4), ddwpe = dnew(TC * 4);
        up(dtok, tok.data(), BT * 4);
        up(ddy, dyh.data(), n * 2);
        vector<float> g[2];
        for (int run = 0; run < 2; run++) {
            poison(ddwte);
            poison(ddwpe);
            up(ddwte, pre.data(), VC * 4);
            up(ddwpe, pre.data() + VC, TC * 4);
            OP(fy_cu_embed_backward(F32(ddwte), F32(ddwpe), B16(ddy), (const int32_t *)dtok.p, gpos,
                                    B, T, C, V, g_stream));
            g[run].resize(VC + TC);
            down(g[run].data(), ddwte, VC * 4);
            down(g[run].data() + VC, ddwpe, TC * 4);
        }
        /* Diagnostics in values (the requirement is bit-identity with the CPU, below). */
        vector<double> ref(VC + TC), contrib(VC + TC), tol(VC + TC);
        for (size_t i = 0; i < VC + TC; i++) {
            ref[i] = cpu[i];
            contrib[i] = (double)cpu[i] - (double)pre[i];
            tol[i] = 1e-5 * (fabs(ref[i]) + 1.0);
        }
        check_f32("embed_bwd dwte", shape, g[0].data(), ref.data(), contrib.data(), tol.data(), VC,
                  1e-3);
        check_f32("embed_bwd dwpe", shape, g[0].data() + VC, ref.data() + VC, contrib.data() + VC,
                  tol.data() + VC, TC, 1e-3);
        check_bits("embed_bwd", shape, "dwte vs CPU (same order)", g[0].data(), cpu.data(), VC, 4);
        check_bits("embed_bwd", shape, "dwpe vs CPU (same order)", g[0].data() + VC,
                   cpu.data() + VC, TC, 4);
        check_bits("embed_bwd determinism", shape, "run1 vs run2", g[0].data(), g[1].data(),
                   VC + TC, 4);
        check_guard("embed_bwd", shape, "dwte", ddwte);
        check_guard("embed_bwd", shape, "dwpe", ddwpe);
        free_all();
    }
    assert_int_equal(g_failures, 0);
}

/* ---- conversions ---- */

static void test_convert(void **state)
{
    (void)state;
    g_failures = 0;
    /* bf16 -> f32: every one of the 65536 bit patterns, exact (NaNs included: bits << 16). */
    {
        size_t n = 65536;
        vector<uint16_t> h(n);
        vector<uint32_t> expect(n), g(n);
        for (size_t i = 0; i < n; i++) {
            h[i] = (uint16_t)i;
            expect[i] = (uint32_t)i << 16;
        }
        dbuf din = dnew(n * 2), dout = dnew(n * 4);
        up(din, h.data(), n * 2);
        poison(dout);
        OP(fy_cu_bf16_to_f32(F32(dout), B16(din), n, g_stream));
        down(g.data(), dout, n * 4);
        check_bits("bf16_to_f32", "all 65536 patterns", "vs bits<<16", g.data(), expect.data(), n,
                   4);
        check_guard("bf16_to_f32", "all 65536 patterns", "out", dout);
        free_all();
    }
    /* f32 -> bf16: special values, then random bit patterns; RNE as fy_f32_to_bf16. */
    const uint32_t specials[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, /* +-0, +-inf */
        0x7f7fffffu, 0xff7fffffu,                           /* +-FLT_MAX: round to +-inf */
        0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, /* ties to even, just above/below */
        0x00000001u, 0x807fffffu, 0x007f8000u, 0x00008000u, /* subnormals */
        0x7fc00000u, 0xff800001u, 0x7fffffffu,              /* NaNs: must stay NaN */
        0x3f800000u, 0xbf800000u, 0x4b800001u};
    const size_t nspec = sizeof specials / sizeof specials[0];
    const size_t sizes[] = {1, 7, 1000, 100003};
    for (size_t k = 0; k < NSHAPES(sizes); k++) {
        size_t n = sizes[k];
        char shape[64];
        snprintf(shape, sizeof shape, "n=%zu", n);
        uint64_t rng = 7000 + k;
        vector<uint32_t> in(n);
        for (size_t i = 0; i < n; i++)
            in[i] = i < nspec ? specials[i] : (uint32_t)(fy_test_rand(&rng) >> 32);
        dbuf din = dnew(n * 4), dout = dnew(n * 2);
        up(din, in.data(), n * 4);
        poison(dout);
        OP(fy_cu_f32_to_bf16(B16(dout), F32(din), n, g_stream));
        vector<uint16_t> g(n), expect(n);
        down(g.data(), dout, n * 2);
        size_t nans = 0;
        for (size_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, &in[i], 4);
            expect[i] = fy_f32_to_bf16(f);
            if (f != f) { /* any NaN is right; compare as the expected NaN when it is one */
                nans++;
                if ((g[i] & 0x7f80u) == 0x7f80u && (g[i] & 0x007fu) != 0)
                    g[i] = expect[i];
            }
        }
        char what[64];
        snprintf(what, sizeof what, "vs host RNE (%zu NaN inputs)", nans);
        check_bits("f32_to_bf16", shape, what, g.data(), expect.data(), n, 2);
        check_guard("f32_to_bf16", shape, "out", dout);
        free_all();
    }
    assert_int_equal(g_failures, 0);
}

/* ---- argument checking ---- */

static void test_bad_arguments(void **state)
{
    (void)state;
    dbuf d = dnew(4096);
    bf16 *h = B16(d);
    float *f = F32(d);
    const int32_t *t = (const int32_t *)d.p;
    print_message("(the 'bad shape' / 'NULL pointer' / 'n=0' error lines below are expected)\n");
    assert_int_equal(fy_cu_layernorm_forward(h, f, f, h, h, h, 0, 8, g_stream), -EINVAL);
    assert_int_equal(fy_cu_layernorm_forward(h, f, f, h, h, h, 4, 0, g_stream), -EINVAL);
    assert_int_equal(fy_cu_layernorm_forward(NULL, f, f, h, h, h, 4, 8, g_stream), -EINVAL);
    assert_int_equal(fy_cu_layernorm_backward_scratch(0, 8), 0);
    assert_int_equal(fy_cu_layernorm_backward_scratch(8, -1), 0);
    assert_int_equal(fy_cu_layernorm_backward(h, f, f, f, h, h, h, f, f, -1, 8, g_stream),
                     -EINVAL);
    assert_int_equal(fy_cu_layernorm_backward(h, f, f, NULL, h, h, h, f, f, 4, 8, g_stream),
                     -EINVAL);
    assert_int_equal(fy_cu_gelu_forward(h, h, 0, g_stream), -EINVAL);
    assert_int_equal(fy_cu_gelu_backward(h, NULL, h, 8, g_stream), -EINVAL);
    assert_int_equal(fy_cu_residual_forward(h, h, h, 0, g_stream), -EINVAL);
    assert_int_equal(fy_cu_embed_forward(h, t, h, h, NULL, 0, 1, 8, g_stream), -EINVAL);
    assert_int_equal(fy_cu_embed_backward(f, f, h, t, NULL, 1, 1, 8, 0, g_stream), -EINVAL);
    assert_int_equal(fy_cu_f32_to_bf16(h, f, 0, g_stream), -EINVAL);
    assert_int_equal(fy_cu_bf16_to_f32(f, NULL, 8, g_stream), -EINVAL);
    CK(cudaStreamSynchronize(g_stream));
    CK(cudaGetLastError()); /* nothing was launched with a bad configuration */
    free_all();
}

int main(void)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        printf("test_cu_kernels: SKIPPED: no usable CUDA device (cudaGetDeviceCount: %s, %d "
               "devices)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "ok", count);
        return FY_TEST_SKIP;
    }
    struct cudaDeviceProp prop;
    e = cudaSetDevice(0);
    if (e == cudaSuccess)
        e = cudaGetDeviceProperties(&prop, 0);
    if (e == cudaSuccess)
        e = cudaStreamCreate(&g_stream);
    if (e != cudaSuccess) {
        printf("test_cu_kernels: SKIPPED: no usable CUDA device (%s)\n", cudaGetErrorString(e));
        return FY_TEST_SKIP;
    }
    printf("test_cu_kernels: device 0: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layernorm_forward), cmocka_unit_test(test_layernorm_backward),
        cmocka_unit_test(test_gelu),              cmocka_unit_test(test_residual),
        cmocka_unit_test(test_embed_forward),     cmocka_unit_test(test_embed_backward),
        cmocka_unit_test(test_convert),           cmocka_unit_test(test_bad_arguments),
    };
    int failed = cmocka_run_group_tests_name("cu_kernels", tests, NULL, NULL);
    e = cudaStreamDestroy(g_stream);
    if (e != cudaSuccess) {
        printf("test_cu_kernels: cudaStreamDestroy: %s\n", cudaGetErrorString(e));
        return 1;
    }
    return failed;
}
