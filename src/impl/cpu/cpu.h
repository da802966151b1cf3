/*
 * src/impl/cpu/cpu.h - internals of the "cpu" implementation: the table of vector kernels that each
 * instruction-set file fills (kernels_generic.c, kernels_avx2.c, kernels_avx512.c) and that the
 * driver (cpu.c: tiling, online softmax, features, threads) calls.
 *
 * Every kernel works on packed f32 tiles in memory the driver owns; strides of the user's tensors
 * never reach this level. The driver picks one table per plan (cpuid, lowered by ATTN_CPU_ISA).
 */
#ifndef ATTN_IMPL_CPU_CPU_H
#define ATTN_IMPL_CPU_CPU_H

#include "impl/impl.h"

#include <stddef.h>
#include <stdint.h>

/* Column counts handed to gemm are multiples of this; packed tiles pad their rows to it. */
#define ATTN_CPU_NPAD 16

/* Bytes of gemm scratch for an m x n x k product: both operands as bf16 along k padded to 32 (AMX
 * tiles; the AVX-512 bf16 kernel needs less) and a staging tile. */
#define ATTN_CPU_GEMM_SCRATCH(m, n, k)                                                             \
  ((size_t)((((k) + 31) / 32 * 32) * ((((m) + 31) / 32 * 32) + (n))) * 2 + 4096)

/* How the kernels read K and V rows. PAIRS: bf16 rows read 32 elements at a time as two f32
 * vectors, the even elements and the odd ones (each 32-bit lane holds one of each, the even one in
 * its low half: a shift and a mask widen them), so q and the O accumulator are kept in the same
 * order within each 32 columns (decode.c's permute_pairs). It halves the work of widening bf16, which
 * otherwise costs as much as the multiply-adds. Needs widths that are multiples of 32. F16: f16
 * rows converted in registers (vcvtph2ps where the instruction set has F16C). */
enum { ROWS_F32 = 0, ROWS_BF16 = 1, ROWS_BF16_PAIRS = 2, ROWS_F16 = 3 };


struct attn_cpu_decode_block; /* below: the decode loops' arguments */

