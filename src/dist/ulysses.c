/*
 * src/dist/ulysses.c - all-to-all ("Ulysses") attention: a sequence-split problem computed as a
 * head-split one.
 *
 * Rank j of the n sequence ranks holds every head of its slice of the sequence. One all-to-all
 * per tensor turns that into every position of 1/n of the heads (rank j: query heads
 * [j Hq/n, (j+1) Hq/n) and their KV heads, so Hkv must divide by n); the positions are put back in
 * natural order on arrival, the single-device library runs the whole sequence for those heads
 * (global positions for dropout through attn_plan_set_positions), and one more all-to-all per
 * result returns out and lse (backward: dq, dk, dv, dbias) to the sequence split. Communication per
 * rank is O(T/n x H) per tensor whatever n is, against the ring's n-1 hops of K/V; its limit is
 * that n cannot exceed Hkv.
 *
 * The tensors are on the host or on a GPU, and the same code runs both: on a GPU the reordering
 * copies are the cuda module's copy kernel on the plan's stream (dist/device.h), one per run of
 * rows a block keeps together, and the exchange is the transport's all-to-all on device memory
 * (NCCL). A run's buffers (the head-split tensors, the exchange's send and receive blocks, on a GPU
 * the block's workspace) are one allocation in the tensors' memory, laid out by lay_out and kept
 * by the plan for the next run.
 */
#include "dist/dist.h"

#include "core/ctx.h"
#include "core/dtype.h"
#include "core/gpu.h"
#include "impl/impl.h"
#include "plan/plan.h"

#include <stdlib.h>
#include <string.h>

/* A caller's 4-d tensor (unused trailing dims have extent 1). */
typedef struct view {
  char *data;
  int64_t dim[4];
  int64_t stride[4]; /* elements */
  size_t es;         /* bytes per element */
} view;

static view make_view(const attn_tensor *t, const int64_t *shape, int ndim, size_t es) {
  view v;
  memset(&v, 0, sizeof v);
  v.data = t->data;
  v.es = es;
  int64_t stride[4];
  attn_dist_strides(t, shape, ndim, stride);
  for (int d = 0; d < 4; ++d)
    v.dim[d] = d < ndim ? shape[d] : 1, v.stride[d] = d < ndim ? stride[d] : 0;
  return v;
}

/* A 3-d (or 2-d) view as a 4-d one with a leading dim of 1: a packed tensor's rows then sit in
 * the dim that holds a dense one's. */
static view batch_of_one(view v) {
  for (int d = 3; d > 0; --d) v.dim[d] = v.dim[d - 1], v.stride[d] = v.stride[d - 1];
  v.dim[0] = 1, v.stride[0] = 0;
  return v;
}

typedef struct exch {
  attn_dist_plan *plan;
  void *comm; /* the all-to-all's ranks */
  int32_t n, me;
  /* 0: rows arrive in natural order (the whole sequence); 1 (hybrid): in the order of the ring
   * group's slice, whose C chunks each member holds 1/n of. */
  int group_order;
  int device;        /* CUDA tensors: the copies run on the GPU, on the plan's stream */
  char *send, *recv; /* n blocks each, room for the largest tensor exchanged (lay_out) */
  /* Packed varlen: the local cu_seqlens on the host (copies of a GPU's), NULL for dense rows,
   * and the sequences' count; rows_q, rows_k: the rows the all-to-all gathers (the whole
   * sequence, or every sequence's rows) */
  int32_t *cu_q, *cu_k;
  int64_t rows_q, rows_k;
} exch;

/* Where element idx of rank r's block lies in a whole tensor: its heads start at r * heads along
 * hdim (heads 0: no shift), its rows are rank r's sequence rows of T (T 0: rows as they are), and
 * stride maps the index to an element offset. cu: a packed problem's local cu_seqlens (host
 * memory) for the rows, each sequence split apart; NULL for dense rows. */
typedef struct block_place {
  const int64_t *stride;
  int hdim, tdim;
  int64_t heads, T;
  const int32_t *cu;
} block_place;

/* Where row t of member i's slice sits among the T rows gathered by the all-to-all. Packed rows:
 * local row t of sequence b (local rows [cu[b], cu[b + 1])) is its row t - cu[b] of the
 * sequence's n * (cu[b + 1] - cu[b]) rows, which start at n * cu[b]. */
static int64_t gathered_row(const exch *x, const block_place *pl, int32_t i, int64_t t) {
  if (pl->cu != NULL) {
    int64_t lo = 0, hi = x->plan->local.batch; /* the sequence b of cu[b] <= t < cu[b + 1] */
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (pl->cu[mid] <= t)
        lo = mid;
      else
        hi = mid;
    }
    const int64_t len = (int64_t)x->n * (pl->cu[lo + 1] - pl->cu[lo]);
    return (int64_t)x->n * pl->cu[lo] +
           attn_dist_layout_position(x->plan->layout, x->n, len, i, t - pl->cu[lo]);
  }
  const int64_t T = pl->T;
  if (!x->group_order) return attn_dist_layout_position(x->plan->layout, x->n, T, i, t);
  const int64_t chunk_len = T / x->plan->chunks, part = chunk_len / x->n;
  return (t / part) * chunk_len + (int64_t)i * part + t % part;
}

static exch make_exch(attn_dist_plan *plan, const attn_problem *u) {
  exch x;
  memset(&x, 0, sizeof x);
  x.rows_q = u->seqlen_q, x.rows_k = u->seqlen_k;
  x.plan = plan;
  x.comm = plan->hybrid ? plan->a2a_comm : plan->seq_comm;
  x.n = plan->hybrid ? plan->a2a_n : plan->ns;
  x.me = plan->hybrid ? plan->a2a_r : plan->seq_rank;
  x.group_order = plan->hybrid;
  x.device = plan->local.device != ATTN_DEVICE_CPU;
  return x;
}

/* A rank's q-, k- or v-like tensor (rows of the keys when keys), H heads of width W: dense
 * [B, T, H, W], or packed [total, H, W] as [1, total, H, W]. */
static view rows_view(const exch *x, const attn_tensor *t, int keys, int64_t H, int64_t W,
                      size_t es) {
  const attn_problem *l = &x->plan->local;
  if (x->cu_q == NULL) {
    const int64_t shape[4] = {l->batch, keys ? l->seqlen_k : l->seqlen_q, H, W};
    return make_view(t, shape, 4, es);
  }
  const int64_t shape[3] = {keys ? l->total_k : l->total_q, H, W};
  return batch_of_one(make_view(t, shape, 3, es));
}

