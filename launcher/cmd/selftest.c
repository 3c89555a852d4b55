/* The data-path self-test: SSD -> pool -> AdamW on gradients from the gpu worker -> SSD, driven
 * through descriptors exactly as training steps will be, with a timing line per step. */
#include "launcher/cmd/selftest.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/base/check.h"
#include "common/base/dtype.h"
#include "common/model/optstate.h"
#include "common/base/synth.h"

static uint64_t align4k(uint64_t v) { return (v + 4095) / 4096 * 4096; }

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void fy_selftest_layout(uint64_t params, int grad_dtype, struct fy_selftest_layout *out)
{
    /* a model unit's state layout (fp32), for `params` parameters */
    struct fy_optstate_layout st;
    fy_optstate_layout_params(params, FY_OPTIM_STATE_FP32, &st);
    out->params = params;
    out->m_offset = st.section[FY_OPTSTATE_ADAM_M].offset;
    out->v_offset = st.section[FY_OPTSTATE_ADAM_V].offset;
    out->state_bytes = st.bytes;
    out->grad_bytes = align4k(params * fy_dtype_size(grad_dtype));
    out->weights_bytes = align4k(params * 2);
}

void fy_selftest_regions(const struct fy_selftest_layout *l, struct fy_pool_region_spec out[3])
{
    out[0] = (struct fy_pool_region_spec){"state", l->state_bytes};
    out[1] = (struct fy_pool_region_spec){"grad", 2 * l->grad_bytes};
    out[2] = (struct fy_pool_region_spec){"weights", l->weights_bytes};
}

void fy_selftest_init_state(uint64_t seed, uint64_t params, float *master, float *m, float *v)
{
    for (uint64_t i = 0; i < params; i++) {
        master[i] = FY_SELFTEST_INIT_SCALE * fy_synth_value(seed, 0, FY_SELFTEST_TENSOR_STATE, i);
        m[i] = 0.0f;
        v[i] = 0.0f;
    }
}

static int io_transfer(struct fy_sup *s, int op, uint32_t tensor, uint64_t pool_offset,
                       uint64_t bytes, int timeout_ms)
{
    struct fy_desc d = fy_desc_region(op, FY_KIND_RAW, FY_DTYPE_NONE, pool_offset, bytes, -1);
    d.tensor = tensor;
    d.arg = 0;
    return fy_sup_call(s, "io", &d, 1, NULL, timeout_ms);
}

static int io_simple(struct fy_sup *s, int op, uint32_t tensor, uint64_t arg, int timeout_ms)
{
    struct fy_desc d = fy_desc_region(op, FY_KIND_CONTROL, FY_DTYPE_NONE, 0, 0, -1);
    d.tensor = tensor;
    d.arg = arg;
    return fy_sup_call(s, "io", &d, 1, NULL, timeout_ms);
}

/* The step's gradient into a grads slot (the gpu worker's synthetic one, *t_grad when it is in)
 * and AdamW over it and the state (the opt worker), which also writes the bf16 weights; the slot
 * free again after. */
static int grad_and_adamw(struct fy_sup *s, const struct fy_selftest_opts *o,
                          struct fy_slots *grads, uint64_t state_off, uint64_t weights_off,
                          unsigned step, double *t_grad)
{
    uint64_t grad_off = 0;
    FY_TRY(fy_slots_alloc(grads, &grad_off));
    struct fy_desc g = fy_desc_region(FY_OP_GPU_SYNTH_GRAD, FY_KIND_GRAD, o->grad_dtype, grad_off,
                                      o->params * fy_dtype_size(o->grad_dtype), -1);
    g.step = step;
    g.tensor = FY_SELFTEST_TENSOR_STATE;
    g.arg = o->seed;
    int rc;
    FY_TRY_OUT(rc, fy_sup_call(s, "gpu", &g, 1, NULL, o->timeout_ms));
    *t_grad = now_s();
    /* the gradient, the state's sections (a unit's layout), the bf16 weights */
    struct fy_desc parts[2 + FY_OPTSTATE_PARTS];
    struct fy_optstate_layout st;
    fy_optstate_layout_params(o->params, FY_OPTIM_STATE_FP32, &st);
    parts[0] = fy_desc_region(FY_OP_OPT_ADAMW, FY_KIND_GRAD, o->grad_dtype, grad_off,
                              o->params * fy_dtype_size(o->grad_dtype), -1);
    unsigned n = 1 + fy_optstate_parts(&st, state_off, -1, parts + 1);
    parts[n++] = fy_desc_region(FY_OP_OPT_ADAMW, FY_KIND_WEIGHTS, FY_DTYPE_BF16, weights_off,
                                o->params * 2, -1);
    for (unsigned i = 0; i < n; i++) {
        parts[i].step = step;
        parts[i].tensor = FY_SELFTEST_TENSOR_STATE;
    }
    FY_TRY_OUT(rc, fy_sup_call(s, "opt", parts, n, NULL, o->timeout_ms));
out:
    if (grad_off != 0 && fy_slots_free(grads, grad_off) < 0 && rc == 0)
        rc = -EINVAL;
    return rc;
}

