/*
 * dev/cuda/bwd_hopper.cu - kernel lab: the Hopper backward (src/impl/cuda/sm90/sm90_bwd.cuh: TMA,
 * wgmma, a producer warpgroup and two consumer warpgroups of 64 keys each) checked against a CPU
 * reference (double, from the same rounded inputs) on odd shapes (ragged lengths, GQA / MQA, a
 * window, bottom-right causal with Tq != Tk, bf16 and f16, D = 64, 128 and 256), each beside the
 * atomic sm_80 backward (cuda_bwd.cuh) on the same inputs, whose error is the yardstick; then both
 * timed on the bench shapes (bf16, B * T = 16384, Hq * D = 2048, T = 8192, causal and not; the
 * workspace's zeroing, the kernel and the dq conversion, not Delta's pass). TFLOPS as
 * gpu/cuda_bench: 2.5 x the forward's 4 * B * H * T^2 * D (halved when causal). The features
 * (v5: varlen, the soft cap, ALiBi, the deterministic order) are checked against the atomic
 * sm_80 backward on the same inputs and timed beside the plain run (checks_feat, bench_feat).
 *
 * Versions (H100 80GB HBM3, bf16, T = 8192, TFLOPS non-causal / causal, beside the atomic
 * backward in the same call, one device call of 2026-11-24; every check passed, each gradient's
 * error equal to the atomic kernel's to three digits: 2.2-2.4e-3 bf16, 2.7-3.1e-4 f16):
 *   v1 (kOverlap = false) no overlap within an item: S^T, dP^T; P^T, dS^T; dS^T stored; dV, dK
 *      (A from registers), a barrier of both warpgroups, dQ, all waited for; dQ's atomics.
 *      D = 128 366.5 / 329.4 (atomic 281.0 / 255.0: 1.30x / 1.29x), D = 64 285.6 / 265.9 (249.8
 *      / 235.9: 1.14x / 1.13x).
 *   v2 (kOverlap) dV issued before dS^T is stored, dK after dQ, dQ's atomics under dK's products:
 *      D = 128 372.5 / 340.8 (278.5 / 257.5: 1.34x / 1.32x), D = 64 294.7 / 274.0 (245.7 / 235.9:
 *      1.20x / 1.16x). ptxas: 28 bytes of spills at D = 128 (240 registers), none at 64.
 *   v3 (tried, not kept): v2 with dQ staged in shared memory (rows padded by 32 bytes) and each
 *      warp's 16 rows added by 16 bulk reduce-adds (cp.reduce.async.bulk .add.f32, one 256- or
 *      128-byte row per lane) into the atomics' [H, rows, D] workspace: every check passed, but
 *      D = 128 356.9 / 326.7 against v2's 370.1 / 340.9, D = 64 248.6 / 232.8 against 295.2 /
 *      274.4 in the same call: many small bulk copies cost more than the atomics.
 *   v4 (kDqTiled, the library's: sm90_launch.cu) Nsight Compute on v2 (D = 128, `gpu/run.sh cuda
 *      ncu` with LAB_PROGRAMS=bwd_hopper): tensor pipe 38%, issue slots 28% busy, and the top
 *      stalls (13% of the samples) were long-scoreboard waits to reuse the registers of the
 *      REDG atomics still queued in the memory pipe. v4 lays the f32 workspace out in tiles of
 *      64 rows whose warp slices (16 rows x D / 2) are contiguous in the order of the warps'
 *      registers (dq_tile_index), so a warp stores its slice with conflict-free 16-byte stores and
 *      adds it with ONE bulk reduce-add (4 KiB at D = 128); dq_tiles_convert_kernel reads it.
 *      D = 128 426.8 / 386.0 against v2's 370.5 / 339.8 in the same call (1.15x / 1.14x; 1.54x /
 *      1.51x the atomic sm80 kernel), D = 64 296.9 / 275.9 against 292.9 / 272.7 (1.01x: at D =
 *      64 the per-score work, not dQ, bounds it). A third Q / dO stage at D = 64 (second call):
 *      299.6 / 277.2 against v4's 301.6 / 279.2, not kept. Nsight Compute on v4 (D = 128): tensor
 *      pipe 44%; the top stalls are the wait for an item's S^T / dP^T products before its
 *      elementwise work (7.5% of samples: both warpgroups run in lockstep, so nothing else is
 *      ready) and the proxy fence after the dQ slice's stores (6%: MEMBAR.ALL.CTA behind the
 *      stores, which queue behind the products' shared-memory reads).
 *   v5 (the features, in the library: sm90_bwd.cuh) packed / padded varlen (the forward's map
 *      geometry; partial blocks' rows past a sequence zeroed in shared memory), the soft cap and
 *      ALiBi (kernels of their own), sinks (nothing in the kernel), and the deterministic order
 *      (each dQ slice's additions behind a counter, key block by key block). Checked against the
 *      atomic sm80 kernel on the same inputs (checks_feat: relative L2 differences at most 1.7e-4
 *      bf16, 7.5e-5 f16; dq bits repeat in the deterministic order). H100, T = 8192, bf16,
 *      TFLOPS non-causal / causal and the ratio to the plain run of the same call:
 *      D = 128: plain 441.5 / 402.1; packed 445.2 / 400.4 (1.01 / 1.00x); padded 1.01 / 1.01x;
 *      GQA 4:1 1.03 / 0.87x; ALiBi 362.1 / 329.7 (0.82x: with the fold of kLinear; 0.80 / 0.79x
 *      without it); soft cap 304.1 / 279.3 (0.69x); deterministic 287.9 / 268.6 (0.65 / 0.67x;
 *      causal was 0.38x with ascending query blocks). D = 64: plain 284.3 / 265.2; packed 0.99 /
 *      0.98x; ALiBi 0.79x; soft cap 0.61 / 0.62x; deterministic 0.67x. The soft cap and ALiBi
 *      are per-score work in the elementwise step, which already bounds the plain kernel at
 *      D = 64 (v4's note): the cap adds two special-function instructions per score (ex2, rcp),
 *      ALiBi two FP32 instructions; the deterministic order makes key block n wait for n - 1 at
 *      each dQ slice, so a CTA starts about one item after the previous one (the chain of 64
 *      key blocks per head costs half of the 128 items' time).
 *   v6 (the library's) the elementwise step without per-score branches. Its SASS (nvdisasm) had one
 *      branch per score, visible_band's early returns under `!interior`, and so one basic block per
 *      score with its exponential alone in it: the 32 MUFU.EX2 of an item ran one after another.
 *      Interior tiles now have an instantiation of their own, with no test, and an edge tile tests
 *      each score with one unsigned comparison against the query range that sees each of the
 *      thread's two keys (visible_band_queries), selected, not branched. H200, bf16, T = 8192,
 *      TFLOPS non-causal / causal, main's v5 in the same call: D = 128 plain 511 / 488 against
 *      443 / 400 (1.15x / 1.22x), ALiBi 488 / 449 against 355 / 324 (1.37x / 1.39x), soft cap
 *      331 / 308 against 293 / 272, GQA 4:1 515 / 430 against 447 / 355, deterministic 325 / 305
 *      against 290 / 270; D = 64 plain 340 / 323 against 280 / 260 (1.21x / 1.24x), ALiBi 319 /
 *      305 against 220 / 206. Tried in the same call and not kept (0.94-1.0x of v6 at D = 128,
 *      equal at D = 64): S^T and dP^T committed apart with P computed under dP^T's products (a),
 *      and dV's products issued before dS^T as well, dS^T from P in f32 (b: 36 -> 116 bytes of
 *      spills) or from P's 16-bit fragments (c); commit 3eb2e6a has them.
 *   v7 (tried, not kept; commit 88f67b3 has it) dq's conversion fused into the kernel: each warp
 *      counts its slice's completed addition (the bulk group waited for an item later, an
 *      acq_rel atom, its result looked at an item after that) and the key block whose count
 *      completes a slice converts it; a prepare kernel zeroes the workspace and writes the dq
 *      rows of tiles no key block reaches. Every check passed, but H200, bf16, T = 8192: D = 128
 *      8.26 ms against v6's 5.50 (0.67x), D = 64 0.65x; waiting for each reduce-add to complete
 *      (not only to have read its staging) costs what the deterministic order's waits cost
 *      (v6 deterministic 8.45 ms), while the conversion it removes took 0.122 ms of the 5.5 and
 *      the zeroing 0.036 (bench_parts). What was kept instead: the conversion kernel one CTA per
 *      tile, its place worked out once (0.123 -> 0.060 ms at D = 128, the same bits), and, in
 *      the library (cuda_launch.cu), Delta's kernel with 16-byte loads: together the library's
 *      backward went from 466-479 to 512 TFLOPS at D = 128, T = 8192 non-causal, the lab's
 *      kernel 516 (RESULTS.md, "The backward's side kernels").
 *   v8 (the library's at D = 64; kPrefetch) each item's pass issues the next item's S^T / dP^T
 *      ahead of its own dV, dQ and dK products, then turns them into the next item's P^T / dS^T
 *      (in registers of their own, pv / dsv) while those products run, and waits for everything
 *      before the loop's back edge; three Q / dO stages. The first form kept the products in
 *      flight across the back edge and ptxas serialized every wgmma of the kernel (C7515, seen
 *      only in `-Xptxas -v` of the kernel alone): 0.84x v6. The pass's set-up now runs between
 *      the scores' issue and their wait, in v6 too. H200, bf16, T = 8192, TFLOPS non-causal /
 *      causal, same call: D = 64 v8 378.7 / 362.5 against v6 353.3 / 336.3 (1.07x / 1.08x; v6 as
 *      it was, the call before: 342.9 / 328.3); D = 128 v6 534.0 / 498.5 (as it was: 517.6 /
 *      479.8; v8 there spills 450-1100 bytes and is serialized, 0.5x). ALiBi and the soft cap
 *      at D = 64 run at v6's absolute speed (323 / 204 against 322 / 205), so their ratios to
 *      the plain speed fall (0.85x, 0.54x). Every check passed (94 + 94, v8 at D = 64 and 128).
 *   bands (kBand = 8, a BwdCfg90 parameter then; commit 5faa51b) the grid in bands of 8 key
 *      blocks, every (sequence, KV head) of a band before the next, so that a causal mask's
 *      longest CTAs (the first key blocks) of every head start first; in x-major order those of
 *      the grid's last heads run in its last wave. H200, bf16, T = 8192, TFLOPS, two calls,
 *      banded against x-major in the same call: D = 128 (v6) causal 521.5 / 521.1 against 500.1
 *      / 493.9 (1.04-1.06x), GQA 4:1 causal 507 / 506 against 439 / 437 (1.15x), ALiBi causal
 *      481 / 480 against 456 / 457 (1.05x); D = 64 (v8) causal 369.9 / 369.3 against 359.3 /
 *      358.6 (1.03x), GQA causal 371-372 against 342 (1.09x). Without a mask bands lost or tied
 *      (D = 128: 514.5 against 520.2, 493.5 against 533.8; D = 64 equal): 8 key blocks of 16
 *      heads at once share less Q / dO in L2 than x-major's two heads' key blocks together.
 *   heads first (kHeadsFirst, the library's for causal problems) what the bands measured, chosen
 *      at launch for causal problems only, as one kernel: a run-time band index cost 36 more
 *      bytes of spills at D = 128 (ptxas: n0 no longer read from blockIdx), so the causal grid
 *      is x the KV head, y the key block: its waves hold the same CTAs as bands of 8 (132 SMs,
 *      16 KV heads), every place read from blockIdx, the spills as before (36-60 bytes). The
 *      bench's "x-major" rows run the grid of before. H200, bf16, T = 8192, causal, two calls,
 *      heads first against x-major in the same call: D = 128 plain 512.4 / 523.0 against 491.9
 *      / 493.6 (1.04-1.06x), GQA 4:1 520.1 / 512.7 against 438.2 / 436.1 (1.18-1.19x), ALiBi,
 *      soft cap and deterministic 1.04-1.06x; D = 64 (v8) plain 1.01-1.02x, GQA 1.10-1.11x.
 *      Without a mask both run the x-major grid (529.3 against 519.2, 506.2 against 508.6).
 *   v9 (the library's at D = 256; kSplit) one warpgroup's dK and dV of 64 keys at D = 256 would
 *      need all 256 registers a thread, so both consumer warpgroups take the CTA's 64 keys and
 *      split the columns: dK, dV, dQ 128 each, S^T and dP^T 32 queries each. P^T and dS^T go
 *      through shared memory (each warpgroup stores its queries, then both read all 64 for dV =
 *      P^T dO and dK = dS^T Q with A from shared memory, B MN-major: Wgmma::ssb), and dQ goes
 *      out by red.global.add.v4.f32 in the tiles' layout (its 64 KiB staging does not fit beside
 *      K, V and two Q / dO stages); the deterministic order keeps its counters (lane 0 waits,
 *      the warp reduces, fences, bumps). ptxas: 36-52 bytes of spills (as D = 128). H200, bf16,
 *      T = 8192, TFLOPS non-causal / causal, same call: plain 408.7 / 402.5 against the atomic
 *      sm80 backward's 209.5 / 205.0 (1.95x / 1.96x; PyTorch's cuDNN, an earlier call: 355.5 /
 *      380.1, so 1.15x / 1.06x); soft cap 339.9 / 336.5 (0.83x plain), ALiBi 387.9 / 384.2
 *      (0.95x), packed 389.0 / 399.0, padded 391.0 / 399.6, GQA 4:1 391.8 / 401.2,
 *      deterministic 257.7 / 245.7 (0.61-0.63x). Every check passed, bf16 and f16.
 *   inputs (bench_real_lse, measured 2026-12-04 on an H200) every figure above times the kernel
 *      on lse = 0 and Delta = 0 (so P = exp(S scale), dS = P dP); the library's call
 *      (gpu/cuda_bench) gets a real forward's. The
 *      same kernel, same process, both inputs: D = 128 non-causal 5.093 ms (539.8 TFLOPS) on
 *      zeros against 5.489 ms (500.8) on a forward's lse / Delta, 0.93x; causal 0.97x; D = 256
 *      0.99x / 1.02x. The SM clock was at the power cap meanwhile (nvidia-smi: 1800-1980 MHz,
 *      the software power-cap reason set, 560-680 W). So the library's 0.25-0.35 ms over this
 *      lab's figure (2026-12-03) is the data's, not its host path: the same instructions on real
 *      probabilities and gradients, at a clock the power cap sets, take longer at D = 128
 *      (PyTorch's cuDNN is timed on real ones too, so the library's ratio to it is the fair one).
 *   v10 (the library's) each mode's per-score work fixed at compile time. The cap kernel tested
 *      has_cap (p.softcap > 0, always true there: bwd90_mode gives it caps above 0 only) per
 *      score, and ptxas made that a branch: the SASS of the D = 64 cap kernel had one BRA a score
 *      (277 against the plain kernel's 128), each score's cap with its EX2 and RCP alone in a
 *      basic block, as v6 found for the band's tests. Now kBwdCap's cap and kBwdAlibi's ALiBi are
 *      compile-time, and the cap kernel's ALiBi a per-tile choice (elementwise's alibi tag). `bwd90
 *      1234 v10`, H200, bf16, T = 8192, soft cap 30, TFLOPS non-causal / causal, the binary of
 *      before against this one, the same call (every check passed):
 *        D = 64:  204.8 / 200.3 (0.55x / 0.54x plain) -> 267.1 / 261.8 (0.71x / 0.71x): 1.30x / 1.31x
 *        D = 128: 337.9 / 332.6 (0.63x / 0.65x)       -> 421.2 / 419.1 (0.83x / 0.82x): 1.25x / 1.26x
 *        D = 256: 340.6 / 338.0 (0.88x / 0.85x)       -> 367.0 / 372.5 (0.94x / 0.95x): 1.08x / 1.10x
 *      ALiBi alone 0.98-1.03x (within the calls' spread), the rest the same code.
 *   v11 (the library's: BwdCfg90's kCapTanh) the cap's logit by tanh.approx, as the forward's
 *      since its v14, so that P recomputed from the forward's lse is the forward's own, and the
 *      derivative as u (1 + |tanh|)^2 (SoftCap::tanh2; docs/NUMERICS.md): the same three
 *      special-function ops a score, four FP32 ones fewer. `bwd90 1234 v11`, H200, the same
 *      shapes, v10 -> v11 in one call (then 240 checks of v11, bf16 and f16, every feature: passed):
 *        D = 64:  267.1 / 261.1 -> 272.5 / 266.0 (0.72x / 0.73x plain): 1.02x / 1.02x
 *        D = 128: 422.6 / 415.7 -> 438.0 / 434.9 (0.86x / 0.84x): 1.04x / 1.05x
 *        D = 256: 362.1 / 368.4 -> 361.3 / 364.9 (0.93x / 0.91x): 1.00x / 0.99x
 *      What bounds the cap now (an estimate from the SASS's counts, not profiled): at D = 64 the
 *      kernel runs 1.76 scores a cycle an SM (1.8 GHz) against the
 *      special-function unit's 16 / 3 = 5.3, so neither they nor the issue slots (about 19
 *      instructions a score) are saturated; the cap's elementwise step (next item's, under the
 *      products) outlasts dV's, dQ's and dK's products (768 tensor cycles an item at D = 64) and
 *      sits on the item's critical path with the two warpgroups' barrier at dS^T.
 *   Not yet tried (FlashAttention-3 reaches ~1.5-1.75x of FlashAttention-2 here): v8's overlap
 *   at D = 128 (it needs registers: dQ in shared memory, or dK / dV split across more
 *   warpgroups), the two consumer warpgroups out of lockstep (the per-item barrier
 *   for dS^T), 3 warpgroups (kBN = 192) at D = 64, a persistent grid; for the soft cap, the
 *   exponential u on the FMA pipe (a polynomial, FlashAttention-4's trick) to move one of its
 *   three special-function ops a score.
 *
 * build + run on the GPU machine (`gpu/run.sh cuda lab` does it):
 *   nvcc -std=c++17 -O3 -Iinclude -Isrc -gencode=arch=compute_90a,code=sm_90a dev/cuda/bwd_hopper.cu -o bwd90 && ./bwd90
 */
