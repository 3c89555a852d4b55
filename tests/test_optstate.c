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
 *   - the self-test's state tensor has the same layout. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "common/arch/arch.h"
#include "common/desc.h"
#include "common/dtype.h"
#include "common/optstate.h"
#include "launcher/plan.h"
#include "launcher/selftest.h"

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
    assert_int_equal(fy_optstate_param_bytes(), 12);
    assert_int_equal(fy_optstate_update_param_bytes(FY_DTYPE_F32), 28);
    assert_int_equal(fy_optstate_update_param_bytes(FY_DTYPE_BF16), 26);
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
    assert_int_equal(fy_plan_upload_bytes(&c, res, 1), 4 * P);
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
    assert_int_equal(fy_plan_upload_bytes(&c, res, 1), 2 * P);

    /* the pool's state region: two of the largest unit's state */
    struct fy_pool_region_spec regions[FY_PLAN_REGIONS_MAX];
    unsigned n, found = 0;
    const struct fy_plan_place streamed = {.prefetch = 1, .grad_slots = FY_PLAN_GRAD_SLOTS_MIN};
    fy_plan_regions(&step, &streamed, regions, &n);
    for (unsigned i = 0; i < n; i++)
        if (strcmp(regions[i].name, "state") == 0) {
            assert_int_equal(regions[i].bytes, 2 * 12 * P);
            found = 1;
        }
    assert_true(found);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sections),
        cmocka_unit_test(test_bytes_a_parameter),
        cmocka_unit_test(test_planner_counts),
        cmocka_unit_test(test_selftest_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
