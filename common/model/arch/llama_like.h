/* What the Llama-like families' files (common/model/arch/llama.c, qwen2.c, qwen3.c, mistral.c,
 * phi3.c) share: their config.json keys, model.conf keys, tensor table, validation, hash and binary
 * slots, implemented once in llama.c. Only those files include it. */
#ifndef FY_ARCH_LLAMA_LIKE_H
#define FY_ARCH_LLAMA_LIKE_H

#include "common/model/arch/arch.h"
#include "common/model/arch/json.h"

struct cJSON;

/* transformers' defaults for keys a config.json leaves out, per family. */
struct fy_llama_defaults {
    uint32_t n_layer, n_head, n_embd, vocab, ctx, n_inter;
    double rms_eps, rope_theta;
    int tied;
};
/* config.json of a Llama-like family: the shared keys with the family's defaults (heads, sizes,
 * head_dim, SwiGLU with silu, no MLP bias, tied or not, rms_norm_eps, RoPE plain or llama3 as
 * rope_parameters or rope_theta/rope_scaling); m->arch and the family flags (qkv_bias, qk_norm)
 * set by the caller first. Refuses, naming the file and the key, what is not computed. */
int fy_llama_like_hf_read(const char *path, const struct cJSON *root,
                          const struct fy_llama_defaults *d, struct fy_model_config *m);
/* The family's config.json: the shared keys then `extra` (lines of  "key": value, each ending
 * with ",\n"), for model_type and architecture. Malloc'd. */
char *fy_llama_like_hf_write(const struct fy_model_config *m, const char *torch_dtype,
                             const char *model_type, const char *architecture, const char *extra);
/* sliding_window: absent or null (0), or a positive window; use_sliding_window false where the
 * family has that switch (Qwen2, Qwen3: their windows apply only when it is true: refused). */
int fy_llama_like_hf_window(const char *path, const struct cJSON *root, int has_switch,
                            struct fy_model_config *m);
/* model.conf's keys, the unit table (Hugging Face's names, unfused), validation, the hash, the
 * binary slots, init's options, descriptions: shared by the Llama-like families. */
/* init's options (--kv-heads, --ffn, --tied, --rms-eps, --rope-theta); the family's flags, set
 * before, are kept. */
int fy_llama_like_from_options(const struct fy_family_options *o, struct fy_model_config *c);
int fy_llama_like_conf_read(const struct fy_config *cfg, struct fy_model_config *c);
int fy_llama_like_conf_write(const struct fy_model_config *c, struct fy_config *cfg);
unsigned fy_llama_like_unit_table(const struct fy_model_config *c, enum fy_unit_kind kind,
                                  struct fy_tensor_spec *t);
int fy_llama_like_validate(const struct fy_model_config *c);
uint64_t fy_llama_like_hash(const struct fy_model_config *c, uint64_t h);
void fy_llama_like_slots_write(const struct fy_model_config *c, uint32_t *slots);
void fy_llama_like_slots_read(const uint32_t *slots, struct fy_model_config *c);
void fy_llama_like_describe(const struct fy_model_config *c, char *buf, size_t len);
int fy_llama_like_head_tied(const struct fy_model_config *c);
int fy_llama_like_hf_is_buffer(const struct fy_model_config *c, const char *name);

#endif
