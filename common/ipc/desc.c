/* Tensor descriptors: fixed 64-byte little-endian wire format with validation; nothing received is
 * trusted before fy_desc_decode has checked it. */
#include "common/ipc/desc.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/base/dtype.h"

/* Field slots in the wire format (byte offsets). */
enum {
    SLOT_MAGIC = 0,
    SLOT_VERSION = 4,
    SLOT_KIND = 6,
    SLOT_OP = 8,
    SLOT_DTYPE = 10,
    SLOT_STATUS = 12,
    SLOT_STEP = 16,
    SLOT_LAYER = 24,
    SLOT_TENSOR = 28,
    SLOT_OFFSET = 32,
    SLOT_BYTES = 40,
    SLOT_SEQ = 48,
    SLOT_ARG = 56,
};

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

void fy_desc_set_timing(struct fy_desc *reply, uint64_t start_ns, uint64_t end_ns)
{
    reply->offset = start_ns;
    reply->bytes = end_ns > start_ns ? end_ns - start_ns : 0;
}

void fy_desc_set_copy_times(struct fy_desc *reply, double h2d_s, double d2h_s)
{
    double h2d_us = h2d_s > 0 ? h2d_s * 1e6 + 0.5 : 0, d2h_us = d2h_s > 0 ? d2h_s * 1e6 + 0.5 : 0;
    reply->tensor = h2d_us < 4e9 ? (uint32_t)h2d_us : UINT32_MAX;
    reply->layer = d2h_us < 2e9 ? (int32_t)d2h_us : INT32_MAX;
}

void fy_desc_copy_times(const struct fy_desc *reply, double *h2d_s, double *d2h_s)
{
    *h2d_s = 1e-6 * (double)reply->tensor;
    *d2h_s = reply->layer > 0 ? 1e-6 * (double)reply->layer : 0.0;
}

uint64_t fy_monotonic_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

struct fy_desc fy_desc_region(int op, int kind, int dtype, uint64_t offset, uint64_t bytes, int layer)
{
    struct fy_desc d;
    memset(&d, 0, sizeof d);
    d.op = (uint16_t)op;
    d.kind = (uint16_t)kind;
    d.dtype = (uint16_t)dtype;
    d.offset = offset;
    d.bytes = bytes;
    d.layer = layer;
    return d;
}

void fy_desc_encode(const struct fy_desc *d, uint8_t out[FY_DESC_WIRE_BYTES])
{
    memset(out, 0, FY_DESC_WIRE_BYTES);
    put_u32(out + SLOT_MAGIC, FY_DESC_MAGIC);
    put_u16(out + SLOT_VERSION, FY_DESC_VERSION);
    put_u16(out + SLOT_KIND, d->kind);
    put_u16(out + SLOT_OP, d->op);
    put_u16(out + SLOT_DTYPE, d->dtype);
    put_u32(out + SLOT_STATUS, (uint32_t)d->status);
    put_u64(out + SLOT_STEP, d->step);
    put_u32(out + SLOT_LAYER, (uint32_t)d->layer);
    put_u32(out + SLOT_TENSOR, d->tensor);
    put_u64(out + SLOT_OFFSET, d->offset);
    put_u64(out + SLOT_BYTES, d->bytes);
    put_u64(out + SLOT_SEQ, d->seq);
    put_u64(out + SLOT_ARG, d->arg);
}

