/* The training schedule over an executor: store initialisation, serial layer-major training steps
 * with per-unit version checks, evaluation, metrics lines and export. */
#include "train.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/check.h"
#include "common/dtype.h"

enum { PH_IO, PH_GPU, PH_OPT, PH_COUNT };

/* Where everything lives in the pool. */
struct layout {
    const struct fy_gpt_config *c;
    int B, T;
    uint64_t act_bytes, tok_bytes;
    uint64_t meta, tokens, targets;
    uint64_t acts, dacts, weights, grads, state;
    uint64_t slot_bytes; /* one unit's f32 parameters, 4 KiB padded */
};

struct run {
    const struct fy_exec *x;
    struct fy_pool *pool;
    struct layout l;
    int timeout_ms;
    double phase_s[PH_COUNT];
};

static uint64_t align4k(uint64_t v) { return (v + 4095) / 4096 * 4096; }

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t max_unit_bytes(const struct fy_gpt_config *c)
{
    uint64_t m = 0;
    for (unsigned u = 0; u < fy_gpt_unit_count(c); u++)
        if (fy_unit_state_section(c, u) > m)
            m = fy_unit_state_section(c, u);
    return m;
}

void fy_train_regions(const struct fy_gpt_config *c, int B, int T,
                      struct fy_pool_region_spec out[8], unsigned *n)
{
    uint64_t act = align4k((uint64_t)B * T * c->n_embd * 4), tok = align4k((uint64_t)B * T * 4);
    uint64_t slot = max_unit_bytes(c);
    unsigned i = 0;
    out[i++] = (struct fy_pool_region_spec){"meta", FY_CKPT_BLOCK};
    out[i++] = (struct fy_pool_region_spec){"tokens", 2 * tok};
    out[i++] = (struct fy_pool_region_spec){"acts", (c->n_layer + 1) * act};
    out[i++] = (struct fy_pool_region_spec){"dacts", 2 * act};
    out[i++] = (struct fy_pool_region_spec){"weights", 2 * slot};
    out[i++] = (struct fy_pool_region_spec){"grads", 2 * slot};
    out[i++] = (struct fy_pool_region_spec){"state", 3 * slot};
    *n = i;
}

static int layout_from_pool(const struct fy_pool *p, const struct fy_gpt_config *c, int B, int T,
                            struct layout *l)
{
    uint64_t bytes;
    memset(l, 0, sizeof *l);
    l->c = c;
    l->B = B;
    l->T = T;
    l->act_bytes = (uint64_t)B * T * c->n_embd * 4;
    l->tok_bytes = (uint64_t)B * T * 4;
    l->slot_bytes = max_unit_bytes(c);
    FY_TRY(fy_pool_region(p, "meta", &l->meta, &bytes));
    FY_TRY(fy_pool_region(p, "tokens", &l->tokens, &bytes));
    l->targets = l->tokens + align4k(l->tok_bytes);
    FY_REQUIRE(bytes >= 2 * align4k(l->tok_bytes), -EINVAL, "pool too small for batch %d x %d", B, T);
    FY_TRY(fy_pool_region(p, "acts", &l->acts, &bytes));
    FY_REQUIRE(bytes >= (c->n_layer + 1) * align4k(l->act_bytes), -EINVAL,
               "pool too small for batch %d x %d", B, T);
    FY_TRY(fy_pool_region(p, "dacts", &l->dacts, &bytes));
    FY_TRY(fy_pool_region(p, "weights", &l->weights, &bytes));
    FY_TRY(fy_pool_region(p, "grads", &l->grads, &bytes));
    FY_TRY(fy_pool_region(p, "state", &l->state, &bytes));
    return 0;
}

static uint64_t act_at(const struct layout *l, unsigned i) { return l->acts + i * align4k(l->act_bytes); }
static uint64_t dact_at(const struct layout *l, unsigned i) { return l->dacts + i * align4k(l->act_bytes); }
static uint64_t wslot(const struct layout *l, unsigned i) { return l->weights + i * l->slot_bytes; }
static uint64_t gslot(const struct layout *l, unsigned i) { return l->grads + i * l->slot_bytes; }
static uint64_t unit_bytes(const struct layout *l, unsigned u) { return fy_gpt_unit_params(l->c, u) * 4; }


static int call(struct run *r, int phase, const char *worker, struct fy_desc *req, unsigned n,
                struct fy_desc *reply)
{
    double t0 = now_s();
    int rc = r->x->call(r->x->ctx, worker, req, n, reply, r->timeout_ms);
    r->phase_s[phase] += now_s() - t0;
    return rc;
}

