/* Tests of the CPU Llama block (gpu_worker/cpu/cpu_llama.c):
 *   - the block's parameter layout (fy_llama_unit_layout: Hugging Face's LlamaDecoderLayer order)
 *     and the Llama configuration checks (fy_model_config_validate);
 *   - the rotary inverse frequencies, plain and with llama3 scaling, against a float64 computation;
 *   - the fp32 block forward against an independent float64 forward written here with plain loops
 *     (ref_block_forward), and the fp32 backward (dx and every parameter gradient) against central
 *     finite differences of that float64 forward, for grouped-query (2 kv heads), multi-query
 *     (1 kv head) and llama3-scaled configurations; the final RMSNorm likewise;
 *   - the block against transformers' decoder layers (tests/reference/llama_ref.py), forward and
 *     backward in fp32: Llama with plain RoPE, llama3 scaling and an explicit head_dim; Qwen2 (q/k/v
 *     biases), Qwen3 (q/k norms, head_dim != width / heads), Mistral and Phi-3 (fused tensors) with
 *     a sliding window smaller than the sequence; odd widths, GQA 3:1 and 4:1; skipped, saying so, where python3 lacks torch
 *     or transformers, except under CI (CI=true), where their absence is a failure;
 *   - whole models (2 layers, vocabulary 1000) of each family against transformers' ForCausalLM
 *     (llama_ref.py model): Llama with head_dim 10, Qwen2 and Qwen3 tied and untied, Mistral and
 *     Phi-3 with windows smaller than the sequence, run unit by unit as the gpu worker does: the
 *     loss and every parameter's gradient (embeddings, each block's tensors, the final norm, the
 *     head); no pad token in the configs (transformers' padding_idx would zero that token's
 *     embedding gradient, which this backend does not);
 *   - documents packed in rows (gpu_worker/backend_ops.h's positions): the block with documents (RoPE
 *     at their positions, attention within each) against the float64 block given them and its
 *     backward against finite differences, with a window shorter than a document too; the block
 *     without them rejected against that reference; each document's rows of y and dx those of
 *     that document alone, bit for bit (every variation at once);
 *   - gradients accumulate into dparams; bit-identical results across runs and thread counts
 *     (plain Llama, and every Llama-like variation at once), with documents too; the windows'
 *     positions (t everywhere) giving the bits of no positions.
 *
 * The loss is L = sum(y * r) for a fixed random r (the backward is run with dy = r). Comparisons
 * are per tensor: an element passes when |ours - ref| <= rel * |ref| + abs * max|ref|, i.e. an
 * absolute floor scaled by the tensor's largest element, so near-zero elements are judged against
 * the tensor's magnitude rather than their own. Tolerances (measured values in the comments):
 *   - fp32 forward vs float64: rel 1e-5, floor 2e-6 (measured: worst error 3e-7 of the max);
 *   - fp32 backward vs finite differences of the float64 forward (step 1e-5, whose own error is
 *     about 1e-9): rel 1e-4, floor 1e-5 (measured: worst 4e-7 of the max);
 *   - against transformers (fp32 both sides, different summation orders): rel 1e-5, floor 1e-5
 *     (measured, worst of any tensor: Llama 9e-7, head_dim 7e-7, Qwen2 1.0e-6, Qwen3 6e-7,
 *     Mistral 6e-7, Phi-3 9e-7 of the max); whole models: the same tolerances (the loss: rel 1e-5)
 *     (measured, worst of any gradient tensor: Llama head_dim 2.0e-6, Qwen2 3.1e-6 tied and 2.0e-6
 *     untied, Qwen3 2.5e-6 tied and 1.8e-6 untied, Mistral 3.7e-6, Phi-3 1.4e-6 of the max; the
 *     loss within 2e-7 relative).
 * test_config_validate logs the refusals it provokes ("error: model: ..."): expected.
 * Each check can fail: a gradient element off by 1e-3 relative, and the plain-RoPE forward of a
 * llama3 configuration, are both rejected (tests below). */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/model/arch/arch.h"
#include "common/model/arch/llama.h"
#include "gpu_worker/cpu/cpu_llama.h"
#include "tests/refmodel.h"
#include "tests/testutil.h"

#define FWD_REL 1e-5
#define FWD_ABS 2e-6
#define FD_STEP 1e-5
#define FD_REL 1e-4
#define FD_ABS 1e-5
#define HF_REL 1e-5
#define HF_ABS 1e-5

static int have_transformers;
static int in_ci;

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

static float *alloc_nan(size_t n)
{
    float *p = xmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
    return p;
}

static float *alloc_rand(size_t n, uint64_t *st, float lo, float hi)
{
    float *p = xmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = fy_test_uniform(st, lo, hi);
    return p;
}

/* ---- the configurations ---- */

static struct fy_model_config cfg_plain(uint32_t C, uint32_t NH, uint32_t NKV, uint32_t I,
                                        double theta)
{
    /* one block's model: the vocabulary and the context matter to no block computation */
    return (struct fy_model_config){
        .n_layer = 1,
        .n_head = NH,
        .n_embd = C,
        .vocab = 2,
        .ctx = 1024,
        .arch = &fy_arch_llama,
        .family = fy_llama_family((struct fy_llama_fields){.n_kv_head = NKV,
                                                           .n_inter = I,
                                                           .rms_eps = 1e-5f,
                                                           .rope_theta = theta,
                                                           .rope_type = FY_ROPE_DEFAULT})};
}

/* head_dim 8 and theta 500000: wavelengths 6.3, 167, 4443 and 118000 against 512 / 4 = 128 and
 * 512 / 1 = 512, so one frequency stays, one is blended and two are divided by the factor. */
static struct fy_model_config cfg_llama3(uint32_t C, uint32_t NH, uint32_t NKV, uint32_t I)
{
    struct fy_model_config c = cfg_plain(C, NH, NKV, I, 500000.0);
    fy_llama_mut(&c)->rope_type = FY_ROPE_LLAMA3;
    fy_llama_mut(&c)->rope_factor = 8.0;
    fy_llama_mut(&c)->rope_low_freq_factor = 1.0;
    fy_llama_mut(&c)->rope_high_freq_factor = 4.0;
    fy_llama_mut(&c)->rope_orig_max_pos = 512;
    return c;
}

/* ---- the float64 reference, independent of cpu_llama.c ---- */

/* The tensors of LlamaDecoderLayer in order, with their sizes: the layout the module must have. */
enum { R_IN_NORM, R_Q, R_K, R_V, R_O, R_POST_NORM, R_GATE, R_UP, R_DOWN, R_COUNT };
static const char *const ref_names[R_COUNT] = {
    "input_layernorm",          "q_proj",    "k_proj",  "v_proj",   "o_proj",
    "post_attention_layernorm", "gate_proj", "up_proj", "down_proj"};

static void ref_offsets(const struct fy_model_config *c, size_t off[R_COUNT + 1])
{
    size_t C = c->n_embd, hd = C / c->n_head, I = fy_llama(c)->n_inter;
    size_t KV = fy_llama(c)->n_kv_head * hd;
    size_t n[R_COUNT] = {
        C, c->n_head * hd * C, KV * C, KV * C, C * c->n_head * hd, C, I * C, I * C, C * I};
    off[0] = 0;
    for (int i = 0; i < R_COUNT; i++)
        off[i + 1] = off[i] + n[i];
}

