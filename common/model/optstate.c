/* A unit's optimizer state layout in each format (fp32, bf16, int8), sections 4 KiB aligned. See
 * optstate.h. */
#include "common/model/optstate.h"

#include <limits.h>
#include <string.h>

#include "common/model/arch/arch.h"
#include "common/base/digest.h"

static uint64_t align4k(uint64_t v) { return (v + 4095) / 4096 * 4096; }

static uint64_t int8_blocks(uint64_t n)
{
    return (n + FY_OPTSTATE_INT8_BLOCK - 1) / FY_OPTSTATE_INT8_BLOCK;
}

/* The sections in order: name, descriptor kind. */
static const struct {
    const char *name;
    int kind;
} parts[FY_OPTSTATE_PARTS] = {
    [FY_OPTSTATE_MASTER] = {"master", FY_KIND_MASTER},
    [FY_OPTSTATE_ADAM_M] = {"adam_m", FY_KIND_ADAM_M},
    [FY_OPTSTATE_ADAM_V] = {"adam_v", FY_KIND_ADAM_V},
    [FY_OPTSTATE_ABSMAX] = {"adam_absmax", FY_KIND_ADAM_ABSMAX},
    [FY_OPTSTATE_SMALL] = {"adam_small", FY_KIND_ADAM_SMALL},
};

/* Whether a tensor of `count` values has 8-bit moments in `format`. */
static int quantized_by_size(int format, uint64_t count)
{
    return format == FY_OPTIM_STATE_INT8 && count >= FY_OPTSTATE_INT8_MIN;
}

/* Places tensors t[0..n) (begin, count, decay and quantized set) by the format's rule; sets at
 * and block, and adds up the layout's counts. */
static void place_tensors(int format, struct fy_optstate_tensor *t, unsigned n,
                          struct fy_optstate_layout *out)
{
    out->quantized = out->blocks = out->small = 0;
    for (unsigned i = 0; i < n; i++) {
        if (format != FY_OPTIM_STATE_INT8) {
            t[i].at = t[i].begin;
            t[i].block = 0;
        } else if (t[i].quantized) {
            t[i].at = out->quantized;
            t[i].block = out->blocks;
            out->quantized += t[i].count;
            out->blocks += int8_blocks(t[i].count);
        } else {
            t[i].at = out->small;
            t[i].block = 0;
            out->small += t[i].count;
        }
    }
    if (format != FY_OPTIM_STATE_INT8)
        out->quantized = 0;
}

/* The sections' element types and bytes from the counts, then their offsets. */
static void place_sections(int format, uint64_t params, struct fy_optstate_layout *out)
{
    uint64_t bytes[FY_OPTSTATE_PARTS];
    int dtype[FY_OPTSTATE_PARTS];
    dtype[FY_OPTSTATE_MASTER] = FY_DTYPE_F32;
    bytes[FY_OPTSTATE_MASTER] = params * 4;
    if (format == FY_OPTIM_STATE_INT8) {
        out->count = 5;
        dtype[FY_OPTSTATE_ADAM_M] = dtype[FY_OPTSTATE_ADAM_V] = FY_DTYPE_U8;
        bytes[FY_OPTSTATE_ADAM_M] = bytes[FY_OPTSTATE_ADAM_V] = out->quantized;
        dtype[FY_OPTSTATE_ABSMAX] = dtype[FY_OPTSTATE_SMALL] = FY_DTYPE_F32;
        bytes[FY_OPTSTATE_ABSMAX] = 2 * out->blocks * 4;
        bytes[FY_OPTSTATE_SMALL] = 2 * out->small * 4;
    } else {
        out->count = 3;
        int moments = format == FY_OPTIM_STATE_BF16 ? FY_DTYPE_BF16 : FY_DTYPE_F32;
        dtype[FY_OPTSTATE_ADAM_M] = dtype[FY_OPTSTATE_ADAM_V] = moments;
        bytes[FY_OPTSTATE_ADAM_M] = bytes[FY_OPTSTATE_ADAM_V] = params * fy_dtype_size(moments);
    }
    uint64_t at = 0;
    for (unsigned i = 0; i < out->count; i++) {
        struct fy_optstate_section *s = &out->section[i];
        *s = (struct fy_optstate_section){parts[i].name, parts[i].kind, dtype[i], at, bytes[i],
                                          align4k(bytes[i])};
        at += s->padded;
    }
    out->bytes = at;
}

void fy_optstate_layout_params(uint64_t params, int format, struct fy_optstate_layout *out)
{
    memset(out, 0, sizeof *out);
    out->format = format;
    out->params = params;
    struct fy_optstate_tensor t = {
        .begin = 0, .count = params, .decay = 1, .quantized = quantized_by_size(format, params)};
    place_tensors(format, &t, 1, out);
    place_sections(format, params, out);
}

