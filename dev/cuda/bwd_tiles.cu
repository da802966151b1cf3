/*
 * dev/cuda/bwd_tiles.cu - kernel lab: the feature-free backward (src/impl/cuda/cuda_bwd.cuh) with
 * the dK/dV kernel at several tile shapes (keys per CTA, warps), both configurations (deterministic:
 * dK/dV kernel + dQ kernel; atomic: one kernel + the dq conversion), timed on the bench shapes
 * (bf16, B * T = 16384, Hq * D = 2048, T = 8192), each dq/dk/dv checked against the first shape's.
 * TFLOPS as gpu/cuda_bench: 2.5 x the forward's 4 * B * H * T^2 * D (halved when causal).
 *
 * build + run on the GPU machine (`gpu/run.sh cuda lab` does it):
 *   nvcc -std=c++17 -O3 -Iinclude -Isrc -gencode=arch=compute_90,code=sm_90 dev/cuda/bwd_tiles.cu -o lab && ./lab
 *
 * Versions (H100, D = 128, T = 8192, TFLOPS non-causal / causal; D = 64 in brackets):
 *   v1 64 keys, 4 warps, 16 keys per warp in both phases: deterministic 162 / 155, atomic 167 / 166
 *      (through gpu/cuda_bench)
 *   v2 phase 2 (dV, dK) on 32 keys per warp, so each dO / Q fragment feeds two mma:
 *      deterministic 172 / 167 [132 / 130], atomic 178 / 175 [147 / 144]
 *   v3 v2 on 128 keys and 8 warps (one CTA per SM): deterministic 163 / 158 [128 / 123], atomic
 *      198 / 190 [150 / 145]. Kept: v2 for the deterministic configuration, v3 for the atomic one.
 *   v4 phase 1 (S^T, dP^T) on 32 keys x 32 queries per warp too (kKT1 = 2): deterministic
 *      176 / 170 [137 / 133], atomic 202 / 195 [156 / 149]. Kept for both.
 *   v5 two stages of Q and dO, loaded one item ahead, 2 barriers per item instead of 4: see
 *      bench/RESULTS.md.
 *   Session of 2026-11-22 (kernel changes, same shapes; atomic v5 / deterministic v4):
 *      branch-free dS code on interior tiles, lse/Delta one item ahead, no division in the item
 *      walk, the phase-1 products in one pass: D = 128 237 / 210 -> 237 / 222 [192 / 183];
 *      per-lane bases for copies and atomics, dQ kernel with two m-tiles per warp:
 *      242 / 230 [191 / 187].
 *   v6 128 query rows per step at D = 64 (FlashAttention-2's D = 64 shape): atomic 212 / 200
 *      (v5: 191 / 182). Kept for the atomic feature-free kernel at D <= 64 (BwdTraits::kBMa).
 *   v7 (reverted) FlashAttention-2's phase-1 order, S^T then P' (stored) while dP^T's products
 *      run, then dS^T: 100 bytes of spills inside the loop, atomic D = 128 242 -> 218.
 *   v8 atomic on two CTAs of 64 keys per SM (4 warps each), so the phases of different CTAs
 *      overlap: D = 128 211 / 202, D = 64 185 / 176, against v5's 249 / 237 and 194 / 185: the
 *      overlap does not pay for twice the dQ atomics and Q / dO loads per key. Not kept.
 *   Session 2, 2026-11-22, from a comparison of the SASS with FlashAttention-2's (same tile, same
 *   255 registers, the same 320 mma and 144 ldmatrix per query block; ours issued fewer
 *   instructions, but its dS code was one serial chain: lse and Delta were read from shared
 *   memory per element, between the stores of P'^T and dS^T, which may alias them, so each was
 *   reloaded after every store):
 *      lse and Delta of a lane's query columns in registers (one 16-byte load per column pair),
 *      the band test before the products, dQ's products and atomics before dK's (whose products
 *      then hide the atomics), the next item's copy offsets computed once: D = 128 atomic v5
 *      249 / 237 -> 261 / 244, D = 64 v6 212 / 200 -> 235 / 223;
 *      dQ on 32 x 32 warp tiles (two m-tiles; each K fragment feeds two mma): D = 128 262-265 /
 *      246-250, D = 64 v6 244-246 / 229-233, D = 256 v5 196 / 196 (deterministic 172 / 171).
 *   v9 (not kept) phase 1 in FlashAttention-2's order, S^T, P in place, then dP^T and dS^T,
 *      stores at the end (so P's exponentials could issue between dP^T's products): D = 128
 *      262 / 245 against 264 / 246, 24 bytes of spills; D = 64 237 / 223 against 239 / 225.
 *   v10 (not kept) dQ's key slices alternating between two sets of accumulators (added before
 *      the atomics), since ptxas had left dQ's chain of 8 accumulators to itself (mma on the
 *      same registers 8 apart): the reuse distance went to >= 12 mma, the speed did not move
 *      (D = 128 262 / 247, D = 64 242 / 229, D = 256 192 / 192 with 32 bytes of new spills). An
 *      order written out by hand (dQ's steps between halves of dV's) was rescheduled by ptxas.
 *   From ncu's per-instruction stall samples: the dQ atomics of a query block wholly inside the
 *      sequence without a test per row (the test made ptxas recompute their address per row
 *      group into registers the previous group's atomics were still reading), the last chunk's
 *      atomics spread between dK's steps, lse converted to log2 units when stored: D = 128
 *      atomic 262 -> 277-284 / 247 -> 255-258, D = 64 v6 246 -> 252 / 236, D = 256 v5 196 -> 214
 *      / 212 (the same device call measured the deterministic D = 256 at 180).
 *   Run-to-run spread of one shape between device calls: about 2% (up to 4% for v2), and lent
 *   machines differ by up to 5%: compare shapes within one call.
 */