#include "impl/cuda/cuda_bwd.cuh"
#include "impl/cuda/cuda_fwd.cuh"
#include "impl/cuda/sm90/sm90_bwd.cuh"
#include "lab.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

using namespace attn_cuda;
using sm90::BwdCfg90;
typedef __half hf;

static int failures = 0;

struct Problem {
  int B, Tq, Tk, H, Hkv, D, wl, wr, bottom_right;
};

static float hash_unit(size_t i, unsigned seed) { /* [-1, 1) */
  unsigned h = (unsigned)i * 2654435761u ^ seed;
  h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
  return (h & 0xffff) / 32768.f - 1.f;
}

/* Host tensors of one problem, rounded to T, with the reference's out, lse, Delta and gradients. */
template <typename T> struct Host {
  Problem s;
  std::vector<T> q, k, v, o, dout;
  std::vector<float> lse, delta;     /* lse [B][H][Tq]; delta [H][B * Tq] (the kernels' layouts) */
  std::vector<double> dq, dk, dv;    /* the reference's */
  size_t nq, nk;
  Host(const Problem &s_, unsigned seed) : s(s_) {
    nq = (size_t)s.B * s.Tq * s.H * s.D, nk = (size_t)s.B * s.Tk * s.Hkv * s.D;
    q.resize(nq), k.resize(nk), v.resize(nk), o.resize(nq), dout.resize(nq);
    for (size_t i = 0; i < nq; ++i) q[i] = T(hash_unit(i, seed)), dout[i] = T(hash_unit(i, seed + 3));
    for (size_t i = 0; i < nk; ++i) k[i] = T(hash_unit(i, seed + 1)), v[i] = T(hash_unit(i, seed + 2));
    reference();
  }
  bool visible(int i, int j) const {
    const int o_ = s.bottom_right ? s.Tk - s.Tq : 0, diag = i + o_;
    if (s.wl >= 0 && j < diag - s.wl) return false;
    if (s.wr >= 0 && j > diag + s.wr) return false;
    return true;
  }
  /* SPEC.md's softmax attention and its gradients in double; out is rounded to T (as a forward
   * stores it) before Delta = rowsum(dout * out). */
  void reference() {
    const int B = s.B, Tq = s.Tq, Tk = s.Tk, H = s.H, D = s.D, G = s.H / s.Hkv;
    const double scale = 1.0 / sqrt((double)D);
    lse.assign((size_t)B * H * Tq, -INFINITY), delta.assign((size_t)H * B * Tq, 0.f);
    dq.assign(nq, 0), dk.assign(nk, 0), dv.assign(nk, 0);
    auto Q = [&](int b, int i, int h, int d) { return (double)float(q[(((size_t)b * Tq + i) * H + h) * D + d]); };
    auto K = [&](int b, int j, int g, int d) { return (double)float(k[(((size_t)b * Tk + j) * s.Hkv + g) * D + d]); };
    auto V = [&](int b, int j, int g, int d) { return (double)float(v[(((size_t)b * Tk + j) * s.Hkv + g) * D + d]); };
    auto DO = [&](int b, int i, int h, int d) { return (double)float(dout[(((size_t)b * Tq + i) * H + h) * D + d]); };
    std::vector<double> p(Tk), dp(Tk), orow(D);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < Tq; ++i) {
          const int g = h / G;
          double mx = -INFINITY;
          for (int j = 0; j < Tk; ++j) {
            double x = -INFINITY;
            if (visible(i, j)) {
              x = 0;
              for (int d = 0; d < D; ++d) x += Q(b, i, h, d) * K(b, j, g, d);
              x *= scale;
            }
            p[j] = x, mx = std::max(mx, x);
          }
          const size_t orow_at = (((size_t)b * Tq + i) * H + h) * D;
          if (mx == -INFINITY) { /* nothing visible: out 0, lse -inf, no gradient */
            for (int d = 0; d < D; ++d) o[orow_at + d] = T(0.f);
            continue;
          }
          double z = 0;
          for (int j = 0; j < Tk; ++j) z += p[j] = exp(p[j] - mx);
          for (int j = 0; j < Tk; ++j) p[j] /= z;
          lse[((size_t)b * H + h) * Tq + i] = (float)(mx + log(z));
          double dl = 0;
          for (int d = 0; d < D; ++d) {
            double acc = 0;
            for (int j = 0; j < Tk; ++j) acc += p[j] * V(b, j, g, d);
            o[orow_at + d] = T((float)acc);
            dl += DO(b, i, h, d) * (double)float(o[orow_at + d]);
          }
          delta[(size_t)h * B * Tq + (size_t)b * Tq + i] = (float)dl;
          for (int j = 0; j < Tk; ++j) {
            if (p[j] == 0) continue;
            double x = 0;
            for (int d = 0; d < D; ++d) x += DO(b, i, h, d) * V(b, j, g, d);
            const double ds = p[j] * (x - (double)(float)dl);
            const size_t kj = (((size_t)b * Tk + j) * s.Hkv + g) * D;
            for (int d = 0; d < D; ++d) {
              dq[orow_at + d] += scale * ds * K(b, j, g, d);
              dk[kj + d] += scale * ds * Q(b, i, h, d);
              dv[kj + d] += p[j] * DO(b, i, h, d);
            }
          }
        }
  }
};

