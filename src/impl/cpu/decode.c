/*
 * src/impl/cpu/decode.c - the "cpu" implementation's decode path: few queries per sequence against
 * a long cache of keys and values, dense or paged (docs/DECODE.md), at the memory's read rate.
 *
 * Decode reads every visible K and V row once and does little arithmetic with it (the Hq/Hkv query
 * heads times Tq queries of one KV head), so its speed is the rate at which K and V stream from
 * memory. The tiled forward of cpu.c is built for the opposite (many queries reusing a packed K/V
 * block) and would spend its time packing. Here:
 *   - work items are (sequence, key split): the visible keys of a sequence (the union of its rows'
 *     windows, so pages wholly outside the window are never touched) are cut into `splits` ranges
 *     so that short batches still fill every thread (flash-decoding). An item walks its keys in
 *     blocks of 32 with every KV head inside, so K and V stream in address order (items per KV
 *     head read 256 bytes of every 2 KiB and streamed at half the rate);
 *   - GQA packing: for each KV head the item holds the R = (Hq/Hkv) * Tq query rows that read it,
 *     so each K and V row is read from memory once for all of them;
 *   - one block loop (decode_blocks) for every dtype: the scores key by key with every KV head of
 *     a key inside, the softmax, then P V a few keys a step with every head inside, so K and V
 *     are touched in address order, the rows 16 keys ahead requested in that order (the cursor of
 *     decode_ahead.h). On AVX-512 BF16 machines bf16 blocks (D and Dv multiples of 32, unit
 *     element stride) run it on the bf16 loops of kernels_avx512bf16.c (scores and P V by
 *     vdpbf16ps, P rounded to bf16, as SPEC.md allows); everything else on the table's own loops
 *     (decode_kernels.h, one copy per kernel table, cpu.h: AVX-512, AVX2, generic: f32 products,
 *     P unrounded), f32, f16 and bf16 rows of unit element stride read in place, strided rows
 *     converted a block at a time first;
 *   - each item keeps an online softmax (m, l, unnormalised O) per row and writes it as a partial
 *     result; a second pass merges the splits of each sequence through their maxima, adds the
 *     sinks once, and writes out and lse.
 * Every sum is in f32. Features: GQA/MQA, causal, sliding windows, soft cap, sinks, ALiBi,
 * per-sequence lengths including 0, lse. Problems with a bias, mask, segment ids or dropout, and
 * longer query blocks, take cpu.c's tiled path (which also reads paged caches).
 */
#include "impl/cpu/cpu.h"
#include "impl/cpu/decode_ahead.h"
#include "impl/impl.h"

#include "core/dtype.h"
#include "core/tensors.h"

#include <math.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* keys per online-softmax step: the block's K and V of every head stay in L2 */
#define KEY_BLOCK ATTN_CPU_DECODE_BLOCK
#define MIN_SPLIT_KEYS 256 /* a split shorter than this costs more to merge than it saves */
#define MAX_DECODE_TQ 16   /* queries per sequence the decode path takes (speculative decoding) */

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t round16(int64_t x) { return (x + 15) / 16 * 16; }

/* x[0..n) (n a multiple of 32) from natural order to the PAIRS order within each 32 columns:
 * evens first, then odds; or back (inverse != 0). */
static void permute_pairs(float *x, int64_t n, int inverse) {
  float tmp[32];
  for (int64_t d0 = 0; d0 < n; d0 += 32) {
    for (int u = 0; u < 16; ++u) {
      if (inverse)
        tmp[2 * u] = x[d0 + u], tmp[2 * u + 1] = x[d0 + 16 + u];
      else
        tmp[u] = x[d0 + 2 * u], tmp[16 + u] = x[d0 + 2 * u + 1];
    }
    memcpy(x + d0, tmp, sizeof tmp);
  }
}

