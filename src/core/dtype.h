/*
 * src/core/dtype.h - element types: sizes, names, and exact conversions between f64/f32 and the
 * 16-bit formats (IEEE binary16 and bfloat16) and f8e4m3 (OCP E4M3FN), rounding to nearest even.
 *
 * These are plain C so that every backend's host code and the tests share one definition. The
 * attn_inline_* conversions are the bodies of attn.h's public attn_f32_to_bf16 and friends
 * (dtype.c), inline here for the loops that convert element by element.
 */
#ifndef ATTN_CORE_DTYPE_H
#define ATTN_CORE_DTYPE_H

#include "attn.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t attn_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float attn_f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline float attn_inline_bf16_to_f32(uint16_t h) {
  return attn_f32_from_bits((uint32_t)h << 16);
}

static inline uint16_t attn_inline_f32_to_bf16(float f) {
  uint32_t u = attn_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
  return (uint16_t)(u >> 16);
}

static inline float attn_inline_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return attn_f32_from_bits(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) { /* zero or subnormal: mantissa * 2^-24 */
    float magnitude = (float)mantissa * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  return attn_f32_from_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

static inline uint16_t attn_inline_f32_to_f16(float f) {
  uint32_t u = attn_f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
  if (magnitude >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
  if (magnitude < 0x38800000u) { /* below 2^-14: a subnormal half, a multiple of 2^-24 */
    float scaled = attn_f32_from_bits(magnitude) * 0x1p24f; /* exact */
    return (uint16_t)(sign | (uint16_t)nearbyintf(scaled)); /* default mode rounds ties to even */
  }
  uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
  return (uint16_t)(sign | ((rounded - (112u << 23)) >> 13));
}

/* f8e4m3 (OCP E4M3FN): sign, 4 exponent bits of bias 7, 3 mantissa bits. Exponent 0 holds the
 * subnormals m * 2^-9; S.1111.111 is the one NaN (no infinities), so the largest value is
 * 1.75 * 2^8 = 448. The one decoder every implementation and test reads e4m3 through. */
static inline float attn_inline_f8e4m3_to_f32(uint8_t bits) {
  const uint32_t sign = (uint32_t)(bits & 0x80u) << 24;
  const uint32_t exponent = (bits >> 3) & 0xfu, mantissa = bits & 0x7u;
  if (exponent == 0) { /* zero or subnormal: mantissa * 2^-9 */
    const float magnitude = (float)mantissa * 0x1p-9f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0xfu && mantissa == 0x7u) return attn_f32_from_bits(sign | 0x7fc00000u);
  /* (1 + m/8) 2^(e-7): f32's biased exponent e - 7 + 127, its mantissa m in the top 3 bits */
  return attn_f32_from_bits(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

/* value rounded to e4m3, to nearest with ties to even, from the double itself (one rounding);
 * beyond 448 in magnitude it saturates to +-448 (attn.h's attn_f32_to_f8e4m3 says why). */
static inline uint8_t attn_inline_f64_to_f8e4m3(double value) {
  const uint8_t sign = signbit(value) ? 0x80u : 0x00u;
  const double a = fabs(value);
  if (isnan(value)) return (uint8_t)(sign | 0x7fu);
  if (a >= 448.0) return (uint8_t)(sign | 0x7eu);
  if (a < 0x1p-6) /* subnormal: a multiple of 2^-9; 8 * 2^-9 is the smallest normal, bits 0x08 */
    return (uint8_t)(sign | (uint8_t)nearbyint(a * 0x1p9)); /* default mode: ties to even */
  int e;
  const double f = frexp(a, &e); /* a = f 2^e, f in [0.5, 1): a = (2f) 2^(e-1) */
  int exponent = e - 1 + 7;
  int mantissa = (int)nearbyint((2.0 * f - 1.0) * 8.0);
  if (mantissa == 8) mantissa = 0, ++exponent; /* up into the next binade (a < 448: never NaN) */
  return (uint8_t)(sign | (uint8_t)(exponent << 3) | (uint8_t)mantissa);
}

/* A double rounded to float with round-to-odd, so that a second rounding to a narrower format
 * (f16, bf16) gives the correctly rounded result of the double (Boldo and Melquiond). */
static inline float attn_f64_to_f32_odd(double d) {
  float f = (float)d;
  if ((double)f == d || isnan(d) || isinf(f)) return f;
  uint32_t u = attn_f32_bits(f);
  if ((u & 1u) == 0) u = fabs((double)f) > fabs(d) ? u - 1u : u + 1u;
  return attn_f32_from_bits(u);
}

/* Reads element `index` of an array of dtype as a double (floating types and i32, u8). */
static inline double attn_load(const void *data, attn_dtype dtype, int64_t index) {
  switch (dtype) {
  case ATTN_DTYPE_F32: return ((const float *)data)[index];
  case ATTN_DTYPE_F16: return attn_inline_f16_to_f32(((const uint16_t *)data)[index]);
  case ATTN_DTYPE_BF16: return attn_inline_bf16_to_f32(((const uint16_t *)data)[index]);
  case ATTN_DTYPE_F64: return ((const double *)data)[index];
  case ATTN_DTYPE_U8: return ((const uint8_t *)data)[index];
  case ATTN_DTYPE_I32: return ((const int32_t *)data)[index];
  case ATTN_DTYPE_F8E4M3: return attn_inline_f8e4m3_to_f32(((const uint8_t *)data)[index]);
  case ATTN_DTYPE_COUNT: break;
  }
  return 0.0;
}

/* Writes value as element `index` of an array of dtype: correctly rounded for the floating types,
 * converted (truncated toward zero) for u8 and i32. */
static inline void attn_store(void *data, attn_dtype dtype, int64_t index, double value) {
  switch (dtype) {
  case ATTN_DTYPE_U8: ((uint8_t *)data)[index] = (uint8_t)value; break;
  case ATTN_DTYPE_I32: ((int32_t *)data)[index] = (int32_t)value; break;
  case ATTN_DTYPE_F32: ((float *)data)[index] = (float)value; break;
  case ATTN_DTYPE_F16:
    ((uint16_t *)data)[index] = attn_inline_f32_to_f16(attn_f64_to_f32_odd(value));
    break;
  case ATTN_DTYPE_BF16:
    ((uint16_t *)data)[index] = attn_inline_f32_to_bf16(attn_f64_to_f32_odd(value));
    break;
  case ATTN_DTYPE_F64: ((double *)data)[index] = value; break;
  case ATTN_DTYPE_F8E4M3: ((uint8_t *)data)[index] = attn_inline_f64_to_f8e4m3(value); break;
  case ATTN_DTYPE_COUNT: break;
  }
}

/* value rounded to the precision of dtype (identity for f64). */
static inline double attn_round_to(attn_dtype dtype, double value) {
  switch (dtype) {
  case ATTN_DTYPE_F32: return (float)value;
  case ATTN_DTYPE_F16:
    return attn_inline_f16_to_f32(attn_inline_f32_to_f16(attn_f64_to_f32_odd(value)));
  case ATTN_DTYPE_BF16:
    return attn_inline_bf16_to_f32(attn_inline_f32_to_bf16(attn_f64_to_f32_odd(value)));
  case ATTN_DTYPE_F8E4M3: return attn_inline_f8e4m3_to_f32(attn_inline_f64_to_f8e4m3(value));
  default: return value;
  }
}

/* The dtype of out (and probs) of a problem: out_dtype when set, else the problem's dtype, bf16
 * for an f8e4m3 problem (docs/FP8.md). */
static inline attn_dtype attn_out_dtype(const attn_problem *p) {
  if (p->out_dtype >= 0) return (attn_dtype)p->out_dtype;
  return p->dtype == ATTN_DTYPE_F8E4M3 ? ATTN_DTYPE_BF16 : (attn_dtype)p->dtype;
}

/* Whether the problem has a backward pass; paged caches (docs/DECODE.md) and f8e4m3 problems
 * (docs/FP8.md) are forward only. plan/validate.c's attn_validate_has_backward gives the reason. */
static inline int attn_has_backward(const attn_problem *p) {
  return p->page_size <= 0 && p->dtype != ATTN_DTYPE_F8E4M3;
}

/* The dtype of lse, alibi slopes, sinks and dsinks: f64 for an f64 problem, f32 otherwise. */
static inline attn_dtype attn_stat_dtype(attn_dtype problem_dtype) {
  return problem_dtype == ATTN_DTYPE_F64 ? ATTN_DTYPE_F64 : ATTN_DTYPE_F32;
}

#endif /* ATTN_CORE_DTYPE_H */
