/*
 * src/impl/cudnn/cudnn_graph.c - the forward and backward attention graphs of cuDNN's fused SDPA
 * engines, built descriptor by descriptor through the backend API.
 *
 * The graphs follow cudnn-frontend's composite SDPA nodes operation for operation (the order, the
 * compute types and the intermediate data types are what cuDNN's pattern matcher recognises), so
 * the heuristics offer the fused flash-attention engine (the deterministic backward on Blackwell
 * names its engine instead, as cudnn-frontend does). Each builder call is a no-op once an
 * earlier call failed: the first failure, with its expression, file and line, is what the user
 * reads.
 */
#include "impl/cudnn/cudnn_graph.h"

#include "core/ctx.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define CG_MAX_DESCRIPTORS 512
#define CG_MAX_OPS 96
#define CG_MAX_SCALARS 32
#define CG_MAX_ENGINE_CONFIGS 16
#define CG_SCALAR_UID0 100   /* by-value scalars take uids from here */
#define CG_VIRTUAL_UID0 1000 /* virtual tensors from here */

typedef union cg_scalar {
  float f;
  int32_t i;
} cg_scalar;

struct cg_graph {
  cg_spec spec;
  cudnnBackendDescriptor_t desc[CG_MAX_DESCRIPTORS]; /* every descriptor, destroyed in reverse */
  int ndesc;
  cudnnBackendDescriptor_t ops[CG_MAX_OPS];
  int nops;
  cudnnBackendDescriptor_t plan;
  int64_t workspace;
  int bound[CG_UID_COUNT];               /* which CG_UID_* tensors the graph reads or writes */
  cg_scalar scalar[CG_MAX_SCALARS];      /* values of the by-value scalars, read at execution */
  int nscalars;
  int64_t next_virtual_uid;
  cg_err *err;
  /* Held while a run is queued: a graph is shared by plans (cudnn_cache.c), and cuDNN's backend
   * has known thread-safety limits when one execution plan is executed from several threads. */
  pthread_mutex_t run_lock;
  int run_lock_made;
};

/* ---- errors ----------------------------------------------------------------------------------- */

