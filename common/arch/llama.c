/* The Llama family: Hugging Face's LlamaForCausalLM (RMSNorm, RoPE with optional llama3 scaling,
 * grouped-query attention without biases, SwiGLU MLP, tied or untied head). Its tensor table is the
 * one place that says each tensor's name, shape, decay and init; gpu_worker/cpu/llama_cpu.c and
 * gpu_worker/cuda/cu_llama_units.cu compute it. */
#include "llama.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "common/check.h"
#include "common/config.h"
#include "common/synth.h"

#define MAX_DIM (1u << 20)

/* LlamaDecoderLayer's order; matrices [out][in]; init as transformers' LlamaPreTrainedModel. */
static unsigned llama_unit_table(const struct fy_model_config *c, enum fy_unit_kind kind,
                                 struct fy_tensor_spec *t)
{
    const struct fy_llama_fields *l = &c->llama;
    const uint64_t C = c->n_embd, V = c->vocab, hd = C / c->n_head, I = l->n_inter;
    const uint64_t Q = c->n_head * hd, KV = l->n_kv_head * hd;
    if (kind == FY_UNIT_EMBED) {
        t[0] = (struct fy_tensor_spec){"model.embed_tokens.weight", 2, {V, C}, 0, 1, FY_INIT_NORMAL, 0};
        return 1;
    }
    if (kind == FY_UNIT_FINAL) {
        t[0] = (struct fy_tensor_spec){"model.norm.weight", 1, {C}, 0, 0, FY_INIT_ONE, 0};
        if (l->tied)
            return 1;
        t[1] = (struct fy_tensor_spec){"lm_head.weight", 2, {V, C}, 0, 1, FY_INIT_NORMAL, 0};
        return 2;
    }
    const struct fy_tensor_spec block[] = {
        {"model.layers.%u.input_layernorm.weight", 1, {C}, 0, 0, FY_INIT_ONE, 0},
        {"model.layers.%u.self_attn.q_proj.weight", 2, {Q, C}, 0, 1, FY_INIT_NORMAL, 0},
        {"model.layers.%u.self_attn.k_proj.weight", 2, {KV, C}, 0, 1, FY_INIT_NORMAL, 0},
        {"model.layers.%u.self_attn.v_proj.weight", 2, {KV, C}, 0, 1, FY_INIT_NORMAL, 0},
        {"model.layers.%u.self_attn.o_proj.weight", 2, {C, Q}, 0, 1, FY_INIT_NORMAL, 0},
        {"model.layers.%u.post_attention_layernorm.weight", 1, {C}, 0, 0, FY_INIT_ONE, 0},
        {"model.layers.%u.mlp.gate_proj.weight", 2, {I, C}, 0, 1, FY_INIT_NORMAL, 0},
        {"model.layers.%u.mlp.up_proj.weight", 2, {I, C}, 0, 1, FY_INIT_NORMAL, 0},
        {"model.layers.%u.mlp.down_proj.weight", 2, {C, I}, 0, 1, FY_INIT_NORMAL, 0},
    };
    memcpy(t, block, sizeof block);
    return sizeof block / sizeof block[0];
}

void fy_llama_unit_layout(const struct fy_model_config *c, struct fy_llama_unit_layout *o)
{
    struct fy_tensor_spec t[FY_UNIT_MAX_TENSORS];
    fy_unit_tensors(c, 1, t);
    size_t *field[] = {&o->input_norm, &o->q_proj,    &o->k_proj,  &o->v_proj,   &o->o_proj,
                       &o->post_norm,  &o->gate_proj, &o->up_proj, &o->down_proj};
    for (unsigned i = 0; i < 9; i++)
        *field[i] = t[i].offset;
    o->total = t[8].offset + fy_tensor_numel(&t[8]);
}