static int io_op(struct run *r, int op, uint32_t tensor, uint64_t pool_offset, uint64_t bytes,
                 uint64_t arg)
{
    struct fy_desc d = fy_desc_region(op, bytes ? FY_KIND_RAW : FY_KIND_CONTROL, FY_DTYPE_NONE, pool_offset,
                            bytes, -1);
    d.tensor = tensor;
    d.arg = arg;
    return call(r, PH_IO, "io", &d, 1, NULL);
}

/* The master weights of a unit into a weights slot (the CPU backend computes in fp32). */
static int read_weights(struct run *r, unsigned unit, unsigned slot)
{
    return io_op(r, FY_OP_IO_READ, FY_TENSOR_UNIT_STATE(unit), wslot(&r->l, slot),
                 fy_unit_state_section(r->l.c, unit), 0);
}

static int write_meta(struct run *r, const struct fy_storemeta *m)
{
    fy_storemeta_encode(m, fy_pool_at(r->pool, r->l.meta, FY_CKPT_BLOCK));
    return io_op(r, FY_OP_IO_WRITE, FY_TENSOR_META, r->l.meta, FY_CKPT_BLOCK, 0);
}

static int run_init(struct run *r, struct fy_pool *pool, const struct fy_gpt_config *c, int B, int T,
                    const struct fy_exec *x, int timeout_ms)
{
    memset(r, 0, sizeof *r);
    r->x = x;
    r->pool = pool;
    r->timeout_ms = timeout_ms;
    return layout_from_pool(pool, c, B, T, &r->l);
}

int fy_train_init_store(const struct fy_exec *x, struct fy_pool *pool, const struct fy_gpt_config *c,
                        uint64_t seed, int timeout_ms)
{
    struct run r;
    FY_TRY(run_init(&r, pool, c, 1, 1, x, timeout_ms));
    FY_TRY(io_op(&r, FY_OP_IO_ALLOC, FY_TENSOR_META, 0, 0, FY_CKPT_BLOCK));
    for (unsigned u = 0; u < fy_gpt_unit_count(c); u++) {
        uint64_t sec = fy_unit_state_section(c, u);
        FY_TRY(io_op(&r, FY_OP_IO_ALLOC, FY_TENSOR_UNIT_STATE(u), 0, 0, 3 * sec));
        uint8_t *state = fy_pool_at(pool, r.l.state, 3 * sec);
        memset(state, 0, 3 * sec);
        fy_gpt_init_unit(c, u, seed, (float *)state);
        FY_TRY(io_op(&r, FY_OP_IO_WRITE, FY_TENSOR_UNIT_STATE(u), r.l.state, 3 * sec, 0));
    }
    struct fy_storemeta m = {.model = *c, .step = 0, .seed = seed};
    FY_TRY(write_meta(&r, &m));
    return io_op(&r, FY_OP_IO_SYNC, 0, 0, 0, 0);
}

int fy_train_read_meta(const struct fy_exec *x, struct fy_pool *pool, const char *where,
                       struct fy_storemeta *meta, int timeout_ms)
{
    uint64_t off, bytes;
    FY_TRY(fy_pool_region(pool, "meta", &off, &bytes));
    struct fy_desc d = fy_desc_region(FY_OP_IO_READ, FY_KIND_RAW, FY_DTYPE_NONE, off, FY_CKPT_BLOCK, -1);
    d.tensor = FY_TENSOR_META;
    int rc = x->call(x->ctx, "io", &d, 1, NULL, timeout_ms);
    if (rc < 0) {
        fy_error("%s: cannot read the model metadata (%s): is it a store made by fuyou-launch init?",
                 where, strerror(-rc));
        return rc;
    }
    return fy_storemeta_decode(fy_pool_at(pool, off, FY_CKPT_BLOCK), where, meta);
}

double fy_train_lr(const struct fy_train_opts *o, uint64_t step)
{
    if (o->warmup > 0 && step <= o->warmup)
        return o->lr * (double)step / (double)o->warmup;
    double min_lr = o->lr * o->min_lr_ratio;
    if (o->steps <= o->warmup)
        return o->lr;
    double progress = (double)(step - o->warmup) / (double)(o->steps - o->warmup);
    if (progress > 1.0)
        progress = 1.0;
    return min_lr + (o->lr - min_lr) * 0.5 * (1.0 + cos(3.141592653589793 * progress));
}

