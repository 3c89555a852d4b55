/* Integration tests of gradient clipping by global norm (--clip-grad-norm) through the real
 * processes on the CPU backend: overlap, serial and in-process bit-identical, a huge bound
 * bit-identical to no clipping, bad bounds refused, and a clipped run against the float64
 * reference with the same clipping (tests/reference/gpt_ref.py --train). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ckpt.h"
#include "common/model.h"
#include "common/tokfile.h"
#include "launcher/step/train.h"
#include "tests/refmodel.h"
#include "tests/testutil.h"
#include "tests/trainutil.h"

/* ---- gradient clipping by global norm (--clip-grad-norm) ---- */

/* A bound that clipping reaches on every step of the runs below: their gradient norm is 1.7 to 2.2
 * in the first steps (measured), so the scale varies from step to step, which AdamW (invariant to
 * one constant scale) does see. */
#define CLIP_MAX 0.6
#define CLIP_STEPS 6

static void run_metrics(const char *run, char *out, size_t len)
{
    snprintf(out, len, "%s/metrics.jsonl", run);
}

/* Clipped runs: the overlapped schedule, the serial one and the in-process run give the same
 * losses, gradient norms and weights, bit for bit; clipping engaged on every step. */
static void test_clipping_overlap_matches_serial(void **state)
{
    struct fy_test_fixture *f = *state;
    const char *names[3] = {"overlap", "serial", "inproc"};
    const char *clip[] = {"--clip-grad-norm", FY_TRAINUTIL_STR(CLIP_MAX), NULL};
    const char *clip_serial[] = {"--clip-grad-norm", FY_TRAINUTIL_STR(CLIP_MAX), "--schedule",
                                 "serial", NULL};
    char *first_w = NULL, *first_l = NULL, *first_g = NULL;
    size_t first_n = 0;
    for (int i = 0; i < 3; i++) {
        char *run = fy_test_in(f, names[i]), out[700], metrics[700];
        snprintf(out, sizeof out, "%s.fywt", run);
        run_metrics(run, metrics, sizeof metrics);
        fy_trainutil_init_model(f, run, "32", "5");
        assert_int_equal(fy_trainutil_train_with(f, run, f->data, FY_TRAINUTIL_STR(CLIP_STEPS), out,
                                                 i == 2, i == 1 ? clip_serial : clip),
                         0);
        char *l = fy_trainutil_losses(metrics),
             *g = fy_trainutil_field_values(metrics, "\"grad_norm\": ");
        size_t n;
        char *w = fy_test_slurp(out, &n);
        assert_non_null(w);
        double norms[CLIP_STEPS];
        assert_int_equal(fy_trainutil_field_numbers(metrics, "\"grad_norm\": ", norms, CLIP_STEPS),
                         CLIP_STEPS);
        for (int k = 0; k < CLIP_STEPS; k++)
            assert_true(norms[k] > CLIP_MAX); /* so every step was clipped */
        assert_true(fy_test_file_contains(f->log, "(clipped)"));
        if (first_w == NULL) {
            first_w = w;
            first_n = n;
            first_l = l;
            first_g = g;
            continue;
        }
        assert_string_equal(l, first_l);
        assert_string_equal(g, first_g);
        assert_int_equal(n, first_n);
        assert_memory_equal(w, first_w, n);
        free(l);
        free(g);
        free(w);
    }
    free(first_w);
    free(first_l);
    free(first_g);
}

/* --clip-mode: one backward pass (every block's gradient held until the norm is known, in the
 * pool or, --clip-hold gpu, in the gpu worker; the updates after the backward) gives the same losses, gradient norms and weights, bit
 * for bit, as two (the first for the norm alone), in each case below: GPT-2 and Llama, every
 * unit's state kept in the pool (--cpu-mem 1G), streamed from the store (no --cpu-mem: the blocks'
 * updates deferred to the next forward, also with a commit every step and an evaluation every
 * other, which make them early, and with an evaluation every other step alone, whose first
 * forward makes them; with --prefetch 3, which does not defer; and with bf16 weights, which the opt
 * worker converts from the masters it reads, for the norm pass and in the forward that makes a
 * deferred update), some of
 * both (2 of 4 units of a 128-wide model in 30M), the checkpoints on the store, the serial schedule, the in-process run; clipping
 * that triggers on every step (CLIP_MAX) and clipping that never does (1e6). */