static attn_status status_of(cudnnStatus_t s) {
  int group = (int)s / 1000;
  if (s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
      s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
    return ATTN_STATUS_OUT_OF_MEMORY;
  if (group == 3) return ATTN_STATUS_UNSUPPORTED;
  if (group == 5) return ATTN_STATUS_DEVICE_ERROR;
  return ATTN_STATUS_INTERNAL;
}

int attn_cudnn_check(cg_err *err, cudnnStatus_t status, const char *expr, const char *file,
                     int line) {
  if (status == CUDNN_STATUS_SUCCESS) return 0;
  if (err->status == ATTN_STATUS_OK) {
    char last[512] = "";
    cudnnGetLastErrorString(last, sizeof last);
    err->status = status_of(status);
    attn_format(err->why, err->why_size, "%s failed: %s (%s:%d)%s%s", expr,
                cudnnGetErrorString(status), file, line, last[0] ? ": " : "", last);
  }
  return 1;
}

#define CK(g, expr) ATTN_CUDNN_CHECK((g)->err, expr)

/* ---- descriptors ------------------------------------------------------------------------------ */

static cudnnBackendDescriptor_t make(cg_graph *g, cudnnBackendDescriptorType_t type) {
  cudnnBackendDescriptor_t d = NULL;
  if (g->err->status != ATTN_STATUS_OK) return NULL;
  if (g->ndesc == CG_MAX_DESCRIPTORS) {
    g->err->status = ATTN_STATUS_INTERNAL;
    attn_format(g->err->why, g->err->why_size, "graph needs more than %d descriptors",
                CG_MAX_DESCRIPTORS);
    return NULL;
  }
  if (CK(g, cudnnBackendCreateDescriptor(type, &d))) return NULL;
  g->desc[g->ndesc++] = d;
  return d;
}

static void set(cg_graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendAttributeType_t type, int64_t count, const void *value) {
  CK(g, cudnnBackendSetAttribute(d, name, type, count, value));
}

static void finalize(cg_graph *g, cudnnBackendDescriptor_t d) { CK(g, cudnnBackendFinalize(d)); }

static cudnnDataType_t cudnn_type(int32_t dtype) {
  return dtype == ATTN_DTYPE_F8E4M3 ? CUDNN_DATA_FP8_E4M3
         : dtype == ATTN_DTYPE_BF16 ? CUDNN_DATA_BFLOAT16
                                    : CUDNN_DATA_HALF;
}

/* The type of q, k and v (and of every tensor of the backward graph, which is never fp8). */
static cudnnDataType_t io_type(const cg_spec *s) { return cudnn_type(s->dtype); }

static int is_fp8(const cg_spec *s) { return s->dtype == ATTN_DTYPE_F8E4M3; }

/* A tensor descriptor; uid 0 takes the next virtual uid. */
static cudnnBackendDescriptor_t tensor(cg_graph *g, int64_t uid, cudnnDataType_t type,
                                       const int64_t dims[4], const int64_t strides[4],
                                       bool is_virtual, bool by_value) {
  cudnnBackendDescriptor_t d = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  int64_t alignment = 16;
  if (uid == 0) uid = g->next_virtual_uid++;
  if (!is_virtual && !by_value && uid < CG_UID_COUNT) g->bound[uid] = 1;
  set(g, d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  set(g, d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
  set(g, d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
  set(g, d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  set(g, d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  set(g, d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  if (by_value) set(g, d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
  finalize(g, d);
  return d;
}

static const int64_t one4[4] = {1, 1, 1, 1};

static cudnnBackendDescriptor_t scalar(cg_graph *g, cudnnDataType_t type, cg_scalar value) {
  if (g->nscalars == CG_MAX_SCALARS) {
    if (g->err->status == ATTN_STATUS_OK) {
      g->err->status = ATTN_STATUS_INTERNAL;
      attn_format(g->err->why, g->err->why_size, "graph needs more than %d scalars",
                  CG_MAX_SCALARS);
    }
    return NULL;
  }
  int64_t uid = CG_SCALAR_UID0 + g->nscalars;
  g->scalar[g->nscalars++] = value;
  return tensor(g, uid, type, one4, one4, false, true);
}

static cudnnBackendDescriptor_t scalar_f32(cg_graph *g, float v) {
  cg_scalar s;
  s.f = v;
  return scalar(g, CUDNN_DATA_FLOAT, s);
}

static cudnnBackendDescriptor_t scalar_i32(cg_graph *g, int32_t v) {
  cg_scalar s;
  s.i = v;
  return scalar(g, CUDNN_DATA_INT32, s);
}

static cudnnBackendDescriptor_t virt(cg_graph *g, cudnnDataType_t type, const int64_t dims[4],
                                     const int64_t strides[4]) {
  return tensor(g, 0, type, dims, strides, true, false);
}

/* An f32 [1, 1, 1, 1] tensor the run binds: an fp8 graph's factors and amax outputs. */
static cudnnBackendDescriptor_t unit_tensor(cg_graph *g, int64_t uid) {
  return tensor(g, uid, CUDNN_DATA_FLOAT, one4, one4, false, false);
}

static void add_op(cg_graph *g, cudnnBackendDescriptor_t op) {
  if (g->err->status != ATTN_STATUS_OK) return;
  if (g->nops == CG_MAX_OPS) {
    g->err->status = ATTN_STATUS_INTERNAL;
    attn_format(g->err->why, g->err->why_size, "graph needs more than %d operations", CG_MAX_OPS);
    return;
  }
  g->ops[g->nops++] = op;
}

/* y = mode(x, b, t) computed in `math`; y is given or made virtual with x's shape. */
static cudnnBackendDescriptor_t pointwise(cg_graph *g, cudnnPointwiseMode_t mode,
                                          cudnnDataType_t math, int64_t axis,
                                          cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                          cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t pw = make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
  if (mode == CUDNN_POINTWISE_GEN_INDEX)
    set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
  finalize(g, pw);
  cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
  set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  if (b != NULL) set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
  if (t != NULL) set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
  set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  finalize(g, op);
  add_op(g, op);
  return y;
}

static void matmul(cg_graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                   cudnnBackendDescriptor_t c, cudnnBackendDescriptor_t m_override,
                   cudnnBackendDescriptor_t n_override, cudnnBackendDescriptor_t k_override) {
  cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t mm = make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
  finalize(g, mm);
  cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
  set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
  set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
  set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm);
  if (m_override != NULL)
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
        &m_override);
  if (n_override != NULL)
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
        &n_override);
  if (k_override != NULL)
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
        &k_override);
  finalize(g, op);
  add_op(g, op);
}

static void reduction(cg_graph *g, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                      cudnnBackendDescriptor_t y) {
  cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t rd = make(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  set(g, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
  set(g, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
  finalize(g, rd);
  cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd);
  finalize(g, op);
  add_op(g, op);
}

static void reshape(cg_graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  finalize(g, op);
  add_op(g, op);
}

/* ---- the score modifiers (cudnn-frontend's attn_score_modifiers.h, in the same order) --------- */

typedef struct cg_shapes {
  int64_t s_dims[4], s_str[4]; /* scores [b, hq, tq, tk] */
  int64_t r_dims[4], r_str[4]; /* row statistics [b, hq, tq, 1] */
} cg_shapes;

static float negative_infinity(const cg_spec *s) {
  /* cuDNN before 9.10 prefers the lowest finite value for masked scores. */
  return s->version < 91000 ? -FLT_MAX : -INFINITY;
}

/* A fresh virtual tensor shaped like the scores. */
static cudnnBackendDescriptor_t s_like(cg_graph *g, const cg_shapes *sh, cudnnDataType_t type) {
  return virt(g, type, sh->s_dims, sh->s_str);
}

static cudnnBackendDescriptor_t gen_index(cg_graph *g, const cg_shapes *sh,
                                          cudnnBackendDescriptor_t x, int64_t axis,
                                          cudnnDataType_t math) {
  return pointwise(g, CUDNN_POINTWISE_GEN_INDEX, math, axis, x, NULL, NULL,
                   s_like(g, sh, CUDNN_DATA_INT32));
}

/* s = select(mask, s, -inf) */
static cudnnBackendDescriptor_t select_masked(cg_graph *g, const cg_shapes *sh,
                                              cudnnBackendDescriptor_t s,
                                              cudnnBackendDescriptor_t keep) {
  return pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, 0, s,
                   scalar_f32(g, negative_infinity(&g->spec)), keep,
                   s_like(g, sh, CUDNN_DATA_FLOAT));
}

static cudnnBackendDescriptor_t padding_mask(cg_graph *g, const cg_shapes *sh,
                                             cudnnBackendDescriptor_t s,
                                             cudnnBackendDescriptor_t seq_q,
                                             cudnnBackendDescriptor_t seq_kv) {
  cudnnBackendDescriptor_t row = gen_index(g, sh, s, 2, CUDNN_DATA_INT32);
  cudnnBackendDescriptor_t col = gen_index(g, sh, s, 3, CUDNN_DATA_INT32);
  cudnnBackendDescriptor_t row_ok = pointwise(g, CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, 0, row,
                                              seq_q, NULL, s_like(g, sh, CUDNN_DATA_BOOLEAN));
  cudnnBackendDescriptor_t col_ok = pointwise(g, CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, 0, col,
                                              seq_kv, NULL, s_like(g, sh, CUDNN_DATA_BOOLEAN));
  cudnnBackendDescriptor_t keep = pointwise(g, CUDNN_POINTWISE_LOGICAL_AND, CUDNN_DATA_BOOLEAN, 0,
                                            row_ok, col_ok, NULL, s_like(g, sh, CUDNN_DATA_BOOLEAN));
  return select_masked(g, sh, s, keep);
}

static cudnnBackendDescriptor_t alibi(cg_graph *g, const cg_shapes *sh, cudnnBackendDescriptor_t s) {
  const cg_spec *sp = &g->spec;
  cudnnBackendDescriptor_t row = gen_index(g, sh, s, 2, CUDNN_DATA_INT32);
  cudnnBackendDescriptor_t col = gen_index(g, sh, s, 3, CUDNN_DATA_INT32);
  cudnnBackendDescriptor_t dist = pointwise(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_INT32, 0, col, row,
                                            NULL, s_like(g, sh, CUDNN_DATA_INT32));
  int64_t dims[4] = {1, sp->hq, 1, 1};
  int64_t str[4] = {sp->hq * sp->alibi_stride, sp->alibi_stride, 1, 1};
  cudnnBackendDescriptor_t slopes = tensor(g, CG_UID_ALIBI, CUDNN_DATA_FLOAT, dims, str, false, false);
  cudnnBackendDescriptor_t bias = pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, 0, dist,
                                            slopes, NULL, s_like(g, sh, CUDNN_DATA_FLOAT));
  return pointwise(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, 0, s, bias, NULL,
                   s_like(g, sh, CUDNN_DATA_FLOAT));
}

/* The causal / sliding-window band. SPEC.md keeps key j of row i when
 * i + o - left <= j <= i + o + right; cuDNN's right bound keeps row + o + right >= col and its left
 * bound keeps col + left_bound - o > row, so left_bound = left + 1. */
static cudnnBackendDescriptor_t window(cg_graph *g, const cg_shapes *sh, cudnnBackendDescriptor_t s,
                                       cudnnBackendDescriptor_t seq_q,
                                       cudnnBackendDescriptor_t seq_kv) {
  const cg_spec *sp = &g->spec;
  if (sp->right >= 0) {
    cudnnBackendDescriptor_t row = gen_index(g, sh, s, 2, CUDNN_DATA_FLOAT);
    cudnnBackendDescriptor_t col = gen_index(g, sh, s, 3, CUDNN_DATA_FLOAT);
    if (!sp->top_left) {
      cudnnBackendDescriptor_t skv = seq_kv != NULL ? seq_kv : scalar_i32(g, (int32_t)sp->tk);
      cudnnBackendDescriptor_t sq = seq_q != NULL ? seq_q : scalar_i32(g, (int32_t)sp->tq);
      row = pointwise(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_INT32, 0, row, skv, NULL,
                      s_like(g, sh, CUDNN_DATA_INT32));
      row = pointwise(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_INT32, 0, row, sq, NULL,
                      s_like(g, sh, CUDNN_DATA_INT32));
    }
    if (sp->right != 0)
      row = pointwise(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_INT32, 0, row,
                      scalar_i32(g, (int32_t)sp->right), NULL, s_like(g, sh, CUDNN_DATA_INT32));
    cudnnBackendDescriptor_t keep = pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, 0, row,
                                              col, NULL, s_like(g, sh, CUDNN_DATA_BOOLEAN));
    s = select_masked(g, sh, s, keep);
  }
  if (sp->left >= 0) {
    cudnnBackendDescriptor_t row = gen_index(g, sh, s, 2, CUDNN_DATA_FLOAT);
    cudnnBackendDescriptor_t col = gen_index(g, sh, s, 3, CUDNN_DATA_FLOAT);
    int64_t bound = sp->left + 1;
    if (sp->top_left || (seq_q == NULL && seq_kv == NULL)) {
      float shift = (float)(sp->top_left ? bound : bound - sp->tk + sp->tq);
      col = pointwise(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, 0, col, scalar_f32(g, shift), NULL,
                      s_like(g, sh, CUDNN_DATA_FLOAT));
    } else {
      col = pointwise(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_INT32, 0, col,
                      scalar_i32(g, (int32_t)bound), NULL, s_like(g, sh, CUDNN_DATA_INT32));
      col = pointwise(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_INT32, 0, col, seq_kv, NULL,
                      s_like(g, sh, CUDNN_DATA_INT32));
      col = pointwise(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_INT32, 0, col, seq_q, NULL,
                      s_like(g, sh, CUDNN_DATA_INT32));
    }
    cudnnBackendDescriptor_t keep = pointwise(g, CUDNN_POINTWISE_CMP_GT, CUDNN_DATA_BOOLEAN, 0, col,
                                              row, NULL, s_like(g, sh, CUDNN_DATA_BOOLEAN));
    s = select_masked(g, sh, s, keep);
  }
  return s;
}

/* scale, bias, ALiBi and the padding mask: the modifiers both passes apply before the softmax. */
static cudnnBackendDescriptor_t modifiers(cg_graph *g, const cg_shapes *sh,
                                          cudnnBackendDescriptor_t s,
                                          cudnnBackendDescriptor_t seq_q,
                                          cudnnBackendDescriptor_t seq_kv) {
  const cg_spec *sp = &g->spec;
  s = pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, 0, s, scalar_f32(g, sp->scale), NULL,
                s_like(g, sh, CUDNN_DATA_FLOAT));
  if (is_fp8(sp)) { /* dq dk of docs/FP8.md, where cudnn-frontend's fp8 node multiplies them */
    s = pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, 0, s, unit_tensor(g, CG_UID_DESCALE_Q),
                  NULL, s_like(g, sh, CUDNN_DATA_FLOAT));
    s = pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, 0, s, unit_tensor(g, CG_UID_DESCALE_K),
                  NULL, s_like(g, sh, CUDNN_DATA_FLOAT));
  }
  if (sp->has_bias) {
    cudnnBackendDescriptor_t bias =
        tensor(g, CG_UID_BIAS, io_type(sp), sp->bias_dims, sp->st.bias, false, false);
    s = pointwise(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, 0, s, bias, NULL,
                  s_like(g, sh, CUDNN_DATA_FLOAT));
  }
  if (sp->alibi) s = alibi(g, sh, s);
  if (seq_q != NULL) s = padding_mask(g, sh, s, seq_q, seq_kv);
  return s;
}

