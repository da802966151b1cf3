/*
 * src/impl/ref/ref.c - the reference implementation: SPEC.md written out in plain C11.
 *
 * It is the oracle every other implementation is tested against, so it favours being obviously
 * right over being fast: one (batch, head, query row) at a time, every sum, max, exp and division in
 * double, every element read through its strides, every feature of the problem. It serves both
 * operations: flash_attention and scaled_dot_product_attention are one function, and this code
 * computes it row by row (never a Tq x Tk buffer), writing the probabilities when asked.
 *
 * Notation follows SPEC.md: row (b, h, i), key j, KV head g = h / (Hq / Hkv), alignment offset o,
 * logit x_ij, row max m, normaliser Z, dropout keep mask keep_ij, and lse_i = m + log Z. An
 * f8e4m3 problem (docs/FP8.md) reads its inputs decoded exactly, times their descale factors.
 */
#include "impl/impl.h"
#include "impl/ref/ref_rows.h"

#include "core/ctx.h"
#include "core/dtype.h"
#include "core/philox.h"
#include "core/saturate.h"
#include "core/tensors.h"

#include <math.h>
#include <string.h>

/* What every row of one run shares. */
typedef struct ref_args {
  const attn_problem *p;
  const attn_inputs *in;
  attn_dtype dtype;      /* q, k, v, dout (and every output of a plan's run) */
  attn_dtype stat_dtype; /* alibi slopes, sinks, dsinks (and lse of a plan's run) */
  /* The dtypes out, dq (result_dtype) and lse (result_stat_dtype) are written and read in: the
   * problem's for a plan's run; f64 where the attn tool evaluates chosen rows (ref_rows.h), so that
   * its oracle reads a low-precision problem's inputs where they lie, with no f64 copy of them. */
  attn_dtype result_dtype, result_stat_dtype;
  /* The dtype the backward reads the forward's out in: result_dtype, but the problem's when the
   * results are partial sums written in f32 (attn_positions.partial; out is the caller's). */
  attn_dtype out_dtype;
  int64_t group;         /* query heads per KV head: Hq / Hkv */
  uint32_t drop_threshold;
  double keep_scale;     /* 1 / (1 - p_drop): the weight of a kept probability */
  attn_dtype round_to;   /* F64 = exact; else the naive same-dtype computation (tests only) */
  attn_dtype round_scores_to; /* round_to, but f32 for f8e4m3: fp8 kernels keep scores in f32 */
  const attn_positions *pos; /* where the problem sits in a larger one, or NULL */
} ref_args;

/* One query row (b, h, i) and the geometry of its sequence. */
typedef struct ref_row {
  int64_t b, h, g, i;
  attn_seq seq;
  /* The aligned diagonal of the row, in the coordinates keys are compared in (key_at): i + o with
   * o = len_k - len_q (bottom-right) or 0 (top-left); a block placed at global positions compares
   * global ones, rows(i) + the larger problem's o. */
  int64_t diagonal;
} ref_row;

static ref_args make_args(const attn_run *run) {
  const attn_problem *p = run->problem;
  ref_args a;
  a.p = p;
  a.in = run->inputs;
  a.dtype = (attn_dtype)p->dtype;
  a.stat_dtype = attn_stat_dtype(a.dtype);
  a.result_dtype = attn_result_dtype(p, run->positions);
  a.result_stat_dtype = a.stat_dtype;
  a.out_dtype = a.dtype;
  a.group = p->heads_q / p->heads_kv;
  a.drop_threshold = attn_dropout_threshold(p->dropout_p);
  a.keep_scale = 1.0 / (1.0 - p->dropout_p);
  a.round_to = run->round_to;
  a.round_scores_to = run->round_to == ATTN_DTYPE_F8E4M3 ? ATTN_DTYPE_F32 : run->round_to;
  a.pos = run->positions;
  return a;
}

static ref_row make_row(const ref_args *a, int64_t b, int64_t h, int64_t i) {
  ref_row r;
  r.b = b, r.h = h, r.g = h / a->group, r.i = i;
  r.seq = attn_seq_of(a->p, a->in, b);
  r.diagonal = a->pos != NULL && a->pos->has_offset
                   ? attn_position_of(&a->pos->rows, i) + a->pos->offset
                   : i + attn_align_offset(a->p, &r.seq);
  return r;
}

/* Key j in the coordinates of ref_row.diagonal: its global position in a placed block. */
static int64_t key_at(const ref_args *a, int64_t j) {
  return a->pos != NULL && a->pos->has_offset ? attn_position_of(&a->pos->cols, j) : j;
}

