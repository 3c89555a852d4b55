/* Integration tests of the launcher's planning and reporting on the CPU backend: the plan's
 * predictions against values worked out by hand (fy_plan_predict and fuyou-launch plan), the
 * largest batch the SSD holds, the machine profiles of docs/machines, probe then plan, profile,
 * report's charts, the progress line on a terminal, the trace and the metrics' busy times and SSD
 * bytes beside the plan's prediction, the SSD rates carried to the next session, and make
 * bench-pipeline's table. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/base/dtype.h"
#include "common/model/model.h"
#include "launcher/plan/plan.h"
#include "tests/testutil.h"
#include "tests/trainutil.h"

/* The plan's prediction per resource for a fixed model and rates, against values worked out by hand
 * (2 blocks of width 64, vocabulary 256, context and T 32, B 4; block 1 streamed, the rest resident):
 * N = 118528 parameters, 735744 model FLOPs per token; PCIe 1276928 bytes up and 736256 down; the
 * streamed block's 200704-byte sections: 4 read, 3 written. */
static void test_prediction_by_hand(void **state)
{
    (void)state;
    struct fy_model_config c = {.n_layer = 2, .n_head = 2, .n_embd = 64, .vocab = 256, .ctx = 32};
    const unsigned char resident[4] = {1, 0, 1, 1};
    struct fy_plan_rates rates = {.gpu_flops = 1e12, .h2d = 1e9, .d2h = 2e9, .ssd_read = 1e8,
                                  .ssd_write = 2e8, .opt_params = 1e6};
    struct fy_plan_shape f32 = {.c = &c, .B = 4, .T = 32, .act_dtype = FY_DTYPE_F32};
    struct fy_plan_shape clipped = f32, bf16 = f32;
    clipped.clip = 1;
    bf16.act_dtype = FY_DTYPE_BF16;
    struct fy_plan_place place = {.resident = resident}, block_inputs_ssd = place;
    block_inputs_ssd.block_inputs_slots = fy_plan_spill_slots(0);
    struct fy_plan_prediction p;
    fy_plan_predict(&f32, &place, &rates, &p);
    assert_float_equal(p.gpu_s, 9.4175232e-5, 1e-12);
    assert_float_equal(p.h2d_s, 1.276928e-3, 1e-12);
    assert_float_equal(p.d2h_s, 3.68128e-4, 1e-12);
    assert_float_equal(p.ssd_s, 1.103872e-2, 1e-12);
    assert_float_equal(p.opt_s, 0.118528, 1e-12);
    assert_float_equal(p.step_s, 0.118528, 1e-12);
    assert_string_equal(p.bound, "optimizer");
    /* clipping: the blocks' backward and recomputation once more (0.75 of 128 tokens x 2 blocks x
     * 312192 FLOPs), the second pass's PCIe bytes and weights reads, the sums of squares */
    fy_plan_predict(&clipped, &place, &rates, &p);
    assert_float_equal(p.gpu_s, 1.54116096e-4, 1e-12);
    assert_float_equal(p.h2d_s, 1.91488e-3, 1e-12);
    assert_float_equal(p.d2h_s, 6.37696e-4, 1e-12);
    assert_float_equal(p.ssd_s, 1.304576e-2, 1e-12);
    assert_float_equal(p.opt_s, 0.118528 * 8.0 / 7.0, 1e-12);
    /* a slow disk becomes the bound */
    rates.ssd_read = 1e6;
    fy_plan_predict(&f32, &place, &rates, &p);
    assert_float_equal(p.step_s, 0.802816 + 3.01056e-3, 1e-12);
    assert_string_equal(p.bound, "SSD");
    /* checkpoints on the SSD: x_0 and x_1 (32768 bytes each) written once and read once */
    rates.ssd_read = 1e8;
    fy_plan_predict(&f32, &block_inputs_ssd, &rates, &p);
    assert_float_equal(p.ssd_s, 1.202176e-2, 1e-12);
    /* bf16 activations (the CUDA backend's): 16384 bytes each instead of 32768, 8 of them up and 6
     * down per step, and the checkpoints half the size on the SSD */
    fy_plan_predict(&bf16, &place, &rates, &p);
    assert_float_equal(p.h2d_s, 1.145856e-3, 1e-12);
    assert_float_equal(p.d2h_s, 3.18976e-4, 1e-12);
    fy_plan_predict(&bf16, &block_inputs_ssd, &rates, &p);
    assert_float_equal(p.ssd_s, 1.103872e-2 + 3.2768e-4 + 1.6384e-4, 1e-12);
    /* bf16 weights: every unit's go up at 2 bytes instead of 4, 469760 fewer (the embeddings'
     * 18432 parameters, both blocks' 49984 in the forward and the backward, the head's final unit
     * and wte, 128 + 16384); the kept units have copies, and the streamed block 1 is converted by
     * the opt worker for its forward and its backward, 2 x 49984 parameters of 6 bytes at AdamW's
     * host memory rate (1e6 parameters/s x 28 bytes) */
    const unsigned char copies[4] = {FY_PLAN_KEPT_BF16, FY_PLAN_STREAMED, FY_PLAN_KEPT_BF16,
                                     FY_PLAN_KEPT_BF16};
    const struct fy_plan_place with_copies = {.resident = copies};
    struct fy_plan_shape bf16w = f32;
    bf16w.weight_dtype = FY_DTYPE_BF16;
    fy_plan_predict(&bf16w, &with_copies, &rates, &p);
    assert_float_equal(p.h2d_s, 8.07168e-4, 1e-12);
    assert_float_equal(p.d2h_s, 3.68128e-4, 1e-12);
    assert_float_equal(p.ssd_s, 1.103872e-2, 1e-12);
    assert_float_equal(p.convert_s, 2 * 49984 * 6 / 28e6, 1e-12);
    assert_float_equal(p.opt_s, 0.118528 + 2 * 49984 * 6 / 28e6, 1e-12);
    assert_int_equal(fy_plan_weight_copies(&c, copies), 3);
    /* f32 weights: copies or not, the masters go up */
    fy_plan_predict(&f32, &with_copies, &rates, &p);
    assert_float_equal(p.h2d_s, 1.276928e-3, 1e-12);
    assert_float_equal(p.convert_s, 0, 1e-15);
}

/* fuyou-launch plan with a machine profile of round rates prints, without running anything, the
 * predictions worked out by hand for the model above at batch 8, every unit streamed (no
 * --cpu-mem): AdamW 118528 parameters (embeddings 256 x 64 + 32 x 64, two blocks of 12 x 64^2 +
 * 13 x 64, the final LayerNorm's 128) at 1e6/s = 0.118528 s, the bound; the SSD reads each unit's
 * master in the forward and its state (three sections) in the backward and writes the state back,
 * sections 4 KiB-padded to 73728 + 2 x 200704 + 4096 = 479232 bytes: 4 x 479232 / 1e8 +
 * 3 x 479232 / 2e8 = 0.026358 s; the GPU twice test_prediction_by_hand's batch-4 figure; 256
 * tokens / 0.118528 s = 2160 tokens/s. The store is 2.8 MiB, 1 MiB more with the checkpoints on it
 * (their scratch extent's smallest class). A --cpu-mem below the pool's least is said not to fit
 * (exit 2, a usage error), and a profile without a rate is refused naming the key (exit 1). */
/* plan of the 2-layer, 64-wide model at batch 8 x 32 on the CPU backend with the rates of
 * `machine`, every unit streamed and unclipped (--cpu-mem 0 --clip-grad-norm 0) where `streamed`,
 * else with the defaults, and
 * one more option (opt and its value) unless opt is NULL; the launcher's status. */
static int plan_small_at(struct fy_test_fixture *f, const char *machine, int streamed,
                         const char *opt, const char *value)
{
    const char *args[] = {"plan",
                          "--layers",
                          "2",
                          "--heads",
                          "2",
                          "--embd",
                          "64",
                          "--vocab",
                          "256",
                          "--ctx",
                          "32",
                          "--batch",
                          "8",
                          "--seq",
                          "32",
                          "--backend",
                          "cpu",
                          "--machine",
                          machine,
                          streamed ? "--cpu-mem" : opt,
                          streamed ? "0" : value,
                          streamed ? "--clip-grad-norm" : opt,
                          streamed ? "0" : value,
                          opt,
                          value,
                          NULL};
    return fy_test_launch_in(f, args, 60);
}

/* plan_small_at, every unit streamed. */
static int plan_small(struct fy_test_fixture *f, const char *machine, const char *opt,
                      const char *value)
{
    return plan_small_at(f, machine, 1, opt, value);
}

