/* Integration tests of GPT training through the real processes on the CPU backend: where the
 * optimizer state, the weights, the checkpoints and the blocks' internals live, how far ahead
 * they are read, and the order the overlapped schedule sends the updates in change no bit. Each
 * mix gives the losses and exported weights of the others and of the serial schedule; traced runs
 * show the order (tests/integration/trace_*.py). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/testutil.h"
#include "tests/trainutil.h"

/* Inits a fresh GPT of `layers` x `embd` (2 heads, context 32, seed 4) in `run`, trains it `steps`
 * steps with the `extra` options, and compares its export and losses with the group's first run
 * (or makes it the first). */
static void train_same_bits(struct fy_test_fixture *f, struct fy_trainutil_same_bits *group,
                            const char *run,
                            const char *layers, const char *embd, const char *steps,
                            const char *const *extra)
{
    char out[720], metrics[740];
    snprintf(out, sizeof out, "%s.fywt", run);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run);
    const char *init[] = {"init", "--run-dir", run, "--layers", layers, "--heads", "2", "--embd",
                          embd, "--ctx", "32", "--seed", "4", NULL};
    assert_int_equal(fy_test_launch_in(f, init, 60), 0);
    assert_int_equal(fy_trainutil_train_with(f, run, f->data, steps, out, 0, extra), 0);
    size_t n;
    char *w = fy_test_slurp(out, &n), *l = fy_trainutil_losses(metrics);
    assert_non_null(w);
    assert_true(strlen(l) > 0);
    fy_trainutil_same_bits_add(group, w, n, l);
}

/* Five blocks, some resident and some streamed: a streamed block's backward takes its weights from
 * its state, read before it into the slot the block two above leaves; every mix of the two, in
 * either schedule, gives the same losses and weights. */
static void test_mixed_placement_five_blocks(void **state)
{
    struct fy_test_fixture *f = *state;
    /* measured plans for this model and batch: 30M keeps 5 of the 7 units, 32M 6 (two gradient
     * slots, which leave room for more state than three) */
    const char *runs[][3] = {
        {"m-stream", NULL, "overlap"}, {"m-30", "30M", "overlap"}, {"m-32", "32M", "overlap"},
        {"m-all", "1G", "overlap"},    {"m-30s", "30M", "serial"}, {"m-streams", NULL, "serial"},
    };
    struct fy_trainutil_same_bits group = {0};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        const char *extra[] = {"--schedule", runs[i][2], runs[i][1] ? "--cpu-mem" : NULL, runs[i][1],
                               NULL};
        train_same_bits(f, &group, fy_test_in(f, runs[i][0]), "5", "128", "4", extra);
        if (runs[i][1] != NULL && strcmp(runs[i][1], "30M") == 0)
            assert_true(fy_test_file_contains(f->log, "optimizer state of 5 of 7 units"));
        if (runs[i][1] != NULL && strcmp(runs[i][1], "32M") == 0)
            assert_true(fy_test_file_contains(f->log, "optimizer state of 6 of 7 units"));
    }
    fy_trainutil_same_bits_free(&group);
}

/* --prefetch N reads the weights of N units ahead (more weights slots, taken in turn): any depth,
 * in either schedule and with clipping's extra backward pass, gives the same losses and weights;
 * a depth outside 1..8 is refused. Five blocks, so that depths 2 and 3 go round the slots. */
static void test_prefetch_depths_agree(void **state)
{
    struct fy_test_fixture *f = *state;
    const char *runs[][5] = {
        {"d1", "1", "overlap", NULL, NULL}, {"d2", "2", "overlap", NULL, NULL},
        {"d3", "3", "overlap", NULL, NULL}, {"d8", "8", "overlap", NULL, NULL},
        {"d3s", "3", "serial", NULL, NULL}, {"c1", "1", "overlap", "--clip-grad-norm", "0.05"},
        {"c3", "3", "overlap", "--clip-grad-norm", "0.05"},
    };
    struct fy_trainutil_same_bits group[2] = {{0}, {0}}; /* clipped runs compare among themselves */
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        const char *extra[] = {"--prefetch", runs[i][1], "--schedule", runs[i][2], runs[i][3],
                               runs[i][4], NULL};
        train_same_bits(f, &group[runs[i][3] != NULL], fy_test_in(f, runs[i][0]), "5", "32", "4",
                        extra);
    }
    fy_trainutil_same_bits_free(&group[0]);
    fy_trainutil_same_bits_free(&group[1]);
    const char *bad[] = {"0", "9"};
    for (int i = 0; i < 2; i++) {
        char *run = fy_test_in(f, "d1");
        assert_int_equal(fy_trainutil_train(f, run, f->data, "5", NULL, 0, "--prefetch", bad[i]),
                         2);
        assert_true(fy_test_file_contains(f->log, "--prefetch"));
    }
}

/* --cpu-mem keeps as much optimizer state in the pool as fits: nothing, some or all of it resident
 * gives the same bits as streaming everything from the store, in the overlapped schedule and in
 * the serial one. */
