/*
 * tests/test_properties.c - properties of the attention function that hold whatever the data,
 * checked on fresh random inputs (seed printed; replay with ATTN_TEST_SEED) through the public API,
 * for every registered implementation that supports each problem, in f32 and f64:
 *
 *   (a) const-v     every V row equal -> each output row is that row (0 on rows with no visible
 *                   key), and dq, dk, dbias vanish
 *   (b) permute     permuting keys and values (with bias, mask and kv segment ids along j) together
 *                   changes nothing; dk and dv permute the same way
 *   (c) locality    causal / windowed row i ignores keys outside [i+o-left, i+o+right]; the row at
 *                   the boundary does see the boundary key (pins the alignment offset o exactly)
 *   (d) align       top-left and bottom-right agree when Tq == Tk, and differ when not
 *   (e) masked      fully masked rows (mask, Tk = 0, windows, segments, Tq > Tk causal) give out = 0,
 *                   lse = -inf (with sinks lse = logsumexp(sinks)), dq = 0 and no NaN anywhere
 *   (f) operations  flash_attention and scaled_dot_product_attention agree on every output
 *   (g) dropout     same seed -> identical bits, another seed -> another result, the dropped fraction
 *                   of P is within 5 sigma of p, kept entries are P/(1-p), the kept set is SPEC's
 *                   Philox rule
 *   (h) gqa         Hkv < Hq equals Hkv = Hq with repeated k/v heads (and bias heads); dk, dv, dbias
 *                   sum over the group
 *   (i) varlen      packed varlen equals each sequence run alone; padded varlen equals the real rows
 *                   run alone, with 0 / -inf on padded rows
 *   (j) strides     q, k, v in a [B,T,3,H,D] qkv buffer, [B,H,T,D] layouts, a non-unit last stride,
 *                   a negative time stride, transposed bias, stride-0 broadcasts: same results as
 *                   dense tensors, and nothing written outside an output's elements
 *
 * Sizes are odd (1, 3, 17, 63, 65) so they divide no tile size. Outputs are pre-filled with NaN so
 * an element left unwritten shows up. Comparisons: max|a - b| <= tol * max(1, max|b|), tol = 1e-4
 * for f32 and 1e-9 for f64.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "core/dtype.h"
#include "core/philox.h"
#include "core/tensors.h"
#include "testutil.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_B 8
#define SENTINEL 1234.5

/* ---- problem configurations ----------------------------------------------------------------- */

enum { BIAS_NONE, BIAS_FULL, BIAS_KV_HEADS_BCAST_B, BIAS_B_KEYS, BIAS_QK, BIAS_KV_HEADS };
enum { MASK_NONE, MASK_BATCH, MASK_HEADS };

typedef struct cfg {
  const char *name;
  int64_t B, Tq, Tk, Hq, Hkv, D, Dv;
  int causal, top_left, window;
  int64_t wl, wr; /* used when window is set; -1 = unbounded */
  double softcap, dropout;
  int bias;  /* BIAS_FULL [B,Hq,Tq,Tk], BIAS_KV_HEADS_BCAST_B [1,Hkv,Tq,Tk], BIAS_B_KEYS [B,1,1,Tk],
                BIAS_QK [1,1,Tq,Tk], BIAS_KV_HEADS [B,Hkv,Tq,Tk] */
  int mask;  /* MASK_BATCH [B,1,Tq,Tk], MASK_HEADS [1,Hq,Tq,Tk] */
  int alibi; /* attn_alibi */
  int64_t sinks;
  int sinks_shared;
  int segs;
  int varlen;                     /* attn_varlen; Tq/Tk are then the maximum lengths */
  const int32_t *lens_q, *lens_k; /* varlen: B lengths */
  int sdpa;                       /* operation = scaled_dot_product_attention */
} cfg;

static attn_problem make_problem(const cfg *g, attn_dtype dt) {
  attn_problem p;
  attn_problem_init(&p);
  p.dtype = dt;
  p.operation =
      g->sdpa ? ATTN_OPERATION_SCALED_DOT_PRODUCT_ATTENTION : ATTN_OPERATION_FLASH_ATTENTION;
  p.batch = g->B, p.seqlen_q = g->Tq, p.seqlen_k = g->Tk;
  p.heads_q = g->Hq, p.heads_kv = g->Hkv, p.head_dim = g->D, p.head_dim_v = g->Dv;
  p.causal = g->causal;
  p.align = g->top_left ? ATTN_ALIGN_TOP_LEFT : ATTN_ALIGN_BOTTOM_RIGHT;
  if (g->window) p.window_left = g->wl, p.window_right = g->wr;
  p.softcap = g->softcap;
  p.dropout_p = g->dropout;
  if (g->bias != BIAS_NONE) {
    p.has_bias = 1;
    p.bias_dtype = dt;
    int64_t s[6][4] = {{0},
                       {g->B, g->Hq, g->Tq, g->Tk},
                       {1, g->Hkv, g->Tq, g->Tk},
                       {g->B, 1, 1, g->Tk},
                       {1, 1, g->Tq, g->Tk},
                       {g->B, g->Hkv, g->Tq, g->Tk}};
    memcpy(p.bias_shape, s[g->bias], sizeof p.bias_shape);
  }
  if (g->mask != MASK_NONE) {
    p.has_mask = 1;
    int64_t s[3][4] = {{0}, {g->B, 1, g->Tq, g->Tk}, {1, g->Hq, g->Tq, g->Tk}};
    memcpy(p.mask_shape, s[g->mask], sizeof p.mask_shape);
  }
  p.alibi = g->alibi;
  p.num_sinks = g->sinks;
  p.sinks_shared = g->sinks_shared;
  p.has_segment_ids = g->segs;
  p.varlen = g->varlen;
  if (g->varlen == ATTN_VARLEN_PACKED) {
    p.total_q = p.total_k = 0;
    for (int64_t b = 0; b < g->B; ++b) p.total_q += g->lens_q[b], p.total_k += g->lens_k[b];
  }
  return p;
}

/* ---- a case: problem plus data ---------------------------------------------------------------- */

/* Input roles, in the order of the buffers of tcase. */
static const attn_role input_roles[] = {ATTN_ROLE_Q,
                                        ATTN_ROLE_K,
                                        ATTN_ROLE_V,
                                        ATTN_ROLE_DOUT,
                                        ATTN_ROLE_BIAS,
                                        ATTN_ROLE_MASK,
                                        ATTN_ROLE_ALIBI,
                                        ATTN_ROLE_SINKS,
                                        ATTN_ROLE_Q_SEGMENT_IDS,
                                        ATTN_ROLE_KV_SEGMENT_IDS};
#define N_INPUTS ((int)(sizeof input_roles / sizeof input_roles[0]))
enum { IQ, IK, IV, IDOUT, IBIAS, IMASK, IALIBI, ISINKS, IQSEG, IKVSEG };

typedef struct tcase {
  attn_problem p;
  tu_buf in[N_INPUTS]; /* n == 0 / data == NULL when unused */
  int32_t cu_q[MAX_B + 1], cu_k[MAX_B + 1], len_q[MAX_B], len_k[MAX_B];
  uint64_t seed;
} tcase;

/* Results of one run; indices follow out_roles. */
static const attn_role out_roles[] = {ATTN_ROLE_OUT,   ATTN_ROLE_LSE,   ATTN_ROLE_PROBS,
                                      ATTN_ROLE_DQ,    ATTN_ROLE_DK,    ATTN_ROLE_DV,
                                      ATTN_ROLE_DBIAS, ATTN_ROLE_DSINKS};
#define N_OUTPUTS ((int)(sizeof out_roles / sizeof out_roles[0]))
enum { OOUT, OLSE, OPROBS, ODQ, ODK, ODV, ODBIAS, ODSINKS };
static const char *const out_names[] = {"out", "lse", "probs", "dq", "dk", "dv", "dbias", "dsinks"};

typedef struct tres {
  tu_buf r[N_OUTPUTS];
} tres;

static uint64_t rand_u64(tu_rng *rng) {
  uint64_t hi = (uint64_t)tu_int(rng, 0, 0xffffffffLL), lo = (uint64_t)tu_int(rng, 0, 0xffffffffLL);
  return hi << 32 | lo;
}

static void tcase_free(tcase *c) {
  for (int i = 0; i < N_INPUTS; ++i)
    if (c->in[i].data != NULL) tu_buf_free(&c->in[i]);
}

static void tres_free(tres *r) {
  for (int i = 0; i < N_OUTPUTS; ++i)
    if (r->r[i].data != NULL) tu_buf_free(&r->r[i]);
}

static void seq_lens(const tcase *c, int64_t b, int64_t *lq, int64_t *lk) {
  const attn_problem *p = &c->p;
  *lq = p->seqlen_q, *lk = p->seqlen_k;
  if (p->varlen == ATTN_VARLEN_PACKED)
    *lq = c->cu_q[b + 1] - c->cu_q[b], *lk = c->cu_k[b + 1] - c->cu_k[b];
  if (p->varlen == ATTN_VARLEN_PADDED) *lq = c->len_q[b], *lk = c->len_k[b];
}

/* Random data for every input the problem uses. */
static void tcase_make(tcase *c, const cfg *g, attn_dtype dt, tu_rng *rng) {
  memset(c, 0, sizeof *c);
  c->p = make_problem(g, dt);
  if (g->varlen != ATTN_VARLEN_NONE) {
    for (int64_t b = 0; b < g->B; ++b) {
      c->len_q[b] = g->lens_q[b], c->len_k[b] = g->lens_k[b];
      c->cu_q[b + 1] = c->cu_q[b] + g->lens_q[b];
      c->cu_k[b + 1] = c->cu_k[b] + g->lens_k[b];
    }
  }
  c->seed = rand_u64(rng);
  const attn_problem *p = &c->p;
  for (int i = 0; i < N_INPUTS; ++i) {
    attn_role role = input_roles[i];
    if (!attn_role_used(p, role)) continue;
    tu_buf *b = &c->in[i];
    *b = tu_buf_new(attn_role_dtype(p, role), attn_role_numel(p, role));
    switch (i) {
    case IQ:
    case IK: tu_fill_uniform(b, rng, -2.0, 2.0); break;
    case IALIBI: tu_fill_uniform(b, rng, 0.05, 0.5); break;
    case IMASK:
      for (int64_t e = 0; e < b->n; ++e) tu_set(b, e, tu_uniform(rng, 0, 1) < 0.75 ? 1 : 0);
      break;
    case IQSEG:
    case IKVSEG: {
      /* Three segments by relative position; the last query of batch 0 is padding (-1). */
      int64_t T = i == IQSEG ? p->seqlen_q : p->seqlen_k;
      for (int64_t bb = 0; bb < p->batch; ++bb)
        for (int64_t t = 0; t < T; ++t) tu_set(b, bb * T + t, (double)(t * 3 / T));
      if (i == IQSEG && T > 0) tu_set(b, T - 1, -1);
      break;
    }
    default: tu_fill_uniform(b, rng, -1.0, 1.0); break;
    }
  }
}

static void tcase_copy(tcase *dst, const tcase *src) {
  *dst = *src;
  for (int i = 0; i < N_INPUTS; ++i)
    if (src->in[i].data != NULL) dst->in[i] = tu_buf_convert(&src->in[i], src->in[i].dtype);
}

/* ---- running ------------------------------------------------------------------------------------ */

static attn_ctx *ctx;
static int skipped; /* runs an implementation other than the reference declined */

/* Why the last run failed, for the message of its check. */
static char run_error[1200];

/* Plans and runs forward (and backward when grads != NULL) on tensors the caller built.
 * 1 = ran; 0 = failed (run_error says why); -1 = the implementation declined (not the reference). */
static int run_tensors(const char *impl, const attn_problem *p, const attn_inputs *in,
                       const attn_outputs *outs, const attn_tensor *dout, const attn_grads *grads) {
  int is_ref = strcmp(impl, "ref") == 0;
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = impl;
  attn_plan *plan = NULL;
  attn_status st = attn_plan_create(ctx, p, &sel, &plan);
  const char *stage = "plan";
  if (st == ATTN_STATUS_OK) {
    stage = "forward";
    st = attn_plan_forward(plan, in, NULL, 0, outs);
  }
  if (st == ATTN_STATUS_OK && grads != NULL) {
    stage = "backward";
    st = attn_plan_backward(plan, in, outs, dout, NULL, 0, grads);
  }
  attn_plan_destroy(plan);
  if (st == ATTN_STATUS_OK) return 1;
  if (st == ATTN_STATUS_UNSUPPORTED && !is_ref) {
    skipped++;
    return -1;
  }
  snprintf(run_error, sizeof run_error, "%s %s: %s: %s", impl, stage, attn_status_string(st),
           attn_ctx_last_error(ctx));
  return 0;
}

