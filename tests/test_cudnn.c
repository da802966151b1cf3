/*
 * tests/test_cudnn.c - the "cudnn" implementation against the reference, on a GPU.
 *
 * Wherever the implementation is compiled in (with or without a GPU): the problems cuDNN cannot
 * run (dropout, sinks, soft cap, u8 masks, segment ids, packed varlen, f32, a paged cache's
 * append, more than one query or a page size not a power of two, ...) must be UNSUPPORTED with a
 * reason that names the feature. Without cuDNN the program exits 77. (tests/test_paged.c runs
 * cuDNN's paged attention.)
 *
 * With a CUDA device (else the program exits 77, "skipped"): for a grid of problems with odd sizes
 * and every supported feature alone and combined (causal bottom-right and top-left, windows, bias
 * and its gradient, ALiBi, padded varlen, GQA/MQA, custom scale, Dv != D, a strided layout),
 * inputs are drawn from the printed seed, copied to the device, run forward and backward through a
 * plan with problem.device = CUDA, copied back and compared with the f64 reference on the host:
 * error <= 2x (3x for gradients) the error of the naive same-dtype computation (the reference with
 * attn_plan_set_rounding) + 1e-3 * max|r|, SPEC.md's rule. Outputs are poisoned with NaN first, so
 * an element the implementation forgets fails. Every case runs under both configurations,
 * "atomic" and "deterministic". The golden cases cuDNN supports are checked the same way against
 * their stored f64 results (folder: argv[1] or $ATTN_GOLDEN_DIR).
 *
 * fp8 (docs/FP8.md): e4m3 problems (odd sizes, causal both alignments, GQA/MQA, factors per tensor
 * and none, out bf16 and f16) against the f64 reference under tol_bound_fp8, through the attn
 * tool's oracle; where cuDNN writes no bf16/f16 out (Hopper, cuDNN < 9.13) each must be refused
 * with that reason, printed. What the fp8 graph lacks on every GPU (factors per (batch, KV head),
 * an f32 out, bias, windows, head dims not multiples of 16) is refused with or without a GPU.
 *
 * Determinism: every configuration declared deterministic for a problem repeats the bits of its
 * gradients when the backward pass runs twice (B=2 H=8 T=1000 D=128: causal, not, GQA, a full bias
 * with dbias). Autotuning across implementations: a causal GQA problem tuned forward + backward
 * times cudnn's and cuda's configurations and the winner passes the reference check.
 *
 * Graph cache (src/impl/cudnn/cudnn_cache.c), first of all so the process's first plan is timed:
 * a second plan of a shape builds no graph (the cache's counters say so) and is made in a fraction
 * of the first one's time (both printed), both plans pass the reference check with the same
 * forward bits, a strided layout's graphs are shared too, and graphs evicted (bound 0) while plans
 * hold them keep running for those plans and are freed with the last of them; 4 threads, each with
 * its own context, plan, handle and stream, run one shared graph at once and get the bits of a
 * single-threaded run.
 *
 * ATTN_CUDNN_QUICK=1 runs three small cases only (for compute-sanitizer); ATTN_CUDNN_FP8_ONLY=1
 * the refusals and the fp8 forward only (a short device call after an fp8 change).
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "core/tensors.h"
#include "plan/plan.h"
#include "plan/registry.h"
#include "plan/validate.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef ATTN_HAVE_CUDNN
#include "gputest.h"
#include "harness.h"                /* the attn tool's oracle, for the fp8 problems */
#include "impl/cudnn/cudnn_graph.h" /* the graph cache's counters */
#include "module/module.h"
#include <cudnn_backend.h>
#include <pthread.h>
#include <time.h>
#endif

#ifndef ATTN_HAVE_CUDNN

int main(void) {
  printf("SKIP: libattn was built without cuDNN\n");
  return 77;
}

#else

static attn_ctx *ctx;

/* ---- unsupported problems: checked with or without a GPU ------------------------------------- */

static void test_unsupported(void) {
  attn_problem base = tu_gpu_problem(2, 64, 64, 4, 4, 64, ATTN_DTYPE_BF16), p;
  p = base, p.dropout_p = 0.1;
  tu_gpu_expect_unsupported(ctx, "cudnn", "dropout", p, "Philox");
  p = base, p.num_sinks = 1;
  tu_gpu_expect_unsupported(ctx, "cudnn", "sinks", p, "sinks");
  p = base, p.softcap = 5.0;
  tu_gpu_expect_unsupported(ctx, "cudnn", "softcap", p, "soft cap");
  p = base, p.has_mask = 1, p.mask_shape[0] = 1, p.mask_shape[1] = 1, p.mask_shape[2] = 64,
  p.mask_shape[3] = 64;
  tu_gpu_expect_unsupported(ctx, "cudnn", "u8 mask", p, "mask");
  p = base, p.has_segment_ids = 1;
  tu_gpu_expect_unsupported(ctx, "cudnn", "segment ids", p, "segment");
  p = base, p.varlen = ATTN_VARLEN_PACKED, p.total_q = 100, p.total_k = 100;
  tu_gpu_expect_unsupported(ctx, "cudnn", "packed varlen", p, "packed");
  p = base, p.dtype = ATTN_DTYPE_F32;
  tu_gpu_expect_unsupported(ctx, "cudnn", "f32", p, "dtype=f32");
  /* fp8 (docs/FP8.md): what cuDNN's fp8 graph lacks, on any GPU (test_fp8_forward: the rest) */
  attn_problem fp8 = base;
  fp8.dtype = ATTN_DTYPE_F8E4M3, fp8.descale = ATTN_DESCALE_TENSOR;
  p = fp8, p.descale = ATTN_DESCALE_PER_BATCH_KV_HEAD;
  tu_gpu_expect_unsupported(ctx, "cudnn", "fp8 descale per (batch, KV head)", p, "descale=bhkv");
  p = fp8, p.out_dtype = ATTN_DTYPE_F32;
  tu_gpu_expect_unsupported(ctx, "cudnn", "fp8 with an f32 out", p, "out_dtype=f32");
  p = fp8, p.has_bias = 1, p.bias_dtype = ATTN_DTYPE_BF16, p.bias_shape[0] = 1, p.bias_shape[1] = 1,
  p.bias_shape[2] = 64, p.bias_shape[3] = 64;
  tu_gpu_expect_unsupported(ctx, "cudnn", "fp8 bias", p, "bias");
  p = fp8, p.window_left = 8, p.window_right = 0;
  tu_gpu_expect_unsupported(ctx, "cudnn", "fp8 sliding window", p, "sliding window");
  p = fp8, p.head_dim = 40, p.head_dim_v = 40;
  tu_gpu_expect_unsupported(ctx, "cudnn", "fp8 head_dim 40", p, "multiples of 16");
  p = base, p.alibi = ATTN_ALIBI_PER_BATCH_HEAD;
  tu_gpu_expect_unsupported(ctx, "cudnn", "alibi per batch", p, "alibi");
  p = base, p.alibi = ATTN_ALIBI_PER_HEAD;
  tu_gpu_expect_unsupported(ctx, "cudnn", "alibi without causal", p, "alibi");
  p = base, p.has_bias = 1, p.bias_dtype = ATTN_DTYPE_F32, p.bias_shape[0] = 1, p.bias_shape[1] = 1,
  p.bias_shape[2] = 64, p.bias_shape[3] = 64;
  tu_gpu_expect_unsupported(ctx, "cudnn", "f32 bias", p, "bias_dtype");
  p = base, p.heads_kv = 2, p.has_bias = 1, p.bias_dtype = ATTN_DTYPE_BF16, p.bias_shape[0] = 1,
  p.bias_shape[1] = 2, p.bias_shape[2] = 64, p.bias_shape[3] = 64;
  tu_gpu_expect_unsupported(ctx, "cudnn", "bias per kv head", p, "KV head");
  p = base, p.has_bias = 1, p.bias_dtype = ATTN_DTYPE_BF16, p.bias_shape[0] = 1,
  p.bias_shape[1] = 1, p.bias_shape[2] = 1, p.bias_shape[3] = 64;
  tu_gpu_expect_unsupported(ctx, "cudnn", "bias broadcast over queries", p, "bias_shape");
  p = base, p.head_dim = 36;
  tu_gpu_expect_unsupported(ctx, "cudnn", "head_dim 36", p, "multiples of 8");
  p = base, p.seqlen_k = 0;
  tu_gpu_expect_unsupported(ctx, "cudnn", "no keys", p, "seqlen_k=0");
  p = base, p.seqlen_q = 64, p.seqlen_k = 80, p.causal = 1, p.has_bias = 1,
  p.bias_dtype = ATTN_DTYPE_BF16, p.bias_shape[0] = 1, p.bias_shape[1] = 1, p.bias_shape[2] = 64,
  p.bias_shape[3] = 80;
  tu_gpu_expect_unsupported(ctx, "cudnn", "bias with bottom-right causal, Tq != Tk", p, "bias");
  p = base, p.device = ATTN_DEVICE_CPU;
  tu_gpu_expect_unsupported(ctx, "cudnn", "a CPU problem", p, "device");
  /* a paged KV cache (docs/DECODE.md): what cuDNN's paged attention cannot do, and the dense
   * rules, which apply to it with a length per sequence (so Tq == Tk is no top-left mask) */
  attn_problem paged = tu_gpu_problem(2, 1, 64, 4, 2, 64, ATTN_DTYPE_BF16);
  paged.page_size = 16;
  p = paged, p.seqlen_new = 1;
  tu_gpu_expect_unsupported(ctx, "cudnn", "paged append", p, "seqlen_new=1");
  p = paged, p.page_size = 48;
  tu_gpu_expect_unsupported(ctx, "cudnn", "paged, a page size not a power of two", p,
                            "powers of two");
  p = paged, p.seqlen_q = 4, p.causal = 1;
  tu_gpu_expect_unsupported(ctx, "cudnn", "paged, more than one query", p, "decode only");
  p = paged, p.num_sinks = 1;
  tu_gpu_expect_unsupported(ctx, "cudnn", "paged sinks", p, "sinks");
  p = paged, p.seqlen_q = 64, p.causal = 1, p.alibi = ATTN_ALIBI_PER_HEAD;
  tu_gpu_expect_unsupported(ctx, "cudnn", "paged alibi under a bottom-right causal mask", p,
                            "ALiBi");
}

/* ---- one case: host inputs, options ---------------------------------------------------------- */

