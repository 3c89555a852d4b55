/* The CPU backend of the gpu worker: computes directly in host memory (so registering the pool is a
 * no-op), with the fp32 OpenMP operations of gpt_cpu (GPT-2) or llama_cpu (Llama, chosen by the
 * model's architecture) and private scratch sized per batch; bf16 weights are widened into scratch
 * of their own first. */
#include "cpu_backend.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/arch/arch.h"
#include "common/check.h"
#include "common/desc.h"
#include "common/dtype.h"
#include "common/knobs.h"
#include "common/synth.h"
#include "gpu_worker/cpu/gpt_cpu.h"
#include "gpu_worker/cpu/llama_cpu.h"

struct cpu_state {
    struct fy_model_config cfg;
    int llama;                   /* cfg.arch == FY_ARCH_LLAMA */
    struct fy_llama_config lcfg; /* the block's config when llama */
    int B, T;
    float *block_scratch;
    float *head_scratch;
    /* model_weights_bf16: weights arrive as bf16 and are widened into wide[0] (a unit's) and
     * wide[1] (the tied head's embeddings), of wide_n floats each so far */
    int weights_bf16;
    float *wide[2];
    size_t wide_n[2];
};

static int cpu_open(void **state, uint64_t gpu_mem, char *device, size_t device_len)
{
    struct cpu_state *s = calloc(1, sizeof *s);
    if (s == NULL)
        return -ENOMEM;
    snprintf(device, device_len, "CPU (%ld online cores)", sysconf(_SC_NPROCESSORS_ONLN));
    *state = s;
    return 0;
}

