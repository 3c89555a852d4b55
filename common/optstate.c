/* A unit's optimizer state layout: [master | adam m | adam v], f32 sections 4 KiB aligned. See
 * optstate.h. */
#include "optstate.h"

static uint64_t align4k(uint64_t v) { return (v + 4095) / 4096 * 4096; }

/* The sections in order: name, descriptor kind, element type. */
static const struct {
    const char *name;
    int kind, dtype;
} parts[FY_OPTSTATE_PARTS] = {
    [FY_OPTSTATE_MASTER] = {"master", FY_KIND_MASTER, FY_DTYPE_F32},
    [FY_OPTSTATE_ADAM_M] = {"adam_m", FY_KIND_ADAM_M, FY_DTYPE_F32},
    [FY_OPTSTATE_ADAM_V] = {"adam_v", FY_KIND_ADAM_V, FY_DTYPE_F32},
};

void fy_optstate_layout_params(uint64_t params, struct fy_optstate_layout *out)
{
    uint64_t at = 0;
    out->params = params;
    out->count = FY_OPTSTATE_PARTS;
    for (unsigned i = 0; i < FY_OPTSTATE_PARTS; i++) {
        struct fy_optstate_section *s = &out->section[i];
        s->name = parts[i].name;
        s->kind = parts[i].kind;
        s->dtype = parts[i].dtype;
        s->offset = at;
        s->bytes = params * fy_dtype_size(s->dtype);
        s->padded = align4k(s->bytes);
        at += s->padded;
    }
    out->bytes = at;
}

void fy_optstate_layout(const struct fy_model_config *c, unsigned unit,
                        struct fy_optstate_layout *out)
{
    fy_optstate_layout_params(fy_model_unit_params(c, unit), out);
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
    struct fy_optstate_layout l;
    fy_optstate_layout(c, unit, &l);
    return l.section[FY_OPTSTATE_MASTER].padded;
}

uint64_t fy_optstate_max_master_bytes(const struct fy_model_config *c)
{
    uint64_t most = 0;
    for (unsigned u = 0; u < fy_model_unit_count(c); u++)
        if (fy_optstate_master_bytes(c, u) > most)
            most = fy_optstate_master_bytes(c, u);
    return most;
}

unsigned fy_optstate_param_bytes(void)
{
    unsigned bytes = 0;
    for (unsigned i = 0; i < FY_OPTSTATE_PARTS; i++)
        bytes += (unsigned)fy_dtype_size(parts[i].dtype);
    return bytes;
}

unsigned fy_optstate_update_param_bytes(int grad_dtype)
{
    return (unsigned)fy_dtype_size(grad_dtype) + 2 * fy_optstate_param_bytes();
}

uint64_t fy_optstate_copy_bytes(const struct fy_model_config *c, unsigned unit)
{
    return align4k(fy_model_unit_params(c, unit) * fy_dtype_size(FY_OPTSTATE_COPY_DTYPE));
}
