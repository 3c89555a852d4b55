/* Tests of the io_uring engine (io_worker/ring): round trips through both rings with registered and
 * plain buffers, queueing beyond the queue depth, alignment checks, end of file, timeouts. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/base/log.h"
#include "io_worker/ring.h"
#include "tests/testutil.h"

#define REG_BYTES ((size_t)4 << 20)
#define PLAIN_BYTES ((size_t)4 << 20)

struct fixture {
    char *dir;
    char path[4096];
    int fd;
    char *reg;   /* registered with the ring */
    char *plain; /* not registered */
    char *back;  /* read-back buffer, registered (second half of reg) */
    struct fy_ring *r;
};

static uint64_t seed = 12345;

static void fill_random(void *buf, size_t len)
{
    uint64_t *p = buf;
    for (size_t i = 0; i < len / 8; i++)
        p[i] = fy_test_rand(&seed);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* fy_test_capture_stderr, failing the test if stderr cannot be captured. */
static char *capture_stderr(int (*fn)(void *), void *arg, int *rc)
{
    char *text = fy_test_capture_stderr(fn, arg, rc);
    assert_non_null(text);
    return text;
}

static int setup_opts(void **state, unsigned qd, size_t block)
{
    struct fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->dir = fy_test_tmpdir("ring");
    assert_non_null(f->dir);
    snprintf(f->path, sizeof f->path, "%s/ring.dat", f->dir);
    f->fd = open(f->path, O_RDWR | O_CREAT | O_DIRECT, 0644);
    assert_true(f->fd >= 0);
    f->reg = mmap(NULL, REG_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    f->plain = mmap(NULL, PLAIN_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(f->reg != MAP_FAILED && f->plain != MAP_FAILED);
    f->back = f->reg + REG_BYTES / 2;
    struct fy_ring_opts o = {.queue_depth = qd, .block_size = block};
    assert_int_equal(fy_ring_new(&f->r, &o), 0);
    assert_int_equal(fy_ring_register_memory(f->r, f->reg, REG_BYTES), 0);
    const char *names[1] = {f->path};
    assert_int_equal(fy_ring_register_files(f->r, &f->fd, names, 1), 0);
    *state = f;
    return 0;
}

/* A small queue and block so that a few hundred KiB already exercise splitting and queueing. */
static int setup_small(void **state) { return setup_opts(state, 4, 64 << 10); }
static int setup_default(void **state) { return setup_opts(state, 0, 0); }

static int teardown(void **state)
{
    struct fixture *f = *state;
    fy_ring_destroy(&f->r);
    assert_null(f->r);
    fy_ring_destroy(&f->r); /* safe on NULL */
    close(f->fd);
    munmap(f->reg, REG_BYTES);
    munmap(f->plain, PLAIN_BYTES);
    fy_test_rmdir(f->dir);
    free(f->dir);
    free(f);
    return 0;
}

static void roundtrip(struct fixture *f, char *src, char *dst, size_t len, uint64_t off)
{
    fill_random(src, len);
    memset(dst, 0, len);
    struct fy_io_req w = {.dir = FY_IO_WRITE, .file = 0, .file_offset = off, .buf = src,
                          .len = len, .tag = 1};
    assert_int_equal(fy_ring_run(f->r, &w, 1, 10000), 0);
    struct fy_io_req rd = {.dir = FY_IO_READ, .file = 0, .file_offset = off, .buf = dst,
                           .len = len, .tag = 2};
    assert_int_equal(fy_ring_run(f->r, &rd, 1, 10000), 0);
    assert_memory_equal(src, dst, len);
}

static void test_roundtrip_sizes(void **state)
{
    struct fixture *f = *state;
    /* Block sizes are 64 KiB (small fixture) or 1 MiB (default); include non-multiples. */
    const size_t sizes[] = {4096, 65536, 65536 + 4096, 200 << 10, (1 << 20) + (12 << 10),
                            (3 << 20) / 2};
    uint64_t off = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t len = sizes[i];
        roundtrip(f, f->reg, f->back, len, off);     /* fixed buffers both ways */
        roundtrip(f, f->plain, f->plain + PLAIN_BYTES / 2, len, off + 8192); /* plain */
        roundtrip(f, f->plain, f->back, len, off);   /* plain write, fixed read */
        roundtrip(f, f->reg, f->plain + PLAIN_BYTES / 2, len, off); /* fixed write, plain read */
        off += len + (1 << 20);
    }
    assert_int_equal(fy_ring_pending(f->r), 0);
}

/* Many transfers queued at once, far more than the queue depth, with reads and writes mixed so
 * that both rings are busy together. */
static void test_many_queued(void **state)
{
    struct fixture *f = *state;
    enum { N = 48 };
    size_t len = 16 << 10; /* 48 * 16 KiB = 768 KiB, within each half of reg */
    /* Region A is written first, then read back while region B is written. */
    fill_random(f->reg, N * len);
    for (unsigned i = 0; i < N; i++) {
        struct fy_io_req q = {.dir = FY_IO_WRITE, .file = 0, .file_offset = i * len,
                              .buf = f->reg + i * len, .len = len, .tag = 1000 + i};
        assert_int_equal(fy_ring_submit(f->r, &q), 0);
    }
    assert_int_equal(fy_ring_pending(f->r), N);
    int seen[2 * N] = {0};
    unsigned got = 0;
    while (got < N) {
        struct fy_io_done d[7];
        int n = fy_ring_poll(f->r, d, 7, 10000);
        assert_true(n > 0);
        for (int k = 0; k < n; k++) {
            assert_int_equal(d[k].result, 0);
            assert_true(d[k].tag >= 1000 && d[k].tag < 1000 + N);
            assert_int_equal(seen[d[k].tag - 1000]++, 0);
        }
        got += (unsigned)n;
    }
    memset(f->back, 0, N * len);
    fill_random(f->plain, N * len);
    for (unsigned i = 0; i < N; i++) {
        struct fy_io_req rd = {.dir = FY_IO_READ, .file = 0, .file_offset = i * len,
                               .buf = f->back + i * len, .len = len, .tag = 2000 + i};
        struct fy_io_req wr = {.dir = FY_IO_WRITE, .file = 0,
                               .file_offset = (8 << 20) + i * len, .buf = f->plain + i * len,
                               .len = len, .tag = 3000 + i};
        assert_int_equal(fy_ring_submit(f->r, &rd), 0);
        assert_int_equal(fy_ring_submit(f->r, &wr), 0);
    }
    memset(seen, 0, sizeof seen);
    got = 0;
    while (got < 2 * N) {
        struct fy_io_done d[16];
        int n = fy_ring_poll(f->r, d, 16, 10000);
        assert_true(n > 0);
        for (int k = 0; k < n; k++) {
            assert_int_equal(d[k].result, 0);
            unsigned idx = d[k].tag >= 3000 ? N + (unsigned)(d[k].tag - 3000)
                                            : (unsigned)(d[k].tag - 2000);
            assert_true(idx < 2 * N);
            assert_int_equal(seen[idx]++, 0);
        }
        got += (unsigned)n;
    }
    assert_memory_equal(f->reg, f->back, N * len);
    /* The writes of region B landed too. */
    struct fy_io_req rb = {.dir = FY_IO_READ, .file = 0, .file_offset = 8 << 20, .buf = f->back,
                           .len = N * len, .tag = 9};
    assert_int_equal(fy_ring_run(f->r, &rb, 1, 10000), 0);
    assert_memory_equal(f->plain, f->back, N * len);
    /* Nothing left: poll returns 0 at once. */
    struct fy_io_done d[1];
    assert_int_equal(fy_ring_poll(f->r, d, 1, 1000), 0);
}

/* fy_ring_run keeps completions of transfers queued by fy_ring_submit for fy_ring_poll. */
static void test_run_keeps_submitted(void **state)
{
    struct fixture *f = *state;
    fill_random(f->reg, 1 << 20);
    struct fy_io_req a = {.dir = FY_IO_WRITE, .file = 0, .file_offset = 0, .buf = f->reg,
                          .len = 512 << 10, .tag = 77};
    assert_int_equal(fy_ring_submit(f->r, &a), 0);
    struct fy_io_req b = {.dir = FY_IO_WRITE, .file = 0, .file_offset = 1 << 20,
                          .buf = f->reg + (512 << 10), .len = 512 << 10, .tag = 78};
    assert_int_equal(fy_ring_run(f->r, &b, 1, 10000), 0);
    struct fy_io_done d[4];
    int n = fy_ring_poll(f->r, d, 4, 10000);
    assert_int_equal(n, 1);
    assert_int_equal(d[0].tag, 77);
    assert_int_equal(d[0].result, 0);
}

static void test_misaligned(void **state)
{
    struct fixture *f = *state;
    struct fy_io_req q = {.dir = FY_IO_WRITE, .file = 0, .file_offset = 100, .buf = f->reg,
                          .len = 4096, .tag = 1};
    assert_int_equal(fy_ring_submit(f->r, &q), -EINVAL);
    q.file_offset = 0;
    q.len = 1000;
    assert_int_equal(fy_ring_submit(f->r, &q), -EINVAL);
    q.len = 4096;
    q.buf = f->reg + 512;
    assert_int_equal(fy_ring_submit(f->r, &q), -EINVAL);
    assert_int_equal(fy_ring_run(f->r, &q, 1, 1000), -EINVAL);
    q.buf = f->reg;
    q.file = 5;
    assert_int_equal(fy_ring_submit(f->r, &q), -EINVAL);
    assert_int_equal(fy_ring_pending(f->r), 0);
    assert_int_equal(fy_ring_register_memory(f->r, f->plain + 100, 4096), -EINVAL);
    /* Overlaps what is registered already. */
    assert_int_equal(fy_ring_register_memory(f->r, f->reg, 4096), -EINVAL);
    struct fy_ring *bad = NULL;
    struct fy_ring_opts o = {.queue_depth = 4, .block_size = 1000};
    assert_int_equal(fy_ring_new(&bad, &o), -EINVAL);
    assert_null(bad);
}

struct eof_case {
    struct fixture *f;
    uint64_t off;
    size_t len;
};

static int eof_read(void *arg)
{
    struct eof_case *c = arg;
    struct fy_io_req q = {.dir = FY_IO_READ, .file = 0, .file_offset = c->off, .buf = c->f->back,
                          .len = c->len, .tag = 5};
    return fy_ring_run(c->f->r, &q, 1, 10000);
}

static void test_read_past_eof(void **state)
{
    struct fixture *f = *state;
    assert_int_equal(ftruncate(f->fd, 8192), 0);
    struct eof_case c = {f, 0, 16384}; /* runs into the end */
    int rc;
    char *log = capture_stderr(eof_read, &c, &rc);
    assert_int_equal(rc, -ENODATA);
    assert_non_null(strstr(log, f->path));
    assert_non_null(strstr(log, "offset 8192"));
    free(log);
    c.off = 1 << 20; /* starts past the end */
    c.len = 4096;
    log = capture_stderr(eof_read, &c, &rc);
    assert_int_equal(rc, -ENODATA);
    assert_non_null(strstr(log, f->path));
    free(log);
    /* The part before the end still reads fine. */
    c.off = 0;
    c.len = 8192;
    assert_int_equal(eof_read(&c), 0);
    /* Submitted through the queue, the error comes back as the transfer's result. */
    struct fy_io_req q = {.dir = FY_IO_READ, .file = 0, .file_offset = 4096, .buf = f->back,
                          .len = 1 << 20, .tag = 55};
    assert_int_equal(fy_ring_submit(f->r, &q), 0);
    struct fy_io_done d[2];
    assert_int_equal(fy_ring_poll(f->r, d, 2, 10000), 1);
    assert_int_equal(d[0].tag, 55);
    assert_int_equal(d[0].result, -ENODATA);
}

/* A pipe never delivers data unless written to, which makes waiting deterministic. */
static void test_timeout(void **state)
{
    struct fixture *f = *state;
    int p[2];
    assert_int_equal(pipe(p), 0);
    const char *names[2] = {f->path, "test-pipe"};
    int fds[2] = {f->fd, p[0]};
    assert_int_equal(fy_ring_register_files(f->r, fds, names, 2), 0);

    struct fy_io_req q = {.dir = FY_IO_READ, .file = 1, .file_offset = 0, .buf = f->back,
                          .len = 4096, .tag = 42};
    assert_int_equal(fy_ring_submit(f->r, &q), 0);
    struct fy_io_done d[2];
    double t0 = now_s();
    assert_int_equal(fy_ring_poll(f->r, d, 2, 150), 0);
    double dt = now_s() - t0;
    assert_true(dt >= 0.14 && dt < 5.0);
    assert_int_equal(fy_ring_poll(f->r, d, 2, 0), 0);
    fill_random(f->reg, 4096);
    assert_int_equal(write(p[1], f->reg, 4096), 4096);
    assert_int_equal(fy_ring_poll(f->r, d, 2, 10000), 1);
    assert_int_equal(d[0].tag, 42);
    assert_int_equal(d[0].result, 0);
    assert_memory_equal(f->reg, f->back, 4096);

    /* fy_ring_run gives up after its limit and names the pending file. */
    t0 = now_s();
    q.tag = 43;
    int saved = dup(STDERR_FILENO);
    char tmpl[] = "/tmp/fuyou-test-stderr-XXXXXX";
    int cfd = mkstemp(tmpl);
    assert_true(cfd >= 0 && saved >= 0);
    dup2(cfd, STDERR_FILENO);
    int rc = fy_ring_run(f->r, &q, 1, 200);
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(cfd);
    dt = now_s() - t0;
    assert_int_equal(rc, -ETIMEDOUT);
    assert_true(dt >= 0.19 && dt < 5.0);
    char *log = fy_test_slurp(tmpl, NULL);
    unlink(tmpl);
    assert_non_null(log);
    fputs(log, stderr);
    assert_non_null(strstr(log, "test-pipe"));
    free(log);
    /* The abandoned read is still in flight; it finishes once data arrives and is not reported. */
    assert_int_equal(write(p[1], f->reg, 4096), 4096);
    for (int i = 0; i < 100 && fy_ring_pending(f->r) != 0; i++) {
        if (fy_ring_poll(f->r, d, 2, 10) != 0)
            fail_msg("an abandoned transfer was reported");
    }
    assert_int_equal(fy_ring_pending(f->r), 0);
    /* A read left waiting on the pipe at destroy is cancelled, not waited for. */
    q.tag = 44;
    assert_int_equal(fy_ring_submit(f->r, &q), 0);
    t0 = now_s();
    fy_ring_destroy(&f->r);
    assert_true(now_s() - t0 < 5.0);
    close(p[0]);
    close(p[1]);
}

static void test_run_empty_and_zero_len(void **state)
{
    struct fixture *f = *state;
    assert_int_equal(fy_ring_run(f->r, NULL, 0, 1000), 0);
    struct fy_io_req q = {.dir = FY_IO_WRITE, .file = 0, .file_offset = 0, .buf = f->reg,
                          .len = 0, .tag = 3};
    assert_int_equal(fy_ring_run(f->r, &q, 1, 1000), 0);
    assert_int_equal(fy_ring_submit(f->r, &q), 0);
    struct fy_io_done d[1];
    assert_int_equal(fy_ring_poll(f->r, d, 1, 1000), 1);
    assert_int_equal(d[0].tag, 3);
    assert_int_equal(d[0].result, 0);
    assert_int_equal(fy_ring_block_size(f->r), 1 << 20);
    assert_int_equal(fy_ring_queue_depth(f->r), 32);
}

/* Registered memory larger than 1 GiB is split into pieces; a transfer across a piece boundary
 * still works. Uses untouched anonymous memory, so it costs little unless the kernel pins it. */
static void test_register_large(void **state)
{
    struct fixture *f = *state;
    size_t len = ((size_t)1 << 30) + ((size_t)8 << 20);
    char *big = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
    assert_true(big != MAP_FAILED);
    int rc = fy_ring_register_memory(f->r, big, len);
    if (rc == -ENOMEM || rc == -EPERM) {
        munmap(big, len);
        skip(); /* not enough lockable memory here; said in the log line above */
    }
    assert_int_equal(rc, 0);
    char *edge = big + ((size_t)1 << 30) - (256 << 10); /* 512 KiB straddling the 1 GiB cut */
    roundtrip(f, edge, edge + (2 << 20), 512 << 10, 0);
    munmap(big, len);
}

int main(void)
{
    fy_log_init("test", FY_LOG_INFO);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_roundtrip_sizes, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_roundtrip_sizes, setup_default, teardown),
        cmocka_unit_test_setup_teardown(test_many_queued, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_run_keeps_submitted, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_misaligned, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_read_past_eof, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_timeout, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_run_empty_and_zero_len, setup_default, teardown),
        cmocka_unit_test_setup_teardown(test_register_large, setup_default, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
