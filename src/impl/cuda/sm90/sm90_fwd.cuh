/*
 * src/impl/cuda/sm90/sm90_fwd.cuh - the Hopper forward (sm_90a only): FlashAttention-3's schedule on
 * the tensor memory accelerator (TMA) and warpgroup matrix instructions (wgmma).
 *
 * One CTA of three warpgroups computes 128 query rows of one (batch, query head) (of four
 * warpgroups, 192 rows, with kCWG = 3). Warpgroup 0 is the producer: one thread issues bulk tensor copies (cp.async.bulk.tensor) of the Q tile and of
 * each key block's K and V tiles into shared memory, kStages buffers deep, each copy completing on
 * an mbarrier ("full"), and waits for the consumers to hand a buffer back ("empty") before reusing
 * it. The other warpgroups are the consumers, 64 query rows each: S = Q K^T by wgmma with both
 * operands in shared memory, the online softmax in f32 registers, and O += P V by wgmma with P in
 * registers (the S accumulator of two adjacent 8-key groups is exactly wgmma's A fragment, as with
 * mma.sync). The producer gives its registers to the consumers (setmaxnreg: 24 and 240 of the 168
 * a thread gets at launch with two consumer warpgroups, 24 and 160 of 128 with three).
 *
 * Shared tiles are the copy engine's 128-byte swizzle: a tile of R rows x D columns is D / 64
 * panels of R rows x 128 bytes, each 1024-byte aligned, which is the layout wgmma's descriptors
 * name as "128B swizzle": K-major for Q and K (the reduction runs along the row), MN-major for V
 * (P V reduces over V's rows, so V is read transposed, as wgmma's transpose-B allows for 16-bit
 * types). Out-of-range rows (past the sequence's end) are filled with zeros by the copy engine.
 *
 * With kOverlap, a consumer issues S(n+1) = Q K(n+1)^T and O += P(n) V(n) together and computes
 * the softmax of S(n+1) while the second product runs (FlashAttention-3's intra-warpgroup
 * pipelining); the output is rescaled only after that product has landed.
 *
 * With kPersistent (kSched, lab v10) the grid is one CTA per SM, each taking tiles (a query block
 * of one (batch, head)) blockIdx.x, blockIdx.x + gridDim.x, ... in tile_of's order: the longest
 * first under a causal band, within sections of heads whose K and V fit half the L2. The K / V
 * stages' and Q's mbarrier phases run on across tiles, and Q has an "empty" barrier too, at which
 * the consumers arrive once a tile's last S has landed: the producer loads the next tile's first K,
 * its Q and its V while the consumers finish the last P V and store O, so a short tile's prologue
 * (Q, the first K) and epilogue no longer stand between two tiles' products, and no CTA is launched
 * per tile. The epilogue still stores O from registers (not through shared memory and the copy
 * engine). Measured (H200, bf16, one call; bench/RESULTS.md): 1.07-1.17x the grid at T = 512
 * (D = 64 and 128, and 256 causal), 0.99-1.06x at D = 64 from T = 2048 up, but 0.86-1.00x at
 * D = 128 and 256 from T = 2048 up (causal: the static stride's imbalance between CTAs, which
 * dev/cuda/tile_order_sim.py models; non-causal: not explained yet); sm90_launch.cu's
 * persistent_pays picks per problem. kSchedSnake (lab v11, not yet measured) reverses every other
 * wave and, under a band, orders the whole problem longest first.
 *
 * Features (SPEC.md steps 1-5) take one of three instantiations (Fwd90Mode, chosen by fwd90_mode):
 * the plain kernel takes the band, the sinks (they seed each row's running max and sum before the
 * first key block, once per row) and varlen (sequences addressed by their first rows when packed,
 * their lengths masking the rest), none of which costs anything per score; the cap / ALiBi kernel
 * adds ALiBi (one FADD and one FFMA) and the soft cap (one tanh_sfu a score with kCapTanh, or
 * folded into the softmax, cap_softmax) on the whole S tile in registers, masking only the band's
 * edge blocks like the plain kernel; the generic kernel takes the rest (bias, masks, segment ids,
 * caps above SoftCap::kMaxCap) through the sm_80 kernel's per-element helpers (cuda_common.cuh:
 * visible, logit) on every block.
 *
 * Scope (sm90_fwd_unsupported says which problems it refuses, with the reason): head dims 64, 128
 * and 256 with Dv = D, bf16 and f16, the per-element functions of kElementwiseKinds, no dropout,
 * sinks, packed and padded varlen, any causal / window band in either alignment, GQA / MQA, lse.
 * The library offers the generic kernel at D = 256 only (kGenericDeclined).
 */
#ifndef ATTN_IMPL_CUDA_SM90_SM90_FWD_CUH
#define ATTN_IMPL_CUDA_SM90_SM90_FWD_CUH

#include <cuda.h> /* CUtensorMap and its enums: types only, the function comes through the runtime */
#include <cudaTypedefs.h>

#include <algorithm>
#include <type_traits>

#include "impl/cuda/cuda_check.cuh"
#include "impl/cuda/cuda_common.cuh"
#include "impl/cuda/cuda_mbarrier.cuh"
#include "impl/cuda/sm90/sm90_wgmma.cuh"

namespace attn_cuda {
namespace sm90 {

/* ---- instructions ------------------------------------------------------------------------------ */

/* mbar_init, mbar_expect_tx, mbar_arrive, mbar_wait: impl/cuda/cuda_mbarrier.cuh */

/* A box of the tensor map at coordinates (c0 innermost .. c3) into shared memory at dst, counted
 * on bar. */
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap *map, uint32_t bar, int c0, int c1,
                                         int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, "
               "%5, %6}], [%2];\n" ::"r"(dst),
               "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

/* wgmma's shared-memory matrix descriptor with the 128-byte swizzle: start address, leading and
 * stride byte offsets (in 16-byte units). K-major: sbo = 1024 (the next 8 rows), lbo unused.
 * MN-major: lbo = the next 64 columns (the next panel), sbo = 1024 (the next 8 rows of K). */
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr & 0x3ffff) >> 4) | (uint64_t)(lbo >> 4) << 16 | (uint64_t)(sbo >> 4) << 32 |
         (uint64_t)1 << 62;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
/* Pins registers that an asynchronous wgmma reads or writes at this point of the program, so the
 * compiler neither moves their other uses across the wait nor reuses them while it runs. */
template <int N> __device__ __forceinline__ void pin(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> __device__ __forceinline__ void pin(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[i][e])::"memory");
}

