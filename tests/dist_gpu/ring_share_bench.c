/*
 * tests/dist_gpu/ring_share_bench.c - attn_ring_share_bench: what the device ring's compute allows
 * on n GPUs, measured on one (a proxy where no machine of n GPUs is lent; issue 12).
 *
 *   attn_ring_share_bench "b1 hq32 hkv8 sq131072 d128 bf16 causal" [--ranks 2] [--iters 3]
 *                         [--layout zigzag|contiguous] [--forward]
 *
 * The whole problem runs on the GPU as one plan; then the ring of n ranks (threads over the
 * loopback transport, as tests/test_dist_gpu.c) runs it on the same GPU, twice: with a step's
 * chunks in one call where the mask allows (the default, "hull") and with one call per pair of
 * chunks (ATTN_DIST_RING_BLOCKS=pairs, the blocks before). Validated first: each rank's lse
 * against the whole problem's at the same rows. Then each rank in turn runs its steps' block
 * calls alone (the same plans and shapes, forward and backward, back to back on its stream, the
 * other ranks waiting): one GPU's time over the slowest rank's is the speedup n GPUs reach on
 * compute alone (transfers hidden, merges and sums free). Also printed: the whole ring with all
 * ranks on this GPU at once (merges and sums included) over n, where the ranks' kernels overlap
 * and fill each other's tails, so it hides what small calls cost. Not the n-GPU figure
 * (gpu/dist.sh gpubench measures that: no link, no NCCL here). Warm-up, then the median of
 * --iters runs (forward + backward unless --forward).
 */
#define _POSIX_C_SOURCE 200112L /* setenv, pthread barriers, clock_gettime */
#include "attn.h"
#include "attn_dist.h"
#include "core/gpu.h"
#include "dist/dist.h"
#include "dist/transport.h"
#include "dist_gpu/loopback.h"
#include "module/module.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_RANKS 8

static const attn_gpu_ops *gpu;
static const attn_dist_device_ops *dev_ops;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die(const char *what, const char *why) {
  printf("FATAL %s: %s\n", what, why);
  exit(1);
}

/* Uniform [-1, 1) (f32, bf16), or of magnitude [0.5, 1) (f16), from a fast generator. */
static void fill(void *data, attn_dtype dt, int64_t n, uint64_t seed) {
  for (int64_t i = 0; i < n; ++i) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    const float x = (float)(seed >> 40) / 8388608.0f - 1.0f;
    uint32_t u;
    memcpy(&u, &x, 4);
    if (dt == ATTN_DTYPE_F32)
      ((float *)data)[i] = x;
    else if (dt == ATTN_DTYPE_BF16)
      ((uint16_t *)data)[i] = (uint16_t)(u >> 16); /* the top half of an f32 */
    else /* f16: a random sign and 10 mantissa bits, exponent of [0.5, 1) */
      ((uint16_t *)data)[i] = (uint16_t)(((seed >> 63) << 15) | 0x3800u | ((seed >> 30) & 0x3ffu));
  }
}

static void *device_copy(const void *host, size_t bytes) {
  void *d = NULL;
  char why[256] = "";
  if (gpu->alloc(0, bytes + 256, &d, why, sizeof why) != ATTN_STATUS_OK) die("allocation", why);
  if (host != NULL && gpu->upload(0, d, host, bytes, why, sizeof why) != ATTN_STATUS_OK)
    die("upload", why);
  return d;
}

/* The whole problem's data on the host: q, k, v, dout ([B, T, H, D] dense). */
typedef struct host_data {
  attn_problem p;
  size_t es;
  void *q, *k, *v, *dout;
  float *lse; /* the whole problem's, [B, Hq, Tq] */
} host_data;

