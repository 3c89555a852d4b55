/* The Phi-3 family (Hugging Face's Phi3ForCausalLM, the 4k-context models): Llama-like, with q, k
 * and v stored as one qkv_proj and gate and up as one gate_up_proj. The Llama-like block keeps q,
 * k, v (and gate, up) adjacent in that order, so each fused tensor is one entry of the table at the
 * offset of its first part: nothing is split or copied, and an export writes the same bytes back.
 * The long-context variants' rope_scaling (longrope, su, yarn) and a partial rotary factor are not
 * computed and are refused. The backends compute it with their Llama files. */
#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/base/check.h"
#include "common/model/arch/llama.h"
#include "common/model/arch/llama_like.h"

static const struct fy_llama_defaults phi3_defaults = {
    .n_layer = 32, .n_head = 32, .n_embd = 3072, .vocab = 32064, .ctx = 4096, .n_inter = 8192,
    .rms_eps = 1e-5, .rope_theta = 10000.0, .tied = 0};

static unsigned phi3_unit_table(const struct fy_model_config *c, enum fy_unit_kind kind,
                                struct fy_tensor_spec *t)
{
    if (kind != FY_UNIT_BLOCK)
        return fy_llama_like_unit_table(c, kind, t);
    const uint64_t C = c->n_embd, hd = fy_llama_head_dim(c), I = fy_llama(c)->n_inter;
    const uint64_t QKV = (c->n_head + 2ull * fy_llama(c)->n_kv_head) * hd, Q = c->n_head * hd;
    const struct fy_tensor_spec block[] = {
        {"model.layers.%u.input_layernorm.weight", 1, {C}, 0, 0, FY_INIT_ONE, 0},
        {"model.layers.%u.self_attn.qkv_proj.weight", 2, {QKV, C}, 0, 1, FY_INIT_NORMAL, 0},
        {"model.layers.%u.self_attn.o_proj.weight", 2, {C, Q}, 0, 1, FY_INIT_NORMAL, 0},
        {"model.layers.%u.post_attention_layernorm.weight", 1, {C}, 0, 0, FY_INIT_ONE, 0},
        {"model.layers.%u.mlp.gate_up_proj.weight", 2, {2 * I, C}, 0, 1, FY_INIT_NORMAL, 0},
        {"model.layers.%u.mlp.down_proj.weight", 2, {C, I}, 0, 1, FY_INIT_NORMAL, 0},
    };
    memcpy(t, block, sizeof block);
    return sizeof block / sizeof block[0];
}

/* q, k, v and gate, up have no biases or norms of their own here. */
static int phi3_validate(const struct fy_model_config *c)
{
    FY_REQUIRE(!fy_llama(c)->qkv_bias && !fy_llama(c)->qk_norm, -EINVAL,
               "model: a Phi-3 model has no q/k/v biases or q/k norms");
    return fy_llama_like_validate(c);
}

/* Phi3Config: rope_scaling must be null (the 128k models' longrope is not computed), the whole
 * head rotated. */
static int phi3_hf_config_read(const char *path, const cJSON *root, struct fy_model_config *m)
{
    *m = (struct fy_model_config){.arch = &fy_arch_phi3};
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (rs != NULL && !cJSON_IsNull(rs)) {
        const cJSON *t = cJSON_IsObject(rs) ? cJSON_GetObjectItemCaseSensitive(rs, "type") : NULL;
        if (t == NULL && cJSON_IsObject(rs))
            t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
        fy_error("%s: \"rope_scaling\": type \"%s\" is not supported (Phi-3's 4k-context models, "
                 "with rope_scaling null, are)", path,
                 cJSON_IsString(t) ? t->valuestring : "(none)");
        return -EINVAL;
    }
    const cJSON *prf = cJSON_GetObjectItemCaseSensitive(root, "partial_rotary_factor");
    FY_REQUIRE(prf == NULL || cJSON_IsNull(prf) || (cJSON_IsNumber(prf) && prf->valuedouble == 1.0),
               -EINVAL, "%s: \"partial_rotary_factor\": only 1.0 (the whole head rotated) is "
               "supported", path);
    FY_TRY(fy_json_bool(path, root, "attention_bias", 0, 0, "qkv_proj and o_proj have no bias"));
    FY_TRY(fy_llama_like_hf_read(path, root, &phi3_defaults, m));
    FY_TRY(fy_llama_like_hf_window(path, root, 0, m));
    return 0;
}

static char *phi3_hf_config_write(const struct fy_model_config *m, const char *torch_dtype)
{
    char extra[160];
    snprintf(extra, sizeof extra,
             "  \"original_max_position_embeddings\": %u,\n  \"partial_rotary_factor\": 1.0,\n"
             "  \"attention_bias\": false,\n%s",
             m->ctx, fy_llama(m)->sliding_window ? "" : "  \"sliding_window\": null,\n");
    return fy_llama_like_hf_write(m, torch_dtype, "phi3", "Phi3ForCausalLM", extra);
}

static const char *const phi3_hf_architectures[] = {"Phi3ForCausalLM", NULL};

const struct fy_arch fy_arch_phi3 = {
    .id = 5,
    .name = "phi3",
    .label = "Phi-3",
    .hf_model_type = "phi3",
    .hf_architectures = phi3_hf_architectures,
    .hf_prefix = "",
    .swaps_internals = 0,
    .validate = phi3_validate,
    .from_options = fy_llama_like_from_options,
    .conf_read = fy_llama_like_conf_read,
    .conf_write = fy_llama_like_conf_write,
    .hf_config_read = phi3_hf_config_read,
    .hf_config_write = phi3_hf_config_write,
    .hf_is_buffer = fy_llama_like_hf_is_buffer,
    .head_tied = fy_llama_like_head_tied,
    .slots_write = fy_llama_like_slots_write,
    .slots_read = fy_llama_like_slots_read,
    .hash = fy_llama_like_hash,
    .describe = fy_llama_like_describe,
    .head_size = fy_llama_head_dim,
    .unit_table = phi3_unit_table,
};
