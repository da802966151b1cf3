/*
 * src/dist/host_rows.h - the row loops of the host passes (ring merges and sums, writing results
 * out): a span of a block's values added into the sums, or the sums written out in the tensor's
 * dtype, with the dtype's switch taken once per span instead of once per element (attn_load /
 * attn_store), so that each loop is one type's plain loop the compiler vectorizes. On a 16-core
 * host these loops took a fifth of a ring step; written per element they took 10-16% of a
 * two-rank run here, and the time outside the blocks fell by a third with these; the sums in f32
 * instead of double (partial results of a bf16 problem kept in f32) took it down 3-5x more in
 * bf16 (docs/DISTRIBUTED.md).
 */
#ifndef ATTN_DIST_HOST_ROWS_H
#define ATTN_DIST_HOST_ROWS_H

#include "core/dtype.h"

#include <stdint.h>

/* The row loops are compiled for AVX-512 and AVX2 beside the x86-64 baseline, and the widest the
 * CPU has is chosen once, when the library is loaded (target_clones, an ifunc: GCC and Clang on
 * x86-64 ELF): the same C with 16 or 8 lanes instead of SSE2's 4. On 2 ranks of a 2-vCPU Zen 4
 * (bf16 causal, T = 4096, forward and backward) a rank's time outside the blocks and waits fell
 * from 11-16 ms to 8.5-10.6 (these loops at 4 lanes took 1.5-2x as long). Not under
 * AddressSanitizer, whose checks an ifunc resolver may run before. Clang would contract
 * a * wa + x * wb into an FMA where the clone has one, GCC in ISO C mode never: contraction is
 * off, so every clone computes the same values. */
#if defined(__x86_64__) && defined(__ELF__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__)
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DIST_ROW_NO_CLONES
#endif
#endif
#ifndef DIST_ROW_NO_CLONES
#define DIST_ROW_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef DIST_ROW_CLONES
#define DIST_ROW_CLONES
#endif
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* The span that a row loop converts at a time: its buffer lives on the stack. */
#define DIST_SPAN 256

/* dst[0 .. n) = elements [from, from + n) of src (dtype dt) in f64; n <= DIST_SPAN. */
static inline void dist_span_load(double *dst, const void *src, attn_dtype dt, int64_t from,
                                  int64_t n) {
  switch (dt) {
  case ATTN_DTYPE_F32: {
    const float *s = (const float *)src + from;
    for (int64_t e = 0; e < n; ++e) dst[e] = s[e];
    break;
  }
  case ATTN_DTYPE_BF16: {
    const uint16_t *s = (const uint16_t *)src + from;
    for (int64_t e = 0; e < n; ++e) dst[e] = attn_inline_bf16_to_f32(s[e]);
    break;
  }
  case ATTN_DTYPE_F64: {
    const double *s = (const double *)src + from;
    for (int64_t e = 0; e < n; ++e) dst[e] = s[e];
    break;
  }
  default:
    for (int64_t e = 0; e < n; ++e) dst[e] = attn_load(src, dt, from + e);
  }
}

/* The sums of the host passes (merged outputs, dq, the travelling dK/dV) are of dtype acc_dt: f32,
 * or f64 for an f64 problem (the dtype the blocks write their partial results in, SPEC.md:
 * accumulation is f32 and partial sums are never rounded to bf16). */

/* acc[0 .. n) = acc * wa + (elements [from, from + n) of src) * wb: a partial result merged
 * through the weights of its lse. */
DIST_ROW_CLONES static inline void dist_row_blend(void *acc, attn_dtype acc_dt, double wa,
                                                  double wb, const void *src, attn_dtype dt,
                                                  int64_t from, int64_t n) {
  if (acc_dt == ATTN_DTYPE_F32 && dt == ATTN_DTYPE_F32) { /* the usual case: one plain loop */
    float *a = (float *)acc;
    const float *x = (const float *)src + from, fa = (float)wa, fb = (float)wb;
    for (int64_t e = 0; e < n; ++e) a[e] = a[e] * fa + x[e] * fb;
    return;
  }
  double span[DIST_SPAN];
  for (int64_t e0 = 0; e0 < n; e0 += DIST_SPAN) {
    const int64_t m = n - e0 < DIST_SPAN ? n - e0 : DIST_SPAN;
    dist_span_load(span, src, dt, from + e0, m);
    if (acc_dt == ATTN_DTYPE_F32) {
      float *a = (float *)acc + e0;
      for (int64_t e = 0; e < m; ++e) a[e] = (float)(a[e] * wa + span[e] * wb);
    } else {
      double *a = (double *)acc + e0;
      for (int64_t e = 0; e < m; ++e) a[e] = a[e] * wa + span[e] * wb;
    }
  }
}