typedef struct hcase {
  char name[96];
  attn_problem p;                    /* dtype f16/bf16, device CUDA */
  tu_buf q, k, v, dout, bias, alibi; /* q..dout, bias in p.dtype; alibi f32 */
  int32_t seqlens_q[64], seqlens_k[64];
  int bhsd;       /* q, k, v, out, dout and grads in [B, H, T, D] memory order */
  int no_lse;     /* forward only, without lse */
  int want_dbias; /* backward also returns dbias */
  /* golden expected results (NULL: computed by the f64 reference) */
  double *e_out, *e_lse, *e_dq, *e_dk, *e_dv, *e_dbias;
} hcase;

typedef struct results {
  tu_buf out, lse, dq, dk, dv, dbias;
} results;

static void results_free(results *r) {
  tu_buf_free(&r->out), tu_buf_free(&r->lse), tu_buf_free(&r->dq), tu_buf_free(&r->dk);
  tu_buf_free(&r->dv), tu_buf_free(&r->dbias);
}

static tu_buf role_buf(const attn_problem *p, attn_role role, attn_dtype dtype) {
  return tu_buf_new(dtype, attn_role_numel(p, role));
}

/* The reference on the host, in dtype (F64: the exact result), rounding like the naive
 * computation when round != 0. */
static int run_ref(const hcase *c, attn_dtype dtype, int round, results *r) {
  attn_problem p = c->p;
  p.device = ATTN_DEVICE_CPU;
  p.dtype = dtype;
  if (p.has_bias) p.bias_dtype = dtype;
  attn_dtype fdt = dtype == ATTN_DTYPE_F64 ? ATTN_DTYPE_F64 : ATTN_DTYPE_F32;
  tu_buf q = tu_buf_convert(&c->q, dtype), k = tu_buf_convert(&c->k, dtype),
         v = tu_buf_convert(&c->v, dtype), dout = tu_buf_convert(&c->dout, dtype);
  tu_buf bias = c->p.has_bias ? tu_buf_convert(&c->bias, dtype) : tu_buf_new(dtype, 0);
  tu_buf alibi = c->p.alibi ? tu_buf_convert(&c->alibi, fdt) : tu_buf_new(fdt, 0);
  memset(r, 0, sizeof *r);
  r->out = role_buf(&p, ATTN_ROLE_OUT, dtype);
  r->lse = role_buf(&p, ATTN_ROLE_LSE, fdt);
  r->dq = role_buf(&p, ATTN_ROLE_DQ, dtype);
  r->dk = role_buf(&p, ATTN_ROLE_DK, dtype);
  r->dv = role_buf(&p, ATTN_ROLE_DV, dtype);
  r->dbias = c->want_dbias ? role_buf(&p, ATTN_ROLE_DBIAS, dtype) : tu_buf_new(dtype, 0);

  attn_select sel;
  attn_select_init(&sel);
  sel.impl = "ref";
  attn_plan *plan = NULL;
  int ok = attn_plan_create(ctx, &p, &sel, &plan) == ATTN_STATUS_OK;
  if (ok && round) attn_plan_set_rounding(plan, c->p.dtype);
  attn_inputs in;
  attn_inputs_init(&in);
  in.q = tu_tensor(&q), in.k = tu_tensor(&k), in.v = tu_tensor(&v);
  in.bias = tu_tensor(&bias), in.alibi_slopes = tu_tensor(&alibi);
  if (p.varlen == ATTN_VARLEN_PADDED) in.seqlens_q = c->seqlens_q, in.seqlens_k = c->seqlens_k;
  attn_outputs out;
  attn_outputs_init(&out);
  out.out = tu_tensor(&r->out), out.lse = tu_tensor(&r->lse);
  ok = ok && attn_plan_forward(plan, &in, NULL, 0, &out) == ATTN_STATUS_OK;
  attn_grads g;
  attn_grads_init(&g);
  g.dq = tu_tensor(&r->dq), g.dk = tu_tensor(&r->dk), g.dv = tu_tensor(&r->dv);
  g.dbias = tu_tensor(&r->dbias);
  attn_tensor dt = tu_tensor(&dout);
  ok = ok && attn_plan_backward(plan, &in, &out, &dt, NULL, 0, &g) == ATTN_STATUS_OK;
  if (!ok) printf("reference failed on %s: %s\n", c->name, attn_ctx_last_error(ctx));
  attn_plan_destroy(plan);
  tu_buf_free(&q), tu_buf_free(&k), tu_buf_free(&v), tu_buf_free(&dout), tu_buf_free(&bias);
  tu_buf_free(&alibi);
  return ok;
}

/* ---- device tensors in a chosen memory order ------------------------------------------------- */

typedef struct gtensor {
  attn_tensor t; /* device data and strides */
  int ndim;
  int64_t shape[4], span;
  size_t es;
} gtensor;

static int reorderable(attn_role role) {
  return role == ATTN_ROLE_Q || role == ATTN_ROLE_K || role == ATTN_ROLE_V ||
         role == ATTN_ROLE_OUT || role == ATTN_ROLE_DOUT || role == ATTN_ROLE_DQ ||
         role == ATTN_ROLE_DK || role == ATTN_ROLE_DV;
}

/* Device copy of host (dense, NULL = poisoned with NaN bytes). */
static gtensor g_alloc(const attn_problem *p, attn_role role, int bhsd, const tu_buf *host) {
  gtensor g;
  memset(&g, 0, sizeof g);
  g.ndim = attn_role_shape(p, role, g.shape);
  g.es = attn_dtype_size(attn_role_dtype(p, role));
  for (int d = g.ndim; d < 4; ++d) g.shape[d] = 1;
  attn_tensor dense = {NULL, {0, 0, 0, 0}};
  dense = attn_role_resolve(p, role, dense);
  int64_t st[4] = {1, 1, 1, 1};
  for (int d = 0; d < g.ndim; ++d) st[d] = dense.stride[d];
  if (bhsd && reorderable(role)) { /* [B, T, H, D] stored as [B, H, T, D] */
    int64_t t = g.shape[1], h = g.shape[2], dd = g.shape[3];
    st[3] = 1, st[1] = dd, st[2] = t * dd, st[0] = h * t * dd;
  }
  int64_t n = g.shape[0] * g.shape[1] * g.shape[2] * g.shape[3];
  g.span = n == 0 ? 0 : 1;
  for (int d = 0; d < 4 && n > 0; ++d) g.span += (g.shape[d] - 1) * st[d];
  for (int d = 0; d < 4; ++d) g.t.stride[d] = st[d];
  size_t bytes = (size_t)(g.span > 0 ? g.span : 1) * g.es;
  unsigned char *stage = malloc(bytes);
  memset(stage, 0xff, bytes); /* NaN in every float format */
  if (host != NULL) {
    int64_t i = 0;
    for (int64_t a = 0; a < g.shape[0]; ++a)
      for (int64_t b = 0; b < g.shape[1]; ++b)
        for (int64_t c = 0; c < g.shape[2]; ++c)
          for (int64_t d = 0; d < g.shape[3]; ++d, ++i)
            memcpy(stage + (size_t)(a * st[0] + b * st[1] + c * st[2] + d * st[3]) * g.es,
                   (const unsigned char *)host->data + (size_t)i * g.es, g.es);
  }
  g.t.data = tu_gpu_upload(stage, bytes);
  free(stage);
  return g;
}

/* Dense host copy of a device tensor. */
static tu_buf g_fetch(const gtensor *g, attn_dtype dtype) {
  int64_t n = g->shape[0] * g->shape[1] * g->shape[2] * g->shape[3];
  tu_buf h = tu_buf_new(dtype, n);
  size_t bytes = (size_t)(g->span > 0 ? g->span : 1) * g->es;
  tu_buf raw = tu_gpu_fetch(g->t.data, ATTN_DTYPE_U8, (int64_t)bytes);
  const unsigned char *stage = raw.data;
  const int64_t *st = g->t.stride;
  int64_t i = 0;
  for (int64_t a = 0; a < g->shape[0]; ++a)
    for (int64_t b = 0; b < g->shape[1]; ++b)
      for (int64_t c = 0; c < g->shape[2]; ++c)
        for (int64_t d = 0; d < g->shape[3]; ++d, ++i)
          memcpy((unsigned char *)h.data + (size_t)i * g->es,
                 stage + (size_t)(a * st[0] + b * st[1] + c * st[2] + d * st[3]) * g->es, g->es);
  tu_buf_free(&raw);
  return h;
}

static void g_free(gtensor *g) {
  if (g->t.data != NULL) cudaFree(g->t.data);
  g->t.data = NULL;
}

static void g_poison(const gtensor *g) {
  if (g->t.data != NULL && g->span > 0)
    TU_CUDA_CHECK(cudaMemset(g->t.data, 0xff, (size_t)g->span * g->es));
}

/* A plan of the cudnn implementation under configuration config, or NULL. A deterministic
 * configuration cuDNN cannot run here (too old for this GPU) is UNSUPPORTED with a reason naming
 * it: that is printed, not failed. */
static attn_plan *cudnn_plan(const char *name, const attn_problem *p, const char *config) {
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = "cudnn", sel.config = config;
  attn_plan *plan = NULL;
  attn_status s = attn_plan_create(ctx, p, &sel, &plan);
  const char *why = attn_ctx_last_error(ctx);
  if (s == ATTN_STATUS_UNSUPPORTED && strstr(why, "config deterministic") != NULL)
    printf("%s [%s]: not run: %s\n", name, config, why);
  else
    tu_check(s == ATTN_STATUS_OK, "%s [%s]: plan: %s %s", name, config, attn_status_string(s), why);
  return s == ATTN_STATUS_OK ? plan : NULL;
}

/* The plan (of context pctx) on the device: forward, then backward unless c->no_lse; with `again`,
 * the backward pass a second time, on the same inputs, into gradients poisoned anew. name labels
 * the failures. Returns 0 when a call failed (reported). */
