/*
 * tools/test_harness.c - the attn tool's oracle (harness.h): that a sampled check really compares
 * rows, and fails when one of them is wrong.
 *
 * An implementation "corrupt" runs the reference and then adds 1 to one element of one output,
 * chosen by the test: an element of a row the oracle checks must turn the check into a failure, for
 * out, lse, dq, dk and dv, sampled and full; without the corruption it passes. The sample must hold
 * the first and last query rows and at least as many rows as asked for; an f64 problem's reference
 * run as a candidate must match the oracle bit for bit on out, lse and dq, since both are the same
 * row functions of src/impl/ref on the same inputs. The rule's extent (tests/tolerance.h,
 * tol_extent): problems whose own values put SPEC's letter out of reach (docs/NUMERICS.md) pass on
 * ref and cpu, a corrupted element still fails them, and a problem of ordinary values keeps the
 * letter's bound exactly. Registered in tools/CMakeLists.txt (it links harness.c), not by the tests
 * folder's glob.
 */
#define _POSIX_C_SOURCE 200809L
#include "../tests/testutil.h"
#include "core/dtype.h"
#include "core/tensors.h"
#include "harness.h"
#include "plan/registry.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

extern const attn_impl attn_ref_impl, attn_cpu_impl;

/* The element "corrupt" changes, adding 1 (or making 0 of an infinity, such as the lse of a row
 * outside every sequence): an output (ATTN_ROLE_COUNT: none) and its dense index. */
static attn_role corrupt_role = ATTN_ROLE_COUNT;
static int64_t corrupt_index;

static void corrupt(const attn_run *run, const attn_tensor *t, attn_role role) {
  if (role != corrupt_role || t->data == NULL) return;
  attn_dtype dtype = attn_role_dtype(run->problem, role);
  double v = attn_load(t->data, dtype, corrupt_index);
  attn_store(t->data, dtype, corrupt_index, isfinite(v) ? v + 1.0 : 0.0);
}

static attn_status corrupt_forward(const attn_run *run) {
  attn_status st = attn_ref_impl.forward(run);
  corrupt(run, &run->outputs->out, ATTN_ROLE_OUT);
  corrupt(run, &run->outputs->lse, ATTN_ROLE_LSE);
  return st;
}

static attn_status corrupt_backward(const attn_run *run) {
  attn_status st = attn_ref_impl.backward(run);
  corrupt(run, &run->grads->dq, ATTN_ROLE_DQ);
  corrupt(run, &run->grads->dk, ATTN_ROLE_DK);
  corrupt(run, &run->grads->dv, ATTN_ROLE_DV);
  return st;
}

static attn_impl corrupt_impl;

static void install(void) {
  corrupt_impl = attn_ref_impl;
  corrupt_impl.name = "corrupt";
  corrupt_impl.forward = corrupt_forward;
  corrupt_impl.backward = corrupt_backward;
  static const attn_impl *list[3] = {&corrupt_impl, &attn_ref_impl, &attn_cpu_impl};
  attn_registry_set_for_testing(list, 3);
}

/* Index of lse[head, token] in the dense lse of p (the harness's own layout rule). */
static int64_t lse_index(const attn_problem *p, int64_t head, int64_t token) {
  if (p->varlen == ATTN_VARLEN_PACKED) return head * p->total_q + token;
  return (token / p->seqlen_q * p->heads_q + head) * p->seqlen_q + token % p->seqlen_q;
}

/* The dense index of element d of row id of an output: query rows for out, lse, dq; key rows for
 * dk, dv. */
static int64_t element(const attn_problem *p, attn_role role, int64_t id, int64_t d) {
  int64_t dv = p->head_dim_v > 0 ? p->head_dim_v : p->head_dim;
  switch (role) {
  case ATTN_ROLE_LSE: return lse_index(p, id % p->heads_q, id / p->heads_q);
  case ATTN_ROLE_OUT:
  case ATTN_ROLE_DV: return id * dv + d % dv;
  default: return id * p->head_dim + d % p->head_dim;
  }
}

static int contains(const int64_t *ids, int64_t n, int64_t id) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] == id) return 1;
  return 0;
}

/* The oracle of the problem text (seed and rows as h_oracle_make takes them), p its parse; NULL,
 * a failed check said, when either fails. */
static h_oracle *make_oracle(attn_ctx *ctx, const char *text, int backward, uint64_t seed,
                             int64_t sample_rows, attn_problem *p) {
  h_oracle *o = NULL;
  if (attn_problem_parse(ctx, text, p) != ATTN_STATUS_OK) {
    tu_check(0, "%s: parses (%s)", text, attn_ctx_last_error(ctx));
    return NULL;
  }
  attn_status st = h_oracle_make(ctx, p, backward, seed, sample_rows, &o);
  tu_check(st == ATTN_STATUS_OK, "%s: oracle made (%s)", text, attn_ctx_last_error(ctx));
  return st == ATTN_STATUS_OK ? o : NULL;
}

