/*
 * bench/attn_bench.c - the CPU benchmark: every registered CPU implementation on a small table of
 * problems, checked against the f64 reference before it is timed. `make bench` runs it.
 *
 * For each problem and implementation:
 *   1. check: run it once and compare out and lse (dq, dk, dv for the backward pass) with the
 *      reference implementation run in f64 on the same inputs, by the tolerance rule of SPEC.md:
 *      f32: max|a - r| <= 1e-4 * max(1, max|r|); f16/bf16: max|a - r| <= k * err(naive) + 1e-3 *
 *      max|r| with k = 2 (3 for gradients), naive = the reference at the problem's dtype rounding
 *      scores and P to it. An implementation that fails is reported and not timed, and the
 *      program exits 1.
 *   2. time: the check run doubles as the warm-up; then repeat until both --reps runs and
 *      --min-time seconds are done, and report the median.
 *   3. rate: FLOP = 4 * B * Hq * Tq * Tk * D for the forward pass (FlashAttention's convention: two
 *      matrix products of 2 FLOP per multiply-add), halved when causal; with a window, the visible
 *      (i, j) pairs are counted instead of Tq * Tk. The backward pass counts 2.5x the forward.
 *      The fraction of peak divides by this machine's f32 FMA rate, measured at start-up on one
 *      thread, times the threads the implementation is given (--threads).
 *
 * Inputs are drawn from a fixed seed (--seed) and rounded to the problem's dtype, and the same
 * rounded values feed the reference, so the error seen is the implementation's own.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "core/dtype.h"
#include "peak.h"
#include "plan/plan.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- options --------------------------------------------------------------------------------- */

typedef struct options {
  int quick;         /* smaller problems, fewer repetitions: a smoke run */
  int reps;          /* at least this many timed runs */
  double min_time;   /* and at least this many seconds of them */
  int threads;       /* attn_ctx_set_num_threads; the peak is scaled by it */
  int csv;           /* machine-readable rows instead of the table */
  const char *impl;  /* only this implementation; NULL = every CPU implementation */
  const char *match; /* only problems whose description contains this; NULL = all */
  uint64_t seed;
} options;

static void usage(FILE *f) {
  fprintf(f, "usage: attn_bench [--quick] [--reps N] [--min-time S] [--threads N] [--csv]\n"
             "                  [--impl NAME] [--match TEXT] [--seed N]\n"
             "  --quick       smaller problems and fewer repetitions (a smoke run)\n"
             "  --reps N      at least N timed runs per problem (default 5; --quick 3)\n"
             "  --min-time S  and at least S seconds of them (default 1; --quick 0.1)\n"
             "  --threads N   threads given to each implementation (default 1); the peak is\n"
             "                the one-thread FMA peak times N\n"
             "  --csv         print comma-separated rows instead of the table\n"
             "  --impl NAME   only this implementation (attn_impl_name)\n"
             "  --match TEXT  only problems whose description contains TEXT, e.g. \"bwd\"\n"
             "  --seed N      seed of the random inputs (default 1)\n");
}

static int parse_int(const char *s, int lo, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end != '\0' || v < lo || v > 1000000) return 0;
  *out = (int)v;
  return 1;
}

static int parse_options(int argc, char **argv, options *o) {
  memset(o, 0, sizeof *o);
  o->reps = -1, o->min_time = -1.0, o->threads = 1, o->seed = 1;
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--quick") == 0) {
      o->quick = 1;
    } else if (strcmp(a, "--csv") == 0) {
      o->csv = 1;
    } else if (strcmp(a, "--reps") == 0 && next && parse_int(next, 1, &o->reps)) {
      ++i;
    } else if (strcmp(a, "--threads") == 0 && next && parse_int(next, 1, &o->threads)) {
      ++i;
    } else if (strcmp(a, "--min-time") == 0 && next) {
      char *end;
      o->min_time = strtod(next, &end);
      if (*end != '\0' || !(o->min_time >= 0.0)) return 0;
      ++i;
    } else if (strcmp(a, "--impl") == 0 && next) {
      o->impl = next, ++i;
    } else if (strcmp(a, "--match") == 0 && next) {
      o->match = next, ++i;
    } else if (strcmp(a, "--seed") == 0 && next) {
      o->seed = strtoull(next, NULL, 10), ++i;
    } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      exit(0);
    } else {
      fprintf(stderr, "attn_bench: unknown or incomplete option \"%s\"\n", a);
      return 0;
    }
  }
  if (o->reps < 0) o->reps = o->quick ? 3 : 5;
  if (o->min_time < 0.0) o->min_time = o->quick ? 0.1 : 1.0;
  return 1;
}