static int run_plan(const char *name, const hcase *c, attn_ctx *pctx, attn_plan *plan, results *r,
                    results *again) {
  const attn_problem *p = &c->p;
  memset(r, 0, sizeof *r);
  if (again != NULL) memset(again, 0, sizeof *again);
  attn_status s;
  tu_gpu_exec exec = tu_gpu_exec_create(plan);

  gtensor q = g_alloc(p, ATTN_ROLE_Q, c->bhsd, &c->q), k = g_alloc(p, ATTN_ROLE_K, c->bhsd, &c->k),
          v = g_alloc(p, ATTN_ROLE_V, c->bhsd, &c->v);
  gtensor bias = {0}, alibi = {0}, out = g_alloc(p, ATTN_ROLE_OUT, c->bhsd, NULL), lse = {0};
  if (p->has_bias) bias = g_alloc(p, ATTN_ROLE_BIAS, 0, &c->bias);
  if (p->alibi) alibi = g_alloc(p, ATTN_ROLE_ALIBI, 0, &c->alibi);
  if (!c->no_lse) lse = g_alloc(p, ATTN_ROLE_LSE, 0, NULL);
  int32_t *seq = NULL;
  attn_inputs in;
  attn_inputs_init(&in);
  in.q = q.t, in.k = k.t, in.v = v.t, in.bias = bias.t, in.alibi_slopes = alibi.t;
  if (p->varlen == ATTN_VARLEN_PADDED) {
    TU_CUDA_CHECK(cudaMalloc((void **)&seq, 2 * 64 * sizeof(int32_t)));
    TU_CUDA_CHECK(cudaMemcpy(seq, c->seqlens_q, (size_t)p->batch * 4, cudaMemcpyHostToDevice));
    TU_CUDA_CHECK(cudaMemcpy(seq + 64, c->seqlens_k, (size_t)p->batch * 4, cudaMemcpyHostToDevice));
    in.seqlens_q = seq, in.seqlens_k = seq + 64;
  }
  attn_outputs o;
  attn_outputs_init(&o);
  o.out = out.t, o.lse = lse.t;
  int ok = 1;
  s = attn_plan_forward(plan, &in, exec.workspace, exec.workspace_size, &o);
  TU_CUDA_CHECK(cudaStreamSynchronize(exec.stream));
  tu_check(s == ATTN_STATUS_OK, "%s: forward: %s %s", name, attn_status_string(s),
           attn_ctx_last_error(pctx));
  ok = s == ATTN_STATUS_OK;
  r->out = g_fetch(&out, (attn_dtype)p->dtype);
  if (!c->no_lse) r->lse = g_fetch(&lse, ATTN_DTYPE_F32);

  gtensor dout = {0}, dq = {0}, dk = {0}, dv = {0}, dbias = {0};
  if (ok && !c->no_lse) {
    dout = g_alloc(p, ATTN_ROLE_DOUT, c->bhsd, &c->dout);
    dq = g_alloc(p, ATTN_ROLE_DQ, c->bhsd, NULL);
    dk = g_alloc(p, ATTN_ROLE_DK, c->bhsd, NULL);
    dv = g_alloc(p, ATTN_ROLE_DV, c->bhsd, NULL);
    if (c->want_dbias) dbias = g_alloc(p, ATTN_ROLE_DBIAS, 0, NULL);
    attn_grads g;
    attn_grads_init(&g);
    g.dq = dq.t, g.dk = dk.t, g.dv = dv.t, g.dbias = dbias.t;
    results *runs[2] = {r, again};
    for (int run = 0; run < 2 && ok && runs[run] != NULL; ++run) {
      results *into = runs[run];
      if (run > 0) g_poison(&dq), g_poison(&dk), g_poison(&dv), g_poison(&dbias);
      s = attn_plan_backward(plan, &in, &o, &dout.t, exec.workspace, exec.workspace_size, &g);
      TU_CUDA_CHECK(cudaStreamSynchronize(exec.stream));
      tu_check(s == ATTN_STATUS_OK, "%s: backward: %s %s", name, attn_status_string(s),
               attn_ctx_last_error(pctx));
      ok = s == ATTN_STATUS_OK;
      into->dq = g_fetch(&dq, (attn_dtype)p->dtype);
      into->dk = g_fetch(&dk, (attn_dtype)p->dtype);
      into->dv = g_fetch(&dv, (attn_dtype)p->dtype);
      if (c->want_dbias) into->dbias = g_fetch(&dbias, (attn_dtype)p->dtype);
    }
  }
  g_free(&q), g_free(&k), g_free(&v), g_free(&bias), g_free(&alibi), g_free(&out), g_free(&lse);
  g_free(&dout), g_free(&dq), g_free(&dk), g_free(&dv), g_free(&dbias);
  if (seq != NULL) cudaFree(seq);
  tu_gpu_exec_destroy(&exec);
  return ok;
}

/* The configurations every case runs under (src/impl/cudnn/cudnn.c). */
static const char *const cudnn_configs[] = {"atomic", "deterministic"};

/* One case: the f64 and naive references on the host, then the implementation on the device under
 * each configuration, or with `given` alone (a plan of pctx) when not NULL. */
static void check_case(hcase *c, attn_ctx *pctx, attn_plan *given) {
  results exact, naive, gpu;
  int have_exact = c->e_out == NULL;
  if (have_exact && !run_ref(c, ATTN_DTYPE_F64, 0, &exact)) {
    tu_check(0, "%s: f64 reference", c->name);
    return;
  }
  if (!run_ref(c, (attn_dtype)c->p.dtype, 1, &naive)) {
    tu_check(0, "%s: naive reference", c->name);
    if (have_exact) results_free(&exact);
    return;
  }
  const double *e_out = have_exact ? exact.out.data : c->e_out;
  const double *e_lse = have_exact ? exact.lse.data : c->e_lse;
  const double *e_dq = have_exact ? exact.dq.data : c->e_dq;
  const double *e_dk = have_exact ? exact.dk.data : c->e_dk;
  const double *e_dv = have_exact ? exact.dv.data : c->e_dv;
  const double *e_dbias = have_exact ? exact.dbias.data : c->e_dbias;
  int nruns = given != NULL ? 1 : (int)(sizeof cudnn_configs / sizeof cudnn_configs[0]);
  for (int i = 0; i < nruns; ++i) {
    attn_plan *plan = given != NULL ? given : cudnn_plan(c->name, &c->p, cudnn_configs[i]);
    if (plan == NULL) continue;
    char name[176];
    snprintf(name, sizeof name, "%s [%s %s]", c->name, attn_plan_impl_name(plan),
             attn_plan_config_name(plan));
    if (run_plan(name, c, given != NULL ? pctx : ctx, plan, &gpu, NULL)) {
      tu_gpu_check_close(name, "out", TOL_FORWARD, &gpu.out, &naive.out, NULL, NULL, e_out);
      if (!c->no_lse) {
        tu_gpu_check_close(name, "lse", TOL_FORWARD, &gpu.lse, &naive.lse, NULL, NULL, e_lse);
        tu_gpu_check_close(name, "dq", TOL_GRADIENT, &gpu.dq, &naive.dq, NULL, NULL, e_dq);
        tu_gpu_check_close(name, "dk", TOL_GRADIENT, &gpu.dk, &naive.dk, NULL, NULL, e_dk);
        tu_gpu_check_close(name, "dv", TOL_GRADIENT, &gpu.dv, &naive.dv, NULL, NULL, e_dv);
        if (c->want_dbias)
          tu_gpu_check_close(name, "dbias", TOL_GRADIENT, &gpu.dbias, &naive.dbias, NULL, NULL, e_dbias);
      }
    }
    results_free(&gpu);
    if (plan != given) attn_plan_destroy(plan);
  }
  results_free(&naive);
  if (have_exact) results_free(&exact);
}

/* ---- the random grid ------------------------------------------------------------------------ */

static tu_rng rng;

static void fill(hcase *c) {
  const attn_problem *p = &c->p;
  attn_dtype dt = (attn_dtype)p->dtype;
  c->q = role_buf(p, ATTN_ROLE_Q, dt), tu_fill_uniform(&c->q, &rng, -1.0, 1.0);
  c->k = role_buf(p, ATTN_ROLE_K, dt), tu_fill_uniform(&c->k, &rng, -1.0, 1.0);
  c->v = role_buf(p, ATTN_ROLE_V, dt), tu_fill_uniform(&c->v, &rng, -1.0, 1.0);
  c->dout = role_buf(p, ATTN_ROLE_DOUT, dt), tu_fill_uniform(&c->dout, &rng, -1.0, 1.0);
  c->bias = tu_buf_new(dt, p->has_bias ? attn_role_numel(p, ATTN_ROLE_BIAS) : 0);
  tu_fill_uniform(&c->bias, &rng, -2.0, 2.0);
  c->alibi = tu_buf_new(ATTN_DTYPE_F32, p->alibi ? attn_role_numel(p, ATTN_ROLE_ALIBI) : 0);
  tu_fill_uniform(&c->alibi, &rng, 0.05, 0.5);
}

static void hcase_free(hcase *c) {
  tu_buf_free(&c->q), tu_buf_free(&c->k), tu_buf_free(&c->v), tu_buf_free(&c->dout);
  tu_buf_free(&c->bias), tu_buf_free(&c->alibi);
  free(c->e_out), free(c->e_lse), free(c->e_dq), free(c->e_dk), free(c->e_dv), free(c->e_dbias);
}

static void with_bias(attn_problem *p, int64_t b0, int64_t b1) {
  p->has_bias = 1;
  p->bias_dtype = p->dtype;
  p->bias_shape[0] = b0, p->bias_shape[1] = b1;
  p->bias_shape[2] = p->seqlen_q, p->bias_shape[3] = p->seqlen_k;
}

static void run_random(const char *name, attn_problem p, int bhsd, int no_lse, int want_dbias,
                       const int32_t *lq, const int32_t *lk) {
  hcase c;
  memset(&c, 0, sizeof c);
  snprintf(c.name, sizeof c.name, "%s %s", name, attn_dtype_name((attn_dtype)p.dtype));
  c.p = p;
  c.bhsd = bhsd, c.no_lse = no_lse, c.want_dbias = want_dbias;
  if (lq != NULL)
    for (int64_t b = 0; b < p.batch; ++b) c.seqlens_q[b] = lq[b], c.seqlens_k[b] = lk[b];
  attn_status s = attn_impl_supports(ctx, "cudnn", &p);
  tu_check(s == ATTN_STATUS_OK, "%s: supported (%s)", c.name, attn_ctx_last_error(ctx));
  if (s == ATTN_STATUS_OK) {
    fill(&c);
    check_case(&c, NULL, NULL);
  }
  hcase_free(&c);
}

