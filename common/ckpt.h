/* Model state metadata, commit records and weight files.
 *
 * The store keeps every unit's optimizer state (its layout: common/optstate.h) twice (copies 0
 * and 1, extents FY_TENSOR_UNIT_STATE_COPY) and two commit records (extents FY_TENSOR_COMMIT(0)
 * and (1)), written in turn. A record names a committed step, the copy that holds every unit's state at that step
 * and each unit's digest there; a step's write-backs go to the other copy, so a crash at any
 * moment leaves the committed copy whole. Recovery takes the intact record with the highest
 * sequence number (docs/architecture.md, "Durability").
 *
 * Commit record (FY_COMMIT_RECORD_BYTES, little-endian int32 slots in its first 4096 bytes): [0]
 * magic "FYMD" [1] version (2) [2..6] n_layer n_head n_embd vocab ctx [7,8] config hash (low,
 * high) [9,10] committed step (low, high) [11,12] init seed (low, high) [13] checksum (FNV-1a of
 * slots 0..12); [14] architecture (0 GPT-2, 1 Llama); for Llama [15..20] n_kv_head n_inter tied
 * rope_type rope_original_max_pos rms_eps (f32 bits), [21..28] rope_theta, factor,
 * low_freq_factor, high_freq_factor (f64 bits, low word first), covered by the config hash; [29]
 * zero; [30] copy; [31,32] sequence number; [33] unit count; [34,35] digest (common/digest.h) of
 * the whole record with these two slots zero; [36] copies of the state the store keeps (1 or 2; 0
 * in the first records written, meaning 2); [37] the optimizer state format (enum fy_optim_state:
 * 0 fp32, 1 bf16, 2 int8; outside the config hash); [38] the store's piece of optimizer state in
 * KiB (struct fy_model_config's state_piece: 0 in records made before pieces, every unit one
 * piece); the rest of the block zero. From byte 4096: each unit's state digest (uint64, unit order;
 * a unit in pieces: fy_optstate_unit_digest of its pieces').
 *
 * Stores made before commit records held a 4096-byte metadata block of version 1 in extent
 * FY_TENSOR_META instead, and one copy of the state. They are no longer read: opening one is
 * refused with a line that says what to do (launcher/step/commit.h, fy_commit_read).
 *
 * Exported weights file ("FYWT"): a 4096-byte header of int32 slots [0] magic [1] version
 * [2..6] model config [7,8] config hash [9,10] step [11] dtype (1 = f32) [12] unit count
 * [13] checksum of slots 0..12, [14..28] as in a commit record; then each unit's parameters
 * (common/model.h order) as f32, each unit starting on a 4096-byte boundary. Written to a
 * temporary file, fsynced and renamed. */
#ifndef FY_CKPT_H
#define FY_CKPT_H

#include <stdint.h>

#include "model.h"

#define FY_CKPT_BLOCK 4096
#define FY_STOREMETA_MAGIC 0x444d5946u /* "FYMD" */
#define FY_WEIGHTS_MAGIC 0x54575946u   /* "FYWT" */
#define FY_WEIGHTS_VERSION 1 /* weights files */
#define FY_COMMIT_VERSION 2  /* commit records */
/* Units a commit record has digests for (n_layer <= 4096, plus the embeddings and final unit). */
#define FY_COMMIT_MAX_UNITS 4098u
#define FY_COMMIT_RECORD_BYTES (FY_CKPT_BLOCK + (FY_COMMIT_MAX_UNITS * 8 + 4095) / 4096 * 4096)

/* Extent ids in the SSD store. */
/* The metadata block of stores made before commit records: looked for only to refuse them. */
#define FY_TENSOR_META 1u
#define FY_TENSOR_COMMIT(i) (2u + (uint32_t)(i)) /* commit records 0 and 1 */
#define FY_TENSOR_UNIT_STATE_COPY(u, copy) (((copy) ? 0x20000000u : 0u) + 16u + (uint32_t)(u))
#define FY_TENSOR_UNIT_STATE(u) FY_TENSOR_UNIT_STATE_COPY(u, 0)
/* Scratch for training's activation checkpoints spilled to the store (--ckpt-place ssd), in size
 * classes (below), so runs with other batch sizes reuse or add a class; not part of the state.
 * Classes once came in powers of two under the ids 0x40000000 + k (and + 0x1000, + 0x2000 for the
 * two below): a store made then keeps those extents unused. */
#define FY_TENSOR_CKPT_SPILL(k) (0x40010000u + (uint32_t)(k))
/* Scratch for the blocks' forward internals placed on the SSD (--act-plan ssd), size classes as
 * above; not part of the state either. */
#define FY_TENSOR_SAVED_SPILL(k) (0x40011000u + (uint32_t)(k))
/* Scratch the profile times the store with (--act-plan auto), size classes as above. */
#define FY_TENSOR_PROBE(k) (0x40012000u + (uint32_t)(k))
/* Size class k of those scratch extents holds (8 + k % 8) / 8 x 2^(k / 8) MiB: eight steps to each
 * doubling, so an extent is at most 1/8 larger than asked (a power of two could take twice the
 * room, and a disk's worth). */
unsigned fy_scratch_class(uint64_t bytes); /* the smallest class that holds `bytes` */
static inline uint64_t fy_scratch_class_bytes(unsigned k)
{
    return (uint64_t)(8 + k % 8) << (17 + k / 8);
}
/* The bytes of the scratch extent that holds `bytes` (its class's). */
static inline uint64_t fy_scratch_bytes(uint64_t bytes)
{
    return fy_scratch_class_bytes(fy_scratch_class(bytes));
}

/* A commit record. */
struct fy_storemeta {
    struct fy_model_config model;
    uint64_t step; /* committed: every unit's state in `copy` is this step's */
    uint64_t seed;
    uint64_t seq;  /* the record's sequence number */
    uint32_t copy; /* 0 or 1 */
    /* copies of the state the store keeps: 2, or 1 (init --state-copies 1: half the space, and a
     * run stopped between commits leaves the store unusable) */
    uint32_t copies;
    uint64_t digest[FY_COMMIT_MAX_UNITS]; /* per unit, of its state extent in `copy` */
};

/* A commit record of FY_COMMIT_RECORD_BYTES. */
void fy_storemeta_encode(const struct fy_storemeta *m, uint8_t *record);
/* Without a word: 0 when `record` is an intact commit record (magic, version, checksum and
 * digest), 1 when it is all zeros (an extent never written), -EBADMSG otherwise. */
int fy_storemeta_check(const uint8_t *record, size_t len);
/* A commit record (len >= FY_COMMIT_RECORD_BYTES). -EBADMSG with a message naming `where` when it
 * is not one, or damaged. */
int fy_storemeta_decode(const uint8_t *record, size_t len, const char *where,
                        struct fy_storemeta *m);

/* Weight files. The writer takes the units in order through `next` (called once per unit with a
 * buffer of fy_model_unit_params floats to fill). */
int fy_weights_write(const char *path, const struct fy_model_config *c, uint64_t step, int overwrite,
                     int (*next)(void *ctx, unsigned unit, float *params), void *ctx);
/* Reads the whole file into *params (malloc'd, units concatenated without padding). */
int fy_weights_read(const char *path, struct fy_model_config *c, uint64_t *step, float **params);

#endif
