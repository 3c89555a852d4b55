/* Cpu lists (cpulist.h): parsed item by item into hwloc bitmaps, each refusal said in words, and
 * written back in hwloc's normal form. */
#include "common/ipc/cpulist.h"

#include <errno.h>
#include <hwloc.h>
#include <stdio.h>
#include <string.h>

#include "common/base/check.h"
#include "common/base/log.h"

/* Above any real machine's PU index; keeps "0-4000000000" from allocating a huge bitmap. */
#define CPU_LIMIT (1 << 20)

const char *fy_cpulist_skip_spaces(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    return p;
}

static int parse_num(const char **pp, const char *end, long *out)
{
    const char *p = *pp;
    long v = 0;
    if (p >= end || *p < '0' || *p > '9')
        return -EINVAL;
    while (p < end && *p >= '0' && *p <= '9') {
        v = v * 10 + (*p - '0');
        if (v >= CPU_LIMIT)
            return -ERANGE;
        p++;
    }
    *pp = p;
    *out = v;
    return 0;
}

/* One item "N" or "N-M" in [b, e), added to set; on error writes why into err. */
int fy_cpulist_item(const char *b, const char *e, struct hwloc_bitmap_s *set, char *err,
                    size_t errlen)
{
    const char *p = fy_cpulist_skip_spaces(b, e);
    long lo, hi;
    int rc;
    if (p == e) {
        snprintf(err, errlen, "empty item");
        return -EINVAL;
    }
    if ((rc = parse_num(&p, e, &lo)) < 0)
        goto bad;
    hi = lo;
    p = fy_cpulist_skip_spaces(p, e);
    if (p < e && *p == '-') {
        p = fy_cpulist_skip_spaces(p + 1, e);
        if ((rc = parse_num(&p, e, &hi)) < 0)
            goto bad;
        p = fy_cpulist_skip_spaces(p, e);
    }
    if (p != e) {
        rc = -EINVAL;
        goto bad;
    }
    if (hi < lo) {
        snprintf(err, errlen, "range '%.*s' is backwards (write low-high)", (int)(e - b), b);
        return -EINVAL;
    }
    for (long c = lo; c <= hi; c++) {
        if (hwloc_bitmap_isset(set, (unsigned)c)) {
            snprintf(err, errlen, "cpu %ld is listed twice", c);
            return -EINVAL;
        }
        if (hwloc_bitmap_set(set, (unsigned)c) < 0) {
            snprintf(err, errlen, "out of memory");
            return -ENOMEM;
        }
    }
    return 0;
bad:
    if (rc == -ERANGE)
        snprintf(err, errlen, "cpu number in '%.*s' is too large (limit %d)", (int)(e - b), b,
                 CPU_LIMIT - 1);
    else
        snprintf(err, errlen, "'%.*s' is not a cpu number or range like 4 or 2-15", (int)(e - b),
                 b);
    return -EINVAL;
}

/* A whole comma-separated list into set (cleared first). */
int fy_cpulist_to_set(const char *list, struct hwloc_bitmap_s *set, char *err, size_t errlen)
{
    hwloc_bitmap_zero(set);
    if (list == NULL || *fy_cpulist_skip_spaces(list, list + strlen(list)) == 0) {
        snprintf(err, errlen, "empty cpu list");
        return -EINVAL;
    }
    const char *p = list;
    for (;;) {
        const char *comma = strchr(p, ',');
        const char *e = comma ? comma : p + strlen(p);
        int rc = fy_cpulist_item(p, e, set, err, errlen);
        if (rc < 0)
            return rc;
        if (comma == NULL)
            return 0;
        p = comma + 1;
    }
}

int fy_cpulist_parse(const char *list, int *cpus, int max)
{
    char err[256];
    int rc, n = 0;
    hwloc_bitmap_t set = NULL;
    FY_CPUSET_ALLOC_OUT(rc, set);
    rc = fy_cpulist_to_set(list, set, err, sizeof err);
    if (rc < 0) {
        fy_error("cpu list '%s': %s", list ? list : "(null)", err);
        goto out;
    }
    int weight = hwloc_bitmap_weight(set);
    if (cpus != NULL && weight > max) {
        fy_error("cpu list '%s' names %d cpus, more than the %d expected here", list, weight, max);
        rc = -EINVAL;
        goto out;
    }
    if (cpus != NULL) {
        for (int c = hwloc_bitmap_first(set); c >= 0; c = hwloc_bitmap_next(set, c))
            cpus[n++] = c;
    } else {
        n = weight;
    }
    rc = n;
out:
    hwloc_bitmap_free(set);
    return rc;
}

int fy_cpulist_of_set(const struct hwloc_bitmap_s *set, char *buf, size_t len)
{
    int n = hwloc_bitmap_list_snprintf(buf, len, set);
    if (n < 0)
        return -EINVAL;
    if ((size_t)n >= len)
        return -ERANGE;
    return 0;
}
