/* The Llama family's units on the GPU (contract: cu_llama_units.h), mirroring the fp32 CPU
 * reference gpu_worker/cpu/cpu_llama.c op for op: RMSNorm (cu_rmsnorm), the products through
 * cu_matmul (q/k/v and gate/up each one product, the residual adds in the o_proj and down_proj
 * epilogues), RoPE (cu_rope), grouped-query attention through cu_flash, SwiGLU (cu_swiglu), the
 * LM head through cu_head and the embedding lookup through cu_embed. Its blocks' internals are
 * kept on the GPU or recomputed, never swapped, and not profiled: its ops table,
 * fy_cu_family_llama at the end, leaves those out.
 *
 * Numerics: storage bf16 (activations, weights) or f32 (statistics, gradients); every kernel
 * computes in fp32 and rounds its output once. Determinism: warp sums are xor butterflies, sums
 * over rows run in a fixed order, no atomics anywhere. */
#include "gpu_worker/cuda/cu_llama_units.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/arch/arch.h"
#include "common/model/arch/llama.h"
#include "gpu_worker/cpu/cpu_llama.h"
#include "gpu_worker/cuda/cu_embed.h"
#include "gpu_worker/cuda/cu_flash.h"
#include "gpu_worker/cuda/cu_grads.h"
#include "gpu_worker/cuda/cu_head.h"
#include "gpu_worker/cuda/cu_layernorm.h"
#include "gpu_worker/cuda/cu_qknorm.h"
#include "gpu_worker/cuda/cu_rmsnorm.h"
#include "gpu_worker/cuda/cu_rope.h"
#include "gpu_worker/cuda/cu_swiglu.h"

struct fy_cu_llama {
    struct fy_model_config c;
    struct fy_llama_unit_layout lay;
    int B, T, N;
    int C, NH, NKV, hd, I;
    int QC, S; /* attention output width NH hd; fused q/k/v row (NH + 2 NKV) hd */
    int window; /* the sliding window, 0 for none */
    int qkv_bias, qk_norm;
    struct fy_cu_env env;
    float *cos_t, *sin_t; /* [T][hd/2] */
    float *norm_scratch;  /* the norms' weight-gradient partial sums */
    float *qkn_scratch;   /* the q/k norms' weight-gradient partial sums (qk_norm only) */
    struct fy_cu_llama_acts own;
    /* the backward's gradients: dn (of n2, then of n1) and dh [N][C]; and in one buffer, whose
     * parts live at different times, dgu [N][2I] with dact [N][I] after it, later datty [N][QC]
     * with dqkv [N][S] after it */
    bf16 *dn, *dh, *dwide;
    bf16 *dact, *dgu, *datty, *dqkv;
};

/* ---- the unit: shape, buffers ---- */

/* The families these units compute (their ops tables are at the end of this file). */
static int served_family(const char *name);

int fy_cu_llama_check(const struct fy_model_config *c)
{
    const struct fy_arch *a = fy_model_arch(c);
    FY_REQUIRE(served_family(a->name), -EINVAL,
               "cu_llama: the model is %s, not a Llama-like family", a->label);
    FY_REQUIRE(c->n_head > 0 && fy_llama(c)->n_kv_head > 0 &&
                   (fy_llama(c)->head_dim > 0 || c->n_embd % c->n_head == 0),
               -EINVAL, "cu_llama: %u heads (%u kv) do not divide n_embd %u", c->n_head,
               fy_llama(c)->n_kv_head, c->n_embd);
    unsigned hd = fy_llama_head_dim(c);
    FY_REQUIRE(fy_cu_flash_gqa_supported((int)c->n_head, (int)fy_llama(c)->n_kv_head, (int)hd),
               -EINVAL,
               "the CUDA backend's %s attention takes head sizes that are multiples of 8 up to "
               "128 (64 and 128 are those of the ~1B Llamas) with n_kv_head dividing n_head; "
               "this model has head size %u (head_dim, or n_embd %u / n_head %u) and %u kv "
               "heads: train it with --backend cpu",
               a->label, hd, c->n_embd, c->n_head, fy_llama(c)->n_kv_head);
    return 0;
}

