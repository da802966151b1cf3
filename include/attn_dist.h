/*
 * attn_dist.h - one attention problem sharded over processes or GPUs (libattn's distributed layer).
 *
 * A program that runs on several ranks (MPI processes, or GPUs driven through NCCL) describes the
 * GLOBAL problem with attn_problem exactly as for one device, describes how the ranks form a mesh
 * and which of batch, heads and sequence each mesh axis splits (attn_dist_spec: the PartitionSpec
 * of JAX's shard_map), makes a plan on every rank, and runs forward and backward with each rank's
 * LOCAL shard of every tensor. Every rank's outputs are the same slice of the global problem's
 * outputs on one device (SPEC.md, "Sharded problem"): causal masks, windows, ALiBi and the dropout
 * counters use global positions, so dropout bits equal one device's.
 *
 *   attn_dist_spec_init        fills an attn_dist_spec with defaults (one axis: sequence, all ranks)
 *   attn_dist_plan_create      collective: checks that every rank agrees, splits the problem, plans
 *                              the local blocks; borrows the caller's communicator
 *   attn_dist_plan_local_problem   the shapes of this rank's shards
 *   attn_dist_plan_forward / attn_dist_plan_backward   collective over the plan's ranks
 *   attn_dist_plan_destroy
 *   attn_dist_layout_position / attn_dist_permute_sequence   the sequence layouts' helpers
 *
 * Transports. The caller creates and owns the communicator and passes a pointer to it: an
 * MPI_Comm (ATTN_DIST_TRANSPORT_MPI, CPU tensors) or an ncclComm_t (ATTN_DIST_TRANSPORT_NCCL,
 * CUDA tensors). This header includes neither mpi.h nor nccl.h. libattn itself does not link MPI
 * or NCCL: each transport is a run-time module (libattn_mpi.so, libattn_nccl.so) that the plan
 * loads from $ATTN_MODULE_PATH (folders separated by ':'), then the folder of libattn, then the
 * dynamic loader's search; the module links the MPI or NCCL library the caller's program already
 * uses. An MPI plan duplicates the communicator (MPI_Comm_dup, collective) so its messages never
 * meet the caller's, and sets MPI_ERRORS_RETURN on the duplicate; the caller's communicator must
 * outlive the plan. MPI must be initialised (MPI_Init or MPI_Init_thread) before the plan is made.
 *
 * Shards. A mesh axis of size n that splits
 *   - BATCH: rank with coordinate c holds batch entries [c B/n, (c+1) B/n) of every tensor with a
 *     batch dimension of size B (bias, mask with batch dim 1 are replicated), alibi slopes [B, Hq]
 *     included; padded varlen: its entries' seqlens; packed varlen: the sequences of its batch
 *     slice, with its own cu_seqlens from 0 (the local totals may differ per rank and per run);
 *   - HEADS: whole KV groups: KV heads [c Hkv/n, (c+1) Hkv/n) and their query heads; q, out, lse,
 *     alibi slopes, per-head sinks, bias and mask of head dim Hq or Hkv are sliced, dims of 1
 *     replicated, shared sinks replicated;
 *   - SEQUENCE: q, out, lse, dout, dq and q_segment_ids are sliced along Tq, k, v, dk, dv and
 *     kv_segment_ids along Tk, in the plan's layout (attn_dist_layout; with two sequence axes,
 *     attn_dist_plan_position); bias and mask keep ALL Tk
 *     columns in global (natural) order and hold the rank's local query rows (in layout order)
 *     when their Tq dim is Tq;
 *   - NONE: the ranks along the axis hold the same shards and compute the same results (data
 *     parallel replicas).
 * Every split extent must divide: B % n, Hkv % n, Tq % (n * chunks) and Tk % (n * chunks), where
 * chunks is 2 for the zigzag layout and 1 otherwise; the plan refuses other sizes with the rule.
 *
 * Errors, as everywhere in libattn: a status and a message in the context naming the argument and
 * the rule. The plan's collectives never hang on a peer that failed or disagrees: plan creation
 * compares every rank's problem and spec (INVALID_ARGUMENT naming the field and the ranks that
 * differ), and every wait is bounded by spec.timeout_seconds (IO_ERROR naming the peer). A plan
 * whose communication failed refuses further runs with IO_ERROR.
 *
 * Devices: CPU tensors over MPI, every split. CUDA tensors over NCCL: batch and head splits
 * (without dropout for now); a split sequence of CUDA tensors is UNSUPPORTED until the GPU ring
 * exists (docs/DISTRIBUTED.md).
 *
 * Thread safety: a plan is used by one thread at a time, like the context it was made with. Calls
 * of a plan are collective: every rank of the plan's mesh makes them, in the same order.
 */
#ifndef ATTN_DIST_H
#define ATTN_DIST_H

#include "attn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which communication library carries the plan's messages. */
typedef enum attn_dist_transport {
  ATTN_DIST_TRANSPORT_MPI = 0,  /* comm points to an MPI_Comm; CPU tensors */
  ATTN_DIST_TRANSPORT_NCCL = 1, /* comm points to an ncclComm_t; CUDA tensors (one GPU per rank) */
  ATTN_DIST_TRANSPORT_COUNT
} attn_dist_transport;

