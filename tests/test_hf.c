/* Tests of the Hugging Face GPT-2 mapping (common/hfgpt2) without Python: checkpoints written here
 * in Hugging Face's layout (names, Conv1D weights [in][out], F32, BF16 and F16, with and without
 * the "transformer." prefix, sharded, with lm_head.weight and the mask buffers) are read into units
 * and compared element by element with an independent statement of the mapping; exports are
 * compared with their source bit for bit; config.json refusals and checkpoint refusals give one
 * line naming the file and the key or tensor; export directories are replaced only whole. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/base/dtype.h"
#include "common/model/arch/gpt2.h"
#include "common/formats/hf.h"
#include "common/formats/hfexport.h"
#include "common/model/model.h"
#include "common/formats/safetensors.h"
#include "common/formats/stwriter.h"
#include "tests/testutil.h"

/* 2 layers, 2 heads, 8 wide, vocab 11, context 5: every shape distinct enough to catch a swap. */
static const struct fy_model_config CFG = {.n_layer = 2, .n_head = 2, .n_embd = 8, .vocab = 11, .ctx = 5};

static char *tmpdir;

static int setup(void **state)
{
    tmpdir = fy_test_tmpdir("hfgpt2");
    return tmpdir == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    fy_test_rmdir(tmpdir);
    free(tmpdir);
    tmpdir = NULL;
    return 0;
}

static const char *tpath(const char *name) { return fy_test_path(tmpdir, name); }

static int count_entries(const char *dir) { return fy_test_count_entries(dir); }

/* Entries of tmpdir whose name starts with prefix (temporary directories left behind). */
static int count_prefixed(const char *prefix)
{
    DIR *d = opendir(tmpdir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

/* ---- a checkpoint in Hugging Face's layout, held in memory ---- */

#define MAX_T 40

struct hf_tensor {
    char name[96];
    int ndim;
    uint64_t shape[4];
    uint64_t numel;
    float *f;     /* values, exact in the checkpoint's dtype */
    uint16_t *h;  /* the stored 16-bit words for BF16 and F16 */
};

struct hf_ckpt {
    int dtype;
    const char *prefix;
    struct hf_tensor t[MAX_T];
    int n;
};

/* Options of a checkpoint written to disk. */
struct make_opts {
    int dtype;          /* FY_ST_F32, FY_ST_BF16 or FY_ST_F16 */
    int no_prefix;      /* names without "transformer." */
    int lm_head;        /* 1: tied copy of wte, 2: differs in one element */
    int buffers;        /* the mask buffers of old transformers versions */
    uint64_t shard;     /* > 0: sharded (F32/BF16 only) */
    const char *drop;   /* leave this tensor out (name without prefix) */
    const char *extra;  /* add a tensor of this full name */
    const char *reshape; /* give this tensor (no prefix) one row too many */
    const char *config; /* config.json text; NULL: a plain GPT-2 one for CFG */
};

static void add(struct hf_ckpt *c, const char *name, int ndim, uint64_t d0, uint64_t d1,
                uint64_t d2, uint64_t d3, uint64_t *rng)
{
    assert_true(c->n < MAX_T);
    struct hf_tensor *t = &c->t[c->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    uint64_t d[4] = {d0, d1, d2, d3};
    t->numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = d[i];
        t->numel *= d[i];
    }
    t->f = calloc(t->numel ? t->numel : 1, sizeof *t->f);
    t->h = calloc(t->numel ? t->numel : 1, sizeof *t->h);
    assert_true(t->f && t->h);
    for (uint64_t i = 0; i < t->numel; i++) {
        if (c->dtype == FY_ST_F16) { /* sign, exponent 8..21, any mantissa: normal f16 values */
            uint16_t w = (uint16_t)((fy_test_rand(rng) & 0x83ffu) |
                                    ((8u + fy_test_rand(rng) % 14u) << 10));
            t->h[i] = w;
            t->f[i] = fy_f16_to_f32(w);
        } else {
            float v = fy_test_uniform(rng, -1.0f, 1.0f);
            if (c->dtype == FY_ST_BF16) {
                t->h[i] = fy_f32_to_bf16(v);
                v = fy_bf16_to_f32(t->h[i]);
            }
            t->f[i] = v;
        }
    }
}

static struct hf_tensor *find(struct hf_ckpt *c, const char *full)
{
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->t[i].name, full) == 0)
            return &c->t[i];
    return NULL;
}

