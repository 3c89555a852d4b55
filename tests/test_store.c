/* Tests of the SSD store (io_worker/store): extents over 1 and 3 paths survive reopen, bytes land
 * where the striping formula says, mismatched or unsuitable paths are refused with a hint, and a
 * store opened read-only reads and refuses writes. */
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
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "common/base/log.h"
#include "io_worker/ring.h"
#include "io_worker/store.h"
#include "tests/testutil.h"

#define SU ((size_t)64 << 10)
#define MAXP 3

struct fixture {
    char *dir[MAXP];
    const char *paths[MAXP];
    struct fy_ring *r;
    char *buf, *back;
    size_t buflen;
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    for (int i = 0; i < MAXP; i++) {
        char tag[16];
        snprintf(tag, sizeof tag, "store%d", i);
        f->dir[i] = fy_test_tmpdir(tag);
        assert_non_null(f->dir[i]);
        f->paths[i] = f->dir[i];
    }
    assert_int_equal(fy_ring_new(&f->r, NULL), 0);
    f->buflen = (size_t)4 << 20;
    assert_int_equal(posix_memalign((void **)&f->buf, 4096, f->buflen), 0);
    assert_int_equal(posix_memalign((void **)&f->back, 4096, f->buflen), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    fy_ring_destroy(&f->r);
    for (int i = 0; i < MAXP; i++) {
        fy_test_rmdir(f->dir[i]);
        free(f->dir[i]);
    }
    free(f->buf);
    free(f->back);
    free(f);
    return 0;
}

/* fy_test_capture_stderr, failing the test if stderr cannot be captured. */
static char *capture_stderr(int (*fn)(void *), void *arg, int *rc)
{
    char *text = fy_test_capture_stderr(fn, arg, rc);
    assert_non_null(text);
    return text;
}

struct open_case {
    const char *const *paths;
    unsigned n;
    int create, overwrite;
    size_t su;
};

static int try_open(void *arg)
{
    struct open_case *c = arg;
    struct fy_store *s = NULL;
    struct fy_store_opts o = {.paths = c->paths, .npaths = c->n, .stripe_unit = c->su,
                              .create = c->create, .overwrite = c->overwrite};
    int rc = fy_store_open(&s, &o);
    if (rc == 0)
        fy_store_destroy(&s);
    else
        assert_null(s);
    return rc;
}

/* Opens a store (creating replaces any earlier one) and registers its files with the ring. */
static struct fy_store *open_store(struct fixture *f, const char *const *paths, unsigned n,
                                   int create)
{
    struct fy_store *s = NULL;
    struct fy_store_opts o = {.paths = paths, .npaths = n, .stripe_unit = create ? SU : 0,
                              .create = create, .overwrite = create};
    assert_int_equal(fy_store_open(&s, &o), 0);
    assert_int_equal(fy_store_file_count(s), n);
    assert_int_equal(fy_store_stripe_unit(s), SU);
    assert_int_equal(fy_ring_register_files(f->r, fy_store_fds(s), fy_store_file_names(s), n), 0);
    return s;
}

static const struct {
    uint32_t tensor;
    uint64_t bytes;
} extents[] = {
    {7, 300000},                  /* not a 4 KiB multiple: padded */
    {3, 4096},                    /* smaller than a stripe unit */
    {9, ((size_t)1 << 20) + 8192}, /* many stripe units */
    {1, 5 * SU},                  /* exactly whole units */
};
#define NEXT (sizeof extents / sizeof extents[0])

static uint64_t pad(uint64_t b) { return (b + 4095) / 4096 * 4096; }

/* Independent statement of the striping rule, checked against the data files directly. */
static void check_placement(struct fixture *f, const struct fy_store *s, unsigned n,
                            uint64_t logical, const char *data, uint64_t len)
{
    const char *const *names = fy_store_file_names(s);
    char blk[4096];
    for (uint64_t off = 0; off < len; off += 4096) {
        uint64_t L = logical + off;
        uint64_t u = L / SU;
        unsigned p = (unsigned)(u % n);
        uint64_t foff = 4096 + (u / n) * SU + L % SU;
        int fd = open(names[p], O_RDONLY);
        assert_true(fd >= 0);
        assert_int_equal(pread(fd, blk, 4096, (off_t)foff), 4096);
        close(fd);
        if (memcmp(blk, data + off, 4096) != 0)
            fail_msg("logical %llu: expected in %s at offset %llu", (unsigned long long)L,
                     names[p], (unsigned long long)foff);
    }
}

static void roundtrip_paths(struct fixture *f, unsigned n)
{
    struct fy_store *s = open_store(f, f->paths, n, 1);
    assert_int_equal(fy_store_extent_count(s), 0);
    uint64_t expect_off = 0;
    for (unsigned i = 0; i < NEXT; i++) {
        assert_int_equal(fy_store_add_extent(s, extents[i].tensor, extents[i].bytes), 0);
        struct fy_extent e;
        assert_int_equal(fy_store_find(s, extents[i].tensor, &e), 0);
        assert_int_equal(e.logical_offset, expect_off);
        assert_int_equal(e.bytes, extents[i].bytes);
        expect_off += (pad(extents[i].bytes) + SU - 1) / SU * SU;
    }
    assert_int_equal(fy_store_add_extent(s, 7, 4096), -EEXIST);
    assert_int_equal(fy_store_find(s, 12345, NULL), -ENOENT);

    /* Write each extent with its own random data (seeded by tensor id). */
    for (unsigned i = 0; i < NEXT; i++) {
        uint64_t st = extents[i].tensor * 1000003ull + n;
        size_t len = pad(extents[i].bytes);
        for (size_t k = 0; k < len / 8; k++)
            ((uint64_t *)f->buf)[k] = fy_test_rand(&st);
        assert_int_equal(fy_store_write(s, f->r, extents[i].tensor, 0, f->buf, len, 10000), 0);
    }
    assert_int_equal(fy_store_sync(s), 0);
    fy_store_destroy(&s);
    assert_null(s);
    fy_store_destroy(&s); /* safe on NULL */

    s = open_store(f, f->paths, n, 0);
    assert_int_equal(fy_store_extent_count(s), NEXT);
    for (unsigned i = 0; i < NEXT; i++) {
        struct fy_extent e, at;
        assert_int_equal(fy_store_find(s, extents[i].tensor, &e), 0);
        assert_int_equal(fy_store_extent_at(s, i, &at), 0);
        assert_int_equal(at.tensor, extents[i].tensor);
        assert_int_equal(e.bytes, extents[i].bytes);
        uint64_t st = extents[i].tensor * 1000003ull + n;
        size_t len = pad(extents[i].bytes);
        for (size_t k = 0; k < len / 8; k++)
            ((uint64_t *)f->buf)[k] = fy_test_rand(&st);
        memset(f->back, 0, len);
        assert_int_equal(fy_store_read(s, f->r, extents[i].tensor, 0, f->back, len, 10000), 0);
        assert_memory_equal(f->buf, f->back, len);
        /* A sub-range that starts inside a stripe unit. */
        if (len > 3 * 4096 + SU) {
            memset(f->back, 0, len);
            assert_int_equal(
                fy_store_read(s, f->r, extents[i].tensor, 3 * 4096, f->back, SU, 10000), 0);
            assert_memory_equal(f->buf + 3 * 4096, f->back, SU);
        }
        check_placement(f, s, n, e.logical_offset, f->buf, len);
    }
    /* A new extent after reopen goes after the old ones and persists too. */
    assert_int_equal(fy_store_add_extent(s, 100, 8192), 0);
    struct fy_extent e;
    assert_int_equal(fy_store_find(s, 100, &e), 0);
    assert_int_equal(e.logical_offset, expect_off);
    fy_store_destroy(&s);
    s = open_store(f, f->paths, n, 0);
    assert_int_equal(fy_store_extent_count(s), NEXT + 1);
    assert_int_equal(fy_store_find(s, 100, &e), 0);
    assert_int_equal(e.logical_offset, expect_off);
    fy_store_destroy(&s);
}

/* A store opened read-only (an export's reader): its data files O_RDONLY, reads as before, writes
 * and new extents refused with -EROFS, the files untouched; a store is not created read-only. */
static void test_read_only(void **state)
{
    struct fixture *f = *state;
    struct fy_store *s = open_store(f, f->paths, 2, 1);
    assert_int_equal(fy_store_add_extent(s, 5, 2 * SU), 0);
    uint64_t st = 99;
    for (size_t k = 0; k < 2 * SU / 8; k++)
        ((uint64_t *)f->buf)[k] = fy_test_rand(&st);
    assert_int_equal(fy_store_write(s, f->r, 5, 0, f->buf, 2 * SU, 10000), 0);
    assert_int_equal(fy_store_sync(s), 0);
    fy_store_destroy(&s);
    struct stat before[2], after[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(stat(fy_test_path(f->dir[i], FY_STORE_DATA_NAME), &before[i]), 0);
    struct fy_store_opts o = {.paths = f->paths, .npaths = 2, .readonly = 1};
    assert_int_equal(fy_store_open(&s, &o), 0);
    for (unsigned i = 0; i < fy_store_file_count(s); i++)
        assert_int_equal(fcntl(fy_store_fds(s)[i], F_GETFL) & O_ACCMODE, O_RDONLY);
    assert_int_equal(fy_ring_register_files(f->r, fy_store_fds(s), fy_store_file_names(s), 2), 0);
    memset(f->back, 0, 2 * SU);
    assert_int_equal(fy_store_read(s, f->r, 5, 0, f->back, 2 * SU, 10000), 0);
    assert_memory_equal(f->buf, f->back, 2 * SU);
    assert_int_equal(fy_store_write(s, f->r, 5, 0, f->buf, SU, 10000), -EROFS); /* said */
    assert_int_equal(fy_store_add_extent(s, 6, 4096), -EROFS);
    fy_store_destroy(&s);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(stat(fy_test_path(f->dir[i], FY_STORE_DATA_NAME), &after[i]), 0);
        assert_int_equal(after[i].st_size, before[i].st_size);
        assert_true(after[i].st_mtim.tv_sec == before[i].st_mtim.tv_sec &&
                    after[i].st_mtim.tv_nsec == before[i].st_mtim.tv_nsec);
    }
    struct fy_store_opts bad = {.paths = f->paths, .npaths = 1, .create = 1, .readonly = 1};
    assert_int_equal(fy_store_open(&s, &bad), -EINVAL);
    assert_null(s);
}

static void test_one_path(void **state) { roundtrip_paths(*state, 1); }
static void test_three_paths(void **state) { roundtrip_paths(*state, 3); }

static void test_map(void **state)
{
    struct fixture *f = *state;
    struct fy_io_req reqs[64];
    struct fy_store *s = open_store(f, f->paths, 1, 1);
    assert_int_equal(fy_store_add_extent(s, 1, 10 * SU), 0);
    /* One path: the whole extent is contiguous in one file, so one request. */
    assert_int_equal(fy_store_map(s, 1, 0, 10 * SU, f->buf, FY_IO_READ, 5, reqs, 64), 1);
    assert_int_equal(reqs[0].file_offset, 4096);
    assert_int_equal(reqs[0].len, 10 * SU);
    assert_int_equal(reqs[0].tag, 5);
    fy_store_destroy(&s);

    s = open_store(f, f->paths, 3, 1);
    assert_int_equal(fy_store_add_extent(s, 1, 10 * SU), 0);
    assert_int_equal(fy_store_add_extent(s, 2, 5000), 0);
    /* Three paths: one request per unit; an unaligned start gives a short first piece. */
    int n = fy_store_map(s, 1, 4096, 3 * SU, f->buf, FY_IO_WRITE, 6, reqs, 64);
    assert_int_equal(n, 4);
    assert_int_equal(reqs[0].file, 0);
    assert_int_equal(reqs[0].file_offset, 4096 + 4096);
    assert_int_equal(reqs[0].len, SU - 4096);
    assert_int_equal(reqs[1].file, 1);
    assert_int_equal(reqs[1].file_offset, 4096);
    assert_ptr_equal(reqs[1].buf, f->buf + SU - 4096);
    assert_int_equal(reqs[3].file, 0);
    assert_int_equal(reqs[3].file_offset, 4096 + SU);
    assert_int_equal(reqs[3].len, 4096);
    assert_int_equal(reqs[3].dir, FY_IO_WRITE);
    assert_int_equal(fy_store_map(s, 1, 0, 10 * SU, f->buf, FY_IO_READ, 0, reqs, 3), -ENOSPC);
    assert_int_equal(fy_store_map(s, 1, 0, 11 * SU, f->buf, FY_IO_READ, 0, reqs, 64), -ERANGE);
    assert_int_equal(fy_store_map(s, 1, 10 * SU, 4096, f->buf, FY_IO_READ, 0, reqs, 64), -ERANGE);
    /* The padding of a 5000-byte extent (8192) is inside; beyond it is not. */
    assert_int_equal(fy_store_map(s, 2, 0, 8192, f->buf, FY_IO_READ, 0, reqs, 64), 1);
    assert_int_equal(reqs[0].file, 1); /* unit 10 -> path 1 */
    assert_int_equal(fy_store_map(s, 2, 0, 12288, f->buf, FY_IO_READ, 0, reqs, 64), -ERANGE);
    assert_int_equal(fy_store_map(s, 2, 100, 4096, f->buf, FY_IO_READ, 0, reqs, 64), -EINVAL);
    assert_int_equal(fy_store_map(s, 99, 0, 4096, f->buf, FY_IO_READ, 0, reqs, 64), -ENOENT);
    assert_int_equal(fy_store_map(s, 1, 0, 0, f->buf, FY_IO_READ, 0, reqs, 64), 0);
    fy_store_destroy(&s);
}

static void expect_refused(struct open_case *c, int code, const char *needle)
{
    int rc;
    char *log = capture_stderr(try_open, c, &rc);
    assert_int_equal(rc, code);
    if (strstr(log, needle) == NULL)
        fail_msg("expected \"%s\" in the log, got: %s", needle, log);
    free(log);
}

static void patch_header(const char *file, unsigned slot, uint32_t value)
{
    int fd = open(file, O_RDWR);
    assert_true(fd >= 0);
    unsigned char b[4] = {(unsigned char)value, (unsigned char)(value >> 8),
                          (unsigned char)(value >> 16), (unsigned char)(value >> 24)};
    assert_int_equal(pwrite(fd, b, 4, 4 * slot), 4);
    assert_int_equal(fsync(fd), 0);
    close(fd);
}

static uint32_t read_slot(const char *file, unsigned slot)
{
    int fd = open(file, O_RDONLY);
    assert_true(fd >= 0);
    unsigned char b[4];
    assert_int_equal(pread(fd, b, 4, 4 * slot), 4);
    close(fd);
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static void test_header_mismatch(void **state)
{
    struct fixture *f = *state;
    struct fy_store *s = open_store(f, f->paths, 3, 1);
    assert_int_equal(fy_store_add_extent(s, 1, SU), 0);
    char file0[4096];
    snprintf(file0, sizeof file0, "%s", fy_store_file_names(s)[0]);
    fy_store_destroy(&s);

    struct open_case c = {.paths = f->paths, .n = 2};
    expect_refused(&c, -EINVAL, "created with 3 paths, 2 given");
    const char *swapped[3] = {f->paths[1], f->paths[0], f->paths[2]};
    c.paths = swapped;
    c.n = 3;
    expect_refused(&c, -EINVAL, "same order");
    c.paths = f->paths;
    c.su = SU * 2;
    expect_refused(&c, -EINVAL, "stripe unit");
    c.su = 0;

    uint32_t magic = read_slot(file0, FY_STORE_HDR_MAGIC);
    patch_header(file0, FY_STORE_HDR_MAGIC, 0xdeadbeef);
    expect_refused(&c, -EINVAL, "magic");
    patch_header(file0, FY_STORE_HDR_MAGIC, magic);

    patch_header(file0, FY_STORE_HDR_VERSION, 2);
    expect_refused(&c, -EINVAL, "version 2");
    patch_header(file0, FY_STORE_HDR_VERSION, FY_STORE_VERSION);

    uint32_t sum = read_slot(file0, FY_STORE_HDR_CHECKSUM);
    patch_header(file0, FY_STORE_HDR_CHECKSUM, sum ^ 1);
    expect_refused(&c, -EINVAL, "checksum");
    patch_header(file0, FY_STORE_HDR_CHECKSUM, sum);

    /* Restored, it opens again with its extent. */
    s = open_store(f, f->paths, 3, 0);
    assert_int_equal(fy_store_extent_count(s), 1);
    fy_store_destroy(&s);

    /* A path from a different store is caught by the store id. */
    const char *other[1] = {f->paths[2]};
    struct fy_store *o2 = NULL;
    struct fy_store_opts oo = {.paths = other, .npaths = 1, .create = 1, .overwrite = 1};
    assert_int_equal(fy_store_open(&o2, &oo), 0);
    fy_store_destroy(&o2);
    expect_refused(&c, -EINVAL, "created with 1 paths, 3 given");
}

static void test_tmpfs_refused(void **state)
{
    struct statfs sf;
    if (statfs("/dev/shm", &sf) != 0 || sf.f_type != 0x01021994) {
        fprintf(stderr, "skipping the tmpfs case: /dev/shm is not tmpfs here\n");
        skip();
    }
    char dir[] = "/dev/shm/fuyou-test-store-XXXXXX";
    assert_non_null(mkdtemp(dir));
    const char *paths[1] = {dir};
    struct open_case c = {.paths = paths, .n = 1, .create = 1};
    expect_refused(&c, -EINVAL, "ext4 or xfs");
    fy_test_rmdir(dir);
}

static void test_bad_paths(void **state)
{
    struct fixture *f = *state;
    char missing[4200];
    snprintf(missing, sizeof missing, "%s/does-not-exist", f->dir[0]);
    const char *paths[2] = {f->paths[0], missing};
    struct open_case c = {.paths = paths, .n = 2, .create = 1};
    expect_refused(&c, -ENOENT, "does-not-exist");
    /* The same directory twice. */
    const char *twice[2] = {f->paths[0], f->paths[0]};
    c.paths = twice;
    expect_refused(&c, -EINVAL, "same directory");
    /* Opening where no store exists. */
    c.paths = f->paths;
    c.n = 1;
    c.create = 0;
    expect_refused(&c, -ENOENT, "holds no Fuyou store");
    /* A stripe unit that is not a power of two. */
    c.create = 1;
    c.su = 3 * 4096;
    expect_refused(&c, -EINVAL, "power of two");
}

static void test_create_over_existing(void **state)
{
    struct fixture *f = *state;
    struct fy_store *s = open_store(f, f->paths, 2, 1);
    assert_int_equal(fy_store_add_extent(s, 4, 4096), 0);
    uint64_t id = fy_store_id(s);
    fy_store_destroy(&s);
    struct open_case c = {.paths = f->paths, .n = 2, .create = 1, .su = SU};
    expect_refused(&c, -EEXIST, "already holds a Fuyou store");
    c.overwrite = 1;
    assert_int_equal(try_open(&c), 0);
    s = open_store(f, f->paths, 2, 0);
    assert_int_equal(fy_store_extent_count(s), 0);
    assert_true(fy_store_id(s) != id);
    fy_store_destroy(&s);
}

int main(void)
{
    fy_log_init("test", FY_LOG_INFO);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_one_path, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_three_paths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_map, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tmpfs_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_paths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_over_existing, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
