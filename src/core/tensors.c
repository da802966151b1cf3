/*
 * src/core/tensors.c - shapes, dtypes and dense strides of every tensor of a problem.
 */
#include "core/tensors.h"

#include "core/dtype.h"

#include <string.h>

const char *attn_role_name(attn_role role) {
  static const char *const names[ATTN_ROLE_COUNT] = {
      [ATTN_ROLE_Q] = "q",
      [ATTN_ROLE_K] = "k",
      [ATTN_ROLE_V] = "v",
      [ATTN_ROLE_BIAS] = "bias",
      [ATTN_ROLE_MASK] = "mask",
      [ATTN_ROLE_ALIBI] = "alibi_slopes",
      [ATTN_ROLE_SINKS] = "sinks",
      [ATTN_ROLE_Q_SEGMENT_IDS] = "q_segment_ids",
      [ATTN_ROLE_KV_SEGMENT_IDS] = "kv_segment_ids",
      [ATTN_ROLE_OUT] = "out",
      [ATTN_ROLE_LSE] = "lse",
      [ATTN_ROLE_PROBS] = "probs",
      [ATTN_ROLE_DOUT] = "dout",
      [ATTN_ROLE_DQ] = "dq",
      [ATTN_ROLE_DK] = "dk",
      [ATTN_ROLE_DV] = "dv",
      [ATTN_ROLE_DBIAS] = "dbias",
      [ATTN_ROLE_DSINKS] = "dsinks",
      [ATTN_ROLE_BLOCK_TABLE] = "block_table",
      [ATTN_ROLE_K_NEW] = "k_new",
      [ATTN_ROLE_V_NEW] = "v_new",
      [ATTN_ROLE_Q_DESCALE] = "q_descale",
      [ATTN_ROLE_K_DESCALE] = "k_descale",
      [ATTN_ROLE_V_DESCALE] = "v_descale",
  };
  return (unsigned)role < ATTN_ROLE_COUNT ? names[role] : "unknown";
}

int attn_role_used(const attn_problem *p, attn_role role) {
  switch (role) {
  case ATTN_ROLE_BIAS:
  case ATTN_ROLE_DBIAS: return p->has_bias != 0;
  case ATTN_ROLE_MASK: return p->has_mask != 0;
  case ATTN_ROLE_ALIBI: return p->alibi != ATTN_ALIBI_NONE;
  case ATTN_ROLE_SINKS:
  case ATTN_ROLE_DSINKS: return p->num_sinks > 0;
  case ATTN_ROLE_Q_SEGMENT_IDS:
  case ATTN_ROLE_KV_SEGMENT_IDS: return p->has_segment_ids != 0;
  case ATTN_ROLE_PROBS: return p->operation == ATTN_OPERATION_SCALED_DOT_PRODUCT_ATTENTION;
  case ATTN_ROLE_BLOCK_TABLE: return p->page_size > 0;
  case ATTN_ROLE_K_NEW:
  case ATTN_ROLE_V_NEW: return p->page_size > 0 && p->seqlen_new > 0;
  case ATTN_ROLE_Q_DESCALE:
  case ATTN_ROLE_K_DESCALE:
  case ATTN_ROLE_V_DESCALE: return p->descale != ATTN_DESCALE_NONE;
  default: return 1;
  }
}

attn_tensor *attn_role_field(attn_role role, attn_inputs *in, attn_outputs *out, attn_tensor *dout,
                             attn_grads *g) {
  switch (role) {
  case ATTN_ROLE_Q: return &in->q;
  case ATTN_ROLE_K: return &in->k;
  case ATTN_ROLE_V: return &in->v;
  case ATTN_ROLE_BIAS: return &in->bias;
  case ATTN_ROLE_MASK: return &in->mask;
  case ATTN_ROLE_ALIBI: return &in->alibi_slopes;
  case ATTN_ROLE_SINKS: return &in->sinks;
  case ATTN_ROLE_Q_SEGMENT_IDS: return &in->q_segment_ids;
  case ATTN_ROLE_KV_SEGMENT_IDS: return &in->kv_segment_ids;
  case ATTN_ROLE_OUT: return &out->out;
  case ATTN_ROLE_LSE: return &out->lse;
  case ATTN_ROLE_PROBS: return &out->probs;
  case ATTN_ROLE_DOUT: return dout;
  case ATTN_ROLE_DQ: return &g->dq;
  case ATTN_ROLE_DK: return &g->dk;
  case ATTN_ROLE_DV: return &g->dv;
  case ATTN_ROLE_DBIAS: return &g->dbias;
  case ATTN_ROLE_DSINKS: return &g->dsinks;
  case ATTN_ROLE_BLOCK_TABLE: return &in->block_table;
  case ATTN_ROLE_K_NEW: return &in->k_new;
  case ATTN_ROLE_V_NEW: return &in->v_new;
  case ATTN_ROLE_Q_DESCALE: return &in->q_descale;
  case ATTN_ROLE_K_DESCALE: return &in->k_descale;
  case ATTN_ROLE_V_DESCALE: return &in->v_descale;
  case ATTN_ROLE_COUNT: break;
  }
  return NULL;
}

