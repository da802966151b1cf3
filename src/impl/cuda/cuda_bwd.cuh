/*
 * src/impl/cuda/cuda_bwd.cuh - the backward kernels.
 *
 * The default ("deterministic") backward pass is two kernels that never write the same element,
 * so it is deterministic by construction and needs no atomics:
 *
 *   dK/dV: one CTA per (key block, KV head, batch) keeps K and V in shared memory and walks every
 *          query head of its GQA group and every query block the band allows, so dK and dV of a
 *          group are summed in registers (f32) and written once. Per query block it computes the
 *          transposed products S^T = K Q^T and dP^T = V dO^T (keys on rows, 32 per warp), turns
 *          them into P'^T and dS^T (lse and Delta of the warp's query columns in registers),
 *          stages those in shared memory, and accumulates dV += P'^T dO and dK += dS^T Q.
 *   dQ:    one CTA per (query block, query head, batch), the forward's schedule: S = Q K^T,
 *          dP = dO V^T, dS, dQ += dS K accumulated in f32 registers; it also adds dS into the
 *          f32 dbias accumulator when dbias is asked for.
 *
 * The "atomic" configuration is FlashAttention-2's one kernel: the dK/dV kernel also computes
 * dQ += dS K for each query block it visits and adds it into an f32 workspace with atomics (5
 * matrix products instead of 7; the order of the additions, hence the last bits of dq, varies
 * from run to run); a small kernel then scales and rounds it into dq. Its atomics go out between
 * dK's products, from one base address per warp (see the comment there: both choices came from
 * ncu's per-instruction stall samples).
 *
 * Each kernel is compiled with every feature (kFeat) and without (no per-element function,
 * dropout, dbias, zero-padded head dim: the common case, with fewer registers and no branches),
 * the latter twice: plain and with the soft cap (kCap), which costs it two special-function
 * instructions per score (sinks need nothing here: see run_bwd).
 * Loads overlap products: the dQ kernel double-buffers K and V; the dK/dV kernel loads dO of the
 * next query block while it computes dK and Q while it computes dP of the next block, or, with two
 * stages (the atomic configuration's feature-free kernel where shared memory allows), loads both
 * a whole query block ahead.
 *
 * Both recompute P from lse (a row with lse = -inf contributes nothing: its lse is read as +inf so
 * every P is 0) and Delta = rowsum(dout * out), which a small kernel computes first.
 */
#ifndef ATTN_IMPL_CUDA_CUDA_BWD_CUH
#define ATTN_IMPL_CUDA_CUDA_BWD_CUH

#include <type_traits>

#include "impl/cuda/cuda_check.cuh"
#include "impl/cuda/cuda_common.cuh"
#include "impl/cuda/cuda_traits.h"

