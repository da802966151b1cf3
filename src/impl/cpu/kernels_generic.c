/*
 * src/impl/cpu/kernels_generic.c - the portable kernels of the "cpu" implementation: plain C11 that
 * any compiler vectorises for the baseline instruction set. Compiled with no special flags; it is
 * the fallback on machines without AVX2 and the path ATTN_CPU_ISA=generic forces in tests.
 */
#include "impl/cpu/cpu.h"
#include "impl/cpu/decode_kernels.h"

#include "core/dtype.h"
#include "core/philox.h"

#include <math.h>
#include <stddef.h>

static void gemm_generic(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, int trans_a,
                         const float *b, int64_t ldb, float *c, int64_t ldc, int accumulate,
                        void *scratch) {
  (void)scratch;
  for (int64_t r = 0; r < m; ++r) {
    float *cr = c + r * ldc;
    if (!accumulate)
      for (int64_t j = 0; j < n; ++j) cr[j] = 0.0f;
    for (int64_t kk = 0; kk < k; ++kk) {
      const float av = trans_a ? a[kk * lda + r] : a[r * lda + kk];
      const float *bk = b + kk * ldb;
      for (int64_t j = 0; j < n; ++j) cr[j] += av * bk[j];
    }
  }
}

static float row_max_generic(const float *x, int64_t n) {
  float m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

static float exp_sum_generic(float *x, int64_t n, float m) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const float d = x[j] - m;
    x[j] = expf(d > 0.0f ? 0.0f : d); /* expf(-inf) = 0 exactly; at most 0 as cpu.h says */
    sum += x[j];
  }
  return sum;
}

static void scale_generic(float *x, int64_t n, float s) {
  for (int64_t j = 0; j < n; ++j) x[j] *= s;
}

static void ds_row_generic(float *dp, const float *p, int64_t n, float delta) {
  for (int64_t j = 0; j < n; ++j) dp[j] = p[j] * (dp[j] - delta);
}

void attn_cpu_softcap_generic(float *x, float *dc, int64_t n, float cap) {
  for (int64_t j = 0; j < n; ++j) {
    const float y = x[j] / cap, t = tanhf(y);
    x[j] = cap * t;
    /* 1 - tanh^2 = 4u / (1 + u)^2 with u = exp(-2|y|): 1 - t * t would cancel near +-1. */
    if (dc != NULL) {
      const float u = expf(-2.0f * fabsf(y));
      dc[j] = 4.0f * u / ((1.0f + u) * (1.0f + u));
    }
  }
}

void attn_cpu_load_f16_generic(const uint16_t *src, int64_t n, float s, float *dst) {
  for (int64_t d = 0; d < n; ++d) dst[d] = s * attn_inline_f16_to_f32(src[d]);
}

void attn_cpu_store_f16_generic(uint16_t *dst, int64_t n, const float *src, float s) {
  for (int64_t d = 0; d < n; ++d) dst[d] = attn_inline_f32_to_f16(s * src[d]);
}

void attn_cpu_dropout_keep_generic(uint64_t seed, uint32_t threshold, int64_t b, int64_t h,
                                   int64_t i, int64_t j0, int64_t n, uint8_t *keep) {
  const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  for (int64_t jj = 0; jj < n; jj += 4) {
    const uint32_t ctr[4] = {(uint32_t)i, (uint32_t)((j0 + jj) >> 2), (uint32_t)h, (uint32_t)b};
    uint32_t w[4];
    attn_philox4x32_10(ctr, key, w);
    for (int64_t e = 0; e < 4 && jj + e < n; ++e) keep[jj + e] = w[e] >= threshold;
  }
}

const attn_cpu_kernels attn_cpu_kernels_generic = {
    .name = "generic",
    .gemm = gemm_generic,
    .gemm_exact = gemm_generic,
    .row_max = row_max_generic,
    .exp_sum = exp_sum_generic,
    .scale = scale_generic,
    .ds_row = ds_row_generic,
    .softcap = attn_cpu_softcap_generic,
    .load_f16 = attn_cpu_load_f16_generic,
    .store_f16 = attn_cpu_store_f16_generic,
    .dropout_keep = attn_cpu_dropout_keep_generic,
    .decode_scores = decode_scores_kernel,
    .decode_pv = decode_pv_kernel,
};
