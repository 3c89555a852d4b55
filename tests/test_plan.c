/* Tests of launcher/plan/plan, the planner, against numbers worked out by hand for small GPT-2 models
 * (f32 activations, batch 4 x 32; a unit's state is three f32 sections, each 4 KiB aligned):
 *   - the pool's regions for a placement, one by one, streamed and with everything placed;
 *   - fy_plan_make's sequence: nothing kept without --cpu-mem and what a streamed step moves over
 *     the SSD and PCIe, the store and the prediction; under a budget, unit 0 first and every unit
 *     whose state still fits (one that does not is passed over), then the bf16 copies; --ckpt-place
 *     auto sends the checkpoints to the store when not all state fits; the gradient slots: three
 *     while a unit streams, else as many as asked and the budget holds, one per block at most;
 *   - where the activation step runs: before the residency for the forced modes (whose swap the
 *     residency then plans around), after it for auto (which sees the residency);
 *   - the state in pieces (init --state-piece): the state slots a piece's, the master read again for
 *     a streamed block's backward, the floor's order (whole units with three gradient slots, then
 *     two, then pieces with three, two, one; never one with clipping), of those that fit the
 *     fastest with the units kept in the room each leaves (pieces where the disk binds and they
 *     leave room for a block), the one-slot bound, and what the plan says of it;
 *   - the GPU: the working buffers, and a set per call in flight with every block swapped;
 *   - several gpu workers: each GPU's compute and PCIe link, the NVLink and host memory terms,
 *     and what they refuse.
 * The pools' sizes are fy_pool_layout_size of the regions listed by hand (2 MiB a region here). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/base/check.h"
#include "common/formats/ckpt.h"
#include "common/base/dtype.h"
#include "common/model/optstate.h"
#include "common/ipc/pool.h"
#include "gpu_worker/backend.h"
#include "launcher/cli/options.h"
#include "launcher/plan/plan.h"
#include "launcher/plan/plan_describe.h"

#define KIB 1024ull
#define MIB (1024ull * 1024)

/* L blocks of width C; vocabulary 256, context 32. */
static struct fy_model_config gpt(unsigned L, unsigned C)
{
    return (struct fy_model_config){.n_layer = L, .n_head = 2, .n_embd = C, .vocab = 256, .ctx = 32};
}

/* Width 64: the embeddings 288 x 64 = 18432 parameters (73728 bytes f32, 4 KiB aligned as it
 * is), a block 12 x 64^2 + 13 x 64 = 49984 (199936 bytes, padded to 200704), the final LayerNorm
 * 128 (512, padded to 4096). Their state: 221184, 602112 and 12288 bytes; bf16 copies 36864,
 * 102400 and 4096. An activation [4][32][64] f32: 32768 bytes. */
#define EMBED_STATE 221184ull
#define BLOCK_STATE 602112ull
#define FINAL_STATE 12288ull
#define BLOCK_SECTION 200704ull
#define EMBED_SECTION 73728ull
#define ACT 32768ull

static const struct fy_plan_rates rates = {.gpu_flops = 1e12, .h2d = 1e9, .d2h = 2e9,
                                           .ssd_read = 1e8, .ssd_write = 2e8, .opt_params = 1e6};

/* A plan's input for model c at batch 4 x 32 on the CPU backend, every other option its default. */
static struct fy_plan_in input(const struct fy_model_config *c)
{
    return (struct fy_plan_in){
        .shape = {.c = c, .B = 4, .T = 32, .act_dtype = FY_DTYPE_F32, .weight_dtype = FY_DTYPE_F32},
        .backend = "cpu",
        .prefetch = 1,
        .grad_slots = FY_PLAN_GRAD_SLOTS_MAX,
        .block_inputs_place = FY_BLOCK_INPUTS_HOST,
        .act_mode = FY_ACTPLAN_RECOMPUTE,
        .state_copies = 2,
        .rates = rates};
}

/* The streaming regions of width 64 at 4 x 32 with L blocks: grad_slots block gradients, the
 * checkpoints in the pool or in block_inputs_slots slots, no clipping; n = 7. */
static void streaming(unsigned L, unsigned grad_slots, unsigned block_inputs_slots,
                      struct fy_pool_region_spec out[FY_PLAN_REGIONS_MAX])
{
    out[0] = (struct fy_pool_region_spec){"meta", FY_COMMIT_RECORD_BYTES};
    /* inputs, targets and positions, 512 bytes each, and two lists of the 288 embedding rows,
     * 4 KiB each */
    out[1] = (struct fy_pool_region_spec){"tokens", 4 * 4 * KIB};
    out[2] = (struct fy_pool_region_spec){"acts",
                                          (block_inputs_slots ? block_inputs_slots : L + 1) * ACT};
    out[3] = (struct fy_pool_region_spec){"dacts", (block_inputs_slots ? 3 : 2) * ACT};
    /* weights slot 0 and grads slot 0 the embeddings', the others a block's */
    out[4] = (struct fy_pool_region_spec){"weights", EMBED_SECTION + 2 * BLOCK_SECTION};
    out[5] = (struct fy_pool_region_spec){"grads", EMBED_SECTION + grad_slots * BLOCK_SECTION};
    out[6] = (struct fy_pool_region_spec){"state", 2 * BLOCK_STATE};
}

static void check_regions(const struct fy_plan *p, const struct fy_pool_region_spec *want,
                          unsigned n)
{
    assert_int_equal(p->n_regions, n);
    for (unsigned i = 0; i < n; i++) {
        assert_string_equal(p->regions[i].name, want[i].name);
        assert_int_equal(p->regions[i].bytes, want[i].bytes);
    }
    assert_int_equal(p->pool_bytes, fy_pool_layout_size(want, n));
}

static void test_regions_by_hand(void **state)
{
    (void)state;
    struct fy_model_config c = gpt(2, 64);
    struct fy_plan_shape s = {.c = &c, .B = 4, .T = 32, .act_dtype = FY_DTYPE_F32};
    struct fy_pool_region_spec got[FY_PLAN_REGIONS_MAX], want[FY_PLAN_REGIONS_MAX];
    unsigned n;
    const struct fy_plan_place streamed = {.prefetch = 1, .grad_slots = 3};
    fy_plan_regions(&s, &streamed, got, &n);
    streaming(2, 3, 0, want);
    assert_int_equal(n, 7);
    for (unsigned i = 0; i < n; i++) {
        assert_string_equal(got[i].name, want[i].name);
        assert_int_equal(got[i].bytes, want[i].bytes);
    }
    /* everything: clipped, two units read ahead, five gradient slots, the checkpoints through four
     * slots, every unit kept with a bf16 copy, internals swapped (64 KiB in the pool, four slots of
     * 8 KiB for those on the store) */
    const unsigned char copies[4] = {2, 2, 2, 2};
    s.clip = 1;
    const struct fy_plan_place all = {
        .resident = copies,
        .prefetch = 2,
        .grad_slots = 5,
        .block_inputs_slots = 4,
        .swap = {.host_bytes = 64 * KIB, .ssd_bytes = 16 * KIB, .slot_bytes = 8 * KIB, .slots = 4}};
    fy_plan_regions(&s, &all, got, &n);
    static const char *const names[9] = {"meta", "tokens", "acts", "dacts", "weights", "grads",
                                         "state", "resident", "saved"};
    const uint64_t bytes[9] = {
        FY_COMMIT_RECORD_BYTES,
        16 * KIB,
        4 * ACT,
        3 * ACT,
        EMBED_SECTION + 3 * BLOCK_SECTION,
        EMBED_SECTION + 5 * BLOCK_SECTION + 4 * KIB, /* the final unit's gradient after the slots */
        2 * BLOCK_STATE,
        EMBED_STATE + 36864 + 2 * (BLOCK_STATE + 102400) + FINAL_STATE + 4096,
        64 * KIB + 4 * 8 * KIB};
    assert_int_equal(n, 9);
    for (unsigned i = 0; i < n; i++) {
        assert_string_equal(got[i].name, names[i]);
        assert_int_equal(got[i].bytes, bytes[i]);
    }
}

