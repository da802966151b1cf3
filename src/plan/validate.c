/*
 * src/plan/validate.c - the rules of SPEC.md "Errors", in the order a reader would check them.
 *
 * Messages start with the argument and its value and then state the rule, so a user can find the
 * offending field without reading this file.
 */
#include "plan/validate.h"

#include "core/ctx.h"
#include "core/dtype.h"
#include "core/tensors.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

#define INVALID(...) attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, __VA_ARGS__)

/* Elements beyond this are refused so that every index and byte count fits int64_t and size_t. */
#define ATTN_MAX_ELEMENTS ((int64_t)1 << 56)

static attn_status check_flag(attn_ctx *ctx, const char *name, int32_t value) {
  if (value != 0 && value != 1) return INVALID("%s=%d must be 0 or 1", name, (int)value);
  return ATTN_STATUS_OK;
}

static attn_status check_enum(attn_ctx *ctx, const char *name, int32_t value, int32_t count) {
  if (value < 0 || value >= count)
    return INVALID("%s=%d is not a valid value (0..%d)", name, (int)value, (int)count - 1);
  return ATTN_STATUS_OK;
}

static attn_status check_min(attn_ctx *ctx, const char *name, int64_t value, int64_t min) {
  if (value < min) return INVALID("%s=%lld must be >= %lld", name, (long long)value, (long long)min);
  return ATTN_STATUS_OK;
}

/* One dimension of a broadcastable input: it must equal one of the allowed sizes or be 1. */
static attn_status check_broadcast_dim(attn_ctx *ctx, const char *tensor, int dim, int64_t value,
                                       const char *names, int64_t a, int64_t b) {
  if (value == 1 || value == a || value == b) return ATTN_STATUS_OK;
  if (a == b)
    return INVALID("%s_shape[%d]=%lld does not broadcast: it must be %s=%lld or 1", tensor, dim,
                   (long long)value, names, (long long)a);
  return INVALID("%s_shape[%d]=%lld does not broadcast: it must be %s (%lld or %lld) or 1", tensor,
                 dim, (long long)value, names, (long long)a, (long long)b);
}

#define TRY(expr)                                                                                  \
  do {                                                                                             \
    attn_status status_ = (expr);                                                                  \
    if (status_ != ATTN_STATUS_OK) return status_;                                                 \
  } while (0)

/* The fields of a paged KV cache (docs/DECODE.md). */
static attn_status check_paged_problem(attn_ctx *ctx, const attn_problem *p) {
  TRY(check_min(ctx, "page_size", p->page_size, 0));
  TRY(check_min(ctx, "num_pages", p->num_pages, 0));
  TRY(check_min(ctx, "max_pages_per_seq", p->max_pages_per_seq, 0));
  TRY(check_min(ctx, "seqlen_new", p->seqlen_new, 0));
  if (p->page_size == 0) {
    if (p->num_pages != 0 || p->max_pages_per_seq != 0 || p->seqlen_new != 0)
      return INVALID("%s=%lld needs a paged cache: set page_size > 0",
                     p->num_pages != 0          ? "num_pages"
                     : p->max_pages_per_seq != 0 ? "max_pages_per_seq"
                                                 : "seqlen_new",
                     (long long)(p->num_pages != 0          ? p->num_pages
                                 : p->max_pages_per_seq != 0 ? p->max_pages_per_seq
                                                             : p->seqlen_new));
    return ATTN_STATUS_OK;
  }
  if (p->varlen != ATTN_VARLEN_NONE)
    return INVALID("varlen=%d with page_size=%lld: a paged cache has its own lengths "
                   "(cache_seqlens) and dense queries; use varlen=none",
                   (int)p->varlen, (long long)p->page_size);
  const int64_t max_pages = attn_paged_max_pages(p);
  if (p->seqlen_k > max_pages * p->page_size)
    return INVALID("seqlen_k=%lld exceeds max_pages_per_seq=%lld * page_size=%lld: the block table "
                   "cannot reach the longest sequence's keys",
                   (long long)p->seqlen_k, (long long)max_pages, (long long)p->page_size);
  if (p->seqlen_new > p->seqlen_k)
    return INVALID("seqlen_new=%lld exceeds seqlen_k=%lld: a sequence holds its appended keys",
                   (long long)p->seqlen_new, (long long)p->seqlen_k);
  if (p->seqlen_q < 1)
    return INVALID("seqlen_q=%lld with a paged cache: every sequence has at least one query",
                   (long long)p->seqlen_q);
  return ATTN_STATUS_OK;
}

