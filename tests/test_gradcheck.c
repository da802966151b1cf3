/*
 * tests/test_gradcheck.c - the backward pass against finite differences of the forward pass.
 *
 * For every registered implementation that runs f64 problems, on fresh random small problems (odd
 * sizes, every feature of SPEC.md alone and then combined): with L = sum(out * dout) for a random
 * dout, central differences (L(x + h) - L(x - h)) / 2h on a random subset of the entries of q, k,
 * v, bias and sinks must equal dq, dk, dv, dbias and dsinks of attn_plan_backward within
 * 1e-6 * max(1, |grad|). In f64 with h = 1e-6 the difference quotient is good to about 1e-9, so
 * the bound passes with a wide margin yet catches any wrong factor or sign of a gradient above
 * 1e-6; a tally at the end checks that enough large gradients were compared for that to mean
 * something.
 *
 * Beside the differences, an independent statement of which keys each row sees (the masking rules
 * of SPEC.md step 3) checks the exact zeros: a row that sees no key has out = 0 and dq = 0 (lse =
 * -inf unless sinks give it mass), a key no query sees has dk = dv = 0, a masked entry of a full
 * bias has dbias = 0; and nothing anywhere is NaN.
 */
#include "testutil.h"

#include "core/tensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  F_CAUSAL_BR = 1 << 0,
  F_CAUSAL_TL = 1 << 1, /* top-left causal, with Tq != Tk */
  F_WINDOW = 1 << 2,
  F_BIAS_FULL = 1 << 3,
  F_BIAS_BCAST = 1 << 4, /* [1, 1, Tq, 1] */
  F_BIAS_HKV = 1 << 5,   /* [B or 1, Hkv, Tq, Tk] under GQA */
  F_MASK = 1 << 6,       /* random, with a fully masked row */
  F_ALIBI_H = 1 << 7,
  F_ALIBI_BH = 1 << 8,
  F_SOFTCAP = 1 << 9,
  F_SINKS_HEAD = 1 << 10,
  F_SINKS_SHARED = 1 << 11,
  F_DROPOUT = 1 << 12,
  F_GQA = 1 << 13,
  F_MQA = 1 << 14,
  F_DV = 1 << 15, /* Dv != D */
  F_SEG = 1 << 16,
  F_PACKED = 1 << 17,
  F_PADDED = 1 << 18,
};

static const struct {
  const char *name;
  int feats;
} feature_sets[] = {
    {"none", 0},
    {"causal bottom-right", F_CAUSAL_BR},
    {"causal top-left", F_CAUSAL_TL},
    {"window", F_WINDOW},
    {"bias full", F_BIAS_FULL},
    {"bias [1,1,Tq,1]", F_BIAS_BCAST},
    {"bias Hkv heads", F_BIAS_HKV | F_GQA},
    {"mask", F_MASK},
    {"alibi [Hq]", F_ALIBI_H},
    {"alibi [B,Hq]", F_ALIBI_BH},
    {"softcap", F_SOFTCAP},
    {"sinks [Hq,S]", F_SINKS_HEAD},
    {"sinks [S]", F_SINKS_SHARED},
    {"dropout", F_DROPOUT},
    {"gqa", F_GQA},
    {"mqa", F_MQA},
    {"dv != d", F_DV},
    {"segment ids", F_SEG},
    {"varlen packed", F_PACKED},
    {"varlen padded", F_PADDED},
    {"all dense + segments",
     F_CAUSAL_BR | F_WINDOW | F_BIAS_FULL | F_MASK | F_ALIBI_H | F_SOFTCAP | F_SINKS_HEAD |
         F_DROPOUT | F_GQA | F_DV | F_SEG},
    {"all padded",
     F_CAUSAL_TL | F_WINDOW | F_BIAS_HKV | F_GQA | F_MASK | F_ALIBI_BH | F_SOFTCAP | F_SINKS_SHARED |
         F_DROPOUT | F_DV | F_PADDED},
    {"all packed",
     F_CAUSAL_BR | F_WINDOW | F_BIAS_BCAST | F_MASK | F_ALIBI_H | F_SOFTCAP | F_SINKS_HEAD |
         F_DROPOUT | F_MQA | F_DV | F_PACKED},
    {"all no causal mqa",
     F_WINDOW | F_BIAS_FULL | F_MASK | F_ALIBI_BH | F_SOFTCAP | F_SINKS_SHARED | F_DROPOUT | F_MQA |
         F_SEG},
};