/* Rows `map` (local row i is global row map[i]) of a dense [B, T, W] host tensor, dense. */
static void *gather_rows(const void *g, int64_t B, int64_t T, int64_t rows, const int64_t *map,
                         int64_t W, size_t es) {
  char *out = malloc((size_t)(B * rows * W) * es);
  if (out == NULL) die("host memory", "gathering a rank's rows");
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < rows; ++i)
      memcpy(out + (size_t)((b * rows + i) * W) * es,
             (const char *)g + (size_t)((b * T + map[i]) * W) * es, (size_t)W * es);
  return out;
}

/* A problem's tensors on the GPU, [B, T, H, D] dense; out, lse and the gradients unset. */
typedef struct dev_tensors {
  char *q, *k, *v, *dout;
  void *out, *lse, *dq, *dk, *dv;
} dev_tensors;

/* Device copies of q, k, v, dout (rows of problem p) and room for what a pass writes. */
static dev_tensors upload_tensors(const attn_problem *p, size_t es, const void *q, const void *k,
                                  const void *v, const void *dout) {
  const int64_t Dv = p->head_dim_v > 0 ? p->head_dim_v : p->head_dim;
  const size_t nq = (size_t)(p->batch * p->seqlen_q), nk = (size_t)(p->batch * p->seqlen_k);
  const size_t bq = nq * (size_t)(p->heads_q * p->head_dim) * es;
  const size_t bk = nk * (size_t)(p->heads_kv * p->head_dim) * es;
  const size_t bv = nk * (size_t)(p->heads_kv * Dv) * es, bo = nq * (size_t)(p->heads_q * Dv) * es;
  dev_tensors t;
  t.q = device_copy(q, bq), t.k = device_copy(k, bk), t.v = device_copy(v, bv);
  t.dout = device_copy(dout, bo), t.out = device_copy(NULL, bo);
  t.lse = device_copy(NULL, (size_t)(p->batch * p->heads_q * p->seqlen_q) * 4);
  t.dq = device_copy(NULL, bq), t.dk = device_copy(NULL, bk), t.dv = device_copy(NULL, bv);
  return t;
}

/* The whole tensors as a pass's arguments. */
static void bind_tensors(const dev_tensors *t, attn_inputs *in, attn_outputs *o, attn_grads *g,
                         attn_tensor *dout) {
  attn_inputs_init(in);
  in->q = attn_tensor_dense(t->q), in->k = attn_tensor_dense(t->k), in->v = attn_tensor_dense(t->v);
  attn_outputs_init(o);
  o->out = attn_tensor_dense(t->out), o->lse = attn_tensor_dense(t->lse);
  attn_grads_init(g);
  g->dq = attn_tensor_dense(t->dq), g->dk = attn_tensor_dense(t->dk),
  g->dv = attn_tensor_dense(t->dv);
  *dout = attn_tensor_dense(t->dout);
}

static void release_tensors(dev_tensors *t) {
  void *bufs[9] = {t->q, t->k, t->v, t->dout, t->out, t->lse, t->dq, t->dk, t->dv};
  for (int i = 0; i < 9; ++i) gpu->release(0, bufs[i]);
}

typedef struct rank_job {
  const host_data *h;
  const attn_dist_spec *spec;
  int rank, n, iters, backward;
  void *comm;
  pthread_barrier_t *barrier;
  double *times; /* rank 0 writes them */
  attn_dist_stats fwd_stats, bwd_stats;
  double alone; /* median seconds of the rank's block calls, run alone */
  double lse_error;
  int ok;
  char error[512];
} rank_job;

/* The rank's block calls alone: every step's calls (attn_dist_ring_step_blocks, on the plans
 * the ring runs them on), forward then backward, back to back on the rank's stream while the
 * other ranks wait, so no neighbour's kernel overlaps them: the ring's compute on one GPU of n,
 * without its merges, sums and transfers. The data are the rank's own q, k and v for every step
 * (the kernels' time does not depend on the values); results go to the rank's buffers, already
 * validated. Median seconds of `iters` runs after a warm-up. */
