/* The Qwen2 family (Qwen2 and Qwen2.5: Hugging Face's Qwen2ForCausalLM): Llama with biases on the
 * q, k and v projections (o_proj has none), rope theta 1e6 in the released models, tied heads in
 * the small sizes. Everything else is the Llama-like code of llama.c; the backends compute it with
 * their Llama files. */
#include <cJSON.h>
#include <errno.h>

#include "common/base/check.h"
#include "common/model/arch/llama.h"
#include "common/model/arch/llama_like.h"

static const struct fy_llama_defaults qwen2_defaults = {
    .n_layer = 32, .n_head = 32, .n_embd = 4096, .vocab = 151936, .ctx = 32768, .n_inter = 22016,
    .rms_eps = 1e-6, .rope_theta = 10000.0, .tied = 0};

static int qwen2_from_options(const struct fy_family_options *o, struct fy_model_config *c)
{
    fy_llama_mut(c)->qkv_bias = 1;
    return fy_llama_like_from_options(o, c);
}

static int qwen2_conf_read(const struct fy_config *cfg, struct fy_model_config *c)
{
    fy_llama_mut(c)->qkv_bias = 1;
    return fy_llama_like_conf_read(cfg, c);
}

/* Qwen2Config; its sliding window applies only with use_sliding_window true (refused). */
static int qwen2_hf_config_read(const char *path, const cJSON *root, struct fy_model_config *m)
{
    *m = (struct fy_model_config){
        .arch = &fy_arch_qwen2, .family = fy_llama_family((struct fy_llama_fields){.qkv_bias = 1})};
    FY_TRY(fy_llama_like_hf_read(path, root, &qwen2_defaults, m));
    FY_TRY(fy_llama_like_hf_window(path, root, 1, m));
    return 0;
}

static char *qwen2_hf_config_write(const struct fy_model_config *m, const char *torch_dtype)
{
    return fy_llama_like_hf_write(m, torch_dtype, "qwen2", "Qwen2ForCausalLM",
                                  "  \"use_sliding_window\": false,\n");
}

static const char *const qwen2_hf_architectures[] = {"Qwen2ForCausalLM", NULL};

const struct fy_arch fy_arch_qwen2 = {
    .id = 2,
    .name = "qwen2",
    .label = "Qwen2",
    .hf_model_type = "qwen2",
    .hf_architectures = qwen2_hf_architectures,
    .hf_prefix = "",
    .swaps_internals = 0,
    .validate = fy_llama_like_validate,
    .from_options = qwen2_from_options,
    .conf_read = qwen2_conf_read,
    .conf_write = fy_llama_like_conf_write,
    .hf_config_read = qwen2_hf_config_read,
    .hf_config_write = qwen2_hf_config_write,
    .hf_is_buffer = fy_llama_like_hf_is_buffer,
    .head_tied = fy_llama_like_head_tied,
    .slots_write = fy_llama_like_slots_write,
    .slots_read = fy_llama_like_slots_read,
    .hash = fy_llama_like_hash,
    .describe = fy_llama_like_describe,
    .head_size = fy_llama_head_dim,
    .unit_table = fy_llama_like_unit_table,
};