/* Where sequence b's rows start in the tensor maps (map_geometry): packed varlen maps all the
 * rows as one batch, so a sequence is addressed by its first rows; dense and padded ones by b. */
struct MapOrigin {
  int q_row0, k_row0, batch;
};
__device__ __forceinline__ MapOrigin map_origin(const attn_cuda_params &p, const Seq &sq, int b) {
  if (p.varlen == ATTN_CUDA_VARLEN_PACKED) return {(int)sq.q0, (int)sq.k0, 0};
  return {0, 0, b};
}

/* Zeroes rows [valid, kRows) of a swizzled tile of kPanels panels x kRows rows (16-byte chunks
 * spread over threads tid0.. of a team of kTeam) and makes the zeros visible to wgmma's async
 * proxy; the caller's barrier of the team orders them before the products. Varlen only: past a
 * sequence's end the copy engine brings the next sequence's rows (or the tensor's padding), which
 * may hold anything, and a product that multiplies them by a zero P or dS still gives NaN for a
 * NaN; dense rows past the length lie outside the map, where the copy engine writes zeros. */
template <int kPanels, int kRows, int kTeam>
__device__ __forceinline__ void clear_tail_rows(uint32_t tile, int valid, int tid0) {
  for (int c = tid0; c < kPanels * kRows * 8; c += kTeam) {
    const int panel = c / (kRows * 8), r = c / 8 % kRows;
    if (r >= valid) /* a whole 128-byte row: the swizzle moves chunks only within a row */
      asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(tile + panel * kRows * 128 + r * 128 + (c % 8) * 16),
                   "r"(0)
                   : "memory");
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* ---- the soft cap's and the softmax's arithmetic off the special-function unit (lab v6, v7) ----- */

/* 1 / x for x in [1, 2] on the FMA pipe, within 7e-8 relative (rcp's 2^-23 and a rounding): a
 * degree-2 start p(x) = (210 - 144 x + 32 x^2) / 99, whose 1 - x p(x) is T3(2x - 3) / -99, so
 * within 1/99, then one cubic correction p (1 + e + e^2 + e^3) with e = 1 - x p, which leaves
 * e^4 ~ 1e-8. Six FMAs. */
__device__ __forceinline__ float rcp_1to2(float x) {
  const float p = fmaf(x, fmaf(x, 32.f / 99.f, -144.f / 99.f), 210.f / 99.f);
  const float e = fmaf(-x, p, 1.f);
  return fmaf(p, fmaf(fmaf(e, e, e), e, e), p);
}

/* SoftCap::logit2 with 1 / (1 + u) by rcp_1to2 (kCapRcpFma): one special-function instruction, not
 * two, and the logit as out (2 r - 1) = out (1 - u) / (1 + u), its sign that of dot * in (the sign
 * of in folded into the constants). Within cap * 2.6e-7 (logit2: 2e-7; both simulated in f32 for
 * |y| < 2, the exponential exact), u's 2^-22 on top; ten instructions in all. */
__device__ __forceinline__ float cap_logit2_fma(const SoftCap &cap, float dot) {
  /* -2 log2(e) |in| held to -FLT_MAX like in, so a zero dot product stays 0 under a tiny cap */
  const float u = ex2(fabsf(dot) * fmaxf(-2.f * kLog2e * fabsf(cap.in), -3.40282347e38f));
  const float r = rcp_1to2(1.f + u);
  const float out_s = copysignf(cap.out, cap.in); /* constants of the block: hoisted out of the loop */
  const float v = fmaf(r, 2.f * out_s, -out_s);
  return __int_as_float(__float_as_int(v) ^ (__float_as_int(dot) & 0x80000000));
}

/* 2^x for x <= 0 on the FMA pipe (kExpFmaEvery), within 7.5e-5 relative: enough for a P rounded to
 * 16 bits (bf16 rounds by 2^-9, f16 by 2^-12), not for a logit. x is rounded to an integer j by
 * adding 1.5 * 2^23 (j lands in the sum's low mantissa bits), 2^(x - j) is a degree-3 minimax
 * polynomial on [-1/2, 1/2], and j is added to its exponent field by an integer shift and add.
 * Below -126 (-inf included) it gives a number under 2^-125, not 0: the clamp keeps the exponent
 * field from wrapping. Six FMA-pipe instructions and two integer ones where ex2 is one
 * special-function instruction, which costs the FMA pipe's eight (FlashAttention-4's split). */
__device__ __forceinline__ float ex2_fma(float x) {
  x = fmaxf(x, -126.f);
  const float t = __fadd_rn(x, 12582912.f);
  const float f = __fsub_rn(x, __fsub_rn(t, 12582912.f));
  const float p = fmaf(fmaf(fmaf(0.0551716691f, f, 0.242611122f), f, 0.693260985f), f, 0.999928074f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

/* ---- configuration ----------------------------------------------------------------------------- */

/* How the tiles are spread over CTAs (kSched): one CTA per tile (the grid), or one CTA per SM
 * taking wave k's tile k * gridDim.x + blockIdx.x (kSchedStride, lab v10), or with kSchedSnake
 * every other wave in reverse, gridDim.x - 1 - blockIdx.x (lab v11: a CTA that took one of a
 * wave's longer tiles takes one of the next wave's shorter ones), under a band over the whole
 * problem ordered longest first (launch_fwd90). */
enum TileSched : int { kSchedGrid = 0, kSchedStride = 1, kSchedSnake = 2 };

/* kCWG consumer warpgroups of 64 rows each (2 or 3) beside the producer. The register file (64K
 * per SM, one CTA) is split by setmaxnreg: 24 per producer thread, the rest to the consumers in
 * steps of 8 (240 each for two consumer warpgroups, 160 for three). kCap: how the cap / ALiBi
 * kernel computes the soft cap (CapForm). kExpFmaEvery = N > 0: the softmax's exponentials of one
 * 8-key group in N by ex2_fma on the FMA pipe rather than ex2 on the special-function unit.
 * kPingPong (with kOverlap): the consumer warpgroups take turns to issue their products, so that
 * one's softmax runs while the others' products do (FlashAttention-3's inter-warpgroup overlap).
 * kSched: TileSched. */
enum CapForm : int {
  kCapRcp = 0,    /* SoftCap::logit2 on every score, then the softmax: 3 special-function ops a score */
  kCapRcpFma = 1, /* cap_logit2_fma: the reciprocal on the FMA pipe; 2 ops, 6 FMAs more */
  kCapFused = 2,  /* the cap folded into the softmax (cap_softmax): 3 ops, 8.5 instructions a score */
  kCapTanh = 3,   /* tanh_sfu on every score, then the softmax: 2 ops a score (lab v14); within 2^-11
                     of the logit, not cap * 2.6e-7 */
  kCapTanhScaled = 4, /* kCapTanh with its multiply by cap log2(e) left to the softmax's FMA (its
                         mult): one instruction a score fewer, 0.97-1.02x kCapTanh on an H200
                         (lab v15, not kept) */
};
template <typename T_, int kD_, int kBN_, int kStages_, bool kOverlap_, int kCWG_ = 2, int kCap_ = kCapFused,
          int kExpFmaEvery_ = 0, bool kPingPong_ = false, int kSched_ = kSchedGrid, bool kMaskRange_ = false>
struct FwdCfg90 {
  using T = T_;
  static constexpr int kD = kD_, kBN = kBN_, kStages = kStages_, kCWG = kCWG_;
  static constexpr int kCap = kCap_, kExpFmaEvery = kExpFmaEvery_;
  static constexpr int kSched = kSched_;
  /* kMaskRange (lab v12): an edge block's scores tested against each of the thread's two rows'
   * visible key range (visible_band_keys, once a tile), a select per score, instead of
   * visible_band's branches per score (the sm90 backward's v6 found such branches serialising the
   * step around them: dev/cuda/bwd_hopper.cu); sm90_launch.cu says where it is on */
  static constexpr bool kMaskRange = kMaskRange_;
  static constexpr bool kOverlap = kOverlap_, kPingPong = kPingPong_ && kOverlap_, kPersistent = kSched_ != kSchedGrid;
  /* whether 8-key group g (of kBN / 8) takes the FMA pipe, one in every N (0: none) */
  __host__ __device__ static constexpr bool on_fma(int every, int g) {
    return every > 0 && g % (every > 0 ? every : 1) == every - 1;
  }
  static constexpr int kBM = 64 * kCWG, kThreads = 128 * (kCWG + 1), kPanels = kD / 64;
  static constexpr int kProducerRegs = 24, kConsumerRegs = (65536 / 128 - kProducerRegs) / kCWG / 8 * 8;
  static constexpr uint32_t kQBytes = kBM * kD * 2, kKVBytes = kBN * kD * 2;
  /* Q, K and V buffers, the barriers, and 1024 bytes to align the base for the swizzle */
  static constexpr uint32_t kSmem = 1024 + kQBytes + 2 * kStages * kKVBytes + 8 * (2 + 4 * kStages);
  static_assert(kD % 64 == 0 && kBN % 16 == 0 && kBN <= 256 && kBM <= 256, "tile shape");
};

/* ---- the kernel -------------------------------------------------------------------------------- */

/* What a kernel instantiation computes per score (see the header; fwd90_mode picks one for a
 * problem). Every mode takes the band, sinks, varlen, GQA and lse. */
enum Fwd90Mode : int {
  kModePlain = 0,    /* S * scale: folded into the exponent's FMA */
  kModeCapAlibi = 1, /* plus the soft cap (up to SoftCap::kMaxCap) and ALiBi, in registers */
  kModeGeneric = 2,  /* every per-element function, by visible() and logit() on every block */
};

/* The tiles of a persistent launch (FwdCfg90::kPersistent): every (query block, batch, query
 * head) of the problem, numbered (tile_of) so that the CTAs, taking them wave by wave (TileSched),
 * start the longest first. Set by launch_fwd90. */
struct Tiles90 {
  int count;    /* m_blocks * batch * heads */
  int m_blocks; /* query blocks of kBM rows of one (batch, head) */
  int heads;    /* query heads */
  int section;  /* (batch, head) pairs of a section: as many as half the L2 holds the K and V of */
};

/* Tile t of a persistent launch, as (batch, head, first row): sections of ts.section (batch, head)
 * pairs one after the other, so that the CTAs at work share the K and V of a few heads in L2 (the
 * one-CTA-per-tile grid does so by running a head's query blocks side by side); within a section
 * the last query blocks first, its pairs innermost: under a causal band (either alignment) they see
 * the most keys, so the short tiles fill the tail. */
struct Tile90 {
  int b, h, m0;
};
__device__ __forceinline__ Tile90 tile_of(const Tiles90 &ts, int t, int kBM) {
  const int per_section = ts.m_blocks * ts.section, sec = t / per_section, r = t - sec * per_section;
  const int width = min(ts.section, ts.count / ts.m_blocks - sec * ts.section); /* the last one may be narrower */
  const int bh = sec * ts.section + r % width;
  return {bh / ts.heads, bh % ts.heads, (ts.m_blocks - 1 - r / width) * kBM};
}

template <typename C, int kMode>
__global__ void __launch_bounds__(C::kThreads, 1)
    fwd90_kernel(const __grid_constant__ attn_cuda_params p, const __grid_constant__ CUtensorMap tq,
                 const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv, const Tiles90 ts) {
  using T = typename C::T;
  constexpr int kD = C::kD, kBN = C::kBN, kBM = C::kBM, kStages = C::kStages;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t sQ = (smem_u32(smem_raw) + 1023) & ~1023u;
  const uint32_t sK = sQ + C::kQBytes, sV = sK + kStages * C::kKVBytes, bars = sV + kStages * C::kKVBytes;
  /* barriers: Q full; then per stage K full, V full, K empty, V empty; then Q empty */
  const uint32_t bar_q = bars, empty_q = bars + 8 * (1 + 4 * kStages);
  auto full_k = [&](int s) { return bars + 8 * (1 + s); };
  auto full_v = [&](int s) { return bars + 8 * (1 + kStages + s); };
  auto empty_k = [&](int s) { return bars + 8 * (1 + 2 * kStages + s); };
  auto empty_v = [&](int s) { return bars + 8 * (1 + 3 * kStages + s); };

  const int tid = threadIdx.x, lane = tid & 31, wg = tid / 128;
  /* The CTA's k-th tile: its grid position's one (k = 0), or with kPersistent wave k's of ts
   * (TileSched), t_end past the last; increasing in k. The producer and the consumers walk them
   * alike; the K / V stages' and Q's mbarrier phases run on across tiles, so the producer loads
   * the next tile while the consumers finish this one. */
  const int t_end = C::kPersistent ? ts.count : 1;
  auto nth_tile = [&](int k) {
    if constexpr (!C::kPersistent) return k;
    const int c = C::kSched == kSchedSnake && (k & 1) != 0 ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    return k * (int)gridDim.x + c;
  };
  int b, h, m0, n_lo, n_hi, f_lo, f_hi;
  Seq sq;
  Head hd;
  /* Sets the geometry of tile t; false when it has no rows (past a varlen sequence's end). */
  auto tile = [&](int t) {
    if constexpr (C::kPersistent) {
      const Tile90 w = tile_of(ts, t, kBM);
      b = w.b, h = w.h, m0 = w.m0;
    } else { /* the last query blocks first: under a causal band they see the most keys */
      b = blockIdx.z, h = blockIdx.y, m0 = (gridDim.x - 1 - blockIdx.x) * kBM;
    }
    sq = seq_of(p, b);
    if (m0 >= sq.len_q) return false;
    hd = head_of(p, sq, b, h);
  const int m_last = min(m0 + kBM, sq.len_q) - 1;
  key_block_range(p, hd, m0, m_last, kBN, n_lo, n_hi);
  full_block_range(p, hd, m0, m_last, kBN, n_lo, n_hi, f_lo, f_hi);
    return true;
  };

  if (tid == 0) {
    mbar_init(bar_q, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_k(s), 1), mbar_init(full_v(s), 1);
      mbar_init(empty_k(s), 4 * C::kCWG), mbar_init(empty_v(s), 4 * C::kCWG); /* one per consumer warp */
    }
    mbar_init(empty_q, 4 * C::kCWG);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) { /* producer */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::kProducerRegs));
    if (tid == 0) {
      int it = 0; /* key blocks loaded so far, over the tiles: the stage and its phase */
      for (int k = 0, t = nth_tile(0), j = 0; t < t_end; t = nth_tile(++k)) {
        if (!tile(t)) continue;
      const MapOrigin org = map_origin(p, sq, b);
      const int k_row0 = org.k_row0, mb = org.batch;
        /* Q of the j-th tile, once the consumers are done with the one before (after its last S:
         * its last P V and its epilogue still run) */
        auto load_q = [&]() {
          if (j > 0) mbar_wait(empty_q, (j - 1) & 1);
          mbar_expect_tx(bar_q, C::kQBytes);
      for (int c = 0; c < C::kPanels; ++c) tma_load(sQ + c * kBM * 128, &tq, bar_q, c * 64, h, org.q_row0 + m0, mb);
        };
        if (n_lo >= n_hi) load_q();
        for (int i = 0, n = n_lo; n < n_hi; ++i, ++n, ++it) {
          const int s = it % kStages;
          const uint32_t ph = (it / kStages) & 1;
        mbar_wait(empty_k(s), ph ^ 1);
        mbar_expect_tx(full_k(s), C::kKVBytes);
        for (int c = 0; c < C::kPanels; ++c)
          tma_load(sK + s * C::kKVBytes + c * kBN * 128, &tk, full_k(s), c * 64, hd.g, k_row0 + n * kBN, mb);
          if (i == 0) load_q(); /* after the first K, whose buffer is freed a block earlier than Q */
        mbar_wait(empty_v(s), ph ^ 1);
        mbar_expect_tx(full_v(s), C::kKVBytes);
        for (int c = 0; c < C::kPanels; ++c)
          tma_load(sV + s * C::kKVBytes + c * kBN * 128, &tv, full_v(s), c * 64, hd.g, k_row0 + n * kBN, mb);
      }
        ++j;
      }
    }
  } else { /* consumers: 64 rows each, 16 per warp */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::kConsumerRegs));
    const int cw = wg - 1, wq = (tid >> 5) & 3;
    const int row0 = cw * 64 + wq * 16 + (lane >> 2); /* this thread's rows: row0 and row0 + 8 */
    /* the plain kernel keeps raw dot products and folds the scale into the exponent's FMA (so does
     * the cap / ALiBi kernel without a cap: ALiBi's term is added in dot-product units); the
     * capped and the generic logits are already scaled log2 units, but for kCapTanhScaled's
     * tanh(y), whose factor SoftCap::out (cap log2(e)) the exponent's FMA takes */
    const bool capped = kMode == kModeCapAlibi && p.softcap > 0.f;
    const bool logits_log2 = kMode == kModeGeneric || capped;
    const float mult = capped && C::kCap == kCapTanhScaled ? SoftCap(p).out : logits_log2 ? 1.f : p.scale * kLog2e;
    int it = 0; /* key blocks consumed so far, over the tiles: the stage and its phase */
    for (int k = 0, t = nth_tile(0), j = 0; t < t_end; t = nth_tile(++k)) {
      if (!tile(t)) continue;

    float o[1][kD / 8][4]; /* wgmma's accumulator layout is store_rows' [m-tile][8 columns][4] */
    float(&oacc)[kD / 2] = reinterpret_cast<float(&)[kD / 2]>(o);
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) oacc[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
    /* Steps 4-5: the sinks are the rows' first logits, counted once: every thread of a quad starts
     * from their max, only the first adds their sum (the quad's sums are added at the end). */
    if (p.num_sinks > 0) {
      float mx, sum;
      sink_stats(p, h, mx, sum);
      row_max[0] = row_max[1] = mx;
      row_sum[0] = row_sum[1] = (lane & 3) == 0 ? sum : 0.f;
    }
    float sacc[kBN / 2];
    uint32_t pa[kBN / 16][4];

    /* S = Q K(s)^T into sacc (issued, not waited for) */
    auto issue_s = [&](int s) {
      const uint32_t q = sQ + cw * 64 * 128, k = sK + s * C::kKVBytes;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) { /* 16 columns: panel kk / 4, 32 bytes into its rows */
        const uint32_t col = (kk % 4) * 32;
        Wgmma<T, kBN>::ss(sacc, smem_desc(q + (kk / 4) * kBM * 128 + col, 16, 1024),
                          smem_desc(k + (kk / 4) * kBN * 128 + col, 16, 1024), kk > 0);
      }
    };
    /* O += P V(s), P from pa (issued, not waited for) */
    auto issue_pv = [&](int s) {
      const uint32_t v = sV + s * C::kKVBytes;
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) Wgmma<T, kD>::rs(oacc, pa[kk], smem_desc(v + kk * 16 * 128, kBN * 128, 1024), 1);
    };
    /* Steps 1-3 of the generic kernel on key block n: S becomes log2-unit logits, -inf where not
     * visible, by the sm_80 kernel's per-element function. */
    auto logits = [&](int n) {
      const int i0 = m0 + row0, j0 = n * kBN + (lane & 3) * 2;
#pragma unroll
      for (int jj = 0; jj < kBN / 8; ++jj)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = i0 + (e >> 1) * 8, j = j0 + jj * 8 + (e & 1);
          float &x = sacc[4 * jj + e], t;
          x = visible(p, hd, i, j) ? logit(p, hd, i, j, x, &t) * kLog2e : -INFINITY;
        }
    };
    /* Steps 1-2 of the cap / ALiBi kernel on key block n, every score alike (the band's edges are
     * masked after): ALiBi's -slope |i + o - j| in dot-product units (divided by the scale, which
     * fwd90_mode makes positive), |i + o - j| being this row's i + o - j0 less a constant of the
     * element (exact in f32 below 2^24); then the soft cap, which yields log2-unit logits. */
    const bool has_alibi = kMode == kModeCapAlibi && p.alibi != nullptr;
    const float alibi_step = has_alibi ? -p.alibi[b * p.alibi_b + h * p.alibi_h] / p.scale : 0.f;
    auto add_alibi = [&](int n) {
      if (has_alibi) {
        const float d0 = (float)(m0 + row0 + hd.o - n * kBN - (lane & 3) * 2);
#pragma unroll
        for (int jj = 0; jj < kBN / 8; ++jj)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            sacc[4 * jj + e] =
                fmaf(alibi_step, fabsf(d0 + (float)((e >> 1) * 8 - jj * 8 - (e & 1))), sacc[4 * jj + e]);
      }
    };
    auto cap_alibi = [&](int n) {
      add_alibi(n);
      if (p.softcap > 0.f) {
        const SoftCap cap(p);
#pragma unroll
        for (int k = 0; k < kBN / 2; ++k)
          sacc[k] = C::kCap == kCapTanhScaled ? tanh_sfu(sacc[k] * cap.in) /* mult = cap.out */
                    : C::kCap == kCapTanh       ? tanh_sfu(sacc[k] * cap.in) * cap.out
                    : C::kCap == kCapRcpFma     ? cap_logit2_fma(cap, sacc[k])
                                                : cap.logit2(sacc[k]);
      }
    };
    /* kMaskRange: this thread's rows (hf) see the keys [key_lo, key_lo + key_n) past its first
     * column of block 0, (lane & 3) * 2 (so that a score's offset from it is a constant) */
    int key_lo[2] = {0, 0}, key_n[2] = {0, 0};
    if constexpr (C::kMaskRange)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        int lo, hi;
        visible_band_keys(p, hd, m0 + row0 + 8 * hf, lo, hi);
        key_lo[hf] = lo - (lane & 3) * 2, key_n[hf] = hi - lo;
      }
    auto mask_edge = [&](int n, float masked) { /* S outside the band and the key length := masked */
#pragma unroll
      for (int jj = 0; jj < kBN / 8; ++jj)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int hf = e >> 1;
          bool hidden;
          if constexpr (C::kMaskRange) /* the key less (lane & 3) * 2, against the range */
            hidden = (unsigned)(n * kBN + jj * 8 + (e & 1) - key_lo[hf]) >= (unsigned)key_n[hf];
          else
            hidden = !visible_band(p, hd, m0 + row0 + hf * 8, n * kBN + jj * 8 + (lane & 3) * 2 + (e & 1));
          sacc[4 * jj + e] = hidden ? masked : sacc[4 * jj + e];
        }
    };
    /* The soft cap folded into the softmax (kCapFused), on key block n: with z = dot * zk (zk =
     * -2 log2(e) scale / cap, held to +-FLT_MAX) and u = 2^z = e^(-2y), tanh(y) = 2 / (1 + u) - 1
     * and the logit in log2 units is out (2 r - 1), r = 1 / (1 + u), out = cap log2(e). It falls as
     * z grows, so the row's largest logit is that of its smallest z, computed once a row, and each
     * P is ex2(r 2 out - (out + max)): one FMUL, FMNMX, FADD and FFMA and three special-function
     * ops (ex2, rcp, ex2) a score, no sign to restore (u overflows to inf and r to 0 for very
     * negative y, which is the limit). Within cap * 2.6e-7 of tanh with ex2 and rcp exact
     * (simulated in f32), u's 2^-22 and r's 2^-23 on top: logit2's error. Masked scores get
     * z = NaN, which the row's minimum passes over (z = +inf is a visible score's limit, -out),
     * then P = 0, on the band's edge blocks only. The same rescale factors and log2-unit maxima
     * as softmax. */
    auto cap_softmax = [&](int n, float (&corr)[2]) {
      add_alibi(n);
      const SoftCap cap(p);
      const float zk = copysignf(fminf(2.f * kLog2e * fabsf(cap.in), 3.40282347e38f), -cap.in);
      const float out2 = 2.f * cap.out;
#pragma unroll
      for (int k = 0; k < kBN / 2; ++k) sacc[k] *= zk;
      const bool edge = n < f_lo || n >= f_hi;
      if (edge) mask_edge(n, NAN);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float zmin = NAN; /* fminf and fmaxf pass NaN over: it stays NaN only if nothing is visible */
#pragma unroll
        for (int jj = 0; jj < kBN / 8; ++jj)
          zmin = fminf(zmin, fminf(sacc[4 * jj + 2 * hf], sacc[4 * jj + 2 * hf + 1]));
        zmin = -quad_max(-zmin);
        /* a row with nothing visible yet keeps max -inf */
        const float mx = fmaxf(row_max[hf], zmin != zmin ? -INFINITY : fmaf(rcp(1.f + ex2(zmin)), out2, -cap.out));
        const float base = mx == -INFINITY ? 0.f : mx;
        corr[hf] = ex2(row_max[hf] - base);
        row_max[hf] = mx;
        const float c = -(cap.out + base);
#pragma unroll
        for (int jj = 0; jj < kBN / 8; ++jj)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float &x = sacc[4 * jj + 2 * hf + e];
            const float a = fmaf(rcp(1.f + ex2(x)), out2, c);
            x = C::on_fma(C::kExpFmaEvery, jj) ? ex2_fma(a) : ex2(a);
          }
      }
      if (edge) mask_edge(n, 0.f);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float sum = 0.f;