static double calls_alone(attn_dist_plan *plan, int rank, int n, int iters, int backward,
                          void *stream, const attn_problem *l, size_t es, const dev_tensors *dt) {
  const int64_t Dv = l->head_dim_v > 0 ? l->head_dim_v : l->head_dim, C = plan->chunks;
  const int64_t nq = l->seqlen_q / C, nk = l->seqlen_k / C;
  const int64_t Wq = l->heads_q * l->head_dim, Wk = l->heads_kv * l->head_dim;
  const int64_t Wv = l->heads_kv * Dv, Wo = l->heads_q * Dv;
  attn_dist_block calls[MAX_RANKS][4];
  int ncalls[MAX_RANKS];
  size_t ws_size = 0;
  for (int s = 0; s < n; ++s) {
    ncalls[s] = attn_dist_ring_step_blocks(plan, 1, rank, s, calls[s]);
    for (int i = 0; i < ncalls[s]; ++i) {
      size_t f = 0, b = 0;
      attn_plan_workspace_size(attn_dist_ring_block_plan(plan, &calls[s][i]), &f, &b);
      if (f > ws_size) ws_size = f;
      if (b > ws_size) ws_size = b;
    }
  }
  void *ws = ws_size > 0 ? device_copy(NULL, ws_size) : NULL;
  double *times = calloc((size_t)iters, sizeof(double));
  char why[512] = "";
  for (int it = -1; it < iters; ++it) {
    const double t0 = now();
    for (int s = 0; s < n; ++s)
      for (int i = 0; i < ncalls[s]; ++i) {
        const attn_dist_block *b = &calls[s][i];
        const int64_t q0 = b->a0 * nq, k0 = b->c0 * nk;
        /* the rank's tensors from the block's first row or key, their strides the whole's */
        const int64_t qs[4] = {l->seqlen_q * Wq, Wq, l->head_dim, 1};
        const int64_t ks[4] = {l->seqlen_k * Wk, Wk, l->head_dim, 1};
        const int64_t vs[4] = {l->seqlen_k * Wv, Wv, Dv, 1};
        const int64_t ds[4] = {l->seqlen_q * Wo, Wo, Dv, 1};
        attn_inputs in;
        attn_inputs_init(&in);
        in.q = attn_tensor_dense(dt->q + (size_t)(q0 * Wq) * es);
        in.k = attn_tensor_dense(dt->k + (size_t)(k0 * Wk) * es);
        in.v = attn_tensor_dense(dt->v + (size_t)(k0 * Wv) * es);
        memcpy(in.q.stride, qs, sizeof qs), memcpy(in.k.stride, ks, sizeof ks);
        memcpy(in.v.stride, vs, sizeof vs);
        attn_outputs o;
        attn_outputs_init(&o);
        o.out = attn_tensor_dense(dt->out), o.lse = attn_tensor_dense(dt->lse);
        attn_plan *bp = attn_dist_ring_block_plan(plan, b);
        attn_status st = attn_plan_forward(bp, &in, ws, ws_size, &o);
        if (st == ATTN_STATUS_OK && backward) {
          attn_tensor d = attn_tensor_dense(dt->dout + (size_t)(q0 * Wo) * es);
          memcpy(d.stride, ds, sizeof ds);
          attn_grads g;
          attn_grads_init(&g);
          g.dq = attn_tensor_dense(dt->dq), g.dk = attn_tensor_dense(dt->dk);
          g.dv = attn_tensor_dense(dt->dv);
          st = attn_plan_backward(bp, &in, &o, &d, ws, ws_size, &g);
        }
        if (st != ATTN_STATUS_OK) die("a block call", "failed");
      }
    if (dev_ops->stream_sync(0, stream, why, sizeof why) != ATTN_STATUS_OK) die("sync", why);
    if (it >= 0) times[it] = now() - t0;
  }
  const double t = median(times, iters);
  free(times);
  if (ws != NULL) gpu->release(0, ws);
  return t;
}

