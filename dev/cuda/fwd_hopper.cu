/*
 * dev/cuda/fwd_hopper.cu - kernel lab: the Hopper forward (src/impl/cuda/sm90/sm90_fwd.cuh: TMA,
 * wgmma, a producer warpgroup and two or three consumer warpgroups) at several configurations, each checked
 * first against the sm_80 kernel (src/impl/cuda/cuda_fwd.cuh, the tested one) on odd shapes
 * (ragged lengths, GQA, f16, a window, bottom-right causal with Tq != Tk; the output poisoned with
 * NaN first), then timed beside it on the bench shapes (bf16, B * T = 16384, Hq * D = 2048,
 * T = 8192, causal and not). dev/cuda/fwd_hopper_torch.py times cuDNN and flash through PyTorch
 * on the same shapes in the same call (gpu/run.sh cuda lab runs both).
 *
 * Versions (H100 80GB HBM3, bf16, T = 8192, TFLOPS non-causal / causal; each measured in two or
 * three device calls of 2026-11-24, the spread is the range; cuDNN 9.19 through PyTorch 2.11's SDPA
 * with inputs that require grad, so it computes the log-sum-exp as ours does, in the same calls:
 * D = 64 466-468 / 430-449, D = 128 639-664 / 570-606, D = 256 725 / 592; the sm_80 kernel
 * 312-335 / 283-304, 337-366 / 292-336, 270-289 / 236-245):
 *   v1 TMA (128-byte swizzle, kStages K/V buffers, mbarriers) by a producer warpgroup; two
 *      consumer warpgroups of 64 rows, S = Q K^T and O += P V by wgmma (P from registers),
 *      softmax between them; setmaxnreg 24 / 240. D = 64 (128 keys, 3 stages) 385-413 / 349-356,
 *      D = 128 (128 keys, 2 stages) 597-606 / 525-556, D = 256 (64 keys, 2 stages) 633-651 /
 *      550-569. Predicted from FlashAttention-3's ablation (570 without its two overlaps): met.
 *   v2 v1 with S(n+1) = Q K(n+1)^T issued together with P(n) V(n), the softmax of S(n+1)
 *      computed while P(n) V(n) runs: D = 64 428-449 / 398-400, D = 128 660-668 / 572-600
 *      (1.00-1.05x / 0.97-1.00x cuDNN), D = 256 695-697 / 586-598 (0.96x / 0.99x). Not kept: 3 stages at
 *      D = 128 (644 / 564: the third buffer buys no latency the second does not already hide),
 *      192 keys at D = 64 (393 / 327: ptxas spills at 240 registers).
 *   v3 three consumer warpgroups at D = 64 (192-row CTAs, 160 registers each: every K/V tile
 *      feeds 1.5x the rows): 472 / 390 with 3 stages (kept: sm90_launch.cu), 498 / 356 with 4.
 *      Under the causal band the taller CTAs mask more and leave fewer CTAs for the tail.
 *   v4 the feature kernel (fwd90_kernel<C, true>): soft cap (tanh.approx inside the band), sinks,
 *      ALiBi, bias, masks, segment ids (the sm_80 kernel's visible() / logit() per element),
 *      packed and padded varlen (maps over the packed rows; V rows past a sequence zeroed in
 *      shared memory); two consumer warpgroups at D = 64 (three spill). Checked against the
 *      sm_80 kernel on each feature alone and together, varlen padding poisoned with NaN;
 *      `fwd_hopper SEED features` times each on the bench shape beside the plain kernel (the
 *      issue's target: >= 0.9x). Measured (one call, H100, ratio to plain non-causal / causal):
 *      soft cap 30 0.63 / 0.52 (D = 64), 0.83 / 0.57 (128), 0.97 / 0.78 (256); 1 sink 0.80 / 0.63,
 *      0.92 / 0.67, 0.91 / 0.83; ALiBi 0.03 / 0.05, 0.05 / 0.06, 0.22 / 0.21; packed varlen
 *      0.80 / 0.63, 0.98 / 0.70, 0.90 / 0.89.
 *   v5 three instantiations by mode (sm90::fwd90_mode): sinks and varlen on the plain kernel (the
 *      sinks seed the row statistics once; varlen costs nothing per score); soft cap and ALiBi on
 *      a cap / ALiBi kernel that computes them on the whole S tile in registers (the cap by
 *      SoftCap::logit2, ALiBi as one FADD and one FFMA in dot-product units from a per-row
 *      distance, the slope read once) and masks only the band's edge blocks; the rest (bias,
 *      masks, segment ids, caps above 1024) on the generic kernel. One call (H100, bf16,
 *      T = 8192), ratio to plain non-causal / causal, and to the sm80 kernel with the feature:
 *        D = 64:  cap 0.52 / 0.59 (1.21 / 1.13x sm80), 1 sink 1.02 / 1.02, ALiBi 0.92 / 0.99
 *                 (10.1 / 9.0x sm80), cap + ALiBi 0.50 / 0.56, packed varlen 1.04 / 1.00,
 *                 row bias (generic) 0.03 / 0.05 (0.46 / 0.55x sm80)
 *        D = 128: cap 0.61 / 0.61 (1.58 / 1.44x), 1 sink 1.06 / 1.00, ALiBi 0.93 / 0.90 (9.5 /
 *                 9.6x), cap + ALiBi 0.57 / 0.59, varlen 1.01 / 1.00, bias 0.05 / 0.06 (0.58 /
 *                 0.68x sm80)
 *        D = 256: cap 0.80 / 0.80 (2.4 / 2.2x), 1 sink 1.05 / 1.00, ALiBi 0.98 / 0.95 (9.0 /
 *                 8.5x), cap + ALiBi 0.76 / 0.76, varlen 1.09 / 0.99, bias 0.18 / 0.18 (1.75 /
 *                 1.63x sm80)
 *      ALiBi's 20-30x was the generic path on every block (ptxas: no spill at D = 128, no wgmma
 *      serialisation there): per score visible(), logit() with the slope loaded from global
 *      memory and the branches of every other feature, 64 unrolled copies per thread and block;
 *      the generic kernel still costs that (0.03-0.18x: the smaller the key block, kBN = 64 at
 *      D = 256, the less it loses, which suggests its unrolled code size rather than its
 *      arithmetic), so the library builds and offers it at D = 256 only (kGenericDeclined). The
 *      soft cap is bound by the special-function unit: the softmax's ex2 alone about matches
 *      wgmma's time per score at D <= 128, and logit2 adds an ex2 and an rcp (v4's tanh.approx
 *      added one, 0.63 / 0.83 / 0.97 non-causal, with a relative error of 2^-11, cap * 5e-4 on a
 *      logit). Tried, not measured (no device time left): 1 / (1 + u) by Newton's iteration on
 *      the FMA pipe (commit 3da0619's cap_logit2), two special-function ops a score.
 *   v6 the soft cap's 1 / (1 + u) by rcp_1to2 on the FMA pipe (cap_logit2_fma: a degree-2
 *      start and a cubic correction, within 7e-8; kCapRcpFma), two special-function ops a score
 *      instead of three, six FMAs more; "half": on every other 8-key group (measured in this
 *      call, since removed). One call (H100,
 *      2026-11-24, soft cap 30, ratio to the plain kernel non-causal / causal, v5 in the same
 *      call): D = 64 0.48 / 0.53 (v5 0.52 / 0.58; ptxas spills 252 bytes at 160 registers), two
 *      consumer warpgroups 0.51 / 0.60, half 0.53 / 0.65; D = 128 0.63 / 0.64 (v5 0.59 / 0.60),
 *      half 0.63 / 0.62; D = 256 0.80 / 0.78 (v5 0.81 / 0.79). So the special-function unit was
 *      not the bound (static SASS counts: v5's cap ~11 instructions a score more than the plain
 *      kernel, v6's ~14). Not kept (v9 is; kCapRcpFma stays for the lab).
 *   v7 a share of the softmax's exponentials on the FMA pipe (ex2_fma: round-to-integer by
 *      1.5 * 2^23, a degree-3 minimax polynomial on [-1/2, 1/2], 7.5e-5 relative; FlashAttention-
 *      4's split), one 8-key group in 4 or 2 (kExpFmaEvery). Same call: plain D = 64 1/4 471.5 /
 *      367.1 TFLOPS (v3 467.9 / 344.4), 1/2 431.9 / 337.8; D = 128 1/4 579.4 / 544.9 (v2 644.1 /
 *      593.6); with the cap no gain (D = 64 0.50 / 0.54, D = 128 0.61 / 0.61, D = 256 0.76 /
 *      0.72). Not kept.
 *   v8 the consumer warpgroups' ping-pong (kPingPong: each issues its two products after a
 *      named barrier the one before it arrives at once it has issued its own, so one's softmax
 *      runs under the others' products; FlashAttention-3's inter-warpgroup overlap). Same call,
 *      plain: D = 64 (three warpgroups) 512.5 / 413.7 TFLOPS against v3's 467.9 / 344.4 (1.10x /
 *      1.20x: kept, sm90_launch.cu); D = 128 622.2 / 573.1 against 644.1 / 593.6, D = 256 680.1 /
 *      595.5 against 682.2 / 603.0 (not kept); with the cap no gain (0.49-0.62).
 *      The same call's feature table (the plain kernel v3 / v2, the cap v6): 1 sink, packed
 *      varlen and GQA 4:1 0.98-1.17x plain at every head dim; ALiBi 0.84 / 0.88 (D = 64), 0.90 /
 *      0.90, 0.99 / 0.99; a sliding window of 2048 keys (its TFLOPS over the scores it sees)
 *      0.77 / 0.66, 0.82 / 0.74, 0.87 / 0.88: its CTAs see 17 key blocks each, two of them
 *      masked, so the prologue and epilogue that one CTA per 128 or 192 rows leaves unhidden
 *      weigh as at T = 2048 (a persistent scheduler is what is left).
 *   v9 the soft cap folded into the softmax (kCapFused, cap_softmax): with z = dot * (-2 log2(e)
 *      scale / cap) the capped logit is cap log2(e) (2 / (1 + 2^z) - 1), falling in z, so the
 *      row's largest logit comes from its smallest z, computed once a row, and P = ex2(r 2 out -
 *      (out + max)) with r = rcp(1 + ex2(z)): 8.5 instructions a score in all (v5: ~15, v6:
 *      ~15.5), three special-function ops, no sign to restore, one pass less. D = 64's cap /
 *      ALiBi kernel on two consumer warpgroups (ptxas spills it at 160 registers). One call (H100,
 *      2026-11-25, soft cap 30, ratio to the library's plain kernel, v5 in the same call): D = 64
 *      0.44 / 0.53 (v5 0.46 / 0.52; three warpgroups with ping-pong 0.48 / 0.49, without 0.47 /
 *      0.51, with v7's exponentials 1/4 0.50 / 0.50), D = 128 0.61 / 0.62 (v5 0.60 / 0.60, v6
 *      0.63 / 0.62, exponentials 1/4 0.63 / 0.62), D = 256 0.94 / 0.82 (v5 0.80 / 0.80; 1/4 0.83 /
 *      0.78). Kept (sm90_launch.cu): it wins at D = 256 and ties at 64 and 128, with the fewest
 *      instructions. ncu (`fwd_hopper ncu-cap`, D = 128 non-causal, beside `ncu`'s plain launch):
 *      2.60 ms against 1.65, 881M instructions issued against 599M (+47%: ~4 a score), issue slots
 *      35% busy (plain 40%), 6.15 cycles per issued instruction (5.33), no warp eligible in 64% of
 *      the cycles (58%), 0.51 eligible of 2.24 active warps per scheduler, a third of the stalls
 *      on fixed-latency dependencies, the special-function unit ~64% busy (3 ops a score against
 *      the plain kernel's 1 at 37%), the tensor pipe 43%. Each consumer warp's softmax is a chain
 *      of dependent ops longer than the other warpgroup's products, and two consumer warps per
 *      scheduler cannot hide it: what is left is more independent work per warp (a third
 *      consumer warpgroup at D = 128 needs O, S and P in 160 registers: spills) or splitting a
 *      block's softmax in halves that overlap each other's products.
 *  v10 the persistent tile scheduler (FwdCfg90::kPersistent): one CTA per SM looping over tiles
 *      blockIdx.x, + gridDim.x, ... (a static stride; tile_of: longest first within sections of
 *      heads whose K and V fit half the L2), the K / V stages' and Q's mbarrier phases carried
 *      across tiles, a Q "empty" barrier so the producer loads the next tile's first K, Q and V
 *      while the consumers run the last P V and the epilogue. `fwd_hopper SEED sched`: every
 *      check of the persistent kernels (162 passed), then the grid (the same kernel with
 *      kPersistent off) against it on the issue's shapes. One call (H200, 2026-11-25, bf16,
 *      B * T = 16384, Hq * D = 2048; ms grid -> persistent, non-causal / causal):
 *        D = 64:  T = 512 0.247 -> 0.216 / 0.371 -> 0.333 (1.15x / 1.11x), T = 2048 1.05x /
 *                 0.99x, T = 8192 1.02x / 1.02x, window 2048 at T = 8192 1.06x / 1.02x
 *        D = 128: T = 512 0.202 -> 0.183 / 0.188 -> 0.160 (1.11x / 1.17x), T = 2048 0.94x /
 *                 1.00x, T = 8192 1.641 -> 1.773 / 0.982 -> 1.037 (0.93x / 0.95x), window 0.94x
 *                 / 0.99x
 *        D = 256: T = 512 0.95x / 1.08x, T = 2048 0.99x / 0.97x, T = 8192 0.93x / 0.86x, window
 *                 0.97x / 0.90x
 *      cuDNN 9.19 in the same call (fwd_hopper_torch.py 512 2048 8192, with grad): the library's
 *      choice (sm90_launch.cu: persistent_pays) at 0.55-1.20x of it (bench/RESULTS.md). So the
 *      scheduler pays where tiles are short (the producer's Q and first K / V loads and the
 *      launch of a CTA per tile were what T = 512 lost) and costs 5-14% on long tiles at D = 128
 *      and 256: the static stride leaves each CTA its ~8-16 tiles' sum, which under a causal
 *      band (tiles 1 to 64 blocks long, sections longest first but not the whole grid) and with
 *      uneven L2 hits differs from CTA to CTA, where the hardware's grid hands the next tile to
 *      whichever SM is free. Not tried (no device time left): an atomic tile counter, one
 *      section for the whole problem under a causal band. The windows stay at 0.67-0.89x of
 *      plain: a 2048-key window's tile is as long as T = 2048's (17 blocks, two of them at the
 *      band's edges, masked per score and half of their scores not counted), and plain at
 *      T = 2048 itself runs at 0.85-0.86x of T = 8192's speed at every head dim; what is
 *      left per tile is the consumers' own: the first S and its softmax with no P V beside them,
 *      the last P V with no softmax, and the epilogue's stores (ping-pong across tiles, or an
 *      epilogue through shared memory and TMA stores, would hide them).
 *  v11 (written and compiled, not yet run: no device time left) kSchedSnake: v10's static
 *      stride with every other wave reversed (CTA c takes wave k's tile k * SMs + c, or
 *      k * SMs + SMs - 1 - c when k is odd) and, under a causal band, one section for the whole
 *      problem, so the tiles run longest first over all heads. dev/cuda/tile_order_sim.py models
 *      the balance (a tile costs its key blocks plus one; finishing time over the ideal): causal,
 *      v10's stride 1.05-1.31 (D = 128, T = 2048: 1.31; D = 256, T = 8192: 1.27), the grid
 *      1.05-1.14, the snake 1.00-1.03; non-causal all 1.01-1.03. That matches v10's causal
 *      losses at T = 8192 (model 0.88x the grid at D = 128 and 256; measured 0.95x, 0.86x) but
 *      not its non-causal ones (model 1.00x, measured 0.93x: L2 reuse, which the model leaves
 *      out, is the suspect there). `fwd_hopper SEED sched` checks it and times it beside v10.
 *  v12 (kMaskRange; the library's at D = 64 and 128) an edge block's mask by ranges: mask_edge
 *      called visible_band per score, whose early returns made a branch of every score (the
 *      backward's v6 found the same in SASS); each of a thread's two rows now has its visible
 *      key range once a tile (visible_band_keys) and a score is one unsigned comparison and a
 *      select. `fwd_hopper SEED mask` (H200, 2026-12-02; 108 checks of every feature passed
 *      first), bf16, B * T = 16384, two rounds, ranges over branches: D = 64 T = 512 causal 1.65x
 *      (104 -> 172 TFLOPS), T = 2048 causal 1.31-1.33x, T = 8192 causal 1.10-1.13x, a 2048-key
 *      window 1.24-1.42x; D = 128 T = 512 causal 1.18-1.19x, T = 2048 causal 1.08-1.09x, T = 8192
 *      causal 1.03-1.05x, window 1.06-1.14x; D = 256 1.02-1.08x under a band, but 0.91-0.93x at
 *      T = 8192 without one (no edge block there: the four registers held across the tile, the
 *      suspect), so D = 256 keeps the branches. Without a band, D = 64 and 128: 0.95-1.03x (the
 *      rounds' own spread is 6-10%).
 *  v13 (the library's since 2026-12-04) short sequences, where a tile of 4-8 key blocks pays its
 *      pipeline's fill (S(0) and its softmax, with nothing to overlap) and drain (the last P V,
 *      the epilogue) on few blocks. `fwd_hopper SEED short` (H200, 2026-12-04; each variant
 *      checked on the shape first, all passed), bf16, B * T = 16384, two rounds, against the
 *      library's kernel of before at T = 512 / 1024, non-causal and causal:
 *        D = 128 (persistent): ping-pong 1.05-1.06x / 1.00x at T = 512, 1.06-1.07x / 1.07x at
 *                1024 (kept); 64-key blocks 0.95-0.99x, with ping-pong 0.92-0.96x
 *        D = 64: two consumer warpgroups (no ping-pong) 0.96x / 1.18-1.20x at T = 512, 0.93x /
 *                1.15-1.17x at 1024 (kept under a causal band: sm90_launch.cu's short_band); two
 *                with ping-pong 0.97-1.01x / 1.16x and 0.95x / 1.16-1.19x; three without 0.99x /
 *                1.05x and 0.94-0.95x / 1.01-1.03x
 *        D = 256: the grid (the library's without a band) 1.04-1.06x / 0.96-0.98x of persistent
 *                at T = 512, 1.01x / 0.98-1.01x at 1024; ping-pong 0.97-0.99x / 1.00-1.02x (not
 *                kept: within the rounds' spread)
 *      Through the library (gpu/cuda_bench, two runs), T = 512 against PyTorch's cuDNN: D = 64
 *      0.93-0.96x / 0.90-0.95x (causal 197.6-198.7 TFLOPS, 171.5 before), D = 128 0.87-0.90x /
 *      0.95-0.97x, D = 256 0.85-0.90x / 0.84-0.92x (cuDNN's own figures moved 5-10% between runs).
 *  v14 (kCapTanh; the library's cap / ALiBi kernels since 2026-12-04) the soft cap by tanh_sfu
 *      (tanh.approx.f32: one special-function op a score, 2^-11 relative, within SPEC's rule for
 *      16-bit problems; the decode kernels' soft cap gained the same way) in place of v9's fused
 *      form (three ops a score: at D = 128 the 16 a cycle an SM allow 5.3 scores a cycle, the
 *      plain kernel's own rate, so the cap was bound by them). `fwd_hopper SEED tanh` (H200,
 *      2026-12-04; 78 checks passed first, bf16 and f16, the cap with ALiBi, sinks, padded
 *      varlen, windows), soft cap 30, T = 8192, TFLOPS non-causal / causal, v9 -> v14 (of the
 *      plain kernel in the same call):
 *        D = 64:  239.2 / 224.5 (0.43x / 0.50x) -> 313.8 / 298.0 (0.58x / 0.66x): 1.31x / 1.33x
 *        D = 128: 418.6 / 386.9 (0.62x / 0.63x) -> 530.3 / 472.1 (0.79-0.83x / 0.77x): 1.27x / 1.22x
 *        D = 256: 617.4 / 532.6 (0.89x / 0.86x) -> 640.4 / 564.3 (0.93x / 0.91x): 1.04x / 1.06x
 *  v15 (kCapTanhScaled; tried, not kept) v14 with tanh's multiply by cap log2(e) left to the
 *      softmax's exponent FMA (its mult), one instruction a score fewer. `fwd_hopper SEED tanh`
 *      (H200, 2026-12-04, second session; every check passed), soft cap 30, T = 8192, ms
 *      non-causal / causal, v14 -> v15 in the same call: D = 64 3.481 / 1.854 -> 3.409 / 1.815
 *      (1.02x), D = 128 2.083 / 1.147 -> 2.110 / 1.184 (0.99x / 0.97x), D = 256 1.687 / 0.965 ->
 *      1.719 / 0.989 (0.98x). The instruction saved is not what bounds the kernel (the two
 *      special-function ops a score are), so the library keeps v14.
 *   ncu (v2, D = 128, non-causal, `fwd_hopper ncu`): 1.62 ms, SM busy 72% (the tensor pipe is
 *      what fills it), the XU pipe (exp2, conversions) 37%, DRAM 5%, issue slots 40% busy, 5.4 cycles per
 *      issued instruction. What is left is the softmax between the products that the two
 *      consumer warpgroups do not yet hide from each other (FlashAttention-3's ping-pong), and at
 *      T = 512 the non-persistent grid (one CTA per 128 rows, prologue and epilogue unhidden).
 *
 * `fwd_hopper ncu` runs the D = 128 non-causal shape alone (for Nsight Compute; `ncu-cap`: with the
 * soft cap, its 5th sm90 launch the capped kernel's); `fwd_hopper SEED features` runs the checks,
 * then only the features' benchmarks (the cap's variants and D = 64's plain kernel included);
 * `fwd_hopper SEED mask` v12's checks, then ranges against branches on the edge-heavy shapes;
 * `fwd_hopper SEED short` v13's variants at T = 512 and 1024, each checked, then timed;
 * `fwd_hopper SEED tanh` v14's checks, then the soft cap before and after beside the plain kernel;
 * `fwd_hopper SEED sched` runs v10's and v11's checks and the grid against both persistent
 * schedulers at T = 512, 2048 and 8192 (`python3 dev/cuda/fwd_hopper_torch.py 512 2048 8192`:
 * cuDNN's).
 *
 * build + run on the GPU machine (`gpu/run.sh cuda lab` does it):
 *   nvcc -std=c++17 -O3 -Iinclude -Isrc -gencode=arch=compute_90a,code=sm_90a dev/cuda/fwd_hopper.cu -o lab90 && ./lab90
 */