struct clip_case {
    const char *name, *arch, *max;
    int inprocess;
    const char *opts[6]; /* more train options, NULL-terminated */
    /* one pass reads less from the store: every block streamed, whose update the next forward
     * makes from the state it reads (with --prefetch 3 it cannot, and with a commit every step
     * each step makes its own: the same bytes as two passes) */
    int fewer_reads;
};

static void init_case_model(struct fy_test_fixture *f, const char *run, const char *arch)
{
    if (strncmp(arch, "gpt", 3) == 0) { /* "gpt128": 128 wide */
        fy_trainutil_init_model(f, run, arch[3] ? arch + 3 : "32", "5");
        return;
    }
    const char *init[] = {"init", "--run-dir", run, "--arch", "llama", "--layers", "2", "--heads",
                          "4", "--kv-heads", "2", "--embd", "32", "--ffn", "48", "--ctx", "32",
                          "--seed", "3", NULL};
    assert_int_equal(fy_test_launch_in(f, init, 60), 0);
}

static void test_one_pass_matches_two_passes(void **state)
{
    struct fy_test_fixture *f = *state;
    static const struct clip_case cases[] = {
        {"gpt-kept", "gpt", FY_TRAINUTIL_STR(CLIP_MAX), 0, {"--cpu-mem", "1G", NULL}, 0},
        {"gpt-streamed", "gpt", FY_TRAINUTIL_STR(CLIP_MAX), 0, {NULL}, 1},
        {"gpt-streamed-commits", "gpt", FY_TRAINUTIL_STR(CLIP_MAX), 0,
         {"--checkpoint-every", "1", "--eval-every", "2", NULL}, 0}, /* each step makes them */
        {"gpt-streamed-evals", "gpt", FY_TRAINUTIL_STR(CLIP_MAX), 0, /* the evaluation's forward */
         {"--eval-every", "2", NULL}, 1},
        {"gpt-streamed-prefetch3", "gpt", FY_TRAINUTIL_STR(CLIP_MAX), 0, {"--prefetch", "3", NULL}, 0},
        {"gpt-streamed-bf16", "gpt", FY_TRAINUTIL_STR(CLIP_MAX), 0, /* converted by the opt worker */
         {"--weights-dtype", "bf16", NULL}, 1},
        {"gpt-some", "gpt128", FY_TRAINUTIL_STR(CLIP_MAX), 0, {"--cpu-mem", "30M", NULL}, 0},
        {"gpt-ckpt-ssd", "gpt", FY_TRAINUTIL_STR(CLIP_MAX), 0,
         {"--cpu-mem", "1G", "--ckpt-place", "ssd", NULL}, 0},
        {"gpt-serial", "gpt", FY_TRAINUTIL_STR(CLIP_MAX), 0,
         {"--cpu-mem", "1G", "--schedule", "serial", NULL}, 0},
        {"gpt-inprocess", "gpt", FY_TRAINUTIL_STR(CLIP_MAX), 1, {NULL}, 0},
        {"gpt-untriggered", "gpt", "1e6", 0, {"--cpu-mem", "1G", NULL}, 0},
        {"llama-kept", "llama", FY_TRAINUTIL_STR(CLIP_MAX), 0, {"--cpu-mem", "1G", NULL}, 0},
        {"llama-streamed", "llama", FY_TRAINUTIL_STR(CLIP_MAX), 0,
         {"--schedule", "serial", NULL}, 1},
        {"llama-untriggered", "llama", "1e6", 0, {NULL}, 1},
    };
    /* two passes; one with the gradients held in the pool; one with them in the gpu worker */
    static const char *const modes[3] = {"two-pass", "one-pass", "one-pass"};
    static const char *const holds[3] = {"pool", "pool", "gpu"};
    static const char *const said[3] = {
        "plan: clipping in two backward passes",
        "plan: clipping in one backward pass (--clip-mode one-pass): the blocks' gradients",
        "held in the GPU arena (each sent to the pool for its update) until the norm is known"};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const struct clip_case *k = &cases[c];
        char *w[3], *l[3], *g[3], *e[3];
        size_t n[3];
        double read[3] = {0, 0, 0};
        for (int m = 0; m < 3; m++) {
            char *run = fy_test_in(f, fy_test_fmt("%s-%s-%s", k->name, modes[m], holds[m]));
            char out[700], metrics[700];
            snprintf(out, sizeof out, "%s.fywt", run);
            run_metrics(run, metrics, sizeof metrics);
            init_case_model(f, run, k->arch);
            const char *args[14] = {"--clip-grad-norm", k->max, "--clip-mode", modes[m],
                                    "--clip-hold", holds[m]};
            unsigned a = 6;
            for (unsigned i = 0; k->opts[i] != NULL; i++)
                args[a++] = k->opts[i];
            args[a] = NULL;
            assert_int_equal(fy_trainutil_train_with(f, run, f->data, "4", out, k->inprocess,
                                                     args),
                             0);
            assert_true(fy_test_file_contains(f->log, said[m]));
            /* only the gpu worker of a run that holds them holds gradients (the profile's and
             * the other runs' hold none) */
            assert_int_equal(fy_test_count_matches(f->log, "gpu worker: the gradients of "),
                             m == 2 ? 1 : 0);
            l[m] = fy_trainutil_losses(metrics);
            g[m] = fy_trainutil_field_values(metrics, "\"grad_norm\": ");
            e[m] = fy_trainutil_field_values(metrics, "\"eval_loss\": "); /* held-out losses */
            w[m] = fy_test_slurp(out, &n[m]);
            assert_non_null(w[m]);
            double bytes[4];
            assert_int_equal(fy_trainutil_field_numbers(metrics, "\"ssd_read_bytes\": ", bytes, 4),
                             4);
            /* steps 2 and 3: the first step's forward has nothing deferred, and the last one
             * makes its own updates at its commit */
            for (int i = 1; i < 3; i++)
                read[m] += bytes[i];
            int clipped = fy_test_file_contains(f->log, "(clipped)");
            assert_int_equal(clipped, strcmp(k->max, "1e6") != 0);
        }
        print_message("%s: one pass (pool, gpu) and two: the same %zu bytes of weights; steps 2-3 "
                      "read %.0f, %.0f and %.0f bytes from the store\n", k->name, n[0], read[1],
                      read[2], read[0]);
        for (int m = 1; m < 3; m++) {
            if (k->fewer_reads)
                assert_true(read[m] < read[0]);
            else if (strstr(k->name, "streamed") != NULL)
                assert_true(read[m] == read[0]);
            assert_string_equal(l[m], l[0]);
            assert_string_equal(g[m], g[0]);
            assert_string_equal(e[m], e[0]);
            assert_int_equal(n[m], n[0]);
            assert_memory_equal(w[m], w[0], n[0]);
        }
        for (int m = 0; m < 3; m++) {
            free(w[m]);
            free(l[m]);
            free(g[m]);
            free(e[m]);
        }
    }
}

