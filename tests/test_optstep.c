/* Tests of the optimizer's request handler (opt_worker/optstep) on a real pool: opt-sumsq gives the
 * sum of squares of a gradient region bit for bit as fy_adamw_sumsq does, checks the unit's size and
 * writes nothing; opt-adamw takes its learning rate from the master part and clipping's gradient
 * scale from the grad part, equal bit for bit to the kernel called directly; malformed requests
 * (wrong parts, a bad scale) are refused with -EPROTO before anything is written. With bf16 and
 * int8 optimizer state (common/model/optstate.h) a model unit's update, whole or by rows, equals the
 * kernel called tensor by tensor on views built here from the documented layout (int8: codes,
 * block absmax, the small tensors' f32 moments), and a request of another format than the run's,
 * with a section of the wrong size, or with a row across two tensors is refused, nothing written.
 * opt-convert rounds a unit's weights, or a piece of them, to bf16 as fy_f32_to_bf16 does, and
 * malformed conversions are refused with nothing written. A unit in pieces (init --state-piece),
 * in every format: updated whole (a STATE part), piece by piece (each piece's sections, its index
 * in the master part), or by rows over its pieces, gives bit for bit the state, moments and bf16
 * copy of the same unit in one piece, laid out piece by piece; its masters converted to bf16 or
 * copied to f32 weights give the one piece's; a piece of the wrong size, a STATE part of the
 * wrong size or beside section parts is refused, nothing written. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/base/config.h"
#include "common/ipc/desc.h"
#include "common/base/dtype.h"
#include "common/model/arch/arch.h"
#include "common/model/model.h"
#include "common/model/optstate.h"
#include "common/ipc/pool.h"
#include "opt_worker/adamw.h"
#include "opt_worker/optstep.h"
#include "tests/testutil.h"

/* A model whose units the handler knows (model.* in the config), tiny. */
static const struct fy_model_config MODEL = {.n_layer = 2, .n_head = 2, .n_embd = 16, .vocab = 50,
                                           .ctx = 8};
/* The hyperparameters in the config; the requests below override lr. */
static const struct fy_adamw_hparams HP = {
    .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};

#define REGION_BYTES (4u << 20)

struct fx {
    struct fy_pool *pool;
    struct fy_optstep *opt;
    uint64_t base; /* the test region's offset */
    char name[64];
};

/* The handler's config: the hyperparameters above and the model `c` (NULL: none). */
static struct fy_optstep *new_optstep(const struct fy_model_config *c)
{
    struct fy_config *cfg = calloc(1, sizeof *cfg);
    assert_non_null(cfg);
    fy_config_init(cfg);
    assert_int_equal(fy_config_setf(cfg, "lr", "%.9g", (double)HP.lr), 0);
    assert_int_equal(fy_config_setf(cfg, "beta1", "%.9g", (double)HP.beta1), 0);
    assert_int_equal(fy_config_setf(cfg, "beta2", "%.9g", (double)HP.beta2), 0);
    assert_int_equal(fy_config_setf(cfg, "eps", "%.9g", (double)HP.eps), 0);
    assert_int_equal(fy_config_setf(cfg, "weight_decay", "%.9g", (double)HP.weight_decay), 0);
    assert_int_equal(fy_config_set(cfg, "opt_threads", "2"), 0);
    if (c != NULL)
        assert_int_equal(fy_model_config_to(c, cfg), 0);
    struct fy_optstep *o = NULL;
    assert_int_equal(fy_optstep_new(&o, cfg, "0"), 0);
    free(cfg);
    return o;
}

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    snprintf(f->name, sizeof f->name, "/fuyou-test-optstep-%d", (int)getpid());
    const struct fy_pool_region_spec spec[] = {{"data", REGION_BYTES}};
    struct fy_pool_opts po = {.topo = NULL, .numa_node = -1, .run_dir = "/tmp/test-optstep"};
    assert_int_equal(fy_pool_create(&f->pool, f->name, spec, 1, &po), 0);
    uint64_t bytes;
    assert_int_equal(fy_pool_region(f->pool, "data", &f->base, &bytes), 0);
    f->opt = new_optstep(&MODEL);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    fy_optstep_destroy(&f->opt);
    fy_pool_destroy(&f->pool);
    free(f);
    return 0;
}

static void *at(struct fx *f, uint64_t off, uint64_t bytes)
{
    void *p = fy_pool_at(f->pool, f->base + off, bytes);
    assert_non_null(p);
    return p;
}

static void fill(float *p, size_t n, uint64_t seed, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        p[i] = fy_test_uniform(&seed, lo, hi);
}

static int handle(struct fx *f, const struct fy_desc *req, unsigned n, struct fy_desc *reply)
{
    memset(reply, 0, sizeof *reply);
    return fy_optstep_handle(f->opt, f->pool, req, n, reply);
}

static double arg_double(const struct fy_desc *d)
{
    double v;
    memcpy(&v, &d->arg, sizeof v);
    return v;
}

static uint64_t double_arg(double v)
{
    uint64_t a;
    memcpy(&a, &v, sizeof a);
    return a;
}

/* The sum of squares of a unit's gradient, f32 and bf16, for a model unit and for a free-standing
 * region (layer -1): the reply's double equals fy_adamw_sumsq's bit for bit, and the region is
 * left as it was. */
static void test_sumsq(void **state)
{
    struct fx *f = *state;
    for (unsigned u = 0; u < fy_model_unit_count(&MODEL); u++)
        for (int d = 0; d < 2; d++) {
            int dtype = d ? FY_DTYPE_BF16 : FY_DTYPE_F32;
            size_t n = fy_model_unit_params(&MODEL, u), bytes = n * fy_dtype_size(dtype);
            void *g = at(f, 0, bytes);
            for (size_t i = 0; i < n; i++) {
                uint64_t seed = 100 * u + i;
                float v = fy_test_uniform(&seed, -0.1f, 0.1f);
                if (d)
                    ((uint16_t *)g)[i] = fy_f32_to_bf16(v);
                else
                    ((float *)g)[i] = v;
            }
            void *keep = malloc(bytes);
            assert_non_null(keep);
            memcpy(keep, g, bytes);
            double expect;
            assert_int_equal(fy_adamw_sumsq(NULL, g, dtype, n, &expect), 0);
            assert_true(expect > 0);
            for (int layer = -1; layer <= 0; layer++) {
                struct fy_desc req = fy_desc_region(FY_OP_OPT_SUMSQ, FY_KIND_GRAD, dtype,
                                                    f->base, bytes, layer < 0 ? -1 : (int)u);
                struct fy_desc reply;
                assert_int_equal(handle(f, &req, 1, &reply), 0);
                double got = arg_double(&reply);
                assert_memory_equal(&got, &expect, sizeof got);
            }
            assert_memory_equal(g, keep, bytes);
            free(keep);
        }
}