/* ---- the problems ---------------------------------------------------------------------------- */

/* One row of the table. The sizes are modest on purpose: the reference accumulates in f64 one
 * element at a time and is checked against itself in f64, and the default run must stay around a
 * minute on a two-core machine. --quick divides the sequence length by 4. */
typedef struct bench_case {
  int backward;
  attn_dtype dtype;
  int64_t heads_q, heads_kv, seqlen, head_dim;
  int causal;
  int64_t window_left; /* -1 = none */
} bench_case;

static const bench_case cases[] = {
    {0, ATTN_DTYPE_F32, 8, 8, 512, 64, 0, -1},  /* the plain problem */
    {0, ATTN_DTYPE_F32, 8, 8, 512, 64, 1, -1},  /* causal */
    {0, ATTN_DTYPE_F32, 8, 2, 512, 64, 1, -1},  /* grouped-query: 4 query heads per kv head */
    {0, ATTN_DTYPE_BF16, 8, 8, 512, 64, 1, -1}, /* bf16 inputs, f32 accumulation */
    {0, ATTN_DTYPE_F16, 8, 8, 512, 64, 1, -1},  /* f16 inputs */
    {0, ATTN_DTYPE_F32, 8, 8, 512, 64, 1, 127}, /* sliding window of 128 keys */
    {1, ATTN_DTYPE_F32, 8, 8, 512, 64, 1, -1},  /* backward: dq, dk, dv */
    {1, ATTN_DTYPE_BF16, 8, 2, 512, 64, 1, -1}, /* backward, bf16, grouped-query */
};
#define NUM_CASES ((int)(sizeof cases / sizeof cases[0]))

static attn_problem make_problem(const bench_case *c, int quick, attn_dtype dtype) {
  attn_problem p;
  attn_problem_init(&p);
  p.dtype = dtype;
  p.batch = 1;
  p.heads_q = c->heads_q, p.heads_kv = c->heads_kv;
  p.seqlen_q = p.seqlen_k = quick ? c->seqlen / 4 : c->seqlen;
  p.head_dim = c->head_dim;
  p.causal = c->causal;
  if (c->window_left >= 0) p.window_left = c->window_left, p.window_right = 0;
  return p;
}

/* The problem string of STYLE.md: "fwd b1 hq8 hkv8 sq512 sk512 d64 f32 causal". */
static void describe(const bench_case *c, const attn_problem *p, char *buf, size_t size) {
  int n = snprintf(buf, size, "%s b%lld hq%lld hkv%lld sq%lld sk%lld d%lld %s",
                   c->backward ? "bwd" : "fwd", (long long)p->batch, (long long)p->heads_q,
                   (long long)p->heads_kv, (long long)p->seqlen_q, (long long)p->seqlen_k,
                   (long long)p->head_dim, attn_dtype_name((attn_dtype)p->dtype));
  if (n > 0 && (size_t)n < size && p->causal) n += snprintf(buf + n, size - (size_t)n, " causal");
  if (n > 0 && (size_t)n < size && p->window_left >= 0)
    snprintf(buf + n, size - (size_t)n, " window%lld,%lld", (long long)p->window_left,
             (long long)(p->window_right < 0 ? 0 : p->window_right));
}

/* FLOP of one pass, by the convention in the header comment. */
static double flop_count(const bench_case *c, const attn_problem *p) {
  double pairs = (double)p->seqlen_q * (double)p->seqlen_k;
  if (p->window_left >= 0 || p->window_right >= 0) {
    /* Bottom-right alignment, o = Tk - Tq: row i sees i + o - left <= j <= i + o + right. */
    int64_t o = p->seqlen_k - p->seqlen_q;
    int64_t right = p->causal ? 0 : p->window_right;
    pairs = 0.0;
    for (int64_t i = 0; i < p->seqlen_q; ++i) {
      int64_t lo = p->window_left < 0 ? 0 : i + o - p->window_left;
      int64_t hi = right < 0 ? p->seqlen_k - 1 : i + o + right;
      if (lo < 0) lo = 0;
      if (hi > p->seqlen_k - 1) hi = p->seqlen_k - 1;
      if (hi >= lo) pairs += (double)(hi - lo + 1);
    }
  } else if (p->causal) {
    pairs *= 0.5;
  }
  double forward = 4.0 * (double)p->batch * (double)p->heads_q * pairs * (double)p->head_dim;
  return c->backward ? 2.5 * forward : forward;
}

