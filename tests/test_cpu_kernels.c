/*
 * tests/test_cpu_kernels.c - the cpu implementation's packed-B products (cpu.h's pack_b and
 * gemm_packed) against the same table's gemm, bit for bit, on every table that has them and that
 * this processor runs (amx, avx512bf16; skipped, exit 77, where none does).
 *
 * The backward packs a key block's K^T, V^T and K once (pack_b) and multiplies every query block
 * with gemm_packed, offsetting into the block by whole 16-column panels (K^T, V^T) or by an even
 * number of rows (K). gemm would pack the same operand per product; the two must agree exactly,
 * so that packing once changes no result bit. The cases cover what the driver does: m from 1 to
 * past a register block, n of one to several 32-column steps, k odd and even (an odd k's last
 * pair has a partner row that is not the product's: the packed memory there holds another key,
 * here inf and NaN, which must not reach C), column and row offsets into a larger packed block,
 * A plain and transposed, accumulating and not.
 */
#include "testutil.h"

#include "core/device.h"
#include "impl/cpu/cpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct named_table {
  const char *name;
  const attn_cpu_kernels *k;
} named_table;

/* A value of f32 with a few significant bits and both signs, so that products are varied. */
static float draw(tu_rng *rng) { return (float)tu_uniform(rng, -2.0, 2.0); }

/* 64-byte aligned, as the driver's workspace regions are (C11: the size a multiple of it). */
static void *aligned(size_t bytes) { return aligned_alloc(64, (bytes + 64) / 64 * 64); }

/* One case: B is rows [r0, r0 + k) and columns [c0, c0 + n) of a [rows_all x cols_all] f32
 * matrix whose other rows hold inf and NaN; gemm reads it in place, gemm_packed reads it from
 * pack_b of the whole matrix. */
static void check_case(const named_table *t, tu_rng *rng, int64_t m, int64_t n, int64_t k,
                       int64_t r0, int64_t c0, int trans_a, int accumulate) {
  const int64_t rows_all = r0 + k + 3, cols_all = c0 + n + 16;
  const int64_t lda = trans_a ? m + 5 : k + 5, ldc = n + 16;
  const int64_t a_n = trans_a ? k * lda : m * lda;
  float *a = aligned((size_t)a_n * sizeof(float));
  float *b = aligned((size_t)(rows_all * cols_all) * sizeof(float));
  float *c_ref = aligned((size_t)(m * ldc) * sizeof(float));
  float *c_got = aligned((size_t)(m * ldc) * sizeof(float));
  const int64_t ldo = 2 * cols_all;
  uint16_t *bp = aligned((size_t)(((rows_all + 1) / 2) * ldo) * sizeof(uint16_t));
  void *scratch = aligned(ATTN_CPU_GEMM_SCRATCH(m, n, k)); /* what cpu.h promises a product */
  if (a == NULL || b == NULL || c_ref == NULL || c_got == NULL || bp == NULL || scratch == NULL) {
    tu_check(0, "out of memory");
    free(a), free(b), free(c_ref), free(c_got), free(bp), free(scratch);
    return;
  }
  for (int64_t i = 0; i < a_n; ++i) a[i] = draw(rng);
  for (int64_t r = 0; r < rows_all; ++r)
    for (int64_t col = 0; col < cols_all; ++col) {
      const int inside = r >= r0 && r < r0 + k;
      b[r * cols_all + col] = inside ? draw(rng) : (col % 2 ? INFINITY : NAN);
    }
  for (int64_t i = 0; i < m * ldc; ++i) c_ref[i] = c_got[i] = draw(rng);

  t->k->gemm(m, n, k, a, lda, trans_a, b + r0 * cols_all + c0, cols_all, c_ref, ldc, accumulate,
             scratch);
  /* The driver packs the whole block from row 0 and offsets by even rows, as here. */
  t->k->pack_b(b, cols_all, rows_all, cols_all, bp, ldo);
  t->k->gemm_packed(m, n, k, a, lda, trans_a, bp + (r0 / 2) * ldo + 2 * c0, ldo, c_got, ldc,
                    accumulate, scratch);
  if (t->k->tiles_release != NULL) t->k->tiles_release();

  int64_t bad = -1;
  for (int64_t r = 0; r < m && bad < 0; ++r)
    for (int64_t col = 0; col < n; ++col)
      if (memcmp(&c_ref[r * ldc + col], &c_got[r * ldc + col], sizeof(float)) != 0) {
        bad = r * ldc + col;
        break;
      }
  tu_check(bad < 0,
           "%s: gemm_packed against gemm (m %lld n %lld k %lld, rows from %lld, columns from %lld, "
           "trans_a %d, accumulate %d): first difference C[%lld, %lld] %.9g vs %.9g",
           t->name, (long long)m, (long long)n, (long long)k, (long long)r0, (long long)c0,
           trans_a, accumulate, (long long)(bad < 0 ? 0 : bad / ldc),
           (long long)(bad < 0 ? 0 : bad % ldc), bad < 0 ? 0.0 : (double)c_ref[bad],
           bad < 0 ? 0.0 : (double)c_got[bad]);
  free(a), free(b), free(c_ref), free(c_got), free(bp), free(scratch);
}