/* --clip-mode auto takes one pass where --cpu-mem holds the blocks' gradients, or else the GPU
 * arena, and the plan predicts it no slower, and says why it takes two where it does not;
 * one-pass where they do not fit is refused before any work. */
static void test_clip_mode_auto(void **state)
{
    struct fy_test_fixture *f = *state;
    char *run = fy_test_in(f, "auto");
    fy_trainutil_init_model(f, run, "32", "5");
    const char *roomy[] = {"--clip-grad-norm", "1", "--cpu-mem", "1G", NULL};
    assert_int_equal(fy_trainutil_train_with(f, run, f->data, "2", NULL, 0, roomy), 0);
    assert_true(fy_test_file_contains(f->log, "plan: clipping in one backward pass: the blocks' "
                                              "gradients ("));
    const char *plan[] = {"plan", "--run-dir", run, "--batch", "8", "--seq", "32", "--backend",
                          "cpu", "--clip-grad-norm", "1", "--cpu-mem", "1G", NULL};
    assert_int_equal(fy_test_launch_in(f, plan, 60), 0);
    assert_true(fy_test_file_contains(f->log, "plan: clipping in one backward pass"));
    const char *bad[] = {"--clip-grad-norm", "1", "--clip-mode", "sometimes", NULL};
    assert_int_equal(fy_trainutil_train_with(f, run, f->data, "3", NULL, 0, bad), 2);

    /* a 1.3B model's state fills a 12 GiB pool: no room for its 4.5 GiB of gradients there, but
     * in the GPU arena beside the working buffers (2.4 GiB of 24), with every unit kept that fits;
     * held in the pool alone (--clip-hold pool), two passes */
#define XL "plan", "--layers", "24", "--heads", "16", "--embd", "2048", "--ctx", "1024", \
           "--batch", "16", "--seq", "1024", "--backend", "cuda", "--clip-grad-norm", "1", \
           "--cpu-mem"
    const char *full[] = {XL, "12G", "--gpu-mem", "24G", NULL};
    assert_int_equal(fy_test_launch_in(f, full, 60), 0);
    assert_true(fy_test_file_contains(f->log, "plan: clipping in one backward pass: the blocks' "
                                              "gradients (4.5 GiB) held in the GPU arena (each "
                                              "sent to the pool for its update)"));
    assert_true(fy_test_file_contains(f->log, "16 of 26 units (8.2 GiB) stay in the shared pool"));
    assert_true(fy_test_file_contains(f->log, "plan: GPU: working buffers 2.4 GiB, the blocks' "
                                              "gradients 4.5 GiB (one-pass clipping) of --gpu-mem "
                                              "24.0 GiB"));
    const char *pool_only[] = {XL, "12G", "--gpu-mem", "24G", "--clip-hold", "pool", NULL};
    assert_int_equal(fy_test_launch_in(f, pool_only, 60), 0);
    assert_true(fy_test_file_contains(f->log, "plan: clipping in two backward passes, the first "
                                              "for the norm alone: one pass would hold the "
                                              "blocks' gradients (4.5 GiB), a pool of "));
    assert_true(fy_test_file_contains(f->log, "16 of 26 units (8.2 GiB) stay in the shared pool"));
    /* no room in either: two passes, saying both */
    const char *tight_gpu[] = {XL, "12G", "--gpu-mem", "6G", NULL};
    assert_int_equal(fy_test_launch_in(f, tight_gpu, 60), 0);
    assert_true(fy_test_file_contains(f->log, "and --cpu-mem is 12.0 GiB; the GPU arena has no "
                                              "room for them beside its working buffers "
                                              "(--gpu-mem 6.0 GiB)"));
    /* one-pass: the gradients first, fewer units kept; refused where even they do not fit */
    const char *forced[] = {XL, "12G", "--gpu-mem", "24G", "--clip-mode", "one-pass",
                            "--clip-hold", "pool", NULL};
    assert_int_equal(fy_test_launch_in(f, forced, 60), 0);
    assert_true(fy_test_file_contains(f->log, "plan: clipping in one backward pass (--clip-mode "
                                              "one-pass)"));
    assert_true(fy_test_file_contains(f->log, "8 of 26 units (3.7 GiB) stay in the shared pool"));
    /* one-pass, held where they have room: the GPU arena, every unit kept that fits */
    const char *forced_auto[] = {XL, "12G", "--gpu-mem", "24G", "--clip-mode", "one-pass", NULL};
    assert_int_equal(fy_test_launch_in(f, forced_auto, 60), 0);
    assert_true(fy_test_file_contains(f->log, "plan: clipping in one backward pass (--clip-mode "
                                              "one-pass): the blocks' gradients (4.5 GiB) held "
                                              "in the GPU arena"));
    assert_true(fy_test_file_contains(f->log, "16 of 26 units (8.2 GiB) stay in the shared pool"));
    const char *tight[] = {XL, "8G", "--gpu-mem", "24G", "--clip-mode", "one-pass", "--clip-hold",
                           "pool", NULL};
    assert_int_equal(fy_test_launch_in(f, tight, 60), 2);
    assert_true(fy_test_file_contains(f->log, "train would refuse it"));
    /* with room for both, the faster by the plan's rates: one pass, at B 64 (AdamW after the
     * backward costs less than a second backward of 64 sequences) and at B 16 (AdamW binds
     * either way: two passes run it after the norm pass, and the forward after it) */
    const char *b64[] = {XL, "60G", "--gpu-mem", "24G", "--batch", "64", NULL};
    assert_int_equal(fy_test_launch_in(f, b64, 60), 0);
    assert_true(fy_test_file_contains(f->log, "plan: clipping in one backward pass: the blocks' "
                                              "gradients (4.5 GiB) held in the pool"));
    const char *b16[] = {XL, "60G", "--gpu-mem", "24G", NULL};
    assert_int_equal(fy_test_launch_in(f, b16, 60), 0);
    assert_true(fy_test_file_contains(f->log, "plan: clipping in one backward pass: the blocks' "
                                              "gradients (4.5 GiB) held in the pool"));
#undef XL
}

