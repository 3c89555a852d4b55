/* Logging for people: one line per event, with time, process name and level, on stderr. */
#ifndef FY_LOG_H
#define FY_LOG_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

enum fy_log_level { FY_LOG_ERROR = 0, FY_LOG_WARN = 1, FY_LOG_INFO = 2, FY_LOG_DEBUG = 3 };

/* who: short process name ("launch", "gpu", "io", "opt"); lines above `level` are not written
 * (the programs give fy_knob_log_level_or's: FUYOU_LOG where set). */
void fy_log_init(const char *who, enum fy_log_level level);
enum fy_log_level fy_log_level(void);
/* Also append every line to this file (the run's log); returns 0 or -errno. Lines the file
 * refuses (a full disk) wait in memory, up to FY_LOG_KEPT_MAX bytes, and go out in order before
 * the next line once it takes them; the failure is said once on stderr, and the lines that went
 * late, or were dropped past that size, in the file once they have. At exit those still waiting
 * are tried once more, else said lost. */
#define FY_LOG_KEPT_MAX (4 << 20)
int fy_log_set_file(const char *path);
void fy_log_at(enum fy_log_level level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void fy_log_v(enum fy_log_level level, const char *file, int line, const char *fmt, va_list ap);
/* A status line kept at the bottom of a terminal (stderr a tty): shown now, redrawn under every
 * line logged after; NULL takes it away. Returns 0 where stderr is not a terminal (nothing shown:
 * the caller logs plain lines instead), 1 where it is. */
int fy_log_status(const char *status);
/* An info line to the log file alone (its stderr twin is the status line). */
void fy_log_file_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define fy_error(...) fy_log_at(FY_LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)
#define fy_warn(...) fy_log_at(FY_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define fy_info(...) fy_log_at(FY_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define fy_debug(...) fy_log_at(FY_LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)

#ifdef __cplusplus
}
#endif

#endif