/* The fields of an f8e4m3 problem (docs/FP8.md): the out dtype and the descale factors. */
static attn_status check_fp8_problem(attn_ctx *ctx, const attn_problem *p) {
  const int fp8 = p->dtype == ATTN_DTYPE_F8E4M3;
  const int32_t out = p->out_dtype;
  if (out != -1 && out != p->dtype) {
    if (!fp8)
      return INVALID("out_dtype=%s with dtype=%s: out has the inputs' dtype (-1 = the default); "
                     "only an f8e4m3 problem writes another (bf16, f16 or f32)",
                     attn_dtype_name((attn_dtype)out), attn_dtype_name((attn_dtype)p->dtype));
    if (out != ATTN_DTYPE_BF16 && out != ATTN_DTYPE_F16 && out != ATTN_DTYPE_F32)
      return INVALID("out_dtype=%s with dtype=f8e4m3: out must be bf16 (the default, -1), f16 "
                     "or f32 (an e4m3 out would lose the f32 accumulation's precision)",
                     attn_dtype_name((attn_dtype)out));
  }
  if (fp8 && out == ATTN_DTYPE_F8E4M3)
    return INVALID("out_dtype=f8e4m3 with dtype=f8e4m3: out must be bf16 (the default, -1), f16 "
                   "or f32 (an e4m3 out would lose the f32 accumulation's precision)");
  TRY(check_enum(ctx, "descale", p->descale, ATTN_DESCALE_COUNT));
  if (p->descale != ATTN_DESCALE_NONE && !fp8)
    return INVALID("descale=%d with dtype=%s: descale factors belong to f8e4m3 inputs only",
                   (int)p->descale, attn_dtype_name((attn_dtype)p->dtype));
  return ATTN_STATUS_OK;
}