/* A rank's lse: dense [B, Hq, Tq], or packed [Hq, total_q] as [1, Hq, total_q]. */
static view lse_view(const exch *x, const attn_tensor *t, size_t es) {
  const attn_problem *l = &x->plan->local;
  if (x->cu_q == NULL) {
    const int64_t shape[3] = {l->batch, l->heads_q, l->seqlen_q};
    return make_view(t, shape, 3, es);
  }
  const int64_t shape[2] = {l->heads_q, l->total_q};
  return batch_of_one(make_view(t, shape, 2, es));
}

static attn_status exchange(exch *x, const void *send, void *recv, size_t bytes) {
  char why[512] = "";
  const double start = attn_dist_now();
  attn_status status = (attn_status)x->plan->ops->alltoall(
      x->comm, send, recv, bytes, x->plan->spec.timeout_seconds, why, sizeof why);
  x->plan->stats.wait_seconds += attn_dist_now() - start;
  x->plan->stats.bytes_sent += (int64_t)(bytes * (size_t)(x->n - 1));
  x->plan->stats.steps += 1;
  if (status != ATTN_STATUS_OK) {
    x->plan->broken = 1;
    return attn_fail(x->plan->ctx, status, "all-to-all over the sequence ranks: %s", why);
  }
  return ATTN_STATUS_OK;
}

/* A GPU operation's failure: work may be in flight, so the plan is broken. */
static attn_status device_failed(const exch *x, attn_status status, const char *what,
                                 const char *why) {
  x->plan->broken = 1;
  return attn_fail(x->plan->ctx, status, "all-to-all on the GPU, %s: %s", what, why);
}

/* The row-major strides of a dense tensor of dims d. */
static void dense_strides(const int64_t d[4], int64_t s[4]) {
  s[3] = 1, s[2] = d[3], s[1] = d[2] * d[3], s[0] = d[1] * d[2] * d[3];
}

/* Host memory: copies rank r's block (dims bd, dense in packed) out of the tensor at base
 * (pack = 1) or into it (pack = 0), placed as pl says. The innermost dim is a run of consecutive
 * elements in packed; where neither the heads nor the rows are that dim, the placement is worked
 * out once per run, and a run that is contiguous in the tensor too (the usual [B, T, H, D]) is one
 * memcpy (per element, place and copy took twice the attention's own time on two ranks). */
static void host_copy_block(const exch *x, const int64_t bd[4], size_t es, int32_t r,
                            const block_place *pl, char *base, char *packed, int pack) {
  const int dist_threads = attn_dist_host_threads(x->plan);
  const int run_placed = pl->hdim != 3 && (pl->T <= 0 || pl->tdim != 3);
  const int64_t run = run_placed ? bd[3] : 1, runs = run_placed ? bd[2] : bd[2] * bd[3];
  const size_t run_bytes = (size_t)run * es;
  const int contiguous = run == 1 || pl->stride[3] == 1;
  DIST_PARALLEL_FOR
  for (int64_t i01 = 0; i01 < bd[0] * bd[1]; ++i01) { /* the two outer dims */
    const int64_t i0 = i01 / bd[1], i1 = i01 % bd[1];
    for (int64_t k = 0; k < runs; ++k) {
      const int64_t e = (i01 * bd[2] * bd[3]) + k * run; /* the run's first element in packed */
      int64_t idx[4] = {i0, i1, run_placed ? k : k / bd[3], run_placed ? 0 : k % bd[3]};
      if (pl->hdim >= 0) idx[pl->hdim] += r * pl->heads;
      if (pl->T > 0) idx[pl->tdim] = gathered_row(x, pl, r, idx[pl->tdim]);
      const int64_t off = idx[0] * pl->stride[0] + idx[1] * pl->stride[1] +
                          idx[2] * pl->stride[2] + idx[3] * pl->stride[3];
      char *whole = base + (size_t)off * es, *part = packed + (size_t)e * es;
      if (contiguous) {
        memcpy(pack ? part : whole, pack ? whole : part, run_bytes);
        continue;
      }
      for (int64_t i3 = 0; i3 < run; ++i3) {
        char *w = whole + (size_t)(i3 * pl->stride[3]) * es, *q = part + (size_t)i3 * es;
        memcpy(pack ? q : w, pack ? w : q, es);
      }
    }
  }
}

/* GPU memory: the same, as one strided copy per run of the block's rows that lie consecutively
 * in the tensor too (every row where rows stay in place; one per chunk of the layout otherwise:
 * at most two for zigzag), on the plan's stream. */
static attn_status device_copy_block(const exch *x, const int64_t bd[4], size_t es, int32_t r,
                                     const block_place *pl, char *base, char *packed, int pack) {
  attn_dist_plan *plan = x->plan;
  int64_t ps[4];
  dense_strides(bd, ps);
  const int moved = pl->T > 0;
  const int64_t rows = moved ? bd[pl->tdim] : 1;
  for (int64_t t0 = 0; t0 < rows;) {
    int64_t len = rows, first = 0;
    if (moved) {
      first = gathered_row(x, pl, r, t0);
      for (len = 1; t0 + len < rows && gathered_row(x, pl, r, t0 + len) == first + len; ++len) {
      }
    }
    int64_t box[4], idx[4] = {0, 0, 0, 0};
    memcpy(box, bd, sizeof box);
    if (pl->hdim >= 0) idx[pl->hdim] = r * pl->heads;
    if (moved) box[pl->tdim] = len, idx[pl->tdim] = first;
    const int64_t off = idx[0] * pl->stride[0] + idx[1] * pl->stride[1] +
                        idx[2] * pl->stride[2] + idx[3] * pl->stride[3];
    char *whole = base + (size_t)off * es;
    char *part = packed + (size_t)(moved ? t0 * ps[pl->tdim] : 0) * es;
    char why[512] = "";
    const attn_status status =
        pack ? plan->dev->copy(plan->local.device_index, part, ps, whole, pl->stride, box, es,
                               plan->stream, why, sizeof why)
             : plan->dev->copy(plan->local.device_index, whole, pl->stride, part, ps, box, es,
                               plan->stream, why, sizeof why);
    if (status != ATTN_STATUS_OK) return device_failed(x, status, "reordering a block", why);
    t0 += len;
  }
  return ATTN_STATUS_OK;
}

/* Copies rank r's block between the tensor and its dense place in an exchange buffer: each side
 * of an all-to-all is one call per rank. */
