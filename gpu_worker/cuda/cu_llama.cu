/* The Llama units on the GPU (contract: cu_llama.h), mirroring the fp32 CPU reference
 * gpu_worker/cpu/llama_cpu.c op for op: RMSNorm, RoPE and SwiGLU kernels here; the products
 * through cu_matmul (q/k/v and gate/up each one product, the residual adds in the o_proj and
 * down_proj epilogues), grouped-query attention through cu_flash, the LM head through
 * cu_attention's fy_cu_head, the embedding lookup and the norms' weight gradients through cu_norm.
 *
 * Numerics: storage bf16 (activations, weights) or f32 (statistics, gradients); every kernel
 * computes in fp32 and rounds its output once. RMSNorm as transformers computes it: the mean
 * square and its reciprocal square root in fp32, the row normalised in fp32, then times the
 * weight. Determinism: warp sums are xor butterflies (every lane ends with the same bits), sums
 * over rows run in a fixed order (cu_norm's two passes), no atomics anywhere. */
#include "gpu_worker/cuda/cu_llama.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_worker/cpu/llama_cpu.h"
#include "gpu_worker/cuda/cu_attention.h"
#include "gpu_worker/cuda/cu_flash.h"
#include "gpu_worker/cuda/cu_norm.h"

/* Elementwise kernels: threads per block (grid-stride loops). Row kernels: one warp per row. */
#define EW_THREADS 256
#define ROW_WARPS 8

struct fy_cu_llama {
    struct fy_model_config c;
    struct fy_llama_unit_layout lay;
    int B, T, N;
    int C, NH, NKV, hd, I;
    int QC, S; /* attention output width NH hd; fused q/k/v row (NH + 2 NKV) hd */
    struct fy_cu_llama_env env;
    float *cos_t, *sin_t; /* [T][hd/2] */
    float *norm_scratch;  /* the norms' weight-gradient partial sums */
    struct fy_cu_llama_acts own;
    /* the backward's gradients: dact [N][I], dgu [N][2I], dn (of n2, then of n1) and dh [N][C],
     * datty [N][QC], dqkv [N][S] */
    bf16 *dact, *dgu, *dn, *dh, *datty, *dqkv;
};

/* ---- kernels ---- */

static __device__ __forceinline__ float ld(const bf16 *p, size_t i)
{
    return __bfloat162float(p[i]);
}

