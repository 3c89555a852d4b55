/* The Llama family on the CPU backend (common/model/arch/llama.h): fp32, OpenMP, written to be read, in
 * the style of cpu_gpt2.h; the reference for the CUDA version. One decoder block (Hugging Face's
 * LlamaDecoderLayer) forward and backward, the model's final RMSNorm, and the model pieces the gpu
 * worker runs unit by unit for a Llama model: the embedding lookup and the final norm with the
 * (tied or untied) LM head and cross-entropy. The family's table for the backend is
 * fy_cpu_llama_family (cpu_family.h); its blocks always recompute their internals (no swapped
 * internals, no per-op profile).
 *
 * The block (x, y: [B][T][C]; N = B*T rows; hd = C / n_head, or head_dim; I = intermediate size):
 *   n1 = rmsnorm(x, input_layernorm)                      rmsnorm(x, w) = w * (x * rsqrt(mean(x^2) + eps))
 *   q = n1 Wq^T, k = n1 Wk^T, v = n1 Wv^T                 no biases
 *   q, k = rope(q), rope(k)                               at positions 0..T-1 of each row, or given
 *   a = softmax(q k^T / sqrt(hd) + causal mask) v         query head h reads kv head h / (n_head / n_kv_head)
 *   h = x + a Wo^T
 *   n2 = rmsnorm(h, post_attention_layernorm)
 *   y = h + (silu(n2 Wgate^T) * (n2 Wup^T)) Wdown^T       silu(g) = g / (1 + exp(-g))
 * computed in fp32 in the order transformers computes it (RMSNorm in fp32, then times the weight).
 * The Llama-like families vary it through fy_llama(c) (common/model/arch/llama.h), computed here too: hd =
 * head_dim where given (q [NH hd], k and v [NKV hd], o_proj [C][NH hd]); qkv_bias (Qwen2): q, k and
 * v plus their biases; qk_norm (Qwen3): q and k each through an RMSNorm over every head's hd values
 * (q_norm, k_norm [hd], eps rms_eps) after the projection, before RoPE; sliding_window W > 0
 * (Mistral, Phi-3): query t attends to keys t2 with t - W < t2 <= t only.
 *
 * Documents (positions [B][T], gpu_worker/backend_ops.h; NULL: positions t): token t of row b is at
 * position positions[b][t] of a document starting at t - positions[b][t]; RoPE rotates it by that
 * position, and it attends only to the tokens of its document (t2 >= its start), with the window
 * as well where there is one: each document computes as it would alone.
 *
 * RoPE is Hugging Face's (non-interleaved, rotate_half): within a head, element i < hd/2 pairs with
 * element i + hd/2; with angle a = t * inv_freq[i]:
 *   out[i] = x[i] cos a - x[i + hd/2] sin a,   out[i + hd/2] = x[i + hd/2] cos a + x[i] sin a.
 * inv_freq[i] = 1 / theta^(2i / hd), in fp32 as transformers computes it, and with rope_type
 * "llama3" rescaled as transformers' _compute_llama3_parameters does (L = original max positions,
 * wavelen = 2 pi / inv_freq): wavelen < L / high_freq_factor: unchanged; wavelen > L /
 * low_freq_factor: divided by factor; between: (1 - s) inv_freq / factor + s inv_freq with
 * s = (L / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor).
 *
 * The model's config is a Llama fy_model_config (its family's fields in fy_llama(c), validated by
 * fy_model_config_validate). Parameters of a block are one contiguous fp32 vector, the tensors of
 * LlamaDecoderLayer in its order and its [out][in] orientation (struct fy_llama_unit_layout, from
 * the family's tensor table). Since q, k, v (and gate, up) are adjacent, each group is also one
 * [sum of outs][C] matrix, and is multiplied as one.
 *
 * Determinism: as in cpu_gpt2.c, every output element is computed by one thread in a fixed order
 * (schedule(static), no reductions split across threads), so the results are bit-identical whatever
 * the number of OpenMP threads. Matrix products are cpu_ops.h's fy_cpu_matmul_*.
 *
 * Buffers: the caller owns everything. Scratch is one float array of fy_cpu_llama_block_scratch floats;
 * the backward recomputes the forward from x into it (activation checkpointing, as cpu_gpt2.c
 * does), so only the block input needs to be kept. Outputs named "overwritten" are written in full;
 * parameter gradients of the block and the final norm are accumulated (+=) into a vector of the
 * parameters' layout. */
