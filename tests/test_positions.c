/*
 * tests/test_positions.c - a block placed inside a larger problem in pieces (attn_positions,
 * src/impl/impl.h): the form the distributed ring's zigzag steps take, two chunks of queries
 * against two chunks of keys that are not adjacent globally, in one call.
 *
 * The oracle is the larger problem itself, run whole by the reference in f64: a mask hides every
 * key outside the block's key chunks, and dout is zero outside its query chunks. Then the global
 * out and lse on the block's rows are the block's (its softmax runs over the same keys, under the
 * same global causal mask, window, ALiBi distances and dropout counters), the global dq on its rows
 * is the block's dq, and the global dk and dv on its keys are the block's (other rows add nothing:
 * their dout is zero). Each implementation that honours positions (ref, cpu) runs the block with
 * rows and keys in pieces, forward and backward, at odd and tile-crossing chunk lengths, and is
 * compared with the oracle's slices. Also: placements that break the rules are refused.
 */
#include "testutil.h"

#include "impl/impl.h"
#include "plan/plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static attn_ctx *ctx;

typedef struct pcase {
  const char *name;
  int64_t Lq, Lk;           /* chunk lengths: the global problem has 4 chunks of each */
  int32_t nr, nc;           /* pieces of rows and of keys (1 or 2) */
  int32_t rows[2], cols[2]; /* the global chunks of each piece */
  int causal, top_left, window_left, window_right, alibi, dropout, softcap;
  int64_t D, Dv;
} pcase;

/* A zigzag step's shapes (rows 0 and 3 against keys 1 and 2, and the reverse), one piece on one
 * side, Tq != Tk in both alignments, and chunks that cross the cpu's tiles (37, 80, 300). */
static const pcase cases[] = {
    {"zigzag-causal", 37, 37, 2, 2, {0, 3}, {1, 2}, 1, 0, -1, -1, 0, 0, 0, 5, 7},
    {"zigzag-causal-diag", 37, 37, 2, 2, {0, 3}, {0, 3}, 1, 0, -1, -1, 0, 0, 0, 5, 7},
    {"zigzag-dropout-alibi", 37, 37, 2, 2, {1, 2}, {0, 3}, 1, 0, -1, -1, 1, 1, 0, 5, 7},
    {"window", 37, 37, 2, 2, {0, 3}, {0, 2}, 0, 0, 40, 9, 0, 1, 0, 5, 7},
    {"causal-window-softcap", 80, 80, 2, 2, {1, 3}, {0, 3}, 1, 0, 100, -1, 1, 0, 1, 64, 64},
    {"rows-in-pieces", 80, 80, 2, 1, {0, 3}, {2, 0}, 1, 0, -1, -1, 0, 1, 0, 16, 16},
    {"keys-in-pieces", 80, 80, 1, 2, {2, 0}, {0, 3}, 1, 0, -1, -1, 0, 1, 0, 16, 16},
    {"cross-bottom-right", 24, 40, 2, 2, {0, 3}, {1, 3}, 1, 0, -1, -1, 1, 1, 0, 5, 7},
    {"cross-top-left", 40, 24, 2, 2, {0, 2}, {1, 3}, 1, 1, -1, -1, 1, 1, 0, 5, 7},
    {"long-causal-dropout", 300, 300, 2, 2, {0, 3}, {0, 3}, 1, 0, -1, -1, 0, 1, 0, 32, 32},
};

enum { B = 2, HQ = 4, HKV = 2 };

static tu_buf random_buf(tu_rng *rng, int64_t n, double lo, double hi) {
  /* values that bf16 holds exactly, so one oracle serves every dtype */
  tu_buf b = tu_buf_new(ATTN_DTYPE_BF16, n);
  tu_fill_uniform(&b, rng, lo, hi);
  tu_buf d = tu_buf_convert(&b, ATTN_DTYPE_F64);
  tu_buf_free(&b);
  return d;
}

static attn_problem problem_of(const pcase *c, int64_t Tq, int64_t Tk, attn_dtype dt) {
  attn_problem p;
  attn_problem_init(&p);
  p.dtype = dt;
  p.batch = B, p.heads_q = HQ, p.heads_kv = HKV, p.head_dim = c->D, p.head_dim_v = c->Dv;
  p.seqlen_q = Tq, p.seqlen_k = Tk;
  p.causal = c->causal;
  p.align = c->top_left ? ATTN_ALIGN_TOP_LEFT : ATTN_ALIGN_BOTTOM_RIGHT;
  p.window_left = c->window_left, p.window_right = c->window_right;
  if (c->alibi) p.alibi = ATTN_ALIBI_PER_HEAD;
  if (c->dropout) p.dropout_p = 0.25;
  if (c->softcap) p.softcap = 3.0;
  return p;
}

