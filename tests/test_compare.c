/*
 * tests/test_compare.c - every registered implementation (except the reference itself) against the
 * f64 reference over a grid of problems: odd sizes (1, 3, 17, 63, 65, 127, 129, 1000) that divide no
 * tile size, every feature of SPEC.md alone and combined, strided (permuted, padded, non-unit last
 * dim) inputs and outputs, f32/f16/bf16, forward (out, lse) and backward (dq, dk, dv, dbias,
 * dsinks). The "cpu" implementation runs once per instruction-set path (ATTN_CPU_ISA unset: the
 * best, which for bf16 is the AMX or the bf16 dot-product kernel; avx512, avx2, generic; a path
 * above the machine's is lowered to what it runs, and a path the machine and OS allow must be the
 * one that runs; for bf16 problems also avx512bf16 and amx, each skipped, with a line saying so,
 * where the machine lacks it), on 1 and 2 threads, with its smallest, largest and default block
 * sizes. The paths that ran are listed at the end, so a log shows which kernels this compiler's
 * build was checked on.
 *
 * Tolerance: SPEC.md's rule, tests/tolerance.h (f32: max|a - r| <= 1e-4 * max(1, max|r|);
 * f16/bf16, inputs rounded to the dtype and the same values fed to the reference: err <= 2 *
 * err(naive) + 1e-3 * max|r|, 3x for gradients), where naive is the reference on the dtype's
 * problem with attn_plan_set_rounding(plan, dtype), or the reference on that problem without
 * rounding when its error is larger (tol_naive_error). lse must be -inf exactly where the
 * reference's is. Outputs start as NaN, so an element an implementation forgets to write fails;
 * each implementation gets exactly the workspace it asked for.
 *
 * Usage: test_compare [filter]   runs only cases whose name contains filter.
 * Prints the seed (replay with ATTN_TEST_SEED=N) and, per failure, the tensor, the error, the
 * largest reference value and the logical index of the worst element.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/tensors.h"
#include "impl/cpu/cpu.h"
#include "plan/plan.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- one case of the grid ------------------------------------------------------------------------ */

enum { BIAS_NONE, BIAS_FULL, BIAS_BCAST, BIAS_KV_HEADS, BIAS_ROW, BIAS_COL };
enum { MASK_NONE, MASK_FULL, MASK_BCAST, MASK_DEAD_ROWS };

typedef struct tcase {
  char name[160];
  attn_problem p;
  int bias, mask;
  int strided;
  int bias_lowp; /* bias in the problem's dtype rather than f32 */
} tcase;

/* ---- strided tensors ------------------------------------------------------------------------------- */

/* A tensor of a role: physical storage and the attn_tensor (data + strides) handed to the library. */
typedef struct ttensor {
  tu_buf store;
  attn_tensor t;
  int ndim;
  int64_t shape[ATTN_MAX_DIMS];
  int64_t n; /* logical elements */
} ttensor;

/* Strided: dims 1 and 2 swapped in memory (dims 0 and 1 for 2-3 dim tensors), every dim padded by
 * one, and the last dim at stride 2 when `odd`, so no implementation can assume dense layouts. */
static ttensor tt_make(const attn_problem *p, attn_role role, attn_dtype dtype, int strided, int odd,
                       double fill) {
  ttensor x;
  memset(&x, 0, sizeof x);
  x.ndim = attn_role_shape(p, role, x.shape);
  x.n = 1;
  for (int d = 0; d < x.ndim; ++d) x.n *= x.shape[d];
  int order[ATTN_MAX_DIMS]; /* order[0] is the outermost dim in memory */
  for (int d = 0; d < x.ndim; ++d) order[d] = d;
  if (strided && x.ndim >= 3) order[x.ndim - 3] = x.ndim - 2, order[x.ndim - 2] = x.ndim - 3;
  if (strided && x.ndim == 2) order[0] = 1, order[1] = 0;
  int64_t stride = strided && odd ? 2 : 1;
  for (int k = x.ndim - 1; k >= 0; --k) {
    int d = order[k];
    x.t.stride[d] = stride;
    stride *= x.shape[d] + (strided ? 1 : 0);
  }
  x.store = tu_buf_new(dtype, stride > 0 ? stride : 1);
  for (int64_t e = 0; e < x.store.n; ++e) {
    if (dtype == ATTN_DTYPE_U8 || dtype == ATTN_DTYPE_I32) break;
    attn_store(x.store.data, dtype, e, fill);
  }
  x.t.data = x.n > 0 ? x.store.data : NULL;
  if (x.n == 0) memset(x.t.stride, 0, sizeof x.t.stride);
  return x;
}

