/* The CPU backend of the gpu worker: computes directly in host memory, so registration is a no-op. */
#include "cpu_backend.h"

#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include "common/check.h"
#include "common/dtype.h"
#include "common/synth.h"

static int cpu_open(void **state, uint64_t gpu_mem, char *device, size_t device_len)
{
    *state = NULL;
    snprintf(device, device_len, "CPU (%ld online cores)", sysconf(_SC_NPROCESSORS_ONLN));
    return 0;
}

static void cpu_close(void *state) {}
static int cpu_register_host(void *state, void *base, size_t len) { return 0; }
static int cpu_unregister_host(void *state, void *base) { return 0; }

static int cpu_synth(void *state, uint64_t seed, uint64_t step, uint32_t tensor, int dtype,
                     size_t n, void *out)
{
    if (dtype == FY_DTYPE_F32) {
        float *o = out;
        for (size_t i = 0; i < n; i++)
            o[i] = fy_synth_value(seed, step, tensor, i);
        return 0;
    }
    FY_REQUIRE(dtype == FY_DTYPE_BF16, -EINVAL, "synthetic tensor: dtype %s not supported",
               fy_dtype_name(dtype));
    uint16_t *o = out;
    for (size_t i = 0; i < n; i++)
        o[i] = fy_f32_to_bf16(fy_synth_value(seed, step, tensor, i));
    return 0;
}

const struct fy_backend_ops fy_cpu_backend_ops = {
    .name = "cpu",
    .open = cpu_open,
    .close = cpu_close,
    .register_host = cpu_register_host,
    .unregister_host = cpu_unregister_host,
    .synth = cpu_synth,
};