static void test_grid(int quick) {
  const attn_dtype BF = ATTN_DTYPE_BF16, F16 = ATTN_DTYPE_F16;
  attn_problem p;
  p = tu_gpu_problem(2, 128, 128, 4, 4, 64, BF);
  run_random("basic 2x128x128 h4 d64", p, 0, 0, 0, NULL, NULL);
  p = tu_gpu_problem(1, 17, 63, 2, 2, 64, F16);
  run_random("odd 17x63 d64", p, 0, 0, 0, NULL, NULL);
  p = tu_gpu_problem(2, 65, 129, 3, 3, 32, BF), p.causal = 1;
  run_random("causal bottom-right 65x129", p, 0, 0, 0, NULL, NULL);
  if (quick) return;
  p = tu_gpu_problem(2, 65, 129, 3, 3, 32, F16), p.causal = 1, p.align = ATTN_ALIGN_TOP_LEFT;
  run_random("causal top-left 65x129", p, 0, 0, 0, NULL, NULL);
  p = tu_gpu_problem(2, 127, 127, 2, 2, 128, BF), p.causal = 1;
  run_random("causal square 127 d128", p, 0, 0, 0, NULL, NULL);
  p = tu_gpu_problem(1, 129, 17, 2, 2, 64, F16);
  run_random("Tq > Tk 129x17", p, 0, 0, 0, NULL, NULL);
  p = tu_gpu_problem(2, 100, 40, 2, 2, 64, F16), p.causal = 1; /* the first 60 rows see no key */
  run_random("causal bottom-right Tq > Tk 100x40", p, 0, 0, 0, NULL, NULL);
  p = tu_gpu_problem(1, 90, 40, 2, 2, 64, BF), p.window_left = 5, p.align = ATTN_ALIGN_TOP_LEFT;
  run_random("window left 5 top-left 90x40", p, 0, 0, 0, NULL, NULL);
  p = tu_gpu_problem(2, 100, 130, 2, 2, 64, BF), p.window_left = 17, p.window_right = 5;
  run_random("window (17,5) bottom-right 100x130", p, 0, 0, 0, NULL, NULL);
  p = tu_gpu_problem(1, 129, 129, 2, 2, 64, F16), p.window_left = 31, p.align = ATTN_ALIGN_TOP_LEFT;
  run_random("window left 31 top-left 129", p, 0, 0, 0, NULL, NULL);
  p = tu_gpu_problem(1, 63, 127, 2, 2, 64, BF), p.window_left = 20, p.causal = 1;
  run_random("window causal left 20 63x127", p, 0, 0, 0, NULL, NULL);
  p = tu_gpu_problem(1, 40, 90, 2, 2, 64, F16), p.window_left = 3, p.window_right = 9,
  p.align = ATTN_ALIGN_TOP_LEFT;
  run_random("window (3,9) top-left 40x90", p, 0, 0, 0, NULL, NULL);
  p = tu_gpu_problem(2, 37, 45, 2, 2, 64, F16), with_bias(&p, 2, 2);
  run_random("bias [B,H,Tq,Tk] + dbias", p, 0, 0, 1, NULL, NULL);
  p = tu_gpu_problem(2, 64, 64, 4, 2, 64, BF), p.causal = 1, with_bias(&p, 1, 1);
  run_random("bias [1,1,..] causal gqa + dbias", p, 0, 0, 1, NULL, NULL);
  p = tu_gpu_problem(2, 50, 70, 3, 3, 64, BF), with_bias(&p, 1, 3);
  run_random("bias [1,H,..] + dbias", p, 0, 0, 1, NULL, NULL);
  p = tu_gpu_problem(2, 50, 70, 3, 3, 64, F16), with_bias(&p, 2, 1);
  run_random("bias [B,1,..] no dbias", p, 0, 0, 0, NULL, NULL);
  p = tu_gpu_problem(1, 200, 200, 8, 2, 64, F16), p.causal = 1;
  run_random("gqa 8/2 causal 200", p, 0, 0, 0, NULL, NULL);
  p = tu_gpu_problem(1, 77, 77, 6, 1, 64, BF);
  run_random("mqa 6/1 77", p, 0, 0, 0, NULL, NULL);
  p = tu_gpu_problem(1, 50, 50, 2, 2, 64, F16), p.scale = 0.3;
  run_random("scale 0.3", p, 0, 0, 0, NULL, NULL);
  p = tu_gpu_problem(1, 96, 96, 2, 2, 128, BF), p.head_dim_v = 64, p.causal = 1;
  run_random("d128 dv64 causal", p, 0, 0, 0, NULL, NULL);
  p = tu_gpu_problem(1, 64, 80, 2, 2, 256, F16);
  run_random("d256 64x80", p, 0, 0, 0, NULL, NULL);
  {
    int32_t lq[3] = {37, 9, 1}, lk[3] = {45, 20, 5};
    p = tu_gpu_problem(3, 37, 45, 2, 2, 64, BF), p.varlen = ATTN_VARLEN_PADDED, p.causal = 1;
    run_random("padded varlen causal", p, 0, 0, 0, lq, lk);
    int32_t lq2[4] = {30, 1, 17, 29}, lk2[4] = {50, 33, 64, 2};
    p = tu_gpu_problem(4, 30, 64, 2, 1, 64, F16), p.varlen = ATTN_VARLEN_PADDED;
    run_random("padded varlen gqa", p, 0, 0, 0, lq2, lk2);
    int32_t lq3[2] = {40, 11}, lk3[2] = {64, 60};
    p = tu_gpu_problem(2, 40, 64, 2, 2, 64, BF), p.varlen = ATTN_VARLEN_PADDED, p.window_left = 8,
    p.causal = 1;
    run_random("padded varlen window 8 causal", p, 0, 0, 0, lq3, lk3);
    /* Rows that see no key (len_q > len_k under a bottom-right causal mask; len_k = 0): SPEC.md
     * wants out 0, lse -inf and zero gradients there. */
    int32_t lq4[3] = {40, 30, 12}, lk4[3] = {40, 10, 0};
    p = tu_gpu_problem(3, 40, 40, 2, 2, 64, F16), p.varlen = ATTN_VARLEN_PADDED, p.causal = 1;
    run_random("padded varlen, rows without keys", p, 0, 0, 0, lq4, lk4);
    p = tu_gpu_problem(3, 40, 40, 2, 2, 64, BF), p.varlen = ATTN_VARLEN_PADDED;
    run_random("padded varlen, a sequence without keys", p, 0, 0, 0, lq4, lk4);
  }
  p = tu_gpu_problem(2, 64, 64, 4, 4, 64, BF), p.causal = 1, p.alibi = ATTN_ALIBI_PER_HEAD;
  run_random("alibi causal 64", p, 0, 0, 0, NULL, NULL);
  p = tu_gpu_problem(2, 1, 77, 8, 2, 64, F16), p.causal = 1;
  run_random("decode 1x77 gqa causal", p, 0, 0, 0, NULL, NULL);
  p = tu_gpu_problem(1, 1000, 1000, 2, 2, 64, BF), p.causal = 1;
  run_random("long causal 1000", p, 0, 0, 0, NULL, NULL);
  p = tu_gpu_problem(2, 96, 96, 4, 2, 64, F16), p.causal = 1;
  run_random("strided [B,H,T,D] layout", p, 1, 0, 0, NULL, NULL);
  p = tu_gpu_problem(2, 63, 65, 2, 2, 64, BF),
  p.operation = ATTN_OPERATION_SCALED_DOT_PRODUCT_ATTENTION;
  run_random("sdpa operation, no lse", p, 0, 1, 0, NULL, NULL);
}

/* ---- determinism ----------------------------------------------------------------------------- */

static int same_bits(const tu_buf *a, const tu_buf *b) {
  return a->n == b->n && a->dtype == b->dtype &&
         memcmp(a->data, b->data, (size_t)a->n * attn_dtype_size(a->dtype)) == 0;
}

/* Every configuration the implementation declares deterministic for a problem
 * (attn_impl.config_deterministic) gives the same bits of dq, dk, dv (and dbias) when its backward
 * pass runs twice on the same inputs. The problems are large enough (1000 keys per head, 16 or more
 * heads' worth of CTAs) that cuDNN spreads each head's keys over many CTAs, where an order of
 * additions that depends on timing would show. Whether the other configurations repeated their bits
 * is printed, not required. */
static void test_determinism(void) {
  const attn_impl *impl = attn_registry_find("cudnn");
  const attn_dtype BF = ATTN_DTYPE_BF16;
  attn_problem ps[4];
  const char *names[4] = {"determinism b2 h8 t1000 d128", "determinism b2 h8 t1000 d128 causal",
                          "determinism b2 h8/2 t1000 d128 causal gqa",
                          "determinism b2 h8 t1000 d128 bias [B,H,T,T] + dbias"};
  ps[0] = tu_gpu_problem(2, 1000, 1000, 8, 8, 128, BF);
  ps[1] = ps[0], ps[1].causal = 1;
  ps[2] = tu_gpu_problem(2, 1000, 1000, 8, 2, 128, BF), ps[2].causal = 1;
  ps[3] = ps[0], with_bias(&ps[3], 2, 8);
  for (int i = 0; i < 4; ++i) {
    hcase c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "%s", names[i]);
    c.p = ps[i];
    c.want_dbias = c.p.has_bias;
    attn_status s = attn_impl_supports(ctx, "cudnn", &c.p);
    tu_check(s == ATTN_STATUS_OK, "%s: supported (%s)", c.name, attn_ctx_last_error(ctx));
    if (s != ATTN_STATUS_OK) continue;
    fill(&c);
    for (int32_t config = 0; config < impl->num_configs(&c.p); ++config) {
      char config_name[64];
      impl->config_name(&c.p, config, config_name, sizeof config_name);
      int declared = impl->config_deterministic == NULL || impl->config_deterministic(&c.p, config);
      attn_plan *plan = cudnn_plan(c.name, &c.p, config_name);
      if (plan == NULL) continue;
      char name[176];
      snprintf(name, sizeof name, "%s [%s]", c.name, config_name);
      results first, second;
      if (run_plan(name, &c, ctx, plan, &first, &second)) {
        int dq = same_bits(&first.dq, &second.dq), dk = same_bits(&first.dk, &second.dk);
        int dv = same_bits(&first.dv, &second.dv);
        int dbias = !c.want_dbias || same_bits(&first.dbias, &second.dbias);
        if (declared)
          tu_check(dq && dk && dv && dbias,
                   "%s: declared deterministic, a second backward pass gives the same bits (dq %d, "
                   "dk %d, dv %d, dbias %d)",
                   name, dq, dk, dv, dbias);
        else
          printf("%s: not declared deterministic; a second backward pass gave %s bits (dq %d, "
                 "dk %d, dv %d, dbias %d)\n",
                 name, dq && dk && dv && dbias ? "the same" : "other", dq, dk, dv, dbias);
      }
      results_free(&first);
      results_free(&second);
      attn_plan_destroy(plan);
    }
    hcase_free(&c);
  }
}

