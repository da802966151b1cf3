/*
 * tests/mpi/test_dist_mpi.c - distributed attention over MPI, run under mpirun with 2, 3 and 4
 * ranks (tests/CMakeLists.txt registers each): every sharding x layout x feature is compared with
 * the single-process result of the same global problem, slice by slice.
 *
 * Every rank draws the same global tensors (rank 0's seed is broadcast; ATTN_TEST_SEED replays a
 * run), computes the global forward and backward alone with the single-device library, cuts its own
 * shards, runs the distributed plan and checks its outputs against its slice of the global ones.
 * With dropout, a wrong keep bit would move an output by O(1), far outside the f32 tolerance, so
 * equal results within SPEC.md's tolerance mean equal dropout bits.
 *
 * Also: ranks that disagree about the problem or the spec, sizes that do not divide, and a peer
 * that never joins a run (bounded wait) give statuses, not hangs.
 */
#include "attn.h"
#include "attn_dist.h"
#include "testutil.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int world_rank, world_size;
static attn_ctx *ctx;

/* ---- index maps: a shard is the global tensor gathered along one global index list per dim ---- */

typedef struct imap {
  int64_t n;
  int64_t *at; /* global index of each local one */
} imap;

static imap map_range(int64_t start, int64_t n) {
  imap m = {n, malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t))};
  for (int64_t i = 0; i < n; ++i) m.at[i] = start + i;
  return m;
}

/* The global positions of this rank's rows of a sequence of T, as the plan places them (two
 * sequence axes place them in a layout of their own). */
static imap map_plan(const attn_dist_plan *plan, int32_t ranks, int64_t T) {
  imap m = {T / ranks, malloc((size_t)(T / ranks > 0 ? T / ranks : 1) * sizeof(int64_t))};
  for (int64_t i = 0; i < m.n; ++i) m.at[i] = attn_dist_plan_position(plan, T, i);
  return m;
}

static imap map_layout(int32_t layout, int32_t ranks, int64_t T, int32_t rank) {
  imap m = {T / ranks, malloc((size_t)(T / ranks > 0 ? T / ranks : 1) * sizeof(int64_t))};
  for (int64_t i = 0; i < m.n; ++i) m.at[i] = attn_dist_layout_position(layout, ranks, T, rank, i);
  return m;
}

/* A copy of n0 x n1 x n2 x n3 of a dense global [s0, s1, s2, s3] (doubles) along the maps. */
static double *gather4(const double *g, const int64_t s[4], const imap *m[4]) {
  const int64_t total = m[0]->n * m[1]->n * m[2]->n * m[3]->n;
  double *out = malloc((size_t)(total > 0 ? total : 1) * sizeof(double));
  int64_t at = 0;
  for (int64_t a = 0; a < m[0]->n; ++a)
    for (int64_t b = 0; b < m[1]->n; ++b)
      for (int64_t c = 0; c < m[2]->n; ++c)
        for (int64_t d = 0; d < m[3]->n; ++d)
          out[at++] =
              g[((m[0]->at[a] * s[1] + m[1]->at[b]) * s[2] + m[2]->at[c]) * s[3] + m[3]->at[d]];
  return out;
}

static tu_buf to_buf(attn_dtype dt, const double *v, int64_t n) {
  tu_buf b = tu_buf_new(dt, n);
  for (int64_t i = 0; i < n; ++i) tu_set(&b, i, v[i]);
  return b;
}

/* ---- one case ------------------------------------------------------------------------------ */

typedef struct dist_case {
  const char *name;
  attn_problem p;
  attn_dist_spec spec;
  int want_dsinks, want_dbias;
  int one_block_per_step; /* the ring's steps each run one block call (zigzag, merged chunks) */
} dist_case;

/* The global tensors of a problem, as doubles (rounded to the dtype), and the global results. */
typedef struct global_data {
  double *q, *k, *v, *dout, *bias, *mask, *alibi, *sinks, *qseg, *kseg;
  double *out, *lse, *dq, *dk, *dv, *dbias, *dsinks;
} global_data;

static double *fill(tu_rng *rng, attn_dtype dt, int64_t n, double lo, double hi) {
  double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
  tu_buf b = tu_buf_new(dt, n > 0 ? n : 1);
  tu_fill_uniform(&b, rng, lo, hi);
  for (int64_t i = 0; i < n; ++i) v[i] = tu_get(&b, i);
  tu_buf_free(&b);
  return v;
}

static int64_t bias_numel(const int64_t s[4]) { return s[0] * s[1] * s[2] * s[3]; }

/* Runs the global problem on this process alone: the oracle of the distributed run. */
static int run_global(const attn_problem *p, uint64_t seed, global_data *g) {
  tu_rng rng = tu_rng_make(seed);
  const attn_dtype dt = (attn_dtype)p->dtype,
                   st = dt == ATTN_DTYPE_F64 ? ATTN_DTYPE_F64 : ATTN_DTYPE_F32;
  const int64_t B = p->batch, Tq = p->seqlen_q, Tk = p->seqlen_k, Hq = p->heads_q,
                Hkv = p->heads_kv;
  const int64_t D = p->head_dim, Dv = p->head_dim_v ? p->head_dim_v : D;
  memset(g, 0, sizeof *g);
  g->q = fill(&rng, dt, B * Tq * Hq * D, -1, 1);
  g->k = fill(&rng, dt, B * Tk * Hkv * D, -1, 1);
  g->v = fill(&rng, dt, B * Tk * Hkv * Dv, -1, 1);
  g->dout = fill(&rng, dt, B * Tq * Hq * Dv, -1, 1);
  if (p->has_bias)
    g->bias = fill(&rng, (attn_dtype)p->bias_dtype, bias_numel(p->bias_shape), -1, 1);
  if (p->has_mask) {
    g->mask = fill(&rng, ATTN_DTYPE_F64, bias_numel(p->mask_shape), 0, 1);
    for (int64_t i = 0; i < bias_numel(p->mask_shape); ++i) g->mask[i] = g->mask[i] < 0.8;
  }
  if (p->alibi) g->alibi = fill(&rng, st, p->alibi == ATTN_ALIBI_PER_HEAD ? Hq : B * Hq, 0.05, 0.5);
  if (p->num_sinks) g->sinks = fill(&rng, st, (p->sinks_shared ? 1 : Hq) * p->num_sinks, -1, 1);
  if (p->has_segment_ids) {
    /* Two segments per sequence and a padded tail, at positions that cut across the shards. */
    g->qseg = malloc((size_t)(B * Tq) * sizeof(double));
    g->kseg = malloc((size_t)(B * Tk) * sizeof(double));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < Tq; ++i)
        g->qseg[b * Tq + i] = i < Tq / 3 + b ? 0 : i < Tq - 1 ? 1 : -1;
      for (int64_t j = 0; j < Tk; ++j)
        g->kseg[b * Tk + j] = j < Tk / 3 + b ? 0 : j < Tk - 2 ? 1 : -1;
    }
  }
  tu_buf q = to_buf(dt, g->q, B * Tq * Hq * D), k = to_buf(dt, g->k, B * Tk * Hkv * D);
  tu_buf v = to_buf(dt, g->v, B * Tk * Hkv * Dv), dout = to_buf(dt, g->dout, B * Tq * Hq * Dv);
  tu_buf bias = {0}, mask = {0}, alibi = {0}, sinks = {0}, qseg = {0}, kseg = {0};
  tu_buf out = tu_buf_new(dt, B * Tq * Hq * Dv), lse = tu_buf_new(st, B * Hq * Tq);
  tu_buf dq = tu_buf_new(dt, B * Tq * Hq * D), dk = tu_buf_new(dt, B * Tk * Hkv * D);
  tu_buf dv = tu_buf_new(dt, B * Tk * Hkv * Dv);
  tu_args x;
  tu_args_bufs(&x, &q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv);
  x.in.dropout_seed = 0x1234567890abcdefull;
  int32_t *seqlens = NULL;
  if (p->varlen == ATTN_VARLEN_PADDED) {
    seqlens = malloc(2 * (size_t)B * sizeof *seqlens);
    for (int64_t b = 0; b < B; ++b)
      seqlens[b] = (int32_t)(Tq - b % 3), seqlens[B + b] = (int32_t)(Tk - 2 * (b % 2));
    x.in.seqlens_q = seqlens, x.in.seqlens_k = seqlens + B;
  }
  if (p->has_bias)
    bias = to_buf((attn_dtype)p->bias_dtype, g->bias, bias_numel(p->bias_shape)),
    x.in.bias = tu_tensor(&bias);
  if (p->has_mask)
    mask = to_buf(ATTN_DTYPE_U8, g->mask, bias_numel(p->mask_shape)), x.in.mask = tu_tensor(&mask);
  if (p->alibi)
    alibi = to_buf(st, g->alibi, p->alibi == ATTN_ALIBI_PER_HEAD ? Hq : B * Hq),
    x.in.alibi_slopes = tu_tensor(&alibi);
  if (p->num_sinks)
    sinks = to_buf(st, g->sinks, (p->sinks_shared ? 1 : Hq) * p->num_sinks),
    x.in.sinks = tu_tensor(&sinks);
  if (p->has_segment_ids) {
    qseg = to_buf(ATTN_DTYPE_I32, g->qseg, B * Tq), kseg = to_buf(ATTN_DTYPE_I32, g->kseg, B * Tk);
    x.in.q_segment_ids = tu_tensor(&qseg), x.in.kv_segment_ids = tu_tensor(&kseg);
  }
  tu_buf dbias =
      p->has_bias ? tu_buf_new((attn_dtype)p->bias_dtype, bias_numel(p->bias_shape)) : (tu_buf){0};
  tu_buf dsinks =
      p->num_sinks ? tu_buf_new(st, (p->sinks_shared ? 1 : Hq) * p->num_sinks) : (tu_buf){0};
  if (p->has_bias) x.grads.dbias = tu_tensor(&dbias);
  if (p->num_sinks) x.grads.dsinks = tu_tensor(&dsinks);
  int ok = attn_forward(ctx, p, &x.in, &x.out) == ATTN_STATUS_OK &&
           attn_backward(ctx, p, &x.in, &x.out, &x.dout, &x.grads) == ATTN_STATUS_OK;
  if (!ok)
    fprintf(stderr, "rank %d: global run failed: %s\n", world_rank, attn_ctx_last_error(ctx));
  tu_buf *outs[] = {&out, &lse, &dq, &dk, &dv, &dbias, &dsinks};
  double **dst[] = {&g->out, &g->lse, &g->dq, &g->dk, &g->dv, &g->dbias, &g->dsinks};
  for (int i = 0; i < 7; ++i) {
    if (outs[i]->n == 0) continue;
    *dst[i] = malloc((size_t)outs[i]->n * sizeof(double));
    for (int64_t e = 0; e < outs[i]->n; ++e) (*dst[i])[e] = tu_get(outs[i], e);
  }
  tu_buf *all[] = {&q,    &k,   &v,   &dout, &bias, &mask, &alibi, &sinks, &qseg,
                   &kseg, &out, &lse, &dq,   &dk,   &dv,   &dbias, &dsinks};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
    if (all[i]->data != NULL) tu_buf_free(all[i]);
  return ok;
}

