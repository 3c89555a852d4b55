/* Tests of the GPT-2 family on the CPU backend (gpu_worker/cpu/gpt2_cpu.c, with cpu_ops.c): every
 * backward against central finite differences of its forward at small sizes, the head's chunked
 * loss and wte gradient against a naive all-rows computation in double, and bit-identical results
 * whatever the number of OpenMP threads. Documents packed in rows (gpu_worker/backend.h's
 * positions: rows of documents of 3, 1 and 2 tokens, and 4 then single tokens): the attention's
 * probabilities zero outside each token's own document, its backward, the embeddings' (learned
 * positions at the documents' own) and the whole block's against finite differences; each
 * document's attention outputs and gradients those of that document alone, bit for bit; the
 * windows' positions (t everywhere) giving the bits of no positions.
 *
 * Finite differences: the output is projected on a fixed random g, L = sum(out * g) accumulated in
 * double, and the backward is run with dout = g; numeric dL/dp = (L(p + eps) - L(p - eps)) / 2 eps.
 * Buffers that a function overwrites are filled with NaN first, so a missed element shows up, and
 * buffers it accumulates into start from random values that are subtracted afterwards. */
#include <math.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/model/arch/gpt2.h"
#include "common/model/model.h"
#include "gpu_worker/cpu/gpt2_cpu.h"
#include "tests/testutil.h"

/* Tolerances. The forward is fp32, so L carries a rounding error of about 1e-7 relative to
 * sum |out * g|, which the division by 2 eps turns into ~1e-5 absolute at eps = 1e-2; the central
 * difference's truncation error is O(eps^2 f''') ~ 1e-4 relative for the smooth nonlinear ops. A
 * floor of 1e-3 absolute plus 1e-2 relative covers both with margin, and still catches a wrong
 * factor, a sign, a missed term or a transposed index (checked below by corrupting a gradient). */
#define EPS 1e-2f
#define REL 1e-2
#define ABS 1e-3
/* The head's gradients are divided by the number of targets, so an order of magnitude smaller. */
#define HEAD_ABS 1e-4

static float *alloc_f(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    assert_non_null(p);
    return p;
}

static float *alloc_nan(size_t n)
{
    float *p = alloc_f(n);
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
    return p;
}

static float *alloc_rand(size_t n, uint64_t *st, float lo, float hi)
{
    float *p = alloc_f(n);
    for (size_t i = 0; i < n; i++)
        p[i] = fy_test_uniform(st, lo, hi);
    return p;
}

static double project(const float *out, const float *g, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)out[i] * g[i];
    return s;
}

/* Compares the analytic gradient of every element of p with the central difference of f; prints
 * the worst element and returns the number outside |a - n| <= rel |n| + abs. */
static int fd_check(const char *name, double (*f)(void *), void *ctx, float *p, const float *analytic,
                    size_t n, float eps, double rel, double abs_tol)
{
    int bad = 0;
    double worst = 0.0, worst_a = 0.0, worst_n = 0.0;
    size_t worst_i = 0;
    for (size_t i = 0; i < n; i++) {
        float keep = p[i];
        p[i] = keep + eps;
        double lp = f(ctx);
        p[i] = keep - eps;
        double lm = f(ctx);
        p[i] = keep;
        double num = (lp - lm) / (2.0 * eps);
        double a = analytic[i], err = fabs(a - num);
        if (!(err <= rel * fabs(num) + abs_tol)) /* also catches NaN */
            bad++;
        if (!(err <= worst)) {
            worst = err;
            worst_a = a;
            worst_n = num;
            worst_i = i;
        }
    }
    printf("  %-14s %5zu elements, worst |a-n| %.2e at %zu (analytic %.6f, numeric %.6f)%s\n", name, n,
           worst, worst_i, worst_a, worst_n, bad ? "  FAIL" : "");
    return bad;
}

/* analytic = after - before, for outputs that are accumulated into. */
static float *delta(const float *after, const float *before, size_t n)
{
    float *d = alloc_f(n);
    for (size_t i = 0; i < n; i++)
        d[i] = after[i] - before[i];
    return d;
}

/* ---- matmul ---- */

struct mm {
    int N, IN, OUT;
    float *inp, *w, *bias, *out, *g;
};

static double mm_obj(void *ctx)
{
    struct mm *m = ctx;
    fy_cpu_matmul_forward(m->out, m->inp, m->w, m->bias, m->N, m->IN, m->OUT);
    return project(m->out, m->g, (size_t)m->N * m->OUT);
}

