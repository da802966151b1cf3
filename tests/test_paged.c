/*
 * tests/test_paged.c - the paged KV cache (docs/DECODE.md) against dense attention on the same data.
 *
 * Each case draws dense q, k, v (rounded to the dtype) and per-sequence key lengths, then builds the
 * paged form of the same cache: the rows of sequence b scattered over shuffled pages of a pool whose
 * unused rows, unused pages and (for decode shapes) pages wholly outside the window hold NaN, so a
 * read of any of them shows in the result. The oracle is the reference in f64 on the dense form
 * (padded varlen with the same lengths: bottom-right alignment to each sequence's length is the
 * same rule); every implementation that takes the paged problem must agree within SPEC.md's
 * tolerance (tests/tolerance.h), out and lse. With seqlen_new > 0 the last rows of each sequence
 * are given as k_new / v_new instead, and must also land in the pool bit for bit.
 *
 * Page sizes 1, 16, 64, 256; lengths 0, 1, odd, a page boundary +- 1; Tq 1 to 5 (decode,
 * speculative) and 40 (chunked prefill); GQA, MQA; every feature decode uses alone and combined:
 * causal, sliding windows, soft cap, sinks (per head and shared), ALiBi (per head and per batch
 * and head); dense decode problems (no pages) on the same kernels; the rules of validation; the
 * problem strings. CUDA problems (device=cuda) run when a GPU module and device are present: paged
 * ones on cuda (its split-KV kernel) and on cudnn (cuDNN's paged attention; the grid and the cases
 * cuDNN takes: decode on every page size, every feature it has alone and with the others, a bias,
 * strided pools), dense decode ones on cuda's "splitkv" configuration, outputs written over NaN
 * (an element left unwritten fails); a GPU case cuda does not take
 * is reported as skipped, and one cudnn refuses must be refused for a limit of cuDNN's that
 * src/impl/cudnn/cudnn.c documents (the reason names it), else the case fails.
 * ATTN_TEST_PAGED_ONLY=cuda (or cudnn) runs only that implementation's GPU cases and none on the
 * CPU (for compute-sanitizer); ATTN_TEST_PAGED_QUICK=1 then keeps cuda to its split cases under
 * four of the decode kernel's data paths (ATTN_CUDA_DECODE), not every one and the grid.
 */
#define _POSIX_C_SOURCE 200112L /* setenv */
#include "testutil.h"

#include "core/dtype.h"
#include "core/gpu.h"
#include "plan/plan.h"
#include "plan/registry.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_B 6

typedef struct pcase {
  attn_dtype dtype;
  int64_t B, Tq, Hq, Hkv, D, Dv, page, seqlen_new;
  int64_t lens[MAX_B]; /* keys of each sequence, appended rows included */
  int causal;
  int64_t wl, wr;
  double softcap;
  int64_t sinks;
  int sinks_shared;
  int alibi;
  int bias;  /* a [B, Hq, Tq, Tk] f32 bias (the cpu's tiled path and the reference) */
  int paged; /* 0: the dense problem (every length is Tk) */
  int top_left; /* align=tl instead of bottom-right */
  int pad;      /* paged pools with 8 unused elements after each head's row (strided tensors) */
  int device;
  const char *config; /* GPU: the cuda configuration to run (NULL: the registry's choice) */
} pcase;

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static void describe(const pcase *c, char *buf, size_t size) {
  int n = snprintf(buf, size,
                   "%s B%lld Tq%lld Hq%lld Hkv%lld D%lld Dv%lld page%lld new%lld causal%d "
                   "window=%lld,%lld softcap=%g sinks=%lld%s alibi=%d bias=%d %s%s%s lens=",
                   attn_dtype_name(c->dtype), (long long)c->B, (long long)c->Tq, (long long)c->Hq,
                   (long long)c->Hkv, (long long)c->D, (long long)c->Dv, (long long)c->page,
                   (long long)c->seqlen_new, c->causal, (long long)c->wl, (long long)c->wr,
                   c->softcap, (long long)c->sinks, c->sinks_shared ? ":shared" : "", c->alibi,
                   c->bias, c->paged ? "paged" : "dense", c->top_left ? " align=tl" : "",
                   c->pad ? " padded-rows" : "");
  for (int64_t b = 0; b < c->B && n > 0 && (size_t)n < size; ++b)
    n += snprintf(buf + n, size - (size_t)n, "%s%lld", b ? "," : "", (long long)c->lens[b]);
}

/* A device buffer of bytes holding 0xff in every byte, NaN in every float format, so that an
 * output element the implementation leaves unwritten fails the comparison; NULL on failure. */
static void *upload_poison(const attn_gpu_ops *gpu, size_t bytes);

/* A device copy of a host buffer (GPU cases); NULL when the copy fails. */
static void *upload(const attn_gpu_ops *gpu, const void *host, size_t bytes) {
  char why[256];
  void *dev = NULL;
  if (gpu->alloc(0, bytes > 0 ? bytes : 1, &dev, why, sizeof why) != ATTN_STATUS_OK) return NULL;
  if (bytes > 0 && gpu->upload(0, dev, host, bytes, why, sizeof why) != ATTN_STATUS_OK) {
    gpu->release(0, dev);
    return NULL;
  }
  return dev;
}

static void *upload_poison(const attn_gpu_ops *gpu, size_t bytes) {
  unsigned char *nan = malloc(bytes > 0 ? bytes : 1);
  if (nan == NULL) return NULL;
  memset(nan, 0xff, bytes);
  void *dev = upload(gpu, nan, bytes);
  free(nan);
  return dev;
}

static size_t buf_bytes(const tu_buf *b) { return (size_t)b->n * attn_dtype_size(b->dtype); }

/* Runs the problem with implementation impl (NULL: any) and rounding; status of the plan or run.
 * GPU problems get device copies of every input and bring out and lse back, written over NaN. */
