/* The GPT-2 family in fp32 on the CPU (see gpt2_cpu.h): the readable reference that the CUDA
 * backend is checked against, and the compute of the CPU backend for tiny models; its table for
 * the backend at the end.
 *
 * Determinism: every loop that OpenMP splits runs over independent outputs (rows, (b,t), (b,h),
 * channels, vocabulary rows), with schedule(static), and each output element is accumulated by one
 * thread in a fixed order. Sums that run over rows (weight, bias and embedding gradients) are
 * therefore parallelised over the element they produce and loop over the rows inside, in order.
 * The build uses -ffp-contract=off, so no fused multiply-adds change the rounding either. */
#include "gpt2_cpu.h"

#include <math.h>
#include <string.h>

#include "common/model/arch/gpt2.h"
#include "common/ipc/desc.h"

#define LN_EPS 1e-5f
/* Channels per task in the embedding backward: a cache line of floats, so that threads seldom share
 * a line (any grouping would be deterministic; this one is also cache friendly). */
#define EMBED_CHANNELS 16

/* ---- LayerNorm ---- */

void fy_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                              const float *b, int N, int C)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *y = out + (size_t)n * C;
        float m = 0.0f;
        for (int i = 0; i < C; i++)
            m += x[i];
        m /= (float)C;
        float v = 0.0f;
        for (int i = 0; i < C; i++)
            v += (x[i] - m) * (x[i] - m);
        v /= (float)C; /* biased, as in GPT-2 */
        float s = 1.0f / sqrtf(v + LN_EPS);
        for (int i = 0; i < C; i++)
            y[i] = (x[i] - m) * s * w[i] + b[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

void fy_cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                               const float *w, const float *mean, const float *rstd, int N, int C)
{
    /* dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), with dxhat = dout * w. */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        float m = mean[n], s = rstd[n];
        float dxhat_mean = 0.0f, dxhat_xhat_mean = 0.0f;
        for (int i = 0; i < C; i++) {
            float xhat = (x[i] - m) * s, dxhat = dy[i] * w[i];
            dxhat_mean += dxhat;
            dxhat_xhat_mean += dxhat * xhat;
        }
        dxhat_mean /= (float)C;
        dxhat_xhat_mean /= (float)C;
        for (int i = 0; i < C; i++) {
            float xhat = (x[i] - m) * s, dxhat = dy[i] * w[i];
            dx[i] = s * (dxhat - dxhat_mean - xhat * dxhat_xhat_mean);
        }
    }
    /* dw and db sum over rows: one thread per channel. */
#pragma omp parallel for schedule(static)
    for (int i = 0; i < C; i++) {
        float gw = 0.0f, gb = 0.0f;
        for (int n = 0; n < N; n++) {
            float dy = dout[(size_t)n * C + i];
            gw += dy * (inp[(size_t)n * C + i] - mean[n]) * rstd[n];
            gb += dy;
        }
        dw[i] += gw;
        db[i] += gb;
    }
}

/* ---- causal self-attention, each document to itself ---- */

void fy_cpu_attention_forward(float *out, float *att, const float *qkv, const int32_t *positions,
                              int B, int T, int C, int NH)
{
    int hs = C / NH;
    size_t C3 = 3 * (size_t)C;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *seq = qkv + (size_t)b * T * C3;
                const float *q = seq + t * C3 + (size_t)h * hs;
                float *p = att + (((size_t)b * NH + h) * T + t) * T;
                int lo = fy_cpu_document_start(positions, b, t, T);
                float maxv = -INFINITY;
                for (int t2 = 0; t2 < lo; t2++)
                    p[t2] = 0.0f; /* another document's */
                for (int t2 = lo; t2 <= t; t2++) {
                    p[t2] = fy_cpu_dot(q, seq + t2 * C3 + C + (size_t)h * hs, hs) * scale;
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
                    p[t2] = 0.0f; /* masked: kept zero so att is a full, well-defined matrix */
                float *y = out + ((size_t)b * T + t) * C + (size_t)h * hs;
                memset(y, 0, (size_t)hs * sizeof *y);
                for (int t2 = lo; t2 <= t; t2++)
                    fy_cpu_axpy(y, seq + t2 * C3 + 2 * (size_t)C + (size_t)h * hs, p[t2], hs);
            }
}