static int64_t tt_offset(const ttensor *x, int64_t e) {
  int64_t off = 0;
  for (int d = x->ndim - 1; d >= 0; --d) {
    off += (e % x->shape[d]) * x->t.stride[d];
    e /= x->shape[d];
  }
  return off;
}

static double tt_get(const ttensor *x, int64_t e) {
  int64_t off = tt_offset(x, e);
  if (x->store.dtype == ATTN_DTYPE_U8) return ((const uint8_t *)x->store.data)[off];
  if (x->store.dtype == ATTN_DTYPE_I32) return ((const int32_t *)x->store.data)[off];
  return attn_load(x->store.data, x->store.dtype, off);
}

static void tt_set(ttensor *x, int64_t e, double v) {
  int64_t off = tt_offset(x, e);
  if (x->store.dtype == ATTN_DTYPE_U8) ((uint8_t *)x->store.data)[off] = (uint8_t)v;
  else if (x->store.dtype == ATTN_DTYPE_I32) ((int32_t *)x->store.data)[off] = (int32_t)v;
  else attn_store(x->store.data, x->store.dtype, off, v);
}

static double *tt_values(const ttensor *x) {
  double *v = malloc((size_t)(x->n > 0 ? x->n : 1) * sizeof(double));
  for (int64_t e = 0; e < x->n; ++e) v[e] = tt_get(x, e);
  return v;
}

/* ---- the data of one case: logical f64 values of every input -------------------------------------- */

enum { IN_Q, IN_K, IN_V, IN_DOUT, IN_BIAS, IN_MASK, IN_ALIBI, IN_SINKS, IN_QSEG, IN_KSEG, IN_COUNT };
static const attn_role in_roles[IN_COUNT] = {
    ATTN_ROLE_Q,    ATTN_ROLE_K,     ATTN_ROLE_V,     ATTN_ROLE_DOUT,          ATTN_ROLE_BIAS,
    ATTN_ROLE_MASK, ATTN_ROLE_ALIBI, ATTN_ROLE_SINKS, ATTN_ROLE_Q_SEGMENT_IDS, ATTN_ROLE_KV_SEGMENT_IDS};

enum { OUT_OUT, OUT_LSE, OUT_DQ, OUT_DK, OUT_DV, OUT_DBIAS, OUT_DSINKS, OUT_COUNT };
static const attn_role out_roles[OUT_COUNT] = {ATTN_ROLE_OUT, ATTN_ROLE_LSE,   ATTN_ROLE_DQ,
                                               ATTN_ROLE_DK,  ATTN_ROLE_DV,    ATTN_ROLE_DBIAS,
                                               ATTN_ROLE_DSINKS};

typedef struct cdata {
  double *in[IN_COUNT];
  int64_t n_in[IN_COUNT];
  int32_t cu_q[16], cu_k[16], len_q[16], len_k[16];
  uint64_t seed;
} cdata;

static attn_dtype role_dtype_for(const attn_problem *p, attn_role role) {
  return attn_role_dtype(p, role);
}