static attn_status copy_block(const exch *x, const int64_t bd[4], size_t es, int32_t r,
                              const block_place *pl, char *base, char *packed, int pack) {
  if (x->device) return device_copy_block(x, bd, es, r, pl, base, packed, pack);
  host_copy_block(x, bd, es, r, pl, base, packed, pack);
  return ATTN_STATUS_OK;
}

/* Sequence-split (local rows of dim tdim, all heads of dim hdim) -> head-split (every row, in
 * natural order, 1/n of the heads; every head when hdim < 0). dst: dense, of the source's dims with
 * dim[tdim] = T and dim[hdim] = H / n. */
static attn_status to_heads(exch *x, const view *src, int tdim, int hdim, int64_t T,
                            const int32_t *cu, char *dst) {
  int64_t bd[4];
  memcpy(bd, src->dim, sizeof bd);
  const int64_t hn = hdim >= 0 ? src->dim[hdim] / x->n : 0;
  if (hdim >= 0) bd[hdim] = hn;
  const size_t bytes = (size_t)(bd[0] * bd[1] * bd[2] * bd[3]) * src->es;
  const block_place mine = {src->stride, hdim, tdim, hn, 0, NULL};
  attn_status status = ATTN_STATUS_OK;
  for (int32_t j = 0; j < x->n && status == ATTN_STATUS_OK; ++j)
    status = copy_block(x, bd, src->es, j, &mine, src->data, x->send + (size_t)j * bytes, 1);
  if (status == ATTN_STATUS_OK) status = exchange(x, x->send, x->recv, bytes);
  int64_t dd[4], ds[4];
  memcpy(dd, bd, sizeof dd);
  dd[tdim] = T;
  dense_strides(dd, ds);
  const block_place gathered = {ds, hdim, tdim, 0, T, cu};
  for (int32_t i = 0; i < x->n && status == ATTN_STATUS_OK; ++i)
    status = copy_block(x, bd, src->es, i, &gathered, dst, x->recv + (size_t)i * bytes, 0);
  return status;
}

/* Sends every rank its rows of src (dense, of the block dims bd but for T rows along tdim, as
 * gathered: to_heads' result, or a sum's shares) and receives this rank's rows from each: block i
 * of x->recv, of bd's volume, holds rank i's. */
static attn_status send_rows_home(exch *x, const char *src, const int64_t bd[4], size_t es,
                                  int tdim, int hdim, int64_t T, const int32_t *cu) {
  int64_t sd[4], ss[4];
  memcpy(sd, bd, sizeof sd);
  sd[tdim] = T;
  dense_strides(sd, ss);
  const size_t bytes = (size_t)(bd[0] * bd[1] * bd[2] * bd[3]) * es;
  const block_place gathered = {ss, hdim, tdim, 0, T, cu};
  attn_status status = ATTN_STATUS_OK;
  for (int32_t j = 0; j < x->n && status == ATTN_STATUS_OK; ++j) /* packing only reads src */
    status = copy_block(x, bd, es, j, &gathered, (char *)src, x->send + (size_t)j * bytes, 1);
  if (status == ATTN_STATUS_OK) status = exchange(x, x->send, x->recv, bytes);
  return status;
}

/* The inverse: head-split src (dense, dims of dst with dim[tdim] = T and dim[hdim] = H / n) ->
 * the caller's sequence-split dst. */
static attn_status from_heads(exch *x, const char *src, int tdim, int hdim, int64_t T,
                              const int32_t *cu, const view *dst) {
  int64_t bd[4];
  memcpy(bd, dst->dim, sizeof bd);
  const int64_t hn = dst->dim[hdim] / x->n;
  bd[hdim] = hn;
  const size_t bytes = (size_t)(bd[0] * bd[1] * bd[2] * bd[3]) * dst->es;
  attn_status status = send_rows_home(x, src, bd, dst->es, tdim, hdim, T, cu);
  const block_place mine = {dst->stride, hdim, tdim, hn, 0, NULL};
  for (int32_t i = 0; i < x->n && status == ATTN_STATUS_OK; ++i)
    status = copy_block(x, bd, dst->es, i, &mine, dst->data, x->recv + (size_t)i * bytes, 0);
  return status;
}

/* The buffers of one run: the head-split tensors, and on a GPU the block's workspace and the
 * [Hq, S] staging of dsinks. */
typedef struct heads {
  char *q, *k, *v, *bias, *mask, *qseg, *kseg, *out, *lse, *dout, *dq, *dk, *dv, *dbias, *dsinks;
  char *dsinks_all; /* GPU: every local head's dsinks, zero but for this rank's heads */
  float *dbias_acc; /* a bias broadcast over heads or rows: the local dbias's sums (give_dbias) */
  int32_t *cu_q, *cu_k; /* packed varlen: the block's cu_seqlens, the whole sequences' */
  void *workspace;
  size_t workspace_size;
} heads;

/* Hands out consecutive 256-byte aligned pieces of base; with base NULL it only counts. exch: the
 * largest exchanged buffer so far (the send and receive buffers' size). */
typedef struct arena {
  char *base;
  size_t used, exch;
} arena;

static char *take(arena *a, int64_t elements, size_t es, int exchanged) {
  const size_t bytes = (size_t)elements * es;
  char *p = a->base != NULL ? a->base + a->used : NULL;
  a->used += (bytes + 255) / 256 * 256;
  if (exchanged && bytes > a->exch) a->exch = bytes;
  return p;
}

static int64_t volume(const int64_t s[4]) { return s[0] * s[1] * s[2] * s[3]; }

/* The run's buffers in a (u: the problem the all-to-all gives each rank). A head-split tensor
 * holds as many elements as the n blocks of one exchange (T/n rows x n, H/n heads), so the send
 * and receive buffers are each the largest of them. */
