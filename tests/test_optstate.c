/* Tests of common/optstate, the optimizer state layout, and of the sizes and byte counts taken from
 * it, against numbers worked out by hand from the format ([master | adam m | adam v], f32, each
 * section 4 KiB aligned):
 *   - a unit's sections: master, adam_m, adam_v in that order, their descriptor kinds, f32, one
 *     element a parameter, each starting on a 4096-byte boundary right after the one before; the
 *     whole state three padded sections (GPT-2 and Llama units, sizes that pad and sizes that do
 *     not); the largest unit's state and master section;
 *   - 12 bytes of state a parameter; an update moves 28 with f32 gradients, 26 with bf16;
 *   - the planner's counts: a streamed block reads its master section in the forward (once more
 *     with clipping) and its state in the backward, and writes its state: 28 bytes a parameter,
 *     32 clipped, where nothing pads; a kept unit moves nothing over the SSD and takes its state of
 *     the pool, with a bf16 weights copy 2 bytes a parameter more (padded to 4 KiB), which is also
 *     what the gpu is sent instead of the 4 of its f32 master; the pool's state region holds two
 *     units' state;
 *   - bf16: the moments' sections in bf16, 2 bytes a parameter each; int8 (GPT-2 1024 wide, worked
 *     by hand): the codes of the tensors of 4096 values or more, their blocks' absmax, the small
 *     tensors' f32 moments apart, each tensor's place; 8, 6.03125 bytes a parameter; a new state's
 *     moments dequantize to zero; the planner moves the int8 state's bytes;
 *   - the self-test's state tensor has the same layout;
 *   - pieces (init --state-piece): a unit whose state fits the limit (or a limit of 0) is one
 *     piece, its layout and tensors byte for byte the whole unit's; cut, the pieces cover the unit
 *     one after another in parameters and in the extent, 4 KiB aligned, every section of a piece
 *     aligned, each piece within the limit but where a tensor under one step of the grain or one
 *     step alone exceeds it; cuts inside a tensor fall at multiples of lcm(4096, n_embd) values from
 *     its first (int8 blocks and embedding rows whole), a tensor under that never split, every
 *     part keeps the whole tensor's moments' kind and weight decay; the parts of a tensor over the
 *     pieces reassemble it; counts worked by hand for a GPT-2 block in fp32 and int8; the digest of
 *     one piece is the unit's, of several the digest of their digests. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/arch/arch.h"
#include "common/desc.h"
#include "common/dtype.h"
#include "common/optstate.h"
#include "launcher/plan/plan.h"
#include "launcher/cmd/selftest.h"
#include "opt_worker/quant8.h"

/* GPT-2, 1024 wide: a block's 12 C^2 + 13 C parameters are a multiple of 1024, so its f32
 * sections need no padding. */
static struct fy_model_config gpt_wide(void)
{
    return (struct fy_model_config){.n_layer = 2, .n_head = 8, .n_embd = 1024, .vocab = 1000,
                                  .ctx = 64};
}

static struct fy_model_config llama_small(void)
{
    struct fy_model_config c = {.n_layer = 2, .n_head = 4, .n_embd = 64, .vocab = 300, .ctx = 32,
                              .arch = &fy_arch_llama,
                              .llama = {.n_kv_head = 2, .n_inter = 96, .tied = 0, .rms_eps = 1e-5f,
                                        .rope_theta = 10000.0}};
    return c;
}

static uint64_t pad(uint64_t bytes) { return (bytes + 4095) / 4096 * 4096; }

static void check_unit(const struct fy_model_config *c, unsigned u)
{
    uint64_t P = fy_model_unit_params(c, u), sec = pad(4 * P);
    struct fy_optstate_layout l;
    fy_optstate_layout(c, u, &l);
    static const char *const names[3] = {"master", "adam_m", "adam_v"};
    static const int kinds[3] = {FY_KIND_MASTER, FY_KIND_ADAM_M, FY_KIND_ADAM_V};
    assert_int_equal(l.params, P);
    assert_int_equal(l.count, 3);
    for (unsigned i = 0; i < 3; i++) {
        assert_string_equal(l.section[i].name, names[i]);
        assert_int_equal(l.section[i].kind, kinds[i]);
        assert_int_equal(l.section[i].dtype, FY_DTYPE_F32);
        assert_int_equal(l.section[i].offset, i * sec);
        assert_int_equal(l.section[i].bytes, 4 * P);
        assert_int_equal(l.section[i].padded, sec);
    }
    assert_int_equal(l.bytes, 3 * sec);
    assert_int_equal(fy_optstate_bytes(c, u), 3 * sec);
    assert_int_equal(fy_optstate_master_bytes(c, u), sec);
    assert_int_equal(fy_optstate_copy_bytes(c, u), pad(2 * P));
}

