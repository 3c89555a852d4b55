/* fuyou-opt-worker: AdamW on the CPU over regions of the shared pool, with one pinned thread per
 * core of its cpuset and the fastest SIMD kernel this CPU supports. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/dtype.h"
#include "common/worker.h"
#include "opt_worker/adamw.h"
#include "opt_worker/threads.h"

#define MAX_THREADS 1024

struct opt_state {
    struct fy_threads *threads;
    struct fy_adamw_hparams hp;
    enum fy_adamw_impl impl;
};

static int parse_impl(const char *name, enum fy_adamw_impl *out)
{
    static const struct { const char *name; enum fy_adamw_impl impl; } table[] = {
        {"auto", FY_ADAMW_AUTO}, {"scalar", FY_ADAMW_SCALAR},
        {"avx2", FY_ADAMW_AVX2}, {"avx512", FY_ADAMW_AVX512},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(name, table[i].name) == 0) {
            *out = table[i].impl == FY_ADAMW_AUTO ? fy_adamw_best_impl() : table[i].impl;
            FY_REQUIRE(fy_adamw_impl_supported(*out), -ENOTSUP,
                       "adamw_impl = %s is not supported by this CPU: use auto", name);
            return 0;
        }
    fy_error("adamw_impl = %s: use auto, scalar, avx2 or avx512", name);
    return -EINVAL;
}

static int read_hparams(const struct fy_config *cfg, struct fy_adamw_hparams *hp)
{
    double lr, b1, b2, eps, wd;
    FY_TRY(fy_config_get_double(cfg, "lr", 0, 1e-4, &lr));
    FY_TRY(fy_config_get_double(cfg, "beta1", 0, 0.9, &b1));
    FY_TRY(fy_config_get_double(cfg, "beta2", 0, 0.999, &b2));
    FY_TRY(fy_config_get_double(cfg, "eps", 0, 1e-8, &eps));
    FY_TRY(fy_config_get_double(cfg, "weight_decay", 0, 0.0, &wd));
    FY_REQUIRE(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1 && eps > 0 && lr >= 0 && wd >= 0, -EINVAL,
               "AdamW settings out of range: lr %g beta1 %g beta2 %g eps %g weight_decay %g", lr, b1,
               b2, eps, wd);
    *hp = (struct fy_adamw_hparams){(float)lr, (float)b1, (float)b2, (float)eps, (float)wd};
    return 0;
}

static void opt_fini(struct fy_worker *w, void *state)
{
    struct opt_state *s = state;
    if (s == NULL)
        return;
    fy_threads_destroy(&s->threads);
    free(s);
}

static int opt_setup(struct fy_worker *w, struct opt_state *s)
{
    FY_TRY(read_hparams(w->cfg, &s->hp));
    const char *impl = fy_config_get(w->cfg, "adamw_impl");
    FY_TRY(parse_impl(impl ? impl : "auto", &s->impl));
    int *cpus = calloc(MAX_THREADS, sizeof *cpus);
    if (cpus == NULL)
        return -ENOMEM;
    int ncpus = fy_cpulist_parse(w->cpus, cpus, MAX_THREADS);
    uint64_t want;
    int rc = fy_config_get_u64(w->cfg, "opt_threads", 0, 0, &want);
    if (rc == 0 && ncpus <= 0)
        rc = ncpus < 0 ? ncpus : -EINVAL;
    if (rc == 0) {
        unsigned n = want > 0 && want < (uint64_t)ncpus ? (unsigned)want : (unsigned)ncpus;
        rc = fy_threads_new(&s->threads, cpus, n);
    }
    free(cpus);
    FY_TRY(rc);
    fy_info("AdamW: %s kernel, %u threads, lr %g betas (%g, %g) eps %g weight decay %g",
            fy_adamw_impl_name(s->impl), fy_threads_count(s->threads), s->hp.lr, s->hp.beta1,
            s->hp.beta2, s->hp.eps, s->hp.weight_decay);
    return 0;
}

static int opt_init(struct fy_worker *w, void **state)
{
    struct opt_state *s = calloc(1, sizeof *s);
    if (s == NULL)
        return -ENOMEM;
    int rc = opt_setup(w, s);
    if (rc < 0) {
        opt_fini(w, s);
        return rc;
    }
    *state = s;
    return 0;
}

static int regions_overlap(const struct fy_desc *a, const struct fy_desc *b)
{
    return a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes;
}

/* Gathers the parts of an AdamW request by kind and checks they describe one tensor. */
static int adamw_tensor(struct fy_worker *w, const struct fy_desc *req, unsigned n,
                        struct fy_adamw_tensor *x)
{
    const struct fy_desc *part[FY_KIND_COUNT] = {0};
    for (unsigned i = 0; i < n; i++) {
        int k = req[i].kind;
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
                   g->bytes / fy_dtype_size(g->dtype) == count && (wt == NULL || wt->bytes / 2 == count),
               -EPROTO, "opt-adamw: parts hold different element counts");
    FY_REQUIRE(req[0].step >= 1, -EPROTO, "opt-adamw: step (Adam's t) must be >= 1");
    *x = (struct fy_adamw_tensor){
        .master = fy_worker_region(w, p), .m = fy_worker_region(w, m), .v = fy_worker_region(w, v),
        .grad = fy_worker_region(w, g), .grad_dtype = g->dtype,
        .weight_bf16 = wt ? fy_worker_region(w, wt) : NULL, .n = count};
    return 0;
}

static int opt_handle(struct fy_worker *w, void *state, const struct fy_desc *req, unsigned n,
                      struct fy_desc *reply)
{
    struct opt_state *s = state;
    FY_REQUIRE(req[0].op == FY_OP_OPT_ADAMW, -EPROTO, "opt worker: op %s is not an optimizer operation",
               fy_op_name(req[0].op));
    struct fy_adamw_tensor x;
    FY_TRY(adamw_tensor(w, req, n, &x));
    return fy_adamw_update(s->threads, &s->hp, req[0].step, &x, s->impl);
}

int main(int argc, char **argv)
{
    static const struct fy_worker_ops ops = {opt_init, opt_handle, opt_fini};
    return fy_worker_main(argc, argv, "opt", &ops);
}