static void lay_out(const attn_dist_plan *plan, exch *x, const attn_problem *u, int backward,
                    const attn_grads *grads, heads *h, arena *a) {
  const attn_problem *l = &plan->local;
  const attn_dtype dt = (attn_dtype)l->dtype, st = attn_stat_dtype(dt);
  const size_t es = attn_dtype_size(dt), ses = attn_dtype_size(st);
  const size_t bes = l->has_bias ? attn_dtype_size((attn_dtype)l->bias_dtype) : 0;
  /* dense [B, T, H, D] rows; packed [1, total, H, D], which is [total, H, D] */
  const int64_t B = x->cu_q != NULL ? 1 : l->batch, Tq = x->rows_q, Tk = x->rows_k;
  const int64_t hn = u->heads_q, kn = u->heads_kv, D = l->head_dim, Dv = l->head_dim_v;
  if (x->cu_q != NULL) {
    h->cu_q = (int32_t *)take(a, l->batch + 1, 4, 0);
    h->cu_k = (int32_t *)take(a, l->batch + 1, 4, 0);
  }
  h->q = take(a, B * Tq * hn * D, es, 1);
  h->k = take(a, B * Tk * kn * D, es, 1);
  h->v = take(a, B * Tk * kn * Dv, es, 1);
  if (l->has_bias && l->bias_shape[2] != 1) h->bias = take(a, volume(u->bias_shape), bes, 1);
  if (l->has_mask && l->mask_shape[2] != 1) h->mask = take(a, volume(u->mask_shape), 1, 1);
  if (l->has_segment_ids) h->qseg = take(a, B * Tq, 4, 1), h->kseg = take(a, B * Tk, 4, 1);
  h->out = take(a, B * Tq * hn * Dv, es, 1);
  h->lse = take(a, B * hn * Tq, ses, 1);
  if (backward) {
    h->dout = take(a, B * Tq * hn * Dv, es, 1);
    h->dq = take(a, B * Tq * hn * D, es, 1);
    h->dk = take(a, B * Tk * kn * D, es, 1);
    h->dv = take(a, B * Tk * kn * Dv, es, 1);
    if (grads->dbias.data != NULL) {
      h->dbias = take(a, volume(u->bias_shape), bes, 1);
      if (l->bias_shape[1] == 1 || l->bias_shape[2] == 1)
        h->dbias_acc = (float *)take(a, volume(l->bias_shape), 4, 0);
    }
    if (grads->dsinks.data != NULL) {
      h->dsinks = take(a, (l->sinks_shared ? 1 : hn) * l->num_sinks, ses, 0);
      if (x->device && !l->sinks_shared)
        h->dsinks_all = take(a, l->heads_q * l->num_sinks, ses, 0);
    }
  }
  const size_t exch_bytes = a->exch;
  x->send = take(a, (int64_t)exch_bytes, 1, 0);
  x->recv = take(a, (int64_t)exch_bytes, 1, 0);
  if (x->device && !plan->hybrid) { /* (the hybrid's ring keeps its blocks' workspace) */
    size_t f = 0, b = 0;
    if (attn_plan_workspace_size(plan->block_plan, &f, &b) != ATTN_STATUS_OK) f = b = 0;
    h->workspace_size = backward ? b : f;
    h->workspace = h->workspace_size > 0 ? take(a, (int64_t)h->workspace_size, 1, 0) : NULL;
  }
}

/* At least `bytes` of the tensors' memory for the run's buffers, kept by the plan. A GPU buffer
 * is replaced only once the work that may still read it is done. */
static attn_status run_memory(attn_dist_plan *plan, const exch *x, size_t bytes, char **base) {
  if (plan->a2a_mem_size < bytes) {
    attn_dist_ulysses_release(plan);
    char why[512] = "";
    attn_status status = ATTN_STATUS_OK;
    if (x->device) {
      const attn_gpu_ops *gpu = attn_gpu();
      status = gpu == NULL ? ATTN_STATUS_DEVICE_ERROR
                           : gpu->alloc(plan->local.device_index, bytes, &plan->a2a_mem, why,
                                        sizeof why);
    } else {
      plan->a2a_mem = malloc(bytes);
      if (plan->a2a_mem == NULL) status = ATTN_STATUS_OUT_OF_MEMORY;
    }
    if (status != ATTN_STATUS_OK)
      return attn_fail(plan->ctx, status, "the all-to-all's buffers (%zu bytes): %s", bytes,
                       why[0] ? why : "out of memory");
    plan->a2a_mem_size = bytes;
  }
  *base = plan->a2a_mem;
  return ATTN_STATUS_OK;
}

void attn_dist_ulysses_release(attn_dist_plan *plan) {
  if (plan->a2a_mem == NULL) return;
  if (plan->local.device == ATTN_DEVICE_CPU) {
    free(plan->a2a_mem);
  } else {
    char why[8];
    const attn_gpu_ops *gpu = attn_gpu();
    if (plan->dev != NULL) /* the plan's stream may still read it */
      (void)plan->dev->stream_sync(plan->local.device_index, plan->stream, why, 0);
    if (gpu != NULL) gpu->release(plan->local.device_index, plan->a2a_mem);
  }
  plan->a2a_mem = NULL;
  plan->a2a_mem_size = 0;
}

/* Lays out the run's buffers in the plan's memory: counted first, then placed. */
static attn_status make_heads(attn_dist_plan *plan, exch *x, const attn_problem *u, int backward,
                              const attn_grads *grads, heads *h) {
  arena count = {NULL, 0, 0};
  memset(h, 0, sizeof *h);
  lay_out(plan, x, u, backward, grads, h, &count);
  char *base = NULL;
  attn_status status = run_memory(plan, x, count.used, &base);
  if (status != ATTN_STATUS_OK) return status;
  arena placed = {base, 0, 0};
  memset(h, 0, sizeof *h);
  lay_out(plan, x, u, backward, grads, h, &placed);
  return ATTN_STATUS_OK;
}

