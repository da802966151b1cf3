/*
 * src/dist/dist_plan.c - distributed plans: the spec's checks, the collective agreement check, the
 * local problem, sub-communicators, and runs whose sequence is not split.
 *
 * The path of attn_dist_plan_create: validate the global problem and the spec on each rank ->
 * load the transport and duplicate the caller's communicator -> allgather every rank's record
 * (agree.h: problem, spec, and its local verdict with the message) so that every rank returns the
 * same status, naming the field and the ranks that disagree -> split off the sequence ring and
 * the dsinks reduction groups -> plan the local problem (ns == 1) or its blocks (ns > 1).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "dist/dist.h"

#include "dist/agree.h"

#include "core/ctx.h"
#include "core/dtype.h"
#include "core/gpu.h"
#include "impl/impl.h"
#include "module/module.h"
#include "plan/plan.h"
#include "plan/validate.h"

#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DIST_MESSAGE 1024

double attn_dist_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int attn_dist_host_threads(const attn_dist_plan *plan) {
#ifdef _OPENMP
  if (omp_in_parallel()) return 1;
  return plan->ctx->num_threads > 0 ? plan->ctx->num_threads : omp_get_max_threads();
#else
  (void)plan;
  return 1;
#endif
}

attn_status attn_dist_plan_last_stats(const attn_dist_plan *plan, attn_dist_stats *stats) {
  if (plan == NULL || stats == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  *stats = plan->stats;
  return ATTN_STATUS_OK;
}

void attn_dist_spec_init(attn_dist_spec *spec) {
  if (spec == NULL) return;
  memset(spec, 0, sizeof *spec);
  spec->num_axes = 1;
  for (int a = 0; a < ATTN_DIST_MAX_AXES; ++a) spec->axis_size[a] = a == 0 ? 0 : 1;
  spec->axis_dim[0] = ATTN_DIST_DIM_SEQUENCE;
  spec->strategy = ATTN_DIST_STRATEGY_AUTO;
  spec->layout = ATTN_DIST_LAYOUT_CONTIGUOUS;
  spec->timeout_seconds = 300.0;
}

void attn_dist_strides(const attn_tensor *t, const int64_t *shape, int ndim, int64_t stride[4]) {
  int all_zero = 1;
  for (int d = 0; d < ndim; ++d) all_zero &= t->stride[d] == 0;
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    stride[d] = all_zero ? s : t->stride[d];
    s *= shape[d];
  }
  for (int d = ndim; d < 4; ++d) stride[d] = 0;
}

int64_t attn_dist_layout_position(int32_t layout, int32_t num_ranks, int64_t seqlen, int32_t rank,
                                  int64_t index) {
  if (num_ranks < 1 || rank < 0 || rank >= num_ranks || seqlen < 0) return -1;
  if (layout == ATTN_DIST_LAYOUT_CONTIGUOUS) {
    if (seqlen % num_ranks != 0) return -1;
    int64_t n = seqlen / num_ranks;
    return index < 0 || index >= n ? -1 : rank * n + index;
  }
  if (layout == ATTN_DIST_LAYOUT_ZIGZAG) {
    if (seqlen % (2 * (int64_t)num_ranks) != 0) return -1;
    int64_t c = seqlen / (2 * (int64_t)num_ranks);
    if (index < 0 || index >= 2 * c) return -1;
    return index < c ? rank * c + index : (2 * (int64_t)num_ranks - 1 - rank) * c + (index - c);
  }
  return -1;
}

attn_status attn_dist_permute_sequence(int32_t layout, int32_t num_ranks, int32_t to_layout,
                                       const void *src, void *dst, int64_t outer, int64_t seqlen,
                                       size_t inner_bytes) {
  if (src == NULL || dst == NULL || outer < 0 || num_ranks < 1 ||
      (seqlen > 0 && attn_dist_layout_position(layout, num_ranks, seqlen, 0, 0) < 0))
    return ATTN_STATUS_INVALID_ARGUMENT;
  const int64_t per_rank = seqlen / num_ranks;
  for (int64_t o = 0; o < outer; ++o)
    for (int32_t r = 0; r < num_ranks; ++r)
      for (int64_t i = 0; i < per_rank; ++i) {
        int64_t global = attn_dist_layout_position(layout, num_ranks, seqlen, r, i);
        int64_t placed = r * per_rank + i;
        int64_t from = to_layout ? global : placed, to = to_layout ? placed : global;
        memcpy((char *)dst + (size_t)(o * seqlen + to) * inner_bytes,
               (const char *)src + (size_t)(o * seqlen + from) * inner_bytes, inner_bytes);
      }
  return ATTN_STATUS_OK;
}

int64_t attn_dist_chunk_start(const attn_dist_plan *plan, int64_t T, int32_t r, int32_t chunk) {
  const int64_t chunk_len = T / ((int64_t)plan->ring_n * plan->chunks);
  if (plan->layout == ATTN_DIST_LAYOUT_ZIGZAG)
    return (chunk == 0 ? r : 2 * (int64_t)plan->ring_n - 1 - r) * chunk_len;
  return (int64_t)r * chunk_len;
}

/* ---- the local problem ----------------------------------------------------------------------- */

/* The mesh: axis sizes resolved, one axis at most per dimension. */
static attn_status check_spec(attn_ctx *ctx, const attn_dist_spec *in, int32_t world_size,
                              attn_dist_spec *out) {
  *out = *in;
  if (in->num_axes < 1 || in->num_axes > ATTN_DIST_MAX_AXES)
    return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "spec.num_axes=%d is not in 1..%d",
                     (int)in->num_axes, ATTN_DIST_MAX_AXES);
  int seen[ATTN_DIST_DIM_COUNT] = {0};
  int64_t product = 1;
  for (int a = 0; a < in->num_axes; ++a) {
    if (in->axis_dim[a] < 0 || in->axis_dim[a] >= ATTN_DIST_DIM_COUNT)
      return attn_fail(
          ctx, ATTN_STATUS_INVALID_ARGUMENT,
          "spec.axis_dim[%d]=%d is not an attn_dist_dim (NONE, BATCH, HEADS, SEQUENCE)", a,
          (int)in->axis_dim[a]);
    /* The sequence may be split by two axes: the outer runs the ring, the inner the all-to-all. */
    if (in->axis_dim[a] != ATTN_DIST_DIM_NONE &&
        ++seen[in->axis_dim[a]] > (in->axis_dim[a] == ATTN_DIST_DIM_SEQUENCE ? 2 : 1))
      return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                       "spec.axis_dim[%d]=%d: that dimension is already split by another axis; "
                       "batch and heads are split by one axis at most, the sequence by two",
                       a, (int)in->axis_dim[a]);
    if (in->axis_size[a] < 0 || (in->axis_size[a] == 0 && a != 0))
      return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                       "spec.axis_size[%d]=%d must be >= 1 (0 is allowed for axis 0 only)", a,
                       (int)in->axis_size[a]);
    if (a > 0) product *= in->axis_size[a];
  }
  if (in->axis_size[0] == 0) {
    if (world_size % product != 0)
      return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                       "spec.axis_size[0]=0 (the rest of the ranks): the communicator's %d ranks "
                       "are not a multiple of the other axes' %lld",
                       (int)world_size, (long long)product);
    out->axis_size[0] = (int32_t)(world_size / product);
  }
  product *= out->axis_size[0];
  if (product != world_size)
    return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                     "spec.axis_size: the mesh has %lld ranks, the communicator %d; the product "
                     "of the axis sizes must equal the communicator's size",
                     (long long)product, (int)world_size);
  for (int a = in->num_axes; a < ATTN_DIST_MAX_AXES; ++a)
    out->axis_size[a] = 1, out->axis_dim[a] = 0;
  if (in->strategy < 0 || in->strategy >= ATTN_DIST_STRATEGY_COUNT)
    return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                     "spec.strategy=%d is not an attn_dist_strategy", (int)in->strategy);
  if (in->layout < 0 || in->layout >= ATTN_DIST_LAYOUT_COUNT)
    return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "spec.layout=%d is not an attn_dist_layout",
                     (int)in->layout);
  if (!(in->timeout_seconds > 0.0))
    return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "spec.timeout_seconds=%g must be > 0",
                     in->timeout_seconds);
  return ATTN_STATUS_OK;
}

