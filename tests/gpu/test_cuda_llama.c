/* GPU test of the CUDA backend's Llama units against the CPU backend (the fp32 reference) through
 * the backend interface the gpu worker uses, for a small grouped-query Llama (4 heads, 2 kv heads,
 * head size 64, llama3-scaled RoPE, T = 37 not a multiple of the attention tile), with a tied and
 * an untied LM head: each op (embedding, block forward and backward, head with loss and gradients,
 * logits, embedding backward onto the head's share), the whole model's loss and every unit's
 * gradient (tests/refmodel), determinism; activations as bf16 in host memory give the same bits as
 * f32; the calls queued two deep as the pipeline queues them, with the top blocks' internals kept
 * on the GPU (model_keep), give the bits of calls completed one by one that recompute every block;
 * packed documents (gpu_worker/backend_ops.h's positions: documents of up to 12 tokens, single-token
 * ones, each row's last target ignored) against the CPU backend given them, whole model, tied and
 * untied, and queued with kept blocks against one by one; the windows' positions (t everywhere)
 * give the bytes of none; and what Llama refuses on CUDA (swapped internals, the planner's profile, head sizes the kernels
 * do not take), each with -ENOTSUP or -EINVAL and a message.
 * Tolerances, as test_cuda_gpt states them for GPT-2 (bf16 weights and activations, fp32
 * accumulation against fp32): relative Frobenius error of each output below 3e-2 (2^-8 = 4e-3 per
 * bf16 rounding, several per block), the loss within 5e-3 relative. Skips (77) without a CUDA
 * build or device. */
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

#include "common/model/actplan.h"
#include "common/base/dtype.h"
#include "common/model/arch/llama.h"
#include "common/model/model.h"
#include "gpu_worker/backend.h"
#include "tests/refmodel.h"
#include "tests/testutil.h"

static struct fy_backend *cuda, *cpu;
static const int B = 3, T = 37;

/* fy_refmodel_llama_small: its rope's original context (8) is below T. */
static struct fy_model_config llama(int tied) { return fy_refmodel_llama_small(tied); }

#define rel_err fy_refmodel_rel_err