static void test_plan_by_hand(void **state)
{
    struct fy_test_fixture *f = *state;
    char *machine = fy_test_in(f, "machine.json"), *bad = fy_test_in(f, "bad.json");
    FILE *m = fopen(machine, "w");
    assert_non_null(m);
    fputs("{\"gpu_flops\": 1e12, \"h2d\": 1e9, \"d2h\": 2e9, \"ssd_read\": 1e8, "
          "\"ssd_write\": 2e8, \"opt_params\": 1e6}\n", m);
    fclose(m);
    assert_int_equal(plan_small(f, machine, NULL, NULL), 0);
    assert_true(fy_test_file_contains(f->log, "plan: predicted seconds per step: GPU compute "
                                              "0.000188, "));
    assert_true(fy_test_file_contains(f->log, ", SSD 0.026358, optimizer 0.118528; bound: "
                                              "optimizer"));
    assert_true(fy_test_file_contains(f->log, "plan: predicted step 0.118528 s: 2160 tokens/s"));
    assert_true(fy_test_file_contains(f->log, "0 of 4 units (0 B) stay in the shared pool"));
    assert_true(fy_test_file_contains(f->log, "rates: " ));
    assert_true(fy_test_file_contains(f->log, "plan: SSD store 2.8 MiB (2 copies of the state; "));
    /* the checkpoints on the store: 2 x 64 KiB in a scratch extent of the smallest class, 1 MiB */
    assert_int_equal(plan_small(f, machine, "--ckpt-place", "ssd"), 0);
    assert_true(fy_test_file_contains(f->log, "plan: SSD store 3.8 MiB (2 copies of the state and "
                                              "the checkpoints' scratch; "));
    assert_int_equal(plan_small(f, machine, "--cpu-mem", "1M"), 2);
    assert_true(fy_test_file_contains(f->log, "(DOES NOT FIT)"));
    assert_true(fy_test_file_contains(f->log, "train would refuse it"));
    m = fopen(bad, "w");
    assert_non_null(m);
    fputs("{\"gpu_flops\": 1e12, \"h2d\": 1e9, \"d2h\": 2e9, \"ssd_read\": 1e8, "
          "\"opt_params\": 1e6}\n", m);
    fclose(m);
    const char *badargs[] = {"plan", "--batch", "8", "--seq", "32", "--machine", bad, NULL};
    assert_int_equal(fy_test_launch_in(f, badargs, 60), 1);
    assert_true(fy_test_file_contains(f->log, "\"ssd_write\" must be a positive number"));

    /* --act-plan host and ssd as train forces them: every block's internals (f32 on the CPU
     * backend) are qkv 3NC + atty NC + softmax B H T T + resid NC + fc 4NC + gelu 4NC floats,
     * N = 256, C = 64: 917504 bytes a block, 1835008 for two; they cross PCIe once each way
     * (host: to the GPU 0.001541 + 1835008 / 1e9 s, back 0.000466 + 1835008 / 2e9) and, on the
     * SSD, are written and read once more (0.026358 + 1835008 / 1e8 + 1835008 / 2e8 s) through
     * four pool slots of one block's */
    assert_int_equal(plan_small(f, machine, "--act-plan", "host"), 0);
    assert_true(fy_test_file_contains(f->log, "every block's internals swapped, 1.8 MiB in the "
                                              "shared pool from forward to backward, 0 B through"));
    assert_true(fy_test_file_contains(f->log, "PCIe to the GPU 0.003376, from it 0.001384, SSD "
                                              "0.026358"));
    assert_int_equal(plan_small(f, machine, "--act-plan", "ssd"), 0);
    assert_true(fy_test_file_contains(f->log, "through the SSD store (4 pool slots of 896.0 KiB)"));
    assert_true(fy_test_file_contains(f->log, "from it 0.001384, SSD 0.053883, optimizer"));
    assert_true(fy_test_file_contains(f->log, "(every block's internals swapped through the SSD "
                                              "store)"));
    /* --act-ahead N: N + 2 slots of each kind on its way to the store; 5 more than 2 of the
     * internals' (3 x 896 KiB) and the checkpoints' (3 x 64 KiB) take the pool from 22 to 26 MiB
     * (whole MiB); outside 1..6 it is refused */
    for (int i = 0; i < 4; i++) {
        static const char *const ahead[] = {"2", "5", "0", "7"};
        const char *args[] = {
            "plan",   "--layers",   "2",   "--heads",      "2",   "--embd",    "64", "--vocab",
            "256",    "--ctx",      "32",  "--batch",      "8",   "--seq",     "32", "--backend",
            "cpu",    "--act-plan", "ssd", "--ckpt-place", "ssd", "--cpu-mem", "0",  "--act-ahead",
            ahead[i], NULL};
        assert_int_equal(fy_test_launch_in(f, args, 60), i < 2 ? 0 : 2);
        if (i < 2) {
            assert_true(fy_test_file_contains(
                f->log, i ? "(7 pool slots of 896.0 KiB)" : "(4 pool slots of 896.0 KiB)"));
            assert_true(fy_test_file_contains(f->log, i ? "plan: shared pool 26.0 MiB"
                                                        : "plan: shared pool 22.0 MiB"));
        } else {
            assert_true(fy_test_file_contains(
                f->log, fy_test_fmt("--act-ahead %s: give 1 to 6 blocks", ahead[i])));
        }
    }
    /* the other counts, out of their ranges */
    assert_int_equal(plan_small(f, machine, "--prefetch", "9"), 2);
    assert_true(fy_test_file_contains(f->log, "--prefetch 9: give 1 to 8 units"));
    /* --grad-slots: plan takes it as train does (no more block gradients than asked); both refuse
     * it out of its range */
    assert_int_equal(plan_small(f, machine, "--grad-slots", "2"), 0);
    assert_true(fy_test_file_contains(f->log, "plan: 2 block gradient slots (--grad-slots 2): each "
                                              "block's backward waits for the update of the block "
                                              "two up"));
    assert_int_equal(plan_small(f, machine, "--grad-slots", "17"), 2);
    assert_true(fy_test_file_contains(f->log, "--grad-slots 17: give 1 to 16 block gradients"));
    const char *slots[] = {"train",  "--run-dir", fy_test_in(f, "no-run"),
                           "--data", f->data,     "--grad-slots",
                           "0",      NULL};
    assert_int_equal(fy_test_launch_in(f, slots, 60), 2);
    assert_true(fy_test_file_contains(f->log, "--grad-slots 0: give 1 to 16 block gradients"));
    const char *llama[] = {"plan", "--arch", "llama", "--layers", "2", "--heads", "2", "--embd",
                           "64", "--vocab", "256", "--ctx", "32", "--batch", "8", "--seq", "32",
                           "--backend", "cpu", "--act-plan", "ssd", NULL};
    assert_int_equal(fy_test_launch_in(f, llama, 60), 2);
    assert_true(fy_test_file_contains(f->log, "--act-plan ssd: Llama blocks keep their internals "
                                              "on the GPU or recompute them, never swap them"));
}

/* plan --gpus 2 of the model above at batch 8 with the round rates (and an NVLink of 1 GB/s,
 * host memory 4 GB/s): the GPUs' lines say each computes 4 of the 8 sequences, that the weights
 * go to each over its own link with the NVLink broadcast not built, and the step against one
 * GPU's: AdamW binds both at 0.118528 s. The CPU backend sums the gradients in the pool, CUDA's
 * reduces them over NVLink to GPU 0 (539648 bytes, half over each link: 0.000270 s at 1 GB/s).
 * A batch that 2 does not divide, --clip-hold gpu with clipping and --act-plan ssd are refused. */
static void test_plan_gpus(void **state)
{
    struct fy_test_fixture *f = *state;
    char *machine = fy_test_in(f, "machine.json");
    FILE *m = fopen(machine, "w");
    assert_non_null(m);
    fputs("{\"gpu_flops\": 1e12, \"h2d\": 1e9, \"d2h\": 2e9, \"ssd_read\": 1e8, "
          "\"ssd_write\": 2e8, \"opt_params\": 1e6, \"nvlink\": 1e9, \"host_mem\": 4e9}\n", m);
    fclose(m);
    assert_int_equal(plan_small(f, machine, "--gpus", "2"), 0);
    assert_true(fy_test_file_contains(f->log, "plan: GPUs: 2 (--gpus), each computing 4 of the 8 "
                                              "sequences of a step; weights to each GPU over its "
                                              "own PCIe link (a broadcast over NVLink: not built); "
                                              "gradients (527.0 KiB a step) sent by every gpu "
                                              "worker and added into the shared pool in rank "
                                              "order"));
    assert_true(fy_test_file_contains(f->log, "plan: with 2 GPUs: predicted step 0.118528 s, 2160 "
                                              "tokens/s; one GPU at batch 8: 0.118528 s, 2160 "
                                              "tokens/s (1.00x)"));
    assert_true(fy_test_file_contains(f->log, "plan: per step: PCIe (GPU 0's link, the busiest) "));
    const char *cuda[] = {"plan", "--layers", "2", "--heads", "2", "--embd", "64", "--vocab", "256",
                          "--ctx", "32", "--batch", "8", "--seq", "32", "--backend", "cuda",
                          "--machine", machine, "--gpus", "2", NULL};
    assert_int_equal(fy_test_launch_in(f, cuda, 60), 0);
    assert_true(fy_test_file_contains(f->log, "gradients (527.0 KiB a step) reduced over NVLink to "
                                              "GPU 0, 263.5 KiB over each link of the ring, "
                                              "0.000270 s at 1 GB/s, and sent to the shared "
                                              "pool over GPU 0's link alone"));
    assert_true(fy_test_file_contains(f->log, ", NVLink 0.000270, host memory "));
    assert_int_equal(plan_small(f, machine, "--gpus", "3"), 2);
    assert_true(fy_test_file_contains(f->log, "--gpus 3: the batch of 8 sequences does not split "
                                              "evenly over 3 GPUs"));
    const char *swap[] = {"plan", "--layers", "2", "--heads", "2", "--embd", "64", "--vocab", "256",
                          "--ctx", "32", "--batch", "8", "--seq", "32", "--backend", "cpu",
                          "--gpus", "2", "--act-plan", "ssd", NULL};
    assert_int_equal(fy_test_launch_in(f, swap, 60), 2);
    assert_true(fy_test_file_contains(f->log, "--act-plan ssd with --gpus 2: swapping the blocks' "
                                              "internals is not supported with several GPUs yet"));
    const char *hold[] = {"plan", "--layers", "2", "--heads", "2", "--embd", "64", "--vocab", "256",
                          "--ctx", "32", "--batch", "8", "--seq", "32", "--backend", "cpu",
                          "--gpus", "2", "--clip-grad-norm", "1", "--clip-hold", "gpu", NULL};
    assert_int_equal(fy_test_launch_in(f, hold, 60), 2);
    assert_true(fy_test_file_contains(f->log, "--clip-hold gpu with --gpus 2: gradients held on "
                                              "the GPUs are not summed across them"));
}

/* plan's largest batch counts the SSD's free space: with every block's internals swapped to the
 * store (68 MiB a sample for two 512-wide blocks at T 1024, f32 on the CPU backend, in a scratch
 * extent at most 1/8 larger), the store's filesystem binds long before the search's cap of 65536,
 * and the batch printed is planned as fitting while two more are not (the SSD store's line says
 * so). */
static int plan_wide(struct fy_test_fixture *f, const char *ssd, const char *batch)
{
    const char *args[] = {"plan", "--layers", "2",   "--heads",   "2",    "--embd",
                          "512",  "--vocab",  "256", "--ctx",     "1024", "--seq",
                          "1024", "--batch",  batch, "--backend", "cpu",  "--act-plan",
                          "ssd",  "--ssd",    ssd,   "--cpu-mem", "0",    NULL};
    return fy_test_launch_in(f, args, 60);
}

/* The bytes after `key` in the last log ("18.9 MiB", "740.0 KiB"): fails the test without it. */
static double logged_bytes(const char *log, const char *key)
{
    char *text = fy_test_slurp(log, NULL);
    assert_non_null(text);
    char *at = strstr(text, key);
    if (at == NULL)
        fail_msg("%s: no \"%s\"", log, key);
    char *end;
    double v = strtod(at + strlen(key), &end);
    double unit = strncmp(end, " GiB", 4) == 0 ? 1024.0 * 1024 * 1024
                  : strncmp(end, " MiB", 4) == 0 ? 1024.0 * 1024
                  : strncmp(end, " KiB", 4) == 0 ? 1024.0
                  : strncmp(end, " B", 2) == 0   ? 1.0
                                                  : -1.0;
    assert_true(unit > 0);
    free(text);
    return v * unit;
}

/* plan --optim-state: the state (and the store, two copies of it) of the same model takes about
 * 8/12 of fp32's bytes in bf16 and 6/12 in int8 (width 256: every matrix and embedding 8-bit,
 * the norms' and biases' f32 moments a small share); plan --run-dir takes the run's format, and
 * --optim-state beside it says what train would need in another. */
static void test_plan_optim_state_bytes(void **state)
{
    struct fy_test_fixture *f = *state;
    const char *formats[] = {"fp32", "bf16", "int8"};
    double st[3], ssd[3];
    for (int i = 0; i < 3; i++) {
        const char *args[] = {"plan", "--layers", "2", "--heads", "2", "--embd", "256", "--vocab",
                              "256", "--ctx", "32", "--batch", "8", "--seq", "32", "--backend",
                              "cpu", "--optim-state", formats[i], NULL};
        assert_int_equal(fy_test_launch_in(f, args, 60), 0);
        st[i] = logged_bytes(f->log, "plan: optimizer state ");
        ssd[i] = logged_bytes(f->log, "plan: SSD store ");
        printf("plan: %s: state %.0f bytes, store %.0f bytes\n", formats[i], st[i], ssd[i]);
    }
    assert_true(st[1] / st[0] > 0.64 && st[1] / st[0] < 0.69);
    assert_true(st[2] / st[0] > 0.49 && st[2] / st[0] < 0.53);
    assert_true(ssd[1] < ssd[0] && ssd[2] < ssd[1]);
    /* a run's format, and another beside it */
    char *run = fy_test_in(f, "int8");
    const char *init[] = {"init", "--run-dir", run, "--layers", "2", "--heads", "2", "--embd",
                          "256", "--vocab", "256", "--ctx", "32", "--optim-state", "int8", NULL};
    assert_int_equal(fy_test_launch_in(f, init, 60), 0);
    const char *plan[] = {"plan", "--run-dir", run, "--batch", "8", "--seq", "32", "--backend",
                          "cpu", NULL, NULL, NULL};
    assert_int_equal(fy_test_launch_in(f, plan, 60), 0);
    assert_true(logged_bytes(f->log, "plan: optimizer state ") == st[2]);
    plan[9] = "--optim-state";
    plan[10] = "fp32";
    assert_int_equal(fy_test_launch_in(f, plan, 60), 0);
    assert_true(logged_bytes(f->log, "plan: optimizer state ") == st[0]);
}

