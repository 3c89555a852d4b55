/* Tests of the shared pool (common/ipc/pool): naming, creation with mode 0600, the 2 MiB-aligned
 * layout with guard words, attaching from another process, destruction, stale-object detection
 * (owner pid plus start time) and the slot allocator. Every object created is named
 * /fuyou-test-<pid>-<n> and removed again. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/base/log.h"
#include "common/ipc/pool.h"
#include "tests/testutil.h"

#define MIB (1ull << 20)

static unsigned name_counter;
static char shm_prefix[64]; /* "fuyou-test-<pid>-" (as listed in /dev/shm, without the '/') */

static void new_name(char *out, size_t len)
{
    snprintf(out, len, "/fuyou-test-%d-%u", (int)getpid(), name_counter++);
}

static int shm_exists(const char *name)
{
    char path[128];
    struct stat st;
    snprintf(path, sizeof path, "/dev/shm%s", name);
    return stat(path, &st) == 0;
}

static const struct fy_pool_region_spec specs[] = {
    {"weights", 3 * MIB},       /* a multiple of the guard size */
    {"grad", 100000},           /* not a multiple of anything */
    {"slots", 2 * MIB - 64},    /* ends so that its after-guard touches the next 2 MiB boundary */
    {"tiny", 64},
};
#define NSPECS (sizeof specs / sizeof specs[0])

static struct fy_pool *create_ok(char *name, size_t len)
{
    new_name(name, len);
    struct fy_pool *p = NULL;
    struct fy_pool_opts opts = {.topo = NULL, .numa_node = -1, .run_dir = "/tmp/test-run"};
    assert_int_equal(fy_pool_create(&p, name, specs, NSPECS, &opts), 0);
    assert_non_null(p);
    return p;
}

static void test_name_for_run(void **state)
{
    char *d1 = fy_test_tmpdir("pool");
    char *d2 = fy_test_tmpdir("pool");
    assert_non_null(d1);
    assert_non_null(d2);
    char a[FY_POOL_NAME_MAX], b[FY_POOL_NAME_MAX], c[FY_POOL_NAME_MAX], e[FY_POOL_NAME_MAX];
    assert_int_equal(fy_pool_name_for_run(d1, a, sizeof a), 0);
    assert_int_equal(fy_pool_name_for_run(d1, b, sizeof b), 0);
    assert_string_equal(a, b);
    assert_int_equal(strlen(a), strlen("/fuyou-") + 16);
    assert_true(strncmp(a, "/fuyou-", 7) == 0);
    for (size_t i = 7; i < strlen(a); i++)
        assert_non_null(strchr("0123456789abcdef", a[i]));
    /* the canonical path is used: "dir/." and "dir/" name the same pool */
    char *alias = NULL;
    assert_true(asprintf(&alias, "%s/./", d1) > 0);
    assert_int_equal(fy_pool_name_for_run(alias, e, sizeof e), 0);
    assert_string_equal(a, e);
    free(alias);
    /* a different directory gives a different name */
    assert_int_equal(fy_pool_name_for_run(d2, c, sizeof c), 0);
    assert_string_not_equal(a, c);
    /* a directory that does not exist is an error */
    char *gone = NULL;
    assert_true(asprintf(&gone, "%s/missing", d1) > 0);
    assert_int_equal(fy_pool_name_for_run(gone, c, sizeof c), -ENOENT);
    free(gone);
    /* too small an output buffer */
    char small[8];
    assert_int_equal(fy_pool_name_for_run(d1, small, sizeof small), -ENAMETOOLONG);
    fy_test_rmdir(d1);
    fy_test_rmdir(d2);
    free(d1);
    free(d2);
}

