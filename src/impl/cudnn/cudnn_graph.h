/*
 * src/impl/cudnn/cudnn_graph.h - cuDNN's fused attention graphs, built through the backend API
 * (cudnn_backend.h, plain C), behind a header that names no cuDNN type outside this folder.
 *
 * cuDNN runs scaled dot-product attention as one fused kernel when it recognises the pattern of an
 * operation graph: matmul(Q, K^T) -> scale -> [bias] -> [alibi] -> [padding mask] -> [window
 * masks] -> softmax (max, sub, exp, sum, div; log for the statistics) -> matmul(P, V), and the
 * matching backward graph. The graphs here are the ones cudnn-frontend's "composite" SDPA nodes
 * build (include/cudnn_frontend/node/scaled_dot_product_flash_attention.h), written out descriptor
 * by descriptor; the heuristics then pick the fused engine. The fp8 (e4m3) forward graph is its
 * fp8 node's (node/sdpa_fp8.h before cudnn-frontend 1.14): descale factors after Q K^T, amax of P,
 * P scaled into e4m3, and descale, amax and scale of the P V product.
 *
 * Layout: every tensor is described in cuDNN's [b, h, s, d] order with the caller's strides, so the
 * library's [B, T, H, D] tensors are passed without copies.
 */
#ifndef ATTN_IMPL_CUDNN_GRAPH_H
#define ATTN_IMPL_CUDNN_GRAPH_H

#include "attn.h"

#include <cudnn_backend.h>

#include <stddef.h>
#include <stdint.h>

/* Where a failure is reported: the status, and a message naming the call, file and line. */
typedef struct cg_err {
  attn_status status;
  char *why;
  size_t why_size;
} cg_err;

/* Records a failed cuDNN call into err (the first failure wins); returns nonzero on failure. */
int attn_cudnn_check(cg_err *err, cudnnStatus_t status, const char *expr, const char *file, int line);

/* Every cuDNN call goes through this macro: it records the expression, file and line of the first
 * failing call and skips the rest once one has failed. */