attn_status attn_validate_problem(attn_ctx *ctx, const attn_problem *p, attn_problem *resolved) {
  if (p == NULL) return INVALID("problem is NULL");
  TRY(check_enum(ctx, "operation", p->operation, ATTN_OPERATION_COUNT));
  if (p->dtype != ATTN_DTYPE_F32 && p->dtype != ATTN_DTYPE_F16 && p->dtype != ATTN_DTYPE_BF16 &&
      p->dtype != ATTN_DTYPE_F64 && p->dtype != ATTN_DTYPE_F8E4M3)
    return INVALID("dtype=%d must be f32, f16, bf16, f64 or f8e4m3", (int)p->dtype);
  TRY(check_fp8_problem(ctx, p));
  TRY(check_enum(ctx, "device", p->device, ATTN_DEVICE_COUNT));
  TRY(check_min(ctx, "device_index", p->device_index, 0));

  TRY(check_min(ctx, "batch", p->batch, 1));
  TRY(check_min(ctx, "seqlen_q", p->seqlen_q, 0));
  TRY(check_min(ctx, "seqlen_k", p->seqlen_k, 0));
  TRY(check_min(ctx, "heads_q", p->heads_q, 1));
  TRY(check_min(ctx, "heads_kv", p->heads_kv, 1));
  TRY(check_min(ctx, "head_dim", p->head_dim, 1));
  TRY(check_min(ctx, "head_dim_v", p->head_dim_v, 0));
  if (p->heads_q % p->heads_kv != 0)
    return INVALID("heads_q=%lld is not a multiple of heads_kv=%lld", (long long)p->heads_q,
                   (long long)p->heads_kv);

  if (!isfinite(p->scale)) return INVALID("scale=%g must be finite (0 = 1/sqrt(head_dim))", p->scale);
  /* Kernels compute scores in f32: a scale f32 cannot hold becomes inf there (docs/NUMERICS.md).
   * A tiny one is fine: it rounds towards 0 and the scores are ~0 either way, as in f64. */
  if (fabs(p->scale) > FLT_MAX)
    return INVALID("scale=%g is outside f32's range: |scale| must be <= %g (scores are computed "
                   "in f32)", p->scale, (double)FLT_MAX);
  TRY(check_flag(ctx, "causal", p->causal));
  TRY(check_enum(ctx, "align", p->align, ATTN_ALIGN_COUNT));
  if (p->window_left < -1)
    return INVALID("window_left=%lld is negative: use -1 for an unbounded window",
                   (long long)p->window_left);
  if (p->window_right < -1)
    return INVALID("window_right=%lld is negative: use -1 for an unbounded window",
                   (long long)p->window_right);
  if (!(p->softcap >= 0.0) || !isfinite(p->softcap))
    return INVALID("softcap=%g must be finite and >= 0 (0 = off)", p->softcap);
  /* The cap is applied in f32: outside f32's normal range it would become 0 (the cap silently
   * off) or inf (cap * tanh(x / cap) = NaN) there (docs/NUMERICS.md). */
  if (p->softcap != 0.0 && !(p->softcap >= FLT_MIN && p->softcap <= FLT_MAX))
    return INVALID("softcap=%g is outside f32's normal range: it must be 0 (off) or within "
                   "[%g, %g] (the cap is applied in f32)", p->softcap, (double)FLT_MIN,
                   (double)FLT_MAX);
  if (!(p->dropout_p >= 0.0 && p->dropout_p < 1.0))
    return INVALID("dropout_p=%g must be in [0, 1)", p->dropout_p);

  TRY(check_flag(ctx, "has_bias", p->has_bias));
  if (p->has_bias) {
    int ok = p->bias_dtype == ATTN_DTYPE_F32 || p->bias_dtype == ATTN_DTYPE_F16 ||
             p->bias_dtype == ATTN_DTYPE_BF16 ||
             (p->bias_dtype == ATTN_DTYPE_F64 && p->dtype == ATTN_DTYPE_F64);
    if (!ok)
      return INVALID("bias_dtype=%s must be f32, f16 or bf16 (f64 only with dtype f64)",
                     attn_dtype_name((attn_dtype)p->bias_dtype));
    TRY(check_broadcast_dim(ctx, "bias", 0, p->bias_shape[0], "batch", p->batch, p->batch));
    TRY(check_broadcast_dim(ctx, "bias", 1, p->bias_shape[1], "heads_q or heads_kv", p->heads_q,
                            p->heads_kv));
    TRY(check_broadcast_dim(ctx, "bias", 2, p->bias_shape[2], "seqlen_q", p->seqlen_q, p->seqlen_q));
    TRY(check_broadcast_dim(ctx, "bias", 3, p->bias_shape[3], "seqlen_k", p->seqlen_k, p->seqlen_k));
  }
  TRY(check_flag(ctx, "has_mask", p->has_mask));
  if (p->has_mask) {
    TRY(check_broadcast_dim(ctx, "mask", 0, p->mask_shape[0], "batch", p->batch, p->batch));
    TRY(check_broadcast_dim(ctx, "mask", 1, p->mask_shape[1], "heads_q", p->heads_q, p->heads_q));
    TRY(check_broadcast_dim(ctx, "mask", 2, p->mask_shape[2], "seqlen_q", p->seqlen_q, p->seqlen_q));
    TRY(check_broadcast_dim(ctx, "mask", 3, p->mask_shape[3], "seqlen_k", p->seqlen_k, p->seqlen_k));
  }
  TRY(check_enum(ctx, "alibi", p->alibi, ATTN_ALIBI_COUNT));
  TRY(check_min(ctx, "num_sinks", p->num_sinks, 0));
  TRY(check_flag(ctx, "sinks_shared", p->sinks_shared));
  TRY(check_flag(ctx, "has_segment_ids", p->has_segment_ids));
  TRY(check_enum(ctx, "varlen", p->varlen, ATTN_VARLEN_COUNT));
  if (p->varlen == ATTN_VARLEN_PACKED) {
    TRY(check_min(ctx, "total_q", p->total_q, 0));
    TRY(check_min(ctx, "total_k", p->total_k, 0));
  }

  TRY(check_paged_problem(ctx, p));

  for (int r = 0; r < ATTN_ROLE_COUNT; ++r) {
    if (!attn_role_used(p, (attn_role)r)) continue;
    int64_t shape[ATTN_MAX_DIMS], n = 1;
    int ndim = attn_role_shape(p, (attn_role)r, shape);
    for (int d = 0; d < ndim; ++d) {
      if (shape[d] != 0 && n > ATTN_MAX_ELEMENTS / shape[d])
        return INVALID("%s has more than 2^56 elements: the sizes are too large",
                       attn_role_name((attn_role)r));
      n *= shape[d];
    }
  }

  if (resolved != NULL) {
    *resolved = *p;
    if (resolved->head_dim_v == 0) resolved->head_dim_v = p->head_dim;
    if (resolved->scale == 0.0) resolved->scale = 1.0 / sqrt((double)p->head_dim);
    if (resolved->causal) resolved->window_right = 0; /* SPEC: causal is window right = 0 */
    if (resolved->varlen != ATTN_VARLEN_PACKED) resolved->total_q = resolved->total_k = 0;
    resolved->max_pages_per_seq = attn_paged_max_pages(p);
    resolved->num_pages = attn_paged_num_pages(p);
  }
  return ATTN_STATUS_OK;
}

