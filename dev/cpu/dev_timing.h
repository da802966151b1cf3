/*
 * dev/cpu/dev_timing.h - the clock and the median that the CPU dev benches (kernel_bench,
 * features_bench, ring_step_bench, ring_balance_bench) time with: one definition instead of a
 * copy in each program. Header-only; the benches are built by hand (see each one's header).
 */
#ifndef ATTN_DEV_CPU_DEV_TIMING_H
#define ATTN_DEV_CPU_DEV_TIMING_H

#include <stdlib.h>
#include <time.h>

/* Seconds on the monotonic clock. */
static inline double dev_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline int dev_cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The median of n times (sorts them in place). */
static inline double dev_median(double *t, int n) {
  qsort(t, (size_t)n, sizeof(double), dev_cmp_double);
  return t[n / 2];
}

#endif /* ATTN_DEV_CPU_DEV_TIMING_H */