/* Returns the number of failing elements; scale_dw corrupts the analytic dw (for the self-test). */
static int run_matmul(int with_bias, float scale_dw)
{
    uint64_t st = 11 + with_bias;
    struct mm m = {.N = 5, .IN = 7, .OUT = 6};
    size_t ni = (size_t)m.N * m.IN, nw = (size_t)m.OUT * m.IN, no = (size_t)m.N * m.OUT;
    m.inp = alloc_rand(ni, &st, -1, 1);
    m.w = alloc_rand(nw, &st, -1, 1);
    m.bias = with_bias ? alloc_rand(m.OUT, &st, -1, 1) : NULL;
    m.out = alloc_nan(no);
    m.g = alloc_rand(no, &st, -1, 1);
    float *dinp = alloc_nan(ni), *dw0 = alloc_rand(nw, &st, -1, 1), *db0 = alloc_rand(m.OUT, &st, -1, 1);
    float *dw = alloc_f(nw), *db = alloc_f(m.OUT);
    memcpy(dw, dw0, nw * sizeof *dw);
    memcpy(db, db0, m.OUT * sizeof *db);
    fy_cpu_matmul_backward(dinp, dw, with_bias ? db : NULL, m.g, m.inp, m.w, m.N, m.IN, m.OUT);
    float *gw = delta(dw, dw0, nw), *gb = delta(db, db0, m.OUT);
    for (size_t i = 0; i < nw; i++)
        gw[i] *= scale_dw;

    int bad = fd_check("matmul dinp", mm_obj, &m, m.inp, dinp, ni, EPS, REL, ABS);
    bad += fd_check("matmul dw", mm_obj, &m, m.w, gw, nw, EPS, REL, ABS);
    if (with_bias)
        bad += fd_check("matmul dbias", mm_obj, &m, m.bias, gb, m.OUT, EPS, REL, ABS);
    else
        for (int o = 0; o < m.OUT; o++) /* a NULL dbias must not be touched: db stays as it was */
            bad += db[o] != db0[o];

    free(m.inp), free(m.w), free(m.bias), free(m.out), free(m.g);
    free(dinp), free(dw0), free(db0), free(dw), free(db), free(gw), free(gb);
    return bad;
}

static void test_matmul_bias(void **state) { assert_int_equal(run_matmul(1, 1.0f), 0); }
static void test_matmul_nobias(void **state) { assert_int_equal(run_matmul(0, 1.0f), 0); }

/* The checker must be able to fail: a dw 5% too large is rejected. */
static void test_checker_catches_wrong_gradient(void **state)
{
    assert_true(run_matmul(1, 1.05f) > 0);
}

/* ---- LayerNorm ---- */

struct ln {
    int N, C;
    float *inp, *w, *b, *out, *mean, *rstd, *g;
};

static double ln_obj(void *ctx)
{
    struct ln *l = ctx;
    fy_cpu_layernorm_forward(l->out, l->mean, l->rstd, l->inp, l->w, l->b, l->N, l->C);
    return project(l->out, l->g, (size_t)l->N * l->C);
}

static void test_layernorm(void **state)
{
    uint64_t st = 21;
    struct ln l = {.N = 4, .C = 10};
    size_t n = (size_t)l.N * l.C;
    l.inp = alloc_rand(n, &st, -2, 2);
    l.w = alloc_rand(l.C, &st, 0.5f, 1.5f);
    l.b = alloc_rand(l.C, &st, -0.5f, 0.5f);
    l.out = alloc_nan(n);
    l.mean = alloc_nan(l.N);
    l.rstd = alloc_nan(l.N);
    l.g = alloc_rand(n, &st, -1, 1);
    ln_obj(&l);
    float *dinp = alloc_nan(n), *dw0 = alloc_rand(l.C, &st, -1, 1), *db0 = alloc_rand(l.C, &st, -1, 1);
    float *dw = alloc_f(l.C), *db = alloc_f(l.C);
    memcpy(dw, dw0, l.C * sizeof *dw);
    memcpy(db, db0, l.C * sizeof *db);
    fy_cpu_layernorm_backward(dinp, dw, db, l.g, l.inp, l.w, l.mean, l.rstd, l.N, l.C);
    float *gw = delta(dw, dw0, l.C), *gb = delta(db, db0, l.C);

    int bad = fd_check("layernorm dinp", ln_obj, &l, l.inp, dinp, n, EPS, REL, ABS);
    bad += fd_check("layernorm dw", ln_obj, &l, l.w, gw, l.C, EPS, REL, ABS);
    bad += fd_check("layernorm db", ln_obj, &l, l.b, gb, l.C, EPS, REL, ABS);
    assert_int_equal(bad, 0);

    free(l.inp), free(l.w), free(l.b), free(l.out), free(l.mean), free(l.rstd), free(l.g);
    free(dinp), free(dw0), free(db0), free(dw), free(db), free(gw), free(gb);
}

/* ---- attention ---- */

