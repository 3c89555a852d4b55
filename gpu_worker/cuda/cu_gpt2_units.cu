/* The GPT-2 family's units on the GPU (contract: cu_gpt2_units.h), composed from the kernels of
 * cu_layernorm, cu_matmul, cu_flash or cu_attention, cu_gelu, cu_residual, cu_embed and cu_head,
 * with what only this family has: the blocks' internals swapped to host memory and recomputed
 * around (the kinds of common/model/actplan.h), per-op timing, and the activation planner's profile of
 * one block. Its ops table, fy_cu_family_gpt2, is at the end. */
#include "gpu_worker/cuda/cu_gpt2_units.h"

#include <stdlib.h>
#include <string.h>

#include "common/model/arch/gpt2.h"
#include "common/base/knobs.h"
#include "gpu_worker/cuda/cu_attention.h"
#include "gpu_worker/cuda/cu_embed.h"
#include "gpu_worker/cuda/cu_flash.h"
#include "gpu_worker/cuda/cu_gelu.h"
#include "gpu_worker/cuda/cu_grads.h"
#include "gpu_worker/cuda/cu_head.h"
#include "gpu_worker/cuda/cu_layernorm.h"
#include "gpu_worker/cuda/cu_matmul.h"
#include "gpu_worker/cuda/cu_profile.h"
#include "gpu_worker/cuda/cu_residual.h"
#include "common/base/check.h"

struct fy_cu_gpt2 {
    struct fy_model_config c;
    struct fy_gpt2_block_layout lay;
    int B, T, N;
    int flash; /* flash-style attention (else the materialising version) */
    int fuse;  /* GELU and residual adds in the products' epilogues (else separate kernels) */
    struct fy_cu_env env;
    float *ln_scratch;
    /* one block's internals when no kept set is given */
    struct fy_cu_gpt2_acts own;
    /* the internals' gradients, sharing buffers where their lives do not overlap: dy1 [N][C] the
     * residual's; dmid [N][C] that of ln2, then of the attention's output, then of ln1; dbig
     * [N][4C] that of g, then (in place) of fc, then of qkv [N][3C] */
    bf16 *dy1, *dmid, *dbig;
    /* per-op timing */
    int timing;
    cudaEvent_t t0, t1;
    struct fy_cu_gpt2_op ops[FY_CU_GPT2_MAX_OPS];
    int n_ops;
};

/* ---- shape and buffers ---- */

static void setup_shape(struct fy_cu_gpt2 *u, const struct fy_model_config *c, int B, int T)
{
    u->c = *c;
    fy_gpt2_block_layout(c, &u->lay);
    u->B = B;
    u->T = T;
    u->N = B * T;
    /* FUYOU_CUDA_ATTENTION=materialised selects the first version, for comparisons. */
    u->flash = fy_cu_flash_supported((int)c->n_embd, (int)c->n_head) &&
               !fy_knob_cuda_materialised_attention();
    /* FUYOU_CUDA_FUSE=0 runs GELU and the residual adds as separate kernels, for comparisons. */
    u->fuse = !fy_knob_cuda_unfused();
}

/* The pieces of one set of block internals; returns how many. */
static int acts_plan(const struct fy_cu_gpt2 *u, struct fy_cu_gpt2_acts *a, struct fy_cu_piece *p)
{
    const struct fy_model_config *c = &u->c;
    size_t N = (size_t)u->N, C = c->n_embd;
    int n = 0;
#define PIECE(field, count, type)                                                                  \
    (p[n++] = (struct fy_cu_piece){(count) * sizeof(type), (void **)&a->field})
    PIECE(ln1, N * C, bf16);
    PIECE(qkv, 3 * N * C, bf16);
    PIECE(atty, N * C, bf16);
    PIECE(y1, N * C, bf16);
    PIECE(ln2, N * C, bf16);
    PIECE(fc, 4 * N * C, bf16);
    PIECE(g, 4 * N * C, bf16);
    PIECE(mean1, N, float);
    PIECE(rstd1, N, float);
    PIECE(mean2, N, float);
    PIECE(rstd2, N, float);
    PIECE(attn, u->flash ? fy_cu_flash_scratch_bytes(u->B, u->T, (int)C, c->n_head)
                         : fy_cu_attention_scratch_bytes(u->B, u->T, (int)C, c->n_head),
          char);
#undef PIECE
    return n;
}

/* Every buffer of the units (their own set first); returns how many. */
#define UNIT_PIECES 24
static int unit_plan(struct fy_cu_gpt2 *u, struct fy_cu_piece *p)
{
    size_t N = (size_t)u->N, C = u->c.n_embd;
    int n = acts_plan(u, &u->own, p);
#define PIECE(field, count, type)                                                                  \
    (p[n++] = (struct fy_cu_piece){(count) * sizeof(type), (void **)&u->field})
    PIECE(ln_scratch, fy_cu_layernorm_backward_scratch(u->N, (int)C), float);
    PIECE(dy1, N * C, bf16);
    PIECE(dmid, N * C, bf16);
    PIECE(dbig, 4 * N * C, bf16);
#undef PIECE
    return n;
}

