/* Optimizer requests: gathers the parts of an opt-adamw request, checks they hold one state of the
 * run's layout (common/model/optstate.h: fp32, bf16 or int8 moments), and runs the AdamW kernel on the
 * pinned threads tensor by tensor (each with its weight decay, its moments where the layout puts
 * them); opt-sumsq sums a gradient's squares for the launcher's global-norm clipping; opt-convert
 * rounds weights to bf16 for the gpu worker. */
#include "optstep.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/arch/arch.h"
#include "common/base/check.h"
#include "common/base/dtype.h"
#include "common/model/model.h"
#include "common/model/optstate.h"
#include "common/ipc/topo.h"
#include "opt_worker/adamw.h"
#include "opt_worker/convert.h"
#include "opt_worker/quant8.h"
#include "opt_worker/threads.h"

#define MAX_THREADS 1024

struct fy_optstep {
    struct fy_threads *threads;
    struct fy_adamw_hparams hp;
    enum fy_adamw_impl impl;
    int have_model;
    struct fy_model_config model;
};

static int read_hparams(const struct fy_config *cfg, struct fy_adamw_hparams *hp)
{
    double lr, b1, b2, eps, wd;
    FY_TRY(fy_config_get_double(cfg, "lr", 0, 1e-4, &lr));
    FY_TRY(fy_config_get_double(cfg, "beta1", 0, 0.9, &b1));
    FY_TRY(fy_config_get_double(cfg, "beta2", 0, 0.999, &b2));
    FY_TRY(fy_config_get_double(cfg, "eps", 0, 1e-8, &eps));
    FY_TRY(fy_config_get_double(cfg, "weight_decay", 0, 0.0, &wd));
    *hp = (struct fy_adamw_hparams){(float)lr, (float)b1, (float)b2, (float)eps, (float)wd};
    return fy_adamw_check_hparams(hp, 1);
}

static int optstep_setup(struct fy_optstep *o, const struct fy_config *cfg, const char *cpus)
{
    FY_TRY(read_hparams(cfg, &o->hp));
    const char *impl = fy_config_get(cfg, "adamw_impl");
    FY_TRY(fy_adamw_impl_parse(impl ? impl : "auto", &o->impl));
    if (o->impl == FY_ADAMW_AUTO)
        o->impl = fy_adamw_best_impl();
    FY_REQUIRE(fy_adamw_impl_supported(o->impl), -ENOTSUP,
               "adamw_impl = %s is not supported by this CPU: use auto", impl);
    if (fy_config_get(cfg, "model.n_layer") != NULL) {
        FY_TRY(fy_model_config_from(cfg, &o->model));
        o->have_model = 1;
    }
    int *list = calloc(MAX_THREADS, sizeof *list);
    if (list == NULL)
        return -ENOMEM;
    int ncpus = fy_cpulist_parse(cpus, list, MAX_THREADS);
    uint64_t want;
    int rc = fy_config_get_u64(cfg, "opt_threads", 0, 0, &want);
    if (rc == 0 && ncpus <= 0)
        rc = ncpus < 0 ? ncpus : -EINVAL;
    if (rc == 0) {
        unsigned count = want > 0 && want < (uint64_t)ncpus ? (unsigned)want : (unsigned)ncpus;
        rc = fy_threads_new(&o->threads, list, count);
    }
    free(list);
    FY_TRY(rc);
    fy_info("AdamW: %s kernel, %u threads, betas (%g, %g) eps %g weight decay %g", fy_adamw_impl_name(o->impl),
            fy_threads_count(o->threads), o->hp.beta1, o->hp.beta2, o->hp.eps, o->hp.weight_decay);
    return 0;
}

int fy_optstep_new(struct fy_optstep **out, const struct fy_config *cfg, const char *cpus)
{
    *out = NULL;
    struct fy_optstep *o = calloc(1, sizeof *o);
    if (o == NULL)
        return -ENOMEM;
    int rc = optstep_setup(o, cfg, cpus);
    if (rc < 0) {
        fy_optstep_destroy(&o);
        return rc;
    }
    *out = o;
    return 0;
}

void fy_optstep_destroy(struct fy_optstep **op)
{
    if (op == NULL || *op == NULL)
        return;
    fy_threads_destroy(&(*op)->threads);
    free(*op);
    *op = NULL;
}

static int regions_overlap(const struct fy_desc *a, const struct fy_desc *b)
{
    return a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes;
}

