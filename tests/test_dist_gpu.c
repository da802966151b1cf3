/*
 * tests/test_dist_gpu.c - distributed attention of CUDA tensors against the whole problem on one
 * GPU with the same implementation: batch and head splits, the ring over a split sequence
 * (contiguous and zigzag, causal with both alignments and not, GQA, odd lengths, Tq != Tk, soft
 * cap, a window that hides whole chunks inside a step's call), a 2-D mesh (batch or heads x
 * sequence), forward and backward, on n = 2, 3 and 4 ranks; the blocks a step runs (a zigzag step
 * is one call, stats.blocks; ATTN_DIST_RING_BLOCKS=pairs one per pair of chunks, still exact); and
 * the features whose blocks run placed at their global positions (masks cut where no plan of a
 * block's shape is, Tq != Tk, ALiBi, dropout with its global Philox counters) and the sinks, with
 * dsinks, boolean masks and segment ids (padded rows), a bias with dbias (full, and broadcast
 * over batch and heads), under sequence, batch and head splits; the all-to-all (contiguous and
 * zigzag, alone and beside a head split) with those features and broadcast biases' dbias, AUTO
 * measuring both, two sequence axes (the all-to-all around the ring); and the refusal of what the
 * GPU does not run (ring dropout on key chunks not a multiple of 4).
 *
 * The ranks are threads of this process. On one GPU they talk through the loopback transport
 * (tests/dist_gpu/transport_loopback.c: cudaMemcpyAsync between the threads' buffers, host
 * barriers), the NCCL transport's stand-in, since NCCL refuses two ranks on one GPU; the library's
 * code is the same, only the transport differs. With two GPUs and the NCCL module (ATTN_TEST_NCCL)
 * the same cases run again over NCCL, one thread per GPU.
 *
 * Needs no CUDA header: device memory and streams go through the modules' services (core/gpu.h,
 * dist/device.h), so CI compiles it everywhere; without a GPU module, a GPU or the loopback module
 * it exits 77 (skipped). Seed printed; ATTN_TEST_SEED overrides it; ATTN_TEST_FILTER=text runs
 * only the cases whose name holds text.
 */
#define _POSIX_C_SOURCE 200112L /* setenv */
#include "attn.h"
#include "attn_dist.h"
#include "core/gpu.h"
#include "dist/transport.h"
#include "dist_gpu/loopback.h"
#include "module/module.h"
#include "testutil.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef ATTN_TEST_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER;
static const attn_gpu_ops *gpu;
static const attn_dist_device_ops *dev_ops;

#define MAX_RANKS 4

/* One case: the global problem, the mesh, and whether the plan must be refused (keyword in the
 * reason). */
typedef struct tcase {
  const char *name;
  int naxes, dims[2], sizes[2]; /* sizes[i] = 0: n / the other axis */
  int layout, strategy;
  int causal;
  int64_t B, Tq, Tk, Hq, Hkv, D;
  double softcap, dropout;
  const char *refused; /* NULL: must run */
  int align;
  int has_window;
  int64_t window_left;
  int64_t sinks; /* num_sinks */
  int pairs;     /* run under ATTN_DIST_RING_BLOCKS=pairs */
  int alibi;     /* ALiBi slopes per query head */
  int mask;      /* a boolean mask [B, 1, Tq, Tk], a fifth of it 0 */
  int segments;  /* segment ids: two segments a sequence, and padding (-1) at the ends */
  int bias;      /* BIAS_*: none, or a bias of that shape, with dbias */
  int tune;      /* strategy AUTO measured (the ring against the all-to-all), memory cache only */
  int want_a2a;  /* the plan must have taken the all-to-all */
  /* packed varlen (THD): B sequences, sequence b of Tq (b + 1) query and Tk (b + 1) key rows */
  int packed;
  int padded; /* padded varlen: batch entry b holds Tq - 3b - 1 query and Tk - 2b key rows */
} tcase;

/* The biases of the cases: full [B, Hq, Tq, Tk] f32; [1, 1, Tq, Tk] bf16 (dbias summed over batch
 * and heads); [B, 1, 1, Tk] f32, broadcast over the rows, [B, 1, Tq, 1] f32, over the keys, and
 * [B, Hq, 1, Tk] f32, per head over the rows (the device ring sums their blocks' shares of dbias,
 * the all-to-all the ranks' shares). */
enum { BIAS_NONE, BIAS_FULL, BIAS_ROWS_KEYS, BIAS_KEYS, BIAS_ROWS, BIAS_HEADS_KEYS };

/* The global data and the single-device results, on the host: q, k, v, dout and the optional
 * ALiBi slopes [Hq] and sinks [Hq, S] (f32; empty when the case has none), with dsinks. */
typedef struct global {
  attn_problem p;
  tu_buf q, k, v, dout, out, lse, dq, dk, dv;
  tu_buf alibi, sinks, dsinks;
  tu_buf mask, qseg, kseg; /* u8 [B, 1, Tq, Tk], i32 [B, Tq] and [B, Tk] */
  tu_buf bias, dbias;      /* of p.bias_shape, p.bias_dtype */
  int32_t cq[9], ck[9];    /* packed: the global cu_seqlens; padded: the seqlens */
} global;

/* Dropout's Philox key: the same on one device and on every rank. */
#define DROPOUT_SEED 0x5eed2026ull

/* The slopes or sinks of query heads [h0, h0 + heads) (per = values a head), uploaded; NULL when
 * the case has none. */
static void *upload_heads(int device, const tu_buf *all, int64_t h0, int64_t heads, int64_t per);

/* The inputs and results beyond tu_args_dense's: dropout's seed, the slopes, the sinks, dsinks,
 * the mask and the segment ids (NULL: none). */
static void add_features(tu_args *x, const attn_problem *p, void *alibi, void *sinks, void *dsinks,
                         void *const mask_seg[3], void *const bias_dbias[2]) {
  x->in.dropout_seed = DROPOUT_SEED;
  if (bias_dbias[0] != NULL) x->in.bias = attn_tensor_dense(bias_dbias[0]);
  if (bias_dbias[1] != NULL) x->grads.dbias = attn_tensor_dense(bias_dbias[1]);
  if (alibi != NULL) x->in.alibi_slopes = attn_tensor_dense(alibi);
  if (sinks != NULL) x->in.sinks = attn_tensor_dense(sinks);
  if (dsinks != NULL && p->num_sinks > 0) x->grads.dsinks = attn_tensor_dense(dsinks);
  if (mask_seg[0] != NULL) x->in.mask = attn_tensor_dense(mask_seg[0]);
  if (mask_seg[1] != NULL) {
    x->in.q_segment_ids = attn_tensor_dense(mask_seg[1]);
    x->in.kv_segment_ids = attn_tensor_dense(mask_seg[2]);
  }
}

/* Uploads a buffer, or gives NULL for an empty one. */
static void *upload_some(int device, const tu_buf *b);

typedef struct rank_job {
  const tcase *c;
  const global *g;
  int n, rank, device;
  int32_t transport;
  void *comm;
} rank_job;

static void *upload(const tu_buf *b) {
  void *d = NULL;
  char why[256];
  const size_t bytes = (size_t)b->n * attn_dtype_size(b->dtype);
  if (gpu->alloc(0, bytes + 256, &d, why, sizeof why) != ATTN_STATUS_OK) {
    printf("FATAL device allocation: %s\n", why);
    exit(1);
  }
  if (bytes > 0 && gpu->upload(0, d, b->data, bytes, why, sizeof why) != ATTN_STATUS_OK) {
    printf("FATAL upload: %s\n", why);
    exit(1);
  }
  return d;
}

static void *upload_on(int device, const tu_buf *b) {
  void *d = NULL;
  char why[256];
  const size_t bytes = (size_t)b->n * attn_dtype_size(b->dtype);
  if (gpu->alloc(device, bytes + 256, &d, why, sizeof why) != ATTN_STATUS_OK ||
      (bytes > 0 && gpu->upload(device, d, b->data, bytes, why, sizeof why) != ATTN_STATUS_OK)) {
    printf("FATAL device buffer on GPU %d: %s\n", device, why);
    exit(1);
  }
  return d;
}

static tu_buf fetch(int device, const void *d, attn_dtype dt, int64_t n) {
  tu_buf b = tu_buf_new(dt, n);
  char why[256];
  if (n > 0 && gpu->download(device, b.data, d, (size_t)n * attn_dtype_size(dt), why, sizeof why) !=
                   ATTN_STATUS_OK) {
    printf("FATAL download: %s\n", why);
    exit(1);
  }
  return b;
}

