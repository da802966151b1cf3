/*
 * tests/test_cuda.c - the "cuda" implementation against the reference, on a GPU.
 *
 * Everywhere: problems the kernels cannot run (f32, head dims that are not multiples of 8 or above
 * 256, scaled_dot_product_attention) must be UNSUPPORTED with a reason naming the cause.
 *
 * With a CUDA device (else exit 77, "skipped"): a grid of problems with odd sizes (1, 3, 17, 63, 65,
 * 127, 129, 1000), every head dim, every feature of SPEC.md alone and combined (GQA, causal both
 * alignments, windows, bias of every broadcast and its gradient, u8 masks, ALiBi, soft cap, sinks
 * and their gradient, dropout, packed and padded varlen with device lengths, segment ids, Dv != D).
 * Inputs are drawn from the printed seed, copied to the device, run forward and backward through a
 * plan with problem.device = CUDA, copied back and compared on the host with the f64 reference:
 * error <= 2x (3x for gradients) the error of the naive same-dtype computation + 1e-3 * max|r|
 * (SPEC.md; the naive error is the larger of the reference with and without
 * attn_plan_set_rounding, since rounding out, which Delta reads, is unavoidable). Outputs start as
 * NaN, so an element left unwritten fails; lse must be -inf exactly where the reference's is.
 * Each case runs under both configurations, "deterministic" and "atomic" (dq added with atomics),
 * and under "sm90" and "sm90_deterministic" (the Hopper forward, then the Hopper backward, or the
 * atomic / deterministic sm80 one for what it lacks) where the implementation offers them
 * (compute capability 9.0, the problems that forward takes); the backward pass is run twice and
 * must give identical bits (in the atomic and sm90 ones: dk, dv and dsinks, which no atomic
 * touches). Golden cases
 * (folder argv[1] or $ATTN_GOLDEN_DIR; skipped when absent) are checked against their stored f64
 * results the same way.
 *
 * ATTN_CUDA_QUICK=1 runs a few small cases only (for compute-sanitizer).
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "core/dtype.h"
#include "core/tensors.h"
#include "plan/plan.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef ATTN_TEST_CUDA
#include "gputest.h"
#endif

#ifndef ATTN_TEST_CUDA

int main(void) {
  printf("SKIP: libattn was built without its CUDA implementation\n");
  return 77;
}

#else

static attn_ctx *ctx;

static void test_unsupported(int have_gpu) {
  attn_problem p = tu_gpu_problem(1, 8, 8, 2, 2, 64, ATTN_DTYPE_F32);
  tu_gpu_expect_unsupported(ctx, "cuda", "f32", p, "dtype=f32");
  /* fp8 at D = 64: the sm90 fp8 forward has D = 128 and 256 (elsewhere than compute capability
   * 9.0, none); tests/test_fp8_cuda.c checks the rest */
  p = tu_gpu_problem(1, 8, 8, 2, 2, 64, ATTN_DTYPE_F8E4M3);
  tu_gpu_expect_unsupported(ctx, "cuda", "f8e4m3", p, "dtype=f8e4m3");
  p = tu_gpu_problem(1, 8, 8, 2, 2, 60, ATTN_DTYPE_BF16);
  tu_gpu_expect_unsupported(ctx, "cuda", "d60", p, "multiples of 8");
  p = tu_gpu_problem(1, 8, 8, 2, 2, 264, ATTN_DTYPE_BF16);
  tu_gpu_expect_unsupported(ctx, "cuda", "d264", p, "256");
  p = tu_gpu_problem(1, 8, 8, 2, 2, 64, ATTN_DTYPE_F16);
  p.operation = ATTN_OPERATION_SCALED_DOT_PRODUCT_ATTENTION;
  tu_gpu_expect_unsupported(ctx, "cuda", "sdpa", p, "scaled_dot_product_attention");
  p = tu_gpu_problem(1, 8, 8, 2, 2, 64, ATTN_DTYPE_BF16);
  p.device = ATTN_DEVICE_CPU;
  tu_gpu_expect_unsupported(ctx, "cuda", "cpu tensors", p, "device");
  if (!have_gpu) {
    p = tu_gpu_problem(1, 8, 8, 2, 2, 64, ATTN_DTYPE_BF16);
    tu_gpu_expect_unsupported(ctx, "cuda", "no gpu", p, "CUDA device");
  }
}

/* Whether the cuda implementation offers configuration `name` for p. */
static int offers(const attn_problem *p, const char *name) {
  int32_t n = 0;
  if (attn_impl_config_count(ctx, "cuda", p, &n) != ATTN_STATUS_OK) return 0;
  char buf[64];
  for (int32_t i = 0; i < n; ++i)
    if (attn_impl_config_name(ctx, "cuda", p, i, buf, sizeof buf) == ATTN_STATUS_OK &&
        strcmp(buf, name) == 0)
      return 1;
  return 0;
}

/* Roles of a case: inputs first, then outputs. */
enum { R_Q, R_K, R_V, R_BIAS, R_MASK, R_ALIBI, R_SINKS, R_QSEG, R_KSEG, R_DOUT, R_NIN };
enum { O_OUT, O_LSE, O_DQ, O_DK, O_DV, O_DBIAS, O_DSINKS, O_N };
static const attn_role in_role[R_NIN] = {ATTN_ROLE_Q,     ATTN_ROLE_K,           ATTN_ROLE_V,
                                         ATTN_ROLE_BIAS,  ATTN_ROLE_MASK,        ATTN_ROLE_ALIBI,
                                         ATTN_ROLE_SINKS, ATTN_ROLE_Q_SEGMENT_IDS,
                                         ATTN_ROLE_KV_SEGMENT_IDS, ATTN_ROLE_DOUT};
static const attn_role out_role[O_N] = {ATTN_ROLE_OUT, ATTN_ROLE_LSE,   ATTN_ROLE_DQ,    ATTN_ROLE_DK,
                                        ATTN_ROLE_DV,  ATTN_ROLE_DBIAS, ATTN_ROLE_DSINKS};
static const char *out_name[O_N] = {"out", "lse", "dq", "dk", "dv", "dbias", "dsinks"};

typedef struct hcase {
  char name[128];
  attn_problem p;   /* device CUDA, dtype f16 / bf16 */
  tu_buf in[R_NIN]; /* host values: token tensors in p.dtype, bias f32, stats f32 */
  int32_t cu_q[65], cu_k[65], len_q[64], len_k[64];
  uint64_t seed;
  int want_dbias, want_dsinks;
  double *expect[O_N]; /* golden results (NULL: the f64 reference) */
} hcase;

typedef struct results {
  tu_buf o[O_N];
} results;

static void results_free(results *r) {
  for (int i = 0; i < O_N; ++i) tu_buf_free(&r->o[i]);
}

static int role_used(const hcase *c, int o) {
  if (o == O_DBIAS) return c->want_dbias;
  if (o == O_DSINKS) return c->want_dsinks;
  return 1;
}

/* dtype of an input of the case when run in `dtype` (F64 for the exact reference). */
static attn_dtype in_dtype(const hcase *c, int r, attn_dtype dtype) {
  switch (r) {
  case R_BIAS: return dtype == ATTN_DTYPE_F64 ? ATTN_DTYPE_F64 : (attn_dtype)c->p.bias_dtype;
  case R_MASK: return ATTN_DTYPE_U8;
  case R_QSEG:
  case R_KSEG: return ATTN_DTYPE_I32;
  case R_ALIBI:
  case R_SINKS: return dtype == ATTN_DTYPE_F64 ? ATTN_DTYPE_F64 : ATTN_DTYPE_F32;
  default: return dtype;
  }
}

