/* The Llama decoder block (RMSNorm, RoPE, grouped-query causal attention, SwiGLU MLP), the final
 * RMSNorm and the model pieces in fp32 on the CPU: the readable reference for the Llama family, in
 * the conventions of cpu_gpt2.c (see cpu_llama.h for the maths and the buffer rules); its table for
 * the backend at the end.
 *
 * Determinism: every loop that OpenMP splits runs over independent outputs (rows, (b,t), (b,h),
 * (b, kv head), channels), with schedule(static), and each output element is accumulated by one
 * thread in a fixed order; sums over rows (weight gradients) are parallelised over the element they
 * produce. The build uses -ffp-contract=off, so no fused multiply-adds change the rounding. */
#include "cpu_llama.h"

#include <math.h>
#include <string.h>

#include "common/model/arch/arch.h"
#include "common/model/arch/llama.h"
#include "cpu_ops.h"

/* ---- rotary frequencies ---- */

/* Each step in fp32 as transformers computes it (a Python scalar meeting an fp32 tensor is rounded
 * to fp32 first), so that the frequencies agree to the last bit or so. */
void fy_cpu_llama_rope_inv_freq(const struct fy_model_config *m, float *inv_freq)
{
    const struct fy_llama_fields *c = fy_llama(m);
    int hd = (int)fy_llama_head_dim(m), half = hd / 2;
    float base = (float)c->rope_theta;
    for (int i = 0; i < half; i++)
        inv_freq[i] = 1.0f / powf(base, (float)(2 * i) / (float)hd);
    if (c->rope_type != FY_ROPE_LLAMA3)
        return;
    float factor = (float)c->rope_factor, low = (float)c->rope_low_freq_factor;
    float old_len = (float)c->rope_orig_max_pos;
    float low_wavelen = (float)(c->rope_orig_max_pos / c->rope_low_freq_factor);
    float high_wavelen = (float)(c->rope_orig_max_pos / c->rope_high_freq_factor);
    float span = (float)(c->rope_high_freq_factor - c->rope_low_freq_factor);
    for (int i = 0; i < half; i++) {
        float f = inv_freq[i], wavelen = (float)(2.0 * M_PI) / f;
        if (wavelen > low_wavelen) {
            inv_freq[i] = f / factor; /* long wavelengths: interpolated */
        } else if (!(wavelen < high_wavelen)) {
            float s = (old_len / wavelen - low) / span; /* between: a smooth blend */
            inv_freq[i] = (1.0f - s) * f / factor + s * f;
        } /* short wavelengths: unchanged */
    }
}

/* ---- RMSNorm ---- */

/* One row of C: y = w * (x * r); returns r. */
static float rmsnorm_row(float *y, const float *x, const float *w, int C, float eps)
{
    float r = 1.0f / sqrtf(fy_cpu_dot(x, x, C) / (float)C + eps);
    for (int i = 0; i < C; i++)
        y[i] = w[i] * (x[i] * r);
    return r;
}

/* dx of one row from dy (dx may be dy: gx is summed before any dx is written). */
static void rmsnorm_row_backward(float *dx, const float *dy, const float *x, const float *w,
                                 float r, int C)
{
    float gx = 0.0f;
    for (int i = 0; i < C; i++)
        gx += dy[i] * w[i] * (x[i] * r);
    gx /= (float)C;
    for (int i = 0; i < C; i++)
        dx[i] = r * (dy[i] * w[i] - (x[i] * r) * gx);
}

void fy_cpu_llama_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N,
                                  int C, float eps)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        rstd[n] = rmsnorm_row(out + (size_t)n * C, inp + (size_t)n * C, w, C, eps);
}