/* ---- buffers --------------------------------------------------------------------------------- */

typedef struct buf {
  void *data;
  attn_dtype dtype;
  int64_t n;
} buf;

static buf buf_new(attn_dtype dtype, int64_t n) {
  buf b = {calloc((size_t)(n > 0 ? n : 1), attn_dtype_size(dtype)), dtype, n};
  if (b.data == NULL) {
    fprintf(stderr, "attn_bench: out of memory\n");
    exit(2);
  }
  return b;
}

static void buf_free(buf *b) {
  free(b->data);
  b->data = NULL;
}

/* A copy of values (f64) in dtype; values must already be representable. */
static buf buf_from(const double *values, int64_t n, attn_dtype dtype) {
  buf b = buf_new(dtype, n);
  for (int64_t i = 0; i < n; ++i) attn_store(b.data, dtype, i, values[i]);
  return b;
}

/* splitmix64: a fixed, portable stream, so every run of the benchmark sees the same inputs. */
static double uniform(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (double)(z >> 11) * 0x1p-53 * 2.0 - 1.0; /* [-1, 1) */
}

static double *random_values(uint64_t *state, int64_t n, attn_dtype dtype) {
  double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
  if (v == NULL) {
    fprintf(stderr, "attn_bench: out of memory\n");
    exit(2);
  }
  for (int64_t i = 0; i < n; ++i) v[i] = attn_round_to(dtype, uniform(state));
  return v;
}

/* The tensors of one run in one dtype: inputs, forward outputs, gradients. */
typedef struct tensors {
  buf q, k, v, dout, out, lse, dq, dk, dv;
} tensors;

static int64_t numel4(int64_t a, int64_t b, int64_t c, int64_t d) { return a * b * c * d; }

static tensors tensors_make(const attn_problem *p, const double *q, const double *k,
                            const double *v, const double *dout) {
  attn_dtype dt = (attn_dtype)p->dtype, stat = attn_stat_dtype(dt);
  int64_t nq = numel4(p->batch, p->seqlen_q, p->heads_q, p->head_dim);
  int64_t nk = numel4(p->batch, p->seqlen_k, p->heads_kv, p->head_dim);
  tensors t;
  t.q = buf_from(q, nq, dt), t.k = buf_from(k, nk, dt), t.v = buf_from(v, nk, dt);
  t.dout = buf_from(dout, nq, dt);
  t.out = buf_new(dt, nq), t.lse = buf_new(stat, p->batch * p->heads_q * p->seqlen_q);
  t.dq = buf_new(dt, nq), t.dk = buf_new(dt, nk), t.dv = buf_new(dt, nk);
  return t;
}

static void tensors_free(tensors *t) {
  buf *all[] = {&t->q, &t->k, &t->v, &t->dout, &t->out, &t->lse, &t->dq, &t->dk, &t->dv};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) buf_free(all[i]);
}

/* ---- running a plan -------------------------------------------------------------------------- */

typedef struct runner {
  attn_plan *plan;
  attn_inputs in;
  attn_outputs fwd;
  attn_tensor dout;
  attn_grads grads;
  void *workspace;
  size_t workspace_size;
  int backward;
} runner;

/* A plan of implementation `impl` for p over the tensors t. Prints the reason and returns 0 when
 * the plan cannot be made. */