/* Inverse frequencies in double; *regions counts (unchanged, blended, divided) when non-NULL. */
static void ref_inv_freq(const struct fy_model_config *c, double *f, int regions[3])
{
    int hd = (int)(c->n_embd / c->n_head);
    if (regions)
        regions[0] = regions[1] = regions[2] = 0;
    for (int i = 0; i < hd / 2; i++) {
        f[i] = pow(fy_llama(c)->rope_theta, -2.0 * i / hd);
        if (fy_llama(c)->rope_type != FY_ROPE_LLAMA3)
            continue;
        double L = fy_llama(c)->rope_orig_max_pos, wl = 2.0 * M_PI / f[i];
        double lo = fy_llama(c)->rope_low_freq_factor, hi = fy_llama(c)->rope_high_freq_factor;
        int r;
        if (wl < L / hi) {
            r = 0;
        } else if (wl > L / lo) {
            f[i] /= fy_llama(c)->rope_factor;
            r = 2;
        } else {
            double s = (L / wl - lo) / (hi - lo);
            f[i] = (1.0 - s) * f[i] / fy_llama(c)->rope_factor + s * f[i];
            r = 1;
        }
        if (regions)
            regions[r]++;
    }
}

/* out[n][o] = sum_i in[n][i] w[o][i] */
static void ref_linear(double *out, const double *in, const double *w, int N, int IN, int OUT)
{
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OUT; o++) {
            double s = 0.0;
            for (int i = 0; i < IN; i++)
                s += in[(size_t)n * IN + i] * w[(size_t)o * IN + i];
            out[(size_t)n * OUT + o] = s;
        }
}

static void ref_rmsnorm(double *out, const double *in, const double *w, int N, int C, double eps)
{
    for (int n = 0; n < N; n++) {
        double ss = 0.0;
        for (int i = 0; i < C; i++)
            ss += in[(size_t)n * C + i] * in[(size_t)n * C + i];
        double r = 1.0 / sqrt(ss / C + eps);
        for (int i = 0; i < C; i++)
            out[(size_t)n * C + i] = w[i] * in[(size_t)n * C + i] * r;
    }
}

/* RoPE as transformers writes it: x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1], with
 * cos and sin of cat(freqs, freqs). x is [B][T][nh][hd]; row b, t at position pos[b][t] (pos NULL:
 * t). */
static void ref_rope(double *x, const double *f, const int32_t *pos, int B, int T, int nh, int hd)
{
    double *v = xmalloc((size_t)hd * sizeof *v);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < nh; h++) {
                double *p = x + (((size_t)b * T + t) * nh + h) * hd;
                memcpy(v, p, (size_t)hd * sizeof *v);
                for (int j = 0; j < hd; j++) {
                    double rot = j < hd / 2 ? -v[j + hd / 2] : v[j - hd / 2];
                    double a = (pos ? pos[b * T + t] : t) * f[j % (hd / 2)];
                    p[j] = v[j] * cos(a) + rot * sin(a);
                }
            }
    free(v);
}

/* The block in float64; pos (NULL: none): documents, each token attending to the tokens of its own
 * from t - pos[b][t] on (and within the window where there is one), rotated by its position. */
static void ref_block_forward(const struct fy_model_config *c, const double *p, const int32_t *pos,
                              const double *x, double *y, int B, int T)
{
    size_t off[R_COUNT + 1];
    ref_offsets(c, off);
    int C = (int)c->n_embd, NH = (int)c->n_head, NKV = (int)fy_llama(c)->n_kv_head, hd = C / NH;
    int I = (int)fy_llama(c)->n_inter, N = B * T;
    double eps = fy_llama(c)->rms_eps;
    double *f = xmalloc((size_t)hd / 2 * sizeof *f);
    ref_inv_freq(c, f, NULL);
    double *n1 = xmalloc((size_t)N * C * sizeof(double)),
           *h = xmalloc((size_t)N * C * sizeof(double));
    double *q = xmalloc((size_t)N * NH * hd * sizeof(double));
    double *k = xmalloc((size_t)N * NKV * hd * sizeof(double));
    double *v = xmalloc((size_t)N * NKV * hd * sizeof(double));
    double *a = xmalloc((size_t)N * NH * hd * sizeof(double));
    double *gate = xmalloc((size_t)N * I * sizeof(double)),
           *up = xmalloc((size_t)N * I * sizeof(double));
    double *s = xmalloc((size_t)T * sizeof(double));

    ref_rmsnorm(n1, x, p + off[R_IN_NORM], N, C, eps);
    ref_linear(q, n1, p + off[R_Q], N, C, NH * hd);
    ref_linear(k, n1, p + off[R_K], N, C, NKV * hd);
    ref_linear(v, n1, p + off[R_V], N, C, NKV * hd);
    ref_rope(q, f, pos, B, T, NH, hd);
    ref_rope(k, f, pos, B, T, NKV, hd);
    int W = (int)fy_llama(c)->sliding_window;
    for (int b = 0; b < B; b++)
        for (int hh = 0; hh < NH; hh++) {
            int g = hh / (NH / NKV); /* repeat_kv: kv head g serves query heads g*rep .. */
            for (int t = 0; t < T; t++) {
                const double *qv = q + (((size_t)b * T + t) * NH + hh) * hd;
                double mx = -INFINITY, sum = 0.0;
                int lo = pos ? t - pos[b * T + t] : 0;
                if (W > 0 && t - W + 1 > lo)
                    lo = t - W + 1;
                for (int t2 = 0; t2 < lo; t2++)
                    s[t2] = 0.0;
                for (int t2 = lo; t2 <= t; t2++) {
                    const double *kv = k + (((size_t)b * T + t2) * NKV + g) * hd;
                    double d = 0.0;
                    for (int i = 0; i < hd; i++)
                        d += qv[i] * kv[i];
                    s[t2] = d / sqrt((double)hd);
                    mx = fmax(mx, s[t2]);
                }
                for (int t2 = lo; t2 <= t; t2++)
                    sum += (s[t2] = exp(s[t2] - mx));
                double *o = a + (((size_t)b * T + t) * NH + hh) * hd;
                for (int i = 0; i < hd; i++) {
                    double acc = 0.0;
                    for (int t2 = lo; t2 <= t; t2++)
                        acc += s[t2] / sum * v[(((size_t)b * T + t2) * NKV + g) * hd + i];
                    o[i] = acc;
                }
            }
        }
    ref_linear(h, a, p + off[R_O], N, NH * hd, C);
    for (size_t i = 0; i < (size_t)N * C; i++)
        h[i] += x[i];
    ref_rmsnorm(n1, h, p + off[R_POST_NORM], N, C, eps); /* n1 reused as n2 */
    ref_linear(gate, n1, p + off[R_GATE], N, C, I);
    ref_linear(up, n1, p + off[R_UP], N, C, I);
    for (size_t i = 0; i < (size_t)N * I; i++)
        gate[i] = gate[i] / (1.0 + exp(-gate[i])) * up[i];
    ref_linear(y, gate, p + off[R_DOWN], N, I, C);
    for (size_t i = 0; i < (size_t)N * C; i++)
        y[i] += h[i];
    free(f), free(n1), free(h), free(q), free(k), free(v), free(a), free(gate), free(up), free(s);
}

/* ---- comparisons ---- */

/* Per-tensor check (see the top comment); prints one line, returns the number of bad elements. */
static int compare(const char *what, const float *ours, const double *ref, size_t n, double rel,
                   double abs_floor)
{
    double scale = 0.0, worst = 0.0;
    size_t worst_i = 0;
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)ours[i] - ref[i]);
        if (!(err <= rel * fabs(ref[i]) + abs_floor * scale)) /* also catches NaN */
            bad++;
        if (!(err <= worst)) {
            worst = err;
            worst_i = i;
        }
    }
    printf("  %-28s %5zu elements, max|ref| %.3e, worst |d| %.2e (%.1e of max) at %zu "
           "(ours %.7g, ref %.7g)%s\n",
           what, n, scale, worst, scale > 0 ? worst / scale : 0.0, worst_i, (double)ours[worst_i],
           ref[worst_i], bad ? "  FAIL" : "");
    return bad;
}