static tu_buf nan_buf(attn_dtype dtype, int64_t n) {
  tu_buf b = tu_buf_new(dtype, n);
  for (int64_t i = 0; i < n; ++i) tu_set(&b, i, NAN);
  return b;
}

enum { RUN_PROBS = 1, RUN_FORWARD_ONLY = 2, RUN_NO_OPTIONAL_GRADS = 4 };

/* Runs a case with dense tensors; results pre-filled with NaN. Same returns as run_tensors. */
static int run_case(const char *impl, const tcase *c, int flags, tres *r) {
  const attn_problem *p = &c->p;
  memset(r, 0, sizeof *r);
  attn_inputs in;
  attn_inputs_init(&in);
  attn_tensor *slots[] = {&in.q,
                          &in.k,
                          &in.v,
                          NULL,
                          &in.bias,
                          &in.mask,
                          &in.alibi_slopes,
                          &in.sinks,
                          &in.q_segment_ids,
                          &in.kv_segment_ids};
  for (int i = 0; i < N_INPUTS; ++i)
    if (slots[i] != NULL && c->in[i].data != NULL) *slots[i] = tu_tensor(&c->in[i]);
  if (p->varlen == ATTN_VARLEN_PACKED) in.cu_seqlens_q = c->cu_q, in.cu_seqlens_k = c->cu_k;
  if (p->varlen == ATTN_VARLEN_PADDED) in.seqlens_q = c->len_q, in.seqlens_k = c->len_k;
  in.dropout_seed = c->seed;
  attn_tensor dout = tu_tensor(&c->in[IDOUT]);

  int want[N_OUTPUTS] = {1, 1, (flags & RUN_PROBS) != 0, 1, 1, 1, p->has_bias, p->num_sinks > 0};
  if (flags & RUN_FORWARD_ONLY)
    want[ODQ] = want[ODK] = want[ODV] = want[ODBIAS] = want[ODSINKS] = 0;
  if (flags & RUN_NO_OPTIONAL_GRADS) want[ODBIAS] = want[ODSINKS] = 0;
  for (int i = 0; i < N_OUTPUTS; ++i)
    if (want[i])
      r->r[i] = nan_buf(attn_role_dtype(p, out_roles[i]), attn_role_numel(p, out_roles[i]));
  attn_outputs outs;
  attn_outputs_init(&outs);
  outs.out = tu_tensor(&r->r[OOUT]);
  outs.lse = tu_tensor(&r->r[OLSE]);
  if (want[OPROBS]) outs.probs = tu_tensor(&r->r[OPROBS]);
  attn_grads grads;
  attn_grads_init(&grads);
  grads.dq = tu_tensor(&r->r[ODQ]);
  grads.dk = tu_tensor(&r->r[ODK]);
  grads.dv = tu_tensor(&r->r[ODV]);
  if (want[ODBIAS]) grads.dbias = tu_tensor(&r->r[ODBIAS]);
  if (want[ODSINKS]) grads.dsinks = tu_tensor(&r->r[ODSINKS]);
  int rc = run_tensors(impl, p, &in, &outs, &dout, (flags & RUN_FORWARD_ONLY) ? NULL : &grads);
  if (rc != 1) tres_free(r);
  return rc;
}

/* Whether the implementation takes the problem: 1 yes; 0 no (a failure for the reference). */
static int usable(const char *impl, const attn_problem *p, const char *what) {
  attn_status st = attn_impl_supports(ctx, impl, p);
  if (st == ATTN_STATUS_OK) return 1;
  if (st == ATTN_STATUS_UNSUPPORTED && strcmp(impl, "ref") != 0) {
    skipped++;
    return 0;
  }
  tu_check(0, "%s %s: attn_impl_supports: %s: %s", what, impl, attn_status_string(st),
           attn_ctx_last_error(ctx));
  return 0;
}

/* ---- comparing --------------------------------------------------------------------------------- */

typedef struct acc {
  char text[2048];
  size_t used;
  int ok;
  double tol;
} acc;

static void acc_init(acc *a, attn_dtype dt) {
  a->text[0] = '\0';
  a->used = 0;
  a->ok = 1;
  a->tol = dt == ATTN_DTYPE_F64 ? 1e-9 : 1e-4;
}

static void acc_note(acc *a, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  int n = vsnprintf(a->text + a->used, sizeof a->text - a->used, fmt, args);
  va_end(args);
  if (n > 0)
    a->used = a->used + (size_t)n < sizeof a->text ? a->used + (size_t)n : sizeof a->text - 1;
}

static void acc_expect(acc *a, int ok, const char *fmt, ...) {
  if (ok) return;
  a->ok = 0;
  char buf[512];
  va_list args;
  va_start(args, fmt);
  vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  acc_note(a, " [%s]", buf);
}

/* x (n elements of a buffer) against y: |x - y| <= tol * max(1, max|y|), equal infinities equal,
 * NaN in either a failure. */
static void acc_cmp(acc *a, const char *name, const tu_buf *x, const double *y, int64_t n) {
  double worst = 0.0, ymax = 0.0;
  int64_t at = -1, bad_at = -1, bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    double u = tu_get(x, i), w = y[i];
    if (isnan(u) || isnan(w) || ((isinf(u) || isinf(w)) && u != w)) {
      if (bad_at < 0) bad_at = i;
      bad++;
      continue;
    }
    if (isinf(w)) continue;
    if (fabs(w) > ymax) ymax = fabs(w);
    if (fabs(u - w) > worst) worst = fabs(u - w), at = i;
  }
  double bound = a->tol * (ymax > 1.0 ? ymax : 1.0);
  acc_note(a, " %s %.1e", name, worst);
  if (bad != 0) {
    a->ok = 0;
    acc_note(a, " [%lld NaN/inf mismatches, first at %lld: %g vs %g]", (long long)bad,
             (long long)bad_at, tu_get(x, bad_at), y[bad_at]);
  } else if (worst > bound) {
    a->ok = 0;
    acc_note(a, " [> %.1e at %lld: %.9g vs %.9g]", bound, (long long)at, tu_get(x, at), y[at]);
  }
}

static double *to_f64(const tu_buf *b) {
  double *d = malloc((size_t)(b->n > 0 ? b->n : 1) * sizeof *d);
  for (int64_t i = 0; i < b->n; ++i) d[i] = tu_get(b, i);
  return d;
}

static void acc_cmp_buf(acc *a, const char *name, const tu_buf *x, const tu_buf *y) {
  if (x->n != y->n) {
    acc_expect(a, 0, "%s has %lld elements, expected %lld", name, (long long)x->n, (long long)y->n);
    return;
  }
  double *d = to_f64(y);
  acc_cmp(a, name, x, d, y->n);
  free(d);
}

/* Every result of x against y (the ones both have). */
static void acc_cmp_all(acc *a, const tres *x, const tres *y) {
  for (int i = 0; i < N_OUTPUTS; ++i)
    if (x->r[i].data != NULL && y->r[i].data != NULL)
      acc_cmp_buf(a, out_names[i], &x->r[i], &y->r[i]);
}

/* No NaN in any result (infinities allowed only in lse). */
static void acc_no_nan(acc *a, const tres *x) {
  for (int i = 0; i < N_OUTPUTS; ++i) {
    const tu_buf *b = &x->r[i];
    if (b->data == NULL) continue;
    int64_t bad = 0, first = -1;
    for (int64_t e = 0; e < b->n; ++e) {
      double u = tu_get(b, e);
      if (isnan(u) || (i != OLSE && isinf(u)) || (i == OLSE && u == INFINITY)) {
        if (first < 0) first = e;
        bad++;
      }
    }
    acc_expect(a, bad == 0, "%s has %lld NaN/inf, first at %lld", out_names[i], (long long)bad,
               (long long)first);
  }
}

static double max_abs_diff(const tu_buf *x, const tu_buf *y) {
  double worst = 0.0;
  for (int64_t i = 0; i < x->n && i < y->n; ++i) {
    double d = fabs(tu_get(x, i) - tu_get(y, i));
    if (d > worst || isnan(d)) worst = isnan(d) ? INFINITY : d;
  }
  return worst;
}

/* ---- geometry helpers -------------------------------------------------------------------------- */

/* Number of token rows of q (or k): B*T dense, total packed. */
static int64_t token_rows(const attn_problem *p, int is_k) {
  if (p->varlen == ATTN_VARLEN_PACKED) return is_k ? p->total_k : p->total_q;
  return p->batch * (is_k ? p->seqlen_k : p->seqlen_q);
}

/* Sequence b and in-sequence position i of token row t. */
static void row_pos(const tcase *c, int64_t t, int is_k, int64_t *b, int64_t *i) {
  const attn_problem *p = &c->p;
  if (p->varlen == ATTN_VARLEN_PACKED) {
    const int32_t *cu = is_k ? c->cu_k : c->cu_q;
    int64_t s = 0;
    while (s + 1 < p->batch && cu[s + 1] <= t) s++;
    *b = s, *i = t - cu[s];
    return;
  }
  int64_t T = is_k ? p->seqlen_k : p->seqlen_q;
  *b = t / T, *i = t % T;
}

static int64_t lse_index(const attn_problem *p, int64_t t, int64_t b, int64_t i, int64_t h) {
  if (p->varlen == ATTN_VARLEN_PACKED) return h * p->total_q + t;
  return (b * p->heads_q + h) * p->seqlen_q + i;
}

/* Broadcast index into a 4-d [shape] tensor at (b, h, i, j). */
static int64_t bcast_index(const int64_t shape[4], int64_t b, int64_t h, int64_t i, int64_t j) {
  int64_t x[4] = {b, h, i, j}, idx = 0;
  for (int d = 0; d < 4; ++d) idx = idx * shape[d] + (shape[d] == 1 ? 0 : x[d]);
  return idx;
}

/* SPEC.md's visible(i, j) for sequence b and query head h, written out independently. */
static int visible(const tcase *c, int64_t b, int64_t h, int64_t i, int64_t j) {
  const attn_problem *p = &c->p;
  int64_t lq, lk;
  seq_lens(c, b, &lq, &lk);
  if (i >= lq || j >= lk) return 0;
  int64_t o = p->align == ATTN_ALIGN_BOTTOM_RIGHT ? lk - lq : 0;
  int64_t wl = p->window_left, wr = p->causal ? 0 : p->window_right;
  if (wl >= 0 && j < i + o - wl) return 0;
  if (wr >= 0 && j > i + o + wr) return 0;
  if (p->has_mask && tu_get(&c->in[IMASK], bcast_index(p->mask_shape, b, h, i, j)) == 0) return 0;
  if (p->has_segment_ids) {
    double qs = tu_get(&c->in[IQSEG], b * p->seqlen_q + i);
    double ks = tu_get(&c->in[IKVSEG], b * p->seqlen_k + j);
    if (qs < 0 || qs != ks) return 0;
  }
  return 1;
}

static int row_has_visible_key(const tcase *c, int64_t b, int64_t h, int64_t i) {
  int64_t lq, lk;
  seq_lens(c, b, &lq, &lk);
  for (int64_t j = 0; j < lk; ++j)
    if (visible(c, b, h, i, j)) return 1;
  return 0;
}

static double sinks_lse(const tcase *c, int64_t h) {
  const attn_problem *p = &c->p;
  double m = -INFINITY, s = 0.0;
  for (int64_t t = 0; t < p->num_sinks; ++t) {
    double a = tu_get(&c->in[ISINKS], p->sinks_shared ? t : h * p->num_sinks + t);
    if (a > m) m = a;
  }
  for (int64_t t = 0; t < p->num_sinks; ++t)
    s += exp(tu_get(&c->in[ISINKS], p->sinks_shared ? t : h * p->num_sinks + t) - m);
  return p->num_sinks > 0 ? m + log(s) : -INFINITY;
}

