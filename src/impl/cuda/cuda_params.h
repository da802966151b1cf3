/*
 * src/impl/cuda/cuda_params.h - the one struct the CUDA kernels read: raw device pointers, strides in
 * elements, sizes and feature switches of one forward or backward run (FlashAttention's params).
 *
 * Plain C, shared by cuda.c (which fills it from an attn_run) and the .cu files (which read it), so
 * no template and no CUDA type crosses the boundary. Token tensors are addressed as
 *   base + b * <t>_b + (row0 + i) * <t>_r + head * <t>_h + d
 * where row0 is the sequence's first row (packed varlen; 0 otherwise) and <t>_b is 0 when packed.
 * Every stride of a broadcast dimension (size 1) is set to 0 by the host.
 */
#ifndef ATTN_IMPL_CUDA_CUDA_PARAMS_H
#define ATTN_IMPL_CUDA_CUDA_PARAMS_H

#include <stddef.h>
#include <stdint.h>

enum { ATTN_CUDA_VARLEN_NONE = 0, ATTN_CUDA_VARLEN_PACKED = 1, ATTN_CUDA_VARLEN_PADDED = 2 };
enum { ATTN_CUDA_ELEM_F32 = 0, ATTN_CUDA_ELEM_F16 = 1, ATTN_CUDA_ELEM_BF16 = 2 };
/* The sm90 fp8 forward's variant (params' fp8 - 1; cuda.c's fp8 configurations): the consumers'
 * ping-pong schedule on 128-key blocks, or 192-key blocks (D = 128 only; V^T's last 64 keys of a
 * block padded to a whole panel, sm90_fwd_fp8.cuh's VtLayout) on the free-running schedule */
enum { ATTN_CUDA_FP8_PINGPONG = 1, ATTN_CUDA_FP8_WIDE = 2 };
/* The per-element functions of a problem, one bit each (attn_cuda_params.elementwise_kinds). */
enum {
  ATTN_CUDA_FEAT_BIAS = 1,
  ATTN_CUDA_FEAT_MASK = 2,
  ATTN_CUDA_FEAT_ALIBI = 4,
  ATTN_CUDA_FEAT_SOFTCAP = 8,
  ATTN_CUDA_FEAT_SEGMENTS = 16
};

