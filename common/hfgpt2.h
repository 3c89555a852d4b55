/* Hugging Face GPT-2 checkpoints (GPT2LMHeadModel): config.json and safetensors mapped into this
 * project's GPT units (common/model.h) and back, one unit at a time, so that a model larger than
 * host memory converts through a buffer of one unit and one tensor.
 *
 * Mapping (P is "transformer." or "", as the checkpoint names them; Conv1D weights are stored
 * [in][out] by Hugging Face and [out][in] here, so they are transposed both ways):
 *   unit 0:        P wte.weight [V][C], P wpe.weight [T][C]
 *   unit 1+i:      P h.i.ln_1.{weight,bias} [C]           -> ln1_w, ln1_b
 *                  P h.i.attn.c_attn.weight [C][3C], bias -> qkv_w (transposed), qkv_b
 *                  P h.i.attn.c_proj.weight [C][C], bias  -> attn_w (transposed), attn_b
 *                  P h.i.ln_2.{weight,bias}               -> ln2_w, ln2_b
 *                  P h.i.mlp.c_fc.weight [C][4C], bias    -> fc_w (transposed), fc_b
 *                  P h.i.mlp.c_proj.weight [4C][C], bias  -> proj_w (transposed), proj_b
 *   unit L+1:      P ln_f.{weight,bias} [C]
 * lm_head.weight, where present, must equal wte (the head is tied); the attention mask buffers
 * h.i.attn.bias and h.i.attn.masked_bias are not parameters and are skipped.
 *
 * config.json must describe what the CPU and CUDA backends compute: model_type gpt2, the tanh GELU
 * (gelu_new), LayerNorm epsilon 1e-5, n_inner 4 * n_embd, attention scaled by 1/sqrt(head size)
 * and not by layer, no cross-attention, tied embeddings. Keys that are absent take GPT2Config's
 * defaults, as transformers gives them.
 *
 * A run imported from Hugging Face keeps what its export needs in RUN/hf/: config.json (the
 * original, byte for byte), the generation config and the tokenizer's files where the source has
 * them (generation_config.json, tokenizer.json, tokenizer_config.json, special_tokens_map.json,
 * vocab.json, merges.txt, tokenizer.model, added_tokens.json, chat_template.jinja; copied likewise,
 * and exported with the model), and source.json (the tensor name prefix, whether lm_head.weight
 * was stored, the file's __metadata__ and each tensor's original dtype).
 *
 * Llama (LlamaForCausalLM) is mapped without transposes and exported the same way: the names of
 * hfgpt2.c's llama_unit_params (model.embed_tokens.weight; model.layers.i.* per block;
 * model.norm.weight, then lm_head.weight when untied), the source's config.json and dtypes, or
 * for a model made here (init --arch llama) a LlamaConfig config.json written from the model.
 *
 * Errors: -EINVAL for a config or checkpoint that is not a GPT-2 this project computes (wrong
 * architecture, missing or misshapen tensor, untied head), -ENOENT for a missing file, -EEXIST for
 * an output that exists, the safetensors reader's codes for a malformed file, other -errno; each
 * logs one line naming the file and, where there is one, the tensor or key. */
#ifndef FY_HFGPT2_H
#define FY_HFGPT2_H

#include <stdint.h>

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FY_HFGPT2_CONFIG_NAME "config.json"
#define FY_HFGPT2_SOURCE_NAME "source.json"
#define FY_HFGPT2_GENERATION_NAME "generation_config.json"

/* Reads a GPT-2 config.json (at path) into *model, refusing any architecture or setting the
 * backends do not compute with one line naming the file and the key. */
int fy_hfgpt2_read_config(const char *path, struct fy_model_config *model);

/* ---- import ---- */

struct fy_hfgpt2_src;

/* Opens the Hugging Face directory dir (config.json and model.safetensors, or a sharded checkpoint
 * with model.safetensors.index.json) and checks, before any data is read, that it holds every
 * parameter the config asks for with exactly its shape, and nothing else but the mask buffers and
 * lm_head.weight. Reads only the headers. */