void fy_cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                               const int32_t *positions, int B, int T, int C, int NH)
{
    int hs = C / NH;
    size_t C3 = 3 * (size_t)C;
    float scale = 1.0f / sqrtf((float)hs);
    /* dk and dv of a position sum over all later queries, so one thread owns a whole (b, h) and
     * walks the queries t in order; heads write disjoint columns of dqkv. */
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *seq = qkv + (size_t)b * T * C3;
            float *dseq = dqkv + (size_t)b * T * C3;
            size_t qo = (size_t)h * hs, ko = C + qo, vo = 2 * (size_t)C + qo;
            for (int t = 0; t < T; t++) {
                memset(dseq + t * C3 + qo, 0, (size_t)hs * sizeof(float));
                memset(dseq + t * C3 + ko, 0, (size_t)hs * sizeof(float));
                memset(dseq + t * C3 + vo, 0, (size_t)hs * sizeof(float));
            }
            float datt[T]; /* one row of dL/dprobabilities: T floats of this thread's stack */
            for (int t = 0; t < T; t++) {
                const float *p = att + (((size_t)b * NH + h) * T + t) * T;
                const float *dy = dout + ((size_t)b * T + t) * C + qo;
                int lo = fy_cpu_document_start(positions, b, t, T);
                /* softmax backward: dpre = p * (datt - sum(p * datt)) */
                float pdatt = 0.0f;
                for (int t2 = lo; t2 <= t; t2++) {
                    datt[t2] = fy_cpu_dot(dy, seq + t2 * C3 + vo, hs);
                    pdatt += p[t2] * datt[t2];
                }
                for (int t2 = lo; t2 <= t; t2++) {
                    float dpre = p[t2] * (datt[t2] - pdatt) * scale;
                    fy_cpu_axpy(dseq + t * C3 + qo, seq + t2 * C3 + ko, dpre, hs);
                    fy_cpu_axpy(dseq + t2 * C3 + ko, seq + t * C3 + qo, dpre, hs);
                    fy_cpu_axpy(dseq + t2 * C3 + vo, dy, p[t2], hs);
                }
            }
        }
}

/* ---- GELU (tanh approximation) ---- */

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

void fy_cpu_gelu_forward(float *out, const float *inp, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_A * x * x * x)));
    }
}

void fy_cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float th = tanhf(GELU_K * (x + GELU_A * x * x * x));
        float dth = (1.0f - th * th) * GELU_K * (1.0f + 3.0f * GELU_A * x * x);
        dinp[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * x * dth);
    }
}

/* ---- embeddings ---- */

void fy_cpu_embed_forward(const struct fy_model_config *c, const float *embed,
                          const int32_t *tokens, const int32_t *positions, float *x, int B, int T)
{
    size_t C = c->n_embd;
    const float *wpe = embed + (size_t)c->vocab * C;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < B * T; n++) {
        const float *te = embed + (size_t)tokens[n] * C;
        const float *pe = wpe + (size_t)fy_cpu_position(positions, n, T) * C;
        for (size_t i = 0; i < C; i++)
            x[(size_t)n * C + i] = te[i] + pe[i];
    }
}

void fy_cpu_embed_backward(const struct fy_model_config *c, const int32_t *tokens,
                           const int32_t *positions, const float *dx, float *dembed, int B, int T)
{
    int C = (int)c->n_embd;
    float *dwte = dembed, *dwpe = dembed + (size_t)c->vocab * C;
    /* A token may repeat, so a wte row sums over positions: split by channel, rows n in order. */
    int tasks = (C + EMBED_CHANNELS - 1) / EMBED_CHANNELS;
#pragma omp parallel for schedule(static)
    for (int k = 0; k < tasks; k++) {
        int c0 = k * EMBED_CHANNELS, c1 = c0 + EMBED_CHANNELS < C ? c0 + EMBED_CHANNELS : C;
        for (int n = 0; n < B * T; n++) {
            const float *d = dx + (size_t)n * C;
            float *te = dwte + (size_t)tokens[n] * C;
            float *pe = dwpe + (size_t)fy_cpu_position(positions, n, T) * C;
            for (int i = c0; i < c1; i++) {
                te[i] += d[i];
                pe[i] += d[i];
            }
        }
    }
}

