/* Hugging Face safetensors checkpoints: a reader that validates a single file or a sharded
 * directory up front and then streams one tensor at a time, and a writer that streams tensors into
 * one file or into shards with their index, replacing nothing until every byte is on disk.
 *
 * Format (all integers little-endian):
 *   u64 N, the header length; N bytes of UTF-8 JSON, an object mapping each tensor name to
 *   {"dtype": "F32", "shape": [d0, ...], "data_offsets": [begin, end]} (offsets relative to the byte
 *   after the header), plus an optional "__metadata__" object of string -> string; then the data.
 *   Sharded checkpoints: model-00001-of-0000K.safetensors ... and model.safetensors.index.json,
 *   {"metadata": {"total_size": bytes}, "weight_map": {tensor name: shard file name}}.
 *
 * Errors: -EBADMSG for a malformed or truncated file or index, -ENOTSUP for a dtype other than
 * F32, BF16 and F16, -ENOENT for a missing file or shard, -EINVAL for a caller's mistake, -EEXIST
 * for an output that exists without overwrite, other -errno from the system; each logs one line
 * naming the file and, where there is one, the tensor. */
#ifndef FY_SAFETENSORS_H
#define FY_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum fy_st_dtype { FY_ST_F32 = 1, FY_ST_BF16 = 2, FY_ST_F16 = 3 };

#define FY_ST_MAX_DIMS 8
/* The Hugging Face implementation refuses longer headers; so do we (a corrupt length field would
 * otherwise ask for gigabytes). */
#define FY_ST_MAX_HEADER 100000000u
#define FY_ST_SINGLE_NAME "model.safetensors"
#define FY_ST_INDEX_NAME "model.safetensors.index.json"

/* "F32", "BF16", "F16" (as in the file), or "unknown". */
const char *fy_st_dtype_name(int dtype);
/* Bytes per element, 0 for an unknown dtype. */
size_t fy_st_dtype_size(int dtype);

struct fy_st_tensor {
    const char *name;
    int dtype; /* enum fy_st_dtype */
    int ndim;  /* 0 for a scalar */
    uint64_t shape[FY_ST_MAX_DIMS];
    uint64_t numel;  /* product of the shape (1 for a scalar, 0 for an empty tensor) */
    uint64_t nbytes; /* numel * dtype size */
    const char *file; /* path of the file that holds the data */
    uint64_t offset;  /* absolute byte offset of the data in that file */
};

/* ---- reader ---- */

struct fy_st_reader;

/* Opens path: a .safetensors file, an index json, or a directory holding model.safetensors.index.json
 * or else model.safetensors. Validates every header in full (header length, UTF-8, JSON, dtypes,
 * shapes against data sizes, offsets within the data, no overlaps, no duplicate names) and, for a
 * sharded checkpoint, that every shard exists and holds exactly the tensors the index maps to it.
 * Reads only the headers: data is read per tensor. */
int fy_st_open(struct fy_st_reader **out, const char *path);
/* Closes the files and frees; sets *r to NULL; safe on NULL. */
void fy_st_close(struct fy_st_reader **r);

/* Tensors in file order (shards in the order the index first names them), within a file in header
 * order. Pointers stay valid until fy_st_close. */
size_t fy_st_count(const struct fy_st_reader *r);
const struct fy_st_tensor *fy_st_tensor_at(const struct fy_st_reader *r, size_t i);
/* NULL when there is no tensor of that name (logs nothing). */
const struct fy_st_tensor *fy_st_find(const struct fy_st_reader *r, const char *name);

/* The "__metadata__" of the file (of the first shard for a sharded checkpoint), in header order. */
size_t fy_st_metadata_count(const struct fy_st_reader *r);
void fy_st_metadata_at(const struct fy_st_reader *r, size_t i, const char **key, const char **value);
/* The value for key, or NULL. */
const char *fy_st_metadata(const struct fy_st_reader *r, const char *key);

/* Reads tensor t (from this reader) into dst as n = t->numel floats, converting BF16 and F16
 * exactly. -EINVAL when n is not t->numel. */
int fy_st_read_f32(struct fy_st_reader *r, const struct fy_st_tensor *t, float *dst, uint64_t n);
/* Reads tensor t's bytes as stored (its own dtype, little-endian); nbytes must be t->nbytes. */
int fy_st_read_raw(struct fy_st_reader *r, const struct fy_st_tensor *t, void *dst, uint64_t nbytes);

/* ---- writer ---- */

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
