/*
 * src/impl/cuda/sm90/sm90_fwd_fp8.cuh - the Hopper fp8 (e4m3) forward (sm_90a only; issue 13,
 * docs/FP8.md): the schedule of sm90_fwd.cuh's plain kernel (a producer warpgroup loading Q, K and
 * V tiles by TMA, two consumer warpgroups of 64 query rows running wgmma, S(n+1) issued with
 * P(n) V(n)) on e4m3 operands, m64nNk32 with f32 accumulators.
 *
 * What differs from the 16-bit kernel, and why:
 *
 * - V transposed once per call. wgmma takes 8-bit operands K-major only, and P V reduces over the
 *   keys, so V's tile must have the keys contiguous: a pre-pass (vt_kernel) writes V^T into the
 *   workspace, block by block as the kernel's tiles want it (VtLayout; [B][Hkv] regions of
 *   vt_head_bytes; packed varlen: one batch, each sequence at its own key offset vt_col0 with room
 *   to its next 384-key boundary), zeros past each sequence's keys, so the key blocks need no
 *   clearing (the 16-bit kernel's clear_v_tail). It reads and writes V once:
 *   37 us, 3% of the forward at B = 2, H = 16, T = 8192 on an H200 (bench/RESULTS.md). The
 *   alternative, FlashAttention-3's in-kernel transpose (LDSM.T / STSM in the producer warpgroup
 *   after each V tile lands), saves that pass at the price of a shared-memory round trip per tile
 *   inside the kernel and a barrier between the transpose and the consumers.
 * - P from registers, permuted by V^T instead of by shuffles. The f32 accumulator of S gives a
 *   thread keys 2q, 2q+1, 2q+8, 2q+9 of each 16 (q = lane % 4) on its rows; the 8-bit A fragment
 *   (mma.m16n8k32's) wants keys 4q..4q+3. Rather than permuting P's bytes across the quad, the
 *   pre-pass stores V^T's columns in the order P has them: column 4q + t of each 16 holds key
 *   2q + (t & 1) + 8 (t >> 1) (vt_key), so each register of the fragment is four of the thread's
 *   own values converted in place (cvt.rn.satfinite.e4m3x2), and the product sums the same terms.
 * - P at a 2^8 scale (docs/FP8.md): the exponent is x * mult - max + 8, so P lies in [0, 256] and
 *   values down to 2^-14 are normal e4m3 numbers; the row sum adds the same (unrounded) scaled
 *   values, so out = O / sum needs no correction and lse subtracts 8 ln 2.
 * - Descale: dq dk of the CTA's (batch, KV head) is folded into the scale of the exponent's FMA,
 *   dv into the final normalisation (out = dv O / sum), read once per CTA.
 * - out in bf16, f16 or f32 (the template's TO).
 *
 * Scope (fp8_fwd_unsupported): head dims 128 and 256 with Dv = D (a 64-byte row would need the
 * 64-byte swizzle), the causal / window band in either alignment, GQA / MQA, sinks, packed and
 * padded varlen, lse; no per-element function (bias, masks, segment ids, soft cap, ALiBi) and no
 * dropout.
 */
#ifndef ATTN_IMPL_CUDA_SM90_SM90_FWD_FP8_CUH
#define ATTN_IMPL_CUDA_SM90_SM90_FWD_FP8_CUH

#include <cuda_fp8.h>

#include "impl/cuda/sm90/sm90_fwd.cuh"

