/* Element types of tensors in the pool and the store, bf16 <-> fp32 and f16 -> fp32 conversion. */
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

/* IEEE binary16 to fp32, exact for every value: each f16 subnormal is a normal fp32, infinities
 * stay infinite, NaNs keep their sign and payload (bits are moved, no float arithmetic). */
static inline float fy_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1fu) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13); /* rebias 15 -> 127 */
    } else if (man == 0) {
        bits = sign;
    } else {
        /* man * 2^-24: shift the leading one into the implicit bit, lowering the exponent. */
        uint32_t e = 113u;
        while ((man & 0x400u) == 0) {
            man <<= 1;
            e--;
        }
        bits = sign | (e << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#ifdef __cplusplus
}
#endif

#endif
