/* The Qwen3 family (Hugging Face's Qwen3ForCausalLM, the dense models): Llama with an RMSNorm over
 * each head's q and k (q_norm, k_norm: one weight of head_dim each) before RoPE, no biases, and an
 * explicit head_dim (128 in the released models, whatever hidden_size / num_attention_heads is).
 * Everything else is the Llama-like code of llama.c; the backends compute it with their Llama
 * files. */
#include <cJSON.h>
#include <errno.h>

#include "common/base/check.h"
#include "common/model/arch/llama.h"
#include "common/model/arch/llama_like.h"

static const struct fy_llama_defaults qwen3_defaults = {
    .n_layer = 32, .n_head = 32, .n_embd = 4096, .vocab = 151936, .ctx = 32768, .n_inter = 22016,
    .rms_eps = 1e-6, .rope_theta = 10000.0, .tied = 0};

static int qwen3_from_options(const struct fy_family_options *o, struct fy_model_config *c)
{
    fy_llama_mut(c)->qk_norm = 1;
    return fy_llama_like_from_options(o, c);
}

static int qwen3_conf_read(const struct fy_config *cfg, struct fy_model_config *c)
{
    fy_llama_mut(c)->qk_norm = 1;
    return fy_llama_like_conf_read(cfg, c);
}

/* Qwen3Config: head_dim 128 when absent; attention_bias (q, k, v and o biases) is not computed. */
static int qwen3_hf_config_read(const char *path, const cJSON *root, struct fy_model_config *m)
{
    *m = (struct fy_model_config){
        .arch = &fy_arch_qwen3, .family = fy_llama_family((struct fy_llama_fields){.qk_norm = 1})};
    FY_TRY(fy_json_bool(path, root, "attention_bias", 0, 0, "q/k/v/o projections have no bias"));
    FY_TRY(fy_llama_like_hf_read(path, root, &qwen3_defaults, m));
    if (cJSON_GetObjectItemCaseSensitive(root, "head_dim") == NULL)
        fy_llama_mut(m)->head_dim = 128 == m->n_embd / m->n_head ? 0 : 128;
    FY_TRY(fy_llama_like_hf_window(path, root, 1, m));
    return 0;
}

static char *qwen3_hf_config_write(const struct fy_model_config *m, const char *torch_dtype)
{
    return fy_llama_like_hf_write(m, torch_dtype, "qwen3", "Qwen3ForCausalLM",
                                  "  \"attention_bias\": false,\n  \"use_sliding_window\": false,\n");
}

static const char *const qwen3_hf_architectures[] = {"Qwen3ForCausalLM", NULL};

const struct fy_arch fy_arch_qwen3 = {
    .id = 3,
    .name = "qwen3",
    .label = "Qwen3",
    .hf_model_type = "qwen3",
    .hf_architectures = qwen3_hf_architectures,
    .hf_prefix = "",
    .swaps_internals = 0,
    .validate = fy_llama_like_validate,
    .from_options = qwen3_from_options,
    .conf_read = qwen3_conf_read,
    .conf_write = fy_llama_like_conf_write,
    .hf_config_read = qwen3_hf_config_read,
    .hf_config_write = qwen3_hf_config_write,
    .hf_is_buffer = fy_llama_like_hf_is_buffer,
    .head_tied = fy_llama_like_head_tied,
    .slots_write = fy_llama_like_slots_write,
    .slots_read = fy_llama_like_slots_read,
    .hash = fy_llama_like_hash,
    .describe = fy_llama_like_describe,
    .head_size = fy_llama_head_dim,
    .unit_table = fy_llama_like_unit_table,
};