static void free_global(global_data *g) {
  double *all[] = {g->q,    g->k,   g->v,   g->dout, g->bias, g->mask, g->alibi, g->sinks, g->qseg,
                   g->kseg, g->out, g->lse, g->dq,   g->dk,   g->dv,   g->dbias, g->dsinks};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) free(all[i]);
}

/* max |a - r| <= tol * max(1, max |r|) over n values. */
static void compare(const char *what, const char *name, const tu_buf *a, const double *r, int64_t n,
                    double tol) {
  double err = 0, scale = 1;
  int64_t where = -1;
  for (int64_t i = 0; i < n; ++i) {
    const double x = tu_get(a, i);
    if (fabs(r[i]) > scale && isfinite(r[i])) scale = fabs(r[i]);
    double e = (isinf(r[i]) || isinf(x)) ? (x == r[i] ? 0 : INFINITY) : fabs(x - r[i]);
    if (isnan(x)) e = INFINITY;
    if (e > err) err = e, where = i;
  }
  tu_check(err <= tol * scale, "rank %d %s: %s max error %.3g at %lld (tolerance %.3g)", world_rank,
           name, what, err, (long long)where, tol * scale);
}

static void run_case(const dist_case *c, uint64_t seed) {
  const attn_problem *p = &c->p;
  global_data g;
  if (!run_global(p, seed, &g)) {
    tu_check(0, "rank %d %s: global run", world_rank, c->name);
    free_global(&g);
    return;
  }
  attn_dist_plan *plan = NULL;
  MPI_Comm comm = MPI_COMM_WORLD;
  attn_status st =
      attn_dist_plan_create(ctx, p, &c->spec, ATTN_DIST_TRANSPORT_MPI, &comm, NULL, &plan);
  tu_check(st == ATTN_STATUS_OK, "rank %d %s: plan: %s", world_rank, c->name,
           attn_ctx_last_error(ctx));
  if (st != ATTN_STATUS_OK) {
    free_global(&g);
    return;
  }
  attn_problem l;
  int32_t coords[ATTN_DIST_MAX_AXES];
  attn_dist_plan_local_problem(plan, &l, coords);
  int32_t nb = 1, nh = 1, ns = 1, cb = 0, ch = 0, cs = 0;
  for (int a = 0; a < c->spec.num_axes; ++a) {
    int32_t n = c->spec.axis_size[a] ? c->spec.axis_size[a] : world_size;
    if (c->spec.axis_dim[a] == ATTN_DIST_DIM_BATCH) nb = n, cb = coords[a];
    if (c->spec.axis_dim[a] == ATTN_DIST_DIM_HEADS) nh = n, ch = coords[a];
    if (c->spec.axis_dim[a] == ATTN_DIST_DIM_SEQUENCE) ns *= n, cs = cs * n + coords[a];
  }
  const attn_dtype dt = (attn_dtype)p->dtype,
                   sd = dt == ATTN_DTYPE_F64 ? ATTN_DTYPE_F64 : ATTN_DTYPE_F32;
  const int64_t B = p->batch, Tq = p->seqlen_q, Tk = p->seqlen_k, Hq = p->heads_q,
                Hkv = p->heads_kv;
  const int64_t D = p->head_dim, Dv = p->head_dim_v ? p->head_dim_v : D, group = Hq / Hkv;
  imap mb = map_range(cb * (B / nb), B / nb), mhq = map_range(ch * (Hq / nh), Hq / nh);
  imap mhk = map_range(ch * (Hkv / nh), Hkv / nh);
  imap mtq = map_plan(plan, ns, Tq), mtk = map_plan(plan, ns, Tk);
  { /* one sequence axis: the plan's places are the public layout's */
    imap check = map_layout(c->spec.layout, ns, Tq, cs);
    int same = 1;
    for (int64_t i = 0; i < check.n; ++i) same &= check.at[i] == mtq.at[i];
    int seq_axes = 0;
    for (int a = 0; a < c->spec.num_axes; ++a)
      seq_axes += c->spec.axis_dim[a] == ATTN_DIST_DIM_SEQUENCE;
    if (seq_axes < 2)
      tu_check(same, "rank %d %s: attn_dist_plan_position = attn_dist_layout_position", world_rank,
               c->name);
    free(check.at);
  }
  imap md = map_range(0, D), mdv = map_range(0, Dv), m1 = map_range(0, 1), mTk = map_range(0, Tk);
  (void)group;
  const int64_t sq[4] = {B, Tq, Hq, D}, sk[4] = {B, Tk, Hkv, D}, sv[4] = {B, Tk, Hkv, Dv};
  const int64_t so[4] = {B, Tq, Hq, Dv}, sl[4] = {B, Hq, Tq, 1};
  const imap *mq[4] = {&mb, &mtq, &mhq, &md}, *mk[4] = {&mb, &mtk, &mhk, &md};
  const imap *mv[4] = {&mb, &mtk, &mhk, &mdv}, *mo[4] = {&mb, &mtq, &mhq, &mdv};
  const imap *ml[4] = {&mb, &mhq, &mtq, &m1};
  double *lq = gather4(g.q, sq, mq), *lk = gather4(g.k, sk, mk), *lv = gather4(g.v, sv, mv);
  double *ldout = gather4(g.dout, so, mo), *lout = gather4(g.out, so, mo),
         *llse = gather4(g.lse, sl, ml);
  double *ldq = gather4(g.dq, sq, mq), *ldk = gather4(g.dk, sk, mk), *ldv = gather4(g.dv, sv, mv);
  const int64_t nq = mb.n * mtq.n * mhq.n * D, nk = mb.n * mtk.n * mhk.n * D,
                nv = mb.n * mtk.n * mhk.n * Dv;
  const int64_t no = mb.n * mtq.n * mhq.n * Dv, nl = mb.n * mhq.n * mtq.n;
  tu_buf q = to_buf(dt, lq, nq), k = to_buf(dt, lk, nk), v = to_buf(dt, lv, nv),
         dout = to_buf(dt, ldout, no);
  tu_buf out = tu_buf_new(dt, no), lse = tu_buf_new(sd, nl);
  tu_buf dq = tu_buf_new(dt, nq), dk = tu_buf_new(dt, nk), dv = tu_buf_new(dt, nv);
  tu_args x;
  tu_args_bufs(&x, &q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv);
  x.in.dropout_seed = 0x1234567890abcdefull;
  /* Padded varlen: the lengths of the local batch entries. */
  int32_t *lens = NULL;
  if (p->varlen == ATTN_VARLEN_PADDED) {
    lens = malloc(2 * (size_t)mb.n * sizeof *lens);
    for (int64_t b = 0; b < mb.n; ++b) {
      const int64_t gb = mb.at[b];
      lens[b] = (int32_t)(Tq - gb % 3), lens[mb.n + b] = (int32_t)(Tk - 2 * (gb % 2));
    }
    x.in.seqlens_q = lens, x.in.seqlens_k = lens + mb.n;
  }
  tu_buf bias = {0}, mask = {0}, alibi = {0}, sinks = {0}, qseg = {0}, kseg = {0}, dbias = {0},
         dsinks = {0};
  double *lbias = NULL, *ldbias = NULL, *ldsinks = NULL;
  int64_t nbias = 0, nsinks = 0;
  /* bias and mask: batch and head dims sliced when full, rows in the layout, all Tk columns. */
  const imap *mbias[4], *mmask[4];
  if (p->has_bias || p->has_mask) {
    const int64_t *shapes[2] = {p->bias_shape, p->mask_shape};
    const imap **maps[2] = {mbias, mmask};
    for (int t = 0; t < 2; ++t) {
      const int64_t *s = shapes[t];
      maps[t][0] = s[0] == B && s[0] != 1 ? &mb : &m1;
      maps[t][1] = s[1] == Hq && s[1] != 1 ? &mhq : s[1] == Hkv && s[1] != 1 ? &mhk : &m1;
      maps[t][2] = s[2] == Tq && s[2] != 1 ? &mtq : &m1;
      maps[t][3] = s[3] == Tk && s[3] != 1 ? &mTk : &m1;
    }
  }
  if (p->has_bias) {
    lbias = gather4(g.bias, p->bias_shape, mbias);
    nbias = mbias[0]->n * mbias[1]->n * mbias[2]->n * mbias[3]->n;
    bias = to_buf((attn_dtype)p->bias_dtype, lbias, nbias);
    x.in.bias = tu_tensor(&bias);
    if (c->want_dbias)
      ldbias = gather4(g.dbias, p->bias_shape, mbias),
      dbias = tu_buf_new((attn_dtype)p->bias_dtype, nbias);
  }
  if (p->has_mask) {
    double *lm = gather4(g.mask, p->mask_shape, mmask);
    mask = to_buf(ATTN_DTYPE_U8, lm, mmask[0]->n * mmask[1]->n * mmask[2]->n * mmask[3]->n);
    x.in.mask = tu_tensor(&mask);
    free(lm);
  }
  if (p->alibi) {
    const int64_t sa[4] = {p->alibi == ATTN_ALIBI_PER_HEAD ? 1 : B, Hq, 1, 1};
    const imap *ma[4] = {p->alibi == ATTN_ALIBI_PER_HEAD ? &m1 : &mb, &mhq, &m1, &m1};
    double *la = gather4(g.alibi, sa, ma);
    alibi = to_buf(sd, la, ma[0]->n * mhq.n);
    x.in.alibi_slopes = tu_tensor(&alibi);
    free(la);
  }
  if (p->num_sinks) {
    imap ms = map_range(0, p->num_sinks);
    const int64_t ss[4] = {p->sinks_shared ? 1 : Hq, p->num_sinks, 1, 1};
    const imap *msk[4] = {p->sinks_shared ? &m1 : &mhq, &ms, &m1, &m1};
    double *ls = gather4(g.sinks, ss, msk);
    nsinks = msk[0]->n * p->num_sinks;
    sinks = to_buf(sd, ls, nsinks);
    x.in.sinks = tu_tensor(&sinks);
    if (c->want_dsinks) ldsinks = gather4(g.dsinks, ss, msk), dsinks = tu_buf_new(sd, nsinks);
    free(ls);
    free(ms.at);
  }
  if (p->has_segment_ids) {
    const int64_t s1[4] = {B, Tq, 1, 1}, s2[4] = {B, Tk, 1, 1};
    const imap *m1q[4] = {&mb, &mtq, &m1, &m1}, *m1k[4] = {&mb, &mtk, &m1, &m1};
    double *a = gather4(g.qseg, s1, m1q), *b = gather4(g.kseg, s2, m1k);
    qseg = to_buf(ATTN_DTYPE_I32, a, mb.n * mtq.n), kseg = to_buf(ATTN_DTYPE_I32, b, mb.n * mtk.n);
    x.in.q_segment_ids = tu_tensor(&qseg), x.in.kv_segment_ids = tu_tensor(&kseg);
    free(a);
    free(b);
  }
  st = attn_dist_plan_forward(plan, &x.in, &x.out);
  tu_check(st == ATTN_STATUS_OK, "rank %d %s: forward: %s", world_rank, c->name,
           attn_ctx_last_error(ctx));
  if (c->one_block_per_step) {
    attn_dist_stats stats;
    attn_dist_plan_last_stats(plan, &stats);
    tu_check(stats.steps > 1 && stats.blocks == stats.steps,
             "rank %d %s: one block call per ring step (%d blocks, %d steps)", world_rank, c->name,
             (int)stats.blocks, (int)stats.steps);
  }
  /* f32: SPEC.md's tolerance; bf16: both sides round P before P V and their results once, in
   * different places (the ring's blocks keep their partial results in f32), so a bf16 case gets
   * the low-precision allowance. */
  const double tol = dt == ATTN_DTYPE_F32 ? 1e-4 : dt == ATTN_DTYPE_F64 ? 1e-10 : 2e-2;
  if (st == ATTN_STATUS_OK) {
    compare("out", c->name, &out, lout, no, tol);
    compare("lse", c->name, &lse, llse, nl, tol);
  }
  if (ldbias) x.grads.dbias = tu_tensor(&dbias);
  if (ldsinks) x.grads.dsinks = tu_tensor(&dsinks);
  st = attn_dist_plan_backward(plan, &x.in, &x.out, &x.dout, &x.grads);
  tu_check(st == ATTN_STATUS_OK, "rank %d %s: backward: %s", world_rank, c->name,
           attn_ctx_last_error(ctx));
  if (st == ATTN_STATUS_OK) {
    compare("dq", c->name, &dq, ldq, nq, 3 * tol);
    compare("dk", c->name, &dk, ldk, nk, 3 * tol);
    compare("dv", c->name, &dv, ldv, nv, 3 * tol);
    if (ldbias) compare("dbias", c->name, &dbias, ldbias, nbias, 3 * tol);
    if (ldsinks) compare("dsinks", c->name, &dsinks, ldsinks, nsinks, 3 * tol);
  }
  attn_dist_plan_destroy(plan);
  free(lens);
  tu_buf *bufs[] = {&q,    &k,     &v,      &dout, &bias, &mask, &alibi, &sinks, &qseg,
                    &kseg, &dbias, &dsinks, &out,  &lse,  &dq,   &dk,    &dv};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i)
    if (bufs[i]->data != NULL) tu_buf_free(bufs[i]);
  double *locals[] = {lq, lk, lv, ldout, lout, llse, ldq, ldk, ldv, lbias, ldbias, ldsinks};
  for (size_t i = 0; i < sizeof locals / sizeof locals[0]; ++i) free(locals[i]);
  imap *maps[] = {&mb, &mhq, &mhk, &mtq, &mtk, &md, &mdv, &m1, &mTk};
  for (size_t i = 0; i < sizeof maps / sizeof maps[0]; ++i) free(maps[i]->at);
  free_global(&g);
}