/* The split counts, the local problem and this rank's offsets; refuses sizes that do not divide and
 * what the layer cannot run. */
static attn_status make_local(attn_dist_plan *plan, int32_t world_rank) {
  attn_ctx *ctx = plan->ctx;
  const attn_problem *g = &plan->global;
  const attn_dist_spec *s = &plan->spec;
  plan->nb = plan->nh = plan->ns = 1;
  int32_t cb = 0, ch = 0, cs = 0;
  int32_t rest = world_rank;
  for (int a = s->num_axes - 1; a >= 0; --a) {
    plan->coords[a] = rest % s->axis_size[a];
    rest /= s->axis_size[a];
  }
  int32_t seq_axes = 0, seq_n[2] = {1, 1}, seq_c[2] = {0, 0};
  for (int a = 0; a < s->num_axes; ++a) {
    if (s->axis_dim[a] == ATTN_DIST_DIM_BATCH) plan->nb = s->axis_size[a], cb = plan->coords[a];
    if (s->axis_dim[a] == ATTN_DIST_DIM_HEADS) plan->nh = s->axis_size[a], ch = plan->coords[a];
    if (s->axis_dim[a] == ATTN_DIST_DIM_SEQUENCE)
      seq_n[seq_axes] = s->axis_size[a], seq_c[seq_axes] = plan->coords[a], ++seq_axes;
  }
  /* One sequence axis: the ring (or the all-to-all) over it. Two: the outer is the ring over
   * groups, the inner the all-to-all within each group; the rank's place along the whole
   * sequence split is group-major. */
  plan->ns = seq_n[0] * seq_n[1];
  cs = seq_c[0] * seq_n[1] + seq_c[1];
  plan->hybrid = seq_axes == 2 && seq_n[1] > 1;
  plan->ring_n = plan->hybrid ? seq_n[0] : plan->ns;
  plan->ring_r = plan->hybrid ? seq_c[0] : cs;
  plan->a2a_n = plan->hybrid ? seq_n[1] : 1;
  plan->a2a_r = plan->hybrid ? seq_c[1] : 0;
  plan->seq_rank = cs;
  plan->layout = s->layout;
  plan->chunks = s->layout == ATTN_DIST_LAYOUT_ZIGZAG ? 2 : 1;
  plan->strategy = s->strategy == ATTN_DIST_STRATEGY_AUTO ? ATTN_DIST_STRATEGY_RING : s->strategy;

  if (g->batch % plan->nb != 0)
    return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                     "batch=%lld is not a multiple of the %d ranks that split it",
                     (long long)g->batch, (int)plan->nb);
  if (g->heads_kv % plan->nh != 0)
    return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                     "heads_kv=%lld is not a multiple of the %d ranks that split heads (heads are "
                     "split in whole KV groups)",
                     (long long)g->heads_kv, (int)plan->nh);
  if (g->dtype == ATTN_DTYPE_F8E4M3)
    return attn_fail(ctx, ATTN_STATUS_UNSUPPORTED,
                     "dtype=f8e4m3 in distributed attention: not implemented yet (the local "
                     "problems would need slices of the descale factors, docs/FP8.md); run each "
                     "rank's slice as a problem of its own");
  /* Varlen under a split sequence: the all-to-all gathers whole sequences for each rank's heads,
   * where the single-device kernels run them. Packed: every rank holds its chunks of every
   * sequence (the layout applied to each sequence apart, as TransformerEngine's THD layout does).
   * Padded: the dense layout, and seqlens of the whole sequences, the same on every rank. */
  const int packed = g->varlen == ATTN_VARLEN_PACKED;
  if (g->varlen != ATTN_VARLEN_NONE && plan->ns > 1) {
    const char *why = NULL;
    if (plan->hybrid || s->strategy == ATTN_DIST_STRATEGY_RING)
      why = "runs the all-to-all (strategy ALL_TO_ALL or AUTO, one sequence axis): the ring's "
            "blocks would cut every sequence apart; not implemented";
    else if (packed && plan->nb > 1)
      why = "with the batch split too: each rank's sequences would differ; split heads instead";
    else if (packed && (g->has_bias || g->has_mask || g->has_segment_ids))
      why = "with a bias, a mask or segment ids: their rows would be cut per sequence; not "
            "implemented";
    else if ((g->heads_kv / plan->nh) % plan->ns != 0)
      why = "runs the all-to-all, which gives each sequence rank whole KV groups: the local "
            "heads_kv must be a multiple of the sequence ranks";
    if (why != NULL)
      return attn_fail(ctx, ATTN_STATUS_UNSUPPORTED, "varlen=%s under a split sequence %s",
                       packed ? "packed" : "padded", why);
    attn_dist_set_strategy(plan, ATTN_DIST_STRATEGY_ALL_TO_ALL);
    plan->ring_refused = 1; /* AUTO: nothing to measure */
  }
  if (g->page_size > 0 && plan->ns > 1)
    return attn_fail(ctx, ATTN_STATUS_UNSUPPORTED,
                     "page_size=%lld (a paged KV cache) under a split sequence: the ring and the "
                     "all-to-all move dense k and v; split the batch or the heads",
                     (long long)g->page_size);
  if (plan->ns > 1) {
    const int64_t parts = (int64_t)plan->ns * plan->chunks;
    if (packed && (g->total_q % parts != 0 || g->total_k % parts != 0))
      return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                       "total_q=%lld and total_k=%lld must be multiples of %lld: every sequence "
                       "is cut into %d sequence ranks x %d chunks",
                       (long long)g->total_q, (long long)g->total_k, (long long)parts,
                       (int)plan->ns, (int)plan->chunks);
    if (!packed && (g->seqlen_q % parts != 0 || g->seqlen_k % parts != 0))
      return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                       "seqlen_q=%lld and seqlen_k=%lld must be multiples of %lld (%d sequence "
                       "ranks x %d chunks per rank of the %s layout)",
                       (long long)g->seqlen_q, (long long)g->seqlen_k, (long long)parts,
                       (int)plan->ns, (int)plan->chunks,
                       plan->layout == ATTN_DIST_LAYOUT_ZIGZAG ? "zigzag" : "contiguous");
    if (!packed && plan->layout == ATTN_DIST_LAYOUT_ZIGZAG && g->seqlen_q != g->seqlen_k)
      return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                       "layout=zigzag needs seqlen_q == seqlen_k (%lld != %lld)",
                       (long long)g->seqlen_q, (long long)g->seqlen_k);
    if (plan->hybrid && s->strategy == ATTN_DIST_STRATEGY_ALL_TO_ALL)
      return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                       "spec.strategy=all-to-all with two sequence axes: the outer axis runs the "
                       "ring and the inner the all-to-all; leave strategy AUTO (or RING)");
    if (plan->hybrid && (g->heads_kv / plan->nh) % plan->a2a_n != 0)
      return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                       "the %lld local KV heads are not a multiple of the %d ranks of the inner "
                       "sequence axis, whose all-to-all gives each whole KV groups",
                       (long long)(g->heads_kv / plan->nh), (int)plan->a2a_n);
    if (plan->hybrid) plan->strategy = ATTN_DIST_STRATEGY_RING;
    if (plan->strategy == ATTN_DIST_STRATEGY_ALL_TO_ALL && (g->heads_kv / plan->nh) % plan->ns != 0)
      return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                       "strategy=all-to-all: the %lld local KV heads are not a multiple of the %d "
                       "sequence ranks (each takes whole KV groups)",
                       (long long)(g->heads_kv / plan->nh), (int)plan->ns);
  }

  attn_problem *l = &plan->local;
  *l = *g;
  const int64_t group = g->heads_q / g->heads_kv;
  l->batch = g->batch / plan->nb;
  l->heads_kv = g->heads_kv / plan->nh;
  l->heads_q = l->heads_kv * group;
  /* packed: the longest local sequence (a global one of at most seqlen rows cut into n equal
   * parts; at least 1, as a problem's lengths are) */
  l->seqlen_q = g->seqlen_q / plan->ns, l->seqlen_k = g->seqlen_k / plan->ns;
  if (packed && l->seqlen_q < 1) l->seqlen_q = 1;
  if (packed && l->seqlen_k < 1) l->seqlen_k = 1;
  if (packed) l->total_q = g->total_q / plan->ns, l->total_k = g->total_k / plan->ns;
  plan->b0 = (int64_t)cb * l->batch;
  plan->h0 = (int64_t)ch * l->heads_q;
  /* bias and mask: batch and head dims of full extent are sliced; Tq rows too; Tk stays whole. */
  int64_t *shapes[2] = {l->bias_shape, l->mask_shape};
  for (int t = 0; t < 2; ++t) {
    int64_t *sh = shapes[t];
    if (sh[0] == g->batch && sh[0] != 1) sh[0] = l->batch;
    if (sh[1] == g->heads_q && sh[1] != 1)
      sh[1] = l->heads_q;
    else if (sh[1] == g->heads_kv && sh[1] != 1)
      sh[1] = l->heads_kv;
    if (sh[2] == g->seqlen_q && sh[2] != 1) sh[2] = l->seqlen_q;
  }
  /* The ring's problem: the local one, or (hybrid) the ring group's slice of the sequence for
   * 1/n_inner of the local heads. */
  attn_problem *r = &plan->ring_local;
  *r = *l;
  plan->ring_head0 = plan->h0;
  if (plan->hybrid) {
    r->heads_kv = l->heads_kv / plan->a2a_n;
    r->heads_q = l->heads_q / plan->a2a_n;
    r->seqlen_q = g->seqlen_q / plan->ring_n;
    r->seqlen_k = g->seqlen_k / plan->ring_n;
    plan->ring_head0 = plan->h0 + (int64_t)plan->a2a_r * r->heads_q;
    int64_t *rs[2] = {r->bias_shape, r->mask_shape};
    for (int t = 0; t < 2; ++t) {
      if (rs[t][1] == l->heads_q && rs[t][1] != 1)
        rs[t][1] = r->heads_q;
      else if (rs[t][1] == l->heads_kv && rs[t][1] != 1)
        rs[t][1] = r->heads_kv;
      if (rs[t][2] != 1) rs[t][2] = r->seqlen_q;
    }
  }
  return ATTN_STATUS_OK;
}

