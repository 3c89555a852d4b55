/* A unit's optimizer state layout in each format (fp32, bf16, int8), sections 4 KiB aligned. See
 * optstate.h. */
#include "optstate.h"

#include <string.h>

#include "arch/arch.h"

static uint64_t align4k(uint64_t v) { return (v + 4095) / 4096 * 4096; }

static uint64_t int8_blocks(uint64_t n)
{
    return (n + FY_OPTSTATE_INT8_BLOCK - 1) / FY_OPTSTATE_INT8_BLOCK;
}

/* The sections in order: name, descriptor kind. */
static const struct {
    const char *name;
    int kind;
} parts[FY_OPTSTATE_PARTS] = {
    [FY_OPTSTATE_MASTER] = {"master", FY_KIND_MASTER},
    [FY_OPTSTATE_ADAM_M] = {"adam_m", FY_KIND_ADAM_M},
    [FY_OPTSTATE_ADAM_V] = {"adam_v", FY_KIND_ADAM_V},
    [FY_OPTSTATE_ABSMAX] = {"adam_absmax", FY_KIND_ADAM_ABSMAX},
    [FY_OPTSTATE_SMALL] = {"adam_small", FY_KIND_ADAM_SMALL},
};

/* Places tensors t[0..n) (begin, count, decay set) by the format's rule; sets quantized, at and
 * block, and adds up the layout's counts. */
static void place_tensors(int format, struct fy_optstate_tensor *t, unsigned n,
                          struct fy_optstate_layout *out)
{
    out->quantized = out->blocks = out->small = 0;
    for (unsigned i = 0; i < n; i++) {
        t[i].quantized = format == FY_OPTIM_STATE_INT8 && t[i].count >= FY_OPTSTATE_INT8_MIN;
        if (format != FY_OPTIM_STATE_INT8) {
            t[i].at = t[i].begin;
            t[i].block = 0;
        } else if (t[i].quantized) {
            t[i].at = out->quantized;
            t[i].block = out->blocks;
            out->quantized += t[i].count;
            out->blocks += int8_blocks(t[i].count);
        } else {
            t[i].at = out->small;
            t[i].block = 0;
            out->small += t[i].count;
        }
    }
    if (format != FY_OPTIM_STATE_INT8)
        out->quantized = 0;
}

/* The sections' element types and bytes from the counts, then their offsets. */
static void place_sections(int format, uint64_t params, struct fy_optstate_layout *out)
{
    uint64_t bytes[FY_OPTSTATE_PARTS];
    int dtype[FY_OPTSTATE_PARTS];
    dtype[FY_OPTSTATE_MASTER] = FY_DTYPE_F32;
    bytes[FY_OPTSTATE_MASTER] = params * 4;
    if (format == FY_OPTIM_STATE_INT8) {
        out->count = 5;
        dtype[FY_OPTSTATE_ADAM_M] = dtype[FY_OPTSTATE_ADAM_V] = FY_DTYPE_U8;
        bytes[FY_OPTSTATE_ADAM_M] = bytes[FY_OPTSTATE_ADAM_V] = out->quantized;
        dtype[FY_OPTSTATE_ABSMAX] = dtype[FY_OPTSTATE_SMALL] = FY_DTYPE_F32;
        bytes[FY_OPTSTATE_ABSMAX] = 2 * out->blocks * 4;
        bytes[FY_OPTSTATE_SMALL] = 2 * out->small * 4;
    } else {
        out->count = 3;
        int moments = format == FY_OPTIM_STATE_BF16 ? FY_DTYPE_BF16 : FY_DTYPE_F32;
        dtype[FY_OPTSTATE_ADAM_M] = dtype[FY_OPTSTATE_ADAM_V] = moments;
        bytes[FY_OPTSTATE_ADAM_M] = bytes[FY_OPTSTATE_ADAM_V] = params * fy_dtype_size(moments);
    }
    uint64_t at = 0;
    for (unsigned i = 0; i < out->count; i++) {
        struct fy_optstate_section *s = &out->section[i];
        *s = (struct fy_optstate_section){parts[i].name, parts[i].kind, dtype[i], at, bytes[i],
                                          align4k(bytes[i])};
        at += s->padded;
    }
    out->bytes = at;
}

void fy_optstate_layout_params(uint64_t params, int format, struct fy_optstate_layout *out)
{
    memset(out, 0, sizeof *out);
    out->format = format;
    out->params = params;
    struct fy_optstate_tensor t = {.begin = 0, .count = params, .decay = 1};
    place_tensors(format, &t, 1, out);
    place_sections(format, params, out);
}

