/*
 * src/impl/cpu/kernels_avx512.c - AVX-512 (F, BW, VL, DQ) + FMA kernels of the "cpu" implementation.
 * Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c; only called after cpuid
 * said the machine has them.
 *
 * gemm: a register-blocked micro-kernel of MR rows x 32 columns (16 zmm accumulators, two B loads
 * and one broadcast per k step), the shape BLIS uses for f32 on Skylake-X/Zen 4. The tile loops are
 * written over compile-time constants so that the compiler keeps the accumulators in registers.
 * exp: Cephes' expf polynomial (about 1 ulp on [-ln2/2, ln2/2]) with _mm512_scalef_ps for 2^n.
 */
#include "impl/cpu/cpu.h"
#include "impl/cpu/decode_kernels.h"
#include "impl/cpu/exp2_avx512.h"

#include <immintrin.h>
#include <math.h>

#define MR 8

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* C's rows [0, R) x columns [0, 16 NV) += A B over k, B's two 16-column halves read from b0 and b1,
 * each ldb floats a row: b0 + 16 with B's own row stride (gemm), or two panels (gemm_panels). */
ALWAYS_INLINE void tile(const int R, const int NV, const int TRANS, int64_t k, const float *a,
                        int64_t lda, const float *b0p, const float *b1p, int64_t ldb, float *c,
                        int64_t ldc, int acc) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    c0[r] = acc ? _mm512_loadu_ps(c + r * ldc) : _mm512_setzero_ps();
    c1[r] = (NV > 1 && acc) ? _mm512_loadu_ps(c + r * ldc + 16) : _mm512_setzero_ps();
  }
  for (int64_t kk = 0; kk < k; ++kk) {
    const __m512 b0 = _mm512_loadu_ps(b0p + kk * ldb);
    const __m512 b1 = NV > 1 ? _mm512_loadu_ps(b1p + kk * ldb) : b0;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(TRANS ? a[kk * lda + r] : a[r * lda + kk]);
      c0[r] = _mm512_fmadd_ps(av, b0, c0[r]);
      if (NV > 1) c1[r] = _mm512_fmadd_ps(av, b1, c1[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(c + r * ldc, c0[r]);
    if (NV > 1) _mm512_storeu_ps(c + r * ldc + 16, c1[r]);
  }
}

#define TILE_CASE(R)                                                                               \
  case R:                                                                                          \
    if (nv == 2) {                                                                                 \
      if (trans) tile(R, 2, 1, k, a, lda, b0, b1, ldb, c, ldc, acc);                               \
      else tile(R, 2, 0, k, a, lda, b0, b1, ldb, c, ldc, acc);                                     \
    } else {                                                                                       \
      if (trans) tile(R, 1, 1, k, a, lda, b0, b1, ldb, c, ldc, acc);                               \
      else tile(R, 1, 0, k, a, lda, b0, b1, ldb, c, ldc, acc);                                     \
    }                                                                                              \
    break;

static void tile_any(int rows, int nv, int trans, int64_t k, const float *a, int64_t lda,
                     const float *b0, const float *b1, int64_t ldb, float *c, int64_t ldc,
                     int acc) {
  switch (rows) {
    TILE_CASE(1)
    TILE_CASE(2)
    TILE_CASE(3)
    TILE_CASE(4)
    TILE_CASE(5)
    TILE_CASE(6)
    TILE_CASE(7)
    TILE_CASE(8)
  default: break;
  }
}

void attn_cpu_gemm_avx512(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, int trans_a,
                        const float *b, int64_t ldb, float *c, int64_t ldc, int accumulate,
                        void *scratch) {
  (void)scratch;
  for (int64_t j = 0; j < n; j += 32) {
    const int nv = n - j >= 32 ? 2 : 1;
    for (int64_t i = 0; i < m; i += MR) {
      const int rows = (int)(m - i < MR ? m - i : MR);
      const float *ai = trans_a ? a + i : a + i * lda;
      tile_any(rows, nv, trans_a, k, ai, lda, b + j, b + j + 16, ldb, c + i * ldc + j, ldc,
               accumulate);
    }
  }
}

/* gemm_panels' micro-kernel: C's rows [0, R) x columns [0, 16 NV) (+)= A B over k, A row-major,
 * B's NV 16-column panels ps floats apart, each row 16 floats. PMR x PNV = 6 x 4: 24 accumulators,
 * 4 B loads and 6 broadcasts per 24 multiply-adds (gemm's 8 x 2 makes 10 loads per 16), for the
 * two loads a cycle of Sapphire Rapids' 512-bit ports. Alone (m 64, n 256, k 128, in L1/L2) it runs
 * at 97% of the FMA peak on Zen 5, as 8 x 2 does there; in the forward, the product Q K^T took 7%
 * fewer cycles than gemm's row-major walk (issue 15). */
#define PMR 6
#define PNV 4
ALWAYS_INLINE void panel_tile(const int R, const int NV, int64_t k, const float *a, int64_t lda,
                              const float *b, int64_t ps, float *c, int64_t ldc, int acc) {
  __m512 cv[PMR][PNV];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      cv[r][v] = acc ? _mm512_loadu_ps(c + r * ldc + 16 * v) : _mm512_setzero_ps();
  for (int64_t kk = 0; kk < k; ++kk) {
    __m512 bv[PNV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_ps(b + v * ps + kk * ATTN_CPU_NPAD);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * lda + kk]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) cv[r][v] = _mm512_fmadd_ps(av, bv[v], cv[r][v]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + 16 * v, cv[r][v]);
}

#define PANEL_ROWS(R)                                                                              \
  case R:                                                                                          \
    switch (nv) {                                                                                  \
    case 1: panel_tile(R, 1, k, a, lda, b, ps, c, ldc, acc); break;                                \
    case 2: panel_tile(R, 2, k, a, lda, b, ps, c, ldc, acc); break;                                \
    case 3: panel_tile(R, 3, k, a, lda, b, ps, c, ldc, acc); break;                                \
    default: panel_tile(R, 4, k, a, lda, b, ps, c, ldc, acc); break;                               \
    }                                                                                              \
    break;

static void panel_tile_any(int rows, int nv, int64_t k, const float *a, int64_t lda, const float *b,
                           int64_t ps, float *c, int64_t ldc, int acc) {
  switch (rows) {
    PANEL_ROWS(1)
    PANEL_ROWS(2)
    PANEL_ROWS(3)
    PANEL_ROWS(4)
    PANEL_ROWS(5)
    PANEL_ROWS(6)
  default: break;
  }
}

/* cpu.h's gemm_panels. */
void attn_cpu_gemm_panels_avx512(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                                 const float *b, int64_t panel_stride, float *c, int64_t ldc,
                                 int accumulate) {
  for (int64_t j = 0; j < n; j += 16 * PNV) {
    const int nv = (int)((n - j) / 16 < PNV ? (n - j) / 16 : PNV);
    const float *bj = b + j / 16 * panel_stride;
    for (int64_t i = 0; i < m; i += PMR) {
      const int rows = (int)(m - i < PMR ? m - i : PMR);
      panel_tile_any(rows, nv, k, a + i * lda, lda, bj, panel_stride, c + i * ldc + j, ldc,
                     accumulate);
    }
  }
}

/* cpu.h's transpose16: 16 x 16 blocks in registers. Rows r_i; unpacklo/hi pair rows 2i, 2i + 1
 * within each 128-bit lane; shuffle_ps then gathers four rows' column 4L + c in lane L of u[4g + c]
 * (rows 4g .. 4g + 3); a 4 x 4 transpose of 128-bit lanes (shuffle_f32x4) makes column j. Against
 * 16 scalar loads and stores per column: 96 instructions per 256 elements. */
void attn_cpu_transpose16_avx512(const float *src, int64_t lds, int64_t n, float *dst) {
  for (int64_t d0 = 0; d0 < n; d0 += 16) {
    const __mmask16 k = n - d0 >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - d0)) - 1u);
    __m512 r[16], t[16], u[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) r[i] = _mm512_maskz_loadu_ps(k, src + i * lds + d0);