static size_t gpt2_arena_bytes(const struct fy_model_config *c, int B, int T)
{
    struct fy_cu_gpt2 u;
    memset(&u, 0, sizeof u);
    setup_shape(&u, c, B, T);
    struct fy_cu_piece p[UNIT_PIECES];
    return fy_cu_arena_pieces_footprint(p, unit_plan(&u, p));
}

size_t fy_cu_gpt2_acts_bytes(const struct fy_model_config *c, int B, int T)
{
    struct fy_cu_gpt2 u;
    memset(&u, 0, sizeof u);
    setup_shape(&u, c, B, T);
    struct fy_cu_piece p[UNIT_PIECES];
    struct fy_cu_gpt2_acts a;
    return fy_cu_arena_pieces_footprint(p, acts_plan(&u, &a, p));
}

int fy_cu_gpt2_acts_take(struct fy_cu_gpt2 *u, struct fy_cu_arena *arena,
                         struct fy_cu_gpt2_acts *a)
{
    struct fy_cu_piece p[UNIT_PIECES];
    /* -ENOMEM: the caller knows what it was planning and says so */
    return fy_cu_arena_take_pieces(arena, p, acts_plan(u, a, p));
}

static void gpt2_destroy(void **units)
{
    struct fy_cu_gpt2 *u = (struct fy_cu_gpt2 *)*units;
    if (u == NULL)
        return;
    if (u->t0)
        cudaEventDestroy(u->t0);
    if (u->t1)
        cudaEventDestroy(u->t1);
    free(u); /* its buffers are the arena's */
    *units = NULL;
}

static int gpt2_create(void **units, struct fy_cu_arena *arena, const struct fy_model_config *c,
                       int B, int T, const struct fy_cu_env *env)
{
    *units = NULL;
    struct fy_cu_gpt2 *u = (struct fy_cu_gpt2 *)calloc(1, sizeof *u);
    if (u == NULL)
        return -ENOMEM;
    setup_shape(u, c, B, T);
    u->env = *env;
    size_t mark = arena->used;
    struct fy_cu_piece p[UNIT_PIECES];
    if (fy_cu_arena_take_pieces(arena, p, unit_plan(u, p)) < 0) {
        free(u); /* cu_model says what did not fit */
        return -ENOMEM;
    }
    if (cudaEventCreate(&u->t0) != cudaSuccess || cudaEventCreate(&u->t1) != cudaSuccess) {
        fy_error("CUDA: cannot create the GPT-2 units' timing events");
        void *v = u;
        gpt2_destroy(&v);
        fy_cu_arena_reset(arena, mark);
        return -EIO;
    }
    *units = u;
    return 0;
}

/* ---- per-op timing ---- */

#define P(field) (params + u->lay.field)

/* Per-op timing for profiling (fy_cu_gpt2_set_timing): events around each op, summed by name. */
#define OP(name, call)                                                                             \
    do {                                                                                           \
        int fy_op_slot_ = u->timing ? timing_begin(u, name) : -1;                                  \
        FY_TRY(call);                                                                              \
        if (fy_op_slot_ >= 0)                                                                      \
            FY_TRY(timing_end(u, fy_op_slot_));                                                    \
    } while (0)

static int timing_begin(struct fy_cu_gpt2 *u, const char *name)
{
    int slot = 0;
    while (slot < u->n_ops && strcmp(u->ops[slot].name, name) != 0)
        slot++;
    if (slot == u->n_ops) {
        if (u->n_ops == FY_CU_GPT2_MAX_OPS)
            return -1;
        snprintf(u->ops[slot].name, sizeof u->ops[slot].name, "%s", name);
        u->ops[slot].ms = 0;
        u->n_ops++;
    }
    if (cudaEventRecord(u->t0, u->env.stream) != cudaSuccess)
        return -1;
    return slot;
}

static int timing_end(struct fy_cu_gpt2 *u, int slot)
{
    FY_CUDA(cudaEventRecord(u->t1, u->env.stream), "recording a timing event");
    FY_CUDA(cudaEventSynchronize(u->t1), "waiting for a timing event");
    float ms = 0;
    FY_CUDA(cudaEventElapsedTime(&ms, u->t0, u->t1), "reading a timing event");
    u->ops[slot].ms += ms;
    return 0;
}

void fy_cu_gpt2_set_timing(struct fy_cu_gpt2 *u, int on)
{
    u->timing = on;
    u->n_ops = 0;
}

