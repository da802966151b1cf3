/*
 * src/impl/cpu/cpu.c - the "cpu" implementation: flash attention on x86-64 (and any) CPUs, tiled,
 * vectorised through a per-instruction-set kernel table (cpu.h) and threaded with OpenMP.
 *
 * Forward (per phase, a group of (batch, kv head) pairs whose packed K/V fits a memory budget):
 *   1. pack K^T in key blocks ([D][bk] per block) and V ([Tk][Dv padded]) as f32 (as bf16 pairs
 *      for a table with gemm_bf16: AMX), once per call;
 *   2. threads take (pair, query head of the group, query block) items dynamically, heaviest first;
 *      each loads its query block and walks the key blocks its causal mask / window
 *      can see: S = s Q K^T (gemm, then the scale in f32), per-element features (bias, ALiBi, soft cap, masks) only where
 *      the problem has them (a partially visible block without features only masks the window),
 *      online softmax (sinks enter the running max and sum once, at row start), dropout on P,
 *      O += P V (gemm); out = O * keep_scale / l, lse = m + log l.
 * Backward (FlashAttention-2): per phase, Delta = rowsum(dout * out), lse, and q and dout as f32
 *   of its rows (converted once, not once per key block; on AMX also as the bf16 operands of its
 *   products, bwd_rows); threads take (pair, key block) items in rounds of one pair;
 *   each packs K, K^T, V^T of its block once (as bf16 pairs too, on tables with gemm_packed) and
 *   walks every query block of every head of the group that sees it: S, P = exp(S - lse),
 *   dP = dout V^T, dropout, dS = P (dP - Delta) (times the soft cap's derivative),
 *   dV += P'^T dout, dK += dS^T Q s, dQ += dS K into the phase's one f32 accumulator, under a
 *   lock per query block (threads on other key blocks of the pair add to the same rows;
 *   per-thread copies would grow with the thread count and end each phase in a reduction), then
 *   dq = s * accumulator.
 *   dbias sums dS over the broadcast dims; dsinks = -sum exp(a_t - lse) Delta.
 * Nothing of size Tq x Tk exists: the tiles are bq x bk, the packs per (batch, kv head).
 * Every sum is in f32, whatever the input dtype; inputs are converted when packed.
 */
#include "impl/cpu/cpu.h"
#include "impl/impl.h"

#include "core/ctx.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/philox.h"
#include "core/tensors.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#include <stdatomic.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* ---- configurations ------------------------------------------------------------------------- */

/* Query block rows x key block columns. Both multiples of ATTN_CPU_NPAD (and of 4, the Philox group). */
static const int64_t cfg_bq[] = {32, 64, 128};
#define MAX_BK 256 /* the largest key block: per-row scratch on the stack is sized by it */
static const int64_t cfg_bk[] = {64, 128, MAX_BK};
#define N_BQ ((int32_t)(sizeof cfg_bq / sizeof cfg_bq[0]))
#define N_BK ((int32_t)(sizeof cfg_bk / sizeof cfg_bk[0]))

/* Packed K/V (forward) or dQ accumulators (backward) of one phase stay under this many bytes; a
 * larger problem runs in several phases, so memory stays O(one (batch, kv head)). */
#define PHASE_BUDGET ((int64_t)64 << 20)
/* The backward's Delta = out . dout converts out this many elements at a time (a multiple of 8,
 * its lanes: cpu_backward) */
