/*
 * src/dist/dist.h - the distributed layer's plan and what its files share.
 *
 * dist_plan.c makes the plan (spec checks, the collective agreement check, the local problem, the
 * sub-communicators) and runs problems without a split sequence; ring.c runs sequence-split ones.
 * Every block is computed by the single-device library (attn_plan_forward/backward) on a plan
 * placed at the block's global positions (attn_plan_set_positions).
 */
#ifndef ATTN_DIST_DIST_H
#define ATTN_DIST_DIST_H

#include "attn_dist.h"
#include "dist/device.h"
#include "dist/transport.h"

#include <stddef.h>
#include <stdint.h>

struct attn_dist_plan {
  attn_ctx *ctx;
  attn_problem global; /* validated and resolved (scale, head_dim_v, causal as window_right 0) */
  attn_problem local;  /* this rank's shards */
  attn_dist_spec spec; /* with axis sizes resolved */
  int32_t coords[ATTN_DIST_MAX_AXES];
  int32_t nb, nh, ns; /* ranks along the batch, heads and sequence splits (1 = not split) */
  int32_t seq_rank;   /* this rank's coordinate along the sequence axis */
  int64_t b0, h0;     /* global index of the local batch entry 0 and query head 0 */
  int32_t strategy, layout, chunks; /* chunks: sequence chunks per rank (2 for zigzag) */

  /* The ring's view of the problem. A plain ring: the local problem over the sequence ranks. The
   * hybrid (two sequence axes): the all-to-all over the inner axis first makes each rank hold its
   * ring group's whole slice for 1/n_inner of the heads, and the ring runs over the outer axis. */
  attn_problem ring_local;
  int32_t ring_n, ring_r;     /* ranks of the ring and this rank's place in it */
  int64_t ring_head0;         /* global index of the ring problem's query head 0 */
  int hybrid;                 /* two sequence axes: outer ring, inner all-to-all */
  int32_t a2a_n, a2a_r;       /* the all-to-all's ranks and this rank's place (hybrid) */
  void *ring_comm, *a2a_comm; /* the rings's and (hybrid) the all-to-all's ranks */

  const attn_transport_ops *ops;
  void *world;      /* the transport's communicator over every rank */
  void *seq_comm;   /* the ranks of this rank's sequence ring (NULL when ns == 1) */
  void *sinks_comm; /* the ranks whose dsinks are summed together (NULL when no reduction) */
  void *bias_comm;  /* the ranks whose dbias is summed together (NULL when none need to be) */

  attn_plan *local_plan; /* ns == 1: the whole local problem */
  attn_plan *block_plan; /* ns > 1: ring: one chunk of queries against one chunk of keys;
                            all-to-all: the whole sequence for 1/ns of the local heads */
  attn_plan *sinks_plan; /* ns > 1 with sinks: the local queries against no keys, only sinks */
  /* Ring of two chunks per rank (zigzag): blocks of [na - 1][nc - 1] chunks, the query and key
   * chunks of one step in one call (ring.c, step_blocks); [0][0] is unused (block_plan). Only the
   * shapes this rank's steps use are made. */
  attn_plan *span_plans[2][2];
  /* Device ring under a mask (causal or window): the same shapes unmasked, for the blocks every
   * row of which sees every key ([0][0] included); the others run the masked plans above. */
  attn_plan *full_plans[2][2];
  /* ATTN_DIST_RING_BLOCKS=pairs at plan creation: one call per visible pair of chunks, as before
   * a step's hull ran as one (for comparisons; ring.c, step_blocks). */
  int ring_pairs;
  attn_problem block; /* the block plan's problem */
  attn_problem sinks_problem;

  /* Scratch of sequence-split runs, allocated on first use (ring.c). */
  void *scratch;
  size_t scratch_size;
  /* The all-to-all's buffers of a run (ulysses.c), in the tensors' memory (host or GPU), kept for
   * the next run; apart from the ring's scratch, which the hybrid's ring uses inside a run. */
  void *a2a_mem;
  size_t a2a_mem_size;

  /* CUDA tensors with a split sequence (ring.c, "device ring"): the cuda module's ring
   * operations, the caller's stream (blocks, merges), the ring's own transfer stream and the event
   * that orders a transfer after the blocks that last read its buffer; device scratch and the
   * blocks' workspace. Blocks run unplaced where their own mask is the global one, else one pair
   * of chunks at a time placed at its global positions (ring.c, step_blocks). */
  int device_ring;
  int ring_refused; /* AUTO took the all-to-all because the device ring cannot run the problem */
  const attn_dist_device_ops *dev;
  void *stream, *comm_stream, *compute_done;
  void *dscratch;
  size_t dscratch_size;

  attn_dist_stats stats; /* of the last run */

  /* The caller's selection, kept to re-plan the local problem of a packed varlen batch split,
   * whose total_q and total_k are those of each run's cu_seqlens. */
  int has_select;
  attn_select select;
  char select_impl[128], select_config[128];

  int broken; /* a transfer failed: the peers' state is unknown, further runs are refused */
};

/* Seconds on a monotonic clock. */
double attn_dist_now(void);

/* The host-memory loops around the blocks (packing K/V, merging partial outputs, summing
 * gradients, the all-to-all's reordering) move as many bytes as a block reads; on one thread they
 * took as long as the blocks on a 16-core host, so they run on the threads the blocks use: the
 * context's count (0 = OpenMP's), one inside a caller's parallel region. A loop marked
 * DIST_PARALLEL_FOR needs `dist_threads` in scope. */
