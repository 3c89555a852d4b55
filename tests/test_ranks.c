/* Unit tests of gpu_worker/ranks: the gradient sum of several gpu workers in rank order through the
 * pool's ranks region, run by forked processes as the workers are: each rank's share lands in
 * order, (g0 + g1) + g2 bit for bit, whatever the timing; a rank's own room (zeroed where the
 * computation adds to it); the collective id handed from rank 0; a rank that never comes is a
 * timeout, said, not a hang, and one whose process is gone is given up on at once. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/ipc/pool.h"
#include "gpu_worker/ranks.h"
#include "tests/testutil.h"

#define RANKS 3
#define FLOATS 1000
#define SUMS 40

static struct fy_pool *make_pool(char *name, size_t len)
{
    static unsigned counter;
    snprintf(name, len, "/fuyou-test-ranks-%d-%u", (int)getpid(), counter++);
    const struct fy_pool_region_spec specs[] = {{"ranks", 4096},
                                                {"grads", SUMS * FLOATS * sizeof(float)}};
    struct fy_pool_opts opts = {.topo = NULL, .numa_node = -1, .run_dir = "/tmp/test-run"};
    struct fy_pool *p = NULL;
    assert_int_equal(fy_pool_create(&p, name, specs, 2, &opts), 0);
    return p;
}

/* Rank r's share of sum k: values of mixed magnitude, so that the order of the additions shows. */
static float share_of(int r, int k, int i)
{
    uint64_t s = (uint64_t)(r * 7919 + k * 104729 + i) * 2654435761u + 1;
    return fy_test_uniform(&s, -1.0f, 1.0f) * (float)(1 << ((r + i) % 12));
}

/* One rank, as a gpu worker runs it: for each sum, its share computed where fy_ranks_target says
 * (rank 0: the pool; others: their room), then fy_ranks_sum; a sleep now and then, so the ranks
 * come in every order. */
static int run_rank(struct fy_pool *p, int r)
{
    struct fy_ranks *rk = NULL;
    if (fy_ranks_new(&rk, p, r, RANKS, FLOATS, 20000) != 0)
        return 1;
    uint64_t off, bytes;
    if (fy_pool_region(p, "grads", &off, &bytes) != 0)
        return 1;
    float *grads = fy_pool_at(p, off, bytes);
    for (int k = 0; k < SUMS; k++) {
        float *to = grads + (size_t)k * FLOATS;
        float *at = fy_ranks_target(rk, to, FLOATS, k % 2, 0);
        if ((at == to) != (r == 0))
            return 2;
        for (int i = 0; i < FLOATS; i++)
            at[i] = (k % 2 ? at[i] : 0.0f) + share_of(r, k, i); /* "accumulates": zeroed */
        if ((k + r) % 5 == 0)
            usleep(2000);
        if (fy_ranks_sum(rk, to, FLOATS, 0) != 0)
            return 3;
    }
    fy_ranks_destroy(&rk);
    return 0;
}

static void test_sum_in_rank_order(void **state)
{
    (void)state;
    char name[96];
    struct fy_pool *p = make_pool(name, sizeof name);
    pid_t pids[RANKS];
    for (int r = 0; r < RANKS; r++) {
        pids[r] = fork();
        assert_true(pids[r] >= 0);
        if (pids[r] == 0)
            _exit(run_rank(p, r));
    }
    for (int r = 0; r < RANKS; r++) {
        int status;
        assert_int_equal(waitpid(pids[r], &status, 0), pids[r]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    uint64_t off, bytes;
    assert_int_equal(fy_pool_region(p, "grads", &off, &bytes), 0);
    const float *grads = fy_pool_at(p, off, bytes);
    for (int k = 0; k < SUMS; k++)
        for (int i = 0; i < FLOATS; i++) {
            float want = share_of(0, k, i);
            for (int r = 1; r < RANKS; r++)
                want += share_of(r, k, i);
            assert_memory_equal(&grads[(size_t)k * FLOATS + i], &want, sizeof want);
        }
    fy_pool_destroy(&p);
}

/* Rank 0 puts an id in the region; rank 1 waits for it and reads the same bytes. */
static void test_id_handed_over(void **state)
{
    (void)state;
    char name[96];
    struct fy_pool *p = make_pool(name, sizeof name);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        struct fy_ranks *rk = NULL;
        size_t room;
        if (fy_ranks_new(&rk, p, 1, 2, 0, 20000) != 0 || fy_ranks_id_wait(rk) != 0)
            _exit(1);
        const char *id = fy_ranks_id_area(rk, &room);
        _exit(room >= 128 && strcmp(id, "group 42") == 0 ? 0 : 2);
    }
    struct fy_ranks *rk = NULL;
    size_t room;
    assert_int_equal(fy_ranks_new(&rk, p, 0, 2, 0, 20000), 0);
    usleep(20000);
    strcpy(fy_ranks_id_area(rk, &room), "group 42");
    assert_int_equal(fy_ranks_id_ready(rk), 0);
    int status;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    fy_ranks_destroy(&rk);
    fy_pool_destroy(&p);
}

/* Rank 1 waits for a rank 0 that never sums: a timeout, said, after about the time given; bad
 * ranks and a gradient past the room are refused. */
static void test_missing_rank_times_out(void **state)
{
    (void)state;
    char name[96];
    struct fy_pool *p = make_pool(name, sizeof name);
    struct fy_ranks *rk = NULL;
    assert_int_equal(fy_ranks_new(&rk, p, 1, 2, FLOATS, 200), 0);
    float to[FLOATS] = {0};
    float *at = fy_ranks_target(rk, to, FLOATS, 1, 0);
    assert_ptr_not_equal(at, to);
    double t0 = fy_test_now_s();
    assert_int_equal(fy_ranks_sum(rk, to, FLOATS, 0), -ETIMEDOUT);
    double waited = fy_test_now_s() - t0;
    assert_true(waited >= 0.19 && waited < 5);
    assert_int_equal(fy_ranks_sum(rk, to, FLOATS, 1), -EINVAL); /* past its room */
    fy_ranks_destroy(&rk);
    assert_int_equal(fy_ranks_new(&rk, p, 2, 2, FLOATS, 200), -EINVAL);
    assert_int_equal(fy_ranks_new(&rk, p, 0, 1, FLOATS, 200), -EINVAL);
    fy_pool_destroy(&p);
}

/* Rank 0 joins and dies before its sum: rank 1 stops waiting soon after (its process is gone), long
 * before the timeout, so that the worker can answer the launcher's stop. */
static void test_dead_rank_given_up(void **state)
{
    (void)state;
    char name[96];
    struct fy_pool *p = make_pool(name, sizeof name);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        struct fy_ranks *rk = NULL;
        _exit(fy_ranks_new(&rk, p, 0, 2, FLOATS, 20000) == 0 ? 0 : 1);
    }
    int status;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    struct fy_ranks *rk = NULL;
    assert_int_equal(fy_ranks_new(&rk, p, 1, 2, FLOATS, 20000), 0);
    float to[FLOATS] = {0};
    (void)fy_ranks_target(rk, to, FLOATS, 1, 0);
    double t0 = fy_test_now_s();
    assert_int_equal(fy_ranks_sum(rk, to, FLOATS, 0), -ECANCELED);
    assert_true(fy_test_now_s() - t0 < 5);
    fy_ranks_destroy(&rk);
    fy_pool_destroy(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sum_in_rank_order),
        cmocka_unit_test(test_id_handed_over),
        cmocka_unit_test(test_missing_rank_times_out),
        cmocka_unit_test(test_dead_rank_given_up),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
