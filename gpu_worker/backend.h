/* The compute backend interface of the gpu worker. A backend owns the device (or, for the CPU
 * backend, nothing), can pin the shared pool for fast copies, and computes into host buffers of
 * the pool. The CPU backend is the readable reference; the CUDA backend must match it. */
#ifndef FY_BACKEND_H
#define FY_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "common/model/actplan.h"
#include "common/model/model.h"

struct fy_backend;

/* A block's internals swapped out to host memory (the --act-plan host and ssd placements): at[k]
 * is where kind k (common/model/actplan.h: QKV, ATTN, RESID, FC or GELU) lies, in the backend's own
 * layout (fy_actplan_sizes_backend), NULL for a kind the backward recomputes. The forward writes
 * every kind given; the backward of the same block reads them (the same bits as recomputing,
 * whatever the mix) and leaves them untouched, so a second backward (clipping) may read them
 * again. Other kinds are never given. */
struct fy_block_saved {
    void *at[FY_ACT_KINDS];
};

/* What one block costs on a backend, measured for the activation planner (common/model/actplan.h) on
 * the prepared batch. It lies in a pool region between processes of one build; magic and version
 * catch a region that holds something else. */
#define FY_BLOCK_PROFILE_MAGIC 0x50505946u /* "FYPP" */
#define FY_BLOCK_PROFILE_VERSION 2
struct fy_block_profile {
    uint32_t magic, version;
    /* 1: one product writes FC and GELU (CUDA's fused MLP up) and reruns unless both are given,
     * so keeping either alone saves nothing; their recompute_s are half that product each */
    uint32_t fc_gelu_fused, reserved;
    double fwd_s; /* one block's forward, every op */
    double bwd_s; /* its backward from kept internals (no recomputation) */
    /* the forward op that produces each swappable kind, alone: what keeping that kind saves a
     * backward (see fc_gelu_fused) */
    double recompute_s[FY_ACT_KINDS];
    double flops_per_s;                  /* the QKV product's rate, to estimate other matmuls */
    double h2d_Bps, d2h_Bps, duplex_Bps; /* pool <-> device copies (duplex: both ways at once,
                                            summed); memory copies on the CPU backend */
    uint64_t gpu_free;  /* device memory left for internals' sets after the working buffers */
    uint64_t set_bytes; /* one set of a block's internals, kept or swap (0: the CPU backend keeps
                           none) */
};

struct fy_backend_ops {
    const char *name;
    /* gpu_mem: bytes of device memory the backend may use (its arena), 0 for the backend's default. */
    int (*open)(void **state, uint64_t gpu_mem, char *device, size_t device_len);
    void (*close)(void *state);
    /* Make [base, base+len) of host memory fast for device copies (pinning). */
    int (*register_host)(void *state, void *base, size_t len);
    int (*unregister_host)(void *state, void *base);
    /* out[i] = fy_synth_value(seed, step, tensor, i) as dtype (FY_DTYPE_F32 or FY_DTYPE_BF16),
     * computed on the device and copied into host memory `out` (inside registered memory). */
    int (*synth)(void *state, uint64_t seed, uint64_t step, uint32_t tensor, int dtype, size_t n,
                 void *out);