int attn_role_needed(const attn_problem *p, attn_role role, int backward) {
  switch (role) {
  case ATTN_ROLE_PROBS:
  case ATTN_ROLE_DBIAS:
  case ATTN_ROLE_DSINKS: return 0;
  case ATTN_ROLE_DOUT:
  case ATTN_ROLE_DQ:
  case ATTN_ROLE_DK:
  case ATTN_ROLE_DV:
    if (!backward) return 0;
    break;
  default: break;
  }
  return attn_role_used(p, role);
}

/* Rows, heads, width of a token tensor: [B, T, H, W] dense or [total, H, W] packed. */
static int token_shape(const attn_problem *p, int64_t seqlen, int64_t total, int64_t heads,
                       int64_t width, int64_t shape[ATTN_MAX_DIMS]) {
  if (p->varlen == ATTN_VARLEN_PACKED) {
    shape[0] = total, shape[1] = heads, shape[2] = width;
    return 3;
  }
  shape[0] = p->batch, shape[1] = seqlen, shape[2] = heads, shape[3] = width;
  return 4;
}

static int64_t head_dim_v(const attn_problem *p) {
  return p->head_dim_v > 0 ? p->head_dim_v : p->head_dim;
}

int64_t attn_paged_max_pages(const attn_problem *p) {
  if (p->max_pages_per_seq > 0 || p->page_size <= 0) return p->max_pages_per_seq;
  return (p->seqlen_k + p->page_size - 1) / p->page_size;
}

int64_t attn_paged_num_pages(const attn_problem *p) {
  if (p->num_pages > 0 || p->page_size <= 0) return p->num_pages;
  return p->batch * attn_paged_max_pages(p);
}

/* A pool of pages: [num_pages, page_size, Hkv, width]. */
static int page_shape(const attn_problem *p, int64_t width, int64_t shape[ATTN_MAX_DIMS]) {
  shape[0] = attn_paged_num_pages(p), shape[1] = p->page_size, shape[2] = p->heads_kv;
  shape[3] = width;
  return 4;
}

int attn_role_shape(const attn_problem *p, attn_role role, int64_t shape[ATTN_MAX_DIMS]) {
  switch (role) {
  case ATTN_ROLE_Q:
  case ATTN_ROLE_DQ: return token_shape(p, p->seqlen_q, p->total_q, p->heads_q, p->head_dim, shape);
  case ATTN_ROLE_K:
  case ATTN_ROLE_DK:
    if (p->page_size > 0) return page_shape(p, p->head_dim, shape);
    return token_shape(p, p->seqlen_k, p->total_k, p->heads_kv, p->head_dim, shape);
  case ATTN_ROLE_V:
  case ATTN_ROLE_DV:
    if (p->page_size > 0) return page_shape(p, head_dim_v(p), shape);
    return token_shape(p, p->seqlen_k, p->total_k, p->heads_kv, head_dim_v(p), shape);
  case ATTN_ROLE_BLOCK_TABLE:
    shape[0] = p->batch, shape[1] = attn_paged_max_pages(p);
    return 2;
  case ATTN_ROLE_K_NEW:
    shape[0] = p->batch, shape[1] = p->seqlen_new, shape[2] = p->heads_kv, shape[3] = p->head_dim;
    return 4;
  case ATTN_ROLE_V_NEW:
    shape[0] = p->batch, shape[1] = p->seqlen_new, shape[2] = p->heads_kv;
    shape[3] = head_dim_v(p);
    return 4;
  case ATTN_ROLE_OUT:
  case ATTN_ROLE_DOUT:
    return token_shape(p, p->seqlen_q, p->total_q, p->heads_q, head_dim_v(p), shape);
  case ATTN_ROLE_LSE:
    if (p->varlen == ATTN_VARLEN_PACKED) {
      shape[0] = p->heads_q, shape[1] = p->total_q;
      return 2;
    }
    shape[0] = p->batch, shape[1] = p->heads_q, shape[2] = p->seqlen_q;
    return 3;
  case ATTN_ROLE_PROBS:
    shape[0] = p->batch, shape[1] = p->heads_q, shape[2] = p->seqlen_q, shape[3] = p->seqlen_k;
    return 4;
  case ATTN_ROLE_BIAS:
  case ATTN_ROLE_DBIAS:
    for (int d = 0; d < 4; ++d) shape[d] = p->bias_shape[d];
    return 4;
  case ATTN_ROLE_MASK:
    for (int d = 0; d < 4; ++d) shape[d] = p->mask_shape[d];
    return 4;
  case ATTN_ROLE_ALIBI:
    if (p->alibi == ATTN_ALIBI_PER_BATCH_HEAD) {
      shape[0] = p->batch, shape[1] = p->heads_q;
      return 2;
    }
    shape[0] = p->heads_q;
    return 1;
  case ATTN_ROLE_SINKS:
  case ATTN_ROLE_DSINKS:
    if (p->sinks_shared) {
      shape[0] = p->num_sinks;
      return 1;
    }
    shape[0] = p->heads_q, shape[1] = p->num_sinks;
    return 2;
  case ATTN_ROLE_Q_SEGMENT_IDS:
    shape[0] = p->batch, shape[1] = p->seqlen_q;
    return 2;
  case ATTN_ROLE_KV_SEGMENT_IDS:
    shape[0] = p->batch, shape[1] = p->seqlen_k;
    return 2;
  case ATTN_ROLE_Q_DESCALE:
  case ATTN_ROLE_K_DESCALE:
  case ATTN_ROLE_V_DESCALE:
    if (p->descale == ATTN_DESCALE_PER_BATCH_KV_HEAD) {
      shape[0] = p->batch, shape[1] = p->heads_kv;
      return 2;
    }
    shape[0] = 1;
    return 1;
  case ATTN_ROLE_COUNT: break;
  }
  shape[0] = 0;
  return 1;
}

