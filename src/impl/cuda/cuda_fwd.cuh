/*
 * src/impl/cuda/cuda_fwd.cuh - the forward kernel (FlashAttention-2's schedule on mma.sync).
 *
 * One CTA computes kBM query rows of one (batch, query head): Q stays in shared memory, and the
 * key blocks the causal / window band allows stream through one K and one V buffer: V(n) is
 * copied while S = Q K(n)^T is computed, and K(n+1) while the softmax and O += P V(n) are, so each
 * copy overlaps work. Each warp owns 16 * kMT rows; scores, the running max and sum, and the
 * output accumulator stay in registers (f32), and P is rounded to the input dtype only as the A
 * operand of the P V product. Sinks enter the running max and sum before the first key, once per
 * row. Only the key blocks at the band's edges test visibility per element; the output is
 * rescaled only when a row's exponent base moves (steps 4-5 below); CTAs are launched last query
 * block first, so under a causal band the longest ones start first.
 */
#ifndef ATTN_IMPL_CUDA_CUDA_FWD_CUH
#define ATTN_IMPL_CUDA_CUDA_FWD_CUH

#include "impl/cuda/cuda_check.cuh"
#include "impl/cuda/cuda_common.cuh"
#include "impl/cuda/cuda_traits.h"

namespace attn_cuda {

template <typename T, typename C, bool kFeat, bool kCap>
__global__ void __launch_bounds__(C::kThreads, C::kMinB) fwd_kernel(const __grid_constant__ attn_cuda_params p) {
  static_assert(!(kFeat && kCap), "the feature kernel has the soft cap in logit()");
  constexpr int kD = C::kD, kBM = C::kBM, kBN = C::kBN, kS = C::kS, kMT = C::kMT;
  constexpr int kNT = kBN / 8, kDT = kD / 8, kThreads = C::kThreads;
  constexpr uint32_t kE = sizeof(T); /* bytes per element */
  extern __shared__ __align__(16) unsigned char smem[];
  T *sQp = reinterpret_cast<T *>(smem), *sKp = sQp + kBM * kS, *sVp = sKp + kBN * kS;
  const uint32_t sQ = smem_u32(sQp), sK = smem_u32(sKp), sV = smem_u32(sVp);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  /* The last query blocks first: under a causal band they see the most keys, so the long CTAs
   * start early and the short ones fill the tail. */
  const int b = blockIdx.z, h = blockIdx.y, m0 = (gridDim.x - 1 - blockIdx.x) * kBM;
  const Seq sq = seq_of(p, b);
  if (m0 >= sq.len_q) return;
  const Head hd = head_of(p, sq, b, h);
  const int m_last = min(m0 + kBM, sq.len_q) - 1;
  int n_lo, n_hi, f_lo, f_hi;
  key_block_range(p, hd, m0, m_last, kBN, n_lo, n_hi);
  /* blocks [f_lo, f_hi) need no element-wise work: every key visible, no per-element function */
  full_block_range(p, hd, m0, m_last, kBN, n_lo, n_hi, f_lo, f_hi);
  if (kFeat && p.elementwise) f_lo = f_hi = n_lo;

  const T *gq = static_cast<const T *>(p.q) + b * p.q_b + (sq.q0 + m0) * p.q_r + h * p.q_h;
  const T *gk = static_cast<const T *>(p.k) + b * p.k_b + sq.k0 * p.k_r + hd.g * p.k_h;
  const T *gv = static_cast<const T *>(p.v) + b * p.v_b + sq.k0 * p.v_r + hd.g * p.v_h;
  const TileCopy<kBM, kD, kThreads, T> copy_q(tid, p.q_r);
  const TileCopy<kBN, kD, kThreads, T> copy_k(tid, p.k_r), copy_v(tid, p.v_r);

  copy_q(sQ, sQp, gq, p.q_r, sq.len_q - m0, p.d);
  if (n_lo < n_hi)
    copy_k(sK, sKp, gk + (int64_t)n_lo * kBN * p.k_r, p.k_r, sq.len_k - n_lo * kBN, p.d);
  cp_async_commit();

  float acc[kMT][kDT][4];
  /* per row: the exponent base (log2 units, see steps 4-5), the last rescale factor, and the sum
   * per thread (a quad's partial sums, added at the end) */
  float row_base[kMT][2], row_corr[kMT][2], row_sum[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][dt][e] = 0.f;
    row_base[mt][0] = row_base[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }
  /* The feature kernel turns scores into log2-unit logits (step 1-3 may be nonlinear), and so does
   * the feature-free one's soft-cap copy (kCap); the plain one keeps raw dot products and folds
   * the scale into the exponent's FMA. */
  const float mult = kFeat || kCap ? 1.f : p.scale * kLog2e;
  const SoftCap cap(p); /* read only with kCap */
  constexpr float kRescale = 8.f;
  /* Step 4-5: sinks are logits of the row max and terms of Z, counted once: every thread of a
   * quad starts from their max, and only the first adds their sum (the quad's sums are added at
   * the end). */
  if (p.num_sinks > 0) {
    float mx, sum;
    sink_stats(p, h, mx, sum);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        row_base[mt][hf] = mx;
        row_sum[mt][hf] = (lane & 3) == 0 ? sum : 0.f;
      }
  }

