/*
 * src/impl/cpu/cpu.h - internals of the "cpu" implementation: the table of vector kernels that each
 * instruction-set file fills (kernels_generic.c, kernels_avx2.c, kernels_avx512.c) and that the
 * driver (cpu.c: tiling, online softmax, features, threads) calls.
 *
 * Every kernel works on packed f32 tiles in memory the driver owns; strides of the user's tensors
 * never reach this level. The driver picks one table per plan (cpuid, lowered by ATTN_CPU_ISA).
 */
#ifndef ATTN_IMPL_CPU_CPU_H
#define ATTN_IMPL_CPU_CPU_H

#include <stdint.h>

/* Column counts handed to gemm are multiples of this; packed tiles pad their rows to it. */
#define ATTN_CPU_NPAD 16

typedef struct attn_cpu_kernels {
  const char *name; /* "generic", "avx2", "avx512" */
  /* C[m x n] = (accumulate ? C : 0) + A B in f32, where A(r, k) = a[r * lda + k] (trans_a = 0) or
   * a[k * lda + r] (trans_a = 1), B is row-major [k x n] with row stride ldb, C row-major with row
   * stride ldc. n is a multiple of ATTN_CPU_NPAD; every row of B and C holds n readable floats. */
  void (*gemm)(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, int trans_a,
               const float *b, int64_t ldb, float *c, int64_t ldc, int accumulate);
  /* max of x[0..n), -inf when n = 0 or every element is -inf. */
  float (*row_max)(const float *x, int64_t n);
  /* x[j] = exp(x[j] - m) for j < n (exactly 0 where x[j] = -inf), returning their sum. m finite. */
  float (*exp_sum)(float *x, int64_t n, float m);
  /* x[j] *= s for j < n. */
  void (*scale)(float *x, int64_t n, float s);
  /* dp[j] = p[j] * (dp[j] - delta) for j < n: dS of the backward pass. */
  void (*ds_row)(float *dp, const float *p, int64_t n, float delta);
} attn_cpu_kernels;

extern const attn_cpu_kernels attn_cpu_kernels_generic;
#if defined(__x86_64__) || defined(__i386__)
#define ATTN_CPU_X86 1
extern const attn_cpu_kernels attn_cpu_kernels_avx2;
extern const attn_cpu_kernels attn_cpu_kernels_avx512;
#endif

/* The kernel table a new plan of "cpu" would use now ("generic", "avx2", "avx512"): cpuid lowered
 * by ATTN_CPU_ISA. For benchmarks that report which path ran. */
const char *attn_cpu_isa_name(void);

#endif /* ATTN_IMPL_CPU_CPU_H */