namespace attn_cuda {
namespace sm90 {

/* The key (of its 16-key group) that column c of the group holds in V^T (see the header). */
__host__ __device__ __forceinline__ int vt_key(int c) {
  return 2 * (c >> 2) + (c & 1) + 8 * ((c >> 1) & 1);
}

/* Keys are padded to whole kVtBlock-key sections in V^T: a multiple of both key blocks (128 and
 * 192), so that every configuration reads whole blocks of one sequence and the workspace's size
 * does not depend on the configuration. */
constexpr int kVtBlock = 384;

/* The keys ("columns") of V^T: every sequence's keys rounded up to kVtBlock (dense and padded: the
 * longest, seqlen_k; packed: vt_col0's offsets), at least one section (the maps need a length). */
__host__ __device__ __forceinline__ int64_t vt_columns(const attn_cuda_params &p) {
  if (p.varlen == ATTN_CUDA_VARLEN_PACKED)
    return kVtBlock * (p.total_k / kVtBlock + 2 * (int64_t)p.batch + 1);
  const int64_t blocks = ((int64_t)p.seqlen_k + kVtBlock - 1) / kVtBlock;
  return kVtBlock * (blocks > 0 ? blocks : 1);
}

/* V^T's batches: one for packed varlen (the sequences side by side), B otherwise. */
__host__ __device__ __forceinline__ int vt_batches(const attn_cuda_params &p) {
  return p.varlen == ATTN_CUDA_VARLEN_PACKED ? 1 : p.batch;
}

/* The bytes of one (batch, KV head)'s V^T given vt_cols: room for VtLayout's blocks in every
 * layout, the largest being 192-key blocks with a padded half panel, 256 keys' room for 192. */
__host__ __device__ __forceinline__ int64_t vt_head_bytes(const attn_cuda_params &p) {
  return (int64_t)p.dv * (p.vt_cols / 3 * 4);
}

/* The workspace bytes V^T takes (cuda.c sizes the workspace through attn_cuda_sm90_fp8_workspace,
 * the same for every configuration). */
inline size_t vt_bytes(const attn_cuda_params &p) {
  attn_cuda_params q = p;
  q.vt_cols = vt_columns(p);
  return (size_t)vt_batches(p) * p.heads_kv * vt_head_bytes(q);
}

/* Where sequence b's first key lies in V^T's columns: packed, kVtBlock (k0 / kVtBlock + 2 b),
 * which leaves every sequence its keys rounded up to kVtBlock before the next one's (k0 grows by
 * at least the length, and 2 sections cover the roundings); 0 otherwise. */
__host__ __device__ __forceinline__ int64_t vt_col0(const attn_cuda_params &p, const Seq &sq,
                                                    int b) {
  return p.varlen == ATTN_CUDA_VARLEN_PACKED ? kVtBlock * (sq.k0 / kVtBlock + 2 * (int64_t)b) : 0;
}

/* The factor of q, k or v (descale_b / descale_g strides, 0 for one per tensor) of (b, g); 1 when
 * the problem has none. */
__device__ __forceinline__ float descale_of(const float *f, int64_t sb, int64_t sg, int b, int g) {
  return f == nullptr ? 1.f : f[b * sb + g * sg];
}

/* V^T's blocks: kBN keys, Dv rows, stored as the kernel's V^T tile in shared memory wants them,
 * in rows of 128 bytes (the 128-byte swizzle's row; one TMA box a block): each 128 keys of the
 * block a panel [Dv][128 keys]; a 192-key block's last 64 keys a half panel padded to a whole
 * one (Dv rows, 64 bytes of each unused), so that every P V step is one whole-O product (N = Dv)
 * for a third more V^T read. A packed half panel (Dv / 2 rows, each holding two rows of V^T)
 * needs each step split over O's halves, which measured no faster (lab v5, bench/RESULTS.md). */
template <int kDv, int kBN> struct VtLayout {
  static_assert(kBN % 128 == 0 || kBN % 128 == 64, "key blocks of whole and half panels");
  static constexpr int kKeyPanels = (kBN + 127) / 128; /* a half panel counts whole */
  static constexpr int kRows = kKeyPanels * kDv;       /* 128-byte rows a block */
  /* The first row (of the map's 128-byte rows) of block n of a sequence whose keys start at V^T
   * column col0 (a multiple of kVtBlock: whole blocks). */
  __host__ __device__ static __forceinline__ int box_row(int64_t col0, int n) {
    return (int)((col0 / kBN + n) * kRows);
  }
  /* Where, in bytes from the block's tile, P V's product of keys 32 kk.. finds its first row (the
   * next at 128 bytes, 1024 each 8). */
  __host__ __device__ static __forceinline__ uint32_t pv_at(int kk) {
    return (kk / 4) * kDv * 128 + (kk % 4) * 32;
  }
  /* Where (row d, key j) of one (batch, KV head)'s V^T lies, in bytes from its first key (j of a
   * 16-key group never straddles a panel: a group is 16 contiguous bytes). */
  __host__ __device__ static __forceinline__ int64_t offset(int d, int64_t j) {
    const int jj = (int)(j % kBN);
    return j / kBN * kRows * 128 + ((int64_t)(jj / 128) * kDv + d) * 128 + jj % 128;
  }
};

/* V^T of one 64-key slice of a sequence's keys for one KV head: the slice's rows of V into shared
 * memory (zeros past the sequence's end), then each thread writes one 16-key group of one row of
 * V^T (at Layout::offset), in vt_key's order, a byte read from shared memory each (a warp:
 * neighbouring bytes). Grid: (key slices of seqlen_k rounded up to kVtBlock, Hkv, B). Measured
 * against a form reading 32-bit words and regrouping bytes by permutes, 32 columns a thread
 * (fewer shared loads, half the threads idle in the second phase), this one was faster: 37 us
 * under ncu at a locked 1.48 GHz against 42 us timed by events at full clocks
 * (dev/cuda/fwd_hopper_fp8.cu). */
template <int kDv, typename Layout>
__global__ void __launch_bounds__(256) vt_kernel(const __grid_constant__ attn_cuda_params p) {
  constexpr int kKeys = 64, kPitch = kDv + 16; /* 16 bytes of padding: rows start on other banks */
  __shared__ __align__(16) uint8_t tile[kKeys * kPitch];
  const int b = blockIdx.z, g = blockIdx.y, j0 = blockIdx.x * kKeys, tid = threadIdx.x;
  const Seq sq = seq_of(p, b);
  const int region = (sq.len_k + kVtBlock - 1) / kVtBlock * kVtBlock;
  if (j0 >= region) return;
  const uint8_t *v = static_cast<const uint8_t *>(p.v) + b * p.v_b + g * p.v_h;
  for (int c = tid; c < kKeys * kDv / 16; c += 256) {
    const int r = c / (kDv / 16), col = (c % (kDv / 16)) * 16, j = j0 + r;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (j < sq.len_k) x = *reinterpret_cast<const uint4 *>(v + (sq.k0 + j) * p.v_r + col);
    *reinterpret_cast<uint4 *>(tile + r * kPitch + col) = x;
  }
  __syncthreads();
  /* the sequence's first key starts a block (vt_col0 is a multiple of kVtBlock) */
  uint8_t *vt =
      static_cast<uint8_t *>(p.v_t) +
      ((int64_t)(p.varlen == ATTN_CUDA_VARLEN_PACKED ? 0 : b) * p.heads_kv + g) * vt_head_bytes(p);
  const int64_t k0 = vt_col0(p, sq, b) + j0;
  /* d fastest: a warp reads neighbouring bytes */
  for (int c = tid; c < kDv * (kKeys / 16); c += 256) {
    const int d = c % kDv, grp = c / kDv;
    uint32_t w[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      w[q] = 0;
#pragma unroll
      for (int t = 0; t < 4; ++t)
        w[q] |= (uint32_t)tile[(grp * 16 + vt_key(4 * q + t)) * kPitch + d] << (8 * t);
    }
    *reinterpret_cast<uint4 *>(vt + Layout::offset(d, k0 + grp * 16)) =
        make_uint4(w[0], w[1], w[2], w[3]);
  }
}

/* Two f32 values of out's row as TO (a pair of neighbouring columns). */
template <typename TO> __device__ __forceinline__ void store_pair(TO *dst, float a, float b) {
  if constexpr (std::is_same<TO, float>::value)
    *reinterpret_cast<float2 *>(dst) = make_float2(a, b);
  else
    *reinterpret_cast<uint32_t *>(dst) = Elem<TO>::pack(a, b);
}

/* Four f32 values as e4m3 bytes of a 32-bit register, a in the low byte (round to nearest, held
 * to +-448 as docs/FP8.md's encoder). */
__device__ __forceinline__ uint32_t pack_e4m3x4(float a, float b, float c, float d) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return lo | hi << 16;
}

/* Head dim kD (= Dv), kBN keys per block, two consumer warpgroups of 64 rows, kStages K/V buffers,
 * out in TO. kBN = 192 (D = 128 only; lab v6): FlashAttention-3's fp8 tiles are wider in N than
 * its 16-bit ones (128 x 192 at D = 128 with V column-major, as V^T is here), so that each softmax
 * step (the dependent chain no pipe hides, see the lab's ncu) has 1.5x the products behind it; S,
 * O and P take 96 + 64 + 24 of the 240 registers (at D = 256, 96 + 128 + 24 would not fit, nor
 * would V^T's block of 2 Dv rows in one TMA box).
 * kPingPong: the consumer warpgroups take turns to issue their products (sm90_fwd.cuh's
 * FwdCfg90). The softmax (dev/cuda/fwd_hopper_fp8.cu measured its forms): the row max and sum in
 * four independent chains (both rows at once, two partials each; lab v2); kLazyRescale, O
 * rescaled only when a row of the warp has a new max, a factor of 1 changing nothing (v3: 1.06x);
 * kExpFmaEvery = N > 0, one 8-key group in N exponentiated on the FMA pipe by ex2_fma (7.5e-5
 * relative, far below e4m3's 2^-4; v4: slower once the rescale is lazy, so 0 in the library). */
template <typename TO_, int kD_, int kStages_, bool kPingPong_ = false, bool kLazyRescale_ = true,
          int kExpFmaEvery_ = 0, int kBN_ = 128>
struct FwdFp8Cfg {
  using TO = TO_;
  static constexpr int kD = kD_, kBN = kBN_, kStages = kStages_, kCWG = 2,
                       kExpFmaEvery = kExpFmaEvery_;
  static constexpr bool kPingPong = kPingPong_, kLazyRescale = kLazyRescale_;
  /* whether 8-key group g takes its exponentials on the FMA pipe */
  __host__ __device__ static constexpr bool on_fma(int g) {
    return kExpFmaEvery > 0 && g % (kExpFmaEvery > 0 ? kExpFmaEvery : 1) == kExpFmaEvery - 1;
  }
  static constexpr int kBM = 64 * kCWG, kThreads = 128 * (kCWG + 1), kPanels = kD / 128;
  static constexpr int kProducerRegs = 24,
                       kConsumerRegs = (65536 / 128 - kProducerRegs) / kCWG / 8 * 8;
  using Vt = VtLayout<kD, kBN>;
  /* bytes: Q [kBM][kD], K [kBN][kD] and V^T's block (Vt), one byte an element */
  static constexpr uint32_t kQBytes = kBM * kD, kKBytes = kBN * kD, kVBytes = Vt::kRows * 128;
  static constexpr uint32_t kSmem =
      1024 + kQBytes + kStages * (kKBytes + kVBytes) + 8 * (1 + 4 * kStages);
  /* a V^T block is one TMA box (at most 256 rows) */
  static_assert(kD % 128 == 0 && kVtBlock % kBN == 0 && Vt::kRows <= 256, "tile shape");
};

template <typename C>
__global__ void __launch_bounds__(C::kThreads, 1)
    fwd90_fp8_kernel(const __grid_constant__ attn_cuda_params p,
                     const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                     const __grid_constant__ CUtensorMap tvt) {
  using TO = typename C::TO;
  constexpr int kD = C::kD, kBN = C::kBN, kBM = C::kBM, kStages = C::kStages;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t sQ = (smem_u32(smem_raw) + 1023) & ~1023u;
  const uint32_t sK = sQ + C::kQBytes, sV = sK + kStages * C::kKBytes,
                 bars = sV + kStages * C::kVBytes;
  const uint32_t bar_q = bars; /* then per stage K full, V full, K empty, V empty */
  auto full_k = [&](int s) { return bars + 8 * (1 + s); };
  auto full_v = [&](int s) { return bars + 8 * (1 + kStages + s); };
  auto empty_k = [&](int s) { return bars + 8 * (1 + 2 * kStages + s); };
  auto empty_v = [&](int s) { return bars + 8 * (1 + 3 * kStages + s); };

  const int tid = threadIdx.x, lane = tid & 31, wg = tid / 128;
  const int b = blockIdx.z, h = blockIdx.y, m0 = (gridDim.x - 1 - blockIdx.x) * kBM;
  const Seq sq = seq_of(p, b);
  if (m0 >= sq.len_q) return;
  const Head hd = head_of(p, sq, b, h);
  const int m_last = min(m0 + kBM, sq.len_q) - 1;
  int n_lo, n_hi, f_lo, f_hi;
  key_block_range(p, hd, m0, m_last, kBN, n_lo, n_hi);
  full_block_range(p, hd, m0, m_last, kBN, n_lo, n_hi, f_lo, f_hi);

  if (tid == 0) {
    mbar_init(bar_q, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_k(s), 1), mbar_init(full_v(s), 1);
      mbar_init(empty_k(s), 4 * C::kCWG), mbar_init(empty_v(s), 4 * C::kCWG);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) { /* producer */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::kProducerRegs));
    if (tid == 0) {
      mbar_expect_tx(bar_q, C::kQBytes);
      const MapOrigin org = map_origin(p, sq, b);
      const int k_row0 = org.k_row0, mb = org.batch, vt0 = (int)vt_col0(p, sq, b);
      for (int c = 0; c < C::kPanels; ++c)
        tma_load(sQ + c * kBM * 128, &tq, bar_q, c * 128, h, org.q_row0 + m0, mb);
      for (int i = 0, n = n_lo; n < n_hi; ++i, ++n) {
        const int s = i % kStages;
        const uint32_t ph = (i / kStages) & 1;
        mbar_wait(empty_k(s), ph ^ 1);
        mbar_expect_tx(full_k(s), C::kKBytes);
        for (int c = 0; c < C::kPanels; ++c)
          tma_load(sK + s * C::kKBytes + c * kBN * 128, &tk, full_k(s), c * 128, hd.g,
                   k_row0 + n * kBN, mb);
        mbar_wait(empty_v(s), ph ^ 1);
        mbar_expect_tx(full_v(s), C::kVBytes);
        /* V^T's block: Vt::kRows rows of 128 bytes (vt0 is a multiple of kBN) */
        tma_load(sV + s * C::kVBytes, &tvt, full_v(s), 0, hd.g, C::Vt::box_row(vt0, n), mb);
      }
    }
  } else { /* consumers: 64 rows each, 16 per warp */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::kConsumerRegs));
    const int cw = wg - 1, wq = (tid >> 5) & 3;
    const int row0 = cw * 64 + wq * 16 + (lane >> 2); /* this thread's rows: row0 and row0 + 8 */
    const float dqk = descale_of(p.q_descale, p.descale_b[0], p.descale_g[0], b, hd.g) *
                      descale_of(p.k_descale, p.descale_b[1], p.descale_g[1], b, hd.g);
    const float dvf = descale_of(p.v_descale, p.descale_b[2], p.descale_g[2], b, hd.g);
    /* Raw dot products times mult in the exponent's FMA, the row max taken before the product,
     * which needs mult > 0; otherwise (a factor <= 0 or NaN) S is multiplied first (rare_scale). */
    const float mult_all = p.scale * kLog2e * dqk;
    const bool rare_scale = !(mult_all > 0.f);
    const float mult = rare_scale ? 1.f : mult_all;

    float o[kD / 8][4];
    float(&oacc)[kD / 2] = reinterpret_cast<float(&)[kD / 2]>(o);
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) oacc[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
    if (p.num_sinks > 0) { /* the sinks' exponentials at P's 2^8 scale, like the keys' */
      float mx, sum;
      sink_stats(p, h, mx, sum);
      row_max[0] = row_max[1] = mx;
      row_sum[0] = row_sum[1] = (lane & 3) == 0 ? sum * 256.f : 0.f;
    }
    float sacc[kBN / 2];
    uint32_t pa[kBN / 32][4];

    /* S = Q K(s)^T: 32 columns (bytes) a step, 4 steps a panel */
    auto issue_s = [&](int s) {
      const uint32_t q = sQ + cw * 64 * 128, k = sK + s * C::kKBytes;
#pragma unroll
      for (int kk = 0; kk < kD / 32; ++kk) {
        const uint32_t col = (kk % 4) * 32;
        WgmmaE4m3<kBN>::ss(sacc, smem_desc(q + (kk / 4) * kBM * 128 + col, 16, 1024),
                           smem_desc(k + (kk / 4) * kBN * 128 + col, 16, 1024), kk > 0);
      }
    };
    /* O += P V(s): V^T's 128-byte rows are K-major, 32 keys a step (VtLayout::pv_at), each step
     * one product into all of O */
    auto issue_pv = [&](int s) {
      const uint32_t v = sV + s * C::kVBytes;
#pragma unroll
      for (int kk = 0; kk < kBN / 32; ++kk)
        WgmmaE4m3<kD>::rs(oacc, pa[kk], smem_desc(v + C::Vt::pv_at(kk), 16, 1024), 1);
    };
    /* S outside the band and the key length := -inf */
    auto mask_edge = [&](int n) {
      /* each row's visible keys as bounds relative to the thread's first column of the block, so
       * that an element's test is two compares with a constant (per-element visible_band kept
       * enough registers live to spill at 192-key blocks) */
      int lo[2], hi[2];
      const int j0 = n * kBN + (lane & 3) * 2;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        visible_band_keys(p, hd, m0 + row0 + hf * 8, lo[hf], hi[hf]);
        lo[hf] -= j0, hi[hf] -= j0;
      }
#pragma unroll
      for (int jj = 0; jj < kBN / 8; ++jj)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = jj * 8 + (e & 1);
          if (c < lo[e >> 1] || c >= hi[e >> 1]) sacc[4 * jj + e] = -INFINITY;
        }
    };
    /* P = 2^(S mult - max + 8) in sacc, the running max and sum moved to block n; returns each
     * row's rescale factor. */
    auto softmax = [&](int n, float(&corr)[2]) {
      if (rare_scale) {
#pragma unroll
        for (int k = 0; k < kBN / 2; ++k) sacc[k] *= mult_all;
      }
      if (n < f_lo || n >= f_hi) mask_edge(n);
      /* both rows at once, each in two partials: four independent chains */
      float m[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};
#pragma unroll
      for (int jj = 0; jj < kBN / 8; ++jj)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
          m[hf][jj & 1] =
              fmaxf(m[hf][jj & 1], fmaxf(sacc[4 * jj + 2 * hf], sacc[4 * jj + 2 * hf + 1]));
      float shift[2];
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const float mx = fmaxf(row_max[hf], quad_max(fmaxf(m[hf][0], m[hf][1])) * mult);
        const float base = mx == -INFINITY ? 0.f : mx;
        corr[hf] = ex2(row_max[hf] - base);
        row_max[hf] = mx;
        shift[hf] = 8.f - base;
      }
      float sum[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
      for (int jj = 0; jj < kBN / 8; ++jj)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float &x = sacc[4 * jj + e];
          const float a = fmaf(x, mult, shift[e >> 1]);
          x = C::on_fma(jj) ? ex2_fma(a) : ex2(a);
          sum[e >> 1][jj & 1] += x;
        }
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        row_sum[hf] = row_sum[hf] * corr[hf] + (sum[hf][0] + sum[hf][1]);
    };
    auto rescale = [&](const float(&corr)[2]) {
      if constexpr (C::kLazyRescale)
        if (!__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) return;
#pragma unroll
      for (int jj = 0; jj < kD / 8; ++jj)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[jj][e] *= corr[e >> 1];
    };
    /* The A fragment of keys 32 kk.. (see the header): register r holds row (r & 1) * 8 of the
     * thread's pair, 8-key groups 4 kk + 2 (r >> 1) and the next, two keys of each. */
    auto to_pa = [&]() {
#pragma unroll
      for (int kk = 0; kk < kBN / 32; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const float *s = sacc + 16 * kk + 8 * (r >> 1) + 2 * (r & 1);
          pa[kk][r] = pack_e4m3x4(s[0], s[1], s[4], s[5]);
        }
    };
    auto release = [&](uint32_t bar) {
      if (lane == 0) mbar_arrive(bar);
    };
    /* kPingPong's turns, as in fwd90_kernel: named barrier 2 + cw completes once the other
     * warpgroup has issued its products; the last one's first arrival is made in advance and its
     * final one left out. */
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

    mbar_wait(bar_q, 0);
    float corr[2];
    if (n_lo < n_hi) {
      pass_turn_ahead();
      mbar_wait(full_k(0), 0);
      take_turn();
      wgmma_fence();
      issue_s(0);
      wgmma_commit();
      pass_turn(n_lo + 1 == n_hi);
      wgmma_wait<0>();
      pin(sacc);
      release(empty_k(0));
      softmax(n_lo, corr); /* O is 0: nothing to rescale */
      to_pa();
      int i = 1;
      for (int n = n_lo + 1; n < n_hi; ++i, ++n) {
        const int s = i % kStages, sp = (i - 1) % kStages;
        const uint32_t ph = (i / kStages) & 1, php = ((i - 1) / kStages) & 1;
        mbar_wait(full_k(s), ph);
        mbar_wait(full_v(sp), php);
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
      const int sp = (i - 1) % kStages;
      mbar_wait(full_v(sp), ((i - 1) / kStages) & 1);
      pin(oacc);
      pin(pa);
      wgmma_fence();
      issue_pv(sp);
      wgmma_commit();
      wgmma_wait<0>();
      pin(oacc);
      pin(pa);
      release(empty_v(sp));
    }

    /* out = dv O / sum, lse = max + log(sum / 2^8); a row with nothing visible (and no sinks) is
     * out = 0, lse = -inf */
    float inv[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float sum = quad_sum(row_sum[hf]);
      const bool empty = row_max[hf] == -INFINITY;
      inv[hf] = empty ? 0.f : dvf / sum;
      const int r = m0 + row0 + hf * 8;
      if (p.lse != nullptr && (lane & 3) == 0 && r < sq.len_q)
        p.lse[b * p.lse_b + h * p.lse_h + (sq.q0 + r) * p.lse_r] =
            empty ? -INFINITY : (row_max[hf] - 8.f) * kLn2 + logf(sum);
    }
    const int wrow = m0 + cw * 64 + wq * 16;
    TO *go = static_cast<TO *>(p.out) + b * p.o_b + (sq.q0 + wrow) * p.o_r + h * p.o_h;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = (lane >> 2) + hf * 8;
      if (r >= sq.len_q - wrow) continue;
#pragma unroll
      for (int jj = 0; jj < kD / 8; ++jj)
        store_pair(go + r * p.o_r + jj * 8 + (lane & 3) * 2, o[jj][2 * hf] * inv[hf],
                   o[jj][2 * hf + 1] * inv[hf]);
    }
  }
}

