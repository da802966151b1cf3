/*
 * src/dist/ring.c - ring attention: a problem whose sequence is split over the ranks of a ring.
 *
 * Rank r of n holds a slice of q, k and v (one chunk, or two in the zigzag layout). Forward: the
 * K/V slices travel around the ring, one hop per step; at step s rank r holds the slice of rank
 * src = r - s and computes its queries against it (single-device blocks over the visible pairs
 * of chunks, one call a step where the masks allow: on the host placed at the chunks' global
 * positions, so causal masks, windows, ALiBi and dropout keep their global meaning; on the device
 * without positions where block_runs_unplaced says the mask is the same, else a pair of chunks at
 * a time at its global positions) while the next slice is already in flight (nonblocking send and
 * receive). Each
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
#include "dist/host_rows.h"

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
  /* The host blocks' partial results (out, dq, dk, dv) and the sums they join: f32, or f64 for an
   * f64 problem (attn_positions.partial), never rounded to a low-precision dtype on the way. */
  attn_dtype pdt;
  size_t pes;
  int64_t B, Hq, Hkv, D, Dv, Tq, Tk, nq, nk; /* local sizes; nq, nk: chunk lengths */
  int32_t n, r, C;  /* ring size, this rank's place in it, chunks per rank */
  int64_t o_global; /* alignment offset of the global problem */
  int64_t wl, wr;   /* window of the global problem, causal folded in (-1 = unbounded) */
  int seg;          /* segment ids travel with K/V */
  size_t k_bytes, v_bytes, seg_bytes, kv_bytes; /* one travelling K/V slice, packed */
  /* strides of the caller's tensors */
  int64_t qs[4], ks[4], vs[4], bias_s[4], mask_s[4], qseg_s[4], kseg_s[4], os[4], lses[4];
  /* The transfers in flight while a step's blocks run (run_steps), which the host blocks' threads
   * move on from inside the block (ring_progress). */
  const struct transfer *moving[2];
} ring;

/* Byte sizes of the parts of a scratch buffer, rounded so that every part starts 256-byte aligned
 * (the cuda kernels need 16-byte aligned tensors; the host path does not mind). */
static int64_t round_part(int64_t x) { return (x + 255) / 256 * 256; }

/* Element e of a buffer of partial results or sums (dtype g->pdt). */
static void *sum_at(const ring *g, void *base, int64_t e) {
  return (char *)base + (size_t)e * g->pes;
}

/* The sizes and the mask's geometry, which need no tensor. */
static void init_geometry(ring *g, attn_dist_plan *plan) {
  memset(g, 0, sizeof *g);
  g->plan = plan;
  g->l = &plan->ring_local;
  const attn_problem *l = g->l;
  g->dt = (attn_dtype)l->dtype;
  g->stat = attn_stat_dtype(g->dt);
  g->es = attn_dtype_size(g->dt);
  attn_positions partial;
  memset(&partial, 0, sizeof partial);
  partial.partial = 1;
  g->pdt = attn_result_dtype(l, &partial);
  g->pes = attn_dtype_size(g->pdt);
  g->B = l->batch, g->Hq = l->heads_q, g->Hkv = l->heads_kv, g->D = l->head_dim;
  g->Dv = l->head_dim_v, g->Tq = l->seqlen_q, g->Tk = l->seqlen_k;
  g->C = plan->chunks, g->nq = g->Tq / g->C, g->nk = g->Tk / g->C;
  g->n = plan->ring_n, g->r = plan->ring_r;
  const attn_problem *G = &plan->global;
  g->o_global = G->align == ATTN_ALIGN_BOTTOM_RIGHT ? G->seqlen_k - G->seqlen_q : 0;
  g->wl = G->window_left, g->wr = G->window_right;
}

