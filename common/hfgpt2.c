/* Hugging Face GPT-2 import and export (mapping in hfgpt2.h): config.json checked against what the
 * backends compute, every tensor name and shape checked before any data is read, units filled one
 * at a time (Conv1D weights transposed), and exports written into a temporary directory beside the
 * target and renamed into place only when whole. */
#include "hfgpt2.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "fsutil.h"
#include "safetensors.h"

/* config.json is a few kB; a bound keeps a wrong file (a checkpoint renamed) out of memory. */
#define HF_MAX_JSON (16u << 20)
#define HF_NAME_MAX 160
#define HF_PREFIX "transformer."
#define HF_BLOCK_PARAMS 12
#define HF_SOURCE_FORMAT "fuyou-hf-gpt2-source"

/* One parameter as Hugging Face stores it and where it lives in a unit. */
struct hf_param {
    char name[HF_NAME_MAX]; /* without the prefix */
    size_t offset;          /* floats into the unit */
    int ndim;
    uint64_t shape[2]; /* as stored: a Conv1D weight is [in][out] */
    int transposed;    /* Conv1D weight: [in][out] there, [out][in] here */
};

/* The parameters of a unit in Hugging Face's module order; returns how many (<= 12). */
static unsigned llama_unit_params(const struct fy_model_config *c, unsigned unit, struct hf_param *p)
{
    const uint64_t C = c->n_embd, V = c->vocab, hd = C / c->n_head, I = c->n_inter;
    const uint64_t Q = c->n_head * hd, KV = c->n_kv_head * hd;
    enum fy_unit_kind kind = fy_model_unit_kind(c, unit);
    if (kind == FY_UNIT_EMBED) {
        p[0] = (struct hf_param){"model.embed_tokens.weight", 0, 2, {V, C}, 0};
        return 1;
    }
    if (kind == FY_UNIT_FINAL) {
        p[0] = (struct hf_param){"model.norm.weight", 0, 1, {C, 0}, 0};
        if (c->tied)
            return 1;
        p[1] = (struct hf_param){"lm_head.weight", C, 2, {V, C}, 0};
        return 2;
    }
    struct fy_llama_unit_layout l;
    fy_llama_unit_layout(c, &l);
    const struct {
        const char *name;
        size_t offset;
        int ndim;
        uint64_t d0, d1;
    } t[9] = {
        {"input_layernorm.weight", l.input_norm, 1, C, 0},
        {"self_attn.q_proj.weight", l.q_proj, 2, Q, C},
        {"self_attn.k_proj.weight", l.k_proj, 2, KV, C},
        {"self_attn.v_proj.weight", l.v_proj, 2, KV, C},
        {"self_attn.o_proj.weight", l.o_proj, 2, C, Q},
        {"post_attention_layernorm.weight", l.post_norm, 1, C, 0},
        {"mlp.gate_proj.weight", l.gate_proj, 2, I, C},
        {"mlp.up_proj.weight", l.up_proj, 2, I, C},
        {"mlp.down_proj.weight", l.down_proj, 2, C, I},
    };
    for (unsigned i = 0; i < 9; i++) {
        snprintf(p[i].name, sizeof p[i].name, "model.layers.%u.%s", unit - 1, t[i].name);
        p[i].offset = t[i].offset;
        p[i].ndim = t[i].ndim;
        p[i].shape[0] = t[i].d0;
        p[i].shape[1] = t[i].d1;
        p[i].transposed = 0;
    }
    return 9;
}

static unsigned unit_params(const struct fy_model_config *c, unsigned unit, struct hf_param *p)
{
    const uint64_t C = c->n_embd;
    enum fy_unit_kind kind = fy_model_unit_kind(c, unit);
    if (c->arch == FY_ARCH_LLAMA)
        return llama_unit_params(c, unit, p);
    if (kind == FY_UNIT_EMBED) {
        p[0] = (struct hf_param){"wte.weight", 0, 2, {c->vocab, C}, 0};
        p[1] = (struct hf_param){"wpe.weight", (size_t)c->vocab * C, 2, {c->ctx, C}, 0};
        return 2;
    }
    if (kind == FY_UNIT_FINAL) {
        p[0] = (struct hf_param){"ln_f.weight", 0, 1, {C, 0}, 0};
        p[1] = (struct hf_param){"ln_f.bias", C, 1, {C, 0}, 0};
        return 2;
    }
    struct fy_gpt2_block_layout l;
    fy_gpt2_block_layout(c, &l);
    const struct {
        const char *name;
        size_t offset;
        int ndim;
        uint64_t d0, d1;
        int transposed;
    } t[HF_BLOCK_PARAMS] = {
        {"ln_1.weight", l.ln1_w, 1, C, 0, 0},          {"ln_1.bias", l.ln1_b, 1, C, 0, 0},
        {"attn.c_attn.weight", l.qkv_w, 2, C, 3 * C, 1}, {"attn.c_attn.bias", l.qkv_b, 1, 3 * C, 0, 0},
        {"attn.c_proj.weight", l.attn_w, 2, C, C, 1},  {"attn.c_proj.bias", l.attn_b, 1, C, 0, 0},
        {"ln_2.weight", l.ln2_w, 1, C, 0, 0},          {"ln_2.bias", l.ln2_b, 1, C, 0, 0},
        {"mlp.c_fc.weight", l.fc_w, 2, C, 4 * C, 1},   {"mlp.c_fc.bias", l.fc_b, 1, 4 * C, 0, 0},
        {"mlp.c_proj.weight", l.proj_w, 2, 4 * C, C, 1}, {"mlp.c_proj.bias", l.proj_b, 1, C, 0, 0},
    };
    for (unsigned i = 0; i < HF_BLOCK_PARAMS; i++) {
        snprintf(p[i].name, sizeof p[i].name, "h.%u.%s", unit - 1, t[i].name);
        p[i].offset = t[i].offset;
        p[i].ndim = t[i].ndim;
        p[i].shape[0] = t[i].d0;
        p[i].shape[1] = t[i].d1;
        p[i].transposed = t[i].transposed;
    }
    return HF_BLOCK_PARAMS;
}

static uint64_t param_numel(const struct hf_param *p)
{
    return p->ndim == 1 ? p->shape[0] : p->shape[0] * p->shape[1];
}

/* dst[o][i] = src[i][o] for src [rows = in][cols = out]; blocked so both sides stay in cache. */
static void transpose(float *dst, const float *src, size_t rows, size_t cols)
{
    const size_t B = 32;
    for (size_t i0 = 0; i0 < rows; i0 += B)
        for (size_t o0 = 0; o0 < cols; o0 += B) {
            size_t i1 = i0 + B < rows ? i0 + B : rows, o1 = o0 + B < cols ? o0 + B : cols;
            for (size_t o = o0; o < o1; o++)
                for (size_t i = i0; i < i1; i++)
                    dst[o * rows + i] = src[i * cols + o];
        }
}

static void format_shape(char *buf, size_t len, int ndim, const uint64_t *shape)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < ndim && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%llu", d ? ", " : "", (unsigned long long)shape[d]);
    if (n < len)
        snprintf(buf + n, len - n, "]");
}