/* ---- host side --------------------------------------------------------------------------------- */

/* Why the fp8 kernel cannot run p (a sentence naming the feature), or NULL when it can. Reads what
 * cuda.c's problem_params sets before the tensors, plus the tensors' addresses and strides. */
static inline const char *fp8_fwd_unsupported(const attn_cuda_params &p) {
  if (p.d != p.dv) return "the sm90 fp8 forward needs Dv = D";
  if (p.d != 128 && p.d != 256)
    return "the sm90 fp8 forward has head dims 128 and 256 only (a row of 64 e4m3 bytes would need "
           "the 64-byte "
           "swizzle)";
  if (p.elementwise_kinds & ATTN_CUDA_FEAT_BIAS) return "the sm90 fp8 forward has no bias";
  if (p.elementwise_kinds & ATTN_CUDA_FEAT_MASK) return "the sm90 fp8 forward has no boolean mask";
  if (p.elementwise_kinds & ATTN_CUDA_FEAT_SEGMENTS)
    return "the sm90 fp8 forward has no segment ids";
  if (p.elementwise_kinds & ATTN_CUDA_FEAT_SOFTCAP) return "the sm90 fp8 forward has no soft cap";
  if (p.elementwise_kinds & ATTN_CUDA_FEAT_ALIBI) return "the sm90 fp8 forward has no ALiBi";
  if (p.dropout_p > 0.f) return "the sm90 fp8 forward has no dropout";
  const void *ptrs[3] = {p.q, p.k, p.v};
  for (const void *ptr : ptrs)
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      return "the sm90 fp8 forward needs 16-byte aligned q, k, v";
  const int64_t strides[9] = {p.q_b, p.q_r, p.q_h, p.k_b, p.k_r, p.k_h, p.v_b, p.v_r, p.v_h};
  for (int64_t s : strides)
    if (s % 16 != 0 || s < 0)
      return "the sm90 fp8 forward needs q, k, v strides that are multiples of 16 elements";
  return nullptr;
}