typedef struct attn_cpu_kernels {
  const char *name; /* "generic", "avx2", "avx512", "avx512bf16", "amx" */
  /* C[m x n] = (accumulate ? C : 0) + A B with f32 accumulation, where A(r, k) = a[r * lda + k]
   * (trans_a = 0) or a[k * lda + r] (trans_a = 1), B is row-major [k x n] with row stride ldb, C
   * row-major with row stride ldc. n is a multiple of ATTN_CPU_NPAD; every row of B and C holds n
   * readable floats. scratch: ATTN_CPU_GEMM_SCRATCH(m, n, k) bytes, 64-byte aligned, for kernels
   * that repack their operands (the bf16 one); the f32 kernels ignore it. */
  void (*gemm)(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, int trans_a,
               const float *b, int64_t ldb, float *c, int64_t ldc, int accumulate, void *scratch);
  /* The same product with f32 operands, never rounded (= gemm except in the avx512bf16 table; NULL
   * in the AMX table, whose forward takes gemm_bf16): the forward pass's P V of a problem with
   * sinks uses it, so out (and through Delta = dout . out, dsinks) keeps f32 probabilities.
   * Rounding P to bf16 there, as FlashAttention does, is within SPEC.md's bf16 tolerance for out,
   * lse, dq, dk and dv (whose errors are maxima over many elements, each as large as the naive
   * run's), but not for dsinks: a single sum over every row, its error is then one random draw
   * of the naive run's size, which the rule's 3x bound misses in about one test_compare seed of
   * eight (e.g. ATTN_TEST_SEED=724828578, everything-packed: dsinks error 4.3e-3 against a bound
   * of 3.8e-3; golden sinks_many_long: 4.1e-3 against 3.4e-3). Problems without sinks take gemm. */
  void (*gemm_exact)(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, int trans_a,
                     const float *b, int64_t ldb, float *c, int64_t ldc, int accumulate,
                     void *scratch);
  /* Optional (NULL: the forward keeps gemm's row-major B): gemm with B stored as panels of
   * ATTN_CPU_NPAD columns, each contiguous: B(kk, j) = b[(j / 16) panel_stride + 16 kk + j % 16]
   * (kk < k, j < n, n a multiple of 16; never rounded, as gemm_exact). The forward packs K^T and
   * V of a key block so (cpu.c's pack_kv_block): a 32-column step of the product then reads two
   * lines of consecutive addresses, where row-major K^T and V rows 1 KiB and 512 bytes apart fell
   * into a few L1 sets and were read from L2 again for every 8 rows of A. */
  void (*gemm_panels)(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                      const float *b, int64_t panel_stride, float *c, int64_t ldc, int accumulate);
  /* Optional, with gemm_panels (NULL: a scalar loop): dst[d * 16 + i] = src[i * lds + d] for
   * i < 16, d < n: 16 key rows as their K^T panel. */
  void (*transpose16)(const float *src, int64_t lds, int64_t n, float *dst);
  /* Optional (NULL in the f32 tables; the AMX and avx512bf16 tables have both, gemm_bf16 only
   * AMX): B operands the driver multiplies many times (a key block's K^T, V, K) packed once. pack_b writes rows 2p and 2p + 1 of the f32 [k x n] matrix b
   * (row stride ldb; n a multiple of ATTN_CPU_NPAD) as bf16 pairs: out[p * ldo + 2c + t] =
   * bf16(b[(2p + t) * ldb + c]), p < ceil(k / 2), the partner of an odd last row 0; ldo >= 2n.
   * gemm_packed is gemm with such a B: pair rows ldb elements apart, reading only rows < k (rows
   * of the packed memory past k may hold anything finite or not). The driver's column offsets
   * move b by 2 elements per column, its row offsets (even) by ldb per pair. gemm_bf16 is
   * gemm_packed with A packed too, as `terms` (1 or 2) bf16 terms side by side in each row: with
   * kp = k rounded up to 32, C (+)= sum_t A_t B where A_t(r, kk) = a[r * lda + t * kp + kk], zero
   * for k <= kk < kp, and round_up(m, 16) rows readable (those past m are ignored). The forward
   * multiplies its query block (one term, packed once) and its probabilities with it (one bf16
   * term, or with sinks two, hi + lo: gemm_exact's accuracy). */
  void (*pack_b)(const float *b, int64_t ldb, int64_t k, int64_t n, uint16_t *out, int64_t ldo);
  /* Optional, with gemm_bf16 (AMX): rows of an f32 matrix as gemm_bf16's one-term A:
   * out[r * ldo + kk] = bf16(a[r * lda + kk]) for r < m, kk < k, zero for k <= kk < ldo and on
   * the rows from m to m rounded up to 16; ldo = k rounded up to 32. The rounding is the one
   * gemm_packed applies to its A on each call, so a product of rows packed once here equals, bit
   * for bit, the product gemm_packed makes of the f32 rows (the backward packs q and dout once
   * per phase so). */
  void (*pack_rows)(const float *a, int64_t lda, int64_t m, int64_t k, uint16_t *out, int64_t ldo);
  void (*gemm_packed)(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, int trans_a,
                      const uint16_t *b, int64_t ldb, float *c, int64_t ldc, int accumulate,
                      void *scratch);
  void (*gemm_bf16)(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda, int terms,
                    const uint16_t *b, int64_t ldb, float *c, int64_t ldc, int accumulate,
                    void *scratch);
  /* Optional, with gemm_bf16: exp_sum for the forward's P V on bf16 tiles. With e_j = exp(s x[j] -
   * m) (the forward passes its scale here instead of scaling S first; m is the maximum of s x
   * rounded, and s x[j] is rounded before m is subtracted, so that s x[j] - m <= 0):
   * hi[j] = bf16(e_j) and, unless lo is NULL, lo[j] = bf16(e_j - hi[j]) (nearest even: 16
   * significant bits together) for j < n, both 0 for n <= j < np; returns the sum of the e_j
   * (unrounded). x is left as it was. */
  float (*exp_sum_bf16)(const float *x, int64_t n, float s, float m, uint16_t *hi, uint16_t *lo,
                        int64_t np);
  /* Optional (NULL in all but the AMX table): the products leave the thread's tile configuration
   * loaded for its next product, and this hands the tiles back (tilerelease). The driver calls it
   * on every thread that ran products, before the pass returns to the caller, whose own code may
   * configure the tiles otherwise. */
  void (*tiles_release)(void);
  /* Optional (NULL: scale, then row_max): x[j] *= s for j < n, returning the max of the result;
   * one pass where a block needs no mask between the two. */
  float (*scale_max)(float *x, int64_t n, float s);
  /* max of x[0..n), -inf when n = 0 or every element is -inf. */
  float (*row_max)(const float *x, int64_t n);
  /* x[j] = exp(min(x[j] - m, 0)) for j < n (exactly 0 where x[j] = -inf, NaN where x[j] is),
   * returning their sum. m finite. The forward's m is the row's maximum; the backward's is its
   * lse, and exp(x - lse) <= 1 only in exact arithmetic: the f32 lse of logits of 1e25 is off by
   * 1e18, which made P infinite (issue 19). */
  float (*exp_sum)(float *x, int64_t n, float m);
  /* Optional (NULL: scale_max's pass, then exp_sum): the forward's exp pass with its scale inside,
   * for blocks with no mask between scaling and the row max (s > 0): x[j] = exp(s x[j] - m) (m
   * being the maximum of s x rounded, s x[j] is rounded first, so that s x[j] - m <= 0) for
   * j < n, exactly 0 where x[j] = -inf, NaN where x[j] is; returns their sum. S is read and
   * written once instead of twice. */
  float (*exp_sum_scaled)(float *x, int64_t n, float s, float m);
  /* x[j] *= s for j < n. */
  void (*scale)(float *x, int64_t n, float s);
  /* dp[j] = p[j] * (dp[j] - delta) for j < n: dS of the backward pass. */
  void (*ds_row)(float *dp, const float *p, int64_t n, float delta);
  /* Soft cap: x[j] = cap * tanh(x[j] / cap) and, when dc is not NULL, dc[j] = 1 - tanh^2 (the
   * derivative), for j < n; infinities map to +-cap. */
  void (*softcap)(float *x, float *dc, int64_t n, float cap);
  /* f16 rows: dst[d] = s * src[d] (load_f16) and dst[d] = f16(s * src[d]) rounded to nearest even
   * (store_f16), d < n, both contiguous: the conversions of packing and of the outputs. */
  void (*load_f16)(const uint16_t *src, int64_t n, float s, float *dst);
  void (*store_f16)(uint16_t *dst, int64_t n, const float *src, float s);
  /* keep[jj] = 1 when dropout keeps element (b, h, i, j0 + jj) by SPEC.md's Philox rule, else 0,
   * for jj < n; j0 is a multiple of 4 (one Philox call covers 4 columns). */
  void (*dropout_keep)(uint64_t seed, uint32_t threshold, int64_t b, int64_t h, int64_t i,
                       int64_t j0, int64_t n, uint8_t *keep);
  /* The decode path's loops (decode_kernels.h) over one key block of every KV head (the block's
   * K or V rows at a->rows, a->head_bytes between a key's heads, read as `mode`, ROWS_*), key by
   * key with every head of a key inside (address order), requesting a->ahead meanwhile.
   * decode_scores: S[(g R + r) B + jj] = dot(q[(g R + r) ldq ..], K row jj of head g).
   * decode_pv: O[(g R + r) ldo + d] += sum_jj S[(g R + r) B + jj] V row jj of head g [d].
   * (B = ATTN_CPU_DECODE_BLOCK.) */
  void (*decode_scores)(const struct attn_cpu_decode_block *a, const float *q, int mode);
  void (*decode_pv)(const struct attn_cpu_decode_block *a, int mode);
} attn_cpu_kernels;

