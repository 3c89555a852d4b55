/* The CPU backend of the gpu worker: computes directly in host memory (so registering the pool is a
 * no-op), through the table of fp32 OpenMP operations of the model's family (cpu_family.h; one file
 * per family, listed once below), with private scratch sized per batch; bf16 weights are widened
 * into scratch of their own first. Nothing here knows a family: what one lacks is refused by its
 * label, from its table. */
#include "cpu_backend.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/model/arch/arch.h"
#include "common/base/check.h"
#include "common/ipc/desc.h"
#include "common/base/dtype.h"
#include "common/base/knobs.h"
#include "common/base/synth.h"
#include "gpu_worker/cpu/cpu_family.h"
#include "gpu_worker/cpu/cpu_gpt2.h"
#include "gpu_worker/cpu/cpu_llama.h"

/* The families the CPU backend computes, one line each: the registry name and the operations. The
 * Llama-like families only vary fields of fy_llama(c), which cpu_llama.c computes. */
static const struct cpu_family_entry {
    const char *name; /* struct fy_arch's name */
    const struct fy_cpu_family *ops;
} cpu_families[] = {
    {"gpt2", &fy_cpu_gpt2_family},     {"llama", &fy_cpu_llama_family},
    {"qwen2", &fy_cpu_llama_family},   {"qwen3", &fy_cpu_llama_family},
    {"mistral", &fy_cpu_llama_family}, {"phi3", &fy_cpu_llama_family},
};

struct cpu_state {
    struct fy_model_config cfg;
    const struct fy_cpu_family *fam; /* cfg's family's operations */
    int B, T;
    float *block_scratch;
    float *head_scratch;
    /* model_weights_bf16: weights arrive as bf16 and are widened into wide[0] (a unit's) and
     * wide[1] (the tied head's embeddings), of wide_n floats each so far */
    int weights_bf16;
    float *wide[2];
    size_t wide_n[2];
    /* model_hold: `holds` block gradients in `held` (this process's memory stands for the
     * device's); hold_next, the one the next block backward also writes (-1: none) */
    float *held;
    int holds, hold_next;
    uint64_t loss_count; /* model_loss_count: the whole batch's targets (0: the call's own) */
};

static int cpu_open(void **state, uint64_t gpu_mem, char *device, size_t device_len)
{
    struct cpu_state *s = calloc(1, sizeof *s);
    if (s == NULL)
        return -ENOMEM;
    s->hold_next = -1;
    snprintf(device, device_len, "CPU (%ld online cores)", sysconf(_SC_NPROCESSORS_ONLN));
    *state = s;
    return 0;
}

static void cpu_destroy(void **state)
{
    struct cpu_state *s = *state;
    if (s == NULL)
        return;
    free(s->block_scratch);
    free(s->head_scratch);
    free(s->wide[0]);
    free(s->wide[1]);
    free(s->held);
    free(s);
    *state = NULL;
}

static int cpu_register_host(void *state, void *base, size_t len) { return 0; }
static int cpu_unregister_host(void *state, void *base) { return 0; }

static int cpu_synth(void *state, uint64_t seed, uint64_t step, uint32_t tensor, int dtype,
                     size_t n, void *out)
{
    if (dtype == FY_DTYPE_F32) {
        float *o = out;
        for (size_t i = 0; i < n; i++)
            o[i] = fy_synth_value(seed, step, tensor, i);
        return 0;
    }
    FY_REQUIRE(dtype == FY_DTYPE_BF16, -EINVAL, "synthetic tensor: dtype %s not supported",
               fy_dtype_name(dtype));
    uint16_t *o = out;
    for (size_t i = 0; i < n; i++)
        o[i] = fy_f32_to_bf16(fy_synth_value(seed, step, tensor, i));
    return 0;
}

/* The family's operations, by the registry's name of c's family; NULL (said) when there are none. */
static const struct fy_cpu_family *cpu_family_of(const struct fy_model_config *c)
{
    const struct fy_arch *a = fy_model_arch(c);
    for (size_t i = 0; i < sizeof cpu_families / sizeof cpu_families[0]; i++)
        if (strcmp(cpu_families[i].name, a->name) == 0)
            return cpu_families[i].ops;
    fy_error("the CPU backend has no operations for %s models: a model family needs its file in "
             "gpu_worker/cpu/ and its line in cpu_backend.c's list", a->label);
    return NULL;
}

