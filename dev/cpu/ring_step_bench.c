/*
 * dev/cpu/ring_step_bench.c - what a zigzag ring step's blocks cost as separate plan calls (one
 * per visible pair of chunks, as src/dist/ring.c ran them before) against one call over the same
 * rows and keys placed in pieces (attn_positions, as it runs them now), on the "cpu"
 * implementation, forward and backward, in one process: the two are interleaved and each time is
 * the median of REPS, so a machine shared with other work shows their ratio even where it cannot
 * show absolute rates. Rank 0 of 2 (global chunks 0 and 3 of length L): step 0 sees its own slice
 * (three visible pairs: two diagonal, one full), step 1 the slice of rank 1 (chunks 1 and 2: only
 * chunk 3 of the queries sees them, both fully). Not part of the build:
 *   cmake -S . -B /tmp/cpubuild -DCMAKE_BUILD_TYPE=Release -DATTN_WITH_CUDA=OFF -DATTN_WITH_CUDNN=OFF
 *   cmake --build /tmp/cpubuild --target attn_static
 *   gcc -O2 -std=c11 -Iinclude -Isrc dev/cpu/ring_step_bench.c /tmp/cpubuild/libattn.a -lm -fopenmp
 *   OMP_NUM_THREADS=2 ./a.out [L=1024] [dtype=bf16|f32] [reps=7]
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "impl/cpu/cpu.h"
#include "impl/impl.h"
#include "plan/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dev_timing.h"

#define HQ 8
#define HKV 2
#define D 128

static attn_ctx *ctx;
static int64_t L;
static attn_dtype dt;

/* A block of query chunks rq[0..nr) against key chunks kc[0..nc) (global chunk numbers), its
 * tensors views of the local buffers (rows of chunk slot a at a * L). */
typedef struct block {
  int nr, nc, rq[2], kc[2], qslot, kslot;
  attn_plan *plan;
} block;

static void *q, *k, *v, *out, *dout, *dq, *dk, *dv;
static float *lse;

static attn_tensor view(void *base, int64_t row0, int64_t H, int64_t W, int64_t T) {
  attn_tensor t = attn_tensor_dense((char *)base + (size_t)(row0 * H * W) * attn_dtype_size(dt));
  t.stride[0] = T * H * W, t.stride[1] = H * W, t.stride[2] = W, t.stride[3] = 1;
  return t;
}

static void make(block *b) {
  attn_problem p;
  attn_problem_init(&p);
  p.dtype = dt, p.batch = 1, p.heads_q = HQ, p.heads_kv = HKV, p.head_dim = D;
  p.seqlen_q = b->nr * L, p.seqlen_k = b->nc * L, p.causal = 1;
  attn_select s;
  attn_select_init(&s);
  s.impl = "cpu";
  if (attn_plan_create(ctx, &p, &s, &b->plan) != ATTN_STATUS_OK) {
    fprintf(stderr, "plan: %s\n", attn_ctx_last_error(ctx));
    exit(1);
  }
  attn_positions pos;
  memset(&pos, 0, sizeof pos);
  pos.rows.pieces = b->nr, pos.cols.pieces = b->nc, pos.has_offset = 1;
  for (int a = 0; a < b->nr; ++a) pos.rows.start[a] = a * L, pos.rows.global[a] = b->rq[a] * L;
  for (int c = 0; c < b->nc; ++c) pos.cols.start[c] = c * L, pos.cols.global[c] = b->kc[c] * L;
  attn_plan_set_positions(b->plan, &pos);
}

static void run(const block *b, int backward) {
  const int64_t T = 2 * L; /* local rows and keys: two chunks each */
  attn_inputs in;
  attn_inputs_init(&in);
  in.q = view(q, b->qslot * L, HQ, D, T);
  in.k = view(k, b->kslot * L, HKV, D, T), in.v = view(v, b->kslot * L, HKV, D, T);
  attn_outputs o;
  attn_outputs_init(&o);
  o.out = view(out, b->qslot * L, HQ, D, T);
  o.lse = attn_tensor_dense(lse + b->qslot * L);
  o.lse.stride[0] = HQ * T, o.lse.stride[1] = T, o.lse.stride[2] = 1;
  attn_status st;
  if (!backward) {
    st = attn_plan_forward(b->plan, &in, NULL, 0, &o);
  } else {
    attn_tensor d = view(dout, b->qslot * L, HQ, D, T);
    attn_grads g;
    attn_grads_init(&g);
    g.dq = view(dq, b->qslot * L, HQ, D, T);
    g.dk = view(dk, b->kslot * L, HKV, D, T), g.dv = view(dv, b->kslot * L, HKV, D, T);
    st = attn_plan_backward(b->plan, &in, &o, &d, NULL, 0, &g);
  }
  if (st != ATTN_STATUS_OK) {
    fprintf(stderr, "run: %s\n", attn_ctx_last_error(ctx));
    exit(1);
  }
}