/* Copies a 4-d block: dst (dense, shape n) = src[off .. off+n) of a dense tensor of shape s. */
static void block_take(tu_buf *dst, const tu_buf *src, const int64_t s[4], const int64_t off[4],
                       const int64_t n[4]) {
  int64_t e = 0;
  for (int64_t a = 0; a < n[0]; ++a)
    for (int64_t b = 0; b < n[1]; ++b)
      for (int64_t c = 0; c < n[2]; ++c)
        for (int64_t d = 0; d < n[3]; ++d, ++e) {
          int64_t idx =
              (((off[0] + a) * s[1] + off[1] + b) * s[2] + off[2] + c) * s[3] + off[3] + d;
          tu_set(dst, e, tu_get(src, idx));
        }
}

/* Puts (or adds) a dense block of shape n into a dense f64 array of shape s at off. */
static void block_put(double *dst, const int64_t s[4], const int64_t off[4], const tu_buf *src,
                      const int64_t n[4], int add) {
  int64_t e = 0;
  for (int64_t a = 0; a < n[0]; ++a)
    for (int64_t b = 0; b < n[1]; ++b)
      for (int64_t c = 0; c < n[2]; ++c)
        for (int64_t d = 0; d < n[3]; ++d, ++e) {
          int64_t idx =
              (((off[0] + a) * s[1] + off[1] + b) * s[2] + off[2] + c) * s[3] + off[3] + d;
          dst[idx] = add ? dst[idx] + tu_get(src, e) : tu_get(src, e);
        }
}

/* A role's shape right-aligned into 4 dimensions. */
static void shape4(const attn_problem *p, attn_role role, int64_t s[4]) {
  int64_t shape[ATTN_MAX_DIMS];
  int nd = attn_role_shape(p, role, shape);
  for (int d = 0; d < 4; ++d) s[d] = d < 4 - nd ? 1 : shape[d - (4 - nd)];
}

static double *filled(int64_t n, double value) {
  double *d = malloc((size_t)(n > 0 ? n : 1) * sizeof *d);
  for (int64_t i = 0; i < n; ++i) d[i] = value;
  return d;
}

/* ---- the properties ---------------------------------------------------------------------------- */

enum {
  P_CONST_V,
  P_PERMUTE,
  P_LOCALITY,
  P_ALIGN,
  P_MASKED,
  P_OPS,
  P_DROPOUT,
  P_GQA,
  P_VARLEN,
  P_STRIDES,
  P_COUNT
};
static const char *const prop_names[P_COUNT] = {
    "(a) const-v",    "(b) permute", "(c) locality", "(d) align",  "(e) masked",
    "(f) operations", "(g) dropout", "(h) gqa",      "(i) varlen", "(j) strides"};
static int prop_runs[P_COUNT]; /* checks that ran, per property: each must run at least once */

static void report(int prop, const char *impl, attn_dtype dt, const char *name, const acc *a) {
  prop_runs[prop]++;
  tu_check(a->ok, "%s %s %s %s:%s", prop_names[prop], name, impl, attn_dtype_name(dt), a->text);
}

static void report_error(int prop, const char *impl, attn_dtype dt, const char *name) {
  tu_check(0, "%s %s %s %s: %s", prop_names[prop], name, impl, attn_dtype_name(dt), run_error);
}

/* Runs a case; 1 when it ran, 0 when skipped or failed (a failure is recorded). */
static int run_or_report(int prop, const char *impl, attn_dtype dt, const char *name,
                         const tcase *c, int flags, tres *r) {
  int rc = run_case(impl, c, flags, r);
  if (rc == 0) report_error(prop, impl, dt, name);
  return rc == 1;
}

static const int32_t padded_lq[] = {17, 1, 0, 9}, padded_lk[] = {63, 0, 5, 9};
static const int32_t packed_lq[] = {3, 0, 17, 1, 9}, packed_lk[] = {5, 3, 17, 0, 9};

/* (a) All V rows of a kv head equal c_g: out = c_g on rows with a visible key, 0 on others; since
 * dP_ij = dout_i . c_g = Delta_i, dX = 0 and so dq = dk = dbias = 0. */
static void prop_const_v(const char *impl, attn_dtype dt, tu_rng *rng) {
  const cfg cfgs[] = {
      {.name = "plain", .B = 2, .Tq = 17, .Tk = 63, .Hq = 2, .Hkv = 1, .D = 17, .Dv = 3},
      {.name = "causal-Tq>Tk+bias+alibi+softcap+gqa",
       .B = 1,
       .Tq = 65,
       .Tk = 17,
       .Hq = 4,
       .Hkv = 2,
       .D = 3,
       .Dv = 5,
       .causal = 1,
       .bias = BIAS_FULL,
       .alibi = ATTN_ALIBI_PER_HEAD,
       .softcap = 5},
      {.name = "top-left-window+mask+segments",
       .B = 2,
       .Tq = 63,
       .Tk = 65,
       .Hq = 1,
       .Hkv = 1,
       .D = 1,
       .Dv = 1,
       .top_left = 1,
       .window = 1,
       .wl = 3,
       .wr = 1,
       .mask = MASK_BATCH,
       .segs = 1},
      {.name = "padded-causal",
       .B = 4,
       .Tq = 17,
       .Tk = 63,
       .Hq = 2,
       .Hkv = 2,
       .D = 3,
       .Dv = 3,
       .causal = 1,
       .varlen = ATTN_VARLEN_PADDED,
       .lens_q = padded_lq,
       .lens_k = padded_lk},
      {.name = "packed-window",
       .B = 5,
       .Tq = 17,
       .Tk = 17,
       .Hq = 3,
       .Hkv = 1,
       .D = 17,
       .Dv = 1,
       .window = 1,
       .wl = 2,
       .wr = 0,
       .varlen = ATTN_VARLEN_PACKED,
       .lens_q = packed_lq,
       .lens_k = packed_lk},
  };
  for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; ++k) {
    const cfg *g = &cfgs[k];
    tcase c;
    tcase_make(&c, g, dt, rng);
    const attn_problem *p = &c.p;
    if (!usable(impl, p, prop_names[P_CONST_V])) {
      tcase_free(&c);
      continue;
    }
    int64_t Dv = g->Dv, r = g->Hq / g->Hkv;
    double cv[64];
    for (int64_t e = 0; e < g->Hkv * Dv; ++e) cv[e] = attn_round_to(dt, tu_uniform(rng, -1, 1));
    for (int64_t t = 0; t < token_rows(p, 1); ++t)
      for (int64_t e = 0; e < g->Hkv * Dv; ++e) tu_set(&c.in[IV], t * g->Hkv * Dv + e, cv[e]);
    tres res;
    if (run_or_report(P_CONST_V, impl, dt, g->name, &c, 0, &res)) {
      acc a;
      acc_init(&a, dt);
      double *want = filled(res.r[OOUT].n, 0.0);
      int64_t rows = 0, seen = 0, lse_bad = 0;
      for (int64_t t = 0; t < token_rows(p, 0); ++t) {
        int64_t b, i;
        row_pos(&c, t, 0, &b, &i);
        for (int64_t h = 0; h < g->Hq; ++h) {
          int vis = row_has_visible_key(&c, b, h, i);
          double lse = tu_get(&res.r[OLSE], lse_index(p, t, b, i, h));
          if (vis != (isfinite(lse) != 0)) lse_bad++;
          rows++, seen += vis;
          if (vis)
            for (int64_t e = 0; e < Dv; ++e) want[(t * g->Hq + h) * Dv + e] = cv[(h / r) * Dv + e];
        }
      }
      acc_cmp(&a, "out", &res.r[OOUT], want, res.r[OOUT].n);
      free(want);
      acc_expect(&a, lse_bad == 0,
                 "%lld rows have finite lse exactly when they have no visible key",
                 (long long)lse_bad);
      acc_expect(&a, seen > 0, "no row has a visible key: the check is empty");
      acc_note(&a, " (%lld/%lld rows visible)", (long long)seen, (long long)rows);
      int zeros[] = {ODQ, ODK, ODBIAS};
      for (int z = 0; z < 3; ++z) {
        if (res.r[zeros[z]].data == NULL) continue;
        double *zero = filled(res.r[zeros[z]].n, 0.0);
        acc_cmp(&a, out_names[zeros[z]], &res.r[zeros[z]], zero, res.r[zeros[z]].n);
        free(zero);
      }
      acc_no_nan(&a, &res);
      report(P_CONST_V, impl, dt, g->name, &a);
      tres_free(&res);
    }
    tcase_free(&c);
  }
}

/* Permutes the key dimension (of size tk, between outer and inner blocks) of a dense buffer. */
static void permute_keys(tu_buf *b, int64_t outer, int64_t tk, int64_t inner, const int64_t *perm) {
  tu_buf copy = tu_buf_convert(b, b->dtype);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < tk; ++j)
      for (int64_t e = 0; e < inner; ++e)
        tu_set(b, (o * tk + j) * inner + e, tu_get(&copy, (o * tk + perm[j]) * inner + e));
  tu_buf_free(&copy);
}

/* (b) Keys, values and everything indexed by j permuted together: out, lse, dq, dsinks unchanged,
 * dk, dv, dbias permuted. */
static void prop_permute(const char *impl, attn_dtype dt, tu_rng *rng) {
  const cfg cfgs[] = {
      {.name = "gqa-dv!=d", .B = 2, .Tq = 17, .Tk = 65, .Hq = 4, .Hkv = 2, .D = 17, .Dv = 3},
      {.name = "softcap+sinks",
       .B = 1,
       .Tq = 63,
       .Tk = 63,
       .Hq = 3,
       .Hkv = 3,
       .D = 3,
       .Dv = 5,
       .softcap = 2.5,
       .sinks = 2},
      {.name = "bias+mask+segments-permuted-along",
       .B = 2,
       .Tq = 3,
       .Tk = 63,
       .Hq = 2,
       .Hkv = 1,
       .D = 1,
       .Dv = 17,
       .bias = BIAS_FULL,
       .mask = MASK_BATCH,
       .segs = 1,
       .sinks = 1,
       .sinks_shared = 1},
      {.name = "one-key", .B = 1, .Tq = 17, .Tk = 1, .Hq = 1, .Hkv = 1, .D = 65, .Dv = 1},
  };
  for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; ++k) {
    const cfg *g = &cfgs[k];
    tcase c, c2;
    tcase_make(&c, g, dt, rng);
    const attn_problem *p = &c.p;
    if (!usable(impl, p, prop_names[P_PERMUTE])) {
      tcase_free(&c);
      continue;
    }
    int64_t Tk = g->Tk, perm[128];
    for (int64_t j = 0; j < Tk; ++j) perm[j] = j;
    for (int64_t j = Tk - 1; j > 0; --j) { /* Fisher-Yates */
      int64_t s = tu_int(rng, 0, j), tmp = perm[j];
      perm[j] = perm[s], perm[s] = tmp;
    }
    tcase_copy(&c2, &c);
    permute_keys(&c2.in[IK], g->B, Tk, g->Hkv * g->D, perm);
    permute_keys(&c2.in[IV], g->B, Tk, g->Hkv * g->Dv, perm);
    if (p->has_bias)
      permute_keys(&c2.in[IBIAS], attn_role_numel(p, ATTN_ROLE_BIAS) / Tk, Tk, 1, perm);
    if (p->has_mask)
      permute_keys(&c2.in[IMASK], attn_role_numel(p, ATTN_ROLE_MASK) / Tk, Tk, 1, perm);
    if (p->has_segment_ids) permute_keys(&c2.in[IKVSEG], g->B, Tk, 1, perm);
    tres r1, r2;
    if (run_or_report(P_PERMUTE, impl, dt, g->name, &c, 0, &r1)) {
      if (run_or_report(P_PERMUTE, impl, dt, g->name, &c2, 0, &r2)) {
        permute_keys(&r1.r[ODK], g->B, Tk, g->Hkv * g->D, perm);
        permute_keys(&r1.r[ODV], g->B, Tk, g->Hkv * g->Dv, perm);
        if (p->has_bias)
          permute_keys(&r1.r[ODBIAS], attn_role_numel(p, ATTN_ROLE_DBIAS) / Tk, Tk, 1, perm);
        acc a;
        acc_init(&a, dt);
        acc_cmp_all(&a, &r2, &r1);
        acc_no_nan(&a, &r2);
        report(P_PERMUTE, impl, dt, g->name, &a);
        tres_free(&r2);
      }
      tres_free(&r1);
    }
    tcase_free(&c2);
    tcase_free(&c);
  }
}

/* (c) Row i sees keys i+o-left .. i+o+right only. Changing the keys after a cut c (or up to it)
 * leaves every row that cannot see them unchanged (out, lse, dq), and the first row that can see
 * the key at c changes: that pins the offset o exactly. */