#pragma unroll
        for (int jj = 0; jj < kBN / 8; ++jj) sum += sacc[4 * jj + 2 * hf] + sacc[4 * jj + 2 * hf + 1];
        row_sum[hf] = row_sum[hf] * corr[hf] + sum;
      }
    };
    /* Masks S of key block n outside the band and the key length (the feature kernel: steps 1-3),
     * then moves the running max and sum to it: P = exp2(S * mult - max) stays in sacc; returns
     * each row's rescale factor. */
    auto softmax = [&](int n, float (&corr)[2]) {
      if constexpr (kMode == kModeGeneric) {
        logits(n);
      } else {
        if constexpr (kMode == kModeCapAlibi) {
          if (C::kCap == kCapFused && p.softcap > 0.f) return cap_softmax(n, corr);
          cap_alibi(n);
        }
        if (n < f_lo || n >= f_hi) mask_edge(n, -INFINITY);
      }
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = -INFINITY;
#pragma unroll
        for (int jj = 0; jj < kBN / 8; ++jj) mx = fmaxf(mx, fmaxf(sacc[4 * jj + 2 * hf], sacc[4 * jj + 2 * hf + 1]));
        mx = fmaxf(row_max[hf], quad_max(mx) * mult);
        /* a row with nothing visible yet keeps max -inf and gets exponents of 0 */
        const float base = mx == -INFINITY ? 0.f : mx;
        corr[hf] = ex2(row_max[hf] - base);
        row_max[hf] = mx;
        float sum = 0.f;
#pragma unroll
        for (int jj = 0; jj < kBN / 8; ++jj)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float &x = sacc[4 * jj + 2 * hf + e];
            x = C::on_fma(C::kExpFmaEvery, jj) ? ex2_fma(fmaf(x, mult, -base)) : ex2(fmaf(x, mult, -base));
            sum += x;
          }
        row_sum[hf] = row_sum[hf] * corr[hf] + sum;
      }
    };
    auto rescale = [&](const float (&corr)[2]) {
#pragma unroll
      for (int jj = 0; jj < kD / 8; ++jj)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[0][jj][e] *= corr[e >> 1];
    };
    auto to_pa = [&]() {
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) pa[kk][r] = Elem<T>::pack(sacc[8 * kk + 2 * r], sacc[8 * kk + 2 * r + 1]);
    };
    /* Varlen: V rows past the sequence's last key (clear_tail_rows says why) are zeroed in the
     * partial block (only ever the last, n_hi - 1) before P V reads them, then a named barrier of
     * the consumer warpgroups. */
    auto clear_v_tail = [&](int s, int n) {
      const int valid = sq.len_k - n * kBN;
      if (p.varlen == ATTN_CUDA_VARLEN_NONE || valid >= kBN) return;
      clear_tail_rows<C::kPanels, kBN, 128 * C::kCWG>(sV + s * C::kKVBytes, valid, tid - 128);
      asm volatile("bar.sync 1, %0;\n" ::"n"(128 * C::kCWG) : "memory");
    };
    auto release = [&](uint32_t bar) {
      if (lane == 0) mbar_arrive(bar);
    };
    /* kPingPong's turns: warpgroup cw issues its products after bar.sync on named barrier 2 + cw,
     * which completes when the warpgroup before it has arrived there (bar.arrive) after issuing
     * its own. Every warpgroup of a CTA takes n_hi - n_lo turns; the last one's first arrival is
     * made in advance (pass_turn_ahead) and its final one left out, so no barrier is left
     * half-arrived at exit. */
    auto take_turn = [&]() {
      if constexpr (C::kPingPong) asm volatile("bar.sync %0, 256;\n" ::"r"(2 + cw) : "memory");
    };
    auto pass_turn = [&](bool last) {
      if constexpr (C::kPingPong)
        if (!(last && cw == C::kCWG - 1))
          asm volatile("bar.arrive %0, 256;\n" ::"r"(2 + (cw + 1) % C::kCWG) : "memory");
    };
    auto pass_turn_ahead = [&]() {
      if constexpr (C::kPingPong)
        if (cw == C::kCWG - 1) asm volatile("bar.arrive 2, 256;\n" ::: "memory");
    };

      mbar_wait(bar_q, j & 1);
    float corr[2];
    if constexpr (!C::kOverlap) {
      for (int i = 0, n = n_lo; n < n_hi; ++i, ++n) {
          const int s = (it + i) % kStages;
          const uint32_t ph = ((it + i) / kStages) & 1;
        mbar_wait(full_k(s), ph);
        wgmma_fence();
        issue_s(s);
        wgmma_commit();
        wgmma_wait<0>();
        pin(sacc);
        release(empty_k(s));
        softmax(n, corr);
        rescale(corr);
        to_pa();
        mbar_wait(full_v(s), ph);
        clear_v_tail(s, n);
        pin(oacc); /* the rescale and P are written before the fence */
        pin(pa);
        wgmma_fence();
        issue_pv(s);
        wgmma_commit();
        wgmma_wait<0>();
        pin(oacc);
        pin(pa);
        release(empty_v(s));
      }
        release(empty_q);
    } else if (n_lo < n_hi) {
      pass_turn_ahead();
        const int s0 = it % kStages;
        mbar_wait(full_k(s0), (it / kStages) & 1);
      take_turn();
      wgmma_fence();
        issue_s(s0);
      wgmma_commit();
      pass_turn(n_lo + 1 == n_hi);
      wgmma_wait<0>();
      pin(sacc);
        release(empty_k(s0));
      softmax(n_lo, corr); /* O is 0: nothing to rescale */
      to_pa();
      int i = 1;
      for (int n = n_lo + 1; n < n_hi; ++i, ++n) {
          const int s = (it + i) % kStages, sp = (it + i - 1) % kStages;
          const uint32_t ph = ((it + i) / kStages) & 1, php = ((it + i - 1) / kStages) & 1;
        mbar_wait(full_k(s), ph);
        mbar_wait(full_v(sp), php); /* block n - 1 < n_hi - 1 is whole: no clear_v_tail */
        pin(oacc);
        pin(pa);
        take_turn();
        wgmma_fence();
        issue_s(s);
        wgmma_commit();
        issue_pv(sp);
        wgmma_commit();
        pass_turn(n + 1 == n_hi);
        wgmma_wait<1>(); /* S(n) has landed; P(n-1) V(n-1) may still run */
        pin(sacc);
        release(empty_k(s));
        softmax(n, corr);
        wgmma_wait<0>();
        pin(oacc);
        pin(pa);
        release(empty_v(sp));
        rescale(corr);
        to_pa();
      }
        release(empty_q); /* the last S has landed: the producer may load the next tile's Q */
        const int sp = (it + i - 1) % kStages;
        mbar_wait(full_v(sp), ((it + i - 1) / kStages) & 1);
      clear_v_tail(sp, n_hi - 1);
      pin(oacc);
      pin(pa);
      wgmma_fence();
      issue_pv(sp);
      wgmma_commit();
      wgmma_wait<0>();
      pin(oacc);
      pin(pa);
      release(empty_v(sp));
      } else {
        release(empty_q);
    }

    /* out = O / Z, lse = max + log Z; a row with nothing visible (and no sinks) is out = 0,
     * lse = -inf */
    float inv[1][2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float sum = quad_sum(row_sum[hf]);
      const bool empty = row_max[hf] == -INFINITY;
      inv[0][hf] = empty ? 0.f : 1.f / sum;
      const int r = m0 + row0 + hf * 8;
      if (p.lse != nullptr && (lane & 3) == 0 && r < sq.len_q)
        p.lse[b * p.lse_b + h * p.lse_h + (sq.q0 + r) * p.lse_r] = empty ? -INFINITY : row_max[hf] * kLn2 + logf(sum);
    }
    const int wrow = m0 + cw * 64 + wq * 16;
    T *go = static_cast<T *>(p.out) + b * p.o_b + (sq.q0 + wrow) * p.o_r + h * p.o_h;
    store_rows<T, 1, kD / 8, false>(go, p.o_r, o, inv, lane, sq.len_q - wrow, kD);
      it += max(n_hi - n_lo, 0), ++j;
    }
  }
}

