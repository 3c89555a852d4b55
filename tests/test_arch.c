/* Tests of the model-family registry (common/model/arch) and of what common/model/model derives
 * from a family's tensor table, against numbers worked out by hand and values pinned from the
 * hand-written tables that the registry replaced:
 *   - lookup by model.conf name, config.json model_type and binary id; unknown names give NULL;
 *     a config that names no family is GPT-2;
 *   - every unit's tensors lie one after another from 0 and cover the unit; unit sizes by formula
 *     (GPT-2: V*C + T*C, 12C^2 + 13C, 2C; Llama: V*C, the block's nine tensors, C (+ V*C untied));
 *   - the GPT-2 and Llama block layouts at offsets computed by hand;
 *   - the weight-decay segments: neighbours merged, matrices and embeddings decayed, norms and
 *     biases not, in the segments the hand-written code gave;
 *   - initialisation and the config hash: the values the code before the registry gave (pinned),
 *     so stores and runs made before it still load and train the same;
 *   - model.conf round trips of both families, and the Hugging Face names with the block index. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/arch/arch.h"
#include "common/model/arch/gpt2.h"
#include "common/model/arch/llama.h"
#include "common/base/config.h"
#include "common/model/model.h"

static struct fy_model_config gpt2(void)
{
    return (struct fy_model_config){.n_layer = 3, .n_head = 2, .n_embd = 16, .vocab = 50,
                                    .ctx = 12};
}

static struct fy_model_config llama(int tied)
{
    return (struct fy_model_config){
        .n_layer = 2,
        .n_head = 4,
        .n_embd = 32,
        .vocab = 300,
        .ctx = 64,
        .arch = &fy_arch_llama,
        .family = fy_llama_family((struct fy_llama_fields){.n_kv_head = 2,
                                                           .n_inter = 48,
                                                           .tied = (uint32_t)tied,
                                                           .rope_type = FY_ROPE_LLAMA3,
                                                           .rope_orig_max_pos = 8192,
                                                           .rms_eps = 1e-5f,
                                                           .rope_theta = 500000.0,
                                                           .rope_factor = 8,
                                                           .rope_low_freq_factor = 1,
                                                           .rope_high_freq_factor = 4})};
}

static void test_lookup(void **state)
{
    unsigned n;
    const struct fy_arch *const *all = fy_arch_all(&n);
    assert_int_equal(n, 6);
    assert_ptr_equal(all[0], &fy_arch_gpt2);
    for (unsigned i = 0; i < n; i++) {
        assert_ptr_equal(fy_arch_by_name(all[i]->name), all[i]);
        assert_ptr_equal(fy_arch_by_hf_model_type(all[i]->hf_model_type), all[i]);
        assert_ptr_equal(fy_arch_by_id(all[i]->id), all[i]);
        for (unsigned j = 0; j < i; j++)
            assert_int_not_equal(all[i]->id, all[j]->id);
    }
    assert_null(fy_arch_by_name("gemma"));
    assert_null(fy_arch_by_name(NULL));
    assert_null(fy_arch_by_hf_model_type("bert"));
    assert_null(fy_arch_by_id(7));
    struct fy_model_config c = gpt2();
    assert_ptr_equal(fy_model_arch(&c), &fy_arch_gpt2);
    char names[96];
    fy_arch_names(names, sizeof names, 0);
    assert_string_equal(names, "gpt2, llama, qwen2, qwen3, mistral, phi3");
}

/* Tensors contiguous from 0, covering the unit, the sizes by formula. */
static void check_units(const struct fy_model_config *c, const size_t *want, unsigned count)
{
    assert_int_equal(fy_model_unit_count(c), count);
    size_t total = 0;
    for (unsigned u = 0; u < count; u++) {
        struct fy_tensor_spec t[FY_UNIT_MAX_TENSORS];
        unsigned n = fy_unit_tensors(c, u, t);
        size_t at = 0;
        for (unsigned k = 0; k < n; k++) {
            assert_int_equal(t[k].offset, at);
            at += fy_tensor_numel(&t[k]);
        }
        assert_int_equal(at, want[u]);
        assert_int_equal(fy_model_unit_params(c, u), want[u]);
        total += want[u];
    }
    assert_int_equal(fy_model_total_params(c), total);
}

