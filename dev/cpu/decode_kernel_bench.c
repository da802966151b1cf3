/*
 * dev/cpu/decode_kernel_bench.c - the cpu decode path's two vector loops alone: the table's
 * decode_scores and decode_pv (decode_kernels.h, AVX-512 table) for each way of reading a row, and
 * the bf16 loops (kernels_avx512bf16.c), on a few key blocks that stay in L2, timed on the thread's
 * CPU clock, best of 60: ns per key and KV head (Hkv = 8, R = 4 rows, D = Dv = 128, blocks of
 * ATTN_CPU_DECODE_BLOCK keys). The decode calls around them (softmax, block loop, line requests,
 * merge) are left out, and nothing is requested ahead: the figure is the loops' arithmetic. For
 * scale, 64 FMAs a key and head (scores and P V of 4 rows at D = 128) at two a cycle.
 * Not part of the build; from a CPU-only build folder B (AVX-512 machines only):
 *   gcc -O2 -std=c11 -Iinclude -Isrc dev/cpu/decode_kernel_bench.c B/libattn.a -fopenmp -lm \
 *       -o /tmp/decode_kernel_bench
 *   /tmp/decode_kernel_bench [BLOCKS]   (default 4 blocks: 512 KiB of f16 K and V)
 */
#define _POSIX_C_SOURCE 200809L
#include "impl/cpu/cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { HEADS = 8, ROWS = 4, DIM = 128, KEYS = ATTN_CPU_DECODE_BLOCK, REPS = 60, PASSES = 8 };

static double thread_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* K and V of `blocks` blocks (element bytes es), every key's heads side by side, and the row
 * addresses: K's then V's. */
static const char **make_rows(int blocks, size_t es, char **k, char **v) {
  const size_t key_bytes = (size_t)HEADS * DIM * es, n = key_bytes * KEYS * (size_t)blocks;
  *k = aligned_alloc(64, n), *v = aligned_alloc(64, n);
  const char **rows = malloc(sizeof *rows * 2 * KEYS * (size_t)blocks);
  if (*k == NULL || *v == NULL || rows == NULL) return NULL;
  for (size_t i = 0; i < n / 2; ++i) /* f16 / bf16 values near 1 and 0.5; f32 rows: small floats */
    ((uint16_t *)*k)[i] = (uint16_t)(0x3c00 ^ (i & 0x3ff)),
               ((uint16_t *)*v)[i] = (uint16_t)(0x3800 ^ (i & 0x3ff));
  if (es == 4)
    for (size_t i = 0; i < n / 4; ++i)
      ((float *)*k)[i] = 1e-3f * (float)(i % 97), ((float *)*v)[i] = 1e-3f * (float)(i % 89);
  for (int j = 0; j < KEYS * blocks; ++j)
    rows[j] = *k + key_bytes * j, rows[KEYS * blocks + j] = *v + key_bytes * j;
  return rows;
}

int main(int argc, char **argv) {
  const int blocks = argc > 1 ? atoi(argv[1]) : 4;
  if (blocks < 1) return 2;
  static const char *names[] = {"f32", "bf16", "bf16 pairs", "f16"};
  float *q = aligned_alloc(64, sizeof(float) * HEADS * ROWS * DIM);
  float *S = aligned_alloc(64, sizeof(float) * HEADS * ROWS * KEYS);
  float *O = aligned_alloc(64, sizeof(float) * HEADS * ROWS * DIM);
  uint16_t *q16 = aligned_alloc(64, 2 * HEADS * ROWS * DIM),
           *P = aligned_alloc(64, 2 * HEADS * ROWS * KEYS);
  if (q == NULL || S == NULL || O == NULL || q16 == NULL || P == NULL) return 1;
  for (int i = 0; i < HEADS * ROWS * DIM; ++i)
    q[i] = 1e-3f * (float)(i % 31), q16[i] = 0x3c00, O[i] = 0.0f;
  for (int i = 0; i < HEADS * ROWS * KEYS; ++i) S[i] = 0.01f;
  const double key_heads = (double)KEYS * blocks * HEADS * PASSES;
  for (int mode = 0; mode <= 4; ++mode) { /* ROWS_* and, last, the bf16 loops */
    const size_t es = mode == ROWS_F32 ? 4 : 2;
    char *k = NULL, *v = NULL;
    const char **rows = make_rows(blocks, es, &k, &v);
    if (rows == NULL) return 1;
    attn_cpu_decode_block a;
    memset(&a, 0, sizeof a);
    a.heads = HEADS, a.R = ROWS, a.D = DIM, a.Dv = DIM, a.nb = KEYS, a.ldq = DIM, a.q = q16;
    a.scale = 1.0f, a.S = S, a.P = P, a.O = O, a.ldo = DIM, a.head_bytes = DIM * es;
    double scores = 1e30, pv = 1e30;
    for (int rep = 0; rep < REPS; ++rep) {
      const double t0 = thread_seconds();
      for (int pass = 0; pass < PASSES; ++pass)
        for (int b = 0; b < blocks; ++b) {
          a.rows = rows + b * KEYS;
          if (mode == 4)
            attn_cpu_decode_scores_bf16(&a);
          else
            attn_cpu_decode_scores_avx512(&a, q, mode);
        }
      const double t1 = thread_seconds();
      for (int pass = 0; pass < PASSES; ++pass)
        for (int b = 0; b < blocks; ++b) {
          a.rows = rows + (KEYS * blocks) + b * KEYS;
          if (mode == 4)
            attn_cpu_decode_pv_bf16(&a);
          else
            attn_cpu_decode_pv_avx512(&a, mode);
        }
      const double t2 = thread_seconds();
      if (t1 - t0 < scores) scores = t1 - t0;
      if (t2 - t1 < pv) pv = t2 - t1;
    }
    printf("%-18s scores %5.2f ns  P V %5.2f ns  a key and KV head (K+V %zu KiB)\n",
           mode == 4 ? "bf16 (bf16 loops)" : names[mode], scores / key_heads * 1e9,
           pv / key_heads * 1e9, 2 * (size_t)HEADS * DIM * es * KEYS * (size_t)blocks / 1024);
    free(k), free(v), free(rows);
  }
  free(q), free(S), free(O), free(q16), free(P);
  return 0;
}
