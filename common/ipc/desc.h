/* Tensor descriptors: the fixed-size messages that name a region of the shared pool, what it holds
 * and what to do with it. Encoded little-endian into 64 bytes; decoding validates every field.
 *
 * The optimizer's two requests (opt_worker/optstep.h has the details):
 *   opt-adamw  parts GRAD, the state's sections (MASTER, ADAM_M, ADAM_V: common/model/optstate.h) of
 *              a unit in one piece or of one piece of a unit (its index in the MASTER part's
 *              tensor), or one STATE part (a unit's pieces all), [WEIGHTS] (a bf16 copy to
 *              rewrite), [TOKENS] (the rows to update, the row length in its arg); the MASTER (or
 *              STATE) part's arg is the learning rate and the GRAD part's arg the gradient scale of
 *              global-norm clipping (IEEE double bits each; 0: the run's lr, no scaling): each
 *              value travels in the part it is about.
 *   opt-sumsq  one GRAD part; the reply's arg is the sum of its squared elements (double bits).
 *   opt-convert  a MASTER part (f32) and a WEIGHTS part (bf16, or f32: copied) of as many
 *              elements, not overlapping, or a STATE part (a unit's pieces) and its WEIGHTS: the
 *              weights rounded to bf16 (fy_f32_to_bf16) for a gpu request.
 * What `arg` holds depends on the op and the part's kind (struct fy_desc), and a reply, which names
 * no region, carries timings in the region's fields. */
#ifndef FY_DESC_H
#define FY_DESC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FY_DESC_MAGIC 0x53445946u /* "FYDS" */
#define FY_DESC_VERSION 3
#define FY_DESC_WIRE_BYTES 64
/* Most descriptors one message may carry (an optimizer step names up to eight regions: the
 * gradient, an int8 state's five sections, a weights copy and a row list). */
#define FY_DESC_MAX_PARTS 8

/* What a region holds. */
enum fy_kind {
    FY_KIND_CONTROL = 0, /* no region: a control message */
    FY_KIND_WEIGHTS = 1, /* compute-precision (bf16) weights */
    FY_KIND_MASTER = 2,  /* fp32 master weights */
    FY_KIND_ADAM_M = 3,
    FY_KIND_ADAM_V = 4,
    FY_KIND_GRAD = 5,
    FY_KIND_ACTIVATION = 6,
    FY_KIND_RAW = 7,          /* bytes with no tensor meaning (I/O of a packed extent) */
    FY_KIND_TOKENS = 8,       /* int32 token ids (inputs or targets) */
    FY_KIND_SAVED = 9,        /* a block's swapped forward internals: the kinds of the mask in `arg`
                           laid out by fy_actplan_region_of (common/model/actplan.h) */
    FY_KIND_ADAM_ABSMAX = 10, /* int8 moments' block absmax, m's then v's
                                 (common/model/optstate.h) */
    FY_KIND_ADAM_SMALL = 11,  /* int8 state: the f32 moments of small tensors, m's then v's */
    FY_KIND_STATE = 12,       /* a unit's whole optimizer state, its pieces one after another
                                 (common/model/optstate.h): an update or conversion of a unit
                                 in pieces */
    FY_KIND_COUNT
};