/* ---- data of a run ---------------------------------------------------------------------- */

/* One tensor of a run, with what is known about it. */
typedef struct slot {
  attn_role role;
  const attn_tensor *given; /* the caller's tensor; NULL when the struct holding it is absent */
  attn_tensor *resolved;    /* where its resolved copy goes */
  int required;             /* must have data */
  int is_output;            /* written by the run */
} slot;

/* Byte range [lo, hi) a tensor spans; empty (lo == hi) when it has no elements. */
typedef struct span {
  uintptr_t lo, hi;
} span;

static span tensor_span(const attn_problem *p, attn_role role, const attn_tensor *t) {
  int64_t shape[ATTN_MAX_DIMS];
  int ndim = attn_role_shape(p, role, shape);
  int64_t es = (int64_t)attn_dtype_size(attn_role_dtype(p, role));
  int64_t lo = 0, hi = 0;
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] == 0) return (span){0, 0};
    int64_t reach = (shape[d] - 1) * t->stride[d];
    if (reach < 0) lo += reach;
    else hi += reach;
  }
  uintptr_t base = (uintptr_t)t->data;
  return (span){base + (uintptr_t)(lo * es), base + (uintptr_t)(hi * es + es)};
}

/* Dimensions of size > 1 ordered by |stride|, innermost first; returns their count. */
static int sorted_dims(const int64_t shape[], const int64_t stride[], int ndim, int order[]) {
  int n = 0;
  for (int d = 0; d < ndim; ++d)
    if (shape[d] > 1) order[n++] = d;
  for (int a = 1; a < n; ++a)
    for (int b = a; b > 0 && llabs(stride[order[b]]) < llabs(stride[order[b - 1]]); --b) {
      int tmp = order[b];
      order[b] = order[b - 1];
      order[b - 1] = tmp;
    }
  return n;
}

/* Whether no two index tuples of the tensor share an element: each stride, innermost first, must
 * step over everything the inner dimensions reach. */
static int nested_layout(const int64_t shape[], const int64_t stride[], int ndim) {
  int order[ATTN_MAX_DIMS];
  int n = sorted_dims(shape, stride, ndim, order);
  int64_t reach = 0;
  for (int k = 0; k < n; ++k) {
    int64_t s = llabs(stride[order[k]]);
    if (s <= reach) return 0;
    reach += s * (shape[order[k]] - 1);
  }
  return 1;
}