/* Unit `unit`'s tensors, their parameters and weight decay (not yet placed); returns how many. */
static unsigned unit_tensors(const struct fy_model_config *c, unsigned unit,
                             struct fy_optstate_tensor *out)
{
    struct fy_tensor_spec spec[FY_UNIT_MAX_TENSORS];
    unsigned n = fy_unit_tensors(c, unit, spec);
    for (unsigned i = 0; i < n; i++)
        out[i] = (struct fy_optstate_tensor){.begin = spec[i].offset,
                                             .count = fy_tensor_numel(&spec[i]),
                                             .decay = spec[i].decay};
    return n;
}

unsigned fy_optstate_tensors(const struct fy_model_config *c, unsigned unit,
                             struct fy_optstate_tensor *out)
{
    unsigned n = unit_tensors(c, unit, out);
    struct fy_optstate_layout counts;
    place_tensors(c->optim_state, out, n, &counts);
    return n;
}

void fy_optstate_layout(const struct fy_model_config *c, unsigned unit,
                        struct fy_optstate_layout *out)
{
    memset(out, 0, sizeof *out);
    out->format = c->optim_state;
    struct fy_optstate_tensor t[FY_UNIT_MAX_TENSORS];
    unsigned n = unit_tensors(c, unit, t);
    out->params = n == 0 ? 0 : t[n - 1].begin + t[n - 1].count; /* they lie one after another */
    place_tensors(c->optim_state, t, n, out);
    place_sections(c->optim_state, out->params, out);
}

unsigned fy_optstate_parts(const struct fy_optstate_layout *l, uint64_t state, int layer,
                           struct fy_desc *out)
{
    for (unsigned i = 0; i < l->count; i++) {
        const struct fy_optstate_section *s = &l->section[i];
        out[i] = fy_desc_region(FY_OP_OPT_ADAMW, s->kind, s->dtype, state + s->offset, s->bytes,
                                layer);
    }
    return l->count;
}

void fy_optstate_zero_moments(const struct fy_optstate_layout *l, void *state)
{
    const struct fy_optstate_section *master = &l->section[FY_OPTSTATE_MASTER];
    uint8_t *s = state;
    memset(s + master->offset + master->bytes, 0, l->bytes - master->bytes);
    if (l->format == FY_OPTIM_STATE_INT8) /* codes of zero; absmax 0.0f is all zero bytes */
        memset(s + l->section[FY_OPTSTATE_ADAM_M].offset, FY_OPTSTATE_INT8_ZERO_M,
               l->section[FY_OPTSTATE_ADAM_M].bytes);
}

uint64_t fy_optstate_bytes(const struct fy_model_config *c, unsigned unit)
{
    struct fy_optstate_layout l;
    fy_optstate_layout(c, unit, &l);
    return l.bytes;
}

uint64_t fy_optstate_max_bytes(const struct fy_model_config *c)
{
    uint64_t most = 0;
    for (unsigned u = 0; u < fy_model_unit_count(c); u++)
        if (fy_optstate_bytes(c, u) > most)
            most = fy_optstate_bytes(c, u);
    return most;
}

uint64_t fy_optstate_master_bytes(const struct fy_model_config *c, unsigned unit)
{
    return align4k(fy_model_unit_params(c, unit) * 4);
}

uint64_t fy_optstate_max_master_bytes(const struct fy_model_config *c)
{
    uint64_t most = 0;
    for (unsigned u = 0; u < fy_model_unit_count(c); u++)
        if (fy_optstate_master_bytes(c, u) > most)
            most = fy_optstate_master_bytes(c, u);
    return most;
}

double fy_optstate_param_bytes(int format)
{
    switch (format) {
    case FY_OPTIM_STATE_BF16:
        return 4 + 2 * 2;
    case FY_OPTIM_STATE_INT8:
        return 4 + 2 * 1 + 2 * 4.0 / FY_OPTSTATE_INT8_BLOCK;
    default:
        return 4 + 2 * 4;
    }
}

double fy_optstate_update_param_bytes(int grad_dtype, int format)
{
    return (double)fy_dtype_size(grad_dtype) + 2 * fy_optstate_param_bytes(format);
}

uint64_t fy_optstate_copy_bytes(const struct fy_model_config *c, unsigned unit)
{
    return align4k(fy_model_unit_params(c, unit) * fy_dtype_size(FY_OPTSTATE_COPY_DTYPE));
}
