/*
 * src/impl/cpu/decode_kernels.h - the vector loops of the cpu decode path (decode.c), written once
 * and compiled by each instruction-set file (kernels_generic.c, kernels_avx2.c, kernels_avx512.c)
 * with its own flags, so that each kernel table (cpu.h) carries its own copy and ATTN_CPU_ISA
 * lowers these like every other kernel.
 *
 * The loops use the compiler's vector extensions (16-lane f32 vectors, lowered to one AVX-512, two
 * AVX2 or four SSE registers) where the compiler has them, plain loops otherwise. They multiply and
 * add in one rounding (FMA) where the instruction set has it: GCC keeps them apart in ISO C mode
 * unless asked per function.
 *
 * Included by one .c file each; everything here is static.
 */
#ifndef ATTN_IMPL_CPU_DECODE_KERNELS_H
#define ATTN_IMPL_CPU_DECODE_KERNELS_H

#include "impl/cpu/cpu.h"
#include "impl/cpu/decode_ahead.h"

#include "core/dtype.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__GNUC__) && !defined(__clang__)
#define DECODE_KERNEL __attribute__((optimize("fp-contract=fast")))
#else
#define DECODE_KERNEL
#endif

#if defined(__GNUC__)
/* The helpers below pass 64-byte vectors by value; they are static and inlined within one file, so
 * the calling convention GCC warns may differ between instruction sets is never used across one.
 * (GCC reports it when the file ends, so the warning stays off for the rest of the including file:
 * -Wpsabi only ever speaks of such calls.) */
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float v16f __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

/* 16 elements of a row read as `kind` (ROWS_F32, ROWS_BF16 or ROWS_F16): f32, bf16 widened (its
 * bits are the top half of the f32's), or f16 converted (vcvtph2ps where the file has F16C). */
__attribute__((always_inline)) static inline v16f load16(const void *p, int kind) {
  if (kind == ROWS_F16) {
#if defined(__AVX512F__)
    return (v16f)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#elif defined(__F16C__)
    const __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    const __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p + 1));
    v16f f;
    memcpy(&f, &lo, sizeof lo), memcpy((char *)&f + sizeof lo, &hi, sizeof hi);
    return f;
#else
    v16f f;
    for (int u = 0; u < 16; ++u) f[u] = attn_f16_to_f32(((const uint16_t *)p)[u]);
    return f;
#endif
  }
  if (kind == ROWS_BF16) {
    v16h h;
    memcpy(&h, p, sizeof h);
    return (v16f)(__builtin_convertvector(h, v16u) << 16);
  }
  v16f f;
  memcpy(&f, p, sizeof f);
  return f;
}

static inline float hsum16(v16f a) {
  v8f lo, hi;
  memcpy(&lo, &a, sizeof lo);
  memcpy(&hi, (const char *)&a + sizeof lo, sizeof hi);
  v8f s8 = lo + hi;
  v4f l4, h4;
  memcpy(&l4, &s8, sizeof l4);
  memcpy(&h4, (const char *)&s8 + sizeof l4, sizeof h4);
  v4f s4 = l4 + h4;
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}
#endif

static inline float load1(const void *p, int64_t d, int kind) {
  if (kind == ROWS_F16) return attn_f16_to_f32(((const uint16_t *)p)[d]);
  return kind == ROWS_BF16 ? attn_bf16_to_f32(((const uint16_t *)p)[d]) : ((const float *)p)[d];
}