static void test_create_layout(void **state)
{
    char name[64];
    mode_t old = umask(0277); /* would give 0400 without the explicit fchmod */
    struct fy_pool *p = create_ok(name, sizeof name);
    umask(old);

    char path[128];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_true(S_ISREG(st.st_mode));
    assert_true((uint64_t)st.st_size == fy_pool_size(p));
    assert_int_equal(st.st_uid, getuid());

    assert_string_equal(fy_pool_name(p), name);
    assert_non_null(fy_pool_base(p));
    uint64_t size = fy_pool_size(p);
    assert_true(size == fy_pool_layout_size(specs, NSPECS));
    assert_true(size % FY_POOL_ALIGN == 0);
    assert_true(fy_pool_uses_huge_pages(p) == 0 || fy_pool_uses_huge_pages(p) == 1);

    /* regions: 2 MiB aligned, in order, after the header's first 2 MiB, guards not overlapping */
    uint64_t prev_end = FY_POOL_ALIGN; /* the header */
    for (unsigned i = 0; i < NSPECS; i++) {
        uint64_t off = 0, bytes = 0;
        assert_int_equal(fy_pool_region(p, specs[i].name, &off, &bytes), 0);
        assert_true(bytes == specs[i].bytes);
        assert_true(off % FY_POOL_ALIGN == 0);
        assert_true(off - FY_POOL_GUARD_BYTES >= prev_end); /* before-guard after previous */
        uint64_t guard_after = (off + bytes + FY_POOL_GUARD_BYTES - 1) / FY_POOL_GUARD_BYTES *
                               FY_POOL_GUARD_BYTES;
        prev_end = guard_after + FY_POOL_GUARD_BYTES;
        assert_true(prev_end <= size);
        assert_non_null(fy_pool_at(p, off, bytes));
        assert_ptr_equal(fy_pool_at(p, off, bytes), (uint8_t *)fy_pool_base(p) + off);
        /* the whole region is writable and does not disturb the guards */
        memset((uint8_t *)fy_pool_base(p) + off, 0xa5, bytes);
    }
    assert_int_equal(fy_pool_check_guards(p), 0);
    /* the regions are disjoint: each still holds only its own fill after all are written */
    for (unsigned i = 0; i < NSPECS; i++) {
        uint64_t off, bytes;
        assert_int_equal(fy_pool_region(p, specs[i].name, &off, &bytes), 0);
        memset((uint8_t *)fy_pool_base(p) + off, (int)i + 1, bytes);
    }
    for (unsigned i = 0; i < NSPECS; i++) {
        uint64_t off, bytes;
        assert_int_equal(fy_pool_region(p, specs[i].name, &off, &bytes), 0);
        const uint8_t *r = (const uint8_t *)fy_pool_base(p) + off;
        assert_int_equal(r[0], i + 1);
        assert_int_equal(r[bytes - 1], i + 1);
    }
    assert_int_equal(fy_pool_check_guards(p), 0);

    /* layout sizes */
    assert_true(fy_pool_layout_size(NULL, 0) == FY_POOL_ALIGN);
    struct fy_pool_region_spec one = {"x", 1};
    assert_true(fy_pool_layout_size(&one, 1) == 3 * FY_POOL_ALIGN);
    struct fy_pool_region_spec exact = {"x", 2 * MIB};
    assert_true(fy_pool_layout_size(&exact, 1) == 3 * FY_POOL_ALIGN + FY_POOL_ALIGN);

    fy_pool_destroy(&p);
    assert_null(p);
    assert_false(shm_exists(name));
    fy_pool_destroy(&p); /* safe on NULL */
    fy_pool_destroy(NULL);
}

