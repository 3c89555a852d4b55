/* SIGINT and SIGTERM recorded for a command's loops to stop at (launcher/run/stopsig.h). */
#include "launcher/run/stopsig.h"

#include <errno.h>
#include <string.h>

#include "common/base/log.h"

static volatile sig_atomic_t raised;

static void on_stop(int sig) { raised = sig; }

int fy_stopsig_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0) {
        int e = errno;
        fy_error("cannot install the SIGINT/SIGTERM handlers: %s", strerror(e));
        return -e;
    }
    return 0;
}

int fy_stopsig_raised(void) { return raised; }

int fy_stopsig_check(void) { return raised ? -EINTR : 0; }

const volatile sig_atomic_t *fy_stopsig_flag(void) { return &raised; }