void fy_cpu_llama_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                                   const float *w, const float *rstd, int N, int C)
{
    /* With xhat = x r and g = dout w: dx = r (g - xhat mean(g xhat)); dw = sum over rows dout xhat. */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        rmsnorm_row_backward(dinp + (size_t)n * C, dout + (size_t)n * C, inp + (size_t)n * C, w,
                             rstd[n], C);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < C; i++) {
        float gw = 0.0f;
        for (int n = 0; n < N; n++)
            gw += dout[(size_t)n * C + i] * (inp[(size_t)n * C + i] * rstd[n]);
        dw[i] += gw;
    }
}

void fy_cpu_llama_head_norm_forward(float *out, float *rstd, const float *inp, const float *w,
                                    int stride, int col, int NHx, int hd, int N, float eps)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int h = 0; h < NHx; h++) {
            size_t at = (size_t)n * stride + col + (size_t)h * hd;
            rstd[(size_t)n * NHx + h] = rmsnorm_row(out + at, inp + at, w, hd, eps);
        }
}

void fy_cpu_llama_head_norm_backward(float *dx, float *dw, const float *inp, const float *w,
                                     const float *rstd, int stride, int col, int NHx, int hd, int N)
{
    /* dw first, while dx still holds the gradient of the output: one thread per weight element,
     * the rows and heads in order. */
#pragma omp parallel for schedule(static)
    for (int i = 0; i < hd; i++) {
        float gw = 0.0f;
        for (int n = 0; n < N; n++)
            for (int h = 0; h < NHx; h++) {
                size_t at = (size_t)n * stride + col + (size_t)h * hd + i;
                gw += dx[at] * (inp[at] * rstd[(size_t)n * NHx + h]);
            }
        dw[i] += gw;
    }
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int h = 0; h < NHx; h++) {
            size_t at = (size_t)n * stride + col + (size_t)h * hd;
            rmsnorm_row_backward(dx + at, dx + at, inp + at, w, rstd[(size_t)n * NHx + h], hd);
        }
}

/* ---- rotary position embeddings ---- */

void fy_cpu_llama_rope_table(float *cos_t, float *sin_t, const float *inv_freq, int T, int half)
{
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            float a = (float)t * inv_freq[i];
            cos_t[(size_t)t * half + i] = cosf(a);
            sin_t[(size_t)t * half + i] = sinf(a);
        }
}

/* sign +1: the forward rotation by +angle; -1: its transpose (rotation by -angle). Row n rotates by
 * its position (t, or positions[n]: the table's row, which exists as positions[n] <= t). */
static void rope_apply(float *x, int stride, int col, int NHx, int hd, const float *cos_t,
                       const float *sin_t, const int32_t *positions, int B, int T, float sign)
{
    int half = hd / 2;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < B * T; n++) {
        size_t at = (size_t)fy_cpu_position(positions, (size_t)n, T) * half;
        const float *cs = cos_t + at, *sn = sin_t + at;
        for (int h = 0; h < NHx; h++) {
            float *v = x + (size_t)n * stride + col + (size_t)h * hd;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half], s = sign * sn[i];
                v[i] = a * cs[i] - b * s;
                v[i + half] = b * cs[i] + a * s;
            }
        }
    }
}

void fy_cpu_llama_rope_forward(float *x, int stride, int col, int NHx, int hd, const float *cos_t,
                               const float *sin_t, const int32_t *positions, int B, int T)
{
    rope_apply(x, stride, col, NHx, hd, cos_t, sin_t, positions, B, T, 1.0f);
}

void fy_cpu_llama_rope_backward(float *dx, int stride, int col, int NHx, int hd, const float *cos_t,
                                const float *sin_t, const int32_t *positions, int B, int T)
{
    rope_apply(dx, stride, col, NHx, hd, cos_t, sin_t, positions, B, T, -1.0f);
}

/* ---- causal grouped-query attention ---- */

/* The first key position query t of row b sees: t - W + 1 with a window W, else 0; and no earlier
 * than the start of its document (positions, NULL: none). */
static int window_start(const int32_t *positions, int b, int t, int T, int W)
{
    int lo = W > 0 && t - W + 1 > 0 ? t - W + 1 : 0;
    int doc = fy_cpu_document_start(positions, b, t, T);
    return doc > lo ? doc : lo;
}