static void test_sections(void **state)
{
    (void)state;
    struct fy_model_config g = gpt_wide(), l = llama_small();
    for (unsigned u = 0; u < fy_model_unit_count(&g); u++)
        check_unit(&g, u);
    for (unsigned u = 0; u < fy_model_unit_count(&l); u++)
        check_unit(&l, u);
    /* the block's sections need no padding; the Llama final unit's (RMSNorm [64] and lm_head
     * [300][64]: 77056 bytes a section) do */
    assert_int_equal(fy_optstate_bytes(&g, 1), 12u * fy_model_unit_params(&g, 1));
    assert_int_equal(fy_optstate_bytes(&l, 3), 3u * 77824);
    assert_int_equal(fy_optstate_master_bytes(&l, 3), 77824);
    /* the largest unit: GPT-2's blocks (12.6M parameters) over its embeddings (1.09M) */
    assert_int_equal(fy_optstate_max_bytes(&g), 12u * fy_model_unit_params(&g, 1));
    assert_int_equal(fy_optstate_max_master_bytes(&g), 4u * fy_model_unit_params(&g, 1));
}

static void test_bytes_a_parameter(void **state)
{
    (void)state;
    assert_true(fy_optstate_param_bytes(FY_OPTIM_STATE_FP32) == 12.0);
    assert_true(fy_optstate_param_bytes(FY_OPTIM_STATE_BF16) == 8.0);
    assert_true(fy_optstate_param_bytes(FY_OPTIM_STATE_INT8) == 6.03125); /* 4 + 2 + 8 / 256 */
    assert_true(fy_optstate_update_param_bytes(FY_DTYPE_F32, FY_OPTIM_STATE_FP32) == 28.0);
    assert_true(fy_optstate_update_param_bytes(FY_DTYPE_BF16, FY_OPTIM_STATE_FP32) == 26.0);
    assert_true(fy_optstate_update_param_bytes(FY_DTYPE_F32, FY_OPTIM_STATE_INT8) == 16.0625);
    assert_int_equal(FY_OPTSTATE_COPY_DTYPE, FY_DTYPE_BF16);
}

/* Every unit kept but block 1, which streams (or is kept with a bf16 copy: `keep1`). */
static void one_streamed(const struct fy_model_config *c, unsigned char keep1, unsigned char *res)
{
    memset(res, FY_PLAN_KEPT, fy_model_unit_count(c));
    res[1] = keep1;
}

static void test_planner_counts(void **state)
{
    (void)state;
    struct fy_model_config c = gpt_wide();
    uint64_t P = fy_model_unit_params(&c, 1);
    unsigned char res[8];
    struct fy_plan_shape step = {.c = &c, .B = 2, .T = 16, .act_dtype = FY_DTYPE_F32};
    struct fy_plan_shape clipped = step;
    clipped.clip = 1;
    const struct fy_plan_place place = {.resident = res};
    struct fy_plan_traffic t;
    one_streamed(&c, FY_PLAN_STREAMED, res);
    fy_plan_traffic(&step, &place, &t);
    assert_int_equal(t.ssd_read, 16 * P); /* 4 in the forward, 12 in the backward */
    assert_int_equal(t.ssd_write, 12 * P);
    assert_int_equal(t.ssd_read + t.ssd_write, 28 * P);
    fy_plan_traffic(&clipped, &place, &t);
    assert_int_equal(t.ssd_read + t.ssd_write, 32 * P); /* the norm pass reads the master once more */
    assert_int_equal(fy_plan_upload_bytes(&c, FY_DTYPE_F32, 1), 4 * P);
    uint64_t kept_others = 0; /* the other units' state, kept */
    for (unsigned u = 0; u < fy_model_unit_count(&c); u++)
        kept_others += u == 1 ? 0 : 3 * pad(4 * fy_model_unit_params(&c, u));
    assert_int_equal(fy_plan_resident_bytes(&c, res), kept_others);

    one_streamed(&c, FY_PLAN_KEPT, res);
    fy_plan_traffic(&clipped, &place, &t);
    assert_int_equal(t.ssd_read, 0);
    assert_int_equal(t.ssd_write, 0);
    assert_int_equal(fy_plan_resident_bytes(&c, res), kept_others + 12 * P);
    one_streamed(&c, FY_PLAN_KEPT_BF16, res);
    assert_int_equal(fy_plan_resident_bytes(&c, res), kept_others + 12 * P + pad(2 * P));
    assert_int_equal(fy_plan_upload_bytes(&c, FY_DTYPE_BF16, 1), 2 * P);

    /* the pool's state region: two of the largest unit's state */
    struct fy_pool_region_spec regions[FY_PLAN_REGIONS_MAX];
    unsigned n, found = 0;
    const struct fy_plan_place streamed = {.prefetch = 1, .grad_slots = FY_PLAN_GRAD_SLOTS_FLOOR};
    fy_plan_regions(&step, &streamed, regions, &n);
    for (unsigned i = 0; i < n; i++)
        if (strcmp(regions[i].name, "state") == 0) {
            assert_int_equal(regions[i].bytes, 2 * 12 * P);
            found = 1;
        }
    assert_true(found);
}

