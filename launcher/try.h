/* FY_TRY_OUT, the jump form of FY_TRY (common/check.h) for a function with one unwind: until
 * common/check.h has it, defined here. The launcher's layers all may include this file. */
#ifndef FY_TRY_H
#define FY_TRY_H

/* rc = expr; on failure (negative) to the function's `out:` label, which releases what the
 * function holds and returns rc. */
#ifndef FY_TRY_OUT
#define FY_TRY_OUT(rc, expr)                                                                       \
    do {                                                                                           \
        (rc) = (expr);                                                                             \
        if ((rc) < 0)                                                                              \
            goto out;                                                                              \
    } while (0)
#endif

#endif