void fy_cpu_llama_attention_forward(float *out, float *att, const float *qkv, int B, int T, int NH,
                                    int NKV, int hd)
{
    fy_cpu_llama_attention_window_forward(out, att, qkv, NULL, B, T, NH, NKV, hd, 0);
}

void fy_cpu_llama_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                     const float *att, int B, int T, int NH, int NKV, int hd)
{
    fy_cpu_llama_attention_window_backward(dqkv, dout, qkv, att, NULL, B, T, NH, NKV, hd, 0);
}

void fy_cpu_llama_attention_window_forward(float *out, float *att, const float *qkv,
                                           const int32_t *positions, int B, int T, int NH, int NKV,
                                           int hd, int W)
{
    size_t QKV = (size_t)(NH + 2 * NKV) * hd, QC = (size_t)NH * hd;
    int rep = NH / NKV;
    float scale = (float)(1.0 / sqrt((double)hd)); /* transformers: head_dim ** -0.5, then fp32 */
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *seq = qkv + (size_t)b * T * QKV;
                size_t ko = QC + (size_t)(h / rep) * hd, vo = ko + (size_t)NKV * hd;
                const float *q = seq + t * QKV + (size_t)h * hd;
                float *p = att + (((size_t)b * NH + h) * T + t) * T;
                int lo = window_start(positions, b, t, T, W);
                float maxv = -INFINITY;
                for (int t2 = 0; t2 < lo; t2++)
                    p[t2] = 0.0f;
                for (int t2 = lo; t2 <= t; t2++) {
                    p[t2] = fy_cpu_dot(q, seq + t2 * QKV + ko, hd) * scale;
                    if (p[t2] > maxv)
                        maxv = p[t2];
                }
                float sum = 0.0f;
                for (int t2 = lo; t2 <= t; t2++) {
                    p[t2] = expf(p[t2] - maxv);
                    sum += p[t2];
                }
                for (int t2 = lo; t2 <= t; t2++)
                    p[t2] /= sum;
                for (int t2 = t + 1; t2 < T; t2++)
                    p[t2] = 0.0f;
                float *y = out + ((size_t)b * T + t) * QC + (size_t)h * hd;
                memset(y, 0, (size_t)hd * sizeof *y);
                for (int t2 = lo; t2 <= t; t2++)
                    fy_cpu_axpy(y, seq + t2 * QKV + vo, p[t2], hd);
            }
}

void fy_cpu_llama_attention_window_backward(float *dqkv, const float *dout, const float *qkv,
                                            const float *att, const int32_t *positions, int B,
                                            int T, int NH, int NKV, int hd, int W)
{
    size_t QKV = (size_t)(NH + 2 * NKV) * hd, QC = (size_t)NH * hd;
    int rep = NH / NKV;
    float scale = (float)(1.0 / sqrt((double)hd));
    /* The dk and dv of a kv head sum over its rep query heads and all later queries, so one thread
     * owns a whole (b, kv head) and walks its query heads, then the queries, in order. */
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int g = 0; g < NKV; g++) {
            const float *seq = qkv + (size_t)b * T * QKV;
            float *dseq = dqkv + (size_t)b * T * QKV;
            size_t ko = QC + (size_t)g * hd, vo = ko + (size_t)NKV * hd;
            for (int t = 0; t < T; t++) {
                memset(dseq + t * QKV + (size_t)g * rep * hd, 0, (size_t)rep * hd * sizeof(float));
                memset(dseq + t * QKV + ko, 0, (size_t)hd * sizeof(float));
                memset(dseq + t * QKV + vo, 0, (size_t)hd * sizeof(float));
            }
            float datt[T];
            for (int h = g * rep; h < (g + 1) * rep; h++) {
                size_t qo = (size_t)h * hd;
                for (int t = 0; t < T; t++) {
                    const float *p = att + (((size_t)b * NH + h) * T + t) * T;
                    const float *dy = dout + ((size_t)b * T + t) * QC + qo;
                    int lo = window_start(positions, b, t, T, W);
                    float pdatt = 0.0f;
                    for (int t2 = lo; t2 <= t; t2++) {
                        datt[t2] = fy_cpu_dot(dy, seq + t2 * QKV + vo, hd);
                        pdatt += p[t2] * datt[t2];
                    }
                    for (int t2 = lo; t2 <= t; t2++) {
                        float dpre = p[t2] * (datt[t2] - pdatt) * scale;
                        fy_cpu_axpy(dseq + t * QKV + qo, seq + t2 * QKV + ko, dpre, hd);
                        fy_cpu_axpy(dseq + t2 * QKV + ko, seq + t * QKV + qo, dpre, hd);
                        fy_cpu_axpy(dseq + t2 * QKV + vo, dy, p[t2], hd);
                    }
                }
            }
        }
}