static void build(struct hf_ckpt *c, const struct make_opts *o, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    c->dtype = o->dtype;
    c->prefix = o->no_prefix ? "" : "transformer.";
    uint64_t rng = seed;
    const uint64_t C = CFG.n_embd, V = CFG.vocab, T = CFG.ctx;
    char n[96];
#define NAME(...) (snprintf(n, sizeof n, __VA_ARGS__), n)
    add(c, NAME("%swte.weight", c->prefix), 2, V, C, 0, 0, &rng);
    add(c, NAME("%swpe.weight", c->prefix), 2, T, C, 0, 0, &rng);
    for (unsigned i = 0; i < CFG.n_layer; i++) {
        add(c, NAME("%sh.%u.ln_1.weight", c->prefix, i), 1, C, 0, 0, 0, &rng);
        add(c, NAME("%sh.%u.ln_1.bias", c->prefix, i), 1, C, 0, 0, 0, &rng);
        add(c, NAME("%sh.%u.attn.c_attn.weight", c->prefix, i), 2, C, 3 * C, 0, 0, &rng);
        add(c, NAME("%sh.%u.attn.c_attn.bias", c->prefix, i), 1, 3 * C, 0, 0, 0, &rng);
        add(c, NAME("%sh.%u.attn.c_proj.weight", c->prefix, i), 2, C, C, 0, 0, &rng);
        add(c, NAME("%sh.%u.attn.c_proj.bias", c->prefix, i), 1, C, 0, 0, 0, &rng);
        add(c, NAME("%sh.%u.ln_2.weight", c->prefix, i), 1, C, 0, 0, 0, &rng);
        add(c, NAME("%sh.%u.ln_2.bias", c->prefix, i), 1, C, 0, 0, 0, &rng);
        add(c, NAME("%sh.%u.mlp.c_fc.weight", c->prefix, i), 2, C, 4 * C, 0, 0, &rng);
        add(c, NAME("%sh.%u.mlp.c_fc.bias", c->prefix, i), 1, 4 * C, 0, 0, 0, &rng);
        add(c, NAME("%sh.%u.mlp.c_proj.weight", c->prefix, i), 2, 4 * C, C, 0, 0, &rng);
        add(c, NAME("%sh.%u.mlp.c_proj.bias", c->prefix, i), 1, C, 0, 0, 0, &rng);
        if (o->buffers) {
            add(c, NAME("%sh.%u.attn.bias", c->prefix, i), 4, 1, 1, T, T, &rng);
            add(c, NAME("%sh.%u.attn.masked_bias", c->prefix, i), 0, 0, 0, 0, 0, &rng);
        }
    }
    add(c, NAME("%sln_f.weight", c->prefix), 1, C, 0, 0, 0, &rng);
    add(c, NAME("%sln_f.bias", c->prefix), 1, C, 0, 0, 0, &rng);
    if (o->lm_head) {
        add(c, "lm_head.weight", 2, V, C, 0, 0, &rng);
        struct hf_tensor *lm = &c->t[c->n - 1], *wte = &c->t[0];
        memcpy(lm->f, wte->f, wte->numel * sizeof *lm->f);
        memcpy(lm->h, wte->h, wte->numel * sizeof *lm->h);
        if (o->lm_head == 2) { /* untied: one element differs */
            lm->f[17] = lm->f[17] + 0.5f;
            lm->h[17] ^= 0x0100u;
            if (c->dtype == FY_ST_BF16)
                lm->f[17] = fy_bf16_to_f32(lm->h[17]);
            if (c->dtype == FY_ST_F16)
                lm->f[17] = fy_f16_to_f32(lm->h[17]);
        }
    }
    if (o->extra != NULL)
        add(c, o->extra, 1, 3, 0, 0, 0, &rng);
#undef NAME
}

static void ckpt_free(struct hf_ckpt *c)
{
    for (int i = 0; i < c->n; i++) {
        free(c->t[i].f);
        free(c->t[i].h);
    }
    c->n = 0;
}

static int skipped(const struct make_opts *o, const struct hf_ckpt *c, const struct hf_tensor *t)
{
    return o->drop != NULL && strcmp(t->name + strlen(c->prefix), o->drop) == 0;
}