int fy_cu_gpt2_timings(const struct fy_cu_gpt2 *u, const struct fy_cu_gpt2_op **ops)
{
    *ops = u->ops;
    return u->n_ops;
}

/* ---- the units ---- */

/* The block's forward from x into y, keeping every internal in `a` for the backward. y == NULL:
 * the recompute for the backward, which stops before the MLP's down product (its output is never
 * read there; a third of the recomputed products' work). have: the kinds (FY_ACT_BIT of common/
 * actplan.h) already in `a`, uploaded from where the forward swapped them, whose ops are skipped;
 * every other op runs as in the full forward, on the same inputs, so the set ends up with the same
 * bits whatever the mix. LayerNorms always run (their outputs are never swapped). */
static int block_forward(struct fy_cu_gpt2 *u, const bf16 *params, const int32_t *positions,
                         const bf16 *x, bf16 *y, struct fy_cu_gpt2_acts *a, unsigned have)
{
    int N = u->N, C = (int)u->c.n_embd, NH = (int)u->c.n_head;
    size_t NC = (size_t)N * C;
    struct fy_cu_lt *lt = u->env.lt;
    cudaStream_t s = u->env.stream;
    OP("layernorm fwd", fy_cu_layernorm_forward(a->ln1, a->mean1, a->rstd1, x, P(ln1_w), P(ln1_b),
                                                N, C, s));
    if (!(have & FY_ACT_BIT(FY_ACT_QKV)))
        OP("matmul qkv fwd", fy_cu_matmul_forward(lt, a->qkv, a->ln1, P(qkv_w), P(qkv_b), N, C,
                                                  3 * C, s));
    if (!(have & FY_ACT_BIT(FY_ACT_ATTN))) {
        /* multi-head attention: the grouped-query kernels with a kv head per query head */
        if (u->flash)
            OP("attention fwd", fy_cu_flash_window_forward(a->atty, a->qkv, a->attn, u->B, u->T, NH,
                                                           NH, C / NH, 0, positions, s));
        else
            OP("attention fwd", fy_cu_attention_forward(lt, a->atty, a->qkv, positions, a->attn,
                                                        u->B, u->T, C, NH, s));
    }
    if (!(have & FY_ACT_BIT(FY_ACT_RESID))) {
        if (u->fuse) {
            OP("matmul attn-proj fwd", fy_cu_matmul_forward_ex(lt, a->y1, a->atty, P(attn_w),
                                                               P(attn_b), x, NULL, N, C, C, s));
        } else {
            OP("matmul attn-proj fwd", fy_cu_matmul_forward(lt, a->y1, a->atty, P(attn_w),
                                                            P(attn_b), N, C, C, s));
            OP("residual fwd", fy_cu_residual_forward(a->y1, a->y1, x, NC, s));
        }
    }
    OP("layernorm fwd", fy_cu_layernorm_forward(a->ln2, a->mean2, a->rstd2, a->y1, P(ln2_w),
                                                P(ln2_b), N, C, s));
    unsigned mlp = FY_ACT_BIT(FY_ACT_FC) | FY_ACT_BIT(FY_ACT_GELU);
    if (u->fuse) {
        /* one product writes both fc and g: it runs unless both are given, and rewriting the given
         * one leaves it as it was (the same inputs through the same algorithm) */
        if ((have & mlp) != mlp)
            OP("matmul fc fwd", fy_cu_matmul_forward_ex(lt, a->g, a->ln2, P(fc_w), P(fc_b), NULL,
                                                        a->fc, N, C, 4 * C, s));
        if (y == NULL)
            return 0;
        OP("matmul proj fwd", fy_cu_matmul_forward_ex(lt, y, a->g, P(proj_w), P(proj_b), a->y1,
                                                      NULL, N, 4 * C, C, s));
        return 0;
    }
    if (!(have & FY_ACT_BIT(FY_ACT_FC)))
        OP("matmul fc fwd", fy_cu_matmul_forward(lt, a->fc, a->ln2, P(fc_w), P(fc_b), N, C, 4 * C,
                                                 s));
    if (!(have & FY_ACT_BIT(FY_ACT_GELU)))
        OP("gelu fwd", fy_cu_gelu_forward(a->g, a->fc, 4 * NC, s));
    if (y == NULL)
        return 0;
    OP("matmul proj fwd", fy_cu_matmul_forward(lt, y, a->g, P(proj_w), P(proj_b), N, 4 * C, C, s));
    OP("residual fwd", fy_cu_residual_forward(y, y, a->y1, NC, s));
    return 0;
}

int fy_cu_gpt2_block_forward(struct fy_cu_gpt2 *u, const bf16 *params, const int32_t *positions,
                             const bf16 *x, bf16 *y, struct fy_cu_gpt2_acts *keep)
{
    FY_REQUIRE(y != NULL, -EINVAL, "fy_cu_gpt2_block_forward: no output buffer");
    return block_forward(u, params, positions, x, y, keep != NULL ? keep : &u->own, 0);
}