static void test_resident_state_matches_streaming(void **state)
{
    struct fy_test_fixture *f = *state;
    const char *mems[3] = {NULL, "60M", "1G"}; /* 60M holds 3 of the 4 units (measured) */
    const char *names[3] = {"stream", "some", "all"};
    struct fy_trainutil_same_bits group = {0};
    for (int i = 0; i < 6; i++) {
        const char *schedule = i < 3 ? "overlap" : "serial";
        char run[700];
        snprintf(run, sizeof run, "%s-%s", fy_test_in(f, names[i % 3]), schedule);
        const char *extra[] = {"--schedule", schedule, mems[i % 3] ? "--cpu-mem" : NULL,
                               mems[i % 3], NULL};
        train_same_bits(f, &group, run, "2", "256", "6", extra);
        if (i % 3 == 1)
            assert_true(fy_test_file_contains(f->log, "optimizer state of 3 of 4 units"));
        if (i % 3 == 2)
            assert_true(fy_test_file_contains(f->log, "optimizer state of 4 of 4 units"));
    }
    fy_trainutil_same_bits_free(&group);
    /* a cap below what the streaming regions alone need is refused before any work, with numbers */
    char *small = fy_test_in(f, "small");
    const char *init[] = {"init", "--run-dir", small, "--layers", "2", "--heads", "4", "--embd", "256",
                          "--ctx", "32", NULL};
    assert_int_equal(fy_test_launch_in(f, init, 60), 0);
    assert_int_equal(fy_trainutil_train(f, small, f->data, "6", NULL, 0, "--cpu-mem", "30M"), 2);
    assert_true(fy_test_file_contains(f->log, "plan does not fit"));
    assert_true(fy_test_file_contains(f->log, "--cpu-mem is 30.0 MiB"));
}

/* --ckpt-place ssd: the blocks' input checkpoints go through four pool slots to the store in the
 * forward and come back ahead of each backward pass (six blocks, so the slots are reused); the
 * results equal those with the checkpoints in the pool, bit for bit, in both schedules, with and
 * without clipping (whose second backward pass reads them again), with the state resident or
 * streamed. */
static void test_checkpoints_on_ssd_agree(void **state)
{
    struct fy_test_fixture *f = *state;
    for (int clip = 0; clip < 2; clip++) {
        struct fy_trainutil_same_bits group = {0};
        for (int i = 0; i < 6; i++) {
            const char *place = i == 0 ? "host" : "ssd";
            const char *schedule = i % 2 ? "serial" : "overlap";
            const char *mem = i >= 4 ? "1G" : NULL; /* state resident, or streamed */
            char run[700];
            snprintf(run, sizeof run, "%s-%d-%d", fy_test_in(f, "ckpt"), clip, i);
            const char *extra[] = {"--ckpt-place", place, "--schedule", schedule,
                                   "--clip-grad-norm", clip ? "0.5" : "0",
                                   mem ? "--cpu-mem" : NULL, mem, NULL};
            train_same_bits(f, &group, run, "6", "64", "4", extra);
            if (i > 0)
                assert_true(fy_test_file_contains(f->log, "x_0..x_5 spilled to the store"));
        }
        /* auto: the pool when all the state fits beside the checkpoints (this model's pool with
         * everything resident is 22 MiB, measured), the SSD store when it does not */
        const char *mems[2] = {"1G", "21M"};
        for (int i = 0; i < 2; i++) {
            char run[700];
            snprintf(run, sizeof run, "%s-%d-auto%d", fy_test_in(f, "ckpt"), clip, i);
            const char *extra[] = {"--ckpt-place", "auto", "--cpu-mem", mems[i],
                                   "--clip-grad-norm", clip ? "0.5" : "0", NULL};
            train_same_bits(f, &group, run, "6", "64", "4", extra);
            assert_true(fy_test_file_contains(f->log, i ? "checkpoints on the SSD store"
                                                        : "checkpoints in the shared pool"));
        }
        fy_trainutil_same_bits_free(&group);
    }
    assert_int_equal(
        fy_trainutil_train(f, fy_test_in(f, "bad"), f->data, "1", NULL, 0, "--ckpt-place", "gpu"),
        2);
    assert_true(fy_test_file_contains(f->log, "--ckpt-place gpu: give host, ssd or auto"));
}

/* The value of option `name` among a run's options (from index 3, up to its NULL), or NULL. */
static const char *run_option(const char *const run[9], const char *name)
{
    for (int k = 3; k < 8 && run[k] != NULL; k++)
        if (strcmp(run[k], name) == 0)
            return run[k + 1];
    return NULL;
}

/* --act-plan host|ssd: the forward copies the blocks' internals into the pool (host) or through
 * pool slots to the store (ssd; four slots and six blocks, so the slots are reused) and the
 * backward reads them instead of recomputing; a seeded mix of host, ssd and recompute per block
 * and kind does the same per kind, and auto profiles a block and plans (everything to the pool
 * when it fits, a mix under a tight --cpu-mem). Over 10 steps every plan gives the losses and
 * weights of recomputation bit for bit: in both schedules, with clipping (whose second backward
 * pass reads them again), with the checkpoints on the SSD beside them, with the state resident,
 * and reading 1, 3 or 6 blocks ahead (--act-ahead: 3, 5 or 8 slots of each kind). */
