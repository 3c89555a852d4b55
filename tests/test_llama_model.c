/* Tests of the Llama model layout (common/model/model.c, common/formats/ckpt.c) and the Llama model pieces of the
 * CPU backend (gpu_worker/cpu/cpu_llama.c):
 *   - the block unit layout (fy_llama_unit_layout) against offsets counted by hand; unit sizes,
 *     tied and untied;
 *   - weight-decay segments cover every unit exactly, norms without decay, matrices with;
 *   - initialisation: norms 1, matrices N(0, 0.02), the same bits on any thread count;
 *   - model.conf keys and the store header round-trip every field, the config hash differs between
 *     the architectures and between Llama settings; a GPT-2 header leaves the new slots zero;
 *   - the embedding lookup and its backward; the head's loss against a float64 computation, and its
 *     gradients (dx, norm weight, lm_head or the tied embedding) against central finite differences
 *     of that float64 loss, untied and tied. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <omp.h>

#include "common/model/arch/arch.h"
#include "common/formats/ckpt.h"
#include "common/base/config.h"
#include "common/model/model.h"
#include "common/model/arch/llama.h"
#include "gpu_worker/cpu/cpu_llama.h"
#include "tests/testutil.h"

static struct fy_model_config llama(int tied, int llama3)
{
    struct fy_model_config c = {
        .n_layer = 2,
        .n_head = 4,
        .n_embd = 16,
        .vocab = 23,
        .ctx = 12,
        .arch = &fy_arch_llama,
        .family = fy_llama_family((struct fy_llama_fields){.n_kv_head = 2,
                                                           .n_inter = 24,
                                                           .tied = (uint32_t)tied,
                                                           .rms_eps = 1e-6f,
                                                           .rope_theta = 10000.0})};
    if (llama3) {
        fy_llama_mut(&c)->rope_type = FY_ROPE_LLAMA3;
        fy_llama_mut(&c)->rope_factor = 8.0;
        fy_llama_mut(&c)->rope_low_freq_factor = 1.0;
        fy_llama_mut(&c)->rope_high_freq_factor = 4.0;
        fy_llama_mut(&c)->rope_orig_max_pos = 8;
    }
    return c;
}

static void test_layout_and_sizes(void **state)
{
    (void)state;
    struct fy_model_config c = llama(0, 1);
    assert_int_equal(fy_model_config_validate(&c), 0);
    /* C 16, 4 heads of 4, 2 kv heads, MLP 24: the tensors of LlamaDecoderLayer in its order, norms
     * [16], q [16][16], k and v [8][16], o [16][16], gate and up [24][16], down [16][24] */
    struct fy_llama_unit_layout a;
    fy_llama_unit_layout(&c, &a);
    const size_t got[10] = {a.input_norm, a.q_proj,    a.k_proj,  a.v_proj,    a.o_proj,
                            a.post_norm,  a.gate_proj, a.up_proj, a.down_proj, a.total};
    const size_t want[10] = {0, 16, 272, 400, 528, 784, 800, 1184, 1568, 1952};
    for (int i = 0; i < 10; i++)
        assert_int_equal(got[i], want[i]);
    assert_int_equal(fy_model_unit_count(&c), 4);
    assert_int_equal(fy_model_unit_params(&c, 0), 23 * 16);
    assert_int_equal(fy_model_unit_params(&c, 1), a.total);
    assert_int_equal(fy_model_unit_params(&c, 3), 16 + 23 * 16);
    struct fy_model_config t = llama(1, 0);
    assert_int_equal(fy_model_unit_params(&t, 3), 16);
    /* 16 + 16*16 + 2 * 8*16 + 16*16 + 16 + 3 * 24*16 */
    assert_int_equal(a.total, 16 + 256 + 256 + 256 + 16 + 3 * 384);
    /* bad Llama settings are refused */
    struct fy_model_config bad = c;
    fy_llama_mut(&bad)->n_kv_head = 3;
    assert_int_not_equal(fy_model_config_validate(&bad), 0);
    bad = c;
    fy_llama_mut(&bad)->rms_eps = 0;
    assert_int_not_equal(fy_model_config_validate(&bad), 0);
    bad = c;
    bad.n_head = 16; /* head size 1: odd */
    fy_llama_mut(&bad)->n_kv_head = 1;
    assert_int_not_equal(fy_model_config_validate(&bad), 0);
}

