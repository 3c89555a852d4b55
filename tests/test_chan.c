/* Tests of the descriptor transport (common/ipc/chan): endpoint naming, a ROUTER and a DEALER in
 * one process exchanging multi-part messages, receive timeouts, rejection of malformed messages
 * (with the next valid message still getting through) and sends to an unknown peer. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/ipc/chan.h"
#include "common/ipc/desc.h"
#include "common/base/dtype.h"
#include "common/base/log.h"
#include "tests/testutil.h"

#define POOL_SIZE ((uint64_t)64 << 20)
/* Generous: the machine may be loaded; a message that is on its way arrives long before this. */
#define WAIT_MS 20000

struct fixture {
    char *dir;
    char endpoint[256];
    struct fy_chan *router;
    struct fy_chan *dealer;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static struct fy_desc ping(uint64_t seq)
{
    struct fy_desc d;
    memset(&d, 0, sizeof d);
    d.kind = FY_KIND_CONTROL;
    d.op = FY_OP_PING;
    d.dtype = FY_DTYPE_NONE;
    d.layer = -1;
    d.seq = seq;
    return d;
}

static struct fy_desc region(uint16_t kind, uint64_t offset, uint64_t bytes, uint64_t seq)
{
    struct fy_desc d;
    memset(&d, 0, sizeof d);
    d.kind = kind;
    d.op = FY_OP_OPT_ADAMW;
    d.dtype = FY_DTYPE_F32;
    d.status = -7;
    d.step = 1ull << 40;
    d.layer = 5;
    d.tensor = 9;
    d.offset = offset;
    d.bytes = bytes;
    d.seq = seq;
    d.arg = UINT64_MAX - 1;
    return d;
}

static void assert_desc_equal(const struct fy_desc *a, const struct fy_desc *b)
{
    assert_string_equal(fy_test_desc_diff(a, b), "");
}

/* The router receives one valid message with the given seq from "gpu". */
static void router_expect_ping(struct fixture *f, uint64_t seq)
{
    struct fy_desc d[FY_DESC_MAX_PARTS];
    char peer[FY_CHAN_PEER_MAX] = "";
    int n = fy_chan_recv(f->router, peer, d, FY_DESC_MAX_PARTS, WAIT_MS, "ping", "gpu");
    assert_int_equal(n, 1);
    assert_string_equal(peer, "gpu");
    assert_int_equal(d[0].op, FY_OP_PING);
    assert_true(d[0].seq == seq);
}

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->dir = fy_test_tmpdir("chan");
    assert_non_null(f->dir);
    char ipc[4096];
    snprintf(ipc, sizeof ipc, "%s/ipc", f->dir);
    assert_int_equal(mkdir(ipc, 0700), 0);
    assert_int_equal(fy_chan_endpoint(f->dir, "ctl", f->endpoint, sizeof f->endpoint), 0);
    assert_int_equal(fy_chan_bind(&f->router, f->endpoint, "launch"), 0);
    assert_int_equal(fy_chan_connect(&f->dealer, f->endpoint, "gpu"), 0);
    fy_chan_set_pool_size(f->router, POOL_SIZE);
    fy_chan_set_pool_size(f->dealer, POOL_SIZE);
    /* ZeroMQ connects asynchronously: the router learns the peer from its first message. */
    struct fy_desc d = ping(1);
    assert_int_equal(fy_chan_send(f->dealer, NULL, &d, 1), 0);
    router_expect_ping(f, 1);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    if (f == NULL)
        return 0;
    fy_chan_destroy(&f->dealer);
    fy_chan_destroy(&f->router);
    assert_null(f->dealer);
    fy_chan_destroy(&f->router); /* safe twice */
    fy_test_rmdir(f->dir);
    free(f->dir);
    free(f);
    return 0;
}