/* An opt-adamw request's regions by kind, the state's format read from the moments' dtype, and
 * where each of the unit's (or its piece's) tensors has its moments (common/model/optstate.h). A request
 * of a unit in pieces (a STATE part: `pieces`) is updated as one such request per piece, whose
 * parts point into own (piece_request). */
struct adamw_request {
    const struct fy_desc *part[FY_KIND_COUNT];
    struct fy_optstate_layout layout;
    struct fy_optstate_tensor tensor[FY_UNIT_MAX_TENSORS];
    unsigned tensors;
    unsigned pieces; /* a STATE part's unit: its pieces; else 0 */
    struct fy_desc own[FY_KIND_COUNT];
};

/* The part of kind k of a request (adamw_request has checked there is at most one). */
static const struct fy_desc *part_of(const struct fy_desc *req, unsigned n, int k)
{
    for (unsigned i = 0; i < n; i++)
        if (req[i].kind == k)
            return &req[i];
    return NULL;
}

/* The kind of each section's part (common/model/optstate.h's order). */
static const int parts_kind[FY_OPTSTATE_PARTS] = {FY_KIND_MASTER, FY_KIND_ADAM_M, FY_KIND_ADAM_V,
                                                  FY_KIND_ADAM_ABSMAX, FY_KIND_ADAM_SMALL};

/* The state format whose moments the adam-m and adam-v parts hold, from their dtype. */
static int request_format(const struct fy_desc *m, const struct fy_desc *v, int *format)
{
    FY_REQUIRE(m->dtype == v->dtype, -EPROTO, "opt-adamw: adam-m is %s and adam-v %s",
               fy_dtype_name(m->dtype), fy_dtype_name(v->dtype));
    switch (m->dtype) {
    case FY_DTYPE_F32: *format = FY_OPTIM_STATE_FP32; return 0;
    case FY_DTYPE_BF16: *format = FY_OPTIM_STATE_BF16; return 0;
    case FY_DTYPE_U8: *format = FY_OPTIM_STATE_INT8; return 0;
    default:
        fy_error("opt-adamw: moments of dtype %s: expected f32, bf16 or u8 (8-bit codes)",
                 fy_dtype_name(m->dtype));
        return -EPROTO;
    }
}

/* Unit `layer` of the model in pieces: the model known and the unit in it (-EPROTO, said, for
 * `what` otherwise). */
static int model_unit(const struct fy_optstep *o, int layer, const char *what)
{
    FY_REQUIRE(o->have_model && layer >= 0 && (unsigned)layer < fy_model_unit_count(&o->model),
               -EPROTO,
               "%s: a state part names a model unit's pieces, and %d is none of the "
               "run's model's units",
               what, layer);
    return 0;
}

/* A request with a STATE part (unit `layer`'s pieces all): its GRAD, STATE and WEIGHTS parts hold
 * the unit's parameters and extent, and no section part is given. */
static int state_request(const struct fy_optstep *o, int layer, struct adamw_request *r)
{
    FY_TRY(model_unit(o, layer, "opt-adamw"));
    const struct fy_desc *g = r->part[FY_KIND_GRAD], *st = r->part[FY_KIND_STATE];
    const struct fy_desc *wt = r->part[FY_KIND_WEIGHTS];
    for (int s = 0; s < FY_OPTSTATE_PARTS; s++)
        FY_REQUIRE(r->part[parts_kind[s]] == NULL, -EPROTO, "opt-adamw: a state part and a %s part",
                   fy_kind_name(parts_kind[s]));
    FY_REQUIRE(g != NULL && (g->dtype == FY_DTYPE_F32 || g->dtype == FY_DTYPE_BF16) &&
                   (wt == NULL || wt->dtype == FY_DTYPE_BF16),
               -EPROTO, "opt-adamw: a state part needs a grad part, f32 or bf16 (weights bf16)");
    size_t count = fy_model_unit_params(&o->model, (unsigned)layer);
    FY_REQUIRE(g->bytes / fy_dtype_size(g->dtype) == count &&
                   (wt == NULL || wt->bytes / 2 == count) &&
                   st->bytes == fy_optstate_bytes(&o->model, (unsigned)layer),
               -EPROTO,
               "opt-adamw: the parts do not hold unit %d's %zu parameters and its state "
               "of %llu bytes in pieces",
               layer, count, (unsigned long long)fy_optstate_bytes(&o->model, (unsigned)layer));
    r->pieces = fy_optstate_piece_count(&o->model, (unsigned)layer);
    return 0;
}