static void test_segments_and_init(void **state)
{
    (void)state;
    for (int tied = 0; tied < 2; tied++) {
        struct fy_model_config c = llama(tied, 0);
        struct fy_llama_unit_layout l;
        fy_llama_unit_layout(&c, &l);
        for (unsigned u = 0; u < fy_model_unit_count(&c); u++) {
            size_t n = fy_model_unit_params(&c, u);
            struct fy_param_segment seg[FY_MODEL_MAX_SEGMENTS];
            int k = fy_model_decay_segments(&c, u, seg);
            assert_true(k >= 1);
            assert_int_equal(seg[0].begin, 0);
            assert_int_equal(seg[k - 1].end, n);
            for (int i = 1; i < k; i++)
                assert_int_equal(seg[i].begin, seg[i - 1].end);
            float *p = malloc(n * sizeof *p);
            fy_model_init_unit(&c, u, 9, p);
            /* every no-decay range is a norm (ones); every decay range a N(0, 0.02) matrix */
            for (int i = 0; i < k; i++) {
                size_t len = seg[i].end - seg[i].begin;
                double sum = 0, sq = 0;
                for (size_t j = seg[i].begin; j < seg[i].end; j++) {
                    if (!seg[i].decay)
                        assert_true(p[j] == 1.0f);
                    sum += p[j];
                    sq += (double)p[j] * p[j];
                }
                if (seg[i].decay) {
                    assert_true(len >= 200);
                    double mean = sum / len, sd = sqrt(sq / len - mean * mean);
                    assert_true(fabs(mean) < 0.005);
                    assert_true(fabs(sd - 0.02) < 0.004);
                } else {
                    assert_int_equal(len, c.n_embd);
                }
            }
            if (u >= 1 && u <= c.n_layer) {
                assert_int_equal(k, 4);
                assert_int_equal(seg[0].end, l.q_proj);
                assert_int_equal(seg[2].begin, l.post_norm);
            }
            free(p);
        }
    }
}

static void test_config_and_header_round_trip(void **state)
{
    (void)state;
    struct fy_model_config c = llama(0, 1);
    fy_llama_mut(&c)->rms_eps = 1e-5f;
    fy_llama_mut(&c)->rope_theta = 500000.0;
    struct fy_config *cfg = malloc(sizeof *cfg);
    fy_config_init(cfg);
    assert_int_equal(fy_model_config_to(&c, cfg), 0);
    struct fy_model_config back;
    assert_int_equal(fy_model_config_from(cfg, &back), 0);
    assert_true(fy_test_same_model(&c, &back));
    assert_true(fy_model_config_hash(&c) == fy_model_config_hash(&back));
    /* a GPT-2 config writes no model.arch nor Llama keys and reads back as GPT-2 */
    struct fy_model_config g = {.n_layer = 2, .n_head = 4, .n_embd = 16, .vocab = 23, .ctx = 12,
                                .arch = &fy_arch_gpt2};
    fy_config_init(cfg);
    assert_int_equal(fy_model_config_to(&g, cfg), 0);
    assert_null(fy_config_get(cfg, "model.arch"));
    assert_int_equal(fy_model_config_from(cfg, &back), 0);
    assert_memory_equal(&g, &back, sizeof g);
    free(cfg);

    /* the hash tells the architectures and every Llama field apart */
    assert_true(fy_model_config_hash(&g) != fy_model_config_hash(&c));
    struct fy_model_config d = c;
    fy_llama_mut(&d)->tied = 1;
    assert_true(fy_model_config_hash(&d) != fy_model_config_hash(&c));
    d = c;
    fy_llama_mut(&d)->rope_factor = 4.0;
    assert_true(fy_model_config_hash(&d) != fy_model_config_hash(&c));
    d = c;
    fy_llama_mut(&d)->rms_eps = 1e-6f;
    assert_true(fy_model_config_hash(&d) != fy_model_config_hash(&c));

    static uint8_t block[FY_COMMIT_RECORD_BYTES];
    static struct fy_storemeta m, mb;
    m = (struct fy_storemeta){.model = c, .step = 7, .seed = 5, .seq = 3, .copy = 1};
    fy_storemeta_encode(&m, block);
    assert_int_equal(fy_storemeta_decode(block, sizeof block, "test", &mb), 0);
    assert_true(fy_test_same_model(&mb.model, &c));
    assert_int_equal(mb.step, 7);
    /* a corrupted Llama slot is caught by the hash */
    block[4 * 16] ^= 1;
    assert_int_not_equal(fy_storemeta_decode(block, sizeof block, "test", &mb), 0);
    /* GPT-2 records leave the architecture's slots (14 to 29) zero */
    m.model = g;
    fy_storemeta_encode(&m, block);
    for (int i = 4 * 14; i < 4 * 30; i++)
        assert_int_equal(block[i], 0);
    assert_int_equal(fy_storemeta_decode(block, sizeof block, "test", &mb), 0);
    assert_true(fy_test_same_model(&mb.model, &g));
}