static void test_endpoint(void **state)
{
    char out[256];
    assert_int_equal(fy_chan_endpoint("/tmp/run", "ctl", out, sizeof out), 0);
    assert_string_equal(out, "ipc:///tmp/run/ipc/ctl");

    /* "DIR/ipc/NAME" of exactly 107 bytes still fits; 108 does not */
    char dir[300];
    size_t dlen = FY_CHAN_IPC_PATH_MAX - strlen("/ipc/ctl");
    memset(dir, 'd', dlen);
    dir[0] = '/';
    dir[dlen] = 0;
    assert_int_equal(fy_chan_endpoint(dir, "ctl", out, sizeof out), 0);
    assert_true(strncmp(out, "ipc:///", 7) == 0);
    assert_int_equal(strlen(out), strlen("ipc://") + FY_CHAN_IPC_PATH_MAX);
    dir[dlen] = 'd';
    dir[dlen + 1] = 0;
    assert_int_equal(fy_chan_endpoint(dir, "ctl", out, sizeof out), 0);
    assert_true(strncmp(out, "ipc://@fuyou-", 13) == 0);

    /* a long directory: an abstract name, stable, different for a different directory */
    char longdir[300];
    memset(longdir, 'x', 200);
    longdir[0] = '/';
    longdir[200] = 0;
    assert_true(strlen(longdir) > 107);
    char a[256], b[256], c[256];
    assert_int_equal(fy_chan_endpoint(longdir, "ctl", a, sizeof a), 0);
    assert_true(strncmp(a, "ipc://@fuyou-", 13) == 0);
    assert_int_equal(strlen(a), strlen("ipc://@fuyou-") + 16 + strlen("-ctl"));
    for (size_t i = 13; i < 13 + 16; i++)
        assert_non_null(strchr("0123456789abcdef", a[i]));
    assert_string_equal(a + 13 + 16, "-ctl");
    assert_int_equal(fy_chan_endpoint(longdir, "ctl", b, sizeof b), 0);
    assert_string_equal(a, b);
    longdir[100] = 'y';
    assert_int_equal(fy_chan_endpoint(longdir, "ctl", c, sizeof c), 0);
    assert_string_not_equal(a, c);
    assert_int_equal(fy_chan_endpoint(longdir, "io", c, sizeof c), 0);
    assert_true(strcmp(c + strlen(c) - 3, "-io") == 0);

    /* too small an output buffer */
    char small[12];
    assert_int_equal(fy_chan_endpoint("/tmp/run", "ctl", small, sizeof small), -ENAMETOOLONG);
    assert_int_equal(fy_chan_endpoint(longdir, "ctl", small, sizeof small), -ENAMETOOLONG);
}

static void test_abstract_endpoint_works(void **state)
{
    /* A long run directory that does not exist: the abstract endpoint needs no file. Include the
     * pid so concurrent runs do not collide. */
    char longdir[300];
    int n = snprintf(longdir, sizeof longdir, "/tmp/fuyou-test-chan-%d-", (int)getpid());
    memset(longdir + n, 'z', 150);
    longdir[n + 150] = 0;
    char ep[256];
    assert_int_equal(fy_chan_endpoint(longdir, "ctl", ep, sizeof ep), 0);
    assert_true(strncmp(ep, "ipc://@", 7) == 0);
    struct fy_chan *r = NULL, *d = NULL;
    assert_int_equal(fy_chan_bind(&r, ep, "launch"), 0);
    assert_int_equal(fy_chan_connect(&d, ep, "io"), 0);
    struct fy_desc m = ping(77), got[2];
    assert_int_equal(fy_chan_send(d, NULL, &m, 1), 0);
    char peer[FY_CHAN_PEER_MAX] = "";
    assert_int_equal(fy_chan_recv(r, peer, got, 2, WAIT_MS, "ping", "io"), 1);
    assert_string_equal(peer, "io");
    assert_true(got[0].seq == 77);
    fy_chan_destroy(&d);
    fy_chan_destroy(&r);
}

