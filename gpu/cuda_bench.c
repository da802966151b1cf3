/*
 * gpu/cuda_bench.c - times the "cuda" implementation on the shapes (bf16, B * T = 16384
 * tokens, Hq * D = 2048): forward and backward, medians of CUDA-event timings after a warm-up,
 * checked first (finite outputs; the correctness proof is tests/test_cuda.c).
 *
 * usage: cuda_bench [reps] [config]   (config: "deterministic", the default, or "atomic") prints
 * one CSV row per shape:
 *   cuda,<D>,<T>,<causal>,<fwd ms>,<bwd ms>,<fwd TFLOPS>,<bwd TFLOPS>
 * TFLOPS: forward 4 * B * Hq * T * T * D (halved when causal), backward 2.5x that.
 * Built and run by gpu/cuda_run.sh (not part of the CMake build: it needs a GPU to mean anything).
 */
#include "attn.h"

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CU(expr)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (expr);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(e_));                                  \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static void *dev_random(size_t n, unsigned *state) {
  uint16_t *h = malloc(n * 2);
  for (size_t i = 0; i < n; ++i) { /* bf16 in [-1, 1): sign, exponent 120..126, random mantissa */
    *state = *state * 1664525u + 1013904223u;
    unsigned r = *state >> 8;
    h[i] = (uint16_t)(((r & 1) << 15) | ((120 + (r >> 1) % 7) << 7) | ((r >> 4) & 0x7f));
  }
  void *d;
  CU(cudaMalloc(&d, n * 2));
  CU(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
  free(h);
  return d;
}

static int cmp(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 20;
  attn_ctx *ctx;
  attn_ctx_create(&ctx);
  static const int dims[] = {64, 128, 256}, lens[] = {512, 8192};
  unsigned state = 12345;
  for (int di = 0; di < 3; ++di)
    for (int ti = 0; ti < 2; ++ti)
      for (int causal = 0; causal < 2; ++causal) {
        int D = dims[di], T = lens[ti], B = 16384 / T, H = 2048 / D;
        attn_problem p;
        attn_problem_init(&p);
        p.dtype = ATTN_DTYPE_BF16, p.device = ATTN_DEVICE_CUDA;
        p.batch = B, p.seqlen_q = p.seqlen_k = T, p.heads_q = p.heads_kv = H, p.head_dim = D;
        p.causal = causal;
        attn_select sel;
        attn_select_init(&sel);
        sel.impl = "cuda";
        sel.config = argc > 2 ? argv[2] : NULL;
        attn_plan *plan;
        if (attn_plan_create(ctx, &p, &sel, &plan) != ATTN_STATUS_OK) {
          printf("cuda,%d,%d,%d,unsupported: %s\n", D, T, causal, attn_ctx_last_error(ctx));
          continue;
        }
        size_t n = (size_t)B * T * H * D, fw, bw;
        attn_plan_workspace_size(plan, &fw, &bw);
        void *ws = NULL;
        if (bw > 0) CU(cudaMalloc(&ws, bw));
        void *q = dev_random(n, &state), *k = dev_random(n, &state), *v = dev_random(n, &state);
        void *dout = dev_random(n, &state), *out, *dq, *dk, *dv, *lse;
        CU(cudaMalloc(&out, n * 2));
        CU(cudaMalloc(&dq, n * 2));
        CU(cudaMalloc(&dk, n * 2));
        CU(cudaMalloc(&dv, n * 2));
        CU(cudaMalloc(&lse, (size_t)B * H * T * 4));
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
        cudaEvent_t e0, e1;
        CU(cudaEventCreate(&e0));
        CU(cudaEventCreate(&e1));
        float *tf = malloc(sizeof(float) * reps), *tb = malloc(sizeof(float) * reps);
        int ok = 1;
        for (int it = -3; it < reps && ok; ++it) {
          CU(cudaEventRecord(e0, 0));
          ok &= attn_plan_forward(plan, &in, ws, bw, &o) == ATTN_STATUS_OK;
          CU(cudaEventRecord(e1, 0));
          CU(cudaEventSynchronize(e1));
          if (it >= 0) CU(cudaEventElapsedTime(&tf[it], e0, e1));
          CU(cudaEventRecord(e0, 0));
          ok &= attn_plan_backward(plan, &in, &o, &dt, ws, bw, &g) == ATTN_STATUS_OK;
          CU(cudaEventRecord(e1, 0));
          CU(cudaEventSynchronize(e1));
          if (it >= 0) CU(cudaEventElapsedTime(&tb[it], e0, e1));
        }
        if (!ok) {
          printf("cuda,%d,%d,%d,failed: %s\n", D, T, causal, attn_ctx_last_error(ctx));
        } else {
          qsort(tf, (size_t)reps, sizeof(float), cmp), qsort(tb, (size_t)reps, sizeof(float), cmp);
          double flops = 4.0 * B * H * (double)T * T * D * (causal ? 0.5 : 1.0);
          double mf = tf[reps / 2], mb = tb[reps / 2];
          printf("cuda,%d,%d,%d,%.4f,%.4f,%.1f,%.1f\n", D, T, causal, mf, mb, flops / mf * 1e-9,
                 2.5 * flops / mb * 1e-9);
        }
        fflush(stdout);
        free(tf), free(tb);
        cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(dout), cudaFree(out), cudaFree(dq);
        cudaFree(dk), cudaFree(dv), cudaFree(lse);
        if (ws) cudaFree(ws);
        attn_plan_destroy(plan);
      }
  attn_ctx_destroy(ctx);
  return 0;
}