#pragma GCC unroll 8
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < 16; g += 4) {
      u[g] = _mm512_shuffle_ps(t[g], t[g + 2], 0x44);
      u[g + 1] = _mm512_shuffle_ps(t[g], t[g + 2], 0xEE);
      u[g + 2] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0x44);
      u[g + 3] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
    }
    const int64_t cols = n - d0 < 16 ? n - d0 : 16;
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);
      const __m512 v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
      const __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
      const __m512 v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
      const __m512 out[4] = {
          _mm512_shuffle_f32x4(v0, v2, 0x88), _mm512_shuffle_f32x4(v0, v2, 0xDD),
          _mm512_shuffle_f32x4(v1, v3, 0x88), _mm512_shuffle_f32x4(v1, v3, 0xDD)};
#pragma GCC unroll 4
      for (int l = 0; l < 4; ++l)
        if (4 * l + c < cols) _mm512_storeu_ps(dst + (d0 + 4 * l + c) * 16, out[l]);
    }
  }
}

/* exp(x) for x <= 88; exactly 0 for x <= -127 (and -inf); NaN for NaN. */
ALWAYS_INLINE __m512 exp512(__m512 x) {
  /* x second: maxps/minps return their second operand when one is NaN, so NaN stays NaN. */
  x = _mm512_max_ps(_mm512_set1_ps(-127.0f), x);
  x = _mm512_min_ps(_mm512_set1_ps(88.3762626647949f), x);
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

/* Four chains: vmaxps' latency, not its rate (the forward's rows are one chain each otherwise). */
float attn_cpu_row_max_avx512(const float *x, int64_t n) {
  __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
  int64_t j = 0;
  for (; j + 64 <= n; j += 64) {
    m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + j));
    m1 = _mm512_max_ps(m1, _mm512_loadu_ps(x + j + 16));
    m2 = _mm512_max_ps(m2, _mm512_loadu_ps(x + j + 32));
    m3 = _mm512_max_ps(m3, _mm512_loadu_ps(x + j + 48));
  }
  for (; j + 16 <= n; j += 16) m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x + j));
  if (j < n) {
    const __mmask16 k = (__mmask16)((1u << (n - j)) - 1u);
    m1 = _mm512_max_ps(m1, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, x + j));
  }
  return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
}