/* A new buffer of n NaNs of dtype dt: a result's starting value, which no unwritten element can
 * pass for a right one. */
static void *upload_nan(int device, attn_dtype dt, int64_t n) {
  tu_buf nan = tu_buf_new(dt, n);
  for (int64_t i = 0; i < n; ++i) tu_set(&nan, i, NAN);
  void *d = upload_on(device, &nan);
  tu_buf_free(&nan);
  return d;
}

/* The query then the key lengths (n i32 each: cu_seqlens, n = B + 1, or seqlens, n = B) in one
 * device buffer. */
static void *upload_lengths(int device, const int32_t *q, const int32_t *k, int64_t n) {
  tu_buf both = tu_buf_new(ATTN_DTYPE_I32, 2 * n);
  for (int64_t i = 0; i < n; ++i) tu_set(&both, i, q[i]), tu_set(&both, n + i, k[i]);
  void *d = upload_on(device, &both);
  tu_buf_free(&both);
  return d;
}

static void *upload_some(int device, const tu_buf *b) {
  return b->n > 0 ? upload_on(device, b) : NULL;
}

static void *upload_heads(int device, const tu_buf *all, int64_t h0, int64_t heads, int64_t per) {
  if (all->n == 0) return NULL;
  tu_buf part = tu_buf_new(ATTN_DTYPE_F32, heads * per);
  for (int64_t i = 0; i < heads * per; ++i) tu_set(&part, i, tu_get(all, h0 * per + i));
  void *d = upload_on(device, &part);
  tu_buf_free(&part);
  return d;
}

static void compare(const rank_job *j, const char *what, const tu_buf *got, const tu_buf *want,
                    double tol) {
  double scale = 1;
  const double err = tu_max_error(got, want, &scale);
  pthread_mutex_lock(&report_lock);
  tu_check(err <= tol * scale, "%s n=%d %s rank %d %s: max error %.3g (tolerance %.3g)",
           j->transport == ATTN_DIST_TRANSPORT_NCCL ? "nccl" : "loopback", j->n, j->c->name,
           j->rank, what, err, tol * scale);
  pthread_mutex_unlock(&report_lock);
}

static void report(const rank_job *j, int ok, const char *what, const char *detail) {
  pthread_mutex_lock(&report_lock);
  tu_check(ok, "%s n=%d %s rank %d %s%s%s",
           j->transport == ATTN_DIST_TRANSPORT_NCCL ? "nccl" : "loopback", j->n, j->c->name,
           j->rank, what, detail[0] ? ": " : "", detail);
  pthread_mutex_unlock(&report_lock);
}

/* The strategy's log lines a plan creation wrote (choose.c): found in the cache, or measured. */
typedef struct log_seen {
  int hits, measured;
} log_seen;

static void watch_log(void *user, attn_log_level level, const char *message) {
  log_seen *seen = user;
  (void)level;
  if (strstr(message, "dist: cache hit: strategy") != NULL) ++seen->hits;
  if (strstr(message, "dist: autotuned:") != NULL) ++seen->measured;
}

