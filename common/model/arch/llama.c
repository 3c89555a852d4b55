/* The Llama family: Hugging Face's LlamaForCausalLM (RMSNorm, RoPE with optional llama3 scaling,
 * grouped-query attention without biases, SwiGLU MLP, tied or untied head), and what the Llama-like
 * families (qwen2.c, qwen3.c, mistral.c, phi3.c) share with it: the tensor table with their
 * variations (head_dim, q/k/v biases, q/k norms), config.json's shared keys, model.conf, the hash
 * and the binary slots. gpu_worker/cpu/cpu_llama.c and gpu_worker/cuda/cu_llama_units.cu compute
 * them all. */
#include "common/model/arch/llama.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"
#include "common/base/config.h"
#include "common/base/synth.h"
#include "common/model/arch/llama_like.h"

#define MAX_DIM (1u << 20)

uint32_t fy_llama_head_dim(const struct fy_model_config *c)
{
    return fy_llama(c)->head_dim ? fy_llama(c)->head_dim : c->n_embd / c->n_head;
}

/* LlamaDecoderLayer's order (the biases after the weights they go with, Qwen3's norms after
 * o_proj); matrices [out][in]; init as transformers' LlamaPreTrainedModel (biases 0). */
unsigned fy_llama_like_unit_table(const struct fy_model_config *c, enum fy_unit_kind kind,
                                  struct fy_tensor_spec *t)
{
    const struct fy_llama_fields *l = fy_llama(c);
    const uint64_t C = c->n_embd, V = c->vocab, hd = fy_llama_head_dim(c), I = l->n_inter;
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
    unsigned n = 0;
#define T(name, nd, d0, d1, decay, init)                                                           \
    (t[n++] = (struct fy_tensor_spec){"model.layers.%u." name, nd, {d0, d1}, 0, decay, init, 0})
    T("input_layernorm.weight", 1, C, 0, 0, FY_INIT_ONE);
    T("self_attn.q_proj.weight", 2, Q, C, 1, FY_INIT_NORMAL);
    T("self_attn.k_proj.weight", 2, KV, C, 1, FY_INIT_NORMAL);
    T("self_attn.v_proj.weight", 2, KV, C, 1, FY_INIT_NORMAL);
    if (l->qkv_bias) {
        T("self_attn.q_proj.bias", 1, Q, 0, 0, FY_INIT_ZERO);
        T("self_attn.k_proj.bias", 1, KV, 0, 0, FY_INIT_ZERO);
        T("self_attn.v_proj.bias", 1, KV, 0, 0, FY_INIT_ZERO);
    }
    T("self_attn.o_proj.weight", 2, C, Q, 1, FY_INIT_NORMAL);
    if (l->qk_norm) {
        T("self_attn.q_norm.weight", 1, hd, 0, 0, FY_INIT_ONE);
        T("self_attn.k_norm.weight", 1, hd, 0, 0, FY_INIT_ONE);
    }
    T("post_attention_layernorm.weight", 1, C, 0, 0, FY_INIT_ONE);
    T("mlp.gate_proj.weight", 2, I, C, 1, FY_INIT_NORMAL);
    T("mlp.up_proj.weight", 2, I, C, 1, FY_INIT_NORMAL);
    T("mlp.down_proj.weight", 2, C, I, 1, FY_INIT_NORMAL);
#undef T
    return n;
}

void fy_llama_unit_layout(const struct fy_model_config *c, struct fy_llama_unit_layout *o)
{
    const struct fy_llama_fields *l = fy_llama(c);
    size_t C = c->n_embd, hd = fy_llama_head_dim(c), Q = c->n_head * hd, KV = l->n_kv_head * hd;
    size_t I = l->n_inter, at = 0;
#define PLACE(field, n) (o->field = at, at += (n))
    PLACE(input_norm, C);
    PLACE(q_proj, Q * C);
    PLACE(k_proj, KV * C);
    PLACE(v_proj, KV * C);
    o->q_bias = FY_LLAMA_ABSENT;
    if (l->qkv_bias)
        PLACE(q_bias, Q + 2 * KV);
    PLACE(o_proj, C * Q);
    o->q_norm = o->k_norm = FY_LLAMA_ABSENT;
    if (l->qk_norm) {
        PLACE(q_norm, hd);
        PLACE(k_norm, hd);
    }
    PLACE(post_norm, C);
    PLACE(gate_proj, I * C);
    PLACE(up_proj, I * C);
    PLACE(down_proj, C * I);
#undef PLACE
    o->total = at;
}

