/* Token files' writers (the format: common/formats/tokfile.h): one call for tokens in memory, a
 * streaming writer for preparations that produce tokens piece by piece, and the built-in
 * byte-level preparation. Every writer writes a temporary file and renames it into place. */
#ifndef FY_TOKWRITER_H
#define FY_TOKWRITER_H

#include <signal.h>
#include <stdint.h>

#include "common/formats/tokfile.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes count tokens (each < vocab) to path atomically (temporary file path.tmp, fsync, rename,
 * fsync of the directory). An existing path is refused with -EEXIST unless overwrite. */
int fy_tokfile_write(const char *path, const uint32_t *tokens, uint64_t count, uint32_t vocab,
                     int overwrite);

/* As fy_tokfile_write, with a loss mask (trained[i] != 0: token i is trained; NULL: all are) and the
 * tokenizer's identity (NULL: unspecified). Refuses a mask with no trained token. */
int fy_tokfile_write_masked(const char *path, const uint32_t *tokens, const uint8_t *trained,
                            uint64_t count, uint32_t vocab, const struct fy_tokfile_source *src,
                            int overwrite);

/* A streaming writer, for preparations that produce tokens piece by piece: memory stays bounded
 * whatever the count (the mask bits go to an unlinked side file until the end). Nothing appears at
 * path before fy_tokwriter_finish; an abort, or a failed finish, leaves no file behind. */
struct fy_tokwriter;
/* src may be NULL (unspecified). An existing path is refused with -EEXIST unless overwrite. */
int fy_tokwriter_begin(struct fy_tokwriter **out, const char *path, uint32_t vocab,
                       const struct fy_tokfile_source *src, int overwrite);
/* Appends n tokens (each < vocab, else -EINVAL naming its index), all trained or all masked. */
int fy_tokwriter_put(struct fy_tokwriter *w, const uint32_t *tokens, uint64_t n, int trained);
/* The tokens put next begin a new document (a record where `record`, else a whole text file; every
 * call of a writer must say the same). Tokens put before the first call belong to a first
 * document; a call with no token put since the previous one starts no empty document. A writer
 * that is told of documents writes version 3 with the document index. */
int fy_tokwriter_document(struct fy_tokwriter *w, int record);
/* Tokens put so far. */
uint64_t fy_tokwriter_count(const struct fy_tokwriter *w);
/* Writes the mask plane (if any token is masked), the header, syncs and renames into place; frees
 * *w and sets it to NULL whatever happens. Refuses no tokens, or no trained token. count and
 * masked (may be NULL) receive the totals. */
int fy_tokwriter_finish(struct fy_tokwriter **w, uint64_t *count, uint64_t *masked);
/* Removes the temporary file and frees; safe on NULL. */
void fy_tokwriter_abort(struct fy_tokwriter **w);

/* A flag (set by a signal handler) that, once non-zero, makes every writer's next write of the
 * token file fail with -EINTR, nothing said: a preparation stopped by a signal then aborts and
 * leaves no temporary file. NULL (the default): none. */
void fy_tokwriter_stop_on(const volatile sig_atomic_t *flag);

/* Byte-level preparation: the bytes of the inputs (regular files), concatenated in order, become
 * the tokens of out_path (vocab 256, width 1, the byte-level tokenizer recorded), each non-empty
 * input a document (version 3). Inputs are streamed, not held in memory. An empty total is
 * refused. *count_out (may be NULL) receives the token count. */
int fy_tokfile_prepare_bytes(const char *out_path, const char *const *inputs, unsigned n_inputs,
                             int overwrite, uint64_t *count_out);

#ifdef __cplusplus
}
#endif

#endif
