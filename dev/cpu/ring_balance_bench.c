/*
 * dev/cpu/ring_balance_bench.c - every rank's blocks of a causal zigzag ring, one process: what
 * each rank's steps cost on the "cpu" implementation, forward and backward, beside the whole
 * problem on the same threads, to find why the ranks' block times differ (issue 12: on the 16-core
 * host rank 2's blocks took 17% longer than rank 1's though their scores are equal).
 *
 * Rank r of n holds global chunks r and 2n-1-r (length L each). Its step s sees the slice of rank
 * src = r - s mod n as one block over the hull of the visible pairs of chunks, placed at global
 * positions (attn_positions), as src/dist/ring.c runs it: its own slice (2L x 2L, three of four
 * pairs visible), src < r (both query chunks against key chunk src: 2L x L) or src > r (query
 * chunk 2n-1-r against both key chunks: L x 2L). Each block runs REPS times after a warm-up,
 * rank by rank interleaved, median; "whole/n" is the whole problem (n L x 2 rows, causal) on the
 * same threads over n, the time a rank would take if splitting cost nothing.
 *
 * Not part of the build:
 *   cmake --build build --target attn_static
 *   gcc -O2 -std=c11 -Iinclude -Isrc dev/cpu/ring_balance_bench.c build/libattn.a -lm -fopenmp
 *   ./a.out [n=4] [L=1024] [dtype=bf16|f32] [reps=3] [threads=1] [hq=32] [hkv=8] [causal|noncausal]
 *           [whole_threads=threads]
 * The whole problem also runs on whole_threads (the one rank of issue 12's table: 16 on the
 * 16-core host), which says how much of a rank's time against the one rank is the threads' scaling
 * rather than the ring's blocks.
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

#define D 128
#define MAX_N 8

static attn_ctx *ctx, *ctx_whole; /* the blocks' threads; the whole problem's */
static int64_t L, HQ, HKV;
static int n, threads, causal = 1;
static attn_dtype dt;
static void *q, *k, *v, *out, *dout, *part, *dq, *dk, *dv;
static float *lse;

/* A step's block: query chunk slots [a0, a0 + na) of the rank against key chunk slots [c0, c0 +
 * nc) of the slice of rank src. */
typedef struct block {
  int r, src, a0, na, c0, nc;
  attn_plan *plan;
} block;

static int64_t chunk_global(int rank, int slot) { return slot == 0 ? rank : 2 * n - 1 - rank; }

/* The hull of step s's visible pairs, as ring.c's step_blocks makes it (causal, equal chunks). */
static block step_block(int r, int s) {
  block b = {r, ((r - s) % n + n) % n, 2, 0, 0, 0, NULL};
  int a_lo = 2, a_hi = -1, c_lo = 2, c_hi = -1;
  for (int a = 0; a < 2; ++a)
    for (int c = 0; c < 2; ++c)
      if (!causal || chunk_global(r, a) >= chunk_global(b.src, c)) {
        a_lo = a < a_lo ? a : a_lo, a_hi = a > a_hi ? a : a_hi;
        c_lo = c < c_lo ? c : c_lo, c_hi = c > c_hi ? c : c_hi;
      }
  b.a0 = a_lo, b.na = a_hi - a_lo + 1, b.c0 = c_lo, b.nc = c_hi - c_lo + 1;
  return b;
}

static attn_plan *make_plan(attn_ctx *on, int64_t tq, int64_t tk) {
  attn_problem p;
  attn_problem_init(&p);
  p.dtype = dt, p.batch = 1, p.heads_q = HQ, p.heads_kv = HKV, p.head_dim = D;
  p.seqlen_q = tq, p.seqlen_k = tk, p.causal = causal;
  attn_select s;
  attn_select_init(&s);
  s.impl = "cpu";
  attn_plan *plan;
  if (attn_plan_create(on, &p, &s, &plan) != ATTN_STATUS_OK) {
    fprintf(stderr, "plan: %s\n", attn_ctx_last_error(ctx));
    exit(1);
  }
  return plan;
}