/* No --cpu-mem: every unit streams. A step reads each unit's master section and state (73728 +
 * 221184, 2 x (200704 + 602112), 4096 + 12288 bytes) and writes the state back; PCIe as the
 * prediction test in test_plan_cmd works out (1276928 bytes up, 736256 down); the store holds two
 * copies of the state and both commit records; one more for the checkpoints on it: x_0 and x_1
 * written and read, 64 KiB in a scratch extent of the smallest class, 1 MiB. */
static void test_streamed_by_hand(void **state)
{
    (void)state;
    struct fy_model_config c = gpt(2, 64);
    struct fy_plan_in in = input(&c);
    struct fy_plan p;
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    assert_int_equal(p.kept, 0);
    assert_int_equal(p.weight_copies, 0);
    assert_int_equal(p.resident_bytes, 0);
    for (unsigned u = 0; u < 4; u++)
        assert_int_equal(p.resident[u], FY_PLAN_STREAMED);
    assert_int_equal(p.place.block_inputs_slots, 0);
    assert_int_equal(p.place.grad_slots, 3);
    struct fy_pool_region_spec want[FY_PLAN_REGIONS_MAX];
    streaming(2, 3, 0, want);
    check_regions(&p, want, 7);
    /* the header's 2 MiB, then each region from the next 2 MiB boundary at least a guard past the
     * one before (the first at 4 MiB), each under 2 MiB */
    assert_int_equal(p.pool_bytes, 4 * MIB + 7 * 2 * MIB);
    uint64_t state_total = EMBED_STATE + 2 * BLOCK_STATE + FINAL_STATE;
    assert_int_equal(p.traffic.ssd_read, 294912 + 2 * 802816 + 16384);
    assert_int_equal(p.traffic.ssd_write, state_total);
    assert_int_equal(p.traffic.to_gpu, 1276928);
    assert_int_equal(p.traffic.from_gpu, 736256);
    assert_int_equal(p.store_bytes, 2 * state_total + 2 * FY_COMMIT_RECORD_BYTES);
    assert_float_equal(p.predicted.ssd_s, 1916928 / 1e8 + 1437696 / 2e8, 1e-12);
    assert_float_equal(p.predicted.step_s, 0.118528, 1e-12);
    assert_string_equal(p.predicted.bound, "optimizer");
    assert_true(p.fits_cpu);
    fy_plan_release(&p);

    in.block_inputs_place = FY_BLOCK_INPUTS_SSD;
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    assert_int_equal(p.place.block_inputs_slots, 4); /* --act-ahead 2, and two */
    streaming(2, 3, 4, want);
    check_regions(&p, want, 7);
    assert_int_equal(p.traffic.ssd_read, 1916928 + 2 * ACT);
    assert_int_equal(p.traffic.ssd_write, state_total + 2 * ACT);
    assert_int_equal(p.store_bytes, 2 * state_total + 2 * FY_COMMIT_RECORD_BYTES + MIB);
    fy_plan_release(&p);
}

/* Gradients held in the CUDA backend's arena, where this build models its memory: refused without
 * --gpu-mem (the arena is sized to its working buffers), taken with room, refused a byte short. */
static void clip_hold_in_cuda_arena(const struct fy_plan_in *base, const struct fy_model_config *c)
{
    uint64_t working, set;
    if (!fy_backend_gpu_bytes("cuda", c, fy_plan_rank_batch(&base->shape), base->shape.T, &working,
                              &set)) {
        print_message("skipped the CUDA arena's part: this build has no CUDA backend, whose memory "
                      "the plan models\n");
        return;
    }
    struct fy_plan_in in = *base;
    struct fy_plan gpu;
    char said[1024];
    in.backend = "cuda"; /* modelled: without --gpu-mem the arena has no room to spare */
    assert_int_equal(fy_plan_make(&in, NULL, &gpu), 0);
    assert_int_equal(gpu.place.grad_hold, FY_HOLD_NONE);
    fy_plan_clip_describe(&in, &gpu, said, sizeof said);
    assert_non_null(strstr(said, "the GPU arena has no room for them beside its working buffers "
                                 "(--gpu-mem not given)"));
    fy_plan_release(&gpu);
    in.gpu_mem = 1ull << 30;
    assert_int_equal(fy_plan_make(&in, NULL, &gpu), 0);
    assert_int_equal(gpu.place.grad_hold, FY_HOLD_GPU);
    assert_int_equal(gpu.gpu_need, gpu.gpu_working + fy_plan_hold_bytes(c));
    assert_true(gpu.fits_gpu);
    fy_plan_release(&gpu);
    in.gpu_mem = gpu.gpu_working + fy_plan_hold_bytes(c) - 1;
    in.clip_mode = FY_CLIP_ONE_PASS;
    in.clip_hold = FY_CLIP_HOLD_GPU;
    assert_int_equal(fy_plan_make(&in, NULL, &gpu), 0);
    assert_int_equal(gpu.place.grad_hold, FY_HOLD_GPU);
    assert_false(gpu.fits_gpu);
    fy_plan_release(&gpu);
}

/* Clipping, every unit streamed, on the streamed plan above. Two passes: the blocks' master
 * sections read once more (2 x 200704), their weights, activations and gradients cross PCIe twice in
 * the backward, 3/4 of the blocks' FLOPs once more. One pass: the unclipped SSD bytes (the next
 * forward reads a block's state, updates it and takes its master from it; with --prefetch 3 it
 * cannot, and the master is read twice as with two passes), the unclipped PCIe, the held gradients (two block sections) in a gradhold region after the state, and the bound
 * 0.75 x compute + AdamW. auto takes one pass where it fits (no --cpu-mem: nothing kept) and is no
 * slower; with --cpu-mem where the kept state leaves no room for it, two, and it says the pool one
 * pass would take; or one with the gradients in the GPU arena (--clip-hold). */
