/* The compute backend of the gpu worker, opened by name: what the gpu worker and the launcher's
 * in-process runs call. A backend owns the device (or, for the CPU backend, nothing), can pin the
 * shared pool for fast copies, and computes into host buffers of the pool. The CPU backend is the
 * readable reference; the CUDA backend must match it. The backends implement backend_ops.h; this
 * module opens them (the one place that names them) and checks and completes their calls. */
#ifndef FY_BACKEND_H
#define FY_BACKEND_H

#include "gpu_worker/backend_ops.h"

struct fy_backend;

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
/* Closes the backend (unpinning the pool it pinned) and frees it; *b becomes NULL. */
void fy_backend_destroy(struct fy_backend **b);
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
