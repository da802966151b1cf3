/*
 * tests/test_philox.c - the dropout rule of SPEC.md "Dropout": Philox4x32-10 against its published
 * known-answer vectors, the keep threshold at its edges, and an end-to-end check that the reference
 * drops exactly the elements attn_dropout_keep() names, for dense and packed-varlen problems.
 *
 * The end-to-end part runs scaled_dot_product_attention twice on the same data, once without and
 * once with dropout, both returning the probabilities. Where the undropped probability P is
 * positive, the dropped one must be P / (1 - p) exactly where keep(seed, threshold, b, h, i, j) says
 * so and 0 elsewhere; where P is 0 (masked) it must stay 0.
 */
#include "testutil.h"

#include "core/philox.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static void known_answers(void) {
  static const struct {
    uint32_t ctr[4], key[2], want[4];
  } kat[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (size_t t = 0; t < sizeof kat / sizeof kat[0]; ++t) {
    uint32_t got[4];
    attn_philox4x32_10(kat[t].ctr, kat[t].key, got);
    tu_check(memcmp(got, kat[t].want, sizeof got) == 0,
             "philox4x32-10 known answer %zu: got %08x %08x %08x %08x, want %08x %08x %08x %08x", t,
             got[0], got[1], got[2], got[3], kat[t].want[0], kat[t].want[1], kat[t].want[2],
             kat[t].want[3]);
  }

  /* attn_dropout_keep reads word j & 3 of the call countered by (i, j >> 2, h, b), keyed by the
   * seed's low and high words: check the mapping on the third vector. */
  uint64_t seed = ((uint64_t)0x299f31d0u << 32) | 0xa4093822u;
  int ok = 1;
  for (int64_t j = 4 * 0x85a308d3LL; j < 4 * 0x85a308d3LL + 4; ++j) {
    uint32_t word = kat[2].want[j & 3];
    /* threshold = word keeps it, word + 1 drops it */
    ok &= attn_dropout_keep(seed, word, 0x03707344, 0x13198a2e, 0x243f6a88, j) == 1;
    if (word != 0xffffffffu)
      ok &= attn_dropout_keep(seed, word + 1, 0x03707344, 0x13198a2e, 0x243f6a88, j) == 0;
  }
  tu_check(ok, "attn_dropout_keep uses counter (i, j>>2, h, b), key (seed lo, seed hi), word j&3");
}

static void thresholds(void) {
  tu_check(attn_dropout_threshold(0.0) == 0u, "threshold(0) = %u, want 0",
           attn_dropout_threshold(0.0));
  tu_check(attn_dropout_threshold(0.5) == 0x80000000u, "threshold(0.5) = %u, want 2^31",
           attn_dropout_threshold(0.5));
  tu_check(attn_dropout_threshold(0.25) == 0x40000000u, "threshold(0.25) = %u, want 2^30",
           attn_dropout_threshold(0.25));
  double below_one = 1.0 - 0x1p-33; /* p * 2^32 = 2^32 - 0.5: floor gives the largest word */
  tu_check(attn_dropout_threshold(below_one) == 0xffffffffu, "threshold(1 - 2^-33) = %u, want 2^32-1",
           attn_dropout_threshold(below_one));
  tu_check(attn_dropout_threshold(0x1p-32) == 1u, "threshold(2^-32) = %u, want 1",
           attn_dropout_threshold(0x1p-32));
  tu_check(attn_dropout_threshold(0.3) == 1288490188u, "threshold(0.3) = %u, want 1288490188",
           attn_dropout_threshold(0.3));
  /* p = 0 keeps everything: no word is below 0. */
  int all = 1;
  for (int64_t j = 0; j < 64; ++j) all &= attn_dropout_keep(12345u, 0u, 1, 2, 3, j);
  tu_check(all, "threshold 0 keeps every element");
}

/* One SDPA forward of an f64 problem, returning the probabilities. */
static attn_status run_probs(attn_ctx *ctx, const attn_problem *p, const attn_inputs *in,
                             tu_buf *out, tu_buf *probs) {
  attn_outputs o;
  attn_outputs_init(&o);
  o.out = tu_tensor(out);
  o.probs = tu_tensor(probs);
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = "ref";
  attn_plan *plan = NULL;
  attn_status st = attn_plan_create(ctx, p, &sel, &plan);
  if (st != ATTN_STATUS_OK) return st;
  st = attn_plan_forward(plan, in, NULL, 0, &o);
  attn_plan_destroy(plan);
  return st;
}