/* A LayerNorm's weight and bias gradients ([C] each, side by side at w_off) through the sink. */
#define LN_GRADS(name, w_off, call_with_p)                                                         \
    do {                                                                                           \
        float *p;                                                                                  \
        FY_TRY(g->take(g->ctx, (w_off), 2 * (size_t)C, &p));                                        \
        OP(name, call_with_p);                                                                     \
        FY_TRY(g->put(g->ctx, (w_off), 2 * (size_t)C));                                             \
    } while (0)

static int block_backward(struct fy_cu_gpt2 *u, const bf16 *params, const int32_t *positions,
                          const bf16 *x, const bf16 *dy, bf16 *dx, const struct fy_cu_grads *g,
                          struct fy_cu_gpt2_acts *kept)
{
    int N = u->N, C = (int)u->c.n_embd, NH = (int)u->c.n_head;
    size_t NC = (size_t)N * C;
    const struct fy_gpt2_block_layout *L = &u->lay;
    struct fy_cu_lt *lt = u->env.lt;
    cudaStream_t s = u->env.stream;
    struct fy_cu_gpt2_acts *a = kept;
    if (a == NULL) { /* recompute from the checkpoint x */
        a = &u->own;
        FY_TRY(block_forward(u, params, positions, x, NULL, a, 0));
    }
    /* MLP branch: y = y1 + proj(gelu(fc(ln2(y1)))) */
    /* GELU's backward stays a kernel of its own: cuBLASLt's DGELU epilogue made this product
     * slower (494 against 762 TFLOP/s at 2.7B) than the separate kernel costs. */
    OP("matmul proj bwd", fy_cu_grads_linear(lt, g, L->proj_w, L->proj_b, u->dbig, dy, a->g,
                                             P(proj_w), N, 4 * C, C, s));
    OP("gelu bwd", fy_cu_gelu_backward(u->dbig, a->fc, u->dbig, 4 * NC, s));
    OP("matmul fc bwd", fy_cu_grads_linear(lt, g, L->fc_w, L->fc_b, u->dmid, u->dbig, a->ln2,
                                           P(fc_w), N, C, 4 * C, s));
    FY_CUDA(cudaMemcpyAsync(u->dy1, dy, NC * sizeof(bf16), cudaMemcpyDeviceToDevice, s),
            "copying the residual gradient");
    LN_GRADS("layernorm bwd", L->ln2_w,
             fy_cu_layernorm_backward(u->dy1, p, p + C, u->ln_scratch, u->dmid, a->y1, P(ln2_w),
                                      a->mean2, a->rstd2, N, C, s));
    /* attention branch: y1 = x + attn_proj(attention(qkv(ln1(x)))) */
    OP("matmul attn-proj bwd", fy_cu_grads_linear(lt, g, L->attn_w, L->attn_b, u->dmid, u->dy1,
                                                  a->atty, P(attn_w), N, C, C, s));
    if (u->flash)
        OP("attention bwd",
           fy_cu_flash_window_backward(u->dbig, u->dmid, a->atty, a->qkv, a->attn, u->B, u->T, NH,
                                       NH, C / NH, 0, positions, s));
    else
        OP("attention bwd", fy_cu_attention_backward(lt, u->dbig, u->dmid, a->qkv, a->attn,
                                                     u->B, u->T, C, NH, s));
    OP("matmul qkv bwd", fy_cu_grads_linear(lt, g, L->qkv_w, L->qkv_b, u->dmid, u->dbig, a->ln1,
                                            P(qkv_w), N, C, 3 * C, s));
    FY_CUDA(cudaMemcpyAsync(dx, u->dy1, NC * sizeof(bf16), cudaMemcpyDeviceToDevice, s),
            "copying the residual gradient");
    LN_GRADS("layernorm bwd", L->ln1_w,
             fy_cu_layernorm_backward(dx, p, p + C, u->ln_scratch, u->dmid, x, P(ln1_w), a->mean1,
                                      a->rstd1, N, C, s));
    return 0;
}

#undef LN_GRADS

int fy_cu_gpt2_block_backward(struct fy_cu_gpt2 *u, const bf16 *params, const int32_t *positions,
                              const bf16 *x, const bf16 *dy, bf16 *dx, float *dparams,
                              struct fy_cu_gpt2_acts *kept)
{
    struct fy_cu_grads g;
    struct fy_cu_grads_whole whole;
    fy_cu_grads_whole(&g, &whole, dparams, u->env.stream);
    return block_backward(u, params, positions, x, dy, dx, &g, kept);
}