/* Forward through every unit; with `train`, also the head's backward into dacts[0] and the grads. */
static int forward(struct run *r, int train, uint64_t step, const uint64_t *version, double *loss)
{
    const struct layout *l = &r->l;
    const struct fy_gpt_config *c = l->c;
    unsigned L = c->n_layer, fin = L + 1;
    struct fy_desc req[7], reply;
    for (unsigned u = 0; u <= fin; u++)
        FY_REQUIRE(!train || version[u] == step - 1, -EPROTO,
                   "schedule error: unit %u holds step %llu's weights, step %llu needs step %llu's", u,
                   (unsigned long long)version[u], (unsigned long long)step,
                   (unsigned long long)(step - 1));
    /* slot 0 keeps the embeddings until the tied head has used them */
    FY_TRY(read_weights(r, 0, 0));
    req[0] = fy_desc_region(FY_OP_GPT_EMBED_FWD, FY_KIND_TOKENS, FY_DTYPE_I32, l->tokens, l->tok_bytes, 0);
    req[1] = fy_desc_region(FY_OP_GPT_EMBED_FWD, FY_KIND_WEIGHTS, FY_DTYPE_F32, wslot(l, 0), unit_bytes(l, 0), 0);
    req[2] = fy_desc_region(FY_OP_GPT_EMBED_FWD, FY_KIND_ACTIVATION, FY_DTYPE_F32, act_at(l, 0), l->act_bytes, 0);
    FY_TRY(call(r, PH_GPU, "gpu", req, 3, NULL));
    for (unsigned b = 1; b <= L; b++) {
        FY_TRY(read_weights(r, b, 1));
        int op = FY_OP_GPT_BLOCK_FWD;
        req[0] = fy_desc_region(op, FY_KIND_WEIGHTS, FY_DTYPE_F32, wslot(l, 1), unit_bytes(l, b), (int)b);
        req[1] = fy_desc_region(op, FY_KIND_ACTIVATION, FY_DTYPE_F32, act_at(l, b - 1), l->act_bytes, (int)b);
        req[2] = fy_desc_region(op, FY_KIND_ACTIVATION, FY_DTYPE_F32, act_at(l, b), l->act_bytes, (int)b);
        FY_TRY(call(r, PH_GPU, "gpu", req, 3, NULL));
    }
    FY_TRY(read_weights(r, fin, 1));
    int op = FY_OP_GPT_HEAD, f = (int)fin;
    req[0] = fy_desc_region(op, FY_KIND_ACTIVATION, FY_DTYPE_F32, act_at(l, L), l->act_bytes, f);
    req[1] = fy_desc_region(op, FY_KIND_TOKENS, FY_DTYPE_I32, l->targets, l->tok_bytes, f);
    req[2] = fy_desc_region(op, FY_KIND_WEIGHTS, FY_DTYPE_F32, wslot(l, 1), unit_bytes(l, fin), f);
    req[3] = fy_desc_region(op, FY_KIND_WEIGHTS, FY_DTYPE_F32, wslot(l, 0), unit_bytes(l, 0), f);
    req[4] = fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, dact_at(l, 0), l->act_bytes, f);
    req[5] = fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, gslot(l, 1), unit_bytes(l, fin), f);
    req[6] = fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, gslot(l, 0), unit_bytes(l, 0), f);
    FY_TRY(call(r, PH_GPU, "gpu", req, train ? 7 : 4, &reply));
    memcpy(loss, &reply.arg, sizeof *loss);
    FY_REQUIRE(isfinite(*loss), -EDOM, "step %llu: the loss is %g: lower the learning rate",
               (unsigned long long)step, *loss);
    return 0;
}

/* AdamW on unit u with the gradient in grads slot g: state in from the store, update, state out. */
static int update_unit(struct run *r, unsigned u, unsigned g, uint64_t step, double lr)
{
    const struct layout *l = &r->l;
    uint64_t sec = fy_unit_state_section(l->c, u), n = unit_bytes(l, u);
    FY_TRY(io_op(r, FY_OP_IO_READ, FY_TENSOR_UNIT_STATE(u), l->state, 3 * sec, 0));
    int op = FY_OP_OPT_ADAMW;
    struct fy_desc req[4] = {
        fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, gslot(l, g), n, (int)u),
        fy_desc_region(op, FY_KIND_MASTER, FY_DTYPE_F32, l->state, n, (int)u),
        fy_desc_region(op, FY_KIND_ADAM_M, FY_DTYPE_F32, l->state + sec, n, (int)u),
        fy_desc_region(op, FY_KIND_ADAM_V, FY_DTYPE_F32, l->state + 2 * sec, n, (int)u),
    };
    for (int i = 0; i < 4; i++) {
        req[i].step = step;
        memcpy(&req[i].arg, &lr, sizeof lr);
    }
    FY_TRY(call(r, PH_OPT, "opt", req, 4, NULL));
    return io_op(r, FY_OP_IO_WRITE, FY_TENSOR_UNIT_STATE(u), l->state, 3 * sec, 0);
}

