/*
 * tools/peak.c - measures the f32 FMA throughput of one core (for the %peak column of attn bench).
 *
 * Each kernel keeps more independent accumulators than the FMA latency times the number of FMA
 * pipes (4 cycles x 2 pipes on current x86 cores), so the loop is bound by throughput, not latency.
 * The instruction set is chosen at run time by the library's own detection (attn_cpu_can_run:
 * cpuid and the OS's XCR0, the same answer under GCC and Clang) and each kernel is compiled for its
 * own with __attribute__((target)), so the program runs on any x86-64 and still measures the widest
 * units the CPU has. a = a * b + c with b just below 1 stays finite for any length.
 *
 * With these b and c every chain is a fixed point in f32 (a * b + c rounds back to a), which Clang
 * proves and then deletes the loop: b and c are read from volatile objects, so no compiler knows
 * them and every FMA runs.
 */
#define _POSIX_C_SOURCE 200809L
#include "peak.h"

#include "core/device.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define BENCH_X86 1
#include <immintrin.h>
#endif

double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The result of each kernel is stored here so the compiler cannot drop the chains. */
static volatile float sink;
/* The chains' multiplier and addend, unknown to the compiler (see the top of the file). */
static volatile float chain_mul = 0.99999994f, chain_add = 1e-7f;

#define SCALAR_CHAINS 8
static double fma_scalar(int64_t iters) {
  float a[SCALAR_CHAINS];
  for (int c = 0; c < SCALAR_CHAINS; ++c) a[c] = 1.0f + 0.01f * (float)c;
  const float b = chain_mul, add = chain_add;
  for (int64_t i = 0; i < iters; ++i)
    for (int c = 0; c < SCALAR_CHAINS; ++c) a[c] = a[c] * b + add;
  float s = 0.0f;
  for (int c = 0; c < SCALAR_CHAINS; ++c) s += a[c];
  sink = s;
  return 2.0 * SCALAR_CHAINS * (double)iters;
}

#ifdef BENCH_X86
/* 12 chains of 8 lanes: 12 + 2 constants fit the 16 ymm registers. */
__attribute__((target("avx2,fma"))) static double fma_avx2(int64_t iters) {
  __m256 a0 = _mm256_set1_ps(1.00f), a1 = _mm256_set1_ps(1.01f), a2 = _mm256_set1_ps(1.02f);
  __m256 a3 = _mm256_set1_ps(1.03f), a4 = _mm256_set1_ps(1.04f), a5 = _mm256_set1_ps(1.05f);
  __m256 a6 = _mm256_set1_ps(1.06f), a7 = _mm256_set1_ps(1.07f), a8 = _mm256_set1_ps(1.08f);
  __m256 a9 = _mm256_set1_ps(1.09f), a10 = _mm256_set1_ps(1.10f), a11 = _mm256_set1_ps(1.11f);
  const __m256 b = _mm256_set1_ps(chain_mul), c = _mm256_set1_ps(chain_add);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = _mm256_fmadd_ps(a0, b, c), a1 = _mm256_fmadd_ps(a1, b, c);
    a2 = _mm256_fmadd_ps(a2, b, c), a3 = _mm256_fmadd_ps(a3, b, c);
    a4 = _mm256_fmadd_ps(a4, b, c), a5 = _mm256_fmadd_ps(a5, b, c);
    a6 = _mm256_fmadd_ps(a6, b, c), a7 = _mm256_fmadd_ps(a7, b, c);
    a8 = _mm256_fmadd_ps(a8, b, c), a9 = _mm256_fmadd_ps(a9, b, c);
    a10 = _mm256_fmadd_ps(a10, b, c), a11 = _mm256_fmadd_ps(a11, b, c);
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                           _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
  float lanes[8];
  _mm256_storeu_ps(lanes, s);
  sink = lanes[0] + lanes[7];
  return 2.0 * 12 * 8 * (double)iters;
}

/* 16 chains of 16 lanes: half of the 32 zmm registers, well past latency x pipes. */
__attribute__((target("avx512f"))) static double fma_avx512(int64_t iters) {
  __m512 a[16];
  for (int k = 0; k < 16; ++k) a[k] = _mm512_set1_ps(1.0f + 0.01f * (float)k);
  const __m512 b = _mm512_set1_ps(chain_mul), c = _mm512_set1_ps(chain_add);
  for (int64_t i = 0; i < iters; ++i) {
    a[0] = _mm512_fmadd_ps(a[0], b, c), a[1] = _mm512_fmadd_ps(a[1], b, c);
    a[2] = _mm512_fmadd_ps(a[2], b, c), a[3] = _mm512_fmadd_ps(a[3], b, c);
    a[4] = _mm512_fmadd_ps(a[4], b, c), a[5] = _mm512_fmadd_ps(a[5], b, c);
    a[6] = _mm512_fmadd_ps(a[6], b, c), a[7] = _mm512_fmadd_ps(a[7], b, c);
    a[8] = _mm512_fmadd_ps(a[8], b, c), a[9] = _mm512_fmadd_ps(a[9], b, c);
    a[10] = _mm512_fmadd_ps(a[10], b, c), a[11] = _mm512_fmadd_ps(a[11], b, c);
    a[12] = _mm512_fmadd_ps(a[12], b, c), a[13] = _mm512_fmadd_ps(a[13], b, c);
    a[14] = _mm512_fmadd_ps(a[14], b, c), a[15] = _mm512_fmadd_ps(a[15], b, c);
  }
  __m512 s = a[0];
  for (int k = 1; k < 16; ++k) s = _mm512_add_ps(s, a[k]);
  sink = _mm512_reduce_add_ps(s);
  return 2.0 * 16 * 16 * (double)iters;
}
#endif