/* A single file written by hand (any of the three dtypes): header, then the data. */
static void write_manual(const struct hf_ckpt *c, const struct make_opts *o, const char *path)
{
    size_t cap = 65536, len = 0;
    char *hdr = malloc(cap);
    assert_non_null(hdr);
    len += (size_t)snprintf(hdr + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    size_t esize = c->dtype == FY_ST_F32 ? 4 : 2;
    uint64_t off = 0;
    for (int i = 0; i < c->n; i++) {
        const struct hf_tensor *t = &c->t[i];
        if (skipped(o, c, t))
            continue;
        int grow = o->reshape && strcmp(t->name + strlen(c->prefix), o->reshape) == 0;
        len += (size_t)snprintf(hdr + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name,
                                fy_st_dtype_name(c->dtype));
        for (int d = 0; d < t->ndim; d++)
            len += (size_t)snprintf(hdr + len, cap - len, "%s%llu", d ? "," : "",
                                    (unsigned long long)(t->shape[d] + (grow && d == 0)));
        uint64_t nbytes = (t->numel + (grow ? t->numel / t->shape[0] : 0)) * esize;
        len += (size_t)snprintf(hdr + len, cap - len, "],\"data_offsets\":[%llu,%llu]}",
                                (unsigned long long)off, (unsigned long long)(off + nbytes));
        off += nbytes;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8)
        hdr[len++] = ' ';
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t hl = len;
    assert_int_equal(fwrite(&hl, 8, 1, f), 1);
    assert_int_equal(fwrite(hdr, 1, len, f), len);
    for (int i = 0; i < c->n; i++) {
        const struct hf_tensor *t = &c->t[i];
        if (skipped(o, c, t))
            continue;
        int grow = o->reshape && strcmp(t->name + strlen(c->prefix), o->reshape) == 0;
        if (c->dtype == FY_ST_F32)
            assert_int_equal(fwrite(t->f, 4, t->numel, f), t->numel);
        else
            assert_int_equal(fwrite(t->h, 2, t->numel, f), t->numel);
        if (grow) /* the extra row */
            for (uint64_t k = 0; k < t->numel / t->shape[0] * esize; k++)
                assert_int_equal(fputc(0, f), 0);
    }
    assert_int_equal(fclose(f), 0);
    free(hdr);
}

static void write_sharded(const struct hf_ckpt *c, const struct make_opts *o, const char *dir)
{
    struct fy_st_writer *w = NULL;
    assert_int_equal(fy_st_writer_new_sharded(&w, dir, o->shard, 0), 0);
    assert_int_equal(fy_st_writer_metadata(w, "format", "pt"), 0);
    for (int i = 0; i < c->n; i++)
        if (!skipped(o, c, &c->t[i]))
            assert_int_equal(fy_st_writer_declare(w, c->t[i].name, c->dtype, c->t[i].ndim,
                                                  c->t[i].shape),
                             0);
    for (int i = 0; i < c->n; i++)
        if (!skipped(o, c, &c->t[i]))
            assert_int_equal(fy_st_writer_put_f32(w, c->t[i].name, c->t[i].f, c->t[i].numel), 0);
    assert_int_equal(fy_st_writer_finish(&w), 0);
}

static char *gpt2_config_as(const struct fy_model_config *m, const char *extra, int dtype)
{
    static char buf[2048];
    snprintf(buf, sizeof buf,
             "{\n  \"activation_function\": \"gelu_new\",\n  \"architectures\": [\"GPT2LMHeadModel\"],\n"
             "  \"dtype\": \"%s\",\n  \"layer_norm_epsilon\": 1e-05,\n  \"model_type\": \"gpt2\",\n"
             "  \"n_embd\": %u,\n  \"n_head\": %u,\n  \"n_inner\": null,\n  \"n_layer\": %u,\n"
             "  \"n_positions\": %u,\n  \"tie_word_embeddings\": true,\n  \"vocab_size\": %u%s\n}\n",
             dtype == FY_ST_BF16 ? "bfloat16" : dtype == FY_ST_F16 ? "float16" : "float32",
             m->n_embd, m->n_head, m->n_layer, m->ctx, m->vocab, extra ? extra : "");
    return buf;
}

static char *gpt2_config(const struct fy_model_config *m, const char *extra)
{
    return gpt2_config_as(m, extra, FY_ST_F32);
}

/* Writes a Hugging Face directory (created) from opts; the checkpoint stays in *c. */
static void make_dir(const char *dir, const struct make_opts *o, struct hf_ckpt *c, uint64_t seed)
{
    assert_int_equal(mkdir(dir, 0755), 0);
    build(c, o, seed);
    char p[1200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    write_text(p, o->config ? o->config : gpt2_config_as(&CFG, NULL, o->dtype));
    if (o->shard) {
        write_sharded(c, o, dir);
    } else {
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        write_manual(c, o, p);
    }
}

/* ---- the mapping, stated again independently ---- */

/* Our unit u's expected parameters, from the Hugging Face tensors. */
static float *expected_unit(struct hf_ckpt *c, unsigned u)
{
    size_t n = fy_model_unit_params(&CFG, u);
    float *e = calloc(n, sizeof *e);
    assert_non_null(e);
    char name[128];
    const size_t C = CFG.n_embd;
    if (u == 0) {
        snprintf(name, sizeof name, "%swte.weight", c->prefix);
        memcpy(e, find(c, name)->f, (size_t)CFG.vocab * C * 4);
        snprintf(name, sizeof name, "%swpe.weight", c->prefix);
        memcpy(e + (size_t)CFG.vocab * C, find(c, name)->f, (size_t)CFG.ctx * C * 4);
        return e;
    }
    if (u == CFG.n_layer + 1) {
        snprintf(name, sizeof name, "%sln_f.weight", c->prefix);
        memcpy(e, find(c, name)->f, C * 4);
        snprintf(name, sizeof name, "%sln_f.bias", c->prefix);
        memcpy(e + C, find(c, name)->f, C * 4);
        return e;
    }
    struct fy_gpt2_block_layout l;
    fy_gpt2_block_layout(&CFG, &l);
    struct {
        const char *hf;
        size_t at;
        size_t in, out; /* out 0: a vector */
    } m[] = {{"ln_1.weight", l.ln1_w, C, 0},         {"ln_1.bias", l.ln1_b, C, 0},
             {"attn.c_attn.weight", l.qkv_w, C, 3 * C}, {"attn.c_attn.bias", l.qkv_b, 3 * C, 0},
             {"attn.c_proj.weight", l.attn_w, C, C},  {"attn.c_proj.bias", l.attn_b, C, 0},
             {"ln_2.weight", l.ln2_w, C, 0},         {"ln_2.bias", l.ln2_b, C, 0},
             {"mlp.c_fc.weight", l.fc_w, C, 4 * C},   {"mlp.c_fc.bias", l.fc_b, 4 * C, 0},
             {"mlp.c_proj.weight", l.proj_w, 4 * C, C}, {"mlp.c_proj.bias", l.proj_b, C, 0}};
    for (size_t k = 0; k < sizeof m / sizeof m[0]; k++) {
        snprintf(name, sizeof name, "%sh.%u.%s", c->prefix, u - 1, m[k].hf);
        const struct hf_tensor *t = find(c, name);
        assert_non_null(t);
        if (m[k].out == 0) {
            memcpy(e + m[k].at, t->f, m[k].in * 4);
            continue;
        }
        /* Conv1D: y = x W with W [in][out]; ours y = x W^T with W [out][in] */
        for (size_t i = 0; i < m[k].in; i++)
            for (size_t o = 0; o < m[k].out; o++)
                e[m[k].at + o * m[k].in + i] = t->f[i * m[k].out + o];
    }
    return e;
}

static void check_import(const char *dir, struct hf_ckpt *c, const char *dtype_name)
{
    struct fy_hf_src *s = NULL;
    assert_int_equal(fy_hf_open(&s, dir), 0);
    const struct fy_model_config *m = fy_hf_model(s);
    assert_int_equal(fy_model_config_hash(m), fy_model_config_hash(&CFG));
    assert_string_equal(fy_hf_dtype(s), dtype_name);
    for (unsigned u = 0; u < fy_model_unit_count(&CFG); u++) {
        size_t n = fy_model_unit_params(&CFG, u);
        float *got = malloc(n * sizeof *got), *want = expected_unit(c, u);
        assert_non_null(got);
        assert_int_equal(fy_hf_read_unit(s, u, got), 0);
        for (size_t i = 0; i < n; i++)
            if (memcmp(&got[i], &want[i], 4) != 0)
                fail_msg("%s: unit %u element %zu: %g, expected %g", dir, u, i, (double)got[i],
                         (double)want[i]);
        free(got);
        free(want);
    }
    fy_hf_destroy(&s);
    assert_null(s);
}

static void test_import_variants(void **state)
{
    struct {
        const char *name;
        struct make_opts o;
        const char *dtype;
    } v[] = {
        {"f32", {.dtype = FY_ST_F32}, "F32"},
        {"bf16_base", {.dtype = FY_ST_BF16, .no_prefix = 1}, "BF16"},
        {"f16", {.dtype = FY_ST_F16}, "F16"},
        {"sharded", {.dtype = FY_ST_F32, .shard = 2048}, "F32"},
        {"lmhead_buffers", {.dtype = FY_ST_F32, .lm_head = 1, .buffers = 1}, "F32"},
        {"bf16_lmhead", {.dtype = FY_ST_BF16, .lm_head = 1, .no_prefix = 1}, "BF16"},
    };
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
        struct hf_ckpt c;
        make_dir(tpath(v[k].name), &v[k].o, &c, 100 + k);
        if (v[k].o.shard) { /* really sharded: an index and several files */
            char p[1200];
            snprintf(p, sizeof p, "%s/%s", tpath(v[k].name), FY_ST_INDEX_NAME);
            assert_int_equal(access(p, F_OK), 0);
            assert_true(count_entries(tpath(v[k].name)) > 3);
        }
        check_import(tpath(v[k].name), &c, v[k].dtype);
        ckpt_free(&c);
    }
}

/* ---- refusals ---- */

struct refusal {
    const char *dir;
    int unit; /* -1: refused at open; else the unit whose read is refused */
};

static int open_and_read(void *arg)
{
    const struct refusal *r = arg;
    struct fy_hf_src *s = NULL;
    int rc = fy_hf_open(&s, r->dir);
    if (rc == 0 && r->unit >= 0) {
        float *p = calloc(fy_model_unit_params(&CFG, (unsigned)r->unit), sizeof *p);
        rc = p ? fy_hf_read_unit(s, (unsigned)r->unit, p) : -ENOMEM;
        free(p);
    }
    fy_hf_destroy(&s);
    return rc;
}

/* Refused with code, in one line naming the file and each of want1, want2 (may be NULL). */
static void expect_refused(const char *dir, int unit, int code, const char *file, const char *want1,
                           const char *want2)
{
    struct refusal r = {dir, unit};
    int rc = 0;
    char *log = fy_test_capture_stderr(open_and_read, &r, &rc);
    assert_non_null(log);
    if (rc != code)
        fail_msg("%s: expected %d (%s), got %d (%s); log: %s", dir, code, strerror(-code), rc,
                 strerror(-rc), log);
    if (fy_test_count_lines(log) != 1)
        fail_msg("%s: expected one line, got: %s", dir, log);
    const char *w[] = {file, want1, want2};
    for (int i = 0; i < 3; i++)
        if (w[i] != NULL && strstr(log, w[i]) == NULL)
            fail_msg("log '%s' lacks '%s'", log, w[i]);
    free(log);
}

static void test_config_refusals(void **state)
{
    struct {
        const char *name;
        const char *text;
        const char *want;
    } v[] = {
        {"gemma", "{\"model_type\": \"gemma\", \"architectures\": [\"GemmaForCausalLM\"]}",
         "GemmaForCausalLM"},
        {"phi3-longrope", "{\"model_type\": \"phi3\", \"rope_scaling\": {\"type\": \"longrope\"}}",
         "\"rope_scaling\": type \"longrope\" is not supported"},
        {"phi3-partial", "{\"model_type\": \"phi3\", \"partial_rotary_factor\": 0.5}",
         "partial_rotary_factor"},
        {"qwen2-window", "{\"model_type\": \"qwen2\", \"use_sliding_window\": true}",
         "use_sliding_window"},
        {"qwen3-bias", "{\"model_type\": \"qwen3\", \"attention_bias\": true}", "attention_bias"},
        {"llama-yarn", "{\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"yarn\"}}",
         "rope_type \"yarn\" is not supported"},
        {"arch", "{\"model_type\": \"gpt2\", \"architectures\": [\"GPT2DoubleHeadsModel\"]}",
         "GPT2DoubleHeadsModel"},
        {"gelu", "{\"model_type\": \"gpt2\", \"activation_function\": \"gelu\"}", "activation_function"},
        {"eps", "{\"model_type\": \"gpt2\", \"layer_norm_epsilon\": 1e-6}", "layer_norm_epsilon"},
        {"inner", "{\"model_type\": \"gpt2\", \"n_embd\": 8, \"n_head\": 2, \"n_inner\": 24}", "n_inner"},
        {"bylayer", "{\"model_type\": \"gpt2\", \"scale_attn_by_inverse_layer_idx\": true}",
         "scale_attn_by_inverse_layer_idx"},
        {"noscale", "{\"model_type\": \"gpt2\", \"scale_attn_weights\": false}", "scale_attn_weights"},
        {"cross", "{\"model_type\": \"gpt2\", \"add_cross_attention\": true}", "add_cross_attention"},
        {"untied", "{\"model_type\": \"gpt2\", \"tie_word_embeddings\": false}", "tie_word_embeddings"},
        {"layers", "{\"model_type\": \"gpt2\", \"n_layer\": -2}", "n_layer"},
        {"json", "{\"model_type\": \"gpt2\", ", "JSON"},
        {"heads", "{\"model_type\": \"gpt2\", \"n_embd\": 10, \"n_head\": 3}", "n_head"},
        {"vocab", "{\"model_type\": \"gpt2\", \"vocab_size\": 1}", "vocab_size"},
    };
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
        const char *dir = tpath(v[k].name);
        assert_int_equal(mkdir(dir, 0755), 0);
        char p[1200];
        snprintf(p, sizeof p, "%s/config.json", dir);
        write_text(p, v[k].text);
        expect_refused(dir, -1, -EINVAL, p, v[k].want, NULL);
        struct fy_model_config m;
        assert_int_equal(fy_hf_read_config(p, &m), -EINVAL);
    }
    /* Defaults are GPT2Config's. */
    const char *dir = tpath("defaults");
    assert_int_equal(mkdir(dir, 0755), 0);
    char p[1200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    struct fy_model_config m;
    write_text(p, "{\"model_type\": \"gpt2\"}");
    assert_int_equal(fy_hf_read_config(p, &m), 0);
    assert_int_equal(m.n_layer, 12);
    assert_int_equal(m.n_head, 12);
    assert_int_equal(m.n_embd, 768);
    assert_int_equal(m.vocab, 50257);
    assert_int_equal(m.ctx, 1024);
    write_text(p, gpt2_config(&CFG, ",\n  \"activation_function\": \"gelu_pytorch_tanh\""));
    assert_int_equal(fy_hf_read_config(p, &m), 0);
    assert_int_equal(fy_model_config_hash(&m), fy_model_config_hash(&CFG));
}

static void test_checkpoint_refusals(void **state)
{
    struct hf_ckpt c;
    char file[1200];
    /* missing tensor */
    struct make_opts o = {.dtype = FY_ST_F32, .drop = "h.1.mlp.c_fc.bias"};
    make_dir(tpath("drop"), &o, &c, 1);
    snprintf(file, sizeof file, "%s/model.safetensors", tpath("drop"));
    expect_refused(tpath("drop"), -1, -EINVAL, file, "transformer.h.1.mlp.c_fc.bias", "missing");
    ckpt_free(&c);
    /* shape mismatch with config.json */
    o = (struct make_opts){.dtype = FY_ST_BF16, .reshape = "h.0.attn.c_attn.weight"};
    make_dir(tpath("shape"), &o, &c, 2);
    snprintf(file, sizeof file, "%s/model.safetensors", tpath("shape"));
    expect_refused(tpath("shape"), -1, -EINVAL, file, "transformer.h.0.attn.c_attn.weight",
                   "[9, 24]");
    ckpt_free(&c);
    /* config.json for another width than the tensors */
    struct fy_model_config wide = CFG;
    wide.n_embd = 16;
    o = (struct make_opts){.dtype = FY_ST_F32, .config = gpt2_config(&wide, NULL)};
    make_dir(tpath("wide"), &o, &c, 3);
    snprintf(file, sizeof file, "%s/model.safetensors", tpath("wide"));
    expect_refused(tpath("wide"), -1, -EINVAL, file, "transformer.wte.weight", "config.json");
    ckpt_free(&c);
    /* a tensor that is not a GPT-2 parameter (a block beyond n_layer) */
    o = (struct make_opts){.dtype = FY_ST_F32, .extra = "transformer.h.2.ln_1.weight"};
    make_dir(tpath("extra"), &o, &c, 4);
    snprintf(file, sizeof file, "%s/model.safetensors", tpath("extra"));
    expect_refused(tpath("extra"), -1, -EINVAL, file, "transformer.h.2.ln_1.weight", NULL);
    ckpt_free(&c);
    /* names without the prefix mixed with prefixed ones */
    o = (struct make_opts){.dtype = FY_ST_F32, .extra = "h.0.ln_1.weight"};
    make_dir(tpath("mixed"), &o, &c, 5);
    expect_refused(tpath("mixed"), -1, -EINVAL, "mixed/model.safetensors", "h.0.ln_1.weight",
                   NULL);
    ckpt_free(&c);
    /* an untied LM head: refused when unit 0 is read */
    o = (struct make_opts){.dtype = FY_ST_F32, .lm_head = 2};
    make_dir(tpath("untied"), &o, &c, 6);
    snprintf(file, sizeof file, "%s/model.safetensors", tpath("untied"));
    expect_refused(tpath("untied"), 0, -EINVAL, file, "lm_head.weight", "element 17");
    ckpt_free(&c);
    /* corrupt header: the JSON cut short */
    o = (struct make_opts){.dtype = FY_ST_F32};
    make_dir(tpath("corrupt"), &o, &c, 7);
    snprintf(file, sizeof file, "%s/model.safetensors", tpath("corrupt"));
    FILE *f = fopen(file, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, 8, SEEK_SET), 0); /* the header's opening brace */
    assert_int_equal(fputc('#', f), '#');
    assert_int_equal(fclose(f), 0);
    expect_refused(tpath("corrupt"), -1, -EBADMSG, file, NULL, NULL);
    ckpt_free(&c);
    /* missing shard */
    o = (struct make_opts){.dtype = FY_ST_F32, .shard = 2048};
    make_dir(tpath("noshard"), &o, &c, 8);
    snprintf(file, sizeof file, "%s/model-00002-of-%05d.safetensors", tpath("noshard"),
             count_entries(tpath("noshard")) - 2);
    assert_int_equal(unlink(file), 0);
    expect_refused(tpath("noshard"), -1, -ENOENT, "model-00002-of-", "transformer.", NULL);
    ckpt_free(&c);
    /* no checkpoint, no config, not a directory */
    assert_int_equal(mkdir(tpath("empty"), 0755), 0);
    snprintf(file, sizeof file, "%s/config.json", tpath("empty"));
    expect_refused(tpath("empty"), -1, -ENOENT, file, NULL, NULL);
    write_text(file, gpt2_config(&CFG, NULL));
    write_text(tpath("empty/pytorch_model.bin"), "not really");
    expect_refused(tpath("empty"), -1, -ENOENT, tpath("empty"), "safe_serialization", NULL);
    expect_refused(tpath("nonexistent"), -1, -ENOENT, tpath("nonexistent"), NULL, NULL);
}

