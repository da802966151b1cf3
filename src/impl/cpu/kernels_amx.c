/*
 * src/impl/cpu/kernels_amx.c - the gemm of bf16 problems on processors with AMX-BF16 (Intel
 * Sapphire Rapids and later), and the run-time test that the machine and the OS let us use it.
 * Compiled with -mamx-tile -mamx-bf16 and the AVX-512 (BF16) flags when the compiler knows them
 * (CMake defines ATTN_CPU_AMX_BUILD then); chosen by cpu.c only for bf16 problems and only when
 * attn_cpu_amx_usable() says yes. ATTN_CPU_ISA=avx512bf16 (or lower) forces the other tables.
 *
 * One tdpbf16ps multiplies a 16 x 32 bf16 tile of A by a 32 x 16 bf16 tile of B (stored as 16 rows
 * of 16 column pairs: the "VNNI" layout, B[2p + t][c] at row p, word c, half t) into a 16 x 16 f32
 * tile: 8192 multiply-adds, 16 times vdpbf16ps. gemm and gemm_packed take f32 operands (the
 * driver is shared with the f32 path) and first round them to bf16 into the scratch: A as rows
 * [mp][kp] (k padded to 32 with zeros), B as pair rows [kp / 2][n][2]. Then 32 x 32 blocks of C (four
 * accumulator tiles) walk k in steps of 32 with two A and two B tiles: tiles 0-3 hold C, 4-5 A,
 * 6-7 B, all 16 rows x 64 bytes. Edge blocks (m or n not a multiple of 32) run one tile at a time,
 * through a 16 x 16 staging buffer when fewer than 16 rows of C exist.
 *
 * Accuracy, as kernels_avx512bf16.c: rounding is exact for the bf16 inputs (the driver scales S in
 * f32, never q); the backward's P and dS are rounded, as FlashAttention's bf16 kernels do; sums are
 * f32. The forward's P V must not round P (cpu.h's gemm_exact says why): P comes as two bf16
 * terms, hi + lo (16 significant bits, relative error <= 2^-17), multiplied by V in one product
 * twice as deep ([hi | lo] [V ; V]); V is exact in bf16.
 *
 * The forward (cpu.c) uses gemm_bf16: its query block is rounded to bf16 rows once per block and
 * its probabilities are written as bf16 terms by exp_sum_bf16 in the exp pass itself, so neither
 * is repacked per product, and K^T and V are pair rows packed once per call (pack_b).
 *
 * ATTN_CPU_AMX_EMULATE (a development switch: cmake -DATTN_CPU_AMX_EMULATE=ON) replaces the five
 * tile instructions by C on a per-thread array of tiles and declares AMX usable, so the packing,
 * blocking and edge logic run through test_compare and the golden cases on machines without AMX.
 */
#include "impl/cpu/cpu.h"

#include "core/device.h"

#include <stdint.h>
#include <string.h>

#if defined(ATTN_CPU_AMX_BUILD) || defined(ATTN_CPU_AMX_EMULATE)
#define AMX_TILES 1

#include <immintrin.h>

#include "impl/cpu/exp2_avx512.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* ---- the tile instructions (or their emulation) ---------------------------------------------- */