/* x[0..n) (n a multiple of 32) from the order attn_cpu_decode_pv_bf16 accumulates in (cpu.h) back
 * to the natural one: each 32 columns are 8 runs of 4, run 4 h + L holding columns 8 L + 4 h. */
static void unpermute_pv(float *x, int64_t n) {
  float tmp[32];
  for (int64_t d0 = 0; d0 < n; d0 += 32) {
    for (int run = 0; run < 8; ++run) memcpy(tmp + 8 * (run % 4) + 4 * (run / 4), x + d0 + 4 * run, 4 * sizeof(float));
    memcpy(x + d0, tmp, sizeof tmp);
  }
}

/* ---- the problem ---------------------------------------------------------------------------------- */

int attn_cpu_decode_applies(const attn_problem *p) {
  return p->operation == ATTN_OPERATION_FLASH_ATTENTION && p->seqlen_q >= 1 &&
         p->seqlen_q <= MAX_DECODE_TQ && p->varlen == ATTN_VARLEN_NONE && !p->has_bias &&
         !p->has_mask && !p->has_segment_ids && p->dropout_p == 0.0 &&
         (p->dtype == ATTN_DTYPE_F32 || p->dtype == ATTN_DTYPE_F16 || p->dtype == ATTN_DTYPE_BF16);
}

/* Splits of each sequence: enough items for four per thread, none shorter than MIN_SPLIT_KEYS
 * keys of the longest sequence. */
static int64_t decode_splits(const attn_problem *p, int threads) {
  const int64_t pairs = p->batch;
  const int64_t want = (4 * (int64_t)threads + pairs - 1) / pairs;
  const int64_t most = max64(1, p->seqlen_k / MIN_SPLIT_KEYS);
  return max64(1, min64(want, most));
}

/* Floats of the regions of the workspace. */
typedef struct decode_layout {
  int64_t R, Dp, Dvp;
  int64_t partial;    /* one item's result: per row of the sequence m, l and O[Dvp] */
  int64_t per_thread; /* q rows, S/P of every head, bf16 P, O, m, l, converted K and V rows */
} decode_layout;

static decode_layout layout_of(const attn_problem *p) {
  decode_layout l;
  l.R = p->heads_q / p->heads_kv * p->seqlen_q;
  l.Dp = round16(p->head_dim), l.Dvp = round16(p->head_dim_v > 0 ? p->head_dim_v : p->head_dim);
  const int64_t rows = p->heads_kv * l.R; /* every row of a sequence */
  l.partial = round16(rows * (l.Dvp + 2));
  l.per_thread = round16(rows * l.Dp) + round16(rows * KEY_BLOCK) + round16(rows * KEY_BLOCK / 2) +
                 round16(rows * l.Dvp) + 2 * round16(rows) +
                 KEY_BLOCK * p->heads_kv * (l.Dp + l.Dvp);
  return l;
}

