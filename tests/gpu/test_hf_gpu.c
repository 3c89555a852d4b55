/* GPU test of issue 7 at about a billion parameters per family, on the CUDA backend: a GPT-2 (18
 * layers, 2048 wide, 16 heads, GPT-2's vocabulary: 1.01B parameters) and a Llama of
 * Llama-3.2-1B's shape with 12 of its 16 layers (2048 wide, 32 heads, 8 kv heads, MLP 8192,
 * vocabulary 128256, tied head, rope theta 500000 with llama3 scaling of factor 32 over 8192
 * positions: 0.99B parameters; fewer layers to keep the test near three minutes), and the
 * Llama-like families at the shapes people fine-tune (Qwen2.5-0.5B and Qwen3-0.6B whole, a
 * 0.5B Mistral with a window of 128 below the sequence of 256, a 1.1B Phi-3 of Phi-3-mini's
 * blocks with its fused tensors and window 2047), each made with
 * random weights by transformers (tests/reference/hf_gpt2.py, hf_llama.py) and saved in bf16:
 * `fuyou-launch init --from-hf` (one copy of the state), the first step's loss of `train --backend
 * cuda` against transformers' loss on the same batch, ten training steps, `export --to-hf`, and
 * transformers loading the export (no missing or unexpected tensor, the weights not the imported
 * ones) and reproducing the held-out loss train reported after its last update. The data are
 * skewed random tokens (low ids frequent), so those ten steps move the held-out loss.
 *
 * Tolerance: each loss within 2e-3 relative of transformers'. Both sides compute with the same
 * bf16 weights (the source is bf16; the export writes in bf16 the weights the CUDA backend rounded
 * to bf16 the same way, to nearest even, from the fp32 master), transformers in fp32 (on the GPU
 * when torch has CUDA, else on the CPU), the CUDA backend with bf16 activations and fp32
 * accumulation: the CUDA-against-CPU bound of test_cuda_train (2e-3 relative per step, measured
 * about 4e-4), and each token's rounding errors average out over a batch of 1024 tokens.
 *
 * Skips (77), saying why, without a CUDA device or without python3's torch and transformers.
 * Needs about 16 GB of disk under $TMPDIR (or /tmp) for the larger store, and --cpu-mem 48G of
 * memory for the pool. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu_worker/backend.h"
#include "tests/refmodel.h"
#include "tests/testutil.h"

#define LOSS_TOL 2e-3
#define STEPS 10
#define LOSS_ARGS " --batch 4 --seq 256 --eval-fraction 0.1 --seed 1"

static const char *torch_device = "cuda"; /* where transformers makes and evaluates the models */

struct family {
    const char *name, *script;
    const char *make; /* the make command's shape options */
    unsigned vocab;
};

static const struct family gpt2 = {
    "GPT-2 1.01B", "hf_gpt2.py", "--layers 18 --heads 16 --embd 2048 --vocab 50257 --ctx 1024",
    50257};
static const struct family llama = {
    "Llama-3.2-1B shape, 12 layers, 0.99B", "hf_llama.py",
    "--layers 12 --heads 32 --kv-heads 8 --embd 2048 --ffn 8192 --vocab 128256 --ctx 131072 "
    "--llama3 --rope-factor 32 --rope-original-max 8192 --tied",
    128256};
/* the Llama-like families at the shapes people fine-tune (Qwen2.5-0.5B, Qwen3-0.6B whole; Mistral
 * and Phi-3 blocks at ~0.5B and ~1B with their windows: Mistral's smaller than the sequence) */
static const struct family qwen2 = {
    "Qwen2.5-0.5B shape, 0.49B", "hf_llama.py",
    "--family qwen2 --layers 24 --heads 14 --kv-heads 2 --embd 896 --ffn 4864 --vocab 151936 "
    "--ctx 32768 --tied",
    151936};