/* Piece k of a STATE request w as a request of its own (its parts in out->own): the sections of
 * the piece's state, its range of the gradient and of the weights copy; the learning rate and the
 * gradient scale as w's. */
static void piece_request(const struct fy_optstep *o, const struct adamw_request *w, int layer,
                          unsigned k, struct adamw_request *out)
{
    struct fy_optstate_piece p;
    memset(out->part, 0, sizeof out->part);
    out->pieces = 0;
    out->tensors = fy_optstate_piece(&o->model, (unsigned)layer, k, &p, out->tensor);
    out->layout = p.layout;
    const struct fy_desc *st = w->part[FY_KIND_STATE];
    for (unsigned i = 0; i < p.layout.count; i++) {
        const struct fy_optstate_section *sec = &p.layout.section[i];
        struct fy_desc *d = &out->own[sec->kind];
        *d = fy_desc_region(st->op, sec->kind, sec->dtype, st->offset + p.offset + sec->offset,
                            sec->bytes, layer);
        out->part[sec->kind] = d;
    }
    out->own[FY_KIND_MASTER].arg = st->arg; /* the learning rate */
    const int ranged[2] = {FY_KIND_GRAD, FY_KIND_WEIGHTS};
    for (int i = 0; i < 2; i++) {
        const struct fy_desc *d = w->part[ranged[i]];
        if (d == NULL)
            continue;
        size_t size = fy_dtype_size(d->dtype);
        out->own[ranged[i]] = *d;
        out->own[ranged[i]].offset = d->offset + p.begin * size;
        out->own[ranged[i]].bytes = p.params * size;
        out->part[ranged[i]] = &out->own[ranged[i]];
    }
}

/* Gathers the parts of an AdamW request by kind and checks that they hold one state of the run's
 * layout: unit `layer`'s, or its piece's (the MASTER part's tensor), or one tensor's (-1, or no
 * model); or a STATE part's unit's pieces all (state_request). */
