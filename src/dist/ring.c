/*
 * src/dist/ring.c - ring attention: a problem whose sequence is split over the ranks of a ring.
 *
 * Rank r of n holds a slice of q, k and v (one chunk, or two in the zigzag layout). Forward: the
 * K/V slices travel around the ring, one hop per step; at step s rank r holds the slice of rank
 * src = r - s and computes its queries against it (one single-device block per pair of chunks,
 * placed at the chunks' global positions, so causal masks, windows, ALiBi and dropout keep their
 * global meaning) while the next slice is already in flight (nonblocking send and receive). Each
 * block gives a partial output normalised by its own sum and the block's lse; merging through the
 * lse gives exactly the softmax over all keys:
 *     lse = log(e^lse_a + e^lse_b),   out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b.
 * Sinks enter once, as one more block: the local queries against no keys and only the sinks
 * (out 0, lse = logsumexp of the sinks). Blocks that the causal mask or window hides entirely are
 * skipped, and the ring stops after the last step at which any rank still sees a block.
 *
 * Backward: with the global out and lse, each block's single-device backward gives exact partial
 * gradients (P = exp(x - lse) and Delta = dout . out are the global ones). dq is summed locally; the
 * dK/dV partial sums travel with their K/V slice and, after the last step, go home to their owner.
 */
#include "dist/dist.h"

#include "core/ctx.h"
#include "core/dtype.h"
#include "core/gpu.h"
#include "impl/impl.h"
#include "plan/plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TAG_KV 1
#define TAG_DKV 2

/* Everything one run shares: sizes of the local problem and of its blocks. */
typedef struct ring {
  attn_dist_plan *plan;
  const attn_problem *l;                     /* local problem */
  attn_dtype dt, stat;                       /* tensors, and lse / sinks */
  size_t es;                                 /* bytes per tensor element */
  int64_t B, Hq, Hkv, D, Dv, Tq, Tk, nq, nk; /* local sizes; nq, nk: chunk lengths */
  int32_t n, r, C;  /* ring size, this rank's place in it, chunks per rank */
  int64_t o_global; /* alignment offset of the global problem */
  int64_t wl, wr;   /* window of the global problem, causal folded in (-1 = unbounded) */
  int seg;          /* segment ids travel with K/V */
  size_t k_bytes, v_bytes, seg_bytes, kv_bytes; /* one travelling K/V slice, packed */
  /* strides of the caller's tensors */
  int64_t qs[4], ks[4], vs[4], bias_s[4], mask_s[4], qseg_s[4], kseg_s[4], os[4], lses[4];
} ring;

/* Byte sizes of the parts of a scratch buffer, rounded so that every part starts 256-byte aligned
 * (the cuda kernels need 16-byte aligned tensors; the host path does not mind). */
static int64_t round_part(int64_t x) { return (x + 255) / 256 * 256; }

static void init_ring(ring *g, attn_dist_plan *plan, const attn_inputs *in, const attn_tensor *out,
                      const attn_tensor *lse) {
  memset(g, 0, sizeof *g);
  g->plan = plan;
  g->l = &plan->ring_local;
  const attn_problem *l = g->l;
  g->dt = (attn_dtype)l->dtype;
  g->stat = attn_stat_dtype(g->dt);
  g->es = attn_dtype_size(g->dt);
  g->B = l->batch, g->Hq = l->heads_q, g->Hkv = l->heads_kv, g->D = l->head_dim;
  g->Dv = l->head_dim_v, g->Tq = l->seqlen_q, g->Tk = l->seqlen_k;
  g->C = plan->chunks, g->nq = g->Tq / g->C, g->nk = g->Tk / g->C;
  g->n = plan->ring_n, g->r = plan->ring_r;
  const attn_problem *G = &plan->global;
  g->o_global = G->align == ATTN_ALIGN_BOTTOM_RIGHT ? G->seqlen_k - G->seqlen_q : 0;
  g->wl = G->window_left, g->wr = G->window_right;
  g->seg = l->has_segment_ids;
  g->k_bytes = (size_t)round_part(g->B * g->Tk * g->Hkv * g->D * (int64_t)g->es);
  g->v_bytes = (size_t)round_part(g->B * g->Tk * g->Hkv * g->Dv * (int64_t)g->es);
  g->seg_bytes = g->seg ? (size_t)round_part(g->B * g->Tk * 4) : 0;
  g->kv_bytes = g->k_bytes + g->v_bytes + g->seg_bytes;
  const int64_t qshape[4] = {g->B, g->Tq, g->Hq, g->D}, kshape[4] = {g->B, g->Tk, g->Hkv, g->D};
  const int64_t vshape[4] = {g->B, g->Tk, g->Hkv, g->Dv}, oshape[4] = {g->B, g->Tq, g->Hq, g->Dv};
  const int64_t lshape[3] = {g->B, g->Hq, g->Tq};
  attn_dist_strides(&in->q, qshape, 4, g->qs);
  attn_dist_strides(&in->k, kshape, 4, g->ks);
  attn_dist_strides(&in->v, vshape, 4, g->vs);
  if (l->has_bias) attn_dist_strides(&in->bias, l->bias_shape, 4, g->bias_s);
  if (l->has_mask) attn_dist_strides(&in->mask, l->mask_shape, 4, g->mask_s);
  if (g->seg) {
    const int64_t qseg[2] = {g->B, g->Tq}, kseg[2] = {g->B, g->Tk};
    attn_dist_strides(&in->q_segment_ids, qseg, 2, g->qseg_s);
    attn_dist_strides(&in->kv_segment_ids, kseg, 2, g->kseg_s);
  }
  if (out != NULL) attn_dist_strides(out, oshape, 4, g->os);
  if (lse != NULL) attn_dist_strides(lse, lshape, 3, g->lses);
}

/* ---- geometry -------------------------------------------------------------------------------- */

/* The alignment offset of the block of query chunk a (of this rank) against key chunk c of rank
 * src: global row = local row + q start, global key = local key + k start. */
static int64_t block_offset(const ring *g, int32_t r, int32_t a, int32_t src, int32_t c) {
  const attn_problem *G = &g->plan->global;
  int64_t q0 = attn_dist_chunk_start(g->plan, G->seqlen_q, r, a);
  int64_t k0 = attn_dist_chunk_start(g->plan, G->seqlen_k, src, c);
  return q0 - k0 + g->o_global;
}

/* Whether any key of a block is inside the window of any of its rows: row i sees keys
 * [i + off - wl, i + off + wr], so the rows together see [off - wl, nq - 1 + off + wr]. */
static int block_visible(const ring *g, int64_t off) {
  if (g->wr >= 0 && g->nq - 1 + off + g->wr < 0) return 0;
  if (g->wl >= 0 && off - g->wl > g->nk - 1) return 0;
  return 1;
}

static int step_visible(const ring *g, int32_t r, int32_t s) {
  const int32_t src = ((r - s) % g->n + g->n) % g->n;
  for (int32_t a = 0; a < g->C; ++a)
    for (int32_t c = 0; c < g->C; ++c)
      if (block_visible(g, block_offset(g, r, a, src, c))) return 1;
  return 0;
}

/* The last step at which any rank of the ring sees a block: every rank computes the same value,
 * so all stop together, and the ring ends early when a window hides the rest. */
static int32_t last_step(const ring *g) {
  int32_t last = 0;
  for (int32_t r = 0; r < g->n; ++r)
    for (int32_t s = 1; s < g->n; ++s)
      if (step_visible(g, r, s) && s > last) last = s;
  return last;
}

/* ---- scratch --------------------------------------------------------------------------------- */

