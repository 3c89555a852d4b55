/* Element types of tensors in the pool and the store, and bf16 <-> fp32 conversion. */
#ifndef FY_DTYPE_H
#define FY_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

enum fy_dtype {
    FY_DTYPE_NONE = 0, /* raw bytes / no elements */
    FY_DTYPE_F32 = 1,
    FY_DTYPE_BF16 = 2,
    FY_DTYPE_I32 = 3,
    FY_DTYPE_U8 = 4,
    FY_DTYPE_COUNT
};

/* Bytes per element (1 for NONE, 0 for an unknown value). */
size_t fy_dtype_size(int dtype);
/* Lower-case name ("f32", "bf16", ...) or "unknown". */
const char *fy_dtype_name(int dtype);

static inline float fy_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Round to nearest even; NaN stays a (quiet) NaN. */
static inline uint16_t fy_f32_to_bf16(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((bits >> 16) | 0x0040u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

#ifdef __cplusplus
}
#endif

#endif
