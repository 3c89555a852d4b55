/* GPU test of the CUDA backend's GPT units against the CPU backend (the fp32 reference) through the
 * backend interface the gpu worker uses: embeddings, a block forward and backward, the head with
 * loss and gradients, the embedding backward; and determinism (two runs, identical bytes). Blocks
 * whose internals are swapped to host buffers (saved) give the bytes of the plain calls. Weights
 * given as bf16 (rounded by fy_f32_to_bf16) give the bytes of their f32 originals, for GPT-2 and
 * Llama (tied and untied heads), one call at a time and queued with the dtype switched between
 * calls in flight. Packed documents (gpu_worker/backend.h's positions): the whole model against the
 * CPU backend given them, with the flash and the materialising attention; swapped blocks with
 * documents giving the bytes of the plain calls with them; the windows' positions (t everywhere)
 * giving the bytes of none.
 * Tolerances are for bf16 weights and activations with fp32 accumulation: relative Frobenius error
 * of each output below 3e-2 (bf16 keeps 8 bits of mantissa, 2^-8 = 4e-3 per rounding, and a block
 * rounds each activation several times), loss within 1e-2 relative. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/actplan.h"
#include "common/model/arch/gpt2.h"
#include "common/base/dtype.h"
#include "common/model/model.h"
#include "gpu_worker/backend.h"
#include "tests/refmodel.h"
#include "tests/testutil.h"

static struct fy_backend *cuda, *cpu;
static const struct fy_model_config cfg = {.n_layer = 2, .n_head = 4, .n_embd = 64, .vocab = 259, .ctx = 48};
static const int B = 3, T = 37;

static float *unit_params(unsigned unit, uint64_t seed)
{
    size_t n = fy_model_unit_params(&cfg, unit);
    float *p = malloc(n * sizeof *p);
    fy_model_init_unit(&cfg, unit, seed, p);
    /* perturb so LayerNorm parameters and biases are not trivially 1 and 0 */
    uint64_t s = seed * 7 + unit;
    for (size_t i = 0; i < n; i++)
        p[i] += fy_test_uniform(&s, -0.05f, 0.05f);
    return p;
}

static double rel_err(const float *a, const float *ref, size_t n, const char *what)
{
    double num = 0, den = 0, maxabs = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
        if (fabs(d) > maxabs || isnan(d))
            maxabs = isnan(d) ? INFINITY : fabs(d);
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    print_message("%-22s n=%-8zu max abs err %.3e  relative Frobenius %.3e\n", what, n, maxabs, rel);
    return isnan(rel) ? INFINITY : rel;
}

