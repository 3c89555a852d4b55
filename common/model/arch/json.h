/* What the families' config.json readers and writers share (Hugging Face's config.json, read with
 * cJSON): typed keys, each refusal one line naming the file and the key, and numbers written as
 * transformers writes them. For the family files of this folder. */
#ifndef FY_ARCH_JSON_H
#define FY_ARCH_JSON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cJSON;
struct fy_arch;

/* A positive integer, or def when absent. */
int fy_json_uint(const char *path, const struct cJSON *obj, const char *key, uint32_t def,
                 uint32_t *out);
/* A boolean that must be `want` (def when absent); why says what the backends compute. */
int fy_json_bool(const char *path, const struct cJSON *obj, const char *key, int def, int want,
                 const char *why);
/* A positive number, or def when absent or null. */
int fy_json_number(const char *path, const struct cJSON *obj, const char *key, double def,
                   double *out);
/* architectures absent, or a list of one of the family's names. */
int fy_json_architectures(const char *path, const struct cJSON *root, const struct fy_arch *a);
/* The shortest form that reads back as the same value, always with a fraction or an exponent
 * (1e-05, 10000.0), as transformers writes them. */
void fy_json_float(char *buf, size_t len, float v);
void fy_json_double(char *buf, size_t len, double v);

#ifdef __cplusplus
}
#endif

#endif