static void test_sumsq_refused(void **state)
{
    struct fx *f = *state;
    size_t n = fy_model_unit_params(&MODEL, 1);
    struct fy_desc reply, req[2];
    req[0] = fy_desc_region(FY_OP_OPT_SUMSQ, FY_KIND_GRAD, FY_DTYPE_F32, f->base, n * 4, 1);
    req[1] = req[0];
    req[1].offset += n * 4;
    assert_int_equal(handle(f, req, 2, &reply), -EPROTO); /* two parts */
    req[1] = req[0];
    req[1].kind = FY_KIND_MASTER;
    assert_int_equal(handle(f, &req[1], 1, &reply), -EPROTO); /* not a gradient */
    req[1] = req[0];
    req[1].dtype = FY_DTYPE_I32;
    assert_int_equal(handle(f, &req[1], 1, &reply), -EPROTO); /* not f32 or bf16 */
    req[1] = req[0];
    req[1].bytes -= 4;
    assert_int_equal(handle(f, &req[1], 1, &reply), -EPROTO); /* not unit 1's size */
    req[1] = req[0];
    req[1].layer = (int)fy_model_unit_count(&MODEL);
    assert_int_equal(handle(f, &req[1], 1, &reply), -EPROTO); /* no such unit */
    req[1] = req[0];
    req[1].offset = fy_pool_size(f->pool);
    assert_true(handle(f, &req[1], 1, &reply) < 0); /* outside the pool */
    assert_int_equal(handle(f, req, 1, &reply), 0);
}

/* One opt-adamw request over a free-standing tensor (layer -1: decay on every element). */
struct tensor {
    size_t n;
    uint64_t grad, master, m, v; /* offsets in the test region */
};

static struct tensor tensor_at(size_t n)
{
    uint64_t stride = (n * 4 + 4095) / 4096 * 4096;
    return (struct tensor){n, 0, stride, 2 * stride, 3 * stride};
}

static void tensor_fill(struct fx *f, const struct tensor *t, uint64_t seed)
{
    fill(at(f, t->grad, t->n * 4), t->n, seed, -0.1f, 0.1f);
    fill(at(f, t->master, t->n * 4), t->n, seed + 1, -1.0f, 1.0f);
    fill(at(f, t->m, t->n * 4), t->n, seed + 2, -0.01f, 0.01f);
    fill(at(f, t->v, t->n * 4), t->n, seed + 3, 0.0f, 1e-4f);
}

static int adamw_request(struct fx *f, const struct tensor *t, uint64_t step, double lr,
                         uint64_t scale_arg)
{
    int op = FY_OP_OPT_ADAMW;
    uint64_t b = t->n * 4;
    /* parts in an order other than the launcher's: the handler goes by kind */
    struct fy_desc req[4] = {
        fy_desc_region(op, FY_KIND_ADAM_V, FY_DTYPE_F32, f->base + t->v, b, -1),
        fy_desc_region(op, FY_KIND_MASTER, FY_DTYPE_F32, f->base + t->master, b, -1),
        fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, f->base + t->grad, b, -1),
        fy_desc_region(op, FY_KIND_ADAM_M, FY_DTYPE_F32, f->base + t->m, b, -1),
    };
    for (int i = 0; i < 4; i++)
        req[i].step = step;
    req[1].arg = double_arg(lr);
    req[2].arg = scale_arg;
    struct fy_desc reply;
    return handle(f, req, 4, &reply);
}

/* The state after a request, or after the kernel called directly, for comparison. */
static float *snapshot(struct fx *f, const struct tensor *t)
{
    float *s = malloc(3 * t->n * 4);
    assert_non_null(s);
    memcpy(s, at(f, t->master, t->n * 4), t->n * 4);
    memcpy(s + t->n, at(f, t->m, t->n * 4), t->n * 4);
    memcpy(s + 2 * t->n, at(f, t->v, t->n * 4), t->n * 4);
    return s;
}

/* The request's update equals fy_adamw_update with the request's lr (from the master part) and
 * x.grad_scale = (float)scale (from the grad part), bit for bit; scale 0 is no scaling. */
static void test_adamw_scale_and_lr(void **state)
{
    struct fx *f = *state;
    const struct tensor t = tensor_at(1000 + 13);
    static const double scales[] = {0.0, 0.3183098861837907, 1e-3};
    for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++) {
        const double lr = 2.5e-3;
        tensor_fill(f, &t, 7 + k);
        float *before = snapshot(f, &t);
        assert_int_equal(adamw_request(f, &t, 4, lr, double_arg(scales[k])), 0);
        float *got = snapshot(f, &t);
        /* the same from the kernel */
        tensor_fill(f, &t, 7 + k);
        struct fy_adamw_hparams hp = HP;
        hp.lr = (float)lr;
        struct fy_adamw_tensor x = {.master = at(f, t.master, t.n * 4), .m = at(f, t.m, t.n * 4),
                                    .v = at(f, t.v, t.n * 4), .grad = at(f, t.grad, t.n * 4),
                                    .grad_dtype = FY_DTYPE_F32, .n = t.n,
                                    .grad_scale = (float)scales[k]};
        assert_int_equal(fy_adamw_update(NULL, &hp, 4, &x, FY_ADAMW_SCALAR), 0);
        float *want = snapshot(f, &t);
        assert_memory_equal(got, want, 3 * t.n * 4);
        assert_memory_not_equal(got, before, 3 * t.n * 4);
        free(before);
        free(got);
        free(want);
    }
    /* the scale does reach the update: 0.5 differs from none */
    tensor_fill(f, &t, 3);
    assert_int_equal(adamw_request(f, &t, 2, 1e-3, 0), 0);
    float *plain = snapshot(f, &t);
    tensor_fill(f, &t, 3);
    assert_int_equal(adamw_request(f, &t, 2, 1e-3, double_arg(0.5)), 0);
    float *scaled = snapshot(f, &t);
    assert_memory_not_equal(plain, scaled, 3 * t.n * 4);
    free(plain);
    free(scaled);
}

/* A scale that is negative, not finite, or too small for a float (it would round to 0, which
 * means "none") is refused before any element changes. */
static void test_adamw_bad_scale_refused(void **state)
{
    struct fx *f = *state;
    const struct tensor t = tensor_at(257);
    static const double bad[] = {-0.5, NAN, INFINITY, 1e-50, 1e300};
    tensor_fill(f, &t, 11);
    float *before = snapshot(f, &t);
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        assert_int_equal(adamw_request(f, &t, 1, 1e-3, double_arg(bad[k])), -EPROTO);
        float *after = snapshot(f, &t);
        assert_memory_equal(after, before, 3 * t.n * 4);
        free(after);
    }
    free(before);
}

/* A unit's update (the embeddings, unit 0) as two requests over complementary row lists gives the
 * bits of one request over the whole unit, each decay segment (token rows, position rows) keeping
 * its own weight decay; a list that is not ascending, reaches outside the unit or comes without
 * the unit's number is refused. */
