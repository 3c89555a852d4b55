/* Tests of launcher/plan/actplace, the run's plan for the blocks' internals, on synthetic block profiles:
 * the obvious answers (fast links and room: everything swapped; no room: recompute; no device room
 * for the swap sets: no swapping), the kept blocks' count from the device room, the budgets never
 * exceeded over a sweep of pool rooms, FC and GELU placed together when one product writes both,
 * the forced modes and the test hook's mix, the refusals, clipping's two schedules, several gpu
 * workers, bf16 weights' conversions on the opt worker, and the state in pieces' second read of a
 * streamed block's master. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/model/arch/arch.h"
#include "common/base/check.h"
#include "common/model/arch/llama.h"
#include "launcher/plan/actplace.h"

#define K FY_ACT_KINDS

/* GPT-2 shaped: 8 blocks of 256 wide, batch 4 x 128. */
static struct fy_model_config model(void)
{
    struct fy_model_config c;
    memset(&c, 0, sizeof c);
    c.n_layer = 8;
    c.n_head = 4;
    c.n_embd = 256;
    c.vocab = 1024;
    c.ctx = 128;
    c.arch = &fy_arch_gpt2;
    return c;
}

/* A block that takes 1 ms forward and 2 ms backward, 0.2 ms per swappable kind to recompute, on
 * links of `bw` bytes/s; `set` bytes per set and `free` device bytes after the working buffers. */
static struct fy_block_profile profile(double bw, uint64_t set, uint64_t free_bytes)
{
    struct fy_block_profile p;
    memset(&p, 0, sizeof p);
    p.magic = FY_BLOCK_PROFILE_MAGIC;
    p.version = FY_BLOCK_PROFILE_VERSION;
    p.fwd_s = 1e-3;
    p.bwd_s = 2e-3;
    for (int k = 0; k < K; k++)
        p.recompute_s[k] = fy_actplan_kind_swappable(k) ? 2e-4 : 0;
    p.flops_per_s = 1e14;
    p.h2d_Bps = p.d2h_Bps = bw;
    p.duplex_Bps = 2 * bw;
    p.set_bytes = set;
    p.gpu_free = free_bytes;
    return p;
}