/* Unit `unit`'s tensors, their parameters, weight decay and moments' kind (not yet placed);
 * returns how many. */
static unsigned unit_tensors(const struct fy_model_config *c, unsigned unit,
                             struct fy_optstate_tensor *out)
{
    struct fy_tensor_spec spec[FY_UNIT_MAX_TENSORS];
    unsigned n = fy_unit_tensors(c, unit, spec);
    for (unsigned i = 0; i < n; i++) {
        uint64_t count = fy_tensor_numel(&spec[i]);
        out[i] = (struct fy_optstate_tensor){.begin = spec[i].offset,
                                             .count = count,
                                             .decay = spec[i].decay,
                                             .quantized = quantized_by_size(c->optim_state, count)};
    }
    return n;
}

unsigned fy_optstate_tensors(const struct fy_model_config *c, unsigned unit,
                             struct fy_optstate_tensor *out)
{
    unsigned n = unit_tensors(c, unit, out);
    struct fy_optstate_layout counts;
    place_tensors(c->optim_state, out, n, &counts);
    return n;
}

void fy_optstate_layout(const struct fy_model_config *c, unsigned unit,
                        struct fy_optstate_layout *out)
{
    memset(out, 0, sizeof *out);
    out->format = c->optim_state;
    struct fy_optstate_tensor t[FY_UNIT_MAX_TENSORS];
    unsigned n = unit_tensors(c, unit, t);
    out->params = n == 0 ? 0 : t[n - 1].begin + t[n - 1].count; /* they lie one after another */
    place_tensors(c->optim_state, t, n, out);
    place_sections(c->optim_state, out->params, out);
}

unsigned fy_optstate_parts(const struct fy_optstate_layout *l, uint64_t state, int layer,
                           struct fy_desc *out)
{
    for (unsigned i = 0; i < l->count; i++) {
        const struct fy_optstate_section *s = &l->section[i];
        out[i] = fy_desc_region(FY_OP_OPT_ADAMW, s->kind, s->dtype, state + s->offset, s->bytes,
                                layer);
    }
    return l->count;
}

void fy_optstate_zero_moments(const struct fy_optstate_layout *l, void *state)
{
    const struct fy_optstate_section *master = &l->section[FY_OPTSTATE_MASTER];
    uint8_t *s = state;
    memset(s + master->offset + master->bytes, 0, l->bytes - master->bytes);
    if (l->format == FY_OPTIM_STATE_INT8) /* codes of zero; absmax 0.0f is all zero bytes */
        memset(s + l->section[FY_OPTSTATE_ADAM_M].offset, FY_OPTSTATE_INT8_ZERO_M,
               l->section[FY_OPTSTATE_ADAM_M].bytes);
}

/* ---- pieces ------------------------------------------------------------------------------- */

/* What a piece's layout follows from: its parameters and, in int8, how many of them have 8-bit
 * moments, their blocks, and how many f32 moments. */
struct piece_counts {
    uint64_t params, quantized, blocks, small;
};

static void counts_add(int format, struct piece_counts *k, uint64_t n, int quantized)
{
    k->params += n;
    if (format != FY_OPTIM_STATE_INT8)
        return;
    if (quantized) {
        k->quantized += n;
        k->blocks += int8_blocks(n);
    } else {
        k->small += n;
    }
}

/* The layout of a piece of these counts (its tensors not placed). */
static void counts_layout(int format, const struct piece_counts *k, struct fy_optstate_layout *out)
{
    memset(out, 0, sizeof *out);
    out->format = format;
    out->params = k->params;
    if (format == FY_OPTIM_STATE_INT8) {
        out->quantized = k->quantized;
        out->blocks = k->blocks;
        out->small = k->small;
    }
    place_sections(format, k->params, out);
}

static uint64_t counts_bytes(int format, const struct piece_counts *k)
{
    struct fy_optstate_layout l;
    counts_layout(format, k, &l);
    return l.bytes;
}

