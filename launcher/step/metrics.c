/* RUN/metrics.jsonl of a train command, with the lines the file system refused kept in memory
 * until it takes them (launcher/step/metrics.h). */
#include "launcher/step/metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/base/check.h"
#include "common/base/config.h"
#include "common/base/fsutil.h"
#include "common/base/knobs.h"
#include "common/base/log.h"

struct kept_line {
    uint64_t step;
    size_t end;  /* in buf: the byte after its line break */
    int refused; /* a write left it waiting: its going out counts as late */
};

struct fy_metrics {
    char path[PATH_MAX + 16], run_dir[PATH_MAX];
    int fd;    /* O_APPEND; -1: opened again before the next write */
    char *buf; /* the bytes not yet in the file, in order */
    size_t len, buf_cap;
    size_t partial; /* bytes of the first kept line already in the file (a short write) */
    struct kept_line *lines;
    size_t nlines, lines_cap;
    size_t cap;  /* bytes waiting past which the run stops */
    int err;     /* errno of the last refused write */
    int said;    /* the failure was said; not every line has gone out since */
    size_t late; /* lines that went out late since it was said */
    uint64_t late_first, late_last;
};

static int open_append(struct fy_metrics *m)
{
    m->fd = open(m->path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    return m->fd >= 0 ? 0 : -errno;
}

int fy_metrics_open(struct fy_metrics **out, const char *run_dir)
{
    struct fy_metrics *m = calloc(1, sizeof *m);
    FY_REQUIRE(m != NULL, -ENOMEM, "no memory for the metrics of %s", run_dir);
    snprintf(m->run_dir, sizeof m->run_dir, "%s", run_dir);
    snprintf(m->path, sizeof m->path, "%s/metrics.jsonl", run_dir);
    m->cap = FY_METRICS_PENDING_MAX;
    /* test hook: a cap that a test reaches in a few steps */
    int hook = fy_knob_test_metrics_pending_max(&m->cap);
    if (hook < 0) {
        free(m);
        return hook;
    }
    if (hook > 0)
        fy_warn("test hook: training stops once more than %llu bytes of metrics lines wait for "
                "room (FUYOU_TEST_METRICS_PENDING_MAX)",
                (unsigned long long)m->cap);
    m->fd = -1; /* opened by the first line: a run refused before its first step makes no file */
    *out = m;
    return 0;
}

const char *fy_metrics_path(const struct fy_metrics *m) { return m->path; }

void fy_metrics_set_cap(struct fy_metrics *m, size_t bytes) { m->cap = bytes; }

size_t fy_metrics_pending_bytes(const struct fy_metrics *m) { return m->len; }

size_t fy_metrics_pending_lines(const struct fy_metrics *m) { return m->nlines; }

int fy_metrics_over_cap(const struct fy_metrics *m) { return m->len > m->cap; }

/* Writes what waits, in order; 1 when all of it went, 0 when some still waits (m->err says
 * why). The failure is said once; the lines that went out late are said once all have. */
static int flush(struct fy_metrics *m)
{
    size_t done = 0;
    if (m->len > 0 && m->fd < 0 && open_append(m) < 0)
        m->err = errno;
    while (m->fd >= 0 && done < m->len) {
        ssize_t n = write(m->fd, m->buf + done, m->len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            m->err = n < 0 ? errno : EIO;
            break;
        }
        done += (size_t)n;
    }
    size_t k = 0; /* lines now wholly in the file */
    for (; k < m->nlines && m->lines[k].end <= done; k++)
        if (m->lines[k].refused) {
            m->late_first = m->late == 0 ? m->lines[k].step : m->late_first;
            m->late_last = m->lines[k].step;
            m->late++;
        }
    if (k < m->nlines) /* the next line's bytes written so far */
        m->partial = k == 0 ? m->partial + done : done - m->lines[k - 1].end;
    else
        m->partial = 0;
    memmove(m->buf, m->buf + done, m->len - done);
    m->len -= done;
    for (size_t i = k; i < m->nlines; i++) {
        m->lines[i - k] = m->lines[i];
        m->lines[i - k].end -= done;
    }
    m->nlines -= k;
    if (m->nlines > 0) {
        for (size_t i = 0; i < m->nlines; i++)
            m->lines[i].refused = 1;
        if (!m->said) {
            char cap[32];
            fy_format_size(m->cap, cap, sizeof cap);
            fy_warn("cannot write %s: %s: training goes on, its metrics lines are kept in memory "
                    "(up to %s) and appended once there is room; free space on the file system "
                    "of %s",
                    m->path, strerror(m->err), cap, m->run_dir);
            m->said = 1;
        }
        return 0;
    }
    if (m->said && m->late > 0)
        fy_info("%s: there is room again: %zu metrics line%s kept in memory (steps %llu to %llu) "
                "appended late",
                m->path, m->late, m->late == 1 ? "" : "s", (unsigned long long)m->late_first,
                (unsigned long long)m->late_last);
    m->said = 0;
    m->late = 0;
    if (m->buf_cap > ((size_t)1 << 20)) { /* a long wait's buffer is not kept */
        free(m->buf);
        m->buf = NULL;
        m->buf_cap = 0;
    }
    return 1;
}

int fy_metrics_append(struct fy_metrics *m, uint64_t step, const char *line)
{
    size_t n = strlen(line) + 1;
    if (m->len + n > m->buf_cap) {
        size_t cap = m->buf_cap ? m->buf_cap : 4096;
        while (cap < m->len + n)
            cap *= 2;
        char *buf = realloc(m->buf, cap);
        FY_REQUIRE(buf != NULL, -ENOMEM, "no memory to keep the metrics line of step %llu",
                   (unsigned long long)step);
        m->buf = buf;
        m->buf_cap = cap;
    }
    if (m->nlines == m->lines_cap) {
        size_t cap = m->lines_cap ? 2 * m->lines_cap : 16;
        struct kept_line *lines = realloc(m->lines, cap * sizeof *lines);
        FY_REQUIRE(lines != NULL, -ENOMEM, "no memory to keep the metrics line of step %llu",
                   (unsigned long long)step);
        m->lines = lines;
        m->lines_cap = cap;
    }
    memcpy(m->buf + m->len, line, n - 1);
    m->buf[m->len + n - 1] = '\n';
    m->len += n;
    m->lines[m->nlines++] = (struct kept_line){.step = step, .end = m->len};
    flush(m);
    return 0;
}

/* What rollback to `step` does with one line of the file: 1 drops it. *counted: it is the line of
 * a step after `step`; *stale: an incomplete last line this process did not write. The file's
 * incomplete last line is this process's own where its rest waits (own_step: its step). */
static int dropped_line(const char *line, size_t len, uint64_t step, int own, uint64_t own_step,
                        int *counted, int *stale)
{
    unsigned long long at;
    int parsed = sscanf(line, "{\"step\": %llu", &at) == 1;
    *counted = 0;
    *stale = 0;
    if (len > 0 && line[len - 1] == '\n') {
        *counted = parsed && at > step;
        return *counted;
    }
    if (own) /* counted with the waiting lines */
        return own_step > step;
    *stale = 1;
    *counted = parsed && at > step;
    return 1;
}

/* The file without the lines rollback drops, through a temporary file renamed over it. */
static int rewrite(const char *path, uint64_t step, int own, uint64_t own_step)
{
    FILE *in = fopen(path, "r");
    FY_SYS(in == NULL ? -1 : 0, "cannot open %s", path);
    char tmp[PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *out = fopen(tmp, "w");
    if (out == NULL) {
        int e = errno;
        fclose(in);
        fy_error("cannot create %s: %s", tmp, strerror(e));
        return -e;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int counted, stale;
    while ((len = getline(&line, &cap, in)) >= 0)
        if (!dropped_line(line, (size_t)len, step, own, own_step, &counted, &stale))
            fwrite(line, 1, (size_t)len, out);
    free(line);
    fclose(in);
    return fy_file_replace(out, tmp, path);
}

/* Drops the file's lines that rollback to `step` drops: where they are its tail (as a run
 * appends them) it is cut, which needs no room on a full disk; else rewritten. Returns how many
 * lines of later steps went, or -errno (said). */
static int rollback_file(struct fy_metrics *m, uint64_t step)
{
    int own = m->nlines > 0 && m->partial > 0;
    uint64_t own_step = own ? m->lines[0].step : 0;
    FILE *in = fopen(m->path, "r");
    if (in == NULL && errno == ENOENT)
        return 0;
    FY_SYS(in == NULL ? -1 : 0, "cannot open %s", m->path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    off_t at = 0, cut = -1;
    int dropped = 0, tail = 1, stale = 0;
    while ((len = getline(&line, &cap, in)) >= 0) {
        int counted, was_stale;
        if (dropped_line(line, (size_t)len, step, own, own_step, &counted, &was_stale)) {
            cut = cut < 0 ? at : cut;
            dropped += counted;
            stale |= was_stale && !counted;
        } else if (cut >= 0) {
            tail = 0;
        }
        at += len;
    }
    free(line);
    fclose(in);
    if (cut < 0)
        return 0;
    int rc = 0;
    if (tail) {
        int fd = open(m->path, O_WRONLY | O_CLOEXEC);
        FY_SYS(fd, "cannot open %s", m->path);
        if (ftruncate(fd, cut) != 0 || fsync(fd) != 0) {
            rc = -errno;
            fy_error("cannot cut %s back to the last commit (step %llu): %s", m->path,
                     (unsigned long long)step, strerror(-rc));
        }
        close(fd);
    } else {
        rc = rewrite(m->path, step, own, own_step);
    }
    if (rc == 0 && stale)
        fy_info("%s: its incomplete last line (a launcher stopped while writing it) was removed",
                m->path);
    return rc < 0 ? rc : dropped;
}

/* Drops the waiting lines of steps after `step`; returns how many. *fragment: the bytes in the file
 * of the first of them, where it was written in part (to cut), else 0. */
static int drop_kept(struct fy_metrics *m, uint64_t step, size_t *fragment)
{
    size_t w = 0, kept = 0;
    int dropped = 0;
    *fragment = 0;
    for (size_t i = 0; i < m->nlines; i++) {
        size_t start = i == 0 ? 0 : m->lines[i - 1].end, bytes = m->lines[i].end - start;
        if (m->lines[i].step > step) {
            dropped++;
            if (i == 0) {
                *fragment = m->partial;
                m->partial = 0;
            }
            continue;
        }
        memmove(m->buf + w, m->buf + start, bytes);
        m->lines[kept] = m->lines[i];
        m->lines[kept++].end = w + bytes;
        w += bytes;
    }
    m->len = w;
    m->nlines = kept;
    return dropped;
}

int fy_metrics_rollback(struct fy_metrics *m, uint64_t step)
{
    if (m->fd >= 0) /* a rewrite renames another file over it */
        close(m->fd);
    m->fd = -1;
    int dropped = rollback_file(m, step); /* a fragment of a dropped line among them */
    if (dropped < 0)
        return dropped;
    size_t fragment;
    dropped += drop_kept(m, step, &fragment);
    if (open_append(m) < 0) /* tried again before the next write */
        m->err = errno;
    return dropped;
}

int fy_metrics_stopped(const struct fy_metrics *m, uint64_t committed)
{
    char kept[32], cap[32];
    fy_format_size(m->len, kept, sizeof kept);
    fy_format_size(m->cap, cap, sizeof cap);
    fy_error("%s: %s of metrics lines (steps %llu to %llu) wait in memory for room on its file "
             "system (%s), more than the %s kept: training stopped at step %llu, which is "
             "committed; free space on the file system of %s, then continue with fuyou-launch "
             "resume %s",
             m->path, kept, (unsigned long long)(m->nlines ? m->lines[0].step : 0),
             (unsigned long long)(m->nlines ? m->lines[m->nlines - 1].step : 0), strerror(m->err),
             cap, (unsigned long long)committed, m->run_dir, m->run_dir);
    return -ENOBUFS;
}

int fy_metrics_close(struct fy_metrics **mp, uint64_t committed)
{
    struct fy_metrics *m = *mp;
    if (m == NULL)
        return 0;
    int rc = 0;
    size_t fragment; /* the lines of later steps are trained again, with their lines */
    drop_kept(m, committed, &fragment);
    if (m->nlines > 0 && !flush(m)) {
        rc = -m->err;
        fy_error("%s: %zu metrics line%s of committed steps (%llu to %llu) could not be written "
                 "(%s) and are lost; free space on the file system of %s before the next run",
                 m->path, m->nlines, m->nlines == 1 ? "" : "s",
                 (unsigned long long)m->lines[0].step,
                 (unsigned long long)m->lines[m->nlines - 1].step, strerror(m->err), m->run_dir);
        fragment = m->partial;
    }
    struct stat st; /* the start of a line whose rest is gone; else the next rollback cuts it */
    if (fragment > 0 && m->fd >= 0 && fstat(m->fd, &st) == 0 && (size_t)st.st_size >= fragment &&
        ftruncate(m->fd, st.st_size - (off_t)fragment) != 0)
        fy_debug("cutting the incomplete last line of %s: %s", m->path, strerror(errno));
    if (m->fd >= 0 && close(m->fd) != 0 && rc == 0) {
        rc = -errno;
        fy_error("writing %s failed: %s", m->path, strerror(-rc));
    }
    free(m->buf);
    free(m->lines);
    free(m);
    *mp = NULL;
    return rc;
}
