/*
 * src/impl/impl.h - the contract every implementation fulfils.
 *
 * An implementation is a constant attn_impl listed once in src/plan/registry.c. The plan layer
 * validates the problem and the run's arguments before calling it, resolves default strides and
 * defaults of the problem (scale, head_dim_v, causal folded into window_right = 0), and passes the
 * workspace; so an implementation only decides whether it can run a problem and then runs it.
 *
 * Statuses: supports() returns OK or UNSUPPORTED with the reason in `why`; forward() and backward()
 * return OK, or a failure with the message in run->why. They never print, exit or allocate when
 * the workspace they asked for is given.
 */
#ifndef ATTN_IMPL_IMPL_H
#define ATTN_IMPL_IMPL_H

#include "attn.h"
#include "core/dtype.h"

#include <stddef.h>

/* Where a run's problem sits inside a larger one: the distributed layer (src/dist) runs each block
 * of a sharded problem as a problem of its own, and the block's rows, keys, heads and batch entries
 * keep their global meaning through this. Only implementations that declare honours_positions are
 * given one (ATTN_POSITIONS_ONE_PIECE: only the forms it names); attn_run.positions is NULL
 * otherwise (indices are the problem's own).
 *
 * Rows and keys are each a list of pieces: local indices [start[k], start[k + 1]) (the last piece
 * runs to the end) sit at global positions global[k], global[k] + 1, ... So one block can hold
 * chunks of the sequence that are not adjacent globally (a zigzag ring step: two query chunks
 * against two key chunks, in one call). Zeroed, an axis is one piece at global position 0. */
#define ATTN_POSITION_PIECES 2
typedef struct attn_position_axis {
  int32_t pieces;                      /* 0 or 1: one piece; at most ATTN_POSITION_PIECES */
  int64_t start[ATTN_POSITION_PIECES]; /* local index of each piece's first element; start[0] = 0 */
  int64_t global[ATTN_POSITION_PIECES]; /* global position of that element */
} attn_position_axis;

/* What an implementation honours of attn_positions (attn_impl.honours_positions). */
enum {
  ATTN_POSITIONS_NONE = 0, /* nothing: its plans refuse positions */
  ATTN_POSITIONS_ANY = 1,  /* every form below: pieces, partial results */
  /* one piece per axis on a dense problem (a varlen one at batch and head offsets only), results
   * in the problem's own dtype (not partial): the GPU kernels, whose blocks of a ring are single
   * pairs of chunks (src/dist/ring.c) */
  ATTN_POSITIONS_ONE_PIECE = 2,
};

typedef struct attn_positions {
  int64_t batch0; /* global index of batch entry 0: the b of the Philox counter */
  int64_t head0;  /* global index of query head 0: the h of the Philox counter */
  /* Global positions of the query rows and of the keys: the i and j of the Philox counter (any
   * value, not only multiples of 4: fast paths that share one Philox call per 4 keys must check) */
  attn_position_axis rows, cols;
  /* 1: causal masks, windows and ALiBi compare global positions, with `offset` the alignment
   * offset o of the larger problem (SPEC.md): local row i sees local key j when rows(i) + o - left
   * <= cols(j) <= rows(i) + o + right. Dense problems only (the distributed layer refuses varlen
   * under sequence sharding). 0: they use the problem's own indices and offset (one piece each). */
  int32_t has_offset;
  int64_t offset;
  /* 1: the run's results are partial sums that the caller adds up with others (the ring's
   * blocks): a low-precision problem writes out, dq, dk and dv in f32, never rounded to its dtype
   * (SPEC.md: partial sums are never rounded to bf16); the backward still reads the forward's out
   * in the problem's dtype (it is the caller's whole result). Dense problems only. */
  int32_t partial;
} attn_positions;

/* The dtype a run writes out, dq, dk and dv in: f32 for the partial results of a low-precision
 * problem (attn_positions.partial), else the problem's out dtype (attn_out_dtype: the problem's
 * dtype, or an f8e4m3 problem's bf16, f16 or f32; it has no dq, dk, dv). */
static inline attn_dtype attn_result_dtype(const attn_problem *p, const attn_positions *pos) {
  const attn_dtype dt = attn_out_dtype(p);
  return pos != NULL && pos->partial && dt != ATTN_DTYPE_F64 ? ATTN_DTYPE_F32 : dt;
}

