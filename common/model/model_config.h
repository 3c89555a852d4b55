/* A model's config as every family shares it: the common fields, the family (the registry's entry,
 * common/model/arch/arch.h), the family's own fields as a block only the family's files read, and
 * the store's optimizer state format and piece; the kinds of units. What is derived from the
 * family's tensor table (sizes, segments, the hash, model.conf) is common/model/model.h, above the
 * registry; this header is below it, so that the registry and the families build on it. */
#ifndef FY_MODEL_CONFIG_H
#define FY_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct fy_arch;

/* How a run's store keeps the Adam moments (init --optim-state; the layouts:
 * common/model/optstate.h). Master weights are f32 in every format. */
enum fy_optim_state {
    FY_OPTIM_STATE_FP32 = 0, /* f32 moments */
    FY_OPTIM_STATE_BF16 = 1, /* bf16 moments, rounded to nearest even */
    FY_OPTIM_STATE_INT8 = 2, /* block-wise 8-bit moments (opt_worker/quant8.h), f32 for small
                                tensors */
    FY_OPTIM_STATE_COUNT
};

/* init --state-piece: the default (a GPT-3 175B block's fp32 state, 20 GiB, in 21 pieces; every
 * unit of a 1.3B model but its fp32 embeddings one piece) and the least a piece may be limited to
 * (a section of each of the 4 KiB-aligned kinds). */
#define FY_MODEL_STATE_PIECE_DEFAULT (1ull << 30)
#define FY_MODEL_STATE_PIECE_MIN 16384

/* A family's own fields: laid out and read by its files alone (common/model/arch/), through the
 * accessor its header gives (fy_llama for the Llama-like families); all zero for a family that has
 * none (GPT-2). Copied and compared as bytes with the config. */
#define FY_FAMILY_FIELDS_BYTES 128
union fy_family_fields {
    unsigned char bytes[FY_FAMILY_FIELDS_BYTES];
    double align; /* the strictest alignment a family's fields need */
};

/* A model's config: the fields every family has, the family, and the family's own fields apart. A
 * config that names no family (arch NULL: the {L, H, C, V, T} initialisers, a model.conf without
 * model.arch) is GPT-2. */
struct fy_model_config {
    uint32_t n_layer;
    uint32_t n_head;
    uint32_t n_embd; /* C */
    uint32_t vocab;  /* V */
    uint32_t ctx; /* maximum sequence length (GPT-2: rows of wpe; Llama: max_position_embeddings) */
    const struct fy_arch *arch;
    union fy_family_fields family;
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

unsigned fy_model_unit_count(const struct fy_model_config *c);
enum fy_unit_kind fy_model_unit_kind(const struct fy_model_config *c, unsigned unit);

#ifdef __cplusplus
}
#endif

#endif