/* ---- element addressing --------------------------------------------------------------------- */

/* Offset of element (b, row, head, d) of a token tensor: [B, T, H, W] dense, or [total, H, W]
 * packed, where `row` is then the packed row (q_row0 + i) and b is unused. */
static int64_t token_at(const attn_problem *p, const attn_tensor *t, int64_t b, int64_t row,
                        int64_t head, int64_t d) {
  if (p->varlen == ATTN_VARLEN_PACKED)
    return row * t->stride[0] + head * t->stride[1] + d * t->stride[2];
  return b * t->stride[0] + row * t->stride[1] + head * t->stride[2] + d * t->stride[3];
}

/* Offset of lse[b, h, i]: [B, Hq, Tq] dense, [Hq, total_q] packed (row = q_row0 + i). */
static int64_t lse_at(const attn_problem *p, const attn_tensor *t, int64_t b, int64_t h, int64_t row) {
  if (p->varlen == ATTN_VARLEN_PACKED) return h * t->stride[0] + row * t->stride[1];
  return b * t->stride[0] + h * t->stride[1] + row * t->stride[2];
}

/* Packed varlen addresses rows within the whole tensor; dense layouts within the batch entry. */
static int64_t q_row(const ref_row *r) { return r->seq.q_row0 + r->i; }
static int64_t k_row(const ref_row *r, int64_t j) { return r->seq.k_row0 + j; }

/* Offset of element d of key j (KV head g of row r) in k or v: through the block table for a paged
 * cache (docs/DECODE.md), else as token_at. */
static int64_t kv_at(const ref_args *a, const attn_tensor *t, const ref_row *r, int64_t j, int64_t d) {
  if (a->p->page_size > 0)
    return attn_paged_offset(a->p, a->in, t, r->b, j, r->g) + d * t->stride[3];
  return token_at(a->p, t, r->b, k_row(r, j), r->g, d);
}

/* Offset of [b, head, i, j] in a 4-d broadcastable input of `shape` (size-1 dims broadcast). */
static int64_t broadcast_at(const int64_t shape[4], const int64_t stride[4], int64_t b, int64_t head,
                            int64_t i, int64_t j) {
  const int64_t index[4] = {b, head, i, j};
  int64_t off = 0;
  for (int d = 0; d < 4; ++d) off += (shape[d] == 1 ? 0 : index[d]) * stride[d];
  return off;
}

/* The head index of a bias: query head h for an Hq-sized head dim, its KV head g for an Hkv-sized
 * one (shared by the group), 0 when broadcast. */
static int64_t bias_head(const attn_problem *p, const ref_row *r) {
  if (p->bias_shape[1] == p->heads_q) return r->h;
  if (p->bias_shape[1] == p->heads_kv) return r->g;
  return 0;
}


/* Index of bias element (b, head, i, j) in a dense array of the bias shape: where dbias is summed. */
static int64_t bias_dense_index(const attn_problem *p, const ref_row *r, int64_t j) {
  const int64_t *s = p->bias_shape;
  const int64_t stride[4] = {s[1] * s[2] * s[3], s[2] * s[3], s[3], 1};
  return broadcast_at(s, stride, r->b, bias_head(p, r), r->i, j);
}

/* Sink logit t of row r: sinks[h, t] per head, or sinks[t] shared. */
static double sink_logit(const ref_args *a, const ref_row *r, int64_t t) {
  const attn_tensor *s = &a->in->sinks;
  int64_t off = a->p->sinks_shared ? t * s->stride[0] : r->h * s->stride[0] + t * s->stride[1];
  return attn_load(s->data, a->stat_dtype, off);
}

static int64_t sink_index(const attn_problem *p, const ref_row *r, int64_t t) {
  return p->sinks_shared ? t : r->h * p->num_sinks + t;
}

/* ---- the function of SPEC.md, one element at a time ------------------------------------------ */