/* With the state in pieces the least pool has one block gradient slot, which only an unclipped
 * step can use (clipping needs two): where --cpu-mem holds that pool and not the clipped one, the
 * refusal says that --clip-grad-norm 0 would fit and the least pool it needs (68 MiB here against
 * 80: a block of 512 is 3.1 M parameters, its f32 gradient slot 12 MiB). */
static void test_plan_unclipped_floor_said(void **state)
{
    struct fy_test_fixture *f = *state;
    const char *said = "plan: unclipped (--clip-grad-norm 0) the shared pool needs 68.0 MiB at "
                       "least, which --cpu-mem 70.0 MiB holds (clipping needs 80.0 MiB";
    const char *mems[3] = {"60M", "70M", "80M"};
    for (int i = 0; i < 3; i++) {
        const char *args[] = {"plan",  "--layers",  "2",   "--heads",       "8",  "--embd",
                              "512",   "--ctx",     "32",  "--batch",       "8",  "--seq",
                              "32",    "--backend", "cpu", "--state-piece", "1M", "--cpu-mem",
                              mems[i], NULL};
        int rc = fy_test_launch_in(f, args, 60);
        assert_true(i == 2 ? rc == 0 : rc != 0);
        assert_int_equal(fy_test_file_contains(f->log, "plan: unclipped (--clip-grad-norm 0)"),
                         i == 1);
        if (i == 1)
            assert_true(fy_test_file_contains(f->log, said));
    }
    const char *unclipped[] = {"plan", "--layers",  "2",   "--heads",
                               "8",    "--embd",    "512", "--ctx",
                               "32",   "--batch",   "8",   "--seq",
                               "32",   "--backend", "cpu", "--state-piece",
                               "1M",   "--cpu-mem", "70M", "--clip-grad-norm",
                               "0",    NULL};
    assert_int_equal(fy_test_launch_in(f, unclipped, 60), 0);
}

static void test_plan_largest_batch_fits_ssd(void **state)
{
    struct fy_test_fixture *f = *state;
    char *ssd = fy_test_in(f, "ssd");
    assert_int_equal(mkdir(ssd, 0755), 0);
    struct statvfs st;
    assert_int_equal(statvfs(ssd, &st), 0);
    uint64_t free_bytes = (uint64_t)st.f_bavail * st.f_frsize;
    if (free_bytes < (1ull << 30) || free_bytes > (4ull << 40)) {
        print_message("skipped: %s has %llu bytes free, outside the 1 GiB to 4 TiB this test "
                      "plans for\n", ssd, (unsigned long long)free_bytes);
        skip();
    }
    assert_int_equal(plan_wide(f, ssd, "1"), 0);
    char *log = fy_test_slurp(f->log, NULL);
    const char *at = strstr(log, "plan: largest batch that fits: ");
    assert_non_null(at);
    int largest = atoi(at + strlen("plan: largest batch that fits: "));
    free(log);
    assert_true(fy_test_file_contains(f->log, "(at 1024 tokens; the GPU, --cpu-mem and the SSD's "
                                              "free space)"));
    /* 68 MiB a sample, in a scratch extent up to 9/8 of that: the free space over it, within the
     * state's and the records' share */
    uint64_t per_sample = 68ull << 20;
    assert_true(largest > 1 && (uint64_t)largest <= free_bytes / per_sample);
    assert_true((uint64_t)largest + 8 >= free_bytes / (per_sample * 9 / 8));
    assert_int_equal(plan_wide(f, ssd, fy_test_fmt("%d", largest)), 0);
    assert_false(fy_test_file_contains(f->log, "DOES NOT FIT"));
    assert_int_equal(plan_wide(f, ssd, fy_test_fmt("%d", largest + 2)), 2);
    assert_true(fy_test_file_contains(f->log, "swapped internals' scratch) on 1 path with "));
    assert_true(fy_test_file_contains(f->log, "free (DOES NOT FIT)"));
}

/* The machine profiles of docs/machines (the Fuyou paper's testbed, docs/benchmarks.md, "At the
 * paper's scale, by the cost model") load, and plan predicts from them what that section's table
 * says: GPT-3 13B (40 x 5120, vocabulary 50304, T 1024) at the table's batch 40 under --gpu-mem 24G
 * and --cpu-mem 720G, every unit's state in the pool, for each --optim-state. Worked out by hand
 * from the profiles' rates: N = 50304 x 5120 + 2048 x 5120 + 40 x (12 x 5120^2 + 13 x 5120) +
 * 2 x 5120 = 12853626880 parameters; a token 6 N + 6 x 40 x 1024 x 5120 FLOPs, 40960 tokens, on
 * the GPU at gpu_flops; AdamW N / opt_params (fp32), N / opt_params_bf16, N / opt_params_int8.
 * Where the GPU is modelled (the CUDA backend built) batch 76 is the largest that fits 24 GiB. */
static int plan_paper(struct fy_test_fixture *f, const char *machine, const char *format,
                      const char *gpu_mem, int wide, const char *batch)
{
    const char *args[] = {"plan",
                          "--machine",
                          machine,
                          "--layers",
                          wide ? "96" : "40",
                          "--heads",
                          wide ? "96" : "40",
                          "--embd",
                          wide ? "12288" : "5120",
                          "--vocab",
                          "50304",
                          "--ctx",
                          "2048",
                          "--seq",
                          "1024",
                          "--batch",
                          batch,
                          "--gpu-mem",
                          gpu_mem,
                          "--cpu-mem",
                          "720G",
                          "--backend",
                          "cuda",
                          "--optim-state",
                          format,
                          "--clip-grad-norm",
                          "0",
                          NULL};
    return fy_test_launch_in(f, args, 60);
}

/* The seconds plan's log gives `resource` in its line of predicted seconds (-1: none). */
static double predicted_seconds(const char *log, const char *resource)
{
    char *text = fy_test_slurp(log, NULL);
    const char *line = text ? strstr(text, "plan: predicted seconds per step: ") : NULL;
    const char *at = line ? strstr(line, resource) : NULL;
    double s = at ? atof(at + strlen(resource)) : -1;
    free(text);
    return s;
}

static void test_paper_machine_profiles(void **state)
{
    struct fy_test_fixture *f = *state;
    static const char *const machines[] = {"docs/machines/fuyou-paper-4090.json",
                                           "docs/machines/fuyou-paper-a100.json",
                                           "docs/machines/fuyou-paper-4090-gpu156.json"};
    static const char *const formats[] = {"fp32", "bf16", "int8"};
    static const char *const opt_keys[] = {"\"opt_params\":", "\"opt_params_bf16\":",
                                           "\"opt_params_int8\":"};
    const double N = 50304.0 * 5120 + 2048.0 * 5120 + 40 * (12.0 * 5120 * 5120 + 13 * 5120) +
                     2 * 5120;
    const double step_flops = 40960 * (6 * N + 6.0 * 40 * 1024 * 5120);
    for (int m = 0; m < 3; m++) {
        char *profile = fy_test_slurp(machines[m], NULL);
        if (profile == NULL)
            fail_msg("%s cannot be read: run the tests from the source tree's root", machines[m]);
        double gpu_flops = atof(strstr(profile, "\"gpu_flops\":") + strlen("\"gpu_flops\":"));
        for (int i = 0; i < 3; i++) {
            const char *key = strstr(profile, opt_keys[i]);
            assert_non_null(key);
            double opt = atof(key + strlen(opt_keys[i]));
            assert_int_equal(plan_paper(f, machines[m], formats[i], m == 1 ? "80G" : "24G", 0,
                                        "40"), 0);
            assert_true(fy_test_file_contains(f->log, fy_test_fmt("rates: %s", machines[m])));
            assert_true(fy_test_file_contains(f->log, "42 of 42 units"));
            assert_true(fy_test_file_contains(f->log, "; bound: GPU compute"));
            assert_float_equal(predicted_seconds(f->log, "GPU compute "), step_flops / gpu_flops,
                               1e-5 * step_flops / gpu_flops);
            assert_float_equal(predicted_seconds(f->log, "optimizer "), N / opt, 1e-5 * N / opt);
            if (m != 1 && fy_test_file_contains(f->log, "plan: GPU: working buffers "))
                assert_true(fy_test_file_contains(f->log, "plan: largest batch that fits: 76 "));
        }
        free(profile);
    }
    /* 175B on the A100 (table's batch 45): its state, 1.9 TiB fp32, mostly streams from the SSD
     * store, and the plan fits and names a bound */
    assert_int_equal(plan_paper(f, machines[1], "fp32", "80G", 1, "45"), 0);
    assert_true(fy_test_file_contains(f->log, "plan: optimizer state 1.9 TiB: "));
    assert_true(fy_test_file_contains(f->log, "plan: SSD store 3.8 TiB (2 copies"));
    assert_true(predicted_seconds(f->log, "SSD ") > 1);
}

/* Entries of a directory other than . and .. (-1: cannot be read). */
static int entries_in(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

/* Files in probe's scratch directory (DIR/.fuyou-probe-PID) under dir, or -1 where there is none. */
static int probe_scratch_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return -1;
    int n = -1;
    for (struct dirent *e; n < 0 && (e = readdir(d)) != NULL;)
        if (strncmp(e->d_name, ".fuyou-probe-", 13) == 0)
            n = entries_in(fy_test_fmt("%s/%s", dir, e->d_name));
    closedir(d);
    return n;
}

/* probe stopped by SIGINT while it measures the SSD: exit status 130, one line that says so, its
 * scratch directory and files under --ssd removed, no profile written and the directory made for
 * --out removed. */
static void test_probe_stopped_by_signal(void **state)
{
    struct fy_test_fixture *f = *state;
    char *ssd = fy_test_in(f, "probe-stop-ssd"), *made = fy_test_in(f, "probe-stop-out");
    assert_int_equal(mkdir(ssd, 0700), 0);
    const char *out = fy_test_fmt("%s/m.json", made);
    const char *args[] = {"probe", "--ssd", ssd, "--out", out, "--backend", "cpu", NULL};
    unlink(f->log);
    int pid = fy_test_start("fuyou-launch", args, f->log);
    assert_true(pid > 0);
    double t0 = fy_test_now_s();
    while (probe_scratch_files(ssd) <= 0 && fy_test_now_s() - t0 < 60)
        fy_test_pause_ms(2);
    /* the SSD's part began: its scratch store is there */
    assert_true(probe_scratch_files(ssd) > 0);
    assert_int_equal(kill(pid, SIGINT), 0);
    int status = fy_test_wait(pid, 120);
    assert_true(status != -1 && WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 130);
    assert_int_equal(fy_test_count_matches(f->log, "stopped by signal before probe was done: "), 1);
    assert_int_equal(entries_in(ssd), 0);
    assert_int_equal(entries_in(made), -1);
}