static void *run_rank(void *arg) {
  rank_job *j = arg;
  const host_data *h = j->h;
  const attn_problem *p = &h->p;
  attn_ctx *ctx;
  attn_ctx_create(&ctx);
  attn_dist_plan *plan = NULL;
  attn_status st = attn_dist_plan_create(ctx, p, j->spec, ATTN_DIST_TRANSPORT_TEST_LOOPBACK,
                                         j->comm, NULL, &plan);
  if (st != ATTN_STATUS_OK) {
    snprintf(j->error, sizeof j->error, "plan: %s", attn_ctx_last_error(ctx));
    attn_ctx_destroy(ctx);
    return NULL; /* the others fail their plans' agreement check likewise */
  }
  attn_problem l;
  attn_dist_plan_local_problem(plan, &l, NULL);
  const int64_t Dv = l.head_dim_v > 0 ? l.head_dim_v : l.head_dim;
  int64_t *qmap = malloc(sizeof(int64_t) * (size_t)l.seqlen_q);
  int64_t *kmap = malloc(sizeof(int64_t) * (size_t)l.seqlen_k);
  for (int64_t i = 0; i < l.seqlen_q; ++i) qmap[i] = attn_dist_plan_position(plan, p->seqlen_q, i);
  for (int64_t i = 0; i < l.seqlen_k; ++i) kmap[i] = attn_dist_plan_position(plan, p->seqlen_k, i);
  const int64_t B = l.batch, Wq = l.heads_q * l.head_dim, Wk = l.heads_kv * l.head_dim;
  const int64_t Wv = l.heads_kv * Dv, Wo = l.heads_q * Dv;
  void *hq = gather_rows(h->q, B, p->seqlen_q, l.seqlen_q, qmap, Wq, h->es);
  void *hk = gather_rows(h->k, B, p->seqlen_k, l.seqlen_k, kmap, Wk, h->es);
  void *hv = gather_rows(h->v, B, p->seqlen_k, l.seqlen_k, kmap, Wv, h->es);
  void *hd = gather_rows(h->dout, B, p->seqlen_q, l.seqlen_q, qmap, Wo, h->es);
  dev_tensors dt = upload_tensors(&l, h->es, hq, hk, hv, hd);
  free(hq), free(hk), free(hv), free(hd);
  const int64_t n_lse = B * l.heads_q * l.seqlen_q;
  char why[512] = "";
  void *stream = NULL;
  if (dev_ops->stream_create(0, &stream, why, sizeof why) != ATTN_STATUS_OK) die("stream", why);
  attn_dist_plan_set_stream(plan, stream);
  if (gpu->synchronize(0, why, sizeof why) != ATTN_STATUS_OK) die("uploads", why);
  attn_inputs in;
  attn_outputs o;
  attn_grads g;
  attn_tensor dout_t;
  bind_tensors(&dt, &in, &o, &g, &dout_t);
  int ok = 1;
  for (int it = -1; it < j->iters; ++it) { /* it = -1: warm-up */
    pthread_barrier_wait(j->barrier);
    const double t0 = now();
    if (ok) ok = attn_dist_plan_forward(plan, &in, &o) == ATTN_STATUS_OK;
    if (ok) attn_dist_plan_last_stats(plan, &j->fwd_stats);
    if (ok && j->backward)
      ok = attn_dist_plan_backward(plan, &in, &o, &dout_t, &g) == ATTN_STATUS_OK;
    if (ok && j->backward) attn_dist_plan_last_stats(plan, &j->bwd_stats);
    if (ok) ok = dev_ops->stream_sync(0, stream, why, sizeof why) == ATTN_STATUS_OK;
    pthread_barrier_wait(j->barrier); /* a pass ends when every rank's is done */
    if (j->rank == 0 && it >= 0) j->times[it] = now() - t0;
  }
  if (!ok) snprintf(j->error, sizeof j->error, "%s %s", attn_ctx_last_error(ctx), why);
  j->ok = ok;
  if (ok) { /* validation: the lse rows against the whole problem's */
    float *got = malloc((size_t)n_lse * 4);
    if (got == NULL ||
        gpu->download(0, got, dt.lse, (size_t)n_lse * 4, why, sizeof why) != ATTN_STATUS_OK)
      die("download", why);
    double err = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t hh = 0; hh < l.heads_q; ++hh)
        for (int64_t i = 0; i < l.seqlen_q; ++i) {
          const double want = h->lse[(b * p->heads_q + hh) * p->seqlen_q + qmap[i]];
          const double e = fabs(got[(b * l.heads_q + hh) * l.seqlen_q + i] - want);
          if (!(e <= err)) err = e;
        }
    j->lse_error = err;
    free(got);
  }
  for (int turn = 0; turn < j->n; ++turn) { /* one rank at a time */
    pthread_barrier_wait(j->barrier);
    if (turn == j->rank && ok)
      j->alone = calls_alone(plan, j->rank, j->n, j->iters, j->backward, stream, &l, h->es, &dt);
  }
  pthread_barrier_wait(j->barrier);
  attn_dist_plan_destroy(plan);
  dev_ops->stream_destroy(0, stream);
  release_tensors(&dt);
  free(qmap), free(kmap);
  attn_ctx_destroy(ctx);
  return NULL;
}

