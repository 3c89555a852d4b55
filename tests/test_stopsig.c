/* Tests of the stop by signal (launcher/run/stopsig): before the handlers nothing is raised; with
 * them, SIGINT and SIGTERM are recorded in place of ending the process, the flag the token writers
 * read shows it, and a blocking read that a signal interrupts returns EINTR (no SA_RESTART), which
 * is how prepare's wait on its helper stops. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launcher/run/stopsig.h"

static void test_raised_not_killed(void **state)
{
    (void)state;
    assert_int_equal(fy_stopsig_raised(), 0); /* nothing before the handlers */
    assert_int_equal(fy_stopsig_check(), 0);
    assert_int_equal(fy_stopsig_install(), 0);
    assert_int_equal(fy_stopsig_raised(), 0);
    assert_int_equal(raise(SIGTERM), 0); /* without the handler this would end the test */
    assert_int_equal(fy_stopsig_raised(), SIGTERM);
    assert_int_equal(fy_stopsig_check(), -EINTR);
    assert_int_equal(*fy_stopsig_flag(), SIGTERM);
    assert_int_equal(raise(SIGINT), 0);
    assert_int_equal(fy_stopsig_raised(), SIGINT);
}

/* A read of an empty pipe, interrupted by SIGINT from a child: -1 with EINTR, not restarted. */
static void test_blocking_read_interrupted(void **state)
{
    (void)state;
    assert_int_equal(fy_stopsig_install(), 0);
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t parent = getpid(), child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        usleep(200 * 1000);
        kill(parent, SIGINT);
        usleep(2000 * 1000); /* the pipe's write end stays open meanwhile */
        _exit(0);
    }
    char c;
    ssize_t n = read(fd[0], &c, 1);
    int e = errno;
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    close(fd[0]);
    close(fd[1]);
    assert_int_equal(n, -1);
    assert_int_equal(e, EINTR);
    assert_int_equal(fy_stopsig_raised(), SIGINT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_raised_not_killed),
        cmocka_unit_test(test_blocking_read_interrupted),
    };
    return cmocka_run_group_tests_name("stopsig", tests, NULL, NULL);
}