/* Reads a whole small file (config.json, source.json) into a NUL-terminated buffer. */
static int slurp(const char *path, char **out, size_t *len)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        fy_error("cannot open %s: %s", path, strerror(e));
        return -e;
    }
    struct stat st;
    int rc = fstat(fd, &st) == 0 ? 0 : -errno;
    if (rc == 0 && (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > HF_MAX_JSON))
        rc = -EINVAL;
    char *buf = rc == 0 ? malloc((size_t)st.st_size + 1) : NULL;
    if (rc == 0 && buf == NULL)
        rc = -ENOMEM;
    size_t done = 0;
    while (rc == 0 && done < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + done, (size_t)st.st_size - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            rc = n < 0 ? -errno : -EIO;
        else
            done += (size_t)n;
    }
    close(fd);
    if (rc < 0) {
        free(buf);
        if (rc == -EINVAL)
            fy_error("%s is not a regular file of at most %u MiB: is it a config file?", path,
                     HF_MAX_JSON >> 20);
        else
            fy_error("cannot read %s: %s", path, strerror(-rc));
        return rc;
    }
    buf[done] = 0;
    *out = buf;
    *len = done;
    return 0;
}

static int parse_json(const char *path, const char *text, size_t len, cJSON **out)
{
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (*out == NULL || !cJSON_IsObject(*out)) {
        size_t at = end != NULL && end >= text ? (size_t)(end - text) : 0;
        cJSON_Delete(*out);
        *out = NULL;
        fy_error("%s: not a JSON object (malformed near byte %zu)", path, at);
        return -EINVAL;
    }
    return 0;
}

/* A positive integer key, or its default when absent. */
static int config_uint(const char *path, const cJSON *root, const char *key, uint32_t def,
                       uint32_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (v == NULL) {
        *out = def;
        return 0;
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    FY_REQUIRE(d >= 1 && d <= 2147483647.0 && d == floor(d), -EINVAL,
               "%s: \"%s\" must be a positive integer", path, key);
    *out = (uint32_t)d;
    return 0;
}

/* A boolean key that must have the value `want` (its default when absent is `def`). */
static int config_bool(const char *path, const cJSON *root, const char *key, int def, int want,
                       const char *why)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    FY_REQUIRE(v == NULL || cJSON_IsBool(v), -EINVAL, "%s: \"%s\" must be true or false", path, key);
    int value = v == NULL ? def : cJSON_IsTrue(v);
    FY_REQUIRE(value == want, -EINVAL, "%s: \"%s\": %s is not supported (%s)", path, key,
               value ? "true" : "false", why);
    return 0;
}

/* A positive number key, or its default when absent. */
static int config_number(const char *path, const cJSON *obj, const char *key, double def,
                         double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (v == NULL || cJSON_IsNull(v)) {
        *out = def;
        return 0;
    }
    FY_REQUIRE(cJSON_IsNumber(v) && v->valuedouble > 0 && isfinite(v->valuedouble), -EINVAL,
               "%s: \"%s\" must be a positive number", path, key);
    *out = v->valuedouble;
    return 0;
}

/* LlamaConfig (transformers' defaults for absent keys); the rotary settings either as
 * rope_parameters (transformers 5) or as rope_theta and rope_scaling (earlier versions). */
static int llama_config_from_json(const char *path, const cJSON *root, struct fy_model_config *m)
{
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(arch) ? cJSON_GetArrayItem(arch, 0) : NULL;
    const char *first = cJSON_IsString(a0) ? a0->valuestring : NULL;
    FY_REQUIRE(arch == NULL || (cJSON_IsArray(arch) && cJSON_GetArraySize(arch) == 1 && first &&
                                strcmp(first, "LlamaForCausalLM") == 0),
               -EINVAL, "%s: architectures %s is not supported: this importer takes "
               "LlamaForCausalLM checkpoints", path, first ? first : "(not a list of one name)");
    m->arch = FY_ARCH_LLAMA;
    FY_TRY(config_uint(path, root, "num_hidden_layers", 32, &m->n_layer));
    FY_TRY(config_uint(path, root, "num_attention_heads", 32, &m->n_head));
    FY_TRY(config_uint(path, root, "hidden_size", 4096, &m->n_embd));
    FY_TRY(config_uint(path, root, "vocab_size", 32000, &m->vocab));
    FY_TRY(config_uint(path, root, "max_position_embeddings", 2048, &m->ctx));
    FY_TRY(config_uint(path, root, "intermediate_size", 11008, &m->n_inter));
    FY_TRY(config_uint(path, root, "num_key_value_heads", m->n_head, &m->n_kv_head));
    FY_REQUIRE(m->n_head <= m->n_embd && m->n_embd % m->n_head == 0, -EINVAL,
               "%s: \"num_attention_heads\" %u does not divide \"hidden_size\" %u", path,
               m->n_head, m->n_embd);
    const cJSON *hdj = cJSON_GetObjectItemCaseSensitive(root, "head_dim");
    if (hdj != NULL && !cJSON_IsNull(hdj)) {
        uint32_t hd;
        FY_TRY(config_uint(path, root, "head_dim", 0, &hd));
        FY_REQUIRE(hd == m->n_embd / m->n_head, -EINVAL,
                   "%s: \"head_dim\": %u is not supported (it must be hidden_size / "
                   "num_attention_heads = %u here)", path, hd, m->n_embd / m->n_head);
    }
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    const char *a = act == NULL ? "silu" : cJSON_IsString(act) ? act->valuestring : "";
    FY_REQUIRE(strcmp(a, "silu") == 0, -EINVAL,
               "%s: \"hidden_act\": \"%s\" is not supported (the MLP is SwiGLU with silu)", path, a);
    FY_TRY(config_bool(path, root, "attention_bias", 0, 0, "q/k/v/o projections have no bias"));
    FY_TRY(config_bool(path, root, "mlp_bias", 0, 0, "the MLP projections have no bias"));
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(root, "pretraining_tp");
    FY_REQUIRE(tp == NULL || cJSON_IsNull(tp) || (cJSON_IsNumber(tp) && tp->valuedouble == 1),
               -EINVAL, "%s: \"pretraining_tp\" must be 1", path);
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    FY_REQUIRE(tie == NULL || cJSON_IsBool(tie), -EINVAL,
               "%s: \"tie_word_embeddings\" must be true or false", path);
    m->tied = tie != NULL && cJSON_IsTrue(tie);
    double eps, theta;
    FY_TRY(config_number(path, root, "rms_norm_eps", 1e-6, &eps));
    m->rms_eps = (float)eps;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    const cJSON *scaling = rp != NULL && !cJSON_IsNull(rp) ? rp : rs;
    const char *skey = scaling == rp ? "rope_parameters" : "rope_scaling";
    FY_REQUIRE(scaling == NULL || cJSON_IsNull(scaling) || cJSON_IsObject(scaling), -EINVAL,
               "%s: \"%s\" must be an object", path, skey);
    if (scaling == rp && rp != NULL && !cJSON_IsNull(rp))
        FY_TRY(config_number(path, rp, "rope_theta", 10000.0, &theta));
    else
        FY_TRY(config_number(path, root, "rope_theta", 10000.0, &theta));
    m->rope_theta = theta;
    m->rope_type = FY_ROPE_DEFAULT;
    if (scaling != NULL && cJSON_IsObject(scaling)) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(scaling, "rope_type");
        if (t == NULL)
            t = cJSON_GetObjectItemCaseSensitive(scaling, "type");
        const char *type = cJSON_IsString(t) ? t->valuestring : "default";
        if (strcmp(type, "llama3") == 0) {
            uint32_t omax;
            m->rope_type = FY_ROPE_LLAMA3;
            FY_TRY(config_number(path, scaling, "factor", 8.0, &m->rope_factor));
            FY_TRY(config_number(path, scaling, "low_freq_factor", 1.0, &m->rope_low_freq_factor));
            FY_TRY(config_number(path, scaling, "high_freq_factor", 4.0, &m->rope_high_freq_factor));
            FY_TRY(config_uint(path, scaling, "original_max_position_embeddings", 8192, &omax));
            m->rope_orig_max_pos = omax;
        } else {
            FY_REQUIRE(strcmp(type, "default") == 0, -EINVAL,
                       "%s: \"%s\": rope_type \"%s\" is not supported (plain RoPE or llama3 "
                       "scaling)", path, skey, type);
        }
    }
    FY_REQUIRE(m->n_layer <= 4096 && m->n_embd <= 65536 && m->vocab >= 2 &&
                   m->vocab <= (1u << 20) && m->ctx <= (1u << 20),
               -EINVAL, "%s: sizes out of range (at most 4096 layers, hidden_size 65536, "
               "vocab_size and max_position_embeddings 2..%u)", path, 1u << 20);
    return fy_model_config_validate(m);
}