attn_dtype attn_role_dtype(const attn_problem *p, attn_role role) {
  switch (role) {
  case ATTN_ROLE_BIAS:
  case ATTN_ROLE_DBIAS: return (attn_dtype)p->bias_dtype;
  case ATTN_ROLE_MASK: return ATTN_DTYPE_U8;
  case ATTN_ROLE_Q_SEGMENT_IDS:
  case ATTN_ROLE_KV_SEGMENT_IDS:
  case ATTN_ROLE_BLOCK_TABLE: return ATTN_DTYPE_I32;
  case ATTN_ROLE_LSE:
  case ATTN_ROLE_ALIBI:
  case ATTN_ROLE_SINKS:
  case ATTN_ROLE_DSINKS: return attn_stat_dtype((attn_dtype)p->dtype);
  case ATTN_ROLE_Q_DESCALE:
  case ATTN_ROLE_K_DESCALE:
  case ATTN_ROLE_V_DESCALE: return ATTN_DTYPE_F32;
  case ATTN_ROLE_OUT:
  case ATTN_ROLE_DOUT:
  case ATTN_ROLE_PROBS: return attn_out_dtype(p);
  default: return (attn_dtype)p->dtype;
  }
}

int64_t attn_role_numel(const attn_problem *p, attn_role role) {
  int64_t shape[ATTN_MAX_DIMS];
  int ndim = attn_role_shape(p, role, shape);
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

attn_tensor attn_role_resolve(const attn_problem *p, attn_role role, attn_tensor t) {
  int64_t shape[ATTN_MAX_DIMS];
  int ndim = attn_role_shape(p, role, shape);
  int all_zero = 1;
  for (int d = 0; d < ATTN_MAX_DIMS; ++d) all_zero &= t.stride[d] == 0;
  if (all_zero) {
    int64_t stride = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      t.stride[d] = stride;
      stride *= shape[d];
    }
  }
  for (int d = ndim; d < ATTN_MAX_DIMS; ++d) t.stride[d] = 0;
  return t;
}

attn_seq attn_seq_of(const attn_problem *p, const attn_inputs *in, int64_t b) {
  attn_seq s = {0, 0, p->seqlen_q, p->seqlen_k};
  if (p->varlen == ATTN_VARLEN_PACKED) {
    s.q_row0 = in->cu_seqlens_q[b];
    s.k_row0 = in->cu_seqlens_k[b];
    s.len_q = in->cu_seqlens_q[b + 1] - s.q_row0;
    s.len_k = in->cu_seqlens_k[b + 1] - s.k_row0;
  } else if (p->varlen == ATTN_VARLEN_PADDED) {
    s.len_q = in->seqlens_q[b];
    s.len_k = in->seqlens_k[b];
  }
  if (p->page_size > 0) s.len_k = in->cache_seqlens[b] + p->seqlen_new;
  return s;
}

void attn_paged_append(const attn_problem *p, const attn_inputs *in) {
  if (p->page_size <= 0 || p->seqlen_new <= 0) return;
  const attn_tensor *news[2] = {&in->k_new, &in->v_new}, *pools[2] = {&in->k, &in->v};
  const int64_t widths[2] = {p->head_dim, head_dim_v(p)};
  const size_t es = attn_dtype_size((attn_dtype)p->dtype);
  for (int which = 0; which < 2; ++which) {
    const attn_tensor *src = news[which], *dst = pools[which];
    for (int64_t b = 0; b < p->batch; ++b)
      for (int64_t t = 0; t < p->seqlen_new; ++t)
        for (int64_t h = 0; h < p->heads_kv; ++h) {
          const int64_t j = in->cache_seqlens[b] + t;
          const int64_t at = attn_paged_offset(p, in, dst, b, j, h);
          const int64_t from = b * src->stride[0] + t * src->stride[1] + h * src->stride[2];
          for (int64_t d = 0; d < widths[which]; ++d)
            memcpy((char *)dst->data + (size_t)(at + d * dst->stride[3]) * es,
                   (const char *)src->data + (size_t)(from + d * src->stride[3]) * es, es);
        }
  }
}