/* A bound far above the norm changes nothing: bit-identical to an unclipped run, whose metrics
 * carry no gradient norm (computing it would cost a backward pass). */
static void test_clipping_huge_bound_is_unclipped(void **state)
{
    struct fy_test_fixture *f = *state;
    char *huge = fy_test_in(f, "huge"), *plain = fy_test_in(f, "plain");
    char *wh = fy_test_in(f, "huge.fywt"), *wp = fy_test_in(f, "plain.fywt");
    fy_trainutil_init_model(f, huge, "32", "5");
    fy_trainutil_init_model(f, plain, "32", "5");
    assert_int_equal(fy_trainutil_train(f, huge, f->data, "4", wh, 0, "--clip-grad-norm", "1e30"),
                     0);
    assert_true(fy_test_file_contains(f->log, "grad norm "));
    assert_int_equal(fy_trainutil_train(f, plain, f->data, "4", wp, 0, "--clip-grad-norm", "0"), 0);
    char mh[700], mp[700];
    run_metrics(huge, mh, sizeof mh);
    run_metrics(plain, mp, sizeof mp);
    char *lh = fy_trainutil_losses(mh), *lp = fy_trainutil_losses(mp);
    assert_string_equal(lh, lp);
    char *gh = fy_trainutil_field_values(mh, "\"grad_norm\": "),
         *gp = fy_trainutil_field_values(mp, "\"grad_norm\": ");
    assert_true(strlen(gh) > 0);
    assert_string_equal(gp, "");
    size_t nh, np;
    char *bh = fy_test_slurp(wh, &nh), *bp = fy_test_slurp(wp, &np);
    assert_non_null(bh);
    assert_non_null(bp);
    assert_int_equal(nh, np);
    assert_memory_equal(bh, bp, nh);
    free(lh);
    free(lp);
    free(gh);
    free(gp);
    free(bh);
    free(bp);
}