static int cpu_model_prepare(void *state, const struct fy_model_config *c, int B, int T)
{
    struct cpu_state *s = state;
    FY_REQUIRE(B >= 1 && T >= 1 && (uint32_t)T <= c->ctx, -EINVAL,
               "batch %d x %d: need B >= 1 and 1 <= T <= context %u", B, T, c->ctx);
    FY_TRY(fy_model_config_validate(c));
    const struct fy_cpu_family *fam = cpu_family_of(c);
    if (fam == NULL)
        return -ENOTSUP;
    if (fam->check != NULL)
        FY_TRY(fam->check(c));
    free(s->block_scratch);
    free(s->head_scratch);
    s->block_scratch = s->head_scratch = NULL;
    s->cfg = *c;
    s->fam = fam;
    s->B = B;
    s->T = T;
    size_t block = fam->block_scratch(c, B, T), head = fam->head_scratch(c, B, T);
    s->block_scratch = malloc(block * sizeof(float));
    s->head_scratch = malloc(head * sizeof(float));
    if (s->block_scratch == NULL || s->head_scratch == NULL) {
        fy_error("cannot allocate %.1f MiB of CPU backend scratch for batch %d x %d",
                 (double)(block + head) * 4 / (1 << 20), B, T);
        return -ENOMEM;
    }
    return 0;
}

static int cpu_weights_bf16(void *state, int on)
{
    ((struct cpu_state *)state)->weights_bf16 = on != 0;
    return 0;
}

/* The n weights at w as f32: w itself, or widened from bf16 into scratch `which`. */
static int weights_f32(struct cpu_state *s, int which, const void *w, size_t n, const float **out)
{
    if (!s->weights_bf16) {
        *out = w;
        return 0;
    }
    if (s->wide_n[which] < n) {
        float *grown = realloc(s->wide[which], n * sizeof(float));
        FY_REQUIRE(grown != NULL, -ENOMEM,
                   "CPU backend: no memory to widen %zu bf16 weights to f32", n);
        s->wide[which] = grown;
        s->wide_n[which] = n;
    }
    const uint16_t *h = w;
    float *f = s->wide[which];
#pragma omp parallel for schedule(static) if (n >= (1u << 16))
    for (size_t i = 0; i < n; i++)
        f[i] = fy_bf16_to_f32(h[i]);
    *out = f;
    return 0;
}

static int cpu_embed_forward(void *state, const void *embed_in, const int32_t *tokens,
                             const int32_t *positions, void *x)
{
    struct cpu_state *s = state;
    const float *embed;
    FY_TRY(weights_f32(s, 0, embed_in, fy_model_unit_params(&s->cfg, 0), &embed));
    s->fam->embed_forward(&s->cfg, embed, tokens, positions, x, s->B, s->T);
    return 0;
}

static int cpu_embed_backward(void *state, const int32_t *tokens, const int32_t *positions,
                              const void *dx, float *dembed)
{
    struct cpu_state *s = state;
    s->fam->embed_backward(&s->cfg, tokens, positions, dx, dembed, s->B, s->T);
    return 0;
}

/* 1 when saved gives any internals, which the family must then swap (-ENOTSUP, said, where its
 * blocks cannot). */
static int swapping(const struct cpu_state *s, const struct fy_block_saved *saved)
{
    int any = 0;
    for (int k = 0; saved != NULL && k < FY_ACT_KINDS; k++)
        any |= saved->at[k] != NULL;
    if (any && s->fam->block_forward_saved == NULL) {
        const char *label = fy_model_arch(&s->cfg)->label;
        fy_error("the CPU backend's %s blocks always recompute their internals: train %s models "
                 "with --act-plan auto or recompute", label, label);
        return -ENOTSUP;
    }
    return any;
}