/* One rank: its shard, the plan, forward and backward, and its slice of every result. */
static void *run_rank(void *arg) {
  const rank_job *j = arg;
  const tcase *c = j->c;
  const global *g = j->g;
#ifdef ATTN_TEST_NCCL
  if (j->transport == ATTN_DIST_TRANSPORT_NCCL) cudaSetDevice(j->device);
#endif
  attn_ctx *ctx;
  attn_ctx_create(&ctx);
  if (c->tune) {
    attn_policy pol;
    attn_ctx_get_policy(ctx, &pol);
    pol.on_miss = ATTN_ON_MISS_AUTOTUNE;
    pol.tune_backward = 1;
    pol.cache_path = ""; /* the memory cache only: nothing of the machine's is read or kept */
    attn_ctx_set_policy(ctx, &pol);
  }
  attn_problem p = g->p;
  p.device_index = j->device;
  attn_dist_spec spec;
  attn_dist_spec_init(&spec);
  spec.num_axes = c->naxes;
  for (int a = 0; a < c->naxes; ++a) {
    spec.axis_dim[a] = c->dims[a];
    spec.axis_size[a] = c->sizes[a];
  }
  spec.layout = c->layout, spec.strategy = c->strategy;
  spec.timeout_seconds = 120;
  attn_dist_plan *plan = NULL;
  attn_status st = attn_dist_plan_create(ctx, &p, &spec, j->transport, j->comm, NULL, &plan);
  if (c->refused != NULL) {
    const char *why = attn_ctx_last_error(ctx);
    report(j, st == ATTN_STATUS_UNSUPPORTED && strstr(why, c->refused) != NULL,
           "is refused with the reason", why);
    attn_dist_plan_destroy(plan);
    attn_ctx_destroy(ctx);
    return NULL;
  }
  report(j, st == ATTN_STATUS_OK, "plan", st == ATTN_STATUS_OK ? "" : attn_ctx_last_error(ctx));
  if (st != ATTN_STATUS_OK) {
    attn_ctx_destroy(ctx);
    return NULL;
  }
  if (c->want_a2a)
    report(j, attn_dist_plan_strategy(plan) == ATTN_DIST_STRATEGY_ALL_TO_ALL,
           "takes the all-to-all", "");
  if (c->tune) { /* measured on the GPU, cached: a second plan of the context finds it */
    log_seen seen = {0, 0};
    attn_ctx_set_log_callback(ctx, watch_log, &seen, ATTN_LOG_LEVEL_INFO);
    attn_dist_plan *again = NULL;
    const attn_status st2 =
        attn_dist_plan_create(ctx, &p, &spec, j->transport, j->comm, NULL, &again);
    attn_ctx_set_log_callback(ctx, NULL, NULL, ATTN_LOG_LEVEL_INFO);
    char detail[160];
    snprintf(detail, sizeof detail, "%s; strategies %d and %d; %d cache hits, %d measurings",
             st2 == ATTN_STATUS_OK ? "" : attn_ctx_last_error(ctx),
             (int)attn_dist_plan_strategy(plan), (int)attn_dist_plan_strategy(again), seen.hits,
             seen.measured);
    report(j,
           st2 == ATTN_STATUS_OK && seen.hits == 1 && seen.measured == 0 &&
               attn_dist_plan_strategy(again) == attn_dist_plan_strategy(plan),
           "AUTO: the measured strategy is cached and found again", detail);
    attn_dist_plan_destroy(again);
  }
  attn_problem l;
  int32_t coords[ATTN_DIST_MAX_AXES] = {0};
  attn_dist_plan_local_problem(plan, &l, coords);
  /* Index maps of the local shard: batch, query and key rows, query and KV heads. */
  int64_t b0 = 0, hq0 = 0, hk0 = 0;
  for (int a = 0; a < c->naxes; ++a) {
    if (c->dims[a] == ATTN_DIST_DIM_BATCH) b0 = coords[a] * l.batch;
    if (c->dims[a] == ATTN_DIST_DIM_HEADS)
      hq0 = coords[a] * l.heads_q, hk0 = coords[a] * l.heads_kv;
  }
  /* Packed: the rank's rows are its chunks of every sequence; its local cu_seqlens count them.
   * The shapes below then see one batch entry of total rows ([total, H, D], [H, total]). */
  int32_t lcq[9] = {0}, lck[9] = {0};
  int64_t *tqmap = NULL, *tkmap = NULL;
  if (c->packed) {
    const int32_t *cus[2] = {g->cq, g->ck};
    int32_t *lcus[2] = {lcq, lck};
    int64_t **maps[2] = {&tqmap, &tkmap};
    for (int t = 0; t < 2; ++t) {
      *maps[t] = malloc(sizeof(int64_t) * (size_t)(t == 0 ? l.total_q : l.total_k) + 1);
      int64_t m = 0;
      for (int64_t b = 0; b < p.batch; ++b) {
        const int64_t len = cus[t][b + 1] - cus[t][b];
        lcus[t][b] = (int32_t)m;
        for (int64_t i = 0; i < len / j->n; ++i)
          (*maps[t])[m++] =
              cus[t][b] + attn_dist_layout_position(c->layout, j->n, len, coords[0], i);
      }
      lcus[t][p.batch] = (int32_t)m;
    }
    p.batch = l.batch = 1;
    p.seqlen_q = p.total_q, p.seqlen_k = p.total_k;
    l.seqlen_q = l.total_q, l.seqlen_k = l.total_k;
  }
  int64_t *bmap = malloc(sizeof(int64_t) * (size_t)l.batch);
  int64_t *hqmap = malloc(sizeof(int64_t) * (size_t)l.heads_q);
  int64_t *hkmap = malloc(sizeof(int64_t) * (size_t)l.heads_kv);
  for (int64_t i = 0; i < l.batch; ++i) bmap[i] = b0 + i;
  if (!c->packed) {
    tqmap = malloc(sizeof(int64_t) * (size_t)l.seqlen_q);
    tkmap = malloc(sizeof(int64_t) * (size_t)l.seqlen_k);
    for (int64_t i = 0; i < l.seqlen_q; ++i)
      tqmap[i] = attn_dist_plan_position(plan, p.seqlen_q, i);
    for (int64_t i = 0; i < l.seqlen_k; ++i)
      tkmap[i] = attn_dist_plan_position(plan, p.seqlen_k, i);
  }
  for (int64_t i = 0; i < l.heads_q; ++i) hqmap[i] = hq0 + i;
  for (int64_t i = 0; i < l.heads_kv; ++i) hkmap[i] = hk0 + i;
  const int64_t D = p.head_dim;
  const int64_t gq[4] = {p.batch, p.seqlen_q, p.heads_q, D},
                lq[4] = {l.batch, l.seqlen_q, l.heads_q, D};
  const int64_t gk[4] = {p.batch, p.seqlen_k, p.heads_kv, D},
                lk[4] = {l.batch, l.seqlen_k, l.heads_kv, D};
  const int64_t gl[4] = {p.batch, p.heads_q, p.seqlen_q, 1},
                ll[4] = {l.batch, l.heads_q, l.seqlen_q, 1};
  const int64_t *const qmap[4] = {bmap, tqmap, hqmap, NULL}, *const kmap[4] = {bmap, tkmap, hkmap,
                                                                               NULL};
  const int64_t *const lmap[4] = {bmap, hqmap, tqmap, NULL};
  tu_buf q = tu_box4(&g->q, gq, NULL, lq, qmap), k = tu_box4(&g->k, gk, NULL, lk, kmap);
  tu_buf v = tu_box4(&g->v, gk, NULL, lk, kmap), dout = tu_box4(&g->dout, gq, NULL, lq, qmap);
  tu_buf want_out = tu_box4(&g->out, gq, NULL, lq, qmap),
         want_lse = tu_box4(&g->lse, gl, NULL, ll, lmap);
  tu_buf want_dq = tu_box4(&g->dq, gq, NULL, lq, qmap),
         want_dk = tu_box4(&g->dk, gk, NULL, lk, kmap);
  tu_buf want_dv = tu_box4(&g->dv, gk, NULL, lk, kmap);
  const int dv_ = j->device;
  void *dq_in = upload_on(dv_, &q), *dk_in = upload_on(dv_, &k), *dv_in = upload_on(dv_, &v);
  void *ddout = upload_on(dv_, &dout);
  void *dout_o = upload_on(dv_, &want_out), *dlse = upload_on(dv_, &want_lse);
  void *ddq = upload_on(dv_, &want_dq), *ddk = upload_on(dv_, &want_dk),
       *ddv = upload_on(dv_, &want_dv);
  /* Results start as garbage of the right size: the oracle's values would hide unwritten rows. */
  char why[512] = "";
  void *stream = NULL;
  if (dev_ops->stream_create(dv_, &stream, why, sizeof why) != ATTN_STATUS_OK) {
    printf("FATAL stream: %s\n", why);
    exit(1);
  }
  attn_dist_plan_set_stream(plan, stream);
  {
    tu_buf nan_o = tu_buf_new(want_out.dtype, want_out.n),
           nan_l = tu_buf_new(ATTN_DTYPE_F32, want_lse.n);
    for (int64_t i = 0; i < nan_o.n; ++i) tu_set(&nan_o, i, NAN);
    for (int64_t i = 0; i < nan_l.n; ++i) tu_set(&nan_l, i, NAN);
    gpu->upload(dv_, dout_o, nan_o.data, (size_t)nan_o.n * attn_dtype_size(nan_o.dtype), why,
                sizeof why);
    gpu->upload(dv_, dlse, nan_l.data, (size_t)nan_l.n * 4, why, sizeof why);
    gpu->upload(dv_, ddq, nan_o.data, (size_t)want_dq.n * attn_dtype_size(nan_o.dtype), why,
                sizeof why);
    /* dk and dv too: they held the oracle's values until now. */
    tu_buf nan_k = tu_buf_new(want_dk.dtype, want_dk.n);
    for (int64_t i = 0; i < nan_k.n; ++i) tu_set(&nan_k, i, NAN);
    gpu->upload(dv_, ddk, nan_k.data, (size_t)nan_k.n * attn_dtype_size(nan_k.dtype), why,
                sizeof why);
    gpu->upload(dv_, ddv, nan_k.data, (size_t)nan_k.n * attn_dtype_size(nan_k.dtype), why,
                sizeof why);
    tu_buf_free(&nan_k);
    tu_buf_free(&nan_o), tu_buf_free(&nan_l);
  }
  /* slopes and sinks of this rank's query heads; dsinks starts as NaN too */
  const int64_t S = p.num_sinks;
  void *dalibi = upload_heads(dv_, &g->alibi, hq0, l.heads_q, 1);
  void *dsinks_in = upload_heads(dv_, &g->sinks, hq0, l.heads_q, S);
  tu_buf want_dsinks = tu_buf_new(ATTN_DTYPE_F32, S > 0 ? l.heads_q * S : 0);
  for (int64_t i = 0; i < want_dsinks.n; ++i)
    tu_set(&want_dsinks, i, tu_get(&g->dsinks, hq0 * S + i));
  void *ddsinks = NULL;
  if (S > 0) {
    ddsinks = upload_nan(dv_, ATTN_DTYPE_F32, want_dsinks.n);
  }
  /* the mask's rows and the query segment ids are this rank's rows; the mask keeps every key
   * column, and the kv segment ids are this rank's keys (docs/DISTRIBUTED.md) */
  tu_buf lmask = {0}, lqseg = {0}, lkseg = {0};
  if (g->mask.n > 0) {
    const int64_t gm[4] = {p.batch, 1, p.seqlen_q, p.seqlen_k},
                  lm[4] = {l.batch, 1, l.seqlen_q, p.seqlen_k};
    const int64_t *const mmap[4] = {bmap, NULL, tqmap, NULL};
    lmask = tu_box4(&g->mask, gm, NULL, lm, mmap);
  }
  if (g->qseg.n > 0) {
    const int64_t gsq[4] = {p.batch, p.seqlen_q, 1, 1}, lsq[4] = {l.batch, l.seqlen_q, 1, 1};
    const int64_t gsk[4] = {p.batch, p.seqlen_k, 1, 1}, lsk[4] = {l.batch, l.seqlen_k, 1, 1};
    const int64_t *const sqmap[4] = {bmap, tqmap, NULL, NULL}, *const skmap[4] = {bmap, tkmap, NULL,
                                                                                  NULL};
    lqseg = tu_box4(&g->qseg, gsq, NULL, lsq, sqmap),
    lkseg = tu_box4(&g->kseg, gsk, NULL, lsk, skmap);
  }
  void *const dmask_seg[3] = {upload_some(dv_, &lmask), upload_some(dv_, &lqseg),
                              upload_some(dv_, &lkseg)};
  /* the bias: this rank's batch entries, heads and rows where it has them, every key column */
  tu_buf lbias = {0}, want_dbias = {0};
  void *dbias_in = NULL, *ddbias = NULL;
  if (g->bias.n > 0) {
    const int64_t *gb = p.bias_shape;
    const int64_t lb[4] = {gb[0] == 1 ? 1 : l.batch, gb[1] == 1 ? 1 : l.heads_q,
                           gb[2] == 1 ? 1 : l.seqlen_q, gb[3]};
    const int64_t *const bm[4] = {gb[0] == 1 ? NULL : bmap, gb[1] == 1 ? NULL : hqmap,
                                  gb[2] == 1 ? NULL : tqmap, NULL};
    lbias = tu_box4(&g->bias, gb, NULL, lb, bm), want_dbias = tu_box4(&g->dbias, gb, NULL, lb, bm);
    dbias_in = upload_on(dv_, &lbias);
    ddbias = upload_nan(dv_, want_dbias.dtype, want_dbias.n);
  }
  void *const dbias_dbias[2] = {dbias_in, ddbias};
  /* A pageable upload may still be landing when cudaMemcpy returns; the plan's stream does not
   * wait for the legacy stream's copies (every upload above, the NaN starting values too). */
  void *dcu = c->packed   ? upload_lengths(dv_, lcq, lck, g->p.batch + 1)
              : c->padded ? upload_lengths(dv_, g->cq, g->ck, g->p.batch)
                          : NULL;
  if (gpu->synchronize(dv_, why, sizeof why) != ATTN_STATUS_OK) report(j, 0, "upload", why);
  tu_args x;
  tu_args_dense(&x, dq_in, dk_in, dv_in, dout_o, dlse, ddout, ddq, ddk, ddv);
  add_features(&x, &p, dalibi, dsinks_in, ddsinks, dmask_seg, dbias_dbias);
  if (dcu != NULL && c->packed)
    x.in.cu_seqlens_q = dcu, x.in.cu_seqlens_k = (const int32_t *)dcu + g->p.batch + 1;
  if (dcu != NULL && c->padded)
    x.in.seqlens_q = dcu, x.in.seqlens_k = (const int32_t *)dcu + g->p.batch;
  st = attn_dist_plan_forward(plan, &x.in, &x.out);
  report(j, st == ATTN_STATUS_OK, "forward", st == ATTN_STATUS_OK ? "" : attn_ctx_last_error(ctx));
  int seq_axes = 0;
  for (int a = 0; a < c->naxes; ++a) seq_axes += c->dims[a] == ATTN_DIST_DIM_SEQUENCE;
  /* one sequence axis: the ring (its calls counted below) or the all-to-all; two: the
   * all-to-all around the ring */
  const int all_to_all =
      seq_axes == 1 && attn_dist_plan_strategy(plan) == ATTN_DIST_STRATEGY_ALL_TO_ALL;
  const int ring = seq_axes == 1 && !all_to_all;
  if (st == ATTN_STATUS_OK && ring) {
    /* A step's visible chunks are one call (zigzag: every step; contiguous: at most one); pairs:
     * more calls than steps where a step sees several pairs (the diagonal step of a zigzag ring). */
    attn_dist_stats stats;
    attn_dist_plan_last_stats(plan, &stats);
    char detail[128];
    snprintf(detail, sizeof detail, "%d calls in %d steps", (int)stats.blocks, (int)stats.steps);
    const int zigzag = c->layout == ATTN_DIST_LAYOUT_ZIGZAG;
    /* ALiBi and dropout place every pair of chunks, and a mask or bias over keys keeps key
     * chunks apart: a zigzag step is then several calls; a contiguous one is one pair of chunks,
     * placed or not, so at most one call */
    const int placed =
        c->alibi || c->dropout > 0 || c->mask || (c->bias != BIAS_NONE && c->bias != BIAS_ROWS);
    report(j,
           c->pairs || (placed && zigzag) ? stats.blocks > stats.steps
           : zigzag                       ? stats.blocks == stats.steps
                                          : stats.blocks <= stats.steps,
           c->pairs || placed ? "runs one call per pair of chunks" : "runs one call per step",
           detail);
  }
  if (st == ATTN_STATUS_OK) {
    st = attn_dist_plan_backward(plan, &x.in, &x.out, &x.dout, &x.grads);
    report(j, st == ATTN_STATUS_OK, "backward",
           st == ATTN_STATUS_OK ? "" : attn_ctx_last_error(ctx));
  }
  if (dev_ops->stream_sync(dv_, stream, why, sizeof why) != ATTN_STATUS_OK)
    report(j, 0, "sync", why);
  if (st == ATTN_STATUS_OK) {
    tu_buf got_out = fetch(dv_, dout_o, want_out.dtype, want_out.n);
    tu_buf got_lse = fetch(dv_, dlse, ATTN_DTYPE_F32, want_lse.n);
    tu_buf got_dq = fetch(dv_, ddq, want_dq.dtype, want_dq.n);
    tu_buf got_dk = fetch(dv_, ddk, want_dk.dtype, want_dk.n);
    tu_buf got_dv = fetch(dv_, ddv, want_dv.dtype, want_dv.n);
    compare(j, "out", &got_out, &want_out, 1e-2);
    compare(j, "lse", &got_lse, &want_lse, 1e-4);
    compare(j, "dq", &got_dq, &want_dq, 2e-2);
    compare(j, "dk", &got_dk, &want_dk, 2e-2);
    compare(j, "dv", &got_dv, &want_dv, 2e-2);
    if (S > 0) {
      tu_buf got_dsinks = fetch(dv_, ddsinks, ATTN_DTYPE_F32, want_dsinks.n);
      /* a sum over the rows of P_sink (dout . out): out is the ring's own bf16 result, within
       * out's tolerance of the single device's, so dsinks is compared as the gradients are */
      compare(j, "dsinks", &got_dsinks, &want_dsinks, 2e-2);
      tu_buf_free(&got_dsinks);
    }
    if (ddbias != NULL) {
      tu_buf got_dbias = fetch(dv_, ddbias, want_dbias.dtype, want_dbias.n);
      compare(j, "dbias", &got_dbias, &want_dbias, 2e-2);
      tu_buf_free(&got_dbias);
    }
    tu_buf_free(&got_out), tu_buf_free(&got_lse), tu_buf_free(&got_dq), tu_buf_free(&got_dk);
    tu_buf_free(&got_dv);
  }
  attn_dist_plan_destroy(plan);
  dev_ops->stream_destroy(dv_, stream);
  void *bufs[12] = {dq_in, dk_in, dv_in, ddout,  dout_o,    dlse,
                    ddq,   ddk,   ddv,   dalibi, dsinks_in, ddsinks};
  for (int i = 0; i < 12; ++i)
    if (bufs[i] != NULL) gpu->release(dv_, bufs[i]);
  tu_buf_free(&want_dsinks);
  for (int i = 0; i < 3; ++i)
    if (dmask_seg[i] != NULL) gpu->release(dv_, dmask_seg[i]);
  tu_buf_free(&lmask), tu_buf_free(&lqseg), tu_buf_free(&lkseg);
  if (dbias_in != NULL) gpu->release(dv_, dbias_in), gpu->release(dv_, ddbias);
  if (dcu != NULL) gpu->release(dv_, dcu);
  tu_buf_free(&lbias), tu_buf_free(&want_dbias);
  tu_buf *hb[9] = {&q, &k, &v, &dout, &want_out, &want_lse, &want_dq, &want_dk, &want_dv};
  for (int i = 0; i < 9; ++i) tu_buf_free(hb[i]);
  free(bmap), free(tqmap), free(tkmap), free(hqmap), free(hkmap);
  attn_ctx_destroy(ctx);
  return NULL;
}