extern const attn_cpu_kernels attn_cpu_kernels_generic;
/* The portable soft cap (libm's tanhf). */
void attn_cpu_softcap_generic(float *x, float *dc, int64_t n, float cap);
/* The portable f16 conversions (core/dtype.h's). */
void attn_cpu_load_f16_generic(const uint16_t *src, int64_t n, float s, float *dst);
void attn_cpu_store_f16_generic(uint16_t *dst, int64_t n, const float *src, float s);
/* The portable dropout bits (one Philox call per 4 columns), also the AVX2 table's. */
void attn_cpu_dropout_keep_generic(uint64_t seed, uint32_t threshold, int64_t b, int64_t h,
                                   int64_t i, int64_t j0, int64_t n, uint8_t *keep);
/* Keys a block of the decode path holds at most, and the distance between the rows of its scores
 * (attn_cpu_decode_block.S): a constant, so that the loops reach a row's probabilities at fixed
 * offsets from one register (with the stride in a register of its own, GCC ran out of them in the
 * P V loop and moved addresses through vector registers every key). */
#define ATTN_CPU_DECODE_BLOCK 32

/* The arguments of one key block of the decode path's key-by-key loops (decode.c's decode_blocks):
 * nb <= ATTN_CPU_DECODE_BLOCK keys for every KV head, walked in address order (key-outer, heads
 * inside): the hardware prefetchers follow a stream only when every miss is in address order, and a loop over one head's
 * rows of a block (2 KiB apart) streamed at two thirds of the read rate even with no arithmetic.
 * Row r of KV head g is row g * R + r of q, S, P and O. q, P and O's order are the bf16 loops'
 * (attn_cpu_decode_scores_bf16 below); decode.c's loops for the other dtypes use rows, head_bytes
 * and ahead. */