/* The problem dimension a mesh axis splits. */
typedef enum attn_dist_dim {
  ATTN_DIST_DIM_NONE = 0,     /* replicated along the axis */
  ATTN_DIST_DIM_BATCH = 1,    /* batch entries (sequences of packed varlen) */
  ATTN_DIST_DIM_HEADS = 2,    /* whole KV groups */
  ATTN_DIST_DIM_SEQUENCE = 3, /* query and key positions: context parallelism */
  ATTN_DIST_DIM_COUNT
} attn_dist_dim;

/* How a sequence-split problem is computed. */
typedef enum attn_dist_strategy {
  ATTN_DIST_STRATEGY_AUTO = 0, /* the plan's choice: where both can run, the context's cache,
                                  else (policy on_miss AUTOTUNE) both timed on scratch shards by
                                  every rank, the slowest rank's time deciding, and the result
                                  cached under a key that holds the mesh; else the ring */
  ATTN_DIST_STRATEGY_RING = 1, /* K/V blocks travel around the ring of the sequence axis, their
                                  transfer overlapped with the attention of the block in hand;
                                  partial results merged through their lse */
  ATTN_DIST_STRATEGY_ALL_TO_ALL = 2, /* "Ulysses": all-to-all exchanges make the sequence-split
                                        tensors head-split (every position, 1/n of the heads),
                                        the heads are computed whole, and the results go back;
                                        the local heads_kv must be a multiple of n */
  ATTN_DIST_STRATEGY_COUNT
} attn_dist_strategy;

/* Which global positions a rank holds along a split sequence (n ranks, global length T). */
typedef enum attn_dist_layout {
  /* rank r holds positions [r T/n, (r+1) T/n). */
  ATTN_DIST_LAYOUT_CONTIGUOUS = 0,
  /* The sequence is cut into 2n chunks of T/(2n); rank r holds chunk r then chunk 2n-1-r, so
   * under a causal mask every rank has the same amount of work (the load balance of ring attention
   * implementations such as TransformerEngine's context parallelism). Tq == Tk is required. */
  ATTN_DIST_LAYOUT_ZIGZAG = 1,
  ATTN_DIST_LAYOUT_COUNT
} attn_dist_layout;

#define ATTN_DIST_MAX_AXES 4

/* The mesh and its PartitionSpec. Ranks are numbered by the communicator; rank r has coordinates
 * (c_0, ..., c_{A-1}) with r = sum_a c_a * prod_{a' > a} axis_size[a'] (the last axis varies
 * fastest). Batch and heads are split by one axis at most; the sequence by two: the outer runs
 * the ring (over groups of ranks), the inner the all-to-all (within each group), as unified
 * sequence parallelism does (all-to-all inside a node, ring across nodes); strategy must then be
 * AUTO or RING, and the local heads_kv a multiple of the inner axis's size. */
typedef struct attn_dist_spec {
  int32_t num_axes;                      /* 1 .. ATTN_DIST_MAX_AXES; default 1 */
  int32_t axis_size[ATTN_DIST_MAX_AXES]; /* ranks along each axis, >= 1, product = communicator
                                            size; 0 (the default of axis 0) = the communicator's
                                            size divided by the other axes' sizes */
  int32_t axis_dim[ATTN_DIST_MAX_AXES];  /* attn_dist_dim each axis splits; default SEQUENCE for
                                            axis 0, NONE for the others */
  int32_t strategy;       /* attn_dist_strategy for the sequence axis; default AUTO */
  int32_t layout;         /* attn_dist_layout of split sequences; default CONTIGUOUS */
  double timeout_seconds; /* bound on every wait for a peer; default 300; > 0 */
} attn_dist_spec;

/* Fills *spec with the defaults above. Never allocates. */
ATTN_API void attn_dist_spec_init(attn_dist_spec *spec);

/* Whether the transport's module can be loaded in this process (1) or not (0); *why (when not NULL
 * and size > 0) gets the reason, like snprintf. Thread safe. */
ATTN_API int32_t attn_dist_transport_available(int32_t transport, char *why, size_t size);

typedef struct attn_dist_plan attn_dist_plan;

/* Collective over the communicator: every rank calls it with the same global problem and spec.
 * comm points to the caller's communicator of the transport (borrowed; it must outlive the plan).
 * select (may be NULL) constrains the implementation of the local blocks as for attn_plan_create;
 * it must name one that honours global positions (ref and cpu do), except for CUDA tensors, whose
 * ring picks a plan per block instead (docs/DISTRIBUTED.md, "On GPUs").
 * Statuses: INVALID_ARGUMENT for a bad problem or spec, a mesh that does not match the
 * communicator's size, sizes that do not divide, or ranks that disagree (the message names the
 * field and the ranks); UNSUPPORTED for a combination the layer cannot run (with the reason, for
 * example packed varlen under sequence sharding); IO_ERROR when the transport module cannot be
 * loaded or a peer does not answer within spec.timeout_seconds. Every rank gets a failure status
 * when any rank fails, so no rank goes on to a collective its peers will not join. */