namespace attn_cuda {

/* Row index of (b, i) in the delta workspace and in the dense dbias accumulator. */
__device__ __forceinline__ int64_t delta_row(const attn_cuda_params &p, const Seq &s, int b, int i) {
  return p.varlen == ATTN_CUDA_VARLEN_PACKED ? s.q0 + i : (int64_t)b * p.seqlen_q + i;
}

__device__ __forceinline__ int64_t dbias_index(const attn_cuda_params &p, const Head &r, int i, int j) {
  const int64_t *s = p.bias_shape;
  int64_t bb = s[0] == 1 ? 0 : r.b;
  int64_t hh = s[1] == 1 ? 0 : (p.bias_head_mode == 2 ? r.g : r.h);
  int64_t ii = s[2] == 1 ? 0 : i, jj = s[3] == 1 ? 0 : j;
  return ((bb * s[1] + hh) * s[2] + ii) * s[3] + jj;
}

/* Steps 1-6 backwards for one element (i, j) in the feature kernels: P recomputed from lse2 (the
 * row's lse in log2 units, +inf for a row with nothing visible), dS = P (dP - Delta) with dP =
 * keep ? dP' / (1 - p) : 0 and the soft cap's derivative, and P' = keep ? P / (1 - p) : 0 (what
 * dV sees). Without kCheck the element is known visible with no per-element function. add_dbias:
 * dS is also added into the f32 dbias accumulator when one is asked for. */
struct ElemGrad {
  float p_kept, ds;
};
template <bool kCheck>
__device__ __forceinline__ ElemGrad grad_element(const attn_cuda_params &p, const Head &hd, int i, int j,
                                                 float dot, float dp, float lse2, float delta, bool keep,
                                                 bool add_dbias) {
  float x, y = 0.f;
  bool vis = true;
  if (!kCheck) x = dot * p.scale;
  else {
    vis = visible(p, hd, i, j);
    x = vis ? logit(p, hd, i, j, dot, &y) : 0.f;
  }
  const float P = vis ? ex2(at_most_zero(x * kLog2e - lse2)) : 0.f;
  float ds = P * ((keep ? dp * p.keep_scale : 0.f) - delta);
  if (p.softcap > 0.f) ds *= softcap_slope(y);
  if (add_dbias && p.dbias_accum != nullptr && vis && P != 0.f)
    atomicAdd(p.dbias_accum + dbias_index(p, hd, i, j), ds);
  return {keep ? P * p.keep_scale : 0.f, ds};
}

/* Whether dropout keeps key j of the row whose Philox words (for j's group of four) are words. */
__device__ __forceinline__ bool kept(const attn_cuda_params &p, const uint32_t words[4], int j) {
  return p.dropout_p <= 0.f || words[j & 3] >= p.drop_threshold;
}

/* The feature-free kernels' element (i, j): P recomputed from the raw dot product and lse2, and
 * dS = P (dP - Delta), times the soft cap's derivative with kCap; both 0 for a key outside the
 * band (visible = false). */
template <bool kCap>
__device__ __forceinline__ ElemGrad plain_grad(float dot, float dp, float lse2, float delta, float scale_log2,
                                               const SoftCap &cap, bool visible) {
  float slope = 1.f;
  float P = ex2(at_most_zero((kCap ? cap.logit2(dot, &slope) : dot * scale_log2) - lse2));
  if (!visible) P = 0.f;
  return {P, kCap ? P * (dp - delta) * slope : P * (dp - delta)};
}

/* ---- dQ ---------------------------------------------------------------------------------------- */

template <typename T, typename C, bool kFeat, bool kCap>
__global__ void __launch_bounds__(C::kThreads) bwd_dq_kernel(const __grid_constant__ attn_cuda_params p) {
  static_assert(!(kFeat && kCap), "the feature kernels have the soft cap in logit()");
  constexpr int kD = C::kD, kBM = C::kBM, kBN = C::kBN, kS = C::kS, kThreads = C::kThreads, kMT = C::kMT;
  constexpr int kNT = kBN / 8, kDT = kD / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  T *sQ = reinterpret_cast<T *>(smem);
  T *sO = sQ + kBM * kS;  /* dout */
  T *sK0 = sO + kBM * kS; /* K, V: two stages each */
  T *sV0 = sK0 + 2 * kBN * kS;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int b = blockIdx.z, h = blockIdx.y, m0 = blockIdx.x * kBM;
  const Seq sq = seq_of(p, b);
  if (m0 >= sq.len_q) return;
  const Head hd = head_of(p, sq, b, h);
  const int m_last = min(m0 + kBM, sq.len_q) - 1;
  int n_lo, n_hi;
  key_block_range(p, hd, m0, m_last, kBN, n_lo, n_hi);

  const T *gq = static_cast<const T *>(p.q) + b * p.q_b + (sq.q0 + m0) * p.q_r + h * p.q_h;
  const T *gdo = static_cast<const T *>(p.dout) + b * p.do_b + (sq.q0 + m0) * p.do_r + h * p.do_h;
  const T *gk = static_cast<const T *>(p.k) + b * p.k_b + sq.k0 * p.k_r + hd.g * p.k_h;
  const T *gv = static_cast<const T *>(p.v) + b * p.v_b + sq.k0 * p.v_r + hd.g * p.v_h;

  load_tile<kBM, kD, kThreads>(sQ, gq, p.q_r, sq.len_q - m0, p.d, p.q, tid);
  load_tile<kBM, kD, kThreads>(sO, gdo, p.do_r, sq.len_q - m0, p.dv, p.dout, tid);
  if (n_lo < n_hi) {
    load_tile<kBN, kD, kThreads>(sK0, gk + (int64_t)n_lo * kBN * p.k_r, p.k_r, sq.len_k - n_lo * kBN, p.d, p.k, tid);
    load_tile<kBN, kD, kThreads>(sV0, gv + (int64_t)n_lo * kBN * p.v_r, p.v_r, sq.len_k - n_lo * kBN, p.dv, p.v, tid);
  }
  cp_async_commit();

  const int wrow = warp * 16 * kMT; /* this warp's kMT m-tiles of 16 rows */
  /* this lane's ldmatrix rows: Q and dO as A (this warp's rows), K and V as B, K transposed */
  constexpr uint32_t kE = sizeof(T), kPitch = kS * kE;
  const uint32_t uQ = smem_u32(sQ) + wrow * kPitch + lane_a<T, kPitch>(lane);
  const uint32_t uO = smem_u32(sO) + wrow * kPitch + lane_a<T, kPitch>(lane);
  const uint32_t lane_k = lane_b<T, kPitch>(lane), lane_kt = lane_bt<T, kPitch>(lane);
  float lse2[kMT][2], delta[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      int i = m0 + wrow + mt * 16 + (lane >> 2) + hf * 8;
      lse2[mt][hf] = INFINITY, delta[mt][hf] = 0.f;
      if (i < sq.len_q) {
        float l = p.lse[b * p.lse_b + h * p.lse_h + (sq.q0 + i) * p.lse_r];
        lse2[mt][hf] = l == -INFINITY ? INFINITY : l * kLog2e;
        delta[mt][hf] = p.delta[h * p.rows_q + delta_row(p, sq, b, i)];
      }
    }

  float acc[kMT][kDT][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][dt][e] = 0.f;

  const int nk = kFeat ? (p.d + 15) / 16 : kD / 16, nv = kFeat ? (p.dv + 15) / 16 : kD / 16;
  const float scale_log2 = p.scale * kLog2e;
  const SoftCap cap(p); /* read only with kCap */
  for (int n = n_lo; n < n_hi; ++n) {
    const int n0 = n * kBN;
    const T *sK = sK0 + ((n - n_lo) & 1) * kBN * kS, *sV = sV0 + ((n - n_lo) & 1) * kBN * kS;
    cp_async_wait_all();
    __syncthreads(); /* K(n), V(n) have landed; every warp is done with the other stage */
    if (n + 1 < n_hi) {
      T *nK = sK0 + ((n + 1 - n_lo) & 1) * kBN * kS, *nV = sV0 + ((n + 1 - n_lo) & 1) * kBN * kS;
      copy_tile<kBN, kD, kThreads>(nK, gk + (int64_t)(n0 + kBN) * p.k_r, p.k_r, sq.len_k - n0 - kBN, p.d, tid);
      copy_tile<kBN, kD, kThreads>(nV, gv + (int64_t)(n0 + kBN) * p.v_r, p.v_r, sq.len_k - n0 - kBN, p.dv, tid);
      cp_async_commit();
    }

    float s[kMT][kNT][4], dp[kMT][kNT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = dp[mt][nt][e] = 0.f;
    /* S = Q K^T, dP' = dO V^T (this warp's rows against the block's keys) */
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      if (kk < nk) mma_abt<T, kMT, kBN, kPitch, kPitch>(s, uQ + kk * 16 * kE, smem_u32(sK) + lane_k + kk * 16 * kE);
      if (kk < nv) mma_abt<T, kMT, kBN, kPitch, kPitch>(dp, uO + kk * 16 * kE, smem_u32(sV) + lane_k + kk * 16 * kE);
    }

    /* dS = P (dP - Delta), with dP = keep ? dP' / (1 - p) : 0 and the soft cap's derivative.
     * Tiles inside the band without per-element work take the branch-free copy (kCheck = false). */
    const bool fast = (!kFeat || !p.elementwise) && band_full(p, hd, m0, m_last, n0, kBN);
    auto scores_to_ds = [&](auto check) {
      constexpr bool kCheck = decltype(check)::value;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int i = m0 + wrow + mt * 16 + (lane >> 2) + hf * 8;
          const int j0 = n0 + nt * 8 + (lane & 3) * 2;
          if constexpr (kFeat) {
            uint32_t words[4] = {0, 0, 0, 0};
            if (p.dropout_p > 0.f) philox_words(p, b, h, i, j0, words);
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int e = 2 * hf + c, j = j0 + c;
              s[mt][nt][e] = grad_element<kCheck>(p, hd, i, j, s[mt][nt][e], dp[mt][nt][e], lse2[mt][hf],
                                                  delta[mt][hf], kept(p, words, j), true)
                                 .ds;
            }
          } else {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int e = 2 * hf + c;
              s[mt][nt][e] = plain_grad<kCap>(s[mt][nt][e], dp[mt][nt][e], lse2[mt][hf], delta[mt][hf], scale_log2,
                                              cap, !kCheck || visible_band(p, hd, i, j0 + c))
                                 .ds;
            }
          }
        }
    };
    if (fast) scores_to_ds(std::false_type{});
    else scores_to_ds(std::true_type{});

    /* dQ += dS K (each K fragment feeds kMT mma) */
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) pack_a<T, kNT>(a[mt], s[mt], kk);
      mma_ab_regs<T, kMT, kD, kPitch>(acc, a, smem_u32(sK) + lane_kt + kk * 16 * kPitch, nk);
    }
  }
  cp_async_wait_all();

  T *gdq = static_cast<T *>(p.dq_out) + b * p.dq_b + (sq.q0 + m0 + wrow) * p.dq_r + h * p.dq_h;
  float scale[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) scale[mt][0] = scale[mt][1] = p.scale;
  store_rows<T, kMT, kDT, kFeat>(gdq, p.dq_r, acc, scale, lane, sq.len_q - m0 - wrow, p.d);
}

