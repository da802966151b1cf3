/*
 * src/impl/cuda/sm90/sm90_launch.cu - the extern "C" side of the Hopper forward and backward
 * (cuda_launch.h): the configuration per head dim, chosen in dev/cuda/fwd_hopper.cu and
 * dev/cuda/bwd_hopper.cu, instantiated for bf16 and f16.
 * Compiled for sm_90a only (CMakeLists.txt): wgmma and setmaxnreg exist nowhere else.
 */
#include "impl/cuda/cuda_launch.h"
#include "impl/cuda/sm90/sm90_bwd.cuh"
#include "impl/cuda/sm90/sm90_fwd.cuh"
#include "impl/cuda/sm90/sm90_fwd_fp8.cuh"

namespace attn_cuda {
namespace sm90 {

/* At most the keys a tile of p sees: the sequence, or a two-sided window's span (and a block). */
static int64_t tile_keys(const attn_cuda_params &p) {
  if (p.window_left >= 0 && p.window_right >= 0)
    return std::min<int64_t>(p.seqlen_k, (int64_t)p.window_left + p.window_right + 128);
  return p.seqlen_k;
}

/* Whether p runs on the persistent tile scheduler (kSchedStride, lab v10) rather than
 * one CTA per tile. One call on an H200 (bf16, B * T = 16384, Hq * D = 2048; bench/RESULTS.md
 * "sm90: a persistent tile scheduler"): at D = 64 it won or tied everywhere (1.11-1.15x the grid
 * at T = 512, 0.99-1.05x at 2048, 1.02x at 8192, 1.02-1.06x with a 2048-key window); at D = 128
 * it won where a tile sees few keys (T = 512: 1.07-1.17x) and lost from T = 2048 up (0.93-1.01x,
 * windows of 2048 keys 0.94 / 0.99x); at D = 256 it won at T = 512 causal (1.06-1.08x), lost
 * non-causal (0.95-0.99x) and from T = 2048 up (0.86-0.99x). Hence: D = 64 always; D = 128 where
 * a tile sees at most 1024 keys (between the measured 512 and 2048; a two-sided window bounds
 * them too, an extrapolation); D = 256 the same under a causal band only. */
static bool persistent_pays(const attn_cuda_params &p) {
  if (p.d == 64) return true;
  return tile_keys(p) <= 1024 && (p.d == 128 || p.window_right >= 0);
}

/* Whether p is a short problem under a causal band (a tile sees at most 1024 keys), where D = 64's
 * plain kernel runs on two consumer warpgroups (lab v13, dev/cuda/fwd_hopper.cu "short": 1.15-1.20x
 * the three taking turns at T = 512 and 1024 causal on an H200, 0.93-0.97x of them without a band;
 * at T = 8192 causal the three taking turns beat two by about 1.15x, lab v2 / v3 / v8 on an H100;
 * T = 2048 and windows of that span not measured). */
static bool short_band(const attn_cuda_params &p) { return tile_keys(p) <= 1024 && p.window_right >= 0; }

/* 128 keys per block up to D = 128 (S and O fit the 240 registers with P beside them), 64 at
 * D = 256 (O alone takes 128); as many K/V stages as shared memory holds, at most 3. D = 64's
 * plain kernel has three consumer warpgroups (192-row CTAs: each K/V tile feeds 1.5x the rows;
 * 160 registers hold its O, S and P) taking turns (ping-pong: lab v8, 1.10x / 1.15-1.20x v3
 * non-causal / causal on an H100), except on short causal problems (short_band: two, as its cap /
 * ALiBi kernel, which has two because ptxas spills the cap at 160 registers). D = 128's two
 * consumer warpgroups take turns on the persistent scheduler, that is where a tile sees at most
 * 1024 keys (lab v13: 1.05-1.07x at T = 512 non-causal and T = 1024, 1.00x at T = 512 causal, on
 * an H200; the grid's long tiles keep the free-running form, ping-pong 0.97x there: lab v8); its
 * cap / ALiBi kernel runs free everywhere (turns are unmeasured there).
 * The soft cap is tanh_sfu's one instruction a score everywhere (kCapTanh: lab v14; the logit
 * within 2^-11 of itself, as SPEC's rule allows 16-bit problems; kCapFused, lab v9, within
 * cap * 2.6e-7, cost a third special-function op a score). The generic kernel is
 * built at D = 256 alone (kGenericDeclined says why); the lab runs it at every head dim (at
 * D = 64 with two consumer warpgroups: its per-element function spills at 160 registers). The
 * plain and cap / ALiBi kernels run on the persistent scheduler where persistent_pays, the
 * generic one on the grid. At D = 64 and 128 the edge blocks are masked by ranges (kMaskRange,
 * lab v12: 1.65x at D = 64, T = 512 causal, 1.1-1.4x under windows on an H200); at D = 256 it
 * gained 1.02-1.08x there and cost 0.91-0.93x without a band (T = 8192), so it stays off. */
template <typename T, bool kPst>
attn_status run_sched(const attn_cuda_params &p, cudaStream_t s, char *why, size_t why_size) {
  constexpr int kS = kPst ? kSchedStride : kSchedGrid;
  switch (p.d) {
  case 64: { /* persistent whatever kPst (persistent_pays) */
    using Two = FwdCfg90<T, 64, 128, 3, true, 2, kCapTanh, 0, false, kSchedStride, true>;
    if (short_band(p)) return launch_fwd90_any<Two, void>(p, s, why, why_size);
    return launch_fwd90_any<FwdCfg90<T, 64, 128, 3, true, 3, kCapFused, 0, true, kSchedStride, true>, void, Two>(
        p, s, why, why_size);
  }
  case 128:
    return launch_fwd90_any<FwdCfg90<T, 128, 128, 2, true, 2, kCapFused, 0, kPst, kS, true>, void,
                            FwdCfg90<T, 128, 128, 2, true, 2, kCapTanh, 0, false, kS, true>>(p, s, why, why_size);
  default:
    return launch_fwd90_any<FwdCfg90<T, 256, 64, 2, true, 2, kCapFused, 0, false, kS>, FwdCfg90<T, 256, 64, 2, true>,
                            FwdCfg90<T, 256, 64, 2, true, 2, kCapTanh, 0, false, kS>>(p, s, why, why_size);
  }
}
template <typename T> attn_status run(const attn_cuda_params &p, cudaStream_t s, char *why, size_t why_size) {
  const bool persistent = p.sm90_sched == ATTN_CUDA_SM90_SCHED_AUTO ? persistent_pays(p)
                                                                    : p.sm90_sched == ATTN_CUDA_SM90_SCHED_PERSISTENT;
  return persistent ? run_sched<T, true>(p, s, why, why_size) : run_sched<T, false>(p, s, why, why_size);
}

/* The backward at D = 64, 128 and 256: v4 of dev/cuda/bwd_hopper.cu (dQ by bulk reduce-adds into a
 * tiled workspace: 1.51-1.54x the atomic sm80 backward at D = 128 on an H100, 1.18-1.20x at 64),
 * with the features of v5 (launch_bwd90 picks the plain or cap / ALiBi kernel, deterministic or
 * not); at D = 64 v8's schedule (three Q / dO stages, the next item's S^T / dP^T prefetched and
 * turned into P^T / dS^T under this item's products: 1.07-1.08x v6 on an H200), which at D = 128
 * has not the registers (ptxas serializes its wgmma there); at D = 256 v9's (BwdCfg90's kSplit:
 * 64-key CTAs whose two warpgroups split dK's, dV's and dQ's columns). */
template <typename T> attn_status run_bwd90(const attn_cuda_params &p, cudaStream_t s, char *why, size_t why_size) {
  if (p.d == 64) return launch_bwd90<BwdCfg90<T, 64, 3, true, true, true>>(p, s, why, why_size);
  if (p.d == 256) return launch_bwd90<BwdCfg90<T, 256>>(p, s, why, why_size);
  return launch_bwd90<BwdCfg90<T, 128>>(p, s, why, why_size);
}

/* The fp8 forward (sm90_fwd_fp8.cuh) at head dim D, out in TO: 2 K/V stages (as the 16-bit kernel
 * at D = 128; a stage is 32 KiB at D = 128 with 128-key blocks, 64 at 256; 3 bought nothing), O
 * rescaled lazily, all exponentials on the special-function unit (lab v3, dev/cuda/
 * fwd_hopper_fp8.cu: 825 / 701 TFLOPS on an H200 at D = 128, T = 8192, against v1's 775 / 662).
 * variant (ATTN_CUDA_FP8_*, cuda.c's configurations): the ping-pong schedule on 128-key blocks, or
 * 192-key blocks with V^T's half panel padded (D = 128 only, where cuda.c alone offers them; lab
 * v6, free-running: 1.016x / 1.034x v3 in the lab, 1.009x / 1.004x by attn bench, H200,
 * bench/RESULTS.md). Not built, as measured never faster: the packed half panel (v5) and the
 * 192-key ping-pong. */
template <typename TO, int kD>
attn_status run_fp8_out(const attn_cuda_params &p, int variant, cudaStream_t s, char *why, size_t why_size) {
  if constexpr (kD == 128)
    if (variant & ATTN_CUDA_FP8_WIDE)
      return launch_fwd90_fp8<FwdFp8Cfg<TO, kD, 2, false, true, 0, 192>>(p, s, why, why_size);
  return variant & ATTN_CUDA_FP8_PINGPONG ? launch_fwd90_fp8<FwdFp8Cfg<TO, kD, 2, true>>(p, s, why, why_size)
                                          : launch_fwd90_fp8<FwdFp8Cfg<TO, kD, 2, false>>(p, s, why, why_size);
}
template <int kD>
attn_status run_fp8(const attn_cuda_params &p, int variant, cudaStream_t s, char *why, size_t why_size) {
  switch (p.out_elem) {
  case ATTN_CUDA_ELEM_F32: return run_fp8_out<float, kD>(p, variant, s, why, why_size);
  case ATTN_CUDA_ELEM_F16: return run_fp8_out<__half, kD>(p, variant, s, why, why_size);
  default: return run_fp8_out<__nv_bfloat16, kD>(p, variant, s, why, why_size);
  }
}

} // namespace sm90
} // namespace attn_cuda