#ifndef FY_CPU_LLAMA_H
#define FY_CPU_LLAMA_H

#include <stddef.h>
#include <stdint.h>

#include "common/model/model.h"
#include "gpu_worker/cpu/cpu_family.h"

#ifdef __cplusplus
extern "C" {
#endif

/* inv_freq [head_dim / 2]: the rotary inverse frequencies, llama3 scaling applied when configured. */
void fy_cpu_llama_rope_inv_freq(const struct fy_model_config *c, float *inv_freq);

/* ---- single operations (exported for the tests) ---- */

/* RMSNorm over C of N rows: out = w * (x * rstd), rstd = rsqrt(mean(x^2) + eps); rstd [N] is
 * saved for the backward. */
void fy_cpu_llama_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N,
                                  int C, float eps);
/* dinp overwritten, dw accumulated. */
void fy_cpu_llama_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                                   const float *w, const float *rstd, int N, int C);
/* Qwen3's q_norm / k_norm: RMSNorm over each of NHx heads of hd floats at column col of N rows of
 * `stride` floats, one weight w [hd] shared by the heads; rstd [N][NHx] saved. out may be inp. */
void fy_cpu_llama_head_norm_forward(float *out, float *rstd, const float *inp, const float *w,
                                    int stride, int col, int NHx, int hd, int N, float eps);
/* In place: dx holds the output's gradient and becomes the input's; dw [hd] accumulated. */
void fy_cpu_llama_head_norm_backward(float *dx, float *dw, const float *inp, const float *w,
                                     const float *rstd, int stride, int col, int NHx, int hd,
                                     int N);
/* cos and sin [T][half] of t * inv_freq[i] (half = head_dim / 2). */
void fy_cpu_llama_rope_table(float *cos_t, float *sin_t, const float *inv_freq, int T, int half);
/* In place on NHx heads of hd floats at column col of rows of `stride` floats, [B][T][stride]: row
 * b, t rotated by the angles of table row positions[b][t] (positions NULL: t). */
void fy_cpu_llama_rope_forward(float *x, int stride, int col, int NHx, int hd, const float *cos_t,
                               const float *sin_t, const int32_t *positions, int B, int T);
/* The transpose (inverse rotation), in place on the gradient. */
void fy_cpu_llama_rope_backward(float *dx, int stride, int col, int NHx, int hd, const float *cos_t,
                                const float *sin_t, const int32_t *positions, int B, int T);
/* Causal grouped-query attention. qkv [B][T][(NH + 2 NKV) hd]: q heads, then k heads, then v heads,
 * each hd wide (the output of the fused q/k/v product, after RoPE). out [B][T][NH hd]; att
 * [B][NH][T][T] the softmax probabilities (saved for backward; zero above the diagonal). */
void fy_cpu_llama_attention_forward(float *out, float *att, const float *qkv, int B, int T, int NH,
                                    int NKV, int hd);
/* dqkv overwritten. */
void fy_cpu_llama_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                     const float *att, int B, int T, int NH, int NKV, int hd);
/* The same with a sliding window W > 0: query t attends to keys t2 with t - W < t2 <= t (W = 0, or
 * W >= T: all earlier keys, as above), and with positions (NULL: none) only to the keys of its own
 * document, t2 >= t - positions[b][t]; att is zero outside. */