static int config_from_json(const char *path, const cJSON *root, struct fy_model_config *m)
{
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(arch) ? cJSON_GetArrayItem(arch, 0) : NULL;
    const char *type = cJSON_IsString(mt) ? mt->valuestring : NULL;
    const char *first = cJSON_IsString(a0) ? a0->valuestring : NULL;
    *m = (struct fy_model_config){.arch = FY_ARCH_GPT2};
    if (type != NULL && strcmp(type, "llama") == 0)
        return llama_config_from_json(path, root, m);
    FY_REQUIRE(type != NULL && strcmp(type, "gpt2") == 0, -EINVAL,
               "%s: model_type \"%s\"%s%s%s is not supported: this importer takes GPT-2 "
               "(model_type gpt2, GPT2LMHeadModel) and Llama (model_type llama, "
               "LlamaForCausalLM) checkpoints",
               path, type ? type : "(missing)", first ? " (architecture " : "", first ? first : "",
               first ? ")" : "");
    FY_REQUIRE(arch == NULL || (cJSON_IsArray(arch) && cJSON_GetArraySize(arch) == 1 && first &&
                                (strcmp(first, "GPT2LMHeadModel") == 0 ||
                                 strcmp(first, "GPT2Model") == 0)),
               -EINVAL,
               "%s: architectures %s is not supported: this importer takes GPT2LMHeadModel "
               "(or GPT2Model) checkpoints",
               path, first ? first : "(not a list of one name)");
    uint32_t inner = 0;
    FY_TRY(config_uint(path, root, "n_layer", 12, &m->n_layer));
    FY_TRY(config_uint(path, root, "n_head", 12, &m->n_head));
    FY_TRY(config_uint(path, root, "n_embd", 768, &m->n_embd));
    FY_TRY(config_uint(path, root, "vocab_size", 50257, &m->vocab));
    FY_TRY(config_uint(path, root, "n_positions", 1024, &m->ctx));
    const cJSON *ni = cJSON_GetObjectItemCaseSensitive(root, "n_inner");
    if (ni != NULL && !cJSON_IsNull(ni)) {
        FY_TRY(config_uint(path, root, "n_inner", 0, &inner));
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
    FY_TRY(config_bool(path, root, "scale_attn_weights", 1, 1,
                       "attention scores are scaled by 1/sqrt(head size)"));
    FY_TRY(config_bool(path, root, "scale_attn_by_inverse_layer_idx", 0, 0,
                       "attention scores are not scaled by layer"));
    FY_TRY(config_bool(path, root, "add_cross_attention", 0, 0, "decoder-only blocks"));
    FY_TRY(config_bool(path, root, "tie_word_embeddings", 1, 1,
                       "the LM head is tied to wte"));
    /* common/model.c's limits, stated here so that the one line names this file and the key */
    FY_REQUIRE(m->n_layer <= 4096, -EINVAL, "%s: \"n_layer\" %u: at most 4096 layers", path,
               m->n_layer);
    FY_REQUIRE(m->n_embd <= 65536, -EINVAL, "%s: \"n_embd\" %u: at most 65536", path, m->n_embd);
    FY_REQUIRE(m->n_embd % m->n_head == 0, -EINVAL,
               "%s: \"n_head\" %u does not divide \"n_embd\" %u", path, m->n_head, m->n_embd);
    FY_REQUIRE(m->vocab >= 2 && m->vocab <= (1u << 20) && m->ctx <= (1u << 20), -EINVAL,
               "%s: \"vocab_size\" %u or \"n_positions\" %u outside 2..%u", path, m->vocab,
               m->ctx, 1u << 20);
    return fy_model_config_validate(m);
}

int fy_hfgpt2_read_config(const char *path, struct fy_model_config *model)
{
    char *text;
    size_t len;
    FY_TRY(slurp(path, &text, &len));
    cJSON *root;
    int rc = parse_json(path, text, len, &root);
    free(text);
    if (rc == 0)
        rc = config_from_json(path, root, model);
    cJSON_Delete(root);
    return rc;
}

static int same_model(const struct fy_model_config *a, const struct fy_model_config *b)
{
    int same = a->n_layer == b->n_layer && a->n_head == b->n_head && a->n_embd == b->n_embd &&
               a->vocab == b->vocab && a->ctx == b->ctx && a->arch == b->arch;
    if (same && a->arch == FY_ARCH_LLAMA)
        same = a->n_kv_head == b->n_kv_head && a->n_inter == b->n_inter && a->tied == b->tied;
    return same;
}

/* Removes the plain files of a directory made here, then the directory; quiet (cleanup). */
static void remove_dir_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL)
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
                unlinkat(dirfd(d), e->d_name, 0);
        closedir(d);
    }
    rmdir(dir);
}

/* A new empty directory beside path ("path.tmp-XXXXXX") on the same filesystem. */
static int make_temp_dir(const char *path, char *out, size_t len)
{
    int n = snprintf(out, len, "%s.tmp-XXXXXX", path);
    FY_REQUIRE(n > 0 && (size_t)n < len, -ENAMETOOLONG, "path too long: %.200s", path);
    if (mkdtemp(out) == NULL) {
        int e = errno;
        out[0] = 0;
        fy_error("cannot create a temporary directory beside %s: %s", path, strerror(e));
        return -e;
    }
    /* mkdtemp makes it 0700; the result should have the mode any new directory gets here */
    mode_t mask = umask(0);
    umask(mask);
    if (chmod(out, 0777 & ~mask) != 0) {
        int e = errno;
        rmdir(out);
        fy_error("cannot set the mode of %s: %s", out, strerror(e));
        out[0] = 0;
        return -e;
    }
    return 0;
}

/* Creates dir/name with text, fsynced. */
static int write_file(const char *dir, const char *name, const char *text, size_t len)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    FY_SYS(fd, "cannot create %s", path);
    int rc = fy_write_all(fd, text, len, path, 0);
    if (rc == 0 && fsync(fd) != 0) {
        rc = -errno;
        fy_error("fsync of %s: %s", path, strerror(-rc));
    }
    if (close(fd) != 0 && rc == 0) {
        rc = -errno;
        fy_error("close of %s: %s", path, strerror(-rc));
    }
    return rc;
}

/* ---- import ---- */

/* Files of a model directory that travel with it unchanged, byte for byte: kept in the run at
 * import (beside config.json) and written into every export, so the export is a drop-in directory
 * with the model's own generation settings and tokenizer. */
static const char *const carried_names[] = {
    FY_HFGPT2_GENERATION_NAME, "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model",
    "added_tokens.json", "chat_template.jinja"};
#define CARRIED_COUNT (sizeof carried_names / sizeof carried_names[0])

struct carried {
    char *text[CARRIED_COUNT]; /* NULL where the directory has no such file */
    size_t len[CARRIED_COUNT];
};

