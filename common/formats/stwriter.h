/* The safetensors writer: one file, or a sharded checkpoint with its index as Hugging Face writes
 * them (the format is in common/formats/safetensors.h, beside the reader). */
#ifndef FY_STWRITER_H
#define FY_STWRITER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct fy_st_writer;

/* A writer of one file at path. The directory must exist; an existing path is refused with
 * -EEXIST unless overwrite. */
int fy_st_writer_new(struct fy_st_writer **out, const char *path, int overwrite);
/* A writer of a sharded checkpoint in the existing directory dir: tensors, in declaration order,
 * fill model-0000i-of-0000K.safetensors of at most max_shard_bytes of data each (a larger tensor
 * gets a shard of its own), with model.safetensors.index.json, as Hugging Face writes them. When
 * everything fits one shard, the result is model.safetensors without an index, as Hugging Face
 * does too. */
int fy_st_writer_new_sharded(struct fy_st_writer **out, const char *dir, uint64_t max_shard_bytes,
                             int overwrite);

/* Declarations, all before the first fy_st_writer_put_*: they fix the header. dtype FY_ST_F32 or
 * FY_ST_BF16; ndim 0..FY_ST_MAX_DIMS (0: a scalar; shape may then be NULL). Names are unique,
 * non-empty UTF-8, not "__metadata__". */
int fy_st_writer_declare(struct fy_st_writer *w, const char *name, int dtype, int ndim,
                         const uint64_t *shape);
/* A "__metadata__" entry (string -> string), written in the order given (into every shard). */
int fy_st_writer_metadata(struct fy_st_writer *w, const char *key, const char *value);

/* Appends n elements to tensor `name`, from f32 (rounded to nearest even where it is BF16). A
 * tensor may be written in several pieces, tensors in any order; no more than declared. */
int fy_st_writer_put_f32(struct fy_st_writer *w, const char *name, const float *src, uint64_t n);
/* Appends nbytes already in the tensor's dtype (a multiple of its element size). */
int fy_st_writer_put_raw(struct fy_st_writer *w, const char *name, const void *src, uint64_t nbytes);

/* Checks that every tensor is complete, fsyncs each file under a temporary name (NAME.tmp in the
 * same directory), renames them into place, the index last, and fsyncs the directory. On failure
 * the temporary files are removed, and so is any file already renamed into place (a rename failing
 * half-way through a sharded checkpoint; with overwrite, the file it replaced is then gone too), so
 * no final name holds part of a checkpoint. Frees the writer in every case and sets *w to NULL. */
int fy_st_writer_finish(struct fy_st_writer **w);
/* Abandons an unfinished writer: removes its temporary files and frees; safe on NULL. */
void fy_st_writer_destroy(struct fy_st_writer **w);

#ifdef __cplusplus
}
#endif

#endif