static void test_adamw_rows_in_two_parts(void **state)
{
    struct fx *f = *state;
    const size_t C = MODEL.n_embd, rows = MODEL.vocab + MODEL.ctx;
    const struct tensor t = tensor_at(fy_model_unit_params(&MODEL, 0));
    assert_int_equal(t.n, rows * C);
    uint64_t lists = 4 * ((t.n * 4 + 4095) / 4096 * 4096);
    int op = FY_OP_OPT_ADAMW;
    struct fy_desc req[5] = {
        fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, f->base + t.grad, t.n * 4, 0),
        fy_desc_region(op, FY_KIND_MASTER, FY_DTYPE_F32, f->base + t.master, t.n * 4, 0),
        fy_desc_region(op, FY_KIND_ADAM_M, FY_DTYPE_F32, f->base + t.m, t.n * 4, 0),
        fy_desc_region(op, FY_KIND_ADAM_V, FY_DTYPE_F32, f->base + t.v, t.n * 4, 0),
        fy_desc_region(op, FY_KIND_TOKENS, FY_DTYPE_I32, f->base + lists, 0, 0),
    };
    for (int i = 0; i < 5; i++)
        req[i].step = 3;
    req[4].arg = C;
    struct fy_desc reply;
    tensor_fill(f, &t, 31);
    assert_int_equal(handle(f, req, 4, &reply), 0);
    float *whole = snapshot(f, &t);
    tensor_fill(f, &t, 31);
    float *before = snapshot(f, &t);
    int32_t *list = at(f, lists, rows * 4);
    size_t first = 0;
    for (size_t r = 0; r < rows; r++) /* some token rows; the rest and the positions after */
        if (r < MODEL.vocab && r % 4 != 1)
            list[first++] = (int32_t)r;
    req[4].bytes = first * 4;
    assert_int_equal(handle(f, req, 5, &reply), 0);
    float *half = snapshot(f, &t);
    assert_memory_not_equal(half, before, 3 * t.n * 4);
    assert_memory_not_equal(half, whole, 3 * t.n * 4);
    size_t rest = 0;
    for (size_t r = 0; r < rows; r++)
        if (!(r < MODEL.vocab && r % 4 != 1))
            list[rest++] = (int32_t)r;
    req[4].bytes = rest * 4;
    assert_int_equal(handle(f, req, 5, &reply), 0);
    float *parts = snapshot(f, &t);
    assert_memory_equal(parts, whole, 3 * t.n * 4);
    /* refused, nothing changed */
    list[0] = 5;
    list[1] = 3;
    req[4].bytes = 2 * 4;
    assert_int_equal(handle(f, req, 5, &reply), -EPROTO);
    list[0] = (int32_t)rows;
    req[4].bytes = 4;
    assert_int_equal(handle(f, req, 5, &reply), -EPROTO);
    list[0] = 0;
    for (int i = 0; i < 5; i++)
        req[i].layer = -1;
    assert_int_equal(handle(f, req, 5, &reply), -EPROTO);
    float *after = snapshot(f, &t);
    assert_memory_equal(after, parts, 3 * t.n * 4);
    free(whole);
    free(before);
    free(half);
    free(parts);
    free(after);
}

/* --- bf16 and int8 optimizer state ------------------------------------------------------------ */

/* Width 64 (blocks with 4096-value matrices and 64-value norms and biases; wte 6400 values,
 * quantized in int8, wpe 2048, kept f32); width 256 (the embeddings' rows a whole number of int8
 * blocks: wte 12800 values, wpe 2048). */
static struct fy_model_config model_of(unsigned embd, int format)
{
    struct fy_model_config c = {.n_layer = 2, .n_head = 2, .n_embd = embd,
                                .vocab = embd == 64 ? 100 : 50, .ctx = embd == 64 ? 32 : 8};
    c.optim_state = format;
    return c;
}

static uint64_t up4k(uint64_t v) { return (v + 4095) / 4096 * 4096; }

/* Where a unit's tensors have their moments, found here from the tensor table by the rule
 * common/model/optstate.h states, not by its code: in int8 a tensor of 4096 values or more has codes
 * in adam_m and adam_v (tensor after tensor) and blocks of 256 in adam_absmax (m's blocks, then
 * v's); the others f32 moments in adam_small (every m, then every v); each section 4 KiB aligned. */
struct hand_layout {
    unsigned n;
    uint64_t begin[FY_UNIT_MAX_TENSORS], count[FY_UNIT_MAX_TENSORS];
    int decay[FY_UNIT_MAX_TENSORS], quantized[FY_UNIT_MAX_TENSORS];
    uint64_t at[FY_UNIT_MAX_TENSORS], block[FY_UNIT_MAX_TENSORS];
    uint64_t params, codes, blocks, small;
    uint64_t master, m, v, absmax, smalls, bytes; /* section offsets, the whole state */
};

static struct hand_layout hand_layout(const struct fy_model_config *c, unsigned unit)
{
    struct hand_layout h = {0};
    struct fy_tensor_spec spec[FY_UNIT_MAX_TENSORS];
    h.n = fy_unit_tensors(c, unit, spec);
    for (unsigned i = 0; i < h.n; i++) {
        uint64_t n = spec[i].shape[0] * (spec[i].ndim == 2 ? spec[i].shape[1] : 1);
        h.begin[i] = h.params;
        h.count[i] = n;
        h.decay[i] = spec[i].decay;
        h.params += n;
        h.quantized[i] = c->optim_state == FY_OPTIM_STATE_INT8 && n >= 4096;
        if (h.quantized[i]) {
            h.at[i] = h.codes;
            h.block[i] = h.blocks;
            h.codes += n;
            h.blocks += (n + 255) / 256;
        } else if (c->optim_state == FY_OPTIM_STATE_INT8) {
            h.at[i] = h.small;
            h.small += n;
        }
    }
    assert_int_equal(h.params, fy_model_unit_params(c, unit));
    h.master = 0;
    h.m = up4k(h.params * 4);
    if (c->optim_state == FY_OPTIM_STATE_INT8) {
        h.v = h.m + up4k(h.codes);
        h.absmax = h.v + up4k(h.codes);
        h.smalls = h.absmax + up4k(h.blocks * 2 * 4);
        h.bytes = h.smalls + up4k(h.small * 2 * 4);
    } else {
        size_t size = c->optim_state == FY_OPTIM_STATE_BF16 ? 2 : 4;
        h.v = h.m + up4k(h.params * size);
        h.bytes = h.v + up4k(h.params * size);
    }
    return h;
}

/* A unit's state at offset `state` of the test region: random master, and moments of the
 * format's kind (bf16 values; int8 codes, positive absmax, f32 small moments with v >= 0),
 * zeros in the padding; its f32 gradient at offset 0. */