static int decode_threads(void) {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

size_t attn_cpu_decode_workspace(const attn_problem *p) {
  const decode_layout l = layout_of(p);
  const int threads = decode_threads();
  const int64_t items = p->batch * decode_splits(p, threads);
  return (size_t)(items * l.partial + (int64_t)threads * l.per_thread) * sizeof(float);
}

/* ---- the run ------------------------------------------------------------------------------------- */

typedef struct decode_run {
  const attn_problem *p;
  const attn_inputs *in;
  const attn_cpu_kernels *kern; /* whose decode loops run (decode_loops) */
  int bf16_loops;               /* the bf16 loops (vdpbf16ps) available (decode_loops) */
  attn_dtype dt;
  decode_layout l;
  int64_t group, splits;
  float *partials;
} decode_run;

typedef struct decode_thread {
  float *q, *s, *o, *m, *l, *kbuf, *vbuf;
  uint16_t *p16; /* the bf16 loops' P (attn_cpu_decode_block's) */
} decode_thread;

/* The visible keys [*lo, *hi) of a sequence: the union of its rows' windows within its length. */
static void visible_keys(const decode_run *c, const attn_seq *seq, int64_t *lo, int64_t *hi) {
  const attn_problem *p = c->p;
  const int64_t o = attn_align_offset(p, seq);
  *lo = p->window_left >= 0 ? max64(0, o - p->window_left) : 0;
  *hi = p->window_right >= 0 ? min64(seq->len_k, o + seq->len_q - 1 + p->window_right + 1)
                             : seq->len_k;
  if (*hi < *lo) *hi = *lo;
}

/* Addresses of keys [j0, j0 + nb) of KV head g of sequence b in k and v (their first element).
 * One division per block: a page's rows follow each other until the next table entry. */
static void row_addresses(const decode_run *c, int64_t b, int64_t g, int64_t j0, int64_t nb,
                          const char **krow, const char **vrow) {
  const attn_problem *p = c->p;
  const attn_tensor *k = &c->in->k, *v = &c->in->v;
  const size_t es = attn_dtype_size(c->dt);
  if (p->page_size <= 0) {
    const char *kb = (const char *)k->data + (size_t)(b * k->stride[0] + j0 * k->stride[1] + g * k->stride[2]) * es;
    const char *vb = (const char *)v->data + (size_t)(b * v->stride[0] + j0 * v->stride[1] + g * v->stride[2]) * es;
    for (int64_t jj = 0; jj < nb; ++jj) {
      krow[jj] = kb + (size_t)(jj * k->stride[1]) * es;
      vrow[jj] = vb + (size_t)(jj * v->stride[1]) * es;
    }
    return;
  }
  const attn_tensor *bt = &c->in->block_table;
  const int32_t *table = (const int32_t *)bt->data + b * bt->stride[0];
  int64_t entry = j0 / p->page_size, row = j0 % p->page_size;
  for (int64_t jj = 0; jj < nb;) {
    const int64_t page = table[entry * bt->stride[1]];
    const char *kb = (const char *)k->data + (size_t)(page * k->stride[0] + g * k->stride[2]) * es;
    const char *vb = (const char *)v->data + (size_t)(page * v->stride[0] + g * v->stride[2]) * es;
    for (; row < p->page_size && jj < nb; ++row, ++jj) {
      krow[jj] = kb + (size_t)(row * k->stride[1]) * es;
      vrow[jj] = vb + (size_t)(row * v->stride[1]) * es;
    }
    ++entry, row = 0;
  }
}

/* Whether the kernels read a tensor's rows in place (a unit element stride: f32, bf16 and f16
 * rows, the last converted in registers by the loads of decode_kernels.h). */
static int in_place(const decode_run *c, const attn_tensor *t) {
  (void)c;
  return t->stride[3] == 1;
}

/* How the kernels read a tensor's rows of width elements (ROWS_*). */
static int rows_mode(const decode_run *c, const attn_tensor *t, int64_t width) {
  if (!in_place(c, t) || c->dt == ATTN_DTYPE_F32) return ROWS_F32;
  if (c->dt == ATTN_DTYPE_F16) return ROWS_F16;
  return width % 32 == 0 ? ROWS_BF16_PAIRS : ROWS_BF16;
}

static float stat_at(const attn_tensor *t, int64_t off) { return ((const float *)t->data)[off]; }

/* The online softmax of the R rows of KV head g over keys [j0, j0 + nb): x (row r at x + r *
 * KEY_BLOCK) holds their scores; leaves their probabilities exp(x - m) there (0 where masked),
 * updates m and l, and rescales the rows of O (ldo apart) by exp(m_old - m_new). */
static void softmax_block(const decode_run *c, int64_t b, int64_t o, int64_t g, int64_t j0,
                          int64_t nb, float *xs, float *m, float *l, float *O, int64_t ldo) {
  const attn_problem *p = c->p;
  const attn_cpu_kernels *kern = c->kern;
  const int64_t R = c->l.R, Tq = p->seqlen_q;
  const float cap = (float)p->softcap;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t h = g * c->group + r / Tq, diag = r % Tq + o;
    float *x = xs + r * KEY_BLOCK;
    if (p->alibi != ATTN_ALIBI_NONE) { /* x -= slope |i + o - j| */
      const attn_tensor *sl = &c->in->alibi_slopes;
      const float slope = stat_at(sl, p->alibi == ATTN_ALIBI_PER_BATCH_HEAD
                                          ? b * sl->stride[0] + h * sl->stride[1]
                                          : h * sl->stride[0]);
      const float base = (float)(diag - j0);
      for (int64_t jj = 0; jj < nb; ++jj) x[jj] -= slope * fabsf(base - (float)jj);
    }
    if (cap > 0.0f) kern->softcap(x, NULL, nb, cap);
    /* this row's window within the block (the block is the union of all rows') */
    int64_t lo = p->window_left >= 0 ? diag - p->window_left - j0 : 0;
    int64_t hi = p->window_right >= 0 ? diag + p->window_right - j0 + 1 : nb;
    lo = max64(0, min64(lo, nb)), hi = max64(lo, min64(hi, nb));
    for (int64_t jj = 0; jj < lo; ++jj) x[jj] = -INFINITY;
    for (int64_t jj = hi; jj < nb; ++jj) x[jj] = -INFINITY;
    const float m_new = fmaxf(m[r], kern->row_max(x, nb));
    if (m_new == -INFINITY) { /* nothing visible to this row yet: P = 0 */
      memset(x, 0, (size_t)nb * sizeof(float));
      continue;
    }
    const float alpha = m[r] == m_new ? 1.0f : expf(m[r] - m_new);
    l[r] = l[r] * alpha + kern->exp_sum(x, nb, m_new);
    if (alpha != 1.0f) kern->scale(O + r * ldo, p->head_dim_v, alpha);
    m[r] = m_new;
  }
}

