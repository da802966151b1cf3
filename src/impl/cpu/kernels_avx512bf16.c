/*
 * src/impl/cpu/kernels_avx512bf16.c - the gemm of bf16 problems on AVX-512 machines with the BF16
 * extension (Zen 4, Cooper Lake, Sapphire Rapids). Compiled with -mavx512f -mavx512bw -mavx512vl
 * -mavx512dq -mavx512bf16 -mfma; chosen by cpu.c only for bf16 problems and only after cpuid said
 * the machine has it (ATTN_CPU_ISA=avx512 or lower forces the exact f32 kernels instead).
 *
 * vdpbf16ps multiplies pairs of bf16 and adds both products to an f32 lane: 32 multiply-adds per
 * instruction, twice vfmadd231ps. The operands arrive as f32 tiles (the driver is shared with the
 * f32 path) and are rounded to bf16 and interleaved in pairs along k into the scratch first:
 * B as [k/2][n][2], A as [m][k] (pairs are then adjacent) or, transposed, as [k/2][m][2]. Repacking
 * costs O(mk + kn) against the product's O(mkn): about a tenth at the driver's tile sizes.
 * Rounding is exact for the bf16 inputs (q, k, v, dout: the driver applies the softmax scale to
 * S in f32, never to q); it rounds P and dS, as FlashAttention's bf16 kernels do; every sum stays
 * in f32.
 */
#include "impl/cpu/cpu.h"

#include <immintrin.h>
#include <stdint.h>

#define MR 8

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* 16 floats of r0 and r1 (masked), rounded to bf16 and interleaved: r0[0], r1[0], r0[1], ... */
ALWAYS_INLINE __m512i pair16(const float *r0, const float *r1, __mmask16 mask) {
  const __m512i idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                       39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  __m256i a = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, r0));
  __m256i b = r1 != NULL ? (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, r1))
                         : _mm256_setzero_si256();
  return _mm512_permutex2var_epi16(_mm512_castsi256_si512(a), idx, _mm512_castsi256_si512(b));
}

/* out[p][c][t] = bf16(src[(2p + t) * ld + c]) for p < ceil(k / 2), c < ncols_pad (a multiple of
 * 16; columns past ncols and the row past k are zero). */
static void pack_pairs(const float *src, int64_t ld, int64_t k, int64_t ncols, int64_t ncols_pad,
                       uint16_t *out) {
  const int64_t kp = (k + 1) / 2;
  for (int64_t p = 0; p < kp; ++p) {
    const float *r0 = src + 2 * p * ld;
    const float *r1 = 2 * p + 1 < k ? r0 + ld : NULL;
    uint16_t *o = out + p * ncols_pad * 2;
    for (int64_t c = 0; c < ncols_pad; c += 16) {
      const int64_t left = ncols - c;
      const __mmask16 mask = left >= 16 ? (__mmask16)0xffff
                             : left <= 0 ? (__mmask16)0
                                         : (__mmask16)((1u << left) - 1u);
      _mm512_storeu_si512((void *)(o + 2 * c), pair16(r0 + c, r1 != NULL ? r1 + c : NULL, mask));
    }
  }
}

/* out[r][kk] = bf16(src[r * ld + kk]) for kk < 2 * ceil(k / 2) (the odd pad is zero). */
static void pack_rows(const float *src, int64_t ld, int64_t m, int64_t k, uint16_t *out) {
  const int64_t k2 = (k + 1) / 2 * 2;
  for (int64_t r = 0; r < m; ++r) {
    const float *s = src + r * ld;
    uint16_t *o = out + r * k2;
    for (int64_t c = 0; c < k2; c += 16) {
      const int64_t left = k - c;
      const __mmask16 mask = left >= 16 ? (__mmask16)0xffff
                             : left <= 0 ? (__mmask16)0
                                         : (__mmask16)((1u << left) - 1u);
      const int64_t room = k2 - c >= 16 ? 16 : k2 - c;
      __m256i v = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, s + c));
      _mm256_mask_storeu_epi16(o + c, (__mmask16)((1u << room) - 1u), v);
    }
  }
}

/* R rows x 16 * NV columns of C += A B over kp pairs. A's pair p of row r is the 32-bit word
 * a[r * ars + p * aps]; B's pair row p starts at b + p * ldb (uint16). */
ALWAYS_INLINE void tile(const int R, const int NV, int64_t kp, const uint32_t *a, int64_t ars,
                        int64_t aps, const uint16_t *b, int64_t ldb, float *c, int64_t ldc, int acc) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    c0[r] = acc ? _mm512_loadu_ps(c + r * ldc) : _mm512_setzero_ps();
    c1[r] = (NV > 1 && acc) ? _mm512_loadu_ps(c + r * ldc + 16) : _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < kp; ++p) {
    const uint16_t *bp = b + p * ldb;
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512((const void *)bp);
    const __m512bh b1 = NV > 1 ? (__m512bh)_mm512_loadu_si512((const void *)(bp + 32)) : b0;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[r * ars + p * aps]);
      c0[r] = _mm512_dpbf16_ps(c0[r], av, b0);
      if (NV > 1) c1[r] = _mm512_dpbf16_ps(c1[r], av, b1);
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
    if (nv == 2) tile(R, 2, kp, ai, ars, aps, bj, ldb, cij, ldc, accumulate);                      \
    else tile(R, 1, kp, ai, ars, aps, bj, ldb, cij, ldc, accumulate);                              \
    break;