#define DELTA_SPAN 256

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static int max_threads(void) {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

/* ---- instruction set ------------------------------------------------------------------------ */

/* The best kernel table this machine runs, lowered by ATTN_CPU_ISA=generic|avx2|avx512|avx512bf16|amx
 * (a debug and test switch: it never raises the choice above what cpuid reports; amx and
 * avx512bf16 concern bf16 problems only). Read per plan. */
static const attn_cpu_kernels *select_kernels(attn_dtype dtype) {
  const attn_cpu_kernels *best = &attn_cpu_kernels_generic;
#ifdef ATTN_CPU_X86
  /* Each table needs every set its file is compiled for (CMakeLists.txt) and the OS saving them. */
  int has_avx2 = attn_cpu_can_run(ATTN_CPU_AVX2 | ATTN_CPU_FMA | ATTN_CPU_F16C);
  int has_avx512 = has_avx2 && attn_cpu_can_run(ATTN_CPU_AVX512F | ATTN_CPU_AVX512BW |
                                                ATTN_CPU_AVX512VL | ATTN_CPU_AVX512DQ);
  int has_bf16 = has_avx512 && attn_cpu_can_run(ATTN_CPU_AVX512BF16);
  int has_amx = has_bf16 && dtype == ATTN_DTYPE_BF16 && attn_cpu_amx_usable();
  if (has_amx) best = &attn_cpu_kernels_amx;
  else if (has_bf16 && dtype == ATTN_DTYPE_BF16) best = &attn_cpu_kernels_avx512bf16;
  else if (has_avx512) best = &attn_cpu_kernels_avx512;
  else if (has_avx2) best = &attn_cpu_kernels_avx2;
  const char *force = getenv("ATTN_CPU_ISA");
  if (force != NULL) {
    int rank = best == &attn_cpu_kernels_amx ? 4 : best == &attn_cpu_kernels_avx512bf16 ? 3
             : best == &attn_cpu_kernels_avx512 ? 2
             : best == &attn_cpu_kernels_avx2       ? 1
                                                     : 0;
    if (strcmp(force, "generic") == 0) best = &attn_cpu_kernels_generic;
    else if (strcmp(force, "avx2") == 0 && rank > 1) best = &attn_cpu_kernels_avx2;
    else if (strcmp(force, "avx512") == 0 && rank > 2) best = &attn_cpu_kernels_avx512;
    else if (strcmp(force, "avx512bf16") == 0 && rank > 3) best = &attn_cpu_kernels_avx512bf16;
  }
#else
  (void)dtype;
#endif
  return best;
}

/* ---- the run ---------------------------------------------------------------------------------- */

typedef struct cpu_run {
  const attn_run *run;
  const attn_problem *p;
  const attn_inputs *in;
  const attn_cpu_kernels *kern;
  attn_dtype dt;
  attn_dtype rdt; /* of the results (store_vec) */
  int packed; /* varlen packed: token tensors are [total, H, W] */
  int64_t B, Hq, Hkv, group, D, Dv, Dp, Dvp, Tq, Tk;
  int64_t bq, bk, nqb, nkb; /* block sizes and the block counts of the longest sequence */
  int64_t npairs, chunk;    /* (batch, kv head) pairs, and pairs per phase */
  int64_t wl, wr;           /* window (left, right), -1 = unbounded; causal is wr = 0 */
  float scale, keep_scale, softcap;
  int dropout;
  uint32_t drop_threshold;
  const attn_positions *pos; /* where the problem sits in a larger one (src/dist), or NULL */
  int features; /* bias, ALiBi, soft cap, mask or segment ids: the per-element pass */
  int nthreads;
} cpu_run;

typedef struct cpu_seq {
  int64_t b, g;
  attn_seq s;
  int64_t o; /* alignment offset (of the first pieces of rows and keys, when placed in pieces) */
  /* A block placed in pieces of rows or keys (attn_positions, more than one piece on an axis):
   * each pair of pieces sees its own offset (tile_parts); NULL when o holds for the whole block. */
  const attn_positions *pieces;
} cpu_seq;

static cpu_run make_cpu_run(const attn_run *run) {
  const attn_problem *p = run->problem;
  cpu_run c;
  memset(&c, 0, sizeof c);
  c.run = run;
  c.p = p;
  c.in = run->inputs;
  c.kern = run->state != NULL ? (const attn_cpu_kernels *)run->state
                                : select_kernels((attn_dtype)p->dtype);
  c.dt = (attn_dtype)p->dtype;
  c.rdt = attn_result_dtype(p, run->positions);
  c.packed = p->varlen == ATTN_VARLEN_PACKED;
  c.B = p->batch, c.Hq = p->heads_q, c.Hkv = p->heads_kv, c.group = p->heads_q / p->heads_kv;
  c.D = p->head_dim, c.Dv = p->head_dim_v;
  c.Dp = round_up(c.D, ATTN_CPU_NPAD), c.Dvp = round_up(c.Dv, ATTN_CPU_NPAD);
  c.Tq = p->seqlen_q, c.Tk = p->seqlen_k;
  int32_t cfg = run->config;
  c.bq = cfg_bq[cfg / N_BK], c.bk = cfg_bk[cfg % N_BK];
  c.nqb = (c.Tq + c.bq - 1) / c.bq, c.nkb = (c.Tk + c.bk - 1) / c.bk;
  c.npairs = c.B * c.Hkv;
  c.wl = p->window_left, c.wr = p->window_right;
  c.scale = (float)p->scale;
  c.keep_scale = (float)(1.0 / (1.0 - p->dropout_p));
  c.softcap = (float)p->softcap;
  c.dropout = p->dropout_p > 0.0;
  c.drop_threshold = attn_dropout_threshold(p->dropout_p);
  c.pos = run->positions;
  c.features = p->has_bias || p->alibi != ATTN_ALIBI_NONE || p->softcap > 0.0 || p->has_mask ||
               p->has_segment_ids;
  return c;
}

static cpu_seq make_seq(const cpu_run *c, int64_t pair) {
  cpu_seq s;
  s.b = pair / c->Hkv, s.g = pair % c->Hkv;
  s.s = attn_seq_of(c->p, c->in, s.b);
  const int placed = c->pos != NULL && c->pos->has_offset;
  s.o = placed ? attn_position_offset(c->pos, 0, 0) : attn_align_offset(c->p, &s.s);
  s.pieces =
      placed && (attn_position_pieces(&c->pos->rows) > 1 || attn_position_pieces(&c->pos->cols) > 1)
          ? c->pos
          : NULL;
  return s;
}

/* keep[jj] for keys j0 .. j0 + n - 1 of row i: the kernel table's vector Philox, with the
 * problem's indices made global when it is a block of a larger one (key by key in the pieces of
 * attn_positions: the keys of a tile may lie in two). The vector paths share one Philox call per
 * 4 keys and so need a key start that is a multiple of 4; keys whose global positions start
 * elsewhere take the scalar rule, element by element. */
static void dropout_keep(const cpu_run *c, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n,
                         uint8_t *keep) {
  if (c->pos == NULL) {
    c->kern->dropout_keep(c->in->dropout_seed, c->drop_threshold, b, h, i, j0, n, keep);
    return;
  }
  const attn_position_axis *cols = &c->pos->cols;
  b += c->pos->batch0, h += c->pos->head0, i = attn_position_of(&c->pos->rows, i);
  for (int64_t done = 0; done < n;) {
    const int32_t k = attn_position_piece(cols, j0 + done);
    const int64_t end = min64(n, attn_position_piece_end(cols, k, j0 + n) - j0);
    const int64_t gj = cols->global[k] + (j0 + done - cols->start[k]);
    if (gj % 4 == 0) {
      c->kern->dropout_keep(c->in->dropout_seed, c->drop_threshold, b, h, i, gj, end - done,
                            keep + done);
    } else {
      for (int64_t jj = done; jj < end; ++jj)
        keep[jj] = (uint8_t)attn_dropout_keep(c->in->dropout_seed, c->drop_threshold, b, h, i,
                                              gj + (jj - done));
    }
    done = end;
  }
}

/* ---- element access --------------------------------------------------------------------------- */

static inline float load1(const void *base, attn_dtype dt, int64_t off) {
  switch (dt) {
  case ATTN_DTYPE_F32: return ((const float *)base)[off];
  case ATTN_DTYPE_F16: return attn_inline_f16_to_f32(((const uint16_t *)base)[off]);
  case ATTN_DTYPE_BF16: return attn_inline_bf16_to_f32(((const uint16_t *)base)[off]);
  case ATTN_DTYPE_F8E4M3: return attn_inline_f8e4m3_to_f32(((const uint8_t *)base)[off]);
  default: return 0.0f;
  }
}

static inline void store1(void *base, attn_dtype dt, int64_t off, float v) {
  switch (dt) {
  case ATTN_DTYPE_F32: ((float *)base)[off] = v; break;
  case ATTN_DTYPE_F16: ((uint16_t *)base)[off] = attn_inline_f32_to_f16(v); break;
  case ATTN_DTYPE_BF16: ((uint16_t *)base)[off] = attn_inline_f32_to_bf16(v); break;
  default: break;
  }
}

/* dst[d] = s * src[off + d * stride], d < n, src of the run's dtype. */
static void load_vec(const cpu_run *c, const void *base, int64_t off, int64_t stride, int64_t n,
                     float s, float *dst) {
  const attn_dtype dt = c->dt;
  if (dt == ATTN_DTYPE_F16 && stride == 1) {
    c->kern->load_f16((const uint16_t *)base + off, n, s, dst);
  } else if (dt == ATTN_DTYPE_F32 && stride == 1) {
    const float *x = (const float *)base + off;
    for (int64_t d = 0; d < n; ++d) dst[d] = s * x[d];
  } else if (dt == ATTN_DTYPE_BF16 && stride == 1) {
    const uint16_t *x = (const uint16_t *)base + off;
    for (int64_t d = 0; d < n; ++d) dst[d] = s * attn_f32_from_bits((uint32_t)x[d] << 16);
  } else if (dt == ATTN_DTYPE_F8E4M3 && stride == 1) { /* the decode, without load1's switch */
    const uint8_t *x = (const uint8_t *)base + off;
    for (int64_t d = 0; d < n; ++d) dst[d] = s * attn_inline_f8e4m3_to_f32(x[d]);
  } else {
    for (int64_t d = 0; d < n; ++d) dst[d] = s * load1(base, dt, off + d * stride);
  }
}

/* dst[off + d * stride] = s * src[d], rounded to the dtype of the run's results (out, dq, dk,
 * dv: the problem's, or f32 for partial results, attn_result_dtype), d < n. */
static void store_vec(const cpu_run *c, void *base, int64_t off, int64_t stride, int64_t n,
                      const float *src, float s) {
  const attn_dtype dt = c->rdt;
  if (dt == ATTN_DTYPE_F16 && stride == 1) {
    c->kern->store_f16((uint16_t *)base + off, n, src, s);
  } else if (dt == ATTN_DTYPE_F32 && stride == 1) {
    float *x = (float *)base + off;
    for (int64_t d = 0; d < n; ++d) x[d] = s * src[d];
  } else if (dt == ATTN_DTYPE_BF16 && stride == 1) { /* store1's rounding without its switch per
                                                      * element, which made a bf16 forward's O
                                                      * stores 19% of its time */
    uint16_t *x = (uint16_t *)base + off;
    for (int64_t d = 0; d < n; ++d) x[d] = attn_inline_f32_to_bf16(s * src[d]);
  } else {
    for (int64_t d = 0; d < n; ++d) store1(base, dt, off + d * stride, s * src[d]);
  }
}

/* Asks for the cache lines of n elements of the run's dtype at off in base, a contiguous row: for
 * loops that convert one head's rows one after another, H x D elements apart, whose loads
 * otherwise each wait for their own miss (the backward's pass over q, dout and out: 3-6% of a
 * bf16 backward of 2048 query rows on the 2-core VM; the forward's Q rows gained nothing
 * measurable: bench/RESULTS.md, "The bf16 output stores, and the backward's row pass"). */
#define ROWS_AHEAD 4 /* rows prefetched ahead of the one converted */
static inline void prefetch_row(const cpu_run *c, const void *base, int64_t off, int64_t n) {
  const size_t es = attn_dtype_size(c->dt);
  const char *p = (const char *)base + (size_t)off * es;
  for (size_t b = 0; b < (size_t)n * es; b += 64) __builtin_prefetch(p + b, 0, 3);
}

/* Offset of (b, row, head, 0) of a token tensor and the stride of its last dim. Packed: row is the
 * row of the whole tensor and b is unused. */
static inline int64_t token_off(const cpu_run *c, const attn_tensor *t, int64_t b, int64_t row,
                                int64_t head) {
  if (c->packed) return row * t->stride[0] + head * t->stride[1];
  return b * t->stride[0] + row * t->stride[1] + head * t->stride[2];
}
/* Offset of (key j, element 0) of a sequence's KV head in k or v: a token row, or for a paged cache
 * (docs/DECODE.md) row j % page_size of its page. */
static inline int64_t kv_off(const cpu_run *c, const attn_tensor *t, const cpu_seq *s, int64_t j) {
  if (c->p->page_size > 0) return attn_paged_offset(c->p, c->in, t, s->b, j, s->g);
  return token_off(c, t, s->b, s->s.k_row0 + j, s->g);
}
static inline int64_t token_dstride(const cpu_run *c, const attn_tensor *t) {
  return c->packed ? t->stride[2] : t->stride[3];
}
static inline int64_t lse_off(const cpu_run *c, const attn_tensor *t, int64_t b, int64_t h,
                              int64_t row) {
  if (c->packed) return h * t->stride[0] + row * t->stride[1];
  return b * t->stride[0] + h * t->stride[1] + row * t->stride[2];
}

static float sink_logit(const cpu_run *c, int64_t h, int64_t t) {
  const attn_tensor *s = &c->in->sinks;
  int64_t off = c->p->sinks_shared ? t * s->stride[0] : h * s->stride[0] + t * s->stride[1];
  return ((const float *)s->data)[off];
}

static int64_t bias_head(const cpu_run *c, int64_t h) {
  if (c->p->bias_shape[1] == c->Hq) return h;
  if (c->p->bias_shape[1] == c->Hkv) return h / c->group;
  return 0;
}

/* Offset of element (b, head, i, 0) of a broadcastable 4-d input, and its stride along j. */
static inline int64_t bcast_off(const int64_t shape[4], const int64_t stride[4], int64_t b,
                                int64_t head, int64_t i) {
  return (shape[0] == 1 ? 0 : b * stride[0]) + (shape[1] == 1 ? 0 : head * stride[1]) +
         (shape[2] == 1 ? 0 : i * stride[2]);
}
static inline int64_t bcast_jstride(const int64_t shape[4], const int64_t stride[4]) {
  return shape[3] == 1 ? 0 : stride[3];
}

/* ---- masks and per-element features on a score tile -------------------------------------------- */

/* A part of a tile that lies in one piece of rows and one piece of keys (attn_positions): its rows
 * [i0, i0 + rows) see its keys [j0, j0 + nk) as a problem of alignment offset o would. A block
 * that is one piece is one part; a tile of a block in pieces splits where a piece ends, into at
 * most CPU_MAX_PARTS parts, which cover the tile. */
typedef struct cpu_part {
  int64_t i0, rows, j0, nk, o;
} cpu_part;
#define CPU_MAX_PARTS (ATTN_POSITION_PIECES * ATTN_POSITION_PIECES)

static int tile_parts(const cpu_seq *s, int64_t i0, int64_t rows, int64_t j0, int64_t nk,
                      cpu_part parts[CPU_MAX_PARTS]) {
  if (s->pieces == NULL) {
    parts[0] = (cpu_part){i0, rows, j0, nk, s->o};
    return 1;
  }
  const attn_position_axis *pr = &s->pieces->rows, *pc = &s->pieces->cols;
  int n = 0;
  for (int32_t a = 0; a < attn_position_pieces(pr); ++a) {
    const int64_t lo = max64(i0, pr->start[a]);
    const int64_t hi = min64(i0 + rows, attn_position_piece_end(pr, a, s->s.len_q));
    for (int32_t k = 0; hi > lo && k < attn_position_pieces(pc); ++k) {
      const int64_t jl = max64(j0, pc->start[k]);
      const int64_t jh = min64(j0 + nk, attn_position_piece_end(pc, k, s->s.len_k));
      if (jh > jl)
        parts[n++] = (cpu_part){lo, hi - lo, jl, jh - jl, attn_position_offset(s->pieces, a, k)};
    }
  }
  return n;
}

/* The keys [*lo, *hi) of a part that some of its rows see by the window (*hi <= *lo: none). */
static void part_keys(const cpu_run *c, const cpu_part *t, int64_t *lo, int64_t *hi) {
  *lo = c->wl >= 0 ? max64(t->j0, t->i0 + t->o - c->wl) : t->j0;
  *hi = c->wr >= 0 ? min64(t->j0 + t->nk, t->i0 + t->rows - 1 + t->o + c->wr + 1) : t->j0 + t->nk;
}

/* Whether key block [j0, j0 + nk) is visible from every row of [i0, i0 + rows) by the window. */
static int window_covers(const cpu_run *c, const cpu_seq *s, int64_t i0, int64_t rows, int64_t j0,
                         int64_t nk) {
  if (c->wl < 0 && c->wr < 0) return 1;
  cpu_part parts[CPU_MAX_PARTS];
  const int n = tile_parts(s, i0, rows, j0, nk, parts);
  for (int k = 0; k < n; ++k) {
    const cpu_part *t = &parts[k];
    if (c->wl >= 0 && t->j0 < t->i0 + t->rows - 1 + t->o - c->wl) return 0;
    if (c->wr >= 0 && t->j0 + t->nk - 1 > t->i0 + t->o + c->wr) return 0;
  }
  return 1;
}

/* S[r][jj] for rows i0 + r and keys j0 + jj, a part of a tile whose rows see its keys at offset
 * o (tile_parts), becomes the logit x of SPEC.md steps 1-3 (S holds s * dot(q, k) on entry): bias,
 * ALiBi and the soft cap added, -inf where the key is not visible. dcap (may be NULL) gets the
 * cap's derivative 1 - tanh^2 (1 where there is no cap or no key). */
static void tile_features(const cpu_run *c, const cpu_seq *s, int64_t o, int64_t h, int64_t i0,
                          int64_t rows, int64_t j0, int64_t nk, float *S, int64_t lds,
                          float *dcap) {
  const attn_problem *p = c->p;
  const attn_inputs *in = c->in;
  const int64_t b = s->b;
  float slope = 0.0f;
  if (p->alibi != ATTN_ALIBI_NONE) {
    const attn_tensor *sl = &in->alibi_slopes;
    int64_t off = p->alibi == ATTN_ALIBI_PER_BATCH_HEAD ? b * sl->stride[0] + h * sl->stride[1]
                                                        : h * sl->stride[0];
    slope = ((const float *)sl->data)[off];
  }
  const int64_t bias_js = p->has_bias ? bcast_jstride(p->bias_shape, in->bias.stride) : 0;
  const int64_t mask_js = p->has_mask ? bcast_jstride(p->mask_shape, in->mask.stride) : 0;
  const int32_t *kseg = NULL;
  int64_t kseg_js = 0;
  if (p->has_segment_ids) {
    kseg = (const int32_t *)in->kv_segment_ids.data + b * in->kv_segment_ids.stride[0];
    kseg_js = in->kv_segment_ids.stride[1];
  }
  const attn_dtype bias_dt = (attn_dtype)p->bias_dtype;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r, diag = i + o;
    float *x = S + r * lds;
    float *dc = dcap != NULL ? dcap + r * lds : NULL;
    int32_t qseg = 0;
    if (kseg != NULL) {
      const attn_tensor *qs = &in->q_segment_ids;
      qseg = ((const int32_t *)qs->data)[b * qs->stride[0] + i * qs->stride[1]];
      if (qseg < 0) { /* a padding query sees nothing */
        for (int64_t jj = 0; jj < nk; ++jj) x[jj] = -INFINITY;
        if (dc != NULL)
          for (int64_t jj = 0; jj < nk; ++jj) dc[jj] = 1.0f;
        continue;
      }
    }
    /* Each step is its own loop over the row, so the compiler vectorises the simple ones and the
     * soft cap runs in the kernel table's vector tanh. Masks come last: they overwrite with -inf
     * whatever the additive terms and the cap made of a hidden key (bias and ALiBi are inside the
     * cap; masking is after it). */
    if (p->has_bias) {
      const int64_t at = bcast_off(p->bias_shape, in->bias.stride, b, bias_head(c, h), i) + j0 * bias_js;
      if (bias_dt == ATTN_DTYPE_F32 && bias_js == 1) {
        const float *bias = (const float *)in->bias.data + at;
        for (int64_t jj = 0; jj < nk; ++jj) x[jj] += bias[jj];
      } else {
        for (int64_t jj = 0; jj < nk; ++jj) x[jj] += load1(in->bias.data, bias_dt, at + jj * bias_js);
      }
    }
    if (slope != 0.0f) { /* -slope |i + o - j|; the distances are exact in f32 below 2^24 */
      const float base = (float)(diag - j0);
      for (int64_t jj = 0; jj < nk; ++jj) x[jj] -= slope * fabsf(base - (float)jj);
    }
    if (c->softcap > 0.0f) {
      c->kern->softcap(x, dc, nk, c->softcap);
    } else if (dc != NULL) {
      for (int64_t jj = 0; jj < nk; ++jj) dc[jj] = 1.0f;
    }
    int64_t lo = c->wl >= 0 ? diag - c->wl - j0 : 0;      /* first visible jj by the window */
    int64_t hi = c->wr >= 0 ? diag + c->wr - j0 + 1 : nk; /* one past the last */
    lo = max64(0, min64(lo, nk));
    hi = max64(lo, min64(hi, nk));
    for (int64_t jj = 0; jj < lo; ++jj) x[jj] = -INFINITY;
    for (int64_t jj = hi; jj < nk; ++jj) x[jj] = -INFINITY;
    if (p->has_mask) {
      const uint8_t *mask = (const uint8_t *)in->mask.data +
                            bcast_off(p->mask_shape, in->mask.stride, b,
                                      p->mask_shape[1] == 1 ? 0 : h, i) + j0 * mask_js;
      for (int64_t jj = lo; jj < hi; ++jj) x[jj] = mask[jj * mask_js] != 0 ? x[jj] : -INFINITY;
    }
    if (kseg != NULL) {
      const int32_t *ks = kseg + j0 * kseg_js;
      for (int64_t jj = lo; jj < hi; ++jj) x[jj] = ks[jj * kseg_js] == qseg ? x[jj] : -INFINITY;
    }
  }
}