/* Rows requested ahead: the keys that many past the one being computed (32 KiB of bf16 K or V at
 * Hkv = 8, D = 128; on the 2-core Zen 5 VM 8 to 32 keys streamed alike within its run-to-run
 * noise, one step of P V being 8 keys). */
#define AHEAD_KEYS 16

/* The rows the table's loops read for a key block (a->rows, a->head_bytes) of tensor t: in place
 * (in_place), else every head's row of each key converted to f32 into buf (heads rows of ldbuf
 * floats per key, in key order), whose addresses go to rows. */
static void block_rows(const decode_run *c, const attn_tensor *t, int64_t width,
                       attn_cpu_decode_block *a, float *buf, int64_t ldbuf, const char **rows) {
  if (in_place(c, t)) return;
  for (int64_t jj = 0; jj < a->nb; ++jj) {
    float *dst = buf + jj * a->heads * ldbuf;
    for (int64_t g = 0; g < a->heads; ++g) {
      const char *src = a->rows[jj] + (size_t)g * a->head_bytes;
      for (int64_t d = 0; d < width; ++d)
        dst[g * ldbuf + d] = (float)attn_load(src, c->dt, d * t->stride[3]);
    }
    rows[jj] = (const char *)dst;
  }
  a->rows = rows, a->head_bytes = (size_t)ldbuf * sizeof(float);
}

/* The block loop: per block of KEY_BLOCK keys, every head's scores key by key in address order
 * (a key's heads are neighbours), the softmax, then P V in steps of a few keys, every head inside;
 * the bf16 loops (kernels_avx512bf16.c, loops_bf16) or the table's own (decode_kernels.h). The
 * rows ahead: while the scores run, the rest of this block's K and the first of its V; while P V
 * runs, the rest of its V and the first of the next block's K. */