static void prop_locality(const char *impl, attn_dtype dt, tu_rng *rng) {
  const cfg cfgs[] = {
      {.name = "causal-br-Tq<Tk",
       .B = 2,
       .Tq = 17,
       .Tk = 63,
       .Hq = 2,
       .Hkv = 1,
       .D = 17,
       .Dv = 3,
       .causal = 1},
      {.name = "causal-br-Tq>Tk",
       .B = 2,
       .Tq = 65,
       .Tk = 17,
       .Hq = 2,
       .Hkv = 2,
       .D = 3,
       .Dv = 3,
       .causal = 1},
      {.name = "causal-br-square+bias",
       .B = 1,
       .Tq = 63,
       .Tk = 63,
       .Hq = 2,
       .Hkv = 1,
       .D = 3,
       .Dv = 3,
       .causal = 1,
       .bias = BIAS_QK},
      {.name = "causal-tl-Tq<Tk",
       .B = 1,
       .Tq = 17,
       .Tk = 63,
       .Hq = 1,
       .Hkv = 1,
       .D = 17,
       .Dv = 17,
       .causal = 1,
       .top_left = 1},
      {.name = "causal-tl-Tq>Tk+alibi",
       .B = 1,
       .Tq = 63,
       .Tk = 17,
       .Hq = 2,
       .Hkv = 1,
       .D = 3,
       .Dv = 1,
       .causal = 1,
       .top_left = 1,
       .alibi = ATTN_ALIBI_PER_HEAD},
      {.name = "window(5,2)-br",
       .B = 1,
       .Tq = 63,
       .Tk = 65,
       .Hq = 2,
       .Hkv = 2,
       .D = 3,
       .Dv = 3,
       .window = 1,
       .wl = 5,
       .wr = 2},
      {.name = "window(3,0)-tl+softcap",
       .B = 2,
       .Tq = 65,
       .Tk = 63,
       .Hq = 1,
       .Hkv = 1,
       .D = 1,
       .Dv = 3,
       .window = 1,
       .wl = 3,
       .wr = 0,
       .top_left = 1,
       .softcap = 3},
      {.name = "causal+window(4)-br-Tq<Tk",
       .B = 1,
       .Tq = 17,
       .Tk = 65,
       .Hq = 1,
       .Hkv = 1,
       .D = 17,
       .Dv = 3,
       .causal = 1,
       .window = 1,
       .wl = 4,
       .wr = -1},
  };
  for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; ++k) {
    const cfg *g = &cfgs[k];
    attn_problem p0 = make_problem(g, dt);
    int64_t o = g->top_left ? 0 : g->Tk - g->Tq;
    int64_t right = g->causal ? 0 : (g->window ? g->wr : -1);
    int64_t left = g->window ? g->wl : -1;
    if (!usable(impl, &p0, prop_names[P_LOCALITY])) continue;
    for (int dir = 0; dir < 2; ++dir) { /* 0: keys after the cut change; 1: keys up to it */
      int64_t bound = dir == 0 ? right : left;
      if (bound < 0) continue;
      /* The boundary row i*: its last (first) visible key c = i* + o + right (i* + o - left). */
      int64_t cand[128], n = 0;
      for (int64_t i = 0; i < g->Tq; ++i) {
        int64_t cut = dir == 0 ? i + o + right : i + o - left;
        if (cut >= 0 && cut < g->Tk) cand[n++] = i;
      }
      if (n == 0) continue;
      int64_t istar = cand[tu_int(rng, 0, n - 1)];
      int64_t cut = dir == 0 ? istar + o + right : istar + o - left;
      tcase c, c2;
      tcase_make(&c, g, dt, rng);
      tcase_copy(&c2, &c);
      for (int64_t b = 0; b < g->B; ++b)
        for (int64_t j = 0; j < g->Tk; ++j) {
          if (dir == 0 ? j < cut : j > cut) continue;
          for (int64_t e = 0; e < g->Hkv * g->D; ++e)
            tu_set(&c2.in[IK], (b * g->Tk + j) * g->Hkv * g->D + e, tu_uniform(rng, -2, 2));
          for (int64_t e = 0; e < g->Hkv * g->Dv; ++e)
            tu_set(&c2.in[IV], (b * g->Tk + j) * g->Hkv * g->Dv + e, tu_uniform(rng, -1, 1));
        }
      char name[160];
      snprintf(name, sizeof name, "%s %s-cut=%lld(row %lld)", g->name, dir == 0 ? "future" : "past",
               (long long)cut, (long long)istar);
      tres r1, r2;
      if (run_or_report(P_LOCALITY, impl, dt, name, &c, RUN_NO_OPTIONAL_GRADS, &r1)) {
        if (run_or_report(P_LOCALITY, impl, dt, name, &c2, RUN_NO_OPTIONAL_GRADS, &r2)) {
          acc a;
          acc_init(&a, dt);
          /* Rows that cannot see the changed keys: everything but rows >= i* (<= i* for past). */
          const int ro[3] = {OOUT, OLSE, ODQ};
          double worst[3] = {0, 0, 0}, boundary_change = 0.0;
          int64_t width[3] = {g->Dv, 1, g->D};
          for (int64_t b = 0; b < g->B; ++b)
            for (int64_t h = 0; h < g->Hq; ++h)
              for (int64_t i = 0; i < g->Tq; ++i) {
                int untouched = dir == 0 ? i < istar : i > istar;
                for (int q = 0; q < 3; ++q) {
                  for (int64_t e = 0; e < width[q]; ++e) {
                    int64_t idx = q == 1 ? (b * g->Hq + h) * g->Tq + i
                                         : ((b * g->Tq + i) * g->Hq + h) * width[q] + e;
                    double x = tu_get(&r1.r[ro[q]], idx), y = tu_get(&r2.r[ro[q]], idx);
                    double d = x == y ? 0.0 : fabs(x - y);
                    if (isnan(d)) d = INFINITY;
                    if (untouched && d > worst[q]) worst[q] = d;
                    if (i == istar && q == 0 && d > boundary_change) boundary_change = d;
                  }
                }
              }
          for (int q = 0; q < 3; ++q) {
            acc_note(&a, " %s-unchanged %.1e", out_names[ro[q]], worst[q]);
            acc_expect(&a, worst[q] <= a.tol, "%s of rows that cannot see the change changed",
                       out_names[ro[q]]);
          }
          acc_note(&a, " boundary-row-change %.1e", boundary_change);
          acc_expect(&a, boundary_change > 1e-5,
                     "row %lld, which sees key %lld, did not change: wrong alignment or bound",
                     (long long)istar, (long long)cut);
          acc_no_nan(&a, &r1);
          report(P_LOCALITY, impl, dt, name, &a);
          tres_free(&r2);
        }
        tres_free(&r1);
      }
      tcase_free(&c2);
      tcase_free(&c);
    }
  }
}

/* (d) With Tq == Tk the offset is 0 under both alignments, so they agree; with Tq != Tk causal
 * they must not (or the flag is ignored). */
static void prop_align(const char *impl, attn_dtype dt, tu_rng *rng) {
  const cfg cfgs[] = {
      {.name = "causal-63",
       .B = 2,
       .Tq = 63,
       .Tk = 63,
       .Hq = 2,
       .Hkv = 1,
       .D = 17,
       .Dv = 3,
       .causal = 1},
      {.name = "window(5,3)-17",
       .B = 1,
       .Tq = 17,
       .Tk = 17,
       .Hq = 1,
       .Hkv = 1,
       .D = 3,
       .Dv = 3,
       .window = 1,
       .wl = 5,
       .wr = 3},
      {.name = "window(0,0)+alibi-65",
       .B = 1,
       .Tq = 65,
       .Tk = 65,
       .Hq = 2,
       .Hkv = 2,
       .D = 1,
       .Dv = 1,
       .window = 1,
       .wl = 0,
       .wr = 0,
       .alibi = ATTN_ALIBI_PER_BATCH_HEAD},
      {.name = "causal+window(7)+alibi+softcap+sinks+bias-17",
       .B = 2,
       .Tq = 17,
       .Tk = 17,
       .Hq = 4,
       .Hkv = 2,
       .D = 3,
       .Dv = 5,
       .causal = 1,
       .window = 1,
       .wl = 7,
       .wr = -1,
       .alibi = ATTN_ALIBI_PER_HEAD,
       .softcap = 4,
       .sinks = 2,
       .bias = BIAS_KV_HEADS_BCAST_B},
      {.name = "causal-17x63-must-differ",
       .B = 1,
       .Tq = 17,
       .Tk = 63,
       .Hq = 1,
       .Hkv = 1,
       .D = 3,
       .Dv = 3,
       .causal = 1},
  };
  for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; ++k) {
    const cfg *g = &cfgs[k];
    tcase c, c2;
    tcase_make(&c, g, dt, rng);
    tcase_copy(&c2, &c);
    c2.p.align = ATTN_ALIGN_TOP_LEFT;
    if (!usable(impl, &c.p, prop_names[P_ALIGN]) || !usable(impl, &c2.p, prop_names[P_ALIGN])) {
      tcase_free(&c2);
      tcase_free(&c);
      continue;
    }
    tres r1, r2;
    if (run_or_report(P_ALIGN, impl, dt, g->name, &c, 0, &r1)) {
      if (run_or_report(P_ALIGN, impl, dt, g->name, &c2, 0, &r2)) {
        acc a;
        acc_init(&a, dt);
        if (g->Tq == g->Tk) {
          acc_cmp_all(&a, &r2, &r1);
        } else {
          double d = max_abs_diff(&r1.r[OOUT], &r2.r[OOUT]);
          acc_note(&a, " out differs by %.2e", d);
          acc_expect(&a, d > 1e-2, "top-left and bottom-right agree although Tq != Tk");
        }
        acc_no_nan(&a, &r1);
        acc_no_nan(&a, &r2);
        report(P_ALIGN, impl, dt, g->name, &a);
        tres_free(&r2);
      }
      tres_free(&r1);
    }
    tcase_free(&c2);
    tcase_free(&c);
  }
}

/* (e) Rows with no visible key: out = 0, lse = -inf (logsumexp of the sinks with sinks), dq = 0,
 * and no NaN anywhere, forward and backward; other rows have a finite lse. The test decides which
 * rows are fully masked with its own visible(). */