typedef struct attn_cuda_params {
  /* token tensors: q [.., Hq, D], k [.., Hkv, D], v [.., Hkv, Dv], out / dout [.., Hq, Dv] */
  const void *q, *k, *v;
  void *out;
  const void *dout;
  void *dq_out, *dk_out, *dv_out; /* gradients */
  int64_t q_b, q_r, q_h, k_b, k_r, k_h, v_b, v_r, v_h, o_b, o_r, o_h;
  int64_t do_b, do_r, do_h, dq_b, dq_r, dq_h, dk_b, dk_r, dk_h, dv_b, dv_r, dv_h;
  /* lse [B, Hq, Tq] (packed: [Hq, total_q]); f32. NULL in a forward that does not ask for it. */
  float *lse;
  int64_t lse_b, lse_h, lse_r;

  /* optional inputs; strides of broadcast dims are 0 */
  const void *bias; /* [B|1, Hq|Hkv|1, Tq|1, Tk|1] of bias_elem */
  int64_t bias_s[4];
  int32_t bias_elem;
  int32_t bias_head_mode; /* 0: broadcast, 1: per query head, 2: per KV head */
  const uint8_t *mask;    /* [B|1, Hq|1, Tq|1, Tk|1] */
  int64_t mask_s[4];
  const float *alibi; /* [Hq] or [B, Hq] */
  int64_t alibi_b, alibi_h;
  const float *sinks; /* [Hq, S] or [S] */
  int64_t sinks_h, sinks_t;
  int32_t num_sinks;
  int32_t sinks_shared; /* 1: one [S] for every head (sinks_h = 0) */
  const int32_t *q_seg, *kv_seg; /* [B, Tq], [B, Tk] */
  int64_t qseg_b, qseg_r, kseg_b, kseg_r;

  /* varlen lengths, on the device */
  int32_t varlen; /* ATTN_CUDA_VARLEN_* */
  const int32_t *cu_q, *cu_k;           /* packed */
  const int32_t *seqlens_q, *seqlens_k; /* padded */
  int64_t total_q, total_k;             /* packed: rows of the tensors */

  /* sizes */
  int32_t device_index; /* the GPU the tensors live on */
  int32_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, group, d, dv;

  /* the function */
  float scale;   /* softmax scale */
  float softcap; /* 0 = off */
  int32_t window_left, window_right; /* -1 = unbounded; causal already folded into right = 0 */
  int32_t align_bottom_right;
  /* Where the run sits in a larger problem (attn_positions, one piece per axis; cuda.c,
   * place_run): the Philox counter of (b, h, i, j) is that of (b + pos_b0, h + pos_h0, i + pos_i0,
   * j + pos_j0), pos_j0 a multiple of 4 (the kernels share one call among 4 keys); with
   * offset_given the band and ALiBi compare i + offset - j (offset = the larger problem's
   * alignment offset + pos_i0 - pos_j0) instead of the run's own alignment. */
  int32_t offset_given, offset;
  uint32_t pos_b0, pos_h0, pos_i0, pos_j0;
  float dropout_p;
  uint32_t drop_threshold;
  float keep_scale; /* 1 / (1 - p) */
  uint64_t seed;
  int32_t elementwise; /* any of bias, mask, alibi, softcap, segment ids: per-element work */
  int32_t elementwise_kinds; /* which of them (ATTN_CUDA_FEAT_* bits), known before the tensors */
  int32_t use_sm90;    /* the Hopper kernels (src/impl/cuda/sm90): the forward, and the backward
                        * where it takes the problem (the atomic sm80 one elsewhere) */

  /* backward outputs and workspace */
  void *dbias;          /* like bias, bias_elem; NULL = not asked */
  int64_t dbias_s[4];   /* its strides (no broadcast: the full bias_shape) */
  int64_t bias_shape[4];
  float *dbias_accum;   /* workspace: dense f32 of bias_shape */
  float *dsinks;        /* f32 like sinks; NULL = not asked */
  int64_t dsinks_h, dsinks_t;
  float *delta;         /* workspace: [Hq, rows_q] f32, rows_q = B * Tq or total_q */
  float *dq_accum;      /* the "atomic" and "sm90" configurations' f32 workspace: [Hq, rows_q, d]
                         * for the atomic kernels, ATTN_CUDA_SM90_DQ_FLOATS for the sm90
                         * backward's tiles (sm90_bwd.cuh); NULL in the deterministic one */
  int32_t *dq_semaphore; /* "sm90_deterministic": ATTN_CUDA_SM90_DQ_SLICES counters that order
                          * the additions into each slice of dq_accum's tiles; NULL otherwise */
  int64_t rows_q;

  /* fp8 (e4m3 q, k, v: docs/FP8.md), read by the sm90 fp8 forward (sm90/sm90_fwd_fp8.cuh) */
  int32_t fp8; /* 0: not fp8; else q, k, v hold e4m3 bytes and fp8 - 1 is the variant (below) */
  int32_t out_elem; /* ATTN_CUDA_ELEM_* of out (the inputs' dtype, or an fp8 problem's out_dtype) */
  const float *q_descale, *k_descale, *v_descale; /* f32 factors of (b, KV head); NULL: 1 */
  int64_t descale_b[3], descale_g[3];             /* their strides, q k v (0, 0: one per tensor) */
  void *v_t;       /* workspace: V transposed, [B or 1][Hkv][vt_head_bytes] e4m3 (VtLayout) */
  int64_t vt_cols;

  int32_t sm90_sched; /* the sm90 forward's tile scheduler: ATTN_CUDA_SM90_SCHED_* */
} attn_cuda_params;

/* The sm90 forward's tile scheduler: AUTO is the measured choice (sm90_launch.cu,
 * persistent_pays); GRID (one CTA per tile) and PERSISTENT force one, for tests and measurements
 * (ATTN_CUDA_SM90_SCHED=grid|persistent when the plan is made). */
#define ATTN_CUDA_SM90_SCHED_AUTO 0
#define ATTN_CUDA_SM90_SCHED_GRID 1
#define ATTN_CUDA_SM90_SCHED_PERSISTENT 2

/* The sm90 backward's dQ workspace: one f32 tile of ATTN_CUDA_SM90_BWD_ROWS query rows x d per
 * (query head, sequence, row block), each added by the copy engine in whole warp slices
 * (sm90_bwd.cuh says how a tile is laid out). */
#define ATTN_CUDA_SM90_BWD_ROWS 64
#define ATTN_CUDA_SM90_DQ_FLOATS(heads_q, batch, seqlen_q, d)                                             \
  ((int64_t)(heads_q) * (batch) *                                                                        \
   (((int64_t)(seqlen_q) + ATTN_CUDA_SM90_BWD_ROWS - 1) / ATTN_CUDA_SM90_BWD_ROWS * ATTN_CUDA_SM90_BWD_ROWS) * (d))

/* The deterministic sm90 backward's counters: one per warp slice of a dQ tile (8 slices of 16 rows
 * x d / 2 columns), counting the key blocks that have added into it. */
#define ATTN_CUDA_SM90_DQ_SLICES(heads_q, batch, seqlen_q)                                               \
  ((int64_t)(heads_q) * (batch) * (((int64_t)(seqlen_q) + ATTN_CUDA_SM90_BWD_ROWS - 1) / ATTN_CUDA_SM90_BWD_ROWS) * 8)

#endif /* ATTN_IMPL_CUDA_CUDA_PARAMS_H */