static int adamw_request(const struct fy_optstep *o, const struct fy_desc *req, unsigned n,
                         struct adamw_request *r)
{
    memset(r->part, 0, sizeof r->part);
    r->pieces = 0;
    for (unsigned i = 0; i < n; i++) {
        int k = req[i].kind;
        if (k == FY_KIND_TOKENS)
            continue; /* the row list (update_rows), not a part of the state */
        FY_REQUIRE(k == FY_KIND_GRAD || k == FY_KIND_MASTER || k == FY_KIND_ADAM_M ||
                       k == FY_KIND_ADAM_V || k == FY_KIND_WEIGHTS || k == FY_KIND_ADAM_ABSMAX ||
                       k == FY_KIND_ADAM_SMALL || k == FY_KIND_STATE,
                   -EPROTO, "opt-adamw: part of kind %s not expected", fy_kind_name(k));
        FY_REQUIRE(r->part[k] == NULL, -EPROTO, "opt-adamw: two %s parts", fy_kind_name(k));
        r->part[k] = &req[i];
        for (unsigned j = 0; j < i; j++)
            FY_REQUIRE(!regions_overlap(&req[i], &req[j]), -EPROTO,
                       "opt-adamw: %s and %s regions overlap", fy_kind_name(k),
                       fy_kind_name(req[j].kind));
    }
    if (r->part[FY_KIND_STATE] != NULL)
        return state_request(o, req[0].layer, r);
    const struct fy_desc *g = r->part[FY_KIND_GRAD], *p = r->part[FY_KIND_MASTER];
    const struct fy_desc *m = r->part[FY_KIND_ADAM_M], *v = r->part[FY_KIND_ADAM_V];
    const struct fy_desc *wt = r->part[FY_KIND_WEIGHTS];
    FY_REQUIRE(g && p && m && v, -EPROTO, "opt-adamw needs grad, master, adam-m and adam-v parts");
    FY_REQUIRE(p->dtype == FY_DTYPE_F32 && (g->dtype == FY_DTYPE_F32 || g->dtype == FY_DTYPE_BF16) &&
                   (wt == NULL || wt->dtype == FY_DTYPE_BF16),
               -EPROTO, "opt-adamw: master must be f32, grad f32 or bf16, weights bf16");
    int format;
    FY_TRY(request_format(m, v, &format));
    size_t count = p->bytes / 4;
    int layer = req[0].layer;
    if (layer >= 0 && o->have_model) {
        uint32_t piece = p->tensor; /* 0: the first, or the unit in one piece */
        FY_REQUIRE((unsigned)layer < fy_model_unit_count(&o->model) &&
                       piece < fy_optstate_piece_count(&o->model, (unsigned)layer),
                   -EPROTO, "opt-adamw: unit %d of the model has no piece %u", layer, piece);
        struct fy_optstate_piece pc;
        r->tensors = fy_optstate_piece(&o->model, (unsigned)layer, piece, &pc, r->tensor);
        FY_REQUIRE(pc.params == count, -EPROTO,
                   "opt-adamw: unit %d's piece %u of the model does not hold %zu parameters", layer,
                   piece, count);
        FY_REQUIRE(format == o->model.optim_state, -EPROTO,
                   "opt-adamw: unit %d's moments are %s, the run keeps %s optimizer state", layer,
                   fy_dtype_name(m->dtype), fy_optim_state_name(o->model.optim_state));
        r->layout = pc.layout;
    } else { /* one tensor, every element decayed */
        fy_optstate_layout_params(count, format, &r->layout);
        r->tensors = 1;
        r->tensor[0] = (struct fy_optstate_tensor){.begin = 0, .count = count, .decay = 1,
                                                   .quantized = r->layout.quantized == count};
    }
    int ok = g->bytes / fy_dtype_size(g->dtype) == count && (wt == NULL || wt->bytes / 2 == count);
    for (unsigned s = FY_OPTSTATE_ADAM_M; s < FY_OPTSTATE_PARTS; s++) {
        const struct fy_desc *d = r->part[parts_kind[s]];
        if (s < r->layout.count)
            ok = ok && d != NULL && d->dtype == r->layout.section[s].dtype &&
                 d->bytes == r->layout.section[s].bytes;
        else
            ok = ok && d == NULL;
    }
    FY_REQUIRE(ok, -EPROTO,
               "opt-adamw: the parts do not hold one %s state of %zu parameters (%s)",
               fy_optim_state_name(format), count,
               layer >= 0 && o->have_model ? "the unit's layout" : "one tensor");
    return 0;
}

/* The pool address of a part (NULL for a part of no bytes, which is never read). */
static void *part_at(const struct fy_pool *pool, const struct fy_desc *d)
{
    return d == NULL || d->bytes == 0 ? NULL : fy_pool_at(pool, d->offset, d->bytes);
}

/* The kernel's view of tensor `t` of the request's state. */
static int tensor_view(const struct fy_pool *pool, const struct adamw_request *r,
                       const struct fy_optstate_tensor *t, struct fy_adamw_tensor *x)
{
    const struct fy_desc *g = r->part[FY_KIND_GRAD], *wt = r->part[FY_KIND_WEIGHTS];
    float *master = part_at(pool, r->part[FY_KIND_MASTER]);
    const char *grad = part_at(pool, g);
    uint16_t *weights = part_at(pool, wt);
    char *m = part_at(pool, r->part[FY_KIND_ADAM_M]), *v = part_at(pool, r->part[FY_KIND_ADAM_V]);
    FY_REQUIRE(master && grad && (wt == NULL || weights), -ERANGE,
               "opt-adamw: a region lies outside the pool");
    *x = (struct fy_adamw_tensor){.master = master + t->begin,
                                  .grad = grad + t->begin * fy_dtype_size(g->dtype),
                                  .grad_dtype = g->dtype,
                                  .weight_bf16 = weights ? weights + t->begin : NULL,
                                  .n = t->count};
    const struct fy_optstate_layout *l = &r->layout;
    if (l->format != FY_OPTIM_STATE_INT8) {
        size_t size = fy_dtype_size(l->section[FY_OPTSTATE_ADAM_M].dtype);
        x->moments = l->format == FY_OPTIM_STATE_BF16 ? FY_ADAMW_MOMENTS_BF16
                                                      : FY_ADAMW_MOMENTS_F32;
        x->m = m ? m + t->at * size : NULL;
        x->v = v ? v + t->at * size : NULL;
    } else if (t->quantized) {
        float *absmax = part_at(pool, r->part[FY_KIND_ADAM_ABSMAX]);
        x->moments = FY_ADAMW_MOMENTS_Q8;
        x->m = m ? m + t->at : NULL;
        x->v = v ? v + t->at : NULL;
        x->m_absmax = absmax ? absmax + t->block : NULL;
        x->v_absmax = absmax ? absmax + l->blocks + t->block : NULL;
    } else {
        float *small = part_at(pool, r->part[FY_KIND_ADAM_SMALL]);
        x->moments = FY_ADAMW_MOMENTS_F32;
        x->m = small ? small + t->at : NULL;
        x->v = small ? small + l->small + t->at : NULL;
    }
    FY_REQUIRE(x->m && x->v, -ERANGE, "opt-adamw: a region lies outside the pool");
    return 0;
}