static void decode_blocks(const decode_run *c, const decode_thread *t, int64_t b, int64_t o,
                          int64_t k0, int64_t k1, int loops_bf16, int kmode, int vmode) {
  const attn_problem *p = c->p;
  const attn_inputs *in = c->in;
  const int64_t R = c->l.R, Hkv = p->heads_kv, D = p->head_dim, Dv = p->head_dim_v;
  const size_t es = attn_dtype_size(c->dt);
  const size_t khead = (size_t)in->k.stride[2] * es, vhead = (size_t)in->v.stride[2] * es;
  const char *kraw[2][KEY_BLOCK], *vraw[2][KEY_BLOCK];
  int cur = 0;
  row_addresses(c, b, 0, k0, min64(KEY_BLOCK, k1 - k0), kraw[0], vraw[0]);
  attn_cpu_decode_block a;
  memset(&a, 0, sizeof a);
  a.heads = Hkv, a.R = R, a.D = D, a.Dv = Dv;
  a.q = (const uint16_t *)t->q, a.ldq = c->l.Dp, a.scale = (float)p->scale;
  a.S = t->s, a.P = t->p16, a.O = t->o, a.ldo = c->l.Dvp;
  for (int64_t j0 = k0; j0 < k1; j0 += KEY_BLOCK, cur ^= 1) {
    const int64_t nb = min64(KEY_BLOCK, k1 - j0), nb_next = min64(KEY_BLOCK, k1 - j0 - nb);
    if (nb_next > 0) row_addresses(c, b, 0, j0 + nb, nb_next, kraw[cur ^ 1], vraw[cur ^ 1]);
    const int64_t ahead = min64(AHEAD_KEYS, nb);
    a.nb = nb;
    a.rows = kraw[cur], a.head_bytes = khead;
    a.ahead[0].rows = kraw[cur] + ahead, a.ahead[0].n = nb - ahead;
    a.ahead[0].head_bytes = khead, a.ahead[0].row_bytes = (size_t)D * es;
    a.ahead[1].rows = vraw[cur], a.ahead[1].n = ahead;
    a.ahead[1].head_bytes = vhead, a.ahead[1].row_bytes = (size_t)Dv * es;
    const char *conv[KEY_BLOCK];
#ifdef ATTN_CPU_X86
    if (loops_bf16)
      attn_cpu_decode_scores_bf16(&a);
    else
#endif
    {
      block_rows(c, &in->k, D, &a, t->kbuf, c->l.Dp, conv);
      c->kern->decode_scores(&a, t->q, kmode);
    }
    for (int64_t g = 0; g < Hkv; ++g)
      softmax_block(c, b, o, g, j0, nb, t->s + g * R * KEY_BLOCK, t->m + g * R, t->l + g * R,
                    t->o + g * R * c->l.Dvp, c->l.Dvp);
    a.rows = vraw[cur], a.head_bytes = vhead;
    a.ahead[0].rows = vraw[cur] + ahead, a.ahead[0].n = nb - ahead;
    a.ahead[0].head_bytes = vhead, a.ahead[0].row_bytes = (size_t)Dv * es;
    a.ahead[1].rows = kraw[cur ^ 1], a.ahead[1].n = min64(AHEAD_KEYS, max64(0, nb_next));
    a.ahead[1].head_bytes = khead, a.ahead[1].row_bytes = (size_t)D * es;
#ifdef ATTN_CPU_X86
    if (loops_bf16)
      attn_cpu_decode_pv_bf16(&a);
    else
#endif
    {
      block_rows(c, &in->v, Dv, &a, t->vbuf, c->l.Dvp, conv);
      c->kern->decode_pv(&a, vmode);
    }
  }
#ifndef ATTN_CPU_X86
  (void)loops_bf16;
#endif
}

/* One item: every row of sequence b (all KV heads, R rows each) against keys [k0, k1) (within the
 * visible range); writes its partial (m, l, O) for every row. The key blocks are walked once with
 * all heads inside, so K and V stream through memory in address order: a key's heads are
 * neighbours, and an item per KV head would read 256 bytes out of every 2 KiB (8 heads of 128
 * bf16), which the prefetchers do not follow (measured: half the read rate with no arithmetic). */