/* Palette 1: every tile 16 rows x 64 bytes (16 f32 or 32 bf16 per row). */
typedef struct tile_config {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tile_config;

/* Static, so all 64 bytes exist before ldtilecfg: GCC 12's _tile_loadconfig declares only the first
 * 8 as read, and stores to a local's other bytes could be dropped. */
static const tile_config amx_config = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

/* GCC 12's tileloadd declares no memory read: this orders the stores of packing (and staging)
 * before the tile loads that read them. */
#define MEMORY_BARRIER() __asm__ volatile("" ::: "memory")

#ifdef ATTN_CPU_AMX_EMULATE
/* Each tile as 16 rows of 64 bytes; tdpbf16ps's arithmetic in f32 (the hardware's rounding of
 * the pair sum differs in the last bit, which no test resolves). */
static _Thread_local unsigned char emu_tiles[8][16][64];

static void emu_load(int t, const void *base, int64_t stride) {
  for (int r = 0; r < 16; ++r) memcpy(emu_tiles[t][r], (const char *)base + r * stride, 64);
}
static void emu_store(int t, void *base, int64_t stride) {
  for (int r = 0; r < 16; ++r) memcpy((char *)base + r * stride, emu_tiles[t][r], 64);
}
static float emu_bf16(const unsigned char *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static void emu_dp(int c, int a, int b) {
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n) {
      float acc;
      memcpy(&acc, &emu_tiles[c][m][4 * n], 4);
      for (int p = 0; p < 16; ++p)
        acc += emu_bf16(&emu_tiles[a][m][4 * p]) * emu_bf16(&emu_tiles[b][p][4 * n]) +
               emu_bf16(&emu_tiles[a][m][4 * p + 2]) * emu_bf16(&emu_tiles[b][p][4 * n + 2]);
      memcpy(&emu_tiles[c][m][4 * n], &acc, 4);
    }
}
#define TILE_CONFIG(cfg) ((void)(cfg))
#define TILE_RELEASE() ((void)0)
#define TILE_ZERO(t) memset(emu_tiles[t], 0, sizeof emu_tiles[t])
#define TILE_LOAD(t, base, stride) emu_load(t, base, stride)
#define TILE_STORE(t, base, stride) emu_store(t, base, stride)
#define TILE_DP(c, a, b) emu_dp(c, a, b)
#else
#define TILE_CONFIG(cfg) _tile_loadconfig(cfg)
#define TILE_RELEASE() _tile_release()
#define TILE_ZERO(t) _tile_zero(t)
#define TILE_LOAD(t, base, stride) _tile_loadd(t, base, stride)
#define TILE_STORE(t, base, stride) _tile_stored(t, base, stride)
#define TILE_DP(c, a, b) _tile_dpbf16ps(c, a, b)
#endif

/* The configuration stays loaded from one product to the next on a thread (ldtilecfg, then
 * tilerelease, around each of the forward's two products per key block cost them both a pipeline
 * drain); tiles_release_amx (cpu.h's tiles_release) hands the tiles back at the end of a pass. */
static _Thread_local int tiles_loaded;

ALWAYS_INLINE void tiles_configure(void) {
  if (!tiles_loaded) {
    TILE_CONFIG(&amx_config);
    tiles_loaded = 1;
  }
}

static void tiles_release_amx(void) {
  if (tiles_loaded) {
    TILE_RELEASE();
    tiles_loaded = 0;
  }
}

/* ---- may we use it? ----------------------------------------------------------------------------- */

/* The processor has AMX-TILE and AMX-BF16, the OS saves the tile state and (Linux) granted it to
 * this process: src/core/device.c asks all of that, once, in the one place that detects features. */
#ifdef ATTN_CPU_AMX_EMULATE
static int amx_probe(void) { return 1; }
#else
static int amx_probe(void) { return attn_cpu_can_run(ATTN_CPU_AMX_ANY); }
#endif

int attn_cpu_amx_usable(void) {
  /* Asked once per process; a race only asks twice (the request is idempotent). */
  static int state = -1;
  int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
  if (s < 0) {
    s = amx_probe();
    __atomic_store_n(&state, s, __ATOMIC_RELEASE);
  }
  return s;
}

/* ---- packing -------------------------------------------------------------------------------- */

ALWAYS_INLINE __mmask16 mask_of(int64_t left) {
  return left >= 16 ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
}

/* 16 floats rounded to bf16 (nearest even). */
ALWAYS_INLINE __m256i to_bf16(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); }

/* The words (h0[i], h1[i]) for i < 16: two rows' bf16 interleaved into pairs, the VNNI order. */
ALWAYS_INLINE __m512i interleave(__m256i h0, __m256i h1) {
  const __m512i idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                       39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  return _mm512_permutex2var_epi16(_mm512_castsi256_si512(h0), idx, _mm512_castsi256_si512(h1));
}

/* r[i] = the column i of the 16 x 16 matrix of 32-bit words whose rows were r[0..16). */
ALWAYS_INLINE void transpose16(__m512i r[16]) {
  __m512i t[16], u[16], v[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) { /* u[4g + j], 128-bit lane L: rows 4g..4g+3 of column 4L + j */
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g + 0], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g + 0], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    v[j] = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88); /* lanes 0 and 2 of both */
    v[4 + j] = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xdd); /* lanes 1 and 3 */
    v[8 + j] = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88);
    v[12 + j] = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xdd);
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm512_shuffle_i32x4(v[j], v[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_i32x4(v[j], v[8 + j], 0xdd);
    r[4 + j] = _mm512_shuffle_i32x4(v[4 + j], v[12 + j], 0x88);
    r[12 + j] = _mm512_shuffle_i32x4(v[4 + j], v[12 + j], 0xdd);
  }
}

