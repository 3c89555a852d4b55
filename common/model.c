/* Model configuration (GPT-2 and Llama), per-unit parameter layout and initialisation from a
 * counter-based normal generator, so a unit's initial weights never depend on what was initialised
 * before it. */
#include "model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "config.h"
#include "synth.h"

#define MAX_DIM (1u << 20)

int fy_gpt_config_validate(const struct fy_gpt_config *c)
{
    FY_REQUIRE(c->n_layer >= 1 && c->n_layer <= 4096, -EINVAL,
               "model: n_layer %u must be between 1 and 4096", c->n_layer);
    FY_REQUIRE(c->n_embd >= 1 && c->n_embd <= 65536, -EINVAL,
               "model: n_embd %u must be between 1 and 65536", c->n_embd);
    FY_REQUIRE(c->n_head >= 1 && c->n_embd % c->n_head == 0, -EINVAL,
               "model: n_head %u must divide n_embd %u", c->n_head, c->n_embd);
    FY_REQUIRE(c->vocab >= 2 && c->vocab <= MAX_DIM, -EINVAL,
               "model: vocab %u must be between 2 and %u", c->vocab, MAX_DIM);
    FY_REQUIRE(c->ctx >= 1 && c->ctx <= MAX_DIM, -EINVAL, "model: ctx %u must be between 1 and %u",
               c->ctx, MAX_DIM);
    FY_REQUIRE(c->arch == FY_ARCH_GPT2 || c->arch == FY_ARCH_LLAMA, -EINVAL,
               "model: unknown architecture %u", c->arch);
    if (c->arch == FY_ARCH_GPT2)
        return 0;
    FY_REQUIRE((c->n_embd / c->n_head) % 2 == 0, -EINVAL,
               "model: head size %u (n_embd / n_head) must be even for rotary embeddings",
               c->n_embd / c->n_head);
    FY_REQUIRE(c->n_kv_head >= 1 && c->n_head % c->n_kv_head == 0, -EINVAL,
               "model: n_kv_head %u must divide n_head %u", c->n_kv_head, c->n_head);
    FY_REQUIRE(c->n_inter >= 1 && c->n_inter <= MAX_DIM, -EINVAL,
               "model: n_inter %u must be between 1 and %u", c->n_inter, MAX_DIM);
    FY_REQUIRE(c->tied <= 1, -EINVAL, "model: tied must be 0 or 1, not %u", c->tied);
    FY_REQUIRE(c->rms_eps > 0.0f && isfinite(c->rms_eps), -EINVAL,
               "model: rms_eps %g must be positive", (double)c->rms_eps);
    FY_REQUIRE(c->rope_theta > 0.0 && isfinite(c->rope_theta), -EINVAL,
               "model: rope_theta %g must be positive", c->rope_theta);
    FY_REQUIRE(c->rope_type == FY_ROPE_DEFAULT || c->rope_type == FY_ROPE_LLAMA3, -EINVAL,
               "model: unknown rope type %u", c->rope_type);
    if (c->rope_type == FY_ROPE_LLAMA3) {
        FY_REQUIRE(c->rope_factor > 0.0 && isfinite(c->rope_factor), -EINVAL,
                   "model: rope_factor %g must be positive", c->rope_factor);
        FY_REQUIRE(c->rope_low_freq_factor > 0.0 &&
                       c->rope_high_freq_factor > c->rope_low_freq_factor &&
                       isfinite(c->rope_high_freq_factor),
                   -EINVAL, "model: rope_low_freq_factor %g and rope_high_freq_factor %g must "
                   "satisfy 0 < low < high", c->rope_low_freq_factor, c->rope_high_freq_factor);
        FY_REQUIRE(c->rope_orig_max_pos >= 1, -EINVAL,
                   "model: rope_original_max_pos must be positive");
    }
    return 0;
}

const char *fy_arch_name(uint32_t arch)
{
    return arch == FY_ARCH_GPT2 ? "gpt2" : arch == FY_ARCH_LLAMA ? "llama" : "unknown";
}