static int cpu_block_forward(void *state, int layer, const void *params_in,
                             const int32_t *positions, const void *x, void *y,
                             const struct fy_block_saved *saved)
{
    (void)layer;
    struct cpu_state *s = state;
    int swap = swapping(s, saved);
    FY_TRY(swap);
    const float *params;
    FY_TRY(weights_f32(s, 0, params_in, fy_model_unit_params(&s->cfg, 1), &params));
    if (swap)
        s->fam->block_forward_saved(&s->cfg, params, positions, x, y, s->block_scratch, saved->at,
                                    s->B, s->T);
    else
        s->fam->block_forward(&s->cfg, params, positions, x, y, s->block_scratch, s->B, s->T);
    return 0;
}

static int cpu_block_backward(void *state, int layer, const void *params_in,
                              const int32_t *positions, const void *x, const void *dy, void *dx,
                              float *dparams, const struct fy_block_saved *saved)
{
    (void)layer;
    struct cpu_state *s = state;
    int swap = swapping(s, saved);
    FY_TRY(swap);
    const float *params;
    FY_TRY(weights_f32(s, 0, params_in, fy_model_unit_params(&s->cfg, 1), &params));
    if (swap)
        s->fam->block_backward_saved(&s->cfg, params, positions, x, dy, dx, dparams,
                                     s->block_scratch, saved->at, s->B, s->T);
    else
        s->fam->block_backward(&s->cfg, params, positions, x, dy, dx, dparams, s->block_scratch,
                               s->B, s->T);
    if (s->hold_next >= 0) /* one-pass clipping keeps this gradient until its update */
        memcpy(s->held + (size_t)s->hold_next * fy_model_unit_params(&s->cfg, 1), dparams,
               fy_model_unit_params(&s->cfg, 1) * sizeof(float));
    s->hold_next = -1;
    return 0;
}

static int cpu_hold(void *state, int count)
{
    struct cpu_state *s = state;
    size_t n = fy_model_unit_params(&s->cfg, 1);
    s->held = malloc((size_t)count * n * sizeof(float));
    FY_REQUIRE(s->held != NULL, -ENOMEM, "cpu backend: no memory to hold %d block gradients "
               "(%zu MiB): use --clip-hold pool or two passes", count,
               (size_t)count * n * sizeof(float) >> 20);
    s->holds = count;
    return 0;
}

static int cpu_hold_next(void *state, int slot)
{
    struct cpu_state *s = state;
    s->hold_next = slot;
    return 0;
}

static int cpu_hold_send(void *state, int slot, float *dparams)
{
    struct cpu_state *s = state;
    size_t n = fy_model_unit_params(&s->cfg, 1);
    memcpy(dparams, s->held + (size_t)slot * n, n * sizeof(float));
    return 0;
}

/* The final unit's and the embeddings' weights as f32 (see weights_f32). */
static int head_weights(struct cpu_state *s, const void *final_in, const void *embed_in,
                        const float **final_params, const float **embed)
{
    FY_TRY(weights_f32(s, 0, final_in, fy_model_unit_params(&s->cfg, s->cfg.n_layer + 1),
                       final_params));
    return weights_f32(s, 1, embed_in, fy_model_unit_params(&s->cfg, 0), embed);
}

static void scale_floats(void *at, uint64_t n, float f)
{
    float *v = at;
#pragma omp parallel for schedule(static)
    for (uint64_t i = 0; i < n; i++)
        v[i] *= f;
}

static int cpu_head(void *state, const void *final_in, const void *embed_in, const void *x,
                    const int32_t *targets, double *loss, void *dx, float *dfinal, float *dembed)
{
    struct cpu_state *s = state;
    const float *final_params, *embed;
    FY_TRY(head_weights(s, final_in, embed_in, &final_params, &embed));
    *loss = s->fam->head(&s->cfg, final_params, embed, x, targets, dx, dfinal, dembed,
                         s->head_scratch, s->B, s->T);
    /* the mean over the whole batch's targets: this call's, which the family divided by its own
     * count, rescaled (within float rounding of dividing by the whole count at once) */
    uint64_t own = 0, n = (uint64_t)s->B * s->T;
    for (uint64_t i = 0; i < n; i++)
        own += targets[i] >= 0;
    if (s->loss_count == 0 || s->loss_count == own)
        return 0;
    float f = (float)((double)own / (double)s->loss_count);
    *loss *= f;
    if (dx == NULL)
        return 0;
    const struct fy_model_config *c = &s->cfg;
    scale_floats(dx, n * c->n_embd, f);
    scale_floats(dfinal, fy_model_unit_params(c, c->n_layer + 1), f);
    scale_floats(dembed, fy_model_unit_params(c, 0), f);
    return 0;
}

