/* What the families' config.json readers and writers share (json.h). */
#include "common/model/arch/json.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"
#include "common/model/arch/arch.h"

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
    FY_REQUIRE(v == NULL || cJSON_IsBool(v), -EINVAL, "%s: \"%s\" must be true or false", path,
               key);
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