/* ---- the two graphs --------------------------------------------------------------------------- */

static void shapes_of(const cg_spec *s, cg_shapes *sh) {
  int64_t sd[4] = {s->b, s->hq, s->tq, s->tk};
  int64_t ss[4] = {s->hq * s->tq * s->tk, s->tq * s->tk, s->tk, 1};
  int64_t rd[4] = {s->b, s->hq, s->tq, 1};
  int64_t rs[4] = {s->hq * s->tq, s->tq, 1, 1};
  memcpy(sh->s_dims, sd, sizeof sd);
  memcpy(sh->s_str, ss, sizeof ss);
  memcpy(sh->r_dims, rd, sizeof rd);
  memcpy(sh->r_str, rs, sizeof rs);
}

static void seq_tensors(cg_graph *g, cudnnBackendDescriptor_t *seq_q,
                        cudnnBackendDescriptor_t *seq_kv) {
  *seq_q = *seq_kv = NULL;
  if (!g->spec.padded) return;
  int64_t dims[4] = {g->spec.b, 1, 1, 1};
  *seq_q = tensor(g, CG_UID_SEQ_Q, CUDNN_DATA_INT32, dims, one4, false, false);
  *seq_kv = tensor(g, CG_UID_SEQ_KV, CUDNN_DATA_INT32, dims, one4, false, false);
}