static void decode_item(const decode_run *c, const decode_thread *t, int64_t b,
                        const attn_seq *seq, int64_t k0, int64_t k1, float *partial) {
  const attn_problem *p = c->p;
  const attn_inputs *in = c->in;
  const int64_t R = c->l.R, Hkv = p->heads_kv, Tq = p->seqlen_q, D = p->head_dim;
  const int64_t Dv = p->head_dim_v, Dp = c->l.Dp, Dvp = c->l.Dvp, o = attn_align_offset(p, seq);
  const float scale = (float)p->scale;
  for (int64_t r = 0; r < Hkv * R; ++r) {
    t->m[r] = -INFINITY, t->l[r] = 0.0f;
    memset(t->o + r * Dvp, 0, (size_t)Dvp * sizeof(float));
  }
  const int kmode = rows_mode(c, &in->k, D), vmode = rows_mode(c, &in->v, Dv);
  /* bf16 rows of widths that are multiples of 32 where vdpbf16ps is there: the bf16 loops, on q
   * as given (the scale applied to the sums) and P rounded to bf16 (SPEC.md allows it) */
  const int loops_bf16 = c->bf16_loops && kmode == ROWS_BF16_PAIRS && vmode == ROWS_BF16_PAIRS;
  for (int64_t r = 0; r < Hkv * R && k1 > k0; ++r) {
    /* row g * R + hh * Tq + i: query i of head g * group + hh */
    const int64_t h = r / R * c->group + r % R / Tq, i = r % Tq;
    const attn_tensor *qt = &in->q;
    const int64_t off = b * qt->stride[0] + i * qt->stride[1] + h * qt->stride[2];
    if (loops_bf16) { /* bf16 bits as given, in the f32 rows' space */
      uint16_t *q16 = (uint16_t *)t->q + r * Dp;
      if (qt->stride[3] == 1)
        memcpy(q16, (const uint16_t *)qt->data + off, (size_t)D * sizeof *q16);
      else
        for (int64_t d = 0; d < D; ++d) q16[d] = ((const uint16_t *)qt->data)[off + d * qt->stride[3]];
      continue;
    }
    float *qr = t->q + r * Dp; /* scaled by s, f32 */
    if (c->dt == ATTN_DTYPE_F16 && qt->stride[3] == 1)
      c->kern->load_f16((const uint16_t *)qt->data + off, D, scale, qr);
    else if (c->dt == ATTN_DTYPE_F32 && qt->stride[3] == 1)
      for (int64_t d = 0; d < D; ++d) qr[d] = scale * ((const float *)qt->data)[off + d];
    else
      for (int64_t d = 0; d < D; ++d) qr[d] = scale * (float)attn_load(qt->data, c->dt, off + d * qt->stride[3]);
    if (kmode == ROWS_BF16_PAIRS) permute_pairs(qr, D, 0);
  }
  if (k1 > k0) decode_blocks(c, t, b, o, k0, k1, loops_bf16, kmode, vmode);
  for (int64_t r = 0; r < Hkv * R; ++r) {
    float *dst = partial + r * (Dvp + 2);
    dst[0] = t->m[r], dst[1] = t->l[r];
    memcpy(dst + 2, t->o + r * Dvp, (size_t)Dv * sizeof(float));
    /* back to the natural order */
    if (loops_bf16)
      unpermute_pv(dst + 2, Dv);
    else if (vmode == ROWS_BF16_PAIRS)
      permute_pairs(dst + 2, Dv, 1);
  }
}

/* base[off + d * stride] = s * x[d] in dt, d < n; contiguous f16 rows by the table's vector
 * conversion (one call per element took 4% of a small f16 problem's time). */