/* A rows: out[r * ldo + kk] = bf16(A(r, kk)) for r < mp, kk < kp, zero where r >= m or kk >= k.
 * A(r, kk) = a[r * lda + kk] (trans_a = 0) or a[kk * lda + r]. */
static void pack_a(const float *a, int64_t lda, int trans_a, int64_t m, int64_t k, int64_t mp,
                   int64_t kp, uint16_t *out, int64_t ldo) {
  if (!trans_a) {
    for (int64_t r = 0; r < mp; ++r) {
      uint16_t *o = out + r * ldo;
      if (r >= m) {
        memset(o, 0, (size_t)kp * sizeof(uint16_t));
        continue;
      }
      const float *s = a + r * lda;
      for (int64_t c = 0; c < kp; c += 16)
        _mm256_storeu_si256((__m256i *)(o + c), to_bf16(_mm512_maskz_loadu_ps(mask_of(k - c), s + c)));
    }
    return;
  }
  /* Transposed: two source rows (kk, kk + 1) give 16 words (r..r+15, kk / 2): 16 such (32 source
   * rows) make a 16 x 16 block of words whose transpose is 16 rows of out, 64 bytes each. */
  for (int64_t kk = 0; kk < kp; kk += 32) {
    for (int64_t r = 0; r < mp; r += 16) {
      const __mmask16 mask = mask_of(m - r);
      __m512i w[16];
      for (int p = 0; p < 16; ++p) {
        const int64_t k0 = kk + 2 * p;
        __m256i h0 = _mm256_setzero_si256(), h1 = _mm256_setzero_si256();
        if (k0 < k) h0 = to_bf16(_mm512_maskz_loadu_ps(mask, a + k0 * lda + r));
        if (k0 + 1 < k) h1 = to_bf16(_mm512_maskz_loadu_ps(mask, a + (k0 + 1) * lda + r));
        w[p] = interleave(h0, h1);
      }
      transpose16(w);
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512((void *)(out + (r + i) * ldo + kk), w[i]);
    }
  }
}

/* B pair rows: out[p * ldo + 2c + t] = bf16(b[(2p + t) * ldb + c]) for p < ceil(k / 2), c < n (a
 * multiple of 16), the partner of an odd last row 0; then pair rows up to `rows` zero. The one
 * packing of B: per product (gemm) and once per key block (cpu.h's pack_b). */
static void pack_pairs(const float *b, int64_t ldb, int64_t k, int64_t n, uint16_t *out,
                       int64_t ldo, int64_t rows) {
  for (int64_t p = 0; p < rows; ++p) {
    uint16_t *o = out + p * ldo;
    if (2 * p >= k) {
      memset(o, 0, (size_t)(2 * n) * sizeof(uint16_t));
      continue;
    }
    const float *r0 = b + 2 * p * ldb;
    const float *r1 = 2 * p + 1 < k ? r0 + ldb : NULL;
    for (int64_t c = 0; c < n; c += 16) {
      const __m256i h1 = r1 != NULL ? to_bf16(_mm512_loadu_ps(r1 + c)) : _mm256_setzero_si256();
      _mm512_storeu_si512((void *)(o + 2 * c), interleave(to_bf16(_mm512_loadu_ps(r0 + c)), h1));
    }
  }
}

/* ---- the forward's probabilities ------------------------------------------------------------ */

/* cpu.h's exp_sum_bf16, 32 columns a step: e = 2^((s x - m) log2(e)) (exp2_probability; s x - m
 * first, scaled_difference, so that no product with log2(e) overflows), and vcvtne2ps2bf16 rounds
 * two vectors to bf16 at once (nearest even; subnormals, under 2^-126 of the row's largest term 1,
 * become zero, as in every conversion of this table). lo = bf16(e - hi), e - hi being exact. */
