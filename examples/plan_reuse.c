/*
 * examples/plan_reuse.c - a training-style loop: one plan made once and reused for the forward and
 * backward passes of several steps, with one workspace for both passes; bf16 causal grouped-query
 * attention on tensors in PyTorch's [B, H, T, D] layout, passed by strides without copies.
 *
 * Each step checks two facts that hold for any exact attention, so the program says whether the
 * results are right without a reference: every output lies within the range of the values it
 * averages, and since each row of probabilities sums to 1, the gradient of v summed over the keys
 * equals dout summed over the queries of the heads that share the kv head. Compiled and run by the
 * tests (ctest -R example_plan_reuse). The same code runs on a GPU with p.device = ATTN_DEVICE_CUDA
 * and the buffers (workspace included) in device memory.
 */
#include <attn.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { B = 2, HQ = 8, HKV = 2, T = 33, D = 64, STEPS = 3 };

/* Strides of PyTorch's contiguous [B, H, T, D] in the library's [B, T, H, D] order. */
static attn_tensor bhtd(uint16_t *data, int64_t heads) {
  attn_tensor t = attn_tensor_dense(data);
  t.stride[0] = heads * T * D; /* b */
  t.stride[1] = D;             /* t */
  t.stride[2] = T * D;         /* h */
  t.stride[3] = 1;             /* d */
  return t;
}

static float at(const uint16_t *x, int64_t heads, int64_t b, int64_t h, int64_t t, int64_t d) {
  return attn_bf16_to_f32(x[((b * heads + h) * T + t) * D + d]); /* [B, H, T, D] */
}

static uint32_t rng_state = 12345;

static void fill_random(uint16_t *x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    rng_state = rng_state * 1664525u + 1013904223u;
    x[i] = attn_f32_to_bf16((float)(rng_state >> 8) / 8388608.0f - 1.0f); /* [-1, 1) */
  }
}

static uint16_t *new_tensor(const attn_problem *p, attn_role role) {
  return malloc((size_t)attn_problem_numel(p, role) * sizeof(uint16_t));
}

/* Whether each out[b, h, :, d] lies within the range of v[b, kv head of h, :, d]. */
static int out_within_v(const uint16_t *out, const uint16_t *v) {
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < HQ; ++h)
      for (int d = 0; d < D; ++d) {
        float lo = INFINITY, hi = -INFINITY;
        for (int t = 0; t < T; ++t) {
          float x = at(v, HKV, b, h / (HQ / HKV), t, d);
          lo = x < lo ? x : lo, hi = x > hi ? x : hi;
        }
        float slack = 0.01f * (fabsf(lo) + fabsf(hi)); /* bf16 rounding of out */
        for (int t = 0; t < T; ++t) {
          float o = at(out, HQ, b, h, t, d);
          if (o < lo - slack || o > hi + slack) return 0;
        }
      }
  return 1;
}

/* Whether sum over keys of dv[b, g, :, d] equals the sum of dout[b, h, :, d] over the heads h of
 * group g, within bf16 rounding. */
static int dv_sums_match(const uint16_t *dv, const uint16_t *dout) {
  for (int b = 0; b < B; ++b)
    for (int g = 0; g < HKV; ++g)
      for (int d = 0; d < D; ++d) {
        double sum_dv = 0, sum_dout = 0, magnitude = 0;
        for (int t = 0; t < T; ++t) sum_dv += at(dv, HKV, b, g, t, d);
        for (int h = g * (HQ / HKV); h < (g + 1) * (HQ / HKV); ++h)
          for (int t = 0; t < T; ++t) {
            sum_dout += at(dout, HQ, b, h, t, d);
            magnitude += fabs(at(dout, HQ, b, h, t, d));
          }
        if (fabs(sum_dv - sum_dout) > 0.01 * magnitude + 1e-3) return 0;
      }
  return 1;
}