static void test_units_match_cpu(void **state)
{
    size_t N = (size_t)B * T, C = cfg.n_embd, NC = N * C;
    uint64_t seed = 11;
    /* preparing again reuses the arena (sized exactly for the first preparation) */
    assert_int_equal(fy_backend_model_prepare(cuda, &cfg, B, T), 0);
    int32_t *tokens = malloc(N * sizeof *tokens), *targets = malloc(N * sizeof *targets);
    for (size_t i = 0; i < N; i++) {
        tokens[i] = (int32_t)(fy_test_rand(&seed) % cfg.vocab);
        targets[i] = (int32_t)(fy_test_rand(&seed) % cfg.vocab);
    }
    targets[5] = -1;
    float *embed = unit_params(0, 1), *block = unit_params(1, 1), *fin = unit_params(3, 1);
    size_t ne = fy_model_unit_params(&cfg, 0), nb = fy_model_unit_params(&cfg, 1), nf = 2 * C;
    float *x_gpu = malloc(NC * 4), *x_cpu = malloc(NC * 4);
    assert_int_equal(fy_backend_model_embed_forward(cuda, embed, tokens, NULL, x_gpu), 0);
    assert_int_equal(fy_backend_model_embed_forward(cpu, embed, tokens, NULL, x_cpu), 0);
    assert_true(rel_err(x_gpu, x_cpu, NC, "embed forward") < 3e-2);

    float *y_gpu = malloc(NC * 4), *y_cpu = malloc(NC * 4);
    assert_int_equal(fy_backend_model_block_forward(cuda, 1, block, NULL, x_cpu, y_gpu, NULL), 0);
    assert_int_equal(fy_backend_model_block_forward(cpu, 1, block, NULL, x_cpu, y_cpu, NULL), 0);
    assert_true(rel_err(y_gpu, y_cpu, NC, "block forward") < 3e-2);

    double loss_gpu, loss_cpu;
    float *dx_gpu = malloc(NC * 4), *dx_cpu = malloc(NC * 4);
    float *dfin_gpu = malloc(nf * 4), *dfin_cpu = malloc(nf * 4);
    float *demb_gpu = malloc(ne * 4), *demb_cpu = malloc(ne * 4);
    assert_int_equal(fy_backend_model_head(cuda, fin, embed, y_cpu, targets, &loss_gpu, dx_gpu,
                                         dfin_gpu, demb_gpu),
                     0);
    assert_int_equal(fy_backend_model_head(cpu, fin, embed, y_cpu, targets, &loss_cpu, dx_cpu,
                                         dfin_cpu, demb_cpu),
                     0);
    print_message("loss gpu %.6f cpu %.6f\n", loss_gpu, loss_cpu);
    assert_true(fabs(loss_gpu - loss_cpu) <= 1e-2 * fabs(loss_cpu));
    assert_true(rel_err(dx_gpu, dx_cpu, NC, "head dx") < 3e-2);
    assert_true(rel_err(dfin_gpu, dfin_cpu, nf, "head dfinal") < 3e-2);
    assert_true(rel_err(demb_gpu, demb_cpu, ne, "head dembed") < 3e-2);
    size_t nl = N * cfg.vocab;
    float *lg_gpu = malloc(nl * 4), *lg_cpu = malloc(nl * 4);
    assert_int_equal(fy_backend_model_logits(cuda, fin, embed, y_cpu, lg_gpu), 0);
    assert_int_equal(fy_backend_model_logits(cpu, fin, embed, y_cpu, lg_cpu), 0);
    assert_true(rel_err(lg_gpu, lg_cpu, nl, "logits") < 3e-2);
    free(lg_gpu);
    free(lg_cpu);
    double no_grad;
    assert_int_equal(fy_backend_model_head(cuda, fin, embed, y_cpu, targets, &no_grad, NULL, NULL, NULL),
                     0);
    assert_true(fabs(no_grad - loss_gpu) <= 1e-6 * fabs(loss_gpu));

    float *dxb_gpu = malloc(NC * 4), *dxb_cpu = malloc(NC * 4);
    float *dp_gpu = malloc(nb * 4), *dp_cpu = malloc(nb * 4);
    assert_int_equal(
        fy_backend_model_block_backward(cuda, 1, block, NULL, x_cpu, dx_cpu, dxb_gpu, dp_gpu, NULL),
        0);
    assert_int_equal(
        fy_backend_model_block_backward(cpu, 1, block, NULL, x_cpu, dx_cpu, dxb_cpu, dp_cpu, NULL),
        0);
    assert_true(rel_err(dxb_gpu, dxb_cpu, NC, "block backward dx") < 3e-2);
    struct fy_gpt2_block_layout l;
    fy_gpt2_block_layout(&cfg, &l);
    const struct { const char *name; size_t off, n; } parts[] = {
        {"dln1_w", l.ln1_w, C},        {"dln1_b", l.ln1_b, C},  {"dqkv_w", l.qkv_w, 3 * C * C},
        {"dqkv_b", l.qkv_b, 3 * C},    {"dattn_w", l.attn_w, C * C}, {"dattn_b", l.attn_b, C},
        {"dln2_w", l.ln2_w, C},        {"dln2_b", l.ln2_b, C},  {"dfc_w", l.fc_w, 4 * C * C},
        {"dfc_b", l.fc_b, 4 * C},      {"dproj_w", l.proj_w, 4 * C * C}, {"dproj_b", l.proj_b, C},
    };
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        assert_true(rel_err(dp_gpu + parts[i].off, dp_cpu + parts[i].off, parts[i].n, parts[i].name) <
                    3e-2);
    /* determinism: the same backward again gives the same bytes */
    float *dp_again = malloc(nb * 4), *dx_again = malloc(NC * 4);
    assert_int_equal(fy_backend_model_block_backward(cuda, 1, block, NULL, x_cpu, dx_cpu, dx_again,
                                                     dp_again, NULL),
                     0);
    assert_memory_equal(dp_again, dp_gpu, nb * 4);
    assert_memory_equal(dx_again, dxb_gpu, NC * 4);

    /* embedding backward accumulates onto the head's share */
    memcpy(demb_gpu, demb_cpu, ne * 4);
    assert_int_equal(fy_backend_model_embed_backward(cuda, tokens, NULL, dxb_cpu, demb_gpu), 0);
    assert_int_equal(fy_backend_model_embed_backward(cpu, tokens, NULL, dxb_cpu, demb_cpu), 0);
    assert_true(rel_err(demb_gpu, demb_cpu, ne, "embed backward") < 3e-2);

    free(tokens); free(targets); free(embed); free(block); free(fin); free(x_gpu); free(x_cpu);
    free(y_gpu); free(y_cpu); free(dx_gpu); free(dx_cpu); free(dfin_gpu); free(dfin_cpu);
    free(demb_gpu); free(demb_cpu); free(dxb_gpu); free(dxb_cpu); free(dp_gpu); free(dp_cpu);
    free(dp_again); free(dx_again);
}

static uint16_t *to_bf16(const float *x, size_t n)
{
    uint16_t *h = malloc(n * sizeof *h);
    for (size_t i = 0; h != NULL && i < n; i++)
        h[i] = fy_f32_to_bf16(x[i]);
    return h;
}

/* Activations as bf16 in host memory (what the pipeline sends with the CUDA backend) against f32:
 * the device holds them in bf16 either way, so every output is the same bits: each bf16 activation
 * widened equals the f32 one, and the loss and the f32 gradients are equal byte for byte. */