typedef struct attn_cpu_decode_block {
  int64_t heads, R, D, Dv, nb;
  const uint16_t *q; /* bf16 query rows, ldq apart, unscaled */
  int64_t ldq;
  float scale;       /* applied to the sums */
  float *S;          /* scores, then (softmax in decode.c) f32 probabilities, rows
                      * ATTN_CPU_DECODE_BLOCK apart */
  uint16_t *P;       /* scratch: P rounded to bf16, heads * R rows of ATTN_CPU_DECODE_BLOCK */
  float *O;          /* unnormalised out, ldo apart, each 32 columns in the unpack order */
  int64_t ldo;
  const char *const *rows; /* head 0's row (of K for scores, V for pv) of each key of the block */
  size_t head_bytes;       /* between the heads of one key */
  /* rows to request while this call runs (head 0's addresses, every head's row_bytes each, in
   * address order, spread over the keys): the next keys of this stream, then the first of the
   * next phase's */
  struct {
    const char *const *rows;
    int64_t n;
    size_t head_bytes, row_bytes;
  } ahead[2];
} attn_cpu_decode_block;
#if defined(__x86_64__) || defined(__i386__)
#define ATTN_CPU_X86 1
extern const attn_cpu_kernels attn_cpu_kernels_avx2;
extern const attn_cpu_kernels attn_cpu_kernels_avx512;
/* AVX-512 with bf16 dot products: for bf16 problems only. Its gemm rounds both operands to bf16
 * (exact for bf16 inputs; P and dS are rounded, as FlashAttention does: cpu.c says why SPEC.md's
 * bf16 tolerance allows it) and accumulates pairs of products in f32 with vdpbf16ps, twice the
 * f32 FMA rate. */
extern const attn_cpu_kernels attn_cpu_kernels_avx512bf16;
/* AMX-BF16 (kernels_amx.c): the bf16 table's products on tiles (tdpbf16ps), the rest its
 * AVX-512 kernels; for bf16 problems only, and only when attn_cpu_amx_usable(). */
extern const attn_cpu_kernels attn_cpu_kernels_amx;
/* 1 when the processor has AMX-TILE and AMX-BF16, the OS saves their state and (Linux) granted it
 * to this process (asked once); 0 otherwise, and always where the compiler had no AMX. */
int attn_cpu_amx_usable(void);
/* The bf16 loops with vdpbf16ps (decode.c runs them with the avx512bf16 table when D and Dv are
 * multiples of 32 and K and V rows have unit element stride):
 * S[(g R + r) B + jj] = scale * dot(q row g R + r, K row jj of head g), products exact
 * (B = ATTN_CPU_DECODE_BLOCK). */