static double *to_double(const float *p, size_t n)
{
    double *d = xmalloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++)
        d[i] = p[i];
    return d;
}

/* ---- layout, configuration, frequencies ---- */

static void test_layout(void **state)
{
    struct fy_model_config c = cfg_plain(16, 4, 2, 24, 10000.0);
    struct fy_llama_unit_layout l;
    fy_llama_unit_layout(&c, &l);
    size_t off[R_COUNT + 1];
    ref_offsets(&c, off);
    size_t got[R_COUNT + 1] = {l.input_norm, l.q_proj,    l.k_proj,  l.v_proj,    l.o_proj,
                               l.post_norm,  l.gate_proj, l.up_proj, l.down_proj, l.total};
    for (int i = 0; i <= R_COUNT; i++)
        assert_int_equal(got[i], off[i]);
    /* 16 + 256 + 2 * 128 + 256 + 16 + 3 * 384 */
    assert_int_equal(l.total, 1952);
}

static void test_config_validate(void **state)
{
    struct fy_model_config good = cfg_llama3(32, 4, 2, 48);
    assert_int_equal(fy_model_config_validate(&good), 0);
    struct fy_model_config plain = cfg_plain(16, 4, 4, 24, 10000.0);
    assert_int_equal(fy_model_config_validate(&plain), 0);

    struct fy_model_config c = good;
    fy_llama_mut(&c)->n_kv_head = 3; /* does not divide 4 heads */
    assert_int_equal(fy_model_config_validate(&c), -EINVAL);
    c = good, c.n_head = 5; /* does not divide 32 */
    assert_int_equal(fy_model_config_validate(&c), -EINVAL);
    c = cfg_plain(12, 4, 2, 24, 10000.0); /* head_dim 3 is odd */
    assert_int_equal(fy_model_config_validate(&c), -EINVAL);
    c = good, fy_llama_mut(&c)->rms_eps = 0.0f;
    assert_int_equal(fy_model_config_validate(&c), -EINVAL);
    c = good, fy_llama_mut(&c)->rope_theta = -1.0;
    assert_int_equal(fy_model_config_validate(&c), -EINVAL);
    c = good, fy_llama_mut(&c)->rope_high_freq_factor = 1.0; /* not above low_freq_factor */
    assert_int_equal(fy_model_config_validate(&c), -EINVAL);
    c = good, fy_llama_mut(&c)->rope_orig_max_pos = 0;
    assert_int_equal(fy_model_config_validate(&c), -EINVAL);
    c = good, fy_llama_mut(&c)->n_inter = 0;
    assert_int_equal(fy_model_config_validate(&c), -EINVAL);
}

static void test_inv_freq(void **state)
{
    struct fy_model_config cs[] = {cfg_plain(16, 2, 1, 8, 10000.0), cfg_llama3(32, 4, 2, 48),
                                   cfg_llama3(128, 2, 1, 8)};
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
        int half = (int)(cs[k].n_embd / cs[k].n_head / 2), regions[3];
        float f[64];
        double r[64];
        fy_cpu_llama_rope_inv_freq(&cs[k], f);
        ref_inv_freq(&cs[k], r, regions);
        printf(
            "  config %zu: %d frequencies; llama3 regions unchanged %d, blended %d, divided %d\n",
            k, half, regions[0], regions[1], regions[2]);
        if (fy_llama(&cs[k])->rope_type == FY_ROPE_LLAMA3)
            assert_true(regions[0] >= 1 && regions[1] >= 1 && regions[2] >= 1);
        for (int i = 0; i < half; i++)
            if (!(fabs(f[i] - r[i]) <= 1e-6 * r[i]))
                fail_msg("config %zu inv_freq[%d] = %.9g, float64 %.9g", k, i, (double)f[i], r[i]);
    }
    /* transformers' values for cfg_llama3(32, 4, 2, 48) (LlamaRotaryEmbedding.inv_freq, printed
     * with transformers 5.17): 1, 2.7344e-02, 1.7678e-04, 6.6479e-06 */
    float f[4];
    struct fy_model_config c = cfg_llama3(32, 4, 2, 48);
    fy_cpu_llama_rope_inv_freq(&c, f);
    const double hf[4] = {1.0, 2.7344e-02, 1.7678e-04, 6.6479e-06};
    for (int i = 0; i < 4; i++)
        assert_true(fabs(f[i] - hf[i]) <= 1e-4 * hf[i]);
}

/* ---- the block against float64 and finite differences ---- */

struct blk {
    struct fy_model_config cfg;
    int B, T;
    const int32_t *pos; /* documents, or NULL */
    size_t np, nx;
    double *p, *x, *r, *y; /* float64 copies of the fp32 inputs; r the projection */
};

static double blk_loss(struct blk *b)
{
    ref_block_forward(&b->cfg, b->p, b->pos, b->x, b->y, b->B, b->T);
    double s = 0.0;
    for (size_t i = 0; i < b->nx; i++)
        s += b->y[i] * b->r[i];
    return s;
}

/* Central differences of the float64 loss with respect to v[0..n). */
static double *fd_grad(struct blk *b, double *v, size_t n)
{
    double *g = xmalloc(n * sizeof *g);
    for (size_t i = 0; i < n; i++) {
        double keep = v[i];
        v[i] = keep + FD_STEP;
        double lp = blk_loss(b);
        v[i] = keep - FD_STEP;
        double lm = blk_loss(b);
        v[i] = keep;
        g[i] = (lp - lm) / (2.0 * FD_STEP);
    }
    return g;
}

/* Random block parameters: norm weights near 1 (not 1, so their gradients matter), projections of
 * a size that keeps activations of order one and the attention far from uniform. */
static float *block_params(const struct fy_model_config *c, uint64_t *st)
{
    size_t off[R_COUNT + 1];
    ref_offsets(c, off);
    float *p = xmalloc(off[R_COUNT] * sizeof *p);
    for (int t = 0; t < R_COUNT; t++) {
        int norm = t == R_IN_NORM || t == R_POST_NORM;
        size_t in = t == R_O ? c->n_embd : t == R_DOWN ? fy_llama(c)->n_inter : c->n_embd;
        float a = norm ? 0.3f : (float)(2.0 / sqrt((double)in));
        for (size_t i = off[t]; i < off[t + 1]; i++)
            p[i] = (norm ? 1.0f : 0.0f) + fy_test_uniform(st, -a, a);
    }
    return p;
}

/* Forward against float64, then dx and every parameter gradient against finite differences, with
 * the documents of pos (NULL: none). Returns the number of bad elements; corrupt_dx (when non-zero)
 * scales dx[3] by (1 + corrupt_dx) first, for the self-test of the checker. */