int64_t attn_dist_plan_position(const attn_dist_plan *plan, int64_t seqlen, int64_t index) {
  if (plan == NULL || seqlen < 0 || index < 0) return -1;
  if (plan->ns == 1) return index < seqlen ? index : -1;
  if (seqlen % ((int64_t)plan->ns * plan->chunks) != 0 || index >= seqlen / plan->ns) return -1;
  if (!plan->hybrid)
    return attn_dist_layout_position(plan->layout, plan->ns, seqlen, plan->seq_rank, index);
  /* Hybrid: the group's chunks (ring layout) are cut into a2a_n parts; this rank holds part
   * a2a_r of each. */
  const int64_t part = seqlen / ((int64_t)plan->ring_n * plan->chunks * plan->a2a_n);
  const int32_t chunk = (int32_t)(index / part);
  return attn_dist_chunk_start(plan, seqlen, plan->ring_r, chunk) + plan->a2a_r * part +
         index % part;
}

/* Whether the sub-plans need global positions: blocks of a split sequence always on the host
 * (the device ring's, only its placed pairs: make_device_block_plan); on a GPU the local problem
 * of a batch or head split and the all-to-all's block (the whole sequence of some heads) only for
 * dropout's counters (nothing else sees b or h), which leaves cuDNN to those without dropout. */
static int needs_positions(const attn_dist_plan *plan) {
  if (plan->device_ring) return 0;
  if (plan->global.device != ATTN_DEVICE_CPU) return plan->global.dropout_p > 0.0;
  return plan->ns > 1 || plan->global.dropout_p > 0.0;
}

int attn_dist_needs_positions(const attn_dist_plan *plan) { return needs_positions(plan); }

/* Creates a plan for a sub-problem with the caller's selection, and checks that its
 * implementation can be placed at global positions when the plan needs them. */
static attn_status plan_sub(attn_dist_plan *plan, const attn_problem *p, const attn_select *select,
                            attn_plan **out) {
  attn_status status = attn_plan_create(plan->ctx, p, select, out);
  if (status != ATTN_STATUS_OK || !needs_positions(plan)) return status;
  attn_positions probe;
  memset(&probe, 0, sizeof probe);
  return attn_plan_set_positions(*out, &probe);
}

/* The device ring's block plan runs its placed pairs too, where there are any: then it must be of
 * an implementation that takes positions, cuda unless the caller named one (whose plan's
 * set_positions then says whether it can). */
static attn_status make_device_block_plan(attn_dist_plan *plan, const attn_problem *b,
                                          const attn_select *select) {
  int used[2][2];
  attn_dist_ring_device_blocks(plan, used);
  if (!(used[0][0] & ATTN_DIST_CALL_PLACED)) return plan_sub(plan, b, select, &plan->block_plan);
  attn_select placed;
  if (select != NULL)
    placed = *select;
  else
    attn_select_init(&placed);
  if (placed.impl == NULL) placed.impl = "cuda";
  attn_status status = attn_plan_create(plan->ctx, b, &placed, &plan->block_plan);
  if (status != ATTN_STATUS_OK) return status;
  attn_positions probe;
  memset(&probe, 0, sizeof probe);
  probe.has_offset = 1;
  return attn_plan_set_positions(plan->block_plan, &probe);
}

/* The sub-plans: the whole local problem (no sequence split) or one block and the sinks. */
void attn_dist_free_sub_plans(attn_dist_plan *plan) {
  attn_plan_destroy(plan->local_plan);
  attn_plan_destroy(plan->block_plan);
  attn_plan_destroy(plan->sinks_plan);
  plan->local_plan = plan->block_plan = plan->sinks_plan = NULL;
  for (int a = 0; a < 2; ++a)
    for (int c = 0; c < 2; ++c) {
      attn_plan_destroy(plan->span_plans[a][c]);
      attn_plan_destroy(plan->full_plans[a][c]);
      plan->span_plans[a][c] = plan->full_plans[a][c] = NULL;
    }
}