static const struct family qwen3 = {
    "Qwen3-0.6B shape, 0.6B", "hf_llama.py",
    "--family qwen3 --layers 28 --heads 16 --kv-heads 8 --embd 1024 --head-dim 128 --ffn 3072 "
    "--vocab 151936 --ctx 40960 --tied",
    151936};
static const struct family mistral = {
    "Mistral shape, 16 layers, window 128, 0.5B", "hf_llama.py",
    "--family mistral --layers 16 --heads 16 --kv-heads 4 --embd 1536 --head-dim 128 --ffn 4096 "
    "--vocab 32768 --ctx 32768 --window 128",
    32768};
static const struct family phi3 = {
    "Phi-3-mini-4k shape, 8 layers, 1.1B", "hf_llama.py",
    "--family phi3 --layers 8 --heads 32 --kv-heads 32 --embd 3072 --ffn 8192 --vocab 32064 "
    "--ctx 4096 --window 2047",
    32064};

static int setup(void **state) { return fy_test_setup(state, "hfgpu", NULL); }
static int teardown(void **state) { return fy_test_teardown(state); }

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The family's reference script's commands in one Python process; fails the test when it fails. */
static int python_run(const struct family *fam, const char *const *commands, double *losses,
                      int max)
{
    char script[4096];
    assert_int_equal(fy_refmodel_script(fam->script, script, sizeof script), 0);
    int n = fy_test_python_run(script, commands, losses, max);
    assert_true(n >= 0);
    return n;
}

static void launch(struct fy_test_fixture *f, const char *what, const char *const *args)
{
    double t0 = now_s();
    int rc = fy_test_launch_in(f, args, 600);
    printf("test_hf_gpu:   %s: exit %d in %.1f s\n", what, rc, now_s() - t0);
    if (rc != 0) {
        fy_test_file_contains(f->log, "(the log of the failed launch)");
        fail_msg("fuyou-launch %s failed (exit %d)", args[0], rc);
    }
}

static double metric(const char *run, int step, const char *key)
{
    double v = 0;
    assert_int_equal(fy_refmodel_metric(run, step, key, &v), 0);
    return v;
}

static void family_case(struct fy_test_fixture *f, const struct family *fam)
{
    char *src = fy_test_in(f, "src"), *run = fy_test_in(f, "run"), *out = fy_test_in(f, "out");
    double t0 = now_s();
    const char *make[] = {
        fy_test_fmt("tokens %s --vocab %u --count 65536 --seed 3 --skew 3", f->data, fam->vocab),
        fy_test_fmt("make %s --seed 5 --dtype bf16 --device %s %s", src, torch_device, fam->make),
        NULL};
    python_run(fam, make, NULL, 0);
    printf("test_hf_gpu: %s: made by transformers in %.1f s\n", fam->name, now_s() - t0);
    const char *init[] = {"init", "--run-dir", run, "--from-hf", src, "--state-copies", "1",
                          NULL};
    launch(f, "init --from-hf", init);
    const char *train[] = {"train", "--run-dir", run, "--data", f->data,
                           "--steps", fy_test_fmt("%d", STEPS), "--batch", "4", "--seq", "256",
                           "--eval-fraction", "0.1", "--eval-batches", "2", "--lr", "3e-4",
                           "--warmup", "0", "--seed", "1", "--backend", "cuda", "--cpu-mem", "48G",
                           NULL};
    launch(f, "train --backend cuda", train);
    assert_true(fy_test_file_contains(fy_test_fmt("%s/fuyou.log", run), "backend cuda on"));
    double first = metric(run, 1, "\"loss\": "), held_out = metric(run, STEPS, "\"eval_loss\": ");
    const char *export_[] = {"export", "--run-dir", run, "--to-hf", out, NULL};
    launch(f, "export --to-hf", export_);
    t0 = now_s();
    const char *check[] = {
        fy_test_fmt("loss %s %s --train-step 1 --device %s" LOSS_ARGS, src, f->data, torch_device),
        fy_test_fmt("loss %s %s --eval-batches 2 --device %s" LOSS_ARGS, out, f->data,
                    torch_device),
        fy_test_fmt("loss %s %s --eval-batches 2 --device %s" LOSS_ARGS, src, f->data,
                    torch_device),
        fy_test_fmt("compare %s %s --expect-different", src, out), NULL};
    double theirs[3];
    assert_int_equal(python_run(fam, check, theirs, 3), 3);
    printf("test_hf_gpu: %s: transformers' checks in %.1f s\n", fam->name, now_s() - t0);
    printf("test_hf_gpu: %s: step 1 loss %.6f here, %.6f in transformers (relative difference "
           "%.2e, limit %.0e)\n",
           fam->name, first, theirs[0], fabs(first - theirs[0]) / theirs[0], LOSS_TOL);
    printf("test_hf_gpu: %s: held-out loss after step %d %.6f here, %.6f in transformers on the "
           "export (relative difference %.2e, limit %.0e); the imported model's: %.6f\n",
           fam->name, STEPS, held_out, theirs[1], fabs(held_out - theirs[1]) / theirs[1],
           LOSS_TOL, theirs[2]);
    assert_true(isfinite(first) && isfinite(held_out));
    assert_true(fabs(first - theirs[0]) <= LOSS_TOL * theirs[0]);
    assert_true(fabs(held_out - theirs[1]) <= LOSS_TOL * theirs[1]);
}