/* ---- SwiGLU ---- */

void fy_cpu_llama_swiglu_forward(float *out, const float *gu, int N, int I)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = gu + (size_t)n * 2 * I, *u = g + I;
        float *o = out + (size_t)n * I;
        for (int i = 0; i < I; i++)
            o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

void fy_cpu_llama_swiglu_backward(float *dgu, const float *dout, const float *gu, int N, int I)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = gu + (size_t)n * 2 * I, *u = g + I, *d = dout + (size_t)n * I;
        float *dg = dgu + (size_t)n * 2 * I, *du = dg + I;
        for (int i = 0; i < I; i++) {
            float e = 1.0f + expf(-g[i]), s = 1.0f / e;
            du[i] = d[i] * (g[i] / e);
            dg[i] = d[i] * u[i] * (s * (1.0f + g[i] * (1.0f - s)));
        }
    }
}

/* ---- one decoder block ---- */

/* The block's scratch, carved from one float array: the forward internals first (what the backward
 * recomputes), then the gradient buffers the backward alone uses. */
struct block_buf {
    float *inv_freq, *cos_t, *sin_t; /* [hd/2], [T][hd/2], [T][hd/2] */
    float *n1, *rstd1;               /* [N][C], [N] */
    float *qkv_raw;                  /* [N][(NH + 2 NKV) hd] before the q/k norms (qk_norm only) */
    float *qk_rstd;                  /* [N][NH + NKV] the q/k norms' rstd (qk_norm only) */
    float *qkv;                      /* [N][(NH + 2 NKV) hd], q and k after RoPE */
    float *att;                      /* [B][NH][T][T] softmax probabilities */
    float *atty;                     /* [N][NH hd] attention output, before o_proj */
    float *h;                        /* [N][C] residual after attention */
    float *n2, *rstd2;               /* [N][C], [N] */
    float *gu;                       /* [N][2I] gate | up */
    float *act;                      /* [N][I] silu(gate) * up */
    float *dact;                     /* [N][I] */
    float *dgu;                      /* [N][2I] */
    float *dn2, *dh;                 /* [N][C] */
    float *datty;                    /* [N][NH hd] */
    float *dqkv;                     /* [N][(NH + 2 NKV) hd] */
    float *dn1;                      /* [N][C] */
    size_t total;                    /* floats */
};

