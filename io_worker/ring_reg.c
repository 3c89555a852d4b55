/* The io_uring engine's registration (io_worker/ring.h): the pool's memory as fixed buffers and the
 * store's files, on both rings. */
#include "io_worker/ring.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/base/check.h"
#include "common/base/log.h"
#include "io_worker/ring_impl.h"

static int iov_cmp(const void *a, const void *b)
{
    const char *x = ((const struct iovec *)a)->iov_base, *y = ((const struct iovec *)b)->iov_base;
    return x < y ? -1 : x > y;
}

int fy_ring_register_memory(struct fy_ring *r, void *base, size_t len)
{
    FY_REQUIRE(base != NULL && len > 0, -EINVAL, "ring: register_memory needs a non-empty range");
    FY_REQUIRE((uintptr_t)base % FY_RING_ALIGN == 0 && len % FY_RING_ALIGN == 0, -EINVAL,
               "ring: memory to register at %p (%zu bytes) must be 4 KiB aligned in address and "
               "length: allocate it with mmap or posix_memalign(4096)",
               base, len);
    FY_REQUIRE(ring_idle(r), -EBUSY,
               "ring: register_memory while transfers are pending: register before submitting");
    char *b = base;
    for (unsigned i = 0; i < r->niov; i++) {
        char *ob = r->iov[i].iov_base;
        FY_REQUIRE(b + len <= ob || b >= ob + r->iov[i].iov_len, -EINVAL,
                   "ring: memory %p (%zu bytes) overlaps memory registered before", base, len);
    }
    size_t total = len;
    for (unsigned i = 0; i < r->niov; i++)
        total += r->iov[i].iov_len;
    struct rlimit rl;
    /* Root (CAP_IPC_LOCK) is not charged; others are, and the kernel's error alone is cryptic. */
    if (geteuid() != 0 && getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        total > rl.rlim_cur)
        fy_warn("ring: registering %zu bytes in all but RLIMIT_MEMLOCK is %llu bytes; unless this "
                "process has CAP_IPC_LOCK this fails: raise it (ulimit -l, memlock in "
                "limits.conf, LimitMEMLOCK= in systemd)",
                total, (unsigned long long)rl.rlim_cur);
    size_t add = (len + RING_MAX_IOV - 1) / RING_MAX_IOV;
    struct iovec *iov = malloc((r->niov + add) * sizeof *iov);
    FY_REQUIRE(iov != NULL, -ENOMEM, "ring: out of memory for %zu iovecs", r->niov + add);
    if (r->niov)
        memcpy(iov, r->iov, r->niov * sizeof *iov);
    unsigned n = r->niov;
    for (size_t off = 0; off < len; off += RING_MAX_IOV) {
        iov[n].iov_base = b + off;
        iov[n].iov_len = len - off < RING_MAX_IOV ? len - off : RING_MAX_IOV;
        n++;
    }
    qsort(iov, n, sizeof *iov, iov_cmp);
    if (r->niov) {
        for (int d = 0; d < 2; d++)
            io_uring_unregister_buffers(&r->side[d].ring);
    }
    free(r->iov);
    r->iov = NULL;
    r->niov = 0;
    for (int d = 0; d < 2; d++) {
        int rc = io_uring_register_buffers(&r->side[d].ring, iov, n);
        if (rc < 0) {
            fy_error("%s ring: registering %zu bytes of memory at %p as %u fixed buffers: %s; "
                     "registered memory counts against RLIMIT_MEMLOCK for non-root users: raise "
                     "it (ulimit -l, memlock in limits.conf) or grant CAP_IPC_LOCK",
                     r->side[d].what, len, base, n, strerror(-rc));
            if (d == 1)
                io_uring_unregister_buffers(&r->side[0].ring);
            free(iov);
            return rc;
        }
    }
    r->iov = iov;
    r->niov = n;
    fy_debug("ring: registered %zu bytes at %p (%u fixed buffers in all)", len, base, n);
    return 0;
}

int fy_ring_register_files(struct fy_ring *r, const int *fds, const char *const *names, unsigned n)
{
    FY_REQUIRE(n > 0 && fds != NULL, -EINVAL, "ring: register_files needs at least one file");
    FY_REQUIRE(ring_idle(r), -EBUSY,
               "ring: register_files while transfers are pending: register before submitting");
    int *nfds = malloc(n * sizeof *nfds);
    char **nnames = calloc(n, sizeof *nnames);
    if (nfds == NULL || nnames == NULL) {
        free(nfds);
        free(nnames);
        fy_error("ring: out of memory for %u files", n);
        return -ENOMEM;
    }
    memcpy(nfds, fds, n * sizeof *nfds);
    int rc = 0;
    for (unsigned i = 0; i < n && rc == 0; i++) {
        char tmp[32];
        snprintf(tmp, sizeof tmp, "fd %d", fds[i]);
        nnames[i] = strdup(names && names[i] ? names[i] : tmp);
        if (nnames[i] == NULL)
            rc = -ENOMEM;
    }
    if (r->nfiles) {
        for (int d = 0; d < 2; d++)
            io_uring_unregister_files(&r->side[d].ring);
    }
    for (int d = 0; d < 2 && rc == 0; d++) {
        rc = io_uring_register_files(&r->side[d].ring, fds, n);
        if (rc < 0) {
            fy_error("%s ring: registering %u files (first %s): %s; each must be an open file "
                     "descriptor",
                     r->side[d].what, n, nnames[0] ? nnames[0] : "?", strerror(-rc));
            if (d == 1)
                io_uring_unregister_files(&r->side[0].ring);
        }
    }
    for (unsigned i = 0; i < r->nfiles; i++)
        free(r->names[i]);
    free(r->names);
    free(r->fds);
    if (rc < 0) {
        for (unsigned i = 0; i < n; i++)
            free(nnames[i]);
        free(nnames);
        free(nfds);
        r->names = NULL;
        r->fds = NULL;
        r->nfiles = 0;
        return rc;
    }
    r->fds = nfds;
    r->names = nnames;
    r->nfiles = n;
    return 0;
}
