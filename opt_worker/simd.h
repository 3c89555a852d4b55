/* The SIMD building blocks the optimizer's kernels share (opt_worker/adamw, opt_worker/moments):
 * the target attributes, and bf16 <-> f32 on 8 (AVX2) and 16 (AVX-512) lanes, bit for bit what
 * common/base/dtype.h's scalar conversions give (round to nearest even, NaN kept quiet). Header only:
 * static inline functions, compiled into each kernel with its target. */
#ifndef FY_SIMD_H
#define FY_SIMD_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#define FY_AVX2 __attribute__((target("avx2")))
#define FY_AVX2_INLINE static inline __attribute__((always_inline, target("avx2")))
#define FY_AVX512 __attribute__((target("avx512f,avx512bw")))
#define FY_AVX512_INLINE static inline __attribute__((always_inline, target("avx512f,avx512bw")))

/* 8 values from f32, or bf16 widened (exact), at element i. */
FY_AVX2_INLINE __m256 fy_simd_avx2_load(const void *g, int bf16, size_t i)
{
    if (bf16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)g + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_loadu_ps((const float *)g + i);
}

/* fy_f32_to_bf16 on 8 lanes. */
FY_AVX2_INLINE __m128i fy_simd_avx2_bf16(__m256 f)
{
    __m256i b = _mm256_castps_si256(f);
    __m256i hi = _mm256_srli_epi32(b, 16);
    /* abs <= 0x7fffffff, so the signed compare is right */
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)),
                                                   lsb), 16);
    __m256i q = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, q, nan);
    /* every lane is < 65536, so the unsigned saturation never triggers */
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

/* 16 values from f32, or bf16 widened (exact), at element i. */
FY_AVX512_INLINE __m512 fy_simd_avx512_load(const void *g, int bf16, size_t i)
{
    if (bf16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)g + i));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return _mm512_loadu_ps((const float *)g + i);
}

/* fy_f32_to_bf16 on 16 lanes. */
FY_AVX512_INLINE __m256i fy_simd_avx512_bf16(__m512 f)
{
    __m512i b = _mm512_castps_si512(f);
    __m512i hi = _mm512_srli_epi32(b, 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)),
                                                   lsb), 16);
    r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r); /* lanes < 65536: truncation is exact */
}

#endif
