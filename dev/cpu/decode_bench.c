/*
 * dev/cpu/decode_bench.c - the cpu decode path's K+V read rate on ONE thread (or T, below), timed
 * with the thread's CPU clock (CLOCK_THREAD_CPUTIME_ID: memory stalls count, time the thread spends
 * descheduled does not), best of N runs, beside a one-thread STREAM-style read of 512 MiB timed the
 * same way. On a machine shared by busy processes (the 2-core build VM) wall-clock rates move 2-4x
 * from run to run; this is the figure that repeats (docs/DECODE.md, "Measured (CPU, ... 2-core").
 * Every problem is checked against the f64 reference first (the harness's oracle and tolerance).
 * Not part of the build; from a CPU-only build folder B (cmake -DATTN_WITH_CUDA=OFF
 * -DATTN_WITH_CUDNN=OFF, then make attn_harness):
 *   gcc -O2 -std=c11 -fopenmp -Iinclude -Isrc -Itools dev/cpu/decode_bench.c \
 *       B/tools/libattn_harness.a B/libattn.a -lm -o /tmp/decode_bench
 *   /tmp/decode_bench [--reps N] [--read-reps M] "b16 hq32 hkv8 sq1 sk2048 d128 bf16 paged=16" ...
 * (best of N runs of each problem after two warm-up runs, and of M passes of the read: N unless
 * given; 0 leaves the read out, for a profiler)
 * (the static library's name and folder as the build makes them: see B's tree).
 * --threads T (T > 1): T threads, timed on the wall clock, beside a T-thread read of 512 MiB timed
 * the same way; each problem prints the best and the median of its N runs. On the shared VM the
 * best of many short runs repeats where attn bench's median (one longer sitting) moves with the
 * other processes' load: a run that no other process disturbed is the machine's figure.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static double thread_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double wall_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static volatile float sink;

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The read rate of `threads` threads: a sum of 512 MiB of floats, each thread its share in four
 * 16-lane accumulators (as tools/peak.c does), best of reps passes; one thread on its CPU clock,
 * more on the wall clock. */
static double read_rate_gbps(int reps, int threads) {
  const size_t n = (size_t)1 << 27;
  float *x = malloc(n * sizeof *x);
  if (x == NULL) return 0.0;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
  for (size_t i = 0; i < n; ++i) x[i] = 1e-6f;
  double best = 0.0;
  for (int rep = 0; rep < reps; ++rep) {
    typedef float v16 __attribute__((vector_size(64)));
    float total = 0.0f;
    const double t0 = threads > 1 ? wall_seconds() : thread_seconds();
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : total)
#endif
    for (size_t c = 0; c < n / 4096; ++c) { /* chunks of 16 KiB */
      v16 a = {0}, b = {0}, d = {0}, e = {0};
      for (size_t i = c * 4096; i < (c + 1) * 4096; i += 64) {
        v16 x0, x1, x2, x3;
        memcpy(&x0, x + i, 64), memcpy(&x1, x + i + 16, 64);
        memcpy(&x2, x + i + 32, 64), memcpy(&x3, x + i + 48, 64);
        a += x0, b += x1, d += x2, e += x3;
      }
      const v16 s = a + b + d + e;
      total += s[0] + s[15];
    }
    const double dt = (threads > 1 ? wall_seconds() : thread_seconds()) - t0;
    sink = total;
    if (dt > 0 && (double)(n * sizeof *x) / dt * 1e-9 > best) best = (double)(n * sizeof *x) / dt * 1e-9;
  }
  free(x);
  return best;
}

static int fail(attn_ctx *ctx, const char *what) {
  fprintf(stderr, "decode_bench: %s: %s\n", what, attn_ctx_last_error(ctx));
  return 1;
}

int main(int argc, char **argv) {
  int reps = 20, read_reps = -1, threads = 1, first = 1;
  for (; first + 1 < argc; first += 2) {
    if (strcmp(argv[first], "--reps") == 0)
      reps = atoi(argv[first + 1]);
    else if (strcmp(argv[first], "--read-reps") == 0)
      read_reps = atoi(argv[first + 1]);
    else if (strcmp(argv[first], "--threads") == 0)
      threads = atoi(argv[first + 1]);
    else
      break;
  }
  if (read_reps < 0) read_reps = reps;
  if (reps < 1 || threads < 1 || first >= argc) {
    fprintf(stderr, "usage: decode_bench [--reps N] [--read-reps M] [--threads T] PROBLEM...\n");
    return 2;
  }
  attn_ctx *ctx = NULL;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) return 1;
  attn_ctx_set_num_threads(ctx, threads);
  const double read = read_reps > 0 ? read_rate_gbps(read_reps, threads) : 0.0;
  printf("%d-thread read rate: %.1f GB/s (512 MiB sum, %s, best of %d)\n", threads, read,
         threads > 1 ? "wall clock" : "thread CPU clock", read_reps);
  int status = 0;
  for (int a = first; a < argc; ++a) {
    attn_problem p;
    if (attn_problem_parse(ctx, argv[a], &p) != ATTN_STATUS_OK) return fail(ctx, argv[a]);
    /* validate first: the cpu implementation against the f64 reference */
    h_oracle *oracle = NULL;
    if (h_oracle_make(ctx, &p, 0, 1, H_SAMPLE_AUTO, &oracle) != ATTN_STATUS_OK) return fail(ctx, "oracle");
    const h_check check = h_check_run(ctx, oracle, "cpu", NULL);
    h_oracle_free(oracle);
    if (check.status != ATTN_STATUS_OK) return fail(ctx, "check");
    h_data d;
    if (h_data_make(ctx, &d, &p, 1, 0) != ATTN_STATUS_OK) return fail(ctx, "data");
    attn_select sel;
    attn_select_init(&sel);
    sel.impl = "cpu";
    attn_plan *plan = NULL;
    if (attn_plan_create(ctx, &d.problem, &sel, &plan) != ATTN_STATUS_OK) return fail(ctx, "plan");
    double *times = malloc((size_t)reps * sizeof *times);
    if (times == NULL) return fail(ctx, "times");
    for (int rep = 0; rep < reps + 2; ++rep) { /* two warm-up runs */
      const double t0 = threads > 1 ? wall_seconds() : thread_seconds();
      if (attn_plan_forward(plan, &d.in, NULL, 0, &d.out) != ATTN_STATUS_OK) return fail(ctx, "forward");
      const double dt = (threads > 1 ? wall_seconds() : thread_seconds()) - t0;
      if (rep >= 2) times[rep - 2] = dt;
    }
    qsort(times, (size_t)reps, sizeof *times, cmp_double);
    const double best = times[0], median = times[reps / 2];
    free(times);
    const double gbps = h_kv_bytes(&p) / best * 1e-9;
    printf("%-52s %s  %8.1f us  %6.1f GB/s  %3.0f%% of read", argv[a], check.ok ? "ok  " : "FAIL",
           best * 1e6, gbps, read > 0.0 ? 100.0 * gbps / read : 0.0);
    if (threads > 1) {
      const double mgbps = h_kv_bytes(&p) / median * 1e-9;
      printf("  (median %6.1f GB/s, %3.0f%%)", mgbps, read > 0.0 ? 100.0 * mgbps / read : 0.0);
    }
    printf("\n");
    if (!check.ok) status = 1;
    attn_plan_destroy(plan);
    h_data_free(&d);
  }
  attn_ctx_destroy(ctx);
  return status;
}