/* The hyperparameters of one tensor: without weight decay where it has none. */
static struct fy_adamw_hparams tensor_hparams(const struct fy_adamw_hparams *hp,
                                              const struct fy_optstate_tensor *t)
{
    struct fy_adamw_hparams shp = *hp;
    if (!t->decay)
        shp.weight_decay = 0.0f;
    return shp;
}

/* opt-adamw over the rows listed (int32, ascending, each a row of `len` elements of the request's
 * state, none across two tensors, none splitting an 8-bit tensor's blocks), tensor by tensor: the
 * update of a unit in parts, each once its gradient is final. With `apply` 0 the list is only
 * checked (-EPROTO, said), so that a list refused leaves the state as it was. */
static int update_rows(struct fy_optstep *o, const struct fy_pool *pool, const int32_t *rows,
                       size_t nrows, size_t len, const struct fy_adamw_hparams *hp, uint64_t step,
                       const struct adamw_request *r, int layer, float scale, int apply)
{
    /* tensor k's rows are rows[first[k] .. first[k + 1]) */
    size_t first[FY_UNIT_MAX_TENSORS + 1], i = 0;
    for (unsigned k = 0; k < r->tensors; k++) {
        const struct fy_optstate_tensor *t = &r->tensor[k];
        first[k] = i;
        for (; i < nrows && ((size_t)rows[i] + 1) * len <= t->begin + t->count; i++)
            FY_REQUIRE((size_t)rows[i] * len >= t->begin && t->begin % len == 0, -EPROTO,
                       "opt-adamw: row %d straddles two of unit %d's tensors", rows[i], layer);
        FY_REQUIRE(i == first[k] || !t->quantized || len % FY_OPTSTATE_INT8_BLOCK == 0, -EPROTO,
                   "opt-adamw: rows of %zu values would split the 8-bit blocks of %d of unit %d's "
                   "tensor %u: such a unit is updated in one piece", len, FY_OPTSTATE_INT8_BLOCK,
                   layer, k);
    }
    first[r->tensors] = i;
    FY_REQUIRE(i == nrows, -EPROTO, "opt-adamw: row %d lies outside unit %d", rows[i], layer);
    if (!apply)
        return 0;
    int32_t *local = malloc((nrows > 0 ? nrows : 1) * sizeof *local);
    FY_REQUIRE(local != NULL, -ENOMEM, "opt-adamw: no memory for a row list of %zu rows", nrows);
    int rc = 0;
    for (unsigned k = 0; k < r->tensors && rc == 0; k++) {
        const struct fy_optstate_tensor *t = &r->tensor[k];
        size_t count = first[k + 1] - first[k];
        if (count == 0)
            continue;
        for (size_t j = 0; j < count; j++)
            local[j] = (int32_t)((size_t)rows[first[k] + j] - t->begin / len);
        struct fy_adamw_tensor x;
        struct fy_adamw_hparams thp = tensor_hparams(hp, t);
        rc = tensor_view(pool, r, t, &x);
        x.grad_scale = scale;
        if (rc == 0)
            rc = fy_adamw_update_rows(o->threads, &thp, step, &x, local, count, len, o->impl);
    }
    free(local);
    return rc;
}

/* The row list of a TOKENS part: its rows (int32, `arg` elements each), checked ascending and
 * from 0. */
