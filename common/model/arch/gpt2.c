/* The GPT-2 family: Hugging Face's GPT2LMHeadModel (LayerNorm, fused QKV with biases, GELU (tanh)
 * MLP 4C wide, learned positions, the LM head tied to wte). Its tensor table is the one place that
 * says each tensor's name, shape, decay and init; gpu_worker/cpu/cpu_gpt2.c and
 * gpu_worker/cuda/cu_gpt2_units.cu compute it. */
#include "common/model/arch/gpt2.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/base/check.h"
#include "common/model/arch/arch.h"
#include "common/model/arch/json.h"

/* Hugging Face's module order is the unit's order. Conv1D weights are stored [in][out]. */
static unsigned gpt2_unit_table(const struct fy_model_config *c, enum fy_unit_kind kind,
                                struct fy_tensor_spec *t)
{
    const uint64_t C = c->n_embd, V = c->vocab, T = c->ctx;
    if (kind == FY_UNIT_EMBED) {
        t[0] = (struct fy_tensor_spec){"wte.weight", 2, {V, C}, 0, 1, FY_INIT_NORMAL, 0};
        t[1] = (struct fy_tensor_spec){"wpe.weight", 2, {T, C}, 0, 1, FY_INIT_NORMAL, 0};
        return 2;
    }
    if (kind == FY_UNIT_FINAL) {
        t[0] = (struct fy_tensor_spec){"ln_f.weight", 1, {C}, 0, 0, FY_INIT_ONE, 0};
        t[1] = (struct fy_tensor_spec){"ln_f.bias", 1, {C}, 0, 0, FY_INIT_ZERO, 0};
        return 2;
    }
    const struct fy_tensor_spec block[] = {
        {"h.%u.ln_1.weight", 1, {C}, 0, 0, FY_INIT_ONE, 0},
        {"h.%u.ln_1.bias", 1, {C}, 0, 0, FY_INIT_ZERO, 0},
        {"h.%u.attn.c_attn.weight", 2, {C, 3 * C}, 1, 1, FY_INIT_NORMAL, 0},
        {"h.%u.attn.c_attn.bias", 1, {3 * C}, 0, 0, FY_INIT_ZERO, 0},
        {"h.%u.attn.c_proj.weight", 2, {C, C}, 1, 1, FY_INIT_NORMAL_RESIDUAL, 0},
        {"h.%u.attn.c_proj.bias", 1, {C}, 0, 0, FY_INIT_ZERO, 0},
        {"h.%u.ln_2.weight", 1, {C}, 0, 0, FY_INIT_ONE, 0},
        {"h.%u.ln_2.bias", 1, {C}, 0, 0, FY_INIT_ZERO, 0},
        {"h.%u.mlp.c_fc.weight", 2, {C, 4 * C}, 1, 1, FY_INIT_NORMAL, 0},
        {"h.%u.mlp.c_fc.bias", 1, {4 * C}, 0, 0, FY_INIT_ZERO, 0},
        {"h.%u.mlp.c_proj.weight", 2, {4 * C, C}, 1, 1, FY_INIT_NORMAL_RESIDUAL, 0},
        {"h.%u.mlp.c_proj.bias", 1, {C}, 0, 0, FY_INIT_ZERO, 0},
    };
    memcpy(t, block, sizeof block);
    return sizeof block / sizeof block[0];
}

void fy_gpt2_block_layout(const struct fy_model_config *c, struct fy_gpt2_block_layout *o)
{
    struct fy_tensor_spec t[FY_UNIT_MAX_TENSORS];
    fy_unit_tensors(c, 1, t);
    size_t *field[] = {&o->ln1_w, &o->ln1_b, &o->qkv_w, &o->qkv_b, &o->attn_w, &o->attn_b,
                       &o->ln2_w, &o->ln2_b, &o->fc_w,  &o->fc_b,  &o->proj_w, &o->proj_b};
    for (unsigned i = 0; i < 12; i++)
        *field[i] = t[i].offset;
    o->total = t[11].offset + fy_tensor_numel(&t[11]);
}