/* The head-split inputs of the plan's all-to-all problem, in hi (into the buffers of h). */
static attn_status gather_inputs(attn_dist_plan *plan, exch *x, const attn_problem *u,
                                 const attn_inputs *in, const heads *h, attn_inputs *hi) {
  const attn_problem *l = &plan->local;
  const attn_dtype dt = (attn_dtype)l->dtype, st = attn_stat_dtype(dt);
  const size_t es = attn_dtype_size(dt), ses = attn_dtype_size(st);
  const int64_t B = l->batch, Tql = l->seqlen_q, Tkl = l->seqlen_k, Hq = l->heads_q,
                Hkv = l->heads_kv;
  const int64_t Tq = u->seqlen_q, Tk = u->seqlen_k, hn = u->heads_q;
  *hi = *in;
  view vq = rows_view(x, &in->q, 0, Hq, l->head_dim, es),
       vk = rows_view(x, &in->k, 1, Hkv, l->head_dim, es);
  view vv = rows_view(x, &in->v, 1, Hkv, l->head_dim_v, es);
  attn_status status = to_heads(x, &vq, 1, 2, x->rows_q, x->cu_q, h->q);
  if (status == ATTN_STATUS_OK) status = to_heads(x, &vk, 1, 2, x->rows_k, x->cu_k, h->k);
  if (status == ATTN_STATUS_OK) status = to_heads(x, &vv, 1, 2, x->rows_k, x->cu_k, h->v);
  if (status != ATTN_STATUS_OK) return status;
  hi->q = attn_tensor_dense(h->q), hi->k = attn_tensor_dense(h->k), hi->v = attn_tensor_dense(h->v);
  if (x->cu_q != NULL) hi->cu_seqlens_q = h->cu_q, hi->cu_seqlens_k = h->cu_k;
  /* bias and mask: rows exchanged when they have them, heads sliced when they have them. */
  for (int t = 0; t < 2; ++t) {
    const int is_bias = t == 0;
    if (is_bias ? !l->has_bias : !l->has_mask) continue;
    const int64_t *shape = is_bias ? l->bias_shape : l->mask_shape;
    const int64_t *ushape = is_bias ? u->bias_shape : u->mask_shape;
    const attn_tensor *src = is_bias ? &in->bias : &in->mask;
    const size_t bes = is_bias ? attn_dtype_size((attn_dtype)l->bias_dtype) : 1;
    view vb = make_view(src, shape, 4, bes);
    attn_tensor *dst = is_bias ? &hi->bias : &hi->mask;
    if (shape[2] != 1) {
      char *buf = is_bias ? h->bias : h->mask;
      status = to_heads(x, &vb, 2, shape[1] != 1 ? 1 : -1, Tq, NULL, buf);
      if (status != ATTN_STATUS_OK) return status;
      *dst = attn_tensor_dense(buf);
    } else {
      /* No rows to exchange: this rank's heads are a slice of its own copy. */
      const int64_t h0 = shape[1] != 1 ? (int64_t)x->me * ushape[1] : 0;
      dst->data = vb.data + (size_t)(h0 * vb.stride[1]) * bes;
      memcpy(dst->stride, vb.stride, sizeof vb.stride);
    }
  }
  if (l->has_segment_ids) {
    const int64_t sq[2] = {B, Tql}, sk[2] = {B, Tkl};
    view a = make_view(&in->q_segment_ids, sq, 2, 4), b = make_view(&in->kv_segment_ids, sk, 2, 4);
    status = to_heads(x, &a, 1, -1, Tq, NULL, h->qseg);
    if (status == ATTN_STATUS_OK) status = to_heads(x, &b, 1, -1, Tk, NULL, h->kseg);
    if (status != ATTN_STATUS_OK) return status;
    hi->q_segment_ids = attn_tensor_dense(h->qseg),
    hi->kv_segment_ids = attn_tensor_dense(h->kseg);
  }
  if (l->alibi != ATTN_ALIBI_NONE) {
    const int per_batch = l->alibi == ATTN_ALIBI_PER_BATCH_HEAD;
    const int64_t shape[2] = {per_batch ? B : Hq, Hq};
    view va = make_view(&in->alibi_slopes, shape, per_batch ? 2 : 1, ses);
    const int64_t hstride = per_batch ? va.stride[1] : va.stride[0];
    hi->alibi_slopes.data = va.data + (size_t)((int64_t)x->me * hn * hstride) * ses;
    memcpy(hi->alibi_slopes.stride, va.stride, sizeof va.stride);
  }
  if (l->num_sinks > 0 && !l->sinks_shared) {
    const int64_t shape[2] = {Hq, l->num_sinks};
    view vs2 = make_view(&in->sinks, shape, 2, ses);
    hi->sinks.data = vs2.data + (size_t)((int64_t)x->me * hn * vs2.stride[0]) * ses;
    memcpy(hi->sinks.stride, vs2.stride, sizeof vs2.stride);
  }
  return ATTN_STATUS_OK;
}

/* Packed varlen: this rank's cu_seqlens, read on the host (a GPU's downloaded once the caller's
 * stream has written them), checked, and the rows the all-to-all gathers: n times each sequence's
 * local rows, which must make whole chunks of the layout (plan->chunks a rank). */
static attn_status packed_rows(attn_dist_plan *plan, exch *x, const attn_inputs *in) {
  const attn_problem *l = &plan->local;
  if (l->varlen != ATTN_VARLEN_PACKED) return ATTN_STATUS_OK;
  const int64_t B = l->batch;
  x->cu_q = malloc(2 * (size_t)(B + 1) * sizeof(int32_t));
  if (x->cu_q == NULL)
    return attn_fail(plan->ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory for cu_seqlens");
  x->cu_k = x->cu_q + B + 1;
  const size_t bytes = (size_t)(B + 1) * sizeof(int32_t);
  if (!x->device) {
    memcpy(x->cu_q, in->cu_seqlens_q, bytes);
    memcpy(x->cu_k, in->cu_seqlens_k, bytes);
  } else {
    const attn_gpu_ops *gpu = attn_gpu();
    char why[512] = "";
    attn_status status =
        gpu == NULL ? ATTN_STATUS_DEVICE_ERROR
                    : plan->dev->stream_sync(l->device_index, plan->stream, why, sizeof why);
    if (status == ATTN_STATUS_OK)
      status = gpu->download(l->device_index, x->cu_q, in->cu_seqlens_q, bytes, why, sizeof why);
    if (status == ATTN_STATUS_OK)
      status = gpu->download(l->device_index, x->cu_k, in->cu_seqlens_k, bytes, why, sizeof why);
    if (status != ATTN_STATUS_OK)
      return attn_fail(plan->ctx, ATTN_STATUS_DEVICE_ERROR, "reading cu_seqlens: %s", why);
  }
  for (int t = 0; t < 2; ++t) {
    const int32_t *cu = t == 0 ? x->cu_q : x->cu_k;
    const int64_t total = t == 0 ? l->total_q : l->total_k;
    const char *name = t == 0 ? "cu_seqlens_q" : "cu_seqlens_k";
    if (cu[0] != 0 || cu[B] != total)
      return attn_fail(plan->ctx, ATTN_STATUS_INVALID_ARGUMENT,
                       "inputs.%s must run from 0 to this rank's %lld rows (%s / %d sequence "
                       "ranks); it runs from %d to %d",
                       name, (long long)total, t == 0 ? "total_q" : "total_k", (int)x->n,
                       (int)cu[0], (int)cu[B]);
    const int64_t longest = t == 0 ? plan->global.seqlen_q : plan->global.seqlen_k;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t len = (int64_t)cu[b + 1] - cu[b];
      if (len * x->n > longest)
        return attn_fail(plan->ctx, ATTN_STATUS_INVALID_ARGUMENT,
                         "inputs.%s: sequence %lld has %lld local rows, so %lld in all, more "
                         "than the problem's %s=%lld",
                         name, (long long)b, (long long)len, (long long)(len * x->n),
                         t == 0 ? "seqlen_q" : "seqlen_k", (long long)longest);
      if (len < 0 || len % plan->chunks != 0)
        return attn_fail(plan->ctx, ATTN_STATUS_INVALID_ARGUMENT,
                         "inputs.%s: sequence %lld has %lld local rows; under a split sequence "
                         "each rank holds every sequence's %s (%d chunk%s of %lld / (%d x %d) "
                         "rows), so its local rows must be a non-negative multiple of %d",
                         name, (long long)b, (long long)len,
                         plan->chunks == 2 ? "two zigzag chunks" : "contiguous slice",
                         (int)plan->chunks, plan->chunks == 2 ? "s" : "", (long long)(len * x->n),
                         (int)x->n, (int)plan->chunks, (int)plan->chunks);
    }
  }
  x->rows_q = (int64_t)x->n * l->total_q, x->rows_k = (int64_t)x->n * l->total_k;
  return ATTN_STATUS_OK;
}