static attn_status run(attn_ctx *ctx, const attn_problem *p, const char *impl, const char *config,
                       attn_dtype rounding,
                       attn_inputs *in, tu_buf *out, tu_buf *lse, tu_buf *const uploads[],
                       int n_uploads, const int32_t *cache_seqlens, int64_t batch) {
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = impl;
  if (p->device != ATTN_DEVICE_CPU && config != NULL) /* a configuration of the split-KV kernel */
    sel.impl = "cuda", sel.config = config;
  else if (p->device != ATTN_DEVICE_CPU && p->page_size == 0) /* a dense decode problem on the GPU: */
    sel.impl = "cuda", sel.config = "splitkv";               /* the split-KV kernel, not the default */
  attn_plan *plan = NULL;
  attn_status st = attn_plan_create(ctx, p, &sel, &plan);
  if (st != ATTN_STATUS_OK) return st;
  if (rounding != ATTN_DTYPE_F64) attn_plan_set_rounding(plan, rounding);
  attn_outputs o;
  attn_outputs_init(&o);
  if (p->device == ATTN_DEVICE_CPU) {
    o.out = tu_tensor(out);
    o.lse = tu_tensor(lse);
    st = attn_plan_forward(plan, in, NULL, 0, &o);
    attn_plan_destroy(plan);
    return st;
  }
  /* GPU: mirror the inputs (each buffer of uploads replaced in a copy of in by its device copy). */
  const attn_gpu_ops *gpu = attn_gpu();
  attn_inputs din = *in;
  void *dev[16] = {NULL};
  attn_tensor *fields[] = {&din.q, &din.k, &din.v, &din.sinks, &din.alibi_slopes, &din.bias,
                           &din.block_table, &din.k_new, &din.v_new};
  int ok = 1;
  for (int i = 0; i < n_uploads && i < 9; ++i) {
    if (uploads[i] == NULL || fields[i]->data == NULL) continue;
    dev[i] = upload(gpu, uploads[i]->data, buf_bytes(uploads[i]));
    ok &= dev[i] != NULL;
    fields[i]->data = dev[i];
  }
  void *dlens = cache_seqlens ? upload(gpu, cache_seqlens, (size_t)batch * sizeof(int32_t)) : NULL;
  void *dout = upload_poison(gpu, buf_bytes(out)), *dlse = upload_poison(gpu, buf_bytes(lse));
  din.cache_seqlens = dlens;
  size_t ws = 0;
  void *dws = NULL;
  char why[256];
  attn_plan_workspace_size(plan, &ws, NULL);
  if (ws > 0 && gpu->alloc(0, ws, &dws, why, sizeof why) != ATTN_STATUS_OK) ok = 0;
  if (!ok || dout == NULL || dlse == NULL || (cache_seqlens && dlens == NULL)) {
    st = ATTN_STATUS_DEVICE_ERROR;
  } else {
    o.out = attn_tensor_dense(dout);
    o.lse = attn_tensor_dense(dlse);
    st = attn_plan_forward(plan, &din, dws, ws, &o);
    if (st == ATTN_STATUS_OK && (gpu->synchronize(0, why, sizeof why) != ATTN_STATUS_OK ||
                                 gpu->download(0, out->data, dout, buf_bytes(out), why, sizeof why) !=
                                     ATTN_STATUS_OK ||
                                 gpu->download(0, lse->data, dlse, buf_bytes(lse), why, sizeof why) !=
                                     ATTN_STATUS_OK))
      st = ATTN_STATUS_DEVICE_ERROR;
  }
  for (int i = 0; i < 16; ++i) gpu->release(0, dev[i]);
  gpu->release(0, dlens), gpu->release(0, dout), gpu->release(0, dlse), gpu->release(0, dws);
  attn_plan_destroy(plan);
  return st;
}

static int is_cudnn(const char *impl) { return impl != NULL && strcmp(impl, "cudnn") == 0; }

/* Whether the decode path's promise applies: pages wholly outside the window are never read (the
 * reference never reads a key it does not see at all). cuDNN makes no such promise: with NaN in
 * the pages outside a band of window 7,3, its output was NaN (H100, cuDNN 9.19), so it reads key
 * tiles the window masks whole and multiplies their zero probabilities by their values. Those
 * pages belong to the sequence and hold its keys, so a cache never has NaN there; only the
 * speed suffers (bench/RESULTS.md). */
static int poison_window(const pcase *c, const char *impl) {
  return c->Tq <= 16 && !c->bias && !is_cudnn(impl);
}

static int skipped_gpu, cudnn_ran, cudnn_refused;

/* Whether msg, cudnn's refusal of c (whose cache is Tk keys wide), names a limit of cuDNN that
 * src/impl/cudnn/cudnn.c documents and c has: one keyword of each limit c meets. */
static int cudnn_documented(const pcase *c, int64_t Tk, const char *msg) {
  const char *limits[16];
  int n = 0;
  const int band = c->causal || c->wl >= 0 || c->wr >= 0;
  if (c->dtype != ATTN_DTYPE_BF16 && c->dtype != ATTN_DTYPE_F16) limits[n++] = "dtype=";
  if (c->sinks) limits[n++] = "num_sinks=";
  if (c->softcap > 0.0) limits[n++] = "softcap=";
  if (c->alibi == ATTN_ALIBI_PER_BATCH_HEAD) limits[n++] = "alibi=per_batch_head";
  if (c->alibi == ATTN_ALIBI_PER_HEAD && !(c->causal && c->wl < 0 && c->top_left))
    limits[n++] = "alibi: cuDNN adds ALiBi only";
  if ((c->bias || c->alibi) && band && !c->top_left) limits[n++] = "does not combine with a bias";
  if (c->paged && c->seqlen_new > 0) limits[n++] = "seqlen_new=";
  if (c->paged && (c->page & (c->page - 1)) != 0) limits[n++] = "powers of two";
  if (Tk == 0) limits[n++] = "seqlen_k=0";
  if (c->Tq == 1 && Tk == 1) limits[n++] = "seqlen_q=1 and seqlen_k=1";
  if (c->D % 8 != 0 || c->Dv % 8 != 0) limits[n++] = "multiples of 8";
  if (c->D > 128 || c->Dv > 128) limits[n++] = "head dims up to 128"; /* cuDNN before 9.10 */
  if (c->wl >= 0 && !c->causal) limits[n++] = "window's left bound";  /* cuDNN before 9.10.2 */
  if (c->paged) limits[n++] = "has no paged attention";               /* cuDNN before 9.5 */
  if (c->paged && c->Tq > 1) limits[n++] = "is taken for decode only";
  for (int i = 0; i < n; ++i)
    if (strstr(msg, limits[i]) != NULL) return 1;
  return 0;
}