/* Sum over the 32 lanes of a warp; every lane gets the same bits. */
static __device__ __forceinline__ float lane_sum(float v)
{
    for (int m = 16; m > 0; m >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

static __global__ void rmsnorm_forward_kernel(bf16 *__restrict__ out, float *__restrict__ rstd,
                                              const bf16 *__restrict__ inp,
                                              const bf16 *__restrict__ w, int N, int C, float eps)
{
    int lane = threadIdx.x % 32, row = blockIdx.x * ROW_WARPS + threadIdx.x / 32;
    if (row >= N) /* the whole warp leaves together */
        return;
    const bf16 *x = inp + (size_t)row * C;
    float ss = 0.0f;
    for (int i = lane; i < C; i += 32)
        ss += ld(x, i) * ld(x, i);
    float r = 1.0f / sqrtf(lane_sum(ss) / (float)C + eps);
    bf16 *y = out + (size_t)row * C;
    for (int i = lane; i < C; i += 32)
        y[i] = __float2bfloat16_rn(ld(w, i) * (ld(x, i) * r));
    if (lane == 0)
        rstd[row] = r;
}

/* With xhat = x r and g = dout w: dinp += r (g - xhat mean(g xhat)); each element of dinp is read
 * and written by the same thread. */
static __global__ void rmsnorm_backward_kernel(bf16 *dinp, const bf16 *__restrict__ dout,
                                               const bf16 *__restrict__ inp,
                                               const bf16 *__restrict__ w,
                                               const float *__restrict__ rstd, int N, int C)
{
    int lane = threadIdx.x % 32, row = blockIdx.x * ROW_WARPS + threadIdx.x / 32;
    if (row >= N)
        return;
    size_t base = (size_t)row * C;
    float r = rstd[row], gx = 0.0f;
    for (int i = lane; i < C; i += 32)
        gx += ld(dout, base + i) * ld(w, i) * (ld(inp, base + i) * r);
    gx = lane_sum(gx) / (float)C;
    for (int i = lane; i < C; i += 32) {
        float g = r * (ld(dout, base + i) * ld(w, i) - (ld(inp, base + i) * r) * gx);
        dinp[base + i] = __float2bfloat16_rn(ld(dinp, base + i) + g);
    }
}

/* One rotated pair (i, i + hd/2) of one head of one row per iteration; sign -1 rotates back. */
static __global__ void rope_kernel(bf16 *x, int stride, int col, int NHx, int hd,
                                   const float *__restrict__ cos_t,
                                   const float *__restrict__ sin_t, int T, size_t pairs, float sign)
{
    int half = hd / 2;
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < pairs;
         p += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(p % half);
        size_t head = p / half, n = head / NHx;
        bf16 *v = x + n * stride + col + (head % NHx) * hd;
        size_t at = (n % T) * half + i;
        float cs = cos_t[at], sn = sign * sin_t[at], a = ld(v, i), b = ld(v, i + half);
        v[i] = __float2bfloat16_rn(a * cs - b * sn);
        v[i + half] = __float2bfloat16_rn(b * cs + a * sn);
    }
}

static __global__ void swiglu_forward_kernel(bf16 *__restrict__ out, const bf16 *__restrict__ gu,
                                             size_t n, int I)
{
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        size_t at = k / I * 2 * I + k % I; /* the gate of element k; its up is I further */
        float g = ld(gu, at), u = ld(gu, at + I);
        out[k] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
    }
}

static __global__ void swiglu_backward_kernel(bf16 *__restrict__ dgu, const bf16 *__restrict__ dout,
                                              const bf16 *__restrict__ gu, size_t n, int I)
{
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        size_t at = k / I * 2 * I + k % I;
        float g = ld(gu, at), u = ld(gu, at + I), d = ld(dout, k);
        float e = 1.0f + expf(-g), s = 1.0f / e;
        dgu[at + I] = __float2bfloat16_rn(d * (g / e));
        dgu[at] = __float2bfloat16_rn(d * u * (s * (1.0f + g * (1.0f - s))));
    }
}

/* ---- the kernels' host side ---- */

static unsigned row_blocks(int rows) { return (unsigned)((rows + ROW_WARPS - 1) / ROW_WARPS); }

int fy_cu_llama_rmsnorm_forward(bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int N,
                                int C, float eps, cudaStream_t stream)
{
    FY_REQUIRE(N > 0 && C > 0 && eps > 0.0f, -EINVAL, "rmsnorm forward: bad shape N=%d C=%d eps=%g",
               N, C, (double)eps);
    FY_REQUIRE(out && rstd && inp && w, -EINVAL, "rmsnorm forward: NULL pointer");
    rmsnorm_forward_kernel<<<row_blocks(N), ROW_WARPS * 32, 0, stream>>>(out, rstd, inp, w, N, C,
                                                                         eps);
    FY_CUDA_LAUNCHED("rmsnorm_forward_kernel");
    return 0;
}

int fy_cu_llama_rmsnorm_backward(bf16 *dinp, float *dw, float *scratch, const bf16 *dout,
                                 const bf16 *inp, const bf16 *w, const float *rstd, int N, int C,
                                 cudaStream_t stream)
{
    FY_REQUIRE(N > 0 && C > 0, -EINVAL, "rmsnorm backward: bad shape N=%d C=%d", N, C);
    FY_REQUIRE(dinp && dw && scratch && dout && inp && w && rstd, -EINVAL,
               "rmsnorm backward: NULL pointer");
    /* dw += sum over rows of dout (x rstd): the LayerNorm's passes without a mean or a bias */
    FY_TRY(fy_cu_norm_weight_grads(dw, NULL, scratch, dout, inp, NULL, rstd, N, C, stream));
    rmsnorm_backward_kernel<<<row_blocks(N), ROW_WARPS * 32, 0, stream>>>(dinp, dout, inp, w, rstd,
                                                                          N, C);
    FY_CUDA_LAUNCHED("rmsnorm_backward_kernel");
    return 0;
}