/* The block's cu_seqlens (the whole sequences': n times the local ones) into h, in the tensors'
 * memory. */
static attn_status block_cu(attn_dist_plan *plan, const exch *x, const heads *h) {
  if (x->cu_q == NULL) return ATTN_STATUS_OK;
  const int64_t B = plan->local.batch;
  int32_t *host = x->device ? malloc(2 * (size_t)(B + 1) * sizeof(int32_t)) : h->cu_q;
  if (host == NULL)
    return attn_fail(plan->ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory for cu_seqlens");
  int32_t *host_k = x->device ? host + B + 1 : h->cu_k;
  for (int64_t b = 0; b <= B; ++b) host[b] = x->n * x->cu_q[b], host_k[b] = x->n * x->cu_k[b];
  attn_status status = ATTN_STATUS_OK;
  if (x->device) { /* the legacy stream's upload is waited for: the plan's stream does not */
    const attn_gpu_ops *gpu = attn_gpu();
    const size_t bytes = (size_t)(B + 1) * sizeof(int32_t);
    char why[512] = "";
    status = gpu->upload(plan->local.device_index, h->cu_q, host, bytes, why, sizeof why);
    if (status == ATTN_STATUS_OK)
      status = gpu->upload(plan->local.device_index, h->cu_k, host_k, bytes, why, sizeof why);
    if (status == ATTN_STATUS_OK)
      status = plan->dev->stream_sync(plan->local.device_index, NULL, why, sizeof why);
    free(host);
    if (status != ATTN_STATUS_OK)
      return attn_fail(plan->ctx, ATTN_STATUS_DEVICE_ERROR, "writing cu_seqlens: %s", why);
  }
  return status;
}

/* The block's global batch and head offsets, where the plan needs them (dropout's counters; on the
 * host every sub-plan takes them). */
static attn_status place(attn_dist_plan *plan, exch *x) {
  if (!attn_dist_needs_positions(plan)) return ATTN_STATUS_OK;
  attn_positions pos;
  memset(&pos, 0, sizeof pos);
  pos.batch0 = plan->b0;
  pos.head0 = plan->h0 + (int64_t)x->me * plan->block.heads_q;
  return attn_plan_set_positions(plan->block_plan, &pos);
}

attn_status attn_dist_ulysses_forward(attn_dist_plan *plan, const attn_inputs *in,
                                      const attn_outputs *out) {
  attn_ctx *ctx = plan->ctx;
  if (in->q.data == NULL || in->k.data == NULL || in->v.data == NULL || out->out.data == NULL)
    return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                     "q, k, v and out are required (one is NULL)");
  if (out->probs.data != NULL)
    return attn_fail(ctx, ATTN_STATUS_UNSUPPORTED,
                     "outputs.probs under sequence sharding: not implemented");
  const attn_problem *l = &plan->local, *u = plan->hybrid ? &plan->ring_local : &plan->block;
  exch x = make_exch(plan, u);
  const attn_dtype dt = (attn_dtype)l->dtype, st = attn_stat_dtype(dt);
  const size_t es = attn_dtype_size(dt), ses = attn_dtype_size(st);
  heads h;
  attn_inputs hi;
  attn_status status = packed_rows(plan, &x, in);
  if (status == ATTN_STATUS_OK) status = make_heads(plan, &x, u, 0, NULL, &h);
  if (status == ATTN_STATUS_OK) status = block_cu(plan, &x, &h);
  if (status == ATTN_STATUS_OK) status = gather_inputs(plan, &x, u, in, &h, &hi);
  if (status == ATTN_STATUS_OK && !plan->hybrid) status = place(plan, &x);
  if (status == ATTN_STATUS_OK) {
    attn_outputs ho;
    attn_outputs_init(&ho);
    ho.out = attn_tensor_dense(h.out);
    ho.lse = attn_tensor_dense(h.lse);
    /* A block that fails here fails on every rank alike (the same agreed problem); should one
     * rank fail alone, its peers' next exchange ends at the plan's timeout. */
    if (plan->hybrid) { /* the ring over the outer axis, on the group's slice of these heads */
      status = attn_dist_ring_forward(plan, &hi, &ho);
    } else {
      const double t0 = attn_dist_now();
      status = attn_plan_forward(plan->block_plan, &hi, h.workspace, h.workspace_size, &ho);
      plan->stats.compute_seconds += attn_dist_now() - t0;
    }
  }
  if (status == ATTN_STATUS_OK) {
    view vo = rows_view(&x, &out->out, 0, l->heads_q, l->head_dim_v, es);
    status = from_heads(&x, h.out, 1, 2, x.rows_q, x.cu_q, &vo);
  }
  if (status == ATTN_STATUS_OK && out->lse.data != NULL) {
    view vl = lse_view(&x, &out->lse, ses);
    status = from_heads(&x, h.lse, 2, 1, x.rows_q, x.cu_q, &vl);
  }
  free(x.cu_q);
  return status == ATTN_STATUS_OK ? attn_succeed(ctx) : status;
}

/* The caller's dsinks: this rank's heads' share (its heads' rows for per-head sinks, its whole
 * share for shared ones), zero for the other heads, then summed over the ranks that share the sink
 * slice (the sequence ranks among them), which completes it. */
