/* Tests of the pinned thread pool: each index runs once per call, the static split, error
 * propagation, many repeated runs, pinning (and what an impossible core does: a warning, the
 * thread runs unpinned, fy_threads_new still succeeds). */
#include <errno.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "opt_worker/threads.h"

#define MAXT 8

struct counts {
    atomic_int hits[MAXT];
    atomic_int bad_count;
    unsigned expect_count;
};

static int count_fn(void *arg, unsigned index, unsigned count)
{
    struct counts *c = arg;
    if (index < MAXT)
        atomic_fetch_add(&c->hits[index], 1);
    if (count != c->expect_count)
        atomic_fetch_add(&c->bad_count, 1);
    return 0;
}

static void test_each_index_once(void **state)
{
    for (unsigned n = 1; n <= 5; n++) {
        struct fy_threads *p = NULL;
        assert_int_equal(fy_threads_new(&p, NULL, n), 0);
        assert_int_equal(fy_threads_count(p), n);
        assert_int_equal(fy_threads_pinned(p), 0);
        struct counts c = {.expect_count = n};
        for (int r = 0; r < 50; r++) {
            assert_int_equal(fy_threads_run(p, count_fn, &c), 0);
            for (unsigned i = 0; i < n; i++)
                assert_int_equal(atomic_load(&c.hits[i]), r + 1);
        }
        assert_int_equal(atomic_load(&c.bad_count), 0);
        fy_threads_destroy(&p);
        assert_null(p);
    }
}

static void check_split(size_t n, size_t align, unsigned count)
{
    size_t prev_end = 0;
    for (unsigned i = 0; i < count; i++) {
        size_t b, e;
        fy_threads_split(n, align, i, count, &b, &e);
        assert_true(b == prev_end);
        assert_true(b <= e && e <= n);
        size_t a = align ? align : 1;
        assert_true(b % a == 0 || b == n);
        assert_true(e % a == 0 || e == n);
        /* as even as the alignment allows: no range more than one block longer than another */
        size_t blocks = (n + a - 1) / a;
        size_t mine = (e - b + a - 1) / a;
        assert_true(mine <= blocks / count + 1);
        assert_true(mine + 1 >= blocks / count);
        prev_end = e;
    }
    assert_true(prev_end == n);
}

static void test_split(void **state)
{
    static const size_t ns[] = {0, 1, 7, 63, 64, 65, 128, 1000, 1000003, 64 * 16 + 5};
    static const size_t aligns[] = {0, 1, 7, 64, 4096};
    for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++)
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
            for (unsigned count = 1; count <= 17; count++)
                check_split(ns[k], aligns[a], count);
    /* an index out of range gets an empty range */
    size_t b, e;
    fy_threads_split(100, 1, 5, 5, &b, &e);
    assert_true(b == e);
}

static int fail_fn(void *arg, unsigned index, unsigned count)
{
    const int *first_bad = arg;
    return (int)index >= *first_bad ? -(int)(index + 100) : 0;
}

static void test_error_propagation(void **state)
{
    struct fy_threads *p = NULL;
    assert_int_equal(fy_threads_new(&p, NULL, 4), 0);
    int first_bad = 2; /* indexes 2 and 3 fail: the lowest failing index wins */
    assert_int_equal(fy_threads_run(p, fail_fn, &first_bad), -102);
    first_bad = 0;
    assert_int_equal(fy_threads_run(p, fail_fn, &first_bad), -100);
    first_bad = 4;
    assert_int_equal(fy_threads_run(p, fail_fn, &first_bad), 0);
    /* the pool still works after failures */
    struct counts c = {.expect_count = 4};
    assert_int_equal(fy_threads_run(p, count_fn, &c), 0);
    assert_int_equal(atomic_load(&c.hits[3]), 1);
    assert_int_equal(fy_threads_run(p, NULL, NULL), -EINVAL);
    fy_threads_destroy(&p);
    fy_threads_destroy(&p); /* NULL again: nothing */
}

static int sum_fn(void *arg, unsigned index, unsigned count)
{
    atomic_fetch_add((atomic_long *)arg, (long)index + 1);
    return 0;
}

static void test_many_runs(void **state)
{
    for (unsigned n = 2; n <= 3; n++) {
        struct fy_threads *p = NULL;
        assert_int_equal(fy_threads_new(&p, NULL, n), 0);
        atomic_long total = 0;
        const long runs = 20000;
        for (long r = 0; r < runs; r++)
            assert_int_equal(fy_threads_run(p, sum_fn, &total), 0);
        assert_true(atomic_load(&total) == runs * (long)(n * (n + 1) / 2));
        fy_threads_destroy(&p);
    }
}

static int where_fn(void *arg, unsigned index, unsigned count)
{
    ((int *)arg)[index] = sched_getcpu();
    return 0;
}

static void test_pin_cpu0(void **state)
{
    cpu_set_t before, after;
    assert_int_equal(sched_getaffinity(0, sizeof before, &before), 0);
    if (!CPU_ISSET(0, &before)) {
        printf("skipping: this process may not run on cpu 0\n");
        skip();
    }
    const int cpus[3] = {0, 0, 0};
    struct fy_threads *p = NULL;
    assert_int_equal(fy_threads_new(&p, cpus, 3), 0);
    assert_int_equal(fy_threads_pinned(p), 3);
    int where[3] = {-1, -1, -1};
    for (int r = 0; r < 20; r++) {
        assert_int_equal(fy_threads_run(p, where_fn, where), 0);
        for (int i = 0; i < 3; i++)
            assert_int_equal(where[i], 0);
    }
    fy_threads_destroy(&p);
    /* the caller's binding comes back */
    assert_int_equal(sched_getaffinity(0, sizeof after, &after), 0);
    assert_true(CPU_EQUAL(&before, &after));
}

/* Documented behaviour: a core that cannot be bound logs a warning naming it, the thread runs
 * unpinned, and the pool is still created and usable. */
static void test_invalid_cpu_warns(void **state)
{
    const int cpus[2] = {100000, 0};
    struct fy_threads *p = NULL;
    assert_int_equal(fy_threads_new(&p, cpus, 2), 0);
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    assert_int_equal(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    assert_int_equal(fy_threads_pinned(p), CPU_ISSET(0, &allowed) ? 1u : 0u);
    struct counts c = {.expect_count = 2};
    assert_int_equal(fy_threads_run(p, count_fn, &c), 0);
    assert_int_equal(atomic_load(&c.hits[0]) + atomic_load(&c.hits[1]), 2);
    fy_threads_destroy(&p);
}

static void test_bad_args(void **state)
{
    struct fy_threads *p = (struct fy_threads *)&p;
    assert_int_equal(fy_threads_new(&p, NULL, 0), -EINVAL);
    assert_null(p);
    const int neg[2] = {0, -1};
    assert_int_equal(fy_threads_new(&p, neg, 2), -EINVAL);
    assert_null(p);
    assert_int_equal(fy_threads_new(NULL, NULL, 1), -EINVAL);
    assert_int_equal(fy_threads_count(NULL), 0u);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_index_once),  cmocka_unit_test(test_split),
        cmocka_unit_test(test_error_propagation), cmocka_unit_test(test_many_runs),
        cmocka_unit_test(test_pin_cpu0),          cmocka_unit_test(test_invalid_cpu_warns),
        cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
