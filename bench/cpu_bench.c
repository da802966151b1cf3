/*
 * bench/cpu_bench.c - the benchmark of the "cpu" implementation (issue 3): forward and backward
 * time, GFLOP/s and fraction of this machine's measured f32 FMA peak, at the thread counts asked,
 * after checking the same configuration against the f64 reference.
 *
 * usage: cpu_bench [--b N] [--hq N] [--hkv N] [--t N] [--d N] [--causal 0|1] [--dtype f32|bf16|f16]
 *                  [--threads LIST] [--reps N] [--impl NAME] [--config NAME] [--no-check]
 *                  [--csv] [--rss] [--peak]
 *   --threads 1,2   run at each count (attn_ctx_set_num_threads)
 *   --rss           run one forward and one backward pass and report the peak resident set against
 *                   the bytes of the inputs and outputs (the O(T) memory claim)
 *   --peak          only measure the f32 FMA peak: one thread alone, and at each --threads count
 *                   all threads at once (the %peak columns use one thread's times the count)
 *
 * Check: the reference runs in f64 and takes O(T^2 D) scalar work, so the check runs the same
 * configuration (heads, head dim, mask, dtype, impl, config) at T = min(T, 256) and Hq <= 2 groups,
 * with SPEC.md's tolerance (f32: 1e-4 * max(1, max|r|); f16/bf16: 2x (3x for gradients) the naive
 * same-dtype error + 1e-3 * max|r|, the naive error being the larger of the reference on the dtype's
 * problem rounding scores and P, and without that rounding). Timing: one warm-up, then the median of --reps runs.
 * FLOP: forward 4 * B * Hq * Tq * Tk * D, halved when causal; backward 2.5x the forward.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "core/dtype.h"
#include "impl/cpu/cpu.h"
#include "peak.h"
#include "plan/plan.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

typedef struct opts {
  int64_t b, hq, hkv, t, d;
  int causal;
  attn_dtype dtype;
  int threads[8], nthreads;
  int reps;
  const char *impl, *config;
  int check, csv, rss, peak;
} opts;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double rng_uniform(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) * 0x1p-53;
}

typedef struct buf {
  void *data;
  int64_t n;
  attn_dtype dt;
} buf;

static buf buf_new(attn_dtype dt, int64_t n, int fill) {
  buf b = {calloc((size_t)(n > 0 ? n : 1), attn_dtype_size(dt)), n, dt};
  if (b.data == NULL) {
    fprintf(stderr, "out of memory (%lld elements)\n", (long long)n);
    exit(2);
  }
  if (fill)
    for (int64_t i = 0; i < n; ++i) attn_store(b.data, dt, i, rng_uniform() * 2.0 - 1.0);
  return b;
}

static double buf_get(const buf *b, int64_t i) { return attn_load(b->data, b->dt, i); }

typedef struct problem_data {
  attn_problem p;
  buf q, k, v, dout, out, lse, dq, dk, dv;
} problem_data;

static problem_data make_data(const attn_problem *p) {
  problem_data x;
  x.p = *p;
  attn_dtype dt = (attn_dtype)p->dtype;
  int64_t nq = p->batch * p->seqlen_q * p->heads_q * p->head_dim;
  int64_t nk = p->batch * p->seqlen_k * p->heads_kv * p->head_dim;
  x.q = buf_new(dt, nq, 1), x.k = buf_new(dt, nk, 1), x.v = buf_new(dt, nk, 1);
  x.dout = buf_new(dt, nq, 1), x.out = buf_new(dt, nq, 0);
  x.lse = buf_new(dt == ATTN_DTYPE_F64 ? ATTN_DTYPE_F64 : ATTN_DTYPE_F32,
                  p->batch * p->heads_q * p->seqlen_q, 0);
  x.dq = buf_new(dt, nq, 0), x.dk = buf_new(dt, nk, 0), x.dv = buf_new(dt, nk, 0);
  return x;
}

static problem_data convert_data(const problem_data *src, attn_dtype dt) {
  attn_problem p = src->p;
  p.dtype = dt;
  problem_data x = make_data(&p);
  const buf *from[] = {&src->q, &src->k, &src->v, &src->dout};
  buf *to[] = {&x.q, &x.k, &x.v, &x.dout};
  for (int i = 0; i < 4; ++i)
    for (int64_t e = 0; e < from[i]->n; ++e) attn_store(to[i]->data, dt, e, buf_get(from[i], e));
  return x;
}

static void free_data(problem_data *x) {
  buf *all[] = {&x->q, &x->k, &x->v, &x->dout, &x->out, &x->lse, &x->dq, &x->dk, &x->dv};
  for (int i = 0; i < 9; ++i) free(all[i]->data);
}

static attn_tensor dense(const buf *b) { return attn_tensor_dense(b->data); }

static void io(problem_data *x, attn_inputs *in, attn_outputs *out, attn_grads *g) {
  attn_inputs_init(in);
  in->q = dense(&x->q), in->k = dense(&x->k), in->v = dense(&x->v);
  attn_outputs_init(out);
  out->out = dense(&x->out), out->lse = dense(&x->lse);
  attn_grads_init(g);
  g->dq = dense(&x->dq), g->dk = dense(&x->dk), g->dv = dense(&x->dv);
}

static int run_pass(attn_ctx *ctx, attn_plan *plan, problem_data *x, int backward) {
  attn_inputs in;
  attn_outputs out;
  attn_grads g;
  io(x, &in, &out, &g);
  attn_tensor dout = dense(&x->dout);
  attn_status st = backward ? attn_plan_backward(plan, &in, &out, &dout, NULL, 0, &g)
                            : attn_plan_forward(plan, &in, NULL, 0, &out);
  if (st != ATTN_STATUS_OK) {
    fprintf(stderr, "%s failed: %s\n", backward ? "backward" : "forward", attn_ctx_last_error(ctx));
    return 0;
  }
  return 1;
}

static attn_plan *make_plan(attn_ctx *ctx, const attn_problem *p, const char *impl,
                            const char *config) {
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = impl, sel.config = config;
  attn_plan *plan = NULL;
  if (attn_plan_create(ctx, p, &sel, &plan) != ATTN_STATUS_OK) {
    fprintf(stderr, "plan: %s\n", attn_ctx_last_error(ctx));
    exit(2);
  }
  return plan;
}

static double max_err(const buf *a, const buf *r, double *max_ref) {
  double e = 0.0, m = 0.0;
  for (int64_t i = 0; i < a->n; ++i) {
    double rv = buf_get(r, i), av = buf_get(a, i);
    if (isinf(rv) && av == rv) continue;
    double d = fabs(av - rv);
    if (!(d <= e)) e = d; /* NaN sticks */
    if (fabs(rv) > m) m = fabs(rv);
  }
  *max_ref = m;
  return e;
}