/* ---- export ---- */

/* Imports dir into memory (every unit) and exports it to out with opts. */
static int roundtrip(const char *dir, const char *record, const char *out,
                     const struct fy_hf_export_opts *eo)
{
    struct fy_hf_src *s = NULL;
    assert_int_equal(fy_hf_open(&s, dir), 0);
    if (record != NULL)
        assert_int_equal(fy_hf_save_source(s, record), 0);
    struct fy_hf_writer *w = NULL;
    int rc = fy_hf_writer_new(&w, out, fy_hf_model(s), eo);
    for (unsigned u = 0; rc == 0 && u < fy_model_unit_count(&CFG); u++) {
        float *p = calloc(fy_model_unit_params(&CFG, u), sizeof *p);
        assert_non_null(p);
        assert_int_equal(fy_hf_read_unit(s, u, p), 0);
        rc = fy_hf_writer_put_unit(w, u, p);
        free(p);
    }
    if (rc == 0)
        rc = fy_hf_writer_finish(&w);
    fy_hf_writer_destroy(&w);
    fy_hf_destroy(&s);
    return rc;
}

/* Every tensor of a (buffers aside) in b: same name, shape; dtype `want_dtype` (0: a's), bytes
 * equal, or values equal when the dtype changed. */
static void compare_dirs(const char *a, const char *b, int want_dtype)
{
    struct fy_st_reader *ra = NULL, *rb = NULL;
    assert_int_equal(fy_st_open(&ra, a), 0);
    assert_int_equal(fy_st_open(&rb, b), 0);
    size_t params = 0;
    for (size_t i = 0; i < fy_st_count(ra); i++) {
        const struct fy_st_tensor *ta = fy_st_tensor_at(ra, i);
        size_t n = strlen(ta->name);
        if ((n > 10 && strcmp(ta->name + n - 10, ".attn.bias") == 0) ||
            (n > 17 && strcmp(ta->name + n - 17, ".attn.masked_bias") == 0)) {
            assert_null(fy_st_find(rb, ta->name));
            continue;
        }
        params++;
        const struct fy_st_tensor *tb = fy_st_find(rb, ta->name);
        if (tb == NULL)
            fail_msg("%s lacks %s", b, ta->name);
        assert_int_equal(ta->ndim, tb->ndim);
        for (int d = 0; d < ta->ndim; d++)
            assert_int_equal(ta->shape[d], tb->shape[d]);
        assert_int_equal(tb->dtype, want_dtype ? want_dtype : ta->dtype);
        if (ta->dtype == tb->dtype) {
            uint8_t *x = malloc(ta->nbytes), *y = malloc(tb->nbytes);
            assert_true(x && y);
            assert_int_equal(fy_st_read_raw(ra, ta, x, ta->nbytes), 0);
            assert_int_equal(fy_st_read_raw(rb, tb, y, tb->nbytes), 0);
            if (memcmp(x, y, ta->nbytes) != 0)
                fail_msg("%s differs between %s and %s", ta->name, a, b);
            free(x);
            free(y);
        } else {
            float *x = malloc(ta->numel * 4), *y = malloc(tb->numel * 4);
            assert_true(x && y);
            assert_int_equal(fy_st_read_f32(ra, ta, x, ta->numel), 0);
            assert_int_equal(fy_st_read_f32(rb, tb, y, tb->numel), 0);
            for (uint64_t k = 0; k < ta->numel; k++) {
                float want = tb->dtype == FY_ST_BF16 ? fy_bf16_to_f32(fy_f32_to_bf16(x[k])) : x[k];
                if (memcmp(&want, &y[k], 4) != 0)
                    fail_msg("%s[%llu]: %g, expected %g", ta->name, (unsigned long long)k,
                             (double)y[k], (double)want);
            }
            free(x);
            free(y);
        }
    }
    assert_int_equal(fy_st_count(rb), params);
    const char *fa = fy_st_metadata(rb, "format");
    assert_non_null(fa);
    assert_string_equal(fa, "pt");
    fy_st_destroy(&ra);
    fy_st_destroy(&rb);
}