static int llama_validate(const struct fy_model_config *c)
{
    const struct fy_llama_fields *l = &c->llama;
    FY_REQUIRE((c->n_embd / c->n_head) % 2 == 0, -EINVAL,
               "model: head size %u (n_embd / n_head) must be even for rotary embeddings",
               c->n_embd / c->n_head);
    FY_REQUIRE(l->n_kv_head >= 1 && c->n_head % l->n_kv_head == 0, -EINVAL,
               "model: n_kv_head %u must divide n_head %u", l->n_kv_head, c->n_head);
    FY_REQUIRE(l->n_inter >= 1 && l->n_inter <= MAX_DIM, -EINVAL,
               "model: n_inter %u must be between 1 and %u", l->n_inter, MAX_DIM);
    FY_REQUIRE(l->tied <= 1, -EINVAL, "model: tied must be 0 or 1, not %u", l->tied);
    FY_REQUIRE(l->rms_eps > 0.0f && isfinite(l->rms_eps), -EINVAL,
               "model: rms_eps %g must be positive", (double)l->rms_eps);
    FY_REQUIRE(l->rope_theta > 0.0 && isfinite(l->rope_theta), -EINVAL,
               "model: rope_theta %g must be positive", l->rope_theta);
    FY_REQUIRE(l->rope_type == FY_ROPE_DEFAULT || l->rope_type == FY_ROPE_LLAMA3, -EINVAL,
               "model: unknown rope type %u", l->rope_type);
    if (l->rope_type == FY_ROPE_LLAMA3) {
        FY_REQUIRE(l->rope_factor > 0.0 && isfinite(l->rope_factor), -EINVAL,
                   "model: rope_factor %g must be positive", l->rope_factor);
        FY_REQUIRE(l->rope_low_freq_factor > 0.0 &&
                       l->rope_high_freq_factor > l->rope_low_freq_factor &&
                       isfinite(l->rope_high_freq_factor),
                   -EINVAL, "model: rope_low_freq_factor %g and rope_high_freq_factor %g must "
                   "satisfy 0 < low < high", l->rope_low_freq_factor, l->rope_high_freq_factor);
        FY_REQUIRE(l->rope_orig_max_pos >= 1, -EINVAL,
                   "model: rope_original_max_pos must be positive");
    }
    return 0;
}

static int llama_from_options(const struct fy_family_options *o, struct fy_model_config *c)
{
    c->llama = (struct fy_llama_fields){
        .n_kv_head = (uint32_t)(o->kv_heads != 0 ? o->kv_heads : c->n_head),
        .n_inter = (uint32_t)(o->ffn != 0 ? o->ffn : 4ull * c->n_embd),
        .tied = (uint32_t)o->tied, .rms_eps = (float)o->rms_eps, .rope_theta = o->rope_theta};
    return 0;
}

static int llama_conf_read(const struct fy_config *cfg, struct fy_model_config *c)
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
    c->llama = (struct fy_llama_fields){
        .n_kv_head = (uint32_t)kv, .n_inter = (uint32_t)inter, .tied = (uint32_t)tied,
        .rope_type = rope_type, .rope_orig_max_pos = (uint32_t)omax, .rms_eps = (float)eps,
        .rope_theta = theta, .rope_factor = factor, .rope_low_freq_factor = low,
        .rope_high_freq_factor = high};
    return 0;
}

static int llama_conf_write(const struct fy_model_config *c, struct fy_config *cfg)
{
    const struct fy_llama_fields *l = &c->llama;
    FY_TRY(fy_config_setf(cfg, "model.n_kv_head", "%u", l->n_kv_head));
    FY_TRY(fy_config_setf(cfg, "model.n_inter", "%u", l->n_inter));
    FY_TRY(fy_config_setf(cfg, "model.tied", "%u", l->tied));
    FY_TRY(fy_config_setf(cfg, "model.rms_eps", "%.9g", (double)l->rms_eps));
    FY_TRY(fy_config_setf(cfg, "model.rope_theta", "%.17g", l->rope_theta));
    FY_TRY(fy_config_set(cfg, "model.rope_type", l->rope_type == FY_ROPE_LLAMA3 ? "llama3" : "default"));
    if (l->rope_type == FY_ROPE_LLAMA3) {
        FY_TRY(fy_config_setf(cfg, "model.rope_factor", "%.17g", l->rope_factor));
        FY_TRY(fy_config_setf(cfg, "model.rope_low_freq_factor", "%.17g", l->rope_low_freq_factor));
        FY_TRY(fy_config_setf(cfg, "model.rope_high_freq_factor", "%.17g", l->rope_high_freq_factor));
        FY_TRY(fy_config_setf(cfg, "model.rope_original_max_pos", "%u", l->rope_orig_max_pos));
    }
    return 0;
}