static void test_bf16_host_activations_same_bits(void **state)
{
    size_t N = (size_t)B * T, C = cfg.n_embd, NC = N * C;
    uint64_t seed = 5;
    assert_int_equal(fy_backend_model_prepare(cuda, &cfg, B, T), 0);
    int32_t *tokens = malloc(N * sizeof *tokens), *targets = malloc(N * sizeof *targets);
    for (size_t i = 0; i < N; i++) {
        tokens[i] = (int32_t)(fy_test_rand(&seed) % cfg.vocab);
        targets[i] = (int32_t)(fy_test_rand(&seed) % cfg.vocab);
    }
    float *embed = unit_params(0, 2), *block = unit_params(1, 2), *fin = unit_params(3, 2);
    size_t ne = fy_model_unit_params(&cfg, 0), nb = fy_model_unit_params(&cfg, 1), nf = 2 * C;
    size_t nl = N * cfg.vocab;
    /* f32 activations */
    float *x = malloc(NC * 4), *y = malloc(NC * 4), *dy = malloc(NC * 4), *dx = malloc(NC * 4);
    float *dfin = malloc(nf * 4), *demb = malloc(ne * 4), *dp = malloc(nb * 4);
    float *lg = malloc(nl * 4);
    double loss;
    assert_int_equal(fy_backend_model_act_dtype(cuda, FY_DTYPE_F32), 0);
    assert_int_equal(fy_backend_model_embed_forward(cuda, embed, tokens, NULL, x), 0);
    assert_int_equal(fy_backend_model_block_forward(cuda, 1, block, NULL, x, y, NULL), 0);
    assert_int_equal(fy_backend_model_head(cuda, fin, embed, y, targets, &loss, dy, dfin, demb), 0);
    assert_int_equal(fy_backend_model_block_backward(cuda, 1, block, NULL, x, dy, dx, dp, NULL), 0);
    assert_int_equal(fy_backend_model_embed_backward(cuda, tokens, NULL, dx, demb), 0);
    assert_int_equal(fy_backend_model_logits(cuda, fin, embed, y, lg), 0);
    /* bf16 activations, every input given as bf16 */
    uint16_t *xh = malloc(NC * 2), *yh = malloc(NC * 2), *dyh = malloc(NC * 2);
    uint16_t *dxh = malloc(NC * 2);
    float *dfin2 = malloc(nf * 4), *demb2 = malloc(ne * 4), *dp2 = malloc(nb * 4);
    float *lg2 = malloc(nl * 4);
    double loss2;
    assert_int_equal(fy_backend_model_act_dtype(cuda, FY_DTYPE_BF16), 0);
    assert_int_equal(fy_backend_model_embed_forward(cuda, embed, tokens, NULL, xh), 0);
    uint16_t *x_in = to_bf16(x, NC);
    assert_memory_equal(xh, x_in, NC * 2); /* f32 x was the exact widening of these */
    assert_int_equal(fy_backend_model_block_forward(cuda, 1, block, NULL, x_in, yh, NULL), 0);
    uint16_t *y_ref = to_bf16(y, NC);
    assert_memory_equal(yh, y_ref, NC * 2);
    assert_int_equal(fy_backend_model_head(cuda, fin, embed, yh, targets, &loss2, dyh, dfin2, demb2),
                     0);
    assert_memory_equal(&loss2, &loss, sizeof loss);
    uint16_t *dy_ref = to_bf16(dy, NC);
    assert_memory_equal(dyh, dy_ref, NC * 2);
    assert_memory_equal(dfin2, dfin, nf * 4);
    assert_int_equal(fy_backend_model_block_backward(cuda, 1, block, NULL, xh, dyh, dxh, dp2, NULL),
                     0);
    uint16_t *dx_ref = to_bf16(dx, NC);
    assert_memory_equal(dxh, dx_ref, NC * 2);
    assert_memory_equal(dp2, dp, nb * 4);
    assert_int_equal(fy_backend_model_embed_backward(cuda, tokens, NULL, dxh, demb2), 0);
    assert_memory_equal(demb2, demb, ne * 4);
    assert_int_equal(fy_backend_model_logits(cuda, fin, embed, yh, lg2), 0);
    assert_memory_equal(lg2, lg, nl * 4);
    assert_int_equal(fy_backend_model_act_dtype(cuda, FY_DTYPE_F32), 0);
    print_message("bf16 and f32 host activations: identical outputs (loss %.6f)\n", loss);
    free(tokens); free(targets); free(embed); free(block); free(fin); free(x); free(y); free(dy);
    free(dx); free(dfin); free(demb); free(dp); free(lg); free(xh); free(yh); free(dyh); free(dxh);
    free(dfin2); free(demb2); free(dp2); free(lg2); free(x_in); free(y_ref); free(dy_ref);
    free(dx_ref);
}

static void test_budget_refused(void **state)
{
    struct fy_backend *small = NULL;
    assert_int_equal(fy_backend_open(&small, "cuda", 1 << 20), 0);
    assert_int_equal(fy_backend_model_prepare(small, &cfg, B, T), -ENOMEM); /* 1 MiB cannot hold it */
    fy_backend_close(&small);
}

/* ---- swapped internals through the backend interface ---- */

#define KBIT(kind) FY_ACT_BIT(FY_ACT_##kind)
/* none, all, each alone, and mixes where the backward skips some forward ops and reruns others */
static const unsigned swap_masks[] = {
    0,
    FY_ACT_SWAPPABLE,
    KBIT(QKV),
    KBIT(ATTN),
    KBIT(RESID),
    KBIT(FC),
    KBIT(GELU),
    KBIT(QKV) | KBIT(RESID) | KBIT(GELU),
    KBIT(ATTN) | KBIT(FC),
};

/* One registered allocation, as the pool is, carved by take(). */
struct swap_pool {
    char *base;
    size_t size, used;
};

