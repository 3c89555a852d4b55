/* File-system helpers shared by every writer of durable files: writing a whole buffer through short
 * writes and EINTR, fsyncing a directory so that a rename in it is durable, and making an output's
 * missing directories so that a failure can remove exactly those again; and reading a small file
 * whole. */
#ifndef FY_FSUTIL_H
#define FY_FSUTIL_H

#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <sys/types.h>

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
/* Reads a small file whole into buf, NUL-terminated (at most len - 1 bytes: a /proc file, a
 * record): the bytes read, or -errno where it cannot be opened (nothing said). *incomplete (may be
 * NULL): a read error, or more than len - 1 bytes in the file (buf then holds what was read). */
ssize_t fy_file_read_text(const char *path, char *buf, size_t len, int *incomplete);
/* Removes a directory and everything under it (symbolic links themselves, not what they point
 * to; nothing on another file system mounted below it); a path that does not exist is not an
 * error. Whatever cannot be removed is said, the rest removed; returns 0 or the first -errno. */
int fy_remove_tree(const char *path);

/* The directories that fy_mkdirs made for one output (a run directory, an output file's parents),
 * so that a command that fails removes those and nothing else. */
#define FY_MADE_DIRS_MAX 64
struct fy_made_dirs {
    char path[PATH_MAX];                 /* the directory asked for, trailing slashes dropped */
    unsigned n;                          /* how many of its prefixes were made, */
    unsigned short end[FY_MADE_DIRS_MAX]; /* each one's length in path, shallowest first */
};
/* Creates directory `dir` (mode `mode`, less the umask) and its missing parents (0777 less the
 * umask, as mkdir -p), as outputs named by the user get them; an existing directory is no error.
 * *made (may be NULL) records what was made. On failure nothing made is left, and one line names
 * `what` (e.g. "run directory"), dir, the part that could not be made and why; returns 0 or -errno. */
int fy_mkdirs(const char *dir, mode_t mode, const char *what, struct fy_made_dirs *made);
/* fy_mkdirs of the directory that holds the file `path` ("." has nothing to make). */
int fy_mkdirs_for(const char *path, const char *what, struct fy_made_dirs *made);
/* After a failure: removes the directories in *made, deepest first, while they are empty (one
 * that holds anything stays, with every directory above it); one already gone counts as removed.
 * Their paths, deepest first and comma-separated, go to said (may be NULL); returns how many
 * are gone. *made is emptied. */
int fy_made_dirs_undo(struct fy_made_dirs *made, char *said, size_t len);

#endif