static void test_gpt2_1b(void **state) { family_case(*state, &gpt2); }
static void test_llama_1b(void **state) { family_case(*state, &llama); }
static void test_qwen2(void **state) { family_case(*state, &qwen2); }
static void test_qwen3(void **state) { family_case(*state, &qwen3); }
static void test_mistral(void **state) { family_case(*state, &mistral); }
static void test_phi3(void **state) { family_case(*state, &phi3); }

/* 0 when python3's torch sees a CUDA device. */
static int torch_has_cuda(void)
{
    char *const argv[] = {"python3", "-c",
                          "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)",
                          NULL};
    return fy_refmodel_run(argv, 120);
}

int main(void)
{
    signal(SIGCHLD, SIG_DFL);
    if (!fy_backend_cuda_built()) {
        printf("test_hf_gpu: SKIPPED: this build has no CUDA backend (nvcc not found)\n");
        return FY_TEST_SKIP;
    }
    if (strcmp(fy_backend_resolve("auto"), "cuda") != 0) {
        printf("test_hf_gpu: SKIPPED: no usable CUDA device on this machine\n");
        return FY_TEST_SKIP;
    }
    if (!fy_refmodel_python_has("torch, transformers, safetensors")) {
        printf("test_hf_gpu: SKIPPED: python3 with torch, transformers and safetensors is "
               "needed\n");
        return FY_TEST_SKIP;
    }
    if (access(fy_test_bin("fuyou-launch"), X_OK) != 0) {
        fprintf(stderr, "test_hf_gpu: run from the repository root after make\n");
        return 1;
    }
    if (torch_has_cuda() != 0) {
        torch_device = "cpu";
        printf("test_hf_gpu: torch sees no CUDA device: transformers makes and evaluates the "
               "models on the CPU (slower)\n");
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_gpt2_1b, setup, teardown),
        cmocka_unit_test_setup_teardown(test_llama_1b, setup, teardown),
        cmocka_unit_test_setup_teardown(test_qwen2, setup, teardown),
        cmocka_unit_test_setup_teardown(test_qwen3, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mistral, setup, teardown),
        cmocka_unit_test_setup_teardown(test_phi3, setup, teardown),
    };
    struct CMUnitTest run[sizeof tests / sizeof tests[0]];
    size_t wanted = 0; /* FY_TEST_ONLY: some of them, by name (comma-separated globs) */
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (fy_test_wanted(tests[i].name))
            run[wanted++] = tests[i];
    return _cmocka_run_group_tests("Hugging Face models at 0.5-1B on the GPU", run, wanted, NULL,
                                   NULL);
}