/* ---- one transformer block ---- */

/* The block's scratch, carved from one float array. The forward internals come first (what the
 * backward recomputes), then the gradient buffers the backward alone uses. */
struct block_buf {
    float *ln1, *ln1_mean, *ln1_rstd; /* [N][C], [N], [N] */
    float *qkv;                       /* [N][3C] */
    float *att;                       /* [B][NH][T][T] softmax probabilities */
    float *atty;                      /* [N][C] attention output, before its projection */
    float *y1;                        /* [N][C] residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd; /* [N][C], [N], [N] */
    float *fc;                        /* [N][4C] before GELU */
    float *gelu;                      /* [N][4C] */
    float *dgelu, *dfc;               /* [N][4C] */
    float *dln2, *dy1, *datty;        /* [N][C] */
    float *dqkv;                      /* [N][3C] */
    float *dln1;                      /* [N][C] */
    size_t total;                     /* floats */
};

static void block_carve(const struct fy_model_config *c, int B, int T, float *base, struct block_buf *s)
{
    size_t C = c->n_embd, N = (size_t)B * T, at = 0;
#define CARVE(field, n) (s->field = base ? base + at : NULL, at += (n))
    CARVE(ln1, N * C);
    CARVE(ln1_mean, N);
    CARVE(ln1_rstd, N);
    CARVE(qkv, N * 3 * C);
    CARVE(att, (size_t)B * c->n_head * T * T);
    CARVE(atty, N * C);
    CARVE(y1, N * C);
    CARVE(ln2, N * C);
    CARVE(ln2_mean, N);
    CARVE(ln2_rstd, N);
    CARVE(fc, N * 4 * C);
    CARVE(gelu, N * 4 * C);
    CARVE(dgelu, N * 4 * C);
    CARVE(dfc, N * 4 * C);
    CARVE(dln2, N * C);
    CARVE(dy1, N * C);
    CARVE(datty, N * C);
    CARVE(dqkv, N * 3 * C);
    CARVE(dln1, N * C);
#undef CARVE
    s->total = at;
}

size_t fy_cpu_block_scratch(const struct fy_model_config *c, int B, int T)
{
    struct block_buf s;
    block_carve(c, B, T, NULL, &s);
    return s.total;
}


/* The forward pass, keeping every internal the backward needs in s, except the kinds in `have`
 * (a mask of common/model/actplan.h kinds), which s holds already. y == NULL: the recompute for the
 * backward, which stops before the MLP's down product (its output is never read there). */
static void block_forward_into(const struct fy_model_config *c, const float *params,
                               const int32_t *positions, const float *x, float *y,
                               const struct block_buf *s, unsigned have, int B, int T)
{
    struct fy_gpt2_block_layout l;
    fy_gpt2_block_layout(c, &l);
    const float *p = params;
    int C = (int)c->n_embd, NH = (int)c->n_head, N = B * T;

    fy_cpu_layernorm_forward(s->ln1, s->ln1_mean, s->ln1_rstd, x, p + l.ln1_w, p + l.ln1_b, N, C);
    if (!(have & FY_ACT_BIT(FY_ACT_QKV)))
        fy_cpu_matmul_forward(s->qkv, s->ln1, p + l.qkv_w, p + l.qkv_b, N, C, 3 * C);
    if (!(have & FY_ACT_BIT(FY_ACT_ATTN)))
        fy_cpu_attention_forward(s->atty, s->att, s->qkv, positions, B, T, C, NH);
    if (!(have & FY_ACT_BIT(FY_ACT_RESID))) {
        fy_cpu_matmul_forward(s->y1, s->atty, p + l.attn_w, p + l.attn_b, N, C, C);
        fy_cpu_add(s->y1, s->y1, x, (size_t)N * C);
    }

    fy_cpu_layernorm_forward(s->ln2, s->ln2_mean, s->ln2_rstd, s->y1, p + l.ln2_w, p + l.ln2_b, N, C);
    if (!(have & FY_ACT_BIT(FY_ACT_FC)))
        fy_cpu_matmul_forward(s->fc, s->ln2, p + l.fc_w, p + l.fc_b, N, C, 4 * C);
    if (!(have & FY_ACT_BIT(FY_ACT_GELU)))
        fy_cpu_gelu_forward(s->gelu, s->fc, (size_t)N * 4 * C);
    if (y == NULL)
        return;
    fy_cpu_matmul_forward(y, s->gelu, p + l.proj_w, p + l.proj_b, N, 4 * C, C);
    fy_cpu_add(y, y, s->y1, (size_t)N * C);
}