/* A bound that is negative or not a number is refused before anything starts: exit 2 (usage) and
 * one line that names the option. */
static void test_clipping_bad_bound_refused(void **state)
{
    struct fy_test_fixture *f = *state;
    char *run = fy_test_in(f, "run");
    fy_trainutil_init_model(f, run, "32", "1");
    const char *bad[] = {"-1", "-0.5", "abc", "0.5x", "nan", "inf", "1e999", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(
            fy_trainutil_train(f, run, f->data, "3", NULL, 0, "--clip-grad-norm", bad[i]), 2);
        char *text = fy_test_slurp(f->log, NULL);
        assert_non_null(text);
        int lines = 0;
        for (char *p = text; *p; p++)
            lines += *p == '\n';
        if (lines != 1 || strstr(text, "--clip-grad-norm") == NULL)
            fail_msg("--clip-grad-norm '%s': expected one line naming the option, got:\n%s", bad[i],
                     text);
        free(text);
    }
    /* 0 is "off", and the store is still fine */
    assert_int_equal(fy_trainutil_train(f, run, f->data, "2", NULL, 0, "--clip-grad-norm", "0"), 0);
    char metrics[700];
    run_metrics(run, metrics, sizeof metrics);
    char *g = fy_trainutil_field_values(metrics, "\"grad_norm\": ");
    assert_string_equal(g, "");
    free(g);
}