static void test_swapped_internals_agree(void **state)
{
    struct fy_test_fixture *f = *state;
    const char *runs[][9] = {
        {"recompute", "overlap", "0", NULL},
        {"host", "overlap", "0", NULL},
        {"ssd", "overlap", "0", NULL},
        {"ssd", "serial", "0", NULL},
        {"mix1", "overlap", "0", "--ckpt-place", "ssd", NULL},
        {"mix2", "overlap", "0", "--cpu-mem", "1G", NULL},
        {"ssd", "overlap", "0.5", NULL},
        {"mix1", "serial", "0.5", "--ckpt-place", "ssd", NULL},
        {"recompute", "overlap", "0.5", NULL},
        {"auto", "overlap", "0", NULL},
        {"auto", "overlap", "0", "--cpu-mem", "26M", NULL},
        {"auto", "serial", "0.5", "--cpu-mem", "26M", NULL},
        {"ssd", "overlap", "0", "--act-ahead", "1", "--ckpt-place", "ssd", NULL},
        {"mix1", "overlap", "0", "--act-ahead", "6", "--ckpt-place", "ssd", NULL},
        {"ssd", "overlap", "0.5", "--act-ahead", "1", "--ckpt-place", "ssd", NULL},
        {"ssd", "serial", "0.5", "--act-ahead", "3", NULL},
    };
    struct fy_trainutil_same_bits plain = {0}, clipped = {0};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        const char *plan = strncmp(runs[i][0], "mix", 3) == 0 ? "ssd" : runs[i][0];
        if (strncmp(runs[i][0], "mix", 3) == 0)
            setenv("FUYOU_TEST_ACT_MIX", runs[i][0] + 3, 1);
        const char *extra[12] = {"--act-plan", plan, "--schedule", runs[i][1],
                                 "--clip-grad-norm", runs[i][2]};
        for (int k = 3; k < 9 && runs[i][k] != NULL; k++)
            extra[3 + k] = runs[i][k];
        char run[700];
        snprintf(run, sizeof run, "%s-%zu", fy_test_in(f, "swap"), i);
        int clip = strcmp(runs[i][2], "0") != 0;
        train_same_bits(f, clip ? &clipped : &plain, run, "6", "64", "10", extra);
        unsetenv("FUYOU_TEST_ACT_MIX");
        const char *ahead = run_option(runs[i], "--act-ahead");
        unsigned slots = ahead ? (unsigned)atoi(ahead) + 2 : 4; /* the checkpoints' too */
        if (strcmp(plan, "ssd") == 0) {
            assert_true(fy_test_file_contains(
                f->log, fy_test_fmt("internals placed on the SSD spilled to the store through %u "
                                    "pool slots", slots)));
            assert_true(fy_test_file_contains(fy_test_fmt("%s/act_plan.json", run),
                                              fy_test_fmt("\"ssd_slots\": %u,", slots)));
        }
        if (run_option(runs[i], "--ckpt-place") != NULL)
            assert_true(fy_test_file_contains(
                f->log, fy_test_fmt("x_0..x_5 spilled to the store through %u pool slots", slots)));
        if (strncmp(runs[i][0], "mix", 3) == 0)
            assert_true(fy_test_file_contains(f->log, "the blocks' internals mixed"));
        if (strcmp(plan, "auto") == 0) { /* profiled and planned, the plan in the run directory */
            char path[740];
            snprintf(path, sizeof path, "%s/act_plan.json", run);
            char *json = fy_test_slurp(path, NULL);
            assert_non_null(json);
            assert_non_null(strstr(json, "\"mode\": \"auto\""));
            assert_non_null(strstr(json, "\"planner\": {"));
            free(json);
            assert_true(fy_test_file_contains(f->log, "from the measured block profile"));
        }
    }
    fy_trainutil_same_bits_free(&plain);
    fy_trainutil_same_bits_free(&clipped);
    /* the pool holds every block's internals with host: a --cpu-mem that recomputation fits (its
     * pool is 18 MiB, measured) and host does not is refused, with the numbers */
    const char *init[] = {"init", "--run-dir", fy_test_in(f, "swap-tight"), "--layers", "6",
                          "--heads", "2", "--embd", "64", "--ctx", "32", NULL};
    assert_int_equal(fy_test_launch_in(f, init, 60), 0);
    const char *fits[] = {"--act-plan", "recompute", "--cpu-mem", "20M", NULL};
    assert_int_equal(
        fy_trainutil_train_with(f, fy_test_in(f, "swap-tight"), f->data, "1", NULL, 0, fits), 0);
    const char *tight[] = {"--act-plan", "host", "--cpu-mem", "20M", NULL};
    assert_int_not_equal(
        fy_trainutil_train_with(f, fy_test_in(f, "swap-tight"), f->data, "2", NULL, 0, tight), 0);
    assert_true(fy_test_file_contains(f->log, "--cpu-mem is 20.0 MiB"));
    assert_true(fy_test_file_contains(f->log, "state 1.1 MiB, saved "));
}