static void fill_unit(struct fx *f, const struct fy_model_config *c, const struct hand_layout *h,
                      uint64_t state, uint64_t seed)
{
    fill(at(f, 0, h->params * 4), h->params, seed, -0.1f, 0.1f);
    uint8_t *s = at(f, state, h->bytes);
    memset(s, 0, h->bytes);
    fill((float *)(s + h->master), h->params, seed + 1, -1.0f, 1.0f);
    uint64_t r = seed + 2;
    if (c->optim_state == FY_OPTIM_STATE_BF16) {
        uint16_t *m = (uint16_t *)(s + h->m), *v = (uint16_t *)(s + h->v);
        for (uint64_t i = 0; i < h->params; i++) {
            m[i] = fy_f32_to_bf16(fy_test_uniform(&r, -0.01f, 0.01f));
            v[i] = fy_f32_to_bf16(fy_test_uniform(&r, 0.0f, 1e-4f));
        }
        return;
    }
    for (uint64_t i = 0; i < h->codes; i++) {
        s[h->m + i] = (uint8_t)(fy_test_rand(&r) >> 24);
        s[h->v + i] = (uint8_t)(fy_test_rand(&r) >> 24);
    }
    float *absmax = (float *)(s + h->absmax), *small = (float *)(s + h->smalls);
    fill(absmax, h->blocks, seed + 3, 1e-3f, 1e-2f);
    fill(absmax + h->blocks, h->blocks, seed + 4, 1e-5f, 1e-4f);
    fill(small, h->small, seed + 5, -0.01f, 0.01f);
    fill(small + h->small, h->small, seed + 6, 0.0f, 1e-4f);
}

/* The kernel's view of tensor i of the state at `s`, from the hand-made layout. */
static struct fy_adamw_tensor hand_view(const struct fy_model_config *c, const struct hand_layout *h,
                                        unsigned i, uint8_t *s, const float *grad)
{
    struct fy_adamw_tensor x = {.master = (float *)(s + h->master) + h->begin[i],
                                .grad = grad + h->begin[i], .grad_dtype = FY_DTYPE_F32,
                                .n = h->count[i]};
    if (c->optim_state == FY_OPTIM_STATE_BF16) {
        x.moments = FY_ADAMW_MOMENTS_BF16;
        x.m = (uint16_t *)(s + h->m) + h->begin[i];
        x.v = (uint16_t *)(s + h->v) + h->begin[i];
    } else if (h->quantized[i]) {
        x.moments = FY_ADAMW_MOMENTS_Q8;
        x.m = s + h->m + h->at[i];
        x.v = s + h->v + h->at[i];
        x.m_absmax = (float *)(s + h->absmax) + h->block[i];
        x.v_absmax = (float *)(s + h->absmax) + h->blocks + h->block[i];
    } else {
        x.moments = FY_ADAMW_MOMENTS_F32;
        x.m = (float *)(s + h->smalls) + h->at[i];
        x.v = (float *)(s + h->smalls) + h->small + h->at[i];
    }
    return x;
}

/* The parts of an opt-adamw request for unit `unit` with its state at `state`: the gradient, then
 * the layout's sections (fy_optstate_parts), the lr in the master part; returns how many. */
static unsigned unit_request(struct fx *f, const struct fy_model_config *c, unsigned unit,
                             uint64_t state, uint64_t step, double lr, struct fy_desc *req)
{
    struct fy_optstate_layout l;
    fy_optstate_layout(c, unit, &l);
    size_t n = fy_model_unit_params(c, unit);
    req[0] = fy_desc_region(FY_OP_OPT_ADAMW, FY_KIND_GRAD, FY_DTYPE_F32, f->base, n * 4,
                            (int)unit);
    unsigned count = 1 + fy_optstate_parts(&l, f->base + state, (int)unit, req + 1);
    for (unsigned i = 0; i < count; i++)
        req[i].step = step;
    req[1].arg = double_arg(lr);
    return count;
}

/* Every unit of the width-64 model in bf16 and int8: the handler's update (with a clipping scale)
 * equals the kernel called on each tensor (its decay, its moments where the layout says, the
 * scale) bit for bit, and the layout the handler uses is the one described. */
static void test_adamw_unit_formats(void **state)
{
    struct fx *f = *state;
    const int formats[] = {FY_OPTIM_STATE_BF16, FY_OPTIM_STATE_INT8};
    for (size_t k = 0; k < 2; k++) {
        struct fy_model_config c = model_of(64, formats[k]);
        struct fy_optstep *opt = new_optstep(&c);
        int quantized = 0, small = 0;
        for (unsigned u = 0; u < fy_model_unit_count(&c); u++) {
            struct hand_layout h = hand_layout(&c, u);
            struct fy_optstate_layout l;
            fy_optstate_layout(&c, u, &l);
            assert_int_equal(l.bytes, h.bytes);
            if (formats[k] == FY_OPTIM_STATE_INT8) {
                assert_int_equal(l.count, 5);
                assert_int_equal(l.section[FY_OPTSTATE_ABSMAX].offset, h.absmax);
                assert_int_equal(l.section[FY_OPTSTATE_SMALL].offset, h.smalls);
                for (unsigned i = 0; i < h.n; i++)
                    h.quantized[i] ? quantized++ : small++;
            }
            const uint64_t state_at = up4k(h.params * 4);
            assert_true(state_at + h.bytes <= REGION_BYTES);
            fill_unit(f, &c, &h, state_at, 40 + 10 * u + k);
            uint8_t *before = malloc(h.bytes);
            memcpy(before, at(f, state_at, h.bytes), h.bytes);
            struct fy_desc req[8], reply;
            const double lr = 2e-3;
            unsigned n = unit_request(f, &c, u, state_at, 5, lr, req);
            const double scale = 0.37; /* clipping's, in the grad part */
            req[0].arg = double_arg(scale);
            memset(&reply, 0, sizeof reply);
            assert_int_equal(fy_optstep_handle(opt, f->pool, req, n, &reply), 0);
            uint8_t *got = malloc(h.bytes);
            memcpy(got, at(f, state_at, h.bytes), h.bytes);
            assert_memory_not_equal(got, before, h.bytes);
            /* by hand */
            memcpy(at(f, state_at, h.bytes), before, h.bytes);
            uint8_t *s = at(f, state_at, h.bytes);
            const float *grad = at(f, 0, h.params * 4);
            for (unsigned i = 0; i < h.n; i++) {
                struct fy_adamw_hparams hp = HP;
                hp.lr = (float)lr;
                if (!h.decay[i])
                    hp.weight_decay = 0.0f;
                struct fy_adamw_tensor x = hand_view(&c, &h, i, s, grad);
                x.grad_scale = (float)scale;
                assert_int_equal(fy_adamw_update(NULL, &hp, 5, &x, FY_ADAMW_SCALAR), 0);
            }
            assert_memory_equal(got, s, h.bytes);
            free(before);
            free(got);
        }
        if (formats[k] == FY_OPTIM_STATE_INT8)
            assert_true(quantized > 0 && small > 0); /* both kinds of tensor were there */
        fy_optstep_destroy(&opt);
    }
}

/* int8, width 256: the embeddings updated as two requests over complementary row lists (the
 * update the schedule splits) give the bits of the kernel over each whole tensor, the token rows'
 * 8-bit blocks and the position rows' f32 moments alike; a row of 768 values (across wte's end)
 * and a row list over a quantized tensor whose rows split its blocks (width 64) are refused with
 * nothing written. */