static void set_inputs(const hcase *c, const attn_problem *p, attn_inputs *in, attn_tensor *t) {
  attn_inputs_init(in);
  in->q = t[R_Q], in->k = t[R_K], in->v = t[R_V], in->bias = t[R_BIAS], in->mask = t[R_MASK];
  in->alibi_slopes = t[R_ALIBI], in->sinks = t[R_SINKS];
  in->q_segment_ids = t[R_QSEG], in->kv_segment_ids = t[R_KSEG];
  in->dropout_seed = c->seed;
  (void)p;
}

/* The reference on the host in dtype (F64: exact), rounding like the naive computation if round.
 * fed (may be NULL): its backward reads fed's out and lse (an implementation's forward outputs)
 * in place of its own, for the bound's naive_fed (tolerance.h). */
static int run_ref(const hcase *c, attn_dtype dtype, int round, const results *fed, results *r) {
  attn_problem p = c->p;
  p.device = ATTN_DEVICE_CPU;
  p.dtype = dtype;
  if (p.has_bias) p.bias_dtype = in_dtype(c, R_BIAS, dtype); /* dbias of the f64 run is f64 */
  tu_buf in[R_NIN];
  attn_tensor t[R_NIN];
  for (int i = 0; i < R_NIN; ++i) {
    in[i] = tu_buf_convert(&c->in[i], in_dtype(c, i, dtype));
    t[i] = tu_tensor(&in[i]);
  }
  memset(r, 0, sizeof *r);
  for (int o = 0; o < O_N; ++o) {
    attn_dtype odt = attn_role_dtype(&p, out_role[o]);
    r->o[o] = tu_buf_new(odt, role_used(c, o) && attn_role_used(&p, out_role[o]) ? attn_role_numel(&p, out_role[o]) : 0);
  }
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = "ref";
  attn_plan *plan = NULL;
  int ok = attn_plan_create(ctx, &p, &sel, &plan) == ATTN_STATUS_OK;
  if (ok && round) attn_plan_set_rounding(plan, (attn_dtype)c->p.dtype);
  attn_inputs ins;
  set_inputs(c, &p, &ins, t);
  if (p.varlen == ATTN_VARLEN_PACKED) ins.cu_seqlens_q = c->cu_q, ins.cu_seqlens_k = c->cu_k;
  if (p.varlen == ATTN_VARLEN_PADDED) ins.seqlens_q = c->len_q, ins.seqlens_k = c->len_k;
  attn_outputs out;
  attn_outputs_init(&out);
  out.out = tu_tensor(&r->o[O_OUT]), out.lse = tu_tensor(&r->o[O_LSE]);
  ok = ok && attn_plan_forward(plan, &ins, NULL, 0, &out) == ATTN_STATUS_OK;
  for (int o = O_OUT; ok && fed != NULL && o <= O_LSE; ++o) {
    ok = fed->o[o].n == r->o[o].n;
    for (int64_t e = 0; ok && e < r->o[o].n; ++e) tu_set(&r->o[o], e, tu_get(&fed->o[o], e));
  }
  attn_grads g;
  attn_grads_init(&g);
  g.dq = tu_tensor(&r->o[O_DQ]), g.dk = tu_tensor(&r->o[O_DK]), g.dv = tu_tensor(&r->o[O_DV]);
  g.dbias = tu_tensor(&r->o[O_DBIAS]), g.dsinks = tu_tensor(&r->o[O_DSINKS]);
  ok = ok && attn_plan_backward(plan, &ins, &out, &t[R_DOUT], NULL, 0, &g) == ATTN_STATUS_OK;
  if (!ok) printf("reference failed on %s: %s\n", c->name, attn_ctx_last_error(ctx));
  attn_plan_destroy(plan);
  for (int i = 0; i < R_NIN; ++i) tu_buf_free(&in[i]);
  return ok;
}

/* The implementation on the device under a configuration; backward twice (bits must agree in the
 * deterministic one). 0 when a call failed. */
/* attn_forward and attn_backward, the one-call conveniences, on the case's device inputs: they
 * allocate the device workspace a GPU plan needs themselves and return with the pass done. Their
 * plan is the default configuration, so their results are compared with the planned run's (r)
 * loosely, not bit for bit: a refused call or a wrong output fails. */
static void one_call(const hcase *c, const attn_inputs *in, const attn_tensor *dout_t,
                     const int64_t n[O_N], const attn_dtype odt[O_N], const results *r) {
  void *d[O_N];
  for (int o = 0; o < O_N; ++o) {
    /* as run_gpu allocates them, so rows a layout leaves unwritten (padding) compare equal */
    d[o] = n[o] > 0 ? tu_gpu_upload(NULL, (size_t)n[o] * attn_dtype_size(odt[o])) : NULL;
  }
  attn_outputs out;
  attn_outputs_init(&out);
  out.out = attn_tensor_dense(d[O_OUT]), out.lse = attn_tensor_dense(d[O_LSE]);
  attn_status s = attn_forward(ctx, &c->p, in, &out);
  tu_check(s == ATTN_STATUS_OK, "%s: attn_forward (one call): %s %s", c->name, attn_status_string(s),
           attn_ctx_last_error(ctx));
  if (s == ATTN_STATUS_OK) {
    attn_grads g;
    attn_grads_init(&g);
    g.dq = attn_tensor_dense(d[O_DQ]), g.dk = attn_tensor_dense(d[O_DK]);
    g.dv = attn_tensor_dense(d[O_DV]), g.dbias = attn_tensor_dense(d[O_DBIAS]);
    g.dsinks = attn_tensor_dense(d[O_DSINKS]);
    s = attn_backward(ctx, &c->p, in, &out, dout_t, &g);
    tu_check(s == ATTN_STATUS_OK, "%s: attn_backward (one call): %s %s", c->name, attn_status_string(s),
             attn_ctx_last_error(ctx));
  }
  for (int o = 0; o < O_N && s == ATTN_STATUS_OK; ++o) {
    if (n[o] == 0) continue;
    tu_buf got = tu_gpu_fetch(d[o], odt[o], n[o]);
    double worst = 0.0;
    for (int64_t i = 0; i < n[o]; ++i) {
      double a = tu_get(&got, i), b = tu_get(&r->o[o], i);
      /* equal infinities (lse of empty rows) and NaN where the planned run has NaN agree */
      double diff = a == b || (isnan(a) && isnan(b)) ? 0.0 : fabs(a - b) / (1.0 + fabs(b));
      if (!(diff <= worst)) worst = diff; /* NaN stays the worst */
    }
    tu_check(worst <= 0.05, "%s: one-call output %d within 5%% of the planned run's (worst %g)", c->name, o, worst);
    tu_buf_free(&got);
  }
  for (int o = 0; o < O_N; ++o)
    if (d[o] != NULL) TU_CUDA_CHECK(cudaFree(d[o]));
}