extern "C" const char *attn_cuda_sm90_fp8_unsupported(const attn_cuda_params *p) {
  return attn_cuda::sm90::fp8_fwd_unsupported(*p);
}

extern "C" size_t attn_cuda_sm90_fp8_workspace(const attn_cuda_params *p) {
  return attn_cuda::sm90::vt_bytes(*p);
}

extern "C" int64_t attn_cuda_sm90_fp8_vt_columns(const attn_cuda_params *p) {
  return attn_cuda::sm90::vt_columns(*p);
}

extern "C" attn_status attn_cuda_sm90_fp8_forward(const attn_cuda_params *p, int variant, void *stream,
                                                  char *why, size_t why_size) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p->d == 256) return attn_cuda::sm90::run_fp8<256>(*p, variant, s, why, why_size);
  return attn_cuda::sm90::run_fp8<128>(*p, variant, s, why, why_size);
}

extern "C" int attn_cuda_sm90_built(void) { return 1; }

extern "C" const char *attn_cuda_sm90_unsupported(const attn_cuda_params *p) {
  const char *no = attn_cuda::sm90::sm90_fwd_unsupported(*p);
  if (no == nullptr && p->d != 256 && attn_cuda::sm90::generic_kernel(*p)) no = attn_cuda::sm90::kGenericDeclined;
  return no;
}

extern "C" const char *attn_cuda_sm90_bwd_unsupported(const attn_cuda_params *p) {
  return attn_cuda::sm90::sm90_bwd_unsupported(*p);
}

extern "C" attn_status attn_cuda_sm90_backward(const attn_cuda_params *p, int is_bf16, void *stream, char *why,
                                               size_t why_size) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  return is_bf16 ? attn_cuda::sm90::run_bwd90<__nv_bfloat16>(*p, s, why, why_size)
                 : attn_cuda::sm90::run_bwd90<__half>(*p, s, why, why_size);
}

extern "C" attn_status attn_cuda_sm90_forward(const attn_cuda_params *p, int is_bf16, void *stream, char *why,
                                              size_t why_size) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  return is_bf16 ? attn_cuda::sm90::run<__nv_bfloat16>(*p, s, why, why_size)
                 : attn_cuda::sm90::run<__half>(*p, s, why, why_size);
}