attn_status attn_dist_make_sub_plans(attn_dist_plan *plan, const attn_select *select) {
  if (plan->ns == 1) return plan_sub(plan, &plan->local, select, &plan->local_plan);
  attn_problem *b = &plan->block;
  if (plan->strategy == ATTN_DIST_STRATEGY_ALL_TO_ALL && !plan->hybrid) {
    /* The whole sequence for 1/ns of the local heads (whole KV groups); sinks included. */
    const attn_problem *l = &plan->local;
    *b = *l;
    b->heads_q = l->heads_q / plan->ns;
    b->heads_kv = l->heads_kv / plan->ns;
    b->seqlen_q = plan->global.seqlen_q;
    b->seqlen_k = plan->global.seqlen_k;
    b->total_q = plan->global.total_q; /* packed: every sequence whole */
    b->total_k = plan->global.total_k;
    int64_t *shapes[2] = {b->bias_shape, b->mask_shape};
    for (int t = 0; t < 2; ++t) {
      int64_t *sh = shapes[t];
      if (sh[1] == l->heads_q && sh[1] != 1)
        sh[1] = b->heads_q;
      else if (sh[1] == l->heads_kv && sh[1] != 1)
        sh[1] = b->heads_kv;
      if (sh[2] != 1) sh[2] = b->seqlen_q;
    }
    return plan_sub(plan, b, select, &plan->block_plan);
  }
  *b = plan->ring_local;
  b->seqlen_q = plan->ring_local.seqlen_q / plan->chunks;
  b->seqlen_k = plan->ring_local.seqlen_k / plan->chunks;
  b->num_sinks = 0; /* sinks enter once, through the sinks plan */
  b->sinks_shared = 0;
  if (b->has_bias) {
    if (b->bias_shape[2] != 1) b->bias_shape[2] = b->seqlen_q;
    if (b->bias_shape[3] != 1) b->bias_shape[3] = b->seqlen_k;
  }
  if (b->has_mask) {
    if (b->mask_shape[2] != 1) b->mask_shape[2] = b->seqlen_q;
    if (b->mask_shape[3] != 1) b->mask_shape[3] = b->seqlen_k;
  }
  attn_status status = plan->device_ring ? make_device_block_plan(plan, b, select)
                                         : plan_sub(plan, b, select, &plan->block_plan);
  if (status == ATTN_STATUS_OK && (plan->device_ring || plan->chunks == 2)) {
    /* The blocks of several chunks that a step runs in one call, and on the device the unmasked
     * ones (ring.c, step_blocks). */
    int used[2][2];
    if (plan->device_ring)
      attn_dist_ring_device_blocks(plan, used);
    else
      attn_dist_ring_block_shapes(plan, used);
    for (int na = 1; na <= 2 && status == ATTN_STATUS_OK; ++na)
      for (int nc = 1; nc <= 2 && status == ATTN_STATUS_OK; ++nc) {
        if (used[na - 1][nc - 1] == 0) continue;
        attn_problem span = *b;
        span.seqlen_q = na * b->seqlen_q, span.seqlen_k = nc * b->seqlen_k;
        /* bias and mask dims that are not broadcast in the ring's problem follow the block */
        const attn_problem *r = &plan->ring_local;
        if (r->bias_shape[2] != 1) span.bias_shape[2] = span.seqlen_q;
        if (r->bias_shape[3] != 1) span.bias_shape[3] = span.seqlen_k;
        if (r->mask_shape[2] != 1) span.mask_shape[2] = span.seqlen_q;
        if (r->mask_shape[3] != 1) span.mask_shape[3] = span.seqlen_k;
        if ((used[na - 1][nc - 1] & ATTN_DIST_CALL_MASKED) && (na > 1 || nc > 1))
          status = plan_sub(plan, &span, select, &plan->span_plans[na - 1][nc - 1]);
        if (status == ATTN_STATUS_OK && (used[na - 1][nc - 1] & ATTN_DIST_CALL_FULL)) {
          span.causal = 0;
          span.window_left = span.window_right = -1;
          status = plan_sub(plan, &span, select, &plan->full_plans[na - 1][nc - 1]);
        }
      }
  }
  if (status != ATTN_STATUS_OK || plan->ring_local.num_sinks == 0) return status;
  /* The sinks of a row, alone: its queries against no keys give out = 0 and lse = logsumexp of
   * the sinks (SPEC.md step 8), and backward dsinks; merged once like any block. */
  attn_problem *sp = &plan->sinks_problem;
  attn_problem_init(sp);
  sp->operation = ATTN_OPERATION_FLASH_ATTENTION;
  sp->dtype = plan->ring_local.dtype;
  sp->device = plan->ring_local.device;
  sp->device_index = plan->ring_local.device_index;
  sp->batch = plan->ring_local.batch;
  sp->seqlen_q = plan->ring_local.seqlen_q;
  sp->seqlen_k = 0;
  sp->heads_q = plan->ring_local.heads_q;
  sp->heads_kv = plan->ring_local.heads_kv;
  sp->head_dim = plan->ring_local.head_dim;
  sp->head_dim_v = plan->ring_local.head_dim_v;
  sp->scale = plan->ring_local.scale;
  sp->num_sinks = plan->ring_local.num_sinks;
  sp->sinks_shared = plan->ring_local.sinks_shared;
  return plan_sub(plan, sp, select, &plan->sinks_plan);
}

/* Sub-communicators: the sequence ring (the ranks that differ only in the sequence coordinate),
 * and the dsinks group (every rank holding the same sink slice: those that differ only along
 * batch and sequence, and heads too when the sinks are shared). Collective. */