static int gpt2_validate(const struct fy_model_config *c) { return 0; }

static int gpt2_from_options(const struct fy_family_options *o, struct fy_model_config *c)
{
    FY_REQUIRE(o->kv_heads == 0 && o->ffn == 0 && o->head_dim == 0 && !o->tied &&
                   o->rope_theta == 10000.0 && o->rms_eps == 1e-5,
               -EINVAL, "init: --kv-heads, --ffn, --head-dim, --rope-theta, --rms-eps and --tied "
               "are not options of --arch gpt2 (its MLP is 4 x --embd, its head tied)");
    return 0;
}

/* GPT-2's model.conf has the common keys alone, as it always had. */
static int gpt2_conf_read(const struct fy_config *cfg, struct fy_model_config *c) { return 0; }
static int gpt2_conf_write(const struct fy_model_config *c, struct fy_config *cfg) { return 0; }

static int gpt2_hf_config_read(const char *path, const cJSON *root, struct fy_model_config *m)
{
    *m = (struct fy_model_config){.arch = &fy_arch_gpt2};
    FY_TRY(fy_json_architectures(path, root, &fy_arch_gpt2));
    uint32_t inner = 0;
    FY_TRY(fy_json_uint(path, root, "n_layer", 12, &m->n_layer));
    FY_TRY(fy_json_uint(path, root, "n_head", 12, &m->n_head));
    FY_TRY(fy_json_uint(path, root, "n_embd", 768, &m->n_embd));
    FY_TRY(fy_json_uint(path, root, "vocab_size", 50257, &m->vocab));
    FY_TRY(fy_json_uint(path, root, "n_positions", 1024, &m->ctx));
    const cJSON *ni = cJSON_GetObjectItemCaseSensitive(root, "n_inner");
    if (ni != NULL && !cJSON_IsNull(ni)) {
        FY_TRY(fy_json_uint(path, root, "n_inner", 0, &inner));
        FY_REQUIRE((uint64_t)inner == 4ull * m->n_embd, -EINVAL,
                   "%s: \"n_inner\": %u is not supported (the MLP is 4 * n_embd = %llu wide here)",
                   path, inner, 4ull * m->n_embd);
    }
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "activation_function");
    const char *a = act == NULL ? "gelu_new" : cJSON_IsString(act) ? act->valuestring : "";
    FY_REQUIRE(strcmp(a, "gelu_new") == 0 || strcmp(a, "gelu_pytorch_tanh") == 0, -EINVAL,
               "%s: \"activation_function\": \"%s\" is not supported (the backends compute the tanh "
               "approximation, gelu_new)",
               path, a);
    const cJSON *eps = cJSON_GetObjectItemCaseSensitive(root, "layer_norm_epsilon");
    FY_REQUIRE(eps == NULL || (cJSON_IsNumber(eps) && eps->valuedouble == 1e-5), -EINVAL,
               "%s: \"layer_norm_epsilon\": %g is not supported (the backends' LayerNorm uses 1e-5)",
               path, cJSON_IsNumber(eps) ? eps->valuedouble : NAN);
    FY_TRY(fy_json_bool(path, root, "scale_attn_weights", 1, 1,
                        "attention scores are scaled by 1/sqrt(head size)"));
    FY_TRY(fy_json_bool(path, root, "scale_attn_by_inverse_layer_idx", 0, 0,
                        "attention scores are not scaled by layer"));
    FY_TRY(fy_json_bool(path, root, "add_cross_attention", 0, 0, "decoder-only blocks"));
    FY_TRY(fy_json_bool(path, root, "tie_word_embeddings", 1, 1, "the LM head is tied to wte"));
    /* common/model/model.c's limits, stated here so that the one line names this file and the
     * key */
    FY_REQUIRE(m->n_layer <= 4096, -EINVAL, "%s: \"n_layer\" %u: at most 4096 layers", path,
               m->n_layer);
    FY_REQUIRE(m->n_embd <= 65536, -EINVAL, "%s: \"n_embd\" %u: at most 65536", path, m->n_embd);
    FY_REQUIRE(m->n_embd % m->n_head == 0, -EINVAL,
               "%s: \"n_head\" %u does not divide \"n_embd\" %u", path, m->n_head, m->n_embd);
    FY_REQUIRE(m->vocab >= 2 && m->vocab <= (1u << 20) && m->ctx <= (1u << 20), -EINVAL,
               "%s: \"vocab_size\" %u or \"n_positions\" %u outside 2..%u", path, m->vocab,
               m->ctx, 1u << 20);
    return 0;
}