int fy_hfgpt2_open(struct fy_hfgpt2_src **out, const char *dir);
void fy_hfgpt2_close(struct fy_hfgpt2_src **s); /* sets *s = NULL; safe on NULL */

const struct fy_model_config *fy_hfgpt2_model(const struct fy_hfgpt2_src *s);
/* "F32", "BF16", "F16", or "mixed" when the parameters' dtypes differ. */
const char *fy_hfgpt2_dtype(const struct fy_hfgpt2_src *s);
/* The checkpoint path named in messages (the single file or the index). */
const char *fy_hfgpt2_path(const struct fy_hfgpt2_src *s);

/* Fills params (fy_model_unit_params(model, unit) floats) with the unit's parameters in the layout
 * of common/model.h, converted to f32 exactly. Unit 0 also checks lm_head.weight against wte
 * (bit for bit, after conversion) and refuses an untied head. Uses a buffer of one tensor. */
int fy_hfgpt2_read_unit(struct fy_hfgpt2_src *s, unsigned unit, float *params);

/* Writes what an export needs (config.json copied byte for byte, source.json) into the new
 * directory hf_dir, atomically: a temporary directory beside it, fsynced, renamed. An existing
 * hf_dir is refused (-EEXIST). */
int fy_hfgpt2_save_source(const struct fy_hfgpt2_src *s, const char *hf_dir);

/* ---- export ---- */

struct fy_hfgpt2_export_opts {
    /* A directory written by fy_hfgpt2_save_source (the original config.json, names and dtypes),
     * or NULL for a model made here: a GPT2Config or LlamaConfig config.json is then written
     * from the model. */
    const char *source;
    /* FY_ST_F32 or FY_ST_BF16 for every tensor; 0: each tensor's original dtype (F16 tensors as
     * F32, logged: the writer has no F16 output), F32 without a source. */
    int dtype;
    /* Above this many bytes of tensor data, shards of at most this size with an index, as Hugging
     * Face splits; 0: always one model.safetensors. */
    uint64_t max_shard_bytes;
    /* Replace the model files of an existing non-empty directory (config.json, model.safetensors,
     * model-*-of-*.safetensors, the index, and the generation config and tokenizer files the
     * export writes); its other files are kept. Without it such a directory
     * is refused; an empty one is used. */
    int overwrite;
};

struct fy_hfgpt2_writer;

/* Starts an export of model into dir: checks dir (refused before anything is written when it
 * exists and is not empty, without overwrite), reads and checks the source against model, and
 * opens the safetensors writer in a temporary directory beside dir. */
int fy_hfgpt2_writer_new(struct fy_hfgpt2_writer **out, const char *dir,
                         const struct fy_model_config *model, const struct fy_hfgpt2_export_opts *o);
/* Writes one unit's parameters (common/model.h layout), units in order 0, 1, ... */
int fy_hfgpt2_writer_put_unit(struct fy_hfgpt2_writer *w, unsigned unit, const float *params);
/* After every unit: completes the checkpoint and config.json in the temporary directory, fsyncs
 * them and the directory, and renames it to dir (an existing dir is exchanged with it atomically,
 * its kept files linked in first, then the old copy removed). On failure nothing is left in dir
 * that was not there before, and the temporary directory is removed. Frees; sets *w = NULL. */
int fy_hfgpt2_writer_finish(struct fy_hfgpt2_writer **w);
/* Abandons an unfinished export: removes the temporary directory; safe on NULL. */
void fy_hfgpt2_writer_destroy(struct fy_hfgpt2_writer **w);
/* What was written: "F32", "BF16" or "mixed", and the number of safetensors files. */
const char *fy_hfgpt2_writer_dtype(const struct fy_hfgpt2_writer *w);

#ifdef __cplusplus
}
#endif

#endif