static void setup_shape(struct fy_cu_llama *l, const struct fy_model_config *c, int B, int T)
{
    l->c = *c;
    fy_llama_unit_layout(c, &l->lay);
    l->B = B;
    l->T = T;
    l->N = B * T;
    l->C = (int)c->n_embd;
    l->NH = (int)c->n_head;
    l->NKV = (int)fy_llama(c)->n_kv_head;
    l->hd = (int)fy_llama_head_dim(c);
    l->I = (int)fy_llama(c)->n_inter;
    l->QC = l->NH * l->hd;
    l->S = (l->NH + 2 * l->NKV) * l->hd;
    l->window = (int)fy_llama(c)->sliding_window;
    l->qkv_bias = fy_llama(c)->qkv_bias != 0;
    l->qk_norm = fy_llama(c)->qk_norm != 0;
}

/* The pieces of one set of internals; returns how many. */
static int acts_plan(const struct fy_cu_llama *l, struct fy_cu_llama_acts *a, struct fy_cu_piece *p)
{
    size_t N = (size_t)l->N, C = (size_t)l->C, I = (size_t)l->I;
    int n = 0;
    a->qkr = NULL;
    a->qk_rstd = NULL;
#define PIECE(field, count, type)                                                                  \
    (p[n++] = (struct fy_cu_piece){(count) * sizeof(type), (void **)&a->field})
    PIECE(n1, N * C, bf16);
    PIECE(qkv, N * l->S, bf16);
    PIECE(atty, N * l->QC, bf16);
    PIECE(h, N * C, bf16);
    PIECE(n2, N * C, bf16);
    PIECE(gu, 2 * N * I, bf16);
    PIECE(act, N * I, bf16);
    PIECE(rstd1, N, float);
    PIECE(rstd2, N, float);
    PIECE(attn, fy_cu_flash_scratch_bytes(l->B, l->T, l->QC, l->NH), char);
    if (l->qk_norm) {
        size_t heads = (size_t)(l->NH + l->NKV);
        PIECE(qkr, N * heads * l->hd, bf16);
        PIECE(qk_rstd, N * heads, float);
    }
#undef PIECE
    return n;
}

/* Bytes of n bf16 values, rounded up to 256 so that what follows stays aligned as the arena's
 * buffers are. */
static size_t bf16_span(size_t n) { return (n * sizeof(bf16) + 255) / 256 * 256; }

/* The backward's shared gradient buffer: the MLP's two, then the attention's two. */
static size_t wide_bytes(const struct fy_cu_llama *l)
{
    size_t N = (size_t)l->N, I = (size_t)l->I;
    size_t mlp = bf16_span(2 * N * I) + bf16_span(N * I);
    size_t attn = bf16_span(N * l->QC) + bf16_span(N * l->S);
    return mlp > attn ? mlp : attn;
}

/* The parts of the shared gradient buffer, once it is taken. */
static void wide_parts(struct fy_cu_llama *l)
{
    size_t N = (size_t)l->N, I = (size_t)l->I;
    char *w = (char *)l->dwide;
    l->dgu = (bf16 *)w;
    l->dact = (bf16 *)(w + bf16_span(2 * N * I));
    l->datty = (bf16 *)w;
    l->dqkv = (bf16 *)(w + bf16_span(N * l->QC));
}

/* Every buffer of the unit (its own set first); returns how many. */
#define UNIT_PIECES 24
static int unit_plan(struct fy_cu_llama *l, struct fy_cu_piece *p)
{
    size_t N = (size_t)l->N, C = (size_t)l->C, half = (size_t)l->hd / 2;
    int n = acts_plan(l, &l->own, p);
#define PIECE(field, count, type)                                                                  \
    (p[n++] = (struct fy_cu_piece){(count) * sizeof(type), (void **)&l->field})
    PIECE(cos_t, (size_t)l->T * half, float);
    PIECE(sin_t, (size_t)l->T * half, float);
    PIECE(norm_scratch, fy_cu_layernorm_backward_scratch(l->N, l->C), float);
    PIECE(dn, N * C, bf16);
    PIECE(dh, N * C, bf16);
    PIECE(dwide, wide_bytes(l), char);
    if (l->qk_norm)
        PIECE(qkn_scratch, fy_cu_qknorm_scratch_floats(l->N, l->hd), float);
#undef PIECE
    return n;
}