/* ---- the grid ------------------------------------------------------------------------------ */

/* A base problem every rank count divides: B, Hkv multiples of the ranks, T a multiple of 2n. */
static attn_problem base_problem(int32_t n) {
  attn_problem p;
  attn_problem_init(&p);
  p.batch = n;
  p.heads_kv = n;
  p.heads_q = 2 * n; /* GQA: groups of 2 */
  p.head_dim = 5;
  p.head_dim_v = 7;                /* Dv != D */
  p.seqlen_q = p.seqlen_k = 8 * n; /* 4 zigzag chunks per rank, 2 on a 2 x 2 mesh */
  return p;
}

enum {
  F_CAUSAL = 1,
  F_WINDOW = 2,
  F_ALIBI = 4,
  F_BIAS = 8,
  F_MASK = 16,
  F_SINKS = 32,
  F_SEGMENTS = 64,
  F_SOFTCAP = 128,
  F_DROPOUT = 256,
  F_TOPLEFT = 512,
  F_CROSS = 1024,
  F_SHARED_SINKS = 2048,
  F_BIAS_BCAST = 4096,
  F_BIAS_ROWS = 8192,
  F_PADDED = 16384,
  F_BIAS_HEADS = 32768
};

static attn_problem with_features(attn_problem p, int f) {
  if (f & F_CROSS) p.seqlen_q = p.seqlen_k / 2; /* Tq != Tk: the alignments differ */
  if (f & F_CAUSAL) p.causal = 1;
  if (f & F_TOPLEFT) p.align = ATTN_ALIGN_TOP_LEFT;
  if (f & F_WINDOW) p.window_left = 3, p.window_right = 2;
  if (f & F_ALIBI) p.alibi = ATTN_ALIBI_PER_BATCH_HEAD;
  if (f & F_BIAS) {
    p.has_bias = 1;
    p.bias_shape[0] = p.batch, p.bias_shape[1] = p.heads_kv;
    p.bias_shape[2] = p.seqlen_q, p.bias_shape[3] = p.seqlen_k;
  }
  if (f & F_BIAS_BCAST) {
    p.has_bias = 1;
    p.bias_shape[0] = 1, p.bias_shape[1] = p.heads_q, p.bias_shape[2] = p.seqlen_q,
    p.bias_shape[3] = p.seqlen_k;
  }
  if (f & F_BIAS_ROWS) { /* one row for every query, per head: summed over rows and ranks */
    p.has_bias = 1;
    p.bias_shape[0] = 1, p.bias_shape[1] = p.heads_q, p.bias_shape[2] = 1,
    p.bias_shape[3] = p.seqlen_k;
  }
  if (f & F_BIAS_HEADS) { /* every row and key, shared by the heads: summed over them */
    p.has_bias = 1;
    p.bias_shape[0] = p.batch, p.bias_shape[1] = 1, p.bias_shape[2] = p.seqlen_q,
    p.bias_shape[3] = p.seqlen_k;
  }
  if (f & F_MASK) {
    p.has_mask = 1;
    p.mask_shape[0] = p.batch, p.mask_shape[1] = 1, p.mask_shape[2] = p.seqlen_q,
    p.mask_shape[3] = p.seqlen_k;
  }
  if (f & (F_SINKS | F_SHARED_SINKS)) p.num_sinks = 2, p.sinks_shared = (f & F_SHARED_SINKS) != 0;
  if (f & F_SEGMENTS) p.has_segment_ids = 1;
  if (f & F_SOFTCAP) p.softcap = 2.0;
  if (f & F_DROPOUT) p.dropout_p = 0.3;
  if (f & F_PADDED) p.varlen = ATTN_VARLEN_PADDED;
  return p;
}

