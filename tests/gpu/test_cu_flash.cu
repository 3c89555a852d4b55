/* GPU test of gpu_worker/cuda/cu_flash.cu (flash-style causal attention on tensor cores): forward
 * out and backward dq, dk, dv against the fp32 CPU reference (fy_cpu_attention_forward/backward) on
 * bf16-rounded inputs (so both sides see the same values), for shapes that cover T = 1, T not a
 * multiple of the 64-row tile, several heads and batches, and head sizes 8, 16, 64, 80 and 128.
 * Every call runs twice on poisoned (0xff: bf16/f32 NaN) outputs and scratch, and the two results
 * must be identical byte for byte. One case is also compared with the materialising
 * fy_cu_attention_forward/backward, and two large cases (B=4 T=1024: C=1024 NH=8, hs 128, and
 * C=1280 NH=16, hs 80) time both versions (printed, no assertion on speed) and check that they
 * agree and that flash reruns are bit-identical. Skips (exit 77) where there is no
 * usable CUDA device.
 *
 * Documents (gpu_worker/backend.h's positions): the same checks with each query seeing only its own
 * document's keys (documents starting mid-tile, single-token ones, one across several tiles, on
 * tile boundaries, one spanning the row), the CPU reference given the same positions, and one
 * case each also against the materialising version given them.
 *
 * Tolerances (as in test_cu_attention.cu; bf16 products with fp32 accumulation against fp32):
 *  - out: |gpu - cpu| <= 2^-6 |cpu| + 2e-2 rms(cpu) per element. The GPU rounds P to bf16 before
 *    P v and rounds the output to bf16 (2^-9 relative each); 2^-6 leaves 8x margin for that, and the
 *    rms term covers elements whose value is small because of cancellation.
 *  - gradients: relative Frobenius ||gpu - cpu|| / ||cpu|| < 2e-2 (several bf16 roundings of P, dS
 *    and the outputs, plus cancellation in dS = P (dP - D)).
 *  - flash against the materialising GPU version: relative Frobenius < 2e-2 for out, dq, dk, dv
 *    (both are bf16 approximations of the same values, each ~3e-3 from the reference). */
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
#include "gpu_worker/cuda/cu_flash.h"
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

/* n random bf16 values in [lo, hi): bits in hb, their exact float values in hf (hf may be NULL). */
static void rand_bf16(uint16_t *hb, float *hf, size_t n, uint64_t *st, float lo, float hi)
{
    for (size_t i = 0; i < n; i++) {
        hb[i] = fy_f32_to_bf16(fy_test_uniform(st, lo, hi));
        if (hf)
            hf[i] = fy_bf16_to_f32(hb[i]);
    }
}

static void bf16_to_f32_array(float *out, const uint16_t *in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = fy_bf16_to_f32(in[i]);
}

/* ||gpu - ref|| / ||ref|| (0 when both are 0); *max_abs gets max |gpu - ref| (NaN shows as NaN)
 * and *worst its index (the first NaN, if any). */
static double rel_frobenius(const float *gpu, const float *ref, size_t n, double *max_abs,
                            size_t *worst)
{
    double e = 0.0, r = 0.0, m = 0.0;
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)gpu[i] - (double)ref[i];
        e += d * d;
        r += (double)ref[i] * ref[i];
        if (!(fabs(d) <= m) && !isnan(m)) { /* NaN propagates into m and stays */
            m = fabs(d);
            w = i;
        }
    }
    if (max_abs)
        *max_abs = m;
    if (worst)
        *worst = w;
    if (r == 0.0)
        return e == 0.0 ? 0.0 : INFINITY;
    return sqrt(e / r);
}

/* Where element i of a [B][T][C] tensor lies: "b=.. t=.. h=.. d=..". */
static const char *where(size_t i, int T, int C, int NH)
{
    static char buf[96];
    int hs = C / NH, c = (int)(i % C);
    snprintf(buf, sizeof buf, "b=%zu t=%zu h=%d d=%d (t %% 64 = %zu)", i / ((size_t)T * C),
             (i / C) % T, c / hs, c % hs, ((i / C) % T) % 64);
    return buf;
}

/* Element-wise output check on a [B][T][C] tensor; returns the number of violations and prints the
 * first few with their position. */