static void test_unit_sizes(void **state)
{
    struct fy_model_config g = gpt2();
    size_t C = 16, V = 50, T = 12, block = 12 * C * C + 13 * C;
    const size_t gw[5] = {V * C + T * C, block, block, block, 2 * C};
    check_units(&g, gw, 5);
    size_t LC = 32, LV = 300, hd = 8, I = 48;
    size_t lblock = 2 * LC + 4 * hd * LC + 2 * 2 * hd * LC + 4 * hd * LC + 3 * I * LC;
    struct fy_model_config l = llama(0);
    const size_t lw[4] = {LV * LC, lblock, lblock, LC + LV * LC};
    check_units(&l, lw, 4);
    l = llama(1);
    const size_t lt[4] = {LV * LC, lblock, lblock, LC};
    check_units(&l, lt, 4);
}

static void test_layouts(void **state)
{
    struct fy_model_config g = gpt2();
    struct fy_gpt2_block_layout b;
    fy_gpt2_block_layout(&g, &b);
    size_t C = 16;
    assert_int_equal(b.ln1_w, 0);
    assert_int_equal(b.ln1_b, C);
    assert_int_equal(b.qkv_w, 2 * C);
    assert_int_equal(b.qkv_b, 2 * C + 3 * C * C);
    assert_int_equal(b.attn_w, 5 * C + 3 * C * C);
    assert_int_equal(b.attn_b, 5 * C + 4 * C * C);
    assert_int_equal(b.ln2_w, 6 * C + 4 * C * C);
    assert_int_equal(b.ln2_b, 7 * C + 4 * C * C);
    assert_int_equal(b.fc_w, 8 * C + 4 * C * C);
    assert_int_equal(b.fc_b, 8 * C + 8 * C * C);
    assert_int_equal(b.proj_w, 12 * C + 8 * C * C);
    assert_int_equal(b.proj_b, 12 * C + 12 * C * C);
    assert_int_equal(b.total, 13 * C + 12 * C * C);
    struct fy_model_config l = llama(0);
    struct fy_llama_unit_layout y;
    fy_llama_unit_layout(&l, &y);
    size_t LC = 32, Q = 32, KV = 16, I = 48;
    assert_int_equal(y.input_norm, 0);
    assert_int_equal(y.q_proj, LC);
    assert_int_equal(y.k_proj, LC + Q * LC);
    assert_int_equal(y.v_proj, LC + Q * LC + KV * LC);
    assert_int_equal(y.o_proj, LC + Q * LC + 2 * KV * LC);
    assert_int_equal(y.post_norm, LC + 2 * Q * LC + 2 * KV * LC);
    assert_int_equal(y.gate_proj, 2 * LC + 2 * Q * LC + 2 * KV * LC);
    assert_int_equal(y.up_proj, 2 * LC + 2 * Q * LC + 2 * KV * LC + I * LC);
    assert_int_equal(y.down_proj, 2 * LC + 2 * Q * LC + 2 * KV * LC + 2 * I * LC);
    assert_int_equal(y.total, 2 * LC + 2 * Q * LC + 2 * KV * LC + 3 * I * LC);
}

static void expect_segments(const struct fy_model_config *c, unsigned unit,
                            const struct fy_param_segment *want, int n)
{
    struct fy_param_segment seg[FY_MODEL_MAX_SEGMENTS];
    assert_int_equal(fy_model_decay_segments(c, unit, seg), n);
    for (int i = 0; i < n; i++) {
        assert_int_equal(seg[i].begin, want[i].begin);
        assert_int_equal(seg[i].end, want[i].end);
        assert_int_equal(seg[i].decay, want[i].decay);
    }
}