static float exp_sum_bf16_amx(const float *x, int64_t n, float s, float m, uint16_t *hi_out,
                              uint16_t *lo_out, int64_t np) {
  const __m512 sv = _mm512_set1_ps(s), mv = _mm512_set1_ps(m);
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  for (int64_t j = 0; j < np; j += 32) {
    const __mmask16 k0 = mask_of(n - j), k1 = mask_of(n - j - 16);
    const __m512 d0 = scaled_difference(_mm512_maskz_loadu_ps(k0, x + j), sv, mv);
    const __m512 d1 = scaled_difference(_mm512_maskz_loadu_ps(k1, x + j + 16), sv, mv);
    const __m512 e0 = _mm512_maskz_mov_ps(k0, exp2_probability(_mm512_mul_ps(d0, log2e)));
    const __m512 e1 = _mm512_maskz_mov_ps(k1, exp2_probability(_mm512_mul_ps(d1, log2e)));
    s0 = _mm512_add_ps(s0, e0);
    s1 = _mm512_add_ps(s1, e1);
    const __m512i hi = (__m512i)_mm512_cvtne2ps_pbh(e1, e0); /* e0's words first */
    const __mmask32 room =
        np - j >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << (np - j)) - 1u);
    _mm512_mask_storeu_epi16(hi_out + j, room, hi);
    if (lo_out == NULL) continue;
    /* hi as f32: each word shifted into the upper half of a 32-bit lane */
    const __m512 h0 = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hi)), 16));
    const __m512 h1 = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(hi, 1)), 16));
    const __m512i lo = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(e1, h1), _mm512_sub_ps(e0, h0));
    _mm512_mask_storeu_epi16(lo_out + j, room, lo);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

/* ---- the product ------------------------------------------------------------------------------ */

typedef struct amx_operands {
  const uint16_t *a; /* [round_up(m, 16)][lda] bf16 rows: terms of kp each, zero from k to kp */
  int64_t lda;       /* elements */
  const uint16_t *b; /* pair rows of B, ldb elements apart; 16 of them per step of 32 along k */
  int64_t ldb;
  const uint16_t *tail; /* the last, partial step's 16 pair rows (zero past k), 2n apart; or NULL */
  int64_t ldtail;
  int64_t bsteps; /* of 32 along k: the full ones in b, then the one in tail if any */
  int64_t steps;  /* along A's rows: bsteps per term, B's steps again for each term */
} amx_operands;

/* A's tile at rows i, step s; B's at step s (of its term), columns j, and the byte stride of its
 * rows. */
ALWAYS_INLINE const uint16_t *a_at(const amx_operands *o, int64_t i, int64_t s) {
  return o->a + i * o->lda + s * 32;
}
ALWAYS_INLINE const uint16_t *b_at(const amx_operands *o, int64_t s, int64_t j, int64_t *stride) {
  s %= o->bsteps;
  if (o->tail != NULL && s == o->bsteps - 1) {
    *stride = o->ldtail * 2;
    return o->tail + j * 2;
  }
  *stride = o->ldb * 2;
  return o->b + s * 16 * o->ldb + j * 2;
}

/* C[i..i+32, j..j+32] (all inside C) from four tiles. */
static void block_2x2(const amx_operands *o, int64_t i, int64_t j, float *c, int64_t ldc, int acc) {
  const int64_t sa = o->lda * 2, sc = ldc * 4;
  float *c00 = c + i * ldc + j, *c01 = c00 + 16, *c10 = c00 + 16 * ldc, *c11 = c10 + 16;
  if (acc) {
    TILE_LOAD(0, c00, sc);
    TILE_LOAD(1, c01, sc);
    TILE_LOAD(2, c10, sc);
    TILE_LOAD(3, c11, sc);
  } else {
    TILE_ZERO(0);
    TILE_ZERO(1);
    TILE_ZERO(2);
    TILE_ZERO(3);
  }
  for (int64_t s = 0; s < o->steps; ++s) {
    int64_t sb;
    const uint16_t *b0 = b_at(o, s, j, &sb);
    TILE_LOAD(4, a_at(o, i, s), sa);
    TILE_LOAD(5, a_at(o, i + 16, s), sa);
    TILE_LOAD(6, b0, sb);
    TILE_LOAD(7, b0 + 32, sb);
    TILE_DP(0, 4, 6);
    TILE_DP(1, 4, 7);
    TILE_DP(2, 5, 6);
    TILE_DP(3, 5, 7);
  }
  TILE_STORE(0, c00, sc);
  TILE_STORE(1, c01, sc);
  TILE_STORE(2, c10, sc);
  TILE_STORE(3, c11, sc);
}

