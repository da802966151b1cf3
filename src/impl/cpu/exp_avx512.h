/*
 * src/impl/cpu/exp_avx512.h - exp on 16 floats, shared by the AVX-512 kernel files
 * (kernels_avx512.c, kernels_amx.c): Cephes' expf polynomial (about 1 ulp on [-ln2/2, ln2/2]) with
 * _mm512_scalef_ps for 2^n. Include it only from files compiled with -mavx512f.
 */
#ifndef ATTN_IMPL_CPU_EXP_AVX512_H
#define ATTN_IMPL_CPU_EXP_AVX512_H

#include <immintrin.h>

/* exp(x) for x <= 88.38 (for callers whose arguments are differences from a maximum: at most a
 * rounding above 0), without exp512's upper clamp; exactly 0 for x <= -127 (and -inf); NaN for
 * NaN. */
static inline __attribute__((always_inline)) __m512 exp512_bounded(__m512 x) {
  /* x second: maxps returns its second operand when one is NaN, so NaN stays NaN. */
  x = _mm512_max_ps(_mm512_set1_ps(-127.0f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500E-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
  const __m512 r2 = _mm512_mul_ps(r, r);
  p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

/* exp(x) for x <= 88 (larger x as 88.38: f32's largest); exactly 0 for x <= -127 (and -inf); NaN
 * for NaN (minps returns its second operand when one is NaN). */
static inline __attribute__((always_inline)) __m512 exp512(__m512 x) {
  return exp512_bounded(_mm512_min_ps(_mm512_set1_ps(88.3762626647949f), x));
}

#endif /* ATTN_IMPL_CPU_EXP_AVX512_H */