/* bf16: [master f32 | m bf16 | v bf16], each padded. */
static void test_bf16_sections(void **state)
{
    (void)state;
    struct fy_model_config c = llama_small();
    c.optim_state = FY_OPTIM_STATE_BF16;
    for (unsigned u = 0; u < fy_model_unit_count(&c); u++) {
        uint64_t P = fy_model_unit_params(&c, u);
        struct fy_optstate_layout l;
        fy_optstate_layout(&c, u, &l);
        assert_int_equal(l.count, 3);
        assert_int_equal(l.section[0].dtype, FY_DTYPE_F32);
        for (int i = 1; i <= 2; i++) {
            assert_int_equal(l.section[i].dtype, FY_DTYPE_BF16);
            assert_int_equal(l.section[i].bytes, 2 * P);
        }
        assert_int_equal(l.section[1].offset, pad(4 * P));
        assert_int_equal(l.section[2].offset, pad(4 * P) + pad(2 * P));
        assert_int_equal(l.bytes, pad(4 * P) + 2 * pad(2 * P));
    }
}

/* int8 of GPT-2 1024 wide, worked by hand. A block's tensors: ln_1 w, b (1024 each: f32), c_attn w
 * (3 Mi: 12288 blocks) and b (3072: f32), attn c_proj w (1 Mi: 4096 blocks), b (1024: f32), ln_2
 * w, b (f32), c_fc w (4 Mi: 16384 blocks) and b (4096: quantized, 16 blocks), mlp c_proj w (4 Mi:
 * 16384 blocks) and b (1024: f32). */