/* The largest piece the backward takes from a sink of piece_max `cap`. */
static size_t gpt2_grad_piece_max(const struct fy_model_config *c, size_t cap)
{
    int C = (int)c->n_embd;
    size_t most = 2 * (size_t)C; /* a LayerNorm's */
    const int lin[4][2] = {{4 * C, C}, {C, 4 * C}, {C, C}, {C, 3 * C}}; /* IN, OUT */
    for (int i = 0; i < 4; i++) {
        size_t p = fy_cu_grads_linear_piece(lin[i][0], lin[i][1], 1, 1, cap);
        most = p > most ? p : most;
    }
    return most;
}

int fy_cu_gpt2_embed_forward(struct fy_cu_gpt2 *u, const bf16 *wte, const bf16 *wpe,
                             const int32_t *tokens, const int32_t *positions, bf16 *x)
{
    OP("embed fwd", fy_cu_embed_forward(x, tokens, wte, wpe, positions, u->B, u->T,
                                        (int)u->c.n_embd, u->env.stream));
    return 0;
}

int fy_cu_gpt2_embed_backward(struct fy_cu_gpt2 *u, const int32_t *tokens, const int32_t *positions,
                              const bf16 *dx, float *dwte, float *dwpe)
{
    OP("embed bwd", fy_cu_embed_backward(dwte, dwpe, dx, tokens, positions, u->B, u->T,
                                         (int)u->c.n_embd, (int)u->c.vocab, u->env.stream));
    return 0;
}

int fy_cu_gpt2_head(struct fy_cu_gpt2 *u, const bf16 *lnf, const bf16 *wte, const bf16 *x,
                    const int32_t *targets, float *losses, bf16 *dx, float *dlnf, float *dwte,
                    uint64_t count)
{
    const struct fy_model_config *c = &u->c;
    int N = u->N, C = (int)c->n_embd, V = (int)c->vocab;
    size_t NC = (size_t)N * C;
    cudaStream_t s = u->env.stream;
    struct fy_cu_gpt2_acts *a = &u->own;
    OP("layernorm fwd", fy_cu_layernorm_forward(a->ln1, a->mean1, a->rstd1, x, lnf, lnf + C, N, C,
                                                s));
    if (dx != NULL) {
        FY_CUDA(cudaMemsetAsync(dwte, 0, (size_t)V * C * sizeof(float), s), "zeroing gradients");
        FY_CUDA(cudaMemsetAsync(dlnf, 0, 2 * (size_t)C * sizeof(float), s), "zeroing gradients");
    }
    OP("head (logits, loss, grads)",
       fy_cu_head(u->env.lt, losses, dx ? u->dmid : NULL, dwte, a->ln1, wte, targets, count, N, C,
                  V, u->env.head_rows, u->env.head_scratch, s));
    if (dx != NULL) {
        FY_CUDA(cudaMemsetAsync(dx, 0, NC * sizeof(bf16), s), "zeroing dx");
        OP("layernorm bwd", fy_cu_layernorm_backward(dx, dlnf, dlnf + C, u->ln_scratch, u->dmid, x,
                                                     lnf, a->mean1, a->rstd1, N, C, s));
    }
    return 0;
}

/* The final LayerNorm alone (logits), untimed. */
static int final_norm(struct fy_cu_gpt2 *u, const bf16 *lnf, const bf16 *x, const bf16 **xn)
{
    int C = (int)u->c.n_embd;
    *xn = u->own.ln1;
    return fy_cu_layernorm_forward(u->own.ln1, u->own.mean1, u->own.rstd1, x, lnf, lnf + C, u->N,
                                   C, u->env.stream);
}

/* ---- swapped internals: pieces of a block's set in host buffers (struct fy_block_saved) ---- */

/* Bytes of the flash attention's logsumexp L [B][NH][T] f32, the start of its scratch: all of the
 * scratch a backward reads (D after it is the backward's own). */
static size_t lse_bytes(const struct fy_cu_gpt2 *u)
{
    return (size_t)u->B * u->c.n_head * (size_t)u->T * sizeof(float);
}

static int swap_check(void *units, unsigned mask)
{
    const struct fy_cu_gpt2 *u = (const struct fy_cu_gpt2 *)units;
    /* the materialised attention's statistics are the whole B x NH x T x T probabilities, which
     * the host layout of ATTN (fy_actplan_sizes_backend) has no room for */
    FY_REQUIRE(u->flash || !(mask & FY_ACT_BIT(FY_ACT_ATTN)), -ENOTSUP,
               "cu_gpt2: the attention's internals (attn) cannot be swapped with the materialised "
               "attention (FUYOU_CUDA_ATTENTION=materialised): recompute them or use the flash "
               "attention");
    return 0;
}