/* gpt_ref.py --train's input format (see the script's top comment). */
#define REF_TRAIN_MAGIC 0x53475946 /* "FYGS" as little-endian bytes */
#define REF_TRAIN_VERSION 1
#define REF_SEED 7

static void write_ref_input(const char *path, const struct fy_model_config *c, double max_norm,
                            const struct fy_tokfile *data, float *const *init)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    const int32_t hdr[10] = {REF_TRAIN_MAGIC, REF_TRAIN_VERSION, FY_TRAINUTIL_BATCH,
                             FY_TRAINUTIL_SEQ, (int32_t)c->n_layer, (int32_t)c->n_head,
                             (int32_t)c->n_embd, (int32_t)c->vocab, (int32_t)c->ctx, CLIP_STEPS};
    /* the float values the opt worker computes with (run.conf: beta1 0.9, beta2 0.95, eps 1e-8,
     * --weight-decay 0.1), widened exactly */
    const double hp[5] = {0.9f, 0.95f, 1e-8f, 0.1f, max_norm};
    int ok = fwrite(hdr, 4, 10, fp) == 10 && fwrite(hp, 8, 5, fp) == 5;
    struct fy_train_opts o = {.steps = CLIP_STEPS, .lr = FY_TRAINUTIL_LR,
                              .warmup = FY_TRAINUTIL_WARMUP, .min_lr_ratio = 0.1};
    for (uint64_t s = 1; s <= CLIP_STEPS; s++) {
        double lr = (float)fy_train_lr(&o, s); /* the request's lr, as the worker rounds it */
        ok &= fwrite(&lr, 8, 1, fp) == 1;
    }
    for (unsigned u = 0; u < fy_model_unit_count(c); u++)
        ok &= fwrite(init[u], 4, fy_model_unit_params(c, u), fp) == fy_model_unit_params(c, u);
    int32_t in[FY_TRAINUTIL_BATCH * FY_TRAINUTIL_SEQ], tg[FY_TRAINUTIL_BATCH * FY_TRAINUTIL_SEQ];
    for (uint64_t s = 1; s <= CLIP_STEPS; s++) {
        assert_int_equal(fy_tokfile_batch(data, FY_TOKFILE_TRAIN, 1, s, FY_TRAINUTIL_BATCH,
                                          FY_TRAINUTIL_SEQ, in, tg),
                         0);
        ok &= fwrite(in, 4, FY_TRAINUTIL_BATCH * FY_TRAINUTIL_SEQ, fp) ==
              FY_TRAINUTIL_BATCH * FY_TRAINUTIL_SEQ;
        ok &= fwrite(tg, 4, FY_TRAINUTIL_BATCH * FY_TRAINUTIL_SEQ, fp) ==
              FY_TRAINUTIL_BATCH * FY_TRAINUTIL_SEQ;
    }
    ok &= fclose(fp) == 0;
    assert_true(ok);
}

struct ref_out {
    double losses[CLIP_STEPS], norms[CLIP_STEPS];
    double *params; /* every unit, in unit order */
};