int fy_llama_like_validate(const struct fy_model_config *c)
{
    const struct fy_llama_fields *l = fy_llama(c);
    FY_REQUIRE(fy_llama_head_dim(c) % 2 == 0 && fy_llama_head_dim(c) <= 1024, -EINVAL,
               "model: head size %u must be even for rotary embeddings, and at most 1024",
               fy_llama_head_dim(c));
    FY_REQUIRE(l->qkv_bias <= 1 && l->qk_norm <= 1, -EINVAL, "model: qkv_bias and qk_norm are 0 "
               "or 1");
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

int fy_llama_like_from_options(const struct fy_family_options *o, struct fy_model_config *c)
{
    *fy_llama_mut(c) = (struct fy_llama_fields){
        .n_kv_head = (uint32_t)(o->kv_heads != 0 ? o->kv_heads : c->n_head),
        .n_inter = (uint32_t)(o->ffn != 0 ? o->ffn : 4ull * c->n_embd),
        .tied = (uint32_t)o->tied,
        .rms_eps = (float)o->rms_eps,
        .rope_theta = o->rope_theta,
        .qkv_bias = fy_llama(c)->qkv_bias,
        .qk_norm = fy_llama(c)->qk_norm,
        .head_dim = o->head_dim == (uint64_t)c->n_embd / c->n_head ? 0 : (uint32_t)o->head_dim};
    return 0;
}

int fy_llama_like_conf_read(const struct fy_config *cfg, struct fy_model_config *c)
{
    uint64_t kv, inter, tied = 0, omax = 0, hd = 0, window = 0;
    double eps, theta, factor = 0, low = 0, high = 0;
    FY_TRY(fy_config_get_u64(cfg, "model.n_kv_head", 1, 0, &kv));
    FY_TRY(fy_config_get_u64(cfg, "model.n_inter", 1, 0, &inter));
    FY_TRY(fy_config_get_u64(cfg, "model.tied", 0, 0, &tied));
    FY_TRY(fy_config_get_double(cfg, "model.rms_eps", 1, 0, &eps));
    FY_TRY(fy_config_get_double(cfg, "model.rope_theta", 1, 0, &theta));
    FY_TRY(fy_config_get_u64(cfg, "model.head_dim", 0, 0, &hd));
    FY_TRY(fy_config_get_u64(cfg, "model.sliding_window", 0, 0, &window));
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
    FY_REQUIRE(kv <= UINT32_MAX && inter <= UINT32_MAX && tied <= 1 && omax <= UINT32_MAX &&
                   hd <= UINT32_MAX && window <= UINT32_MAX, -EINVAL,
               "%s: a model.* value is out of range", cfg->path);
    /* the flags a family implies (qkv_bias, qk_norm) are set by its conf_read around this */
    uint32_t qkv_bias = fy_llama(c)->qkv_bias, qk_norm = fy_llama(c)->qk_norm;
    *fy_llama_mut(c) = (struct fy_llama_fields){.n_kv_head = (uint32_t)kv,
                                                .n_inter = (uint32_t)inter,
                                                .tied = (uint32_t)tied,
                                                .rope_type = rope_type,
                                                .rope_orig_max_pos = (uint32_t)omax,
                                                .rms_eps = (float)eps,
                                                .rope_theta = theta,
                                                .rope_factor = factor,
                                                .rope_low_freq_factor = low,
                                                .rope_high_freq_factor = high,
                                                .head_dim = (uint32_t)hd,
                                                .qkv_bias = qkv_bias,
                                                .qk_norm = qk_norm,
                                                .sliding_window = (uint32_t)window};
    return 0;
}

int fy_llama_like_conf_write(const struct fy_model_config *c, struct fy_config *cfg)
{
    const struct fy_llama_fields *l = fy_llama(c);
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
    if (l->head_dim != 0) /* Llama's model.conf stays as it was: these keys only where they apply */
        FY_TRY(fy_config_setf(cfg, "model.head_dim", "%u", l->head_dim));
    if (l->sliding_window != 0)
        FY_TRY(fy_config_setf(cfg, "model.sliding_window", "%u", l->sliding_window));
    return 0;
}

/* rope_parameters (transformers 5) or rope_theta and rope_scaling (earlier versions). */
static int llama_hf_rope(const char *path, const cJSON *root, double theta_default,
                         struct fy_llama_fields *l)
{
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    const cJSON *scaling = rp != NULL && !cJSON_IsNull(rp) ? rp : rs;
    const char *skey = scaling == rp ? "rope_parameters" : "rope_scaling";
    FY_REQUIRE(scaling == NULL || cJSON_IsNull(scaling) || cJSON_IsObject(scaling), -EINVAL,
               "%s: \"%s\" must be an object", path, skey);
    if (scaling == rp && rp != NULL && !cJSON_IsNull(rp))
        FY_TRY(fy_json_number(path, rp, "rope_theta", theta_default, &l->rope_theta));
    else
        FY_TRY(fy_json_number(path, root, "rope_theta", theta_default, &l->rope_theta));
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

int fy_llama_like_hf_read(const char *path, const cJSON *root, const struct fy_llama_defaults *d,
                          struct fy_model_config *m)
{
    struct fy_llama_fields *l = fy_llama_mut(m);
    FY_TRY(fy_json_architectures(path, root, fy_model_arch(m)));
    FY_TRY(fy_json_uint(path, root, "num_hidden_layers", d->n_layer, &m->n_layer));
    FY_TRY(fy_json_uint(path, root, "num_attention_heads", d->n_head, &m->n_head));
    FY_TRY(fy_json_uint(path, root, "hidden_size", d->n_embd, &m->n_embd));
    FY_TRY(fy_json_uint(path, root, "vocab_size", d->vocab, &m->vocab));
    FY_TRY(fy_json_uint(path, root, "max_position_embeddings", d->ctx, &m->ctx));
    FY_TRY(fy_json_uint(path, root, "intermediate_size", d->n_inter, &l->n_inter));
    FY_TRY(fy_json_uint(path, root, "num_key_value_heads", m->n_head, &l->n_kv_head));
    FY_REQUIRE(m->n_head <= m->n_embd && m->n_embd % m->n_head == 0, -EINVAL,
               "%s: \"num_attention_heads\" %u does not divide \"hidden_size\" %u", path,
               m->n_head, m->n_embd);
    const cJSON *hdj = cJSON_GetObjectItemCaseSensitive(root, "head_dim");
    if (hdj != NULL && !cJSON_IsNull(hdj)) {
        uint32_t hd;
        FY_TRY(fy_json_uint(path, root, "head_dim", 0, &hd));
        l->head_dim = hd == m->n_embd / m->n_head ? 0 : hd; /* 0: the usual size */
    }
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    const char *a = act == NULL ? "silu" : cJSON_IsString(act) ? act->valuestring : "";
    FY_REQUIRE(strcmp(a, "silu") == 0, -EINVAL,
               "%s: \"hidden_act\": \"%s\" is not supported (the MLP is SwiGLU with silu)", path, a);
    FY_TRY(fy_json_bool(path, root, "mlp_bias", 0, 0, "the MLP projections have no bias"));
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(root, "pretraining_tp");
    FY_REQUIRE(tp == NULL || cJSON_IsNull(tp) || (cJSON_IsNumber(tp) && tp->valuedouble == 1),
               -EINVAL, "%s: \"pretraining_tp\" must be 1", path);
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    FY_REQUIRE(tie == NULL || cJSON_IsBool(tie), -EINVAL,
               "%s: \"tie_word_embeddings\" must be true or false", path);
    l->tied = tie == NULL ? d->tied : cJSON_IsTrue(tie);
    double eps;
    FY_TRY(fy_json_number(path, root, "rms_norm_eps", d->rms_eps, &eps));
    l->rms_eps = (float)eps;
    FY_TRY(llama_hf_rope(path, root, d->rope_theta, l));
    FY_REQUIRE(m->n_layer <= 4096 && m->n_embd <= 65536 && m->vocab >= 2 &&
                   m->vocab <= (1u << 20) && m->ctx <= (1u << 20),
               -EINVAL, "%s: sizes out of range (at most 4096 layers, hidden_size 65536, "
               "vocab_size and max_position_embeddings 2..%u)", path, 1u << 20);
    return 0;
}

int fy_llama_like_hf_window(const char *path, const cJSON *root, int has_switch,
                            struct fy_model_config *m)
{
    const cJSON *use = cJSON_GetObjectItemCaseSensitive(root, "use_sliding_window");
    if (has_switch) {
        /* Qwen2's and Qwen3's window applies only when this is true (and then to some layers) */
        FY_TRY(fy_json_bool(path, root, "use_sliding_window", 0, 0,
                            "every layer attends to every earlier position"));
        return 0;
    }
    FY_REQUIRE(use == NULL, -EINVAL, "%s: \"use_sliding_window\" is not a key of model_type %s",
               path, fy_model_arch(m)->hf_model_type);
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    if (w == NULL || cJSON_IsNull(w))
        return 0;
    FY_TRY(fy_json_uint(path, root, "sliding_window", 0, &fy_llama_mut(m)->sliding_window));
    return 0;
}

static const struct fy_llama_defaults llama_defaults = {
    .n_layer = 32, .n_head = 32, .n_embd = 4096, .vocab = 32000, .ctx = 2048, .n_inter = 11008,
    .rms_eps = 1e-6, .rope_theta = 10000.0, .tied = 0};

/* LlamaConfig: attention without biases (attention_bias true adds o_proj's too: not computed). */
static int llama_hf_config_read(const char *path, const cJSON *root, struct fy_model_config *m)
{
    *m = (struct fy_model_config){.arch = &fy_arch_llama};
    FY_TRY(fy_json_bool(path, root, "attention_bias", 0, 0, "q/k/v/o projections have no bias"));
    FY_TRY(fy_llama_like_hf_read(path, root, &llama_defaults, m));
    return 0;
}

char *fy_llama_like_hf_write(const struct fy_model_config *m, const char *torch_dtype,
                             const char *model_type, const char *architecture, const char *extra)
{
    enum { CAP = 4096 };
    const struct fy_llama_fields *l = fy_llama(m);
    char *text = malloc(CAP);
    if (text == NULL)
        return NULL;
    char eps[32], theta[40], scaling[512] = "null", window[48] = "";
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
    if (l->sliding_window != 0)
        snprintf(window, sizeof window, "  \"sliding_window\": %u,\n", l->sliding_window);
    snprintf(text, CAP,
             "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n"
             "  \"vocab_size\": %u,\n  \"hidden_size\": %u,\n  \"intermediate_size\": %u,\n"
             "  \"num_hidden_layers\": %u,\n  \"num_attention_heads\": %u,\n"
             "  \"num_key_value_heads\": %u,\n  \"head_dim\": %u,\n"
             "  \"max_position_embeddings\": %u,\n  \"hidden_act\": \"silu\",\n"
             "  \"rms_norm_eps\": %s,\n  \"rope_theta\": %s,\n  \"rope_scaling\": %s,\n%s%s"
             "  \"attention_dropout\": 0.0,\n  \"initializer_range\": 0.02,\n"
             "  \"tie_word_embeddings\": %s,\n  \"bos_token_id\": %u,\n  \"eos_token_id\": %u,\n"
             "  \"use_cache\": true,\n  \"dtype\": \"%s\"\n}\n",
             architecture, model_type, m->vocab, m->n_embd, l->n_inter, m->n_layer, m->n_head,
             l->n_kv_head, fy_llama_head_dim(m), m->ctx, eps, theta, scaling, window, extra,
             l->tied ? "true" : "false", m->vocab - 1, m->vocab - 1, torch_dtype);
    return text;
}

static char *llama_hf_config_write(const struct fy_model_config *m, const char *torch_dtype)
{
    return fy_llama_like_hf_write(m, torch_dtype, "llama", "LlamaForCausalLM",
                                  "  \"attention_bias\": false,\n  \"mlp_bias\": false,\n"
                                  "  \"pretraining_tp\": 1,\n");
}

/* A Llama-like checkpoint holds parameters alone. */
int fy_llama_like_hf_is_buffer(const struct fy_model_config *c, const char *name) { return 0; }

int fy_llama_like_head_tied(const struct fy_model_config *c) { return fy_llama(c)->tied != 0; }

static uint64_t bits64(double v)
{
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

/* The fields in their slots: kv heads, inter, tied, rope type, original positions, eps bits, then
 * theta, factor, low and high as two slots each (low half first); then head_dim, qkv_bias,
 * qk_norm, sliding_window (zero for Llama, as records made before them hold). */
void fy_llama_like_slots_write(const struct fy_model_config *c, uint32_t *slots)
{
    const struct fy_llama_fields *l = fy_llama(c);
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
    slots[14] = l->head_dim;
    slots[15] = l->qkv_bias;
    slots[16] = l->qk_norm;
    slots[17] = l->sliding_window;
}

void fy_llama_like_slots_read(const uint32_t *slots, struct fy_model_config *c)
{
    struct fy_llama_fields *l = fy_llama_mut(c);
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
    l->head_dim = slots[14];
    l->qkv_bias = slots[15];
    l->qk_norm = slots[16];
    l->sliding_window = slots[17];
}

/* Every field, after the family's id; the variations only where one is set, so that a Llama
 * hashes as it always has. */
uint64_t fy_llama_like_hash(const struct fy_model_config *c, uint64_t h)
{
    const struct fy_llama_fields *l = fy_llama(c);
    uint32_t eps;
    memcpy(&eps, &l->rms_eps, sizeof eps);
    const uint64_t g[12] = {0x6c6c616d61ull /* "llama" */, fy_model_arch(c)->id, l->n_kv_head,
                            l->n_inter, l->tied, l->rope_type, l->rope_orig_max_pos, eps,
                            bits64(l->rope_theta), bits64(l->rope_factor),
                            bits64(l->rope_low_freq_factor), bits64(l->rope_high_freq_factor)};
    for (int i = 0; i < 12; i++)
        h = fy_synth_mix(h ^ g[i]);
    if (l->head_dim == 0 && l->qkv_bias == 0 && l->qk_norm == 0 && l->sliding_window == 0)
        return h;
    const uint64_t v[4] = {l->head_dim, l->qkv_bias, l->qk_norm, l->sliding_window};
    for (int i = 0; i < 4; i++)
        h = fy_synth_mix(h ^ v[i]);
    return h;
}

void fy_llama_like_describe(const struct fy_model_config *c, char *buf, size_t len)
{
    const struct fy_llama_fields *l = fy_llama(c);
    char extra[96] = "";
    if (l->head_dim != 0)
        snprintf(extra, sizeof extra, ", head size %u", l->head_dim);
    if (l->sliding_window != 0)
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", window %u",
                 l->sliding_window);
    snprintf(buf, len,
             "%s: %u layers, %u heads (%u kv), %u wide, MLP %u, vocab %u, context %u, %s "
             "head, rope theta %g%s%s",
             fy_model_arch(c)->label, c->n_layer, c->n_head, l->n_kv_head, c->n_embd, l->n_inter,
             c->vocab, c->ctx, l->tied ? "tied" : "untied", l->rope_theta,
             l->rope_type == FY_ROPE_LLAMA3 ? " (llama3 scaling)" : "", extra);
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
    .validate = fy_llama_like_validate,
    .from_options = fy_llama_like_from_options,
    .conf_read = fy_llama_like_conf_read,
    .conf_write = fy_llama_like_conf_write,
    .hf_config_read = llama_hf_config_read,
    .hf_config_write = llama_hf_config_write,
    .hf_is_buffer = fy_llama_like_hf_is_buffer,
    .head_tied = fy_llama_like_head_tied,
    .slots_write = fy_llama_like_slots_write,
    .slots_read = fy_llama_like_slots_read,
    .hash = fy_llama_like_hash,
    .describe = fy_llama_like_describe,
    .head_size = fy_llama_head_dim,
    .unit_table = fy_llama_like_unit_table,
};