struct at {
    int B, T, C, NH;
    const int32_t *pos; /* documents, or NULL */
    float *qkv, *out, *att, *g;
};

static double at_obj(void *ctx)
{
    struct at *a = ctx;
    fy_cpu_attention_forward(a->out, a->att, a->qkv, a->pos, a->B, a->T, a->C, a->NH);
    return project(a->out, a->g, (size_t)a->B * a->T * a->C);
}

/* The attention of a (its probabilities: zero outside each token's own document and above the
 * diagonal, rows summing to 1) and its backward against finite differences; returns the bad
 * elements. */
static int attention_check(struct at *a, uint64_t seed)
{
    uint64_t st = seed;
    size_t nq = (size_t)a->B * a->T * 3 * a->C, no = (size_t)a->B * a->T * a->C;
    size_t natt = (size_t)a->B * a->NH * a->T * a->T;
    /* large enough that the softmax is far from uniform */
    a->qkv = alloc_rand(nq, &st, -1.5f, 1.5f);
    a->out = alloc_nan(no);
    a->att = alloc_nan(natt);
    a->g = alloc_rand(no, &st, -1, 1);
    at_obj(a);

    for (int r = 0; r < a->B * a->NH * a->T; r++) {
        int t = r % a->T, b = r / (a->NH * a->T);
        int lo = a->pos ? t - a->pos[(size_t)b * a->T + t] : 0;
        double sum = 0.0;
        for (int t2 = 0; t2 < a->T; t2++) {
            float p = a->att[(size_t)r * a->T + t2];
            if (t2 > t || t2 < lo)
                assert_true(p == 0.0f);
            sum += p;
        }
        assert_true(fabs(sum - 1.0) < 1e-6);
    }

    float *dqkv = alloc_nan(nq);
    fy_cpu_attention_backward(dqkv, a->g, a->qkv, a->att, a->pos, a->B, a->T, a->C, a->NH);
    int bad = fd_check("attention dqkv", at_obj, a, a->qkv, dqkv, nq, EPS, REL, ABS);
    free(a->qkv), free(a->out), free(a->att), free(a->g), free(dqkv);
    return bad;
}

static void test_attention(void **state)
{
    struct at a = {.B = 2, .T = 5, .C = 8, .NH = 2}; /* T not a power of two */
    assert_int_equal(attention_check(&a, 31), 0);
}

/* Documents packed in rows (gpu_worker/backend.h's positions): row 0 holds documents of 3, 1 and
 * 2 tokens, row 1 one of 4 then two single-token ones (padding). */
static const int32_t packed_pos[2 * 6] = {0, 1, 2, 0, 0, 1, /* */ 0, 1, 2, 3, 0, 0};

static void test_attention_documents(void **state)
{
    struct at a = {.B = 2, .T = 6, .C = 8, .NH = 2, .pos = packed_pos};
    assert_int_equal(attention_check(&a, 32), 0);
}

/* Each document of a packed batch attends as it would alone: its outputs and its gradients are
 * those of a batch of that document only, bit for bit (the same sums in the same order). */
static void test_attention_documents_alone(void **state)
{
    const int B = 2, T = 6, C = 8, NH = 2;
    uint64_t st = 33;
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
    float *qkv = alloc_rand(nq, &st, -1.5f, 1.5f), *g = alloc_rand(no, &st, -1, 1);
    float *out = alloc_nan(no), *att = alloc_nan((size_t)B * NH * T * T), *dqkv = alloc_nan(nq);
    fy_cpu_attention_forward(out, att, qkv, packed_pos, B, T, C, NH);
    fy_cpu_attention_backward(dqkv, g, qkv, att, packed_pos, B, T, C, NH);
    int docs = 0;
    for (int b = 0; b < B; b++)
        for (int t0 = 0; t0 < T;) {
            int n = 1;
            while (t0 + n < T && packed_pos[b * T + t0 + n] != 0)
                n++;
            size_t at = (size_t)b * T + t0;
            float *o1 = alloc_nan((size_t)n * C), *a1 = alloc_nan((size_t)NH * n * n);
            float *d1 = alloc_nan((size_t)n * 3 * C);
            fy_cpu_attention_forward(o1, a1, qkv + at * 3 * C, NULL, 1, n, C, NH);
            fy_cpu_attention_backward(d1, g + at * C, qkv + at * 3 * C, a1, NULL, 1, n, C, NH);
            assert_memory_equal(o1, out + at * C, (size_t)n * C * sizeof(float));
            assert_memory_equal(d1, dqkv + at * 3 * C, (size_t)n * 3 * C * sizeof(float));
            free(o1), free(a1), free(d1);
            docs++;
            t0 += n;
        }
    assert_int_equal(docs, 6);
    free(qkv), free(g), free(out), free(att), free(dqkv);
}

