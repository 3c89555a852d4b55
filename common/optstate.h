/* The optimizer state of a model unit, described once: its sections (name, element type, where
 * each lies), from which everything that holds or moves state takes its sizes: the store's state
 * extents (common/ckpt.h), the pool's state slots and kept state, the AdamW requests, and the
 * planner's byte counts and predictions (launcher/train.h, launcher/actrun.h).
 *
 * A unit's state is [master | adam m | adam v]: the master weights and Adam's two moments, each
 * f32, one element a parameter, each section starting on a 4096-byte boundary. The store keeps it
 * as one extent per copy (FY_TENSOR_UNIT_STATE_COPY), the pool in the same order. A unit kept in
 * the pool may have, beside its state, a bf16 copy of its weights that AdamW rewrites with the
 * master (--weights-dtype bf16); that copy is never in the store. */
#ifndef FY_OPTSTATE_H
#define FY_OPTSTATE_H

#include <stdint.h>

#include "desc.h"
#include "dtype.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The sections, in the order they lie in a unit's state. */
enum fy_optstate_part { FY_OPTSTATE_MASTER = 0, FY_OPTSTATE_ADAM_M, FY_OPTSTATE_ADAM_V,
                        FY_OPTSTATE_PARTS };

struct fy_optstate_section {
    const char *name; /* "master", "adam_m", "adam_v" */
    int kind;         /* the descriptor kind an AdamW request names it by (common/desc.h) */
    int dtype;        /* enum fy_dtype (common/dtype.h) */
    uint64_t offset;  /* bytes from the start of the unit's state; a multiple of 4096 */
    uint64_t bytes;   /* its elements' bytes, unpadded */
    uint64_t padded;  /* the same to 4096: what a transfer of the section alone moves */
};

struct fy_optstate_layout {
    uint64_t params;
    unsigned count; /* sections, FY_OPTSTATE_PARTS */
    struct fy_optstate_section section[FY_OPTSTATE_PARTS];
    uint64_t bytes; /* the whole state: a state extent in the store, its room in the pool */
};

/* The layout of the state of `params` parameters (a model unit's, or the self-test's tensor). */
void fy_optstate_layout_params(uint64_t params, struct fy_optstate_layout *out);
/* The layout of unit `unit`'s state. */
void fy_optstate_layout(const struct fy_model_config *c, unsigned unit,
                        struct fy_optstate_layout *out);

/* The parts of an opt-adamw request (common/desc.h) that name a state laid out as `l` at pool
 * offset `state`: one per section, in order, of its kind and dtype, for unit `layer` (-1: no
 * model unit); into out[0..count). Returns l->count. */
unsigned fy_optstate_parts(const struct fy_optstate_layout *l, uint64_t state, int layer,
                           struct fy_desc *out);

/* Unit `unit`'s whole state (its layout's bytes). */
uint64_t fy_optstate_bytes(const struct fy_model_config *c, unsigned unit);
/* The largest unit's whole state: the room that holds any unit's. */
uint64_t fy_optstate_max_bytes(const struct fy_model_config *c);
/* Unit `unit`'s master section, padded: what a read of its weights alone moves. */
uint64_t fy_optstate_master_bytes(const struct fy_model_config *c, unsigned unit);
/* The largest unit's master section, padded. */
uint64_t fy_optstate_max_master_bytes(const struct fy_model_config *c);
/* Bytes a parameter of the state, every section's element added (12). */
unsigned fy_optstate_param_bytes(void);
/* Bytes a parameter that an update moves through host memory: the gradient read in grad_dtype,
 * every section read and written (f32 gradients: 28). */
unsigned fy_optstate_update_param_bytes(int grad_dtype);

/* The bf16 weights copy of a unit kept in the pool: its element type and padded bytes. */
#define FY_OPTSTATE_COPY_DTYPE FY_DTYPE_BF16
uint64_t fy_optstate_copy_bytes(const struct fy_model_config *c, unsigned unit);

#ifdef __cplusplus
}
#endif

#endif