/* A report stopped by Ctrl-C or SIGTERM: exit 130, said once; the data and script it wrote are
 * removed, as is the --out directory it made, or the charts already there stay as they were. A
 * metrics file of a million steps gives the stop its time: SIGINT while its data is written,
 * SIGTERM (the launcher's alone) while gnuplot draws, which the launcher ends. */
static void report_stopped_with(struct fy_test_fixture *f, const char *run, const char *out,
                                int sig, const char *wait_for)
{
    const char *args[] = {"report", "--run-dir", run, "--out", out, NULL};
    unlink(f->log);
    int pid = fy_test_start("fuyou-launch", args, f->log);
    assert_true(pid > 0);
    double t0 = fy_test_now_s();
    while (access(fy_test_fmt("%s/%s", out, wait_for), F_OK) != 0 && fy_test_now_s() - t0 < 60)
        fy_test_pause_ms(1);
    assert_int_equal(access(fy_test_fmt("%s/%s", out, wait_for), F_OK), 0);
    assert_int_equal(kill(pid, sig), 0);
    int status = fy_test_wait(pid, 120);
    assert_true(status != -1 && WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 130);
    assert_int_equal(
        fy_test_count_matches(f->log, fy_test_fmt("stopped by signal before report was done: the "
                                                  "charts in %s are as they were",
                                                  out)),
        1);
    assert_int_equal(fy_test_count_processes("charts.gnuplot"), 0);
}

static void test_report_stopped_by_signal(void **state)
{
    struct fy_test_fixture *f = *state;
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        printf("test_report_stopped_by_signal: skipped: gnuplot is not installed\n");
        skip();
    }
    char *run = fy_test_in(f, "long-run"), *made = fy_test_in(f, "report-made");
    assert_int_equal(mkdir(run, 0700), 0);
    FILE *m = fopen(fy_test_fmt("%s/metrics.jsonl", run), "w");
    assert_non_null(m);
    for (int i = 1; i <= 1000000; i++)
        fprintf(m, "{\"step\": %d, \"loss\": %.4f, \"step_s\": 0.5}\n", i, 10.0 / (1 + i * 1e-4));
    assert_int_equal(fclose(m), 0);
    /* --out in directories to be made: removed again */
    const char *out = fy_test_fmt("%s/deeper", made);
    char out_copy[700];
    snprintf(out_copy, sizeof out_copy, "%s", out);
    report_stopped_with(f, run, out_copy, SIGINT, "metrics.dat");
    assert_int_equal(access(made, F_OK), -1);
    /* into a directory with charts: they stay, byte for byte; nothing of the stopped run is left */
    char *charts = fy_test_in(f, "report-charts");
    assert_int_equal(mkdir(charts, 0700), 0);
    FILE *old = fopen(fy_test_fmt("%s/loss.png", charts), "w");
    assert_non_null(old);
    fputs("the chart before", old);
    assert_int_equal(fclose(old), 0);
    report_stopped_with(f, run, charts, SIGTERM, "charts.gnuplot");
    char *kept = fy_test_slurp(fy_test_fmt("%s/loss.png", charts), NULL);
    assert_non_null(kept);
    assert_string_equal(kept, "the chart before");
    free(kept);
    static const char *const gone[] = {"metrics.dat",  "charts.gnuplot",     "loss.png.tmp",
                                       "busy.png.tmp", "throughput.png.tmp", "busy.png"};
    for (size_t i = 0; i < sizeof gone / sizeof gone[0]; i++)
        assert_int_equal(access(fy_test_fmt("%s/%s", charts, gone[i]), F_OK), -1);
}

/* fuyou-launch probe measures this machine (here the CPU backend: the GPU parts are said to be
 * skipped) into RUN/machine.json, six positive rates that plan then predicts from. */
static void test_probe_then_plan(void **state)
{
    struct fy_test_fixture *f = *state;
    char *run = fy_test_in(f, "probed");
    fy_trainutil_init_model(f, run, "64", "5");
    const char *probe[] = {"probe", "--run-dir", run, "--backend", "cpu", NULL};
    assert_int_equal(fy_test_launch_in(f, probe, 120), 0);
    assert_true(fy_test_file_contains(f->log, "the GPU parts (PCIe, GEMM rate) are skipped"));
    assert_true(fy_test_file_contains(f->log, "probe: took "));
    assert_true(fy_test_file_contains(f->log, "AdamW G parameters/s by threads, 8-bit moments: 1: "));
    char *profile = fy_test_slurp(fy_test_fmt("%s/machine.json", run), NULL);
    assert_non_null(profile);
    static const char *const keys[] = {"\"gpu_flops\":", "\"h2d\":", "\"d2h\":",
                                       "\"ssd_read\":", "\"ssd_write\":", "\"opt_params\":",
                                       "\"opt_params_bf16\":", "\"opt_params_int8\":"};
    for (int i = 0; i < 8; i++) {
        char *at = strstr(profile, keys[i]);
        assert_non_null(at);
        assert_true(atof(at + strlen(keys[i])) > 0);
    }
    /* where and when, for plan's --gpu-mem default; no GPU figures on the CPU backend */
    assert_non_null(strstr(profile, "\"host\":"));
    const char *when = strstr(profile, "\"probed_at\":");
    assert_non_null(when);
    assert_non_null(strstr(when, "Z\""));
    assert_null(strstr(profile, "\"gpu_free\""));
    free(profile);
    assert_int_equal(fy_test_count_matches(f->log, ".fuyou-probe"), 0);
    const char *plan[] = {"plan", "--run-dir", run, "--batch", "8", "--seq", "32", "--backend",
                          "cpu", NULL};
    assert_int_equal(fy_test_launch_in(f, plan, 60), 0);
    assert_true(fy_test_file_contains(f->log, fy_test_fmt("rates: %s/machine.json", run)));
    assert_true(fy_test_file_contains(f->log, "plan: predicted step "));

    /* two SSD paths: each measured alone, then together; host memory by one thread and by all.
     * The run's store, as model.conf records it (init --ssd), is what probe --run-dir measures */
    char *a = fy_test_in(f, "ssd-a"), *b = fy_test_in(f, "ssd-b"), *out = fy_test_in(f, "m.json");
    char *striped = fy_test_in(f, "striped");
    assert_int_equal(mkdir(a, 0700), 0);
    assert_int_equal(mkdir(b, 0700), 0);
    const char *init_two[] = {"init", "--run-dir", striped, "--layers", "2", "--heads", "2",
                              "--embd", "64", "--ctx", "32", "--ssd", fy_test_fmt("%s,%s", a, b),
                              NULL};
    assert_int_equal(fy_test_launch_in(f, init_two, 60), 0);
    int in_a = entries_in(a), in_b = entries_in(b); /* the run's store */
    const char *two[] = {"probe", "--run-dir", striped, "--out", out, "--backend", "cpu", NULL};
    assert_int_equal(fy_test_launch_in(f, two, 120), 0);
    assert_true(fy_test_file_contains(f->log, fy_test_fmt("probe: SSD path %s alone: read ", a)));
    assert_true(fy_test_file_contains(f->log, fy_test_fmt("probe: SSD path %s alone: read ", b)));
    assert_true(fy_test_file_contains(f->log, "probe: SSD store on 2 paths: read "));
    profile = fy_test_slurp(out, NULL);
    assert_non_null(profile);
    const char *at = profile;
    for (int i = 0; i < 2; i++) {
        at = strstr(at, "\"read\":");
        assert_non_null(at);
        assert_true(atof(at + strlen("\"read\":")) > 0);
        at = strstr(at, "\"write\":");
        assert_non_null(at);
        assert_true(atof(at + strlen("\"write\":")) > 0);
    }
    at = strstr(profile, "\"memcpy_all_threads\":");
    assert_non_null(at);
    assert_true(atof(at + strlen("\"memcpy_all_threads\":")) > 0);
    free(profile);
    assert_int_equal(entries_in(a), in_a); /* the scratch stores are gone, the run's store stays */
    assert_int_equal(entries_in(b), in_b);
}

/* The last line of the log that holds `key`, into out. */
static void line_of(const char *log, const char *key, char *out, size_t len)
{
    char *text = fy_test_slurp(log, NULL), *at = NULL;
    assert_non_null(text);
    for (char *p = text; (p = strstr(p, key)) != NULL; p++)
        at = p;
    assert_non_null(at);
    while (at > text && at[-1] != '\n')
        at--;
    snprintf(out, len, "%.*s", (int)strcspn(at, "\n"), at);
    free(text);
}

/* The shared pool a training session lays out is the one plan prints, its size and its regions:
 * every unit streamed with f32 weights (weights slot 0 the embeddings' 73728-byte master, the two
 * others a block's 200704), with bf16 weights (the embeddings' 36864 bytes and two of a block's
 * 99968 bf16 bytes, padded to 102400, and the landing ring, four chunks of a quarter of the master
 * section, 53248 bytes), and kept with bf16 copies (no ring); the state in pieces of 16 KiB
 * (init --state-piece, the test hook FUYOU_TEST_STATE_PIECES): the state slots two pieces' (a
 * piece of a block at most 12288 x 4 bytes), with one gradient slot (the embeddings' 73728 bytes
 * and a block's 200704), f32 weights put together through the landing ring (a quarter of a
 * block's masters, their pieces' sections padded); the blocks recomputed (plan plans --act-plan
 * auto so). */
static void test_plan_pool_is_train_pool(void **state)
{
    struct fy_test_fixture *f = *state;
    static const char *const cases[][6] = {
        {"pool-f32", "f32", NULL, NULL, NULL, "weights 464.0 KiB, grads 660.0 KiB, state 1.1 MiB"},
        {"pool-bf16", "bf16", NULL, NULL, NULL, "weights 236.0 KiB, landing 208.0 KiB, grads"},
        {"pool-kept", "bf16", "1G", NULL, NULL, "weights 236.0 KiB, grads"},
        {"pool-pieces", "f32", NULL, "16K", "3",
         "landing 224.0 KiB, grads 660.0 KiB, state 96.0 "
         "KiB"},
        {"pool-pieces-1", "bf16", NULL, "16K", "1", "grads 268.0 KiB, state 96.0 KiB"}};
    for (int i = 0; i < 5; i++) {
        char *run = fy_test_in(f, cases[i][0]);
        const char *init[] = {"init",      "--run-dir",
                              run,         "--layers",
                              "2",         "--heads",
                              "2",         "--embd",
                              "64",        "--ctx",
                              "32",        "--seed",
                              "5",         cases[i][3] ? "--state-piece" : NULL,
                              cases[i][3], NULL};
        assert_int_equal(fy_test_launch_in(f, init, 60), 0);
        if (cases[i][3] != NULL)
            assert_int_equal(setenv("FUYOU_TEST_STATE_PIECES", "1", 1), 0);
        const char *opts[] = {"--weights-dtype",
                              cases[i][1],
                              "--act-plan",
                              "recompute",
                              "--grad-slots",
                              cases[i][4] ? cases[i][4] : "16",
                              "--cpu-mem",
                              cases[i][2] ? cases[i][2] : "0",
                              "--clip-grad-norm",
                              "0",
                              NULL};
        assert_int_equal(fy_trainutil_train_with(f, run, f->data, "1", NULL, 0, opts), 0);
        char trained[512], sized[512], regions[1024], want[128];
        line_of(f->log, "shared pool /", trained, sizeof trained); /* the training session's */
        const char *plan[] = {"plan",
                              "--run-dir",
                              run,
                              "--batch",
                              "8",
                              "--seq",
                              "32",
                              "--backend",
                              "cpu",
                              "--weights-dtype",
                              cases[i][1],
                              "--act-plan",
                              "recompute",
                              "--grad-slots",
                              cases[i][4] ? cases[i][4] : "16",
                              "--cpu-mem",
                              cases[i][2] ? cases[i][2] : "0",
                              "--clip-grad-norm",
                              "0",
                              NULL};
        assert_int_equal(fy_test_launch_in(f, plan, 60), 0);
        unsetenv("FUYOU_TEST_STATE_PIECES");
        line_of(f->log, "plan: shared pool regions: ", regions, sizeof regions);
        print_message("%s: %s\n", cases[i][0], regions);
        assert_non_null(strstr(regions, cases[i][5]));
        int n = 1;
        for (const char *p = regions; (p = strstr(p, ", ")) != NULL; p++)
            n++;
        /* "plan: shared pool SIZE UNIT (no --cpu-mem ..." or "... SIZE UNIT of --cpu-mem ..." */
        line_of(f->log, cases[i][2] ? " of --cpu-mem " : " (no --cpu-mem", sized, sizeof sized);
        const char *size = sized + strlen("plan: shared pool ");
        int len = (int)strcspn(size, " ");
        len += 1 + (int)strcspn(size + len + 1, " ");
        snprintf(want, sizeof want, ": %.*s in %d regions", len, size, n);
        print_message("%s: train's %s; plan's %s\n", cases[i][0], trained, want);
        assert_non_null(strstr(trained, want));
    }
}