/* Random inputs, rounded to the dtypes of problem p (what the implementation will see). */
static cdata make_data(tcase *c, tu_rng *rng) {
  const attn_problem *p = &c->p;
  cdata d;
  memset(&d, 0, sizeof d);
  d.seed = (uint64_t)tu_int(rng, 0, 1 << 30) * 7919u + 1u;
  if (p->varlen == ATTN_VARLEN_PACKED) {
    d.cu_q[0] = d.cu_k[0] = 0;
    for (int64_t b = 0; b < p->batch; ++b) {
      /* the first sequence has the maximum lengths, one is empty when there are three or more */
      int64_t lq = b == 0 ? p->seqlen_q : b == 2 ? 0 : tu_int(rng, 0, p->seqlen_q);
      int64_t lk = b == 0 ? p->seqlen_k : tu_int(rng, 0, p->seqlen_k);
      d.cu_q[b + 1] = d.cu_q[b] + (int32_t)lq;
      d.cu_k[b + 1] = d.cu_k[b] + (int32_t)lk;
    }
  } else if (p->varlen == ATTN_VARLEN_PADDED) {
    for (int64_t b = 0; b < p->batch; ++b) {
      d.len_q[b] = (int32_t)(b == 0 ? p->seqlen_q : tu_int(rng, 0, p->seqlen_q));
      d.len_k[b] = (int32_t)(b == 0 ? p->seqlen_k : tu_int(rng, 0, p->seqlen_k));
    }
  }
  if (p->varlen == ATTN_VARLEN_PACKED) /* the sizes of the packed tensors */
    c->p.total_q = d.cu_q[p->batch], c->p.total_k = d.cu_k[p->batch];
  for (int r = 0; r < IN_COUNT; ++r) {
    if (!attn_role_used(p, in_roles[r])) continue;
    d.n_in[r] = attn_role_numel(p, in_roles[r]);
    d.in[r] = malloc((size_t)(d.n_in[r] > 0 ? d.n_in[r] : 1) * sizeof(double));
    attn_dtype dt = role_dtype_for(p, in_roles[r]);
    for (int64_t e = 0; e < d.n_in[r]; ++e) {
      double v;
      switch (r) {
      case IN_BIAS: v = tu_uniform(rng, -2.0, 2.0); break;
      case IN_MASK: v = tu_uniform(rng, 0.0, 1.0) < 0.75; break;
      case IN_ALIBI: v = tu_uniform(rng, 0.01, 0.5); break;
      case IN_SINKS: v = tu_uniform(rng, -1.0, 2.0); break;
      case IN_QSEG:
      case IN_KSEG: v = (double)tu_int(rng, -1, 2); break;
      case IN_Q:
      case IN_K: v = tu_uniform(rng, -1.5, 1.5); break;
      default: v = tu_uniform(rng, -1.0, 1.0); break;
      }
      if (dt == ATTN_DTYPE_F16 || dt == ATTN_DTYPE_BF16 || dt == ATTN_DTYPE_F32) v = attn_round_to(dt, v);
      d.in[r][e] = v;
    }
  }
  if (p->has_mask && c->mask == MASK_DEAD_ROWS) /* some rows see nothing at all */
    for (int64_t e = 0; e < d.n_in[IN_MASK]; ++e)
      if ((e / p->mask_shape[3]) % 5 == 1) d.in[IN_MASK][e] = 0.0;
  if (p->has_segment_ids) /* mostly increasing runs, some padding (-1) */
    for (int r = IN_QSEG; r <= IN_KSEG; ++r) {
      int64_t T = r == IN_QSEG ? p->seqlen_q : p->seqlen_k;
      for (int64_t e = 0; e < d.n_in[r]; ++e) {
        int64_t i = e % T;
        d.in[r][e] = i * 3 >= T * 2 && (e / T) % 2 == 0 ? -1.0 : (double)(i * 3 / (T + 1));
      }
    }
  return d;
}

static void free_data(cdata *d) {
  for (int r = 0; r < IN_COUNT; ++r) free(d->in[r]);
}

/* ---- one run of one implementation ------------------------------------------------------------------ */

typedef struct result {
  double *v[OUT_COUNT]; /* logical values */
  int64_t n[OUT_COUNT];
  int ok;
  char why[512];
} result;

static void free_result(result *r) {
  for (int o = 0; o < OUT_COUNT; ++o) free(r->v[o]);
}