static int backward_and_update(struct run *r, uint64_t step, double lr, uint64_t *version)
{
    const struct layout *l = &r->l;
    unsigned L = l->c->n_layer, fin = L + 1;
    FY_TRY(update_unit(r, fin, 1, step, lr));
    version[fin] = step;
    unsigned cur = 0; /* dacts[cur] holds dL/d(output of the unit being processed) */
    struct fy_desc req[5];
    for (unsigned b = L; b >= 1; b--) {
        FY_TRY(read_weights(r, b, 1));
        int op = FY_OP_GPT_BLOCK_BWD;
        req[0] = fy_desc_region(op, FY_KIND_WEIGHTS, FY_DTYPE_F32, wslot(l, 1), unit_bytes(l, b), (int)b);
        req[1] = fy_desc_region(op, FY_KIND_ACTIVATION, FY_DTYPE_F32, act_at(l, b - 1), l->act_bytes, (int)b);
        req[2] = fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, dact_at(l, cur), l->act_bytes, (int)b);
        req[3] = fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, dact_at(l, cur ^ 1), l->act_bytes, (int)b);
        req[4] = fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, gslot(l, 1), unit_bytes(l, b), (int)b);
        FY_TRY(call(r, PH_GPU, "gpu", req, 5, NULL));
        cur ^= 1;
        FY_TRY(update_unit(r, b, 1, step, lr));
        version[b] = step;
    }
    int op = FY_OP_GPT_EMBED_BWD;
    req[0] = fy_desc_region(op, FY_KIND_TOKENS, FY_DTYPE_I32, l->tokens, l->tok_bytes, 0);
    req[1] = fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, dact_at(l, cur), l->act_bytes, 0);
    req[2] = fy_desc_region(op, FY_KIND_GRAD, FY_DTYPE_F32, gslot(l, 0), unit_bytes(l, 0), 0);
    FY_TRY(call(r, PH_GPU, "gpu", req, 3, NULL));
    FY_TRY(update_unit(r, 0, 0, step, lr));
    version[0] = step;
    return 0;
}

static int load_batch(struct run *r, const struct fy_tokfile *data, int split, uint64_t seed,
                      uint64_t index)
{
    int32_t *in = fy_pool_at(r->pool, r->l.tokens, r->l.tok_bytes);
    int32_t *tg = fy_pool_at(r->pool, r->l.targets, r->l.tok_bytes);
    if (split == FY_TOKFILE_EVAL)
        return fy_tokfile_eval_batch(data, index, r->l.B, r->l.T, in, tg);
    return fy_tokfile_batch(data, FY_TOKFILE_TRAIN, seed, index, r->l.B, r->l.T, in, tg);
}

static int eval_loss(struct run *r, const struct fy_tokfile *data, uint64_t batches, double *loss)
{
    double sum = 0;
    for (uint64_t k = 0; k < batches; k++) {
        double one;
        FY_TRY(load_batch(r, data, FY_TOKFILE_EVAL, 0, k));
        FY_TRY(forward(r, 0, 0, NULL, &one));
        sum += one;
    }
    *loss = sum / (double)batches;
    return 0;
}

int fy_train_eval(const struct fy_exec *x, struct fy_pool *pool, const struct fy_gpt_config *c,
                  const struct fy_tokfile *data, int B, int T, uint64_t batches, int timeout_ms,
                  double *loss)
{
    struct run r;
    FY_TRY(run_init(&r, pool, c, B, T, x, timeout_ms));
    return eval_loss(&r, data, batches, loss);
}