/* The Llama keys of model.conf. */
static int llama_from(const struct fy_config *cfg, struct fy_gpt_config *out)
{
    uint64_t kv, inter, tied = 0, omax = 0;
    double eps, theta, factor = 0, low = 0, high = 0;
    FY_TRY(fy_config_get_u64(cfg, "model.n_kv_head", 1, 0, &kv));
    FY_TRY(fy_config_get_u64(cfg, "model.n_inter", 1, 0, &inter));
    FY_TRY(fy_config_get_u64(cfg, "model.tied", 0, 0, &tied));
    FY_TRY(fy_config_get_double(cfg, "model.rms_eps", 1, 0, &eps));
    FY_TRY(fy_config_get_double(cfg, "model.rope_theta", 1, 0, &theta));
    const char *rope = fy_config_get(cfg, "model.rope_type");
    uint32_t rope_type = FY_ROPE_DEFAULT;
    if (rope != NULL && strcmp(rope, "llama3") == 0) {
        rope_type = FY_ROPE_LLAMA3;
        FY_TRY(fy_config_get_double(cfg, "model.rope_factor", 1, 0, &factor));
        FY_TRY(fy_config_get_double(cfg, "model.rope_low_freq_factor", 1, 0, &low));
        FY_TRY(fy_config_get_double(cfg, "model.rope_high_freq_factor", 1, 0, &high));
        FY_TRY(fy_config_get_u64(cfg, "model.rope_original_max_pos", 1, 0, &omax));
    } else {
        FY_REQUIRE(rope == NULL || strcmp(rope, "default") == 0, -EINVAL,
                   "%s: model.rope_type \"%s\": expected default or llama3", cfg->path, rope);
    }
    FY_REQUIRE(kv <= UINT32_MAX && inter <= UINT32_MAX && tied <= 1 && omax <= UINT32_MAX, -EINVAL,
               "%s: a model.* value is out of range", cfg->path);
    out->n_kv_head = (uint32_t)kv;
    out->n_inter = (uint32_t)inter;
    out->tied = (uint32_t)tied;
    out->rms_eps = (float)eps;
    out->rope_theta = theta;
    out->rope_type = rope_type;
    out->rope_factor = factor;
    out->rope_low_freq_factor = low;
    out->rope_high_freq_factor = high;
    out->rope_orig_max_pos = (uint32_t)omax;
    return 0;
}

int fy_gpt_config_from(const struct fy_config *cfg, struct fy_gpt_config *out)
{
    uint64_t v[5];
    static const char *const keys[5] = {"model.n_layer", "model.n_head", "model.n_embd",
                                        "model.vocab", "model.ctx"};
    for (int i = 0; i < 5; i++) {
        FY_TRY(fy_config_get_u64(cfg, keys[i], 1, 0, &v[i]));
        FY_REQUIRE(v[i] <= UINT32_MAX, -EINVAL, "%s: %s is too large", cfg->path, keys[i]);
    }
    *out = (struct fy_gpt_config){.n_layer = (uint32_t)v[0], .n_head = (uint32_t)v[1],
                                  .n_embd = (uint32_t)v[2], .vocab = (uint32_t)v[3],
                                  .ctx = (uint32_t)v[4]};
    const char *arch = fy_config_get(cfg, "model.arch");
    if (arch != NULL && strcmp(arch, "llama") == 0) {
        out->arch = FY_ARCH_LLAMA;
        FY_TRY(llama_from(cfg, out));
    } else {
        FY_REQUIRE(arch == NULL || strcmp(arch, "gpt2") == 0, -EINVAL,
                   "%s: model.arch \"%s\": expected gpt2 or llama", cfg->path, arch);
    }
    return fy_gpt_config_validate(out);
}

