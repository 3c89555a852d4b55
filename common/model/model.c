/* A model's config and what is common to every family: validation and model.conf's common keys,
 * the config hash, unit counts and sizes, weight-decay segments and initialisation, each derived
 * from the family's tensor table (common/model/arch/arch.h). Initialisation draws from a
 * counter-based normal generator, so a unit's initial weights never depend on what was initialised
 * before it. */
#include "common/model/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/model/arch/arch.h"
#include "common/base/check.h"
#include "common/base/config.h"
#include "common/base/synth.h"

#define MAX_DIM (1u << 20)

int fy_model_config_validate(const struct fy_model_config *c)
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
    FY_REQUIRE(c->optim_state >= 0 && c->optim_state < FY_OPTIM_STATE_COUNT, -EINVAL,
               "model: optimizer state format %d is not fp32, bf16 or int8", c->optim_state);
    FY_REQUIRE(c->state_piece == 0 ||
                   (c->state_piece >= FY_MODEL_STATE_PIECE_MIN && c->state_piece % 1024 == 0),
               -EINVAL,
               "model: a piece of optimizer state of %llu bytes: give 0 (whole units) or "
               "a multiple of 1 KiB from %d KiB",
               (unsigned long long)c->state_piece, FY_MODEL_STATE_PIECE_MIN / 1024);
    return fy_model_arch(c)->validate(c);
}

int fy_model_config_from(const struct fy_config *cfg, struct fy_model_config *out)
{
    uint64_t v[5];
    static const char *const keys[5] = {"model.n_layer", "model.n_head", "model.n_embd",
                                        "model.vocab", "model.ctx"};
    for (int i = 0; i < 5; i++) {
        FY_TRY(fy_config_get_u64(cfg, keys[i], 1, 0, &v[i]));
        FY_REQUIRE(v[i] <= UINT32_MAX, -EINVAL, "%s: %s is too large", cfg->path, keys[i]);
    }
    *out = (struct fy_model_config){.n_layer = (uint32_t)v[0], .n_head = (uint32_t)v[1],
                                    .n_embd = (uint32_t)v[2], .vocab = (uint32_t)v[3],
                                    .ctx = (uint32_t)v[4]};
    const char *name = fy_config_get(cfg, "model.arch");
    const struct fy_arch *family = name == NULL ? &fy_arch_gpt2 : fy_arch_by_name(name);
    if (family == NULL) {
        char names[128];
        fy_arch_names(names, sizeof names, 0);
        fy_error("%s: model.arch \"%s\": expected one of %s", cfg->path, name, names);
        return -EINVAL;
    }
    out->arch = family;
    FY_TRY(family->conf_read(cfg, out));
    const char *format = fy_config_get(cfg, "model.optim_state");
    FY_REQUIRE(format == NULL || fy_optim_state_parse(format, &out->optim_state) == 0, -EINVAL,
               "%s: model.optim_state \"%s\": expected fp32, bf16 or int8", cfg->path, format);
    FY_TRY(fy_config_get_u64(cfg, "model.state_piece", 0, 0, &out->state_piece));
    return fy_model_config_validate(out);
}

int fy_model_config_to(const struct fy_model_config *c, struct fy_config *cfg)
{
    FY_TRY(fy_config_setf(cfg, "model.n_layer", "%u", c->n_layer));
    FY_TRY(fy_config_setf(cfg, "model.n_head", "%u", c->n_head));
    FY_TRY(fy_config_setf(cfg, "model.n_embd", "%u", c->n_embd));
    FY_TRY(fy_config_setf(cfg, "model.vocab", "%u", c->vocab));
    FY_TRY(fy_config_setf(cfg, "model.ctx", "%u", c->ctx));
    const struct fy_arch *a = fy_model_arch(c);
    /* GPT-2 model.conf files stay as they always were: model.arch absent means gpt2 */
    if (a != &fy_arch_gpt2)
        FY_TRY(fy_config_set(cfg, "model.arch", a->name));
    if (c->optim_state != FY_OPTIM_STATE_FP32)
        FY_TRY(fy_config_set(cfg, "model.optim_state", fy_optim_state_name(c->optim_state)));
    if (c->state_piece != 0)
        FY_TRY(
            fy_config_setf(cfg, "model.state_piece", "%llu", (unsigned long long)c->state_piece));
    return a->conf_write(c, cfg);
}