static void files_equal(const char *a, const char *b)
{
    size_t la, lb;
    char *x = fy_test_slurp(a, &la), *y = fy_test_slurp(b, &lb);
    assert_true(x && y);
    assert_int_equal(la, lb);
    assert_memory_equal(x, y, la);
    free(x);
    free(y);
}

static void test_roundtrip(void **state)
{
    struct {
        const char *name;
        struct make_opts o;
        int force, want;
    } v[] = {
        {"rt_f32", {.dtype = FY_ST_F32, .buffers = 1}, 0, 0},
        {"rt_bf16", {.dtype = FY_ST_BF16, .no_prefix = 1, .lm_head = 1}, 0, 0},
        {"rt_sharded", {.dtype = FY_ST_BF16, .shard = 2048}, 0, 0},
        {"rt_f16", {.dtype = FY_ST_F16}, 0, FY_ST_F32},
        {"rt_f16_bf16", {.dtype = FY_ST_F16}, FY_ST_BF16, FY_ST_BF16},
        {"rt_f32_bf16", {.dtype = FY_ST_F32}, FY_ST_BF16, FY_ST_BF16},
    };
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
        struct hf_ckpt c;
        char src[1100], rec[1100], out[1100], p[1200], q[1200];
        snprintf(src, sizeof src, "%s", tpath(v[k].name));
        snprintf(rec, sizeof rec, "%s.rec", src);
        snprintf(out, sizeof out, "%s.out", src);
        make_dir(src, &v[k].o, &c, 200 + k);
        struct fy_hf_export_opts eo = {.source = rec, .dtype = v[k].force,
                                           .max_shard_bytes = 1000000000};
        assert_int_equal(roundtrip(src, rec, out, &eo), 0);
        compare_dirs(src, out, v[k].want);
        snprintf(p, sizeof p, "%s/config.json", src);
        snprintf(q, sizeof q, "%s/config.json", out);
        if (v[k].want == 0) { /* nothing to change: the original, byte for byte */
            files_equal(p, q);
        } else { /* the dtype entry follows the tensors; the rest is the same model */
            size_t len;
            char *text = fy_test_slurp(q, &len);
            assert_non_null(text);
            assert_non_null(strstr(text, v[k].want == FY_ST_BF16 ? "\"bfloat16\"" : "\"float32\""));
            free(text);
            struct fy_model_config m;
            assert_int_equal(fy_hf_read_config(q, &m), 0);
            assert_int_equal(fy_model_config_hash(&m), fy_model_config_hash(&CFG));
        }
        /* one file: the shard limit is far above the model (the source's sharding is not kept) */
        assert_int_equal(count_entries(out), 2);
        /* the record holds the original config byte for byte */
        snprintf(q, sizeof q, "%s/config.json", rec);
        files_equal(p, q);
        ckpt_free(&c);
    }
    assert_int_equal(count_prefixed("rt_f32.out.tmp-"), 0);
    assert_int_equal(count_prefixed("rt_f32.rec.tmp-"), 0);
}

