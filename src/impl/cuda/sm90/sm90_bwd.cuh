/*
 * src/impl/cuda/sm90/sm90_bwd.cuh - the Hopper backward (sm_90a only), FlashAttention-3's
 * schedule: bf16 / f16, D = 64, 128 or 256 with Dv = D, the causal / window band in both alignments,
 * GQA / MQA, any lengths, packed and padded varlen (the forward's map geometry: a packed
 * sequence is addressed by its first rows, its partial blocks' rows past the end zeroed in shared
 * memory, clear_tail_rows), the soft cap and ALiBi (instantiations of their own, Bwd90Mode: the
 * forward's logit in registers, dS times the cap's derivative), sinks (nothing here: P comes from
 * lse, which has them, and dsinks is cuda_launch.cu's kernel), and a deterministic order of dQ's
 * additions (kDeterministic, the "sm90_deterministic" configuration: first_key_block). Dropout,
 * bias, masks and segment ids run on the sm_80 backward (sm90_bwd_unsupported says why). Each
 * version's idea and speed: dev/cuda/bwd_hopper.cu (v4: 1.18-1.54x the atomic sm_80 backward on
 * an H100; v5 the features; v6 the elementwise step without per-score branches, 1.12-1.48x v5 on an
 * H200; v8 the next item's scores under this item's products, D = 64, 1.07-1.08x v6; v9 D = 256;
 * v10 each mode's per-score work fixed at compile time, the soft cap 1.08-1.31x; v11 the cap's
 * logit by tanh.approx as the forward's, 1.02-1.05x at D <= 128).
 *
 * One CTA per (block of kBN = 128 keys, KV head, batch) keeps dK and dV of its keys in f32
 * registers while it walks every query head of the KV head's group and every 64-row query block
 * the band allows (an "item"), as the atomic sm_80 kernel does. Warpgroup 0 is the producer: one
 * thread brings K and V once and each item's Q and dO tiles (kStages deep) by the copy engine
 * (the forward's maps, 128-byte swizzle). The two consumer warpgroups own 64 keys each:
 *   S^T = K Q^T and dP^T = V dO^T      wgmma, both operands in shared memory (K-major)
 *   P^T = exp2(S^T scale log2e - lse2), dS^T = P^T (dP^T - Delta)   in registers
 *   dV += P^T dO, dK += dS^T Q          wgmma with A from registers: the transposed products'
 *                                       accumulators are already the A fragments (no shared
 *                                       memory for P), B = dO / Q read MN-major
 *   dQ(64 rows) += dS K                 dS^T stored to shared memory (swizzled by hand, two
 *                                       buffers), a barrier of both consumer warpgroups, then
 *                                       each takes half of dQ's columns over all 128 keys (A =
 *                                       dS^T and B = K both MN-major); each warp stages its
 *                                       slice in shared memory and adds it into the f32
 *                                       workspace's tiles with one bulk reduce-add of the copy
 *                                       engine (dq_tile_index; dq_tiles_convert_kernel scales
 *                                       and rounds it; kDqTiled = false: float2 atomics into the
 *                                       atomic kernel's layout instead, dev/cuda/bwd_hopper.cu's
 *                                       v2).
 * The producer's second warp writes each item's lse (log2 units) and Delta beside its Q and dO
 * tiles (shared memory, the same barrier), so that the consumers keep no registers for them.
 * dK = scale * sum dS^T Q is scaled when stored. At D = 256 (BwdCfg90's kSplit) a CTA has 64 keys,
 * both warpgroups' for half of the columns each, and P^T joins dS^T in shared memory.
 */
#ifndef ATTN_IMPL_CUDA_SM90_SM90_BWD_CUH
#define ATTN_IMPL_CUDA_SM90_SM90_BWD_CUH

#include "impl/cuda/cuda_bwd.cuh"
#include "impl/cuda/sm90/sm90_fwd.cuh"