static int check_block_at(const struct fy_model_config *cfg, const int32_t *pos, int B, int T,
                          uint64_t seed, double corrupt_dx)
{
    assert_int_equal(fy_model_config_validate(cfg), 0);
    uint64_t st = seed;
    struct fy_llama_unit_layout l;
    fy_llama_unit_layout(cfg, &l);
    size_t nx = (size_t)B * T * cfg->n_embd, ns = fy_cpu_llama_block_scratch(cfg, B, T);
    float *p = block_params(cfg, &st), *x = alloc_rand(nx, &st, -1.5f, 1.5f);
    float *r = alloc_rand(nx, &st, -1, 1), *y = alloc_nan(nx), *dx = alloc_nan(nx);
    float *scratch = alloc_nan(ns), *dp = xmalloc(l.total * sizeof *dp);
    memset(dp, 0, l.total * sizeof *dp);

    fy_cpu_llama_block_forward(cfg, p, pos, x, y, scratch, B, T);
    fy_cpu_llama_block_backward(cfg, p, pos, x, r, dx, dp, scratch, B, T);
    if (corrupt_dx != 0.0)
        dx[3] *= (float)(1.0 + corrupt_dx);

    struct blk b = {.cfg = *cfg, .B = B, .T = T, .pos = pos, .np = l.total, .nx = nx};
    b.p = to_double(p, l.total), b.x = to_double(x, nx), b.r = to_double(r, nx);
    b.y = xmalloc(nx * sizeof *b.y);
    blk_loss(&b);
    int bad = compare("forward y vs float64", y, b.y, nx, FWD_REL, FWD_ABS);

    double *gx = fd_grad(&b, b.x, nx);
    bad += compare("dx vs finite differences", dx, gx, nx, FD_REL, FD_ABS);
    free(gx);
    size_t off[R_COUNT + 1];
    ref_offsets(cfg, off);
    for (int t = 0; t < R_COUNT; t++) {
        size_t n = off[t + 1] - off[t];
        double *g = fd_grad(&b, b.p + off[t], n);
        char name[64];
        snprintf(name, sizeof name, "d%s", ref_names[t]);
        bad += compare(name, dp + off[t], g, n, FD_REL, FD_ABS);
        free(g);
    }
    free(p), free(x), free(r), free(y), free(dx), free(scratch), free(dp);
    free(b.p), free(b.x), free(b.r), free(b.y);
    return bad;
}

static int check_block(const struct fy_model_config *cfg, int B, int T, uint64_t seed,
                       double corrupt_dx)
{
    return check_block_at(cfg, NULL, B, T, seed, corrupt_dx);
}

/* Documents packed in rows (gpu_worker/backend_ops.h's positions), B 2 x T 7: row 0 holds documents
 * of 4, 1 and 2 tokens, row 1 one of 6 and a single token (padding). */
static const int32_t packed_pos[2 * 7] = {0, 1, 2, 3, 0, 0, 1, /* */ 0, 1, 2, 3, 4, 5, 0};

static void test_block_documents(void **state)
{
    struct fy_model_config c = cfg_plain(16, 4, 2, 24, 10000.0);
    assert_int_equal(check_block_at(&c, packed_pos, 2, 7, 104, 0.0), 0);
}

/* A sliding window smaller than a document, with documents (Mistral's and Phi-3's). */
static void test_block_documents_window(void **state)
{
    struct fy_model_config c = cfg_llama3(32, 4, 2, 40);
    fy_llama_mut(&c)->sliding_window = 3;
    assert_int_equal(check_block_at(&c, packed_pos, 2, 7, 105, 0.0), 0);
}

/* The checks see the documents: the block run without them is rejected against the float64 block
 * with them. */
static void test_checker_catches_missing_documents(void **state)
{
    struct fy_model_config c = cfg_plain(16, 4, 2, 24, 10000.0);
    int B = 2, T = 7;
    uint64_t st = 104;
    size_t nx = (size_t)B * T * c.n_embd;
    float *p = block_params(&c, &st), *x = alloc_rand(nx, &st, -1.5f, 1.5f), *y = alloc_nan(nx);
    float *scratch = alloc_nan(fy_cpu_llama_block_scratch(&c, B, T));
    fy_cpu_llama_block_forward(&c, p, NULL, x, y, scratch, B, T);
    struct fy_llama_unit_layout l;
    fy_llama_unit_layout(&c, &l);
    double *xd = to_double(x, nx), *pd = to_double(p, l.total), *yd = xmalloc(nx * sizeof *yd);
    ref_block_forward(&c, pd, packed_pos, xd, yd, B, T);
    assert_true(compare("y without documents vs float64 with", y, yd, nx, FWD_REL, FWD_ABS) > 0);
    free(p), free(x), free(y), free(scratch), free(xd), free(pd), free(yd);
}

/* Each document of a packed batch computes as it would alone: its rows of y and dx are those of a
 * batch of that document only, bit for bit (every Llama-like variation at once, a window of 3
 * shorter than a document). */
static void test_block_documents_alone(void **state)
{
    struct fy_model_config c = cfg_llama3(40, 4, 2, 24);
    fy_llama_mut(&c)->head_dim = 10;
    fy_llama_mut(&c)->qkv_bias = fy_llama_mut(&c)->qk_norm = 1;
    fy_llama_mut(&c)->sliding_window = 3;
    const int B = 2, T = 7, C = 40;
    uint64_t st = 106;
    struct fy_llama_unit_layout l;
    fy_llama_unit_layout(&c, &l);
    size_t nx = (size_t)B * T * C;
    float *p = alloc_rand(l.total, &st, -0.3f, 0.3f), *x = alloc_rand(nx, &st, -1, 1);
    float *r = alloc_rand(nx, &st, -1, 1), *y = alloc_nan(nx), *dx = alloc_nan(nx);
    float *dp = xmalloc(l.total * sizeof *dp);
    float *scratch = alloc_nan(fy_cpu_llama_block_scratch(&c, B, T));
    memset(dp, 0, l.total * sizeof *dp);
    fy_cpu_llama_block_forward(&c, p, packed_pos, x, y, scratch, B, T);
    fy_cpu_llama_block_backward(&c, p, packed_pos, x, r, dx, dp, scratch, B, T);
    int docs = 0;
    for (int b = 0; b < B; b++)
        for (int t0 = 0; t0 < T;) {
            int n = 1;
            while (t0 + n < T && packed_pos[b * T + t0 + n] != 0)
                n++;
            size_t at = ((size_t)b * T + t0) * C;
            float *y1 = alloc_nan((size_t)n * C), *dx1 = alloc_nan((size_t)n * C);
            float *dp1 = xmalloc(l.total * sizeof *dp1);
            float *s1 = alloc_nan(fy_cpu_llama_block_scratch(&c, 1, n));
            memset(dp1, 0, l.total * sizeof *dp1);
            fy_cpu_llama_block_forward(&c, p, NULL, x + at, y1, s1, 1, n);
            fy_cpu_llama_block_backward(&c, p, NULL, x + at, r + at, dx1, dp1, s1, 1, n);
            assert_memory_equal(y1, y + at, (size_t)n * C * sizeof(float));
            assert_memory_equal(dx1, dx + at, (size_t)n * C * sizeof(float));
            free(y1), free(dx1), free(dp1), free(s1);
            docs++;
            t0 += n;
        }
    assert_int_equal(docs, 5);
    free(p), free(x), free(r), free(y), free(dx), free(dp), free(scratch);
}

static void test_block_gqa(void **state)
{
    struct fy_model_config c = cfg_plain(16, 4, 2, 24, 10000.0);
    assert_int_equal(check_block(&c, 2, 5, 101, 0.0), 0);
}

static void test_block_mqa(void **state)
{
    struct fy_model_config c = cfg_plain(16, 4, 1, 24, 10000.0);
    assert_int_equal(check_block(&c, 2, 5, 102, 0.0), 0);
}

static void test_block_llama3(void **state)
{
    struct fy_model_config c = cfg_llama3(32, 4, 2, 40);
    assert_int_equal(check_block(&c, 2, 5, 103, 0.0), 0);
}