/* Progress for people: on a terminal (here script(1)'s pseudo-terminal) one status line with the
 * step, loss, tokens/s, TFLOP/s, GPU busy and ETA, redrawn in place, while the full step lines go
 * to RUN/fuyou.log; elsewhere the full step lines; a summary at the end either way. */
static void test_progress_line(void **state)
{
    struct fy_test_fixture *f = *state;
    if (system("command -v script >/dev/null 2>&1") != 0) {
        printf("test_progress_line: skipped: no script(1) to give the run a terminal\n");
        skip();
    }
    char *run = fy_test_in(f, "progress"), *tty = fy_test_in(f, "tty.out");
    fy_trainutil_init_model(f, run, "64", "5");
    assert_int_equal(fy_trainutil_train(f, run, f->data, "3", NULL, 0, "--eval-every", "1000"), 0);
    assert_true(fy_test_file_contains(f->log, "info: step 3/3 | loss"));
    assert_true(fy_test_file_contains(f->log, "summary: steps 1 to 3 (3 trained)"));
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "script -qec '%s train --run-dir %s --data %s --steps 6 --batch 8 --seq 32 --backend "
             "cpu --eval-every 1000' /dev/null > %s 2>&1",
             fy_test_bin("fuyou-launch"), run, f->data, tty);
    assert_int_equal(system(cmd), 0);
    assert_true(fy_test_file_contains(tty, "\r\033[Kstep 6/6 | loss "));
    assert_true(fy_test_file_contains(tty, "| GPU busy "));
    assert_true(fy_test_file_contains(tty, "| ETA "));
    assert_true(fy_test_file_contains(tty, "summary: steps 4 to 6 (3 trained)"));
    assert_int_equal(fy_test_count_matches(tty, "info: step 5/6"), 0); /* not on the terminal */
    assert_true(fy_test_file_contains(fy_test_fmt("%s/fuyou.log", run), "info: step 5/6 | loss"));
}

/* A PNG file's width and height from its signature and IHDR chunk; 0 when it is not one. */
static int png_size(const char *path, unsigned *w, unsigned *h)
{
    size_t n;
    unsigned char *b = (unsigned char *)fy_test_slurp(path, &n);
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    int ok = b != NULL && n > 1000 && memcmp(b, sig, 8) == 0 && memcmp(b + 12, "IHDR", 4) == 0;
    if (ok) {
        *w = (unsigned)b[16] << 24 | (unsigned)b[17] << 16 | (unsigned)b[18] << 8 | b[19];
        *h = (unsigned)b[20] << 24 | (unsigned)b[21] << 16 | (unsigned)b[22] << 8 | b[23];
    }
    free(b);
    return ok;
}

/* fuyou-launch report draws a run's metrics into three PNG charts (valid images of the size asked
 * for), and says what is wrong where a run has no metrics. */
static void test_report_charts(void **state)
{
    struct fy_test_fixture *f = *state;
    if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        printf("test_report_charts: skipped: gnuplot is not installed (Debian: gnuplot-nox)\n");
        skip();
    }
    char *run = fy_test_in(f, "charted");
    fy_trainutil_init_model(f, run, "64", "5");
    const char *empty[] = {"report", "--run-dir", run, NULL};
    assert_int_equal(fy_test_launch_in(f, empty, 60), 1);
    assert_true(fy_test_file_contains(f->log, "metrics.jsonl (a run's metrics: train writes "
                                              "them)"));
    assert_int_equal(fy_trainutil_train(f, run, f->data, "6", NULL, 0, "--eval-every", "2"), 0);
    assert_int_equal(fy_test_launch_in(f, empty, 60), 0);
    assert_true(fy_test_file_contains(f->log, "report: 6 steps drawn"));
    static const char *const charts[] = {"loss", "busy", "throughput"};
    for (int i = 0; i < 3; i++) {
        unsigned w = 0, h = 0;
        assert_true(png_size(fy_test_fmt("%s/report/%s.png", run, charts[i]), &w, &h));
        assert_int_equal(w, 1000);
        assert_int_equal(h, 600);
        assert_int_not_equal(access(fy_test_fmt("%s/report/%s.png.tmp", run, charts[i]), F_OK),
                             0);
    }
    /* --compare: a run without metrics is said by its path; the run itself beside itself draws */
    char *none = fy_test_in(f, "never-trained");
    const char *missing[] = {"report", "--run-dir", run, "--compare", none, NULL};
    assert_int_equal(fy_test_launch_in(f, missing, 60), 1);
    assert_true(fy_test_file_contains(f->log, fy_test_fmt("cannot open %s/metrics.jsonl", none)));
    const char *twice[] = {"report", "--run-dir", run, "--compare", run, NULL};
    assert_int_equal(fy_test_launch_in(f, twice, 60), 0);
    assert_true(fy_test_file_contains(f->log, "(2 runs in all)"));
    assert_true(fy_test_file_contains(fy_test_fmt("%s/report/charts.gnuplot", run),
                                      "title 'charted held-out'"));
}

/* fuyou-launch profile measures a block at the batch given and prints the plan train's auto would
 * take, writing it to RUN/act_plan.json, without training; a sequence beyond the context is
 * refused. A profile that fails (a test hook) is said and train goes on without one. */
static void test_profile_command(void **state)
{
    struct fy_test_fixture *f = *state;
    char *run = fy_test_in(f, "profiled"), path[740];
    fy_trainutil_init_model(f, run, "64", "5");
    const char *args[] = {"profile", "--run-dir", run, "--batch", "8", "--seq", "32",
                          "--backend", "cpu", NULL};
    assert_int_equal(fy_test_launch_in(f, args, 120), 0);
    assert_true(fy_test_file_contains(f->log, "profile (CPU backend, batch 8 x 32)"));
    assert_true(fy_test_file_contains(f->log, "GB/s written"));
    assert_true(fy_test_file_contains(f->log, "from the measured block profile"));
    snprintf(path, sizeof path, "%s/act_plan.json", run);
    char *json = fy_test_slurp(path, NULL);
    assert_non_null(json);
    assert_non_null(strstr(json, "\"batch\": 8, \"seq\": 32"));
    assert_non_null(strstr(json, "\"block_profile\": {\"fwd_s\": "));
    assert_non_null(strstr(json, "\"arrangements\": {\"keep_a\": 0"));
    free(json);
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    assert_int_not_equal(access(path, F_OK), 0); /* nothing trained by profile */
    /* a profile that fails is said, and training goes on without it */
    setenv("FUYOU_TEST_PROFILE_FAIL", "1", 1);
    const char *one[] = {"--eval-every", "1000", NULL};
    assert_int_equal(fy_trainutil_train_with(f, run, f->data, "1", NULL, 0, one), 0);
    unsetenv("FUYOU_TEST_PROFILE_FAIL");
    assert_true(fy_test_file_contains(f->log, "profiling a block failed (above): planning "
                                              "without it"));
    assert_true(fy_test_file_contains(f->log, "activations (auto, not profiled)"));
    assert_true(fy_test_file_contains(f->log, "step 1/1"));
    const char *bad[] = {"profile", "--run-dir", run, "--batch", "8", "--seq", "64", "--backend",
                         "cpu", NULL};
    assert_int_equal(fy_test_launch_in(f, bad, 60), 2);
    assert_true(fy_test_file_contains(f->log, "to the model's context of 32"));
}

