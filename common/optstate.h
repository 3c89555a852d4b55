/* The optimizer state of a model unit, described once: its sections (name, element type, where
 * each lies), from which everything that holds or moves state takes its sizes: the store's state
 * extents (common/ckpt.h), the pool's state slots and kept state, the AdamW requests, and the
 * planner's byte counts and predictions (launcher/step/train.h, launcher/plan/actplace.h).
 *
 * A unit's state depends on the run's optimizer state format (struct fy_model_config's
 * optim_state, init --optim-state); each section starts on a 4096-byte boundary:
 *   fp32  [master f32 | adam_m f32 | adam_v f32]                  12 bytes a parameter
 *   bf16  [master f32 | adam_m bf16 | adam_v bf16]                 8 bytes a parameter
 *   int8  [master f32 | adam_m u8 | adam_v u8 | adam_absmax f32 | adam_small f32]
 *                                                         about 6.03 bytes a parameter
 * In int8 the moments of each tensor of FY_OPTSTATE_INT8_MIN values or more are block-wise 8-bit
 * (opt_worker/quant8.h): its codes (m with the signed map, v with the unsigned one) lie in adam_m
 * and adam_v, tensor after tensor in the unit's order, and one f32 absmax per block of
 * FY_OPTSTATE_INT8_BLOCK values (counted from the tensor's first value) in adam_absmax, first every
 * block of m, then every block of v. The moments of the smaller tensors (norm weights, biases)
 * stay f32, in adam_small: every such tensor's m in the unit's order, then their v.
 * The store keeps the state as one extent per copy (FY_TENSOR_UNIT_STATE_COPY), the pool in the
 * same order. A unit kept in the pool may have, beside its state, a bf16 copy of its weights that
 * AdamW rewrites with the master (--weights-dtype bf16); that copy is never in the store.
 *
 * Pieces. A store may cut a unit's state into pieces of at most its state_piece bytes (struct
 * fy_model_config; init --state-piece): contiguous ranges of the unit's parameters, each with a
 * state of its own in the layout above (a mini-state [master | m | v (| absmax | small)] of its
 * range, sections 4 KiB aligned), the unit's extent its pieces one after another. A unit whose
 * whole state fits state_piece (or state_piece 0: every store made before pieces) is one piece,
 * byte for byte the layout above. Cuts fall between tensors, or inside a tensor at multiples of
 * lcm(4096, n_embd) values from its first value, so no int8 block of 256 and no row of the
 * embeddings is split; a tensor under that keeps its moments as its whole size says (int8: a
 * part of a large tensor stays quantized, by blocks from the tensor's first value), so an update
 * piece by piece gives the bits of the whole unit's. The cut is a function of the config alone.
 * A piece exceeds state_piece only where no cut allows less (a small tensor whole, one step of a
 * large one). The unit's digest in a commit record: its one piece's, or of several the digest of
 * their digests (fy_optstate_unit_digest). */
#ifndef FY_OPTSTATE_H
#define FY_OPTSTATE_H

#include <stdint.h>

#include "desc.h"
#include "dtype.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The sections, in the order they lie in a unit's state (fp32 and bf16 have the first three). */
enum fy_optstate_part { FY_OPTSTATE_MASTER = 0, FY_OPTSTATE_ADAM_M, FY_OPTSTATE_ADAM_V,
                        FY_OPTSTATE_ABSMAX, FY_OPTSTATE_SMALL, FY_OPTSTATE_PARTS };

/* int8: values per quantization block, the smallest tensor quantized, and the codes of zero (what
 * a new state's moments hold: m's code in the signed map, v's in the unsigned one, with absmax 0).
 * opt_worker/quant8.h's format; tests/test_optstate.c checks they agree. */
#define FY_OPTSTATE_INT8_BLOCK 256
#define FY_OPTSTATE_INT8_MIN 4096
#define FY_OPTSTATE_INT8_ZERO_M 127
#define FY_OPTSTATE_INT8_ZERO_V 0

struct fy_optstate_section {
    const char *name; /* "master", "adam_m", "adam_v", "adam_absmax", "adam_small" */
    int kind;         /* the descriptor kind an AdamW request names it by (common/desc.h) */
    int dtype;        /* enum fy_dtype (common/dtype.h) */
    uint64_t offset;  /* bytes from the start of the unit's state; a multiple of 4096 */
    uint64_t bytes;   /* its elements' bytes, unpadded */
    uint64_t padded;  /* the same to 4096: what a transfer of the section alone moves */
};

struct fy_optstate_layout {
    int format;      /* enum fy_optim_state */
    uint64_t params;
    /* int8: values whose moments are quantized, their blocks, and values with f32 moments (fp32
     * and bf16: params, 0, 0) */
    uint64_t quantized, blocks, small;
    unsigned count; /* sections: 3, or 5 in int8 */
    struct fy_optstate_section section[FY_OPTSTATE_PARTS];
    uint64_t bytes; /* the whole state: a state extent in the store, its room in the pool */
};