#define REPEATS 8     /* random problems per feature set */
#define PER_TENSOR 20 /* entries checked per tensor */
#define STEP 1e-6
#define TOL 1e-6

/* One random problem with its buffers. */
typedef struct gcase {
  attn_problem p;
  int feats;
  int64_t B, Tq, Tk, Hq, Hkv, D, Dv;
  int32_t cu_q[4], cu_k[4], lens_q[3], lens_k[3];
  tu_buf q, k, v, bias, mask, alibi, sinks, qseg, kvseg;
  tu_buf out, lse, dout, dq, dk, dv, dbias, dsinks;
  attn_inputs in;
  attn_outputs o;
  attn_grads g;
  char desc[512];
} gcase;

static tu_buf role_buf(const attn_problem *p, attn_role role) {
  if (!attn_role_used(p, role)) return tu_buf_new(ATTN_DTYPE_F64, 0);
  return tu_buf_new(attn_role_dtype(p, role), attn_role_numel(p, role));
}

#define APPEND(...)                                                                                \
  do {                                                                                             \
    size_t used_ = strlen(c->desc);                                                                \
    snprintf(c->desc + used_, sizeof c->desc - used_, __VA_ARGS__);                                \
  } while (0)

static void case_make(gcase *c, tu_rng *rng, int feats, int operation) {
  memset(c, 0, sizeof *c);
  c->feats = feats;
  attn_problem *p = &c->p;
  attn_problem_init(p);
  p->operation = operation;
  p->dtype = ATTN_DTYPE_F64;
  c->B = (feats & F_PACKED) ? tu_int(rng, 1, 3) : tu_int(rng, 1, 2);
  c->Tq = tu_int(rng, 1, 9);
  c->Tk = tu_int(rng, 1, 9);
  if ((feats & F_CAUSAL_TL) && c->Tq == c->Tk) c->Tk = c->Tq == 9 ? 8 : c->Tq + 1;
  c->D = tu_int(rng, 1, 5);
  c->Dv = c->D;
  if (feats & F_DV) c->Dv = (c->D + tu_int(rng, 1, 4) - 1) % 5 + 1; /* 1..5, != D */
  if (feats & F_GQA) c->Hq = 4, c->Hkv = 2;
  else if (feats & F_MQA) c->Hq = tu_int(rng, 2, 4), c->Hkv = 1;
  else c->Hq = c->Hkv = tu_int(rng, 1, 3);
  p->batch = c->B, p->seqlen_q = c->Tq, p->seqlen_k = c->Tk;
  p->heads_q = c->Hq, p->heads_kv = c->Hkv, p->head_dim = c->D, p->head_dim_v = c->Dv;
  if (tu_int(rng, 0, 1)) p->scale = tu_uniform(rng, 0.3, 1.5); /* else the default 1/sqrt(D) */

  snprintf(c->desc, sizeof c->desc, "%s b%lld hq%lld hkv%lld sq%lld sk%lld d%lld dv%lld f64",
           operation == ATTN_OPERATION_FLASH_ATTENTION ? "flash" : "sdpa", (long long)c->B,
           (long long)c->Hq, (long long)c->Hkv, (long long)c->Tq, (long long)c->Tk, (long long)c->D,
           (long long)c->Dv);
  if (p->scale != 0) APPEND(" scale=%.3f", p->scale);

  if (feats & (F_CAUSAL_BR | F_CAUSAL_TL)) {
    p->causal = 1;
    p->align = (feats & F_CAUSAL_TL) ? ATTN_ALIGN_TOP_LEFT : ATTN_ALIGN_BOTTOM_RIGHT;
    APPEND(" causal %s", (feats & F_CAUSAL_TL) ? "top-left" : "bottom-right");
  }
  if (feats & F_WINDOW) {
    p->window_left = tu_int(rng, -1, 3);
    p->window_right = p->window_left < 0 ? tu_int(rng, 0, 3) : tu_int(rng, -1, 3);
    APPEND(" window(%lld,%lld)", (long long)p->window_left, (long long)p->window_right);
  }
  if (feats & (F_BIAS_FULL | F_BIAS_BCAST | F_BIAS_HKV)) {
    p->has_bias = 1;
    p->bias_dtype = ATTN_DTYPE_F64;
    int64_t *s = p->bias_shape;
    if (feats & F_BIAS_FULL) s[0] = c->B, s[1] = c->Hq, s[2] = c->Tq, s[3] = c->Tk;
    else if (feats & F_BIAS_BCAST) s[0] = 1, s[1] = 1, s[2] = c->Tq, s[3] = 1;
    else s[0] = tu_int(rng, 0, 1) ? c->B : 1, s[1] = c->Hkv, s[2] = c->Tq, s[3] = c->Tk;
    APPEND(" bias[%lld,%lld,%lld,%lld]", (long long)s[0], (long long)s[1], (long long)s[2],
           (long long)s[3]);
  }
  if (feats & F_MASK) {
    p->has_mask = 1;
    p->mask_shape[0] = c->B, p->mask_shape[1] = c->Hq, p->mask_shape[2] = c->Tq,
    p->mask_shape[3] = c->Tk;
    APPEND(" mask");
  }
  if (feats & (F_ALIBI_H | F_ALIBI_BH)) {
    p->alibi = (feats & F_ALIBI_H) ? ATTN_ALIBI_PER_HEAD : ATTN_ALIBI_PER_BATCH_HEAD;
    APPEND(" alibi%s", (feats & F_ALIBI_H) ? "[Hq]" : "[B,Hq]");
  }
  if (feats & F_SOFTCAP) {
    p->softcap = tu_uniform(rng, 0.5, 3.0);
    APPEND(" softcap=%.3f", p->softcap);
  }
  if (feats & (F_SINKS_HEAD | F_SINKS_SHARED)) {
    p->num_sinks = tu_int(rng, 1, 3);
    p->sinks_shared = (feats & F_SINKS_SHARED) != 0;
    APPEND(" sinks%s S=%lld", p->sinks_shared ? "[S]" : "[Hq,S]", (long long)p->num_sinks);
  }
  if (feats & F_DROPOUT) {
    p->dropout_p = tu_uniform(rng, 0.1, 0.6);
    APPEND(" dropout=%.3f", p->dropout_p);
  }
  if (feats & F_SEG) {
    p->has_segment_ids = 1;
    APPEND(" segments");
  }
  if (feats & F_PACKED) {
    p->varlen = ATTN_VARLEN_PACKED;
    c->cu_q[0] = c->cu_k[0] = 0;
    for (int64_t b = 0; b < c->B; ++b) {
      /* The first sequence is never empty so that every tensor has entries to check. */
      c->cu_q[b + 1] = c->cu_q[b] + (int32_t)tu_int(rng, b == 0 ? 1 : 0, c->Tq);
      c->cu_k[b + 1] = c->cu_k[b] + (int32_t)tu_int(rng, b == 0 ? 1 : 0, c->Tk);
    }
    p->total_q = c->cu_q[c->B], p->total_k = c->cu_k[c->B];
    APPEND(" packed cu_q={");
    for (int64_t b = 0; b <= c->B; ++b) APPEND("%s%d", b ? "," : "", (int)c->cu_q[b]);
    APPEND("} cu_k={");
    for (int64_t b = 0; b <= c->B; ++b) APPEND("%s%d", b ? "," : "", (int)c->cu_k[b]);
    APPEND("}");
  }
  if (feats & F_PADDED) {
    p->varlen = ATTN_VARLEN_PADDED;
    for (int64_t b = 0; b < c->B; ++b) {
      c->lens_q[b] = (int32_t)tu_int(rng, b == 0 ? 1 : 0, c->Tq);
      c->lens_k[b] = (int32_t)tu_int(rng, b == 0 ? 1 : 0, c->Tk);
    }
    APPEND(" padded lens_q={");
    for (int64_t b = 0; b < c->B; ++b) APPEND("%s%d", b ? "," : "", (int)c->lens_q[b]);
    APPEND("} lens_k={");
    for (int64_t b = 0; b < c->B; ++b) APPEND("%s%d", b ? "," : "", (int)c->lens_k[b]);
    APPEND("}");
  }

  /* Buffers, shaped by the problem's own table of tensors. */
  c->q = role_buf(p, ATTN_ROLE_Q), c->k = role_buf(p, ATTN_ROLE_K), c->v = role_buf(p, ATTN_ROLE_V);
  c->bias = role_buf(p, ATTN_ROLE_BIAS), c->mask = role_buf(p, ATTN_ROLE_MASK);
  c->alibi = role_buf(p, ATTN_ROLE_ALIBI), c->sinks = role_buf(p, ATTN_ROLE_SINKS);
  c->qseg = role_buf(p, ATTN_ROLE_Q_SEGMENT_IDS), c->kvseg = role_buf(p, ATTN_ROLE_KV_SEGMENT_IDS);
  c->out = role_buf(p, ATTN_ROLE_OUT), c->lse = role_buf(p, ATTN_ROLE_LSE);
  c->dout = role_buf(p, ATTN_ROLE_DOUT), c->dq = role_buf(p, ATTN_ROLE_DQ);
  c->dk = role_buf(p, ATTN_ROLE_DK), c->dv = role_buf(p, ATTN_ROLE_DV);
  c->dbias = role_buf(p, ATTN_ROLE_DBIAS), c->dsinks = role_buf(p, ATTN_ROLE_DSINKS);

  tu_fill_uniform(&c->q, rng, -1, 1);
  tu_fill_uniform(&c->k, rng, -1, 1);
  tu_fill_uniform(&c->v, rng, -1, 1);
  tu_fill_uniform(&c->dout, rng, -1, 1);
  tu_fill_uniform(&c->bias, rng, -1, 1);
  tu_fill_uniform(&c->alibi, rng, 0, 1);
  tu_fill_uniform(&c->sinks, rng, -1, 1);
  for (int64_t i = 0; i < c->mask.n; ++i) tu_set(&c->mask, i, tu_uniform(rng, 0, 1) < 0.7 ? 1 : 0);
  if (c->mask.n > 0) { /* one fully masked row */
    int64_t b = tu_int(rng, 0, c->B - 1), h = tu_int(rng, 0, c->Hq - 1), i = tu_int(rng, 0, c->Tq - 1);
    for (int64_t j = 0; j < c->Tk; ++j) tu_set(&c->mask, ((b * c->Hq + h) * c->Tq + i) * c->Tk + j, 0);
    APPEND(" (mask row b%lld h%lld i%lld empty)", (long long)b, (long long)h, (long long)i);
  }
  /* Segment ids in {-1, 0, 1}: -1 is padding. */
  for (int64_t i = 0; i < c->qseg.n; ++i) {
    double u = tu_uniform(rng, 0, 1);
    tu_set(&c->qseg, i, u < 0.15 ? -1 : u < 0.6 ? 0 : 1);
  }
  for (int64_t i = 0; i < c->kvseg.n; ++i) {
    double u = tu_uniform(rng, 0, 1);
    tu_set(&c->kvseg, i, u < 0.1 ? -1 : u < 0.55 ? 0 : 1);
  }

  attn_inputs_init(&c->in);
  c->in.q = tu_tensor(&c->q), c->in.k = tu_tensor(&c->k), c->in.v = tu_tensor(&c->v);
  c->in.bias = tu_tensor(&c->bias), c->in.mask = tu_tensor(&c->mask);
  c->in.alibi_slopes = tu_tensor(&c->alibi), c->in.sinks = tu_tensor(&c->sinks);
  c->in.q_segment_ids = tu_tensor(&c->qseg), c->in.kv_segment_ids = tu_tensor(&c->kvseg);
  if (feats & F_PACKED) c->in.cu_seqlens_q = c->cu_q, c->in.cu_seqlens_k = c->cu_k;
  if (feats & F_PADDED) c->in.seqlens_q = c->lens_q, c->in.seqlens_k = c->lens_k;
  c->in.dropout_seed = ((uint64_t)tu_int(rng, 0, 0x7fffffff) << 32) | (uint64_t)tu_int(rng, 0, 0x7fffffff);
  if (feats & F_DROPOUT) APPEND(" seed=%llu", (unsigned long long)c->in.dropout_seed);
  attn_outputs_init(&c->o);
  c->o.out = tu_tensor(&c->out), c->o.lse = tu_tensor(&c->lse);
  attn_grads_init(&c->g);
  c->g.dq = tu_tensor(&c->dq), c->g.dk = tu_tensor(&c->dk), c->g.dv = tu_tensor(&c->dv);
  c->g.dbias = tu_tensor(&c->dbias), c->g.dsinks = tu_tensor(&c->dsinks);
}