/* Runs p: V^T into the workspace (p.v_t, p.vt_cols), then fwd90_fp8_kernel<C>. */
template <typename C>
attn_status launch_fwd90_fp8(const attn_cuda_params &p, cudaStream_t stream, char *why,
                             size_t why_size) {
  const char *no = fp8_fwd_unsupported(p);
  if (no == nullptr && p.d != C::kD) no = "the sm90 fp8 forward was asked for another head dim";
  if (no == nullptr && (p.v_t == nullptr || p.vt_cols != vt_columns(p)))
    no = "the sm90 fp8 forward lacks V^T's workspace";
  if (no != nullptr) {
    snprintf(why, why_size, "%s", no);
    return ATTN_STATUS_UNSUPPORTED;
  }
  const MapGeometry mg = map_geometry(p);
  const int vt_b = vt_batches(p);
  const int64_t head_bytes = vt_head_bytes(p);
  CUtensorMap tq, tk, tvt;
  attn_status st;
  /* An empty q or k (no rows: Tk = 0, or packed sequences that are all empty) may have no
   * address, which the encoder refuses; its map is never read (no CTA has a row or a key block),
   * so it points at the workspace instead. */
  const void *qbase = p.q != nullptr ? p.q : p.v_t, *kbase = p.k != nullptr ? p.k : p.v_t;
  if ((st = make_map(&tq, qbase, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p.d, p.heads_q, mg.rows_q,
                     mg.batch, p.q_h, p.q_r, p.q_b, C::kBM, why, why_size)) != ATTN_STATUS_OK ||
      (st = make_map(&tk, kbase, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p.d, p.heads_kv,
                     std::max(mg.rows_k, 1), mg.batch, p.k_h, p.k_r, p.k_b, C::kBN, why,
                     why_size)) != ATTN_STATUS_OK ||
      /* V^T [B'][Hkv][vt_head_bytes / 128 rows][128 bytes] (VtLayout's blocks) mapped as
       * [B'][rows][Hkv][128], so that a box is one block of one head */
      (st = make_map(&tvt, p.v_t, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, 128, p.heads_kv,
                     (int)(head_bytes / 128), vt_b, head_bytes, 128, p.heads_kv * head_bytes,
                     C::Vt::kRows, why, why_size)) != ATTN_STATUS_OK)
    return st;
  if (p.seqlen_k > 0) {
    dim3 vgrid((unsigned)((p.seqlen_k + kVtBlock - 1) / kVtBlock * (kVtBlock / 64)), p.heads_kv,
               p.batch);
    vt_kernel<C::kD, typename C::Vt><<<vgrid, 256, 0, stream>>>(p);
    ATTN_CUDA_CHECK(cudaGetLastError());
  }
  auto kernel = fwd90_fp8_kernel<C>;
  ATTN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::kSmem));
  dim3 grid((p.seqlen_q + C::kBM - 1) / C::kBM, p.heads_q, p.batch);
  kernel<<<grid, C::kThreads, C::kSmem, stream>>>(p, tq, tk, tvt);
  ATTN_CUDA_CHECK(cudaGetLastError());
  return ATTN_STATUS_OK;
}

} // namespace sm90
} // namespace attn_cuda

#endif /* ATTN_IMPL_CUDA_SM90_SM90_FWD_FP8_CUH */
