/*
 * dev/cpu/bwd_bits.c - the "cpu" backward of each problem given: a hash of dq, dk and dv (to see
 * that a change leaves every result bit as it was: run one thread, since with more the order in
 * which key blocks add into dq varies from run to run) and the backward's CPU time per call
 * (CLOCK_PROCESS_CPUTIME_ID: every thread's time, none spent descheduled, which on the shared
 * 2-core build VM repeats where wall time moves 2x), median and min of N calls after a warm-up.
 * Inputs are seeded uniform [-1, 1); the forward runs once first. Not part of the build; from a
 * CPU-only build folder B (cmake -DATTN_WITH_CUDA=OFF -DATTN_WITH_CUDNN=OFF):
 *   gcc -O2 -std=c11 -Iinclude dev/cpu/bwd_bits.c -LB -lattn -Wl,-rpath,B -o /tmp/bwd_bits
 *   /tmp/bwd_bits [--threads N] [--reps N] [--config NAME] "b1 hq2 sq300 d64 bf16 causal" ...
 * Used for bench/RESULTS.md "The backward's repeated row conversions" (old and new builds).
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int by_value(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* A dense tensor of the role, seeded uniform [-1, 1) in the problem's dtype (lse: f32). */
static attn_tensor new_tensor(const attn_problem *p, attn_role role, uint32_t seed) {
  const int64_t n = attn_problem_numel(p, role);
  const int f32 = role == ATTN_ROLE_LSE || p->dtype == ATTN_DTYPE_F32;
  unsigned char *x = malloc((size_t)n * (f32 ? 4 : 2) + 4);
  uint32_t s = seed;
  for (int64_t i = 0; x != NULL && i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    const float v = (float)(s >> 8) / 8388608.0f - 1.0f;
    if (f32) ((float *)x)[i] = v;
    else if (p->dtype == ATTN_DTYPE_BF16) ((uint16_t *)x)[i] = attn_f32_to_bf16(v);
    else ((uint16_t *)x)[i] = attn_f32_to_f16(v);
  }
  return attn_tensor_dense(x);
}

static uint64_t fnv1a(const attn_problem *p, attn_role role, const attn_tensor *t, uint64_t h) {
  const size_t bytes = (size_t)attn_problem_numel(p, role) * attn_dtype_size((attn_dtype)p->dtype);
  const unsigned char *b = t->data;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

static int run_problem(attn_ctx *ctx, const char *text, const char *config, int reps) {
  attn_problem p;
  if (attn_problem_parse(ctx, text, &p) != ATTN_STATUS_OK) {
    printf("%s: %s\n", text, attn_ctx_last_error(ctx));
    return 1;
  }
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = "cpu", sel.config = config;
  attn_plan *plan = NULL;
  if (attn_plan_create(ctx, &p, &sel, &plan) != ATTN_STATUS_OK) {
    printf("%s: %s\n", text, attn_ctx_last_error(ctx));
    return 1;
  }
  size_t fwd_bytes, bwd_bytes;
  attn_plan_workspace_size(plan, &fwd_bytes, &bwd_bytes);
  const size_t ws_bytes = fwd_bytes > bwd_bytes ? fwd_bytes : bwd_bytes;
  void *ws = malloc(ws_bytes > 0 ? ws_bytes : 1);
  attn_inputs in;
  attn_inputs_init(&in);
  in.q = new_tensor(&p, ATTN_ROLE_Q, 1), in.k = new_tensor(&p, ATTN_ROLE_K, 2);
  in.v = new_tensor(&p, ATTN_ROLE_V, 3);
  in.dropout_seed = 42;
  attn_outputs out;
  attn_outputs_init(&out);
  out.out = new_tensor(&p, ATTN_ROLE_OUT, 4), out.lse = new_tensor(&p, ATTN_ROLE_LSE, 5);
  attn_tensor dout = new_tensor(&p, ATTN_ROLE_DOUT, 6);
  attn_grads g;
  attn_grads_init(&g);
  g.dq = new_tensor(&p, ATTN_ROLE_DQ, 7), g.dk = new_tensor(&p, ATTN_ROLE_DK, 8);
  g.dv = new_tensor(&p, ATTN_ROLE_DV, 9);
  double *times = malloc((size_t)reps * sizeof(double));
  attn_status st = attn_plan_forward(plan, &in, ws, ws_bytes, &out);
  if (st == ATTN_STATUS_OK) st = attn_plan_backward(plan, &in, &out, &dout, ws, ws_bytes, &g);
  for (int r = 0; st == ATTN_STATUS_OK && r < reps; ++r) {
    const double t0 = cpu_seconds();
    st = attn_plan_backward(plan, &in, &out, &dout, ws, ws_bytes, &g);
    times[r] = cpu_seconds() - t0;
  }
  int failed = st != ATTN_STATUS_OK;
  if (failed) {
    printf("%s: %s\n", text, attn_ctx_last_error(ctx));
  } else {
    uint64_t h = 1469598103934665603ull;
    h = fnv1a(&p, ATTN_ROLE_DQ, &g.dq, h);
    h = fnv1a(&p, ATTN_ROLE_DK, &g.dk, h);
    h = fnv1a(&p, ATTN_ROLE_DV, &g.dv, h);
    qsort(times, (size_t)reps, sizeof times[0], by_value);
    printf("%s | %s | hash %016llx | backward CPU ms median %.2f min %.2f | workspace %zu\n", text,
           attn_plan_config_name(plan), (unsigned long long)h, 1e3 * times[reps / 2],
           1e3 * times[0], bwd_bytes);
  }
  free(in.q.data), free(in.k.data), free(in.v.data), free(out.out.data), free(out.lse.data);
  free(dout.data), free(g.dq.data), free(g.dk.data), free(g.dv.data), free(times), free(ws);
  attn_plan_destroy(plan);
  return failed;
}

int main(int argc, char **argv) {
  attn_ctx *ctx = NULL;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) return 3;
  int threads = 1, reps = 5, failed = 0;
  const char *config = NULL;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) config = argv[++i];
    else {
      if (reps < 1) reps = 1;
      attn_ctx_set_num_threads(ctx, threads);
      failed |= run_problem(ctx, argv[i], config, reps);
    }
  }
  attn_ctx_destroy(ctx);
  return failed;
}