#include "impl/cuda/cuda_fwd.cuh"
#include "impl/cuda/sm90/sm90_fwd.cuh"
#include "lab.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

using namespace attn_cuda;
using sm90::FwdCfg90;
typedef __half hf;

static int failures = 0;

/* sum (a - b)^2, sum b^2, and the count of non-finite a (NaN poison left unwritten included) */
template <typename T> __global__ void compare(const T *a, const T *b, size_t n, double *acc) {
  double d2 = 0, r2 = 0, bad = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float x = float(a[i]), y = float(b[i]);
    if (!isfinite(x)) bad += 1;
    else d2 += (double)(x - y) * (x - y), r2 += (double)y * y;
  }
  atomicAdd(acc, d2), atomicAdd(acc + 1, r2), atomicAdd(acc + 2, bad);
}
/* max |a - b| of two lse arrays (-inf equal to -inf), NaN counted as 1e30 */
__global__ void lse_diff(const float *a, const float *b, size_t n, float *out) {
  float m = 0.f;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float x = a[i], y = b[i];
    const float d = (x == y) ? 0.f : (isnan(x) || isnan(y)) ? 1e30f : fabsf(x - y);
    m = fmaxf(m, d);
  }
  atomicMax(reinterpret_cast<int *>(out), __float_as_int(m));
}