static int run_gpu(const hcase *c, const char *config, results *r) {
  const attn_problem *p = &c->p;
  memset(r, 0, sizeof *r);
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = "cuda";
  sel.config = config;
  attn_plan *plan = NULL;
  attn_status s = attn_plan_create(ctx, p, &sel, &plan);
  tu_check(s == ATTN_STATUS_OK, "%s %s: plan: %s %s", c->name, config, attn_status_string(s), attn_ctx_last_error(ctx));
  if (s != ATTN_STATUS_OK) return 0;
  tu_gpu_exec exec = tu_gpu_exec_create(plan);

  void *din[R_NIN];
  attn_tensor t[R_NIN];
  for (int i = 0; i < R_NIN; ++i) {
    size_t bytes = (size_t)c->in[i].n * attn_dtype_size(c->in[i].dtype);
    din[i] = bytes > 0 ? tu_gpu_upload(c->in[i].data, bytes) : NULL;
    t[i] = attn_tensor_dense(din[i]);
  }
  void *dout[O_N];
  int64_t n[O_N];
  attn_dtype odt[O_N];
  for (int o = 0; o < O_N; ++o) {
    int used = role_used(c, o) && attn_role_used(p, out_role[o]);
    n[o] = used ? attn_role_numel(p, out_role[o]) : 0;
    odt[o] = attn_role_dtype(p, out_role[o]);
    dout[o] = used ? tu_gpu_upload(NULL, (size_t)n[o] * attn_dtype_size(odt[o])) : NULL;
  }
  int32_t *lens = NULL;
  /* four arrays 68 entries (272 bytes) apart, each 16-byte aligned as cuDNN asks of them (the
   * one-call pair below may plan cudnn) */
  TU_CUDA_CHECK(cudaMalloc((void **)&lens, 4 * 68 * sizeof(int32_t)));
  TU_CUDA_CHECK(cudaMemcpy(lens, c->cu_q, sizeof c->cu_q, cudaMemcpyHostToDevice));
  TU_CUDA_CHECK(cudaMemcpy(lens + 68, c->cu_k, sizeof c->cu_k, cudaMemcpyHostToDevice));
  TU_CUDA_CHECK(cudaMemcpy(lens + 136, c->len_q, sizeof c->len_q, cudaMemcpyHostToDevice));
  TU_CUDA_CHECK(cudaMemcpy(lens + 204, c->len_k, sizeof c->len_k, cudaMemcpyHostToDevice));
  attn_inputs in;
  set_inputs(c, p, &in, t);
  if (p->varlen == ATTN_VARLEN_PACKED) in.cu_seqlens_q = lens, in.cu_seqlens_k = lens + 68;
  if (p->varlen == ATTN_VARLEN_PADDED) in.seqlens_q = lens + 136, in.seqlens_k = lens + 204;
  attn_outputs out;
  attn_outputs_init(&out);
  out.out = attn_tensor_dense(dout[O_OUT]), out.lse = attn_tensor_dense(dout[O_LSE]);
  s = attn_plan_forward(plan, &in, exec.workspace, exec.workspace_size, &out);
  TU_CUDA_CHECK(cudaStreamSynchronize(exec.stream));
  tu_check(s == ATTN_STATUS_OK, "%s: forward: %s %s", c->name, attn_status_string(s), attn_ctx_last_error(ctx));
  int ok = s == ATTN_STATUS_OK;
  attn_grads g;
  attn_grads_init(&g);
  g.dq = attn_tensor_dense(dout[O_DQ]), g.dk = attn_tensor_dense(dout[O_DK]);
  g.dv = attn_tensor_dense(dout[O_DV]), g.dbias = attn_tensor_dense(dout[O_DBIAS]);
  g.dsinks = attn_tensor_dense(dout[O_DSINKS]);
  if (ok) {
    s = attn_plan_backward(plan, &in, &out, &t[R_DOUT], exec.workspace, exec.workspace_size, &g);
    TU_CUDA_CHECK(cudaStreamSynchronize(exec.stream));
    tu_check(s == ATTN_STATUS_OK, "%s: backward: %s %s", c->name, attn_status_string(s), attn_ctx_last_error(ctx));
    ok = s == ATTN_STATUS_OK;
  }
  for (int o = 0; o < O_N; ++o) r->o[o] = tu_gpu_fetch(dout[o], odt[o], n[o]);
  if (ok) { /* a second backward pass gives the same bits: all of them in the deterministic
              * configuration; dk, dv and dsinks in the atomic and sm90 ones, where dq adds with
              * atomics */
    int deterministic = strcmp(config, "deterministic") == 0 || strcmp(config, "sm90_deterministic") == 0;
    s = attn_plan_backward(plan, &in, &out, &t[R_DOUT], exec.workspace, exec.workspace_size, &g);
    TU_CUDA_CHECK(cudaStreamSynchronize(exec.stream));
    int same = s == ATTN_STATUS_OK;
    for (int o = deterministic ? O_DQ : O_DK; o <= O_DSINKS && same; ++o) {
      if (o == O_DBIAS || n[o] == 0) continue; /* dbias adds with atomics in both */
      tu_buf again = tu_gpu_fetch(dout[o], odt[o], n[o]);
      same = memcmp(again.data, r->o[o].data, (size_t)n[o] * attn_dtype_size(odt[o])) == 0;
      tu_buf_free(&again);
    }
    if (deterministic) tu_check(same, "%s %s: a second backward pass gives the same bits", c->name, config);
    else
      tu_check(same, "%s %s: a second backward pass gives the same dk, dv bits", c->name, config);
  }
  /* the one-call pair on every varlen case and every eighth other one: each call plans (cuDNN
   * builds graphs), which would double the suite's time on every case */
  static int one_call_turn = 0;
  if (ok && strcmp(config, "deterministic") == 0 &&
      (p->varlen != ATTN_VARLEN_NONE || one_call_turn++ % 8 == 0))
    one_call(c, &in, &t[R_DOUT], n, odt, r);
  for (int i = 0; i < R_NIN; ++i)
    if (din[i] != NULL) TU_CUDA_CHECK(cudaFree(din[i]));
  for (int o = 0; o < O_N; ++o)
    if (dout[o] != NULL) TU_CUDA_CHECK(cudaFree(dout[o]));
  TU_CUDA_CHECK(cudaFree(lens));
  tu_gpu_exec_destroy(&exec);
  attn_plan_destroy(plan);
  return ok;
}

static void check_case(hcase *c) {
  results exact, naive, naive2, gpu;
  int have_exact = c->expect[O_OUT] == NULL;
  if (have_exact && !run_ref(c, ATTN_DTYPE_F64, 0, NULL, &exact)) {
    tu_check(0, "%s: f64 reference", c->name);
    return;
  }
  if (!run_ref(c, (attn_dtype)c->p.dtype, 1, NULL, &naive) ||
      !run_ref(c, (attn_dtype)c->p.dtype, 0, NULL, &naive2)) {
    tu_check(0, "%s: naive reference", c->name);
    return;
  }
  static const char *configs[] = {"deterministic", "atomic", "sm90", "sm90_deterministic"};
  for (int k = 0; k < 4; ++k) {
    if (k >= 2 && !offers(&c->p, configs[k])) continue;
    if (run_gpu(c, configs[k], &gpu)) {
      /* The exact backward given this run's out and lse (tol_naive_error's fed): with a
       * golden case's expected values there is no exact run to feed. */
      results fed;
      memset(&fed, 0, sizeof fed);
      int have_fed = have_exact && gpu.o[O_DQ].n > 0 && run_ref(c, ATTN_DTYPE_F64, 0, &gpu, &fed);
      for (int o = 0; o < O_N; ++o) {
        const double *e = have_exact ? (const double *)exact.o[o].data : c->expect[o];
        if (e == NULL || naive.o[o].n == 0) continue;
        if ((k == 1 || k == 3) && o < O_DQ) continue; /* the forward pass is that of k - 1 */
        char what[32];
        snprintf(what, sizeof what, "%s%s%s", out_name[o], k > 0 ? "@" : "", k > 0 ? configs[k] : "");
        tu_gpu_check_close(c->name, what, o < O_DQ ? TOL_FORWARD : TOL_GRADIENT, &gpu.o[o],
                           &naive.o[o], &naive2.o[o], have_fed && o >= O_DQ ? &fed.o[o] : NULL, e);
      }
      results_free(&fed);
    }
    results_free(&gpu);
  }
  results_free(&naive), results_free(&naive2);
  if (have_exact) results_free(&exact);
}