/* Whether two tensors share an element. Disjoint byte ranges settle it; otherwise two tensors of
 * one nested layout interleaved in one buffer (dq, dk, dv in a packed dqkv) are told apart by
 * writing their offset in the layout's mixed radix: it shares an element only if every digit fits. */
static int tensors_overlap(const attn_problem *p, attn_role ra, const attn_tensor *a, attn_role rb,
                           const attn_tensor *b) {
  span sa = tensor_span(p, ra, a), sb = tensor_span(p, rb, b);
  if (sa.lo == sa.hi || sb.lo == sb.hi || sa.hi <= sb.lo || sb.hi <= sa.lo) return 0;
  int64_t shape_a[ATTN_MAX_DIMS], shape_b[ATTN_MAX_DIMS];
  int nda = attn_role_shape(p, ra, shape_a), ndb = attn_role_shape(p, rb, shape_b);
  size_t es = attn_dtype_size(attn_role_dtype(p, ra));
  if (nda != ndb || es != attn_dtype_size(attn_role_dtype(p, rb))) return 1;
  for (int d = 0; d < nda; ++d)
    if (shape_a[d] != shape_b[d] || a->stride[d] != b->stride[d] || a->stride[d] < 0) return 1;
  if (!nested_layout(shape_a, a->stride, nda)) return 1;
  intptr_t delta_bytes = (intptr_t)b->data - (intptr_t)a->data;
  if (delta_bytes < 0) delta_bytes = -delta_bytes;
  if (delta_bytes % (intptr_t)es != 0) return 1;
  int64_t delta = (int64_t)(delta_bytes / (intptr_t)es);
  int order[ATTN_MAX_DIMS];
  int n = sorted_dims(shape_a, a->stride, nda, order);
  for (int k = n - 1; k >= 0; --k) {
    int64_t s = a->stride[order[k]], digit = delta / s;
    if (digit > shape_a[order[k]] - 1) digit = shape_a[order[k]] - 1;
    delta -= digit * s;
  }
  return delta == 0;
}

static attn_status check_slot(attn_ctx *ctx, const attn_problem *p, const slot *s) {
  const char *name = attn_role_name(s->role);
  attn_tensor none = {NULL, {0, 0, 0, 0}};
  const attn_tensor *t = s->given != NULL ? s->given : &none;
  *s->resolved = attn_role_resolve(p, s->role, *t);
  int64_t numel = attn_role_numel(p, s->role);
  if (t->data == NULL) {
    if (s->required && numel > 0) return INVALID("%s.data is NULL: %s is required", name, name);
    return ATTN_STATUS_OK;
  }
  /* An empty output is never written; its dense strides may be 0 (the dims outside a size-0 one). */
  if (s->is_output && numel > 0) {
    int64_t shape[ATTN_MAX_DIMS];
    int ndim = attn_role_shape(p, s->role, shape);
    for (int d = 0; d < ndim; ++d)
      if (shape[d] > 1 && s->resolved->stride[d] == 0)
        return INVALID("%s.stride[%d]=0 with size %lld: outputs cannot broadcast", name, d,
                       (long long)shape[d]);
    if (!nested_layout(shape, s->resolved->stride, ndim))
      return INVALID("%s strides make elements overlap: outputs need one element per index", name);
  }
  return ATTN_STATUS_OK;
}

/* Checks every slot, then that no output overlaps an input or another output. */
static attn_status check_slots(attn_ctx *ctx, const attn_problem *p, slot *slots, int count) {
  for (int i = 0; i < count; ++i) {
    if (attn_role_used(p, slots[i].role)) {
      TRY(check_slot(ctx, p, &slots[i]));
    } else {
      slots[i].resolved->data = NULL; /* implementations see only what the problem uses */
    }
  }
  for (int i = 0; i < count; ++i) {
    if (!slots[i].is_output || slots[i].resolved->data == NULL) continue;
    for (int j = 0; j < count; ++j) {
      if (j == i || (slots[j].is_output && j < i) || slots[j].resolved->data == NULL) continue;
      if (tensors_overlap(p, slots[i].role, slots[i].resolved, slots[j].role, slots[j].resolved))
        return INVALID("%s overlaps %s: outputs must not alias inputs or other outputs",
                       attn_role_name(slots[i].role), attn_role_name(slots[j].role));
    }
  }
  return ATTN_STATUS_OK;
}