static void test_embed(void **state)
{
    (void)state;
    struct fy_model_config c = llama(0, 0);
    int B = 2, T = 3, C = 16, N = 6;
    const int32_t tok[6] = {4, 0, 4, 22, 9, 4};
    size_t VC = (size_t)c.vocab * C;
    float *e = malloc(VC * sizeof *e), *x = malloc((size_t)N * C * sizeof *x);
    float *de = calloc(VC, sizeof *de), *dx = malloc((size_t)N * C * sizeof *dx);
    uint64_t st = 1;
    for (size_t i = 0; i < VC; i++)
        e[i] = fy_test_uniform(&st, -1, 1);
    for (int i = 0; i < N * C; i++)
        dx[i] = fy_test_uniform(&st, -1, 1);
    fy_cpu_llama_embed_forward(&c, e, tok, x, B, T);
    for (int n = 0; n < N; n++)
        assert_memory_equal(x + (size_t)n * C, e + (size_t)tok[n] * C, C * sizeof *x);
    fy_cpu_llama_embed_backward(&c, tok, dx, de, B, T);
    for (int i = 0; i < C; i++) {
        assert_true(de[4 * C + i] == (dx[i] + dx[2 * C + i]) + dx[5 * C + i]);
        assert_true(de[1 * C + i] == 0.0f);
    }
    free(e);
    free(x);
    free(de);
    free(dx);
}

/* float64 loss of the head: mean over targets >= 0 of -log softmax(rmsnorm(x) W^T)[target]. */
static double ref_head_loss(const struct fy_model_config *c, const double *fin, const double *emb,
                            const double *x, const int32_t *tg, int N)
{
    int C = (int)c->n_embd, V = (int)c->vocab, count = 0;
    const double *W = fy_llama(c)->tied ? emb : fin + C;
    double loss = 0;
    for (int n = 0; n < N; n++) {
        if (tg[n] < 0)
            continue;
        count++;
        double ms = 0, xn[64], z[64], mx = -1e300, s = 0;
        for (int i = 0; i < C; i++)
            ms += x[n * C + i] * x[n * C + i];
        double r = 1.0 / sqrt(ms / C + fy_llama(c)->rms_eps);
        for (int i = 0; i < C; i++)
            xn[i] = fin[i] * (x[n * C + i] * r);
        for (int v = 0; v < V; v++) {
            z[v] = 0;
            for (int i = 0; i < C; i++)
                z[v] += xn[i] * W[(size_t)v * C + i];
            mx = z[v] > mx ? z[v] : mx;
        }
        for (int v = 0; v < V; v++)
            s += exp(z[v] - mx);
        loss += log(s) + mx - z[tg[n]];
    }
    return loss / count;
}

static void check_grad(const char *what, const float *ours, double *v, size_t n,
                       const struct fy_model_config *c, double *fin, double *emb, double *x,
                       const int32_t *tg, int N)
{
    double maxref = 0, worst = 0;
    double *ref = malloc(n * sizeof *ref);
    for (size_t i = 0; i < n; i++) {
        double keep = v[i], h = 1e-5;
        v[i] = keep + h;
        double lp = ref_head_loss(c, fin, emb, x, tg, N);
        v[i] = keep - h;
        double lm = ref_head_loss(c, fin, emb, x, tg, N);
        v[i] = keep;
        ref[i] = (lp - lm) / (2 * h);
        maxref = fabs(ref[i]) > maxref ? fabs(ref[i]) : maxref;
    }
    for (size_t i = 0; i < n; i++) {
        double err = fabs(ours[i] - ref[i]);
        assert_true(err <= 1e-4 * fabs(ref[i]) + 1e-4 * maxref);
        worst = err / maxref > worst ? err / maxref : worst;
    }
    fprintf(stderr, "  %s: worst error %.1e of the max |grad| %.2e\n", what, worst, maxref);
    free(ref);
}