/* One case on one implementation: 1 if it passed (or was skipped). */
static int check_case(attn_ctx *ctx, const pcase *c, const char *impl, tu_rng *rng) {
  char what[512];
  describe(c, what, sizeof what);
  const attn_dtype dt = c->dtype, st = attn_stat_dtype(dt);
  const int64_t B = c->B, Tq = c->Tq, Hq = c->Hq, Hkv = c->Hkv, D = c->D, Dv = c->Dv;
  int64_t Tk = 0;
  for (int64_t b = 0; b < B; ++b) Tk = max64(Tk, c->lens[b]);
  if (c->paged) Tk += tu_int(rng, 0, 2); /* seqlen_k may exceed every length */

  /* dense data, rounded to the dtype, in f64 */
  tu_buf q = tu_buf_new(ATTN_DTYPE_F64, B * Tq * Hq * D), k = tu_buf_new(ATTN_DTYPE_F64, B * Tk * Hkv * D);
  tu_buf v = tu_buf_new(ATTN_DTYPE_F64, B * Tk * Hkv * Dv);
  tu_buf *dense[3] = {&q, &k, &v};
  for (int t = 0; t < 3; ++t)
    for (int64_t i = 0; i < dense[t]->n; ++i) tu_set(dense[t], i, attn_round_to(dt, tu_uniform(rng, -1, 1)));
  tu_buf sinks = tu_buf_new(ATTN_DTYPE_F64, c->sinks_shared ? c->sinks : Hq * c->sinks);
  tu_fill_uniform(&sinks, rng, -1.0, 1.5);
  tu_buf slopes = tu_buf_new(ATTN_DTYPE_F64, c->alibi == ATTN_ALIBI_PER_BATCH_HEAD ? B * Hq : Hq);
  tu_fill_uniform(&slopes, rng, 0.02, 0.3);
  tu_buf bias = tu_buf_new(ATTN_DTYPE_F64, c->bias ? B * Hq * Tq * Tk : 0);
  tu_fill_uniform(&bias, rng, -1.0, 1.0);
  /* f32 on the CPU; on the GPU the inputs' dtype, the one cuDNN takes */
  const attn_dtype bias_dt = c->device == ATTN_DEVICE_CPU ? ATTN_DTYPE_F32 : dt;
  for (int64_t i = 0; i < bias.n; ++i) tu_set(&bias, i, attn_round_to(bias_dt, tu_get(&bias, i)));

  /* the oracle: the reference in f64 on the dense form, padded varlen with the same lengths */
  attn_problem p;
  attn_problem_init(&p);
  p.batch = B, p.seqlen_q = Tq, p.seqlen_k = Tk, p.heads_q = Hq, p.heads_kv = Hkv;
  p.head_dim = D, p.head_dim_v = Dv == D ? 0 : Dv;
  p.causal = c->causal, p.window_left = c->wl, p.window_right = c->wr, p.softcap = c->softcap;
  p.align = c->top_left ? ATTN_ALIGN_TOP_LEFT : ATTN_ALIGN_BOTTOM_RIGHT;
  p.num_sinks = c->sinks, p.sinks_shared = c->sinks_shared, p.alibi = c->alibi;
  if (c->bias) {
    p.has_bias = 1, p.bias_dtype = bias_dt;
    p.bias_shape[0] = B, p.bias_shape[1] = Hq, p.bias_shape[2] = Tq, p.bias_shape[3] = Tk;
  }
  attn_problem po = p;
  po.dtype = ATTN_DTYPE_F64;
  po.bias_dtype = ATTN_DTYPE_F64;
  po.varlen = ATTN_VARLEN_PADDED;
  int32_t lens_q[MAX_B], lens_k[MAX_B], cache_seqlens[MAX_B];
  for (int64_t b = 0; b < B; ++b) {
    lens_q[b] = (int32_t)Tq, lens_k[b] = (int32_t)c->lens[b];
    cache_seqlens[b] = (int32_t)(c->lens[b] - c->seqlen_new);
  }
  attn_inputs oin;
  attn_inputs_init(&oin);
  oin.q = tu_tensor(&q), oin.k = tu_tensor(&k), oin.v = tu_tensor(&v);
  oin.sinks = tu_tensor(&sinks), oin.alibi_slopes = tu_tensor(&slopes), oin.bias = tu_tensor(&bias);
  oin.seqlens_q = lens_q, oin.seqlens_k = lens_k;
  tu_buf oout = tu_buf_new(ATTN_DTYPE_F64, B * Tq * Hq * Dv), olse = tu_buf_new(ATTN_DTYPE_F64, B * Hq * Tq);
  attn_status status = run(ctx, &po, "ref", NULL, ATTN_DTYPE_F64, &oin, &oout, &olse, NULL, 0, NULL, 0);
  int passed = 1;
  if (status != ATTN_STATUS_OK) {
    tu_check(0, "oracle of %s: %s", what, attn_ctx_last_error(ctx));
    passed = 0;
  }

  /* the tested form, in the dtype */
  p.dtype = dt;
  p.device = c->device;
  tu_buf qt = tu_buf_convert(&q, dt), sinks_t = tu_buf_convert(&sinks, st),
         slopes_t = tu_buf_convert(&slopes, st), bias_t = tu_buf_convert(&bias, bias_dt);
  tu_buf kp, vp, table = {NULL, ATTN_DTYPE_I32, 0}, knew = {NULL, dt, 0}, vnew = {NULL, dt, 0};
  int64_t num_pages = 0, max_pages = 0;
  const int64_t KW = c->paged && c->pad ? D + 8 : D, VW = c->paged && c->pad ? Dv + 8 : Dv;
  int32_t *owner_row = NULL; /* paged: for each pool row, the dense row it holds (b * Tk + j), or -1 */
  if (c->paged) {
    const int64_t P = c->page;
    max_pages = cdiv(Tk, P) + 1; /* one column past what any sequence needs: never read */
    for (int64_t b = 0; b < B; ++b) num_pages += cdiv(c->lens[b], P);
    num_pages += 3; /* pages no sequence owns */
    int32_t *order = malloc((size_t)num_pages * sizeof *order);
    owner_row = malloc((size_t)(num_pages * P) * sizeof *owner_row);
    for (int64_t i = 0; i < num_pages; ++i) order[i] = (int32_t)i;
    for (int64_t i = num_pages - 1; i > 0; --i) {
      int64_t j = tu_int(rng, 0, i);
      int32_t t = order[i];
      order[i] = order[j], order[j] = t;
    }
    for (int64_t r = 0; r < num_pages * P; ++r) owner_row[r] = -1;
    table = tu_buf_new(ATTN_DTYPE_I32, B * max_pages);
    int64_t next = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < max_pages; ++i) {
        int32_t page = i < cdiv(c->lens[b], P) ? order[next++] : -1;
        ((int32_t *)table.data)[b * max_pages + i] = page;
        for (int64_t r = 0; page >= 0 && r < P && i * P + r < c->lens[b] - c->seqlen_new; ++r)
          owner_row[page * P + r] = (int32_t)(b * Tk + i * P + r);
      }
    free(order);
    /* pages no row of the sequence sees hold NaN too */
    if (poison_window(c, impl) && !c->top_left) {
      for (int64_t b = 0; b < B; ++b) {
        const int64_t len = c->lens[b], o = len - Tq, wr = c->causal ? 0 : c->wr;
        const int64_t lo = c->wl >= 0 ? o - c->wl : 0, hi = wr >= 0 ? o + Tq - 1 + wr : len - 1;
        for (int64_t i = 0; i < cdiv(len - c->seqlen_new, P); ++i) {
          const int64_t first = i * P, last = i * P + P - 1;
          if (last >= len - c->seqlen_new) continue; /* holds appended rows */
          if (last < lo || first > hi) {
            int32_t page = ((int32_t *)table.data)[b * max_pages + i];
            for (int64_t r = 0; r < P; ++r) owner_row[page * P + r] = -1;
          }
        }
      }
    }
    kp = tu_buf_new(dt, num_pages * P * Hkv * KW), vp = tu_buf_new(dt, num_pages * P * Hkv * VW);
    for (int64_t r = 0; r < num_pages * P; ++r)
      for (int64_t g = 0; g < Hkv; ++g) {
        const int64_t src = owner_row[r];
        for (int64_t d = 0; d < D; ++d)
          tu_set(&kp, (r * Hkv + g) * KW + d, src < 0 ? NAN : tu_get(&k, (src * Hkv + g) * D + d));
        for (int64_t d = 0; d < Dv; ++d)
          tu_set(&vp, (r * Hkv + g) * VW + d, src < 0 ? NAN : tu_get(&v, (src * Hkv + g) * Dv + d));
      }
    if (c->seqlen_new > 0) {
      knew = tu_buf_new(dt, B * c->seqlen_new * Hkv * D), vnew = tu_buf_new(dt, B * c->seqlen_new * Hkv * Dv);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < c->seqlen_new; ++t) {
          const int64_t row = b * Tk + cache_seqlens[b] + t;
          for (int64_t e = 0; e < Hkv * D; ++e)
            tu_set(&knew, (b * c->seqlen_new + t) * Hkv * D + e, tu_get(&k, row * Hkv * D + e));
          for (int64_t e = 0; e < Hkv * Dv; ++e)
            tu_set(&vnew, (b * c->seqlen_new + t) * Hkv * Dv + e, tu_get(&v, row * Hkv * Dv + e));
        }
    }
    p.page_size = P, p.num_pages = num_pages, p.max_pages_per_seq = max_pages;
    p.seqlen_new = c->seqlen_new;
  } else {
    kp = tu_buf_convert(&k, dt), vp = tu_buf_convert(&v, dt);
  }
  attn_inputs in;
  attn_inputs_init(&in);
  in.q = tu_tensor(&qt), in.k = tu_tensor(&kp), in.v = tu_tensor(&vp);
  if (c->paged && c->pad) { /* [num_pages, P, Hkv, D] inside rows of KW (VW) elements */
    const int64_t ks[4] = {c->page * Hkv * KW, Hkv * KW, KW, 1}, vs[4] = {c->page * Hkv * VW, Hkv * VW, VW, 1};
    memcpy(in.k.stride, ks, sizeof ks), memcpy(in.v.stride, vs, sizeof vs);
  }
  if (c->sinks) in.sinks = tu_tensor(&sinks_t);
  if (c->alibi) in.alibi_slopes = tu_tensor(&slopes_t);
  if (c->bias) in.bias = tu_tensor(&bias_t);
  if (c->paged) {
    in.block_table = tu_tensor(&table);
    in.cache_seqlens = cache_seqlens;
    if (c->seqlen_new > 0) in.k_new = tu_tensor(&knew), in.v_new = tu_tensor(&vnew);
  }
  tu_buf out = tu_buf_new(dt, B * Tq * Hq * Dv), lse = tu_buf_new(st, B * Hq * Tq);
  tu_buf *uploads[9] = {&qt, &kp, &vp, &sinks_t, &slopes_t, &bias_t, &table, &knew, &vnew};
  status = run(ctx, &p, impl, c->config, ATTN_DTYPE_F64, &in, &out, &lse, uploads, 9,
               c->paged ? cache_seqlens : NULL, B);
  if (is_cudnn(impl) && status == ATTN_STATUS_OK) ++cudnn_ran;
  if (is_cudnn(impl) && status != ATTN_STATUS_OK) { /* only for a limit it documents */
    const char *msg = attn_ctx_last_error(ctx);
    int documented = status == ATTN_STATUS_UNSUPPORTED && cudnn_documented(c, Tk, msg);
    if (documented) printf("  cudnn refused it: %s\n", msg);
    tu_check(documented, "cudnn refuses %s (Tk=%lld) only for a limit it documents: %s", what,
             (long long)Tk, msg);
    cudnn_refused += documented;
    passed &= documented;
  } else if ((status == ATTN_STATUS_UNSUPPORTED || status == ATTN_STATUS_INVALID_ARGUMENT) &&
             c->device != ATTN_DEVICE_CPU && c->config == NULL) { /* no cuda module, or no splitkv
                                                              configuration; a named one must run */
    printf("  skipped on the GPU: %s\n", attn_ctx_last_error(ctx));
    ++skipped_gpu;
  } else if (status != ATTN_STATUS_OK) {
    tu_check(0, "%s on %s: %s", impl, what, attn_ctx_last_error(ctx));
    passed = 0;
  } else if (passed) {
    /* SPEC.md's bound: f32 absolute; f16/bf16 from the naive same-dtype reference */
    double naive_out = 0.0, naive_lse = 0.0;
    if (dt != ATTN_DTYPE_F32) {
      attn_problem pn = p;
      pn.device = ATTN_DEVICE_CPU;
      tu_buf nout = tu_buf_new(dt, out.n), nlse = tu_buf_new(st, lse.n);
      if (run(ctx, &pn, "ref", NULL, dt, &in, &nout, &nlse, NULL, 0, NULL, 0) == ATTN_STATUS_OK) {
        naive_out = tu_compare(&nout, (const double *)oout.data, out.n).max_abs;
        naive_lse = tu_compare(&nlse, (const double *)olse.data, lse.n).max_abs;
      }
      tu_buf_free(&nout), tu_buf_free(&nlse);
    }
    tol_err eo = tu_compare(&out, (const double *)oout.data, out.n);
    tol_err el = tu_compare(&lse, (const double *)olse.data, lse.n);
    const double bo = tol_bound(dt, TOL_FORWARD, eo.max_ref, naive_out, NULL);
    const double bl = tol_bound(dt, TOL_FORWARD, el.max_ref, naive_lse, NULL);
    int ok = tol_ok(&eo, bo) && tol_ok(&el, bl);
    tu_check(ok, "%s %s: out err %.3g (bound %.3g, %lld non-finite), lse err %.3g (bound %.3g, %lld "
                 "non-finite)",
             impl, what, eo.max_abs, bo, (long long)eo.nonfinite, el.max_abs, bl,
             (long long)el.nonfinite);
    passed &= ok;
    /* a named GPU configuration (the split-KV kernel) repeats its bits: its splits merge in a
     * fixed order, through the workspace or inside a thread-block cluster */
    if (c->device != ATTN_DEVICE_CPU && c->config != NULL) {
      tu_buf out2 = tu_buf_new(dt, out.n), lse2 = tu_buf_new(st, lse.n);
      int same = run(ctx, &p, impl, c->config, ATTN_DTYPE_F64, &in, &out2, &lse2, uploads, 9,
                     c->paged ? cache_seqlens : NULL, B) == ATTN_STATUS_OK;
      same = same && memcmp(out.data, out2.data, buf_bytes(&out)) == 0 &&
             memcmp(lse.data, lse2.data, buf_bytes(&lse)) == 0;
      tu_check(same, "%s %s (%s): a second call gives the same bits", impl, what, c->config);
      passed &= same;
      tu_buf_free(&out2), tu_buf_free(&lse2);
    }
    /* the appended rows are in the pool, bit for bit */
    if (c->paged && c->seqlen_new > 0 && c->device == ATTN_DEVICE_CPU) {
      int same = 1;
      const int32_t *tab = (const int32_t *)table.data;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < c->seqlen_new; ++t) {
          const int64_t j = cache_seqlens[b] + t;
          const int64_t prow = tab[b * max_pages + j / c->page] * c->page + j % c->page;
          for (int64_t e = 0; e < Hkv * D; ++e)
            same &= tu_get(&kp, (prow * Hkv + e / D) * KW + e % D) ==
                    tu_get(&knew, (b * c->seqlen_new + t) * Hkv * D + e);
          for (int64_t e = 0; e < Hkv * Dv; ++e)
            same &= tu_get(&vp, (prow * Hkv + e / Dv) * VW + e % Dv) ==
                    tu_get(&vnew, (b * c->seqlen_new + t) * Hkv * Dv + e);
        }
      tu_check(same, "%s %s: k_new and v_new written into their pages", impl, what);
      passed &= same;
    }
  }
  free(owner_row);
  tu_buf *all[] = {&q, &k, &v, &sinks, &slopes, &bias, &oout, &olse, &qt, &sinks_t, &slopes_t,
                   &bias_t, &kp, &vp, &table, &knew, &vnew, &out, &lse};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) tu_buf_free(all[i]);
  return passed;
}