static void test_decay_segments(void **state)
{
    struct fy_model_config g = gpt2();
    struct fy_gpt2_block_layout b;
    fy_gpt2_block_layout(&g, &b);
    const struct fy_param_segment gb[] = {
        {b.ln1_w, b.qkv_w, 0},  {b.qkv_w, b.qkv_b, 1},   {b.qkv_b, b.attn_w, 0},
        {b.attn_w, b.attn_b, 1}, {b.attn_b, b.fc_w, 0},  {b.fc_w, b.fc_b, 1},
        {b.fc_b, b.proj_w, 0},  {b.proj_w, b.proj_b, 1}, {b.proj_b, b.total, 0}};
    expect_segments(&g, 2, gb, 9);
    const struct fy_param_segment ge[] = {{0, 50 * 16 + 12 * 16, 1}};
    expect_segments(&g, 0, ge, 1);
    const struct fy_param_segment gf[] = {{0, 32, 0}};
    expect_segments(&g, 4, gf, 1);
    struct fy_model_config l = llama(0);
    struct fy_llama_unit_layout y;
    fy_llama_unit_layout(&l, &y);
    const struct fy_param_segment lb[] = {{0, y.q_proj, 0}, {y.q_proj, y.post_norm, 1},
                                          {y.post_norm, y.gate_proj, 0}, {y.gate_proj, y.total, 1}};
    expect_segments(&l, 1, lb, 4);
    const struct fy_param_segment lf[] = {{0, 32, 0}, {32, 32 + 300 * 32, 1}};
    expect_segments(&l, 3, lf, 2);
    l = llama(1);
    expect_segments(&l, 3, lf, 1);
}

static double weighted_sum(const float *p, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += p[i] * (double)(i % 7 + 1);
    return s;
}

/* The sums the hand-written initialisation gave for these units (seed 7): the registry's init
 * rules must reproduce every value, or resumed stores and fixtures would change. */
static void test_init_and_hash_pinned(void **state)
{
    struct fy_model_config g = gpt2(), l = llama(0);
    assert_int_equal(fy_model_config_hash(&g), 0xdb67c47c35074517ull);
    assert_int_equal(fy_model_config_hash(&l), 0x4f31c270acd9942dull);
    const double gsum[5] = {2.8389029706486326, 123.42072869014059, 117.09495379946537,
                            120.36577070003113, 59};
    const double lsum[4] = {5.5231190523013538, 263.16799079940154, 250.24547270646519,
                            136.33599641992032};
    for (unsigned u = 0; u < 9; u++) {
        const struct fy_model_config *c = u < 5 ? &g : &l;
        unsigned unit = u < 5 ? u : u - 5;
        size_t n = fy_model_unit_params(c, unit);
        float *p = malloc(n * sizeof *p);
        assert_non_null(p);
        fy_model_init_unit(c, unit, 7, p);
        assert_true(weighted_sum(p, n) == (u < 5 ? gsum[unit] : lsum[unit]));
        free(p);
    }
    /* every field is in the hash */
    struct fy_model_config other = l;
    fy_llama_mut(&other)->rope_theta = 10000.0;
    assert_int_not_equal(fy_model_config_hash(&other), fy_model_config_hash(&l));
    other = l;
    fy_llama_mut(&other)->tied = 1;
    assert_int_not_equal(fy_model_config_hash(&other), fy_model_config_hash(&l));
}

static void round_trip(const struct fy_model_config *c)
{
    struct fy_config *cfg = malloc(sizeof *cfg);
    assert_non_null(cfg);
    fy_config_init(cfg);
    assert_int_equal(fy_model_config_to(c, cfg), 0);
    struct fy_model_config back;
    assert_int_equal(fy_model_config_from(cfg, &back), 0);
    assert_ptr_equal(fy_model_arch(&back), fy_model_arch(c));
    assert_int_equal(fy_model_config_hash(&back), fy_model_config_hash(c));
    /* GPT-2's model.conf stays as it always was: no model.arch */
    assert_true((fy_config_get(cfg, "model.arch") == NULL) == (fy_model_arch(c) == &fy_arch_gpt2));
    free(cfg);
}

static void test_conf_round_trip(void **state)
{
    struct fy_model_config g = gpt2(), l = llama(0), t = llama(1);
    round_trip(&g);
    round_trip(&l);
    round_trip(&t);
    struct fy_config *cfg = malloc(sizeof *cfg);
    assert_non_null(cfg);
    fy_config_init(cfg);
    assert_int_equal(fy_model_config_to(&g, cfg), 0);
    assert_int_equal(fy_config_set(cfg, "model.arch", "bert"), 0);
    struct fy_model_config back;
    assert_int_equal(fy_model_config_from(cfg, &back), -EINVAL);
    free(cfg);
}