/* ---- the paged KV cache ----------------------------------------------------------------------- */

/* y = the keys (or values) of every sequence gathered from the pages of container through the block
 * table, as a virtual tensor of dims and strides that the matmul reads like dense K^T (or V):
 * cuDNN's paged cache load (9.5+), which takes each sequence's length from seq_kv. cudnn-frontend's
 * composite SDPA node wires it the same way (node/paged_cache_load.h; its paged branch of
 * scaled_dot_product_flash_attention.h): container [pages, h, page_size, d], page table
 * [b, 1, ceil(s_kv / page_size), 1], y of K in the [b, h, d, s] order of K^T. */
static cudnnBackendDescriptor_t paged_load(cg_graph *g, cudnnBackendDescriptor_t container,
                                           cudnnBackendDescriptor_t table,
                                           cudnnBackendDescriptor_t seq_kv, const int64_t dims[4],
                                           const int64_t strides[4]) {
#if CUDNN_VERSION >= 90500
  cudnnBackendDescriptor_t y = virt(g, io_type(&g->spec), dims, strides);
  cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_PAGED_CACHE_LOAD_DESCRIPTOR);
  set(g, op, CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_CONTAINER_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
      &container);
  set(g, op, CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_PAGE_TABLE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
      1, &table);
  set(g, op, CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_SEQUENCE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
      &seq_kv);
  set(g, op, CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  finalize(g, op);
  add_op(g, op);
  return y;
#else
  (void)container, (void)table, (void)seq_kv, (void)dims, (void)strides;
  if (g->err->status == ATTN_STATUS_OK) {
    g->err->status = ATTN_STATUS_UNSUPPORTED;
    attn_format(g->err->why, g->err->why_size,
                "page_size=%lld: this library was built against cuDNN %d's headers, which have no "
                "paged cache load (cuDNN 9.5 or newer)",
                (long long)g->spec.page_size, CUDNN_VERSION);
  }
  return NULL;
#endif
}

/* The containers of a paged problem and its page table (the one table serves K and V). */
static void paged_inputs(cg_graph *g, cudnnBackendDescriptor_t *k_pool,
                         cudnnBackendDescriptor_t *v_pool, cudnnBackendDescriptor_t *table) {
  const cg_spec *s = &g->spec;
  int64_t kc_dims[4] = {s->num_pages, s->hkv, s->page_size, s->d};
  int64_t vc_dims[4] = {s->num_pages, s->hkv, s->page_size, s->dv};
  int64_t t_dims[4] = {s->b, 1, (s->tk + s->page_size - 1) / s->page_size, 1};
  *k_pool = tensor(g, CG_UID_K, io_type(s), kc_dims, s->st.k, false, false);
  *v_pool = tensor(g, CG_UID_V, io_type(s), vc_dims, s->st.v, false, false);
  *table = tensor(g, CG_UID_PAGE_TABLE, CUDNN_DATA_INT32, t_dims, s->st.table, false, false);
}

/* The end of the fp8 forward graph, after the statistics: cudnn-frontend's fp8 SDPA node (softmax,
 * amax_s, scale_s, then its matmul_fp8 node: P V, descale_s, descale_v, amax_o, scale_o), op for
 * op. P = ex / sum stays f32 for its amax (an output cuDNN requires; nobody reads it), is scaled by
 * CG_FP8_P_SCALE into e4m3 for the product, and the product is divided by that scale and
 * multiplied by dv (descale_s, descale_v); scale_o is 1, out being bf16 or f16. */
static void fp8_output(cg_graph *g, const cg_shapes *sh, cudnnBackendDescriptor_t ex,
                       cudnnBackendDescriptor_t sum, cudnnBackendDescriptor_t v,
                       cudnnBackendDescriptor_t o, cudnnBackendDescriptor_t seq_q,
                       cudnnBackendDescriptor_t seq_kv) {
  const cg_spec *s = &g->spec;
  cudnnBackendDescriptor_t p = pointwise(g, CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, 0, ex, sum, NULL,
                                         s_like(g, sh, CUDNN_DATA_FLOAT));
  reduction(g, CUDNN_REDUCE_TENSOR_AMAX, p, unit_tensor(g, CG_UID_AMAX_S));
  p = pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, 0, p, unit_tensor(g, CG_UID_SCALE_S),
                NULL, s_like(g, sh, CUDNN_DATA_FP8_E4M3));
  int64_t o_dims[4] = {s->b, s->hq, s->tq, s->dv};
  int64_t o_str[4] = {s->hq * s->tq * s->dv, s->tq * s->dv, s->dv, 1};
  cudnnBackendDescriptor_t pv = virt(g, CUDNN_DATA_FLOAT, o_dims, o_str);
  matmul(g, p, v, pv, seq_q, NULL, seq_kv);
  pv = pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, 0, pv, unit_tensor(g, CG_UID_DESCALE_S),
                 NULL, virt(g, CUDNN_DATA_FLOAT, o_dims, o_str));
  pv = pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, 0, pv, unit_tensor(g, CG_UID_DESCALE_V),
                 NULL, virt(g, CUDNN_DATA_FLOAT, o_dims, o_str));
  pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, 0, pv, unit_tensor(g, CG_UID_SCALE_O), NULL,
            o);
  reduction(g, CUDNN_REDUCE_TENSOR_AMAX, pv, unit_tensor(g, CG_UID_AMAX_O));
}