static void test_roundtrip(void **state)
{
    struct fixture *f = *state;
    struct fy_desc out[3] = {
        region(FY_KIND_GRAD, 4u << 20, 4096, 1000),
        region(FY_KIND_MASTER, 8u << 20, 8192, 1000),
        region(FY_KIND_ADAM_M, POOL_SIZE - 4096, 4096, 1000), /* ends at the pool end */
    };
    assert_int_equal(fy_chan_send(f->dealer, NULL, out, 3), 0);
    struct fy_desc in[FY_DESC_MAX_PARTS];
    memset(in, 0xee, sizeof in);
    char peer[FY_CHAN_PEER_MAX] = "";
    assert_int_equal(fy_chan_recv(f->router, peer, in, FY_DESC_MAX_PARTS, WAIT_MS, "step", "gpu"),
                     3);
    assert_string_equal(peer, "gpu");
    for (int i = 0; i < 3; i++)
        assert_desc_equal(&in[i], &out[i]);

    /* the router answers the peer */
    struct fy_desc reply = ping(1000);
    reply.op = FY_OP_DONE;
    reply.status = -EIO;
    assert_int_equal(fy_chan_send(f->router, "gpu", &reply, 1), 0);
    strcpy(peer, "junk");
    assert_int_equal(fy_chan_recv(f->dealer, peer, in, FY_DESC_MAX_PARTS, WAIT_MS, "done",
                                  "launcher"),
                     1);
    assert_string_equal(peer, "launcher");
    assert_desc_equal(&in[0], &reply);

    /* a full message of FY_DESC_MAX_PARTS parts, and a NULL peer on the receiving side */
    struct fy_desc full[FY_DESC_MAX_PARTS];
    for (int i = 0; i < FY_DESC_MAX_PARTS; i++)
        full[i] = region(FY_KIND_WEIGHTS, (uint64_t)i << 20, 1024, 2000);
    assert_int_equal(fy_chan_send(f->router, "gpu", full, FY_DESC_MAX_PARTS), 0);
    assert_int_equal(fy_chan_recv(f->dealer, NULL, in, FY_DESC_MAX_PARTS, WAIT_MS, "x", "y"),
                     FY_DESC_MAX_PARTS);
    for (int i = 0; i < FY_DESC_MAX_PARTS; i++)
        assert_desc_equal(&in[i], &full[i]);

    /* messages arrive in order */
    for (uint64_t s = 10; s < 20; s++) {
        struct fy_desc d = ping(s);
        assert_int_equal(fy_chan_send(f->dealer, NULL, &d, 1), 0);
    }
    for (uint64_t s = 10; s < 20; s++)
        router_expect_ping(f, s);

    /* the socket is exposed for polling */
    assert_non_null(fy_chan_socket(f->router));
    assert_non_null(fy_chan_socket(f->dealer));
}

static void test_send_count_limits(void **state)
{
    struct fixture *f = *state;
    struct fy_desc d[FY_DESC_MAX_PARTS + 1];
    for (int i = 0; i <= FY_DESC_MAX_PARTS; i++)
        d[i] = ping(5);
    assert_int_equal(fy_chan_send(f->dealer, NULL, d, 0), -EINVAL);
    assert_int_equal(fy_chan_send(f->dealer, NULL, d, FY_DESC_MAX_PARTS + 1), -EINVAL);
    assert_int_equal(fy_chan_send_raw(f->router, NULL, d, 1), -EINVAL); /* router needs a peer */
    /* nothing was sent */
    struct fy_desc in[FY_DESC_MAX_PARTS];
    assert_int_equal(fy_chan_recv(f->router, NULL, in, FY_DESC_MAX_PARTS, 100, "nothing", "gpu"),
                     -ETIMEDOUT);
}

static void test_timeout(void **state)
{
    struct fixture *f = *state;
    struct fy_desc in[FY_DESC_MAX_PARTS];
    char peer[FY_CHAN_PEER_MAX];
    double t0 = now_ms();
    assert_int_equal(fy_chan_recv(f->dealer, peer, in, FY_DESC_MAX_PARTS, 100, "reply", "launcher"),
                     -ETIMEDOUT);
    double t1 = now_ms();
    assert_true(t1 - t0 >= 90.0);
    assert_int_equal(fy_chan_recv(f->router, peer, in, FY_DESC_MAX_PARTS, 100, "request", "gpu"),
                     -ETIMEDOUT);
    assert_true(now_ms() - t1 >= 90.0);
    assert_int_equal(fy_chan_recv(f->router, peer, in, FY_DESC_MAX_PARTS, 0, "request", "gpu"),
                     -ETIMEDOUT);
    /* a message sent after a timeout is still received */
    struct fy_desc d = ping(3);
    assert_int_equal(fy_chan_send(f->dealer, NULL, &d, 1), 0);
    router_expect_ping(f, 3);
}