static const struct {
  const char *name;
  int features;
} feature_sets[] = {
    {"plain", 0},
    {"causal", F_CAUSAL},
    {"causal-cross", F_CAUSAL | F_CROSS},
    {"causal-topleft-cross", F_CAUSAL | F_TOPLEFT | F_CROSS},
    {"window", F_WINDOW},
    {"causal-window", F_CAUSAL | F_WINDOW},
    {"alibi", F_ALIBI | F_CAUSAL},
    {"bias", F_BIAS},
    {"bias-broadcast", F_BIAS_BCAST},
    {"bias-rows", F_BIAS_ROWS | F_CAUSAL},
    {"bias-heads", F_BIAS_HEADS | F_WINDOW},
    {"mask", F_MASK},
    {"sinks", F_SINKS},
    {"shared-sinks", F_SHARED_SINKS | F_CAUSAL},
    {"segments", F_SEGMENTS | F_CAUSAL},
    {"softcap", F_SOFTCAP},
    {"dropout", F_DROPOUT},
    {"dropout-causal", F_DROPOUT | F_CAUSAL},
    {"padded", F_PADDED | F_CAUSAL | F_DROPOUT},
    {"everything",
     F_CAUSAL | F_ALIBI | F_BIAS | F_MASK | F_SINKS | F_SEGMENTS | F_SOFTCAP | F_DROPOUT},
};

static attn_dist_spec spec_1d(int dim, int layout) {
  attn_dist_spec s;
  attn_dist_spec_init(&s);
  s.axis_dim[0] = dim;
  s.layout = layout;
  return s;
}