/* ---- the random grid ------------------------------------------------------------------------ */

static tu_rng rng;

static void fill(hcase *c) {
  const attn_problem *p = &c->p;
  for (int i = 0; i < R_NIN; ++i) {
    attn_role role = in_role[i];
    attn_dtype dt = in_dtype(c, i, (attn_dtype)p->dtype);
    int64_t n = attn_role_used(p, role) ? attn_role_numel(p, role) : 0;
    c->in[i] = tu_buf_new(dt, n);
    switch (i) {
    case R_BIAS: tu_fill_uniform(&c->in[i], &rng, -2.0, 2.0); break;
    case R_ALIBI: tu_fill_uniform(&c->in[i], &rng, 0.02, 0.5); break;
    case R_SINKS: tu_fill_uniform(&c->in[i], &rng, -1.0, 3.0); break;
    case R_MASK: /* about 1 in 4 masked; whole rows masked now and then */
      for (int64_t e = 0; e < n; ++e) tu_set(&c->in[i], e, tu_int(&rng, 0, 3) != 0);
      break;
    case R_QSEG:
    case R_KSEG: /* runs of equal ids, some negative (padding) */
      for (int64_t e = 0; e < n; ++e) {
        int64_t t = e % (i == R_QSEG ? p->seqlen_q : p->seqlen_k);
        tu_set(&c->in[i], e, t < 2 && i == R_QSEG ? -1 : (double)(t / 23));
      }
      break;
    default: tu_fill_uniform(&c->in[i], &rng, -1.0, 1.0);
    }
  }
  c->seed = ((uint64_t)tu_int(&rng, 0, 0x7fffffff) << 32) | (uint64_t)tu_int(&rng, 0, 0x7fffffff);
}

static void hcase_free(hcase *c) {
  for (int i = 0; i < R_NIN; ++i) tu_buf_free(&c->in[i]);
  for (int o = 0; o < O_N; ++o) free(c->expect[o]);
}

static void run_case(hcase *c) {
  snprintf(c->name + strlen(c->name), sizeof c->name - strlen(c->name), " %s",
           attn_dtype_name((attn_dtype)c->p.dtype));
  attn_status s = attn_impl_supports(ctx, "cuda", &c->p);
  tu_check(s == ATTN_STATUS_OK, "%s: supported (%s)", c->name, attn_ctx_last_error(ctx));
  if (s == ATTN_STATUS_OK) {
    fill(c);
    check_case(c);
  }
  hcase_free(c);
}

static hcase make(const char *name, attn_problem p) {
  hcase c;
  memset(&c, 0, sizeof c);
  snprintf(c.name, sizeof c.name, "%s", name);
  c.p = p;
  return c;
}

static void with_bias(hcase *c, int64_t b0, int64_t b1, int64_t b2, int64_t b3, attn_dtype dt) {
  c->p.has_bias = 1, c->p.bias_dtype = dt;
  c->p.bias_shape[0] = b0, c->p.bias_shape[1] = b1, c->p.bias_shape[2] = b2, c->p.bias_shape[3] = b3;
  c->want_dbias = 1;
}

static void with_mask(hcase *c, int64_t m0, int64_t m1) {
  c->p.has_mask = 1;
  c->p.mask_shape[0] = m0, c->p.mask_shape[1] = m1;
  c->p.mask_shape[2] = c->p.seqlen_q, c->p.mask_shape[3] = c->p.seqlen_k;
}

/* Packed varlen over lengths lq, lk (each at most the problem's seqlen). */
static void with_packed(hcase *c, const int32_t *lq, const int32_t *lk, int extra_rows) {
  c->p.varlen = ATTN_VARLEN_PACKED;
  c->cu_q[0] = c->cu_k[0] = 0;
  for (int64_t b = 0; b < c->p.batch; ++b) c->cu_q[b + 1] = c->cu_q[b] + lq[b], c->cu_k[b + 1] = c->cu_k[b] + lk[b];
  c->p.total_q = c->cu_q[c->p.batch] + extra_rows, c->p.total_k = c->cu_k[c->p.batch] + extra_rows;
}

static void with_padded(hcase *c, const int32_t *lq, const int32_t *lk) {
  c->p.varlen = ATTN_VARLEN_PADDED;
  for (int64_t b = 0; b < c->p.batch; ++b) c->len_q[b] = lq[b], c->len_k[b] = lk[b];
}

