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
static inline void load32_pairs(const void *p, v16f *even, v16f *odd) {
  v16u x;
  memcpy(&x, p, sizeof x);
  *even = (v16f)(x << 16);
  *odd = (v16f)(x & 0xffff0000u);
}

/* The four sums of a0..a3 in one tree of shuffles (a sum per vector costs four times as much). */
static inline void hsum4(v16f a0, v16f a1, v16f a2, v16f a3, float *s) {
#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define DECODE_HAVE_SHUFFLE 1
#endif
#endif
#ifdef DECODE_HAVE_SHUFFLE
  const v16f x = __builtin_shufflevector(a0, a1, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                 __builtin_shufflevector(a0, a1, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  const v16f y = __builtin_shufflevector(a2, a3, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                 __builtin_shufflevector(a2, a3, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  v16f z = __builtin_shufflevector(x, y, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(x, y, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  z += __builtin_shufflevector(z, z, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  z += __builtin_shufflevector(z, z, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  s[0] = z[0], s[1] = z[4], s[2] = z[8], s[3] = z[12];
#else
  s[0] = hsum16(a0), s[1] = hsum16(a1), s[2] = hsum16(a2), s[3] = hsum16(a3);
#endif
}
#endif

/* S[r * lds + jj] = dot(q[r * ldq ..], key row jj) for r < R, jj < nb. */
DECODE_KERNEL
static inline void decode_dots_kernel(int64_t R, int64_t nb, int64_t D, const float *q, int64_t ldq,
                                      const void *const *rows, int mode, float *S, int64_t lds) {
#if defined(__GNUC__)
  const int kind = mode == ROWS_BF16_PAIRS ? ROWS_BF16 : mode; /* load16 and load1 */
  const int64_t step = mode == ROWS_BF16_PAIRS ? 32 : 16, Dv = D / step * step;
  const size_t es = kind == ROWS_F32 ? 4 : 2;
  for (int64_t jj = 0; jj < nb; ++jj) {
    const char *k = rows[jj];
    int64_t r = 0;
    for (; r + 4 <= R; r += 4) { /* four query rows share each load of the key */
      const float *q0 = q + r * ldq, *q1 = q0 + ldq, *q2 = q1 + ldq, *q3 = q2 + ldq;
      v16f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
      if (mode == ROWS_BF16_PAIRS) {
        for (int64_t d = 0; d < Dv; d += 32) {
          v16f ke, ko;
          load32_pairs(k + (size_t)d * 2, &ke, &ko);
          a0 += load16(q0 + d, 0) * ke + load16(q0 + d + 16, 0) * ko;
          a1 += load16(q1 + d, 0) * ke + load16(q1 + d + 16, 0) * ko;
          a2 += load16(q2 + d, 0) * ke + load16(q2 + d + 16, 0) * ko;
          a3 += load16(q3 + d, 0) * ke + load16(q3 + d + 16, 0) * ko;
        }
      } else {
        for (int64_t d = 0; d < Dv; d += 16) {
          const v16f kv = load16(k + (size_t)d * es, kind);
          a0 += load16(q0 + d, 0) * kv, a1 += load16(q1 + d, 0) * kv;
          a2 += load16(q2 + d, 0) * kv, a3 += load16(q3 + d, 0) * kv;
        }
      }
      float sum[4];
      hsum4(a0, a1, a2, a3, sum);
      for (int64_t d = Dv; d < D; ++d) {
        const float kd = load1(k, d, kind);
        sum[0] += q0[d] * kd, sum[1] += q1[d] * kd, sum[2] += q2[d] * kd, sum[3] += q3[d] * kd;
      }
      for (int u = 0; u < 4; ++u) S[(r + u) * lds + jj] = sum[u];
    }
    for (; r < R; ++r) {
      const float *q0 = q + r * ldq;
      v16f a0 = {0};
      if (mode == ROWS_BF16_PAIRS) {
        for (int64_t d = 0; d < Dv; d += 32) {
          v16f ke, ko;
          load32_pairs(k + (size_t)d * 2, &ke, &ko);
          a0 += load16(q0 + d, 0) * ke + load16(q0 + d + 16, 0) * ko;
        }
      } else {
        for (int64_t d = 0; d < Dv; d += 16)
          a0 += load16(q0 + d, 0) * load16(k + (size_t)d * es, kind);
      }
      float s0 = hsum16(a0);
      for (int64_t d = Dv; d < D; ++d) s0 += q0[d] * load1(k, d, kind);
      S[r * lds + jj] = s0;
    }
  }
#else
  const int kind = mode == ROWS_BF16_PAIRS ? ROWS_BF16 : mode; /* load16 and load1 */
  for (int64_t jj = 0; jj < nb; ++jj)
    for (int64_t r = 0; r < R; ++r) {
      float s = 0.0f;
      for (int64_t d = 0; d < D; ++d) s += q[r * ldq + d] * load1(rows[jj], d, kind);
      S[r * lds + jj] = s;
    }
#endif
}

/* O[r * ldo + d] += sum_jj P[r * ldp + jj] * value row jj [d] for r < R, d < Dv. */
DECODE_KERNEL
static inline void decode_axpys_kernel(int64_t R, int64_t nb, int64_t Dv, const float *P,
                                       int64_t ldp, const void *const *rows, int mode, float *O,
                                       int64_t ldo) {
#if defined(__GNUC__)
  const int kind = mode == ROWS_BF16_PAIRS ? ROWS_BF16 : mode; /* load16 and load1 */
  const int64_t step = mode == ROWS_BF16_PAIRS ? 32 : 16, Dw = Dv / step * step;
  const size_t es = kind == ROWS_F32 ? 4 : 2;
  int64_t r = 0;
  for (; r + 4 <= R; r += 4) { /* four rows' accumulators stay in registers over the block */
    const float *p0 = P + r * ldp, *p1 = p0 + ldp, *p2 = p1 + ldp, *p3 = p2 + ldp;
    float *o0 = O + r * ldo, *o1 = o0 + ldo, *o2 = o1 + ldo, *o3 = o2 + ldo;
    if (mode == ROWS_BF16_PAIRS) {
      for (int64_t d = 0; d < Dw; d += 32) {
        v16f e0 = load16(o0 + d, 0), e1 = load16(o1 + d, 0), e2 = load16(o2 + d, 0),
             e3 = load16(o3 + d, 0);
        v16f f0 = load16(o0 + d + 16, 0), f1 = load16(o1 + d + 16, 0),
             f2 = load16(o2 + d + 16, 0), f3 = load16(o3 + d + 16, 0);
        for (int64_t jj = 0; jj < nb; ++jj) {
          v16f ve, vo;
          load32_pairs((const char *)rows[jj] + (size_t)d * 2, &ve, &vo);
          e0 += p0[jj] * ve, e1 += p1[jj] * ve, e2 += p2[jj] * ve, e3 += p3[jj] * ve;
          f0 += p0[jj] * vo, f1 += p1[jj] * vo, f2 += p2[jj] * vo, f3 += p3[jj] * vo;
        }
        memcpy(o0 + d, &e0, sizeof e0), memcpy(o1 + d, &e1, sizeof e1);
        memcpy(o2 + d, &e2, sizeof e2), memcpy(o3 + d, &e3, sizeof e3);
        memcpy(o0 + d + 16, &f0, sizeof f0), memcpy(o1 + d + 16, &f1, sizeof f1);
        memcpy(o2 + d + 16, &f2, sizeof f2), memcpy(o3 + d + 16, &f3, sizeof f3);
      }
    } else {
      for (int64_t d = 0; d < Dw; d += 16) {
        v16f a0 = load16(o0 + d, 0), a1 = load16(o1 + d, 0), a2 = load16(o2 + d, 0),
             a3 = load16(o3 + d, 0);
        for (int64_t jj = 0; jj < nb; ++jj) {
          const v16f vv = load16((const char *)rows[jj] + (size_t)d * es, kind);
          a0 += p0[jj] * vv, a1 += p1[jj] * vv, a2 += p2[jj] * vv, a3 += p3[jj] * vv;
        }
        memcpy(o0 + d, &a0, sizeof a0), memcpy(o1 + d, &a1, sizeof a1);
        memcpy(o2 + d, &a2, sizeof a2), memcpy(o3 + d, &a3, sizeof a3);
      }
    }
    for (int64_t d = Dw; d < Dv; ++d)
      for (int64_t jj = 0; jj < nb; ++jj) {
        const float vd = load1(rows[jj], d, kind);
        o0[d] += p0[jj] * vd, o1[d] += p1[jj] * vd, o2[d] += p2[jj] * vd, o3[d] += p3[jj] * vd;
      }
  }
  for (; r < R; ++r) {
    const float *p0 = P + r * ldp;
    float *o0 = O + r * ldo;
    if (mode == ROWS_BF16_PAIRS) {
      for (int64_t d = 0; d < Dw; d += 32) {
        v16f e0 = load16(o0 + d, 0), f0 = load16(o0 + d + 16, 0);
        for (int64_t jj = 0; jj < nb; ++jj) {
          v16f ve, vo;
          load32_pairs((const char *)rows[jj] + (size_t)d * 2, &ve, &vo);
          e0 += p0[jj] * ve, f0 += p0[jj] * vo;
        }
        memcpy(o0 + d, &e0, sizeof e0), memcpy(o0 + d + 16, &f0, sizeof f0);
      }
    } else {
      for (int64_t d = 0; d < Dw; d += 16) {
        v16f a0 = load16(o0 + d, 0);
        for (int64_t jj = 0; jj < nb; ++jj)
          a0 += p0[jj] * load16((const char *)rows[jj] + (size_t)d * es, kind);
        memcpy(o0 + d, &a0, sizeof a0);
      }
    }
    for (int64_t d = Dw; d < Dv; ++d)
      for (int64_t jj = 0; jj < nb; ++jj) o0[d] += p0[jj] * load1(rows[jj], d, kind);
  }
#else
  const int kind = mode == ROWS_BF16_PAIRS ? ROWS_BF16 : mode; /* load16 and load1 */
  for (int64_t r = 0; r < R; ++r)
    for (int64_t jj = 0; jj < nb; ++jj)
      for (int64_t d = 0; d < Dv; ++d) O[r * ldo + d] += P[r * ldp + jj] * load1(rows[jj], d, kind);
#endif
}

/* cpu.h's decode_scores: the scores of one key block, key by key with every KV head of a key
 * inside (address order), the rows ahead requested a few lines a key and head. */
DECODE_KERNEL
static void decode_scores_kernel(const attn_cpu_decode_block *a, const float *q, int mode) {
  ahead_cursor cur;
  ahead_start(&cur, a, a->nb * a->heads);
  for (int64_t jj = 0; jj < a->nb; ++jj)
    for (int64_t g = 0; g < a->heads; ++g) {
      request_ahead(&cur, cur.quota);
      const void *row = a->rows[jj] + (size_t)g * a->head_bytes;
      decode_dots_kernel(a->R, 1, a->D, q + g * a->R * a->ldq, a->ldq, &row, mode,
                         a->S + g * a->R * a->lds + jj, a->lds);
    }
  request_ahead(&cur, -1);
}

#define DECODE_PV_KEYS 8 /* keys a step of P V: O's rows loaded and stored once a step */

/* cpu.h's decode_pv: P V of one key block, DECODE_PV_KEYS keys a step with every KV head inside. */
DECODE_KERNEL
static void decode_pv_kernel(const attn_cpu_decode_block *a, int mode) {
  ahead_cursor cur;
  ahead_start(&cur, a, (a->nb + DECODE_PV_KEYS - 1) / DECODE_PV_KEYS * a->heads);
  for (int64_t j0 = 0; j0 < a->nb; j0 += DECODE_PV_KEYS) {
    const int64_t kn = a->nb - j0 < DECODE_PV_KEYS ? a->nb - j0 : DECODE_PV_KEYS;
    for (int64_t g = 0; g < a->heads; ++g) {
      request_ahead(&cur, cur.quota);
      const void *rows[DECODE_PV_KEYS];
      for (int64_t u = 0; u < kn; ++u) rows[u] = a->rows[j0 + u] + (size_t)g * a->head_bytes;
      decode_axpys_kernel(a->R, kn, a->Dv, a->S + g * a->R * a->lds + j0, a->lds, rows, mode,
                          a->O + g * a->R * a->ldo, a->ldo);
    }
  }
  request_ahead(&cur, -1);
}

#endif /* ATTN_IMPL_CPU_DECODE_KERNELS_H */