/* Step 3: whether key j is visible from row r (every mask that is set must keep it). */
static int visible(const ref_args *a, const ref_row *r, int64_t j) {
  const attn_problem *p = a->p;
  if (j >= r->seq.len_k) return 0; /* varlen: j < len_k[b] */
  /* window (left, right) around the aligned diagonal i + o, both bounds inclusive; causal was
   * folded into right = 0 by the plan, so causal with a window (left, r) uses (left, 0). */
  const int64_t key = key_at(a, j);
  if (p->window_left >= 0 && key < r->diagonal - p->window_left) return 0;
  if (p->window_right >= 0 && key > r->diagonal + p->window_right) return 0;
  if (p->has_mask) {
    const attn_tensor *m = &a->in->mask;
    int64_t head = p->mask_shape[1] == 1 ? 0 : r->h;
    if (((const uint8_t *)m->data)[broadcast_at(p->mask_shape, m->stride, r->b, head, r->i, j)] == 0)
      return 0;
  }
  if (p->has_segment_ids) {
    const attn_tensor *qs = &a->in->q_segment_ids, *ks = &a->in->kv_segment_ids;
    int32_t q_seg = ((const int32_t *)qs->data)[r->b * qs->stride[0] + r->i * qs->stride[1]];
    int32_t k_seg = ((const int32_t *)ks->data)[r->b * ks->stride[0] + j * ks->stride[1]];
    if (q_seg < 0 || q_seg != k_seg) return 0;
  }
  return 1;
}

/* Steps 1-2: the logit x_ij of a visible key. q is row i of q in double. *pre gets the logit before
 * the soft cap (needed by the backward pass). */
static double logit(const ref_args *a, const ref_row *r, const double *q, int64_t j, double *pre) {
  const attn_problem *p = a->p;
  const attn_tensor *k = &a->in->k;
  double dot = 0.0;
  for (int64_t d = 0; d < p->head_dim; ++d)
    dot += q[d] * attn_load(k->data, a->dtype, kv_at(a, k, r, j, d));
  /* x = s * dot(q_i, k_j) + bias + alibi; an f8e4m3 problem's q and k carry descale factors */
  const double descale = (double)attn_descale_of(p, &a->in->q_descale, r->b, r->g) *
                         (double)attn_descale_of(p, &a->in->k_descale, r->b, r->g);
  double x = attn_round_to(a->round_scores_to, p->scale * descale * dot);
  if (p->has_bias) {
    const attn_tensor *bias = &a->in->bias;
    x += attn_load(bias->data, (attn_dtype)p->bias_dtype,
                   broadcast_at(p->bias_shape, bias->stride, r->b, bias_head(p, r), r->i, j));
  }
  if (p->alibi != ATTN_ALIBI_NONE) {
    const attn_tensor *sl = &a->in->alibi_slopes;
    int64_t off = p->alibi == ATTN_ALIBI_PER_BATCH_HEAD ? r->b * sl->stride[0] + r->h * sl->stride[1]
                                                        : r->h * sl->stride[0];
    double slope = attn_load(sl->data, a->stat_dtype, off);
    x -= slope * fabs((double)(r->diagonal - key_at(a, j)));
  }
  *pre = x;
  /* Soft cap: bias and ALiBi are inside it; masking came before, so masked keys stay at zero. */
  if (p->softcap > 0.0) x = p->softcap * tanh(x / p->softcap);
  return attn_round_to(a->round_scores_to, x);
}

/* The soft cap's derivative 1 - tanh^2(y) as 4u / (1 + u)^2 with u = exp(-2|y|): 1 - t * t cancels
 * once tanh(y) is near +-1 (at |y| = 18 it is 40% off in f64, and 0 past |y| = 19; issue 19). */
static double softcap_slope(double y) {
  const double u = exp(-2.0 * fabs(y));
  return 4.0 * u / ((1.0 + u) * (1.0 + u));
}

/* Step 6: whether dropout keeps (b, h, i, j); always with p_drop = 0. */
static int kept(const ref_args *a, const ref_row *r, int64_t j) {
  if (a->p->dropout_p == 0.0) return 1;
  if (a->pos != NULL) /* a block of a larger problem: the counter takes global indices */
    return attn_dropout_keep(a->in->dropout_seed, a->drop_threshold, r->b + a->pos->batch0,
                             r->h + a->pos->head0, attn_position_of(&a->pos->rows, r->i),
                             attn_position_of(&a->pos->cols, j));
  return attn_dropout_keep(a->in->dropout_seed, a->drop_threshold, r->b, r->h, r->i, j);
}

/* Loads row i of q (or any token tensor) as doubles. */
static void load_token_row(const ref_args *a, const attn_tensor *t, const ref_row *r, int64_t head,
                           int64_t width, double *row) {
  for (int64_t d = 0; d < width; ++d)
    row[d] = attn_load(t->data, a->dtype, token_at(a->p, t, r->b, q_row(r), head, d));
}

/* ---- forward ---------------------------------------------------------------------------------- */

typedef struct ref_forward_scratch {
  double *x;        /* [Tk] logits of the row */
  unsigned char *v; /* [Tk] visibility of the row */
  double *acc;      /* [Dv] output accumulator */
  double *q;        /* [D] the query row */
} ref_forward_scratch;