/* acc[0 .. n) += elements [from, from + n) of src (dtype dt). */
DIST_ROW_CLONES static inline void dist_row_add(void *acc, attn_dtype acc_dt, const void *src,
                                                attn_dtype dt, int64_t from, int64_t n) {
  if (acc_dt == ATTN_DTYPE_F32 && dt == ATTN_DTYPE_F32) {
    float *a = (float *)acc;
    const float *x = (const float *)src + from;
    for (int64_t e = 0; e < n; ++e) a[e] += x[e];
    return;
  }
  dist_row_blend(acc, acc_dt, 1.0, 1.0, src, dt, from, n);
}

/* Elements at, at + stride, ... (n of them) of dst (dtype dt) = acc[0 .. n) (dtype acc_dt), the
 * contiguous f32, bf16 and f64 cases as plain loops. bf16 rounds through f32 (attn_store rounds
 * an f64 value once, through a round-to-odd step that does not vectorize): from f64 sums the two
 * roundings differ only where the f32 value is a bf16 tie, by one bf16 ulp there, as the
 * single-device kernels' own rounding of their f32 accumulators does. */
DIST_ROW_CLONES static inline void dist_row_store(void *dst, attn_dtype dt, int64_t at,
                                                  int64_t stride, const void *acc,
                                                  attn_dtype acc_dt, int64_t n) {
  if (acc_dt == ATTN_DTYPE_F32) {
    const float *a = (const float *)acc;
    if (stride == 1 && dt == ATTN_DTYPE_F32) {
      float *d = (float *)dst + at;
      for (int64_t e = 0; e < n; ++e) d[e] = a[e];
    } else if (stride == 1 && dt == ATTN_DTYPE_BF16) {
      uint16_t *d = (uint16_t *)dst + at;
      for (int64_t e = 0; e < n; ++e) d[e] = attn_inline_f32_to_bf16(a[e]);
    } else {
      for (int64_t e = 0; e < n; ++e) attn_store(dst, dt, at + e * stride, a[e]);
    }
    return;
  }
  const double *src = (const double *)acc;
  if (stride == 1 && dt == ATTN_DTYPE_F32) {
    float *d = (float *)dst + at;
    for (int64_t e = 0; e < n; ++e) d[e] = (float)src[e];
  } else if (stride == 1 && dt == ATTN_DTYPE_F64) {
    double *d = (double *)dst + at;
    for (int64_t e = 0; e < n; ++e) d[e] = src[e];
  } else if (stride == 1 && dt == ATTN_DTYPE_BF16) {
    uint16_t *d = (uint16_t *)dst + at;
    for (int64_t e = 0; e < n; ++e) d[e] = attn_inline_f32_to_bf16((float)src[e]);
  } else {
    for (int64_t e = 0; e < n; ++e) attn_store(dst, dt, at + e * stride, src[e]);
  }
}

/* Elements at, at + stride, ... (n of them) of dst (dtype dt) = acc * wa + x * wb (acc and x
 * [0 .. n) of dtype acc_dt): the last term of a sum merged on the way out, through a span on the
 * stack, so that the sums are read once and never written back. The same arithmetic as
 * dist_row_blend then dist_row_store; weights 1 and 1 add exactly (dist_row_add). */
DIST_ROW_CLONES static inline void dist_row_store_blend(void *dst, attn_dtype dt, int64_t at,
                                                        int64_t stride, const void *acc, double wa,
                                                        double wb, const void *x, attn_dtype acc_dt,
                                                        int64_t n) {
  for (int64_t e0 = 0; e0 < n; e0 += DIST_SPAN) {
    const int64_t m = n - e0 < DIST_SPAN ? n - e0 : DIST_SPAN;
    if (acc_dt == ATTN_DTYPE_F32) {
      float span[DIST_SPAN];
      const float *a = (const float *)acc + e0, *b = (const float *)x + e0;
      const float fa = (float)wa, fb = (float)wb;
      for (int64_t e = 0; e < m; ++e) span[e] = a[e] * fa + b[e] * fb;
      dist_row_store(dst, dt, at + e0 * stride, stride, span, acc_dt, m);
    } else {
      double span[DIST_SPAN];
      const double *a = (const double *)acc + e0, *b = (const double *)x + e0;
      for (int64_t e = 0; e < m; ++e) span[e] = a[e] * wa + b[e] * wb;
      dist_row_store(dst, dt, at + e0 * stride, stride, span, acc_dt, m);
    }
  }
}

#endif /* ATTN_DIST_HOST_ROWS_H */
