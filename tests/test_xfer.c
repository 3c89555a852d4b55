/* Tests of the digested transfers (io_worker/xfer): over three paths and across several digest
 * chunks, the digest equals fy_digest of the bytes moved, for a write, a read back of the whole and
 * of a sub-range; a refused transfer leaves the next one unaffected. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/digest.h"
#include "common/base/log.h"
#include "io_worker/ring.h"
#include "io_worker/store.h"
#include "io_worker/xfer.h"
#include "tests/testutil.h"

#define SU ((size_t)64 << 10)
#define NPATHS 3

struct fixture {
    char *dir[NPATHS];
    const char *paths[NPATHS];
    struct fy_ring *r;
    struct fy_store *s;
};

/* A new store over three paths, its files registered with the ring. */
static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    for (int i = 0; i < NPATHS; i++) {
        char tag[16];
        snprintf(tag, sizeof tag, "xfer%d", i);
        f->dir[i] = fy_test_tmpdir(tag);
        assert_non_null(f->dir[i]);
        f->paths[i] = f->dir[i];
    }
    assert_int_equal(fy_ring_new(&f->r, NULL), 0);
    struct fy_store_opts o = {
        .paths = f->paths, .npaths = NPATHS, .stripe_unit = SU, .create = 1, .overwrite = 1};
    assert_int_equal(fy_store_open(&f->s, &o), 0);
    assert_int_equal(fy_store_stripe_unit(f->s), SU);
    assert_int_equal(
        fy_ring_register_files(f->r, fy_store_fds(f->s), fy_store_file_names(f->s), NPATHS), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    fy_store_destroy(&f->s);
    fy_ring_destroy(&f->r);
    for (int i = 0; i < NPATHS; i++) {
        fy_test_rmdir(f->dir[i]);
        free(f->dir[i]);
    }
    free(f);
    return 0;
}

static void test_digest_transfers(void **state)
{
    struct fixture *f = *state;
    struct fy_store *s = f->s;
    size_t len = 2 * FY_XFER_DIGEST_CHUNK + 5 * SU + 12288;
    char *out = NULL, *in = NULL;
    assert_int_equal(posix_memalign((void **)&out, 4096, len), 0);
    assert_int_equal(posix_memalign((void **)&in, 4096, len), 0);
    uint64_t st = 99;
    for (size_t k = 0; k < len / 8; k++)
        ((uint64_t *)out)[k] = fy_test_rand(&st);
    assert_int_equal(fy_store_add_extent(s, 5, len), 0);
    uint64_t dw = 0, dr = 0, dsub = 0;
    assert_int_equal(fy_xfer_digest(s, f->r, 5, 0, out, len, FY_IO_WRITE, 10000, &dw), 0);
    assert_true(dw == fy_digest(out, len));
    for (int again = 0; again < 3; again++) {
        memset(in, 0, len);
        assert_int_equal(fy_xfer_digest(s, f->r, 5, 0, in, len, FY_IO_READ, 10000, &dr), 0);
        assert_true(dr == dw);
        assert_memory_equal(in, out, len);
    }
    size_t sub = FY_XFER_DIGEST_CHUNK + SU;
    assert_int_equal(fy_xfer_digest(s, f->r, 5, 8192, in, sub, FY_IO_READ, 10000, &dsub), 0);
    assert_true(dsub == fy_digest(out + 8192, sub));
    assert_int_equal(fy_xfer_digest(s, f->r, 6, 0, in, 4096, FY_IO_READ, 10000, &dsub), -ENOENT);
    assert_int_equal(fy_xfer_digest(s, f->r, 5, 0, in, len, FY_IO_READ, 10000, &dr), 0);
    assert_true(dr == dw);
    assert_int_equal(fy_ring_pending(f->r), 0);
    free(out);
    free(in);
}

int main(void)
{
    fy_log_init("test", FY_LOG_INFO);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_digest_transfers, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
