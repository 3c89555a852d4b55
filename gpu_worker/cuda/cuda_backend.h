/* The CUDA backend of the gpu worker (built when nvcc is present). */
#ifndef FY_CUDA_BACKEND_H
#define FY_CUDA_BACKEND_H

#include "gpu_worker/backend_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const struct fy_backend_ops fy_cuda_backend_ops;
/* 1 when the CUDA runtime sees a device (no context is created). */
int fy_cuda_device_visible(void);
/* The CUDA devices this process sees (CUDA_VISIBLE_DEVICES), 0 where none or CUDA fails. */
int fy_cuda_device_count(void);
/* fy_backend_devices_free's CUDA part: cudaMemGetInfo on each of the first `ranks` devices, each
 * device's primary context released after (cudaDeviceReset). */
int fy_cuda_devices_free(int ranks, uint64_t *free_bytes, uint64_t *total_bytes, int *which);
/* Device bytes of the model's working buffers at batch B x T, and of one block's kept internals
 * (a set); arithmetic only, no device needed. */
void fy_cuda_gpt_gpu_bytes(const struct fy_model_config *c, int B, int T, uint64_t *working,
                           uint64_t *set);

#ifdef __cplusplus
}
#endif

#endif