ATTN_API attn_status attn_dist_plan_create(attn_ctx *ctx, const attn_problem *problem,
                                           const attn_dist_spec *spec, int32_t transport,
                                           void *comm, const attn_select *select,
                                           attn_dist_plan **plan /* out */);
/* Frees the plan (and its duplicate communicator: collective for MPI). NULL is harmless. */
ATTN_API void attn_dist_plan_destroy(attn_dist_plan *plan);

/* The problem this rank's shards describe: sizes divided along the split dimensions (bias_shape and
 * mask_shape too, with Tk kept whole under sequence sharding), the rest as the global problem.
 * This rank's coordinates along each axis go to coords (may be NULL; ATTN_DIST_MAX_AXES entries). */
ATTN_API attn_status attn_dist_plan_local_problem(const attn_dist_plan *plan,
                                                  attn_problem *local /* out */,
                                                  int32_t *coords /* out */);

/* The global position of local position `index` of this rank along a split sequence of global
 * length seqlen (pass seqlen_q for query rows, seqlen_k for keys); -1 out of range. With one
 * sequence axis this is attn_dist_layout_position of the rank's place along it; with two (ring
 * over the outer axis, all-to-all over the inner) the layout's chunks of each ring rank are cut in
 * inner-axis-many parts and inner rank a holds part a of each. */
ATTN_API int64_t attn_dist_plan_position(const attn_dist_plan *plan, int64_t seqlen, int64_t index);

/* The plan's sequence strategy (attn_dist_strategy, never AUTO) and the name of the local blocks'
 * implementation ("cpu", "ref"). */
ATTN_API int32_t attn_dist_plan_strategy(const attn_dist_plan *plan);
ATTN_API const char *attn_dist_plan_impl_name(const attn_dist_plan *plan);

/* Where the time of this rank's last forward or backward run went. */
typedef struct attn_dist_stats {
  double total_seconds;   /* the whole call */
  double compute_seconds; /* in the single-device blocks */
  double wait_seconds;    /* blocked waiting for transfers: the communication that was not hidden */
  int64_t bytes_sent;     /* by this rank, point-to-point and collective payloads */
  int32_t steps;          /* ring steps run (all-to-all: exchanges; 0 without a sequence split) */
  int32_t blocks;         /* single-device block calls of the ring (a zigzag step: one, or one per
                             key chunk with a bias or mask over keys; CUDA tensors: one per pair
                             of chunks) */
} attn_dist_stats;

/* The stats of the plan's last run on this rank. INVALID_ARGUMENT for NULL pointers. */
ATTN_API attn_status attn_dist_plan_last_stats(const attn_dist_plan *plan,
                                               attn_dist_stats *stats /* out */);

/* The stream (a cudaStream_t) the plan's GPU blocks, merges and collectives run on; NULL = the
 * default stream. Borrowed. A run returns with its work queued there. The ring's point-to-point
 * transfers run on a stream of the plan's own, ordered against this one by events. */
ATTN_API attn_status attn_dist_plan_set_stream(attn_dist_plan *plan, void *stream);

/* Forward pass over the local shards (attn_inputs and attn_outputs as for attn_plan_forward, shapes
 * from attn_dist_plan_local_problem). Collective. probs is UNSUPPORTED under sequence sharding.
 * The plan allocates its scratch on the first call and keeps it. */
ATTN_API attn_status attn_dist_plan_forward(attn_dist_plan *plan, const attn_inputs *inputs,
                                            const attn_outputs *outputs /* out */);

/* Backward pass over the local shards: forward holds this rank's out and lse of the forward pass.
 * Collective. dsinks (summed over every rank that shares the sink slice) and dbias are written
 * when given; dbias is UNSUPPORTED where the bias is broadcast along a split dimension. */
ATTN_API attn_status attn_dist_plan_backward(attn_dist_plan *plan, const attn_inputs *inputs,
                                             const attn_outputs *forward, const attn_tensor *dout,
                                             const attn_grads *grads /* out */);

/* The global position of local position `index` (0 .. seqlen / num_ranks - 1) of `rank` along a
 * sequence of `seqlen` split over num_ranks ranks in `layout`; -1 for arguments out of range or
 * sizes that do not divide. Thread safe. */
ATTN_API int64_t attn_dist_layout_position(int32_t layout, int32_t num_ranks, int64_t seqlen,
                                           int32_t rank, int64_t index);

/* Reorders a dense tensor [outer, seqlen, inner_bytes] (inner_bytes bytes per position) between
 * natural order and the layout's order: to_layout = 1 writes position p of src at the place
 * attn_dist_layout_position gives it in the concatenation of the ranks' shards (rank 0's first),
 * to_layout = 0 undoes it. src and dst must not overlap. INVALID_ARGUMENT for a NULL pointer or
 * sizes that do not divide. */
ATTN_API attn_status attn_dist_permute_sequence(int32_t layout, int32_t num_ranks,
                                                int32_t to_layout, const void *src,
                                                void *dst /* out */, int64_t outer, int64_t seqlen,
                                                size_t inner_bytes);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ATTN_DIST_H */