static void write_empty_row(const ref_args *a, const attn_outputs *out, int64_t b, int64_t h,
                            int64_t row) {
  const attn_problem *p = a->p;
  for (int64_t d = 0; d < p->head_dim_v; ++d)
    attn_store(out->out.data, a->result_dtype, token_at(p, &out->out, b, row, h, d), 0.0);
  if (out->lse.data != NULL)
    attn_store(out->lse.data, a->result_stat_dtype, lse_at(p, &out->lse, b, h, row), -INFINITY);
}

static void forward_row(const ref_args *a, const attn_outputs *out, const ref_row *r,
                        const ref_forward_scratch *s) {
  const attn_problem *p = a->p;
  load_token_row(a, &a->in->q, r, r->h, p->head_dim, s->q);

  /* Step 4: m = max over visible logits and sinks. */
  double m = -INFINITY;
  for (int64_t j = 0; j < r->seq.len_k; ++j) {
    s->v[j] = (unsigned char)visible(a, r, j);
    if (!s->v[j]) continue;
    double pre;
    s->x[j] = logit(a, r, s->q, j, &pre);
    if (s->x[j] > m) m = s->x[j];
  }
  for (int64_t t = 0; t < p->num_sinks; ++t) {
    double sink = sink_logit(a, r, t);
    if (sink > m) m = sink;
  }
  /* Step 8: a fully masked row (no visible key and no sinks, or nothing above -inf) is out = 0,
   * lse = -inf; probabilities stay 0. */
  if (m == -INFINITY) {
    write_empty_row(a, out, r->b, r->h, q_row(r));
    return;
  }

  /* Step 5: Z = sum_j exp(x_ij - m) + sum_t exp(a_t - m). Dropout does not touch Z. */
  double z = 0.0;
  for (int64_t j = 0; j < r->seq.len_k; ++j)
    if (s->v[j]) z += exp(s->x[j] - m);
  for (int64_t t = 0; t < p->num_sinks; ++t) z += exp(sink_logit(a, r, t) - m);

  /* Steps 6-7: out_i = sum_j (p'_ij / Z) v_j with p'_ij = keep_ij ? p_ij / (1 - p_drop) : 0. */
  for (int64_t d = 0; d < p->head_dim_v; ++d) s->acc[d] = 0.0;
  const attn_tensor *v = &a->in->v;
  for (int64_t j = 0; j < r->seq.len_k; ++j) {
    if (!s->v[j]) continue;
    double prob;
    if (a->round_to == ATTN_DTYPE_F8E4M3) {
      /* FlashAttention-3's fp8 P: exp(x - m) <= 1 times 2^8, into e4m3's normal range, rounded
       * to e4m3 for P V; Z sums the unrounded values (docs/FP8.md) */
      prob = kept(a, r, j) ? attn_round_to(ATTN_DTYPE_F8E4M3, exp(s->x[j] - m) * 256.0) / 256.0 /
                                 z * a->keep_scale
                           : 0.0;
    } else {
      prob = kept(a, r, j) ? exp(s->x[j] - m) / z * a->keep_scale : 0.0;
      prob = attn_round_to(a->round_to, prob);
    }
    for (int64_t d = 0; d < p->head_dim_v; ++d)
      s->acc[d] += prob * attn_load(v->data, a->dtype, kv_at(a, v, r, j, d));
    if (out->probs.data != NULL) {
      const attn_tensor *pr = &out->probs;
      attn_store(pr->data, attn_out_dtype(p),
                 r->b * pr->stride[0] + r->h * pr->stride[1] + r->i * pr->stride[2] + j * pr->stride[3],
                 prob);
    }
  }
  const double v_descale = attn_descale_of(p, &a->in->v_descale, r->b, r->g);
  for (int64_t d = 0; d < p->head_dim_v; ++d)
    attn_store(out->out.data, a->result_dtype, token_at(p, &out->out, r->b, q_row(r), r->h, d),
               s->acc[d] * v_descale);
  if (out->lse.data != NULL)
    attn_store(out->lse.data, a->result_stat_dtype, lse_at(p, &out->lse, r->b, r->h, q_row(r)),
               m + log(z));
}

/* Writes values[e] (or 0 when values is NULL) to element e, in dense C order, of an output tensor
 * of the role, through its strides and in its dtype. */