  const int nk = kFeat ? (p.d + 15) / 16 : kD / 16, nv = kFeat ? (p.dv + 15) / 16 : kD / 16;
  const int wrow = warp * kMT * 16; /* first row of this warp in the block */
  /* this lane's ldmatrix rows: Q as A (this warp's rows), K as B (keys), V as B transposed */
  constexpr uint32_t kPitch = kS * kE;
  const uint32_t aQ = sQ + wrow * kPitch + lane_a<T, kPitch>(lane);
  const uint32_t aK = sK + lane_b<T, kPitch>(lane), aV = sV + lane_bt<T, kPitch>(lane);

  for (int n = n_lo; n < n_hi; ++n) {
    const int n0 = n * kBN;
    cp_async_wait_all();
    __syncthreads(); /* K(n) has landed; every warp is done with V(n-1) */
    copy_v(sV, sVp, gv + (int64_t)n0 * p.v_r, p.v_r, sq.len_k - n0, p.dv);
    cp_async_commit();

    float s[kMT][kNT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;

    /* S = Q K^T */
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      if (kk < nk) mma_abt<T, kMT, kBN, kPitch, kPitch>(s, aQ + kk * 16 * kE, aK + kk * 16 * kE);
    if constexpr (kCap) { /* steps 1-2 on every key: the capped logits, in log2 units */
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] = cap.logit2(s[mt][nt][e]);
    }

    /* Steps 1-3 on the blocks at the band's edges (or with per-element work): -inf where not
     * visible; the feature kernel's logits in log2 units. */
    if (n < f_lo || n >= f_hi) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            int i = m0 + wrow + mt * 16 + (lane >> 2) + (e >> 1) * 8;
            int j = n0 + nt * 8 + (lane & 3) * 2 + (e & 1);
            if constexpr (kFeat) {
              float y; /* the soft cap's argument, unused here */
              s[mt][nt][e] = visible(p, hd, i, j) ? logit(p, hd, i, j, s[mt][nt][e], &y) * kLog2e
                                                  : -INFINITY;
            } else if (!visible_band(p, hd, i, j)) {
              s[mt][nt][e] = -INFINITY;
            }
          }
    } else if constexpr (kFeat) {
      const float scale_log2 = p.scale * kLog2e;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] *= scale_log2;
    }

    cp_async_wait_all();
    __syncthreads(); /* V(n) has landed; every warp is done with K(n) */
    if (n + 1 < n_hi) {
      copy_k(sK, sKp, gk + (int64_t)(n0 + kBN) * p.k_r, p.k_r, sq.len_k - n0 - kBN, p.d);
      cp_async_commit();
    }

    /* Steps 4-5 online. Each row keeps a base (log2 units) that its exponents are taken against;
     * it moves up to the row's max only when the max passes it by more than kRescale, so the
     * base rarely moves once the row has seen its large logits and the warp skips rescaling the
     * output (the exponents stay <= 2^kRescale: no overflow, and the rounding of P to 16 bits is
     * relative). Z and lse use the same base, so the result is the same function. */
    bool moved = false;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hf], s[mt][nt][2 * hf + 1]));
        mx = quad_max(mx) * mult;
        if (mx > row_base[mt][hf] + kRescale) {
          row_corr[mt][hf] = ex2(row_base[mt][hf] - mx); /* 0 for a first visible key */
          row_base[mt][hf] = mx;
          moved = true;
        } else {
          row_corr[mt][hf] = 1.f;
        }
      }
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          row_sum[mt][hf] *= row_corr[mt][hf];
#pragma unroll
          for (int dt = 0; dt < kDT; ++dt) {
            acc[mt][dt][2 * hf] *= row_corr[mt][hf];
            acc[mt][dt][2 * hf + 1] *= row_corr[mt][hf];
          }
        }
    }
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        /* a row with nothing visible yet has base -inf and only -inf scores: exponent 0 */
        const float base = row_base[mt][hf] == -INFINITY ? 0.f : row_base[mt][hf];
        float sum = row_sum[mt][hf];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          float e0 = ex2(fmaf(s[mt][nt][2 * hf], mult, -base));
          float e1 = ex2(fmaf(s[mt][nt][2 * hf + 1], mult, -base));
          s[mt][nt][2 * hf] = e0, s[mt][nt][2 * hf + 1] = e1;
          sum += e0 + e1;
        }
        row_sum[mt][hf] = sum;
      }

    /* Step 6: dropout zeroes P after Z has seen it; 1 / (1 - p) is applied at the end. Columns
     * 2t and 2t+1 share one Philox call (same j >> 2). */
    if (kFeat && p.dropout_p > 0.f) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            int i = m0 + wrow + mt * 16 + (lane >> 2) + hf * 8;
            int j = n0 + nt * 8 + (lane & 3) * 2;
            uint32_t r[4];
            philox_words(p, b, h, i, j, r);
            if (r[j & 3] < p.drop_threshold) s[mt][nt][2 * hf] = 0.f;
            if (r[(j + 1) & 3] < p.drop_threshold) s[mt][nt][2 * hf + 1] = 0.f;
          }
    }

    /* Step 7: O += P V, P rounded to the input dtype as the A operand (the C fragments of two
     * adjacent key n-tiles are one A fragment) */
    uint32_t pa[kBN / 16][kMT][4];
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk)
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) pack_a<T, kNT>(pa[kk][mt], s[mt], kk);
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) mma_ab_regs<T, kMT, kD, kPitch>(acc, pa[kk], aV + kk * 16 * kPitch, nv);
  }
  cp_async_wait_all();

  /* Steps 7-8: out = acc * keep_scale / Z, lse = m + log Z; a row with nothing visible and no
   * sinks (max still -inf) is out = 0, lse = -inf. */
  float inv[kMT][2]; /* each row's factor: keep_scale / Z, 0 for an empty row */
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = wrow + mt * 16 + (lane >> 2) + hf * 8;
      const float sum = quad_sum(row_sum[mt][hf]); /* every lane of the quad takes part */
      const bool empty = row_base[mt][hf] == -INFINITY;
      inv[mt][hf] = empty ? 0.f : (kFeat ? p.keep_scale : 1.f) / sum;
      if (p.lse != nullptr && (lane & 3) == 0 && m0 + r < sq.len_q)
        p.lse[b * p.lse_b + h * p.lse_h + (sq.q0 + m0 + r) * p.lse_r] =
            empty ? -INFINITY : row_base[mt][hf] * kLn2 + logf(sum);
    }
  T *go = static_cast<T *>(p.out) + b * p.o_b + (sq.q0 + m0 + wrow) * p.o_r + h * p.o_h;
  store_rows<T, kMT, kDT, kFeat>(go, p.o_r, acc, inv, lane, sq.len_q - m0 - wrow, p.dv);
}