static void test_pool_at_and_region(void **state)
{
    char name[64];
    struct fy_pool *p = create_ok(name, sizeof name);
    uint64_t size = fy_pool_size(p);
    uint8_t *base = fy_pool_base(p);
    assert_ptr_equal(fy_pool_at(p, 0, size), base);
    assert_ptr_equal(fy_pool_at(p, size - 1, 1), base + size - 1);
    assert_null(fy_pool_at(p, size - 1, 2));
    assert_null(fy_pool_at(p, size, 1));
    assert_null(fy_pool_at(p, 0, size + 1));
    assert_null(fy_pool_at(p, size + 1, 0));
    assert_null(fy_pool_at(p, UINT64_MAX, 1));
    assert_null(fy_pool_at(p, 1, UINT64_MAX));
    assert_null(fy_pool_at(p, UINT64_MAX - 10, 100));

    uint64_t off = 123, bytes = 456;
    assert_int_equal(fy_pool_region(p, "nope", &off, &bytes), -ENOENT);
    assert_int_equal(fy_pool_region(p, "", &off, &bytes), -ENOENT);
    assert_int_equal(fy_pool_region(p, "weight", &off, &bytes), -ENOENT); /* prefix only */
    fy_pool_destroy(&p);
    assert_false(shm_exists(name));
}

static void test_create_rejects(void **state)
{
    char name[64];
    new_name(name, sizeof name);
    struct fy_pool *p = (struct fy_pool *)1;
    struct fy_pool_region_spec dup[] = {{"a", 4096}, {"b", 4096}, {"a", 4096}};
    assert_int_equal(fy_pool_create(&p, name, dup, 3, NULL), -EINVAL);
    assert_null(p);
    assert_false(shm_exists(name));

    struct fy_pool_region_spec empty[] = {{"", 4096}};
    assert_int_equal(fy_pool_create(&p, name, empty, 1, NULL), -EINVAL);
    char longname[FY_POOL_REGION_NAME + 1];
    memset(longname, 'r', FY_POOL_REGION_NAME);
    longname[FY_POOL_REGION_NAME] = 0;
    struct fy_pool_region_spec toolong[] = {{longname, 4096}};
    assert_int_equal(fy_pool_create(&p, name, toolong, 1, NULL), -EINVAL);
    assert_false(shm_exists(name));

    struct fy_pool_region_spec many[FY_POOL_MAX_REGIONS + 1];
    char names[FY_POOL_MAX_REGIONS + 1][8];
    for (int i = 0; i <= FY_POOL_MAX_REGIONS; i++) {
        snprintf(names[i], sizeof names[i], "r%d", i);
        many[i].name = names[i];
        many[i].bytes = 4096;
    }
    assert_int_equal(fy_pool_create(&p, name, many, FY_POOL_MAX_REGIONS + 1, NULL), -E2BIG);
    assert_false(shm_exists(name));

    /* names must start with '/' and be short */
    assert_int_equal(fy_pool_create(&p, name + 1, specs, NSPECS, NULL), -EINVAL);
    char longpool[FY_POOL_NAME_MAX + 8];
    memset(longpool, 'p', sizeof longpool - 1);
    longpool[0] = '/';
    longpool[sizeof longpool - 1] = 0;
    assert_int_equal(fy_pool_create(&p, longpool, specs, NSPECS, NULL), -EINVAL);
    assert_int_equal(fy_test_count_shm(shm_prefix), 0);

    /* exactly FY_POOL_MAX_REGIONS regions is fine (NULL opts too) */
    assert_int_equal(fy_pool_create(&p, name, many, FY_POOL_MAX_REGIONS, NULL), 0);
    uint64_t off, bytes;
    assert_int_equal(fy_pool_region(p, "r31", &off, &bytes), 0);
    assert_true(bytes == 4096);
    assert_int_equal(fy_pool_check_guards(p), 0);
    fy_pool_destroy(&p);
    assert_false(shm_exists(name));
}

