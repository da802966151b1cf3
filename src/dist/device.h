/*
 * src/dist/device.h - what the ring needs on a GPU besides the attention blocks: streams and
 * events to overlap a block's transfer with the blocks in hand, strided copies (packing the K/V
 * slice, storing results), and the element-wise kernels of the ring (the merge of partial outputs
 * through their lse, the dq and dK/dV sums). The cuda module provides the table (its
 * attn_module_table.dist, src/impl/cuda/dist_ops.cu); libattn reaches it through
 * attn_module_dist_ops() and links no CUDA.
 *
 * Conventions: streams and events are cudaStream_t and cudaEvent_t as void *; every function
 * first makes `device` current and restores the caller's, and enqueues its work on `stream`
 * (nothing waits unless the name says so). Accumulators are dense f32 (what flash attention keeps
 * per row, and what the cuda backward accumulates dq in); tensors are of dtype (attn_dtype: f16,
 * bf16 or f32). A failure returns DEVICE_ERROR (OUT_OF_MEMORY for allocations) with the runtime's
 * reason in why.
 */
#ifndef ATTN_DIST_DEVICE_H
#define ATTN_DIST_DEVICE_H

#include "attn.h"

#include <stddef.h>
#include <stdint.h>

typedef struct attn_dist_device_ops {
  attn_status (*stream_create)(int32_t device, void **stream, char *why, size_t why_size);
  void (*stream_destroy)(int32_t device, void *stream); /* NULL is ignored */
  attn_status (*event_create)(int32_t device, void **event, char *why, size_t why_size);
  void (*event_destroy)(int32_t device, void *event); /* NULL is ignored */
  /* cudaEventRecord(event, stream), and cudaStreamWaitEvent(stream, event) */
  attn_status (*record)(int32_t device, void *event, void *stream, char *why, size_t why_size);
  attn_status (*stream_wait)(int32_t device, void *stream, void *event, char *why, size_t why_size);
  /* Blocks the host until the stream's work is done. */
  attn_status (*stream_sync)(int32_t device, void *stream, char *why, size_t why_size);
  /* dst[i] = src[i] over a 4-D index i < shape, strides in elements of es bytes (1, 2, 4 or 8),
   * converting nothing. */
  attn_status (*copy)(int32_t device, void *dst, const int64_t dst_stride[4], const void *src,
                      const int64_t src_stride[4], const int64_t shape[4], size_t es, void *stream,
                      char *why, size_t why_size);
  /* dst[0 .. n) = value */
  attn_status (*fill)(int32_t device, float *dst, int64_t n, float value, void *stream, char *why,
                      size_t why_size);
  /* The lse merge of a block's partial result into the accumulators: out_blk dense
   * [B, rows, H, Dv] of dtype and lse_blk dense [B, H, rows] f32 are rows [row0, row0 + rows) of
   * acc_out [B, T, H, Dv] and acc_lse [B, H, T] (f32, dense):
   *   L = log(e^L + e^l),  acc = e^(L_old - L) acc + e^(l - L) out;  rows with l = -inf unchanged. */
  attn_status (*merge)(int32_t device, int32_t dtype, float *acc_out, float *acc_lse,
                       const void *out_blk, const float *lse_blk, int64_t B, int64_t H, int64_t T,
                       int64_t row0, int64_t rows, int64_t Dv, void *stream, char *why,
                       size_t why_size);
  /* acc[b, row0 + i, e] += blk[b, i, e] for b < B, i < rows, e < width: acc dense f32 of T rows,
   * blk dense of dtype (a block's dq, dk or dv). */
  attn_status (*accumulate)(int32_t device, float *acc, int64_t T, int64_t row0, const void *blk,
                            int32_t dtype, int64_t B, int64_t rows, int64_t width, void *stream,
                            char *why, size_t why_size);
  /* dst[i] += src[i], f32, i < n */
  attn_status (*add)(int32_t device, float *dst, const float *src, int64_t n, void *stream,
                     char *why, size_t why_size);
  /* dst (dtype, strides in elements) = acc (dense f32 of that shape), rounded to dtype. */
  attn_status (*store)(int32_t device, void *dst, int32_t dtype, const int64_t dst_stride[4],
                       const float *acc, const int64_t shape[4], void *stream, char *why,
                       size_t why_size);
} attn_dist_device_ops;

#endif /* ATTN_DIST_DEVICE_H */