float attn_cpu_exp_sum_avx512(float *x, int64_t n, float m) {
  const __m512 mv = _mm512_set1_ps(m), zero = _mm512_setzero_ps();
  __m512 s = _mm512_setzero_ps();
  int64_t j = 0;
  /* min(0, x - m), NaN second so that it stays NaN (cpu.h says why) */
  for (; j + 16 <= n; j += 16) {
    const __m512 e = exp512(_mm512_min_ps(zero, _mm512_sub_ps(_mm512_loadu_ps(x + j), mv)));
    _mm512_storeu_ps(x + j, e);
    s = _mm512_add_ps(s, e);
  }
  if (j < n) {
    const __mmask16 k = (__mmask16)((1u << (n - j)) - 1u);
    const __m512 e = exp512(_mm512_min_ps(zero, _mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), mv)));
    _mm512_mask_storeu_ps(x + j, k, e);
    s = _mm512_add_ps(s, _mm512_maskz_mov_ps(k, e));
  }
  return _mm512_reduce_add_ps(s);
}

/* cpu.h's exp_sum_scaled, 32 columns a step: x[j] = 2^((s x[j] - m) log2(e)) (exp2_probability;
 * s x - m first, scaled_difference, so that no product with log2(e) overflows). Against
 * scale_max's pass writing s x, then exp_sum's Cephes exp (16 instructions a vector): one write of
 * the row fewer and 12 instructions. Two sums: vaddps' latency, not its rate. */
float attn_cpu_exp_sum_scaled_avx512(float *x, int64_t n, float s, float m) {
  const __m512 sv = _mm512_set1_ps(s), mv = _mm512_set1_ps(m);
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    const __m512 e0 = exp2_probability(
        _mm512_mul_ps(scaled_difference(_mm512_loadu_ps(x + j), sv, mv), log2e));
    const __m512 e1 = exp2_probability(
        _mm512_mul_ps(scaled_difference(_mm512_loadu_ps(x + j + 16), sv, mv), log2e));
    _mm512_storeu_ps(x + j, e0);
    _mm512_storeu_ps(x + j + 16, e1);
    s0 = _mm512_add_ps(s0, e0);
    s1 = _mm512_add_ps(s1, e1);
  }
  for (; j < n; j += 16) {
    const __mmask16 k = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
    const __m512 e = exp2_probability(
        _mm512_mul_ps(scaled_difference(_mm512_maskz_loadu_ps(k, x + j), sv, mv), log2e));
    _mm512_mask_storeu_ps(x + j, k, e);
    s0 = _mm512_add_ps(s0, _mm512_maskz_mov_ps(k, e));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

void attn_cpu_scale_avx512(float *x, int64_t n, float s) {
  const __m512 sv = _mm512_set1_ps(s);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) _mm512_storeu_ps(x + j, _mm512_mul_ps(_mm512_loadu_ps(x + j), sv));
  for (; j < n; ++j) x[j] *= s;
}