static void test_attach_from_child(void **state)
{
    char name[64];
    struct fy_pool *p = create_ok(name, sizeof name);
    uint64_t off, bytes;
    assert_int_equal(fy_pool_region(p, "grad", &off, &bytes), 0);
    uint8_t *r = fy_pool_at(p, off, bytes);
    assert_non_null(r);
    memset(r, 0, bytes);
    r[0] = 0x11; /* the child checks it sees the parent's byte */

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct fy_pool *c = NULL;
        if (fy_pool_attach(&c, name) != 0 || c == NULL)
            _exit(10);
        if (fy_pool_size(c) != fy_pool_size(p))
            _exit(11);
        uint64_t coff, cbytes;
        if (fy_pool_region(c, "grad", &coff, &cbytes) != 0 || coff != off || cbytes != bytes)
            _exit(12);
        uint8_t *cr = fy_pool_at(c, coff, cbytes);
        if (cr == NULL || cr == r /* a separate mapping */ || cr[0] != 0x11)
            _exit(13);
        if (fy_pool_check_guards(c) != 0)
            _exit(14);
        for (uint64_t i = 0; i < cbytes; i++)
            cr[i] = (uint8_t)(i * 7 + 3);
        fy_pool_destroy(&c); /* an attacher does not remove the object */
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    for (uint64_t i = 0; i < bytes; i++)
        if (r[i] != (uint8_t)(i * 7 + 3))
            fail_msg("byte %llu: %u, child wrote %u", (unsigned long long)i, r[i],
                     (uint8_t)(i * 7 + 3));
    assert_true(shm_exists(name));
    assert_int_equal(fy_pool_check_guards(p), 0);

    /* an attacher in this process: destroying it keeps the object and the creator's mapping */
    struct fy_pool *a = NULL;
    assert_int_equal(fy_pool_attach(&a, name), 0);
    assert_ptr_not_equal(fy_pool_base(a), fy_pool_base(p));
    assert_true(fy_pool_size(a) == fy_pool_size(p));
    ((uint8_t *)fy_pool_base(a))[off + 1] = 0x77;
    assert_int_equal(r[1], 0x77);
    fy_pool_destroy(&a);
    assert_null(a);
    assert_true(shm_exists(name));
    assert_int_equal(r[1], 0x77);

    fy_pool_destroy(&p);
    assert_false(shm_exists(name));
    /* attaching after destruction fails */
    assert_int_equal(fy_pool_attach(&a, name), -ENOENT);
    assert_null(a);
}

static void test_attach_rejects(void **state)
{
    char name[64];
    new_name(name, sizeof name);
    struct fy_pool *a = (struct fy_pool *)1;
    assert_int_equal(fy_pool_attach(&a, name), -ENOENT);
    assert_null(a);

    /* an object that is too small for a header */
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 100), 0);
    assert_int_equal(fy_pool_attach(&a, name), -EBADMSG);
    assert_null(a);
    /* big enough but no magic (a creator that died before publishing it) */
    assert_int_equal(ftruncate(fd, 4u << 20), 0);
    assert_int_equal(fy_pool_attach(&a, name), -EBADMSG);
    close(fd);

    /* create over such a leftover removes it (no magic: no live owner) */
    struct fy_pool *p = NULL;
    assert_int_equal(fy_pool_create(&p, name, specs, NSPECS, NULL), 0);
    assert_int_equal(fy_pool_attach(&a, name), 0);
    fy_pool_destroy(&a);

    /* a size in the header that differs from the object: -EBADMSG */
    fd = shm_open(name, O_RDWR, 0);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)fy_pool_size(p) + FY_POOL_ALIGN), 0);
    close(fd);
    assert_int_equal(fy_pool_attach(&a, name), -EBADMSG);
    assert_null(a);

    fy_pool_destroy(&p);
    assert_false(shm_exists(name));
}