static void test_export_sharded_and_made_here(void **state)
{
    struct hf_ckpt c;
    struct make_opts o = {.dtype = FY_ST_F32};
    make_dir(tpath("sh"), &o, &c, 300);
    /* sharded output with its index, from the record */
    struct fy_hf_export_opts eo = {.source = tpath("sh.rec"), .max_shard_bytes = 3000};
    assert_int_equal(roundtrip(tpath("sh"), tpath("sh.rec"), tpath("sh.out"), &eo), 0);
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", tpath("sh.out"), FY_ST_INDEX_NAME);
    assert_int_equal(access(p, F_OK), 0);
    assert_true(count_entries(tpath("sh.out")) > 3);
    compare_dirs(tpath("sh"), tpath("sh.out"), 0);
    /* no source: a config.json made from the model, names with the prefix, F32 */
    eo = (struct fy_hf_export_opts){.source = NULL};
    assert_int_equal(roundtrip(tpath("sh"), NULL, tpath("sh.made"), &eo), 0);
    compare_dirs(tpath("sh"), tpath("sh.made"), 0);
    snprintf(p, sizeof p, "%s/config.json", tpath("sh.made"));
    struct fy_model_config m;
    assert_int_equal(fy_hf_read_config(p, &m), 0);
    assert_int_equal(fy_model_config_hash(&m), fy_model_config_hash(&CFG));
    ckpt_free(&c);
}