/* Runs forward then backward (on the pass's own out and lse) of p on the values of d. */
static result run_impl(attn_ctx *ctx, const attn_problem *p, const cdata *d, const char *impl,
                       const char *config, int strided, attn_dtype rounding) {
  result res;
  memset(&res, 0, sizeof res);
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = impl;
  sel.config = config;
  attn_plan *plan = NULL;
  if (attn_plan_create(ctx, p, &sel, &plan) != ATTN_STATUS_OK) {
    snprintf(res.why, sizeof res.why, "plan: %s", attn_ctx_last_error(ctx));
    return res;
  }
  if (rounding != ATTN_DTYPE_F64) attn_plan_set_rounding(plan, rounding);

  ttensor in[IN_COUNT], out[OUT_COUNT];
  memset(in, 0, sizeof in), memset(out, 0, sizeof out);
  for (int r = 0; r < IN_COUNT; ++r) {
    if (d->in[r] == NULL) continue;
    in[r] = tt_make(p, in_roles[r], role_dtype_for(p, in_roles[r]), strided, r % 2, 0.0);
    for (int64_t e = 0; e < in[r].n; ++e) tt_set(&in[r], e, d->in[r][e]);
  }
  for (int o = 0; o < OUT_COUNT; ++o) {
    if (!attn_role_used(p, out_roles[o])) continue;
    out[o] = tt_make(p, out_roles[o], role_dtype_for(p, out_roles[o]), strided, o % 2, NAN);
  }
  attn_inputs inputs;
  attn_inputs_init(&inputs);
  attn_tensor *slots[IN_COUNT] = {&inputs.q,    &inputs.k,     &inputs.v,     NULL,
                                  &inputs.bias, &inputs.mask,  &inputs.alibi_slopes,
                                  &inputs.sinks, &inputs.q_segment_ids, &inputs.kv_segment_ids};
  for (int r = 0; r < IN_COUNT; ++r)
    if (slots[r] != NULL && d->in[r] != NULL) *slots[r] = in[r].t;
  if (p->varlen == ATTN_VARLEN_PACKED) inputs.cu_seqlens_q = d->cu_q, inputs.cu_seqlens_k = d->cu_k;
  if (p->varlen == ATTN_VARLEN_PADDED) inputs.seqlens_q = d->len_q, inputs.seqlens_k = d->len_k;
  inputs.dropout_seed = d->seed;
  attn_outputs fo;
  attn_outputs_init(&fo);
  fo.out = out[OUT_OUT].t, fo.lse = out[OUT_LSE].t;
  attn_grads g;
  attn_grads_init(&g);
  g.dq = out[OUT_DQ].t, g.dk = out[OUT_DK].t, g.dv = out[OUT_DV].t;
  if (p->has_bias) g.dbias = out[OUT_DBIAS].t;
  if (p->num_sinks > 0) g.dsinks = out[OUT_DSINKS].t;

  size_t fwd_ws = 0, bwd_ws = 0;
  attn_plan_workspace_size(plan, &fwd_ws, &bwd_ws);
  void *ws = malloc(fwd_ws > bwd_ws ? fwd_ws : (bwd_ws > 0 ? bwd_ws : 1));
  attn_status st = attn_plan_forward(plan, &inputs, ws, fwd_ws, &fo);
  if (st == ATTN_STATUS_OK)
    st = attn_plan_backward(plan, &inputs, &fo, &in[IN_DOUT].t, ws, bwd_ws, &g);
  if (st != ATTN_STATUS_OK) {
    snprintf(res.why, sizeof res.why, "run: %s", attn_ctx_last_error(ctx));
  } else {
    res.ok = 1;
    for (int o = 0; o < OUT_COUNT; ++o)
      if (out[o].store.data != NULL) res.v[o] = tt_values(&out[o]), res.n[o] = out[o].n;
  }
  free(ws);
  for (int r = 0; r < IN_COUNT; ++r) tu_buf_free(&in[r].store);
  for (int o = 0; o < OUT_COUNT; ++o) tu_buf_free(&out[o].store);
  attn_plan_destroy(plan);
  return res;
}

/* ---- comparison --------------------------------------------------------------------------------------- */

static const char *out_names[OUT_COUNT] = {"out", "lse", "dq", "dk", "dv", "dbias", "dsinks"};

/* Logical index of element e of a role as "[a,b,c,d]". */
static void index_string(const attn_problem *p, attn_role role, int64_t e, char *buf, size_t size) {
  int64_t shape[ATTN_MAX_DIMS], idx[ATTN_MAX_DIMS];
  int nd = attn_role_shape(p, role, shape);
  for (int d = nd - 1; d >= 0; --d) idx[d] = e % shape[d], e /= shape[d];
  int used = snprintf(buf, size, "[");
  for (int d = 0; d < nd; ++d)
    used += snprintf(buf + used, size - (size_t)used, "%s%lld", d ? "," : "", (long long)idx[d]);
  snprintf(buf + used, size - (size_t)used, "]");
}

/* ---- the grid ---------------------------------------------------------------------------------------- */

#define MAX_CASES 256
static tcase cases[MAX_CASES];
static int n_cases = 0;

static tcase *add(const char *name, attn_dtype dt, int64_t B, int64_t Tq, int64_t Tk, int64_t Hq,
                  int64_t Hkv, int64_t D) {
  tcase *c = &cases[n_cases++];
  memset(c, 0, sizeof *c);
  attn_problem_init(&c->p);
  c->p.dtype = dt;
  c->p.batch = B, c->p.seqlen_q = Tq, c->p.seqlen_k = Tk, c->p.heads_q = Hq, c->p.heads_kv = Hkv;
  c->p.head_dim = D;
  snprintf(c->name, sizeof c->name, "%s %s b%lld sq%lld sk%lld hq%lld hkv%lld d%lld", name,
           attn_dtype_name(dt), (long long)B, (long long)Tq, (long long)Tk, (long long)Hq,
           (long long)Hkv, (long long)D);
  return c;
}