/* Sends bytes raw from the dealer; the router must reject them with `code`, then accept a ping. */
static void expect_rejected(struct fixture *f, const void *bytes, size_t len, unsigned max,
                            int code, uint64_t want_seq)
{
    assert_int_equal(fy_chan_send_raw(f->dealer, NULL, bytes, len), 0);
    struct fy_desc in[FY_DESC_MAX_PARTS];
    memset(in, 0xee, sizeof in);
    char peer[FY_CHAN_PEER_MAX] = "";
    int rc = fy_chan_recv(f->router, peer, in, max, WAIT_MS, "request", "gpu");
    if (rc != code)
        fail_msg("%zu-byte message: recv gave %d, expected %d", len, rc, code);
    assert_string_equal(peer, "gpu"); /* the receiver knows whom to answer */
    assert_true(in[0].seq == want_seq);
    static uint64_t next = 100000;
    struct fy_desc d = ping(next);
    assert_int_equal(fy_chan_send(f->dealer, NULL, &d, 1), 0);
    router_expect_ping(f, next);
    next++;
}

static void test_malformed(void **state)
{
    struct fixture *f = *state;
    uint8_t buf[(FY_DESC_MAX_PARTS + 2) * FY_DESC_WIRE_BYTES];
    struct fy_desc d = region(FY_KIND_GRAD, 4u << 20, 4096, 31337);

    /* wrong lengths: one byte short, one byte over, empty */
    fy_desc_encode(&d, buf);
    expect_rejected(f, buf, FY_DESC_WIRE_BYTES - 1, FY_DESC_MAX_PARTS, -EBADMSG, 0);
    memset(buf + FY_DESC_WIRE_BYTES, 0, FY_DESC_WIRE_BYTES);
    expect_rejected(f, buf, FY_DESC_WIRE_BYTES + 1, FY_DESC_MAX_PARTS, -EBADMSG, 31337);
    expect_rejected(f, buf, 0, FY_DESC_MAX_PARTS, -EBADMSG, 0);

    /* bad magic: the seq can still be read so the receiver can answer */
    fy_desc_encode(&d, buf);
    buf[1] ^= 0x20;
    expect_rejected(f, buf, FY_DESC_WIRE_BYTES, FY_DESC_MAX_PARTS, -EBADMSG, 31337);

    /* another version */
    fy_desc_encode(&d, buf);
    buf[4] = FY_DESC_VERSION + 1;
    expect_rejected(f, buf, FY_DESC_WIRE_BYTES, FY_DESC_MAX_PARTS, -EBADMSG, 31337);

    /* random garbage of descriptor size */
    uint64_t seed = 4;
    for (size_t i = 0; i < FY_DESC_WIRE_BYTES; i += 8) {
        uint64_t r = fy_test_rand(&seed);
        memcpy(buf + i, &r, 8);
    }
    assert_int_equal(fy_chan_send_raw(f->dealer, NULL, buf, FY_DESC_WIRE_BYTES), 0);
    struct fy_desc in[FY_DESC_MAX_PARTS];
    assert_true(fy_chan_recv(f->router, NULL, in, FY_DESC_MAX_PARTS, WAIT_MS, "x", "gpu") < 0);
    struct fy_desc after = ping(555);
    assert_int_equal(fy_chan_send(f->dealer, NULL, &after, 1), 0);
    router_expect_ping(f, 555);

    /* two parts with different seq */
    struct fy_desc two[2] = {d, d};
    two[1].seq = d.seq + 1;
    fy_desc_encode(&two[0], buf);
    fy_desc_encode(&two[1], buf + FY_DESC_WIRE_BYTES);
    expect_rejected(f, buf, 2 * FY_DESC_WIRE_BYTES, FY_DESC_MAX_PARTS, -EBADMSG, 31337);
    /* two parts with different op */
    two[1] = d;
    two[1].op = FY_OP_IO_READ;
    fy_desc_encode(&two[1], buf + FY_DESC_WIRE_BYTES);
    expect_rejected(f, buf, 2 * FY_DESC_WIRE_BYTES, FY_DESC_MAX_PARTS, -EBADMSG, 31337);

    /* more than FY_DESC_MAX_PARTS parts, each valid on its own */
    for (int i = 0; i < FY_DESC_MAX_PARTS + 1; i++)
        fy_desc_encode(&d, buf + i * FY_DESC_WIRE_BYTES);
    expect_rejected(f, buf, (FY_DESC_MAX_PARTS + 1) * FY_DESC_WIRE_BYTES, FY_DESC_MAX_PARTS,
                    -EBADMSG, 31337);
    expect_rejected(f, buf, (FY_DESC_MAX_PARTS + 2) * FY_DESC_WIRE_BYTES, FY_DESC_MAX_PARTS,
                    -EBADMSG, 31337);
    /* more parts than the receiver has room for */
    expect_rejected(f, buf, 3 * FY_DESC_WIRE_BYTES, 2, -EBADMSG, 31337);

    /* a region outside the pool */
    struct fy_desc out = region(FY_KIND_GRAD, POOL_SIZE - 4096, 8192, 42);
    fy_desc_encode(&out, buf);
    expect_rejected(f, buf, FY_DESC_WIRE_BYTES, FY_DESC_MAX_PARTS, -ERANGE, 42);
    out = region(FY_KIND_GRAD, UINT64_MAX - 10, 100, 43);
    fy_desc_encode(&out, buf);
    expect_rejected(f, buf, FY_DESC_WIRE_BYTES, FY_DESC_MAX_PARTS, -ERANGE, 43);
    /* ... in the second part: still rejected */
    out = region(FY_KIND_GRAD, POOL_SIZE, 4096, 31337);
    fy_desc_encode(&d, buf);
    fy_desc_encode(&out, buf + FY_DESC_WIRE_BYTES);
    expect_rejected(f, buf, 2 * FY_DESC_WIRE_BYTES, FY_DESC_MAX_PARTS, -ERANGE, 31337);

    /* unknown op, kind, dtype */
    out = d;
    out.op = FY_OP_COUNT;
    fy_desc_encode(&out, buf);
    expect_rejected(f, buf, FY_DESC_WIRE_BYTES, FY_DESC_MAX_PARTS, -EPROTO, 31337);
    out = d;
    out.kind = FY_KIND_COUNT;
    fy_desc_encode(&out, buf);
    expect_rejected(f, buf, FY_DESC_WIRE_BYTES, FY_DESC_MAX_PARTS, -EPROTO, 31337);
    out = d;
    out.dtype = 200;
    fy_desc_encode(&out, buf);
    expect_rejected(f, buf, FY_DESC_WIRE_BYTES, FY_DESC_MAX_PARTS, -EPROTO, 31337);

    /* the region check follows the pool size set on the receiving channel */
    out = region(FY_KIND_GRAD, 4u << 20, 4096, 50);
    fy_chan_set_pool_size(f->router, 4u << 20); /* now the region lies past the end */
    fy_desc_encode(&out, buf);
    expect_rejected(f, buf, FY_DESC_WIRE_BYTES, FY_DESC_MAX_PARTS, -ERANGE, 50);
    fy_chan_set_pool_size(f->router, POOL_SIZE);
    assert_int_equal(fy_chan_send(f->dealer, NULL, &out, 1), 0);
    assert_int_equal(fy_chan_recv(f->router, NULL, in, FY_DESC_MAX_PARTS, WAIT_MS, "x", "gpu"), 1);
    assert_true(in[0].offset == (4u << 20));
}

