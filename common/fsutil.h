/* File-system helpers shared by every writer of durable files: writing a whole buffer through short
 * writes and EINTR, and fsyncing a directory so that a rename in it is durable. */
#ifndef FY_FSUTIL_H
#define FY_FSUTIL_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

/* Writes all of buf at the file's current position; an error names the file and the offset (the
 * caller's idea of where this write starts) and hints at a full disk. Returns 0 or -errno. */
int fy_write_all(int fd, const void *buf, size_t len, const char *name, uint64_t offset);
/* fsync of a directory, and of the directory that holds a path. */
int fy_fsync_dir(const char *dir);
int fy_fsync_parent(const char *path);
/* Ends the atomic replacement of `path` by the stdio file f written as `tmp`: flushed, fsynced,
 * closed (always), renamed over path, the directory fsynced. On failure tmp is removed and the
 * error said; returns 0 or -errno. */
int fy_file_replace(FILE *f, const char *tmp, const char *path);
/* Replaces `path` atomically by `text` and a line break, through PATH.tmp (fy_file_replace); 0 or
 * -errno, said. */
int fy_file_write_text(const char *path, const char *text);
/* Removes a directory and everything under it (symbolic links themselves, not what they point
 * to; nothing on another file system mounted below it); a path that does not exist is not an
 * error. Whatever cannot be removed is said, the rest removed; returns 0 or the first -errno. */
int fy_remove_tree(const char *path);

#endif
