/* Error-check macros for system, ZeroMQ, hwloc and io_uring calls. Library code returns -errno;
 * each macro logs what failed and where (file:line) with a hint, then returns from the caller.
 *
 * One error style: a function that holds nothing to release returns at the first failure
 * (FY_TRY, FY_SYS, FY_REQUIRE, ...); a function that takes resources (memory, a descriptor, a
 * temporary file) keeps its result in `int rc`, goes to its single unwind at the label `out` at
 * the first failure (FY_TRY_OUT, FY_REQUIRE_OUT), and there releases what it took and returns rc:
 *
 *     int rc = 0;
 *     char *buf = malloc(n);
 *     FY_REQUIRE_OUT(rc, buf != NULL, -ENOMEM, "%s: out of memory", path);
 *     FY_TRY_OUT(rc, read_all(fd, buf, n));
 *     ...
 * out:
 *     free(buf);
 *     return rc;
 */
#ifndef FY_CHECK_H
#define FY_CHECK_H

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/base/log.h"

/* Propagate a negative return code unchanged. */
#define FY_TRY(expr)                                                                               \
    do {                                                                                           \
        int fy_try_rc_ = (expr);                                                                   \
        if (fy_try_rc_ < 0)                                                                        \
            return fy_try_rc_;                                                                     \
    } while (0)

/* As FY_TRY, in a function with an unwind: rc = expr; on a negative rc, to `out`. */
#define FY_TRY_OUT(rc, expr)                                                                       \
    do {                                                                                           \
        (rc) = (expr);                                                                             \
        if ((rc) < 0)                                                                              \
            goto out;                                                                              \
    } while (0)

/* As FY_REQUIRE, in a function with an unwind: log, the code into rc, then to `out`. */
#define FY_REQUIRE_OUT(rc, cond, code, ...)                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fy_error(__VA_ARGS__);                                                                 \
            (rc) = (code);                                                                         \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* A system call that returns -1 and sets errno. The varargs describe the operation. */
#define FY_SYS(expr, ...)                                                                          \
    do {                                                                                           \
        if ((expr) == -1) {                                                                        \
            int fy_errno_ = errno;                                                                 \
            char fy_what_[512];                                                                    \
            snprintf(fy_what_, sizeof fy_what_, __VA_ARGS__);                                      \
            fy_error("%s: %s", fy_what_, strerror(fy_errno_));                                     \
            return -fy_errno_;                                                                     \
        }                                                                                          \
    } while (0)

/* A ZeroMQ call that returns -1 and sets zmq_errno(). */
#define FY_ZMQ(expr, ...)                                                                          \
    do {                                                                                           \
        if ((expr) == -1) {                                                                        \
            int fy_errno_ = zmq_errno();                                                           \
            char fy_what_[512];                                                                    \
            snprintf(fy_what_, sizeof fy_what_, __VA_ARGS__);                                      \
            fy_error("%s: zmq: %s", fy_what_, zmq_strerror(fy_errno_));                            \
            return -fy_errno_;                                                                     \
        }                                                                                          \
    } while (0)

/* A liburing call that returns -errno on failure. */
#define FY_URING(expr, ...)                                                                        \
    do {                                                                                           \
        int fy_rc_ = (expr);                                                                       \
        if (fy_rc_ < 0) {                                                                          \
            char fy_what_[512];                                                                    \
            snprintf(fy_what_, sizeof fy_what_, __VA_ARGS__);                                      \
            fy_error("%s: io_uring: %s", fy_what_, strerror(-fy_rc_));                             \
            return fy_rc_;                                                                         \
        }                                                                                          \
    } while (0)

/* An hwloc call that returns -1 (and usually sets errno). */
#define FY_HWLOC(expr, ...)                                                                        \
    do {                                                                                           \
        if ((expr) < 0) {                                                                          \
            int fy_errno_ = errno ? errno : EINVAL;                                                \
            char fy_what_[512];                                                                    \
            snprintf(fy_what_, sizeof fy_what_, __VA_ARGS__);                                      \
            fy_error("%s: hwloc: %s", fy_what_, strerror(fy_errno_));                              \
            return -fy_errno_;                                                                     \
        }                                                                                          \
    } while (0)

/* As FY_HWLOC, in a function with an unwind: -errno into rc, then to `out`. */
#define FY_HWLOC_OUT(rc, expr, ...)                                                                \
    do {                                                                                           \
        if ((expr) < 0) {                                                                          \
            int fy_errno_ = errno ? errno : EINVAL;                                                \
            char fy_what_[512];                                                                    \
            snprintf(fy_what_, sizeof fy_what_, __VA_ARGS__);                                      \
            fy_error("%s: hwloc: %s", fy_what_, strerror(fy_errno_));                              \
            (rc) = -fy_errno_;                                                                     \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* A condition that must hold; otherwise log and return the given -errno code. */
#define FY_REQUIRE(cond, code, ...)                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fy_error(__VA_ARGS__);                                                                 \
            return (code);                                                                         \
        }                                                                                          \
    } while (0)

/* A refusal of the command line: an option's value out of its range, options that do not go
 * together, or a value that does not fit the run's model or the plan's budgets (--seq beyond the
 * model's context, a batch or pool beyond --cpu-mem or --gpu-mem), found before anything starts;
 * changing the options is the fix. Returned as -FY_EUSAGE, above every errno value (so never
 * given to strerror); fuyou-launch exits 2 for it, as for the option parser's refusals, where
 * -errno codes exit 1. */
#define FY_EUSAGE 4096

/* A condition on the options that must hold; otherwise log and return -FY_EUSAGE. */
#define FY_USAGE(cond, ...) FY_REQUIRE(cond, -FY_EUSAGE, __VA_ARGS__)

/* Whether a transfer failed because the data on the SSD does not match its digest (-EBADMSG) or
 * cannot be read or is cut short (-EIO, -ENODATA), not because of the worker or the run. */
static inline int fy_is_damage(int rc) { return rc == -EBADMSG || rc == -EIO || rc == -ENODATA; }

#endif