/* ---- the graph cache ------------------------------------------------------------------------- */

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* The cache lives in the module libattn_cudnn.so, which exports nothing but its table: the table's
 * test hooks reach it. */
static const attn_cudnn_test_hooks *cache_hooks(void) {
  const attn_module_table *t = attn_module_table_named("cudnn");
  if (t == NULL || t->test_hooks == NULL) {
    fprintf(stderr, "FATAL: the cudnn module is not loaded or has no test hooks\n");
    exit(1);
  }
  return (const attn_cudnn_test_hooks *)t->test_hooks;
}

static attn_cudnn_cache_stats cache_stats(void) {
  attn_cudnn_cache_stats s;
  cache_hooks()->cache_stats(&s);
  return s;
}

/* A plan of p timed on the wall clock, in *ms. */
static attn_plan *timed_plan(const char *name, const attn_problem *p, double *ms) {
  double t0 = now_ms();
  attn_plan *plan = cudnn_plan(name, p, "atomic");
  *ms = now_ms() - t0;
  return plan;
}

static void test_graph_cache(void) {
  const char *name = "graph cache gqa 8/2 causal 96x160 d64";
  attn_problem p = tu_gpu_problem(2, 96, 160, 8, 2, 64, ATTN_DTYPE_BF16);
  p.causal = 1;
  hcase c;
  memset(&c, 0, sizeof c);
  snprintf(c.name, sizeof c.name, "%s", name);
  c.p = p;
  fill(&c);

  attn_cudnn_cache_stats s0 = cache_stats();
  double first_ms, second_ms;
  attn_plan *first = timed_plan(name, &p, &first_ms);
  attn_cudnn_cache_stats s1 = cache_stats();
  attn_plan *second = timed_plan(name, &p, &second_ms);
  attn_cudnn_cache_stats s2 = cache_stats();
  printf("%s: plan creation: first %.1f ms (%llu graphs built), second %.3f ms (%llu built, %llu "
         "taken from the cache); cache bound %zu\n",
         name, first_ms, (unsigned long long)(s1.builds - s0.builds), second_ms,
         (unsigned long long)(s2.builds - s1.builds), (unsigned long long)(s2.hits - s1.hits),
         s2.capacity);
  if (first == NULL || second == NULL) {
    attn_plan_destroy(first), attn_plan_destroy(second), hcase_free(&c);
    return;
  }
  tu_check(s1.builds - s0.builds == 2,
           "%s: the first plan builds its forward and backward graphs "
           "(%llu built)",
           name, (unsigned long long)(s1.builds - s0.builds));
  tu_check(s2.builds == s1.builds && s2.hits - s1.hits == 2,
           "%s: the second plan builds nothing and takes both graphs from the cache (%llu built, "
           "%llu hits)",
           name, (unsigned long long)(s2.builds - s1.builds),
           (unsigned long long)(s2.hits - s1.hits));
  tu_check(second_ms * 4 < first_ms,
           "%s: the second plan takes a fraction of the first's time "
           "(%.3f ms against %.1f ms)",
           name, second_ms, first_ms);

  /* Both plans are right, and the shared forward graph gives both the same bits. */
  check_case(&c, ctx, first);
  check_case(&c, ctx, second);
  results r1, r2;
  if (run_plan(name, &c, ctx, first, &r1, NULL) && run_plan(name, &c, ctx, second, &r2, NULL))
    tu_check(same_bits(&r1.out, &r2.out) && same_bits(&r1.lse, &r2.lse),
             "%s: both plans give the same out and lse bits", name);
  results_free(&r1), results_free(&r2);

  /* A strided layout: the first plan builds its graphs at run time, the second shares them. */
  c.bhsd = 1;
  attn_cudnn_cache_stats s3 = cache_stats();
  check_case(&c, ctx, first);
  attn_cudnn_cache_stats s4 = cache_stats();
  check_case(&c, ctx, second);
  attn_cudnn_cache_stats s5 = cache_stats();
  tu_check(s4.builds - s3.builds == 2 && s5.builds == s4.builds && s5.hits - s4.hits == 2,
           "%s: a [B, H, T, D] layout's graphs are built once and shared (built %llu then %llu)",
           name, (unsigned long long)(s4.builds - s3.builds),
           (unsigned long long)(s5.builds - s4.builds));
  c.bhsd = 0;

  /* Bound 0: every graph leaves the cache at once, but the plans still hold and run theirs. */
  cache_hooks()->cache_set_capacity(0);
  attn_cudnn_cache_stats s6 = cache_stats();
  tu_check(s6.entries == 0 && s6.detached >= 4,
           "%s: bound 0 empties the cache; the plans' graphs stay alive (%zu entries, %zu held)",
           name, s6.entries, s6.detached);
  check_case(&c, ctx, first);
  c.bhsd = 1;
  check_case(&c, ctx, second);
  c.bhsd = 0;
  double third_ms;
  attn_plan *third = timed_plan(name, &p, &third_ms);
  attn_cudnn_cache_stats s7 = cache_stats();
  printf("%s: plan creation with bound 0 (a warm process builds both graphs): %.1f ms\n", name,
         third_ms);
  tu_check(s7.builds - s6.builds == 2, "%s: with bound 0 a new plan builds its own graphs (%llu)",
           name, (unsigned long long)(s7.builds - s6.builds));
  if (third != NULL) check_case(&c, ctx, third);
  attn_plan_destroy(first);
  check_case(&c, ctx, second); /* the graphs it shared with the destroyed plan are still there */
  attn_plan_destroy(second);
  attn_plan_destroy(third);
  attn_cudnn_cache_stats s8 = cache_stats();
  tu_check(s8.detached == 0 && s8.frees - s6.frees >= 6,
           "%s: the evicted graphs are freed with the last plan holding them (%zu held, %llu "
           "freed)",
           name, s8.detached, (unsigned long long)(s8.frees - s6.frees));
  cache_hooks()->cache_set_capacity(s0.capacity);
  hcase_free(&c);
}

/* One thread of test_graph_cache_threads: its own context and plan (sharing the cached graphs),
 * stream, workspace and copies of the inputs; 20 forward passes; the last out must equal `expect`
 * bit for bit. Failures go to why (tu_check is not thread-safe). */
typedef struct shared_graph_run {
  const hcase *c;
  const tu_buf *expect;
  int ok;
  char why[256];
} shared_graph_run;

static void *shared_graph_thread(void *arg) {
  shared_graph_run *r = arg;
  const attn_problem *p = &r->c->p;
  r->ok = 0;
  attn_ctx *tctx = NULL;
  if (attn_ctx_create(&tctx) != ATTN_STATUS_OK) {
    snprintf(r->why, sizeof r->why, "attn_ctx_create failed");
    return NULL;
  }
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = "cudnn", sel.config = "atomic";
  attn_plan *plan = NULL;
  if (attn_plan_create(tctx, p, &sel, &plan) != ATTN_STATUS_OK) {
    snprintf(r->why, sizeof r->why, "plan: %s", attn_ctx_last_error(tctx));
    attn_ctx_destroy(tctx);
    return NULL;
  }
  tu_gpu_exec exec = tu_gpu_exec_create(plan);
  gtensor q = g_alloc(p, ATTN_ROLE_Q, 0, &r->c->q), k = g_alloc(p, ATTN_ROLE_K, 0, &r->c->k),
          v = g_alloc(p, ATTN_ROLE_V, 0, &r->c->v), out = g_alloc(p, ATTN_ROLE_OUT, 0, NULL),
          lse = g_alloc(p, ATTN_ROLE_LSE, 0, NULL);
  attn_inputs in;
  attn_inputs_init(&in);
  in.q = q.t, in.k = k.t, in.v = v.t;
  attn_outputs o;
  attn_outputs_init(&o);
  o.out = out.t, o.lse = lse.t;
  attn_status st = ATTN_STATUS_OK;
  for (int i = 0; i < 20 && st == ATTN_STATUS_OK; ++i)
    st = attn_plan_forward(plan, &in, exec.workspace, exec.workspace_size, &o);
  TU_CUDA_CHECK(cudaStreamSynchronize(exec.stream));
  if (st != ATTN_STATUS_OK) {
    snprintf(r->why, sizeof r->why, "forward: %s", attn_ctx_last_error(tctx));
  } else {
    tu_buf got = g_fetch(&out, (attn_dtype)p->dtype);
    r->ok = same_bits(&got, r->expect);
    if (!r->ok) snprintf(r->why, sizeof r->why, "out differs from the single-threaded run's");
    tu_buf_free(&got);
  }
  g_free(&q), g_free(&k), g_free(&v), g_free(&out), g_free(&lse);
  tu_gpu_exec_destroy(&exec);
  attn_plan_destroy(plan);
  attn_ctx_destroy(tctx);
  return NULL;
}

static void test_graph_cache_threads(void) {
  const char *name = "graph cache, 4 threads sharing one graph, b2 h8/2 causal 200x200 d64";
  hcase c;
  memset(&c, 0, sizeof c);
  snprintf(c.name, sizeof c.name, "%s", name);
  c.p = tu_gpu_problem(2, 200, 200, 8, 2, 64, ATTN_DTYPE_BF16);
  c.p.causal = 1;
  c.no_lse = 1; /* forward only: the single-threaded run below */
  fill(&c);
  attn_plan *plan = cudnn_plan(name, &c.p, "atomic");
  results single;
  if (plan == NULL || !run_plan(name, &c, ctx, plan, &single, NULL)) {
    attn_plan_destroy(plan);
    hcase_free(&c);
    return;
  }
  attn_cudnn_cache_stats before = cache_stats();
  enum { NTHREADS = 4 };
  pthread_t threads[NTHREADS];
  shared_graph_run runs[NTHREADS];
  for (int i = 0; i < NTHREADS; ++i) {
    memset(&runs[i], 0, sizeof runs[i]);
    runs[i].c = &c, runs[i].expect = &single.out;
    pthread_create(&threads[i], NULL, shared_graph_thread, &runs[i]);
  }
  for (int i = 0; i < NTHREADS; ++i) {
    pthread_join(threads[i], NULL);
    tu_check(runs[i].ok, "%s: thread %d: %s", name, i, runs[i].ok ? "same bits" : runs[i].why);
  }
  attn_cudnn_cache_stats after = cache_stats();
  tu_check(after.builds == before.builds && after.hits - before.hits >= NTHREADS,
           "%s: the threads' plans built nothing (%llu built, %llu hits)", name,
           (unsigned long long)(after.builds - before.builds),
           (unsigned long long)(after.hits - before.hits));
  results_free(&single);
  attn_plan_destroy(plan);
  hcase_free(&c);
}

