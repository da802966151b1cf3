/*
 * dev/cpu/kernel_bench.c - times the "cpu" implementation's kernels alone on one thread, at the tile
 * shapes the driver uses, to see where a forward pass spends its time. Not part of the build:
 *   gcc -O3 -std=c11 -Isrc -Iinclude dev/cpu/kernel_bench.c /tmp/cpubuild/libattn.a -lm -fopenmp
 *   (a CPU-only build: cmake -DATTN_WITH_CUDA=OFF -DATTN_WITH_CUDNN=OFF, as in features_bench.c)
 */
#define _POSIX_C_SOURCE 200809L
#include "impl/cpu/cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "dev_timing.h"

int main(int argc, char **argv) {
  int D = argc > 1 ? atoi(argv[1]) : 64, bq = argc > 2 ? atoi(argv[2]) : 64,
      bk = argc > 3 ? atoi(argv[3]) : 128;
  const attn_cpu_kernels *k = &attn_cpu_kernels_avx512;
  float *q = aligned_alloc(64, 4 * bq * D), *kt = aligned_alloc(64, 4 * D * bk),
        *s = aligned_alloc(64, 4 * bq * bk), *v = aligned_alloc(64, 4 * bk * D),
        *o = aligned_alloc(64, 4 * bq * D);
  for (int i = 0; i < bq * D; ++i) q[i] = 0.01f * (i % 7), o[i] = 0;
  for (int i = 0; i < bk * D; ++i) kt[i] = 0.01f * (i % 5), v[i] = 0.02f * (i % 3);
  int iters = 20000;
  double t0 = dev_now();
  for (int it = 0; it < iters; ++it) k->gemm(bq, bk, D, q, D, 0, kt, bk, s, bk, 0, NULL);
  double t1 = dev_now();
  for (int it = 0; it < iters; ++it) k->gemm(bq, D, bk, s, bk, 0, v, D, o, D, 1, NULL);
  double t2 = dev_now();
  for (int it = 0; it < iters; ++it)
    for (int r = 0; r < bq; ++r) {
      float m = k->row_max(s + r * bk, bk);
      k->exp_sum(s + r * bk, bk, m + 1.0f);
      k->scale(o + r * D, D, 0.999f);
    }
  double t3 = dev_now();
  double fl = 2.0 * bq * bk * D * iters;
  printf("D=%d bq=%d bk=%d: QK %.1f GFLOP/s, PV %.1f GFLOP/s, softmax %.2f ns/element "
         "(%.1f%% of the two gemms' time)\n",
         D, bq, bk, fl / (t1 - t0) * 1e-9, fl / (t2 - t1) * 1e-9,
         (t3 - t2) / ((double)iters * bq * bk) * 1e9, 100.0 * (t3 - t2) / (t2 - t0));
  return 0;
}