static void test_grid(int quick) {
  const attn_dtype BF = ATTN_DTYPE_BF16, F16 = ATTN_DTYPE_F16;
  hcase c;
  char name[96];
  /* sizes and head dims alone */
  static const int64_t sizes[][2] = {{1, 1}, {3, 17}, {17, 3}, {63, 65}, {65, 63}, {127, 129}, {129, 127}, {1000, 1000}};
  static const int64_t dims[] = {32, 64, 96, 128, 192, 256};
  int n_sizes = quick ? 3 : 8, n_dims = quick ? 2 : 6;
  for (int s = 0; s < n_sizes; ++s)
    for (int d = 0; d < n_dims; ++d) {
      if (sizes[s][0] == 1000 && dims[d] != 64 && dims[d] != 128) continue;
      int64_t h = sizes[s][0] >= 1000 ? 1 : 2;
      snprintf(name, sizeof name, "size %lldx%lld d%lld", (long long)sizes[s][0], (long long)sizes[s][1], (long long)dims[d]);
      c = make(name, tu_gpu_problem(2, sizes[s][0], sizes[s][1], h, h, dims[d], (s + d) % 2 ? BF : F16));
      run_case(&c);
    }
  /* head dims the kernels pad, and Dv != D */
  c = make("d80", tu_gpu_problem(1, 65, 127, 2, 1, 80, BF)), run_case(&c);
  c = make("d40 dv72", tu_gpu_problem(1, 63, 65, 2, 2, 40, F16)), c.p.head_dim_v = 72, run_case(&c);
  c = make("d128 dv64 causal", tu_gpu_problem(2, 129, 127, 4, 2, 128, BF)), c.p.head_dim_v = 64, c.p.causal = 1, run_case(&c);
  c = make("d64 dv256", tu_gpu_problem(1, 17, 63, 2, 2, 64, BF)), c.p.head_dim_v = 256, run_case(&c);

  /* GQA and MQA */
  c = make("gqa 8/2", tu_gpu_problem(2, 127, 129, 8, 2, 64, BF)), run_case(&c);
  c = make("mqa 6/1 causal", tu_gpu_problem(1, 65, 200, 6, 1, 128, F16)), c.p.causal = 1, run_case(&c);

  /* causal, both alignments, Tq < Tk and Tq > Tk */
  static const int64_t causal_sizes[][2] = {{129, 129}, {63, 200}, {200, 63}, {1, 129}, {1000, 1000}};
  for (int s = 0; s < (quick ? 2 : 5); ++s)
    for (int a = 0; a < 2; ++a) {
      snprintf(name, sizeof name, "causal %lldx%lld %s", (long long)causal_sizes[s][0], (long long)causal_sizes[s][1], a ? "tl" : "br");
      c = make(name, tu_gpu_problem(2, causal_sizes[s][0], causal_sizes[s][1], 2, 1, 64, a ? F16 : BF));
      c.p.causal = 1, c.p.align = a;
      run_case(&c);
    }
  /* the large head dims under a band (D = 256 has its own forward tile there), also in the quick
   * suite so that compute-sanitizer sees the D > 128 kernels */
  c = make("causal d256 65x200", tu_gpu_problem(2, 65, 200, 2, 1, 256, BF)), c.p.causal = 1, run_case(&c);
  c = make("causal d256 129x129 tl", tu_gpu_problem(1, 129, 129, 2, 2, 256, F16)), c.p.causal = 1, c.p.align = 1, run_case(&c);
  c = make("window d256 20,10", tu_gpu_problem(1, 200, 150, 2, 2, 256, BF)), c.p.window_left = 20, c.p.window_right = 10, run_case(&c);
  c = make("causal d192 127x129", tu_gpu_problem(1, 127, 129, 4, 2, 192, F16)), c.p.causal = 1, run_case(&c);
  /* windows */
  c = make("window 16,0", tu_gpu_problem(1, 200, 200, 2, 2, 64, BF)), c.p.window_left = 16, c.p.window_right = 0, run_case(&c);
  c = make("window 7,33 tl", tu_gpu_problem(1, 129, 300, 2, 2, 128, F16)), c.p.window_left = 7, c.p.window_right = 33, c.p.align = 1, run_case(&c);
  c = make("window 0,0", tu_gpu_problem(1, 65, 65, 2, 2, 32, BF)), c.p.window_left = 0, c.p.window_right = 0, run_case(&c);
  c = make("window -1,5 causal", tu_gpu_problem(1, 100, 130, 2, 2, 64, BF)), c.p.window_left = 40, c.p.causal = 1, run_case(&c);
  c = make("window big", tu_gpu_problem(1, 65, 63, 2, 2, 64, BF)), c.p.window_left = 1000000000, c.p.window_right = 3, run_case(&c);

  /* bias: full, broadcast, KV heads, row / column vectors, low-precision */
  c = make("bias full", tu_gpu_problem(2, 63, 65, 4, 2, 64, BF)), with_bias(&c, 2, 4, 63, 65, ATTN_DTYPE_F32), run_case(&c);
  c = make("bias bcast", tu_gpu_problem(2, 63, 65, 4, 2, 64, F16)), with_bias(&c, 1, 1, 63, 65, ATTN_DTYPE_F32), run_case(&c);
  c = make("bias kv heads", tu_gpu_problem(2, 65, 33, 4, 2, 96, BF)), with_bias(&c, 2, 2, 65, 33, ATTN_DTYPE_BF16), run_case(&c);
  c = make("bias row", tu_gpu_problem(1, 17, 129, 2, 2, 64, BF)), with_bias(&c, 1, 2, 1, 129, ATTN_DTYPE_F32), run_case(&c);
  c = make("bias kv heads d128 causal", tu_gpu_problem(2, 65, 129, 4, 2, 128, F16)), with_bias(&c, 2, 2, 65, 129, ATTN_DTYPE_BF16),
  c.p.causal = 1, run_case(&c);
  c = make("bias col f16 causal", tu_gpu_problem(1, 129, 17, 2, 2, 64, F16)), with_bias(&c, 1, 1, 129, 1, ATTN_DTYPE_F16), c.p.causal = 1, run_case(&c);

  /* masks, ALiBi, soft cap, sinks, dropout, segments */
  c = make("mask full", tu_gpu_problem(2, 65, 127, 2, 2, 64, BF)), with_mask(&c, 2, 2), run_case(&c);
  c = make("mask bcast causal", tu_gpu_problem(1, 63, 63, 4, 2, 128, F16)), with_mask(&c, 1, 1), c.p.causal = 1, run_case(&c);
  c = make("alibi h", tu_gpu_problem(1, 129, 129, 4, 4, 64, BF)), c.p.alibi = ATTN_ALIBI_PER_HEAD, c.p.causal = 1, run_case(&c);
  c = make("alibi bh tl", tu_gpu_problem(2, 63, 100, 2, 1, 64, F16)), c.p.alibi = ATTN_ALIBI_PER_BATCH_HEAD, c.p.align = 1, run_case(&c);
  c = make("softcap", tu_gpu_problem(1, 127, 129, 2, 2, 64, BF)), c.p.softcap = 5.0, run_case(&c);
  c = make("softcap bias causal", tu_gpu_problem(1, 65, 65, 2, 2, 128, BF)), c.p.softcap = 2.0, c.p.causal = 1,
  with_bias(&c, 1, 2, 65, 65, ATTN_DTYPE_F32), run_case(&c);
  c = make("softcap sinks alibi d256 causal", tu_gpu_problem(1, 127, 129, 2, 1, 256, BF)), c.p.softcap = 4.0,
  c.p.num_sinks = 2, c.want_dsinks = 1, c.p.alibi = ATTN_ALIBI_PER_HEAD, c.p.causal = 1, run_case(&c);
  c = make("sinks 1", tu_gpu_problem(2, 65, 63, 4, 2, 64, BF)), c.p.num_sinks = 1, c.want_dsinks = 1, run_case(&c);
  c = make("sinks 3 shared causal", tu_gpu_problem(1, 129, 129, 2, 2, 64, F16)), c.p.num_sinks = 3, c.p.sinks_shared = 1,
  c.want_dsinks = 1, c.p.causal = 1, run_case(&c);
  c = make("sinks window 0,0 masked", tu_gpu_problem(1, 33, 33, 2, 2, 32, BF)), c.p.num_sinks = 2, c.want_dsinks = 1,
  c.p.window_left = 0, c.p.window_right = 0, with_mask(&c, 1, 1), run_case(&c);
  /* the soft cap and sinks on the feature-free kernels (the soft cap in their kCap copy): the D = 128
   * and D = 256 banded tiles, GQA, f16, a cap far above the logits (tanh of small arguments) and
   * one far below them under a negative scale (slopes near 0) */
  c = make("softcap sinks causal gqa d128", tu_gpu_problem(2, 200, 200, 8, 2, 128, F16)), c.p.softcap = 10.0,
  c.p.num_sinks = 1, c.want_dsinks = 1, c.p.causal = 1, run_case(&c);
  c = make("softcap 1000 window d256", tu_gpu_problem(1, 129, 150, 2, 2, 256, BF)), c.p.softcap = 1000.0,
  c.p.window_left = 30, c.p.window_right = 5, run_case(&c);
  /* ALiBi with the soft cap on the sm90 cap / ALiBi kernel's register path: both alignments' band
   * edges under a window, per-batch slopes, GQA, f16 */
  c = make("alibi softcap window gqa d128", tu_gpu_problem(2, 150, 200, 4, 2, 128, F16)),
  c.p.alibi = ATTN_ALIBI_PER_BATCH_HEAD, c.p.softcap = 20.0, c.p.window_left = 70, c.p.window_right = 10, run_case(&c);
  /* the sm90 generic kernel (offered at D = 256 only) */
  c = make("bias mask segments d256", tu_gpu_problem(2, 70, 90, 2, 1, 256, BF)), with_bias(&c, 1, 2, 70, 90, ATTN_DTYPE_F32),
  with_mask(&c, 1, 1), c.p.has_segment_ids = 1, c.p.causal = 1, run_case(&c);
  c = make("softcap 0.05 scale -2", tu_gpu_problem(1, 65, 127, 2, 1, 64, BF)), c.p.softcap = 0.05, c.p.scale = -2.0,
  run_case(&c);
  c = make("softcap 1e6 causal", tu_gpu_problem(1, 63, 65, 2, 2, 64, F16)), c.p.softcap = 1e6, c.p.causal = 1,
  run_case(&c); /* above SoftCap::kMaxCap: the feature kernels' tanhf */
  c = make("sinks 2 d128", tu_gpu_problem(1, 129, 63, 4, 4, 128, BF)), c.p.num_sinks = 2, c.want_dsinks = 1, run_case(&c);
  c = make("dropout", tu_gpu_problem(2, 127, 129, 2, 2, 64, BF)), c.p.dropout_p = 0.17, run_case(&c);
  c = make("dropout causal gqa", tu_gpu_problem(1, 129, 65, 4, 2, 128, F16)), c.p.dropout_p = 0.5, c.p.causal = 1, run_case(&c);
  c = make("segments", tu_gpu_problem(2, 100, 100, 2, 2, 64, BF)), c.p.has_segment_ids = 1, run_case(&c);
  c = make("segments causal", tu_gpu_problem(1, 70, 90, 2, 1, 64, F16)), c.p.has_segment_ids = 1, c.p.causal = 1, run_case(&c);

  /* varlen */
  {
    static const int32_t lq[4] = {17, 0, 129, 65}, lk[4] = {63, 5, 129, 0};
    c = make("packed", tu_gpu_problem(4, 129, 129, 4, 2, 64, BF)), with_packed(&c, lq, lk, 0), run_case(&c);
    c = make("packed causal extra rows", tu_gpu_problem(4, 129, 129, 2, 2, 128, F16)), with_packed(&c, lq, lk, 5),
    c.p.causal = 1, run_case(&c);
    c = make("packed window sinks", tu_gpu_problem(4, 129, 129, 2, 2, 64, BF)), with_packed(&c, lq, lk, 0),
    c.p.window_left = 9, c.p.window_right = 2, c.p.num_sinks = 1, c.want_dsinks = 1, run_case(&c);
    c = make("packed d256 causal softcap tl", tu_gpu_problem(4, 129, 129, 2, 1, 256, BF)), with_packed(&c, lq, lk, 3),
    c.p.causal = 1, c.p.align = 1, c.p.softcap = 6.0, run_case(&c);
    c = make("padded", tu_gpu_problem(4, 129, 140, 2, 2, 64, F16)), with_padded(&c, lq, lk), run_case(&c);
    c = make("padded causal bias dropout", tu_gpu_problem(4, 129, 140, 2, 1, 64, BF)), with_padded(&c, lq, lk),
    c.p.causal = 1, c.p.dropout_p = 0.1, with_bias(&c, 4, 2, 129, 140, ATTN_DTYPE_F32), run_case(&c);
  }
  /* the sm90 backward's varlen with its per-score features (the cap / ALiBi kernel) and sinks:
   * sequences of partial and whole 64-row and 128-key blocks, one with a single row, Tq > Tk and
   * Tq < Tk, both causal alignments, a window, GQA, extra rows past the last sequence */
  {
    static const int32_t lq[4] = {200, 1, 77, 130}, lk[4] = {130, 64, 200, 77};
    c = make("packed causal br alibi softcap sinks gqa d128", tu_gpu_problem(4, 200, 200, 4, 2, 128, BF)),
    with_packed(&c, lq, lk, 7), c.p.causal = 1, c.p.alibi = ATTN_ALIBI_PER_HEAD, c.p.softcap = 8.0, c.p.num_sinks = 2,
    c.want_dsinks = 1, run_case(&c);
    c = make("packed causal tl softcap d64", tu_gpu_problem(4, 200, 200, 2, 2, 64, F16)), with_packed(&c, lq, lk, 0),
    c.p.causal = 1, c.p.align = ATTN_ALIGN_TOP_LEFT, c.p.softcap = 30.0, run_case(&c);
    c = make("padded window alibi sinks mqa d128", tu_gpu_problem(4, 200, 200, 3, 1, 128, F16)), with_padded(&c, lq, lk),
    c.p.window_left = 40, c.p.window_right = 70, c.p.alibi = ATTN_ALIBI_PER_BATCH_HEAD, c.p.num_sinks = 1,
    c.want_dsinks = 1, run_case(&c);
    c = make("padded causal tl alibi d64", tu_gpu_problem(4, 200, 200, 2, 1, 64, BF)), with_padded(&c, lq, lk),
    c.p.causal = 1, c.p.align = ATTN_ALIGN_TOP_LEFT, c.p.alibi = ATTN_ALIBI_PER_HEAD, run_case(&c);
  }
  /* many key blocks adding into each dq tile: where "sm90_deterministic" must order them (and a
   * band whose first key block varies per query block: first_key_block); ALiBi on tiles wholly
   * above, wholly below and across the diagonal (the sm90 backward's kLinear and general forms) */
  if (!quick)
    c = make("gqa 1000 window alibi d128", tu_gpu_problem(1, 1000, 1000, 4, 1, 128, BF)), c.p.window_left = 300,
    c.p.window_right = 200, c.p.alibi = ATTN_ALIBI_PER_HEAD, run_case(&c);
  /* causal grids go heads first in the sm90 backward (kHeadsFirst): many key blocks of several KV
   * heads and sequences, CTAs of the other heads dispatched between a head's key blocks, which
   * sm90_deterministic's counters wait across; D = 256's 64-key CTAs, bottom-right with Tq < Tk */
  if (!quick) {
    c = make("causal gqa 520 d256", tu_gpu_problem(2, 520, 520, 4, 2, 256, BF)), c.p.causal = 1, run_case(&c);
    c = make("causal br 400x900 d128", tu_gpu_problem(2, 400, 900, 4, 4, 128, F16)), c.p.causal = 1,
    c.p.align = ATTN_ALIGN_BOTTOM_RIGHT, run_case(&c);
  }
  /* everything at once */
  c = make("everything", tu_gpu_problem(2, 127, 129, 4, 2, 64, BF));
  c.p.causal = 1, c.p.window_left = 50, c.p.softcap = 3.0, c.p.alibi = ATTN_ALIBI_PER_HEAD, c.p.num_sinks = 2;
  c.want_dsinks = 1, c.p.dropout_p = 0.1, c.p.has_segment_ids = 1, c.p.scale = 0.3;
  with_bias(&c, 2, 2, 127, 129, ATTN_DTYPE_F32), with_mask(&c, 1, 4), run_case(&c);
  /* empty problems */
  c = make("tk 0", tu_gpu_problem(1, 17, 0, 2, 2, 64, BF)), run_case(&c);
  c = make("tq 0", tu_gpu_problem(1, 0, 17, 2, 2, 64, BF)), run_case(&c);
}