size_t fy_cu_llama_arena_bytes(const struct fy_model_config *c, int B, int T)
{
    struct fy_cu_llama l;
    memset(&l, 0, sizeof l);
    setup_shape(&l, c, B, T);
    struct fy_cu_piece p[UNIT_PIECES];
    return fy_cu_arena_pieces_footprint(p, unit_plan(&l, p));
}

size_t fy_cu_llama_acts_bytes(const struct fy_model_config *c, int B, int T)
{
    struct fy_cu_llama l;
    memset(&l, 0, sizeof l);
    setup_shape(&l, c, B, T);
    struct fy_cu_llama_acts a;
    struct fy_cu_piece p[UNIT_PIECES];
    return fy_cu_arena_pieces_footprint(p, acts_plan(&l, &a, p));
}

int fy_cu_llama_acts_take(const struct fy_cu_llama *l, struct fy_cu_arena *arena,
                          struct fy_cu_llama_acts *a)
{
    struct fy_cu_piece p[UNIT_PIECES];
    return fy_cu_arena_take_pieces(arena, p, acts_plan(l, a, p));
}

/* The rotary table of the CPU reference, computed the same way on the host, uploaded. */
static int upload_rope_table(struct fy_cu_llama *l)
{
    size_t half = (size_t)l->hd / 2, n = (size_t)l->T * half;
    float *inv_freq = (float *)malloc(half * sizeof(float));
    float *table = (float *)malloc(2 * n * sizeof(float));
    if (inv_freq == NULL || table == NULL) {
        free(inv_freq);
        free(table);
        fy_error("cu_llama: no host memory for the rotary table");
        return -ENOMEM;
    }
    /* the frequencies of head size hd, whichever way the config gives it */
    struct fy_model_config hc = l->c;
    hc.n_embd = (uint32_t)(l->NH * l->hd);
    fy_llama_mut(&hc)->head_dim = 0;
    fy_cpu_llama_rope_inv_freq(&hc, inv_freq);
    fy_cpu_llama_rope_table(table, table + n, inv_freq, l->T, (int)half);
    cudaError_t e = cudaMemcpy(l->cos_t, table, n * sizeof(float), cudaMemcpyHostToDevice);
    if (e == cudaSuccess)
        e = cudaMemcpy(l->sin_t, table + n, n * sizeof(float), cudaMemcpyHostToDevice);
    free(inv_freq);
    free(table);
    FY_CUDA(e, "uploading the rotary table (%zu floats)", 2 * n);
    return 0;
}

int fy_cu_llama_new(struct fy_cu_llama **out, struct fy_cu_arena *arena,
                    const struct fy_model_config *c, int B, int T,
                    const struct fy_cu_env *env)
{
    *out = NULL;
    FY_TRY(fy_cu_llama_check(c));
    FY_REQUIRE(B >= 1 && T >= 1 && (size_t)B * T <= (1u << 30), -EINVAL,
               "cu_llama: batch %d x %d", B, T);
    struct fy_cu_llama *l = (struct fy_cu_llama *)calloc(1, sizeof *l);
    if (l == NULL)
        return -ENOMEM;
    setup_shape(l, c, B, T);
    l->env = *env;
    size_t mark = arena->used;
    struct fy_cu_piece p[UNIT_PIECES];
    int n = unit_plan(l, p);
    if (fy_cu_arena_take_pieces(arena, p, n) < 0) {
        free(l); /* the caller says what did not fit */
        return -ENOMEM;
    }
    wide_parts(l);
    int rc = upload_rope_table(l);
    if (rc < 0) {
        fy_cu_arena_reset(arena, mark);
        free(l);
        return rc;
    }
    *out = l;
    return 0;
}

