/* Tests of the descriptor wire format (common/ipc/desc): round trips of every field, the
 * little-endian layout at the documented byte slots, and rejection of every kind of malformed
 * descriptor. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/ipc/desc.h"
#include "common/base/dtype.h"
#include "common/base/log.h"
#include "tests/testutil.h"

#define POOL ((uint64_t)1 << 30)

static struct fy_desc sample(void)
{
    struct fy_desc d;
    memset(&d, 0, sizeof d);
    d.kind = FY_KIND_MASTER;
    d.op = FY_OP_IO_READ;
    d.dtype = FY_DTYPE_F32;
    d.status = 0;
    d.step = 7;
    d.layer = 3;
    d.tensor = 11;
    d.offset = 4u << 20;
    d.bytes = 4096;
    d.seq = 42;
    d.arg = 8192;
    return d;
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static void assert_desc_equal(const struct fy_desc *a, const struct fy_desc *b)
{
    assert_string_equal(fy_test_desc_diff(a, b), "");
}

static void test_roundtrip_basic(void **state)
{
    struct fy_desc d = sample(), back;
    uint8_t wire[FY_DESC_WIRE_BYTES];
    fy_desc_encode(&d, wire);
    char why[128] = "untouched";
    assert_int_equal(fy_desc_decode(wire, sizeof wire, POOL, &back, why, sizeof why), 0);
    assert_desc_equal(&d, &back);
    assert_int_equal(fy_desc_validate(&back, POOL, NULL, 0), 0);
}

static void test_roundtrip_extremes(void **state)
{
    /* Negative status and layer, large 64-bit values, every field distinct from its neighbours. */
    struct fy_desc d;
    memset(&d, 0, sizeof d);
    d.kind = FY_KIND_CONTROL; /* no region check, so offset/bytes may be anything */
    d.op = FY_OP_DONE;
    d.dtype = FY_DTYPE_NONE;
    d.status = -EIO;
    d.step = UINT64_MAX - 1;
    d.layer = -1;
    d.tensor = UINT32_MAX;
    d.offset = 0x0123456789abcdefull;
    d.bytes = 0xfedcba9876543210ull;
    d.seq = 0x8000000000000001ull;
    d.arg = UINT64_MAX;
    uint8_t wire[FY_DESC_WIRE_BYTES];
    fy_desc_encode(&d, wire);
    struct fy_desc back;
    assert_int_equal(fy_desc_decode(wire, sizeof wire, POOL, &back, NULL, 0), 0);
    assert_desc_equal(&d, &back);
    assert_int_equal(back.status, -EIO);
    assert_int_equal(back.layer, -1);

    d.status = INT32_MIN;
    d.layer = INT32_MIN;
    fy_desc_encode(&d, wire);
    assert_int_equal(fy_desc_decode(wire, sizeof wire, POOL, &back, NULL, 0), 0);
    assert_int_equal(back.status, INT32_MIN);
    assert_int_equal(back.layer, INT32_MIN);

    d.status = INT32_MAX;
    d.layer = INT32_MAX;
    fy_desc_encode(&d, wire);
    assert_int_equal(fy_desc_decode(wire, sizeof wire, POOL, &back, NULL, 0), 0);
    assert_int_equal(back.status, INT32_MAX);
    assert_int_equal(back.layer, INT32_MAX);

    /* Every op and kind value round-trips. */
    for (int op = 1; op < FY_OP_COUNT; op++)
        for (int kind = 0; kind < FY_KIND_COUNT; kind++) {
            struct fy_desc e = sample();
            e.op = (uint16_t)op;
            e.kind = (uint16_t)kind;
            fy_desc_encode(&e, wire);
            assert_int_equal(fy_desc_decode(wire, sizeof wire, POOL, &back, NULL, 0), 0);
            assert_int_equal(back.op, op);
            assert_int_equal(back.kind, kind);
        }
    /* A region that ends exactly at the pool end is inside. */
    struct fy_desc e = sample();
    e.offset = POOL - 4096;
    e.bytes = 4096;
    fy_desc_encode(&e, wire);
    assert_int_equal(fy_desc_decode(wire, sizeof wire, POOL, &back, NULL, 0), 0);
}

