/* The registry of model families and what is derived from their tensor tables: unit sizes,
 * offsets, the Hugging Face names, and the helpers the families' config.json readers share. */
#include "common/model/arch/arch.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"

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

int fy_json_uint(const char *path, const cJSON *obj, const char *key, uint32_t def, uint32_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (v == NULL) {
        *out = def;
        return 0;
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    FY_REQUIRE(d >= 1 && d <= 2147483647.0 && d == floor(d), -EINVAL,
               "%s: \"%s\" must be a positive integer", path, key);
    *out = (uint32_t)d;
    return 0;
}

int fy_json_bool(const char *path, const cJSON *obj, const char *key, int def, int want,
                 const char *why)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    FY_REQUIRE(v == NULL || cJSON_IsBool(v), -EINVAL, "%s: \"%s\" must be true or false", path, key);
    int value = v == NULL ? def : cJSON_IsTrue(v);
    FY_REQUIRE(value == want, -EINVAL, "%s: \"%s\": %s is not supported (%s)", path, key,
               value ? "true" : "false", why);
    return 0;
}

int fy_json_number(const char *path, const cJSON *obj, const char *key, double def, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (v == NULL || cJSON_IsNull(v)) {
        *out = def;
        return 0;
    }
    FY_REQUIRE(cJSON_IsNumber(v) && v->valuedouble > 0 && isfinite(v->valuedouble), -EINVAL,
               "%s: \"%s\" must be a positive number", path, key);
    *out = v->valuedouble;
    return 0;
}

int fy_json_architectures(const char *path, const cJSON *root, const struct fy_arch *a)
{
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    if (arch == NULL)
        return 0;
    const cJSON *a0 = cJSON_IsArray(arch) ? cJSON_GetArrayItem(arch, 0) : NULL;
    const char *first = cJSON_IsString(a0) ? a0->valuestring : NULL;
    int known = 0;
    for (const char *const *n = a->hf_architectures; first != NULL && *n != NULL; n++)
        known |= strcmp(first, *n) == 0;
    if (cJSON_GetArraySize(arch) == 1 && known)
        return 0;
    char names[256] = "";
    for (const char *const *n = a->hf_architectures; *n != NULL; n++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
                 n == a->hf_architectures ? "" : " or ", *n);
    fy_error("%s: architectures %s is not supported: model_type %s takes %s checkpoints", path,
             first ? first : "(not a list of one name)", a->hf_model_type, names);
    return -EINVAL;
}

void fy_json_float(char *buf, size_t len, float v)
{
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, len, "%.*g", prec, (double)v);
        if (strtof(buf, NULL) == v)
            break;
    }
    if (strpbrk(buf, ".eE") == NULL && strlen(buf) + 3 <= len)
        strcat(buf, ".0");
}

void fy_json_double(char *buf, size_t len, double v)
{
    if (v == floor(v) && fabs(v) < 1e15) { /* 500000.0, not 5e+05 */
        snprintf(buf, len, "%.1f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    if (strpbrk(buf, ".eE") == NULL && strlen(buf) + 3 <= len)
        strcat(buf, ".0");
}
