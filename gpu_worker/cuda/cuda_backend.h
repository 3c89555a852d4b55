/* The CUDA backend of the gpu worker (built when nvcc is present). */
#ifndef FY_CUDA_BACKEND_H
#define FY_CUDA_BACKEND_H

#include "gpu_worker/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const struct fy_backend_ops fy_cuda_backend_ops;

#ifdef __cplusplus
}
#endif

#endif