static char *gpt2_hf_config_write(const struct fy_model_config *m, const char *torch_dtype)
{
    char *text = malloc(2048);
    if (text == NULL)
        return NULL;
    snprintf(text, 2048,
             "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
             "  \"vocab_size\": %u,\n  \"n_positions\": %u,\n  \"n_ctx\": %u,\n  \"n_embd\": %u,\n"
             "  \"n_layer\": %u,\n  \"n_head\": %u,\n  \"n_inner\": null,\n"
             "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": 1e-05,\n"
             "  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n"
             "  \"initializer_range\": 0.02,\n  \"scale_attn_weights\": true,\n"
             "  \"scale_attn_by_inverse_layer_idx\": false,\n  \"reorder_and_upcast_attn\": false,\n"
             "  \"tie_word_embeddings\": true,\n  \"bos_token_id\": %u,\n  \"eos_token_id\": %u,\n"
             "  \"dtype\": \"%s\"\n}\n",
             m->vocab, m->ctx, m->ctx, m->n_embd, m->n_layer, m->n_head, m->vocab - 1, m->vocab - 1,
             torch_dtype);
    return text;
}

/* The attention mask buffers of block i < L ("h.01." is not block 1's). */
static int gpt2_hf_is_buffer(const struct fy_model_config *c, const char *name)
{
    unsigned i;
    int n = 0;
    if (sscanf(name, "h.%u.%n", &i, &n) != 1 || n == 0 || i >= c->n_layer)
        return 0;
    char canon[32];
    snprintf(canon, sizeof canon, "h.%u.", i);
    if (strncmp(name, canon, strlen(canon)) != 0)
        return 0;
    return strcmp(name + n, "attn.bias") == 0 || strcmp(name + n, "attn.masked_bias") == 0;
}

/* GPT-2 has no fields of its own: its slots stay zero. */
static void gpt2_slots_write(const struct fy_model_config *c, uint32_t slots[FY_FAMILY_SLOTS]) {}
static void gpt2_slots_read(const uint32_t slots[FY_FAMILY_SLOTS], struct fy_model_config *c) {}

static int gpt2_head_tied(const struct fy_model_config *c) { return 1; }

/* GPT-2 hashes its common fields alone, as it always has. */
static uint64_t gpt2_hash(const struct fy_model_config *c, uint64_t h) { return h; }

static void gpt2_describe(const struct fy_model_config *c, char *buf, size_t len)
{
    snprintf(buf, len, "GPT: %u layers, %u heads, %u wide, vocab %u, context %u", c->n_layer,
             c->n_head, c->n_embd, c->vocab, c->ctx);
}

static const char *const gpt2_hf_architectures[] = {"GPT2LMHeadModel", "GPT2Model", NULL};

const struct fy_arch fy_arch_gpt2 = {
    .id = 0,
    .name = "gpt2",
    .label = "GPT-2",
    .hf_model_type = "gpt2",
    .hf_architectures = gpt2_hf_architectures,
    .hf_prefix = "transformer.",
    .swaps_internals = 1,
    .validate = gpt2_validate,
    .from_options = gpt2_from_options,
    .conf_read = gpt2_conf_read,
    .conf_write = gpt2_conf_write,
    .hf_config_read = gpt2_hf_config_read,
    .hf_config_write = gpt2_hf_config_write,
    .hf_is_buffer = gpt2_hf_is_buffer,
    .head_tied = gpt2_head_tied,
    .slots_write = gpt2_slots_write,
    .slots_read = gpt2_slots_read,
    .hash = gpt2_hash,
    .describe = gpt2_describe,
    .unit_table = gpt2_unit_table,
};