static void case_free(gcase *c) {
  tu_buf *all[] = {&c->q,   &c->k,   &c->v,    &c->bias, &c->mask, &c->alibi, &c->sinks,
                   &c->qseg, &c->kvseg, &c->out, &c->lse,  &c->dout, &c->dq,    &c->dk,
                   &c->dv,  &c->dbias, &c->dsinks};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) tu_buf_free(all[i]);
}

/* ---- the masking rules of SPEC.md step 3, written out independently ---------------------- */

static void seq_lengths(const gcase *c, int64_t b, int64_t *len_q, int64_t *len_k) {
  *len_q = c->Tq, *len_k = c->Tk;
  if (c->feats & F_PACKED) *len_q = c->cu_q[b + 1] - c->cu_q[b], *len_k = c->cu_k[b + 1] - c->cu_k[b];
  if (c->feats & F_PADDED) *len_q = c->lens_q[b], *len_k = c->lens_k[b];
}

/* Whether query i of head h in sequence b sees key j (in-sequence positions). */
static int visible(const gcase *c, int64_t b, int64_t h, int64_t i, int64_t j) {
  int64_t len_q, len_k;
  seq_lengths(c, b, &len_q, &len_k);
  if (i >= len_q || j >= len_k) return 0;
  int64_t o = c->p.align == ATTN_ALIGN_BOTTOM_RIGHT ? len_k - len_q : 0;
  int64_t left = c->p.window_left, right = c->p.causal ? 0 : c->p.window_right;
  if (left >= 0 && j < i + o - left) return 0;
  if (right >= 0 && j > i + o + right) return 0;
  if (c->p.has_mask && tu_get(&c->mask, ((b * c->Hq + h) * c->Tq + i) * c->Tk + j) == 0) return 0;
  if (c->p.has_segment_ids) {
    double qs = tu_get(&c->qseg, b * c->Tq + i), ks = tu_get(&c->kvseg, b * c->Tk + j);
    if (qs < 0 || qs != ks) return 0;
  }
  return 1;
}