static void test_multi_frame(void **state)
{
    /* The protocol sends one frame per message; a message of several frames (each a valid
     * descriptor) is rejected as a whole and fully drained, so the next message is read intact. */
    struct fixture *f = *state;
    uint8_t buf[FY_DESC_WIRE_BYTES];
    struct fy_desc d = ping(71);
    fy_desc_encode(&d, buf);
    void *sock = fy_chan_socket(f->dealer);
    assert_int_equal(zmq_send(sock, buf, sizeof buf, ZMQ_SNDMORE), (int)sizeof buf);
    assert_int_equal(zmq_send(sock, buf, sizeof buf, ZMQ_SNDMORE), (int)sizeof buf);
    assert_int_equal(zmq_send(sock, buf, sizeof buf, 0), (int)sizeof buf);
    struct fy_desc in[FY_DESC_MAX_PARTS];
    char peer[FY_CHAN_PEER_MAX] = "";
    assert_int_equal(fy_chan_recv(f->router, peer, in, FY_DESC_MAX_PARTS, WAIT_MS, "x", "gpu"),
                     -EBADMSG);
    assert_string_equal(peer, "gpu");
    assert_true(in[0].seq == 71);
    d = ping(72);
    assert_int_equal(fy_chan_send(f->dealer, NULL, &d, 1), 0);
    router_expect_ping(f, 72);
}

