/* The architecture registry: each model family (GPT-2, Llama) is described once, in one file of
 * this folder, by a struct fy_arch: its names (model.conf's model.arch, Hugging Face's model_type
 * and architectures), its config readers and writers, what its blocks support, and per unit a
 * tensor table (Hugging Face name, shape as stored, transposed or not, weight decay, init rule).
 * Everything else about a family's parameters is derived from that table here: unit sizes, each
 * tensor's offset (the tensors of a unit lie one after another in table order), the weight-decay
 * segments, the initialisation and the Hugging Face mapping. Code outside this folder asks the
 * registry; it never names a family. */
#ifndef FY_ARCH_H
#define FY_ARCH_H

#include <stddef.h>
#include <stdint.h>

#include "common/model/model_config.h"

#ifdef __cplusplus
extern "C" {
#endif

struct fy_config;
struct cJSON;

/* How init fills a tensor (values depend on (seed, unit, index in the unit) alone). */
enum fy_init_rule {
    FY_INIT_ZERO = 0,
    FY_INIT_ONE = 1,
    FY_INIT_NORMAL = 2,         /* N(0, 0.02) */
    FY_INIT_NORMAL_RESIDUAL = 3 /* N(0, 0.02 / sqrt(2 n_layer)): GPT-2's residual projections */
};

/* One tensor of a unit. */
struct fy_tensor_spec {
    /* Hugging Face's name; in a block unit a pattern with one %u, the block's index from 0. The
     * family's hf_prefix may stand before it in a checkpoint (struct fy_arch). */
    const char *hf_name;
    int ndim;          /* 1 or 2 */
    uint64_t shape[2]; /* as Hugging Face stores it */
    int transposed;    /* stored [in][out] (GPT-2's Conv1D), [out][in] in the unit */
    int decay;         /* AdamW's weight decay applies */
    enum fy_init_rule init;
    size_t offset; /* floats into the unit: set by fy_unit_tensors */
};

#define FY_UNIT_MAX_TENSORS 16

/* Slots of binary headers (commit records, weight files) that hold a family's own fields: the
 * first 14 after the header's checksum, the rest in a later range that older headers leave zero. */
#define FY_FAMILY_SLOTS 30

/* init's model options beyond the common shape (--kv-heads, --ffn, --head-dim, --tied, --rms-eps,
 * --rope-theta), as given or at their defaults (0 for the sizes and tied, 1e-5, 10000). */
struct fy_family_options {
    uint64_t kv_heads, ffn, head_dim;
    int tied;
    double rms_eps, rope_theta;
};

struct fy_arch {
    uint32_t id;       /* in binary headers and the config hash: fixed once stores exist */
    const char *name;  /* model.conf's model.arch */
    const char *label; /* for people: "GPT-2" */
    const char *hf_model_type;
    const char *const *hf_architectures; /* the architectures names it takes, NULL-terminated */
    /* what a checkpoint may put before every tensor name ("transformer." for GPT-2), "" if none */
    const char *hf_prefix;
    /* 1: the blocks' internals are the kinds of common/model/actplan.h (QKV, ATTN, RESID, FC,
     * GELU), which the backends can swap to host memory and profile one by one; 0: kept or
     * recomputed */
    int swaps_internals;

    /* The family's own checks, after the common ones (fy_model_config_validate). */
    int (*validate)(const struct fy_model_config *c);
    /* init's family options into the family's fields; an option the family does not take,
     * refused with one line naming it. */
    int (*from_options)(const struct fy_family_options *o, struct fy_model_config *c);
    /* The family's model.* keys of model.conf (the common five are read and written for it). */
    int (*conf_read)(const struct fy_config *cfg, struct fy_model_config *c);
    int (*conf_write)(const struct fy_model_config *c, struct fy_config *cfg);
    /* config.json: fills the whole config (transformers' defaults for absent keys), refusing with
     * one line naming the file and the key whatever changes the computation and is not computed.
     * path names the file in messages. The caller checks the config after (as conf_read's:
     * fy_model_config_validate). */
    int (*hf_config_read)(const char *path, const struct cJSON *root, struct fy_model_config *c);
    /* config.json for an export, torch_dtype "float32" or "bfloat16"; malloc'd text, NULL on error */
    char *(*hf_config_write)(const struct fy_model_config *c, const char *torch_dtype);
    /* 1: a checkpoint tensor that holds no parameter (a buffer) and is skipped on import */
    int (*hf_is_buffer)(const struct fy_model_config *c, const char *name);
    /* 1: the LM head is the embedding matrix (a checkpoint's lm_head.weight is its copy) */
    int (*head_tied)(const struct fy_model_config *c);
    /* The family's fields in binary headers' slots (zero where unused), and back. */
    void (*slots_write)(const struct fy_model_config *c, uint32_t slots[FY_FAMILY_SLOTS]);
    void (*slots_read)(const uint32_t slots[FY_FAMILY_SLOTS], struct fy_model_config *c);
    /* The family's part of the config hash, mixed after the common fields' (fy_model_config_hash).
     * GPT-2's is empty (its hash is the common fields', as it always was); every other family mixes
     * in its id, so that no two families hash alike. */
    uint64_t (*hash)(const struct fy_model_config *c, uint64_t h);
    /* "Llama: 2 layers, ..." for people (fy_model_config_describe adds the parameter count) */
    void (*describe)(const struct fy_model_config *c, char *buf, size_t len);
    /* The size of an attention head (fy_model_head_size); NULL: n_embd / n_head. */
    uint32_t (*head_size)(const struct fy_model_config *c);
    /* The tensors of a unit of this kind in their order (offsets left to fy_unit_tensors);
     * returns how many (<= FY_UNIT_MAX_TENSORS). */
    unsigned (*unit_table)(const struct fy_model_config *c, enum fy_unit_kind kind,
                           struct fy_tensor_spec *out);
};

extern const struct fy_arch fy_arch_gpt2;
extern const struct fy_arch fy_arch_llama;
extern const struct fy_arch fy_arch_qwen2;
extern const struct fy_arch fy_arch_qwen3;
extern const struct fy_arch fy_arch_mistral;
extern const struct fy_arch fy_arch_phi3;

/* The config's family: c->arch, or GPT-2 where it names none. */
const struct fy_arch *fy_model_arch(const struct fy_model_config *c);
/* Every family, in a fixed order (the first is GPT-2); count in *n. */
const struct fy_arch *const *fy_arch_all(unsigned *n);
/* By binary id, model.conf name, or config.json model_type; NULL when none. */
const struct fy_arch *fy_arch_by_id(uint32_t id);
const struct fy_arch *fy_arch_by_name(const char *name);
const struct fy_arch *fy_arch_by_hf_model_type(const char *model_type);
/* "gpt2, llama": the names, for messages. */
void fy_arch_names(char *buf, size_t len, int hf_model_types);

/* A unit's tensors with their offsets; returns how many. */
unsigned fy_unit_tensors(const struct fy_model_config *c, unsigned unit,
                         struct fy_tensor_spec out[FY_UNIT_MAX_TENSORS]);
uint64_t fy_tensor_numel(const struct fy_tensor_spec *t);
/* The tensor's Hugging Face name in `unit` (the block index filled in), without the prefix. */
void fy_tensor_hf_name(const struct fy_model_config *c, unsigned unit,
                       const struct fy_tensor_spec *t, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif
