/* GPU test of the GPT-2 family's units on the CUDA backend, gpu_worker/cuda/cu_gpt2_units.cu
 * (contract: cu_gpt2_units.h): a backward from the internals its forward kept must give the same
 * bytes as a backward that recomputes the block from its input, must not run the forward again,
 * and must not depend on the units' own scratch (other blocks run in between); a kept set that
 * does not fit the arena takes nothing. Exact comparison is right here: both paths run the same
 * kernels on the same inputs, and every kernel is deterministic. The numerics of the blocks
 * themselves are tested against the CPU backend (test_cuda_gpt) and PyTorch (test_cuda_torch), its
 * kernels by test_cu_kernels, test_cu_attention and test_cu_flash, and the host interface over
 * these units by test_cu_model. Exits 77 (skipped) without a GPU. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
extern "C" {
#include <cmocka.h>
}

#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "common/base/dtype.h"
#include "common/model/model.h"
#include "gpu_worker/cuda/cu_arena.h"
#include "gpu_worker/cuda/cu_gpt2_units.h"
#include "gpu_worker/cuda/cu_model.h"
#include "tests/testutil.h"

using std::vector;

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t ck_err_ = (call);                                                              \
        if (ck_err_ != cudaSuccess)                                                                \
            fail_msg("%s:%d: %s: CUDA error %s", __FILE__, __LINE__, #call,                        \
                     cudaGetErrorString(ck_err_));                                                 \
    } while (0)

/* Head size 48 and T = 37: neither is a multiple of the attention kernels' tiles. */
static const struct fy_model_config cfg = {2, 2, 96, 131, 64};
static const int B = 3, T = 37;

static bf16 *device_random(size_t n, uint64_t seed, float scale)
{
    vector<uint16_t> h(n); /* bf16 bit patterns */
    for (size_t i = 0; i < n; i++)
        h[i] = fy_f32_to_bf16(fy_test_uniform(&seed, -scale, scale));
    bf16 *d = NULL;
    CK(cudaMalloc(&d, n * sizeof(bf16)));
    CK(cudaMemcpy(d, h.data(), n * sizeof(bf16), cudaMemcpyHostToDevice));
    return d;
}

template <typename E> static vector<E> download(const E *d, size_t n, cudaStream_t s)
{
    vector<E> h(n);
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(h.data(), d, n * sizeof(E), cudaMemcpyDeviceToHost));
    return h;
}

/* The units of a GPT-2 model made by cu_model (which lends them its stream and products' handle),
 * with room for extra_sets sets of internals beside the model's buffers. */
struct fixture {
    struct fy_cu_arena arena;
    struct fy_cu_model *m;
    struct fy_cu_gpt2 *u;
    cudaStream_t s;
    size_t NC, P;
    bf16 *w[3], *x[3], *dy, *dx;
    float *dw;
};

static void setup(struct fixture *f, size_t extra_sets)
{
    memset(f, 0, sizeof *f);
    size_t bytes =
        fy_cu_model_arena_bytes(&cfg, B, T) + extra_sets * fy_cu_gpt2_acts_bytes(&cfg, B, T);
    assert_int_equal(fy_cu_arena_init(&f->arena, bytes), 0);
    assert_int_equal(fy_cu_model_new(&f->m, &f->arena, &cfg, B, T), 0);
    f->u = (struct fy_cu_gpt2 *)fy_cu_model_units(f->m, &fy_cu_family_gpt2);
    assert_non_null(f->u);
    f->s = fy_cu_model_stream(f->m);
    f->NC = (size_t)B * T * cfg.n_embd;
    f->P = fy_model_unit_params(&cfg, 1);
    for (int l = 1; l <= 2; l++)
        f->w[l] = device_random(f->P, 100 + l, 0.2f);
    f->x[0] = device_random(f->NC, 7, 1.0f);
    for (int l = 1; l <= 2; l++)
        CK(cudaMalloc(&f->x[l], f->NC * sizeof(bf16)));
    f->dy = device_random(f->NC, 8, 1.0f);
    CK(cudaMalloc(&f->dx, f->NC * sizeof(bf16)));
    CK(cudaMalloc(&f->dw, f->P * sizeof(float)));
}

static void teardown(struct fixture *f)
{
    for (int l = 0; l <= 2; l++) {
        cudaFree(f->x[l]);
        if (l)
            cudaFree(f->w[l]);
    }
    cudaFree(f->dy);
    cudaFree(f->dx);
    cudaFree(f->dw);
    fy_cu_model_destroy(&f->m);
    fy_cu_arena_release(&f->arena);
}