static void grid(uint64_t seed) {
  const int32_t n = world_size;
  struct {
    const char *name;
    attn_dist_spec spec;
  } meshes[16];
  int nm = 0;
  meshes[nm].name = "seq-contiguous",
  meshes[nm].spec = spec_1d(ATTN_DIST_DIM_SEQUENCE, ATTN_DIST_LAYOUT_CONTIGUOUS);
  meshes[nm++].spec.strategy = ATTN_DIST_STRATEGY_RING;
  meshes[nm].name = "seq-zigzag",
  meshes[nm].spec = spec_1d(ATTN_DIST_DIM_SEQUENCE, ATTN_DIST_LAYOUT_ZIGZAG);
  meshes[nm++].spec.strategy = ATTN_DIST_STRATEGY_RING;
  meshes[nm].name = "seq-alltoall",
  meshes[nm].spec = spec_1d(ATTN_DIST_DIM_SEQUENCE, ATTN_DIST_LAYOUT_CONTIGUOUS);
  meshes[nm++].spec.strategy = ATTN_DIST_STRATEGY_ALL_TO_ALL;
  meshes[nm].name = "seq-alltoall-zigzag",
  meshes[nm].spec = spec_1d(ATTN_DIST_DIM_SEQUENCE, ATTN_DIST_LAYOUT_ZIGZAG);
  meshes[nm++].spec.strategy = ATTN_DIST_STRATEGY_ALL_TO_ALL;
  meshes[nm].name = "batch", meshes[nm++].spec = spec_1d(ATTN_DIST_DIM_BATCH, 0);
  meshes[nm].name = "heads", meshes[nm++].spec = spec_1d(ATTN_DIST_DIM_HEADS, 0);
  if (n == 4) {
    attn_dist_spec s;
    attn_dist_spec_init(&s);
    s.num_axes = 2, s.axis_size[0] = 2, s.axis_size[1] = 2;
    s.axis_dim[0] = ATTN_DIST_DIM_BATCH, s.axis_dim[1] = ATTN_DIST_DIM_SEQUENCE;
    s.layout = ATTN_DIST_LAYOUT_ZIGZAG;
    s.strategy = ATTN_DIST_STRATEGY_RING;
    meshes[nm].name = "batch2xseq2-zigzag", meshes[nm++].spec = s;
    s.axis_dim[0] = ATTN_DIST_DIM_HEADS;
    s.layout = ATTN_DIST_LAYOUT_CONTIGUOUS;
    meshes[nm].name = "heads2xseq2", meshes[nm++].spec = s;
    s.axis_dim[0] = ATTN_DIST_DIM_NONE;
    meshes[nm].name = "replica2xseq2", meshes[nm++].spec = s;
    s.axis_dim[0] = ATTN_DIST_DIM_HEADS;
    s.strategy = ATTN_DIST_STRATEGY_ALL_TO_ALL;
    s.layout = ATTN_DIST_LAYOUT_ZIGZAG;
    meshes[nm].name = "heads2xseq2-alltoall-zigzag", meshes[nm++].spec = s;
    /* Both sequence axes: the ring over the outer, the all-to-all within each pair. */
    s.axis_dim[0] = ATTN_DIST_DIM_SEQUENCE;
    s.strategy = ATTN_DIST_STRATEGY_AUTO;
    s.layout = ATTN_DIST_LAYOUT_CONTIGUOUS;
    meshes[nm].name = "ring2xalltoall2", meshes[nm++].spec = s;
    s.layout = ATTN_DIST_LAYOUT_ZIGZAG;
    meshes[nm].name = "ring2xalltoall2-zigzag", meshes[nm++].spec = s;
  }
  for (int m = 0; m < nm; ++m)
    for (size_t f = 0; f < sizeof feature_sets / sizeof feature_sets[0]; ++f) {
      const int feat = feature_sets[f].features;
      if ((feat & F_CROSS) && meshes[m].spec.layout == ATTN_DIST_LAYOUT_ZIGZAG) continue;
      /* Padded varlen under a split sequence runs the all-to-all (the ring refuses it: checked
       * below); batch and heads run it. */
      int seq_split = 0;
      for (int a = 0; a < meshes[m].spec.num_axes; ++a)
        seq_split |= meshes[m].spec.axis_dim[a] == ATTN_DIST_DIM_SEQUENCE &&
                     meshes[m].spec.axis_size[a] != 1;
      if ((feat & F_PADDED) && seq_split &&
          meshes[m].spec.strategy != ATTN_DIST_STRATEGY_ALL_TO_ALL)
        continue;
      dist_case c;
      memset(&c, 0, sizeof c);
      char name[160];
      snprintf(name, sizeof name, "%s/%s", meshes[m].name, feature_sets[f].name);
      c.name = name;
      c.p = with_features(base_problem(n), feat);
      c.spec = meshes[m].spec;
      c.want_dsinks = c.p.num_sinks > 0;
      c.want_dbias = c.p.has_bias;
      /* The zigzag ring runs each step as one call unless a window hides a step from some
       * rank or a bias or mask over keys keeps key chunks apart. */
      c.one_block_per_step = strcmp(meshes[m].name, "seq-zigzag") == 0 &&
                             !(feat & (F_WINDOW | F_BIAS | F_BIAS_BCAST | F_BIAS_ROWS |
                                       F_BIAS_HEADS | F_MASK));
      run_case(&c, seed + f);
    }
  /* Zigzag chunks of 37 positions, which cross the cpu's tiles and start at global positions
   * that are not multiples of 4 (dropout's scalar rule): every step one call, its query and key
   * chunks in pieces; causal (both chunks of a step merged), with a window, ALiBi and dropout,
   * in f32 and bf16. */
  static const struct {
    const char *name;
    int features;
    attn_dtype dt;
  } longs[] = {
      {"seq-zigzag/chunks37-causal-dropout-alibi", F_CAUSAL | F_DROPOUT | F_ALIBI, ATTN_DTYPE_F32},
      {"seq-zigzag/chunks37-causal-window-softcap", F_CAUSAL | F_SOFTCAP, ATTN_DTYPE_F32},
      {"seq-zigzag/chunks37-bf16-causal-dropout", F_CAUSAL | F_DROPOUT, ATTN_DTYPE_BF16}};
  for (size_t i = 0; i < sizeof longs / sizeof longs[0]; ++i) {
    dist_case c;
    memset(&c, 0, sizeof c);
    c.name = longs[i].name;
    c.p = with_features(base_problem(n), longs[i].features);
    c.p.seqlen_q = c.p.seqlen_k = 2 * n * 37;
    c.p.dtype = longs[i].dt;
    if (i == 1) c.p.window_left = 50; /* a step of rank r sees chunks up to 2 back */
    c.spec = spec_1d(ATTN_DIST_DIM_SEQUENCE, ATTN_DIST_LAYOUT_ZIGZAG);
    c.spec.strategy = ATTN_DIST_STRATEGY_RING;
    c.one_block_per_step = i != 1; /* a window hides some steps of some ranks */
    run_case(&c, seed + 200 + i);
  }
  /* One low-precision case per sharding of the sequence. */
  dist_case c;
  memset(&c, 0, sizeof c);
  c.name = "seq-zigzag/bf16-causal-dropout";
  c.p = with_features(base_problem(n), F_CAUSAL | F_DROPOUT | F_SINKS);
  c.p.dtype = ATTN_DTYPE_BF16;
  c.spec = spec_1d(ATTN_DIST_DIM_SEQUENCE, ATTN_DIST_LAYOUT_ZIGZAG);
  c.want_dsinks = 1;
  run_case(&c, seed + 100);
}

/* ---- refusals ------------------------------------------------------------------------------ */