namespace attn_cuda {
namespace sm90 {

/* kBN keys per CTA (64 per consumer warpgroup), kBM query rows per item, kStages Q / dO buffers.
 * kOverlap: dV's products are issued before dS^T is stored, dK's after dQ's, and dQ's additions go
 * out while dK's run (without it: dV, dK, then dQ, all waited for before the additions).
 * kDqTiled: dQ goes into the workspace's tiles (ATTN_CUDA_SM90_DQ_FLOATS) by the copy engine, one
 * bulk reduce-add of a warp's whole slice (4 KiB at D = 128) staged in shared memory, instead of
 * 16 or 32 float2 atomics per thread into [Hq, rows_q, d]: Nsight Compute showed the atomics'
 * queue holding the consumers' registers (the top stalls of the v2 kernel, 13% of its samples).
 * kPrefetch (v8, D = 64): each item's pass issues the next item's S^T / dP^T before its own dV, dQ
 * and dK products and computes the next item's P^T / dS^T while they run, ending with every group
 * complete (a group in flight across the loop's back edge made ptxas serialize every wgmma); a
 * third Q / dO stage keeps the copies ahead. At D = 128 the products' accumulators in flight
 * beside S^T and dP^T exceed the registers.
 * kHeadsFirst: under a causal mask (window_right >= 0, no left window) the launch dispatches
 * the grid heads first, x the KV head and y the key block, so that the longest CTAs (the first
 * key blocks, which see the most query blocks) of every head start first, not those of the last
 * heads in the grid's last wave (H200, bf16, T = 8192, causal, measured as bands of 8 key blocks
 * across heads, whose waves hold the same CTAs: +4% at D = 128, +15% with GQA 4:1, +3% at D = 64;
 * dev/cuda/bwd_hopper.cu, "bands"). Other problems, whose key blocks all see about as many
 * queries, keep the key blocks along x: a head's key blocks run together and share its Q and dO
 * through L2, which bands across heads did not (0.93-1.0x without a mask). Either order
 * dispatches key block n - 1 of a head before n, which the deterministic order needs, and reads
 * its place from blockIdx alone (a band index worked out at run time cost ptxas 36 more bytes of
 * spills at D = 128). false: key blocks along x always. */
template <typename T_, int kD_, int kStages_ = 2, bool kOverlap_ = true, bool kDqTiled_ = true, bool kPrefetch_ = false,
          bool kHeadsFirst_ = true, bool kCapTanh_ = true>
struct BwdCfg90 {
  using T = T_;
  /* kCapTanh (v11): the soft cap's logit by tanh.approx, as the forward's (SoftCap::tanh2), and
   * its derivative from it; false: the exact form (SoftCap::logit2), one FP32 op in three more */
  static constexpr bool kCapTanh = kCapTanh_;
  /* kSplit (D = 256, where one warpgroup's dK and dV of 64 keys would need 256 registers a thread):
   * the CTA's kBN = 64 keys are both warpgroups', which split the columns of dK, dV and dQ (kDC =
   * 128 each) and the queries of S^T and dP^T (kSN = 32 each). P^T and dS^T then go through shared
   * memory, each warpgroup storing its queries and reading all 64 (dV = P^T dO from shared memory,
   * Wgmma::ssb), and dQ goes out by vector reductions (red.global.add.v4.f32, four floats a lane,
   * in the tiles' layout), the staging's 64 KiB not fitting beside K, V and two Q / dO stages. */
  static constexpr bool kSplit = kD_ == 256;
  static constexpr int kD = kD_, kBN = kSplit ? 64 : 128, kBM = ATTN_CUDA_SM90_BWD_ROWS, kStages = kStages_, kCWG = 2;
  static constexpr int kDC = kSplit ? kD / 2 : kD, kSN = kSplit ? kBM / 2 : kBM;
  static constexpr bool kHeadsFirst = kHeadsFirst_;
  static constexpr bool kOverlap = kOverlap_, kDqTiled = kDqTiled_, kPrefetch = kPrefetch_;
  static_assert(!kPrefetch || (kOverlap && kDqTiled && kStages >= 3),
                "the prefetching schedule keeps three items' Q and dO in flight");
  static_assert(!kSplit || (kOverlap && kDqTiled && !kPrefetch), "D = 256 has one schedule");
  static constexpr int kThreads = 128 * (kCWG + 1), kPanels = kD / 64;
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static constexpr uint32_t kKVBytes = kBN * kD * 2, kQBytes = kBM * kD * 2, kDSBytes = kBN * kBM * 2;
  static constexpr uint32_t kStatBytes = kBM * 8; /* {lse2, Delta} per query row */
  /* a warp's slice of a dQ tile: its 16 rows x its warpgroup's kD / 2 columns, f32 */
  static constexpr uint32_t kDqWarpFloats = 16 * kD / 2, kDqBytes = kDqTiled && !kSplit ? kCWG * 4 * kDqWarpFloats * 4 : 0;
  /* two dS^T buffers, and with kSplit two P^T buffers after them */
  static constexpr uint32_t kGradBytes = (kSplit ? 4 : 2) * kDSBytes;
  /* K, V, kStages x (Q, dO, row stats), the dS^T (P^T) buffers, dQ's staging, the barriers, and
   * 1024 bytes to align the base */
  static constexpr uint32_t kSmem = 1024 + 2 * kKVBytes + kStages * (2 * kQBytes + kStatBytes) + kGradBytes + kDqBytes +
                                    8 * (1 + 2 * kStages);
  static_assert(kD == 64 || kD == 128 || kD == 256, "head dims 64, 128 and 256");
  static_assert(kSmem <= 227 * 1024, "the shared memory of one CTA");
};

/* Where dQ's f32 (query row m0 + r of head h, sequence b; column c) lies in the tiled workspace:
 * tile (h, b, m0 / 64) of 64 x kD floats, in it the slice of warp (c / (kD / 2)) * 4 + r / 16
 * (16 rows x kD / 2 columns, the fragment of that consumer warp), and in the slice the order of
 * the warp's registers: column group jj = (c % (kD / 2)) / 8, then lane (r % 8) * 4 + (c % 8) / 2,
 * then register 2 ((r % 16) / 8) + c % 2. Pairs (c, c + 1) with c even are adjacent. */
template <int kD>
__device__ __forceinline__ int64_t dq_tile_index(const attn_cuda_params &p, int h, int b, int m0, int r, int c) {
  constexpr int kBM = ATTN_CUDA_SM90_BWD_ROWS;
  const int64_t blocks = (p.seqlen_q + kBM - 1) / kBM;
  const int64_t tile = ((int64_t)h * p.batch + b) * blocks + m0 / kBM;
  const int cc = c % (kD / 2), slice = (c / (kD / 2)) * 4 + r / 16;
  const int lane = (r % 8) * 4 + (cc % 8) / 2, reg = 2 * ((r % 16) / 8) + cc % 2;
  return tile * (kBM * kD) + slice * (16 * kD / 2) + ((cc / 8) * 32 + lane) * 4 + reg;
}

/* dq = scale * the tiled f32 workspace (kDqTiled), for every row of every sequence (varlen: the
 * rows outside them were zeroed before, by zero_outside_kernel). One CTA per tile at a time, so
 * that the tile's (head, sequence, row block) and the sequence's rows are worked out once, not per
 * element (the per-element divisions made the kernel 2.4x slower than its bytes, 0.122 ms for
 * 201 MB at D = 128 on an H200). A thread takes 8 columns of a row: four float2 of the slice
 * (pairs of columns in the warps' register order), one 16-byte store where dq's rows allow it
 * (kVec16), four 4-byte ones otherwise. The threads of a warp take 16 rows of two column groups:
 * their loads cover two 512-byte runs of the slice, their stores 32 bytes of each row. */
template <typename T, int kD, bool kVec16>
__global__ void dq_tiles_convert_kernel(const __grid_constant__ attn_cuda_params p) {
  constexpr int kBM = ATTN_CUDA_SM90_BWD_ROWS, kGroups = kD / 16; /* 8-column groups of a slice */
  const int64_t blocks = (p.seqlen_q + kBM - 1) / kBM, tiles = (int64_t)p.heads_q * p.batch * blocks;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int mb = (int)(t % blocks), b = (int)(t / blocks % p.batch), h = (int)(t / blocks / p.batch);
    const Seq sq = seq_of(p, b);
    const int rows = min(kBM, sq.len_q - mb * kBM);
    if (rows <= 0) continue;
    const float *tile = p.dq_accum + t * (kBM * kD);
    T *out = static_cast<T *>(p.dq_out) + b * p.dq_b + (sq.q0 + mb * kBM) * p.dq_r + h * p.dq_h;
    for (int u = threadIdx.x; u < 8 * kGroups * 16; u += blockDim.x) {
      const int rr = u % 16, jj = u / 16 % kGroups, slice = u / 16 / kGroups;
      const int r = (slice % 4) * 16 + rr, c0 = (slice / 4) * (kD / 2) + jj * 8;
      if (r >= rows) continue;
      /* dq_tile_index of (r, c0 + 2 q): lane (r % 8) * 4 + q, register 2 ((r % 16) / 8) */
      const float *at = tile + slice * (16 * kD / 2) + (jj * 32 + (rr % 8) * 4) * 4 + 2 * (rr / 8);
      uint32_t w[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 v = *reinterpret_cast<const float2 *>(at + q * 4);
        w[q] = Elem<T>::pack(v.x * p.scale, v.y * p.scale);
      }
      T *dst = out + r * p.dq_r + c0;
      if constexpr (kVec16) {
        *reinterpret_cast<uint4 *>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) *reinterpret_cast<uint32_t *>(dst + 2 * q) = w[q];
      }
    }
  }
}

/* Whether dq's rows take dq_tiles_convert_kernel's 16-byte stores: dq 16-byte aligned, its strides
 * multiples of 8 elements. */