/* ---- golden cases ------------------------------------------------------------------------------ */

static char *read_text(const char *dir, const char *file) {
  char path[2100];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  size_t size;
  return tu_read_file(path, &size);
}

static double *read_f64(const char *dir, const char *file, int64_t n) {
  char path[2100];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  size_t size;
  double *d = tu_read_file(path, &size);
  if (d != NULL && size < (size_t)n * sizeof(double)) free(d), d = NULL;
  return d;
}

/* Reads a raw input file of `from` into a buffer of dtype `to`. */
static tu_buf read_input(const char *dir, const char *file, int64_t n, attn_dtype from, attn_dtype to) {
  char path[2100];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  size_t size;
  void *raw = tu_read_file(path, &size);
  tu_buf b = tu_buf_new(to, n);
  if (raw == NULL || size < (size_t)n * attn_dtype_size(from)) {
    free(raw);
    return b;
  }
  for (int64_t e = 0; e < n; ++e) tu_set(&b, e, attn_load(raw, from, e));
  free(raw);
  return b;
}

/* Sets *out to the numbers after key on its line; returns how many. */
static int key_values(const char *text, const char *key, double *out, int max) {
  size_t kl = strlen(key);
  for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
    if (strncmp(line, key, kl) != 0 || (line[kl] != ' ' && line[kl] != '\t')) continue;
    const char *s = line + kl;
    int n = 0;
    while (n < max) {
      char *end;
      double v = strtod(s, &end);
      if (end == s) break;
      out[n++] = v, s = end;
    }
    return n;
  }
  return 0;
}

