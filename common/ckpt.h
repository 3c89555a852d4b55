/* Model state metadata and weight files.
 *
 * Store metadata block (extent FY_TENSOR_META of the SSD store, 4096 bytes, little-endian int32
 * slots): [0] magic "FYMD" [1] version [2..6] n_layer n_head n_embd vocab ctx [7,8] config hash
 * (low, high) [9,10] last completed step (low, high) [11,12] init seed (low, high) [13] checksum
 * (FNV-1a of slots 0..12); [14] architecture (0 GPT-2, 1 Llama); for Llama [15..20] n_kv_head
 * n_inter tied rope_type rope_original_max_pos rms_eps (f32 bits), [21..28] rope_theta, factor,
 * low_freq_factor, high_freq_factor (f64 bits, low word first), covered by the config hash; [29]
 * 1 while state is written back past the last synced step (see struct fy_storemeta); the rest
 * zero (so GPT-2 headers are unchanged).
 *
 * Exported weights file ("FYWT"): a 4096-byte header of int32 slots [0] magic [1] version
 * [2..6] model config [7,8] config hash [9,10] step [11] dtype (1 = f32) [12] unit count
 * [13] checksum of slots 0..12, [14..28] as in the metadata block; then each unit's parameters (common/model.h order) as f32, each
 * unit starting on a 4096-byte boundary. Written to a temporary file, fsynced and renamed. */
#ifndef FY_CKPT_H
#define FY_CKPT_H

#include <stdint.h>

#include "model.h"

#define FY_CKPT_BLOCK 4096
#define FY_STOREMETA_MAGIC 0x444d5946u /* "FYMD" */
#define FY_WEIGHTS_MAGIC 0x54575946u   /* "FYWT" */
#define FY_CKPT_VERSION 1

/* Extent ids in the SSD store. */
#define FY_TENSOR_META 1u
#define FY_TENSOR_UNIT_STATE(u) (16u + (uint32_t)(u))
/* Scratch for training's activation checkpoints spilled to the store (--ckpt-place ssd): size class
 * k holds 2^k MiB, so runs with other batch sizes reuse or add a class; not part of the state. */
#define FY_TENSOR_CKPT_SPILL(k) (0x40000000u + (uint32_t)(k))
/* Scratch for the blocks' forward internals placed on the SSD (--act-plan ssd), size classes as
 * above; not part of the state either. */
#define FY_TENSOR_SAVED_SPILL(k) (0x40001000u + (uint32_t)(k))
/* Scratch the profile times the store with (--act-plan auto), size classes as above. */
#define FY_TENSOR_PROBE(k) (0x40002000u + (uint32_t)(k))
/* The smallest size class k (2^k MiB) of those scratch extents that holds `bytes`. */
unsigned fy_scratch_class(uint64_t bytes);
/* The bytes of size class k. */
static inline uint64_t fy_scratch_class_bytes(unsigned k) { return (uint64_t)1 << (20 + k); }

struct fy_storemeta {
    struct fy_gpt_config model;
    uint64_t step;
    uint64_t seed;
    /* 1: state has been written back past the last synced step, so a crash may have left units at
     * different steps (slot [29]; 0 in stores older than the flag) */
    uint32_t unsynced;
};

void fy_storemeta_encode(const struct fy_storemeta *m, uint8_t block[FY_CKPT_BLOCK]);
/* -EBADMSG with a message naming `where` when the block is not valid metadata. */
int fy_storemeta_decode(const uint8_t block[FY_CKPT_BLOCK], const char *where, struct fy_storemeta *m);

/* Byte layout of a unit's state extent: master, adam m, adam v, each 4096-aligned. */
uint64_t fy_unit_state_section(const struct fy_gpt_config *c, unsigned unit);
uint64_t fy_unit_state_bytes(const struct fy_gpt_config *c, unsigned unit);

/* Weight files. The writer takes the units in order through `next` (called once per unit with a
 * buffer of fy_gpt_unit_params floats to fill). */
int fy_weights_write(const char *path, const struct fy_gpt_config *c, uint64_t step, int overwrite,
                     int (*next)(void *ctx, unsigned unit, float *params), void *ctx);
/* Reads the whole file into *params (malloc'd, units concatenated without padding). */
int fy_weights_read(const char *path, struct fy_gpt_config *c, uint64_t *step, float **params);

#endif