static attn_status check_cu_seqlens(attn_ctx *ctx, const char *name, const int32_t *cu, int64_t batch,
                                    int64_t total, const char *total_name, int64_t max_len,
                                    const char *max_name) {
  if (cu == NULL) return INVALID("%s is NULL: packed varlen needs it", name);
  if (cu[0] != 0) return INVALID("%s[0]=%d must be 0", name, (int)cu[0]);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t len = (int64_t)cu[b + 1] - cu[b];
    if (len < 0)
      return INVALID("%s[%lld]=%d is less than %s[%lld]=%d: it must not decrease", name,
                     (long long)(b + 1), (int)cu[b + 1], name, (long long)b, (int)cu[b]);
    if (len > max_len)
      return INVALID("%s gives sequence %lld length %lld, more than %s=%lld", name, (long long)b,
                     (long long)len, max_name, (long long)max_len);
  }
  if (cu[batch] > total)
    return INVALID("%s[%lld]=%d exceeds the tensor: %s=%lld", name, (long long)batch, (int)cu[batch],
                   total_name, (long long)total);
  return ATTN_STATUS_OK;
}

static attn_status check_seqlens(attn_ctx *ctx, const char *name, const int32_t *lens, int64_t batch,
                                 int64_t max_len, const char *max_name) {
  if (lens == NULL) return INVALID("%s is NULL: padded varlen needs it", name);
  for (int64_t b = 0; b < batch; ++b)
    if (lens[b] < 0 || lens[b] > max_len)
      return INVALID("%s[%lld]=%d must be in 0..%s=%lld", name, (long long)b, (int)lens[b], max_name,
                     (long long)max_len);
  return ATTN_STATUS_OK;
}

/* Inputs shared by the forward and backward passes: tensors, varlen lengths and the seed. */
static attn_status check_varlen(attn_ctx *ctx, const attn_problem *p, const attn_inputs *in) {
  if (p->varlen == ATTN_VARLEN_PACKED) {
    if (in->cu_seqlens_q == NULL || in->cu_seqlens_k == NULL)
      return INVALID("%s is NULL: packed varlen needs it",
                     in->cu_seqlens_q == NULL ? "cu_seqlens_q" : "cu_seqlens_k");
    /* Lengths on a GPU cannot be read here; the GPU implementation bounds its own indexing. */
    if (p->device != ATTN_DEVICE_CPU) return ATTN_STATUS_OK;
    TRY(check_cu_seqlens(ctx, "cu_seqlens_q", in->cu_seqlens_q, p->batch, p->total_q, "total_q",
                         p->seqlen_q, "seqlen_q"));
    TRY(check_cu_seqlens(ctx, "cu_seqlens_k", in->cu_seqlens_k, p->batch, p->total_k, "total_k",
                         p->seqlen_k, "seqlen_k"));
  } else if (p->varlen == ATTN_VARLEN_PADDED) {
    if (in->seqlens_q == NULL || in->seqlens_k == NULL)
      return INVALID("%s is NULL: padded varlen needs it",
                     in->seqlens_q == NULL ? "seqlens_q" : "seqlens_k");
    if (p->device != ATTN_DEVICE_CPU) return ATTN_STATUS_OK;
    TRY(check_seqlens(ctx, "seqlens_q", in->seqlens_q, p->batch, p->seqlen_q, "seqlen_q"));
    TRY(check_seqlens(ctx, "seqlens_k", in->seqlens_k, p->batch, p->seqlen_k, "seqlen_k"));
  }
  return ATTN_STATUS_OK;
}