#include "impl/cuda/cuda_bwd.cuh"
#include "impl/cuda/cuda_fwd.cuh"
#include "lab.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

using namespace attn_cuda;
struct Ref {
  bf *dq, *dk, *dv;
};

template <int kD, bool kAtomic, typename Ckv>
void bench(const char *tag, attn_cuda_params p, const Ref *ref, double flops) {
  char why[256];
  const float ms = median_ms([&] {
    if (launch_bwd<bf, kD, false, kAtomic, Ckv>(p, 0, why, sizeof why) != ATTN_STATUS_OK) {
      printf("%s\n", why);
      exit(1);
    }
  });
  size_t n = (size_t)p.batch * p.seqlen_q * p.heads_q * kD;
  float d0 = 0, d1 = 0, d2 = 0;
  if (ref != nullptr) {
    d0 = diff(ref->dq, (const bf *)p.dq_out, n), d1 = diff(ref->dk, (const bf *)p.dk_out, n);
    d2 = diff(ref->dv, (const bf *)p.dv_out, n);
  }
  printf("lab bwd D=%d causal=%d %s bn=%d bm=%d nw=%d kt1=%d st=%d (%s): %.3f ms %.1f TFLOPS maxdiff dq %.3g dk %.3g dv %.3g\n", kD,
         p.window_right == 0, kAtomic ? "atomic" : "determ", Ckv::kBN, Ckv::kBM, Ckv::kNW, Ckv::kKT1, Ckv::kStages, tag, ms,
         flops / ms * 1e-9, d0, d1, d2);
}