    /* The model, unit by unit, on host buffers of the pool (the semantics of the CPU backend's
     * family files, gpu_worker/cpu/): weights f32 unless model_weights_bf16 switched them to bf16, gradients f32,
     * activations (x, y, dx, dy) f32 unless model_acts_bf16 switched them to bf16. A backend
     * without these (NULL) cannot train.
     * model_prepare sizes the backend's private scratch for batches of B sequences of T tokens
     * before any other model call. */
    int (*model_prepare)(void *state, const struct fy_model_config *c, int B, int T);
    /* positions [B][T] (host memory, like tokens; NULL: positions[b][t] = t, the windows of the
     * token stream): token t of a row is at position positions[b][t] of its document, which
     * starts at t - positions[b][t] (a document is a contiguous run of a row). The embeddings
     * look learned positions (GPT-2's wpe) up there and add their gradient there; a block rotates
     * q and k (RoPE) by them, and its attention lets token t see token s of its row only when
     * t - positions[b][t] <= s <= t (and t - s < W with a sliding window W): each document
     * attends only to itself. Checked by the caller (gpu_worker/gptexec: every position in 0..t,
     * documents contiguous). A queued call keeps the positions it was made with (they must stay
     * untouched until it is finished, as its other inputs). */
    int (*model_embed_forward)(void *state, const void *embed, const int32_t *tokens,
                               const int32_t *positions, void *x);
    int (*model_embed_backward)(void *state, const int32_t *tokens, const int32_t *positions,
                                const void *dx, float *dembed);
    /* layer: the block's index, 1..n_layer (0: one whose internals are never kept). saved (may
     * be NULL): host buffers for some of the block's internals (struct fy_block_saved), which the
     * forward writes and the backward reads instead of recomputing them. A block's backward takes
     * the positions its forward took. */
    int (*model_block_forward)(void *state, int layer, const void *params, const int32_t *positions,
                               const void *x, void *y, const struct fy_block_saved *saved);
    int (*model_block_backward)(void *state, int layer, const void *params,
                                const int32_t *positions, const void *x, const void *dy, void *dx,
                                float *dparams, const struct fy_block_saved *saved);
    /* dx == NULL: loss only. */
    int (*model_head)(void *state, const void *final_params, const void *embed, const void *x,
                    const int32_t *targets, double *loss, void *dx, float *dfinal, float *dembed);
    /* logits [B*T][V] = lnf(x) wte^T, for evaluation, sampling and tests; always completes. */
    int (*model_logits)(void *state, const void *final_params, const void *embed, const void *x,
                      float *logits);
    /* A backend whose model calls above only queue their work (CUDA: the next call's uploads run
     * while the current one computes) has these; NULL where each call completes before returning.
     * model_finish completes the oldest queued call, waiting if need be, and says how long its
     * copies to and from the device took (device time, seconds); model_ready_fd is readable when
     * that needs no waiting. At most FY_BACKEND_QUEUE calls are queued. */
    int (*model_finish)(void *state, double *h2d_s, double *d2h_s);
    int (*model_ready_fd)(void *state);
    /* Activations in host buffers as bf16 (on) or f32 (off, the default), after model_prepare. A
     * backend that computes them in bf16 anyway (CUDA) has this: the same bits, half the bytes.
     * NULL: f32 only (the CPU backend computes in f32). */
    int (*model_acts_bf16)(void *state, int on);
    /* Keep the forward internals of up to max_layers blocks in device memory left over after
     * model_prepare, so that their backward does not recompute them (the same bits); returns how
     * many blocks it keeps. NULL: the backend always recomputes. */
    int (*model_keep)(void *state, int max_layers);
    /* Readies the backend for blocks whose internals are swapped (saved given): called once after
     * model_prepare and before model_keep, so its device buffers come before any kept sets. NULL
     * where nothing needs readying (the CPU backend). */
    int (*model_swap)(void *state);
    /* Measures struct fy_block_profile after model_prepare and before model_swap and model_keep, on
     * values of its own (the results of other calls are unaffected), copying through `host`
     * (host_bytes of registered memory) to time the links. Completes before returning. */
    int (*model_profile)(void *state, void *host, size_t host_bytes, struct fy_block_profile *out);
    /* Weights (params, embed, final_params) in host buffers as bf16 (on) or f32 (off, the
     * default) for the model calls made from now on, until switched again (a queued call keeps the
     * mode it was made in); gradients stay f32. CUDA computes with bf16 weights anyway: the same
     * bits, half the bytes uploaded. The CPU backend widens them and computes in f32: the results
     * of weights rounded to bf16 first. NULL: f32 only. */
    int (*model_weights_bf16)(void *state, int on);
    /* One-pass clipping with the blocks' gradients held on the device until the norm is known.
     * model_hold takes `count` buffers of a block's f32 gradient (after model_prepare, before
     * model_swap and model_keep, so they come before any kept set; -ENOMEM, said, where they do not
     * fit). model_hold_next: the next block backward made also keeps its gradient in buffer `slot`
     * (one backward: the call after it holds nothing unless asked again). model_hold_send copies
     * buffer `slot` into the host buffer `dparams` (a block's f32 gradient), a call queued and
     * finished like the model calls above, after every call made before it. NULL: the backend
     * cannot hold gradients. */
    int (*model_hold)(void *state, int count);
    int (*model_hold_next)(void *state, int slot);
    int (*model_hold_send)(void *state, int slot, float *dparams);
    /* Several gpu workers, each with a share of the batch (--gpus). model_loss_count: the
     * model_head calls made from now on average their loss and its gradient over `count` targets
     * (the whole batch's, of which the call's are a share) instead of the call's own; 0: its own.
     * A queued call keeps the count it was made with. NULL: one worker only. */
    int (*model_loss_count)(void *state, uint64_t count);
    /* model_rank_id: rank 0 makes the collective library's id of a new group (at most `len`
     * bytes into id, its length returned); model_ranks: joins the group as `rank` of `ranks`
     * (every rank at once: it waits for the others), after which every gradient a model call
     * writes (a block's dparams, the head's dfinal and dembed, the embeddings' dembed) is summed
     * over the ranks on the devices, in the library's fixed order, and only rank 0 writes it to its
     * host buffer; rank 0's embedding backward adds to the host dembed as before, the other
     * ranks' to zeros. NULL: the backend sums nothing itself (the gpu worker then sums the host
     * buffers in rank order, gpu_worker/ranks). */
    int (*model_rank_id)(void *state, void *id, size_t len);
    int (*model_ranks)(void *state, int rank, int ranks, const void *id, size_t len);
};

