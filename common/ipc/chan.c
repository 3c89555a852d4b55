/* Descriptor transport over ZeroMQ (ROUTER in the launcher, one DEALER per worker) with receive
 * timeouts and validation of everything received. */
#include "common/ipc/chan.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/base/check.h"

struct fy_chan {
    void *ctx;
    void *sock;
    int router;
    uint64_t pool_size;
    char self[FY_CHAN_PEER_MAX];
    char endpoint[256];
};

int fy_chan_endpoint(const char *run_dir, const char *name, char *out, size_t len)
{
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/ipc/%s", run_dir, name);
    if (n > 0 && n <= FY_CHAN_IPC_PATH_MAX) {
        FY_REQUIRE(snprintf(out, len, "ipc://%s", path) < (int)len, -ENAMETOOLONG,
                   "endpoint buffer too small for %s", path);
        return 0;
    }
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *c = run_dir; *c; c++)
        h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    FY_REQUIRE(snprintf(out, len, "ipc://@fuyou-%016llx-%s", (unsigned long long)h, name) < (int)len,
               -ENAMETOOLONG, "endpoint buffer too small");
    fy_info("run directory path too long for a Unix socket (%d > %d bytes): using abstract "
            "endpoint %s",
            n, FY_CHAN_IPC_PATH_MAX, out);
    return 0;
}

static int chan_new(struct fy_chan **out, int type, const char *endpoint, const char *self)
{
    *out = NULL;
    struct fy_chan *c = calloc(1, sizeof *c);
    if (c == NULL)
        return -ENOMEM;
    snprintf(c->self, sizeof c->self, "%s", self);
    snprintf(c->endpoint, sizeof c->endpoint, "%s", endpoint);
    c->router = type == ZMQ_ROUTER;
    c->ctx = zmq_ctx_new();
    if (c->ctx == NULL) {
        int e = zmq_errno();
        free(c);
        fy_error("zmq_ctx_new: %s", zmq_strerror(e));
        return -e;
    }
    c->sock = zmq_socket(c->ctx, type);
    int rc = c->sock ? 0 : -zmq_errno();
    int linger = 1000, one = 1;
    if (rc == 0 && zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger) != 0)
        rc = -zmq_errno();
    if (rc == 0 && c->router &&
        zmq_setsockopt(c->sock, ZMQ_ROUTER_MANDATORY, &one, sizeof one) != 0)
        rc = -zmq_errno();
    if (rc == 0 && !c->router &&
        zmq_setsockopt(c->sock, ZMQ_ROUTING_ID, self, strlen(self)) != 0)
        rc = -zmq_errno();
    if (rc == 0 && (c->router ? zmq_bind(c->sock, endpoint) : zmq_connect(c->sock, endpoint)) != 0)
        rc = -zmq_errno();
    if (rc < 0) {
        fy_error("%s: cannot %s %s: %s", self, c->router ? "bind" : "connect to", endpoint,
                 zmq_strerror(-rc));
        fy_chan_destroy(&c);
        return rc;
    }
    *out = c;
    return 0;
}

int fy_chan_bind(struct fy_chan **out, const char *endpoint, const char *self)
{
    return chan_new(out, ZMQ_ROUTER, endpoint, self);
}

int fy_chan_connect(struct fy_chan **out, const char *endpoint, const char *self)
{
    return chan_new(out, ZMQ_DEALER, endpoint, self);
}

void fy_chan_destroy(struct fy_chan **cp)
{
    if (cp == NULL || *cp == NULL)
        return;
    struct fy_chan *c = *cp;
    if (c->sock != NULL)
        zmq_close(c->sock);
    if (c->ctx != NULL)
        zmq_ctx_term(c->ctx);
    free(c);
    *cp = NULL;
}

void fy_chan_set_pool_size(struct fy_chan *c, uint64_t pool_size) { c->pool_size = pool_size; }
void *fy_chan_socket(struct fy_chan *c) { return c->sock; }

int fy_chan_send_raw(struct fy_chan *c, const char *peer, const void *bytes, size_t len)
{
    if (c->router) {
        FY_REQUIRE(peer != NULL, -EINVAL, "%s: send without a peer name", c->self);
        if (zmq_send(c->sock, peer, strlen(peer), ZMQ_SNDMORE) < 0) {
            int e = zmq_errno();
            fy_error("%s: cannot send to %s: %s%s", c->self, peer, zmq_strerror(e),
                     e == EHOSTUNREACH ? " (the peer is not connected: did it exit?)" : "");
            return -e;
        }
    }
    FY_ZMQ(zmq_send(c->sock, bytes, len, 0), "%s: cannot send %zu bytes to %s", c->self, len,
           peer ? peer : "launcher");
    return 0;
}

int fy_chan_send(struct fy_chan *c, const char *peer, const struct fy_desc *d, unsigned n)
{
    FY_REQUIRE(n >= 1 && n <= FY_DESC_MAX_PARTS, -EINVAL, "%s: message of %u descriptors", c->self,
               n);
    uint8_t buf[FY_DESC_MAX_PARTS * FY_DESC_WIRE_BYTES];
    for (unsigned i = 0; i < n; i++)
        fy_desc_encode(&d[i], buf + i * FY_DESC_WIRE_BYTES);
    return fy_chan_send_raw(c, peer, buf, n * FY_DESC_WIRE_BYTES);
}