static int row_list(const struct fy_pool *pool, const struct fy_desc *list, int layer,
                    const int32_t **rows, size_t *nrows, size_t *len)
{
    FY_REQUIRE(list->dtype == FY_DTYPE_I32 && list->arg > 0 && list->bytes % 4 == 0, -EPROTO,
               "opt-adamw: a row list must be int32 with the row length in its arg");
    *nrows = list->bytes / 4;
    *len = (size_t)list->arg;
    *rows = fy_pool_at(pool, list->offset, list->bytes);
    FY_REQUIRE(*rows != NULL || *nrows == 0, -ERANGE,
               "opt-adamw: the row list lies outside the pool");
    for (size_t i = 1; i < *nrows; i++)
        FY_REQUIRE((*rows)[i] > (*rows)[i - 1], -EPROTO,
                   "opt-adamw: the row list is not ascending");
    FY_REQUIRE(*nrows == 0 || (*rows)[0] >= 0, -EPROTO, "opt-adamw: row %d lies outside unit %d",
               (*rows)[0], layer);
    return 0;
}

/* A STATE request's rows piece by piece: each piece's rows (those in its range, which starts on a
 * row) shifted to the piece's first; every piece checked before any is updated. */
static int update_rows_pieces(struct fy_optstep *o, const struct fy_pool *pool, const int32_t *rows,
                              size_t nrows, size_t len, const struct fy_adamw_hparams *hp,
                              uint64_t step, const struct adamw_request *w, int layer, float scale)
{
    int32_t *local = malloc((nrows > 0 ? nrows : 1) * sizeof *local);
    struct adamw_request *r = malloc(sizeof *r);
    int rc = local && r ? 0 : -ENOMEM;
    if (rc < 0)
        fy_error("opt-adamw: no memory for a row list of %zu rows", nrows);
    size_t done = 0;
    for (int apply = 0; rc == 0 && apply < 2; apply++) {
        size_t i = 0;
        for (unsigned k = 0; rc == 0 && k < w->pieces; k++) {
            piece_request(o, w, layer, k, r);
            struct fy_optstate_piece p;
            fy_optstate_piece(&o->model, (unsigned)layer, k, &p, NULL);
            size_t n = 0;
            for (; i + n < nrows && (size_t)rows[i + n] * len < p.begin + p.params; n++)
                local[n] = (int32_t)((size_t)rows[i + n] - p.begin / len);
            if (n > 0 && p.begin % len != 0) {
                fy_error("opt-adamw: unit %d's piece %u starts inside a row of %zu values", layer,
                         k, len);
                rc = -EPROTO;
            }
            if (rc == 0 && (n > 0 || !apply))
                rc = update_rows(o, pool, local, n, len, hp, step, r, layer, scale, apply);
            i += n;
        }
        done = i;
        if (rc == 0 && done != nrows) { /* found in the check, before any update */
            fy_error("opt-adamw: row %d lies outside unit %d", rows[done], layer);
            rc = -EPROTO;
        }
    }
    free(local);
    free(r);
    return rc;
}

/* The clipping scale of the GRAD part's arg, as the float the kernel multiplies by (0: none). */
static int grad_scale(const struct fy_desc *g, float *out)
{
    *out = 0.0f;
    if (g->arg == 0)
        return 0;
    double scale;
    memcpy(&scale, &g->arg, sizeof scale);
    float f = (float)scale;
    FY_REQUIRE(isfinite(scale) && f > 0.0f && isfinite(f), -EPROTO,
               "opt-adamw: gradient scale %g (the grad part's arg) is not a positive float", scale);
    *out = f;
    return 0;
}

/* opt-sumsq: one gradient's sum of squares into the reply's arg. */
static int sumsq(struct fy_optstep *o, const struct fy_pool *pool, const struct fy_desc *req,
                 unsigned n, struct fy_desc *reply)
{
    FY_REQUIRE(n == 1 && req[0].kind == FY_KIND_GRAD, -EPROTO,
               "opt-sumsq takes one grad part (got %u parts, the first of kind %s)", n,
               fy_kind_name(req[0].kind));
    const struct fy_desc *g = &req[0];
    FY_REQUIRE(g->dtype == FY_DTYPE_F32 || g->dtype == FY_DTYPE_BF16, -EPROTO,
               "opt-sumsq: the gradient must be f32 or bf16, not %s", fy_dtype_name(g->dtype));
    size_t count = g->bytes / fy_dtype_size(g->dtype);
    int layer = g->layer;
    if (layer >= 0 && o->have_model)
        FY_REQUIRE((unsigned)layer < fy_model_unit_count(&o->model) &&
                       fy_model_unit_params(&o->model, (unsigned)layer) == count,
                   -EPROTO, "opt-sumsq: unit %d of the model does not hold %zu parameters", layer,
                   count);
    const void *grad = fy_pool_at(pool, g->offset, g->bytes);
    FY_REQUIRE(grad != NULL, -ERANGE, "opt-sumsq: the region lies outside the pool");
    double s;
    FY_TRY(fy_adamw_sumsq_impl(o->threads, grad, g->dtype, count, o->impl, &s));
    memcpy(&reply->arg, &s, sizeof s);
    return 0;
}