/* Fills the input slots (q .. kv_segment_ids) and returns how many. */
static int input_slots(const attn_inputs *in, attn_inputs *r, slot *s) {
  *r = *in;
  const attn_tensor *given[] = {&in->q,     &in->k,           &in->v,
                                &in->bias,  &in->mask,        &in->alibi_slopes,
                                &in->sinks, &in->q_segment_ids, &in->kv_segment_ids};
  attn_tensor *resolved[] = {&r->q,     &r->k,           &r->v,
                             &r->bias,  &r->mask,        &r->alibi_slopes,
                             &r->sinks, &r->q_segment_ids, &r->kv_segment_ids};
  for (int i = 0; i < 9; ++i)
    s[i] = (slot){(attn_role)(ATTN_ROLE_Q + i), given[i], resolved[i], 1, 0};
  /* a paged cache's */
  s[9] = (slot){ATTN_ROLE_BLOCK_TABLE, &in->block_table, &r->block_table, 1, 0};
  s[10] = (slot){ATTN_ROLE_K_NEW, &in->k_new, &r->k_new, 1, 0};
  s[11] = (slot){ATTN_ROLE_V_NEW, &in->v_new, &r->v_new, 1, 0};
  /* an f8e4m3 problem's descale factors */
  s[12] = (slot){ATTN_ROLE_Q_DESCALE, &in->q_descale, &r->q_descale, 1, 0};
  s[13] = (slot){ATTN_ROLE_K_DESCALE, &in->k_descale, &r->k_descale, 1, 0};
  s[14] = (slot){ATTN_ROLE_V_DESCALE, &in->v_descale, &r->v_descale, 1, 0};
  return 15;
}

/* Lengths and block table of a paged cache, once the tensors are resolved: each sequence's keys
 * fit seqlen_k, and every page a sequence reads or appends to is in the pool. */
static attn_status check_paged(attn_ctx *ctx, const attn_problem *p, const attn_inputs *in) {
  if (p->page_size <= 0) return ATTN_STATUS_OK;
  if (in->cache_seqlens == NULL) return INVALID("cache_seqlens is NULL: a paged cache needs it");
  /* Lengths and tables on a GPU cannot be read here; the GPU implementation bounds its indexing. */
  if (p->device != ATTN_DEVICE_CPU) return ATTN_STATUS_OK;
  const int32_t *table = (const int32_t *)in->block_table.data;
  const int64_t s0 = in->block_table.stride[0], s1 = in->block_table.stride[1];
  for (int64_t b = 0; b < p->batch; ++b) {
    const int64_t len = in->cache_seqlens[b];
    if (len < 0)
      return INVALID("cache_seqlens[%lld]=%lld is negative", (long long)b, (long long)len);
    if (len + p->seqlen_new > p->seqlen_k)
      return INVALID("cache_seqlens[%lld]=%lld plus seqlen_new=%lld exceeds seqlen_k=%lld",
                     (long long)b, (long long)len, (long long)p->seqlen_new,
                     (long long)p->seqlen_k);
    const int64_t pages = (len + p->seqlen_new + p->page_size - 1) / p->page_size;
    for (int64_t i = 0; i < pages; ++i) {
      const int32_t page = table[b * s0 + i * s1];
      if (page < 0 || page >= p->num_pages)
        return INVALID("block_table[%lld][%lld]=%d is out of range: sequence %lld reads it "
                       "(length %lld) and pages are 0..num_pages-1=%lld",
                       (long long)b, (long long)i, (int)page, (long long)b,
                       (long long)(len + p->seqlen_new), (long long)(p->num_pages - 1));
    }
  }
  return ATTN_STATUS_OK;
}

attn_status attn_validate_forward(attn_ctx *ctx, const attn_problem *p, const attn_inputs *in,
                                  const attn_outputs *out, attn_inputs *in_r, attn_outputs *out_r) {
  if (in == NULL) return INVALID("inputs is NULL");
  if (out == NULL) return INVALID("outputs is NULL");
  if (out->probs.data != NULL && p->operation != ATTN_OPERATION_SCALED_DOT_PRODUCT_ATTENTION)
    return INVALID("probs is given but operation=flash_attention never forms the probabilities: "
                   "use scaled_dot_product_attention");
  slot s[24];
  int n = input_slots(in, in_r, s);
  *out_r = *out;
  s[n++] = (slot){ATTN_ROLE_OUT, &out->out, &out_r->out, 1, 1};
  s[n++] = (slot){ATTN_ROLE_LSE, &out->lse, &out_r->lse, 0, 1};
  s[n++] = (slot){ATTN_ROLE_PROBS, &out->probs, &out_r->probs, 0, 1};
  TRY(check_varlen(ctx, p, in));
  TRY(check_slots(ctx, p, s, n));
  return check_paged(ctx, p, in_r);
}