static size_t check_elementwise(const char *what, const float *gpu, const float *ref, int B, int T,
                                int C, int NH)
{
    size_t n = (size_t)B * T * C;
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
                print_message("  %s[%s]: gpu %.7g cpu %.7g |diff| %.3g > tol %.3g\n", what,
                              where(i, T, C, NH), (double)gpu[i], (double)ref[i], d, tol);
            bad++;
        }
    }
    return bad;
}

/* dst [B*T][C] = columns s*C..(s+1)*C-1 of src [B*T][3C] (s = 0: q, 1: k, 2: v). */
static void take_third(float *dst, const float *src, size_t BT, int C, int s)
{
    for (size_t bt = 0; bt < BT; bt++)
        memcpy(dst + bt * C, src + bt * 3 * C + (size_t)s * C, (size_t)C * sizeof(float));
}

/* First index where two bf16 buffers differ (n if none). */
static size_t first_diff(const uint16_t *a, const uint16_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i])
            return i;
    return n;
}

struct dev {
    bf16 *qkv, *out, *dout, *dqkv;
    void *scratch;
    size_t sbytes;
    int32_t *pos; /* documents (gpu_worker/backend.h's positions), or NULL */
};

static void dev_alloc(struct dev *d, const uint16_t *qkv_b, const uint16_t *dout_b, size_t nqkv,
                      size_t nout, size_t sbytes)
{
    CK(cudaMalloc(&d->qkv, nqkv * 2));
    CK(cudaMalloc(&d->out, nout * 2));
    CK(cudaMalloc(&d->dout, nout * 2));
    CK(cudaMalloc(&d->dqkv, nqkv * 2));
    CK(cudaMalloc(&d->scratch, sbytes));
    d->sbytes = sbytes;
    d->pos = NULL;
    CK(cudaMemcpy(d->qkv, qkv_b, nqkv * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d->dout, dout_b, nout * 2, cudaMemcpyHostToDevice));
}

static void dev_free(struct dev *d)
{
    CK(cudaFree(d->qkv));
    CK(cudaFree(d->out));
    CK(cudaFree(d->dout));
    CK(cudaFree(d->dqkv));
    CK(cudaFree(d->scratch));
    CK(cudaFree(d->pos));
}

/* One flash forward + backward on poisoned outputs (and scratch before the forward); results to
 * host out_h [nout], dqkv_h [nqkv] (bf16 bits). */