#if defined(__GNUC__)
/* The four sums of a0..a3 in one tree of shuffles (a sum per vector costs four times as much). */
static inline void hsum4(v16f a0, v16f a1, v16f a2, v16f a3, float *s) {
#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define DECODE_HAVE_SHUFFLE 1
#endif
#endif
#ifdef DECODE_HAVE_SHUFFLE
  const v16f x =
      __builtin_shufflevector(a0, a1, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
      __builtin_shufflevector(a0, a1, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  const v16f y =
      __builtin_shufflevector(a2, a3, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
      __builtin_shufflevector(a2, a3, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  v16f z =
      __builtin_shufflevector(x, y, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
      __builtin_shufflevector(x, y, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  z += __builtin_shufflevector(z, z, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  z += __builtin_shufflevector(z, z, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  s[0] = z[0], s[1] = z[4], s[2] = z[8], s[3] = z[12];
#else
  s[0] = hsum16(a0), s[1] = hsum16(a1), s[2] = hsum16(a2), s[3] = hsum16(a3);
#endif
}
#endif

/* Keys a step of the scores. Each (query row, key) pair of a step sums its products in a vector of
 * its own, so a step of 4 rows and SCORE_KEYS keys has 4 * SCORE_KEYS independent chains of
 * multiply-adds (one key's 4 chains, the step before, were bound by the FMA latency) and ends in
 * one reduction tree for all its sums (16 sums in about a quarter of the instructions of 16
 * separate ones). AVX-512 has 32 registers: 16 sums, 4 key and 4 query vectors fit, the bf16
 * loops' shape. With 16 AVX2 registers (two per 16-lane vector) 4 sums are all that fit. */
#if defined(__AVX512F__)
#define SCORE_KEYS 4
#else
#define SCORE_KEYS 1
#endif

#if defined(__GNUC__)
/* 16 elements of a K or V row from element d (a multiple of 16) as mode reads them: for
 * ROWS_BF16_PAIRS the even (d % 32 == 0) or odd elements of the 32 from d - d % 32, the order
 * decode.c permuted q and O into (rows of that mode have widths that are multiples of 32). */
__attribute__((always_inline)) static inline v16f row16(const void *row, int64_t d, int mode) {
  const char *k = (const char *)row;
  if (mode == ROWS_BF16_PAIRS) {
    v16u x;
    memcpy(&x, k + (size_t)(d / 32) * 64, sizeof x);
    return d % 32 == 0 ? (v16f)(x << 16) : (v16f)(x & 0xffff0000u);
  }
  return load16(k + (size_t)d * (mode == ROWS_F32 ? 4 : 2), mode);
}

/* The 16 sums of a[0..15] in one tree of shuffles: lane 4 r + u holds the sum of a[4 u + r]. */
static inline v16f reduce16(const v16f *a) {
#ifdef DECODE_HAVE_SHUFFLE
  v16f b[8], c[4], e[2];
  for (int i = 0; i < 8; ++i) /* b[i]: the 256-bit halves of a[2i], then a[2i + 1]'s, summed */
    b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19,
                                   20, 21, 22, 23) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26,
                                   27, 28, 29, 30, 31);
  for (int i = 0; i < 4; ++i) /* c[i]: 128-bit lane L a partial sum of a[4i + L] */
    c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19,
                                   24, 25, 26, 27) +
           __builtin_shufflevector(b[2 * i], b[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22,
                                   23, 28, 29, 30, 31);
  /* e[i]: lanes 4L, 4L + 1 partial sums of a[8i + L], lanes 4L + 2, 4L + 3 of a[8i + 4 + L] */
  for (int i = 0; i < 2; ++i)
    e[i] = __builtin_shufflevector(c[2 * i], c[2 * i + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25,
                                   12, 13, 28, 29) +
           __builtin_shufflevector(c[2 * i], c[2 * i + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26,
                                   27, 14, 15, 30, 31);
  /* lane 4L + k: the sum of a[L + 4k] */
  return __builtin_shufflevector(e[0], e[1], 0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28,
                                 30) +
         __builtin_shufflevector(e[0], e[1], 1, 3, 17, 19, 5, 7, 21, 23, 9, 11, 25, 27, 13, 15, 29,
                                 31);
#else
  v16f z;
  for (int r = 0; r < 4; ++r)
    for (int u = 0; u < 4; ++u) z[4 * r + u] = hsum16(a[4 * u + r]);
  return z;
#endif
}

/* S[r * lds + u] = dot(q row r (ldq apart), key row k[u]) for r < 4 and u < kn <= SCORE_KEYS (the
 * missing keys repeat a present row; their sums are dropped). */
DECODE_KERNEL
__attribute__((always_inline)) static inline void scores_4rows(const float *q, int64_t ldq,
                                                               const char *const *k, int64_t kn,
                                                               int64_t D, int mode, float *S,
                                                               int64_t lds) {
  const int kind = mode == ROWS_BF16_PAIRS ? ROWS_BF16 : mode; /* load1 */
  const int64_t Dw = D / 16 * 16;
  v16f acc[4 * SCORE_KEYS]; /* acc[4 u + r]: row r, key u */
  for (int i = 0; i < 4 * SCORE_KEYS; ++i) acc[i] = (v16f){0};
  for (int64_t d = 0; d < Dw; d += 16) {
    v16f kv[SCORE_KEYS];
    for (int u = 0; u < SCORE_KEYS; ++u) kv[u] = row16(k[u], d, mode);
    for (int r = 0; r < 4; ++r) {
      const v16f qv = load16(q + r * ldq + d, ROWS_F32);
      for (int u = 0; u < SCORE_KEYS; ++u) acc[4 * u + r] += qv * kv[u];
    }
  }
  float sum[4][4];
#if SCORE_KEYS == 4
  const v16f z = reduce16(acc);
  if (Dw == D && kn == 4) { /* the usual step: each row's four sums stored at once */
    for (int r = 0; r < 4; ++r) memcpy(S + r * lds, (const float *)&z + 4 * r, 4 * sizeof(float));
    return;
  }
  memcpy(sum, &z, sizeof sum);
#else
  for (int u = 0; u < SCORE_KEYS; ++u) {
    float s4[4];
    hsum4(acc[4 * u], acc[4 * u + 1], acc[4 * u + 2], acc[4 * u + 3], s4);
    for (int r = 0; r < 4; ++r) sum[r][u] = s4[r];
  }
#endif
  for (int64_t d = Dw; d < D; ++d)
    for (int u = 0; u < SCORE_KEYS; ++u) {
      const float kd = load1(k[u], d, kind);
      for (int r = 0; r < 4; ++r) sum[r][u] += q[r * ldq + d] * kd;
    }
  for (int r = 0; r < 4; ++r)
    for (int64_t u = 0; u < kn; ++u) S[r * lds + u] = sum[r][u];
}

/* S[u] = dot(q row, key row k[u]) for u < kn: one row past a multiple of 4. */
DECODE_KERNEL
__attribute__((always_inline)) static inline void
scores_1row(const float *q, const char *const *k, int64_t kn, int64_t D, int mode, float *S) {
  const int kind = mode == ROWS_BF16_PAIRS ? ROWS_BF16 : mode; /* load1 */
  const int64_t Dw = D / 16 * 16;
  v16f acc[SCORE_KEYS];
  for (int u = 0; u < SCORE_KEYS; ++u) acc[u] = (v16f){0};
  for (int64_t d = 0; d < Dw; d += 16) {
    const v16f qv = load16(q + d, ROWS_F32);
    for (int u = 0; u < SCORE_KEYS; ++u) acc[u] += qv * row16(k[u], d, mode);
  }
  float sum[SCORE_KEYS];
#if SCORE_KEYS == 4
  hsum4(acc[0], acc[1], acc[2], acc[3], sum);
#else
  for (int u = 0; u < SCORE_KEYS; ++u) sum[u] = hsum16(acc[u]);
#endif
  for (int64_t d = Dw; d < D; ++d)
    for (int u = 0; u < SCORE_KEYS; ++u) sum[u] += q[d] * load1(k[u], d, kind);
  for (int64_t u = 0; u < kn; ++u) S[u] = sum[u];
}
#endif

/* 16-column chunks of O a window of P V holds. Each (row, chunk) sums in a vector of its own over
 * the step's keys: with one chunk, 4 rows were 4 chains of multiply-adds, bound by the FMA latency.
 * AVX-512: 4 chunks (64 columns) of 4 rows, 16 sums in 16 of the 32 registers; AVX2's 16 registers
 * (two per 16-lane vector) hold one chunk's. */
#if defined(__AVX512F__)
#define PV_CHUNKS 4
#else
#define PV_CHUNKS 1
#endif

#if defined(__GNUC__)
/* O rows r < NR (ldo apart) += sum_jj P[r * ldp + jj] * value row jj for columns d .. d + 16 NC
 * (NR 4 or 1, NC <= PV_CHUNKS, NK <= DECODE_PV_KEYS keys and ldp: constants where it is inlined):
 * O loaded and stored once for the NK keys. */
DECODE_KERNEL
__attribute__((always_inline)) static inline void
pv_window(const int NR, const int NC, const int NK, const float *P, const int64_t ldp,
          const void *const *rows, int mode, int64_t d, float *O, int64_t ldo) {
  v16f acc[4][PV_CHUNKS];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = load16(O + r * ldo + d + 16 * c, ROWS_F32);
  /* each row's chunks at constant offsets from one address (row16(rows[jj], d + 16 c) left GCC
   * holding every d + 16 c in a register of its own) */
  const size_t at = mode == ROWS_F32          ? (size_t)d * 4
                    : mode == ROWS_BF16_PAIRS ? (size_t)(d / 32) * 64
                                              : (size_t)d * 2;
  const int64_t pair = mode == ROWS_BF16_PAIRS ? d % 32 : 0; /* row16's even/odd half */
  for (int jj = 0; jj < NK; ++jj) {
    const char *row = (const char *)rows[jj] + at;
    v16f vv[PV_CHUNKS];
    for (int c = 0; c < NC; ++c) vv[c] = row16(row, pair + 16 * c, mode);
    for (int r = 0; r < NR; ++r) {
      const float pr = P[r * ldp + jj];
      for (int c = 0; c < NC; ++c) acc[r][c] += pr * vv[c];
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NC; ++c) memcpy(O + r * ldo + d + 16 * c, &acc[r][c], sizeof acc[r][c]);
}

/* pv_window over every column of NR rows and NK keys: windows of PV_CHUNKS chunks, then single
 * chunks, then the columns past a multiple of 16 one by one. */
DECODE_KERNEL
__attribute__((always_inline)) static inline void pv_rows(const int NR, const int NK, int64_t Dv,
                                                          const float *P, const int64_t ldp,
                                                          const void *const *rows, int mode,
                                                          float *O, int64_t ldo) {
  const int kind = mode == ROWS_BF16_PAIRS ? ROWS_BF16 : mode; /* load1 */
  const int64_t Dw = Dv / 16 * 16;
  int64_t d = 0;
  for (; d + 16 * PV_CHUNKS <= Dw; d += 16 * PV_CHUNKS)
    pv_window(NR, PV_CHUNKS, NK, P, ldp, rows, mode, d, O, ldo);
  for (; d < Dw; d += 16) pv_window(NR, 1, NK, P, ldp, rows, mode, d, O, ldo);
  for (; d < Dv; ++d)
    for (int jj = 0; jj < NK; ++jj) {
      const float vd = load1(rows[jj], d, kind);
      for (int r = 0; r < NR; ++r) O[r * ldo + d] += P[r * ldp + jj] * vd;
    }
}
#endif

/* cpu.h's decode_scores: the scores of one key block, SCORE_KEYS keys a step with every KV head of
 * the step inside (address order), the rows ahead requested a few lines a step and head. mode is a
 * constant where decode_scores_kernel inlines it. */
DECODE_KERNEL
__attribute__((always_inline)) static inline void scores_block(const attn_cpu_decode_block *a,
                                                               const float *q, const int mode) {
#if defined(__GNUC__)
  ahead_cursor cur;
  ahead_start(&cur, a, (a->nb + SCORE_KEYS - 1) / SCORE_KEYS * a->heads);
  for (int64_t j0 = 0; j0 < a->nb; j0 += SCORE_KEYS) {
    const int64_t kn = a->nb - j0 < SCORE_KEYS ? a->nb - j0 : SCORE_KEYS;
    for (int64_t g = 0; g < a->heads; ++g) {
      request_ahead(&cur, cur.quota);
      const char *k[SCORE_KEYS];
      for (int u = 0; u < SCORE_KEYS; ++u)
        k[u] = a->rows[j0 + (u < kn ? u : 0)] + (size_t)g * a->head_bytes;
      const float *qg = q + g * a->R * a->ldq;
      const int64_t lds = ATTN_CPU_DECODE_BLOCK;
      float *S = a->S + g * a->R * lds + j0;
      int64_t r = 0;
      for (; r + 4 <= a->R; r += 4)
        scores_4rows(qg + r * a->ldq, a->ldq, k, kn, a->D, mode, S + r * lds, lds);
      for (; r < a->R; ++r) scores_1row(qg + r * a->ldq, k, kn, a->D, mode, S + r * lds);
    }
  }
  request_ahead(&cur, -1);
#else
  const int kind = mode == ROWS_BF16_PAIRS ? ROWS_BF16 : mode; /* load1 */
  for (int64_t g = 0; g < a->heads; ++g)
    for (int64_t jj = 0; jj < a->nb; ++jj)
      for (int64_t r = 0; r < a->R; ++r) {
        const float *qr = q + (g * a->R + r) * a->ldq;
        const char *k = a->rows[jj] + (size_t)g * a->head_bytes;
        float s = 0.0f;
        for (int64_t d = 0; d < a->D; ++d) s += qr[d] * load1(k, d, kind);
        a->S[(g * a->R + r) * ATTN_CPU_DECODE_BLOCK + jj] = s;
      }
#endif
}

/* Keys a step of P V, O's rows loaded and stored once a step, every count of the step a constant
 * (the keys unrolled and scheduled with no test between them). On one Zen 5 thread, f16 rows in
 * L2 (the kernel alone, Hkv 8, R 4, D 128): 7.2-7.5 ns a key and head at 4 keys with the count a
 * variable (6.2 ns where the code happened to lie better), 5.7-5.9 at 8 constant keys. A step
 * reads its keys' rows of one head before the next head's: 8 keys of 2-byte rows are 16 KiB, as
 * in the bf16 loops; f32 rows take 4 keys (16 KiB too: at 8, 32 KiB, f32 in L3 ran at 27-30 GB/s
 * against 34-35). */
#define DECODE_PV_KEYS 8
#define PV_KEYS(mode) ((mode) == ROWS_F32 ? DECODE_PV_KEYS / 2 : DECODE_PV_KEYS)

/* NR rows of one head over kn <= PV_KEYS(mode) keys: a whole step with every count a constant,
 * else (the block's last keys) one key at a time. */
DECODE_KERNEL
__attribute__((always_inline)) static inline void pv_step(const int NR, int64_t kn, int64_t Dv,
                                                          const float *P, const void *const *rows,
                                                          int mode, float *O, int64_t ldo) {
  const int64_t ldp = ATTN_CPU_DECODE_BLOCK;
#if defined(__GNUC__)
  if (kn == PV_KEYS(mode)) {
    pv_rows(NR, PV_KEYS(mode), Dv, P, ldp, rows, mode, O, ldo);
    return;
  }
  for (int64_t jj = 0; jj < kn; ++jj) pv_rows(NR, 1, Dv, P + jj, ldp, rows + jj, mode, O, ldo);
#else
  const int kind = mode == ROWS_BF16_PAIRS ? ROWS_BF16 : mode; /* load1 */
  for (int r = 0; r < NR; ++r)
    for (int64_t jj = 0; jj < kn; ++jj)
      for (int64_t d = 0; d < Dv; ++d) O[r * ldo + d] += P[r * ldp + jj] * load1(rows[jj], d, kind);
#endif
}

/* cpu.h's decode_pv: P V of one key block, PV_KEYS(mode) keys a step with every KV head inside:
 * O[r * ldo + d] += sum_jj P[r * ldp + jj] * value row jj [d] (for ROWS_BF16_PAIRS in its column
 * order). mode is a constant where decode_pv_kernel inlines it. */
DECODE_KERNEL
__attribute__((always_inline)) static inline void pv_block(const attn_cpu_decode_block *a,
                                                           const int mode) {
  ahead_cursor cur;
  const int step = PV_KEYS(mode);
  ahead_start(&cur, a, (a->nb + step - 1) / step * a->heads);
  for (int64_t j0 = 0; j0 < a->nb; j0 += step) {
    const int64_t kn = a->nb - j0 < step ? a->nb - j0 : step;
    for (int64_t g = 0; g < a->heads; ++g) {
      request_ahead(&cur, cur.quota);
      const void *rows[DECODE_PV_KEYS];
      for (int64_t u = 0; u < kn; ++u) rows[u] = a->rows[j0 + u] + (size_t)g * a->head_bytes;
      const float *P = a->S + g * a->R * ATTN_CPU_DECODE_BLOCK + j0;
      float *O = a->O + g * a->R * a->ldo;
      int64_t r = 0;
      for (; r + 4 <= a->R; r += 4)
        pv_step(4, kn, a->Dv, P + r * ATTN_CPU_DECODE_BLOCK, rows, mode, O + r * a->ldo, a->ldo);
      for (; r < a->R; ++r)
        pv_step(1, kn, a->Dv, P + r * ATTN_CPU_DECODE_BLOCK, rows, mode, O + r * a->ldo, a->ldo);
    }
  }
  request_ahead(&cur, -1);
}

/* The table's decode_scores and decode_pv: one copy of each loop per mode, so that how a row is
 * read is decided once a block, not at every load (the compiler does not hoist the choice). */
DECODE_KERNEL
static void decode_scores_kernel(const attn_cpu_decode_block *a, const float *q, int mode) {
  switch (mode) {
  case ROWS_F16: scores_block(a, q, ROWS_F16); break;
  case ROWS_BF16: scores_block(a, q, ROWS_BF16); break;
  case ROWS_BF16_PAIRS: scores_block(a, q, ROWS_BF16_PAIRS); break;
  default: scores_block(a, q, ROWS_F32); break;
  }
}

DECODE_KERNEL
static void decode_pv_kernel(const attn_cpu_decode_block *a, int mode) {
  switch (mode) {
  case ROWS_F16: pv_block(a, ROWS_F16); break;
  case ROWS_BF16: pv_block(a, ROWS_BF16); break;
  case ROWS_BF16_PAIRS: pv_block(a, ROWS_BF16_PAIRS); break;
  default: pv_block(a, ROWS_F32); break;
  }
}

#endif /* ATTN_IMPL_CPU_DECODE_KERNELS_H */
