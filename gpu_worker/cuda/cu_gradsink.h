/* Where cu_model's weight gradients go on the device. A block backward's, a piece at a time
 * (struct fy_cu_grads of cu_grads.h, which the family's units fill): a ring of FY_CU_GRAD_RING
 * piece buffers taken in turn, each piece summed over the ranks of a group (cu_ranks), copied into
 * a held buffer where one-pass clipping holds the gradient, and downloaded on the queue's
 * device-to-host stream into the call's host gradient while the backward goes on, its buffer
 * reused once it is home; so the device never holds a whole block's f32 gradient. The head's and
 * the embeddings' gradients, which their computations accumulate into, in one whole buffer. The
 * buffers are cu_model's, carved from its arena; this module orders their use on the streams. */
#ifndef FY_CU_GRADSINK_H
#define FY_CU_GRADSINK_H

#include <stddef.h>

#include "gpu_worker/cuda/cu_common.h"
#include "gpu_worker/cuda/cu_grads.h"
#include "gpu_worker/cuda/cu_queue.h"

/* Piece buffers taken in turn: one computed into while the one before goes home, and one to
 * spare. */
#define FY_CU_GRAD_RING 3

struct fy_cu_ranks;

struct fy_cu_gradsink {
    struct fy_cu_grads grads; /* what a block backward is given: this sink's take and put */
    struct fy_cu_queue *q;    /* the model's: its compute and device-to-host streams */
    size_t block_n;           /* floats of a block's gradient */
    /* FY_CU_GRAD_RING buffers of grads.piece_max floats, each free again once its download is
     * done (done[i], where used[i]); `taking`: the one the piece being computed is in */
    float *piece[FY_CU_GRAD_RING];
    cudaEvent_t ready[FY_CU_GRAD_RING], done[FY_CU_GRAD_RING];
    int used[FY_CU_GRAD_RING], next, taking;
    /* the block backward being queued: its call's staging and the host gradient the pieces go
     * to; discard: they go nowhere (the profile's backward) */
    struct fy_cu_staging *st;
    float *host;
    int discard;
    /* the head's or the embeddings' gradients, whole, whose last download a writer waits for
     * (unit_free, recorded where unit_used) */
    float *unit;
    cudaEvent_t unit_free;
    int unit_used;
    /* one-pass clipping: `holds` block gradients held (block_n floats each); hold_next, the buffer
     * the next block backward also keeps its gradient in (-1: none) */
    float *held;
    int holds, hold_next;
    const struct fy_cu_ranks *ranks; /* the gpu workers' group, NULL without one */
};

/* Readies a sink whose buffers (piece, unit) are carved: pieces of at most piece_n floats of block
 * gradients of block_n floats, downloaded through q's calls. -EIO (said) where CUDA fails; what
 * was made is released by fy_cu_gradsink_release. */
int fy_cu_gradsink_init(struct fy_cu_gradsink *s, struct fy_cu_queue *q, size_t piece_n,
                        size_t block_n);
/* Releases what fy_cu_gradsink_init made, once nothing of it is in flight. */
void fy_cu_gradsink_release(struct fy_cu_gradsink *s);
/* 1 where this worker writes gradients to its host buffers: without a group, or as its rank 0 (the
 * other ranks' buffers are the same pool regions as rank 0's, which they must not touch). */
int fy_cu_gradsink_home(const struct fy_cu_gradsink *s);
/* With a group, grad [n], just computed, summed over the ranks into rank 0's on the compute
 * stream: after the kernels that computed it, before its download. Every rank queues the same
 * calls, so their sums pair up in order. 0 and nothing without a group. */
int fy_cu_gradsink_sum(const struct fy_cu_gradsink *s, float *grad, size_t n);
/* The whole buffer `unit`: before it is written again on `stream`, its last download is done;
 * after its downloads are queued, that is recorded. */
int fy_cu_gradsink_unit_wait(const struct fy_cu_gradsink *s, cudaStream_t stream);
int fy_cu_gradsink_unit_sent(struct fy_cu_gradsink *s);

#endif