static int rope(bf16 *x, int stride, int col, int NHx, int hd, const float *cos_t,
                const float *sin_t, int B, int T, float sign, cudaStream_t stream)
{
    FY_REQUIRE(B > 0 && T > 0 && NHx > 0 && hd > 0 && hd % 2 == 0 && col >= 0 &&
                   col + (size_t)NHx * hd <= (size_t)stride,
               -EINVAL, "rope: bad shape B=%d T=%d NHx=%d hd=%d col=%d stride=%d", B, T, NHx, hd,
               col, stride);
    FY_REQUIRE(x && cos_t && sin_t, -EINVAL, "rope: NULL pointer");
    size_t pairs = (size_t)B * T * NHx * (hd / 2);
    rope_kernel<<<fy_cu_blocks(pairs, EW_THREADS), EW_THREADS, 0, stream>>>(
        x, stride, col, NHx, hd, cos_t, sin_t, T, pairs, sign);
    FY_CUDA_LAUNCHED("rope_kernel");
    return 0;
}

int fy_cu_llama_rope_forward(bf16 *x, int stride, int col, int NHx, int hd, const float *cos_t,
                             const float *sin_t, int B, int T, cudaStream_t stream)
{
    return rope(x, stride, col, NHx, hd, cos_t, sin_t, B, T, 1.0f, stream);
}

int fy_cu_llama_rope_backward(bf16 *dx, int stride, int col, int NHx, int hd, const float *cos_t,
                              const float *sin_t, int B, int T, cudaStream_t stream)
{
    return rope(dx, stride, col, NHx, hd, cos_t, sin_t, B, T, -1.0f, stream);
}

int fy_cu_llama_swiglu_forward(bf16 *out, const bf16 *gu, int N, int I, cudaStream_t stream)
{
    FY_REQUIRE(N > 0 && I > 0, -EINVAL, "swiglu forward: bad shape N=%d I=%d", N, I);
    FY_REQUIRE(out && gu, -EINVAL, "swiglu forward: NULL pointer");
    size_t n = (size_t)N * I;
    swiglu_forward_kernel<<<fy_cu_blocks(n, EW_THREADS), EW_THREADS, 0, stream>>>(out, gu, n, I);
    FY_CUDA_LAUNCHED("swiglu_forward_kernel");
    return 0;
}

int fy_cu_llama_swiglu_backward(bf16 *dgu, const bf16 *dout, const bf16 *gu, int N, int I,
                                cudaStream_t stream)
{
    FY_REQUIRE(N > 0 && I > 0, -EINVAL, "swiglu backward: bad shape N=%d I=%d", N, I);
    FY_REQUIRE(dgu && dout && gu, -EINVAL, "swiglu backward: NULL pointer");
    size_t n = (size_t)N * I;
    swiglu_backward_kernel<<<fy_cu_blocks(n, EW_THREADS), EW_THREADS, 0, stream>>>(dgu, dout, gu,
                                                                                   n, I);
    FY_CUDA_LAUNCHED("swiglu_backward_kernel");
    return 0;
}

/* ---- the unit: shape, buffers ---- */