/* ---- host side --------------------------------------------------------------------------------- */

/* The driver's cuTensorMapEncodeTiled through the runtime, so nothing links libcuda; NULL when the
 * driver has none. */
static inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr; /* a benign race: every writer stores the same */
  if (fn == nullptr) {
    void *f = nullptr;
    cudaDriverEntryPointQueryResult found;
#if CUDART_VERSION >= 12050
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found);
#else
    cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &found);
#endif
    if (e == cudaSuccess && found == cudaDriverEntryPointSuccess) fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }
  return fn;
}

/* The per-element functions of SPEC.md the feature kernel computes (ATTN_CUDA_FEAT_* bits): a
 * problem with another is refused. Each bit is that feature's switch. */
constexpr int32_t kElementwiseKinds = ATTN_CUDA_FEAT_SOFTCAP | ATTN_CUDA_FEAT_ALIBI | ATTN_CUDA_FEAT_BIAS |
                                      ATTN_CUDA_FEAT_MASK | ATTN_CUDA_FEAT_SEGMENTS;

/* Whether p needs the generic kernel (every per-element function, visible() and logit() on every
 * block): a bias, a mask or segment ids, a cap above SoftCap::kMaxCap (where the one-exponential
 * tanh's error, cap * 1.2e-7, would pass tanhf's), or ALiBi under a scale that is not positive
 * (the cap / ALiBi kernel divides its term by the scale). Reads what problem_params sets before
 * the tensors (sm90_fwd_unsupported's rule), so the offer and the launch agree. */