void fy_cu_llama_destroy(struct fy_cu_llama **lp)
{
    if (lp == NULL || *lp == NULL)
        return;
    free(*lp); /* its buffers are the arena's */
    *lp = NULL;
}

/* ---- the units ---- */

int fy_cu_llama_embed_forward(struct fy_cu_llama *l, const bf16 *embed, const int32_t *tokens,
                              bf16 *x)
{
    return fy_cu_embed_forward(x, tokens, embed, NULL, NULL, l->B, l->T, l->C, l->env.stream);
}

int fy_cu_llama_embed_backward(struct fy_cu_llama *l, const int32_t *tokens, const bf16 *dx,
                               float *dembed)
{
    return fy_cu_embed_backward(dembed, NULL, dx, tokens, NULL, l->B, l->T, l->C, (int)l->c.vocab,
                                l->env.stream);
}

#define P(field) (params + l->lay.field)

/* The forward into set a. y == NULL: the backward's recompute, which stops before the down
 * product (its output is never read there). */
static int block_forward(struct fy_cu_llama *l, const bf16 *params, const int32_t *positions,
                         const bf16 *x, bf16 *y, struct fy_cu_llama_acts *a)
{
    int N = l->N, C = l->C, I = l->I;
    float eps = fy_llama(&l->c)->rms_eps;
    struct fy_cu_lt *lt = l->env.lt;
    cudaStream_t s = l->env.stream;
    /* attention: h = x + o_proj(attention(rope(q), rope(k), v)), q k v of rmsnorm(x) */
    FY_TRY(fy_cu_rmsnorm_forward(a->n1, a->rstd1, x, P(input_norm), N, C, eps, s));
    FY_TRY(fy_cu_matmul_forward(lt, a->qkv, a->n1, P(q_proj), l->qkv_bias ? P(q_bias) : NULL, N, C,
                                l->S, s));
    if (l->qk_norm) /* each q and k head normalised before the rotation (Qwen3) */
        FY_TRY(fy_cu_qknorm_forward(a->qkv, a->qkr, a->qk_rstd, P(q_norm), P(k_norm), N, l->S,
                                    l->NH, l->NKV, l->hd, eps, s));
    /* the k heads follow the q heads: one rotation over both, at the tokens' positions in their
     * documents (the table's rows: each position is at most t) */
    FY_TRY(fy_cu_rope_forward(a->qkv, l->S, 0, l->NH + l->NKV, l->hd, l->cos_t, l->sin_t, positions,
                              l->B, l->T, s));
    FY_TRY(fy_cu_flash_window_forward(a->atty, a->qkv, a->attn, l->B, l->T, l->NH, l->NKV, l->hd,
                                      l->window, positions, s));
    FY_TRY(fy_cu_matmul_forward_ex(lt, a->h, a->atty, P(o_proj), NULL, x, NULL, N, l->QC, C, s));
    /* MLP: y = h + down(silu(gate(n2)) * up(n2)), n2 = rmsnorm(h) */
    FY_TRY(fy_cu_rmsnorm_forward(a->n2, a->rstd2, a->h, P(post_norm), N, C, eps, s));
    FY_TRY(fy_cu_matmul_forward(lt, a->gu, a->n2, P(gate_proj), NULL, N, C, 2 * I, s));
    FY_TRY(fy_cu_swiglu_forward(a->act, a->gu, N, I, s));
    if (y == NULL)
        return 0;
    return fy_cu_matmul_forward_ex(lt, y, a->act, P(down_proj), NULL, a->h, NULL, N, I, C, s);
}

int fy_cu_llama_block_forward(struct fy_cu_llama *l, const bf16 *params, const int32_t *positions,
                              const bf16 *x, bf16 *y, struct fy_cu_llama_acts *keep)
{
    FY_REQUIRE(y != NULL, -EINVAL, "fy_cu_llama_block_forward: no output buffer");
    return block_forward(l, params, positions, x, y, keep != NULL ? keep : &l->own);
}