/* ---- dK, dV (and dQ with atomics) --------------------------------------------------------------- */

template <typename T, typename C, bool kFeat, bool kAtomic, bool kCap>
__global__ void __launch_bounds__(C::kThreads) bwd_dkv_kernel(const __grid_constant__ attn_cuda_params p) {
  static_assert(!(kFeat && kCap), "the feature kernels have the soft cap in logit()");
  constexpr int kD = C::kD, kBM = C::kBM, kBN = C::kBN, kS = C::kS, kP = C::kP;
  constexpr int kThreads = C::kThreads, kWN = C::kWN, kQW = C::kQW, kWN2 = C::kWN2, kDW = C::kDW2;
  constexpr int kKT = C::kKT1;
  constexpr int kQNT = kQW / 8, kDNT = kDW / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  T *sK = reinterpret_cast<T *>(smem);
  T *sV = sK + kBN * kS;
  constexpr int kStages = C::kStages;
  T *sQ0 = sV + kBN * kS;           /* Q: kStages buffers */
  T *sO0 = sQ0 + kStages * kBM * kS; /* dout: kStages buffers */
  T *sPt = sO0 + kStages * kBM * kS; /* P'^T [kBN][kP] */
  T *sSt = sPt + kBN * kP; /* dS^T */
  /* [2][kBM] of {lse2, Delta} (this item's, the next's), a row's pair side by side so that one
   * 16-byte load gives a lane both of its two adjacent query columns */
  float2 *sStats = reinterpret_cast<float2 *>(sSt + kBN * kP);
  static_assert(kThreads >= kBM, "one thread per query row loads lse and Delta");

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int b = blockIdx.z, g = blockIdx.y, n0 = blockIdx.x * kBN;
  const Seq sq = seq_of(p, b);
  if (n0 >= sq.len_k) return;
  const int n_last = min(n0 + kBN, sq.len_k) - 1;
  const int kn = (warp % kWN) * 16 * kKT;    /* phase 1: this warp's 16 * kKT keys */
  const int qm = (warp / kWN) * kQW;         /* phase 1: its query columns */
  const int kn2 = (warp % kWN2) * 32;        /* phase 2: its 32 keys (two m-tiles) */
  const int dc0 = (warp / kWN2) * kDW;       /* and its head-dim columns */
  /* this lane's ldmatrix rows (bytes from a tile's start); products add compile-time offsets.
   * Phase 1: A = keys of K / V, B = queries of Q / dO. Phase 2: A = keys of P'^T / dS^T, B =
   * query rows of dO / Q read transposed, from this warp's first column dc0. */
  constexpr uint32_t kE = sizeof(T), kPitch = kS * kE, kPitchP = kP * kE;
  const uint32_t lane_a1 = kn * kPitch + lane_a<T, kPitch>(lane);
  const uint32_t lane_b1 = qm * kPitch + lane_b<T, kPitch>(lane);
  const uint32_t lane_p = kn2 * kPitchP + lane_a<T, kPitchP>(lane);
  const uint32_t lane_t = dc0 * kE + lane_bt<T, kPitch>(lane);

  const T *gk = static_cast<const T *>(p.k) + b * p.k_b + (sq.k0 + n0) * p.k_r + g * p.k_h;
  const T *gv = static_cast<const T *>(p.v) + b * p.v_b + (sq.k0 + n0) * p.v_r + g * p.v_h;

  /* The (query head, query block) items this key block visits: every head of the group, each
   * over the same query blocks (the band depends on the lengths only). */
  const Head hd0 = head_of(p, sq, b, g * p.group);
  int m_lo, m_hi;
  query_block_range(p, hd0, n0, n_last, kBM, m_lo, m_hi);
  const int nm = max(m_hi - m_lo, 0), items = nm * p.group;
  /* An item is (query head h, query block mb); they run head by head, blocks m_lo .. m_hi - 1. */
  auto q_of = [&](int h, int mb) {
    return static_cast<const T *>(p.q) + b * p.q_b + (sq.q0 + (int64_t)mb * kBM) * p.q_r + h * p.q_h;
  };
  auto do_of = [&](int h, int mb) {
    return static_cast<const T *>(p.dout) + b * p.do_b + (sq.q0 + (int64_t)mb * kBM) * p.do_r + h * p.do_h;
  };

  /* lse and Delta of row tid of item it, for the threads tid < kBM (lse -inf for a row past the
   * sequence, as for one without any visible key); to_log2 turns lse into the log2 units the dS
   * code takes, +inf for such a row, so that its P is 0. */
  auto row_stats = [&](int h, int mb) {
    const int i = mb * kBM + tid;
    float2 st = make_float2(-INFINITY, 0.f);
    if (i < sq.len_q) {
      st.x = p.lse[b * p.lse_b + h * p.lse_h + (sq.q0 + i) * p.lse_r];
      st.y = p.delta[h * p.rows_q + delta_row(p, sq, b, i)];
    }
    return st;
  };
  /* a separate step from the loads, so that their latency is waited for only when the values are
   * stored (at the end of the item before theirs) */
  auto to_log2 = [](float2 st) {
    st.x = st.x == -INFINITY ? INFINITY : st.x * kLog2e;
    return st;
  };
  if (items > 0 && tid < kBM) sStats[tid] = to_log2(row_stats(g * p.group, m_lo));

  /* cp.async groups, one stage: {K, V, dO(0)}, {Q(0)}; then per item {dO(it+1)}, {Q(it+1)}, each
   * issued once the item's last reader of that buffer is done. Two stages: {K, V, dO(0), Q(0)},
   * then per item {dO(it+1), Q(it+1)} into the other buffers as the item starts. */
  load_tile<kBN, kD, kThreads>(sK, gk, p.k_r, sq.len_k - n0, p.d, p.k, tid);
  load_tile<kBN, kD, kThreads>(sV, gv, p.v_r, sq.len_k - n0, p.dv, p.v, tid);
  if (items > 0) {
    const int m0 = m_lo * kBM;
    load_tile<kBM, kD, kThreads>(sO0, do_of(g * p.group, m_lo), p.do_r, sq.len_q - m0, p.dv, p.dout, tid);
    if (kStages == 1) cp_async_commit();
    load_tile<kBM, kD, kThreads>(sQ0, q_of(g * p.group, m_lo), p.q_r, sq.len_q - m0, p.d, p.q, tid);
  }
  cp_async_commit();

  float adk[2][kDNT][4], adv[2][kDNT][4];
#pragma unroll
  for (int kt = 0; kt < 2; ++kt)
#pragma unroll
    for (int dt = 0; dt < kDNT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) adk[kt][dt][e] = adv[kt][dt][e] = 0.f;

  const int nk = kFeat ? (p.d + 15) / 16 : kD / 16, nv = kFeat ? (p.dv + 15) / 16 : kD / 16;
  const float scale_log2 = p.scale * kLog2e;
  const SoftCap cap(p); /* read only with kCap */
  /* The next item's Q and dO tiles: this thread's copy offsets are computed once, and the tiles'
   * first rows advance by one query block, or from a head's last block to the next head's first. */
  const TileCopy<kBM, kD, kThreads, T> copy_q(tid, p.q_r), copy_do(tid, p.do_r);
  const T *gq_next = q_of(g * p.group, m_lo), *gdo_next = do_of(g * p.group, m_lo);
  int h = g * p.group, mb = m_lo; /* this item */
  for (int it = 0; it < items; ++it) {
    const Head hd = head_of(p, sq, b, h);
    const int m0 = mb * kBM, m_last = min(m0 + kBM, sq.len_q) - 1;
    const bool wrap = mb + 1 >= m_hi; /* the next item starts the next head */
    const int h1 = wrap ? h + 1 : h, mb1 = wrap ? m_lo : mb + 1;
    gq_next += wrap ? p.q_h - (int64_t)(nm - 1) * kBM * p.q_r : (int64_t)kBM * p.q_r;
    gdo_next += wrap ? p.do_h - (int64_t)(nm - 1) * kBM * p.do_r : (int64_t)kBM * p.do_r;
    /* Tiles inside the band without per-element work take the branch-free copy of the dS code;
     * decided here so that the test is not left between the products and that code. */
    const bool fast = (!kFeat || !p.elementwise) && band_full(p, hd, m0, m_last, n0, kBN);
    /* the next item's lse and Delta: loaded now, stored at the end of this item, so their
     * latency hides behind its products */
    float2 next_stats = make_float2(-INFINITY, 0.f);
    if (it + 1 < items && tid < kBM) next_stats = row_stats(h1, mb1);
    const float2 *stats_it = sStats + (it & 1) * kBM;
    T *sQ = sQ0 + (kStages == 2 ? (it & 1) * kBM * kS : 0);
    T *sO = sO0 + (kStages == 2 ? (it & 1) * kBM * kS : 0);
    if constexpr (kStages == 1) {
      asm volatile("cp.async.wait_group 1;\n" ::: "memory");
      __syncthreads(); /* K, V, dO(it) have landed (Q(it) may be in flight) */
    } else {
      cp_async_wait_all();
      __syncthreads(); /* dO(it), Q(it) have landed; every warp is done with item it - 1 */
      if (it + 1 < items) {
        const int o = ((it + 1) & 1) * kBM * kS, rows = sq.len_q - mb1 * kBM;
        copy_do(smem_u32(sO0 + o), sO0 + o, gdo_next, p.do_r, rows, p.dv);
        copy_q(smem_u32(sQ0 + o), sQ0 + o, gq_next, p.q_r, rows, p.d);
      }
      cp_async_commit();
    }

    float st[kKT][kQNT][4], dpt[kKT][kQNT][4];
#pragma unroll
    for (int kt = 0; kt < kKT; ++kt)
#pragma unroll
      for (int nt = 0; nt < kQNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[kt][nt][e] = dpt[kt][nt][e] = 0.f;
    /* acc += A(this warp's 16 * kKT keys of sA) B(its kQW queries of sB)^T, one k slice */
    auto transposed_step = [&](float (&acc)[kKT][kQNT][4], const T *sA, const T *sB, int kk) {
      mma_abt<T, kKT, kQW, kPitch, kPitch>(acc, smem_u32(sA) + lane_a1 + kk * 16 * kE,
                                          smem_u32(sB) + lane_b1 + kk * 16 * kE);
    };
    /* The lse and Delta of this lane's 2 * kQNT query columns, in registers: read between the
     * stores of P'^T and dS^T they could alias them, and each would be reloaded after every
     * store, one serial chain through the whole tile. */
    float4 qstat[kQNT]; /* {lse2, Delta} of columns c and c + 1 */
#pragma unroll
    for (int nt = 0; nt < kQNT; ++nt)
      qstat[nt] = *reinterpret_cast<const float4 *>(stats_it + qm + nt * 8 + (lane & 3) * 2);
    /* phase 1: dP'^T = V dO^T and S^T = K Q^T, for 16 * kKT keys x kQW queries. Both
     * products step through the head dimension together when Q(it) is already there (two
     * stages), so twice as many independent mma hide each other's latency. */
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      if (kk < nv) transposed_step(dpt, sV, sO, kk);
      if (kStages == 2 && kk < nk) transposed_step(st, sK, sQ, kk);
    }
    if constexpr (kStages == 1) {
      cp_async_wait_all();
      __syncthreads(); /* Q(it) has landed */
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk)
        if (kk < nk) transposed_step(st, sK, sQ, kk);
    }
    /* P'^T and dS^T; tiles inside the band without per-element work take the branch-free copy
     * of this code (kCheck = false) */
    auto probabilities = [&](auto check) {
      constexpr bool kCheck = decltype(check)::value;
#pragma unroll
      for (int kt = 0; kt < kKT; ++kt)
#pragma unroll
        for (int nt = 0; nt < kQNT; ++nt)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int kr = kn + kt * 16 + (lane >> 2) + hf * 8; /* key row in the block */
            const int j = n0 + kr;
            float pv[2], dsv[2];
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int e = 2 * hf + c;
              const int i = m0 + qm + nt * 8 + (lane & 3) * 2 + c;
              const float lse2 = c == 0 ? qstat[nt].x : qstat[nt].z;
              const float delta = c == 0 ? qstat[nt].y : qstat[nt].w;
              if constexpr (kFeat) {
                uint32_t words[4] = {0, 0, 0, 0};
                if (p.dropout_p > 0.f) philox_words(p, b, h, i, j, words);
                /* dbias here only in the atomic configuration (the dQ kernel adds it otherwise) */
                const ElemGrad g = grad_element<kCheck>(p, hd, i, j, st[kt][nt][e], dpt[kt][nt][e], lse2,
                                                        delta, kept(p, words, j), kAtomic);
                pv[c] = g.p_kept, dsv[c] = g.ds;
              } else {
                const ElemGrad g = plain_grad<kCap>(st[kt][nt][e], dpt[kt][nt][e], lse2, delta, scale_log2, cap,
                                                    !kCheck || visible_band(p, hd, i, j));
                pv[c] = g.p_kept, dsv[c] = g.ds;
              }
            }
            const int col = qm + nt * 8 + (lane & 3) * 2;
            *reinterpret_cast<uint32_t *>(sPt + kr * kP + col) = Elem<T>::pack(pv[0], pv[1]);
            *reinterpret_cast<uint32_t *>(sSt + kr * kP + col) = Elem<T>::pack(dsv[0], dsv[1]);
          }
    };
    if (fast) probabilities(std::false_type{});
    else probabilities(std::true_type{});
    __syncthreads(); /* P'^T, dS^T are complete */

    /* phase 2: dV += P'^T dO for 32 keys x kDW columns (each dO fragment feeds two mma) */
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk)
      mma_ab<T, 2, kDW, kPitchP, kPitch>(adv, smem_u32(sPt) + lane_p + kk * 16 * kE,
                                         smem_u32(sO) + lane_t + kk * 16 * kPitch, kFeat ? (p.dv - dc0 + 15) / 16 : kDW / 16);
    if constexpr (kStages == 1) {
      __syncthreads(); /* every warp is done with dO(it) */
      if (it + 1 < items) copy_do(smem_u32(sO), sO, gdo_next, p.do_r, sq.len_q - mb1 * kBM, p.dv);
      cp_async_commit();
    }

    /* dK += dS^T Q, one slice of 16 query rows */
    auto dk_step = [&](int kk) {
      mma_ab<T, 2, kDW, kPitchP, kPitch>(adk, smem_u32(sSt) + lane_p + kk * 16 * kE,
                                         smem_u32(sQ) + lane_t + kk * 16 * kPitch, kFeat ? (p.d - dc0 + 15) / 16 : kDW / 16);
    };
    if constexpr (kAtomic) {
      /* dQ(rows of this block) += dS K, added into the f32 workspace. Warp w takes kQMT m-tiles
       * of query rows (row group w % kRowGroups) and a kCols-wide slice of columns, kQC at a
       * time. Two m-tiles where the columns split evenly: each K fragment then feeds two mma
       * (FlashAttention-2's 32 x 32 warp tile at D = 128). */
      constexpr int kQMT = kBM % 32 == 0 && C::kNW % (kBM / 32) == 0 && (kD / (C::kNW / (kBM / 32))) % 16 == 0 ? 2 : 1;
      constexpr int kRowGroups = kBM / (16 * kQMT), kDG = C::kNW / kRowGroups, kCols = kD / kDG;
      /* at most 64 / kQMT columns at a time: 32 accumulator registers */
      constexpr int kQC = kCols % (64 / kQMT) == 0 ? 64 / kQMT : kCols % 32 == 0 ? 32 : 16;
      static_assert(C::kNW % kRowGroups == 0 && kD % kDG == 0 && kCols % 16 == 0, "dQ split");
      const int qr0 = (warp % kRowGroups) * 16 * kQMT, c_base = (warp / kRowGroups) * kCols;
      const int ld = kFeat ? p.d : kD; /* the accumulator's row length: p.d */
      /* A = dS rows (queries) read transposed from dS^T; B = K read transposed, from c_base */
      const uint32_t lane_s = smem_u32(sSt) + qr0 * kE + lane_at<T, kPitchP>(lane);
      const uint32_t lane_k = smem_u32(sK) + c_base * kE + lane_bt<T, kPitch>(lane);
      /* this lane's first element of the workspace; the others are compile-time offsets from
       * it when ld = kD */
      float *lane_dq = p.dq_accum + ((int64_t)h * p.rows_q + delta_row(p, sq, b, m0)) * ld +
                       (qr0 + (lane >> 2)) * ld + c_base + (lane & 3) * 2;
      float aq[kQMT][kQC / 8][4];
      auto products = [&](int cc) {
#pragma unroll
        for (int mt = 0; mt < kQMT; ++mt)
#pragma unroll
          for (int dt = 0; dt < kQC / 8; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) aq[mt][dt][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < kBN / 16; ++kk)
          mma_ab<T, kQMT, kQC, kPitchP, kPitch, true>(aq, lane_s + kk * 16 * kPitchP,
                                                     lane_k + kk * 16 * kPitch + cc * kQC * kE, kQC / 16);
      };
      /* the atomics of one row group (m-tile mt, half hf) of column chunk cc */
      auto add_rows = [&](int cc, int mt, int hf, bool check_row) {
        const int r = qr0 + mt * 16 + (lane >> 2) + hf * 8;
        if (check_row && m0 + r >= sq.len_q) return;
#pragma unroll
        for (int dt = 0; dt < kQC / 8; ++dt) {
          const int c = c_base + cc * kQC + dt * 8 + (lane & 3) * 2;
          if (kFeat && c >= p.d) continue;
          float *dst = lane_dq + (mt * 16 + hf * 8) * ld + cc * kQC + dt * 8;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
          atomicAdd(reinterpret_cast<float2 *>(dst), make_float2(aq[mt][dt][2 * hf], aq[mt][dt][2 * hf + 1]));
#else
          atomicAdd(dst, aq[mt][dt][2 * hf]);
          atomicAdd(dst + 1, aq[mt][dt][2 * hf + 1]);
#endif
        }
      };
      /* A block wholly inside the sequence (the common case) adds without a test per row: with
       * one, ptxas recomputed the address per row group into registers the last group's atomics
       * were still reading, and waited for them (13% of the kernel's stall samples at D = 128,
       * 20% at D = 256). The last column chunk's atomics go a row group at a time between dK's
       * steps, so that they neither queue behind each other nor hand their registers straight
       * to dK's loads (each would wait until the atomic has read them). */
      constexpr int kGroups = 2 * kQMT, kSteps = kBM / 16, kChunks = kCols / kQC;
      auto add_chunk = [&](int cc, auto all_rows) {
#pragma unroll
        for (int grp = 0; grp < kGroups; ++grp) add_rows(cc, grp / 2, grp % 2, !decltype(all_rows)::value);
      };
      if (m0 + kBM <= sq.len_q && (!kFeat || c_base + (kChunks - 1) * kQC < p.d)) {
#pragma unroll
        for (int cc = 0; cc + 1 < kChunks; ++cc) {
          products(cc);
          add_chunk(cc, std::true_type{});
        }
        products(kChunks - 1);
#pragma unroll
        for (int kk = 0; kk < kSteps; ++kk) {
          dk_step(kk);
#pragma unroll
          for (int grp = 0; grp < kGroups; ++grp)
            if (grp * kSteps / kGroups == kk) add_rows(kChunks - 1, grp / 2, grp % 2, false);
        }
      } else {
#pragma unroll
        for (int cc = 0; cc < kChunks; ++cc) {
          if (kFeat && c_base + cc * kQC >= p.d) break;
          products(cc);
          add_chunk(cc, std::false_type{});
        }
#pragma unroll
        for (int kk = 0; kk < kSteps; ++kk) dk_step(kk);
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk) dk_step(kk);
    }
    if (it + 1 < items && tid < kBM) sStats[((it + 1) & 1) * kBM + tid] = to_log2(next_stats);
    if constexpr (kStages == 1) {
      __syncthreads(); /* every warp is done with Q(it), P'^T, dS^T */
      if (it + 1 < items) copy_q(smem_u32(sQ), sQ, gq_next, p.q_r, sq.len_q - mb1 * kBM, p.d);
      cp_async_commit();
    }
    h = h1, mb = mb1;
  }
  cp_async_wait_all();

  /* this warp's 32 keys x kDW columns of dK (times the softmax scale) and dV */
  T *gdk = static_cast<T *>(p.dk_out) + b * p.dk_b + (sq.k0 + n0 + kn2) * p.dk_r + g * p.dk_h + dc0;
  T *gdv = static_cast<T *>(p.dv_out) + b * p.dv_b + (sq.k0 + n0 + kn2) * p.dv_r + g * p.dv_h + dc0;
  const float scale[2][2] = {{p.scale, p.scale}, {p.scale, p.scale}}, one[2][2] = {{1.f, 1.f}, {1.f, 1.f}};
  store_rows<T, 2, kDNT, kFeat>(gdk, p.dk_r, adk, scale, lane, sq.len_k - n0 - kn2, p.d - dc0);
  store_rows<T, 2, kDNT, kFeat>(gdv, p.dv_r, adv, one, lane, sq.len_k - n0 - kn2, p.dv - dc0);
}

