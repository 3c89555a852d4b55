/* The reference operations that every family's file of the CPU backend uses: the matrix products
 * and the LM head with its cross-entropy, in fp32 (see cpu_ops.h).
 *
 * Determinism: every loop that OpenMP splits runs over independent outputs (rows, output
 * features), with schedule(static), and each output element is accumulated by one thread in a
 * fixed order. Sums that run over rows (weight and bias gradients) are therefore parallelised over
 * the element they produce and loop over the rows inside, in order. The build uses
 * -ffp-contract=off, so no fused multiply-adds change the rounding either. */
#include "cpu_ops.h"

#include <math.h>
#include <string.h>

/* ---- matmul ---- */

void fy_cpu_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                           int IN, int OUT)
{
#pragma omp parallel for collapse(2) schedule(static)
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OUT; o++) {
            float s = fy_cpu_dot(inp + (size_t)n * IN, w + (size_t)o * IN, IN);
            out[(size_t)n * OUT + o] = bias ? s + bias[o] : s;
        }
}

void fy_cpu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                            const float *w, int N, int IN, int OUT)
{
    if (dinp) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            float *di = dinp + (size_t)n * IN;
            memset(di, 0, (size_t)IN * sizeof *di);
            for (int o = 0; o < OUT; o++)
                fy_cpu_axpy(di, w + (size_t)o * IN, dout[(size_t)n * OUT + o], IN);
        }
    }
    /* dw[o] = sum over rows n: one thread per output row o, rows n in order. */
#pragma omp parallel for schedule(static)
    for (int o = 0; o < OUT; o++) {
        float *dwo = dw + (size_t)o * IN;
        float db = 0.0f;
        for (int n = 0; n < N; n++) {
            float d = dout[(size_t)n * OUT + o];
            fy_cpu_axpy(dwo, inp + (size_t)n * IN, d, IN);
            db += d;
        }
        if (dbias)
            dbias[o] += db;
    }
}

/* ---- the LM head and cross-entropy ---- */

float fy_cpu_xent_head(const float *xn_all, const float *w, const int32_t *targets, int N, int C,
                       int V, float *logits, float *dxn, float *dw)
{
    int backward = dxn != NULL;
    int count = 0;
    for (int n = 0; n < N; n++)
        count += targets[n] >= 0;
    float inv_count = count > 0 ? 1.0f / (float)count : 0.0f;

    /* Chunks run in order, so every dwte element sums its rows in the same order whatever the
     * threads; within a chunk, per-row losses are summed serially in double. */
    double loss_sum = 0.0;
    for (int r0 = 0; r0 < N; r0 += FY_CPU_HEAD_CHUNK) {
        int R = N - r0 < FY_CPU_HEAD_CHUNK ? N - r0 : FY_CPU_HEAD_CHUNK;
        const float *xn = xn_all + (size_t)r0 * C;
        fy_cpu_matmul_forward(logits, xn, w, NULL, R, C, V);
        double row_loss[FY_CPU_HEAD_CHUNK];
#pragma omp parallel for schedule(static)
        for (int r = 0; r < R; r++) {
            float *z = logits + (size_t)r * V;
            int32_t target = targets[r0 + r];
            row_loss[r] = 0.0;
            if (target < 0) {
                if (backward)
                    memset(z, 0, (size_t)V * sizeof *z);
                continue;
            }
            float maxv = z[0];
            for (int v = 1; v < V; v++)
                if (z[v] > maxv)
                    maxv = z[v];
            double sum = 0.0;
            for (int v = 0; v < V; v++)
                sum += exp((double)z[v] - maxv);
            row_loss[r] = log(sum) + maxv - z[target]; /* -log softmax[target] */
            if (backward) {
                /* dlogits = (softmax - onehot) / count, written over the logits */
                for (int v = 0; v < V; v++)
                    z[v] = (float)(exp((double)z[v] - maxv) / sum) * inv_count;
                z[target] -= inv_count;
            }
        }
        for (int r = 0; r < R; r++)
            loss_sum += row_loss[r];
        if (backward)
            fy_cpu_matmul_backward(dxn + (size_t)r0 * C, dw, NULL, logits, xn, w, R, C, V);
    }

    return count > 0 ? (float)(loss_sum / count) : 0.0f;
}
