/* What follows from a model's config (common/model/model_config.h) and its family's tensor table,
 * the same for every family. The model is stored and streamed as "units": unit 0 holds the
 * embeddings, units 1..n_layer the blocks, unit n_layer+1 the final norm (and an untied head).
 * Each unit's parameters are one contiguous fp32 vector, its tensors one after another in the order
 * of the family's tensor table (common/model/arch/: one file per family, which says each tensor's
 * name, shape, decay and init); sizes, segments and initialisation below are derived from that
 * table. Matrices are [out][in] (y = x W^T + b). */
#ifndef FY_MODEL_H
#define FY_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/model/model_config.h"

#ifdef __cplusplus
extern "C" {
#endif

struct fy_config;

/* Checks ranges (heads divide the width, sizes positive and bounded), then the family's own
 * (struct fy_arch's validate); -EINVAL with a message. */
int fy_model_config_validate(const struct fy_model_config *c);
/* Reads model.* keys of a config: n_layer, n_head, n_embd, vocab, ctx; model.arch (a registry
 * name; gpt2 when absent) and the family's own keys (its conf_read); model.optim_state (fp32 when
 * absent); model.state_piece (bytes; 0, whole units, when absent). */
int fy_model_config_from(const struct fy_config *cfg, struct fy_model_config *out);
/* Writes the model.* keys (model.arch only for a family other than GPT-2, model.optim_state only
 * for a format other than fp32, model.state_piece only where units are cut in pieces). */
int fy_model_config_to(const struct fy_model_config *c, struct fy_config *cfg);
/* A stable 64-bit hash of the architecture, recorded in stores and exports to refuse mismatches.
 * The common fields, then the family's (its hash). */
uint64_t fy_model_config_hash(const struct fy_model_config *c);
/* "GPT: L layers, H heads, C wide, vocab V, context T, N M parameters": the family's words (struct
 * fy_arch's describe), then the parameter count */
void fy_model_config_describe(const struct fy_model_config *c, char *buf, size_t len);

/* Parameters (floats) of a unit: the sum of its tensors. */
size_t fy_model_unit_params(const struct fy_model_config *c, unsigned unit);
size_t fy_model_total_params(const struct fy_model_config *c);
/* The size of an attention head: n_embd / n_head unless the family says otherwise (struct fy_arch's
 * head_size: a Llama-like family's head_dim). */
uint32_t fy_model_head_size(const struct fy_model_config *c);
/* Model FLOPs per training token: 6 N + 6 L T A, A the attention's width (n_head x the head size);
 * recomputation not counted. */
double fy_model_flops_per_token(const struct fy_model_config *c, unsigned seq_len);

/* A contiguous range [begin, end) of a unit's parameters and whether weight decay applies to it
 * (the tensor table's decay: matrices and embeddings decay, biases and norm weights do not). */
struct fy_param_segment {
    size_t begin, end;
    int decay;
};
#define FY_MODEL_MAX_SEGMENTS 12
/* Fills the unit's segments in order (they cover the unit exactly, neighbours with the same flag
 * merged); returns how many. */
int fy_model_decay_segments(const struct fy_model_config *c, unsigned unit,
                            struct fy_param_segment out[FY_MODEL_MAX_SEGMENTS]);

/* Initialises one unit from a seed by each tensor's init rule (enum fy_init_rule). Each value
 * depends only on (seed, unit, index in the unit), so any unit can be initialised alone. */
void fy_model_init_unit(const struct fy_model_config *c, unsigned unit, uint64_t seed,
                        float *params);

#ifdef __cplusplus
}
#endif

#endif