/* Receives one frame into buf (truncated frames are detected by the returned size). */
static int recv_frame(void *sock, void *buf, size_t cap, int *more)
{
    int n = zmq_recv(sock, buf, cap, 0);
    if (n < 0)
        return -zmq_errno();
    int m = 0;
    size_t sz = sizeof m;
    if (zmq_getsockopt(sock, ZMQ_RCVMORE, &m, &sz) != 0)
        return -zmq_errno();
    *more = m;
    return n;
}

/* The descriptors of a message of len bytes into d (at most max of them); -EBADMSG with why for a
 * message that is not 1..max descriptors or whose parts are not of one request (d[0] decoded for
 * its seq where it can be, its status the error where a later part is bad). */
static int decode_parts(const struct fy_chan *c, const uint8_t *buf, int len, int extra_frames,
                        unsigned max, struct fy_desc *d, char *why, size_t whylen)
{
    memset(d, 0, sizeof *d);
    unsigned count = (unsigned)len / FY_DESC_WIRE_BYTES;
    if (extra_frames || len == 0 || len % FY_DESC_WIRE_BYTES != 0 || count > FY_DESC_MAX_PARTS ||
        count > max) {
        /* Decode what is there for its seq, but the message as a whole is malformed. */
        if (len >= FY_DESC_WIRE_BYTES)
            fy_desc_decode(buf, FY_DESC_WIRE_BYTES, c->pool_size, d, why, whylen);
        snprintf(why, whylen, "message of %d bytes%s is not 1..%u descriptors of %d bytes", len,
                 extra_frames ? " in several frames" : "",
                 max < FY_DESC_MAX_PARTS ? max : FY_DESC_MAX_PARTS, FY_DESC_WIRE_BYTES);
        return -EBADMSG;
    }
    for (unsigned i = 0; i < count; i++) {
        int rc = fy_desc_decode(buf + i * FY_DESC_WIRE_BYTES, FY_DESC_WIRE_BYTES, c->pool_size,
                                &d[i], why, whylen);
        if (rc == 0 && i > 0 && (d[i].op != d[0].op || d[i].seq != d[0].seq)) {
            snprintf(why, whylen, "part %u has op %s seq %llu, part 0 op %s seq %llu", i,
                     fy_op_name(d[i].op), (unsigned long long)d[i].seq, fy_op_name(d[0].op),
                     (unsigned long long)d[0].seq);
            rc = -EBADMSG;
        }
        if (rc < 0) {
            if (i > 0)
                d[0].status = rc;
            return rc;
        }
    }
    return (int)count;
}

int fy_chan_recv(struct fy_chan *c, char peer[FY_CHAN_PEER_MAX], struct fy_desc *d, unsigned max,
                 int timeout_ms, const char *awaiting, const char *from)
{
    zmq_pollitem_t item = {.socket = c->sock, .events = ZMQ_POLLIN};
    int ready = zmq_poll(&item, 1, timeout_ms);
    if (ready < 0) {
        int e = zmq_errno();
        if (e != EINTR)
            fy_error("%s: zmq_poll while waiting for %s from %s: %s", c->self, awaiting, from,
                     zmq_strerror(e));
        return -e;
    }
    if (ready == 0) {
        fy_error("%s: timed out after %d ms waiting for %s from %s", c->self, timeout_ms, awaiting,
                 from);
        return -ETIMEDOUT;
    }
    int more = 0;
    char who[FY_CHAN_PEER_MAX] = "launcher";
    if (c->router) {
        int n = recv_frame(c->sock, who, sizeof who - 1, &more);
        if (n < 0) {
            fy_error("%s: receive failed: %s", c->self, zmq_strerror(-n));
            return n;
        }
        who[n < (int)sizeof who ? n : (int)sizeof who - 1] = 0;
    }
    if (peer != NULL)
        snprintf(peer, FY_CHAN_PEER_MAX, "%s", who);
    uint8_t buf[FY_DESC_MAX_PARTS * FY_DESC_WIRE_BYTES + 1];
    int len = recv_frame(c->sock, buf, sizeof buf, &more);
    if (len < 0) {
        fy_error("%s: receive from %s failed: %s", c->self, who, zmq_strerror(-len));
        return len;
    }
    int extra_frames = 0;
    while (more) { /* drain a multi-frame message; this protocol never sends one */
        uint8_t sink[64];
        if (recv_frame(c->sock, sink, sizeof sink, &more) < 0)
            break;
        extra_frames = 1;
    }
    char why[256] = "";
    int rc = decode_parts(c, buf, len, extra_frames, max, d, why, sizeof why);
    if (rc < 0)
        fy_error("%s: rejected a malformed message from %s while waiting for %s: %s", c->self, who,
                 awaiting, why);
    return rc;
}