static void *take(struct swap_pool *p, size_t bytes)
{
    void *at = p->base + p->used;
    p->used += (bytes + 4095) / 4096 * 4096;
    assert_true(p->used <= p->size);
    return at;
}

/* Outputs of two blocks, forward and backward. */
struct two_blocks {
    float *y1, *y2, *dx2, *dx1, *dp2, *dp1;
};

static void two_blocks_take(struct swap_pool *p, struct two_blocks *o, size_t NC, size_t nb)
{
    o->y1 = take(p, NC * 4);
    o->y2 = take(p, NC * 4);
    o->dx2 = take(p, NC * 4);
    o->dx1 = take(p, NC * 4);
    o->dp2 = take(p, nb * 4);
    o->dp1 = take(p, nb * 4);
}

static void two_blocks_equal(const struct two_blocks *a, const struct two_blocks *b, size_t NC,
                             size_t nb)
{
    assert_memory_equal(a->y1, b->y1, NC * 4);
    assert_memory_equal(a->y2, b->y2, NC * 4);
    assert_memory_equal(a->dx2, b->dx2, NC * 4);
    assert_memory_equal(a->dp2, b->dp2, nb * 4);
    assert_memory_equal(a->dx1, b->dx1, NC * 4);
    assert_memory_equal(a->dp1, b->dp1, nb * 4);
}

static struct fy_block_saved saved_of(char *region, const struct fy_actplan_region *r, unsigned mask)
{
    struct fy_block_saved s;
    memset(&s, 0, sizeof s);
    for (int k = 0; k < FY_ACT_KINDS; k++)
        if (mask & FY_ACT_BIT(k))
            s.at[k] = region + r->offset[k];
    return s;
}

/* fuse: FUYOU_CUDA_FUSE while preparing (NULL: the default, fused). With the calls queued as the
 * pipeline queues them (both forwards in flight, each backward behind the call before it), every
 * mask gives the bytes of the same calls completed one by one without saved; the saved regions
 * are untouched by the backwards, a second pair of backwards (clipping) gives the same bytes, and
 * a second pair of forwards over other poison writes the same saved bytes. */
/* docs: the blocks' rows packed with documents (positions in the registered pool): the same checks
 * with each call keeping its own positions while queued. */