/* The global problem of a case on n ranks, its random data and its single-device results. */
static int make_global(const tcase *c, uint64_t seed, global *g) {
  memset(g, 0, sizeof *g);
  attn_problem *p = &g->p;
  attn_problem_init(p);
  p->dtype = ATTN_DTYPE_BF16, p->device = ATTN_DEVICE_CUDA;
  p->batch = c->B, p->seqlen_q = c->Tq, p->seqlen_k = c->Tk, p->heads_q = c->Hq;
  p->heads_kv = c->Hkv, p->head_dim = c->D, p->causal = c->causal, p->softcap = c->softcap;
  p->dropout_p = c->dropout;
  p->align = c->align;
  /* rows of q and k: dense B x T; packed, the sequences' rows one after another */
  int64_t rows_q = c->B * c->Tq, rows_k = c->B * c->Tk;
  if (c->packed) {
    g->cq[0] = g->ck[0] = 0;
    for (int64_t b = 0; b < c->B; ++b)
      g->cq[b + 1] = g->cq[b] + (int32_t)(c->Tq * (b + 1)),
                g->ck[b + 1] = g->ck[b] + (int32_t)(c->Tk * (b + 1));
    p->varlen = ATTN_VARLEN_PACKED;
    p->seqlen_q = c->Tq * c->B, p->seqlen_k = c->Tk * c->B;
    rows_q = p->total_q = g->cq[c->B], rows_k = p->total_k = g->ck[c->B];
  }
  if (c->padded) { /* the whole sequences' lengths, the same on every rank */
    p->varlen = ATTN_VARLEN_PADDED;
    for (int64_t b = 0; b < c->B; ++b)
      g->cq[b] = (int32_t)(c->Tq - 3 * b - 1), g->ck[b] = (int32_t)(c->Tk - 2 * b);
  }
  if (c->has_window) p->window_left = c->window_left;
  p->num_sinks = c->sinks;
  if (c->alibi) p->alibi = ATTN_ALIBI_PER_HEAD;
  if (c->mask) {
    p->has_mask = 1;
    p->mask_shape[0] = c->B, p->mask_shape[1] = 1, p->mask_shape[2] = c->Tq,
    p->mask_shape[3] = c->Tk;
  }
  p->has_segment_ids = c->segments;
  if (c->bias != BIAS_NONE) {
    p->has_bias = 1;
    p->bias_dtype = c->bias == BIAS_ROWS_KEYS ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F32;
    p->bias_shape[0] = c->bias == BIAS_ROWS_KEYS ? 1 : c->B;
    p->bias_shape[1] = c->bias == BIAS_FULL || c->bias == BIAS_HEADS_KEYS ? c->Hq : 1;
    p->bias_shape[2] = c->bias == BIAS_KEYS || c->bias == BIAS_HEADS_KEYS ? 1 : c->Tq;
    p->bias_shape[3] = c->bias == BIAS_ROWS ? 1 : c->Tk;
  }
  tu_rng rng = tu_rng_make(seed);
  g->alibi = tu_buf_new(ATTN_DTYPE_F32, c->alibi ? c->Hq : 0);
  g->sinks = tu_buf_new(ATTN_DTYPE_F32, c->Hq * c->sinks);
  g->dsinks = tu_buf_new(ATTN_DTYPE_F32, c->Hq * c->sinks);
  if (g->alibi.n > 0) tu_fill_uniform(&g->alibi, &rng, 0.05, 0.5);
  if (g->sinks.n > 0) tu_fill_uniform(&g->sinks, &rng, -1, 1);
  g->mask = tu_buf_new(ATTN_DTYPE_U8, c->mask ? c->B * c->Tq * c->Tk : 0);
  if (g->mask.n > 0) {
    tu_buf u = tu_buf_new(ATTN_DTYPE_F32, g->mask.n);
    tu_fill_uniform(&u, &rng, 0, 1);
    for (int64_t i = 0; i < g->mask.n; ++i) tu_set(&g->mask, i, tu_get(&u, i) < 0.8);
    tu_buf_free(&u);
  }
  const int64_t nb = p->bias_shape[0] * p->bias_shape[1] * p->bias_shape[2] * p->bias_shape[3];
  g->bias = tu_buf_new((attn_dtype)p->bias_dtype, p->has_bias ? nb : 0);
  g->dbias = tu_buf_new((attn_dtype)p->bias_dtype, p->has_bias ? nb : 0);
  if (g->bias.n > 0) tu_fill_uniform(&g->bias, &rng, -1, 1);
  g->qseg = tu_buf_new(ATTN_DTYPE_I32, c->segments ? c->B * c->Tq : 0);
  g->kseg = tu_buf_new(ATTN_DTYPE_I32, c->segments ? c->B * c->Tk : 0);
  for (int64_t b = 0; b < (c->segments ? c->B : 0); ++b) { /* two segments, ends padded (-1) */
    for (int64_t i = 0; i < c->Tq; ++i)
      tu_set(&g->qseg, b * c->Tq + i, i < c->Tq / 3 + b ? 0 : i < c->Tq - 1 ? 1 : -1);
    for (int64_t j = 0; j < c->Tk; ++j)
      tu_set(&g->kseg, b * c->Tk + j, j < c->Tk / 3 + b ? 0 : j < c->Tk - 2 ? 1 : -1);
  }
  const int64_t nq = rows_q * c->Hq * c->D, nk = rows_k * c->Hkv * c->D;
  g->q = tu_buf_new(ATTN_DTYPE_BF16, nq), g->dout = tu_buf_new(ATTN_DTYPE_BF16, nq);
  g->k = tu_buf_new(ATTN_DTYPE_BF16, nk), g->v = tu_buf_new(ATTN_DTYPE_BF16, nk);
  tu_fill_uniform(&g->q, &rng, -1, 1), tu_fill_uniform(&g->k, &rng, -1, 1);
  tu_fill_uniform(&g->v, &rng, -1, 1), tu_fill_uniform(&g->dout, &rng, -1, 1);
  g->out = tu_buf_new(ATTN_DTYPE_BF16, nq), g->dq = tu_buf_new(ATTN_DTYPE_BF16, nq);
  g->lse = tu_buf_new(ATTN_DTYPE_F32, rows_q * c->Hq);
  g->dk = tu_buf_new(ATTN_DTYPE_BF16, nk), g->dv = tu_buf_new(ATTN_DTYPE_BF16, nk);
  if (c->refused != NULL) return 1;
  void *q = upload(&g->q), *k = upload(&g->k), *v = upload(&g->v), *dout = upload(&g->dout);
  void *out = upload(&g->out), *lse = upload(&g->lse), *dq = upload(&g->dq);
  void *dk = upload(&g->dk), *dv = upload(&g->dv);
  void *alibi = upload_heads(0, &g->alibi, 0, c->Hq, 1),
       *sinks = upload_heads(0, &g->sinks, 0, c->Hq, c->sinks);
  void *dsinks = upload_heads(0, &g->dsinks, 0, c->Hq, c->sinks);
  void *const mask_seg[3] = {upload_some(0, &g->mask), upload_some(0, &g->qseg),
                             upload_some(0, &g->kseg)};
  void *const bias_dbias[2] = {upload_some(0, &g->bias), upload_some(0, &g->dbias)};
  attn_ctx *ctx;
  attn_ctx_create(&ctx);
  tu_args x;
  tu_args_dense(&x, q, k, v, out, lse, dout, dq, dk, dv);
  add_features(&x, p, alibi, sinks, dsinks, mask_seg, bias_dbias);
  void *cu = c->packed ? upload_lengths(0, g->cq, g->ck, c->B + 1) : NULL;
  if (cu != NULL) x.in.cu_seqlens_q = cu, x.in.cu_seqlens_k = (const int32_t *)cu + c->B + 1;
  void *lens = c->padded ? upload_lengths(0, g->cq, g->ck, c->B) : NULL;
  if (lens != NULL) x.in.seqlens_q = lens, x.in.seqlens_k = (const int32_t *)lens + c->B;
  /* A plan with its device workspace (the one-call attn_forward allocates none on a GPU). */
  attn_plan *plan = NULL;
  void *ws = NULL;
  size_t fwd_ws = 0, bwd_ws = 0;
  char why[256] = "";
  attn_status st = attn_plan_create(ctx, p, NULL, &plan);
  if (st == ATTN_STATUS_OK) st = attn_plan_workspace_size(plan, &fwd_ws, &bwd_ws);
  const size_t ws_size = fwd_ws > bwd_ws ? fwd_ws : bwd_ws;
  if (st == ATTN_STATUS_OK && ws_size > 0) st = gpu->alloc(0, ws_size, &ws, why, sizeof why);
  if (st == ATTN_STATUS_OK) st = attn_plan_forward(plan, &x.in, ws, ws_size, &x.out);
  if (st == ATTN_STATUS_OK)
    st = attn_plan_backward(plan, &x.in, &x.out, &x.dout, ws, ws_size, &x.grads);
  int ok = st == ATTN_STATUS_OK && gpu->synchronize(0, why, sizeof why) == ATTN_STATUS_OK;
  attn_plan_destroy(plan);
  gpu->release(0, ws);
  if (cu != NULL) gpu->release(0, cu);
  if (lens != NULL) gpu->release(0, lens);
  if (!ok)
    printf("%s: the single-device problem fails: %s %s\n", c->name, attn_ctx_last_error(ctx), why);
  tu_buf_free(&g->out), tu_buf_free(&g->lse), tu_buf_free(&g->dq), tu_buf_free(&g->dk);
  tu_buf_free(&g->dv);
  g->out = fetch(0, out, ATTN_DTYPE_BF16, nq),
  g->lse = fetch(0, lse, ATTN_DTYPE_F32, rows_q * c->Hq);
  g->dq = fetch(0, dq, ATTN_DTYPE_BF16, nq), g->dk = fetch(0, dk, ATTN_DTYPE_BF16, nk);
  g->dv = fetch(0, dv, ATTN_DTYPE_BF16, nk);
  if (dsinks != NULL) {
    tu_buf_free(&g->dsinks);
    g->dsinks = fetch(0, dsinks, ATTN_DTYPE_F32, c->Hq * c->sinks);
  }
  if (bias_dbias[1] != NULL) {
    const attn_dtype bdt = g->dbias.dtype;
    const int64_t n = g->dbias.n;
    tu_buf_free(&g->dbias);
    g->dbias = fetch(0, bias_dbias[1], bdt, n);
  }
  for (int i = 0; i < 2; ++i)
    if (bias_dbias[i] != NULL) gpu->release(0, bias_dbias[i]);
  void *bufs[15] = {q,  k,     v,     dout,   out,         lse,         dq,         dk,
                    dv, alibi, sinks, dsinks, mask_seg[0], mask_seg[1], mask_seg[2]};
  for (int i = 0; i < 15; ++i)
    if (bufs[i] != NULL) gpu->release(0, bufs[i]);
  attn_ctx_destroy(ctx);
  tu_check(ok, "%s: single-device oracle", c->name);
  return ok;
}

