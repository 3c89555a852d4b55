/* The host interface's queue of the CUDA backend, for cu_model: up to FY_CU_QUEUE calls in flight,
 * each with its own device buffers (its staging). A call uploads its inputs on the host-to-device
 * stream straight into its staging's buffers, computes on the compute stream and downloads its
 * outputs on the device-to-host stream, each stream waiting on the previous one's event, and
 * returns without waiting, so the next call's uploads (the next layer's weights) run while the
 * current one computes and its results travel home. Host weights and activations in f32 pass
 * through two small rings of f32 chunks, converted to and from the bf16 the device computes in on
 * their way (uploads on a conversion stream of their own, so that they overlap the call before);
 * nothing the size of a unit is ever held in f32. An upload from a host range that a call in
 * flight downloads into waits for that download; an activation input that is the activation
 * output of the call in flight just before is read from that call's device buffer instead.
 * Downloads may start before the call's compute is done (cu_model's gradient pieces).
 * fy_cu_queue_finish completes the oldest call (its loss, the host ranges it zeroes, the device
 * time of its copies); the ready descriptor says when that needs no waiting. Names no model
 * family. */
#ifndef FY_CU_QUEUE_H
#define FY_CU_QUEUE_H

#include <stddef.h>
#include <stdint.h>

#include "gpu_worker/cuda/cu_common.h"

#define FY_CU_QUEUE 2

/* host ranges a call writes into (gradients noted once as a whole, y or dx, swapped internals,
 * losses) */
#define FY_CU_STAGING_OUTS 12
/* copies timed one by one (each between a pair of events): uploads and downloads of a call; past
 * that, a call's further copies are timed at the rate of those timed (fy_cu_queue_finish) */
#define FY_CU_STAGING_TIMED 64
/* An f32 chunk of the conversion rings holds at most this many floats (64 MiB). */
#define FY_CU_RING_MAX_FLOATS ((size_t)16 << 20)

/* One call's staging: its device buffers, carved by cu_model from its arena, and what finishing
 * the call still has to do. */
struct fy_cu_staging {
    /* the call's weights in bf16 (room for the largest unit), the final norm's (2C) */
    bf16 *wts, *norm_wts;
    /* activations [N][C] bf16: the call's inputs and its output (y or dx) */
    bf16 *x, *dy, *out;
    float *losses;
    int32_t *tokens, *targets;
    int32_t *positions; /* [N]: the call's own (documents), uploaded with its inputs */
    float *host_losses; /* pinned: the per-row losses come home without blocking the queueing */
    cudaEvent_t uploaded, converted, computed, done;
    /* the device time of the copies, each between a pair of events (an upload may first wait for
     * another call's downloads, a download for the compute: neither is copy time) */
    cudaEvent_t ev[2 * FY_CU_STAGING_TIMED];
    int n_ev;                 /* pairs recorded */
    int up_pairs[FY_CU_STAGING_TIMED]; /* 1: pair k timed an upload, 0: a download */
    uint64_t timed_up, timed_down, untimed_up, untimed_down; /* bytes */
    int converts; /* this call converted uploads: its compute waits for the conversion stream */
    /* the head's loss: mean of host_losses over the rows whose target is not ignored, or the sum
     * over loss_count where that is not 0 (the whole batch's targets of several gpu workers) */
    const int32_t *targets_host;
    double *loss;
    uint64_t loss_count;
    /* host floats zeroed when the call is finished (a gradient the call leaves out) */
    float *zero_host;
    size_t zero_n;
    /* the host ranges the call downloads into: a later call that uploads from one of them while
     * this call is in flight must wait for this call's downloads */
    struct {
        const char *p;
        size_t n;
    } outs[FY_CU_STAGING_OUTS];
    int n_outs;
    /* the call's activation output: host buffer and the device buffer it came from */
    const void *act_out_host;
    const bf16 *act_out_dev;
    /* the set of block internals a call given saved host buffers computes in (the family's
     * struct; cu_model's fy_cu_model_swap_sets): one per staging, so it is free again once the
     * call is finished */
    void *swap;
};

/* A ring of two f32 chunks between host data in f32 and device buffers in bf16. */
struct fy_cu_ring {
    float *chunk[2];
    cudaEvent_t ready[2], free[2];
    int used[2], next;
};

struct fy_cu_queue {
    cudaStream_t compute, h2d, d2h, conv;
    /* calls in flight: st[first] is the oldest of `pending` */
    struct fy_cu_staging st[FY_CU_QUEUE];
    int first, pending;
    int ready_fd;  /* eventfd in semaphore mode: one count per call whose results are home */
    int N;         /* rows of a call's activations and losses */
    size_t NC;     /* values of one activation [N][C] */
    int host_bf16; /* activations in host buffers are bf16 (else f32) */
    int host_wbf16; /* weights in host buffers are bf16 (else f32), for calls made from now on */
    /* f32 uploads converted on `conv`, f32 downloads converted on `compute`; ring_n floats a chunk
     * (the chunks are cu_model's, from its arena: fy_cu_queue_ring_floats) */
    struct fy_cu_ring up, down;
    size_t ring_n;
};

