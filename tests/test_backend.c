/* Backend selection and the activations' dtype in host buffers (gpu_worker/backend.h): what "auto"
 * resolves to, which dtype a backend prefers, and the CPU backend refusing bf16 activations, which
 * it does not compute in, with a message instead of misreading them. The CUDA side (bf16 and f32
 * host activations giving the same bits) is tests/gpu/test_cuda_gpt.c. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/dtype.h"
#include "common/model.h"
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
    fy_backend_close(&b);
    assert_null(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resolve),
        cmocka_unit_test(test_preferred_act_dtype),
        cmocka_unit_test(test_cpu_backend_takes_f32_activations_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