/* One problem: the oracle with sample_rows, the clean candidate passing, and each output corrupted
 * at a checked row failing (and, forward, at an unchecked row passing: the check is a sample, as
 * it says). */
static void check_problem(attn_ctx *ctx, const char *text, int backward, int64_t sample_rows,
                          tu_rng *rng) {
  attn_problem p;
  h_oracle *o = make_oracle(ctx, text, backward, 7, sample_rows, &p);
  if (o == NULL) return;
  const h_rows *rows = h_oracle_rows(o);
  const int64_t *qids, *kids;
  int64_t nq = h_oracle_query_ids(o, &qids), nk = h_oracle_key_ids(o, &kids);
  char said[512];
  h_oracle_describe(o, said, sizeof said);
  printf("  %s%s: %s\n", text, backward ? " (backward)" : "", said);
  int64_t want =
      sample_rows > 0 && sample_rows < rows->query_total ? sample_rows : rows->query_total;
  tu_check(rows->sampled == (sample_rows > 0 && sample_rows < rows->query_total),
           "%s: sampled exactly when fewer rows are asked for", text);
  tu_check(nq == rows->query_checked && nq >= want && nq <= rows->query_total,
           "%s: %lld query rows checked, at least %lld", text, (long long)nq, (long long)want);
  tu_check(contains(qids, nq, 0) && contains(qids, nq, rows->query_total - 1),
           "%s: the first and the last query rows are checked", text);
  tu_check(!backward || (nk == rows->key_checked && nk > 0 && !rows->keys_skipped),
           "%s: key rows are checked (%lld)", text, (long long)nk);
  tu_check(strstr(said, rows->sampled ? "sampled, seed 7" : "every row") != NULL,
           "%s: the description says how the rows were chosen", text);

  corrupt_role = ATTN_ROLE_COUNT;
  h_check c = h_check_run(ctx, o, "corrupt", "default");
  tu_check(c.status == ATTN_STATUS_OK && c.ok && c.compared == (backward ? 5 : 2),
           "%s: the reference passes its own check (%d outputs compared)", text, c.compared);
  const attn_role roles[5] = {ATTN_ROLE_OUT, ATTN_ROLE_LSE, ATTN_ROLE_DQ, ATTN_ROLE_DK,
                              ATTN_ROLE_DV};
  for (int r = 0; r < (backward ? 5 : 2); ++r) {
    int keys = roles[r] == ATTN_ROLE_DK || roles[r] == ATTN_ROLE_DV;
    const int64_t *ids = keys ? kids : qids;
    int64_t n = keys ? nk : nq, id = ids[tu_int(rng, 0, n - 1)], d = tu_int(rng, 0, 1 << 20);
    corrupt_role = roles[r];
    corrupt_index = element(&p, roles[r], id, d);
    c = h_check_run(ctx, o, "corrupt", "default");
    /* (Backward, a wrong out or lse also spoils the gradients, which may then be worse.) */
    tu_check(c.status == ATTN_STATUS_OK && !c.ok &&
                 (backward || strcmp(c.worst, attn_role_name(roles[r])) == 0),
             "%s: %s corrupted at checked row %lld fails the check (worst: %s)", text,
             attn_role_name(roles[r]), (long long)id, c.worst);
    /* Forward only: in the backward pass a wrong out reaches the checked key rows' dk and dv. */
    if (!rows->sampled || backward) continue;
    int64_t unchecked = -1;
    for (int64_t tries = 0; tries < 1000 && unchecked < 0; ++tries) {
      int64_t cand = tu_int(rng, 0, rows->query_total - 1);
      if (!contains(qids, nq, cand)) unchecked = cand;
    }
    if (unchecked < 0) continue;
    corrupt_index = element(&p, roles[r], unchecked, d);
    c = h_check_run(ctx, o, "corrupt", "default");
    tu_check(c.status == ATTN_STATUS_OK && c.ok,
             "%s: %s corrupted at unchecked row %lld goes unseen, as a sample does", text,
             attn_role_name(roles[r]), (long long)unchecked);
  }
  corrupt_role = ATTN_ROLE_COUNT;
  /* f64: the candidate ref and the oracle are the same row functions on the same inputs. */
  if (p.dtype == ATTN_DTYPE_F64) {
    c = h_check_run(ctx, o, "ref", "default");
    tu_check(c.ok && c.err[0] == 0.0 && c.err[1] == 0.0 && (!backward || c.err[2] == 0.0),
             "%s: the whole reference matches the oracle's rows bit for bit (out %g lse %g dq %g)",
             text, c.err[0], c.err[1], c.err[2]);
    tu_check(!backward || (c.err[3] <= 1e-12 * c.ref[3] && c.err[4] <= 1e-12 * c.ref[4]),
             "%s: and dk, dv up to the order of the sums (%g, %g)", text, c.err[3], c.err[4]);
  }
  h_oracle_free(o);
}

