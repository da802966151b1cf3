/*
 * tests/nccl/test_dist_nccl.c - distributed attention over NCCL on the GPUs of one machine: one
 * process, one thread per GPU (ncclCommInitAll), so the test needs no MPI launcher.
 *
 * Each thread computes the global problem alone on its GPU (the oracle), then its shard through
 * a distributed plan over the NCCL transport, and compares its slice: batch and head splits
 * (tests/test_dist_gpu.c runs the sequence splits over NCCL and loopback), causal, GQA, per-head
 * sinks with dsinks summed over the batch ranks, and a bias broadcast over batch whose dbias is
 * summed over them; then the agreement check (one GPU describes another problem: both are told
 * which field) and a refusal of the device ring (dropout on key chunks not a multiple of 4).
 * Exit 77 (skipped) without 2 GPUs, the NCCL module or a GPU implementation.
 */
#include "attn.h"
#include "attn_dist.h"
#include "testutil.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NDEV 2

static ncclComm_t comms[NDEV];
static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER;
static int skipped = 0;

static void *upload(const tu_buf *b) {
  void *d = NULL;
  const size_t bytes = (size_t)b->n * attn_dtype_size(b->dtype);
  if (cudaMalloc(&d, bytes + 16) != cudaSuccess) return NULL;
  cudaMemcpy(d, b->data, bytes, cudaMemcpyHostToDevice);
  return d;
}

static tu_buf download(const void *d, attn_dtype dt, int64_t n) {
  tu_buf b = tu_buf_new(dt, n);
  cudaMemcpy(b.data, d, (size_t)n * attn_dtype_size(dt), cudaMemcpyDeviceToHost);
  return b;
}

static void compare(int dev, const char *what, const tu_buf *a, const tu_buf *r, double tol) {
  double scale = 1;
  const double err = tu_max_error(a, r, &scale);
  pthread_mutex_lock(&report_lock);
  tu_check(err <= tol * scale, "gpu %d %s: max error %.3g (tolerance %.3g)", dev, what, err,
           tol * scale);
  pthread_mutex_unlock(&report_lock);
}

/* The arguments of a run of this test's problem: dense tensors, with a bias and sinks. */
static void with_bias_sinks(tu_args *x, void *q, void *k, void *v, void *out, void *lse, void *dout,
                            void *dq, void *dk, void *dv, void *bias, void *sinks, void *dbias,
                            void *dsinks) {
  tu_args_dense(x, q, k, v, out, lse, dout, dq, dk, dv);
  x->in.bias = attn_tensor_dense(bias), x->in.sinks = attn_tensor_dense(sinks);
  x->grads.dbias = attn_tensor_dense(dbias), x->grads.dsinks = attn_tensor_dense(dsinks);
}

typedef struct job {
  int dev;
  int axis_dim; /* ATTN_DIST_DIM_BATCH or HEADS */
} job;

enum { B = 2, T = 256, HQ = 8, HKV = 4, D = 64, S = 2 };