static attn_status give_dsinks(attn_dist_plan *plan, exch *x, const heads *h,
                               const attn_tensor *dsinks) {
  const attn_problem *l = &plan->local;
  const attn_dtype st = attn_stat_dtype((attn_dtype)l->dtype);
  const size_t ses = attn_dtype_size(st);
  const int64_t S = l->num_sinks, heads = l->sinks_shared ? 1 : l->heads_q, hn = plan->block.heads_q;
  const int64_t shape[2] = {l->sinks_shared ? S : heads, S};
  view vs2 = make_view(dsinks, shape, l->sinks_shared ? 1 : 2, ses);
  if (!x->device) {
    for (int64_t hh = 0; hh < heads; ++hh)
      for (int64_t t = 0; t < S; ++t) {
        double value = 0.0;
        if (l->sinks_shared)
          value = attn_load(h->dsinks, st, t);
        else if (hh / hn == x->me)
          value = attn_load(h->dsinks, st, (hh % hn) * S + t);
        attn_store(vs2.data, st,
                   l->sinks_shared ? t * vs2.stride[0] : hh * vs2.stride[0] + t * vs2.stride[1],
                   value);
      }
  } else {
    /* dsinks are f32 on a GPU (the cuda kernels' stat dtype) */
    const int32_t dev = plan->local.device_index;
    char why[512] = "";
    const int64_t dense[4] = {S, 1, 0, 0};
    attn_status status = ATTN_STATUS_OK;
    const char *from = h->dsinks;
    if (!l->sinks_shared) {
      const int64_t mine[4] = {hn, S, 1, 1};
      status = plan->dev->fill(dev, (float *)h->dsinks_all, heads * S, 0.0f, plan->stream, why,
                               sizeof why);
      if (status == ATTN_STATUS_OK)
        status = plan->dev->copy(dev, h->dsinks_all + (size_t)(x->me * hn * S) * ses, dense,
                                 h->dsinks, dense, mine, ses, plan->stream, why, sizeof why);
      from = h->dsinks_all;
    }
    const int64_t all[4] = {shape[0], l->sinks_shared ? 1 : S, 1, 1};
    const int64_t to[4] = {vs2.stride[0], l->sinks_shared ? 0 : vs2.stride[1], 0, 0};
    const int64_t src_stride[4] = {l->sinks_shared ? 1 : S, 1, 0, 0};
    if (status == ATTN_STATUS_OK)
      status = plan->dev->copy(dev, vs2.data, to, from, src_stride, all, ses, plan->stream, why,
                               sizeof why);
    if (status != ATTN_STATUS_OK) return device_failed(x, status, "giving dsinks", why);
  }
  return attn_dist_reduce_dsinks(plan, dsinks);
}

/* ---- dbias of a bias broadcast over heads or query rows: sums ------------------------------- */

/* The shares of a broadcast bias's dbias are summed in f32 (as the blocks of a ring are), in a
 * dense accumulator of the local dbias's shape: by loops on the host, by the cuda module's
 * kernels on a GPU. */
static attn_status sum_clear(const exch *x, float *acc, int64_t n) {
  attn_dist_plan *plan = x->plan;
  if (!x->device) {
    memset(acc, 0, (size_t)n * sizeof *acc);
    return ATTN_STATUS_OK;
  }
  char why[512] = "";
  const attn_status status =
      plan->dev->fill(plan->local.device_index, acc, n, 0.0f, plan->stream, why, sizeof why);
  return status == ATTN_STATUS_OK ? status : device_failed(x, status, "clearing dbias", why);
}

/* acc[b, row0 + i, e] += blk[b, i, e] for b < B, i < rows, e < width (acc of T rows; blk dense,
 * of dtype dt). */
static attn_status sum_add(const exch *x, float *acc, int64_t T, int64_t row0, const char *blk,
                           attn_dtype dt, int64_t B, int64_t rows, int64_t width) {
  attn_dist_plan *plan = x->plan;
  if (!x->device) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t e = 0; e < width; ++e)
          acc[(b * T + row0 + i) * width + e] += (float)attn_load(blk, dt, (b * rows + i) * width + e);
    return ATTN_STATUS_OK;
  }
  char why[512] = "";
  const attn_status status =
      plan->dev->accumulate(plan->local.device_index, acc, T, row0, blk, (int32_t)dt, B, rows,
                            width, plan->stream, why, sizeof why);
  return status == ATTN_STATUS_OK ? status : device_failed(x, status, "summing dbias", why);
}

/* The caller's tensor (dims and strides of dst) = acc, rounded to dt. */
static attn_status sum_store(const exch *x, const view *dst, attn_dtype dt, const float *acc) {
  attn_dist_plan *plan = x->plan;
  if (!x->device) {
    int64_t e = 0;
    for (int64_t a = 0; a < dst->dim[0]; ++a)
      for (int64_t b = 0; b < dst->dim[1]; ++b)
        for (int64_t c = 0; c < dst->dim[2]; ++c)
          for (int64_t d = 0; d < dst->dim[3]; ++d)
            attn_store(dst->data, dt,
                       a * dst->stride[0] + b * dst->stride[1] + c * dst->stride[2] +
                           d * dst->stride[3],
                       acc[e++]);
    return ATTN_STATUS_OK;
  }
  char why[512] = "";
  const attn_status status = plan->dev->store(plan->local.device_index, dst->data, (int32_t)dt,
                                              dst->stride, acc, dst->dim, plan->stream, why,
                                              sizeof why);
  return status == ATTN_STATUS_OK ? status : device_failed(x, status, "writing dbias", why);
}

/* The caller's dbias from the block's (u's shape: this rank's heads, every row of the all-to-all),
 * then summed over the ranks whose bias broadcasts along a dimension they split. A bias with heads
 * and rows: the rows go home (from_heads). Without rows: every row's share of this rank's heads is
 * in the block: its heads' rows of dbias (heads broadcast: its heads' part of the sum), zeros
 * elsewhere, and the sum over the sequence ranks, which split the broadcast rows, completes it.
 * Rows broadcast over heads: the block holds every row's share of this rank's heads, so each
 * rank's rows go home through the all-to-all, where the n shares are summed. */