/* What a problem's values add to the rule (docs/NUMERICS.md, "What a problem's values add"). */
static void check_extent(attn_ctx *ctx) {
  /* Each missed SPEC's letter on ref or cpu (the first on ref on every instruction set: the naive
   * f32 computation itself), found by fuzz_problem; the attn tool's rule passes them. */
  static const struct {
    const char *problem, *impl;
  } past_letter[] = {
      {"b1 hq2 hkv2 sq4 sk4 d8 f32 scale=30000", "ref"},
      {"b1 hq2 hkv2 sq4 sk4 d8 f32 scale=3000", "cpu"},
      {"b21 hq2 hkv2 sq4 sk4 d31 f32 scale=-2 softcap=0.001", "cpu"},
      {"b12 hq4 hkv2 sq4 sk4 d35 bf16 scale=-3 softcap=0.001", "cpu"},
      {"b2 hq1 hkv1 sq1 sk8 d2 bf16", "cpu"},
  };
  for (size_t i = 0; i < sizeof past_letter / sizeof *past_letter; ++i) {
    const char *text = past_letter[i].problem;
    attn_problem p;
    h_oracle *o = make_oracle(ctx, text, 1, 1, 0, &p);
    if (o == NULL) continue;
    h_check c = h_check_run(ctx, o, past_letter[i].impl, NULL);
    tu_check(c.status == ATTN_STATUS_OK && c.ok,
             "%s on %s: within the rule's extent (dq %.2e/%.2e dk %.2e/%.2e dv %.2e/%.2e)", text,
             past_letter[i].impl, c.err[2], c.tol[2], c.err[3], c.tol[3], c.err[4], c.tol[4]);
    /* The extent is a bound of rounding, not of a wrong element: 1 added to dv still fails. */
    corrupt_role = ATTN_ROLE_DV, corrupt_index = 0;
    c = h_check_run(ctx, o, "corrupt", "default");
    corrupt_role = ATTN_ROLE_COUNT;
    tu_check(c.status == ATTN_STATUS_OK && !c.ok, "%s: a corrupted dv still fails (dv %.2e/%.2e)",
             text, c.err[4], c.tol[4]);
    h_oracle_free(o);
  }
  /* Ordinary values: the bound is SPEC's letter, to the bit. */
  attn_problem p;
  const char *text = "b2 hq4 hkv2 sq150 sk140 d16 f32 causal scale=2";
  h_oracle *o = make_oracle(ctx, text, 1, 1, 0, &p);
  if (o == NULL) return;
  h_check c = h_check_run(ctx, o, "cpu", NULL);
  int letter = c.ok && c.compared == 5;
  for (int i = 0; i < c.compared; ++i) /* (without an extent the pass does not matter) */
    letter = letter && c.tol[i] == tol_bound_f32(TOL_FORWARD, c.ref[i], NULL);
  tu_check(letter, "%s: passes under SPEC's letter, its bound unchanged (out %.2e lse %.2e dq %.2e)",
           text, c.tol[0], c.tol[1], c.tol[2]);
  h_oracle_free(o);
}

int main(void) {
  tu_rng rng = tu_rng_make(tu_seed("test_harness"));
  install();
  attn_ctx *ctx = NULL;
  attn_ctx_create(&ctx);
  static const char *const problems[] = {
      "b2 hq4 hkv2 sq150 sk140 d16 f32 causal", /* GQA, rows past tile 128 */
      "b3 hq2 hkv1 sq40 sk33 d8 bf16 varlen=packed:100,90",
      "b3 hq2 sq40 sk50 d8 f16 varlen=padded",
      "b2 hq2 sq37 sk41 d8 f64 bias=2x1x37x41 alibi=h dropout=0.2 softcap=4",
      "b2 hq2 hkv1 sq70 sk70 d8 dv16 f64 align=tl window=20,3",
  };
  for (size_t i = 0; i < sizeof problems / sizeof *problems; ++i)
    for (int backward = 0; backward <= 1; ++backward) {
      check_problem(ctx, problems[i], backward, 64, &rng); /* sampled: edges and random rows */
      check_problem(ctx, problems[i], backward, 0, &rng);  /* every row */
    }
  check_extent(ctx);
  attn_ctx_destroy(ctx);
  attn_registry_set_for_testing(NULL, 0);
  return tu_finish();
}