static int cpu_loss_count(void *state, uint64_t count)
{
    ((struct cpu_state *)state)->loss_count = count;
    return 0;
}

static int cpu_logits(void *state, const void *final_in, const void *embed_in, const void *x,
                      float *logits)
{
    struct cpu_state *s = state;
    const float *final_params, *embed;
    FY_TRY(head_weights(s, final_in, embed_in, &final_params, &embed));
    s->fam->logits(&s->cfg, final_params, embed, x, logits, s->head_scratch, s->B, s->T);
    return 0;
}

static double now_s(void) { return 1e-9 * (double)fy_monotonic_ns(); }

/* A block on the values at params and x, the best of three runs after one to warm up: its forward
 * (into out->fwd_s), its backward from every swappable kind given, where only the LayerNorms rerun
 * (out->bwd_s), and each forward op alone (op_s). */
static void profile_compute(struct cpu_state *s, const float *params, const float *x, float *y,
                            float *dx, float *dp, void *const *saved, struct fy_block_profile *out,
                            double op_s[FY_ACT_KINDS])
{
    const struct fy_cpu_family *fam = s->fam;
    double best_fwd = INFINITY, best_bwd = INFINITY, op[FY_ACT_KINDS];
    for (int k = 0; k < FY_ACT_KINDS; k++)
        op_s[k] = INFINITY;
    for (int rep = 0; rep < 4; rep++) {
        double t0 = now_s();
        fam->block_forward_saved(&s->cfg, params, NULL, x, y, s->block_scratch, saved, s->B, s->T);
        double t1 = now_s();
        fam->block_backward_saved(&s->cfg, params, NULL, x, y, dx, dp, s->block_scratch, saved,
                                  s->B, s->T);
        double t2 = now_s();
        fam->block_op_times(&s->cfg, params, x, s->block_scratch, s->B, s->T, op);
        if (rep == 0)
            continue;
        best_fwd = t1 - t0 < best_fwd ? t1 - t0 : best_fwd;
        best_bwd = t2 - t1 < best_bwd ? t2 - t1 : best_bwd;
        for (int k = 0; k < FY_ACT_KINDS; k++)
            op_s[k] = op[k] < op_s[k] ? op[k] : op_s[k];
    }
    out->fwd_s = best_fwd;
    out->bwd_s = best_bwd;
}

/* Seconds of a memory copy of `bytes` from host, the best of three after one to warm up: the link
 * of a backend whose device is host memory. */
static double profile_copy_s(void *copy, const void *host, size_t bytes)
{
    double best = INFINITY;
    for (int rep = 0; rep < 4; rep++) {
        double t0 = now_s();
        memcpy(copy, host, bytes);
        double t1 = now_s();
        if (rep > 0 && t1 - t0 < best)
            best = t1 - t0;
    }
    return best;
}

/* The CPU backend's "device" is host memory: the links are memory copies, its internals sets cost
 * nothing on a device (it keeps none), and the ops are timed on values of its own (small, finite),
 * the best of three runs after one to warm up. */