int fy_cu_llama_check(const struct fy_model_config *c)
{
    FY_REQUIRE(c->arch == FY_ARCH_LLAMA, -EINVAL, "cu_llama: the model is %s, not Llama",
               fy_arch_name(c->arch));
    FY_REQUIRE(c->n_head > 0 && c->n_kv_head > 0 && c->n_embd % c->n_head == 0, -EINVAL,
               "cu_llama: %u heads (%u kv) do not divide n_embd %u", c->n_head, c->n_kv_head,
               c->n_embd);
    unsigned hd = c->n_embd / c->n_head;
    FY_REQUIRE(fy_cu_flash_gqa_supported((int)c->n_head, (int)c->n_kv_head, (int)hd), -EINVAL,
               "the CUDA backend's Llama attention takes head sizes that are multiples of 8 up to "
               "128 (64 and 128 are those of the ~1B Llamas) with n_kv_head dividing n_head; "
               "this model has head size %u (n_embd %u / n_head %u) and %u kv heads: train it "
               "with --backend cpu", hd, c->n_embd, c->n_head, c->n_kv_head);
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
    l->NKV = (int)c->n_kv_head;
    l->hd = l->C / l->NH;
    l->I = (int)c->n_inter;
    l->QC = l->NH * l->hd;
    l->S = (l->NH + 2 * l->NKV) * l->hd;
}

/* The pieces of one set of internals; returns how many. */
static int acts_plan(const struct fy_cu_llama *l, struct fy_cu_llama_acts *a, struct fy_cu_piece *p)
{
    size_t N = (size_t)l->N, C = (size_t)l->C, I = (size_t)l->I;
    int n = 0;
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
#undef PIECE
    return n;
}

/* Every buffer of the unit (its own set first); returns how many. */
#define UNIT_PIECES 24
static int unit_plan(struct fy_cu_llama *l, struct fy_cu_piece *p)
{
    size_t N = (size_t)l->N, C = (size_t)l->C, I = (size_t)l->I, half = (size_t)l->hd / 2;
    int n = acts_plan(l, &l->own, p);
#define PIECE(field, count, type)                                                                  \
    (p[n++] = (struct fy_cu_piece){(count) * sizeof(type), (void **)&l->field})
    PIECE(cos_t, (size_t)l->T * half, float);
    PIECE(sin_t, (size_t)l->T * half, float);
    PIECE(norm_scratch, fy_cu_layernorm_backward_scratch(l->N, l->C), float);
    PIECE(dact, N * I, bf16);
    PIECE(dgu, 2 * N * I, bf16);
    PIECE(dn, N * C, bf16);
    PIECE(dh, N * C, bf16);
    PIECE(datty, N * l->QC, bf16);
    PIECE(dqkv, N * l->S, bf16);
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
    struct fy_llama_config lc;
    fy_llama_config_of(&l->c, &lc);
    size_t half = (size_t)l->hd / 2, n = (size_t)l->T * half;
    float *inv_freq = (float *)malloc(half * sizeof(float));
    float *table = (float *)malloc(2 * n * sizeof(float));
    if (inv_freq == NULL || table == NULL) {
        free(inv_freq);
        free(table);
        fy_error("cu_llama: no host memory for the rotary table");
        return -ENOMEM;
    }
    fy_llama_rope_inv_freq(&lc, inv_freq);
    fy_llama_rope_table(table, table + n, inv_freq, l->T, (int)half);
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
                    const struct fy_cu_llama_env *env)
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
        fy_error("the GPU arena (%.2f GiB, %.2f GiB free) cannot hold the Llama blocks' working "
                 "buffers for batch %d x %d (%.2f GiB): raise --gpu-mem or lower the batch",
                 (double)arena->size / (1 << 30), (double)(arena->size - arena->used) / (1 << 30),
                 B, T, (double)fy_cu_arena_pieces_footprint(p, n) / (1 << 30));
        free(l);
        return -ENOMEM;
    }
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

/* ---- device-level units ---- */

int fy_cu_llama_dev_embed_forward(struct fy_cu_llama *l, const bf16 *embed, const int32_t *tokens,
                                  bf16 *x)
{
    return fy_cu_embed_forward(x, tokens, embed, NULL, l->B, l->T, l->C, l->env.stream);
}

