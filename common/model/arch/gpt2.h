/* The GPT-2 family (Hugging Face GPT2LMHeadModel): its units' layout, for the registry
 * (common/model/arch/arch.h) and the backends' GPT-2 files. Units: 0 holds the embeddings (wte
 * [V][C], wpe [T][C]), 1..n_layer the transformer blocks, n_layer+1 the final LayerNorm; the LM
 * head is tied to wte. Matrices are [out][in] (y = x W^T + b). */
#ifndef FY_ARCH_GPT2_H
#define FY_ARCH_GPT2_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct fy_model_config;

/* Offsets in floats of each tensor inside a block unit (from the family's tensor table). */
struct fy_gpt2_block_layout {
    size_t ln1_w, ln1_b;   /* [C] */
    size_t qkv_w, qkv_b;   /* [3C][C], [3C] */
    size_t attn_w, attn_b; /* [C][C], [C] */
    size_t ln2_w, ln2_b;   /* [C] */
    size_t fc_w, fc_b;     /* [4C][C], [4C] */
    size_t proj_w, proj_b; /* [C][4C], [C] */
    size_t total;
};
void fy_gpt2_block_layout(const struct fy_model_config *c, struct fy_gpt2_block_layout *out);

#ifdef __cplusplus
}
#endif

#endif