static inline bool dq_rows_vec16(const attn_cuda_params &p) {
  return reinterpret_cast<uintptr_t>(p.dq_out) % 16 == 0 && p.dq_r % 8 == 0 && p.dq_h % 8 == 0 && p.dq_b % 8 == 0;
}

/* The deterministic configuration's order of the additions into dQ tile mb (kBM rows): the key
 * blocks whose query_block_range holds mb are n_first .. in turn, n_first being the first whose
 * last key reaches row mb * kBM's left window edge (query_block_range's upper bound solved for
 * n; the lower bound grows with n, so the blocks that add are one run from n_first). A key block
 * n_first + r adds into each of the tile's slices once its counter reads r. */
__device__ __forceinline__ int first_key_block(const attn_cuda_params &p, const Head &r, int mb, int kBM, int kBN) {
  if (p.window_left < 0) return 0;
  return max(0, floor_div(mb * kBM + r.o - p.window_left, kBN));
}

/* Spins until the counter at c reads v (acquire: the additions it counts are visible after). */
__device__ __forceinline__ void wait_counter(const int32_t *c, int v) {
  int x;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(x) : "l"(c) : "memory");
  } while (x != v);
}
/* Adds one to the counter at c after this thread's earlier writes (release). */
__device__ __forceinline__ void bump_counter(int32_t *c) {
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(c) : "memory");
}

/* What a kernel instantiation computes per score (bwd90_mode picks one for a problem): the plain
 * one folds the scale into the exponent's FMA; the other two compute the forward's kModeCapAlibi
 * logit in registers, ALiBi's kernel also the cheaper form of tiles where i + o - j keeps its sign
 * (elementwise's kLinear: kept out of the cap's kernel, whose registers it spilled). */
enum Bwd90Mode : int {
  kBwdPlain = 0,
  kBwdAlibi = 1,  /* ALiBi without the soft cap */
  kBwdCap = 2,    /* the soft cap, with or without ALiBi */
};

/* kDeterministic: dQ's additions in a fixed order (first_key_block). */
template <typename C, int kMode, bool kDeterministic>
__global__ void __launch_bounds__(C::kThreads, 1)
    bwd90_kernel(const __grid_constant__ attn_cuda_params p, const __grid_constant__ CUtensorMap tq,
                 const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv,
                 const __grid_constant__ CUtensorMap tdo, bool heads_first) {
  using T = typename C::T;
  constexpr int kD = C::kD, kBN = C::kBN, kBM = C::kBM, kStages = C::kStages;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t sK = (smem_u32(smem_raw) + 1023) & ~1023u;
  const uint32_t sV = sK + C::kKVBytes, sQ = sV + C::kKVBytes, sO = sQ + kStages * C::kQBytes;
  const uint32_t sDS = sO + kStages * C::kQBytes, sP = sDS + 2 * C::kDSBytes, sStat = sDS + C::kGradBytes;
  const uint32_t sDQ = sStat + kStages * C::kStatBytes, bars = sDQ + C::kDqBytes;
  /* the row stats of stage s, for generic loads and stores */
  auto stats = [&](int s) {
    return reinterpret_cast<float2 *>(smem_raw + (sStat + s * C::kStatBytes - smem_u32(smem_raw)));
  };
  /* barriers: K and V; per stage Q and dO full, then empty */
  const uint32_t bar_kv = bars;
  auto full = [&](int s) { return bars + 8 * (1 + s); };
  auto empty = [&](int s) { return bars + 8 * (1 + kStages + s); };

  const int tid = threadIdx.x, lane = tid & 31, wg = tid / 128;
  /* heads first (bwd90_heads_first): x the KV head, y the key block; else x the key block, y the
   * KV head; z the sequence */
  if constexpr (!C::kHeadsFirst) heads_first = false;
  const int g = heads_first ? blockIdx.x : blockIdx.y;
  const int b = blockIdx.z;
  const int n0 = (heads_first ? blockIdx.y : blockIdx.x) * kBN;
  const Seq sq = seq_of(p, b);
  if (n0 >= sq.len_k) return;
  const int n_last = min(n0 + kBN, sq.len_k) - 1;
  const MapOrigin org = map_origin(p, sq, b);
  const Head hd0 = head_of(p, sq, b, g * p.group);
  int m_lo, m_hi;
  query_block_range(p, hd0, n0, n_last, kBM, m_lo, m_hi);
  const int nm = max(m_hi - m_lo, 0), items = nm * p.group;
  /* item it's query block: ascending, or descending in the deterministic order, where a key block
   * waits for the previous one at each dQ tile (first_key_block). Descending, the previous key
   * block is at most one item ahead (under a causal band both start at the last query block and
   * this one has two blocks fewer; under a window it starts below this one's first); ascending,
   * this one waited while the previous one did its blocks below this one's first (0.38x the
   * plain speed, causal, T = 8192, H100). */
  auto block_of = [&](int it) { return kDeterministic ? m_hi - 1 - it % nm : m_lo + it % nm; };

  if (tid == 0) {
    mbar_init(bar_kv, 1);
    /* full: the copies' thread and every lane of the row stats' warp; empty: every consumer
     * thread. Each thread that touches a stage's stats with plain loads or stores arrives itself:
     * one arrive per warp after __syncwarp orders them too, but racecheck does not follow that
     * chain and reported every stage (64 hazards in the quick suite; none with this) */
    for (int s = 0; s < kStages; ++s) mbar_init(full(s), 1 + 32), mbar_init(empty(s), 128 * C::kCWG);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) { /* producer */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::kProducerRegs));
    if (tid == 0) {
      mbar_expect_tx(bar_kv, 2 * C::kKVBytes);
      for (int c = 0; c < C::kPanels; ++c) {
        tma_load(sK + c * kBN * 128, &tk, bar_kv, c * 64, g, org.k_row0 + n0, org.batch);
        tma_load(sV + c * kBN * 128, &tv, bar_kv, c * 64, g, org.k_row0 + n0, org.batch);
      }
      for (int it = 0; it < items; ++it) {
        const int s = it % kStages, h = g * p.group + it / nm, m0 = block_of(it) * kBM;
        mbar_wait(empty(s), ((it / kStages) & 1) ^ 1);
        mbar_expect_tx(full(s), 2 * C::kQBytes);
        for (int c = 0; c < C::kPanels; ++c) {
          tma_load(sQ + s * C::kQBytes + c * kBM * 128, &tq, full(s), c * 64, h, org.q_row0 + m0, org.batch);
          tma_load(sO + s * C::kQBytes + c * kBM * 128, &tdo, full(s), c * 64, h, org.q_row0 + m0, org.batch);
        }
      }
    } else if (tid >= 32 && tid < 64) {
      /* the second warp: lse (log2 units; +inf past the sequence or for a row that sees nothing,
       * so that P = 0) and Delta of each item's rows, from the sequence's first row (pointers made
       * once: this warp has 24 registers) */
      const float *lse_seq = p.lse + b * p.lse_b + sq.q0 * p.lse_r, *delta_seq = p.delta + delta_row(p, sq, b, 0);
      for (int it = 0; it < items; ++it) {
        const int s = it % kStages, h = g * p.group + it / nm, m0 = block_of(it) * kBM;
        mbar_wait(empty(s), ((it / kStages) & 1) ^ 1);
        const float *lse = lse_seq + h * p.lse_h + m0 * p.lse_r, *delta = delta_seq + h * p.rows_q + m0;
        const int rows = sq.len_q - m0;
        for (int r = lane; r < kBM; r += 32) {
          float2 st = make_float2(INFINITY, 0.f);
          if (r < rows) {
            const float l = lse[r * p.lse_r];
            st.x = l == -INFINITY ? INFINITY : l * kLog2e;
            st.y = delta[r];
          }
          stats(s)[r] = st;
        }
        mbar_arrive(full(s)); /* releases this lane's stores to the consumers */
      }
    }
    return;
  }

  /* consumers: warpgroup cw owns keys n0 + 64 cw .. + 63 (kSplit: all kBN = 64 keys, for columns
   * kDC cw .. + kDC - 1 of dK and dV, and queries kSN cw .. + kSN - 1 of S^T and dP^T); a thread's
   * accumulator rows are keys kr and kr + 8, its columns 8 jj + 2 (lane & 3) + {0, 1} */
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::kConsumerRegs));
  const int cw = wg - 1, wq = (tid >> 5) & 3;
  constexpr int kDC = C::kDC, kSN = C::kSN;
  const int key0 = C::kSplit ? 0 : cw * 64, q_off = C::kSplit ? cw * kSN : 0; /* this warpgroup's first key and query */
  const int kr = key0 + wq * 16 + (lane >> 2); /* key row in the block */
  const float scale_log2 = p.scale * kLog2e;

  float dk[1][kDC / 8][4], dv[1][kDC / 8][4];
  float(&dka)[kDC / 2] = reinterpret_cast<float(&)[kDC / 2]>(dk);
  float(&dva)[kDC / 2] = reinterpret_cast<float(&)[kDC / 2]>(dv);