static void run_ref(const char *script, const char *in, const char *out, size_t n_params,
                    struct ref_out *r)
{
    char *argv[] = {"python3", (char *)script, "--train", (char *)in, (char *)out, NULL};
    int rc = fy_refmodel_run(argv, 300);
    if (rc != 0)
        fail_msg("%s --train %s %s exited %d", script, in, out, rc);
    size_t n;
    char *bytes = fy_test_slurp(out, &n);
    assert_non_null(bytes);
    assert_int_equal(n, 8 * (2 * CLIP_STEPS + n_params));
    memcpy(r->losses, bytes, sizeof r->losses);
    memcpy(r->norms, bytes + sizeof r->losses, sizeof r->norms);
    r->params = malloc(n_params * sizeof *r->params);
    assert_non_null(r->params);
    memcpy(r->params, bytes + sizeof r->losses + sizeof r->norms, n_params * 8);
    free(bytes);
}

/* One unit's trained weights against the reference's, at test_gpt_reference's bounds (there on
 * each gradient): every element within 1e-3 * max|change| + 1e-3 * |ref| (the absolute floor
 * scaled to how far the unit's weights moved, max|ref - init|), and the relative Frobenius error
 * of the change (ours - init against ref - init) below 1e-4. The per-element bound is on the
 * weight, not on its change: AdamW divides each gradient by its own running magnitude, so a
 * weight's change carries the relative rounding error of its gradient, which for a small gradient
 * is far above a floor scaled to the unit's largest (measured: one element of 35k at 1.2x that
 * bound on its change). Both bounds see clipping: the clipped run against the unclipped reference
 * is 1e-2 in Frobenius error, with thousands of elements outside. Returns 1 when inside; *frob gets
 * that error, *bad the elements outside. */
static int weights_close(const float *init, const float *ours, const double *ref, size_t n,
                         double *frob, size_t *bad)
{
    double max_change = 0, err2 = 0, ref2 = 0;
    for (size_t i = 0; i < n; i++)
        max_change = fmax(max_change, fabs(ref[i] - init[i]));
    *bad = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)ours[i] - ref[i]), change = ref[i] - init[i];
        if (!(e <= 1e-3 * max_change + 1e-3 * fabs(ref[i]))) /* also counts NaN */
            (*bad)++;
        err2 += e * e;
        ref2 += change * change;
    }
    *frob = ref2 > 0 ? sqrt(err2 / ref2) : (err2 > 0 ? INFINITY : 0);
    return *bad == 0 && *frob < 1e-4;
}

/* A clipped run through the worker processes against the float64 reference with the same
 * clipping, over CLIP_STEPS steps from the same initial weights and batches: the loss and the
 * gradient norm of every step within 1e-5 relative (test_gpt_reference's loss bound), and every
 * unit's weights as weights_close says. The same comparison against the reference without
 * clipping must fail for every unit, so the test does see what clipping does. Skips without
 * python3 and numpy. */