/* --act-ahead N reads the activations on the store N blocks ahead: in a traced run with every
 * block's internals and checkpoints on the SSD (six blocks), each read from their scratch extents
 * is sent right after the backward request of the block N above its own and before the next
 * (trace_ahead.py, by the requests' sequence numbers); the same trace checked for another depth
 * fails, so the check tells the depths apart. Skipped, visibly, without python3. */
static void test_act_ahead_in_trace(void **state)
{
    struct fy_test_fixture *f = *state;
    if (!fy_trainutil_have_python("the read-ahead"))
        return;
    static const char *const depths[] = {"1", "3"};
    for (int i = 0; i < 2; i++) {
        char run[700], trace[740], cmd[1600];
        snprintf(run, sizeof run, "%s-%s", fy_test_in(f, "ahead"), depths[i]);
        snprintf(trace, sizeof trace, "%s.json", run);
        const char *init[] = {"init", "--run-dir", run, "--layers", "6", "--heads", "2",
                              "--embd", "64", "--ctx", "32", NULL};
        assert_int_equal(fy_test_launch_in(f, init, 60), 0);
        const char *extra[] = {"--act-plan", "ssd", "--ckpt-place", "ssd", "--act-ahead",
                               depths[i], "--trace", trace, NULL};
        assert_int_equal(fy_trainutil_train_with(f, run, f->data, "3", NULL, 0, extra), 0);
        for (int k = 0; k < 2; k++) {
            snprintf(cmd, sizeof cmd, "python3 tests/integration/trace_ahead.py %s %s 6", trace,
                     depths[k]);
            int status = system(cmd);
            assert_true(WIFEXITED(status));
            if (k == i)
                assert_int_equal(WEXITSTATUS(status), 0);
            else
                assert_int_not_equal(WEXITSTATUS(status), 0);
        }
    }
}

/* Trains a fresh GPT of `layers` x `embd` 4 steps, unclipped, with every AdamW delayed by delay_ms
 * (the test hook), overlapped (traced) and then serial, with the option `opt` `value` too: both
 * must log the delay and `slots` (the plan's gradient-slots line) and give the same bits. Then
 * `check`, a python3 command line with %s for the trace, must exit 0 (skipped, visibly, without
 * python3). */
static void delayed_overlap_and_serial(struct fy_test_fixture *f, const char *name,
                                       const char *delay_ms, const char *layers, const char *embd,
                                       const char *opt, const char *value, const char *slots,
                                       const char *check)
{
    struct fy_trainutil_same_bits group = {0};
    char trace[700], delayed[80], cmd[900];
    snprintf(trace, sizeof trace, "%s.json", fy_test_in(f, name));
    snprintf(delayed, sizeof delayed, "every AdamW request is delayed by %s ms", delay_ms);
    assert_int_equal(setenv("FUYOU_TEST_OPT_DELAY_MS", delay_ms, 1), 0);
    for (int i = 0; i < 2; i++) {
        const char *schedule = i == 0 ? "overlap" : "serial";
        char run[700];
        snprintf(run, sizeof run, "%s-%s", fy_test_in(f, name), schedule);
        const char *extra[] = {"--schedule",
                               schedule,
                               "--cpu-mem",
                               "1G",
                               "--clip-grad-norm",
                               "0",
                               opt,
                               value,
                               i == 0 ? "--trace" : NULL,
                               trace,
                               NULL};
        train_same_bits(f, &group, run, layers, embd, "4", extra);
        assert_true(fy_test_file_contains(f->log, delayed));
        assert_true(fy_test_file_contains(f->log, slots));
    }
    unsetenv("FUYOU_TEST_OPT_DELAY_MS");
    fy_trainutil_same_bits_free(&group);
    if (!fy_trainutil_have_python(fy_test_fmt("the trace of %s", name)))
        return;
    snprintf(cmd, sizeof cmd, check, trace);
    assert_int_equal(system(cmd), 0);
}

/* The next step's forward waits for each unit's own update, not for the whole optimizer. With the
 * optimizer made the slowest stage (a test hook delays every AdamW by 40 ms), the updates still
 * running when a backward ends go in the forward's order, so step N+1's forward starts while step
 * N's updates run; each unit's forward still starts after that unit's update ended (checked in the
 * trace: 3 steps after the first, each with 7 units, embeddings and 6 blocks), and the results
 * equal the serial schedule's bit for bit. */
static void test_forward_waits_for_its_unit_only(void **state)
{
    delayed_overlap_and_serial(*state, "delayed", "40", "6", "64", "--grad-slots", "6",
                               "6 block gradients in the pool at once",
                               "python3 tests/integration/trace_order.py %s 21");
}

/* Updates go lowest unit first. With 24 blocks whose backward outruns an AdamW delayed by 30 ms,
 * the opt worker is sent the newest gradient's block before older, higher ones while the backward
 * still runs (trace_edf.py finds such pairs; with arrival order there are none, checked by hand),
 * and the bits are the serial schedule's. Batch 4 keeps the blocks fast enough for the backward
 * to outrun AdamW even on one core. */
