/*
 * src/impl/cpu/kernels_avx2.c - AVX2 + FMA kernels of the "cpu" implementation. Compiled with
 * -mavx2 -mfma -mf16c; only called after cpuid said the machine has them (all three).
 *
 * gemm: MR rows x 16 columns (12 ymm accumulators, two B loads and one broadcast per k step: 15 of
 * the 16 ymm registers). exp: Cephes' expf polynomial with 2^n built in the exponent field; inputs
 * below -87.3 (where 2^n would leave the normal range) give exactly 0, as -inf must.
 */
#include "impl/cpu/cpu.h"
#include "impl/cpu/decode_kernels.h"

#include "core/dtype.h"

#include <immintrin.h>
#include <math.h>

#define MR 6

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE void tile(const int R, const int TRANS, int64_t k, const float *a, int64_t lda,
                        const float *b, int64_t ldb, float *c, int64_t ldc, int acc) {
  __m256 c0[MR], c1[MR];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    c0[r] = acc ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();
    c1[r] = acc ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps();
  }
  for (int64_t kk = 0; kk < k; ++kk) {
    const float *bk = b + kk * ldb;
    const __m256 b0 = _mm256_loadu_ps(bk);
    const __m256 b1 = _mm256_loadu_ps(bk + 8);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_broadcast_ss(TRANS ? a + kk * lda + r : a + r * lda + kk);
      c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(c + r * ldc, c0[r]);
    _mm256_storeu_ps(c + r * ldc + 8, c1[r]);
  }
}

#define TILE_CASE(R)                                                                               \
  case R:                                                                                          \
    if (trans) tile(R, 1, k, ai, lda, bj, ldb, cij, ldc, acc);                                    \
    else tile(R, 0, k, ai, lda, bj, ldb, cij, ldc, acc);                                          \
    break;

static void gemm_avx2(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, int trans_a,
                      const float *b, int64_t ldb, float *c, int64_t ldc, int accumulate,
                        void *scratch) {
  (void)scratch;
  for (int64_t j = 0; j < n; j += 16) {
    for (int64_t i = 0; i < m; i += MR) {
      const int rows = (int)(m - i < MR ? m - i : MR);
      const float *ai = trans_a ? a + i : a + i * lda;
      const int trans = trans_a, acc = accumulate;
      const float *bj = b + j;
      float *cij = c + i * ldc + j;
      switch (rows) {
        TILE_CASE(1)
        TILE_CASE(2)
        TILE_CASE(3)
        TILE_CASE(4)
        TILE_CASE(5)
        TILE_CASE(6)
      default: break;
      }
    }
  }
}

ALWAYS_INLINE __m256 exp256(__m256 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3365447505531f), _CMP_LT_OQ);
  /* The clamps take x second: maxps/minps return their second operand when one is NaN, so a NaN
   * score stays NaN (SPEC: NaN reaches the rows it is in) instead of becoming a clamp bound. */
  x = _mm256_max_ps(_mm256_set1_ps(-87.3365447505531f), x);
  x = _mm256_min_ps(_mm256_set1_ps(88.3762626647949f), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500E-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  /* 2^n for n in [-126, 127]: n + 127 in the exponent field. Split in two factors so that n = 128
   * (x near 88.7) does not overflow the field. */
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  const __m256 s2 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
  p = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  return _mm256_andnot_ps(underflow, p);
}

static float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

static float hmax256(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

static float row_max_avx2(const float *x, int64_t n) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + j));
  float r = hmax256(m);
  for (; j < n; ++j) r = x[j] > r ? x[j] : r;
  return r;
}

static float exp_sum_avx2(float *x, int64_t n, float m) {
  const __m256 mv = _mm256_set1_ps(m), zero = _mm256_setzero_ps();
  __m256 s = _mm256_setzero_ps();
  int64_t j = 0;
  /* min(0, x - m), NaN second so that it stays NaN (cpu.h says why) */
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp256(_mm256_min_ps(zero, _mm256_sub_ps(_mm256_loadu_ps(x + j), mv)));
    _mm256_storeu_ps(x + j, e);
    s = _mm256_add_ps(s, e);
  }
  if (j < n) {
    float tmp[8];
    int64_t t = 0;
    for (; t < n - j; ++t) tmp[t] = x[j + t];
    for (; t < 8; ++t) tmp[t] = -INFINITY;
    const __m256 e = exp256(_mm256_min_ps(zero, _mm256_sub_ps(_mm256_loadu_ps(tmp), mv)));
    _mm256_storeu_ps(tmp, e);
    s = _mm256_add_ps(s, e);
    for (t = 0; t < n - j; ++t) x[j + t] = tmp[t];
  }
  return hsum256(s);
}

