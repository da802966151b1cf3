/*
 * gpu/bench_common.h - what the two GPU benchmarks (gpu/cuda_bench.c, gpu/bench_cudnn.c) share:
 * the fatal check of CUDA runtime calls, the shapes of the comparison with PyTorch (bf16,
 * B * T = 16384 tokens, Hq * D = 2048, Hkv = Hq, dense [B, T, H, D]) and their FLOP count, the
 * device tensors of one forward and backward pass on random inputs, and the median of the timings.
 *
 * Header-only (static inline functions): each benchmark is one program built by one compiler call in
 * gpu/run.sh, against the public header only.
 */
#ifndef ATTN_GPU_BENCH_COMMON_H
#define ATTN_GPU_BENCH_COMMON_H

#include "attn.h"

#include <cuda_runtime_api.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A CUDA runtime call that must succeed; a failure ends the benchmark, whose numbers would mean
 * nothing after it. */
#define BENCH_CUDA_CHECK(expr)                                                                     \
  do {                                                                                             \
    cudaError_t e_ = (expr);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s failed: %s (%s:%d)\n", #expr, cudaGetErrorString(e_), __FILE__,         \
              __LINE__);                                                                           \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

/* The benchmark shape of head dim d and sequence length t (Tq = Tk): bf16 on the device, the
 * batch and head counts keeping B * T = 16384 tokens and Hq * D = 2048. */
static inline attn_problem bench_problem(int64_t d, int64_t t, int causal) {
  attn_problem p;
  attn_problem_init(&p);
  p.dtype = ATTN_DTYPE_BF16;
  p.device = ATTN_DEVICE_CUDA;
  p.batch = 16384 / t, p.seqlen_q = p.seqlen_k = t, p.heads_q = p.heads_kv = 2048 / d;
  p.head_dim = d, p.causal = causal;
  return p;
}

/* The forward pass's FLOP count as FlashAttention and PyTorch count it: 4 * B * Hq * T * T * D
 * (two matrix products), halved when causal. The backward pass counts 2.5x that. */
static inline double bench_forward_flops(const attn_problem *p) {
  double flops = 4.0 * (double)p->batch * (double)p->heads_q * (double)p->seqlen_q *
                 (double)p->seqlen_k * (double)p->head_dim;
  return p->causal ? flops / 2 : flops;
}

/* n random bf16 values in [-1, 1) on the device, drawn from seed (xorshift64): never a tensor of
 * zeros, which draws less power than real data and can time faster. */
static inline void *bench_random_bf16(size_t n, uint64_t seed) {
  uint16_t *h = malloc(n * 2);
  if (h == NULL) {
    fprintf(stderr, "out of host memory for %zu values\n", n);
    exit(1);
  }
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    float f = (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    uint32_t bits;
    memcpy(&bits, &f, 4);
    h[i] = (uint16_t)(bits >> 16); /* bf16: the upper half of the f32 */
  }
  void *d;
  BENCH_CUDA_CHECK(cudaMalloc(&d, n * 2));
  BENCH_CUDA_CHECK(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
  free(h);
  return d;
}

/* The device tensors of one forward (with lse) and backward pass of a plan's problem: q, k, v and
 * dout random, the rest uninitialised, and one workspace large enough for either pass. */
typedef struct bench_buffers {
  attn_inputs in;   /* q, k, v */
  attn_outputs out; /* out, lse */
  attn_grads grads; /* dq, dk, dv */
  attn_tensor dout;
  void *workspace;
  size_t workspace_size;
} bench_buffers;

static inline bench_buffers bench_buffers_create(attn_plan *plan, const attn_problem *p) {
  bench_buffers b;
  size_t n = (size_t)(p->batch * p->seqlen_q * p->heads_q * p->head_dim);
  size_t rows = (size_t)(p->batch * p->heads_q * p->seqlen_q);
  size_t fw = 0, bw = 0;
  attn_plan_workspace_size(plan, &fw, &bw);
  b.workspace_size = fw > bw ? fw : bw;
  b.workspace = NULL;
  if (b.workspace_size > 0) BENCH_CUDA_CHECK(cudaMalloc(&b.workspace, b.workspace_size));
  attn_inputs_init(&b.in);
  b.in.q = attn_tensor_dense(bench_random_bf16(n, 1));
  b.in.k = attn_tensor_dense(bench_random_bf16(n, 2));
  b.in.v = attn_tensor_dense(bench_random_bf16(n, 3));
  b.dout = attn_tensor_dense(bench_random_bf16(n, 4));
  void *out, *lse, *dq, *dk, *dv;
  BENCH_CUDA_CHECK(cudaMalloc(&out, n * 2));
  BENCH_CUDA_CHECK(cudaMalloc(&lse, rows * 4));
  BENCH_CUDA_CHECK(cudaMalloc(&dq, n * 2));
  BENCH_CUDA_CHECK(cudaMalloc(&dk, n * 2));
  BENCH_CUDA_CHECK(cudaMalloc(&dv, n * 2));
  attn_outputs_init(&b.out);
  b.out.out = attn_tensor_dense(out), b.out.lse = attn_tensor_dense(lse);
  attn_grads_init(&b.grads);
  b.grads.dq = attn_tensor_dense(dq), b.grads.dk = attn_tensor_dense(dk);
  b.grads.dv = attn_tensor_dense(dv);
  return b;
}

static inline void bench_buffers_destroy(bench_buffers *b) {
  void *all[] = {b->in.q.data,     b->in.k.data,     b->in.v.data,     b->dout.data,
                 b->out.out.data,  b->out.lse.data,  b->grads.dq.data, b->grads.dk.data,
                 b->grads.dv.data, b->workspace};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
    if (all[i] != NULL) BENCH_CUDA_CHECK(cudaFree(all[i]));
}

static inline int bench_compare_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* The median of n timings (sorted in place). */
static inline float bench_median(float *ms, int n) {
  qsort(ms, (size_t)n, sizeof ms[0], bench_compare_float);
  return ms[n / 2];
}

#endif /* ATTN_GPU_BENCH_COMMON_H */