/* -inf outside the window in a part (offset o) of a tile the window covers only partly (no other
 * feature). */
static void tile_window(const cpu_run *c, int64_t o, int64_t i0, int64_t rows, int64_t j0,
                        int64_t nk, float *S, int64_t lds) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t diag = i0 + r + o;
    float *x = S + r * lds;
    int64_t lo = c->wl >= 0 ? diag - c->wl - j0 : 0;       /* first visible jj */
    int64_t hi = c->wr >= 0 ? diag + c->wr - j0 + 1 : nk;  /* one past the last */
    lo = max64(0, min64(lo, nk));
    hi = max64(lo, min64(hi, nk));
    for (int64_t jj = 0; jj < lo; ++jj) x[jj] = -INFINITY;
    for (int64_t jj = hi; jj < nk; ++jj) x[jj] = -INFINITY;
  }
}

/* Masks and per-element features of a tile, part by part (tile_parts). */
static void apply_masks(const cpu_run *c, const cpu_seq *s, int64_t h, int64_t i0, int64_t rows,
                        int64_t j0, int64_t nk, float *S, int64_t lds, float *dcap) {
  if (!c->features && window_covers(c, s, i0, rows, j0, nk)) return;
  cpu_part parts[CPU_MAX_PARTS];
  const int n = tile_parts(s, i0, rows, j0, nk, parts);
  for (int k = 0; k < n; ++k) {
    const cpu_part *t = &parts[k];
    float *St = S + (t->i0 - i0) * lds + (t->j0 - j0);
    if (c->features)
      tile_features(c, s, t->o, h, t->i0, t->rows, t->j0, t->nk, St, lds,
                    dcap != NULL ? dcap + (St - S) : NULL);
    else
      tile_window(c, t->o, t->i0, t->rows, t->j0, t->nk, St, lds);
  }
}

/* The span [*jmin, *jmax) of the columns among [j0, j0 + nk) that rows [i0, i0 + rows) can see
 * by the mask's band, over the positions' pieces; 0 when they see none. */
static int visible_columns(const cpu_run *c, const cpu_seq *s, int64_t i0, int64_t rows, int64_t j0,
                           int64_t nk, int64_t *jmin, int64_t *jmax) {
  cpu_part parts[CPU_MAX_PARTS];
  const int n = tile_parts(s, i0, rows, j0, nk, parts);
  *jmin = INT64_MAX, *jmax = INT64_MIN;
  for (int k = 0; k < n; ++k) {
    int64_t lo, hi;
    part_keys(c, &parts[k], &lo, &hi);
    if (hi > lo) *jmin = min64(*jmin, lo), *jmax = max64(*jmax, hi);
  }
  return *jmax > *jmin;
}

/* The key blocks [*kb_lo, *kb_hi) that rows [i0, i0 + rows) of a sequence can see (a hull: in
 * pieces, blocks between visible ones may be hidden, and trim_block finds them empty). */
static void key_block_range(const cpu_run *c, const cpu_seq *s, int64_t i0, int64_t rows,
                            int64_t *kb_lo, int64_t *kb_hi) {
  int64_t jmin, jmax;
  if (!visible_columns(c, s, i0, rows, 0, s->s.len_k, &jmin, &jmax)) {
    *kb_lo = *kb_hi = 0;
    return;
  }
  *kb_lo = jmin / c->bk;
  *kb_hi = (jmax - 1) / c->bk + 1;
}

/* Trims key block [j0, j0 + nk) to the columns rows [i0, i0 + rows) can see by the window:
 * *off (a multiple of ATTN_CPU_NPAD, so tiles stay aligned and Philox groups whole) is where the
 * visible columns start and *nk_vis how many from there; 0 when the block is invisible. The
 * diagonal blocks of a causal mask so compute about half as many columns. */
static void trim_block(const cpu_run *c, const cpu_seq *s, int64_t i0, int64_t rows, int64_t j0,
                       int64_t nk, int64_t *off, int64_t *nk_vis) {
  int64_t jmin, jmax;
  if (!visible_columns(c, s, i0, rows, j0, nk, &jmin, &jmax)) {
    *off = *nk_vis = 0;
    return;
  }
  const int64_t lo = (jmin - j0) / ATTN_CPU_NPAD * ATTN_CPU_NPAD;
  *off = lo;
  *nk_vis = jmax - j0 - lo;
}

/* The query rows [*i_lo, *i_hi) of a sequence that can see keys [j0, j0 + nk) (a hull, as
 * key_block_range's). */
static void query_row_range(const cpu_run *c, const cpu_seq *s, int64_t j0, int64_t nk,
                            int64_t *i_lo, int64_t *i_hi) {
  cpu_part parts[CPU_MAX_PARTS];
  const int n = tile_parts(s, 0, s->s.len_q, j0, nk, parts);
  int64_t imin = INT64_MAX, imax = INT64_MIN;
  for (int k = 0; k < n; ++k) {
    const cpu_part *t = &parts[k];
    const int64_t lo = c->wr >= 0 ? max64(t->i0, t->j0 - t->o - c->wr) : t->i0;
    const int64_t hi =
        c->wl >= 0 ? min64(t->i0 + t->rows, t->j0 + t->nk - 1 - t->o + c->wl + 1) : t->i0 + t->rows;
    if (hi > lo) imin = min64(imin, lo), imax = max64(imax, hi);
  }
  if (imax <= imin) imin = imax = 0;
  *i_lo = imin;
  *i_hi = imax;
}

/* ---- workspace ---------------------------------------------------------------------------------- */

/* Floats of each region, each rounded to 16 floats (64 bytes). */
typedef struct fwd_layout {
  int64_t slot;       /* packed K^T and V of one pair, and per key block whether its V is finite */
  int64_t per_thread; /* Q, S, O tiles, m, l, and Q and P as bf16 rows (tables with gemm_bf16) */
} fwd_layout;

typedef struct bwd_layout {
  int64_t shared;     /* dbias accumulator */
  int64_t per_pair;   /* lse, Delta, q and dout as f32, the dQ accumulator and its locks of one
                       * pair's rows, and on tables with pack_rows q and dout as bf16 (bwd_rows) */
  int64_t per_thread_fixed; /* tiles */
  int64_t per_thread_dbias; /* a private dbias accumulator (bias broadcast over keys) */
} bwd_layout;

/* One lock per 64 bytes, so threads spinning on neighbouring query blocks share no cache line. */
#define LOCK_STRIDE 16

/* Floats of gemm scratch per thread: the largest product either pass makes. */
static int64_t gemm_scratch_floats(const attn_problem *p, int64_t bq, int64_t bk) {
  const int64_t Dp = round_up(p->head_dim, ATTN_CPU_NPAD), Dvp = round_up(p->head_dim_v, ATTN_CPU_NPAD);
  const int64_t m = max64(bq, bk), n = max64(bk, max64(Dp, Dvp));
  const int64_t k = max64(max64(p->head_dim, p->head_dim_v), max64(bk, bq));
  return round_up((int64_t)(ATTN_CPU_GEMM_SCRATCH(m, n, k) / sizeof(float)) + 1, 16);
}

/* Floats that hold a [k x n] matrix as pack_b's bf16 pairs (cpu.h). */
static int64_t packed_floats(int64_t k, int64_t n) { return round_up((k + 1) / 2 * n, 16); }

/* Rows of the slices fwd_bq's blocks run in where the window cuts a key block (forward_block). */
#define DIAG_ROWS 32

/* The forward's query block: the configuration's, doubled on tables with gemm_panels (the f32 path).
 * Each query block streams its pair's packed K^T and V (4 T D bytes in f32) once, from L2 or L3;
 * at 16 threads on a Sapphire Rapids host the 64-row blocks' stream ran the f32 forward at 953
 * GFLOP/s against 1116 at 128 rows (issue 15), while 128-row blocks cost the backward, which shares
 * the configuration. bq32 configurations keep the forward's former 64 rows. */
static int64_t fwd_bq(const attn_cpu_kernels *k, int64_t bq) {
  return k->gemm_panels != NULL ? 2 * bq : bq;
}

static fwd_layout fwd_layout_of(const attn_problem *p, int64_t bq, int64_t bk) {
  const int64_t D = p->head_dim, Dvp = round_up(p->head_dim_v, ATTN_CPU_NPAD);
  const int64_t Dp = round_up(D, ATTN_CPU_NPAD);
  const int64_t nkb = (p->seqlen_k + bk - 1) / bk;
  fwd_layout l;
  l.slot = round_up(nkb * bk * D, 16) + round_up(nkb * bk * Dvp, 16) + round_up(nkb, 16);
  l.per_thread = round_up(bq * Dp, 16) + round_up(bq * bk, 16) + round_up(bq * Dvp, 16) +
                 2 * round_up(bq, 16) + gemm_scratch_floats(p, bq, bk) +
                 round_up(max64(D * bk, bk * Dvp), 16) + /* packing's scratch (fwd_thread.tmp) */
                 round_up(bq * round_up(D, 32) / 2, 16) + round_up(bq * bk, 16);
  return l;
}

/* Whether the backward keeps a phase's q and dout rows as bf16 too, packed once for every key
 * block's products (tables with gemm_bf16 and pack_rows: AMX): as gemm_bf16's A rows (S = Q K^T,
 * dP = dout V^T) and as pack_b's pairs (dK += dS^T Q, dV += P^T dout). gemm_packed and gemm
 * pack their operands per call: four of the seven packs per (key block, query block) were these,
 * the same for every key block, and the packs took 23% of a bf16 backward's samples on an AMX
 * VM (bench/RESULTS.md, "The backward's q and dout packed once"). */
static int bwd_rows(const attn_cpu_kernels *k) {
  return k->gemm_bf16 != NULL && k->pack_rows != NULL;
}

static bwd_layout bwd_layout_of(const attn_problem *p, const attn_cpu_kernels *k, int64_t bq,
                                int64_t bk) {
  const int64_t D = p->head_dim, Dv = p->head_dim_v;
  const int64_t Dp = round_up(D, ATTN_CPU_NPAD), Dvp = round_up(Dv, ATTN_CPU_NPAD);
  const int64_t group = p->heads_q / p->heads_kv;
  bwd_layout l;
  int64_t nbias = p->has_bias ? attn_role_numel(p, ATTN_ROLE_BIAS) : 0;
  int private_dbias = p->has_bias && p->bias_shape[3] == 1;
  l.shared = private_dbias ? 0 : round_up(nbias, 16);
  l.per_pair = 2 * round_up(group * p->seqlen_q, 16) + 2 * round_up(group * p->seqlen_q * Dp, 16) +
               round_up(group * p->seqlen_q * Dvp, 16) +
               group * ((p->seqlen_q + bq - 1) / bq) * LOCK_STRIDE;
  if (bwd_rows(k)) { /* bf16 words, two a float: rows rounded up to 16 (gemm_bf16 reads them) */
    const int64_t rows = group * round_up(p->seqlen_q, 16);
    l.per_pair += round_up(rows * (round_up(D, 32) + Dp) / 2, 16) +
                  round_up(rows * (round_up(Dv, 32) + Dvp) / 2, 16);
  }
  int64_t tiles = 2 + (p->dropout_p > 0.0) + (p->softcap > 0.0);
  l.per_thread_fixed = round_up(bk * Dp, 16) * 2 + round_up(D * bk, 16) + round_up(Dv * bk, 16) +
                       round_up(bk * Dvp, 16) + tiles * round_up(bq * bk, 16) +
                       gemm_scratch_floats(p, bq, bk) + packed_floats(D, bk) +
                       packed_floats(Dv, bk) + packed_floats(bk, Dp);
  l.per_thread_dbias = private_dbias ? round_up(nbias, 16) : 0;
  return l;
}

static int64_t fwd_chunk(const attn_problem *p, const fwd_layout *l) {
  int64_t npairs = p->batch * p->heads_kv;
  int64_t chunk = l->slot > 0 ? PHASE_BUDGET / (int64_t)sizeof(float) / l->slot : npairs;
  return max64(1, min64(chunk, npairs));
}

/* Pairs per backward phase: nothing of a phase grows with the thread count. */
static int64_t bwd_chunk(const attn_problem *p, const bwd_layout *l) {
  int64_t npairs = p->batch * p->heads_kv;
  if (p->has_bias) return 1; /* dbias elements broadcast over pairs must have one writer */
  int64_t per = l->per_pair;
  int64_t chunk = per > 0 ? PHASE_BUDGET / (int64_t)sizeof(float) / per : npairs;
  return max64(1, min64(chunk, npairs));
}

/* Whether the layouts' int64 arithmetic stays exact for p: a bound, in double, on every term they
 * add up (tiles and gemm scratch of head-dim and block sizes, per-thread dQ rows, packed K/V and
 * phase buffers, the dbias accumulator), generous by a constant factor. Validation admits tensors
 * of 2^56 elements, so a head dim of 2^40 squares past 2^64; such a problem's workspace is reported
 * as SIZE_MAX (core/saturate.h) instead of a wrapped size. The slack only ever turns workspaces
 * beyond an exbibyte into SIZE_MAX, which no machine allocates either way. */