static void prop_masked(const char *impl, attn_dtype dt, tu_rng *rng) {
  const cfg base[] = {
      {.name = "mask-rows-zero",
       .B = 2,
       .Tq = 17,
       .Tk = 63,
       .Hq = 2,
       .Hkv = 1,
       .D = 3,
       .Dv = 3,
       .mask = MASK_BATCH,
       .bias = BIAS_FULL,
       .softcap = 3},
      {.name = "Tk=0", .B = 2, .Tq = 17, .Tk = 0, .Hq = 2, .Hkv = 1, .D = 3, .Dv = 5},
      {.name = "tl-window(1,1)-Tq>Tk",
       .B = 1,
       .Tq = 17,
       .Tk = 3,
       .Hq = 2,
       .Hkv = 2,
       .D = 17,
       .Dv = 1,
       .top_left = 1,
       .window = 1,
       .wl = 1,
       .wr = 1,
       .alibi = ATTN_ALIBI_PER_HEAD},
      {.name = "br-causal-Tq>Tk",
       .B = 1,
       .Tq = 65,
       .Tk = 17,
       .Hq = 1,
       .Hkv = 1,
       .D = 1,
       .Dv = 3,
       .causal = 1},
      {.name = "br-window(0,0)+mask-off-diagonal",
       .B = 1,
       .Tq = 3,
       .Tk = 63,
       .Hq = 2,
       .Hkv = 1,
       .D = 3,
       .Dv = 3,
       .window = 1,
       .wl = 0,
       .wr = 0,
       .mask = MASK_HEADS},
      {.name = "segments-negative",
       .B = 2,
       .Tq = 17,
       .Tk = 17,
       .Hq = 2,
       .Hkv = 1,
       .D = 3,
       .Dv = 3,
       .segs = 1,
       .causal = 1},
      {.name = "padded-len_k=0",
       .B = 4,
       .Tq = 17,
       .Tk = 63,
       .Hq = 2,
       .Hkv = 1,
       .D = 3,
       .Dv = 3,
       .varlen = ATTN_VARLEN_PADDED,
       .lens_q = padded_lq,
       .lens_k = padded_lk},
  };
  for (size_t k = 0; k < sizeof base / sizeof base[0]; ++k) {
    for (int with_sinks = 0; with_sinks < 2; ++with_sinks) {
      for (int sdpa = 0; sdpa < 2; ++sdpa) {
        cfg g = base[k];
        if (with_sinks) g.sinks = 1 + (int64_t)k % 3, g.sinks_shared = (int)(k % 2);
        g.sdpa = sdpa;
        tcase c;
        tcase_make(&c, &g, dt, rng);
        const attn_problem *p = &c.p;
        if (!usable(impl, p, prop_names[P_MASKED])) {
          tcase_free(&c);
          continue;
        }
        /* Fully mask some rows explicitly. */
        if (p->has_mask && g.mask == MASK_BATCH)
          for (int64_t b = 0; b < g.B; ++b)
            for (int64_t i = 0; i < g.Tq; i += 3)
              for (int64_t j = 0; j < g.Tk; ++j) tu_set(&c.in[IMASK], (b * g.Tq + i) * g.Tk + j, 0);
        if (p->has_mask && g.mask == MASK_HEADS) {
          /* Window (0, 0) bottom-right: row i sees only j = i + Tk - Tq; masking that key for the
           * even rows leaves them nothing. */
          for (int64_t e = 0; e < c.in[IMASK].n; ++e) tu_set(&c.in[IMASK], e, 1);
          for (int64_t h = 0; h < g.Hq; ++h)
            for (int64_t i = 0; i < g.Tq; i += 2)
              tu_set(&c.in[IMASK], (h * g.Tq + i) * g.Tk + i + g.Tk - g.Tq, 0);
        }
        if (p->has_segment_ids)
          for (int64_t i = 0; i < g.Tq; ++i) tu_set(&c.in[IQSEG], i, -1 - (double)(i % 2));
        char name[160];
        snprintf(name, sizeof name, "%s%s %s", g.name, with_sinks ? "+sinks" : "",
                 sdpa ? "sdpa" : "flash");
        tres res;
        if (!run_or_report(P_MASKED, impl, dt, name, &c, sdpa ? RUN_PROBS : 0, &res)) {
          tcase_free(&c);
          continue;
        }
        acc a;
        acc_init(&a, dt);
        double *want_out = filled(res.r[OOUT].n, NAN), *want_dq = filled(res.r[ODQ].n, NAN);
        double *want_lse = filled(res.r[OLSE].n, NAN);
        int64_t masked = 0, open = 0, open_bad = 0;
        for (int64_t t = 0; t < token_rows(p, 0); ++t) {
          int64_t b, i;
          row_pos(&c, t, 0, &b, &i);
          for (int64_t h = 0; h < g.Hq; ++h) {
            int64_t li = lse_index(p, t, b, i, h);
            double got = tu_get(&res.r[OLSE], li);
            if (row_has_visible_key(&c, b, h, i)) {
              open++;
              want_lse[li] = got; /* compared only for finiteness */
              if (!isfinite(got)) open_bad++;
              for (int64_t e = 0; e < g.Dv; ++e)
                want_out[(t * g.Hq + h) * g.Dv + e] =
                    tu_get(&res.r[OOUT], (t * g.Hq + h) * g.Dv + e);
              for (int64_t e = 0; e < g.D; ++e)
                want_dq[(t * g.Hq + h) * g.D + e] = tu_get(&res.r[ODQ], (t * g.Hq + h) * g.D + e);
              continue;
            }
            masked++;
            int64_t lq, lk;
            seq_lens(&c, b, &lq, &lk);
            /* A padded row (i >= len_q) is -inf even with sinks; a fully masked real row with
             * sinks has lse = logsumexp(sinks). */
            want_lse[li] = i < lq ? sinks_lse(&c, h) : -INFINITY;
            for (int64_t e = 0; e < g.Dv; ++e) want_out[(t * g.Hq + h) * g.Dv + e] = 0.0;
            for (int64_t e = 0; e < g.D; ++e) want_dq[(t * g.Hq + h) * g.D + e] = 0.0;
          }
        }
        /* Unmasked rows were copied from the result: only NaN there can fail. */
        acc_cmp(&a, "out", &res.r[OOUT], want_out, res.r[OOUT].n);
        acc_cmp(&a, "lse", &res.r[OLSE], want_lse, res.r[OLSE].n);
        acc_cmp(&a, "dq", &res.r[ODQ], want_dq, res.r[ODQ].n);
        free(want_out), free(want_dq), free(want_lse);
        acc_note(&a, " (%lld masked rows, %lld open)", (long long)masked, (long long)open);
        acc_expect(&a, masked > 0, "no fully masked row: the check is empty");
        acc_expect(&a, open_bad == 0, "%lld rows with a visible key have a non-finite lse",
                   (long long)open_bad);
        if (sdpa) {
          /* probabilities of masked rows are 0 */
          int64_t bad = 0;
          for (int64_t b = 0; b < g.B; ++b)
            for (int64_t h = 0; h < g.Hq; ++h)
              for (int64_t i = 0; i < g.Tq; ++i) {
                if (row_has_visible_key(&c, b, h, i)) continue;
                for (int64_t j = 0; j < g.Tk; ++j)
                  bad += tu_get(&res.r[OPROBS], ((b * g.Hq + h) * g.Tq + i) * g.Tk + j) != 0.0;
              }
          acc_expect(&a, bad == 0, "%lld probabilities of masked rows are not 0", (long long)bad);
        }
        acc_no_nan(&a, &res);
        report(P_MASKED, impl, dt, name, &a);
        tres_free(&res);
        tcase_free(&c);
      }
    }
  }
}

/* (f) Both operations compute the same function. */
static void prop_ops(const char *impl, attn_dtype dt, tu_rng *rng) {
  const cfg cfgs[] = {
      {.name = "everything-dense",
       .B = 2,
       .Tq = 17,
       .Tk = 63,
       .Hq = 4,
       .Hkv = 2,
       .D = 17,
       .Dv = 3,
       .causal = 1,
       .window = 1,
       .wl = 9,
       .wr = -1,
       .softcap = 4,
       .dropout = 0.2,
       .bias = BIAS_KV_HEADS_BCAST_B,
       .mask = MASK_BATCH,
       .alibi = ATTN_ALIBI_PER_BATCH_HEAD,
       .sinks = 2,
       .segs = 1},
      {.name = "top-left+shared-sinks+bias[B,1,1,Tk]+dropout",
       .B = 1,
       .Tq = 65,
       .Tk = 17,
       .Hq = 2,
       .Hkv = 1,
       .D = 3,
       .Dv = 5,
       .top_left = 1,
       .causal = 1,
       .sinks = 3,
       .sinks_shared = 1,
       .bias = BIAS_B_KEYS,
       .dropout = 0.1},
      {.name = "packed+alibi+dropout+sinks",
       .B = 5,
       .Tq = 17,
       .Tk = 17,
       .Hq = 2,
       .Hkv = 1,
       .D = 3,
       .Dv = 3,
       .causal = 1,
       .alibi = ATTN_ALIBI_PER_BATCH_HEAD,
       .dropout = 0.3,
       .sinks = 1,
       .varlen = ATTN_VARLEN_PACKED,
       .lens_q = packed_lq,
       .lens_k = packed_lk},
      {.name = "padded+bias+mask-heads+dropout",
       .B = 4,
       .Tq = 17,
       .Tk = 63,
       .Hq = 2,
       .Hkv = 2,
       .D = 1,
       .Dv = 1,
       .bias = BIAS_FULL,
       .mask = MASK_HEADS,
       .dropout = 0.25,
       .varlen = ATTN_VARLEN_PADDED,
       .lens_q = padded_lq,
       .lens_k = padded_lk},
      {.name = "Tk=0", .B = 1, .Tq = 3, .Tk = 0, .Hq = 1, .Hkv = 1, .D = 3, .Dv = 3, .sinks = 1},
      {.name = "decode-Tq=1",
       .B = 3,
       .Tq = 1,
       .Tk = 65,
       .Hq = 4,
       .Hkv = 1,
       .D = 17,
       .Dv = 17,
       .causal = 1,
       .softcap = 2},
  };
  for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; ++k) {
    const cfg *g = &cfgs[k];
    tcase c, c2;
    tcase_make(&c, g, dt, rng);
    tcase_copy(&c2, &c);
    c2.p.operation = ATTN_OPERATION_SCALED_DOT_PRODUCT_ATTENTION;
    if (!usable(impl, &c.p, prop_names[P_OPS]) || !usable(impl, &c2.p, prop_names[P_OPS])) {
      tcase_free(&c2);
      tcase_free(&c);
      continue;
    }
    tres r1, r2;
    if (run_or_report(P_OPS, impl, dt, g->name, &c, 0, &r1)) {
      if (run_or_report(P_OPS, impl, dt, g->name, &c2, RUN_PROBS, &r2)) {
        acc a;
        acc_init(&a, dt);
        acc_cmp_all(&a, &r2, &r1);
        acc_no_nan(&a, &r2);
        report(P_OPS, impl, dt, g->name, &a);
        tres_free(&r2);
      }
      tres_free(&r1);
    }
    tcase_free(&c2);
    tcase_free(&c);
  }
}

static int bits_equal(const tu_buf *x, const tu_buf *y) {
  return x->n == y->n && memcmp(x->data, y->data, (size_t)x->n * attn_dtype_size(x->dtype)) == 0;
}

/* (g) Dropout: deterministic in the seed, varies with it, drops a fraction p of P (5 sigma), keeps
 * the others scaled by 1/(1-p), and keeps exactly SPEC's Philox set. */
static void prop_dropout(const char *impl, attn_dtype dt, tu_rng *rng) {
  const cfg cfgs[] = {
      {.name = "p=0.3",
       .B = 2,
       .Tq = 63,
       .Tk = 65,
       .Hq = 2,
       .Hkv = 1,
       .D = 17,
       .Dv = 3,
       .dropout = 0.3,
       .sdpa = 1},
      {.name = "p=0.05+causal+gqa",
       .B = 1,
       .Tq = 65,
       .Tk = 63,
       .Hq = 4,
       .Hkv = 2,
       .D = 3,
       .Dv = 5,
       .dropout = 0.05,
       .causal = 1,
       .sdpa = 1},
      {.name = "p=0.9+sinks",
       .B = 1,
       .Tq = 17,
       .Tk = 63,
       .Hq = 3,
       .Hkv = 3,
       .D = 1,
       .Dv = 1,
       .dropout = 0.9,
       .sinks = 1,
       .sdpa = 1},
  };
  for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; ++k) {
    const cfg *g = &cfgs[k];
    tcase c, c0, c2;
    tcase_make(&c, g, dt, rng);
    if (!usable(impl, &c.p, prop_names[P_DROPOUT])) {
      tcase_free(&c);
      continue;
    }
    tcase_copy(&c0, &c);
    c0.p.dropout_p = 0.0;
    tcase_copy(&c2, &c);
    c2.seed = c.seed ^ 0x9e3779b97f4a7c15ull;
    tres r0, r1, r1b, r2;
    int ok = run_or_report(P_DROPOUT, impl, dt, g->name, &c0, RUN_PROBS, &r0);
    if (ok && !run_or_report(P_DROPOUT, impl, dt, g->name, &c, RUN_PROBS, &r1)) {
      tres_free(&r0);
      ok = 0;
    }
    if (ok && !run_or_report(P_DROPOUT, impl, dt, g->name, &c, RUN_PROBS, &r1b)) {
      tres_free(&r0), tres_free(&r1);
      ok = 0;
    }
    if (ok && !run_or_report(P_DROPOUT, impl, dt, g->name, &c2, RUN_PROBS, &r2)) {
      tres_free(&r0), tres_free(&r1), tres_free(&r1b);
      ok = 0;
    }
    if (ok) {
      acc a;
      acc_init(&a, dt);
      int same = 1;
      for (int i = 0; i < N_OUTPUTS; ++i)
        if (r1.r[i].data != NULL) same &= bits_equal(&r1.r[i], &r1b.r[i]);
      acc_expect(&a, same, "the same seed gave different bits");
      double d_out = max_abs_diff(&r1.r[OOUT], &r2.r[OOUT]);
      double d_dq = max_abs_diff(&r1.r[ODQ], &r2.r[ODQ]);
      acc_note(&a, " other-seed out %.1e dq %.1e", d_out, d_dq);
      acc_expect(&a, d_out > 1e-3 && d_dq > 1e-3, "another seed gave the same result");
      /* The kept set and the scaling. */
      double p = g->dropout, scale = 1.0 / (1.0 - p), worst = 0.0;
      uint32_t threshold = attn_dropout_threshold(p);
      int64_t n = 0, dropped = 0, philox_mismatch = 0;
      for (int64_t b = 0; b < g->B; ++b)
        for (int64_t h = 0; h < g->Hq; ++h)
          for (int64_t i = 0; i < g->Tq; ++i)
            for (int64_t j = 0; j < g->Tk; ++j) {
              int64_t e = ((b * g->Hq + h) * g->Tq + i) * g->Tk + j;
              double P = tu_get(&r0.r[OPROBS], e), x = tu_get(&r1.r[OPROBS], e);
              if (!(P > 0.0)) continue;
              n++;
              int kept = x != 0.0;
              dropped += !kept;
              philox_mismatch += kept != attn_dropout_keep(c.seed, threshold, b, h, i, j);
              if (kept && fabs(x - P * scale) > worst) worst = fabs(x - P * scale);
            }
      double frac = n > 0 ? (double)dropped / (double)n : 0.0;
      double sigma = n > 0 ? sqrt(p * (1.0 - p) / (double)n) : 0.0;
      acc_note(&a, " dropped %lld/%lld = %.4f (p %.2f, 5 sigma %.4f) kept-scale-err %.1e",
               (long long)dropped, (long long)n, frac, p, 5 * sigma, worst);
      acc_expect(&a, n > 1000, "too few positive probabilities to measure");
      acc_expect(&a, fabs(frac - p) <= 5 * sigma, "dropped fraction is not within 5 sigma of p");
      acc_expect(&a, worst <= a.tol * scale, "kept probabilities are not P/(1-p)");
      acc_expect(&a, philox_mismatch == 0, "%lld entries disagree with SPEC's Philox rule",
                 (long long)philox_mismatch);
      acc_no_nan(&a, &r1);
      report(P_DROPOUT, impl, dt, g->name, &a);
      tres_free(&r0), tres_free(&r1), tres_free(&r1b), tres_free(&r2);
    }
    tcase_free(&c2);
    tcase_free(&c0);
    tcase_free(&c);
  }
}