static void set_bias(tcase *c, int kind) {
  attn_problem *p = &c->p;
  c->bias = kind;
  p->has_bias = 1;
  p->bias_dtype = c->bias_lowp ? p->dtype : ATTN_DTYPE_F32;
  int64_t s[4] = {p->batch, p->heads_q, p->seqlen_q, p->seqlen_k};
  if (kind == BIAS_BCAST) s[0] = 1, s[1] = 1;
  if (kind == BIAS_KV_HEADS) s[1] = p->heads_kv;
  if (kind == BIAS_ROW) s[0] = 1, s[3] = 1;
  if (kind == BIAS_COL) s[1] = 1, s[2] = 1;
  memcpy(p->bias_shape, s, sizeof s);
}

static void set_mask(tcase *c, int kind) {
  attn_problem *p = &c->p;
  c->mask = kind;
  p->has_mask = 1;
  int64_t s[4] = {p->batch, p->heads_q, p->seqlen_q, p->seqlen_k};
  if (kind == MASK_BCAST) s[0] = 1, s[1] = 1;
  memcpy(p->mask_shape, s, sizeof s);
}

static void build_grid(void) {
  const attn_dtype F32 = ATTN_DTYPE_F32;
  tcase *c;
  /* sizes: odd, none a multiple of a tile */
  static const int64_t sizes[][2] = {{1, 1}, {3, 17}, {17, 3}, {63, 65}, {65, 63}, {127, 129},
                                     {129, 127}, {1, 129}};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; ++s) {
    add("plain", F32, 2, sizes[s][0], sizes[s][1], 2, 1, s % 2 ? 17 : 32);
    c = add("causal", F32, 1, sizes[s][0], sizes[s][1], 2, 2, 16);
    c->p.causal = 1;
    c = add("causal-topleft", F32, 1, sizes[s][0], sizes[s][1], 2, 1, 8);
    c->p.causal = 1, c->p.align = ATTN_ALIGN_TOP_LEFT;
  }
  add("big", F32, 1, 1000, 1000, 1, 1, 64)->p.causal = 0;
  c = add("big-causal", F32, 1, 1000, 129, 2, 1, 32);
  c->p.causal = 1;
  c = add("big-window", F32, 1, 63, 1000, 1, 1, 16);
  c->p.window_left = 100, c->p.window_right = 3;
  add("d1", F32, 1, 17, 65, 1, 1, 1);
  add("d128", F32, 1, 65, 63, 2, 1, 128);
  add("d200", F32, 1, 17, 33, 1, 1, 200);
  c = add("dv-differs", F32, 2, 63, 65, 2, 2, 24);
  c->p.head_dim_v = 40;
  c = add("dv-small", F32, 1, 65, 17, 2, 1, 64);
  c->p.head_dim_v = 3;
  add("gqa", F32, 2, 63, 65, 6, 2, 16);
  add("mqa", F32, 1, 65, 127, 3, 1, 16);
  add("empty-keys", F32, 2, 17, 0, 2, 1, 8);
  c = add("scale", F32, 1, 63, 65, 2, 1, 16);
  c->p.scale = 0.9;
  static const int64_t windows[][2] = {{5, 3}, {0, 0}, {-1, 7}, {7, -1}, {0, -1}, {200, 200}};
  for (size_t w = 0; w < sizeof windows / sizeof windows[0]; ++w) {
    c = add("window", F32, 1, 127, 65, 2, 1, 16);
    c->p.window_left = windows[w][0], c->p.window_right = windows[w][1];
    c = add("window-topleft", F32, 1, 65, 129, 2, 2, 16);
    c->p.window_left = windows[w][0], c->p.window_right = windows[w][1];
    c->p.align = ATTN_ALIGN_TOP_LEFT;
  }
  c = add("causal-window", F32, 1, 129, 129, 2, 1, 16);
  c->p.causal = 1, c->p.window_left = 20;
  static const int bias_kinds[] = {BIAS_FULL, BIAS_BCAST, BIAS_KV_HEADS, BIAS_ROW, BIAS_COL};
  static const char *bias_names[] = {"bias-full", "bias-bcast", "bias-kv-heads", "bias-row", "bias-col"};
  for (int b = 0; b < 5; ++b) {
    c = add(bias_names[b], F32, 2, 63, 65, 4, 2, 16);
    set_bias(c, bias_kinds[b]);
  }
  c = add("mask", F32, 2, 65, 63, 2, 1, 16);
  set_mask(c, MASK_FULL);
  c = add("mask-bcast", F32, 2, 65, 63, 2, 1, 16);
  set_mask(c, MASK_BCAST);
  c = add("mask-dead-rows", F32, 1, 65, 129, 2, 1, 16);
  set_mask(c, MASK_DEAD_ROWS);
  c = add("alibi", F32, 2, 63, 129, 2, 1, 16);
  c->p.alibi = ATTN_ALIBI_PER_HEAD;
  c = add("alibi-batch", F32, 2, 127, 65, 2, 2, 16);
  c->p.alibi = ATTN_ALIBI_PER_BATCH_HEAD;
  c = add("softcap", F32, 1, 65, 63, 2, 1, 16);
  c->p.softcap = 1.5;
  c = add("sinks", F32, 2, 63, 65, 2, 1, 16);
  c->p.num_sinks = 1;
  c = add("sinks-many", F32, 1, 129, 127, 4, 2, 16);
  c->p.num_sinks = 3;
  c = add("sinks-shared", F32, 1, 65, 17, 2, 1, 16);
  c->p.num_sinks = 2, c->p.sinks_shared = 1;
  c = add("sinks-no-keys", F32, 1, 17, 0, 2, 1, 8);
  c->p.num_sinks = 2;
  c = add("segments", F32, 2, 63, 129, 2, 1, 16);
  c->p.has_segment_ids = 1;
  c = add("dropout", F32, 2, 65, 127, 2, 1, 16);
  c->p.dropout_p = 0.2;
  c = add("dropout-causal", F32, 1, 129, 129, 2, 2, 16);
  c->p.dropout_p = 0.5, c->p.causal = 1;
  c = add("varlen-packed", F32, 3, 65, 127, 2, 1, 16);
  c->p.varlen = ATTN_VARLEN_PACKED;
  c = add("varlen-packed-causal", F32, 4, 129, 63, 4, 2, 16);
  c->p.varlen = ATTN_VARLEN_PACKED, c->p.causal = 1;
  c = add("varlen-padded", F32, 3, 63, 65, 2, 1, 16);
  c->p.varlen = ATTN_VARLEN_PADDED;
  c = add("varlen-padded-causal", F32, 3, 127, 65, 2, 2, 16);
  c->p.varlen = ATTN_VARLEN_PADDED, c->p.causal = 1;
  c = add("strided", F32, 2, 63, 65, 4, 2, 16);
  c->strided = 1;
  c = add("strided-causal-dv", F32, 2, 65, 63, 2, 1, 16);
  c->strided = 1, c->p.causal = 1, c->p.head_dim_v = 9;

  /* every feature at once, in every dtype */
  static const attn_dtype dts[] = {ATTN_DTYPE_F32, ATTN_DTYPE_F16, ATTN_DTYPE_BF16};
  for (int t = 0; t < 3; ++t) {
    c = add("everything", dts[t], 2, 65, 129, 4, 2, 24);
    c->strided = 1, c->bias_lowp = t == 1;
    c->p.head_dim_v = 17, c->p.causal = 1, c->p.window_left = 40, c->p.softcap = 2.0;
    c->p.dropout_p = 0.1, c->p.alibi = ATTN_ALIBI_PER_BATCH_HEAD, c->p.num_sinks = 2;
    c->p.has_segment_ids = 1;
    set_bias(c, BIAS_KV_HEADS);
    set_mask(c, MASK_DEAD_ROWS);
    c = add("everything-packed", dts[t], 3, 127, 65, 2, 1, 16);
    c->strided = t != 1, c->bias_lowp = t == 2;
    c->p.varlen = ATTN_VARLEN_PACKED, c->p.causal = 1, c->p.align = ATTN_ALIGN_TOP_LEFT;
    c->p.window_left = 30, c->p.softcap = 3.0, c->p.dropout_p = 0.3, c->p.num_sinks = 1;
    c->p.alibi = ATTN_ALIBI_PER_HEAD;
    set_bias(c, BIAS_BCAST);
    c = add("everything-padded", dts[t], 3, 63, 127, 4, 4, 32);
    c->strided = 1;
    c->p.varlen = ATTN_VARLEN_PADDED, c->p.window_left = 9, c->p.window_right = 50;
    c->p.num_sinks = 2, c->p.sinks_shared = 1, c->p.has_segment_ids = 1;
    set_bias(c, BIAS_ROW);
    set_mask(c, MASK_BCAST);
    if (t > 0) {
      add("plain", dts[t], 2, 127, 129, 2, 1, 64);
      c = add("causal", dts[t], 1, 129, 63, 2, 2, 32);
      c->p.causal = 1;
      c = add("gqa-strided", dts[t], 2, 65, 63, 6, 2, 17);
      c->strided = 1, c->p.head_dim_v = 8;
      add("big", dts[t], 1, 1000, 65, 1, 1, 32);
    }
  }
}