/* The whole problem on the GPU: median seconds per pass; keeps its lse in h. */
static double one_gpu(host_data *h, int iters, int backward) {
  const attn_problem *p = &h->p;
  dev_tensors dt = upload_tensors(p, h->es, h->q, h->k, h->v, h->dout);
  const size_t n_lse = (size_t)(p->batch * p->heads_q * p->seqlen_q);
  attn_ctx *ctx;
  attn_ctx_create(&ctx);
  attn_plan *plan = NULL;
  size_t fws = 0, bws = 0;
  char why[512] = "";
  if (attn_plan_create(ctx, p, NULL, &plan) != ATTN_STATUS_OK ||
      attn_plan_workspace_size(plan, &fws, &bws) != ATTN_STATUS_OK)
    die("the whole problem's plan", attn_ctx_last_error(ctx));
  const size_t ws_size = fws > bws ? fws : bws;
  void *ws = ws_size > 0 ? device_copy(NULL, ws_size) : NULL;
  attn_inputs in;
  attn_outputs o;
  attn_grads g;
  attn_tensor dout_t;
  bind_tensors(&dt, &in, &o, &g, &dout_t);
  double *times = calloc((size_t)iters, sizeof(double));
  for (int it = -1; it < iters; ++it) {
    if (gpu->synchronize(0, why, sizeof why) != ATTN_STATUS_OK) die("synchronize", why);
    const double t0 = now();
    attn_status st = attn_plan_forward(plan, &in, ws, ws_size, &o);
    if (st == ATTN_STATUS_OK && backward)
      st = attn_plan_backward(plan, &in, &o, &dout_t, ws, ws_size, &g);
    if (st != ATTN_STATUS_OK) die("the whole problem", attn_ctx_last_error(ctx));
    if (gpu->synchronize(0, why, sizeof why) != ATTN_STATUS_OK) die("synchronize", why);
    if (it >= 0) times[it] = now() - t0;
  }
  h->lse = malloc(n_lse * 4);
  if (h->lse == NULL ||
      gpu->download(0, h->lse, dt.lse, n_lse * 4, why, sizeof why) != ATTN_STATUS_OK)
    die("download", why);
  const double t = median(times, iters);
  free(times);
  attn_plan_destroy(plan);
  release_tensors(&dt);
  if (ws != NULL) gpu->release(0, ws);
  attn_ctx_destroy(ctx);
  return t;
}

/* The ring of n ranks on this GPU: median seconds per pass (every rank's), or a negative value
 * after printing why it failed. */