/* The host layout the planner sizes the saved regions with must be the one copied here. */
static int swap_layout_check(void *units)
{
    const struct fy_cu_gpt2 *u = (const struct fy_cu_gpt2 *)units;
    struct fy_actplan_sizes sizes;
    FY_TRY(fy_actplan_sizes_backend(&u->c, u->B, u->T, "cuda", &sizes));
    size_t NC = (size_t)u->N * u->c.n_embd * sizeof(bf16);
    size_t mine[FY_ACT_KINDS] = {0};
    mine[FY_ACT_QKV] = 3 * NC;
    mine[FY_ACT_ATTN] = NC + lse_bytes(u);
    mine[FY_ACT_RESID] = NC;
    mine[FY_ACT_FC] = 4 * NC;
    mine[FY_ACT_GELU] = 4 * NC;
    for (int k = 0; k < FY_ACT_KINDS; k++)
        FY_REQUIRE(!(FY_ACT_SWAPPABLE & FY_ACT_BIT(k)) || sizes.bytes[k] == mine[k] ||
                       (k == FY_ACT_ATTN && !u->flash),
                   -EINVAL, "cu_gpt2: swapped %s takes %zu bytes here but %llu in the planner's "
                   "layout (fy_actplan_sizes_backend)", fy_actplan_kind_name(k), mine[k],
                   (unsigned long long)sizes.bytes[k]);
    return 0;
}

/* The pieces of the kinds in mask between set `a` and the host buffers of `saved`, in the layout
 * of fy_actplan_sizes_backend "cuda": each kind's tensor as on the device, ATTN's attention output
 * with the logsumexp right after it. */
static int swap_pieces(void *units, void *set, const struct fy_block_saved *saved, unsigned mask,
                       struct fy_cu_swap_piece *p)
{
    const struct fy_cu_gpt2 *u = (const struct fy_cu_gpt2 *)units;
    const struct fy_cu_gpt2_acts *a = (const struct fy_cu_gpt2_acts *)set;
    size_t NC = (size_t)u->N * u->c.n_embd * sizeof(bf16);
    char *at[FY_ACT_KINDS];
    for (int k = 0; k < FY_ACT_KINDS; k++)
        at[k] = (char *)saved->at[k];
    int n = 0;
    if (mask & FY_ACT_BIT(FY_ACT_QKV))
        p[n++] = (struct fy_cu_swap_piece){a->qkv, at[FY_ACT_QKV], 3 * NC};
    if (mask & FY_ACT_BIT(FY_ACT_ATTN)) {
        p[n++] = (struct fy_cu_swap_piece){a->atty, at[FY_ACT_ATTN], NC};
        p[n++] = (struct fy_cu_swap_piece){a->attn, at[FY_ACT_ATTN] + NC, lse_bytes(u)};
    }
    if (mask & FY_ACT_BIT(FY_ACT_RESID))
        p[n++] = (struct fy_cu_swap_piece){a->y1, at[FY_ACT_RESID], NC};
    if (mask & FY_ACT_BIT(FY_ACT_FC))
        p[n++] = (struct fy_cu_swap_piece){a->fc, at[FY_ACT_FC], 4 * NC};
    if (mask & FY_ACT_BIT(FY_ACT_GELU))
        p[n++] = (struct fy_cu_swap_piece){a->g, at[FY_ACT_GELU], 4 * NC};
    return n;
}

static int swap_recompute(void *units, const bf16 *params, const int32_t *positions, const bf16 *x,
                          void *set, unsigned have)
{
    return block_forward((struct fy_cu_gpt2 *)units, params, positions, x, NULL,
                         (struct fy_cu_gpt2_acts *)set, have);
}

/* ---- the activation planner's profile of one block (struct fy_block_profile) ---- */

/* Small values from the index alone, base + scale * [-1, 1): finite through every op, so the
 * kernels run on ordinary data, and the same on every call. */
static __global__ void profile_fill_kernel(bf16 *p, size_t n, uint32_t seed, float base,
                                           float scale)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = ((uint32_t)i ^ seed) * 2654435761u;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = __float2bfloat16(base + scale * ((float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f));
    }
}

static int profile_fill(bf16 *p, size_t n, uint32_t seed, float base, float scale, cudaStream_t s)
{
    profile_fill_kernel<<<fy_cu_blocks(n, 256), 256, 0, s>>>(p, n, seed, base, scale);
    FY_CUDA_LAUNCHED("the profile's fill kernel");
    return 0;
}

/* The block's parameters (GPT-2's scale, LayerNorm weights 1), its input and its output gradient,
 * in the model's scratch, which every later call rewrites before reading. */