template <typename X> X *upload(const std::vector<X> &h) {
  X *d = nullptr;
  CU(cudaMalloc(&d, std::max<size_t>(h.size(), 1) * sizeof(X)));
  if (!h.empty()) CU(cudaMemcpy(d, h.data(), h.size() * sizeof(X), cudaMemcpyHostToDevice));
  return d;
}

/* Device tensors and the parameters of a dense problem (dq / dk / dv set by the caller). */
template <typename T> struct Dev {
  T *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  float *lse, *delta, *acc;
  attn_cuda_params p;
  Dev(const Problem &s, const Host<T> *h) {
    const size_t nq = (size_t)s.B * s.Tq * s.H * s.D, nk = (size_t)s.B * s.Tk * s.Hkv * s.D, nl = (size_t)s.B * s.H * s.Tq;
    auto alloc = [](size_t n, size_t e) {
      void *d;
      CU(cudaMalloc(&d, std::max<size_t>(n, 1) * e));
      return d;
    };
    if (h != nullptr) {
      q = upload(h->q), k = upload(h->k), v = upload(h->v), o = upload(h->o), dout = upload(h->dout);
      lse = upload(h->lse), delta = upload(h->delta);
    } else { /* the benchmark: random inputs, lse 0 and Delta 0 (the timing does not depend on them) */
      q = (T *)alloc(nq, 2), k = (T *)alloc(nk, 2), v = (T *)alloc(nk, 2), o = (T *)alloc(nq, 2), dout = (T *)alloc(nq, 2);
      lse = (float *)alloc(nl, 4), delta = (float *)alloc(nl, 4);
      fill<<<1024, 256>>>(q, nq, 1), fill<<<1024, 256>>>(k, nk, 2), fill<<<1024, 256>>>(v, nk, 3);
      fill<<<1024, 256>>>(dout, nq, 4);
      CU(cudaMemset(lse, 0, nl * 4));
      CU(cudaMemset(delta, 0, nl * 4));
    }
    /* the f32 dQ workspace: the atomic kernels' [H, B * Tq, D] or the sm90 backward's tiles */
    const size_t tiles = (size_t)ATTN_CUDA_SM90_DQ_FLOATS(s.H, s.B, s.Tq, s.D);
    dq = (T *)alloc(nq, 2), dk = (T *)alloc(nk, 2), dv = (T *)alloc(nk, 2), acc = (float *)alloc(tiles > nq ? tiles : nq, 4);
    memset(&p, 0, sizeof p);
    p.q = q, p.k = k, p.v = v, p.out = o, p.dout = dout, p.lse = lse, p.delta = delta, p.dq_accum = acc;
    p.dq_out = dq, p.dk_out = dk, p.dv_out = dv;
    p.q_h = p.o_h = p.do_h = p.dq_h = p.k_h = p.v_h = p.dk_h = p.dv_h = s.D;
    p.q_r = p.o_r = p.do_r = p.dq_r = (int64_t)s.H * s.D, p.k_r = p.v_r = p.dk_r = p.dv_r = (int64_t)s.Hkv * s.D;
    p.q_b = p.o_b = p.do_b = p.dq_b = (int64_t)s.Tq * p.q_r, p.k_b = p.v_b = p.dk_b = p.dv_b = (int64_t)s.Tk * p.k_r;
    p.lse_b = (int64_t)s.H * s.Tq, p.lse_h = s.Tq, p.lse_r = 1;
    p.batch = s.B, p.seqlen_q = s.Tq, p.seqlen_k = s.Tk, p.heads_q = s.H, p.heads_kv = s.Hkv;
    p.group = s.H / s.Hkv, p.d = p.dv = s.D, p.rows_q = (int64_t)s.B * s.Tq;
    p.scale = 1.f / sqrtf((float)s.D), p.window_left = s.wl, p.window_right = s.wr;
    p.align_bottom_right = s.bottom_right, p.keep_scale = 1.f;
  }
  ~Dev() {
    for (void *x : {(void *)q, (void *)k, (void *)v, (void *)o, (void *)dout, (void *)dq, (void *)dk, (void *)dv,
                    (void *)lse, (void *)delta, (void *)acc})
      cudaFree(x);
  }
};

