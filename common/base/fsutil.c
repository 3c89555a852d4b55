/* File-system helpers for durable writes: whole-buffer writes, directory fsync, and an output's
 * missing directories made and, after a failure, removed again; and a small file read whole. */
#include "common/base/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/base/check.h"

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

ssize_t fy_file_read_text(const char *path, char *buf, size_t len, int *incomplete)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -errno;
    size_t n = fread(buf, 1, len - 1, f);
    if (incomplete != NULL)
        *incomplete = ferror(f) || (n == len - 1 && fgetc(f) != EOF);
    fclose(f);
    buf[n] = 0;
    return (ssize_t)n;
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

int fy_mkdirs(const char *dir, mode_t mode, const char *what, struct fy_made_dirs *made)
{
    struct fy_made_dirs local;
    struct fy_made_dirs *m = made != NULL ? made : &local;
    m->n = 0;
    size_t len = strlen(dir);
    FY_REQUIRE(len > 0 && len < sizeof m->path, -ENAMETOOLONG, "%s %.200s: %s", what, dir,
               len ? "the path is too long" : "the path is empty");
    memcpy(m->path, dir, len + 1);
    while (len > 1 && m->path[len - 1] == '/')
        m->path[--len] = 0;
    struct stat st;
    if (stat(m->path, &st) == 0) {
        FY_REQUIRE(S_ISDIR(st.st_mode), -ENOTDIR, "cannot create %s %s: it exists and is not a "
                   "directory", what, m->path);
        return 0;
    }
    /* each prefix that ends a component, from the shallowest: made where missing */
    for (size_t at = 1; at <= len; at++) {
        if (at < len && (m->path[at] != '/' || m->path[at - 1] == '/'))
            continue;
        char keep = m->path[at];
        m->path[at] = 0;
        int e = mkdir(m->path, at == len ? mode : 0777) == 0 ? 0 : errno;
        if (e == EEXIST)
            e = stat(m->path, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
        else if (e == 0 && m->n < FY_MADE_DIRS_MAX)
            m->end[m->n++] = (unsigned short)at;
        else if (e == 0)
            e = ENAMETOOLONG; /* more new levels than can be undone: not made */
        if (e != 0) {
            char failed[PATH_MAX];
            snprintf(failed, sizeof failed, "%s", m->path);
            m->path[at] = keep;
            fy_made_dirs_undo(m, NULL, 0);
            if (at == len)
                fy_error("cannot create %s %s: %s", what, dir, strerror(e));
            else
                fy_error("cannot create %s %s: its parent %s: %s", what, dir, failed,
                         strerror(e));
            return -e;
        }
        m->path[at] = keep;
    }
    return 0;
}

int fy_mkdirs_for(const char *path, const char *what, struct fy_made_dirs *made)
{
    if (made != NULL)
        made->n = 0;
    char copy[PATH_MAX];
    FY_REQUIRE(strlen(path) < sizeof copy, -ENAMETOOLONG, "%s %.200s: the path is too long", what,
               path);
    snprintf(copy, sizeof copy, "%s", path);
    const char *dir = dirname(copy);
    if (strcmp(dir, ".") == 0 || strcmp(dir, "/") == 0)
        return 0;
    return fy_mkdirs(dir, 0777, what, made);
}

int fy_made_dirs_undo(struct fy_made_dirs *made, char *said, size_t len)
{
    if (said != NULL && len > 0)
        said[0] = 0;
    int gone = 0;
    unsigned first = made->n; /* the shallowest one removed */
    for (unsigned i = made->n; i-- > 0;) {
        char keep = made->path[made->end[i]];
        made->path[made->end[i]] = 0;
        int removed = rmdir(made->path) == 0 || errno == ENOENT;
        made->path[made->end[i]] = keep;
        if (!removed)
            break; /* not empty: neither is any directory above it */
        gone++;
        first = i;
    }
    for (unsigned i = made->n; said != NULL && i-- > first;) {
        size_t at = strlen(said);
        snprintf(said + at, len - at, "%s%.*s", at ? ", " : "", (int)made->end[i], made->path);
    }
    made->n = 0;
    return gone;
}