int main(void) {
  const uint64_t seed = tu_seed("test_cpu_kernels");
  tu_rng rng = tu_rng_make(seed);
  named_table tables[2];
  int ntables = 0;
#ifdef ATTN_CPU_X86
  const int has_bf16 = attn_cpu_can_run(ATTN_CPU_AVX2 | ATTN_CPU_FMA | ATTN_CPU_F16C |
                                        ATTN_CPU_AVX512F | ATTN_CPU_AVX512BW |
                                        ATTN_CPU_AVX512VL | ATTN_CPU_AVX512DQ |
                                        ATTN_CPU_AVX512BF16);
  if (has_bf16) tables[ntables++] = (named_table){"avx512bf16", &attn_cpu_kernels_avx512bf16};
  if (has_bf16 && attn_cpu_amx_usable())
    tables[ntables++] = (named_table){"amx", &attn_cpu_kernels_amx};
#endif
  int cases = 0;
  for (int i = 0; i < ntables; ++i) {
    if (tables[i].k->pack_b == NULL || tables[i].k->gemm_packed == NULL) continue;
    /* The driver's shapes first (D = 64, 128, an odd 33 padded to 48; key blocks of 64 and 256
     * keys cut to odd lengths), then random ones. */
    static const int64_t fixed[][5] = {{64, 256, 128, 0, 0},  {64, 64, 64, 0, 16},
                                       {37, 48, 33, 0, 0},   {64, 128, 255, 0, 0},
                                       {64, 128, 1, 254, 0}, {1, 16, 3, 2, 32}};
    for (size_t f = 0; f < sizeof fixed / sizeof fixed[0]; ++f)
      for (int trans_a = 0; trans_a < 2; ++trans_a)
        for (int acc = 0; acc < 2; ++acc, ++cases)
          check_case(&tables[i], &rng, fixed[f][0], fixed[f][1], fixed[f][2], fixed[f][3],
                     fixed[f][4], trans_a, acc);
    for (int r = 0; r < 60; ++r, ++cases) {
      const int64_t m = tu_int(&rng, 1, 70), n = 16 * tu_int(&rng, 1, 9);
      const int64_t k = tu_int(&rng, 1, 130), r0 = 2 * tu_int(&rng, 0, 20);
      const int64_t c0 = 16 * tu_int(&rng, 0, 3);
      check_case(&tables[i], &rng, m, n, k, r0, c0, (int)tu_int(&rng, 0, 1),
                 (int)tu_int(&rng, 0, 1));
    }
    printf("%s: %d products of gemm_packed equal gemm's bit for bit\n", tables[i].name, cases);
  }
  if (cases == 0) {
    printf("skipped: no table with pack_b and gemm_packed runs on this processor\n");
    return 77;
  }
  return tu_finish();
}