/* ---- the executor across implementations ----------------------------------------------------- */

/* Autotuning (forward + backward) a bf16 causal GQA problem that both GPU implementations run times
 * the configurations of cudnn and of cuda on the device, plans the winner, and the winner's plan
 * passes the reference check. No cache file is touched. (test_cuda leaves cudnn out of its own
 * autotuning because it runs under racecheck; this test runs under memcheck only.) */
static void test_autotune(void) {
  const char *name = "autotune cudnn and cuda";
  attn_problem p = tu_gpu_problem(2, 256, 256, 8, 2, 64, ATTN_DTYPE_BF16);
  p.causal = 1;
  if (attn_impl_supports(ctx, "cuda", &p) != ATTN_STATUS_OK) {
    printf("%s: not run (cuda: %s)\n", name, attn_ctx_last_error(ctx));
    return;
  }
  attn_ctx *tctx = NULL;
  if (attn_ctx_create(&tctx) != ATTN_STATUS_OK) exit(1);
  attn_policy pol;
  attn_policy_init(&pol);
  pol.on_miss = ATTN_ON_MISS_AUTOTUNE, pol.cache_path = "", pol.tune_backward = 1;
  pol.warmup_iters = 1, pol.measure_iters = 5;
  attn_ctx_set_policy(tctx, &pol);
  tu_tune_log log;
  memset(&log, 0, sizeof log);
  attn_ctx_set_event_callback(tctx, tu_gpu_on_tune_event, &log);
  attn_plan *plan = NULL;
  attn_status s = attn_plan_create(tctx, &p, NULL, &plan);
  tu_check(s == ATTN_STATUS_OK, "%s: plan: %s %s", name, attn_status_string(s),
           attn_ctx_last_error(tctx));
  /* cudnn's deterministic configuration is a candidate that fails where cuDNN has none (printed) */
  attn_plan *deterministic = cudnn_plan(name, &p, "deterministic");
  int cudnn_configs_run = deterministic != NULL ? 2 : 1;
  attn_plan_destroy(deterministic);
  int32_t cuda_configs = 0; /* 2, and "sm90" on an H100 / H200 */
  tu_check(attn_impl_config_count(ctx, "cuda", &p, &cuda_configs) == ATTN_STATUS_OK && cuda_configs >= 2,
           "%s: cuda's configurations counted (%d)", name, (int)cuda_configs);
  int by_cudnn = tu_tune_log_measured(&log, "cudnn"), by_cuda = tu_tune_log_measured(&log, "cuda");
  tu_check(log.starts == 1 && log.finishes == 1 && by_cudnn == cudnn_configs_run && by_cuda == cuda_configs &&
               log.measured + log.failed == 2 + cuda_configs,
           "%s: the configurations of both implementations timed on the device (cudnn %d of %d, "
           "cuda %d of %d, %d failed, %d tunings)",
           name, by_cudnn, cudnn_configs_run, by_cuda, (int)cuda_configs, log.failed, log.starts);
  if (plan != NULL) {
    tu_check(strcmp(attn_plan_impl_name(plan), log.impl) == 0 &&
                 strcmp(attn_plan_config_name(plan), log.config) == 0,
             "%s: the plan runs the winner %s %s (plan: %s %s)", name, log.impl, log.config,
             attn_plan_impl_name(plan), attn_plan_config_name(plan));
    hcase c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "%s, the winner", name);
    c.p = p;
    fill(&c);
    check_case(&c, tctx, plan);
    hcase_free(&c);
  }
  attn_plan_destroy(plan);
  attn_ctx_destroy(tctx);
}

/* ---- run-time refusals and the empty problem ------------------------------------------------- */

static void test_run_checks(void) {
  attn_problem p = tu_gpu_problem(1, 32, 32, 2, 2, 64, ATTN_DTYPE_BF16);
  p.operation = ATTN_OPERATION_SCALED_DOT_PRODUCT_ATTENTION;
  attn_plan *plan = NULL;
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = "cudnn";
  if (attn_plan_create(ctx, &p, &sel, &plan) != ATTN_STATUS_OK) {
    tu_check(0, "run checks: plan: %s", attn_ctx_last_error(ctx));
    return;
  }
  size_t fw = 0;
  attn_plan_workspace_size(plan, &fw, NULL);
  void *ws = NULL, *buf = NULL;
  TU_CUDA_CHECK(cudaMalloc(&ws, fw > 0 ? fw : 1));
  TU_CUDA_CHECK(cudaMalloc(&buf, 1 << 20));
  char *b = buf;
  attn_inputs in;
  attn_inputs_init(&in);
  in.q = attn_tensor_dense(b), in.k = attn_tensor_dense(b + 65536),
  in.v = attn_tensor_dense(b + 131072);
  attn_outputs o;
  attn_outputs_init(&o);
  o.out = attn_tensor_dense(b + 262144);
  o.probs = attn_tensor_dense(b + 393216);
  attn_status s = attn_plan_forward(plan, &in, ws, fw, &o);
  tu_check(s == ATTN_STATUS_UNSUPPORTED && strstr(attn_ctx_last_error(ctx), "probs") != NULL,
           "probs requested: %s \"%s\"", attn_status_string(s), attn_ctx_last_error(ctx));
  o.probs.data = NULL;
  in.q.data = b + 2; /* misaligned */
  s = attn_plan_forward(plan, &in, ws, fw, &o);
  tu_check(s == ATTN_STATUS_UNSUPPORTED && strstr(attn_ctx_last_error(ctx), "aligned") != NULL,
           "misaligned q: %s \"%s\"", attn_status_string(s), attn_ctx_last_error(ctx));
  attn_plan_destroy(plan);

  /* Tq = 0: nothing to write forward; dk and dv are zero backward. */
  p = tu_gpu_problem(1, 0, 40, 2, 2, 64, ATTN_DTYPE_F16);
  s = attn_plan_create(ctx, &p, &sel, &plan);
  tu_check(s == ATTN_STATUS_OK, "empty problem: plan: %s", attn_ctx_last_error(ctx));
  if (s == ATTN_STATUS_OK) {
    TU_CUDA_CHECK(cudaMemset(buf, 0xff, 1 << 20));
    attn_inputs_init(&in);
    in.k = attn_tensor_dense(b), in.v = attn_tensor_dense(b + 65536);
    attn_outputs_init(&o);
    attn_tensor dout = {NULL, {0, 0, 0, 0}};
    attn_grads g;
    attn_grads_init(&g);
    g.dk = attn_tensor_dense(b + 131072), g.dv = attn_tensor_dense(b + 262144);
    s = attn_plan_forward(plan, &in, ws, fw, &o);
    tu_check(s == ATTN_STATUS_OK, "empty problem forward: %s", attn_ctx_last_error(ctx));
    size_t bw = 0;
    attn_plan_workspace_size(plan, NULL, &bw);
    s = attn_plan_backward(plan, &in, &o, &dout, ws, bw, &g);
    uint16_t dk[2 * 40 * 64];
    TU_CUDA_CHECK(cudaMemcpy(dk, b + 131072, sizeof dk, cudaMemcpyDeviceToHost));
    int zero = 1;
    for (size_t i = 0; i < sizeof dk / 2; ++i) zero &= dk[i] == 0;
    tu_check(s == ATTN_STATUS_OK && zero, "empty problem backward: %s, dk zero: %d",
             attn_ctx_last_error(ctx), zero);
    attn_plan_destroy(plan);
  }
  cudaFree(ws);
  cudaFree(buf);
}

/* ---- golden cases ---------------------------------------------------------------------------- */

static double *read_f64(const char *dir, const char *file, int64_t n) {
  char path[1200];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  size_t size = 0;
  double *d = tu_read_file(path, &size);
  if (d != NULL && size != (size_t)n * sizeof(double)) {
    free(d);
    d = NULL;
  }
  return d;
}

static tu_buf read_f32(const char *dir, const char *file, int64_t n, attn_dtype to) {
  char path[1200];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  size_t size = 0;
  float *f = tu_read_file(path, &size);
  tu_buf b = tu_buf_new(to, n);
  if (f != NULL && size == (size_t)n * sizeof(float))
    for (int64_t i = 0; i < n; ++i) tu_set(&b, i, f[i]);
  free(f);
  return b;
}