static int runner_make(attn_ctx *ctx, const attn_problem *p, const char *impl, int backward,
                       tensors *t, attn_dtype rounding, runner *r) {
  memset(r, 0, sizeof *r);
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = impl;
  if (attn_plan_create(ctx, p, &sel, &r->plan) != ATTN_STATUS_OK) return 0;
  attn_plan_set_rounding(r->plan, rounding);
  size_t fwd_bytes = 0, bwd_bytes = 0;
  attn_plan_workspace_size(r->plan, &fwd_bytes, &bwd_bytes);
  r->workspace_size = fwd_bytes > bwd_bytes ? fwd_bytes : bwd_bytes;
  if (r->workspace_size > 0 && (r->workspace = malloc(r->workspace_size)) == NULL) {
    fprintf(stderr, "attn_bench: out of memory for %zu bytes of workspace\n", r->workspace_size);
    exit(2);
  }
  attn_inputs_init(&r->in);
  r->in.q = attn_tensor_dense(t->q.data), r->in.k = attn_tensor_dense(t->k.data);
  r->in.v = attn_tensor_dense(t->v.data);
  attn_outputs_init(&r->fwd);
  r->fwd.out = attn_tensor_dense(t->out.data), r->fwd.lse = attn_tensor_dense(t->lse.data);
  r->dout = attn_tensor_dense(t->dout.data);
  attn_grads_init(&r->grads);
  r->grads.dq = attn_tensor_dense(t->dq.data), r->grads.dk = attn_tensor_dense(t->dk.data);
  r->grads.dv = attn_tensor_dense(t->dv.data);
  r->backward = backward;
  return 1;
}

static void runner_free(runner *r) {
  attn_plan_destroy(r->plan);
  free(r->workspace);
}

static attn_status run_forward(runner *r) {
  return attn_plan_forward(r->plan, &r->in, r->workspace, r->workspace_size, &r->fwd);
}

/* The timed pass: forward, or backward from the out and lse already in the tensors. */
static attn_status run_pass(runner *r) {
  if (!r->backward) return run_forward(r);
  return attn_plan_backward(r->plan, &r->in, &r->fwd, &r->dout, r->workspace, r->workspace_size,
                            &r->grads);
}

/* Everything a check needs: forward, then (for the backward pass) backward. */
static attn_status run_all(runner *r) {
  attn_status s = run_forward(r);
  return s == ATTN_STATUS_OK && r->backward ? run_pass(r) : s;
}

/* ---- checking -------------------------------------------------------------------------------- */

/* max |a - r| over finite r (equal infinities agree; any other non-finite a is an infinite
 * error), and max |r|. */
static void max_error(const buf *a, const buf *ref, double *err, double *ref_max) {
  *err = 0.0, *ref_max = 0.0;
  for (int64_t i = 0; i < a->n; ++i) {
    double x = attn_load(a->data, a->dtype, i), y = attn_load(ref->data, ref->dtype, i);
    if (isinf(y)) {
      if (x != y) *err = INFINITY;
      continue;
    }
    double d = fabs(x - y);
    if (!(d <= *err)) *err = isnan(d) ? INFINITY : d;
    if (fabs(y) > *ref_max) *ref_max = fabs(y);
  }
}

typedef struct check {
  int pass;
  double err, tol; /* of the tensor closest to (or furthest past) its tolerance */
  char what[8];    /* that tensor's name */
} check;

/* Compares the tensors a pass writes: out and lse forward; dq, dk and dv backward. */
static check check_against(const attn_problem *p, int backward, const tensors *impl,
                           const tensors *ref, const tensors *naive) {
  const buf *const a_fwd[] = {&impl->out, &impl->lse}, *const a_bwd[] = {&impl->dq, &impl->dk,
                                                                         &impl->dv};
  const buf *const r_fwd[] = {&ref->out, &ref->lse}, *const r_bwd[] = {&ref->dq, &ref->dk,
                                                                       &ref->dv};
  const buf *const n_fwd[] = {&naive->out, &naive->lse}, *const n_bwd[] = {&naive->dq, &naive->dk,
                                                                           &naive->dv};
  static const char *const names_fwd[] = {"out", "lse"}, *const names_bwd[] = {"dq", "dk", "dv"};
  const buf *const *a = backward ? a_bwd : a_fwd, *const *r = backward ? r_bwd : r_fwd;
  const buf *const *nv = backward ? n_bwd : n_fwd;
  const char *const *names = backward ? names_bwd : names_fwd;
  int count = backward ? 3 : 2;
  int low = p->dtype == ATTN_DTYPE_F16 || p->dtype == ATTN_DTYPE_BF16;
  check c = {1, 0.0, 0.0, ""};
  double worst = -1.0;
  for (int t = 0; t < count; ++t) {
    double err, ref_max, tol;
    max_error(a[t], r[t], &err, &ref_max);
    if (low) {
      double naive_err, unused;
      max_error(nv[t], r[t], &naive_err, &unused);
      tol = (backward ? 3.0 : 2.0) * naive_err + 1e-3 * ref_max;
    } else {
      tol = 1e-4 * (ref_max > 1.0 ? ref_max : 1.0);
    }
    int ok = err <= tol;
    double ratio = tol > 0.0 ? err / tol : (err > 0.0 ? INFINITY : 0.0);
    if (!ok) c.pass = 0;
    if (ratio > worst) {
      worst = ratio;
      c.err = err, c.tol = tol;
      snprintf(c.what, sizeof c.what, "%s", names[t]);
    }
  }
  return c;
}