static void block_carve(const struct fy_model_config *c, int B, int T, float *base,
                        struct block_buf *s)
{
    size_t C = c->n_embd, hd = fy_llama_head_dim(c), N = (size_t)B * T, I = fy_llama(c)->n_inter,
           at = 0;
    size_t QC = c->n_head * hd, QKV = (c->n_head + 2 * (size_t)fy_llama(c)->n_kv_head) * hd;
    size_t qk_norm = fy_llama(c)->qk_norm ? 1 : 0;
#define CARVE(field, n) (s->field = base ? base + at : NULL, at += (n))
    CARVE(inv_freq, hd / 2);
    CARVE(cos_t, (size_t)T * (hd / 2));
    CARVE(sin_t, (size_t)T * (hd / 2));
    CARVE(n1, N * C);
    CARVE(rstd1, N);
    CARVE(qkv_raw, qk_norm * N * QKV);
    CARVE(qk_rstd, qk_norm * N * (c->n_head + fy_llama(c)->n_kv_head));
    CARVE(qkv, N * QKV);
    CARVE(att, (size_t)B * c->n_head * T * T);
    CARVE(atty, N * QC);
    CARVE(h, N * C);
    CARVE(n2, N * C);
    CARVE(rstd2, N);
    CARVE(gu, N * 2 * I);
    CARVE(act, N * I);
    CARVE(dact, N * I);
    CARVE(dgu, N * 2 * I);
    CARVE(dn2, N * C);
    CARVE(dh, N * C);
    CARVE(datty, N * QC);
    CARVE(dqkv, N * QKV);
    CARVE(dn1, N * C);
#undef CARVE
    s->total = at;
}

size_t fy_cpu_llama_block_scratch(const struct fy_model_config *c, int B, int T)
{
    struct block_buf s;
    block_carve(c, B, T, NULL, &s);
    return s.total;
}

/* The forward pass, keeping every internal the backward needs in s. y == NULL: the recompute
 * for the backward, which stops before the down product (its output is never read there). */
static void block_forward_into(const struct fy_model_config *c, const float *params,
                               const int32_t *positions, const float *x, float *y,
                               const struct block_buf *s, int B, int T)
{
    struct fy_llama_unit_layout l;
    fy_llama_unit_layout(c, &l);
    const float *p = params;
    int C = (int)c->n_embd, NH = (int)c->n_head, NKV = (int)fy_llama(c)->n_kv_head;
    int hd = (int)fy_llama_head_dim(c), W = (int)fy_llama(c)->sliding_window;
    int I = (int)fy_llama(c)->n_inter, N = B * T, QKV = (NH + 2 * NKV) * hd;
    const float *qkv_bias = l.q_bias != FY_LLAMA_ABSENT ? p + l.q_bias : NULL;

    fy_cpu_llama_rope_inv_freq(c, s->inv_freq);
    fy_cpu_llama_rope_table(s->cos_t, s->sin_t, s->inv_freq, T, hd / 2);

    /* attention: h = x + o_proj(attention(rope(q), rope(k), v)), q k v of rmsnorm(x) (with their
     * biases; q and k each through its per-head RMSNorm, where the family has them) */
    fy_cpu_llama_rmsnorm_forward(s->n1, s->rstd1, x, p + l.input_norm, N, C, fy_llama(c)->rms_eps);
    if (fy_llama(c)->qk_norm) {
        fy_cpu_matmul_forward(s->qkv_raw, s->n1, p + l.q_proj, qkv_bias, N, C, QKV);
        memcpy(s->qkv, s->qkv_raw, (size_t)N * QKV * sizeof *s->qkv);
        fy_cpu_llama_head_norm_forward(s->qkv, s->qk_rstd, s->qkv_raw, p + l.q_norm, QKV, 0, NH, hd,
                                       N, fy_llama(c)->rms_eps);
        fy_cpu_llama_head_norm_forward(s->qkv, s->qk_rstd + (size_t)N * NH, s->qkv_raw,
                                       p + l.k_norm, QKV, NH * hd, NKV, hd, N,
                                       fy_llama(c)->rms_eps);
    } else {
        fy_cpu_matmul_forward(s->qkv, s->n1, p + l.q_proj, qkv_bias, N, C, QKV); /* q|k|v_proj */
    }
    fy_cpu_llama_rope_forward(s->qkv, QKV, 0, NH, hd, s->cos_t, s->sin_t, positions, B, T);
    fy_cpu_llama_rope_forward(s->qkv, QKV, NH * hd, NKV, hd, s->cos_t, s->sin_t, positions, B, T);
    fy_cpu_llama_attention_window_forward(s->atty, s->att, s->qkv, positions, B, T, NH, NKV, hd, W);
    fy_cpu_matmul_forward(s->h, s->atty, p + l.o_proj, NULL, N, NH * hd, C);
    fy_cpu_add(s->h, x, s->h, (size_t)N * C);

    /* MLP: y = h + down(silu(gate(n2)) * up(n2)), n2 = rmsnorm(h) */
    fy_cpu_llama_rmsnorm_forward(s->n2, s->rstd2, s->h, p + l.post_norm, N, C,
                                 fy_llama(c)->rms_eps);
    fy_cpu_matmul_forward(s->gu, s->n2, p + l.gate_proj, NULL, N, C, 2 * I); /* gate_proj|up_proj */
    fy_cpu_llama_swiglu_forward(s->act, s->gu, N, I);
    if (y == NULL)
        return;
    fy_cpu_matmul_forward(y, s->act, p + l.down_proj, NULL, N, I, C);
    fy_cpu_add(y, s->h, y, (size_t)N * C);
}