int fy_cu_llama_dev_embed_backward(struct fy_cu_llama *l, const int32_t *tokens, const bf16 *dx,
                                   float *dembed)
{
    return fy_cu_embed_backward(dembed, NULL, dx, tokens, l->B, l->T, l->C, (int)l->c.vocab,
                                l->env.stream);
}

#define P(field) (params + l->lay.field)
#define G(field) (dparams + l->lay.field)

/* The forward into set a. y == NULL: the backward's recompute, which stops before the down
 * product (its output is never read there). */
static int block_forward(struct fy_cu_llama *l, const bf16 *params, const bf16 *x, bf16 *y,
                         struct fy_cu_llama_acts *a)
{
    int N = l->N, C = l->C, I = l->I;
    float eps = l->c.rms_eps;
    struct fy_cu_lt *lt = l->env.lt;
    cudaStream_t s = l->env.stream;
    /* attention: h = x + o_proj(attention(rope(q), rope(k), v)), q k v of rmsnorm(x) */
    FY_TRY(fy_cu_llama_rmsnorm_forward(a->n1, a->rstd1, x, P(input_norm), N, C, eps, s));
    FY_TRY(fy_cu_matmul_forward(lt, a->qkv, a->n1, P(q_proj), NULL, N, C, l->S, s));
    /* the k heads follow the q heads: one rotation over both */
    FY_TRY(fy_cu_llama_rope_forward(a->qkv, l->S, 0, l->NH + l->NKV, l->hd, l->cos_t, l->sin_t,
                                    l->B, l->T, s));
    FY_TRY(fy_cu_flash_gqa_forward(a->atty, a->qkv, a->attn, l->B, l->T, l->NH, l->NKV, l->hd, s));
    FY_TRY(fy_cu_matmul_forward_ex(lt, a->h, a->atty, P(o_proj), NULL, x, NULL, N, l->QC, C, s));
    /* MLP: y = h + down(silu(gate(n2)) * up(n2)), n2 = rmsnorm(h) */
    FY_TRY(fy_cu_llama_rmsnorm_forward(a->n2, a->rstd2, a->h, P(post_norm), N, C, eps, s));
    FY_TRY(fy_cu_matmul_forward(lt, a->gu, a->n2, P(gate_proj), NULL, N, C, 2 * I, s));
    FY_TRY(fy_cu_llama_swiglu_forward(a->act, a->gu, N, I, s));
    if (y == NULL)
        return 0;
    return fy_cu_matmul_forward_ex(lt, y, a->act, P(down_proj), NULL, a->h, NULL, N, I, C, s);
}

int fy_cu_llama_dev_block_forward(struct fy_cu_llama *l, const bf16 *params, const bf16 *x, bf16 *y,
                                  struct fy_cu_llama_acts *keep)
{
    FY_REQUIRE(y != NULL, -EINVAL, "fy_cu_llama_dev_block_forward: no output buffer");
    return block_forward(l, params, x, y, keep != NULL ? keep : &l->own);
}

