/* Optimizer requests: gathers the parts of an opt-adamw request, checks they describe one tensor,
 * and runs the AdamW kernel on the pinned threads, segment by segment where weight decay differs;
 * opt-sumsq sums a gradient's squares for the launcher's global-norm clipping. */
#include "optstep.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/dtype.h"
#include "common/model.h"
#include "common/topo.h"
#include "opt_worker/adamw.h"
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

/* Gathers the parts of an AdamW request by kind and checks they describe one tensor. */
static int adamw_tensor(const struct fy_pool *pool, const struct fy_desc *req, unsigned n,
                        struct fy_adamw_tensor *x)
{
    const struct fy_desc *part[FY_KIND_COUNT] = {0};
    for (unsigned i = 0; i < n; i++) {
        int k = req[i].kind;
        if (k == FY_KIND_TOKENS)
            continue; /* the row list (update_rows), not a part of the tensor */
        FY_REQUIRE(k == FY_KIND_GRAD || k == FY_KIND_MASTER || k == FY_KIND_ADAM_M ||
                       k == FY_KIND_ADAM_V || k == FY_KIND_WEIGHTS,
                   -EPROTO, "opt-adamw: part of kind %s not expected", fy_kind_name(k));
        FY_REQUIRE(part[k] == NULL, -EPROTO, "opt-adamw: two %s parts", fy_kind_name(k));
        part[k] = &req[i];
        for (unsigned j = 0; j < i; j++)
            FY_REQUIRE(!regions_overlap(&req[i], &req[j]), -EPROTO,
                       "opt-adamw: %s and %s regions overlap", fy_kind_name(k),
                       fy_kind_name(req[j].kind));
    }
    const struct fy_desc *g = part[FY_KIND_GRAD], *p = part[FY_KIND_MASTER];
    const struct fy_desc *m = part[FY_KIND_ADAM_M], *v = part[FY_KIND_ADAM_V];
    const struct fy_desc *wt = part[FY_KIND_WEIGHTS];
    FY_REQUIRE(g && p && m && v, -EPROTO, "opt-adamw needs grad, master, adam-m and adam-v parts");
    FY_REQUIRE(p->dtype == FY_DTYPE_F32 && m->dtype == FY_DTYPE_F32 && v->dtype == FY_DTYPE_F32 &&
                   (g->dtype == FY_DTYPE_F32 || g->dtype == FY_DTYPE_BF16) &&
                   (wt == NULL || wt->dtype == FY_DTYPE_BF16),
               -EPROTO, "opt-adamw: state must be f32, grad f32 or bf16, weights bf16");
    size_t count = p->bytes / 4;
    FY_REQUIRE(m->bytes / 4 == count && v->bytes / 4 == count &&
                   g->bytes / fy_dtype_size(g->dtype) == count &&
                   (wt == NULL || wt->bytes / 2 == count),
               -EPROTO, "opt-adamw: parts hold different element counts");
    *x = (struct fy_adamw_tensor){
        .master = fy_pool_at(pool, p->offset, p->bytes), .m = fy_pool_at(pool, m->offset, m->bytes),
        .v = fy_pool_at(pool, v->offset, v->bytes), .grad = fy_pool_at(pool, g->offset, g->bytes),
        .grad_dtype = g->dtype,
        .weight_bf16 = wt ? fy_pool_at(pool, wt->offset, wt->bytes) : NULL, .n = count};
    FY_REQUIRE(x->master && x->m && x->v && x->grad && (wt == NULL || x->weight_bf16), -ERANGE,
               "opt-adamw: a region lies outside the pool");
    return 0;
}

/* A view of elements [begin, end) of the tensor (with 8-bit moments, begin must be a multiple of
 * FY_QUANT8_BLOCK). */
static struct fy_adamw_tensor slice(const struct fy_adamw_tensor *x, size_t begin, size_t end)
{
    size_t gsize = fy_dtype_size(x->grad_dtype);
    size_t msize = x->moments == FY_ADAMW_MOMENTS_Q8     ? 1
                   : x->moments == FY_ADAMW_MOMENTS_BF16 ? 2
                                                         : 4;
    struct fy_adamw_tensor s = *x;
    s.master += begin;
    s.m = (char *)x->m + begin * msize;
    s.v = (char *)x->v + begin * msize;
    if (x->moments == FY_ADAMW_MOMENTS_Q8) {
        s.m_absmax += begin / FY_QUANT8_BLOCK;
        s.v_absmax += begin / FY_QUANT8_BLOCK;
    }
    s.grad = (const char *)x->grad + begin * gsize;
    s.weight_bf16 = x->weight_bf16 ? x->weight_bf16 + begin : NULL;
    s.n = end - begin;
    return s;
}

/* The part of kind k of a request (adamw_tensor has checked there is exactly one). */
static const struct fy_desc *part_of(const struct fy_desc *req, unsigned n, int k)
{
    for (unsigned i = 0; i < n; i++)
        if (req[i].kind == k)
            return &req[i];
    return NULL;
}