template <int kD> void shape(int causal) {
  const int T = 8192, B = 16384 / T, H = 2048 / kD;
  size_t n = (size_t)B * T * H * kD;
  bf *q, *k, *v, *o, *dout, *g[6];
  float *lse, *delta, *acc;
  CU(cudaMalloc(&q, n * 2));
  CU(cudaMalloc(&k, n * 2));
  CU(cudaMalloc(&v, n * 2));
  CU(cudaMalloc(&o, n * 2));
  CU(cudaMalloc(&dout, n * 2));
  for (int i = 0; i < 6; ++i) CU(cudaMalloc(&g[i], n * 2));
  CU(cudaMalloc(&lse, (size_t)B * H * T * 4));
  CU(cudaMalloc(&delta, (size_t)B * H * T * 4));
  CU(cudaMalloc(&acc, n * 4));
  fill<<<1024, 256>>>(q, n, 1), fill<<<1024, 256>>>(k, n, 2), fill<<<1024, 256>>>(v, n, 3);
  fill<<<1024, 256>>>(dout, n, 4);
  CU(cudaMemset(delta, 0, (size_t)B * H * T * 4));
  attn_cuda_params p;
  memset(&p, 0, sizeof p);
  p.q = q, p.k = k, p.v = v, p.out = o, p.lse = lse, p.dout = dout, p.delta = delta;
  int64_t rs = (int64_t)H * kD, bs = (int64_t)T * rs;
  p.q_b = p.k_b = p.v_b = p.o_b = p.do_b = p.dq_b = p.dk_b = p.dv_b = bs;
  p.q_r = p.k_r = p.v_r = p.o_r = p.do_r = p.dq_r = p.dk_r = p.dv_r = rs;
  p.q_h = p.k_h = p.v_h = p.o_h = p.do_h = p.dq_h = p.dk_h = p.dv_h = kD;
  p.lse_b = (int64_t)H * T, p.lse_h = T, p.lse_r = 1;
  p.batch = B, p.seqlen_q = p.seqlen_k = T, p.heads_q = p.heads_kv = H, p.group = 1, p.d = p.dv = kD;
  p.rows_q = (int64_t)B * T;
  p.scale = 1.f / sqrtf((float)kD), p.window_left = -1, p.window_right = causal ? 0 : -1;
  p.keep_scale = 1.f;
  char why[256];
  using F = FastFwdTraits<kD>;
  launch_fwd<bf, FwdCfg<bf, kD, F::kNW, F::kMT, F::kBN, F::kMinB>, false>(p, 0, why, sizeof why);
  double flops = 2.5 * 4.0 * B * H * (double)T * T * kD * (causal ? 0.5 : 1.0);
  p.dq_out = g[0], p.dk_out = g[1], p.dv_out = g[2];
  Ref ref{g[0], g[1], g[2]};
  if constexpr (kD == 256) { /* the shapes that fit in shared memory there: BwdTraits<256> */
    bench<kD, false, DkvCfg<bf, kD, 8, 64, 64, 2, 1>>("v4 bn64 w8 kt2", p, nullptr, flops);
    p.dq_out = g[3], p.dk_out = g[4], p.dv_out = g[5], p.dq_accum = acc;
    bench<kD, true, DkvCfg<bf, kD, 8, 64, 64, 2, 1>>("v4 bn64 w8 kt2", p, &ref, flops);
    bench<kD, true, DkvCfg<bf, kD, 8, 64, 64, 2, 2>>("v5 bn64 w8 kt2 2 stages", p, &ref, flops);
    bench<kD, true, DkvCfg<bf, kD, 8, 64, 64, 1, 2>>("v5 bn64 w8 kt1 2 stages", p, &ref, flops);
  } else {
  bench<kD, false, DkvCfg<bf, kD, 4, 64, 64, 1>>("v2 bn64 w4 kt1", p, nullptr, flops);
  p.dq_out = g[3], p.dk_out = g[4], p.dv_out = g[5];
  bench<kD, false, DkvCfg<bf, kD, 4, 64, 64, 2>>("v4 bn64 w4 kt2", p, &ref, flops);
  p.dq_accum = acc;
  bench<kD, true, DkvCfg<bf, kD, 8, 128, 64, 1>>("v3 bn128 w8 kt1", p, &ref, flops);
  bench<kD, true, DkvCfg<bf, kD, 8, 128, 64, 2>>("v4 bn128 w8 kt2", p, &ref, flops);
  bench<kD, true, DkvCfg<bf, kD, 8, 128, 64, 2, 2>>("v5 bn128 w8 kt2 2 stages", p, &ref, flops);
  /* two CTAs of 64 keys per SM (phases of different CTAs overlap) against one of 128 */
  bench<kD, true, DkvCfg<bf, kD, 4, 64, 64, 2, 1>>("v8 bn64 w4 kt2 atomic", p, &ref, flops);
  if constexpr (kD == 64) /* FlashAttention-2's D = 64 shape: 128 query rows per step */
    bench<kD, true, DkvCfg<bf, kD, 8, 128, 128, 2, 2>>("v6 bn128 bm128 w8 kt2 2 stages", p, &ref, flops);
  p.dq_accum = nullptr;
  bench<kD, false, DkvCfg<bf, kD, 4, 64, 64, 2, 2>>("v5 bn64 w4 kt2 2 stages", p, &ref, flops);
  bench<kD, false, DkvCfg<bf, kD, 8, 128, 64, 2, 2>>("v5 bn128 w8 kt2 2 stages", p, &ref, flops);
  }
  cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(dout), cudaFree(lse), cudaFree(delta);
  cudaFree(acc);
  for (int i = 0; i < 6; ++i) cudaFree(g[i]);
}

int main(int argc, char **argv) {
  if (argc > 1) { /* one shape, for ncu: D = 128 (or the argument 256), T = 8192, non-causal */
    if (atoi(argv[1]) == 256) shape<256>(0);
    else shape<128>(0);
    return 0;
  }
  for (int c = 0; c < 2; ++c) {
    shape<64>(c);
    shape<128>(c);
    shape<256>(c);
  }
  return 0;
}
