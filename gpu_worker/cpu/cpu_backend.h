/* The CPU backend of the gpu worker: the readable fp32 reference that runs where there is no GPU. */
#ifndef FY_CPU_BACKEND_H
#define FY_CPU_BACKEND_H

#include "gpu_worker/backend_ops.h"

extern const struct fy_backend_ops fy_cpu_backend_ops;

#endif