/* ---- the grid ---------------------------------------------------------------------------------- */

/* Feature sets, each alone and the last all together. */
enum { F_PLAIN, F_CAUSAL, F_WINDOW, F_WINDOW2, F_SOFTCAP, F_SINKS, F_SINKS_SHARED, F_ALIBI,
       F_ALIBI_BH, F_ALL, F_COUNT };
static const char *const feature_names[F_COUNT] = {
    "plain", "causal", "window", "window2", "softcap", "sinks", "sinks_shared", "alibi",
    "alibi_bh", "all"};

static void set_features(pcase *c, int f) {
  c->causal = 0, c->wl = -1, c->wr = -1, c->softcap = 0.0, c->sinks = 0, c->sinks_shared = 0;
  c->alibi = ATTN_ALIBI_NONE;
  switch (f) {
  case F_CAUSAL: c->causal = 1; break;
  case F_WINDOW: c->causal = 1, c->wl = c->page + 5; break; /* the sliding window of a decoder */
  case F_WINDOW2: c->wl = 7, c->wr = 3; break;
  case F_SOFTCAP: c->softcap = 0.75; break;
  case F_SINKS: c->sinks = 2; break;
  case F_SINKS_SHARED: c->sinks = 1, c->sinks_shared = 1; break;
  case F_ALIBI: c->alibi = ATTN_ALIBI_PER_HEAD; break;
  case F_ALIBI_BH: c->alibi = ATTN_ALIBI_PER_BATCH_HEAD; break;
  case F_ALL:
    c->causal = 1, c->wl = 2 * c->page + 3, c->softcap = 0.75, c->sinks = 2;
    c->alibi = ATTN_ALIBI_PER_BATCH_HEAD;
    break;
  default: break;
  }
}