static attn_status get_scratch(attn_dist_plan *plan, size_t bytes, char **base) {
  if (plan->scratch_size < bytes) {
    free(plan->scratch);
    plan->scratch = NULL;
    plan->scratch_size = 0;
    plan->scratch = malloc(bytes);
    if (plan->scratch == NULL)
      return attn_fail(plan->ctx, ATTN_STATUS_OUT_OF_MEMORY,
                       "out of memory allocating %zu bytes of ring scratch", bytes);
    plan->scratch_size = bytes;
  }
  *base = plan->scratch;
  return ATTN_STATUS_OK;
}

/* Packs the caller's local K, V (and kv segment ids) densely into one message. */
static void pack_kv(const ring *g, const attn_inputs *in, char *buf) {
  char *k = buf, *v = buf + g->k_bytes;
  int32_t *seg = (int32_t *)(buf + g->k_bytes + g->v_bytes);
  const int dist_threads = attn_dist_host_threads(g->plan);
  DIST_PARALLEL_FOR
  for (int64_t bt = 0; bt < g->B * g->Tk; ++bt) { /* one (batch, key) row of every head */
    const int64_t b = bt / g->Tk, t = bt % g->Tk;
    for (int64_t h = 0; h < g->Hkv; ++h) {
      const int64_t kat = (bt * g->Hkv + h) * g->D, vat = (bt * g->Hkv + h) * g->Dv;
      const char *ks = (const char *)in->k.data + (size_t)(b * g->ks[0] + t * g->ks[1] + h * g->ks[2]) * g->es;
      const char *vs = (const char *)in->v.data + (size_t)(b * g->vs[0] + t * g->vs[1] + h * g->vs[2]) * g->es;
      for (int64_t d = 0; d < g->D; ++d)
        memcpy(k + (size_t)(kat + d) * g->es, ks + (size_t)(d * g->ks[3]) * g->es, g->es);
      for (int64_t d = 0; d < g->Dv; ++d)
        memcpy(v + (size_t)(vat + d) * g->es, vs + (size_t)(d * g->vs[3]) * g->es, g->es);
    }
    if (g->seg)
      seg[bt] = ((const int32_t *)in->kv_segment_ids.data)[b * g->kseg_s[0] + t * g->kseg_s[1]];
  }
}

/* ---- one block ------------------------------------------------------------------------------- */

/* The inputs of the block of query chunk a against key chunk c of the packed slice kv, whose
 * keys start at global position k0. */
static attn_inputs block_inputs(const ring *g, const attn_inputs *in, int32_t a, const char *kv,
                                int32_t c, int64_t k0) {
  attn_inputs bi = *in;
  const int64_t q_row = (int64_t)a * g->nq, k_row = (int64_t)c * g->nk;
  bi.q.data = (char *)in->q.data + (size_t)(q_row * g->qs[1]) * g->es;
  memcpy(bi.q.stride, g->qs, sizeof g->qs);
  bi.k.data = (char *)kv + (size_t)(k_row * g->Hkv * g->D) * g->es;
  bi.k.stride[0] = g->Tk * g->Hkv * g->D, bi.k.stride[1] = g->Hkv * g->D;
  bi.k.stride[2] = g->D, bi.k.stride[3] = 1;
  bi.v.data = (char *)kv + g->k_bytes + (size_t)(k_row * g->Hkv * g->Dv) * g->es;
  bi.v.stride[0] = g->Tk * g->Hkv * g->Dv, bi.v.stride[1] = g->Hkv * g->Dv;
  bi.v.stride[2] = g->Dv, bi.v.stride[3] = 1;
  const attn_problem *l = g->l;
  if (l->has_bias) {
    const size_t bes = attn_dtype_size((attn_dtype)l->bias_dtype);
    int64_t off = (l->bias_shape[2] != 1 ? q_row * g->bias_s[2] : 0) +
                  (l->bias_shape[3] != 1 ? k0 * g->bias_s[3] : 0);
    bi.bias.data = (char *)in->bias.data + (size_t)off * bes;
    memcpy(bi.bias.stride, g->bias_s, sizeof g->bias_s);
  }
  if (l->has_mask) {
    int64_t off = (l->mask_shape[2] != 1 ? q_row * g->mask_s[2] : 0) +
                  (l->mask_shape[3] != 1 ? k0 * g->mask_s[3] : 0);
    bi.mask.data = (char *)in->mask.data + off;
    memcpy(bi.mask.stride, g->mask_s, sizeof g->mask_s);
  }
  if (g->seg) {
    bi.q_segment_ids.data = (int32_t *)in->q_segment_ids.data + q_row * g->qseg_s[1];
    memcpy(bi.q_segment_ids.stride, g->qseg_s, sizeof g->qseg_s);
    bi.kv_segment_ids.data = (int32_t *)(kv + g->k_bytes + g->v_bytes) + k_row;
    bi.kv_segment_ids.stride[0] = g->Tk, bi.kv_segment_ids.stride[1] = 1;
    bi.kv_segment_ids.stride[2] = bi.kv_segment_ids.stride[3] = 0;
  }
  bi.sinks.data = NULL; /* sinks enter once, through the sinks plan */
  return bi;
}

static attn_status place_block(const ring *g, int32_t a, int32_t src, int32_t c) {
  const attn_problem *G = &g->plan->global;
  attn_positions pos;
  memset(&pos, 0, sizeof pos);
  pos.batch0 = g->plan->b0;
  pos.head0 = g->plan->ring_head0;
  pos.row0 = attn_dist_chunk_start(g->plan, G->seqlen_q, g->r, a);
  pos.col0 = attn_dist_chunk_start(g->plan, G->seqlen_k, src, c);
  pos.has_offset = 1;
  pos.offset = pos.row0 - pos.col0 + g->o_global;
  return attn_plan_set_positions(g->plan->block_plan, &pos);
}

/* Merges a partial result (rows [row0, row0 + rows) of the local queries: out_blk dense
 * [B, rows, Hq, Dv] of the tensor dtype, lse_blk dense [B, Hq, rows]) into the accumulators
 * (double: acc_out [B, Tq, Hq, Dv], acc_lse [B, Hq, Tq]). */
static void merge(const ring *g, const void *out_blk, const void *lse_blk, int64_t row0,
                  int64_t rows, double *acc_out, double *acc_lse) {
  const int dist_threads = attn_dist_host_threads(g->plan);
  DIST_PARALLEL_FOR
  for (int64_t bh = 0; bh < g->B * g->Hq; ++bh) { /* one (batch, head) */
    const int64_t b = bh / g->Hq, h = bh % g->Hq;
    for (int64_t i = 0; i < rows; ++i) {
      const double l = attn_load(lse_blk, g->stat, bh * rows + i);
      if (l == -INFINITY) continue; /* nothing visible in this block */
      double *L = &acc_lse[bh * g->Tq + row0 + i];
      const double m = *L > l ? *L : l;
      const double total = m + log(exp(*L - m) + exp(l - m));
      const double wa = exp(*L - total), wb = exp(l - total);
      double *acc = acc_out + ((b * g->Tq + row0 + i) * g->Hq + h) * g->Dv;
      const int64_t from = ((b * rows + i) * g->Hq + h) * g->Dv;
      for (int64_t d = 0; d < g->Dv; ++d)
        acc[d] = acc[d] * wa + attn_load(out_blk, g->dt, from + d) * wb;
      *L = total;
    }
  }
}

/* ---- transfers ------------------------------------------------------------------------------- */

typedef struct transfer {
  void *send, *recv; /* requests, NULL when none */
} transfer;

