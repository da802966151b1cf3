/*
 * src/impl/cuda/cuda_traits.h - compile-time tile shapes per head dimension (FlashAttention's kernel
 * traits). One place to read and change them; each choice says why.
 *
 * Forward: kNW warps of 16 * kMT query rows each (kBM = 16 * kMT * kNW rows per CTA), kBN keys per
 * step. Two shapes per head dim: FwdTraits for the kernel with every feature compiled in (one
 * m-tile per warp: two spilled 468 bytes at D = 128 and 4 KB at D = 256 there), FastFwdTraits for
 * the feature-free kernel that the common case runs (two m-tiles per warp up to D = 128, one on
 * 8 warps above).
 *
 * Backward, dK/dV kernel (DkvCfg): kBN keys per CTA, kBM query rows per step; 32 keys (two
 * m-tiles) per warp in both phases, the other warps split queries (phase 1) or the head dimension
 * (phase 2); kStages buffers of Q and dO. dQ kernel (DqCfg): 16 * kMT rows per warp, kBN keys per
 * step, K and V double-buffered.
 */
#ifndef ATTN_IMPL_CUDA_CUDA_TRAITS_H
#define ATTN_IMPL_CUDA_CUDA_TRAITS_H

#include <stddef.h>

namespace attn_cuda {

/* Forward warps, measured on an H100 (bf16, B*T = 16384, Hq*D = 2048, gpu/cuda_bench): D = 64 with
 * 4 warps (64-row CTAs, 165 registers, 3 CTAs per SM) runs 169 TFLOPS at T = 8192 against 136 with
 * 8 warps (128-row CTAs, 1 CTA per SM); at D = 128 both give 155-158 (248 registers: 8 warps per
 * SM either way), so D = 96, 128 keep 128-row CTAs, which read K and V half as often. */
template <int kD> struct FwdTraits {
  static constexpr int kNW = kD <= 64 || kD > 128 ? 4 : 8, kMT = 1, kBN = kD <= 128 ? 64 : 32;
};

/* The feature-free forward (no per-element function but the soft cap, no dropout or padded head
 * dim; see run_fwd), at FlashAttention-2's shapes: up to D = 128 two m-tiles per warp on 4 warps (128-row
 * CTAs), so each K and V fragment read from shared memory feeds two mma (one m-tile per warp made
 * the kernel shared-memory bound: 0.56 ldmatrix.x4 per mma), with 128 keys per step at D <= 64
 * and 64 above; past D = 128 one m-tile per warp on 8 warps (two would need 256 accumulator
 * registers). ptxas (sm_90): 246-255 registers, at most 44 bytes of loop-invariant spills.
 * dev/cuda/fwd_tiles.cu times the alternatives (H100, T = 8192, TFLOPS non-causal / causal):
 * D = 64: 128 keys 335 / 310, 64 keys 325 / 306, one m-tile 267 / 265; D = 128: 64 keys 372 /
 * 319, 32 keys 363 / 298, one m-tile on 8 warps 280 / 249; D = 256: 8 warps of 64 keys 300 /
 * 258, 8 warps of 32 keys 263 / 227, 4 warps of 32 keys 249 / 225. */
template <int kD> struct FastFwdTraits {
  static constexpr int kNW = kD <= 128 ? 4 : 8, kMT = kD <= 128 ? 2 : 1, kBN = kD <= 64 ? 128 : 64;
  static constexpr int kMinB = 1;
};

/* D = 256 under a causal or windowed band, FlashAttention-2's H100 shape: 64-row CTAs on 4 warps,
 * two per SM, so one CTA's prologue (the 32 KB Q tile) and epilogue overlap the other's products,
 * which pays when CTAs are short. dev/cuda/fwd_tiles.cu (H100, causal): T = 512 169 against 147
 * TFLOPS with one 8-warp CTA per SM, T = 8192 259 against 262; without a band the 8-warp shape
 * keeps T = 8192 (304 against 289) and ties at T = 512 (233 both). */
struct BandFwdTraits256 {
  static constexpr int kNW = 4, kMT = 1, kBN = 64, kMinB = 2;
};

/* dK/dV kernel: 64 keys on 4 warps (8 past D = 128) in the deterministic configuration; 128 keys
 * on 8 warps up to D = 128 in the atomic one, which halves the dQ atomics and the Q / dO reloads
 * per key (dev/cuda/bwd_tiles.cu, H100, D = 128, T = 8192: atomic 198 vs 178 TFLOPS; the
 * deterministic one, without atomics, prefers two CTAs of 64 keys per SM: 172 vs 163). */
template <int kD> struct BwdTraits {
  static constexpr int kNW = kD <= 128 ? 4 : 8, kBN = 64, kBM = 64;                 /* deterministic */
  static constexpr int kNWa = 8, kBNa = kD <= 128 ? 128 : 64;                      /* atomic */
  /* query rows per step of the atomic feature-free kernel: 128 at D <= 64 (FlashAttention-2's
   * shape; H100, T = 8192: 215 vs 193 TFLOPS with 64), 64 above (the accumulators of 128 rows
   * would not fit in registers) */
  static constexpr int kBMa = kD <= 64 ? 128 : 64;
  static constexpr int kNWq = 4, kBNq = kD <= 128 ? 64 : 32;       /* dQ kernel (kBM = 64) */
  /* the feature-free dQ kernel, like the forward: two m-tiles per warp up to D = 128 (each K and V
   * fragment feeds two mma), 64 keys per step at D <= 64 and 32 above */
  static constexpr int kMTqf = kD <= 128 ? 2 : 1, kBNqf = kD <= 64 ? 64 : 32;
};

/* The tile configurations the kernels are instantiated with; kSmem is each kernel's dynamic
 * shared memory in bytes. */
template <typename T, int kD_, int kNW_, int kMT_, int kBN_, int kMinB_ = 1> struct FwdCfg {
  static constexpr int kD = kD_, kNW = kNW_, kMT = kMT_, kBN = kBN_, kMinB = kMinB_;
  static constexpr int kBM = 16 * kMT * kNW, kThreads = 32 * kNW, kS = kD + 8;
  static constexpr size_t kSmem = (size_t)(kBM + 2 * kBN) * kS * sizeof(T);
};

template <typename T, int kD_, int kNW_, int kBN_, int kMT_ = 1> struct DqCfg {
  static constexpr int kD = kD_, kNW = kNW_, kBN = kBN_, kMT = kMT_;
  static constexpr int kBM = 16 * kMT * kNW, kThreads = 32 * kNW, kS = kD + 8;
  static constexpr size_t kSmem = (size_t)(2 * kBM + 4 * kBN) * kS * sizeof(T); /* K, V: 2 stages */
};

template <typename T, int kD_, int kNW_, int kBN_, int kBM_, int kKT1_ = 2, int kStages_ = 1>
struct DkvCfg {
  static constexpr int kD = kD_, kNW = kNW_, kBN = kBN_, kBM = kBM_, kStages = kStages_;
  static constexpr int kThreads = 32 * kNW, kS = kD + 8, kP = kBM + 8;
  /* phase 1 (S^T, dP^T): warps of 16 * kKT1 keys (kKT1 m-tiles) along keys, the rest along queries */
  static constexpr int kKT1 = kKT1_, kWN = kBN / (16 * kKT1), kWO = kNW / kWN, kQW = kBM / kWO;
  /* phase 2 (dV, dK): warps of 32 keys (two m-tiles) along keys, the rest along D */
  static constexpr int kWN2 = kBN / 32, kDW2 = kD / (kNW / kWN2);
  static_assert(kNW % kWN2 == 0 && kDW2 % 16 == 0, "phase 2 split");
  static_assert(kNW % kWN == 0 && kBM % (16 * kWO) == 0, "phase 1 split");
  static constexpr size_t kSmem = (size_t)(2 * kBN + 2 * kStages * kBM) * kS * sizeof(T) +
                                  (size_t)2 * kBN * kP * sizeof(T) + 4 * kBM * sizeof(float);
};

} // namespace attn_cuda

#endif /* ATTN_IMPL_CUDA_CUDA_TRAITS_H */
