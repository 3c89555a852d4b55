/* GPU test of the cuBLASLt matrix products (gpu_worker/cuda/cu_matmul.h) against the fp32 CPU
 * reference (fy_cpu_matmul_forward/backward) and, for the batched form, a plain double loop.
 * Skips (exit 77, saying why) where there is no usable CUDA device.
 *
 * Inputs are random and rounded to bf16 on the host, so the CPU and the GPU multiply identical
 * values; bf16 x bf16 products are exact in fp32, so the two sides differ only by the order of the
 * fp32 accumulation and by the final rounding of bf16 outputs.
 *
 * Tolerances.
 *  - bf16 outputs: |gpu - cpu| <= 2^-7 |cpu| + atol, atol = 1e-2 rms(cpu). Rounding to bf16 (8
 *    significant bits) costs at most 2^-8 |x|; 2^-7 leaves a factor two for the reference's own
 *    fp32 rounding. atol covers elements where the sum cancels, whose absolute error is that of
 *    the accumulation (order differs) relative to the size of the terms, not of the result.
 *  - fp32 outputs (dw, dbias, batched f32): relative Frobenius error < 1e-3, and per element
 *    |gpu - cpu| <= 1e-3 (|cpu| + rms(cpu)). The true error is ~1e-6 (fp32 sums in another order).
 *  - Determinism: every call is repeated on the same inputs and must give identical bytes.
 *  - Outputs that a call overwrites are filled with NaN bytes (0xff) first, so an element left
 *    unwritten, or C read although beta = 0, fails; guard elements after every output, and the
 *    gaps between batched matrices, must come back unchanged. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
extern "C" { /* this cmocka.h has no C++ guards */
#include <cmocka.h>
}

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "common/base/dtype.h"
#include "gpu_worker/cpu/cpu_ops.h"
#include "gpu_worker/cuda/cu_matmul.h"
#include "tests/testutil.h"

#define WORKSPACE_BYTES (32u << 20)
#define GUARD 64 /* elements after every output buffer that must stay untouched */

static struct fy_cu_lt *lt;
static cudaStream_t stream;
static void *workspace;

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t ck_err_ = (call);                                                              \
        if (ck_err_ != cudaSuccess) {                                                              \
            print_error("%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call,                        \
                        cudaGetErrorString(ck_err_), cudaGetErrorName(ck_err_));                   \
            fail();                                                                                \
        }                                                                                          \
    } while (0)

/* A fy_cu call: must return 0 and leave the stream without an error. */
#define CALL(what, call)                                                                           \
    do {                                                                                           \
        int call_rc_ = (call);                                                                     \
        if (call_rc_ != 0) {                                                                       \
            print_error("%s:%d: %s returned %d (see the log line above)\n", __FILE__, __LINE__,   \
                        what, call_rc_);                                                           \
            fail();                                                                                \
        }                                                                                          \
        CK(cudaStreamSynchronize(stream));                                                         \
    } while (0)

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

/* n random values in [lo, hi), rounded to bf16: the floats (for the CPU) and the bits (for the GPU). */
static void rand_bf16(float *f, uint16_t *h, size_t n, uint64_t *st, float lo, float hi)
{
    for (size_t i = 0; i < n; i++) {
        h[i] = fy_f32_to_bf16(fy_test_uniform(st, lo, hi));
        f[i] = fy_bf16_to_f32(h[i]);
    }
}

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    CK(cudaMalloc(&p, bytes));
    return p;
}

static double rms_of(const float *c, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)c[i] * c[i];
    return n ? sqrt(s / (double)n) : 0.0;
}

/* Compares n values laid out as rows of `cols`; prints a summary line and the first violations
 * (with row and column), and fails the test on any violation. bf16: the bf16 rule; else fp32. */