/* What to do with it. */
enum fy_op {
    FY_OP_READY = 1,    /* worker -> launcher: initialised; status = 0 */
    FY_OP_STOP = 2,     /* launcher -> worker: finish and exit */
    FY_OP_DONE = 3,     /* reply to a request: same seq, status = 0 or -errno */
    FY_OP_IO_ALLOC = 4, /* io: create extent `tensor` of `bytes` in the store */
    /* io reads and writes take an optional second part, a control descriptor: then a write's
     * reply arg is the digest (common/base/digest.h) of the bytes written, and a read fails with
     * -EBADMSG unless the bytes read have the digest in that part's arg; or, where that part's
     * step is FY_IO_DIGEST_REPORT, a read's reply arg is the digest of the bytes read, unchecked
     * (a piece of a unit's state, whose record holds the digest of all its pieces' together) */
    FY_OP_IO_READ = 5,  /* io: extent `tensor` at byte `arg` -> pool region */
    FY_OP_IO_WRITE = 6, /* io: pool region -> extent `tensor` at byte `arg` */
    FY_OP_IO_SYNC = 7,  /* io: make all written extents durable */
    FY_OP_GPU_SYNTH_GRAD =
        8,               /* gpu: write the synthetic gradient (seed `arg`, step) into the region */
    FY_OP_OPT_ADAMW = 9, /* opt: AdamW over the GRAD, MASTER, ADAM_M, ADAM_V (+WEIGHTS, +TOKENS)
                            parts */
    FY_OP_PING = 10,     /* any: reply DONE at once (liveness) */
    /* GPT on the gpu worker, one unit at a time; parts in the order given (see gpu_worker/gptexec.h) */
    FY_OP_GPT_EMBED_FWD = 11, /* tokens, embed weights -> x0 */
    FY_OP_GPT_BLOCK_FWD = 12, /* block weights, x -> y */
    FY_OP_GPT_HEAD = 13, /* x, targets, final and embed weights [-> dx, dfinal, dembed]; loss */
    FY_OP_GPT_BLOCK_BWD = 14, /* block weights, x, dy -> dx, dparams (and where the dparams
                                 part's arg is k > 0, also held on the device in buffer k - 1) */
    FY_OP_GPT_EMBED_BWD = 15, /* tokens, dx0 -> dembed += */
    FY_OP_OPT_SUMSQ = 16,     /* opt: sum of squares of the GRAD part, for global-norm clipping */
    FY_OP_GPT_PROFILE = 17,   /* gpu: measure a block (struct fy_block_profile of gpu_worker/
                                 backend.h) into the second part, copying through the first */
    FY_OP_GPT_GRAD_SEND = 18, /* gpu: block gradient held on the device (buffer `arg` of its
                                 GRAD part) -> that region (one-pass clipping) */
    FY_OP_OPT_CONVERT = 19,   /* opt: the MASTER part's f32 values rounded to bf16 into the WEIGHTS
                                 part (the same element count), the weights a gpu request reads */
    FY_OP_COUNT
};

/* The step of an io read's control part that asks for the digest read rather than checks it. */
#define FY_IO_DIGEST_REPORT 1

struct fy_desc {
    uint16_t kind;
    uint16_t op;
    uint16_t dtype;
    int32_t status;
    uint64_t step;
    int32_t layer; /* -1 when not about a layer */
    uint32_t tensor;
    uint64_t offset; /* byte offset of the region in the pool */
    uint64_t bytes;  /* region length in bytes */
    uint64_t seq;    /* request number; replies carry the request's */
    uint64_t arg;    /* op- and kind-specific: extent offset for I/O, extent size for io-alloc,
                        the digest in an I/O request's control part and in a write's reply, seed
                        for synthetic data; for opt-adamw the learning rate (MASTER part) and the
                        clipping scale (GRAD part) as IEEE double bits and the row length (TOKENS
                        part); the kinds' mask of a SAVED part; the loss (double bits) in a head
                        reply, the sum of squares (double bits) in an opt-sumsq reply */
};

/* DONE replies carry when the request's work ran: start and duration in ns of CLOCK_MONOTONIC, in
 * the offset and bytes fields (a reply names no region). */
void fy_desc_set_timing(struct fy_desc *reply, uint64_t start_ns, uint64_t end_ns);
uint64_t fy_monotonic_ns(void);
/* DONE replies of gpu requests also carry the device time of the request's copies to and from the
 * GPU, in microseconds, in the tensor and layer fields (0 where nothing was timed: CPU backend). */
void fy_desc_set_copy_times(struct fy_desc *reply, double h2d_s, double d2h_s);
void fy_desc_copy_times(const struct fy_desc *reply, double *h2d_s, double *d2h_s);

/* A descriptor naming a region, every other field zero. */
struct fy_desc fy_desc_region(int op, int kind, int dtype, uint64_t offset, uint64_t bytes, int layer);

/* Encodes d into exactly FY_DESC_WIRE_BYTES bytes. */
void fy_desc_encode(const struct fy_desc *d, uint8_t out[FY_DESC_WIRE_BYTES]);

/* Decodes and validates: magic, version, kind, op, dtype, and that [offset, offset+bytes) lies inside a
 * pool of pool_size bytes with bytes a multiple of the element size. Returns 0, -EBADMSG (magic or
 * version or length), -EPROTO (unknown kind/op/dtype), -ERANGE (region outside the pool). On error
 * `why` (if not NULL) says what was wrong; d holds whatever could be read (seq included). */
int fy_desc_decode(const uint8_t *in, size_t len, uint64_t pool_size, struct fy_desc *d, char *why,
                   size_t why_len);

/* Validation of an already-decoded descriptor, the same checks as decode. */
int fy_desc_validate(const struct fy_desc *d, uint64_t pool_size, char *why, size_t why_len);

const char *fy_op_name(int op);
const char *fy_kind_name(int kind);

/* A one-line human description for logs. */
void fy_desc_format(const struct fy_desc *d, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif
