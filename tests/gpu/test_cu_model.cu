/* GPU test of gpu_worker/cuda/cu_model.cu and cu_queue.cu (contracts: cu_model.h, cu_queue.h), on
 * a GPT-2 model, whose units (cu_gpt2_units) swap their internals and are profiled. The host
 * interface's queue: calls in flight give the same bytes as calls completed one by one, a finished
 * call reports the device time of its copies, and a call whose input is the output of the call in
 * flight before it waits for that output (the pipeline's every step). Kept layers and swapped
 * internals give the bytes of calls that recompute; what they refuse queues nothing. The
 * activation planner's profile gives sane figures and changes nothing that later calls compute.
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

#include <cmath>
#include <vector>

#include "common/model/arch/arch.h"
#include "common/base/dtype.h"
#include "common/model/arch/llama.h"
#include "common/model/model.h"
#include "gpu_worker/cuda/cu_arena.h"
#include "gpu_worker/cuda/cu_families.h"
#include "gpu_worker/cuda/cu_gpt2_units.h"
#include "gpu_worker/cuda/cu_llama_units.h"
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

/* A GPT-2 model in an arena with room for extra_sets sets of internals beside its buffers. */
struct fixture {
    struct fy_cu_arena arena;
    struct fy_cu_model *g;
    size_t NC, P;
};

static void setup(struct fixture *f, size_t extra_sets)
{
    memset(f, 0, sizeof *f);
    size_t bytes =
        fy_cu_model_arena_bytes(&cfg, B, T) + extra_sets * fy_cu_model_set_bytes(&cfg, B, T);
    assert_int_equal(fy_cu_arena_init(&f->arena, bytes), 0);
    assert_int_equal(fy_cu_model_new(&f->g, &f->arena, &cfg, B, T), 0);
    f->NC = (size_t)B * T * cfg.n_embd;
    f->P = fy_model_unit_params(&cfg, 1);
}

static void teardown(struct fixture *f)
{
    fy_cu_model_destroy(&f->g);
    fy_cu_arena_release(&f->arena);
}