static void refusals(void) {
  MPI_Comm comm = MPI_COMM_WORLD;
  attn_dist_plan *plan = NULL;
  attn_problem p = base_problem(world_size);
  attn_dist_spec spec = spec_1d(ATTN_DIST_DIM_SEQUENCE, ATTN_DIST_LAYOUT_CONTIGUOUS);

  /* The last rank describes another problem: every rank is told which field and which rank. */
  attn_problem odd = p;
  if (world_rank == world_size - 1) odd.head_dim = 4;
  attn_status st =
      attn_dist_plan_create(ctx, &odd, &spec, ATTN_DIST_TRANSPORT_MPI, &comm, NULL, &plan);
  char want[64];
  snprintf(want, sizeof want, "rank(s) %d", world_size - 1);
  tu_check(st == ATTN_STATUS_INVALID_ARGUMENT &&
               strstr(attn_ctx_last_error(ctx), "problem.head_dim") &&
               strstr(attn_ctx_last_error(ctx), want),
           "rank %d: disagreeing ranks refused (%s)", world_rank, attn_ctx_last_error(ctx));
  attn_dist_plan_destroy(plan);

  /* One rank's problem is invalid on its own: every rank fails, none waits. */
  odd = p;
  if (world_rank == 1) odd.head_dim = 0;
  st = attn_dist_plan_create(ctx, &odd, &spec, ATTN_DIST_TRANSPORT_MPI, &comm, NULL, &plan);
  tu_check(st == ATTN_STATUS_INVALID_ARGUMENT &&
               (world_rank == 1 || strstr(attn_ctx_last_error(ctx), "rank 1")),
           "rank %d: one rank's invalid problem fails every rank (%s)", world_rank,
           attn_ctx_last_error(ctx));

  /* Sizes that do not divide, with the rule. */
  odd = p;
  odd.seqlen_q = odd.seqlen_k = 2 * world_size + 1;
  st = attn_dist_plan_create(ctx, &odd, &spec, ATTN_DIST_TRANSPORT_MPI, &comm, NULL, &plan);
  tu_check(st == ATTN_STATUS_INVALID_ARGUMENT && strstr(attn_ctx_last_error(ctx), "multiples of"),
           "rank %d: seqlen not dividing refused (%s)", world_rank, attn_ctx_last_error(ctx));
  odd = p;
  odd.heads_kv = world_size + 1, odd.heads_q = 2 * (world_size + 1);
  attn_dist_spec hs = spec_1d(ATTN_DIST_DIM_HEADS, 0);
  st = attn_dist_plan_create(ctx, &odd, &hs, ATTN_DIST_TRANSPORT_MPI, &comm, NULL, &plan);
  tu_check(st == ATTN_STATUS_INVALID_ARGUMENT &&
               strstr(attn_ctx_last_error(ctx), "whole KV groups"),
           "rank %d: heads_kv not dividing refused (%s)", world_rank, attn_ctx_last_error(ctx));
  attn_dist_spec bad = spec;
  bad.num_axes = 2, bad.axis_size[0] = world_size, bad.axis_size[1] = 2;
  bad.axis_dim[1] = ATTN_DIST_DIM_BATCH;
  st = attn_dist_plan_create(ctx, &p, &bad, ATTN_DIST_TRANSPORT_MPI, &comm, NULL, &plan);
  tu_check(st == ATTN_STATUS_INVALID_ARGUMENT && strstr(attn_ctx_last_error(ctx), "communicator"),
           "rank %d: mesh of the wrong size refused (%s)", world_rank, attn_ctx_last_error(ctx));

  /* What the layer cannot run is UNSUPPORTED with the reason, on every rank. */
  odd = p;
  odd.varlen = ATTN_VARLEN_PADDED;
  attn_dist_spec ring = spec;
  ring.strategy = ATTN_DIST_STRATEGY_RING;
  st = attn_dist_plan_create(ctx, &odd, &ring, ATTN_DIST_TRANSPORT_MPI, &comm, NULL, &plan);
  tu_check(st == ATTN_STATUS_UNSUPPORTED && strstr(attn_ctx_last_error(ctx), "varlen=padded") &&
               strstr(attn_ctx_last_error(ctx), "all-to-all"),
           "rank %d: padded varlen on the ring refused (%s)", world_rank,
           attn_ctx_last_error(ctx));
  odd = p; /* the ring and the all-to-all move dense k and v, not a pool of pages */
  odd.page_size = 4;
  st = attn_dist_plan_create(ctx, &odd, &spec, ATTN_DIST_TRANSPORT_MPI, &comm, NULL, &plan);
  tu_check(st == ATTN_STATUS_UNSUPPORTED && strstr(attn_ctx_last_error(ctx), "page_size=4"),
           "rank %d: a paged KV cache under a split sequence refused (%s)", world_rank,
           attn_ctx_last_error(ctx));
  attn_dist_spec a2a = spec;
  a2a.strategy = ATTN_DIST_STRATEGY_ALL_TO_ALL;
  odd = p;
  odd.heads_kv = 1, odd.heads_q = 2;
  st = attn_dist_plan_create(ctx, &odd, &a2a, ATTN_DIST_TRANSPORT_MPI, &comm, NULL, &plan);
  tu_check(st == ATTN_STATUS_INVALID_ARGUMENT && strstr(attn_ctx_last_error(ctx), "all-to-all"),
           "rank %d: all-to-all with fewer KV heads than ranks refused (%s)", world_rank,
           attn_ctx_last_error(ctx));

  /* Outputs whose strides overlap (rows of out on one another) are refused by every rank before
   * anything moves: the ring writes the shards from several threads. */
  st = attn_dist_plan_create(ctx, &p, &spec, ATTN_DIST_TRANSPORT_MPI, &comm, NULL, &plan);
  tu_check(st == ATTN_STATUS_OK, "rank %d: plan for the overlap check: %s", world_rank,
           attn_ctx_last_error(ctx));
  if (st == ATTN_STATUS_OK) {
    const int64_t Tl = p.seqlen_q / world_size;
    tu_buf q = tu_buf_new(ATTN_DTYPE_F32, p.batch * Tl * p.heads_q * p.head_dim);
    tu_buf k = tu_buf_new(ATTN_DTYPE_F32, p.batch * Tl * p.heads_kv * p.head_dim);
    tu_buf v = tu_buf_new(ATTN_DTYPE_F32, p.batch * Tl * p.heads_kv * p.head_dim_v);
    tu_buf out = tu_buf_new(ATTN_DTYPE_F32, p.batch * Tl * p.heads_q * p.head_dim_v);
    tu_args x;
    tu_args_bufs(&x, &q, &k, &v, &out, NULL, NULL, NULL, NULL, NULL);
    const int64_t overlapping[4] = {p.heads_q * p.head_dim_v, 0, p.head_dim_v, 1};
    memcpy(x.out.out.stride, overlapping, sizeof overlapping);
    st = attn_dist_plan_forward(plan, &x.in, &x.out);
    tu_check(st == ATTN_STATUS_INVALID_ARGUMENT && strstr(attn_ctx_last_error(ctx), "out"),
             "rank %d: an output whose rows overlap is refused (%s)", world_rank,
             attn_ctx_last_error(ctx));
    tu_buf_free(&q), tu_buf_free(&k), tu_buf_free(&v), tu_buf_free(&out);
  }
  attn_dist_plan_destroy(plan);
  plan = NULL;

  /* A peer that never joins the run: rank 0 gets IO_ERROR after the timeout, not a hang. */
  spec.timeout_seconds = 1.0;
  st = attn_dist_plan_create(ctx, &p, &spec, ATTN_DIST_TRANSPORT_MPI, &comm, NULL, &plan);
  tu_check(st == ATTN_STATUS_OK, "rank %d: plan for the timeout check: %s", world_rank,
           attn_ctx_last_error(ctx));
  if (st == ATTN_STATUS_OK && world_rank == 0) {
    const int64_t nq = p.batch * p.seqlen_q / world_size * p.heads_q * p.head_dim;
    const int64_t nk = p.batch * p.seqlen_k / world_size * p.heads_kv * p.head_dim;
    const int64_t nv = p.batch * p.seqlen_k / world_size * p.heads_kv * p.head_dim_v;
    const int64_t no = p.batch * p.seqlen_q / world_size * p.heads_q * p.head_dim_v;
    tu_buf q = tu_buf_new(ATTN_DTYPE_F32, nq), k = tu_buf_new(ATTN_DTYPE_F32, nk);
    tu_buf v = tu_buf_new(ATTN_DTYPE_F32, nv), out = tu_buf_new(ATTN_DTYPE_F32, no);
    tu_args x;
    tu_args_bufs(&x, &q, &k, &v, &out, NULL, NULL, NULL, NULL, NULL);
    st = attn_dist_plan_forward(plan, &x.in, &x.out);
    tu_check(st == ATTN_STATUS_IO_ERROR && strstr(attn_ctx_last_error(ctx), "within"),
             "rank 0: a peer that does not join gives IO_ERROR (%s)", attn_ctx_last_error(ctx));
    st = attn_dist_plan_forward(plan, &x.in, &x.out);
    tu_check(st == ATTN_STATUS_IO_ERROR, "rank 0: a broken plan refuses further runs (%s)",
             attn_ctx_last_error(ctx));
    tu_buf_free(&q), tu_buf_free(&k), tu_buf_free(&v), tu_buf_free(&out);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  attn_dist_plan_destroy(plan);
}

/* Strategy AUTO: measured once (both strategies, every rank), cached under a key that holds the
 * mesh, found again by a context that does not measure; a context with no cache takes the ring. */
static void auto_strategy(uint64_t seed) {
  char path[256];
  long id = world_rank == 0 ? (long)seed % 1000000 : 0;
  MPI_Bcast(&id, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  snprintf(path, sizeof path, "/tmp/attn-dist-test-cache-%ld.txt", id);
  attn_ctx *tuning = NULL, *reading = NULL, *plain = NULL;
  attn_ctx_create(&tuning), attn_ctx_create(&reading), attn_ctx_create(&plain);
  attn_ctx *all[3] = {tuning, reading, plain};
  for (int i = 0; i < 3; ++i) {
    attn_ctx_set_num_threads(all[i], 1);
    attn_policy pol;
    attn_ctx_get_policy(all[i], &pol);
    pol.on_miss = i == 0 ? ATTN_ON_MISS_AUTOTUNE : ATTN_ON_MISS_HEURISTICS;
    pol.cache_path = i == 2 ? "" : path;
    pol.tune_backward = 1;
    attn_ctx_set_policy(all[i], &pol);
  }
  attn_problem p = with_features(base_problem(world_size), F_CAUSAL);
  attn_dist_spec spec = spec_1d(ATTN_DIST_DIM_SEQUENCE, ATTN_DIST_LAYOUT_ZIGZAG);
  MPI_Comm comm = MPI_COMM_WORLD;
  attn_dist_plan *plans[3] = {NULL, NULL, NULL};
  int32_t chosen[3] = {-1, -1, -1};
  for (int i = 0; i < 3; ++i) {
    attn_status st =
        attn_dist_plan_create(all[i], &p, &spec, ATTN_DIST_TRANSPORT_MPI, &comm, NULL, &plans[i]);
    tu_check(st == ATTN_STATUS_OK, "rank %d: auto strategy plan %d: %s", world_rank, i,
             attn_ctx_last_error(all[i]));
    chosen[i] = attn_dist_plan_strategy(plans[i]);
    attn_dist_plan_destroy(plans[i]);
  }
  int64_t mem = 0, disk = 0;
  attn_cache_count(tuning, &mem, &disk);
  tu_check(chosen[0] == ATTN_DIST_STRATEGY_RING || chosen[0] == ATTN_DIST_STRATEGY_ALL_TO_ALL,
           "rank %d: autotuned strategy %d", world_rank, (int)chosen[0]);
  tu_check(mem >= 1 && disk >= 1,
           "rank %d: the measured strategy is cached (memory %lld, file %lld)", world_rank,
           (long long)mem, (long long)disk);
  tu_check(chosen[1] == chosen[0],
           "rank %d: a context reading the cache file takes the measured "
           "strategy (%d, measured %d)",
           world_rank, (int)chosen[1], (int)chosen[0]);
  tu_check(chosen[2] == ATTN_DIST_STRATEGY_RING, "rank %d: no cache, no measuring: the ring (%d)",
           world_rank, (int)chosen[2]);
  for (int i = 0; i < 3; ++i) attn_ctx_destroy(all[i]);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank == 0) {
    remove(path);
    char lock[300];
    snprintf(lock, sizeof lock, "%s.lock", path);
    remove(lock);
  }
}

/* The ring ends early when a window hides the rest: causal with 2 keys of left window, contiguous
 * chunks of 8: every query sees its own chunk and the last keys of the previous one, so 2 steps
 * run whatever the ranks; the stats of the run say so. */
/* Packed varlen (THD) under a batch split (each rank its own sequences, cu_seqlens from 0, and
 * a local total that differs per rank) and a head split (every sequence, some heads): causal and
 * dropout, against the single-process packed problem. */
static void packed(int dim, int layout, uint64_t seed) {
  const int64_t B = world_size, Hkv = world_size, Hq = 2 * world_size, D = 5, Dv = 7;
  const int by_seq = dim == ATTN_DIST_DIM_SEQUENCE;
  /* a split sequence cuts every sequence into whole chunks: 2n of them, for either layout */
  const int64_t n2 = 2 * world_size;
  int32_t cq[64], ck[64];
  cq[0] = ck[0] = 0;
  int64_t max_q = 0, max_k = 0;
  for (int64_t b = 0; b < B; ++b) {
    /* (a split sequence: sequence 0 has no queries, so a rank holds an empty one) */
    const int64_t lq = by_seq ? n2 * (b % 3) : 5 + 3 * b, lk = by_seq ? n2 * (2 + b) : 7 + 2 * b;
    cq[b + 1] = cq[b] + (int32_t)lq, ck[b + 1] = ck[b] + (int32_t)lk;
    max_q = lq > max_q ? lq : max_q, max_k = lk > max_k ? lk : max_k;
  }
  attn_problem p;
  attn_problem_init(&p);
  p.batch = B, p.heads_q = Hq, p.heads_kv = Hkv, p.head_dim = D, p.head_dim_v = Dv;
  p.seqlen_q = max_q, p.seqlen_k = max_k, p.causal = 1, p.dropout_p = 0.2;
  p.varlen = ATTN_VARLEN_PACKED, p.total_q = cq[B], p.total_k = ck[B];
  const int64_t Tq = cq[B], Tk = ck[B];
  tu_rng rng = tu_rng_make(seed);
  tu_buf q = tu_buf_new(ATTN_DTYPE_F32, Tq * Hq * D), k = tu_buf_new(ATTN_DTYPE_F32, Tk * Hkv * D);
  tu_buf v = tu_buf_new(ATTN_DTYPE_F32, Tk * Hkv * Dv),
         dout = tu_buf_new(ATTN_DTYPE_F32, Tq * Hq * Dv);
  tu_fill_uniform(&q, &rng, -1, 1), tu_fill_uniform(&k, &rng, -1, 1);
  tu_fill_uniform(&v, &rng, -1, 1), tu_fill_uniform(&dout, &rng, -1, 1);
  tu_buf out = tu_buf_new(ATTN_DTYPE_F32, Tq * Hq * Dv), lse = tu_buf_new(ATTN_DTYPE_F32, Hq * Tq);
  tu_buf dq = tu_buf_new(ATTN_DTYPE_F32, Tq * Hq * D),
         dk = tu_buf_new(ATTN_DTYPE_F32, Tk * Hkv * D);
  tu_buf dv = tu_buf_new(ATTN_DTYPE_F32, Tk * Hkv * Dv);
  tu_args x;
  tu_args_bufs(&x, &q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv);
  x.in.cu_seqlens_q = cq, x.in.cu_seqlens_k = ck, x.in.dropout_seed = 77;
  int ok = attn_forward(ctx, &p, &x.in, &x.out) == ATTN_STATUS_OK &&
           attn_backward(ctx, &p, &x.in, &x.out, &x.dout, &x.grads) == ATTN_STATUS_OK;
  tu_check(ok, "rank %d packed: global run: %s", world_rank, attn_ctx_last_error(ctx));
  /* This rank's slice: its sequences' rows (batch split), its heads (head split), or its chunks
   * of every sequence in the layout (sequence split). */
  const int by_batch = dim == ATTN_DIST_DIM_BATCH;
  const int64_t b0 = by_batch ? world_rank : 0, nb = by_batch ? 1 : B;
  imap rq = map_range(cq[b0], cq[b0 + nb] - cq[b0]), rk = map_range(ck[b0], ck[b0 + nb] - ck[b0]);
  imap hq = by_batch || by_seq ? map_range(0, Hq) : map_range(world_rank * 2, 2);
  imap hk = by_batch || by_seq ? map_range(0, Hkv) : map_range(world_rank, 1);
  int32_t lcq[64], lck[64];
  for (int64_t b = 0; b <= nb; ++b) lcq[b] = cq[b0 + b] - cq[b0], lck[b] = ck[b0 + b] - ck[b0];
  if (by_seq) {
    imap *maps[2] = {&rq, &rk};
    const int32_t *cus[2] = {cq, ck};
    int32_t *lcus[2] = {lcq, lck};
    for (int t = 0; t < 2; ++t) {
      imap *m = maps[t];
      m->n = 0;
      for (int64_t b = 0; b < B; ++b) {
        const int64_t len = cus[t][b + 1] - cus[t][b];
        lcus[t][b] = (int32_t)m->n;
        for (int64_t u = 0; u < len / world_size; ++u)
          m->at[m->n++] = cus[t][b] + attn_dist_layout_position(layout, world_size, len,
                                                                  world_rank, u);
      }
      lcus[t][B] = (int32_t)m->n;
    }
  }
  imap m1 = map_range(0, 1), md = map_range(0, D), mdv = map_range(0, Dv);
  double *gq = malloc((size_t)q.n * sizeof(double)), *gk = malloc((size_t)k.n * sizeof(double));
  double *gv = malloc((size_t)v.n * sizeof(double)), *gd = malloc((size_t)dout.n * sizeof(double));
  double *go = malloc((size_t)out.n * sizeof(double)), *gl = malloc((size_t)lse.n * sizeof(double));
  double *gdq = malloc((size_t)dq.n * sizeof(double)), *gdk = malloc((size_t)dk.n * sizeof(double));
  double *gdv = malloc((size_t)dv.n * sizeof(double));
  const tu_buf *src[] = {&q, &k, &v, &dout, &out, &lse, &dq, &dk, &dv};
  double *dst[] = {gq, gk, gv, gd, go, gl, gdq, gdk, gdv};
  for (int i = 0; i < 9; ++i)
    for (int64_t e = 0; e < src[i]->n; ++e) dst[i][e] = tu_get(src[i], e);
  const int64_t sq[4] = {1, Tq, Hq, D}, sk[4] = {1, Tk, Hkv, D}, sv[4] = {1, Tk, Hkv, Dv};
  const int64_t so[4] = {1, Tq, Hq, Dv}, sl[4] = {1, Hq, Tq, 1};
  const imap *mq[4] = {&m1, &rq, &hq, &md}, *mk[4] = {&m1, &rk, &hk, &md};
  const imap *mv[4] = {&m1, &rk, &hk, &mdv}, *mo[4] = {&m1, &rq, &hq, &mdv};
  const imap *ml[4] = {&m1, &hq, &rq, &m1};
  double *lq = gather4(gq, sq, mq), *lk = gather4(gk, sk, mk), *lv = gather4(gv, sv, mv);
  double *ld = gather4(gd, so, mo), *lo = gather4(go, so, mo), *ll = gather4(gl, sl, ml);
  double *ldq = gather4(gdq, sq, mq), *ldk = gather4(gdk, sk, mk), *ldv = gather4(gdv, sv, mv);
  const int64_t nq = rq.n * hq.n * D, nk = rk.n * hk.n * D, nv = rk.n * hk.n * Dv;
  const int64_t no = rq.n * hq.n * Dv, nl = hq.n * rq.n;
  tu_buf xq = to_buf(ATTN_DTYPE_F32, lq, nq), xk = to_buf(ATTN_DTYPE_F32, lk, nk);
  tu_buf xv = to_buf(ATTN_DTYPE_F32, lv, nv), xd = to_buf(ATTN_DTYPE_F32, ld, no);
  tu_buf xo = tu_buf_new(ATTN_DTYPE_F32, no), xl = tu_buf_new(ATTN_DTYPE_F32, nl);
  tu_buf xdq = tu_buf_new(ATTN_DTYPE_F32, nq), xdk = tu_buf_new(ATTN_DTYPE_F32, nk);
  tu_buf xdv = tu_buf_new(ATTN_DTYPE_F32, nv);
  attn_dist_spec spec = spec_1d(dim, layout);
  MPI_Comm comm = MPI_COMM_WORLD;
  attn_dist_plan *plan = NULL;
  attn_status st;
  if (by_seq) { /* the ring cannot run it, and says so; AUTO takes the all-to-all */
    spec.strategy = ATTN_DIST_STRATEGY_RING;
    st = attn_dist_plan_create(ctx, &p, &spec, ATTN_DIST_TRANSPORT_MPI, &comm, NULL, &plan);
    tu_check(st == ATTN_STATUS_UNSUPPORTED && strstr(attn_ctx_last_error(ctx), "all-to-all"),
             "rank %d packed/sequence: the ring refuses it with the reason (%s)", world_rank,
             attn_ctx_last_error(ctx));
    spec.strategy = ATTN_DIST_STRATEGY_AUTO;
  }
  st = attn_dist_plan_create(ctx, &p, &spec, ATTN_DIST_TRANSPORT_MPI, &comm, NULL, &plan);
  const char *name = by_batch ? "packed/batch"
                     : !by_seq ? "packed/heads"
                     : layout == ATTN_DIST_LAYOUT_ZIGZAG ? "packed/sequence zigzag"
                                                          : "packed/sequence contiguous";
  if (st == ATTN_STATUS_OK && by_seq)
    tu_check(attn_dist_plan_strategy(plan) == ATTN_DIST_STRATEGY_ALL_TO_ALL,
             "rank %d %s: AUTO takes the all-to-all", world_rank, name);
  tu_check(st == ATTN_STATUS_OK, "rank %d %s: plan: %s", world_rank, name,
           attn_ctx_last_error(ctx));
  if (st == ATTN_STATUS_OK) {
    tu_args lx;
    tu_args_bufs(&lx, &xq, &xk, &xv, &xo, &xl, &xd, &xdq, &xdk, &xdv);
    lx.in.cu_seqlens_q = lcq, lx.in.cu_seqlens_k = lck, lx.in.dropout_seed = 77;
    st = attn_dist_plan_forward(plan, &lx.in, &lx.out);
    if (st == ATTN_STATUS_OK)
      st = attn_dist_plan_backward(plan, &lx.in, &lx.out, &lx.dout, &lx.grads);
    tu_check(st == ATTN_STATUS_OK, "rank %d %s: runs: %s", world_rank, name,
             attn_ctx_last_error(ctx));
    if (st == ATTN_STATUS_OK) {
      compare("out", name, &xo, lo, no, 1e-4), compare("lse", name, &xl, ll, nl, 1e-4);
      compare("dq", name, &xdq, ldq, nq, 3e-4), compare("dk", name, &xdk, ldk, nk, 3e-4);
      compare("dv", name, &xdv, ldv, nv, 3e-4);
    }
  }
  attn_dist_plan_destroy(plan);
  tu_buf *bufs[] = {&q,  &k,  &v,  &dout, &out, &lse, &dq,  &dk,  &dv,
                    &xq, &xk, &xv, &xd,   &xo,  &xl,  &xdq, &xdk, &xdv};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i) tu_buf_free(bufs[i]);
  double *arrays[] = {gq, gk, gv, gd, go, gl, gdq, gdk, gdv, lq, lk, lv, ld, lo, ll, ldq, ldk, ldv};
  for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; ++i) free(arrays[i]);
  imap *maps[] = {&rq, &rk, &hq, &hk, &m1, &md, &mdv};
  for (size_t i = 0; i < sizeof maps / sizeof maps[0]; ++i) free(maps[i]->at);
}