static int invalid(char *why, size_t why_len, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int invalid(char *why, size_t why_len, int code, const char *fmt, ...)
{
    if (why != NULL && why_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
    }
    return code;
}

int fy_desc_validate(const struct fy_desc *d, uint64_t pool_size, char *why, size_t why_len)
{
    if (d->kind >= FY_KIND_COUNT)
        return invalid(why, why_len, -EPROTO, "unknown kind %u", d->kind);
    if (d->op == 0 || d->op >= FY_OP_COUNT)
        return invalid(why, why_len, -EPROTO, "unknown op %u", d->op);
    size_t elem = fy_dtype_size(d->dtype);
    if (elem == 0)
        return invalid(why, why_len, -EPROTO, "unknown dtype %u", d->dtype);
    if (d->kind == FY_KIND_CONTROL)
        return 0;
    if (d->offset > pool_size || d->bytes > pool_size - d->offset)
        return invalid(why, why_len, -ERANGE,
                       "region [%llu, +%llu) lies outside the %llu-byte pool",
                       (unsigned long long)d->offset, (unsigned long long)d->bytes,
                       (unsigned long long)pool_size);
    if (d->bytes % elem != 0 || d->offset % elem != 0)
        return invalid(why, why_len, -ERANGE, "region [%llu, +%llu) is not aligned to %s elements",
                       (unsigned long long)d->offset, (unsigned long long)d->bytes,
                       fy_dtype_name(d->dtype));
    return 0;
}

int fy_desc_decode(const uint8_t *in, size_t len, uint64_t pool_size, struct fy_desc *d, char *why,
                   size_t why_len)
{
    memset(d, 0, sizeof *d);
    if (len != FY_DESC_WIRE_BYTES)
        return invalid(why, why_len, -EBADMSG, "descriptor is %zu bytes, expected %d", len,
                       FY_DESC_WIRE_BYTES);
    d->kind = get_u16(in + SLOT_KIND);
    d->op = get_u16(in + SLOT_OP);
    d->dtype = get_u16(in + SLOT_DTYPE);
    d->status = (int32_t)get_u32(in + SLOT_STATUS);
    d->step = get_u64(in + SLOT_STEP);
    d->layer = (int32_t)get_u32(in + SLOT_LAYER);
    d->tensor = get_u32(in + SLOT_TENSOR);
    d->offset = get_u64(in + SLOT_OFFSET);
    d->bytes = get_u64(in + SLOT_BYTES);
    d->seq = get_u64(in + SLOT_SEQ);
    d->arg = get_u64(in + SLOT_ARG);
    uint32_t magic = get_u32(in + SLOT_MAGIC);
    if (magic != FY_DESC_MAGIC)
        return invalid(why, why_len, -EBADMSG, "bad magic 0x%08x (expected 0x%08x)", magic,
                       FY_DESC_MAGIC);
    uint16_t version = get_u16(in + SLOT_VERSION);
    if (version != FY_DESC_VERSION)
        return invalid(why, why_len, -EBADMSG,
                       "descriptor version %u, this build speaks %d (mixed builds? rebuild all)",
                       version, FY_DESC_VERSION);
    return fy_desc_validate(d, pool_size, why, why_len);
}

const char *fy_op_name(int op)
{
    static const char *const names[FY_OP_COUNT] = {
        [FY_OP_READY] = "ready",       [FY_OP_STOP] = "stop",
        [FY_OP_DONE] = "done",         [FY_OP_IO_ALLOC] = "io-alloc",
        [FY_OP_IO_READ] = "io-read",   [FY_OP_IO_WRITE] = "io-write",
        [FY_OP_IO_SYNC] = "io-sync",   [FY_OP_GPU_SYNTH_GRAD] = "gpu-synth-grad",
        [FY_OP_OPT_ADAMW] = "opt-adamw", [FY_OP_PING] = "ping",
        [FY_OP_GPT_EMBED_FWD] = "gpt-embed-fwd", [FY_OP_GPT_BLOCK_FWD] = "gpt-block-fwd",
        [FY_OP_GPT_HEAD] = "gpt-head", [FY_OP_GPT_BLOCK_BWD] = "gpt-block-bwd",
        [FY_OP_GPT_EMBED_BWD] = "gpt-embed-bwd", [FY_OP_OPT_SUMSQ] = "opt-sumsq",
        [FY_OP_GPT_PROFILE] = "gpt-profile", [FY_OP_GPT_GRAD_SEND] = "gpt-grad-send",
        [FY_OP_OPT_CONVERT] = "opt-convert",
    };
    if (op <= 0 || op >= FY_OP_COUNT || names[op] == NULL)
        return "unknown-op";
    return names[op];
}

const char *fy_kind_name(int kind)
{
    static const char *const names[FY_KIND_COUNT] = {
        [FY_KIND_CONTROL] = "control",
        [FY_KIND_WEIGHTS] = "weights",
        [FY_KIND_MASTER] = "master",
        [FY_KIND_ADAM_M] = "adam-m",
        [FY_KIND_ADAM_V] = "adam-v",
        [FY_KIND_GRAD] = "grad",
        [FY_KIND_ACTIVATION] = "activation",
        [FY_KIND_RAW] = "raw",
        [FY_KIND_TOKENS] = "tokens",
        [FY_KIND_SAVED] = "saved",
        [FY_KIND_ADAM_ABSMAX] = "adam-absmax",
        [FY_KIND_ADAM_SMALL] = "adam-small",
        [FY_KIND_STATE] = "state",
    };
    if (kind < 0 || kind >= FY_KIND_COUNT)
        return "unknown-kind";
    return names[kind];
}

void fy_desc_format(const struct fy_desc *d, char *buf, size_t len)
{
    snprintf(buf, len, "%s seq=%llu kind=%s layer=%d tensor=%u step=%llu region=[%llu,+%llu) %s status=%d",
             fy_op_name(d->op), (unsigned long long)d->seq, fy_kind_name(d->kind), d->layer,
             d->tensor, (unsigned long long)d->step, (unsigned long long)d->offset,
             (unsigned long long)d->bytes, fy_dtype_name(d->dtype), d->status);
}
