/* A model's configuration and what is common to every family. The model is stored and streamed as
 * "units": unit 0 holds the embeddings, units 1..n_layer the blocks, unit n_layer+1 the final norm
 * (and an untied head). Each unit's parameters are one contiguous fp32 vector, its tensors one
 * after another in the order of the family's tensor table (common/model/arch/: one file per family,
 * which says each tensor's name, shape, decay and init); sizes, segments and initialisation below
 * are derived from that table. Matrices are [out][in] (y = x W^T + b). */
#ifndef FY_MODEL_H
#define FY_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/model/arch/llama.h" /* struct fy_llama_fields */

#ifdef __cplusplus
extern "C" {
#endif

struct fy_config;
struct fy_arch;

/* A model's config: the fields every family has, the family (common/model/arch/arch.h), and the
 * family's own fields apart. A config that names no family (arch NULL: the {L, H, C, V, T}
 * initialisers, a model.conf without model.arch) is GPT-2. */
/* How a run's store keeps the Adam moments (init --optim-state; the layouts:
 * common/model/optstate.h). Master weights are f32 in every format. */
enum fy_optim_state {
    FY_OPTIM_STATE_FP32 = 0, /* f32 moments */
    FY_OPTIM_STATE_BF16 = 1, /* bf16 moments, rounded to nearest even */
    FY_OPTIM_STATE_INT8 = 2, /* block-wise 8-bit moments (opt_worker/quant8.h), f32 for small tensors */
    FY_OPTIM_STATE_COUNT
};

/* init --state-piece: the default (a GPT-3 175B block's fp32 state, 20 GiB, in 21 pieces; every
 * unit of a 1.3B model but its fp32 embeddings one piece) and the least a piece may be limited to
 * (a section of each of the 4 KiB-aligned kinds). */
#define FY_MODEL_STATE_PIECE_DEFAULT (1ull << 30)
#define FY_MODEL_STATE_PIECE_MIN 16384

struct fy_model_config {
    uint32_t n_layer;
    uint32_t n_head;
    uint32_t n_embd; /* C */
    uint32_t vocab;  /* V */
    uint32_t ctx;    /* maximum sequence length (GPT-2: rows of wpe; Llama: max_position_embeddings) */
    const struct fy_arch *arch;
    struct fy_llama_fields llama; /* the Llama family's fields; zero for GPT-2 */
    /* enum fy_optim_state (0: fp32). Not the architecture's: outside the config hash, and kept in
     * a slot of its own in commit records (common/formats/ckpt.h); model.conf's
     * model.optim_state. */
    int optim_state;
    /* The most bytes of optimizer state one piece of a unit holds (init --state-piece; the cut:
     * common/model/optstate.h), 0: every unit one piece (stores made before pieces). A property of
     * the store like optim_state: outside the config hash, in a slot of its own in commit records,
     * model.conf's model.state_piece. */
    uint64_t state_piece;
};

/* "fp32", "bf16", "int8" (or "unknown"). */
const char *fy_optim_state_name(int format);
/* A name of fy_optim_state_name into *out; -EINVAL (nothing logged) when it is none. */
int fy_optim_state_parse(const char *name, int *out);

enum fy_unit_kind { FY_UNIT_EMBED = 0, FY_UNIT_BLOCK = 1, FY_UNIT_FINAL = 2 };

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
/* "GPT: L layers, H heads, C wide, vocab V, context T, N M parameters", as the family says it */
void fy_model_config_describe(const struct fy_model_config *c, char *buf, size_t len);

unsigned fy_model_unit_count(const struct fy_model_config *c);
enum fy_unit_kind fy_model_unit_kind(const struct fy_model_config *c, unsigned unit);
/* Parameters (floats) of a unit: the sum of its tensors. */
size_t fy_model_unit_params(const struct fy_model_config *c, unsigned unit);
size_t fy_model_total_params(const struct fy_model_config *c);
/* Model FLOPs per training token: 6 N + 6 L T A, A the attention's width (n_head x the head size:
 * n_embd unless a family's head_dim differs); recomputation not counted. */
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
void fy_model_init_unit(const struct fy_model_config *c, unsigned unit, uint64_t seed, float *params);

/* The config's family: c->arch, or GPT-2 where it names none. */
const struct fy_arch *fy_model_arch(const struct fy_model_config *c);

#ifdef __cplusplus
}
#endif

#endif