static void test_updates_lowest_unit_first(void **state)
{
    delayed_overlap_and_serial(*state, "lowest-first", "30", "24", "128", "--batch", "4",
                               "16 block gradients in the pool at once",
                               "python3 tests/integration/trace_edf.py %s");
}

/* Fewer gradient slots than blocks, with the optimizer the slowest stage (AdamW delayed by 20 ms):
 * a block's backward waits for a free slot, which the update that ends first gives back, while the
 * updates go lowest unit first. Each forward still follows its unit's update (the trace), and the
 * bits are the serial schedule's. With three slots nothing is left for the next forward (the last
 * argument of trace_order.py: no late update required): the updates in flight at the backward's
 * end all run before the embeddings', which it needs first. */
static void test_fewer_gradient_slots_than_blocks(void **state)
{
    delayed_overlap_and_serial(*state, "three-slots", "20", "6", "64", "--grad-slots", "3",
                               "3 block gradients in the pool at once",
                               "python3 tests/integration/trace_order.py %s 21 0");
}

/* With the state in the pool and no clipping, the embeddings are updated in two parts: the rows no
 * token of the batch touches once the head is done, the rest after the embedding backward. Two
 * AdamW requests on unit 0 per step (the trace), and the same bits as one update after the
 * backward (the test hook FUYOU_TEST_EMBED_WHOLE), in either schedule. */
static void test_embed_update_in_two_parts(void **state)
{
    struct fy_test_fixture *f = *state;
    struct fy_trainutil_same_bits group = {0};
    char *trace = strdup(fy_test_in(f, "embed-split.json"));
    const char *runs[][2] = {{"whole", "overlap"}, {"split", "overlap"}, {"split-serial", "serial"}};
    for (int i = 0; i < 3; i++) {
        int whole = strcmp(runs[i][0], "whole") == 0;
        if (whole)
            assert_int_equal(setenv("FUYOU_TEST_EMBED_WHOLE", "1", 1), 0);
        const char *extra[] = {"--schedule",
                               runs[i][1],
                               "--cpu-mem",
                               "1G",
                               "--clip-grad-norm",
                               "0",
                               i == 1 ? "--trace" : NULL,
                               trace,
                               NULL};
        train_same_bits(f, &group, fy_test_in(f, runs[i][0]), "3", "64", "4", extra);
        assert_int_equal(fy_test_file_contains(f->log, "the embeddings are updated in one piece"),
                         whole);
        unsetenv("FUYOU_TEST_EMBED_WHOLE");
    }
    fy_trainutil_same_bits_free(&group);
    char *text = fy_test_slurp(trace, NULL);
    assert_non_null(text);
    /* steps 1..4, two requests on unit 0 each */
    int unit0 = 0;
    for (const char *p = text; (p = strstr(p, "\"name\": \"opt-adamw\"")) != NULL; p++) {
        const char *end = strchr(p, '\n');
        const char *u = strstr(p, "\"unit\": 0,");
        unit0 += u != NULL && (end == NULL || u < end);
    }
    assert_int_equal(unit0, 8);
    free(text);
    free(trace);
}

/* --weights-dtype bf16 on the CPU backend: every unit's weights go to the gpu worker in bf16, which
 * the backend widens (the results of weights rounded to bf16, so the losses differ from f32
 * weights'): a kept unit's copy that AdamW writes beside its state where the budget holds one, else
 * its master converted by the opt worker (opt-convert) into a weights slot, from where it is kept or,
 * streamed, chunk by chunk through the landing ring as it comes from the store. Each gives the same
 * bits, so the same losses and weights: every unit with a copy (1G), some kept with a copy, some
 * without and one streamed (60M, measured), every unit streamed (in many chunks:
 * FUYOU_TEST_LAND_CHUNK, read three units ahead; and in the natural chunks), overlapped and serial,
 * and a run restarted at every step (each start rounds the committed masters afresh); with clipping
 * too, every unit kept (one pass) and streamed (two passes: the norm pass converts again; one pass:
 * a block's update deferred to the next forward, converted from the state it reads). */