static void log_step(const struct fy_train_opts *o, const struct fy_gpt_config *c, uint64_t step,
                     double loss, double lr, double seconds, const double *phase, int have_eval,
                     double eval)
{
    double tokens = (double)o->batch * o->seq;
    double tps = tokens / seconds;
    double tflops = tps * fy_gpt_flops_per_token(c, (unsigned)o->seq) / 1e12;
    char ev[48] = "";
    if (have_eval)
        snprintf(ev, sizeof ev, " | eval %.4f", eval);
    fy_info("step %llu/%llu | loss %.4f%s | lr %.2e | %.0f tok/s | %.4f TFLOP/s | %.0f ms (io %.0f, "
            "gpu %.0f, opt %.0f)",
            (unsigned long long)step, (unsigned long long)o->steps, loss, ev, lr, tps, tflops,
            1e3 * seconds, 1e3 * phase[PH_IO], 1e3 * phase[PH_GPU], 1e3 * phase[PH_OPT]);
    if (o->metrics == NULL)
        return;
    fprintf(o->metrics,
            "{\"step\": %llu, \"loss\": %.9g, \"lr\": %.9g, \"tokens_per_s\": %.1f, \"tflops\": %.6f, "
            "\"step_s\": %.6f, \"io_s\": %.6f, \"gpu_s\": %.6f, \"opt_s\": %.6f",
            (unsigned long long)step, loss, lr, tps, tflops, seconds, phase[PH_IO], phase[PH_GPU],
            phase[PH_OPT]);
    if (have_eval)
        fprintf(o->metrics, ", \"eval_loss\": %.9g", eval);
    fprintf(o->metrics, "}\n");
    fflush(o->metrics);
}

int fy_train_run(const struct fy_exec *x, struct fy_pool *pool, struct fy_storemeta *meta,
                 const struct fy_tokfile *data, const struct fy_train_opts *o)
{
    struct run r;
    FY_TRY(run_init(&r, pool, &meta->model, o->batch, o->seq, x, o->timeout_ms));
    unsigned units = fy_gpt_unit_count(&meta->model);
    uint64_t *version = calloc(units, sizeof *version);
    if (version == NULL)
        return -ENOMEM;
    for (unsigned u = 0; u < units; u++)
        version[u] = meta->step;
    int rc = 0;
    if (meta->step >= o->steps)
        fy_info("the store is already at step %llu (--steps %llu): nothing to train",
                (unsigned long long)meta->step, (unsigned long long)o->steps);
    for (uint64_t step = meta->step + 1; rc == 0 && step <= o->steps; step++) {
        if (o->stop != NULL && *o->stop) {
            fy_warn("stopping at the step boundary before step %llu", (unsigned long long)step);
            break;
        }
        double t0 = now_s(), loss = 0, lr = fy_train_lr(o, step), eval = 0;
        memset(r.phase_s, 0, sizeof r.phase_s);
        rc = load_batch(&r, data, FY_TOKFILE_TRAIN, o->seed, step);
        if (rc == 0)
            rc = forward(&r, 1, step, version, &loss);
        if (rc == 0)
            rc = backward_and_update(&r, step, lr, version);
        if (rc == 0) {
            meta->step = step;
            rc = write_meta(&r, meta);
        }
        int durable = step == o->steps || (o->checkpoint_every && step % o->checkpoint_every == 0);
        if (rc == 0 && durable)
            rc = io_op(&r, FY_OP_IO_SYNC, 0, 0, 0, 0);
        double seconds = now_s() - t0;
        double phase[PH_COUNT];
        memcpy(phase, r.phase_s, sizeof phase);
        int do_eval = rc == 0 && (step == o->steps || (o->eval_every && step % o->eval_every == 0));
        if (do_eval && o->eval_batches > 0)
            rc = eval_loss(&r, data, o->eval_batches, &eval);
        if (rc == 0)
            log_step(o, &meta->model, step, loss, lr, seconds, phase, do_eval && o->eval_batches > 0,
                     eval);
    }
    free(version);
    return rc;
}

struct export_ctx {
    struct run *r;
};

static int export_unit(void *ctx, unsigned unit, float *params)
{
    struct run *r = ((struct export_ctx *)ctx)->r;
    FY_TRY(read_weights(r, unit, 0));
    memcpy(params, fy_pool_at(r->pool, wslot(&r->l, 0), unit_bytes(&r->l, unit)),
           unit_bytes(&r->l, unit));
    return 0;
}

int fy_train_export(const struct fy_exec *x, struct fy_pool *pool, const struct fy_storemeta *meta,
                    const char *path, int overwrite, int timeout_ms)
{
    struct run r;
    FY_TRY(run_init(&r, pool, &meta->model, 1, 1, x, timeout_ms));
    struct export_ctx ctx = {&r};
    return fy_weights_write(path, &meta->model, meta->step, overwrite, export_unit, &ctx);
}