static void place(block *b) {
  b->plan = make_plan(ctx, b->na * L, b->nc * L);
  attn_positions pos;
  memset(&pos, 0, sizeof pos);
  pos.rows.pieces = b->na, pos.cols.pieces = b->nc, pos.has_offset = 1, pos.partial = 1;
  for (int a = 0; a < b->na; ++a)
    pos.rows.start[a] = a * L, pos.rows.global[a] = chunk_global(b->r, b->a0 + a) * L;
  for (int c = 0; c < b->nc; ++c)
    pos.cols.start[c] = c * L, pos.cols.global[c] = chunk_global(b->src, b->c0 + c) * L;
  if (attn_plan_set_positions(b->plan, &pos) != ATTN_STATUS_OK) {
    fprintf(stderr, "positions: %s\n", attn_ctx_last_error(ctx));
    exit(1);
  }
}

/* A [1, T, H, W] view of base from row0, elements of es bytes. */
static attn_tensor view(void *base, size_t es, int64_t row0, int64_t H, int64_t T) {
  attn_tensor t = attn_tensor_dense((char *)base + (size_t)(row0 * H * D) * es);
  t.stride[0] = T * H * D, t.stride[1] = H * D, t.stride[2] = D, t.stride[3] = 1;
  return t;
}

/* Runs plan over query rows from q_row0 and keys from k_row0 of buffers of T rows; partial
 * results (f32) when the plan has positions. */
static void run(attn_plan *plan, int64_t T, int64_t q_row0, int64_t k_row0, int partial,
                int backward) {
  const size_t es = attn_dtype_size(dt), rs = partial ? sizeof(float) : es;
  attn_inputs in;
  attn_inputs_init(&in);
  in.q = view(q, es, q_row0, HQ, T);
  in.k = view(k, es, k_row0, HKV, T), in.v = view(v, es, k_row0, HKV, T);
  attn_outputs o;
  attn_outputs_init(&o);
  o.out = view(backward ? out : part, backward ? es : rs, q_row0, HQ, T);
  o.lse = attn_tensor_dense(lse + q_row0);
  o.lse.stride[0] = HQ * T, o.lse.stride[1] = T, o.lse.stride[2] = 1;
  attn_status st;
  if (!backward) {
    st = attn_plan_forward(plan, &in, NULL, 0, &o);
  } else {
    attn_tensor d = view(dout, es, q_row0, HQ, T);
    attn_grads g;
    attn_grads_init(&g);
    g.dq = view(dq, rs, q_row0, HQ, T);
    g.dk = view(dk, rs, k_row0, HKV, T), g.dv = view(dv, rs, k_row0, HKV, T);
    st = attn_plan_backward(plan, &in, &o, &d, NULL, 0, &g);
  }
  if (st != ATTN_STATUS_OK) {
    fprintf(stderr, "run: %s\n", attn_ctx_last_error(ctx));
    exit(1);
  }
}

/* One rank's block: its rows and keys are slots of the 2L local rows (the slice's keys in the
 * same buffers: the values do not matter for the time). */
static void run_block(const block *b, int backward) {
  run(b->plan, 2 * L, b->a0 * L, b->c0 * L, 1, backward);
}