/* The piece of a positions axis that holds local index x, and x's global position. */
static inline int32_t attn_position_piece(const attn_position_axis *a, int64_t x) {
  int32_t k = 0;
  while (k + 1 < a->pieces && x >= a->start[k + 1]) ++k;
  return k;
}
static inline int64_t attn_position_of(const attn_position_axis *a, int64_t x) {
  const int32_t k = attn_position_piece(a, x);
  return a->global[k] + (x - a->start[k]);
}
/* Pieces of an axis (at least one), and where piece k ends locally on an axis of n elements. */
static inline int32_t attn_position_pieces(const attn_position_axis *a) {
  return a->pieces > 1 ? a->pieces : 1;
}
static inline int64_t attn_position_piece_end(const attn_position_axis *a, int32_t k, int64_t n) {
  return k + 1 < attn_position_pieces(a) ? a->start[k + 1] : n;
}
/* The alignment offset that rows of piece a and keys of piece c see in local indices: within one
 * pair of pieces both maps are shifts, so row i sees key j as a problem of its own would with this
 * offset (has_offset only). */
static inline int64_t attn_position_offset(const attn_positions *p, int32_t a, int32_t c) {
  return (p->rows.global[a] - p->rows.start[a]) - (p->cols.global[c] - p->cols.start[c]) +
         p->offset;
}

/* Everything one forward or backward run needs. Tensors have explicit strides (never all-zero),
 * and pointers the problem does not use are NULL. */
typedef struct attn_run {
  const attn_problem *problem; /* validated and resolved */
  int32_t config;              /* index into the implementation's configurations */
  const attn_inputs *inputs;
  const attn_outputs *outputs; /* forward: written; backward: out and lse are read */
  const attn_tensor *dout;     /* backward only */
  const attn_grads *grads;     /* backward only: written */
  void *workspace;             /* at least workspace_size() bytes, aligned to 64 bytes */
  size_t workspace_size;
  void *stream;                /* GPU implementations: a cudaStream_t, NULL = default */
  void *state;                 /* what plan_init() made, or NULL */
  int32_t num_threads;         /* the context's setting: 0 = the implementation's choice */
  /* For tests only: round scores and probabilities to this dtype, the naive same-dtype computation
   * of SPEC.md's tolerance rule. ATTN_DTYPE_F64 (the default) = no rounding. Only the reference
   * honours it. */
  attn_dtype round_to;
  const attn_positions *positions; /* NULL, or where the problem sits (honours_positions only) */
  /* NULL, or a function to call now and then from the calling thread while the run computes (a
   * multi-threaded implementation: its thread 0 between work items), so that the distributed
   * layer's transfers in flight move on: most MPI builds move a large transfer only inside MPI
   * calls, and a ring step is one call now. Implementations may ignore it. */
  void (*progress)(void *arg);
  void *progress_arg;
  char *why; /* message buffer for failures */
  size_t why_size;
} attn_run;

typedef struct attn_impl {
  const char *name;  /* unique, lower case: "ref", "cpu", "cuda", "cudnn" */
  int32_t device;    /* attn_device it runs on */
  int32_t version;   /* bumped whenever its numerics or configurations change */

  /* OK if it can run the (validated, resolved) problem, else UNSUPPORTED and the reason. */
  attn_status (*supports)(const attn_problem *problem, char *why, size_t why_size);
  /* Its configurations for the problem: how many (>= 1), each one's name, the heuristic pick. */
  int32_t (*num_configs)(const attn_problem *problem);
  void (*config_name)(const attn_problem *problem, int32_t config, char *buf, size_t size);
  int32_t (*default_config)(const attn_problem *problem);
  /* Workspace bytes for a pass under a configuration (backward != 0 for the backward pass).
   * state is what plan_init made (NULL without plan_init): some engines, such as cuDNN's, only
   * know their workspace once the plan's graphs are built. */
  size_t (*workspace_size)(const attn_problem *problem, int32_t config, const void *state,
                           int backward);
  /* Optional (NULL when unused): per-plan state built once, e.g. compiled graphs. */
  attn_status (*plan_init)(const attn_problem *problem, int32_t config, void **state, char *why,
                           size_t why_size);
  void (*plan_fini)(void *state);

  attn_status (*forward)(const attn_run *run);
  attn_status (*backward)(const attn_run *run);

  /* Optional (NULL = every configuration is deterministic): whether a configuration gives the same
   * bits on every run of the same inputs (one accumulating with atomics does not). A policy with
   * deterministic = 1 keeps the executor to those, unless the caller names the configuration. */
  int (*config_deterministic)(const attn_problem *problem, int32_t config);

  /* What forward() and backward() honour of attn_run.positions (global Philox counters and
   * alignment offset): ATTN_POSITIONS_*; attn_plan_set_positions refuses what is not honoured. */
  int32_t honours_positions;
} attn_impl;

#endif /* ATTN_IMPL_IMPL_H */