static void write_dense(const attn_problem *p, attn_role role, const attn_tensor *t,
                        const double *values, attn_dtype dtype) {
  int64_t shape[ATTN_MAX_DIMS];
  int ndim = attn_role_shape(p, role, shape);
  int64_t n = attn_role_numel(p, role);
  for (int64_t e = 0; e < n; ++e) {
    int64_t rest = e, off = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      off += (rest % shape[d]) * t->stride[d];
      rest /= shape[d];
    }
    attn_store(t->data, dtype, off, values != NULL ? values[e] : 0.0);
  }
}

/* Rows of the output tensors that belong to no sequence: padded rows (i >= len_q[b]) and, for
 * packed varlen, rows past cu_seqlens_q[B]. They are written as out = 0, lse = -inf. */
static void write_rows_outside_sequences(const ref_args *a, const attn_outputs *out) {
  const attn_problem *p = a->p;
  if (p->varlen == ATTN_VARLEN_PACKED) {
    for (int64_t row = a->in->cu_seqlens_q[p->batch]; row < p->total_q; ++row)
      for (int64_t h = 0; h < p->heads_q; ++h) write_empty_row(a, out, 0, h, row);
  } else if (p->varlen == ATTN_VARLEN_PADDED) {
    for (int64_t b = 0; b < p->batch; ++b)
      for (int64_t row = a->in->seqlens_q[b]; row < p->seqlen_q; ++row)
        for (int64_t h = 0; h < p->heads_q; ++h) write_empty_row(a, out, b, h, row);
  }
}

static attn_status ref_forward(const attn_run *run) {
  const attn_problem *p = run->problem;
  ref_args a = make_args(run);
  const attn_outputs *out = run->outputs;
  char *w = run->workspace;
  ref_forward_scratch s;
  s.x = (double *)w;
  s.acc = s.x + p->seqlen_k;
  s.q = s.acc + p->head_dim_v;
  s.v = (unsigned char *)(s.q + p->head_dim);

  attn_paged_append(p, run->inputs); /* a paged cache's new rows first: they are attended to */
  if (out->probs.data != NULL)
    write_dense(p, ATTN_ROLE_PROBS, &out->probs, NULL, attn_role_dtype(p, ATTN_ROLE_PROBS));
  write_rows_outside_sequences(&a, out);
  for (int64_t b = 0; b < p->batch; ++b) {
    attn_seq seq = attn_seq_of(p, run->inputs, b);
    for (int64_t h = 0; h < p->heads_q; ++h)
      for (int64_t i = 0; i < seq.len_q; ++i) {
        ref_row r = make_row(&a, b, h, i);
        forward_row(&a, out, &r, &s);
      }
  }
  return ATTN_STATUS_OK;
}

/* ---- backward --------------------------------------------------------------------------------- */

/* Gradient accumulators in double, dense in the canonical layout; written to the outputs at the end
 * so that sums over GQA groups, query rows and broadcast dims never round to the output dtype. */
typedef struct ref_backward_scratch {
  double *dk;     /* [rows_k, Hkv, D]; or [count, D] by position in a key list; NULL: not wanted */
  double *dv;     /* [rows_k, Hkv, Dv]; or [count, Dv] likewise */
  double *dbias;  /* dense bias shape; NULL: not wanted */
  double *dsinks; /* [Hq, S] or [S]; NULL: not wanted */
  double *dq;     /* [D] of the current row */
  double *q;      /* [D] the query row */
  double *dout;   /* [Dv] the output gradient row */
} ref_backward_scratch;

/* The keys a backward row visits: every key of its sequence (the whole pass), or a list of keys j
 * of the sequence, whose dk and dv then accumulate by their position in the list (the attn tool's
 * sampled check, ref_rows.h). */
typedef struct ref_keys {
  const int64_t *list; /* NULL: every key */
  int64_t count;
} ref_keys;

/* Rows of k and v: B * Tk dense, total_k packed. Row of key j of batch entry b in that numbering. */
static int64_t rows_k(const attn_problem *p) {
  return p->varlen == ATTN_VARLEN_PACKED ? p->total_k : p->batch * p->seqlen_k;
}

static int64_t acc_k_row(const attn_problem *p, const ref_row *r, int64_t j) {
  return p->varlen == ATTN_VARLEN_PACKED ? k_row(r, j) : r->b * p->seqlen_k + j;
}

/* The backward pass of row r over the keys ks: adds to the accumulators of s that are set, and
 * writes the row's dq once it has visited every key. */