int attn_dist_host_threads(const attn_dist_plan *plan);
#ifdef _OPENMP
#define DIST_PARALLEL_FOR _Pragma("omp parallel for num_threads(dist_threads) schedule(static)")
#else
#define DIST_PARALLEL_FOR (void)dist_threads; /* one thread; the count is still computed */
#endif

/* The transport's table, loaded once from its module (transports.c). */
attn_status attn_dist_load_transport(int32_t transport, const attn_transport_ops **ops, char *why,
                                     size_t why_size);

/* Global start of sequence chunk `chunk` (0 .. plan->chunks - 1) of sequence rank r, for a global
 * length T (Tq or Tk). */
int64_t attn_dist_chunk_start(const attn_dist_plan *plan, int64_t T, int32_t r, int32_t chunk);

/* Dense strides of a tensor of `ndim` dims of `shape` where t's are all zero; t's otherwise. */
void attn_dist_strides(const attn_tensor *t, const int64_t *shape, int ndim, int64_t stride[4]);

/* Which block shapes ([query chunks - 1][key chunks - 1]) this rank's host ring steps run
 * (ring.c). */
void attn_dist_ring_block_shapes(attn_dist_plan *plan, int used[2][2]);
/* The shapes of the device ring's calls on this rank: used[na - 1][nc - 1] bit 1 unplaced with
 * the problem's mask, bit 2 unplaced and unmasked, bit 4 placed at global positions (one pair of
 * chunks, [0][0] only: the block plan). */
#define ATTN_DIST_CALL_MASKED 1
#define ATTN_DIST_CALL_FULL 2
#define ATTN_DIST_CALL_PLACED 4
void attn_dist_ring_device_blocks(attn_dist_plan *plan, int used[2][2]);
/* The calls of step s on ring rank r (device: as the device ring runs them; otherwise placed at
 * global positions as the host does), for tests: query chunks [a0, a0 + na) of rank r against key
 * chunks [c0, c0 + nc) of rank src, unmasked when full. A device call is unplaced (a plan of its
 * shape at its own offset, which block_runs_unplaced found to give the global mask) or, placed,
 * one pair of chunks at its global positions (the cuda kernels take one piece per axis). Returns
 * how many (0 after the ring's last step). */
typedef struct attn_dist_block {
  int32_t src, a0, na, c0, nc;
  int full;
  int placed; /* device: at global positions (host blocks always are) */
} attn_dist_block;
int attn_dist_ring_step_blocks(attn_dist_plan *plan, int device, int32_t r, int32_t s,
                               attn_dist_block out[4]);
/* The plan a device block of this rank runs on (its positions are the caller's to set), for
 * benchmarks. */
attn_plan *attn_dist_ring_block_plan(const attn_dist_plan *plan, const attn_dist_block *b);

/* Sequence-split runs (ring.c). */
attn_status attn_dist_ring_forward(attn_dist_plan *plan, const attn_inputs *in,
                                   const attn_outputs *out);
attn_status attn_dist_ring_backward(attn_dist_plan *plan, const attn_inputs *in,
                                    const attn_outputs *fwd, const attn_tensor *dout,
                                    const attn_grads *grads);

/* The device workspace of the local plan (batch and head splits of CUDA tensors), kept in the
 * plan's device scratch; NULL and 0 for CPU tensors, whose plan allocates its own. */
attn_status attn_dist_local_workspace(attn_dist_plan *plan, int backward, void **workspace,
                                      size_t *size);
/* Releases the device ring's stream, event and scratch (ring.c); nothing when there are none. */
void attn_dist_device_release(attn_dist_plan *plan);

/* Sequence-split runs, all-to-all strategy (ulysses.c), host or CUDA tensors; the release of
 * their buffers (plan destruction). */
attn_status attn_dist_ulysses_forward(attn_dist_plan *plan, const attn_inputs *in,
                                      const attn_outputs *out);
attn_status attn_dist_ulysses_backward(attn_dist_plan *plan, const attn_inputs *in,
                                       const attn_outputs *fwd, const attn_tensor *dout,
                                       const attn_grads *grads);
void attn_dist_ulysses_release(attn_dist_plan *plan);

/* Whether the sub-plans are placed at global positions (dist_plan.c, needs_positions). */
int attn_dist_needs_positions(const attn_dist_plan *plan);

/* Sets plan->strategy, and plan->device_ring where it is the ring over CUDA tensors (dist_plan.c;
 * the sub-plans are then made again). */
void attn_dist_set_strategy(attn_dist_plan *plan, int32_t strategy);

/* The sub-plans of plan->strategy (dist_plan.c), and their release. */
attn_status attn_dist_make_sub_plans(attn_dist_plan *plan, const attn_select *select);
void attn_dist_free_sub_plans(attn_dist_plan *plan);
/* Strategy AUTO: sets plan->strategy (and its sub-plans) from the cache or by measuring
 * (choose.c). Collective. */
attn_status attn_dist_choose_strategy(attn_dist_plan *plan, const attn_select *select);

/* Sums dsinks over the ranks that share the sink slice (dist_plan.c). */
attn_status attn_dist_reduce_dsinks(attn_dist_plan *plan, const attn_tensor *dsinks);
/* Sums a dense double copy of the local dbias over the ranks whose bias is broadcast along the
 * dimension they split (nothing when there are none). */
attn_status attn_dist_reduce_dbias(attn_dist_plan *plan, double *dbias);
/* The same for the caller's dbias tensor, in place (staged through host memory on a GPU). */
attn_status attn_dist_reduce_dbias_tensor(attn_dist_plan *plan, const attn_tensor *dbias);

#endif /* ATTN_DIST_DIST_H */
