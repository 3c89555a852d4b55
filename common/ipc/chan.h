/* Descriptor transport over ZeroMQ ipc endpoints in the run directory: the launcher binds a ROUTER,
 * each worker connects a DEALER named after itself. A message is 1..FY_DESC_MAX_PARTS descriptors;
 * every receive has a timeout and every received descriptor is validated before use. */
#ifndef FY_CHAN_H
#define FY_CHAN_H

#include <stddef.h>
#include <stdint.h>

#include "common/ipc/desc.h"

#define FY_CHAN_PEER_MAX 32
/* Longest path a Unix socket address holds (sun_path less the terminator). */
#define FY_CHAN_IPC_PATH_MAX 107

struct fy_chan;

/* "ipc://RUN_DIR/ipc/NAME" when the path fits a Unix socket address; otherwise a Linux abstract
 * name "ipc://@fuyou-<hash>-NAME" (logged), which leaves no file behind. */
int fy_chan_endpoint(const char *run_dir, const char *name, char *out, size_t len);

/* Launcher side: a ROUTER bound to endpoint. Sending to a peer that is not connected fails. */
int fy_chan_bind(struct fy_chan **out, const char *endpoint, const char *self);
/* Worker side: a DEALER whose routing id is `self` ("gpu", "io", "opt"). */
int fy_chan_connect(struct fy_chan **out, const char *endpoint, const char *self);
void fy_chan_destroy(struct fy_chan **c);

/* Region checks in received descriptors use this pool size (0: every region is out of range). */
void fy_chan_set_pool_size(struct fy_chan *c, uint64_t pool_size);
/* The ZeroMQ socket, for zmq_poll together with other descriptors. */
void *fy_chan_socket(struct fy_chan *c);

/* peer: routing id on the ROUTER side, ignored (NULL) on the DEALER side. */
int fy_chan_send(struct fy_chan *c, const char *peer, const struct fy_desc *d, unsigned n);
/* Sends bytes as they are (tests use it to send malformed messages). */
int fy_chan_send_raw(struct fy_chan *c, const char *peer, const void *bytes, size_t len);

/* Waits up to timeout_ms (-1: forever) for one message. Returns the number of descriptors, or:
 * -ETIMEDOUT, logged as "timed out after N ms waiting for <awaiting> from <from>";
 * -EBADMSG / -EPROTO / -ERANGE for a malformed message, logged as rejected with the reason; d[0]
 * then holds what could be decoded (its seq lets the receiver answer). peer gets the sender. */
int fy_chan_recv(struct fy_chan *c, char peer[FY_CHAN_PEER_MAX], struct fy_desc *d, unsigned max,
                 int timeout_ms, const char *awaiting, const char *from);

#endif