static void test_adamw_int8_rows(void **state)
{
    struct fx *f = *state;
    struct fy_model_config c = model_of(256, FY_OPTIM_STATE_INT8);
    struct fy_optstep *opt = new_optstep(&c);
    struct hand_layout h = hand_layout(&c, 0);
    assert_true(h.quantized[0] && !h.quantized[1]); /* wte 8-bit, wpe f32 */
    const size_t C = c.n_embd, rows = c.vocab + c.ctx;
    const uint64_t state_at = up4k(h.params * 4), lists = state_at + h.bytes;
    fill_unit(f, &c, &h, state_at, 77);
    uint8_t *before = malloc(h.bytes);
    memcpy(before, at(f, state_at, h.bytes), h.bytes);
    /* the kernel over each tensor, by hand */
    uint8_t *s = at(f, state_at, h.bytes);
    for (unsigned i = 0; i < h.n; i++) {
        struct fy_adamw_hparams hp = HP;
        hp.lr = 1e-3f;
        if (!h.decay[i])
            hp.weight_decay = 0.0f;
        struct fy_adamw_tensor x = hand_view(&c, &h, i, s, at(f, 0, h.params * 4));
        assert_int_equal(fy_adamw_update(NULL, &hp, 2, &x, FY_ADAMW_SCALAR), 0);
    }
    uint8_t *want = malloc(h.bytes);
    memcpy(want, s, h.bytes);
    memcpy(s, before, h.bytes);
    struct fy_desc req[8], reply;
    unsigned n = unit_request(f, &c, 0, state_at, 2, 1e-3, req);
    req[n] = fy_desc_region(FY_OP_OPT_ADAMW, FY_KIND_TOKENS, FY_DTYPE_I32, f->base + lists, 0, 0);
    req[n].step = 2;
    req[n].arg = C;
    int32_t *list = at(f, lists, rows * 4);
    size_t first = 0, rest = 0;
    for (size_t r = 0; r < rows; r++) /* some token rows, some position rows */
        if (r % 3 != 1)
            list[first++] = (int32_t)r;
    req[n].bytes = first * 4;
    assert_int_equal(fy_optstep_handle(opt, f->pool, req, n + 1, &reply), 0);
    assert_memory_not_equal(s, before, h.bytes);
    assert_memory_not_equal(s, want, h.bytes);
    for (size_t r = 0; r < rows; r++)
        if (r % 3 == 1)
            list[rest++] = (int32_t)r;
    req[n].bytes = rest * 4;
    assert_int_equal(fy_optstep_handle(opt, f->pool, req, n + 1, &reply), 0);
    assert_memory_equal(s, want, h.bytes);
    /* refused, nothing written: rows of 768 values, one across wte's end (row 16: 12288..13056) */
    memcpy(s, before, h.bytes);
    list[0] = 0;
    list[1] = 16;
    req[n].bytes = 2 * 4;
    req[n].arg = 3 * C;
    assert_int_equal(fy_optstep_handle(opt, f->pool, req, n + 1, &reply), -EPROTO);
    assert_memory_equal(s, before, h.bytes);
    /* rows of 64 values over 8-bit wte would split its blocks (and a row in f32 wpe) */
    list[0] = 3;
    list[1] = 4 * 50 + 1;
    req[n].arg = 64;
    assert_int_equal(fy_optstep_handle(opt, f->pool, req, n + 1, &reply), -EPROTO);
    assert_memory_equal(s, before, h.bytes);
    /* a negative row */
    list[0] = -1;
    list[1] = 0;
    req[n].arg = C;
    assert_int_equal(fy_optstep_handle(opt, f->pool, req, n + 1, &reply), -EPROTO);
    assert_memory_equal(s, before, h.bytes);
    free(before);
    free(want);
    fy_optstep_destroy(&opt);
}

/* A unit's request refused, nothing written: moments of another format than the run's (an fp32
 * or bf16 state sent to an int8 run, an int8 state to a bf16 one), and int8 sections of the wrong
 * size, missing, of the wrong type, or a section int8 has sent with bf16 moments. */
static void test_adamw_formats_refused(void **state)
{
    struct fx *f = *state;
    struct fy_model_config c8 = model_of(64, FY_OPTIM_STATE_INT8);
    struct fy_model_config c16 = model_of(64, FY_OPTIM_STATE_BF16);
    struct fy_model_config c32 = model_of(64, FY_OPTIM_STATE_FP32);
    struct fy_optstep *opt8 = new_optstep(&c8), *opt16 = new_optstep(&c16);
    const unsigned u = 1; /* a block: quantized and small tensors */
    struct hand_layout h = hand_layout(&c8, u);
    struct hand_layout h32 = hand_layout(&c32, u);
    const uint64_t state_at = up4k(h.params * 4);
    assert_true(state_at + h32.bytes <= REGION_BYTES);
    fill_unit(f, &c8, &h, state_at, 5);
    uint8_t *before = malloc(h32.bytes);
    memcpy(before, at(f, state_at, h32.bytes), h32.bytes);
    struct fy_desc req[8], bad[8], reply;
    /* the run keeps int8: fp32 and bf16 requests of the right sizes for their formats */
    unsigned n = unit_request(f, &c32, u, state_at, 3, 1e-3, bad);
    assert_int_equal(fy_optstep_handle(opt8, f->pool, bad, n, &reply), -EPROTO);
    n = unit_request(f, &c16, u, state_at, 3, 1e-3, bad);
    assert_int_equal(fy_optstep_handle(opt8, f->pool, bad, n, &reply), -EPROTO);
    /* the run keeps bf16: an int8 request */
    n = unit_request(f, &c8, u, state_at, 3, 1e-3, req);
    assert_int_equal(n, 6);
    assert_int_equal(fy_optstep_handle(opt16, f->pool, req, n, &reply), -EPROTO);
    /* int8's sections wrong: each of the four a value short, the absmax part gone, the small
     * part u8, adam-v f32 */
    for (unsigned i = 2; i < n; i++) {
        memcpy(bad, req, sizeof req);
        bad[i].bytes -= i == 2 || i == 3 ? 1 : 4;
        assert_int_equal(fy_optstep_handle(opt8, f->pool, bad, n, &reply), -EPROTO);
    }
    memcpy(bad, req, sizeof req);
    assert_int_equal(fy_optstep_handle(opt8, f->pool, bad, n - 1, &reply), -EPROTO);
    bad[4] = bad[5];
    assert_int_equal(fy_optstep_handle(opt8, f->pool, bad, n - 1, &reply), -EPROTO);
    memcpy(bad, req, sizeof req);
    bad[5].dtype = FY_DTYPE_U8;
    assert_int_equal(fy_optstep_handle(opt8, f->pool, bad, n, &reply), -EPROTO);
    memcpy(bad, req, sizeof req);
    bad[3].dtype = FY_DTYPE_F32;
    assert_int_equal(fy_optstep_handle(opt8, f->pool, bad, n, &reply), -EPROTO);
    /* bf16 moments with int8's absmax part beside them */
    unsigned n16 = unit_request(f, &c16, u, state_at, 3, 1e-3, bad);
    bad[n16] = req[4];
    bad[n16].offset = f->base + state_at + h32.bytes; /* clear of the bf16 state's sections */
    assert_true(state_at + h32.bytes + bad[n16].bytes <= REGION_BYTES);
    assert_int_equal(fy_optstep_handle(opt16, f->pool, bad, n16 + 1, &reply), -EPROTO);
    assert_memory_equal(at(f, state_at, h32.bytes), before, h32.bytes);
    /* and the request itself goes through */
    assert_int_equal(fy_optstep_handle(opt8, f->pool, req, n, &reply), 0);
    free(before);
    fy_optstep_destroy(&opt8);
    fy_optstep_destroy(&opt16);
}