static uint64_t gcd64(uint64_t a, uint64_t b)
{
    while (b != 0) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Where a cut inside a tensor may fall: a multiple of this many values from its first, so that no
 * int8 block and no row of n_embd values (the embeddings' row updates) is split. */
static uint64_t cut_grain(const struct fy_model_config *c)
{
    uint64_t a = FY_OPTSTATE_INT8_MIN, b = c->n_embd ? c->n_embd : 1;
    return a / gcd64(a, b) * b;
}

/* A part of a tensor in the piece being cut: tensor i's values [pos, pos + n). */
struct piece_seg {
    unsigned tensor;
    uint64_t pos, n;
};

/* The cut of a unit into pieces (see optstate.h), as a walk that stops at piece `want` (UINT_MAX:
 * none) to describe it. */
struct cut {
    int format;
    uint64_t limit, grain;
    const struct fy_optstate_tensor *t; /* the unit's tensors */
    unsigned want, pieces;
    uint64_t at;    /* the next piece's offset in the extent */
    uint64_t begin; /* the piece being cut: its first parameter, counts and parts */
    struct piece_counts k;
    struct piece_seg seg[FY_UNIT_MAX_TENSORS];
    unsigned segs;
    struct fy_optstate_piece *out;
    struct fy_optstate_tensor *tensors;
    unsigned out_tensors;
};

static void cut_close(struct cut *x)
{
    if (x->segs == 0)
        return;
    struct fy_optstate_layout l;
    counts_layout(x->format, &x->k, &l);
    if (x->pieces == x->want) {
        x->out->begin = x->begin;
        x->out->params = x->k.params;
        x->out->offset = x->at;
        if (x->tensors != NULL) {
            uint64_t begin = 0;
            for (unsigned i = 0; i < x->segs; i++) {
                const struct fy_optstate_tensor *whole = &x->t[x->seg[i].tensor];
                x->tensors[i] = (struct fy_optstate_tensor){.begin = begin,
                                                            .count = x->seg[i].n,
                                                            .decay = whole->decay,
                                                            .quantized = whole->quantized};
                begin += x->seg[i].n;
            }
            x->out_tensors = x->segs;
            place_tensors(x->format, x->tensors, x->segs, &l);
        }
        x->out->layout = l;
    }
    x->pieces++;
    x->at += l.bytes;
    x->begin += x->k.params;
    memset(&x->k, 0, sizeof x->k);
    x->segs = 0;
}

static void cut_add(struct cut *x, unsigned tensor, uint64_t pos, uint64_t n)
{
    counts_add(x->format, &x->k, n, x->t[tensor].quantized);
    x->seg[x->segs++] = (struct piece_seg){tensor, pos, n};
}

/* The bytes of the piece being cut with n more values of tensor i. */
static uint64_t cut_bytes_with(const struct cut *x, unsigned tensor, uint64_t n)
{
    struct piece_counts k = x->k;
    counts_add(x->format, &k, n, x->t[tensor].quantized);
    return counts_bytes(x->format, &k);
}

/* Tensor i, values [pos, count), into pieces: whole where they fit the piece being cut, else up to
 * the last cut that fits, else in a new piece; a piece that holds nothing yet takes the least a
 * cut allows. */
static void cut_tensor(struct cut *x, unsigned i)
{
    uint64_t count = x->t[i].count, pos = 0;
    while (pos < count) {
        uint64_t rest = count - pos;
        if (cut_bytes_with(x, i, rest) <= x->limit) {
            cut_add(x, i, pos, rest);
            return;
        }
        /* the most steps of the grain that fit (a cut before the tensor's end) */
        uint64_t lo = 0, hi = (rest - 1) / x->grain;
        while (lo < hi) {
            uint64_t mid = lo + (hi - lo + 1) / 2;
            if (cut_bytes_with(x, i, mid * x->grain) <= x->limit)
                lo = mid;
            else
                hi = mid - 1;
        }
        uint64_t n = lo * x->grain;
        if (n == 0 && x->segs > 0) { /* in a new piece */
            cut_close(x);
            continue;
        }
        if (n == 0) /* nothing fits an empty piece: the least a cut allows */
            n = rest > x->grain ? x->grain : rest;
        cut_add(x, i, pos, n);
        pos += n;
        cut_close(x);
    }
}

/* Cuts unit `unit`; describes piece `want` (UINT_MAX: none) into out and tensors; returns the
 * piece count and the described piece's tensor count in *ntensors. */
static unsigned cut_unit(const struct fy_model_config *c, unsigned unit, unsigned want,
                         struct fy_optstate_piece *out, struct fy_optstate_tensor *tensors,
                         unsigned *ntensors)
{
    struct fy_optstate_tensor t[FY_UNIT_MAX_TENSORS];
    unsigned n = unit_tensors(c, unit, t);
    struct fy_optstate_layout whole;
    fy_optstate_layout(c, unit, &whole);
    *ntensors = 0;
    if (c->state_piece == 0 || whole.bytes <= c->state_piece) {
        if (want == 0) {
            *out = (struct fy_optstate_piece){
                .begin = 0, .params = whole.params, .offset = 0, .layout = whole};
            if (tensors != NULL)
                *ntensors = fy_optstate_tensors(c, unit, tensors);
        }
        return 1;
    }
    struct cut x = {.format = c->optim_state,
                    .limit = c->state_piece,
                    .grain = cut_grain(c),
                    .t = t,
                    .want = want,
                    .out = out,
                    .tensors = tensors};
    for (unsigned i = 0; i < n && x.pieces <= want; i++)
        cut_tensor(&x, i);
    cut_close(&x);
    *ntensors = x.out_tensors;
    return x.pieces;
}

unsigned fy_optstate_piece_count(const struct fy_model_config *c, unsigned unit)
{
    unsigned none;
    return cut_unit(c, unit, UINT_MAX, NULL, NULL, &none);
}

unsigned fy_optstate_piece(const struct fy_model_config *c, unsigned unit, unsigned k,
                           struct fy_optstate_piece *out, struct fy_optstate_tensor *tensors)
{
    unsigned n;
    memset(out, 0, sizeof *out);
    cut_unit(c, unit, k, out, tensors, &n);
    return n;
}

/* The units one of each kind: the embeddings, a block (every block has the same tensors), the
 * final unit; how many into n. */
static void unit_kinds(const struct fy_model_config *c, unsigned kinds[3], unsigned *n)
{
    unsigned units = fy_model_unit_count(c);
    kinds[0] = 0;
    kinds[1] = 1;
    kinds[2] = units - 1;
    *n = units < 3 ? units : 3;
}

uint64_t fy_optstate_max_piece_bytes(const struct fy_model_config *c)
{
    uint64_t most = 0;
    unsigned kinds[3], nk;
    unit_kinds(c, kinds, &nk);
    for (unsigned i = 0; i < nk; i++)
        for (unsigned u = kinds[i], k = 0, n = fy_optstate_piece_count(c, u); k < n; k++) {
            struct fy_optstate_piece p;
            fy_optstate_piece(c, u, k, &p, NULL);
            most = p.layout.bytes > most ? p.layout.bytes : most;
        }
    return most;
}

int fy_optstate_has_pieces(const struct fy_model_config *c)
{
    unsigned kinds[3], nk;
    unit_kinds(c, kinds, &nk);
    for (unsigned i = 0; i < nk; i++)
        if (fy_optstate_piece_count(c, kinds[i]) > 1)
            return 1;
    return 0;
}

uint64_t fy_optstate_unit_digest(const uint64_t *piece_digests, unsigned n)
{
    return n == 1 ? piece_digests[0] : fy_digest_u64s(piece_digests, n);
}

uint64_t fy_optstate_bytes(const struct fy_model_config *c, unsigned unit)
{
    unsigned n = fy_optstate_piece_count(c, unit);
    struct fy_optstate_piece last;
    fy_optstate_piece(c, unit, n - 1, &last, NULL);
    return last.offset + last.layout.bytes;
}

uint64_t fy_optstate_max_bytes(const struct fy_model_config *c)
{
    uint64_t most = 0;
    unsigned kinds[3], nk;
    unit_kinds(c, kinds, &nk);
    for (unsigned i = 0; i < nk; i++)
        if (fy_optstate_bytes(c, kinds[i]) > most)
            most = fy_optstate_bytes(c, kinds[i]);
    return most;
}

uint64_t fy_optstate_master_bytes(const struct fy_model_config *c, unsigned unit)
{
    uint64_t bytes = 0;
    for (unsigned k = 0, n = fy_optstate_piece_count(c, unit); k < n; k++) {
        struct fy_optstate_piece p;
        fy_optstate_piece(c, unit, k, &p, NULL);
        bytes += p.layout.section[FY_OPTSTATE_MASTER].padded;
    }
    return bytes;
}

uint64_t fy_optstate_max_master_bytes(const struct fy_model_config *c)
{
    uint64_t most = 0;
    unsigned kinds[3], nk;
    unit_kinds(c, kinds, &nk);
    for (unsigned i = 0; i < nk; i++)
        if (fy_optstate_master_bytes(c, kinds[i]) > most)
            most = fy_optstate_master_bytes(c, kinds[i]);
    return most;
}

double fy_optstate_param_bytes(int format)
{
    switch (format) {
    case FY_OPTIM_STATE_BF16:
        return 4 + 2 * 2;
    case FY_OPTIM_STATE_INT8:
        return 4 + 2 * 1 + 2 * 4.0 / FY_OPTSTATE_INT8_BLOCK;
    default:
        return 4 + 2 * 4;
    }
}

double fy_optstate_update_param_bytes(int grad_dtype, int format)
{
    return (double)fy_dtype_size(grad_dtype) + 2 * fy_optstate_param_bytes(format);
}

uint64_t fy_optstate_copy_bytes(const struct fy_model_config *c, unsigned unit)
{
    return align4k(fy_model_unit_params(c, unit) * fy_dtype_size(FY_OPTSTATE_COPY_DTYPE));
}
