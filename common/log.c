/* Logging for people: one line per event, with time, process name and level, on stderr.
 * Errors and debug lines carry file:line so a report points at the code. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static char log_who[16] = "fuyou";
static enum fy_log_level log_threshold = FY_LOG_INFO;
static int log_file_fd = -1;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void fy_log_init(const char *who, enum fy_log_level level)
{
    snprintf(log_who, sizeof log_who, "%s", who);
    log_threshold = level;
    const char *env = getenv("FUYOU_LOG");
    if (env == NULL)
        return;
    for (int i = 0; i <= FY_LOG_DEBUG; i++)
        if (strcasecmp(env, level_names[i]) == 0)
            log_threshold = (enum fy_log_level)i;
}

enum fy_log_level fy_log_level(void) { return log_threshold; }

int fy_log_set_file(const char *path)
{
    /* O_APPEND: every process of the run appends whole lines to the same file. */
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    if (log_file_fd >= 0)
        close(log_file_fd);
    log_file_fd = fd;
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
    ssize_t ignored = write(log_file_fd, out, (size_t)n);
    (void)ignored;
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
    if (log_file_fd >= 0)
        ignored = write(log_file_fd, out + at, (size_t)n);
    (void)ignored;
}

void fy_log_at(enum fy_log_level level, const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fy_log_v(level, file, line, fmt, ap);
    va_end(ap);
}