#pragma unroll
  for (int i = 0; i < kDC / 2; ++i) dka[i] = dva[i] = 0.f;
  float st[kSN / 2], dpt[kSN / 2], dq[kD / 4];
  uint32_t pa[kSN / 16][4], dsa[kSN / 16][4];

  /* acc = A(this warpgroup's 64 keys of sA) B(its kSN queries of the item's sB)^T, both K-major */
  auto issue_transposed = [&](float (&acc)[kSN / 2], uint32_t sA, uint32_t sB) {
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t col = (kk % 4) * 32;
      Wgmma<T, kSN>::ss(acc, smem_desc(sA + key0 * 128 + (kk / 4) * kBN * 128 + col, 16, 1024),
                        smem_desc(sB + q_off * 128 + (kk / 4) * kBM * 128 + col, 16, 1024), kk > 0);
    }
  };
  /* acc += A (registers: 64 keys x kBM queries) B (sB: kBM query rows x kD, MN-major); not with
   * kSplit, whose registers hold only kSN of the queries */
  auto issue_ab = [&](float (&acc)[kDC / 2], const uint32_t (&a)[kSN / 16][4], uint32_t sB) {
    if constexpr (!C::kSplit) {
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk) Wgmma<T, kD>::rs(acc, a[kk], smem_desc(sB + kk * 16 * 128, kBM * 128, 1024), 1);
    }
  };
  /* kSplit: acc += A (sA: [64 keys][kBM queries], swizzled as store_grads writes it, K-major) B (sB's
   * columns kDC cw .., MN-major) */
  auto issue_ab_smem = [&](float (&acc)[kDC / 2], uint32_t sA, uint32_t sB) {
    const uint32_t b = sB + (cw * kDC / 64) * kBM * 128;
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk)
      Wgmma<T, kDC>::ssb(acc, smem_desc(sA + kk * 32, 16, 1024), smem_desc(b + kk * 16 * 128, kBM * 128, 1024), 1);
  };
  /* dQ (kBM queries x this warpgroup's kD / 2 columns) = dS (from dS^T, MN-major) K (MN-major) */
  const int dq_col0 = cw * (kD / 2);
  auto issue_dq = [&](uint32_t ds) {
    const uint32_t k = sK + (dq_col0 / 64) * kBN * 128 + (dq_col0 % 64) * 2;
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk)
      Wgmma<T, kD / 2>::sst(dq, smem_desc(ds + kk * 16 * 128, kBN * 128, 1024), smem_desc(k + kk * 16 * 128, kBN * 128, 1024),
                            kk > 0);
  };

  /* varlen: rows past the sequence's end are zeroed before a product reads them (clear_tail_rows):
   * K's once (dQ = dS K), each partial item's Q and dO (dK = dS^T Q, dV = P^T dO); V's need not
   * be, dP^T of those keys being dropped with their dS. Then a barrier of both warpgroups. */
  const bool varlen = p.varlen != ATTN_CUDA_VARLEN_NONE;
  auto both_cleared = [&]() { asm volatile("bar.sync 1, %0;\n" ::"n"(128 * C::kCWG) : "memory"); };
  mbar_wait(bar_kv, 0);
  if (varlen && n0 + kBN > sq.len_k) {
    clear_tail_rows<C::kPanels, kBN, 128 * C::kCWG>(sK, sq.len_k - n0, tid - 128);
    both_cleared();
  }
  /* the soft cap and ALiBi: ALiBi's -slope |i + o - j| in dot-product units, as the forward's
   * kModeCapAlibi adds it (divided by the scale, which sm90_bwd_unsupported makes positive), then
   * the cap, whose derivative multiplies dS */
  const bool has_alibi = kMode == kBwdAlibi || (kMode == kBwdCap && p.alibi != nullptr);
  const SoftCap cap(p); /* read only by kBwdCap's kernel, which bwd90_mode gives caps above 0 only */
  /* Item it's Q / dO stage landed, and its rows past the sequence cleared */
  auto stage_ready = [&](int it) {
    const int s = it % kStages, m0 = block_of(it) * kBM;
    mbar_wait(full(s), (it / kStages) & 1);
    if (varlen && m0 + kBM > sq.len_q) {
      clear_tail_rows<C::kPanels, kBM, 128 * C::kCWG>(sQ + s * C::kQBytes, sq.len_q - m0, tid - 128);
      clear_tail_rows<C::kPanels, kBM, 128 * C::kCWG>(sO + s * C::kQBytes, sq.len_q - m0, tid - 128);
      both_cleared();
    }
  };
  /* Item it's S^T and dP^T issued as one group (its stage waited for first where wait_stage) */
  auto issue_scores = [&](int it, bool wait_stage) {
    const int s = it % kStages;
    if (wait_stage) stage_ready(it);
    wgmma_fence();
    issue_transposed(st, sK, sQ + s * C::kQBytes);
    issue_transposed(dpt, sV, sO + s * C::kQBytes);
    wgmma_commit();
  };
  /* kDeterministic: the counter of this warp's dq slice of query block m0, head h (the order of
   * dq_tile_index's slices), and the wait for this key block's turn at it */
  auto slice_counter = [&](int h, int m0) {
    return p.dq_semaphore + (dq_tile_index<kD>(p, h, b, m0, 0, 0) / (kBM * kD)) * 8 + cw * 4 + wq;
  };
  auto wait_turn = [&](int32_t *counter, int h, int m0) {
    wait_counter(counter, n0 / kBN - first_key_block(p, head_of(p, sq, b, h), m0 / kBM, kBM, kBN));
  };
  /* Item it's dQ (the registers dq) added into the workspace */
  auto add_dq = [&](int it) {
    const int h = g * p.group + it / nm, m0 = block_of(it) * kBM;
    /* dQ's rows: queries m0 + 16 wq + (lane >> 2) + 8 hf; columns dq_col0 + 8 jj + 2 (lane & 3) */
    if constexpr (C::kSplit) {
      /* the slice's tile order (dq_tile_index) puts lane l's four floats of column group jj at
       * 16 (32 jj + l) bytes: one vector reduction a group, 512 contiguous bytes a warp */
      float *at = p.dq_accum + dq_tile_index<kD>(p, h, b, m0, wq * 16, dq_col0) + lane * 4;
      int32_t *counter = nullptr; /* kDeterministic: lane 0 waits, the warp adds, lane 0 counts */
      if constexpr (kDeterministic) {
        counter = slice_counter(h, m0);
        if (lane == 0) wait_turn(counter, h, m0);
        __syncwarp();
      }
#pragma unroll
      for (int jj = 0; jj < kD / 16; ++jj)
        asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(at + jj * 128), "f"(dq[4 * jj]),
                     "f"(dq[4 * jj + 1]), "f"(dq[4 * jj + 2]), "f"(dq[4 * jj + 3])
                     : "memory");
      if constexpr (kDeterministic) {
        __threadfence(); /* this lane's reductions are performed before the counter moves */
        __syncwarp();
        if (lane == 0) bump_counter(counter);
        __syncwarp();
      }
    } else if constexpr (C::kDqTiled) {
      /* the slice in its tile order (dq_tile_index): lane l's four floats of column group jj at
       * 16 (32 jj + l) bytes, so each store is one conflict-free line per 8 lanes; lane 0 adds it
       * once the previous item's addition has read the staging */
      const uint32_t dqs = sDQ + (cw * 4 + wq) * C::kDqWarpFloats * 4;
      if (lane == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
      __syncwarp();
#pragma unroll
      for (int jj = 0; jj < kD / 16; ++jj)
        asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(dqs + (jj * 32 + lane) * 16), "f"(dq[4 * jj]),
                     "f"(dq[4 * jj + 1]), "f"(dq[4 * jj + 2]), "f"(dq[4 * jj + 3])
                     : "memory");
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* visible to the copy engine */
      __syncwarp();
      if (lane == 0) {
        const float *slice = p.dq_accum + dq_tile_index<kD>(p, h, b, m0, wq * 16, dq_col0);
        int32_t *counter = nullptr;
        if constexpr (kDeterministic) {
          counter = slice_counter(h, m0);
          wait_turn(counter, h, m0);
          asm volatile("fence.proxy.async.global;\n" ::: "memory"); /* the copy engine reads after it */
        }
        asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                     "cp.async.bulk.commit_group;\n" ::"l"(slice),
                     "r"(dqs), "n"(C::kDqWarpFloats * 4)
                     : "memory");
        if constexpr (kDeterministic) {
          /* the addition is complete (not only read) before the next key block may add */
          asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
          asm volatile("fence.proxy.async.global;\n" ::: "memory");
          bump_counter(counter);
        }
      }
      /* lane 0 may have spun on the counter: the warp meets again before wgmma's aligned wait */
      if constexpr (kDeterministic) __syncwarp();
    } else {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = m0 + wq * 16 + (lane >> 2) + hf * 8;
        if (i >= sq.len_q) continue;
        float *row = p.dq_accum + (h * p.rows_q + delta_row(p, sq, b, i)) * kD + dq_col0 + (lane & 3) * 2;
#pragma unroll
        for (int jj = 0; jj < kD / 16; ++jj)
          atomicAdd(reinterpret_cast<float2 *>(row + jj * 8), make_float2(dq[4 * jj + 2 * hf], dq[4 * jj + 2 * hf + 1]));
      }
    }
  };

  /* P^T and dS^T of an item, out of its S^T and dP^T: in their place, or with kPrefetch in
   * registers of their own (ptxas serializes every wgmma of a kernel whose other instructions
   * write an accumulator while a wgmma is in flight; in place, fewer registers) */
  float pv_own[kSN / 2], dsv_own[kSN / 2];
  float(&pv)[kSN / 2] = C::kPrefetch ? pv_own : st;
  float(&dsv)[kSN / 2] = C::kPrefetch ? dsv_own : dpt;
  /* Item it's P^T and dS^T into pv and dsv; landed() waits for its S^T and dP^T, after the item's
   * set-up, which so runs under the products */
  auto scores_to_grads = [&](int it, auto landed) {
    const int s = it % kStages, h = g * p.group + it / nm, m0 = block_of(it) * kBM;
    const Head hd = head_of(p, sq, b, h);
    const int m_last = min(m0 + kBM, sq.len_q) - 1;
    const bool interior = band_full(p, hd, m0, m_last, n0, kBN) && m0 + kBM <= sq.len_q;
    const float alibi_step = has_alibi ? -p.alibi[b * p.alibi_b + h * p.alibi_h] / p.scale : 0.f;
    /* i + o - j of this thread's first element (query m0 + q_off + 2 (lane & 3), key n0 + kr); the
     * others differ by constants, so |i + o - j| is exact in f32 below 2^24 */
    const float dist0 = (float)(m0 + q_off + hd.o - n0 - kr + 2 * (lane & 3));
    /* the sign of i + o - j on every score of the tile the band lets through (elementwise's
     * kLinear), 0 where it has both, or with the cap */
    int side = 0;
    if (kMode == kBwdAlibi) {
      if (p.window_right == 0 || m0 + hd.o - (n0 + kBN - 1) >= 0) side = 1;
      else if (p.window_left == 0 || m0 + kBM - 1 + hd.o - n0 <= 0) side = -1;
    }
    /* kLinear (ALiBi without the cap where i + o - j keeps one sign on every visible score of the
     * tile: a causal band, or a tile wholly on one side of the diagonal): |i + o - j| is then
     * side * (i + o - j), so ALiBi's term splits into one per key row and one per query column,
     * the latter folded into -lse2 once per column: one FADD per score instead of an abs, an add
     * and an FFMA (0.76-0.80x of the plain speed before, H100). */
    /* kEdge (a tile the band or the lengths cut, !interior): the scores a thread's two keys hide,
     * tested against the query range that sees each key (this thread's query columns are 8 jj + c
     * past q_col0), with no branch: per-score branches, as visible_band's, kept the exponentials
     * from being pipelined (1.12-1.48x on an H200 without them, dev/cuda/bwd_hopper.cu's v6), and
     * interior tiles, most of them, have an instantiation without the test */
    landed();
    pin(st);
    pin(dpt);
    const int q_col0 = m0 + q_off + 2 * (lane & 3);
    int see_lo[2] = {0, 0}, see_n[2] = {0, 0}; /* per key row hf: columns [see_lo, see_lo + see_n) see it */
    if (!interior)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        int lo, hi;
        visible_band_queries(p, hd, n0 + kr + 8 * hf, lo, hi);
        see_lo[hf] = lo - q_col0, see_n[hf] = hi - lo;
      }
    /* alibi (true_type or false_type): ALiBi's term in the non-linear forms (kBwdAlibi's always;
     * the cap's kernel has it or not per problem). Each mode's per-score work is fixed at compile
     * time: a per-score test of has_cap or has_alibi made ptxas put each score's cap in a basic
     * block of its own, with its two exponentials and its reciprocal alone in it (one BRA a score
     * in the SASS), as v6 found for the band's tests (dev/cuda/bwd_hopper.cu's v10) */
    auto elementwise = [&](auto linear, auto edge, auto alibi) {
      constexpr bool kLinear = decltype(linear)::value, kEdge = decltype(edge)::value;
      /* kLinear: ALiBi's log2-unit term of this thread's key rows (hf) and its step per query */
      const float a = alibi_step * scale_log2 * (float)side;
      const float row_term[2] = {a * dist0, a * (dist0 - 8.f)};
#pragma unroll
      for (int jj = 0; jj < kSN / 8; ++jj) {
        /* {lse2, Delta} of this thread's query columns q_off + 8 jj + 2 (lane & 3) + {0, 1} */
        const float4 qs = *reinterpret_cast<const float4 *>(stats(s) + q_off + jj * 8 + (lane & 3) * 2);
        float col_term[2] = {-qs.x, -qs.z};
        if constexpr (kLinear) col_term[0] = fmaf(a, (float)(8 * jj), -qs.x), col_term[1] = fmaf(a, (float)(8 * jj + 1), -qs.z);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = e & 1, hf = e >> 1;
          const float delta = c ? qs.w : qs.y;
          /* outside the band or the lengths both are 0, also where S^T or dP^T is not finite (a
           * varlen tile's rows of another sequence) */
          const bool hidden = kEdge && (unsigned)(8 * jj + c - see_lo[hf]) >= (unsigned)see_n[hf];
          float P, ds;
          if constexpr (kLinear) {
            P = ex2(at_most_zero(fmaf(st[4 * jj + e], scale_log2, row_term[hf] + col_term[c])));
            ds = P * (dpt[4 * jj + e] - delta);
          } else if constexpr (kMode != kBwdPlain) {
            float x = st[4 * jj + e];
            if constexpr (decltype(alibi)::value) x = fmaf(alibi_step, fabsf(dist0 + (float)(8 * jj + c - 8 * hf)), x);
            if constexpr (kMode == kBwdCap) {
              float slope;
              if constexpr (C::kCapTanh) P = ex2(at_most_zero(fmaf(cap.tanh2(x, &slope), cap.out, col_term[c])));
              else P = ex2(at_most_zero(cap.logit2(x, &slope) + col_term[c]));
              ds = P * (dpt[4 * jj + e] - delta) * slope;
            } else {
              P = ex2(at_most_zero(x * scale_log2 + col_term[c]));
              ds = P * (dpt[4 * jj + e] - delta);
            }
          } else {
            P = ex2(at_most_zero(fmaf(st[4 * jj + e], scale_log2, col_term[c])));
            ds = P * (dpt[4 * jj + e] - delta);
          }
          pv[4 * jj + e] = hidden ? 0.f : P;
          dsv[4 * jj + e] = hidden ? 0.f : ds;
        }
      }
    };
    /* the elementwise step, in ALiBi's linear form where the tile allows it */
    auto run_elementwise = [&]() {
      auto on_tile = [&](auto linear, auto alibi) {
        if (interior) elementwise(linear, std::false_type{}, alibi);
        else elementwise(linear, std::true_type{}, alibi);
      };
      if constexpr (kMode == kBwdAlibi) {
        if (side != 0) on_tile(std::true_type{}, std::true_type{});
        else on_tile(std::false_type{}, std::true_type{});
      } else if constexpr (kMode == kBwdCap) {
        if (has_alibi) on_tile(std::false_type{}, std::true_type{});
        else on_tile(std::false_type{}, std::false_type{});
      } else {
        on_tile(std::false_type{}, std::false_type{});
      }
    };
    run_elementwise();
  };
  /* P^T and dS^T packed as A fragments (two adjacent 8-query groups make one 16-wide slice) */
  auto pack_grads = [&]() {
#pragma unroll
    for (int kk = 0; kk < kSN / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        pa[kk][r] = Elem<T>::pack(pv[8 * kk + 2 * r], pv[8 * kk + 2 * r + 1]);
        dsa[kk][r] = Elem<T>::pack(dsv[8 * kk + 2 * r], dsv[8 * kk + 2 * r + 1]);
      }
  };
  /* A fragments (dS^T, or with kSplit also P^T) to shared memory [kBN keys][64 queries] at buf, 128
   * bytes a row, this warpgroup's queries from q_off, 16-byte chunk c of row r at c ^ (r % 8): the
   * copy engine's swizzle, which wgmma's descriptors read */
  auto store_grads = [&](uint32_t buf, const uint32_t(&frag)[kSN / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < kSN / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = kr + (r & 1) * 8, chunk = q_off / 8 + 2 * kk + (r >> 1);
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(buf + row * 128 + ((chunk ^ (row & 7)) * 16) + (lane & 3) * 4),
                     "r"(frag[kk][r])
                     : "memory");
      }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* visible to wgmma */
  };
  auto store_ds = [&](uint32_t ds) { store_grads(ds, dsa); };
  auto both_halves_stored = both_cleared; /* the same barrier of both warpgroups */
  /* the registers of dV's and dK's products, accumulators and A fragments, pinned where an
   * asynchronous wgmma starts or stops using them (dq's are pinned apart, at its own waits) */
  auto pin_products = [&]() {
    pin(dka);
    pin(dva);
    pin(pa);
    pin(dsa);
  };

  if constexpr (C::kSplit) {
    /* Both warpgroups' halves of P^T and dS^T stored, a barrier, then dQ's products (their
     * reductions go out under dV's and dK's), dV's and dK's, all from shared memory */
    for (int it = 0; it < items; ++it) {
      const int s = it % kStages;
      const uint32_t q = sQ + s * C::kQBytes, o = sO + s * C::kQBytes;
      const uint32_t ds = sDS + (it & 1) * C::kDSBytes, pt = sP + (it & 1) * C::kDSBytes;
      stage_ready(it);
      issue_scores(it, false);
      scores_to_grads(it, [&] { wgmma_wait<0>(); });
      pack_grads();
      store_grads(pt, pa);
      store_grads(ds, dsa);
      both_halves_stored();
      pin_products();
      wgmma_fence(); /* dq's registers were last read by the previous item's reductions */
      issue_dq(ds);
      wgmma_commit();
      issue_ab_smem(dva, pt, o);
      wgmma_commit();
      issue_ab_smem(dka, ds, q);
      wgmma_commit();
      wgmma_wait<2>(); /* dQ has landed */
      pin(dq);
      add_dq(it);
      wgmma_wait<0>();
      pin_products();
      pin(dq);
      mbar_arrive(empty(s)); /* this thread's reads of stage s and its products are done */
    }
  } else if constexpr (C::kPrefetch) {
    /* Each pass issues the next item's S^T / dP^T ahead of this item's dV, dQ and dK products and
     * turns them into the next item's P^T and dS^T while those products run; it ends with every
     * group complete, so that none stays in flight across the loop's back edge (ptxas serializes
     * the kernel's wgmma where one does). The last pass issues its own item's scores again (their
     * results unused), so that every pass has the same groups. */
    if (items > 0) {
      issue_scores(0, true);
      scores_to_grads(0, [&] { wgmma_wait<0>(); });
    }
    for (int it = 0; it < items; ++it) {
      const int s = it % kStages;
      const uint32_t q = sQ + s * C::kQBytes, o = sO + s * C::kQBytes, ds = sDS + (it & 1) * C::kDSBytes;
      pack_grads();
      store_ds(ds);
      const bool more = it + 1 < items;
      issue_scores(more ? it + 1 : it, more);
      pin_products();
      wgmma_fence();
      issue_ab(dva, pa, o);
      wgmma_commit();
      both_halves_stored();
      issue_dq(ds);
      wgmma_commit();
      issue_ab(dka, dsa, q);
      wgmma_commit();
      scores_to_grads(more ? it + 1 : it, [&] { wgmma_wait<3>(); });
      wgmma_wait<0>();
      pin_products();
      pin(dq);
      add_dq(it);
      mbar_arrive(empty(s)); /* this thread's reads of stage s and its products are done */
    }
  } else {
    for (int it = 0; it < items; ++it) {
      const int s = it % kStages;
      const uint32_t q = sQ + s * C::kQBytes, o = sO + s * C::kQBytes, ds = sDS + (it & 1) * C::kDSBytes;
      stage_ready(it);
      issue_scores(it, false);
      scores_to_grads(it, [&] { wgmma_wait<0>(); });
      pack_grads();
      pin_products();
      if constexpr (C::kOverlap) {
        wgmma_fence();
        issue_ab(dva, pa, o);
        wgmma_commit();
        store_ds(ds);
        both_halves_stored();
        wgmma_fence(); /* dq's registers were last read by the previous item's atomics */
        issue_dq(ds);
        wgmma_commit();
        issue_ab(dka, dsa, q);
        wgmma_commit();
        wgmma_wait<1>(); /* dV and dQ have landed; dK's products run under the atomics */
        pin(dq);
      } else {
        store_ds(ds);
        wgmma_fence();
        issue_ab(dva, pa, o);
        issue_ab(dka, dsa, q);
        wgmma_commit();
        both_halves_stored();
        wgmma_fence();
        issue_dq(ds);
        wgmma_commit();
        wgmma_wait<0>();
        pin(dq);
      }
      add_dq(it);
      if constexpr (C::kOverlap) wgmma_wait<0>();
      pin_products();
      pin(dq);
      mbar_arrive(empty(s)); /* this thread's reads of stage s and its products are done */
    }
  }

  /* the last addition must have read the staging before the CTA's shared memory goes */
  if (C::kDqTiled && !C::kSplit && lane == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");

  /* this warp's 16 keys of dK (times the softmax scale) and dV, columns kDC cw .. with kSplit */
  const int k_row = n0 + key0 + wq * 16, col0 = C::kSplit ? cw * kDC : 0;
  const int64_t k0 = seq_of(p, b).k0; /* read again: held across the loop it cost registers */
  T *gdk = static_cast<T *>(p.dk_out) + b * p.dk_b + (k0 + k_row) * p.dk_r + g * p.dk_h + col0;
  T *gdv = static_cast<T *>(p.dv_out) + b * p.dv_b + (k0 + k_row) * p.dv_r + g * p.dv_h + col0;
  const float scale[1][2] = {{p.scale, p.scale}}, one[1][2] = {{1.f, 1.f}};
  store_rows<T, 1, kDC / 8, false>(gdk, p.dk_r, dk, scale, lane, sq.len_k - k_row, kDC);
  store_rows<T, 1, kDC / 8, false>(gdv, p.dv_r, dv, one, lane, sq.len_k - k_row, kDC);
}