template <typename C> void run90(const attn_cuda_params &p) {
  char why[256];
  if (sm90::launch_bwd90<C>(p, 0, why, sizeof why) != ATTN_STATUS_OK) {
    printf("sm90 backward: %s\n", why);
    exit(1);
  }
}
template <typename T, int kD> void run80(const attn_cuda_params &p) {
  char why[256];
  if (run_bwd<T, kD>(p, 0, why, sizeof why) != ATTN_STATUS_OK) {
    printf("atomic backward: %s\n", why);
    exit(1);
  }
}

/* relative L2 error of a device gradient against the reference, NaN / inf counted as 1e30 */
template <typename T> double rel_err(const T *dev, const std::vector<double> &ref) {
  std::vector<T> h(ref.size());
  CU(cudaMemcpy(h.data(), dev, h.size() * sizeof(T), cudaMemcpyDeviceToHost));
  double e2 = 0, r2 = 0;
  for (size_t i = 0; i < h.size(); ++i) {
    const double x = float(h[i]);
    if (!std::isfinite(x)) return 1e30;
    e2 += (x - ref[i]) * (x - ref[i]), r2 += ref[i] * ref[i];
  }
  return sqrt(e2 / std::max(r2, 1e-30));
}

/* Version C and the atomic backward on problem s against the reference: each gradient's relative
 * L2 error must be below 2x the atomic kernel's plus 2e-3 (bf16; both round dS and P to T). The
 * gradients are poisoned with NaN first. */