static attn_status start_shift(ring *g, const void *send_buf, void *recv_buf, size_t bytes,
                               int32_t to, int32_t from, int32_t tag, transfer *t) {
  attn_dist_plan *plan = g->plan;
  char why[512] = "";
  t->send = t->recv = NULL;
  attn_status status;
  if (plan->ops->shift != NULL) /* one grouped operation: its request waits for both halves */
    status = (attn_status)plan->ops->shift(plan->ring_comm, send_buf, to, recv_buf, from, bytes,
                                           tag, &t->recv, why, sizeof why);
  else
    status = (attn_status)plan->ops->irecv(plan->ring_comm, recv_buf, bytes, from, tag, &t->recv,
                                           why, sizeof why);
  if (status == ATTN_STATUS_OK && plan->ops->shift == NULL)
    status = (attn_status)plan->ops->isend(plan->ring_comm, send_buf, bytes, to, tag, &t->send, why,
                                           sizeof why);
  if (status != ATTN_STATUS_OK) {
    plan->broken = 1;
    return attn_fail(plan->ctx, status, "ring rank %d: %s", (int)g->r, why);
  }
  plan->stats.bytes_sent += (int64_t)bytes;
  return ATTN_STATUS_OK;
}

static attn_status finish_shift_wait(ring *g, transfer *t, int32_t to, int32_t from) {
  attn_dist_plan *plan = g->plan;
  char why[512] = "";
  attn_status status = (attn_status)plan->ops->wait(plan->ring_comm, t->recv,
                                                    plan->spec.timeout_seconds, why, sizeof why);
  t->recv = NULL;
  if (status != ATTN_STATUS_OK) {
    plan->ops->wait(plan->ring_comm, t->send, 0.0, why + strlen(why), 0);
    t->send = NULL;
    plan->broken = 1;
    return attn_fail(plan->ctx, status, "ring rank %d receiving from ring rank %d: %s", (int)g->r,
                     (int)from, why);
  }
  status = (attn_status)plan->ops->wait(plan->ring_comm, t->send, plan->spec.timeout_seconds, why,
                                        sizeof why);
  t->send = NULL;
  if (status != ATTN_STATUS_OK) {
    plan->broken = 1;
    return attn_fail(plan->ctx, status, "ring rank %d sending to ring rank %d: %s", (int)g->r,
                     (int)to, why);
  }
  return ATTN_STATUS_OK;
}

/* Completes a shift; the time blocked here is the communication the blocks did not hide. */
static attn_status finish_shift(ring *g, transfer *t, int32_t to, int32_t from) {
  const double start = attn_dist_now();
  attn_status status = finish_shift_wait(g, t, to, from);
  g->plan->stats.wait_seconds += attn_dist_now() - start;
  return status;
}

/* Between blocks: gives the transport a chance to move the transfers in flight along (MPI's
 * rendezvous protocols often copy only inside MPI calls), so they overlap the next block. */
static void progress(ring *g, const transfer *t) {
  if (g->plan->ops->progress == NULL) return;
  if (t->recv != NULL) g->plan->ops->progress(g->plan->ring_comm, t->recv);
  if (t->send != NULL) g->plan->ops->progress(g->plan->ring_comm, t->send);
}

/* After a failed block, the transfers in flight still have to be waited for (briefly) so their
 * buffers are not freed under MPI; the plan is marked broken either way. */
static void abandon(ring *g, transfer *t) {
  char why[8];
  if (t->recv != NULL) g->plan->ops->wait(g->plan->ring_comm, t->recv, 1.0, why, sizeof why);
  if (t->send != NULL) g->plan->ops->wait(g->plan->ring_comm, t->send, 1.0, why, sizeof why);
  t->recv = t->send = NULL;
  g->plan->broken = 1;
}

/* ---- the device ring (CUDA tensors) ---------------------------------------------------------- */

/* The same ring on a GPU: the blocks and every merge and sum run in order on the caller's stream
 * (the plan's), the K/V slices and dK/dV sums travel on the ring's own stream, and an event
 * recorded on the caller's stream after a step's blocks keeps the next transfer from overwriting
 * the buffer they read. A transfer's wait blocks the host only: the blocks of the step were
 * enqueued before it, so the GPU computes while the slice moves. Accumulators are f32 (what the
 * cuda kernels keep per row); blocks run without positions (see device_block_plan). */

/* What a device operation's failure leaves: work may be in flight, so the plan is broken. */
static attn_status dev_fail(attn_dist_plan *plan, attn_status status, const char *what,
                            const char *why) {
  plan->broken = 1;
  return attn_fail(plan->ctx, status, "device ring, %s: %s", what, why);
}

/* Calls plan->dev->fn(args..., why, size); on failure sets status and jumps to done. */
#define DEV(what, fn, ...)                                                                         \
  do {                                                                                             \
    char why_[512] = "";                                                                           \
    attn_status st_ = plan->dev->fn(__VA_ARGS__, why_, sizeof why_);                               \
    if (st_ != ATTN_STATUS_OK) {                                                                   \
      status = dev_fail(plan, st_, what, why_);                                                    \
      goto done;                                                                                   \
    }                                                                                              \
  } while (0)

/* The plan of a visible block, chosen by its offset instead of placed at global positions (the
 * cuda kernels take none): under a causal mask the plan accepts only problems whose blocks are
 * square and either on the diagonal (offset 0: the causal block plan) or entirely below it (every
 * key visible: the full plan); without a mask every block is a full one. */
static attn_plan *device_block_plan(const ring *g, int64_t off) {
  return g->plan->full_plan != NULL && off != 0 ? g->plan->full_plan : g->plan->block_plan;
}

/* Bytes of device workspace the blocks need, forward and backward, 256-byte rounded. */
static size_t device_workspace_bytes(const attn_dist_plan *plan) {
  size_t most = 0;
  const attn_plan *plans[2] = {plan->block_plan, plan->full_plan};
  for (int i = 0; i < 2; ++i) {
    size_t f = 0, b = 0;
    if (plans[i] == NULL || attn_plan_workspace_size(plans[i], &f, &b) != ATTN_STATUS_OK) continue;
    if (f > most) most = f;
    if (b > most) most = b;
  }
  return (size_t)round_part((int64_t)most);
}

/* The ring's stream, its event and at least `bytes` of device scratch, made on first use. A
 * larger scratch replaces the old one once the work that may still read it is done. */
static attn_status device_setup(attn_dist_plan *plan, size_t bytes, char **base) {
  const int32_t dev = plan->global.device_index;
  const attn_gpu_ops *gpu = attn_gpu();
  char why[512] = "";
  attn_status status = ATTN_STATUS_OK;
  if (gpu == NULL)
    return attn_fail(plan->ctx, ATTN_STATUS_DEVICE_ERROR, "this build has no CUDA runtime");
  if (plan->comm_stream == NULL)
    status = plan->dev->stream_create(dev, &plan->comm_stream, why, sizeof why);
  if (status == ATTN_STATUS_OK && plan->compute_done == NULL)
    status = plan->dev->event_create(dev, &plan->compute_done, why, sizeof why);
  if (status == ATTN_STATUS_OK && plan->dscratch_size < bytes) {
    status = plan->dev->stream_sync(dev, plan->stream, why, sizeof why);
    if (status == ATTN_STATUS_OK)
      status = plan->dev->stream_sync(dev, plan->comm_stream, why, sizeof why);
    if (status == ATTN_STATUS_OK) {
      gpu->release(dev, plan->dscratch);
      plan->dscratch = NULL;
      plan->dscratch_size = 0;
      status = gpu->alloc(dev, bytes, &plan->dscratch, why, sizeof why);
      if (status == ATTN_STATUS_OK) plan->dscratch_size = bytes;
    }
  }
  if (status != ATTN_STATUS_OK)
    return attn_fail(plan->ctx, status, "device ring scratch (%zu bytes): %s", bytes, why);
  *base = plan->dscratch;
  return ATTN_STATUS_OK;
}

