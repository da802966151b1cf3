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
 * costs O(mk + kn) against the product's O(mkn): about a tenth at the driver's tile sizes, so B
 * operands the driver multiplies many times come packed (pack_b, gemm_packed: the backward's K^T,
 * V^T and K of a key block, once per block instead of once per query block).
 * Rounding is exact for the bf16 inputs (q, k, v, dout: the driver applies the softmax scale to
 * S in f32, never to q); it rounds P and dS, as FlashAttention's bf16 kernels do; every sum stays
 * in f32.
 */
#include "impl/cpu/cpu.h"
#include "impl/cpu/decode_ahead.h"

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

/* out[p * ldo + 2c + t] = bf16(src[(2p + t) * ld + c]) for p < ceil(k / 2), c < ncols_pad (a
 * multiple of 16; columns past ncols and the row past k are zero). */
static void pack_pairs(const float *src, int64_t ld, int64_t k, int64_t ncols, int64_t ncols_pad,
                       uint16_t *out, int64_t ldo) {
  const int64_t kp = (k + 1) / 2;
  for (int64_t p = 0; p < kp; ++p) {
    const float *r0 = src + 2 * p * ld;
    const float *r1 = 2 * p + 1 < k ? r0 + ld : NULL;
    uint16_t *o = out + p * ldo;
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

/* One pair step of tile: C rows += A's pair p times B's pair row bp. */
ALWAYS_INLINE void tile_step(const int R, const int NV, int64_t p, const uint32_t *a, int64_t ars,
                             int64_t aps, const uint16_t *bp, __m512 *c0, __m512 *c1) {
  const __m512bh b0 = (__m512bh)_mm512_loadu_si512((const void *)bp);
  const __m512bh b1 = NV > 1 ? (__m512bh)_mm512_loadu_si512((const void *)(bp + 32)) : b0;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[r * ars + p * aps]);
    c0[r] = _mm512_dpbf16_ps(c0[r], av, b0);
    if (NV > 1) c1[r] = _mm512_dpbf16_ps(c1[r], av, b1);
  }
}

/* R rows x 16 * NV columns of C += A B over kp pairs. A's pair p of row r is the 32-bit word
 * a[r * ars + p * aps]; B's pair row p < kp - 1 starts at b + p * ldb (uint16), the last at
 * `last` (gemm_packed's copy with an odd k's partner row zeroed). */
ALWAYS_INLINE void tile(const int R, const int NV, int64_t kp, const uint32_t *a, int64_t ars,
                        int64_t aps, const uint16_t *b, int64_t ldb, const uint16_t *last,
                        float *c, int64_t ldc, int acc) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    c0[r] = acc ? _mm512_loadu_ps(c + r * ldc) : _mm512_setzero_ps();
    c1[r] = (NV > 1 && acc) ? _mm512_loadu_ps(c + r * ldc + 16) : _mm512_setzero_ps();
  }
  for (int64_t p = 0; p + 1 < kp; ++p) tile_step(R, NV, p, a, ars, aps, b + p * ldb, c0, c1);
  if (kp > 0) tile_step(R, NV, kp - 1, a, ars, aps, last, c0, c1);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(c + r * ldc, c0[r]);
    if (NV > 1) _mm512_storeu_ps(c + r * ldc + 16, c1[r]);
  }
}

#define TILE_CASE(R)                                                                               \
  case R:                                                                                          \
    if (nv == 2) tile(R, 2, kp, ai, ars, aps, bj, ldb, lj, cij, ldc, accumulate);                  \
    else tile(R, 1, kp, ai, ars, aps, bj, ldb, lj, cij, ldc, accumulate);                          \
    break;

/* C (+)= A B with B as pair rows (p < kp - 1 at bp + p * ldb, the last at last), A rounded into
 * ap (scratch) as gemm's comment says. */
