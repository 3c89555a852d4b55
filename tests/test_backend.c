/* Backend selection and the activations' dtype in host buffers (gpu_worker/backend.h): what "auto"
 * resolves to, which dtype a backend prefers, and the CPU backend refusing bf16 activations, which
 * it does not compute in, with a message instead of misreading them. The CUDA side (bf16 and f32
 * host activations giving the same bits) is tests/gpu/test_cuda_gpt.c. And the CPU backend's
 * families (gpu_worker/cpu/cpu_family.h): what a family's table lacks (Llama: swapped internals,
 * the per-op profile) refused with a message; where it has them (GPT-2), a backward from swapped
 * internals gives the bits of recomputing them. And the CPU backend holding block gradients for
 * one-pass clipping (model_hold). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/model/actplan.h"
#include "common/model/arch/arch.h"
#include "common/base/dtype.h"
#include "common/model/arch/llama.h"
#include "common/model/model.h"
#include "gpu_worker/backend.h"

static void test_resolve(void **state)
{
    (void)state;
    assert_string_equal(fy_backend_resolve("cpu"), "cpu");
    assert_string_equal(fy_backend_resolve("cuda"), "cuda");
    const char *a = fy_backend_resolve("auto");
    assert_true(strcmp(a, "cpu") == 0 || strcmp(a, "cuda") == 0);
    if (!fy_backend_cuda_built())
        assert_string_equal(a, "cpu");
    print_message("auto resolves to %s here\n", a);
}

static void test_preferred_act_dtype(void **state)
{
    (void)state;
    assert_int_equal(fy_backend_preferred_act_dtype("cuda"), FY_DTYPE_BF16);
    assert_int_equal(fy_backend_preferred_act_dtype("cpu"), FY_DTYPE_F32);
}

static void test_cpu_backend_takes_f32_activations_only(void **state)
{
    (void)state;
    struct fy_model_config c = {.n_layer = 1, .n_head = 2, .n_embd = 8, .vocab = 16, .ctx = 8};
    struct fy_backend *b = NULL;
    assert_int_equal(fy_backend_open(&b, "cpu", 0), 0);
    assert_int_equal(fy_backend_model_prepare(b, &c, 2, 4), 0);
    assert_int_equal(fy_backend_model_act_dtype(b, FY_DTYPE_F32), 0);
    print_message("the CPU backend is expected to refuse bf16 activations (next line):\n");
    assert_int_equal(fy_backend_model_act_dtype(b, FY_DTYPE_BF16), -ENOTSUP);
    print_message("and an activation dtype that is neither (next line):\n");
    assert_int_equal(fy_backend_model_act_dtype(b, FY_DTYPE_I32), -EINVAL);
    fy_backend_destroy(&b);
    assert_null(b);
}

static float *filled(size_t n, float scale)
{
    float *p = malloc(n * sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = scale * (float)((int)(i % 13) - 6) / 6.0f;
    return p;
}

/* One block of c through the CPU backend: forward, backward recomputing its internals, then forward
 * and backward with every swappable kind saved. Returns the second pass's code (the first must
 * succeed); with 0, the two backwards' dx and dparams are compared bit for bit. */
static int block_with_saved(const struct fy_model_config *c)
{
    const int B = 2, T = 4;
    size_t P = fy_model_unit_params(c, 1), NC = (size_t)B * T * c->n_embd;
    struct fy_actplan_sizes sizes;
    struct fy_actplan_region reg;
    assert_int_equal(fy_actplan_sizes_backend(c, B, T, "cpu", &sizes), 0);
    assert_int_equal(fy_actplan_region_of(&sizes, FY_ACT_SWAPPABLE, &reg), 0);
    float *params = filled(P, 0.05f), *x = filled(NC, 1.0f), *y = filled(NC, 0.0f);
    float *dy = filled(NC, 0.5f), *dx[2] = {filled(NC, 0.0f), filled(NC, 0.0f)};
    float *dp[2] = {filled(P, 0.0f), filled(P, 0.0f)};
    char *region = malloc(reg.bytes);
    assert_non_null(region);
    struct fy_block_saved saved = {{0}};
    for (int k = 0; k < FY_ACT_KINDS; k++)
        if (FY_ACT_SWAPPABLE & FY_ACT_BIT(k))
            saved.at[k] = region + reg.offset[k];

    struct fy_backend *b = NULL;
    assert_int_equal(fy_backend_open(&b, "cpu", 0), 0);
    assert_int_equal(fy_backend_model_prepare(b, c, B, T), 0);
    assert_int_equal(fy_backend_model_block_forward(b, 1, params, NULL, x, y, NULL), 0);
    assert_int_equal(fy_backend_model_block_backward(b, 1, params, NULL, x, dy, dx[0], dp[0], NULL),
                     0);
    int rc = fy_backend_model_block_forward(b, 1, params, NULL, x, y, &saved);
    if (rc == 0)
        rc = fy_backend_model_block_backward(b, 1, params, NULL, x, dy, dx[1], dp[1], &saved);
    if (rc == 0) {
        assert_memory_equal(dx[0], dx[1], NC * sizeof(float));
        assert_memory_equal(dp[0], dp[1], P * sizeof(float));
    }
    fy_backend_destroy(&b);
    free(params), free(x), free(y), free(dy), free(dx[0]), free(dx[1]), free(dp[0]), free(dp[1]);
    free(region);
    return rc;
}