static int has_word(const char *text, const char *key, const char *word) {
  size_t kl = strlen(key);
  for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
    if (strncmp(line, key, kl) == 0 && line[kl] == ' ') return strncmp(line + kl + 1, word, strlen(word)) == 0;
  return 0;
}

static void golden_case(const char *root, const char *cname, attn_dtype dtype) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/%s", root, cname);
  char *text = read_text(dir, "case.txt");
  if (text == NULL) return;
  double v[70];
  attn_problem p = tu_gpu_problem(1, 1, 1, 1, 1, 8, dtype);
#define GET(key, field)                                                                            \
  if (key_values(text, key, v, 1) == 1) p.field = (int64_t)v[0];
  GET("B", batch) GET("Tq", seqlen_q) GET("Tk", seqlen_k) GET("Hq", heads_q) GET("Hkv", heads_kv);
  GET("D", head_dim) GET("Dv", head_dim_v) GET("causal", causal) GET("window_left", window_left);
  GET("window_right", window_right);
#undef GET
  if (key_values(text, "scale", v, 1) == 1) p.scale = v[0];
  if (key_values(text, "softcap", v, 1) == 1) p.softcap = v[0];
  if (key_values(text, "dropout_p", v, 1) == 1) p.dropout_p = v[0];
  if (has_word(text, "align", "top_left")) p.align = ATTN_ALIGN_TOP_LEFT;
  hcase c = make(cname, p);
  snprintf(c.name, sizeof c.name, "golden %s", cname);
  if (key_values(text, "dropout_seed", v, 1) == 1) c.seed = (uint64_t)v[0];
  if (key_values(text, "bias_shape", v, 4) == 4) with_bias(&c, (int64_t)v[0], (int64_t)v[1], (int64_t)v[2], (int64_t)v[3], ATTN_DTYPE_F32);
  if (key_values(text, "mask_shape", v, 4) == 4) {
    c.p.has_mask = 1;
    for (int d = 0; d < 4; ++d) c.p.mask_shape[d] = (int64_t)v[d];
  }
  int na = key_values(text, "alibi_shape", v, 2);
  if (na > 0) c.p.alibi = na == 2 ? ATTN_ALIBI_PER_BATCH_HEAD : ATTN_ALIBI_PER_HEAD;
  int ns = key_values(text, "sinks_shape", v, 2);
  if (ns > 0) c.p.num_sinks = (int64_t)v[ns - 1], c.p.sinks_shared = ns == 1, c.want_dsinks = 1;
  if (strstr(text, "q_segment_ids") != NULL) c.p.has_segment_ids = 1;
  if (has_word(text, "varlen", "packed")) {
    int nq = key_values(text, "cu_seqlens_q", v, 65);
    for (int i = 0; i < nq; ++i) c.cu_q[i] = (int32_t)v[i];
    key_values(text, "cu_seqlens_k", v, 65);
    for (int i = 0; i < nq; ++i) c.cu_k[i] = (int32_t)v[i];
    c.p.varlen = ATTN_VARLEN_PACKED;
    c.p.batch = nq - 1, c.p.total_q = c.cu_q[nq - 1], c.p.total_k = c.cu_k[nq - 1];
  } else if (has_word(text, "varlen", "padded")) {
    int nb = key_values(text, "seqlens_q", v, 64);
    for (int i = 0; i < nb; ++i) c.len_q[i] = (int32_t)v[i];
    key_values(text, "seqlens_k", v, 64);
    for (int i = 0; i < nb; ++i) c.len_k[i] = (int32_t)v[i];
    c.p.varlen = ATTN_VARLEN_PADDED;
  }
  snprintf(c.name + strlen(c.name), sizeof c.name - strlen(c.name), " %s", attn_dtype_name(dtype));
  attn_problem rp;
  if (attn_impl_supports(ctx, "cuda", &c.p) != ATTN_STATUS_OK) {
    printf("golden %s: not run (%s)\n", cname, attn_ctx_last_error(ctx));
    free(text);
    return;
  }
  rp = c.p;
  static const char *files[R_NIN] = {"q.f32", "k.f32", "v.f32", "bias.f32", "mask.u8", "alibi.f32",
                                     "sinks.f32", "q_segment_ids.i32", "kv_segment_ids.i32", "dout.f32"};
  for (int i = 0; i < R_NIN; ++i) {
    attn_role role = in_role[i];
    int64_t n = attn_role_used(&rp, role) ? attn_role_numel(&rp, role) : 0;
    attn_dtype from = i == R_MASK ? ATTN_DTYPE_U8 : (i == R_QSEG || i == R_KSEG) ? ATTN_DTYPE_I32 : ATTN_DTYPE_F32;
    c.in[i] = n > 0 ? read_input(dir, files[i], n, from, in_dtype(&c, i, dtype)) : tu_buf_new(in_dtype(&c, i, dtype), 0);
  }
  static const char *outs[O_N] = {"out.f64", "lse.f64", "dq.f64", "dk.f64", "dv.f64", "dbias.f64", "dsinks.f64"};
  for (int o = 0; o < O_N; ++o)
    if (role_used(&c, o) && attn_role_used(&rp, out_role[o]))
      c.expect[o] = read_f64(dir, outs[o], attn_role_numel(&rp, out_role[o]));
  if (c.expect[O_OUT] == NULL) tu_check(0, "%s: unreadable expected results", c.name);
  else check_case(&c);
  hcase_free(&c);
  free(text);
}

static void test_golden(const char *root) {
  static const char *names[] = {
      "alibi", "alibi_batch", "basic", "bias_broadcast", "bias_full", "bias_kv_heads", "bias_softcap",
      "causal_q_longer", "causal_q_shorter", "causal_square", "causal_top_left", "cross_len",
      "decode_one_query", "dropout", "dropout_causal_gqa", "dv_differs", "everything", "gqa",
      "head_dim_128", "head_dim_80", "long_causal", "mask_per_head_causal", "mask_random", "mqa",
      "scale_custom", "segments", "sinks_many_long", "sinks_one", "sinks_shared", "softcap",
      "softcap_causal_gqa", "varlen_packed_causal", "varlen_packed_window", "varlen_padded",
      "window_causal", "window_diagonal", "window_two_sided"};
  char probe[1024];
  snprintf(probe, sizeof probe, "%s/basic", root);
  char *t = read_text(probe, "case.txt");
  if (t == NULL) {
    printf("golden cases not found at %s: skipped\n", root);
    return;
  }
  free(t);
  for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i) {
    golden_case(root, names[i], ATTN_DTYPE_BF16);
    golden_case(root, names[i], ATTN_DTYPE_F16);
  }
}

/* ---- the executor on a GPU problem ---------------------------------------------------------- */

/* Autotuning a GPU problem times the cuda implementation's two configurations (four on an H100 /
 * H200: "sm90" and "sm90_deterministic" too) on device scratch data of the tuner's own, plans the
 * winner and keeps it in the context's memory cache; under a deterministic policy "atomic" and
 * "sm90" are no candidates, and the lone one left ("deterministic" without sm90) is taken untimed,
 * the two left with it timed. No cache file is touched. (cudnn is left out: test_cuda runs under racecheck, and cuDNN's own kernels
 * are none of ours to check.) */