/* A norm's weight gradient (n floats at off) through the sink, computed by `call` into p. */
#define NORM_GRADS(off, n, call_with_p)                                                            \
    do {                                                                                           \
        float *p;                                                                                  \
        FY_TRY(g->take(g->ctx, (off), (n), &p));                                                    \
        FY_TRY(call_with_p);                                                                       \
        FY_TRY(g->put(g->ctx, (off), (n)));                                                         \
    } while (0)

static int block_backward(struct fy_cu_llama *l, const bf16 *params, const int32_t *positions,
                          const bf16 *x, const bf16 *dy, bf16 *dx, const struct fy_cu_grads *g,
                          struct fy_cu_llama_acts *kept)
{
    int N = l->N, C = l->C, I = l->I;
    size_t NC = (size_t)N * C;
    const struct fy_llama_unit_layout *L = &l->lay;
    struct fy_cu_lt *lt = l->env.lt;
    cudaStream_t s = l->env.stream;
    struct fy_cu_llama_acts *a = kept;
    if (a == NULL) { /* recompute from the checkpoint x */
        a = &l->own;
        FY_TRY(block_forward(l, params, positions, x, NULL, a));
    }
    /* MLP branch: y = h + down(swiglu(gate_up(rmsnorm2(h)))) */
    FY_TRY(fy_cu_grads_linear(lt, g, L->down_proj, FY_CU_GRADS_NO_BIAS, l->dact, dy, a->act,
                              P(down_proj), N, I, C, s));
    FY_TRY(fy_cu_swiglu_backward(l->dgu, l->dact, a->gu, N, I, s));
    FY_TRY(fy_cu_grads_linear(lt, g, L->gate_proj, FY_CU_GRADS_NO_BIAS, l->dn, l->dgu, a->n2,
                              P(gate_proj), N, C, 2 * I, s));
    FY_CUDA(cudaMemcpyAsync(l->dh, dy, NC * sizeof(bf16), cudaMemcpyDeviceToDevice, s),
            "copying the residual gradient");
    NORM_GRADS(L->post_norm, (size_t)C,
               fy_cu_rmsnorm_backward(l->dh, p, l->norm_scratch, l->dn, a->h, P(post_norm),
                                      a->rstd2, N, C, s));
    /* attention branch: h = x + o_proj(attention(rope(qkv(rmsnorm1(x))))) */
    FY_TRY(fy_cu_grads_linear(lt, g, L->o_proj, FY_CU_GRADS_NO_BIAS, l->datty, l->dh, a->atty,
                              P(o_proj), N, l->QC, C, s));
    FY_TRY(fy_cu_flash_window_backward(l->dqkv, l->datty, a->atty, a->qkv, a->attn, l->B, l->T,
                                       l->NH, l->NKV, l->hd, l->window, positions, s));
    FY_TRY(fy_cu_rope_backward(l->dqkv, l->S, 0, l->NH + l->NKV, l->hd, l->cos_t, l->sin_t,
                               positions, l->B, l->T, s));
    if (l->qk_norm) /* q_norm and k_norm side by side */
        NORM_GRADS(L->q_norm, 2 * (size_t)l->hd,
                   fy_cu_qknorm_backward(l->dqkv, p, p + (L->k_norm - L->q_norm), l->qkn_scratch,
                                         a->qkr, a->qk_rstd, P(q_norm), P(k_norm), N, l->S, l->NH,
                                         l->NKV, l->hd, s));
    FY_TRY(fy_cu_grads_linear(lt, g, L->q_proj, l->qkv_bias ? L->q_bias : FY_CU_GRADS_NO_BIAS,
                              l->dn, l->dqkv, a->n1, P(q_proj), N, C, l->S, s));
    FY_CUDA(cudaMemcpyAsync(dx, l->dh, NC * sizeof(bf16), cudaMemcpyDeviceToDevice, s),
            "copying the residual gradient");
    NORM_GRADS(L->input_norm, (size_t)C,
               fy_cu_rmsnorm_backward(dx, p, l->norm_scratch, l->dn, x, P(input_norm), a->rstd1,
                                      N, C, s));
    return 0;
}