/* Parses case.txt into c->p (dtype set by the caller after); returns 0 when unreadable. */
static int parse_case(const char *dir, hcase *c, int *has_dbias) {
  char path[1200];
  snprintf(path, sizeof path, "%s/case.txt", dir);
  FILE *f = fopen(path, "r");
  if (f == NULL) return 0;
  attn_problem *p = &c->p;
  attn_problem_init(p);
  p->device = ATTN_DEVICE_CUDA;
  *has_dbias = 0;
  char line[4096];
  while (fgets(line, sizeof line, f) != NULL) {
    char key[64];
    int off = 0;
    if (sscanf(line, "%63s %n", key, &off) != 1) continue;
    const char *v = line + off;
    long long a[4] = {0, 0, 0, 0};
    int n = sscanf(v, "%lld %lld %lld %lld", &a[0], &a[1], &a[2], &a[3]);
    if (!strcmp(key, "name"))
      snprintf(c->name, sizeof c->name, "golden %.60s", v);
    else if (!strcmp(key, "B"))
      p->batch = a[0];
    else if (!strcmp(key, "Tq"))
      p->seqlen_q = a[0];
    else if (!strcmp(key, "Tk"))
      p->seqlen_k = a[0];
    else if (!strcmp(key, "Hq"))
      p->heads_q = a[0];
    else if (!strcmp(key, "Hkv"))
      p->heads_kv = a[0];
    else if (!strcmp(key, "D"))
      p->head_dim = a[0];
    else if (!strcmp(key, "Dv"))
      p->head_dim_v = a[0];
    else if (!strcmp(key, "scale"))
      p->scale = strtod(v, NULL);
    else if (!strcmp(key, "causal"))
      p->causal = (int32_t)a[0];
    else if (!strcmp(key, "align"))
      p->align = strncmp(v, "top_left", 8) == 0;
    else if (!strcmp(key, "window_left"))
      p->window_left = a[0];
    else if (!strcmp(key, "window_right"))
      p->window_right = a[0];
    else if (!strcmp(key, "softcap"))
      p->softcap = strtod(v, NULL);
    else if (!strcmp(key, "dropout_p"))
      p->dropout_p = strtod(v, NULL);
    else if (!strcmp(key, "varlen"))
      p->varlen = !strncmp(v, "packed", 6)   ? ATTN_VARLEN_PACKED
                  : !strncmp(v, "padded", 6) ? ATTN_VARLEN_PADDED
                                             : ATTN_VARLEN_NONE;
    else if (!strcmp(key, "seqlens_q") || !strcmp(key, "seqlens_k")) {
      int32_t *dst = key[8] == 'q' ? c->seqlens_q : c->seqlens_k;
      char *s = (char *)v;
      for (int i = 0; i < 64; ++i) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s) break;
        dst[i] = (int32_t)x;
        s = end;
      }
    } else if (!strcmp(key, "bias_shape") && n == 4) {
      p->has_bias = 1;
      for (int i = 0; i < 4; ++i) p->bias_shape[i] = a[i];
    } else if (!strcmp(key, "mask_shape"))
      p->has_mask = 1;
    else if (!strcmp(key, "alibi_shape"))
      p->alibi = n == 1 ? ATTN_ALIBI_PER_HEAD : ATTN_ALIBI_PER_BATCH_HEAD;
    else if (!strcmp(key, "sinks_shape"))
      p->num_sinks = n == 1 ? a[0] : a[1];
    else if (!strcmp(key, "files"))
      *has_dbias = strstr(v, "dbias.f64") != NULL;
    else if (!strcmp(key, "cu_seqlens_q"))
      p->varlen = ATTN_VARLEN_PACKED;
  }
  fclose(f);
  char *nl = strchr(c->name, '\n');
  if (nl != NULL) *nl = '\0';
  if (p->varlen == ATTN_VARLEN_PACKED) p->total_q = p->total_k = 1; /* refused anyway */
  return 1;
}

/* Cases whose every feature cuDNN runs: each must be supported and pass. */
static const char *const golden_supported[] = {"alibi",           "basic",
                                               "bias_broadcast",  "bias_full",
                                               "causal_q_longer", "causal_q_shorter",
                                               "causal_square",   "causal_top_left",
                                               "cross_len",       "decode_one_query",
                                               "dv_differs",      "gqa",
                                               "head_dim_128",    "head_dim_80",
                                               "long_causal",     "mqa",
                                               "scale_custom",    "varlen_padded",
                                               "window_causal",   "window_diagonal",
                                               "window_two_sided"};

static void test_golden(const char *root) {
  int nsup = (int)(sizeof golden_supported / sizeof golden_supported[0]);
  for (int i = 0; i < nsup; ++i) {
    char dir[900];
    snprintf(dir, sizeof dir, "%s/%s", root, golden_supported[i]);
    for (int t = 0; t < 2; ++t) {
      hcase c;
      memset(&c, 0, sizeof c);
      int has_dbias = 0;
      if (!parse_case(dir, &c, &has_dbias)) {
        tu_check(0, "golden %s: cannot read %s/case.txt", golden_supported[i], dir);
        break;
      }
      attn_dtype dt = t == 0 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F16;
      attn_problem *p = &c.p;
      p->dtype = dt;
      if (p->has_bias) p->bias_dtype = dt;
      char base[96];
      snprintf(base, sizeof base, "%s", c.name);
      snprintf(c.name, sizeof c.name, "%.80s %s", base, attn_dtype_name(dt));
      attn_status s = attn_impl_supports(ctx, "cudnn", p);
      tu_check(s == ATTN_STATUS_OK, "%s: supported (%s)", c.name, attn_ctx_last_error(ctx));
      if (s != ATTN_STATUS_OK) {
        hcase_free(&c);
        continue;
      }
      c.q = read_f32(dir, "q.f32", attn_role_numel(p, ATTN_ROLE_Q), dt);
      c.k = read_f32(dir, "k.f32", attn_role_numel(p, ATTN_ROLE_K), dt);
      c.v = read_f32(dir, "v.f32", attn_role_numel(p, ATTN_ROLE_V), dt);
      c.dout = read_f32(dir, "dout.f32", attn_role_numel(p, ATTN_ROLE_DOUT), dt);
      c.bias = p->has_bias ? read_f32(dir, "bias.f32", attn_role_numel(p, ATTN_ROLE_BIAS), dt)
                           : tu_buf_new(dt, 0);
      c.alibi =
          p->alibi ? read_f32(dir, "alibi.f32", attn_role_numel(p, ATTN_ROLE_ALIBI), ATTN_DTYPE_F32)
                   : tu_buf_new(ATTN_DTYPE_F32, 0);
      c.want_dbias = has_dbias;
      c.e_out = read_f64(dir, "out.f64", attn_role_numel(p, ATTN_ROLE_OUT));
      c.e_lse = read_f64(dir, "lse.f64", attn_role_numel(p, ATTN_ROLE_LSE));
      c.e_dq = read_f64(dir, "dq.f64", attn_role_numel(p, ATTN_ROLE_DQ));
      c.e_dk = read_f64(dir, "dk.f64", attn_role_numel(p, ATTN_ROLE_DK));
      c.e_dv = read_f64(dir, "dv.f64", attn_role_numel(p, ATTN_ROLE_DV));
      if (has_dbias) c.e_dbias = read_f64(dir, "dbias.f64", attn_role_numel(p, ATTN_ROLE_DBIAS));
      int complete = c.e_out && c.e_lse && c.e_dq && c.e_dk && c.e_dv && (!has_dbias || c.e_dbias);
      tu_check(complete, "%s: expected arrays readable", c.name);
      if (complete) check_case(&c, NULL, NULL);
      hcase_free(&c);
    }
  }
}

/* ---- fp8 (e4m3) forward ------------------------------------------------------------------------ */

/* Problems of cuDNN's fp8 graph: odd sizes, causal both alignments (bottom-right with rows that
 * see no key too), GQA and MQA, factors per tensor and none, out bf16 and f16 (the same shape with
 * both: the graph cache must tell them apart), D 64, 128 and 192 with Dv 128. */
static const char *const fp8_problems[] = {
    "b2 hq4 hkv4 sq128 sk128 d64 fp8 descale=tensor",
    "b2 hq4 hkv4 sq128 sk128 d64 fp8 descale=tensor out=f16",
    "b1 hq3 hkv3 sq17 sk63 d64 fp8",
    "b2 hq4 hkv1 sq65 sk129 d128 fp8 descale=tensor causal",
    "b2 hq6 hkv2 sq129 sk65 d128 fp8 descale=tensor causal align=tl out=f16",
    "b1 hq2 hkv2 sq100 sk40 d64 fp8 descale=tensor causal",
    "b3 hq4 hkv2 sq37 sk45 d64 fp8 descale=tensor varlen=padded causal",
    "b1 hq8 hkv2 sq1000 sk1000 d128 fp8 descale=tensor causal",
    "b1 hq2 hkv2 sq64 sk80 d192 dv128 fp8 descale=tensor",
};

/* A problem string for the probe: resolved as a plan would (scale, causal folded in), then with
 * out in e4m3, the form cuDNN's fp8 graph writes on Hopper and the library does not take. */
static int fp8_probe_problem(const char *text, attn_problem *r) {
  attn_problem p;
  if (attn_problem_parse(ctx, text, &p) != ATTN_STATUS_OK ||
      attn_validate_problem(ctx, &p, r) != ATTN_STATUS_OK) {
    tu_check(0, "fp8 probe %s: %s", text, attn_ctx_last_error(ctx));
    return 0;
  }
  r->out_dtype = ATTN_DTYPE_F8E4M3;
  return 1;
}

/* Hopper: cuDNN's fp8 graph writes out in e4m3 there, so the library refuses it (fp8_supported);
 * run through the module's probe (its rules skipped) with that out, it checks the graph's ops (the
 * factors, amax, P's scale 2^8, the masks), which Blackwell's graph shares but for out's type.
 * Each problem must build; one runs on e4m3 data drawn from the seed with factors 1/2, 1/4 and 2
 * and is compared with the f64 reference (ref, out in f32) under a bound that adds out's e4m3
 * rounding (2^-4 of each element) to a loose one for P's (2^-5 max|r|): a factor or scale missed
 * or applied twice is off by 2x at least. What cuDNN says of a bf16 out here is printed. */