uint64_t fy_model_config_hash(const struct fy_model_config *c)
{
    uint64_t h = fy_synth_mix(0x6770742d32ull); /* "gpt-2": the common fields hash as GPT-2's did */
    const uint32_t f[5] = {c->n_layer, c->n_head, c->n_embd, c->vocab, c->ctx};
    for (int i = 0; i < 5; i++)
        h = fy_synth_mix(h ^ f[i]);
    return fy_model_arch(c)->hash(c, h);
}

void fy_model_config_describe(const struct fy_model_config *c, char *buf, size_t len)
{
    fy_model_arch(c)->describe(c, buf, len);
    size_t at = strlen(buf);
    if (at < len)
        snprintf(buf + at, len - at, ", %.2f M parameters", (double)fy_model_total_params(c) / 1e6);
}

size_t fy_model_unit_params(const struct fy_model_config *c, unsigned unit)
{
    struct fy_tensor_spec t[FY_UNIT_MAX_TENSORS];
    unsigned n = fy_unit_tensors(c, unit, t);
    return n == 0 ? 0 : t[n - 1].offset + (size_t)fy_tensor_numel(&t[n - 1]);
}

size_t fy_model_total_params(const struct fy_model_config *c)
{
    size_t n = 0;
    for (unsigned u = 0; u < fy_model_unit_count(c); u++)
        n += fy_model_unit_params(c, u);
    return n;
}

uint32_t fy_model_head_size(const struct fy_model_config *c)
{
    const struct fy_arch *a = fy_model_arch(c);
    return a->head_size != NULL ? a->head_size(c) : c->n_embd / c->n_head;
}

double fy_model_flops_per_token(const struct fy_model_config *c, unsigned seq_len)
{
    /* 6 per parameter (2 forward, 4 backward) and 6 * L * T * C for the attention scores and
     * values, the full T x T counted: the usual model-FLOPs figure, which PyTorch benchmarks and
     * the paper report too. Work the schedule adds (a block recomputed in backward) is not
     * counted, so the figure compares what different systems get done. */
    /* the attention's width: n_head heads of the head size (n_embd but where a family's head_dim
     * differs, as Qwen3's 16 heads of 128 at 1024 wide) */
    double A = (double)c->n_head * fy_model_head_size(c), L = c->n_layer;
    return 6.0 * (double)fy_model_total_params(c) + 6.0 * L * seq_len * A;
}

int fy_model_decay_segments(const struct fy_model_config *c, unsigned unit,
                            struct fy_param_segment out[FY_MODEL_MAX_SEGMENTS])
{
    struct fy_tensor_spec t[FY_UNIT_MAX_TENSORS];
    unsigned n = fy_unit_tensors(c, unit, t);
    int count = 0;
    for (unsigned i = 0; i < n; i++) {
        size_t end = t[i].offset + (size_t)fy_tensor_numel(&t[i]);
        if (count > 0 && out[count - 1].decay == t[i].decay) { /* neighbours with one flag merge */
            out[count - 1].end = end;
            continue;
        }
        FY_REQUIRE(count < FY_MODEL_MAX_SEGMENTS, -E2BIG,
                   "model: unit %u of a %s model has more than %d weight-decay segments: raise "
                   "FY_MODEL_MAX_SEGMENTS", unit, fy_model_arch(c)->label, FY_MODEL_MAX_SEGMENTS);
        out[count++] = (struct fy_param_segment){t[i].offset, end, t[i].decay};
    }
    return count;
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

void fy_model_init_unit(const struct fy_model_config *c, unsigned unit, uint64_t seed, float *params)
{
    struct fy_tensor_spec t[FY_UNIT_MAX_TENSORS];
    unsigned n = fy_unit_tensors(c, unit, t);
    const float std = 0.02f, resid_std = (float)(0.02 / sqrt(2.0 * c->n_layer));
    for (unsigned i = 0; i < n; i++) {
        float *p = params + t[i].offset;
        size_t count = (size_t)fy_tensor_numel(&t[i]);
        switch (t[i].init) {
        case FY_INIT_ZERO:
        case FY_INIT_ONE:
            for (size_t k = 0; k < count; k++)
                p[k] = t[i].init == FY_INIT_ONE ? 1.0f : 0.0f;
            break;
        case FY_INIT_NORMAL: fill_normal(p, count, t[i].offset, std, seed, unit); break;
        case FY_INIT_NORMAL_RESIDUAL: fill_normal(p, count, t[i].offset, resid_std, seed, unit); break;
        }
    }
}