static void cpu_close(void *state)
{
    struct cpu_state *s = state;
    if (s == NULL)
        return;
    free(s->block_scratch);
    free(s->head_scratch);
    free(s->wide[0]);
    free(s->wide[1]);
    free(s);
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

static int cpu_gpt_prepare(void *state, const struct fy_model_config *c, int B, int T)
{
    struct cpu_state *s = state;
    FY_REQUIRE(B >= 1 && T >= 1 && (uint32_t)T <= c->ctx, -EINVAL,
               "batch %d x %d: need B >= 1 and 1 <= T <= context %u", B, T, c->ctx);
    free(s->block_scratch);
    free(s->head_scratch);
    s->cfg = *c;
    s->B = B;
    s->T = T;
    s->llama = fy_model_arch(c) == &fy_arch_llama; /* (the family ops table replaces this) */
    size_t block, head;
    if (s->llama) {
        fy_llama_config_of(c, &s->lcfg);
        FY_TRY(fy_llama_config_validate(&s->lcfg));
        block = fy_llama_block_scratch(&s->lcfg, B, T);
        head = fy_llama_head_scratch(c, B, T);
    } else {
        block = fy_cpu_block_scratch(c, B, T);
        head = fy_cpu_head_scratch(c, B, T);
    }
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

static int cpu_embed_forward(void *state, const void *embed_in, const int32_t *tokens, void *x)
{
    struct cpu_state *s = state;
    const float *embed;
    FY_TRY(weights_f32(s, 0, embed_in, fy_model_unit_params(&s->cfg, 0), &embed));
    if (s->llama)
        fy_llama_embed_forward(&s->cfg, embed, tokens, x, s->B, s->T);
    else
        fy_cpu_embed_forward(&s->cfg, embed, tokens, x, s->B, s->T);
    return 0;
}

static int cpu_embed_backward(void *state, const int32_t *tokens, const void *dx, float *dembed)
{
    struct cpu_state *s = state;
    if (s->llama)
        fy_llama_embed_backward(&s->cfg, tokens, dx, dembed, s->B, s->T);
    else
        fy_cpu_embed_backward(&s->cfg, tokens, dx, dembed, s->B, s->T);
    return 0;
}

/* The Llama blocks' internals are not the GPT-2 kinds that common/actplan.h names. */
static int llama_refuses_saved(const struct cpu_state *s, const struct fy_block_saved *saved)
{
    int any = 0;
    for (int k = 0; saved != NULL && k < FY_ACT_KINDS; k++)
        any |= saved->at[k] != NULL;
    FY_REQUIRE(!(s->llama && any), -ENOTSUP,
               "the CPU backend's Llama blocks always recompute their internals: train Llama "
               "models with --act-plan auto or recompute");
    return 0;
}

static int cpu_block_forward(void *state, int layer, const void *params_in, const void *x, void *y,
                             const struct fy_block_saved *saved)
{
    (void)layer;
    struct cpu_state *s = state;
    FY_TRY(llama_refuses_saved(s, saved));
    const float *params;
    FY_TRY(weights_f32(s, 0, params_in, fy_model_unit_params(&s->cfg, 1), &params));
    if (s->llama)
        fy_llama_block_forward(&s->lcfg, params, x, y, s->block_scratch, s->B, s->T);
    else
        fy_cpu_block_forward(&s->cfg, params, x, y, s->block_scratch, saved ? saved->at : NULL,
                             s->B, s->T);
    return 0;
}

static int cpu_block_backward(void *state, int layer, const void *params_in, const void *x,
                              const void *dy, void *dx, float *dparams,
                              const struct fy_block_saved *saved)
{
    (void)layer;
    struct cpu_state *s = state;
    FY_TRY(llama_refuses_saved(s, saved));
    const float *params;
    FY_TRY(weights_f32(s, 0, params_in, fy_model_unit_params(&s->cfg, 1), &params));
    if (s->llama) {
        /* the Llama block accumulates its parameter gradients; the request overwrites them */
        memset(dparams, 0, fy_model_unit_params(&s->cfg, 1) * sizeof *dparams);
        fy_llama_block_backward(&s->lcfg, params, x, dy, dx, dparams, s->block_scratch, s->B, s->T);
    } else {
        fy_cpu_block_backward(&s->cfg, params, x, dy, dx, dparams, s->block_scratch,
                              saved ? saved->at : NULL, s->B, s->T);
    }
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

static int cpu_head(void *state, const void *final_in, const void *embed_in, const void *x,
                    const int32_t *targets, double *loss, void *dx, float *dfinal, float *dembed)
{
    struct cpu_state *s = state;
    const float *final_params, *embed;
    FY_TRY(head_weights(s, final_in, embed_in, &final_params, &embed));
    if (s->llama) {
        *loss = fy_llama_head_forward_backward(&s->cfg, final_params, embed, x, targets, dx, dfinal,
                                               dembed, s->head_scratch, s->B, s->T);
        return 0;
    }
    *loss = fy_cpu_head_forward_backward(&s->cfg, final_params, embed, x, targets, dx, dfinal,
                                         dembed, s->head_scratch, s->B, s->T);
    return 0;
}

static int cpu_logits(void *state, const void *final_in, const void *embed_in, const void *x,
                      float *logits)
{
    struct cpu_state *s = state;
    const float *final_params, *embed;
    FY_TRY(head_weights(s, final_in, embed_in, &final_params, &embed));
    if (s->llama) {
        fy_llama_logits(&s->cfg, final_params, embed, x, logits, s->head_scratch, s->B, s->T);
        return 0;
    }
    size_t N = (size_t)s->B * s->T, C = s->cfg.n_embd;
    float *xn = malloc(N * C * sizeof *xn), *stats = malloc(2 * N * sizeof *stats);
    if (xn == NULL || stats == NULL) {
        free(xn);
        free(stats);
        return -ENOMEM;
    }
    fy_cpu_layernorm_forward(xn, stats, stats + N, x, final_params, final_params + C, (int)N, (int)C);
    fy_cpu_matmul_forward(logits, xn, embed, NULL, (int)N, (int)C, (int)s->cfg.vocab);
    free(xn);
    free(stats);
    return 0;
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
    FY_REQUIRE(!s->llama, -ENOTSUP,
               "the CPU backend's Llama blocks always recompute: nothing to profile for swapping");
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
    int rc = params && x && y && dx && dp && copy && region ? 0 : -ENOMEM;
    if (rc < 0)
        fy_error("CPU backend: no memory for profiling a block");
    for (size_t i = 0; rc == 0 && i < P; i++)
        params[i] = 0.02f * (float)((int)(i % 17) - 8) / 8.0f;
    for (size_t i = 0; rc == 0 && i < NC; i++)
        x[i] = (float)((int)(i % 13) - 6) / 6.0f;
    double best_fwd = INFINITY, best_bwd = INFINITY, op[FY_ACT_KINDS], best_op[FY_ACT_KINDS];
    for (int k = 0; k < FY_ACT_KINDS; k++)
        best_op[k] = INFINITY;
    void *saved[FY_ACT_KINDS] = {0};
    for (int k = 0; region != NULL && k < FY_ACT_KINDS; k++)
        if (FY_ACT_SWAPPABLE & FY_ACT_BIT(k))
            saved[k] = region + reg.offset[k];
    for (int rep = 0; rc == 0 && rep < 4; rep++) {
        double t0 = 1e-9 * (double)fy_monotonic_ns();
        fy_cpu_block_forward(&s->cfg, params, x, y, s->block_scratch, saved, s->B, s->T);
        double t1 = 1e-9 * (double)fy_monotonic_ns();
        fy_cpu_block_backward(&s->cfg, params, x, y, dx, dp, s->block_scratch, saved, s->B,
                              s->T);
        double t2 = 1e-9 * (double)fy_monotonic_ns();
        fy_cpu_block_op_times(&s->cfg, params, x, s->block_scratch, s->B, s->T, op);
        if (rep == 0)
            continue;
        best_fwd = t1 - t0 < best_fwd ? t1 - t0 : best_fwd;
        best_bwd = t2 - t1 < best_bwd ? t2 - t1 : best_bwd;
        for (int k = 0; k < FY_ACT_KINDS; k++)
            best_op[k] = op[k] < best_op[k] ? op[k] : best_op[k];
    }
    double best_copy = INFINITY;
    for (int rep = 0; rc == 0 && rep < 4; rep++) {
        double t0 = 1e-9 * (double)fy_monotonic_ns();
        memcpy(copy, host, host_bytes);
        double t1 = 1e-9 * (double)fy_monotonic_ns();
        if (rep > 0 && t1 - t0 < best_copy)
            best_copy = t1 - t0;
    }
    if (rc == 0) {
        out->fwd_s = best_fwd;
        out->bwd_s = best_bwd;
        for (int k = 0; k < FY_ACT_KINDS; k++) /* the LayerNorms always rerun: not a saving */
            out->recompute_s[k] = fy_actplan_kind_swappable(k) ? best_op[k] : 0;
        double C = s->cfg.n_embd, N = (double)s->B * s->T;
        out->flops_per_s = best_op[FY_ACT_QKV] > 0 ? 2 * N * C * 3 * C / best_op[FY_ACT_QKV] : 0;
        out->h2d_Bps = out->d2h_Bps = out->duplex_Bps = (double)host_bytes / best_copy;
        out->gpu_free = out->set_bytes = 0;
        fy_info("profile (CPU backend, batch %d x %d): block forward %.3f ms, backward %.3f ms; "
                "recompute qkv %.3f, attn %.3f, resid %.3f, fc %.3f, gelu %.3f ms; memory copies "
                "%.1f GB/s", s->B, s->T, 1e3 * out->fwd_s, 1e3 * out->bwd_s,
                1e3 * out->recompute_s[FY_ACT_QKV], 1e3 * out->recompute_s[FY_ACT_ATTN],
                1e3 * out->recompute_s[FY_ACT_RESID], 1e3 * out->recompute_s[FY_ACT_FC],
                1e3 * out->recompute_s[FY_ACT_GELU], 1e-9 * out->h2d_Bps);
    }
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
    .close = cpu_close,
    .register_host = cpu_register_host,
    .unregister_host = cpu_unregister_host,
    .synth = cpu_synth,
    .model_prepare = cpu_gpt_prepare,
    .model_embed_forward = cpu_embed_forward,
    .model_embed_backward = cpu_embed_backward,
    .model_block_forward = cpu_block_forward,
    .model_block_backward = cpu_block_backward,
    .model_head = cpu_head,
    .model_logits = cpu_logits,
    .model_profile = cpu_profile,
    .model_weights_bf16 = cpu_weights_bf16,
};