template <typename C> void check(const char *tag, const Problem &s, unsigned seed) {
  using T = typename C::T;
  Host<T> h(s, seed);
  Dev<T> d(s, &h);
  double e90[3], e80[3];
  auto poison = [&] {
    CU(cudaMemset(d.dq, 0xff, h.nq * 2));
    CU(cudaMemset(d.dk, 0xff, h.nk * 2));
    CU(cudaMemset(d.dv, 0xff, h.nk * 2));
  };
  poison();
  run80<T, C::kD>(d.p);
  CU(cudaDeviceSynchronize());
  e80[0] = rel_err(d.dq, h.dq), e80[1] = rel_err(d.dk, h.dk), e80[2] = rel_err(d.dv, h.dv);
  poison();
  run90<C>(d.p);
  CU(cudaDeviceSynchronize());
  e90[0] = rel_err(d.dq, h.dq), e90[1] = rel_err(d.dk, h.dk), e90[2] = rel_err(d.dv, h.dv);
  bool ok = true;
  for (int i = 0; i < 3; ++i) ok = ok && e90[i] <= 2 * e80[i] + 2e-3;
  failures += !ok;
  printf("lab bwd90 check %s %s D=%d B=%d Tq=%d Tk=%d H=%d Hkv=%d window=(%d,%d)%s seed %u: rel err dq %.2e dk %.2e dv "
         "%.2e (atomic %.2e %.2e %.2e) %s\n",
         tag, sizeof(T) == 2 && std::is_same<T, bf>::value ? "bf16" : "f16", s.D, s.B, s.Tq, s.Tk, s.H, s.Hkv, s.wl,
         s.wr, s.bottom_right ? " bottom-right" : "", seed, e90[0], e90[1], e90[2], e80[0], e80[1], e80[2],
         ok ? "ok" : "FAILED");
}

template <typename C> void checks(const char *tag, unsigned seed) {
  const int D = C::kD;
  check<C>(tag, {1, 128, 128, 2, 2, D, -1, -1, 0}, seed);        /* whole tiles */
  check<C>(tag, {2, 200, 333, 4, 2, D, -1, -1, 0}, seed + 1);    /* ragged, GQA */
  check<C>(tag, {2, 333, 200, 4, 4, D, -1, 0, 0}, seed + 2);     /* causal, rows seeing nothing past Tk? no: top-left */
  check<C>(tag, {1, 150, 390, 4, 1, D, -1, 0, 1}, seed + 3);     /* bottom-right causal, MQA */
  check<C>(tag, {1, 390, 150, 2, 1, D, -1, 0, 1}, seed + 4);     /* bottom-right, rows with nothing visible */
  check<C>(tag, {2, 300, 300, 2, 2, D, 50, 20, 0}, seed + 5);    /* sliding window */
  check<C>(tag, {3, 65, 70, 3, 3, D, -1, -1, 0}, seed + 6);      /* short sequences */
}

/* ---- v5: the features (the library's kernels: varlen, the soft cap, ALiBi, the deterministic
 * order), each checked against the atomic sm80 backward on the same inputs and timed beside it */

/* A feature set on top of a dense problem: the soft cap (0 = off), ALiBi slopes per head, packed or
 * padded varlen over per-sequence lengths (at most Tq / Tk), dQ in the deterministic order. */
struct Feat {
  const char *name;
  float softcap;
  bool alibi;
  int varlen; /* ATTN_CUDA_VARLEN_* */
  bool det;
};

/* The device arrays a feature set adds to a Dev's params. */
struct FeatDev {
  float *slopes = nullptr;
  int32_t *lens = nullptr, *counters = nullptr; /* lens: cu_q [B + 1], cu_k [B + 1], then padded lengths */
  ~FeatDev() {
    cudaFree(slopes);
    cudaFree(lens);
    cudaFree(counters);
  }
};

/* Sets f's features on d.p. Sequence b's lengths: Tq - 37 b and Tk - 53 b (at least 1) when ragged,
 * else Tq and Tk. */
template <typename T> void apply(Dev<T> &d, const Problem &s, const Feat &f, FeatDev &x, bool ragged) {
  attn_cuda_params &p = d.p;
  if (f.softcap > 0.f) p.softcap = f.softcap, p.elementwise_kinds |= ATTN_CUDA_FEAT_SOFTCAP;
  if (f.alibi) {
    std::vector<float> sl(s.H);
    for (int h = 0; h < s.H; ++h) sl[h] = exp2f(-8.f * (h + 1) / s.H);
    x.slopes = upload(sl);
    p.alibi = x.slopes, p.alibi_b = 0, p.alibi_h = 1, p.elementwise_kinds |= ATTN_CUDA_FEAT_ALIBI;
  }
  p.elementwise = p.elementwise_kinds != 0;
  if (f.varlen != ATTN_CUDA_VARLEN_NONE) {
    std::vector<int32_t> h(2 * (s.B + 1) + 2 * s.B, 0);
    int32_t *cq = h.data(), *ck = cq + s.B + 1, *lq = ck + s.B + 1, *lk = lq + s.B;
    for (int b = 0; b < s.B; ++b) {
      lq[b] = ragged ? std::max(s.Tq - 37 * b, 1) : s.Tq, lk[b] = ragged ? std::max(s.Tk - 53 * b, 1) : s.Tk;
      cq[b + 1] = cq[b] + lq[b], ck[b + 1] = ck[b] + lk[b];
    }
    x.lens = upload(h);
    p.varlen = f.varlen;
    if (f.varlen == ATTN_CUDA_VARLEN_PACKED) { /* the dense buffers hold at least the packed rows */
      p.cu_q = x.lens, p.cu_k = x.lens + s.B + 1, p.total_q = cq[s.B], p.total_k = ck[s.B];
      p.q_b = p.k_b = p.v_b = p.o_b = p.do_b = p.dq_b = p.dk_b = p.dv_b = 0;
      p.lse_b = 0, p.lse_h = p.total_q, p.lse_r = 1, p.rows_q = p.total_q;
    } else {
      p.seqlens_q = x.lens + 2 * (s.B + 1), p.seqlens_k = p.seqlens_q + s.B;
    }
  }
  if (f.det) {
    const size_t n = (size_t)ATTN_CUDA_SM90_DQ_SLICES(s.H, s.B, s.Tq);
    CU(cudaMalloc(&x.counters, std::max<size_t>(n, 1) * 4));
    p.dq_semaphore = x.counters;
  }
}

