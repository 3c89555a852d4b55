/* Deterministic synthetic tensors (counter-based hash, no state): the same value for (seed, step,
 * tensor, index) on the CPU, on the GPU and in test references, so data paths can be checked
 * byte for byte. Header-only because CUDA kernels and C code must share one definition. */
#ifndef FY_SYNTH_H
#define FY_SYNTH_H

#include <stdint.h>

#ifdef __CUDACC__
#define FY_HOST_DEVICE __host__ __device__
#else
#define FY_HOST_DEVICE
#endif

static inline FY_HOST_DEVICE uint64_t fy_synth_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1), exactly representable in float (24 random bits). */
static inline FY_HOST_DEVICE float fy_synth_value(uint64_t seed, uint64_t step, uint32_t tensor,
                                                  uint64_t index)
{
    uint64_t h = fy_synth_mix(seed ^ 0x9e3779b97f4a7c15ull);
    h = fy_synth_mix(h ^ (step * 0xd1b54a32d192ed03ull));
    h = fy_synth_mix(h ^ ((uint64_t)tensor << 32) ^ index);
    return (float)(int32_t)((h >> 40) - (1u << 23)) * (1.0f / 8388608.0f);
}

#endif