/* The hyperparameters of one decay segment: without weight decay where the segment has none. */
static struct fy_adamw_hparams segment_hparams(const struct fy_adamw_hparams *hp,
                                               const struct fy_param_segment *seg)
{
    struct fy_adamw_hparams shp = *hp;
    if (!seg->decay)
        shp.weight_decay = 0.0f;
    return shp;
}

/* opt-adamw over the rows a TOKENS part lists (int32, ascending, each a row of `arg` elements of
 * the unit), per decay segment: the update of a unit in parts, each once its gradient is final. */
static int update_rows(struct fy_optstep *o, const struct fy_pool *pool, const struct fy_desc *list,
                       const struct fy_adamw_hparams *hp, uint64_t step,
                       const struct fy_adamw_tensor *x, int layer)
{
    FY_REQUIRE(list->dtype == FY_DTYPE_I32 && list->arg > 0 && list->bytes % 4 == 0, -EPROTO,
               "opt-adamw: a row list must be int32 with the row length in its arg");
    FY_REQUIRE(layer >= 0 && o->have_model && (unsigned)layer < fy_model_unit_count(&o->model) &&
                   fy_model_unit_params(&o->model, (unsigned)layer) == x->n,
               -EPROTO, "opt-adamw: a row list needs the model's unit it updates (unit %d)", layer);
    size_t nrows = list->bytes / 4, len = (size_t)list->arg;
    const int32_t *rows = fy_pool_at(pool, list->offset, list->bytes);
    FY_REQUIRE(rows != NULL || nrows == 0, -ERANGE, "opt-adamw: the row list lies outside the pool");
    for (size_t i = 1; i < nrows; i++)
        FY_REQUIRE(rows[i] > rows[i - 1], -EPROTO, "opt-adamw: the row list is not ascending");
    struct fy_param_segment seg[FY_MODEL_MAX_SEGMENTS];
    int nseg = fy_model_decay_segments(&o->model, (unsigned)layer, seg);
    FY_TRY(nseg);
    size_t i = 0;
    for (int s = 0; s < nseg; s++) {
        size_t first = i;
        while (i < nrows && ((size_t)rows[i] + 1) * len <= seg[s].end) {
            FY_REQUIRE((size_t)rows[i] * len >= seg[s].begin, -EPROTO,
                       "opt-adamw: row %d straddles two of the unit's decay segments", rows[i]);
            i++;
        }
        struct fy_adamw_hparams shp = segment_hparams(hp, &seg[s]);
        FY_TRY(fy_adamw_update_rows(o->threads, &shp, step, x, rows + first, i - first, len,
                                    o->impl));
    }
    FY_REQUIRE(i == nrows, -EPROTO, "opt-adamw: row %d lies outside unit %d", rows[i], layer);
    return 0;
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

int fy_optstep_handle(struct fy_optstep *o, const struct fy_pool *pool, const struct fy_desc *req,
                      unsigned n, struct fy_desc *reply)
{
    if (req[0].op == FY_OP_OPT_SUMSQ)
        return sumsq(o, pool, req, n, reply);
    FY_REQUIRE(req[0].op == FY_OP_OPT_ADAMW, -EPROTO,
               "opt worker: op %s is not an optimizer operation", fy_op_name(req[0].op));
    FY_REQUIRE(req[0].step >= 1, -EPROTO, "opt-adamw: step (Adam's t) must be >= 1");
    struct fy_adamw_tensor x;
    FY_TRY(adamw_tensor(pool, req, n, &x));
    FY_TRY(grad_scale(part_of(req, n, FY_KIND_GRAD), &x.grad_scale));
    struct fy_adamw_hparams hp = o->hp;
    const struct fy_desc *master = part_of(req, n, FY_KIND_MASTER);
    if (master->arg != 0) {
        double lr;
        memcpy(&lr, &master->arg, sizeof lr);
        FY_REQUIRE(isfinite(lr) && lr >= 0, -EPROTO, "opt-adamw: learning rate %g is invalid", lr);
        hp.lr = (float)lr;
    }
    int layer = req[0].layer;
    const struct fy_desc *list = part_of(req, n, FY_KIND_TOKENS);
    if (list != NULL)
        return update_rows(o, pool, list, &hp, req[0].step, &x, layer);
    if (layer < 0 || !o->have_model)
        return fy_adamw_update(o->threads, &hp, req[0].step, &x, o->impl);
    FY_REQUIRE((unsigned)layer < fy_model_unit_count(&o->model) &&
                   fy_model_unit_params(&o->model, (unsigned)layer) == x.n,
               -EPROTO, "opt-adamw: unit %d of the model does not hold %zu parameters", layer, x.n);
    struct fy_param_segment seg[FY_MODEL_MAX_SEGMENTS];
    int nseg = fy_model_decay_segments(&o->model, (unsigned)layer, seg);
    FY_TRY(nseg);
    for (int i = 0; i < nseg; i++) {
        struct fy_adamw_hparams shp = segment_hparams(&hp, &seg[i]);
        struct fy_adamw_tensor part = slice(&x, seg[i].begin, seg[i].end);
        FY_TRY(fy_adamw_update(o->threads, &shp, req[0].step, &part, o->impl));
    }
    return 0;
}