/* The per-op profile through the CPU backend (on values of its own). */
static int profile(const struct fy_model_config *c)
{
    size_t host_bytes = 1u << 20;
    void *host = calloc(1, host_bytes);
    assert_non_null(host);
    struct fy_backend *b = NULL;
    struct fy_block_profile out;
    assert_int_equal(fy_backend_open(&b, "cpu", 0), 0);
    assert_int_equal(fy_backend_model_prepare(b, c, 2, 4), 0);
    int rc = fy_backend_model_profile(b, host, host_bytes, &out);
    if (rc == 0)
        assert_true(out.fwd_s > 0 && out.recompute_s[FY_ACT_QKV] > 0 && out.flops_per_s > 0);
    fy_backend_destroy(&b);
    free(host);
    return rc;
}

static void test_cpu_families_capabilities(void **state)
{
    (void)state;
    const struct fy_model_config gpt2 = {.n_layer = 1, .n_head = 2, .n_embd = 8, .vocab = 16,
                                         .ctx = 8};
    const struct fy_model_config llama = {
        .n_layer = 1,
        .n_head = 2,
        .n_embd = 8,
        .vocab = 16,
        .ctx = 8,
        .arch = &fy_arch_llama,
        .family = fy_llama_family((struct fy_llama_fields){
            .n_kv_head = 1, .n_inter = 12, .rms_eps = 1e-5f, .rope_theta = 10000.0})};
    assert_int_equal(block_with_saved(&gpt2), 0);
    assert_int_equal(profile(&gpt2), 0);
    print_message("the CPU backend is expected to refuse Llama's swapped internals and profile "
                  "(the two errors below):\n");
    assert_int_equal(block_with_saved(&llama), -ENOTSUP);
    assert_int_equal(profile(&llama), -ENOTSUP);
}

/* Held gradients on the CPU backend: two block backwards kept in buffers 1 and 0 come back from
 * them bit for bit, after a third backward has rewritten the host gradient; a slot outside the
 * buffers, a second model_hold and holding before any backward are refused. */
static void test_cpu_backend_holds_gradients(void **state)
{
    (void)state;
    const struct fy_model_config c = {.n_layer = 2, .n_head = 2, .n_embd = 8, .vocab = 16,
                                      .ctx = 8};
    const int B = 2, T = 4;
    size_t P = fy_model_unit_params(&c, 1), NC = (size_t)B * T * c.n_embd;
    float *params = filled(P, 0.05f), *x = filled(NC, 1.0f), *dx = filled(NC, 0.0f);
    float *dy[2] = {filled(NC, 0.5f), filled(NC, -0.25f)};
    float *dp[2] = {filled(P, 0.0f), filled(P, 0.0f)}, *back = filled(P, 0.0f);
    struct fy_backend *b = NULL;
    assert_int_equal(fy_backend_open(&b, "cpu", 0), 0);
    assert_int_equal(fy_backend_model_prepare(b, &c, B, T), 0);
    print_message("holding before any buffer is taken and a slot outside the buffers are refused "
                  "(next lines):\n");
    assert_int_equal(fy_backend_model_hold_next(b, 0), -EINVAL);
    assert_int_equal(fy_backend_model_hold(b, 2), 0);
    assert_int_equal(fy_backend_model_hold(b, 2), -EINVAL);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(fy_backend_model_hold_next(b, 1 - i), 0);
        assert_int_equal(
            fy_backend_model_block_backward(b, 2 - i, params, NULL, x, dy[i], dx, dp[i], NULL), 0);
    }
    assert_memory_not_equal(dp[0], dp[1], P * sizeof(float));
    assert_int_equal(fy_backend_model_block_backward(b, 1, params, NULL, x, dy[0], dx, dp[1], NULL),
                     0);
    for (int i = 0; i < 2; i++) {
        float *want = filled(P, 0.0f);
        assert_int_equal(
            fy_backend_model_block_backward(b, 1, params, NULL, x, dy[i], dx, want, NULL), 0);
        assert_int_equal(fy_backend_model_hold_send(b, 1 - i, back), 0);
        assert_memory_equal(back, want, P * sizeof(float));
        free(want);
    }
    assert_int_equal(fy_backend_model_hold_send(b, 2, back), -EINVAL);
    assert_int_equal(fy_backend_model_hold_next(b, -1), -EINVAL);
    fy_backend_destroy(&b);
    free(params), free(x), free(dx), free(dy[0]), free(dy[1]), free(dp[0]), free(dp[1]);
    free(back);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resolve),
        cmocka_unit_test(test_preferred_act_dtype),
        cmocka_unit_test(test_cpu_backend_takes_f32_activations_only),
        cmocka_unit_test(test_cpu_families_capabilities),
        cmocka_unit_test(test_cpu_backend_holds_gradients),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