/* (h) GQA: kv head g serves query heads g*r .. g*r+r-1; the same problem with k, v (and an
 * Hkv-headed bias) repeated to Hq heads gives the same out, lse, dq, dsinks, and dk, dv, dbias
 * summed over each group. */
static void prop_gqa(const char *impl, attn_dtype dt, tu_rng *rng) {
  const cfg cfgs[] = {
      {.name = "hq4-hkv2+causal+softcap+sinks+dropout+bias[B,Hkv]",
       .B = 2,
       .Tq = 17,
       .Tk = 63,
       .Hq = 4,
       .Hkv = 2,
       .D = 17,
       .Dv = 3,
       .causal = 1,
       .softcap = 3,
       .sinks = 2,
       .dropout = 0.2,
       .bias = BIAS_KV_HEADS},
      {.name = "hq3-hkv1+mask-heads+alibi+tl-window",
       .B = 1,
       .Tq = 65,
       .Tk = 17,
       .Hq = 3,
       .Hkv = 1,
       .D = 1,
       .Dv = 5,
       .mask = MASK_HEADS,
       .alibi = ATTN_ALIBI_PER_HEAD,
       .top_left = 1,
       .window = 1,
       .wl = 4,
       .wr = 2},
      {.name = "packed-hq4-hkv1",
       .B = 5,
       .Tq = 17,
       .Tk = 17,
       .Hq = 4,
       .Hkv = 1,
       .D = 3,
       .Dv = 3,
       .causal = 1,
       .varlen = ATTN_VARLEN_PACKED,
       .lens_q = packed_lq,
       .lens_k = packed_lk},
      {.name = "hq4-hkv2+bias[1,Hkv,Tq,Tk]",
       .B = 2,
       .Tq = 3,
       .Tk = 65,
       .Hq = 4,
       .Hkv = 2,
       .D = 3,
       .Dv = 3,
       .bias = BIAS_KV_HEADS_BCAST_B},
  };
  for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; ++k) {
    const cfg *g = &cfgs[k];
    tcase c;
    tcase_make(&c, g, dt, rng);
    if (!usable(impl, &c.p, prop_names[P_GQA])) {
      tcase_free(&c);
      continue;
    }
    cfg g4 = *g;
    g4.Hkv = g->Hq;
    if (g->bias == BIAS_KV_HEADS) g4.bias = BIAS_FULL; /* [B,Hq,Tq,Tk] */
    tcase c4;
    tcase_make(&c4, &g4, dt, rng);
    int64_t r = g->Hq / g->Hkv, rows_k = token_rows(&c.p, 1);
    /* Same data, k/v heads repeated. */
    for (int i = 0; i < N_INPUTS; ++i)
      if (i != IK && i != IV && i != IBIAS && c.in[i].data != NULL)
        memcpy(c4.in[i].data, c.in[i].data, (size_t)c.in[i].n * attn_dtype_size(c.in[i].dtype));
    c4.seed = c.seed;
    for (int64_t t = 0; t < rows_k; ++t)
      for (int64_t h = 0; h < g->Hq; ++h) {
        for (int64_t e = 0; e < g->D; ++e)
          tu_set(&c4.in[IK], (t * g->Hq + h) * g->D + e,
                 tu_get(&c.in[IK], (t * g->Hkv + h / r) * g->D + e));
        for (int64_t e = 0; e < g->Dv; ++e)
          tu_set(&c4.in[IV], (t * g->Hq + h) * g->Dv + e,
                 tu_get(&c.in[IV], (t * g->Hkv + h / r) * g->Dv + e));
      }
    int64_t bs[4] = {1, 1, 1, 1}, bs4[4] = {1, 1, 1, 1};
    if (c.p.has_bias) {
      memcpy(bs, c.p.bias_shape, sizeof bs);
      memcpy(bs4, c4.p.bias_shape, sizeof bs4);
      for (int64_t e = 0; e < c4.in[IBIAS].n; ++e) {
        int64_t j = e % bs4[3], i = e / bs4[3] % bs4[2], h = e / (bs4[3] * bs4[2]) % bs4[1],
                b = e / (bs4[3] * bs4[2] * bs4[1]);
        tu_set(&c4.in[IBIAS], e,
               tu_get(&c.in[IBIAS], bcast_index(bs, b, bs[1] == 1 ? 0 : h / r, i, j)));
      }
    }
    tres r1, r4;
    if (usable(impl, &c4.p, prop_names[P_GQA]) &&
        run_or_report(P_GQA, impl, dt, g->name, &c, 0, &r1)) {
      if (run_or_report(P_GQA, impl, dt, g->name, &c4, 0, &r4)) {
        acc a;
        acc_init(&a, dt);
        acc_cmp_buf(&a, "out", &r1.r[OOUT], &r4.r[OOUT]);
        acc_cmp_buf(&a, "lse", &r1.r[OLSE], &r4.r[OLSE]);
        acc_cmp_buf(&a, "dq", &r1.r[ODQ], &r4.r[ODQ]);
        if (c.p.num_sinks > 0) acc_cmp_buf(&a, "dsinks", &r1.r[ODSINKS], &r4.r[ODSINKS]);
        double *dk = filled(r1.r[ODK].n, 0.0), *dv = filled(r1.r[ODV].n, 0.0);
        for (int64_t t = 0; t < rows_k; ++t)
          for (int64_t h = 0; h < g->Hq; ++h) {
            for (int64_t e = 0; e < g->D; ++e)
              dk[(t * g->Hkv + h / r) * g->D + e] += tu_get(&r4.r[ODK], (t * g->Hq + h) * g->D + e);
            for (int64_t e = 0; e < g->Dv; ++e)
              dv[(t * g->Hkv + h / r) * g->Dv + e] +=
                  tu_get(&r4.r[ODV], (t * g->Hq + h) * g->Dv + e);
          }
        acc_cmp(&a, "dk(group sum)", &r1.r[ODK], dk, r1.r[ODK].n);
        acc_cmp(&a, "dv(group sum)", &r1.r[ODV], dv, r1.r[ODV].n);
        free(dk), free(dv);
        if (c.p.has_bias) {
          double *db = filled(r1.r[ODBIAS].n, 0.0);
          for (int64_t e = 0; e < r4.r[ODBIAS].n; ++e) {
            int64_t j = e % bs4[3], i = e / bs4[3] % bs4[2], h = e / (bs4[3] * bs4[2]) % bs4[1],
                    b = e / (bs4[3] * bs4[2] * bs4[1]);
            db[bcast_index(bs, b, bs[1] == 1 ? 0 : h / r, i, j)] += tu_get(&r4.r[ODBIAS], e);
          }
          acc_cmp(&a, "dbias(group sum)", &r1.r[ODBIAS], db, r1.r[ODBIAS].n);
          free(db);
        }
        acc_no_nan(&a, &r1);
        report(P_GQA, impl, dt, g->name, &a);
        tres_free(&r4);
      }
      tres_free(&r1);
    }
    tcase_free(&c4);
    tcase_free(&c);
  }
}

/* (i) Varlen: each sequence run alone as a dense problem (B = 1, its own lengths) gives the rows of
 * the varlen run; padded rows are 0 / -inf, and gradients of padded or unseen keys are 0. */