static void test_clip_modes(void **state)
{
    (void)state;
    struct fy_model_config c = gpt(2, 64);
    struct fy_plan_in in = input(&c);
    struct fy_plan none, two, one;
    assert_int_equal(fy_plan_make(&in, NULL, &none), 0);
    in.shape.clip = 1;
    in.clip_mode = FY_CLIP_TWO_PASS;
    assert_int_equal(fy_plan_make(&in, NULL, &two), 0);
    assert_false(two.place.grad_hold);
    in.clip_mode = FY_CLIP_ONE_PASS;
    assert_int_equal(fy_plan_make(&in, NULL, &one), 0);
    assert_true(one.place.grad_hold);
    assert_int_equal(two.traffic.ssd_read, none.traffic.ssd_read + 2 * BLOCK_SECTION);
    assert_int_equal(one.traffic.ssd_read, none.traffic.ssd_read); /* the next forward updates */
    struct fy_plan ahead;
    in.prefetch = 3; /* reading three units ahead, the forward has no state slot to spare */
    assert_int_equal(fy_plan_make(&in, NULL, &ahead), 0);
    assert_int_equal(ahead.traffic.ssd_read, two.traffic.ssd_read);
    fy_plan_release(&ahead);
    in.prefetch = 1;
    assert_int_equal(one.traffic.ssd_write, none.traffic.ssd_write);
    assert_int_equal(one.traffic.to_gpu, none.traffic.to_gpu);
    assert_int_equal(one.traffic.from_gpu, none.traffic.from_gpu);
    assert_true(two.traffic.to_gpu > none.traffic.to_gpu);
    assert_true(two.predicted.gpu_s > one.predicted.gpu_s);
    assert_float_equal(one.predicted.gpu_s, none.predicted.gpu_s, 1e-15);
    /* AdamW (1e6 parameters a second here) binds: after the backward it adds to 3/4 of the compute */
    assert_float_equal(one.predicted.step_s, 0.75 * one.predicted.gpu_s + one.predicted.opt_s,
                       1e-12);
    assert_string_equal(one.predicted.bound, "the norm, then the optimizer");
    assert_int_equal(one.n_regions, 8);
    assert_string_equal(one.regions[7].name, "gradhold");
    assert_int_equal(one.regions[7].bytes, 2 * BLOCK_SECTION);
    assert_int_equal(fy_plan_hold_bytes(&c), 2 * BLOCK_SECTION);
    assert_int_equal(two.n_regions, 7);
    char said[1024];
    fy_plan_clip_describe(&in, &one, said, sizeof said);
    assert_non_null(strstr(said, "clipping in one backward pass (--clip-mode one-pass): the "
                                 "blocks' gradients (392.0 KiB) held in the pool"));
    /* auto without --cpu-mem: two (no budget allows the held gradients in the pool; the GPU's
     * are below) */
    in.clip_mode = FY_CLIP_AUTO;
    in.clip_hold = FY_CLIP_HOLD_POOL;
    struct fy_plan autop;
    assert_int_equal(fy_plan_make(&in, NULL, &autop), 0);
    assert_false(autop.place.grad_hold);
    fy_plan_clip_describe(&in, &autop, said, sizeof said);
    assert_non_null(strstr(said, ", and no --cpu-mem allows it"));
    fy_plan_release(&autop);
    /* with room (a cap far above the state): the faster by the rates. Here AdamW binds: one pass
     * runs it after the backward, two passes after the norm pass, which costs the second pass's
     * forward share more; with a fast AdamW, one pass saves the second backward */
    in.cpu_mem = 1ull << 30;
    assert_int_equal(fy_plan_make(&in, NULL, &autop), 0);
    assert_int_equal(autop.kept, 4);
    assert_true(autop.place.grad_hold);
    in.clip_mode = FY_CLIP_TWO_PASS;
    struct fy_plan twice;
    assert_int_equal(fy_plan_make(&in, NULL, &twice), 0);
    assert_true(autop.predicted.step_s < twice.predicted.step_s);
    assert_string_equal(twice.predicted.bound, "the norm, then the optimizer");
    /* the norm pass (the second pass's compute) alone, then AdamW under the rest */
    assert_float_equal(twice.predicted.step_s, one.predicted.gpu_s + twice.predicted.opt_s, 1e-12);
    fy_plan_release(&twice);
    fy_plan_release(&autop);
    in.clip_mode = FY_CLIP_AUTO;
    in.rates.opt_params = in.rates.opt_by_format[0] = 1e12;
    assert_int_equal(fy_plan_make(&in, NULL, &autop), 0);
    assert_true(autop.place.grad_hold);
    fy_plan_release(&autop);
    /* a cap the streaming pool fits and the held gradients do not */
    in.cpu_mem = none.pool_bytes;
    assert_int_equal(fy_plan_make(&in, NULL, &autop), 0);
    assert_false(autop.place.grad_hold);
    assert_true(autop.one_pass_pool_bytes > in.cpu_mem);
    fy_plan_clip_describe(&in, &autop, said, sizeof said);
    assert_non_null(strstr(said, "clipping in two backward passes, the first for the norm alone: "
                                 "one pass would hold the blocks' gradients (392.0 KiB), a pool of "));
    fy_plan_release(&autop);
    /* where the held gradients fit only in place of kept state: one pass with fewer units kept,
     * where the rates make that faster than a second backward (a slow GPU, a fast disk and
     * AdamW), said against the unclipped plan that keeps them */
    in.rates = (struct fy_plan_rates){.gpu_flops = 1e9, .h2d = 1e12, .d2h = 1e12,
                                      .ssd_read = 1e12, .ssd_write = 1e12, .opt_params = 1e12,
                                      .opt_by_format = {1e12, 1e12, 1e12}};
    in.shape.clip = 0;
    in.cpu_mem = 1ull << 30;
    struct fy_plan all;
    assert_int_equal(fy_plan_make(&in, NULL, &all), 0);
    assert_int_equal(all.kept, 4);
    in.shape.clip = 1;
    in.cpu_mem = all.pool_bytes; /* every unit kept, no room for the gradients beside them */
    assert_int_equal(fy_plan_make(&in, NULL, &autop), 0);
    assert_true(autop.place.grad_hold);
    assert_true(autop.kept < 4);
    assert_int_equal(autop.clip_kept_fewer, 4 - autop.kept);
    assert_true(autop.pool_bytes <= in.cpu_mem);
    assert_true(autop.predicted.step_s < autop.two_pass_step_s);
    assert_float_equal(autop.unclipped_step_s, all.predicted.step_s, 1e-12);
    fy_plan_clip_describe(&in, &autop, said, sizeof said);
    assert_non_null(strstr(said, "held in the pool in place of "));
    fy_plan_release(&autop);
    /* and where a second backward costs less (a fast GPU), two passes with every unit kept */
    in.rates.gpu_flops = 1e15;
    in.rates.ssd_read = in.rates.ssd_write = 1e6;
    assert_int_equal(fy_plan_make(&in, NULL, &autop), 0);
    assert_false(autop.place.grad_hold);
    assert_int_equal(autop.kept, 4);
    fy_plan_release(&autop);

    /* held in the GPU arena (--clip-hold auto where the pool has no room, or gpu): no gradhold
     * region, every unit kept that fits, the one pass's SSD bytes, the gradients sent from the GPU
     * once more; where the arena is modelled, in the GPU's need, and refused without room */
    in.rates = rates;
    in.clip_hold = FY_CLIP_HOLD_AUTO;
    in.cpu_mem = two.pool_bytes; /* the CPU backend: the gpu worker's memory holds them */
    struct fy_plan gpu;
    assert_int_equal(fy_plan_make(&in, NULL, &gpu), 0);
    assert_int_equal(gpu.place.grad_hold, FY_HOLD_GPU);
    assert_int_equal(gpu.n_regions, 7);
    for (unsigned i = 0; i < gpu.n_regions; i++) /* two passes' pool */
        assert_int_equal(gpu.regions[i].bytes, two.regions[i].bytes);
    assert_true(gpu.fits_cpu);
    assert_int_equal(gpu.traffic.ssd_read, one.traffic.ssd_read);
    assert_int_equal(gpu.traffic.from_gpu, one.traffic.from_gpu + 2 * 4 * fy_model_unit_params(&c, 1));
    assert_float_equal(gpu.predicted.gpu_s, one.predicted.gpu_s, 1e-15);
    fy_plan_clip_describe(&in, &gpu, said, sizeof said);
    assert_non_null(strstr(said, "clipping in one backward pass: the blocks' gradients (392.0 KiB) "
                                 "held in the GPU arena (each sent to the pool for its update)"));
    fy_plan_release(&gpu);
    clip_hold_in_cuda_arena(&in, &c);
    fy_plan_release(&all);
    fy_plan_release(&none);
    fy_plan_release(&two);
    fy_plan_release(&one);
}