/* The model's GPT-2 units, whose per-op timing the profile must leave as it was. */
static struct fy_cu_gpt2 *gpt2_units(struct fy_cu_model *m)
{
    struct fy_cu_gpt2 *u = (struct fy_cu_gpt2 *)fy_cu_model_units(m, &fy_cu_family_gpt2);
    assert_non_null(u);
    return u;
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
    size_t fin_n = fy_model_unit_params(&cfg, cfg.n_layer + 1);
    size_t emb_n = fy_model_unit_params(&cfg, 0);
    float *fin = pinned_random(fin_n, 4, 0.2f), *emb = pinned_random(emb_n, 5, 0.2f);
    int32_t *targets = NULL;
    CK(cudaHostAlloc((void **)&targets, N * sizeof(int32_t), cudaHostAllocDefault));
    for (size_t i = 0; i < N; i++)
        targets[i] = (int32_t)(i * 7 % cfg.vocab);
    /* one by one */
    assert_int_equal(fy_cu_model_block_forward(f.g, 0, w1, NULL, x, out[0], NULL), 0);
    struct fy_cu_copy_times times = {-1, -1};
    assert_int_equal(fy_cu_model_finish(f.g, &times), 0);
    print_message("block forward: uploads %.3f ms, downloads %.3f ms (device time)\n", times.h2d_ms,
                  times.d2h_ms);
    assert_true(times.h2d_ms > 0 && times.h2d_ms < 1000);
    assert_true(times.d2h_ms > 0 && times.d2h_ms < 1000);
    assert_int_equal(fy_cu_model_block_forward(f.g, 0, w2, NULL, x, out[1], NULL), 0);
    assert_int_equal(fy_cu_model_finish(f.g, NULL), 0);
    double loss_sync = -1;
    assert_int_equal(fy_cu_model_head(f.g, fin, emb, x, targets, &loss_sync, NULL, NULL, NULL), 0);
    assert_int_equal(fy_cu_model_finish(f.g, NULL), 0);
    assert_true(loss_sync > 0);
    /* two in flight */
    assert_int_equal(fy_cu_model_block_forward(f.g, 0, w1, NULL, x, out[2], NULL), 0);
    assert_int_equal(fy_cu_model_block_forward(f.g, 0, w2, NULL, x, out[3], NULL), 0);
    assert_int_equal(fy_cu_model_pending(f.g), 2);
    assert_int_equal(fy_cu_model_block_forward(f.g, 0, w1, NULL, x, out[0], NULL), -EBUSY);
    struct pollfd pfd = {fy_cu_model_ready_fd(f.g), POLLIN, 0};
    assert_int_equal(poll(&pfd, 1, 20000), 1); /* the first call's results come home */
    assert_int_equal(fy_cu_model_finish(f.g, NULL), 0);
    assert_int_equal(fy_cu_model_finish(f.g, NULL), 0);
    assert_int_equal(fy_cu_model_pending(f.g), 0);
    assert_int_equal(fy_cu_model_finish(f.g, NULL), -EINVAL);
    assert_memory_equal(out[0], out[2], NC * sizeof(float));
    assert_memory_equal(out[1], out[3], NC * sizeof(float));
    assert_memory_not_equal(out[2], out[3], NC * sizeof(float));
    /* the head's loss is written when the call is finished, not before */
    double loss = -1;
    assert_int_equal(fy_cu_model_block_forward(f.g, 0, w1, NULL, x, out[2], NULL), 0);
    assert_int_equal(fy_cu_model_head(f.g, fin, emb, x, targets, &loss, NULL, NULL, NULL), 0);
    assert_int_equal(fy_cu_model_finish(f.g, NULL), 0);
    assert_true(loss == -1);
    assert_int_equal(fy_cu_model_finish(f.g, NULL), 0);
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
    const struct fy_model_config big = {1, 8, 1024, 131, 512};
    const int BB = 4, TT = 512;
    struct fy_cu_arena arena;
    struct fy_cu_model *g = NULL;
    assert_int_equal(fy_cu_arena_init(&arena, fy_cu_model_arena_bytes(&big, BB, TT)), 0);
    assert_int_equal(fy_cu_model_new(&g, &arena, &big, BB, TT), 0);
    size_t P = fy_model_unit_params(&big, 1), NC = (size_t)BB * TT * big.n_embd;
    float *w1 = pinned_random(P, 21, 0.05f), *w2 = pinned_random(P, 22, 0.05f);
    float *x = pinned_random(NC, 23, 1.0f), *dy = pinned_random(NC, 24, 1.0f);
    float *y1s = pinned_random(NC, 0, 1), *y2s = pinned_random(NC, 0, 1);
    float *y1 = pinned_random(NC, 0, 1), *y2 = pinned_random(NC, 0, 1);
    float *dx2s = pinned_random(NC, 0, 1), *dx1s = pinned_random(NC, 0, 1);
    float *dx2 = pinned_random(NC, 0, 1), *dx1 = pinned_random(NC, 0, 1);
    float *dw2s = pinned_random(P, 0, 1), *dw1s = pinned_random(P, 0, 1);
    float *dw2 = pinned_random(P, 0, 1), *dw1 = pinned_random(P, 0, 1);
    /* one by one: forward through two blocks, backward through both */
    assert_int_equal(fy_cu_model_block_forward(g, 0, w1, NULL, x, y1s, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_int_equal(fy_cu_model_block_forward(g, 0, w2, NULL, y1s, y2s, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_int_equal(fy_cu_model_block_backward(g, 0, w2, NULL, y1s, dy, dx2s, dw2s, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_int_equal(fy_cu_model_block_backward(g, 0, w1, NULL, x, dx2s, dx1s, dw1s, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    /* queued two deep, each call's input the output of the call still in flight */
    memset(y1, 0xff, NC * sizeof(float));
    memset(y2, 0xff, NC * sizeof(float));
    memset(dx2, 0xff, NC * sizeof(float));
    assert_int_equal(fy_cu_model_block_forward(g, 0, w1, NULL, x, y1, NULL), 0);
    assert_int_equal(fy_cu_model_block_forward(g, 0, w2, NULL, y1, y2, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_int_equal(fy_cu_model_block_backward(g, 0, w2, NULL, y1, dy, dx2, dw2, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_int_equal(fy_cu_model_block_backward(g, 0, w1, NULL, x, dx2, dx1, dw1, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_memory_equal(y1, y1s, NC * sizeof(float));
    assert_memory_equal(y2, y2s, NC * sizeof(float));
    assert_memory_equal(dx2, dx2s, NC * sizeof(float));
    assert_memory_equal(dx1, dx1s, NC * sizeof(float));
    assert_memory_equal(dw2, dw2s, P * sizeof(float));
    assert_memory_equal(dw1, dw1s, P * sizeof(float));
    /* an input that is not the activation the call in flight hands on, but another of its outputs
     * (here its weight gradient, as weights): the upload waits for that download */
    assert_int_equal(fy_cu_model_block_forward(g, 0, dw1s, NULL, x, y1s, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    memset(dw1, 0xff, P * sizeof(float));
    memset(y1, 0xff, NC * sizeof(float));
    assert_int_equal(fy_cu_model_block_backward(g, 0, w1, NULL, x, dx2s, dx1, dw1, NULL), 0);
    assert_int_equal(fy_cu_model_block_forward(g, 0, dw1, NULL, x, y1, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_memory_equal(dw1, dw1s, P * sizeof(float));
    assert_memory_equal(y1, y1s, NC * sizeof(float));
    for (float *p : {w1, w2, x, dy, y1s, y2s, y1, y2, dx2s, dx1s, dx2, dx1, dw2s, dw1s, dw2, dw1})
        cudaFreeHost(p);
    fy_cu_model_destroy(&g);
    fy_cu_arena_release(&arena);
}

/* Kept layers through the host interface: with room for one set beside the working buffers,
 * fy_cu_model_keep_layers keeps the top block only. Its backward uses the set its forward filled
 * (queued behind that forward, as in the pipeline), the other block recomputes, and both give the
 * bytes of calls that never keep (layer 0); a second backward of the kept block, with no forward
 * in between (clipping's second pass), recomputes and gives them again. */
static void test_host_calls_keep_layers(void **state)
{
    (void)state;
    const struct fy_model_config two = {2, 4, 256, 131, 128};
    const int BB = 4, TT = 128;
    struct fy_cu_arena arena;
    struct fy_cu_model *g = NULL;
    size_t set = fy_cu_model_set_bytes(&two, BB, TT);
    size_t need = fy_cu_model_arena_bytes(&two, BB, TT);
    assert_int_equal(fy_cu_arena_init(&arena, need + set + set / 2), 0);
    assert_int_equal(fy_cu_model_new(&g, &arena, &two, BB, TT), 0);
    assert_int_equal(fy_cu_model_keep_layers(g, &arena, 2), 1);
    size_t P = fy_model_unit_params(&two, 1), NC = (size_t)BB * TT * two.n_embd;
    float *w1 = pinned_random(P, 31, 0.05f), *w2 = pinned_random(P, 32, 0.05f);
    float *x = pinned_random(NC, 33, 1.0f), *dy = pinned_random(NC, 34, 1.0f);
    float *y1r = pinned_random(NC, 0, 1), *y2r = pinned_random(NC, 0, 1);
    float *dx2r = pinned_random(NC, 0, 1), *dx1r = pinned_random(NC, 0, 1);
    float *dw2r = pinned_random(P, 0, 1), *dw1r = pinned_random(P, 0, 1);
    float *y1 = pinned_random(NC, 0, 1), *y2 = pinned_random(NC, 0, 1);
    float *dx2 = pinned_random(NC, 0, 1), *dx1 = pinned_random(NC, 0, 1);
    float *dw2 = pinned_random(P, 0, 1), *dw1 = pinned_random(P, 0, 1);
    /* reference: never kept */
    assert_int_equal(fy_cu_model_block_forward(g, 0, w1, NULL, x, y1r, NULL), 0);
    assert_int_equal(fy_cu_model_block_forward(g, 0, w2, NULL, y1r, y2r, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_int_equal(fy_cu_model_block_backward(g, 0, w2, NULL, y1r, dy, dx2r, dw2r, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_int_equal(fy_cu_model_block_backward(g, 0, w1, NULL, x, dx2r, dx1r, dw1r, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    /* layers 1 and 2: block 2 kept */
    assert_int_equal(fy_cu_model_block_forward(g, 1, w1, NULL, x, y1, NULL), 0);
    assert_int_equal(fy_cu_model_block_forward(g, 2, w2, NULL, y1, y2, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_int_equal(fy_cu_model_block_backward(g, 2, w2, NULL, y1, dy, dx2, dw2, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_int_equal(fy_cu_model_block_backward(g, 1, w1, NULL, x, dx2, dx1, dw1, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_memory_equal(y2, y2r, NC * sizeof(float));
    assert_memory_equal(dx2, dx2r, NC * sizeof(float));
    assert_memory_equal(dw2, dw2r, P * sizeof(float));
    assert_memory_equal(dx1, dx1r, NC * sizeof(float));
    assert_memory_equal(dw1, dw1r, P * sizeof(float));
    /* the set was used: a second backward of block 2 recomputes, to the same bytes */
    memset(dw2, 0xff, P * sizeof(float));
    memset(dx2, 0xff, NC * sizeof(float));
    assert_int_equal(fy_cu_model_block_backward(g, 2, w2, NULL, y1, dy, dx2, dw2, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_memory_equal(dx2, dx2r, NC * sizeof(float));
    assert_memory_equal(dw2, dw2r, P * sizeof(float));
    assert_memory_not_equal(dw1, dw2, P * sizeof(float));
    for (float *p : {w1, w2, x, dy, y1r, y2r, dx2r, dx1r, dw2r, dw1r, y1, y2, dx2, dx1, dw2, dw1})
        cudaFreeHost(p);
    fy_cu_model_destroy(&g);
    fy_cu_arena_release(&arena);
}

/* ---- swapped internals (saved host buffers) ---- */

#define KBIT(kind) FY_ACT_BIT(FY_ACT_##kind)
/* The kinds swapped, each mask in turn: none, all, each alone, and mixes where the backward skips
 * some forward ops and reruns others (fused: FC or GELU alone reruns the fused product, which
 * rewrites the given one). */
static const unsigned swap_masks[] = {
    0,
    FY_ACT_SWAPPABLE,
    KBIT(QKV),
    KBIT(ATTN),
    KBIT(RESID),
    KBIT(FC),
    KBIT(GELU),
    KBIT(QKV) | KBIT(RESID) | KBIT(GELU),
    KBIT(ATTN) | KBIT(FC),
    KBIT(QKV) | KBIT(ATTN),
    KBIT(RESID) | KBIT(FC) | KBIT(GELU),
};

/* A block's saved region in pinned memory, every swappable kind at its offset, as the pool holds
 * it (common/model/actplan.h, the CUDA layout). */
struct saved_host {
    struct fy_actplan_sizes sizes;
    struct fy_actplan_region region;
    char *base;
};

static void saved_alloc(struct saved_host *h, const struct fy_model_config *c, int b, int t)
{
    assert_int_equal(fy_actplan_sizes_backend(c, b, t, "cuda", &h->sizes), 0);
    assert_int_equal(fy_actplan_region_of(&h->sizes, FY_ACT_SWAPPABLE, &h->region), 0);
    CK(cudaHostAlloc((void **)&h->base, h->region.bytes, cudaHostAllocDefault));
}

static struct fy_block_saved saved_of(const struct saved_host *h, unsigned mask)
{
    struct fy_block_saved s;
    memset(&s, 0, sizeof s);
    for (int k = 0; k < FY_ACT_KINDS; k++)
        if (mask & FY_ACT_BIT(k))
            s.at[k] = h->base + h->region.offset[k];
    return s;
}

/* The bytes of the kinds in mask, one after another. */
static vector<char> saved_bytes(const struct saved_host *h, unsigned mask)
{
    vector<char> v;
    for (int k = 0; k < FY_ACT_KINDS; k++)
        if (mask & FY_ACT_BIT(k))
            v.insert(v.end(), h->base + h->region.offset[k],
                     h->base + h->region.offset[k] + h->sizes.bytes[k]);
    return v;
}

/* Two blocks through the host calls as the pipeline runs them: both forwards in flight, block 2's
 * backward queued behind its forward (so its uploads of the saved kinds must wait for that
 * forward's downloads), block 1's behind block 2's. */
struct chain {
    float *y1, *y2, *dx2, *dx1, *dw2, *dw1;
};

static void chain_alloc(struct chain *c, size_t NC, size_t P)
{
    c->y1 = pinned_random(NC, 0, 1);
    c->y2 = pinned_random(NC, 0, 1);
    c->dx2 = pinned_random(NC, 0, 1);
    c->dx1 = pinned_random(NC, 0, 1);
    c->dw2 = pinned_random(P, 0, 1);
    c->dw1 = pinned_random(P, 0, 1);
}

static void chain_free(struct chain *c)
{
    for (float *p : {c->y1, c->y2, c->dx2, c->dx1, c->dw2, c->dw1})
        cudaFreeHost(p);
}

static void chain_run(struct fy_cu_model *g, const float *w1, const float *w2, const float *x,
                      const float *dy, struct chain *c, const struct fy_block_saved *s1,
                      const struct fy_block_saved *s2)
{
    assert_int_equal(fy_cu_model_block_forward(g, 1, w1, NULL, x, c->y1, s1), 0);
    assert_int_equal(fy_cu_model_block_forward(g, 2, w2, NULL, c->y1, c->y2, s2), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_int_equal(fy_cu_model_block_backward(g, 2, w2, NULL, c->y1, dy, c->dx2, c->dw2, s2), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_int_equal(fy_cu_model_block_backward(g, 1, w1, NULL, x, c->dx2, c->dx1, c->dw1, s1), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
}

static void chain_equal(const struct chain *a, const struct chain *b, size_t NC, size_t P)
{
    assert_memory_equal(a->y1, b->y1, NC * sizeof(float));
    assert_memory_equal(a->y2, b->y2, NC * sizeof(float));
    assert_memory_equal(a->dx2, b->dx2, NC * sizeof(float));
    assert_memory_equal(a->dw2, b->dw2, P * sizeof(float));
    assert_memory_equal(a->dx1, b->dx1, NC * sizeof(float));
    assert_memory_equal(a->dw1, b->dw1, P * sizeof(float));
}

/* fuse: FUYOU_CUDA_FUSE as the unit reads it when made ("0": separate GELU and residual kernels);
 * attention: FUYOU_CUDA_ATTENTION (NULL: the flash attention, which this shape takes). */
static struct fy_cu_model *swap_unit(struct fy_cu_arena *arena, size_t extra_sets, const char *fuse,
                                   const char *attention)
{
    /* named either way, whatever the environment the test runs in says */
    setenv("FUYOU_CUDA_FUSE", fuse != NULL ? fuse : "1", 1);
    setenv("FUYOU_CUDA_ATTENTION", attention != NULL ? attention : "flash", 1);
    /* the sizes too depend on the attention (the materialised one's scratch is T x T per head) */
    size_t set = fy_cu_model_set_bytes(&cfg, B, T);
    int rc = fy_cu_arena_init(arena, fy_cu_model_arena_bytes(&cfg, B, T) + extra_sets * set);
    struct fy_cu_model *g = NULL;
    if (rc == 0)
        rc = fy_cu_model_new(&g, arena, &cfg, B, T);
    unsetenv("FUYOU_CUDA_FUSE");
    unsetenv("FUYOU_CUDA_ATTENTION");
    assert_int_equal(rc, 0);
    return g;
}

/* Every mask, fused and not: the forward writes the saved kinds (every byte: two forwards over
 * different poison give the same bytes, which is also determinism), the backward reads them and
 * gives the bytes of the plain calls (block 1 recomputed, block 2 from its kept set), leaves them
 * as they were, and a second backward (clipping) gives the same bytes again. Block 2 is kept, so
 * a kept block given saved uses the swap set and its kept set is left spent. */
static void swap_masks_check(const char *fuse)
{
    struct fy_cu_arena arena;
    struct fy_cu_model *g = swap_unit(&arena, FY_CU_QUEUE + 1, fuse, NULL);
    assert_int_equal(fy_cu_model_swap_sets(g, &arena), 0);
    size_t used = arena.used;
    assert_int_equal(fy_cu_model_swap_sets(g, &arena), 0); /* a second call takes nothing */
    assert_int_equal(arena.used, used);
    assert_int_equal(fy_cu_model_keep_layers(g, &arena, 2), 1);
    size_t P = fy_model_unit_params(&cfg, 1), NC = (size_t)B * T * cfg.n_embd;
    float *w1 = pinned_random(P, 41, 0.2f), *w2 = pinned_random(P, 42, 0.2f);
    float *x = pinned_random(NC, 43, 1.0f), *dy = pinned_random(NC, 44, 1.0f);
    struct chain ref, run, again;
    chain_alloc(&ref, NC, P);
    chain_alloc(&run, NC, P);
    chain_alloc(&again, NC, P);
    chain_run(g, w1, w2, x, dy, &ref, NULL, NULL);
    struct saved_host h1, h2;
    saved_alloc(&h1, &cfg, B, T);
    saved_alloc(&h2, &cfg, B, T);
    size_t region = h1.region.bytes;
    for (unsigned mask : swap_masks) {
        print_message("FUYOU_CUDA_FUSE=%s, swapped kinds 0x%02x\n", fuse ? fuse : "1", mask);
        struct fy_block_saved s1 = saved_of(&h1, mask), s2 = saved_of(&h2, mask);
        memset(h1.base, 0xa5, region);
        memset(h2.base, 0xa5, region);
        chain_run(g, w1, w2, x, dy, &run, &s1, &s2);
        chain_equal(&run, &ref, NC, P);
        vector<char> r1(h1.base, h1.base + region), r2(h2.base, h2.base + region);
        /* clipping's second pass: the same backwards from the same saved buffers */
        assert_int_equal(
            fy_cu_model_block_backward(g, 2, w2, NULL, run.y1, dy, again.dx2, again.dw2, &s2), 0);
        assert_int_equal(
            fy_cu_model_block_backward(g, 1, w1, NULL, x, run.dx2, again.dx1, again.dw1, &s1), 0);
        assert_int_equal(fy_cu_model_finish(g, NULL), 0);
        assert_int_equal(fy_cu_model_finish(g, NULL), 0);
        assert_memory_equal(again.dx2, ref.dx2, NC * sizeof(float));
        assert_memory_equal(again.dw2, ref.dw2, P * sizeof(float));
        assert_memory_equal(again.dx1, ref.dx1, NC * sizeof(float));
        assert_memory_equal(again.dw1, ref.dw1, P * sizeof(float));
        /* the backwards only read the saved buffers */
        assert_memory_equal(h1.base, r1.data(), region);
        assert_memory_equal(h2.base, r2.data(), region);
        /* the forwards again over other poison: the same bytes in every saved kind */
        vector<char> k1 = saved_bytes(&h1, mask), k2 = saved_bytes(&h2, mask);
        memset(h1.base, 0x5a, region);
        memset(h2.base, 0x5a, region);
        assert_int_equal(fy_cu_model_block_forward(g, 1, w1, NULL, x, again.y1, &s1), 0);
        assert_int_equal(fy_cu_model_block_forward(g, 2, w2, NULL, again.y1, again.y2, &s2), 0);
        assert_int_equal(fy_cu_model_finish(g, NULL), 0);
        assert_int_equal(fy_cu_model_finish(g, NULL), 0);
        assert_memory_equal(again.y2, ref.y2, NC * sizeof(float));
        vector<char> k1b = saved_bytes(&h1, mask), k2b = saved_bytes(&h2, mask);
        assert_int_equal(k1b.size(), k1.size());
        assert_int_equal(k2b.size(), k2.size());
        if (mask != 0) {
            assert_memory_equal(k1b.data(), k1.data(), k1.size());
            assert_memory_equal(k2b.data(), k2.data(), k2.size());
            /* and two blocks' internals differ, so the comparisons are not vacuous */
            assert_memory_not_equal(k1.data(), k2.data(), k1.size());
        }
    }
    /* after swapped forwards of the kept block (its set left spent), a plain backward recomputes,
     * to the same bytes */
    assert_int_equal(
        fy_cu_model_block_backward(g, 2, w2, NULL, ref.y1, dy, again.dx2, again.dw2, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_memory_equal(again.dx2, ref.dx2, NC * sizeof(float));
    assert_memory_equal(again.dw2, ref.dw2, P * sizeof(float));
    chain_free(&ref);
    chain_free(&run);
    chain_free(&again);
    for (float *p : {w1, w2, x, dy})
        cudaFreeHost(p);
    cudaFreeHost(h1.base);
    cudaFreeHost(h2.base);
    fy_cu_model_destroy(&g);
    fy_cu_arena_release(&arena);
}

static void test_swapped_equals_recomputed(void **state)
{
    (void)state;
    swap_masks_check(NULL);
    swap_masks_check("0");
}

/* What the swap sets and saved calls refuse, each without queueing anything: saved before the sets
 * are taken (-EINVAL), a kind that is never swapped (-EINVAL), the attention's internals with the
 * materialised attention (-ENOTSUP; its other kinds still swap, to the same bytes), the sets after
 * kept sets (-EBUSY) or beyond the arena (-ENOMEM, nothing taken). */
static void test_swap_refusals(void **state)
{
    (void)state;
    size_t P = fy_model_unit_params(&cfg, 1), NC = (size_t)B * T * cfg.n_embd;
    float *w = pinned_random(P, 51, 0.2f), *x = pinned_random(NC, 52, 1.0f);
    float *dy = pinned_random(NC, 53, 1.0f);
    struct chain ref, run;
    chain_alloc(&ref, NC, P);
    chain_alloc(&run, NC, P);
    struct saved_host h;
    saved_alloc(&h, &cfg, B, T);
    struct fy_block_saved qkv = saved_of(&h, KBIT(QKV)), attn = saved_of(&h, KBIT(ATTN));
    struct fy_block_saved ln1 = saved_of(&h, KBIT(QKV));
    ln1.at[FY_ACT_LN1] = h.base;

    struct fy_cu_arena arena;
    struct fy_cu_model *g = swap_unit(&arena, FY_CU_QUEUE, NULL, NULL);
    assert_int_equal(fy_cu_model_block_forward(g, 0, w, NULL, x, run.y1, &qkv), -EINVAL);
    assert_int_equal(fy_cu_model_block_backward(g, 0, w, NULL, x, dy, run.dx1, run.dw1, &qkv),
                     -EINVAL);
    assert_int_equal(fy_cu_model_pending(g), 0);
    assert_int_equal(fy_cu_model_swap_sets(g, &arena), 0);
    assert_int_equal(fy_cu_model_block_forward(g, 0, w, NULL, x, run.y1, &ln1), -EINVAL);
    assert_int_equal(fy_cu_model_pending(g), 0);
    fy_cu_model_destroy(&g);
    fy_cu_arena_release(&arena);

    /* kept sets first, then the swap sets: refused */
    g = swap_unit(&arena, FY_CU_QUEUE + 1, NULL, NULL);
    assert_int_equal(fy_cu_model_keep_layers(g, &arena, 1), 1);
    assert_int_equal(fy_cu_model_swap_sets(g, &arena), -EBUSY);
    fy_cu_model_destroy(&g);
    fy_cu_arena_release(&arena);
    /* room for one set of the two */
    g = swap_unit(&arena, 1, NULL, NULL);
    size_t used = arena.used;
    assert_int_equal(fy_cu_model_swap_sets(g, &arena), -ENOMEM);
    assert_int_equal(arena.used, used);
    assert_int_equal(fy_cu_model_block_forward(g, 0, w, NULL, x, run.y1, &qkv), -EINVAL);
    fy_cu_model_destroy(&g);
    fy_cu_arena_release(&arena);

    /* the materialised attention */
    g = swap_unit(&arena, FY_CU_QUEUE, NULL, "materialised");
    assert_int_equal(fy_cu_model_swap_sets(g, &arena), 0);
    assert_int_equal(fy_cu_model_block_forward(g, 0, w, NULL, x, run.y1, &attn), -ENOTSUP);
    assert_int_equal(fy_cu_model_block_backward(g, 0, w, NULL, x, dy, run.dx1, run.dw1, &attn),
                     -ENOTSUP);
    assert_int_equal(fy_cu_model_pending(g), 0);
    struct fy_block_saved some = saved_of(&h, KBIT(QKV) | KBIT(RESID) | KBIT(FC));
    assert_int_equal(fy_cu_model_block_forward(g, 0, w, NULL, x, ref.y1, NULL), 0);
    assert_int_equal(fy_cu_model_block_backward(g, 0, w, NULL, x, dy, ref.dx1, ref.dw1, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_int_equal(fy_cu_model_block_forward(g, 0, w, NULL, x, run.y1, &some), 0);
    assert_int_equal(fy_cu_model_block_backward(g, 0, w, NULL, x, dy, run.dx1, run.dw1, &some), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_memory_equal(run.y1, ref.y1, NC * sizeof(float));
    assert_memory_equal(run.dx1, ref.dx1, NC * sizeof(float));
    assert_memory_equal(run.dw1, ref.dw1, P * sizeof(float));
    fy_cu_model_destroy(&g);
    fy_cu_arena_release(&arena);

    chain_free(&ref);
    chain_free(&run);
    for (float *p : {w, x, dy})
        cudaFreeHost(p);
    cudaFreeHost(h.base);
}

/* ---- the activation planner's profile (fy_cu_model_profile) ---- */

/* Large enough that the block's products, not kernel launches, make up its times. */
static const struct fy_model_config prof_cfg = {1, 8, 1024, 131, 512};
static const int PB = 4, PT = 512;

/* A unit with FUYOU_CUDA_FUSE named ("0": separate GELU and residual kernels) and its one block
 * kept, in an arena with room for that set. */
static struct fy_cu_model *profile_unit(struct fy_cu_arena *arena, const char *fuse)
{
    setenv("FUYOU_CUDA_FUSE", fuse, 1);
    size_t need = fy_cu_model_arena_bytes(&prof_cfg, PB, PT);
    int rc = fy_cu_arena_init(arena, need + fy_cu_model_set_bytes(&prof_cfg, PB, PT));
    struct fy_cu_model *g = NULL;
    if (rc == 0)
        rc = fy_cu_model_new(&g, arena, &prof_cfg, PB, PT);
    unsetenv("FUYOU_CUDA_FUSE");
    assert_int_equal(rc, 0);
    assert_int_equal(fy_cu_model_keep_layers(g, arena, 1), 1);
    return g;
}

/* Outputs of profile_calls: the kept block's y, dx, dw, then a block's recomputed. */
#define PROFILE_OUTS 6

/* Block 1 (kept) forward, [the profile], its backward from the kept set, then block 0 forward
 * and backward (recomputed), both in flight at once. With prof given the profile runs between
 * the kept block's forward and backward, with the caller's per-op timing on, whose table must
 * come back as it was. */
static void profile_calls(struct fy_cu_model *g, struct fy_cu_arena *arena, const float *w,
                          const float *x, const float *dy, float *const *out, void *host,
                          size_t host_bytes, struct fy_block_profile *prof)
{
    if (prof != NULL)
        fy_cu_gpt2_set_timing(gpt2_units(g), 1);
    assert_int_equal(fy_cu_model_block_forward(g, 1, w, NULL, x, out[0], NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    if (prof != NULL) {
        const struct fy_cu_gpt2_op *ops;
        int n = fy_cu_gpt2_timings(gpt2_units(g), &ops);
        assert_true(n > 0);
        vector<struct fy_cu_gpt2_op> before(ops, ops + n);
        size_t used = arena->used;
        assert_int_equal(fy_cu_model_profile(g, arena, host, host_bytes, prof), 0);
        assert_int_equal(arena->used, used);
        assert_int_equal(prof->gpu_free, arena->size - arena->used);
        assert_int_equal(fy_cu_gpt2_timings(gpt2_units(g), &ops), n);
        assert_memory_equal(ops, before.data(), n * sizeof *ops);
        fy_cu_gpt2_set_timing(gpt2_units(g), 0);
    }
    assert_int_equal(fy_cu_model_block_backward(g, 1, w, NULL, x, dy, out[1], out[2], NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_int_equal(fy_cu_model_block_forward(g, 0, w, NULL, x, out[3], NULL), 0);
    assert_int_equal(fy_cu_model_block_backward(g, 0, w, NULL, x, dy, out[4], out[5], NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
}

static void profile_expect_sane(const struct fy_block_profile *p, int fused)
{
    print_message("FUYOU_CUDA_FUSE=%d: forward %.3f ms, backward %.3f ms, qkv %.3f, attn %.3f, "
                  "resid %.3f, fc %.3f, gelu %.3f ms, %.1f TFLOP/s; %.2f GB/s up, %.2f down, "
                  "%.2f both; %llu bytes free, %llu a set\n",
                  fused, 1e3 * p->fwd_s, 1e3 * p->bwd_s, 1e3 * p->recompute_s[FY_ACT_QKV],
                  1e3 * p->recompute_s[FY_ACT_ATTN], 1e3 * p->recompute_s[FY_ACT_RESID],
                  1e3 * p->recompute_s[FY_ACT_FC], 1e3 * p->recompute_s[FY_ACT_GELU],
                  1e-12 * p->flops_per_s, 1e-9 * p->h2d_Bps, 1e-9 * p->d2h_Bps,
                  1e-9 * p->duplex_Bps, (unsigned long long)p->gpu_free,
                  (unsigned long long)p->set_bytes);
    assert_true(p->fwd_s > 0 && std::isfinite(p->fwd_s));
    assert_true(p->bwd_s > 0 && std::isfinite(p->bwd_s));
    double sum = 0;
    for (int k = 0; k < FY_ACT_KINDS; k++) {
        double t = p->recompute_s[k];
        if (fy_actplan_kind_swappable(k))
            assert_true(t > 0 && std::isfinite(t));
        else
            assert_true(t == 0);
        sum += t;
    }
    /* fused, the MLP-up product writes fc and g together: half its time each, said by the flag */
    assert_int_equal(p->fc_gelu_fused, (uint32_t)(fused != 0));
    if (fused)
        assert_true(p->recompute_s[FY_ACT_FC] == p->recompute_s[FY_ACT_GELU]);
    /* each op alone, serialised by its events, but together still a part of the forward */
    assert_true(sum < 1.5 * p->fwd_s);
    double N = PB * PT, C = prof_cfg.n_embd;
    assert_true(fabs(p->flops_per_s * p->recompute_s[FY_ACT_QKV] / (6 * N * C * C) - 1) < 1e-9);
    assert_true(p->h2d_Bps > 1e8 && std::isfinite(p->h2d_Bps));
    assert_true(p->d2h_Bps > 1e8 && std::isfinite(p->d2h_Bps));
    assert_true(p->duplex_Bps > 1e8 && std::isfinite(p->duplex_Bps));
    assert_int_equal(p->set_bytes, fy_cu_model_set_bytes(&prof_cfg, PB, PT));
}

/* The profile of each flavour is sane (times positive and finite where the kinds are produced,
 * FC and GELU half the fused product each when fused, the kinds' ops less than the forward, the link faster than 100 MB/s,
 * the arena's room and a set's bytes), and disturbs nothing: around it, a kept block's backward
 * (from the set its forward filled before the profile) and a recomputed block give the bytes of
 * a unit that never profiled. */
static void profile_check(const char *fuse)
{
    struct fy_cu_arena arena, ref_arena;
    struct fy_cu_model *g = profile_unit(&arena, fuse), *ref = profile_unit(&ref_arena, fuse);
    size_t P = fy_model_unit_params(&prof_cfg, 1), NC = (size_t)PB * PT * prof_cfg.n_embd;
    float *w = pinned_random(P, 61, 0.05f), *x = pinned_random(NC, 62, 1.0f);
    float *dy = pinned_random(NC, 63, 1.0f);
    float *got[PROFILE_OUTS], *want[PROFILE_OUTS];
    size_t n[PROFILE_OUTS] = {NC, NC, P, NC, NC, P};
    for (int i = 0; i < PROFILE_OUTS; i++) {
        got[i] = pinned_random(n[i], 0, 1);
        want[i] = pinned_random(n[i], 0, 1);
    }
    size_t host_bytes = 16u << 20;
    void *host = NULL;
    CK(cudaHostAlloc(&host, host_bytes, cudaHostAllocDefault));
    struct fy_block_profile prof;
    memset(&prof, 0, sizeof prof);
    profile_calls(ref, &ref_arena, w, x, dy, want, NULL, 0, NULL);
    profile_calls(g, &arena, w, x, dy, got, host, host_bytes, &prof);
    profile_expect_sane(&prof, strcmp(fuse, "0") != 0);
    for (int i = 0; i < PROFILE_OUTS; i++)
        assert_memory_equal(got[i], want[i], n[i] * sizeof(float));
    /* a second profile of the same unit measures the same things */
    struct fy_block_profile again;
    assert_int_equal(fy_cu_model_profile(g, &arena, host, host_bytes, &again), 0);
    profile_expect_sane(&again, strcmp(fuse, "0") != 0);
    for (int i = 0; i < PROFILE_OUTS; i++) {
        cudaFreeHost(got[i]);
        cudaFreeHost(want[i]);
    }
    for (float *p : {w, x, dy})
        cudaFreeHost(p);
    cudaFreeHost(host);
    fy_cu_model_destroy(&g);
    fy_cu_model_destroy(&ref);
    fy_cu_arena_release(&arena);
    fy_cu_arena_release(&ref_arena);
}

static void test_profile_sane(void **state)
{
    (void)state;
    profile_check("1");
    profile_check("0");
}

/* What the profile refuses, queueing nothing: host memory under 1 MiB or none (-EINVAL), host
 * memory that is not pinned (-EINVAL), calls in flight (-EBUSY). With exactly 1 MiB, more than
 * this small unit's fc, it profiles. */
static void test_profile_refusals(void **state)
{
    (void)state;
    struct fixture f;
    setup(&f, 0);
    size_t P = f.P, NC = f.NC, mib = 1u << 20;
    float *w = pinned_random(P, 71, 0.2f), *x = pinned_random(NC, 72, 1.0f);
    float *y = pinned_random(NC, 0, 1);
    void *host = NULL;
    CK(cudaHostAlloc(&host, mib, cudaHostAllocDefault));
    struct fy_block_profile prof;
    assert_int_equal(fy_cu_model_profile(f.g, &f.arena, host, mib - 1, &prof), -EINVAL);
    assert_int_equal(fy_cu_model_profile(f.g, &f.arena, NULL, mib, &prof), -EINVAL);
    vector<char> pageable(2 * mib);
    assert_int_equal(fy_cu_model_profile(f.g, &f.arena, pageable.data(), 2 * mib, &prof), -EINVAL);
    assert_int_equal(fy_cu_model_block_forward(f.g, 0, w, NULL, x, y, NULL), 0);
    assert_int_equal(fy_cu_model_profile(f.g, &f.arena, host, mib, &prof), -EBUSY);
    assert_int_equal(fy_cu_model_pending(f.g), 1);
    assert_int_equal(fy_cu_model_finish(f.g, NULL), 0);
    assert_int_equal(fy_cu_model_profile(f.g, &f.arena, host, mib, &prof), 0);
    assert_true(prof.fwd_s > 0 && prof.h2d_Bps > 0 && prof.duplex_Bps > 0);
    assert_int_equal(fy_cu_model_pending(f.g), 0);
    for (float *p : {w, x, y})
        cudaFreeHost(p);
    cudaFreeHost(host);
    teardown(&f);
}


/* ---- a block backward's gradient in pieces ---- */

/* The block backward through cu_model, whose gradient comes home a piece at a time through its
 * ring, against the family's units computing into one device buffer of the whole block (the path
 * of the benchmarks and of every earlier release): the same bytes where every piece is a whole
 * tensor, and where FUYOU_TEST_GRAD_PIECE_FLOATS makes the large weights go in slices of rows, the
 * same dx and gradients within rounding of the sliced products' summation (tol, relative to the
 * largest element). The arena holds the model's buffers exactly: fy_cu_model_arena_bytes, which
 * is what the plan counts, is what it takes. */
static void grads_case(const struct fy_model_config *c, int Bq, int Tq, const char *piece_floats,
                       double tol)
{
    if (piece_floats != NULL)
        setenv("FUYOU_TEST_GRAD_PIECE_FLOATS", piece_floats, 1);
    else
        unsetenv("FUYOU_TEST_GRAD_PIECE_FLOATS");
    struct fy_cu_arena arena;
    struct fy_cu_model *g = NULL;
    size_t need = fy_cu_model_arena_bytes(c, Bq, Tq);
    assert_int_equal(fy_cu_arena_init(&arena, need), 0);
    assert_int_equal(fy_cu_model_new(&g, &arena, c, Bq, Tq), 0);
    assert_int_equal(arena.used, need);
    unsetenv("FUYOU_TEST_GRAD_PIECE_FLOATS");
    size_t P = fy_model_unit_params(c, 1), NC = (size_t)Bq * Tq * c->n_embd;
    float *w = pinned_random(P, 41, 0.05f), *x = pinned_random(NC, 42, 1.0f);
    float *dy = pinned_random(NC, 43, 1.0f), *dx = pinned_random(NC, 0, 1.0f);
    float *dw = pinned_random(P, 0, 1.0f);
    memset(dw, 0xff, P * sizeof(float));
    assert_int_equal(fy_cu_model_block_backward(g, 0, w, NULL, x, dy, dx, dw, NULL), 0);
    assert_int_equal(fy_cu_model_finish(g, NULL), 0);
    /* the units alone, on bf16 copies of the same inputs, into one device buffer */
    vector<uint16_t> wb(P), xb(NC), dyb(NC), dxb(NC);
    for (size_t i = 0; i < P; i++)
        wb[i] = fy_f32_to_bf16(w[i]);
    for (size_t i = 0; i < NC; i++) {
        xb[i] = fy_f32_to_bf16(x[i]);
        dyb[i] = fy_f32_to_bf16(dy[i]);
    }
    bf16 *dev_w, *dev_x, *dev_dy, *dev_dx;
    float *dev_dw;
    CK(cudaMalloc((void **)&dev_w, P * 2));
    CK(cudaMalloc((void **)&dev_x, NC * 2));
    CK(cudaMalloc((void **)&dev_dy, NC * 2));
    CK(cudaMalloc((void **)&dev_dx, NC * 2));
    CK(cudaMalloc((void **)&dev_dw, P * 4));
    CK(cudaMemcpy(dev_w, wb.data(), P * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dev_x, xb.data(), NC * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dev_dy, dyb.data(), NC * 2, cudaMemcpyHostToDevice));
    if (fy_model_arch(c) == &fy_arch_gpt2)
        assert_int_equal(fy_cu_gpt2_block_backward(gpt2_units(g), dev_w, NULL, dev_x, dev_dy,
                                                   dev_dx, dev_dw, NULL),
                         0);
    else
        assert_int_equal(fy_cu_llama_block_backward(
                             (struct fy_cu_llama *)fy_cu_model_units(g, fy_cu_family_of(c)), dev_w,
                             NULL, dev_x, dev_dy, dev_dx, dev_dw, NULL),
                         0);
    CK(cudaStreamSynchronize(fy_cu_model_stream(g)));
    vector<float> ref_dw(P);
    CK(cudaMemcpy(ref_dw.data(), dev_dw, P * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(dxb.data(), dev_dx, NC * 2, cudaMemcpyDeviceToHost));
    vector<float> ref_dx(NC);
    for (size_t i = 0; i < NC; i++)
        ref_dx[i] = fy_bf16_to_f32(dxb[i]);
    assert_memory_equal(dx, ref_dx.data(), NC * sizeof(float));
    if (tol == 0) {
        assert_memory_equal(dw, ref_dw.data(), P * sizeof(float));
    } else {
        double most = 0, diff = 0;
        for (size_t i = 0; i < P; i++) {
            most = fmax(most, fabs((double)ref_dw[i]));
            diff = fmax(diff, fabs((double)dw[i] - (double)ref_dw[i]));
        }
        print_message("%s, pieces of %s floats: the gradient within %.3g of its largest element "
                      "(%.3g)\n", fy_model_arch(c)->name, piece_floats, diff / most, most);
        assert_true(diff <= tol * most);
    }
    for (float *p : {w, x, dy, dx, dw})
        cudaFreeHost(p);
    for (void *p : {(void *)dev_w, (void *)dev_x, (void *)dev_dy, (void *)dev_dx, (void *)dev_dw})
        cudaFree(p);
    fy_cu_model_destroy(&g);
    fy_cu_arena_release(&arena);
}

static void test_grad_pieces(void **state)
{
    (void)state;
    /* GPT-2 (head size 48, T = 37) and a Llama-like family with grouped-query attention and the
     * q/k/v biases (Qwen2) */
    struct fy_model_config llama = {2, 4, 256, 131, 64};
    llama.arch = &fy_arch_qwen2;
    fy_llama_mut(&llama)->n_kv_head = 2;
    fy_llama_mut(&llama)->n_inter = 688;
    fy_llama_mut(&llama)->qkv_bias = 1;
    fy_llama_mut(&llama)->rms_eps = 1e-5f;
    fy_llama_mut(&llama)->rope_theta = 10000.0;
    assert_int_equal(fy_model_config_validate(&llama), 0);
    grads_case(&cfg, B, T, NULL, 0);
    grads_case(&llama, 2, 40, NULL, 0);
    /* 4096 floats: every matrix in slices of rows, some of one row (llama's 688-wide down) */
    grads_case(&cfg, B, T, "4096", 1e-5);
    grads_case(&llama, 2, 40, "4096", 1e-5);
}

int main(void)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        printf("test_cu_model: SKIPPED: no usable CUDA device (cudaGetDeviceCount: %s, %d "
               "devices)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "ok", count);
        return FY_TEST_SKIP;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_queued_host_calls),
        cmocka_unit_test(test_chained_queued_calls),
        cmocka_unit_test(test_host_calls_keep_layers),
        cmocka_unit_test(test_swapped_equals_recomputed),
        cmocka_unit_test(test_swap_refusals),
        cmocka_unit_test(test_profile_sane),
        cmocka_unit_test(test_profile_refusals),
        cmocka_unit_test(test_grad_pieces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
