/*
 * gpu/bench_cudnn.c - times the "cudnn" implementation on the shapes of bench/RESULTS.md's cuDNN
 * section: bf16, B * T = 16384 tokens, Hq * D = 2048, D in {128, 64}, T in {512, 8192}, causal or
 * not, forward (with lse) and backward. Each measurement: the plan is made (and its build time
 * printed), 5 warm-up calls, then 30 calls each timed with CUDA events; the median is reported.
 * Inputs are random (never zeros). Built and run by gpu/run.sh; prints CSV rows:
 *   impl,d,t,causal,pass,ms,tflops
 */
#include "attn.h"

#include <cuda_runtime_api.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CU(expr)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (expr);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s failed: %s (%s:%d)\n", #expr, cudaGetErrorString(e_), __FILE__, __LINE__); \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

#define WARMUP 5
#define REPS 30

static void *random_bf16(size_t n, uint64_t seed) {
  uint16_t *h = malloc(n * 2);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    float f = (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    uint32_t bits;
    memcpy(&bits, &f, 4);
    h[i] = (uint16_t)(bits >> 16);
  }
  void *d;
  CU(cudaMalloc(&d, n * 2));
  CU(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
  free(h);
  return d;
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

int main(void) {
  attn_ctx *ctx;
  attn_ctx_create(&ctx);
  const int64_t dims[2] = {128, 64}, lens[2] = {512, 8192};
  cudaStream_t stream;
  CU(cudaStreamCreate(&stream));
  cudaEvent_t e0, e1;
  CU(cudaEventCreate(&e0));
  CU(cudaEventCreate(&e1));
  printf("impl,d,t,causal,pass,ms,tflops\n");
  for (int di = 0; di < 2; ++di)
    for (int ti = 0; ti < 2; ++ti)
      for (int causal = 0; causal < 2; ++causal) {
        int64_t d = dims[di], t = lens[ti], b = 16384 / t, h = 2048 / d;
        attn_problem p;
        attn_problem_init(&p);
        p.dtype = ATTN_DTYPE_BF16;
        p.device = ATTN_DEVICE_CUDA;
        p.batch = b, p.seqlen_q = t, p.seqlen_k = t, p.heads_q = h, p.heads_kv = h;
        p.head_dim = d, p.causal = causal;
        attn_select sel;
        attn_select_init(&sel);
        sel.impl = "cudnn";
        struct timespec c0, c1;
        clock_gettime(CLOCK_MONOTONIC, &c0);
        attn_plan *plan;
        if (attn_plan_create(ctx, &p, &sel, &plan) != ATTN_STATUS_OK) {
          fprintf(stderr, "plan: %s\n", attn_ctx_last_error(ctx));
          return 1;
        }
        clock_gettime(CLOCK_MONOTONIC, &c1);
        fprintf(stderr, "d%lld t%lld causal%d: plan built in %.0f ms\n", (long long)d, (long long)t,
                causal, (c1.tv_sec - c0.tv_sec) * 1e3 + (c1.tv_nsec - c0.tv_nsec) / 1e6);
        attn_plan_set_stream(plan, stream);
        size_t fw, bw;
        attn_plan_workspace_size(plan, &fw, &bw);
        size_t wsb = fw > bw ? fw : bw;
        void *ws = NULL;
        if (wsb) CU(cudaMalloc(&ws, wsb));
        size_t n = (size_t)(b * t * h * d);
        void *q = random_bf16(n, 1), *k = random_bf16(n, 2), *v = random_bf16(n, 3);
        void *dout = random_bf16(n, 4), *out, *dq, *dk, *dv, *lse;
        CU(cudaMalloc(&out, n * 2));
        CU(cudaMalloc(&dq, n * 2));
        CU(cudaMalloc(&dk, n * 2));
        CU(cudaMalloc(&dv, n * 2));
        CU(cudaMalloc(&lse, (size_t)(b * h * t) * 4));
        attn_inputs in;
        attn_inputs_init(&in);
        in.q = attn_tensor_dense(q), in.k = attn_tensor_dense(k), in.v = attn_tensor_dense(v);
        attn_outputs o;
        attn_outputs_init(&o);
        o.out = attn_tensor_dense(out), o.lse = attn_tensor_dense(lse);
        attn_grads g;
        attn_grads_init(&g);
        g.dq = attn_tensor_dense(dq), g.dk = attn_tensor_dense(dk), g.dv = attn_tensor_dense(dv);
        attn_tensor dt = attn_tensor_dense(dout);
        double flops = 4.0 * (double)b * (double)h * (double)t * (double)t * (double)d;
        if (causal) flops /= 2;
        for (int pass = 0; pass < 2; ++pass) {
          float ms[REPS];
          for (int r = 0; r < WARMUP + REPS; ++r) {
            CU(cudaEventRecord(e0, stream));
            attn_status s = pass == 0 ? attn_plan_forward(plan, &in, ws, wsb, &o)
                                      : attn_plan_backward(plan, &in, &o, &dt, ws, wsb, &g);
            CU(cudaEventRecord(e1, stream));
            if (s != ATTN_STATUS_OK) {
              fprintf(stderr, "run: %s\n", attn_ctx_last_error(ctx));
              return 1;
            }
            CU(cudaEventSynchronize(e1));
            if (r >= WARMUP) CU(cudaEventElapsedTime(&ms[r - WARMUP], e0, e1));
          }
          qsort(ms, REPS, sizeof ms[0], cmp_float);
          double med = ms[REPS / 2], f = pass == 0 ? flops : 2.5 * flops;
          printf("libattn-cudnn,%lld,%lld,%d,%s,%.4f,%.1f\n", (long long)d, (long long)t, causal,
                 pass == 0 ? "fwd" : "bwd", med, f / (med * 1e-3) / 1e12);
          fflush(stdout);
        }
        cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(dout), cudaFree(out), cudaFree(dq);
        cudaFree(dk), cudaFree(dv), cudaFree(lse), cudaFree(ws);
        attn_plan_destroy(plan);
      }
  attn_ctx_destroy(ctx);
  return 0;
}