/* scale and row_max in one pass over the row: x[j] *= s, returning the max of the scaled row. */
float attn_cpu_scale_max_avx512(float *x, int64_t n, float s) {
  const __m512 sv = _mm512_set1_ps(s);
  __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0; /* two chains: vmaxps' latency, not its rate */
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    const __m512 a = _mm512_mul_ps(_mm512_loadu_ps(x + j), sv);
    const __m512 b = _mm512_mul_ps(_mm512_loadu_ps(x + j + 16), sv);
    _mm512_storeu_ps(x + j, a);
    _mm512_storeu_ps(x + j + 16, b);
    m0 = _mm512_max_ps(m0, a);
    m1 = _mm512_max_ps(m1, b);
  }
  for (; j < n; j += 16) {
    const __mmask16 k = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
    const __m512 a = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + j), sv);
    _mm512_mask_storeu_ps(x + j, k, a);
    m0 = _mm512_mask_max_ps(m0, k, m0, a);
  }
  return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}

void attn_cpu_ds_row_avx512(float *dp, const float *p, int64_t n, float delta) {
  const __m512 dv = _mm512_set1_ps(delta);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    _mm512_storeu_ps(dp + j, _mm512_mul_ps(_mm512_loadu_ps(p + j),
                                           _mm512_sub_ps(_mm512_loadu_ps(dp + j), dv)));
  for (; j < n; ++j) dp[j] = p[j] * (dp[j] - delta);
}

/* tanh(y) = sign(y) (1 - 2u / (1 + u)) with u = exp(-2|y|) in [0, 1], and its odd Taylor
 * polynomial below |y| = 1/16, where the subtraction would lose relative accuracy (truncation error
 * < 1e-12 there). *sech2 (when sech2 is not NULL) gets the derivative 1 - tanh^2 = 4u / (1 + u)^2,
 * accurate to a few ulps wherever it is: 1 - t * t would cancel once tanh is near +-1 (at |y| = 10
 * not one correct digit in f32, issue 19's soft-cap finding). u = 0 for large |y| and infinities:
 * tanh exactly +-1, derivative 0. */
static inline __m512 tanh512(__m512 y, __m512 *sech2) {
  const __m512 a = _mm512_abs_ps(y), one = _mm512_set1_ps(1.0f);
  const __m512 u = exp512(_mm512_mul_ps(a, _mm512_set1_ps(-2.0f)));
  const __m512 u1 = _mm512_add_ps(u, one);
  __m512 big = _mm512_sub_ps(one, _mm512_div_ps(_mm512_add_ps(u, u), u1));
  const __m512 y2 = _mm512_mul_ps(y, y);
  __m512 p = _mm512_set1_ps(-17.0f / 315.0f);
  p = _mm512_fmadd_ps(p, y2, _mm512_set1_ps(2.0f / 15.0f));
  p = _mm512_fmadd_ps(p, y2, _mm512_set1_ps(-1.0f / 3.0f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, y2), y, y);
  /* copy y's sign onto the large-argument branch */
  big = _mm512_castsi512_ps(_mm512_or_si512(
      _mm512_castps_si512(big),
      _mm512_and_si512(_mm512_castps_si512(y), _mm512_set1_epi32((int)0x80000000u))));
  if (sech2 != NULL)
    *sech2 = _mm512_div_ps(_mm512_mul_ps(_mm512_set1_ps(4.0f), u), _mm512_mul_ps(u1, u1));
  const __mmask16 is_small = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.0625f), _CMP_LT_OQ);
  return _mm512_mask_blend_ps(is_small, big, small);
}

void attn_cpu_softcap_avx512(float *x, float *dc, int64_t n, float cap) {
  const __m512 c = _mm512_set1_ps(cap), inv = _mm512_set1_ps(1.0f / cap);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
    __m512 sech2;
    const __m512 t =
        tanh512(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + j), inv), dc != NULL ? &sech2 : NULL);
    _mm512_mask_storeu_ps(x + j, k, _mm512_mul_ps(c, t));
    if (dc != NULL) _mm512_mask_storeu_ps(dc + j, k, sech2);
  }
}

/* f16 rows with AVX-512F's vcvtph2ps / vcvtps2ph (masked tails): exact, and round to nearest even. */
void attn_cpu_load_f16_avx512(const uint16_t *src, int64_t n, float s, float *dst) {
  const __m512 sv = _mm512_set1_ps(s);
  for (int64_t d = 0; d < n; d += 16) {
    const __mmask16 k = n - d >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - d)) - 1u);
    const __m256i h = _mm256_maskz_loadu_epi16(k, src + d);
    _mm512_mask_storeu_ps(dst + d, k, _mm512_mul_ps(sv, _mm512_cvtph_ps(h)));
  }
}

