/*
 * dev/cpu/features_bench.c - what each feature costs the "cpu" implementation over a plain problem:
 * one forward and one backward pass (after a warm-up forward) on one thread, B=1 T=2048 Hq=Hkv=4
 * D=64 f32, each feature alone. Not part of the build; link a CPU-only build of libattn.a:
 *   cmake -S . -B /tmp/cpubuild -DCMAKE_BUILD_TYPE=Release -DATTN_WITH_CUDA=OFF -DATTN_WITH_CUDNN=OFF
 *   cmake --build /tmp/cpubuild --target attn_static
 *   gcc -O2 -std=c11 -Iinclude dev/cpu/features_bench.c /tmp/cpubuild/libattn.a -lm -fopenmp
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "dev_timing.h"

#define T 2048
#define H 4
#define D 64

static float *filled(size_t n, int mod, float step) {
  float *x = malloc(n * sizeof *x);
  for (size_t i = 0; i < n; ++i) x[i] = (float)(i % (size_t)mod) * step;
  return x;
}

int main(void) {
  static const char *names[] = {"plain", "softcap", "alibi", "dropout", "bias-bcast", "mask-bcast",
                                "window"};
  attn_ctx *ctx;
  attn_ctx_create(&ctx);
  attn_ctx_set_num_threads(ctx, 1);
  const size_t n = (size_t)T * H * D;
  float *q = filled(n, 13, 0.01f), *k = filled(n, 7, 0.01f), *v = filled(n, 5, 0.1f);
  float *dout_data = filled(n, 3, 0.1f), *o = filled(n, 1, 0.0f), *dq = filled(n, 1, 0.0f);
  float *dk = filled(n, 1, 0.0f), *dv = filled(n, 1, 0.0f), *lse = filled((size_t)T * H, 1, 0.0f);
  float *bias = filled((size_t)T * T, 1, 0.0f);
  unsigned char *mask = malloc((size_t)T * T);
  for (size_t i = 0; i < (size_t)T * T; ++i) mask[i] = 1;
  float slopes[H] = {0.1f, 0.2f, 0.3f, 0.4f};
  for (int f = 0; f < 7; ++f) {
    attn_problem p;
    attn_problem_init(&p);
    p.batch = 1, p.seqlen_q = p.seqlen_k = T, p.heads_q = p.heads_kv = H, p.head_dim = D;
    if (f == 1) p.softcap = 30.0;
    if (f == 2) p.alibi = ATTN_ALIBI_PER_HEAD;
    if (f == 3) p.dropout_p = 0.1;
    if (f == 4) {
      p.has_bias = 1, p.bias_dtype = ATTN_DTYPE_F32;
      p.bias_shape[0] = 1, p.bias_shape[1] = 1, p.bias_shape[2] = T, p.bias_shape[3] = T;
    }
    if (f == 5) {
      p.has_mask = 1;
      p.mask_shape[0] = 1, p.mask_shape[1] = 1, p.mask_shape[2] = T, p.mask_shape[3] = T;
    }
    if (f == 6) p.window_left = 256, p.window_right = 0;
    attn_inputs in;
    attn_inputs_init(&in);
    in.q = attn_tensor_dense(q), in.k = attn_tensor_dense(k), in.v = attn_tensor_dense(v);
    in.bias = attn_tensor_dense(bias), in.mask = attn_tensor_dense(mask);
    in.alibi_slopes = attn_tensor_dense(slopes);
    attn_outputs out;
    attn_outputs_init(&out);
    out.out = attn_tensor_dense(o), out.lse = attn_tensor_dense(lse);
    attn_grads g;
    attn_grads_init(&g);
    g.dq = attn_tensor_dense(dq), g.dk = attn_tensor_dense(dk), g.dv = attn_tensor_dense(dv);
    attn_tensor dout = attn_tensor_dense(dout_data);
    attn_select sel;
    attn_select_init(&sel);
    sel.impl = "cpu";
    attn_plan *plan;
    if (attn_plan_create(ctx, &p, &sel, &plan) != ATTN_STATUS_OK) {
      printf("%s\n", attn_ctx_last_error(ctx));
      return 1;
    }
    attn_plan_forward(plan, &in, NULL, 0, &out);
    double t0 = dev_now();
    attn_plan_forward(plan, &in, NULL, 0, &out);
    double t1 = dev_now();
    attn_plan_backward(plan, &in, &out, &dout, NULL, 0, &g);
    double t2 = dev_now();
    printf("%-11s fwd %7.1f ms bwd %7.1f ms\n", names[f], (t1 - t0) * 1e3, (t2 - t1) * 1e3);
    attn_plan_destroy(plan);
  }
  attn_ctx_destroy(ctx);
  return 0;
}