static void test_guards(void **state)
{
    char name[64];
    struct fy_pool *p = create_ok(name, sizeof name);
    uint8_t *base = fy_pool_base(p);
    assert_int_equal(fy_pool_check_guards(p), 0);
    for (unsigned i = 0; i < NSPECS; i++) {
        uint64_t off, bytes;
        assert_int_equal(fy_pool_region(p, specs[i].name, &off, &bytes), 0);
        /* the guard after the region starts one byte past its end, whatever its size */
        uint64_t after = off + bytes;
        uint8_t saved = base[after];
        base[after] ^= 0x01;
        assert_int_equal(fy_pool_check_guards(p), -EFAULT);
        base[after] = saved;
        assert_int_equal(fy_pool_check_guards(p), 0);
        /* the last byte of the guard after */
        saved = base[after + FY_POOL_GUARD_BYTES - 1];
        base[after + FY_POOL_GUARD_BYTES - 1] ^= 0x80;
        assert_int_equal(fy_pool_check_guards(p), -EFAULT);
        base[after + FY_POOL_GUARD_BYTES - 1] = saved;
        /* one byte before the start */
        saved = base[off - 1];
        base[off - 1] ^= 0xff;
        assert_int_equal(fy_pool_check_guards(p), -EFAULT);
        base[off - 1] = saved;
        /* the first byte of the guard before */
        saved = base[off - FY_POOL_GUARD_BYTES];
        base[off - FY_POOL_GUARD_BYTES] = (uint8_t)(saved + 1);
        assert_int_equal(fy_pool_check_guards(p), -EFAULT);
        base[off - FY_POOL_GUARD_BYTES] = saved;
        assert_int_equal(fy_pool_check_guards(p), 0);
        /* writes inside the region, at both ends, are fine */
        base[off] ^= 0xff;
        base[off + bytes - 1] ^= 0xff;
        assert_int_equal(fy_pool_check_guards(p), 0);
    }
    /* an attacher sees the same guards, and a corruption made through the creator */
    struct fy_pool *a = NULL;
    assert_int_equal(fy_pool_attach(&a, name), 0);
    assert_int_equal(fy_pool_check_guards(a), 0);
    uint64_t off, bytes;
    assert_int_equal(fy_pool_region(p, "weights", &off, &bytes), 0);
    base[off + bytes] = 0;
    assert_int_equal(fy_pool_check_guards(a), -EFAULT);
    fy_pool_destroy(&a);
    fy_pool_destroy(&p);
    assert_false(shm_exists(name));
}

static void test_stale_dead_creator(void **state)
{
    char name[64];
    new_name(name, sizeof name);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct fy_pool *c = NULL;
        if (fy_pool_create(&c, name, specs, NSPECS, NULL) != 0)
            _exit(10);
        _exit(0); /* dies without destroying: the object stays behind */
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_true(shm_exists(name));

    /* a new run with the same name removes the leftover and starts afresh */
    struct fy_pool *p = NULL;
    assert_int_equal(fy_pool_create(&p, name, specs, NSPECS, NULL), 0);
    assert_non_null(p);
    assert_true(shm_exists(name));
    assert_int_equal(fy_pool_check_guards(p), 0);
    /* it is ours now: alive, so it cannot be removed as stale */
    assert_int_equal(fy_pool_remove_stale(name), -EBUSY);
    assert_true(shm_exists(name));
    fy_pool_destroy(&p);
    assert_false(shm_exists(name));

    /* the same through fy_pool_remove_stale directly */
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct fy_pool *c = NULL;
        _exit(fy_pool_create(&c, name, specs, NSPECS, NULL) == 0 ? 0 : 10);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_true(shm_exists(name));
    assert_int_equal(fy_pool_remove_stale(name), 1);
    assert_false(shm_exists(name));
    assert_int_equal(fy_pool_remove_stale(name), 0); /* nothing there */
}

static void test_stale_live_creator(void **state)
{
    char name[64];
    struct fy_pool *p = create_ok(name, sizeof name);
    assert_int_equal(fy_pool_remove_stale(name), -EBUSY);
    assert_true(shm_exists(name));

    /* another create of the same name while the creator lives fails and keeps the object */
    struct fy_pool *q = (struct fy_pool *)1;
    assert_int_equal(fy_pool_create(&q, name, specs, NSPECS, NULL), -EBUSY);
    assert_null(q);
    assert_true(shm_exists(name));

    /* a child tries too: the parent (the creator) is alive */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct fy_pool *c = NULL;
        if (fy_pool_remove_stale(name) != -EBUSY)
            _exit(10);
        if (fy_pool_create(&c, name, specs, NSPECS, NULL) != -EBUSY)
            _exit(11);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_true(shm_exists(name));
    assert_int_equal(fy_pool_check_guards(p), 0);
    fy_pool_destroy(&p);
    assert_false(shm_exists(name));
}