/* One step of the round trip: the state read back from the SSD into a poisoned pool copy, a
 * gradient and AdamW over it, the state and weights written back and synced, the pool's guards
 * checked; its times said. */
static int selftest_step(struct fy_sup *s, struct fy_pool *pool, const struct fy_selftest_opts *o,
                         const struct fy_selftest_layout *l, struct fy_slots *grads,
                         uint64_t state_off, uint64_t weights_off, unsigned step)
{
    int t = o->timeout_ms;
    double t0 = now_s();
    /* Poison the pool copy so the step can only succeed on state that came back from the SSD. */
    memset(fy_pool_at(pool, state_off, l->state_bytes), 0xff, l->state_bytes);
    FY_TRY(io_transfer(s, FY_OP_IO_READ, FY_SELFTEST_TENSOR_STATE, state_off, l->state_bytes, t));
    double t1 = now_s(), t2 = t1;
    FY_TRY(grad_and_adamw(s, o, grads, state_off, weights_off, step, &t2));
    double t3 = now_s();
    FY_TRY(io_transfer(s, FY_OP_IO_WRITE, FY_SELFTEST_TENSOR_STATE, state_off, l->state_bytes, t));
    FY_TRY(io_transfer(s, FY_OP_IO_WRITE, FY_SELFTEST_TENSOR_WEIGHTS, weights_off, l->weights_bytes,
                       t));
    FY_TRY(io_simple(s, FY_OP_IO_SYNC, 0, 0, t));
    double t4 = now_s();
    FY_TRY(fy_pool_check_guards(pool));
    fy_info("step %u/%u: read %.1f ms (%.2f GB/s), grad %.1f ms, adamw %.1f ms "
            "(%.2f G params/s), write+sync %.1f ms",
            step, o->steps, 1e3 * (t1 - t0), (double)l->state_bytes / (t1 - t0) / 1e9,
            1e3 * (t2 - t1), 1e3 * (t3 - t2), (double)o->params / (t3 - t2) / 1e9, 1e3 * (t4 - t3));
    return 0;
}

int fy_selftest_run(struct fy_sup *s, struct fy_pool *pool, const struct fy_selftest_opts *o)
{
    struct fy_selftest_layout l;
    fy_selftest_layout(o->params, o->grad_dtype, &l);
    uint64_t state_off, weights_off, bytes;
    FY_TRY(fy_pool_region(pool, "state", &state_off, &bytes));
    FY_TRY(fy_pool_region(pool, "weights", &weights_off, &bytes));
    struct fy_slots grads;
    FY_TRY(fy_slots_init(&grads, pool, "grad", l.grad_bytes));
    uint8_t *state = fy_pool_at(pool, state_off, l.state_bytes);
    int t = o->timeout_ms, rc;
    FY_TRY_OUT(rc, io_simple(s, FY_OP_IO_ALLOC, FY_SELFTEST_TENSOR_STATE, l.state_bytes, t));
    FY_TRY_OUT(rc, io_simple(s, FY_OP_IO_ALLOC, FY_SELFTEST_TENSOR_WEIGHTS, l.weights_bytes, t));
    fy_selftest_init_state(o->seed, o->params, (float *)state, (float *)(state + l.m_offset),
                           (float *)(state + l.v_offset));
    FY_TRY_OUT(
        rc, io_transfer(s, FY_OP_IO_WRITE, FY_SELFTEST_TENSOR_STATE, state_off, l.state_bytes, t));
    FY_TRY_OUT(rc, io_simple(s, FY_OP_IO_SYNC, 0, 0, t));
    for (unsigned step = 1; step <= o->steps; step++)
        FY_TRY_OUT(rc, selftest_step(s, pool, o, &l, &grads, state_off, weights_off, step));
    fy_info("selftest passed: %u steps over %llu parameters", o->steps,
            (unsigned long long)o->params);
out:
    fy_slots_destroy(&grads);
    return rc;
}