static double ring_on_one_gpu(const host_data *h, const attn_dist_spec *spec, int n, int iters,
                              int backward, const char *blocks, attn_dist_stats *fs,
                              attn_dist_stats *bs, double *lse_error, double alone[MAX_RANKS]) {
  if (strcmp(blocks, "pairs") == 0)
    setenv("ATTN_DIST_RING_BLOCKS", "pairs", 1); /* read at plan creation */
  else
    unsetenv("ATTN_DIST_RING_BLOCKS");
  loopback_group world;
  loopback_group_init(&world, n);
  loopback_comm lc[MAX_RANKS];
  pthread_barrier_t barrier;
  pthread_barrier_init(&barrier, NULL, (unsigned)n);
  double *times = calloc((size_t)iters, sizeof(double));
  rank_job jobs[MAX_RANKS];
  pthread_t th[MAX_RANKS];
  for (int r = 0; r < n; ++r) {
    lc[r] = (loopback_comm){&world, r};
    jobs[r] = (rank_job){.h = h,
                         .spec = spec,
                         .rank = r,
                         .n = n,
                         .iters = iters,
                         .backward = backward,
                         .comm = &lc[r],
                         .barrier = &barrier,
                         .times = times};
    pthread_create(&th[r], NULL, run_rank, &jobs[r]);
  }
  for (int r = 0; r < n; ++r) pthread_join(th[r], NULL);
  pthread_barrier_destroy(&barrier);
  double t = median(times, iters);
  *lse_error = 0;
  for (int r = 0; r < n; ++r) {
    if (!jobs[r].ok) {
      printf("ring (%s blocks) rank %d failed: %s\n", blocks, r, jobs[r].error);
      t = -1;
    }
    if (jobs[r].lse_error > *lse_error) *lse_error = jobs[r].lse_error;
  }
  *fs = jobs[0].fwd_stats, *bs = jobs[0].bwd_stats;
  for (int r = 0; r < n; ++r) alone[r] = jobs[r].alone;
  free(times);
  return t;
}