static void run_flash(struct dev *d, uint16_t *out_h, uint16_t *dqkv_h, int B, int T, int C,
                      int NH)
{
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    CK(cudaMemsetAsync(d->out, 0xff, nout * 2, g_stream));
    CK(cudaMemsetAsync(d->scratch, 0xff, d->sbytes, g_stream));
    if (d->pos == NULL)
        assert_int_equal(fy_cu_flash_forward(d->out, d->qkv, d->scratch, B, T, C, NH, g_stream), 0);
    else /* multi-head: the grouped-query kernels with a kv head per query head */
        assert_int_equal(fy_cu_flash_window_forward(d->out, d->qkv, d->scratch, B, T, NH, NH,
                                                    C / NH, 0, d->pos, g_stream),
                         0);
    CK(cudaMemsetAsync(d->dqkv, 0xff, nqkv * 2, g_stream));
    if (d->pos == NULL)
        assert_int_equal(fy_cu_flash_backward(d->dqkv, d->dout, d->out, d->qkv, d->scratch, B, T, C,
                                              NH, g_stream),
                         0);
    else
        assert_int_equal(fy_cu_flash_window_backward(d->dqkv, d->dout, d->out, d->qkv, d->scratch,
                                                     B, T, NH, NH, C / NH, 0, d->pos, g_stream),
                         0);
    CK(cudaStreamSynchronize(g_stream));
    CK(cudaGetLastError());
    CK(cudaMemcpy(out_h, d->out, nout * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(dqkv_h, d->dqkv, nqkv * 2, cudaMemcpyDeviceToHost));
}

/* The materialising version (cu_attention.cu) on the same inputs (documents too: d_pos, device,
 * or NULL), same poisoning. */
static void run_materialising(const bf16 *d_qkv, const bf16 *d_dout, const int32_t *d_pos,
                              uint16_t *out_h, uint16_t *dqkv_h, int B, int T, int C, int NH)
{
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    size_t sbytes = fy_cu_attention_scratch_bytes(B, T, C, NH);
    assert_true(sbytes > 0);
    bf16 *out, *dqkv;
    void *scratch;
    CK(cudaMalloc(&out, nout * 2));
    CK(cudaMalloc(&dqkv, nqkv * 2));
    CK(cudaMalloc(&scratch, sbytes));
    CK(cudaMemsetAsync(out, 0xff, nout * 2, g_stream));
    CK(cudaMemsetAsync(dqkv, 0xff, nqkv * 2, g_stream));
    CK(cudaMemsetAsync(scratch, 0xff, sbytes, g_stream));
    assert_int_equal(
        fy_cu_attention_forward(g_lt, out, d_qkv, d_pos, scratch, B, T, C, NH, g_stream), 0);
    assert_int_equal(fy_cu_attention_backward(g_lt, dqkv, d_dout, d_qkv, scratch, B, T, C, NH,
                                              g_stream),
                     0);
    CK(cudaStreamSynchronize(g_stream));
    CK(cudaGetLastError());
    CK(cudaMemcpy(out_h, out, nout * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(dqkv_h, dqkv, nqkv * 2, cudaMemcpyDeviceToHost));
    CK(cudaFree(out));
    CK(cudaFree(dqkv));
    CK(cudaFree(scratch));
}

/* Flash against the materialising version: relative Frobenius of out, dq, dk, dv; asserts < 2e-2. */
static void compare_versions(const uint16_t *fo, const uint16_t *fd, const uint16_t *mo,
                             const uint16_t *md, int B, int T, int C, int NH)
{
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, BT = (size_t)B * T;
    float *a = (float *)malloc(nqkv * 4), *b = (float *)malloc(nqkv * 4);
    float *a3 = (float *)malloc(nout * 4), *b3 = (float *)malloc(nout * 4);
    assert_true(a && b && a3 && b3);
    const char *names[4] = {"out", "dq", "dk", "dv"};
    double rel[4], mx[4];
    size_t worst[4];
    bf16_to_f32_array(a, fo, nout);
    bf16_to_f32_array(b, mo, nout);
    rel[0] = rel_frobenius(a, b, nout, &mx[0], &worst[0]);
    bf16_to_f32_array(a, fd, nqkv);
    bf16_to_f32_array(b, md, nqkv);
    double dv_rms = 0.0;
    for (int s = 0; s < 3; s++) {
        take_third(a3, a, BT, C, s);
        take_third(b3, b, BT, C, s);
        rel[s + 1] = rel_frobenius(a3, b3, nout, &mx[s + 1], &worst[s + 1]);
        if (s == 2)
            for (size_t i = 0; i < nout; i++)
                dv_rms += (double)b3[i] * b3[i] / (double)nout;
    }
    dv_rms = sqrt(dv_rms);
    for (int s = 1; s < 3; s++) /* zero in the materialising version: as in flash_case */
        if (isinf(rel[s]) && mx[s] <= ldexp(dv_rms, -8))
            rel[s] = 0.0;
    print_message("flash vs materialising B=%d T=%d C=%d NH=%d: out max_abs %.3g rel_frob %.3g; "
                  "dq max_abs %.3g rel_frob %.3g; dk max_abs %.3g rel_frob %.3g; dv max_abs %.3g "
                  "rel_frob %.3g\n",
                  B, T, C, NH, mx[0], rel[0], mx[1], rel[1], mx[2], rel[2], mx[3], rel[3]);
    for (int s = 0; s < 4; s++)
        if (!(rel[s] < 2e-2))
            fail_msg("flash vs materialising B=%d T=%d C=%d NH=%d: %s relative Frobenius %.3g >= "
                     "2e-2 (largest difference at %s)",
                     B, T, C, NH, names[s], rel[s], where(worst[s], T, C, NH));
    free(a);
    free(b);
    free(a3);
    free(b3);
}

/* ---- flash against the CPU ---- */

/* pos (host [B][T], NULL: none): documents, each query seeing only its own document's keys. */
static void flash_case(int B, int T, int C, int NH, uint64_t seed, int vs_materialising,
                       const int32_t *pos = NULL)
{
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, BT = (size_t)B * T;
    size_t natt = (size_t)B * NH * T * T;
    uint64_t st = seed;
    assert_true(fy_cu_flash_supported(C, NH));
    uint16_t *qkv_b = (uint16_t *)malloc(nqkv * 2), *dout_b = (uint16_t *)malloc(nout * 2);
    float *qkv_f = (float *)malloc(nqkv * 4), *dout_f = (float *)malloc(nout * 4);
    float *out_ref = (float *)malloc(nout * 4), *att_ref = (float *)malloc(natt * 4);
    float *dqkv_ref = (float *)malloc(nqkv * 4);
    float *out_f = (float *)malloc(nout * 4), *dqkv_f = (float *)malloc(nqkv * 4);
    float *g3 = (float *)malloc(nout * 4), *r3 = (float *)malloc(nout * 4);
    uint16_t *out_g[2], *dqkv_g[2];
    for (int k = 0; k < 2; k++) {
        out_g[k] = (uint16_t *)malloc(nout * 2);
        dqkv_g[k] = (uint16_t *)malloc(nqkv * 2);
        assert_true(out_g[k] && dqkv_g[k]);
    }
    assert_true(qkv_b && dout_b && qkv_f && dout_f && out_ref && att_ref && dqkv_ref && out_f &&
                dqkv_f && g3 && r3);
    rand_bf16(qkv_b, qkv_f, nqkv, &st, -2.0f, 2.0f);
    rand_bf16(dout_b, dout_f, nout, &st, -1.0f, 1.0f);

    fy_cpu_attention_forward(out_ref, att_ref, qkv_f, pos, B, T, C, NH);
    fy_cpu_attention_backward(dqkv_ref, dout_f, qkv_f, att_ref, pos, B, T, C, NH);

    size_t sbytes = fy_cu_flash_scratch_bytes(B, T, C, NH);
    assert_true(sbytes > 0);
    assert_int_equal(sbytes % 256, 0);
    struct dev d;
    dev_alloc(&d, qkv_b, dout_b, nqkv, nout, sbytes);
    if (pos != NULL) {
        CK(cudaMalloc(&d.pos, BT * sizeof(int32_t)));
        CK(cudaMemcpy(d.pos, pos, BT * sizeof(int32_t), cudaMemcpyHostToDevice));
    }
    for (int k = 0; k < 2; k++)
        run_flash(&d, out_g[k], dqkv_g[k], B, T, C, NH);

    bf16_to_f32_array(out_f, out_g[0], nout);
    bf16_to_f32_array(dqkv_f, dqkv_g[0], nqkv);
    double out_max, out_rel = rel_frobenius(out_f, out_ref, nout, &out_max, NULL);
    size_t out_bad = check_elementwise("out", out_f, out_ref, B, T, C, NH);

    const char *names[3] = {"dq", "dk", "dv"};
    double rel[3], mx[3];
    size_t worst[3];
    double dv_rms = 0.0;
    for (int s = 0; s < 3; s++) {
        take_third(g3, dqkv_f, BT, C, s);
        take_third(r3, dqkv_ref, BT, C, s);
        rel[s] = rel_frobenius(g3, r3, nout, &mx[s], &worst[s]);
        if (s == 2)
            for (size_t i = 0; i < nout; i++)
                dv_rms += (double)r3[i] * r3[i] / (double)nout;
    }
    dv_rms = sqrt(dv_rms);
    /* A gradient that is exactly zero (every token alone: dS = P (dP - D) with P = 1 and
     * dP = D) has no scale of its own: the GPU's dP and D, each of dv's size, are rounded in
     * another order, so it is held to 2^-8 of dv's rms element by element instead. */
    for (int s = 0; s < 2; s++)
        if (isinf(rel[s]) && mx[s] <= ldexp(dv_rms, -8)) {
            print_message("  %s is zero in the reference: max |gpu| %.3g <= 2^-8 rms(dv) %.3g\n",
                          names[s], mx[s], ldexp(dv_rms, -8));
            rel[s] = 0.0;
        }
    size_t diff_out = first_diff(out_g[0], out_g[1], nout);
    size_t diff_dqkv = first_diff(dqkv_g[0], dqkv_g[1], nqkv);
    print_message("flash B=%d T=%d C=%d NH=%d (hs %d)%s: out max_abs_err %.3g rel_frob %.3g (%zu "
                  "over tol); dq max_abs %.3g rel_frob %.3g; dk max_abs %.3g rel_frob %.3g; dv "
                  "max_abs %.3g rel_frob %.3g; rerun identical: out %s dqkv %s\n",
                  B, T, C, NH, C / NH, pos ? " documents" : "", out_max, out_rel, out_bad, mx[0],
                  rel[0], mx[1], rel[1], mx[2], rel[2], diff_out == nout ? "yes" : "NO",
                  diff_dqkv == nqkv ? "yes" : "NO");
    for (int s = 0; s < 3; s++)
        if (!(rel[s] < 2e-2)) {
            size_t i = worst[s];
            take_third(g3, dqkv_f, BT, C, s);
            take_third(r3, dqkv_ref, BT, C, s);
            print_message("  %s worst at %s: gpu %.7g cpu %.7g\n", names[s], where(i, T, C, NH),
                          (double)g3[i], (double)r3[i]);
        }
    if (diff_out != nout)
        print_message("  out reruns first differ at %s\n", where(diff_out, T, C, NH));
    if (diff_dqkv != nqkv)
        print_message("  dqkv reruns first differ at element %zu (b*T+t = %zu, column %zu of 3C)\n",
                      diff_dqkv, diff_dqkv / (3 * (size_t)C), diff_dqkv % (3 * (size_t)C));
    assert_int_equal(out_bad, 0);
    for (int s = 0; s < 3; s++)
        if (!(rel[s] < 2e-2))
            fail_msg("flash B=%d T=%d C=%d NH=%d: %s relative Frobenius %.3g >= 2e-2", B, T, C, NH,
                     names[s], rel[s]);
    assert_true(diff_out == nout);
    assert_true(diff_dqkv == nqkv);

    if (vs_materialising) {
        uint16_t *mo = (uint16_t *)malloc(nout * 2), *md = (uint16_t *)malloc(nqkv * 2);
        assert_true(mo && md);
        run_materialising(d.qkv, d.dout, d.pos, mo, md, B, T, C, NH);
        compare_versions(out_g[0], dqkv_g[0], mo, md, B, T, C, NH);
        free(mo);
        free(md);
    }

    dev_free(&d);
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
    free(g3);
    free(r3);
}

static void test_flash_vs_cpu(void **state)
{
    (void)state;
    flash_case(1, 1, 16, 2, 301, 0);    /* hs 8 (padded to 16), a single position */
    flash_case(2, 7, 16, 2, 302, 0);    /* one partial tile */
    flash_case(2, 65, 64, 4, 303, 0);   /* hs 16, a tail of one row */
    flash_case(1, 256, 128, 2, 304, 0); /* hs 64, whole tiles */
    flash_case(2, 200, 160, 2, 305, 1); /* hs 80 (5 MMA k steps), tail of 8; also vs cu_attention */
    flash_case(1, 129, 256, 2, 306, 0); /* hs 128, the largest shared-memory configuration */
    flash_case(1, 1024, 128, 1, 307, 0); /* 16 tiles of keys per query block */
}

/* Positions of documents packed in rows of T (gpu_worker/backend.h), the lengths of each row from
 * lens in turn (row b starting at lens[b % n]), the last cut at the row's end. */
static int32_t *doc_positions(int B, int T, const int *lens, int n)
{
    int32_t *pos = (int32_t *)malloc((size_t)B * T * sizeof *pos);
    assert_non_null(pos);
    for (int b = 0; b < B; b++)
        for (int t = 0, p = 0, k = b % n, len = lens[b % n]; t < T; t++, p++) {
            if (p == len) {
                p = 0;
                len = lens[++k % n];
            }
            pos[(size_t)b * T + t] = p;
        }
    return pos;
}

/* Documents: documents starting mid-tile, single-token ones (a row's padding), one across several
 * tiles, others on tile boundaries; against the CPU with the same documents, and against the
 * materialising version given them too. */
static void test_flash_documents(void **state)
{
    (void)state;
    static const int mixed[] = {1, 5, 60, 1, 90, 40, 1, 1, 1, 100}, edges[] = {64, 64, 128, 44};
    static const int single[] = {1}, whole[] = {1024};
    int32_t *p = doc_positions(2, 300, mixed, 10);
    flash_case(2, 300, 128, 2, 311, 1, p); /* hs 64; also vs cu_attention */
    flash_case(2, 300, 160, 2, 312, 0, p); /* hs 80 */
    free(p);
    p = doc_positions(2, 300, edges, 4);
    flash_case(2, 300, 256, 2, 313, 0, p); /* hs 128 */
    free(p);
    p = doc_positions(1, 130, single, 1);
    flash_case(1, 130, 64, 4, 314, 1, p); /* every token alone */
    free(p);
    p = doc_positions(1, 1024, whole, 1);
    flash_case(1, 1024, 128, 1, 315, 0, p); /* one document the whole row: causal */
    free(p);
}

/* ---- shapes it refuses ---- */

static void test_flash_unsupported(void **state)
{
    (void)state;
    assert_true(fy_cu_flash_supported(16, 2));    /* hs 8 */
    assert_true(fy_cu_flash_supported(48, 2));    /* hs 24 */
    assert_true(fy_cu_flash_supported(1024, 8));  /* hs 128 */
    assert_false(fy_cu_flash_supported(24, 2));   /* hs 12: not a multiple of 8 */
    assert_false(fy_cu_flash_supported(272, 2));  /* hs 136 > 128 */
    assert_false(fy_cu_flash_supported(30, 4));   /* C not a multiple of NH */
    assert_false(fy_cu_flash_supported(16, 0));
    assert_int_equal(fy_cu_flash_scratch_bytes(1, 8, 24, 2), 0);
    assert_int_equal(fy_cu_flash_scratch_bytes(1, 0, 16, 2), 0);
    print_message("(two error lines about unsupported shapes are expected next)\n");
    assert_int_equal(fy_cu_flash_forward(NULL, NULL, NULL, 1, 8, 24, 2, g_stream), -EINVAL);
    assert_int_equal(fy_cu_flash_backward(NULL, NULL, NULL, NULL, NULL, 1, 8, 272, 2, g_stream),
                     -EINVAL);
}

/* ---- timing against the materialising version ---- */

#define TIME_REPS 10

static void timing_case(int B, int T, int C, int NH)
{
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    uint64_t st = 401;
    uint16_t *qkv_b = (uint16_t *)malloc(nqkv * 2), *dout_b = (uint16_t *)malloc(nout * 2);
    uint16_t *fo[2], *fd[2];
    for (int k = 0; k < 2; k++) {
        fo[k] = (uint16_t *)malloc(nout * 2);
        fd[k] = (uint16_t *)malloc(nqkv * 2);
        assert_true(fo[k] && fd[k]);
    }
    uint16_t *mo = (uint16_t *)malloc(nout * 2), *md = (uint16_t *)malloc(nqkv * 2);
    assert_true(qkv_b && dout_b && mo && md);
    rand_bf16(qkv_b, NULL, nqkv, &st, -2.0f, 2.0f);
    rand_bf16(dout_b, NULL, nout, &st, -1.0f, 1.0f);

    struct dev d;
    dev_alloc(&d, qkv_b, dout_b, nqkv, nout, fy_cu_flash_scratch_bytes(B, T, C, NH));
    size_t msbytes = fy_cu_attention_scratch_bytes(B, T, C, NH);
    bf16 *m_out, *m_dqkv;
    void *m_scratch;
    CK(cudaMalloc(&m_out, nout * 2));
    CK(cudaMalloc(&m_dqkv, nqkv * 2));
    CK(cudaMalloc(&m_scratch, msbytes));

    /* warm-up and results: flash (poisoned, run_flash) and materialising */
    run_flash(&d, fo[0], fd[0], B, T, C, NH);
    run_materialising(d.qkv, d.dout, NULL, mo, md, B, T, C, NH);

    cudaEvent_t e0, e1, e2;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventCreate(&e2));
    float ms_ff, ms_fb, ms_mf, ms_mb;
    /* flash: TIME_REPS forwards, then TIME_REPS backwards (each uses the last forward's L) */
    CK(cudaEventRecord(e0, g_stream));
    for (int r = 0; r < TIME_REPS; r++)
        assert_int_equal(fy_cu_flash_forward(d.out, d.qkv, d.scratch, B, T, C, NH, g_stream), 0);
    CK(cudaEventRecord(e1, g_stream));
    for (int r = 0; r < TIME_REPS; r++)
        assert_int_equal(fy_cu_flash_backward(d.dqkv, d.dout, d.out, d.qkv, d.scratch, B, T, C, NH,
                                              g_stream),
                         0);
    CK(cudaEventRecord(e2, g_stream));
    CK(cudaEventSynchronize(e2));
    CK(cudaEventElapsedTime(&ms_ff, e0, e1));
    CK(cudaEventElapsedTime(&ms_fb, e1, e2));
    CK(cudaMemcpy(fo[1], d.out, nout * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(fd[1], d.dqkv, nqkv * 2, cudaMemcpyDeviceToHost));
    /* materialising (its backward reads only att, which the backward does not modify) */
    assert_int_equal(
        fy_cu_attention_forward(g_lt, m_out, d.qkv, NULL, m_scratch, B, T, C, NH, g_stream), 0);
    CK(cudaEventRecord(e0, g_stream));
    for (int r = 0; r < TIME_REPS; r++)
        assert_int_equal(
            fy_cu_attention_forward(g_lt, m_out, d.qkv, NULL, m_scratch, B, T, C, NH, g_stream), 0);
    CK(cudaEventRecord(e1, g_stream));
    for (int r = 0; r < TIME_REPS; r++)
        assert_int_equal(fy_cu_attention_backward(g_lt, m_dqkv, d.dout, d.qkv, m_scratch, B, T, C,
                                                  NH, g_stream),
                         0);
    CK(cudaEventRecord(e2, g_stream));
    CK(cudaEventSynchronize(e2));
    CK(cudaEventElapsedTime(&ms_mf, e0, e1));
    CK(cudaEventElapsedTime(&ms_mb, e1, e2));
    CK(cudaGetLastError());

    /* useful causal flops: forward 2 products of BH T^2/2 hs multiply-adds; backward 5 */
    double hs = (double)C / NH, bh = (double)B * NH, tt = (double)T * T / 2.0;
    double f_fwd = 2.0 * 2.0 * bh * tt * hs, f_bwd = 5.0 * 2.0 * bh * tt * hs;
    ms_ff /= TIME_REPS;
    ms_fb /= TIME_REPS;
    ms_mf /= TIME_REPS;
    ms_mb /= TIME_REPS;
    print_message("timing B=%d T=%d C=%d NH=%d (hs %d), mean of %d: flash forward %.3f ms (%.1f "
                  "TFLOP/s causal) backward %.3f ms (%.1f TFLOP/s); materialising forward %.3f ms "
                  "backward %.3f ms; scratch flash %zu bytes, materialising %zu bytes\n",
                  B, T, C, NH, (int)hs, TIME_REPS, ms_ff, f_fwd / (ms_ff * 1e9), ms_fb,
                  f_bwd / (ms_fb * 1e9), ms_mf, ms_mb, d.sbytes, msbytes);

    size_t diff_out = first_diff(fo[0], fo[1], nout), diff_dqkv = first_diff(fd[0], fd[1], nqkv);
    print_message("flash B=%d T=%d C=%d NH=%d: reruns identical: out %s dqkv %s\n", B, T, C, NH,
                  diff_out == nout ? "yes" : "NO", diff_dqkv == nqkv ? "yes" : "NO");
    compare_versions(fo[0], fd[0], mo, md, B, T, C, NH);
    assert_true(diff_out == nout);
    assert_true(diff_dqkv == nqkv);

    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaEventDestroy(e2));
    CK(cudaFree(m_out));
    CK(cudaFree(m_dqkv));
    CK(cudaFree(m_scratch));
    dev_free(&d);
    for (int k = 0; k < 2; k++) {
        free(fo[k]);
        free(fd[k]);
    }
    free(mo);
    free(md);
    free(qkv_b);
    free(dout_b);
}

static void test_flash_timing(void **state)
{
    (void)state;
    timing_case(4, 1024, 1024, 8);  /* hs 128 (GPT-3 1.3B: C 2048, NH 16) */
    timing_case(4, 1024, 1280, 16); /* hs 80 (GPT-3 2.7B: C 2560, NH 32) */
}

int main(void)
{
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("test_cu_flash: SKIPPED: no usable CUDA device\n");
        return FY_TEST_SKIP;
    }
    void *ws = NULL;
    if (cudaMalloc(&ws, WORKSPACE_BYTES) != cudaSuccess ||
        cudaStreamCreate(&g_stream) != cudaSuccess || fy_cu_lt_new(&g_lt, ws, WORKSPACE_BYTES) != 0) {
        printf("test_cu_flash: FAILED: cannot set up the workspace, stream or cuBLASLt handle\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flash_vs_cpu),
        cmocka_unit_test(test_flash_documents),
        cmocka_unit_test(test_flash_unsupported),
        cmocka_unit_test(test_flash_timing),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fy_cu_lt_destroy(&g_lt);
    cudaStreamDestroy(g_stream);
    cudaFree(ws);
    return rc;
}
