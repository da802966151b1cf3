/*
 * gpu/bench_cudnn.c - times the "cudnn" implementation on the shapes of bench/RESULTS.md's cuDNN
 * section: bf16, B * T = 16384 tokens, Hq * D = 2048, D in {128, 64}, T in {512, 8192}, causal or
 * not, forward (with lse) and backward. Each measurement: the plan is made (its build time printed,
 * with the time of a second plan of the same problem, whose graphs come from the cache), 5 warm-up
 * calls, then 30 calls each timed with CUDA events; the median is reported.
 * Inputs are random (never zeros). Built and run by gpu/run.sh; prints CSV rows:
 *   impl,d,t,causal,pass,ms,tflops
 */
#define _POSIX_C_SOURCE 199309L /* clock_gettime, which -std=c11 alone does not declare */
#include "bench_common.h"

#include <time.h>

#define WARMUP 5
#define REPS 30

int main(void) {
  attn_ctx *ctx;
  attn_ctx_create(&ctx);
  const int64_t dims[2] = {128, 64}, lens[2] = {512, 8192};
  cudaStream_t stream;
  BENCH_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaEvent_t e0, e1;
  BENCH_CUDA_CHECK(cudaEventCreate(&e0));
  BENCH_CUDA_CHECK(cudaEventCreate(&e1));
  printf("impl,d,t,causal,pass,ms,tflops\n");
  for (int di = 0; di < 2; ++di)
    for (int ti = 0; ti < 2; ++ti)
      for (int causal = 0; causal < 2; ++causal) {
        int64_t d = dims[di], t = lens[ti];
        attn_problem p = bench_problem(d, t, causal);
        attn_select sel;
        attn_select_init(&sel);
        sel.impl = "cudnn";
        struct timespec c0, c1, c2;
        clock_gettime(CLOCK_MONOTONIC, &c0);
        attn_plan *plan;
        if (attn_plan_create(ctx, &p, &sel, &plan) != ATTN_STATUS_OK) {
          fprintf(stderr, "plan: %s\n", attn_ctx_last_error(ctx));
          return 1;
        }
        clock_gettime(CLOCK_MONOTONIC, &c1);
        /* A second plan of the same problem takes its graphs from the process-wide cache
         * (src/impl/cudnn/cudnn_cache.c): its time is what a new plan of a known shape costs. */
        attn_plan *again;
        if (attn_plan_create(ctx, &p, &sel, &again) != ATTN_STATUS_OK) {
          fprintf(stderr, "plan: %s\n", attn_ctx_last_error(ctx));
          return 1;
        }
        clock_gettime(CLOCK_MONOTONIC, &c2);
        attn_plan_destroy(again);
        fprintf(stderr,
                "d%lld t%lld causal%d: plan built in %.1f ms, a second plan of it in %.3f ms\n",
                (long long)d, (long long)t, causal,
                (c1.tv_sec - c0.tv_sec) * 1e3 + (c1.tv_nsec - c0.tv_nsec) / 1e6,
                (c2.tv_sec - c1.tv_sec) * 1e3 + (c2.tv_nsec - c1.tv_nsec) / 1e6);
        attn_plan_set_stream(plan, stream);
        bench_buffers b = bench_buffers_create(plan, &p);
        double flops = bench_forward_flops(&p);
        for (int pass = 0; pass < 2; ++pass) {
          float ms[REPS];
          for (int r = 0; r < WARMUP + REPS; ++r) {
            BENCH_CUDA_CHECK(cudaEventRecord(e0, stream));
            attn_status s =
                pass == 0 ? attn_plan_forward(plan, &b.in, b.workspace, b.workspace_size, &b.out)
                          : attn_plan_backward(plan, &b.in, &b.out, &b.dout, b.workspace,
                                               b.workspace_size, &b.grads);
            BENCH_CUDA_CHECK(cudaEventRecord(e1, stream));
            if (s != ATTN_STATUS_OK) {
              fprintf(stderr, "run: %s\n", attn_ctx_last_error(ctx));
              return 1;
            }
            BENCH_CUDA_CHECK(cudaEventSynchronize(e1));
            if (r >= WARMUP) BENCH_CUDA_CHECK(cudaEventElapsedTime(&ms[r - WARMUP], e0, e1));
          }
          double med = bench_median(ms, REPS), f = pass == 0 ? flops : 2.5 * flops;
          printf("libattn-cudnn,%lld,%lld,%d,%s,%.4f,%.1f\n", (long long)d, (long long)t, causal,
                 pass == 0 ? "fwd" : "bwd", med, f / (med * 1e-3) / 1e12);
          fflush(stdout);
        }
        bench_buffers_destroy(&b);
        attn_plan_destroy(plan);
      }
  attn_ctx_destroy(ctx);
  return 0;
}