static void free_global(global *g) {
  tu_buf *b[15] = {&g->q,  &g->k,     &g->v,     &g->dout,   &g->out,  &g->lse,  &g->dq,  &g->dk,
                   &g->dv, &g->alibi, &g->sinks, &g->dsinks, &g->mask, &g->qseg, &g->kseg};
  for (int i = 0; i < 15; ++i) tu_buf_free(b[i]);
  tu_buf_free(&g->bias), tu_buf_free(&g->dbias);
}

/* The cases on n ranks; sizes depend on n so that every split divides (odd chunk lengths). */
static int cases_for(int n, tcase *out) {
  const int S = ATTN_DIST_DIM_SEQUENCE, BT = ATTN_DIST_DIM_BATCH, H = ATTN_DIST_DIM_HEADS;
  const int C = ATTN_DIST_LAYOUT_CONTIGUOUS, Z = ATTN_DIST_LAYOUT_ZIGZAG;
  const int AUTO = ATTN_DIST_STRATEGY_AUTO, A2A = ATTN_DIST_STRATEGY_ALL_TO_ALL;
  int k = 0;
  out[k++] = (tcase){.name = "batch split causal GQA",
                     .naxes = 1,
                     .dims = {BT, 0},
                     .sizes = {n, 0},
                     .layout = C,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = n,
                     .Tq = 77,
                     .Tk = 77,
                     .Hq = 4,
                     .Hkv = 2,
                     .D = 64};
  out[k++] = (tcase){.name = "head split GQA",
                     .naxes = 1,
                     .dims = {H, 0},
                     .sizes = {n, 0},
                     .layout = C,
                     .strategy = AUTO,
                     .B = 1,
                     .Tq = 65,
                     .Tk = 90,
                     .Hq = 2 * n,
                     .Hkv = n,
                     .D = 64};
  out[k++] = (tcase){.name = "ring contiguous causal",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = C,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 2,
                     .Tq = 33 * n,
                     .Tk = 33 * n,
                     .Hq = 4,
                     .Hkv = 2,
                     .D = 64};
  out[k++] = (tcase){.name = "ring contiguous Tq!=Tk",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = C,
                     .strategy = AUTO,
                     .B = 1,
                     .Tq = 24 * n,
                     .Tk = 41 * n,
                     .Hq = 4,
                     .Hkv = 1,
                     .D = 64};
  out[k++] = (tcase){.name = "ring zigzag causal d128",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 1,
                     .Tq = 2 * 37 * n,
                     .Tk = 2 * 37 * n,
                     .Hq = 6,
                     .Hkv = 2,
                     .D = 128};
  out[k++] = (tcase){.name = "ring zigzag softcap",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = AUTO,
                     .B = 2,
                     .Tq = 2 * 19 * n,
                     .Tk = 2 * 19 * n,
                     .Hq = 4,
                     .Hkv = 4,
                     .D = 64,
                     .softcap = 30.0};
  out[k++] = (tcase){.name = "ring zigzag causal MHA",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 1,
                     .Tq = 2 * 64 * n,
                     .Tk = 2 * 64 * n,
                     .Hq = 2,
                     .Hkv = 2,
                     .D = 64};
  if (n == 4) {
    out[k++] = (tcase){.name = "heads x ring zigzag causal",
                       .naxes = 2,
                       .dims = {H, S},
                       .sizes = {2, 2},
                       .layout = Z,
                       .strategy = AUTO,
                       .causal = 1,
                       .B = 1,
                       .Tq = 2 * 2 * 29,
                       .Tk = 2 * 2 * 29,
                       .Hq = 8,
                       .Hkv = 4,
                       .D = 64};
    out[k++] = (tcase){.name = "batch x ring contiguous",
                       .naxes = 2,
                       .dims = {BT, S},
                       .sizes = {2, 2},
                       .layout = C,
                       .strategy = AUTO,
                       .B = 2,
                       .Tq = 2 * 35,
                       .Tk = 2 * 35,
                       .Hq = 4,
                       .Hkv = 2,
                       .D = 64};
    out[k++] = (tcase){.name = "two sequence axes",
                       .naxes = 2,
                       .dims = {S, S},
                       .sizes = {2, 2},
                       .layout = Z,
                       .strategy = AUTO,
                       .causal = 1,
                       .B = 1,
                       .Tq = 64,
                       .Tk = 64,
                       .Hq = 4,
                       .Hkv = 4,
                       .D = 64,
                       .bias = BIAS_ROWS_KEYS};
    out[k++] = (tcase){.name = "two sequence axes dropout ALiBi sinks bias",
                       .naxes = 2,
                       .dims = {S, S},
                       .sizes = {2, 2},
                       .layout = C,
                       .strategy = AUTO,
                       .B = 1,
                       .Tq = 2 * 2 * 12,
                       .Tk = 2 * 2 * 12,
                       .Hq = 4,
                       .Hkv = 2,
                       .D = 64,
                       .dropout = 0.1,
                       .alibi = 1,
                       .sinks = 2,
                       .bias = BIAS_FULL};
    out[k++] = (tcase){.name = "heads x all-to-all zigzag causal",
                       .naxes = 2,
                       .dims = {H, S},
                       .sizes = {2, 2},
                       .layout = Z,
                       .strategy = A2A,
                       .causal = 1,
                       .B = 1,
                       .Tq = 2 * 2 * 21,
                       .Tk = 2 * 2 * 21,
                       .Hq = 8,
                       .Hkv = 4,
                       .D = 64};
  }
  /* AUTO measuring on the GPU: whichever it takes must be exact */
  out[k++] = (tcase){.name = "AUTO measured zigzag causal",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 1,
                     .Tq = 2 * 32 * n,
                     .Tk = 2 * 32 * n,
                     .Hq = 2 * n,
                     .Hkv = n,
                     .D = 64,
                     .tune = 1};
  /* Packed varlen (THD) under a split sequence: each rank its chunks of every sequence, AUTO
   * taking the all-to-all (the ring cannot run it) */
  out[k++] = (tcase){.name = "packed contiguous causal dropout sinks",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = C,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 3,
                     .Tq = 2 * 5 * n,
                     .Tk = 2 * 5 * n,
                     .Hq = 2 * n,
                     .Hkv = n,
                     .D = 64,
                     .dropout = 0.1,
                     .sinks = 2,
                     .packed = 1,
                     .want_a2a = 1};
  out[k++] = (tcase){.name = "packed zigzag causal ALiBi GQA Tq!=Tk",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = A2A,
                     .causal = 1,
                     .B = 2,
                     .Tq = 2 * 3 * n,
                     .Tk = 2 * 7 * n,
                     .Hq = 4 * n,
                     .Hkv = n,
                     .D = 128,
                     .alibi = 1,
                     .packed = 1};
  out[k++] = (tcase){.name = "padded zigzag causal dropout",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 2,
                     .Tq = 2 * 11 * n,
                     .Tk = 2 * 11 * n,
                     .Hq = 2 * n,
                     .Hkv = n,
                     .D = 64,
                     .dropout = 0.1,
                     .padded = 1,
                     .want_a2a = 1};
  /* The all-to-all: each rank runs the whole sequence of Hkv/n KV groups, its reordering copies
   * on the GPU (rows of a zigzag rank in two runs, masks of 1-byte elements). */
  out[k++] = (tcase){.name = "all-to-all contiguous causal GQA",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = C,
                     .strategy = A2A,
                     .causal = 1,
                     .B = 2,
                     .Tq = 23 * n,
                     .Tk = 23 * n,
                     .Hq = 2 * n,
                     .Hkv = n,
                     .D = 64};
  out[k++] = (tcase){.name = "all-to-all zigzag causal softcap sinks d128",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = A2A,
                     .causal = 1,
                     .B = 1,
                     .Tq = 2 * 19 * n,
                     .Tk = 2 * 19 * n,
                     .Hq = 2 * n,
                     .Hkv = n,
                     .D = 128,
                     .softcap = 30.0,
                     .sinks = 2};
  out[k++] = (tcase){.name = "all-to-all Tq!=Tk bottom-right dropout ALiBi mask segments",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = C,
                     .strategy = A2A,
                     .causal = 1,
                     .B = 2,
                     .Tq = 20 * n,
                     .Tk = 27 * n,
                     .Hq = 2 * n,
                     .Hkv = n,
                     .D = 64,
                     .dropout = 0.1,
                     .align = ATTN_ALIGN_BOTTOM_RIGHT,
                     .alibi = 1,
                     .mask = 1,
                     .segments = 1};
  out[k++] = (tcase){.name = "all-to-all zigzag window bias",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = A2A,
                     .B = 1,
                     .Tq = 2 * 17 * n,
                     .Tk = 2 * 17 * n,
                     .Hq = 2 * n,
                     .Hkv = n,
                     .D = 64,
                     .has_window = 1,
                     .window_left = 9,
                     .bias = BIAS_FULL};
  out[k++] = (tcase){.name = "all-to-all broadcast bias",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = C,
                     .strategy = A2A,
                     .causal = 1,
                     .B = 2,
                     .Tq = 16 * n,
                     .Tk = 16 * n,
                     .Hq = 2 * n,
                     .Hkv = n,
                     .D = 64,
                     .bias = BIAS_ROWS_KEYS};
  out[k++] = (tcase){.name = "all-to-all per-head row-broadcast bias",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = A2A,
                     .causal = 1,
                     .B = 2,
                     .Tq = 2 * 9 * n,
                     .Tk = 2 * 9 * n,
                     .Hq = 2 * n,
                     .Hkv = n,
                     .D = 64,
                     .bias = BIAS_HEADS_KEYS};
  out[k++] = (tcase){.name = "all-to-all key-broadcast bias",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = C,
                     .strategy = A2A,
                     .B = 1,
                     .Tq = 12 * n,
                     .Tk = 15 * n,
                     .Hq = 2 * n,
                     .Hkv = n,
                     .D = 64,
                     .bias = BIAS_ROWS};
  out[k++] = (tcase){.name = "all-to-all row-broadcast bias",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = A2A,
                     .B = 1,
                     .Tq = 2 * 8 * n,
                     .Tk = 2 * 8 * n,
                     .Hq = 2 * n,
                     .Hkv = n,
                     .D = 64,
                     .bias = BIAS_KEYS};
  out[k++] = (tcase){.name = "ring dropout",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = C,
                     .strategy = AUTO,
                     .B = 1,
                     .Tq = 16 * n,
                     .Tk = 16 * n,
                     .Hq = 2,
                     .Hkv = 2,
                     .D = 64,
                     .dropout = 0.1};
  /* A step's hull of chunks as one call: its mask must be the global one (test_dist_blocks
   * checks the geometry key by key; these run it). */
  const int BR = ATTN_ALIGN_BOTTOM_RIGHT;
  out[k++] = (tcase){.name = "ring zigzag causal bottom-right",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 1,
                     .Tq = 2 * 23 * n,
                     .Tk = 2 * 23 * n,
                     .Hq = 4,
                     .Hkv = 2,
                     .D = 64,
                     .align = BR};
  out[k++] = (tcase){.name = "ring zigzag GQA 4:1",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = AUTO,
                     .B = 1,
                     .Tq = 2 * 13 * n,
                     .Tk = 2 * 13 * n,
                     .Hq = 8,
                     .Hkv = 2,
                     .D = 64};
  /* causal, each row sees itself only: the diagonal step's call holds a pair the mask hides (the
   * later query chunk against the earlier key chunk), and the ring ends after step 0 */
  out[k++] = (tcase){.name = "ring zigzag window 0",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 2,
                     .Tq = 2 * 21 * n,
                     .Tk = 2 * 21 * n,
                     .Hq = 4,
                     .Hkv = 1,
                     .D = 64,
                     .has_window = 1};
  out[k++] = (tcase){.name = "ring zigzag causal pairs",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 1,
                     .Tq = 2 * 27 * n,
                     .Tk = 2 * 27 * n,
                     .Hq = 4,
                     .Hkv = 2,
                     .D = 64,
                     .pairs = 1};
  out[k++] = (tcase){.name = "ring causal Tq!=Tk",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = C,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 1,
                     .Tq = 2 * 8 * n,
                     .Tk = 4 * 8 * n,
                     .Hq = 2,
                     .Hkv = 2,
                     .D = 64};
  /* Placed pairs (one piece of positions per axis, the cuda kernels' offset and Philox bases):
   * masks cut where no plan of the block's shape is, ALiBi's global distances, dropout's global
   * counters; and the sinks, once. */
  out[k++] = (tcase){.name = "ring window",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = C,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 1,
                     .Tq = 32 * n,
                     .Tk = 32 * n,
                     .Hq = 2,
                     .Hkv = 2,
                     .D = 64,
                     .has_window = 1,
                     .window_left = 40};
  out[k++] = (tcase){.name = "ring causal Tq!=Tk bottom-right window",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = C,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 1,
                     .Tq = 2 * 12 * n,
                     .Tk = 2 * 20 * n,
                     .Hq = 4,
                     .Hkv = 2,
                     .D = 64,
                     .align = BR,
                     .has_window = 1,
                     .window_left = 30};
  out[k++] = (tcase){.name = "ring sinks",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 1,
                     .Tq = 32 * n,
                     .Tk = 32 * n,
                     .Hq = 2,
                     .Hkv = 2,
                     .D = 64,
                     .sinks = 2};
  out[k++] = (tcase){.name = "ring zigzag causal ALiBi",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 1,
                     .Tq = 2 * 20 * n,
                     .Tk = 2 * 20 * n,
                     .Hq = 4,
                     .Hkv = 2,
                     .D = 64,
                     .alibi = 1};
  out[k++] = (tcase){.name = "ring ALiBi window softcap sinks d128",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = C,
                     .strategy = AUTO,
                     .B = 1,
                     .Tq = 24 * n,
                     .Tk = 24 * n,
                     .Hq = 4,
                     .Hkv = 4,
                     .D = 128,
                     .softcap = 30,
                     .has_window = 1,
                     .window_left = 20,
                     .sinks = 1,
                     .alibi = 1};
  out[k++] = (tcase){.name = "ring zigzag causal dropout",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 1,
                     .Tq = 2 * 16 * n,
                     .Tk = 2 * 16 * n,
                     .Hq = 2,
                     .Hkv = 2,
                     .D = 64,
                     .dropout = 0.2};
  out[k++] = (tcase){.name = "ring dropout ALiBi GQA",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = C,
                     .strategy = AUTO,
                     .B = 1,
                     .Tq = 20 * n,
                     .Tk = 20 * n,
                     .Hq = 4,
                     .Hkv = 2,
                     .D = 64,
                     .dropout = 0.1,
                     .alibi = 1};
  out[k++] = (tcase){.name = "batch split dropout",
                     .naxes = 1,
                     .dims = {BT, 0},
                     .sizes = {n, 0},
                     .layout = C,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = n,
                     .Tq = 40,
                     .Tk = 40,
                     .Hq = 4,
                     .Hkv = 2,
                     .D = 64,
                     .dropout = 0.1};
  out[k++] = (tcase){.name = "head split dropout ALiBi sinks",
                     .naxes = 1,
                     .dims = {H, 0},
                     .sizes = {n, 0},
                     .layout = C,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 1,
                     .Tq = 40,
                     .Tk = 40,
                     .Hq = 2 * n,
                     .Hkv = n,
                     .D = 64,
                     .dropout = 0.1,
                     .sinks = 1,
                     .alibi = 1};
  if (n == 4)
    out[k++] = (tcase){.name = "heads x ring zigzag ALiBi sinks",
                       .naxes = 2,
                       .dims = {H, S},
                       .sizes = {2, 2},
                       .layout = Z,
                       .strategy = AUTO,
                       .causal = 1,
                       .B = 1,
                       .Tq = 64,
                       .Tk = 64,
                       .Hq = 4,
                       .Hkv = 2,
                       .D = 64,
                       .sinks = 1,
                       .alibi = 1};
  /* masks and segment ids: sliced per block, the kv segment ids travelling with the slice */
  out[k++] = (tcase){.name = "ring zigzag causal mask",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 1,
                     .Tq = 2 * 18 * n,
                     .Tk = 2 * 18 * n,
                     .Hq = 4,
                     .Hkv = 2,
                     .D = 64,
                     .mask = 1};
  out[k++] = (tcase){.name = "ring segments ALiBi window mask",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = C,
                     .strategy = AUTO,
                     .B = 2,
                     .Tq = 24 * n,
                     .Tk = 24 * n,
                     .Hq = 2,
                     .Hkv = 2,
                     .D = 64,
                     .has_window = 1,
                     .window_left = 30,
                     .alibi = 1,
                     .mask = 1,
                     .segments = 1};
  out[k++] = (tcase){.name = "ring zigzag causal segments sinks",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 1,
                     .Tq = 2 * 16 * n,
                     .Tk = 2 * 16 * n,
                     .Hq = 2,
                     .Hkv = 1,
                     .D = 64,
                     .sinks = 1,
                     .segments = 1};
  /* a bias: dbias in place block by block (rows and keys), summed over broadcast batch and heads
   * by the kernels and over the head ranks by the plan; broadcast over rows or keys, the blocks'
   * shares summed (over the sequence ranks too, for rows) */
  out[k++] = (tcase){.name = "ring zigzag causal bias",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 1,
                     .Tq = 2 * 14 * n,
                     .Tk = 2 * 14 * n,
                     .Hq = 4,
                     .Hkv = 2,
                     .D = 64,
                     .bias = BIAS_FULL};
  out[k++] = (tcase){.name = "ring window broadcast bias",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = C,
                     .strategy = AUTO,
                     .B = 2,
                     .Tq = 20 * n,
                     .Tk = 20 * n,
                     .Hq = 2,
                     .Hkv = 2,
                     .D = 64,
                     .has_window = 1,
                     .window_left = 12,
                     .bias = BIAS_ROWS_KEYS};
  out[k++] = (tcase){.name = "ring row-broadcast bias",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = C,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 2,
                     .Tq = 16 * n,
                     .Tk = 16 * n,
                     .Hq = 2,
                     .Hkv = 2,
                     .D = 64,
                     .bias = BIAS_KEYS};
  out[k++] = (tcase){.name = "ring zigzag causal key-broadcast bias",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 2,
                     .Tq = 2 * 13 * n,
                     .Tk = 2 * 13 * n,
                     .Hq = 4,
                     .Hkv = 2,
                     .D = 64,
                     .bias = BIAS_ROWS};
  out[k++] = (tcase){.name = "ring zigzag row-broadcast bias ALiBi",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 1,
                     .Tq = 2 * 11 * n,
                     .Tk = 2 * 11 * n,
                     .Hq = 2,
                     .Hkv = 1,
                     .D = 64,
                     .alibi = 1,
                     .bias = BIAS_KEYS};
  if (n == 4)
    out[k++] = (tcase){.name = "heads x ring zigzag broadcast bias",
                       .naxes = 2,
                       .dims = {H, S},
                       .sizes = {2, 2},
                       .layout = Z,
                       .strategy = AUTO,
                       .causal = 1,
                       .B = 1,
                       .Tq = 64,
                       .Tk = 64,
                       .Hq = 4,
                       .Hkv = 2,
                       .D = 64,
                       .bias = BIAS_ROWS_KEYS};
  /* dropout on the device ring needs key chunks of a multiple of 4 keys (one Philox call a 4);
   * AUTO then takes the all-to-all where the KV heads divide */
  out[k++] = (tcase){.name = "AUTO dropout odd chunks takes the all-to-all",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = AUTO,
                     .causal = 1,
                     .B = 1,
                     .Tq = 2 * 5 * n,
                     .Tk = 2 * 5 * n,
                     .Hq = 2 * n,
                     .Hkv = n,
                     .D = 64,
                     .dropout = 0.1,
                     .want_a2a = 1};
  out[k++] = (tcase){.name = "ring dropout odd chunks",
                     .naxes = 1,
                     .dims = {S, 0},
                     .sizes = {n, 0},
                     .layout = Z,
                     .strategy = ATTN_DIST_STRATEGY_RING,
                     .B = 1,
                     .Tq = 2 * 5 * n,
                     .Tk = 2 * 5 * n,
                     .Hq = 2,
                     .Hkv = 2,
                     .D = 64,
                     .dropout = 0.1,
                     .refused = "multiple of 4"};
  return k;
}