/* dq = scale * the f32 accumulator of the atomic configuration, for every row of dq (rows outside
 * the sequences hold 0 there). */
template <typename T>
__global__ void dq_convert_kernel(const __grid_constant__ attn_cuda_params p) {
  const int64_t n = p.rows_q * p.heads_q * (p.d / 2);
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += gridDim.x * (int64_t)blockDim.x) {
    const int64_t c = (e % (p.d / 2)) * 2, rest = e / (p.d / 2);
    const int64_t h = rest % p.heads_q, row = rest / p.heads_q;
    const float2 v = *reinterpret_cast<const float2 *>(p.dq_accum + (h * p.rows_q + row) * p.d + c);
    int64_t off;
    if (p.varlen == ATTN_CUDA_VARLEN_PACKED) off = row * p.dq_r;
    else off = (row / p.seqlen_q) * p.dq_b + (row % p.seqlen_q) * p.dq_r;
    *reinterpret_cast<uint32_t *>(static_cast<T *>(p.dq_out) + off + h * p.dq_h + c) =
        Elem<T>::pack(v.x * p.scale, v.y * p.scale);
  }
}

template <typename T, int kD, bool kFeat, bool kAtomic, bool kCap = false,
          typename Ckv = DkvCfg<T, kD, kAtomic ? BwdTraits<kD>::kNWa : BwdTraits<kD>::kNW,
                                kAtomic ? BwdTraits<kD>::kBNa : BwdTraits<kD>::kBN, BwdTraits<kD>::kBM>>
