/*
 * dev/cuda/fwd_tiles.cu - kernel lab: the feature-free forward kernel (src/impl/cuda/cuda_fwd.cuh)
 * at several tile shapes (warps, m-tiles per warp, keys per step, min CTAs per SM), timed directly
 * on the bench shapes (bf16, B * T = 16384, Hq * D = 2048, T = 8192, causal and not), each checked
 * against the first shape's output (max |diff|, which must be 0 or rounding).
 *
 * Versions (H100, T = 8192, TFLOPS non-causal / causal):
 *   v0 the feature kernel's shape, one m-tile per warp, 8 warps, 64 keys ("old"): D = 64 187 / 172,
 *      D = 128 237 / 216 (the same kernel with every feature compiled in ran 136 / 124, 158 / 142)
 *   v1 one m-tile, 4 warps, at most 168 registers for 2 CTAs per SM ("mt1"): 243 / 237, 261 / 246
 *   v2 two m-tiles per warp, 4 warps, 64 keys ("fa2"): 274 / 245, 288 / 248 (D = 128 spills 212 B)
 *   v3 two m-tiles per warp, 4 warps, 32 keys ("bn32"): 205 / 191, 304 / 268
 *   D = 256 (one m-tile, 32 keys): 8 warps 235 / 199, 4 warps 260 / 224.
 *   v4 the kernel rewritten for registers and instructions (per-lane shared addresses with
 *      immediate offsets, tile copies with one offset, scale folded into the exponent's FMA,
 *      masking in a uniform branch per block, output rescaled only when a row's max moves by
 *      more than 2^8, heaviest causal blocks first); every shape above again:
 *      D = 64: bn64 325 / 306, bn128 335 / 310, mt1 267 / 265;
 *      D = 128: bn32 363 / 298, bn64 372 / 319 (44 bytes of loop-invariant spills), w8 280 / 249;
 *      D = 256: 4 warps bn32 249 / 225, 8 warps bn64 300 / 258, 8 warps bn32 263 / 227.
 *   Kept (cuda_traits.h FastFwdTraits): bn128 at D <= 64, bn64 at D = 96 and 128, 8 warps of
 *   bn64 above.
 *   D = 256 at T = 512 too (shape<256>(c, 512)): 8 warps bn64 233 / 147, 4 warps bn64 with two
 *   CTAs per SM 233 / 169 (at T = 8192 289 / 259, below 8 warps' 304 / 262), 4 warps bn32 215 /
 *   156. Two CTAs per SM help only the causal case, which has the shortest CTAs; not kept (it
 *   would need a second feature-free kernel per head dim, chosen by sequence length).
 *
 * build + run on the GPU machine (`gpu/run.sh cuda lab` does it):
 *   nvcc -std=c++17 -O3 -Iinclude -Isrc -gencode=arch=compute_90,code=sm_90 dev/cuda/fwd_tiles.cu -o lab && ./lab
 */
#include "impl/cuda/cuda_fwd.cuh"
#include "lab.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

using namespace attn_cuda;
template <int kD, int kNW, int kMT, int kBN, int kMinB>
void bench(const char *tag, attn_cuda_params p, bf *ref, double flops) {
  using C = FwdCfg<bf, kD, kNW, kMT, kBN, kMinB>;
  char why[256];
  const float ms = median_ms([&] {
    if (launch_fwd<bf, C, false>(p, 0, why, sizeof why) != ATTN_STATUS_OK) {
      printf("%s\n", why);
      exit(1);
    }
  });
  const float md = diff(ref, static_cast<bf *>(p.out), (size_t)p.batch * p.seqlen_q * p.heads_q * kD);
  printf("lab fwd D=%d T=%d causal=%d nw=%d mt=%d bn=%d minb=%d (%s): %.3f ms %.1f TFLOPS maxdiff %.3g\n", kD, p.seqlen_q,
         p.window_right == 0, kNW, kMT, kBN, kMinB, tag, ms, flops / ms * 1e-9, md);
}

template <int kD> void shape(int causal, int T = 8192) {
  const int B = 16384 / T, H = 2048 / kD;
  size_t n = (size_t)B * T * H * kD;
  bf *q, *k, *v, *o, *o2;
  float *lse;
  CU(cudaMalloc(&q, n * 2));
  CU(cudaMalloc(&k, n * 2));
  CU(cudaMalloc(&v, n * 2));
  CU(cudaMalloc(&o, n * 2));
  CU(cudaMalloc(&o2, n * 2));
  CU(cudaMalloc(&lse, (size_t)B * H * T * 4));
  fill<<<1024, 256>>>(q, n, 1), fill<<<1024, 256>>>(k, n, 2), fill<<<1024, 256>>>(v, n, 3);
  attn_cuda_params p;
  memset(&p, 0, sizeof p);
  p.q = q, p.k = k, p.v = v, p.out = o, p.lse = lse;
  int64_t rs = (int64_t)H * kD, bs = (int64_t)T * rs;
  p.q_b = p.k_b = p.v_b = p.o_b = bs;
  p.q_r = p.k_r = p.v_r = p.o_r = rs;
  p.q_h = p.k_h = p.v_h = p.o_h = kD;
  p.lse_b = (int64_t)H * T, p.lse_h = T, p.lse_r = 1;
  p.batch = B, p.seqlen_q = p.seqlen_k = T, p.heads_q = p.heads_kv = H, p.group = 1, p.d = p.dv = kD;
  p.scale = 1.f / sqrtf((float)kD), p.window_left = -1, p.window_right = causal ? 0 : -1;
  p.keep_scale = 1.f;
  double flops = 4.0 * B * H * (double)T * T * kD * (causal ? 0.5 : 1.0);
  if (kD == 64) {
    bench<kD, 4, 2, 64, 1>("bn64", p, o, flops);
    p.out = o2;
    bench<kD, 4, 2, 128, 1>("bn128", p, o, flops);
    bench<kD, 4, 1, 64, 2>("mt1", p, o, flops);
  } else if (kD == 128) {
    bench<kD, 4, 2, 32, 1>("bn32", p, o, flops);
    p.out = o2;
    bench<kD, 4, 2, 64, 1>("bn64", p, o, flops);
    bench<kD, 8, 1, 64, 1>("w8", p, o, flops);
  } else {
    bench<kD, 4, 1, 32, 1>("w4", p, o, flops);
    p.out = o2;
    bench<kD, 8, 1, 64, 1>("w8 bn64", p, o, flops);
    bench<kD, 8, 1, 32, 1>("w8 bn32", p, o, flops);
    bench<kD, 4, 1, 64, 2>("w4 bn64", p, o, flops);
  }
  cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(o2), cudaFree(lse);
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
    shape<256>(c, 512);
  }
  return 0;
}
