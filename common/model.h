/* Model configuration and parameter layout, for the GPT-2 and Llama architectures. The model is
 * stored and streamed as "units". GPT-2: unit 0 holds the embeddings (wte, wpe), units 1..n_layer
 * the transformer blocks, unit n_layer+1 the final LayerNorm; the LM head is tied to wte. Llama:
 * unit 0 holds embed_tokens [V][C] (no positions), units 1..n_layer the decoder blocks (the layout
 * of gpu_worker/cpu/llama_cpu.h: fy_llama_block_layout), unit n_layer+1 the final RMSNorm weight
 * [C], followed, when the head is untied, by lm_head [V][C]. Each unit's parameters are one
 * contiguous fp32 vector in the order given here. Matrices are [out][in] (y = x W^T + b). */
#ifndef FY_MODEL_H
#define FY_MODEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct fy_config;

enum fy_arch { FY_ARCH_GPT2 = 0, FY_ARCH_LLAMA = 1 };
enum fy_rope { FY_ROPE_DEFAULT = 0, FY_ROPE_LLAMA3 = 1 };

/* The first five fields describe both architectures; a GPT-2 config leaves the rest zero (so
 * {L, H, C, V, T} initialisers are GPT-2 configs). */
struct fy_gpt_config {
    uint32_t n_layer;
    uint32_t n_head;
    uint32_t n_embd; /* C */
    uint32_t vocab;  /* V */
    uint32_t ctx;    /* maximum sequence length (rows of wpe; Llama: max_position_embeddings) */
    uint32_t arch;   /* enum fy_arch */
    /* Llama only (Hugging Face LlamaConfig names in the comments) */
    uint32_t n_kv_head;         /* num_key_value_heads */
    uint32_t n_inter;           /* intermediate_size */
    uint32_t tied;              /* tie_word_embeddings: 1 = no lm_head, embed_tokens serves */
    uint32_t rope_type;         /* enum fy_rope: rope_scaling absent, or rope_type "llama3" */
    uint32_t rope_orig_max_pos; /* llama3: original_max_position_embeddings */
    float rms_eps;              /* rms_norm_eps */
    double rope_theta;          /* rope_theta */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor; /* llama3 */
};

/* Offsets (in floats) of each tensor inside a block unit, and its total size. */
struct fy_gpt_block_layout {
    size_t ln1_w, ln1_b;   /* [C] */
    size_t qkv_w, qkv_b;   /* [3C][C], [3C] */
    size_t attn_w, attn_b; /* [C][C], [C] */
    size_t ln2_w, ln2_b;   /* [C] */
    size_t fc_w, fc_b;     /* [4C][C], [4C] */
    size_t proj_w, proj_b; /* [C][4C], [C] */
    size_t total;
};

enum fy_unit_kind { FY_UNIT_EMBED = 0, FY_UNIT_BLOCK = 1, FY_UNIT_FINAL = 2 };

/* Checks ranges (heads divide the width, sizes positive and bounded; Llama: kv heads divide heads,
 * even head size, eps, theta and scaling); -EINVAL with a message. */
int fy_gpt_config_validate(const struct fy_gpt_config *c);
/* Reads model.* keys (n_layer, n_head, n_embd, vocab, ctx; model.arch gpt2 (the default when
 * absent) or llama, and for llama n_kv_head, n_inter, tied, rms_eps, rope_theta, rope_type
 * default|llama3 and, for llama3, rope_factor, rope_low_freq_factor, rope_high_freq_factor,
 * rope_original_max_pos) of a config. */
int fy_gpt_config_from(const struct fy_config *cfg, struct fy_gpt_config *out);
/* Writes the model.* keys. */
int fy_gpt_config_to(const struct fy_gpt_config *c, struct fy_config *cfg);
/* A stable 64-bit hash of the architecture, recorded in stores and exports to refuse mismatches.
 * GPT-2 hashes as it always has; a Llama hash covers every Llama field. */
uint64_t fy_gpt_config_hash(const struct fy_gpt_config *c);
/* "L layers, H heads, C wide, V vocab, T context, N parameters" */
void fy_gpt_config_describe(const struct fy_gpt_config *c, char *buf, size_t len);

void fy_gpt_block_layout(const struct fy_gpt_config *c, struct fy_gpt_block_layout *out);
unsigned fy_gpt_unit_count(const struct fy_gpt_config *c);
enum fy_unit_kind fy_gpt_unit_kind(const struct fy_gpt_config *c, unsigned unit);
/* Parameters (floats) of a unit. GPT-2: embeddings V*C + T*C; block layout.total; final 2*C.
 * Llama: V*C; the Llama block's total; C, plus V*C when untied. */
size_t fy_gpt_unit_params(const struct fy_gpt_config *c, unsigned unit);
size_t fy_gpt_total_params(const struct fy_gpt_config *c);
/* Model FLOPs per training token: 6 N + 6 L T C (recomputation not counted). */
double fy_gpt_flops_per_token(const struct fy_gpt_config *c, unsigned seq_len);

/* A contiguous range [begin, end) of a unit's parameters and whether weight decay applies to it:
 * matrices and embeddings decay, biases and LayerNorm parameters do not (GPT-2 practice). */
struct fy_param_segment {
    size_t begin, end;
    int decay;
};
#define FY_GPT_MAX_SEGMENTS 12
/* Llama: matrices and embeddings decay, RMSNorm weights do not. */
/* Fills the unit's segments in order (they cover the unit exactly); returns how many. */
int fy_gpt_decay_segments(const struct fy_gpt_config *c, unsigned unit,
                          struct fy_param_segment out[FY_GPT_MAX_SEGMENTS]);

/* GPT-2 initialisation of one unit from a seed: weights N(0, 0.02), the two residual projections
 * (attn_w, proj_w) N(0, 0.02/sqrt(2*n_layer)), biases 0, LayerNorm weight 1 and bias 0. Each value
 * depends only on (seed, unit, index), so any unit can be initialised alone. */
/* Llama (transformers' LlamaPreTrainedModel): every matrix and the embeddings N(0, 0.02), RMSNorm
 * weights 1. */
void fy_gpt_init_unit(const struct fy_gpt_config *c, unsigned unit, uint64_t seed, float *params);

/* The Llama block layout (the same as fy_llama_block_layout of gpu_worker/cpu/llama_cpu.h, which
 * the tests check): offsets in floats inside a Llama block unit. */
struct fy_llama_unit_layout {
    size_t input_norm, q_proj, k_proj, v_proj, o_proj, post_norm, gate_proj, up_proj, down_proj;
    size_t total;
};
void fy_llama_unit_layout(const struct fy_gpt_config *c, struct fy_llama_unit_layout *out);
/* "gpt2" or "llama" */
const char *fy_arch_name(uint32_t arch);

#ifdef __cplusplus
}
#endif

#endif