void attn_cpu_decode_scores_bf16(const attn_cpu_decode_block *a);
/* O[g R + r] += sum_jj bf16(S[(g R + r) B + jj]) V row jj of head g, keys in pairs by vdpbf16ps
 * (an even/odd key's rows unpacked into pairs: O's 32 columns d0 + c of each chunk then hold d0 +
 * 8 (c / 4 % 4) + 4 (c / 16) + c % 4, decode.c's unpermute_pv). */
void attn_cpu_decode_pv_bf16(const attn_cpu_decode_block *a);
/* The AVX-512 kernels shared by both AVX-512 tables. */
void attn_cpu_gemm_avx512(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, int trans_a,
                          const float *b, int64_t ldb, float *c, int64_t ldc, int accumulate,
                          void *scratch);
void attn_cpu_gemm_panels_avx512(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                                 const float *b, int64_t panel_stride, float *c, int64_t ldc,
                                 int accumulate);
void attn_cpu_transpose16_avx512(const float *src, int64_t lds, int64_t n, float *dst);
float attn_cpu_row_max_avx512(const float *x, int64_t n);
float attn_cpu_exp_sum_avx512(float *x, int64_t n, float m);
float attn_cpu_exp_sum_scaled_avx512(float *x, int64_t n, float s, float m);
float attn_cpu_scale_max_avx512(float *x, int64_t n, float s);
void attn_cpu_scale_avx512(float *x, int64_t n, float s);
void attn_cpu_ds_row_avx512(float *dp, const float *p, int64_t n, float delta);
void attn_cpu_softcap_avx512(float *x, float *dc, int64_t n, float cap);
void attn_cpu_load_f16_avx512(const uint16_t *src, int64_t n, float s, float *dst);
void attn_cpu_store_f16_avx512(uint16_t *dst, int64_t n, const float *src, float s);
void attn_cpu_dropout_keep_avx512(uint64_t seed, uint32_t threshold, int64_t b, int64_t h,
                                  int64_t i, int64_t j0, int64_t n, uint8_t *keep);
void attn_cpu_decode_scores_avx512(const attn_cpu_decode_block *a, const float *q, int mode);
void attn_cpu_decode_pv_avx512(const attn_cpu_decode_block *a, int mode);
#endif

/* The decode path (decode.c): few queries per sequence against a dense or paged cache, split over
 * keys and merged through lse. Whether it takes the (resolved) problem, its forward workspace, and
 * the run (after any paged append). */
int attn_cpu_decode_applies(const attn_problem *problem);
size_t attn_cpu_decode_workspace(const attn_problem *problem);
attn_status attn_cpu_decode_forward(const attn_run *run, const attn_cpu_kernels *kernels);

/* Development only (compiled in with -DATTN_CPU_FWD_PHASES in CFLAGS): TSC ticks of the tiled
 * forward's phases summed over threads, to find what bounds it (bench/cpu_bench prints them).
 * QK: S = Q K^T; SOFTMAX: scale, masks, max, exp, rescale of O, dropout; PV: O += P V; QO: loading
 * the query block and storing out and lse; PACK: K and V per key block; REGION: each thread's
 * whole parallel region (so REGION minus the others is scheduling and waiting); BLOCKS: the count
 * of (query block, key block) products. reset: clear them after reading. */
#ifdef ATTN_CPU_FWD_PHASES
enum {
  ATTN_CPU_PHASE_QK, ATTN_CPU_PHASE_SOFTMAX, ATTN_CPU_PHASE_PV, ATTN_CPU_PHASE_QO,
  ATTN_CPU_PHASE_PACK, ATTN_CPU_PHASE_REGION, ATTN_CPU_PHASE_BLOCKS, ATTN_CPU_PHASES
};
void attn_cpu_fwd_phases(uint64_t out[ATTN_CPU_PHASES], int reset);
#endif

/* The kernel table a new plan of "cpu" would use now (its name, as above): cpuid lowered
 * by ATTN_CPU_ISA. For benchmarks that report which path ran. */
const char *attn_cpu_isa_name(int dtype);

#endif /* ATTN_IMPL_CPU_CPU_H */