/* The pieces of scratch that each swappable kind is, in the order of its saved layout (ATTN: the
 * attention output, then the probabilities). */
static int kind_pieces(const struct fy_model_config *c, const struct block_buf *s, int kind, int B,
                       int T, float *piece[2], size_t n[2])
{
    size_t C = c->n_embd, N = (size_t)B * T;
    piece[1] = NULL;
    n[1] = 0;
    switch (kind) {
    case FY_ACT_QKV: piece[0] = s->qkv, n[0] = N * 3 * C; return 1;
    case FY_ACT_ATTN:
        piece[0] = s->atty, n[0] = N * C;
        piece[1] = s->att, n[1] = (size_t)B * c->n_head * T * T;
        return 2;
    case FY_ACT_RESID: piece[0] = s->y1, n[0] = N * C; return 1;
    case FY_ACT_FC: piece[0] = s->fc, n[0] = N * 4 * C; return 1;
    case FY_ACT_GELU: piece[0] = s->gelu, n[0] = N * 4 * C; return 1;
    default: return 0;
    }
}

/* Between the scratch and the saved buffers: out (forward) or in (backward); returns the mask of
 * kinds moved. */
static unsigned move_saved(const struct fy_model_config *c, const struct block_buf *s,
                           void *const *saved, int out, int B, int T)
{
    unsigned mask = 0;
    for (int k = 0; saved != NULL && k < FY_ACT_KINDS; k++) {
        float *piece[2];
        size_t n[2];
        int pieces = saved[k] != NULL ? kind_pieces(c, s, k, B, T, piece, n) : 0;
        float *at = saved[k];
        for (int i = 0; i < pieces; i++) {
            if (out)
                memcpy(at, piece[i], n[i] * sizeof(float));
            else
                memcpy(piece[i], at, n[i] * sizeof(float));
            at += n[i];
        }
        mask |= pieces > 0 ? FY_ACT_BIT(k) : 0;
    }
    return mask;
}

void fy_cpu_block_op_times(const struct fy_model_config *c, const float *params, const float *x,
                           float *scratch, int B, int T, double op_s[FY_ACT_KINDS])
{
    struct block_buf s;
    block_carve(c, B, T, scratch, &s);
    struct fy_gpt2_block_layout l;
    fy_gpt2_block_layout(c, &l);
    const float *p = params;
    int C = (int)c->n_embd, NH = (int)c->n_head, N = B * T;
    memset(op_s, 0, FY_ACT_KINDS * sizeof *op_s);
    double t = 1e-9 * (double)fy_monotonic_ns(), t1;
#define LAP(kind) (t1 = 1e-9 * (double)fy_monotonic_ns(), op_s[kind] += t1 - t, t = t1)
    fy_cpu_layernorm_forward(s.ln1, s.ln1_mean, s.ln1_rstd, x, p + l.ln1_w, p + l.ln1_b, N, C);
    LAP(FY_ACT_LN1);
    fy_cpu_matmul_forward(s.qkv, s.ln1, p + l.qkv_w, p + l.qkv_b, N, C, 3 * C);
    LAP(FY_ACT_QKV);
    fy_cpu_attention_forward(s.atty, s.att, s.qkv, NULL, B, T, C, NH);
    LAP(FY_ACT_ATTN);
    fy_cpu_matmul_forward(s.y1, s.atty, p + l.attn_w, p + l.attn_b, N, C, C);
    fy_cpu_add(s.y1, s.y1, x, (size_t)N * C);
    LAP(FY_ACT_RESID);
    fy_cpu_layernorm_forward(s.ln2, s.ln2_mean, s.ln2_rstd, s.y1, p + l.ln2_w, p + l.ln2_b, N, C);
    LAP(FY_ACT_LN2);
    fy_cpu_matmul_forward(s.fc, s.ln2, p + l.fc_w, p + l.fc_b, N, C, 4 * C);
    LAP(FY_ACT_FC);
    fy_cpu_gelu_forward(s.gelu, s.fc, (size_t)N * 4 * C);
    LAP(FY_ACT_GELU);
#undef LAP
}