static void test_bf16_weights_agree(void **state)
{
    struct fy_test_fixture *f = *state;
    struct fy_trainutil_same_bits same = {0}, clipped = {0};
    const char *runs[][6] = {
        /* name, schedule, --cpu-mem, landing chunk, --clip-mode, --prefetch */
        {"b-all", "overlap", "1G", NULL, NULL, "1"},
        {"b-mixed", "overlap", "60M", NULL, NULL, "1"},
        {"b-stream", "overlap", NULL, "1048576", NULL, "3"},
        {"b-stream-s", "serial", NULL, NULL, NULL, "1"},
        {"b-clip", "overlap", "1G", NULL, "auto", "1"},
        {"b-clip-two", "overlap", NULL, "1048576", "two-pass", "1"},
        {"b-clip-one", "overlap", NULL, NULL, "one-pass", "1"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        const char *extra[16] = {"--weights-dtype", "bf16", "--schedule", runs[i][1], "--prefetch",
                                 runs[i][5]};
        unsigned n = 6;
        if (runs[i][2] != NULL) {
            extra[n++] = "--cpu-mem";
            extra[n++] = runs[i][2];
        }
        if (runs[i][4] != NULL) {
            extra[n++] = "--clip-grad-norm";
            extra[n++] = "0.05";
            extra[n++] = "--clip-mode";
            extra[n++] = runs[i][4];
        }
        if (runs[i][3] != NULL)
            assert_int_equal(setenv("FUYOU_TEST_LAND_CHUNK", runs[i][3], 1), 0);
        train_same_bits(f, runs[i][4] ? &clipped : &same, fy_test_in(f, runs[i][0]), "2", "256",
                        "3", extra);
        unsetenv("FUYOU_TEST_LAND_CHUNK");
        const char *said = runs[i][2] == NULL ? "bf16 for all 4 units: 0 from a bf16 copy"
                           : strcmp(runs[i][2], "1G") == 0 ? "bf16 for all 4 units: 4 from a bf16 copy"
                                                           : "bf16 for all 4 units: 1 from a bf16 copy";
        assert_true(fy_test_file_contains(f->log, said));
        if (runs[i][2] != NULL && strcmp(runs[i][2], "60M") == 0) /* one streamed, two without */
            assert_true(fy_test_file_contains(f->log, "optimizer state of 3 of 4 units"));
    }
    /* restarted at every step: the copies come from the committed masters each time */
    char *run = strdup(fy_test_in(f, "b-steps")), out[720], metrics[740];
    snprintf(out, sizeof out, "%s.fywt", run);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run);
    const char *init[] = {"init", "--run-dir", run, "--layers", "2", "--heads", "2", "--embd",
                          "256", "--ctx", "32", "--seed", "4", NULL};
    assert_int_equal(fy_test_launch_in(f, init, 60), 0);
    const char *extra[] = {"--weights-dtype", "bf16", "--cpu-mem", "1G", NULL};
    const char *steps[] = {"1", "2", "3"};
    for (int i = 0; i < 3; i++)
        assert_int_equal(
            fy_trainutil_train_with(f, run, f->data, steps[i], i == 2 ? out : NULL, 0, extra), 0);
    size_t n;
    char *w = fy_test_slurp(out, &n), *l = fy_trainutil_losses(metrics);
    assert_non_null(w);
    assert_string_equal(l, same.losses);
    assert_int_equal(n, same.n);
    assert_memory_equal(w, same.weights, n);
    free(w);
    free(l);
    /* f32 weights (the CPU backend's default) compute with other numbers */
    struct fy_trainutil_same_bits f32 = {0};
    const char *plain[] = {"--cpu-mem", "1G", NULL};
    train_same_bits(f, &f32, fy_test_in(f, "b-f32"), "2", "256", "3", plain);
    assert_true(fy_test_file_contains(f->log, "weights to the GPU in f32"));
    assert_string_not_equal(f32.losses, same.losses);
    fy_trainutil_same_bits_free(&f32);
    fy_trainutil_same_bits_free(&same);
    fy_trainutil_same_bits_free(&clipped);
    free(run);
    const char *bad[] = {"--weights-dtype", "f16", NULL};
    assert_int_equal(fy_trainutil_train_with(f, fy_test_in(f, "b-all"), f->data, "4", NULL, 0, bad),
                     2);
    assert_true(fy_test_file_contains(f->log, "--weights-dtype f16: give auto, f32 or bf16"));
}

/* Inits a GPT of `layers` x `embd` (2 heads, context 32, seed 4) in `run` with the `init` options,
 * trains it 3 steps unclipped with the `extra` options (FUYOU_TEST_STATE_PIECES=1 where `pieces`: the state
 * slots a piece's whatever the room), and compares its export and losses with the group's first. */
static void train_pieces(struct fy_test_fixture *f, struct fy_trainutil_same_bits *group,
                         const char *name, const char *layers, const char *embd,
                         const char *const *init_extra, int pieces, const char *const *extra)
{
    const char *run = fy_test_in(f, name);
    char out[720], metrics[740];
    snprintf(out, sizeof out, "%s.fywt", run);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run);
    const char *init[24] = {"init",   "--run-dir", run,     "--layers", layers,   "--heads", "2",
                            "--embd", embd,        "--ctx", "32",       "--seed", "4"};
    unsigned n = 13;
    for (unsigned i = 0; init_extra != NULL && init_extra[i] != NULL; i++)
        init[n++] = init_extra[i];
    init[n] = NULL;
    assert_int_equal(fy_test_launch_in(f, init, 60), 0);
    if (pieces)
        assert_int_equal(setenv("FUYOU_TEST_STATE_PIECES", "1", 1), 0);
    /* unclipped unless extra says otherwise: one gradient slot is for an unclipped step */
    const char *opts[24] = {"--clip-grad-norm", "0"};
    for (unsigned i = 0; extra != NULL && extra[i] != NULL && i < 21; i++)
        opts[2 + i] = extra[i];
    int rc = fy_trainutil_train_with(f, run, f->data, "3", out, 0, opts);
    unsetenv("FUYOU_TEST_STATE_PIECES");
    assert_int_equal(rc, 0);
    size_t len;
    char *w = fy_test_slurp(out, &len), *l = fy_trainutil_losses(metrics);
    assert_non_null(w);
    assert_true(strlen(l) > 0);
    fy_trainutil_same_bits_add(group, w, len, l);
}