static int workspace_countable(const attn_problem *p) {
  const int64_t threads = max_threads();
  const double M = (double)max64(p->head_dim, p->head_dim_v) + 16.0, X = 256.0;
  const double group = (double)(p->heads_q / p->heads_kv);
  const double L = fmax(group * (double)p->seqlen_q, (double)p->seqlen_k) + 256.0;
  const double bias = p->has_bias ? (double)attn_role_numel(p, ATTN_ROLE_BIAS) : 0.0;
  const double floats = ((double)threads + 1.0) * (16.0 * M * M + 64.0 * X * M + 16.0 * X * X +
                                                   8.0 * L * (M + 20.0) + 2.0 * bias +
                                                   (double)PHASE_BUDGET / sizeof(float));
  const double limit = fmin(0x1p62, (double)SIZE_MAX);
  return floats * sizeof(float) < limit;
}

static size_t cpu_workspace_size(const attn_problem *p, int32_t config, const void *state,
                                 int backward) {
  if (!workspace_countable(p)) return SIZE_MAX;
  const int64_t bq = cfg_bq[config / N_BK], bk = cfg_bk[config % N_BK];
  const int64_t threads = max_threads();
  if (!backward) {
    const attn_cpu_kernels *k = state != NULL ? (const attn_cpu_kernels *)state
                                              : select_kernels((attn_dtype)p->dtype);
    fwd_layout l = fwd_layout_of(p, fwd_bq(k, bq), bk);
    size_t tiled = (size_t)(fwd_chunk(p, &l) * l.slot + threads * l.per_thread) * sizeof(float);
    /* A decode problem may still take the tiled path (a block of a sharded problem: see
     * cpu_forward), so its workspace serves both. */
    if (attn_cpu_decode_applies(p)) {
      size_t decode = attn_cpu_decode_workspace(p);
      return decode > tiled ? decode : tiled;
    }
    return tiled;
  }
  const attn_cpu_kernels *k =
      state != NULL ? (const attn_cpu_kernels *)state : select_kernels((attn_dtype)p->dtype);
  bwd_layout l = bwd_layout_of(p, k, bq, bk);
  int64_t chunk = bwd_chunk(p, &l);
  return (size_t)(l.shared + chunk * l.per_pair +
                  threads * (l.per_thread_fixed + l.per_thread_dbias)) *
         sizeof(float);
}

/* Threads to use: the context's count (0 = OpenMP's), one inside a caller's parallel region, and no
 * more than the workspace has room for. */
static int run_threads(const attn_run *run, int64_t shared_floats, int64_t per_thread_floats) {
  int want = run->num_threads > 0 ? run->num_threads : max_threads();
#ifdef _OPENMP
  if (omp_in_parallel()) want = 1;
#endif
  int64_t room = (int64_t)(run->workspace_size / sizeof(float)) - shared_floats;
  if (per_thread_floats > 0) {
    int64_t fit = room / per_thread_floats;
    if (fit < want) want = (int)max64(1, fit);
  }
  return want < 1 ? 1 : want;
}

static int thread_id(void) {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

/* After a work item: the caller's progress hook (attn_run.progress), from the calling thread
 * (thread 0 of the team is the thread that called), so a distributed caller's transfers move on
 * while the other threads compute. */
static void after_item(const cpu_run *c) {
  if (c->run->progress != NULL && thread_id() == 0) c->run->progress(c->run->progress_arg);
}

/* ---- rows outside every sequence ---------------------------------------------------------------- */

static void zero_token_rows(const cpu_run *c, const attn_tensor *t, int64_t heads, int64_t width,
                            int64_t b, int64_t row0, int64_t row1) {
  static const float zeros[ATTN_CPU_NPAD] = {0};
  const int64_t ds = token_dstride(c, t);
  for (int64_t row = row0; row < row1; ++row)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t d = 0; d < width; d += ATTN_CPU_NPAD)
        store_vec(c, t->data, token_off(c, t, b, row, h) + d * ds, ds,
                  min64(ATTN_CPU_NPAD, width - d), zeros, 1.0f);
}

/* out = 0, lse = -inf on rows that belong to no sequence (padded rows, packed rows past the end). */
static void forward_outside_rows(const cpu_run *c, const attn_outputs *out) {
  const attn_problem *p = c->p;
  if (p->varlen == ATTN_VARLEN_NONE) return;
  for (int64_t b = 0; b < (c->packed ? 1 : c->B); ++b) {
    int64_t row0 = c->packed ? c->in->cu_seqlens_q[c->B] : c->in->seqlens_q[b];
    int64_t row1 = c->packed ? p->total_q : c->Tq;
    zero_token_rows(c, &out->out, c->Hq, c->Dv, b, row0, row1);
    if (out->lse.data != NULL)
      for (int64_t row = row0; row < row1; ++row)
        for (int64_t h = 0; h < c->Hq; ++h)
          ((float *)out->lse.data)[lse_off(c, &out->lse, b, h, row)] = -INFINITY;
  }
}

/* ---- forward ------------------------------------------------------------------------------------- */

/* cpu.h's ATTN_CPU_FWD_PHASES: per-thread tick sums (fwd_thread.ticks), added to the totals when a
 * thread leaves the region. Without it the macros are nothing. */
#ifdef ATTN_CPU_FWD_PHASES
static uint64_t fwd_phase_totals[ATTN_CPU_PHASES];
void attn_cpu_fwd_phases(uint64_t out[ATTN_CPU_PHASES], int reset) {
  for (int i = 0; i < ATTN_CPU_PHASES; ++i)
    out[i] = reset ? __atomic_exchange_n(&fwd_phase_totals[i], 0, __ATOMIC_RELAXED)
                   : __atomic_load_n(&fwd_phase_totals[i], __ATOMIC_RELAXED);
}
#define PHASE_MARK(v) const uint64_t v = __rdtsc()
#define PHASE_ADD(t, ph, since) ((t)->ticks[ATTN_CPU_PHASE_##ph] += __rdtsc() - (since))
#define PHASE_COUNT(t, ph) (++(t)->ticks[ATTN_CPU_PHASE_##ph])
#else
#define PHASE_MARK(v) ((void)0)
#define PHASE_ADD(t, ph, since) ((void)0)
#define PHASE_COUNT(t, ph) ((void)0)
#endif

/* Whether any of x[0..n) is NaN or infinite: its exponent bits all ones. Independent tests ORed
 * (a sum such as 0 * x over the block is one chain of dependent additions, 4 cycles each). */
static int f32_any_nonfinite(const float *x, int64_t n) {
  uint32_t bad = 0;
  for (int64_t e = 0; e < n; ++e) {
    uint32_t u;
    memcpy(&u, x + e, sizeof u);
    bad |= (u & 0x7f800000u) == 0x7f800000u;
  }
  return bad != 0;
}
static int bf16_any_nonfinite(const uint16_t *x, int64_t n) {
  unsigned bad = 0;
  for (int64_t e = 0; e < n; ++e) bad |= (x[e] & 0x7f80u) == 0x7f80u;
  return bad != 0;
}

/* Packs key block kb of a pair: K^T and V, either may be NULL; returns 1 when the block's V holds a
 * NaN or an infinity. Row-major: K^T as [D][bk] (columns past the sequence zero), V as [bk][Dvp].
 * For a table with gemm_panels (cpu.h), as its panels of 16 columns: K^T as [bk / 16][D][16], V
 * as [Dvp / 16][bk][16] (panel_stride 16 D and 16 bk); padding columns are zero either way. K goes
 * 16 keys at a time, read in place (f32 rows of unit stride, not paged) or loaded through `keys`
 * (16 D floats of scratch), then transposed so that each d's 16 values are stored together, one
 * 64-byte line (transpose16 where the table has it). A key at a time, as before, its D values went
 * to lines 4 bk bytes apart, which share a few L1 sets, and nearly every store missed: packing took
 * 9% of the f32 forward at d128 and 16% causal, one thread (issue 15). */
static int pack_kv_block(const cpu_run *c, const cpu_seq *s, int64_t kb, float *kt, float *v,
                         float *keys) {
  const attn_inputs *in = c->in;
  const attn_cpu_kernels *k = c->kern;
  const int panels = k->gemm_panels != NULL;
  const int64_t bk = c->bk, j0 = kb * bk, nk = min64(bk, s->s.len_k - j0), D = c->D;
  const int64_t kds = token_dstride(c, &in->k), vds = token_dstride(c, &in->v);
  /* rows read in place: f32, unit stride, evenly spaced (no pages); V also without padding */
  const int in_place = c->dt == ATTN_DTYPE_F32 && c->p->page_size == 0;
  const int k_in_place = in_place && kds == 1, v_in_place = in_place && vds == 1 && c->Dv == c->Dvp;
  /* An f8e4m3 problem's K and V are decoded here, times their descale factors (docs/FP8.md): the
   * product of an e4m3 value and an f32 factor is rounded once, to f32. */
  const float k_descale = attn_descale_of(c->p, &in->k_descale, s->b, s->g);
  const float v_descale = attn_descale_of(c->p, &in->v_descale, s->b, s->g);
  for (int64_t jb = 0; kt != NULL && jb < nk; jb += 16) {
    const int64_t n = min64(16, nk - jb);
    const float *src = keys;
    int64_t lds = D;
    if (k_in_place && n == 16) {
      const int64_t off = kv_off(c, &in->k, s, j0 + jb);
      src = (const float *)in->k.data + off, lds = kv_off(c, &in->k, s, j0 + jb + 1) - off;
    } else {
      for (int64_t i = 0; i < n; ++i)
        load_vec(c, in->k.data, kv_off(c, &in->k, s, j0 + jb + i), kds, D, k_descale,
                 keys + i * D);
      for (int64_t i = n; i < 16; ++i) memset(keys + i * D, 0, (size_t)D * sizeof(float));
    }
    /* K^T's element (d, jb + i) at dst[d * ld + i] */
    float *dst = panels ? kt + jb * D : kt + jb;
    const int64_t ld = panels ? 16 : bk;
    if (panels && k->transpose16 != NULL) {
      k->transpose16(src, lds, D, dst);
    } else {
      for (int64_t d = 0; d < D; ++d)
        for (int64_t i = 0; i < 16; ++i) dst[d * ld + i] = src[i * lds + d];
    }
  }
  for (int64_t d = 0; kt != NULL && !panels && d < D; ++d) /* the rest of the rows */
    for (int64_t jj = round_up(nk, 16); jj < bk; ++jj) kt[d * bk + jj] = 0.0f;
  if (v == NULL) return 0;
  int bad = 0;
  for (int64_t jj = 0; jj < nk; ++jj) {
    const int64_t off = kv_off(c, &in->v, s, j0 + jj);
    const float *row;
    if (panels && v_in_place) {
      row = (const float *)in->v.data + off;
    } else {
      float *r = panels ? keys : v + jj * c->Dvp;
      load_vec(c, in->v.data, off, vds, c->Dv, v_descale, r);
      for (int64_t d = c->Dv; d < c->Dvp; ++d) r[d] = 0.0f;
      row = r;
    }
    bad |= f32_any_nonfinite(row, c->Dv);
    for (int64_t d0 = 0; panels && d0 < c->Dvp; d0 += 16)
      memcpy(v + d0 * bk + jj * 16, row + d0, 16 * sizeof(float));
  }
  return bad;
}

/* o += p v over the rows of a tile, skipping the zero entries of p: 0 * inf and 0 * NaN are NaN,
 * and a value a row does not see (masked, or dropped) must not reach its output (SPEC: NaN only in
 * the rows it reaches). The slow path of blocks whose V holds non-finite values. V's element
 * (jj, d) is v[d / 16 * panel_stride + jj * ldv + d % 16]: rows (panel_stride 16, ldv dvp) or
 * pack_kv_block's panels (panel_stride 16 bk, ldv 16). */
static void pv_skipping_zeros(int64_t rows, int64_t nk, int64_t dvp, const float *p, int64_t ldp,
                              const float *v, int64_t ldv, int64_t panel_stride, float *o) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t jj = 0; jj < nk; ++jj) {
      const float w = p[r * ldp + jj];
      if (w == 0.0f) continue;
      for (int64_t d = 0; d < dvp; ++d)
        o[r * dvp + d] += w * v[d / 16 * panel_stride + jj * ldv + d % 16];
    }
}

typedef struct fwd_thread {
  float *q, *s, *o, *m, *l;
  float *tmp;          /* scratch of packing: 16 key rows (f32, or bf16 for gemm_bf16) */
  uint16_t *qh, *ph;   /* Q [bq][round_up(D, 32)], P [bq][2 bk] (hi, lo) as bf16 (gemm_bf16) */
  void *scratch;       /* gemm's */
#ifdef ATTN_CPU_FWD_PHASES
  uint64_t ticks[ATTN_CPU_PHASES];
#endif
} fwd_thread;

/* dst[d] = the bf16 of element d of a row of the run's dtype (the bits themselves for bf16: exact)
 * for d < n, zero for n <= d < np. */