static void test_wire_layout(void **state)
{
    struct fy_desc d;
    memset(&d, 0, sizeof d);
    d.kind = FY_KIND_GRAD;
    d.op = FY_OP_OPT_ADAMW;
    d.dtype = FY_DTYPE_BF16;
    d.status = -2;
    d.step = 0x1122334455667788ull;
    d.layer = -1;
    d.tensor = 0xa1b2c3d4u;
    d.offset = 0x0102030405060708ull;
    d.bytes = 0x1000;
    d.seq = 0x0807060504030201ull;
    d.arg = 0xdeadbeefcafef00dull;
    uint8_t wire[FY_DESC_WIRE_BYTES];
    memset(wire, 0xaa, sizeof wire);
    fy_desc_encode(&d, wire);

    /* magic "FYDS" at 0, little-endian */
    assert_int_equal(wire[0], 0x46); /* 'F' */
    assert_int_equal(wire[1], 0x59); /* 'Y' */
    assert_int_equal(wire[2], 0x44); /* 'D' */
    assert_int_equal(wire[3], 0x53); /* 'S' */
    assert_memory_equal(wire, "FYDS", 4);
    /* version at 4 */
    assert_int_equal(wire[4], FY_DESC_VERSION);
    assert_int_equal(wire[5], 0);
    /* kind at 6, op at 8, dtype at 10 */
    assert_int_equal(wire[6], FY_KIND_GRAD);
    assert_int_equal(wire[7], 0);
    assert_int_equal(wire[8], FY_OP_OPT_ADAMW);
    assert_int_equal(wire[9], 0);
    assert_int_equal(wire[10], FY_DTYPE_BF16);
    assert_int_equal(wire[11], 0);
    /* status -2 at 12: fe ff ff ff */
    assert_int_equal(wire[12], 0xfe);
    assert_int_equal(wire[13], 0xff);
    assert_int_equal(wire[14], 0xff);
    assert_int_equal(wire[15], 0xff);
    /* step at 16 */
    assert_int_equal(wire[16], 0x88);
    assert_int_equal(wire[23], 0x11);
    assert_true(le64(wire + 16) == d.step);
    /* layer -1 at 24 */
    for (int i = 24; i < 28; i++)
        assert_int_equal(wire[i], 0xff);
    /* tensor at 28 */
    assert_int_equal(wire[28], 0xd4);
    assert_int_equal(wire[31], 0xa1);
    /* offset at 32, bytes at 40 */
    assert_int_equal(wire[32], 0x08);
    assert_int_equal(wire[39], 0x01);
    assert_true(le64(wire + 32) == d.offset);
    assert_true(le64(wire + 40) == d.bytes);
    assert_int_equal(wire[40], 0x00);
    assert_int_equal(wire[41], 0x10);
    /* seq at 48 */
    assert_int_equal(wire[48], 0x01);
    assert_int_equal(wire[49], 0x02);
    assert_int_equal(wire[55], 0x08);
    assert_true(le64(wire + 48) == d.seq);
    /* arg at 56 */
    assert_int_equal(wire[56], 0x0d);
    assert_int_equal(wire[63], 0xde);
    assert_true(le64(wire + 56) == d.arg);
}

static void test_reject_length(void **state)
{
    struct fy_desc d = sample(), back;
    uint8_t wire[FY_DESC_WIRE_BYTES + 1];
    fy_desc_encode(&d, wire);
    wire[FY_DESC_WIRE_BYTES] = 0;
    char why[256] = "";
    assert_int_equal(fy_desc_decode(wire, FY_DESC_WIRE_BYTES - 1, POOL, &back, why, sizeof why),
                     -EBADMSG);
    assert_true(strlen(why) > 0);
    assert_non_null(strstr(why, "63"));
    why[0] = 0;
    assert_int_equal(fy_desc_decode(wire, FY_DESC_WIRE_BYTES + 1, POOL, &back, why, sizeof why),
                     -EBADMSG);
    assert_true(strlen(why) > 0);
    assert_int_equal(fy_desc_decode(wire, 0, POOL, &back, NULL, 0), -EBADMSG);
}

static void test_reject_magic_and_version(void **state)
{
    struct fy_desc d = sample(), back;
    d.seq = 0x1234567890ull;
    uint8_t wire[FY_DESC_WIRE_BYTES];
    fy_desc_encode(&d, wire);
    wire[0] ^= 0xff;
    char why[256] = "";
    memset(&back, 0, sizeof back);
    assert_int_equal(fy_desc_decode(wire, sizeof wire, POOL, &back, why, sizeof why), -EBADMSG);
    assert_non_null(strstr(why, "magic"));
    /* the seq is still readable so the receiver can answer */
    assert_true(back.seq == 0x1234567890ull);

    fy_desc_encode(&d, wire);
    wire[4] = FY_DESC_VERSION + 1;
    why[0] = 0;
    assert_int_equal(fy_desc_decode(wire, sizeof wire, POOL, &back, why, sizeof why), -EBADMSG);
    assert_non_null(strstr(why, "version"));
    assert_true(back.seq == 0x1234567890ull);

    fy_desc_encode(&d, wire);
    wire[5] = 1; /* version 0x0101 */
    assert_int_equal(fy_desc_decode(wire, sizeof wire, POOL, &back, NULL, 0), -EBADMSG);

    /* An all-zero buffer is not a descriptor. */
    memset(wire, 0, sizeof wire);
    assert_int_equal(fy_desc_decode(wire, sizeof wire, POOL, &back, NULL, 0), -EBADMSG);
}