/* relative L2 difference of two device tensors of n elements, NaN / inf counted as 1e30 */
template <typename T> double rel_diff(const T *a, const T *b, size_t n) {
  std::vector<T> ha(n), hb(n);
  CU(cudaMemcpy(ha.data(), a, n * sizeof(T), cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(hb.data(), b, n * sizeof(T), cudaMemcpyDeviceToHost));
  double e2 = 0, r2 = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = float(ha[i]), y = float(hb[i]);
    if (!std::isfinite(x) || !std::isfinite(y)) return 1e30;
    e2 += (x - y) * (x - y), r2 += y * y;
  }
  return sqrt(e2 / std::max(r2, 1e-30));
}

/* Version C with features f against the atomic sm80 backward on the same inputs and lse / Delta
 * (the plain reference's: both kernels compute the same function of them): each gradient's
 * relative L2 difference must be below 1e-2 (bf16) or 2e-3 (f16). Gradients start as zeros (rows
 * outside the sequences stay so in both). With f.det the sm90 backward runs twice and dq must
 * repeat its bits. */
template <typename C> void check_feat(const char *tag, const Problem &s, const Feat &f, unsigned seed) {
  using T = typename C::T;
  Host<T> h(s, seed);
  Dev<T> d(s, &h);
  FeatDev x;
  apply(d, s, f, x, true);
  T *g80[3];
  for (int i = 0; i < 3; ++i) CU(cudaMalloc(&g80[i], (i == 0 ? h.nq : h.nk) * sizeof(T)));
  auto zero = [&] {
    CU(cudaMemset(d.dq, 0, h.nq * 2));
    CU(cudaMemset(d.dk, 0, h.nk * 2));
    CU(cudaMemset(d.dv, 0, h.nk * 2));
  };
  zero();
  attn_cuda_params p80 = d.p;
  p80.dq_semaphore = nullptr;
  run80<T, C::kD>(p80);
  CU(cudaDeviceSynchronize());
  CU(cudaMemcpy(g80[0], d.dq, h.nq * 2, cudaMemcpyDeviceToDevice));
  CU(cudaMemcpy(g80[1], d.dk, h.nk * 2, cudaMemcpyDeviceToDevice));
  CU(cudaMemcpy(g80[2], d.dv, h.nk * 2, cudaMemcpyDeviceToDevice));
  zero();
  run90<C>(d.p);
  CU(cudaDeviceSynchronize());
  const double e[3] = {rel_diff(d.dq, g80[0], h.nq), rel_diff(d.dk, g80[1], h.nk), rel_diff(d.dv, g80[2], h.nk)};
  const double tol = std::is_same<T, bf>::value ? 1e-2 : 2e-3;
  bool ok = e[0] <= tol && e[1] <= tol && e[2] <= tol, same = true;
  if (f.det) {
    std::vector<T> first(h.nq), again(h.nq);
    CU(cudaMemcpy(first.data(), d.dq, h.nq * 2, cudaMemcpyDeviceToHost));
    run90<C>(d.p);
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(again.data(), d.dq, h.nq * 2, cudaMemcpyDeviceToHost));
    same = memcmp(first.data(), again.data(), h.nq * 2) == 0;
  }
  ok = ok && same;
  failures += !ok;
  printf("lab bwd90 check %s %s %s D=%d B=%d Tq=%d Tk=%d H=%d Hkv=%d window=(%d,%d)%s seed %u: rel diff to the atomic "
         "sm80 dq %.2e dk %.2e dv %.2e%s %s\n",
         tag, f.name, std::is_same<T, bf>::value ? "bf16" : "f16", s.D, s.B, s.Tq, s.Tk, s.H, s.Hkv, s.wl, s.wr,
         s.bottom_right ? " bottom-right" : "", seed, e[0], e[1], e[2], f.det ? (same ? ", dq bits repeat" : ", dq bits DIFFER") : "",
         ok ? "ok" : "FAILED");
  for (int i = 0; i < 3; ++i) cudaFree(g80[i]);
}

template <typename C> void checks_feat(const char *tag, unsigned seed) {
  const int D = C::kD;
  const Feat feats[] = {{"softcap", 20.f, false, ATTN_CUDA_VARLEN_NONE, false},
                        {"alibi", 0.f, true, ATTN_CUDA_VARLEN_NONE, false},
                        {"softcap+alibi", 5.f, true, ATTN_CUDA_VARLEN_NONE, false},
                        {"packed", 0.f, false, ATTN_CUDA_VARLEN_PACKED, false},
                        {"padded", 0.f, false, ATTN_CUDA_VARLEN_PADDED, false},
                        {"packed+softcap+alibi", 10.f, true, ATTN_CUDA_VARLEN_PACKED, false},
                        {"deterministic", 0.f, false, ATTN_CUDA_VARLEN_NONE, true},
                        {"deterministic+packed+softcap", 10.f, false, ATTN_CUDA_VARLEN_PACKED, true}};
  unsigned k = 0;
  for (const Feat &f : feats) {
    check_feat<C>(tag, {2, 200, 333, 4, 2, D, -1, -1, 0}, f, seed + k++);   /* ragged, GQA */
    check_feat<C>(tag, {3, 333, 200, 4, 4, D, -1, 0, 0}, f, seed + k++);    /* causal top-left */
    check_feat<C>(tag, {2, 150, 390, 4, 1, D, -1, 0, 1}, f, seed + k++);    /* bottom-right causal, MQA */
    check_feat<C>(tag, {2, 700, 650, 2, 1, D, 200, 70, 1}, f, seed + k++);  /* a window: many key blocks per dq tile */
    check_feat<C>(tag, {2, 400, 130, 2, 2, D, 10, 0, 1}, f, seed + k++);    /* tiles no key block adds into */
  }
}

/* Times version C beside the atomic backward on the bench shape. */
template <typename C> void bench(const char *tag, int causal) {
  using T = typename C::T;
  const int D = C::kD, T_ = 8192, B = 16384 / T_, H = 2048 / D;
  const Problem s{B, T_, T_, H, H, D, -1, causal ? 0 : -1, 0};
  Dev<T> d(s, nullptr);
  const double flops = 2.5 * 4.0 * B * H * (double)T_ * T_ * D * (causal ? 0.5 : 1.0);
  const float ms = median_ms([&] { run90<C>(d.p); });
  const float ms80 = median_ms([&] { run80<T, D>(d.p); });
  printf("lab bwd90 %s D=%d T=%d causal=%d: %.3f ms %.1f TFLOPS (atomic sm80 %.3f ms %.1f TFLOPS): %.2fx\n", tag, D, T_,
         causal, ms, flops / ms * 1e-9, ms80, flops / ms80 * 1e-9, ms80 / ms);
}

/* Times version C with each feature set beside its plain run and the atomic sm80 backward (the same
 * params) on the bench shape; varlen as packed / padded sequences of the full length (the same
 * work as the dense problem); "gqa 4:1" with Hkv = Hq / 4. */