static void early_end(void) {
  attn_problem p = with_features(base_problem(world_size), F_CAUSAL);
  p.window_left = 2;
  attn_dist_spec spec = spec_1d(ATTN_DIST_DIM_SEQUENCE, ATTN_DIST_LAYOUT_CONTIGUOUS);
  spec.strategy = ATTN_DIST_STRATEGY_RING;
  MPI_Comm comm = MPI_COMM_WORLD;
  attn_dist_plan *plan = NULL;
  attn_status st =
      attn_dist_plan_create(ctx, &p, &spec, ATTN_DIST_TRANSPORT_MPI, &comm, NULL, &plan);
  tu_check(st == ATTN_STATUS_OK, "rank %d: early-end plan: %s", world_rank,
           attn_ctx_last_error(ctx));
  if (st != ATTN_STATUS_OK) return;
  attn_problem l;
  attn_dist_plan_local_problem(plan, &l, NULL);
  tu_buf q = tu_buf_new(ATTN_DTYPE_F32, l.batch * l.seqlen_q * l.heads_q * l.head_dim);
  tu_buf k = tu_buf_new(ATTN_DTYPE_F32, l.batch * l.seqlen_k * l.heads_kv * l.head_dim);
  tu_buf v = tu_buf_new(ATTN_DTYPE_F32, l.batch * l.seqlen_k * l.heads_kv * l.head_dim_v);
  tu_buf out = tu_buf_new(ATTN_DTYPE_F32, l.batch * l.seqlen_q * l.heads_q * l.head_dim_v);
  tu_args x;
  tu_args_bufs(&x, &q, &k, &v, &out, NULL, NULL, NULL, NULL, NULL);
  st = attn_dist_plan_forward(plan, &x.in, &x.out);
  attn_dist_stats stats;
  attn_dist_plan_last_stats(plan, &stats);
  tu_check(st == ATTN_STATUS_OK && stats.steps == 2 && stats.bytes_sent > 0 &&
               stats.total_seconds > 0,
           "rank %d: a window ends the ring after 2 of %d steps (%d steps, %lld bytes)", world_rank,
           world_size, (int)stats.steps, (long long)stats.bytes_sent);
  tu_buf_free(&q), tu_buf_free(&k), tu_buf_free(&v), tu_buf_free(&out);
  attn_dist_plan_destroy(plan);
}