/* Lengths of a page size: 0, 1, odd, the page boundary and +- 1, two pages and one more. */
static void draw_lens(pcase *c, tu_rng *rng) {
  const int64_t P = c->page;
  const int64_t menu[] = {0, 1, 2 * tu_int(rng, 1, 40) + 1, P - 1, P, P + 1, 2 * P + 1, 3 * P - 1};
  for (int64_t b = 0; b < c->B; ++b) {
    int64_t len = menu[tu_int(rng, 0, 7)];
    if (len > 600) len = 600 - (len % 2 == 0); /* the reference's cost; still past a 256-page */
    c->lens[b] = max64(len, c->seqlen_new);
  }
  c->lens[0] = max64(c->lens[0], c->seqlen_new); /* and one empty sequence where there may be */
  if (c->seqlen_new == 0 && c->B > 2) c->lens[1] = 0;
}

static void test_grid(attn_ctx *ctx, tu_rng *rng, const char *impl, int device) {
  static const int64_t pages[] = {1, 16, 64, 256};
  static const int64_t heads[][2] = {{8, 2}, {4, 1}, {2, 2}, {6, 3}};
  for (int pi = 0; pi < 4; ++pi)
    for (int f = 0; f < F_COUNT; ++f) {
      pcase c;
      memset(&c, 0, sizeof c);
      c.dtype = f % 3 == 2 ? ATTN_DTYPE_BF16 : f % 3 == 1 ? ATTN_DTYPE_F16 : ATTN_DTYPE_F32;
      if (device == ATTN_DEVICE_CUDA) c.dtype = ATTN_DTYPE_BF16;
      c.page = pages[pi];
      c.B = tu_int(rng, 2, MAX_B);
      const int h = (int)tu_int(rng, 0, 3);
      c.Hq = heads[h][0], c.Hkv = heads[h][1];
      static const int64_t dims[] = {64, 128, 40};
      c.D = device == ATTN_DEVICE_CUDA ? 128 : dims[tu_int(rng, 0, 2)];
      c.Dv = tu_int(rng, 0, 3) == 0 && device == ATTN_DEVICE_CPU ? 32 : c.D;
      c.Tq = tu_int(rng, 0, 2) == 0 ? tu_int(rng, 2, 5) : 1;
      c.seqlen_new = tu_int(rng, 0, 2) == 0 ? 0 : tu_int(rng, 1, c.Tq);
      c.paged = 1;
      c.device = device;
      c.top_left = tu_int(rng, 0, 5) == 0;
      c.pad = tu_int(rng, 0, 2) == 0;
      set_features(&c, f);
      draw_lens(&c, rng);
      char what[512];
      describe(&c, what, sizeof what);
      if (!check_case(ctx, &c, impl, rng))
        printf("  failed: %s %s (feature %s)\n", impl, what, feature_names[f]);
    }
}

/* Dense decode problems (no pages): the cpu's decode path on the ordinary layout. */
static void test_dense_decode(attn_ctx *ctx, tu_rng *rng, const char *impl, int device) {
  for (int f = 0; f < F_COUNT; ++f) {
    pcase c;
    memset(&c, 0, sizeof c);
    c.dtype = f % 2 ? ATTN_DTYPE_BF16 : ATTN_DTYPE_F32;
    if (device == ATTN_DEVICE_CUDA) c.dtype = ATTN_DTYPE_BF16;
    c.page = 16; /* for the window's width only */
    c.B = tu_int(rng, 1, 4), c.Hq = 8, c.Hkv = f % 2 ? 2 : 1, c.D = device ? 128 : 64 + 8 * (f % 3);
    c.Dv = c.D;
    c.Tq = f % 4 == 0 ? 4 : 1;
    const int64_t Tk = f == F_PLAIN ? 0 : f == F_CAUSAL ? 1 : tu_int(rng, 2, 700);
    for (int64_t b = 0; b < c.B; ++b) c.lens[b] = Tk;
    c.device = device;
    set_features(&c, f);
    check_case(ctx, &c, impl, rng);
  }
}

