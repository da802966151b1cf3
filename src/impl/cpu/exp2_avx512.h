/*
 * src/impl/cpu/exp2_avx512.h - the forward's probabilities in base 2 on AVX-512, shared by the
 * avx512 table's exp pass (f32 P, kernels_avx512.c) and the AMX table's (bf16 P, kernels_amx.c).
 * Include only from files compiled with the AVX-512 flags.
 */
#ifndef ATTN_IMPL_CPU_EXP2_AVX512_H
#define ATTN_IMPL_CPU_EXP2_AVX512_H

#include <immintrin.h>

/* s x - m for the exp pass, m being the row's maximum of s x rounded (cpu.c: m = s max(x), which
 * rounding's monotonicity makes max(s x)): the product is rounded first, so that the maximum's own
 * difference is exactly 0 and every other is <= 0. A fused multiply-add would subtract m from the
 * exact s x instead, off by up to half an ulp of m: for logits near 1e30, differences near
 * +-1e22, whose exp is infinite or, for the maximum itself, 0 (a row summing to 0: NaN out;
 * test_numeric). */
static inline __attribute__((always_inline)) __m512 scaled_difference(__m512 x, __m512 s,
                                                                      __m512 m) {
  return _mm512_sub_ps(_mm512_mul_ps(x, s), m);
}

/* 2^t for t <= 127 (callers' t are differences from a maximum, <= 0); 0 for t <= -150 (and -inf):
 * a masked score's probability is exactly 0; NaN for NaN. The probabilities'
 * exp in base 2 (t = (s x - m) log2(e)), so that the reduction is t - round(t), with no ln 2
 * split: 11 instructions a vector from the score, where exp512 (kernels_avx512.c) and the
 * subtraction before it take 16. The price is t's own rounding, 2^-24 |t|: a relative error of
 * 6e-7 at |t| = 10, 7e-6 at the terms near 2^-150. A bf16 P rounds each term to 2^-9 for P V
 * anyway (or to 16 bits, hi + lo, 2^-17, with sinks); an f32 P keeps it, but a term's absolute
 * error, 2^t |t| 2^-24 ln 2, is at most 2e-8 of the row's largest term (1), under f32's own
 * rounding of that term, and SPEC.md's f32 rule allows 1e-4. The polynomial: 2^f's Taylor series
 * to f^6 on |f| <= 1/2, within 2.2e-7 of 2^f in f32. */
static inline __attribute__((always_inline)) __m512 exp2_probability(__m512 t) {
  t = _mm512_max_ps(_mm512_set1_ps(-150.0f), t); /* t second: a NaN t stays NaN */
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n); /* exact */
  __m512 p = _mm512_set1_ps(1.540352969e-04f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.333355787e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618128650e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550410971e-02f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402265072e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931471825e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

#endif /* ATTN_IMPL_CPU_EXP2_AVX512_H */
