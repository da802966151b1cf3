/*
 * tools/peak.h - this machine's f32 fused multiply-add peak, measured rather than looked up, so
 * the benchmark can say what fraction of the hardware an implementation reaches.
 */
#ifndef ATTN_TOOLS_PEAK_H
#define ATTN_TOOLS_PEAK_H

typedef struct bench_peak {
  double gflops;   /* f32 GFLOP/s of one thread (an FMA counts 2 FLOP) */
  const char *isa; /* "avx512f", "avx2+fma" or "scalar": the widest the CPU runs */
} bench_peak;

/* Runs independent FMA chains on one thread for about seconds_total and returns the best rate. */
bench_peak bench_measure_peak(double seconds_total);

/* The same chains on `threads` threads at once (0 = the OpenMP default), their summed rate: what
 * the cores reach together, at the clock all of them can hold (with AVX-512, often below one
 * core's), where bench_measure_peak times one thread alone. */
bench_peak bench_measure_peak_threads(int threads, double seconds_total);

/* The machine's memory read rate in GB/s (1e9 bytes/s), STREAM-style: `threads` threads (0 = the
 * OpenMP default) sum disjoint parts of a 512 MiB buffer, far larger than any cache, in vector
 * registers; the best of the passes that fit about `seconds` (interruptions only slow a pass).
 * The yardstick of a decode problem, which reads K and V once. 0 when the buffer cannot be had. */
double bench_measure_read_gbps(int threads, double seconds);

/* Seconds from a monotonic clock. */
double bench_now(void);

#endif /* ATTN_TOOLS_PEAK_H */
