/* The reference operations of the CPU backend that every family's file uses (cpu_gpt2.c,
 * cpu_llama.c): vector helpers, the matrix products and the LM head with its cross-entropy. fp32,
 * OpenMP, written to be read. Every function gives bit-identical results whatever the number of
 * OpenMP threads: each output element is computed by one thread in a fixed order (no reductions
 * split across threads), so multi-process and in-process runs, and runs on different machines,
 * agree. Matrices are [out][in]: y = x W^T + b. */
#ifndef FY_CPU_OPS_H
#define FY_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Small vector helpers (inline, so each call site vectorises as before; C only, as `restrict`
 * is). */
#ifndef __cplusplus

/* Eight partial sums in a fixed order: gives the compiler independent lanes to vectorise without
 * making the result depend on anything but n. */
static inline float fy_cpu_dot(const float *a, const float *b, int n)
{
    float s[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
#pragma omp simd
        for (int k = 0; k < 8; k++)
            s[k] += a[i + k] * b[i + k];
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++)
        r += a[i] * b[i];
    return r;
}

/* y += a * x. Each element is independent, so vectorising changes nothing; the pragma lets -O2
 * do it without a runtime aliasing check. */
static inline void fy_cpu_axpy(float *restrict y, const float *restrict x, float a, int n)
{
#pragma omp simd
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* out = a + b, element by element (threads split the range; each element is independent). */
static inline void fy_cpu_add(float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}
#endif

/* Documents in a row (gpu_worker/backend_ops.h's positions [B][T]; NULL: positions t, one document
 * a row): the position of row-major token n (= b T + t), and the first token of row b that token t
 * sees, the start of its document, t - positions[b][t] (0 without positions). */
static inline int fy_cpu_position(const int32_t *positions, size_t n, int T)
{
    return positions != NULL ? positions[n] : (int)(n % (size_t)T);
}

static inline int fy_cpu_document_start(const int32_t *positions, int b, int t, int T)
{
    return positions != NULL ? t - positions[(size_t)b * T + t] : 0;
}

/* out[n][o] = sum_i inp[n][i] * w[o][i] + (bias ? bias[o] : 0) */
void fy_cpu_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                           int IN, int OUT);
/* dinp (overwritten, may be NULL), dw and dbias (accumulated +=, dbias may be NULL) */
void fy_cpu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                            const float *w, int N, int IN, int OUT);

/* Rows of logits a head holds at once (its logits scratch is FY_CPU_HEAD_CHUNK * V floats). */
#define FY_CPU_HEAD_CHUNK 64
/* The LM head and mean cross-entropy on normalised rows xn [N][C] with the head matrix w [V][C]
 * (logits = xn w^T; a target < 0 is ignored, the mean is over the others); returns the loss.
 * logits: FY_CPU_HEAD_CHUNK * V floats of scratch. With dxn != NULL also back-propagates: dxn
 * overwritten, dw accumulated (+=). */
float fy_cpu_xent_head(const float *xn, const float *w, const int32_t *targets, int N, int C, int V,
                       float *logits, float *dxn, float *dw);

#ifdef __cplusplus
}
#endif

#endif