static int carried_load(const char *dir, struct carried *c)
{
    for (size_t i = 0; i < CARRIED_COUNT; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, carried_names[i]);
        if (access(path, F_OK) == 0)
            FY_TRY(slurp(path, &c->text[i], &c->len[i]));
    }
    return 0;
}

static int carried_write(const char *dir, const struct carried *c)
{
    for (size_t i = 0; i < CARRIED_COUNT; i++)
        if (c->text[i] != NULL)
            FY_TRY(write_file(dir, carried_names[i], c->text[i], c->len[i]));
    return 0;
}

static int carried_has(const struct carried *c, const char *name)
{
    for (size_t i = 0; i < CARRIED_COUNT; i++)
        if (c->text[i] != NULL && strcmp(name, carried_names[i]) == 0)
            return 1;
    return 0;
}

static void carried_free(struct carried *c)
{
    for (size_t i = 0; i < CARRIED_COUNT; i++) {
        free(c->text[i]);
        c->text[i] = NULL;
    }
}

struct fy_hfgpt2_src {
    char dir[PATH_MAX];
    char ckpt[PATH_MAX];   /* the single file or the index */
    char config[PATH_MAX]; /* DIR/config.json */
    char *config_text;     /* its bytes, copied into the run at save_source */
    size_t config_len;
    struct carried carried; /* generation config and tokenizer files, copied too */
    struct fy_model_config model;
    struct fy_st_reader *reader;
    char prefix[16];
    const struct fy_st_tensor *lm_head; /* NULL when not stored */
    int dtype;                          /* of every parameter, or 0: mixed */
    float *buf;                         /* one tensor: a Conv1D weight or lm_head.weight */
    size_t buf_n;
};

const struct fy_model_config *fy_hfgpt2_model(const struct fy_hfgpt2_src *s) { return &s->model; }
const char *fy_hfgpt2_path(const struct fy_hfgpt2_src *s) { return s->ckpt; }
const char *fy_hfgpt2_dtype(const struct fy_hfgpt2_src *s)
{
    return s->dtype ? fy_st_dtype_name(s->dtype) : "mixed";
}

/* Whether a stored name (prefix already removed) is one of the mask buffers of block i < L. */
static int is_buffer(const struct fy_model_config *c, const char *name)
{
    unsigned i;
    int n = 0;
    if (sscanf(name, "h.%u.%n", &i, &n) != 1 || n == 0 || i >= c->n_layer)
        return 0;
    char canon[HF_NAME_MAX];
    snprintf(canon, sizeof canon, "h.%u.", i);
    if (strncmp(name, canon, strlen(canon)) != 0) /* "h.01." is not block 1's */
        return 0;
    return strcmp(name + n, "attn.bias") == 0 || strcmp(name + n, "attn.masked_bias") == 0;
}

/* Checks one expected parameter: present, with its shape. */
static int check_param(struct fy_hfgpt2_src *s, const struct hf_param *p)
{
    char full[HF_NAME_MAX + 16];
    snprintf(full, sizeof full, "%s%s", s->prefix, p->name);
    const struct fy_st_tensor *t = fy_st_find(s->reader, full);
    FY_REQUIRE(t != NULL, -EINVAL,
               "%s: tensor %s is missing (%s asks for %u layers, %u wide)", s->ckpt, full,
               s->config, s->model.n_layer, s->model.n_embd);
    int ok = t->ndim == p->ndim;
    for (int d = 0; ok && d < p->ndim; d++)
        ok = t->shape[d] == p->shape[d];
    if (!ok) {
        char have[96], want[96];
        format_shape(have, sizeof have, t->ndim, t->shape);
        format_shape(want, sizeof want, p->ndim, p->shape);
        fy_error("%s: tensor %s has shape %s, but %s (n_embd %u, vocab_size %u, n_positions %u) "
                 "needs %s",
                 t->file, full, have, s->config, s->model.n_embd, s->model.vocab, s->model.ctx,
                 want);
        return -EINVAL;
    }
    if (s->dtype == -1)
        s->dtype = t->dtype;
    else if (s->dtype != t->dtype)
        s->dtype = 0;
    if (p->transposed && param_numel(p) > s->buf_n)
        s->buf_n = param_numel(p);
    return 0;
}

/* Every tensor of the checkpoint is a parameter, a mask buffer, or lm_head.weight. */
static int check_extra(struct fy_hfgpt2_src *s)
{
    size_t plen = strlen(s->prefix);
    for (size_t i = 0; i < fy_st_count(s->reader); i++) {
        const struct fy_st_tensor *t = fy_st_tensor_at(s->reader, i);
        if (strcmp(t->name, "lm_head.weight") == 0 &&
            (s->model.arch == FY_ARCH_GPT2 || s->model.tied)) {
            uint64_t want[2] = {s->model.vocab, s->model.n_embd};
            if (t->ndim != 2 || t->shape[0] != want[0] || t->shape[1] != want[1]) {
                char have[96], need[96];
                format_shape(have, sizeof have, t->ndim, t->shape);
                format_shape(need, sizeof need, 2, want);
                fy_error("%s: tensor lm_head.weight has shape %s, but %s needs %s (tied to wte)",
                         t->file, have, s->config, need);
                return -EINVAL;
            }
            s->lm_head = t;
            if ((uint64_t)s->model.vocab * s->model.n_embd > s->buf_n)
                s->buf_n = (size_t)s->model.vocab * s->model.n_embd;
            continue;
        }
        int known = strncmp(t->name, s->prefix, plen) == 0;
        const char *rest = t->name + plen;
        if (known && !is_buffer(&s->model, rest)) {
            /* A parameter name: then it was checked by check_param, unless it is out of range. */
            known = 0;
            struct hf_param p[HF_BLOCK_PARAMS];
            for (unsigned u = 0; !known && u < fy_model_unit_count(&s->model); u++) {
                unsigned n = unit_params(&s->model, u, p);
                for (unsigned k = 0; !known && k < n; k++)
                    known = strcmp(rest, p[k].name) == 0;
            }
        }
        FY_REQUIRE(known, -EINVAL,
                   "%s: tensor %s is not a parameter of the %s that %s describes (%u layers): "
                   "another architecture or a model with extra heads",
                   t->file, t->name, s->model.arch == FY_ARCH_LLAMA ? "Llama" : "GPT-2", s->config,
                   s->model.n_layer);
    }
    return 0;
}

static int find_checkpoint(struct fy_hfgpt2_src *s)
{
    snprintf(s->ckpt, sizeof s->ckpt, "%s/%s", s->dir, FY_ST_INDEX_NAME);
    if (access(s->ckpt, F_OK) == 0)
        return 0;
    snprintf(s->ckpt, sizeof s->ckpt, "%s/%s", s->dir, FY_ST_SINGLE_NAME);
    if (access(s->ckpt, F_OK) == 0)
        return 0;
    char bin[PATH_MAX];
    snprintf(bin, sizeof bin, "%s/pytorch_model.bin", s->dir);
    fy_error("%s: no %s or %s%s", s->dir, FY_ST_SINGLE_NAME, FY_ST_INDEX_NAME,
             access(bin, F_OK) == 0
                 ? " (only pytorch_model.bin: save the model with safe_serialization=True)"
                 : ": give a Hugging Face model directory");
    return -ENOENT;
}