bench_peak bench_measure_peak(double seconds_total) {
  double (*kernel)(int64_t) = fma_scalar;
  bench_peak peak = {0.0, "scalar"};
#ifdef BENCH_X86
  if (attn_cpu_can_run(ATTN_CPU_AVX512F)) {
    kernel = fma_avx512, peak.isa = "avx512f";
  } else if (attn_cpu_can_run(ATTN_CPU_AVX2 | ATTN_CPU_FMA)) {
    kernel = fma_avx2, peak.isa = "avx2+fma";
  }
#endif
  /* Grow the trip count until one run takes a measurable time, then keep the best of the runs
   * that fit the budget: the best, because interruptions only ever make a run slower. */
  int64_t iters = 1 << 14;
  double start = bench_now();
  for (;;) {
    double t0 = bench_now();
    double flop = kernel(iters);
    double dt = bench_now() - t0;
    if (dt > 1e-3 && flop / dt * 1e-9 > peak.gflops) peak.gflops = flop / dt * 1e-9;
    if (dt < 0.02) iters *= 2;
    if (bench_now() - start > seconds_total && dt >= 0.02) break;
  }
  return peak;
}

bench_peak bench_measure_peak_threads(int threads, double seconds_total) {
  bench_peak one = bench_measure_peak(0.2); /* the kernel's name and a trip count's scale */
  double (*kernel)(int64_t) = fma_scalar;
#ifdef BENCH_X86
  if (strcmp(one.isa, "avx512f") == 0) kernel = fma_avx512;
  else if (strcmp(one.isa, "avx2+fma") == 0) kernel = fma_avx2;
#endif
#ifdef _OPENMP
  const int team = threads > 0 ? threads : omp_get_max_threads();
#else
  (void)threads;
#endif
  /* about 50 ms a run at the one-thread rate; every thread runs the same chains at once, and a run
   * lasts as long as its slowest thread */
  const int64_t iters = (int64_t)(one.gflops * 1e9 * 0.05 / kernel(1)) + 1;
  bench_peak peak = {0.0, one.isa};
  double start = bench_now();
  do {
    double t0 = bench_now(), flop = 0.0;
#ifdef _OPENMP
#pragma omp parallel num_threads(team) reduction(+ : flop)
#endif
    flop += kernel(iters);
    double dt = bench_now() - t0;
    if (dt > 0 && flop / dt * 1e-9 > peak.gflops) peak.gflops = flop / dt * 1e-9;
  } while (bench_now() - start < seconds_total);
  return peak;
}

/* Sum of n floats (n a multiple of 16) in four 16-lane accumulators: the loads are the work. */
static float sum_stream(const float *x, int64_t n) {
#if defined(__GNUC__)
  typedef float v16 __attribute__((vector_size(64)));
  v16 a = {0}, b = {0}, c = {0}, d = {0};
  for (int64_t i = 0; i < n; i += 64) {
    v16 x0, x1, x2, x3;
    memcpy(&x0, x + i, 64), memcpy(&x1, x + i + 16, 64);
    memcpy(&x2, x + i + 32, 64), memcpy(&x3, x + i + 48, 64);
    a += x0, b += x1, c += x2, d += x3;
  }
  v16 s = a + b + c + d;
  float t = 0.0f;
  for (int l = 0; l < 16; ++l) t += s[l];
  return t;
#else
  float t = 0.0f;
  for (int64_t i = 0; i < n; ++i) t += x[i];
  return t;
#endif
}

double bench_measure_read_gbps(int threads, double seconds) {
  const int64_t n = (int64_t)1 << 27; /* 512 MiB of floats */
  float *x = malloc((size_t)n * sizeof *x);
  if (x == NULL) return 0.0;
#ifdef _OPENMP
  const int team = threads > 0 ? threads : omp_get_max_threads();
#else
  (void)threads;
#endif
  /* Written by the threads that read it, so each part's pages sit near its reader. */
#ifdef _OPENMP
#pragma omp parallel for num_threads(team) schedule(static)
#endif
  for (int64_t i = 0; i < n; ++i) x[i] = 1e-6f;
  double best = 0.0, start = bench_now();
  do {
    double t0 = bench_now();
    float total = 0.0f;
#ifdef _OPENMP
#pragma omp parallel for num_threads(team) schedule(static) reduction(+ : total)
#endif
    for (int part = 0; part < 64; ++part) total += sum_stream(x + part * (n / 64), n / 64);
    double dt = bench_now() - t0;
    sink = total;
    if (dt > 0 && (double)n * sizeof *x / dt * 1e-9 > best) best = (double)n * sizeof *x / dt * 1e-9;
  } while (bench_now() - start < seconds);
  free(x);
  return best;
}