static void test_stale_pid_reused(void **state)
{
    /* The header names a live pid (ours) but with another start time: the pid was reused by an
     * unrelated process, so the object is stale. The header keeps owner_pid at byte 16 and
     * owner_start at byte 24 (fixed positions). */
    char name[64];
    struct fy_pool *p = create_ok(name, sizeof name);
    uint8_t *base = fy_pool_base(p);
    int32_t owner_pid;
    memcpy(&owner_pid, base + 16, sizeof owner_pid);
    assert_int_equal(owner_pid, getpid());
    uint64_t start;
    memcpy(&start, base + 24, sizeof start);
    assert_true(start != 0);
    start += 1;
    memcpy(base + 24, &start, sizeof start);
    assert_int_equal(fy_pool_remove_stale(name), 1);
    assert_false(shm_exists(name));
    fy_pool_destroy(&p); /* the object is already gone: no crash */
    assert_null(p);
}

static void test_slots(void **state)
{
    char name[64];
    struct fy_pool *p = create_ok(name, sizeof name);
    uint64_t roff, rbytes;
    assert_int_equal(fy_pool_region(p, "grad", &roff, &rbytes), 0); /* 100000 bytes */

    struct fy_slots s;
    assert_int_equal(fy_slots_init(&s, p, "missing", 4096), -ENOENT);
    assert_int_equal(fy_slots_init(&s, p, "grad", 0), -EINVAL);
    assert_int_equal(fy_slots_init(&s, p, "grad", 200000), -EINVAL);
    assert_int_equal(fy_slots_init(&s, p, "tiny", 64), -EINVAL); /* 4 KiB slots do not fit 64 B */

    assert_int_equal(fy_slots_init(&s, p, "grad", 5000), 0);
    assert_true(s.slot_bytes == 8192);
    unsigned count = s.count;
    assert_int_equal(count, 100000 / 8192);
    uint64_t offs[64];
    assert_true(count <= 64);
    for (unsigned i = 0; i < count; i++) {
        assert_int_equal(fy_slots_alloc(&s, &offs[i]), 0);
        assert_true(offs[i] % 4096 == 0);
        assert_true(offs[i] >= roff);
        assert_true(offs[i] + s.slot_bytes <= roff + rbytes);
        assert_non_null(fy_pool_at(p, offs[i], s.slot_bytes));
        for (unsigned j = 0; j < i; j++) {
            assert_true(offs[i] != offs[j]);
            /* no overlap */
            assert_true(offs[i] >= offs[j] + s.slot_bytes || offs[j] >= offs[i] + s.slot_bytes);
        }
    }
    assert_int_equal(s.in_use, count);
    uint64_t extra = 0xdead;
    assert_int_equal(fy_slots_alloc(&s, &extra), -ENOSPC);
    assert_true(extra == 0xdead);

    /* free one in the middle and get it back */
    uint64_t mid = offs[count / 2];
    assert_int_equal(fy_slots_free(&s, mid), 0);
    assert_int_equal(s.in_use, count - 1);
    assert_int_equal(fy_slots_free(&s, mid), -EINVAL); /* double free */
    assert_int_equal(s.in_use, count - 1);
    uint64_t again = 0;
    assert_int_equal(fy_slots_alloc(&s, &again), 0);
    assert_true(again == mid);
    assert_int_equal(fy_slots_alloc(&s, &extra), -ENOSPC);

    /* foreign offsets */
    assert_int_equal(fy_slots_free(&s, roff - 4096), -EINVAL);
    assert_int_equal(fy_slots_free(&s, 0), -EINVAL);
    assert_int_equal(fy_slots_free(&s, offs[0] + 1), -EINVAL);
    assert_int_equal(fy_slots_free(&s, offs[0] + 4096), -EINVAL); /* inside a slot */
    assert_int_equal(fy_slots_free(&s, roff + (uint64_t)count * s.slot_bytes), -EINVAL);
    assert_int_equal(fy_slots_free(&s, UINT64_MAX), -EINVAL);
    assert_int_equal(s.in_use, count);

    /* free all, then every slot can be allocated again */
    for (unsigned i = 0; i < count; i++)
        assert_int_equal(fy_slots_free(&s, offs[i] == mid ? again : offs[i]), 0);
    assert_int_equal(s.in_use, 0);
    for (unsigned i = 0; i < count; i++)
        assert_int_equal(fy_slots_free(&s, offs[i]), -EINVAL);
    for (unsigned i = 0; i < count; i++)
        assert_int_equal(fy_slots_alloc(&s, &extra), 0);
    assert_int_equal(fy_slots_alloc(&s, &extra), -ENOSPC);
    fy_slots_destroy(&s);
    assert_null(s.used);

    /* more than 64 slots (the bitmap spans several words) */
    assert_int_equal(fy_slots_init(&s, p, "weights", 4096), 0);
    assert_int_equal(s.count, 3 * MIB / 4096);
    uint64_t last = 0, off = 0;
    unsigned n = 0;
    while (fy_slots_alloc(&s, &off) == 0) {
        if (n > 0)
            assert_true(off == last + 4096);
        last = off;
        n++;
    }
    assert_int_equal(n, s.count);
    assert_int_equal(fy_slots_free(&s, last), 0);
    assert_int_equal(fy_slots_alloc(&s, &off), 0);
    assert_true(off == last);
    fy_slots_destroy(&s);

    fy_pool_destroy(&p);
    assert_false(shm_exists(name));
}