/* Every unit's optimizer state in the pool, so the SSD does not bound the step. */
static const unsigned char all_resident[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

static struct fy_actplace_in input(const struct fy_model_config *c,
                                   const struct fy_block_profile *p, enum fy_actplan_mode mode,
                                   const char *backend)
{
    struct fy_actplace_in in = {.c = c,
                                .B = 4,
                                .T = 128,
                                .mode = mode,
                                .backend = backend,
                                .prof = p,
                                .resident = all_resident,
                                .rates = fy_plan_reference_rates,
                                .host_bytes = 1ull << 40,
                                .ssd_bytes = 1ull << 40};
    in.act_dtype = strcmp(backend, "cpu") == 0 ? 1 : 2; /* FY_DTYPE_F32, _BF16 */
    return in;
}

static int count(const struct fy_actplace *r, unsigned L, int place)
{
    int n = 0;
    for (unsigned l = 0; r->place != NULL && l < L; l++)
        for (int k = 0; k < K; k++)
            n += fy_actplan_kind_swappable(k) && r->place[l * K + k] == place;
    return n;
}

/* Links far faster than the compute and room everywhere: every swappable kind of every block goes
 * to the pool (the CPU backend's case: no device sets, so nothing is kept either way). */
static void test_fast_links_swap_everything(void **state)
{
    (void)state;
    struct fy_model_config c = model();
    struct fy_block_profile p = profile(1e15, 0, 0);
    struct fy_actplace_in in = input(&c, &p, FY_ACTPLAN_AUTO, "cpu");
    struct fy_actplace r;
    assert_int_equal(fy_actplace_plan(&in, &r), 0);
    assert_int_equal(r.keep, 0);
    assert_int_equal(r.swap_sets, 1);
    assert_int_equal(count(&r, c.n_layer, FY_ACT_HOST), 5 * (int)c.n_layer);
    assert_true(r.step_b < r.step_a);
    assert_true(r.predicted_s == r.step_b);
    assert_true(r.swap.host_bytes > 0 && r.swap.ssd_bytes == 0);
    fy_actplace_release(&r);
}

/* No pool room and no SSD room: nothing can be swapped, every block recomputes. */
static void test_no_room_recomputes(void **state)
{
    (void)state;
    struct fy_model_config c = model();
    struct fy_block_profile p = profile(1e15, 0, 0);
    struct fy_actplace_in in = input(&c, &p, FY_ACTPLAN_AUTO, "cpu");
    in.host_bytes = 0;
    in.ssd_bytes = 0;
    struct fy_actplace r;
    assert_int_equal(fy_actplace_plan(&in, &r), 0);
    assert_null(r.place);
    assert_int_equal(r.swap_sets, 0);
    assert_true(r.predicted_s == r.step_a && r.predicted_s > 0);
    fy_actplace_release(&r);
}

/* Slow links: swapping only adds transfer time, so auto keeps what the device holds and
 * recomputes the rest. */
static void test_slow_links_recompute(void **state)
{
    (void)state;
    struct fy_model_config c = model();
    struct fy_block_profile p = profile(1e6, 1u << 20, 5u << 20);
    struct fy_actplace_in in = input(&c, &p, FY_ACTPLAN_AUTO, "cuda");
    struct fy_actplace r;
    assert_int_equal(fy_actplace_plan(&in, &r), 0);
    assert_int_equal(r.keep, 5); /* 5 MiB free, 1 MiB a set */
    assert_null(r.place);
    assert_int_equal(r.swap_sets, 0);
    fy_actplace_release(&r);
}

/* The device room decides the kept blocks: swapping costs two sets, so with fast links auto keeps
 * two fewer and swaps kinds of the others; with room for fewer than two sets it cannot swap. */
static void test_device_room_and_swap_sets(void **state)
{
    (void)state;
    struct fy_model_config c = model();
    struct fy_block_profile p = profile(1e15, 1u << 20, 5u << 20);
    struct fy_actplace_in in = input(&c, &p, FY_ACTPLAN_AUTO, "cuda");
    struct fy_actplace r;
    assert_int_equal(fy_actplace_plan(&in, &r), 0);
    assert_int_equal(r.keep_a, 5);
    assert_int_equal(r.keep_b, 3);
    assert_int_equal(r.keep, 3);
    assert_int_equal(r.swap_sets, 1);
    for (unsigned l = 5; l < c.n_layer; l++) /* the kept top blocks: on the GPU */
        assert_int_equal(r.place[l * K + FY_ACT_QKV], FY_ACT_GPU);
    assert_int_equal(count(&r, c.n_layer, FY_ACT_HOST), 5 * 5);
    fy_actplace_release(&r);

    p = profile(1e15, 1u << 20, (1u << 20) + 5); /* one set and a bit: no swapping */
    assert_int_equal(fy_actplace_plan(&in, &r), 0);
    assert_int_equal(r.keep, 1);
    assert_int_equal(r.keep_b, -1);
    assert_null(r.place);
    fy_actplace_release(&r);

    p = profile(1e15, 1u << 20, 64u << 20); /* every block kept: nothing left to swap */
    assert_int_equal(fy_actplace_plan(&in, &r), 0);
    assert_int_equal(r.keep, (int)c.n_layer);
    assert_null(r.place);
    assert_true(r.predicted_s > 0);
    fy_actplace_release(&r);
}

/* Over a sweep of pool rooms, the saved region (pool-kept kinds and, when some go to the SSD, the
 * four slots they pass through) never exceeds the room, and the scratch extent train makes for the
 * SSD-placed ones (a slot for each block, rounded up to its size class) never exceeds the store's
 * room. */
static void test_budgets_hold(void **state)
{
    (void)state;
    struct fy_model_config c = model();
    struct fy_block_profile p = profile(3e9, 0, 0);
    p.recompute_s[FY_ACT_QKV] = 5e-3; /* worth moving, even through the SSD */
    struct fy_actplace_in in = input(&c, &p, FY_ACTPLAN_AUTO, "cpu");
    for (uint64_t room = 0; room <= (24u << 20); room += 3u << 19) {
        for (uint64_t ssd = 0; ssd <= (16u << 20); ssd += 1u << 20) {
            in.host_bytes = room;
            in.ssd_bytes = ssd;
            struct fy_actplace r;
            assert_int_equal(fy_actplace_plan(&in, &r), 0);
            assert_true(fy_plan_swap_pool_bytes(&r.swap) <= room);
            assert_true(r.swap.ssd_bytes <= ssd);
            assert_true(fy_plan_swap_store_bytes(&r.swap, c.n_layer) <= ssd);
            fy_actplace_release(&r);
        }
    }
}

/* One product writing FC and GELU: no block ends with one of the two swapped and the other
 * recomputed, whatever the room. */
static void test_fused_fc_gelu_together(void **state)
{
    (void)state;
    struct fy_model_config c = model();
    struct fy_block_profile p = profile(1e10, 1u << 20, 3u << 20);
    p.fc_gelu_fused = 1;
    p.recompute_s[FY_ACT_FC] = p.recompute_s[FY_ACT_GELU] = 1e-3; /* worth moving */
    struct fy_actplace_in in = input(&c, &p, FY_ACTPLAN_AUTO, "cuda");
    int swapped = 0;
    for (uint64_t room = 0; room <= (48u << 20); room += 1u << 20) {
        in.host_bytes = room;
        struct fy_actplace r;
        assert_int_equal(fy_actplace_plan(&in, &r), 0);
        for (unsigned l = 0; r.place != NULL && l < c.n_layer; l++) {
            int fc = r.place[l * K + FY_ACT_FC] == FY_ACT_RECOMPUTE;
            int ge = r.place[l * K + FY_ACT_GELU] == FY_ACT_RECOMPUTE;
            assert_int_equal(fc, ge);
            swapped += !fc && r.place[l * K + FY_ACT_FC] != FY_ACT_GPU;
        }
        fy_actplace_release(&r);
    }
    assert_true(swapped > 0); /* and the pair does get swapped where there is room */
}

/* Forced host and ssd: every swappable kind of every block there, no block kept; the test hook
 * mixes host, ssd and recompute by seed, the same for the same seed; recompute swaps nothing;
 * Llama models refuse swapping. */
static void test_forced_modes(void **state)
{
    (void)state;
    struct fy_model_config c = model();
    struct fy_actplace_in in = input(&c, NULL, FY_ACTPLAN_HOST, "cpu");
    struct fy_actplace r, again;
    assert_int_equal(fy_actplace_plan(&in, &r), 0);
    assert_int_equal(count(&r, c.n_layer, FY_ACT_HOST), 5 * (int)c.n_layer);
    assert_int_equal(r.keep, 0);
    assert_int_equal(r.swap_sets, 1);
    fy_actplace_release(&r);
    in.mode = FY_ACTPLAN_SSD;
    assert_int_equal(fy_actplace_plan(&in, &r), 0);
    assert_int_equal(count(&r, c.n_layer, FY_ACT_SSD), 5 * (int)c.n_layer);
    assert_true(r.swap.slot_bytes > 0 && r.swap.host_bytes == 0);
    fy_actplace_release(&r);

    setenv("FUYOU_TEST_ACT_MIX", "7", 1);
    assert_int_equal(fy_actplace_plan(&in, &r), 0);
    assert_int_equal(fy_actplace_plan(&in, &again), 0);
    unsetenv("FUYOU_TEST_ACT_MIX");
    assert_memory_equal(r.place, again.place, (size_t)c.n_layer * K);
    for (int place = FY_ACT_HOST; place <= FY_ACT_RECOMPUTE; place++)
        assert_true(count(&r, c.n_layer, place) > 0);
    fy_actplace_release(&r);
    fy_actplace_release(&again);

    in.mode = FY_ACTPLAN_RECOMPUTE;
    assert_int_equal(fy_actplace_plan(&in, &r), 0);
    assert_null(r.place);
    assert_int_equal(r.keep, 0);
    fy_actplace_release(&r);

    c.arch = &fy_arch_llama;
    fy_llama_mut(&c)->n_kv_head = 4;
    fy_llama_mut(&c)->n_inter = 512;
    in.mode = FY_ACTPLAN_HOST; /* a usage error: the family swaps nothing */
    assert_int_equal(fy_actplace_plan(&in, &r), -FY_EUSAGE);
}

/* Without a profile (the Llama blocks, in-process runs), auto keeps as many blocks as fit and
 * swaps nothing; a backend the layouts do not know is refused. */
static void test_no_profile_and_bad_backend(void **state)
{
    (void)state;
    struct fy_model_config c = model();
    struct fy_actplace_in in = input(&c, NULL, FY_ACTPLAN_AUTO, "cuda");
    struct fy_actplace r;
    assert_int_equal(fy_actplace_plan(&in, &r), 0);
    assert_int_equal(r.keep, -1);
    assert_null(r.place);
    assert_true(r.predicted_s == 0);
    fy_actplace_release(&r);
    in.backend = "tpu";
    assert_int_equal(fy_actplace_plan(&in, &r), -EINVAL);
}

/* Clipping's schedules with every block kept and a slow AdamW (it binds): two passes add the norm
 * pass, a phase of its own that no update overlaps, to the unclipped step; one pass moves AdamW
 * under the next forward, which it outlasts, and beats two. */
static void test_clipped_steps(void **state)
{
    (void)state;
    struct fy_model_config c = model();
    struct fy_block_profile p = profile(1e15, 1u << 20, 1ull << 40);
    struct fy_actplace_in in = input(&c, &p, FY_ACTPLAN_AUTO, "cuda");
    in.rates.opt_params = 2e8;
    struct fy_actplace none, two, one;
    assert_int_equal(fy_actplace_plan(&in, &none), 0);
    assert_int_equal(none.keep, (int)c.n_layer);
    assert_true(none.norm_s == 0);
    in.clip = 1;
    assert_int_equal(fy_actplace_plan(&in, &two), 0);
    assert_true(two.norm_s >= c.n_layer * p.bwd_s);
    assert_float_equal(two.predicted_s, none.predicted_s + two.norm_s, 1e-12);
    in.clip_hold = 1;
    assert_int_equal(fy_actplace_plan(&in, &one), 0);
    assert_true(one.norm_s == 0);
    assert_true(one.predicted_s >= none.predicted_s);
    assert_true(one.predicted_s < two.predicted_s);
    /* the opt worker's time: clipping's sums added, in either schedule */
    assert_true(none.opt_s > 0 && two.opt_s > none.opt_s);
    assert_float_equal(one.opt_s, two.opt_s, 1e-12);
    fy_actplace_release(&none);
    fy_actplace_release(&two);
    fy_actplace_release(&one);
}

/* bf16 weights, every block kept on the device and AdamW slow enough that host memory binds each
 * phase (mem): with every unit converted by the opt worker (no copies) the step takes the
 * conversions' bytes (6 a parameter in the forward, 6 a block parameter in the backward) less the
 * weights' halved PCIe bytes longer than with f32 weights; with a copy for every unit, the halved
 * PCIe bytes less the copies AdamW writes (2 a parameter) shorter. The opt worker's time (opt_s)
 * is AdamW's, and the conversions' bytes at host memory's rate where it makes them. 294912 + 8 x 789760 + 512
 * parameters, 8 x 789760 in the blocks, host memory at 1e6 x 28 bytes/s. */
static void test_bf16_weights_conversions(void **state)
{
    (void)state;
    struct fy_model_config c = model();
    struct fy_block_profile p = profile(1e15, 1u << 20, 1ull << 40);
    struct fy_actplace_in in = input(&c, &p, FY_ACTPLAN_AUTO, "cuda");
    in.rates.opt_params = 1e6;
    const unsigned char copies[10] = {2, 2, 2, 2, 2, 2, 2, 2, 2, 2};
    struct fy_actplace f32, converted, copied;
    in.weight_dtype = 1; /* FY_DTYPE_F32 */
    assert_int_equal(fy_actplace_plan(&in, &f32), 0);
    assert_int_equal(f32.keep, (int)c.n_layer);
    in.weight_dtype = 2; /* FY_DTYPE_BF16 */
    assert_int_equal(fy_actplace_plan(&in, &converted), 0);
    in.resident = copies;
    assert_int_equal(fy_actplace_plan(&in, &copied), 0);
    const double params = 294912 + 8 * 789760.0 + 512, blocks = 8 * 789760.0, mem = 28e6;
    assert_float_equal(converted.predicted_s - f32.predicted_s,
                       (6 * params + 6 * blocks - 2 * params - 2 * blocks) / mem, 1e-6);
    assert_float_equal(copied.predicted_s - f32.predicted_s,
                       (-2 * params - 2 * blocks + 2 * params) / mem, 1e-6);
    /* the opt worker's time a step: AdamW, and the conversions where there are no copies */
    assert_float_equal(f32.opt_s, params / 1e6, 1e-9);
    assert_float_equal(copied.opt_s, params / 1e6, 1e-9);
    assert_float_equal(converted.opt_s, params / 1e6 + (6 * params + 6 * blocks) / mem, 1e-9);
    fy_actplace_release(&f32);
    fy_actplace_release(&converted);
    fy_actplace_release(&copied);
}

/* AdamW's rate as past steps ran it (struct fy_plan_rates's opt_in_steps): the opt worker's time
 * (updates, clipping's sums, conversions) follows that rate, host memory's (mem) stays the
 * sample's. The bf16 case above at half the rate in the steps: opt_s doubles; the forward, where
 * the worker converts every unit's weights, is then bound by it (its conversions' bytes at half of
 * host memory's rate, against all its bytes at the whole), so the step grows; 0 is the sample's. */
static void test_opt_rate_in_steps(void **state)
{
    (void)state;
    struct fy_model_config c = model();
    struct fy_block_profile p = profile(1e15, 1u << 20, 1ull << 40);
    struct fy_actplace_in in = input(&c, &p, FY_ACTPLAN_AUTO, "cuda");
    in.rates.opt_params = 1e6;
    in.weight_dtype = 2; /* FY_DTYPE_BF16: the opt worker converts every unit */
    in.clip = 1;
    struct fy_actplace sample, steps, same;
    assert_int_equal(fy_actplace_plan(&in, &sample), 0);
    in.rates.opt_in_steps = 0.5e6;
    assert_int_equal(fy_actplace_plan(&in, &steps), 0);
    assert_float_equal(steps.opt_s, 2 * sample.opt_s, 1e-9 * steps.opt_s);
    assert_true(steps.predicted_s > sample.predicted_s);
    const double params = 294912 + 8 * 789760.0 + 512;
    /* the forward's conversions (6 bytes a parameter) at the worker's 14e6 bytes/s bound it */
    assert_true(steps.predicted_s >= 6 * params / 14e6);
    in.rates.opt_in_steps = 1e6; /* the steps ran AdamW as the sample did: the same plan */
    assert_int_equal(fy_actplace_plan(&in, &same), 0);
    assert_float_equal(same.opt_s, sample.opt_s, 1e-12);
    assert_float_equal(same.predicted_s, sample.predicted_s, 1e-12);
    fy_actplace_release(&sample);
    fy_actplace_release(&steps);
    fy_actplace_release(&same);
}

/* The state in pieces (struct fy_plan_place's state_pieces), every unit streamed, the disk slow
 * enough to bind each phase: the backward reads each block's master section once more (8 x
 * 3162112 bytes at 1e8 bytes/s); with one-pass clipping the forward no longer reads a block's
 * state in place of its master (the updates come after the backward), so it reads the masters the
 * deferral saves. */
static void test_state_pieces_reads(void **state)
{
    (void)state;
    struct fy_model_config c = model();
    struct fy_block_profile p = profile(1e15, 1u << 20, 1ull << 40);
    struct fy_actplace_in in = input(&c, &p, FY_ACTPLAN_AUTO, "cuda");
    in.resident = NULL;
    in.rates.ssd_read = in.rates.ssd_write = 1e8;
    in.rates.opt_params = 1e15;
    struct fy_actplace whole, pieces;
    assert_int_equal(fy_actplace_plan(&in, &whole), 0);
    in.state_pieces = 1;
    assert_int_equal(fy_actplace_plan(&in, &pieces), 0);
    assert_float_equal(pieces.predicted_s - whole.predicted_s, 8 * 3162112.0 / 1e8, 1e-6);
    fy_actplace_release(&whole);
    fy_actplace_release(&pieces);
    in.clip = 1;
    in.clip_hold = 1; /* one pass */
    in.state_pieces = 0;
    assert_int_equal(fy_actplace_plan(&in, &whole), 0);
    in.state_pieces = 1;
    assert_int_equal(fy_actplace_plan(&in, &pieces), 0);
    assert_float_equal(pieces.predicted_s - whole.predicted_s, 8 * 3162112.0 / 1e8, 1e-6);
    fy_actplace_release(&whole);
    fy_actplace_release(&pieces);
}

/* Several gpu workers, N = 2 and 3 at 4 sequences each (the profile's share): the internals'
 * sizes are a worker's; auto keeps what the device holds and swaps nothing even where one worker
 * would (test_device_room_and_swap_sets); a slow NVLink binds each phase at its gradients' ring
 * reduce, (N - 1) / N of them, on CUDA and not on the CPU backend, which sums in the pool; and the
 * other ranks' copies load host memory, so the step is no faster than one worker's with its
 * share. */
static void test_ranks(void **state)
{
    (void)state;
    struct fy_model_config c = model();
    struct fy_block_profile p = profile(1e15, 1u << 20, 5u << 20);
    uint64_t head = fy_model_unit_params(&c, c.n_layer + 1) * 4 + (uint64_t)c.vocab * c.n_embd * 4;
    uint64_t blocks = c.n_layer * fy_model_unit_params(&c, 1) * 4 + fy_model_unit_params(&c, 0) * 4;
    for (int n = 2; n <= 3; n++) {
        struct fy_actplace_in one = input(&c, &p, FY_ACTPLAN_AUTO, "cuda"), in = one;
        in.ranks = n;
        in.B = 4 * n;
        struct fy_actplace r, r1;
        assert_int_equal(fy_actplace_plan(&one, &r1), 0);
        assert_non_null(r1.place); /* one worker swaps */
        assert_int_equal(fy_actplace_plan(&in, &r), 0);
        assert_null(r.place);
        assert_int_equal(r.keep, 5);
        assert_int_equal(r.keep_b, -1);
        assert_int_equal(r.swap.host_bytes + r.swap.ssd_bytes, 0);
        assert_memory_equal(&r.sizes, &r1.sizes, sizeof r.sizes);
        assert_true(r.predicted_s >= r1.step_a);
        fy_actplace_release(&r);
        fy_actplace_release(&r1);
        in.rates.nvlink = 1e3;
        assert_int_equal(fy_actplace_plan(&in, &r), 0);
        double nv = (double)head * (n - 1) / n / 1e3 + (double)blocks * (n - 1) / n / 1e3;
        assert_float_equal(r.predicted_s, nv, nv * 1e-12);
        fy_actplace_release(&r);
        struct fy_actplace_in cpu = in;
        cpu.backend = "cpu";
        cpu.act_dtype = 1;
        assert_int_equal(fy_actplace_plan(&cpu, &r), 0);
        assert_true(r.predicted_s < 1.0);
        fy_actplace_release(&r);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fast_links_swap_everything),
        cmocka_unit_test(test_no_room_recomputes),
        cmocka_unit_test(test_slow_links_recompute),
        cmocka_unit_test(test_device_room_and_swap_sets),
        cmocka_unit_test(test_budgets_hold),
        cmocka_unit_test(test_fused_fc_gelu_together),
        cmocka_unit_test(test_forced_modes),
        cmocka_unit_test(test_no_profile_and_bad_backend),
        cmocka_unit_test(test_clipped_steps),
        cmocka_unit_test(test_ranks),
        cmocka_unit_test(test_bf16_weights_conversions),
        cmocka_unit_test(test_opt_rate_in_steps),
        cmocka_unit_test(test_state_pieces_reads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