static void store_row(const attn_cpu_kernels *kern, attn_dtype dt, void *base, int64_t off,
                      int64_t stride, const float *x, int64_t n, float s) {
  if (dt == ATTN_DTYPE_F16 && stride == 1) {
    kern->store_f16((uint16_t *)base + off, n, x, s);
    return;
  }
  for (int64_t d = 0; d < n; ++d) {
    const float v = s * x[d];
    switch (dt) {
    case ATTN_DTYPE_F32: ((float *)base)[off + d * stride] = v; break;
    case ATTN_DTYPE_F16: ((uint16_t *)base)[off + d * stride] = attn_inline_f32_to_f16(v); break;
    default: ((uint16_t *)base)[off + d * stride] = attn_inline_f32_to_bf16(v); break;
    }
  }
}

/* Merges the splits of sequence b through their maxima, adds the sinks once, writes out and lse
 * of its rows [r0, r1) (row g * R + hh * Tq + i). */
static void decode_merge(const decode_run *c, const attn_outputs *out, int64_t b, int64_t r0,
                         int64_t r1, float *acc) {
  const attn_problem *p = c->p;
  const int64_t R = c->l.R, Tq = p->seqlen_q, Dv = p->head_dim_v, Dvp = c->l.Dvp;
  const float *base = c->partials + b * c->splits * c->l.partial;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t h = r / R * c->group + r % R / Tq, i = r % Tq;
    float m = -INFINITY;
    for (int64_t s = 0; s < c->splits; ++s) m = fmaxf(m, base[s * c->l.partial + r * (Dvp + 2)]);
    const attn_tensor *sk = &c->in->sinks;
    for (int64_t a = 0; a < p->num_sinks; ++a)
      m = fmaxf(m, stat_at(sk, p->sinks_shared ? a * sk->stride[0] : h * sk->stride[0] + a * sk->stride[1]));
    float l = 0.0f;
    memset(acc, 0, (size_t)Dv * sizeof(float));
    if (m != -INFINITY) {
      for (int64_t s = 0; s < c->splits; ++s) {
        const float *part = base + s * c->l.partial + r * (Dvp + 2);
        if (part[0] == -INFINITY) continue;
        const float w = expf(part[0] - m);
        l += w * part[1];
        for (int64_t d = 0; d < Dv; ++d) acc[d] += w * part[2 + d];
      }
      for (int64_t a = 0; a < p->num_sinks; ++a)
        l += expf(stat_at(sk, p->sinks_shared ? a * sk->stride[0] : h * sk->stride[0] + a * sk->stride[1]) - m);
    }
    const attn_tensor *ot = &out->out;
    const int64_t ooff = b * ot->stride[0] + i * ot->stride[1] + h * ot->stride[2];
    /* fully masked (no visible key, no sink): out = 0, lse = -inf */
    store_row(c->kern, c->dt, ot->data, ooff, ot->stride[3], acc, Dv,
              m == -INFINITY ? 0.0f : 1.0f / l);
    if (out->lse.data != NULL) {
      const attn_tensor *lt = &out->lse;
      ((float *)lt->data)[b * lt->stride[0] + h * lt->stride[1] + i * lt->stride[2]] =
          m == -INFINITY ? -INFINITY : m + logf(l);
    }
  }
}

/* The one place that decides which vector loops decode runs, from the kernel table cpu.c chose
 * for the problem (the best the processor has, or ATTN_CPU_ISA's):
 *   - the table's own decode loops (decode_kernels.h, one copy per table) - except the AMX table's,
 *     which has none on purpose: a tile product multiplies 16 query rows at a time and decode has
 *     Hq/Hkv * Tq of them per KV head (4 in the common GQA case), so three quarters of each tile
 *     would be padding, and the tile loads and stores cost more than the vector loop they would
 *     replace in a loop bound by memory anyway. cpu.c chooses AMX only where AVX-512 BF16 is there
 *     too (has_amx needs has_bf16), so the AMX machine runs the avx512bf16 table's loops;
 *   - the bf16 loops (attn_cpu_decode_scores_bf16 and attn_cpu_decode_pv_bf16,
 *     kernels_avx512bf16.c) on those machines: bf16 q, K and V rows go into vdpbf16ps as they are
 *     (no widening; P rounded to bf16), half the multiply instructions of the f32 loops, and every
 *     head of a key before the next key; every other table widens bf16 to f32. */