static void swapped_blocks_check(const char *fuse, int docs)
{
    size_t N = (size_t)B * T, NC = N * cfg.n_embd, nb = fy_model_unit_params(&cfg, 1);
    struct fy_backend *b = NULL;
    assert_int_equal(fy_backend_open(&b, "cuda", 256ull << 20), 0);
    /* named either way, whatever the environment the test runs in says */
    setenv("FUYOU_CUDA_FUSE", fuse != NULL ? fuse : "1", 1);
    setenv("FUYOU_CUDA_ATTENTION", "flash", 1);
    int rc = fy_backend_model_prepare(b, &cfg, B, T);
    unsetenv("FUYOU_CUDA_FUSE");
    unsetenv("FUYOU_CUDA_ATTENTION");
    assert_int_equal(rc, 0);
    struct fy_actplan_sizes sizes;
    struct fy_actplan_region r;
    assert_int_equal(fy_actplan_sizes_backend(&cfg, B, T, "cuda", &sizes), 0);
    assert_int_equal(fy_actplan_region_of(&sizes, FY_ACT_SWAPPABLE, &r), 0);
    struct swap_pool pool = {NULL, 16 * r.bytes + 32 * (nb + NC) * 4 + (1 << 20), 0};
    pool.size = (pool.size + 4095) / 4096 * 4096;
    pool.base = aligned_alloc(4096, pool.size);
    assert_non_null(pool.base);
    assert_int_equal(fy_backend_register_host(b, pool.base, pool.size), 0);
    float *w1 = take(&pool, nb * 4), *w2 = take(&pool, nb * 4);
    float *x = take(&pool, NC * 4), *dy = take(&pool, NC * 4);
    int32_t *pos = NULL;
    if (docs) { /* documents of 1..10 tokens */
        pos = take(&pool, N * 4);
        for (size_t i = 0, p = 0, len = 0; i < N; i++, p++) {
            if (p == len || i % T == 0)
                p = 0, len = 1 + i * 7 % 10;
            pos[i] = (int32_t)p;
        }
    }
    float *p1 = unit_params(1, 21), *p2 = unit_params(2, 21);
    memcpy(w1, p1, nb * 4);
    memcpy(w2, p2, nb * 4);
    free(p1);
    free(p2);
    uint64_t seed = 23;
    for (size_t i = 0; i < NC; i++) {
        x[i] = fy_test_uniform(&seed, -1, 1);
        dy[i] = fy_test_uniform(&seed, -1e-2f, 1e-2f);
    }
    struct two_blocks ref, run, again;
    two_blocks_take(&pool, &ref, NC, nb);
    two_blocks_take(&pool, &run, NC, nb);
    two_blocks_take(&pool, &again, NC, nb);
    char *reg1 = take(&pool, r.bytes), *reg2 = take(&pool, r.bytes);
    char *copy1 = malloc(r.bytes), *copy2 = malloc(r.bytes);
    assert_true(copy1 != NULL && copy2 != NULL);

    /* saved before model_swap: refused, nothing queued */
    struct fy_block_saved qkv = saved_of(reg1, &r, KBIT(QKV));
    assert_int_equal(fy_backend_model_block_forward(b, 1, w1, pos, x, run.y1, &qkv), -EINVAL);
    assert_int_equal(fy_backend_model_swap(b), 0);
    assert_int_equal(fy_backend_model_swap(b), 0); /* again: nothing more */

    /* the reference: one by one, nothing saved */
    assert_int_equal(fy_backend_model_block_forward(b, 1, w1, pos, x, ref.y1, NULL), 0);
    assert_int_equal(fy_backend_model_block_forward(b, 2, w2, pos, ref.y1, ref.y2, NULL), 0);
    assert_int_equal(
        fy_backend_model_block_backward(b, 2, w2, pos, ref.y1, dy, ref.dx2, ref.dp2, NULL), 0);
    assert_int_equal(
        fy_backend_model_block_backward(b, 1, w1, pos, x, ref.dx2, ref.dx1, ref.dp1, NULL), 0);

    assert_int_equal(fy_backend_model_set_queued(b, 1), 1);
    for (size_t m = 0; m < sizeof swap_masks / sizeof swap_masks[0]; m++) {
        unsigned mask = swap_masks[m];
        print_message("backend, FUYOU_CUDA_FUSE=%s, swapped kinds 0x%02x%s\n", fuse ? fuse : "1",
                      mask, docs ? ", documents" : "");
        struct fy_block_saved s1 = saved_of(reg1, &r, mask), s2 = saved_of(reg2, &r, mask);
        memset(reg1, 0xa5, r.bytes);
        memset(reg2, 0xa5, r.bytes);
        assert_int_equal(fy_backend_model_block_forward(b, 1, w1, pos, x, run.y1, &s1), 0);
        assert_int_equal(fy_backend_model_block_forward(b, 2, w2, pos, run.y1, run.y2, &s2), 0);
        assert_int_equal(fy_backend_model_finish(b, NULL, NULL), 0);
        assert_int_equal(
            fy_backend_model_block_backward(b, 2, w2, pos, run.y1, dy, run.dx2, run.dp2, &s2), 0);
        assert_int_equal(fy_backend_model_finish(b, NULL, NULL), 0);
        assert_int_equal(
            fy_backend_model_block_backward(b, 1, w1, pos, x, run.dx2, run.dx1, run.dp1, &s1), 0);
        assert_int_equal(fy_backend_model_finish(b, NULL, NULL), 0);
        assert_int_equal(fy_backend_model_finish(b, NULL, NULL), 0);
        two_blocks_equal(&run, &ref, NC, nb);
        memcpy(copy1, reg1, r.bytes);
        memcpy(copy2, reg2, r.bytes);
        /* clipping's second pass, both backwards in flight */
        assert_int_equal(
            fy_backend_model_block_backward(b, 2, w2, pos, run.y1, dy, again.dx2, again.dp2, &s2),
            0);
        assert_int_equal(
            fy_backend_model_block_backward(b, 1, w1, pos, x, again.dx2, again.dx1, again.dp1, &s1),
            0);
        assert_int_equal(fy_backend_model_finish(b, NULL, NULL), 0);
        assert_int_equal(fy_backend_model_finish(b, NULL, NULL), 0);
        assert_memory_equal(again.dx2, ref.dx2, NC * 4);
        assert_memory_equal(again.dp2, ref.dp2, nb * 4);
        assert_memory_equal(again.dx1, ref.dx1, NC * 4);
        assert_memory_equal(again.dp1, ref.dp1, nb * 4);
        assert_memory_equal(reg1, copy1, r.bytes); /* read, never written, by the backwards */
        assert_memory_equal(reg2, copy2, r.bytes);
        /* the forwards again over other poison: every byte of the saved kinds written, the same */
        memset(reg1, 0x5a, r.bytes);
        memset(reg2, 0x5a, r.bytes);
        assert_int_equal(fy_backend_model_block_forward(b, 1, w1, pos, x, again.y1, &s1), 0);
        assert_int_equal(fy_backend_model_block_forward(b, 2, w2, pos, again.y1, again.y2, &s2), 0);
        assert_int_equal(fy_backend_model_finish(b, NULL, NULL), 0);
        assert_int_equal(fy_backend_model_finish(b, NULL, NULL), 0);
        assert_memory_equal(again.y2, ref.y2, NC * 4);
        for (int k = 0; k < FY_ACT_KINDS; k++)
            if (mask & FY_ACT_BIT(k)) {
                assert_memory_equal(reg1 + r.offset[k], copy1 + r.offset[k], sizes.bytes[k]);
                assert_memory_equal(reg2 + r.offset[k], copy2 + r.offset[k], sizes.bytes[k]);
                assert_memory_not_equal(reg1 + r.offset[k], reg2 + r.offset[k], sizes.bytes[k]);
            }
    }
    fy_backend_model_set_queued(b, 0);
    fy_backend_close(&b); /* unregisters the pool */
    free(pool.base);
    free(copy1);
    free(copy2);
}

static void test_swapped_blocks_queued(void **state)
{
    swapped_blocks_check(NULL, 0);
    swapped_blocks_check("0", 0);
    swapped_blocks_check(NULL, 1);
}