/* Backward of block l (input x[l-1]) into host copies of dx and dweights. */
static void backward(struct fixture *f, int l, struct fy_cu_gpt2_acts *kept, vector<bf16> *dx,
                     vector<float> *dw)
{
    assert_int_equal(
        fy_cu_gpt2_block_backward(f->u, f->w[l], NULL, f->x[l - 1], f->dy, f->dx, f->dw, kept), 0);
    *dx = download(f->dx, f->NC, f->s);
    *dw = download(f->dw, f->P, f->s);
}

static void test_kept_equals_recomputed(void **state)
{
    (void)state;
    struct fixture f;
    setup(&f, 2);
    struct fy_cu_gpt2_acts kept[3];
    for (int l = 1; l <= 2; l++)
        assert_int_equal(fy_cu_gpt2_acts_take(f.u, &f.arena, &kept[l]), 0);
    /* forward through both blocks, keeping each block's internals in its own set */
    for (int l = 1; l <= 2; l++)
        assert_int_equal(fy_cu_gpt2_block_forward(f.u, f.w[l], NULL, f.x[l - 1], f.x[l], &kept[l]),
                         0);
    vector<bf16> y_kept = download(f.x[2], f.NC, f.s);
    /* block 1 from its kept set, after block 2's forward has come and gone: the set, not the
     * unit's scratch, must carry it; and no forward op may run in a kept backward */
    fy_cu_gpt2_set_timing(f.u, 1);
    vector<bf16> dx1_kept, dx1_re, dx2_kept, dx2_re;
    vector<float> dw1_kept, dw1_re, dw2_kept, dw2_re;
    backward(&f, 2, &kept[2], &dx2_kept, &dw2_kept);
    backward(&f, 1, &kept[1], &dx1_kept, &dw1_kept);
    const struct fy_cu_gpt2_op *ops;
    int n = fy_cu_gpt2_timings(f.u, &ops);
    assert_true(n > 0);
    for (int i = 0; i < n; i++) {
        print_message("kept backward ran %-22s %.3f ms\n", ops[i].name, ops[i].ms);
        assert_null(strstr(ops[i].name, "fwd"));
    }
    fy_cu_gpt2_set_timing(f.u, 0);
    /* the same backwards recomputing each block, and the same forward without keeping */
    backward(&f, 2, NULL, &dx2_re, &dw2_re);
    backward(&f, 1, NULL, &dx1_re, &dw1_re);
    for (int l = 1; l <= 2; l++)
        assert_int_equal(fy_cu_gpt2_block_forward(f.u, f.w[l], NULL, f.x[l - 1], f.x[l], NULL), 0);
    vector<bf16> y_re = download(f.x[2], f.NC, f.s);
    assert_memory_equal(y_kept.data(), y_re.data(), f.NC * sizeof(bf16));
    assert_memory_equal(dx2_kept.data(), dx2_re.data(), f.NC * sizeof(bf16));
    assert_memory_equal(dw2_kept.data(), dw2_re.data(), f.P * sizeof(float));
    assert_memory_equal(dx1_kept.data(), dx1_re.data(), f.NC * sizeof(bf16));
    assert_memory_equal(dw1_kept.data(), dw1_re.data(), f.P * sizeof(float));
    /* and the two blocks' gradients differ, so the comparison above is not vacuous */
    assert_memory_not_equal(dw1_kept.data(), dw2_kept.data(), f.P * sizeof(float));
    teardown(&f);
}

static void test_set_that_does_not_fit(void **state)
{
    (void)state;
    struct fixture f;
    setup(&f, 1);
    struct fy_cu_gpt2_acts a, b;
    assert_int_equal(fy_cu_gpt2_acts_take(f.u, &f.arena, &a), 0);
    size_t used = f.arena.used;
    assert_int_equal(fy_cu_gpt2_acts_take(f.u, &f.arena, &b), -ENOMEM);
    assert_int_equal(f.arena.used, used);
    assert_null(b.ln1);
    teardown(&f);
}

int main(void)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        printf("test_cu_gpt2: SKIPPED: no usable CUDA device (cudaGetDeviceCount: %s, %d "
               "devices)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "ok", count);
        return FY_TEST_SKIP;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kept_equals_recomputed),
        cmocka_unit_test(test_set_that_does_not_fit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