static attn_status make_groups(attn_dist_plan *plan, char *why, size_t why_size) {
  const attn_dist_spec *s = &plan->spec;
  int32_t seq_color = 0, seq_key = 0, sink_color = 0, sink_key = 0, bias_color = 0, bias_key = 0;
  int32_t ring_color = 0, ring_key = 0, a2a_color = 0, a2a_key = 0, seq_seen = 0;
  int bias_summed_axes = 0;
  const int64_t *bs = plan->global.bias_shape;
  for (int a = 0; a < s->num_axes; ++a) {
    const int dim = s->axis_dim[a];
    const int32_t c = plan->coords[a], n = s->axis_size[a];
    if (dim == ATTN_DIST_DIM_SEQUENCE)
      seq_key = seq_key * n + c;
    else
      seq_color = seq_color * n + c;
    /* Hybrid: the ring joins the ranks that differ only along the outer sequence axis, the
     * all-to-all those that differ only along the inner one. */
    const int is_ring_axis = dim == ATTN_DIST_DIM_SEQUENCE && seq_seen == 0;
    const int is_a2a_axis = dim == ATTN_DIST_DIM_SEQUENCE && seq_seen == 1;
    seq_seen += dim == ATTN_DIST_DIM_SEQUENCE;
    if (is_ring_axis)
      ring_key = c;
    else
      ring_color = ring_color * n + c;
    if (is_a2a_axis)
      a2a_key = c;
    else
      a2a_color = a2a_color * n + c;
    const int summed = dim == ATTN_DIST_DIM_BATCH || dim == ATTN_DIST_DIM_SEQUENCE ||
                       (dim == ATTN_DIST_DIM_HEADS && plan->local.sinks_shared);
    if (summed)
      sink_key = sink_key * n + c;
    else
      sink_color = sink_color * n + c;
    /* dbias: summed along an axis that splits a dimension the bias broadcasts (size 1). */
    const int bias_summed =
        plan->global.has_bias && n > 1 &&
        ((dim == ATTN_DIST_DIM_BATCH && bs[0] == 1) || (dim == ATTN_DIST_DIM_HEADS && bs[1] == 1) ||
         (dim == ATTN_DIST_DIM_SEQUENCE && bs[2] == 1));
    bias_summed_axes += bias_summed;
    if (bias_summed)
      bias_key = bias_key * n + c;
    else
      bias_color = bias_color * n + c;
  }
  attn_status status = ATTN_STATUS_OK;
  if (plan->ns > 1)
    status = (attn_status)plan->ops->split(plan->world, seq_color, seq_key, &plan->seq_comm, why,
                                           why_size);
  plan->ring_comm = plan->seq_comm;
  if (status == ATTN_STATUS_OK && plan->hybrid) {
    status = (attn_status)plan->ops->split(plan->world, ring_color, ring_key, &plan->ring_comm, why,
                                           why_size);
    if (status == ATTN_STATUS_OK)
      status = (attn_status)plan->ops->split(plan->world, a2a_color, a2a_key, &plan->a2a_comm, why,
                                             why_size);
  }
  if (status == ATTN_STATUS_OK && plan->local.num_sinks > 0)
    status = (attn_status)plan->ops->split(plan->world, sink_color, sink_key, &plan->sinks_comm,
                                           why, why_size);
  if (status == ATTN_STATUS_OK && bias_summed_axes > 0)
    status = (attn_status)plan->ops->split(plan->world, bias_color, bias_key, &plan->bias_comm, why,
                                           why_size);
  return status;
}

/* Whether the all-to-all can run the local problem: one sequence axis, whose ranks each take whole
 * KV groups. */
static int all_to_all_fits(const attn_dist_plan *plan) {
  return !plan->hybrid && plan->local.heads_kv % plan->ns == 0;
}

/* CUDA tensors with a split sequence: the all-to-all (ulysses.c: the host's code, its copies on
 * the GPU) or the device ring (ring.c), AUTO choosing between them as on the host (choose.c); on
 * two sequence axes the all-to-all over the inner axis around the device ring over the outer.
 * The ring's blocks run unplaced where the
 * call's own mask is the global one (a causal mask with seqlen_q == seqlen_k, in the zigzag layout
 * one call a step; no mask), else one pair of chunks at a time at its global positions, which the
 * cuda kernels take in one piece per axis: any mask, ALiBi, dropout (key chunks of a multiple of
 * 4 keys: the kernels share one Philox call among 4), the soft cap, masks and segment ids
 * (sliced per block as on the host, the kv segment ids travelling with the slice), a bias
 * (dbias written block by block in place where the bias has rows and keys: ring.c); sinks enter
 * once, as on the host. Loads plan->dev; the strategy (attn_dist_set_strategy). */
static attn_status check_device_split(attn_dist_plan *plan, const attn_dist_spec *spec) {
  attn_ctx *ctx = plan->ctx;
  const attn_problem *g = &plan->global;
  int all_to_all = spec->strategy == ATTN_DIST_STRATEGY_ALL_TO_ALL || plan->ring_refused;
  /* the ring's key chunks (the hybrid's ring runs over the outer axis, ring_n ranks) */
  const int64_t key_chunk = g->seqlen_k / (plan->ring_n * plan->chunks);
  const int ring_runs = g->dropout_p == 0.0 || key_chunk % 4 == 0;
  if (!ring_runs && spec->strategy == ATTN_DIST_STRATEGY_AUTO &&
      all_to_all_fits(plan)) /* AUTO: the one strategy that can */
    all_to_all = plan->ring_refused = 1;
  if (!all_to_all && !ring_runs)
    return attn_fail(ctx, ATTN_STATUS_UNSUPPORTED,
                     "device=cuda with a split sequence and dropout: key chunks of %lld keys "
                     "(seqlen_k=%lld over %d ranks x %d chunks); the cuda kernels share one "
                     "Philox call among 4 keys, so a chunk must start at a multiple of 4 (or use "
                     "strategy ALL_TO_ALL, whose blocks hold every key)",
                     (long long)key_chunk, (long long)g->seqlen_k, (int)plan->ring_n,
                     (int)plan->chunks);
  plan->dev = attn_module_dist_ops();
  if (plan->dev == NULL)
    return attn_fail(ctx, ATTN_STATUS_UNSUPPORTED,
                     "device=cuda with a split sequence needs the ring operations of the cuda "
                     "module (libattn_cuda.so), which is not loaded (attn_module_info says why)");
  /* AUTO starts from the ring (the heuristic); choose.c may measure the all-to-all against it */
  attn_dist_set_strategy(plan, all_to_all ? ATTN_DIST_STRATEGY_ALL_TO_ALL : ATTN_DIST_STRATEGY_RING);
  return ATTN_STATUS_OK;
}

void attn_dist_set_strategy(attn_dist_plan *plan, int32_t strategy) {
  plan->strategy = strategy;
  plan->device_ring = plan->global.device != ATTN_DEVICE_CPU && plan->ns > 1 &&
                      strategy == ATTN_DIST_STRATEGY_RING;
}