static void test_int8_sections(void **state)
{
    (void)state;
    struct fy_model_config c = gpt_wide();
    c.optim_state = FY_OPTIM_STATE_INT8;
    const uint64_t C = 1024, P = fy_model_unit_params(&c, 1);
    const uint64_t small = 2 * C + 3 * C + C + 2 * C + C; /* ln_1, c_attn b, proj b, ln_2, proj b */
    const uint64_t quantized = P - small, blocks = 12288 + 4096 + 16384 + 16 + 16384;
    assert_int_equal(quantized, 12 * C * C + 4 * C);
    struct fy_optstate_layout l;
    fy_optstate_layout(&c, 1, &l);
    assert_int_equal(l.count, 5);
    assert_int_equal(l.quantized, quantized);
    assert_int_equal(l.blocks, blocks);
    assert_int_equal(l.small, small);
    static const char *const names[5] = {"master", "adam_m", "adam_v", "adam_absmax", "adam_small"};
    static const int kinds[5] = {FY_KIND_MASTER, FY_KIND_ADAM_M, FY_KIND_ADAM_V,
                                 FY_KIND_ADAM_ABSMAX, FY_KIND_ADAM_SMALL};
    static const int dtypes[5] = {FY_DTYPE_F32, FY_DTYPE_U8, FY_DTYPE_U8, FY_DTYPE_F32,
                                  FY_DTYPE_F32};
    const uint64_t bytes[5] = {4 * P, quantized, quantized, 8 * blocks, 8 * small};
    uint64_t at = 0;
    for (int i = 0; i < 5; i++) {
        assert_string_equal(l.section[i].name, names[i]);
        assert_int_equal(l.section[i].kind, kinds[i]);
        assert_int_equal(l.section[i].dtype, dtypes[i]);
        assert_int_equal(l.section[i].bytes, bytes[i]);
        assert_int_equal(l.section[i].offset, at);
        at += pad(bytes[i]);
    }
    assert_int_equal(l.bytes, at);
    /* the tensors: codes and blocks one after another, small tensors' moments apart */
    struct fy_optstate_tensor t[FY_UNIT_MAX_TENSORS];
    unsigned n = fy_optstate_tensors(&c, 1, t);
    assert_int_equal(n, 12);
    uint64_t q = 0, b = 0, s = 0;
    for (unsigned i = 0; i < n; i++) {
        assert_int_equal(t[i].quantized, t[i].count >= FY_OPTSTATE_INT8_MIN);
        assert_int_equal(t[i].at, t[i].quantized ? q : s);
        assert_int_equal(t[i].block, t[i].quantized ? b : 0);
        if (t[i].quantized) {
            q += t[i].count;
            b += (t[i].count + 255) / 256;
        } else {
            s += t[i].count;
        }
    }
    assert_int_equal(t[9].count, 4 * C); /* c_fc's bias: exactly the threshold, quantized */
    assert_true(t[9].quantized);
    /* the embeddings (wte 1000 x 1024, wpe 64 x 1024): all quantized, nothing small */
    fy_optstate_layout(&c, 0, &l);
    assert_int_equal(l.small, 0);
    assert_int_equal(l.blocks, 4000 + 256);
    assert_int_equal(l.section[FY_OPTSTATE_SMALL].padded, 0);
    /* one tensor: below the threshold nothing is quantized */
    fy_optstate_layout_params(4095, FY_OPTIM_STATE_INT8, &l);
    assert_int_equal(l.quantized, 0);
    assert_int_equal(l.small, 4095);
    fy_optstate_layout_params(5000, FY_OPTIM_STATE_INT8, &l);
    assert_int_equal(l.quantized, 5000);
    assert_int_equal(l.blocks, 20);
}

/* A new state's moments: zero in every format (int8: the code of zero in each map, absmax 0),
 * the master untouched. */
static void test_zero_moments(void **state)
{
    (void)state;
    for (int format = 0; format < FY_OPTIM_STATE_COUNT; format++) {
        struct fy_optstate_layout l;
        fy_optstate_layout_params(5000, format, &l);
        uint8_t *s = malloc(l.bytes);
        assert_non_null(s);
        memset(s, 0xAB, l.bytes);
        fy_optstate_zero_moments(&l, s);
        for (uint64_t i = 0; i < 20000; i++)
            assert_int_equal(s[i], 0xAB);
        float m[5000], v[5000];
        if (format == FY_OPTIM_STATE_INT8) {
            const float *absmax = (const float *)(s + l.section[FY_OPTSTATE_ABSMAX].offset);
            fy_quant8_dequantize(s + l.section[FY_OPTSTATE_ADAM_M].offset, absmax, 5000, 1, m);
            fy_quant8_dequantize(s + l.section[FY_OPTSTATE_ADAM_V].offset, absmax + l.blocks,
                                 5000, 0, v);
            assert_int_equal(FY_OPTSTATE_INT8_ZERO_M, fy_quant8_zero_code(1));
            assert_int_equal(FY_OPTSTATE_INT8_ZERO_V, fy_quant8_zero_code(0));
            assert_int_equal(FY_OPTSTATE_INT8_BLOCK, FY_QUANT8_BLOCK);
        } else {
            for (int k = 0; k < 5000; k++) {
                m[k] = format == FY_OPTIM_STATE_BF16
                           ? fy_bf16_to_f32(((uint16_t *)(s + l.section[1].offset))[k])
                           : ((float *)(s + l.section[1].offset))[k];
                v[k] = format == FY_OPTIM_STATE_BF16
                           ? fy_bf16_to_f32(((uint16_t *)(s + l.section[2].offset))[k])
                           : ((float *)(s + l.section[2].offset))[k];
            }
        }
        for (int k = 0; k < 5000; k++) {
            assert_true(m[k] == 0.0f);
            assert_true(v[k] == 0.0f);
        }
        free(s);
    }
}