/* Row of a token tensor (q-like when is_q, else k-like) holding position t of sequence b. */
static int64_t token_row(const gcase *c, int is_q, int64_t b, int64_t t) {
  if (c->feats & F_PACKED) return (is_q ? c->cu_q[b] : c->cu_k[b]) + t;
  return b * (is_q ? c->Tq : c->Tk) + t;
}

static int64_t lse_index(const gcase *c, int64_t b, int64_t h, int64_t i) {
  if (c->feats & F_PACKED) return h * c->p.total_q + c->cu_q[b] + i;
  return (b * c->Hq + h) * c->Tq + i;
}

static int64_t count_nan(const tu_buf *b, int allow_neg_inf) {
  int64_t n = 0;
  for (int64_t i = 0; i < b->n; ++i) {
    double x = tu_get(b, i);
    if (isnan(x) || (isinf(x) && !(allow_neg_inf && x < 0))) n++;
  }
  return n;
}

/* Exact zeros where nothing is visible, and no NaN anywhere. Returns a description of the first
 * violation in why (empty when none). */
static void check_zeros(const gcase *c, char *why, size_t size) {
  why[0] = '\0';
  const tu_buf *finite[] = {&c->out, &c->dq, &c->dk, &c->dv, &c->dbias, &c->dsinks};
  const char *names[] = {"out", "dq", "dk", "dv", "dbias", "dsinks"};
  for (int t = 0; t < 6; ++t) {
    int64_t n = count_nan(finite[t], 0);
    if (n > 0) {
      snprintf(why, size, "%s has %lld non-finite values", names[t], (long long)n);
      return;
    }
  }
  if (count_nan(&c->lse, 1) > 0) {
    snprintf(why, size, "lse has NaN or +inf");
    return;
  }
  int64_t group = c->Hq / c->Hkv;
  for (int64_t b = 0; b < c->B; ++b) {
    int64_t len_q, len_k;
    seq_lengths(c, b, &len_q, &len_k);
    int64_t rows_q = (c->feats & F_PACKED) ? len_q : c->Tq, rows_k = (c->feats & F_PACKED) ? len_k : c->Tk;
    for (int64_t h = 0; h < c->Hq; ++h)
      for (int64_t i = 0; i < rows_q; ++i) {
        int any = 0;
        for (int64_t j = 0; j < c->Tk && !any; ++j) any = visible(c, b, h, i, j);
        int64_t row = token_row(c, 1, b, i);
        double lse = tu_get(&c->lse, lse_index(c, b, h, i));
        int padded_row = i >= len_q;
        if (!any) {
          for (int64_t d = 0; d < c->D; ++d)
            if (tu_get(&c->dq, (row * c->Hq + h) * c->D + d) != 0) {
              snprintf(why, size, "dq[b%lld i%lld h%lld d%lld] = %g, want 0: the row sees no key",
                       (long long)b, (long long)i, (long long)h, (long long)d,
                       tu_get(&c->dq, (row * c->Hq + h) * c->D + d));
              return;
            }
          for (int64_t d = 0; d < c->Dv; ++d)
            if (tu_get(&c->out, (row * c->Hq + h) * c->Dv + d) != 0) {
              snprintf(why, size, "out[b%lld i%lld h%lld d%lld] = %g, want 0: the row sees no key",
                       (long long)b, (long long)i, (long long)h, (long long)d,
                       tu_get(&c->out, (row * c->Hq + h) * c->Dv + d));
              return;
            }
          int want_neg_inf = c->p.num_sinks == 0 || padded_row;
          if (want_neg_inf ? !(isinf(lse) && lse < 0) : !isfinite(lse)) {
            snprintf(why, size, "lse[b%lld h%lld i%lld] = %g, want %s: the row sees no key%s",
                     (long long)b, (long long)h, (long long)i, lse, want_neg_inf ? "-inf" : "finite",
                     want_neg_inf ? "" : " but has sinks");
            return;
          }
          if (!want_neg_inf) { /* SPEC step 8: the logsumexp of the row's sinks */
            double z = 0;
            for (int64_t t = 0; t < c->p.num_sinks; ++t)
              z += exp(tu_get(&c->sinks, (c->p.sinks_shared ? 0 : h * c->p.num_sinks) + t));
            if (fabs(lse - log(z)) > 1e-12 * fmax(1.0, fabs(log(z)))) {
              snprintf(why, size, "lse[b%lld h%lld i%lld] = %.17g, want the sinks' logsumexp %.17g",
                       (long long)b, (long long)h, (long long)i, lse, log(z));
              return;
            }
          }
        } else if (!isfinite(lse)) {
          snprintf(why, size, "lse[b%lld h%lld i%lld] = %g for a row that sees keys", (long long)b,
                   (long long)h, (long long)i, lse);
          return;
        }
        /* Masked entries of a full bias get no gradient. */
        if (c->feats & F_BIAS_FULL)
          for (int64_t j = 0; j < c->Tk; ++j) {
            int64_t at = ((b * c->Hq + h) * c->Tq + i) * c->Tk + j;
            if (!visible(c, b, h, i, j) && tu_get(&c->dbias, at) != 0) {
              snprintf(why, size, "dbias[b%lld h%lld i%lld j%lld] = %g, want 0: masked", (long long)b,
                       (long long)h, (long long)i, (long long)j, tu_get(&c->dbias, at));
              return;
            }
          }
      }
    /* A key that no query of its group sees gets no gradient. */
    for (int64_t g = 0; g < c->Hkv; ++g)
      for (int64_t j = 0; j < rows_k; ++j) {
        int any = 0;
        for (int64_t h = g * group; h < (g + 1) * group && !any; ++h)
          for (int64_t i = 0; i < c->Tq && !any; ++i) any = visible(c, b, h, i, j);
        if (any) continue;
        int64_t row = token_row(c, 0, b, j);
        for (int64_t d = 0; d < c->D; ++d)
          if (tu_get(&c->dk, (row * c->Hkv + g) * c->D + d) != 0) {
            snprintf(why, size, "dk[b%lld j%lld g%lld d%lld] = %g, want 0: no query sees the key",
                     (long long)b, (long long)j, (long long)g, (long long)d,
                     tu_get(&c->dk, (row * c->Hkv + g) * c->D + d));
            return;
          }
        for (int64_t d = 0; d < c->Dv; ++d)
          if (tu_get(&c->dv, (row * c->Hkv + g) * c->Dv + d) != 0) {
            snprintf(why, size, "dv[b%lld j%lld g%lld d%lld] = %g, want 0: no query sees the key",
                     (long long)b, (long long)j, (long long)g, (long long)d,
                     tu_get(&c->dv, (row * c->Hkv + g) * c->Dv + d));
            return;
          }
      }
  }
}