static int new_writer(void *arg)
{
    struct fy_hf_writer *w = NULL;
    struct fy_hf_export_opts eo = {0};
    int rc = fy_hf_writer_new(&w, arg, &CFG, &eo);
    fy_hf_writer_destroy(&w);
    return rc;
}

/* Exports CFG's unit values (all 0.25) into dir without a source. */
static int export_plain(const char *dir, int overwrite, unsigned units)
{
    struct fy_hf_writer *w = NULL;
    struct fy_hf_export_opts eo = {.overwrite = overwrite};
    int rc = fy_hf_writer_new(&w, dir, &CFG, &eo);
    for (unsigned u = 0; rc == 0 && u < units; u++) {
        size_t n = fy_model_unit_params(&CFG, u);
        float *p = malloc(n * sizeof *p);
        assert_non_null(p);
        for (size_t i = 0; i < n; i++)
            p[i] = 0.25f;
        rc = fy_hf_writer_put_unit(w, u, p);
        free(p);
    }
    if (rc == 0)
        rc = fy_hf_writer_finish(&w);
    fy_hf_writer_destroy(&w);
    return rc;
}

static void test_export_targets(void **state)
{
    /* a non-empty directory is refused and left as it was */
    const char *d = tpath("full");
    assert_int_equal(mkdir(d, 0755), 0);
    write_text(tpath("full/notes.txt"), "mine");
    int rc = 0;
    char *log = fy_test_capture_stderr(new_writer, (void *)d, &rc);
    assert_int_equal(rc, -EEXIST);
    assert_int_equal(fy_test_count_lines(log), 1);
    assert_non_null(strstr(log, d));
    free(log);
    assert_int_equal(count_entries(d), 1);
    assert_int_equal(count_prefixed("full.tmp-"), 0);
    /* a file where the directory should be */
    write_text(tpath("afile"), "x");
    assert_int_equal(export_plain(tpath("afile"), 1, fy_model_unit_count(&CFG)), -ENOTDIR);
    /* an empty directory is used */
    assert_int_equal(mkdir(tpath("emptyout"), 0755), 0);
    assert_int_equal(export_plain(tpath("emptyout"), 0, fy_model_unit_count(&CFG)), 0);
    assert_int_equal(count_entries(tpath("emptyout")), 2);
    /* with overwrite: the model files are replaced, a stale shard goes, other files stay */
    write_text(tpath("full/model-00001-of-00002.safetensors"), "stale");
    write_text(tpath("full/config.json"), "{}");
    assert_int_equal(export_plain(d, 1, fy_model_unit_count(&CFG)), 0);
    assert_int_equal(count_entries(d), 3);
    size_t len;
    char *text = fy_test_slurp(tpath("full/notes.txt"), &len);
    assert_non_null(text);
    assert_string_equal(text, "mine");
    free(text);
    assert_int_equal(access(tpath("full/model-00001-of-00002.safetensors"), F_OK), -1);
    struct fy_model_config m;
    assert_int_equal(fy_hf_read_config(tpath("full/config.json"), &m), 0);
    assert_int_equal(count_prefixed("full.tmp-"), 0);
    /* overwrite refuses a directory that holds directories */
    assert_int_equal(mkdir(tpath("full/sub"), 0755), 0);
    assert_int_equal(export_plain(d, 1, fy_model_unit_count(&CFG)), -EISDIR);
    /* an export that stops half-way leaves nothing: neither the target nor a temporary */
    assert_int_equal(export_plain(tpath("half"), 0, 2), -EINVAL);
    assert_int_equal(access(tpath("half"), F_OK), -1);
    assert_int_equal(count_prefixed("half"), 0);
    /* and units must come in order */
    struct fy_hf_writer *w = NULL;
    struct fy_hf_export_opts eo = {0};
    assert_int_equal(fy_hf_writer_new(&w, tpath("order"), &CFG, &eo), 0);
    float *p = calloc(fy_model_unit_params(&CFG, 1), sizeof *p);
    assert_int_equal(fy_hf_writer_put_unit(w, 1, p), -EINVAL);
    free(p);
    fy_hf_writer_destroy(&w);
    assert_int_equal(count_prefixed("order"), 0);
}