/* rope_parameters (transformers 5) or rope_theta and rope_scaling (earlier versions). */
static int llama_hf_rope(const char *path, const cJSON *root, struct fy_llama_fields *l)
{
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    const cJSON *scaling = rp != NULL && !cJSON_IsNull(rp) ? rp : rs;
    const char *skey = scaling == rp ? "rope_parameters" : "rope_scaling";
    FY_REQUIRE(scaling == NULL || cJSON_IsNull(scaling) || cJSON_IsObject(scaling), -EINVAL,
               "%s: \"%s\" must be an object", path, skey);
    if (scaling == rp && rp != NULL && !cJSON_IsNull(rp))
        FY_TRY(fy_json_number(path, rp, "rope_theta", 10000.0, &l->rope_theta));
    else
        FY_TRY(fy_json_number(path, root, "rope_theta", 10000.0, &l->rope_theta));
    l->rope_type = FY_ROPE_DEFAULT;
    if (scaling == NULL || !cJSON_IsObject(scaling))
        return 0;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(scaling, "rope_type");
    if (t == NULL)
        t = cJSON_GetObjectItemCaseSensitive(scaling, "type");
    const char *type = cJSON_IsString(t) ? t->valuestring : "default";
    if (strcmp(type, "llama3") == 0) {
        l->rope_type = FY_ROPE_LLAMA3;
        FY_TRY(fy_json_number(path, scaling, "factor", 8.0, &l->rope_factor));
        FY_TRY(fy_json_number(path, scaling, "low_freq_factor", 1.0, &l->rope_low_freq_factor));
        FY_TRY(fy_json_number(path, scaling, "high_freq_factor", 4.0, &l->rope_high_freq_factor));
        FY_TRY(fy_json_uint(path, scaling, "original_max_position_embeddings", 8192,
                            &l->rope_orig_max_pos));
        return 0;
    }
    FY_REQUIRE(strcmp(type, "default") == 0, -EINVAL,
               "%s: \"%s\": rope_type \"%s\" is not supported (plain RoPE or llama3 scaling)", path,
               skey, type);
    return 0;
}

/* LlamaConfig, transformers' defaults for absent keys. */
static int llama_hf_config_read(const char *path, const cJSON *root, struct fy_model_config *m)
{
    *m = (struct fy_model_config){.arch = &fy_arch_llama};
    struct fy_llama_fields *l = &m->llama;
    FY_TRY(fy_json_architectures(path, root, &fy_arch_llama));
    FY_TRY(fy_json_uint(path, root, "num_hidden_layers", 32, &m->n_layer));
    FY_TRY(fy_json_uint(path, root, "num_attention_heads", 32, &m->n_head));
    FY_TRY(fy_json_uint(path, root, "hidden_size", 4096, &m->n_embd));
    FY_TRY(fy_json_uint(path, root, "vocab_size", 32000, &m->vocab));
    FY_TRY(fy_json_uint(path, root, "max_position_embeddings", 2048, &m->ctx));
    FY_TRY(fy_json_uint(path, root, "intermediate_size", 11008, &l->n_inter));
    FY_TRY(fy_json_uint(path, root, "num_key_value_heads", m->n_head, &l->n_kv_head));
    FY_REQUIRE(m->n_head <= m->n_embd && m->n_embd % m->n_head == 0, -EINVAL,
               "%s: \"num_attention_heads\" %u does not divide \"hidden_size\" %u", path,
               m->n_head, m->n_embd);
    const cJSON *hdj = cJSON_GetObjectItemCaseSensitive(root, "head_dim");
    if (hdj != NULL && !cJSON_IsNull(hdj)) {
        uint32_t hd;
        FY_TRY(fy_json_uint(path, root, "head_dim", 0, &hd));
        FY_REQUIRE(hd == m->n_embd / m->n_head, -EINVAL,
                   "%s: \"head_dim\": %u is not supported (it must be hidden_size / "
                   "num_attention_heads = %u here)", path, hd, m->n_embd / m->n_head);
    }
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    const char *a = act == NULL ? "silu" : cJSON_IsString(act) ? act->valuestring : "";
    FY_REQUIRE(strcmp(a, "silu") == 0, -EINVAL,
               "%s: \"hidden_act\": \"%s\" is not supported (the MLP is SwiGLU with silu)", path, a);
    FY_TRY(fy_json_bool(path, root, "attention_bias", 0, 0, "q/k/v/o projections have no bias"));
    FY_TRY(fy_json_bool(path, root, "mlp_bias", 0, 0, "the MLP projections have no bias"));
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(root, "pretraining_tp");
    FY_REQUIRE(tp == NULL || cJSON_IsNull(tp) || (cJSON_IsNumber(tp) && tp->valuedouble == 1),
               -EINVAL, "%s: \"pretraining_tp\" must be 1", path);
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    FY_REQUIRE(tie == NULL || cJSON_IsBool(tie), -EINVAL,
               "%s: \"tie_word_embeddings\" must be true or false", path);
    l->tied = tie != NULL && cJSON_IsTrue(tie);
    double eps;
    FY_TRY(fy_json_number(path, root, "rms_norm_eps", 1e-6, &eps));
    l->rms_eps = (float)eps;
    FY_TRY(llama_hf_rope(path, root, l));
    FY_REQUIRE(m->n_layer <= 4096 && m->n_embd <= 65536 && m->vocab >= 2 &&
                   m->vocab <= (1u << 20) && m->ctx <= (1u << 20),
               -EINVAL, "%s: sizes out of range (at most 4096 layers, hidden_size 65536, "
               "vocab_size and max_position_embeddings 2..%u)", path, 1u << 20);
    return fy_model_config_validate(m);
}

