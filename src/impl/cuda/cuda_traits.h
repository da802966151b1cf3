/*
 * src/impl/cuda/cuda_traits.h - compile-time tile shapes per head dimension (FlashAttention's kernel
 * traits). One place to read and change them; each choice says why.
 *
 * Forward: kNW warps of 16 * kMT query rows each (kBM = 16 * kMT * kNW rows per CTA), kBN keys per
 * step. Two m-tiles per warp halve the shared-memory reads of K and V per product (each B fragment
 * feeds two mma), which is what FlashAttention-2 does with 128 x 64 tiles and 4 warps up to D = 128;
 * above that the f32 output accumulator alone (16 * kMT * D / 32 per thread) would not fit in 255
 * registers, so D = 192, 256 take one m-tile.
 *
 * Backward, dK/dV kernel: kBN keys per CTA (16 per warp in the score phase), kBM query rows per
 * step; D > 128 splits the head dimension of the dK/dV accumulators over two warp groups (8 warps)
 * to stay under 255 registers. dQ kernel: 16 rows per warp, kBN keys per step.
 */
#ifndef ATTN_IMPL_CUDA_CUDA_TRAITS_H
#define ATTN_IMPL_CUDA_CUDA_TRAITS_H

#include <stddef.h>

namespace attn_cuda {

template <int kD> struct FwdTraits {
  static constexpr int kNW = kD <= 128 ? 8 : 4, kMT = 1, kBN = kD <= 128 ? 64 : 32;
};

template <int kD> struct BwdTraits {
  static constexpr int kNW = kD <= 128 ? 4 : 8, kBN = 64, kBM = 64; /* dK/dV kernel */
  static constexpr int kNWq = 4, kBNq = kD <= 128 ? 64 : 32;       /* dQ kernel (kBM = 64) */
};

/* The tile configurations the kernels are instantiated with; kSmem is each kernel's dynamic
 * shared memory in bytes. */
template <typename T, int kD_, int kNW_, int kMT_, int kBN_> struct FwdCfg {
  static constexpr int kD = kD_, kNW = kNW_, kMT = kMT_, kBN = kBN_;
  static constexpr int kBM = 16 * kMT * kNW, kThreads = 32 * kNW, kS = kD + 8;
  static constexpr size_t kSmem = (size_t)(kBM + 2 * kBN) * kS * sizeof(T);
};

template <typename T, int kD_, int kNW_, int kBN_> struct DqCfg {
  static constexpr int kD = kD_, kNW = kNW_, kBN = kBN_;
  static constexpr int kBM = 16 * kNW, kThreads = 32 * kNW, kS = kD + 8;
  static constexpr size_t kSmem = (size_t)(2 * kBM + 2 * kBN) * kS * sizeof(T);
};

template <typename T, int kD_, int kNW_, int kBN_, int kBM_> struct DkvCfg {
  static constexpr int kD = kD_, kNW = kNW_, kBN = kBN_, kBM = kBM_;
  static constexpr int kThreads = 32 * kNW, kS = kD + 8, kP = kBM + 8;
  static constexpr int kWN = kBN / 16;          /* warps along keys */
  static constexpr int kWO = kNW / kWN;         /* warps along queries (phase 1) or D (phase 2) */
  static constexpr int kQW = kBM / kWO, kDW = kD / kWO;
  static_assert(kNW % kWN == 0 && kBM % (16 * kWO) == 0 && kD % (16 * kWO) == 0, "tile split");
  static constexpr size_t kSmem = (size_t)(2 * kBN + 2 * kBM) * kS * sizeof(T) +
                                  (size_t)2 * kBN * kP * sizeof(T) + 2 * kBM * sizeof(float);
};

} // namespace attn_cuda

#endif /* ATTN_IMPL_CUDA_CUDA_TRAITS_H */