/* The checks can fail: one dx element off by 1e-3 relative is caught... */
static void test_checker_catches_wrong_gradient(void **state)
{
    struct fy_model_config c = cfg_plain(16, 4, 2, 24, 10000.0);
    assert_true(check_block(&c, 2, 5, 101, 1e-3) > 0);
}

/* ... and so is the forward of a llama3 configuration computed with plain RoPE. */
static void test_checker_catches_wrong_rope(void **state)
{
    struct fy_model_config c = cfg_llama3(32, 4, 2, 40), plain = c;
    fy_llama_mut(&plain)->rope_type = FY_ROPE_DEFAULT;
    int B = 2, T = 5;
    uint64_t st = 103;
    size_t nx = (size_t)B * T * c.n_embd;
    float *p = block_params(&c, &st), *x = alloc_rand(nx, &st, -1.5f, 1.5f), *y = alloc_nan(nx);
    float *scratch = alloc_nan(fy_cpu_llama_block_scratch(&c, B, T));
    fy_cpu_llama_block_forward(&plain, p, NULL, x, y, scratch, B, T);
    double *dx = to_double(x, nx);
    struct fy_llama_unit_layout l;
    fy_llama_unit_layout(&c, &l);
    double *pd = to_double(p, l.total), *yd = xmalloc(nx * sizeof *yd);
    ref_block_forward(&c, pd, NULL, dx, yd, B, T);
    assert_true(compare("plain-RoPE y vs llama3 float64", y, yd, nx, FWD_REL, FWD_ABS) > 0);
    free(p), free(x), free(y), free(scratch), free(dx), free(pd), free(yd);
}

/* dparams is accumulated into, not overwritten. */
static void test_backward_accumulates(void **state)
{
    struct fy_model_config c = cfg_plain(16, 4, 2, 24, 10000.0);
    int B = 2, T = 5;
    uint64_t st = 7;
    struct fy_llama_unit_layout l;
    fy_llama_unit_layout(&c, &l);
    size_t nx = (size_t)B * T * c.n_embd;
    float *p = block_params(&c, &st), *x = alloc_rand(nx, &st, -1, 1),
          *r = alloc_rand(nx, &st, -1, 1);
    float *dx = alloc_nan(nx), *scratch = alloc_nan(fy_cpu_llama_block_scratch(&c, B, T));
    float *g0 = xmalloc(l.total * sizeof *g0), *before = alloc_rand(l.total, &st, -1, 1);
    float *g1 = xmalloc(l.total * sizeof *g1);
    memset(g0, 0, l.total * sizeof *g0);
    memcpy(g1, before, l.total * sizeof *g1);
    fy_cpu_llama_block_backward(&c, p, NULL, x, r, dx, g0, scratch, B, T);
    fy_cpu_llama_block_backward(&c, p, NULL, x, r, dx, g1, scratch, B, T);
    for (size_t i = 0; i < l.total; i++) /* a few ulps of the starting values */
        if (!(fabsf(g1[i] - before[i] - g0[i]) <= 1e-6f * (1.0f + fabsf(g0[i]))))
            fail_msg("dparams[%zu]: %g - %g != %g", i, (double)g1[i], (double)before[i],
                     (double)g0[i]);
    free(p), free(x), free(r), free(dx), free(scratch), free(g0), free(g1), free(before);
}

/* ---- the final norm ---- */

static void test_final_norm(void **state)
{
    struct fy_model_config c = cfg_plain(16, 4, 2, 24, 10000.0);
    int B = 2, T = 5, C = 16, N = B * T;
    size_t nx = (size_t)N * C;
    uint64_t st = 31;
    float *w = alloc_rand(C, &st, 0.7f, 1.3f), *x = alloc_rand(nx, &st, -1.5f, 1.5f);
    float *r = alloc_rand(nx, &st, -1, 1), *y = alloc_nan(nx), *rstd = alloc_nan(N),
          *dx = alloc_nan(nx);
    float *dw = xmalloc(C * sizeof *dw);
    memset(dw, 0, C * sizeof *dw);
    fy_cpu_llama_norm_forward(&c, w, x, y, rstd, B, T);
    fy_cpu_llama_norm_backward(&c, w, x, rstd, r, dx, dw, B, T);

    double *wd = to_double(w, C), *xd = to_double(x, nx), *yd = xmalloc(nx * sizeof *yd);
    ref_rmsnorm(yd, xd, wd, N, C, fy_llama(&c)->rms_eps);
    int bad = compare("norm y vs float64", y, yd, nx, FWD_REL, FWD_ABS);
    /* finite differences of sum(rmsnorm(x) * r) */
    double *gx = xmalloc(nx * sizeof *gx), *gw = xmalloc(C * sizeof *gw);
    for (int pass = 0; pass < 2; pass++) {
        double *v = pass ? wd : xd, *g = pass ? gw : gx;
        size_t n = pass ? (size_t)C : nx;
        for (size_t i = 0; i < n; i++) {
            double keep = v[i], l[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                v[i] = keep + (sgn ? -FD_STEP : FD_STEP);
                ref_rmsnorm(yd, xd, wd, N, C, fy_llama(&c)->rms_eps);
                l[sgn] = 0.0;
                for (size_t j = 0; j < nx; j++)
                    l[sgn] += yd[j] * r[j];
            }
            v[i] = keep;
            g[i] = (l[0] - l[1]) / (2.0 * FD_STEP);
        }
    }
    bad += compare("norm dx vs finite differences", dx, gx, nx, FD_REL, FD_ABS);
    bad += compare("norm dw vs finite differences", dw, gw, C, FD_REL, FD_ABS);
    assert_int_equal(bad, 0);
    free(w), free(x), free(r), free(y), free(rstd), free(dx), free(dw);
    free(wd), free(xd), free(yd), free(gx), free(gw);
}

/* ---- against transformers ---- */

#define HF_MAGIC 0x4C4C5946

/* A Llama-like family's block config: cfg_plain's, with the family's variations. */
static struct fy_model_config cfg_family(const struct fy_arch *arch, uint32_t C, uint32_t NH,
                                         uint32_t NKV, uint32_t I, uint32_t hd, uint32_t window)
{
    struct fy_model_config c = cfg_plain(C, NH, NKV, I, 500000.0);
    c.arch = arch;
    /* the flags the family implies, as its own init would set them */
    const struct fy_family_options o = {.kv_heads = NKV,
                                        .ffn = I,
                                        .head_dim = hd,
                                        .rms_eps = fy_llama(&c)->rms_eps,
                                        .rope_theta = 500000.0};
    assert_int_equal(arch->from_options(&o, &c), 0);
    fy_llama_mut(&c)->sliding_window = window;
    return c;
}

/* The tensors of a block's layout in order (absent ones left out): n of them, names and offsets,
 * off[n] the total. */
static int layout_parts(const struct fy_model_config *c, const char *names[16], size_t off[17])
{
    struct fy_llama_unit_layout l;
    fy_llama_unit_layout(c, &l);
    const struct {
        const char *name;
        size_t at;
    } all[] = {{"input_layernorm", l.input_norm},
               {"q_proj", l.q_proj},
               {"k_proj", l.k_proj},
               {"v_proj", l.v_proj},
               {"q/k/v biases", l.q_bias},
               {"o_proj", l.o_proj},
               {"q_norm", l.q_norm},
               {"k_norm", l.k_norm},
               {"post_attention_layernorm", l.post_norm},
               {"gate_proj", l.gate_proj},
               {"up_proj", l.up_proj},
               {"down_proj", l.down_proj}};
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i].at != FY_LLAMA_ABSENT) {
            names[n] = all[i].name;
            off[n++] = all[i].at;
        }
    off[n] = l.total;
    for (int i = 0; i < n; i++)
        assert_true(off[i] < off[i + 1]);
    return n;
}

