/* The CUDA backend of the gpu worker (built when nvcc is present). */
#ifndef FY_CUDA_BACKEND_H
#define FY_CUDA_BACKEND_H

#include "gpu_worker/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const struct fy_backend_ops fy_cuda_backend_ops;
/* 1 when the CUDA runtime sees a device (no context is created). */
int fy_cuda_device_visible(void);

#ifdef __cplusplus
}
#endif

#endif