static void check(const char *what, const float *gpu, const float *cpu, size_t n, size_t cols,
                  int bf16_rule)
{
    double rms = rms_of(cpu, n), max_abs = 0, max_ratio = 0, num = 0, den = 0;
    size_t bad = 0, worst = 0;
    for (size_t i = 0; i < n; i++) {
        double c = cpu[i], g = gpu[i], e = fabs(g - c);
        double tol = bf16_rule ? ldexp(fabs(c), -7) + 1e-2 * rms : 1e-3 * (fabs(c) + rms);
        num += (g - c) * (g - c);
        den += c * c;
        if (!(e <= tol)) { /* also catches NaN */
            if (bad < 8)
                print_error("  %s: element %zu (row %zu, col %zu): gpu %.9g cpu %.9g |diff| %.3g > "
                            "tol %.3g\n",
                            what, i, i / cols, i % cols, g, c, e, tol);
            bad++;
        }
        if (!(e <= max_abs)) {
            max_abs = e;
            worst = i;
        }
        if (tol > 0 && e / tol > max_ratio)
            max_ratio = e / tol;
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    print_message("  %-28s %8zu values: max |err| %.3g (at %zu: gpu %.7g cpu %.7g), max err/tol "
                  "%.3f, rel Frobenius %.3g, rms %.3g%s\n",
                  what, n, max_abs, worst, (double)gpu[worst], (double)cpu[worst], max_ratio, rel,
                  rms, bad ? "  FAILED" : "");
    if (bad)
        print_error("  %s: %zu of %zu values outside the tolerance\n", what, bad, n);
    assert_int_equal(bad, 0);
    if (!bf16_rule && !(rel < 1e-3)) {
        print_error("  %s: relative Frobenius error %.3g >= 1e-3\n", what, rel);
        fail();
    }
}

static void bf16_to_f32_array(float *f, const uint16_t *h, size_t n)
{
    for (size_t i = 0; i < n; i++)
        f[i] = fy_bf16_to_f32(h[i]);
}

/* The GUARD elements after an output: must still hold the poison/initial bytes. */
static void check_guard(const char *what, const void *dev_end, const void *expect, size_t bytes)
{
    unsigned char *got = (unsigned char *)xmalloc(bytes);
    CK(cudaMemcpy(got, dev_end, bytes, cudaMemcpyDeviceToHost));
    if (memcmp(got, expect, bytes)) {
        print_error("  %s: written past its end (guard bytes changed)\n", what);
        fail();
    }
    free(got);
}

static void check_same(const char *what, const void *a, const void *b, size_t bytes)
{
    if (memcmp(a, b, bytes)) {
        size_t i = 0;
        while (((const unsigned char *)a)[i] == ((const unsigned char *)b)[i])
            i++;
        print_error("  %s: NOT deterministic: repeated call differs (first at byte %zu)\n", what,
                    i);
        fail();
    }
    print_message("  %-28s identical bytes on repetition\n", what);
}

/* ---- y = x W^T + b, forward and backward ---- */

/* off: elements by which every device pointer is shifted from cudaMalloc's 256-byte alignment. */
static void run_linear(int N, int IN, int OUT, int use_bias, size_t off, uint64_t seed)
{
    print_message("linear N=%d IN=%d OUT=%d bias=%s pointer offset %zu elements\n", N, IN, OUT,
                  use_bias ? "yes" : "no", off);
    size_t nx = (size_t)N * IN, nw = (size_t)OUT * IN, ny = (size_t)N * OUT;
    uint64_t st = seed;
    float *inp = (float *)xmalloc(nx * 4), *w = (float *)xmalloc(nw * 4);
    float *bias = (float *)xmalloc((size_t)OUT * 4), *dout = (float *)xmalloc(ny * 4);
    uint16_t *inp_h = (uint16_t *)xmalloc(nx * 2), *w_h = (uint16_t *)xmalloc(nw * 2);
    uint16_t *bias_h = (uint16_t *)xmalloc((size_t)OUT * 2), *dout_h = (uint16_t *)xmalloc(ny * 2);
    rand_bf16(inp, inp_h, nx, &st, -1.0f, 1.0f);
    rand_bf16(w, w_h, nw, &st, -0.5f, 0.5f);
    rand_bf16(bias, bias_h, (size_t)OUT, &st, -0.5f, 0.5f);
    rand_bf16(dout, dout_h, ny, &st, -1.0f, 1.0f);
    float *dw0 = (float *)xmalloc(nw * 4), *db0 = (float *)xmalloc((size_t)OUT * 4);
    for (size_t i = 0; i < nw; i++)
        dw0[i] = fy_test_uniform(&st, -1.0f, 1.0f);
    for (int i = 0; i < OUT; i++)
        db0[i] = fy_test_uniform(&st, -1.0f, 1.0f);

    /* device buffers: off elements in, GUARD elements after */
    char *d_inp = (char *)dev_alloc((off + nx) * 2), *d_w = (char *)dev_alloc((off + nw) * 2);
    char *d_bias = (char *)dev_alloc((off + OUT) * 2), *d_dout = (char *)dev_alloc((off + ny) * 2);
    char *d_out = (char *)dev_alloc((off + ny + GUARD) * 2);
    char *d_dinp = (char *)dev_alloc((off + nx + GUARD) * 2);
    char *d_dw = (char *)dev_alloc((off + nw + GUARD) * 4);
    char *d_db = (char *)dev_alloc((off + OUT + GUARD) * 4);
    bf16 *x = (bf16 *)(d_inp + off * 2), *wt = (bf16 *)(d_w + off * 2);
    bf16 *b = (bf16 *)(d_bias + off * 2), *dy = (bf16 *)(d_dout + off * 2);
    bf16 *y = (bf16 *)(d_out + off * 2), *dx = (bf16 *)(d_dinp + off * 2);
    float *dw = (float *)(d_dw + off * 4), *db = (float *)(d_db + off * 4);
    CK(cudaMemcpy(x, inp_h, nx * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(wt, w_h, nw * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b, bias_h, (size_t)OUT * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dy, dout_h, ny * 2, cudaMemcpyHostToDevice));
    unsigned char poison[GUARD * 4];
    memset(poison, 0xff, sizeof poison);
    char name[128];

    /* forward */
    float *ref = (float *)xmalloc(ny * 4), *got = (float *)xmalloc(ny * 4);
    uint16_t *got_h = (uint16_t *)xmalloc(ny * 2), *again_h = (uint16_t *)xmalloc(ny * 2);
    fy_cpu_matmul_forward(ref, inp, w, use_bias ? bias : NULL, N, IN, OUT);
    const bf16 *bp = use_bias ? b : NULL;
    CK(cudaMemset(y, 0xff, (ny + GUARD) * 2));
    CALL("fy_cu_matmul_forward", fy_cu_matmul_forward(lt, y, x, wt, bp, N, IN, OUT, stream));
    CK(cudaMemcpy(got_h, y, ny * 2, cudaMemcpyDeviceToHost));
    bf16_to_f32_array(got, got_h, ny);
    snprintf(name, sizeof name, "forward out[%d][%d]", N, OUT);
    check(name, got, ref, ny, (size_t)OUT, 1);
    check_guard(name, y + ny, poison, GUARD * 2);
    CK(cudaMemset(y, 0xff, ny * 2));
    CALL("fy_cu_matmul_forward", fy_cu_matmul_forward(lt, y, x, wt, bp, N, IN, OUT, stream));
    CK(cudaMemcpy(again_h, y, ny * 2, cudaMemcpyDeviceToHost));
    check_same("forward", got_h, again_h, ny * 2);

    /* backward */
    float *dinp_ref = (float *)xmalloc(nx * 4), *dw_ref = (float *)xmalloc(nw * 4);
    float *db_ref = (float *)xmalloc((size_t)OUT * 4);
    memcpy(dw_ref, dw0, nw * 4);
    memcpy(db_ref, db0, (size_t)OUT * 4);
    fy_cpu_matmul_backward(dinp_ref, dw_ref, use_bias ? db_ref : NULL, dout, inp, w, N, IN, OUT);
    uint16_t *dinp_h = (uint16_t *)xmalloc(nx * 2), *dinp2_h = (uint16_t *)xmalloc(nx * 2);
    float *dinp_f = (float *)xmalloc(nx * 4);
    float *dw_got = (float *)xmalloc(nw * 4), *dw_again = (float *)xmalloc(nw * 4);
    float *db_got = (float *)xmalloc((size_t)OUT * 4), *db_again = (float *)xmalloc((size_t)OUT * 4);
    float *dbp = use_bias ? db : NULL;
    for (int rep = 0; rep < 2; rep++) {
        CK(cudaMemset(dx, 0xff, (nx + GUARD) * 2));
        CK(cudaMemcpy(dw, dw0, nw * 4, cudaMemcpyHostToDevice));
        CK(cudaMemset(dw + nw, 0xff, GUARD * 4));
        CK(cudaMemcpy(db, db0, (size_t)OUT * 4, cudaMemcpyHostToDevice));
        CK(cudaMemset(db + OUT, 0xff, GUARD * 4));
        CALL("fy_cu_matmul_backward",
             fy_cu_matmul_backward(lt, dx, dw, dbp, dy, x, wt, N, IN, OUT, stream));
        CK(cudaMemcpy(rep ? dinp2_h : dinp_h, dx, nx * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(rep ? dw_again : dw_got, dw, nw * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(rep ? db_again : db_got, db, (size_t)OUT * 4, cudaMemcpyDeviceToHost));
        if (rep == 0) {
            bf16_to_f32_array(dinp_f, dinp_h, nx);
            snprintf(name, sizeof name, "backward dinp[%d][%d]", N, IN);
            check(name, dinp_f, dinp_ref, nx, (size_t)IN, 1);
            check_guard(name, dx + nx, poison, GUARD * 2);
            snprintf(name, sizeof name, "backward dw[%d][%d] (+=)", OUT, IN);
            check(name, dw_got, dw_ref, nw, (size_t)IN, 0);
            check_guard(name, dw + nw, poison, GUARD * 4);
            if (use_bias) {
                snprintf(name, sizeof name, "backward dbias[%d] (+=)", OUT);
                check(name, db_got, db_ref, (size_t)OUT, (size_t)OUT, 0);
                check_guard(name, db + OUT, poison, GUARD * 4);
            } else {
                check_same("dbias untouched (NULL bias)", db_got, db0, (size_t)OUT * 4);
            }
        }
    }
    check_same("backward dinp", dinp_h, dinp2_h, nx * 2);
    check_same("backward dw", dw_got, dw_again, nw * 4);
    check_same("backward dbias", db_got, db_again, (size_t)OUT * 4);

    /* dinp and dbias NULL: dw alone, the same bytes as above */
    CK(cudaMemcpy(dw, dw0, nw * 4, cudaMemcpyHostToDevice));
    CALL("fy_cu_matmul_backward (dinp, dbias NULL)",
         fy_cu_matmul_backward(lt, NULL, dw, NULL, dy, x, wt, N, IN, OUT, stream));
    CK(cudaMemcpy(dw_again, dw, nw * 4, cudaMemcpyDeviceToHost));
    check_same("dw with dinp, dbias NULL", dw_got, dw_again, nw * 4);

    CK(cudaFree(d_inp));
    CK(cudaFree(d_w));
    CK(cudaFree(d_bias));
    CK(cudaFree(d_dout));
    CK(cudaFree(d_out));
    CK(cudaFree(d_dinp));
    CK(cudaFree(d_dw));
    CK(cudaFree(d_db));
    free(inp), free(w), free(bias), free(dout), free(inp_h), free(w_h), free(bias_h), free(dout_h);
    free(dw0), free(db0), free(ref), free(got), free(got_h), free(again_h), free(dinp_ref);
    free(dw_ref), free(db_ref), free(dinp_h), free(dinp2_h), free(dinp_f), free(dw_got);
    free(dw_again), free(db_got), free(db_again);
}

static void test_linear_small(void **state)
{
    (void)state;
    run_linear(7, 24, 40, 1, 0, 1);
    run_linear(7, 24, 40, 0, 0, 2);
    run_linear(1, 8, 8, 1, 0, 3);
}

static void test_linear_gpt2(void **state)
{
    (void)state;
    run_linear(129, 768, 2304, 1, 0, 11); /* qkv, odd N */
    run_linear(1000, 3072, 768, 1, 0, 12); /* mlp proj */
    run_linear(256, 768, 3072, 1, 0, 13);  /* mlp fc */
    run_linear(64, 768, 768, 0, 0, 14);
}

/* Beyond the contract's needs (GPT dims are multiples of 8): IN, OUT not multiples of 8, so leading
 * dimensions are not 16-byte multiples, and pointers only 2-byte aligned. A failure here alone
 * means cuBLASLt wants more alignment than these; the GPT shapes are unaffected. */
static void test_linear_odd_and_unaligned(void **state)
{
    (void)state;
    run_linear(5, 13, 11, 1, 0, 21);
    run_linear(33, 64, 96, 1, 1, 22); /* every pointer 2 bytes past a 256-byte boundary */
    run_linear(17, 40, 24, 1, 4, 23); /* 8 bytes past */
}

/* ---- batched, attention-like ---- */

/* count problems C[i] (M x N) = alpha op(A[i]) op(B[i]) + beta C[i], row-major; `pad` extra
 * elements between consecutive matrices (strides = size + pad), which must stay untouched. */
static void run_batched(const char *label, int count, int M, int N, int K, int ta, int tb,
                        int c_f32, float alpha, float beta, int pad, uint64_t seed)
{
    print_message("batched %s: count=%d M=%d N=%d K=%d trans_a=%d trans_b=%d C %s alpha %g beta "
                  "%g pad %d\n",
                  label, count, M, N, K, ta, tb, c_f32 ? "f32" : "bf16", (double)alpha,
                  (double)beta, pad);
    long long sa = (long long)M * K + pad, sb = (long long)K * N + pad, sc = (long long)M * N + pad;
    size_t na = (size_t)sa * count, nb = (size_t)sb * count, nc = (size_t)sc * count;
    size_t esz = c_f32 ? 4 : 2;
    uint64_t st = seed;
    float *a = (float *)xmalloc(na * 4), *b = (float *)xmalloc(nb * 4);
    uint16_t *a_h = (uint16_t *)xmalloc(na * 2), *b_h = (uint16_t *)xmalloc(nb * 2);
    rand_bf16(a, a_h, na, &st, -1.0f, 1.0f);
    rand_bf16(b, b_h, nb, &st, -1.0f, 1.0f);
    /* initial C (bytes as the GPU holds them, and as floats): random, or NaN bytes when beta = 0 */
    unsigned char *c0 = (unsigned char *)xmalloc(nc * esz);
    float *c0f = (float *)xmalloc(nc * 4);
    if (beta == 0.0f) {
        memset(c0, 0xff, nc * esz);
        for (size_t i = 0; i < nc; i++)
            c0f[i] = 0.0f; /* never read */
    } else {
        for (size_t i = 0; i < nc; i++) {
            float v = fy_bf16_to_f32(fy_f32_to_bf16(fy_test_uniform(&st, -1.0f, 1.0f)));
            c0f[i] = v;
            if (c_f32)
                memcpy(c0 + i * 4, &v, 4);
            else {
                uint16_t h = fy_f32_to_bf16(v);
                memcpy(c0 + i * 2, &h, 2);
            }
        }
    }
    /* reference in double, as float, compacted to count x M x N */
    size_t mn = (size_t)M * N;
    float *ref = (float *)xmalloc(mn * count * 4), *got = (float *)xmalloc(mn * count * 4);
    for (int i = 0; i < count; i++) {
        const float *A = a + (size_t)i * sa, *B = b + (size_t)i * sb;
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double s = 0;
                for (int k = 0; k < K; k++) {
                    double x = ta ? A[(size_t)k * M + m] : A[(size_t)m * K + k];
                    double z = tb ? B[(size_t)n * K + k] : B[(size_t)k * N + n];
                    s += x * z;
                }
                double c = beta != 0.0f ? c0f[(size_t)i * sc + (size_t)m * N + n] : 0.0;
                ref[(size_t)i * mn + (size_t)m * N + n] = (float)(alpha * s + beta * c);
            }
    }

    bf16 *d_a = (bf16 *)dev_alloc(na * 2), *d_b = (bf16 *)dev_alloc(nb * 2);
    unsigned char *d_c = (unsigned char *)dev_alloc(nc * esz + GUARD * 4);
    CK(cudaMemcpy(d_a, a_h, na * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_b, b_h, nb * 2, cudaMemcpyHostToDevice));
    unsigned char *out1 = (unsigned char *)xmalloc(nc * esz), *out2 = (unsigned char *)xmalloc(nc * esz);
    unsigned char poison[GUARD * 4];
    memset(poison, 0xff, sizeof poison);
    for (int rep = 0; rep < 2; rep++) {
        CK(cudaMemcpy(d_c, c0, nc * esz, cudaMemcpyHostToDevice));
        CK(cudaMemset(d_c + nc * esz, 0xff, GUARD * 4));
        CALL("fy_cu_matmul_batched", fy_cu_matmul_batched(lt, d_c, c_f32, d_a, d_b, M, N, K, ta, tb,
                                                          sa, sb, sc, count, alpha, beta, stream));
        CK(cudaMemcpy(rep ? out2 : out1, d_c, nc * esz, cudaMemcpyDeviceToHost));
    }
    char name[128];
    snprintf(name, sizeof name, "%s C[%d][%d][%d]", label, count, M, N);
    check_guard(name, d_c + nc * esz, poison, GUARD * 4);
    size_t gap_bad = 0;
    for (int i = 0; i < count; i++) {
        for (size_t j = 0; j < mn; j++) {
            size_t at = (size_t)i * sc + j;
            float v;
            if (c_f32)
                memcpy(&v, out1 + at * 4, 4);
            else {
                uint16_t h;
                memcpy(&h, out1 + at * 2, 2);
                v = fy_bf16_to_f32(h);
            }
            got[(size_t)i * mn + j] = v;
        }
        for (int j = 0; j < pad; j++) {
            size_t at = ((size_t)i * sc + mn + j) * esz;
            if (memcmp(out1 + at, c0 + at, esz))
                gap_bad++;
        }
    }
    if (gap_bad) {
        print_error("  %s: %zu elements between matrices (the stride's padding) were written\n",
                    name, gap_bad);
        fail();
    }
    check(name, got, ref, mn * count, (size_t)N, !c_f32);
    check_same(name, out1, out2, nc * esz);

    CK(cudaFree(d_a));
    CK(cudaFree(d_b));
    CK(cudaFree(d_c));
    free(a), free(b), free(a_h), free(b_h), free(c0), free(c0f), free(ref), free(got), free(out1);
    free(out2);
}

/* B = 2, NH = 3 (count 6), T = 37 (odd: leading dimensions and strides not 16-byte multiples),
 * hs = 24. */
static void test_batched_attention_odd(void **state)
{
    (void)state;
    int c = 6, T = 37, hs = 24;
    float sc = 1.0f / sqrtf((float)hs);
    run_batched("scores q k^T", c, T, T, hs, 0, 1, 1, sc, 0.0f, 0, 31);
    run_batched("scores q k^T bf16", c, T, T, hs, 0, 1, 0, sc, 0.0f, 8, 32);
    run_batched("att v", c, T, hs, T, 0, 0, 0, 1.0f, 0.0f, 0, 33);
    run_batched("datt = dout v^T", c, T, T, hs, 0, 1, 1, 1.0f, 0.0f, 3, 34);
    run_batched("dv += att^T dout", c, T, hs, T, 1, 0, 1, 1.0f, 1.0f, 0, 35);
    run_batched("dk += ds^T q, bf16", c, T, hs, T, 1, 0, 0, sc, 1.0f, 5, 36);
    run_batched("A^T B^T", c, T, hs, T, 1, 1, 0, 1.0f, 1.0f, 0, 37);
    run_batched("A^T B^T f32 beta .5", c, 20, 12, 9, 1, 1, 1, 2.0f, 0.5f, 1, 38);
    run_batched("count 1", 1, 9, 7, 5, 0, 0, 1, 1.0f, 0.0f, 0, 39);
}

/* GPT-2-like: hs = 64, T multiple of 64. */
static void test_batched_attention_gpt2(void **state)
{
    (void)state;
    float sc = 0.125f;
    run_batched("scores T=64", 12, 64, 64, 64, 0, 1, 1, sc, 0.0f, 0, 41);
    run_batched("att v T=64", 12, 64, 64, 64, 0, 0, 0, 1.0f, 0.0f, 0, 42);
    run_batched("scores T=256", 8, 256, 256, 64, 0, 1, 0, sc, 0.0f, 0, 43);
    run_batched("dq = ds k T=256", 8, 256, 64, 256, 0, 0, 1, sc, 0.0f, 0, 44);
    run_batched("dv += att^T dout T=256", 8, 256, 64, 256, 1, 0, 1, 1.0f, 1.0f, 0, 45);
}

int main(void)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        printf("test_cu_matmul: SKIPPED: no usable CUDA device (%s)\n",
               err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        return FY_TEST_SKIP;
    }
    fy_log_init("test", FY_LOG_DEBUG); /* shows the algorithm chosen for each shape */
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        printf("test_cu_matmul: %s, sm_%d%d, %d SMs\n", prop.name, prop.major, prop.minor,
               prop.multiProcessorCount);
    if (cudaStreamCreate(&stream) != cudaSuccess || cudaMalloc(&workspace, WORKSPACE_BYTES) != cudaSuccess ||
        fy_cu_lt_new(&lt, workspace, WORKSPACE_BYTES) != 0) {
        printf("test_cu_matmul: FAILED: cannot set up the stream, workspace or cuBLASLt handle\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear_small),
        cmocka_unit_test(test_linear_gpt2),
        cmocka_unit_test(test_batched_attention_odd),
        cmocka_unit_test(test_batched_attention_gpt2),
        cmocka_unit_test(test_linear_odd_and_unaligned),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fy_cu_lt_destroy(&lt);
    cudaFree(workspace);
    cudaStreamDestroy(stream);
    return rc;
}