template <typename T, typename C, bool kFeat, bool kCap = false>
attn_status launch_fwd(const attn_cuda_params &p, cudaStream_t stream, char *why, size_t why_size) {
  auto kernel = fwd_kernel<T, C, kFeat, kCap>;
  ATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::kSmem));
  dim3 grid((p.seqlen_q + C::kBM - 1) / C::kBM, p.heads_q, p.batch);
  kernel<<<grid, C::kThreads, C::kSmem, stream>>>(p);
  ATTN_CUDA_CHECK(cudaGetLastError());
  return ATTN_STATUS_OK;
}

/* The feature-free kernel (kFeat = false) when the run needs none of the per-element work but the
 * soft cap (its kCap copy), no dropout and no zero padding of a smaller head dim (needs_generic):
 * the common case, at far fewer registers; sinks run there too. At D = 256 a banded run takes two
 * 4-warp CTAs per SM (BandFwdTraits256). */
template <typename T, int kD, bool kCap>
attn_status run_fwd_plain(const attn_cuda_params &p, cudaStream_t stream, char *why, size_t why_size) {
  if constexpr (kD == 256) {
    if (p.window_right >= 0 || p.window_left >= 0) {
      using F = BandFwdTraits256;
      return launch_fwd<T, FwdCfg<T, kD, F::kNW, F::kMT, F::kBN, F::kMinB>, false, kCap>(p, stream, why, why_size);
    }
  }
  using F = FastFwdTraits<kD>;
  return launch_fwd<T, FwdCfg<T, kD, F::kNW, F::kMT, F::kBN, F::kMinB>, false, kCap>(p, stream, why, why_size);
}

template <typename T, int kD> attn_status run_fwd(const attn_cuda_params &p, cudaStream_t stream,
                                                  char *why, size_t why_size) {
  if (needs_generic(p, kD)) {
    using F = FwdTraits<kD>;
    return launch_fwd<T, FwdCfg<T, kD, F::kNW, F::kMT, F::kBN>, true>(p, stream, why, why_size);
  }
  return p.softcap > 0.f ? run_fwd_plain<T, kD, true>(p, stream, why, why_size)
                         : run_fwd_plain<T, kD, false>(p, stream, why, why_size);
}

} // namespace attn_cuda

#endif /* ATTN_IMPL_CUDA_CUDA_FWD_CUH */