static void build_forward(cg_graph *g) {
  const cg_spec *s = &g->spec;
  const cg_layout *st = &s->st;
  cudnnDataType_t io = io_type(s);
  cg_shapes sh;
  shapes_of(s, &sh);
  int64_t q_dims[4] = {s->b, s->hq, s->tq, s->d};
  int64_t kt_dims[4] = {s->b, s->hkv, s->d, s->tk};
  int64_t v_dims[4] = {s->b, s->hkv, s->tk, s->dv};
  int64_t o_dims[4] = {s->b, s->hq, s->tq, s->dv};
  cudnnBackendDescriptor_t q = tensor(g, CG_UID_Q, io, q_dims, st->q, false, false);
  cudnnBackendDescriptor_t kt = NULL, v = NULL, k_pool = NULL, v_pool = NULL, table = NULL;
  if (s->page_size > 0) {
    paged_inputs(g, &k_pool, &v_pool, &table);
  } else {
    int64_t kt_str[4] = {st->k[0], st->k[1], st->k[3], st->k[2]};
    kt = tensor(g, CG_UID_K, io, kt_dims, kt_str, false, false);
    v = tensor(g, CG_UID_V, io, v_dims, st->v, false, false);
  }
  cudnnBackendDescriptor_t o =
      tensor(g, CG_UID_O, cudnn_type(s->out_dtype), o_dims, st->o, false, false);
  cudnnBackendDescriptor_t stats =
      tensor(g, CG_UID_STATS, CUDNN_DATA_FLOAT, sh.r_dims, st->lse, false, false);
  cudnnBackendDescriptor_t seq_q, seq_kv;
  seq_tensors(g, &seq_q, &seq_kv);
  if (s->page_size > 0) { /* K^T gathered into a dense virtual tensor [b, h, d, s] */
    int64_t kt_str[4] = {s->hkv * s->d * s->tk, s->d * s->tk, 1, s->d};
    kt = paged_load(g, k_pool, table, seq_kv, kt_dims, kt_str);
  }

  cudnnBackendDescriptor_t sc = s_like(g, &sh, CUDNN_DATA_FLOAT);
  matmul(g, q, kt, sc, seq_q, seq_kv, NULL);
  sc = modifiers(g, &sh, sc, seq_q, seq_kv);
  sc = window(g, &sh, sc, seq_q, seq_kv);

  /* softmax with its statistics: lse = max + log(sum exp(s - max)) */
  cudnnBackendDescriptor_t mx = virt(g, CUDNN_DATA_FLOAT, sh.r_dims, sh.r_str);
  reduction(g, CUDNN_REDUCE_TENSOR_MAX, sc, mx);
  cudnnBackendDescriptor_t sub = pointwise(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, 0, sc, mx,
                                           NULL, s_like(g, &sh, CUDNN_DATA_FLOAT));
  cudnnBackendDescriptor_t ex = pointwise(g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, 0, sub, NULL,
                                          NULL, s_like(g, &sh, CUDNN_DATA_FLOAT));
  cudnnBackendDescriptor_t sum = virt(g, CUDNN_DATA_FLOAT, sh.r_dims, sh.r_str);
  reduction(g, CUDNN_REDUCE_TENSOR_ADD, ex, sum);
  cudnnBackendDescriptor_t lg = pointwise(g, CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, 0, sum, NULL,
                                          NULL, virt(g, CUDNN_DATA_FLOAT, sh.r_dims, sh.r_str));
  pointwise(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, 0, mx, lg, NULL, stats);
  if (is_fp8(s)) {
    fp8_output(g, &sh, ex, sum, v, o, seq_q, seq_kv);
    return;
  }
  /* P is rounded to the input type before P V, as the fused kernels do. */
  cudnnBackendDescriptor_t p = pointwise(g, CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, 0, ex, sum, NULL,
                                         s_like(g, &sh, io));
  if (s->page_size > 0) { /* V gathered into [b, h, s, d], where cudnn-frontend loads it */
    int64_t v_str[4] = {s->hkv * s->tk * s->dv, s->tk * s->dv, s->dv, 1};
    v = paged_load(g, v_pool, table, seq_kv, v_dims, v_str);
  }
  matmul(g, p, v, o, seq_q, NULL, seq_kv);
}

/* dX of a GQA group: the full-head product reduced over the query heads of each KV head. */
static void grouped_matmul(cg_graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                           cudnnBackendDescriptor_t out, int64_t width,
                           cudnnBackendDescriptor_t m_override,
                           cudnnBackendDescriptor_t k_override) {
  const cg_spec *s = &g->spec;
  if (s->hq == s->hkv) {
    matmul(g, a, b, out, m_override, NULL, k_override);
    return;
  }
  int64_t dims[4] = {s->b, s->hq, s->tk, width};
  int64_t str[4] = {s->hq * s->tk * width, s->tk * width, width, 1};
  cudnnBackendDescriptor_t full = virt(g, io_type(s), dims, str);
  matmul(g, a, b, full, m_override, NULL, k_override);
  reduction(g, CUDNN_REDUCE_TENSOR_ADD, full, out);
}