int main(int argc, char **argv) {
  const char *text = NULL;
  int n = 2, iters = 3, backward = 1;
  attn_dist_spec spec;
  attn_dist_spec_init(&spec);
  spec.layout = ATTN_DIST_LAYOUT_ZIGZAG;
  spec.timeout_seconds = 300;
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
    if (strcmp(a, "--ranks") == 0 && ++i)
      n = atoi(v);
    else if (strcmp(a, "--iters") == 0 && ++i)
      iters = atoi(v) > 0 ? atoi(v) : 1;
    else if (strcmp(a, "--layout") == 0 && ++i)
      spec.layout =
          strcmp(v, "contiguous") == 0 ? ATTN_DIST_LAYOUT_CONTIGUOUS : ATTN_DIST_LAYOUT_ZIGZAG;
    else if (strcmp(a, "--forward") == 0)
      backward = 0;
    else if (a[0] != '-')
      text = a;
    else {
      fprintf(stderr, "unknown option %s\n", a);
      return 2;
    }
  }
  if (text == NULL || n < 2 || n > MAX_RANKS) {
    fprintf(stderr,
            "usage: attn_ring_share_bench \"<problem>\" [--ranks 2..%d] [--iters N] "
            "[--layout zigzag|contiguous] [--forward]\n",
            MAX_RANKS);
    return 2;
  }
  spec.num_axes = 1;
  spec.axis_dim[0] = ATTN_DIST_DIM_SEQUENCE;
  spec.axis_size[0] = n;
  gpu = attn_gpu();
  dev_ops = attn_module_dist_ops();
  char why[512] = "";
  int32_t count = 0;
  if (gpu == NULL || dev_ops == NULL ||
      gpu->device_count(&count, why, sizeof why) != ATTN_STATUS_OK || count < 1 ||
      !attn_dist_transport_available(ATTN_DIST_TRANSPORT_TEST_LOOPBACK, why, sizeof why)) {
    printf("SKIP: no GPU, cuda module or loopback module (%s)\n", why);
    return 77;
  }
  host_data h;
  memset(&h, 0, sizeof h);
  attn_ctx *ctx;
  attn_ctx_create(&ctx);
  if (attn_problem_parse(ctx, text, &h.p) != ATTN_STATUS_OK)
    die("problem", attn_ctx_last_error(ctx));
  attn_ctx_destroy(ctx);
  h.p.device = ATTN_DEVICE_CUDA, h.p.device_index = 0;
  const attn_problem *p = &h.p;
  const int64_t Dv = p->head_dim_v > 0 ? p->head_dim_v : p->head_dim;
  h.es = attn_dtype_size((attn_dtype)p->dtype);
  const int64_t nq = p->batch * p->seqlen_q, nk = p->batch * p->seqlen_k;
  h.q = malloc((size_t)(nq * p->heads_q * p->head_dim) * h.es);
  h.k = malloc((size_t)(nk * p->heads_kv * p->head_dim) * h.es);
  h.v = malloc((size_t)(nk * p->heads_kv * Dv) * h.es);
  h.dout = malloc((size_t)(nq * p->heads_q * Dv) * h.es);
  if (h.q == NULL || h.k == NULL || h.v == NULL || h.dout == NULL) die("host memory", "the data");
  fill(h.q, (attn_dtype)p->dtype, nq * p->heads_q * p->head_dim, 1);
  fill(h.k, (attn_dtype)p->dtype, nk * p->heads_kv * p->head_dim, 2);
  fill(h.v, (attn_dtype)p->dtype, nk * p->heads_kv * Dv, 3);
  fill(h.dout, (attn_dtype)p->dtype, nq * p->heads_q * Dv, 4);

  const char *pass = backward ? "forward+backward" : "forward";
  const double t1 = one_gpu(&h, iters, backward);
  printf("%s: one GPU, the whole problem: %.1f ms per %s (median of %d)\n", text, 1e3 * t1, pass,
         iters);
  const char *modes[2] = {"hull", "pairs"};
  double share[2] = {0, 0}, slowest[2] = {0, 0};
  for (int m = 0; m < 2; ++m) {
    attn_dist_stats fs, bs;
    double lse_error = 0, alone[MAX_RANKS];
    const double t =
        ring_on_one_gpu(&h, &spec, n, iters, backward, modes[m], &fs, &bs, &lse_error, alone);
    if (t < 0) return 1;
    share[m] = t / n;
    printf("ring of %d (%s), %s blocks: rank 0 makes %d forward calls in %d steps (backward the "
           "same); lse max error %.2g%s\n",
           n, spec.layout == ATTN_DIST_LAYOUT_ZIGZAG ? "zigzag" : "contiguous", modes[m],
           (int)fs.blocks, (int)fs.steps, lse_error, lse_error <= 1e-3 ? "" : " FAIL");
    if (!(lse_error <= 1e-3)) return 1;
    printf("  all ranks at once on this GPU: %.1f ms per %s (merges and sums included), over %d: "
           "%.1f ms\n  each rank's block calls alone:",
           1e3 * t, pass, n, 1e3 * share[m]);
    for (int r = 0; r < n; ++r) {
      printf(" %.1f", 1e3 * alone[r]);
      if (alone[r] > slowest[m]) slowest[m] = alone[r];
    }
    printf(" ms\n");
  }
  printf(
      "compute-bound speedup on %d GPUs, one GPU over the slowest rank's calls alone: %.3fx with "
      "the hull, %.3fx with pairs (hull calls %.1f%% faster); over all ranks at once / %d: "
      "%.3fx, %.3fx\n",
      n, t1 / slowest[0], t1 / slowest[1], 100.0 * (slowest[1] / slowest[0] - 1.0), n,
      t1 / share[0], t1 / share[1]);
  free(h.q), free(h.k), free(h.v), free(h.dout), free(h.lse);
  return 0;
}