void fy_cpu_llama_block_forward(const struct fy_model_config *c, const float *params,
                                const int32_t *positions, const float *x, float *y, float *scratch,
                                int B, int T)
{
    struct block_buf s;
    block_carve(c, B, T, scratch, &s);
    block_forward_into(c, params, positions, x, y, &s, B, T);
}

void fy_cpu_llama_block_backward(const struct fy_model_config *c, const float *params,
                                 const int32_t *positions, const float *x, const float *dy,
                                 float *dx, float *dparams, float *scratch, int B, int T)
{
    struct block_buf s;
    block_carve(c, B, T, scratch, &s);
    struct fy_llama_unit_layout l;
    fy_llama_unit_layout(c, &l);
    const float *p = params;
    float *g = dparams;
    int C = (int)c->n_embd, NH = (int)c->n_head, NKV = (int)fy_llama(c)->n_kv_head;
    int hd = (int)fy_llama_head_dim(c), W = (int)fy_llama(c)->sliding_window;
    int I = (int)fy_llama(c)->n_inter, N = B * T, QKV = (NH + 2 * NKV) * hd;
    size_t NC = (size_t)N * C;
    float *dqkv_bias = l.q_bias != FY_LLAMA_ABSENT ? g + l.q_bias : NULL;

    block_forward_into(c, params, positions, x, NULL, &s, B, T);

    /* MLP branch */
    fy_cpu_matmul_backward(s.dact, g + l.down_proj, NULL, dy, s.act, p + l.down_proj, N, I, C);
    fy_cpu_llama_swiglu_backward(s.dgu, s.dact, s.gu, N, I);
    fy_cpu_matmul_backward(s.dn2, g + l.gate_proj, NULL, s.dgu, s.n2, p + l.gate_proj, N, C, 2 * I);
    fy_cpu_llama_rmsnorm_backward(s.dh, g + l.post_norm, s.dn2, s.h, p + l.post_norm, s.rstd2, N,
                                  C);
    fy_cpu_add(s.dh, s.dh, dy, NC); /* the residual path */

    /* attention branch */
    fy_cpu_matmul_backward(s.datty, g + l.o_proj, NULL, s.dh, s.atty, p + l.o_proj, N, NH * hd, C);
    fy_cpu_llama_attention_window_backward(s.dqkv, s.datty, s.qkv, s.att, positions, B, T, NH, NKV,
                                           hd, W);
    fy_cpu_llama_rope_backward(s.dqkv, QKV, 0, NH, hd, s.cos_t, s.sin_t, positions, B, T);
    fy_cpu_llama_rope_backward(s.dqkv, QKV, NH * hd, NKV, hd, s.cos_t, s.sin_t, positions, B, T);
    if (fy_llama(c)->qk_norm) {
        fy_cpu_llama_head_norm_backward(s.dqkv, g + l.q_norm, s.qkv_raw, p + l.q_norm, s.qk_rstd,
                                        QKV, 0, NH, hd, N);
        fy_cpu_llama_head_norm_backward(s.dqkv, g + l.k_norm, s.qkv_raw, p + l.k_norm,
                                        s.qk_rstd + (size_t)N * NH, QKV, NH * hd, NKV, hd, N);
    }
    fy_cpu_matmul_backward(s.dn1, g + l.q_proj, dqkv_bias, s.dqkv, s.n1, p + l.q_proj, N, C, QKV);
    fy_cpu_llama_rmsnorm_backward(dx, g + l.input_norm, s.dn1, x, p + l.input_norm, s.rstd1, N, C);
    fy_cpu_add(dx, dx, s.dh, NC);
}