static void init_ring(ring *g, attn_dist_plan *plan, const attn_inputs *in, const attn_tensor *out,
                      const attn_tensor *lse) {
  init_geometry(g, plan);
  const attn_problem *l = g->l;
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

/* How a block of `rows` x `keys` at offset off (row i sees keys [i + off - wl, i + off + wr])
 * meets the global window: no key visible to any row, every key visible to every row, or cut. */
typedef enum pair_view { PAIR_HIDDEN, PAIR_CUT, PAIR_VISIBLE } pair_view;

static pair_view block_view(const ring *g, int64_t rows, int64_t keys, int64_t off) {
  /* the rows together see [off - wl, rows - 1 + off + wr] */
  if (g->wr >= 0 && rows - 1 + off + g->wr < 0) return PAIR_HIDDEN;
  if (g->wl >= 0 && off - g->wl > keys - 1) return PAIR_HIDDEN;
  /* each row sees them all: row rows - 1 sees key 0 and row 0 sees key keys - 1 */
  if (g->wl >= 0 && rows - 1 + off - g->wl > 0) return PAIR_CUT;
  if (g->wr >= 0 && off + g->wr < keys - 1) return PAIR_CUT;
  return PAIR_VISIBLE;
}

/* Whether any key of a pair of chunks is inside the window of any of its rows. */
static int block_visible(const ring *g, int64_t off) {
  return block_view(g, g->nq, g->nk, off) != PAIR_HIDDEN;
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

/* A block of a step: this rank's query chunks [a0, a0 + na) against key chunks [c0, c0 + nc) of
 * the slice of rank src. Device blocks (unplaced) run on the plan of their shape with the
 * problem's mask, or with none when `full` (dist.h says the same to tests and benchmarks). */
typedef attn_dist_block ring_block;

/* The global position of a block's first key (its bias and mask columns start there). */
static int64_t block_k0(const ring *g, const ring_block *b) {
  return attn_dist_chunk_start(g->plan, g->plan->global.seqlen_k, b->src, b->c0);
}

/* Whether block b of rank r gives its global result as one call without positions: on a plan of
 * its shape, unmasked (full) or with the problem's window and alignment, whose local offset is
 * L = keys - rows (bottom-right) or 0. Pair (a, c) of chunks then sits at the local offset
 * L + a nq - c nk, and the call is exact when every pair is hidden, entirely visible or cut alike
 * under both offsets, and cut pairs sit at equal ones (the same mask, key for key). That is the
 * geometry only: features that read absolute positions (ALiBi, dropout: device_placed places
 * every device block of such a problem; a bias or mask whose key columns would have to be one
 * slice over key chunks that are not adjacent: step_blocks keeps those apart) are the callers'. */
static int block_runs_unplaced(const ring *g, int32_t r, const ring_block *b, int full) {
  const int64_t rows = (int64_t)b->na * g->nq, keys = (int64_t)b->nc * g->nk;
  const int64_t local = g->plan->global.align == ATTN_ALIGN_BOTTOM_RIGHT ? keys - rows : 0;
  for (int32_t a = 0; a < b->na; ++a)
    for (int32_t c = 0; c < b->nc; ++c) {
      const int64_t off = block_offset(g, r, b->a0 + a, b->src, b->c0 + c);
      const pair_view global = block_view(g, g->nq, g->nk, off);
      if (full) {
        if (global != PAIR_VISIBLE) return 0;
        continue;
      }
      const int64_t off_local = local + a * g->nq - c * g->nk;
      if (block_view(g, g->nq, g->nk, off_local) != global) return 0;
      if (global == PAIR_CUT && off_local != off) return 0;
    }
  return 1;
}

/* Device: whether block b runs as one unplaced call, and on which plan (b->full). The unmasked
 * plan is preferred where every key is visible: it does no mask work. */
static int choose_unplaced(const ring *g, int32_t r, ring_block *b) {
  const int masked = g->wl >= 0 || g->wr >= 0;
  b->full = masked && block_runs_unplaced(g, r, b, 1);
  return b->full || block_runs_unplaced(g, r, b, 0);
}

/* How a ring places its blocks. */
typedef enum block_mode {
  BLOCKS_PLACED, /* host: at global positions (attn_positions), as few calls as the masks allow */
  /* device: unplaced where block_runs_unplaced says the call's own mask is the global one, else
   * one pair of chunks at a time at its global positions (the cuda kernels take one piece per
   * axis, impl.h's ATTN_POSITIONS_ONE_PIECE) */
  BLOCKS_DEVICE,
} block_mode;

/* Whether the device ring places every block: its problem reads positions beyond the mask
 * (ALiBi's distances, dropout's Philox counters), which an unplaced call would see as its own. */
static int device_placed(const ring *g) {
  return g->l->alibi != ATTN_ALIBI_NONE || g->l->dropout_p > 0.0;
}

/* Whether the blocks are kept to one pair of chunks each, the blocks before a step's hull ran as
 * one call (ATTN_DIST_RING_BLOCKS=pairs, read at plan creation; for comparisons). */
static int pairs_only(const ring *g) { return g->plan->ring_pairs; }

/* The blocks of step s on rank r, at most C x C; returns how many. As few calls as the masks
 * allow: one block over the hull of the visible pairs, whose hidden pairs the implementation
 * skips tile by tile; a zigzag step of a causal mask is then one call instead of two or three.
 * The host places it at global positions (attn_positions); the device runs it unplaced where
 * block_runs_unplaced says the result is the same, and otherwise one call per visible pair,
 * unplaced where that pair alone allows it, else placed (and every pair placed where the problem
 * reads positions: device_placed). Key chunks stay apart where a bias or mask has a key
 * dimension: its columns are the global keys', and a block's bias must be one strided slice. */
static int step_blocks(const ring *g, int32_t r, int32_t s, block_mode mode, ring_block *out) {
  const int32_t src = ((r - s) % g->n + g->n) % g->n;
  const attn_problem *l = g->l;
  const int split = pairs_only(g);
  const int keys_apart =
      split || (l->has_bias && l->bias_shape[3] != 1) || (l->has_mask && l->mask_shape[3] != 1);
  ring_block hull[4];
  int nh = 0;
  for (int32_t c = 0; c < g->C; ++c) {
    int32_t a_lo = g->C, a_hi = -1; /* visible query chunks against key chunk c */
    for (int32_t a = 0; a < g->C; ++a) {
      if (!block_visible(g, block_offset(g, r, a, src, c))) continue;
      if (split) hull[nh++] = (ring_block){src, a, 1, c, 1, 0, 0};
      a_lo = a < a_lo ? a : a_lo, a_hi = a > a_hi ? a : a_hi;
    }
    if (split || a_hi < 0) continue;
    if (keys_apart || nh == 0) {
      hull[nh++] = (ring_block){src, a_lo, a_hi - a_lo + 1, c, 1, 0, 0};
    } else { /* widen the one block to this key chunk too */
      ring_block *b = &hull[0];
      const int32_t lo = a_lo < b->a0 ? a_lo : b->a0;
      const int32_t hi = a_hi > b->a0 + b->na - 1 ? a_hi : b->a0 + b->na - 1;
      b->a0 = lo, b->na = hi - lo + 1, b->nc = c - b->c0 + 1;
    }
  }
  if (mode == BLOCKS_PLACED) {
    memcpy(out, hull, (size_t)nh * sizeof *hull);
    return nh;
  }
  const int placed = device_placed(g);
  int nb = 0;
  for (int i = 0; i < nh; ++i) {
    ring_block b = hull[i];
    if (!placed && choose_unplaced(g, r, &b)) {
      out[nb++] = b;
      continue;
    }
    for (int32_t a = b.a0; a < b.a0 + b.na; ++a) /* its visible pairs apart */
      for (int32_t c = b.c0; c < b.c0 + b.nc; ++c) {
        ring_block pair = {src, a, 1, c, 1, 0, 0};
        if (!block_visible(g, block_offset(g, r, a, src, c))) continue;
        if (placed || !choose_unplaced(g, r, &pair)) pair.full = 0, pair.placed = 1;
        out[nb++] = pair;
      }
  }
  return nb;
}

/* The kinds of call this rank's steps make, by shape (used[na - 1][nc - 1]: ATTN_DIST_CALL_*
 * bits; the host's are all "masked": placed at positions with the problem's mask). */
static void ring_block_shapes(attn_dist_plan *plan, block_mode mode, int used[2][2]) {
  ring g;
  init_geometry(&g, plan);
  memset(used, 0, 4 * sizeof(int));
  const int32_t last = last_step(&g);
  ring_block blocks[4];
  for (int32_t s = 0; s <= last; ++s) {
    const int nb = step_blocks(&g, g.r, s, mode, blocks);
    for (int i = 0; i < nb; ++i)
      used[blocks[i].na - 1][blocks[i].nc - 1] |= blocks[i].placed ? ATTN_DIST_CALL_PLACED
                                                  : blocks[i].full ? ATTN_DIST_CALL_FULL
                                                                   : ATTN_DIST_CALL_MASKED;
  }
}

void attn_dist_ring_block_shapes(attn_dist_plan *plan, int used[2][2]) {
  ring_block_shapes(plan, BLOCKS_PLACED, used);
}

void attn_dist_ring_device_blocks(attn_dist_plan *plan, int used[2][2]) {
  ring_block_shapes(plan, BLOCKS_DEVICE, used);
}

int attn_dist_ring_step_blocks(attn_dist_plan *plan, int device, int32_t r, int32_t s,
                               attn_dist_block out[4]) {
  ring g;
  init_geometry(&g, plan);
  if (s > last_step(&g)) return 0;
  return step_blocks(&g, r, s, device ? BLOCKS_DEVICE : BLOCKS_PLACED, out);
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

/* Copies a caller's [B, Tk, Hkv, W] tensor (strides st) densely to dst. */
static void pack_dense(const ring *g, char *dst, const void *src, const int64_t st[4], int64_t W) {
  const int dist_threads = attn_dist_host_threads(g->plan);
  DIST_PARALLEL_FOR
  for (int64_t bt = 0; bt < g->B * g->Tk; ++bt) { /* one (batch, key) row of every head */
    const int64_t b = bt / g->Tk, t = bt % g->Tk;
    for (int64_t h = 0; h < g->Hkv; ++h) {
      const char *from = (const char *)src + (size_t)(b * st[0] + t * st[1] + h * st[2]) * g->es;
      char *to = dst + (size_t)((bt * g->Hkv + h) * W) * g->es;
      if (st[3] == 1) { /* a contiguous row: one copy */
        memcpy(to, from, (size_t)W * g->es);
        continue;
      }
      for (int64_t d = 0; d < W; ++d)
        memcpy(to + (size_t)d * g->es, from + (size_t)(d * st[3]) * g->es, g->es);
    }
  }
}

/* Packs the caller's local K, V (and kv segment ids) densely into one message. */
static void pack_kv(const ring *g, const attn_inputs *in, char *buf) {
  pack_dense(g, buf, in->k.data, g->ks, g->D);
  pack_dense(g, buf + g->k_bytes, in->v.data, g->vs, g->Dv);
  int32_t *seg = (int32_t *)(buf + g->k_bytes + g->v_bytes);
  if (g->seg)
    for (int64_t b = 0; b < g->B; ++b)
      for (int64_t t = 0; t < g->Tk; ++t)
        seg[b * g->Tk + t] =
            ((const int32_t *)in->kv_segment_ids.data)[b * g->kseg_s[0] + t * g->kseg_s[1]];
}

/* ---- one block ------------------------------------------------------------------------------- */

/* Elements from the start of a bias- or mask-shaped tensor (strides st) to the block whose rows
 * start at local row q_row and whose keys start at global key k0: such a tensor has the rank's
 * query rows and every key column. */
static int64_t bias_block_offset(const int64_t shape[4], const int64_t st[4], int64_t q_row,
                                 int64_t k0) {
  return (shape[2] != 1 ? q_row * st[2] : 0) + (shape[3] != 1 ? k0 * st[3] : 0);
}

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
    const int64_t off = bias_block_offset(l->bias_shape, g->bias_s, q_row, k0);
    bi.bias.data = (char *)in->bias.data + (size_t)off * bes;
    memcpy(bi.bias.stride, g->bias_s, sizeof g->bias_s);
  }
  if (l->has_mask) {
    const int64_t off = bias_block_offset(l->mask_shape, g->mask_s, q_row, k0);
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

/* The plan of na x nc chunks with the problem's mask (NULL where this rank runs none). */
static attn_plan *span_plan(const attn_dist_plan *plan, int32_t na, int32_t nc) {
  return na == 1 && nc == 1 ? plan->block_plan : plan->span_plans[na - 1][nc - 1];
}

/* The plan of a block (its shape in chunks), placed at the block's global positions: each of its
 * query chunks and key chunks a piece of its own; a host block's results partial (f32), a device
 * block's (one pair of chunks) in the problem's dtype, which the cuda kernels write. */
static attn_status place_block(const ring *g, const ring_block *b, int partial,
                               attn_plan **block_plan) {
  const attn_problem *G = &g->plan->global;
  attn_positions pos;
  memset(&pos, 0, sizeof pos);
  pos.batch0 = g->plan->b0;
  pos.head0 = g->plan->ring_head0;
  pos.rows.pieces = b->na, pos.cols.pieces = b->nc;
  for (int32_t a = 0; a < b->na; ++a) {
    pos.rows.start[a] = (int64_t)a * g->nq;
    pos.rows.global[a] = attn_dist_chunk_start(g->plan, G->seqlen_q, g->r, b->a0 + a);
  }
  for (int32_t c = 0; c < b->nc; ++c) {
    pos.cols.start[c] = (int64_t)c * g->nk;
    pos.cols.global[c] = attn_dist_chunk_start(g->plan, G->seqlen_k, b->src, b->c0 + c);
  }
  pos.has_offset = 1;
  pos.offset = g->o_global;
  pos.partial = partial;
  *block_plan = span_plan(g->plan, b->na, b->nc);
  return attn_plan_set_positions(*block_plan, &pos);
}

/* The sinks plan (the local queries against the sinks alone) at the ring's batch and heads, its
 * results partial as a block's. */
static attn_status place_sinks(const ring *g) {
  attn_positions pos;
  memset(&pos, 0, sizeof pos);
  pos.batch0 = g->plan->b0;
  pos.head0 = g->plan->ring_head0;
  pos.partial = 1;
  return attn_plan_set_positions(g->plan->sinks_plan, &pos);
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
static void progress(const ring *g, const transfer *t) {
  if (g->plan->ops->progress == NULL) return;
  if (t->recv != NULL) g->plan->ops->progress(g->plan->ring_comm, t->recv);
  if (t->send != NULL) g->plan->ops->progress(g->plan->ring_comm, t->send);
}

/* The host blocks' progress hook (attn_plan_set_progress): called by a block's calling thread
 * between its work items, it moves the step's transfers on, which MPI otherwise moves only when
 * the ring calls it between blocks, and a zigzag step is one block. */
static void ring_progress(void *arg) {
  const ring *g = arg;
  for (int i = 0; i < 2; ++i)
    if (g->moving[i] != NULL) progress(g, g->moving[i]);
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

/* ---- the step driver ------------------------------------------------------------------------- */

/* One pass of the ring (forward or backward, host or device) as the operations it calls; the
 * order of steps, transfers and blocks, and what a failure leaves in flight, live once in
 * run_steps. Each operation returns a status (a failure stops the pass); `self` is the pass's
 * own state. */
typedef struct ring_pass {
  ring *g;
  void *self;
  char *kv[2]; /* the K/V slice in hand and the one arriving, packed (kv[0] holds the local one) */
  /* Backward only (NULL forward): the travelling dK/dV sums, one in hand and one arriving, of
   * dkv_bytes each; after the run dcur names the one that holds this rank's own sums. */
  void *dkv[2];
  size_t dkv_bytes;
  int dcur;
  /* Before a transfer that overwrites a buffer the blocks read (or sends one they wrote); NULL
   * where the blocks have finished when they return (the host). */
  attn_status (*order_transfer)(attn_dist_plan *plan);
  /* Backward: at the start of a step, after its K/V transfer was posted: clears the step's share
   * of the dK/dV sums (summed apart, so the previous step's sums can still be in flight). */
  attn_status (*begin_step)(void *self);
  /* A block of the step (step_blocks) against rank src's slice kv. */
  attn_status (*block)(void *self, const ring_block *b, const char *kv);
  block_mode mode; /* placed at global positions (host), or as the device runs them */
  /* Backward: the step's share joins the travelling sums in hand, dkv. */
  attn_status (*add_step)(void *self, void *dkv);
} ring_pass;

static int in_flight(const transfer *t) { return t->recv != NULL || t->send != NULL; }

static attn_status order_transfer(const ring_pass *p) {
  return p->order_transfer != NULL ? p->order_transfer(p->g->plan) : ATTN_STATUS_OK;
}

/* Runs the steps of the ring: at step s the slice of rank r - s is in hand while the next one
 * travels (received from r - 1, sent to r + 1). Backward, the dK/dV sums travel one step behind
 * their slice, and after the last step go straight home to the slice's owner. */
static attn_status run_steps(ring_pass *p) {
  ring *g = p->g;
  const int backward = p->dkv[0] != NULL;
  const int32_t last = last_step(g), next = (g->r + 1) % g->n, prev = (g->r + g->n - 1) % g->n;
  g->plan->stats.steps = last + 1;
  int cur = 0;                /* the K/V slice in hand */
  transfer dt = {NULL, NULL}; /* the dK/dV exchange in flight, and its peers */
  int32_t dto = 0, dfrom = 0;
  attn_status status = ATTN_STATUS_OK;
  p->dcur = 0;
  for (int32_t s = 0; s <= last; ++s) {
    const int32_t src = ((g->r - s) % g->n + g->n) % g->n;
    transfer t = {NULL, NULL};
    if (s < last) {
      status = order_transfer(p);
      if (status == ATTN_STATUS_OK)
        status = start_shift(g, p->kv[cur], p->kv[1 - cur], g->kv_bytes, next, prev, TAG_KV, &t);
      if (status != ATTN_STATUS_OK) {
        abandon(g, &dt);
        return status;
      }
    }
    if (p->begin_step != NULL) status = p->begin_step(p->self);
    ring_block blocks[4];
    const int nb = step_blocks(g, g->r, s, p->mode, blocks);
    g->moving[0] = &t, g->moving[1] = &dt;
    for (int i = 0; i < nb && status == ATTN_STATUS_OK; ++i) {
      status = p->block(p->self, &blocks[i], p->kv[cur]);
      progress(g, &t);
      progress(g, &dt);
    }
    g->moving[0] = g->moving[1] = NULL;
    if (status != ATTN_STATUS_OK) {
      abandon(g, &t);
      abandon(g, &dt);
      return status;
    }
    if (s < last) {
      status = finish_shift(g, &t, next, prev);
      if (status != ATTN_STATUS_OK) {
        abandon(g, &dt);
        return status;
      }
      cur = 1 - cur;
    }
    if (!backward) continue;
    /* The sums that travelled with this slice so far arrive now (sent at the end of the previous
     * step, in flight during this step's blocks); this step's share joins them. */
    if (in_flight(&dt)) {
      status = finish_shift(g, &dt, dto, dfrom);
      if (status != ATTN_STATUS_OK) return status;
      p->dcur = 1 - p->dcur;
    }
    status = p->add_step(p->self, p->dkv[p->dcur]);
    if (status != ATTN_STATUS_OK) return status;
    /* They move on with the slice; after the last step they go straight home to the slice's
     * owner (src), and this rank receives its own from the rank holding it. */
    dto = s < last ? next : src;
    dfrom = s < last ? prev : (g->r + s) % g->n;
    if (dto != g->r) {
      status = order_transfer(p);
      if (status == ATTN_STATUS_OK)
        status = start_shift(g, p->dkv[p->dcur], p->dkv[1 - p->dcur], p->dkv_bytes, dto, dfrom,
                             TAG_DKV, &dt);
      if (status != ATTN_STATUS_OK) return status;
    }
  }
  if (in_flight(&dt)) {
    status = finish_shift(g, &dt, dto, dfrom);
    if (status != ATTN_STATUS_OK) return status;
    p->dcur = 1 - p->dcur;
  }
  return ATTN_STATUS_OK;
}

/* ---- what the host and device backward share ------------------------------------------------- */

/* Strides of the backward's caller tensors beyond the forward's. */
typedef struct grad_strides {
  int64_t dout[4], dq[4], dk[4], dv[4];
} grad_strides;

static void init_grad_strides(const ring *g, const attn_tensor *dout, const attn_grads *grads,
                              grad_strides *st) {
  const int64_t oshape[4] = {g->B, g->Tq, g->Hq, g->Dv}, qshape[4] = {g->B, g->Tq, g->Hq, g->D};
  const int64_t kshape[4] = {g->B, g->Tk, g->Hkv, g->D}, vshape[4] = {g->B, g->Tk, g->Hkv, g->Dv};
  attn_dist_strides(dout, oshape, 4, st->dout);
  attn_dist_strides(&grads->dq, qshape, 4, st->dq);
  attn_dist_strides(&grads->dk, kshape, 4, st->dk);
  attn_dist_strides(&grads->dv, vshape, 4, st->dv);
}

/* What the host and device backward share: the caller's tensors and the dense block gradients
 * a block's backward writes (qb, kb, vb). */
typedef struct backward_args {
  ring *g;
  const attn_inputs *in;
  const attn_outputs *fwd;
  const attn_tensor *dout;
  grad_strides st;
  char *qb, *kb, *vb;
} backward_args;

static void init_backward_args(backward_args *x, ring *g, const attn_inputs *in,
                               const attn_outputs *fwd, const attn_tensor *dout,
                               const attn_grads *grads) {
  x->g = g, x->in = in, x->fwd = fwd, x->dout = dout;
  init_grad_strides(g, dout, grads, &x->st);
}

/* The start of a backward's scratch, the same on the host and the device: the two K/V slices,
 * the dense block gradients (qb of dq_blk bytes, kb, vb) and the two travelling dK/dV sums of
 * dkv_acc bytes each. Returns what follows them, for the pass's own buffers. */
static char *lay_out_backward(ring_pass *pass, backward_args *x, char *base, size_t dq_blk,
                              size_t dk_blk, size_t dv_blk, size_t dkv_acc) {
  pass->kv[0] = base, pass->kv[1] = base + x->g->kv_bytes;
  x->qb = base + 2 * x->g->kv_bytes, x->kb = x->qb + dq_blk, x->vb = x->kb + dk_blk;
  pass->dkv[0] = x->vb + dv_blk, pass->dkv[1] = x->vb + dv_blk + dkv_acc;
  return x->vb + dv_blk + 2 * dkv_acc;
}

/* The sinks plan's inputs: the local queries and the sinks; the K/V slices stand in for keys it
 * has none of (never read). */
static attn_inputs sinks_inputs(const attn_inputs *in, char *const kv[2]) {
  attn_inputs si;
  attn_inputs_init(&si);
  si.q = in->q;
  si.k = attn_tensor_dense(kv[0]);
  si.v = attn_tensor_dense(kv[1]);
  si.sinks = in->sinks;
  return si;
}

/* dsinks of this rank's rows (the sinks plan's backward, from the global out and lse; its dq of
 * no keys, zeros, goes to the block scratch), then summed over the ranks that share the sink
 * slice, but under two sequence axes, where the all-to-all layer sums it once the heads are back.
 * The host passes no workspace (its plans allocate); the device, the blocks'. */
static attn_status sinks_backward(attn_dist_plan *plan, const attn_inputs *in,
                                  const attn_outputs *fwd, const attn_tensor *dout,
                                  const attn_grads *grads, char *const kv[2],
                                  const backward_args *x, void *ws, size_t ws_size) {
  attn_inputs si = sinks_inputs(in, kv);
  attn_grads sg;
  attn_grads_init(&sg);
  sg.dq = attn_tensor_dense(x->qb);
  sg.dk = attn_tensor_dense(x->kb);
  sg.dv = attn_tensor_dense(x->vb);
  sg.dsinks = grads->dsinks;
  attn_outputs sf;
  attn_outputs_init(&sf);
  sf.out = fwd->out;
  sf.lse = fwd->lse;
  attn_status status = attn_plan_backward(plan->sinks_plan, &si, &sf, dout, ws, ws_size, &sg);
  if (status == ATTN_STATUS_OK && !plan->hybrid)
    status = attn_dist_reduce_dsinks(plan, &grads->dsinks);
  return status;
}

/* What the backward of the block of query chunk a against key chunk c of the slice kv (keys from
 * global position k0) reads and writes: its inputs, the rows of the forward's out and of dout,
 * and the dense block gradients. The lse is the caller's to set (the host slices the caller's;
 * the device copies it aligned). */
typedef struct block_args {
  attn_inputs in;
  attn_outputs fwd;
  attn_tensor dout;
  attn_grads grads;
} block_args;

static void block_backward_args(const backward_args *x, int32_t a, const char *kv, int32_t c,
                                int64_t k0, block_args *blk) {
  const ring *g = x->g;
  const int64_t q_row = (int64_t)a * g->nq;
  blk->in = block_inputs(g, x->in, a, kv, c, k0);
  attn_outputs_init(&blk->fwd);
  blk->fwd.out = x->fwd->out;
  blk->fwd.out.data = (char *)x->fwd->out.data + (size_t)(q_row * g->os[1]) * g->es;
  memcpy(blk->fwd.out.stride, g->os, sizeof g->os);
  blk->dout = *x->dout;
  blk->dout.data = (char *)x->dout->data + (size_t)(q_row * x->st.dout[1]) * g->es;
  memcpy(blk->dout.stride, x->st.dout, sizeof x->st.dout);
  attn_grads_init(&blk->grads);
  blk->grads.dq = attn_tensor_dense(x->qb);
  blk->grads.dk = attn_tensor_dense(x->kb);
  blk->grads.dv = attn_tensor_dense(x->vb);
}

/* ---- the device ring (CUDA tensors) ---------------------------------------------------------- */

/* The same ring on a GPU: the blocks and every merge and sum run in order on the caller's stream
 * (the plan's), the K/V slices and dK/dV sums travel on the ring's own stream, and an event
 * recorded on the caller's stream after a step's blocks keeps the next transfer from overwriting
 * the buffer they read. A transfer's wait blocks the host only: the blocks of the step were
 * enqueued before it, so the GPU computes while the slice moves. Accumulators are f32 (what the
 * cuda kernels keep per row); blocks run unplaced where their own mask is the global one, else
 * placed one pair of chunks at a time (step_blocks, device_block_plan). The sinks enter once, as
 * on the host: the sinks plan's rows against no keys, merged like a block. */

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

/* The plan of a device block: the plan of its shape, unmasked or with the problem's mask, as
 * step_blocks chose (block_runs_unplaced), or for a placed pair the block plan. */
attn_plan *attn_dist_ring_block_plan(const attn_dist_plan *plan, const attn_dist_block *b) {
  return b->full ? plan->full_plans[b->na - 1][b->nc - 1] : span_plan(plan, b->na, b->nc);
}

/* That plan with its positions set: a placed pair's, or none (the block plan serves both). */
static attn_status device_block_plan(const ring *g, const ring_block *b, attn_plan **out) {
  if (b->placed) return place_block(g, b, 0, out);
  *out = attn_dist_ring_block_plan(g->plan, b);
  return attn_plan_set_positions(*out, NULL);
}

/* Bytes of device workspace the blocks and the sinks plan need, forward and backward, 256-byte
 * rounded. */
static size_t device_workspace_bytes(const attn_dist_plan *plan) {
  size_t most = 0;
  for (int i = 0; i < 9; ++i) {
    const int na = i / 2 % 2 + 1, nc = i % 2 + 1;
    const attn_plan *p = i == 8  ? plan->sinks_plan
                         : i < 4 ? span_plan(plan, na, nc)
                                 : plan->full_plans[na - 1][nc - 1];
    size_t f = 0, b = 0;
    if (p == NULL || attn_plan_workspace_size(p, &f, &b) != ATTN_STATUS_OK) continue;
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

/* Packs the caller's local K, V (and kv segment ids) densely into one message, on the caller's
 * stream. */
static attn_status device_pack_kv(const ring *g, const attn_inputs *in, char *buf) {
  attn_dist_plan *plan = g->plan;
  const int32_t dev = plan->global.device_index;
  attn_status status = ATTN_STATUS_OK;
  const int64_t kshape[4] = {g->B, g->Tk, g->Hkv, g->D}, vshape[4] = {g->B, g->Tk, g->Hkv, g->Dv};
  const int64_t kd[4] = {g->Tk * g->Hkv * g->D, g->Hkv * g->D, g->D, 1};
  const int64_t vd[4] = {g->Tk * g->Hkv * g->Dv, g->Hkv * g->Dv, g->Dv, 1};
  DEV("packing K", copy, dev, buf, kd, in->k.data, g->ks, kshape, g->es, plan->stream);
  DEV("packing V", copy, dev, buf + g->k_bytes, vd, in->v.data, g->vs, vshape, g->es, plan->stream);
  if (g->seg) {
    const int64_t sshape[4] = {g->B, g->Tk, 1, 1}, sd[4] = {g->Tk, 1, 0, 0};
    const int64_t ss[4] = {g->kseg_s[0], g->kseg_s[1], 0, 0};
    DEV("packing the kv segment ids", copy, dev, buf + g->k_bytes + g->v_bytes, sd,
        in->kv_segment_ids.data, ss, sshape, 4, plan->stream);
  }
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

/* The device forward's state: a block's dense output and lse, the f32 accumulators, and the
 * blocks' workspace. */
typedef struct device_forward {
  ring *g;
  const attn_inputs *in;
  char *ob, *lb;
  float *ao, *al;
  void *wsp;
  size_t ws;
} device_forward;

static attn_status device_forward_block(void *self, const ring_block *b, const char *kv) {
  device_forward *f = self;
  const ring *g = f->g;
  attn_dist_plan *plan = g->plan;
  /* query chunks a0.. against key chunks c0.. in one call */
  attn_inputs bi = block_inputs(g, f->in, b->a0, kv, b->c0, block_k0(g, b));
  attn_outputs bo;
  attn_outputs_init(&bo);
  bo.out = attn_tensor_dense(f->ob);
  bo.lse = attn_tensor_dense(f->lb);
  attn_plan *bp = NULL;
  attn_status status = device_block_plan(g, b, &bp);
  if (status != ATTN_STATUS_OK) return status;
  const double t0 = attn_dist_now();
  status = attn_plan_forward(bp, &bi, f->wsp, f->ws, &bo);
  plan->stats.compute_seconds += attn_dist_now() - t0;
  ++plan->stats.blocks;
  if (status != ATTN_STATUS_OK) return status;
  DEV("merging a block", merge, plan->global.device_index, (int32_t)g->dt, f->ao, f->al, f->ob,
      (const float *)f->lb, g->B, g->Hq, g->Tq, (int64_t)b->a0 * g->nq, (int64_t)b->na * g->nq,
      g->Dv, plan->stream);
done:
  return status;
}

static attn_status ring_forward_device(attn_dist_plan *plan, const attn_inputs *in,
                                       const attn_outputs *out) {
  ring g;
  init_ring(&g, plan, in, &out->out, out->lse.data != NULL ? &out->lse : NULL);
  const int32_t dev = plan->global.device_index;
  const size_t ws = device_workspace_bytes(plan);
  /* a block's output and lse: up to every query chunk (a step's hull) */
  const size_t out_blk = (size_t)round_part(g.B * g.Tq * g.Hq * g.Dv * (int64_t)g.es);
  const size_t lse_blk = (size_t)round_part(g.B * g.Hq * g.Tq * 4);
  const int64_t n_out = g.B * g.Tq * g.Hq * g.Dv, n_lse = g.B * g.Hq * g.Tq;
  const size_t acc_out = (size_t)round_part(n_out * 4), acc_lse = (size_t)round_part(n_lse * 4);
  char *base = NULL;
  attn_status status =
      device_setup(plan, 2 * g.kv_bytes + out_blk + lse_blk + acc_out + acc_lse + ws, &base);
  if (status != ATTN_STATUS_OK) return status;
  device_forward f = {.g = &g, .in = in, .ws = ws};
  f.ob = base + 2 * g.kv_bytes, f.lb = f.ob + out_blk;
  f.ao = (float *)(f.lb + lse_blk), f.al = (float *)((char *)f.ao + acc_out);
  f.wsp = (char *)f.al + acc_lse;
  ring_pass pass = {.g = &g,
                    .self = &f,
                    .kv = {base, base + g.kv_bytes},
                    .order_transfer = device_order_transfer,
                    .block = device_forward_block,
                    .mode = BLOCKS_DEVICE};
  transfers_on(plan, plan->comm_stream);
  DEV("clearing the output sums", fill, dev, f.ao, n_out, 0.0f, plan->stream);
  DEV("clearing the lse sums", fill, dev, f.al, n_lse, -INFINITY, plan->stream);
  status = device_pack_kv(&g, in, pass.kv[0]);
  if (status == ATTN_STATUS_OK) status = run_steps(&pass);
  if (status == ATTN_STATUS_OK && plan->sinks_plan != NULL) {
    attn_inputs si = sinks_inputs(in, pass.kv);
    attn_outputs so;
    attn_outputs_init(&so);
    so.out = attn_tensor_dense(f.ob);
    so.lse = attn_tensor_dense(f.lb);
    status = attn_plan_forward(plan->sinks_plan, &si, f.wsp, f.ws, &so);
    if (status == ATTN_STATUS_OK)
      DEV("merging the sinks", merge, dev, (int32_t)g.dt, f.ao, f.al, f.ob, (const float *)f.lb,
          g.B, g.Hq, g.Tq, 0, g.Tq, g.Dv, plan->stream);
  }
  if (status != ATTN_STATUS_OK) goto done;
  {
    const int64_t oshape[4] = {g.B, g.Tq, g.Hq, g.Dv};
    DEV("writing out", store, dev, out->out.data, (int32_t)g.dt, g.os, f.ao, oshape, plan->stream);
    if (out->lse.data != NULL) {
      const int64_t lshape[4] = {g.B, g.Hq, g.Tq, 1}, dense[4] = {g.Hq * g.Tq, g.Tq, 1, 0};
      const int64_t to[4] = {g.lses[0], g.lses[1], g.lses[2], 0};
      DEV("writing lse", copy, dev, out->lse.data, to, f.al, dense, lshape, 4, plan->stream);
    }
  }
done:
  transfers_on(plan, plan->stream);
  return status == ATTN_STATUS_OK ? attn_succeed(plan->ctx) : status;
}

/* The device backward's state: dense block gradients, the step's dK/dV share and the dq sums
 * (f32), the query chunk's lse (aligned), and the blocks' workspace. */
typedef struct device_backward {
  backward_args x;
  float *step, *dqa, *lb;
  int64_t nk_el, nkd; /* elements of the dK part, and of dK and dV, of a travelling slice */
  void *wsp;
  size_t ws;
  /* The caller's dbias (data NULL when not asked) and its strides. A bias with query rows and
   * keys: every element is one block's of this rank, written in place. One broadcast over rows
   * or keys (summed): each block writes its share densely into dbias_blk, added into the f32
   * accumulator dbias_acc of the local dbias's shape, stored after the last step. */
  attn_tensor dbias;
  int64_t dbias_s[4];
  int dbias_summed;
  char *dbias_blk;
  float *dbias_acc;
} device_backward;

/* The run of one block's dbias share in the accumulator of a bias broadcast over query rows or
 * keys (at most one of its row and key dims is not 1): where it starts along that dim, of how
 * many elements, in a dim of T (all 1 when the bias broadcasts over both). */
static void dbias_share(const ring *g, const ring_block *rb, int64_t *T, int64_t *row0,
                        int64_t *n) {
  const int64_t *bsh = g->l->bias_shape;
  *T = 1, *row0 = 0, *n = 1;
  if (bsh[3] != 1) /* keys: the block's one key chunk (key chunks stay apart), global columns */
    *T = bsh[3], *row0 = block_k0(g, rb), *n = (int64_t)rb->nc * g->nk;
  else if (bsh[2] != 1) /* query rows: the block's local rows */
    *T = bsh[2], *row0 = (int64_t)rb->a0 * g->nq, *n = (int64_t)rb->na * g->nq;
}

static attn_status device_begin_step(void *self) {
  device_backward *b = self;
  attn_dist_plan *plan = b->x.g->plan;
  attn_status status = ATTN_STATUS_OK;
  DEV("clearing a step's dK/dV", fill, plan->global.device_index, b->step, b->nkd, 0.0f,
      plan->stream);
done:
  return status;
}

static attn_status device_backward_block(void *self, const ring_block *rb, const char *kv) {
  device_backward *b = self;
  const ring *g = b->x.g;
  attn_dist_plan *plan = g->plan;
  const int32_t dev = plan->global.device_index;
  /* query chunks a0.. against key chunks c0.. in one call */
  attn_plan *bp = NULL;
  attn_status status = device_block_plan(g, rb, &bp);
  if (status != ATTN_STATUS_OK) return status;
  const int64_t q_row = (int64_t)rb->a0 * g->nq, k_row = (int64_t)rb->c0 * g->nk;
  const int64_t rows = (int64_t)rb->na * g->nq, keys = (int64_t)rb->nc * g->nk;
  block_args blk;
  block_backward_args(&b->x, rb->a0, kv, rb->c0, block_k0(g, rb), &blk);
  {
    const int64_t lshape[4] = {g->B, g->Hq, rows, 1}, dense[4] = {g->Hq * rows, rows, 1, 0};
    const int64_t from[4] = {g->lses[0], g->lses[1], g->lses[2], 0};
    DEV("copying a block's lse", copy, dev, b->lb, dense,
        (const char *)b->x.fwd->lse.data + (size_t)(q_row * g->lses[2]) * 4, from, lshape, 4,
        plan->stream);
  }
  blk.fwd.lse = attn_tensor_dense(b->lb);
  if (b->dbias_summed) {
    blk.grads.dbias = attn_tensor_dense(b->dbias_blk);
  } else if (b->dbias.data != NULL) { /* the block's rows and keys of the caller's dbias */
    const attn_problem *l = g->l;
    const int64_t off = bias_block_offset(l->bias_shape, b->dbias_s, q_row, block_k0(g, rb));
    blk.grads.dbias.data =
        (char *)b->dbias.data + (size_t)off * attn_dtype_size((attn_dtype)l->bias_dtype);
    memcpy(blk.grads.dbias.stride, b->dbias_s, sizeof b->dbias_s);
  }
  const double t0 = attn_dist_now();
  status = attn_plan_backward(bp, &blk.in, &blk.fwd, &blk.dout, b->wsp, b->ws, &blk.grads);
  plan->stats.compute_seconds += attn_dist_now() - t0;
  ++plan->stats.blocks;
  if (status != ATTN_STATUS_OK) return status;
  /* dq rows of the block's query chunks; dK and dV rows of its key chunks of the slice in hand. */
  DEV("summing gradients", accumulate, dev, b->dqa, g->Tq, q_row, b->x.qb, (int32_t)g->dt, g->B,
      rows, g->Hq * g->D, plan->stream);
  DEV("summing gradients", accumulate, dev, b->step, g->Tk, k_row, b->x.kb, (int32_t)g->dt, g->B,
      keys, g->Hkv * g->D, plan->stream);
  DEV("summing gradients", accumulate, dev, b->step + b->nk_el, g->Tk, k_row, b->x.vb,
      (int32_t)g->dt, g->B, keys, g->Hkv * g->Dv, plan->stream);
  if (b->dbias_summed) {
    const int64_t *bsh = g->l->bias_shape;
    int64_t T = 1, row0 = 0, n = 1;
    dbias_share(g, rb, &T, &row0, &n);
    DEV("summing dbias", accumulate, dev, b->dbias_acc, T, row0, b->dbias_blk,
        (int32_t)g->l->bias_dtype, bsh[0] * bsh[1], n, 1, plan->stream);
  }
done:
  return status;
}

static attn_status device_add_step(void *self, void *dkv) {
  device_backward *b = self;
  attn_dist_plan *plan = b->x.g->plan;
  attn_status status = ATTN_STATUS_OK;
  DEV("adding a step's dK/dV", add, plan->global.device_index, dkv, b->step, b->nkd, plan->stream);
done:
  return status;
}

static attn_status ring_backward_device(attn_dist_plan *plan, const attn_inputs *in,
                                        const attn_outputs *fwd, const attn_tensor *dout,
                                        const attn_grads *grads) {
  ring g;
  init_ring(&g, plan, in, &fwd->out, &fwd->lse);
  const int32_t dev = plan->global.device_index;
  device_backward b;
  memset(&b, 0, sizeof b);
  init_backward_args(&b.x, &g, in, fwd, dout, grads);
  b.ws = device_workspace_bytes(plan);
  b.nk_el = g.B * g.Tk * g.Hkv * g.D, b.nkd = b.nk_el + g.B * g.Tk * g.Hkv * g.Dv;
  const int64_t nq_el = g.B * g.Tq * g.Hq * g.D;
  /* a block's gradients and lse rows: up to every chunk (a step's hull) */
  const size_t dq_blk = (size_t)round_part(g.B * g.Tq * g.Hq * g.D * (int64_t)g.es);
  const size_t dk_blk = (size_t)round_part(g.B * g.Tk * g.Hkv * g.D * (int64_t)g.es);
  const size_t dv_blk = (size_t)round_part(g.B * g.Tk * g.Hkv * g.Dv * (int64_t)g.es);
  const size_t dkv_acc = (size_t)round_part(b.nkd * 4), dq_acc = (size_t)round_part(nq_el * 4);
  const size_t lse_blk = (size_t)round_part(g.B * g.Hq * g.Tq * 4);
  /* dbias: each block writes its rows and keys in place, or (a bias broadcast over rows or
   * keys) its share into a dense block, summed in f32 (device_backward) */
  const int64_t *bsh = g.l->bias_shape;
  const int64_t dbias_n = grads->dbias.data != NULL ? bsh[0] * bsh[1] * bsh[2] * bsh[3] : 0;
  b.dbias_summed = dbias_n > 0 && (bsh[2] == 1 || bsh[3] == 1);
  const size_t zeros = (size_t)round_part(dbias_n * 4); /* f32: zeros, or the sums */
  const size_t dbias_blk =
      b.dbias_summed ? (size_t)round_part(bsh[0] * bsh[1] * (bsh[2] == 1 ? 1 : g.Tq) *
                                          (bsh[3] == 1 ? 1 : g.Tk) *
                                          (int64_t)attn_dtype_size((attn_dtype)g.l->bias_dtype))
                     : 0;
  char *base = NULL;
  attn_status status = device_setup(plan,
                                    2 * g.kv_bytes + dq_blk + dk_blk + dv_blk + 3 * dkv_acc +
                                        dq_acc + lse_blk + zeros + dbias_blk + b.ws,
                                    &base);
  if (status != ATTN_STATUS_OK) return status;
  ring_pass pass = {.g = &g,
                    .self = &b,
                    .dkv_bytes = (size_t)b.nkd * 4,
                    .order_transfer = device_order_transfer,
                    .begin_step = device_begin_step,
                    .block = device_backward_block,
                    .mode = BLOCKS_DEVICE,
                    .add_step = device_add_step};
  char *rest = lay_out_backward(&pass, &b.x, base, dq_blk, dk_blk, dv_blk, dkv_acc);
  b.step = (float *)rest;
  b.dqa = (float *)(rest + dkv_acc);
  /* lb: the block's lse rows, dense and 256-byte aligned: a slice of the global lse starts
   * at row a * nq, 4-byte aligned only, which cuDNN's block plans refuse (16 bytes). */
  b.lb = (float *)((char *)b.dqa + dq_acc);
  float *dbias_zeros = (float *)((char *)b.lb + lse_blk);
  b.dbias_acc = dbias_zeros;
  b.dbias_blk = (char *)dbias_zeros + zeros;
  b.wsp = b.dbias_blk + dbias_blk;
  transfers_on(plan, plan->comm_stream);
  DEV("clearing the dK/dV sums", fill, dev, pass.dkv[0], b.nkd, 0.0f, plan->stream);
  DEV("clearing the dq sums", fill, dev, b.dqa, nq_el, 0.0f, plan->stream);
  if (dbias_n > 0) { /* the pairs no block visits (hidden by the mask) keep dbias 0 */
    b.dbias = grads->dbias;
    attn_dist_strides(&grads->dbias, bsh, 4, b.dbias_s);
    DEV("clearing dbias", fill, dev, dbias_zeros, dbias_n, 0.0f, plan->stream);
    if (!b.dbias_summed)
      DEV("clearing dbias", store, dev, grads->dbias.data, (int32_t)g.l->bias_dtype, b.dbias_s,
          dbias_zeros, bsh, plan->stream);
  }
  status = device_pack_kv(&g, in, pass.kv[0]);
  if (status == ATTN_STATUS_OK) status = run_steps(&pass);
  if (status != ATTN_STATUS_OK) goto done;
  {
    const int64_t qshape[4] = {g.B, g.Tq, g.Hq, g.D}, kshape[4] = {g.B, g.Tk, g.Hkv, g.D};
    const int64_t vshape[4] = {g.B, g.Tk, g.Hkv, g.Dv};
    const float *dkv = pass.dkv[pass.dcur];
    DEV("writing dq", store, dev, grads->dq.data, (int32_t)g.dt, b.x.st.dq, b.dqa, qshape,
        plan->stream);
    DEV("writing dk", store, dev, grads->dk.data, (int32_t)g.dt, b.x.st.dk, dkv, kshape,
        plan->stream);
    DEV("writing dv", store, dev, grads->dv.data, (int32_t)g.dt, b.x.st.dv, dkv + b.nk_el, vshape,
        plan->stream);
    if (b.dbias_summed)
      DEV("writing dbias", store, dev, grads->dbias.data, (int32_t)g.l->bias_dtype, b.dbias_s,
          b.dbias_acc, bsh, plan->stream);
  }
  if (plan->sinks_plan != NULL && grads->dsinks.data != NULL)
    status = sinks_backward(plan, in, fwd, dout, grads, pass.kv, &b.x, b.wsp, b.ws);
  /* a bias broadcast along a split dimension (batch or heads): the other ranks' shares (the
   * hybrid's all-to-all sums the caller's dbias after its own exchange) */
  if (status == ATTN_STATUS_OK && dbias_n > 0 && !plan->hybrid)
    status = attn_dist_reduce_dbias_tensor(plan, &grads->dbias);
done:
  transfers_on(plan, plan->stream);
  return status == ATTN_STATUS_OK ? attn_succeed(plan->ctx) : status;
}

#undef DEV

/* ---- the host passes' sums ------------------------------------------------------------------- */

/* The host passes sum each of this rank's query chunks over the blocks that compute it (the
 * forward's out and lse, the backward's dq), in the order run_steps calls them. A chunk's sums
 * start from its first block's result instead of a zeroed buffer it is added into (a block that
 * starts every chunk it computes writes straight into the sums), and its last block's result is
 * added on the way to the caller's tensor, the sums read once and not written back. Of the n + 2
 * passes over the sums of a chunk that n blocks compute (zero, n adds or merges, write out), n - 1
 * remain where the first block writes into the sums, n where it does not; every value is the same
 * float sum in the same order (0 + x is x; merged into empty sums, a block has the weights 0 and
 * 1 exactly), so results are bit for bit those of the separate passes. */
typedef struct chunk_sums {
  int begun[2];         /* a block has started the chunk's sums */
  int32_t last_call[2]; /* the block call (counted in run order) that ends them; -1: none */
  int32_t calls;        /* block calls so far */
} chunk_sums;

/* With `after` (the forward's sinks, merged once the ring is done), no block ends a chunk. */
static void init_chunk_sums(const ring *g, int after, chunk_sums *q) {
  memset(q, 0, sizeof *q);
  q->last_call[0] = q->last_call[1] = -1;
  const int32_t last = last_step(g);
  int32_t call = 0;
  ring_block blocks[4];
  for (int32_t s = 0; s <= last; ++s) {
    const int nb = step_blocks(g, g->r, s, BLOCKS_PLACED, blocks);
    for (int i = 0; i < nb; ++i, ++call)
      for (int32_t a = blocks[i].a0; a < blocks[i].a0 + blocks[i].na; ++a)
        q->last_call[a] = after ? -1 : call;
  }
}

/* Whether the block call now running is the last to add to query chunk a. */
static int chunk_ends(const chunk_sums *q, int32_t a) { return q->last_call[a] == q->calls; }

/* Whether block b starts the sums of every query chunk it computes and ends none: then it writes
 * its result into the sums themselves. */
static int block_starts_sums(const chunk_sums *q, const ring_block *b) {
  for (int32_t a = b->a0; a < b->a0 + b->na; ++a)
    if (q->begun[a] || chunk_ends(q, a)) return 0;
  return 1;
}

/* Rows from row0 of a buffer [B, T, H, W] of dtype pdt as a block's output tensor (a block
 * writes its rows of a buffer laid out as the sums, so that both are indexed alike). */
static attn_tensor sum_rows(const ring *g, void *base, int64_t T, int64_t row0, int64_t H,
                            int64_t W) {
  attn_tensor t = attn_tensor_dense(sum_at(g, base, row0 * H * W));
  t.stride[0] = T * H * W, t.stride[1] = H * W, t.stride[2] = W, t.stride[3] = 1;
  return t;
}

/* Zeroes rows [row0, row0 + rows) of every batch of a buffer [B, T, H, W] of dtype pdt: the
 * result of a chunk that no block reached. */
static void clear_rows(const ring *g, void *base, int64_t T, int64_t row0, int64_t rows, int64_t H,
                       int64_t W) {
  for (int64_t b = 0; b < g->B; ++b)
    memset(sum_at(g, base, (b * T + row0) * H * W), 0, (size_t)(rows * H * W) * g->pes);
}

/* Rows [row0, row0 + rows) of a block's partial result (blk, laid out as the sums: [B, T, H, W]
 * of dtype pdt) join the sums: they start from it (`first`) or it is added to them; with `out`
 * (a caller's tensor of dtype dt, strides st) the result is final and is written there instead,
 * in the same pass over each row. Where blk is the sums themselves, `first` with `out` writes
 * them out. */
static void join_rows(const ring *g, void *sums, const void *blk, int64_t T, int64_t row0,
                      int64_t rows, int64_t H, int64_t W, int first, const attn_tensor *out,
                      const int64_t st[4]) {
  const int dist_threads = attn_dist_host_threads(g->plan);
  const int64_t n = H * W;
  DIST_PARALLEL_FOR
  for (int64_t bi = 0; bi < g->B * rows; ++bi) { /* one (batch, row) */
    const int64_t b = bi / rows, i = bi % rows, e = (b * T + row0 + i) * n;
    void *acc = sum_at(g, sums, e);
    const void *x = (const char *)blk + (size_t)e * g->pes;
    if (out == NULL) {
      if (!first)
        dist_row_add(acc, g->pdt, x, g->pdt, 0, n);
      else if (x != acc)
        memcpy(acc, x, (size_t)n * g->pes);
      continue;
    }
    for (int64_t h = 0; h < H; ++h) {
      const int64_t at = b * st[0] + (row0 + i) * st[1] + h * st[2];
      const size_t off = (size_t)(h * W) * g->pes;
      if (first)
        dist_row_store(out->data, g->dt, at, st[3], (const char *)x + off, g->pdt, W);
      else
        dist_row_store_blend(out->data, g->dt, at, st[3], (const char *)acc + off, 1.0, 1.0,
                             (const char *)x + off, g->pdt, W);
    }
  }
}

/* ---- forward --------------------------------------------------------------------------------- */

/* The host forward's state: a block's output and lse (ob [B, Tq, Hq, Dv] of dtype pdt, lb
 * [B, Hq, Tq] of dtype stat, the block's rows at their places), the sums (ao as ob, al as lb in
 * double) and the caller's outputs. */
typedef struct host_forward {
  ring *g;
  const attn_inputs *in;
  const attn_outputs *out;
  char *ob, *lb;
  void *ao;
  double *al;
  chunk_sums q;
} host_forward;

/* Merges rows [row0, row0 + rows) of a partial result (out in src, ob or the sums themselves
 * where the block wrote there; lse in lb) into the sums through the lse, `first` and `last` as in
 * join_rows (last: into the caller's out and lse). Row by row with every head inside: a row's
 * heads are one contiguous run of Hq x Dv elements in both buffers, where a head at a time read
 * Dv elements at a stride of Hq x Dv, and took 4x the time of the backward's row sums of the
 * same bytes (a 2-rank profile, issue 12). */
static void merge(const host_forward *f, const void *src, int64_t row0, int64_t rows, int first,
                  int last) {
  const ring *g = f->g;
  const attn_tensor *out = &f->out->out, *lse = &f->out->lse;
  const int dist_threads = attn_dist_host_threads(g->plan);
  DIST_PARALLEL_FOR
  for (int64_t bi = 0; bi < g->B * rows; ++bi) { /* one (batch, row) */
    const int64_t b = bi / rows, i = row0 + bi % rows;
    for (int64_t h = 0; h < g->Hq; ++h) {
      const int64_t bh = b * g->Hq + h, e = ((b * g->Tq + i) * g->Hq + h) * g->Dv;
      const double l = attn_load(f->lb, g->stat, bh * g->Tq + i);
      double *L = &f->al[bh * g->Tq + i];
      void *acc = sum_at(g, f->ao, e);
      const void *x = (const char *)src + (size_t)e * g->pes;
      const int64_t at = b * g->os[0] + i * g->os[1] + h * g->os[2];
      if (first || l == -INFINITY) { /* the block's row alone, or nothing visible in the block */
        const void *row = first ? x : acc;
        if (first) *L = l;
        if (last)
          dist_row_store(out->data, g->dt, at, g->os[3], row, g->pdt, g->Dv);
        else if (row != acc)
          memcpy(acc, row, (size_t)g->Dv * g->pes);
      } else {
        const double m = *L > l ? *L : l;
        const double total = m + log(exp(*L - m) + exp(l - m));
        const double wa = exp(*L - total), wb = exp(l - total);
        if (last)
          dist_row_store_blend(out->data, g->dt, at, g->os[3], acc, wa, wb, x, g->pdt, g->Dv);
        else
          dist_row_blend(acc, g->pdt, wa, wb, x, g->pdt, 0, g->Dv);
        *L = total;
      }
      if (last && lse->data != NULL)
        attn_store(lse->data, g->stat, b * g->lses[0] + h * g->lses[1] + i * g->lses[2], *L);
    }
  }
}

static attn_status host_forward_block(void *self, const ring_block *b, const char *kv) {
  host_forward *f = self;
  const ring *g = f->g;
  const int64_t row0 = (int64_t)b->a0 * g->nq;
  attn_inputs bi = block_inputs(g, f->in, b->a0, kv, b->c0, block_k0(g, b));
  const int into_sums = block_starts_sums(&f->q, b);
  attn_outputs bo;
  attn_outputs_init(&bo);
  bo.out = sum_rows(g, into_sums ? f->ao : f->ob, g->Tq, row0, g->Hq, g->Dv);
  bo.lse = attn_tensor_dense(f->lb + (size_t)row0 * attn_dtype_size(g->stat));
  bo.lse.stride[0] = g->Hq * g->Tq, bo.lse.stride[1] = g->Tq, bo.lse.stride[2] = 1;
  attn_plan *block_plan = NULL;
  attn_status status = place_block(g, b, 1, &block_plan);
  const double t0 = attn_dist_now();
  attn_plan_set_progress(block_plan, ring_progress, (void *)g);
  if (status == ATTN_STATUS_OK) status = attn_plan_forward(block_plan, &bi, NULL, 0, &bo);
  attn_plan_set_progress(block_plan, NULL, NULL);
  g->plan->stats.compute_seconds += attn_dist_now() - t0;
  ++g->plan->stats.blocks;
  if (status != ATTN_STATUS_OK) return status;
  for (int32_t a = b->a0; a < b->a0 + b->na; ++a) {
    merge(f, into_sums ? f->ao : f->ob, (int64_t)a * g->nq, g->nq, !f->q.begun[a],
          chunk_ends(&f->q, a));
    f->q.begun[a] = 1;
  }
  ++f->q.calls;
  return status;
}

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
  const size_t out_blk = (size_t)round_part(g.B * g.Tq * g.Hq * g.Dv * (int64_t)g.pes);
  const size_t lse_blk = (size_t)round_part(g.B * g.Hq * g.Tq * (int64_t)stat_es);
  const size_t acc_out = (size_t)round_part(g.B * g.Tq * g.Hq * g.Dv * (int64_t)g.pes);
  const size_t acc_lse = (size_t)(g.B * g.Hq * g.Tq) * sizeof(double);
  char *base = NULL;
  attn_status status =
      get_scratch(plan, 2 * g.kv_bytes + out_blk + lse_blk + acc_out + acc_lse, &base);
  if (status != ATTN_STATUS_OK) return status;
  host_forward f = {.g = &g, .in = in, .out = out};
  f.ob = base + 2 * g.kv_bytes, f.lb = f.ob + out_blk;
  f.ao = f.lb + lse_blk, f.al = (double *)((char *)f.ao + acc_out);
  init_chunk_sums(&g, plan->sinks_plan != NULL, &f.q);
  ring_pass pass = {.g = &g,
                    .self = &f,
                    .kv = {base, base + g.kv_bytes},
                    .block = host_forward_block,
                    .mode = BLOCKS_PLACED};
  pack_kv(&g, in, pass.kv[0]);
  status = run_steps(&pass);
  if (status != ATTN_STATUS_OK) return status;

  if (plan->sinks_plan != NULL) { /* the sinks' result ends every chunk's sums */
    attn_inputs si = sinks_inputs(in, pass.kv);
    attn_outputs so;
    attn_outputs_init(&so);
    so.out = attn_tensor_dense(f.ob);
    so.lse = attn_tensor_dense(f.lb);
    status = place_sinks(&g);
    if (status == ATTN_STATUS_OK) status = attn_plan_forward(plan->sinks_plan, &si, NULL, 0, &so);
    if (status != ATTN_STATUS_OK) return status;
    for (int32_t a = 0; a < g.C; ++a) merge(&f, f.ob, (int64_t)a * g.nq, g.nq, !f.q.begun[a], 1);
    return attn_succeed(ctx);
  }
  for (int32_t a = 0; a < g.C; ++a) { /* a chunk no block sees: out 0, lse -inf */
    if (f.q.begun[a]) continue;
    clear_rows(&g, f.ob, g.Tq, (int64_t)a * g.nq, g.nq, g.Hq, g.Dv);
    for (int64_t b = 0; b < g.B; ++b)
      for (int64_t h = 0; h < g.Hq; ++h)
        for (int64_t i = 0; i < g.nq; ++i)
          attn_store(f.lb, g.stat, (b * g.Hq + h) * g.Tq + (int64_t)a * g.nq + i, -INFINITY);
    merge(&f, f.ob, (int64_t)a * g.nq, g.nq, 1, 1);
  }
  return attn_succeed(ctx);
}

/* ---- backward -------------------------------------------------------------------------------- */

/* The host backward's state: the block gradients (qb, kb, vb in backward_args, laid out as the
 * sums), the sums of dq (dqa: chunk_sums), the step's share of dK/dV (its key chunks started by
 * their first block of the step, as the dq chunks; at step 0 that share is the travelling sums
 * themselves, dkv0, which nothing has reached yet) and dbias: each block's part is added into a
 * double accumulator of the local dbias's shape (blocks meet in one place when the bias
 * broadcasts rows or keys), written out at the end. */
typedef struct host_backward {
  backward_args x;
  const attn_grads *grads;
  void *step, *dqa, *dkv0;
  chunk_sums q;
  int32_t s;        /* the step running */
  int k_begun[2];   /* key chunks of the slice in hand that this step's blocks have reached */
  int64_t nk_elems; /* elements of dK in a travelling slice (dV follows) */
  double *dbias_acc;
  char *dbias_blk; /* room for the largest block's */
} host_backward;

/* Where the step's share of dK/dV is summed (dK, then dV after nk_elems). */
static void *step_sums(const host_backward *b) { return b->s == 0 ? b->dkv0 : b->step; }

static attn_status host_begin_step(void *self) {
  host_backward *b = self;
  ++b->s;
  b->k_begun[0] = b->k_begun[1] = 0;
  return ATTN_STATUS_OK;
}

static attn_status host_backward_block(void *self, const ring_block *rb, const char *kv) {
  host_backward *b = self;
  const ring *g = b->x.g;
  const attn_problem *l = g->l;
  const int64_t q_row = (int64_t)rb->a0 * g->nq, k0 = block_k0(g, rb);
  const int64_t rows = (int64_t)rb->na * g->nq, keys = (int64_t)rb->nc * g->nk;
  const int64_t k_row = (int64_t)rb->c0 * g->nk;
  char *const dk_sums = step_sums(b), *const dv_sums = sum_at(g, dk_sums, b->nk_elems);
  const int q_into_sums = block_starts_sums(&b->q, rb);
  int k_into_sums = 1; /* the block starts the step's sums of every key chunk it reaches */
  for (int32_t c = rb->c0; c < rb->c0 + rb->nc; ++c) k_into_sums &= !b->k_begun[c];
  block_args blk;
  block_backward_args(&b->x, rb->a0, kv, rb->c0, k0, &blk);
  blk.fwd.lse = b->x.fwd->lse;
  blk.fwd.lse.data =
      (char *)b->x.fwd->lse.data + (size_t)(q_row * g->lses[2]) * attn_dtype_size(g->stat);
  memcpy(blk.fwd.lse.stride, g->lses, sizeof g->lses);
  blk.grads.dq = sum_rows(g, q_into_sums ? b->dqa : b->x.qb, g->Tq, q_row, g->Hq, g->D);
  blk.grads.dk = sum_rows(g, k_into_sums ? dk_sums : b->x.kb, g->Tk, k_row, g->Hkv, g->D);
  blk.grads.dv = sum_rows(g, k_into_sums ? dv_sums : b->x.vb, g->Tk, k_row, g->Hkv, g->Dv);
  if (b->dbias_blk != NULL) blk.grads.dbias = attn_tensor_dense(b->dbias_blk);
  attn_plan *block_plan = NULL;
  attn_status status = place_block(g, rb, 1, &block_plan);
  const double t0 = attn_dist_now();
  attn_plan_set_progress(block_plan, ring_progress, (void *)g);
  if (status == ATTN_STATUS_OK)
    status = attn_plan_backward(block_plan, &blk.in, &blk.fwd, &blk.dout, NULL, 0, &blk.grads);
  attn_plan_set_progress(block_plan, NULL, NULL);
  g->plan->stats.compute_seconds += attn_dist_now() - t0;
  ++g->plan->stats.blocks;
  if (status != ATTN_STATUS_OK) return status;
  for (int32_t a = rb->a0; a < rb->a0 + rb->na && !q_into_sums; ++a) {
    const int last = chunk_ends(&b->q, a);
    join_rows(g, b->dqa, b->x.qb, g->Tq, (int64_t)a * g->nq, g->nq, g->Hq, g->D, !b->q.begun[a],
              last ? &b->grads->dq : NULL, b->x.st.dq);
  }
  for (int32_t a = rb->a0; a < rb->a0 + rb->na; ++a) b->q.begun[a] = 1;
  ++b->q.calls;
  /* dK and dV of the slice in hand: [B, Tk, Hkv, D] then [B, Tk, Hkv, Dv]. */
  for (int32_t c = rb->c0; c < rb->c0 + rb->nc; ++c) {
    if (!k_into_sums) {
      const int64_t c_row = (int64_t)c * g->nk;
      join_rows(g, dk_sums, b->x.kb, g->Tk, c_row, g->nk, g->Hkv, g->D, !b->k_begun[c], NULL, NULL);
      join_rows(g, dv_sums, b->x.vb, g->Tk, c_row, g->nk, g->Hkv, g->Dv, !b->k_begun[c], NULL,
                NULL);
    }
    b->k_begun[c] = 1;
  }
  if (b->dbias_blk != NULL) {
    const int64_t *bsh = l->bias_shape;
    const int64_t r0 = bsh[2] != 1 ? q_row : 0, c0 = bsh[3] != 1 ? k0 : 0;
    /* a block's dbias: its rows (step_blocks keeps key chunks apart when bias has keys) */
    const int64_t blk_rows = bsh[2] != 1 ? rows : 1, blk_cols = bsh[3] != 1 ? keys : 1;
    int64_t e = 0;
    for (int64_t i0 = 0; i0 < bsh[0]; ++i0)
      for (int64_t i1 = 0; i1 < bsh[1]; ++i1)
        for (int64_t i2 = 0; i2 < blk_rows; ++i2)
          for (int64_t i3 = 0; i3 < blk_cols; ++i3, ++e)
            b->dbias_acc[((i0 * bsh[1] + i1) * bsh[2] + r0 + i2) * bsh[3] + c0 + i3] +=
                attn_load(b->dbias_blk, (attn_dtype)l->bias_dtype, e);
  }
  return ATTN_STATUS_OK;
}

/* The step's share joins the travelling sums dkv: each key chunk its blocks reached (at step 0
 * the blocks summed into dkv itself, whose chunks no block reached are zero). */
static attn_status host_add_step(void *self, void *dkv) {
  host_backward *b = self;
  const ring *g = b->x.g;
  char *const dv = sum_at(g, dkv, b->nk_elems);
  for (int32_t c = 0; c < g->C; ++c) {
    const int64_t c_row = (int64_t)c * g->nk;
    if (b->s == 0 && !b->k_begun[c]) {
      clear_rows(g, dkv, g->Tk, c_row, g->nk, g->Hkv, g->D);
      clear_rows(g, dv, g->Tk, c_row, g->nk, g->Hkv, g->Dv);
    } else if (b->s > 0 && b->k_begun[c]) {
      join_rows(g, dkv, b->step, g->Tk, c_row, g->nk, g->Hkv, g->D, 0, NULL, NULL);
      join_rows(g, dv, sum_at(g, b->step, b->nk_elems), g->Tk, c_row, g->nk, g->Hkv, g->Dv, 0, NULL,
                NULL);
    }
  }
  return ATTN_STATUS_OK;
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
  host_backward b;
  memset(&b, 0, sizeof b);
  init_backward_args(&b.x, &g, in, fwd, dout, grads);
  b.grads = grads;
  b.s = -1;
  init_chunk_sums(&g, 0, &b.q);
  int64_t dbias_s[4];
  if (grads->dbias.data != NULL) attn_dist_strides(&grads->dbias, l->bias_shape, 4, dbias_s);
  b.nk_elems = g.B * g.Tk * g.Hkv * g.D;
  const int64_t nkd = g.B * g.Tk * g.Hkv * (g.D + g.Dv); /* dK then dV, per travelling slice */
  const size_t dq_blk = (size_t)round_part(g.B * g.Tq * g.Hq * g.D * (int64_t)g.pes);
  /* a block's dK and dV: up to every key chunk of the slice */
  const size_t dk_blk = (size_t)round_part(g.B * g.Tk * g.Hkv * g.D * (int64_t)g.pes);
  const size_t dv_blk = (size_t)round_part(g.B * g.Tk * g.Hkv * g.Dv * (int64_t)g.pes);
  const size_t dkv_acc = (size_t)round_part(nkd * (int64_t)g.pes);
  const size_t dq_acc = (size_t)round_part(g.B * g.Tq * g.Hq * g.D * (int64_t)g.pes);
  char *base = NULL;
  attn_status status =
      get_scratch(plan, 2 * g.kv_bytes + dq_blk + dk_blk + dv_blk + 3 * dkv_acc + dq_acc, &base);
  if (status != ATTN_STATUS_OK) return status;
  ring_pass pass = {.g = &g,
                    .self = &b,
                    .dkv_bytes = dkv_acc,
                    .begin_step = host_begin_step,
                    .block = host_backward_block,
                    .mode = BLOCKS_PLACED,
                    .add_step = host_add_step};
  char *rest = lay_out_backward(&pass, &b.x, base, dq_blk, dk_blk, dv_blk, dkv_acc);
  b.step = rest;
  b.dqa = rest + dkv_acc;
  b.dkv0 = pass.dkv[0]; /* run_steps's sums in hand at step 0 */
  pack_kv(&g, in, pass.kv[0]);
  const int64_t *bsh = l->bias_shape;
  const int64_t dbias_n = grads->dbias.data != NULL ? bsh[0] * bsh[1] * bsh[2] * bsh[3] : 0;
  if (dbias_n > 0) {
    const int64_t most_rows = bsh[2] != 1 ? g.Tq : 1, most_cols = bsh[3] != 1 ? g.nk : 1;
    b.dbias_acc = calloc((size_t)dbias_n, sizeof(double));
    b.dbias_blk = malloc((size_t)(bsh[0] * bsh[1] * most_rows * most_cols) *
                         attn_dtype_size((attn_dtype)l->bias_dtype));
    if (b.dbias_acc == NULL || b.dbias_blk == NULL) {
      free(b.dbias_acc);
      free(b.dbias_blk);
      return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory for dbias");
    }
  }

  status = run_steps(&pass);
  if (status != ATTN_STATUS_OK) goto done;
  for (int32_t a = 0; a < g.C; ++a) { /* a query chunk no block sees: dq 0 */
    if (b.q.begun[a]) continue;
    clear_rows(&g, b.dqa, g.Tq, (int64_t)a * g.nq, g.nq, g.Hq, g.D);
    join_rows(&g, b.dqa, b.dqa, g.Tq, (int64_t)a * g.nq, g.nq, g.Hq, g.D, 1, &grads->dq, b.x.st.dq);
  }
  void *dkv = pass.dkv[pass.dcur];
  void *dv = sum_at(&g, dkv, b.nk_elems);
  join_rows(&g, dkv, dkv, g.Tk, 0, g.Tk, g.Hkv, g.D, 1, &grads->dk, b.x.st.dk);
  join_rows(&g, dv, dv, g.Tk, 0, g.Tk, g.Hkv, g.Dv, 1, &grads->dv, b.x.st.dv);

  if (plan->sinks_plan != NULL && grads->dsinks.data != NULL) {
    status = place_sinks(&g);
    if (status == ATTN_STATUS_OK)
      status = sinks_backward(plan, in, fwd, dout, grads, pass.kv, &b.x, NULL, 0);
    if (status != ATTN_STATUS_OK) goto done;
  }
  if (b.dbias_acc != NULL) {
    if (!plan->hybrid) status = attn_dist_reduce_dbias(plan, b.dbias_acc);
    if (status != ATTN_STATUS_OK) goto done;
    for (int64_t i0 = 0; i0 < bsh[0]; ++i0)
      for (int64_t i1 = 0; i1 < bsh[1]; ++i1)
        for (int64_t i2 = 0; i2 < bsh[2]; ++i2)
          for (int64_t i3 = 0; i3 < bsh[3]; ++i3)
            attn_store(grads->dbias.data, (attn_dtype)l->bias_dtype,
                       i0 * dbias_s[0] + i1 * dbias_s[1] + i2 * dbias_s[2] + i3 * dbias_s[3],
                       b.dbias_acc[((i0 * bsh[1] + i1) * bsh[2] + i2) * bsh[3] + i3]);
  }
done:
  free(b.dbias_acc);
  free(b.dbias_blk);
  return status == ATTN_STATUS_OK ? attn_succeed(ctx) : status;
}