/* The features of SPEC.md a check turns on (none by default). */
struct Feat {
  float softcap = 0.f;
  int sinks = 0, sinks_shared = 0;
  int alibi = 0;   /* 1: [Hq] slopes, 2: [B, Hq] */
  int bias = 0;    /* 1: f32 [B, Hq, Tq, Tk], 2: bf16 [1, Hkv, Tq, Tk] (KV heads), 3: f16 [B, 1, 1, Tk] */
  int mask = 0;    /* u8 [1, Hq, Tq, Tk], a quarter masked, row 5 wholly */
  int segments = 0;
  int varlen = 0;  /* ATTN_CUDA_VARLEN_*: B sequences of ragged lengths (some empty) up to Tq, Tk */
  int ragged = 1;  /* 0: every varlen sequence at the full Tq, Tk (the benchmark's) */
  int window = 0;  /* bench_feature only: a sliding window of this many keys left (and right when
                      not causal) */
  int group = 1;   /* bench_feature only: Hq / Hkv */
  const char *name = "";
};

struct Problem {
  int B, Tq, Tk, H, Hkv, D, wl, wr, bottom_right;
  Feat f;
};

template <typename X> X *upload(const std::vector<X> &h) {
  X *d = nullptr;
  CU(cudaMalloc(&d, std::max<size_t>(h.size(), 1) * sizeof(X)));
  if (!h.empty()) CU(cudaMemcpy(d, h.data(), h.size() * sizeof(X), cudaMemcpyHostToDevice));
  return d;
}
static unsigned hash(unsigned i, unsigned seed) {
  unsigned h = i * 2654435761u ^ seed;
  h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
  return h;
}