static void test_malformed_to_dealer(void **state)
{
    /* The dealer validates too: garbage from the launcher is rejected, the next reply gets in. */
    struct fixture *f = *state;
    uint8_t buf[FY_DESC_WIRE_BYTES];
    struct fy_desc d = ping(61);
    fy_desc_encode(&d, buf);
    buf[0] = 0;
    assert_int_equal(fy_chan_send_raw(f->router, "gpu", buf, sizeof buf), 0);
    struct fy_desc in[FY_DESC_MAX_PARTS];
    char peer[FY_CHAN_PEER_MAX] = "";
    assert_int_equal(fy_chan_recv(f->dealer, peer, in, FY_DESC_MAX_PARTS, WAIT_MS, "x", "launcher"),
                     -EBADMSG);
    assert_string_equal(peer, "launcher");
    assert_true(in[0].seq == 61);
    struct fy_desc r = region(FY_KIND_WEIGHTS, 0, 64, 62);
    r.op = FY_OP_IO_WRITE;
    r.dtype = FY_DTYPE_BF16;
    fy_chan_set_pool_size(f->dealer, 32); /* 64 bytes do not fit */
    assert_int_equal(fy_chan_send(f->router, "gpu", &r, 1), 0);
    assert_int_equal(fy_chan_recv(f->dealer, NULL, in, FY_DESC_MAX_PARTS, WAIT_MS, "x", "launcher"),
                     -ERANGE);
    assert_true(in[0].seq == 62);
    fy_chan_set_pool_size(f->dealer, 0); /* 0: every region is out of range */
    assert_int_equal(fy_chan_send(f->router, "gpu", &r, 1), 0);
    assert_int_equal(fy_chan_recv(f->dealer, NULL, in, FY_DESC_MAX_PARTS, WAIT_MS, "x", "launcher"),
                     -ERANGE);
    fy_chan_set_pool_size(f->dealer, POOL_SIZE);
    assert_int_equal(fy_chan_send(f->router, "gpu", &r, 1), 0);
    assert_int_equal(fy_chan_recv(f->dealer, NULL, in, FY_DESC_MAX_PARTS, WAIT_MS, "x", "launcher"),
                     1);
    assert_desc_equal(&in[0], &r);
}

static void test_unknown_peer(void **state)
{
    struct fixture *f = *state;
    struct fy_desc d = ping(9);
    int rc = fy_chan_send(f->router, "nobody", &d, 1);
    assert_true(rc < 0);
    assert_int_equal(rc, -EHOSTUNREACH);
    rc = fy_chan_send_raw(f->router, "gp", &d, 0);
    assert_int_equal(rc, -EHOSTUNREACH);
    /* the known peer still works afterwards, and receives nothing of the failed sends */
    d.seq = 10;
    assert_int_equal(fy_chan_send(f->router, "gpu", &d, 1), 0);
    struct fy_desc in[FY_DESC_MAX_PARTS];
    assert_int_equal(fy_chan_recv(f->dealer, NULL, in, FY_DESC_MAX_PARTS, WAIT_MS, "x", "launcher"),
                     1);
    assert_true(in[0].seq == 10);
    assert_int_equal(fy_chan_recv(f->dealer, NULL, in, FY_DESC_MAX_PARTS, 100, "x", "launcher"),
                     -ETIMEDOUT);
}

static void test_bind_connect_errors(void **state)
{
    struct fy_chan *c = (struct fy_chan *)1;
    assert_true(fy_chan_bind(&c, "not-an-endpoint", "launch") < 0);
    assert_null(c);
    c = (struct fy_chan *)1;
    assert_true(fy_chan_bind(&c, "ipc:///nonexistent-dir-fuyou-test/ipc/ctl", "launch") < 0);
    assert_null(c);
    /* the existing binding is unharmed by the failed ones */
    struct fixture *f = *state;
    struct fy_desc d = ping(99);
    assert_int_equal(fy_chan_send(f->dealer, NULL, &d, 1), 0);
    router_expect_ping(f, 99);
}

int main(void)
{
    fy_log_init("test", FY_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_endpoint),
        cmocka_unit_test(test_abstract_endpoint_works),
        cmocka_unit_test_setup_teardown(test_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_send_count_limits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_multi_frame, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_to_dealer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_peer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bind_connect_errors, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