/* bf16 weights for every unit, width 64 and two blocks (test_streamed_by_hand's model): each
 * weights slot a block's bf16 weights (49984 x 2 bytes, padded to 102400; slot 0 the embeddings',
 * 18432 x 2 = 36864), the landing ring where a
 * unit streams (four chunks of a quarter of the block's master section, 200704 / 4 = 50176, padded
 * to 53248); PCIe 469760 bytes fewer than f32's 1276928 (the embeddings' 36864, the blocks' 2 x
 * 99968 in the forward and again in the backward, the head's final unit and wte 33024); the opt
 * worker converts what has no copy: streamed, every unit in the forward (118528 parameters) and
 * the blocks in the backward (99968), 6 bytes each, at AdamW's host memory rate (1e6 parameters/s
 * x 28 bytes); with copies for all but block 1, block 1 alone; with every unit kept without a copy,
 * as streamed but no landing ring; with copies for all, nothing converted and no ring. The SSD
 * moves what it moves with f32 weights. The layout read back finds the slots and the ring. */
static void test_bf16_weights_by_hand(void **state)
{
    (void)state;
    struct fy_model_config c = gpt(2, 64);
    struct fy_plan_in in = input(&c);
    struct fy_plan f32, p;
    assert_int_equal(fy_plan_make(&in, NULL, &f32), 0);
    in.shape.weight_dtype = FY_DTYPE_BF16;
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    struct fy_pool_region_spec want[FY_PLAN_REGIONS_MAX];
    streaming(2, 3, 0, want);
    memmove(want + 6, want + 5, 2 * sizeof want[0]);
    want[4] = (struct fy_pool_region_spec){"weights", 36864 + 2 * 102400};
    want[5] = (struct fy_pool_region_spec){"landing", 4 * 53248};
    check_regions(&p, want, 8);
    assert_int_equal(p.traffic.to_gpu, 1276928 - 469760);
    assert_int_equal(p.traffic.from_gpu, f32.traffic.from_gpu);
    assert_int_equal(p.traffic.ssd_read, f32.traffic.ssd_read);
    assert_int_equal(p.traffic.ssd_write, f32.traffic.ssd_write);
    assert_int_equal(fy_plan_convert_params(&in.shape, &p.place), 118528 + 99968);
    assert_int_equal(p.traffic.convert, (118528 + 99968) * 6);
    assert_float_equal(p.predicted.convert_s, (118528 + 99968) * 6 / 28e6, 1e-12);
    assert_float_equal(p.predicted.opt_s, 0.118528 + (118528 + 99968) * 6 / 28e6, 1e-12);
    assert_float_equal(p.predicted.h2d_s, (1276928 - 469760) / 1e9, 1e-15);
    /* AdamW at half its sample's rate in past steps (opt_in_steps): the opt worker's time, the
     * conversions with it, doubles; the other resources' do not */
    struct fy_plan slow;
    in.rates.opt_in_steps = in.rates.opt_params / 2;
    assert_int_equal(fy_plan_make(&in, NULL, &slow), 0);
    assert_float_equal(slow.predicted.opt_s, 2 * p.predicted.opt_s, 1e-12);
    assert_float_equal(slow.predicted.convert_s, 2 * p.predicted.convert_s, 1e-12);
    assert_float_equal(slow.predicted.h2d_s, p.predicted.h2d_s, 1e-15);
    assert_float_equal(slow.predicted.ssd_s, p.predicted.ssd_s, 1e-15);
    fy_plan_release(&slow);
    in.rates.opt_in_steps = 0;
    assert_int_equal(fy_plan_upload_bytes(&c, FY_DTYPE_BF16, 1), 49984 * 2);
    assert_int_equal(fy_plan_upload_bytes(&c, FY_DTYPE_F32, 1), 49984 * 4);
    char said[320];
    fy_plan_weights_describe(&in.shape, &p, said, sizeof said);
    assert_non_null(strstr(said, "weights to the GPU in bf16 for all 4 units: 0 from a bf16 copy "
                                 "beside their kept state"));
    /* two-pass clipping converts the blocks once more, for the norm pass */
    struct fy_plan_shape clipped = in.shape;
    clipped.clip = 1;
    assert_int_equal(fy_plan_convert_params(&clipped, &p.place), 118528 + 2 * 99968);
    fy_plan_release(&p);

    /* the pool as the plan lays it out, read back */
    struct fy_pool *pool = NULL;
    char name[64];
    snprintf(name, sizeof name, "/fuyou-test-plan-%d", (int)getpid());
    struct fy_pool_opts po = {.topo = NULL, .numa_node = -1, .run_dir = "/tmp/test-plan"};
    assert_int_equal(fy_pool_create(&pool, name, want, 8, &po), 0);
    struct fy_plan_layout l;
    assert_int_equal(fy_plan_layout_read(pool, &in.shape, &l), 0);
    assert_int_equal(l.weight_dtype, FY_DTYPE_BF16);
    assert_int_equal(l.wslot_bytes, 102400);
    assert_int_equal(l.wslots, 2);
    assert_int_equal(l.land_slots, 4);
    assert_int_equal(l.land_chunk, 53248);
    struct fy_plan_shape units = in.shape; /* init, export: no weights slots read */
    units.weight_dtype = 0;
    assert_int_equal(fy_plan_layout_read(pool, &units, &l), 0);
    assert_int_equal(l.wslots, 0);
    units.weight_dtype = FY_DTYPE_F32; /* f32 slots in a region of three bf16 ones */
    assert_int_equal(fy_plan_layout_read(pool, &units, &l), -EINVAL);
    fy_pool_destroy(&pool);

    const unsigned char some[4] = {FY_PLAN_KEPT_BF16, FY_PLAN_STREAMED, FY_PLAN_KEPT_BF16,
                                   FY_PLAN_KEPT_BF16};
    const unsigned char kept[4] = {FY_PLAN_KEPT, FY_PLAN_KEPT, FY_PLAN_KEPT, FY_PLAN_KEPT};
    const unsigned char all[4] = {FY_PLAN_KEPT_BF16, FY_PLAN_KEPT_BF16, FY_PLAN_KEPT_BF16,
                                  FY_PLAN_KEPT_BF16};
    const struct fy_plan_place p_some = {.resident = some, .prefetch = 1, .grad_slots = 3};
    const struct fy_plan_place p_kept = {.resident = kept, .prefetch = 1, .grad_slots = 3};
    const struct fy_plan_place p_all = {.resident = all, .prefetch = 1, .grad_slots = 3};
    assert_int_equal(fy_plan_convert_params(&in.shape, &p_some), 2 * 49984);
    assert_int_equal(fy_plan_convert_params(&in.shape, &p_kept), 118528 + 99968);
    assert_int_equal(fy_plan_convert_params(&in.shape, &p_all), 0);
    struct fy_pool_region_spec got[FY_PLAN_REGIONS_MAX];
    unsigned n;
    fy_plan_regions(&in.shape, &p_some, got, &n);
    assert_string_equal(got[5].name, "landing");
    fy_plan_regions(&in.shape, &p_kept, got, &n);
    assert_string_equal(got[5].name, "grads"); /* nothing streams: no ring */
    struct fy_plan_traffic t;
    fy_plan_traffic(&in.shape, &p_all, &t);
    assert_int_equal(t.convert, 0);
    assert_int_equal(t.to_gpu, 1276928 - 469760);
    /* f32 weights: nothing converted, whatever is kept */
    struct fy_plan_shape f32_shape = in.shape;
    f32_shape.weight_dtype = FY_DTYPE_F32;
    assert_int_equal(fy_plan_convert_params(&f32_shape, &p_kept), 0);
    fy_plan_release(&f32);
}

