/* The Llama family (Hugging Face LlamaForCausalLM): its config fields and its units' layout, for
 * the registry (common/model/arch/arch.h) and the backends' Llama files. Units: 0 holds
 * embed_tokens [V][C] (no positions), 1..n_layer the decoder blocks, n_layer+1 the final RMSNorm
 * weight [C] followed, when the head is untied, by lm_head [V][C]. */
#ifndef FY_ARCH_LLAMA_H
#define FY_ARCH_LLAMA_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/model/model_config.h"

#ifdef __cplusplus
extern "C" {
#endif

enum fy_rope { FY_ROPE_DEFAULT = 0, FY_ROPE_LLAMA3 = 1 };

/* Hugging Face LlamaConfig names in the comments. */
struct fy_llama_fields {
    uint32_t n_kv_head;         /* num_key_value_heads */
    uint32_t n_inter;           /* intermediate_size */
    uint32_t tied;              /* tie_word_embeddings: 1 = no lm_head, embed_tokens serves */
    uint32_t rope_type;         /* enum fy_rope: rope_scaling absent, or rope_type "llama3" */
    uint32_t rope_orig_max_pos; /* llama3: original_max_position_embeddings */
    float rms_eps;              /* rms_norm_eps */
    double rope_theta;          /* rope_theta */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor; /* llama3 */
    /* What the Llama-like families (Qwen2, Qwen3, Mistral, Phi-3) vary; all zero for Llama itself,
     * so that Llama's stores, model.conf files and hashes are as they always were. */
    uint32_t head_dim;       /* head_dim, where it is not n_embd / n_head; 0: n_embd / n_head */
    uint32_t qkv_bias;       /* 1: q, k and v projections have biases (Qwen2; set by the family) */
    uint32_t qk_norm;        /* 1: an RMSNorm over each head's q and k before RoPE (Qwen3; family) */
    uint32_t sliding_window; /* W: a position attends to itself and the W - 1 before it; 0: all */
};

/* The Llama-like families' fields in a config's family block (zero for GPT-2), to read and to
 * write. */
static inline const struct fy_llama_fields *fy_llama(const struct fy_model_config *c)
{
    return (const struct fy_llama_fields *)(const void *)c->family.bytes;
}
static inline struct fy_llama_fields *fy_llama_mut(struct fy_model_config *c)
{
    return (struct fy_llama_fields *)(void *)c->family.bytes;
}
/* A family block holding f (the rest zero), for a config's initialiser: .family = fy_llama_family(...) */
static inline union fy_family_fields fy_llama_family(struct fy_llama_fields f)
{
    union fy_family_fields u;
    memset(&u, 0, sizeof u);
    memcpy(u.bytes, &f, sizeof f);
    return u;
}
#ifdef __cplusplus
static_assert(sizeof(struct fy_llama_fields) <= FY_FAMILY_FIELDS_BYTES,
              "the family block holds them");
#else
_Static_assert(sizeof(struct fy_llama_fields) <= FY_FAMILY_FIELDS_BYTES,
               "the family block holds them");
#endif

/* The head size: head_dim, or n_embd / n_head. */
uint32_t fy_llama_head_dim(const struct fy_model_config *c);

/* Offsets in floats of each tensor inside the block unit of a Llama-like family, in this order
 * (every such family's tensor table lays its tensors out so; test_arch checks it). Q = n_head * hd,
 * KV = n_kv_head * hd. Since q, k, v (their biases, and gate, up) are adjacent, each group is also
 * one [Q + 2 KV][C] matrix ([Q + 2 KV] vector, [2 I][C] matrix), as Phi-3 stores them fused. */
#define FY_LLAMA_ABSENT ((size_t)-1) /* a tensor the family does not have */
struct fy_llama_unit_layout {
    size_t input_norm; /* input_layernorm.weight [C] */
    size_t q_proj;     /* self_attn.q_proj.weight [Q][C] */
    size_t k_proj;     /* self_attn.k_proj.weight [KV][C] */
    size_t v_proj;     /* self_attn.v_proj.weight [KV][C] */
    size_t q_bias;     /* self_attn.{q,k,v}_proj.bias [Q], [KV], [KV] (qkv_bias), else ABSENT */
    size_t o_proj;     /* self_attn.o_proj.weight [C][Q] */
    size_t q_norm;     /* self_attn.q_norm.weight [hd], then k_norm [hd] (qk_norm), else ABSENT */
    size_t k_norm;
    size_t post_norm; /* post_attention_layernorm.weight [C] */
    size_t gate_proj; /* mlp.gate_proj.weight [I][C] */
    size_t up_proj;   /* mlp.up_proj.weight [I][C] */
    size_t down_proj; /* mlp.down_proj.weight [C][I] */
    size_t total;
};
void fy_llama_unit_layout(const struct fy_model_config *c, struct fy_llama_unit_layout *out);

#ifdef __cplusplus
}
#endif

#endif