/* --trace writes Chrome trace-event JSON with every worker's requests; metrics carry busy times. */
static void test_trace_and_busy_metrics(void **state)
{
    struct fy_test_fixture *f = *state;
    char *run = fy_test_in(f, "run");
    fy_trainutil_init_model(f, run, "32", "1");
    char *trace = fy_test_in(f, "trace.json");
    assert_int_equal(
        fy_trainutil_train_with(f, run, f->data, "3", NULL, 0,
                                (const char *[]){"--trace", trace, "--clip-grad-norm", "0", NULL}),
        0);
    char *text = fy_test_slurp(trace, NULL);
    assert_non_null(text);
    assert_true(text[0] == '[');
    assert_non_null(strstr(text, "\"name\": \"gpt-block-bwd\""));
    assert_non_null(strstr(text, "\"name\": \"opt-adamw\""));
    assert_non_null(strstr(text, "\"name\": \"io-read\""));
    assert_non_null(strstr(text, "\"cat\": \"gpu worker\""));
    free(text);
    /* the whole file parses */
    if (fy_trainutil_have_python("the trace as JSON and by trace_gaps.py")) {
        char cmd[800];
        snprintf(cmd, sizeof cmd,
                 "python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
                 "sys.exit(0 if sum(1 for e in d if e.get(\"ph\")==\"X\" and e[\"dur\"]>0) > 30 else 1)' %s",
                 trace);
        assert_int_equal(system(cmd), 0);
        /* the step summary of tests/bench/trace_gaps.py reads it (step 2 of 3) */
        char out[700];
        snprintf(out, sizeof out, "%s.gaps", trace);
        snprintf(cmd, sizeof cmd, "python3 tests/bench/trace_gaps.py %s > %s", trace, out);
        assert_int_equal(system(cmd), 0);
        assert_true(fy_test_file_contains(out, "step 2: gpu span "));
        assert_true(fy_test_file_contains(out, "optimizer idle > 1 ms"));
        snprintf(cmd, sizeof cmd, "python3 tests/bench/trace_gaps.py %s 9 > %s", trace, out);
        assert_int_not_equal(system(cmd), 0); /* no step 9 */
        /* tests/bench/trace_disk.py: the disk per phase of steps 2 and 3 */
        snprintf(cmd, sizeof cmd, "python3 tests/bench/trace_disk.py %s > %s", trace, out);
        assert_int_equal(system(cmd), 0);
        assert_true(fy_test_file_contains(out, "   2 forward "));
        assert_true(fy_test_file_contains(out, "   2 backward "));
        assert_int_equal(fy_test_count_matches(out, "   1 forward "), 0); /* the first: left out */
        /* the reads' bytes in the trace are those metrics.jsonl counts for steps 1 and 2 (the
         * last step's commit reads after its line) */
        snprintf(cmd, sizeof cmd,
                 "python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
                 "m=[json.loads(l) for l in open(sys.argv[2])]; "
                 "t=[sum(e[\"args\"][\"bytes\"] for e in d if e.get(\"name\")==\"io-read\" "
                 "and e[\"args\"][\"step\"]==s) for s in (1, 2)]; "
                 "sys.exit(0 if t[1]>0 and t==[r[\"ssd_read_bytes\"] for r in m[:2]] else 1)' "
                 "%s %s/metrics.jsonl",
                 trace, run);
        assert_int_equal(system(cmd), 0);
    } else {
        print_message("python3 missing: the trace's JSON syntax was not checked\n");
    }
    char metrics[600];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run);
    assert_true(fy_test_file_contains(metrics, "\"busy_gpu_s\": "));
    assert_true(fy_test_file_contains(metrics, "\"busy_ssd_read_s\": "));
    /* the CPU backend copies nothing to a device: its copy times are there, and zero */
    assert_true(fy_test_file_contains(metrics, "\"busy_h2d_s\": 0.000000, \"busy_d2h_s\": 0.000000"));
    assert_true(fy_test_file_contains(metrics, "\"gpu_idle\": "));
    /* the backward's share of the gpu worker's busy time: there, and no more than the whole */
    double gpu[3], bwd[3];
    assert_int_equal(fy_trainutil_field_numbers(metrics, "\"busy_gpu_s\": ", gpu, 3), 3);
    assert_int_equal(fy_trainutil_field_numbers(metrics, "\"busy_gpu_backward_s\": ", bwd, 3), 3);
    for (int i = 0; i < 3; i++)
        assert_true(bwd[i] > 0 && bwd[i] < gpu[i]);
    /* the bytes the io worker moved: state streamed each step, the same every step, in O_DIRECT
     * pieces */
    double rd[3], wr[3];
    assert_int_equal(fy_trainutil_field_numbers(metrics, "\"ssd_read_bytes\": ", rd, 3), 3);
    assert_int_equal(fy_trainutil_field_numbers(metrics, "\"ssd_write_bytes\": ", wr, 3), 3);
    for (int i = 0; i < 3; i++) {
        assert_true(rd[i] > 0 && wr[i] > 0);
        assert_true(fmod(rd[i], 4096) == 0 && fmod(wr[i], 4096) == 0);
    }
    assert_true(rd[1] == rd[0] && wr[1] == wr[0]);
    /* the plan check: step 2 beside the plan's prediction (RUN/act_plan.json, full precision) and
     * the rates of its metrics line */
    double step_s[3], busy_rd[3], busy_wr[3], busy_opt[3], predicted = 0, predicted_opt = 0;
    assert_int_equal(fy_trainutil_field_numbers(metrics, "\"step_s\": ", step_s, 3), 3);
    assert_int_equal(fy_trainutil_field_numbers(metrics, "\"busy_opt_s\": ", busy_opt, 3), 3);
    assert_int_equal(fy_trainutil_field_numbers(metrics, "\"busy_ssd_read_s\": ", busy_rd, 3), 3);
    assert_int_equal(fy_trainutil_field_numbers(metrics, "\"busy_ssd_write_s\": ", busy_wr, 3), 3);
    char plan[600];
    snprintf(plan, sizeof plan, "%s/act_plan.json", run);
    assert_int_equal(fy_trainutil_field_numbers(plan, "\"predicted_step_s\": ", &predicted, 1), 1);
    assert_true(predicted > 0);
    assert_int_equal(fy_trainutil_field_numbers(plan, "\"predicted_opt_s\": ", &predicted_opt, 1),
                     1);
    assert_true(predicted_opt > 0 && predicted_opt <= predicted);
    char *log = fy_test_slurp(f->log, NULL), *check = log ? strstr(log, "plan check, step 2: ") : NULL;
    assert_non_null(check);
    assert_null(strstr(log, "plan check, step 3")); /* once a session */
    double sec, pred, over, r, w, opt, opt_pred;
    assert_int_equal(sscanf(check, "plan check, step 2: %lf s against the %lf s predicted (%lf%%); "
                                   "in it the SSD read %lf GB/s and wrote %lf",
                            &sec, &pred, &over, &r, &w),
                     5);
    /* the opt worker's busy time beside the plan's for it (AdamW and the weights' conversions) */
    char *busy = strstr(check, "; the opt worker was busy ");
    assert_non_null(busy);
    assert_true(busy < check + strcspn(check, "\n"));
    assert_int_equal(sscanf(busy,
                            "; the opt worker was busy %lf s (the plan's: %lf s, with AdamW at",
                            &opt, &opt_pred),
                     2);
    free(log);
    /* printed with 3 significant digits (a tiny model's are a few ms or less) */
    assert_float_equal(opt, busy_opt[1], 0.005 * busy_opt[1] + 1e-6);
    assert_float_equal(opt_pred, predicted_opt, 0.005 * predicted_opt);
    assert_float_equal(sec, step_s[1], 0.0005);
    assert_float_equal(pred, predicted, 0.0005);
    assert_float_equal(over, 100 * (predicted / step_s[1] - 1), 0.06);
    assert_float_equal(r, rd[1] / busy_rd[1] * 1e-9, 0.006 + 0.01 * r);
    assert_float_equal(w, wr[1] / busy_wr[1] * 1e-9, 0.006 + 0.01 * w);
}

/* Rewrites the JSON record at `path`: `text` in place of what follows `key` (a prefix of what the
 * key's value was, which stays after it unless `text` ends the string itself). */
static void replace_field(const char *path, const char *key, const char *text)
{
    size_t len;
    char *old = fy_test_slurp(path, &len), *at = old ? strstr(old, key) : NULL;
    assert_non_null(at);
    const char *rest = at + strlen(key);
    if (text[strlen(text) - 1] == '"') /* the value replaced whole */
        rest = strchr(rest, '"');
    assert_non_null(rest);
    FILE *out = fopen(path, "w");
    assert_non_null(out);
    fprintf(out, "%.*s%s%s%s", (int)(at - old), old, key, text,
            text[strlen(text) - 1] == '"' ? rest + 1 : rest);
    assert_int_equal(fclose(out), 0);
    free(old);
}

/* A family whose blocks are not profiled (Llama) has no sample to replace: its step is predicted
 * at the reference machine's rates, and a session after one that left a record predicts with the
 * record's SSD rates in their place, as `plan` does. */
static void test_step_rates_carried_unprofiled(void **state)
{
    struct fy_test_fixture *f = *state;
    char *run = fy_test_in(f, "llama");
    const char *init[] = {"init", "--run-dir", run, "--arch", "llama", "--layers", "2", "--heads",
                          "4", "--kv-heads", "2", "--embd", "32", "--ffn", "48", "--ctx", "32",
                          "--seed", "3", NULL};
    assert_int_equal(fy_test_launch_in(f, init, 60), 0);
    assert_int_equal(fy_trainutil_train(f, run, f->data, "4", NULL, 0, NULL, NULL), 0);
    assert_true(fy_test_file_contains(f->log, "neither profiled nor swapped"));
    assert_false(fy_test_file_contains(f->log, "the SSD's as this run's last session's steps"));
    assert_true(fy_test_file_contains(f->log, "in this session's 3 steps after the first (kept in"));
    assert_int_equal(fy_trainutil_train(f, run, f->data, "6", NULL, 0, NULL, NULL), 0);
    assert_true(fy_test_file_contains(f->log, "plan: SSD rates as the last session's 3 steps ran "
                                              "at (steps 2 to 4"));
    assert_true(fy_test_file_contains(f->log, "in place of the reference machine's (read 1.75, "
                                              "write 2.40)"));
    assert_true(fy_test_file_contains(f->log, "(one H200; the SSD's as this run's last session's "
                                              "steps ran: SSD "));
    /* --step-rates profile: the reference machine's */
    assert_int_equal(fy_trainutil_train(f, run, f->data, "7", NULL, 0, "--step-rates", "profile"),
                     0);
    assert_false(fy_test_file_contains(f->log, "the SSD's as this run's last session's steps"));
}

/* --step-rates: the steps of a session after its first leave the SSD's rates in RUN/step_rates.json
 * (their bytes over their busy seconds, as metrics.jsonl has them); the next session predicts with
 * them in place of the profile's sample and says so in its log, its plan check and act_plan.json
 * (`plan` for the run, in place of the reference machine's). With --step-rates profile, a damaged
 * record or one of another store, the plan uses the sample. */