#define FY_BACKEND_QUEUE 2

/* which: "cpu", "cuda", or "auto" (CUDA when a device is usable, else the CPU backend, said loudly). */
/* The --gpu-mem default's margin: device memory a gpu worker takes outside its arena (the CUDA
 * context, cuBLAS's and cuBLASLt's handles, NCCL's buffers with several GPUs): the larger of
 * FY_BACKEND_GPU_MARGIN_MIN and a twentieth of the device's total, at most half its free memory. */
#define FY_BACKEND_GPU_MARGIN_MIN (1ull << 30)
/* The least free of the first `ranks` GPUs CUDA shows (CUDA_VISIBLE_DEVICES: those the gpu
 * workers of --gpus ranks take, rank R the R-th): its free and total memory into *free_bytes and
 * *total_bytes, its index into *which. Each GPU's context is released again, so the gpu workers
 * find the devices as they were. FUYOU_TEST_GPU_FREE gives the figures instead (common/base/knobs.h).
 * -ENODEV (said) where the build has no CUDA or CUDA shows fewer GPUs, another -errno (said)
 * where CUDA fails. */
int fy_backend_devices_free(int ranks, uint64_t *free_bytes, uint64_t *total_bytes, int *which);
/* The --gpu-mem default of a GPU with free_bytes of total_bytes free: free less the margin
 * (*margin, FY_BACKEND_GPU_MARGIN_MIN's rule). */
uint64_t fy_backend_gpu_mem_default(uint64_t free_bytes, uint64_t total_bytes, uint64_t *margin);
int fy_backend_open(struct fy_backend **out, const char *which, uint64_t gpu_mem);
void fy_backend_close(struct fy_backend **b);
const char *fy_backend_name(const struct fy_backend *b);
const char *fy_backend_device(const struct fy_backend *b);
int fy_backend_register_host(struct fy_backend *b, void *base, size_t len);
int fy_backend_synth(struct fy_backend *b, uint64_t seed, uint64_t step, uint32_t tensor, int dtype,
                     size_t n, void *out);
/* The model operations of the backend (see struct fy_backend_ops); -ENOTSUP with a message when the
 * backend has none. */
int fy_backend_model_prepare(struct fy_backend *b, const struct fy_model_config *c, int B, int T);
/* The activations' dtype in host buffers: FY_DTYPE_F32 (the default) or FY_DTYPE_BF16, which a
 * backend without model_acts_bf16 refuses with a message (-ENOTSUP). After model_prepare. */
int fy_backend_model_act_dtype(struct fy_backend *b, int dtype);
/* The activation dtype a backend would take for the fewest bytes with the same results: bf16 where
 * it computes in bf16 (CUDA), else f32. */
int fy_backend_preferred_act_dtype(const char *backend_name);
/* The weights' dtype in host buffers for the model calls that follow: FY_DTYPE_F32 (the default) or
 * FY_DTYPE_BF16, which a backend without model_weights_bf16 refuses with a message (-ENOTSUP). */
int fy_backend_model_weight_dtype(struct fy_backend *b, int dtype);
/* The weights' dtype a backend takes for the fewest bytes with the same results: bf16 where it
 * computes in bf16 (CUDA), else f32 (on the CPU backend bf16 weights change the results). */
int fy_backend_preferred_weight_dtype(const char *backend_name);
/* What a backend takes of device memory at batch B x T: its working buffers and a block's kept
 * internals. 0 (both zero) where it is not modelled: the CPU backend, or a build without CUDA. */
