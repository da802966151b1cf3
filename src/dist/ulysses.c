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
 */
#include "dist/dist.h"

#include "core/ctx.h"
#include "core/dtype.h"
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

typedef struct exch {
  attn_dist_plan *plan;
  void *comm; /* the all-to-all's ranks */
  int32_t n, me;
  /* 0: rows arrive in natural order (the whole sequence); 1 (hybrid): in the order of the ring
   * group's slice, whose C chunks each member holds 1/n of. */
  int group_order;
} exch;

/* Where row t of member i's slice sits among the T rows gathered by the all-to-all. */
static int64_t gathered_row(const exch *x, int64_t T, int32_t i, int64_t t) {
  if (!x->group_order) return attn_dist_layout_position(x->plan->layout, x->n, T, i, t);
  const int64_t chunk_len = T / x->plan->chunks, part = chunk_len / x->n;
  return (t / part) * chunk_len + (int64_t)i * part + t % part;
}

static exch make_exch(attn_dist_plan *plan) {
  exch x;
  x.plan = plan;
  x.comm = plan->hybrid ? plan->a2a_comm : plan->seq_comm;
  x.n = plan->hybrid ? plan->a2a_n : plan->ns;
  x.me = plan->hybrid ? plan->a2a_r : plan->seq_rank;
  x.group_order = plan->hybrid;
  return x;
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

/* Where element idx of rank r's block lies in a whole tensor: its heads start at r * heads along
 * hdim (heads 0: no shift), its rows are rank r's sequence rows of T (T 0: rows as they are), and
 * stride maps the index to an element offset. */
typedef struct block_place {
  const int64_t *stride;
  int hdim, tdim;
  int64_t heads, T;
} block_place;

/* Copies rank r's block (dims bd, dense in packed) out of the tensor at base (pack = 1) or into it
 * (pack = 0), placed as pl says: each side of an all-to-all is one call per rank. The innermost
 * dim is a run of consecutive elements in packed; where neither the heads nor the rows are that
 * dim, the placement is worked out once per run, and a run that is contiguous in the tensor too
 * (the usual [B, T, H, D]) is one memcpy (per element, place and copy took twice the attention's
 * own time on two ranks). */
static void copy_block(const exch *x, const int64_t bd[4], size_t es, int32_t r,
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
      if (pl->T > 0) idx[pl->tdim] = gathered_row(x, pl->T, r, idx[pl->tdim]);
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

/* The row-major strides of a dense tensor of dims d. */
static void dense_strides(const int64_t d[4], int64_t s[4]) {
  s[3] = 1, s[2] = d[3], s[1] = d[2] * d[3], s[0] = d[1] * d[2] * d[3];
}

/* Sequence-split (local rows of dim tdim, all heads of dim hdim) -> head-split (every row, in
 * natural order, 1/n of the heads; every head when hdim < 0). dst: dense, of the source's dims with
 * dim[tdim] = T and dim[hdim] = H / n. */
static attn_status to_heads(exch *x, const view *src, int tdim, int hdim, int64_t T, char *dst) {
  int64_t bd[4];
  memcpy(bd, src->dim, sizeof bd);
  const int64_t hn = hdim >= 0 ? src->dim[hdim] / x->n : 0;
  if (hdim >= 0) bd[hdim] = hn;
  const int64_t block = bd[0] * bd[1] * bd[2] * bd[3];
  const size_t bytes = (size_t)block * src->es;
  char *send = malloc(2 * (size_t)x->n * bytes + 1);
  if (send == NULL)
    return attn_fail(x->plan->ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory for an all-to-all");
  char *recv = send + (size_t)x->n * bytes;
  const block_place mine = {src->stride, hdim, tdim, hn, 0};
  for (int32_t j = 0; j < x->n; ++j)
    copy_block(x, bd, src->es, j, &mine, src->data, send + (size_t)j * bytes, 1);
  attn_status status = exchange(x, send, recv, bytes);
  if (status == ATTN_STATUS_OK) {
    int64_t dd[4], ds[4];
    memcpy(dd, bd, sizeof dd);
    dd[tdim] = T;
    dense_strides(dd, ds);
    const block_place gathered = {ds, hdim, tdim, 0, T};
    for (int32_t i = 0; i < x->n; ++i)
      copy_block(x, bd, src->es, i, &gathered, dst, recv + (size_t)i * bytes, 0);
  }
  free(send);
  return status;
}

/* The inverse: head-split src (dense, dims of dst with dim[tdim] = T and dim[hdim] = H / n) ->
 * the caller's sequence-split dst. */
static attn_status from_heads(exch *x, const char *src, int tdim, int hdim, int64_t T,
                              const view *dst) {
  int64_t bd[4];
  memcpy(bd, dst->dim, sizeof bd);
  const int64_t hn = dst->dim[hdim] / x->n;
  bd[hdim] = hn;
  int64_t sd[4], ss[4];
  memcpy(sd, bd, sizeof sd);
  sd[tdim] = T;
  dense_strides(sd, ss);
  const int64_t block = bd[0] * bd[1] * bd[2] * bd[3];
  const size_t bytes = (size_t)block * dst->es;
  char *send = malloc(2 * (size_t)x->n * bytes + 1);
  if (send == NULL)
    return attn_fail(x->plan->ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory for an all-to-all");
  char *recv = send + (size_t)x->n * bytes;
  const block_place gathered = {ss, hdim, tdim, 0, T};
  for (int32_t j = 0; j < x->n; ++j) /* copy_block only reads the tensor when packing */
    copy_block(x, bd, dst->es, j, &gathered, (char *)src, send + (size_t)j * bytes, 1);
  attn_status status = exchange(x, send, recv, bytes);
  if (status == ATTN_STATUS_OK) {
    const block_place mine = {dst->stride, hdim, tdim, hn, 0};
    for (int32_t i = 0; i < x->n; ++i)
      copy_block(x, bd, dst->es, i, &mine, dst->data, recv + (size_t)i * bytes, 0);
  }
  free(send);
  return status;
}

/* Buffers that hold the head-split tensors of one run. */
typedef struct heads {
  char *q, *k, *v, *bias, *mask, *qseg, *kseg, *out, *lse, *dout, *dq, *dk, *dv, *dbias, *dsinks;
} heads;

static void free_heads(heads *h) {
  char *all[] = {h->q,   h->k,    h->v,  h->bias, h->mask, h->qseg,  h->kseg,  h->out,
                 h->lse, h->dout, h->dq, h->dk,   h->dv,   h->dbias, h->dsinks};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) free(all[i]);
}

static char *alloc_bytes(size_t bytes) { return calloc(bytes > 0 ? bytes : 1, 1); }

/* The head-split inputs of the plan's all-to-all problem, in hi (and their buffers in h). */
static attn_status gather_inputs(attn_dist_plan *plan, exch *x, const attn_problem *u,
                                 const attn_inputs *in, heads *h, attn_inputs *hi) {
  const attn_problem *l = &plan->local;
  const attn_dtype dt = (attn_dtype)l->dtype, st = attn_stat_dtype(dt);
  const size_t es = attn_dtype_size(dt), ses = attn_dtype_size(st);
  const int64_t B = l->batch, Tql = l->seqlen_q, Tkl = l->seqlen_k, Hq = l->heads_q,
                Hkv = l->heads_kv;
  const int64_t Tq = u->seqlen_q, Tk = u->seqlen_k, hn = u->heads_q, kn = u->heads_kv;
  *hi = *in;
  const int64_t qs[4] = {B, Tql, Hq, l->head_dim}, ks[4] = {B, Tkl, Hkv, l->head_dim};
  const int64_t vs[4] = {B, Tkl, Hkv, l->head_dim_v};
  view vq = make_view(&in->q, qs, 4, es), vk = make_view(&in->k, ks, 4, es),
       vv = make_view(&in->v, vs, 4, es);
  h->q = alloc_bytes((size_t)(B * Tq * hn * l->head_dim) * es);
  h->k = alloc_bytes((size_t)(B * Tk * kn * l->head_dim) * es);
  h->v = alloc_bytes((size_t)(B * Tk * kn * l->head_dim_v) * es);
  if (h->q == NULL || h->k == NULL || h->v == NULL)
    return attn_fail(plan->ctx, ATTN_STATUS_OUT_OF_MEMORY,
                     "out of memory for the head-split q, k, v");
  attn_status status = to_heads(x, &vq, 1, 2, Tq, h->q);
  if (status == ATTN_STATUS_OK) status = to_heads(x, &vk, 1, 2, Tk, h->k);
  if (status == ATTN_STATUS_OK) status = to_heads(x, &vv, 1, 2, Tk, h->v);
  if (status != ATTN_STATUS_OK) return status;
  hi->q = attn_tensor_dense(h->q), hi->k = attn_tensor_dense(h->k), hi->v = attn_tensor_dense(h->v);
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
      char *buf = alloc_bytes((size_t)(ushape[0] * ushape[1] * ushape[2] * ushape[3]) * bes);
      if (buf == NULL)
        return attn_fail(plan->ctx, ATTN_STATUS_OUT_OF_MEMORY,
                         "out of memory for the head-split bias");
      if (is_bias)
        h->bias = buf;
      else
        h->mask = buf;
      status = to_heads(x, &vb, 2, shape[1] != 1 ? 1 : -1, Tq, buf);
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
    h->qseg = alloc_bytes((size_t)(B * Tq) * 4);
    h->kseg = alloc_bytes((size_t)(B * Tk) * 4);
    if (h->qseg == NULL || h->kseg == NULL)
      return attn_fail(plan->ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory for the segment ids");
    status = to_heads(x, &a, 1, -1, Tq, h->qseg);
    if (status == ATTN_STATUS_OK) status = to_heads(x, &b, 1, -1, Tk, h->kseg);
    if (status != ATTN_STATUS_OK) return status;
    hi->q_segment_ids = attn_tensor_dense(h->qseg), hi->kv_segment_ids = attn_tensor_dense(h->kseg);
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

static attn_status place(attn_dist_plan *plan, exch *x) {
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
  exch x = make_exch(plan);
  const attn_problem *l = &plan->local, *u = plan->hybrid ? &plan->ring_local : &plan->block;
  const attn_dtype dt = (attn_dtype)l->dtype, st = attn_stat_dtype(dt);
  const size_t es = attn_dtype_size(dt), ses = attn_dtype_size(st);
  heads h;
  memset(&h, 0, sizeof h);
  attn_inputs hi;
  attn_status status = gather_inputs(plan, &x, u, in, &h, &hi);
  if (status == ATTN_STATUS_OK) {
    h.out = alloc_bytes((size_t)(u->batch * u->seqlen_q * u->heads_q * u->head_dim_v) * es);
    h.lse = alloc_bytes((size_t)(u->batch * u->heads_q * u->seqlen_q) * ses);
    if (h.out == NULL || h.lse == NULL)
      status = attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory for the head-split out");
  }
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
      status = attn_plan_forward(plan->block_plan, &hi, NULL, 0, &ho);
      plan->stats.compute_seconds += attn_dist_now() - t0;
    }
  }
  const int64_t os[4] = {l->batch, l->seqlen_q, l->heads_q, l->head_dim_v};
  const int64_t ls[3] = {l->batch, l->heads_q, l->seqlen_q};
  if (status == ATTN_STATUS_OK) {
    view vo = make_view(&out->out, os, 4, es);
    status = from_heads(&x, h.out, 1, 2, u->seqlen_q, &vo);
  }
  if (status == ATTN_STATUS_OK && out->lse.data != NULL) {
    view vl = make_view(&out->lse, ls, 3, ses);
    status = from_heads(&x, h.lse, 2, 1, u->seqlen_q, &vl);
  }
  free_heads(&h);
  return status == ATTN_STATUS_OK ? attn_succeed(ctx) : status;
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
  exch x = make_exch(plan);
  const attn_dtype dt = (attn_dtype)l->dtype, st = attn_stat_dtype(dt);
  const size_t es = attn_dtype_size(dt), ses = attn_dtype_size(st);
  const int64_t B = l->batch, Tq = u->seqlen_q, Tk = u->seqlen_k, hn = u->heads_q, kn = u->heads_kv;
  heads h;
  memset(&h, 0, sizeof h);
  attn_inputs hi;
  attn_status status = gather_inputs(plan, &x, u, in, &h, &hi);
  const int64_t os[4] = {B, l->seqlen_q, l->heads_q, l->head_dim_v};
  const int64_t ls[3] = {B, l->heads_q, l->seqlen_q};
  const int64_t qs[4] = {B, l->seqlen_q, l->heads_q, l->head_dim};
  const int64_t ks[4] = {B, l->seqlen_k, l->heads_kv, l->head_dim};
  const int64_t vs[4] = {B, l->seqlen_k, l->heads_kv, l->head_dim_v};
  if (status == ATTN_STATUS_OK) {
    h.out = alloc_bytes((size_t)(B * Tq * hn * l->head_dim_v) * es);
    h.dout = alloc_bytes((size_t)(B * Tq * hn * l->head_dim_v) * es);
    h.lse = alloc_bytes((size_t)(B * hn * Tq) * ses);
    h.dq = alloc_bytes((size_t)(B * Tq * hn * l->head_dim) * es);
    h.dk = alloc_bytes((size_t)(B * Tk * kn * l->head_dim) * es);
    h.dv = alloc_bytes((size_t)(B * Tk * kn * l->head_dim_v) * es);
    if (grads->dbias.data != NULL)
      h.dbias = alloc_bytes(
          (size_t)(u->bias_shape[0] * u->bias_shape[1] * u->bias_shape[2] * u->bias_shape[3]) *
          attn_dtype_size((attn_dtype)l->bias_dtype));
    if (grads->dsinks.data != NULL)
      h.dsinks = alloc_bytes((size_t)((l->sinks_shared ? 1 : hn) * l->num_sinks) * ses);
    if (h.out == NULL || h.dout == NULL || h.lse == NULL || h.dq == NULL || h.dk == NULL ||
        h.dv == NULL || (grads->dbias.data != NULL && h.dbias == NULL) ||
        (grads->dsinks.data != NULL && h.dsinks == NULL))
      status =
          attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory for the head-split tensors");
  }
  if (status == ATTN_STATUS_OK) {
    view vo = make_view(&fwd->out, os, 4, es), vd = make_view(dout, os, 4, es);
    view vl = make_view(&fwd->lse, ls, 3, ses);
    status = to_heads(&x, &vo, 1, 2, Tq, h.out);
    if (status == ATTN_STATUS_OK) status = to_heads(&x, &vd, 1, 2, Tq, h.dout);
    if (status == ATTN_STATUS_OK) status = to_heads(&x, &vl, 2, 1, Tq, h.lse);
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
      status = attn_plan_backward(plan->block_plan, &hi, &hf, &hd, NULL, 0, &hg);
      plan->stats.compute_seconds += attn_dist_now() - t0;
    }
  }
  if (status == ATTN_STATUS_OK) {
    view vq = make_view(&grads->dq, qs, 4, es), vk = make_view(&grads->dk, ks, 4, es);
    view vv = make_view(&grads->dv, vs, 4, es);
    status = from_heads(&x, h.dq, 1, 2, Tq, &vq);
    if (status == ATTN_STATUS_OK) status = from_heads(&x, h.dk, 1, 2, Tk, &vk);
    if (status == ATTN_STATUS_OK) status = from_heads(&x, h.dv, 1, 2, Tk, &vv);
  }
  if (status == ATTN_STATUS_OK && h.dbias != NULL) {
    view vb =
        make_view(&grads->dbias, l->bias_shape, 4, attn_dtype_size((attn_dtype)l->bias_dtype));
    status = from_heads(&x, h.dbias, 2, 1, Tq, &vb);
    /* Broadcast over batch with the batch split: the other batch ranks' shares. */
    if (status == ATTN_STATUS_OK && plan->bias_comm != NULL) {
      const int64_t *s = l->bias_shape;
      double *buf = malloc((size_t)(s[0] * s[1] * s[2] * s[3]) * sizeof(double) + 1);
      if (buf == NULL)
        status = attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory for dbias");
      const attn_dtype bdt = (attn_dtype)l->bias_dtype;
      int64_t e = 0;
      for (int64_t a = 0; buf != NULL && a < s[0]; ++a)
        for (int64_t b = 0; b < s[1]; ++b)
          for (int64_t c = 0; c < s[2]; ++c)
            for (int64_t d = 0; d < s[3]; ++d)
              buf[e++] = attn_load(vb.data, bdt,
                                   a * vb.stride[0] + b * vb.stride[1] + c * vb.stride[2] +
                                       d * vb.stride[3]);
      if (buf != NULL) status = attn_dist_reduce_dbias(plan, buf);
      e = 0;
      for (int64_t a = 0; buf != NULL && status == ATTN_STATUS_OK && a < s[0]; ++a)
        for (int64_t b = 0; b < s[1]; ++b)
          for (int64_t c = 0; c < s[2]; ++c)
            for (int64_t d = 0; d < s[3]; ++d)
              attn_store(vb.data, bdt,
                         a * vb.stride[0] + b * vb.stride[1] + c * vb.stride[2] + d * vb.stride[3],
                         buf[e++]);
      free(buf);
    }
  }
  if (status == ATTN_STATUS_OK && h.dsinks != NULL) {
    /* This rank's heads' share of dsinks, zero for the others; the sum over the ranks that share
     * the sink slice (the sequence ranks among them) completes it. */
    const int64_t S = l->num_sinks, heads = l->sinks_shared ? 1 : l->heads_q;
    const int64_t shape[2] = {l->sinks_shared ? S : heads, S};
    view vs2 = make_view(&grads->dsinks, shape, l->sinks_shared ? 1 : 2, ses);
    for (int64_t hh = 0; hh < heads; ++hh)
      for (int64_t t = 0; t < S; ++t) {
        double value = 0.0;
        if (l->sinks_shared)
          value = attn_load(h.dsinks, st, t);
        else if (hh / hn == x.me)
          value = attn_load(h.dsinks, st, (hh % hn) * S + t);
        attn_store(vs2.data, st,
                   l->sinks_shared ? t * vs2.stride[0] : hh * vs2.stride[0] + t * vs2.stride[1],
                   value);
      }
    status = attn_dist_reduce_dsinks(plan, &grads->dsinks);
  }
  free_heads(&h);
  return status == ATTN_STATUS_OK ? attn_succeed(ctx) : status;
}
