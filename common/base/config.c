/* Run configuration file (key = value lines under a versioned header line), size parsing and an
 * atomic save (temporary file, fsync, rename, fsync of the directory). */
#include "common/base/config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/base/check.h"
#include "common/base/fsutil.h"

static const char config_header[] = "# fuyou run config v1";

void fy_config_init(struct fy_config *c)
{
    memset(c, 0, sizeof *c);
}

int fy_config_set(struct fy_config *c, const char *key, const char *value)
{
    if (strlen(key) >= FY_CONFIG_KEY_MAX || strlen(value) >= FY_CONFIG_VALUE_MAX ||
        strchr(value, '\n') != NULL) {
        fy_error("config key '%s': key or value too long or multi-line", key);
        return -E2BIG;
    }
    for (unsigned i = 0; i < c->count; i++)
        if (strcmp(c->entries[i].key, key) == 0) {
            snprintf(c->entries[i].value, FY_CONFIG_VALUE_MAX, "%s", value);
            return 0;
        }
    if (c->count == FY_CONFIG_MAX_ENTRIES) {
        fy_error("config: more than %d entries", FY_CONFIG_MAX_ENTRIES);
        return -E2BIG;
    }
    snprintf(c->entries[c->count].key, FY_CONFIG_KEY_MAX, "%s", key);
    snprintf(c->entries[c->count].value, FY_CONFIG_VALUE_MAX, "%s", value);
    c->count++;
    return 0;
}

int fy_config_setf(struct fy_config *c, const char *key, const char *fmt, ...)
{
    char value[FY_CONFIG_VALUE_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(value, sizeof value, fmt, ap);
    va_end(ap);
    if (n < 0 || n >= (int)sizeof value) {
        fy_error("config key '%s': value too long", key);
        return -E2BIG;
    }
    return fy_config_set(c, key, value);
}

const char *fy_config_get(const struct fy_config *c, const char *key)
{
    for (unsigned i = 0; i < c->count; i++)
        if (strcmp(c->entries[i].key, key) == 0)
            return c->entries[i].value;
    return NULL;
}

int fy_config_get_u64(const struct fy_config *c, const char *key, int required, uint64_t def,
                      uint64_t *out)
{
    const char *v = fy_config_get(c, key);
    if (v == NULL) {
        FY_REQUIRE(!required, -ENOENT, "%s: missing required key '%s'", c->path, key);
        *out = def;
        return 0;
    }
    if (fy_parse_size(v, out) < 0) {
        fy_error("%s: key '%s' = '%s' is not a non-negative integer or size", c->path, key, v);
        return -EINVAL;
    }
    return 0;
}

int fy_config_get_double(const struct fy_config *c, const char *key, int required, double def,
                         double *out)
{
    const char *v = fy_config_get(c, key);
    if (v == NULL) {
        FY_REQUIRE(!required, -ENOENT, "%s: missing required key '%s'", c->path, key);
        *out = def;
        return 0;
    }
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (errno != 0 || end == v || *end != 0 || !isfinite(x)) {
        fy_error("%s: key '%s' = '%s' is not a finite number", c->path, key, v);
        return -EINVAL;
    }
    *out = x;
    return 0;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *end = s + strlen(s);
    while (end > s && isspace((unsigned char)end[-1]))
        *--end = 0;
    return s;
}

int fy_config_load(struct fy_config *c, const char *path)
{
    fy_config_init(c);
    snprintf(c->path, sizeof c->path, "%s", path);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        int e = errno;
        fy_error("cannot open run config %s: %s", path, strerror(e));
        return -e;
    }
    char line[FY_CONFIG_KEY_MAX + FY_CONFIG_VALUE_MAX + 16];
    int lineno = 0, rc = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        lineno++;
        if (lineno == 1) {
            line[strcspn(line, "\n")] = 0;
            if (strcmp(line, config_header) != 0) {
                fy_error("%s:1: not a fuyou run config (expected '%s')", path, config_header);
                rc = -EBADMSG;
                break;
            }
            continue;
        }
        char *s = trim(line);
        if (*s == 0 || *s == '#')
            continue;
        char *eq = strchr(s, '=');
        if (eq == NULL) {
            fy_error("%s:%d: expected 'key = value'", path, lineno);
            rc = -EINVAL;
            break;
        }
        *eq = 0;
        rc = fy_config_set(c, trim(s), trim(eq + 1));
        if (rc < 0)
            break;
    }
    if (rc == 0 && lineno == 0) {
        fy_error("%s: empty run config", path);
        rc = -EBADMSG;
    }
    fclose(f);
    return rc;
}

int fy_config_save(const struct fy_config *c, const char *path)
{
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    FY_SYS(fd, "cannot create %s", tmp);
    FILE *f = fdopen(fd, "w");
    if (f == NULL) {
        int e = errno;
        close(fd);
        fy_error("fdopen %s: %s", tmp, strerror(e));
        return -e;
    }
    fprintf(f, "%s\n", config_header);
    for (unsigned i = 0; i < c->count; i++)
        fprintf(f, "%s = %s\n", c->entries[i].key, c->entries[i].value);
    int failed = fflush(f) != 0 || fsync(fd) != 0;
    int e = errno;
    if (fclose(f) != 0 && !failed) {
        failed = 1;
        e = errno;
    }
    if (failed) {
        unlink(tmp);
        fy_error("cannot write %s: %s (disk full?)", tmp, strerror(e));
        return -e;
    }
    FY_SYS(rename(tmp, path), "cannot rename %s to %s", tmp, path);
    return fy_fsync_parent(path);
}

int fy_parse_size(const char *text, uint64_t *out)
{
    const char *p = text;
    while (isspace((unsigned char)*p))
        p++;
    if (!isdigit((unsigned char)*p))
        return -EINVAL;
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(p, &end, 10);
    if (errno != 0)
        return -EINVAL;
    uint64_t mult = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': mult = 1ull << 10; end++; break;
    case 'M': mult = 1ull << 20; end++; break;
    case 'G': mult = 1ull << 30; end++; break;
    case 'T': mult = 1ull << 40; end++; break;
    default: break;
    }
    if (mult > 1 && (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0))
        end += strlen(end);
    if (*end != 0)
        return -EINVAL;
    if (v > UINT64_MAX / mult)
        return -ERANGE;
    *out = (uint64_t)v * mult;
    return 0;
}

void fy_format_size(uint64_t bytes, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, len, "%.1f %s", v, units[u]);
}