static void product(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, int trans_a,
                    const uint16_t *bp, int64_t ldb, const uint16_t *last, float *c, int64_t ldc,
                    int accumulate, uint16_t *ap) {
  const int64_t kp = (k + 1) / 2, mpad = (m + 15) / 16 * 16;
  int64_t ars, aps;
  if (trans_a) {
    pack_pairs(a, lda, k, m, mpad, ap, 2 * mpad); /* word (r, p) at p * mpad + r */
    ars = 1, aps = mpad;
  } else {
    pack_rows(a, lda, m, k, ap); /* word (r, p) at r * kp + p */
    ars = kp, aps = 1;
  }
  for (int64_t j = 0; j < n; j += 32) {
    const int nv = n - j >= 32 ? 2 : 1;
    for (int64_t i = 0; i < m; i += MR) {
      const int rows = (int)(m - i < MR ? m - i : MR);
      const uint32_t *ai = (const uint32_t *)ap + i * ars;
      const uint16_t *bj = bp + 2 * j, *lj = last + 2 * j;
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

static void gemm_avx512bf16(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                            int trans_a, const float *b, int64_t ldb_f, float *c, int64_t ldc,
                            int accumulate, void *scratch) {
  const int64_t kp = (k + 1) / 2;
  uint16_t *bp = (uint16_t *)scratch;
  pack_pairs(b, ldb_f, k, n, n, bp, 2 * n);
  product(m, n, k, a, lda, trans_a, bp, 2 * n, bp + (kp > 0 ? kp - 1 : 0) * 2 * n, c, ldc,
          accumulate, bp + kp * n * 2);
}

/* cpu.h's pack_b: the pairs gemm packs per product, packed once by the driver (the backward's
 * K^T, V^T and K of a key block, which every query block of the item multiplies: repacking them
 * per product took 8% of a bf16 backward, issue 12's profile). */
static void pack_b_avx512bf16(const float *b, int64_t ldb, int64_t k, int64_t n, uint16_t *out,
                              int64_t ldo) {
  pack_pairs(b, ldb, k, n, n, out, ldo);
}

/* gemm with B packed by pack_b (pair rows ldb apart). The packed rows past k may be other keys'
 * (the driver offsets into a block), so an odd k's last pair row is copied into the scratch with
 * its partner zeroed: 0 * inf would be NaN, and the sums stay those of gemm bit for bit. */
static void gemm_packed_avx512bf16(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                                   int trans_a, const uint16_t *b, int64_t ldb, float *c,
                                   int64_t ldc, int accumulate, void *scratch) {
  const int64_t kp = (k + 1) / 2;
  uint16_t *tail = (uint16_t *)scratch, *ap = tail + 2 * n;
  const uint16_t *last = b + (kp > 0 ? kp - 1 : 0) * ldb;
  if (k % 2 == 1) {
    const __m512i low = _mm512_set1_epi32(0xffff); /* a pair's first row: its low half */
    for (int64_t col = 0; col < n; col += 16) {
      const __m512i pairs = _mm512_loadu_si512((const void *)(last + 2 * col));
      _mm512_storeu_si512((void *)(tail + 2 * col), _mm512_and_si512(pairs, low));
    }
    last = tail;
  }
  product(m, n, k, a, lda, trans_a, b, ldb, last, c, ldc, accumulate, ap);
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

/* ---- the decode path's bf16 loops (cpu.h's attn_cpu_decode_block) ----------------------------
 *
 * Instructions per key and KV head (D = Dv = 128, R = 4 rows, Tq = 1), against the loops before
 * (scores by vdpbf16ps one head at a time over the block, P V by f32 FMA on widened rows):
 *   scores: 16 vdpbf16ps, 4 K and 4 q loads (q shared by 4 keys), 12 for the reduction (16 sums
 *           in one transpose tree of 4 keys x 4 rows), 1 store; before: 16 q loads and 13 for 4
 *           scalar sums;
 *   P V:    16 vdpbf16ps (two keys each), 4 V loads, 4 unpacks, 4 loads and 4 stores of O (held
 *           over four key pairs); before: 32 FMA, 8 widening shifts/masks, O in registers;
 *   and 8 line requests (prefetcht0), which no longer depend on the layout for their order.
 * Measured on one Zen 5 thread with the data in cache: 36 GB/s of K+V where the loops before ran
 * at 21-25 (dev/cpu/decode_bench.c, b1 sk2048). */

static inline int64_t min64i(int64_t x, int64_t y) { return x < y ? x : y; }

/* The 16 sums of a[0..15] as one vector, lane 4 i + k holding the sum of a[i + 4 k]: one tree of
 * shuffles (45 instructions where 16 separate sums take about 80). */
ALWAYS_INLINE __m512 reduce16(const __m512 *a) {
  __m512 b[8], c[4], d[2];
  for (int i = 0; i < 8; ++i) /* b[i]: a[2i]'s 256-bit halves summed, then a[2i + 1]'s */
    b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i) /* c[i]: 4 lanes each of a[4i .. 4i + 3] */
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i) /* d[i]: per 128-bit lane k, 2 lanes of a[8i + k], 2 of a[8i + 4 + k] */
    d[i] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(c[2 * i], c[2 * i + 1], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
}

/* Scores of 4 rows (q0 .. q0 + 3 ldq) against kn <= 4 keys k[0..3] (the missing ones repeat a
 * present row; their sums are dropped), D a multiple of 32; stored to S rows, lds apart. */
ALWAYS_INLINE void scores_4x4(const uint16_t *q0, int64_t ldq, const uint16_t *const *k, int64_t kn,
                              int64_t D, float scale, float *S, int64_t lds) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 32) {
    __m512bh kv[4], qv[4];
    for (int u = 0; u < 4; ++u) kv[u] = (__m512bh)_mm512_loadu_si512(k[u] + d);
    for (int r = 0; r < 4; ++r) qv[r] = (__m512bh)_mm512_loadu_si512(q0 + r * ldq + d);
    for (int u = 0; u < 4; ++u) /* acc[4 key + row]: reduce16 puts it in lane 4 row + key */
      for (int r = 0; r < 4; ++r) acc[4 * u + r] = _mm512_dpbf16_ps(acc[4 * u + r], qv[r], kv[u]);
  }
  const __m512 sums = _mm512_mul_ps(reduce16(acc), _mm512_set1_ps(scale));
  const __mmask8 keys = (__mmask8)((1u << kn) - 1u);
  _mm_mask_storeu_ps(S, keys, _mm512_extractf32x4_ps(sums, 0));
  _mm_mask_storeu_ps(S + lds, keys, _mm512_extractf32x4_ps(sums, 1));
  _mm_mask_storeu_ps(S + 2 * lds, keys, _mm512_extractf32x4_ps(sums, 2));
  _mm_mask_storeu_ps(S + 3 * lds, keys, _mm512_extractf32x4_ps(sums, 3));
}

/* One row against kn <= 4 keys (as scores_4x4): the rows past a multiple of 4. */
ALWAYS_INLINE void scores_1x4(const uint16_t *q0, const uint16_t *const *k, int64_t kn, int64_t D,
                              float scale, float *S) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t d = 0; d < D; d += 32) {
    const __m512bh qv = (__m512bh)_mm512_loadu_si512(q0 + d);
    for (int u = 0; u < 4; ++u) acc[u] = _mm512_dpbf16_ps(acc[u], qv, (__m512bh)_mm512_loadu_si512(k[u] + d));
  }
  float sum[4];
  hsum4_avx512(acc[0], acc[1], acc[2], acc[3], sum);
  for (int64_t u = 0; u < kn; ++u) S[u] = scale * sum[u];
}

