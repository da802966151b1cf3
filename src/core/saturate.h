/*
 * src/core/saturate.h - size arithmetic that stops at the largest value instead of wrapping.
 *
 * Validation admits tensors of up to 2^56 elements, so a workspace formula that multiplies a few
 * of their sizes (or a size by the thread count) can pass 2^64. Workspace queries compute with
 * these so that such a problem reads as SIZE_MAX bytes, which no allocation satisfies, and never
 * as a small wrapped number that a caller would allocate and overrun. The operands are counts,
 * never negative.
 */
#ifndef ATTN_CORE_SATURATE_H
#define ATTN_CORE_SATURATE_H

#include <stddef.h>
#include <stdint.h>

static inline int64_t attn_sat_add64(int64_t a, int64_t b) {
  return a > INT64_MAX - b ? INT64_MAX : a + b;
}

static inline int64_t attn_sat_mul64(int64_t a, int64_t b) {
  return a != 0 && b > INT64_MAX / a ? INT64_MAX : a * b;
}

/* x rounded up to a multiple of m (m > 0), or INT64_MAX when that does not fit. */
static inline int64_t attn_sat_round_up64(int64_t x, int64_t m) {
  return x > INT64_MAX - (m - 1) ? INT64_MAX : (x + m - 1) / m * m;
}

/* count elements of elem bytes each; SIZE_MAX when count saturated or the product passes size_t. */
static inline size_t attn_sat_bytes(int64_t count, size_t elem) {
  if (count == INT64_MAX || (uint64_t)count > SIZE_MAX) return SIZE_MAX;
  return elem != 0 && (size_t)count > SIZE_MAX / elem ? SIZE_MAX : (size_t)count * elem;
}

static inline size_t attn_sat_add_size(size_t a, size_t b) {
  return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

#endif /* ATTN_CORE_SATURATE_H */