static int cpu_profile(void *state, void *host, size_t host_bytes, struct fy_block_profile *out)
{
    struct cpu_state *s = state;
    FY_REQUIRE(s->block_scratch != NULL, -EINVAL, "CPU backend: profiling before model_prepare");
    /* test hook: FUYOU_TEST_PROFILE_FAIL=1 makes profiling fail, as a device error would */
    FY_REQUIRE(!fy_knob_test_profile_fail(), -EIO,
               "CPU backend: profiling failed (FUYOU_TEST_PROFILE_FAIL=1, a test hook)");
    const struct fy_cpu_family *fam = s->fam;
    FY_REQUIRE(fam->block_forward_saved != NULL && fam->block_op_times != NULL &&
                   fam->qkv_flops != NULL,
               -ENOTSUP,
               "the CPU backend's %s blocks always recompute: nothing to profile for swapping",
               fy_model_arch(&s->cfg)->label);
    FY_REQUIRE(host_bytes >= (1u << 20), -EINVAL,
               "CPU backend: profiling copies need at least 1 MiB of pool, not %zu bytes",
               host_bytes);
    size_t P = fy_model_unit_params(&s->cfg, 1), NC = (size_t)s->B * s->T * s->cfg.n_embd;
    /* the backward from every swappable kind given: only the LayerNorms rerun */
    struct fy_actplan_sizes sizes;
    struct fy_actplan_region reg;
    FY_TRY(fy_actplan_sizes_backend(&s->cfg, s->B, s->T, "cpu", &sizes));
    FY_TRY(fy_actplan_region_of(&sizes, FY_ACT_SWAPPABLE, &reg));
    float *params = malloc(P * sizeof(float)), *x = malloc(NC * sizeof(float));
    float *y = malloc(NC * sizeof(float)), *dx = malloc(NC * sizeof(float));
    float *dp = malloc(P * sizeof(float)), *copy = malloc(host_bytes);
    char *region = malloc(reg.bytes);
    int rc = 0;
    if (!(params && x && y && dx && dp && copy && region)) {
        fy_error("CPU backend: no memory for profiling a block");
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < P; i++)
        params[i] = 0.02f * (float)((int)(i % 17) - 8) / 8.0f;
    for (size_t i = 0; i < NC; i++)
        x[i] = (float)((int)(i % 13) - 6) / 6.0f;
    void *saved[FY_ACT_KINDS] = {0};
    for (int k = 0; k < FY_ACT_KINDS; k++)
        if (FY_ACT_SWAPPABLE & FY_ACT_BIT(k))
            saved[k] = region + reg.offset[k];
    double best_op[FY_ACT_KINDS];
    profile_compute(s, params, x, y, dx, dp, saved, out, best_op);
    double best_copy = profile_copy_s(copy, host, host_bytes);
    for (int k = 0; k < FY_ACT_KINDS; k++) /* the LayerNorms always rerun: not a saving */
        out->recompute_s[k] = fy_actplan_kind_swappable(k) ? best_op[k] : 0;
    out->flops_per_s =
        best_op[FY_ACT_QKV] > 0 ? fam->qkv_flops(&s->cfg, s->B, s->T) / best_op[FY_ACT_QKV] : 0;
    out->h2d_Bps = out->d2h_Bps = out->duplex_Bps = (double)host_bytes / best_copy;
    out->gpu_free = out->set_bytes = 0;
    fy_info("profile (CPU backend, batch %d x %d): block forward %.3f ms, backward %.3f ms; "
            "recompute qkv %.3f, attn %.3f, resid %.3f, fc %.3f, gelu %.3f ms; memory copies "
            "%.1f GB/s",
            s->B, s->T, 1e3 * out->fwd_s, 1e3 * out->bwd_s, 1e3 * out->recompute_s[FY_ACT_QKV],
            1e3 * out->recompute_s[FY_ACT_ATTN], 1e3 * out->recompute_s[FY_ACT_RESID],
            1e3 * out->recompute_s[FY_ACT_FC], 1e3 * out->recompute_s[FY_ACT_GELU],
            1e-9 * out->h2d_Bps);
out:
    free(params);
    free(x);
    free(y);
    free(dx);
    free(dp);
    free(copy);
    free(region);
    return rc;
}

const struct fy_backend_ops fy_cpu_backend_ops = {
    .name = "cpu",
    .open = cpu_open,
    .destroy = cpu_destroy,
    .register_host = cpu_register_host,
    .unregister_host = cpu_unregister_host,
    .synth = cpu_synth,
    .model_prepare = cpu_model_prepare,
    .model_embed_forward = cpu_embed_forward,
    .model_embed_backward = cpu_embed_backward,
    .model_block_forward = cpu_block_forward,
    .model_block_backward = cpu_block_backward,
    .model_head = cpu_head,
    .model_logits = cpu_logits,
    .model_profile = cpu_profile,
    .model_weights_bf16 = cpu_weights_bf16,
    .model_hold = cpu_hold,
    .model_hold_next = cpu_hold_next,
    .model_hold_send = cpu_hold_send,
    .model_loss_count = cpu_loss_count,
};
