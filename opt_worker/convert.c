/* Weights from f32 to bf16 on the opt worker's threads (opt_worker/convert.h). */
#include "convert.h"

#include <errno.h>
#include <string.h>

#include "common/base/check.h"
#include "common/base/dtype.h"
#include "opt_worker/simd.h"
#include "opt_worker/threads.h"

static void convert_scalar(const float *src, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = fy_f32_to_bf16(src[i]);
}

FY_AVX2 static void convert_avx2(const float *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), fy_simd_avx2_bf16(_mm256_loadu_ps(src + i)));
    convert_scalar(src + i, dst + i, n - i);
}

FY_AVX512 static void convert_avx512(const float *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i), fy_simd_avx512_bf16(_mm512_loadu_ps(src + i)));
    convert_scalar(src + i, dst + i, n - i);
}

struct convert_job {
    const float *src;
    uint16_t *dst;
    size_t n;
    void (*kernel)(const float *src, uint16_t *dst, size_t n);
};

static int convert_run(void *arg, unsigned index, unsigned count)
{
    const struct convert_job *j = arg;
    size_t begin, end;
    /* ranges of whole cache lines of the destination */
    fy_threads_split(j->n, 32, index, count, &begin, &end);
    if (end > begin)
        j->kernel(j->src + begin, j->dst + begin, end - begin);
    return 0;
}

int fy_convert_to_bf16(struct fy_threads *pool, const float *src, uint16_t *dst, size_t n,
                       enum fy_adamw_impl impl)
{
    if (impl == FY_ADAMW_AUTO)
        impl = fy_adamw_best_impl();
    FY_REQUIRE(fy_adamw_impl_supported(impl), -EINVAL,
               "convert to bf16: the %s kernel is not supported by this CPU (best: %s)",
               fy_adamw_impl_name(impl), fy_adamw_impl_name(fy_adamw_best_impl()));
    FY_REQUIRE(n == 0 || (src != NULL && dst != NULL), -EINVAL,
               "convert to bf16: a NULL buffer for %zu elements", n);
    struct convert_job j = {.src = src, .dst = dst, .n = n,
                            .kernel = impl == FY_ADAMW_AVX512 ? convert_avx512
                                      : impl == FY_ADAMW_AVX2 ? convert_avx2
                                                              : convert_scalar};
    if (pool == NULL || n < 2 * (size_t)FY_CONVERT_MIN_PER_THREAD)
        return convert_run(&j, 0, 1);
    return fy_threads_run(pool, convert_run, &j);
}

struct copy_job {
    const float *src;
    float *dst;
    size_t n;
};

static int copy_run(void *arg, unsigned index, unsigned count)
{
    const struct copy_job *j = arg;
    size_t begin, end;
    fy_threads_split(j->n, 16, index, count, &begin, &end);
    if (end > begin)
        memcpy(j->dst + begin, j->src + begin, (end - begin) * sizeof *j->dst);
    return 0;
}

int fy_convert_copy_f32(struct fy_threads *pool, const float *src, float *dst, size_t n)
{
    FY_REQUIRE(n == 0 || (src != NULL && dst != NULL), -EINVAL,
               "copy of f32 weights: a NULL buffer for %zu elements", n);
    struct copy_job j = {.src = src, .dst = dst, .n = n};
    if (pool == NULL || n < 2 * (size_t)FY_CONVERT_MIN_PER_THREAD)
        return copy_run(&j, 0, 1);
    return fy_threads_run(pool, copy_run, &j);
}