int fy_gpt_config_to(const struct fy_gpt_config *c, struct fy_config *cfg)
{
    FY_TRY(fy_config_setf(cfg, "model.n_layer", "%u", c->n_layer));
    FY_TRY(fy_config_setf(cfg, "model.n_head", "%u", c->n_head));
    FY_TRY(fy_config_setf(cfg, "model.n_embd", "%u", c->n_embd));
    FY_TRY(fy_config_setf(cfg, "model.vocab", "%u", c->vocab));
    FY_TRY(fy_config_setf(cfg, "model.ctx", "%u", c->ctx));
    if (c->arch == FY_ARCH_GPT2)
        return 0; /* GPT-2 model.conf files stay as they were */
    FY_TRY(fy_config_set(cfg, "model.arch", fy_arch_name(c->arch)));
    FY_TRY(fy_config_setf(cfg, "model.n_kv_head", "%u", c->n_kv_head));
    FY_TRY(fy_config_setf(cfg, "model.n_inter", "%u", c->n_inter));
    FY_TRY(fy_config_setf(cfg, "model.tied", "%u", c->tied));
    FY_TRY(fy_config_setf(cfg, "model.rms_eps", "%.9g", (double)c->rms_eps));
    FY_TRY(fy_config_setf(cfg, "model.rope_theta", "%.17g", c->rope_theta));
    FY_TRY(fy_config_set(cfg, "model.rope_type", c->rope_type == FY_ROPE_LLAMA3 ? "llama3" : "default"));
    if (c->rope_type == FY_ROPE_LLAMA3) {
        FY_TRY(fy_config_setf(cfg, "model.rope_factor", "%.17g", c->rope_factor));
        FY_TRY(fy_config_setf(cfg, "model.rope_low_freq_factor", "%.17g", c->rope_low_freq_factor));
        FY_TRY(fy_config_setf(cfg, "model.rope_high_freq_factor", "%.17g", c->rope_high_freq_factor));
        FY_TRY(fy_config_setf(cfg, "model.rope_original_max_pos", "%u", c->rope_orig_max_pos));
    }
    return 0;
}