void fy_cpu_block_forward(const struct fy_model_config *c, const float *params,
                          const int32_t *positions, const float *x, float *y, float *scratch,
                          void *const *saved, int B, int T)
{
    struct block_buf s;
    block_carve(c, B, T, scratch, &s);
    block_forward_into(c, params, positions, x, y, &s, 0, B, T);
    move_saved(c, &s, saved, 1, B, T);
}

void fy_cpu_block_backward(const struct fy_model_config *c, const float *params,
                           const int32_t *positions, const float *x, const float *dy, float *dx,
                           float *dparams, float *scratch, void *const *saved, int B, int T)
{
    struct block_buf s;
    block_carve(c, B, T, scratch, &s);
    struct fy_gpt2_block_layout l;
    fy_gpt2_block_layout(c, &l);
    const float *p = params;
    float *g = dparams;
    int C = (int)c->n_embd, NH = (int)c->n_head, N = B * T;
    size_t NC = (size_t)N * C;

    block_forward_into(c, params, positions, x, NULL, &s, move_saved(c, &s, saved, 0, B, T), B, T);
    memset(dparams, 0, l.total * sizeof *dparams);

    /* MLP branch: y = y1 + proj(gelu(fc(ln2(y1)))) */
    fy_cpu_matmul_backward(s.dgelu, g + l.proj_w, g + l.proj_b, dy, s.gelu, p + l.proj_w, N, 4 * C, C);
    fy_cpu_gelu_backward(s.dfc, s.fc, s.dgelu, (size_t)N * 4 * C);
    fy_cpu_matmul_backward(s.dln2, g + l.fc_w, g + l.fc_b, s.dfc, s.ln2, p + l.fc_w, N, C, 4 * C);
    fy_cpu_layernorm_backward(s.dy1, g + l.ln2_w, g + l.ln2_b, s.dln2, s.y1, p + l.ln2_w, s.ln2_mean,
                              s.ln2_rstd, N, C);
    fy_cpu_add(s.dy1, s.dy1, dy, NC); /* the residual path */

    /* attention branch: y1 = x + attn_proj(attention(qkv(ln1(x)))) */
    fy_cpu_matmul_backward(s.datty, g + l.attn_w, g + l.attn_b, s.dy1, s.atty, p + l.attn_w, N, C, C);
    fy_cpu_attention_backward(s.dqkv, s.datty, s.qkv, s.att, positions, B, T, C, NH);
    fy_cpu_matmul_backward(s.dln1, g + l.qkv_w, g + l.qkv_b, s.dqkv, s.ln1, p + l.qkv_w, N, C, 3 * C);
    fy_cpu_layernorm_backward(dx, g + l.ln1_w, g + l.ln1_b, s.dln1, x, p + l.ln1_w, s.ln1_mean,
                              s.ln1_rstd, N, C);
    fy_cpu_add(dx, dx, s.dy1, NC);
}

/* ---- final LayerNorm, tied LM head and cross-entropy ---- */

struct head_buf {
    float *xn, *mean, *rstd; /* [N][C], [N], [N] */
    float *dxn;              /* [N][C] */
    float *logits;           /* [FY_CPU_HEAD_CHUNK][V], becomes dlogits in the backward */
    size_t total;
};