/* The whole GPT-2 model with its rows packed with documents of up to 20 tokens (learned positions at
 * their own, attention within each) against the CPU backend given them: the flash attention and,
 * FUYOU_CUDA_ATTENTION=materialised, the materialising one (which masks the same scores without
 * skipping); and the windows' positions (t everywhere) give the bytes of none. */
static void packed_case(const char *attention)
{
    /* a backend of its own: the materialising attention's scratch is larger than the arena the
     * shared one sized to its first model */
    struct fy_backend *gpu = NULL;
    assert_int_equal(fy_backend_open(&gpu, "cuda", 256ull << 20), 0);
    struct fy_refmodel on_gpu, on_cpu, none;
    assert_int_equal(fy_refmodel_init(&on_gpu, &cfg, B, T, 71), 0);
    assert_int_equal(fy_refmodel_init(&on_cpu, &cfg, B, T, 71), 0);
    assert_int_equal(fy_refmodel_pack(&on_gpu, 20, 72), 0);
    assert_int_equal(fy_refmodel_pack(&on_cpu, 20, 72), 0);
    setenv("FUYOU_CUDA_ATTENTION", attention, 1); /* read when the model is prepared */
    int rc = fy_refmodel_forward_backward(&on_gpu, gpu);
    unsetenv("FUYOU_CUDA_ATTENTION");
    if (rc != 0)
        fail_msg("cuda: %s", on_gpu.err);
    if (fy_refmodel_forward_backward(&on_cpu, cpu) != 0)
        fail_msg("cpu: %s", on_cpu.err);
    print_message("packed documents, %s attention: loss gpu %.7f cpu %.7f\n", attention,
                  on_gpu.loss, on_cpu.loss);
    assert_true(fabs(on_gpu.loss - on_cpu.loss) <= 1e-2 * fabs(on_cpu.loss));
    assert_true(rel_err(on_gpu.logits, on_cpu.logits, (size_t)B * T * cfg.vocab, "packed logits") <
                3e-2);
    for (unsigned u = 0; u < on_gpu.n_units; u++) {
        char what[48];
        snprintf(what, sizeof what, "packed grad unit %u", u);
        assert_true(rel_err(on_gpu.grads[u], on_cpu.grads[u], on_gpu.sizes[u], what) < 3e-2);
    }
    /* the windows' positions against none at all: the same bytes */
    assert_int_equal(fy_refmodel_init(&none, &cfg, B, T, 71), 0);
    for (int i = 0; i < B * T; i++)
        on_gpu.positions[i] = i % T;
    memcpy(on_gpu.targets, none.targets, (size_t)B * T * sizeof *none.targets);
    setenv("FUYOU_CUDA_ATTENTION", attention, 1);
    rc = fy_refmodel_forward_backward(&on_gpu, gpu);
    if (rc == 0)
        rc = fy_refmodel_forward_backward(&none, gpu);
    unsetenv("FUYOU_CUDA_ATTENTION");
    if (rc != 0)
        fail_msg("cuda: %s %s", on_gpu.err, none.err);
    assert_memory_equal(&on_gpu.loss, &none.loss, sizeof none.loss);
    assert_memory_equal(on_gpu.logits, none.logits, (size_t)B * T * cfg.vocab * sizeof(float));
    for (unsigned u = 0; u < none.n_units; u++)
        assert_memory_equal(on_gpu.grads[u], none.grads[u], none.sizes[u] * sizeof(float));
    fy_refmodel_free(&on_gpu);
    fy_refmodel_free(&on_cpu);
    fy_refmodel_free(&none);
    fy_backend_close(&gpu);
}

static void test_packed_matches_cpu(void **state)
{
    packed_case("flash");
    packed_case("materialised");
}

/* ---- weights as bf16 in host memory ---- */


/* Floats of the pieces a pass reads and writes. */
struct wsizes {
    size_t NC, ne, nb, nf, nl;
};

static struct wsizes wsizes_of(const struct fy_refmodel *m)
{
    size_t N = (size_t)m->B * m->T;
    return (struct wsizes){N * m->cfg.n_embd, m->sizes[0], m->sizes[1], m->sizes[m->n_units - 1],
                           N * m->cfg.vocab};
}

/* Every output of the ops that take weights. */
struct wouts {
    float *x, *y, *dy, *dx, *dp, *dfin, *demb, *lg;
    double loss;
};

static void wouts_take(struct swap_pool *p, struct wouts *o, const struct wsizes *z)
{
    o->x = take(p, z->NC * 4);
    o->y = take(p, z->NC * 4);
    o->dy = take(p, z->NC * 4);
    o->dx = take(p, z->NC * 4);
    o->dp = take(p, z->nb * 4);
    o->dfin = take(p, z->nf * 4);
    o->demb = take(p, z->ne * 4);
    o->lg = take(p, z->nl * 4);
    /* the head overwrites dembed (zeros where it gives nothing): poison shows what it misses */
    memset(o->demb, 0xff, z->ne * 4);
}

static void wouts_equal(const struct wouts *a, const struct wouts *b, const struct wsizes *z)
{
    assert_memory_equal(a->x, b->x, z->NC * 4);
    assert_memory_equal(a->y, b->y, z->NC * 4);
    assert_memory_equal(&a->loss, &b->loss, sizeof a->loss);
    assert_memory_equal(a->dy, b->dy, z->NC * 4);
    assert_memory_equal(a->dfin, b->dfin, z->nf * 4);
    assert_memory_equal(a->demb, b->demb, z->ne * 4);
    assert_memory_equal(a->dx, b->dx, z->NC * 4);
    assert_memory_equal(a->dp, b->dp, z->nb * 4);
    assert_memory_equal(a->lg, b->lg, z->nl * 4);
}

