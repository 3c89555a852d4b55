/* The host interface's queue of the CUDA backend, for cu_model: up to FY_CU_QUEUE calls in flight,
 * each staged through its own device buffers. A call uploads its inputs on the host-to-device
 * stream, computes on the compute stream and downloads its outputs on the device-to-host stream,
 * each stream waiting on the previous one's event, and returns without waiting, so the next call's
 * uploads (the next layer's weights) run while the current one computes and its results travel
 * home. An upload from a host range that a call in flight downloads into waits for that download;
 * an activation input that is the activation output of the call in flight just before is taken
 * from its device copy instead. fy_cu_queue_finish completes the oldest call (its loss, the host
 * ranges it zeroes, the device time of its copies); the ready descriptor says when that needs no
 * waiting. Names no model family. */
#ifndef FY_CU_QUEUE_H
#define FY_CU_QUEUE_H

#include <stddef.h>
#include <stdint.h>

#include "gpu_worker/cuda/cu_common.h"

#define FY_CU_QUEUE 2

/* a block forward downloads y and up to 6 pieces of swapped internals (qkv, atty, the attention's
 * logsumexp, y1, fc, g); a head, 4 outputs */
#define FY_CU_STAGING_OUTS 8
/* a block backward uploads params, x, dy and up to those 6 pieces */
#define FY_CU_STAGING_UPLOADS 9

/* Device staging of one call in flight, and what finishing it still has to do. The device buffers
 * are cu_model's, carved from its arena. */
struct fy_cu_staging {
    /* wts, norm_wts: a call's weights as uploaded, f32 or bf16 (sized for f32) */
    void *wts, *norm_wts;
    float *grad, *in0, *in1, *out, *losses;
    int32_t *tokens, *targets;
    float *host_losses; /* pinned: the per-row losses come home without blocking the queueing */
    cudaEvent_t uploaded, computed, done;
    /* the device time of the copies: each upload between a pair of events (an upload may first
     * wait for another call's downloads, which is not copy time), the downloads together from
     * d2h_begin to done */
    cudaEvent_t up_ev[2 * FY_CU_STAGING_UPLOADS], d2h_begin;
    int n_up;
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
    /* the call's activation output: host buffer and the device copy it came from */
    const void *act_out_host;
    const bf16 *act_out_dev;
    /* the set of block internals a call given saved host buffers computes in (the family's
     * struct; cu_model's fy_cu_model_swap_sets): one per staging, so it is free again once the
     * call is finished */
    void *swap;
};

struct fy_cu_queue {
    cudaStream_t compute, h2d, d2h;
    /* calls in flight: st[first] is the oldest of `pending` */
    struct fy_cu_staging st[FY_CU_QUEUE];
    int first, pending;
    int ready_fd;  /* eventfd in semaphore mode: one count per call whose results are home */
    int N;         /* rows of a call's activations and losses */
    size_t NC;     /* values of one activation [N][C] */
    int host_bf16; /* activations in host buffers are bf16 (else f32) */
    int host_wbf16; /* weights in host buffers are bf16 (else f32), for calls made from now on */
};

/* The streams, the staging's events and pinned loss buffers, and the ready descriptor, for calls
 * of N rows and activations of NC values; -EIO or -errno, said. q starts zeroed with ready_fd -1;
 * on failure what was made is released by fy_cu_queue_release. */
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

/* An activation input of a call. */
struct fy_cu_act_in {
    const void *host;
    void *staging;    /* upload target (the host's dtype) */
    bf16 *dev;        /* where the kernels read it */
    const bf16 *from; /* set when it comes from the device copy of the call before */
};
/* Queues it: the activation output of the call in flight just before this one (the pipeline's
 * usual case: block b's output is block b+1's input, block b's dx is block b-1's dy) is taken from
 * that call's device copy instead of crossing PCIe twice (the same bits: the host holds their
 * exact widening); any other is uploaded. */
int fy_cu_queue_act_in(struct fy_cu_queue *q, struct fy_cu_staging *st, struct fy_cu_act_in *a);
/* After fy_cu_queue_uploads_done: the input onto its device buffer, on the compute stream. */
int fy_cu_queue_act_place(struct fy_cu_queue *q, const struct fy_cu_act_in *a);

/* A weight input of a call (a unit's parameters, the final norm, the head's weight): n values
 * uploaded into the call's staging in the host's dtype, then placed on the device weights, which
 * the call before may still be computing with until this call's compute starts. */
struct fy_cu_weights_in {
    const void *host;
    void *staging;
    bf16 *dev;
    size_t n;
    int host_bf16; /* the host's dtype when the call was queued */
};
/* Bytes of one weight in host buffers for calls made now (f32 or bf16). */
size_t fy_cu_queue_weight_size(const struct fy_cu_queue *q);
/* Before fy_cu_queue_uploads_done: the upload, of the bytes the host's dtype takes. */
int fy_cu_queue_weights_in(struct fy_cu_queue *q, struct fy_cu_staging *st,
                           struct fy_cu_weights_in *w);
/* After fy_cu_queue_uploads_done, on the compute stream: bf16 from the host is copied as it is,
 * since it holds the bits the conversion would give (both round f32 to nearest even). */
int fy_cu_queue_weights_place(struct fy_cu_queue *q, const struct fy_cu_weights_in *w);

/* The compute stream waits for the call's uploads. */
int fy_cu_queue_uploads_done(struct fy_cu_queue *q, struct fy_cu_staging *st);
/* The device-to-host stream waits for the call's compute. */
int fy_cu_queue_compute_done(struct fy_cu_queue *q, struct fy_cu_staging *st);
/* On the compute stream: the call's activation output from its device buffer into the call's own
 * staging in the host's dtype (the device buffer is the next call's to overwrite). */
int fy_cu_queue_act_out(struct fy_cu_queue *q, struct fy_cu_staging *st, const bf16 *dev);
/* After fy_cu_queue_compute_done: bytes from dev to host on the device-to-host stream, recorded
 * among the call's outputs. */
int fy_cu_queue_download(struct fy_cu_queue *q, struct fy_cu_staging *st, void *host,
                         const void *dev, size_t bytes);

/* Device time of a call's copies: its uploads' summed (without any wait for another call's
 * downloads), and the span of its downloads from when the device-to-host stream reached them. */
struct fy_cu_copy_times {
    float h2d_ms, d2h_ms;
};
/* Waits for the oldest call in flight and completes it (-EINVAL, said, when none is in flight);
 * times (may be NULL) gets the device time of its copies. */
int fy_cu_queue_finish(struct fy_cu_queue *q, struct fy_cu_copy_times *times);

#endif