template <typename C> void bench_feat(int causal, const char *tag, const char *only = nullptr) {
  using T = typename C::T;
  const int D = C::kD, T_ = 8192, B = 16384 / T_, H = 2048 / D;
  const double flops = 2.5 * 4.0 * B * H * (double)T_ * T_ * D * (causal ? 0.5 : 1.0);
  const Feat feats[] = {{"plain", 0.f, false, ATTN_CUDA_VARLEN_NONE, false},
                        {"softcap", 30.f, false, ATTN_CUDA_VARLEN_NONE, false},
                        {"alibi", 0.f, true, ATTN_CUDA_VARLEN_NONE, false},
                        {"packed", 0.f, false, ATTN_CUDA_VARLEN_PACKED, false},
                        {"padded", 0.f, false, ATTN_CUDA_VARLEN_PADDED, false},
                        {"gqa 4:1", 0.f, false, ATTN_CUDA_VARLEN_NONE, false},
                        {"deterministic", 0.f, false, ATTN_CUDA_VARLEN_NONE, true}};
  float plain_ms = 0.f;
  for (const Feat &f : feats) {
    if (only != nullptr && f.name != feats[0].name && strcmp(f.name, only) != 0) continue; /* plain and `only` */
    const bool gqa = strcmp(f.name, "gqa 4:1") == 0;
    const Problem s{B, T_, T_, H, gqa ? H / 4 : H, D, -1, causal ? 0 : -1, 0};
    Dev<T> d(s, nullptr);
    FeatDev x;
    apply(d, s, f, x, false);
    attn_cuda_params p80 = d.p;
    p80.dq_semaphore = nullptr;
    const float ms = median_ms([&] { run90<C>(d.p); });
    const float ms80 = median_ms([&] { run80<T, D>(p80); });
    if (plain_ms == 0.f) plain_ms = ms;
    printf("lab bwd90 %s %s D=%d T=%d causal=%d: %.3f ms %.1f TFLOPS, %.2fx plain (atomic sm80 %.3f ms %.1f TFLOPS: "
           "%.2fx)\n",
           tag, f.name, D, T_, causal, ms, flops / ms * 1e-9, plain_ms / ms, ms80, flops / ms80 * 1e-9, ms80 / ms);
  }
}

/* Delta = rowsum(dout * out) of a dense problem, one thread per (row, head), in the kernels'
 * layout [H][B * Tq]. */
template <typename T> __global__ void delta_rows(const __grid_constant__ attn_cuda_params p) {
  const int64_t n = p.rows_q * p.heads_q;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += gridDim.x * (int64_t)blockDim.x) {
    const int h = (int)(e % p.heads_q);
    const int64_t row = e / p.heads_q;
    const T *o = static_cast<const T *>(p.out) + row * p.o_r + h * p.o_h;
    const T *g = static_cast<const T *>(p.dout) + row * p.do_r + h * p.do_h;
    float acc = 0.f;
    for (int c = 0; c < p.d; ++c) acc += (float)o[c] * (float)g[c];
    p.delta[h * p.rows_q + row] = acc;
  }
}

/* The plain bench shape timed twice in one process: on Dev's benchmark inputs (lse 0, Delta 0,
 * as every figure above) and on a real forward's out and lse (the sm80 forward) with their Delta,
 * as the library's call sees them. A difference is the data's (the clocks an H200 holds at its
 * power limit depend on what the tensor cores toggle), not the kernel's: it runs the same
 * instructions on either. */
template <typename C> void bench_real_lse(const char *tag, int causal) {
  using T = typename C::T;
  const int D = C::kD, T_ = 8192, B = 16384 / T_, H = 2048 / D;
  const Problem s{B, T_, T_, H, H, D, -1, causal ? 0 : -1, 0};
  const double flops = 2.5 * 4.0 * B * H * (double)T_ * T_ * D * (causal ? 0.5 : 1.0);
  Dev<T> d(s, nullptr);
  const float ms_zero = median_ms([&] { run90<C>(d.p); });
  char why[256];
  if (run_fwd<T, C::kD>(d.p, 0, why, sizeof why) != ATTN_STATUS_OK) {
    printf("sm80 forward: %s\n", why);
    exit(1);
  }
  delta_rows<T><<<1024, 256>>>(d.p);
  CU(cudaGetLastError());
  const float ms_real = median_ms([&] { run90<C>(d.p); });
  printf("lab bwd90 %s lse D=%d T=%d causal=%d: lse 0 / Delta 0 %.3f ms %.1f TFLOPS, a forward's lse / Delta %.3f ms "
         "%.1f TFLOPS (%.2fx)\n",
         tag, D, T_, causal, ms_zero, flops / ms_zero * 1e-9, ms_real, flops / ms_real * 1e-9, ms_zero / ms_real);
}

/* v6's dq conversion as it was (one thread per pair of columns, the tile's place worked out per
 * element), timed beside the library's (one CTA per tile) in bench_parts. */
template <typename T, int kD> __global__ void dq_convert_per_element(const __grid_constant__ attn_cuda_params p) {
  const int64_t n = (int64_t)p.batch * p.seqlen_q * p.heads_q * (kD / 2);
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += gridDim.x * (int64_t)blockDim.x) {
    const int c = (int)(e % (kD / 2)) * 2;
    const int64_t rest = e / (kD / 2);
    const int h = (int)(rest % p.heads_q);
    const int64_t row = rest / p.heads_q;
    const int b = (int)(row / p.seqlen_q), i = (int)(row % p.seqlen_q);
    const Seq sq = seq_of(p, b);
    if (i >= sq.len_q) continue;
    const int m0 = i / ATTN_CUDA_SM90_BWD_ROWS * ATTN_CUDA_SM90_BWD_ROWS;
    const float2 v = *reinterpret_cast<const float2 *>(p.dq_accum + sm90::dq_tile_index<kD>(p, h, b, m0, i - m0, c));
    *reinterpret_cast<uint32_t *>(static_cast<T *>(p.dq_out) + b * p.dq_b + (sq.q0 + i) * p.dq_r + h * p.dq_h + c) =
        Elem<T>::pack(v.x * p.scale, v.y * p.scale);
  }
}

/* The parts of the sm90 backward's call on the plain bench shape (D, non-causal), each timed
 * alone: the workspace's zeroing, the dq conversion (per element as in v6, per tile now, whose
 * output must be the same bits), and the whole call. */