static void load_bf16_row(const cpu_run *c, const void *base, int64_t off, int64_t stride,
                          int64_t n, int64_t np, uint16_t *dst) {
  if (c->dt == ATTN_DTYPE_BF16 && stride == 1) {
    memcpy(dst, (const uint16_t *)base + off, (size_t)n * sizeof(uint16_t));
  } else {
    for (int64_t d = 0; d < n; ++d)
      dst[d] = c->dt == ATTN_DTYPE_BF16 ? ((const uint16_t *)base)[off + d * stride]
                                        : attn_inline_f32_to_bf16(load1(base, c->dt, off + d * stride));
  }
  memset(dst + n, 0, (size_t)(np - n) * sizeof(uint16_t));
}

/* The forward pass of query block qb of head h. Tables with gemm_bf16 (AMX) multiply bf16 rows:
 * Q rounded once here (exact for bf16 inputs), P written as bf16 by exp_sum_bf16, K^T and V
 * packed by cpu_forward; the others multiply the f32 tiles with gemm_panels (K^T and V as panels,
 * pack_kv_block) or gemm. P V rounds P to bf16 on a
 * bf16 problem (the bf16 tables' gemm rounds its operands), as FlashAttention does, while l sums
 * the unrounded P; with sinks it keeps P exact instead (gemm_exact, or on tiles two bf16 terms
 * hi + lo in one product twice as deep), which dsinks needs: cpu.h's gemm_exact says why. Blocks
 * of a V that holds NaN or inf (v_bad) multiply skipping P's zeros, in f32. */
static void forward_block(const cpu_run *c, const cpu_seq *s, int64_t h, int64_t qb,
                          const float *kt_all, const float *v_all, const float *v_bad,
                          fwd_thread *t) {
  const attn_problem *p = c->p;
  const attn_inputs *in = c->in;
  const attn_outputs *out = c->run->outputs;
  const attn_cpu_kernels *k = c->kern;
  const int64_t i0 = qb * c->bq, rows = min64(c->bq, s->s.len_q - i0);
  const int64_t bk = c->bk;
  const int tiles = k->gemm_bf16 != NULL, panels = k->gemm_panels != NULL;
  const int64_t ldqh = round_up(c->D, 32);
  const int exact_p = p->num_sinks > 0; /* P V on exact P: gemm_exact, or two bf16 terms */

  /* Q block, rows [i0, i0 + rows). The scale s is applied to S = Q K^T in f32, never to Q: the
   * bf16 gemm rounds its operands to bf16, exact for the inputs but not for s * q. */
  PHASE_MARK(q_start);
  const int64_t qds = token_dstride(c, &in->q);
  const float q_descale = attn_descale_of(p, &in->q_descale, s->b, s->g); /* 1 but for fp8 */
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t qoff = token_off(c, &in->q, s->b, s->s.q_row0 + i0 + r, h);
    if (tiles) load_bf16_row(c, in->q.data, qoff, qds, c->D, ldqh, t->qh + r * ldqh);
    else load_vec(c, in->q.data, qoff, qds, c->D, q_descale, t->q + r * c->Dp);
  }
  memset(t->o, 0, (size_t)(rows * c->Dvp) * sizeof(float));
  /* Sinks enter the running max and sum once, here. */
  for (int64_t r = 0; r < rows; ++r) {
    float m = -INFINITY, l = 0.0f;
    for (int64_t a = 0; a < p->num_sinks; ++a) m = fmaxf(m, sink_logit(c, h, a));
    for (int64_t a = 0; a < p->num_sinks; ++a) l += expf(sink_logit(c, h, a) - m);
    t->m[r] = m, t->l[r] = l;
  }
  PHASE_ADD(t, QO, q_start);

  int64_t kb_lo, kb_hi;
  key_block_range(c, s, i0, rows, &kb_lo, &kb_hi);
  for (int64_t kb = kb_lo; kb < kb_hi; ++kb) {
    const int64_t kj0 = kb * bk, knk = min64(bk, s->s.len_k - kb * bk);
    /* On the f32 path (128-row blocks: fwd_bq) a key block the window cuts (a causal diagonal) runs
     * in slices of DIAG_ROWS rows, each trimmed to the keys its own rows see: the whole block,
     * trimmed for its last row, computed a triangle of 128 x 128 / 2 hidden scores, 6% of a causal
     * T = 2048 forward. */
    const int64_t slice = panels && !window_covers(c, s, i0, rows, kj0, knk) ? DIAG_ROWS : rows;
    for (int64_t r0 = 0; r0 < rows; r0 += slice) {
      /* the slice: the block's rows [r0, r0 + nr), queries from ia */
      const int64_t nr = min64(slice, rows - r0), ia = i0 + r0;
      int64_t off, nk;
      trim_block(c, s, ia, nr, kj0, knk, &off, &nk);
      if (nk == 0) continue;
      const int64_t j0 = kj0 + off, nkp = round_up(nk, ATTN_CPU_NPAD), npp = round_up(nk, 32);
      /* K^T [D][bk], or its panels, or its pairs (tiles); V [bk][Dvp], or its panels, or its pairs
       * (tiles, finite V); pack_kv_block says which */
      const float *kt = kt_all + kb * c->D * bk;
      const float *v = v_all + kb * bk * c->Dvp;
      float *sr = t->s + r0 * bk, *orow = t->o + r0 * c->Dvp; /* the slice's S and O */
      uint16_t *phr = t->ph + r0 * 2 * bk;
      PHASE_COUNT(t, BLOCKS);
      PHASE_MARK(qk_start);
      if (tiles)
        k->gemm_bf16(nr, nkp, c->D, t->qh + r0 * ldqh, ldqh, 1, (const uint16_t *)kt + 2 * off,
                     2 * bk, sr, bk, 0, t->scratch);
      else if (panels)
        k->gemm_panels(nr, nkp, c->D, t->q + r0 * c->Dp, c->Dp, kt + off * c->D, 16 * c->D, sr, bk,
                       0);
      else
        k->gemm(nr, nkp, c->D, t->q + r0 * c->Dp, c->Dp, 0, kt + off, bk, sr, bk, 0, t->scratch);
      PHASE_ADD(t, QK, qk_start);
      PHASE_MARK(sm_start);
      /* S = s Q K^T, masked. Scaling and the row max are one pass where no mask comes between; with
       * s > 0 and an exp pass that takes the scale (tiles' exp_sum_bf16, exp_sum_scaled) the scale
       * is not applied to S at all but inside the exp pass, the row max being s max(x) = max(s x)
       * (rounding is monotonic), which spares a pass writing S. */
      const int fused = k->scale_max != NULL && !c->features && window_covers(c, s, ia, nr, j0, nk);
      const int scale_in_exp =
          fused && c->scale > 0.0f && (tiles || k->exp_sum_scaled != NULL);
      if (!fused) {
        for (int64_t r = 0; r < nr; ++r) k->scale(sr + r * bk, nk, c->scale);
        apply_masks(c, s, h, ia, nr, j0, nk, sr, bk, NULL);
      }
      for (int64_t r = r0; r < r0 + nr; ++r) {
        float *x = t->s + r * bk;
        uint16_t *ph = t->ph + r * 2 * bk; /* hi in [0, npp), lo (exact_p) in [npp, 2 npp) */
        const float m_blk = scale_in_exp ? k->row_max(x, nk) * c->scale
                            : fused       ? k->scale_max(x, nk, c->scale)
                                          : k->row_max(x, nk);
        const float m_new = fmaxf(t->m[r], m_blk);
        if (m_new == -INFINITY) { /* nothing visible yet: P = 0 */
          if (tiles) memset(ph, 0, (size_t)(2 * npp) * sizeof(uint16_t));
          else memset(x, 0, (size_t)nk * sizeof(float));
          continue;
        }
        const float alpha = t->m[r] == m_new ? 1.0f : expf(t->m[r] - m_new);
        const float sum =
            tiles          ? k->exp_sum_bf16(x, nk, scale_in_exp ? c->scale : 1.0f, m_new, ph,
                                             exact_p ? ph + npp : NULL, npp)
            : scale_in_exp ? k->exp_sum_scaled(x, nk, c->scale, m_new)
                           : k->exp_sum(x, nk, m_new);
        t->l[r] = t->l[r] * alpha + sum;
        if (alpha != 1.0f) k->scale(t->o + r * c->Dvp, c->Dvp, alpha);
        t->m[r] = m_new;
        if (c->dropout) { /* P' = 0 where dropped; keep_scale is applied with 1 / l at the end */
          uint8_t keep[MAX_BK];
          dropout_keep(c, s->b, h, i0 + r, j0, nk, keep);
          for (int64_t jj = 0; jj < nk; ++jj) {
            if (keep[jj]) continue;
            if (tiles) ph[jj] = ph[npp + jj] = 0;
            else x[jj] = 0.0f;
          }
        }
      }
      PHASE_ADD(t, SOFTMAX, sm_start);
      PHASE_MARK(pv_start);
      if (v_bad[kb] != 0.0f) { /* V of this block in f32 (cpu_forward), P in f32 */
        if (tiles)
          for (int64_t r = 0; r < nr; ++r) {
            const uint16_t *ph = phr + r * 2 * bk;
            for (int64_t jj = 0; jj < nk; ++jj)
              sr[r * bk + jj] = attn_f32_from_bits((uint32_t)ph[jj] << 16) +
                                (exact_p ? attn_f32_from_bits((uint32_t)ph[npp + jj] << 16) : 0.0f);
          }
        if (panels)
          pv_skipping_zeros(nr, nk, c->Dvp, sr, bk, v + off * 16, 16, 16 * bk, orow);
        else
          pv_skipping_zeros(nr, nk, c->Dvp, sr, bk, v + off * c->Dvp, c->Dvp, 16, orow);
      } else if (tiles) {
        k->gemm_bf16(nr, c->Dvp, nk, phr, 2 * bk, exact_p ? 2 : 1,
                     (const uint16_t *)v + off * c->Dvp, 2 * c->Dvp, orow, c->Dvp, 1, t->scratch);
      } else if (panels) { /* f32 P V: exact whether or not there are sinks */
        k->gemm_panels(nr, c->Dvp, nk, sr, bk, v + off * 16, 16 * bk, orow, c->Dvp, 1);
      } else {
        (exact_p ? k->gemm_exact : k->gemm)(nr, c->Dvp, nk, sr, bk, 0, v + off * c->Dvp, c->Dvp,
                                            orow, c->Dvp, 1, t->scratch);
      }
      PHASE_ADD(t, PV, pv_start);
    }
  }

  PHASE_MARK(o_start);
  const int64_t ods = token_dstride(c, &out->out);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = s->s.q_row0 + i0 + r;
    const int64_t ooff = token_off(c, &out->out, s->b, row, h);
    float lse;
    if (t->m[r] == -INFINITY) { /* fully masked: out = 0, lse = -inf */
      memset(t->o + r * c->Dvp, 0, (size_t)c->Dv * sizeof(float));
      store_vec(c, out->out.data, ooff, ods, c->Dv, t->o + r * c->Dvp, 1.0f);
      lse = -INFINITY;
    } else {
      store_vec(c, out->out.data, ooff, ods, c->Dv, t->o + r * c->Dvp, c->keep_scale / t->l[r]);
      lse = t->m[r] + logf(t->l[r]);
    }
    if (out->lse.data != NULL) ((float *)out->lse.data)[lse_off(c, &out->lse, s->b, h, row)] = lse;
  }
  PHASE_ADD(t, QO, o_start);
}

/* Key block kb of a pair as pack_b's bf16 pairs (cpu.h), for tables with gemm_bf16 (AMX: x86, so
 * little-endian words), from bf16 rows with no f32 step: K^T's pair row p holds per key jj the
 * 32-bit word (K[jj][2p], K[jj][2p + 1]), which is word p of K's own row, so K^T's pairs are K's
 * rows read as words and transposed; V's pair row p interleaves rows 2p and 2p + 1 word by word.
 * Keys past the sequence are zero columns of K^T (V's pair rows past nk are never read). Through
 * f32 tiles and pack_b, as the other tables pack, this took 10-20% of the AMX forward (issue 15).
 * The transpose goes 16 keys at a time, through `scratch`, so that each store of K^T fills
 * consecutive words of one line: a key at a time, its words went to lines 4 bk bytes apart, which
 * share a few L1 sets (4 of 64 at bk = 256), and nearly every store missed: packing still took
 * 10-15% of the forward at 16 threads. Returns 1 when the block's V holds NaN or inf. scratch:
 * 16 round_up(D, 2) + 2 round_up(Dvp, 2) bf16. */