static void scale_avx2(float *x, int64_t n, float s) {
  const __m256 sv = _mm256_set1_ps(s);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), sv));
  for (; j < n; ++j) x[j] *= s;
}

static void ds_row_avx2(float *dp, const float *p, int64_t n, float delta) {
  const __m256 dv = _mm256_set1_ps(delta);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm256_storeu_ps(dp + j, _mm256_mul_ps(_mm256_loadu_ps(p + j),
                                           _mm256_sub_ps(_mm256_loadu_ps(dp + j), dv)));
  for (; j < n; ++j) dp[j] = p[j] * (dp[j] - delta);
}

/* tanh(y) and its derivative as the AVX-512 table's tanh512: sign(y) (1 - 2u / (1 + u)) with
 * u = exp(-2|y|), the odd Taylor polynomial below |y| = 1/16 (truncation error < 1e-12 there), and
 * *sech2 = 4u / (1 + u)^2 (not 1 - t * t, which cancels near +-1). exp256 gives 0 below f32's
 * normal range, so large |y| and infinities give exactly +-1 and a derivative of 0. */
ALWAYS_INLINE __m256 tanh256(__m256 y, __m256 *sech2) {
  const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
  const __m256 a = _mm256_andnot_ps(sign, y);
  const __m256 u = exp256(_mm256_mul_ps(a, _mm256_set1_ps(-2.0f)));
  const __m256 u1 = _mm256_add_ps(u, one);
  __m256 big = _mm256_sub_ps(one, _mm256_div_ps(_mm256_add_ps(u, u), u1));
  big = _mm256_or_ps(big, _mm256_and_ps(sign, y)); /* y's sign */
  const __m256 y2 = _mm256_mul_ps(y, y);
  __m256 p = _mm256_set1_ps(-17.0f / 315.0f);
  p = _mm256_fmadd_ps(p, y2, _mm256_set1_ps(2.0f / 15.0f));
  p = _mm256_fmadd_ps(p, y2, _mm256_set1_ps(-1.0f / 3.0f));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, y2), y, y);
  if (sech2 != NULL)
    *sech2 = _mm256_div_ps(_mm256_mul_ps(_mm256_set1_ps(4.0f), u), _mm256_mul_ps(u1, u1));
  return _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, _mm256_set1_ps(0.0625f), _CMP_LT_OQ));
}

static void softcap_avx2(float *x, float *dc, int64_t n, float cap) {
  const __m256 c = _mm256_set1_ps(cap), inv = _mm256_set1_ps(1.0f / cap);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t j = 0; j < n; j += 8) {
    const int left = n - j >= 8 ? 8 : (int)(n - j);
    const __m256i k = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), lane); /* the tail's lanes */
    __m256 sech2;
    const __m256 t =
        tanh256(_mm256_mul_ps(_mm256_maskload_ps(x + j, k), inv), dc != NULL ? &sech2 : NULL);
    _mm256_maskstore_ps(x + j, k, _mm256_mul_ps(c, t));
    if (dc != NULL) _mm256_maskstore_ps(dc + j, k, sech2);
  }
}

/* F16C: vcvtph2ps is exact; vcvtps2ph rounds to nearest even, overflows to inf, as core/dtype.h. */
static void load_f16_avx2(const uint16_t *src, int64_t n, float s, float *dst) {
  const __m256 sv = _mm256_set1_ps(s);
  int64_t d = 0;
  for (; d + 8 <= n; d += 8)
    _mm256_storeu_ps(
        dst + d, _mm256_mul_ps(sv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + d)))));
  for (; d < n; ++d) dst[d] = s * attn_inline_f16_to_f32(src[d]);
}

static void store_f16_avx2(uint16_t *dst, int64_t n, const float *src, float s) {
  const __m256 sv = _mm256_set1_ps(s);
  int64_t d = 0;
  for (; d + 8 <= n; d += 8)
    _mm_storeu_si128((__m128i *)(dst + d),
                     _mm256_cvtps_ph(_mm256_mul_ps(sv, _mm256_loadu_ps(src + d)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; d < n; ++d) dst[d] = attn_inline_f32_to_f16(s * src[d]);
}

const attn_cpu_kernels attn_cpu_kernels_avx2 = {
    .name = "avx2",
    .gemm = gemm_avx2,
    .gemm_exact = gemm_avx2,
    .row_max = row_max_avx2,
    .exp_sum = exp_sum_avx2,
    .scale = scale_avx2,
    .ds_row = ds_row_avx2,
    .softcap = softcap_avx2,
    .load_f16 = load_f16_avx2,
    .store_f16 = store_f16_avx2,
    .dropout_keep = attn_cpu_dropout_keep_generic,
    .decode_scores = decode_scores_kernel,
    .decode_pv = decode_pv_kernel,
};
