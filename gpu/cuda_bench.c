/*
 * gpu/cuda_bench.c - times the "cuda" implementation on the shapes (bf16, B * T = 16384
 * tokens, Hq * D = 2048): forward and backward, each timed in its own loop (as gpu/cuda_bench.py
 * times PyTorch), medians of CUDA-event timings after a warm-up;
 * a shape whose calls fail prints the error instead (the correctness proof is tests/test_cuda.c).
 *
 * usage: cuda_bench [reps] [config]   (config: "deterministic", the default, "atomic", "sm90" or
 * "sm90_deterministic") prints one CSV row per shape:
 *   cuda,<D>,<T>,<causal>,<fwd ms>,<bwd ms>,<fwd TFLOPS>,<bwd TFLOPS>
 * TFLOPS: forward 4 * B * Hq * T * T * D (halved when causal), backward 2.5x that.
 * Built and run by gpu/run.sh (not part of the CMake build: it needs a GPU to mean anything).
 */
#include "bench_common.h"

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 20;
  attn_ctx *ctx;
  attn_ctx_create(&ctx);
  static const int dims[] = {64, 128, 256}, lens[] = {512, 8192};
  cudaEvent_t e0, e1;
  BENCH_CUDA_CHECK(cudaEventCreate(&e0));
  BENCH_CUDA_CHECK(cudaEventCreate(&e1));
  for (int di = 0; di < 3; ++di)
    for (int ti = 0; ti < 2; ++ti)
      for (int causal = 0; causal < 2; ++causal) {
        int D = dims[di], T = lens[ti];
        attn_problem p = bench_problem(D, T, causal);
        attn_select sel;
        attn_select_init(&sel);
        sel.impl = "cuda";
        sel.config = argc > 2 ? argv[2] : NULL;
        attn_plan *plan;
        if (attn_plan_create(ctx, &p, &sel, &plan) != ATTN_STATUS_OK) {
          printf("cuda,%d,%d,%d,unsupported: %s\n", D, T, causal, attn_ctx_last_error(ctx));
          continue;
        }
        bench_buffers b = bench_buffers_create(plan, &p);
        float *tf = malloc(sizeof(float) * reps), *tb = malloc(sizeof(float) * reps);
        int ok = 1;
        /* the forward's calls, then the backward's (of the last forward's out and lse), each
         * after 3 warm-up calls: the way gpu/cuda_bench.py times PyTorch's backends */
        for (int it = -3; it < reps && ok; ++it) {
          BENCH_CUDA_CHECK(cudaEventRecord(e0, 0));
          ok &= attn_plan_forward(plan, &b.in, b.workspace, b.workspace_size, &b.out) ==
                ATTN_STATUS_OK;
          BENCH_CUDA_CHECK(cudaEventRecord(e1, 0));
          BENCH_CUDA_CHECK(cudaEventSynchronize(e1));
          if (it >= 0) BENCH_CUDA_CHECK(cudaEventElapsedTime(&tf[it], e0, e1));
        }
        for (int it = -3; it < reps && ok; ++it) {
          BENCH_CUDA_CHECK(cudaEventRecord(e0, 0));
          ok &= attn_plan_backward(plan, &b.in, &b.out, &b.dout, b.workspace, b.workspace_size,
                                   &b.grads) == ATTN_STATUS_OK;
          BENCH_CUDA_CHECK(cudaEventRecord(e1, 0));
          BENCH_CUDA_CHECK(cudaEventSynchronize(e1));
          if (it >= 0) BENCH_CUDA_CHECK(cudaEventElapsedTime(&tb[it], e0, e1));
        }
        if (!ok) {
          printf("cuda,%d,%d,%d,failed: %s\n", D, T, causal, attn_ctx_last_error(ctx));
        } else {
          double flops = bench_forward_flops(&p);
          double mf = bench_median(tf, reps), mb = bench_median(tb, reps);
          printf("cuda,%d,%d,%d,%.4f,%.4f,%.1f,%.1f\n", D, T, causal, mf, mb, flops / mf * 1e-9,
                 2.5 * flops / mb * 1e-9);
        }
        fflush(stdout);
        free(tf), free(tb);
        bench_buffers_destroy(&b);
        attn_plan_destroy(plan);
      }
  attn_ctx_destroy(ctx);
  return 0;
}