static void decode_loops(const attn_cpu_kernels *chosen, decode_run *c) {
  c->kern = chosen, c->bf16_loops = 0;
#if defined(ATTN_CPU_X86)
  if (chosen == &attn_cpu_kernels_amx) c->kern = &attn_cpu_kernels_avx512bf16;
  c->bf16_loops = c->kern == &attn_cpu_kernels_avx512bf16;
#endif
}

attn_status attn_cpu_decode_forward(const attn_run *run, const attn_cpu_kernels *kern) {
  const attn_problem *p = run->problem;
  decode_run c;
  c.p = p;
  c.in = run->inputs;
  decode_loops(kern, &c);
  c.dt = (attn_dtype)p->dtype;
  c.l = layout_of(p);
  c.group = p->heads_q / p->heads_kv;
  int threads = run->num_threads > 0 ? run->num_threads : decode_threads();
#ifdef _OPENMP
  if (omp_in_parallel()) threads = 1;
#endif
  /* The split count the workspace was sized for, fewer if it holds fewer (the thread count may
   * have changed since), and no more threads than it holds. */
  const int64_t B = p->batch, rows = p->heads_kv * c.l.R;
  const int64_t room = (int64_t)(run->workspace_size / sizeof(float));
  c.splits = decode_splits(p, decode_threads());
  while (c.splits > 1 && B * c.splits * c.l.partial + c.l.per_thread > room) --c.splits;
  const int64_t fit = (room - B * c.splits * c.l.partial) / c.l.per_thread;
  if (fit < threads) threads = (int)max64(1, fit);
  c.partials = (float *)run->workspace;
  float *thread_base = c.partials + B * c.splits * c.l.partial;
  const int64_t items = B * c.splits;
  /* the merge in pieces of 16 rows, so one long sequence still spreads over the threads */
  const int64_t pieces = (rows + 15) / 16;

#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
  {
#ifdef _OPENMP
    const int tid = omp_get_thread_num();
#else
    const int tid = 0;
#endif
    decode_thread t;
    t.q = thread_base + (int64_t)tid * c.l.per_thread;
    t.s = t.q + round16(rows * c.l.Dp);
    t.p16 = (uint16_t *)(t.s + round16(rows * KEY_BLOCK));
    t.o = t.s + round16(rows * KEY_BLOCK) + round16(rows * KEY_BLOCK / 2);
    t.m = t.o + round16(rows * c.l.Dvp);
    t.l = t.m + round16(rows);
    t.kbuf = t.l + round16(rows);
    t.vbuf = t.kbuf + KEY_BLOCK * p->heads_kv * c.l.Dp;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
    for (int64_t it = 0; it < items; ++it) {
      const int64_t b = it / c.splits, s = it % c.splits;
      const attn_seq seq = attn_seq_of(p, c.in, b);
      int64_t lo, hi;
      visible_keys(&c, &seq, &lo, &hi);
      const int64_t chunk = round16((hi - lo + c.splits - 1) / c.splits);
      const int64_t k0 = min64(hi, lo + s * chunk), k1 = min64(hi, k0 + chunk);
      decode_item(&c, &t, b, &seq, k0, k1, c.partials + it * c.l.partial);
    }
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t it = 0; it < B * pieces; ++it) {
      const int64_t b = it / pieces, r0 = it % pieces * 16;
      decode_merge(&c, run->outputs, b, r0, min64(rows, r0 + 16), t.o);
    }
  }
  return ATTN_STATUS_OK;
}