int fy_cu_llama_dev_block_backward(struct fy_cu_llama *l, const bf16 *params, const bf16 *x,
                                   const bf16 *dy, bf16 *dx, float *dparams,
                                   struct fy_cu_llama_acts *kept)
{
    int N = l->N, C = l->C, I = l->I;
    size_t NC = (size_t)N * C;
    struct fy_cu_lt *lt = l->env.lt;
    cudaStream_t s = l->env.stream;
    struct fy_cu_llama_acts *a = kept;
    if (a == NULL) { /* recompute from the checkpoint x */
        a = &l->own;
        FY_TRY(block_forward(l, params, x, NULL, a));
    }
    FY_CUDA(cudaMemsetAsync(dparams, 0, l->lay.total * sizeof(float), s), "zeroing gradients");
    /* MLP branch: y = h + down(swiglu(gate_up(rmsnorm2(h)))) */
    FY_TRY(fy_cu_matmul_backward(lt, l->dact, G(down_proj), NULL, dy, a->act, P(down_proj), N, I,
                                 C, s));
    FY_TRY(fy_cu_llama_swiglu_backward(l->dgu, l->dact, a->gu, N, I, s));
    FY_TRY(fy_cu_matmul_backward(lt, l->dn, G(gate_proj), NULL, l->dgu, a->n2, P(gate_proj), N, C,
                                 2 * I, s));
    FY_CUDA(cudaMemcpyAsync(l->dh, dy, NC * sizeof(bf16), cudaMemcpyDeviceToDevice, s),
            "copying the residual gradient");
    FY_TRY(fy_cu_llama_rmsnorm_backward(l->dh, G(post_norm), l->norm_scratch, l->dn, a->h,
                                        P(post_norm), a->rstd2, N, C, s));
    /* attention branch: h = x + o_proj(attention(rope(qkv(rmsnorm1(x))))) */
    FY_TRY(fy_cu_matmul_backward(lt, l->datty, G(o_proj), NULL, l->dh, a->atty, P(o_proj), N,
                                 l->QC, C, s));
    FY_TRY(fy_cu_flash_gqa_backward(l->dqkv, l->datty, a->atty, a->qkv, a->attn, l->B, l->T, l->NH,
                                    l->NKV, l->hd, s));
    FY_TRY(fy_cu_llama_rope_backward(l->dqkv, l->S, 0, l->NH + l->NKV, l->hd, l->cos_t, l->sin_t,
                                     l->B, l->T, s));
    FY_TRY(fy_cu_matmul_backward(lt, l->dn, G(q_proj), NULL, l->dqkv, a->n1, P(q_proj), N, C, l->S,
                                 s));
    FY_CUDA(cudaMemcpyAsync(dx, l->dh, NC * sizeof(bf16), cudaMemcpyDeviceToDevice, s),
            "copying the residual gradient");
    return fy_cu_llama_rmsnorm_backward(dx, G(input_norm), l->norm_scratch, l->dn, x,
                                        P(input_norm), a->rstd1, N, C, s);
}

#undef P
#undef G

int fy_cu_llama_dev_final_norm(struct fy_cu_llama *l, const bf16 *norm_w, const bf16 *x,
                               const bf16 **xn)
{
    *xn = l->own.n1;
    return fy_cu_llama_rmsnorm_forward(l->own.n1, l->own.rstd1, x, norm_w, l->N, l->C,
                                       l->c.rms_eps, l->env.stream);
}

int fy_cu_llama_dev_head(struct fy_cu_llama *l, const bf16 *norm_w, const bf16 *head_w,
                         const bf16 *x, const int32_t *targets, float *losses, bf16 *dx,
                         float *dnorm, float *dhead)
{
    int N = l->N, C = l->C, V = (int)l->c.vocab;
    cudaStream_t s = l->env.stream;
    const bf16 *xn;
    FY_TRY(fy_cu_llama_dev_final_norm(l, norm_w, x, &xn));
    if (dx == NULL)
        return fy_cu_head(l->env.lt, losses, NULL, NULL, xn, head_w, targets, N, C, V,
                          l->env.head_rows, l->env.head_scratch, s);
    /* the gradients accumulate (+=) from zero; dn takes the normalised rows' gradient */
    FY_CUDA(cudaMemsetAsync(dhead, 0, (size_t)V * C * sizeof(float), s), "zeroing gradients");
    FY_CUDA(cudaMemsetAsync(dnorm, 0, (size_t)C * sizeof(float), s), "zeroing gradients");
    FY_TRY(fy_cu_head(l->env.lt, losses, l->dn, dhead, xn, head_w, targets, N, C, V,
                      l->env.head_rows, l->env.head_scratch, s));
    FY_CUDA(cudaMemsetAsync(dx, 0, (size_t)N * C * sizeof(bf16), s), "zeroing dx");
    return fy_cu_llama_rmsnorm_backward(dx, dnorm, l->norm_scratch, l->dn, x, norm_w,
                                        l->own.rstd1, N, C, s);
}