/* The planner counts int8's bytes: a streamed block reads and writes its whole int8 state. */
static void test_int8_planner_counts(void **state)
{
    (void)state;
    struct fy_model_config c = gpt_wide();
    c.optim_state = FY_OPTIM_STATE_INT8;
    unsigned char res[8];
    one_streamed(&c, FY_PLAN_STREAMED, res);
    struct fy_plan_shape step = {.c = &c, .B = 2, .T = 16, .act_dtype = FY_DTYPE_F32};
    const struct fy_plan_place place = {.resident = res};
    struct fy_plan_traffic t;
    fy_plan_traffic(&step, &place, &t);
    uint64_t P = fy_model_unit_params(&c, 1), state_bytes = fy_optstate_bytes(&c, 1);
    assert_int_equal(t.ssd_read, pad(4 * P) + state_bytes);
    assert_int_equal(t.ssd_write, state_bytes);
    assert_true(state_bytes < 6.1 * (double)P);
}

static void test_selftest_layout(void **state)
{
    (void)state;
    struct fy_selftest_layout l;
    fy_selftest_layout(5000, FY_DTYPE_F32, &l); /* 20000 bytes a section, 20480 padded */
    assert_int_equal(l.m_offset, 20480);
    assert_int_equal(l.v_offset, 40960);
    assert_int_equal(l.state_bytes, 61440);
}

/* Pieces of GPT-2 2 x 64 wide (vocab 1000, ctx 64) and Llama small under `limit`, every format. */
static void check_pieces(struct fy_model_config c, uint64_t limit)
{
    c.state_piece = limit;
    uint64_t grain = 4096; /* lcm(4096, 64) */
    for (unsigned u = 0; u < fy_model_unit_count(&c); u++) {
        unsigned n = fy_optstate_piece_count(&c, u);
        struct fy_optstate_tensor whole[FY_UNIT_MAX_TENSORS];
        unsigned nt = fy_optstate_tensors(&c, u, whole);
        struct fy_optstate_layout one;
        fy_optstate_layout(&c, u, &one);
        assert_int_equal(n == 1, limit == 0 || one.bytes <= limit);
        uint64_t params = 0, at = 0, done[FY_UNIT_MAX_TENSORS] = {0};
        unsigned t = 0; /* the whole tensor the next part belongs to */
        for (unsigned k = 0; k < n; k++) {
            struct fy_optstate_piece p;
            struct fy_optstate_tensor part[FY_UNIT_MAX_TENSORS];
            unsigned np = fy_optstate_piece(&c, u, k, &p, part);
            assert_int_equal(p.begin, params);
            assert_int_equal(p.offset, at);
            assert_int_equal(p.offset % 4096, 0);
            assert_int_equal(p.layout.params, p.params);
            assert_int_equal(p.layout.format, c.optim_state);
            for (unsigned i = 0; i < p.layout.count; i++)
                assert_int_equal(p.layout.section[i].offset % 4096, 0);
            uint64_t in_piece = 0;
            for (unsigned i = 0; i < np; i++) {
                while (done[t] == whole[t].count)
                    t++;
                assert_true(t < nt);
                assert_int_equal(part[i].begin, in_piece);
                assert_int_equal(part[i].decay, whole[t].decay);
                assert_int_equal(part[i].quantized, whole[t].quantized);
                /* a cut inside a tensor: at a multiple of the grain; a small tensor whole */
                if (done[t] > 0 || part[i].count < whole[t].count) {
                    assert_true(whole[t].count > grain);
                    assert_int_equal(done[t] % grain, 0);
                }
                done[t] += part[i].count;
                in_piece += part[i].count;
            }
            assert_int_equal(in_piece, p.params);
            /* within the limit unless one part alone is a small tensor or a step of the grain */
            if (limit > 0 && p.layout.bytes > limit)
                assert_true(np == 1 && (part[0].count <= grain || part[0].count < 4096));
            params += p.params;
            at += p.layout.bytes;
        }
        for (unsigned i = 0; i < nt; i++)
            assert_int_equal(done[i], whole[i].count);
        assert_int_equal(params, fy_model_unit_params(&c, u));
        assert_int_equal(fy_optstate_bytes(&c, u), at);
        if (n == 1) { /* byte for byte the whole unit's */
            struct fy_optstate_piece p;
            struct fy_optstate_tensor part[FY_UNIT_MAX_TENSORS];
            assert_int_equal(fy_optstate_piece(&c, u, 0, &p, part), nt);
            assert_memory_equal(&p.layout, &one, sizeof one);
            assert_memory_equal(part, whole, nt * sizeof *part);
        }
    }
}