static void test_step_rates_carried(void **state)
{
    struct fy_test_fixture *f = *state;
    char *run = fy_test_in(f, "run");
    fy_trainutil_init_model(f, run, "32", "1");
    assert_int_equal(fy_trainutil_train(f, run, f->data, "4", NULL, 0, NULL, NULL), 0);
    assert_true(fy_test_file_contains(f->log, "in this session's 3 steps after the first (kept in"));
    char metrics[600], rates[600], plan[600];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run);
    snprintf(rates, sizeof rates, "%s/step_rates.json", run);
    snprintf(plan, sizeof plan, "%s/act_plan.json", run);
    double rd[4], wr[4], busy_rd[4], busy_wr[4];
    assert_int_equal(fy_trainutil_field_numbers(metrics, "\"ssd_read_bytes\": ", rd, 4), 4);
    assert_int_equal(fy_trainutil_field_numbers(metrics, "\"ssd_write_bytes\": ", wr, 4), 4);
    assert_int_equal(fy_trainutil_field_numbers(metrics, "\"busy_ssd_read_s\": ", busy_rd, 4), 4);
    assert_int_equal(fy_trainutil_field_numbers(metrics, "\"busy_ssd_write_s\": ", busy_wr, 4), 4);
    double rb = 0, rs = 0, wb = 0, ws = 0, steps = 0, first = 0, last = 0; /* cJSON_Print's tabs */
    assert_int_equal(fy_trainutil_field_numbers(rates, "\"read_bytes\":\t", &rb, 1), 1);
    assert_int_equal(fy_trainutil_field_numbers(rates, "\"read_seconds\":\t", &rs, 1), 1);
    assert_int_equal(fy_trainutil_field_numbers(rates, "\"write_bytes\":\t", &wb, 1), 1);
    assert_int_equal(fy_trainutil_field_numbers(rates, "\"write_seconds\":\t", &ws, 1), 1);
    assert_int_equal(fy_trainutil_field_numbers(rates, "\"steps\":\t", &steps, 1), 1);
    assert_int_equal(fy_trainutil_field_numbers(rates, "\"first_step\":\t", &first, 1), 1);
    assert_int_equal(fy_trainutil_field_numbers(rates, "\"last_step\":\t", &last, 1), 1);
    /* steps 2 to 4: the first, a warm-up, is left out */
    assert_true(steps == 3 && first == 2 && last == 4);
    assert_true(rb == rd[1] + rd[2] + rd[3] && wb == wr[1] + wr[2] + wr[3]);
    assert_true(rb > 0 && wb > 0);
    assert_float_equal(rs, busy_rd[1] + busy_rd[2] + busy_rd[3], 2e-6);
    assert_float_equal(ws, busy_wr[1] + busy_wr[2] + busy_wr[3], 2e-6);
    /* AdamW's: the opt worker's busy seconds of the same steps against what the plan gave them at
     * the rate it assumed (its act_plan.json) */
    double busy_opt[4], opt_busy = 0, opt_step = 0, opt_params = 0;
    double planned_opt = 0, planned_params = 0;
    assert_int_equal(fy_trainutil_field_numbers(metrics, "\"busy_opt_s\": ", busy_opt, 4), 4);
    assert_int_equal(fy_trainutil_field_numbers(rates, "\"opt_busy_seconds\":\t", &opt_busy, 1), 1);
    assert_int_equal(
        fy_trainutil_field_numbers(rates, "\"opt_plan_seconds_per_step\":\t", &opt_step, 1), 1);
    assert_int_equal(
        fy_trainutil_field_numbers(rates, "\"opt_plan_params_per_s\":\t", &opt_params, 1), 1);
    assert_int_equal(fy_trainutil_field_numbers(plan, "\"predicted_opt_s\": ", &planned_opt, 1), 1);
    assert_int_equal(fy_trainutil_field_numbers(plan, "\"opt_params_per_s\": ", &planned_params, 1),
                     1);
    assert_true(fy_test_file_contains(plan, "\"opt_rate_from\": \"profile\""));
    assert_true(fy_test_file_contains(rates, "\"optim_state\":\t\"fp32\""));
    assert_float_equal(opt_busy, busy_opt[1] + busy_opt[2] + busy_opt[3], 2e-6);
    assert_true(opt_busy > 0 && opt_step > 0);
    assert_float_equal(opt_step, planned_opt, 1e-7 * planned_opt); /* printed %.9g */
    assert_float_equal(opt_params, planned_params, 1e-5 * planned_params);
    double adamw = opt_params * 3 * opt_step / opt_busy; /* the rate the next plan takes */

    /* so does `plan` for the run, beside the reference machine's other rates */
    const char *plan_args[] = {"plan", "--run-dir", run, "--batch", "8", "--seq", "32",
                               "--backend", "cpu", NULL};
    assert_int_equal(fy_test_launch_in(f, plan_args, 60), 0);
    assert_true(fy_test_file_contains(f->log, "; the SSD's and AdamW's as the last session's steps "
                                              "ran ("));
    assert_true(fy_test_file_contains(f->log, "plan: AdamW at "));
    assert_true(fy_test_file_contains(f->log, "in place of the reference machine's rates (read "));
    const char *plan_sample[] = {"plan", "--run-dir", run,   "--batch",      "8",       "--seq",
                                 "32",   "--backend", "cpu", "--step-rates", "profile", NULL};
    assert_int_equal(fy_test_launch_in(f, plan_sample, 60), 0);
    assert_false(fy_test_file_contains(f->log, "the last session's steps"));

    /* the next session plans with them */
    assert_int_equal(fy_trainutil_train(f, run, f->data, "6", NULL, 0, NULL, NULL), 0);
    assert_true(fy_test_file_contains(f->log, "plan: SSD rates as the last session's 3 steps ran "
                                              "at (steps 2 to 4, batch "
                                              FY_TRAINUTIL_STR(FY_TRAINUTIL_BATCH)
                                              ", --act-plan auto"));
    assert_true(fy_test_file_contains(plan, "\"ssd_rates_from\": \"steps\""));
    assert_true(fy_test_file_contains(plan, "\"opt_rate_from\": \"steps\""));
    assert_true(fy_test_file_contains(f->log, " G parameters/s as the opt worker ran in the last "
                                              "session's 3 steps (busy "));
    assert_int_equal(fy_trainutil_field_numbers(plan, "\"opt_params_per_s\": ", &planned_params, 1),
                     1);
    assert_float_equal(planned_params, adamw, 1e-5 * adamw);
    double plan_rd = 0, plan_wr = 0;
    assert_int_equal(fy_trainutil_field_numbers(plan, "\"ssd_read_Bps\": ", &plan_rd, 1), 1);
    assert_int_equal(fy_trainutil_field_numbers(plan, "\"ssd_write_Bps\": ", &plan_wr, 1), 1);
    assert_float_equal(plan_rd, rb / rs, 1e-5 * plan_rd);
    assert_float_equal(plan_wr, wb / ws, 1e-5 * plan_wr);
    char *log = fy_test_slurp(f->log, NULL);
    assert_non_null(log);
    char *check = strstr(log, "(the plan's: ");
    assert_non_null(check);
    double r, w;
    assert_int_equal(sscanf(check, "(the plan's: %lf and %lf", &r, &w), 2);
    assert_float_equal(r, plan_rd * 1e-9, 0.006);
    assert_float_equal(w, plan_wr * 1e-9, 0.006);
    assert_non_null(strstr(check, ", from the last session's steps)"));
    free(log);
    /* and the record is now that session's: step 6 (5 warmed up) */
    assert_int_equal(fy_trainutil_field_numbers(rates, "\"first_step\":\t", &first, 1), 1);
    assert_true(first == 6);

    /* --step-rates profile: the sample, though a record is there */
    assert_int_equal(fy_trainutil_train(f, run, f->data, "8", NULL, 0, "--step-rates", "profile"),
                     0);
    assert_true(fy_test_file_contains(plan, "\"ssd_rates_from\": \"profile\""));
    assert_true(fy_test_file_contains(plan, "\"opt_rate_from\": \"profile\""));
    assert_false(fy_test_file_contains(f->log, "in place of the profile's sample"));
    assert_true(fy_test_file_contains(f->log, ", from the profile)"));
    assert_int_equal(fy_trainutil_train(f, run, f->data, "9", NULL, 0, "--step-rates", "sometimes"),
                     2);

    /* a damaged record: said, the sample used, the record written anew */
    FILE *bad = fopen(rates, "w");
    assert_non_null(bad);
    fputs("{\"version\": 1, \"read_bytes\"", bad);
    assert_int_equal(fclose(bad), 0);
    assert_int_equal(fy_trainutil_train(f, run, f->data, "10", NULL, 0, NULL, NULL), 0);
    assert_true(fy_test_file_contains(f->log, "step_rates.json: not a JSON object: the plan's SSD "
                                              "and AdamW rates are the profile's sample"));
    assert_true(fy_test_file_contains(plan, "\"ssd_rates_from\": \"profile\""));
    assert_true(fy_test_file_contains(plan, "\"opt_rate_from\": \"profile\""));
    assert_true(fy_test_file_contains(rates, "\"first_step\":\t10"));

    /* a record of another store: the SSD's from the sample, AdamW's from the steps */
    replace_field(rates, "\"ssd\":\t\"", "/elsewhere");
    assert_int_equal(fy_trainutil_train(f, run, f->data, "12", NULL, 0, NULL, NULL), 0);
    assert_true(fy_test_file_contains(f->log, "holds the rates of the store at /elsewhere"));
    assert_true(fy_test_file_contains(plan, "\"ssd_rates_from\": \"profile\""));
    assert_true(fy_test_file_contains(plan, "\"opt_rate_from\": \"steps\""));
    /* of another optimizer state format: AdamW's from the profile, the SSD's from the steps */
    replace_field(rates, "\"optim_state\":\t\"", "int8\"");
    assert_int_equal(fy_trainutil_train(f, run, f->data, "14", NULL, 0, NULL, NULL), 0);
    assert_true(fy_test_file_contains(f->log, "holds AdamW's rate with int8 optimizer state, not "
                                              "this run's fp32"));
    assert_true(fy_test_file_contains(plan, "\"ssd_rates_from\": \"steps\""));
    assert_true(fy_test_file_contains(plan, "\"opt_rate_from\": \"profile\""));
}

/* make bench-pipeline's table on the CPU backend (tests/bench/bench_pipeline.sh, its smoke test):
 * one row per run, each with the step its plan predicted, that prediction's excess over the
 * measured step, the SSD rates its profile measured and those its steps ran at; every run's log
 * copied into a log directory the script makes. With the state in the pool the steps move nothing
 * on the SSD but the internals --act-plan ssd writes there (two blocks: both stay in their pool
 * slots for the backward, so none is read back). */
static void test_bench_pipeline_table(void **state)
{
    struct fy_test_fixture *f = *state;
    if (!fy_trainutil_have_python("make bench-pipeline's table (its medians are python's)"))
        return;
    char *logs = fy_test_in(f, "logs/made-by-the-bench"), *work = fy_test_in(f, "bench");
    const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
    char cmd[2400];
    snprintf(cmd, sizeof cmd,
             "timeout 300 env BUILD=%s PIPELINE_CONFIGS=tiny PIPELINE_SEQ=32 PIPELINE_BACKEND=cpu "
             "PIPELINE_FSDP2=0 PIPELINE_CPU_MEM=2G PIPELINE_LOG_DIR=%s FUYOU_BENCH_DIR=%s "
             "PIPELINE_RUNS='4/host/overlap/recompute 4/host/overlap/ssd' "
             "bash tests/bench/bench_pipeline.sh >%s 2>&1",
             build, logs, work, f->log);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(fy_test_count_entries(logs), 2);
    assert_true(fy_test_file_contains(f->log, "step s predicted    over"));
    char *text = fy_test_slurp(f->log, NULL), *save = NULL;
    assert_non_null(text);
    int rows = 0;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "tiny ", 5) != 0)
            continue;
        char *field[32], *at = NULL;
        int n = 0;
        for (char *w = strtok_r(line, " ", &at); w && n < 32; w = strtok_r(NULL, " ", &at))
            field[n++] = w;
        assert_int_equal(n, 26);
        assert_string_equal(field[3], "overlap");
        double step = atof(field[8]), pred = atof(field[9]), rd = 0, wr = 0;
        assert_true(step > 0 && pred > 0);
        /* the backward's share of the gpu worker's busy time (these runs clip: the default) */
        double gpu = atof(field[13]), bwd = atof(field[14]);
        assert_true(bwd > 0 && bwd <= gpu);
        size_t len = strlen(field[10]);
        assert_true(len > 1 && field[10][len - 1] == '%');
        /* "over" is printed to 0.1% from the unrounded figures, step and pred to 1 ms */
        double within = 0.05 + 0.05 * (pred / (step * step) + 1 / step);
        assert_float_equal(atof(field[10]), 100 * (pred / step - 1), within);
        assert_int_equal(sscanf(field[22], "%lf/%lf", &rd, &wr), 2);
        assert_true(rd > 0 && wr > 0);
        /* the first run leaves no SSD rates (it moves nothing there): both plan from the sample */
        assert_string_equal(field[23], "profile");
        if (strcmp(field[4], "recompute") == 0) {
            assert_string_equal(field[24], "-/-");
        } else {
            assert_string_equal(field[4], "ssd");
            assert_int_equal(sscanf(field[24], "-/%lf", &wr), 1);
            assert_true(wr > 0);
        }
        rows++;
    }
    free(text);
    assert_int_equal(rows, 4); /* each run's row as it ends, and again in the table at the end */
}

