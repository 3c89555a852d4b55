/* FY_TRY_OUT, the jump form of common/base/check.h's FY_TRY for the gpu worker's functions that own
 * something to release on failure: one `out:` label that unwinds, as liburing writes it. Defined
 * here only where common/base/check.h does not define it. */
#ifndef FY_TRY_OUT_H
#define FY_TRY_OUT_H

#ifndef FY_TRY_OUT
/* rc = expr; on a negative rc, jumps to the function's `out:` label. */
#define FY_TRY_OUT(rc, expr)                                                                       \
    do {                                                                                           \
        (rc) = (expr);                                                                             \
        if ((rc) < 0)                                                                              \
            goto out;                                                                              \
    } while (0)
#endif

#endif
