/* A stop by SIGINT or SIGTERM for the commands that run without workers to supervise (prepare,
 * probe, report): a handler records the signal in place of the default action (which kills the process and
 * leaves its temporary and scratch files), and the command's loops ask for it at their steps, so
 * that the command removes what it made and ends with -EINTR (exit status 130, said by the edge). */
#ifndef FY_STOPSIG_H
#define FY_STOPSIG_H

#include <signal.h>

/* Installs the handlers for SIGINT and SIGTERM (without SA_RESTART: a blocking read returns
 * EINTR). -errno, said. */
int fy_stopsig_install(void);
/* The signal that asked for a stop since fy_stopsig_install, else 0. */
int fy_stopsig_raised(void);
/* -EINTR where a stop was asked for (nothing said: the edge says it), else 0: for a loop's steps. */
int fy_stopsig_check(void);
/* The flag the handler sets, for code below the launcher that stops at it (a token writer). */
const volatile sig_atomic_t *fy_stopsig_flag(void);

#endif