template <typename T> struct Buffers {
  T *q, *k, *v, *o, *oref;
  float *lse, *lseref;
  attn_cuda_params p, plain; /* plain: the same tensors as a dense problem without features */
  size_t nq, nk, nl;
  Problem s;
  std::vector<int> len_q, len_k, cu_q, cu_k; /* varlen's lengths; cu_*: packed row offsets */
  std::vector<void *> extra;                 /* feature tensors, freed with the rest */
  Buffers(const Problem &s_, unsigned seed) : s(s_) {
    nq = (size_t)s.B * s.Tq * s.H * s.D, nk = (size_t)s.B * s.Tk * s.Hkv * s.D, nl = (size_t)s.B * s.H * s.Tq;
    CU(cudaMalloc(&q, nq * 2));
    CU(cudaMalloc(&k, nk * 2));
    CU(cudaMalloc(&v, nk * 2));
    CU(cudaMalloc(&o, nq * 2));
    CU(cudaMalloc(&oref, nq * 2));
    CU(cudaMalloc(&lse, nl * 4));
    CU(cudaMalloc(&lseref, nl * 4));
    fill<<<1024, 256>>>(q, nq, seed), fill<<<1024, 256>>>(k, nk, seed + 1), fill<<<1024, 256>>>(v, nk, seed + 2);
    CU(cudaGetLastError());
    memset(&p, 0, sizeof p);
    p.q = q, p.k = k, p.v = v, p.lse = lse;
    p.q_h = p.o_h = p.k_h = p.v_h = s.D;
    p.q_r = p.o_r = (int64_t)s.H * s.D, p.k_r = p.v_r = (int64_t)s.Hkv * s.D;
    p.q_b = p.o_b = (int64_t)s.Tq * p.q_r, p.k_b = p.v_b = (int64_t)s.Tk * p.k_r;
    p.lse_b = (int64_t)s.H * s.Tq, p.lse_h = s.Tq, p.lse_r = 1;
    p.batch = s.B, p.seqlen_q = s.Tq, p.seqlen_k = s.Tk, p.heads_q = s.H, p.heads_kv = s.Hkv;
    p.group = s.H / s.Hkv, p.d = p.dv = s.D;
    p.scale = 1.f / sqrtf((float)s.D), p.window_left = s.wl, p.window_right = s.wr;
    p.align_bottom_right = s.bottom_right, p.keep_scale = 1.f;
    plain = p;
    add_features(seed);
  }
  template <typename X> X *keep(X *d) { return extra.push_back(d), d; }
  void add_features(unsigned seed) {
    const Feat &f = s.f;
    const int B = s.B, H = s.H, Tq = s.Tq, Tk = s.Tk;
    int kinds = 0;
    if (f.softcap > 0.f) p.softcap = f.softcap, kinds |= ATTN_CUDA_FEAT_SOFTCAP;
    if (f.sinks > 0) {
      std::vector<float> h((f.sinks_shared ? 1 : H) * f.sinks);
      for (size_t i = 0; i < h.size(); ++i) h[i] = (hash(i, seed + 3) & 0xffff) / 16384.f - 1.f; /* [-1, 3) */
      p.sinks = keep(upload(h)), p.num_sinks = f.sinks, p.sinks_shared = f.sinks_shared;
      p.sinks_h = f.sinks_shared ? 0 : f.sinks, p.sinks_t = 1;
    }
    if (f.alibi > 0) {
      std::vector<float> h((f.alibi == 2 ? B : 1) * H);
      for (size_t i = 0; i < h.size(); ++i) h[i] = 0.02f + 0.48f * (hash(i, seed + 4) & 0xffff) / 65536.f;
      p.alibi = keep(upload(h)), p.alibi_b = f.alibi == 2 ? H : 0, p.alibi_h = 1;
      kinds |= ATTN_CUDA_FEAT_ALIBI;
    }
    if (f.bias > 0) {
      const int64_t shape[3][4] = {{B, H, Tq, Tk}, {1, s.Hkv, Tq, Tk}, {B, 1, 1, Tk}};
      const int64_t *sh = shape[f.bias - 1];
      const size_t n = (size_t)sh[0] * sh[1] * sh[2] * sh[3];
      const int elem = f.bias == 1 ? ATTN_CUDA_ELEM_F32 : f.bias == 2 ? ATTN_CUDA_ELEM_BF16 : ATTN_CUDA_ELEM_F16;
      void *d;
      CU(cudaMalloc(&d, n * (elem == ATTN_CUDA_ELEM_F32 ? 4 : 2)));
      if (elem == ATTN_CUDA_ELEM_F32) fill<<<1024, 256>>>(static_cast<float *>(d), n, seed + 5);
      else if (elem == ATTN_CUDA_ELEM_BF16) fill<<<1024, 256>>>(static_cast<bf *>(d), n, seed + 5);
      else fill<<<1024, 256>>>(static_cast<hf *>(d), n, seed + 5);
      CU(cudaGetLastError());
      p.bias = keep(d), p.bias_elem = elem, p.bias_head_mode = f.bias == 1 ? 1 : f.bias == 2 ? 2 : 0;
      for (int d4 = 3, st = 1; d4 >= 0; --d4) p.bias_s[d4] = sh[d4] == 1 ? 0 : st, st *= (int)sh[d4];
      kinds |= ATTN_CUDA_FEAT_BIAS;
    }
    if (f.mask) {
      std::vector<uint8_t> h((size_t)H * Tq * Tk);
      for (size_t i = 0; i < h.size(); ++i) h[i] = (i / Tk) % Tq == 5 ? 0 : (hash(i, seed + 6) & 3) != 0;
      p.mask = keep(upload(h)), p.mask_s[0] = 0, p.mask_s[1] = (int64_t)Tq * Tk, p.mask_s[2] = Tk, p.mask_s[3] = 1;
      kinds |= ATTN_CUDA_FEAT_MASK;
    }
    if (f.segments) { /* runs of 23 equal ids; the first two queries of each batch are padding (-1) */
      std::vector<int> hq((size_t)B * Tq), hk((size_t)B * Tk);
      for (size_t i = 0; i < hq.size(); ++i) hq[i] = i % Tq < 2 ? -1 : (int)(i % Tq / 23);
      for (size_t i = 0; i < hk.size(); ++i) hk[i] = (int)(i % Tk / 23);
      p.q_seg = keep(upload(hq)), p.kv_seg = keep(upload(hk));
      p.qseg_b = Tq, p.qseg_r = 1, p.kseg_b = Tk, p.kseg_r = 1;
      kinds |= ATTN_CUDA_FEAT_SEGMENTS;
    }
    p.elementwise_kinds = kinds, p.elementwise = kinds != 0;
    if (f.varlen != ATTN_CUDA_VARLEN_NONE) {
      /* ragged lengths, batch 1 without queries and batch 2 without keys when there are three */
      for (int b = 0; b < B; ++b) {
        len_q.push_back(!f.ragged ? Tq : b == 1 && B > 2 ? 0 : Tq - (int)(hash(b, seed + 7) % (Tq / 2 + 1)));
        len_k.push_back(!f.ragged ? Tk : b == 2 ? 0 : Tk - (int)(hash(b, seed + 8) % (Tk / 2 + 1)));
      }
      p.varlen = f.varlen;
      if (f.varlen == ATTN_CUDA_VARLEN_PACKED) { /* the dense buffers as [B * T] rows, the tail unused */
        cu_q.assign(1, 0), cu_k.assign(1, 0);
        for (int b = 0; b < B; ++b) cu_q.push_back(cu_q.back() + len_q[b]), cu_k.push_back(cu_k.back() + len_k[b]);
        p.cu_q = keep(upload(cu_q)), p.cu_k = keep(upload(cu_k));
        p.total_q = (int64_t)B * Tq, p.total_k = (int64_t)B * Tk;
        p.q_b = p.k_b = p.v_b = p.o_b = 0;
        p.lse_b = 0, p.lse_h = (int64_t)B * Tq, p.lse_r = 1;
      } else {
        p.seqlens_q = keep(upload(len_q)), p.seqlens_k = keep(upload(len_k));
      }
      /* the rows outside every sequence hold NaN: the kernels must neither read them into a
       * result nor let 0 * NaN through */
      for_padding([&](int64_t row0, int64_t rows, bool is_q) {
        if (is_q) CU(cudaMemset(q + row0 * s.H * s.D, 0xff, rows * s.H * s.D * 2));
        else {
          CU(cudaMemset(k + row0 * s.Hkv * s.D, 0xff, rows * s.Hkv * s.D * 2));
          CU(cudaMemset(v + row0 * s.Hkv * s.D, 0xff, rows * s.Hkv * s.D * 2));
        }
      });
    }
  }
  /* Calls visit(first row, rows, is_q) for each run of token rows (of the dense [B * T] buffers)
   * outside every sequence. */
  template <typename F> void for_padding(F visit) const {
    for (int side = 0; side < 2; ++side) {
      const int T_ = side == 0 ? s.Tq : s.Tk;
      const std::vector<int> &len = side == 0 ? len_q : len_k, &cu = side == 0 ? cu_q : cu_k;
      if (p.varlen == ATTN_CUDA_VARLEN_PACKED) {
        if (cu.back() < (int64_t)s.B * T_) visit(cu.back(), (int64_t)s.B * T_ - cu.back(), side == 0);
      } else if (p.varlen == ATTN_CUDA_VARLEN_PADDED) {
        for (int b = 0; b < s.B; ++b)
          if (len[b] < T_) visit((int64_t)b * T_ + len[b], T_ - len[b], side == 0);
      }
    }
  }
  /* Zeroes out and lse outside every sequence, which neither forward writes here (the library's
   * launcher does, before either). */
  void clear_padding(T *out, float *l) const {
    for_padding([&](int64_t row0, int64_t rows, bool is_q) {
      if (!is_q) return;
      CU(cudaMemset(out + row0 * s.H * s.D, 0, rows * s.H * s.D * 2));
      for (int h = 0; h < s.H; ++h) { /* lse [B, H, Tq] (packed: [H, B * Tq]) */
        const int64_t b = p.varlen == ATTN_CUDA_VARLEN_PACKED ? 0 : row0 / s.Tq, t = row0 - b * s.Tq;
        const int64_t T_ = p.varlen == ATTN_CUDA_VARLEN_PACKED ? (int64_t)s.B * s.Tq : s.Tq;
        CU(cudaMemset(l + (b * s.H + h) * T_ + t, 0, rows * 4));
      }
    });
  }
  ~Buffers() {
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(oref), cudaFree(lse), cudaFree(lseref);
    for (void *d : extra) cudaFree(d);
  }
};

template <typename T, int kD> void run_ref(attn_cuda_params p, T *out, float *lse) {
  char why[256];
  p.out = out, p.lse = lse;
  if (run_fwd<T, kD>(p, 0, why, sizeof why) != ATTN_STATUS_OK) {
    printf("sm80 reference: %s\n", why);
    exit(1);
  }
}

/* p on the sm90 kernel of its mode (sm90::fwd90_mode), configuration C, G for the generic one, A
 * for the cap / ALiBi one */
template <typename C, typename G = C, typename A = C> void run90(const attn_cuda_params &p) {
  char why[256];
  if (sm90::launch_fwd90_any<C, G, A>(p, 0, why, sizeof why) != ATTN_STATUS_OK) {
    printf("sm90: %s\n", why);
    exit(1);
  }
}

/* Runs version C (G for the generic kernel) on s against the sm_80 kernel: relative L2 error of
 * O (< 1e-2 for 16-bit outputs), max lse difference (< 1e-3; 5e-3 with the soft cap), and no
 * unwritten (NaN-poisoned) element. */