/* Weights of `count` values from f32 at `from` into `to`: rounded to bf16, or copied (f32). */
static int convert_values(struct fy_optstep *o, const float *from, void *to, int dtype,
                          size_t count)
{
    if (dtype == FY_DTYPE_F32)
        return fy_convert_copy_f32(o->threads, from, to, count);
    return fy_convert_to_bf16(o->threads, from, to, count, o->impl);
}

/* opt-convert of a STATE part: each piece's master into its place in the weights. */
static int convert_pieces(struct fy_optstep *o, const struct fy_pool *pool,
                          const struct fy_desc *st, const struct fy_desc *dst)
{
    int layer = st->layer;
    FY_TRY(model_unit(o, layer, "opt-convert"));
    size_t count = fy_model_unit_params(&o->model, (unsigned)layer);
    size_t size = fy_dtype_size(dst->dtype);
    FY_REQUIRE(st->bytes == fy_optstate_bytes(&o->model, (unsigned)layer) &&
                   dst->bytes == count * size,
               -EPROTO,
               "opt-convert: the parts do not hold unit %d's state in pieces and its %zu "
               "weights",
               layer, count);
    FY_REQUIRE(!regions_overlap(st, dst), -EPROTO, "opt-convert: the two parts overlap");
    const uint8_t *state = part_at(pool, st);
    uint8_t *to = part_at(pool, dst);
    FY_REQUIRE(state != NULL && to != NULL, -ERANGE, "opt-convert: a region lies outside the pool");
    for (unsigned k = 0, n = fy_optstate_piece_count(&o->model, (unsigned)layer); k < n; k++) {
        struct fy_optstate_piece p;
        fy_optstate_piece(&o->model, (unsigned)layer, k, &p, NULL);
        const float *from =
            (const float *)(state + p.offset + p.layout.section[FY_OPTSTATE_MASTER].offset);
        FY_TRY(convert_values(o, from, to + p.begin * size, dst->dtype, p.params));
    }
    return 0;
}

/* opt-convert: a MASTER part's f32 values rounded to bf16 into a WEIGHTS part of as many elements
 * (a unit's whole weights, or a piece of them: layer names the unit, checked to hold at least that
 * many parameters), or copied into an f32 one; or a STATE part's pieces' masters each into its
 * place in the unit's weights. Nothing is written unless the request holds. */
static int convert(struct fy_optstep *o, const struct fy_pool *pool, const struct fy_desc *req,
                   unsigned n)
{
    FY_REQUIRE(n == 2, -EPROTO, "opt-convert takes a master part and a weights part, not %u parts",
               n);
    const struct fy_desc *src = part_of(req, n, FY_KIND_MASTER);
    const struct fy_desc *st = part_of(req, n, FY_KIND_STATE);
    const struct fy_desc *dst = part_of(req, n, FY_KIND_WEIGHTS);
    FY_REQUIRE((src != NULL || st != NULL) && dst != NULL, -EPROTO,
               "opt-convert takes a master (or state) part and a weights part (got %s and %s)",
               fy_kind_name(req[0].kind), fy_kind_name(req[1].kind));
    FY_REQUIRE((st != NULL || src->dtype == FY_DTYPE_F32) &&
                   (dst->dtype == FY_DTYPE_BF16 || dst->dtype == FY_DTYPE_F32),
               -EPROTO,
               "opt-convert: the master part must be f32 and the weights part bf16 or f32 (got "
               "%s and %s)",
               fy_dtype_name(req[0].dtype), fy_dtype_name(dst->dtype));
    if (st != NULL)
        return convert_pieces(o, pool, st, dst);
    size_t count = src->bytes / 4;
    FY_REQUIRE(count > 0 && dst->bytes / fy_dtype_size(dst->dtype) == count, -EPROTO,
               "opt-convert: %zu f32 values into a weights part of %llu bytes: the parts must hold "
               "as many elements, at least one",
               count, (unsigned long long)dst->bytes);
    FY_REQUIRE(!regions_overlap(src, dst), -EPROTO, "opt-convert: the two parts overlap");
    int layer = req[0].layer;
    if (layer >= 0 && o->have_model)
        FY_REQUIRE((unsigned)layer < fy_model_unit_count(&o->model) &&
                       count <= fy_model_unit_params(&o->model, (unsigned)layer),
                   -EPROTO, "opt-convert: unit %d of the model does not hold %zu parameters", layer,
                   count);
    const float *from = part_at(pool, src);
    void *to = part_at(pool, dst);
    FY_REQUIRE(from != NULL && to != NULL, -ERANGE, "opt-convert: a region lies outside the pool");
    return convert_values(o, from, to, dst->dtype, count);
}