static void gemm_avx512bf16(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                            int trans_a, const float *b, int64_t ldb_f, float *c, int64_t ldc,
                            int accumulate, void *scratch) {
  const int64_t kp = (k + 1) / 2, mpad = (m + 15) / 16 * 16;
  uint16_t *bp = (uint16_t *)scratch;
  uint16_t *ap = bp + kp * n * 2;
  pack_pairs(b, ldb_f, k, n, n, bp);
  int64_t ars, aps;
  if (trans_a) {
    pack_pairs(a, lda, k, m, mpad, ap); /* word (r, p) at p * mpad + r */
    ars = 1, aps = mpad;
  } else {
    pack_rows(a, lda, m, k, ap); /* word (r, p) at r * kp + p */
    ars = kp, aps = 1;
  }
  const int64_t ldb = n * 2;
  for (int64_t j = 0; j < n; j += 32) {
    const int nv = n - j >= 32 ? 2 : 1;
    for (int64_t i = 0; i < m; i += MR) {
      const int rows = (int)(m - i < MR ? m - i : MR);
      const uint32_t *ai = (const uint32_t *)ap + i * ars;
      const uint16_t *bj = bp + 2 * j;
      float *cij = c + i * ldc + j;
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
  }
}

/* The four sums of a0..a3 in one tree of lane shuffles. */
ALWAYS_INLINE void hsum4_avx512(__m512 a0, __m512 a1, __m512 a2, __m512 a3, float *s) {
  const __m512 t0 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xEE));
  const __m512 t1 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xEE));
  __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(t0, t1, 0x88), _mm512_shuffle_f32x4(t0, t1, 0xDD));
  u = _mm512_add_ps(u, _mm512_permute_ps(u, 0x4E));
  u = _mm512_add_ps(u, _mm512_permute_ps(u, 0xB1));
  float lanes[16];
  _mm512_storeu_ps(lanes, u);
  s[0] = lanes[0], s[1] = lanes[4], s[2] = lanes[8], s[3] = lanes[12];
}

/* The decode path's scores for bf16 rows (decode.c): S[r * lds + jj] = scale * dot(q row r, key
 * row jj), both bf16 as given (products exact, sums in f32), D a multiple of 32; the npf rows pf
 * (pf_bytes each) are requested meanwhile. vdpbf16ps takes
 * 32 element pairs per instruction, the even/odd widening and two f32 multiply-adds of the generic
 * loop in one, which the decode loop's arithmetic (Hq/Hkv query rows per key) is bound by. */
void attn_cpu_decode_dots_bf16(int64_t R, int64_t nb, int64_t D, const uint16_t *q, int64_t ldq,
                               const void *const *rows, float *S, int64_t lds, float scale,
                               const char *const *pf, int64_t npf, size_t pf_bytes) {
  for (int64_t jj = 0; jj < nb; ++jj) {
    for (int64_t u = jj; u < npf; u += nb) /* later rows, a few lines per key (see decode.c) */
      for (size_t at = 0; at < pf_bytes; at += 64) _mm_prefetch(pf[u] + at, _MM_HINT_T1);
    const uint16_t *k = (const uint16_t *)rows[jj];
    int64_t r = 0;
    for (; r + 4 <= R; r += 4) {
      const uint16_t *q0 = q + r * ldq, *q1 = q0 + ldq, *q2 = q1 + ldq, *q3 = q2 + ldq;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t d = 0; d < D; d += 32) {
        const __m512bh kv = (__m512bh)_mm512_loadu_si512(k + d);
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(q0 + d), kv);
        a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(q1 + d), kv);
        a2 = _mm512_dpbf16_ps(a2, (__m512bh)_mm512_loadu_si512(q2 + d), kv);
        a3 = _mm512_dpbf16_ps(a3, (__m512bh)_mm512_loadu_si512(q3 + d), kv);
      }
      float sum[4];
      hsum4_avx512(a0, a1, a2, a3, sum);
      for (int u = 0; u < 4; ++u) S[(r + u) * lds + jj] = scale * sum[u];
    }
    for (; r < R; ++r) {
      const uint16_t *q0 = q + r * ldq;
      __m512 a0 = _mm512_setzero_ps();
      for (int64_t d = 0; d < D; d += 32)
        a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(q0 + d),
                              (__m512bh)_mm512_loadu_si512(k + d));
      S[r * lds + jj] = scale * _mm512_reduce_add_ps(a0);
    }
  }
}

const attn_cpu_kernels attn_cpu_kernels_avx512bf16 = {
    .name = "avx512bf16",
    .gemm = gemm_avx512bf16,
    .gemm_exact = attn_cpu_gemm_avx512,
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
    .decode_dots = attn_cpu_decode_dots_avx512,
    .decode_axpys = attn_cpu_decode_axpys_avx512,
};