int fy_backend_gpu_bytes(const char *backend_name, const struct fy_model_config *c, int B, int T,
                         uint64_t *working, uint64_t *set);
/* positions: NULL (positions t, the windows of the token stream) or [B][T] of the prepared batch
 * (see model_embed_forward). Positions that are t everywhere are passed on as NULL: the windows
 * take the backend's code of before, to the same bits. */
int fy_backend_model_embed_forward(struct fy_backend *b, const void *embed, const int32_t *tokens,
                                   const int32_t *positions, void *x);
int fy_backend_model_embed_backward(struct fy_backend *b, const int32_t *tokens,
                                    const int32_t *positions, const void *dx, float *dembed);
/* saved: NULL, or a block's swapped internals (struct fy_block_saved); a backend without swapping
 * refuses them (-ENOTSUP, said). */
int fy_backend_model_block_forward(struct fy_backend *b, int layer, const void *params,
                                   const int32_t *positions, const void *x, void *y,
                                   const struct fy_block_saved *saved);
int fy_backend_model_block_backward(struct fy_backend *b, int layer, const void *params,
                                    const int32_t *positions, const void *x, const void *dy,
                                    void *dx, float *dparams, const struct fy_block_saved *saved);
/* 1 when positions [B][T] are t everywhere (the windows of the token stream), else 0. */
int fy_backend_positions_are_windows(const int32_t *positions, int B, int T);
/* Gradients held on the device (see model_hold): -ENOTSUP (said) for a backend without; slot
 * outside 0..count-1: -EINVAL (said). */
int fy_backend_model_hold(struct fy_backend *b, int count);
int fy_backend_model_hold_next(struct fy_backend *b, int slot);
int fy_backend_model_hold_send(struct fy_backend *b, int slot, float *dparams);
/* Several workers (see model_loss_count, model_rank_id, model_ranks): -ENOTSUP (said) for a
 * backend without; fy_backend_model_sums_ranks says whether model_ranks is there. */
int fy_backend_model_loss_count(struct fy_backend *b, uint64_t count);
int fy_backend_model_sums_ranks(const struct fy_backend *b);
int fy_backend_model_rank_id(struct fy_backend *b, void *id, size_t len);
int fy_backend_model_ranks(struct fy_backend *b, int rank, int ranks, const void *id, size_t len);
/* Blocks whose internals the backend keeps (see model_keep); 0 where it always recomputes. */
int fy_backend_model_keep(struct fy_backend *b, int max_layers);
/* Readies swapping (see model_swap); 0 where the backend needs nothing. */
int fy_backend_model_swap(struct fy_backend *b);
/* See model_profile; -ENOTSUP (said) for a backend without it. */
int fy_backend_model_profile(struct fy_backend *b, void *host, size_t host_bytes,
                           struct fy_block_profile *out);
int fy_backend_model_head(struct fy_backend *b, const void *final_params, const void *embed,
                        const void *x, const int32_t *targets, double *loss, void *dx,
                        float *dfinal, float *dembed);

int fy_backend_model_logits(struct fy_backend *b, const void *final_params, const void *embed,
                          const void *x, float *logits);

/* Queued use. Off (the default), every model call above completes before it returns. On, on a backend
 * that queues, they return once queued and each must be completed, in order, by
 * fy_backend_model_finish (outputs, the head's loss included, are written by then; inputs must stay
 * untouched until then); at most FY_BACKEND_QUEUE in flight. Returns 1 when calls will queue,
 * 0 when the backend completes every call anyway. */
int fy_backend_model_set_queued(struct fy_backend *b, int on);
/* h2d_s, d2h_s (may be NULL): device time of the call's copies to and from the device. */
int fy_backend_model_finish(struct fy_backend *b, double *h2d_s, double *d2h_s);
/* Readable when the oldest queued call can be finished without waiting; -1 without queueing. */
int fy_backend_model_ready_fd(struct fy_backend *b);

/* 1 when this build contains the CUDA backend. */
int fy_backend_cuda_built(void);
/* The CUDA devices this process sees; 0 without the CUDA backend or a device. */
int fy_backend_cuda_devices(void);
/* What "auto" resolves to on this machine: "cuda" when the build has it and a device is visible,
 * else "cpu"; other names come back unchanged. */
const char *fy_backend_resolve(const char *which);

#endif