/* Floats of a conversion ring's chunk for calls whose largest f32 transfer is `most` floats. */
size_t fy_cu_queue_ring_floats(size_t most);

/* The streams, the staging's events and pinned loss buffers, the rings' events, and the ready
 * descriptor, for calls of N rows and activations of NC values; -EIO or -errno, said. q starts
 * zeroed with ready_fd -1 and its rings' chunks (ring_n floats each) already set; on failure what
 * was made is released by fy_cu_queue_release. */
int fy_cu_queue_init(struct fy_cu_queue *q, int N, size_t NC);
/* Completes every call in flight (nothing may still write into buffers about to be reused). */
void fy_cu_queue_drain(struct fy_cu_queue *q);
/* Drains, then releases what fy_cu_queue_init made. */
void fy_cu_queue_release(struct fy_cu_queue *q);

/* The staging of the next call; -EBUSY (said) with FY_CU_QUEUE calls in flight. */
int fy_cu_queue_begin(struct fy_cu_queue *q, struct fy_cu_staging **st);
/* Queues the end of a call whose body returned rc; a failed body's partial work is drained so
 * that its staging can be reused. Returns rc, or 0 with the call in flight. */
int fy_cu_queue_end(struct fy_cu_queue *q, struct fy_cu_staging *st, int rc);

/* Before fy_cu_queue_uploads_done: bytes from host to dev on the host-to-device stream, after the
 * downloads of calls in flight into that host range. */
int fy_cu_queue_upload(struct fy_cu_queue *q, struct fy_cu_staging *st, void *dev,
                       const void *host, size_t bytes);
/* Bytes of an activation in host buffers (f32 or bf16). */
size_t fy_cu_queue_act_bytes(const struct fy_cu_queue *q);

/* An activation input of a call: from host into the staging's buffer buf, or, where it is the
 * activation output of the call in flight just before (the pipeline's usual case: block b's output
 * is block b+1's input, block b's dx is block b-1's dy), read from that call's device buffer
 * without crossing PCIe twice (the same bits: the host holds their exact widening). `at` is where
 * the kernels read it. */
struct fy_cu_act_in {
    const void *host;
    bf16 *buf;
    const bf16 *at;
};
/* Before fy_cu_queue_uploads_done: queues it, setting a->at. */
int fy_cu_queue_act_in(struct fy_cu_queue *q, struct fy_cu_staging *st, struct fy_cu_act_in *a);

/* Bytes of one weight in host buffers for calls made now (f32 or bf16). */
size_t fy_cu_queue_weight_size(const struct fy_cu_queue *q);
/* Before fy_cu_queue_uploads_done: n weights from host, in the host's dtype for calls made now,
 * into the bf16 device buffer dev (f32 through the conversion ring: rounded to nearest even, as
 * common/base/dtype.h's fy_f32_to_bf16 rounds, so bf16 host weights rounded that way give the same
 * bits). */
int fy_cu_queue_weights_in(struct fy_cu_queue *q, struct fy_cu_staging *st, bf16 *dev,
                           const void *host, size_t n);

/* The compute stream waits for the call's uploads (and their conversions). */
int fy_cu_queue_uploads_done(struct fy_cu_queue *q, struct fy_cu_staging *st);
/* The device-to-host stream waits for the call's compute. */
int fy_cu_queue_compute_done(struct fy_cu_queue *q, struct fy_cu_staging *st);
/* After fy_cu_queue_compute_done: the call's activation output dev (its staging's out) home to
 * host in the host's dtype, recorded as the call's activation output. */
int fy_cu_queue_act_out(struct fy_cu_queue *q, struct fy_cu_staging *st, void *host,
                        const bf16 *dev);
/* bytes from dev to host on the device-to-host stream (after whatever that stream was made to wait
 * for), recorded among the call's outputs. */
int fy_cu_queue_download(struct fy_cu_queue *q, struct fy_cu_staging *st, void *host,
                         const void *dev, size_t bytes);
/* A host range the call's later downloads write into, recorded once as a whole (a gradient that
 * comes home in pieces: fy_cu_queue_download_within for each). */
int fy_cu_queue_note_out(struct fy_cu_queue *q, struct fy_cu_staging *st, const void *host,
                         size_t bytes);
int fy_cu_queue_download_within(struct fy_cu_queue *q, struct fy_cu_staging *st, void *host,
                                const void *dev, size_t bytes);

/* Device time of a call's copies: its uploads' and its downloads', each summed over the copies
 * (without the waits before them). */
struct fy_cu_copy_times {
    float h2d_ms, d2h_ms;
};
/* Waits for the oldest call in flight and completes it (-EINVAL, said, when none is in flight);
 * times (may be NULL) gets the device time of its copies. */
int fy_cu_queue_finish(struct fy_cu_queue *q, struct fy_cu_copy_times *times);

#endif