int main(void) {
  attn_ctx *ctx;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) return 1;
  attn_problem p;
  attn_problem_init(&p);
  p.dtype = ATTN_DTYPE_BF16;
  p.batch = B, p.seqlen_q = T, p.seqlen_k = T, p.heads_q = HQ, p.heads_kv = HKV, p.head_dim = D;
  p.causal = 1;

  /* The plan: made once, for every step. */
  attn_plan *plan;
  if (attn_plan_create(ctx, &p, NULL, &plan) != ATTN_STATUS_OK) {
    printf("attn_plan_create: %s\n", attn_ctx_last_error(ctx));
    return 1;
  }
  /* One workspace for both passes: the larger of the two sizes. */
  size_t forward_bytes, backward_bytes;
  attn_plan_workspace_size(plan, &forward_bytes, &backward_bytes);
  size_t workspace_size = forward_bytes > backward_bytes ? forward_bytes : backward_bytes;
  void *workspace = malloc(workspace_size > 0 ? workspace_size : 1);

  /* Buffers sized by the library; bf16 is uint16_t, lse stays f32. */
  uint16_t *q = new_tensor(&p, ATTN_ROLE_Q), *k = new_tensor(&p, ATTN_ROLE_K);
  uint16_t *v = new_tensor(&p, ATTN_ROLE_V), *out = new_tensor(&p, ATTN_ROLE_OUT);
  uint16_t *dout = new_tensor(&p, ATTN_ROLE_DOUT), *dq = new_tensor(&p, ATTN_ROLE_DQ);
  uint16_t *dk = new_tensor(&p, ATTN_ROLE_DK), *dv = new_tensor(&p, ATTN_ROLE_DV);
  float *lse = malloc((size_t)attn_problem_numel(&p, ATTN_ROLE_LSE) * sizeof(float));

  attn_inputs in;
  attn_inputs_init(&in);
  in.q = bhtd(q, HQ), in.k = bhtd(k, HKV), in.v = bhtd(v, HKV);
  attn_outputs fwd;
  attn_outputs_init(&fwd);
  fwd.out = bhtd(out, HQ);
  fwd.lse = attn_tensor_dense(lse); /* [B, HQ, T], as PyTorch's */
  attn_tensor dout_t = bhtd(dout, HQ);
  attn_grads grads;
  attn_grads_init(&grads);
  grads.dq = bhtd(dq, HQ), grads.dk = bhtd(dk, HKV), grads.dv = bhtd(dv, HKV);

  printf("plan: %s/%s, one workspace of %zu bytes for both passes\n", attn_plan_impl_name(plan),
         attn_plan_config_name(plan), workspace_size);
  int passed = 0;
  for (int step = 1; step <= STEPS; ++step) {
    fill_random(q, attn_problem_numel(&p, ATTN_ROLE_Q));
    fill_random(k, attn_problem_numel(&p, ATTN_ROLE_K));
    fill_random(v, attn_problem_numel(&p, ATTN_ROLE_V));
    fill_random(dout, attn_problem_numel(&p, ATTN_ROLE_DOUT));
    attn_status s = attn_plan_forward(plan, &in, workspace, workspace_size, &fwd);
    if (s == ATTN_STATUS_OK)
      s = attn_plan_backward(plan, &in, &fwd, &dout_t, workspace, workspace_size, &grads);
    if (s != ATTN_STATUS_OK) {
      printf("step %d: %s\n", step, attn_ctx_last_error(ctx));
      break;
    }
    int range_ok = out_within_v(out, v), sums_ok = dv_sums_match(dv, dout);
    printf("step %d: out within the range of v: %s; sum of dv = sum of dout per kv head: %s\n",
           step, range_ok ? "yes" : "NO", sums_ok ? "yes" : "NO");
    passed += range_ok && sums_ok;
  }
  printf("%d of %d steps passed\n", passed, STEPS);

  free(q), free(k), free(v), free(out), free(dout), free(dq), free(dk), free(dv), free(lse);
  free(workspace);
  attn_plan_destroy(plan);
  attn_ctx_destroy(ctx);
  return passed == STEPS ? 0 : 1;
}
