/* Run configuration: key = value lines in RUN_DIR/run.conf, written by the launcher (atomically) and
 * read by every worker, plus parsing of sizes ("24G") and typed look-ups with clear errors. */
#ifndef FY_CONFIG_H
#define FY_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#define FY_CONFIG_MAX_ENTRIES 128
#define FY_CONFIG_KEY_MAX 64
#define FY_CONFIG_VALUE_MAX 1024

struct fy_config {
    unsigned count;
    char path[1024]; /* where it was loaded from, for messages */
    struct {
        char key[FY_CONFIG_KEY_MAX];
        char value[FY_CONFIG_VALUE_MAX];
    } entries[FY_CONFIG_MAX_ENTRIES];
};

void fy_config_init(struct fy_config *c);
/* Sets (or replaces) key; -E2BIG if the key or value is too long or the table is full. */
int fy_config_set(struct fy_config *c, const char *key, const char *value);
int fy_config_setf(struct fy_config *c, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* NULL when absent. */
const char *fy_config_get(const struct fy_config *c, const char *key);
/* Typed look-ups: -ENOENT when absent and required, -EINVAL when malformed (both logged with the
 * file and key). `def` is used when the key is absent and required == 0. */
int fy_config_get_u64(const struct fy_config *c, const char *key, int required, uint64_t def,
                      uint64_t *out);
int fy_config_get_double(const struct fy_config *c, const char *key, int required, double def,
                         double *out);

/* Loads a file; rejects lines without '=' and a missing or wrong header line, naming file:line. */
int fy_config_load(struct fy_config *c, const char *path);
/* Writes to path.tmp, fsyncs, renames over path and fsyncs the directory. */
int fy_config_save(const struct fy_config *c, const char *path);

/* "4096", "64K", "1M", "24G", "2T" (powers of 1024; a trailing "iB" or "B" is accepted). */
int fy_parse_size(const char *text, uint64_t *out);
/* Writes a size for people: "1.5 GiB". */
void fy_format_size(uint64_t bytes, char *buf, size_t len);

#endif