static float *falloc(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

/* The whole model on both backends: the loss, every unit's gradient and the logits; packed: the
 * rows packed with documents of up to 12 tokens (each attending only to itself, RoPE at its own
 * positions). */
static void whole_model_case(int tied, int packed)
{
    struct fy_model_config c = llama(tied);
    struct fy_refmodel on_gpu, on_cpu;
    assert_int_equal(fy_refmodel_init(&on_gpu, &c, B, T, 41), 0);
    assert_int_equal(fy_refmodel_init(&on_cpu, &c, B, T, 41), 0);
    if (packed) {
        assert_int_equal(fy_refmodel_pack(&on_gpu, 12, 42), 0);
        assert_int_equal(fy_refmodel_pack(&on_cpu, 12, 42), 0);
    }
    if (fy_refmodel_forward_backward(&on_gpu, cuda) != 0)
        fail_msg("cuda: %s", on_gpu.err);
    if (fy_refmodel_forward_backward(&on_cpu, cpu) != 0)
        fail_msg("cpu: %s", on_cpu.err);
    print_message("%s head%s: loss gpu %.7f cpu %.7f\n", tied ? "tied" : "untied",
                  packed ? ", packed documents" : "", on_gpu.loss, on_cpu.loss);
    assert_true(fabs(on_gpu.loss - on_cpu.loss) <= 5e-3 * fabs(on_cpu.loss));
    assert_true(rel_err(on_gpu.logits, on_cpu.logits, (size_t)B * T * c.vocab, "model logits") <
                3e-2);
    for (unsigned u = 0; u < on_gpu.n_units; u++) {
        char what[48];
        snprintf(what, sizeof what, "model grad unit %u", u);
        assert_true(rel_err(on_gpu.grads[u], on_cpu.grads[u], on_gpu.sizes[u], what) < 3e-2);
    }
    fy_refmodel_free(&on_gpu);
    fy_refmodel_free(&on_cpu);
}

static void test_whole_model_matches_cpu(void **state)
{
    whole_model_case(1, 0);
    whole_model_case(0, 0);
}

static void test_packed_matches_cpu(void **state)
{
    whole_model_case(1, 1);
    whole_model_case(0, 1);
}

/* One op at a time on the same inputs (the CPU's outputs feed both), as test_cuda_gpt does. */
static void units_case(int tied)
{
    struct fy_model_config c = llama(tied);
    struct fy_refmodel m;
    assert_int_equal(fy_refmodel_init(&m, &c, B, T, 43), 0);
    assert_int_equal(fy_backend_model_prepare(cuda, &c, B, T), 0);
    assert_int_equal(fy_backend_model_prepare(cpu, &c, B, T), 0);
    size_t N = (size_t)B * T, C = c.n_embd, NC = N * C;
    size_t ne = m.sizes[0], nb = m.sizes[1], nf = m.sizes[3];
    float *embed = m.params[0], *block = m.params[1], *fin = m.params[3];
    float *x[2] = {falloc(NC), falloc(NC)}, *y[2] = {falloc(NC), falloc(NC)};
    float *dx[2] = {falloc(NC), falloc(NC)}, *dfin[2] = {falloc(nf), falloc(nf)};
    float *demb[2] = {falloc(ne), falloc(ne)}, *dxb[2] = {falloc(NC), falloc(NC)};
    float *dp[2] = {falloc(nb), falloc(nb)};
    float *lg[2] = {falloc(N * c.vocab), falloc(N * c.vocab)};
    double loss[2];
    struct fy_backend *be[2] = {cuda, cpu};
    for (int k = 1; k >= 0; k--) { /* the CPU first: its x, y and dx are both backends' inputs */
        /* dembed poisoned: the head overwrites it (with zeros when untied) */
        memset(demb[k], 0xff, ne * sizeof(float));
        assert_int_equal(fy_backend_model_embed_forward(be[k], embed, m.tokens, NULL, x[k]), 0);
        assert_int_equal(fy_backend_model_block_forward(be[k], 1, block, NULL, x[1], y[k], NULL),
                         0);
        assert_int_equal(fy_backend_model_head(be[k], fin, embed, y[1], m.targets, &loss[k], dx[k],
                                             dfin[k], demb[k]),
                         0);
        assert_int_equal(fy_backend_model_logits(be[k], fin, embed, y[1], lg[k]), 0);
        assert_int_equal(fy_backend_model_block_backward(be[k], 1, block, NULL, x[1], dx[1], dxb[k],
                                                         dp[k], NULL),
                         0);
    }
    const char *head = tied ? "tied" : "untied";
    print_message("%s head: loss gpu %.7f cpu %.7f\n", head, loss[0], loss[1]);
    assert_true(rel_err(x[0], x[1], NC, "embed forward") < 3e-2);
    assert_true(rel_err(y[0], y[1], NC, "block forward") < 3e-2);
    assert_true(fabs(loss[0] - loss[1]) <= 5e-3 * fabs(loss[1]));
    assert_true(rel_err(dx[0], dx[1], NC, "head dx") < 3e-2);
    assert_true(rel_err(dfin[0], dfin[1], C, "head dnorm") < 3e-2);
    if (tied) {
        assert_true(rel_err(demb[0], demb[1], ne, "head dembed") < 3e-2);
    } else {
        assert_true(rel_err(dfin[0] + C, dfin[1] + C, nf - C, "head dlm_head") < 3e-2);
        for (size_t i = 0; i < ne; i++) /* nothing from an untied head */
            if (demb[0][i] != 0.0f || demb[1][i] != 0.0f)
                fail_msg("untied head: dembed[%zu] = %g (cuda), %g (cpu), not 0", i,
                         (double)demb[0][i], (double)demb[1][i]);
    }
    assert_true(rel_err(lg[0], lg[1], N * c.vocab, "logits") < 3e-2);
    assert_true(rel_err(dxb[0], dxb[1], NC, "block backward dx") < 3e-2);
    struct fy_llama_unit_layout l;
    fy_llama_unit_layout(&c, &l);
    const struct {
        const char *name;
        size_t at, end;
    } parts[] = {{"d input_norm", l.input_norm, l.q_proj}, {"d q_proj", l.q_proj, l.k_proj},
                 {"d k_proj", l.k_proj, l.v_proj},         {"d v_proj", l.v_proj, l.o_proj},
                 {"d o_proj", l.o_proj, l.post_norm},
                 {"d post_norm", l.post_norm, l.gate_proj},
                 {"d gate_proj", l.gate_proj, l.up_proj},  {"d up_proj", l.up_proj, l.down_proj},
                 {"d down_proj", l.down_proj, l.total}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        assert_true(rel_err(dp[0] + parts[i].at, dp[1] + parts[i].at,
                            parts[i].end - parts[i].at, parts[i].name) < 3e-2);
    /* determinism: the same backward again, the same bytes */
    float *dp_again = falloc(nb), *dx_again = falloc(NC);
    assert_int_equal(fy_backend_model_block_backward(cuda, 1, block, NULL, x[1], dx[1], dx_again,
                                                     dp_again, NULL),
                     0);
    assert_memory_equal(dp_again, dp[0], nb * sizeof(float));
    assert_memory_equal(dx_again, dxb[0], NC * sizeof(float));
    /* the embedding backward adds the lookup's gradient onto the head's share */
    memcpy(demb[0], demb[1], ne * sizeof(float));
    for (int k = 0; k < 2; k++)
        assert_int_equal(fy_backend_model_embed_backward(be[k], m.tokens, NULL, dxb[1], demb[k]),
                         0);
    assert_true(rel_err(demb[0], demb[1], ne, "embed backward") < 3e-2);
    for (int k = 0; k < 2; k++) {
        free(x[k]), free(y[k]), free(dx[k]), free(dfin[k]), free(demb[k]), free(dxb[k]);
        free(dp[k]), free(lg[k]);
    }
    free(dp_again);
    free(dx_again);
    fy_refmodel_free(&m);
}

static void test_units_match_cpu(void **state)
{
    units_case(1);
    units_case(0);
}

/* Every output of one step of the pipeline over the whole model. */
struct step_out {
    float *xs, *dx, *dy, *grads[FY_REFMODEL_MAX_UNITS];
    double loss;
};

static void step_alloc(struct step_out *o, const struct fy_refmodel *m)
{
    size_t NC = (size_t)m->B * m->T * m->cfg.n_embd;
    o->xs = falloc(NC * (m->cfg.n_layer + 1));
    o->dx = falloc(NC);
    o->dy = falloc(NC);
    for (unsigned u = 0; u < m->n_units; u++)
        o->grads[u] = falloc(m->sizes[u]);
}

static void step_free(struct step_out *o, const struct fy_refmodel *m)
{
    free(o->xs);
    free(o->dx);
    free(o->dy);
    for (unsigned u = 0; u < m->n_units; u++)
        free(o->grads[u]);
}

/* Finishes the oldest call when two are in flight (queued), or does nothing (not queued). */
static void keep_one(struct fy_backend *b, int queued, int *inflight)
{
    if (queued && ++*inflight == 2) {
        assert_int_equal(fy_backend_model_finish(b, NULL, NULL), 0);
        (*inflight)--;
    }
}

/* A training step's calls in the pipeline's order (forward, head, backward, embedding backward),
 * queued two deep when `queued`, each block's input the output of the call before it. */
static void pipeline_step(struct fy_backend *b, int queued, const struct fy_refmodel *m,
                          struct step_out *o)
{
    const unsigned L = m->cfg.n_layer;
    const size_t NC = (size_t)m->B * m->T * m->cfg.n_embd;
    int inflight = 0;
    assert_int_equal(fy_backend_model_set_queued(b, queued), queued);
    assert_int_equal(
        fy_backend_model_embed_forward(b, m->params[0], m->tokens, m->positions, o->xs), 0);
    keep_one(b, queued, &inflight);
    for (unsigned l = 0; l < L; l++) {
        assert_int_equal(fy_backend_model_block_forward(b, 1 + l, m->params[1 + l], m->positions,
                                                        o->xs + NC * l, o->xs + NC * (l + 1), NULL),
                         0);
        keep_one(b, queued, &inflight);
    }
    assert_int_equal(fy_backend_model_head(b, m->params[L + 1], m->params[0], o->xs + NC * L,
                                         m->targets, &o->loss, o->dy, o->grads[L + 1],
                                         o->grads[0]),
                     0);
    keep_one(b, queued, &inflight);
    float *dy = o->dy, *dx = o->dx;
    for (unsigned l = L; l-- > 0;) {
        assert_int_equal(fy_backend_model_block_backward(b, 1 + l, m->params[1 + l], m->positions,
                                                         o->xs + NC * l, dy, dx, o->grads[1 + l],
                                                         NULL),
                         0);
        keep_one(b, queued, &inflight);
        float *t = dx;
        dx = dy;
        dy = t;
    }
    /* the head is finished by now (two calls at most in flight): its dembed is written */
    assert_int_equal(fy_backend_model_embed_backward(b, m->tokens, m->positions, dy, o->grads[0]),
                     0);
    for (inflight += queued; inflight > 0; inflight--)
        assert_int_equal(fy_backend_model_finish(b, NULL, NULL), 0);
    fy_backend_model_set_queued(b, 0);
}

/* Queued two deep with the top blocks kept, against one by one recomputing: the same bits; packed:
 * with documents (each call keeps its own positions while queued). */
static void queued_kept_case(int tied, int packed)
{
    struct fy_model_config c = llama(tied);
    struct fy_refmodel m;
    assert_int_equal(fy_refmodel_init(&m, &c, B, T, 47), 0);
    if (packed)
        assert_int_equal(fy_refmodel_pack(&m, 9, 48), 0);
    uint64_t working, set;
    assert_int_equal(fy_backend_gpu_bytes("cuda", &c, B, T, &working, &set), 1);
    assert_true(working > 0 && set > 0);
    /* exactly the room for both blocks' sets beside the working buffers: what plan sizes the GPU
     * with is what prepare and keep take, for Llama too */
    struct fy_backend *kept = NULL;
    assert_int_equal(fy_backend_open(&kept, "cuda", working + 2 * set), 0);
    assert_int_equal(fy_backend_model_prepare(kept, &c, B, T), 0);
    assert_int_equal(fy_backend_model_keep(kept, 2), 2);
    assert_int_equal(fy_backend_model_prepare(cuda, &c, B, T), 0);
    struct step_out ref, run;
    step_alloc(&ref, &m);
    step_alloc(&run, &m);
    pipeline_step(cuda, 0, &m, &ref);
    pipeline_step(kept, 1, &m, &run);
    size_t NC = (size_t)B * T * c.n_embd;
    assert_memory_equal(run.xs, ref.xs, NC * (c.n_layer + 1) * sizeof(float));
    assert_memory_equal(&run.loss, &ref.loss, sizeof ref.loss);
    for (unsigned u = 0; u < m.n_units; u++)
        assert_memory_equal(run.grads[u], ref.grads[u], m.sizes[u] * sizeof(float));
    /* the backward's last dx (block 1's): where the swaps of pipeline_step left it */
    float *ref_dx = c.n_layer % 2 ? ref.dx : ref.dy, *run_dx = c.n_layer % 2 ? run.dx : run.dy;
    assert_memory_equal(run_dx, ref_dx, NC * sizeof(float));
    print_message("%s head%s: queued with both blocks kept: the bits of one by one, recomputing "
                  "(loss %.7f)\n",
                  tied ? "tied" : "untied", packed ? ", packed documents" : "", ref.loss);
    step_free(&ref, &m);
    step_free(&run, &m);
    fy_backend_destroy(&kept);
    fy_refmodel_free(&m);
}

static void test_queued_kept_same_bits(void **state)
{
    queued_kept_case(1, 0);
    queued_kept_case(0, 0);
    queued_kept_case(0, 1);
}

/* The windows' positions (t everywhere) give the bytes of no positions: the backend takes them as
 * none (gpu_worker/backend_ops.h), so the kernels of before run. */
static void test_windows_positions_same_bytes(void **state)
{
    struct fy_model_config c = llama(0);
    struct fy_refmodel none, windows;
    assert_int_equal(fy_refmodel_init(&none, &c, B, T, 49), 0);
    assert_int_equal(fy_refmodel_init(&windows, &c, B, T, 49), 0);
    windows.positions = malloc((size_t)B * T * sizeof *windows.positions);
    assert_non_null(windows.positions);
    for (int i = 0; i < B * T; i++)
        windows.positions[i] = i % T;
    if (fy_refmodel_forward_backward(&none, cuda) != 0)
        fail_msg("cuda: %s", none.err);
    if (fy_refmodel_forward_backward(&windows, cuda) != 0)
        fail_msg("cuda: %s", windows.err);
    assert_memory_equal(&none.loss, &windows.loss, sizeof none.loss);
    assert_memory_equal(none.logits, windows.logits, (size_t)B * T * c.vocab * sizeof(float));
    for (unsigned u = 0; u < none.n_units; u++)
        assert_memory_equal(none.grads[u], windows.grads[u], none.sizes[u] * sizeof(float));
    fy_refmodel_free(&none);
    fy_refmodel_free(&windows);
}

static uint16_t *to_bf16(const float *x, size_t n)
{
    uint16_t *h = malloc(n * sizeof *h);
    for (size_t i = 0; h != NULL && i < n; i++)
        h[i] = fy_f32_to_bf16(x[i]);
    return h;
}

/* Activations as bf16 in host memory against f32: the device holds them in bf16 either way, so
 * every output has the same bits (each bf16 activation widened equals the f32 one). */
static void test_bf16_host_activations_same_bits(void **state)
{
    struct fy_model_config c = llama(0);
    struct fy_refmodel m;
    assert_int_equal(fy_refmodel_init(&m, &c, B, T, 53), 0);
    assert_int_equal(fy_backend_model_prepare(cuda, &c, B, T), 0);
    size_t NC = (size_t)B * T * c.n_embd, ne = m.sizes[0], nb = m.sizes[1], nf = m.sizes[3];
    float *x = falloc(NC), *y = falloc(NC), *dy = falloc(NC), *dx = falloc(NC);
    float *dfin = falloc(nf), *demb = falloc(ne), *dp = falloc(nb);
    float *dfin2 = falloc(nf), *demb2 = falloc(ne), *dp2 = falloc(nb);
    uint16_t *xh = malloc(NC * 2), *yh = malloc(NC * 2), *dyh = malloc(NC * 2);
    uint16_t *dxh = malloc(NC * 2);
    double loss, loss2;
    float *embed = m.params[0], *block = m.params[1], *fin = m.params[3];
    assert_int_equal(fy_backend_model_act_dtype(cuda, FY_DTYPE_F32), 0);
    assert_int_equal(fy_backend_model_embed_forward(cuda, embed, m.tokens, NULL, x), 0);
    assert_int_equal(fy_backend_model_block_forward(cuda, 1, block, NULL, x, y, NULL), 0);
    assert_int_equal(fy_backend_model_head(cuda, fin, embed, y, m.targets, &loss, dy, dfin, demb),
                     0);
    assert_int_equal(fy_backend_model_block_backward(cuda, 1, block, NULL, x, dy, dx, dp, NULL), 0);
    assert_int_equal(fy_backend_model_act_dtype(cuda, FY_DTYPE_BF16), 0);
    assert_int_equal(fy_backend_model_embed_forward(cuda, embed, m.tokens, NULL, xh), 0);
    uint16_t *want = to_bf16(x, NC);
    assert_memory_equal(xh, want, NC * 2);
    free(want);
    assert_int_equal(fy_backend_model_block_forward(cuda, 1, block, NULL, xh, yh, NULL), 0);
    want = to_bf16(y, NC);
    assert_memory_equal(yh, want, NC * 2);
    free(want);
    assert_int_equal(
        fy_backend_model_head(cuda, fin, embed, yh, m.targets, &loss2, dyh, dfin2, demb2), 0);
    assert_memory_equal(&loss2, &loss, sizeof loss);
    assert_memory_equal(dfin2, dfin, nf * sizeof(float));
    assert_memory_equal(demb2, demb, ne * sizeof(float));
    want = to_bf16(dy, NC);
    assert_memory_equal(dyh, want, NC * 2);
    free(want);
    assert_int_equal(fy_backend_model_block_backward(cuda, 1, block, NULL, xh, dyh, dxh, dp2, NULL),
                     0);
    want = to_bf16(dx, NC);
    assert_memory_equal(dxh, want, NC * 2);
    free(want);
    assert_memory_equal(dp2, dp, nb * sizeof(float));
    assert_int_equal(fy_backend_model_act_dtype(cuda, FY_DTYPE_F32), 0);
    print_message("bf16 and f32 host activations: identical outputs (loss %.6f)\n", loss);
    free(x), free(y), free(dy), free(dx), free(dfin), free(demb), free(dp), free(dfin2);
    free(demb2), free(dp2), free(xh), free(yh), free(dyh), free(dxh);
    fy_refmodel_free(&m);
}

/* Swapped internals (-ENOTSUP, nothing queued), the planner's profile (-ENOTSUP), readying swaps
 * (-ENOTSUP), and a head size the kernels do not take (-EINVAL). */
static void test_refusals(void **state)
{
    struct fy_model_config c = llama(1);
    struct fy_refmodel m;
    assert_int_equal(fy_refmodel_init(&m, &c, B, T, 59), 0);
    assert_int_equal(fy_backend_model_prepare(cuda, &c, B, T), 0);
    size_t NC = (size_t)B * T * c.n_embd;
    float *x = falloc(NC), *y = falloc(NC), *region = falloc(NC * 4);
    struct fy_block_saved saved;
    memset(&saved, 0, sizeof saved);
    saved.at[FY_ACT_QKV] = region;
    print_message("(error lines about Llama refusals are expected next)\n");
    assert_int_equal(fy_backend_model_block_forward(cuda, 1, m.params[1], NULL, x, y, &saved),
                     -ENOTSUP);
    assert_int_equal(fy_backend_model_swap(cuda), -ENOTSUP);
    struct fy_block_profile prof;
    assert_int_equal(fy_backend_model_profile(cuda, region, NC * 4 * sizeof(float), &prof),
                     -ENOTSUP);
    /* the unit still works after the refusals */
    assert_int_equal(fy_backend_model_block_forward(cuda, 1, m.params[1], NULL, x, y, NULL), 0);
    struct fy_model_config odd = c;
    odd.n_embd = 96;
    odd.n_head = 8; /* head size 12 */
    fy_llama_mut(&odd)->n_kv_head = 4;
    assert_int_equal(fy_model_config_validate(&odd), 0);
    assert_int_equal(fy_backend_model_prepare(cuda, &odd, B, T), -EINVAL);
    free(x);
    free(y);
    free(region);
    fy_refmodel_free(&m);
}

int main(void)
{
    if (!fy_backend_cuda_built()) {
        printf("test_cuda_llama: SKIPPED: this build has no CUDA backend (nvcc not found)\n");
        return FY_TEST_SKIP;
    }
    if (fy_backend_open(&cuda, "cuda", 0) < 0) {
        printf("test_cuda_llama: SKIPPED: no usable CUDA device on this machine\n");
        return FY_TEST_SKIP;
    }
    if (fy_backend_open(&cpu, "cpu", 0) < 0)
        return 1;
    /* the arena is sized by the first preparation: the untied model's is the larger */
    struct fy_model_config first = llama(0);
    if (fy_backend_model_prepare(cuda, &first, B, T) < 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_units_match_cpu),
        cmocka_unit_test(test_whole_model_matches_cpu),
        cmocka_unit_test(test_packed_matches_cpu),
        cmocka_unit_test(test_queued_kept_same_bits),
        cmocka_unit_test(test_windows_positions_same_bytes),
        cmocka_unit_test(test_bf16_host_activations_same_bits),
        cmocka_unit_test(test_refusals),
    };
    int failed = cmocka_run_group_tests_name("cuda Llama units", tests, NULL, NULL);
    fy_backend_destroy(&cuda);
    fy_backend_destroy(&cpu);
    return failed;
}
