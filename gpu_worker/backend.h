/* The compute backend interface of the gpu worker. A backend owns the device (or, for the CPU
 * backend, nothing), can pin the shared pool for fast copies, and computes into host buffers of
 * the pool. The CPU backend is the readable reference; the CUDA backend must match it. */
#ifndef FY_BACKEND_H
#define FY_BACKEND_H

#include <stddef.h>
#include <stdint.h>

struct fy_backend;

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
};

/* which: "cpu", "cuda", or "auto" (CUDA when a device is usable, else the CPU backend, said loudly). */
int fy_backend_open(struct fy_backend **out, const char *which, uint64_t gpu_mem);
void fy_backend_close(struct fy_backend **b);
const char *fy_backend_name(const struct fy_backend *b);
const char *fy_backend_device(const struct fy_backend *b);
int fy_backend_register_host(struct fy_backend *b, void *base, size_t len);
int fy_backend_synth(struct fy_backend *b, uint64_t seed, uint64_t step, uint32_t tensor, int dtype,
                     size_t n, void *out);
/* 1 when this build contains the CUDA backend. */
int fy_backend_cuda_built(void);

#endif
