/* GPU test of the CUDA backend: it must produce exactly the bytes of the CPU backend, through the
 * pinned pool path (device arena in halves, D2H stream), for sizes that straddle the arena halves
 * and the kernel's grid; and it takes of device memory what `plan` says it does. Skips, saying
 * why, where the build has no CUDA or the machine no GPU. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/base/dtype.h"
#include "common/model/model.h"
#include "gpu_worker/backend.h"
#include "tests/testutil.h"

/* Small arena so large tensors go through many chunks and both halves. */
#define ARENA_BYTES (8u << 20)

static struct fy_backend *cuda, *cpu;

static void compare(int dtype, size_t n, uint64_t seed, uint64_t step)
{
    size_t bytes = n * fy_dtype_size(dtype);
    size_t alloc = (bytes + 4095) / 4096 * 4096;
    uint8_t *host = aligned_alloc(4096, alloc);
    uint8_t *ref = malloc(bytes);
    assert_non_null(host);
    assert_non_null(ref);
    memset(host, 0xa5, alloc); /* poison: every element must be written */
    assert_int_equal(fy_backend_register_host(cuda, host, alloc), 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(fy_backend_synth(cuda, seed, step, 3, dtype, n, host), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_int_equal(fy_backend_synth(cpu, seed, step, 3, dtype, n, ref), 0);
    assert_memory_equal(host, ref, bytes);
    for (size_t i = bytes; i < alloc; i++) /* nothing written past the tensor */
        assert_int_equal(host[i], 0xa5);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    print_message("%s n=%zu: identical to the CPU backend (%.2f GB/s into pinned memory)\n",
                  fy_dtype_name(dtype), n, (double)bytes / s / 1e9);
    /* re-registering another buffer needs the backend closed and reopened: keep one per test */
    fy_backend_close(&cuda);
    assert_int_equal(fy_backend_open(&cuda, "cuda", ARENA_BYTES), 0);
    free(host);
    free(ref);
}

static void test_bf16_sizes(void **state)
{
    size_t sizes[] = {1, 7, 1000, 67585, (ARENA_BYTES / 2 / 2) + 1, 50000017};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        compare(FY_DTYPE_BF16, sizes[i], 42 + i, i + 1);
}

static void test_f32_sizes(void **state)
{
    size_t sizes[] = {1, 1023, (ARENA_BYTES / 2 / 4) * 3 + 5, 25000001};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        compare(FY_DTYPE_F32, sizes[i], 7 * i + 1, 100 + i);
}

static void test_arena_budget_refused(void **state)
{
    struct fy_backend *huge = NULL;
    /* more than any GPU has: refused before work with the sizes */
    assert_int_equal(fy_backend_open(&huge, "cuda", 1ull << 50), -ENOMEM);
    assert_null(huge);
}

/* What `plan` says the backend takes of device memory (fy_backend_gpu_bytes: working buffers and
 * one block's kept internals) is what it takes: under a budget of the working buffers and exactly
 * two sets it prepares the batch and keeps exactly two blocks; a budget just under the working
 * buffers is refused at prepare. The CPU backend models nothing (0). */
static void test_gpu_bytes_are_what_prepare_and_keep_take(void **state)
{
    struct fy_model_config c = {.n_layer = 4, .n_head = 4, .n_embd = 256, .vocab = 512, .ctx = 128};
    const int B = 4, T = 128;
    uint64_t working = 0, set = 0;
    assert_int_equal(fy_backend_gpu_bytes("cpu", &c, B, T, &working, &set), 0);
    assert_true(working == 0 && set == 0);
    assert_int_equal(fy_backend_gpu_bytes("cuda", &c, B, T, &working, &set), 1);
    assert_true(working > 0 && set > 0);
    print_message("B %d x T %d: working buffers %llu bytes, a block's internals %llu bytes\n", B, T,
                  (unsigned long long)working, (unsigned long long)set);

    struct fy_backend *b = NULL;
    assert_int_equal(fy_backend_open(&b, "cuda", working + 2 * set), 0);
    assert_int_equal(fy_backend_model_prepare(b, &c, B, T), 0);
    assert_int_equal(fy_backend_model_keep(b, (int)c.n_layer), 2);
    fy_backend_close(&b);

    assert_int_equal(fy_backend_open(&b, "cuda", working - 4096), 0);
    assert_true(fy_backend_model_prepare(b, &c, B, T) < 0);
    fy_backend_close(&b);
}

int main(void)
{
    if (!fy_backend_cuda_built()) {
        printf("test_cuda_backend: SKIPPED: this build has no CUDA backend (nvcc not found)\n");
        return FY_TEST_SKIP;
    }
    if (fy_backend_open(&cuda, "cuda", ARENA_BYTES) < 0) {
        printf("test_cuda_backend: SKIPPED: no usable CUDA device on this machine\n");
        return FY_TEST_SKIP;
    }
    if (fy_backend_open(&cpu, "cpu", 0) < 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_sizes),
        cmocka_unit_test(test_f32_sizes),
        cmocka_unit_test(test_arena_budget_refused),
        cmocka_unit_test(test_gpu_bytes_are_what_prepare_and_keep_take),
    };
    int failed = cmocka_run_group_tests_name("cuda backend", tests, NULL, NULL);
    fy_backend_close(&cuda);
    fy_backend_close(&cpu);
    return failed;
}