static void helpers(void) {
  /* Zigzag over 2 ranks of 8: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2. */
  const int64_t want[8] = {0, 1, 6, 7, 2, 3, 4, 5};
  int ok = 1;
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 4; ++i)
      ok &= attn_dist_layout_position(ATTN_DIST_LAYOUT_ZIGZAG, 2, 8, r, i) == want[r * 4 + i];
  tu_check(ok, "zigzag positions");
  int32_t src[2 * 8], mid[2 * 8], back[2 * 8];
  for (int i = 0; i < 16; ++i) src[i] = i;
  ok = attn_dist_permute_sequence(ATTN_DIST_LAYOUT_ZIGZAG, 2, 1, src, mid, 2, 8, sizeof(int32_t)) ==
           ATTN_STATUS_OK &&
       attn_dist_permute_sequence(ATTN_DIST_LAYOUT_ZIGZAG, 2, 0, mid, back, 2, 8,
                                  sizeof(int32_t)) == ATTN_STATUS_OK;
  for (int i = 0; i < 8; ++i) ok &= mid[8 + i] == 8 + want[i];
  for (int i = 0; i < 16; ++i) ok &= back[i] == src[i];
  tu_check(ok, "permute into the zigzag layout and back");
  tu_check(attn_dist_permute_sequence(ATTN_DIST_LAYOUT_ZIGZAG, 3, 1, src, mid, 1, 8, 4) ==
               ATTN_STATUS_INVALID_ARGUMENT,
           "permute refuses a length that does not divide");
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  uint64_t seed = 0;
  if (world_rank == 0) seed = tu_seed("test_dist_mpi");
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  attn_ctx_create(&ctx);
  attn_ctx_set_num_threads(ctx, 1); /* oversubscribed: one thread per rank */
  attn_policy policy; /* no cache file: the grid's AUTO plans must not depend on the machine's */
  attn_ctx_get_policy(ctx, &policy);
  policy.cache_path = "";
  attn_ctx_set_policy(ctx, &policy);
  char why[512];
  if (!attn_dist_transport_available(ATTN_DIST_TRANSPORT_MPI, why, sizeof why)) {
    if (world_rank == 0) fprintf(stderr, "MPI transport not available: %s\n", why);
    tu_check(0, "MPI transport loads");
  } else {
    helpers();
    auto_strategy(seed);
    early_end();
    packed(ATTN_DIST_DIM_BATCH, 0, seed + 200);
    packed(ATTN_DIST_DIM_HEADS, 0, seed + 201);
    packed(ATTN_DIST_DIM_SEQUENCE, ATTN_DIST_LAYOUT_CONTIGUOUS, seed + 202);
    packed(ATTN_DIST_DIM_SEQUENCE, ATTN_DIST_LAYOUT_ZIGZAG, seed + 203);
    grid(seed);
    refusals();
  }
  attn_ctx_destroy(ctx);
  int failures = tu_failures(), total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  int code = tu_finish();
  MPI_Finalize();
  return total > 0 ? 1 : code;
}