/* The optimizer state in pieces (init --state-piece 16K: each block of 4 x 64 in about a dozen
 * pieces, the embeddings in several): streamed piece by piece after each block's backward
 * (FUYOU_TEST_STATE_PIECES) with one, two or three gradient slots, some units kept (in pieces,
 * updated with one request and their weights put together by the opt worker), every unit kept
 * (the embeddings' update in two parts over their pieces), whole units' state slots over a store
 * in pieces, both schedules, read three units ahead, f32 and bf16 weights, fp32, bf16 and int8
 * state, clipping in one pass and two: each gives the losses and weights of the same model with
 * whole units, streamed. */
static void test_state_pieces_agree(void **state)
{
    struct fy_test_fixture *f = *state;
    static const struct {
        const char *name, *format;
        int cut, pieces, group; /* init --state-piece 16K; the test hook; the comparison group */
        const char *extra[8];
    } runs[] = {
        {"sp-fp32", NULL, 0, 0, 0, {NULL}},
        {"sp-fp32-1", NULL, 1, 1, 0, {"--grad-slots", "1", NULL}},
        {"sp-fp32-mix",
         NULL,
         1,
         1,
         0,
         {"--grad-slots", "2", "--cpu-mem", "22M", "--schedule", "serial", NULL}},
        {"sp-fp32-kept", NULL, 1, 0, 0, {"--cpu-mem", "1G", NULL}},
        {"sp-fp32-whole", NULL, 1, 0, 0, {"--prefetch", "3", NULL}},
        {"sp-int8", "int8", 0, 0, 1, {NULL}},
        {"sp-int8-mix", "int8", 1, 1, 1, {"--grad-slots", "1", "--cpu-mem", "22M", NULL}},
        {"sp-bf16", "bf16", 0, 0, 2, {NULL}},
        {"sp-bf16-3", "bf16", 1, 1, 2, {"--prefetch", "3", NULL}},
        {"sp-wb", NULL, 0, 0, 3, {"--weights-dtype", "bf16", NULL}},
        {"sp-wb-1", NULL, 1, 1, 3, {"--weights-dtype", "bf16", "--grad-slots", "1", NULL}},
        {"sp-wb-mix", NULL, 1, 1, 3, {"--weights-dtype", "bf16", "--cpu-mem", "22M", NULL}},
        {"sp-clip", NULL, 0, 0, 4, {"--clip-grad-norm", "0.05", "--clip-mode", "two-pass", NULL}},
        {"sp-clip-1", NULL, 1, 1, 4, {"--clip-grad-norm", "0.05", "--clip-mode", "one-pass", NULL}},
        {"sp-clip-2",
         NULL,
         1,
         1,
         4,
         {"--clip-grad-norm", "0.05", "--clip-mode", "two-pass", "--cpu-mem", "22M", NULL}},
    };
    struct fy_trainutil_same_bits group[5] = {{0}};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        const char *init[5] = {NULL};
        unsigned n = 0;
        if (runs[i].cut) {
            init[n++] = "--state-piece";
            init[n++] = "16K";
        }
        if (runs[i].format != NULL) {
            init[n++] = "--optim-state";
            init[n++] = runs[i].format;
        }
        train_pieces(f, &group[runs[i].group], runs[i].name, "4", "64", init, runs[i].pieces,
                     runs[i].extra);
        if (runs[i].pieces)
            assert_true(fy_test_file_contains(f->log, "plan: optimizer state in pieces"));
        if (runs[i].extra[0] != NULL && strcmp(runs[i].extra[0], "--grad-slots") == 0)
            assert_true(fy_test_file_contains(f->log, fy_test_fmt("plan: %s block gradients in "
                                                                  "the pool at once",
                                                                  runs[i].extra[1])));
    }
    for (int i = 0; i < 5; i++)
        fy_trainutil_same_bits_free(&group[i]);
}

/* Width 256, two blocks, pieces of 1 MiB: a --cpu-mem that holds no whole unit's state slots
 * (54 MiB with them) has the plan put the state in pieces by itself, with fewer gradient slots
 * where it holds no more (36M, 30M: one), the same losses and weights as the whole units; the
 * export of a store in pieces, resumed to its last step, and its Hugging Face export, equal the
 * whole run's; a --cpu-mem under even that (24M) is refused before any step with the pool's
 * regions; a store of whole units (--state-piece 0, as every store made before pieces) trains. */
