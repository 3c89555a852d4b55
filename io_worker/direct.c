/* The O_DIRECT probe of an SSD path: stat, access and statfs first, so that the usual mistakes
 * (a missing directory, no permission, tmpfs) are named, then a probe file written and read back
 * with O_DIRECT and removed. */
#include "io_worker/direct.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "common/base/check.h"
#include "common/base/log.h"

#define PROBE_BYTES 4096u /* O_DIRECT's alignment, and the probe file's size */
#define TMPFS_MAGIC_ 0x01021994
#define RAMFS_MAGIC_ 0x858458f6

int fy_direct_check(const char *dir)
{
    struct stat st;
    if (stat(dir, &st) < 0) {
        int e = errno;
        fy_error("ssd path %s: %s; create it (mkdir -p) or give an existing directory on an SSD",
                 dir, strerror(e));
        return -e;
    }
    FY_REQUIRE(S_ISDIR(st.st_mode), -ENOTDIR,
               "ssd path %s is not a directory: give a directory on an SSD filesystem", dir);
    FY_SYS(access(dir, W_OK | X_OK),
           "ssd path %s is not writable by this user: fix its permissions or give another one",
           dir);
    struct statfs sf;
    FY_SYS(statfs(dir, &sf), "ssd path %s: statfs", dir);
    FY_REQUIRE(sf.f_type != TMPFS_MAGIC_ && sf.f_type != RAMFS_MAGIC_, -EINVAL,
               "ssd path %s is on tmpfs/ramfs (memory, not an SSD; older kernels refuse O_DIRECT "
               "there): give a directory on an SSD filesystem such as ext4 or xfs",
               dir);
    char probe[4096];
    snprintf(probe, sizeof probe, "%s/.fuyou-direct-probe.%d", dir, (int)getpid());
    int fd = open(probe, O_CREAT | O_TRUNC | O_RDWR | O_DIRECT, 0600);
    if (fd < 0) {
        int e = errno;
        /* Older kernels create the file before refusing O_DIRECT on it. */
        unlink(probe);
        if (e == EINVAL)
            fy_error("ssd path %s: the filesystem does not support O_DIRECT (tmpfs?); give a "
                     "directory on an SSD filesystem such as ext4 or xfs",
                     dir);
        else
            fy_error("ssd path %s: creating probe file %s with O_DIRECT: %s; give a writable "
                     "directory on an SSD filesystem",
                     dir, probe, strerror(e));
        return -e;
    }
    unsigned char *buf = NULL;
    int rc = posix_memalign((void **)&buf, PROBE_BYTES, 2 * PROBE_BYTES);
    if (rc != 0) {
        close(fd);
        unlink(probe);
        fy_error("ssd path %s: out of memory for the O_DIRECT probe", dir);
        return -ENOMEM;
    }
    for (unsigned i = 0; i < PROBE_BYTES; i++)
        buf[i] = (unsigned char)(i * 31u + 7u);
    rc = 0;
    ssize_t w = pwrite(fd, buf, PROBE_BYTES, 0);
    if (w < 0 && (errno == ENOSPC || errno == EDQUOT)) {
        rc = -errno;
        fy_error("ssd path %s: the SSD is full (no room for a 4 KiB probe file): free space "
                 "there or give another ssd path",
                 dir);
    } else if (w != (ssize_t)PROBE_BYTES) {
        rc = w < 0 ? -errno : -EIO;
        fy_error("ssd path %s: an aligned 4 KiB O_DIRECT write to %s at offset 0 failed: %s; "
                 "the filesystem does not support O_DIRECT properly: give a directory on ext4 or "
                 "xfs",
                 dir, probe, w < 0 ? strerror(-rc) : "short write");
    } else {
        ssize_t got = pread(fd, buf + PROBE_BYTES, PROBE_BYTES, 0);
        if (got != (ssize_t)PROBE_BYTES || memcmp(buf, buf + PROBE_BYTES, PROBE_BYTES) != 0) {
            rc = got < 0 ? -errno : -EIO;
            fy_error("ssd path %s: reading back the O_DIRECT probe %s at offset 0 failed: %s; "
                     "give a directory on ext4 or xfs",
                     dir, probe, got < 0 ? strerror(-rc) : "data differs or short read");
        }
    }
    free(buf);
    close(fd);
    if (unlink(probe) < 0 && rc == 0)
        fy_warn("ssd path %s: removing probe file %s: %s", dir, probe, strerror(errno));
    return rc;
}