/* C[i..i+rows, j..j+16] from one tile, rows <= 16; stage: 256 floats when rows < 16. */
static void block_1x1(const amx_operands *o, int64_t i, int64_t j, int64_t rows, float *c,
                      int64_t ldc, int acc, float *stage) {
  const int64_t sa = o->lda * 2;
  float *cij = c + i * ldc + j;
  float *dst = rows == 16 ? cij : stage;
  const int64_t sd = rows == 16 ? ldc * 4 : 64;
  if (acc) {
    if (rows < 16) {
      memset(stage, 0, 256 * sizeof(float));
      for (int64_t r = 0; r < rows; ++r) memcpy(stage + r * 16, cij + r * ldc, 16 * sizeof(float));
      MEMORY_BARRIER();
    }
    TILE_LOAD(0, dst, sd);
  } else {
    TILE_ZERO(0);
  }
  for (int64_t s = 0; s < o->steps; ++s) {
    int64_t sb;
    const uint16_t *b0 = b_at(o, s, j, &sb);
    TILE_LOAD(4, a_at(o, i, s), sa);
    TILE_LOAD(6, b0, sb);
    TILE_DP(0, 4, 6);
  }
  TILE_STORE(0, dst, sd);
  if (rows < 16)
    for (int64_t r = 0; r < rows; ++r) memcpy(cij + r * ldc, stage + r * 16, 16 * sizeof(float));
}

/* Scratch (cpu.h's ATTN_CPU_GEMM_SCRATCH, 64-byte aligned): the staging tile (256 floats), then
 * B's pairs (gemm) or the partial step's (gemm_packed, gemm_bf16), then A's rows. */
#define SCRATCH_B(scratch) ((uint16_t *)((char *)(scratch) + 256 * sizeof(float)))

/* C = (accumulate ? C : 0) + sum_t A_t B, A packed as `terms` terms (amx_operands), B pair rows
 * ldb elements apart of which rows < k are read: whole steps of 32 along k in place, the last,
 * partial one copied into the scratch with the rows past k zeroed (the packed rows there may hold
 * other keys' values, and 0 * inf would be NaN), unless b_padded says B's rows up to k rounded to
 * 32 are zero already. */
static void product(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda, int terms,
                    const uint16_t *b, int64_t ldb, int b_padded, float *c, int64_t ldc,
                    int accumulate, void *scratch) {
  const int64_t full = k / 32, rem = k - full * 32;
  uint16_t *tail = NULL;
  if (rem > 0 && !b_padded) {
    tail = SCRATCH_B(scratch);
    const uint16_t *src = b + full * 16 * ldb;
    const int64_t pairs = (rem + 1) / 2;
    for (int64_t p = 0; p < 16; ++p) {
      if (p < pairs) memcpy(tail + p * 2 * n, src + p * ldb, (size_t)(2 * n) * sizeof(uint16_t));
      else memset(tail + p * 2 * n, 0, (size_t)(2 * n) * sizeof(uint16_t));
    }
    if (rem % 2 == 1) /* the last pair's second row is row k: not ours */
      for (int64_t col = 0; col < n; ++col) tail[(pairs - 1) * 2 * n + 2 * col + 1] = 0;
  }
  const int64_t bsteps = (k + 31) / 32;
  const amx_operands o = {a, lda, b, ldb, tail, 2 * n, bsteps, terms * bsteps};
  float *stage = (float *)scratch;
  MEMORY_BARRIER();
  tiles_configure();
  for (int64_t i = 0; i < m; i += 32) {
    for (int64_t j = 0; j < n; j += 32) {
      if (i + 32 <= m && j + 32 <= n) {
        block_2x2(&o, i, j, c, ldc, accumulate);
        continue;
      }
      for (int64_t ii = i; ii < i + 32 && ii < m; ii += 16)
        for (int64_t jj = j; jj < j + 32 && jj < n; jj += 16)
          block_1x1(&o, ii, jj, m - ii < 16 ? m - ii : 16, c, ldc, accumulate, stage);
    }
  }
}