static int profile_inputs(struct fy_cu_gpt2 *u, const struct fy_cu_profile_scratch *sc)
{
    size_t C = u->c.n_embd, NC = (size_t)u->N * C;
    cudaStream_t s = u->env.stream;
    FY_TRY(profile_fill(sc->params, u->lay.total, 1, 0.0f, 0.02f, s));
    FY_TRY(profile_fill(sc->params + u->lay.ln1_w, C, 2, 1.0f, 0.0f, s));
    FY_TRY(profile_fill(sc->params + u->lay.ln2_w, C, 3, 1.0f, 0.0f, s));
    FY_TRY(profile_fill(sc->x, NC, 4, 0.0f, 1.0f, s));
    return profile_fill(sc->dy, NC, 5, 0.0f, 1.0f, s);
}

/* Seconds the per-op table holds for one name (0 where that op did not run). */
static double profile_op_s(const struct fy_cu_gpt2 *u, const char *name)
{
    for (int i = 0; i < u->n_ops; i++)
        if (strcmp(u->ops[i].name, name) == 0)
            return 1e-3 * u->ops[i].ms;
    return 0;
}

/* The recompute forward (y NULL) op by op, as a backward reruns it, into kind[k][r]: it stops
 * before the MLP's down product, whose residual add would otherwise share the name "residual fwd"
 * with the attention's. */
static int profile_kinds(struct fy_cu_gpt2 *u, const struct fy_cu_profile_scratch *sc,
                         double kind[FY_ACT_KINDS][FY_CU_PROFILE_REPS])
{
    u->timing = 1;
    for (int r = -1; r < FY_CU_PROFILE_REPS; r++) {
        u->n_ops = 0;
        FY_TRY(block_forward(u, sc->params, NULL, sc->x, NULL, &u->own, 0));
        if (r < 0)
            continue;
        kind[FY_ACT_QKV][r] = profile_op_s(u, "matmul qkv fwd");
        kind[FY_ACT_ATTN][r] = profile_op_s(u, "attention fwd");
        /* fused, the residual add is the product's epilogue and has no op of its own */
        kind[FY_ACT_RESID][r] = profile_op_s(u, "matmul attn-proj fwd") +
                                profile_op_s(u, "residual fwd");
        /* fused, one product writes fc and g and reruns unless both are kept: half its time
         * each, with fc_gelu_fused telling the planner to place the two together */
        kind[FY_ACT_FC][r] = profile_op_s(u, "matmul fc fwd");
        kind[FY_ACT_GELU][r] = profile_op_s(u, "gelu fwd");
        if (u->fuse)
            kind[FY_ACT_FC][r] = kind[FY_ACT_GELU][r] = kind[FY_ACT_FC][r] / 2;
    }
    u->timing = 0;
    return 0;
}

/* Forward and backward of the whole block with timing off (the ops overlap as in training), then
 * the forward ops that produce each kind, alone (per-op events). */
static int profile_compute(struct fy_cu_gpt2 *u, const struct fy_cu_profile_scratch *sc,
                           cudaEvent_t *ev, struct fy_block_profile *out)
{
    cudaStream_t s = u->env.stream;
    double fwd[FY_CU_PROFILE_REPS], bwd[FY_CU_PROFILE_REPS];
    double kind[FY_ACT_KINDS][FY_CU_PROFILE_REPS];
    memset(kind, 0, sizeof kind);
    u->timing = 0;
    /* r = -1 warms up (cuBLASLt's plans, caches); each run is waited for, so that every one
     * starts on an idle device */
    for (int r = -1; r < FY_CU_PROFILE_REPS; r++) {
        double t_fwd, t_bwd;
        FY_CUDA(cudaEventRecord(ev[0], s), "recording a profiling event");
        FY_TRY(block_forward(u, sc->params, NULL, sc->x, sc->y, &u->own, 0));
        FY_CUDA(cudaEventRecord(ev[1], s), "recording a profiling event");
        /* from the set the forward just filled: the backward without recomputation */
        FY_TRY(block_backward(u, sc->params, NULL, sc->x, sc->dy, sc->dx, sc->grads, &u->own));
        FY_CUDA(cudaEventRecord(ev[2], s), "recording a profiling event");
        FY_TRY(fy_cu_profile_elapsed(ev[0], ev[1], &t_fwd));
        FY_TRY(fy_cu_profile_elapsed(ev[1], ev[2], &t_bwd));
        if (r >= 0) {
            fwd[r] = t_fwd;
            bwd[r] = t_bwd;
        }
    }
    FY_TRY(profile_kinds(u, sc, kind));
    out->fc_gelu_fused = u->fuse != 0;
    out->fwd_s = fy_cu_profile_median(fwd, FY_CU_PROFILE_REPS);
    out->bwd_s = fy_cu_profile_median(bwd, FY_CU_PROFILE_REPS);
    for (int k = 0; k < FY_ACT_KINDS; k++)
        out->recompute_s[k] = fy_cu_profile_median(kind[k], FY_CU_PROFILE_REPS);
    double N = u->N, C = u->c.n_embd;
    FY_REQUIRE(out->recompute_s[FY_ACT_QKV] > 0, -EIO,
               "cu_gpt2: profiling timed the QKV product at 0 s");
    out->flops_per_s = 2 * N * C * 3 * C / out->recompute_s[FY_ACT_QKV];
    return 0;
}