/* Why the sm90 backward cannot run p (a sentence), or NULL when it can. Dropout, bias (and dbias),
 * masks and segment ids stay on the atomic sm_80 backward: the forward's generic kernel, their
 * one sm90 path, loses to the sm_80 kernel at head dims 64 and 128 (kGenericDeclined), and
 * dropout's Philox words per score would bound this kernel likewise. */
static inline const char *sm90_bwd_unsupported(const attn_cuda_params &p) {
  if (p.d != p.dv || (p.d != 64 && p.d != 128 && p.d != 256))
    return "the sm90 backward has head dims 64, 128 and 256 with Dv = D only";
  if (p.dropout_p > 0.f || p.dbias != nullptr || generic_kernel(p))
    return "the sm90 backward has no dropout, bias, masks or segment ids, caps above 1024, or ALiBi under a scale "
           "that is not positive";
  if (p.dq_accum == nullptr) return "the sm90 backward needs the f32 dq workspace";
  const void *ptrs[4] = {p.q, p.k, p.v, p.dout};
  for (const void *ptr : ptrs)
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return "the sm90 backward needs 16-byte aligned q, k, v, dout";
  const int64_t strides[12] = {p.q_b, p.q_r, p.q_h, p.k_b, p.k_r, p.k_h, p.v_b, p.v_r, p.v_h, p.do_b, p.do_r, p.do_h};
  for (int64_t s : strides)
    if (s % 8 != 0 || s < 0) return "the sm90 backward needs q, k, v, dout strides that are multiples of 8 elements";
  /* What the tensor maps refuse, refused here so that such a problem takes the atomic backward: a
   * broadcast (stride 0) dimension of more than one index, and strides of 2^40 bytes or more. */
  const MapGeometry mg = map_geometry(p);
  const int64_t extents[12] = {mg.batch, mg.rows_q, p.heads_q, mg.batch, mg.rows_k, p.heads_kv,
                               mg.batch, mg.rows_k, p.heads_kv, mg.batch, mg.rows_q, p.heads_q};
  for (int i = 0; i < 12; ++i)
    if ((strides[i] == 0 && extents[i] > 1) || strides[i] >= ((int64_t)1 << 39))
      return "the sm90 backward needs q, k, v, dout without broadcast dimensions (stride 0) and with strides "
             "below 2^40 bytes";
  return nullptr;
}