/* Width 256, four blocks: the embeddings' state 884736 bytes (73728 parameters, 294912 bytes a
 * section: weights slot 0 and grads slot 0), a block's 9486336 (789760 parameters, 3159040 bytes
 * padded to 3162112 a section), the final unit's 12288.
 * A budget of the streaming pool and one 2 MiB region more keeps unit 0 and, passing over the
 * blocks, the final unit (884736 + 12288 bytes); their bf16 copies (147456 and 4096 bytes) fit
 * too. Not all state fits, so --ckpt-place auto sends the checkpoints to the store. */
static void test_residency_by_budget(void **state)
{
    (void)state;
    struct fy_model_config c = gpt(4, 256);
    const uint64_t act = 4 * 32 * 256 * 4, section = 3162112, block_state = 3 * section;
    struct fy_pool_region_spec least[8] = {{"meta", FY_COMMIT_RECORD_BYTES},
                                           {"tokens", 16 * KIB},
                                           {"acts", 5 * act},
                                           {"dacts", 2 * act},
                                           {"weights", 294912 + 2 * section},
                                           {"grads", 294912 + 3 * section},
                                           {"state", 2 * block_state},
                                           {"resident", 884736 + 12288}};
    struct fy_plan_in in = input(&c);
    in.cpu_mem = fy_pool_layout_size(least, 8);
    struct fy_plan p;
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    assert_int_equal(p.kept, 2);
    const unsigned char kept[6] = {1, 0, 0, 0, 0, 1};
    assert_memory_equal(p.resident, kept, 6);
    assert_int_equal(p.resident_bytes, 884736 + 12288);
    check_regions(&p, least, 8);
    assert_true(p.fits_cpu);
    /* the streamed blocks' traffic alone: 4 x (3162112 + 9486336) read, 4 x 9486336 written */
    assert_int_equal(p.traffic.ssd_read, 4 * (section + block_state));
    assert_int_equal(p.traffic.ssd_write, 4 * block_state);
    fy_plan_release(&p);

    /* bf16 weights: three bf16 slots (1579520 bytes padded to 1581056 each, slot 0 the
     * embeddings' 147456) and the landing ring
     * (four chunks of a quarter of a block's master section, 790528 bytes) in place of the three
     * f32 slots, the same 2 MiB regions: the same units kept, with their copies; the streamed
     * blocks converted in the forward and the backward, 4 x 2 x 789760 parameters */
    in.shape.weight_dtype = FY_DTYPE_BF16;
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    const unsigned char copies[6] = {2, 0, 0, 0, 0, 2};
    assert_memory_equal(p.resident, copies, 6);
    assert_int_equal(p.kept, 2);
    assert_int_equal(p.weight_copies, 2);
    assert_int_equal(p.resident_bytes, 884736 + 147456 + 12288 + 4096);
    assert_int_equal(p.n_regions, 9);
    assert_string_equal(p.regions[4].name, "weights");
    assert_int_equal(p.regions[4].bytes, 147456 + 2 * 1581056);
    assert_string_equal(p.regions[5].name, "landing");
    assert_int_equal(p.regions[5].bytes, 4 * 790528);
    assert_int_equal(fy_plan_land_chunk(&c), 790528);
    assert_int_equal(p.traffic.convert, 4 * 2 * 789760ull * 6);
    assert_true(p.pool_bytes <= in.cpu_mem);
    fy_plan_release(&p);

    in.shape.weight_dtype = FY_DTYPE_F32;
    in.block_inputs_place = FY_BLOCK_INPUTS_AUTO;
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    assert_int_equal(p.place.block_inputs_slots, 4);
    assert_int_equal(p.kept, 2);
    fy_plan_release(&p);
    in.cpu_mem = 1024 * MIB; /* all of it fits: the checkpoints stay in the pool */
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    assert_int_equal(p.kept, 6);
    assert_int_equal(p.place.block_inputs_slots, 0);
    assert_int_equal(p.traffic.ssd_read + p.traffic.ssd_write, 0);
    fy_plan_release(&p);
}

/* Every unit kept: as many gradient slots as asked, one per block at most (8 of 8 blocks, or 5
 * when 5 are asked). Sixteen blocks under a budget of the streaming pool with three and all the
 * state: the embeddings' slot and ten blocks' (73728 + 10 x 200704 bytes) still fit the grads
 * region's 2 MiB, eleven do not: ten slots; a unit streamed: three. */
static void test_grad_slots(void **state)
{
    (void)state;
    struct fy_model_config c = gpt(8, 64);
    struct fy_plan_in in = input(&c);
    in.cpu_mem = 1024 * MIB;
    struct fy_plan p;
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    assert_int_equal(p.kept, 10);
    assert_int_equal(p.place.grad_slots, 8);
    fy_plan_release(&p);
    in.grad_slots = 5;
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    assert_int_equal(p.place.grad_slots, 5);
    fy_plan_release(&p);

    struct fy_model_config deep = gpt(16, 64);
    in = input(&deep);
    struct fy_pool_region_spec least[FY_PLAN_REGIONS_MAX];
    streaming(16, 3, 0, least);
    least[7] = (struct fy_pool_region_spec){"resident",
                                            EMBED_STATE + 16 * BLOCK_STATE + FINAL_STATE};
    in.cpu_mem = fy_pool_layout_size(least, 8);
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    assert_int_equal(p.kept, 18);
    assert_int_equal(p.place.grad_slots, 10);
    assert_int_equal(p.pool_bytes, in.cpu_mem);
    fy_plan_release(&p);
    /* 2 MiB less: four for the resident region, which hold unit 0, blocks 1 to 13 and the final
     * unit (221184 + 13 x 602112 + 12288 bytes); blocks 14 to 16 stream */
    in.cpu_mem -= 2 * MIB;
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    assert_int_equal(p.kept, 15);
    for (unsigned u = 0; u < 18; u++)
        assert_int_equal(p.resident[u], u >= 14 && u <= 16 ? FY_PLAN_STREAMED : FY_PLAN_KEPT);
    assert_int_equal(p.place.grad_slots, 3);
    fy_plan_release(&p);
}