static void unlink_all(void)
{
    for (unsigned i = 0; i < name_counter; i++) {
        char name[64];
        snprintf(name, sizeof name, "/fuyou-test-%d-%u", (int)getpid(), i);
        shm_unlink(name);
    }
}

/* Fails the test if it left an object behind, then removes whatever is left so that one failure
 * does not cascade into the next tests. */
static int teardown_check(void **state)
{
    int left = fy_test_count_shm(shm_prefix);
    unlink_all();
    if (left != 0)
        fprintf(stderr, "test left %d objects /dev/shm/%s*\n", left, shm_prefix);
    return left == 0 ? 0 : -1;
}

int main(void)
{
    signal(SIGCHLD, SIG_DFL); /* waitpid must see our children, whatever we inherited */
    fy_log_init("test", FY_LOG_ERROR);
    snprintf(shm_prefix, sizeof shm_prefix, "fuyou-test-%d-", (int)getpid());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_name_for_run, teardown_check),
        cmocka_unit_test_teardown(test_create_layout, teardown_check),
        cmocka_unit_test_teardown(test_pool_at_and_region, teardown_check),
        cmocka_unit_test_teardown(test_create_rejects, teardown_check),
        cmocka_unit_test_teardown(test_attach_from_child, teardown_check),
        cmocka_unit_test_teardown(test_attach_rejects, teardown_check),
        cmocka_unit_test_teardown(test_guards, teardown_check),
        cmocka_unit_test_teardown(test_stale_dead_creator, teardown_check),
        cmocka_unit_test_teardown(test_stale_live_creator, teardown_check),
        cmocka_unit_test_teardown(test_stale_pid_reused, teardown_check),
        cmocka_unit_test_teardown(test_slots, teardown_check),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    /* Whatever failed, leave nothing behind in /dev/shm. */
    unlink_all();
    int left = fy_test_count_shm(shm_prefix);
    if (left != 0) {
        fprintf(stderr, "%d objects /dev/shm/%s* left behind\n", left, shm_prefix);
        failed++;
    }
    return failed;
}