static int pack_kv_pairs(const cpu_run *c, const cpu_seq *s, int64_t kb, uint32_t *kt, uint32_t *v,
                         uint16_t *scratch) {
  const attn_inputs *in = c->in;
  const int64_t bk = c->bk, j0 = kb * bk, nk = min64(bk, s->s.len_k - j0);
  const int64_t kw = (c->D + 1) / 2; /* words of a key row */
  const int64_t kds = token_dstride(c, &in->k), vds = token_dstride(c, &in->v);
  uint16_t *keys = scratch; /* 16 key rows of 2 kw bf16 */
  for (int64_t jb = 0; jb < nk; jb += 16) {
    const int64_t n = min64(16, nk - jb);
    for (int64_t i = 0; i < n; ++i)
      load_bf16_row(c, in->k.data, kv_off(c, &in->k, s, j0 + jb + i), kds, c->D, 2 * kw,
                    keys + i * 2 * kw);
    for (int64_t p = 0; p < kw; ++p)
      for (int64_t i = 0; i < n; ++i) memcpy(kt + p * bk + jb + i, keys + i * 2 * kw + 2 * p, 4);
  }
  if (nk < bk)
    for (int64_t p = 0; p < kw; ++p)
      memset(kt + p * bk + nk, 0, (size_t)(bk - nk) * sizeof(uint32_t));
  int bad = 0;
  uint16_t *r0 = scratch + 16 * 2 * kw, *r1 = r0 + round_up(c->Dvp, 2);
  for (int64_t p = 0; 2 * p < nk; ++p) {
    load_bf16_row(c, in->v.data, kv_off(c, &in->v, s, j0 + 2 * p), vds, c->Dv, c->Dvp, r0);
    if (2 * p + 1 < nk)
      load_bf16_row(c, in->v.data, kv_off(c, &in->v, s, j0 + 2 * p + 1), vds, c->Dv, c->Dvp, r1);
    else
      memset(r1, 0, (size_t)c->Dvp * sizeof(uint16_t));
    bad |= bf16_any_nonfinite(r0, c->Dv) | bf16_any_nonfinite(r1, c->Dv);
    uint32_t *o = v + p * c->Dvp;
    for (int64_t col = 0; col < c->Dvp; ++col) o[col] = r0[col] | (uint32_t)r1[col] << 16;
  }
  return bad;
}

/* Packs key block kb of a pair into its slot: K^T and V in f32, or (tables with gemm_bf16) as
 * pack_b's pairs through tmp, in the f32 block's place (they take at most as many bytes). A block
 * whose V holds NaN or inf keeps V in f32 for forward_block's slow path, which a tile product
 * cannot take (0 * inf is NaN there too), and says so in v_bad[kb]. */
static void forward_pack(const cpu_run *c, const cpu_seq *s, int64_t kb, float *kt, float *v,
                         float *v_bad, float *tmp) {
  const attn_cpu_kernels *k = c->kern;
  int bad;
  if (k->gemm_bf16 == NULL) {
    bad = pack_kv_block(c, s, kb, kt, v, tmp);
  } else {
    bad = pack_kv_pairs(c, s, kb, (uint32_t *)kt, (uint32_t *)v, (uint16_t *)tmp);
    if (bad) pack_kv_block(c, s, kb, NULL, v, tmp);
  }
  v_bad[kb] = bad ? 1.0f : 0.0f;
}

static attn_status cpu_forward(const attn_run *run) {
  attn_paged_append(run->problem, run->inputs); /* a paged cache's new rows first */
  /* The decode path knows no global positions (run->positions, a block of a sharded problem). */
  if (run->positions == NULL && attn_cpu_decode_applies(run->problem))
    return attn_cpu_decode_forward(run, run->state != NULL ? (const attn_cpu_kernels *)run->state
                                                           : select_kernels((attn_dtype)run->problem->dtype));
  cpu_run c = make_cpu_run(run);
  c.bq = fwd_bq(c.kern, c.bq), c.nqb = (c.Tq + c.bq - 1) / c.bq;
  const fwd_layout lay = fwd_layout_of(c.p, c.bq, c.bk);
  c.chunk = fwd_chunk(c.p, &lay);
  float *ws = (float *)run->workspace;
  float *packs = ws;
  float *thread_base = ws + c.chunk * lay.slot;
  c.nthreads = run_threads(run, c.chunk * lay.slot, lay.per_thread);
  /* A slot: K^T blocks, V blocks, v_bad per block */
  const int64_t kt_size = round_up(c.nkb * c.bk * c.D, 16);
  const int64_t v_size = round_up(c.nkb * c.bk * c.Dvp, 16);

  forward_outside_rows(&c, run->outputs);
  const int64_t nphases = (c.npairs + c.chunk - 1) / c.chunk;

#ifdef _OPENMP
#pragma omp parallel num_threads(c.nthreads)
#endif
  {
    PHASE_MARK(region_start);
    float *tb = thread_base + (int64_t)thread_id() * lay.per_thread;
    fwd_thread t;
#ifdef ATTN_CPU_FWD_PHASES
    memset(t.ticks, 0, sizeof t.ticks);
#endif
    t.q = tb;
    t.s = t.q + round_up(c.bq * c.Dp, 16);
    t.o = t.s + round_up(c.bq * c.bk, 16);
    t.m = t.o + round_up(c.bq * c.Dvp, 16);
    t.l = t.m + round_up(c.bq, 16);
    t.tmp = t.l + round_up(c.bq, 16);
    t.qh = (uint16_t *)(t.tmp + round_up(max64(c.D * c.bk, c.bk * c.Dvp), 16));
    t.ph = t.qh + 2 * round_up(c.bq * round_up(c.D, 32) / 2, 16);
    t.scratch = (float *)t.ph + round_up(c.bq * c.bk, 16);
    for (int64_t ph = 0; ph < nphases; ++ph) {
      const int64_t pair0 = ph * c.chunk, npair = min64(c.chunk, c.npairs - pair0);
      const int64_t npack = npair * c.nkb;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
      for (int64_t it = 0; it < npack; ++it) {
        const int64_t pr = it / c.nkb, kb = it % c.nkb;
        const cpu_seq s = make_seq(&c, pair0 + pr);
        if (kb * c.bk >= s.s.len_k) continue;
        float *slot = packs + pr * lay.slot;
        PHASE_MARK(pack_start);
        forward_pack(&c, &s, kb, slot + kb * c.D * c.bk, slot + kt_size + kb * c.bk * c.Dvp,
                     slot + kt_size + v_size, t.tmp);
        after_item(&c);
        PHASE_ADD(&t, PACK, pack_start);
      }
      /* Heaviest first over the whole phase: later query blocks see more keys under a
       * bottom-right causal mask, so every (pair, head)'s last block goes before any second to
       * last (taken pair by pair instead, the last pair's heaviest blocks came at the end) */
      const int64_t nwork = npair * c.group * c.nqb, heads = npair * c.group;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
      for (int64_t it = 0; it < nwork; ++it) {
        const int64_t qb = c.nqb - 1 - it / heads;
        const int64_t hh = it % c.group, pr = (it % heads) / c.group;
        const cpu_seq s = make_seq(&c, pair0 + pr);
        if (qb * c.bq >= s.s.len_q) continue;
        const float *slot = packs + pr * lay.slot;
        forward_block(&c, &s, s.g * c.group + hh, qb, slot, slot + kt_size, slot + kt_size + v_size,
                      &t);
        after_item(&c);
      }
    }
    if (c.kern->tiles_release != NULL) c.kern->tiles_release();
    PHASE_ADD(&t, REGION, region_start);
#ifdef ATTN_CPU_FWD_PHASES
    for (int i = 0; i < ATTN_CPU_PHASES; ++i)
      __atomic_fetch_add(&fwd_phase_totals[i], t.ticks[i], __ATOMIC_RELAXED);
#endif
  }
  return ATTN_STATUS_OK;
}

/* ---- backward ------------------------------------------------------------------------------------ */

typedef struct bwd_thread {
  float *kr, *kt, *vt, *dk, *dv, *sp, *dp, *pd, *dc, *dbias;
  uint16_t *ktp, *vtp, *krp; /* kt, vt, kr as pack_b's pairs (tables with gemm_packed) */
  void *scratch; /* gemm's */
} bwd_thread;

typedef struct bwd_shared {
  float *dbias;      /* shared dbias accumulator (or NULL) */
  float *lse, *delta; /* [chunk][group][Tq] */
  /* [chunk][group][Tq][Dp] and [..][Dvp]: q and dout rows as f32 (zero padded), converted once per
   * phase; every key block of the pair multiplies them, and converting them per key block took 13%
   * of a bf16 backward (issue 12's ring profile) */
  float *q, *dout;
  float *dq;          /* [chunk][group][Tq][Dp]: dQ / s of the phase, summed over key blocks */
  float *locks;       /* [chunk][group][nqb] locks of dq's query blocks, LOCK_STRIDE floats apart */
  /* bwd_rows: the rows of q and dout once more as bf16, [chunk][group][rows_p] rows with rows_p =
   * Tq rounded up to 16, packed per query block: qh and doh as gemm_bf16's A (ldq, ldv words a
   * row), qp and dop as pack_b's pairs (Dp, Dvp words a row); NULL on other tables */
  uint16_t *qh, *doh, *qp, *dop;
  int64_t rows_p, ldq, ldv;
  float *thread_base;
  int64_t per_thread;
} bwd_shared;

/* dq's query blocks take every key block's dS K, from whichever thread runs it: one lock per block
 * (a spin lock: it is held for one bq x D x bk product, and threads walk the blocks in different
 * orders, so they rarely meet). Without OpenMP there is one thread and no lock. */
#ifdef _OPENMP
static atomic_int *dq_lock(const bwd_shared *sh, int64_t unit) {
  return (atomic_int *)(void *)(sh->locks + unit * LOCK_STRIDE);
}
static void lock_dq(const bwd_shared *sh, int64_t unit) {
  atomic_int *l = dq_lock(sh, unit);
  while (atomic_exchange_explicit(l, 1, memory_order_acquire) != 0)
    while (atomic_load_explicit(l, memory_order_relaxed) != 0) cpu_relax();
}
static void unlock_dq(const bwd_shared *sh, int64_t unit) {
  atomic_store_explicit(dq_lock(sh, unit), 0, memory_order_release);
}
#else
static void lock_dq(const bwd_shared *sh, int64_t unit) { (void)sh, (void)unit; }
static void unlock_dq(const bwd_shared *sh, int64_t unit) { (void)sh, (void)unit; }
#endif

/* Dense index of dbias element (b, head of h, i, 0) and its stride along j in the accumulator. */
static int64_t dbias_row(const cpu_run *c, int64_t b, int64_t h, int64_t i, int64_t *jstride) {
  const int64_t *sh = c->p->bias_shape;
  const int64_t st[4] = {sh[1] * sh[2] * sh[3], sh[2] * sh[3], sh[3], 1};
  *jstride = bcast_jstride(sh, st);
  return bcast_off(sh, st, b, bias_head(c, h), i);
}