static int src_open(struct fy_hfgpt2_src *s, const char *dir)
{
    size_t dlen = strlen(dir);
    while (dlen > 1 && dir[dlen - 1] == '/')
        dlen--;
    FY_REQUIRE(dlen + 64 < sizeof s->dir, -ENAMETOOLONG, "path too long: %.200s", dir);
    memcpy(s->dir, dir, dlen);
    s->dir[dlen] = 0;
    struct stat st;
    if (stat(s->dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        int e = stat(s->dir, &st) != 0 ? errno : ENOTDIR;
        fy_error("%s: %s: give a Hugging Face model directory (config.json, model.safetensors)",
                 s->dir, strerror(e));
        return -e;
    }
    snprintf(s->config, sizeof s->config, "%s/%s", s->dir, FY_HFGPT2_CONFIG_NAME);
    if (access(s->config, F_OK) != 0) {
        fy_error("%s: missing: a Hugging Face model directory has a config.json", s->config);
        return -ENOENT;
    }
    FY_TRY(slurp(s->config, &s->config_text, &s->config_len));
    cJSON *root;
    FY_TRY(parse_json(s->config, s->config_text, s->config_len, &root));
    int rc = config_from_json(s->config, root, &s->model);
    cJSON_Delete(root);
    FY_TRY(rc);
    FY_TRY(carried_load(s->dir, &s->carried));
    FY_TRY(find_checkpoint(s));
    FY_TRY(fy_st_open(&s->reader, s->ckpt));
    if (s->model.arch == FY_ARCH_LLAMA) {
        s->prefix[0] = 0; /* Llama names are full: model.*, lm_head.weight */
        FY_REQUIRE(fy_st_find(s->reader, "model.embed_tokens.weight") != NULL, -EINVAL,
                   "%s: tensor model.embed_tokens.weight is missing: not the LlamaForCausalLM "
                   "checkpoint that %s describes (other layouts are not supported)",
                   s->ckpt, s->config);
    } else if (fy_st_find(s->reader, HF_PREFIX "wte.weight") != NULL)
        snprintf(s->prefix, sizeof s->prefix, "%s", HF_PREFIX);
    else
        FY_REQUIRE(fy_st_find(s->reader, "wte.weight") != NULL, -EINVAL,
                   "%s: tensor " HF_PREFIX "wte.weight (or wte.weight) is missing: not a GPT-2 "
                   "checkpoint",
                   s->ckpt);
    s->dtype = -1;
    struct hf_param p[HF_BLOCK_PARAMS];
    for (unsigned u = 0; u < fy_model_unit_count(&s->model); u++) {
        unsigned n = unit_params(&s->model, u, p);
        for (unsigned k = 0; k < n; k++)
            FY_TRY(check_param(s, &p[k]));
    }
    FY_TRY(check_extra(s));
    if (s->lm_head != NULL && s->dtype != s->lm_head->dtype)
        s->dtype = 0;
    return 0;
}

int fy_hfgpt2_open(struct fy_hfgpt2_src **out, const char *dir)
{
    *out = NULL;
    struct fy_hfgpt2_src *s = calloc(1, sizeof *s);
    FY_REQUIRE(s != NULL, -ENOMEM, "%s: out of memory", dir);
    int rc = src_open(s, dir);
    if (rc < 0) {
        fy_hfgpt2_close(&s);
        return rc;
    }
    *out = s;
    return 0;
}

void fy_hfgpt2_close(struct fy_hfgpt2_src **sp)
{
    struct fy_hfgpt2_src *s = sp ? *sp : NULL;
    if (s == NULL)
        return;
    fy_st_close(&s->reader);
    free(s->config_text);
    carried_free(&s->carried);
    free(s->buf);
    free(s);
    *sp = NULL;
}

static int ensure_buf(float **buf, size_t *have, size_t n)
{
    if (*buf != NULL || n == 0)
        return 0;
    *buf = malloc(n * sizeof **buf);
    FY_REQUIRE(*buf != NULL, -ENOMEM, "out of memory for a tensor of %zu floats", n);
    *have = n;
    return 0;
}

static int check_tied(struct fy_hfgpt2_src *s, const float *wte)
{
    size_t n = (size_t)s->model.vocab * s->model.n_embd;
    FY_TRY(fy_st_read_f32(s->reader, s->lm_head, s->buf, n));
    for (size_t i = 0; i < n; i++)
        if (memcmp(&s->buf[i], &wte[i], sizeof(float)) != 0) {
            fy_error("%s: tensor lm_head.weight differs from %swte.weight (element %zu: %g, not "
                     "%g): an untied LM head is not supported (the head is tied to wte here)",
                     s->lm_head->file, s->prefix, i, (double)s->buf[i], (double)wte[i]);
            return -EINVAL;
        }
    return 0;
}

int fy_hfgpt2_read_unit(struct fy_hfgpt2_src *s, unsigned unit, float *params)
{
    FY_REQUIRE(unit < fy_model_unit_count(&s->model), -EINVAL, "%s: no unit %u", s->ckpt, unit);
    FY_TRY(ensure_buf(&s->buf, &s->buf_n, s->buf_n));
    struct hf_param p[HF_BLOCK_PARAMS];
    unsigned n = unit_params(&s->model, unit, p);
    for (unsigned k = 0; k < n; k++) {
        char full[HF_NAME_MAX + 16];
        snprintf(full, sizeof full, "%s%s", s->prefix, p[k].name);
        const struct fy_st_tensor *t = fy_st_find(s->reader, full);
        FY_REQUIRE(t != NULL, -EINVAL, "%s: tensor %s is missing", s->ckpt, full);
        if (!p[k].transposed) {
            FY_TRY(fy_st_read_f32(s->reader, t, params + p[k].offset, t->numel));
            continue;
        }
        FY_TRY(fy_st_read_f32(s->reader, t, s->buf, t->numel));
        transpose(params + p[k].offset, s->buf, (size_t)p[k].shape[0], (size_t)p[k].shape[1]);
    }
    if (unit == 0 && s->lm_head != NULL)
        FY_TRY(check_tied(s, params));
    return 0;
}

static int add_dtype(cJSON *dtypes, const char *name, const struct fy_st_reader *r)
{
    const struct fy_st_tensor *t = fy_st_find(r, name);
    return t != NULL && cJSON_AddStringToObject(dtypes, name, fy_st_dtype_name(t->dtype)) != NULL
               ? 0
               : -ENOMEM;
}

static char *source_json(const struct fy_hfgpt2_src *s)
{
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL && cJSON_AddStringToObject(root, "format", HF_SOURCE_FORMAT) &&
             cJSON_AddNumberToObject(root, "version", 1) &&
             cJSON_AddStringToObject(root, "source", s->dir) &&
             cJSON_AddStringToObject(root, "checkpoint", s->ckpt) &&
             cJSON_AddStringToObject(root, "prefix", s->prefix) &&
             cJSON_AddBoolToObject(root, "lm_head", s->lm_head != NULL);
    cJSON *meta = ok ? cJSON_AddObjectToObject(root, "metadata") : NULL;
    ok = meta != NULL;
    for (size_t i = 0; ok && i < fy_st_metadata_count(s->reader); i++) {
        const char *k, *v;
        fy_st_metadata_at(s->reader, i, &k, &v);
        ok = cJSON_AddStringToObject(meta, k, v) != NULL;
    }
    cJSON *dtypes = ok ? cJSON_AddObjectToObject(root, "dtypes") : NULL;
    ok = dtypes != NULL;
    struct hf_param p[HF_BLOCK_PARAMS];
    for (unsigned u = 0; ok && u < fy_model_unit_count(&s->model); u++) {
        unsigned n = unit_params(&s->model, u, p);
        for (unsigned k = 0; ok && k < n; k++) {
            char full[HF_NAME_MAX + 16];
            snprintf(full, sizeof full, "%s%s", s->prefix, p[k].name);
            ok = add_dtype(dtypes, full, s->reader) == 0;
        }
    }
    if (ok && s->lm_head != NULL)
        ok = add_dtype(dtypes, "lm_head.weight", s->reader) == 0;
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    return text;
}

int fy_hfgpt2_save_source(const struct fy_hfgpt2_src *s, const char *hf_dir)
{
    struct stat st;
    FY_REQUIRE(lstat(hf_dir, &st) != 0, -EEXIST, "%s already exists: remove it first", hf_dir);
    char *text = source_json(s);
    FY_REQUIRE(text != NULL, -ENOMEM, "%s: out of memory building %s", hf_dir,
               FY_HFGPT2_SOURCE_NAME);
    char tmp[PATH_MAX] = "";
    int rc = make_temp_dir(hf_dir, tmp, sizeof tmp);
    if (rc == 0)
        rc = write_file(tmp, FY_HFGPT2_CONFIG_NAME, s->config_text, s->config_len);
    if (rc == 0)
        rc = write_file(tmp, FY_HFGPT2_SOURCE_NAME, text, strlen(text));
    if (rc == 0)
        rc = carried_write(tmp, &s->carried);
    free(text);
    if (rc == 0)
        rc = fy_fsync_dir(tmp);
    if (rc == 0 && rename(tmp, hf_dir) != 0) {
        rc = -errno;
        fy_error("cannot rename %s to %s: %s", tmp, hf_dir, strerror(-rc));
    }
    if (rc == 0)
        return fy_fsync_parent(hf_dir);
    if (tmp[0] != 0)
        remove_dir_files(tmp);
    return rc;
}

/* ---- export ---- */

struct fy_hfgpt2_writer {
    char dir[PATH_MAX]; /* the target */
    char tmp[PATH_MAX]; /* the temporary directory beside it, "" when none */
    struct fy_model_config model;
    struct fy_st_writer *st;
    char prefix[16];
    int lm_head;
    int *dtypes; /* export dtype per parameter, in unit order (then lm_head) */
    int lm_head_dtype;
    int dtype; /* of every tensor written, or 0: mixed */
    float *buf;
    size_t buf_n;
    unsigned next_unit;
    char *config_text; /* config.json to write */
    size_t config_len;
    struct carried carried; /* the source's generation config and tokenizer files */
    int replace; /* dir exists and is not empty (overwrite) */
};

const char *fy_hfgpt2_writer_dtype(const struct fy_hfgpt2_writer *w)
{
    return w->dtype ? fy_st_dtype_name(w->dtype) : "mixed";
}

/* Files an export writes (and replaces in an existing directory). */
static int is_model_file(const struct fy_hfgpt2_writer *w, const char *name)
{
    size_t n = strlen(name);
    if (carried_has(&w->carried, name))
        return 1;
    if (strcmp(name, FY_HFGPT2_CONFIG_NAME) == 0 || strcmp(name, FY_ST_SINGLE_NAME) == 0 ||
        strcmp(name, FY_ST_INDEX_NAME) == 0)
        return 1;
    return strncmp(name, "model-", 6) == 0 && n > 12 &&
           strcmp(name + n - 12, ".safetensors") == 0 && strstr(name, "-of-") != NULL;
}

/* Whether dir may be written: absent, or an empty directory, or (overwrite) a directory of files. */
static int check_target(struct fy_hfgpt2_writer *w, int overwrite)
{
    struct stat st;
    if (lstat(w->dir, &st) != 0) {
        int e = errno;
        FY_REQUIRE(e == ENOENT, -e, "%s: %s", w->dir, strerror(e));
        return 0;
    }
    FY_REQUIRE(S_ISDIR(st.st_mode), -ENOTDIR,
               "%s exists and is not a directory: give a new or empty directory for the model",
               w->dir);
    DIR *d = opendir(w->dir);
    FY_SYS(d == NULL ? -1 : 0, "cannot list %s", w->dir);
    int rc = 0, entries = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        entries++;
        struct stat es;
        if (fstatat(dirfd(d), e->d_name, &es, AT_SYMLINK_NOFOLLOW) != 0)
            rc = -errno;
        else if (overwrite && S_ISDIR(es.st_mode)) {
            fy_error("%s holds a directory (%s): --overwrite replaces the model files of a model "
                     "directory, give a new or empty directory instead",
                     w->dir, e->d_name);
            rc = -EISDIR;
        }
    }
    closedir(d);
    FY_REQUIRE(rc == 0 || rc == -EISDIR, rc, "%s: cannot inspect its files: %s", w->dir,
               strerror(-rc));
    FY_TRY(rc);
    FY_REQUIRE(entries == 0 || overwrite, -EEXIST,
               "%s exists and is not empty: give a new or empty directory, or pass --overwrite to "
               "replace the model files in it (its other files, such as a tokenizer's, are kept)",
               w->dir);
    w->replace = entries > 0;
    return 0;
}