/* ---- final norm ---- */

void fy_cpu_llama_norm_forward(const struct fy_model_config *c, const float *w, const float *x,
                               float *y, float *rstd, int B, int T)
{
    fy_cpu_llama_rmsnorm_forward(y, rstd, x, w, B * T, (int)c->n_embd, fy_llama(c)->rms_eps);
}

void fy_cpu_llama_norm_backward(const struct fy_model_config *c, const float *w, const float *x,
                                const float *rstd, const float *dy, float *dx, float *dw, int B,
                                int T)
{
    fy_cpu_llama_rmsnorm_backward(dx, dw, dy, x, w, rstd, B * T, (int)c->n_embd);
}

/* ---- model pieces: embeddings, final norm with the LM head ---- */

/* Channels per task in the embedding backward (as cpu_gpt2.c). */
#define EMBED_CHANNELS 16

void fy_cpu_llama_embed_forward(const struct fy_model_config *m, const float *embed,
                                const int32_t *tokens, float *x, int B, int T)
{
    size_t C = m->n_embd;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < B * T; n++)
        memcpy(x + (size_t)n * C, embed + (size_t)tokens[n] * C, C * sizeof *x);
}

void fy_cpu_llama_embed_backward(const struct fy_model_config *m, const int32_t *tokens,
                                 const float *dx, float *dembed, int B, int T)
{
    int C = (int)m->n_embd;
    /* A token may repeat, so a row sums over positions: split by channel, rows n in order. */
    int tasks = (C + EMBED_CHANNELS - 1) / EMBED_CHANNELS;
#pragma omp parallel for schedule(static)
    for (int k = 0; k < tasks; k++) {
        int c0 = k * EMBED_CHANNELS, c1 = c0 + EMBED_CHANNELS < C ? c0 + EMBED_CHANNELS : C;
        for (int n = 0; n < B * T; n++) {
            const float *d = dx + (size_t)n * C;
            float *te = dembed + (size_t)tokens[n] * C;
            for (int i = c0; i < c1; i++)
                te[i] += d[i];
        }
    }
}

struct head_buf {
    float *xn, *rstd; /* [N][C], [N] */
    float *dxn;       /* [N][C] */
    float *logits;    /* [FY_CPU_HEAD_CHUNK][V] */
    size_t total;
};

static void head_carve(const struct fy_model_config *m, int B, int T, float *base,
                       struct head_buf *s)
{
    size_t C = m->n_embd, N = (size_t)B * T, at = 0;
#define CARVE(field, n) (s->field = base ? base + at : NULL, at += (n))
    CARVE(xn, N * C);
    CARVE(rstd, N);
    CARVE(dxn, N * C);
    CARVE(logits, (size_t)FY_CPU_HEAD_CHUNK * m->vocab);
#undef CARVE
    s->total = at;
}

size_t fy_cpu_llama_head_scratch(const struct fy_model_config *m, int B, int T)
{
    struct head_buf s;
    head_carve(m, B, T, NULL, &s);
    return s.total;
}