void attn_cpu_decode_scores_bf16(const attn_cpu_decode_block *a) {
  const int64_t R = a->R, nb = a->nb;
  ahead_cursor cur;
  ahead_start(&cur, a, (nb + 3) / 4 * a->heads);
  for (int64_t j0 = 0; j0 < nb; j0 += 4) {
    const int64_t kn = nb - j0 < 4 ? nb - j0 : 4;
    for (int64_t g = 0; g < a->heads; ++g) {
      request_ahead(&cur, cur.quota);
      const uint16_t *k[4];
      for (int u = 0; u < 4; ++u)
        k[u] = (const uint16_t *)(a->rows[j0 + (u < kn ? u : 0)] + (size_t)g * a->head_bytes);
      const uint16_t *q = a->q + g * R * a->ldq;
      const int64_t lds = ATTN_CPU_DECODE_BLOCK;
      float *S = a->S + g * R * lds + j0;
      int64_t r = 0;
      for (; r + 4 <= R; r += 4) scores_4x4(q + r * a->ldq, a->ldq, k, kn, a->D, a->scale, S + r * lds, lds);
      for (; r < R; ++r) scores_1x4(q + r * a->ldq, k, kn, a->D, a->scale, S + r * lds);
    }
  }
  request_ahead(&cur, -1);
}

/* O rows (R of them, ldo apart) += P V over NP <= 4 key pairs (the 32-bit words p[r * ldp32 + t]
 * of P, pair t) for NC <= 2 chunks of 32 columns from column d: each pair's two rows unpacked
 * into pairs of elements (vpunpck[lh]wd), then one vdpbf16ps per 16 columns, pair and row. Four
 * pairs a load and store of O: with Tq = 4 (16 rows a KV head) every head's O is 64 KiB, which
 * L1 does not hold, and its traffic bounded the loop at two pairs. */