/* What the activation step saw when it ran, and the swap it places. */
struct seen {
    int calls;
    unsigned kept_before, block_inputs_slots;
    struct fy_plan_swap swap;
};

static int place_swap(void *ctx, const struct fy_plan_in *in, struct fy_plan *p)
{
    struct seen *s = ctx;
    s->calls++;
    s->kept_before = 0;
    for (unsigned u = 0; u < fy_model_unit_count(in->shape.c); u++)
        s->kept_before += p->resident[u] != FY_PLAN_STREAMED;
    s->block_inputs_slots = p->place.block_inputs_slots;
    p->place.swap = s->swap;
    return 0;
}

/* --act-plan host: the swap is placed first, and 2 MiB of it in the pool leaves the budget that
 * kept two units (test_residency_by_budget) none; auto: placed after the residency, seeing it, its
 * swap in the regions and the traffic all the same. */
static void test_activation_step_order(void **state)
{
    (void)state;
    struct fy_model_config c = gpt(4, 256);
    const uint64_t act = 4 * 32 * 256 * 4, section = 3162112, block_state = 3 * section;
    struct fy_pool_region_spec least[8] = {{"meta", FY_COMMIT_RECORD_BYTES},
                                           {"tokens", 16 * KIB},
                                           {"acts", 5 * act},
                                           {"dacts", 2 * act},
                                           {"weights", 294912 + 2 * section},
                                           {"grads", 294912 + 3 * section},
                                           {"state", 2 * block_state},
                                           {"resident", 884736 + 12288}};
    struct fy_plan_in in = input(&c);
    in.cpu_mem = fy_pool_layout_size(least, 8);
    struct seen seen = {.swap = {.host_bytes = 2 * MIB}};
    const struct fy_plan_acts acts = {.place = place_swap, .ctx = &seen};
    struct fy_plan p;
    in.act_mode = FY_ACTPLAN_HOST;
    assert_int_equal(fy_plan_make(&in, &acts, &p), 0);
    assert_int_equal(seen.calls, 1);
    assert_int_equal(seen.kept_before, 0);
    assert_int_equal(p.kept, 0);
    assert_string_equal(p.regions[p.n_regions - 1].name, "saved");
    assert_int_equal(p.regions[p.n_regions - 1].bytes, 2 * MIB);
    fy_plan_release(&p);

    in.act_mode = FY_ACTPLAN_AUTO;
    in.block_inputs_place = FY_BLOCK_INPUTS_AUTO;
    seen = (struct seen){.swap = {.host_bytes = 64 * KIB, .ssd_bytes = 96 * KIB,
                                  .slot_bytes = 32 * KIB, .slots = 4}};
    assert_int_equal(fy_plan_make(&in, &acts, &p), 0);
    assert_int_equal(seen.calls, 1);
    assert_int_equal(seen.kept_before, 2);
    assert_int_equal(seen.block_inputs_slots, 4);
    assert_int_equal(p.kept, 2);
    assert_int_equal(p.regions[p.n_regions - 1].bytes, 64 * KIB + 4 * 32 * KIB);
    /* the internals on the store written once and read once, beside the checkpoints x_0..x_3 */
    assert_int_equal(p.traffic.ssd_write, 4 * block_state + 4 * act + 96 * KIB);
    assert_int_equal(p.traffic.ssd_read, 4 * (section + block_state) + 4 * act + 96 * KIB);
    /* and across PCIe: down in the forward, up in the backward */
    struct fy_plan_place none = p.place;
    memset(&none.swap, 0, sizeof none.swap);
    struct fy_plan_traffic without;
    fy_plan_traffic(&in.shape, &none, &without);
    assert_int_equal(p.traffic.from_gpu - without.from_gpu, 160 * KIB);
    assert_int_equal(p.traffic.to_gpu - without.to_gpu, 160 * KIB);
    fy_plan_release(&p);
}

/* Width 256, two blocks, the state in pieces of at most 1 MiB. A block (789760 parameters) cut by
 * the rule (tensors whole where they fit, else at multiples of 4096 values): ten pieces of 86528,
 * 86016, 86784, 86784, 86016, 86016, 87040, 86016, 86016 and 12544 parameters, the largest's state
 * 1044480 bytes, the extent 9498624 (three padded sections a piece), the masters 3166208; the
 * embeddings (884736 bytes) and the final unit one piece each. Regions: weights and grads slot 0
 * the embeddings' 294912, a block's f32 section 3162112. */