static inline bool generic_kernel(const attn_cuda_params &p) {
  return (p.elementwise_kinds & ~(ATTN_CUDA_FEAT_SOFTCAP | ATTN_CUDA_FEAT_ALIBI)) != 0 || p.softcap > SoftCap::kMaxCap ||
         ((p.elementwise_kinds & ATTN_CUDA_FEAT_ALIBI) != 0 && !(p.scale > 0.f));
}

/* Why the library leaves the generic kernel out at head dims 64 and 128 (sm90_launch.cu): its
 * per-element function on every block ran at 0.46-0.68x of the sm80 kernel's speed there (H100,
 * bf16, T = 8192, a bias; 1.6-1.8x at D = 256), and ALiBi, which took it, at 0.03-0.06x of the
 * plain kernel's (now the cap / ALiBi kernel's). */
constexpr const char *kGenericDeclined =
    "the sm90 forward's generic kernel (bias, masks, segment ids, caps above 1024) is slower than the sm80 kernel at "
    "head dims 64 and 128";

/* Why the kernel cannot run p (a sentence), or NULL when it can: the copy engine needs 16-byte
 * aligned bases and strides, and the kernel lacks dropout and some features. Reads only what
 * cuda.c's problem_params sets before the tensors, plus the tensors' addresses and strides. */