static int zero_or_done(int64_t m, int64_t n, int64_t k, float *c, int64_t ldc, int accumulate) {
  if (m <= 0 || n <= 0) return 1;
  if (k > 0) return 0;
  if (!accumulate)
    for (int64_t r = 0; r < m; ++r) memset(c + r * ldc, 0, (size_t)n * sizeof(float));
  return 1;
}

/* A rounded to bf16 rows after B's kp * n words in the scratch. */
static const uint16_t *packed_a(const float *a, int64_t lda, int trans_a, int64_t m, int64_t n,
                                int64_t k, void *scratch) {
  const int64_t kp = (k + 31) / 32 * 32;
  uint16_t *ap = SCRATCH_B(scratch) + kp * n;
  pack_a(a, lda, trans_a, m, k, (m + 15) / 16 * 16, kp, ap, kp);
  return ap;
}

static void gemm_amx(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, int trans_a,
                     const float *b, int64_t ldb, float *c, int64_t ldc, int accumulate,
                     void *scratch) {
  if (zero_or_done(m, n, k, c, ldc, accumulate)) return;
  const int64_t kp = (k + 31) / 32 * 32;
  uint16_t *bp = SCRATCH_B(scratch);
  pack_pairs(b, ldb, k, n, bp, 2 * n, kp / 2);
  const uint16_t *ap = packed_a(a, lda, trans_a, m, n, k, scratch);
  product(m, n, k, ap, kp, 1, bp, 2 * n, 1, c, ldc, accumulate, scratch);
}

static void pack_b_amx(const float *b, int64_t ldb, int64_t k, int64_t n, uint16_t *out,
                       int64_t ldo) {
  pack_pairs(b, ldb, k, n, out, ldo, (k + 1) / 2);
}

static void pack_rows_amx(const float *a, int64_t lda, int64_t m, int64_t k, uint16_t *out,
                          int64_t ldo) {
  pack_a(a, lda, 0, m, k, (m + 15) / 16 * 16, ldo, out, ldo);
}

static void gemm_packed_amx(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                            int trans_a, const uint16_t *b, int64_t ldb, float *c, int64_t ldc,
                            int accumulate, void *scratch) {
  if (zero_or_done(m, n, k, c, ldc, accumulate)) return;
  const uint16_t *ap = packed_a(a, lda, trans_a, m, n, k, scratch);
  product(m, n, k, ap, (k + 31) / 32 * 32, 1, b, ldb, 0, c, ldc, accumulate, scratch);
}

static void gemm_bf16_amx(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda,
                          int terms, const uint16_t *b, int64_t ldb, float *c, int64_t ldc,
                          int accumulate, void *scratch) {
  if (zero_or_done(m, n, k, c, ldc, accumulate)) return;
  product(m, n, k, a, lda, terms, b, ldb, 0, c, ldc, accumulate, scratch);
}

#else /* a compiler without AMX: the table exists (cpu.c names it) but is never chosen */

int attn_cpu_amx_usable(void) { return 0; }

#endif

/* One table either way: the tile products where the compiler has them, the rest AVX-512's. */
const attn_cpu_kernels attn_cpu_kernels_amx = {
    .name = "amx",
#ifdef AMX_TILES
    .gemm = gemm_amx,
    .pack_b = pack_b_amx,
    .pack_rows = pack_rows_amx,
    .gemm_packed = gemm_packed_amx,
    .gemm_bf16 = gemm_bf16_amx,
    .exp_sum_bf16 = exp_sum_bf16_amx,
    .tiles_release = tiles_release_amx,
#else
    .gemm = attn_cpu_gemm_avx512, /* never called: attn_cpu_amx_usable() is 0 */
#endif
    .row_max = attn_cpu_row_max_avx512,
    .exp_sum = attn_cpu_exp_sum_avx512,
    .scale = attn_cpu_scale_avx512,
    .scale_max = attn_cpu_scale_max_avx512,
    .ds_row = attn_cpu_ds_row_avx512,
    .softcap = attn_cpu_softcap_avx512,
    .load_f16 = attn_cpu_load_f16_avx512,
    .store_f16 = attn_cpu_store_f16_avx512,
    .dropout_keep = attn_cpu_dropout_keep_avx512,
};
