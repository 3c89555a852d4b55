/* Logging for people: one line per event, with time, process name and level, on stderr.
 * Errors and debug lines carry file:line so a report points at the code. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "common/base/log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char log_who[16] = "fuyou";
static enum fy_log_level log_threshold = FY_LOG_INFO;
static int log_file_fd = -1;
static char log_file_path[PATH_MAX];

/* Lines the log file refused (a full disk), kept in this process to be appended in order once it
 * takes them: buf holds whole lines but the first, whose start is in the file where a write was
 * short. Past FY_LOG_KEPT_MAX bytes, new lines are counted as dropped instead. */
static struct {
    pthread_mutex_t lock;
    char *buf;
    size_t len, cap;
    unsigned long long lines, late, dropped; /* waiting, gone out late, dropped */
    int err;           /* the errno of the last refused write */
    int said;          /* the failure was said on stderr; not all has gone out since */
    int overflow_said; /* the dropping was said */
} kept = {.lock = PTHREAD_MUTEX_INITIALIZER};

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void fy_log_init(const char *who, enum fy_log_level level)
{
    snprintf(log_who, sizeof log_who, "%s", who);
    log_threshold = level;
}

enum fy_log_level fy_log_level(void) { return log_threshold; }

static void kept_at_exit(void);

int fy_log_set_file(const char *path)
{
    /* O_APPEND: every process of the run appends whole lines to the same file. */
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    pthread_mutex_lock(&kept.lock);
    if (log_file_fd >= 0)
        close(log_file_fd);
    else
        atexit(kept_at_exit); /* fails only without memory, where the lines are not the worry */
    log_file_fd = fd;
    snprintf(log_file_path, sizeof log_file_path, "%s", path);
    pthread_mutex_unlock(&kept.lock);
    return 0;
}

static char log_status[512]; /* the status line shown on the terminal, or "" */

/* Formats a log line as fy_log_v writes it; returns its length. */
static int format_line(char *out, size_t cap, enum fy_log_level level, const char *where,
                       const char *msg)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct tm tm;
    gmtime_r(&now.tv_sec, &tm);
    int n = snprintf(out, cap, "%02d:%02d:%02d.%03ld [%s %d] %s: %s%s\n", tm.tm_hour, tm.tm_min,
                     tm.tm_sec, now.tv_nsec / 1000000, log_who, (int)getpid(),
                     level_names[level], msg, where);
    return n > (int)cap - 1 ? (int)cap - 1 : n;
}