static void *run(void *arg) {
  const job *j = arg;
  const int dev = j->dev;
  cudaSetDevice(dev);
  attn_ctx *ctx;
  attn_ctx_create(&ctx);
  attn_problem p;
  attn_problem_init(&p);
  p.dtype = ATTN_DTYPE_BF16, p.device = ATTN_DEVICE_CUDA, p.device_index = dev;
  p.batch = B, p.seqlen_q = p.seqlen_k = T, p.heads_q = HQ, p.heads_kv = HKV, p.head_dim = D;
  p.causal = 1, p.num_sinks = S;
  p.has_bias = 1, p.bias_dtype = ATTN_DTYPE_BF16;
  p.bias_shape[0] = 1, p.bias_shape[1] = HQ, p.bias_shape[2] = T, p.bias_shape[3] = T;

  /* The same global data on every thread. */
  tu_rng rng = tu_rng_make(1234);
  tu_buf q = tu_buf_new(ATTN_DTYPE_BF16, B * T * HQ * D),
         k = tu_buf_new(ATTN_DTYPE_BF16, B * T * HKV * D);
  tu_buf v = tu_buf_new(ATTN_DTYPE_BF16, B * T * HKV * D),
         dout = tu_buf_new(ATTN_DTYPE_BF16, B * T * HQ * D);
  tu_buf bias = tu_buf_new(ATTN_DTYPE_BF16, HQ * T * T), sinks = tu_buf_new(ATTN_DTYPE_F32, HQ * S);
  tu_fill_uniform(&q, &rng, -1, 1), tu_fill_uniform(&k, &rng, -1, 1),
      tu_fill_uniform(&v, &rng, -1, 1);
  tu_fill_uniform(&dout, &rng, -1, 1), tu_fill_uniform(&bias, &rng, -1, 1),
      tu_fill_uniform(&sinks, &rng, -1, 1);

  /* The oracle: the global problem on this GPU alone. */
  void *dq_ = upload(&q), *dk_ = upload(&k), *dv_ = upload(&v), *ddout = upload(&dout);
  void *dbias_in = upload(&bias), *dsinks_in = upload(&sinks);
  tu_buf zeros_o = tu_buf_new(ATTN_DTYPE_BF16, B * T * HQ * D),
         zeros_l = tu_buf_new(ATTN_DTYPE_F32, B * HQ * T);
  void *gout = upload(&zeros_o), *glse = upload(&zeros_l), *gdq = upload(&zeros_o);
  void *gdk = upload(&k), *gdv = upload(&v), *gdbias = upload(&bias), *gdsinks = upload(&sinks);
  tu_args x;
  with_bias_sinks(&x, dq_, dk_, dv_, gout, glse, ddout, gdq, gdk, gdv, dbias_in, dsinks_in, gdbias,
                  gdsinks);
  if (attn_forward(ctx, &p, &x.in, &x.out) != ATTN_STATUS_OK ||
      attn_backward(ctx, &p, &x.in, &x.out, &x.dout, &x.grads) != ATTN_STATUS_OK) {
    pthread_mutex_lock(&report_lock);
    fprintf(stderr, "gpu %d: the single-GPU problem does not run here (%s): skipped\n", dev,
            attn_ctx_last_error(ctx));
    skipped = 1;
    pthread_mutex_unlock(&report_lock);
  }
  tu_buf r_out = download(gout, ATTN_DTYPE_BF16, B * T * HQ * D),
         r_lse = download(glse, ATTN_DTYPE_F32, B * HQ * T);
  tu_buf r_dq = download(gdq, ATTN_DTYPE_BF16, B * T * HQ * D),
         r_dk = download(gdk, ATTN_DTYPE_BF16, B * T * HKV * D);
  tu_buf r_dv = download(gdv, ATTN_DTYPE_BF16, B * T * HKV * D),
         r_dbias = download(gdbias, ATTN_DTYPE_BF16, HQ * T * T);
  tu_buf r_dsinks = download(gdsinks, ATTN_DTYPE_F32, HQ * S);

  /* The distributed run: this GPU's shard. Every thread makes the same collective calls, even one
   * whose oracle failed (it then reports nothing). */
  attn_dist_spec spec;
  attn_dist_spec_init(&spec);
  spec.axis_dim[0] = j->axis_dim;
  attn_dist_plan *plan = NULL;
  attn_status st =
      attn_dist_plan_create(ctx, &p, &spec, ATTN_DIST_TRANSPORT_NCCL, &comms[dev], NULL, &plan);
  pthread_mutex_lock(&report_lock);
  tu_check(st == ATTN_STATUS_OK || skipped, "gpu %d plan (%s): %s", dev,
           j->axis_dim == ATTN_DIST_DIM_BATCH ? "batch" : "heads", attn_ctx_last_error(ctx));
  pthread_mutex_unlock(&report_lock);
  if (st == ATTN_STATUS_OK) {
    const int by_batch = j->axis_dim == ATTN_DIST_DIM_BATCH;
    const int64_t bl = by_batch ? B / NDEV : B, b0 = by_batch ? dev * bl : 0;
    const int64_t hl = by_batch ? HQ : HQ / NDEV, h0 = by_batch ? 0 : dev * hl;
    const int64_t kl = by_batch ? HKV : HKV / NDEV, k0 = by_batch ? 0 : dev * kl;
    const int64_t sq[4] = {B, T, HQ, D}, sk[4] = {B, T, HKV, D}, sl[4] = {B, HQ, T, 1};
    const int64_t sb[4] = {1, HQ, T, T}, ss[4] = {HQ, S, 1, 1};
    const int64_t aq[4] = {b0, 0, h0, 0}, nq[4] = {bl, T, hl, D};
    const int64_t ak[4] = {b0, 0, k0, 0}, nk[4] = {bl, T, kl, D};
    const int64_t al[4] = {b0, h0, 0, 0}, nl[4] = {bl, hl, T, 1};
    const int64_t ab[4] = {0, h0, 0, 0}, nb[4] = {1, hl, T, T};
    const int64_t as[4] = {h0, 0, 0, 0}, ns[4] = {hl, S, 1, 1};
    tu_buf lq = tu_box4(&q, sq, aq, nq, NULL), lk = tu_box4(&k, sk, ak, nk, NULL),
           lv = tu_box4(&v, sk, ak, nk, NULL);
    tu_buf ldout = tu_box4(&dout, sq, aq, nq, NULL), lbias = tu_box4(&bias, sb, ab, nb, NULL),
           lsinks = tu_box4(&sinks, ss, as, ns, NULL);
    tu_buf zo = tu_buf_new(ATTN_DTYPE_BF16, lq.n), zl = tu_buf_new(ATTN_DTYPE_F32, bl * hl * T);
    void *xq = upload(&lq), *xk = upload(&lk), *xv = upload(&lv), *xdout = upload(&ldout);
    void *xbias = upload(&lbias), *xsinks = upload(&lsinks);
    void *xout = upload(&zo), *xlse = upload(&zl), *xdq = upload(&zo), *xdk = upload(&lk),
         *xdv = upload(&lv);
    void *xdbias = upload(&lbias), *xdsinks = upload(&lsinks);
    tu_args lx;
    with_bias_sinks(&lx, xq, xk, xv, xout, xlse, xdout, xdq, xdk, xdv, xbias, xsinks, xdbias,
                    xdsinks);
    st = attn_dist_plan_forward(plan, &lx.in, &lx.out);
    if (st == ATTN_STATUS_OK)
      st = attn_dist_plan_backward(plan, &lx.in, &lx.out, &lx.dout, &lx.grads);
    cudaDeviceSynchronize();
    pthread_mutex_lock(&report_lock);
    tu_check(st == ATTN_STATUS_OK, "gpu %d runs: %s", dev, attn_ctx_last_error(ctx));
    pthread_mutex_unlock(&report_lock);
    if (st == ATTN_STATUS_OK && !skipped) {
      tu_buf e_out = tu_box4(&r_out, sq, aq, nq, NULL), e_lse = tu_box4(&r_lse, sl, al, nl, NULL),
             e_dq = tu_box4(&r_dq, sq, aq, nq, NULL);
      tu_buf e_dk = tu_box4(&r_dk, sk, ak, nk, NULL), e_dv = tu_box4(&r_dv, sk, ak, nk, NULL);
      tu_buf e_dbias = tu_box4(&r_dbias, sb, ab, nb, NULL),
             e_dsinks = tu_box4(&r_dsinks, ss, as, ns, NULL);
      tu_buf g_out = download(xout, ATTN_DTYPE_BF16, lq.n),
             g_lse = download(xlse, ATTN_DTYPE_F32, zl.n);
      tu_buf g_dq = download(xdq, ATTN_DTYPE_BF16, lq.n),
             g_dk = download(xdk, ATTN_DTYPE_BF16, lk.n);
      tu_buf g_dv = download(xdv, ATTN_DTYPE_BF16, lv.n),
             g_dbias = download(xdbias, ATTN_DTYPE_BF16, lbias.n);
      tu_buf g_dsinks = download(xdsinks, ATTN_DTYPE_F32, lsinks.n);
      /* The same implementation on the same GPU kind: equal but for the order of the sums over
       * ranks (dbias, dsinks), so bf16's rounding is the tolerance. */
      compare(dev, "out", &g_out, &e_out, 1e-2), compare(dev, "lse", &g_lse, &e_lse, 1e-4);
      compare(dev, "dq", &g_dq, &e_dq, 2e-2), compare(dev, "dk", &g_dk, &e_dk, 2e-2);
      compare(dev, "dv", &g_dv, &e_dv, 2e-2), compare(dev, "dbias", &g_dbias, &e_dbias, 2e-2);
      compare(dev, "dsinks", &g_dsinks, &e_dsinks, 1e-3);
      tu_buf *bufs[] = {&e_out, &e_lse, &e_dq, &e_dk, &e_dv, &e_dbias, &e_dsinks,
                        &g_out, &g_lse, &g_dq, &g_dk, &g_dv, &g_dbias, &g_dsinks};
      for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i) tu_buf_free(bufs[i]);
    }
    void *dev_bufs[] = {xq,   xk,  xv,  xdout, xbias,  xsinks, xout,
                        xlse, xdq, xdk, xdv,   xdbias, xdsinks};
    for (size_t i = 0; i < sizeof dev_bufs / sizeof dev_bufs[0]; ++i) cudaFree(dev_bufs[i]);
    tu_buf *hb[] = {&lq, &lk, &lv, &ldout, &lbias, &lsinks, &zo, &zl};
    for (size_t i = 0; i < sizeof hb / sizeof hb[0]; ++i) tu_buf_free(hb[i]);
    attn_dist_plan_destroy(plan);
  }

  /* Ranks that disagree are told which field and which rank. */
  attn_problem odd = p;
  if (dev == 1) odd.head_dim = 32;
  st = attn_dist_plan_create(ctx, &odd, &spec, ATTN_DIST_TRANSPORT_NCCL, &comms[dev], NULL, &plan);
  pthread_mutex_lock(&report_lock);
  tu_check(st == ATTN_STATUS_INVALID_ARGUMENT &&
               strstr(attn_ctx_last_error(ctx), "problem.head_dim"),
           "gpu %d: disagreeing ranks refused (%s)", dev, attn_ctx_last_error(ctx));
  pthread_mutex_unlock(&report_lock);
  attn_dist_plan_destroy(plan);

  /* What the device ring cannot run is refused with the reason, on every rank: dropout on key
   * chunks of 5 keys (the kernels share a Philox call among 4). test_dist_gpu.c runs the ring and
   * the all-to-all of CUDA tensors over NCCL. */
  attn_problem dropped = p;
  dropped.dropout_p = 0.1;
  dropped.seqlen_q = dropped.seqlen_k = 2 * NDEV * 5;
  dropped.bias_shape[2] = dropped.bias_shape[3] = dropped.seqlen_q;
  spec.axis_dim[0] = ATTN_DIST_DIM_SEQUENCE;
  spec.layout = ATTN_DIST_LAYOUT_ZIGZAG;
  st = attn_dist_plan_create(ctx, &dropped, &spec, ATTN_DIST_TRANSPORT_NCCL, &comms[dev], NULL,
                             &plan);
  pthread_mutex_lock(&report_lock);
  tu_check(st == ATTN_STATUS_UNSUPPORTED && strstr(attn_ctx_last_error(ctx), "multiple of 4"),
           "gpu %d: ring dropout on chunks of 5 keys refused (%s)", dev, attn_ctx_last_error(ctx));
  pthread_mutex_unlock(&report_lock);
  attn_dist_plan_destroy(plan);

  void *dev_bufs[] = {dq_,  dk_, dv_, ddout, dbias_in, dsinks_in, gout,
                      glse, gdq, gdk, gdv,   gdbias,   gdsinks};
  for (size_t i = 0; i < sizeof dev_bufs / sizeof dev_bufs[0]; ++i) cudaFree(dev_bufs[i]);
  tu_buf *hb[] = {&q,     &k,     &v,    &dout, &bias, &sinks,   &zeros_o, &zeros_l,
                  &r_out, &r_lse, &r_dq, &r_dk, &r_dv, &r_dbias, &r_dsinks};
  for (size_t i = 0; i < sizeof hb / sizeof hb[0]; ++i) tu_buf_free(hb[i]);
  attn_ctx_destroy(ctx);
  return NULL;
}