attn_status attn_dist_plan_create(attn_ctx *ctx, const attn_problem *problem,
                                  const attn_dist_spec *spec, int32_t transport, void *comm,
                                  const attn_select *select, attn_dist_plan **plan_out) {
  if (ctx == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  if (plan_out == NULL) return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "plan is NULL");
  *plan_out = NULL;
  if (spec == NULL) return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "spec is NULL");
  if (comm == NULL)
    return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                     "comm is NULL: pass a pointer to the caller's MPI_Comm or ncclComm_t");
  if (problem == NULL) return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "problem is NULL");
  char why[DIST_MESSAGE] = "";
  const attn_transport_ops *ops = NULL;
  /* Failing here is the same on every rank of one build, so returning before any collective
   * cannot strand a peer. */
  attn_status status = attn_dist_load_transport(transport, &ops, why, sizeof why);
  if (status != ATTN_STATUS_OK) return attn_fail(ctx, status, "%s", why);
  attn_dist_plan *plan = calloc(1, sizeof *plan);
  if (plan == NULL) return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory making a plan");
  plan->ctx = ctx;
  plan->ops = ops;
  if (select != NULL) {
    plan->has_select = 1;
    plan->select = *select;
    if (select->impl != NULL) {
      snprintf(plan->select_impl, sizeof plan->select_impl, "%s", select->impl);
      plan->select.impl = plan->select_impl;
    }
    if (select->config != NULL) {
      snprintf(plan->select_config, sizeof plan->select_config, "%s", select->config);
      plan->select.config = plan->select_config;
    }
  }
  status = (attn_status)ops->create(comm, &plan->world, why, sizeof why);
  if (status != ATTN_STATUS_OK) {
    free(plan);
    return attn_fail(ctx, status, "%s transport: %s", ops->name, why);
  }
  const int32_t world_rank = ops->rank(plan->world), world_size = ops->size(plan->world);

  /* Local verdict: checks that need no peer. Its status and message travel in the record. */
  status = attn_validate_problem(ctx, problem, &plan->global);
  if (status == ATTN_STATUS_OK) status = check_spec(ctx, spec, world_size, &plan->spec);
  if (status == ATTN_STATUS_OK) status = make_local(plan, world_rank);
  /* For comparisons (bench/RESULTS.md): the ring's blocks one pair of chunks each, as before a
   * step's hull ran as one call (docs/DISTRIBUTED.md). */
  const char *blocks_env = getenv("ATTN_DIST_RING_BLOCKS");
  plan->ring_pairs = blocks_env != NULL && strcmp(blocks_env, "pairs") == 0;
  if (status == ATTN_STATUS_OK && plan->global.device != ATTN_DEVICE_CPU &&
      transport == ATTN_DIST_TRANSPORT_MPI)
    status = attn_fail(ctx, ATTN_STATUS_UNSUPPORTED,
                       "transport=MPI carries CPU tensors; device=cuda needs transport=NCCL");
  if (status == ATTN_STATUS_OK && transport != ATTN_DIST_TRANSPORT_MPI &&
      plan->global.device == ATTN_DEVICE_CPU)
    status = attn_fail(ctx, ATTN_STATUS_UNSUPPORTED,
                       "transport=NCCL carries CUDA tensors; device=cpu needs transport=MPI");
  if (status == ATTN_STATUS_OK && plan->global.device != ATTN_DEVICE_CPU && plan->ns > 1)
    status = check_device_split(plan, spec);

  attn_dist_record *all = calloc((size_t)world_size + 1, sizeof *all);
  if (all == NULL) {
    /* The peers wait in the allgather below until their timeout: the best a rank without memory
     * can do is not to hang itself. */
    ops->destroy(plan->world);
    free(plan);
    return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory for the agreement check");
  }
  attn_dist_record *mine = &all[world_size];
  attn_dist_record_fill(mine, status, status == ATTN_STATUS_OK ? "" : attn_ctx_last_error(ctx),
                        problem, spec);
  attn_status comm_status = (attn_status)ops->allgather(
      plan->world, mine, all, sizeof *mine,
      spec->timeout_seconds > 0 ? spec->timeout_seconds : 300.0, why, sizeof why);
  if (comm_status != ATTN_STATUS_OK)
    status = attn_fail(ctx, comm_status, "the plan's agreement check: %s", why);
  else if (status == ATTN_STATUS_OK) /* a rank that refused keeps its own message */
    status = attn_dist_agree(ctx, all, world_size);
  free(all);
  if (status == ATTN_STATUS_OK) {
    status = make_groups(plan, why, sizeof why);
    if (status != ATTN_STATUS_OK)
      status = attn_fail(ctx, status, "%s transport: %s", ops->name, why);
  }
  /* Sub-plans depend only on the agreed problem, so every rank succeeds or fails alike. */
  if (status == ATTN_STATUS_OK) {
    const int a2a_possible = plan->ns > 1 && !plan->ring_refused && all_to_all_fits(plan);
    if (spec->strategy == ATTN_DIST_STRATEGY_AUTO && a2a_possible)
      status = attn_dist_choose_strategy(plan, select);
    else
      status = attn_dist_make_sub_plans(plan, select);
  }
  if (status != ATTN_STATUS_OK) {
    char keep[ATTN_MESSAGE_SIZE];
    snprintf(keep, sizeof keep, "%s", attn_ctx_last_error(ctx));
    attn_dist_plan_destroy(plan);
    return attn_fail(ctx, status, "%s", keep);
  }
  *plan_out = plan;
  return attn_succeed(ctx);
}

void attn_dist_plan_destroy(attn_dist_plan *plan) {
  if (plan == NULL) return;
  attn_dist_free_sub_plans(plan);
  attn_dist_ulysses_release(plan);
  attn_dist_device_release(plan);
  if (plan->sinks_comm != NULL) plan->ops->destroy(plan->sinks_comm);
  if (plan->bias_comm != NULL) plan->ops->destroy(plan->bias_comm);
  if (plan->hybrid && plan->ring_comm != NULL) plan->ops->destroy(plan->ring_comm);
  if (plan->a2a_comm != NULL) plan->ops->destroy(plan->a2a_comm);
  if (plan->seq_comm != NULL) plan->ops->destroy(plan->seq_comm);
  plan->ops->destroy(plan->world);
  free(plan->scratch);
  free(plan);
}