static inline const char *sm90_fwd_unsupported(const attn_cuda_params &p) {
  if (p.d != p.dv) return "the sm90 forward needs Dv = D";
  if (p.d != 64 && p.d != 128 && p.d != 256) return "the sm90 forward has head dims 64, 128 and 256 only";
  if ((p.elementwise_kinds & ~kElementwiseKinds) != 0) return "the sm90 forward lacks a per-element function";
  if (p.dropout_p > 0.f) return "the sm90 forward has no dropout";
  const void *ptrs[3] = {p.q, p.k, p.v};
  for (const void *ptr : ptrs)
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return "the sm90 forward needs 16-byte aligned q, k, v";
  const int64_t strides[9] = {p.q_b, p.q_r, p.q_h, p.k_b, p.k_r, p.k_h, p.v_b, p.v_r, p.v_h};
  for (int64_t s : strides)
    if (s % 8 != 0 || s < 0) return "the sm90 forward needs q, k, v strides that are multiples of 8 elements";
  return nullptr;
}

/* The batch and rows of the token tensors' maps: packed varlen maps all the rows as one batch (at
 * least one row: the encoder takes no empty dimension, and an empty tensor is never read, its
 * sequences having no rows); map_origin finds a sequence in them. */
struct MapGeometry {
  int batch, rows_q, rows_k;
};
static inline MapGeometry map_geometry(const attn_cuda_params &p) {
  if (p.varlen == ATTN_CUDA_VARLEN_PACKED)
    return {1, (int)std::max<int64_t>(p.total_q, 1), (int)std::max<int64_t>(p.total_k, 1)};
  return {p.batch, p.seqlen_q, p.seqlen_k};
}