/* Every key llama_hf_config_read reads, the rotary settings as rope_theta and rope_scaling, which
 * transformers 4 and 5 both take. */
static char *llama_hf_config_write(const struct fy_model_config *m, const char *torch_dtype)
{
    enum { CAP = 4096 };
    const struct fy_llama_fields *l = &m->llama;
    char *text = malloc(CAP);
    if (text == NULL)
        return NULL;
    char eps[32], theta[40], scaling[512] = "null";
    fy_json_float(eps, sizeof eps, l->rms_eps);
    fy_json_double(theta, sizeof theta, l->rope_theta);
    if (l->rope_type == FY_ROPE_LLAMA3) {
        char f[40], lo[40], hi[40];
        fy_json_double(f, sizeof f, l->rope_factor);
        fy_json_double(lo, sizeof lo, l->rope_low_freq_factor);
        fy_json_double(hi, sizeof hi, l->rope_high_freq_factor);
        snprintf(scaling, sizeof scaling,
                 "{\"rope_type\": \"llama3\", \"factor\": %s, \"low_freq_factor\": %s, "
                 "\"high_freq_factor\": %s, \"original_max_position_embeddings\": %u}",
                 f, lo, hi, l->rope_orig_max_pos);
    }
    snprintf(text, CAP,
             "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
             "  \"vocab_size\": %u,\n  \"hidden_size\": %u,\n  \"intermediate_size\": %u,\n"
             "  \"num_hidden_layers\": %u,\n  \"num_attention_heads\": %u,\n"
             "  \"num_key_value_heads\": %u,\n  \"head_dim\": %u,\n"
             "  \"max_position_embeddings\": %u,\n  \"hidden_act\": \"silu\",\n"
             "  \"rms_norm_eps\": %s,\n  \"rope_theta\": %s,\n  \"rope_scaling\": %s,\n"
             "  \"attention_bias\": false,\n  \"attention_dropout\": 0.0,\n"
             "  \"mlp_bias\": false,\n  \"pretraining_tp\": 1,\n  \"initializer_range\": 0.02,\n"
             "  \"tie_word_embeddings\": %s,\n  \"bos_token_id\": %u,\n  \"eos_token_id\": %u,\n"
             "  \"use_cache\": true,\n  \"dtype\": \"%s\"\n}\n",
             m->vocab, m->n_embd, l->n_inter, m->n_layer, m->n_head, l->n_kv_head,
             m->n_embd / m->n_head, m->ctx, eps, theta, scaling, l->tied ? "true" : "false",
             m->vocab - 1, m->vocab - 1, torch_dtype);
    return text;
}

/* A Llama checkpoint holds parameters alone. */
static int llama_hf_is_buffer(const struct fy_model_config *c, const char *name) { return 0; }

static int llama_head_tied(const struct fy_model_config *c) { return c->llama.tied != 0; }