static void test_state_pieces_by_hand(void **state)
{
    (void)state;
    struct fy_model_config c = gpt(2, 256);
    c.state_piece = 1 * MIB;
    const uint64_t act = 4 * 32 * 256 * 4, section = 3162112, embed = 294912;
    const uint64_t piece = 1044480, extent = 9498624, masters = 3166208;
    assert_int_equal(fy_optstate_piece_count(&c, 1), 10);
    assert_int_equal(fy_optstate_piece_count(&c, 0), 1);
    assert_int_equal(fy_optstate_bytes(&c, 1), extent);
    assert_int_equal(fy_optstate_master_bytes(&c, 1), masters);
    assert_int_equal(fy_optstate_max_piece_bytes(&c), piece);
    assert_int_equal(fy_optstate_max_bytes(&c), extent);
    /* f32 weights of units in pieces come through the landing ring, copied together: four chunks
     * of a quarter of the block's masters, 3166208 / 4 padded to 794624 */
    assert_int_equal(fy_plan_land_chunk(&c), 794624);
    struct fy_pool_region_spec regions[5][8];
    const struct {
        int pieces;
        unsigned slots;
    } floor[5] = {{0, 3}, {0, 2}, {1, 3}, {1, 2}, {1, 1}};
    for (int i = 0; i < 5; i++) {
        struct fy_pool_region_spec r[8] = {{"meta", FY_COMMIT_RECORD_BYTES},
                                           {"tokens", 16 * KIB},
                                           {"acts", 3 * act},
                                           {"dacts", 2 * act},
                                           {"weights", embed + 2 * section},
                                           {"landing", 4 * 794624},
                                           {"grads", embed + floor[i].slots * section},
                                           {"state", 2 * (floor[i].pieces ? piece : extent)}};
        memcpy(regions[i], r, sizeof r);
    }
    /* each try of the floor, at its own pool: taken, nothing kept */
    struct fy_plan_in in = input(&c);
    struct fy_plan p;
    for (int i = 0; i < 5; i++) {
        in.cpu_mem = fy_pool_layout_size(regions[i], 8);
        assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
        assert_int_equal(p.place.state_pieces, floor[i].pieces);
        assert_int_equal(p.place.grad_slots, floor[i].slots);
        assert_int_equal(p.kept, 0);
        check_regions(&p, regions[i], 8);
        assert_true(p.fits_cpu);
        fy_plan_release(&p);
    }
    /* where the disk binds, the room of whole units' state slots is better spent on state: at the
     * pool of whole units' slots with nothing kept, the state slots a piece's, a block kept */
    in.rates = (struct fy_plan_rates){.gpu_flops = 1e15,
                                      .h2d = 1e12,
                                      .d2h = 1e12,
                                      .ssd_read = 1e8,
                                      .ssd_write = 2e8,
                                      .opt_params = 1e12,
                                      .opt_by_format = {1e12, 1e12, 1e12}};
    in.cpu_mem = fy_pool_layout_size(regions[0], 8);
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    assert_int_equal(p.place.state_pieces, 1);
    assert_true(p.kept >= 2 && p.resident[1] == FY_PLAN_KEPT);
    assert_true(p.fits_cpu);
    struct fy_plan_place whole_kept = p.place; /* and predicted faster than the whole units' */
    whole_kept.state_pieces = 0;
    whole_kept.grad_slots = 3;
    whole_kept.resident = NULL;
    struct fy_plan_prediction alone;
    fy_plan_predict(&in.shape, &whole_kept, &in.rates, &alone);
    assert_true(p.predicted.step_s < alone.step_s);
    fy_plan_release(&p);
    in.rates = rates;
    /* the pieces, one slot: every unit's master in the forward and its state read and written,
     * a block's master once more in the backward, before its state */
    struct fy_plan_traffic whole;
    const struct fy_plan_place whole_place = {.prefetch = 1, .grad_slots = 1};
    fy_plan_traffic(&in.shape, &whole_place, &whole);
    in.cpu_mem = fy_pool_layout_size(regions[4], 8);
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    uint64_t states = 884736 + 2 * extent + 12288;
    assert_int_equal(p.traffic.ssd_read,
                     embed + 884736 + 2 * (2 * masters + extent) + 4096 + 12288);
    assert_int_equal(p.traffic.ssd_write, states);
    assert_int_equal(p.traffic.ssd_read - whole.ssd_read, 2 * masters);
    assert_int_equal(p.store_bytes, 2 * states + 2 * FY_COMMIT_RECORD_BYTES);
    /* f32 weights: the blocks in pieces are copied from their pieces' masters, 8 bytes a parameter,
     * in the forward and the backward */
    assert_int_equal(p.traffic.convert, 2 * 2 * 789760ull * 8);
    /* one slot: the backward and each block's update one after another (AdamW at 1e6 parameters
     * a second binds each: 0.78976 s against 2 x 9498624 / 1e8 + 2 x 9498624 / 2e8); with a GPU
     * slow enough, the bound */
    assert_float_equal(fy_plan_block_updates_s(&in.shape, &p.place, &in.rates), 2 * 0.78976, 1e-12);
    fy_plan_release(&p);
    in.rates.gpu_flops = 1e9;
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    assert_string_equal(p.predicted.bound, "the backward, then each block's update (one gradient "
                                           "slot)");
    assert_float_equal(p.predicted.step_s, p.predicted.gpu_s + 2 * 0.78976, 1e-12);
    char said[768];
    fy_plan_state_describe(&in, &p, said, sizeof said);
    assert_non_null(strstr(said, "optimizer state in pieces (2 units cut in pieces of at most 1.0 "
                                 "MiB, init --state-piece): two state slots of a piece, 1020.0 KiB "
                                 "each, where a unit's whole state, 9.1 MiB, does not fit "
                                 "--cpu-mem"));
    assert_non_null(strstr(said, "; 1 block gradient slot (3 where --cpu-mem has room): each "
                                 "block's backward waits for the update of the block above"));
    fy_plan_release(&p);
    in.rates = rates;
    /* clipping never takes one slot: at that pool, two, and the plan does not fit */
    in.shape.clip = 1;
    in.clip_mode = FY_CLIP_TWO_PASS;
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    assert_int_equal(p.place.state_pieces, 1);
    assert_int_equal(p.place.grad_slots, 2);
    assert_false(p.fits_cpu);
    fy_plan_release(&p);
    /* nothing fits: the least, said not to fit */
    in.shape.clip = 0;
    in.cpu_mem = 4 * MIB;
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    assert_int_equal(p.place.state_pieces, 1);
    assert_int_equal(p.place.grad_slots, 1);
    assert_false(p.fits_cpu);
    fy_plan_release(&p);
    /* --grad-slots 2 asks no more than two, whatever the room; whole units take two at least */
    in.cpu_mem = 1024 * MIB;
    in.grad_slots = 1;
    in.shape.c = &c;
    c.n_layer = 2;
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    assert_int_equal(p.place.state_pieces, 0);
    assert_int_equal(p.place.grad_slots, 2);
    fy_plan_release(&p);
}

/* The GPU, where the backend's memory is modelled (the CUDA backend of a build with it): the
 * working buffers, and two sets more (one per call in flight) with every block's internals
 * swapped; --gpu-mem below that does not fit. */
static void test_gpu_need(void **state)
{
    (void)state;
    struct fy_model_config c = gpt(2, 64);
    struct fy_plan_in in = input(&c);
    struct fy_plan p;
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    assert_false(p.gpu_modelled); /* the CPU backend */
    assert_true(p.fits_gpu);
    fy_plan_release(&p);
    uint64_t working, set;
    if (!fy_backend_gpu_bytes("cuda", &c, 4, 32, &working, &set)) {
        print_message("skipped: this build has no CUDA backend, whose memory the plan models\n");
        skip();
    }
    in.backend = "cuda";
    in.gpu_mem = working;
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    assert_true(p.gpu_modelled);
    assert_int_equal(p.gpu_need, working);
    assert_true(p.fits_gpu);
    fy_plan_release(&p);
    in.act_mode = FY_ACTPLAN_SSD;
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    assert_int_equal(p.gpu_need, working + FY_BACKEND_QUEUE * set);
    assert_false(p.fits_gpu);
    fy_plan_release(&p);
}

/* Several gpu workers (--gpus N), width 64 and two blocks: each GPU computes B / N sequences, so
 * its compute is 1/N of one GPU's at B; each link carries what one GPU at B / N does (the whole
 * weights, its share's activations) and rank 0's every f32 gradient: 4 x (128 + 16384 + 2 x 49984
 * + 18432) = 539648 bytes (the final unit, the tied head's wte, two blocks, the embeddings). On
 * CUDA the ring reduce carries (N - 1) / N of them over each NVLink link; host memory every
 * link's copies, the gradients once (CUDA) or, added in the pool in rank order, 2N - 1 times. */