void attn_cpu_store_f16_avx512(uint16_t *dst, int64_t n, const float *src, float s) {
  const __m512 sv = _mm512_set1_ps(s);
  for (int64_t d = 0; d < n; d += 16) {
    const __mmask16 k = n - d >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - d)) - 1u);
    const __m512 x = _mm512_mul_ps(sv, _mm512_maskz_loadu_ps(k, src + d));
    _mm256_mask_storeu_epi16(dst + d, k,
                             _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

/* High and low 32 bits of the 32 x 32-bit products of every lane with m (a broadcast constant). */
static inline __m512i mulhi32(__m512i a, __m512i m) {
  const __m512i even = _mm512_mul_epu32(a, m);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
  return _mm512_mask_blend_epi32((__mmask16)0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

/* Philox4x32-10 of core/philox.h on 16 counters at once (columns j0 .. j0 + 63). */
void attn_cpu_dropout_keep_avx512(uint64_t seed, uint32_t threshold, int64_t b, int64_t h,
                                  int64_t i, int64_t j0, int64_t n, uint8_t *keep) {
  const __m512i m0 = _mm512_set1_epi32((int)0xD2511F53u), m1 = _mm512_set1_epi32((int)0xCD9E8D57u);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i thr = _mm512_set1_epi32((int)threshold);
  for (int64_t jj = 0; jj < n; jj += 64) {
    __m512i c0 = _mm512_set1_epi32((int)(uint32_t)i);
    __m512i c1 = _mm512_add_epi32(_mm512_set1_epi32((int)(uint32_t)((j0 + jj) >> 2)), lane);
    __m512i c2 = _mm512_set1_epi32((int)(uint32_t)h);
    __m512i c3 = _mm512_set1_epi32((int)(uint32_t)b);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; ++round) {
      const __m512i hi0 = mulhi32(c0, m0), lo0 = _mm512_mullo_epi32(c0, m0);
      const __m512i hi1 = mulhi32(c2, m1), lo1 = _mm512_mullo_epi32(c2, m1);
      c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32((int)k0));
      c1 = lo1;
      c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32((int)k1));
      c3 = lo0;
      k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
    }
    const __mmask16 w[4] = {_mm512_cmpge_epu32_mask(c0, thr), _mm512_cmpge_epu32_mask(c1, thr),
                            _mm512_cmpge_epu32_mask(c2, thr), _mm512_cmpge_epu32_mask(c3, thr)};
    const int64_t cols = n - jj < 64 ? n - jj : 64;
    for (int64_t e = 0; e < cols; ++e) keep[jj + e] = (uint8_t)((w[e & 3] >> (e >> 2)) & 1u);
  }
}

/* The decode loops compiled for AVX-512, shared with the avx512bf16 table. */
void attn_cpu_decode_scores_avx512(const attn_cpu_decode_block *a, const float *q, int mode) {
  decode_scores_kernel(a, q, mode);
}

void attn_cpu_decode_pv_avx512(const attn_cpu_decode_block *a, int mode) {
  decode_pv_kernel(a, mode);
}

const attn_cpu_kernels attn_cpu_kernels_avx512 = {
    .name = "avx512",
    .gemm = attn_cpu_gemm_avx512,
    .gemm_exact = attn_cpu_gemm_avx512,
    .gemm_panels = attn_cpu_gemm_panels_avx512,
    .transpose16 = attn_cpu_transpose16_avx512,
    .row_max = attn_cpu_row_max_avx512,
    .exp_sum = attn_cpu_exp_sum_avx512,
    .exp_sum_scaled = attn_cpu_exp_sum_scaled_avx512,
    .scale = attn_cpu_scale_avx512,
    .scale_max = attn_cpu_scale_max_avx512,
    .ds_row = attn_cpu_ds_row_avx512,
    .softcap = attn_cpu_softcap_avx512,
    .load_f16 = attn_cpu_load_f16_avx512,
    .store_f16 = attn_cpu_store_f16_avx512,
    .dropout_keep = attn_cpu_dropout_keep_avx512,
    .decode_scores = attn_cpu_decode_scores_avx512,
    .decode_pv = attn_cpu_decode_pv_avx512,
};
