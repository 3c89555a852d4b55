/* Hugging Face export: a model's units written as a safetensors checkpoint (sharded with an index
 * above a size) with its config.json and the files that travel with it, into a temporary directory
 * beside the target renamed into place only when whole. Names and shapes come from the family's
 * tensor table (common/model/arch), the source's names, dtypes and config.json from RUN/hf
 * (common/formats/hf.h) or, for a model made here, a config.json written by the family. */
#ifndef FY_HFEXPORT_H
#define FY_HFEXPORT_H

#include <stdint.h>

#include "common/model/model.h"

#ifdef __cplusplus
extern "C" {
#endif


struct fy_hf_export_opts {
    /* A directory written by fy_hf_save_source (the original config.json, names and dtypes),
     * or NULL for a model made here: the family's config.json is then written from
     * the model (struct fy_arch's hf_config_write). */
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

struct fy_hf_writer;

/* Starts an export of model into dir: checks dir (refused before anything is written when it
 * exists and is not empty, without overwrite), reads and checks the source against model, and
 * opens the safetensors writer in a temporary directory beside dir. */
int fy_hf_writer_new(struct fy_hf_writer **out, const char *dir,
                         const struct fy_model_config *model, const struct fy_hf_export_opts *o);
/* Writes one unit's parameters (common/model/model.h layout), units in order 0, 1, ... */
int fy_hf_writer_put_unit(struct fy_hf_writer *w, unsigned unit, const float *params);
/* After every unit: completes the checkpoint and config.json in the temporary directory, fsyncs
 * them and the directory, and renames it to dir (an existing dir is exchanged with it atomically,
 * its kept files linked in first, then the old copy removed). On failure nothing is left in dir
 * that was not there before, and the temporary directory is removed. Frees; sets *w = NULL. */
int fy_hf_writer_finish(struct fy_hf_writer **w);
/* Abandons an unfinished export: removes the temporary directory; safe on NULL. */
void fy_hf_writer_destroy(struct fy_hf_writer **w);
/* What was written: "F32", "BF16" or "mixed", and the number of safetensors files. */
const char *fy_hf_writer_dtype(const struct fy_hf_writer *w);

#ifdef __cplusplus
}
#endif

#endif