attn_status launch_bwd(const attn_cuda_params &p, cudaStream_t stream, char *why, size_t why_size) {
  using Tr = BwdTraits<kD>;
  auto kv = bwd_dkv_kernel<T, Ckv, kFeat, kAtomic, kCap>;
  ATTN_CUDA_CHECK(cudaFuncSetAttribute(kv, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)Ckv::kSmem));
  if (kAtomic && p.rows_q > 0)
    ATTN_CUDA_CHECK(cudaMemsetAsync(p.dq_accum, 0, (size_t)(p.rows_q * p.heads_q * p.d) * sizeof(float), stream));
  dim3 grid_kv((p.seqlen_k + Ckv::kBN - 1) / Ckv::kBN, p.heads_kv, p.batch);
  if (grid_kv.x > 0) {
    kv<<<grid_kv, Ckv::kThreads, Ckv::kSmem, stream>>>(p);
    ATTN_CUDA_CHECK(cudaGetLastError());
  }
  if constexpr (kAtomic) {
    const int64_t n = p.rows_q * p.heads_q * (p.d / 2);
    if (n > 0) {
      const int64_t blocks = (n + 255) / 256;
      dq_convert_kernel<T><<<(int)(blocks > 65535 ? 65535 : blocks), 256, 0, stream>>>(p);
      ATTN_CUDA_CHECK(cudaGetLastError());
    }
  } else {
    using Cq = std::conditional_t<kFeat, DqCfg<T, kD, Tr::kNWq, Tr::kBNq, 1>,
                                  DqCfg<T, kD, Tr::kNWq, Tr::kBNqf, Tr::kMTqf>>;
    auto q = bwd_dq_kernel<T, Cq, kFeat, kCap>;
    ATTN_CUDA_CHECK(cudaFuncSetAttribute(q, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)Cq::kSmem));
    dim3 grid_q((p.seqlen_q + Cq::kBM - 1) / Cq::kBM, p.heads_q, p.batch);
    if (grid_q.x > 0) {
      q<<<grid_q, Cq::kThreads, Cq::kSmem, stream>>>(p);
      ATTN_CUDA_CHECK(cudaGetLastError());
    }
  }
  return ATTN_STATUS_OK;
}