static void expect_rc(const struct fy_desc *d, uint64_t pool, int rc, const char *needle)
{
    uint8_t wire[FY_DESC_WIRE_BYTES];
    fy_desc_encode(d, wire);
    struct fy_desc back;
    char why[256] = "";
    assert_int_equal(fy_desc_decode(wire, sizeof wire, pool, &back, why, sizeof why), rc);
    assert_true(strlen(why) > 0);
    if (needle != NULL && strstr(why, needle) == NULL)
        fail_msg("why '%s' does not mention '%s'", why, needle);
    assert_true(back.seq == d->seq);
    /* validate gives the same answer as decode */
    why[0] = 0;
    assert_int_equal(fy_desc_validate(d, pool, why, sizeof why), rc);
    assert_true(strlen(why) > 0);
    /* a NULL why is allowed */
    assert_int_equal(fy_desc_validate(d, pool, NULL, 0), rc);
    /* a tiny why buffer is filled without overflow */
    char small[4] = {'x', 'x', 'x', 'x'};
    assert_int_equal(fy_desc_validate(d, pool, small, 3), rc);
    assert_int_equal(small[2], 0);
    assert_int_equal(small[3], 'x');
}

static void test_reject_kind_op_dtype(void **state)
{
    struct fy_desc d = sample();
    d.kind = FY_KIND_COUNT;
    expect_rc(&d, POOL, -EPROTO, "kind");
    d.kind = 0xffff;
    expect_rc(&d, POOL, -EPROTO, "kind");

    d = sample();
    d.op = 0;
    expect_rc(&d, POOL, -EPROTO, "op");
    d.op = FY_OP_COUNT;
    expect_rc(&d, POOL, -EPROTO, "op");
    d.op = 0xffff;
    expect_rc(&d, POOL, -EPROTO, "op");

    d = sample();
    d.dtype = FY_DTYPE_COUNT;
    expect_rc(&d, POOL, -EPROTO, "dtype");
    d.dtype = 0xffff;
    expect_rc(&d, POOL, -EPROTO, "dtype");

    /* CONTROL does not excuse an unknown op or dtype */
    d = sample();
    d.kind = FY_KIND_CONTROL;
    d.op = 99;
    expect_rc(&d, POOL, -EPROTO, "op");
    d.op = FY_OP_PING;
    d.dtype = 77;
    expect_rc(&d, POOL, -EPROTO, "dtype");
}

static void test_reject_range(void **state)
{
    struct fy_desc d = sample();
    /* starts past the end */
    d.offset = POOL + 4096;
    d.bytes = 4096;
    expect_rc(&d, POOL, -ERANGE, "outside");
    /* starts inside, ends one element past the end */
    d.offset = POOL - 4096;
    d.bytes = 4096 + 4;
    expect_rc(&d, POOL, -ERANGE, "outside");
    /* offset + bytes overflows 64 bits */
    d.offset = UINT64_MAX - 10;
    d.bytes = 100;
    expect_rc(&d, POOL, -ERANGE, NULL);
    d.offset = 4096;
    d.bytes = UINT64_MAX - 4000;
    expect_rc(&d, POOL, -ERANGE, NULL);
    /* with an unbounded pool the overflow must still be caught */
    d.offset = UINT64_MAX - 3;
    d.bytes = 100;
    d.dtype = FY_DTYPE_U8;
    expect_rc(&d, UINT64_MAX, -ERANGE, NULL);
    /* pool size 0: every non-empty region is out of range */
    d = sample();
    d.offset = 0;
    d.bytes = 4;
    expect_rc(&d, 0, -ERANGE, NULL);
}