template <int kD> void bench_parts() {
  const int T_ = 8192, B = 16384 / T_, H = 2048 / kD;
  const Problem s{B, T_, T_, H, H, kD, -1, -1, 0};
  Dev<bf> d(s, nullptr);
  const int64_t floats = ATTN_CUDA_SM90_DQ_FLOATS(s.H, s.B, s.Tq, kD);
  fill<<<1024, 256>>>(reinterpret_cast<bf *>(d.p.dq_accum), (size_t)floats * 2, 5); /* any bits, as floats */
  const float zero = median_ms([&] { CU(cudaMemsetAsync(d.p.dq_accum, 0, (size_t)floats * 4, 0)); });
  fill<<<1024, 256>>>(reinterpret_cast<bf *>(d.p.dq_accum), (size_t)floats * 2, 5);
  const int64_t n = (int64_t)s.B * s.Tq * s.H * (kD / 2), blocks = (n + 255) / 256;
  const int64_t tiles = (int64_t)s.H * s.B * ((s.Tq + 63) / 64);
  const size_t nq = (size_t)s.B * s.Tq * s.H * kD;
  const float old_ms = median_ms([&] { dq_convert_per_element<bf, kD><<<(int)(blocks > 65535 ? 65535 : blocks), 256>>>(d.p); });
  std::vector<bf> before(nq), after(nq);
  CU(cudaMemcpy(before.data(), d.dq, nq * 2, cudaMemcpyDeviceToHost));
  CU(cudaMemset(d.dq, 0xff, nq * 2));
  const float new_ms = median_ms([&] { sm90::dq_tiles_convert_kernel<bf, kD, true><<<(int)(tiles > 65535 ? 65535 : tiles), 256>>>(d.p); });
  CU(cudaMemcpy(after.data(), d.dq, nq * 2, cudaMemcpyDeviceToHost));
  const bool same = memcmp(before.data(), after.data(), nq * 2) == 0;
  failures += !same;
  const float whole = median_ms([&] { run90<BwdCfg90<bf, kD>>(d.p); });
  printf("lab bwd90 parts D=%d T=%d causal=0: zeroing %.3f ms, dq conversion per element %.3f ms, per tile %.3f ms "
         "(%s); the whole call %.3f ms\n",
         kD, T_, zero, old_ms, new_ms, same ? "the same bits" : "DIFFERENT bits", whole);
}

int main(int argc, char **argv) {
  setvbuf(stdout, nullptr, _IONBF, 0); /* every line out before a timeout ends the run */
  if (argc > 1 && strcmp(argv[1], "ncu") == 0) { /* one shape, for Nsight Compute: the library's
                                                    * kernel at D = 64 (v8, the target it misses), non-causal */
    bench<BwdCfg90<bf, 64, 3, true, true, true>>("v8", 0);
    return failures != 0;
  }
  /* usage: bwd90 [SEED] [bench | check bf16 | check f16 | v10 | v11]: everything by default; one dtype's
   * checks at a time, so that two run side by side on the host's cores (the CPU reference is what
   * takes their time) */
  unsigned seed = argc > 1 ? (unsigned)atoi(argv[1]) : 1234u;
  const char *what = argc > 2 ? argv[2] : "all", *dtype = argc > 3 ? argv[3] : "all";
  const bool all = strcmp(what, "all") == 0;
  printf("seed %u\n", seed);
  using V6_128 = BwdCfg90<bf, 128>; /* the library's: v4's schedule, v6's elementwise step */
  using V6_64 = BwdCfg90<bf, 64>;
  using V6_128h = BwdCfg90<hf, 128>;
  using V6_64h = BwdCfg90<hf, 64>;
  using V8_128 = BwdCfg90<bf, 128, 3, true, true, true>; /* v8: the next item's S^T / dP^T prefetched */
  using V8_64 = BwdCfg90<bf, 64, 3, true, true, true>;
  using V8_128h = BwdCfg90<hf, 128, 3, true, true, true>;
  /* the grid in x-major order under a causal mask too, as before the bands */
  using V6x_128 = BwdCfg90<bf, 128, 2, true, true, false, false>;
  using V8x_64 = BwdCfg90<bf, 64, 3, true, true, true, false>;
  using V8_64h = BwdCfg90<hf, 64, 3, true, true, true>;
  using V9_256 = BwdCfg90<bf, 256>; /* v9: D = 256, both warpgroups on 64 keys, columns split (kSplit) */
  using V9_256h = BwdCfg90<hf, 256>;
  /* every feature of the library's configurations (bf16 and f16) checked; main's exit status */
  auto library_checks = [&](const char *tag) {
    checks_feat<V8_64>(tag, seed);
    checks_feat<V6_128>(tag, seed);
    checks_feat<V9_256>(tag, seed);
    checks_feat<V8_64h>(tag, seed);
    checks_feat<BwdCfg90<hf, 128>>(tag, seed);
    checks_feat<V9_256h>(tag, seed);
    printf("lab bwd90: %d failed checks\n", failures);
    return failures != 0;
  };
  if (strcmp(what, "v11") == 0) { /* the soft cap exact (v10) and by tanh.approx (v11), timed, then v11 checked */
    using E64 = BwdCfg90<bf, 64, 3, true, true, true, true, false>;
    using E128 = BwdCfg90<bf, 128, 2, true, true, false, true, false>;
    using E256 = BwdCfg90<bf, 256, 2, true, true, false, true, false>;
    for (int c = 0; c < 2; ++c) {
      bench_feat<E64>(c, "v10 exact", "softcap");
      bench_feat<V8_64>(c, "v11 tanh.approx", "softcap");
      bench_feat<E128>(c, "v10 exact", "softcap");
      bench_feat<V6_128>(c, "v11 tanh.approx", "softcap");
      bench_feat<E256>(c, "v10 exact", "softcap");
      bench_feat<V9_256>(c, "v11 tanh.approx", "softcap");
    }
    return library_checks("v11");
  }
  if (strcmp(what, "v10") == 0) { /* the library's configurations: the features timed, then checked */
    for (int c = 0; c < 2; ++c) {
      bench_feat<V8_64>(c, "v8");
      bench_feat<V6_128>(c, "v6");
      bench_feat<V9_256>(c, "v9");
    }
    return library_checks("library");
  }
  /* the timings first: a device call cut short by its time limit keeps them */
  if (all || strcmp(what, "bench") == 0) {
    for (int c = 0; c < 2; ++c) {
      bench_real_lse<V6_128>("v6", c);
      bench_real_lse<V9_256>("v9", c);
    }
    for (int c = 0; c < 2; ++c) bench_feat<V9_256>(c, "v9");
    for (int c = 0; c < 2; ++c) {
      bench_feat<V6_128>(c, "v6");
      bench_feat<V6x_128>(c, "v6 x-major");
      bench_feat<V8_64>(c, "v8");
      bench_feat<V8x_64>(c, "v8 x-major");
    }
  }
  auto want = [&](const char *t) {
    return (all || strcmp(what, "check") == 0) && (strcmp(dtype, "all") == 0 || strcmp(dtype, t) == 0);
  };
  if (want("bf16")) {
    checks<V9_256>("v9", seed);
    checks_feat<V9_256>("v9", seed);
    checks_feat<V8_128>("v8", seed);
    checks_feat<V8_64>("v8", seed);
    checks<V8_128>("v8", seed);
    checks<V8_64>("v8", seed);
    checks_feat<V6_128>("v6", seed);
    checks<V6_128>("v6", seed);
    checks<V6x_128>("v6 x-major", seed);
  }
  if (want("f16")) {
    checks<V9_256h>("v9", seed);
    checks_feat<V9_256h>("v9", seed);
    checks_feat<V8_128h>("v8", seed);
    checks_feat<V8_64h>("v8", seed);
    checks<V8_128h>("v8", seed);
    checks<V8_64h>("v8", seed);
  }
  /* v1, v2 and v4 stay compilable, their figures above; the lab no longer times them (device time) */
  (void)sizeof(BwdCfg90<bf, 128, 2, false, false>), (void)sizeof(BwdCfg90<bf, 128, 2, true, false>);
  printf("lab bwd90: %d failed checks\n", failures);
  return failures != 0;
}