/* Global index of local index x of an axis of pieces, each `len` long, at global chunks `at`. */
static int64_t global_of(int64_t x, int64_t len, const int32_t *at) {
  return at[x / len] * len + x % len;
}

/* The [B, T, H, W] rows at the global positions of the pieces, or zeros there (scatter). */
static tu_buf take_rows(const tu_buf *g, int64_t Tg, int64_t H, int64_t W, int64_t len, int32_t n,
                        const int32_t *at, attn_dtype dt) {
  const int64_t T = len * n;
  tu_buf out = tu_buf_new(dt, B * T * H * W);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < H * W; ++e)
        tu_set(&out, (b * T + t) * H * W + e,
               tu_get(g, (b * Tg + global_of(t, len, at)) * H * W + e));
  return out;
}

/* max |got - want| <= tol * max(1, max |want|), with -inf lse rows equal. */
static void check(const char *what, const char *name, const char *impl, const tu_buf *got,
                  const tu_buf *want, double tol) {
  double scale = 1.0;
  const double err = tu_max_error(got, want, &scale);
  tu_check(err <= tol * scale, "%s on %s, %s: max error %.3g (scale %.3g, tolerance %.3g)", what,
           impl, name, err, scale, tol * scale);
}

static void run_case(const pcase *c, tu_rng *rng) {
  const int64_t Tq = 4 * c->Lq, Tk = 4 * c->Lk, tq = c->nr * c->Lq, tk = c->nc * c->Lk;
  const int64_t D = c->D, Dv = c->Dv;
  /* ---- the oracle: the whole problem, keys outside the block masked, dout 0 outside it ---- */
  tu_buf q = random_buf(rng, B * Tq * HQ * D, -1, 1), k = random_buf(rng, B * Tk * HKV * D, -1, 1);
  tu_buf v = random_buf(rng, B * Tk * HKV * Dv, -1, 1);
  tu_buf dout = random_buf(rng, B * Tq * HQ * Dv, -1, 1);
  tu_buf slopes = random_buf(rng, HQ, 0.05, 0.5);
  tu_buf slopes32 = tu_buf_convert(&slopes, ATTN_DTYPE_F32);
  int in_rows[64] = {0}, in_cols[64] = {0};
  for (int32_t a = 0; a < c->nr; ++a) in_rows[c->rows[a]] = 1;
  for (int32_t a = 0; a < c->nc; ++a) in_cols[c->cols[a]] = 1;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Tq; ++i)
      if (!in_rows[i / c->Lq])
        for (int64_t e = 0; e < HQ * Dv; ++e) tu_set(&dout, (b * Tq + i) * HQ * Dv + e, 0.0);
  tu_buf mask = tu_buf_new(ATTN_DTYPE_U8, Tq * Tk);
  for (int64_t i = 0; i < Tq; ++i)
    for (int64_t j = 0; j < Tk; ++j) tu_set(&mask, i * Tk + j, in_cols[j / c->Lk]);
  attn_problem gp = problem_of(c, Tq, Tk, ATTN_DTYPE_F64);
  gp.has_mask = 1;
  gp.mask_shape[0] = gp.mask_shape[1] = 1, gp.mask_shape[2] = Tq, gp.mask_shape[3] = Tk;
  tu_buf out = tu_buf_new(ATTN_DTYPE_F64, B * Tq * HQ * Dv),
         lse = tu_buf_new(ATTN_DTYPE_F64, B * HQ * Tq);
  tu_buf dq = tu_buf_new(ATTN_DTYPE_F64, B * Tq * HQ * D),
         dk = tu_buf_new(ATTN_DTYPE_F64, B * Tk * HKV * D);
  tu_buf dv = tu_buf_new(ATTN_DTYPE_F64, B * Tk * HKV * Dv);
  tu_args x;
  tu_args_bufs(&x, &q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv);
  x.in.mask = tu_tensor(&mask);
  x.in.alibi_slopes = tu_tensor(&slopes);
  x.in.dropout_seed = 0x5eed0f0123456789ull;
  attn_select ref;
  attn_select_init(&ref);
  ref.impl = "ref";
  attn_plan *whole = NULL;
  int ok = attn_plan_create(ctx, &gp, &ref, &whole) == ATTN_STATUS_OK &&
           attn_plan_forward(whole, &x.in, NULL, 0, &x.out) == ATTN_STATUS_OK &&
           attn_plan_backward(whole, &x.in, &x.out, &x.dout, NULL, 0, &x.grads) == ATTN_STATUS_OK;
  tu_check(ok, "%s: the whole problem on the reference (%s)", c->name, attn_ctx_last_error(ctx));
  attn_plan_destroy(whole);

  /* ---- the block on each implementation that places blocks, in pieces ---- */
  /* partial: out, dq, dk and dv written in f32 for a bf16 problem (attn_positions.partial), so
   * the reference's are exact to f32 and the cpu's lack the final rounding to bf16 */
  static const struct {
    const char *impl;
    attn_dtype dt;
    int partial;
    double tol, tol_grad; /* the backward reads out rounded to the dtype: Delta moves with it */
  } runs[] = {{"ref", ATTN_DTYPE_F64, 0, 1e-10, 1e-10},
              {"ref", ATTN_DTYPE_BF16, 1, 1e-5, 1e-2},
              {"cpu", ATTN_DTYPE_F32, 0, 2e-4, 2e-4},
              {"cpu", ATTN_DTYPE_BF16, 0, 3e-2, 3e-2},
              {"cpu", ATTN_DTYPE_BF16, 1, 2e-2, 2e-2}};
  for (size_t r = 0; ok && r < sizeof runs / sizeof runs[0]; ++r) {
    const attn_dtype dt = runs[r].dt, st = dt == ATTN_DTYPE_F64 ? ATTN_DTYPE_F64 : ATTN_DTYPE_F32;
    const attn_dtype rdt = runs[r].partial ? ATTN_DTYPE_F32 : dt; /* of out, dq, dk, dv */
    attn_problem bp = problem_of(c, tq, tk, dt);
    attn_positions pos;
    memset(&pos, 0, sizeof pos);
    pos.rows.pieces = c->nr, pos.cols.pieces = c->nc;
    for (int32_t a = 0; a < c->nr; ++a)
      pos.rows.start[a] = a * c->Lq, pos.rows.global[a] = c->rows[a] * c->Lq;
    for (int32_t a = 0; a < c->nc; ++a)
      pos.cols.start[a] = a * c->Lk, pos.cols.global[a] = c->cols[a] * c->Lk;
    pos.has_offset = 1;
    pos.offset = c->top_left ? 0 : Tk - Tq;
    pos.partial = runs[r].partial;
    tu_buf bq = take_rows(&q, Tq, HQ, D, c->Lq, c->nr, c->rows, dt);
    tu_buf bk = take_rows(&k, Tk, HKV, D, c->Lk, c->nc, c->cols, dt);
    tu_buf bv = take_rows(&v, Tk, HKV, Dv, c->Lk, c->nc, c->cols, dt);
    tu_buf bdout = take_rows(&dout, Tq, HQ, Dv, c->Lq, c->nr, c->rows, dt);
    tu_buf bout = tu_buf_new(rdt, B * tq * HQ * Dv), blse = tu_buf_new(st, B * HQ * tq);
    tu_buf bdq = tu_buf_new(rdt, B * tq * HQ * D), bdk = tu_buf_new(rdt, B * tk * HKV * D);
    tu_buf bdv = tu_buf_new(rdt, B * tk * HKV * Dv);
    tu_args bx;
    tu_args_bufs(&bx, &bq, &bk, &bv, &bout, &blse, &bdout, &bdq, &bdk, &bdv);
    bx.in.alibi_slopes = tu_tensor(dt == ATTN_DTYPE_F64 ? &slopes : &slopes32);
    bx.in.dropout_seed = x.in.dropout_seed;
    attn_select sel;
    attn_select_init(&sel);
    sel.impl = runs[r].impl;
    attn_plan *plan = NULL;
    char name[128];
    snprintf(name, sizeof name, "%s %s%s", c->name, attn_dtype_name(dt),
             runs[r].partial ? " (partial, f32 results)" : "");
    int run_ok = attn_plan_create(ctx, &bp, &sel, &plan) == ATTN_STATUS_OK &&
                 attn_plan_set_positions(plan, &pos) == ATTN_STATUS_OK &&
                 attn_plan_forward(plan, &bx.in, NULL, 0, &bx.out) == ATTN_STATUS_OK;
    /* the backward reads out in the problem's dtype (a caller's whole result) */
    tu_buf out_dt = tu_buf_convert(&bout, dt);
    attn_outputs fwd = bx.out;
    fwd.out = tu_tensor(&out_dt);
    run_ok = run_ok &&
             attn_plan_backward(plan, &bx.in, &fwd, &bx.dout, NULL, 0, &bx.grads) == ATTN_STATUS_OK;
    tu_buf_free(&out_dt);
    tu_check(run_ok, "%s on %s runs (%s)", name, runs[r].impl, attn_ctx_last_error(ctx));
    attn_plan_destroy(plan);
    if (run_ok) {
      /* the oracle's slices: out, dq on the rows; lse [B, Hq, T] by row; dk, dv on the keys */
      tu_buf wout = take_rows(&out, Tq, HQ, Dv, c->Lq, c->nr, c->rows, ATTN_DTYPE_F64);
      tu_buf wdq = take_rows(&dq, Tq, HQ, D, c->Lq, c->nr, c->rows, ATTN_DTYPE_F64);
      tu_buf wdk = take_rows(&dk, Tk, HKV, D, c->Lk, c->nc, c->cols, ATTN_DTYPE_F64);
      tu_buf wdv = take_rows(&dv, Tk, HKV, Dv, c->Lk, c->nc, c->cols, ATTN_DTYPE_F64);
      tu_buf wlse = tu_buf_new(ATTN_DTYPE_F64, B * HQ * tq);
      for (int64_t bh = 0; bh < B * HQ; ++bh)
        for (int64_t i = 0; i < tq; ++i)
          tu_set(&wlse, bh * tq + i, tu_get(&lse, bh * Tq + global_of(i, c->Lq, c->rows)));
      check("out", name, runs[r].impl, &bout, &wout, runs[r].tol);
      check("lse", name, runs[r].impl, &blse, &wlse, runs[r].tol);
      check("dq", name, runs[r].impl, &bdq, &wdq, runs[r].tol_grad);
      check("dk", name, runs[r].impl, &bdk, &wdk, runs[r].tol_grad);
      check("dv", name, runs[r].impl, &bdv, &wdv, runs[r].tol_grad);
      tu_buf *w[] = {&wout, &wdq, &wdk, &wdv, &wlse};
      for (size_t i = 0; i < 5; ++i) tu_buf_free(w[i]);
    }
    tu_buf *all[] = {&bq, &bk, &bv, &bdout, &bout, &blse, &bdq, &bdk, &bdv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) tu_buf_free(all[i]);
  }
  tu_buf *all[] = {&q, &k, &v, &dout, &slopes, &slopes32, &mask, &out, &lse, &dq, &dk, &dv};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) tu_buf_free(all[i]);
}

