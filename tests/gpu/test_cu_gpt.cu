/* GPU test of gpu_worker/cuda/cu_gpt.cu's device-level blocks (contract: cu_gpt.h): a backward
 * from the internals its forward kept must give the same bytes as a backward that recomputes the
 * block from its input, must not run the forward again, and must not depend on the unit's own
 * scratch (other blocks run in between); a kept set that does not fit the arena takes nothing.
 * The host interface's queue: calls in flight give the same bytes as calls completed one by one,
 * a finished call reports the device time of its copies, and a call whose input is the output of
 * the call in flight before it waits for that output (the pipeline's every step).
 * Exact comparison is right here: both paths run the same kernels on the same inputs, and every
 * kernel is deterministic. The numerics of the blocks themselves are tested against the CPU
 * backend (test_cuda_gpt) and PyTorch (test_cuda_torch). Exits 77 (skipped) without a GPU. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
extern "C" {
#include <cmocka.h>
}

#include <cuda_runtime.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "common/dtype.h"
#include "common/model.h"
#include "gpu_worker/cuda/cu_arena.h"
#include "gpu_worker/cuda/cu_gpt.h"
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
static const struct fy_gpt_config cfg = {2, 2, 96, 131, 64};
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

struct fixture {
    struct fy_cu_arena arena;
    struct fy_cu_gpt *g;
    cudaStream_t s;
    size_t NC, P;
    bf16 *w[3], *x[3], *dy, *dx;
    float *dw;
};

static void setup(struct fixture *f, size_t extra_sets)
{
    memset(f, 0, sizeof *f);
    size_t bytes = fy_cu_gpt_arena_bytes(&cfg, B, T) + extra_sets * fy_cu_gpt_acts_bytes(&cfg, B, T);
    assert_int_equal(fy_cu_arena_init(&f->arena, bytes), 0);
    assert_int_equal(fy_cu_gpt_new(&f->g, &f->arena, &cfg, B, T), 0);
    f->s = fy_cu_gpt_stream(f->g);
    f->NC = (size_t)B * T * cfg.n_embd;
    f->P = fy_gpt_unit_params(&cfg, 1);
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
    fy_cu_gpt_destroy(&f->g);
    fy_cu_arena_release(&f->arena);
}

/* Backward of block l (input x[l-1]) into host copies of dx and dweights. */
static void backward(struct fixture *f, int l, struct fy_cu_gpt_acts *kept, vector<bf16> *dx,
                     vector<float> *dw)
{
    assert_int_equal(fy_cu_gpt_dev_block_backward(f->g, f->w[l], f->x[l - 1], f->dy, f->dx, f->dw, kept), 0);
    *dx = download(f->dx, f->NC, f->s);
    *dw = download(f->dw, f->P, f->s);
}