/* ---- instruction-set paths ------------------------------------------------------------------------------- */

/* Whether this machine and OS run the kernels ATTN_CPU_ISA=isa asks for (the sets CMakeLists.txt
 * compiles each file for; cpu.c makes the same test). */
static int isa_runnable(const char *isa) {
  unsigned avx2 = ATTN_CPU_AVX2 | ATTN_CPU_FMA | ATTN_CPU_F16C;
  unsigned avx512 = ATTN_CPU_AVX512F | ATTN_CPU_AVX512BW | ATTN_CPU_AVX512VL | ATTN_CPU_AVX512DQ;
  if (strcmp(isa, "generic") == 0) return 1;
#if defined(__x86_64__) || defined(__i386__)
  if (strcmp(isa, "avx2") == 0) return attn_cpu_can_run(avx2);
  if (strcmp(isa, "avx512") == 0) return attn_cpu_can_run(avx2 | avx512);
#else
  (void)avx2, (void)avx512;
#endif
  return 0;
}

/* The kernel tables that ran, in first-run order ("avx512 avx2 generic avx512bf16"). */
static char isas_ran[128];
static void note_isa(const char *name) {
  char key[40], padded[sizeof isas_ran + 2];
  snprintf(key, sizeof key, " %s ", name);
  snprintf(padded, sizeof padded, " %s ", isas_ran);
  if (strstr(padded, key) != NULL) return;
  size_t used = strlen(isas_ran);
  snprintf(isas_ran + used, sizeof isas_ran - used, "%s%s", used ? " " : "", name);
}