/* ---- GELU ---- */

struct ge {
    size_t n;
    float *inp, *out, *g;
};

static double ge_obj(void *ctx)
{
    struct ge *e = ctx;
    fy_cpu_gelu_forward(e->out, e->inp, e->n);
    return project(e->out, e->g, e->n);
}

static void test_gelu(void **state)
{
    uint64_t st = 41;
    struct ge e = {.n = 64};
    e.inp = alloc_rand(e.n, &st, -4, 4);
    e.out = alloc_nan(e.n);
    e.g = alloc_rand(e.n, &st, -1, 1);
    ge_obj(&e);
    /* spot values of the tanh approximation */
    float x[3] = {0.0f, 1.0f, -2.0f}, y[3];
    fy_cpu_gelu_forward(y, x, 3);
    assert_true(y[0] == 0.0f);
    assert_true(fabsf(y[1] - 0.841192f) < 1e-5f);
    assert_true(fabsf(y[2] - -0.045402f) < 1e-5f);

    float *dinp = alloc_nan(e.n);
    fy_cpu_gelu_backward(dinp, e.inp, e.g, e.n);
    assert_int_equal(fd_check("gelu dinp", ge_obj, &e, e.inp, dinp, e.n, EPS, REL, ABS), 0);
    free(e.inp), free(e.out), free(e.g), free(dinp);
}

/* ---- embeddings ---- */

struct em {
    struct fy_model_config cfg;
    int B, T;
    int32_t *tokens;
    const int32_t *pos; /* documents, or NULL */
    float *embed, *x, *g;
};

static double em_obj(void *ctx)
{
    struct em *e = ctx;
    fy_cpu_embed_forward(&e->cfg, e->embed, e->tokens, e->pos, e->x, e->B, e->T);
    return project(e->x, e->g, (size_t)e->B * e->T * e->cfg.n_embd);
}

/* The lookup (x = wte[token] + wpe[position], positions t or e->pos) and its gradient against
 * finite differences; returns the bad elements. */
static int embed_check(struct em *e, uint64_t seed)
{
    uint64_t st = seed;
    size_t ne = fy_model_unit_params(&e->cfg, 0), nx = (size_t)e->B * e->T * e->cfg.n_embd;
    size_t C = e->cfg.n_embd;
    e->embed = alloc_rand(ne, &st, -1, 1);
    e->x = alloc_nan(nx);
    e->g = alloc_rand(nx, &st, -1, 1);
    em_obj(e);
    const float *wpe = e->embed + (size_t)e->cfg.vocab * C;
    for (int n = 0; n < e->B * e->T; n++) {
        int p = e->pos ? e->pos[n] : n % e->T;
        for (size_t i = 0; i < C; i++)
            assert_true(e->x[n * C + i] == e->embed[(size_t)e->tokens[n] * C + i] + wpe[p * C + i]);
    }
    float *d0 = alloc_rand(ne, &st, -1, 1), *d = alloc_f(ne);
    memcpy(d, d0, ne * sizeof *d);
    fy_cpu_embed_backward(&e->cfg, e->tokens, e->pos, e->g, d, e->B, e->T);
    float *gd = delta(d, d0, ne);
    int bad = fd_check("embed dembed", em_obj, e, e->embed, gd, ne, EPS, REL, ABS);
    free(e->embed), free(e->x), free(e->g), free(d0), free(d), free(gd);
    return bad;
}

static void test_embed(void **state)
{
    struct em e = {.cfg = {.n_layer = 1, .n_head = 1, .n_embd = 5, .vocab = 7, .ctx = 6}, .B = 2, .T = 4};
    int32_t tokens[8] = {3, 0, 3, 6, 6, 3, 1, 0}; /* repeats, within and across sequences */
    e.tokens = tokens;
    assert_int_equal(embed_check(&e, 51), 0);
}

/* Learned positions at the documents' own positions, which repeat within and across rows. */
static void test_embed_documents(void **state)
{
    struct em e = {.cfg = {.n_layer = 1, .n_head = 1, .n_embd = 5, .vocab = 7, .ctx = 6},
                   .B = 2,
                   .T = 6,
                   .pos = packed_pos};
    int32_t tokens[12] = {3, 0, 3, 6, 6, 3, 1, 0, 2, 2, 5, 4};
    e.tokens = tokens;
    assert_int_equal(embed_check(&e, 52), 0);
}

/* ---- one block ---- */

struct bl {
    struct fy_model_config cfg;
    int B, T;
    const int32_t *pos; /* documents, or NULL */
    float *params, *x, *y, *g, *scratch;
};