static void test_pieces_cut(void **state)
{
    (void)state;
    struct fy_model_config g = {.n_layer = 2, .n_head = 4, .n_embd = 64, .vocab = 1000, .ctx = 64};
    struct fy_model_config l = llama_small();
    const uint64_t limits[] = {0, 16384, 20480, 49152, 65536, 100000 / 1024 * 1024, 1u << 30};
    for (int f = 0; f < FY_OPTIM_STATE_COUNT; f++)
        for (unsigned i = 0; i < sizeof limits / sizeof *limits; i++) {
            g.optim_state = l.optim_state = f;
            check_pieces(g, limits[i]);
            check_pieces(l, limits[i]);
        }
}

/* GPT-2 64 wide, a block (ln1 64+64, qkv 12288+192, attn 4096+64, ln2 64+64, fc 16384+256, proj
 * 16384+64: 49984 parameters) in pieces of 64 KiB, worked by hand. */
static void test_pieces_by_hand(void **state)
{
    (void)state;
    struct fy_model_config c = {
        .n_layer = 2, .n_head = 4, .n_embd = 64, .vocab = 1000, .ctx = 64, .state_piece = 65536};
    assert_int_equal(fy_model_unit_params(&c, 1), 49984);
    /* fp32: 12 bytes a parameter, three sections of 4 KiB each at least. The first piece holds
     * ln1 (128) and 4096 of qkv's weights: 3 x pad(4 x 4224) = 3 x 20480 = 61440; with 8192 of
     * them 3 x 36864 > 64 KiB. */
    struct fy_optstate_piece p;
    struct fy_optstate_tensor t[FY_UNIT_MAX_TENSORS];
    assert_int_equal(fy_optstate_piece(&c, 1, 0, &p, t), 3);
    assert_int_equal(p.begin, 0);
    assert_int_equal(p.params, 4224);
    assert_int_equal(p.layout.bytes, 61440);
    assert_int_equal(t[2].begin, 128);
    assert_int_equal(t[2].count, 4096);
    assert_int_equal(t[2].decay, 1);
    assert_int_equal(t[0].decay, 0);
    assert_int_equal(fy_optstate_piece(&c, 1, 1, &p, t), 1); /* qkv's next 4096 */
    assert_int_equal(p.begin, 4224);
    assert_int_equal(p.offset, 61440);
    assert_int_equal(p.params, 4096);
    unsigned n = fy_optstate_piece_count(&c, 1);
    uint64_t total = 0;
    for (unsigned k = 0; k < n; k++) {
        fy_optstate_piece(&c, 1, k, &p, NULL);
        assert_true(p.layout.bytes <= 65536);
        total += p.layout.bytes;
    }
    assert_int_equal(fy_optstate_bytes(&c, 1), total);
    assert_true(total > 12u * 49984); /* each piece's sections padded */
    /* int8: fc's 16384 weights are quantized, 64 blocks; cut in 4096s they stay quantized, 16
     * blocks each, their codes and absmax in their own piece's sections */
    c.optim_state = FY_OPTIM_STATE_INT8;
    c.state_piece = 16384;
    n = fy_optstate_piece_count(&c, 1);
    unsigned quantized_parts = 0;
    for (unsigned k = 0; k < n; k++) {
        unsigned np = fy_optstate_piece(&c, 1, k, &p, t);
        for (unsigned i = 0; i < np; i++)
            if (t[i].quantized) {
                assert_int_equal(t[i].count % 4096, 0);
                assert_int_equal(p.layout.blocks, t[i].count / 256);
                quantized_parts++;
            }
    }
    assert_int_equal(quantized_parts, 3 + 1 + 4 + 4); /* qkv 12288, attn 4096, fc and proj 16384 */
    /* the digest of one piece is the unit's; of several, of their digests */
    uint64_t d[3] = {0x1111, 0x2222, 0x3333};
    assert_int_equal(fy_optstate_unit_digest(d, 1), 0x1111);
    assert_true(fy_optstate_unit_digest(d, 3) != fy_optstate_unit_digest(d, 2));
    assert_true(fy_optstate_unit_digest(d, 3) == fy_optstate_unit_digest(d, 3));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sections),
        cmocka_unit_test(test_bytes_a_parameter),
        cmocka_unit_test(test_planner_counts),
        cmocka_unit_test(test_bf16_sections),
        cmocka_unit_test(test_int8_sections),
        cmocka_unit_test(test_zero_moments),
        cmocka_unit_test(test_int8_planner_counts),
        cmocka_unit_test(test_selftest_layout),
        cmocka_unit_test(test_pieces_cut),
        cmocka_unit_test(test_pieces_by_hand),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