/* GPU only, the split-KV kernel beyond the grid's shapes: each configuration of cuda (its own split
 * count), long odd lengths (many 64-key tiles and splits, the shorter sequences' last splits
 * empty), a sequence of length 0, page sizes 16, 64 and 256, GQA groups 1, 4 and 8 (with Tq = 4:
 * 4, 16 and 32 rows per KV head, the last two chunks of 16), each kernel's head dim and a
 * zero-padded one (72), f16 and bf16, dense caches too, and every feature. Three D = 128 cases
 * have 8 KV heads (so that ATTN_CUDA_DECODE's heads2/4/8, a CTA over several KV heads, apply to
 * them; with 2 only heads2 does): 16 rows per head, 1 row, and 24 rows (two chunks); the second
 * also with padded pool rows (heads not side by side: the kernel then takes one head per CTA). */
static void test_gpu_splits(attn_ctx *ctx, tu_rng *rng) {
  static const char *const configs[] = {"splitkv", "splitkv_half", "splitkv_waves2"};
  static const int64_t pages[] = {16, 64, 256}, groups[] = {1, 4, 8}, dims[] = {128, 64, 256, 72};
  int n = 0;
  for (int ci = 0; ci < 3; ++ci)
    for (int pi = 0; pi < 3; ++pi)
      for (int gi = 0; gi < 3; ++gi, ++n) {
        pcase c;
        memset(&c, 0, sizeof c);
        c.dtype = n % 2 ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16;
        c.page = pages[pi];
        c.B = 3, c.Hkv = n % 8 == 4 ? 8 : 2, c.Hq = c.Hkv * groups[gi];
        c.D = c.Dv = dims[n % 4];
        c.Tq = n % 3 == 1 ? 4 : n % 8 == 4 && n % 3 == 2 ? 3 : 1;
        c.paged = n % 5 != 4;
        c.pad = n == 12;
        c.seqlen_new = c.paged && n % 3 == 2 ? 1 : 0;
        c.device = ATTN_DEVICE_CUDA;
        c.config = configs[ci];
        set_features(&c, n % F_COUNT);
        const int64_t odd = 2 * tu_int(rng, 300, 1600) + 1;
        for (int64_t b = 0; b < c.B; ++b) c.lens[b] = odd;
        if (c.paged) { /* one short, one empty (or just the appended rows) */
          c.lens[1] = c.seqlen_new;
          c.lens[2] = c.page * tu_int(rng, 1, 6) + (n % 2 ? 1 : -1);
        }
        char what[512];
        describe(&c, what, sizeof what);
        if (!check_case(ctx, &c, NULL, rng))
          printf("  failed: %s %s (feature %s)\n", c.config, what, feature_names[n % F_COUNT]);
      }
}

/* The paged problems cuDNN takes (decode, no append; the features it has): page sizes 1 to 256,
 * every feature alone and with the others it combines with (causal, a causal sliding window, a
 * band around the diagonal, ALiBi under a top-left causal mask, a bias alone and with that mask),
 * long odd lengths (many key tiles, the last page part-filled with NaN past the length), GQA and
 * MQA, head dims 64 to 256, f16 and bf16, strided pools, lengths 0, 1, odd and around page
 * boundaries. */
static void test_cudnn_paged(attn_ctx *ctx, tu_rng *rng) {
  enum { C_PLAIN, C_CAUSAL, C_WINDOW, C_BAND, C_ALIBI, C_BIAS, C_BIAS_CAUSAL, C_LONG, C_COUNT };
  static const char *const names[C_COUNT] = {"plain", "causal", "window",      "band",
                                             "alibi", "bias",   "bias_causal", "long"};
  static const int64_t pages[] = {1, 16, 64, 256}, heads[][2] = {{8, 2}, {4, 1}, {2, 2}, {6, 3}};
  static const int64_t dims[] = {128, 64, 96, 256};
  int n = 0;
  for (int pi = 0; pi < 4; ++pi)
    for (int f = 0; f < C_COUNT; ++f, ++n) {
      pcase c;
      memset(&c, 0, sizeof c);
      c.dtype = n % 2 ? ATTN_DTYPE_F16 : ATTN_DTYPE_BF16;
      c.page = pages[pi];
      c.B = tu_int(rng, 2, MAX_B);
      c.Hq = heads[n % 4][0], c.Hkv = heads[n % 4][1];
      c.D = c.Dv = dims[(n / 4) % 4];
      c.Tq = 1;
      c.paged = 1, c.device = ATTN_DEVICE_CUDA;
      c.pad = n % 3 == 0;
      set_features(&c, F_PLAIN);
      switch (f) {
      case C_CAUSAL: c.causal = 1; break;
      case C_WINDOW: c.causal = 1, c.wl = c.page + 5; break;
      case C_BAND: c.wl = 7, c.wr = 3; break;
      case C_ALIBI: c.causal = 1, c.top_left = 1, c.alibi = ATTN_ALIBI_PER_HEAD; break;
      case C_BIAS: c.bias = 1; break;
      case C_BIAS_CAUSAL: c.bias = 1, c.causal = 1, c.top_left = 1; break;
      case C_LONG: c.causal = 1; break;
      default: break;
      }
      if (f == C_LONG)
        for (int64_t b = 0; b < c.B; ++b) c.lens[b] = 2 * tu_int(rng, 300, 1600) + 1;
      else
        draw_lens(&c, rng);
      char what[512];
      describe(&c, what, sizeof what);
      if (!check_case(ctx, &c, "cudnn", rng)) printf("  failed: cudnn %s (%s)\n", what, names[f]);
    }
}

/* The cpu decode path's key-by-key loops: for bf16 the bf16 loops (vdpbf16ps scores and P V on
 * key pairs, kernels_avx512bf16.c, where the processor has AVX-512 BF16), for f32 and f16 (and
 * bf16 elsewhere) the table's own loops walked key by key (decode.c's scores_by_key, pv_by_key):
 * rows per KV head 1, 5, 6 and 16 (the 4-row blocks and the rest), widths 32 to 256 in every
 * pairing for bf16 (P V's 64-column windows and a 32-column rest) and odd widths for f32 and f16
 * (the 16-lane rest), odd key counts and counts below a step (1, 2, 3 keys: a key pair without its
 * partner, a P V step of fewer keys), lengths past one 32-key block and one split, page sizes 1
 * and 16 and dense caches, padded heads (each head's row its own span of requests), every
 * feature. */
