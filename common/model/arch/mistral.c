/* The Mistral family (Hugging Face's MistralForCausalLM): Llama-like, with a sliding attention
 * window (each position attends to itself and the window - 1 before it; sliding_window null, or not
 * smaller than the sequence, is plain causal attention) and, in some models (Mistral Nemo), a
 * head_dim other than hidden_size / num_attention_heads. Everything else is the Llama-like code of
 * llama.c; the backends compute it with their Llama files. */
#include <cJSON.h>
#include <errno.h>

#include "common/base/check.h"
#include "common/model/arch/llama.h"
#include "common/model/arch/llama_like.h"

static const struct fy_llama_defaults mistral_defaults = {
    .n_layer = 32, .n_head = 32, .n_embd = 4096, .vocab = 32000, .ctx = 131072, .n_inter = 14336,
    .rms_eps = 1e-6, .rope_theta = 10000.0, .tied = 0};

/* MistralConfig: sliding_window 4096 when absent, null for none. */
static int mistral_hf_config_read(const char *path, const cJSON *root, struct fy_model_config *m)
{
    *m = (struct fy_model_config){.arch = &fy_arch_mistral};
    FY_TRY(fy_llama_like_hf_read(path, root, &mistral_defaults, m));
    FY_TRY(fy_llama_like_hf_window(path, root, 0, m));
    if (cJSON_GetObjectItemCaseSensitive(root, "sliding_window") == NULL)
        fy_llama_mut(m)->sliding_window = 4096;
    return 0;
}

static char *mistral_hf_config_write(const struct fy_model_config *m, const char *torch_dtype)
{
    /* the writer puts sliding_window where there is one; null says there is none */
    return fy_llama_like_hf_write(m, torch_dtype, "mistral", "MistralForCausalLM",
                                  fy_llama(m)->sliding_window ? ""
                                                              : "  \"sliding_window\": null,\n");
}

static const char *const mistral_hf_architectures[] = {"MistralForCausalLM", NULL};

const struct fy_arch fy_arch_mistral = {
    .id = 4,
    .name = "mistral",
    .label = "Mistral",
    .hf_model_type = "mistral",
    .hf_architectures = mistral_hf_architectures,
    .hf_prefix = "",
    .swaps_internals = 0,
    .validate = fy_llama_like_validate,
    .from_options = fy_llama_like_from_options,
    .conf_read = fy_llama_like_conf_read,
    .conf_write = fy_llama_like_conf_write,
    .hf_config_read = mistral_hf_config_read,
    .hf_config_write = mistral_hf_config_write,
    .hf_is_buffer = fy_llama_like_hf_is_buffer,
    .head_tied = fy_llama_like_head_tied,
    .slots_write = fy_llama_like_slots_write,
    .slots_read = fy_llama_like_slots_read,
    .hash = fy_llama_like_hash,
    .describe = fy_llama_like_describe,
    .head_size = fy_llama_head_dim,
    .unit_table = fy_llama_like_unit_table,
};