static void test_autotune(void) {
  for (int deterministic = 0; deterministic <= 1; ++deterministic) {
    const char *name = deterministic ? "autotune (deterministic)" : "autotune";
    attn_ctx *tctx = NULL;
    if (attn_ctx_create(&tctx) != ATTN_STATUS_OK) exit(1);
    attn_policy pol;
    attn_policy_init(&pol);
    pol.on_miss = ATTN_ON_MISS_AUTOTUNE, pol.cache_path = "", pol.tune_backward = 1;
    pol.warmup_iters = 1, pol.measure_iters = 5, pol.deterministic = deterministic;
    tu_tune_log log;
    memset(&log, 0, sizeof log);
    attn_ctx_set_policy(tctx, &pol);
    attn_ctx_set_event_callback(tctx, tu_gpu_on_tune_event, &log);
    attn_problem p = tu_gpu_problem(2, 300, 300, 4, 2, 64, ATTN_DTYPE_BF16);
    p.causal = 1;
    const int sm90 = offers(&p, "sm90"); /* two more configurations, the second deterministic */
    attn_select sel;
    attn_select_init(&sel);
    sel.impl = "cuda";
    attn_plan *plan = NULL;
    attn_status s = attn_plan_create(tctx, &p, &sel, &plan);
    tu_check(s == ATTN_STATUS_OK, "%s: plan: %s %s", name, attn_status_string(s), attn_ctx_last_error(tctx));
    if (deterministic && !sm90)
      tu_check(log.starts == 0 && plan != NULL && strcmp(attn_plan_config_name(plan), "deterministic") == 0,
               "%s: the lone deterministic configuration, untimed (%d tunings, %s)", name, log.starts,
               plan != NULL ? attn_plan_config_name(plan) : "no plan");
    else if (deterministic)
      tu_check(log.starts == 1 && log.measured == 2 && log.failed == 0 && plan != NULL &&
                   (strcmp(attn_plan_config_name(plan), "deterministic") == 0 ||
                    strcmp(attn_plan_config_name(plan), "sm90_deterministic") == 0),
               "%s: both deterministic configurations timed (%d measured, %d failed), the plan runs %s", name,
               log.measured, log.failed, plan != NULL ? attn_plan_config_name(plan) : "no plan");
    else
      tu_check(log.starts == 1 && log.finishes == 1 && log.measured == 2 + 2 * sm90 && log.failed == 0 && plan != NULL &&
                   strcmp(attn_plan_impl_name(plan), log.impl) == 0 &&
                   strcmp(attn_plan_config_name(plan), log.config) == 0,
               "%s: every configuration timed on the device (%d measured, %d failed), the plan runs the "
               "winner %s %s",
               name, log.measured, log.failed, log.impl, log.config);
    attn_plan_destroy(plan);
    plan = NULL;
    if (!deterministic) {
      s = attn_plan_create(tctx, &p, &sel, &plan);
      tu_check(s == ATTN_STATUS_OK && log.starts == 1 && log.memory_hits == 1,
               "%s: a second plan comes from the memory cache (%d tunings, %d hits)", name, log.starts,
               log.memory_hits);
      attn_plan_destroy(plan);
    }
    attn_ctx_destroy(tctx);
  }
}

/* The Hopper forward ("sm90") is offered on a compute capability 9.0 device when the build has it
 * (ATTN_TEST_SM90), as the default, for the problems it takes (head dims 64, 128, 256 with Dv = D,
 * causal, windows, GQA, the features of its feature kernel), and for no problem with a feature it
 * lacks. */
static void test_sm90_offer(void) {
  struct cudaDeviceProp prop;
  TU_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  int hopper = prop.major == 9 && prop.minor == 0;
#ifndef ATTN_TEST_SM90
  hopper = 0;
#endif
  attn_problem p = tu_gpu_problem(2, 300, 300, 4, 2, 128, ATTN_DTYPE_BF16);
  p.causal = 1;
  tu_check(offers(&p, "sm90") == hopper, "sm90 offered (%d) for d128 causal GQA on compute capability %d.%d",
           offers(&p, "sm90"), prop.major, prop.minor);
  tu_check(offers(&p, "sm90_deterministic") == hopper, "sm90_deterministic offered (%d) where sm90 is",
           offers(&p, "sm90_deterministic"));
  char name[64] = "";
  attn_impl_config_default(ctx, "cuda", &p, name, sizeof name);
  tu_check(strcmp(name, hopper ? "sm90" : "deterministic") == 0, "default configuration %s on %d.%d", name,
           prop.major, prop.minor);
  p.window_left = 50, p.head_dim = p.head_dim_v = 256, p.dtype = ATTN_DTYPE_F16;
  tu_check(offers(&p, "sm90") == hopper, "sm90 offered (%d) for d256 f16 window", offers(&p, "sm90"));
  p = tu_gpu_problem(1, 64, 64, 2, 2, 64, ATTN_DTYPE_BF16);
  tu_check(offers(&p, "sm90") == hopper, "sm90 offered (%d) for plain d64", offers(&p, "sm90"));
  /* features the plain and cap / ALiBi kernels take, and ones they lack (the generic kernel's,
   * mask, bias and segment ids, are offered at D = 256 only: slower than the sm80 kernel below),
   * each alone on a plain d64 problem */
  static const char *features[] = {"softcap", "d96",  "dv != d", "dropout", "sinks",
                                   "packed",  "mask", "alibi",   "bias",    "segments", "padded"};
  static const int taken[] = {1, 0, 0, 0, 1, 1, 0, 1, 0, 0, 1};
  for (int i = 0; i < (int)(sizeof features / sizeof features[0]); ++i) {
    p = tu_gpu_problem(1, 64, 64, 2, 2, 64, ATTN_DTYPE_BF16);
    switch (i) {
    case 0: p.softcap = 5.0; break;
    case 1: p.head_dim = p.head_dim_v = 96; break;
    case 2: p.head_dim_v = 128; break;
    case 3: p.dropout_p = 0.1; break;
    case 4: p.num_sinks = 1; break;
    case 5: p.varlen = ATTN_VARLEN_PACKED, p.total_q = p.total_k = 64; break;
    case 6: p.has_mask = 1, p.mask_shape[0] = p.mask_shape[1] = 1, p.mask_shape[2] = p.mask_shape[3] = 64; break;
    case 7: p.alibi = ATTN_ALIBI_PER_BATCH_HEAD; break;
    case 8: p.has_bias = 1, p.bias_dtype = ATTN_DTYPE_BF16, p.bias_shape[0] = p.bias_shape[2] = 1;
      p.bias_shape[1] = 2, p.bias_shape[3] = 64;
      break;
    case 9: p.has_segment_ids = 1; break;
    default: p.varlen = ATTN_VARLEN_PADDED;
    }
    tu_check(offers(&p, "sm90") == (hopper && taken[i]), "sm90 offered (%d) for %s", offers(&p, "sm90"),
             features[i]);
  }
  p = tu_gpu_problem(1, 64, 64, 2, 2, 256, ATTN_DTYPE_BF16);
  p.has_segment_ids = 1;
  tu_check(offers(&p, "sm90") == hopper, "sm90 offered (%d) for d256 segment ids", offers(&p, "sm90"));
}

int main(int argc, char **argv) {
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) return 1;
  int have_gpu = tu_gpu_found();
  test_unsupported(have_gpu);
  if (!have_gpu) {
    attn_ctx_destroy(ctx);
    return tu_gpu_skipped();
  }
  rng = tu_rng_make(tu_seed("test_cuda"));
  const char *quick = getenv("ATTN_CUDA_QUICK");
  test_autotune();
  test_sm90_offer();
  test_grid(quick != NULL && quick[0] == '1');
  if (quick == NULL || quick[0] != '1') {
    const char *root = argc > 1 ? argv[1] : getenv("ATTN_GOLDEN_DIR");
    if (root == NULL) root = "../shared/golden";
    test_golden(root);
  }
  attn_ctx_destroy(ctx);
  return tu_finish();
}

#endif
