/* Tests of the optimizer's request handler (opt_worker/optstep) on a real pool: opt-sumsq gives the
 * sum of squares of a gradient region bit for bit as fy_adamw_sumsq does, checks the unit's size and
 * writes nothing; opt-adamw takes its learning rate from the master part and clipping's gradient
 * scale from the grad part, equal bit for bit to the kernel called directly; malformed requests
 * (wrong parts, a bad scale) are refused with -EPROTO before anything is written. */
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

#include "common/config.h"
#include "common/desc.h"
#include "common/dtype.h"
#include "common/model.h"
#include "common/pool.h"
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
    struct fy_config *cfg = calloc(1, sizeof *cfg);
    assert_non_null(cfg);
    fy_config_init(cfg);
    assert_int_equal(fy_config_setf(cfg, "lr", "%.9g", (double)HP.lr), 0);
    assert_int_equal(fy_config_setf(cfg, "beta1", "%.9g", (double)HP.beta1), 0);
    assert_int_equal(fy_config_setf(cfg, "beta2", "%.9g", (double)HP.beta2), 0);
    assert_int_equal(fy_config_setf(cfg, "eps", "%.9g", (double)HP.eps), 0);
    assert_int_equal(fy_config_setf(cfg, "weight_decay", "%.9g", (double)HP.weight_decay), 0);
    assert_int_equal(fy_config_set(cfg, "opt_threads", "2"), 0);
    assert_int_equal(fy_model_config_to(&MODEL, cfg), 0);
    assert_int_equal(fy_optstep_new(&f->opt, cfg, "0"), 0);
    free(cfg);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sumsq, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sumsq_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_adamw_scale_and_lr, setup, teardown),
        cmocka_unit_test_setup_teardown(test_adamw_bad_scale_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_adamw_rows_in_two_parts, setup, teardown),
    };
    return cmocka_run_group_tests_name("optstep", tests, NULL, NULL);
}