struct hf_case {
    const char *name, *args; /* llama_ref.py's arguments after OUT (a block's, or a model's) */
    struct fy_model_config cfg;
    int B, T;
};

/* Runs llama_ref.py once for the n cases ("OUT ARGS", each after `command`: "" for a block,
 * "model " for a model; OUT in a fresh directory, removed after), then compare() on each; returns
 * the number of bad elements. Skips, saying so, without torch and transformers, except under CI,
 * where that fails. */
static int llama_ref_cases(const char *command, const struct hf_case *cases, int n,
                           int (*compare_case)(const struct hf_case *, const char *))
{
    if (!have_transformers) {
        if (in_ci)
            fail_msg(
                "python3 with torch and transformers is missing under CI: .ci/run installs them");
        printf("test_cpu_llama: skipped: python3 with torch and transformers is needed "
               "(pip install torch==2.5.1 transformers==5.17.0)\n");
        skip();
    }
    char script[4096];
    if (fy_refmodel_script("llama_ref.py", script, sizeof script) != 0)
        fail_msg("cannot read %s (run from the repository root)", script);
    char *dir = fy_test_tmpdir("llama");
    assert_non_null(dir);
    char(*paths)[600] = xmalloc((size_t)n * sizeof *paths);
    char(*args)[1024] = xmalloc((size_t)n * sizeof *args);
    char **argv = xmalloc((size_t)(n + 4) * sizeof *argv);
    argv[0] = "python3", argv[1] = script, argv[2] = "run";
    for (int i = 0; i < n; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/case%d.bin", dir, i);
        snprintf(args[i], sizeof args[i], "%s%s %s", command, paths[i], cases[i].args);
        argv[3 + i] = args[i];
    }
    argv[3 + n] = NULL;
    int st = fy_refmodel_run(argv, 300);
    if (st != 0)
        fail_msg("%s: exit status %d", script, st);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        assert_int_equal(fy_model_config_validate(&cases[i].cfg), 0);
        printf(" %s\n", cases[i].name);
        bad += compare_case(&cases[i], paths[i]);
    }
    fy_test_rmdir(dir);
    free(dir), free(paths), free(args), free(argv);
    return bad;
}

static char *read_ref(const char *path, size_t *len)
{
    char *buf = fy_test_slurp(path, len);
    if (buf == NULL)
        fail_msg("%s: cannot read what llama_ref.py wrote", path);
    return buf;
}

/* Reads llama_ref.py's OUT file, checks that its header is the case's, runs our block on its
 * weights, x and dy, and compares y, dx and every parameter gradient. */
static int hf_compare(const struct hf_case *hc, const char *path)
{
    size_t len = 0;
    char *buf = read_ref(path, &len);
    const struct fy_model_config *c = &hc->cfg;
    struct fy_llama_unit_layout l;
    fy_llama_unit_layout(c, &l);
    size_t nx = (size_t)hc->B * hc->T * c->n_embd, P = l.total;
    int32_t h[16];
    double d[8];
    assert_true(len >= sizeof h + sizeof d);
    memcpy(h, buf, sizeof h);
    memcpy(d, buf + sizeof h, sizeof d);
    int llama3 = fy_llama(c)->rope_type == FY_ROPE_LLAMA3;
    int32_t want[15] = {HF_MAGIC,
                        2,
                        hc->B,
                        hc->T,
                        (int32_t)c->n_embd,
                        (int32_t)c->n_head,
                        (int32_t)fy_llama(c)->n_kv_head,
                        (int32_t)fy_llama(c)->n_inter,
                        llama3,
                        llama3 ? (int32_t)fy_llama(c)->rope_orig_max_pos : 0,
                        (int32_t)P,
                        (int32_t)fy_llama(c)->head_dim,
                        (int32_t)fy_llama(c)->qkv_bias,
                        (int32_t)fy_llama(c)->qk_norm,
                        (int32_t)fy_llama(c)->sliding_window};
    for (int i = 0; i < 15; i++)
        if (h[i] != want[i])
            fail_msg("%s: header slot %d is %d, expected %d", path, i, h[i], want[i]);
    assert_true(fabs(d[0] - fy_llama(c)->rms_eps) <= 1e-12 && d[1] == fy_llama(c)->rope_theta);
    if (llama3)
        assert_true(d[2] == fy_llama(c)->rope_factor && d[3] == fy_llama(c)->rope_low_freq_factor &&
                    d[4] == fy_llama(c)->rope_high_freq_factor);
    assert_int_equal(len, sizeof h + sizeof d + (2 * P + 4 * nx) * sizeof(float));

    const float *f = (const float *)(buf + sizeof h + sizeof d);
    const float *params = f, *x = params + P, *dy = x + nx, *y_ref = dy + nx, *dx_ref = y_ref + nx;
    const float *dp_ref = dx_ref + nx;
    float *y = alloc_nan(nx), *dx = alloc_nan(nx), *dp = xmalloc(P * sizeof *dp);
    float *scratch = alloc_nan(fy_cpu_llama_block_scratch(c, hc->B, hc->T));
    memset(dp, 0, P * sizeof *dp);
    fy_cpu_llama_block_forward(c, params, NULL, x, y, scratch, hc->B, hc->T);
    fy_cpu_llama_block_backward(c, params, NULL, x, dy, dx, dp, scratch, hc->B, hc->T);

    double *ref = to_double(y_ref, nx);
    int bad = compare("y vs transformers", y, ref, nx, HF_REL, HF_ABS);
    free(ref);
    ref = to_double(dx_ref, nx);
    bad += compare("dx vs transformers", dx, ref, nx, HF_REL, HF_ABS);
    free(ref);
    const char *names[16];
    size_t off[17];
    int parts = layout_parts(c, names, off);
    for (int t = 0; t < parts; t++) {
        char name[64];
        snprintf(name, sizeof name, "d%s vs transformers", names[t]);
        ref = to_double(dp_ref + off[t], off[t + 1] - off[t]);
        bad += compare(name, dp + off[t], ref, off[t + 1] - off[t], HF_REL, HF_ABS);
        free(ref);
    }
    free(y), free(dx), free(dp), free(scratch), free(buf);
    return bad;
}