/* ---- finite differences -------------------------------------------------------------------- */

/* L = sum(out * dout) of a forward run; NAN when the run fails. */
static double loss(attn_plan *plan, gcase *c) {
  if (attn_plan_forward(plan, &c->in, NULL, 0, &c->o) != ATTN_STATUS_OK) return NAN;
  double sum = 0;
  for (int64_t i = 0; i < c->out.n; ++i) sum += tu_get(&c->out, i) * tu_get(&c->dout, i);
  return sum;
}

/* Totals over the whole program: comparisons made, and how many had |grad| > 1e-2 (those where a
 * wrong factor or sign cannot hide under the tolerance). */
static int64_t compared[5], large[5];

/* Compares grad against central differences of L on up to PER_TENSOR entries of x. */
static void check_tensor(attn_ctx *ctx, attn_plan *plan, gcase *c, tu_rng *rng, int which,
                         const char *name, tu_buf *x, const tu_buf *grad, const char *impl) {
  if (x->n == 0) return;
  int64_t n = x->n, count = n < PER_TENSOR ? n : PER_TENSOR;
  int64_t *order = malloc((size_t)n * sizeof *order);
  if (order == NULL) abort();
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  for (int64_t i = 0; i < count; ++i) { /* partial Fisher-Yates: count distinct entries */
    int64_t j = tu_int(rng, i, n - 1), t = order[i];
    order[i] = order[j], order[j] = t;
  }
  double worst = 0, worst_fd = 0, worst_an = 0;
  int64_t worst_at = -1;
  int failed_run = 0;
  for (int64_t s = 0; s < count; ++s) {
    int64_t at = order[s];
    double x0 = tu_get(x, at);
    tu_set(x, at, x0 + STEP);
    double lp = loss(plan, c);
    tu_set(x, at, x0 - STEP);
    double lm = loss(plan, c);
    tu_set(x, at, x0);
    if (isnan(lp) || isnan(lm)) {
      failed_run = 1;
      break;
    }
    double fd = (lp - lm) / (2 * STEP), an = tu_get(grad, at);
    double err = fabs(fd - an) / fmax(1.0, fabs(an));
    if (!(err <= worst)) worst = isnan(err) ? INFINITY : err, worst_fd = fd, worst_an = an, worst_at = at;
    compared[which]++;
    if (fabs(an) > 1e-2) large[which]++;
  }
  free(order);
  if (failed_run) {
    tu_check(0, "%s %s: forward failed during differences: %s | %s", impl, name,
             attn_ctx_last_error(ctx), c->desc);
    return;
  }
  tu_check(worst <= TOL,
           "%s d%s vs differences (%lld of %lld entries): max rel err %.2e at %lld (fd %.9g, grad "
           "%.9g) | %s",
           impl, name, (long long)count, (long long)n, worst, (long long)worst_at, worst_fd, worst_an,
           c->desc);
}