void attn_dist_device_release(attn_dist_plan *plan) {
  const int32_t dev = plan->global.device_index;
  char why[8];
  if (plan->dev != NULL && plan->comm_stream != NULL)
    (void)plan->dev->stream_sync(dev, plan->comm_stream, why, 0);
  const attn_gpu_ops *gpu = plan->dscratch != NULL ? attn_gpu() : NULL;
  if (gpu != NULL) gpu->release(dev, plan->dscratch); /* cudaFree waits for the device */
  if (plan->dev != NULL) {
    plan->dev->event_destroy(dev, plan->compute_done);
    plan->dev->stream_destroy(dev, plan->comm_stream);
  }
  plan->dscratch = plan->comm_stream = plan->compute_done = NULL;
  plan->dscratch_size = 0;
}

attn_status attn_dist_local_workspace(attn_dist_plan *plan, int backward, void **workspace,
                                      size_t *size) {
  *workspace = NULL;
  *size = 0;
  if (plan->local.device == ATTN_DEVICE_CPU) return ATTN_STATUS_OK; /* the plan allocates */
  size_t f = 0, b = 0;
  attn_status status = attn_plan_workspace_size(plan->local_plan, &f, &b);
  const size_t need = backward ? b : f;
  if (status != ATTN_STATUS_OK || need == 0) return status;
  if (plan->dscratch_size < need) {
    const attn_gpu_ops *gpu = attn_gpu();
    char why[512] = "";
    if (gpu == NULL)
      return attn_fail(plan->ctx, ATTN_STATUS_DEVICE_ERROR, "this build has no CUDA runtime");
    /* The old buffer may still be read by work queued on the caller's stream. */
    status = gpu->synchronize(plan->local.device_index, why, sizeof why);
    if (status == ATTN_STATUS_OK) {
      gpu->release(plan->local.device_index, plan->dscratch);
      plan->dscratch = NULL;
      plan->dscratch_size = 0;
      status = gpu->alloc(plan->local.device_index, need, &plan->dscratch, why, sizeof why);
    }
    if (status != ATTN_STATUS_OK)
      return attn_fail(plan->ctx, status, "device workspace (%zu bytes): %s", need, why);
    plan->dscratch_size = need;
  }
  *workspace = plan->dscratch;
  *size = plan->dscratch_size;
  return ATTN_STATUS_OK;
}

/* The ring's transfers go on its own stream for the run, and back on the caller's after. */
static void transfers_on(attn_dist_plan *plan, void *stream) {
  if (plan->ops->set_stream != NULL) plan->ops->set_stream(plan->ring_comm, stream);
}

/* Packs the caller's local K and V densely into one message, on the caller's stream. */
static attn_status device_pack_kv(const ring *g, const attn_inputs *in, char *buf) {
  attn_dist_plan *plan = g->plan;
  const int32_t dev = plan->global.device_index;
  attn_status status = ATTN_STATUS_OK;
  const int64_t kshape[4] = {g->B, g->Tk, g->Hkv, g->D}, vshape[4] = {g->B, g->Tk, g->Hkv, g->Dv};
  const int64_t kd[4] = {g->Tk * g->Hkv * g->D, g->Hkv * g->D, g->D, 1};
  const int64_t vd[4] = {g->Tk * g->Hkv * g->Dv, g->Hkv * g->Dv, g->Dv, 1};
  DEV("packing K", copy, dev, buf, kd, in->k.data, g->ks, kshape, g->es, plan->stream);
  DEV("packing V", copy, dev, buf + g->k_bytes, vd, in->v.data, g->vs, vshape, g->es, plan->stream);
done:
  return status;
}

/* Before a transfer that overwrites a buffer the caller's stream last read (or sends one it last
 * wrote): the ring's stream waits for the caller's work so far. */
static attn_status device_order_transfer(attn_dist_plan *plan) {
  const int32_t dev = plan->global.device_index;
  attn_status status = ATTN_STATUS_OK;
  DEV("ordering a transfer", record, dev, plan->compute_done, plan->stream);
  DEV("ordering a transfer", stream_wait, dev, plan->comm_stream, plan->compute_done);
done:
  return status;
}

static attn_status ring_forward_device(attn_dist_plan *plan, const attn_inputs *in,
                                       const attn_outputs *out) {
  ring g;
  init_ring(&g, plan, in, &out->out, out->lse.data != NULL ? &out->lse : NULL);
  const int32_t dev = plan->global.device_index;
  const size_t ws = device_workspace_bytes(plan);
  const size_t out_blk = (size_t)round_part(g.B * g.nq * g.Hq * g.Dv * (int64_t)g.es);
  const size_t lse_blk = (size_t)round_part(g.B * g.Hq * g.nq * 4);
  const int64_t n_out = g.B * g.Tq * g.Hq * g.Dv, n_lse = g.B * g.Hq * g.Tq;
  const size_t acc_out = (size_t)round_part(n_out * 4), acc_lse = (size_t)round_part(n_lse * 4);
  char *base = NULL;
  attn_status status =
      device_setup(plan, 2 * g.kv_bytes + out_blk + lse_blk + acc_out + acc_lse + ws, &base);
  if (status != ATTN_STATUS_OK) return status;
  char *kv[2] = {base, base + g.kv_bytes};
  char *ob = base + 2 * g.kv_bytes, *lb = ob + out_blk;
  float *ao = (float *)(lb + lse_blk), *al = (float *)((char *)ao + acc_out);
  void *wsp = (char *)al + acc_lse;
  transfers_on(plan, plan->comm_stream);
  DEV("clearing the output sums", fill, dev, ao, n_out, 0.0f, plan->stream);
  DEV("clearing the lse sums", fill, dev, al, n_lse, -INFINITY, plan->stream);
  status = device_pack_kv(&g, in, kv[0]);
  if (status != ATTN_STATUS_OK) goto done;

  const int32_t last = last_step(&g), next = (g.r + 1) % g.n, prev = (g.r + g.n - 1) % g.n;
  int cur = 0;
  plan->stats.steps = last + 1;
  for (int32_t s = 0; s <= last; ++s) {
    const int32_t src = ((g.r - s) % g.n + g.n) % g.n;
    transfer t = {NULL, NULL};
    if (s < last) {
      status = device_order_transfer(plan);
      if (status == ATTN_STATUS_OK)
        status = start_shift(&g, kv[cur], kv[1 - cur], g.kv_bytes, next, prev, TAG_KV, &t);
      if (status != ATTN_STATUS_OK) goto done;
    }
    for (int32_t a = 0; a < g.C && status == ATTN_STATUS_OK; ++a)
      for (int32_t c = 0; c < g.C && status == ATTN_STATUS_OK; ++c) {
        const int64_t off = block_offset(&g, g.r, a, src, c);
        if (!block_visible(&g, off)) continue;
        const int64_t k0 = attn_dist_chunk_start(plan, plan->global.seqlen_k, src, c);
        attn_inputs bi = block_inputs(&g, in, a, kv[cur], c, k0);
        attn_outputs bo;
        attn_outputs_init(&bo);
        bo.out = attn_tensor_dense(ob);
        bo.lse = attn_tensor_dense(lb);
        const double t0 = attn_dist_now();
        status = attn_plan_forward(device_block_plan(&g, off), &bi, wsp, ws, &bo);
        plan->stats.compute_seconds += attn_dist_now() - t0;
        if (status != ATTN_STATUS_OK) break;
        char why[512] = "";
        status =
            plan->dev->merge(dev, (int32_t)g.dt, ao, al, ob, (const float *)lb, g.B, g.Hq, g.Tq,
                             (int64_t)a * g.nq, g.nq, g.Dv, plan->stream, why, sizeof why);
        if (status != ATTN_STATUS_OK) status = dev_fail(plan, status, "merging a block", why);
      }
    if (status != ATTN_STATUS_OK) {
      abandon(&g, &t);
      goto done;
    }
    if (s < last) {
      status = finish_shift(&g, &t, next, prev);
      if (status != ATTN_STATUS_OK) goto done;
      cur = 1 - cur;
    }
  }
  {
    const int64_t oshape[4] = {g.B, g.Tq, g.Hq, g.Dv};
    DEV("writing out", store, dev, out->out.data, (int32_t)g.dt, g.os, ao, oshape, plan->stream);
    if (out->lse.data != NULL) {
      const int64_t lshape[4] = {g.B, g.Hq, g.Tq, 1}, dense[4] = {g.Hq * g.Tq, g.Tq, 1, 0};
      const int64_t to[4] = {g.lses[0], g.lses[1], g.lses[2], 0};
      DEV("writing lse", copy, dev, out->lse.data, to, al, dense, lshape, 4, plan->stream);
    }
  }
done:
  transfers_on(plan, plan->stream);
  return status == ATTN_STATUS_OK ? attn_succeed(plan->ctx) : status;
}