template <typename C, typename G = C, typename A = C> void check(const char *tag, const Problem &s, unsigned seed) {
  using T = typename C::T;
  Buffers<T> bu(s, seed);
  CU(cudaMemset(bu.oref, 0, bu.nq * 2));
  run_ref<T, C::kD>(bu.p, bu.oref, bu.lseref);
  CU(cudaMemset(bu.o, 0xff, bu.nq * 2)); /* NaN in bf16 and f16 */
  CU(cudaMemset(bu.lse, 0xff, bu.nl * 4));
  attn_cuda_params p = bu.p;
  p.out = bu.o;
  run90<C, G, A>(p);
  CU(cudaGetLastError());
  CU(cudaDeviceSynchronize());
  bu.clear_padding(bu.o, bu.lse), bu.clear_padding(bu.oref, bu.lseref);
  double *acc, h[3];
  float *md, mdh;
  CU(cudaMalloc(&acc, 3 * sizeof(double)));
  CU(cudaMalloc(&md, 4));
  CU(cudaMemset(acc, 0, 3 * sizeof(double)));
  CU(cudaMemset(md, 0, 4));
  compare<<<256, 256>>>(bu.o, bu.oref, bu.nq, acc);
  lse_diff<<<256, 256>>>(bu.lse, bu.lseref, bu.nl, md);
  CU(cudaMemcpy(h, acc, sizeof h, cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(&mdh, md, 4, cudaMemcpyDeviceToHost));
  cudaFree(acc), cudaFree(md);
  const double rel = sqrt(h[0] / (h[1] > 0 ? h[1] : 1));
  const bool ok = rel < 1e-2 && h[2] == 0 && mdh < (s.f.softcap > 0.f ? 5e-3f : 1e-3f);
  failures += !ok;
  printf("%s check %s%s%s %s D=%d B=%d Tq=%d Tk=%d H=%d Hkv=%d win=(%d,%d) br=%d seed=%u: rel %.2e lse %.2e nonfinite %.0f\n",
         ok ? "PASS" : "FAIL", tag, s.f.name[0] ? " " : "", s.f.name, std::is_same<T, bf>::value ? "bf16" : "f16",
         C::kD, s.B, s.Tq, s.Tk, s.H, s.Hkv, s.wl, s.wr, s.bottom_right, seed, rel, mdh, h[2]);
}

template <typename C> void checks(const char *tag, unsigned seed) {
  const int D = C::kD;
  check<C, void>(tag, {2, 1000, 1000, 4, 4, D, -1, -1, 0}, seed);      /* ragged, non-causal */
  check<C, void>(tag, {2, 1000, 1000, 4, 4, D, -1, 0, 0}, seed + 10);  /* causal */
  check<C, void>(tag, {1, 777, 1333, 8, 2, D, -1, 0, 1}, seed + 20);   /* GQA 4:1, causal bottom-right */
  check<C, void>(tag, {1, 1333, 777, 8, 1, D, -1, 0, 0}, seed + 30);   /* MQA, causal top-left: empty rows */
  check<C, void>(tag, {2, 600, 600, 2, 2, D, 200, 0, 0}, seed + 40);   /* sliding window */
  check<C, void>(tag, {3, 65, 200, 3, 3, D, -1, -1, 0}, seed + 50);    /* one short block */
}

/* The kernels of configuration C (G: the generic one) against the sm_80 kernel: every feature
 * alone and combined, on odd shapes (ragged lengths, GQA / MQA, both alignments, windows). */
template <typename C, typename G, typename A = C> void feature_checks(const char *tag, unsigned seed) {
  const int D = C::kD;
  Feat cap, cap30, sinks, sinks3, alibi_h, alibi_bh, bias_full, bias_kv, bias_row, mask, seg, packed, padded, all;
  cap.softcap = 5.f, cap.name = "softcap 5";
  cap30.softcap = 30.f, cap30.name = "softcap 30";
  sinks.sinks = 1, sinks.name = "1 sink";
  sinks3.sinks = 3, sinks3.sinks_shared = 1, sinks3.name = "3 shared sinks";
  alibi_h.alibi = 1, alibi_h.name = "alibi [H]";
  alibi_bh.alibi = 2, alibi_bh.name = "alibi [B, H]";
  bias_full.bias = 1, bias_full.name = "bias f32 [B, H, Tq, Tk]";
  bias_kv.bias = 2, bias_kv.name = "bias bf16 [1, Hkv, Tq, Tk]";
  bias_row.bias = 3, bias_row.name = "bias f16 [B, 1, 1, Tk]";
  mask.mask = 1, mask.name = "mask [1, H, Tq, Tk]";
  seg.segments = 1, seg.name = "segment ids";
  packed.varlen = ATTN_CUDA_VARLEN_PACKED, packed.name = "packed varlen";
  padded.varlen = ATTN_CUDA_VARLEN_PADDED, padded.name = "padded varlen";
  all.softcap = 3.f, all.sinks = 2, all.alibi = 2, all.bias = 2, all.mask = 1, all.segments = 1;
  all.varlen = ATTN_CUDA_VARLEN_PACKED, all.name = "everything packed";
  Feat cap_alibi; /* the cap / ALiBi kernel with both, and the sinks, padded varlen */
  cap_alibi.softcap = 5.f, cap_alibi.alibi = 2, cap_alibi.sinks = 1, cap_alibi.varlen = ATTN_CUDA_VARLEN_PADDED;
  cap_alibi.name = "softcap 5 + alibi [B, H] + 1 sink, padded";
  check<C, G, A>(tag, {2, 1000, 1000, 4, 4, D, -1, -1, 0, cap}, seed);
  check<C, G, A>(tag, {1, 777, 1333, 8, 2, D, -1, 0, 1, cap30}, seed + 1);
  check<C, G, A>(tag, {2, 1000, 1000, 4, 4, D, -1, 0, 0, sinks}, seed + 2);
  check<C, G, A>(tag, {1, 600, 600, 2, 2, D, 200, 0, 0, sinks3}, seed + 3);
  check<C, G, A>(tag, {1, 1333, 777, 8, 1, D, -1, 0, 0, sinks}, seed + 4); /* rows with only the sinks */
  check<C, G, A>(tag, {1, 777, 1333, 8, 2, D, -1, 0, 1, alibi_h}, seed + 5);
  check<C, G, A>(tag, {2, 300, 517, 4, 4, D, -1, -1, 0, alibi_bh}, seed + 6);
  check<C, G, A>(tag, {2, 129, 300, 4, 2, D, -1, -1, 0, bias_full}, seed + 7);
  check<C, G, A>(tag, {2, 300, 129, 4, 2, D, -1, 0, 1, bias_kv}, seed + 8);
  check<C, G, A>(tag, {3, 65, 200, 3, 3, D, -1, -1, 0, bias_row}, seed + 9);
  check<C, G, A>(tag, {1, 300, 333, 4, 2, D, -1, -1, 0, mask}, seed + 10);
  check<C, G, A>(tag, {2, 250, 250, 2, 1, D, -1, 0, 0, seg}, seed + 11);
  check<C, G, A>(tag, {3, 1000, 777, 4, 2, D, -1, -1, 0, packed}, seed + 12);
  check<C, G, A>(tag, {3, 777, 1000, 4, 2, D, -1, 0, 1, packed}, seed + 13);
  check<C, G, A>(tag, {3, 500, 600, 2, 2, D, 100, 10, 0, padded}, seed + 14);
  check<C, G, A>(tag, {3, 200, 300, 4, 2, D, 50, 0, 1, all}, seed + 15);
  check<C, G, A>(tag, {3, 500, 700, 4, 2, D, -1, 0, 1, cap_alibi}, seed + 16);
  check<C, G, A>(tag, {2, 700, 500, 4, 4, D, 100, 20, 0, cap_alibi}, seed + 17);
}

/* Times feature f on the bench shape (the kernel of its mode: configuration P, F for the generic
 * one) beside the plain kernel of configuration B (default P) on the same shape without it (the
 * issue's target: >= 0.9x of its TFLOPS) and beside the sm_80 kernel with the feature; the
 * feature's output is checked first. Varlen runs B sequences of the full length, the same work; a
 * window or GQA changes the shape the feature runs on, not the plain one's (a window's TFLOPS
 * count the scores it sees, the plain one's the causal or full square). */
template <typename P, typename F, typename Bp = P, typename A = P>
void bench_feature(Feat f, int causal, const char *tag = "") {
  using T = typename P::T;
  const int D = P::kD, T_ = 8192, B = 16384 / T_, H = 2048 / D;
  f.ragged = 0;
  const int wl = f.window > 0 ? f.window : -1, wr = causal ? 0 : wl;
  const Problem s{B, T_, T_, H, H / f.group, D, wl, wr, 0, f};
  const Problem s_plain{B, T_, T_, H, H, D, -1, causal ? 0 : -1, 0};
  check<P, F, A>("bench", s, 7);
  Buffers<T> bu(s, 7), bp(s_plain, 7);
  attn_cuda_params pf = bu.p, pp = bp.plain;
  pf.out = bu.o, pp.out = bp.o;
  double pairs = 0, pairs_plain = 0; /* visible (query, key) pairs of one head */
  for (int i = 0; i < T_; ++i) {
    const int lo = s.wl < 0 ? 0 : std::max(0, i - s.wl), hi = s.wr < 0 ? T_ - 1 : std::min(T_ - 1, i + s.wr);
    pairs += hi - lo + 1, pairs_plain += causal ? i + 1 : T_;
  }
  const double flops = 4.0 * B * H * pairs * D, flops_plain = 4.0 * B * H * pairs_plain * D;
  const float ms = median_ms([&] { run90<P, F, A>(pf); });
  const float ms_plain = median_ms([&] { run90<Bp, void>(pp); });
  const float ms80 = median_ms([&] { run_ref<T, D>(bu.p, bu.oref, bu.lseref); });
  const double tf = flops / ms * 1e-9, tf_plain = flops_plain / ms_plain * 1e-9;
  printf("lab fwd90 feature%s%s %s D=%d T=%d causal=%d: %.3f ms %.1f TFLOPS (plain %.3f ms %.1f TFLOPS): %.2fx plain; "
         "sm80 with it %.3f ms: %.2fx sm80\n",
         tag[0] ? " " : "", tag, f.name, D, T_, causal, ms, tf, ms_plain, tf_plain, tf / tf_plain, ms80, ms80 / ms);
}

template <typename P, typename F, typename A = P> void bench_features() {
  Feat cap, sinks, alibi, cap_alibi, packed, bias;
  cap.softcap = 30.f, cap.name = "softcap 30";
  sinks.sinks = 1, sinks.name = "1 sink";
  alibi.alibi = 1, alibi.name = "alibi";
  cap_alibi.softcap = 30.f, cap_alibi.alibi = 1, cap_alibi.name = "softcap 30 + alibi";
  packed.varlen = ATTN_CUDA_VARLEN_PACKED, packed.name = "packed varlen";
  bias.bias = 3, bias.name = "bias f16 [B, 1, 1, Tk] (generic)";
  Feat window, gqa;
  window.window = 2048, window.name = "window 2048";
  gqa.group = 4, gqa.name = "GQA 4:1";
  for (int c = 0; c < 2; ++c)
    for (const Feat &f : {cap, sinks, alibi, cap_alibi, packed, window, gqa, bias}) bench_feature<P, F, P, A>(f, c);
}

/* The soft cap (30) on variant V of the cap kernel against the plain kernel of configuration P
 * (the library's), both causal and not: how each way of computing it compares, in one run. */
template <typename V, typename P> void bench_cap(const char *tag) {
  Feat cap;
  cap.softcap = 30.f, cap.name = "softcap 30";
  for (int c = 0; c < 2; ++c) bench_feature<V, void, P>(cap, c, tag);
}

/* Variant C's plain and cap / ALiBi kernels (no generic one) against the sm_80 kernel: the plain
 * checks, and the soft cap, ALiBi and sinks alone and together on odd shapes. */
template <typename C> void variant_checks(const char *tag, unsigned seed) {
  const int D = C::kD;
  checks<C>(tag, seed);
  Feat cap, cap30, alibi, cap_alibi;
  cap.softcap = 5.f, cap.name = "softcap 5";
  cap30.softcap = 30.f, cap30.sinks = 1, cap30.name = "softcap 30 + 1 sink";
  alibi.alibi = 2, alibi.name = "alibi [B, H]";
  cap_alibi.softcap = 5.f, cap_alibi.alibi = 2, cap_alibi.sinks = 1, cap_alibi.varlen = ATTN_CUDA_VARLEN_PADDED;
  cap_alibi.name = "softcap 5 + alibi [B, H] + 1 sink, padded";
  check<C, void>(tag, {2, 1000, 1000, 4, 4, D, -1, -1, 0, cap}, seed + 60);
  check<C, void>(tag, {1, 777, 1333, 8, 2, D, -1, 0, 1, cap30}, seed + 61);
  check<C, void>(tag, {2, 300, 517, 4, 4, D, -1, -1, 0, alibi}, seed + 62);
  check<C, void>(tag, {3, 500, 700, 4, 2, D, -1, 0, 1, cap_alibi}, seed + 63);
  check<C, void>(tag, {2, 700, 500, 4, 4, D, 100, 20, 0, cap_alibi}, seed + 64);
}

/* Times version C beside the sm_80 kernel on the bench shape; the output is checked first. */
template <typename C> void bench(const char *tag, int causal) {
  using T = typename C::T;
  const int D = C::kD, T_ = 8192, B = 16384 / T_, H = 2048 / D;
  const Problem s{B, T_, T_, H, H, D, -1, causal ? 0 : -1, 0};
  check<C, void>(tag, s, 7);
  Buffers<T> bu(s, 7);
  attn_cuda_params p = bu.p;
  p.out = bu.o;
  const double flops = 4.0 * B * H * (double)T_ * T_ * D * (causal ? 0.5 : 1.0);
  const float ms = median_ms([&] { run90<C, void>(p); });
  const float ms80 = median_ms([&] { run_ref<T, C::kD>(bu.p, bu.oref, bu.lseref); });
  printf("lab fwd90 %s D=%d T=%d causal=%d bm=%d bn=%d stages=%d: %.3f ms %.1f TFLOPS (sm80 %.3f ms %.1f TFLOPS, %.2fx)\n",
         tag, D, T_, causal, C::kBM, C::kBN, C::kStages, ms, flops / ms * 1e-9, ms80, flops / ms80 * 1e-9, ms80 / ms);
}

/* The bench shape (B * T = 16384 tokens, H heads of D) with a window of `window` keys (0: none;
 * left, and right when not causal), and in *flops the forward FLOPs of its visible scores. */
static Problem band_problem(int T_, int causal, int window, int H, int D, double *flops) {
  const int B = 16384 / T_, wl = window > 0 ? window : -1, wr = causal ? 0 : wl;
  double pairs = 0; /* visible (query, key) pairs of one head */
  for (int i = 0; i < T_; ++i) pairs += std::min(T_ - 1, wr < 0 ? T_ - 1 : i + wr) - std::max(0, wl < 0 ? 0 : i - wl) + 1;
  *flops = 4.0 * B * H * pairs * D;
  return Problem{B, T_, T_, H, H, D, wl, wr, 0};
}

/* The one-CTA-per-tile grid (O) against the persistent scheduler (N: its copy with kSchedStride,
 * S: with kSchedSnake) on bf16, B * T = 16384, Hq * D = 2048, at each T of the issue's range,
 * causal and not, plain and with a sliding window of 2048 keys (its TFLOPS over the scores it
 * sees); N and S are checked against the sm_80 kernel on each shape first. One line per shape:
 * the three kernels, N / O and S / O, and with a window N's and S's ratios to their own plain
 * speed on the same T and band (the issue's >= 0.9x). */
template <typename O, typename N, typename S> void bench_sched(const char *tag) {
  using T = typename O::T;
  const int D = O::kD, H = 2048 / D;
  for (int T_ : {512, 2048, 8192})
    for (int causal = 0; causal < 2; ++causal) {
      double tf_plain = 0, tf_plain_s = 0;
      for (int window : {0, 2048}) {
        double flops;
        const Problem s = band_problem(T_, causal, window, H, D, &flops);
        check<N, void>(tag, s, 7);
        check<S, void>(tag, s, 7);
        Buffers<T> bu(s, 7);
        attn_cuda_params p = bu.p;
        p.out = bu.o;
        const float ms_old = median_ms([&] { run90<O, void>(p); });
        const float ms_new = median_ms([&] { run90<N, void>(p); });
        const float ms_snake = median_ms([&] { run90<S, void>(p); });
        const double tf_old = flops / ms_old * 1e-9, tf_new = flops / ms_new * 1e-9, tf_s = flops / ms_snake * 1e-9;
        if (window == 0) tf_plain = tf_new, tf_plain_s = tf_s;
        printf("lab fwd90 sched %s D=%d T=%d causal=%d window=%d: grid %.3f ms %.1f TFLOPS, persistent %.3f ms %.1f "
               "TFLOPS: %.2fx grid, snake %.3f ms %.1f TFLOPS: %.2fx grid",
               tag, D, T_, causal, window, ms_old, tf_old, ms_new, tf_new, ms_old / ms_new, ms_snake, tf_s,
               ms_old / ms_snake);
        if (window > 0) printf("; of their plain: persistent %.2fx, snake %.2fx", tf_new / tf_plain, tf_s / tf_plain_s);
        printf("\n");
      }
    }
}

/* v12: configuration O beside N (the same with kMaskRange) on the shapes whose tiles have the most
 * edge blocks (short T, causal, a window), each checked first. */
template <typename O, typename N> void bench_mask(const char *tag) {
  using T = typename O::T;
  const int D = O::kD, H = 2048 / D;
  for (int T_ : {512, 2048, 8192})
    for (int causal = 0; causal < 2; ++causal)
      for (int window : {0, 2048}) {
        if (window > 0 && T_ <= window) continue;
        double flops;
        const Problem s = band_problem(T_, causal, window, H, D, &flops);
        check<N, void>(tag, s, 7);
        Buffers<T> bu(s, 7);
        attn_cuda_params p = bu.p;
        p.out = bu.o;
        for (int round = 0; round < 2; ++round) {
          const float ms_old = median_ms([&] { run90<O, void>(p); });
          const float ms_new = median_ms([&] { run90<N, void>(p); });
          printf("lab fwd90 mask %s D=%d T=%d causal=%d window=%d: branches %.3f ms %.1f TFLOPS, ranges %.3f ms %.1f "
                 "TFLOPS: %.2fx\n",
                 tag, D, T_, causal, window, ms_old, flops / ms_old * 1e-9, ms_new, flops / ms_new * 1e-9, ms_old / ms_new);
        }
      }
}

/* v13 (measured 2026-12-04): short sequences, where each tile's pipeline fill (S(0) and its
 * softmax, nothing to overlap them with) and drain (the last P V, the epilogue) are a large part of
 * a tile of 4-8 key blocks. The library's kernel (L) beside the same with the consumer warpgroups
 * taking turns (P: ping-pong, so one's fill runs under the other's products), and at D = 128
 * 64-key blocks (K, KP with ping-pong: a shorter fill against more iterations); the names say what
 * P, K and KP are at the other head dims. Each is checked on the shape first. */
template <typename L, typename P, typename K, typename KP>
void bench_short(const char *tag, const char *p_name, const char *k_name, const char *kp_name) {
  using T = typename L::T;
  const int D = L::kD, H = 2048 / D;
  for (int T_ : {512, 1024})
    for (int causal = 0; causal < 2; ++causal) {
      double flops;
      const Problem s = band_problem(T_, causal, 0, H, D, &flops);
      check<P, void>(tag, s, 7);
      check<K, void>(tag, s, 7);
      check<KP, void>(tag, s, 7);
      Buffers<T> bu(s, 7);
      attn_cuda_params p = bu.p;
      p.out = bu.o;
      for (int round = 0; round < 2; ++round) {
        const float l = median_ms([&] { run90<L, void>(p); }), pp = median_ms([&] { run90<P, void>(p); });
        const float k = median_ms([&] { run90<K, void>(p); }), kp = median_ms([&] { run90<KP, void>(p); });
        printf("lab fwd90 short %s D=%d T=%d causal=%d: library %.1f us %.1f TFLOPS, %s %.1f us %.2fx, %s %.1f us "
               "%.2fx, %s %.1f us %.2fx\n",
               tag, D, T_, causal, l * 1e3, flops / l * 1e-9, p_name, pp * 1e3, l / pp, k_name, k * 1e3, l / k, kp_name,
               kp * 1e3, l / kp);
      }
    }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "ncu") == 0) { /* one shape, for Nsight Compute: D = 128 non-causal */
    bench<FwdCfg90<bf, 128, 128, 2, true>>("v2", 0);
    return failures != 0;
  }
  if (argc > 1 && strcmp(argv[1], "ncu-cap") == 0) { /* the same with the soft cap (30), v9 */
    Feat cap;
    cap.softcap = 30.f, cap.name = "softcap 30";
    bench_feature<FwdCfg90<bf, 128, 128, 2, true>, void>(cap, 0, "v9");
    return failures != 0;
  }
  unsigned seed = argc > 1 ? (unsigned)atoi(argv[1]) : 1234u;
  printf("seed %u\n", seed);
  if (argc > 2 && strcmp(argv[2], "tanh") == 0) { /* v14: the soft cap by tanh.approx, checked, then timed */
    using sm90::kCapFused;
    using sm90::kCapTanh;
    using sm90::kSchedStride;
    /* the cap / ALiBi kernels of sm90_launch.cu before (kCapFused) and now (kCapTanh), and the
     * plain kernels the ratios are to */
    using F64 = FwdCfg90<bf, 64, 128, 3, true, 2, kCapFused, 0, false, kSchedStride, true>;
    using N64 = FwdCfg90<bf, 64, 128, 3, true, 2, kCapTanh, 0, false, kSchedStride, true>;
    using N64h = FwdCfg90<hf, 64, 128, 3, true, 2, kCapTanh, 0, false, kSchedStride, true>;
    using P64 = FwdCfg90<bf, 64, 128, 3, true, 3, kCapFused, 0, true, kSchedStride, true>;
    using F128 = FwdCfg90<bf, 128, 128, 2, true, 2, kCapFused, 0, false, sm90::kSchedGrid, true>;
    using N128 = FwdCfg90<bf, 128, 128, 2, true, 2, kCapTanh, 0, false, sm90::kSchedGrid, true>;
    using N128h = FwdCfg90<hf, 128, 128, 2, true, 2, kCapTanh, 0, false, sm90::kSchedGrid, true>;
    using F256 = FwdCfg90<bf, 256, 64, 2, true, 2, kCapFused, 0, false>;
    using N256 = FwdCfg90<bf, 256, 64, 2, true, 2, kCapTanh, 0, false>;
    using N256h = FwdCfg90<hf, 256, 64, 2, true, 2, kCapTanh, 0, false>;
    /* v15: v14 with the multiply by cap log2(e) folded into the softmax's FMA */
    using sm90::kCapTanhScaled;
    using S64 = FwdCfg90<bf, 64, 128, 3, true, 2, kCapTanhScaled, 0, false, kSchedStride, true>;
    using S128 = FwdCfg90<bf, 128, 128, 2, true, 2, kCapTanhScaled, 0, false, sm90::kSchedGrid, true>;
    using S128h = FwdCfg90<hf, 128, 128, 2, true, 2, kCapTanhScaled, 0, false, sm90::kSchedGrid, true>;
    using S256 = FwdCfg90<bf, 256, 64, 2, true, 2, kCapTanhScaled, 0, false>;
    variant_checks<S64>("v15", seed);
    variant_checks<S128>("v15", seed);
    variant_checks<S128h>("v15", seed);
    variant_checks<S256>("v15", seed);
    variant_checks<N64>("v14", seed);
    variant_checks<N128>("v14", seed);
    variant_checks<N256>("v14", seed);
    variant_checks<N64h>("v14", seed);
    variant_checks<N128h>("v14", seed);
    variant_checks<N256h>("v14", seed);
    bench_cap<F64, P64>("v9 fused (before)");
    bench_cap<N64, P64>("v14 tanh.approx");
    bench_cap<F128, F128>("v9 fused (before)");
    bench_cap<N128, F128>("v14 tanh.approx");
    bench_cap<F256, F256>("v9 fused (before)");
    bench_cap<N256, F256>("v14 tanh.approx");
    bench_cap<S64, P64>("v15 tanh.approx, cap log2(e) in the exponent's FMA");
    bench_cap<S128, F128>("v15 tanh.approx, cap log2(e) in the exponent's FMA");
    bench_cap<S256, F256>("v15 tanh.approx, cap log2(e) in the exponent's FMA");
    printf("lab fwd90: %d failed checks\n", failures);
    return failures != 0;
  }
  if (argc > 2 && strcmp(argv[2], "short") == 0) { /* v13: T = 512 and 1024, timed (each variant checked first) */
    using sm90::kCapFused;
    using sm90::kSchedStride;
    /* D = 128: the library's at T <= 1024 (persistent, masks by ranges) */
    using L128 = FwdCfg90<bf, 128, 128, 2, true, 2, kCapFused, 0, false, kSchedStride, true>;
    using P128 = FwdCfg90<bf, 128, 128, 2, true, 2, kCapFused, 0, true, kSchedStride, true>;
    using K128 = FwdCfg90<bf, 128, 64, 3, true, 2, kCapFused, 0, false, kSchedStride, true>;
    using KP128 = FwdCfg90<bf, 128, 64, 3, true, 2, kCapFused, 0, true, kSchedStride, true>;
    /* D = 256: persistent (the library's under a causal band; the grid otherwise) */
    using L256 = FwdCfg90<bf, 256, 64, 2, true, 2, kCapFused, 0, false, kSchedStride>;
    using P256 = FwdCfg90<bf, 256, 64, 2, true, 2, kCapFused, 0, true, kSchedStride>;
    using G256 = FwdCfg90<bf, 256, 64, 2, true, 2, kCapFused, 0, false>;
    using GP256 = FwdCfg90<bf, 256, 64, 2, true, 2, kCapFused, 0, true>;
    /* D = 64: the library's (three consumer warpgroups, ping-pong), then two without and with */
    using L64 = FwdCfg90<bf, 64, 128, 3, true, 3, kCapFused, 0, true, kSchedStride, true>;
    using N64 = FwdCfg90<bf, 64, 128, 3, true, 3, kCapFused, 0, false, kSchedStride, true>;
    using T64 = FwdCfg90<bf, 64, 128, 3, true, 2, kCapFused, 0, false, kSchedStride, true>;
    using TP64 = FwdCfg90<bf, 64, 128, 3, true, 2, kCapFused, 0, true, kSchedStride, true>;
    bench_short<L128, P128, K128, KP128>("v13", "ping-pong", "64 keys", "64 keys ping-pong");
    bench_short<L256, P256, G256, GP256>("v13", "ping-pong", "grid", "grid ping-pong");
    bench_short<L64, N64, T64, TP64>("v13", "3 wg no ping-pong", "2 wg", "2 wg ping-pong");
    printf("lab fwd90: %d failed checks\n", failures);
    return failures != 0;
  }
  if (argc > 2 && strcmp(argv[2], "mask") == 0) { /* v12: the edge blocks' masks by ranges, checked, then timed */
    using sm90::kCapFused;
    using sm90::kSchedStride;
    using sm90::kSchedGrid;
    /* the library's plain kernels (sm90_launch.cu) and the same with kMaskRange */
    using O64 = FwdCfg90<bf, 64, 128, 3, true, 3, kCapFused, 0, true, kSchedStride>;
    using N64 = FwdCfg90<bf, 64, 128, 3, true, 3, kCapFused, 0, true, kSchedStride, true>;
    using O128 = FwdCfg90<bf, 128, 128, 2, true, 2, kCapFused, 0, false, kSchedGrid>;
    using N128 = FwdCfg90<bf, 128, 128, 2, true, 2, kCapFused, 0, false, kSchedGrid, true>;
    using O256 = FwdCfg90<bf, 256, 64, 2, true, 2, kCapFused, 0, false, kSchedGrid>;
    using N256 = FwdCfg90<bf, 256, 64, 2, true, 2, kCapFused, 0, false, kSchedGrid, true>;
    using NA64 = FwdCfg90<bf, 64, 128, 3, true, 2, kCapFused, 0, false, kSchedStride, true>; /* its cap / ALiBi kernel */
    using N128h = FwdCfg90<hf, 128, 128, 2, true, 2, kCapFused, 0, false, kSchedGrid, true>;
    feature_checks<N64, FwdCfg90<bf, 64, 128, 3, true, 2>, NA64>("v12", seed);
    feature_checks<N128, O128, N128>("v12", seed);
    feature_checks<N256, O256, N256>("v12", seed);
    feature_checks<N128h, FwdCfg90<hf, 128, 128, 2, true>, N128h>("v12", seed);
    checks<N64>("v12", seed);
    checks<N128>("v12", seed);
    bench_mask<O64, N64>("v12");
    bench_mask<O128, N128>("v12");
    bench_mask<O256, N256>("v12");
    printf("lab fwd90: %d failed checks\n", failures);
    return failures != 0;
  }
  if (argc > 2 && strcmp(argv[2], "sched") == 0) { /* v10, v11: the persistent schedulers, checked, then timed */
    using sm90::kCapFused;
    using sm90::kSchedStride;
    using G64 = FwdCfg90<bf, 64, 128, 3, true, 3, kCapFused, 0, true>; /* the library's before */
    using N64 = FwdCfg90<bf, 64, 128, 3, true, 3, kCapFused, 0, true, kSchedStride>;
    using N64h = FwdCfg90<hf, 64, 128, 3, true, 3, kCapFused, 0, true, kSchedStride>;
    using NA64 = FwdCfg90<bf, 64, 128, 3, true, 2, kCapFused, 0, false, kSchedStride>; /* its cap / ALiBi kernel */
    using NA64h = FwdCfg90<hf, 64, 128, 3, true, 2, kCapFused, 0, false, kSchedStride>;
    using G128 = FwdCfg90<bf, 128, 128, 2, true>;
    using N128 = FwdCfg90<bf, 128, 128, 2, true, 2, kCapFused, 0, false, kSchedStride>;
    using N128h = FwdCfg90<hf, 128, 128, 2, true, 2, kCapFused, 0, false, kSchedStride>;
    using G256 = FwdCfg90<bf, 256, 64, 2, true>;
    using N256 = FwdCfg90<bf, 256, 64, 2, true, 2, kCapFused, 0, false, kSchedStride>;
    using N256h = FwdCfg90<hf, 256, 64, 2, true, 2, kCapFused, 0, false, kSchedStride>;
    using F64 = FwdCfg90<bf, 64, 128, 3, true, 2>;
    using F64h = FwdCfg90<hf, 64, 128, 3, true, 2>;
    using sm90::kSchedSnake; /* v11 */
    using S64 = FwdCfg90<bf, 64, 128, 3, true, 3, kCapFused, 0, true, kSchedSnake>;
    using SA64 = FwdCfg90<bf, 64, 128, 3, true, 2, kCapFused, 0, false, kSchedSnake>;
    using S128 = FwdCfg90<bf, 128, 128, 2, true, 2, kCapFused, 0, false, kSchedSnake>;
    using S256h = FwdCfg90<hf, 256, 64, 2, true, 2, kCapFused, 0, false, kSchedSnake>;
    using S256 = FwdCfg90<bf, 256, 64, 2, true, 2, kCapFused, 0, false, kSchedSnake>;
    feature_checks<S64, F64, SA64>("v11", seed);
    feature_checks<S128, G128, S128>("v11", seed);
    feature_checks<S256h, FwdCfg90<hf, 256, 64, 2, true>, S256h>("v11", seed);
    feature_checks<N64, F64, NA64>("v10", seed);
    feature_checks<N128, G128, N128>("v10", seed);
    feature_checks<N256, G256, N256>("v10", seed);
    feature_checks<N64h, F64h, NA64h>("v10", seed);
    feature_checks<N128h, FwdCfg90<hf, 128, 128, 2, true>, N128h>("v10", seed);
    feature_checks<N256h, FwdCfg90<hf, 256, 64, 2, true>, N256h>("v10", seed);
    checks<N64>("v10", seed);
    checks<N128h>("v10", seed);
    bench_sched<G64, N64, S64>("v10");
    bench_sched<G128, N128, S128>("v10");
    bench_sched<G256, N256, S256>("v10");
    Feat cap; /* the cap / ALiBi kernel, persistent, against the persistent plain one */
    cap.softcap = 30.f, cap.name = "softcap 30";
    for (int c = 0; c < 2; ++c) {
      bench_feature<NA64, void, N64>(cap, c, "v10");
      bench_feature<N128, void, N128>(cap, c, "v10");
      bench_feature<N256, void, N256>(cap, c, "v10");
    }
    printf("lab fwd90: %d failed checks\n", failures);
    return failures != 0;
  }
  using V1_128 = FwdCfg90<bf, 128, 128, 2, false>;
  using V2_128 = FwdCfg90<bf, 128, 128, 2, true>;
  using V1_64 = FwdCfg90<bf, 64, 128, 3, false>;
  using V2_64 = FwdCfg90<bf, 64, 128, 3, true>;
  using V3_64 = FwdCfg90<bf, 64, 128, 3, true, 3>;
  using V3_64s4 = FwdCfg90<bf, 64, 128, 4, true, 3>;
  using V1_256 = FwdCfg90<bf, 256, 64, 2, false>;
  using V2_256 = FwdCfg90<bf, 256, 64, 2, true>;
  using V2_128h = FwdCfg90<hf, 128, 128, 2, true>;
  using V3_64h = FwdCfg90<hf, 64, 128, 3, true, 3>;
  using V2_256h = FwdCfg90<hf, 256, 64, 2, true>;
  checks<V2_128>("v2", seed);
  checks<V3_64>("v3", seed);
  checks<V3_64s4>("v3 4 stages", seed);
  checks<V2_256>("v2", seed);
  checks<V2_128h>("v2", seed);
  checks<V3_64h>("v3", seed);
  checks<V2_256h>("v2", seed);
  /* the library's configurations (sm90_launch.cu): D = 64's plain kernel with v8's ping-pong,
   * every head dim's cap with v9's; F64: D = 64's cap / ALiBi and generic kernels (two consumer
   * warpgroups: at 160 registers ptxas spills theirs) */
  using sm90::kCapRcp;
  using sm90::kCapRcpFma;
  using sm90::kCapFused;
  using P64 = FwdCfg90<bf, 64, 128, 3, true, 3, kCapFused, 0, true>;
  using P64h = FwdCfg90<hf, 64, 128, 3, true, 3, kCapFused, 0, true>;
  using F64 = FwdCfg90<bf, 64, 128, 3, true, 2>;
  using F64h = FwdCfg90<hf, 64, 128, 3, true, 2>;
  feature_checks<P64, F64, F64>("v9", seed);
  feature_checks<V2_128, V2_128>("v9", seed);
  feature_checks<V2_256, V2_256>("v9", seed);
  feature_checks<P64h, F64h, F64h>("v9", seed);
  feature_checks<V2_128h, V2_128h>("v9", seed);
  feature_checks<V2_256h, V2_256h>("v9", seed);
  /* the cap's other forms (the header's v5, v6, v9 variants), checked, then timed beside the
   * library's plain kernel */
  using V5c_64 = FwdCfg90<bf, 64, 128, 3, true, 3, kCapRcp>; /* v5: the library before */
  using V9n_64 = FwdCfg90<bf, 64, 128, 3, true, 3, kCapFused>;
  using V9e4_64 = FwdCfg90<bf, 64, 128, 3, true, 3, kCapFused, 4, true>;
  using V5c_128 = FwdCfg90<bf, 128, 128, 2, true, 2, kCapRcp>;
  using V6_128 = FwdCfg90<bf, 128, 128, 2, true, 2, kCapRcpFma>;
  using V9e4_128 = FwdCfg90<bf, 128, 128, 2, true, 2, kCapFused, 4>;
  using V5c_256 = FwdCfg90<bf, 256, 64, 2, true, 2, kCapRcp>;
  using V9e4_256 = FwdCfg90<bf, 256, 64, 2, true, 2, kCapFused, 4>;
  variant_checks<V5c_64>("v5 cap", seed);
  variant_checks<V9n_64>("v9 cap, no ping-pong", seed);
  variant_checks<V9e4_64>("v9 cap, exp 1/4", seed);
  variant_checks<V5c_128>("v5 cap", seed);
  variant_checks<V6_128>("v6 cap", seed);
  variant_checks<V9e4_128>("v9 cap, exp 1/4", seed);
  variant_checks<V5c_256>("v5 cap", seed);
  variant_checks<V9e4_256>("v9 cap, exp 1/4", seed);
  auto caps = [&]() {
    bench_cap<V5c_64, P64>("v5 rcp");
    bench_cap<F64, P64>("v9 fused, 2 consumer wg (the library's)");
    bench_cap<P64, P64>("v9 fused, 3 consumer wg, ping-pong");
    bench_cap<V9n_64, P64>("v9 fused, 3 consumer wg");
    bench_cap<V9e4_64, P64>("v9 fused, exp 1/4");
    bench_cap<V5c_128, V2_128>("v5 rcp");
    bench_cap<V6_128, V2_128>("v6 fma rcp");
    bench_cap<V2_128, V2_128>("v9 fused");
    bench_cap<V9e4_128, V2_128>("v9 fused, exp 1/4");
    bench_cap<V5c_256, V2_256>("v5 rcp");
    bench_cap<V2_256, V2_256>("v9 fused");
    bench_cap<V9e4_256, V2_256>("v9 fused, exp 1/4");
  };
  if (argc > 2 && strcmp(argv[2], "features") == 0) { /* the checks, then the features' benchmarks only */
    bench_features<P64, F64, F64>();
    bench_features<V2_128, V2_128>();
    bench_features<V2_256, V2_256>();
    caps();
    for (int c = 0; c < 2; ++c) { /* D = 64's plain kernel before (v3) and after (v8) */
      bench<V3_64>("v3", c);
      bench<P64>("v8 ping-pong", c);
    }
    printf("lab fwd90: %d failed checks\n", failures);
    return failures != 0;
  }
  for (int c = 0; c < 2; ++c) {
    bench<V1_128>("v1", c);
    bench<V2_128>("v2", c);
    bench<V1_64>("v1", c);
    bench<V2_64>("v2", c);
    bench<V3_64>("v3", c);
    bench<V3_64s4>("v3 4 stages", c);
    bench<V1_256>("v1", c);
    bench<V2_256>("v2", c);
  }
  for (int c = 0; c < 2; ++c) bench<P64>("v8 ping-pong", c);
  bench_features<P64, F64, F64>();
  bench_features<V2_128, V2_128>();
  bench_features<V2_256, V2_256>();
  caps();
  printf("lab fwd90: %d failed checks\n", failures);
  return failures != 0;
}