/* A 4-d map [dim3][dim2][dim1][dim0] of elem_bytes-byte elements (strides s1..s3 in elements),
 * boxes of 128 bytes of dim0 x 1 x box_rows of dim2 x 1, swizzled by 128 bytes. A dimension of
 * size 1 gets a stride that is never used. The token tensors' maps (make_token_map) and the fp8
 * forward's transposed V (sm90_fwd_fp8.cuh). */
static inline attn_status make_map(CUtensorMap *map, const void *base, CUtensorMapDataType type, int elem_bytes,
                                   int dim0, int dim1, int dim2, int dim3, int64_t s1, int64_t s2, int64_t s3,
                                   int box_rows, char *why, size_t why_size) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) {
    snprintf(why, why_size, "the driver has no cuTensorMapEncodeTiled (the sm90 forward needs CUDA 12)");
    return ATTN_STATUS_UNSUPPORTED;
  }
  const cuuint64_t dims[4] = {(cuuint64_t)dim0, (cuuint64_t)dim1, (cuuint64_t)dim2, (cuuint64_t)dim3};
  const cuuint64_t strides[3] = {(cuuint64_t)(dim1 > 1 ? s1 * elem_bytes : 16),
                                 (cuuint64_t)(dim2 > 1 ? s2 * elem_bytes : 16),
                                 (cuuint64_t)(dim3 > 1 ? s3 * elem_bytes : 16)};
  const cuuint32_t box[4] = {(cuuint32_t)(128 / elem_bytes), 1, (cuuint32_t)box_rows, 1}, unit[4] = {1, 1, 1, 1};
  CUresult r = encode(map, type, 4, const_cast<void *>(base), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    snprintf(why, why_size, "cuTensorMapEncodeTiled failed (CUresult %d) for a [%d, %d, %d, %d] tensor", (int)r, dim3,
             dim2, dim1, dim0);
    return ATTN_STATUS_UNSUPPORTED;
  }
  return ATTN_STATUS_OK;
}