static void test_reject_element_size(void **state)
{
    struct fy_desc d = sample(); /* f32 */
    d.bytes = 4096 + 2;
    uint8_t wire[FY_DESC_WIRE_BYTES];
    fy_desc_encode(&d, wire);
    struct fy_desc back;
    char why[256] = "";
    int rc = fy_desc_decode(wire, sizeof wire, POOL, &back, why, sizeof why);
    assert_true(rc < 0);
    assert_int_equal(rc, -ERANGE);
    assert_non_null(strstr(why, "f32"));

    d.dtype = FY_DTYPE_BF16;
    d.bytes = 4097;
    expect_rc(&d, POOL, -ERANGE, "bf16");
    d.bytes = 4098; /* a multiple of 2 is fine for bf16 */
    fy_desc_encode(&d, wire);
    assert_int_equal(fy_desc_decode(wire, sizeof wire, POOL, &back, NULL, 0), 0);
    /* u8 and raw bytes accept any length */
    d.dtype = FY_DTYPE_U8;
    d.bytes = 4097;
    fy_desc_encode(&d, wire);
    assert_int_equal(fy_desc_decode(wire, sizeof wire, POOL, &back, NULL, 0), 0);
    d.dtype = FY_DTYPE_NONE;
    d.bytes = 1;
    fy_desc_encode(&d, wire);
    assert_int_equal(fy_desc_decode(wire, sizeof wire, POOL, &back, NULL, 0), 0);
    /* i32 rejects 6 bytes */
    d.dtype = FY_DTYPE_I32;
    d.bytes = 6;
    expect_rc(&d, POOL, -ERANGE, NULL);
}

static void test_control_skips_region(void **state)
{
    struct fy_desc d = sample();
    d.kind = FY_KIND_CONTROL;
    d.op = FY_OP_STOP;
    d.offset = UINT64_MAX - 10;
    d.bytes = 100;
    d.dtype = FY_DTYPE_F32; /* 100 is a multiple of 4, but offset isn't: still fine for CONTROL */
    uint8_t wire[FY_DESC_WIRE_BYTES];
    fy_desc_encode(&d, wire);
    struct fy_desc back;
    assert_int_equal(fy_desc_decode(wire, sizeof wire, 0, &back, NULL, 0), 0);
    assert_true(back.offset == UINT64_MAX - 10);
    assert_int_equal(fy_desc_validate(&d, 0, NULL, 0), 0);
    d.bytes = 3;
    assert_int_equal(fy_desc_validate(&d, 0, NULL, 0), 0);
    /* the same region in a WEIGHTS descriptor is rejected */
    d.kind = FY_KIND_WEIGHTS;
    assert_int_equal(fy_desc_validate(&d, 0, NULL, 0), -ERANGE);
}

/* The optimizer's sum-of-squares request and its reply: the region is validated as for any op, and
 * the reply's double travels in arg bit for bit. */
static void test_opt_sumsq(void **state)
{
    struct fy_desc d = fy_desc_region(FY_OP_OPT_SUMSQ, FY_KIND_GRAD, FY_DTYPE_BF16, 4096, 2 * 1000, 3);
    uint8_t wire[FY_DESC_WIRE_BYTES];
    struct fy_desc back;
    fy_desc_encode(&d, wire);
    assert_int_equal(fy_desc_decode(wire, sizeof wire, POOL, &back, NULL, 0), 0);
    assert_int_equal(back.op, FY_OP_OPT_SUMSQ);
    assert_int_equal(back.layer, 3);
    d.offset = POOL - 1000;
    expect_rc(&d, POOL, -ERANGE, "outside");
    d.offset = 4097; /* not on a bf16 element */
    expect_rc(&d, POOL, -ERANGE, "aligned");
    struct fy_desc reply = {.op = FY_OP_DONE, .kind = FY_KIND_CONTROL, .seq = 9};
    double sumsq = 1234.5678901234567, out;
    memcpy(&reply.arg, &sumsq, sizeof sumsq);
    fy_desc_encode(&reply, wire);
    assert_int_equal(fy_desc_decode(wire, sizeof wire, POOL, &back, NULL, 0), 0);
    memcpy(&out, &back.arg, sizeof out);
    assert_memory_equal(&out, &sumsq, sizeof out);
}