static int dtype_of(const cJSON *dtypes, const char *name, const char *path)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(dtypes, name);
    const char *s = cJSON_IsString(v) ? v->valuestring : "";
    for (int d = FY_ST_F32; d <= FY_ST_F16; d++)
        if (strcmp(s, fy_st_dtype_name(d)) == 0)
            return d;
    fy_error("%s: no dtype for tensor %s (the file is damaged: import the model again)", path, name);
    return -EINVAL;
}

static const char *torch_dtype_name(int dtype)
{
    return dtype == FY_ST_BF16 ? "bfloat16" : dtype == FY_ST_F16 ? "float16" : "float32";
}

/* The shortest %g form of a float that reads back as the same float, as a JSON number with a
 * fraction or exponent (1e-05, 10000.0). */
static void json_float(char *buf, size_t len, float v)
{
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, len, "%.*g", prec, (double)v);
        if (strtof(buf, NULL) == v)
            break;
    }
    if (strpbrk(buf, ".eE") == NULL && strlen(buf) + 3 <= len)
        strcat(buf, ".0");
}

static void json_double(char *buf, size_t len, double v)
{
    if (v == floor(v) && fabs(v) < 1e15) { /* 500000.0, not 5e+05 */
        snprintf(buf, len, "%.1f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    if (strpbrk(buf, ".eE") == NULL && strlen(buf) + 3 <= len)
        strcat(buf, ".0");
}

/* A LlamaConfig config.json for a Llama made here (init --arch llama): every key that
 * llama_config_from_json reads, and the rotary settings as rope_theta and rope_scaling, which
 * transformers 4 and 5 both take. */
static char *synth_llama_config(const struct fy_model_config *m, int dtype)
{
    enum { CAP = 4096 };
    char *text = malloc(CAP);
    if (text == NULL)
        return NULL;
    char eps[32], theta[40], scaling[512] = "null";
    json_float(eps, sizeof eps, m->rms_eps);
    json_double(theta, sizeof theta, m->rope_theta);
    if (m->rope_type == FY_ROPE_LLAMA3) {
        char f[40], lo[40], hi[40];
        json_double(f, sizeof f, m->rope_factor);
        json_double(lo, sizeof lo, m->rope_low_freq_factor);
        json_double(hi, sizeof hi, m->rope_high_freq_factor);
        snprintf(scaling, sizeof scaling,
                 "{\"rope_type\": \"llama3\", \"factor\": %s, \"low_freq_factor\": %s, "
                 "\"high_freq_factor\": %s, \"original_max_position_embeddings\": %u}",
                 f, lo, hi, m->rope_orig_max_pos);
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
             m->vocab, m->n_embd, m->n_inter, m->n_layer, m->n_head, m->n_kv_head,
             m->n_embd / m->n_head, m->ctx, eps, theta, scaling, m->tied ? "true" : "false",
             m->vocab - 1, m->vocab - 1, torch_dtype_name(dtype));
    return text;
}

/* A config.json for a model made here (no Hugging Face source). */
static char *synth_config(const struct fy_model_config *m, int dtype)
{
    if (m->arch == FY_ARCH_LLAMA)
        return synth_llama_config(m, dtype);
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
             torch_dtype_name(dtype));
    return text;
}

/* The original config.json, with its torch_dtype (or dtype) changed where the export's differs. */
static int export_config(struct fy_hfgpt2_writer *w, const char *path, char *text, size_t len)
{
    w->config_text = text;
    w->config_len = len;
    if (w->dtype == 0)
        return 0;
    cJSON *root;
    FY_TRY(parse_json(path, text, len, &root));
    int changed = 0, rc = 0;
    const char *keys[] = {"torch_dtype", "dtype"};
    for (int k = 0; k < 2 && rc == 0; k++) {
        cJSON *v = cJSON_GetObjectItemCaseSensitive(root, keys[k]);
        const char *want = torch_dtype_name(w->dtype);
        if (!cJSON_IsString(v) || strcmp(v->valuestring, want) == 0)
            continue;
        fy_info("%s: \"%s\" %s -> %s (the exported tensors' dtype)", w->dir, keys[k],
                v->valuestring, want);
        cJSON *nv = cJSON_CreateString(want);
        if (nv == NULL || !cJSON_ReplaceItemInObjectCaseSensitive(root, keys[k], nv))
            rc = -ENOMEM;
        changed = 1;
    }
    char *out = rc == 0 && changed ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    FY_REQUIRE(rc == 0 && (!changed || out != NULL), -ENOMEM, "%s: out of memory", path);
    if (changed) {
        size_t n = strlen(out);
        char *t = realloc(out, n + 2);
        FY_REQUIRE(t != NULL, -ENOMEM, "%s: out of memory", path);
        t[n] = '\n';
        t[n + 1] = 0;
        free(w->config_text);
        w->config_text = t;
        w->config_len = n + 1;
    }
    return 0;
}

static unsigned total_params(const struct fy_model_config *c) { return 4 + HF_BLOCK_PARAMS * c->n_layer; }

/* Reads RUN/hf (config.json, source.json): names, dtypes and metadata for the export. */
static int load_source(struct fy_hfgpt2_writer *w, const char *src, int force, cJSON **meta_out,
                       cJSON **root_out)
{
    char path[PATH_MAX], spath[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", src, FY_HFGPT2_CONFIG_NAME);
    snprintf(spath, sizeof spath, "%s/%s", src, FY_HFGPT2_SOURCE_NAME);
    struct fy_model_config m;
    FY_TRY(fy_hfgpt2_read_config(path, &m));
    if (!same_model(&m, &w->model)) {
        char have[160], want[160];
        fy_model_config_describe(&m, have, sizeof have);
        fy_model_config_describe(&w->model, want, sizeof want);
        fy_error("%s describes another model (%s) than the store's (%s): the run directory was "
                 "changed by hand; import the model again",
                 path, have, want);
        return -EINVAL;
    }
    char *text;
    size_t len;
    FY_TRY(slurp(spath, &text, &len));
    cJSON *root;
    int rc = parse_json(spath, text, len, &root);
    free(text);
    FY_TRY(rc);
    *root_out = root;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(root, "prefix");
    const cJSON *lm = cJSON_GetObjectItemCaseSensitive(root, "lm_head");
    const cJSON *dtypes = cJSON_GetObjectItemCaseSensitive(root, "dtypes");
    FY_REQUIRE(cJSON_IsString(fmt) && strcmp(fmt->valuestring, HF_SOURCE_FORMAT) == 0 &&
                   cJSON_IsString(prefix) &&
                   (strcmp(prefix->valuestring, "") == 0 ||
                    strcmp(prefix->valuestring, HF_PREFIX) == 0) &&
                   cJSON_IsBool(lm) && cJSON_IsObject(dtypes),
               -EINVAL, "%s: not a record of an imported model (damaged?): import the model again",
               spath);
    snprintf(w->prefix, sizeof w->prefix, "%s", prefix->valuestring);
    w->lm_head = cJSON_IsTrue(lm);
    *meta_out = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    int f16 = 0;
    struct hf_param p[HF_BLOCK_PARAMS];
    unsigned i = 0;
    for (unsigned u = 0; u < fy_model_unit_count(&w->model); u++) {
        unsigned n = unit_params(&w->model, u, p);
        for (unsigned k = 0; k < n; k++, i++) {
            char full[HF_NAME_MAX + 16];
            snprintf(full, sizeof full, "%s%s", w->prefix, p[k].name);
            int d = dtype_of(dtypes, full, spath);
            FY_TRY(d);
            f16 |= d == FY_ST_F16;
            w->dtypes[i] = force ? force : d == FY_ST_F16 ? FY_ST_F32 : d;
        }
    }
    if (w->lm_head) {
        int d = dtype_of(dtypes, "lm_head.weight", spath);
        FY_TRY(d);
        f16 |= d == FY_ST_F16;
        w->lm_head_dtype = force ? force : d == FY_ST_F16 ? FY_ST_F32 : d;
    }
    if (f16 && !force)
        fy_info("%s: the source's F16 tensors are written as F32 (the safetensors writer has no "
                "F16 output; --dtype bf16 writes BF16)",
                w->dir);
    FY_TRY(carried_load(src, &w->carried));
    FY_TRY(slurp(path, &text, &len));
    w->dtype = w->dtypes[0];
    for (unsigned k = 1; k < i; k++)
        if (w->dtypes[k] != w->dtype)
            w->dtype = 0;
    if (w->lm_head && w->lm_head_dtype != w->dtype)
        w->dtype = 0;
    return export_config(w, path, text, len);
}

static int declare(struct fy_hfgpt2_writer *w, const char *name, int dtype, int ndim,
                   const uint64_t *shape)
{
    return fy_st_writer_declare(w->st, name, dtype, ndim, shape);
}

static int writer_open(struct fy_hfgpt2_writer *w, const char *dir,
                       const struct fy_hfgpt2_export_opts *o)
{
    size_t dlen = strlen(dir);
    while (dlen > 1 && dir[dlen - 1] == '/')
        dlen--;
    FY_REQUIRE(dlen > 0 && dlen + 64 < sizeof w->dir, -ENAMETOOLONG, "bad path: %.200s", dir);
    memcpy(w->dir, dir, dlen);
    w->dir[dlen] = 0;
    FY_REQUIRE(o->dtype == 0 || o->dtype == FY_ST_F32 || o->dtype == FY_ST_BF16, -EINVAL,
               "%s: the export dtype must be F32 or BF16", w->dir);
    FY_TRY(check_target(w, o->overwrite));
    unsigned np = total_params(&w->model);
    w->dtypes = calloc(np, sizeof *w->dtypes);
    FY_REQUIRE(w->dtypes != NULL, -ENOMEM, "out of memory");
    cJSON *meta = NULL, *root = NULL;
    int rc = 0;
    if (o->source != NULL) {
        rc = load_source(w, o->source, o->dtype, &meta, &root);
    } else {
        /* Llama names are full (model.*, lm_head.weight); an untied head is a unit parameter */
        snprintf(w->prefix, sizeof w->prefix, "%s",
                 w->model.arch == FY_ARCH_LLAMA ? "" : HF_PREFIX);
        w->dtype = o->dtype ? o->dtype : FY_ST_F32;
        for (unsigned k = 0; k < np; k++)
            w->dtypes[k] = w->dtype;
        w->config_text = synth_config(&w->model, w->dtype);
        w->config_len = w->config_text ? strlen(w->config_text) : 0;
        if (w->config_text == NULL)
            rc = -ENOMEM;
    }
    if (rc == 0)
        rc = make_temp_dir(w->dir, w->tmp, sizeof w->tmp);
    else
        w->tmp[0] = 0;
    if (rc == 0) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", w->tmp, FY_ST_SINGLE_NAME);
        rc = o->max_shard_bytes ? fy_st_writer_new_sharded(&w->st, w->tmp, o->max_shard_bytes, 0)
                                : fy_st_writer_new(&w->st, path, 0);
    }
    /* The source's metadata, in order; transformers wants format "pt". */
    int has_format = 0;
    for (const cJSON *m = cJSON_IsObject(meta) ? meta->child : NULL; rc == 0 && m; m = m->next)
        if (cJSON_IsString(m)) {
            rc = fy_st_writer_metadata(w->st, m->string, m->valuestring);
            has_format |= strcmp(m->string, "format") == 0;
        }
    if (rc == 0 && !has_format)
        rc = fy_st_writer_metadata(w->st, "format", "pt");
    cJSON_Delete(root);
    struct hf_param p[HF_BLOCK_PARAMS];
    unsigned i = 0;
    for (unsigned u = 0; rc == 0 && u < fy_model_unit_count(&w->model); u++) {
        unsigned n = unit_params(&w->model, u, p);
        for (unsigned k = 0; rc == 0 && k < n; k++, i++) {
            char full[HF_NAME_MAX + 16];
            snprintf(full, sizeof full, "%s%s", w->prefix, p[k].name);
            rc = declare(w, full, w->dtypes[i], p[k].ndim, p[k].shape);
            if (rc == 0 && p[k].transposed && param_numel(&p[k]) > w->buf_n)
                w->buf_n = (size_t)param_numel(&p[k]);
            if (rc == 0 && u == 0 && k == 0 && w->lm_head)
                rc = declare(w, "lm_head.weight", w->lm_head_dtype, 2, p[k].shape);
        }
    }
    return rc;
}

int fy_hfgpt2_writer_new(struct fy_hfgpt2_writer **out, const char *dir,
                         const struct fy_model_config *model, const struct fy_hfgpt2_export_opts *o)
{
    *out = NULL;
    struct fy_hfgpt2_writer *w = calloc(1, sizeof *w);
    FY_REQUIRE(w != NULL, -ENOMEM, "%s: out of memory", dir);
    w->model = *model;
    int rc = writer_open(w, dir, o);
    if (rc < 0) {
        fy_hfgpt2_writer_destroy(&w);
        return rc;
    }
    *out = w;
    return 0;
}

int fy_hfgpt2_writer_put_unit(struct fy_hfgpt2_writer *w, unsigned unit, const float *params)
{
    FY_REQUIRE(unit == w->next_unit && unit < fy_model_unit_count(&w->model), -EINVAL,
               "%s: unit %u written out of order (expected %u)", w->dir, unit, w->next_unit);
    FY_TRY(ensure_buf(&w->buf, &w->buf_n, w->buf_n));
    struct hf_param p[HF_BLOCK_PARAMS];
    unsigned n = unit_params(&w->model, unit, p);
    for (unsigned k = 0; k < n; k++) {
        char full[HF_NAME_MAX + 16];
        snprintf(full, sizeof full, "%s%s", w->prefix, p[k].name);
        uint64_t numel = param_numel(&p[k]);
        const float *src = params + p[k].offset;
        if (p[k].transposed) {
            /* ours [out][in] -> stored [in][out]: the transpose of an [out][in] matrix */
            transpose(w->buf, src, (size_t)p[k].shape[1], (size_t)p[k].shape[0]);
            src = w->buf;
        }
        FY_TRY(fy_st_writer_put_f32(w->st, full, src, numel));
        if (unit == 0 && k == 0 && w->lm_head)
            FY_TRY(fy_st_writer_put_f32(w->st, "lm_head.weight", src, numel));
    }
    w->next_unit++;
    return 0;
}

/* Moves the finished temporary directory to w->dir. */
static int put_in_place(struct fy_hfgpt2_writer *w)
{
    if (!w->replace) {
        /* Absent, or an empty directory (which rename replaces). */
        FY_SYS(rename(w->tmp, w->dir), "cannot rename %s to %s", w->tmp, w->dir);
        w->tmp[0] = 0;
        return fy_fsync_parent(w->dir);
    }
    /* Keep the directory's other files (tokenizer, README): link them into the new copy. */
    DIR *d = opendir(w->dir);
    FY_SYS(d == NULL ? -1 : 0, "cannot list %s", w->dir);
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 || is_model_file(w, e->d_name))
            continue;
        char from[PATH_MAX], to[PATH_MAX];
        snprintf(from, sizeof from, "%s/%s", w->dir, e->d_name);
        snprintf(to, sizeof to, "%s/%s", w->tmp, e->d_name);
        if (link(from, to) != 0) {
            rc = -errno;
            fy_error("cannot keep %s in the new export (link to %s): %s", from, to, strerror(-rc));
        }
    }
    closedir(d);
    FY_TRY(rc);
    FY_TRY(fy_fsync_dir(w->tmp));
    FY_SYS(renameat2(AT_FDCWD, w->tmp, AT_FDCWD, w->dir, RENAME_EXCHANGE),
           "cannot exchange %s with %s (a filesystem without RENAME_EXCHANGE? export to a new "
           "directory instead)",
           w->tmp, w->dir);
    /* w->tmp now holds the previous copy: its model files and links to the kept ones. */
    remove_dir_files(w->tmp);
    struct stat st;
    if (lstat(w->tmp, &st) == 0)
        fy_warn("the previous model files were moved to %s and could not all be removed: remove "
                "it by hand",
                w->tmp);
    w->tmp[0] = 0;
    return fy_fsync_parent(w->dir);
}