static void test_key_loops(attn_ctx *ctx, tu_rng *rng, attn_dtype dtype) {
  static const int64_t shapes[][3] = {{8, 2, 1}, {8, 2, 4}, {6, 3, 3}, {3, 3, 1}, {10, 2, 1}};
  static const int64_t dims_bf16[][2] = {{128, 128}, {32, 96}, {256, 64}, {64, 256}};
  static const int64_t dims_odd[][2] = {{128, 128}, {37, 53}, {5, 200}, {80, 17}};
  static const int64_t pages[] = {1, 16, 0};
  const int64_t(*dims)[2] = dtype == ATTN_DTYPE_BF16 ? dims_bf16 : dims_odd;
  for (int n = 0; n < 40; ++n) {
    pcase c;
    memset(&c, 0, sizeof c);
    c.dtype = dtype;
    c.Hq = shapes[n % 5][0], c.Hkv = shapes[n % 5][1], c.Tq = shapes[n % 5][2];
    c.D = dims[n % 4][0], c.Dv = dims[n % 4][1];
    c.page = pages[n % 3] > 0 ? pages[n % 3] : 16;
    c.paged = pages[n % 3] > 0;
    c.pad = c.paged && n % 2;
    c.B = 3;
    c.device = ATTN_DEVICE_CPU;
    set_features(&c, n % F_COUNT);
    const int64_t few = tu_int(rng, 1, 3), odd = 2 * tu_int(rng, 20, 300) + 1;
    for (int64_t b = 0; b < c.B; ++b) c.lens[b] = c.paged && b == 1 ? few : odd;
    if (!c.paged && n % 4 == 1)
      for (int64_t b = 0; b < c.B; ++b) c.lens[b] = few;
    char what[512];
    describe(&c, what, sizeof what);
    if (!check_case(ctx, &c, "cpu", rng))
      printf("  failed: key loops %s (feature %s)\n", what, feature_names[n % F_COUNT]);
  }
}

/* Chunked prefill (Tq = 40) and a bias: the cpu's tiled path over pages. */
static void test_prefill(attn_ctx *ctx, tu_rng *rng, const char *impl) {
  for (int f = 0; f < 4; ++f) {
    pcase c;
    memset(&c, 0, sizeof c);
    c.dtype = ATTN_DTYPE_F32;
    c.page = f < 2 ? 16 : 1;
    c.B = 3, c.Hq = 4, c.Hkv = 2, c.D = 64, c.Dv = 64, c.Tq = f % 2 ? 40 : 3;
    c.seqlen_new = f == 0 ? 3 : 0;
    c.paged = 1;
    c.causal = 1, c.wl = -1, c.wr = -1;
    c.bias = f != 3;
    c.softcap = f == 3 ? 0.9 : 0.0;
    for (int64_t b = 0; b < c.B; ++b) c.lens[b] = c.Tq + tu_int(rng, 0, 90);
    check_case(ctx, &c, impl, rng);
  }
}

/* ---- validation and problem strings ------------------------------------------------------------ */

static void expect(attn_ctx *ctx, attn_status got, attn_status want, const char *needle,
                   const char *what) {
  const char *msg = attn_ctx_last_error(ctx);
  tu_check(got == want && strstr(msg, needle) != NULL, "%s: status %d (want %d), message \"%s\"",
           what, (int)got, (int)want, msg);
}

static void test_validation(attn_ctx *ctx) {
  attn_problem p;
  attn_problem_parse(ctx, "b2 hq4 hkv2 sq1 sk40 d8 paged=16,6", &p);
  attn_plan *plan = NULL;
  tu_check(attn_plan_create(ctx, &p, NULL, &plan) == ATTN_STATUS_OK, "a paged plan: %s",
           attn_ctx_last_error(ctx));
  float q[2 * 4 * 8] = {0}, kp[6 * 16 * 2 * 8] = {0}, vp[6 * 16 * 2 * 8] = {0}, out[2 * 4 * 8];
  int32_t table[2 * 3] = {0, 1, 2, 3, 4, 5}, lens[2] = {40, 17};
  attn_inputs in;
  attn_inputs_init(&in);
  in.q = attn_tensor_dense(q), in.k = attn_tensor_dense(kp), in.v = attn_tensor_dense(vp);
  in.block_table = attn_tensor_dense(table);
  in.cache_seqlens = lens;
  attn_outputs o;
  attn_outputs_init(&o);
  o.out = attn_tensor_dense(out);
  expect(ctx, attn_plan_forward(plan, &in, NULL, 0, &o), ATTN_STATUS_OK, "", "a valid paged run");
  table[4] = 6; /* sequence 1's second page: it has 17 keys, so it reads it */
  expect(ctx, attn_plan_forward(plan, &in, NULL, 0, &o), ATTN_STATUS_INVALID_ARGUMENT,
         "block_table[1][1]=6 is out of range", "a page past the pool");
  table[4] = 4, table[5] = -1; /* past sequence 1's keys: never read */
  expect(ctx, attn_plan_forward(plan, &in, NULL, 0, &o), ATTN_STATUS_OK, "", "-1 past the keys");
  lens[1] = 41;
  expect(ctx, attn_plan_forward(plan, &in, NULL, 0, &o), ATTN_STATUS_INVALID_ARGUMENT,
         "cache_seqlens[1]=41 plus seqlen_new=0 exceeds seqlen_k=40", "a length past seqlen_k");
  lens[1] = -1;
  expect(ctx, attn_plan_forward(plan, &in, NULL, 0, &o), ATTN_STATUS_INVALID_ARGUMENT,
         "cache_seqlens[1]=-1 is negative", "a negative length");
  lens[1] = 17;
  in.cache_seqlens = NULL;
  expect(ctx, attn_plan_forward(plan, &in, NULL, 0, &o), ATTN_STATUS_INVALID_ARGUMENT,
         "cache_seqlens is NULL", "no lengths");
  in.cache_seqlens = lens;
  in.block_table.data = NULL;
  expect(ctx, attn_plan_forward(plan, &in, NULL, 0, &o), ATTN_STATUS_INVALID_ARGUMENT,
         "block_table.data is NULL", "no block table");
  in.block_table.data = table;
  attn_tensor dout = attn_tensor_dense(out);
  attn_grads g;
  attn_grads_init(&g);
  expect(ctx, attn_plan_backward(plan, &in, &o, &dout, NULL, 0, &g), ATTN_STATUS_UNSUPPORTED,
         "backward of a paged KV cache", "the backward pass");
  attn_plan_destroy(plan);

  attn_problem bad = p;
  bad.max_pages_per_seq = 2;
  expect(ctx, attn_plan_create(ctx, &bad, NULL, &plan), ATTN_STATUS_INVALID_ARGUMENT,
         "seqlen_k=40 exceeds max_pages_per_seq=2 * page_size=16", "a table too narrow");
  bad = p;
  bad.varlen = ATTN_VARLEN_PADDED;
  expect(ctx, attn_plan_create(ctx, &bad, NULL, &plan), ATTN_STATUS_INVALID_ARGUMENT,
         "a paged cache has its own lengths", "paged varlen");
  bad = p;
  bad.page_size = 0;
  expect(ctx, attn_plan_create(ctx, &bad, NULL, &plan), ATTN_STATUS_INVALID_ARGUMENT,
         "num_pages=6 needs a paged cache", "pages without a page size");
  bad = p;
  bad.seqlen_new = 41;
  expect(ctx, attn_plan_create(ctx, &bad, NULL, &plan), ATTN_STATUS_INVALID_ARGUMENT,
         "seqlen_new=41 exceeds seqlen_k=40", "an append longer than the cache");
  bad = p;
  bad.seqlen_q = 0;
  expect(ctx, attn_plan_create(ctx, &bad, NULL, &plan), ATTN_STATUS_INVALID_ARGUMENT,
         "every sequence has at least one query", "no query");

  /* problem strings: written, read back, and the defaults */
  const char *texts[] = {"b2 hq4 hkv2 sq1 sk40 d8 f32 paged=16,6",
                         "b8 hq32 hkv8 sq4 sk4096 d128 bf16 causal paged=64 new=4",
                         "b1 hq8 hkv1 sq1 sk100 d64 f32 paged=1,200,128 new=1"};
  for (int i = 0; i < 3; ++i) {
    attn_problem a;
    char buf[256];
    attn_status s = attn_problem_parse(ctx, texts[i], &a);
    attn_problem_to_string(&a, buf, sizeof buf);
    tu_check(s == ATTN_STATUS_OK && strcmp(buf, texts[i]) == 0, "\"%s\" reads back as \"%s\"",
             texts[i], buf);
  }
  attn_problem a;
  expect(ctx, attn_problem_parse(ctx, "b1 hq1 sq1 d8 paged=16,2,3,4", &a),
         ATTN_STATUS_INVALID_ARGUMENT, "paged=16,2,3,4", "a paged token of four numbers");
}