static void test_transformers(void **state)
{
    const struct hf_case cases[] = {
        {"GQA, rope theta 500000",
         "--batch 2 --seq 7 --embd 32 --heads 4 --kv-heads 2 --inter 48 "
         "--eps 1e-5 --theta 500000 --seed 5",
         cfg_plain(32, 4, 2, 48, 500000.0), 2, 7},
        {"GQA, llama3 rope scaling",
         "--batch 2 --seq 7 --embd 32 --heads 4 --kv-heads 2 --inter 48 "
         "--eps 1e-5 --theta 500000 --seed 6 --llama3 8 1 4 512",
         cfg_llama3(32, 4, 2, 48), 2, 7},
        /* the Llama-like families: odd widths, GQA 3:1 and 4:1, head_dim != width / heads, a
         * window smaller than the sequence */
        {"Llama, head_dim 10 (width 36, 3 heads, GQA 3:1)",
         "--batch 2 --seq 7 --embd 36 --heads 3 "
         "--kv-heads 1 --inter 40 --seed 7 --family llama --head-dim 10",
         cfg_family(&fy_arch_llama, 36, 3, 1, 40, 10, 0), 2, 7},
        {"Qwen2, q/k/v biases (width 36, GQA 3:1)",
         "--batch 2 --seq 7 --embd 36 --heads 6 "
         "--kv-heads 2 --inter 40 --seed 8 --family qwen2",
         cfg_family(&fy_arch_qwen2, 36, 6, 2, 40, 0, 0), 2, 7},
        {"Qwen3, q/k norms, head_dim 14 (width 44, GQA 4:1)",
         "--batch 2 --seq 7 --embd 44 "
         "--heads 4 --kv-heads 1 --inter 40 --seed 9 --family qwen3 --head-dim 14",
         cfg_family(&fy_arch_qwen3, 44, 4, 1, 40, 14, 0), 2, 7},
        {"Mistral, window 3 < 9 (width 36, GQA 3:1, head_dim 8)",
         "--batch 2 --seq 9 --embd 36 "
         "--heads 3 --kv-heads 1 --inter 40 --seed 10 --family mistral --head-dim 8 --window 3",
         cfg_family(&fy_arch_mistral, 36, 3, 1, 40, 8, 3), 2, 9},
        {"Phi-3, fused, window 4 < 9 (width 40, GQA 4:1)",
         "--batch 2 --seq 9 --embd 40 "
         "--heads 4 --kv-heads 1 --inter 36 --seed 11 --family phi3 --window 4",
         cfg_family(&fy_arch_phi3, 40, 4, 1, 36, 0, 4), 2, 9},
    };
    assert_int_equal(llama_ref_cases("", cases, sizeof cases / sizeof cases[0], hf_compare), 0);
}

/* ---- whole models against transformers ---- */

#define MODEL_MAGIC 0x4D4C5946

/* Reads llama_ref.py model's OUT, runs the whole model unit by unit as the gpu worker does (the
 * embedding, each block, the final norm with the head and the loss, then back), and compares the
 * loss and every parameter gradient. */
static int model_compare(const struct hf_case *mc, const char *path)
{
    size_t len = 0;
    char *buf = read_ref(path, &len);
    const struct fy_model_config *c = &mc->cfg;
    int B = mc->B, T = mc->T, L = (int)c->n_layer;
    size_t C = c->n_embd, N = (size_t)B * T, P = 0, unit_off[L + 3];
    for (int u = 0; u <= L + 1; u++) {
        unit_off[u] = P;
        P += fy_model_unit_params(c, (unsigned)u);
    }
    unit_off[L + 2] = P;
    int32_t h[16];
    assert_true(len >= sizeof h);
    memcpy(h, buf, sizeof h);
    int32_t want[16] = {MODEL_MAGIC,
                        1,
                        B,
                        T,
                        (int32_t)C,
                        (int32_t)c->n_head,
                        (int32_t)fy_llama(c)->n_kv_head,
                        (int32_t)fy_llama(c)->n_inter,
                        (int32_t)c->vocab,
                        L,
                        (int32_t)fy_llama(c)->head_dim,
                        (int32_t)fy_llama(c)->qkv_bias,
                        (int32_t)fy_llama(c)->qk_norm,
                        (int32_t)fy_llama(c)->sliding_window,
                        (int32_t)fy_llama(c)->tied,
                        (int32_t)P};
    for (int i = 0; i < 16; i++)
        if (h[i] != want[i])
            fail_msg("%s: header slot %d is %d, expected %d", path, i, h[i], want[i]);
    size_t ntok = (size_t)B * (T + 1);
    assert_int_equal(len, sizeof h + (2 * P + 1) * sizeof(float) + ntok * sizeof(int32_t));
    const float *params = (const float *)(buf + sizeof h);
    const int32_t *ids = (const int32_t *)(params + P);
    float loss_ref;
    memcpy(&loss_ref, ids + ntok, sizeof loss_ref);
    const float *grad_ref = (const float *)(ids + ntok) + 1;

    int32_t *tokens = xmalloc(N * sizeof *tokens), *targets = xmalloc(N * sizeof *targets);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            tokens[b * T + t] = ids[b * (T + 1) + t];
            targets[b * T + t] = ids[b * (T + 1) + t + 1];
        }
    float *xs = alloc_nan((size_t)(L + 1) * N * C), *dx = alloc_nan(N * C), *dy = alloc_nan(N * C);
    float *grads = xmalloc(P * sizeof *grads);
    memset(grads, 0, P * sizeof *grads);
    float *bs = alloc_nan(fy_cpu_llama_block_scratch(c, B, T)),
          *hs = alloc_nan(fy_cpu_llama_head_scratch(c, B, T));
    fy_cpu_llama_embed_forward(c, params, tokens, xs, B, T);
    for (int l = 0; l < L; l++)
        fy_cpu_llama_block_forward(c, params + unit_off[l + 1], NULL, xs + l * N * C,
                                   xs + (l + 1) * N * C, bs, B, T);
    float loss = fy_cpu_llama_head_forward_backward(c, params + unit_off[L + 1], params,
                                                    xs + (size_t)L * N * C, targets, dy,
                                                    grads + unit_off[L + 1], grads, hs, B, T);
    for (int l = L - 1; l >= 0; l--) {
        fy_cpu_llama_block_backward(c, params + unit_off[l + 1], NULL, xs + l * N * C, dy, dx,
                                    grads + unit_off[l + 1], bs, B, T);
        memcpy(dy, dx, N * C * sizeof *dy);
    }
    fy_cpu_llama_embed_backward(c, tokens, dy, grads, B, T);

    double lref = loss_ref;
    int bad = compare("loss vs transformers", &loss, &lref, 1, HF_REL, 0.0);
    double *ref = to_double(grad_ref, unit_off[1]);
    bad += compare("dembed_tokens vs transformers", grads, ref, unit_off[1], HF_REL, HF_ABS);
    free(ref);
    const char *names[16];
    size_t off[17];
    int parts = layout_parts(c, names, off);
    for (int l = 0; l < L; l++)
        for (int t = 0; t < parts; t++) {
            char name[80];
            snprintf(name, sizeof name, "layer %d d%s", l, names[t]);
            size_t at = unit_off[l + 1] + off[t], n = off[t + 1] - off[t];
            ref = to_double(grad_ref + at, n);
            bad += compare(name, grads + at, ref, n, HF_REL, HF_ABS);
            free(ref);
        }
    size_t at = unit_off[L + 1];
    ref = to_double(grad_ref + at, C);
    bad += compare("dnorm vs transformers", grads + at, ref, C, HF_REL, HF_ABS);
    free(ref);
    if (!fy_llama(c)->tied) {
        size_t n = (size_t)c->vocab * C;
        ref = to_double(grad_ref + at + C, n);
        bad += compare("dlm_head vs transformers", grads + at + C, ref, n, HF_REL, HF_ABS);
        free(ref);
    }
    free(tokens), free(targets), free(xs), free(dx), free(dy), free(grads), free(bs), free(hs);
    free(buf);
    return bad;
}

static struct fy_model_config cfg_model(const struct fy_arch *arch, uint32_t C, uint32_t NH,
                                        uint32_t NKV, uint32_t I, uint32_t hd, uint32_t window,
                                        int tied)
{
    struct fy_model_config c = cfg_family(arch, C, NH, NKV, I, hd, window);
    c.n_layer = 2;
    c.vocab = 1000;
    fy_llama_mut(&c)->tied = (uint32_t)tied;
    return c;
}

