/* File-system helpers for durable writes: whole-buffer writes and directory fsync. */
#include "fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

int fy_write_all(int fd, const void *buf, size_t len, const char *name, uint64_t offset)
{
    const char *p = buf;
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(fd, p + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            fy_error("cannot write %s at offset %llu: %s%s", name,
                     (unsigned long long)(offset + done), strerror(e),
                     e == ENOSPC ? " (disk full: free space or choose another directory)" : "");
            return -e;
        }
        done += (size_t)n;
    }
    return 0;
}

int fy_fsync_dir(const char *dir)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    FY_SYS(dfd, "cannot open directory %s to make a rename in it durable", dir);
    int rc = fsync(dfd);
    int e = errno;
    close(dfd);
    if (rc != 0) {
        fy_error("fsync of directory %s: %s", dir, strerror(e));
        return -e;
    }
    return 0;
}

int fy_fsync_parent(const char *path)
{
    char copy[PATH_MAX];
    snprintf(copy, sizeof copy, "%s", path);
    return fy_fsync_dir(dirname(copy));
}

int fy_file_replace(FILE *f, const char *tmp, const char *path)
{
    int rc = fflush(f) == 0 && fsync(fileno(f)) == 0 ? 0 : -errno;
    if (fclose(f) != 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, path) != 0)
        rc = -errno;
    if (rc < 0) {
        unlink(tmp);
        fy_error("cannot write %s: %s (is the disk full?)", path, strerror(-rc));
        return rc;
    }
    return fy_fsync_parent(path);
}

int fy_file_write_text(const char *path, const char *text)
{
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL) {
        int err = errno;
        fy_error("cannot create %s: %s", tmp, strerror(err));
        return -err;
    }
    fprintf(f, "%s\n", text);
    return fy_file_replace(f, tmp, path);
}

static _Thread_local int remove_failed; /* the first errno of fy_remove_tree's walk */

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if ((type == FTW_DP ? rmdir(path) : unlink(path)) == 0 || errno == ENOENT)
        return 0;
    int e = errno;
    fy_error("cannot remove %s: %s", path, strerror(e));
    if (remove_failed == 0)
        remove_failed = e;
    return 0; /* the rest is removed all the same */
}

int fy_remove_tree(const char *path)
{
    if (access(path, F_OK) != 0 && errno == ENOENT)
        return 0;
    remove_failed = 0;
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) != 0) {
        int e = errno;
        fy_error("cannot remove %s: %s", path, strerror(e));
        return -e;
    }
    return -remove_failed;
}