int main(int argc, char **argv) {
  n = argc > 1 ? atoi(argv[1]) : 4;
  L = argc > 2 ? atoll(argv[2]) : 1024;
  dt = argc > 3 && strcmp(argv[3], "f32") == 0 ? ATTN_DTYPE_F32 : ATTN_DTYPE_BF16;
  const int reps = argc > 4 ? atoi(argv[4]) : 3;
  threads = argc > 5 ? atoi(argv[5]) : 1;
  HQ = argc > 6 ? atoll(argv[6]) : 32;
  HKV = argc > 7 ? atoll(argv[7]) : 8;
  causal = !(argc > 8 && strcmp(argv[8], "noncausal") == 0);
  const int whole_threads = argc > 9 ? atoi(argv[9]) : threads;
  if (n < 2 || n > MAX_N || L < 1 || reps < 1 || threads < 1) return 2;
  attn_ctx_create(&ctx);
  attn_ctx_set_num_threads(ctx, threads);
  attn_ctx_create(&ctx_whole);
  attn_ctx_set_num_threads(ctx_whole, whole_threads);
  const int64_t T = 2 * n * L; /* the whole problem's rows; buffers hold it */
  const size_t big = (size_t)(T * HQ * D) * sizeof(float);
  void **bufs[] = {&q, &k, &v, &out, &dout, &part, &dq, &dk, &dv};
  for (int i = 0; i < 9; ++i) {
    *bufs[i] = calloc(big, 1);
    if (*bufs[i] == NULL) return 1;
  }
  srand(1);
  for (size_t e = 0; e < (size_t)(T * HQ * D); ++e) { /* small values, as a model's */
    const float x = (float)(rand() % 2001 - 1000) * 1e-3f;
    void *in[] = {q, k, v, out, dout};
    for (int i = 0; i < 5; ++i)
      if (dt == ATTN_DTYPE_F32) {
        ((float *)in[i])[e] = x;
      } else {
        uint32_t u;
        memcpy(&u, &x, 4);
        ((uint16_t *)in[i])[e] = (uint16_t)(u >> 16);
      }
  }
  lse = calloc((size_t)(HQ * T), sizeof(float));
  for (int64_t e = 0; e < HQ * T; ++e) lse[e] = 8.0f;

  block blocks[MAX_N][MAX_N];
  for (int r = 0; r < n; ++r)
    for (int s = 0; s < n; ++s) {
      blocks[r][s] = step_block(r, s);
      place(&blocks[r][s]);
    }
  attn_plan *whole = make_plan(ctx, T, T), *whole_more = make_plan(ctx_whole, T, T);
  printf("%s zigzag, %d ranks, L=%lld, b1 hq%lld hkv%lld d%d, cpu (%s), %s, %d threads, "
         "median of %d\n",
         causal ? "causal" : "non-causal", n, (long long)L, (long long)HQ, (long long)HKV, D,
         attn_cpu_isa_name(dt), attn_dtype_name(dt), threads, reps);
  double *t = malloc(sizeof(double) * (size_t)reps * (size_t)(n * n + 2) * 2);
#define T_AT(r, s, bw, i) t[(((size_t)(r)*n + (s)) * 2 + (bw)) * reps + (i)]
  for (int i = -1; i < reps; ++i) /* i = -1: warm-up */
    for (int bw = 0; bw < 2; ++bw) {
      for (int s = 0; s < n; ++s)
        for (int r = 0; r < n; ++r) {
          const double t0 = dev_now();
          run_block(&blocks[r][s], bw);
          if (i >= 0) T_AT(r, s, bw, i) = dev_now() - t0;
        }
      double t0 = dev_now();
      run(whole, T, 0, 0, 0, bw);
      if (i >= 0) T_AT(n, 0, bw, i) = dev_now() - t0;
      t0 = dev_now();
      run(whole_more, T, 0, 0, 0, bw);
      if (i >= 0) T_AT(n, 1, bw, i) = dev_now() - t0;
    }
  const double whole_f = dev_median(&T_AT(n, 0, 0, 0), reps),
               whole_b = dev_median(&T_AT(n, 0, 1, 0), reps);
  const double more_f = dev_median(&T_AT(n, 1, 0, 0), reps),
               more_b = dev_median(&T_AT(n, 1, 1, 0), reps);
  printf("whole problem, %d threads: forward %.1f ms, backward %.1f ms; whole/%d: %.1f + %.1f = "
         "%.1f ms\n",
         threads, 1e3 * whole_f, 1e3 * whole_b, n, 1e3 * whole_f / n, 1e3 * whole_b / n,
         1e3 * (whole_f + whole_b) / n);
  printf("whole problem, %d threads: forward %.1f ms, backward %.1f ms; x %d / %d: %.1f ms "
         "(%d-thread efficiency against %d: %.3f)\n",
         whole_threads, 1e3 * more_f, 1e3 * more_b, whole_threads, n * threads,
         1e3 * (more_f + more_b) * whole_threads / (n * threads), whole_threads, threads,
         (whole_f + whole_b) * threads / ((more_f + more_b) * whole_threads));
  printf("rank | step: shape fwd/bwd ms ... | blocks fwd + bwd = total | total / (whole/%d)\n", n);
  for (int r = 0; r < n; ++r) {
    double sf = 0, sb = 0;
    printf("%d |", r);
    for (int s = 0; s < n; ++s) {
      const block *b = &blocks[r][s];
      const double f = dev_median(&T_AT(r, s, 0, 0), reps),
                   bk = dev_median(&T_AT(r, s, 1, 0), reps);
      sf += f, sb += bk;
      printf(" %d: %dx%d %.1f/%.1f |", s, b->na, b->nc, 1e3 * f, 1e3 * bk);
    }
    printf(" %.1f + %.1f = %.1f | %.3f\n", 1e3 * sf, 1e3 * sb, 1e3 * (sf + sb),
           (sf + sb) / ((whole_f + whole_b) / n));
  }
  return 0;
}