/* The feature-free kernels (kFeat = false; the soft cap in their kCap copy). p.dq_accum != NULL
 * selects the atomic configuration, whose kernel double-buffers Q and dO where the device's shared
 * memory allows (Hopper: yes; A100's 163 KB: no), with kBMa query rows per step. */
template <typename T, int kD, bool kCap>
attn_status run_bwd_plain(const attn_cuda_params &p, cudaStream_t stream, char *why, size_t why_size) {
  if (p.dq_accum == nullptr) return launch_bwd<T, kD, false, false, kCap>(p, stream, why, why_size);
  using Tr = BwdTraits<kD>;
  using C2 = DkvCfg<T, kD, Tr::kNWa, Tr::kBNa, Tr::kBMa, 2, 2>;
  using C1 = DkvCfg<T, kD, Tr::kNWa, Tr::kBNa, Tr::kBMa, 2, 1>;
  int dev = 0, smem = 0;
  ATTN_CUDA_CHECK(cudaGetDevice(&dev));
  ATTN_CUDA_CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if ((size_t)smem >= C2::kSmem) return launch_bwd<T, kD, false, true, kCap, C2>(p, stream, why, why_size);
  return launch_bwd<T, kD, false, true, kCap, C1>(p, stream, why, why_size);
}

/* The kernels with every feature only where the feature-free ones cannot (needs_generic): sinks
 * need nothing of the backward kernels (P comes from lse, which has them; dsinks has its own). */
template <typename T, int kD> attn_status run_bwd(const attn_cuda_params &p, cudaStream_t stream,
                                                  char *why, size_t why_size) {
  if (needs_generic(p, kD))
    return p.dq_accum != nullptr ? launch_bwd<T, kD, true, true>(p, stream, why, why_size)
                                 : launch_bwd<T, kD, true, false>(p, stream, why, why_size);
  return p.softcap > 0.f ? run_bwd_plain<T, kD, true>(p, stream, why, why_size)
                         : run_bwd_plain<T, kD, false>(p, stream, why, why_size);
}

} // namespace attn_cuda

#endif /* ATTN_IMPL_CUDA_CUDA_BWD_CUH */