int fy_hfgpt2_writer_finish(struct fy_hfgpt2_writer **wp)
{
    struct fy_hfgpt2_writer *w = *wp;
    int rc = 0;
    if (w->next_unit != fy_model_unit_count(&w->model)) {
        fy_error("%s: export finished after %u of %u units", w->dir, w->next_unit,
                 fy_model_unit_count(&w->model));
        rc = -EINVAL;
    }
    if (rc == 0)
        rc = fy_st_writer_finish(&w->st);
    if (rc == 0)
        rc = write_file(w->tmp, FY_HFGPT2_CONFIG_NAME, w->config_text, w->config_len);
    if (rc == 0)
        rc = carried_write(w->tmp, &w->carried);
    if (rc == 0)
        rc = fy_fsync_dir(w->tmp);
    if (rc == 0)
        rc = put_in_place(w);
    fy_hfgpt2_writer_destroy(wp);
    return rc;
}

void fy_hfgpt2_writer_destroy(struct fy_hfgpt2_writer **wp)
{
    struct fy_hfgpt2_writer *w = wp ? *wp : NULL;
    if (w == NULL)
        return;
    fy_st_writer_destroy(&w->st);
    if (w->tmp[0] != 0)
        remove_dir_files(w->tmp);
    free(w->dtypes);
    free(w->buf);
    free(w->config_text);
    carried_free(&w->carried);
    free(w);
    *wp = NULL;
}