static void test_transformers_model(void **state)
{
#define SHAPE "--batch 2 --seq 9 --layers 2 --vocab 1000 --inter 40 "
    const struct hf_case cases[] = {
        {"Llama, head_dim 10, untied",
         SHAPE "--embd 36 --heads 3 --kv-heads 1 --head-dim 10 "
               "--family llama --seed 21",
         cfg_model(&fy_arch_llama, 36, 3, 1, 40, 10, 0, 0), 2, 9},
        {"Qwen2, tied", SHAPE "--embd 36 --heads 6 --kv-heads 2 --family qwen2 --tied --seed 22",
         cfg_model(&fy_arch_qwen2, 36, 6, 2, 40, 0, 0, 1), 2, 9},
        {"Qwen2, untied", SHAPE "--embd 36 --heads 6 --kv-heads 2 --family qwen2 --seed 23",
         cfg_model(&fy_arch_qwen2, 36, 6, 2, 40, 0, 0, 0), 2, 9},
        {"Qwen3, head_dim 14, tied",
         SHAPE "--embd 44 --heads 4 --kv-heads 1 --head-dim 14 "
               "--family qwen3 --tied --seed 24",
         cfg_model(&fy_arch_qwen3, 44, 4, 1, 40, 14, 0, 1), 2, 9},
        {"Qwen3, head_dim 14, untied",
         SHAPE "--embd 44 --heads 4 --kv-heads 1 --head-dim 14 "
               "--family qwen3 --seed 25",
         cfg_model(&fy_arch_qwen3, 44, 4, 1, 40, 14, 0, 0), 2, 9},
        {"Mistral, window 4 < 9, head_dim 8",
         SHAPE "--embd 36 --heads 3 --kv-heads 1 --head-dim 8 "
               "--window 4 --family mistral --seed 26",
         cfg_model(&fy_arch_mistral, 36, 3, 1, 40, 8, 4, 0), 2, 9},
        {"Phi-3, window 3 < 9",
         SHAPE "--embd 40 --heads 4 --kv-heads 1 --window 3 --family phi3 "
               "--seed 27",
         cfg_model(&fy_arch_phi3, 40, 4, 1, 40, 0, 3, 0), 2, 9},
    };
#undef SHAPE
    assert_int_equal(
        llama_ref_cases("model ", cases, sizeof cases / sizeof cases[0], model_compare), 0);
}

/* ---- determinism ---- */

struct det_out {
    float *y, *dx, *dp;
};

/* Llama with llama3 scaling; and one with every Llama-like variation at once (head_dim 10, q/k/v
 * biases, q/k norms, a window of 4 < 9). */
static struct fy_model_config det_config(int variations)
{
    struct fy_model_config c = cfg_llama3(64, 8, 2, 96);
    if (variations) {
        fy_llama_mut(&c)->head_dim = 10;
        fy_llama_mut(&c)->qkv_bias = fy_llama_mut(&c)->qk_norm = 1;
        fy_llama_mut(&c)->sliding_window = 4;
    }
    return c;
}

/* positions: 0 none, 1 the windows' (t everywhere), 2 documents of 4 tokens and a single one */
static void det_run(int variations, int threads, int positions, struct det_out *o)
{
    struct fy_model_config c = det_config(variations);
    int B = 3, T = 9;
    int32_t *pos = positions ? xmalloc((size_t)B * T * sizeof *pos) : NULL;
    for (int n = 0; pos != NULL && n < B * T; n++)
        pos[n] = positions == 1 ? n % T : n % T < 8 ? n % T % 4 : 0;
    uint64_t st = 77;
    struct fy_llama_unit_layout l;
    fy_llama_unit_layout(&c, &l);
    size_t nx = (size_t)B * T * c.n_embd;
    float *p = variations ? alloc_rand(l.total, &st, -0.3f, 0.3f) : block_params(&c, &st),
          *x = alloc_rand(nx, &st, -1, 1), *r = alloc_rand(nx, &st, -1, 1);
    float *scratch = alloc_nan(fy_cpu_llama_block_scratch(&c, B, T));
    o->y = alloc_nan(nx), o->dx = alloc_nan(nx), o->dp = xmalloc(l.total * sizeof *o->dp);
    memset(o->dp, 0, l.total * sizeof *o->dp);
    omp_set_num_threads(threads);
    fy_cpu_llama_block_forward(&c, p, pos, x, o->y, scratch, B, T);
    fy_cpu_llama_block_backward(&c, p, pos, x, r, o->dx, o->dp, scratch, B, T);
    free(pos);
    free(p), free(x), free(r), free(scratch);
}

static void deterministic(int variations)
{
    struct fy_model_config c = det_config(variations);
    struct fy_llama_unit_layout l;
    fy_llama_unit_layout(&c, &l);
    size_t nx = (size_t)3 * 9 * c.n_embd;
    int saved = omp_get_max_threads();
    struct det_out a, b, d, w, p1, p3;
    det_run(variations, 2, 0, &a);
    det_run(variations, 2, 0, &b);  /* the same run twice */
    det_run(variations, 1, 0, &d);  /* and with another thread count */
    det_run(variations, 2, 1, &w);  /* the windows' positions: the bits of none */
    det_run(variations, 1, 2, &p1); /* documents, with two thread counts */
    omp_set_num_threads(3);
    struct det_out e;
    det_run(variations, 3, 0, &e);
    det_run(variations, 3, 2, &p3);
    omp_set_num_threads(saved);
    struct det_out *others[] = {&b, &d, &e, &w};
    for (int k = 0; k < 4; k++) {
        assert_memory_equal(a.y, others[k]->y, nx * sizeof(float));
        assert_memory_equal(a.dx, others[k]->dx, nx * sizeof(float));
        assert_memory_equal(a.dp, others[k]->dp, l.total * sizeof(float));
    }
    assert_memory_equal(p1.y, p3.y, nx * sizeof(float));
    assert_memory_equal(p1.dx, p3.dx, nx * sizeof(float));
    assert_memory_equal(p1.dp, p3.dp, l.total * sizeof(float));
    assert_memory_not_equal(a.y, p1.y, nx * sizeof(float));
    for (size_t i = 0; i < nx; i++)
        assert_true(isfinite(a.y[i]) && isfinite(a.dx[i]) && isfinite(p1.y[i]));
    struct det_out *all[] = {&a, &b, &d, &e, &w, &p1, &p3};
    for (int k = 0; k < 7; k++)
        free(all[k]->y), free(all[k]->dx), free(all[k]->dp);
}

static void test_deterministic(void **state)
{
    deterministic(0);
    deterministic(1);
}

int main(void)
{
    in_ci = fy_test_in_ci();
    have_transformers = fy_refmodel_python_has("torch, transformers");
    if (!have_transformers)
        printf("test_cpu_llama: python3 with torch and transformers not found: the test against "
               "transformers is %s (pip install torch==2.5.1 transformers==5.17.0)\n",
               in_ci ? "FAILED under CI" : "skipped");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_config_validate),
        cmocka_unit_test(test_inv_freq),
        cmocka_unit_test(test_block_gqa),
        cmocka_unit_test(test_block_mqa),
        cmocka_unit_test(test_block_llama3),
        cmocka_unit_test(test_block_documents),
        cmocka_unit_test(test_block_documents_window),
        cmocka_unit_test(test_checker_catches_missing_documents),
        cmocka_unit_test(test_block_documents_alone),
        cmocka_unit_test(test_checker_catches_wrong_gradient),
        cmocka_unit_test(test_checker_catches_wrong_rope),
        cmocka_unit_test(test_backward_accumulates),
        cmocka_unit_test(test_final_norm),
        cmocka_unit_test(test_transformers),
        cmocka_unit_test(test_transformers_model),
        cmocka_unit_test(test_deterministic),
    };
    return cmocka_run_group_tests_name("cpu_llama", tests, NULL, NULL);
}