/* The check of the configuration at a size the reference computes in a second. */
static int check(attn_ctx *ctx, const opts *o, const attn_problem *full) {
  attn_problem p = *full;
  p.seqlen_q = p.seqlen_k = full->seqlen_q < 256 ? full->seqlen_q : 256;
  int64_t group = full->heads_q / full->heads_kv;
  p.heads_kv = 1;
  p.heads_q = group < 2 ? 2 : group;
  p.heads_kv = p.heads_q / group;
  attn_problem p64 = p;
  p64.dtype = ATTN_DTYPE_F64;
  problem_data ref = make_data(&p64);
  problem_data x = convert_data(&ref, (attn_dtype)p.dtype);
  /* the reference sees the rounded inputs */
  problem_data r = convert_data(&x, ATTN_DTYPE_F64);
  attn_plan *rp = make_plan(ctx, &p64, "ref", NULL);
  attn_plan *ip = make_plan(ctx, &p, o->impl, o->config);
  int ok = run_pass(ctx, rp, &r, 0) && run_pass(ctx, rp, &r, 1) && run_pass(ctx, ip, &x, 0) &&
           run_pass(ctx, ip, &x, 1);
  /* naive: the reference on the problem's dtype (outputs rounded to it) rounding scores and P;
   * at: the same without rounding inside, whose error (rounding the outputs) no implementation
   * avoids. The bound takes the larger, as tests/test_compare.c does. */
  problem_data naive, at;
  int low = p.dtype != ATTN_DTYPE_F32;
  if (low) {
    attn_plan *np = make_plan(ctx, &p, "ref", NULL);
    naive = convert_data(&x, (attn_dtype)p.dtype);
    at = convert_data(&x, (attn_dtype)p.dtype);
    ok = ok && run_pass(ctx, np, &at, 0) && run_pass(ctx, np, &at, 1);
    attn_plan_set_rounding(np, (attn_dtype)p.dtype);
    ok = ok && run_pass(ctx, np, &naive, 0) && run_pass(ctx, np, &naive, 1);
    attn_plan_destroy(np);
  }
  const char *names[] = {"out", "lse", "dq", "dk", "dv"};
  buf *a[] = {&x.out, &x.lse, &x.dq, &x.dk, &x.dv};
  buf *rr[] = {&r.out, &r.lse, &r.dq, &r.dk, &r.dv};
  char line[512];
  int used = 0;
  for (int i = 0; i < 5 && ok; ++i) {
    double mref, err = max_err(a[i], rr[i], &mref), tol;
    if (!low) {
      tol = 1e-4 * (mref > 1.0 ? mref : 1.0);
    } else {
      buf *nv[] = {&naive.out, &naive.lse, &naive.dq, &naive.dk, &naive.dv};
      buf *av[] = {&at.out, &at.lse, &at.dq, &at.dk, &at.dv};
      double m2, nerr = max_err(nv[i], rr[i], &m2), aerr = max_err(av[i], rr[i], &m2);
      if (aerr > nerr) nerr = aerr;
      tol = (i >= 2 ? 3.0 : 2.0) * nerr + 1e-3 * mref;
    }
    if (!(err <= tol)) ok = 0;
    used += snprintf(line + used, sizeof line - (size_t)used, " %s %.2e/%.2e", names[i], err, tol);
  }
  if (!o->csv)
    printf("check %s (T=%lld Hq=%lld): %s%s\n", attn_plan_impl_name(ip), (long long)p.seqlen_q,
           (long long)p.heads_q, ok ? "ok" : "FAILED", line);
  attn_plan_destroy(rp);
  attn_plan_destroy(ip);
  free_data(&ref), free_data(&x), free_data(&r);
  if (low) free_data(&naive), free_data(&at);
  return ok;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double time_pass(attn_ctx *ctx, attn_plan *plan, problem_data *x, int backward, int reps) {
  double t[64];
  if (reps > 64) reps = 64;
  run_pass(ctx, plan, x, backward); /* warm-up */
  for (int i = 0; i < reps; ++i) {
    double t0 = bench_now();
    if (!run_pass(ctx, plan, x, backward)) exit(1);
    t[i] = bench_now() - t0;
  }
  qsort(t, (size_t)reps, sizeof t[0], cmp_double);
  return t[reps / 2];
}

#ifdef ATTN_CPU_FWD_PHASES
/* A build with -DATTN_CPU_FWD_PHASES (cpu.h): where the forward's time went, as shares of the
 * threads' time in the parallel region and as TSC ticks per (query block, key block) product. */
static void print_fwd_phases(const char *desc, int threads, int runs) {
  static const char *const names[] = {"qk", "softmax", "pv", "q+out", "pack"};
  uint64_t ph[ATTN_CPU_PHASES];
  attn_cpu_fwd_phases(ph, 1);
  const double region = (double)ph[ATTN_CPU_PHASE_REGION];
  const double blocks = (double)ph[ATTN_CPU_PHASE_BLOCKS];
  if (region <= 0.0 || blocks <= 0.0) return;
  double other = region;
  printf("phases %s threads %d (%d runs, %.0f blocks/run):", desc, threads, runs, blocks / runs);
  for (int i = 0; i < 5; ++i) {
    other -= (double)ph[i];
    printf(" %s %.1f%% %.0f", names[i], 100.0 * (double)ph[i] / region, (double)ph[i] / blocks);
  }
  printf(" | waiting+loop %.1f%% %.0f (ticks per block)\n", 100.0 * other / region, other / blocks);
}
#endif

static long peak_rss_kib(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

int main(int argc, char **argv) {
  opts o = {1, 16, 16, 4096, 128, 0, ATTN_DTYPE_F32, {1, 2}, 2, 5, "cpu", NULL, 1, 0, 0, 0};
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(name) (strcmp(a, name) == 0 && v != NULL && ++i)
    if (OPT("--b")) o.b = atoll(v);
    else if (OPT("--hq")) o.hq = o.hkv = atoll(v);
    else if (OPT("--hkv")) o.hkv = atoll(v);
    else if (OPT("--t")) o.t = atoll(v);
    else if (OPT("--d")) o.d = atoll(v);
    else if (OPT("--causal")) o.causal = atoi(v);
    else if (OPT("--reps")) o.reps = atoi(v);
    else if (OPT("--impl")) o.impl = v;
    else if (OPT("--config")) o.config = v;
    else if (OPT("--dtype")) {
      o.dtype = strcmp(v, "bf16") == 0 ? ATTN_DTYPE_BF16 : strcmp(v, "f16") == 0 ? ATTN_DTYPE_F16
                                                                                 : ATTN_DTYPE_F32;
    } else if (OPT("--threads")) {
      o.nthreads = 0;
      for (const char *s = v; *s && o.nthreads < 8;) {
        o.threads[o.nthreads++] = atoi(s);
        while (*s && *s != ',') ++s;
        if (*s == ',') ++s;
      }
    } else if (strcmp(a, "--no-check") == 0) o.check = 0;
    else if (strcmp(a, "--csv") == 0) o.csv = 1;
    else if (strcmp(a, "--rss") == 0) o.rss = 1;
    else if (strcmp(a, "--peak") == 0) o.peak = 1;
    else {
      fprintf(stderr, "unknown or incomplete option %s (see the comment at the top of "
                      "bench/cpu_bench.c)\n", a);
      return 2;
    }
#undef OPT
  }
  if (o.peak) {
    bench_peak one = bench_measure_peak(0.5);
    printf("peak %s, 1 thread: %.1f GFLOP/s\n", one.isa, one.gflops);
    for (int ti = 0; ti < o.nthreads; ++ti) {
      bench_peak all = bench_measure_peak_threads(o.threads[ti], 1.0);
      printf("peak %s, %d threads at once: %.1f GFLOP/s = %.2f x %d x one thread\n", all.isa,
             o.threads[ti], all.gflops, all.gflops / (one.gflops * o.threads[ti]), o.threads[ti]);
    }
    return 0;
  }
  attn_ctx *ctx;
  attn_ctx_create(&ctx);
  attn_problem p;
  attn_problem_init(&p);
  p.dtype = o.dtype;
  p.batch = o.b, p.seqlen_q = p.seqlen_k = o.t, p.heads_q = o.hq, p.heads_kv = o.hkv;
  p.head_dim = o.d, p.causal = o.causal;
  char desc[160];
  snprintf(desc, sizeof desc, "b%lld hq%lld hkv%lld sq%lld sk%lld d%lld %s%s", (long long)o.b,
           (long long)o.hq, (long long)o.hkv, (long long)o.t, (long long)o.t, (long long)o.d,
           attn_dtype_name(o.dtype), o.causal ? " causal" : "");

  if (o.check && !check(ctx, &o, &p)) return 1;

  if (o.rss) {
    attn_ctx_set_num_threads(ctx, o.threads[0]);
    long before = peak_rss_kib();
    problem_data x = make_data(&p);
    attn_plan *plan = make_plan(ctx, &p, o.impl, o.config);
    double t0 = bench_now();
    int ok = run_pass(ctx, plan, &x, 0);
    double t1 = bench_now();
    ok = ok && run_pass(ctx, plan, &x, 1);
    double t2 = bench_now();
    size_t es = attn_dtype_size(o.dtype);
    double io_bytes = (double)(x.q.n * 3 + x.k.n * 4 + x.dout.n) * (double)es + (double)x.lse.n * 4;
    double rss = (double)peak_rss_kib() * 1024.0;
    printf("rss %s threads %d: fwd %.2f s, bwd %.2f s, peak RSS %.1f MiB (at start %.1f MiB), "
           "inputs+outputs %.1f MiB, ratio %.3f%s\n",
           desc, o.threads[0], t1 - t0, t2 - t1, rss / 1048576.0, (double)before / 1024.0,
           io_bytes / 1048576.0, rss / io_bytes, ok ? "" : " (FAILED)");
    attn_plan_destroy(plan);
    free_data(&x);
    attn_ctx_destroy(ctx);
    return ok ? 0 : 1;
  }

  bench_peak peak = bench_measure_peak(0.5);
  double fwd_flop = 4.0 * (double)(o.b * o.hq) * (double)o.t * (double)o.t * (double)o.d;
  if (o.causal) fwd_flop *= 0.5;
  double bwd_flop = 2.5 * fwd_flop;
  if (!o.csv)
    printf("machine peak (1 thread, %s): %.1f GFLOP/s\n", peak.isa, peak.gflops);
  problem_data x = make_data(&p);
  for (int ti = 0; ti < o.nthreads; ++ti) {
    int th = o.threads[ti];
    attn_ctx_set_num_threads(ctx, th);
    attn_plan *plan = make_plan(ctx, &p, o.impl, o.config);
#ifdef ATTN_CPU_FWD_PHASES
    uint64_t ph[ATTN_CPU_PHASES];
    attn_cpu_fwd_phases(ph, 1);
#endif
    double tf = time_pass(ctx, plan, &x, 0, o.reps);
#ifdef ATTN_CPU_FWD_PHASES
    print_fwd_phases(desc, th, o.reps + 1);
#endif
    double tb = time_pass(ctx, plan, &x, 1, o.reps);
    double pk = peak.gflops * th;
    /* the configuration, and for "cpu" the kernel table that ran it (cpuid, ATTN_CPU_ISA) */
    char cfg[96];
    snprintf(cfg, sizeof cfg, "%s%s%s", attn_plan_config_name(plan),
             strcmp(attn_plan_impl_name(plan), "cpu") == 0 ? "@" : "",
             strcmp(attn_plan_impl_name(plan), "cpu") == 0 ? attn_cpu_isa_name(o.dtype) : "");
    if (o.csv)
      printf("libattn,%s,%s,%d,%.6f,%.6f,%.2f,%.2f,%.4f,%.4f,%.2f\n", desc, cfg, th, tf, tb, fwd_flop / tf * 1e-9, bwd_flop / tb * 1e-9,
             fwd_flop / tf * 1e-9 / pk, bwd_flop / tb * 1e-9 / pk, pk);
    else
      printf("%s %s %s threads %d: fwd %8.2f ms %7.1f GFLOP/s %5.1f%% | bwd %8.2f ms %7.1f GFLOP/s "
             "%5.1f%%\n",
             desc, attn_plan_impl_name(plan), cfg, th, tf * 1e3,
             fwd_flop / tf * 1e-9, 100.0 * fwd_flop / tf * 1e-9 / pk, tb * 1e3,
             bwd_flop / tb * 1e-9, 100.0 * bwd_flop / tb * 1e-9 / pk);
    fflush(stdout);
    attn_plan_destroy(plan);
  }
  free_data(&x);
  attn_ctx_destroy(ctx);
  return 0;
}