static void build_backward(cg_graph *g) {
  const cg_spec *s = &g->spec;
  const cg_layout *st = &s->st;
  cudnnDataType_t io = io_type(s);
  cg_shapes sh;
  shapes_of(s, &sh);
  int64_t q_dims[4] = {s->b, s->hq, s->tq, s->d};
  int64_t kt_dims[4] = {s->b, s->hkv, s->d, s->tk};
  int64_t kt_str[4] = {st->k[0], st->k[1], st->k[3], st->k[2]};
  int64_t vt_dims[4] = {s->b, s->hkv, s->dv, s->tk};
  int64_t vt_str[4] = {st->v[0], st->v[1], st->v[3], st->v[2]};
  int64_t o_dims[4] = {s->b, s->hq, s->tq, s->dv};
  int64_t k_dims[4] = {s->b, s->hkv, s->tk, s->d};
  int64_t v_dims[4] = {s->b, s->hkv, s->tk, s->dv};
  cudnnBackendDescriptor_t q = tensor(g, CG_UID_Q, io, q_dims, st->q, false, false);
  cudnnBackendDescriptor_t kt = tensor(g, CG_UID_K, io, kt_dims, kt_str, false, false);
  cudnnBackendDescriptor_t vt = tensor(g, CG_UID_V, io, vt_dims, vt_str, false, false);
  cudnnBackendDescriptor_t o = tensor(g, CG_UID_O, io, o_dims, st->o, false, false);
  cudnnBackendDescriptor_t stats =
      tensor(g, CG_UID_STATS, CUDNN_DATA_FLOAT, sh.r_dims, st->lse, false, false);
  cudnnBackendDescriptor_t dout = tensor(g, CG_UID_DO, io, o_dims, st->dout, false, false);
  cudnnBackendDescriptor_t dq = tensor(g, CG_UID_DQ, io, q_dims, st->dq, false, false);
  cudnnBackendDescriptor_t dk = tensor(g, CG_UID_DK, io, k_dims, st->dk, false, false);
  cudnnBackendDescriptor_t dv = tensor(g, CG_UID_DV, io, v_dims, st->dv, false, false);
  cudnnBackendDescriptor_t seq_q, seq_kv;
  seq_tensors(g, &seq_q, &seq_kv);

  /* softmax_sum = rowsum(dO * O): Delta of SPEC.md, kept in the workspace */
  int64_t t_str[4] = {s->hq * s->tq * s->dv, s->tq * s->dv, s->hq * s->dv, 1};
  cudnnBackendDescriptor_t t = pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, 0, dout, o, NULL,
                                         virt(g, CUDNN_DATA_FLOAT, o_dims, t_str));
  cudnnBackendDescriptor_t rs = virt(g, CUDNN_DATA_FLOAT, sh.r_dims, sh.r_str);
  reduction(g, CUDNN_REDUCE_TENSOR_ADD, t, rs);
  cudnnBackendDescriptor_t delta =
      tensor(g, CG_UID_SOFTMAX_SUM, CUDNN_DATA_FLOAT, sh.r_dims, sh.r_str, false, false);
  pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, 0, rs, scalar_f32(g, 1.0f), NULL, delta);

  /* P = exp(s - lse) */
  cudnnBackendDescriptor_t sc = s_like(g, &sh, CUDNN_DATA_FLOAT);
  matmul(g, q, kt, sc, seq_q, seq_kv, NULL);
  sc = modifiers(g, &sh, sc, seq_q, seq_kv);
  sc = pointwise(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, 0, sc, stats, NULL,
                 s_like(g, &sh, CUDNN_DATA_FLOAT));
  if (seq_q != NULL && s->version >= 90000 && s->version < 91000)
    sc = padding_mask(g, &sh, sc, seq_q, seq_kv); /* cuDNN 9.0-9.9 wants it again after lse */
  sc = window(g, &sh, sc, seq_q, seq_kv);
  cudnnBackendDescriptor_t p = pointwise(g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, 0, sc, NULL,
                                         NULL, s_like(g, &sh, CUDNN_DATA_FLOAT));

  /* dV = P^T dO */
  int64_t tr_dims[4] = {s->b, s->hq, s->tk, s->tq};
  int64_t tr_str[4] = {s->hq * s->tq * s->tk, s->tq * s->tk, 1, s->tk};
  cudnnBackendDescriptor_t pt = virt(g, io, tr_dims, tr_str);
  reshape(g, p, pt);
  grouped_matmul(g, pt, dout, dv, s->dv, seq_kv, seq_q);

  /* dS = P * (dO V^T - Delta) */
  cudnnBackendDescriptor_t dp = s_like(g, &sh, CUDNN_DATA_FLOAT);
  matmul(g, dout, vt, dp, seq_q, seq_kv, NULL);
  dp = pointwise(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, 0, dp, delta, NULL,
                 s_like(g, &sh, CUDNN_DATA_FLOAT));
  cudnnBackendDescriptor_t ds = pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, 0, dp, p, NULL,
                                          s_like(g, &sh, CUDNN_DATA_FLOAT));
  if (s->with_dbias) {
    cudnnBackendDescriptor_t dbias =
        tensor(g, CG_UID_DBIAS, io, s->bias_dims, st->dbias, false, false);
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, ds, dbias);
  }
  ds = pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, 0, ds, scalar_f32(g, s->scale), NULL,
                 s_like(g, &sh, CUDNN_DATA_FLOAT));

  /* dK = s dS^T Q */
  cudnnBackendDescriptor_t dst = virt(g, io, tr_dims, tr_str);
  reshape(g, ds, dst);
  grouped_matmul(g, dst, q, dk, s->d, seq_kv, seq_q);

  /* dQ = s dS K: added into an f32 accumulator in the workspace, or written by its own product
   * (the dP workspace path: dbias, or the deterministic algorithm); see cg_dq_accumulated */
  int64_t k_str[4] = {st->k[0], st->k[1], st->k[2], st->k[3]};
  cudnnBackendDescriptor_t k = virt(g, io, k_dims, k_str);
  reshape(g, kt, k);
  if (cg_dq_accumulated(s)) {
    int64_t acc_str[4] = {s->hq * s->tq * s->d, s->tq * s->d, s->d, 1};
    cudnnBackendDescriptor_t acc =
        tensor(g, CG_UID_DQ_ACCUM, CUDNN_DATA_FLOAT, q_dims, acc_str, false, false);
    matmul(g, ds, k, acc, seq_q, NULL, seq_kv);
    pointwise(g, CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, 0, acc, NULL, NULL, dq);
  } else {
    matmul(g, ds, k, dq, seq_q, NULL, seq_kv);
  }
}

/* ---- the deterministic Blackwell engine ------------------------------------------------------- */

typedef struct cg_knob {
  cudnnBackendKnobType_t type;
  int64_t value;
} cg_knob;

/* On Blackwell (sm10x) the heuristics do not offer a deterministic engine for the backward graph:
 * cudnn-frontend (>= 1.17, for cuDNN >= 9.18; CompositeSDPABackwardNode::override_heuristics_query)
 * skips them and names the engine's global index and its knobs. These are its values (from cuDNN
 * 9.23 the same kernel is chosen by another set of knobs). Returns the engine index, or -1 where
 * the heuristics choose, and the knobs. */
static int64_t pinned_engine(const cg_spec *s, const cg_knob **knobs, int *nknobs) {
  static const cg_knob before_9_23[] = {{CUDNN_KNOB_TYPE_KERNEL_CFG, 31},
                                        {CUDNN_KNOB_TYPE_STAGES, 2}};
#if CUDNN_VERSION >= 90700 /* where the headers name TILE_M, TILE_N and STREAM_K */
  static const cg_knob since_9_23[] = {
      {CUDNN_KNOB_TYPE_TILE_M, 3},        {CUDNN_KNOB_TYPE_TILE_N, 2},
      {CUDNN_KNOB_TYPE_KERNEL_CFG, 2},    {CUDNN_KNOB_TYPE_STREAM_K, 0},
      {CUDNN_KNOB_TYPE_TILE_CGA_M, 0},    {CUDNN_KNOB_TYPE_STAGES, 2}};
#endif
  *knobs = NULL, *nknobs = 0;
  if (!s->backward || !s->deterministic || s->sm / 10 != 10) return -1;
  if (s->version < 92300) {
    *knobs = before_9_23, *nknobs = (int)(sizeof before_9_23 / sizeof before_9_23[0]);
  } else {
#if CUDNN_VERSION >= 90700
    *knobs = since_9_23, *nknobs = (int)(sizeof since_9_23 / sizeof since_9_23[0]);
#endif
  }
  return s->sm > 103 ? 17 : 5;
}

/* The engine configuration of a pinned engine and its knobs, or NULL with g->err set. */
static cudnnBackendDescriptor_t pinned_config(cg_graph *g, cudnnBackendDescriptor_t graph,
                                              int64_t index, const cg_knob *knobs, int nknobs) {
  if (knobs == NULL) {
    g->err->status = ATTN_STATUS_UNSUPPORTED;
    attn_format(g->err->why, g->err->why_size,
                "cuDNN %d's deterministic Blackwell engine takes knobs that the cuDNN headers this "
                "library was built with (%d) do not name: rebuild against cuDNN 9.7 or newer",
                (int)g->spec.version, CUDNN_VERSION);
    return NULL;
  }
  cudnnBackendDescriptor_t engine = make(g, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  set(g, engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
  set(g, engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &index);
  finalize(g, engine);
  cudnnBackendDescriptor_t choices[8];
  for (int i = 0; i < nknobs; ++i) {
    choices[i] = make(g, CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR);
    set(g, choices[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &knobs[i].type);
    set(g, choices[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &knobs[i].value);
    finalize(g, choices[i]);
  }
  cudnnBackendDescriptor_t cfg = make(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  set(g, cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &engine);
  set(g, cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, nknobs, choices);
  finalize(g, cfg);
  return g->err->status == ATTN_STATUS_OK ? cfg : NULL;
}

/* ---- plan ------------------------------------------------------------------------------------- */

/* The handle attributes are deprecated since cuDNN 9.8 but still needed by earlier 9.x releases. */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
static const cudnnBackendAttributeName_t graph_handle_attr = CUDNN_ATTR_OPERATIONGRAPH_HANDLE;
static const cudnnBackendAttributeName_t plan_handle_attr = CUDNN_ATTR_EXECUTION_PLAN_HANDLE;
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

/* Makes g->plan from one engine configuration. An engine that cannot take this graph fails to
 * finalise; that is expected, so these calls are checked by hand and only the first refusal is kept
 * in first_failure for the message. Returns nonzero once g->plan is made. */
static int try_config(cg_graph *g, cudnnHandle_t handle, cudnnBackendDescriptor_t cfg,
                      char *first_failure, size_t size) {
  cudnnBackendDescriptor_t plan = NULL;
  cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(plan, plan_handle_attr, CUDNN_TYPE_HANDLE, 1, &handle);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(plan);
  if (st == CUDNN_STATUS_SUCCESS) {
    g->plan = plan;
    return 1;
  }
  if (first_failure[0] == '\0') {
    char last[384] = "";
    cudnnGetLastErrorString(last, sizeof last);
    attn_format(first_failure, size, "%s%s%s", cudnnGetErrorString(st), last[0] ? ": " : "", last);
  }
  if (plan != NULL) cudnnBackendDestroyDescriptor(plan);
  return 0;
}

/* Keeps the first engine configuration whose plan finalises: the pinned engine where there is one,
 * else the heuristics' configurations in their order. */
static void make_plan(cg_graph *g, cudnnHandle_t handle) {
  cudnnBackendDescriptor_t graph = make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops);
  set(g, graph, graph_handle_attr, CUDNN_TYPE_HANDLE, 1, &handle);
  finalize(g, graph);

  char first_failure[512] = "";
  const cg_knob *knobs;
  int nknobs;
  int64_t pinned = pinned_engine(&g->spec, &knobs, &nknobs);
  if (pinned >= 0) {
    cudnnBackendDescriptor_t cfg = pinned_config(g, graph, pinned, knobs, nknobs);
    if (cfg != NULL) try_config(g, handle, cfg, first_failure, sizeof first_failure);
  }
  cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
  for (int m = 0; pinned < 0 && m < 2 && g->err->status == ATTN_STATUS_OK && g->plan == NULL; ++m) {
    cudnnBackendDescriptor_t heur = make(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m]);
    finalize(g, heur);
    int64_t count = 0;
    CK(g, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL));
    if (count > CG_MAX_ENGINE_CONFIGS) count = CG_MAX_ENGINE_CONFIGS;
    cudnnBackendDescriptor_t cfg[CG_MAX_ENGINE_CONFIGS];
    for (int64_t i = 0; i < count; ++i) cfg[i] = make(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t got = 0;
    if (count > 0)
      CK(g, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfg));
    if (g->err->status != ATTN_STATUS_OK) return;
    for (int64_t i = 0; i < got; ++i)
      if (try_config(g, handle, cfg[i], first_failure, sizeof first_failure)) break;
  }
  if (g->err->status != ATTN_STATUS_OK) return;
  if (g->plan == NULL) {
    g->err->status = ATTN_STATUS_UNSUPPORTED;
    if (pinned >= 0)
      attn_format(g->err->why, g->err->why_size,
                  "cuDNN %d's deterministic engine %lld (sm%d) takes no plan for this backward "
                  "graph%s%s",
                  (int)g->spec.version, (long long)pinned, (int)g->spec.sm,
                  first_failure[0] ? ": " : "", first_failure);
    else
      attn_format(g->err->why, g->err->why_size, "cuDNN %d has no engine for this %s graph%s%s",
                  (int)g->spec.version, g->spec.backward ? "backward" : "forward",
                  first_failure[0] ? ": " : "", first_failure);
    return;
  }
  int64_t n = 0;
  CK(g, cudnnBackendGetAttribute(g->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                 CUDNN_TYPE_INT64, 1, &n, &g->workspace));
}

cg_graph *attn_cudnn_graph_build(cudnnHandle_t handle, const cg_spec *spec, cg_err *err) {
  cg_graph *g = calloc(1, sizeof *g);
  if (g == NULL) {
    err->status = ATTN_STATUS_OUT_OF_MEMORY;
    attn_format(err->why, err->why_size, "out of memory building a cuDNN graph");
    return NULL;
  }
  g->spec = *spec;
  g->err = err;
  g->next_virtual_uid = CG_VIRTUAL_UID0;
  g->run_lock_made = pthread_mutex_init(&g->run_lock, NULL) == 0;
  if (!g->run_lock_made) {
    err->status = ATTN_STATUS_INTERNAL;
    attn_format(err->why, err->why_size, "cannot create a mutex for a cuDNN graph");
  }
  if (err->status != ATTN_STATUS_OK) {
    attn_cudnn_graph_free(g);
    return NULL;
  }
  if (spec->backward && spec->page_size > 0) {
    err->status = ATTN_STATUS_UNSUPPORTED; /* cudnn.c never asks: a paged cache has no backward */
    attn_format(err->why, err->why_size, "a paged KV cache has no backward graph");
  } else if (spec->backward) {
    build_backward(g);
  } else {
    build_forward(g);
  }
  if (err->status == ATTN_STATUS_OK) make_plan(g, handle);
  if (err->status != ATTN_STATUS_OK) {
    attn_cudnn_graph_free(g);
    return NULL;
  }
  g->err = NULL;
  return g;
}

void attn_cudnn_graph_free(cg_graph *g) {
  if (g == NULL) return;
  if (g->plan != NULL) cudnnBackendDestroyDescriptor(g->plan);
  for (int i = g->ndesc - 1; i >= 0; --i) cudnnBackendDestroyDescriptor(g->desc[i]);
  if (g->run_lock_made) pthread_mutex_destroy(&g->run_lock);
  free(g);
}

const cg_spec *attn_cudnn_graph_spec(const cg_graph *g) { return &g->spec; }

size_t attn_cudnn_graph_workspace(const cg_graph *g) { return (size_t)g->workspace; }

attn_status attn_cudnn_graph_execute(cg_graph *g, cudnnHandle_t handle,
                                     void *const ptrs[CG_UID_COUNT], void *workspace, cg_err *err) {
  int64_t uids[CG_UID_COUNT + CG_MAX_SCALARS];
  void *data[CG_UID_COUNT + CG_MAX_SCALARS];
  int64_t n = 0;
  for (int u = 1; u < CG_UID_COUNT; ++u) {
    if (!g->bound[u]) continue;
    uids[n] = u;
    data[n++] = ptrs[u];
  }
  for (int i = 0; i < g->nscalars; ++i) {
    uids[n] = CG_SCALAR_UID0 + i;
    data[n++] = &g->scalar[i];
  }
  cudnnBackendDescriptor_t pack = NULL;
  pthread_mutex_lock(&g->run_lock);
  if (ATTN_CUDNN_CHECK(err, cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR,
                                                         &pack))) {
    pthread_mutex_unlock(&g->run_lock);
    return err->status;
  }
  ATTN_CUDNN_CHECK(err, cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                                                 CUDNN_TYPE_INT64, n, uids));
  ATTN_CUDNN_CHECK(err, cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                                 CUDNN_TYPE_VOID_PTR, n, data));
  ATTN_CUDNN_CHECK(err, cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                                 CUDNN_TYPE_VOID_PTR, 1, &workspace));
  ATTN_CUDNN_CHECK(err, cudnnBackendFinalize(pack));
  ATTN_CUDNN_CHECK(err, cudnnBackendExecute(handle, g->plan, pack));
  cudnnBackendDestroyDescriptor(pack);
  pthread_mutex_unlock(&g->run_lock);
  return err->status;
}