static void prop_varlen(const char *impl, attn_dtype dt, tu_rng *rng) {
  const cfg cfgs[] = {
      {.name = "packed-causal+gqa+sinks",
       .B = 5,
       .Tq = 17,
       .Tk = 17,
       .Hq = 4,
       .Hkv = 2,
       .D = 3,
       .Dv = 5,
       .causal = 1,
       .sinks = 2,
       .varlen = ATTN_VARLEN_PACKED,
       .lens_q = packed_lq,
       .lens_k = packed_lk},
      {.name = "packed-tl-window+alibi[B,Hq]+softcap",
       .B = 5,
       .Tq = 17,
       .Tk = 17,
       .Hq = 2,
       .Hkv = 1,
       .D = 17,
       .Dv = 1,
       .top_left = 1,
       .window = 1,
       .wl = 2,
       .wr = 1,
       .softcap = 2,
       .alibi = ATTN_ALIBI_PER_BATCH_HEAD,
       .varlen = ATTN_VARLEN_PACKED,
       .lens_q = packed_lq,
       .lens_k = packed_lk},
      {.name = "padded-causal+bias+mask+sinks+gqa",
       .B = 4,
       .Tq = 17,
       .Tk = 63,
       .Hq = 2,
       .Hkv = 1,
       .D = 3,
       .Dv = 3,
       .causal = 1,
       .bias = BIAS_FULL,
       .mask = MASK_BATCH,
       .sinks = 1,
       .sinks_shared = 1,
       .varlen = ATTN_VARLEN_PADDED,
       .lens_q = padded_lq,
       .lens_k = padded_lk},
      {.name = "padded-alibi[B,Hq]+segments+bias[B,1,1,Tk]",
       .B = 4,
       .Tq = 17,
       .Tk = 63,
       .Hq = 1,
       .Hkv = 1,
       .D = 1,
       .Dv = 3,
       .alibi = ATTN_ALIBI_PER_BATCH_HEAD,
       .segs = 1,
       .bias = BIAS_B_KEYS,
       .varlen = ATTN_VARLEN_PADDED,
       .lens_q = padded_lq,
       .lens_k = padded_lk},
  };
  for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; ++k) {
    const cfg *g = &cfgs[k];
    tcase c;
    tcase_make(&c, g, dt, rng);
    const attn_problem *p = &c.p;
    tres rv;
    if (!usable(impl, p, prop_names[P_VARLEN]) ||
        !run_or_report(P_VARLEN, impl, dt, g->name, &c, 0, &rv)) {
      tcase_free(&c);
      continue;
    }
    int packed = g->varlen == ATTN_VARLEN_PACKED;
    /* Expected full results, assembled from the per-sequence runs. */
    double *want[N_OUTPUTS] = {0};
    int64_t big[N_OUTPUTS][4];
    for (int i = 0; i < N_OUTPUTS; ++i) {
      if (rv.r[i].data == NULL) continue;
      shape4(p, out_roles[i], big[i]);
      want[i] = filled(rv.r[i].n, i == OLSE ? -INFINITY : 0.0);
    }
    int ran = 1, sequences = 0;
    for (int64_t b = 0; b < g->B && ran; ++b) {
      int64_t lq, lk;
      seq_lens(&c, b, &lq, &lk);
      if (lq == 0) continue; /* an empty problem: nothing of it in the varlen results */
      cfg gs = *g;
      gs.B = 1, gs.Tq = lq, gs.Tk = lk, gs.varlen = ATTN_VARLEN_NONE;
      tcase s;
      tcase_make(&s, &gs, dt, rng);
      s.seed = c.seed;
      int64_t row_q = packed ? c.cu_q[b] : 0, row_k = packed ? c.cu_k[b] : 0;
      for (int i = 0; i < N_INPUTS; ++i) {
        if (s.in[i].data == NULL) continue;
        attn_role role = input_roles[i];
        int64_t sb[4], ss[4], off[4] = {0, 0, 0, 0};
        shape4(p, role, sb);
        shape4(&s.p, role, ss);
        switch (role) {
        case ATTN_ROLE_Q:
        case ATTN_ROLE_DOUT:
          if (packed)
            off[1] = row_q;
          else
            off[0] = b;
          break;
        case ATTN_ROLE_K:
        case ATTN_ROLE_V:
          if (packed)
            off[1] = row_k;
          else
            off[0] = b;
          break;
        case ATTN_ROLE_BIAS:
        case ATTN_ROLE_MASK: off[0] = sb[0] > 1 ? b : 0; break;
        case ATTN_ROLE_ALIBI:
        case ATTN_ROLE_Q_SEGMENT_IDS:
        case ATTN_ROLE_KV_SEGMENT_IDS: off[2] = sb[2] > 1 ? b : 0; break;
        default: break;
        }
        block_take(&s.in[i], &c.in[i], sb, off, ss);
      }
      tres rs;
      char name[160];
      snprintf(name, sizeof name, "%s seq %lld alone", g->name, (long long)b);
      if (!run_or_report(P_VARLEN, impl, dt, name, &s, 0, &rs)) {
        ran = 0;
        tcase_free(&s);
        break;
      }
      sequences++;
      for (int i = 0; i < N_OUTPUTS; ++i) {
        if (want[i] == NULL || rs.r[i].data == NULL) continue;
        attn_role role = out_roles[i];
        int64_t ss[4], off[4] = {0, 0, 0, 0};
        shape4(&s.p, role, ss);
        int add = 0;
        switch (role) {
        case ATTN_ROLE_OUT:
        case ATTN_ROLE_DQ:
          if (packed)
            off[1] = row_q;
          else
            off[0] = b;
          break;
        case ATTN_ROLE_DK:
        case ATTN_ROLE_DV:
          if (packed)
            off[1] = row_k;
          else
            off[0] = b;
          break;
        case ATTN_ROLE_LSE: /* packed [Hq, total_q] -> [1,1,Hq,total]; padded [B,Hq,Tq] -> [1,B,Hq,Tq] */
          if (packed)
            off[3] = row_q;
          else
            off[1] = b;
          break;
        case ATTN_ROLE_DBIAS:
          if (big[i][0] > 1) off[0] = b;
          add = 1;
          break;
        case ATTN_ROLE_DSINKS: add = 1; break;
        default: break;
        }
        block_put(want[i], big[i], off, &rs.r[i], ss, add);
      }
      tres_free(&rs);
      tcase_free(&s);
    }
    if (ran) {
      acc a;
      acc_init(&a, dt);
      for (int i = 0; i < N_OUTPUTS; ++i)
        if (want[i] != NULL) acc_cmp(&a, out_names[i], &rv.r[i], want[i], rv.r[i].n);
      acc_note(&a, " (%d sequences)", sequences);
      acc_no_nan(&a, &rv);
      report(P_VARLEN, impl, dt, g->name, &a);
    }
    for (int i = 0; i < N_OUTPUTS; ++i) free(want[i]);
    tres_free(&rv);
    tcase_free(&c);
  }
}

/* ---- (j) strided tensors ------------------------------------------------------------------------ */

/* A tensor of a role laid out with explicit strides inside a buffer (shared or its own). */
typedef struct view {
  tu_buf *buf;
  int64_t origin; /* element of buf at index (0, 0, 0, 0) */
  int64_t stride[4];
} view;

static attn_tensor view_tensor(const view *v) {
  attn_tensor t;
  t.data = (char *)v->buf->data + v->origin * (int64_t)attn_dtype_size(v->buf->dtype);
  memcpy(t.stride, v->stride, sizeof t.stride);
  return t;
}

/* Buffer elements a role with these strides needs, and the origin that keeps indices >= 0. */
static int64_t view_extent(const attn_problem *p, attn_role role, const int64_t stride[4],
                           int64_t *origin) {
  int64_t shape[ATTN_MAX_DIMS], lo = 0, hi = 0;
  int nd = attn_role_shape(p, role, shape);
  for (int d = 0; d < nd; ++d) {
    if (shape[d] == 0) return *origin = 0, 1;
    int64_t reach = (shape[d] - 1) * stride[d];
    if (reach < 0)
      lo += reach;
    else
      hi += reach;
  }
  *origin = -lo;
  return hi - lo + 1;
}

/* Calls fn(offset, dense index) for every element of the role. */
static void view_walk(const attn_problem *p, attn_role role, const int64_t stride[4],
                      void (*fn)(const view *, int64_t, int64_t, tu_buf *), const view *v,
                      tu_buf *dense) {
  int64_t shape[ATTN_MAX_DIMS] = {1, 1, 1, 1}, st[4] = {0, 0, 0, 0};
  int nd = attn_role_shape(p, role, shape);
  for (int d = 0; d < nd; ++d) st[d] = stride[d];
  for (int d = nd; d < 4; ++d) shape[d] = 1;
  int64_t e = 0;
  for (int64_t a = 0; a < shape[0]; ++a)
    for (int64_t b = 0; b < shape[1]; ++b)
      for (int64_t c = 0; c < shape[2]; ++c)
        for (int64_t d = 0; d < shape[3]; ++d, ++e)
          fn(v, v->origin + a * st[0] + b * st[1] + c * st[2] + d * st[3], e, dense);
}

static void put_fn(const view *v, int64_t off, int64_t e, tu_buf *dense) {
  tu_set(v->buf, off, tu_get(dense, e));
}
static void get_fn(const view *v, int64_t off, int64_t e, tu_buf *dense) {
  tu_set(dense, e, tu_get(v->buf, off));
}

static void view_scatter(const attn_problem *p, attn_role role, const view *v, const tu_buf *src) {
  view_walk(p, role, v->stride, put_fn, v, (tu_buf *)src);
}

/* The view's elements as a dense buffer of the role. */
static tu_buf view_gather(const attn_problem *p, attn_role role, const view *v) {
  tu_buf d = tu_buf_new(v->buf->dtype, attn_role_numel(p, role));
  view_walk(p, role, v->stride, get_fn, v, &d);
  return d;
}

/* A view in its own buffer of sentinels; src (dense) is scattered into it when given. */
static view view_own(const attn_problem *p, attn_role role, const int64_t stride[4],
                     const tu_buf *src) {
  view v;
  memcpy(v.stride, stride, sizeof v.stride);
  int64_t n = view_extent(p, role, stride, &v.origin);
  v.buf = malloc(sizeof *v.buf);
  *v.buf = tu_buf_new(attn_role_dtype(p, role), n);
  for (int64_t e = 0; e < n; ++e) tu_set(v.buf, e, SENTINEL);
  if (src != NULL) view_scatter(p, role, &v, src);
  return v;
}

static void view_free(view *v) {
  if (v->buf == NULL) return;
  tu_buf_free(v->buf);
  free(v->buf);
  v->buf = NULL;
}

static int64_t count_value(const tu_buf *b, double value) {
  int64_t n = 0;
  for (int64_t e = 0; e < b->n; ++e) n += tu_get(b, e) == value;
  return n;
}

/* Strides of a [B, T, H, W] token tensor stored as [B, H, T, W]. */
static void bhtw(int64_t T, int64_t H, int64_t W, int64_t st[4]) {
  st[0] = H * T * W, st[1] = W, st[2] = T * W, st[3] = 1;
}

/* The layouts of (j). Each compares with the dense run of the same case. */
enum { LAYOUT_QKV, LAYOUT_BHTD, LAYOUT_ODD, LAYOUT_COUNT };
static const char *const layout_names[] = {
    "q,k,v,dq,dk,dv in [B,T,3,H,D] buffers", "[B,H,T,D] q,k,v,out,dout,dq,dk,dv; lse as [B,Tq,Hq]",
    "last-dim stride 2 (q,k,v,out,dq), reversed time (k,v,dk,dv), transposed bias/dbias"};