/* A line on stderr alone, about the log file itself (through fy_log_v it would loop). */
static void say_on_stderr(enum fy_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void say_on_stderr(enum fy_log_level level, const char *fmt, ...)
{
    char msg[1024], out[1280];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int n = format_line(out, sizeof out, level, "", msg);
    ssize_t ignored = write(STDERR_FILENO, out, (size_t)n);
    (void)ignored;
}

/* Writes a line to the log file: 0, or -errno with *done the bytes of it that went (a short
 * write's rest is tried again, and then refused on a full disk). */
static int write_line(const char *line, size_t n, size_t *done)
{
    *done = 0;
    while (*done < n) {
        ssize_t w = write(log_file_fd, line + *done, n - *done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? -errno : -EIO;
        *done += (size_t)w;
    }
    return 0;
}

/* Keeps the rest of a refused line, or counts it dropped past FY_LOG_KEPT_MAX (caller holds the
 * lock). */
static void keep(const char *rest, size_t n)
{
    if (kept.len + n > FY_LOG_KEPT_MAX) {
        if (!kept.overflow_said)
            say_on_stderr(FY_LOG_WARN, "the lines kept for the run log %s fill their %d MiB: "
                          "later ones are dropped from it until it can be written (stderr has "
                          "them, but for a terminal's per-step lines)", log_file_path,
                          FY_LOG_KEPT_MAX >> 20);
        kept.overflow_said = 1;
        kept.dropped++;
        return;
    }
    if (kept.len + n > kept.cap) {
        size_t cap = kept.cap ? kept.cap : 16384;
        while (cap < kept.len + n)
            cap *= 2;
        char *buf = realloc(kept.buf, cap);
        if (buf == NULL) {
            kept.dropped++;
            return;
        }
        kept.buf = buf;
        kept.cap = cap;
    }
    memcpy(kept.buf + kept.len, rest, n);
    kept.len += n;
    kept.lines++;
}

/* The kept lines, one write each, in order, then a line that says how many went late (and how
 * many were dropped); 1 when all that went, 0 while the file still refuses (caller holds the
 * lock). */
static int flush_kept(void)
{
    size_t head = 0, done;
    int rc = 0;
    while (head < kept.len) {
        const char *nl = memchr(kept.buf + head, '\n', kept.len - head);
        size_t n = nl != NULL ? (size_t)(nl - (kept.buf + head)) + 1 : kept.len - head;
        rc = write_line(kept.buf + head, n, &done);
        head += done;
        if (rc < 0)
            break;
        kept.lines--;
        kept.late++;
    }
    if (head > 0) {
        memmove(kept.buf, kept.buf + head, kept.len - head);
        kept.len -= head;
    }
    char msg[700], out[1280];
    int n = 0;
    if (rc == 0) {
        snprintf(msg, sizeof msg, "the run log %s is written again: %llu line%s that it refused "
                 "(%s) appended late", log_file_path, kept.late, kept.late == 1 ? "" : "s",
                 strerror(kept.err));
        if (kept.dropped > 0)
            snprintf(msg + strlen(msg), sizeof msg - strlen(msg), "; %llu line%s dropped here, "
                     "past the %d MiB kept in memory", kept.dropped, kept.dropped == 1 ? "" : "s",
                     FY_LOG_KEPT_MAX >> 20);
        n = format_line(out, sizeof out, kept.dropped > 0 ? FY_LOG_WARN : FY_LOG_INFO, "", msg);
        rc = write_line(out, (size_t)n, &done);
        if (rc < 0 && done > 0) /* its start is in the file: its rest waits as a line's would */
            keep(out + done, (size_t)n - done);
    }
    if (rc < 0) {
        kept.err = -rc;
        return 0;
    }
    ssize_t ignored = write(STDERR_FILENO, out, (size_t)n);
    (void)ignored;
    free(kept.buf);
    kept.buf = NULL;
    kept.len = kept.cap = 0;
    kept.lines = kept.late = kept.dropped = 0;
    kept.said = kept.overflow_said = 0;
    return 1;
}

/* One line to the log file, in one write, after the lines that wait; what the file refuses waits
 * in memory, said once on stderr. */
static void file_line(const char *line, size_t n)
{
    pthread_mutex_lock(&kept.lock);
    size_t done = 0;
    int rc = kept.said && !flush_kept() ? -kept.err : write_line(line, n, &done);
    if (rc < 0) {
        kept.err = -rc;
        keep(line + done, n - done);
        if (!kept.said)
            say_on_stderr(FY_LOG_WARN, "cannot write the run log %s: %s: its lines are kept in "
                          "memory (up to %d MiB) and appended once there is room; free space on "
                          "that file system", log_file_path, strerror(kept.err),
                          FY_LOG_KEPT_MAX >> 20);
        kept.said = 1;
    }
    pthread_mutex_unlock(&kept.lock);
}

/* At exit the lines that wait are tried once more; those the file still refuses are said lost
 * from it (stderr has them, but for the per-step lines that a terminal's status line shows). */
static void kept_at_exit(void)
{
    pthread_mutex_lock(&kept.lock);
    if (log_file_fd >= 0 && kept.said && !flush_kept())
        say_on_stderr(FY_LOG_WARN, "the run log %s lacks %llu line%s of this process (%s): "
                      "stderr has %s, but for a terminal's per-step lines", log_file_path,
                      kept.lines + kept.dropped, kept.lines + kept.dropped == 1 ? "" : "s",
                      strerror(kept.err), kept.lines + kept.dropped == 1 ? "it" : "them");
    pthread_mutex_unlock(&kept.lock);
}

int fy_log_status(const char *status)
{
    if (!isatty(STDERR_FILENO))
        return 0;
    char out[600];
    int n = snprintf(out, sizeof out, "\r\033[K%s", status != NULL ? status : "");
    if (n > (int)sizeof out - 1)
        n = (int)sizeof out - 1;
    ssize_t ignored = write(STDERR_FILENO, out, (size_t)n);
    (void)ignored;
    snprintf(log_status, sizeof log_status, "%s", status != NULL ? status : "");
    return 1;
}

void fy_log_file_info(const char *fmt, ...)
{
    if (log_file_fd < 0 || FY_LOG_INFO > log_threshold)
        return;
    char msg[1024], out[1280];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int n = format_line(out, sizeof out, FY_LOG_INFO, "", msg);
    file_line(out, (size_t)n);
}

void fy_log_v(enum fy_log_level level, const char *file, int line, const char *fmt, va_list ap)
{
    if (level > log_threshold)
        return;
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    char where[96] = "";
    if (level == FY_LOG_ERROR || log_threshold == FY_LOG_DEBUG) {
        const char *base = strrchr(file, '/');
        snprintf(where, sizeof where, " (%s:%d)", base ? base + 1 : file, line);
    }
    /* One write per line so lines of concurrent processes sharing stderr do not interleave; a
     * status line is cleared before it and drawn again after it. */
    char out[1280 + 600];
    int at = log_status[0] ? snprintf(out, sizeof out, "\r\033[K") : 0;
    int n = format_line(out + at, 1280, level, where, msg);
    int total = at + n;
    if (log_status[0])
        total += snprintf(out + total, sizeof out - (size_t)total, "%s", log_status);
    ssize_t ignored = write(STDERR_FILENO, out, (size_t)total);
    (void)ignored;
    if (log_file_fd >= 0)
        file_line(out + at, (size_t)n);
}

void fy_log_at(enum fy_log_level level, const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fy_log_v(level, file, line, fmt, ap);
    va_end(ap);
}