static void test_hf_names(void **state)
{
    struct fy_model_config g = gpt2(), l = llama(0);
    struct fy_tensor_spec t[FY_UNIT_MAX_TENSORS];
    char name[160];
    assert_int_equal(fy_unit_tensors(&g, 3, t), 12);
    fy_tensor_hf_name(&g, 3, &t[2], name, sizeof name);
    assert_string_equal(name, "h.2.attn.c_attn.weight");
    assert_true(t[2].transposed && t[2].shape[0] == 16 && t[2].shape[1] == 48);
    fy_tensor_hf_name(&g, 0, &t[0], name, sizeof name);
    assert_int_equal(fy_unit_tensors(&g, 0, t), 2);
    fy_tensor_hf_name(&g, 0, &t[1], name, sizeof name);
    assert_string_equal(name, "wpe.weight");
    assert_int_equal(fy_unit_tensors(&l, 2, t), 9);
    fy_tensor_hf_name(&l, 2, &t[2], name, sizeof name);
    assert_string_equal(name, "model.layers.1.self_attn.k_proj.weight");
    assert_true(!t[2].transposed && t[2].shape[0] == 16 && t[2].shape[1] == 32);
    assert_int_equal(fy_unit_tensors(&l, 3, t), 2);
    fy_tensor_hf_name(&l, 3, &t[1], name, sizeof name);
    assert_string_equal(name, "lm_head.weight");
    assert_true(fy_arch_gpt2.hf_is_buffer(&g, "h.1.attn.masked_bias"));
    assert_false(fy_arch_gpt2.hf_is_buffer(&g, "h.01.attn.bias"));
    assert_false(fy_arch_gpt2.hf_is_buffer(&g, "h.3.attn.bias"));
}

/* A Llama-like family's table lays its tensors where fy_llama_unit_layout says (Phi-3's fused
 * qkv_proj at q_proj's offset, gate_up_proj at gate_proj's), and its unit sizes follow. */
static void check_llama_like(const struct fy_model_config *c, const char *const *names,
                             const size_t *const *at, unsigned n)
{
    struct fy_llama_unit_layout y;
    fy_llama_unit_layout(c, &y);
    struct fy_tensor_spec t[FY_UNIT_MAX_TENSORS];
    assert_int_equal(fy_unit_tensors(c, 1, t), n);
    char name[160];
    for (unsigned k = 0; k < n; k++) {
        fy_tensor_hf_name(c, 1, &t[k], name, sizeof name);
        assert_string_equal(name, names[k]);
        assert_int_equal(t[k].offset, *at[k]);
    }
    assert_int_equal(fy_model_unit_params(c, 1), y.total);
}