static void test_kept_equals_recomputed(void **state)
{
    (void)state;
    struct fixture f;
    setup(&f, 2);
    struct fy_cu_gpt_acts kept[3];
    for (int l = 1; l <= 2; l++)
        assert_int_equal(fy_cu_gpt_acts_take(f.g, &f.arena, &kept[l]), 0);
    /* forward through both blocks, keeping each block's internals in its own set */
    for (int l = 1; l <= 2; l++)
        assert_int_equal(fy_cu_gpt_dev_block_forward(f.g, f.w[l], f.x[l - 1], f.x[l], &kept[l]), 0);
    vector<bf16> y_kept = download(f.x[2], f.NC, f.s);
    /* block 1 from its kept set, after block 2's forward has come and gone: the set, not the
     * unit's scratch, must carry it; and no forward op may run in a kept backward */
    fy_cu_gpt_set_timing(f.g, 1);
    vector<bf16> dx1_kept, dx1_re, dx2_kept, dx2_re;
    vector<float> dw1_kept, dw1_re, dw2_kept, dw2_re;
    backward(&f, 2, &kept[2], &dx2_kept, &dw2_kept);
    backward(&f, 1, &kept[1], &dx1_kept, &dw1_kept);
    const struct fy_cu_gpt_op *ops;
    int n = fy_cu_gpt_timings(f.g, &ops);
    assert_true(n > 0);
    for (int i = 0; i < n; i++) {
        print_message("kept backward ran %-22s %.3f ms\n", ops[i].name, ops[i].ms);
        assert_null(strstr(ops[i].name, "fwd"));
    }
    fy_cu_gpt_set_timing(f.g, 0);
    /* the same backwards recomputing each block, and the same forward without keeping */
    backward(&f, 2, NULL, &dx2_re, &dw2_re);
    backward(&f, 1, NULL, &dx1_re, &dw1_re);
    for (int l = 1; l <= 2; l++)
        assert_int_equal(fy_cu_gpt_dev_block_forward(f.g, f.w[l], f.x[l - 1], f.x[l], NULL), 0);
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

/* fp32 host buffers in pinned memory, as the pool is */
static float *pinned_random(size_t n, uint64_t seed, float scale)
{
    float *h = NULL;
    CK(cudaHostAlloc((void **)&h, n * sizeof(float), cudaHostAllocDefault));
    for (size_t i = 0; i < n; i++)
        h[i] = fy_test_uniform(&seed, -scale, scale);
    return h;
}

/* The host interface queues: two calls in flight give the same bytes as the same calls completed
 * one by one, a third is refused, outputs (the head's loss too) are written by finish, and the
 * ready descriptor says when finishing needs no wait. */
static void test_queued_host_calls(void **state)
{
    (void)state;
    struct fixture f;
    setup(&f, 0);
    size_t P = f.P, NC = f.NC, N = (size_t)B * T;
    float *w1 = pinned_random(P, 1, 0.2f), *w2 = pinned_random(P, 2, 0.2f);
    float *x = pinned_random(NC, 3, 1.0f), *out[4];
    for (int i = 0; i < 4; i++)
        out[i] = pinned_random(NC, 10 + i, 1.0f);
    size_t fin_n = fy_gpt_unit_params(&cfg, cfg.n_layer + 1), emb_n = fy_gpt_unit_params(&cfg, 0);
    float *fin = pinned_random(fin_n, 4, 0.2f), *emb = pinned_random(emb_n, 5, 0.2f);
    int32_t *targets = NULL;
    CK(cudaHostAlloc((void **)&targets, N * sizeof(int32_t), cudaHostAllocDefault));
    for (size_t i = 0; i < N; i++)
        targets[i] = (int32_t)(i * 7 % cfg.vocab);
    /* one by one */
    assert_int_equal(fy_cu_gpt_block_forward(f.g, 0, w1, x, out[0]), 0);
    struct fy_cu_gpt_copy_times times = {-1, -1};
    assert_int_equal(fy_cu_gpt_finish(f.g, &times), 0);
    print_message("block forward: uploads %.3f ms, downloads %.3f ms (device time)\n", times.h2d_ms,
                  times.d2h_ms);
    assert_true(times.h2d_ms > 0 && times.h2d_ms < 1000);
    assert_true(times.d2h_ms > 0 && times.d2h_ms < 1000);
    assert_int_equal(fy_cu_gpt_block_forward(f.g, 0, w2, x, out[1]), 0);
    assert_int_equal(fy_cu_gpt_finish(f.g, NULL), 0);
    double loss_sync = -1;
    assert_int_equal(fy_cu_gpt_head(f.g, fin, emb, x, targets, &loss_sync, NULL, NULL, NULL), 0);
    assert_int_equal(fy_cu_gpt_finish(f.g, NULL), 0);
    assert_true(loss_sync > 0);
    /* two in flight */
    assert_int_equal(fy_cu_gpt_block_forward(f.g, 0, w1, x, out[2]), 0);
    assert_int_equal(fy_cu_gpt_block_forward(f.g, 0, w2, x, out[3]), 0);
    assert_int_equal(fy_cu_gpt_pending(f.g), 2);
    assert_int_equal(fy_cu_gpt_block_forward(f.g, 0, w1, x, out[0]), -EBUSY);
    struct pollfd pfd = {fy_cu_gpt_ready_fd(f.g), POLLIN, 0};
    assert_int_equal(poll(&pfd, 1, 20000), 1); /* the first call's results come home */
    assert_int_equal(fy_cu_gpt_finish(f.g, NULL), 0);
    assert_int_equal(fy_cu_gpt_finish(f.g, NULL), 0);
    assert_int_equal(fy_cu_gpt_pending(f.g), 0);
    assert_int_equal(fy_cu_gpt_finish(f.g, NULL), -EINVAL);
    assert_memory_equal(out[0], out[2], NC * sizeof(float));
    assert_memory_equal(out[1], out[3], NC * sizeof(float));
    assert_memory_not_equal(out[2], out[3], NC * sizeof(float));
    /* the head's loss is written when the call is finished, not before */
    double loss = -1;
    assert_int_equal(fy_cu_gpt_block_forward(f.g, 0, w1, x, out[2]), 0);
    assert_int_equal(fy_cu_gpt_head(f.g, fin, emb, x, targets, &loss, NULL, NULL, NULL), 0);
    assert_int_equal(fy_cu_gpt_finish(f.g, NULL), 0);
    assert_true(loss == -1);
    assert_int_equal(fy_cu_gpt_finish(f.g, NULL), 0);
    assert_true(loss == loss_sync);
    for (float *p : {w1, w2, x, out[0], out[1], out[2], out[3], fin, emb})
        cudaFreeHost(p);
    cudaFreeHost(targets);
    teardown(&f);
}

/* The layer-by-layer pipeline feeds each unit's output to the next: a call queued behind another
 * may take its input from the host buffer the other is still downloading into. The activation the
 * call in flight hands on is taken from its device copy; any other such input waits for the
 * download. Large enough that the first call is still computing when the second one's uploads
 * start; the outputs are poisoned (NaN) beforehand, so an input read too early would show. */
static void test_chained_queued_calls(void **state)
{
    (void)state;
    const struct fy_gpt_config big = {1, 8, 1024, 131, 512};
    const int BB = 4, TT = 512;
    struct fy_cu_arena arena;
    struct fy_cu_gpt *g = NULL;
    assert_int_equal(fy_cu_arena_init(&arena, fy_cu_gpt_arena_bytes(&big, BB, TT)), 0);
    assert_int_equal(fy_cu_gpt_new(&g, &arena, &big, BB, TT), 0);
    size_t P = fy_gpt_unit_params(&big, 1), NC = (size_t)BB * TT * big.n_embd;
    float *w1 = pinned_random(P, 21, 0.05f), *w2 = pinned_random(P, 22, 0.05f);
    float *x = pinned_random(NC, 23, 1.0f), *dy = pinned_random(NC, 24, 1.0f);
    float *y1s = pinned_random(NC, 0, 1), *y2s = pinned_random(NC, 0, 1);
    float *y1 = pinned_random(NC, 0, 1), *y2 = pinned_random(NC, 0, 1);
    float *dx2s = pinned_random(NC, 0, 1), *dx1s = pinned_random(NC, 0, 1);
    float *dx2 = pinned_random(NC, 0, 1), *dx1 = pinned_random(NC, 0, 1);
    float *dw2s = pinned_random(P, 0, 1), *dw1s = pinned_random(P, 0, 1);
    float *dw2 = pinned_random(P, 0, 1), *dw1 = pinned_random(P, 0, 1);
    /* one by one: forward through two blocks, backward through both */
    assert_int_equal(fy_cu_gpt_block_forward(g, 0, w1, x, y1s), 0);
    assert_int_equal(fy_cu_gpt_finish(g, NULL), 0);
    assert_int_equal(fy_cu_gpt_block_forward(g, 0, w2, y1s, y2s), 0);
    assert_int_equal(fy_cu_gpt_finish(g, NULL), 0);
    assert_int_equal(fy_cu_gpt_block_backward(g, 0, w2, y1s, dy, dx2s, dw2s), 0);
    assert_int_equal(fy_cu_gpt_finish(g, NULL), 0);
    assert_int_equal(fy_cu_gpt_block_backward(g, 0, w1, x, dx2s, dx1s, dw1s), 0);
    assert_int_equal(fy_cu_gpt_finish(g, NULL), 0);
    /* queued two deep, each call's input the output of the call still in flight */
    memset(y1, 0xff, NC * sizeof(float));
    memset(y2, 0xff, NC * sizeof(float));
    memset(dx2, 0xff, NC * sizeof(float));
    assert_int_equal(fy_cu_gpt_block_forward(g, 0, w1, x, y1), 0);
    assert_int_equal(fy_cu_gpt_block_forward(g, 0, w2, y1, y2), 0);
    assert_int_equal(fy_cu_gpt_finish(g, NULL), 0);
    assert_int_equal(fy_cu_gpt_block_backward(g, 0, w2, y1, dy, dx2, dw2), 0);
    assert_int_equal(fy_cu_gpt_finish(g, NULL), 0);
    assert_int_equal(fy_cu_gpt_block_backward(g, 0, w1, x, dx2, dx1, dw1), 0);
    assert_int_equal(fy_cu_gpt_finish(g, NULL), 0);
    assert_int_equal(fy_cu_gpt_finish(g, NULL), 0);
    assert_memory_equal(y1, y1s, NC * sizeof(float));
    assert_memory_equal(y2, y2s, NC * sizeof(float));
    assert_memory_equal(dx2, dx2s, NC * sizeof(float));
    assert_memory_equal(dx1, dx1s, NC * sizeof(float));
    assert_memory_equal(dw2, dw2s, P * sizeof(float));
    assert_memory_equal(dw1, dw1s, P * sizeof(float));
    /* an input that is not the activation the call in flight hands on, but another of its outputs
     * (here its weight gradient, as weights): the upload waits for that download */
    assert_int_equal(fy_cu_gpt_block_forward(g, 0, dw1s, x, y1s), 0);
    assert_int_equal(fy_cu_gpt_finish(g, NULL), 0);
    memset(dw1, 0xff, P * sizeof(float));
    memset(y1, 0xff, NC * sizeof(float));
    assert_int_equal(fy_cu_gpt_block_backward(g, 0, w1, x, dx2s, dx1, dw1), 0);
    assert_int_equal(fy_cu_gpt_block_forward(g, 0, dw1, x, y1), 0);
    assert_int_equal(fy_cu_gpt_finish(g, NULL), 0);
    assert_int_equal(fy_cu_gpt_finish(g, NULL), 0);
    assert_memory_equal(dw1, dw1s, P * sizeof(float));
    assert_memory_equal(y1, y1s, NC * sizeof(float));
    for (float *p : {w1, w2, x, dy, y1s, y2s, y1, y2, dx2s, dx1s, dx2, dx1, dw2s, dw1s, dw2, dw1})
        cudaFreeHost(p);
    fy_cu_gpt_destroy(&g);
    fy_cu_arena_release(&arena);
}

/* Kept layers through the host interface: with room for one set beside the working buffers,
 * fy_cu_gpt_keep_layers keeps the top block only. Its backward uses the set its forward filled
 * (queued behind that forward, as in the pipeline), the other block recomputes, and both give the
 * bytes of calls that never keep (layer 0); a second backward of the kept block, with no forward
 * in between (clipping's second pass), recomputes and gives them again. */
static void test_host_calls_keep_layers(void **state)
{
    (void)state;
    const struct fy_gpt_config two = {2, 4, 256, 131, 128};
    const int BB = 4, TT = 128;
    struct fy_cu_arena arena;
    struct fy_cu_gpt *g = NULL;
    size_t set = fy_cu_gpt_acts_bytes(&two, BB, TT);
    size_t need = fy_cu_gpt_arena_bytes(&two, BB, TT);
    assert_int_equal(fy_cu_arena_init(&arena, need + set + set / 2), 0);
    assert_int_equal(fy_cu_gpt_new(&g, &arena, &two, BB, TT), 0);
    assert_int_equal(fy_cu_gpt_keep_layers(g, &arena, 2), 1);
    size_t P = fy_gpt_unit_params(&two, 1), NC = (size_t)BB * TT * two.n_embd;
    float *w1 = pinned_random(P, 31, 0.05f), *w2 = pinned_random(P, 32, 0.05f);
    float *x = pinned_random(NC, 33, 1.0f), *dy = pinned_random(NC, 34, 1.0f);
    float *y1r = pinned_random(NC, 0, 1), *y2r = pinned_random(NC, 0, 1);
    float *dx2r = pinned_random(NC, 0, 1), *dx1r = pinned_random(NC, 0, 1);
    float *dw2r = pinned_random(P, 0, 1), *dw1r = pinned_random(P, 0, 1);
    float *y1 = pinned_random(NC, 0, 1), *y2 = pinned_random(NC, 0, 1);
    float *dx2 = pinned_random(NC, 0, 1), *dx1 = pinned_random(NC, 0, 1);
    float *dw2 = pinned_random(P, 0, 1), *dw1 = pinned_random(P, 0, 1);
    /* reference: never kept */
    assert_int_equal(fy_cu_gpt_block_forward(g, 0, w1, x, y1r), 0);
    assert_int_equal(fy_cu_gpt_block_forward(g, 0, w2, y1r, y2r), 0);
    assert_int_equal(fy_cu_gpt_finish(g, NULL), 0);
    assert_int_equal(fy_cu_gpt_block_backward(g, 0, w2, y1r, dy, dx2r, dw2r), 0);
    assert_int_equal(fy_cu_gpt_finish(g, NULL), 0);
    assert_int_equal(fy_cu_gpt_block_backward(g, 0, w1, x, dx2r, dx1r, dw1r), 0);
    assert_int_equal(fy_cu_gpt_finish(g, NULL), 0);
    assert_int_equal(fy_cu_gpt_finish(g, NULL), 0);
    /* layers 1 and 2: block 2 kept */
    assert_int_equal(fy_cu_gpt_block_forward(g, 1, w1, x, y1), 0);
    assert_int_equal(fy_cu_gpt_block_forward(g, 2, w2, y1, y2), 0);
    assert_int_equal(fy_cu_gpt_finish(g, NULL), 0);
    assert_int_equal(fy_cu_gpt_block_backward(g, 2, w2, y1, dy, dx2, dw2), 0);
    assert_int_equal(fy_cu_gpt_finish(g, NULL), 0);
    assert_int_equal(fy_cu_gpt_block_backward(g, 1, w1, x, dx2, dx1, dw1), 0);
    assert_int_equal(fy_cu_gpt_finish(g, NULL), 0);
    assert_int_equal(fy_cu_gpt_finish(g, NULL), 0);
    assert_memory_equal(y2, y2r, NC * sizeof(float));
    assert_memory_equal(dx2, dx2r, NC * sizeof(float));
    assert_memory_equal(dw2, dw2r, P * sizeof(float));
    assert_memory_equal(dx1, dx1r, NC * sizeof(float));
    assert_memory_equal(dw1, dw1r, P * sizeof(float));
    /* the set was used: a second backward of block 2 recomputes, to the same bytes */
    memset(dw2, 0xff, P * sizeof(float));
    memset(dx2, 0xff, NC * sizeof(float));
    assert_int_equal(fy_cu_gpt_block_backward(g, 2, w2, y1, dy, dx2, dw2), 0);
    assert_int_equal(fy_cu_gpt_finish(g, NULL), 0);
    assert_memory_equal(dx2, dx2r, NC * sizeof(float));
    assert_memory_equal(dw2, dw2r, P * sizeof(float));
    assert_memory_not_equal(dw1, dw2, P * sizeof(float));
    for (float *p : {w1, w2, x, dy, y1r, y2r, dx2r, dx1r, dw2r, dw1r, y1, y2, dx2, dx1, dw2, dw1})
        cudaFreeHost(p);
    fy_cu_gpt_destroy(&g);
    fy_cu_arena_release(&arena);
}

static void test_set_that_does_not_fit(void **state)
{
    (void)state;
    struct fixture f;
    setup(&f, 1);
    struct fy_cu_gpt_acts a, b;
    assert_int_equal(fy_cu_gpt_acts_take(f.g, &f.arena, &a), 0);
    size_t used = f.arena.used;
    assert_int_equal(fy_cu_gpt_acts_take(f.g, &f.arena, &b), -ENOMEM);
    assert_int_equal(f.arena.used, used);
    assert_null(b.ln1);
    teardown(&f);
}

int main(void)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        printf("test_cu_gpt: SKIPPED: no usable CUDA device (cudaGetDeviceCount: %s, %d devices)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "ok", count);
        return FY_TEST_SKIP;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kept_equals_recomputed),
        cmocka_unit_test(test_queued_host_calls),
        cmocka_unit_test(test_chained_queued_calls),
        cmocka_unit_test(test_host_calls_keep_layers),
        cmocka_unit_test(test_set_that_does_not_fit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