/* A file of the fake machine under root (FUYOU_TEST_HOST_ROOT), its directories made. */
static void fake_host_file(const char *root, const char *rel, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    mkdir(root, 0755);
    for (char *p = strchr(path + strlen(root) + 1, '/'); p != NULL; p = strchr(p + 1, '/')) {
        *p = 0;
        mkdir(path, 0755);
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* --cpu-mem not given is what the machine can give, said: MemAvailable less a margin of a tenth
 * (at least 2 GiB, at most half), or a cgroup's limit less its use where that is less, the
 * tightest level of v2's and v1's from the process's cgroup up (a fake machine through
 * FUYOU_TEST_HOST_ROOT). 100 GiB available: 90 GiB; a v2 cgroup's parent of 48 GiB using 8 GiB:
 * 40 GiB less 4 GiB; v1's 32 GiB using 4 GiB (its own level unlimited) under it: 28 GiB less
 * 2.8 GiB; 24 MiB available leaves 12 MiB, which the 20 MiB pool does not fit: refused as any
 * --cpu-mem is. --cpu-mem given keeps its meaning, 0 no cap. */
static void test_plan_cpu_mem_default(void **state)
{
    struct fy_test_fixture *f = *state;
    char *machine = fy_test_in(f, "machine.json"), *root = fy_test_in(f, "host");
    FILE *m = fopen(machine, "w");
    assert_non_null(m);
    fputs("{\"gpu_flops\": 1e12, \"h2d\": 1e9, \"d2h\": 2e9, \"ssd_read\": 1e8, "
          "\"ssd_write\": 2e8, \"opt_params\": 1e6}\n",
          m);
    fclose(m);
    assert_int_equal(setenv("FUYOU_TEST_HOST_ROOT", root, 1), 0);
    fake_host_file(root, "proc/meminfo", "MemTotal: 200000000 kB\nMemAvailable: 104857600 kB\n");
    fake_host_file(root, "proc/self/cgroup", "0::/\n");
    assert_int_equal(plan_small_at(f, machine, 0, NULL, NULL), 0);
    assert_true(fy_test_file_contains(f->log, "plan: --cpu-mem 90.0 GiB (the default, what this "
                                              "machine can give): MemAvailable 100.0 GiB less a "
                                              "margin of 10.0 GiB;"));
    assert_true(fy_test_file_contains(f->log, "this machine's memory, as train here would take "
                                              "it, whatever machine "));
    assert_true(fy_test_file_contains(f->log, "4 of 4 units (1.4 MiB) stay in the shared pool"));
    assert_true(fy_test_file_contains(f->log, "of --cpu-mem 90.0 GiB\n"));
    fake_host_file(root, "proc/self/cgroup", "0::/run/me\n");
    fake_host_file(root, "sys/fs/cgroup/run/memory.max", "51539607552\n");
    fake_host_file(root, "sys/fs/cgroup/run/memory.current", "8589934592\n");
    fake_host_file(root, "sys/fs/cgroup/run/me/memory.max", "max\n");
    assert_int_equal(plan_small_at(f, machine, 0, NULL, NULL), 0);
    assert_true(fy_test_file_contains(f->log, "plan: --cpu-mem 36.0 GiB (the default, what this "
                                              "machine can give): the cgroup's limit 48.0 GiB "
                                              "less its use 8.0 GiB ("));
    assert_true(fy_test_file_contains(f->log, "/sys/fs/cgroup/run/memory.max; MemAvailable "
                                              "100.0 GiB) less a margin of 4.0 GiB;"));
    fake_host_file(root, "proc/self/cgroup", "4:memory:/a/b\n0::/run/me\n");
    fake_host_file(root, "sys/fs/cgroup/memory/a/b/memory.limit_in_bytes", "9223372036854771712\n");
    fake_host_file(root, "sys/fs/cgroup/memory/a/memory.limit_in_bytes", "34359738368\n");
    fake_host_file(root, "sys/fs/cgroup/memory/a/memory.usage_in_bytes", "4294967296\n");
    assert_int_equal(plan_small_at(f, machine, 0, NULL, NULL), 0);
    assert_true(fy_test_file_contains(f->log, "plan: --cpu-mem 25.2 GiB (the default, what this "
                                              "machine can give): the cgroup's limit 32.0 GiB "
                                              "less its use 4.0 GiB ("));
    fake_host_file(root, "proc/meminfo", "MemAvailable: 24576 kB\n");
    assert_int_equal(plan_small_at(f, machine, 0, NULL, NULL), 2);
    assert_true(fy_test_file_contains(f->log, "plan: --cpu-mem 12.0 MiB (the default, what this "
                                              "machine can give): MemAvailable 24.0 MiB less a "
                                              "margin of 12.0 MiB;"));
    assert_true(fy_test_file_contains(f->log, "of --cpu-mem 12.0 MiB (DOES NOT FIT)"));
    assert_int_equal(plan_small_at(f, machine, 0, "--cpu-mem", "0"), 0);
    assert_true(fy_test_file_contains(f->log, "plan: --cpu-mem 0 (given): no cap, no optimizer "
                                              "state kept in memory"));
    assert_true(fy_test_file_contains(f->log, "0 of 4 units (0 B) stay in the shared pool"));
    fake_host_file(root, "proc/meminfo", "MemTotal: 1000 kB\n");
    assert_int_equal(plan_small_at(f, machine, 0, NULL, NULL), 0);
    assert_true(fy_test_file_contains(f->log, "has no MemAvailable line"));
    assert_true(fy_test_file_contains(f->log, "plan: --cpu-mem not given and this machine's free "
                                              "memory not known (above): no cap"));
    unsetenv("FUYOU_TEST_HOST_ROOT");
}

/* plan_small's model on the CUDA backend under a machine profile whose GPU part is `gpu` (JSON
 * members, or ""), with opt value where given; the state streamed. */
static int plan_gpu_at(struct fy_test_fixture *f, const char *gpu, const char *opt,
                       const char *value)
{
    const char *machine = fy_test_in(f, "gpu-machine.json");
    FILE *m = fopen(machine, "w");
    assert_non_null(m);
    fprintf(m,
            "{\"gpu_flops\": 1e12, \"h2d\": 1e9, \"d2h\": 2e9, \"ssd_read\": 1e8, "
            "\"ssd_write\": 2e8, \"opt_params\": 1e6%s}\n",
            gpu);
    fclose(m);
    const char *args[] = {"plan",  "--layers",
                          "2",     "--heads",
                          "2",     "--embd",
                          "64",    "--vocab",
                          "256",   "--ctx",
                          "32",    "--batch",
                          "8",     "--seq",
                          "32",    "--backend",
                          "cuda",  "--machine",
                          machine, "--cpu-mem",
                          "0",     "--clip-grad-norm",
                          "0",     opt,
                          value,   NULL};
    return fy_test_launch_in(f, args, 60);
}

/* plan's --gpu-mem default on the CUDA backend: the free memory of the GPU the machine profile's
 * probe measured (gpu_free of gpu_total) less the margin train takes, a twentieth of the total
 * (at least 1 GiB, at most half the free memory), with where and when it was measured: 79 of 80
 * GiB free gives 75 GiB. A profile without the figure (older, or the CPU backend's) plans with the
 * arena sized to the working buffers, said; a bad figure is refused; --gpu-mem given, 0 too, keeps
 * its value; the CPU backend says nothing of it. */
static void test_plan_gpu_mem_default(void **state)
{
    struct fy_test_fixture *f = *state;
    const char *probed = ", \"gpu_free\": 84825604096, \"gpu_total\": 85899345920, "
                         "\"host\": \"gpuhost\", \"probed_at\": \"2026-12-06T05:49:22Z\"";
    assert_int_equal(plan_gpu_at(f, probed, NULL, NULL), 0);
    assert_true(fy_test_file_contains(
        f->log,
        fy_test_fmt(
            "plan: --gpu-mem 75.0 GiB (the default: the free memory of the GPU %s's probe measured "
            "on "
            "2026-12-06T05:49:22Z on host gpuhost, as train there would take it, 79.0 GiB of 80.0 "
            "GiB "
            "less a margin of 4.0 GiB for the CUDA context, cuBLAS and NCCL outside the arena); "
            "--gpu-mem SIZE sets another, 0 an arena sized to the working buffers alone\n",
            fy_test_in(f, "gpu-machine.json"))));
    if (fy_test_file_contains(f->log, "plan: GPU: working buffers ")) /* the CUDA backend built */
        assert_true(fy_test_file_contains(f->log, " of --gpu-mem 75.0 GiB; a block's internals "));
    assert_int_equal(plan_gpu_at(f, "", NULL, NULL), 0);
    assert_true(
        fy_test_file_contains(f->log, fy_test_fmt("plan: --gpu-mem not given and no GPU's free "
                                                  "memory known (%s records none: fuyou-launch "
                                                  "probe on the CUDA backend records it): planned "
                                                  "with the GPU arena sized to the working "
                                                  "buffers alone",
                                                  fy_test_in(f, "gpu-machine.json"))));
    if (fy_test_file_contains(f->log, "plan: GPU: working buffers "))
        assert_true(fy_test_file_contains(f->log, " of --gpu-mem 0 (sized to them); a block's "
                                                  "internals "));
    assert_int_equal(plan_gpu_at(f, ", \"gpu_free\": 2e9, \"gpu_total\": 1e9", NULL, NULL), 1);
    assert_true(fy_test_file_contains(f->log, "\"gpu_free\" and \"gpu_total\" must be positive "
                                              "numbers of bytes"));
    assert_int_equal(plan_gpu_at(f, probed, "--gpu-mem", "24G"), 0);
    assert_true(fy_test_file_contains(f->log, "plan: --gpu-mem 24.0 GiB (given)\n"));
    assert_int_equal(plan_gpu_at(f, probed, "--gpu-mem", "0"), 0);
    assert_true(fy_test_file_contains(f->log, "plan: --gpu-mem 0 (given): the GPU arena sized to "
                                              "the working buffers alone"));
    assert_int_equal(plan_small_at(f, fy_test_in(f, "gpu-machine.json"), 1, NULL, NULL), 0);
    assert_false(fy_test_file_contains(f->log, "--gpu-mem"));
}

int main(void)
{
    if (fy_trainutil_start("test_plan_cmd") != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        FY_TRAINUTIL_TEST(test_trace_and_busy_metrics),
        FY_TRAINUTIL_TEST(test_step_rates_carried),
        FY_TRAINUTIL_TEST(test_step_rates_carried_unprofiled),
        FY_TRAINUTIL_TEST(test_bench_pipeline_table),
        cmocka_unit_test(test_prediction_by_hand),
        FY_TRAINUTIL_TEST(test_plan_by_hand),
        FY_TRAINUTIL_TEST(test_plan_cpu_mem_default),
        FY_TRAINUTIL_TEST(test_plan_gpu_mem_default),
        FY_TRAINUTIL_TEST(test_plan_gpus),
        FY_TRAINUTIL_TEST(test_plan_optim_state_bytes),
        FY_TRAINUTIL_TEST(test_plan_unclipped_floor_said),
        FY_TRAINUTIL_TEST(test_plan_largest_batch_fits_ssd),
        FY_TRAINUTIL_TEST(test_paper_machine_profiles),
        FY_TRAINUTIL_TEST(test_probe_then_plan),
        FY_TRAINUTIL_TEST(test_probe_stopped_by_signal),
        FY_TRAINUTIL_TEST(test_report_stopped_by_signal),
        FY_TRAINUTIL_TEST(test_plan_pool_is_train_pool),
        FY_TRAINUTIL_TEST(test_progress_line),
        FY_TRAINUTIL_TEST(test_report_charts),
        FY_TRAINUTIL_TEST(test_profile_command),
    };
    struct CMUnitTest run[sizeof tests / sizeof tests[0]];
    size_t wanted = 0; /* FY_TEST_ONLY: a few of them, by name (comma-separated globs) */
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (fy_test_wanted(tests[i].name))
            run[wanted++] = tests[i];
    return _cmocka_run_group_tests("plan_cmd (integration)", run, wanted, NULL, NULL);
}