/* Placements that break the rules get INVALID_ARGUMENT naming the axis and the rule. */
static void refusals(void) {
  attn_problem p;
  attn_problem_init(&p);
  p.batch = 1, p.heads_q = p.heads_kv = 1, p.head_dim = 8, p.seqlen_q = p.seqlen_k = 16;
  attn_plan *plan = NULL;
  if (attn_plan_create(ctx, &p, NULL, &plan) != ATTN_STATUS_OK) {
    tu_check(0, "a plan for the refusals (%s)", attn_ctx_last_error(ctx));
    return;
  }
  attn_positions pos;
  memset(&pos, 0, sizeof pos);
  pos.has_offset = 1;
  pos.rows.pieces = ATTN_POSITION_PIECES + 1;
  tu_check(attn_plan_set_positions(plan, &pos) == ATTN_STATUS_INVALID_ARGUMENT &&
               strstr(attn_ctx_last_error(ctx), "positions.rows.pieces") != NULL,
           "too many pieces refused (%s)", attn_ctx_last_error(ctx));
  pos.rows.pieces = 2, pos.rows.start[1] = 16;
  tu_check(attn_plan_set_positions(plan, &pos) == ATTN_STATUS_INVALID_ARGUMENT &&
               strstr(attn_ctx_last_error(ctx), "positions.rows piece 1") != NULL,
           "a piece starting at the end refused (%s)", attn_ctx_last_error(ctx));
  pos.rows.pieces = 1, pos.cols.pieces = 2, pos.cols.start[1] = 8, pos.has_offset = 0;
  tu_check(attn_plan_set_positions(plan, &pos) == ATTN_STATUS_INVALID_ARGUMENT &&
               strstr(attn_ctx_last_error(ctx), "need has_offset") != NULL,
           "pieces without global masks refused (%s)", attn_ctx_last_error(ctx));
  pos.has_offset = 1, pos.cols.global[1] = -3;
  tu_check(attn_plan_set_positions(plan, &pos) == ATTN_STATUS_INVALID_ARGUMENT,
           "a negative global position refused (%s)", attn_ctx_last_error(ctx));
  pos.cols.global[1] = 40;
  tu_check(attn_plan_set_positions(plan, &pos) == ATTN_STATUS_OK, "a valid placement taken (%s)",
           attn_ctx_last_error(ctx));
  attn_plan_destroy(plan);
}

int main(int argc, char **argv) {
  (void)argc, (void)argv;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) return 1;
  tu_rng rng = tu_rng_make(tu_seed("test_positions"));
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) run_case(&cases[i], &rng);
  refusals();
  attn_ctx_destroy(ctx);
  return tu_finish();
}