static void test_clipping_matches_reference(void **state)
{
    struct fy_test_fixture *f = *state;
    char script[4096];
    if (!fy_refmodel_python_has("numpy")) {
        print_message("skipped: python3 with numpy is needed for the float64 reference\n");
        skip();
    }
    if (fy_refmodel_script("gpt_ref.py", script, sizeof script) != 0)
        fail_msg("cannot read %s (run from the repository root, or set FUYOU_SRC)", script);
    char *run = fy_test_in(f, "clipped"), *weights = fy_test_in(f, "clipped.fywt");
    fy_trainutil_init_model(f, run, "32", FY_TRAINUTIL_STR(REF_SEED));
    const char *clip[] = {"--clip-grad-norm", FY_TRAINUTIL_STR(CLIP_MAX), NULL};
    assert_int_equal(
        fy_trainutil_train_with(f, run, f->data, FY_TRAINUTIL_STR(CLIP_STEPS), weights, 0, clip),
        0);

    struct fy_model_config c;
    uint64_t step;
    float *ours = NULL;
    assert_int_equal(fy_weights_read(weights, &c, &step, &ours), 0);
    assert_int_equal(step, CLIP_STEPS);
    unsigned units = fy_model_unit_count(&c);
    float *init[FY_REFMODEL_MAX_UNITS];
    size_t n_params = 0;
    for (unsigned u = 0; u < units; u++) {
        init[u] = malloc(fy_model_unit_params(&c, u) * sizeof(float));
        assert_non_null(init[u]);
        fy_model_init_unit(&c, u, REF_SEED, init[u]);
        n_params += fy_model_unit_params(&c, u);
    }
    struct fy_tokfile *data = NULL;
    assert_int_equal(fy_tokfile_open(&data, f->data, c.vocab), 0);
    assert_int_equal(fy_tokfile_split(data, 0.1), 0); /* --eval-fraction's default */
    char *in = fy_test_in(f, "ref-in.bin"), *in0 = fy_test_in(f, "ref-in0.bin");
    write_ref_input(in, &c, CLIP_MAX, data, init);
    write_ref_input(in0, &c, 0.0, data, init);
    fy_tokfile_close(&data);
    struct ref_out ref, unclipped;
    run_ref(script, in, fy_test_in(f, "ref-out.bin"), n_params, &ref);
    run_ref(script, in0, fy_test_in(f, "ref-out0.bin"), n_params, &unclipped);

    char metrics[700];
    run_metrics(run, metrics, sizeof metrics);
    double loss[CLIP_STEPS], norm[CLIP_STEPS];
    assert_int_equal(fy_trainutil_field_numbers(metrics, "\"loss\": ", loss, CLIP_STEPS),
                     CLIP_STEPS);
    assert_int_equal(fy_trainutil_field_numbers(metrics, "\"grad_norm\": ", norm, CLIP_STEPS),
                     CLIP_STEPS);
    int ok = 1;
    for (int s = 0; s < CLIP_STEPS; s++) {
        double el = fabs(loss[s] - ref.losses[s]) / ref.losses[s];
        double en = fabs(norm[s] - ref.norms[s]) / ref.norms[s];
        print_message("step %d: loss %.9f (reference %.9f, rel. error %.1e), grad norm %.9f "
                      "(reference %.9f, rel. error %.1e)\n",
                      s + 1, loss[s], ref.losses[s], el, norm[s], ref.norms[s], en);
        ok &= el <= 1e-5 && en <= 1e-5 && ref.norms[s] > CLIP_MAX;
    }
    size_t at = 0;
    int far_from_unclipped = 1;
    for (unsigned u = 0; u < units; u++) {
        size_t n = fy_model_unit_params(&c, u), bad, bad0;
        double frob, frob0;
        int close = weights_close(init[u], ours + at, ref.params + at, n, &frob, &bad);
        int close0 = weights_close(init[u], ours + at, unclipped.params + at, n, &frob0, &bad0);
        print_message("unit %u: weights vs reference: change's relative Frobenius error %.2e, %zu "
                      "of %zu elements out of bounds%s; vs the unclipped reference: %.2e, %zu\n",
                      u, frob, bad, n, close ? "" : "  FAILED", frob0, bad0);
        ok &= close;
        far_from_unclipped &= !close0;
        at += n;
    }
    assert_true(far_from_unclipped); /* the comparison sees clipping, in every unit */
    if (!ok)
        fail_msg("the clipped run disagrees with the float64 reference (see above)");
    for (unsigned u = 0; u < units; u++)
        free(init[u]);
    free(ours);
    free(ref.params);
    free(unclipped.params);
}

int main(void)
{
    if (fy_trainutil_start("test_clip") != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        FY_TRAINUTIL_TEST(test_clipping_overlap_matches_serial),
        FY_TRAINUTIL_TEST(test_clipping_huge_bound_is_unclipped),
        FY_TRAINUTIL_TEST(test_clipping_bad_bound_refused),
        FY_TRAINUTIL_TEST(test_clipping_matches_reference),
        FY_TRAINUTIL_TEST(test_one_pass_matches_two_passes),
        FY_TRAINUTIL_TEST(test_clip_mode_auto),
    };
    struct CMUnitTest run[sizeof tests / sizeof tests[0]];
    size_t wanted = 0; /* FY_TEST_ONLY: a few of them, by name (comma-separated globs) */
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (fy_test_wanted(tests[i].name))
            run[wanted++] = tests[i];
    return _cmocka_run_group_tests("clip (integration)", run, wanted, NULL, NULL);
}