/* Whether p's grid goes heads first (kHeadsFirst's note): under a causal mask without a left
 * window, where the grid's y holds p's key blocks. */
template <typename C> static inline bool bwd90_heads_first(const attn_cuda_params &p) {
  const bool causal = p.window_right >= 0 && p.window_left < 0;
  return C::kHeadsFirst && causal && (p.seqlen_k + C::kBN - 1) / C::kBN <= 65535;
}

/* The backward of p (p.delta computed, p.dq_accum the f32 workspace, p.dq_semaphore the counters
 * when kDeterministic): zeroes the workspace, runs bwd90_kernel<C, kMode, kDeterministic>, then
 * the dq conversion. */
template <typename C, int kMode, bool kDeterministic>
attn_status launch_bwd90_mode(const attn_cuda_params &p, cudaStream_t stream, char *why, size_t why_size) {
  static_assert(!kDeterministic || C::kDqTiled, "the ordered additions are the tiles' bulk reduce-adds");
  using T = typename C::T;
  constexpr bool kBf16 = std::is_same<T, __nv_bfloat16>::value;
  const MapGeometry mg = map_geometry(p);
  CUtensorMap tq, tk, tv, tdo;
  attn_status st;
  if ((st = make_token_map(&tq, p.q, kBf16, p.d, p.heads_q, mg.rows_q, mg.batch, p.q_h, p.q_r, p.q_b, C::kBM, why,
                           why_size)) != ATTN_STATUS_OK ||
      (st = make_token_map(&tdo, p.dout, kBf16, p.d, p.heads_q, mg.rows_q, mg.batch, p.do_h, p.do_r, p.do_b, C::kBM,
                           why, why_size)) != ATTN_STATUS_OK ||
      (st = make_token_map(&tk, p.k, kBf16, p.d, p.heads_kv, mg.rows_k, mg.batch, p.k_h, p.k_r, p.k_b, C::kBN, why,
                           why_size)) != ATTN_STATUS_OK ||
      (st = make_token_map(&tv, p.v, kBf16, p.d, p.heads_kv, mg.rows_k, mg.batch, p.v_h, p.v_r, p.v_b, C::kBN, why,
                           why_size)) != ATTN_STATUS_OK)
    return st;
  const int64_t dq_floats =
      C::kDqTiled ? ATTN_CUDA_SM90_DQ_FLOATS(p.heads_q, p.batch, p.seqlen_q, C::kD) : p.rows_q * p.heads_q * p.d;
  if (dq_floats > 0) ATTN_CUDA_CHECK(cudaMemsetAsync(p.dq_accum, 0, (size_t)dq_floats * sizeof(float), stream));
  const int64_t counters = ATTN_CUDA_SM90_DQ_SLICES(p.heads_q, p.batch, p.seqlen_q);
  if (kDeterministic && counters > 0)
    ATTN_CUDA_CHECK(cudaMemsetAsync(p.dq_semaphore, 0, (size_t)counters * sizeof(int32_t), stream));
  auto kernel = bwd90_kernel<C, kMode, kDeterministic>;
  ATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::kSmem));
  /* the deterministic order has key block n wait for n - 1 of the same head and sequence, which
   * the hardware's in-order dispatch of x-major block indices has started in either grid */
  const int64_t key_blocks = (p.seqlen_k + C::kBN - 1) / C::kBN;
  const bool heads_first = bwd90_heads_first<C>(p);
  const dim3 grid = heads_first ? dim3(p.heads_kv, (unsigned)key_blocks, p.batch)
                                : dim3((unsigned)key_blocks, p.heads_kv, p.batch);
  if (key_blocks > 0) {
    kernel<<<grid, C::kThreads, C::kSmem, stream>>>(p, tq, tk, tv, tdo, heads_first);
    ATTN_CUDA_CHECK(cudaGetLastError());
  }
  const int64_t n = (int64_t)p.batch * p.seqlen_q * p.heads_q * (p.d / 2);
  if (n > 0) {
    if constexpr (C::kDqTiled) {
      const int64_t tiles = (int64_t)p.heads_q * p.batch * ((p.seqlen_q + C::kBM - 1) / C::kBM);
      const int grid = (int)(tiles > 65535 ? 65535 : tiles);
      if (dq_rows_vec16(p)) dq_tiles_convert_kernel<T, C::kD, true><<<grid, 256, 0, stream>>>(p);
      else dq_tiles_convert_kernel<T, C::kD, false><<<grid, 256, 0, stream>>>(p);
    } else {
      const int64_t blocks = (n + 255) / 256;
      dq_convert_kernel<T><<<(int)(blocks > 65535 ? 65535 : blocks), 256, 0, stream>>>(p);
    }
    ATTN_CUDA_CHECK(cudaGetLastError());
  }
  return ATTN_STATUS_OK;
}

