/* Element types of tensors in the pool and the store: sizes and names. */
#include "common/base/dtype.h"

size_t fy_dtype_size(int dtype)
{
    switch (dtype) {
    case FY_DTYPE_NONE: return 1;
    case FY_DTYPE_F32: return 4;
    case FY_DTYPE_BF16: return 2;
    case FY_DTYPE_I32: return 4;
    case FY_DTYPE_U8: return 1;
    default: return 0;
    }
}

const char *fy_dtype_name(int dtype)
{
    switch (dtype) {
    case FY_DTYPE_NONE: return "bytes";
    case FY_DTYPE_F32: return "f32";
    case FY_DTYPE_BF16: return "bf16";
    case FY_DTYPE_I32: return "i32";
    case FY_DTYPE_U8: return "u8";
    default: return "unknown";
    }
}
