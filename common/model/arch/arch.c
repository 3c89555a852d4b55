/* The registry of model families and what is derived from their tensor tables: unit sizes,
 * offsets, the Hugging Face names. */
#include "common/model/arch/arch.h"

#include <stdio.h>
#include <string.h>

/* Adding a family: its file in this folder, and one line here. */
static const struct fy_arch *const families[] = {&fy_arch_gpt2,  &fy_arch_llama,   &fy_arch_qwen2,
                                                 &fy_arch_qwen3, &fy_arch_mistral, &fy_arch_phi3};

const struct fy_arch *const *fy_arch_all(unsigned *n)
{
    *n = sizeof families / sizeof families[0];
    return families;
}

const struct fy_arch *fy_arch_by_id(uint32_t id)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (families[i]->id == id)
            return families[i];
    return NULL;
}

const struct fy_arch *fy_arch_by_name(const char *name)
{
    for (size_t i = 0; name != NULL && i < sizeof families / sizeof families[0]; i++)
        if (strcmp(families[i]->name, name) == 0)
            return families[i];
    return NULL;
}

const struct fy_arch *fy_arch_by_hf_model_type(const char *model_type)
{
    for (size_t i = 0; model_type != NULL && i < sizeof families / sizeof families[0]; i++)
        if (strcmp(families[i]->hf_model_type, model_type) == 0)
            return families[i];
    return NULL;
}

void fy_arch_names(char *buf, size_t len, int hf_model_types)
{
    size_t at = 0;
    buf[0] = 0;
    for (size_t i = 0; i < sizeof families / sizeof families[0] && at < len; i++) {
        const char *n = hf_model_types ? families[i]->hf_model_type : families[i]->name;
        int w = snprintf(buf + at, len - at, "%s%s", i ? ", " : "", n);
        at += w > 0 ? (size_t)w : 0;
    }
}

const struct fy_arch *fy_model_arch(const struct fy_model_config *c)
{
    return c->arch != NULL ? c->arch : &fy_arch_gpt2;
}

uint64_t fy_tensor_numel(const struct fy_tensor_spec *t)
{
    return t->ndim == 1 ? t->shape[0] : t->shape[0] * t->shape[1];
}

unsigned fy_unit_tensors(const struct fy_model_config *c, unsigned unit,
                         struct fy_tensor_spec out[FY_UNIT_MAX_TENSORS])
{
    unsigned n = fy_model_arch(c)->unit_table(c, fy_model_unit_kind(c, unit), out);
    size_t at = 0;
    for (unsigned i = 0; i < n; i++) {
        out[i].offset = at;
        at += fy_tensor_numel(&out[i]);
    }
    return n;
}

void fy_tensor_hf_name(const struct fy_model_config *c, unsigned unit,
                       const struct fy_tensor_spec *t, char *buf, size_t len)
{
    if (fy_model_unit_kind(c, unit) == FY_UNIT_BLOCK)
        snprintf(buf, len, t->hf_name, unit - 1);
    else
        snprintf(buf, len, "%s", t->hf_name);
}