int main(int argc, char **argv) {
  L = argc > 1 ? atoll(argv[1]) : 1024;
  dt = argc > 2 && strcmp(argv[2], "f32") == 0 ? ATTN_DTYPE_F32 : ATTN_DTYPE_BF16;
  const int reps = argc > 3 ? atoi(argv[3]) : 7;
  attn_ctx_create(&ctx);
  const size_t es = attn_dtype_size(dt), n = (size_t)(2 * L * HQ * D);
  void **bufs[] = {&q, &k, &v, &out, &dout, &dq, &dk, &dv};
  for (int i = 0; i < 8; ++i) {
    *bufs[i] = calloc(n, es);
    for (size_t e = 0; e < n; ++e) /* small values: bf16 0x3c00.. or f32 0.01 .. */
      if (dt == ATTN_DTYPE_F32)
        ((float *)*bufs[i])[e] = (float)((e * 7919 % 101) - 50) * 1e-3f;
      else
        ((unsigned short *)*bufs[i])[e] = (unsigned short)(0x3c00 + e * 7919 % 97);
  }
  lse = calloc((size_t)(HQ * 2 * L), sizeof(float));
  /* step 0: chunks {0, 3} against {0, 3}; step 1: against rank 1's {1, 2} */
  block split0[3] = {
      {1, 1, {0}, {0}, 0, 0, NULL}, {1, 1, {3}, {0}, 1, 0, NULL}, {1, 1, {3}, {3}, 1, 1, NULL}};
  block split1[2] = {{1, 1, {3}, {1}, 1, 0, NULL}, {1, 1, {3}, {2}, 1, 1, NULL}};
  block merged0 = {2, 2, {0, 3}, {0, 3}, 0, 0, NULL}, merged1 = {1, 2, {3}, {1, 2}, 1, 0, NULL};
  for (int i = 0; i < 3; ++i) make(&split0[i]);
  for (int i = 0; i < 2; ++i) make(&split1[i]);
  make(&merged0), make(&merged1);
  printf("zigzag step blocks, cpu (%s), %s, L=%lld, hq%d hkv%d d%d, median of %d\n",
         attn_cpu_isa_name(dt), attn_dtype_name(dt), (long long)L, HQ, HKV, D, reps);
  for (int backward = 0; backward < 2; ++backward) {
    double *ts[4];
    for (int i = 0; i < 4; ++i) ts[i] = malloc((size_t)reps * sizeof(double));
    for (int r = -1; r < reps; ++r) { /* r = -1: warm-up */
      double t0 = dev_now();
      for (int i = 0; i < 3; ++i) run(&split0[i], backward);
      double t1 = dev_now();
      run(&merged0, backward);
      double t2 = dev_now();
      for (int i = 0; i < 2; ++i) run(&split1[i], backward);
      double t3 = dev_now();
      run(&merged1, backward);
      double t4 = dev_now();
      if (r < 0) continue;
      ts[0][r] = t1 - t0, ts[1][r] = t2 - t1, ts[2][r] = t3 - t2, ts[3][r] = t4 - t3;
    }
    double m[4];
    for (int i = 0; i < 4; ++i) m[i] = dev_median(ts[i], reps);
    printf("%s step 0 (diagonal): 3 calls %.2f ms, one call %.2f ms (%.2fx); step 1: 2 calls %.2f "
           "ms, one call %.2f ms (%.2fx)\n",
           backward ? "backward" : "forward ", 1e3 * m[0], 1e3 * m[1], m[0] / m[1], 1e3 * m[2],
           1e3 * m[3], m[2] / m[3]);
    for (int i = 0; i < 4; ++i) free(ts[i]);
  }
  return 0;
}