static void head_case(int tied)
{
    struct fy_model_config c = llama(tied, 0);
    int B = 2, T = 5, N = B * T, C = (int)c.n_embd;
    size_t VC = (size_t)c.vocab * C, nfin = fy_model_unit_params(&c, 3);
    int32_t tg[10] = {1, 22, -1, 5, 5, 0, 17, -1, 3, 9};
    uint64_t st = 11 + (uint64_t)tied;
    float *fin = malloc(nfin * 4), *emb = malloc(VC * 4), *x = malloc((size_t)N * C * 4);
    double *dfin = malloc(nfin * 8), *demb = malloc(VC * 8), *dxx = malloc((size_t)N * C * 8);
    for (size_t i = 0; i < nfin; i++)
        dfin[i] = fin[i] = i < (size_t)C ? fy_test_uniform(&st, 0.5f, 1.5f) : fy_test_uniform(&st, -0.5f, 0.5f);
    for (size_t i = 0; i < VC; i++)
        demb[i] = emb[i] = fy_test_uniform(&st, -0.5f, 0.5f);
    for (int i = 0; i < N * C; i++)
        dxx[i] = x[i] = fy_test_uniform(&st, -2, 2);
    float *scratch = malloc(fy_cpu_llama_head_scratch(&c, B, T) * 4);
    float *gx = malloc((size_t)N * C * 4), *gfin = malloc(nfin * 4), *gemb = malloc(VC * 4);
    memset(gfin, 0x7f, nfin * 4); /* overwritten, whatever was there */
    memset(gemb, 0x7f, VC * 4);
    float loss =
        fy_cpu_llama_head_forward_backward(&c, fin, emb, x, tg, gx, gfin, gemb, scratch, B, T);
    float loss_only =
        fy_cpu_llama_head_forward_backward(&c, fin, emb, x, tg, NULL, NULL, NULL, scratch, B, T);
    assert_true(loss == loss_only);
    double ref = ref_head_loss(&c, dfin, demb, dxx, tg, N);
    fprintf(stderr, "head (%s): loss %.7f, float64 %.7f\n", tied ? "tied" : "untied", loss, ref);
    assert_true(fabs(loss - ref) < 1e-5 * fabs(ref));
    check_grad("dx", gx, dxx, (size_t)N * C, &c, dfin, demb, dxx, tg, N);
    check_grad("dfinal (norm, lm_head)", gfin, dfin, nfin, &c, dfin, demb, dxx, tg, N);
    if (tied) {
        check_grad("dembed", gemb, demb, VC, &c, dfin, demb, dxx, tg, N);
    } else {
        for (size_t i = 0; i < VC; i++)
            assert_true(gemb[i] == 0.0f);
    }
    /* logits agree with the head's forward */
    float *logits = malloc((size_t)N * c.vocab * 4);
    fy_cpu_llama_logits(&c, fin, emb, x, logits, scratch, B, T);
    double l2 = 0;
    for (int n = 0; n < N; n++) {
        if (tg[n] < 0)
            continue;
        const float *z = logits + (size_t)n * c.vocab;
        double mx = z[0], s = 0;
        for (uint32_t v = 1; v < c.vocab; v++)
            mx = z[v] > mx ? z[v] : mx;
        for (uint32_t v = 0; v < c.vocab; v++)
            s += exp(z[v] - mx);
        l2 += log(s) + mx - z[tg[n]];
    }
    assert_true(fabs(l2 / 8 - ref) < 1e-5 * fabs(ref));
    free(logits);
    free(fin);
    free(emb);
    free(x);
    free(dfin);
    free(demb);
    free(dxx);
    free(scratch);
    free(gx);
    free(gfin);
    free(gemb);
}

static void test_head_untied(void **state)
{
    (void)state;
    head_case(0);
}

static void test_head_tied(void **state)
{
    (void)state;
    head_case(1);
}

/* Initialisation spreads a large unit over the cores; the values depend on their index alone, so
 * one thread and four give the same bits (GPT-2's and Llama's embeddings, 3.2M values each). */
static void test_init_same_bits_on_any_thread_count(void **state)
{
    struct fy_model_config gpt = {.n_layer = 1, .n_head = 2, .n_embd = 64, .vocab = 50304,
                                .ctx = 64};
    struct fy_model_config llama = gpt;
    llama.arch = &fy_arch_llama;
    *fy_llama_mut(&llama) = (struct fy_llama_fields){
        .n_kv_head = 1, .n_inter = 128, .tied = 1, .rope_theta = 10000.0, .rms_eps = 1e-5f};
    const struct fy_model_config *models[] = {&gpt, &llama};
    for (int k = 0; k < 2; k++) {
        size_t n = fy_model_unit_params(models[k], 0);
        assert_true(n >= (1u << 20));
        float *one = malloc(n * sizeof *one), *four = malloc(n * sizeof *four);
        assert_non_null(one);
        assert_non_null(four);
        omp_set_num_threads(1);
        fy_model_init_unit(models[k], 0, 7, one);
        omp_set_num_threads(4);
        fy_model_init_unit(models[k], 0, 7, four);
        assert_memory_equal(one, four, n * sizeof *one);
        free(one);
        free(four);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_and_sizes),
        cmocka_unit_test(test_segments_and_init),
        cmocka_unit_test(test_init_same_bits_on_any_thread_count),
        cmocka_unit_test(test_config_and_header_round_trip),
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_head_untied),
        cmocka_unit_test(test_head_tied),
    };
    return cmocka_run_group_tests_name("llama model", tests, NULL, NULL);
}