static attn_status ring_backward_device(attn_dist_plan *plan, const attn_inputs *in,
                                        const attn_outputs *fwd, const attn_tensor *dout,
                                        const attn_grads *grads) {
  ring g;
  init_ring(&g, plan, in, &fwd->out, &fwd->lse);
  const int32_t dev = plan->global.device_index;
  int64_t dout_s[4], dq_s[4], dk_s[4], dv_s[4];
  const int64_t oshape[4] = {g.B, g.Tq, g.Hq, g.Dv}, qshape[4] = {g.B, g.Tq, g.Hq, g.D};
  const int64_t kshape[4] = {g.B, g.Tk, g.Hkv, g.D}, vshape[4] = {g.B, g.Tk, g.Hkv, g.Dv};
  attn_dist_strides(dout, oshape, 4, dout_s);
  attn_dist_strides(&grads->dq, qshape, 4, dq_s);
  attn_dist_strides(&grads->dk, kshape, 4, dk_s);
  attn_dist_strides(&grads->dv, vshape, 4, dv_s);
  const size_t ws = device_workspace_bytes(plan);
  const int64_t nk_el = g.B * g.Tk * g.Hkv * g.D, nkd = nk_el + g.B * g.Tk * g.Hkv * g.Dv;
  const int64_t nq_el = g.B * g.Tq * g.Hq * g.D;
  const size_t dq_blk = (size_t)round_part(g.B * g.nq * g.Hq * g.D * (int64_t)g.es);
  const size_t dk_blk = (size_t)round_part(g.B * g.nk * g.Hkv * g.D * (int64_t)g.es);
  const size_t dv_blk = (size_t)round_part(g.B * g.nk * g.Hkv * g.Dv * (int64_t)g.es);
  const size_t dkv_acc = (size_t)round_part(nkd * 4), dq_acc = (size_t)round_part(nq_el * 4);
  const size_t lse_blk = (size_t)round_part(g.B * g.Hq * g.nq * 4);
  char *base = NULL;
  attn_status status = device_setup(
      plan, 2 * g.kv_bytes + dq_blk + dk_blk + dv_blk + 3 * dkv_acc + dq_acc + lse_blk + ws, &base);
  if (status != ATTN_STATUS_OK) return status;
  char *kv[2] = {base, base + g.kv_bytes};
  char *qb = base + 2 * g.kv_bytes, *kb = qb + dq_blk, *vb = kb + dk_blk;
  /* dkv: the travelling dK/dV sums (one in hand, one arriving); step: this step's share. */
  float *dkv[2] = {(float *)(vb + dv_blk), (float *)(vb + dv_blk + dkv_acc)};
  float *step = (float *)(vb + dv_blk + 2 * dkv_acc);
  float *dqa = (float *)(vb + dv_blk + 3 * dkv_acc);
  /* lb: the query chunk's lse rows, dense and 256-byte aligned: a slice of the global lse starts
   * at row a * nq, 4-byte aligned only, which cuDNN's block plans refuse (16 bytes). */
  float *lb = (float *)((char *)dqa + dq_acc);
  void *wsp = (char *)lb + lse_blk;
  transfers_on(plan, plan->comm_stream);
  DEV("clearing the dK/dV sums", fill, dev, dkv[0], nkd, 0.0f, plan->stream);
  DEV("clearing the dq sums", fill, dev, dqa, nq_el, 0.0f, plan->stream);
  status = device_pack_kv(&g, in, kv[0]);
  if (status != ATTN_STATUS_OK) goto done;

  const int32_t last = last_step(&g), next = (g.r + 1) % g.n, prev = (g.r + g.n - 1) % g.n;
  plan->stats.steps = last + 1;
  int cur = 0, dcur = 0;
  transfer dt = {NULL, NULL};
  int32_t dto = 0, dfrom = 0;
  for (int32_t s = 0; s <= last; ++s) {
    const int32_t src = ((g.r - s) % g.n + g.n) % g.n;
    transfer t = {NULL, NULL};
    if (s < last) {
      status = device_order_transfer(plan);
      if (status == ATTN_STATUS_OK)
        status = start_shift(&g, kv[cur], kv[1 - cur], g.kv_bytes, next, prev, TAG_KV, &t);
      if (status != ATTN_STATUS_OK) {
        abandon(&g, &dt);
        goto done;
      }
    }
    DEV("clearing a step's dK/dV", fill, dev, step, nkd, 0.0f, plan->stream);
    for (int32_t a = 0; a < g.C && status == ATTN_STATUS_OK; ++a)
      for (int32_t c = 0; c < g.C && status == ATTN_STATUS_OK; ++c) {
        const int64_t off = block_offset(&g, g.r, a, src, c);
        if (!block_visible(&g, off)) continue;
        const int64_t k0 = attn_dist_chunk_start(plan, plan->global.seqlen_k, src, c);
        attn_inputs bi = block_inputs(&g, in, a, kv[cur], c, k0);
        const int64_t q_row = (int64_t)a * g.nq;
        attn_outputs bf;
        attn_outputs_init(&bf);
        bf.out = fwd->out;
        bf.out.data = (char *)fwd->out.data + (size_t)(q_row * g.os[1]) * g.es;
        memcpy(bf.out.stride, g.os, sizeof g.os);
        {
          const int64_t lshape[4] = {g.B, g.Hq, g.nq, 1}, dense[4] = {g.Hq * g.nq, g.nq, 1, 0};
          const int64_t from[4] = {g.lses[0], g.lses[1], g.lses[2], 0};
          char why[512] = "";
          status = plan->dev->copy(dev, lb, dense, (const char *)fwd->lse.data + (size_t)(q_row * g.lses[2]) * 4,
                                   from, lshape, 4, plan->stream, why, sizeof why);
          if (status != ATTN_STATUS_OK) {
            status = dev_fail(plan, status, "copying a chunk's lse", why);
            break;
          }
        }
        bf.lse = attn_tensor_dense(lb);
        attn_tensor bd = *dout;
        bd.data = (char *)dout->data + (size_t)(q_row * dout_s[1]) * g.es;
        memcpy(bd.stride, dout_s, sizeof dout_s);
        attn_grads bg;
        attn_grads_init(&bg);
        bg.dq = attn_tensor_dense(qb);
        bg.dk = attn_tensor_dense(kb);
        bg.dv = attn_tensor_dense(vb);
        const double t0 = attn_dist_now();
        status = attn_plan_backward(device_block_plan(&g, off), &bi, &bf, &bd, wsp, ws, &bg);
        plan->stats.compute_seconds += attn_dist_now() - t0;
        if (status != ATTN_STATUS_OK) break;
        /* dq rows of query chunk a; dK and dV rows of key chunk c of the slice in hand. */
        char why[512] = "";
        status = plan->dev->accumulate(dev, dqa, g.Tq, q_row, qb, (int32_t)g.dt, g.B, g.nq,
                                       g.Hq * g.D, plan->stream, why, sizeof why);
        if (status == ATTN_STATUS_OK)
          status = plan->dev->accumulate(dev, step, g.Tk, (int64_t)c * g.nk, kb, (int32_t)g.dt, g.B,
                                         g.nk, g.Hkv * g.D, plan->stream, why, sizeof why);
        if (status == ATTN_STATUS_OK)
          status =
              plan->dev->accumulate(dev, step + nk_el, g.Tk, (int64_t)c * g.nk, vb, (int32_t)g.dt,
                                    g.B, g.nk, g.Hkv * g.Dv, plan->stream, why, sizeof why);
        if (status != ATTN_STATUS_OK) status = dev_fail(plan, status, "summing gradients", why);
      }
    if (status != ATTN_STATUS_OK) {
      abandon(&g, &t);
      abandon(&g, &dt);
      goto done;
    }
    if (s < last) {
      status = finish_shift(&g, &t, next, prev);
      if (status != ATTN_STATUS_OK) {
        abandon(&g, &dt);
        goto done;
      }
      cur = 1 - cur;
    }
    /* The sums that travelled with this slice arrive (in flight during this step's blocks); this
     * step's share joins them, and they move on, or home after the last step (as on the host). */
    if (dt.recv != NULL || dt.send != NULL) {
      status = finish_shift(&g, &dt, dto, dfrom);
      if (status != ATTN_STATUS_OK) goto done;
      dcur = 1 - dcur;
    }
    DEV("adding a step's dK/dV", add, dev, dkv[dcur], step, nkd, plan->stream);
    dto = s < last ? next : src;
    dfrom = s < last ? prev : (g.r + s) % g.n;
    if (dto != g.r) {
      status = device_order_transfer(plan);
      if (status == ATTN_STATUS_OK)
        status =
            start_shift(&g, dkv[dcur], dkv[1 - dcur], (size_t)nkd * 4, dto, dfrom, TAG_DKV, &dt);
      if (status != ATTN_STATUS_OK) goto done;
    }
  }
  if (dt.recv != NULL || dt.send != NULL) {
    status = finish_shift(&g, &dt, dto, dfrom);
    if (status != ATTN_STATUS_OK) goto done;
    dcur = 1 - dcur;
  }
  DEV("writing dq", store, dev, grads->dq.data, (int32_t)g.dt, dq_s, dqa, qshape, plan->stream);
  DEV("writing dk", store, dev, grads->dk.data, (int32_t)g.dt, dk_s, dkv[dcur], kshape,
      plan->stream);
  DEV("writing dv", store, dev, grads->dv.data, (int32_t)g.dt, dv_s, dkv[dcur] + nk_el, vshape,
      plan->stream);
done:
  transfers_on(plan, plan->stream);
  return status == ATTN_STATUS_OK ? attn_succeed(plan->ctx) : status;
}