static void backward_item(const cpu_run *c, const bwd_shared *sh, const bwd_thread *t, int64_t pr,
                          const cpu_seq *s, int64_t kb, float *dbias) {
  const attn_inputs *in = c->in;
  const attn_cpu_kernels *k = c->kern;
  const int64_t bk = c->bk, bq = c->bq;
  const int64_t j0 = kb * bk, nk = min64(bk, s->s.len_k - j0);
  const int64_t nkp = round_up(nk, ATTN_CPU_NPAD);

  /* K rows [bk][Dp], K^T [D][bk], V^T [Dv][bk] of the block */
  const int64_t kds = token_dstride(c, &in->k), vds = token_dstride(c, &in->v);
  float vrow[4096];
  for (int64_t jj = 0; jj < nk; ++jj) {
    const int64_t krow = s->s.k_row0 + j0 + jj;
    float *kr = t->kr + jj * c->Dp;
    load_vec(c, in->k.data, token_off(c, &in->k, s->b, krow, s->g), kds, c->D, 1.0f, kr);
    for (int64_t d = 0; d < c->D; ++d) t->kt[d * bk + jj] = kr[d];
    for (int64_t d0 = 0; d0 < c->Dv; d0 += 4096) {
      int64_t n = min64(4096, c->Dv - d0);
      load_vec(c, in->v.data, token_off(c, &in->v, s->b, krow, s->g) + d0 * vds, vds, n, 1.0f,
               vrow);
      for (int64_t d = 0; d < n; ++d) t->vt[(d0 + d) * bk + jj] = vrow[d];
    }
  }
  for (int64_t jj = nk; jj < nkp; ++jj) {
    for (int64_t d = 0; d < c->D; ++d) t->kt[d * bk + jj] = 0.0f;
    for (int64_t d = 0; d < c->Dv; ++d) t->vt[d * bk + jj] = 0.0f;
  }
  memset(t->dk, 0, (size_t)(nk * c->Dp) * sizeof(float));
  memset(t->dv, 0, (size_t)(nk * c->Dvp) * sizeof(float));
  const int packed = k->gemm_packed != NULL; /* K^T, V^T and K as bf16 pairs, once per block */
  if (packed) {
    k->pack_b(t->kt, bk, c->D, bk, t->ktp, 2 * bk);
    k->pack_b(t->vt, bk, c->Dv, bk, t->vtp, 2 * bk);
    k->pack_b(t->kr, c->Dp, nk, c->Dp, t->krp, 2 * c->Dp);
  }

  int64_t i_lo, i_hi;
  query_row_range(c, s, j0, nk, &i_lo, &i_hi);
  for (int64_t hh = 0; hh < c->group; ++hh) {
    const int64_t h = s->g * c->group + hh;
    const float *lse = sh->lse + (pr * c->group + hh) * c->Tq;
    const float *delta = sh->delta + (pr * c->group + hh) * c->Tq;
    float *dq = sh->dq + (pr * c->group + hh) * c->Tq * c->Dp;
    const float *q_rows = sh->q + (pr * c->group + hh) * c->Tq * c->Dp;
    const float *dout_rows = sh->dout + (pr * c->group + hh) * c->Tq * c->Dvp;
    /* Threads on other key blocks of this pair walk the same query blocks: each starts at its own
     * place in the range (key block kb at kb / nkb of the way), so they seldom want the same
     * query block's lock at once. */
    const int64_t qb_lo = i_lo / bq, nqb_seen = i_hi > i_lo ? (i_hi - 1) / bq + 1 - qb_lo : 0;
    const int64_t start = nqb_seen > 0 ? kb * nqb_seen / c->nkb : 0;
    for (int64_t step = 0; step < nqb_seen; ++step) {
      const int64_t qb = qb_lo + (start + step) % nqb_seen;
      const int64_t i0 = qb * bq, rows = min64(bq, s->s.len_q - i0);
      /* the columns of the block these rows can see: [off, off + tnk) */
      int64_t off, tnk;
      trim_block(c, s, i0, rows, j0, nk, &off, &tnk);
      if (tnk == 0) continue;
      const int64_t tj0 = j0 + off, tnkp = round_up(tnk, ATTN_CPU_NPAD);
      const float *q = q_rows + i0 * c->Dp, *dout = dout_rows + i0 * c->Dvp;
      const int64_t at = (pr * c->group + hh) * sh->rows_p + i0; /* the block's bf16 rows */
      if (sh->qh != NULL)
        k->gemm_bf16(rows, tnkp, c->D, sh->qh + at * sh->ldq, sh->ldq, 1, t->ktp + 2 * off, 2 * bk,
                     t->sp, bk, 0, t->scratch);
      else if (packed)
        k->gemm_packed(rows, tnkp, c->D, q, c->Dp, 0, t->ktp + 2 * off, 2 * bk, t->sp, bk, 0,
                       t->scratch);
      else
        k->gemm(rows, tnkp, c->D, q, c->Dp, 0, t->kt + off, bk, t->sp, bk, 0, t->scratch);
      for (int64_t r = 0; r < rows; ++r) k->scale(t->sp + r * bk, tnk, c->scale);
      apply_masks(c, s, h, i0, rows, tj0, tnk, t->sp, bk, t->dc);
      if (sh->qh != NULL)
        k->gemm_bf16(rows, tnkp, c->Dv, sh->doh + at * sh->ldv, sh->ldv, 1, t->vtp + 2 * off,
                     2 * bk, t->dp, bk, 0, t->scratch);
      else if (packed)
        k->gemm_packed(rows, tnkp, c->Dv, dout, c->Dvp, 0, t->vtp + 2 * off, 2 * bk, t->dp, bk,
                       0, t->scratch);
      else
        k->gemm(rows, tnkp, c->Dv, dout, c->Dvp, 0, t->vt + off, bk, t->dp, bk, 0, t->scratch);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        float *pr_ = t->sp + r * bk, *dp = t->dp + r * bk;
        if (lse[i] == -INFINITY) { /* a fully masked row contributes nothing */
          memset(pr_, 0, (size_t)tnk * sizeof(float));
          memset(dp, 0, (size_t)tnk * sizeof(float));
          if (t->pd != NULL) memset(t->pd + r * bk, 0, (size_t)tnk * sizeof(float));
          continue;
        }
        k->exp_sum(pr_, tnk, lse[i]); /* P = exp(x - lse), 0 where masked */
        if (c->dropout) {
          float *pd = t->pd + r * bk;
          uint8_t keep[MAX_BK];
          dropout_keep(c, s->b, h, i, tj0, tnk, keep);
          for (int64_t jj = 0; jj < tnk; ++jj) {
            const float ks = keep[jj] ? c->keep_scale : 0.0f;
            pd[jj] = pr_[jj] * ks;
            dp[jj] *= ks;
          }
        }
        k->ds_row(dp, pr_, tnk, delta[i]);
        if (c->softcap > 0.0f) {
          const float *dc = t->dc + r * bk;
          for (int64_t jj = 0; jj < tnk; ++jj) dp[jj] *= dc[jj];
        }
        if (dbias != NULL) {
          int64_t js, at = dbias_row(c, s->b, h, i, &js);
          for (int64_t jj = 0; jj < tnk; ++jj) dbias[at + (tj0 + jj) * js] += dp[jj];
        }
      }
      if (sh->qh != NULL) {
        k->gemm_packed(tnk, c->Dvp, rows, c->dropout ? t->pd : t->sp, bk, 1, sh->dop + at * c->Dvp,
                       2 * c->Dvp, t->dv + off * c->Dvp, c->Dvp, 1, t->scratch);
        k->gemm_packed(tnk, c->Dp, rows, t->dp, bk, 1, sh->qp + at * c->Dp, 2 * c->Dp,
                       t->dk + off * c->Dp, c->Dp, 1, t->scratch);
      } else {
        k->gemm(tnk, c->Dvp, rows, c->dropout ? t->pd : t->sp, bk, 1, dout, c->Dvp,
                t->dv + off * c->Dvp, c->Dvp, 1, t->scratch);
        k->gemm(tnk, c->Dp, rows, t->dp, bk, 1, q, c->Dp, t->dk + off * c->Dp, c->Dp, 1,
                t->scratch);
      }
      const int64_t unit = (pr * c->group + hh) * c->nqb + qb;
      lock_dq(sh, unit);
      if (packed)
        k->gemm_packed(rows, c->Dp, tnk, t->dp, bk, 0, t->krp + off * c->Dp, 2 * c->Dp,
                       dq + i0 * c->Dp, c->Dp, 1, t->scratch);
      else
        k->gemm(rows, c->Dp, tnk, t->dp, bk, 0, t->kr + off * c->Dp, c->Dp, dq + i0 * c->Dp, c->Dp, 1, t->scratch);
      unlock_dq(sh, unit);
    }
  }

  const attn_grads *g = c->run->grads;
  const int64_t dkds = token_dstride(c, &g->dk), dvds = token_dstride(c, &g->dv);
  for (int64_t jj = 0; jj < nk; ++jj) {
    const int64_t krow = s->s.k_row0 + j0 + jj;
    store_vec(c, g->dk.data, token_off(c, &g->dk, s->b, krow, s->g), dkds, c->D,
              t->dk + jj * c->Dp, c->scale); /* dK = s dS^T Q */
    store_vec(c, g->dv.data, token_off(c, &g->dv, s->b, krow, s->g), dvds, c->Dv,
              t->dv + jj * c->Dvp, 1.0f);
  }
}

/* dq, dk, dv = 0 on rows that belong to no sequence. */
static void backward_outside_rows(const cpu_run *c) {
  const attn_problem *p = c->p;
  const attn_grads *g = c->run->grads;
  if (p->varlen == ATTN_VARLEN_NONE) return;
  for (int64_t b = 0; b < (c->packed ? 1 : c->B); ++b) {
    int64_t q0 = c->packed ? c->in->cu_seqlens_q[c->B] : c->in->seqlens_q[b];
    int64_t q1 = c->packed ? p->total_q : c->Tq;
    int64_t k0 = c->packed ? c->in->cu_seqlens_k[c->B] : c->in->seqlens_k[b];
    int64_t k1 = c->packed ? p->total_k : c->Tk;
    zero_token_rows(c, &g->dq, c->Hq, c->D, b, q0, q1);
    zero_token_rows(c, &g->dk, c->Hkv, c->D, b, k0, k1);
    zero_token_rows(c, &g->dv, c->Hkv, c->Dv, b, k0, k1);
  }
}

/* dsinks[h, t] = -sum_{b, i} exp(a_t - lse_i) Delta_i (over heads too for shared sinks). */
static void backward_dsinks(const cpu_run *c) {
  const attn_problem *p = c->p;
  const attn_grads *g = c->run->grads;
  const attn_outputs *fwd = c->run->outputs;
  const int64_t S = p->num_sinks;
  const int64_t n = p->sinks_shared ? S : c->Hq * S;
  double *acc = calloc((size_t)n, sizeof(double));
  float *o = malloc((size_t)c->Dv * sizeof(float)), *dout = malloc((size_t)c->Dv * sizeof(float));
  if (acc == NULL || o == NULL || dout == NULL) {
    free(acc), free(o), free(dout);
    return;
  }
  for (int64_t b = 0; b < c->B; ++b) {
    attn_seq seq = attn_seq_of(p, c->in, b);
    for (int64_t h = 0; h < c->Hq; ++h)
      for (int64_t i = 0; i < seq.len_q; ++i) {
        const int64_t row = seq.q_row0 + i;
        const float lse = ((const float *)fwd->lse.data)[lse_off(c, &fwd->lse, b, h, row)];
        if (lse == -INFINITY) continue;
        load_vec(c, fwd->out.data, token_off(c, &fwd->out, b, row, h),
                 token_dstride(c, &fwd->out), c->Dv, 1.0f, o);
        load_vec(c, c->run->dout->data, token_off(c, c->run->dout, b, row, h),
                 token_dstride(c, c->run->dout), c->Dv, 1.0f, dout);
        float delta = 0.0f;
        for (int64_t d = 0; d < c->Dv; ++d) delta += o[d] * dout[d];
        for (int64_t a = 0; a < S; ++a)
          acc[(p->sinks_shared ? 0 : h * S) + a] -= expf(sink_logit(c, h, a) - lse) * delta;
      }
  }
  const attn_tensor *ds = &g->dsinks;
  for (int64_t e = 0; e < n; ++e) {
    int64_t off = p->sinks_shared ? e * ds->stride[0] : (e / S) * ds->stride[0] + (e % S) * ds->stride[1];
    ((float *)ds->data)[off] = (float)acc[e];
  }
  free(acc), free(o), free(dout);
}

/* Writes a dense f32 accumulator of the bias shape into dbias (its dtype and strides). */
static void write_dbias(const cpu_run *c, const float *acc) {
  const attn_tensor *t = &c->run->grads->dbias;
  const int64_t *sh = c->p->bias_shape;
  int64_t e = 0;
  for (int64_t a = 0; a < sh[0]; ++a)
    for (int64_t h = 0; h < sh[1]; ++h)
      for (int64_t i = 0; i < sh[2]; ++i)
        for (int64_t j = 0; j < sh[3]; ++j, ++e)
          store1(t->data, (attn_dtype)c->p->bias_dtype,
                 a * t->stride[0] + h * t->stride[1] + i * t->stride[2] + j * t->stride[3], acc[e]);
}