/* Weights of the embeddings, block 1 and the final unit, in the dtype the backend is set to. */
struct wunits {
    const void *embed, *block, *fin;
};

/* Each op that takes weights once, one call at a time: embeddings, block 1 forward, the head with
 * gradients, block 1 backward from the head's dx, the logits. */
static void weights_pass(struct fy_backend *b, const struct fy_refmodel *m, const struct wunits *w,
                         struct wouts *o)
{
    assert_int_equal(fy_backend_model_embed_forward(b, w->embed, m->tokens, NULL, o->x), 0);
    assert_int_equal(fy_backend_model_block_forward(b, 1, w->block, NULL, o->x, o->y, NULL), 0);
    assert_int_equal(fy_backend_model_head(b, w->fin, w->embed, o->y, m->targets, &o->loss, o->dy,
                                         o->dfin, o->demb),
                     0);
    assert_int_equal(
        fy_backend_model_block_backward(b, 1, w->block, NULL, o->x, o->dy, o->dx, o->dp, NULL), 0);
    assert_int_equal(fy_backend_model_logits(b, w->fin, w->embed, o->y, o->lg), 0);
}

static void *weights_copy(struct swap_pool *p, const float *w, size_t n, int dtype)
{
    if (dtype == FY_DTYPE_F32)
        return memcpy(take(p, n * 4), w, n * 4);
    uint16_t *h = take(p, n * 2);
    for (size_t i = 0; i < n; i++)
        h[i] = fy_f32_to_bf16(w[i]);
    return h;
}

/* The same calls with bf16 weights as with their f32 originals give the same bytes (the device
 * rounds f32 weights to bf16 as fy_f32_to_bf16 does); the dtype chosen before model_prepare holds
 * after it. Queued, each call keeps the dtype it was made with while the next one, made after a
 * switch, is in flight: two block forwards (the second's input the first's output, handed on on
 * the device), two block backwards, a head and an embedding forward, each against the calls made
 * one at a time in f32. Host memory pinned, so that the calls really are in flight together. */