/* opt-adamw: the update of a unit's state (or one tensor's), tensor by tensor (each with its weight
 * decay and, in int8, its own blocks), or of the rows a row list names. */
static int adamw(struct fy_optstep *o, const struct fy_pool *pool, const struct fy_desc *req,
                 unsigned n)
{
    struct adamw_request r;
    FY_TRY(adamw_request(o, req, n, &r));
    float scale;
    FY_TRY(grad_scale(r.part[FY_KIND_GRAD], &scale));
    struct fy_adamw_hparams hp = o->hp;
    const struct fy_desc *master = r.pieces ? r.part[FY_KIND_STATE] : r.part[FY_KIND_MASTER];
    if (master->arg != 0) {
        double lr;
        memcpy(&lr, &master->arg, sizeof lr);
        FY_REQUIRE(isfinite(lr) && lr >= 0, -EPROTO, "opt-adamw: learning rate %g is invalid", lr);
        hp.lr = (float)lr;
    }
    int layer = req[0].layer;
    const struct fy_desc *list = part_of(req, n, FY_KIND_TOKENS);
    if (list != NULL) {
        FY_REQUIRE(layer >= 0 && o->have_model, -EPROTO,
                   "opt-adamw: a row list needs the model's unit it updates (unit %d)", layer);
        const int32_t *rows;
        size_t nrows, len;
        FY_TRY(row_list(pool, list, layer, &rows, &nrows, &len));
        if (r.pieces > 0)
            return update_rows_pieces(o, pool, rows, nrows, len, &hp, req[0].step, &r, layer,
                                      scale);
        FY_TRY(update_rows(o, pool, rows, nrows, len, &hp, req[0].step, &r, layer, scale, 0));
        return update_rows(o, pool, rows, nrows, len, &hp, req[0].step, &r, layer, scale, 1);
    }
    struct adamw_request *piece = r.pieces > 0 ? malloc(sizeof *piece) : NULL;
    FY_REQUIRE(r.pieces == 0 || piece != NULL, -ENOMEM, "opt-adamw: out of memory");
    int rc = 0;
    for (unsigned p = 0; rc == 0 && p < (r.pieces > 0 ? r.pieces : 1); p++) {
        const struct adamw_request *at = &r; /* the request, or its piece p */
        if (r.pieces > 0) {
            piece_request(o, &r, layer, p, piece);
            at = piece;
        }
        for (unsigned k = 0; rc == 0 && k < at->tensors; k++) {
            struct fy_adamw_tensor x;
            rc = tensor_view(pool, at, &at->tensor[k], &x);
            x.grad_scale = scale;
            struct fy_adamw_hparams thp = tensor_hparams(&hp, &at->tensor[k]);
            if (rc == 0)
                rc = fy_adamw_update(o->threads, &thp, req[0].step, &x, o->impl);
        }
    }
    free(piece);
    return rc;
}

int fy_optstep_handle(struct fy_optstep *o, const struct fy_pool *pool, const struct fy_desc *req,
                      unsigned n, struct fy_desc *reply)
{
    if (req[0].op == FY_OP_OPT_SUMSQ)
        return sumsq(o, pool, req, n, reply);
    if (req[0].op == FY_OP_OPT_CONVERT)
        return convert(o, pool, req, n);
    FY_REQUIRE(req[0].op == FY_OP_OPT_ADAMW, -EPROTO,
               "opt worker: op %s is not an optimizer operation", fy_op_name(req[0].op));
    FY_REQUIRE(req[0].step >= 1, -EPROTO, "opt-adamw: step (Adam's t) must be >= 1");
    return adamw(o, pool, req, n);
}