/* The end-to-end check for one problem; packed varlen when cu_q/cu_k are given. */
static void end_to_end(attn_ctx *ctx, tu_rng *rng, const char *label, int64_t B, int64_t Tq, int64_t Tk,
                       int64_t Hq, int64_t Hkv, int64_t D, int causal, const int32_t *cu_q,
                       const int32_t *cu_k, uint64_t seed) {
  const double p_drop = 0.3;
  attn_problem p;
  attn_problem_init(&p);
  p.operation = ATTN_OPERATION_SCALED_DOT_PRODUCT_ATTENTION;
  p.dtype = ATTN_DTYPE_F64;
  p.batch = B, p.seqlen_q = Tq, p.seqlen_k = Tk, p.heads_q = Hq, p.heads_kv = Hkv, p.head_dim = D;
  p.causal = causal;
  int64_t rows_q = B * Tq, rows_k = B * Tk;
  if (cu_q != NULL) {
    p.varlen = ATTN_VARLEN_PACKED;
    p.total_q = rows_q = cu_q[B];
    p.total_k = rows_k = cu_k[B];
  }
  tu_buf q = tu_buf_new(ATTN_DTYPE_F64, rows_q * Hq * D);
  tu_buf k = tu_buf_new(ATTN_DTYPE_F64, rows_k * Hkv * D);
  tu_buf v = tu_buf_new(ATTN_DTYPE_F64, rows_k * Hkv * D);
  tu_buf out = tu_buf_new(ATTN_DTYPE_F64, rows_q * Hq * D);
  int64_t np = B * Hq * Tq * Tk;
  tu_buf probs0 = tu_buf_new(ATTN_DTYPE_F64, np), probs1 = tu_buf_new(ATTN_DTYPE_F64, np);
  tu_fill_uniform(&q, rng, -1, 1);
  tu_fill_uniform(&k, rng, -1, 1);
  tu_fill_uniform(&v, rng, -1, 1);
  attn_inputs in;
  attn_inputs_init(&in);
  in.q = tu_tensor(&q), in.k = tu_tensor(&k), in.v = tu_tensor(&v);
  in.cu_seqlens_q = cu_q, in.cu_seqlens_k = cu_k;
  in.dropout_seed = seed;

  attn_status s0 = run_probs(ctx, &p, &in, &out, &probs0);
  p.dropout_p = p_drop;
  attn_status s1 = run_probs(ctx, &p, &in, &out, &probs1);
  tu_check(s0 == ATTN_STATUS_OK && s1 == ATTN_STATUS_OK, "%s: sdpa with probs runs (%s)", label,
           attn_ctx_last_error(ctx));
  if (s0 != ATTN_STATUS_OK || s1 != ATTN_STATUS_OK) goto done;

  uint32_t thr = attn_dropout_threshold(p_drop);
  int64_t positive = 0, kept = 0, wrong_pattern = 0, wrong_value = 0, masked_nonzero = 0;
  int64_t first_bad = -1;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Tq; ++i)
        for (int64_t j = 0; j < Tk; ++j) {
          int64_t at = ((b * Hq + h) * Tq + i) * Tk + j;
          double P = tu_get(&probs0, at), Pd = tu_get(&probs1, at);
          if (!(P > 0)) {
            if (Pd != 0) {
              masked_nonzero++;
              if (first_bad < 0) first_bad = at;
            }
            continue;
          }
          positive++;
          int keep = attn_dropout_keep(seed, thr, b, h, i, j);
          kept += keep;
          if ((Pd != 0) != keep) {
            wrong_pattern++;
            if (first_bad < 0) first_bad = at;
          } else if (keep && fabs(Pd - P / (1 - p_drop)) > 1e-12 * (P / (1 - p_drop))) {
            wrong_value++;
            if (first_bad < 0) first_bad = at;
          }
        }
  tu_check(positive > 0 && wrong_pattern == 0,
           "%s: probs == 0 exactly where attn_dropout_keep drops (%lld of %lld disagree, first at "
           "flat index %lld)",
           label, (long long)wrong_pattern, (long long)positive, (long long)first_bad);
  tu_check(wrong_value == 0, "%s: kept probabilities are P / (1 - p) (%lld wrong)", label,
           (long long)wrong_value);
  tu_check(masked_nonzero == 0, "%s: masked probabilities stay 0 under dropout (%lld nonzero)", label,
           (long long)masked_nonzero);
  if (positive >= 200) {
    double frac = (double)kept / (double)positive;
    /* 0.7 expected; the bound is > 6 standard deviations for the sizes used here. */
    tu_check(fabs(frac - 0.7) < 0.15, "%s: kept fraction %.3f of %lld is near 0.7", label, frac,
             (long long)positive);
  }
done:
  tu_buf_free(&q), tu_buf_free(&k), tu_buf_free(&v), tu_buf_free(&out);
  tu_buf_free(&probs0), tu_buf_free(&probs1);
}

int main(void) {
  uint64_t seed = tu_seed("test_philox");
  tu_rng rng = tu_rng_make(seed);
  known_answers();
  thresholds();

  attn_ctx *ctx = NULL;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) {
    tu_check(0, "attn_ctx_create");
    return tu_finish();
  }
  /* A seed with both words nonzero, so a swapped or dropped key word shows. */
  uint64_t dseed = 0x0123456789abcdefULL ^ seed;
  end_to_end(ctx, &rng, "dense b2 hq3 hkv1 sq7 sk13 d4", 2, 7, 13, 3, 1, 4, 0, NULL, NULL, dseed);
  end_to_end(ctx, &rng, "dense causal b3 hq2 hkv2 sq9 sk6 d3", 3, 9, 6, 2, 2, 3, 1, NULL, NULL,
             dseed + 1);
  /* Packed varlen: b is the sequence index and i, j the in-sequence positions. */
  static const int32_t cu_q[] = {0, 5, 5, 12}, cu_k[] = {0, 7, 10, 21};
  end_to_end(ctx, &rng, "packed b3 hq2 hkv1 sq7 sk11 d3", 3, 7, 11, 2, 1, 3, 0, cu_q, cu_k,
             dseed + 2);
  end_to_end(ctx, &rng, "packed causal b3 hq2 hkv2 sq7 sk11 d2", 3, 7, 11, 2, 2, 2, 1, cu_q, cu_k,
             dseed + 3);
  attn_ctx_destroy(ctx);
  return tu_finish();
}