/* Whether the GPU cases of implementation impl run: it is registered (its module loaded) and
 * ATTN_TEST_PAGED_ONLY, when set, names it. */
static int gpu_impl_wanted(const char *impl) {
  const char *only = getenv("ATTN_TEST_PAGED_ONLY");
  if (only != NULL && strcmp(only, impl) != 0) return 0;
  if (attn_registry_find(impl) == NULL) {
    printf("test_paged: no %s implementation (its module is not loaded): its GPU cases are not "
           "run\n",
           impl);
    return 0;
  }
  return 1;
}

int main(void) {
  uint64_t seed = tu_seed("test_paged");
  tu_rng rng = tu_rng_make(seed);
  attn_ctx *ctx;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) return 2;
  const int cpu = getenv("ATTN_TEST_PAGED_ONLY") == NULL;
  const int quick = getenv("ATTN_TEST_PAGED_QUICK") != NULL;
  if (cpu) test_validation(ctx);
  const char *impls[] = {"ref", "cpu"};
  for (int i = 0; cpu && i < 2; ++i) {
    test_grid(ctx, &rng, impls[i], ATTN_DEVICE_CPU);
    test_dense_decode(ctx, &rng, impls[i], ATTN_DEVICE_CPU);
    test_prefill(ctx, &rng, impls[i]);
  }
  test_key_loops(ctx, &rng, ATTN_DTYPE_BF16);
  test_key_loops(ctx, &rng, ATTN_DTYPE_F32);
  test_key_loops(ctx, &rng, ATTN_DTYPE_F16);
  /* the cpu's other kernel tables (the decode path scores bf16 with vdpbf16ps only on the
   * avx512bf16 one, and converts f16 with each table's own loads) */
  const char *saved = getenv("ATTN_CPU_ISA");
  static const char *const isas[] = {"avx2", "generic"};
  for (int i = 0; cpu && i < 2; ++i) {
    setenv("ATTN_CPU_ISA", isas[i], 1);
    printf("test_paged: cpu with ATTN_CPU_ISA=%s\n", isas[i]);
    test_grid(ctx, &rng, "cpu", ATTN_DEVICE_CPU);
  }
  if (saved != NULL) setenv("ATTN_CPU_ISA", saved, 1);
  else unsetenv("ATTN_CPU_ISA");
  /* GPU problems through the registry: every implementation that takes them */
  char why[256] = "";
  int32_t gpus = 0;
  const attn_gpu_ops *gpu = attn_gpu();
  if (gpu != NULL && gpu->device_count(&gpus, why, sizeof why) == ATTN_STATUS_OK && gpus > 0) {
    if (gpu_impl_wanted("cuda")) {
      if (!quick) {
        test_grid(ctx, &rng, "cuda", ATTN_DEVICE_CUDA);
        test_dense_decode(ctx, &rng, NULL, ATTN_DEVICE_CUDA);
      }
      /* the decode kernel's data paths (ATTN_CUDA_DECODE, docs/DECODE.md): the default (1 or 2
       * KV heads per CTA at these sizes), then the others, each way of copying with each way of
       * merging the splits, with 1 KV head per CTA (the cluster merge) and with 2, 4 and 8; the
       * quick mode (for compute-sanitizer) only the default, the merge kernel and the old set-up
       * and epilogue with one head per CTA, and 4 heads per CTA */
      const char *saved_decode = getenv("ATTN_CUDA_DECODE");
      static const char *const decode_variants[] = {NULL,
                                                    "heads1",
                                                    "cpasync",
                                                    "heads1,cpasync,nocluster",
                                                    "heads1,lateissue,nocluster,mergekernel",
                                                    "mergechunk,nocluster,mergekernel",
                                                    "heads1,waitfirst,tablebystage,epilogueflat",
                                                    "cpasync,nocluster,mergekernel,tablebystage,epilogueflat",
                                                    "heads2",
                                                    "heads4,cpasync",
                                                    "heads8,mergekernel,tablebystage,epilogueflat",
                                                    "heads4,lateissue,waitfirst,tanhexp"};
      const int n_variants = (int)(sizeof decode_variants / sizeof decode_variants[0]);
      for (int i = 0; i < n_variants; ++i) {
        if (quick && i != 0 && i != 4 && i != 6 && i != 11) continue;
        if (decode_variants[i] != NULL) setenv("ATTN_CUDA_DECODE", decode_variants[i], 1);
        printf("test_paged: GPU split cases with ATTN_CUDA_DECODE=%s\n",
               decode_variants[i] ? decode_variants[i] : saved_decode ? saved_decode : "(default)");
        test_gpu_splits(ctx, &rng);
      }
      if (saved_decode != NULL) setenv("ATTN_CUDA_DECODE", saved_decode, 1);
      else unsetenv("ATTN_CUDA_DECODE");
      printf("test_paged: %d GPU cases skipped (cuda does not take them)\n", skipped_gpu);
    }
    if (gpu_impl_wanted("cudnn")) {
      test_grid(ctx, &rng, "cudnn", ATTN_DEVICE_CUDA);
      test_cudnn_paged(ctx, &rng);
      printf("test_paged: cudnn ran %d paged cases and refused %d for limits it documents\n",
             cudnn_ran, cudnn_refused);
    }
  } else {
    printf("test_paged: no GPU (%s): the device=cuda cases are skipped\n",
           gpu == NULL ? "no GPU module loaded" : why);
  }
  attn_ctx_destroy(ctx);
  return tu_finish();
}