#undef DEV

/* ---- forward --------------------------------------------------------------------------------- */

attn_status attn_dist_ring_forward(attn_dist_plan *plan, const attn_inputs *in,
                                   const attn_outputs *out) {
  attn_ctx *ctx = plan->ctx;
  if (in->q.data == NULL || in->k.data == NULL || in->v.data == NULL || out->out.data == NULL)
    return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "%s is NULL",
                     in->q.data == NULL   ? "inputs.q"
                     : in->k.data == NULL ? "inputs.k"
                     : in->v.data == NULL ? "inputs.v"
                                          : "outputs.out");
  if (out->probs.data != NULL)
    return attn_fail(ctx, ATTN_STATUS_UNSUPPORTED,
                     "outputs.probs under sequence sharding: the probabilities of a row are spread "
                     "over the ranks; not implemented");
  if (plan->device_ring) return ring_forward_device(plan, in, out);
  ring g;
  init_ring(&g, plan, in, &out->out, out->lse.data != NULL ? &out->lse : NULL);
  const size_t stat_es = attn_dtype_size(g.stat);
  const size_t out_blk = (size_t)round_part(g.B * g.Tq * g.Hq * g.Dv * (int64_t)g.es);
  const size_t lse_blk = (size_t)round_part(g.B * g.Hq * g.Tq * (int64_t)stat_es);
  const size_t acc_out = (size_t)(g.B * g.Tq * g.Hq * g.Dv) * sizeof(double);
  const size_t acc_lse = (size_t)(g.B * g.Hq * g.Tq) * sizeof(double);
  char *base = NULL;
  attn_status status =
      get_scratch(plan, 2 * g.kv_bytes + out_blk + lse_blk + acc_out + acc_lse, &base);
  if (status != ATTN_STATUS_OK) return status;
  char *kv[2] = {base, base + g.kv_bytes};
  char *ob = base + 2 * g.kv_bytes, *lb = ob + out_blk;
  double *ao = (double *)(lb + lse_blk), *al = (double *)((char *)ao + acc_out);
  memset(ao, 0, acc_out);
  for (int64_t i = 0; i < g.B * g.Hq * g.Tq; ++i) al[i] = -INFINITY;
  pack_kv(&g, in, kv[0]);

  const int32_t last = last_step(&g), next = (g.r + 1) % g.n, prev = (g.r + g.n - 1) % g.n;
  int cur = 0;
  plan->stats.steps = last + 1;
  for (int32_t s = 0; s <= last; ++s) {
    const int32_t src = ((g.r - s) % g.n + g.n) % g.n;
    transfer t = {NULL, NULL};
    if (s < last) {
      status = start_shift(&g, kv[cur], kv[1 - cur], g.kv_bytes, next, prev, TAG_KV, &t);
      if (status != ATTN_STATUS_OK) return status;
    }
    for (int32_t a = 0; a < g.C && status == ATTN_STATUS_OK; ++a)
      for (int32_t c = 0; c < g.C && status == ATTN_STATUS_OK; ++c) {
        if (!block_visible(&g, block_offset(&g, g.r, a, src, c))) continue;
        const int64_t k0 = attn_dist_chunk_start(plan, plan->global.seqlen_k, src, c);
        attn_inputs bi = block_inputs(&g, in, a, kv[cur], c, k0);
        attn_outputs bo;
        attn_outputs_init(&bo);
        bo.out = attn_tensor_dense(ob);
        bo.lse = attn_tensor_dense(lb);
        status = place_block(&g, a, src, c);
        const double t0 = attn_dist_now();
        if (status == ATTN_STATUS_OK)
          status = attn_plan_forward(plan->block_plan, &bi, NULL, 0, &bo);
        plan->stats.compute_seconds += attn_dist_now() - t0;
        if (status == ATTN_STATUS_OK) merge(&g, ob, lb, (int64_t)a * g.nq, g.nq, ao, al);
        progress(&g, &t);
      }
    if (status != ATTN_STATUS_OK) {
      abandon(&g, &t);
      return status;
    }
    if (s < last) {
      status = finish_shift(&g, &t, next, prev);
      if (status != ATTN_STATUS_OK) return status;
      cur = 1 - cur;
    }
  }

  if (plan->sinks_plan != NULL) {
    attn_inputs si;
    attn_inputs_init(&si);
    si.q = in->q;
    si.k = attn_tensor_dense(kv[0]); /* no keys: never read */
    si.v = attn_tensor_dense(kv[1]);
    si.sinks = in->sinks;
    attn_outputs so;
    attn_outputs_init(&so);
    so.out = attn_tensor_dense(ob);
    so.lse = attn_tensor_dense(lb);
    status = attn_plan_forward(plan->sinks_plan, &si, NULL, 0, &so);
    if (status != ATTN_STATUS_OK) return status;
    merge(&g, ob, lb, 0, g.Tq, ao, al);
  }

  const int dist_threads = attn_dist_host_threads(plan);
  DIST_PARALLEL_FOR
  for (int64_t bi = 0; bi < g.B * g.Tq; ++bi) { /* one (batch, row) */
    const int64_t b = bi / g.Tq, i = bi % g.Tq;
    for (int64_t h = 0; h < g.Hq; ++h) {
      const double *acc = ao + (bi * g.Hq + h) * g.Dv;
      const int64_t at = b * g.os[0] + i * g.os[1] + h * g.os[2];
      for (int64_t d = 0; d < g.Dv; ++d)
        attn_store(out->out.data, g.dt, at + d * g.os[3], acc[d]);
      if (out->lse.data != NULL)
        attn_store(out->lse.data, g.stat, b * g.lses[0] + h * g.lses[1] + i * g.lses[2],
                   al[(b * g.Hq + h) * g.Tq + i]);
    }
  }
  return attn_succeed(ctx);
}