static uint64_t bits64(double v)
{
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

uint64_t fy_gpt_config_hash(const struct fy_gpt_config *c)
{
    uint64_t h = fy_synth_mix(0x6770742d32ull); /* "gpt-2" */
    const uint32_t f[5] = {c->n_layer, c->n_head, c->n_embd, c->vocab, c->ctx};
    for (int i = 0; i < 5; i++)
        h = fy_synth_mix(h ^ f[i]);
    if (c->arch == FY_ARCH_GPT2)
        return h;
    uint32_t eps;
    memcpy(&eps, &c->rms_eps, sizeof eps);
    const uint64_t g[12] = {0x6c6c616d61ull /* "llama" */, c->arch, c->n_kv_head, c->n_inter, c->tied,
                            c->rope_type, c->rope_orig_max_pos, eps, bits64(c->rope_theta),
                            bits64(c->rope_factor), bits64(c->rope_low_freq_factor),
                            bits64(c->rope_high_freq_factor)};
    for (int i = 0; i < 12; i++)
        h = fy_synth_mix(h ^ g[i]);
    return h;
}

void fy_gpt_config_describe(const struct fy_gpt_config *c, char *buf, size_t len)
{
    if (c->arch == FY_ARCH_LLAMA) {
        snprintf(buf, len,
                 "Llama: %u layers, %u heads (%u kv), %u wide, MLP %u, vocab %u, context %u, %s "
                 "head, rope theta %g%s, %.2f M parameters",
                 c->n_layer, c->n_head, c->n_kv_head, c->n_embd, c->n_inter, c->vocab, c->ctx,
                 c->tied ? "tied" : "untied", c->rope_theta,
                 c->rope_type == FY_ROPE_LLAMA3 ? " (llama3 scaling)" : "",
                 (double)fy_gpt_total_params(c) / 1e6);
        return;
    }
    snprintf(buf, len, "GPT: %u layers, %u heads, %u wide, vocab %u, context %u, %.2f M parameters",
             c->n_layer, c->n_head, c->n_embd, c->vocab, c->ctx,
             (double)fy_gpt_total_params(c) / 1e6);
}

void fy_gpt_block_layout(const struct fy_gpt_config *c, struct fy_gpt_block_layout *o)
{
    size_t C = c->n_embd, at = 0;
#define PLACE(field, n) (o->field = at, at += (n))
    PLACE(ln1_w, C);
    PLACE(ln1_b, C);
    PLACE(qkv_w, 3 * C * C);
    PLACE(qkv_b, 3 * C);
    PLACE(attn_w, C * C);
    PLACE(attn_b, C);
    PLACE(ln2_w, C);
    PLACE(ln2_b, C);
    PLACE(fc_w, 4 * C * C);
    PLACE(fc_b, 4 * C);
    PLACE(proj_w, 4 * C * C);
    PLACE(proj_b, C);
#undef PLACE
    o->total = at;
}

void fy_llama_unit_layout(const struct fy_gpt_config *c, struct fy_llama_unit_layout *o)
{
    size_t C = c->n_embd, hd = C / c->n_head, Q = c->n_head * hd, KV = c->n_kv_head * hd;
    size_t I = c->n_inter, at = 0;
#define PLACE(field, n) (o->field = at, at += (n))
    PLACE(input_norm, C);
    PLACE(q_proj, Q * C);
    PLACE(k_proj, KV * C);
    PLACE(v_proj, KV * C);
    PLACE(o_proj, C * Q);
    PLACE(post_norm, C);
    PLACE(gate_proj, I * C);
    PLACE(up_proj, I * C);
    PLACE(down_proj, C * I);
#undef PLACE
    o->total = at;
}

unsigned fy_gpt_unit_count(const struct fy_gpt_config *c) { return c->n_layer + 2; }

enum fy_unit_kind fy_gpt_unit_kind(const struct fy_gpt_config *c, unsigned unit)
{
    return unit == 0 ? FY_UNIT_EMBED : unit <= c->n_layer ? FY_UNIT_BLOCK : FY_UNIT_FINAL;
}

size_t fy_gpt_unit_params(const struct fy_gpt_config *c, unsigned unit)
{
    if (c->arch == FY_ARCH_LLAMA) {
        size_t VC = (size_t)c->vocab * c->n_embd;
        switch (fy_gpt_unit_kind(c, unit)) {
        case FY_UNIT_EMBED: return VC;
        case FY_UNIT_FINAL: return c->n_embd + (c->tied ? 0 : VC);
        default: {
            struct fy_llama_unit_layout l;
            fy_llama_unit_layout(c, &l);
            return l.total;
        }
        }
    }
    switch (fy_gpt_unit_kind(c, unit)) {
    case FY_UNIT_EMBED: return (size_t)c->vocab * c->n_embd + (size_t)c->ctx * c->n_embd;
    case FY_UNIT_FINAL: return 2 * (size_t)c->n_embd;
    default: {
        struct fy_gpt_block_layout l;
        fy_gpt_block_layout(c, &l);
        return l.total;
    }
    }
}

size_t fy_gpt_total_params(const struct fy_gpt_config *c)
{
    size_t n = 0;
    for (unsigned u = 0; u < fy_gpt_unit_count(c); u++)
        n += fy_gpt_unit_params(c, u);
    return n;
}

double fy_gpt_flops_per_token(const struct fy_gpt_config *c, unsigned seq_len)
{
    /* 6 per parameter (2 forward, 4 backward) and 6 * L * T * C for the attention scores and
     * values, the full T x T counted: the usual model-FLOPs figure, which PyTorch benchmarks and
     * the paper report too. Work the schedule adds (a block recomputed in backward) is not
     * counted, so the figure compares what different systems get done. */
    double C = c->n_embd, L = c->n_layer;
    return 6.0 * (double)fy_gpt_total_params(c) + 6.0 * L * seq_len * C;
}

int fy_gpt_decay_segments(const struct fy_gpt_config *c, unsigned unit,
                          struct fy_param_segment out[FY_GPT_MAX_SEGMENTS])
{
    size_t total = fy_gpt_unit_params(c, unit);
    if (c->arch == FY_ARCH_LLAMA) {
        size_t C = c->n_embd;
        if (fy_gpt_unit_kind(c, unit) == FY_UNIT_EMBED) {
            out[0] = (struct fy_param_segment){0, total, 1};
            return 1;
        }
        if (fy_gpt_unit_kind(c, unit) == FY_UNIT_FINAL) {
            out[0] = (struct fy_param_segment){0, C, 0}; /* norm */
            if (total == C)
                return 1;
            out[1] = (struct fy_param_segment){C, total, 1}; /* lm_head */
            return 2;
        }
        struct fy_llama_unit_layout l;
        fy_llama_unit_layout(c, &l);
        out[0] = (struct fy_param_segment){l.input_norm, l.q_proj, 0};
        out[1] = (struct fy_param_segment){l.q_proj, l.post_norm, 1};
        out[2] = (struct fy_param_segment){l.post_norm, l.gate_proj, 0};
        out[3] = (struct fy_param_segment){l.gate_proj, l.total, 1};
        return 4;
    }
    if (fy_gpt_unit_kind(c, unit) != FY_UNIT_BLOCK) {
        out[0] = (struct fy_param_segment){0, total, fy_gpt_unit_kind(c, unit) == FY_UNIT_EMBED};
        return 1;
    }
    struct fy_gpt_block_layout l;
    fy_gpt_block_layout(c, &l);
    /* Layout order: ln1_w ln1_b | qkv_w | qkv_b | attn_w | attn_b ln2_w ln2_b | fc_w | fc_b | proj_w |
     * proj_b; neighbouring ranges with the same flag are merged. */
    const struct fy_param_segment parts[] = {
        {l.ln1_w, l.qkv_w, 0},  {l.qkv_w, l.qkv_b, 1},   {l.qkv_b, l.attn_w, 0},
        {l.attn_w, l.attn_b, 1}, {l.attn_b, l.fc_w, 0},  {l.fc_w, l.fc_b, 1},
        {l.fc_b, l.proj_w, 0},  {l.proj_w, l.proj_b, 1}, {l.proj_b, l.total, 0},
    };
    int n = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        out[n++] = parts[i];
    return n;
}

/* Standard normal from two counter-based uniforms (Box-Muller), computed in double. */
static float normal_at(uint64_t seed, unsigned unit, size_t index)
{
    uint64_t h1 = fy_synth_mix(seed ^ fy_synth_mix(((uint64_t)unit << 40) ^ (2 * (uint64_t)index)));
    uint64_t h2 = fy_synth_mix(seed ^ fy_synth_mix(((uint64_t)unit << 40) ^ (2 * (uint64_t)index + 1)));
    double u1 = ((double)(h1 >> 11) + 1.0) * (1.0 / 9007199254740993.0); /* (0, 1] */
    double u2 = (double)(h2 >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* Each value depends on its index alone, so the cores share the work with the same bits; on one
 * core a 2.7B model's initialisation took two minutes. */
static void fill_normal(float *p, size_t n, size_t first, float std, uint64_t seed, unsigned unit)
{
#pragma omp parallel for schedule(static) if (n >= (1u << 20))
    for (size_t i = 0; i < n; i++)
        p[i] = std * normal_at(seed, unit, first + i);
}

static void fill_const(float *p, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        p[i] = v;
}

void fy_gpt_init_unit(const struct fy_gpt_config *c, unsigned unit, uint64_t seed, float *params)
{
    size_t C = c->n_embd;
    const float std = 0.02f;
    if (c->arch == FY_ARCH_LLAMA) {
        size_t n = fy_gpt_unit_params(c, unit);
        if (fy_gpt_unit_kind(c, unit) == FY_UNIT_EMBED) {
            fill_normal(params, n, 0, std, seed, unit);
        } else if (fy_gpt_unit_kind(c, unit) == FY_UNIT_FINAL) {
            fill_const(params, C, 1.0f);
            fill_normal(params + C, n - C, C, std, seed, unit);
        } else {
            struct fy_llama_unit_layout l;
            fy_llama_unit_layout(c, &l);
            fill_const(params + l.input_norm, C, 1.0f);
            fill_normal(params + l.q_proj, l.post_norm - l.q_proj, l.q_proj, std, seed, unit);
            fill_const(params + l.post_norm, C, 1.0f);
            fill_normal(params + l.gate_proj, l.total - l.gate_proj, l.gate_proj, std, seed, unit);
        }
        return;
    }
    switch (fy_gpt_unit_kind(c, unit)) {
    case FY_UNIT_EMBED:
        fill_normal(params, fy_gpt_unit_params(c, unit), 0, std, seed, unit);
        return;
    case FY_UNIT_FINAL:
        fill_const(params, C, 1.0f);
        fill_const(params + C, C, 0.0f);
        return;
    case FY_UNIT_BLOCK: break;
    }
    struct fy_gpt_block_layout l;
    fy_gpt_block_layout(c, &l);
    float resid_std = (float)(0.02 / sqrt(2.0 * c->n_layer));
    fill_const(params + l.ln1_w, C, 1.0f);
    fill_const(params + l.ln1_b, C, 0.0f);
    fill_normal(params + l.qkv_w, 3 * C * C, l.qkv_w, std, seed, unit);
    fill_const(params + l.qkv_b, 3 * C, 0.0f);
    fill_normal(params + l.attn_w, C * C, l.attn_w, resid_std, seed, unit);
    fill_const(params + l.attn_b, C, 0.0f);
    fill_const(params + l.ln2_w, C, 1.0f);
    fill_const(params + l.ln2_b, C, 0.0f);
    fill_normal(params + l.fc_w, 4 * C * C, l.fc_w, std, seed, unit);
    fill_const(params + l.fc_b, 4 * C, 0.0f);
    fill_normal(params + l.proj_w, 4 * C * C, l.proj_w, resid_std, seed, unit);
    fill_const(params + l.proj_b, C, 0.0f);
}