static void test_state_pieces_by_budget(void **state)
{
    struct fy_test_fixture *f = *state;
    struct fy_trainutil_same_bits group = {0};
    const char *whole[] = {"--state-piece", "0", NULL}, *cut[] = {"--state-piece", "1M", NULL};
    const char *none[] = {NULL}, *at36[] = {"--cpu-mem", "36M", NULL};
    const char *at30[] = {"--cpu-mem", "30M", "--clip-grad-norm", "0", NULL};
    train_pieces(f, &group, "sb-whole", "2", "256", whole, 0, none);
    assert_true(fy_test_file_contains(fy_test_fmt("%s/model.conf", fy_test_in(f, "sb-whole")),
                                      "model.state_piece") == 0);
    train_pieces(f, &group, "sb-36", "2", "256", cut, 0, at36);
    assert_true(fy_test_file_contains(f->log, "plan: optimizer state in pieces (2 units cut in "
                                              "pieces of at most 1.0 MiB"));
    train_pieces(f, &group, "sb-30", "2", "256", cut, 0, at30);
    assert_true(fy_test_file_contains(f->log, "; 1 block gradient slot (3 where --cpu-mem has "
                                              "room)"));
    /* two steps, then resumed to the third */
    const char *run = fy_test_in(f, "sb-resumed");
    char out[720], metrics[740];
    snprintf(out, sizeof out, "%s.fywt", run);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", run);
    const char *init[] = {"init", "--run-dir",     run,   "--layers", "2",  "--heads",
                          "2",    "--embd",        "256", "--ctx",    "32", "--seed",
                          "4",    "--state-piece", "1M",  NULL};
    assert_int_equal(fy_test_launch_in(f, init, 60), 0);
    assert_int_equal(fy_trainutil_train_with(f, run, f->data, "2", NULL, 0, at30), 0);
    const char *resume[] = {"resume", run, "--steps", "3", NULL};
    assert_int_equal(fy_test_launch_in(f, resume, 120), 0);
    const char *export[] = {"export", "--run-dir", run, "--out", out, NULL};
    assert_int_equal(fy_test_launch_in(f, export, 60), 0);
    size_t n;
    char *w = fy_test_slurp(out, &n), *l = fy_trainutil_losses(metrics);
    fy_trainutil_same_bits_add(&group, w, n, l);
    /* the Hugging Face exports of the store in pieces and of the whole one */
    const char *hf[2] = {"sb-30", "sb-whole"};
    char *st[2];
    size_t st_n[2];
    for (int i = 0; i < 2; i++) {
        const char *dir = fy_test_in(f, fy_test_fmt("%s.hf", hf[i]));
        const char *to_hf[] = {"export", "--run-dir", fy_test_in(f, hf[i]), "--to-hf", dir, NULL};
        assert_int_equal(fy_test_launch_in(f, to_hf, 60), 0);
        st[i] = fy_test_slurp(fy_test_fmt("%s/model.safetensors", dir), &st_n[i]);
        assert_non_null(st[i]);
    }
    assert_int_equal(st_n[0], st_n[1]);
    assert_memory_equal(st[0], st[1], st_n[0]);
    free(st[0]);
    free(st[1]);
    /* under the least pool: refused before any step, naming the regions */
    const char *at24[] = {"--cpu-mem", "24M", "--clip-grad-norm", "0", NULL};
    assert_int_not_equal(
        fy_trainutil_train_with(f, fy_test_in(f, "sb-30"), f->data, "4", NULL, 0, at24), 0);
    assert_true(fy_test_file_contains(f->log, "plan does not fit: the shared pool for training "
                                              "needs 30.0 MiB"));
    fy_trainutil_same_bits_free(&group);
}

int main(void)
{
    if (fy_trainutil_start("test_placement") != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        FY_TRAINUTIL_TEST(test_forward_waits_for_its_unit_only),
        FY_TRAINUTIL_TEST(test_updates_lowest_unit_first),
        FY_TRAINUTIL_TEST(test_fewer_gradient_slots_than_blocks),
        FY_TRAINUTIL_TEST(test_embed_update_in_two_parts),
        FY_TRAINUTIL_TEST(test_bf16_weights_agree),
        FY_TRAINUTIL_TEST(test_state_pieces_agree),
        FY_TRAINUTIL_TEST(test_state_pieces_by_budget),
        FY_TRAINUTIL_TEST(test_checkpoints_on_ssd_agree),
        FY_TRAINUTIL_TEST(test_swapped_internals_agree),
        FY_TRAINUTIL_TEST(test_act_ahead_in_trace),
        FY_TRAINUTIL_TEST(test_resident_state_matches_streaming),
        FY_TRAINUTIL_TEST(test_prefetch_depths_agree),
        FY_TRAINUTIL_TEST(test_mixed_placement_five_blocks),
    };
    struct CMUnitTest run[sizeof tests / sizeof tests[0]];
    size_t wanted = 0; /* FY_TEST_ONLY: a few of them, by name (comma-separated globs) */
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (fy_test_wanted(tests[i].name))
            run[wanted++] = tests[i];
    return _cmocka_run_group_tests("placement (integration)", run, wanted, NULL, NULL);
}
