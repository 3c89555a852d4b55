/* The check that an SSD path suits the store: an existing, writable directory, not in memory
 * (tmpfs, ramfs), where an O_DIRECT write and read back of a 4 KiB probe file work. */
#ifndef FY_DIRECT_H
#define FY_DIRECT_H

/* 0 if dir exists, is writable, is not tmpfs, and O_DIRECT write+read works there; else -errno
 * with one line saying why and what to give instead. */
int fy_direct_check(const char *dir);

#endif