/* opt-convert: a unit's whole weights and a piece of them (a chunk of a streamed unit's master),
 * each rounded as fy_f32_to_bf16 rounds, awkward values among them (a tie, NaN, infinity, a
 * denormal); nothing written past the weights part. */
static void test_convert(void **state)
{
    struct fx *f = *state;
    size_t n = fy_model_unit_params(&MODEL, 1), piece = 1000;
    float *src = at(f, 0, n * 4);
    fill(src, n, 3, -2.0f, 2.0f);
    const uint32_t odd[4] = {0x3f808000u, 0x7f800001u, 0xff800000u, 0x00000001u};
    memcpy(src + 5, odd, sizeof odd);
    uint64_t dst_at = (n * 4 + 4095) / 4096 * 4096;
    uint16_t *dst = at(f, dst_at, n * 2 + 2);
    memset(dst, 0xab, n * 2 + 2);
    struct fy_desc req[2] = {
        fy_desc_region(FY_OP_OPT_CONVERT, FY_KIND_MASTER, FY_DTYPE_F32, f->base, n * 4, 1),
        fy_desc_region(FY_OP_OPT_CONVERT, FY_KIND_WEIGHTS, FY_DTYPE_BF16, f->base + dst_at, n * 2, 1)};
    struct fy_desc reply;
    assert_int_equal(handle(f, req, 2, &reply), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(dst[i], fy_f32_to_bf16(src[i]));
    assert_int_equal(dst[n], 0xabab);
    /* a piece from element 4000 on, the parts in the other order, no unit named */
    memset(dst, 0xab, n * 2 + 2);
    struct fy_desc chunk[2] = {req[1], req[0]};
    chunk[0].offset += 4000 * 2;
    chunk[0].bytes = piece * 2;
    chunk[1].offset += 4000 * 4;
    chunk[1].bytes = piece * 4;
    chunk[0].layer = chunk[1].layer = -1;
    assert_int_equal(handle(f, chunk, 2, &reply), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(dst[i], i >= 4000 && i < 4000 + piece ? fy_f32_to_bf16(src[i]) : 0xabab);
}

/* Malformed opt-convert requests are refused before anything is written. */
static void test_convert_refused(void **state)
{
    struct fx *f = *state;
    size_t n = fy_model_unit_params(&MODEL, 1);
    uint64_t dst_at = (n * 4 + 4095) / 4096 * 4096;
    uint16_t *dst = at(f, dst_at, n * 2);
    memset(dst, 0xab, n * 2);
    const struct fy_desc good[2] = {
        fy_desc_region(FY_OP_OPT_CONVERT, FY_KIND_MASTER, FY_DTYPE_F32, f->base, n * 4, 1),
        fy_desc_region(FY_OP_OPT_CONVERT, FY_KIND_WEIGHTS, FY_DTYPE_BF16, f->base + dst_at, n * 2, 1)};
    struct fy_desc reply, bad[3];
    memcpy(bad, good, sizeof good);
    assert_int_equal(handle(f, bad, 1, &reply), -EPROTO); /* one part */
    bad[2] = good[1];
    assert_int_equal(handle(f, bad, 3, &reply), -EPROTO); /* three */
    memcpy(bad, good, sizeof good);
    bad[1].kind = FY_KIND_MASTER;
    assert_int_equal(handle(f, bad, 2, &reply), -EPROTO); /* no weights part */
    memcpy(bad, good, sizeof good);
    bad[0].dtype = FY_DTYPE_BF16;
    bad[0].bytes = n * 2;
    assert_int_equal(handle(f, bad, 2, &reply), -EPROTO); /* the master not f32 */
    memcpy(bad, good, sizeof good);
    bad[1].dtype = FY_DTYPE_I32;
    bad[1].bytes = n * 4;
    assert_int_equal(handle(f, bad, 2, &reply), -EPROTO); /* the weights not bf16 or f32 */
    memcpy(bad, good, sizeof good);
    bad[1].bytes -= 2;
    assert_int_equal(handle(f, bad, 2, &reply), -EPROTO); /* element counts differ */
    memcpy(bad, good, sizeof good);
    bad[0].bytes = bad[1].bytes = 0;
    assert_int_equal(handle(f, bad, 2, &reply), -EPROTO); /* nothing to convert */
    memcpy(bad, good, sizeof good);
    bad[1].offset = f->base + n * 2;
    assert_int_equal(handle(f, bad, 2, &reply), -EPROTO); /* overlapping */
    memcpy(bad, good, sizeof good);
    bad[0].layer = bad[1].layer = 0;
    bad[0].bytes = (fy_model_unit_params(&MODEL, 0) + 1) * 4; /* more than unit 0 holds */
    bad[1].bytes = (fy_model_unit_params(&MODEL, 0) + 1) * 2;
    assert_int_equal(handle(f, bad, 2, &reply), -EPROTO);
    memcpy(bad, good, sizeof good);
    bad[0].layer = bad[1].layer = (int)fy_model_unit_count(&MODEL);
    assert_int_equal(handle(f, bad, 2, &reply), -EPROTO); /* no such unit */
    memcpy(bad, good, sizeof good);
    bad[1].offset = fy_pool_size(f->pool);
    assert_true(handle(f, bad, 2, &reply) < 0); /* outside the pool */
    for (size_t i = 0; i < n; i++)
        assert_int_equal(dst[i], 0xabab);
    assert_int_equal(handle(f, good, 2, &reply), 0);
}

/* --- a unit's state in pieces ----------------------------------------------------------------- */

/* The state `whole` of unit u laid out in one piece (model c, state_piece 0) copied into `pieces`,
 * laid out in the pieces of cp: each value of the master and of the moments to its place, each
 * int8 block's absmax to its block's; padding zero. */
static void relayout(const struct fy_model_config *c, const struct fy_model_config *cp, unsigned u,
                     const uint8_t *whole, uint8_t *pieces)
{
    struct fy_optstate_layout wl;
    fy_optstate_layout(c, u, &wl);
    struct fy_optstate_tensor wt[FY_UNIT_MAX_TENSORS];
    unsigned nt = fy_optstate_tensors(c, u, wt);
    memset(pieces, 0, fy_optstate_bytes(cp, u));
    uint64_t done[FY_UNIT_MAX_TENSORS] = {0};
    unsigned t = 0;
    int format = c->optim_state;
    size_t size = format == FY_OPTIM_STATE_BF16 ? 2 : format == FY_OPTIM_STATE_INT8 ? 1 : 4;
    for (unsigned k = 0; k < fy_optstate_piece_count(cp, u); k++) {
        struct fy_optstate_piece p;
        struct fy_optstate_tensor pt[FY_UNIT_MAX_TENSORS];
        unsigned np = fy_optstate_piece(cp, u, k, &p, pt);
        uint8_t *ps = pieces + p.offset;
        const struct fy_optstate_layout *pl = &p.layout;
        for (unsigned i = 0; i < np; i++) {
            while (done[t] == wt[t].count)
                t++;
            assert_true(t < nt);
            uint64_t pos = done[t], n = pt[i].count;
            memcpy(ps + pl->section[FY_OPTSTATE_MASTER].offset + pt[i].begin * 4,
                   whole + (wt[t].begin + pos) * 4, n * 4);
            if (format != FY_OPTIM_STATE_INT8 || pt[i].quantized) {
                for (int mv = FY_OPTSTATE_ADAM_M; mv <= FY_OPTSTATE_ADAM_V; mv++)
                    memcpy(ps + pl->section[mv].offset + pt[i].at * size,
                           whole + wl.section[mv].offset + (wt[t].at + pos) * size, n * size);
            }
            if (format == FY_OPTIM_STATE_INT8 && pt[i].quantized) {
                uint64_t blocks = (n + 255) / 256;
                for (int mv = 0; mv < 2; mv++)
                    memcpy(ps + pl->section[FY_OPTSTATE_ABSMAX].offset +
                               (mv * pl->blocks + pt[i].block) * 4,
                           whole + wl.section[FY_OPTSTATE_ABSMAX].offset +
                               (mv * wl.blocks + wt[t].block + pos / 256) * 4,
                           blocks * 4);
            } else if (format == FY_OPTIM_STATE_INT8) {
                for (int mv = 0; mv < 2; mv++)
                    memcpy(ps + pl->section[FY_OPTSTATE_SMALL].offset +
                               (mv * pl->small + pt[i].at) * 4,
                           whole + wl.section[FY_OPTSTATE_SMALL].offset +
                               (mv * wl.small + wt[t].at + pos) * 4,
                           n * 4);
            }
            done[t] += n;
        }
    }
}

/* A STATE request for unit u at `state` (its pieces all), gradient at 0, the bf16 copy at `copy`
 * (0: none); returns the parts. */
static unsigned state_request_of(struct fx *f, const struct fy_model_config *cp, unsigned u,
                                 uint64_t state, uint64_t copy, struct fy_desc *req)
{
    size_t n = fy_model_unit_params(cp, u);
    unsigned k = 0;
    req[k++] = fy_desc_region(FY_OP_OPT_ADAMW, FY_KIND_GRAD, FY_DTYPE_F32, f->base, n * 4, (int)u);
    req[k++] = fy_desc_region(FY_OP_OPT_ADAMW, FY_KIND_STATE, FY_DTYPE_NONE, f->base + state,
                              fy_optstate_bytes(cp, u), (int)u);
    if (copy != 0)
        req[k++] = fy_desc_region(FY_OP_OPT_ADAMW, FY_KIND_WEIGHTS, FY_DTYPE_BF16, f->base + copy,
                                  n * 2, (int)u);
    for (unsigned i = 0; i < k; i++)
        req[i].step = 3;
    req[1].arg = double_arg(2e-3);
    req[0].arg = double_arg(0.5); /* a clipping scale */
    return k;
}

/* Every unit of the width-64 model, fp32, bf16 and int8, in pieces of 16 KiB: the one-piece
 * update, the STATE update and the update piece by piece give the same bits; the masters
 * converted from the pieces give the one piece's weights (bf16 and f32). */
static void test_adamw_pieces(void **state)
{
    struct fx *f = *state;
    for (int format = 0; format < FY_OPTIM_STATE_COUNT; format++) {
        struct fy_model_config c = model_of(64, format), cp = c;
        cp.state_piece = 16384;
        struct fy_optstep *one = new_optstep(&c), *cut = new_optstep(&cp);
        unsigned cut_units = 0;
        for (unsigned u = 0; u < fy_model_unit_count(&c); u++) {
            struct hand_layout h = hand_layout(&c, u);
            uint64_t P = h.params, bytes = fy_optstate_bytes(&cp, u);
            unsigned pieces = fy_optstate_piece_count(&cp, u);
            cut_units += pieces > 1;
            /* the test region: gradient, one-piece state, pieces (STATE), pieces (one by one),
             * three bf16 copies */
            const uint64_t s1 = up4k(P * 4), s2 = s1 + up4k(h.bytes), s3 = s2 + up4k(bytes);
            const uint64_t w1 = s3 + up4k(bytes), w2 = w1 + up4k(P * 2), w3 = w2 + up4k(P * 2);
            assert_true(w3 + up4k(P * 4) <= REGION_BYTES);
            if (format == FY_OPTIM_STATE_FP32) { /* fill_unit does bf16 and int8 */
                fill(at(f, 0, P * 4), P, 90 + u, -0.1f, 0.1f);
                float *st = at(f, s1, h.bytes);
                memset(st, 0, h.bytes);
                fill(st, P, 91 + u, -1.0f, 1.0f);
                fill(st + h.m / 4, P, 92 + u, -0.01f, 0.01f);
                fill(st + h.v / 4, P, 93 + u, 0.0f, 1e-4f);
            } else {
                fill_unit(f, &c, &h, s1, 90 + u);
            }
            relayout(&c, &cp, u, at(f, s1, h.bytes), at(f, s2, bytes));
            memcpy(at(f, s3, bytes), at(f, s2, bytes), bytes);
            struct fy_desc req[8], reply;
            /* one piece, with a bf16 copy */
            unsigned n = unit_request(f, &c, u, s1, 3, 2e-3, req);
            req[0].arg = double_arg(0.5);
            req[n++] = fy_desc_region(FY_OP_OPT_ADAMW, FY_KIND_WEIGHTS, FY_DTYPE_BF16, f->base + w1,
                                      P * 2, (int)u);
            req[n - 1].step = 3;
            assert_int_equal(fy_optstep_handle(one, f->pool, req, n, &reply), 0);
            /* the pieces all */
            n = state_request_of(f, &cp, u, s2, w2, req);
            assert_int_equal(fy_optstep_handle(cut, f->pool, req, n, &reply), 0);
            /* piece by piece, in reverse order */
            for (unsigned k = pieces; k-- > 0;) {
                struct fy_optstate_piece p;
                fy_optstate_piece(&cp, u, k, &p, NULL);
                req[0] = fy_desc_region(FY_OP_OPT_ADAMW, FY_KIND_GRAD, FY_DTYPE_F32,
                                        f->base + p.begin * 4, p.params * 4, (int)u);
                req[0].arg = double_arg(0.5);
                unsigned m =
                    1 + fy_optstate_parts(&p.layout, f->base + s3 + p.offset, (int)u, req + 1);
                req[1].arg = double_arg(2e-3);
                req[1].tensor = k;
                req[m++] = fy_desc_region(FY_OP_OPT_ADAMW, FY_KIND_WEIGHTS, FY_DTYPE_BF16,
                                          f->base + w3 + p.begin * 2, p.params * 2, (int)u);
                for (unsigned i = 0; i < m; i++)
                    req[i].step = 3;
                assert_int_equal(fy_optstep_handle(cut, f->pool, req, m, &reply), 0);
            }
            uint8_t *want = malloc(bytes);
            relayout(&c, &cp, u, at(f, s1, h.bytes), want);
            assert_memory_equal(at(f, s2, bytes), want, bytes);
            assert_memory_equal(at(f, s3, bytes), want, bytes);
            assert_memory_equal(at(f, w2, P * 2), at(f, w1, P * 2), P * 2);
            assert_memory_equal(at(f, w3, P * 2), at(f, w1, P * 2), P * 2);
            /* the masters converted from the pieces: bf16, and f32 (copied) */
            for (int d = 0; d < 2; d++) {
                int dtype = d ? FY_DTYPE_F32 : FY_DTYPE_BF16;
                size_t size = fy_dtype_size(dtype);
                memset(at(f, w3, P * size), 0xab, P * size);
                struct fy_desc cv[2] = {fy_desc_region(FY_OP_OPT_CONVERT, FY_KIND_STATE,
                                                       FY_DTYPE_NONE, f->base + s2, bytes, (int)u),
                                        fy_desc_region(FY_OP_OPT_CONVERT, FY_KIND_WEIGHTS, dtype,
                                                       f->base + w3, P * size, (int)u)};
                assert_int_equal(fy_optstep_handle(cut, f->pool, cv, 2, &reply), 0);
                const float *master = at(f, s1, P * 4);
                if (d)
                    assert_memory_equal(at(f, w3, P * 4), master, P * 4);
                else
                    assert_memory_equal(at(f, w3, P * 2), at(f, w1, P * 2), P * 2);
            }
            /* refused, nothing written: a piece's request one value short, a STATE part one page
             * short, a STATE part beside a master part */
            memcpy(at(f, s3, bytes), want, bytes);
            n = state_request_of(f, &cp, u, s3, 0, req);
            req[1].bytes -= 4096;
            assert_int_equal(fy_optstep_handle(cut, f->pool, req, n, &reply), -EPROTO);
            req[1].bytes += 4096;
            req[n] = fy_desc_region(FY_OP_OPT_ADAMW, FY_KIND_MASTER, FY_DTYPE_F32, f->base + w3,
                                    P * 4, (int)u);
            assert_int_equal(fy_optstep_handle(cut, f->pool, req, n + 1, &reply), -EPROTO);
            if (pieces > 1) {
                struct fy_optstate_piece p;
                fy_optstate_piece(&cp, u, 1, &p, NULL);
                req[0] = fy_desc_region(FY_OP_OPT_ADAMW, FY_KIND_GRAD, FY_DTYPE_F32, f->base,
                                        p.params * 4, (int)u);
                unsigned m =
                    1 + fy_optstate_parts(&p.layout, f->base + s3 + p.offset, (int)u, req + 1);
                req[1].tensor = 0; /* piece 1's sections named as piece 0 */
                for (unsigned i = 0; i < m; i++)
                    req[i].step = 3;
                assert_int_equal(fy_optstep_handle(cut, f->pool, req, m, &reply), -EPROTO);
            }
            assert_memory_equal(at(f, s3, bytes), want, bytes);
            free(want);
        }
        assert_true(cut_units >= 2); /* the blocks at least */
        fy_optstep_destroy(&one);
        fy_optstep_destroy(&cut);
    }
}

/* int8 width 256 and fp32: the embeddings in pieces updated by two complementary row lists (the
 * schedule's split) equal the one-piece unit's whole update, laid out in pieces. */
static void test_adamw_pieces_rows(void **state)
{
    struct fx *f = *state;
    const int formats[] = {FY_OPTIM_STATE_INT8, FY_OPTIM_STATE_FP32};
    for (int k = 0; k < 2; k++) {
        struct fy_model_config c = model_of(256, formats[k]), cp = c;
        cp.state_piece = 16384;
        struct fy_optstep *one = new_optstep(&c), *cut = new_optstep(&cp);
        struct hand_layout h = hand_layout(&c, 0);
        uint64_t P = h.params, bytes = fy_optstate_bytes(&cp, 0), rows = c.vocab + c.ctx;
        assert_true(fy_optstate_piece_count(&cp, 0) > 2);
        const uint64_t s1 = up4k(P * 4), s2 = s1 + up4k(h.bytes), lists = s2 + up4k(bytes);
        if (formats[k] == FY_OPTIM_STATE_FP32) {
            fill(at(f, 0, P * 4), P, 7, -0.1f, 0.1f);
            float *st = at(f, s1, h.bytes);
            memset(st, 0, h.bytes);
            fill(st, 3 * P, 8, 0.0f, 1e-3f);
        } else {
            fill_unit(f, &c, &h, s1, 77);
        }
        relayout(&c, &cp, 0, at(f, s1, h.bytes), at(f, s2, bytes));
        struct fy_desc req[8], reply;
        unsigned n = unit_request(f, &c, 0, s1, 2, 1e-3, req);
        assert_int_equal(fy_optstep_handle(one, f->pool, req, n, &reply), 0);
        n = state_request_of(f, &cp, 0, s2, 0, req);
        req[0].arg = 0;
        req[1].arg = double_arg(1e-3);
        for (unsigned i = 0; i < n; i++)
            req[i].step = 2;
        req[n] =
            fy_desc_region(FY_OP_OPT_ADAMW, FY_KIND_TOKENS, FY_DTYPE_I32, f->base + lists, 0, 0);
        req[n].step = 2;
        req[n].arg = c.n_embd;
        int32_t *list = at(f, lists, rows * 4);
        for (int part = 0; part < 2; part++) {
            size_t count = 0;
            for (size_t r = 0; r < rows; r++)
                if ((r % 3 == 1) == part)
                    list[count++] = (int32_t)r;
            req[n].bytes = count * 4;
            assert_int_equal(fy_optstep_handle(cut, f->pool, req, n + 1, &reply), 0);
        }
        uint8_t *want = malloc(bytes);
        relayout(&c, &cp, 0, at(f, s1, h.bytes), want);
        assert_memory_equal(at(f, s2, bytes), want, bytes);
        /* a row past the unit's end: refused, nothing written */
        list[0] = 0;
        list[1] = (int32_t)rows;
        req[n].bytes = 8;
        assert_int_equal(fy_optstep_handle(cut, f->pool, req, n + 1, &reply), -EPROTO);
        assert_memory_equal(at(f, s2, bytes), want, bytes);
        free(want);
        fy_optstep_destroy(&one);
        fy_optstep_destroy(&cut);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sumsq, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sumsq_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_adamw_scale_and_lr, setup, teardown),
        cmocka_unit_test_setup_teardown(test_adamw_bad_scale_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_adamw_rows_in_two_parts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_adamw_unit_formats, setup, teardown),
        cmocka_unit_test_setup_teardown(test_adamw_int8_rows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_adamw_formats_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_convert, setup, teardown),
        cmocka_unit_test_setup_teardown(test_convert_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_adamw_pieces, setup, teardown),
        cmocka_unit_test_setup_teardown(test_adamw_pieces_rows, setup, teardown),
    };
    return cmocka_run_group_tests_name("optstep", tests, NULL, NULL);
}