/* The kernel that computes p's scores (Bwd90Mode). */
static inline Bwd90Mode bwd90_mode(const attn_cuda_params &p) {
  return p.softcap > 0.f ? kBwdCap : p.alibi != nullptr ? kBwdAlibi : kBwdPlain;
}

/* Runs p on configuration C: the kernel of its mode, deterministic where p.dq_semaphore is set. */
template <typename C> attn_status launch_bwd90(const attn_cuda_params &p, cudaStream_t stream, char *why, size_t why_size) {
  const char *no = sm90_bwd_unsupported(p);
  if (no == nullptr && p.d != C::kD) no = "the sm90 backward was asked for another head dim";
  if (no == nullptr && p.dq_semaphore != nullptr && !C::kDqTiled) no = "the deterministic sm90 backward needs kDqTiled";
  if (no != nullptr) {
    snprintf(why, why_size, "%s", no);
    return ATTN_STATUS_UNSUPPORTED;
  }
  const bool det = p.dq_semaphore != nullptr;
  switch (bwd90_mode(p)) {
  case kBwdPlain:
    return det ? launch_bwd90_mode<C, kBwdPlain, C::kDqTiled>(p, stream, why, why_size)
               : launch_bwd90_mode<C, kBwdPlain, false>(p, stream, why, why_size);
  case kBwdAlibi:
    return det ? launch_bwd90_mode<C, kBwdAlibi, C::kDqTiled>(p, stream, why, why_size)
               : launch_bwd90_mode<C, kBwdAlibi, false>(p, stream, why, why_size);
  default:
    return det ? launch_bwd90_mode<C, kBwdCap, C::kDqTiled>(p, stream, why, why_size)
               : launch_bwd90_mode<C, kBwdCap, false>(p, stream, why, why_size);
  }
}

} // namespace sm90
} // namespace attn_cuda

#endif /* ATTN_IMPL_CUDA_SM90_SM90_BWD_CUH */