static void run_case(const tcase *c, const global *g, int n, int32_t transport, void **comms,
                     const int *devices) {
  /* read at plan creation, in the ranks' threads */
  if (c->pairs)
    setenv("ATTN_DIST_RING_BLOCKS", "pairs", 1);
  else
    unsetenv("ATTN_DIST_RING_BLOCKS");
  pthread_t th[MAX_RANKS];
  rank_job jobs[MAX_RANKS];
  for (int r = 0; r < n; ++r) {
    jobs[r] = (rank_job){c, g, n, r, devices[r], transport, comms[r]};
    pthread_create(&th[r], NULL, run_rank, &jobs[r]);
  }
  for (int r = 0; r < n; ++r) pthread_join(th[r], NULL);
}

/* ATTN_TEST_FILTER=text: only the cases whose name holds it (e.g. one case under
 * compute-sanitizer, where every case would take minutes). */
static int wanted(const tcase *c) {
  const char *filter = getenv("ATTN_TEST_FILTER");
  return filter == NULL || strstr(c->name, filter) != NULL;
}

int main(void) {
  uint64_t seed = 20261124;
  const char *env = getenv("ATTN_TEST_SEED");
  if (env != NULL) seed = strtoull(env, NULL, 10);
  printf("seed %llu (ATTN_TEST_SEED)\n", (unsigned long long)seed);
  gpu = attn_gpu();
  dev_ops = attn_module_dist_ops();
  int32_t count = 0;
  char why[512] = "";
  if (gpu == NULL || dev_ops == NULL ||
      gpu->device_count(&count, why, sizeof why) != ATTN_STATUS_OK || count < 1) {
    printf("SKIP: no GPU, or no cuda module (%s)\n", why[0] ? why : "attn_module_info says why");
    return 77;
  }
  if (!attn_dist_transport_available(ATTN_DIST_TRANSPORT_TEST_LOOPBACK, why, sizeof why)) {
    printf("SKIP: the loopback test transport is not built (%s)\n", why);
    return 77;
  }
  for (int n = 2; n <= MAX_RANKS; ++n) {
    tcase cases[64];
    const int ncases = cases_for(n, cases);
    loopback_group world;
    loopback_group_init(&world, n);
    loopback_comm lc[MAX_RANKS];
    void *comms[MAX_RANKS];
    int devices[MAX_RANKS] = {0, 0, 0, 0};
    for (int r = 0; r < n; ++r) lc[r] = (loopback_comm){&world, r}, comms[r] = &lc[r];
    for (int i = 0; i < ncases; ++i) {
      if (!wanted(&cases[i])) continue;
      global g;
      if (make_global(&cases[i], seed + (uint64_t)(n * 100 + i), &g))
        run_case(&cases[i], &g, n, ATTN_DIST_TRANSPORT_TEST_LOOPBACK, comms, devices);
      free_global(&g);
    }
  }
#ifdef ATTN_TEST_NCCL
  if (count >= 2 && attn_dist_transport_available(ATTN_DIST_TRANSPORT_NCCL, why, sizeof why)) {
    /* The same cases over NCCL, one thread per GPU: only the transport differs. */
    ncclComm_t nc[2];
    int devs[2] = {0, 1};
    if (ncclCommInitAll(nc, 2, devs) != ncclSuccess) {
      tu_check(0, "ncclCommInitAll of 2 GPUs");
    } else {
      void *comms[2] = {&nc[0], &nc[1]};
      tcase cases[64];
      const int ncases = cases_for(2, cases);
      for (int i = 0; i < ncases; ++i) {
        if (!wanted(&cases[i])) continue;
        global g;
        if (make_global(&cases[i], seed + (uint64_t)(900 + i), &g))
          run_case(&cases[i], &g, 2, ATTN_DIST_TRANSPORT_NCCL, comms, devs);
        free_global(&g);
      }
      for (int i = 0; i < 2; ++i) ncclCommDestroy(nc[i]);
    }
  } else {
    printf("nccl: skipped (%d GPU(s); the NCCL run needs 2 and libattn_nccl.so)\n", (int)count);
  }
#else
  printf("nccl: not built (no NCCL found); the loopback transport stood in for it\n");
#endif
  return tu_finish();
}