/* A 4-d map [batch][rows][heads][d] of a 16-bit token tensor, boxes of 64 columns x box_rows rows
 * of one head. */
static inline attn_status make_token_map(CUtensorMap *map, const void *base, bool is_bf16, int d, int heads,
                                         int rows, int batch, int64_t sh, int64_t sr, int64_t sb, int box_rows,
                                         char *why, size_t why_size) {
  return make_map(map, base, is_bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, d, heads,
                  rows, batch, sh, sr, sb, box_rows, why, why_size);
}

/* The kernel p runs on: the plain one without per-element functions, the generic one where
 * generic_kernel says, the cap / ALiBi one otherwise. */
static inline Fwd90Mode fwd90_mode(const attn_cuda_params &p) {
  if (!p.elementwise) return kModePlain;
  return generic_kernel(p) ? kModeGeneric : kModeCapAlibi;
}

/* Runs p on fwd90_kernel<C, kMode> (kMode must be fwd90_mode(p)). */
template <typename C, int kMode>
attn_status launch_fwd90(const attn_cuda_params &p, cudaStream_t stream, char *why, size_t why_size) {
  const char *no = sm90_fwd_unsupported(p);
  if (no == nullptr && p.d != C::kD) no = "the sm90 forward was asked for another head dim";
  if (no == nullptr && kMode != fwd90_mode(p)) no = "the sm90 forward was asked for the wrong kernel";
  if (no != nullptr) {
    snprintf(why, why_size, "%s", no);
    return ATTN_STATUS_UNSUPPORTED;
  }
  constexpr bool kBf16 = std::is_same<typename C::T, __nv_bfloat16>::value;
  const MapGeometry mg = map_geometry(p);
  CUtensorMap tq, tk, tv;
  attn_status st;
  if ((st = make_token_map(&tq, p.q, kBf16, p.d, p.heads_q, mg.rows_q, mg.batch, p.q_h, p.q_r, p.q_b, C::kBM, why,
                           why_size)) != ATTN_STATUS_OK ||
      (st = make_token_map(&tk, p.k, kBf16, p.d, p.heads_kv, mg.rows_k, mg.batch, p.k_h, p.k_r, p.k_b, C::kBN, why,
                           why_size)) != ATTN_STATUS_OK ||
      (st = make_token_map(&tv, p.v, kBf16, p.dv, p.heads_kv, mg.rows_k, mg.batch, p.v_h, p.v_r, p.v_b, C::kBN, why,
                           why_size)) != ATTN_STATUS_OK)
    return st;
  auto kernel = fwd90_kernel<C, kMode>;
  ATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::kSmem));
  const int m_blocks = (p.seqlen_q + C::kBM - 1) / C::kBM;
  dim3 grid(m_blocks, p.heads_q, p.batch);
  Tiles90 ts{m_blocks * p.heads_q * p.batch, m_blocks, p.heads_q, 1};
  if constexpr (C::kPersistent) {
    /* one CTA per SM (kConsumerRegs claims the register file), each looping over its tiles */
    int dev, sms, l2;
    ATTN_CUDA_CHECK(cudaGetDevice(&dev));
    ATTN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    ATTN_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    /* the K and V bytes of one query head (a KV head's over the group), for tile_of's sections */
    const int64_t kv_bytes = std::max<int64_t>((int64_t)p.seqlen_k * p.d * 2 * 2 / std::max(p.group, 1), 1);
    ts.section = (int)std::max<int64_t>(1, std::min<int64_t>((int64_t)p.heads_q * p.batch, l2 / 2 / kv_bytes));
    if (C::kSched == kSchedSnake && p.window_right >= 0) ts.section = p.heads_q * p.batch;
    grid = dim3(std::max(1, std::min(ts.count, sms)));
  }
  kernel<<<grid, C::kThreads, C::kSmem, stream>>>(p, tq, tk, tv, ts);
  ATTN_CUDA_CHECK(cudaGetLastError());
  return ATTN_STATUS_OK;
}

/* Runs p on the kernel of its mode: configuration C for the plain kernel, A (default C) for the
 * cap / ALiBi one, G for the generic one (whose per-element function needs more registers at some
 * head dims; void: not built, such problems refused with kGenericDeclined). */
template <typename C, typename G, typename A = C>
attn_status launch_fwd90_any(const attn_cuda_params &p, cudaStream_t stream, char *why, size_t why_size) {
  switch (fwd90_mode(p)) {
  case kModePlain: return launch_fwd90<C, kModePlain>(p, stream, why, why_size);
  case kModeCapAlibi: return launch_fwd90<A, kModeCapAlibi>(p, stream, why, why_size);
  default:
    if constexpr (std::is_void<G>::value) {
      const char *no = sm90_fwd_unsupported(p);
      snprintf(why, why_size, "%s", no != nullptr ? no : kGenericDeclined);
      return ATTN_STATUS_UNSUPPORTED;
    } else {
      return launch_fwd90<G, kModeGeneric>(p, stream, why, why_size);
    }
  }
}

} // namespace sm90
} // namespace attn_cuda

#endif /* ATTN_IMPL_CUDA_SM90_SM90_FWD_CUH */