/* Where one tensor's moments lie in a unit's state. */
struct fy_optstate_tensor {
    uint64_t begin, count; /* its parameters: [begin, begin + count) of the unit */
    int decay;             /* AdamW's weight decay applies */
    int quantized;         /* int8 only: codes and absmax; otherwise moments in elements */
    /* quantized: its first code in adam_m and adam_v, and its first block; int8 and not
     * quantized: its first element in each half of adam_small; fp32 and bf16: begin, 0 */
    uint64_t at, block;
};

/* The layout of the state of `params` parameters taken as one tensor (the self-test's and the
 * profile's tensor) in format `format`. */
void fy_optstate_layout_params(uint64_t params, int format, struct fy_optstate_layout *out);
/* The layout of unit `unit`'s state as one piece, in the config's format: the store's where the
 * unit is one piece (fy_optstate_piece_count). */
void fy_optstate_layout(const struct fy_model_config *c, unsigned unit,
                        struct fy_optstate_layout *out);
/* Unit `unit`'s tensors with where their moments lie, in order, into out[0..FY_UNIT_MAX_TENSORS);
 * returns how many. */
unsigned fy_optstate_tensors(const struct fy_model_config *c, unsigned unit,
                             struct fy_optstate_tensor *out);

/* The parts of an opt-adamw request (common/desc.h) that name a state laid out as `l` at pool
 * offset `state`: one per section, in order, of its kind and dtype, for unit `layer` (-1: no
 * model unit); into out[0..count). Returns l->count. */
unsigned fy_optstate_parts(const struct fy_optstate_layout *l, uint64_t state, int layer,
                           struct fy_desc *out);
/* Writes a new state's moments (zero in every format: codes of zero and absmax 0 in int8) into
 * the state laid out as `l` at `state`, and zeros in every padding; the master is left alone. */
void fy_optstate_zero_moments(const struct fy_optstate_layout *l, void *state);

/* Unit `unit`'s whole state: its pieces' (one piece: its layout's bytes), a state extent. */
uint64_t fy_optstate_bytes(const struct fy_model_config *c, unsigned unit);
/* The largest unit's whole state: the room that holds any unit's. */
uint64_t fy_optstate_max_bytes(const struct fy_model_config *c);
/* Unit `unit`'s master section (in pieces: every piece's), padded: what a read of its weights
 * alone moves. */
uint64_t fy_optstate_master_bytes(const struct fy_model_config *c, unsigned unit);
/* The largest unit's master section, padded. */
uint64_t fy_optstate_max_master_bytes(const struct fy_model_config *c);
/* Bytes a parameter of the state in `format`, every section's element added, int8's block absmax
 * shared out over its block (12, 8, 6.03125), counting every tensor as quantized in int8. */
double fy_optstate_param_bytes(int format);
/* Bytes a parameter that an update moves through host memory: the gradient read in grad_dtype,
 * every section read and written (fp32 with f32 gradients: 28). */
double fy_optstate_update_param_bytes(int grad_dtype, int format);

/* A piece of a unit's state. */
struct fy_optstate_piece {
    uint64_t begin, params; /* the unit's parameters [begin, begin + params) */
    uint64_t offset;        /* where its state starts in the unit's extent; a multiple of 4096 */
    struct fy_optstate_layout layout; /* its sections, their offsets from `offset` */
};

/* How many pieces unit `unit`'s state is in (1 where it is one). */
unsigned fy_optstate_piece_count(const struct fy_model_config *c, unsigned unit);
/* Piece k of unit `unit` (k < fy_optstate_piece_count) into *out and, where tensors is not NULL,
 * its tensors' parts, in order, into tensors[0..FY_UNIT_MAX_TENSORS): begin relative to the
 * piece's first parameter, moments placed in the piece's sections, quantized as the whole tensor
 * is; returns how many. A one-piece unit's piece 0: fy_optstate_layout and fy_optstate_tensors. */
unsigned fy_optstate_piece(const struct fy_model_config *c, unsigned unit, unsigned k,
                           struct fy_optstate_piece *out, struct fy_optstate_tensor *tensors);
/* The largest piece's state of any unit: the room that holds any piece's. */
uint64_t fy_optstate_max_piece_bytes(const struct fy_model_config *c);
/* Whether some unit is in several pieces. */
int fy_optstate_has_pieces(const struct fy_model_config *c);
/* A unit's digest (commit records) from its n pieces' digests in order: the one piece's, or of
 * several XXH3 (common/digest.h) of their 8-byte little-endian values one after another. */
uint64_t fy_optstate_unit_digest(const uint64_t *piece_digests, unsigned n);

/* The bf16 weights copy of a unit kept in the pool: its element type and padded bytes. */
#define FY_OPTSTATE_COPY_DTYPE FY_DTYPE_BF16
uint64_t fy_optstate_copy_bytes(const struct fy_model_config *c, unsigned unit);

#ifdef __cplusplus
}
#endif

#endif