static attn_status cpu_backward(const attn_run *run) {
  cpu_run c = make_cpu_run(run);
  const attn_problem *p = c.p;
  const bwd_layout lay = bwd_layout_of(p, c.kern, c.bq, c.bk);
  /* The chunk was fixed by workspace_size; recompute it the same way, shrink it until one thread
   * fits what the workspace holds, then fit the threads. */
  int64_t chunk = bwd_chunk(p, &lay);
  const int64_t room = (int64_t)(run->workspace_size / sizeof(float));
  while (chunk > 1 && lay.shared + chunk * lay.per_pair + lay.per_thread_fixed + lay.per_thread_dbias > room)
    --chunk;
  const int64_t per_thread = lay.per_thread_fixed + lay.per_thread_dbias;
  c.nthreads = run_threads(run, lay.shared + chunk * lay.per_pair, per_thread);
  c.chunk = chunk;
  const int want_dbias = p->has_bias && run->grads->dbias.data != NULL;
  const int private_dbias = p->has_bias && p->bias_shape[3] == 1;
  const int64_t nbias = p->has_bias ? attn_role_numel(p, ATTN_ROLE_BIAS) : 0;

  float *ws = (float *)run->workspace;
  bwd_shared sh;
  sh.dbias = lay.shared > 0 ? ws : NULL;
  sh.lse = ws + lay.shared;
  sh.delta = sh.lse + round_up(chunk * c.group * c.Tq, 16);
  sh.dq = sh.delta + round_up(chunk * c.group * c.Tq, 16);
  sh.q = sh.dq + round_up(chunk * c.group * c.Tq * c.Dp, 16);
  sh.dout = sh.q + round_up(chunk * c.group * c.Tq * c.Dp, 16);
  sh.locks = sh.dout + round_up(chunk * c.group * c.Tq * c.Dvp, 16);
  sh.qh = sh.doh = sh.qp = sh.dop = NULL;
  sh.rows_p = round_up(c.Tq, 16), sh.ldq = round_up(c.D, 32), sh.ldv = round_up(c.Dv, 32);
  if (bwd_rows(c.kern)) {
    const int64_t rows = chunk * c.group * sh.rows_p;
    sh.qh = (uint16_t *)(sh.locks + chunk * c.group * c.nqb * LOCK_STRIDE);
    sh.qp = sh.qh + rows * sh.ldq;
    sh.doh = sh.qp + rows * c.Dp;
    sh.dop = sh.doh + rows * sh.ldv;
  }
  sh.thread_base = ws + lay.shared + chunk * lay.per_pair;
  sh.per_thread = per_thread;
  if (want_dbias && !private_dbias) memset(sh.dbias, 0, (size_t)nbias * sizeof(float));

  backward_outside_rows(&c);
  const int64_t nphases = (c.npairs + chunk - 1) / chunk;
  const attn_outputs *fwd = run->outputs;
  const attn_grads *g = run->grads;
  const attn_inputs *in = c.in;
  const int64_t qds = token_dstride(&c, &in->q), dods = token_dstride(&c, run->dout);
  const int64_t ods = token_dstride(&c, &fwd->out);

#ifdef _OPENMP
#pragma omp parallel num_threads(c.nthreads)
#endif
  {
    const int tid = thread_id();
    float *tb = sh.thread_base + (int64_t)tid * per_thread;
    bwd_thread t;
    t.kr = tb;
    t.dk = t.kr + round_up(c.bk * c.Dp, 16);
    t.kt = t.dk + round_up(c.bk * c.Dp, 16);
    t.vt = t.kt + round_up(c.D * c.bk, 16);
    t.dv = t.vt + round_up(c.Dv * c.bk, 16);
    t.sp = t.dv + round_up(c.bk * c.Dvp, 16);
    t.dp = t.sp + round_up(c.bq * c.bk, 16);
    float *next = t.dp + round_up(c.bq * c.bk, 16);
    t.pd = NULL, t.dc = NULL;
    if (c.dropout) t.pd = next, next += round_up(c.bq * c.bk, 16);
    if (c.softcap > 0.0f) t.dc = next, next += round_up(c.bq * c.bk, 16);
    t.ktp = (uint16_t *)next, next += packed_floats(c.D, c.bk);
    t.vtp = (uint16_t *)next, next += packed_floats(c.Dv, c.bk);
    t.krp = (uint16_t *)next, next += packed_floats(c.bk, c.Dp);
    t.scratch = next;
    t.dbias = private_dbias ? tb + lay.per_thread_fixed : NULL;
    /* Padding columns of the tiles stay zero: loads only write the first D (Dv) of each row. */
    memset(tb, 0, (size_t)lay.per_thread_fixed * sizeof(float));
    if (want_dbias && private_dbias) memset(t.dbias, 0, (size_t)nbias * sizeof(float));
    float *dbias = !want_dbias ? NULL : private_dbias ? t.dbias : sh.dbias;

    for (int64_t ph = 0; ph < nphases; ++ph) {
      const int64_t pair0 = ph * chunk, npair = min64(chunk, c.npairs - pair0);
      /* Per query block of every (pair, head) of the phase: lse, Delta = rowsum(dout * out), the
       * dQ accumulator zeroed (by the thread that later stores it: the same static split) and
       * its lock opened. Units of one query block keep every thread busy however few pairs. */
      const int64_t nunits = npair * c.group * c.nqb;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
      for (int64_t u = 0; u < nunits; ++u) {
        const int64_t it = u / c.nqb, qb = u % c.nqb;
        const int64_t pr = it / c.group, hh = it % c.group;
        const cpu_seq s = make_seq(&c, pair0 + pr);
        const int64_t h = s.g * c.group + hh;
        float *lse = sh.lse + it * c.Tq, *delta = sh.delta + it * c.Tq;
        float o[DELTA_SPAN];
#ifdef _OPENMP
        atomic_init(dq_lock(&sh, u), 0);
#endif
        const int64_t i_end = min64(s.s.len_q, (qb + 1) * c.bq);
        if (qb * c.bq < i_end)
          memset(sh.dq + (it * c.Tq + qb * c.bq) * c.Dp, 0,
                 (size_t)((i_end - qb * c.bq) * c.Dp) * sizeof(float));
        for (int64_t i = qb * c.bq; i < i_end; ++i) {
          const int64_t row = s.s.q_row0 + i;
          if (i + ROWS_AHEAD < i_end && qds == 1 && dods == 1 && ods == 1) {
            const int64_t ahead = row + ROWS_AHEAD;
            prefetch_row(&c, in->q.data, token_off(&c, &in->q, s.b, ahead, h), c.D);
            prefetch_row(&c, run->dout->data, token_off(&c, run->dout, s.b, ahead, h), c.Dv);
            prefetch_row(&c, fwd->out.data, token_off(&c, &fwd->out, s.b, ahead, h), c.Dv);
          }
          lse[i] = ((const float *)fwd->lse.data)[lse_off(&c, &fwd->lse, s.b, h, row)];
          /* q unscaled, as in the forward (dK gets s at the end); the padding columns zero, as
           * the products with n = Dp (dK += dS^T Q) read them */
          float *q = sh.q + (it * c.Tq + i) * c.Dp, *dout = sh.dout + (it * c.Tq + i) * c.Dvp;
          load_vec(&c, in->q.data, token_off(&c, &in->q, s.b, row, h), qds, c.D, 1.0f, q);
          memset(q + c.D, 0, (size_t)(c.Dp - c.D) * sizeof(float));
          load_vec(&c, run->dout->data, token_off(&c, run->dout, s.b, row, h), dods, c.Dv, 1.0f,
                   dout);
          memset(dout + c.Dv, 0, (size_t)(c.Dvp - c.Dv) * sizeof(float));
          /* Delta = out . dout, out converted a span at a time, summed in 8 interleaved lanes that
           * stay in vector registers: one running sum was a chain of dependent adds, 4-9 ms of a
           * bf16 backward of 1024-2048 query rows (about 170 ms) on the 2-core VM */
          float lanes[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
          for (int64_t d0 = 0; d0 < c.Dv; d0 += DELTA_SPAN) {
            const int64_t n = min64(DELTA_SPAN, c.Dv - d0);
            load_vec(&c, fwd->out.data, token_off(&c, &fwd->out, s.b, row, h) + d0 * ods, ods, n,
                     1.0f, o);
            int64_t d = 0;
            for (; d + 8 <= n; d += 8)
              for (int l = 0; l < 8; ++l) lanes[l] += o[d + l] * dout[d0 + d + l];
            for (; d < n; ++d) lanes[d & 7] += o[d] * dout[d0 + d];
          }
          delta[i] = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                     ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
        }
        if (sh.qh != NULL && qb * c.bq < i_end) { /* the block's rows as bf16 (bwd_rows) */
          const int64_t i0 = qb * c.bq, rows = i_end - i0, at = it * sh.rows_p + i0;
          const float *q = sh.q + (it * c.Tq + i0) * c.Dp,
                      *dout = sh.dout + (it * c.Tq + i0) * c.Dvp;
          c.kern->pack_rows(q, c.Dp, rows, c.D, sh.qh + at * sh.ldq, sh.ldq);
          c.kern->pack_b(q, c.Dp, rows, c.Dp, sh.qp + at * c.Dp, 2 * c.Dp);
          c.kern->pack_rows(dout, c.Dvp, rows, c.Dv, sh.doh + at * sh.ldv, sh.ldv);
          c.kern->pack_b(dout, c.Dvp, rows, c.Dvp, sh.dop + at * c.Dvp, 2 * c.Dvp);
        }
      }
      /* Key blocks, heaviest first under a causal mask (the first key blocks see the most query
       * rows), in rounds: a round is one pair's next nthreads key blocks, the pairs' rounds one
       * after another, so that the threads at work at once read the same pair's q, dout and dQ
       * rows (a ring step's phase of 2048 query rows holds 5 pairs, about 63 MB of them in f32,
       * which the pairs interleaved item by item streamed all at once); within a pair each key
       * block starts at its own query block (backward_item), so the round's threads seldom want
       * the same dQ lock. */
      const int64_t nwork = npair * c.nkb, per_round = c.nthreads,
                    last_group = (c.nkb - 1) / per_round;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
      for (int64_t it = 0; it < nwork; ++it) {
        const int64_t grp = min64(it / (npair * per_round), last_group);
        const int64_t in_group = min64(per_round, c.nkb - grp * per_round),
                      local = it - grp * per_round * npair;
        const int64_t pr = local / in_group, kb = grp * per_round + local % in_group;
        const cpu_seq s = make_seq(&c, pair0 + pr);
        if (kb * c.bk >= s.s.len_k) continue;
        backward_item(&c, &sh, &t, pr, &s, kb, dbias);
        after_item(&c);
      }
      /* dq = s * the accumulator, per query block as above */
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
      for (int64_t u = 0; u < nunits; ++u) {
        const int64_t it = u / c.nqb, qb = u % c.nqb;
        const int64_t pr = it / c.group, hh = it % c.group;
        const cpu_seq s = make_seq(&c, pair0 + pr);
        const int64_t h = s.g * c.group + hh;
        const int64_t i_end = min64(s.s.len_q, (qb + 1) * c.bq);
        for (int64_t i = qb * c.bq; i < i_end; ++i)
          store_vec(&c, g->dq.data, token_off(&c, &g->dq, s.b, s.s.q_row0 + i, h),
                    token_dstride(&c, &g->dq), c.D, sh.dq + (it * c.Tq + i) * c.Dp, c.scale);
      }
    }
    if (c.kern->tiles_release != NULL) c.kern->tiles_release();
  }

  if (want_dbias) {
    if (private_dbias) {
      float *acc = sh.thread_base + lay.per_thread_fixed;
      for (int th = 1; th < c.nthreads; ++th) {
        const float *other = acc + (int64_t)th * per_thread;
        for (int64_t e = 0; e < nbias; ++e) acc[e] += other[e];
      }
      write_dbias(&c, acc);
    } else {
      write_dbias(&c, sh.dbias);
    }
  }
  if (p->num_sinks > 0 && g->dsinks.data != NULL) backward_dsinks(&c);
  return ATTN_STATUS_OK;
}

/* ---- the contract ------------------------------------------------------------------------------- */

static attn_status cpu_supports(const attn_problem *p, char *why, size_t why_size) {
  /* f8e4m3 is decoded to f32 as K and V are packed (forward only: validation refuses its
   * backward), so that users without a Hopper GPU can run and check their fp8 models */
  if (p->dtype != ATTN_DTYPE_F32 && p->dtype != ATTN_DTYPE_F16 && p->dtype != ATTN_DTYPE_BF16 &&
      p->dtype != ATTN_DTYPE_F8E4M3) {
    attn_format(why, why_size, "dtype=%s: f32, f16, bf16 and f8e4m3 only (the reference runs f64)",
                attn_dtype_name((attn_dtype)p->dtype));
    return ATTN_STATUS_UNSUPPORTED;
  }
  if (p->operation != ATTN_OPERATION_FLASH_ATTENTION) {
    attn_format(why, why_size,
                "operation=scaled_dot_product_attention: this implementation never forms the "
                "probabilities; it runs flash_attention only");
    return ATTN_STATUS_UNSUPPORTED;
  }
  return ATTN_STATUS_OK;
}

static int32_t cpu_num_configs(const attn_problem *p) {
  (void)p;
  return N_BQ * N_BK;
}

static void cpu_config_name(const attn_problem *p, int32_t config, char *buf, size_t size) {
  (void)p;
  attn_format(buf, size, "bq%d_bk%d", (int)cfg_bq[config / N_BK], (int)cfg_bk[config % N_BK]);
}

/* 64-row query blocks; 256-key blocks once the keys fill them (measured on Zen 4, T = 2048,
 * d64/d128, one thread: bk256 runs the backward 15-20% faster than bk128 and the forward as fast),
 * smaller key blocks for short sequences, whose padded columns would be wasted work. The executor
 * can tune all nine. */
static int32_t cpu_default_config(const attn_problem *p) {
  const int32_t bk = p->seqlen_k >= 512 ? 2 : p->seqlen_k >= 128 ? 1 : 0;
  return 1 * N_BK + bk;
}

static attn_status cpu_plan_init(const attn_problem *p, int32_t config, void **state, char *why,
                                 size_t why_size) {
  (void)config, (void)why, (void)why_size;
  *state = (void *)select_kernels((attn_dtype)p->dtype);
  return ATTN_STATUS_OK;
}

static void cpu_plan_fini(void *state) { (void)state; }

const attn_impl attn_cpu_impl = {
    .name = "cpu",
    .device = ATTN_DEVICE_CPU,
    .version = 2, /* 2: decode shapes on decode.c's split-KV path */
    .supports = cpu_supports,
    .num_configs = cpu_num_configs,
    .config_name = cpu_config_name,
    .default_config = cpu_default_config,
    .workspace_size = cpu_workspace_size,
    .plan_init = cpu_plan_init,
    .plan_fini = cpu_plan_fini,
    .forward = cpu_forward,
    .backward = cpu_backward,
    .honours_positions = ATTN_POSITIONS_ANY,
};

const char *attn_cpu_isa_name(int dtype) { return select_kernels((attn_dtype)dtype)->name; }