static void backward_row(const ref_args *a, const attn_run *run, const ref_row *r,
                         const ref_backward_scratch *s, ref_keys ks) {
  const attn_problem *p = a->p;
  const attn_outputs *fwd = run->outputs;
  const attn_tensor *k = &a->in->k, *v = &a->in->v;
  double lse =
      attn_load(fwd->lse.data, a->result_stat_dtype, lse_at(p, &fwd->lse, r->b, r->h, q_row(r)));
  for (int64_t d = 0; d < p->head_dim; ++d) s->dq[d] = 0.0;

  /* A fully masked row (lse = -inf) contributes nothing, and its dq is 0. */
  if (lse != -INFINITY) {
    load_token_row(a, &a->in->q, r, r->h, p->head_dim, s->q);
    load_token_row(a, run->dout, r, r->h, p->head_dim_v, s->dout);
    /* Delta_i = dot(dout_i, out_i) */
    double delta = 0.0;
    for (int64_t d = 0; d < p->head_dim_v; ++d)
      delta += s->dout[d] * attn_load(fwd->out.data, a->out_dtype,
                                      token_at(p, &fwd->out, r->b, q_row(r), r->h, d));
    int64_t visits = ks.list != NULL ? ks.count : r->seq.len_k;
    for (int64_t n = 0; n < visits; ++n) {
      int64_t j = ks.list != NULL ? ks.list[n] : n;
      if (!visible(a, r, j)) continue;
      double pre, x = logit(a, r, s->q, j, &pre);
      /* P_ij = p_ij / Z, before dropout: at most 1, also where the f32 lse of logits of 1e25 is
       * off by 1e18 and exp(x - lse) would be infinite (NaN stays NaN) */
      double prob = exp(x - lse > 0.0 ? 0.0 : x - lse);
      int keep = kept(a, r, j);
      /* dP'_ij = dot(dout_i, v_j); dP_ij = keep ? dP'_ij / (1 - p_drop) : 0 */
      double dp = 0.0;
      int64_t kr = k_row(r, j);
      for (int64_t d = 0; d < p->head_dim_v; ++d)
        dp += s->dout[d] * attn_load(v->data, a->dtype, token_at(p, v, r->b, kr, r->g, d));
      dp = attn_round_to(a->round_to, dp);
      dp = keep ? dp * a->keep_scale : 0.0;
      /* dX_ij = P_ij (dP_ij - Delta_i), times the cap's derivative 1 - tanh^2(x_pre / cap) */
      double dx = prob * (dp - delta);
      if (p->softcap > 0.0) dx *= softcap_slope(pre / p->softcap);
      dx = attn_round_to(a->round_to, dx);
      /* dq_i += s dX_ij k_j;  dk_j += s dX_ij q_i;  dv_j += (p'_ij / Z_i) dout_i */
      for (int64_t d = 0; d < p->head_dim; ++d)
        s->dq[d] += p->scale * dx * attn_load(k->data, a->dtype, token_at(p, k, r->b, kr, r->g, d));
      if (s->dk != NULL) {
        int64_t slot = ks.list != NULL ? n : acc_k_row(p, r, j) * p->heads_kv + r->g;
        double *dk = s->dk + slot * p->head_dim, *dv = s->dv + slot * p->head_dim_v;
        for (int64_t d = 0; d < p->head_dim; ++d) dk[d] += p->scale * dx * s->q[d];
        double weight = keep ? prob * a->keep_scale : 0.0;
        for (int64_t d = 0; d < p->head_dim_v; ++d) dv[d] += weight * s->dout[d];
      }
      /* dbias = dX summed over the broadcast dims of bias */
      if (p->has_bias && s->dbias != NULL) s->dbias[bias_dense_index(p, r, j)] += dx;
    }
    /* dsinks[h, t] = -sum_{b,i} exp(a_t - lse_i) Delta_i */
    for (int64_t t = 0; t < p->num_sinks && s->dsinks != NULL; ++t)
      s->dsinks[sink_index(p, r, t)] -= exp(sink_logit(a, r, t) - lse) * delta;
  }
  if (ks.list != NULL) return; /* dq has only some keys' terms */
  for (int64_t d = 0; d < p->head_dim; ++d)
    attn_store(run->grads->dq.data, a->result_dtype,
               token_at(p, &run->grads->dq, r->b, q_row(r), r->h, d), s->dq[d]);
}