static attn_status give_dbias(attn_dist_plan *plan, exch *x, const attn_problem *u,
                              const heads *h, const attn_tensor *dbias) {
  const attn_problem *l = &plan->local;
  const int64_t *ls = l->bias_shape;
  const attn_dtype bdt = (attn_dtype)l->bias_dtype;
  const size_t bes = attn_dtype_size(bdt);
  view vb = make_view(dbias, ls, 4, bes);
  attn_status status = ATTN_STATUS_OK;
  if (ls[1] != 1 && ls[2] != 1) {
    status = from_heads(x, h->dbias, 2, 1, u->seqlen_q, NULL, &vb);
  } else if (ls[2] == 1) {
    const int64_t hb = u->bias_shape[1]; /* the block's heads (1 when broadcast) */
    status = sum_clear(x, h->dbias_acc, volume(ls));
    if (status == ATTN_STATUS_OK)
      status = sum_add(x, h->dbias_acc, ls[1], ls[1] != 1 ? (int64_t)x->me * hb : 0, h->dbias,
                       bdt, ls[0], hb, ls[3]);
    if (status == ATTN_STATUS_OK) status = sum_store(x, &vb, bdt, h->dbias_acc);
  } else { /* [b, 1, local rows, keys] from each rank */
    const int64_t n = volume(vb.dim);
    const size_t bytes = (size_t)n * bes;
    status = send_rows_home(x, h->dbias, vb.dim, bes, 2, -1, u->seqlen_q, NULL);
    if (status == ATTN_STATUS_OK) status = sum_clear(x, h->dbias_acc, n);
    for (int32_t i = 0; i < x->n && status == ATTN_STATUS_OK; ++i)
      status = sum_add(x, h->dbias_acc, 1, 0, x->recv + (size_t)i * bytes, bdt, 1, 1, n);
    if (status == ATTN_STATUS_OK) status = sum_store(x, &vb, bdt, h->dbias_acc);
  }
  /* Broadcast over batch with the batch split, or over rows: the other ranks' shares. */
  if (status == ATTN_STATUS_OK) status = attn_dist_reduce_dbias_tensor(plan, dbias);
  return status;
}

attn_status attn_dist_ulysses_backward(attn_dist_plan *plan, const attn_inputs *in,
                                       const attn_outputs *fwd, const attn_tensor *dout,
                                       const attn_grads *grads) {
  attn_ctx *ctx = plan->ctx;
  if (in->q.data == NULL || in->k.data == NULL || in->v.data == NULL || fwd->out.data == NULL ||
      fwd->lse.data == NULL || dout->data == NULL || grads->dq.data == NULL ||
      grads->dk.data == NULL || grads->dv.data == NULL)
    return attn_fail(
        ctx, ATTN_STATUS_INVALID_ARGUMENT,
        "q, k, v, forward.out, forward.lse, dout, dq, dk and dv are required (one is NULL)");
  const attn_problem *l = &plan->local, *u = plan->hybrid ? &plan->ring_local : &plan->block;
  exch x = make_exch(plan, u);
  const attn_dtype dt = (attn_dtype)l->dtype, st = attn_stat_dtype(dt);
  const size_t es = attn_dtype_size(dt), ses = attn_dtype_size(st);
  heads h;
  attn_inputs hi;
  attn_status status = packed_rows(plan, &x, in);
  if (status == ATTN_STATUS_OK) status = make_heads(plan, &x, u, 1, grads, &h);
  if (status == ATTN_STATUS_OK) status = block_cu(plan, &x, &h);
  if (status == ATTN_STATUS_OK) status = gather_inputs(plan, &x, u, in, &h, &hi);
  const int64_t Hq = l->heads_q, Hkv = l->heads_kv, D = l->head_dim, Dv = l->head_dim_v;
  if (status == ATTN_STATUS_OK) {
    view vo = rows_view(&x, &fwd->out, 0, Hq, Dv, es), vd = rows_view(&x, dout, 0, Hq, Dv, es);
    view vl = lse_view(&x, &fwd->lse, ses);
    status = to_heads(&x, &vo, 1, 2, x.rows_q, x.cu_q, h.out);
    if (status == ATTN_STATUS_OK) status = to_heads(&x, &vd, 1, 2, x.rows_q, x.cu_q, h.dout);
    if (status == ATTN_STATUS_OK) status = to_heads(&x, &vl, 2, 1, x.rows_q, x.cu_q, h.lse);
  }
  if (status == ATTN_STATUS_OK && !plan->hybrid) status = place(plan, &x);
  if (status == ATTN_STATUS_OK) {
    attn_outputs hf;
    attn_outputs_init(&hf);
    hf.out = attn_tensor_dense(h.out);
    hf.lse = attn_tensor_dense(h.lse);
    attn_tensor hd = attn_tensor_dense(h.dout);
    attn_grads hg;
    attn_grads_init(&hg);
    hg.dq = attn_tensor_dense(h.dq), hg.dk = attn_tensor_dense(h.dk),
    hg.dv = attn_tensor_dense(h.dv);
    if (h.dbias != NULL) hg.dbias = attn_tensor_dense(h.dbias);
    if (h.dsinks != NULL) hg.dsinks = attn_tensor_dense(h.dsinks);
    if (plan->hybrid) {
      status = attn_dist_ring_backward(plan, &hi, &hf, &hd, &hg);
    } else {
      const double t0 = attn_dist_now();
      status = attn_plan_backward(plan->block_plan, &hi, &hf, &hd, h.workspace, h.workspace_size,
                                  &hg);
      plan->stats.compute_seconds += attn_dist_now() - t0;
    }
  }
  if (status == ATTN_STATUS_OK) {
    view vq = rows_view(&x, &grads->dq, 0, Hq, D, es), vk = rows_view(&x, &grads->dk, 1, Hkv, D, es);
    view vv = rows_view(&x, &grads->dv, 1, Hkv, Dv, es);
    status = from_heads(&x, h.dq, 1, 2, x.rows_q, x.cu_q, &vq);
    if (status == ATTN_STATUS_OK) status = from_heads(&x, h.dk, 1, 2, x.rows_k, x.cu_k, &vk);
    if (status == ATTN_STATUS_OK) status = from_heads(&x, h.dv, 1, 2, x.rows_k, x.cu_k, &vv);
  }
  if (status == ATTN_STATUS_OK && h.dbias != NULL)
    status = give_dbias(plan, &x, u, &h, &grads->dbias);
  if (status == ATTN_STATUS_OK && h.dsinks != NULL)
    status = give_dsinks(plan, &x, &h, &grads->dsinks);
  free(x.cu_q);
  return status == ATTN_STATUS_OK ? attn_succeed(ctx) : status;
}
