/*
 * src/impl/cuda/cuda_decode.h - the split-KV decode kernels (cuda_decode.cu) as cuda.c calls them:
 * few queries per sequence against a dense or paged KV cache (docs/DECODE.md), K and V read once.
 *
 * Plain C, like cuda_params.h: raw device pointers, strides in elements, sizes. A CTA takes one
 * (sequence, KV head, chunk of up to 16 query rows, key split) (on sm_90 at D = 128, one CTA of 8
 * warps may take 2 or 4 KV heads: params.heads); the rows are the Hq/Hkv query heads
 * times Tq queries of the KV head (GQA packing), so each K and V row is read once for all of them.
 * K and V rows arrive by cp.async.bulk on sm_90 (16-byte cp.async elsewhere; ATTN_CUDA_DECODE
 * picks the data paths for measurements, docs/DECODE.md). With more than one split, the partial
 * results (m, l, unnormalised O) go to the workspace and a second kernel merges them through their
 * maxima, adds the sinks, and writes out and lse (on sm_90 with at most 16 splits in one wave of
 * CTAs, the splits are one thread-block cluster that merges them itself, and the workspace goes
 * unused; with more splits in one wave, the split kernel is launched cooperatively and merges them
 * itself after a grid barrier); with one, the CTA writes them itself and the workspace is empty.
 */
#ifndef ATTN_IMPL_CUDA_CUDA_DECODE_H
#define ATTN_IMPL_CUDA_CUDA_DECODE_H

#include "attn.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Query rows one CTA holds; more rows per KV head are split into chunks of this many. */
#define ATTN_CUDA_DECODE_ROWS 16
/* Queries per sequence the decode kernels take. */
#define ATTN_CUDA_DECODE_MAX_TQ 16

typedef struct attn_cuda_decode_params {
  const void *q, *k, *v; /* q [B, Tq, Hq, D]; k, v dense [B, Tk, Hkv, D|Dv] or paged pools */
  void *out;             /* [B, Tq, Hq, Dv] */
  float *lse;            /* [B, Hq, Tq] or NULL */
  int64_t q_b, q_r, q_h;
  /* dense: batch, row, head strides; paged: page, row-in-page, head strides */
  int64_t k_b, k_r, k_h, v_b, v_r, v_h;
  int64_t o_b, o_r, o_h;
  int64_t lse_b, lse_h, lse_r;

  /* paged cache: NULL block_table = dense, every sequence seqlen_k keys */
  const int32_t *block_table; /* [B, max_pages] */
  int64_t bt_b, bt_p;
  int32_t page_size;
  int32_t num_pages;            /* pool pages: table entries are clamped to them */
  const int32_t *cache_seqlens; /* [B] */
  int32_t seqlen_new;           /* rows of k_new / v_new appended first */
  const void *k_new, *v_new;    /* [B, seqlen_new, Hkv, D|Dv] */
  int64_t kn_b, kn_r, kn_h, vn_b, vn_r, vn_h;

  const float *alibi; /* [Hq] or [B, Hq]; NULL = none */
  int64_t alibi_b, alibi_h;
  const float *sinks; /* [Hq, S] or [S]; NULL = none */
  int64_t sinks_h, sinks_t;
  int32_t num_sinks;

  int32_t device_index;
  int32_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, group, d, dv;
  float scale, softcap;              /* softcap 0 = off */
  int32_t window_left, window_right; /* -1 = unbounded; causal folded into right = 0 */
  int32_t align_bottom_right;
  int32_t offset_given, offset; /* attn_cuda_params' own: a run placed in a larger problem */

  int32_t splits;     /* key splits per (sequence, KV head, row chunk) */
  float *partials;    /* workspace: attn_cuda_decode_workspace bytes */
  int32_t variant;    /* the data paths: attn_cuda_decode_variant()'s flags (0: the defaults) */
  int32_t heads;      /* KV heads per CTA: attn_cuda_decode_heads (0 or 1: one) */
#ifdef ATTN_CUDA_DECODE_TIMELINE
  int32_t timeline_call; /* dev/cuda/decode_timeline.cu: the call's slot in the stamps' ring */
#endif
} attn_cuda_decode_params;

/* The data paths ATTN_CUDA_DECODE asks for (a comma-separated list of tokens, docs/DECODE.md), as
 * the flags of attn_cuda_decode_params.variant: read when a plan is made (cuda.c's plan_init), not
 * at each call; 0 when it is unset. */
int attn_cuda_decode_variant(void);

/* Row chunks per KV head: ceil(group * Tq / ATTN_CUDA_DECODE_ROWS). */
int attn_cuda_decode_row_chunks(int group, int seqlen_q);

/* Key splits for a problem on device `index`: the most that keep the CTAs within half_waves / 2
 * full waves of the CTAs the device holds at once (its SM count times the CTAs per SM of the
 * kernel of head dims d, dv and the KV heads per CTA that `variant`, the plan's
 * attn_cuda_decode_variant() flags, asks for), none shorter than 128 of the `keys` any sequence's
 * rows can see (seqlen_k, or a window's width); 1 when the device cannot be asked. */
int attn_cuda_decode_splits(int index, int batch, int heads_kv, int row_chunks, int keys, int d,
                            int dv, int half_waves, int variant);

/* KV heads per CTA for the same problem (params.heads): 4 where batch x keys >= 64k, 2 where
 * >= 8k, else 1, or what a heads1/2/4/8 token of `variant` asks for; at most the largest power of
 * two dividing heads_kv; 1 unless d = dv = 128 on sm_90 or later. */
int attn_cuda_decode_heads(int index, int batch, int heads_kv, int keys, int d, int dv, int variant);

/* Workspace bytes of the partial results (0 with one split). */
size_t attn_cuda_decode_workspace(int batch, int heads_kv, int row_chunks, int splits, int dv);

/* The append (when seqlen_new > 0), the split kernel, the merge kernel, on stream (a
 * cudaStream_t). is_bf16 selects bf16 (else f16). DEVICE_ERROR / UNSUPPORTED with why. */
attn_status attn_cuda_decode_forward(const attn_cuda_decode_params *p, int is_bf16, void *stream,
                                     char *why, size_t why_size);

#ifdef __cplusplus
}
#endif

#endif /* ATTN_IMPL_CUDA_CUDA_DECODE_H */