static void weights_bf16_case(const struct fy_model_config *c, const char *name)
{
    struct fy_refmodel m;
    if (fy_refmodel_init(&m, c, B, T, 31) != 0)
        fail_msg("%s: %s", name, m.err);
    print_message("%s: weights bf16 against f32\n", name);
    struct wsizes z = wsizes_of(&m);
    unsigned fin = m.n_units - 1;
    struct fy_backend *b = NULL;
    assert_int_equal(fy_backend_open(&b, "cuda", 0), 0);
    size_t set = 4 * (4 * z.NC + z.nb + z.nf + z.ne + z.nl) + 8 * 4096;
    struct swap_pool pool = {NULL, 5 * set + 2 * 4 * (z.ne + z.nb + z.nf) + (1 << 20), 0};
    pool.size = (pool.size + 4095) / 4096 * 4096;
    pool.base = aligned_alloc(4096, pool.size);
    assert_non_null(pool.base);
    assert_int_equal(fy_backend_register_host(b, pool.base, pool.size), 0);
    struct wunits w32 = {weights_copy(&pool, m.params[0], z.ne, FY_DTYPE_F32),
                         weights_copy(&pool, m.params[1], z.nb, FY_DTYPE_F32),
                         weights_copy(&pool, m.params[fin], z.nf, FY_DTYPE_F32)};
    struct wunits w16 = {weights_copy(&pool, m.params[0], z.ne, FY_DTYPE_BF16),
                         weights_copy(&pool, m.params[1], z.nb, FY_DTYPE_BF16),
                         weights_copy(&pool, m.params[fin], z.nf, FY_DTYPE_BF16)};
    struct wouts ref, got, q;
    wouts_take(&pool, &ref, &z);
    wouts_take(&pool, &got, &z);
    wouts_take(&pool, &q, &z);
    float *y2 = take(&pool, z.NC * 4), *dx1 = take(&pool, z.NC * 4), *dp1 = take(&pool, z.nb * 4);
    float *x_early = take(&pool, z.NC * 4), *q_dp1 = take(&pool, z.nb * 4);

    /* chosen before preparing: the first call after it takes bf16 */
    assert_int_equal(fy_backend_model_weight_dtype(b, FY_DTYPE_BF16), 0);
    assert_int_equal(fy_backend_model_prepare(b, c, B, T), 0);
    assert_int_equal(fy_backend_model_embed_forward(b, w16.embed, m.tokens, NULL, x_early), 0);
    assert_int_equal(fy_backend_model_weight_dtype(b, FY_DTYPE_F32), 0);
    weights_pass(b, &m, &w32, &ref);
    assert_memory_equal(x_early, ref.x, z.NC * 4);
    assert_int_equal(fy_backend_model_weight_dtype(b, FY_DTYPE_BF16), 0);
    weights_pass(b, &m, &w16, &got);
    wouts_equal(&got, &ref, &z);
    print_message("%s: every output the same bytes (loss %.6f)\n", name, ref.loss);

    /* references for the queued calls, one at a time in f32: block 1 again on its own output, and
     * the backward of the block's input from the backward's dx */
    float *dx2 = ref.dx, *dp2 = ref.dp;
    assert_int_equal(fy_backend_model_weight_dtype(b, FY_DTYPE_F32), 0);
    assert_int_equal(fy_backend_model_block_forward(b, 1, w32.block, NULL, ref.y, y2, NULL), 0);
    assert_int_equal(
        fy_backend_model_block_backward(b, 1, w32.block, NULL, ref.x, dx2, dx1, dp1, NULL), 0);

    assert_int_equal(fy_backend_model_set_queued(b, 1), 1);
    assert_int_equal(fy_backend_model_block_forward(b, 1, w32.block, NULL, ref.x, q.x, NULL), 0);
    assert_int_equal(fy_backend_model_weight_dtype(b, FY_DTYPE_BF16), 0);
    assert_int_equal(fy_backend_model_block_forward(b, 1, w16.block, NULL, q.x, q.y, NULL), 0);
    assert_int_equal(fy_backend_model_finish(b, NULL, NULL), 0);
    assert_int_equal(fy_backend_model_finish(b, NULL, NULL), 0);
    assert_memory_equal(q.x, ref.y, z.NC * 4);
    assert_memory_equal(q.y, y2, z.NC * 4);
    /* bf16 then f32, the second's dy the first's dx */
    assert_int_equal(
        fy_backend_model_block_backward(b, 1, w16.block, NULL, ref.x, ref.dy, q.dy, q.dp, NULL), 0);
    assert_int_equal(fy_backend_model_weight_dtype(b, FY_DTYPE_F32), 0);
    assert_int_equal(
        fy_backend_model_block_backward(b, 1, w32.block, NULL, ref.x, q.dy, q.dx, q_dp1, NULL), 0);
    assert_int_equal(fy_backend_model_finish(b, NULL, NULL), 0);
    assert_int_equal(fy_backend_model_finish(b, NULL, NULL), 0);
    assert_memory_equal(q.dy, dx2, z.NC * 4);
    assert_memory_equal(q.dp, dp2, z.nb * 4);
    assert_memory_equal(q.dx, dx1, z.NC * 4);
    assert_memory_equal(q_dp1, dp1, z.nb * 4);
    /* the final unit's weights (an untied head's lm_head after the norm) in bf16, then f32 */
    assert_int_equal(fy_backend_model_weight_dtype(b, FY_DTYPE_BF16), 0);
    assert_int_equal(fy_backend_model_head(b, w16.fin, w16.embed, ref.y, m.targets, &q.loss, q.y,
                                         q.dfin, q.demb),
                     0);
    assert_int_equal(fy_backend_model_weight_dtype(b, FY_DTYPE_F32), 0);
    assert_int_equal(fy_backend_model_embed_forward(b, w32.embed, m.tokens, NULL, q.x), 0);
    assert_int_equal(fy_backend_model_finish(b, NULL, NULL), 0);
    assert_int_equal(fy_backend_model_finish(b, NULL, NULL), 0);
    assert_memory_equal(&q.loss, &ref.loss, sizeof q.loss);
    assert_memory_equal(q.y, ref.dy, z.NC * 4);
    assert_memory_equal(q.dfin, ref.dfin, z.nf * 4);
    assert_memory_equal(q.demb, ref.demb, z.ne * 4);
    assert_memory_equal(q.x, ref.x, z.NC * 4);
    assert_int_equal(fy_backend_model_set_queued(b, 0), 0);
    print_message("%s: queued calls keep the dtype they were made with\n", name);
    fy_backend_close(&b); /* unregisters the pool */
    free(pool.base);
    fy_refmodel_free(&m);
}

static void test_bf16_host_weights_same_bits(void **state)
{
    weights_bf16_case(&cfg, "GPT-2");
    struct fy_model_config tied = fy_refmodel_llama_small(1), untied = fy_refmodel_llama_small(0);
    weights_bf16_case(&tied, "Llama, tied head");
    weights_bf16_case(&untied, "Llama, untied head");
}

int main(void)
{
    if (!fy_backend_cuda_built()) {
        printf("test_cuda_gpt: SKIPPED: this build has no CUDA backend (nvcc not found)\n");
        return FY_TEST_SKIP;
    }
    if (fy_backend_open(&cuda, "cuda", 0) < 0) {
        printf("test_cuda_gpt: SKIPPED: no usable CUDA device on this machine\n");
        return FY_TEST_SKIP;
    }
    if (fy_backend_open(&cpu, "cpu", 0) < 0 || fy_backend_model_prepare(cpu, &cfg, B, T) < 0 ||
        fy_backend_model_prepare(cuda, &cfg, B, T) < 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_units_match_cpu),
        cmocka_unit_test(test_bf16_host_activations_same_bits),
        cmocka_unit_test(test_budget_refused),
        cmocka_unit_test(test_swapped_blocks_queued),
        cmocka_unit_test(test_packed_matches_cpu),
        cmocka_unit_test(test_bf16_host_weights_same_bits),
    };
    int failed = cmocka_run_group_tests_name("cuda GPT units", tests, NULL, NULL);
    fy_backend_close(&cuda);
    fy_backend_close(&cpu);
    return failed;
}