static attn_status ref_backward(const attn_run *run) {
  const attn_problem *p = run->problem;
  const attn_grads *g = run->grads;
  ref_args a = make_args(run);
  int64_t n_dk = rows_k(p) * p->heads_kv * p->head_dim;
  int64_t n_dv = rows_k(p) * p->heads_kv * p->head_dim_v;
  int64_t n_bias = p->has_bias ? attn_role_numel(p, ATTN_ROLE_BIAS) : 0;
  int64_t n_sinks = p->num_sinks > 0 ? attn_role_numel(p, ATTN_ROLE_SINKS) : 0;
  ref_backward_scratch s;
  s.dk = (double *)run->workspace;
  s.dv = s.dk + n_dk;
  s.dbias = s.dv + n_dv;
  s.dsinks = s.dbias + n_bias;
  s.dq = s.dsinks + n_sinks;
  s.q = s.dq + p->head_dim;
  s.dout = s.q + p->head_dim;
  memset(s.dk, 0, (size_t)(n_dk + n_dv + n_bias + n_sinks) * sizeof(double));

  /* dq rows outside every sequence are 0 */
  write_dense(p, ATTN_ROLE_DQ, &g->dq, NULL, a.result_dtype);
  const ref_keys every_key = {NULL, 0};
  for (int64_t b = 0; b < p->batch; ++b) {
    attn_seq seq = attn_seq_of(p, run->inputs, b);
    for (int64_t h = 0; h < p->heads_q; ++h)
      for (int64_t i = 0; i < seq.len_q; ++i) {
        ref_row r = make_row(&a, b, h, i);
        backward_row(&a, run, &r, &s, every_key);
      }
  }
  /* The accumulators are dense in the canonical layout, which is the role's dense shape. */
  write_dense(p, ATTN_ROLE_DK, &g->dk, s.dk, a.result_dtype);
  write_dense(p, ATTN_ROLE_DV, &g->dv, s.dv, a.result_dtype);
  if (g->dbias.data != NULL)
    write_dense(p, ATTN_ROLE_DBIAS, &g->dbias, s.dbias, attn_role_dtype(p, ATTN_ROLE_DBIAS));
  if (g->dsinks.data != NULL)
    write_dense(p, ATTN_ROLE_DSINKS, &g->dsinks, s.dsinks, attn_role_dtype(p, ATTN_ROLE_DSINKS));
  return ATTN_STATUS_OK;
}

/* ---- chosen rows, for the attn tool's oracle (ref_rows.h) -------------------------------------- */

/* The arguments of a run whose results are in results_dtype (f64 for the oracle). */
static ref_args rows_args(const attn_run *run, attn_dtype results_dtype) {
  ref_args a = make_args(run);
  a.result_dtype = a.out_dtype = results_dtype;
  a.result_stat_dtype = attn_stat_dtype(results_dtype);
  return a;
}

/* The (batch entry, row) of query row `token` of the tensors: dense b * Tq + i; packed the packed
 * row, whose entry is the one whose range holds it. 0 when it lies in no sequence (a padded row
 * past len_q[b], a packed row past cu_seqlens_q[B]), with *b the entry whose tensor rows hold it
 * (0 past the packed sequences) and *i its row there. */
static int locate_query(const attn_problem *p, const attn_inputs *in, int64_t token, int64_t *b,
                        int64_t *i) {
  if (p->varlen != ATTN_VARLEN_PACKED) {
    *b = token / p->seqlen_q, *i = token % p->seqlen_q;
    return *i < attn_seq_of(p, in, *b).len_q;
  }
  *b = 0, *i = token;
  for (int64_t e = 0; e < p->batch; ++e)
    if (token >= in->cu_seqlens_q[e] && token < in->cu_seqlens_q[e + 1]) {
      *b = e, *i = token - in->cu_seqlens_q[e];
      return 1;
    }
  return 0;
}

size_t attn_ref_row_scratch_size(const attn_problem *p) {
  return (size_t)(p->seqlen_k + 2 * p->head_dim_v + 3 * p->head_dim) * sizeof(double) +
         (size_t)p->seqlen_k;
}

/* One block of scratch: the forward row's x [Tk], acc [Dv] and q [D], then the backward row's dq
 * [D], q [D] and dout [Dv], then the forward row's visibility [Tk] (bytes). */
static ref_forward_scratch forward_scratch(const attn_problem *p, void *scratch) {
  ref_forward_scratch s;
  s.x = (double *)scratch;
  s.acc = s.x + p->seqlen_k;
  s.q = s.acc + p->head_dim_v;
  s.v = (unsigned char *)(s.q + 3 * p->head_dim + p->head_dim_v);
  return s;
}

static ref_backward_scratch backward_scratch(const attn_problem *p, void *scratch) {
  ref_backward_scratch s;
  memset(&s, 0, sizeof s);
  s.dq = (double *)scratch + p->seqlen_k + p->head_dim_v + p->head_dim;
  s.q = s.dq + p->head_dim;
  s.dout = s.q + p->head_dim;
  return s;
}