/* ---- the machine ------------------------------------------------------------------------------ */

static void cpu_model(char *buf, size_t size) {
  snprintf(buf, size, "unknown CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f == NULL) return;
  char line[512];
  while (fgets(line, sizeof line, f) != NULL) {
    if (strncmp(line, "model name", 10) != 0) continue;
    const char *v = strchr(line, ':');
    if (v == NULL) continue;
    v += 1 + (v[1] == ' ');
    snprintf(buf, size, "%s", v);
    buf[strcspn(buf, "\n")] = '\0';
    break;
  }
  fclose(f);
}

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* ---- main ------------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  options opt;
  if (!parse_options(argc, argv, &opt)) {
    usage(stderr);
    return 2;
  }
  attn_ctx *ctx;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) {
    fprintf(stderr, "attn_bench: cannot create a context\n");
    return 2;
  }
  if (attn_ctx_set_num_threads(ctx, opt.threads) != ATTN_STATUS_OK) {
    fprintf(stderr, "attn_bench: %s\n", attn_ctx_last_error(ctx));
    return 2;
  }

  char model[256];
  cpu_model(model, sizeof model);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  bench_peak peak = bench_measure_peak(opt.quick ? 0.1 : 0.3);
  double peak_used = peak.gflops * opt.threads;
  const char *lead = opt.csv ? "# " : "";
  printf("%slibattn %s, attn_bench%s, seed %llu\n", lead, attn_version_string(),
         opt.quick ? " --quick" : "", (unsigned long long)opt.seed);
  printf("%smachine: %s, %ld cores online\n", lead, model, cores);
  printf("%sf32 FMA peak: %.1f GFLOP/s per thread (%s, measured), %d thread%s: %.1f GFLOP/s\n",
         lead, peak.gflops, peak.isa, opt.threads, opt.threads == 1 ? "" : "s", peak_used);
  printf("%simplementations:", lead);
  for (int32_t i = 0; i < attn_impl_count(); ++i) printf(" %s", attn_impl_name(i));
  printf("\n%stiming: median of >= %d runs and >= %.2g s after a checked warm-up run\n%s", lead,
         opt.reps, opt.min_time, opt.csv ? "" : "\n");
  if (opt.csv)
    printf("impl,problem,check,max_err,tol,median_ms,gflops,peak_fraction,reps\n");
  else
    printf("%-5s %-56s %-4s %-19s %10s %9s %7s %5s\n", "impl", "problem", "chk",
           "err / tol (tensor)", "median ms", "GFLOP/s", "%peak", "reps");

  int failures = 0, timed = 0;
  uint64_t rng = opt.seed;
  for (int ci = 0; ci < NUM_CASES; ++ci) {
    const bench_case *c = &cases[ci];
    attn_problem p = make_problem(c, opt.quick, c->dtype);
    char name[128];
    describe(c, &p, name, sizeof name);
    if (opt.match != NULL && strstr(name, opt.match) == NULL) continue;

    /* Inputs rounded to the problem's dtype; the f64 reference reads the same values. */
    int64_t nq = numel4(p.batch, p.seqlen_q, p.heads_q, p.head_dim);
    int64_t nk = numel4(p.batch, p.seqlen_k, p.heads_kv, p.head_dim);
    double *q = random_values(&rng, nq, c->dtype), *k = random_values(&rng, nk, c->dtype);
    double *v = random_values(&rng, nk, c->dtype), *dout = random_values(&rng, nq, c->dtype);

    attn_problem p64 = make_problem(c, opt.quick, ATTN_DTYPE_F64);
    tensors ref = tensors_make(&p64, q, k, v, dout), naive = tensors_make(&p, q, k, v, dout);
    runner rr, rn;
    int low = c->dtype == ATTN_DTYPE_F16 || c->dtype == ATTN_DTYPE_BF16;
    if (!runner_make(ctx, &p64, "ref", c->backward, &ref, ATTN_DTYPE_F64, &rr) ||
        run_all(&rr) != ATTN_STATUS_OK ||
        (low && (!runner_make(ctx, &p, "ref", c->backward, &naive, c->dtype, &rn) ||
                 run_all(&rn) != ATTN_STATUS_OK))) {
      fprintf(stderr, "attn_bench: the reference cannot run %s: %s\n", name,
              attn_ctx_last_error(ctx));
      return 1;
    }
    runner_free(&rr);
    if (low) runner_free(&rn);

    for (int32_t ii = 0; ii < attn_impl_count(); ++ii) {
      const char *impl = attn_impl_name(ii);
      if (opt.impl != NULL && strcmp(opt.impl, impl) != 0) continue;
      if (attn_impl_supports(ctx, impl, &p) != ATTN_STATUS_OK) {
        /* GPU implementations land here too: the problem's tensors are on the CPU. */
        if (opt.csv)
          printf("%s,\"%s\",unsupported,,,,,,0\n", impl, name);
        else
          printf("%-5s %-56s skip  %s\n", impl, name, attn_ctx_last_error(ctx));
        continue;
      }
      tensors t = tensors_make(&p, q, k, v, dout);
      runner r;
      check chk = {0, 0.0, 0.0, "-"};
      attn_status status = ATTN_STATUS_INTERNAL;
      if (runner_make(ctx, &p, impl, c->backward, &t, ATTN_DTYPE_F64, &r)) {
        status = run_all(&r);
        if (status == ATTN_STATUS_OK) chk = check_against(&p, c->backward, &t, &ref, &naive);
      }
      if (status != ATTN_STATUS_OK) {
        if (opt.csv)
          printf("%s,\"%s\",error,,,,,,0\n", impl, name);
        else
          printf("%-5s %-56s FAIL  %s\n", impl, name, attn_ctx_last_error(ctx));
        ++failures;
        if (r.plan != NULL) runner_free(&r);
        tensors_free(&t);
        continue;
      }
      double median = 0.0;
      int reps = 0;
      if (chk.pass) {
        /* Timed runs: the check run above was the warm-up. */
        int cap = 1 << 16;
        double *ms = malloc((size_t)cap * sizeof *ms), start = bench_now();
        while (ms != NULL && reps < cap &&
               (reps < opt.reps || bench_now() - start < opt.min_time)) {
          double t0 = bench_now();
          if (run_pass(&r) != ATTN_STATUS_OK) break;
          ms[reps++] = (bench_now() - t0) * 1e3;
        }
        qsort(ms, (size_t)reps, sizeof *ms, compare_double);
        median = reps == 0  ? 0.0
                 : reps % 2 ? ms[reps / 2]
                            : 0.5 * (ms[reps / 2 - 1] + ms[reps / 2]);
        free(ms);
        ++timed;
      } else {
        ++failures;
      }
      double gflops = median > 0.0 ? flop_count(c, &p) / (median * 1e-3) * 1e-9 : 0.0;
      double frac = peak_used > 0.0 ? gflops / peak_used : 0.0;
      if (opt.csv) {
        printf("%s,\"%s\",%s,%.3e,%.3e,", impl, name, chk.pass ? "pass" : "fail", chk.err, chk.tol);
        if (chk.pass)
          printf("%.4f,%.3f,%.5f,%d\n", median, gflops, frac, reps);
        else
          printf(",,,0\n");
      } else {
        char errs[64];
        snprintf(errs, sizeof errs, "%.1e/%.0e %s", chk.err, chk.tol, chk.what);
        printf("%-5s %-56s %-4s %-19s ", impl, name, chk.pass ? "PASS" : "FAIL", errs);
        if (chk.pass)
          printf("%10.2f %9.2f %6.2f%% %5d\n", median, gflops, 100.0 * frac, reps);
        else
          printf("%10s %9s %7s %5s  (not timed: failed the check)\n", "-", "-", "-", "-");
      }
      fflush(stdout);
      runner_free(&r);
      tensors_free(&t);
    }
    tensors_free(&ref);
    tensors_free(&naive);
    free(q), free(k), free(v), free(dout);
  }
  attn_ctx_destroy(ctx);
  if (!opt.csv)
    printf("\n%d timed, %d failed the check%s\n", timed, failures,
           failures ? ": their numbers are not shown" : "");
  return failures ? 1 : 0;
}