static void test_names(void **state)
{
    assert_string_equal(fy_op_name(FY_OP_READY), "ready");
    assert_string_equal(fy_op_name(FY_OP_STOP), "stop");
    assert_string_equal(fy_op_name(FY_OP_DONE), "done");
    assert_string_equal(fy_op_name(FY_OP_IO_READ), "io-read");
    assert_string_equal(fy_op_name(FY_OP_OPT_ADAMW), "opt-adamw");
    assert_string_equal(fy_op_name(FY_OP_OPT_SUMSQ), "opt-sumsq");
    assert_string_equal(fy_op_name(FY_OP_PING), "ping");
    assert_string_equal(fy_op_name(0), "unknown-op");
    assert_string_equal(fy_op_name(-1), "unknown-op");
    assert_string_equal(fy_op_name(FY_OP_COUNT), "unknown-op");
    assert_string_equal(fy_op_name(100000), "unknown-op");
    for (int op = 1; op < FY_OP_COUNT; op++) {
        assert_non_null(fy_op_name(op));
        assert_string_not_equal(fy_op_name(op), "unknown-op");
    }

    assert_string_equal(fy_kind_name(FY_KIND_CONTROL), "control");
    assert_string_equal(fy_kind_name(FY_KIND_WEIGHTS), "weights");
    assert_string_equal(fy_kind_name(FY_KIND_ADAM_V), "adam-v");
    assert_string_equal(fy_kind_name(FY_KIND_RAW), "raw");
    assert_string_equal(fy_kind_name(-1), "unknown-kind");
    assert_string_equal(fy_kind_name(FY_KIND_COUNT), "unknown-kind");
    assert_string_equal(fy_kind_name(1 << 20), "unknown-kind");
    for (int k = 0; k < FY_KIND_COUNT; k++) {
        assert_non_null(fy_kind_name(k));
        assert_string_not_equal(fy_kind_name(k), "unknown-kind");
    }

    char buf[256];
    struct fy_desc d = sample();
    fy_desc_format(&d, buf, sizeof buf);
    assert_non_null(strstr(buf, "io-read"));
    assert_non_null(strstr(buf, "seq=42"));
    assert_non_null(strstr(buf, "master"));
}

/* gpu replies carry the device time of their copies: microseconds, rounded, clamped, never
 * negative, and they survive the wire. */
static void test_copy_times(void **state)
{
    (void)state;
    struct fy_desc r = fy_desc_region(FY_OP_DONE, FY_KIND_CONTROL, FY_DTYPE_NONE, 0, 0, 0), back;
    fy_desc_set_copy_times(&r, 0.0123456, 2.5e-6);
    uint8_t wire[FY_DESC_WIRE_BYTES];
    fy_desc_encode(&r, wire);
    assert_int_equal(fy_desc_decode(wire, sizeof wire, 0, &back, NULL, 0), 0);
    double h2d, d2h;
    fy_desc_copy_times(&back, &h2d, &d2h);
    assert_true(h2d == 12346e-6);
    assert_true(d2h == 3e-6);
    fy_desc_set_copy_times(&r, -1.0, 1e9); /* nonsense in, still sane out */
    fy_desc_copy_times(&r, &h2d, &d2h);
    assert_true(h2d == 0.0);
    assert_true(d2h == 1e-6 * INT32_MAX);
}

static void test_random_roundtrip(void **state)
{
    uint64_t seed = 99;
    for (int i = 0; i < 2000; i++) {
        struct fy_desc d;
        d.kind = (uint16_t)(fy_test_rand(&seed) % FY_KIND_COUNT);
        d.op = (uint16_t)(1 + fy_test_rand(&seed) % (FY_OP_COUNT - 1));
        d.dtype = (uint16_t)(fy_test_rand(&seed) % FY_DTYPE_COUNT);
        d.status = (int32_t)(uint32_t)fy_test_rand(&seed);
        d.step = fy_test_rand(&seed);
        d.layer = (int32_t)(uint32_t)fy_test_rand(&seed);
        d.tensor = (uint32_t)fy_test_rand(&seed);
        size_t elem = fy_dtype_size(d.dtype);
        d.offset = (fy_test_rand(&seed) % (POOL / 2)) / elem * elem;
        d.bytes = (fy_test_rand(&seed) % (POOL / 2)) / elem * elem;
        d.seq = fy_test_rand(&seed);
        d.arg = fy_test_rand(&seed);
        uint8_t wire[FY_DESC_WIRE_BYTES];
        fy_desc_encode(&d, wire);
        struct fy_desc back;
        assert_int_equal(fy_desc_decode(wire, sizeof wire, POOL, &back, NULL, 0), 0);
        assert_desc_equal(&d, &back);
    }
}

int main(void)
{
    fy_log_init("test", FY_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_basic),
        cmocka_unit_test(test_copy_times),
        cmocka_unit_test(test_roundtrip_extremes),
        cmocka_unit_test(test_wire_layout),
        cmocka_unit_test(test_reject_length),
        cmocka_unit_test(test_reject_magic_and_version),
        cmocka_unit_test(test_reject_kind_op_dtype),
        cmocka_unit_test(test_reject_range),
        cmocka_unit_test(test_reject_element_size),
        cmocka_unit_test(test_control_skips_region),
        cmocka_unit_test(test_opt_sumsq),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_random_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