attn_status attn_dist_plan_local_problem(const attn_dist_plan *plan, attn_problem *local,
                                         int32_t *coords) {
  if (plan == NULL || local == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  *local = plan->local;
  if (coords != NULL) memcpy(coords, plan->coords, sizeof plan->coords);
  return ATTN_STATUS_OK;
}

int32_t attn_dist_plan_strategy(const attn_dist_plan *plan) {
  return plan == NULL ? ATTN_DIST_STRATEGY_AUTO : plan->strategy;
}

const char *attn_dist_plan_impl_name(const attn_dist_plan *plan) {
  if (plan == NULL) return "";
  return attn_plan_impl_name(plan->local_plan != NULL ? plan->local_plan : plan->block_plan);
}

attn_status attn_dist_plan_set_stream(attn_dist_plan *plan, void *stream) {
  if (plan == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  /* The last run's work on the old stream may still read the plan's device buffers (the ring's
   * scratch, the all-to-all's), which the next run on the new one would overwrite unordered. */
  if (plan->dev != NULL && stream != plan->stream &&
      (plan->dscratch != NULL || plan->a2a_mem != NULL)) {
    char why[DIST_MESSAGE] = "";
    if (plan->dev->stream_sync(plan->global.device_index, plan->stream, why, sizeof why) !=
        ATTN_STATUS_OK)
      return attn_fail(plan->ctx, ATTN_STATUS_DEVICE_ERROR,
                       "waiting for the plan's old stream: %s", why);
  }
  if (plan->ops->set_stream != NULL) {
    void *comms[6] = {plan->world,
                      plan->seq_comm,
                      plan->sinks_comm,
                      plan->bias_comm,
                      plan->hybrid ? plan->ring_comm : NULL,
                      plan->a2a_comm};
    for (int i = 0; i < 6; ++i)
      if (comms[i] != NULL) plan->ops->set_stream(comms[i], stream);
  }
  plan->stream = stream;
  attn_plan *plans[3] = {plan->local_plan, plan->block_plan, plan->sinks_plan};
  for (int i = 0; i < 3; ++i)
    if (plans[i] != NULL) attn_plan_set_stream(plans[i], stream);
  for (int a = 0; a < 2; ++a)
    for (int c = 0; c < 2; ++c) {
      if (plan->span_plans[a][c] != NULL) attn_plan_set_stream(plan->span_plans[a][c], stream);
      if (plan->full_plans[a][c] != NULL) attn_plan_set_stream(plan->full_plans[a][c], stream);
    }
  return attn_succeed(plan->ctx);
}

/* ---- runs without a sequence split: the local problem at its global batch and head offsets ---- */

static attn_positions local_positions(const attn_dist_plan *plan) {
  attn_positions pos;
  memset(&pos, 0, sizeof pos);
  pos.batch0 = plan->b0;
  pos.head0 = plan->h0;
  return pos;
}

/* Copies a caller's tensor of `shape` into doubles (to_tensor = 0) or doubles into it (1). Host
 * tensors may have any strides; device tensors (CUDA plans) must be dense and go through the core's
 * GPU services. */
static attn_status tensor_doubles(attn_dist_plan *plan, const attn_tensor *t, const int64_t *shape,
                                  int ndim, attn_dtype dt, double *buf, int to_tensor,
                                  const char *name) {
  int64_t dims[4] = {1, 1, 1, 1}, st[4] = {0, 0, 0, 0}, n = 1;
  attn_dist_strides(t, shape, ndim, st);
  for (int d = 0; d < ndim; ++d) dims[4 - ndim + d] = shape[d], n *= shape[d];
  int64_t stride[4] = {0, 0, 0, 0};
  for (int d = 0; d < ndim; ++d) stride[4 - ndim + d] = st[d];
  const size_t es = attn_dtype_size(dt);
  void *host = t->data, *staging = NULL;
  const attn_gpu_ops *gpu = NULL;
  /* The caller's stream of its own does not order the runtime's copies: it is waited for before
   * the download (it wrote the tensor), and the legacy stream after the upload (a pageable upload
   * returns before its copy has landed), so the sum is in place before the run returns. */
  const attn_dist_device_ops *dev = attn_module_dist_ops();
  char why[DIST_MESSAGE] = "";
  if (plan->local.device != ATTN_DEVICE_CPU) {
    int64_t want = 1;
    for (int d = 3; d >= 0; --d) {
      if (dims[d] > 1 && stride[d] != want)
        return attn_fail(plan->ctx, ATTN_STATUS_UNSUPPORTED,
                         "grads.%s on the GPU must be dense to be summed over the ranks", name);
      want *= dims[d];
    }
    gpu = attn_gpu();
    if (gpu == NULL)
      return attn_fail(plan->ctx, ATTN_STATUS_DEVICE_ERROR, "this build has no CUDA runtime");
    staging = malloc((size_t)n * es + 1);
    if (staging == NULL) return attn_fail(plan->ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory");
    if (!to_tensor && dev != NULL &&
        dev->stream_sync(plan->local.device_index, plan->stream, why, sizeof why) !=
            ATTN_STATUS_OK) {
      free(staging);
      return attn_fail(plan->ctx, ATTN_STATUS_DEVICE_ERROR, "grads.%s: %s", name, why);
    }
    if (!to_tensor && gpu->download(plan->local.device_index, staging, t->data, (size_t)n * es, why,
                                    sizeof why) != ATTN_STATUS_OK) {
      free(staging);
      return attn_fail(plan->ctx, ATTN_STATUS_DEVICE_ERROR, "grads.%s: %s", name, why);
    }
    host = staging;
    for (int d = 3, w = 1; d >= 0; --d) stride[d] = w, w *= (int)dims[d];
  }
  int64_t e = 0;
  for (int64_t a = 0; a < dims[0]; ++a)
    for (int64_t b = 0; b < dims[1]; ++b)
      for (int64_t c = 0; c < dims[2]; ++c)
        for (int64_t d = 0; d < dims[3]; ++d, ++e) {
          const int64_t off = a * stride[0] + b * stride[1] + c * stride[2] + d * stride[3];
          if (to_tensor)
            attn_store(host, dt, off, buf[e]);
          else
            buf[e] = attn_load(host, dt, off);
        }
  attn_status status = ATTN_STATUS_OK;
  if (staging != NULL && to_tensor &&
      (gpu->upload(plan->local.device_index, t->data, staging, (size_t)n * es, why, sizeof why) !=
           ATTN_STATUS_OK ||
       (dev != NULL &&
        dev->stream_sync(plan->local.device_index, NULL, why, sizeof why) != ATTN_STATUS_OK)))
    status = attn_fail(plan->ctx, ATTN_STATUS_DEVICE_ERROR, "grads.%s: %s", name, why);
  free(staging);
  return status;
}

/* Sums a tensor over the ranks of comm, in place, through doubles. */
static attn_status reduce_tensor(attn_dist_plan *plan, void *comm, const attn_tensor *t,
                                 const int64_t *shape, int ndim, attn_dtype dt, const char *name) {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  double *buf = malloc((size_t)n * sizeof(double) + 1);
  if (buf == NULL)
    return attn_fail(plan->ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory for %s", name);
  attn_status status = tensor_doubles(plan, t, shape, ndim, dt, buf, 0, name);
  char why[DIST_MESSAGE] = "";
  if (status == ATTN_STATUS_OK) {
    status = (attn_status)plan->ops->allreduce_sum(comm, buf, (size_t)n, ATTN_TRANSPORT_F64,
                                                   plan->spec.timeout_seconds, why, sizeof why);
    if (status != ATTN_STATUS_OK) {
      plan->broken = 1;
      status = attn_fail(plan->ctx, status, "summing %s over the ranks: %s", name, why);
    }
  }
  if (status == ATTN_STATUS_OK) status = tensor_doubles(plan, t, shape, ndim, dt, buf, 1, name);
  free(buf);
  return status;
}

/* Sums dsinks (f32, or f64 for an f64 problem) over the ranks that share the sink slice. */
static attn_status reduce_dsinks(attn_dist_plan *plan, const attn_tensor *dsinks) {
  if (plan->sinks_comm == NULL || dsinks->data == NULL) return ATTN_STATUS_OK;
  const attn_problem *l = &plan->local;
  const int64_t shape[2] = {l->sinks_shared ? l->num_sinks : l->heads_q, l->num_sinks};
  return reduce_tensor(plan, plan->sinks_comm, dsinks, shape, l->sinks_shared ? 1 : 2,
                       attn_stat_dtype((attn_dtype)l->dtype), "dsinks");
}

attn_status attn_dist_reduce_dbias(attn_dist_plan *plan, double *dbias) {
  if (plan->bias_comm == NULL) return ATTN_STATUS_OK;
  const int64_t *s = plan->local.bias_shape;
  char why[DIST_MESSAGE] = "";
  attn_status status = (attn_status)plan->ops->allreduce_sum(
      plan->bias_comm, dbias, (size_t)(s[0] * s[1] * s[2] * s[3]), ATTN_TRANSPORT_F64,
      plan->spec.timeout_seconds, why, sizeof why);
  if (status != ATTN_STATUS_OK) {
    plan->broken = 1;
    return attn_fail(plan->ctx, status, "summing dbias over the ranks: %s", why);
  }
  return ATTN_STATUS_OK;
}

/* The caller's dbias summed over the ranks of plan->bias_comm, in place. */
static attn_status reduce_dbias_tensor(attn_dist_plan *plan, const attn_tensor *dbias) {
  if (plan->bias_comm == NULL || dbias->data == NULL) return ATTN_STATUS_OK;
  return reduce_tensor(plan, plan->bias_comm, dbias, plan->local.bias_shape, 4,
                       (attn_dtype)plan->local.bias_dtype, "dbias");
}

attn_status attn_dist_reduce_dbias_tensor(attn_dist_plan *plan, const attn_tensor *dbias) {
  return reduce_dbias_tensor(plan, dbias);
}

/* Packed varlen with the batch split: the rank's sequences hold cu_seqlens_q[B] and cu_seqlens_k[B]
 * rows, which differ from rank to rank and may differ from run to run; the local plan is made
 * again whenever they change (plan creation needs no peer here: the sequence is not split). */
static attn_status replan_packed(attn_dist_plan *plan, const attn_inputs *in) {
  attn_problem *l = &plan->local;
  if (l->varlen != ATTN_VARLEN_PACKED || plan->nb == 1) return ATTN_STATUS_OK;
  if (in->cu_seqlens_q == NULL || in->cu_seqlens_k == NULL)
    return attn_fail(plan->ctx, ATTN_STATUS_INVALID_ARGUMENT,
                     "inputs.%s is NULL: packed varlen needs this rank's cu_seqlens",
                     in->cu_seqlens_q == NULL ? "cu_seqlens_q" : "cu_seqlens_k");
  int32_t ends[2] = {0, 0}; /* cu_seqlens_q[B] and cu_seqlens_k[B] */
  if (l->device == ATTN_DEVICE_CPU) {
    ends[0] = in->cu_seqlens_q[l->batch], ends[1] = in->cu_seqlens_k[l->batch];
  } else { /* device memory, written on the caller's stream: waited for, then read */
    const attn_gpu_ops *gpu = attn_gpu();
    char why[DIST_MESSAGE] = "";
    attn_status status =
        gpu == NULL ? ATTN_STATUS_DEVICE_ERROR : gpu->synchronize(l->device_index, why, sizeof why);
    for (int t = 0; t < 2 && status == ATTN_STATUS_OK; ++t)
      status = gpu->download(l->device_index, &ends[t],
                             (t == 0 ? in->cu_seqlens_q : in->cu_seqlens_k) + l->batch,
                             sizeof ends[t], why, sizeof why);
    if (status != ATTN_STATUS_OK)
      return attn_fail(plan->ctx, ATTN_STATUS_DEVICE_ERROR, "reading cu_seqlens: %s", why);
  }
  const int64_t tq = ends[0], tk = ends[1];
  if (tq == l->total_q && tk == l->total_k) return ATTN_STATUS_OK;
  attn_problem next = *l;
  next.total_q = tq, next.total_k = tk;
  attn_plan *made = NULL;
  attn_status status = plan_sub(plan, &next, plan->has_select ? &plan->select : NULL, &made);
  if (status != ATTN_STATUS_OK) return status;
  attn_plan_destroy(plan->local_plan);
  plan->local_plan = made;
  *l = next;
  return ATTN_STATUS_OK;
}

/* The problem a split-sequence run's tensors are checked against: the local one, but padded
 * varlen's seqlens are the whole sequences' (global positions), which the block's own plan checks
 * against the whole sequence. */
static attn_problem tensor_problem(const attn_dist_plan *plan) {
  attn_problem p = plan->local;
  if (p.varlen == ATTN_VARLEN_PADDED) p.varlen = ATTN_VARLEN_NONE;
  return p;
}

static attn_status check_run(attn_dist_plan *plan) {
  if (plan->broken)
    return attn_fail(plan->ctx, ATTN_STATUS_IO_ERROR,
                     "an earlier transfer of this plan failed; its peers' state is unknown: "
                     "destroy the plan");
  return ATTN_STATUS_OK;
}

attn_status attn_dist_plan_forward(attn_dist_plan *plan, const attn_inputs *inputs,
                                   const attn_outputs *outputs) {
  if (plan == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  attn_status status = check_run(plan);
  if (status != ATTN_STATUS_OK) return status;
  if (inputs == NULL || outputs == NULL)
    return attn_fail(plan->ctx, ATTN_STATUS_INVALID_ARGUMENT, "%s is NULL",
                     inputs == NULL ? "inputs" : "outputs");
  memset(&plan->stats, 0, sizeof plan->stats);
  const double start = attn_dist_now();
  if (plan->ns > 1) {
    /* The split-sequence paths read and write the caller's shards themselves (threaded): their
     * tensors get the single-device checks first (e.g. outputs whose strides overlap). */
    attn_inputs in_r;
    attn_outputs out_r;
    const attn_problem tp = tensor_problem(plan);
    status = attn_validate_forward(plan->ctx, &tp, inputs, outputs, &in_r, &out_r);
    if (status != ATTN_STATUS_OK) return status;
    status = plan->strategy == ATTN_DIST_STRATEGY_ALL_TO_ALL || plan->hybrid
                 ? attn_dist_ulysses_forward(plan, inputs, outputs)
                 : attn_dist_ring_forward(plan, inputs, outputs);
  } else {
    status = replan_packed(plan, inputs);
    if (status != ATTN_STATUS_OK) return status;
    attn_positions pos = local_positions(plan);
    if (needs_positions(plan)) attn_plan_set_positions(plan->local_plan, &pos);
    void *ws = NULL;
    size_t ws_size = 0;
    status = attn_dist_local_workspace(plan, 0, &ws, &ws_size);
    if (status == ATTN_STATUS_OK)
      status = attn_plan_forward(plan->local_plan, inputs, ws, ws_size, outputs);
    plan->stats.compute_seconds = attn_dist_now() - start;
  }
  plan->stats.total_seconds = attn_dist_now() - start;
  return status;
}

attn_status attn_dist_plan_backward(attn_dist_plan *plan, const attn_inputs *inputs,
                                    const attn_outputs *forward, const attn_tensor *dout,
                                    const attn_grads *grads) {
  if (plan == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  attn_status status = check_run(plan);
  if (status != ATTN_STATUS_OK) return status;
  if (inputs == NULL || forward == NULL || dout == NULL || grads == NULL)
    return attn_fail(plan->ctx, ATTN_STATUS_INVALID_ARGUMENT, "%s is NULL",
                     inputs == NULL    ? "inputs"
                     : forward == NULL ? "forward"
                     : dout == NULL    ? "dout"
                                       : "grads");
  memset(&plan->stats, 0, sizeof plan->stats);
  const double start = attn_dist_now();
  if (plan->ns > 1) {
    attn_inputs in_r;
    attn_outputs fwd_r;
    attn_tensor dout_r;
    attn_grads grads_r;
    const attn_problem tp = tensor_problem(plan);
    status = attn_validate_backward(plan->ctx, &tp, inputs, forward, dout, grads, &in_r, &fwd_r,
                                    &dout_r, &grads_r);
    if (status != ATTN_STATUS_OK) return status;
    status = plan->strategy == ATTN_DIST_STRATEGY_ALL_TO_ALL || plan->hybrid
                 ? attn_dist_ulysses_backward(plan, inputs, forward, dout, grads)
                 : attn_dist_ring_backward(plan, inputs, forward, dout, grads);
    plan->stats.total_seconds = attn_dist_now() - start;
    return status;
  }
  status = replan_packed(plan, inputs);
  if (status != ATTN_STATUS_OK) return status;
  attn_positions pos = local_positions(plan);
  if (needs_positions(plan)) attn_plan_set_positions(plan->local_plan, &pos);
  void *ws = NULL;
  size_t ws_size = 0;
  status = attn_dist_local_workspace(plan, 1, &ws, &ws_size);
  if (status == ATTN_STATUS_OK)
    status = attn_plan_backward(plan->local_plan, inputs, forward, dout, ws, ws_size, grads);
  plan->stats.compute_seconds = attn_dist_now() - start;
  if (status != ATTN_STATUS_OK) return status;
  const double reduce_start = attn_dist_now();
  status = reduce_dsinks(plan, &grads->dsinks);
  if (status == ATTN_STATUS_OK) status = reduce_dbias_tensor(plan, &grads->dbias);
  plan->stats.wait_seconds = attn_dist_now() - reduce_start;
  plan->stats.total_seconds = attn_dist_now() - start;
  return status == ATTN_STATUS_OK ? attn_succeed(plan->ctx) : status;
}

attn_status attn_dist_reduce_dsinks(attn_dist_plan *plan, const attn_tensor *dsinks) {
  return reduce_dsinks(plan, dsinks);
}
