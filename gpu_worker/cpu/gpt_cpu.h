/* The GPT-2 operations of the CPU backend: fp32, OpenMP, written to be read. The reference that the
 * CUDA backend is checked against. Every function gives bit-identical results whatever the number of
 * OpenMP threads: each output element is computed by one thread in a fixed order (no reductions split
 * across threads), so multi-process and in-process runs, and runs on different machines, agree.
 *
 * Shapes: B sequences of T tokens, C = n_embd, NH heads, V = vocab. Activations are [B][T][C].
 * Matrices are [out][in]: y = x W^T + b. Parameter layouts are those of common/model.h. */
#ifndef FY_GPT_CPU_H
#define FY_GPT_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "common/actplan.h"
#include "common/arch/gpt2.h"
#include "common/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Small vector helpers the CPU ops share (inline, so each call site vectorises as before; C only,
 * as `restrict` is). */
#ifndef __cplusplus

/* Eight partial sums in a fixed order: gives the compiler independent lanes to vectorise without
 * making the result depend on anything but n. */
static inline float fy_cpu_dot(const float *a, const float *b, int n)
{
    float s[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
#pragma omp simd
        for (int k = 0; k < 8; k++)
            s[k] += a[i + k] * b[i + k];
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++)
        r += a[i] * b[i];
    return r;
}

/* y += a * x. Each element is independent, so vectorising changes nothing; the pragma lets -O2
 * do it without a runtime aliasing check. */
static inline void fy_cpu_axpy(float *restrict y, const float *restrict x, float a, int n)
{
#pragma omp simd
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* out = a + b, element by element (threads split the range; each element is independent). */
static inline void fy_cpu_add(float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}
#endif

/* ---- single operations (exported for the finite-difference tests) ---- */

/* out[n][o] = sum_i inp[n][i] * w[o][i] + (bias ? bias[o] : 0) */
void fy_cpu_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                           int IN, int OUT);
/* dinp (overwritten, may be NULL), dw and dbias (accumulated +=, dbias may be NULL) */
void fy_cpu_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                            const float *w, int N, int IN, int OUT);
/* LayerNorm over C with eps 1e-5; mean and rstd [N] are saved for backward. */
void fy_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                              const float *b, int N, int C);
/* dinp overwritten; dw, db accumulated. */
void fy_cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                               const float *w, const float *mean, const float *rstd, int N, int C);
/* Causal multi-head attention. qkv [B][T][3C] (q, k, v, each heads-major within C); out [B][T][C];
 * att [B][NH][T][T] holds the softmax probabilities (saved for backward). */
void fy_cpu_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
/* dqkv overwritten. */
void fy_cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                               int B, int T, int C, int NH);
/* GELU, tanh approximation. */
void fy_cpu_gelu_forward(float *out, const float *inp, size_t n);
/* dinp overwritten. */
void fy_cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);

/* ---- model pieces, one unit at a time (what the gpu worker runs layer by layer) ---- */

/* x[b][t] = wte[tokens[b][t]] + wpe[t]; embed = [wte V*C | wpe ctx*C]. Tokens must be < V. */
void fy_cpu_embed_forward(const struct fy_model_config *c, const float *embed, const int32_t *tokens,
                          float *x, int B, int T);
/* dembed += gradient of the embedding lookup (wte rows and wpe rows). */
void fy_cpu_embed_backward(const struct fy_model_config *c, const int32_t *tokens, const float *dx,
                           float *dembed, int B, int T);

/* Floats of scratch one block's forward or backward needs. */
size_t fy_cpu_block_scratch(const struct fy_model_config *c, int B, int T);
/* y = x + attn(ln1(x)); y = y + mlp(ln2(y)). saved (may be NULL): FY_ACT_KINDS buffers, where
 * the forward copies the swappable internals whose entry is not NULL, in the CPU layout of
 * fy_actplan_sizes_backend (f32; ATTN is the attention output then its probabilities). */
void fy_cpu_block_forward(const struct fy_model_config *c, const float *params, const float *x,
                          float *y, float *scratch, void *const *saved, int B, int T);
/* Seconds each forward op of a block takes (the ops that produce each kind, as the backward
 * recomputes them; CKPT 0), for the activation planner's profile. */
void fy_cpu_block_op_times(const struct fy_model_config *c, const float *params, const float *x,
                           float *scratch, int B, int T, double op_s[FY_ACT_KINDS]);
/* Recomputes the block's internals from its input x (activation checkpointing), except those that
 * saved gives (as the forward wrote them; they are read, not changed), then back-propagates dy:
 * dx and dparams are overwritten (dparams in the block unit's layout). The same bits whatever
 * saved gives. */
void fy_cpu_block_backward(const struct fy_model_config *c, const float *params, const float *x,
                           const float *dy, float *dx, float *dparams, float *scratch,
                           void *const *saved, int B, int T);

/* Rows of logits a head holds at once (its logits scratch is FY_CPU_HEAD_CHUNK * V floats). */
#define FY_CPU_HEAD_CHUNK 64
/* The LM head and mean cross-entropy on normalised rows xn [N][C] with the head matrix w [V][C]
 * (logits = xn w^T; a target < 0 is ignored, the mean is over the others); returns the loss.
 * logits: FY_CPU_HEAD_CHUNK * V floats of scratch. With dxn != NULL also back-propagates: dxn
 * overwritten, dw accumulated (+=). */
float fy_cpu_xent_head(const float *xn, const float *w, const int32_t *targets, int N, int C, int V,
                       float *logits, float *dxn, float *dw);

/* Floats of scratch the head needs (logits are processed in chunks of rows, never all at once). */
size_t fy_cpu_head_scratch(const struct fy_model_config *c, int B, int T);
/* Final LayerNorm, logits = lnf(x) wte^T, mean cross-entropy over the targets (a target < 0 is
 * ignored; the mean is over the others). Returns the loss. With dx != NULL also back-propagates:
 * dx overwritten, dfinal (final unit's layout) overwritten, and dembed overwritten with the head's
 * share of the wte gradient (its wpe part set to zero); the embedding backward then adds its own. */
float fy_cpu_head_forward_backward(const struct fy_model_config *c, const float *final_params,
                                   const float *embed, const float *x, const int32_t *targets,
                                   float *dx, float *dfinal, float *dembed, float *scratch, int B,
                                   int T);

#ifdef __cplusplus
}
#endif

#endif
