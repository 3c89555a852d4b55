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
void fy_st_destroy(struct fy_st_reader **r);

/* Tensors in file order (shards in the order the index first names them), within a file in header
 * order. Pointers stay valid until fy_st_destroy. */
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

/* ---- for the writer (common/formats/stwriter) ---- */

/* Tensor data is copied in pieces of this size (conversion buffers). */
#define FY_ST_CHUNK (1u << 20)
/* cJSON holds numbers as doubles: integers above 2^53 would not be exact (and mean 9 PB). */
#define FY_ST_MAX_JSON_INT 9007199254740992.0
/* "[d0,d1,...]" for FY_ST_MAX_DIMS dimensions of up to 20 digits. */
#define FY_ST_SHAPE_CHARS (FY_ST_MAX_DIMS * 21 + 3)
/* A __metadata__ entry. */
struct fy_st_meta {
    char *key, *value;
};
int fy_st_utf8_ok(const char *s);
void fy_st_format_shape(char *buf, size_t cap, int ndim, const uint64_t *shape);

#ifdef __cplusplus
}
#endif

#endif