#undef NORM_GRADS

int fy_cu_llama_block_backward(struct fy_cu_llama *l, const bf16 *params, const int32_t *positions,
                               const bf16 *x, const bf16 *dy, bf16 *dx, float *dparams,
                               struct fy_cu_llama_acts *kept)
{
    struct fy_cu_grads g;
    struct fy_cu_grads_whole whole;
    fy_cu_grads_whole(&g, &whole, dparams, l->env.stream);
    return block_backward(l, params, positions, x, dy, dx, &g, kept);
}

/* The largest piece the backward takes from a sink of piece_max `cap`. */
static size_t llama_grad_piece_max(const struct fy_model_config *c, size_t cap)
{
    struct fy_cu_llama l;
    memset(&l, 0, sizeof l);
    setup_shape(&l, c, 1, 1);
    size_t most = (size_t)l.C; /* a norm's */
    most = 2 * (size_t)l.hd > most ? 2 * (size_t)l.hd : most;
    const int lin[4][3] = {{l.I, l.C, 0}, {l.C, 2 * l.I, 0}, {l.QC, l.C, 0}, {l.C, l.S, l.qkv_bias}};
    for (int i = 0; i < 4; i++) {
        size_t p = fy_cu_grads_linear_piece(lin[i][0], lin[i][1], 1, lin[i][2], cap);
        most = p > most ? p : most;
    }
    return most;
}

#undef P

int fy_cu_llama_final_norm(struct fy_cu_llama *l, const bf16 *norm_w, const bf16 *x,
                           const bf16 **xn)
{
    *xn = l->own.n1;
    return fy_cu_rmsnorm_forward(l->own.n1, l->own.rstd1, x, norm_w, l->N, l->C,
                                 fy_llama(&l->c)->rms_eps, l->env.stream);
}

int fy_cu_llama_head(struct fy_cu_llama *l, const bf16 *norm_w, const bf16 *head_w,
                     const bf16 *x, const int32_t *targets, float *losses, bf16 *dx, float *dnorm,
                     float *dhead, uint64_t count)
{
    int N = l->N, C = l->C, V = (int)l->c.vocab;
    cudaStream_t s = l->env.stream;
    const bf16 *xn;
    FY_TRY(fy_cu_llama_final_norm(l, norm_w, x, &xn));
    if (dx == NULL)
        return fy_cu_head(l->env.lt, losses, NULL, NULL, xn, head_w, targets, count, N, C, V,
                          l->env.head_rows, l->env.head_scratch, s);
    /* the gradients accumulate (+=) from zero; dn takes the normalised rows' gradient */
    FY_CUDA(cudaMemsetAsync(dhead, 0, (size_t)V * C * sizeof(float), s), "zeroing gradients");
    FY_CUDA(cudaMemsetAsync(dnorm, 0, (size_t)C * sizeof(float), s), "zeroing gradients");
    FY_TRY(fy_cu_head(l->env.lt, losses, l->dn, dhead, xn, head_w, targets, count, N, C, V,
                      l->env.head_rows, l->env.head_scratch, s));
    FY_CUDA(cudaMemsetAsync(dx, 0, (size_t)N * C * sizeof(bf16), s), "zeroing dx");
    return fy_cu_rmsnorm_backward(dx, dnorm, l->norm_scratch, l->dn, x, norm_w, l->own.rstd1, N, C,
                                  s);
}

/* ---- the ops table ---- */

static size_t llama_set_bytes(const struct fy_model_config *c, int B, int T)
{
    return fy_cu_llama_acts_bytes(c, B, T);
}

static int llama_create(void **units, struct fy_cu_arena *arena, const struct fy_model_config *c,
                        int B, int T, const struct fy_cu_env *env)
{
    struct fy_cu_llama *l = NULL;
    int rc = fy_cu_llama_new(&l, arena, c, B, T, env);
    *units = l;
    return rc;
}