void attn_ref_forward_row(const attn_run *run, attn_dtype results_dtype, int64_t head,
                          int64_t token, void *scratch) {
  ref_args a = rows_args(run, results_dtype);
  int64_t b, i;
  if (!locate_query(run->problem, run->inputs, token, &b, &i)) {
    write_empty_row(&a, run->outputs, b, head, i);
    return;
  }
  ref_row r = make_row(&a, b, head, i);
  ref_forward_scratch s = forward_scratch(run->problem, scratch);
  forward_row(&a, run->outputs, &r, &s);
}

void attn_ref_dq_row(const attn_run *run, attn_dtype results_dtype, int64_t head, int64_t token,
                     void *scratch) {
  const attn_problem *p = run->problem;
  ref_args a = rows_args(run, results_dtype);
  int64_t b, i;
  if (!locate_query(p, run->inputs, token, &b, &i)) { /* rows outside every sequence: dq = 0 */
    const attn_tensor *dq = &run->grads->dq;
    for (int64_t d = 0; d < p->head_dim; ++d)
      attn_store(dq->data, results_dtype, token_at(p, dq, b, i, head, d), 0.0);
    return;
  }
  ref_row r = make_row(&a, b, head, i);
  ref_backward_scratch s = backward_scratch(p, scratch);
  const ref_keys every_key = {NULL, 0};
  backward_row(&a, run, &r, &s, every_key);
}

void attn_ref_key_grads_row(const attn_run *run, attn_dtype results_dtype, int64_t head,
                            int64_t token, const int64_t *keys, int64_t count, double *dk,
                            double *dv, void *scratch) {
  ref_args a = rows_args(run, results_dtype);
  int64_t b, i;
  if (!locate_query(run->problem, run->inputs, token, &b, &i)) return; /* adds nothing */
  ref_row r = make_row(&a, b, head, i);
  ref_backward_scratch s = backward_scratch(run->problem, scratch);
  s.dk = dk, s.dv = dv;
  const ref_keys listed = {keys, count};
  backward_row(&a, run, &r, &s, listed);
}

/* ---- the contract ------------------------------------------------------------------------------ */

static attn_status ref_supports(const attn_problem *problem, char *why, size_t why_size) {
  (void)problem, (void)why, (void)why_size;
  return ATTN_STATUS_OK; /* every valid CPU problem */
}

static int32_t ref_num_configs(const attn_problem *problem) {
  (void)problem;
  return 1;
}

static void ref_config_name(const attn_problem *problem, int32_t config, char *buf, size_t size) {
  (void)problem, (void)config;
  attn_format(buf, size, "default");
}

static int32_t ref_default_config(const attn_problem *problem) {
  (void)problem;
  return 0;
}

static size_t ref_workspace_size(const attn_problem *p, int32_t config, const void *state,
                                 int backward) {
  (void)state;
  (void)config;
  /* Saturating (core/saturate.h): the sizes validation admits keep these in range on a 64-bit
   * size_t, but not on a 32-bit one, where the query must say SIZE_MAX rather than wrap. */
  if (!backward) { /* x and visibility of one row, the output accumulator, the query row */
    int64_t row = attn_sat_add64(attn_sat_add64(p->seqlen_k, p->head_dim_v), p->head_dim);
    return attn_sat_add_size(attn_sat_bytes(row, sizeof(double)),
                             attn_sat_bytes(p->seqlen_k, 1));
  }
  int64_t doubles = attn_sat_mul64(attn_sat_mul64(rows_k(p), p->heads_kv),
                                   attn_sat_add64(p->head_dim, p->head_dim_v));
  doubles = attn_sat_add64(doubles, 2 * p->head_dim + p->head_dim_v);
  if (p->has_bias) doubles = attn_sat_add64(doubles, attn_role_numel(p, ATTN_ROLE_BIAS));
  if (p->num_sinks > 0) doubles = attn_sat_add64(doubles, attn_role_numel(p, ATTN_ROLE_SINKS));
  return attn_sat_bytes(doubles, sizeof(double));
}

const attn_impl attn_ref_impl = {
    .name = "ref",
    .device = ATTN_DEVICE_CPU,
    .version = 1,
    .supports = ref_supports,
    .num_configs = ref_num_configs,
    .config_name = ref_config_name,
    .default_config = ref_default_config,
    .workspace_size = ref_workspace_size,
    .plan_init = NULL,
    .plan_fini = NULL,
    .forward = ref_forward,
    .backward = ref_backward,
    .honours_positions = ATTN_POSITIONS_ANY,
};