static void test_source_record(void **state)
{
    struct hf_ckpt c;
    struct make_opts o = {.dtype = FY_ST_BF16};
    make_dir(tpath("rec"), &o, &c, 400);
    /* the generation settings and the tokenizer's files travel with the model; a README does not */
    static const char *const carried[] = {"generation_config.json", "tokenizer.json",
                                          "tokenizer_config.json", "special_tokens_map.json",
                                          "vocab.json", "merges.txt"};
    const size_t ncarried = sizeof carried / sizeof carried[0];
    for (size_t i = 0; i < ncarried; i++) {
        char name[64], text[160];
        snprintf(name, sizeof name, "rec/%s", carried[i]);
        snprintf(text, sizeof text, "{\"file\": \"%s\", \"bos_token_id\": 10}\n", carried[i]);
        write_text(tpath(name), text);
    }
    write_text(tpath("rec/README.md"), "a model card\n");
    struct fy_hf_src *s = NULL;
    assert_int_equal(fy_hf_open(&s, tpath("rec")), 0);
    assert_int_equal(fy_hf_save_source(s, tpath("rec.hf")), 0);
    assert_int_equal(fy_hf_save_source(s, tpath("rec.hf")), -EEXIST);
    fy_hf_destroy(&s);
    assert_int_equal(count_entries(tpath("rec.hf")), 2 + (int)ncarried); /* config, source */
    struct fy_hf_export_opts eo = {.source = tpath("rec.hf")};
    assert_int_equal(roundtrip(tpath("rec"), NULL, tpath("rec.out"), &eo), 0);
    for (size_t i = 0; i < ncarried; i++) {
        char src[64], rec[64], out[64];
        snprintf(src, sizeof src, "rec/%s", carried[i]);
        snprintf(rec, sizeof rec, "rec.hf/%s", carried[i]);
        snprintf(out, sizeof out, "rec.out/%s", carried[i]);
        files_equal(tpath(src), tpath(rec));
        files_equal(tpath(src), tpath(out)); /* the export carries it, byte for byte */
    }
    assert_int_equal(access(tpath("rec.out/README.md"), F_OK), -1);
    /* a record whose config no longer matches the model is refused */
    struct fy_model_config other = CFG;
    other.n_layer = 3;
    struct fy_hf_writer *w = NULL;
    assert_int_equal(fy_hf_writer_new(&w, tpath("rec.bad"), &other, &eo), -EINVAL);
    assert_null(w);
    ckpt_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_import_variants, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_export_sharded_and_made_here, setup, teardown),
        cmocka_unit_test_setup_teardown(test_export_targets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_source_record, setup, teardown),
    };
    return cmocka_run_group_tests_name("hfgpt2", tests, NULL, NULL);
}