static void run_case(attn_ctx *ctx, gcase *c, tu_rng *rng, const char *impl) {
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = impl;
  attn_plan *plan = NULL;
  attn_status st = attn_plan_create(ctx, &c->p, &sel, &plan);
  if (st != ATTN_STATUS_OK) {
    tu_check(0, "%s plan: %s | %s", impl, attn_ctx_last_error(ctx), c->desc);
    return;
  }
  /* Gradients start as NaN so that an entry the backward pass forgets to write shows. */
  tu_buf *grads[] = {&c->dq, &c->dk, &c->dv, &c->dbias, &c->dsinks};
  for (int t = 0; t < 5; ++t)
    for (int64_t i = 0; i < grads[t]->n; ++i) tu_set(grads[t], i, NAN);
  attn_tensor dout = tu_tensor(&c->dout);
  st = attn_plan_forward(plan, &c->in, NULL, 0, &c->o);
  if (st == ATTN_STATUS_OK) st = attn_plan_backward(plan, &c->in, &c->o, &dout, NULL, 0, &c->g);
  if (st != ATTN_STATUS_OK) {
    tu_check(0, "%s forward/backward: %s | %s", impl, attn_ctx_last_error(ctx), c->desc);
    attn_plan_destroy(plan);
    return;
  }
  char why[512];
  check_zeros(c, why, sizeof why);
  tu_check(why[0] == '\0', "%s exact zeros of rows/keys that see nothing, no NaN%s%s | %s", impl,
           why[0] ? ": " : "", why, c->desc);

  check_tensor(ctx, plan, c, rng, 0, "q", &c->q, &c->dq, impl);
  check_tensor(ctx, plan, c, rng, 1, "k", &c->k, &c->dk, impl);
  check_tensor(ctx, plan, c, rng, 2, "v", &c->v, &c->dv, impl);
  check_tensor(ctx, plan, c, rng, 3, "bias", &c->bias, &c->dbias, impl);
  check_tensor(ctx, plan, c, rng, 4, "sinks", &c->sinks, &c->dsinks, impl);
  attn_plan_destroy(plan);
}