static void head_carve(const struct fy_model_config *c, int B, int T, float *base, struct head_buf *s)
{
    size_t C = c->n_embd, N = (size_t)B * T, at = 0;
#define CARVE(field, n) (s->field = base ? base + at : NULL, at += (n))
    CARVE(xn, N * C);
    CARVE(mean, N);
    CARVE(rstd, N);
    CARVE(dxn, N * C);
    CARVE(logits, (size_t)FY_CPU_HEAD_CHUNK * c->vocab);
#undef CARVE
    s->total = at;
}

size_t fy_cpu_head_scratch(const struct fy_model_config *c, int B, int T)
{
    struct head_buf s;
    head_carve(c, B, T, NULL, &s);
    return s.total;
}

float fy_cpu_head_forward_backward(const struct fy_model_config *c, const float *final_params,
                                   const float *embed, const float *x, const int32_t *targets,
                                   float *dx, float *dfinal, float *dembed, float *scratch, int B,
                                   int T)
{
    struct head_buf s;
    head_carve(c, B, T, scratch, &s);
    int C = (int)c->n_embd, V = (int)c->vocab, N = B * T;
    const float *lnf_w = final_params, *lnf_b = final_params + C;
    const float *wte = embed;
    int backward = dx != NULL;

    fy_cpu_layernorm_forward(s.xn, s.mean, s.rstd, x, lnf_w, lnf_b, N, C);
    if (backward)
        memset(dembed, 0, ((size_t)V + c->ctx) * C * sizeof *dembed);
    float loss = fy_cpu_xent_head(s.xn, wte, targets, N, C, V, s.logits, backward ? s.dxn : NULL,
                                  dembed);

    if (backward) {
        memset(dfinal, 0, 2 * (size_t)C * sizeof *dfinal);
        fy_cpu_layernorm_backward(dx, dfinal, dfinal + C, s.dxn, x, lnf_w, s.mean, s.rstd, N, C);
    }
    return loss;
}

void fy_cpu_logits(const struct fy_model_config *c, const float *final_params, const float *embed,
                   const float *x, float *logits, float *scratch, int B, int T)
{
    struct head_buf s;
    head_carve(c, B, T, scratch, &s);
    int C = (int)c->n_embd, N = B * T;
    fy_cpu_layernorm_forward(s.xn, s.mean, s.rstd, x, final_params, final_params + C, N, C);
    fy_cpu_matmul_forward(logits, s.xn, embed, NULL, N, C, (int)c->vocab);
}

/* ---- the family's table ---- */

/* The block without swapped internals: every internal recomputed. */
static void block_forward_plain(const struct fy_model_config *c, const float *params,
                                const int32_t *positions, const float *x, float *y, float *scratch,
                                int B, int T)
{
    fy_cpu_block_forward(c, params, positions, x, y, scratch, NULL, B, T);
}

static void block_backward_plain(const struct fy_model_config *c, const float *params,
                                 const int32_t *positions, const float *x, const float *dy,
                                 float *dx, float *dparams, float *scratch, int B, int T)
{
    fy_cpu_block_backward(c, params, positions, x, dy, dx, dparams, scratch, NULL, B, T);
}

/* The QKV product: N rows of C times a [3C][C] matrix. */
static double qkv_flops(const struct fy_model_config *c, int B, int T)
{
    double C = c->n_embd, N = (double)B * T;
    return 2 * N * C * 3 * C;
}

const struct fy_cpu_family fy_gpt2_cpu_family = {
    .block_scratch = fy_cpu_block_scratch,
    .head_scratch = fy_cpu_head_scratch,
    .embed_forward = fy_cpu_embed_forward,
    .embed_backward = fy_cpu_embed_backward,
    .block_forward = block_forward_plain,
    .block_backward = block_backward_plain,
    .head = fy_cpu_head_forward_backward,
    .logits = fy_cpu_logits,
    .block_forward_saved = fy_cpu_block_forward,
    .block_backward_saved = fy_cpu_block_backward,
    .block_op_times = fy_cpu_block_op_times,
    .qkv_flops = qkv_flops,
};