static double bl_obj(void *ctx)
{
    struct bl *b = ctx;
    fy_cpu_block_forward(&b->cfg, b->params, b->pos, b->x, b->y, b->scratch, NULL, b->B, b->T);
    return project(b->y, b->g, (size_t)b->B * b->T * b->cfg.n_embd);
}

/* Random block parameters: LayerNorm weights near 1, everything else of a size that keeps the
 * activations of order one, so that every nonlinearity is exercised. */
static float *block_params(const struct fy_model_config *cfg, uint64_t *st)
{
    struct fy_gpt2_block_layout l;
    fy_gpt2_block_layout(cfg, &l);
    size_t C = cfg->n_embd;
    float *p = alloc_rand(l.total, st, -0.4f, 0.4f);
    for (size_t i = 0; i < C; i++) {
        p[l.ln1_w + i] = fy_test_uniform(st, 0.7f, 1.3f);
        p[l.ln2_w + i] = fy_test_uniform(st, 0.7f, 1.3f);
    }
    return p;
}

/* The block's backward (dx and every parameter's gradient) against finite differences of its
 * forward; returns the bad elements. */
static int block_check(struct bl *bp, uint64_t seed)
{
    struct bl b = *bp;
    uint64_t st = seed;
    struct fy_gpt2_block_layout l;
    fy_gpt2_block_layout(&b.cfg, &l);
    size_t nx = (size_t)b.B * b.T * b.cfg.n_embd, ns = fy_cpu_block_scratch(&b.cfg, b.B, b.T);
    b.params = block_params(&b.cfg, &st);
    b.x = alloc_rand(nx, &st, -1, 1);
    b.y = alloc_nan(nx);
    b.g = alloc_rand(nx, &st, -1, 1);
    b.scratch = alloc_nan(ns);
    float *dx = alloc_nan(nx), *dp = alloc_nan(l.total);
    fy_cpu_block_backward(&b.cfg, b.params, b.pos, b.x, b.g, dx, dp, b.scratch, NULL, b.B, b.T);

    int bad = fd_check("block dx", bl_obj, &b, b.x, dx, nx, EPS, REL, ABS);
    struct {
        const char *name;
        size_t off, n;
    } t[] = {
        {"block ln1_w", l.ln1_w, l.ln1_b - l.ln1_w},   {"block ln1_b", l.ln1_b, l.qkv_w - l.ln1_b},
        {"block qkv_w", l.qkv_w, l.qkv_b - l.qkv_w},   {"block qkv_b", l.qkv_b, l.attn_w - l.qkv_b},
        {"block attn_w", l.attn_w, l.attn_b - l.attn_w}, {"block attn_b", l.attn_b, l.ln2_w - l.attn_b},
        {"block ln2_w", l.ln2_w, l.ln2_b - l.ln2_w},   {"block ln2_b", l.ln2_b, l.fc_w - l.ln2_b},
        {"block fc_w", l.fc_w, l.fc_b - l.fc_w},       {"block fc_b", l.fc_b, l.proj_w - l.fc_b},
        {"block proj_w", l.proj_w, l.proj_b - l.proj_w}, {"block proj_b", l.proj_b, l.total - l.proj_b},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        bad += fd_check(t[i].name, bl_obj, &b, b.params + t[i].off, dp + t[i].off, t[i].n, EPS, REL,
                        ABS);
    free(b.params), free(b.x), free(b.y), free(b.g), free(b.scratch), free(dx), free(dp);
    return bad;
}

static void test_block(void **state)
{
    struct bl b = {
        .cfg = {.n_layer = 2, .n_head = 2, .n_embd = 8, .vocab = 11, .ctx = 5}, .B = 2, .T = 5};
    assert_int_equal(block_check(&b, 61), 0);
}

static void test_block_documents(void **state)
{
    struct bl b = {.cfg = {.n_layer = 2, .n_head = 2, .n_embd = 8, .vocab = 11, .ctx = 6},
                   .B = 2,
                   .T = 6,
                   .pos = packed_pos};
    assert_int_equal(block_check(&b, 62), 0);
}

/* ---- head ---- */

struct hd {
    struct fy_model_config cfg;
    int B, T;
    float *final, *embed, *x, *scratch;
    int32_t *targets;
};

static double hd_obj(void *ctx)
{
    struct hd *h = ctx;
    return fy_cpu_head_forward_backward(&h->cfg, h->final, h->embed, h->x, h->targets, NULL, NULL, NULL,
                                        h->scratch, h->B, h->T);
}

static void hd_alloc(struct hd *h, uint64_t *st)
{
    size_t C = h->cfg.n_embd, nx = (size_t)h->B * h->T * C;
    h->final = alloc_rand(2 * C, st, -0.5f, 0.5f);
    for (size_t i = 0; i < C; i++)
        h->final[i] += 1.0f;
    h->embed = alloc_rand(fy_model_unit_params(&h->cfg, 0), st, -1, 1);
    h->x = alloc_rand(nx, st, -1, 1);
    h->scratch = alloc_nan(fy_cpu_head_scratch(&h->cfg, h->B, h->T));
    h->targets = malloc((size_t)h->B * h->T * sizeof *h->targets);
    assert_non_null(h->targets);
    for (int n = 0; n < h->B * h->T; n++)
        h->targets[n] = (int32_t)(fy_test_rand(st) % h->cfg.vocab);
}

static void hd_free(struct hd *h)
{
    free(h->final), free(h->embed), free(h->x), free(h->scratch), free(h->targets);
}

static void test_head(void **state)
{
    uint64_t st = 71;
    struct hd h = {.cfg = {.n_layer = 1, .n_head = 2, .n_embd = 8, .vocab = 11, .ctx = 6}, .B = 2, .T = 5};
    hd_alloc(&h, &st);
    h.targets[3] = -1; /* ignored */
    size_t C = h.cfg.n_embd, V = h.cfg.vocab, nx = (size_t)h.B * h.T * C;
    size_t ne = fy_model_unit_params(&h.cfg, 0);
    float *dx = alloc_nan(nx), *dfinal = alloc_nan(2 * C), *dembed = alloc_nan(ne);
    float loss = fy_cpu_head_forward_backward(&h.cfg, h.final, h.embed, h.x, h.targets, dx, dfinal,
                                              dembed, h.scratch, h.B, h.T);
    assert_true(isfinite(loss) && loss > 0.0f);
    assert_true(loss == (float)hd_obj(&h)); /* the backward does not change the loss */

    int bad = fd_check("head dx", hd_obj, &h, h.x, dx, nx, EPS, REL, HEAD_ABS);
    bad += fd_check("head dlnf_w", hd_obj, &h, h.final, dfinal, C, EPS, REL, HEAD_ABS);
    bad += fd_check("head dlnf_b", hd_obj, &h, h.final + C, dfinal + C, C, EPS, REL, HEAD_ABS);
    bad += fd_check("head dwte", hd_obj, &h, h.embed, dembed, V * C, EPS, REL, HEAD_ABS);
    for (size_t i = V * C; i < ne; i++) /* the wpe part is zeroed */
        bad += dembed[i] != 0.0f;
    /* the ignored row contributes no gradient to x */
    for (size_t i = 0; i < C; i++)
        bad += fabsf(dx[3 * C + i]) > 0.0f;
    assert_int_equal(bad, 0);

    /* all targets ignored: loss 0 and zero gradients */
    for (int n = 0; n < h.B * h.T; n++)
        h.targets[n] = -1;
    loss = fy_cpu_head_forward_backward(&h.cfg, h.final, h.embed, h.x, h.targets, dx, dfinal, dembed,
                                        h.scratch, h.B, h.T);
    assert_true(loss == 0.0f);
    for (size_t i = 0; i < nx; i++)
        assert_true(dx[i] == 0.0f);
    for (size_t i = 0; i < ne; i++)
        assert_true(dembed[i] == 0.0f);
    for (size_t i = 0; i < 2 * C; i++)
        assert_true(dfinal[i] == 0.0f);

    hd_free(&h);
    free(dx), free(dfinal), free(dembed);
}

/* Rows spanning three chunks, the last one partial: the loss and the wte gradient against the
 * textbook computation over all rows at once, in double. */
static void test_head_chunks_match_naive(void **state)
{
    uint64_t st = 81;
    struct hd h = {.cfg = {.n_layer = 1, .n_head = 2, .n_embd = 8, .vocab = 11, .ctx = 50}, .B = 3, .T = 50};
    hd_alloc(&h, &st);
    int N = h.B * h.T, C = (int)h.cfg.n_embd, V = (int)h.cfg.vocab;
    for (int n = 0; n < N; n += 7)
        h.targets[n] = -1;
    float *dx = alloc_nan((size_t)N * C), *dfinal = alloc_nan(2 * (size_t)C);
    float *dembed = alloc_nan(fy_model_unit_params(&h.cfg, 0));
    float loss = fy_cpu_head_forward_backward(&h.cfg, h.final, h.embed, h.x, h.targets, dx, dfinal,
                                              dembed, h.scratch, h.B, h.T);

    double *xn = calloc((size_t)N * C, sizeof *xn), *dl = calloc((size_t)N * V, sizeof *dl);
    double *dwte = calloc((size_t)V * C, sizeof *dwte);
    assert_non_null(xn), assert_non_null(dl), assert_non_null(dwte);
    int count = 0;
    for (int n = 0; n < N; n++)
        count += h.targets[n] >= 0;
    double sum = 0.0;
    for (int n = 0; n < N; n++) {
        const float *x = h.x + (size_t)n * C;
        double m = 0.0, v = 0.0;
        for (int i = 0; i < C; i++)
            m += x[i];
        m /= C;
        for (int i = 0; i < C; i++)
            v += (x[i] - m) * (x[i] - m);
        v /= C;
        for (int i = 0; i < C; i++)
            xn[(size_t)n * C + i] = (x[i] - m) / sqrt(v + 1e-5) * h.final[i] + h.final[C + i];
        if (h.targets[n] < 0)
            continue;
        double z[11] = {0}, zmax = -INFINITY, se = 0.0; /* V = 11 */
        for (int k = 0; k < V; k++) {
            z[k] = 0.0;
            for (int i = 0; i < C; i++)
                z[k] += xn[(size_t)n * C + i] * h.embed[(size_t)k * C + i];
            zmax = fmax(zmax, z[k]);
        }
        for (int k = 0; k < V; k++)
            se += exp(z[k] - zmax);
        sum += log(se) + zmax - z[h.targets[n]];
        for (int k = 0; k < V; k++)
            dl[(size_t)n * V + k] = (exp(z[k] - zmax) / se - (k == h.targets[n])) / count;
    }
    double naive = sum / count;
    printf("  chunked loss %.9f, naive %.9f\n", loss, naive);
    assert_true(fabs(loss - naive) <= 1e-5 * fabs(naive));

    for (int n = 0; n < N; n++)
        for (int k = 0; k < V; k++)
            for (int i = 0; i < C; i++)
                dwte[(size_t)k * C + i] += dl[(size_t)n * V + k] * xn[(size_t)n * C + i];
    double worst = 0.0;
    for (size_t i = 0; i < (size_t)V * C; i++)
        worst = fmax(worst, fabs(dembed[i] - dwte[i]) / (fabs(dwte[i]) + 1e-3));
    printf("  dwte worst relative difference %.2e\n", worst);
    assert_true(worst <= 1e-4);

    hd_free(&h);
    free(dx), free(dfinal), free(dembed), free(xn), free(dl), free(dwte);
}

/* The logits (fy_cpu_logits, in the head's scratch) against the final LayerNorm and the tied head
 * computed in double, over rows spanning three head chunks. */
static void test_logits(void **state)
{
    uint64_t st = 83;
    struct hd h = {.cfg = {.n_layer = 1, .n_head = 2, .n_embd = 8, .vocab = 11, .ctx = 50},
                   .B = 3, .T = 50};
    hd_alloc(&h, &st);
    int N = h.B * h.T, C = (int)h.cfg.n_embd, V = (int)h.cfg.vocab;
    float *logits = alloc_nan((size_t)N * V);
    fy_cpu_logits(&h.cfg, h.final, h.embed, h.x, logits, h.scratch, h.B, h.T);
    double worst = 0.0, zmax = 0.0;
    for (int n = 0; n < N; n++) {
        const float *x = h.x + (size_t)n * C;
        double m = 0.0, v = 0.0, xn[8]; /* C = 8 */
        for (int i = 0; i < C; i++)
            m += x[i];
        m /= C;
        for (int i = 0; i < C; i++)
            v += (x[i] - m) * (x[i] - m);
        v /= C;
        for (int i = 0; i < C; i++)
            xn[i] = (x[i] - m) / sqrt(v + 1e-5) * h.final[i] + h.final[C + i];
        for (int k = 0; k < V; k++) {
            double z = 0.0;
            for (int i = 0; i < C; i++)
                z += xn[i] * h.embed[(size_t)k * C + i];
            worst = fmax(worst, fabs(logits[(size_t)n * V + k] - z));
            zmax = fmax(zmax, fabs(z));
        }
    }
    printf("  logits: worst difference %.2e of the largest %.2f\n", worst, zmax);
    assert_true(worst <= 1e-5 * zmax);
    hd_free(&h);
    free(logits);
}

/* ---- determinism across thread counts ---- */

struct run_out {
    float *y, *dx, *dp, *dembed, *hdx, *dfinal;
    float loss;
};

/* positions: 0 none, 1 the windows' (t everywhere), 2 documents of 7 tokens and single ones */
static void det_run(int threads, int positions, struct run_out *o)
{
    omp_set_num_threads(threads);
    uint64_t st = 91;
    struct fy_model_config cfg = {.n_layer = 2, .n_head = 4, .n_embd = 16, .vocab = 70, .ctx = 30};
    int B = 3, T = 30, N = B * T; /* N spans two head chunks */
    size_t C = cfg.n_embd, nx = (size_t)N * C, ne = fy_model_unit_params(&cfg, 0);
    struct fy_gpt2_block_layout l;
    fy_gpt2_block_layout(&cfg, &l);
    float *params = block_params(&cfg, &st), *embed = alloc_rand(ne, &st, -1, 1);
    float *final = alloc_rand(2 * C, &st, 0.5f, 1.5f), *x = alloc_f(nx), *dy = alloc_rand(nx, &st, -1, 1);
    int32_t *tokens = malloc((size_t)N * sizeof *tokens), *targets = malloc((size_t)N * sizeof *targets);
    assert_non_null(tokens), assert_non_null(targets);
    for (int n = 0; n < N; n++) {
        tokens[n] = (int32_t)(fy_test_rand(&st) % 5); /* few distinct tokens: many repeats */
        targets[n] = n % 9 == 0 ? -1 : (int32_t)(fy_test_rand(&st) % cfg.vocab);
    }
    int32_t *pos = positions ? malloc((size_t)N * sizeof *pos) : NULL;
    for (int n = 0; pos != NULL && n < N; n++)
        pos[n] = positions == 1 ? n % T : n % T < 21 ? n % T % 7 : 0;
    float *bs = alloc_nan(fy_cpu_block_scratch(&cfg, B, T)), *hs = alloc_nan(fy_cpu_head_scratch(&cfg, B, T));
    o->y = alloc_nan(nx), o->dx = alloc_nan(nx), o->dp = alloc_nan(l.total);
    o->dembed = alloc_nan(ne), o->hdx = alloc_nan(nx), o->dfinal = alloc_nan(2 * C);

    fy_cpu_embed_forward(&cfg, embed, tokens, pos, x, B, T);
    fy_cpu_block_forward(&cfg, params, pos, x, o->y, bs, NULL, B, T);
    fy_cpu_block_backward(&cfg, params, pos, x, dy, o->dx, o->dp, bs, NULL, B, T);
    o->loss = fy_cpu_head_forward_backward(&cfg, final, embed, o->y, targets, o->hdx, o->dfinal,
                                           o->dembed, hs, B, T);
    fy_cpu_embed_backward(&cfg, tokens, pos, o->dx, o->dembed, B, T);
    free(pos);

    free(params), free(embed), free(final), free(x), free(dy), free(tokens), free(targets);
    free(bs), free(hs);
}

static void run_out_equal(const struct run_out *a, const struct run_out *b)
{
    struct fy_model_config cfg = {.n_layer = 2, .n_head = 4, .n_embd = 16, .vocab = 70, .ctx = 30};
    struct fy_gpt2_block_layout l;
    fy_gpt2_block_layout(&cfg, &l);
    size_t nx = 3 * 30 * 16, ne = fy_model_unit_params(&cfg, 0);
    assert_memory_equal(a->y, b->y, nx * sizeof(float));
    assert_memory_equal(a->dx, b->dx, nx * sizeof(float));
    assert_memory_equal(a->dp, b->dp, l.total * sizeof(float));
    assert_memory_equal(&a->loss, &b->loss, sizeof(float));
    assert_memory_equal(a->hdx, b->hdx, nx * sizeof(float));
    assert_memory_equal(a->dfinal, b->dfinal, 2 * 16 * sizeof(float));
    assert_memory_equal(a->dembed, b->dembed, ne * sizeof(float));
}

static void run_out_free(struct run_out *r)
{
    free(r->y), free(r->dx), free(r->dp), free(r->dembed), free(r->hdx), free(r->dfinal);
}

/* The same bits whatever the number of threads, with documents too; and the windows' positions
 * (t everywhere) give the bits of no positions at all. */
static void test_determinism(void **state)
{
    int saved = omp_get_max_threads();
    struct run_out a, b, w, d1, d3;
    det_run(1, 0, &a);
    det_run(3, 0, &b);
    det_run(2, 1, &w);
    det_run(1, 2, &d1);
    det_run(3, 2, &d3);
    omp_set_num_threads(saved);
    run_out_equal(&a, &b);
    run_out_equal(&a, &w);
    run_out_equal(&d1, &d3);
    assert_memory_not_equal(a.y, d1.y, 3 * 30 * 16 * sizeof(float));
    struct run_out *r[5] = {&a, &b, &w, &d1, &d3};
    for (int i = 0; i < 5; i++)
        run_out_free(r[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_bias),
        cmocka_unit_test(test_matmul_nobias),
        cmocka_unit_test(test_checker_catches_wrong_gradient),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_documents),
        cmocka_unit_test(test_attention_documents_alone),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_embed_documents),
        cmocka_unit_test(test_block),
        cmocka_unit_test(test_block_documents),
        cmocka_unit_test(test_head),
        cmocka_unit_test(test_head_chunks_match_naive),
        cmocka_unit_test(test_logits),
        cmocka_unit_test(test_determinism),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