static void test_ranks(void **state)
{
    (void)state;
    struct fy_model_config c = gpt(2, 64);
    const uint64_t grads = 539648;
    for (int n = 2; n <= 3; n++) {
        struct fy_plan_in in = input(&c), share = input(&c);
        in.rates.nvlink = 1e9;
        in.rates.host_mem = 4e9;
        in.shape.B = 2 * n;
        in.shape.ranks = n;
        share.shape.B = 2; /* one GPU with one rank's sequences */
        struct fy_plan one, many, part;
        struct fy_plan_in whole = in;
        whole.shape.ranks = 1;
        assert_int_equal(fy_plan_make(&whole, NULL, &one), 0);
        assert_int_equal(fy_plan_make(&share, NULL, &part), 0);
        assert_int_equal(fy_plan_make(&in, NULL, &many), 0);
        assert_int_equal(fy_plan_grad_bytes(&in.shape, &many.place), grads);
        assert_int_equal(fy_plan_ranks(&in.shape), n);
        assert_int_equal(fy_plan_rank_batch(&in.shape), 2);
        /* compute per GPU */
        assert_float_equal(many.predicted.gpu_s, one.predicted.gpu_s / n, 1e-15);
        assert_float_equal(many.predicted.gpu_s, part.predicted.gpu_s, 1e-15);
        /* PCIe per link, the pool's summing (the CPU backend): as one GPU at B / N */
        assert_int_equal(many.place.reduce, FY_REDUCE_POOL);
        assert_int_equal(many.traffic.to_gpu, part.traffic.to_gpu);
        assert_int_equal(many.traffic.from_gpu, part.traffic.from_gpu);
        assert_int_equal(many.traffic.nvlink, 0);
        uint64_t copies = part.traffic.to_gpu + part.traffic.from_gpu - grads;
        assert_int_equal(many.traffic.host_mem, n * copies + (2 * n - 1) * grads);
        assert_float_equal(many.predicted.host_mem_s, many.traffic.host_mem / 4e9, 1e-15);
        assert_float_equal(many.predicted.nvlink_s, 0, 0);
        /* one GPU has none of these terms */
        assert_int_equal(one.traffic.nvlink + one.traffic.host_mem, 0);
        assert_float_equal(one.predicted.host_mem_s, 0, 0);
        /* the SSD, the optimizer and the pool's state are the step's, whatever the ranks; the
         * pool gains the ranks' region */
        assert_int_equal(many.traffic.ssd_read, one.traffic.ssd_read);
        assert_int_equal(many.traffic.ssd_write, one.traffic.ssd_write);
        assert_float_equal(many.predicted.opt_s, one.predicted.opt_s, 1e-15);
        assert_int_equal(many.n_regions, one.n_regions + 1);
        assert_string_equal(many.regions[many.n_regions - 1].name, "ranks");
        fy_plan_release(&many);
        /* the CUDA backend: reduced over NVLink, sent by rank 0 alone (its link as before) */
        in.backend = "cuda";
        in.gpu_mem = 0;
        assert_int_equal(fy_plan_make(&in, NULL, &many), 0);
        assert_int_equal(many.place.reduce, FY_REDUCE_NVLINK);
        assert_int_equal(many.traffic.from_gpu, part.traffic.from_gpu);
        assert_int_equal(many.traffic.nvlink, grads * (n - 1) / n);
        assert_int_equal(many.traffic.host_mem, n * copies + grads);
        assert_float_equal(many.predicted.nvlink_s, (double)(grads * (n - 1) / n) / 1e9, 1e-15);
        uint64_t working, set;
        if (fy_backend_gpu_bytes("cuda", &c, 2, 32, &working, &set)) { /* each GPU's B / N */
            assert_true(many.gpu_modelled);
            assert_int_equal(many.gpu_working, working);
            assert_int_equal(many.gpu_set, set);
        }
        fy_plan_release(&many);
        /* a slow NVLink binds the step, and so does slow host memory */
        in.rates.nvlink = 1e3;
        assert_int_equal(fy_plan_make(&in, NULL, &many), 0);
        assert_string_equal(many.predicted.bound, "NVLink");
        assert_float_equal(many.predicted.step_s, many.predicted.nvlink_s, 0);
        fy_plan_release(&many);
        in.rates.nvlink = 1e9;
        in.rates.host_mem = 1e3;
        assert_int_equal(fy_plan_make(&in, NULL, &many), 0);
        assert_string_equal(many.predicted.bound, "host memory");
        fy_plan_release(&many);
        fy_plan_release(&one);
        fy_plan_release(&part);
    }
}

/* What several gpu workers refuse, as usage errors (-FY_EUSAGE): a batch they do not divide,
 * --clip-hold gpu with clipping, swapping the blocks' internals; and --clip-hold auto does not
 * hold on the GPU (it would for one, test_clip_modes), but in the pool. */
static void test_ranks_refused(void **state)
{
    (void)state;
    struct fy_model_config c = gpt(2, 64);
    struct fy_plan_in in = input(&c);
    struct fy_plan p;
    in.shape.ranks = 3;
    assert_int_equal(fy_plan_make(&in, NULL, &p), -FY_EUSAGE); /* 4 sequences over 3 */
    in.shape.B = 6;
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    fy_plan_release(&p);
    in.act_mode = FY_ACTPLAN_HOST;
    assert_int_equal(fy_plan_make(&in, NULL, &p), -FY_EUSAGE);
    in.act_mode = FY_ACTPLAN_SSD;
    assert_int_equal(fy_plan_make(&in, NULL, &p), -FY_EUSAGE);
    in.act_mode = FY_ACTPLAN_AUTO;
    in.shape.clip = 1;
    in.clip_mode = FY_CLIP_ONE_PASS;
    in.clip_hold = FY_CLIP_HOLD_GPU;
    assert_int_equal(fy_plan_make(&in, NULL, &p), -FY_EUSAGE);
    in.clip_mode = FY_CLIP_AUTO;
    assert_int_equal(fy_plan_make(&in, NULL, &p), -FY_EUSAGE);
    /* the pool has room for the streaming regions alone: one GPU would hold them in its memory */
    in.clip_hold = FY_CLIP_HOLD_AUTO;
    in.clip_mode = FY_CLIP_TWO_PASS;
    struct fy_plan two;
    assert_int_equal(fy_plan_make(&in, NULL, &two), 0);
    in.cpu_mem = two.pool_bytes;
    in.clip_mode = FY_CLIP_ONE_PASS;
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    assert_int_equal(p.place.grad_hold, FY_HOLD_POOL);
    fy_plan_release(&p);
    in.clip_mode = FY_CLIP_AUTO;
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    assert_int_not_equal(p.place.grad_hold, FY_HOLD_GPU);
    assert_false(p.one_pass_gpu_short); /* not said to be short of room */
    fy_plan_release(&p);
    in.shape.ranks = 1;
    in.clip_mode = FY_CLIP_ONE_PASS;
    assert_int_equal(fy_plan_make(&in, NULL, &p), 0);
    assert_int_equal(p.place.grad_hold, FY_HOLD_GPU);
    fy_plan_release(&p);
    fy_plan_release(&two);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regions_by_hand),
        cmocka_unit_test(test_streamed_by_hand),
        cmocka_unit_test(test_residency_by_budget),
        cmocka_unit_test(test_grad_slots),
        cmocka_unit_test(test_state_pieces_by_hand),
        cmocka_unit_test(test_activation_step_order),
        cmocka_unit_test(test_gpu_need),
        cmocka_unit_test(test_clip_modes),
        cmocka_unit_test(test_ranks),
        cmocka_unit_test(test_ranks_refused),
        cmocka_unit_test(test_bf16_weights_by_hand),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