static void strided_layout(int layout, const char *impl, attn_dtype dt, tu_rng *rng) {
  const cfg cfgs[] = {
      {.name = "qkv",
       .B = 2,
       .Tq = 17,
       .Tk = 17,
       .Hq = 3,
       .Hkv = 3,
       .D = 17,
       .Dv = 17,
       .causal = 1},
      {.name = "bhtd",
       .B = 2,
       .Tq = 17,
       .Tk = 63,
       .Hq = 4,
       .Hkv = 2,
       .D = 17,
       .Dv = 3,
       .sinks = 2,
       .softcap = 3,
       .causal = 1},
      {.name = "odd",
       .B = 1,
       .Tq = 63,
       .Tk = 65,
       .Hq = 2,
       .Hkv = 2,
       .D = 3,
       .Dv = 5,
       .bias = BIAS_FULL,
       .top_left = 1,
       .window = 1,
       .wl = 9,
       .wr = 3,
       .dropout = 0.1},
  };
  const cfg *g = &cfgs[layout];
  tcase c;
  tcase_make(&c, g, dt, rng);
  const attn_problem *p = &c.p;
  if (!usable(impl, p, prop_names[P_STRIDES])) {
    tcase_free(&c);
    return;
  }
  tres dense;
  if (!run_or_report(P_STRIDES, impl, dt, layout_names[layout], &c, 0, &dense)) {
    tcase_free(&c);
    return;
  }
  /* Views of q, k, v, dout (inputs) and out, lse, dq, dk, dv, dbias (outputs). Roles not listed
   * keep dense tensors. */
  enum { VQ, VK, VV, VDOUT, VBIAS, VOUT, VLSE, VDQ, VDK, VDV, VDBIAS, NV };
  const attn_role vrole[NV] = {ATTN_ROLE_Q,    ATTN_ROLE_K,   ATTN_ROLE_V,    ATTN_ROLE_DOUT,
                               ATTN_ROLE_BIAS, ATTN_ROLE_OUT, ATTN_ROLE_LSE,  ATTN_ROLE_DQ,
                               ATTN_ROLE_DK,   ATTN_ROLE_DV,  ATTN_ROLE_DBIAS};
  const int vsrc[NV] = {IQ, IK, IV, IDOUT, IBIAS, -1, -1, -1, -1, -1, -1};
  view v[NV];
  memset(v, 0, sizeof v);
  int64_t B = g->B, Tq = g->Tq, Tk = g->Tk, Hq = g->Hq, Hkv = g->Hkv, D = g->D, Dv = g->Dv;
  tu_buf *shared_in = NULL, *shared_grad = NULL;
  if (layout == LAYOUT_QKV) {
    /* [B, T, 3, H, D]: q, k, v interleaved per token; dq, dk, dv likewise in a dqkv buffer. */
    int64_t st[4] = {Tq * 3 * Hq * D, 3 * Hq * D, D, 1};
    shared_in = malloc(sizeof *shared_in);
    shared_grad = malloc(sizeof *shared_grad);
    *shared_in = tu_buf_new(dt, B * Tq * 3 * Hq * D);
    *shared_grad = tu_buf_new(dt, B * Tq * 3 * Hq * D);
    for (int64_t e = 0; e < shared_grad->n; ++e) tu_set(shared_grad, e, NAN);
    for (int w = 0; w < 3; ++w) {
      view *in = &v[VQ + w], *gr = &v[VDQ + w];
      in->buf = shared_in, gr->buf = shared_grad;
      in->origin = gr->origin = w * Hq * D;
      memcpy(in->stride, st, sizeof st);
      memcpy(gr->stride, st, sizeof st);
      view_scatter(p, vrole[VQ + w], in, &c.in[vsrc[VQ + w]]);
    }
  } else if (layout == LAYOUT_BHTD) {
    int64_t sq[4], sk[4], sv[4], so[4], sl[4] = {Tq * Hq, 1, Hq, 0};
    bhtw(Tq, Hq, D, sq), bhtw(Tk, Hkv, D, sk), bhtw(Tk, Hkv, Dv, sv), bhtw(Tq, Hq, Dv, so);
    v[VQ] = view_own(p, ATTN_ROLE_Q, sq, &c.in[IQ]);
    v[VK] = view_own(p, ATTN_ROLE_K, sk, &c.in[IK]);
    v[VV] = view_own(p, ATTN_ROLE_V, sv, &c.in[IV]);
    v[VDOUT] = view_own(p, ATTN_ROLE_DOUT, so, &c.in[IDOUT]);
    v[VOUT] = view_own(p, ATTN_ROLE_OUT, so, NULL);
    v[VLSE] = view_own(p, ATTN_ROLE_LSE, sl, NULL);
    v[VDQ] = view_own(p, ATTN_ROLE_DQ, sq, NULL);
    v[VDK] = view_own(p, ATTN_ROLE_DK, sk, NULL);
    v[VDV] = view_own(p, ATTN_ROLE_DV, sv, NULL);
  } else {
    /* Last dimension with stride 2 (a sentinel between elements); k and v with time reversed
     * (negative stride); bias and dbias with the last two dimensions transposed. */
    int64_t sq[4] = {Tq * Hq * D * 2, Hq * D * 2, D * 2, 2};
    int64_t so[4] = {Tq * Hq * Dv * 2, Hq * Dv * 2, Dv * 2, 2};
    int64_t sk[4] = {Tk * Hkv * D * 2, -Hkv * D * 2, D * 2, 2};
    int64_t sv[4] = {Tk * Hkv * Dv, -Hkv * Dv, Dv, 1};
    int64_t sb[4] = {Hq * Tq * Tk, Tq * Tk, 1, Tq};
    v[VQ] = view_own(p, ATTN_ROLE_Q, sq, &c.in[IQ]);
    v[VK] = view_own(p, ATTN_ROLE_K, sk, &c.in[IK]);
    v[VV] = view_own(p, ATTN_ROLE_V, sv, &c.in[IV]);
    v[VBIAS] = view_own(p, ATTN_ROLE_BIAS, sb, &c.in[IBIAS]);
    v[VOUT] = view_own(p, ATTN_ROLE_OUT, so, NULL);
    v[VDQ] = view_own(p, ATTN_ROLE_DQ, sq, NULL);
    v[VDK] = view_own(p, ATTN_ROLE_DK, sk, NULL);
    v[VDV] = view_own(p, ATTN_ROLE_DV, sv, NULL);
    v[VDBIAS] = view_own(p, ATTN_ROLE_DBIAS, sb, NULL);
  }
  /* Everything without a view is dense. */
  tu_buf dense_out[NV];
  memset(dense_out, 0, sizeof dense_out);
  attn_tensor t[NV];
  for (int i = 0; i < NV; ++i) {
    if (v[i].buf != NULL) {
      t[i] = view_tensor(&v[i]);
    } else if (vsrc[i] >= 0) {
      t[i] = tu_tensor(&c.in[vsrc[i]]);
    } else if (vrole[i] != ATTN_ROLE_DBIAS || p->has_bias) {
      dense_out[i] = nan_buf(attn_role_dtype(p, vrole[i]), attn_role_numel(p, vrole[i]));
      t[i] = tu_tensor(&dense_out[i]);
    } else {
      t[i] = attn_tensor_dense(NULL);
    }
  }
  attn_inputs in;
  attn_inputs_init(&in);
  in.q = t[VQ], in.k = t[VK], in.v = t[VV];
  if (p->has_bias) in.bias = t[VBIAS];
  if (p->num_sinks > 0) in.sinks = tu_tensor(&c.in[ISINKS]);
  in.dropout_seed = c.seed;
  attn_outputs outs;
  attn_outputs_init(&outs);
  outs.out = t[VOUT], outs.lse = t[VLSE];
  attn_grads grads;
  attn_grads_init(&grads);
  grads.dq = t[VDQ], grads.dk = t[VDK], grads.dv = t[VDV];
  if (p->has_bias) grads.dbias = t[VDBIAS];
  tu_buf dsinks = {0};
  if (p->num_sinks > 0) {
    dsinks = nan_buf(attn_role_dtype(p, ATTN_ROLE_DSINKS), attn_role_numel(p, ATTN_ROLE_DSINKS));
    grads.dsinks = tu_tensor(&dsinks);
  }
  int rc = run_tensors(impl, p, &in, &outs, &t[VDOUT], &grads);
  if (rc == 0) report_error(P_STRIDES, impl, dt, layout_names[layout]);
  if (rc == 1) {
    acc a;
    acc_init(&a, dt);
    const int res_of[NV] = {-1, -1, -1, -1, -1, OOUT, OLSE, ODQ, ODK, ODV, ODBIAS};
    for (int i = VOUT; i < NV; ++i) {
      if (dense.r[res_of[i]].data == NULL) continue;
      tu_buf got = v[i].buf != NULL ? view_gather(p, vrole[i], &v[i])
                                    : tu_buf_convert(&dense_out[i], dense_out[i].dtype);
      acc_cmp_buf(&a, out_names[res_of[i]], &got, &dense.r[res_of[i]]);
      tu_buf_free(&got);
      /* An output in its own buffer must leave every element outside the tensor alone. */
      if (v[i].buf != NULL && layout != LAYOUT_QKV) {
        int64_t untouched = count_value(v[i].buf, SENTINEL);
        int64_t gaps = v[i].buf->n - attn_role_numel(p, vrole[i]);
        acc_expect(&a, untouched == gaps, "%s wrote %lld elements outside the tensor",
                   out_names[res_of[i]], (long long)(gaps - untouched));
      }
    }
    if (p->num_sinks > 0) acc_cmp_buf(&a, "dsinks", &dsinks, &dense.r[ODSINKS]);
    report(P_STRIDES, impl, dt, layout_names[layout], &a);
  }
  if (dsinks.data != NULL) tu_buf_free(&dsinks);
  for (int i = 0; i < NV; ++i)
    if (dense_out[i].data != NULL) tu_buf_free(&dense_out[i]);
  if (shared_in != NULL) {
    tu_buf_free(shared_in), tu_buf_free(shared_grad);
    free(shared_in), free(shared_grad);
  } else {
    for (int i = 0; i < NV; ++i) view_free(&v[i]);
  }
  tres_free(&dense);
  tcase_free(&c);
}

/* Stride-0 broadcasting: a [B,Hq,Tq,Tk] bias and mask given with strides (0, 0, Tk, 1) over one
 * [Tq,Tk] array equal the [1,1,Tq,Tk] problem; the full dbias summed over B and Hq is its dbias. */
static void strided_broadcast(const char *impl, attn_dtype dt, tu_rng *rng) {
  const cfg g1 = {.name = "stride-0",
                  .B = 2,
                  .Tq = 17,
                  .Tk = 63,
                  .Hq = 2,
                  .Hkv = 1,
                  .D = 3,
                  .Dv = 3,
                  .bias = BIAS_QK,
                  .mask = MASK_HEADS,
                  .causal = 1};
  tcase c;
  tcase_make(&c, &g1, dt, rng);
  c.p.mask_shape[1] = 1; /* [1,1,Tq,Tk] */
  tu_buf_free(&c.in[IMASK]);
  c.in[IMASK] = tu_buf_new(ATTN_DTYPE_U8, g1.Tq * g1.Tk);
  for (int64_t e = 0; e < c.in[IMASK].n; ++e) tu_set(&c.in[IMASK], e, tu_uniform(rng, 0, 1) < 0.8);
  const char *name = "stride-0 broadcast bias and mask";
  tres r1;
  if (!usable(impl, &c.p, prop_names[P_STRIDES]) ||
      !run_or_report(P_STRIDES, impl, dt, name, &c, 0, &r1)) {
    tcase_free(&c);
    return;
  }
  attn_problem pb = c.p;
  int64_t full[4] = {g1.B, g1.Hq, g1.Tq, g1.Tk};
  memcpy(pb.bias_shape, full, sizeof full);
  memcpy(pb.mask_shape, full, sizeof full);
  attn_inputs in;
  attn_inputs_init(&in);
  in.q = tu_tensor(&c.in[IQ]), in.k = tu_tensor(&c.in[IK]), in.v = tu_tensor(&c.in[IV]);
  in.bias = tu_tensor(&c.in[IBIAS]);
  in.mask = tu_tensor(&c.in[IMASK]);
  int64_t st[4] = {0, 0, g1.Tk, 1};
  memcpy(in.bias.stride, st, sizeof st);
  memcpy(in.mask.stride, st, sizeof st);
  tu_buf out = nan_buf(dt, attn_role_numel(&pb, ATTN_ROLE_OUT));
  tu_buf lse = nan_buf(attn_role_dtype(&pb, ATTN_ROLE_LSE), attn_role_numel(&pb, ATTN_ROLE_LSE));
  tu_buf dq = nan_buf(dt, attn_role_numel(&pb, ATTN_ROLE_DQ));
  tu_buf dk = nan_buf(dt, attn_role_numel(&pb, ATTN_ROLE_DK));
  tu_buf dv = nan_buf(dt, attn_role_numel(&pb, ATTN_ROLE_DV));
  tu_buf db = nan_buf(dt, attn_role_numel(&pb, ATTN_ROLE_DBIAS));
  attn_outputs outs;
  attn_outputs_init(&outs);
  outs.out = tu_tensor(&out), outs.lse = tu_tensor(&lse);
  attn_grads grads;
  attn_grads_init(&grads);
  grads.dq = tu_tensor(&dq), grads.dk = tu_tensor(&dk), grads.dv = tu_tensor(&dv);
  grads.dbias = tu_tensor(&db);
  attn_tensor dout = tu_tensor(&c.in[IDOUT]);
  int rc = run_tensors(impl, &pb, &in, &outs, &dout, &grads);
  if (rc == 0) report_error(P_STRIDES, impl, dt, name);
  if (rc == 1) {
    acc a;
    acc_init(&a, dt);
    acc_cmp_buf(&a, "out", &out, &r1.r[OOUT]);
    acc_cmp_buf(&a, "lse", &lse, &r1.r[OLSE]);
    acc_cmp_buf(&a, "dq", &dq, &r1.r[ODQ]);
    acc_cmp_buf(&a, "dk", &dk, &r1.r[ODK]);
    acc_cmp_buf(&a, "dv", &dv, &r1.r[ODV]);
    double *sum = filled(g1.Tq * g1.Tk, 0.0);
    for (int64_t e = 0; e < db.n; ++e) sum[e % (g1.Tq * g1.Tk)] += tu_get(&db, e);
    tu_buf db1 = r1.r[ODBIAS];
    acc_cmp(&a, "dbias(summed)", &db1, sum, db1.n);
    free(sum);
    report(P_STRIDES, impl, dt, name, &a);
  }
  tu_buf *all[] = {&out, &lse, &dq, &dk, &dv, &db};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) tu_buf_free(all[i]);
  tres_free(&r1);
  tcase_free(&c);
}

static void prop_strides(const char *impl, attn_dtype dt, tu_rng *rng) {
  for (int layout = 0; layout < LAYOUT_COUNT; ++layout) strided_layout(layout, impl, dt, rng);
  strided_broadcast(impl, dt, rng);
}

/* ---- main ------------------------------------------------------------------------------------------ */

typedef void (*prop_fn)(const char *impl, attn_dtype dt, tu_rng *rng);

int main(void) {
  uint64_t seed = tu_seed("test_properties");
  tu_rng rng = tu_rng_make(seed);
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) {
    printf("FAIL cannot create a context\n");
    return 1;
  }
  const prop_fn props[P_COUNT] = {prop_const_v, prop_permute, prop_locality, prop_align,
                                  prop_masked,  prop_ops,     prop_dropout,  prop_gqa,
                                  prop_varlen,  prop_strides};
  const attn_dtype dtypes[] = {ATTN_DTYPE_F32, ATTN_DTYPE_F64};
  for (int k = 0; k < P_COUNT; ++k)
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; ++d)
      for (int32_t i = 0; i < attn_impl_count(); ++i) props[k](attn_impl_name(i), dtypes[d], &rng);
  for (int k = 0; k < P_COUNT; ++k)
    tu_check(prop_runs[k] > 0, "%s ran %d checks (a property that never runs is a defect)",
             prop_names[k], prop_runs[k]);
  printf("implementations: %d; runs declined by non-reference implementations: %d\n",
         (int)attn_impl_count(), skipped);
  attn_ctx_destroy(ctx);
  return tu_finish();
}