static void test_llama_like_tables(void **state)
{
    /* Qwen2: q/k/v biases after the weights; C 40, 4 heads of 10, 2 kv heads (GQA 2:1) */
    struct fy_model_config q2 = {
        .n_layer = 2,
        .n_head = 4,
        .n_embd = 40,
        .vocab = 1000,
        .ctx = 16,
        .arch = &fy_arch_qwen2,
        .family = fy_llama_family((struct fy_llama_fields){
            .n_kv_head = 2, .n_inter = 24, .rms_eps = 1e-6f, .rope_theta = 1e6, .qkv_bias = 1})};
    struct fy_llama_unit_layout y;
    fy_llama_unit_layout(&q2, &y);
    size_t C = 40, Q = 40, KV = 20, I = 24;
    assert_int_equal(y.q_bias, C + Q * C + 2 * KV * C);
    assert_int_equal(y.o_proj, y.q_bias + Q + 2 * KV);
    assert_int_equal(y.post_norm, y.o_proj + C * Q);
    assert_int_equal(y.q_norm, FY_LLAMA_ABSENT);
    assert_int_equal(y.total, y.post_norm + C + 3 * I * C);
    size_t kb = y.q_bias + Q, vb = y.q_bias + Q + KV;
    const char *n2[] = {"model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_proj.weight",
                        "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
                        "model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.k_proj.bias",
                        "model.layers.0.self_attn.v_proj.bias", "model.layers.0.self_attn.o_proj.weight",
                        "model.layers.0.post_attention_layernorm.weight", "model.layers.0.mlp.gate_proj.weight",
                        "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight"};
    const size_t *a2[] = {&y.input_norm, &y.q_proj, &y.k_proj, &y.v_proj, &y.q_bias, &kb, &vb,
                          &y.o_proj, &y.post_norm, &y.gate_proj, &y.up_proj, &y.down_proj};
    check_llama_like(&q2, n2, a2, 12);
    struct fy_param_segment seg[FY_MODEL_MAX_SEGMENTS];
    assert_int_equal(fy_model_decay_segments(&q2, 1, seg), 6); /* norm|W|b|o|norm|mlp */
    assert_int_equal(seg[2].begin, y.q_bias);
    assert_int_equal(seg[2].decay, 0);

    /* Qwen3: head_dim 16 (not 40 / 4), q/k norms after o_proj; GQA 4:1 */
    struct fy_model_config q3 = {.n_layer = 2,
                                 .n_head = 4,
                                 .n_embd = 40,
                                 .vocab = 1000,
                                 .ctx = 16,
                                 .arch = &fy_arch_qwen3,
                                 .family =
                                     fy_llama_family((struct fy_llama_fields){.n_kv_head = 1,
                                                                              .n_inter = 24,
                                                                              .rms_eps = 1e-6f,
                                                                              .rope_theta = 1e6,
                                                                              .head_dim = 16,
                                                                              .qk_norm = 1})};
    fy_llama_unit_layout(&q3, &y);
    Q = 64;
    KV = 16;
    assert_int_equal(y.o_proj, C + Q * C + 2 * KV * C);
    assert_int_equal(y.q_norm, y.o_proj + C * Q);
    assert_int_equal(y.k_norm, y.q_norm + 16);
    assert_int_equal(y.post_norm, y.k_norm + 16);
    const char *n3[] = {"model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_proj.weight",
                        "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
                        "model.layers.0.self_attn.o_proj.weight", "model.layers.0.self_attn.q_norm.weight",
                        "model.layers.0.self_attn.k_norm.weight", "model.layers.0.post_attention_layernorm.weight",
                        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
                        "model.layers.0.mlp.down_proj.weight"};
    const size_t *a3[] = {&y.input_norm, &y.q_proj, &y.k_proj, &y.v_proj, &y.o_proj, &y.q_norm,
                          &y.k_norm, &y.post_norm, &y.gate_proj, &y.up_proj, &y.down_proj};
    check_llama_like(&q3, n3, a3, 11);

    /* Phi-3: fused qkv_proj and gate_up_proj at the offsets of their first parts */
    struct fy_model_config p3 = {
        .n_layer = 2,
        .n_head = 4,
        .n_embd = 40,
        .vocab = 1000,
        .ctx = 16,
        .arch = &fy_arch_phi3,
        .family = fy_llama_family((struct fy_llama_fields){
            .n_kv_head = 4, .n_inter = 24, .rms_eps = 1e-5f, .rope_theta = 1e4})};
    fy_llama_unit_layout(&p3, &y);
    const char *n4[] = {"model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.qkv_proj.weight",
                        "model.layers.0.self_attn.o_proj.weight", "model.layers.0.post_attention_layernorm.weight",
                        "model.layers.0.mlp.gate_up_proj.weight", "model.layers.0.mlp.down_proj.weight"};
    const size_t *a4[] = {&y.input_norm, &y.q_proj, &y.o_proj, &y.post_norm, &y.gate_proj,
                          &y.down_proj};
    check_llama_like(&p3, n4, a4, 6);

    /* the variations are hashed, and Llama's hash does not move: pinned in test_init_and_hash_pinned */
    struct fy_model_config m = q3;
    fy_llama_mut(&m)->head_dim = 0;
    assert_int_not_equal(fy_model_config_hash(&m), fy_model_config_hash(&q3));
    m = q3;
    m.arch = &fy_arch_mistral;
    assert_int_not_equal(fy_model_config_hash(&m), fy_model_config_hash(&q3));
    round_trip(&q2);
    round_trip(&q3);
    round_trip(&p3);
    struct fy_model_config mi = p3;
    mi.arch = &fy_arch_mistral;
    fy_llama_mut(&mi)->sliding_window = 8;
    round_trip(&mi);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup),         cmocka_unit_test(test_unit_sizes),
        cmocka_unit_test(test_layouts),        cmocka_unit_test(test_decay_segments),
        cmocka_unit_test(test_init_and_hash_pinned), cmocka_unit_test(test_conf_round_trip),
        cmocka_unit_test(test_hf_names),       cmocka_unit_test(test_llama_like_tables),
    };
    return cmocka_run_group_tests_name("arch", tests, NULL, NULL);
}