attn_status attn_validate_backward(attn_ctx *ctx, const attn_problem *p, const attn_inputs *in,
                                   const attn_outputs *fwd, const attn_tensor *dout,
                                   const attn_grads *g, attn_inputs *in_r, attn_outputs *fwd_r,
                                   attn_tensor *dout_r, attn_grads *g_r) {
  if (in == NULL) return INVALID("inputs is NULL");
  if (fwd == NULL) return INVALID("forward is NULL: the backward pass needs out and lse");
  if (dout == NULL) return INVALID("dout is NULL");
  if (g == NULL) return INVALID("grads is NULL");
  if (g->dbias.data != NULL && !p->has_bias)
    return INVALID("dbias is given but the problem has no bias (has_bias=0)");
  if (g->dsinks.data != NULL && p->num_sinks == 0)
    return INVALID("dsinks is given but the problem has no sinks (num_sinks=0)");
  slot s[28];
  int n = input_slots(in, in_r, s);
  *fwd_r = *fwd;
  fwd_r->probs.data = NULL; /* not used by the backward pass */
  *g_r = *g;
  s[n++] = (slot){ATTN_ROLE_OUT, &fwd->out, &fwd_r->out, 1, 0};
  s[n++] = (slot){ATTN_ROLE_LSE, &fwd->lse, &fwd_r->lse, 1, 0};
  s[n++] = (slot){ATTN_ROLE_DOUT, dout, dout_r, 1, 0};
  s[n++] = (slot){ATTN_ROLE_DQ, &g->dq, &g_r->dq, 1, 1};
  s[n++] = (slot){ATTN_ROLE_DK, &g->dk, &g_r->dk, 1, 1};
  s[n++] = (slot){ATTN_ROLE_DV, &g->dv, &g_r->dv, 1, 1};
  s[n++] = (slot){ATTN_ROLE_DBIAS, &g->dbias, &g_r->dbias, 0, 1};
  s[n++] = (slot){ATTN_ROLE_DSINKS, &g->dsinks, &g_r->dsinks, 0, 1};
  TRY(check_varlen(ctx, p, in));
  TRY(check_slots(ctx, p, s, n));
  return check_paged(ctx, p, in_r);
}

attn_status attn_validate_has_backward(attn_ctx *ctx, const attn_problem *p) {
  if (p->dtype == ATTN_DTYPE_F8E4M3)
    return attn_fail(ctx, ATTN_STATUS_UNSUPPORTED,
                     "backward of an f8e4m3 problem is not supported: fp8 attention is an "
                     "inference format here (as FlashAttention-3's), and e4m3 gradients of 3 "
                     "mantissa bits would need scaling rules no one has settled; train in bf16");
  if (p->page_size > 0)
    return attn_fail(ctx, ATTN_STATUS_UNSUPPORTED,
                     "backward of a paged KV cache (page_size=%lld) is not supported: the cache is "
                     "inference state with no gradient; train with dense k and v",
                     (long long)p->page_size);
  return ATTN_STATUS_OK;
}

void attn_device_mismatch(int32_t impl_device, const attn_problem *p, char *why, size_t why_size) {
  if (impl_device == ATTN_DEVICE_CPU)
    attn_format(why, why_size, "runs on the cpu, the problem's tensors are on cuda:%d (device=cuda)",
                (int)p->device_index);
  else if (p->device == ATTN_DEVICE_CPU)
    attn_format(why, why_size, "runs on cuda, the problem's tensors are on the cpu (device=cpu)");
  else /* devices this version does not know: their numbers are all there is to say */
    attn_format(why, why_size, "runs on device %d, the problem's tensors are on device=%d",
                (int)impl_device, (int)p->device);
}