#define ATTN_CUDNN_CHECK(err, expr)                                                                \
  ((err)->status != ATTN_STATUS_OK ? 1 : attn_cudnn_check((err), (expr), #expr, __FILE__, __LINE__))

/* The strides of one run's tensors in cuDNN's order [b, h, s, d] ([b, h, s, 1] for lse). The
 * graph is specialised to them, so the plan keeps one graph per layout it has seen. A paged
 * problem's k and v are the pools, [page, h, row, d] (cuDNN's "container"), and table is the
 * block table's as [b, 1, column, 1]. */
typedef struct cg_layout {
  int64_t q[4], k[4], v[4], o[4], lse[4], dout[4], dq[4], dk[4], dv[4], bias[4], dbias[4];
  int64_t table[4];
} cg_layout;

/* Everything a graph depends on. Zero-initialise, then fill. */
typedef struct cg_spec {
  int32_t backward;      /* 0: forward graph (always with statistics); 1: backward graph */
  int32_t with_dbias;    /* backward: also reduce dS into dbias */
  int32_t deterministic; /* backward: cudnn-frontend's set_deterministic_algorithm(true), below */
  int32_t dtype;         /* ATTN_DTYPE_F16, ATTN_DTYPE_BF16, or ATTN_DTYPE_F8E4M3 (forward only) */
  int32_t out_dtype;     /* of out: dtype, or an f8e4m3 problem's bf16 or f16 (attn_out_dtype) */
  int64_t b, hq, hkv, tq, tk, d, dv;
  float scale;
  int32_t has_bias;
  int64_t bias_dims[4];     /* [B or 1, Hq or 1, Tq, Tk] */
  int32_t padded;           /* padded varlen: seq_len_q / seq_len_kv tensors [B] */
  int32_t full_padding;     /* backward workaround of cuDNN <= 9.15: padding mask at full length */
  int32_t top_left;         /* alignment of causal masks and windows after simplification */
  int64_t left, right;      /* window of SPEC.md, -1 = unbounded; causal is right = 0 */
  int32_t alibi;            /* per-head slopes [Hq] added as (col - row) * slope (causal only) */
  int64_t alibi_stride;     /* stride of the slopes, in elements */
  int64_t page_size;        /* > 0: k and v are pools of pages read through a block table (a
                               paged KV cache, docs/DECODE.md; forward only, padded is set) */
  int64_t num_pages;        /* pages in each pool */
  int32_t version;          /* cudnnGetVersion() */
  int32_t sm;               /* compute capability, 10 * major + minor */
  cg_layout st;
} cg_spec;

/* Whether a backward graph adds dQ into the f32 accumulator CG_UID_DQ_ACCUM (cuDNN's default
 * schedule: every key block's CTA adds its part, so the order of the additions, and the last bits
 * of dq, vary from run to run) rather than writing dQ with its own product over a dS kept in the
 * workspace ("dP workspace"), which cuDNN requires for dbias and which cudnn-frontend's
 * set_deterministic_algorithm(true) selects (scaled_dot_product_flash_attention.h:
 * use_dp_workspace, since cudnn-frontend 1.5). */
static inline int cg_dq_accumulated(const cg_spec *s) {
  return s->backward && !s->with_dbias && !s->deterministic;
}

typedef struct cg_graph cg_graph;

/* The factor P (at most 1) is multiplied by before cuDNN rounds it to e4m3 for P V, and divided by
 * after: 2^8, docs/FP8.md's choice (FlashAttention-3's Max_offset = 8), so that the tolerance's
 * naive run and cuDNN round the same values (1 becomes 256, exact; down to 2^-14 stays normal). */
#define CG_FP8_P_SCALE 256.0f

/* Unique ids of the tensors a run binds (the rest are virtual or scalars the graph holds). */
enum {
  CG_UID_Q = 1,
  CG_UID_K,
  CG_UID_V,
  CG_UID_O,
  CG_UID_STATS,
  CG_UID_BIAS,
  CG_UID_SEQ_Q,
  CG_UID_SEQ_KV,
  CG_UID_ALIBI,
  CG_UID_DO,
  CG_UID_DQ,
  CG_UID_DK,
  CG_UID_DV,
  CG_UID_DBIAS,
  CG_UID_SOFTMAX_SUM, /* backward: f32 [B, Hq, Tq, 1] in the workspace */
  CG_UID_DQ_ACCUM,    /* backward: f32 [B, Hq, Tq, D] in the workspace */
  CG_UID_PAGE_TABLE,  /* paged: the block table, i32 [B, ceil(Tk / page_size)] of its columns */
  /* fp8 (e4m3) forward: f32 [1, 1, 1, 1] factors and amax outputs, in the workspace (cudnn.c) */
  CG_UID_DESCALE_Q,
  CG_UID_DESCALE_K,
  CG_UID_DESCALE_V,
  CG_UID_SCALE_S,   /* P's scale before it is rounded to e4m3 (CG_FP8_P_SCALE) */
  CG_UID_DESCALE_S, /* its inverse, after P V */
  CG_UID_SCALE_O,   /* 1: out is bf16 or f16 */
  CG_UID_AMAX_S,    /* max|P| and max|O| before scale_o: outputs the graph must have; unread */
  CG_UID_AMAX_O,
  CG_UID_COUNT
};

/* Builds, and finalises an execution plan for, the graph of spec on handle. NULL on failure, with
 * err filled (UNSUPPORTED when cuDNN has no engine for it). */
cg_graph *attn_cudnn_graph_build(cudnnHandle_t handle, const cg_spec *spec, cg_err *err);
void attn_cudnn_graph_free(cg_graph *graph);
const cg_spec *attn_cudnn_graph_spec(const cg_graph *graph);
/* Bytes of workspace cuDNN's execution plan needs (the caller adds its own tensors). */
size_t attn_cudnn_graph_workspace(const cg_graph *graph);
/* Runs the plan. ptrs[uid] holds the device pointer of each bound tensor (unused ones NULL). */
attn_status attn_cudnn_graph_execute(cg_graph *graph, cudnnHandle_t handle,
                                     void *const ptrs[CG_UID_COUNT], void *workspace, cg_err *err);

/* ---- graphs shared by plans: the process-wide cache (cudnn_cache.c) ---------------------------
 *
 * Building a graph takes 85-90 ms on an H200 (heuristics, sometimes run-time compilation), so built
 * graphs are kept per process, keyed by the device and every field of the spec (pass,
 * configuration, dtype, shapes, the strides the graph bakes in, features, cuDNN version, compute
 * capability): the second plan of a shape takes its graphs from the cache in microseconds. The
 * cache holds at most 64 graphs ($ATTN_CUDNN_GRAPH_CACHE overrides the bound; 0 shares nothing),
 * least recently used out first; a graph pushed out while plans hold it is freed by the last one.
 *
 * Graphs are built with a handle the cache keeps per device (a run handle goes back to the pool and
 * may be destroyed before a graph it ran), one build at a time, and run with a handle each run
 * borrows from the pool; runs of
 * one graph from several threads are serialised on the graph for the time cuDNN takes to queue
 * them (cuDNN's engineers report known thread-safety limits when one backend execution plan is
 * executed from several threads at once: pytorch/pytorch#103939); the GPU work still overlaps. */
typedef struct gc_entry cg_shared; /* a reference to an entry of the cache (graph_cache.h) */

/* The graph of spec for the current device (which must be `device`), from the cache or built now,
 * with a reference the caller gives back with attn_cudnn_graph_put. NULL with err filled when it
 * cannot be built; an UNSUPPORTED refusal is cached too, so the next plan of the spec is refused at
 * once with the same reason. */
cg_shared *attn_cudnn_graph_get(int device, const cg_spec *spec, cg_err *err);
cg_graph *attn_cudnn_shared_graph(const cg_shared *shared);
void attn_cudnn_graph_put(cg_shared *shared); /* NULL is ignored */

/* Handles for running, pooled per device: a run takes one and gives it back, so making a plan costs
 * no cudnnCreate (a millisecond, more than a cached plan). The current device must be `device`.
 * Taking one fails only as cudnnCreate fails. */
cudnnHandle_t attn_cudnn_handle_take(int device, cg_err *err);
void attn_cudnn_handle_give(int device, cudnnHandle_t handle);

/* For tests (test_cudnn.c) and the benchmark: the cache's counters, and a new bound (evicts at
 * once; plans keep what they hold). */
typedef struct attn_cudnn_cache_stats {
  uint64_t hits, misses, builds, evictions, frees;
  size_t entries, detached, capacity;
} attn_cudnn_cache_stats;
void attn_cudnn_graph_cache_stats(attn_cudnn_cache_stats *stats);
void attn_cudnn_graph_cache_set_capacity(size_t capacity);

/* Those two as the module's test hooks (attn_module_table.test_hooks of libattn_cudnn.so), and a
 * probe of what cuDNN's backend itself does: probe_forward runs the forward pass of p (resolved by
 * the caller; not validated, so its out_dtype may be one the library does not take) through this
 * implementation with its support rules skipped, on the default stream, and waits for it; outputs
 * NULL builds the graph only. The status comes with cuDNN's reason. test_cudnn runs cuDNN's fp8
 * graph on Hopper with it, in the e4m3 out cuDNN writes there. */
typedef struct attn_cudnn_test_hooks {
  void (*cache_stats)(attn_cudnn_cache_stats *stats);
  void (*cache_set_capacity)(size_t capacity);
  attn_status (*probe_forward)(const attn_problem *p, const attn_inputs *inputs,
                               const attn_outputs *outputs, char *why, size_t why_size);
} attn_cudnn_test_hooks;

#endif /* ATTN_IMPL_CUDNN_GRAPH_H */