static void fp8_hopper_probe(int sm, int version, uint64_t seed) {
  /* lengths multiples of 64, as cudnn-frontend's fp8 samples: Hopper's fp8 kernels are older */
  static const char *const probes[] = {
      "b2 hq4 hkv2 sq128 sk192 d64 fp8 descale=tensor causal align=tl device=cuda", /* run */
      "b1 hq8 hkv2 sq256 sk256 d128 fp8 causal device=cuda",
      "b3 hq4 hkv2 sq64 sk128 d64 fp8 varlen=padded device=cuda"};
  char why[1024];
  for (size_t i = 0; i < sizeof probes / sizeof *probes; ++i) {
    attn_problem r;
    if (!fp8_probe_problem(probes[i], &r)) continue;
    why[0] = '\0';
    attn_status st = cache_hooks()->probe_forward(&r, NULL, NULL, why, sizeof why);
    tu_check(st == ATTN_STATUS_OK,
             "fp8 probe %s: cuDNN %d on sm%d builds the graph with an e4m3 out: %s%s%s", probes[i],
             version, sm, attn_status_string(st), why[0] ? ": " : "", why);
    r.out_dtype = ATTN_DTYPE_BF16, why[0] = '\0';
    st = cache_hooks()->probe_forward(&r, NULL, NULL, why, sizeof why);
    printf("note: fp8 probe %s: cuDNN %d on sm%d %s the graph with a bf16 out%s%s (cudnn-frontend "
           "documents it for Blackwell only)\n",
           probes[i], version, sm, st == ATTN_STATUS_OK ? "builds" : "refuses", why[0] ? ": " : "",
           why);
  }

  attn_problem r;
  if (!fp8_probe_problem(probes[0], &r)) return;
  tu_rng data_rng = tu_rng_make(seed ^ 0xf8);
  const float factor[3] = {0.5f, 0.25f, 2.0f};
  tu_buf host[3], fbuf[3];
  void *dev[3], *dfac[3];
  attn_inputs in, ref_in;
  attn_inputs_init(&in), attn_inputs_init(&ref_in);
  attn_tensor *const dt[3] = {&in.q, &in.k, &in.v};
  attn_tensor *const rt[3] = {&ref_in.q, &ref_in.k, &ref_in.v};
  attn_tensor *const df[3] = {&in.q_descale, &in.k_descale, &in.v_descale};
  attn_tensor *const rf[3] = {&ref_in.q_descale, &ref_in.k_descale, &ref_in.v_descale};
  for (int t = 0; t < 3; ++t) {
    host[t] = tu_buf_new(ATTN_DTYPE_F8E4M3, attn_role_numel(&r, (attn_role)(ATTN_ROLE_Q + t)));
    tu_fill_uniform(&host[t], &data_rng, -4.0, 4.0);
    fbuf[t] = tu_buf_new(ATTN_DTYPE_F32, 1);
    tu_set(&fbuf[t], 0, factor[t]);
    dev[t] = tu_gpu_upload(host[t].data, (size_t)host[t].n);
    dfac[t] = tu_gpu_upload(fbuf[t].data, sizeof(float));
    *dt[t] = attn_role_resolve(&r, (attn_role)(ATTN_ROLE_Q + t), attn_tensor_dense(dev[t]));
    *df[t] = attn_tensor_dense(dfac[t]);
    *rt[t] = tu_tensor(&host[t]), *rf[t] = tu_tensor(&fbuf[t]);
  }
  const int64_t n_out = attn_role_numel(&r, ATTN_ROLE_OUT);
  const int64_t n_lse = attn_role_numel(&r, ATTN_ROLE_LSE);
  void *d_out = tu_gpu_upload(NULL, (size_t)n_out), *d_lse = tu_gpu_upload(NULL, (size_t)n_lse * 4);
  attn_outputs out;
  attn_outputs_init(&out);
  out.out = attn_role_resolve(&r, ATTN_ROLE_OUT, attn_tensor_dense(d_out));
  out.lse = attn_role_resolve(&r, ATTN_ROLE_LSE, attn_tensor_dense(d_lse));
  why[0] = '\0';
  attn_status st = cache_hooks()->probe_forward(&r, &in, &out, why, sizeof why);
  tu_check(st == ATTN_STATUS_OK, "fp8 probe %s: runs: %s%s%s", probes[0], attn_status_string(st),
           why[0] ? ": " : "", why);

  /* the reference: the same problem on the host, out in f32 */
  attn_problem hp = r;
  hp.device = ATTN_DEVICE_CPU, hp.out_dtype = ATTN_DTYPE_F32;
  tu_buf ref_out = tu_buf_new(ATTN_DTYPE_F32, n_out), ref_lse = tu_buf_new(ATTN_DTYPE_F32, n_lse);
  attn_outputs ref;
  attn_outputs_init(&ref);
  ref.out = tu_tensor(&ref_out), ref.lse = tu_tensor(&ref_lse);
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = "ref";
  attn_plan *plan = NULL;
  int ref_ok = attn_plan_create(ctx, &hp, &sel, &plan) == ATTN_STATUS_OK &&
               attn_plan_forward(plan, &ref_in, NULL, 0, &ref) == ATTN_STATUS_OK;
  tu_check(ref_ok, "fp8 probe: the reference runs: %s", attn_ctx_last_error(ctx));
  attn_plan_destroy(plan);
  if (st == ATTN_STATUS_OK && ref_ok) {
    tu_buf got = tu_gpu_fetch(d_out, ATTN_DTYPE_F8E4M3, n_out);
    tu_buf got_lse = tu_gpu_fetch(d_lse, ATTN_DTYPE_F32, n_lse);
    double max_ref = 0.0, worst = 0.0, max_lse = 1.0, lse_err = 0.0;
    for (int64_t e = 0; e < n_out; ++e) max_ref = fmax(max_ref, fabs(tu_get(&ref_out, e)));
    for (int64_t e = 0; e < n_out; ++e) { /* error over its bound, NaN included */
      const double a = tu_get(&got, e), x = tu_get(&ref_out, e);
      const double over = fabs(a - x) / (0x1p-4 * fabs(x) + 0x1p-5 * max_ref);
      if (!(over <= worst)) worst = isnan(over) ? INFINITY : over;
    }
    for (int64_t e = 0; e < n_lse; ++e) {
      const double a = tu_get(&got_lse, e), x = tu_get(&ref_lse, e);
      max_lse = fmax(max_lse, fabs(x));
      if (!(fabs(a - x) <= lse_err)) lse_err = isnan(a - x) ? INFINITY : fabs(a - x);
    }
    tu_check(worst <= 1.0 && max_ref > 0.0,
             "fp8 probe %s: out (e4m3) within 2^-4|r| + 2^-5 max|r| of the reference: worst "
             "%.2f of its bound (max|r| %.3g)",
             probes[0], worst, max_ref);
    tu_check(lse_err <= 1e-3 * max_lse, "fp8 probe %s: lse %.2e (bound %.2e)", probes[0], lse_err,
             1e-3 * max_lse);
    tu_buf_free(&got), tu_buf_free(&got_lse);
  }
  tu_buf_free(&ref_out), tu_buf_free(&ref_lse);
  for (int t = 0; t < 3; ++t) {
    tu_buf_free(&host[t]), tu_buf_free(&fbuf[t]);
    TU_CUDA_CHECK(cudaFree(dev[t]));
    TU_CUDA_CHECK(cudaFree(dfac[t]));
  }
  TU_CUDA_CHECK(cudaFree(d_out));
  TU_CUDA_CHECK(cudaFree(d_lse));
}

/* cuDNN's fp8 forward against the f64 reference through the attn tool's oracle (tools/harness.c:
 * e4m3 data and positive factors drawn from the seed, the reference on the decoded values, and
 * tol_bound_fp8 of tests/tolerance.h). Where cuDNN cannot write a bf16 or f16 out (Hopper, or
 * cuDNN before 9.13), every problem must be refused with that reason, which is printed. */
static void test_fp8_forward(uint64_t seed) {
  int version = (int)cudnnGetVersion(), major = 0, minor = 0;
  TU_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  TU_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  const int sm = major * 10 + minor, runs_fp8 = sm >= 100 && version >= 91300;
  if (!runs_fp8 && sm >= 90 && version >= 90100) fp8_hopper_probe(sm, version, seed);
  for (size_t i = 0; i < sizeof fp8_problems / sizeof *fp8_problems; ++i) {
    char text[256];
    snprintf(text, sizeof text, "%s device=cuda", fp8_problems[i]);
    attn_problem p;
    if (attn_problem_parse(ctx, text, &p) != ATTN_STATUS_OK) {
      tu_check(0, "fp8 %s: does not parse: %s", text, attn_ctx_last_error(ctx));
      continue;
    }
    attn_status st = attn_impl_supports(ctx, "cudnn", &p);
    /* the reason a refusal must give here, or NULL where the problem must run */
    const char *expect = version < 90100                        ? "fp8 attention"
                         : sm < 90                              ? "sm90"
                         : !runs_fp8                            ? "Blackwell"
                         : p.head_dim == 192 && version < 91900 ? "192"
                                                                : NULL;
    if (expect != NULL) {
      const char *why = attn_ctx_last_error(ctx);
      tu_check(st == ATTN_STATUS_UNSUPPORTED && strstr(why, expect) != NULL,
               "fp8 %s: refused on sm%d with cuDNN %d: %s \"%s\" (expected a reason naming "
               "\"%s\")",
               text, sm, version, attn_status_string(st), why, expect);
      continue;
    }
    if (st != ATTN_STATUS_OK) {
      tu_check(0, "fp8 %s: cuDNN %d on sm%d refused it: %s", text, version, sm,
               attn_ctx_last_error(ctx));
      continue;
    }
    h_oracle *oracle = NULL;
    if (h_oracle_make(ctx, &p, 0, seed + i, 0, &oracle) != ATTN_STATUS_OK) {
      tu_check(0, "fp8 %s: no oracle: %s", text, attn_ctx_last_error(ctx));
      continue;
    }
    h_check c = h_check_run(ctx, oracle, "cudnn", NULL);
    if (c.status != ATTN_STATUS_OK)
      tu_check(0, "fp8 %s: %s", text, attn_ctx_last_error(ctx));
    else /* a nonzero out: factors or outputs that never reached the run read as zeros */
      tu_check(c.ok && c.ref[0] > 0.0, "fp8 %s: out %.2e/%.2e (max|r| %.2e) lse %.2e/%.2e", text,
               c.err[0], c.tol[0], c.ref[0], c.err[1], c.tol[1]);
    h_oracle_free(oracle);
  }
}

int main(int argc, char **argv) {
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) return 1;
  uint64_t seed = tu_seed("test_cudnn");
  rng = tu_rng_make(seed);
  printf("cuDNN implementation compiled in; loaded cuDNN %d\n", (int)cudnnGetVersion());
  test_unsupported();
  if (!tu_gpu_found()) {
    attn_ctx_destroy(ctx);
    return tu_gpu_skipped();
  }
  if (getenv("ATTN_CUDNN_FP8_ONLY") != NULL) {
    test_fp8_forward(seed);
    int rc = tu_finish();
    attn_ctx_destroy(ctx);
    return rc;
  }
  int quick = getenv("ATTN_CUDNN_QUICK") != NULL;
  test_graph_cache();
  if (!quick) test_graph_cache_threads();
  test_grid(quick);
  if (!quick) {
    test_fp8_forward(seed);
    test_determinism();
    test_autotune();
    test_run_checks();
    const char *golden = argc > 1 ? argv[1] : getenv("ATTN_GOLDEN_DIR");
    if (golden != NULL)
      test_golden(golden);
    else
      printf("golden cases: no folder given (argument or ATTN_GOLDEN_DIR): not run\n");
  }
  int rc = tu_finish();
  attn_ctx_destroy(ctx);
  return rc;
}

#endif /* ATTN_HAVE_CUDNN */