/* ---- backward -------------------------------------------------------------------------------- */

/* acc[b, rows, H, W] (double, rows of a tensor of `T` rows starting at row0) += blk dense
 * [B, rows, H, W] of dtype dt. */
static void add_rows(const ring *g, double *acc, int64_t T, int64_t row0, int64_t rows, int64_t H,
                     int64_t W, const void *blk) {
  const int dist_threads = attn_dist_host_threads(g->plan);
  DIST_PARALLEL_FOR
  for (int64_t bi = 0; bi < g->B * rows; ++bi) { /* one (batch, row) */
    const int64_t b = bi / rows, i = bi % rows;
    double *to = acc + ((b * T + row0 + i) * H) * W;
    for (int64_t e = 0; e < H * W; ++e) to[e] += attn_load(blk, g->dt, bi * H * W + e);
  }
}

/* Writes acc [B, T, H, W] (double) into a caller's tensor of dtype dt with strides st. */
static void write_rows(const ring *g, const double *acc, int64_t T, int64_t H, int64_t W,
                       const attn_tensor *t, const int64_t st[4]) {
  const int dist_threads = attn_dist_host_threads(g->plan);
  DIST_PARALLEL_FOR
  for (int64_t bi = 0; bi < g->B * T; ++bi) { /* one (batch, row) */
    const int64_t b = bi / T, i = bi % T;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < W; ++d)
        attn_store(t->data, g->dt, b * st[0] + i * st[1] + h * st[2] + d * st[3],
                   acc[(bi * H + h) * W + d]);
  }
}

