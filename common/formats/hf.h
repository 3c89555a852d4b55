/* Hugging Face checkpoints: config.json and safetensors mapped into this project's units
 * (common/model/model.h) one unit at a time, so that a model larger than host memory converts
 * through a buffer of one unit and one tensor; the export is common/formats/hfexport.h.
 *
 * The mapping is the family's tensor table (common/model/arch/: Hugging Face name, shape as stored,
 * transposed or not); P, the family's prefix (GPT-2: "transformer."), stands before every name
 * where the checkpoint has it. GPT-2's Conv1D weights are stored [in][out] and are [out][in] here,
 * so they are transposed both ways; Llama's are not. A checkpoint's lm_head.weight, where the
 * family's head is tied, must equal the embeddings bit for bit; the buffers the family names
 * (GPT-2's attention masks h.i.attn.bias and h.i.attn.masked_bias) are skipped.
 *
 * config.json is read by the family that its model_type names, which refuses with one line naming
 * the key whatever changes the computation and is not computed (the family files list them).
 * Absent keys take the family's transformers defaults.
 *
 * A run imported from Hugging Face keeps what its export needs in RUN/hf/: config.json (the
 * original, byte for byte), the generation config and the tokenizer's files where the source has
 * them (generation_config.json, tokenizer.json, tokenizer_config.json, special_tokens_map.json,
 * vocab.json, merges.txt, tokenizer.model, added_tokens.json, chat_template.jinja; copied likewise,
 * and exported with the model), and source.json (the tensor name prefix, whether lm_head.weight
 * was stored, the file's __metadata__ and each tensor's original dtype).
 *
 * Errors: -EINVAL for a config or checkpoint that is not a model this project computes (another
 * family, missing or misshapen tensor, untied head where the family ties it), -ENOENT for a
 * missing file, -EEXIST for an output that exists, the safetensors reader's codes for a malformed
 * file, other -errno; each logs one line naming the file and, where there is one, the tensor or
 * key. */
#ifndef FY_HF_H
#define FY_HF_H

#include <stdint.h>

#include "common/model/arch/arch.h"
#include "common/model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cJSON;

#define FY_HF_CONFIG_NAME "config.json"
#define FY_HF_SOURCE_NAME "source.json"
#define FY_HF_GENERATION_NAME "generation_config.json"

/* Reads a config.json (at path) into *model through the family its model_type names, refusing any
 * family or setting the backends do not compute with one line naming the file and the key. */
int fy_hf_read_config(const char *path, struct fy_model_config *model);

/* ---- import ---- */

struct fy_hf_src;

/* Opens the Hugging Face directory dir (config.json and model.safetensors, or a sharded checkpoint
 * with model.safetensors.index.json) and checks, before any data is read, that it holds every
 * parameter the config asks for with exactly its shape, and nothing else but the mask buffers and
 * lm_head.weight. Reads only the headers. */
int fy_hf_open(struct fy_hf_src **out, const char *dir);
void fy_hf_destroy(struct fy_hf_src **s); /* sets *s = NULL; safe on NULL */

const struct fy_model_config *fy_hf_model(const struct fy_hf_src *s);
/* "F32", "BF16", "F16", or "mixed" when the parameters' dtypes differ. */
const char *fy_hf_dtype(const struct fy_hf_src *s);
/* The checkpoint path named in messages (the single file or the index). */
const char *fy_hf_path(const struct fy_hf_src *s);

/* Fills params (fy_model_unit_params(model, unit) floats) with the unit's parameters in the layout
 * of common/model/model.h, converted to f32 exactly. Unit 0 also checks lm_head.weight against wte
 * (bit for bit, after conversion) and refuses an untied head. Uses a buffer of one tensor. */
int fy_hf_read_unit(struct fy_hf_src *s, unsigned unit, float *params);

/* Writes what an export needs (config.json copied byte for byte, source.json) into the new
 * directory hf_dir, atomically: a temporary directory beside it, fsynced, renamed. An existing
 * hf_dir is refused (-EEXIST). */
int fy_hf_save_source(const struct fy_hf_src *s, const char *hf_dir);

/* ---- for the export (common/formats/hfexport.c), which shares the mapping's pieces ---- */

#define FY_HF_NAME_MAX 160
/* source.json's "format" (the name it has always had) */
#define FY_HF_SOURCE_FORMAT "fuyou-hf-gpt2-source"
/* A unit's tensors (offsets from the family's table) with their full names: prefix then the
 * Hugging Face name. */
struct fy_hf_tensors {
    unsigned n;
    struct fy_tensor_spec t[FY_UNIT_MAX_TENSORS];
    char name[FY_UNIT_MAX_TENSORS][FY_HF_NAME_MAX];
};
void fy_hf_tensors(const struct fy_model_config *c, unsigned unit, const char *prefix,
                   struct fy_hf_tensors *out);
/* The files that travel with a model unchanged (generation config, tokenizer): their bytes. */
#define FY_HF_CARRIED_COUNT 9
struct fy_hf_carried {
    char *text[FY_HF_CARRIED_COUNT]; /* NULL where the directory has no such file */
    size_t len[FY_HF_CARRIED_COUNT];
};
int fy_hf_carried_load(const char *dir, struct fy_hf_carried *c);
int fy_hf_carried_write(const char *dir, const struct fy_hf_carried *c);
int fy_hf_carried_has(const struct fy_hf_carried *c, const char *name);
void fy_hf_carried_free(struct fy_hf_carried *c);
/* dst[o][i] = src[i][o] for src [rows = in][cols = out]. */
void fy_hf_transpose(float *dst, const float *src, size_t rows, size_t cols);
void fy_hf_format_shape(char *buf, size_t len, int ndim, const uint64_t *shape);
/* A whole small file (config.json, source.json), NUL-terminated; a JSON object from its text. */
int fy_hf_slurp(const char *path, char **out, size_t *len);
int fy_hf_parse_json(const char *path, const char *text, size_t len, struct cJSON **out);
/* The same family and fields (the config hash). */
int fy_hf_same_model(const struct fy_model_config *a, const struct fy_model_config *b);
/* A new directory beside path ("path.tmp-XXXXXX"); dir/name created with text, fsynced; a
 * directory of plain files made here removed (quiet: cleanup). */
int fy_hf_make_temp_dir(const char *path, char *out, size_t len);
int fy_hf_write_file(const char *dir, const char *name, const char *text, size_t len);
void fy_hf_remove_dir_files(const char *dir);
/* *buf of n floats, allocated once. */
int fy_hf_ensure_buf(float **buf, size_t *have, size_t n);

#ifdef __cplusplus
}
#endif

#endif