void fy_cpu_llama_attention_window_forward(float *out, float *att, const float *qkv,
                                           const int32_t *positions, int B, int T, int NH, int NKV,
                                           int hd, int W);
void fy_cpu_llama_attention_window_backward(float *dqkv, const float *dout, const float *qkv,
                                            const float *att, const int32_t *positions, int B,
                                            int T, int NH, int NKV, int hd, int W);
/* gu [N][2I]: gate in columns 0..I-1, up in I..2I-1; out [N][I] = silu(gate) * up. */
void fy_cpu_llama_swiglu_forward(float *out, const float *gu, int N, int I);
/* dgu overwritten. */
void fy_cpu_llama_swiglu_backward(float *dgu, const float *dout, const float *gu, int N, int I);

/* ---- the block and the final norm ---- */

/* Floats of scratch one block's forward or backward needs. */
size_t fy_cpu_llama_block_scratch(const struct fy_model_config *c, int B, int T);
/* y = block(x); x and y must not overlap. positions: the documents (NULL: one a row; see above). */
void fy_cpu_llama_block_forward(const struct fy_model_config *c, const float *params,
                                const int32_t *positions, const float *x, float *y, float *scratch,
                                int B, int T);
/* Recomputes the block's internals from x, then back-propagates dy: dx overwritten, the parameter
 * gradients accumulated (+=) into dparams (the layout of params). positions: the forward's. */
void fy_cpu_llama_block_backward(const struct fy_model_config *c, const float *params,
                                 const int32_t *positions, const float *x, const float *dy,
                                 float *dx, float *dparams, float *scratch, int B, int T);

/* The model's final RMSNorm (model.norm.weight, w [C]) on [B][T][C]; rstd [B*T] is saved for the
 * backward. */
void fy_cpu_llama_norm_forward(const struct fy_model_config *c, const float *w, const float *x,
                               float *y, float *rstd, int B, int T);
/* dx overwritten, dw accumulated; rstd as the forward left it. */
void fy_cpu_llama_norm_backward(const struct fy_model_config *c, const float *w, const float *x,
                                const float *rstd, const float *dy, float *dx, float *dw, int B,
                                int T);

/* ---- model pieces, one unit at a time (common/model/model.h's Llama units) ---- */

/* x[b][t] = embed_tokens[tokens[b][t]] (no positions); tokens must be < V. */
void fy_cpu_llama_embed_forward(const struct fy_model_config *m, const float *embed,
                                const int32_t *tokens, float *x, int B, int T);
/* dembed += gradient of the lookup. */
void fy_cpu_llama_embed_backward(const struct fy_model_config *m, const int32_t *tokens,
                                 const float *dx, float *dembed, int B, int T);
/* Floats of scratch the head needs. */
size_t fy_cpu_llama_head_scratch(const struct fy_model_config *m, int B, int T);
/* Final RMSNorm, logits = norm(x) W^T with W = lm_head (final unit, after the norm weight) or, when
 * tied, embed_tokens; mean cross-entropy over the targets (a target < 0 is ignored). Returns the
 * loss. With dx != NULL also back-propagates: dx overwritten, dfinal (the final unit's layout)
 * overwritten, dembed overwritten with the head's share of the embedding gradient (zero when
 * untied); the embedding backward then adds its own. */
float fy_cpu_llama_head_forward_backward(const struct fy_model_config *m, const float *final_params,
                                         const float *embed, const float *x, const int32_t *targets,
                                         float *dx, float *dfinal, float *dembed, float *scratch,
                                         int B, int T);
/* logits [B*T][V] (needs fy_cpu_llama_head_scratch floats of scratch). */
void fy_cpu_llama_logits(const struct fy_model_config *m, const float *final_params,
                         const float *embed, const float *x, float *logits, float *scratch, int B,
                         int T);

/* The family's operations for the CPU backend. */
extern const struct fy_cpu_family fy_cpu_llama_family;

#ifdef __cplusplus
}
#endif

#endif