/* ---- main -------------------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  const char *filter = argc > 1 ? argv[1] : NULL;
  tu_rng rng = tu_rng_make(tu_seed("test_compare"));
  build_grid();
  attn_ctx *ctx;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) return 1;
  const char *saved_isa = getenv("ATTN_CPU_ISA");
  int compared = 0;

  for (int ci = 0; ci < n_cases; ++ci) {
    tcase *c = &cases[ci];
    cdata d = make_data(c, &rng); /* drawn even when filtered out, so a seed replays any case */
    if (filter != NULL && strstr(c->name, filter) == NULL) {
      free_data(&d);
      continue;
    }
    /* The reference in f64 on the same (rounded) values. */
    attn_problem p64 = c->p;
    p64.dtype = ATTN_DTYPE_F64;
    if (p64.has_bias) p64.bias_dtype = ATTN_DTYPE_F64;
    attn_ctx_set_num_threads(ctx, 0);
    result ref = run_impl(ctx, &p64, &d, "ref", NULL, 0, ATTN_DTYPE_F64);
    tu_check(ref.ok, "%s: reference: %s", c->name, ref.why);
    result naive, at_dtype;
    memset(&naive, 0, sizeof naive), memset(&at_dtype, 0, sizeof at_dtype);
    int lowp = c->p.dtype != ATTN_DTYPE_F32;
    /* naive: the reference on the problem's own dtype (its outputs rounded to it, its backward
     * reading the rounded out), with scores and probabilities rounded too. at_dtype: the same
     * without rounding inside, what rounding the outputs alone costs; the bound takes the larger
     * error of the two (tol_naive_error says why). */
    if (lowp) {
      naive = run_impl(ctx, &c->p, &d, "ref", NULL, 0, (attn_dtype)c->p.dtype);
      at_dtype = run_impl(ctx, &c->p, &d, "ref", NULL, 0, ATTN_DTYPE_F64);
    }
    if (!ref.ok) {
      free_result(&ref), free_result(&naive), free_result(&at_dtype), free_data(&d);
      continue;
    }

    for (int32_t ii = 0; ii < attn_impl_count(); ++ii) {
      const char *impl = attn_impl_name(ii);
      if (strcmp(impl, "ref") == 0) continue;
      if (attn_impl_supports(ctx, impl, &c->p) != ATTN_STATUS_OK) {
        printf("skip %s %s: %s\n", c->name, impl, attn_ctx_last_error(ctx));
        continue;
      }
      /* the cpu implementation: each instruction-set path, and 1 and 2 threads; the bf16 ones
       * (amx, avx512bf16) for bf16 problems, each reported skipped where the machine lacks it */
      static const char *isas[] = {NULL, "avx512", "avx2", "generic", "avx512bf16", "amx"};
      int n_variants = strcmp(impl, "cpu") == 0 ? (c->p.dtype == ATTN_DTYPE_BF16 ? 6 : 4) : 1;
      for (int v = 0; v < n_variants; ++v) {
        if (n_variants > 1) {
          if (isas[v] == NULL) {
            if (saved_isa != NULL) setenv("ATTN_CPU_ISA", saved_isa, 1);
            else unsetenv("ATTN_CPU_ISA");
          } else {
            setenv("ATTN_CPU_ISA", isas[v], 1);
          }
        }
        if (v >= 4 && strcmp(attn_cpu_isa_name(c->p.dtype), isas[v]) != 0) {
          static int said[6];
          if (!said[v]++)
            printf("skip cpu isa=%s on every bf16 case: this machine runs %s\n", isas[v],
                   attn_cpu_isa_name(c->p.dtype));
          continue;
        }
        const char *ran_isa = n_variants > 1 ? attn_cpu_isa_name(c->p.dtype) : "-";
        if (n_variants > 1) {
          note_isa(ran_isa);
          /* A forced path this machine runs must be the one chosen, not a silent lower one. */
          if (isas[v] != NULL && isa_runnable(isas[v]))
            tu_check(strcmp(ran_isa, isas[v]) == 0, "%s: ATTN_CPU_ISA=%s runs the %s kernels",
                     c->name, isas[v], ran_isa);
        }
        int threads = v == 2 || v == 5 ? 1 : 2;
        attn_ctx_set_num_threads(ctx, threads);
        /* the smallest and the largest blocks on some paths, the default on the others */
        static const char *configs[] = {NULL, "bq32_bk64", "bq128_bk256", NULL, "bq128_bk64",
                                        "bq32_bk256"};
        const char *config = n_variants > 1 ? configs[v] : NULL;
        result got = run_impl(ctx, &c->p, &d, impl, config, c->strided, ATTN_DTYPE_F64);
        char variant[96];
        snprintf(variant, sizeof variant, "%s isa=%s(%s) threads=%d config=%s", impl,
                 isas[v] != NULL ? isas[v] : "auto", ran_isa, threads,
                 config != NULL ? config : "default");
        tu_check(got.ok, "%s %s: %s", c->name, variant, got.why);
        if (got.ok) {
          ++compared;
          char line[1024];
          int used = 0, ok = 1;
          for (int o = 0; o < OUT_COUNT; ++o) {
            if (ref.v[o] == NULL) continue;
            if (got.v[o] == NULL) { /* a tensor the problem has but the run did not produce */
              ok = 0;
              continue;
            }
            tol_err e = tol_compare(got.v[o], ref.v[o], ref.n[o]);
            double naive_err = 0.0; /* the f32 rule needs none */
            if (lowp) {
              tol_err en = tol_compare(naive.v[o], ref.v[o], ref.n[o]);
              tol_err ed = tol_compare(at_dtype.v[o], ref.v[o], ref.n[o]);
              naive_err = tol_naive_error(&en, &ed, NULL);
            }
            tol_pass pass = o >= OUT_DQ ? TOL_GRADIENT : TOL_FORWARD;
            double tol = tol_bound((attn_dtype)c->p.dtype, pass, e.max_ref, naive_err, NULL);
            if (!tol_ok(&e, tol)) {
              char where[96];
              index_string(&c->p, out_roles[o], e.where, where, sizeof where);
              printf("  %s: %s error %.3e > tol %.3e (max|ref| %.3e%s) at %s: got %.9g ref %.9g\n",
                     variant, out_names[o], e.max_abs, tol, e.max_ref,
                     e.nonfinite ? ", non-finite mismatch" : "", where,
                     e.where >= 0 ? got.v[o][e.where] : 0.0,
                     e.where >= 0 ? ref.v[o][e.where] : 0.0);
              ok = 0;
            }
            used += snprintf(line + used, sizeof line - (size_t)used, " %s %.1e", out_names[o],
                             e.nonfinite ? INFINITY : e.max_abs);
          }
          tu_check(ok, "%s %s:%s", c->name, variant, line);
        }
        free_result(&got);
      }
    }
    if (saved_isa != NULL) setenv("ATTN_CPU_ISA", saved_isa, 1);
    else unsetenv("ATTN_CPU_ISA");
    free_result(&ref), free_result(&naive), free_result(&at_dtype), free_data(&d);
  }
  printf("%d implementation runs compared over %d cases\n", compared, n_cases);
  printf("cpu kernel paths run: %s (this CPU: %s)\n", isas_ran[0] ? isas_ran : "none",
         attn_cpu_info_get()->feature_names);
  attn_ctx_destroy(ctx);
  return tu_finish();
}