static int profile_block(void *units, const struct fy_cu_profile_scratch *sc,
                         cudaEvent_t ev[FY_CU_PROFILE_EVENTS], struct fy_block_profile *out,
                         void **copy, size_t *copy_bytes)
{
    struct fy_cu_gpt2 *u = (struct fy_cu_gpt2 *)units;
    /* a caller profiling the ops itself finds its table and switch as they were */
    int timing = u->timing, n_ops = u->n_ops;
    struct fy_cu_gpt2_op ops[FY_CU_GPT2_MAX_OPS];
    memcpy(ops, u->ops, sizeof ops);
    int rc;
    FY_TRY_OUT(rc, profile_inputs(u, sc));
    FY_TRY_OUT(rc, profile_compute(u, sc, ev, out));
out:
    u->timing = timing;
    u->n_ops = n_ops;
    memcpy(u->ops, ops, sizeof ops);
    /* the copies go through the units' own fc: the size of the largest kind a block swaps, and
     * scratch that the next forward or recompute rewrites */
    *copy = u->own.fc;
    *copy_bytes = 4 * (size_t)u->N * u->c.n_embd * sizeof(bf16);
    return rc;
}

/* ---- the ops table ---- */

static int gpt2_set_take(void *units, struct fy_cu_arena *arena, void *set)
{
    return fy_cu_gpt2_acts_take((struct fy_cu_gpt2 *)units, arena, (struct fy_cu_gpt2_acts *)set);
}

static int gpt2_embed_forward(void *units, const bf16 *embed, const int32_t *tokens,
                              const int32_t *positions, bf16 *x)
{
    struct fy_cu_gpt2 *u = (struct fy_cu_gpt2 *)units;
    const bf16 *wpe = embed + (size_t)u->c.vocab * u->c.n_embd;
    return fy_cu_gpt2_embed_forward(u, embed, wpe, tokens, positions, x);
}

static int gpt2_embed_backward(void *units, const int32_t *tokens, const int32_t *positions,
                               const bf16 *dx, float *dembed)
{
    struct fy_cu_gpt2 *u = (struct fy_cu_gpt2 *)units;
    float *dwpe = dembed + (size_t)u->c.vocab * u->c.n_embd;
    return fy_cu_gpt2_embed_backward(u, tokens, positions, dx, dembed, dwpe);
}

static int gpt2_block_forward(void *units, const bf16 *params, const int32_t *positions,
                              const bf16 *x, bf16 *y, void *keep)
{
    return fy_cu_gpt2_block_forward((struct fy_cu_gpt2 *)units, params, positions, x, y,
                                    (struct fy_cu_gpt2_acts *)keep);
}

static int gpt2_block_backward(void *units, const bf16 *params, const int32_t *positions,
                               const bf16 *x, const bf16 *dy, bf16 *dx,
                               const struct fy_cu_grads *grads, void *kept)
{
    return block_backward((struct fy_cu_gpt2 *)units, params, positions, x, dy, dx, grads,
                          (struct fy_cu_gpt2_acts *)kept);
}

static int gpt2_final_norm(void *units, const bf16 *norm, const bf16 *x, const bf16 **xn)
{
    return final_norm((struct fy_cu_gpt2 *)units, norm, x, xn);
}

static int gpt2_head(void *units, const bf16 *norm, const bf16 *head_w, const bf16 *x,
                     const int32_t *targets, float *losses, bf16 *dx, float *dnorm, float *dhead,
                     uint64_t count)
{
    return fy_cu_gpt2_head((struct fy_cu_gpt2 *)units, norm, head_w, x, targets, losses, dx, dnorm,
                           dhead, count);
}

static const struct fy_cu_swapping gpt2_swapping = {
    swap_check,
    swap_layout_check,
    swap_pieces,
    swap_recompute,
};

static const struct fy_cu_profiling gpt2_profiling = {profile_block};

const struct fy_cu_family fy_cu_family_gpt2 = {
    "gpt2",
    sizeof(struct fy_cu_gpt2_acts),
    NULL, /* nothing beyond what cu_model checks for every family */
    gpt2_arena_bytes,
    fy_cu_gpt2_acts_bytes,
    gpt2_create,
    gpt2_destroy,
    gpt2_set_take,
    gpt2_embed_forward,
    gpt2_embed_backward,
    gpt2_block_forward,
    gpt2_block_backward,
    gpt2_grad_piece_max,
    gpt2_final_norm,
    gpt2_head,
    &gpt2_swapping,
    &gpt2_profiling,
};