float fy_cpu_llama_head_forward_backward(const struct fy_model_config *m, const float *final_params,
                                         const float *embed, const float *x, const int32_t *targets,
                                         float *dx, float *dfinal, float *dembed, float *scratch,
                                         int B, int T)
{
    struct head_buf s;
    head_carve(m, B, T, scratch, &s);
    int C = (int)m->n_embd, V = (int)m->vocab, N = B * T;
    size_t VC = (size_t)V * C;
    const float *norm_w = final_params;
    const float *head_w = fy_llama(m)->tied ? embed : final_params + C;
    int backward = dx != NULL;

    fy_cpu_llama_rmsnorm_forward(s.xn, s.rstd, x, norm_w, N, C, fy_llama(m)->rms_eps);
    float *dhead = NULL;
    if (backward) {
        memset(dembed, 0, VC * sizeof *dembed);
        memset(dfinal, 0, fy_model_unit_params(m, m->n_layer + 1) * sizeof *dfinal);
        dhead = fy_llama(m)->tied ? dembed : dfinal + C;
    }
    float loss =
        fy_cpu_xent_head(s.xn, head_w, targets, N, C, V, s.logits, backward ? s.dxn : NULL, dhead);
    if (backward)
        fy_cpu_llama_rmsnorm_backward(dx, dfinal, s.dxn, x, norm_w, s.rstd, N, C);
    return loss;
}

void fy_cpu_llama_logits(const struct fy_model_config *m, const float *final_params,
                         const float *embed, const float *x, float *logits, float *scratch, int B,
                         int T)
{
    struct head_buf s;
    head_carve(m, B, T, scratch, &s);
    int C = (int)m->n_embd, N = B * T;
    fy_cpu_llama_rmsnorm_forward(s.xn, s.rstd, x, final_params, N, C, fy_llama(m)->rms_eps);
    fy_cpu_matmul_forward(logits, s.xn, fy_llama(m)->tied ? embed : final_params + C, NULL, N, C,
                          (int)m->vocab);
}

/* ---- the family's table ---- */

/* The backend's block backward overwrites the parameter gradients; fy_cpu_llama_block_backward adds. */
static void block_backward_overwrite(const struct fy_model_config *c, const float *params,
                                     const int32_t *positions, const float *x, const float *dy,
                                     float *dx, float *dparams, float *scratch, int B, int T)
{
    struct fy_llama_unit_layout l;
    fy_llama_unit_layout(c, &l);
    memset(dparams, 0, l.total * sizeof *dparams);
    fy_cpu_llama_block_backward(c, params, positions, x, dy, dx, dparams, scratch, B, T);
}

/* The embeddings have no positions (RoPE rotates q and k in the blocks instead). */
static void embed_forward_unit(const struct fy_model_config *c, const float *embed,
                               const int32_t *tokens, const int32_t *positions, float *x, int B,
                               int T)
{
    (void)positions;
    fy_cpu_llama_embed_forward(c, embed, tokens, x, B, T);
}

static void embed_backward_unit(const struct fy_model_config *c, const int32_t *tokens,
                                const int32_t *positions, const float *dx, float *dembed, int B,
                                int T)
{
    (void)positions;
    fy_cpu_llama_embed_backward(c, tokens, dx, dembed, B, T);
}

/* Its blocks always recompute their internals: no swapped internals, no per-op profile. Every
 * Llama-like family (Qwen2, Qwen3, Mistral, Phi-3) is computed here: its variations are fields of
 * fy_llama(c) (common/model/arch/llama.h), so it needs no check. */
const struct fy_cpu_family fy_cpu_llama_family = {
    .block_scratch = fy_cpu_llama_block_scratch,
    .head_scratch = fy_cpu_llama_head_scratch,
    .embed_forward = embed_forward_unit,
    .embed_backward = embed_backward_unit,
    .block_forward = fy_cpu_llama_block_forward,
    .block_backward = block_backward_overwrite,
    .head = fy_cpu_llama_head_forward_backward,
    .logits = fy_cpu_llama_logits,
};