int main(void) {
  uint64_t seed = tu_seed("test_gradcheck");
  tu_rng rng = tu_rng_make(seed);
  attn_ctx *ctx = NULL;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) {
    tu_check(0, "attn_ctx_create");
    return tu_finish();
  }
  int32_t n_impl = attn_impl_count();
  int64_t runs = 0;
  for (size_t f = 0; f < sizeof feature_sets / sizeof feature_sets[0]; ++f)
    for (int rep = 0; rep < REPEATS; ++rep) {
      gcase c;
      /* Both operations compute the same function; alternate them. */
      int op = (rep + (int)f) % 2 ? ATTN_OPERATION_SCALED_DOT_PRODUCT_ATTENTION
                                  : ATTN_OPERATION_FLASH_ATTENTION;
      case_make(&c, &rng, feature_sets[f].feats, op);
      printf("case %s #%d: %s\n", feature_sets[f].name, rep, c.desc);
      int ran = 0;
      for (int32_t i = 0; i < n_impl; ++i) {
        const char *impl = attn_impl_name(i);
        if (attn_impl_supports(ctx, impl, &c.p) != ATTN_STATUS_OK) continue;
        run_case(ctx, &c, &rng, impl);
        ran++, runs++;
      }
      tu_check(ran > 0, "some implementation runs the f64 problem (the reference must) | %s", c.desc);
      case_free(&c);
    }
  static const char *const names[5] = {"q", "k", "v", "bias", "sinks"};
  for (int t = 0; t < 5; ++t)
    tu_check(large[t] >= 20, "d%s: %lld entries compared, %lld with |grad| > 1e-2 (need >= 20 for the "
             "check to have teeth)", names[t], (long long)compared[t], (long long)large[t]);
  printf("%lld implementation runs\n", (long long)runs);
  attn_ctx_destroy(ctx);
  return tu_finish();
}