int main(void) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < NDEV) {
    printf("test_dist_nccl: needs %d GPUs, found %d: skipped\n", NDEV, count);
    return 77;
  }
  char why[512];
  if (!attn_dist_transport_available(ATTN_DIST_TRANSPORT_NCCL, why, sizeof why)) {
    printf("test_dist_nccl: %s: skipped\n", why);
    return 77;
  }
  int devs[NDEV];
  for (int i = 0; i < NDEV; ++i) devs[i] = i;
  if (ncclCommInitAll(comms, NDEV, devs) != ncclSuccess) {
    printf("test_dist_nccl: ncclCommInitAll failed\n");
    return 1;
  }
  const int dims[2] = {ATTN_DIST_DIM_BATCH, ATTN_DIST_DIM_HEADS};
  for (int d = 0; d < 2; ++d) {
    pthread_t threads[NDEV];
    job jobs[NDEV];
    for (int i = 0; i < NDEV; ++i) {
      jobs[i].dev = i, jobs[i].axis_dim = dims[d];
      pthread_create(&threads[i], NULL, run, &jobs[i]);
    }
    for (int i = 0; i < NDEV; ++i) pthread_join(threads[i], NULL);
  }
  for (int i = 0; i < NDEV; ++i) ncclCommDestroy(comms[i]);
  if (skipped && tu_failures() == 0) return 77;
  return tu_finish();
}