static uint64_t bits64(double v)
{
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

/* The fields in their slots: kv heads, inter, tied, rope type, original positions, eps bits, then
 * theta, factor, low and high as two slots each (low half first). */
static void llama_slots_write(const struct fy_model_config *c, uint32_t slots[FY_FAMILY_SLOTS])
{
    const struct fy_llama_fields *l = &c->llama;
    uint32_t eps;
    memcpy(&eps, &l->rms_eps, sizeof eps);
    const uint32_t a[6] = {l->n_kv_head, l->n_inter, l->tied, l->rope_type, l->rope_orig_max_pos,
                           eps};
    memcpy(slots, a, sizeof a);
    const double d[4] = {l->rope_theta, l->rope_factor, l->rope_low_freq_factor,
                         l->rope_high_freq_factor};
    for (int i = 0; i < 4; i++) {
        uint64_t bits = bits64(d[i]);
        slots[6 + 2 * i] = (uint32_t)bits;
        slots[6 + 2 * i + 1] = (uint32_t)(bits >> 32);
    }
}

static void llama_slots_read(const uint32_t slots[FY_FAMILY_SLOTS], struct fy_model_config *c)
{
    struct fy_llama_fields *l = &c->llama;
    l->n_kv_head = slots[0];
    l->n_inter = slots[1];
    l->tied = slots[2];
    l->rope_type = slots[3];
    l->rope_orig_max_pos = slots[4];
    memcpy(&l->rms_eps, &slots[5], sizeof l->rms_eps);
    double *d[4] = {&l->rope_theta, &l->rope_factor, &l->rope_low_freq_factor,
                    &l->rope_high_freq_factor};
    for (int i = 0; i < 4; i++) {
        uint64_t bits = slots[6 + 2 * i] | (uint64_t)slots[6 + 2 * i + 1] << 32;
        memcpy(d[i], &bits, sizeof bits);
    }
}

/* Every Llama field, after the family's id. */
static uint64_t llama_hash(const struct fy_model_config *c, uint64_t h)
{
    const struct fy_llama_fields *l = &c->llama;
    uint32_t eps;
    memcpy(&eps, &l->rms_eps, sizeof eps);
    const uint64_t g[12] = {0x6c6c616d61ull /* "llama" */, fy_arch_llama.id, l->n_kv_head, l->n_inter, l->tied,
                            l->rope_type, l->rope_orig_max_pos, eps, bits64(l->rope_theta),
                            bits64(l->rope_factor), bits64(l->rope_low_freq_factor),
                            bits64(l->rope_high_freq_factor)};
    for (int i = 0; i < 12; i++)
        h = fy_synth_mix(h ^ g[i]);
    return h;
}

static void llama_describe(const struct fy_model_config *c, char *buf, size_t len)
{
    const struct fy_llama_fields *l = &c->llama;
    snprintf(buf, len,
             "Llama: %u layers, %u heads (%u kv), %u wide, MLP %u, vocab %u, context %u, %s "
             "head, rope theta %g%s, %.2f M parameters",
             c->n_layer, c->n_head, l->n_kv_head, c->n_embd, l->n_inter, c->vocab, c->ctx,
             l->tied ? "tied" : "untied", l->rope_theta,
             l->rope_type == FY_ROPE_LLAMA3 ? " (llama3 scaling)" : "",
             (double)fy_model_total_params(c) / 1e6);
}

static const char *const llama_hf_architectures[] = {"LlamaForCausalLM", NULL};

const struct fy_arch fy_arch_llama = {
    .id = 1,
    .name = "llama",
    .label = "Llama",
    .hf_model_type = "llama",
    .hf_architectures = llama_hf_architectures,
    .hf_prefix = "",
    .swaps_internals = 0,
    .validate = llama_validate,
    .from_options = llama_from_options,
    .conf_read = llama_conf_read,
    .conf_write = llama_conf_write,
    .hf_config_read = llama_hf_config_read,
    .hf_config_write = llama_hf_config_write,
    .hf_is_buffer = llama_hf_is_buffer,
    .head_tied = llama_head_tied,
    .slots_write = llama_slots_write,
    .slots_read = llama_slots_read,
    .hash = llama_hash,
    .describe = llama_describe,
    .unit_table = llama_unit_table,
};