static void llama_destroy(void **units)
{
    struct fy_cu_llama *l = (struct fy_cu_llama *)*units;
    fy_cu_llama_destroy(&l);
    *units = NULL;
}

static int llama_set_take(void *units, struct fy_cu_arena *arena, void *set)
{
    return fy_cu_llama_acts_take((const struct fy_cu_llama *)units, arena,
                                 (struct fy_cu_llama_acts *)set);
}

/* The embeddings have no positions (the blocks rotate q and k by them). */
static int llama_embed_forward(void *units, const bf16 *embed, const int32_t *tokens,
                               const int32_t *positions, bf16 *x)
{
    (void)positions;
    return fy_cu_llama_embed_forward((struct fy_cu_llama *)units, embed, tokens, x);
}

static int llama_embed_backward(void *units, const int32_t *tokens, const int32_t *positions,
                                const bf16 *dx, float *dembed)
{
    (void)positions;
    return fy_cu_llama_embed_backward((struct fy_cu_llama *)units, tokens, dx, dembed);
}

static int llama_block_forward(void *units, const bf16 *params, const int32_t *positions,
                               const bf16 *x, bf16 *y, void *keep)
{
    return fy_cu_llama_block_forward((struct fy_cu_llama *)units, params, positions, x, y,
                                     (struct fy_cu_llama_acts *)keep);
}

static int llama_block_backward(void *units, const bf16 *params, const int32_t *positions,
                                const bf16 *x, const bf16 *dy, bf16 *dx,
                                const struct fy_cu_grads *grads, void *kept)
{
    return block_backward((struct fy_cu_llama *)units, params, positions, x, dy, dx, grads,
                          (struct fy_cu_llama_acts *)kept);
}

static int llama_final_norm(void *units, const bf16 *norm, const bf16 *x, const bf16 **xn)
{
    return fy_cu_llama_final_norm((struct fy_cu_llama *)units, norm, x, xn);
}

static int llama_head(void *units, const bf16 *norm, const bf16 *head_w, const bf16 *x,
                      const int32_t *targets, float *losses, bf16 *dx, float *dnorm, float *dhead,
                      uint64_t count)
{
    return fy_cu_llama_head((struct fy_cu_llama *)units, norm, head_w, x, targets, losses, dx,
                            dnorm, dhead, count);
}

/* One table per family these units compute, differing only in the registry name they answer to;
 * cu_families.cu lists them. */
#define LLAMA_UNITS(arch_name)                                                                     \
    {                                                                                              \
        arch_name, sizeof(struct fy_cu_llama_acts), fy_cu_llama_check, fy_cu_llama_arena_bytes,    \
            llama_set_bytes, llama_create, llama_destroy, llama_set_take, llama_embed_forward,     \
            llama_embed_backward, llama_block_forward, llama_block_backward,                       \
            llama_grad_piece_max, llama_final_norm,                                                \
            llama_head, NULL, /* internals kept on the GPU or recomputed, never swapped */         \
            NULL,             /* nothing to profile for swapping */                                \
    }

const struct fy_cu_family fy_cu_family_llama = LLAMA_UNITS("llama");
const struct fy_cu_family fy_cu_family_qwen2 = LLAMA_UNITS("qwen2");
const struct fy_cu_family fy_cu_family_qwen3 = LLAMA_UNITS("qwen3");
const struct fy_cu_family fy_cu_family_mistral = LLAMA_UNITS("mistral");
const struct fy_cu_family fy_cu_family_phi3 = LLAMA_UNITS("phi3");

static int served_family(const char *name)
{
    static const struct fy_cu_family *const served[] = {
        &fy_cu_family_llama, &fy_cu_family_qwen2, &fy_cu_family_qwen3, &fy_cu_family_mistral,
        &fy_cu_family_phi3};
    for (size_t i = 0; i < sizeof served / sizeof served[0]; i++)
        if (strcmp(served[i]->arch, name) == 0)
            return 1;
    return 0;
}