ALWAYS_INLINE void pv_window(const int NP, const int NC, const uint16_t *const *v, int64_t d,
                             const uint32_t *p, int64_t ldp32, int64_t R, float *O, int64_t ldo) {
  __m512bh lo[4][2], hi[4][2];
  for (int t = 0; t < NP; ++t)
    for (int c = 0; c < NC; ++c) {
      const __m512i e = _mm512_loadu_si512(v[2 * t] + d + 32 * c);
      const __m512i o = v[2 * t + 1] != NULL ? _mm512_loadu_si512(v[2 * t + 1] + d + 32 * c)
                                             : _mm512_setzero_si512();
      lo[t][c] = (__m512bh)_mm512_unpacklo_epi16(e, o);
      hi[t][c] = (__m512bh)_mm512_unpackhi_epi16(e, o);
    }
  for (int64_t r = 0; r < R; ++r) {
    __m512bh pw[4];
    for (int t = 0; t < NP; ++t) pw[t] = (__m512bh)_mm512_set1_epi32((int)p[r * ldp32 + t]);
    float *o = O + r * ldo + d;
    for (int c = 0; c < NC; ++c) {
      __m512 x = _mm512_loadu_ps(o + 32 * c), y = _mm512_loadu_ps(o + 32 * c + 16);
      for (int t = 0; t < NP; ++t) {
        x = _mm512_dpbf16_ps(x, pw[t], lo[t][c]);
        y = _mm512_dpbf16_ps(y, pw[t], hi[t][c]);
      }
      _mm512_storeu_ps(o + 32 * c, x), _mm512_storeu_ps(o + 32 * c + 16, y);
    }
  }
}

#define PV_KEYS 8 /* keys a step: four pairs */

#define PV_CASE(NP, NC)                                                                             \
  case 4 * (NC - 1) + NP - 1:                                                                       \
    pv_window(NP, NC, v, d, p, 16, R, O, a->ldo);                                                   \
    break;

void attn_cpu_decode_pv_bf16(const attn_cpu_decode_block *a) {
  const int64_t R = a->R, nb = a->nb, rows = a->heads * R;
  /* P as bf16 (round to nearest even), each row's 32 keys in 16 pair words; keys past nb are 0 */
  const __mmask16 lo16 = (__mmask16)(nb >= 16 ? 0xffff : (1u << nb) - 1u);
  const __mmask16 hi16 = (__mmask16)(nb >= 32 ? 0xffff : nb <= 16 ? 0 : (1u << (nb - 16)) - 1u);
  for (int64_t r = 0; r < rows; ++r) {
    const float *x = a->S + r * ATTN_CPU_DECODE_BLOCK;
    const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi16, x + 16), _mm512_maskz_loadu_ps(lo16, x));
    _mm512_storeu_si512((void *)(a->P + r * 32), (__m512i)b);
  }
  ahead_cursor cur;
  ahead_start(&cur, a, (nb + PV_KEYS - 1) / PV_KEYS * a->heads);
  for (int64_t j0 = 0; j0 < nb; j0 += PV_KEYS) {
    const int64_t np = (min64i(PV_KEYS, nb - j0) + 1) / 2;
    for (int64_t g = 0; g < a->heads; ++g) {
      request_ahead(&cur, cur.quota);
      const uint16_t *v[PV_KEYS];
      for (int u = 0; u < PV_KEYS; ++u)
        v[u] = j0 + u < nb ? (const uint16_t *)(a->rows[j0 + u] + (size_t)g * a->head_bytes) : NULL;
      const uint32_t *p = (const uint32_t *)(a->P + g * R * 32) + j0 / 2;
      float *O = a->O + g * R * a->ldo;
      for (int64_t d = 0; d < a->Dv; d += 64) {
        const int64_t nc = a->Dv - d >= 64 ? 2 : 1;
        switch (4 * (nc - 1) + np - 1) {
          PV_CASE(1, 1)
          PV_CASE(2, 1)
          PV_CASE(3, 1)
          PV_CASE(4, 1)
          PV_CASE(1, 2)
          PV_CASE(2, 2)
          PV_CASE(3, 2)
          PV_CASE(4, 2)
        default: break;
        }
      }
    }
  }
  request_ahead(&cur, -1);
}

const attn_cpu_kernels attn_cpu_kernels_avx512bf16 = {
    .name = "avx512bf16",
    .gemm = gemm_avx512bf16,
    .pack_b = pack_b_avx512bf16,
    .gemm_packed = gemm_packed_avx512bf16,
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
    .decode_scores = attn_cpu_decode_scores_avx512,
    .decode_pv = attn_cpu_decode_pv_avx512,
};