attn_status attn_dist_ring_backward(attn_dist_plan *plan, const attn_inputs *in,
                                    const attn_outputs *fwd, const attn_tensor *dout,
                                    const attn_grads *grads) {
  attn_ctx *ctx = plan->ctx;
  if (in->q.data == NULL || in->k.data == NULL || in->v.data == NULL || fwd->out.data == NULL ||
      fwd->lse.data == NULL || dout->data == NULL || grads->dq.data == NULL ||
      grads->dk.data == NULL || grads->dv.data == NULL)
    return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                     "q, k, v, forward.out, forward.lse, dout, dq, dk and dv are required (one is "
                     "NULL)");
  if (plan->device_ring) return ring_backward_device(plan, in, fwd, dout, grads);
  ring g;
  init_ring(&g, plan, in, &fwd->out, &fwd->lse);
  const attn_problem *l = g.l;
  int64_t dout_s[4], dq_s[4], dk_s[4], dv_s[4], dbias_s[4];
  {
    const int64_t oshape[4] = {g.B, g.Tq, g.Hq, g.Dv}, qshape[4] = {g.B, g.Tq, g.Hq, g.D};
    const int64_t kshape[4] = {g.B, g.Tk, g.Hkv, g.D}, vshape[4] = {g.B, g.Tk, g.Hkv, g.Dv};
    attn_dist_strides(dout, oshape, 4, dout_s);
    attn_dist_strides(&grads->dq, qshape, 4, dq_s);
    attn_dist_strides(&grads->dk, kshape, 4, dk_s);
    attn_dist_strides(&grads->dv, vshape, 4, dv_s);
    if (grads->dbias.data != NULL) attn_dist_strides(&grads->dbias, l->bias_shape, 4, dbias_s);
  }
  const int64_t nkd = g.B * g.Tk * g.Hkv * (g.D + g.Dv); /* dK then dV, per travelling slice */
  const size_t dq_blk = (size_t)round_part(g.B * g.Tq * g.Hq * g.D * (int64_t)g.es);
  const size_t dk_blk = (size_t)round_part(g.B * g.nk * g.Hkv * g.D * (int64_t)g.es);
  const size_t dv_blk = (size_t)round_part(g.B * g.nk * g.Hkv * g.Dv * (int64_t)g.es);
  const size_t dkv_acc = (size_t)nkd * sizeof(double);
  const size_t dq_acc = (size_t)(g.B * g.Tq * g.Hq * g.D) * sizeof(double);
  char *base = NULL;
  attn_status status =
      get_scratch(plan, 2 * g.kv_bytes + dq_blk + dk_blk + dv_blk + 3 * dkv_acc + dq_acc, &base);
  if (status != ATTN_STATUS_OK) return status;
  char *kv[2] = {base, base + g.kv_bytes};
  char *qb = base + 2 * g.kv_bytes, *kb = qb + dq_blk, *vb = kb + dk_blk;
  /* dkv: the travelling dK/dV sums (one in hand, one arriving); step: this step's blocks' share,
   * summed apart so the sums of the previous step can still be in flight while it is computed. */
  double *dkv[2] = {(double *)(vb + dv_blk), (double *)(vb + dv_blk + dkv_acc)};
  double *step = (double *)(vb + dv_blk + 2 * dkv_acc);
  double *dqa = (double *)(vb + dv_blk + 3 * dkv_acc);
  memset(dkv[0], 0, dkv_acc);
  memset(dqa, 0, dq_acc);
  pack_kv(&g, in, kv[0]);
  /* dbias: each block's part is added into a double accumulator of the local dbias's shape (blocks
   * meet in one place when the bias broadcasts rows or keys); written out at the end. */
  const int64_t *bsh = l->bias_shape;
  const int64_t dbias_n = grads->dbias.data != NULL ? bsh[0] * bsh[1] * bsh[2] * bsh[3] : 0;
  const int64_t blk_rows = bsh[2] != 1 ? g.nq : 1, blk_cols = bsh[3] != 1 ? g.nk : 1;
  double *dbias_acc = NULL;
  char *dbias_blk = NULL;
  if (dbias_n > 0) {
    dbias_acc = calloc((size_t)dbias_n, sizeof(double));
    dbias_blk = malloc((size_t)(bsh[0] * bsh[1] * blk_rows * blk_cols) *
                       attn_dtype_size((attn_dtype)l->bias_dtype));
    if (dbias_acc == NULL || dbias_blk == NULL) {
      free(dbias_acc);
      free(dbias_blk);
      return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory for dbias");
    }
  }

  const int32_t last = last_step(&g), next = (g.r + 1) % g.n, prev = (g.r + g.n - 1) % g.n;
  plan->stats.steps = last + 1;
  int cur = 0, dcur = 0;      /* the K/V slice and the dK/dV sums in hand */
  transfer dt = {NULL, NULL}; /* the dK/dV exchange in flight, and its peers */
  int32_t dto = 0, dfrom = 0;
  for (int32_t s = 0; s <= last; ++s) {
    const int32_t src = ((g.r - s) % g.n + g.n) % g.n;
    transfer t = {NULL, NULL};
    if (s < last) {
      status = start_shift(&g, kv[cur], kv[1 - cur], g.kv_bytes, next, prev, TAG_KV, &t);
      if (status != ATTN_STATUS_OK) {
        abandon(&g, &dt);
        goto done;
      }
    }
    memset(step, 0, dkv_acc);
    for (int32_t a = 0; a < g.C && status == ATTN_STATUS_OK; ++a)
      for (int32_t c = 0; c < g.C && status == ATTN_STATUS_OK; ++c) {
        if (!block_visible(&g, block_offset(&g, g.r, a, src, c))) continue;
        const int64_t k0 = attn_dist_chunk_start(plan, plan->global.seqlen_k, src, c);
        attn_inputs bi = block_inputs(&g, in, a, kv[cur], c, k0);
        const int64_t q_row = (int64_t)a * g.nq;
        attn_outputs bf;
        attn_outputs_init(&bf);
        bf.out = fwd->out;
        bf.out.data = (char *)fwd->out.data + (size_t)(q_row * g.os[1]) * g.es;
        memcpy(bf.out.stride, g.os, sizeof g.os);
        bf.lse = fwd->lse;
        bf.lse.data = (char *)fwd->lse.data + (size_t)(q_row * g.lses[2]) * attn_dtype_size(g.stat);
        memcpy(bf.lse.stride, g.lses, sizeof g.lses);
        attn_tensor bd = *dout;
        bd.data = (char *)dout->data + (size_t)(q_row * dout_s[1]) * g.es;
        memcpy(bd.stride, dout_s, sizeof dout_s);
        attn_grads bg;
        attn_grads_init(&bg);
        bg.dq = attn_tensor_dense(qb);
        bg.dk = attn_tensor_dense(kb);
        bg.dv = attn_tensor_dense(vb);
        if (dbias_blk != NULL) bg.dbias = attn_tensor_dense(dbias_blk);
        status = place_block(&g, a, src, c);
        const double t0 = attn_dist_now();
        if (status == ATTN_STATUS_OK)
          status = attn_plan_backward(plan->block_plan, &bi, &bf, &bd, NULL, 0, &bg);
        plan->stats.compute_seconds += attn_dist_now() - t0;
        progress(&g, &t);
        progress(&g, &dt);
        if (status == ATTN_STATUS_OK) {
          add_rows(&g, dqa, g.Tq, q_row, g.nq, g.Hq, g.D, qb);
          /* dK and dV of the slice in hand: [B, Tk, Hkv, D] then [B, Tk, Hkv, Dv]. */
          add_rows(&g, step, g.Tk, (int64_t)c * g.nk, g.nk, g.Hkv, g.D, kb);
          add_rows(&g, step + g.B * g.Tk * g.Hkv * g.D, g.Tk, (int64_t)c * g.nk, g.nk, g.Hkv, g.Dv,
                   vb);
          if (dbias_blk != NULL) {
            const int64_t r0 = bsh[2] != 1 ? q_row : 0, c0 = bsh[3] != 1 ? k0 : 0;
            int64_t e = 0;
            for (int64_t i0 = 0; i0 < bsh[0]; ++i0)
              for (int64_t i1 = 0; i1 < bsh[1]; ++i1)
                for (int64_t i2 = 0; i2 < blk_rows; ++i2)
                  for (int64_t i3 = 0; i3 < blk_cols; ++i3, ++e)
                    dbias_acc[((i0 * bsh[1] + i1) * bsh[2] + r0 + i2) * bsh[3] + c0 + i3] +=
                        attn_load(dbias_blk, (attn_dtype)l->bias_dtype, e);
          }
        }
      }
    if (status != ATTN_STATUS_OK) {
      abandon(&g, &t);
      abandon(&g, &dt);
      goto done;
    }
    if (s < last) {
      status = finish_shift(&g, &t, next, prev);
      if (status != ATTN_STATUS_OK) {
        abandon(&g, &dt);
        goto done;
      }
      cur = 1 - cur;
    }
    /* The sums that travelled with this slice so far arrive now (sent at the end of the previous
     * step, in flight during this step's blocks); this step's share joins them. */
    if (dt.recv != NULL || dt.send != NULL) {
      status = finish_shift(&g, &dt, dto, dfrom);
      if (status != ATTN_STATUS_OK) goto done;
      dcur = 1 - dcur;
    }
    {
      double *sums = dkv[dcur];
      const int dist_threads = attn_dist_host_threads(plan);
      DIST_PARALLEL_FOR
      for (int64_t e = 0; e < nkd; ++e) sums[e] += step[e];
    }
    /* They move on with the slice; after the last step they go straight home to the slice's
     * owner (src), and this rank receives its own from the rank holding it. */
    dto = s < last ? next : src;
    dfrom = s < last ? prev : (g.r + s) % g.n;
    if (dto != g.r) {
      status = start_shift(&g, dkv[dcur], dkv[1 - dcur], dkv_acc, dto, dfrom, TAG_DKV, &dt);
      if (status != ATTN_STATUS_OK) goto done;
    }
  }
  if (dt.recv != NULL || dt.send != NULL) {
    status = finish_shift(&g, &dt, dto, dfrom);
    if (status != ATTN_STATUS_OK) goto done;
    dcur = 1 - dcur;
  }

  write_rows(&g, dqa, g.Tq, g.Hq, g.D, &grads->dq, dq_s);
  write_rows(&g, dkv[dcur], g.Tk, g.Hkv, g.D, &grads->dk, dk_s);
  write_rows(&g, dkv[dcur] + g.B * g.Tk * g.Hkv * g.D, g.Tk, g.Hkv, g.Dv, &grads->dv, dv_s);

  if (plan->sinks_plan != NULL && grads->dsinks.data != NULL) {
    attn_inputs si;
    attn_inputs_init(&si);
    si.q = in->q;
    si.k = attn_tensor_dense(kv[0]);
    si.v = attn_tensor_dense(kv[1]);
    si.sinks = in->sinks;
    attn_grads sg;
    attn_grads_init(&sg);
    sg.dq = attn_tensor_dense(qb); /* zeros: no keys */
    sg.dk = attn_tensor_dense(kb);
    sg.dv = attn_tensor_dense(vb);
    sg.dsinks = grads->dsinks;
    attn_outputs sf;
    attn_outputs_init(&sf);
    sf.out = fwd->out;
    sf.lse = fwd->lse;
    status = attn_plan_backward(plan->sinks_plan, &si, &sf, dout, NULL, 0, &sg);
    /* Hybrid: the all-to-all layer sums the caller's dsinks once the heads are back. */
    if (status == ATTN_STATUS_OK && !plan->hybrid)
      status = attn_dist_reduce_dsinks(plan, &grads->dsinks);
    if (status != ATTN_STATUS_OK) goto done;
  }
  if (dbias_acc != NULL) {
    if (!plan->hybrid) status = attn_dist_reduce_dbias(plan, dbias_acc);
    if (status != ATTN_STATUS_OK) goto done;
    for (int64_t i0 = 0; i0 < bsh[0]; ++i0)
      for (int64_t i1 = 0; i1 < bsh[1]; ++i1)
        for (int64_t i2 = 0; i2 < bsh[2]; ++i2)
          for (int64_t i3 = 0; i3 < bsh[3]; ++i3)
            attn_store(grads->dbias.data, (attn_dtype)l->bias_dtype,
                       i0 * dbias_s[0] + i1 * dbias_s[1] + i2 * dbias_s[2] + i3 * dbias_s[3],
                       dbias_acc[((i0 * bsh[1] + i1) * bsh[2] + i2) * bsh[3] + i3]);
  }
done:
  free(dbias_acc);
  free(dbias_blk);
  return status == ATTN_STATUS_OK ? attn_succeed(ctx) : status;
}
