/*
 * src/impl/cuda/cuda.c - the "cuda" implementation: libattn's own tensor-core kernels for NVIDIA
 * GPUs (sm_80 and sm_90), behind the attn_impl contract.
 *
 * This file is plain C. It decides what the kernels can run (supports), sizes the workspace, turns
 * an attn_run into the attn_cuda_params of raw pointers and strides, and calls the extern "C"
 * launchers of cuda_launch.h, which own every CUDA call. Tensors, workspace and stream are the
 * caller's; nothing is allocated on the execute path.
 *
 * What runs: flash_attention, f16 and bf16, head dims D and Dv multiples of 8 up to 256 (the
 * kernels are compiled for 32, 64, 96, 128, 192, 256 and zero-pad the rest), every feature of
 * SPEC.md. The backward pass of the default configuration is deterministic: dQ has its own kernel
 * instead of atomics (see cuda_bwd.cuh), except dbias summed over broadcast dimensions, which is
 * accumulated atomically; the "atomic" configuration trades that for speed. Decode-shaped problems
 * (Tq <= 16, only the features decode uses) also offer "splitkv", the split-KV decode kernel of
 * cuda_decode.cu, which is the only configuration of a paged KV cache (docs/DECODE.md). On a
 * compute capability 9.0 device (H100, H200), the problems the Hopper forward takes (sm90/:
 * head dims 64, 128, 256 with Dv = D, no dropout; sinks, varlen, soft cap and ALiBi at every one of
 * them, bias, masks and segment ids at D = 256 only) also offer "sm90", the default there: that
 * forward, with the Hopper backward (sm90/sm90_bwd.cuh: D = 64, 128, 256 with the band, GQA, varlen,
 * the soft cap, ALiBi and sinks) or elsewhere the atomic one; both add dq with atomics, so "sm90"
 * is not deterministic. "sm90_deterministic" is the same forward with the Hopper backward's dq
 * additions in a fixed order (counters per dq slice), or elsewhere the deterministic backward.
 * f8e4m3 problems (docs/FP8.md, forward only) run on compute capability 9.0 alone, on the sm90 fp8
 * forward (sm90/sm90_fwd_fp8.cuh; V transposed into the workspace first): configurations
 * "sm90_fp8" (default) and "sm90_fp8_pingpong", at D = 128 also "sm90_fp8_n192" (192-key
 * blocks). A run can sit inside a larger problem (attn_positions, one piece per axis: the
 * distributed layer's ring blocks and batch or head shards; place_run): its band and ALiBi then
 * use the global diagonal, and dropout the global Philox counters.
 */
#include "impl/impl.h"

#include "core/ctx.h"
#include "core/philox.h"
#include "core/tensors.h"
#include "impl/cuda/cuda_decode.h"
#include "impl/cuda/cuda_launch.h"
#include "module/gpu_runtime.h"
#include "module/module.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Sizes are passed to the kernels as 32-bit ints; positions plus window offsets must not wrap. */
#define ATTN_CUDA_MAX_LEN ((int64_t)1 << 30)
#define ATTN_CUDA_ALIGN 256

static size_t align_up(size_t n) {
  return (n + ATTN_CUDA_ALIGN - 1) & ~(size_t)(ATTN_CUDA_ALIGN - 1);
}

static int64_t rows_q(const attn_problem *p) {
  return p->varlen == ATTN_VARLEN_PACKED ? p->total_q : p->batch * p->seqlen_q;
}

/* Whether the split-KV decode kernel (cuda_decode.cu, docs/DECODE.md) can run the problem: few
 * queries per sequence and only the features decode uses. Paged problems run nowhere else. */
static int decode_shaped(const attn_problem *p) {
  return p->operation == ATTN_OPERATION_FLASH_ATTENTION && p->seqlen_q >= 1 &&
         p->seqlen_q <= ATTN_CUDA_DECODE_MAX_TQ && p->varlen == ATTN_VARLEN_NONE && !p->has_bias &&
         !p->has_mask && !p->has_segment_ids && p->dropout_p == 0.0;
}

static void problem_params(const attn_problem *p, attn_cuda_params *k);

/* The sizes every cuda kernel's launch can address: grid dimensions of at most 65535 batches or
 * heads, rows indexed in 32 bits. */
static attn_status grid_fits(const attn_problem *p, char *why, size_t why_size) {
  if (p->batch > 65535 || p->heads_q > 65535) {
    attn_format(why, why_size,
                "batch=%lld, heads_q=%lld: the cuda grid allows at most 65535 of each",
                (long long)p->batch, (long long)p->heads_q);
    return ATTN_STATUS_UNSUPPORTED;
  }
  if (p->seqlen_q > ATTN_CUDA_MAX_LEN || p->seqlen_k > ATTN_CUDA_MAX_LEN ||
      p->total_q > ATTN_CUDA_MAX_LEN || p->total_k > ATTN_CUDA_MAX_LEN) {
    attn_format(why, why_size, "sequence lengths above 2^30 are not supported by the cuda kernels");
    return ATTN_STATUS_UNSUPPORTED;
  }
  return ATTN_STATUS_OK;
}

/* An f8e4m3 problem (docs/FP8.md) runs on the sm90 fp8 forward (sm90/sm90_fwd_fp8.cuh) alone: a
 * build with sm_90a code, a compute capability 9.0 device, flash_attention without a paged cache,
 * and the features that kernel has (attn_cuda_sm90_fp8_unsupported names the one it lacks). */
static attn_status fp8_supports(const attn_problem *p, char *why, size_t why_size) {
  if (p->operation != ATTN_OPERATION_FLASH_ATTENTION || p->page_size > 0) {
    attn_format(why, why_size,
                "dtype=f8e4m3: the cuda fp8 forward takes flash_attention without a paged cache "
                "(cpu and ref run the rest)");
    return ATTN_STATUS_UNSUPPORTED;
  }
  if (!attn_cuda_sm90_built()) {
    attn_format(why, why_size,
                "dtype=f8e4m3: this build has no sm90 kernels (a CUDA toolkit "
                "before 12.0); the fp8 forward is Hopper's wgmma e4m3 kernel");
    return ATTN_STATUS_UNSUPPORTED;
  }
  const attn_status fits = grid_fits(p, why, why_size);
  if (fits != ATTN_STATUS_OK) return fits;
  int cc = 0;
  size_t smem = 0;
  char dev_why[512] = "";
  if (attn_cuda_device_info(p->device_index, &cc, &smem, dev_why, sizeof dev_why) !=
      ATTN_STATUS_OK) {
    attn_format(why, why_size,
                "dtype=f8e4m3: the cuda fp8 forward needs a compute capability 9.0 device; no "
                "usable CUDA device: %s",
                dev_why);
    return ATTN_STATUS_UNSUPPORTED;
  }
  if (cc != 90) {
    attn_format(why, why_size,
                "dtype=f8e4m3: device %d has compute capability %d.%d; the cuda fp8 forward is "
                "sm_90a machine code (wgmma e4m3), for 9.0 (H100, H200) only",
                (int)p->device_index, cc / 10, cc % 10);
    return ATTN_STATUS_UNSUPPORTED;
  }
  attn_cuda_params k;
  problem_params(p, &k);
  const char *no = attn_cuda_sm90_fp8_unsupported(&k);
  if (no != NULL) {
    attn_format(why, why_size, "dtype=f8e4m3, head_dim=%lld, head_dim_v=%lld: %s",
                (long long)p->head_dim, (long long)p->head_dim_v, no);
    return ATTN_STATUS_UNSUPPORTED;
  }
  return ATTN_STATUS_OK;
}

static attn_status cuda_supports(const attn_problem *p, char *why, size_t why_size) {
  if (p->dtype == ATTN_DTYPE_F8E4M3) return fp8_supports(p, why, why_size);
  if (p->page_size > 0 && !decode_shaped(p)) {
    attn_format(why, why_size,
                "page_size=%lld: a paged cache runs on the cuda decode kernel (cuda_decode.cu), "
                "which takes flash_attention with seqlen_q <= %d and no bias, mask, segment ids or "
                "dropout",
                (long long)p->page_size, ATTN_CUDA_DECODE_MAX_TQ);
    return ATTN_STATUS_UNSUPPORTED;
  }
  if (p->dtype != ATTN_DTYPE_BF16 && p->dtype != ATTN_DTYPE_F16) {
    attn_format(why, why_size,
                "dtype=%s: the cuda kernels run f16 and bf16 on tensor cores (f32 would need a "
                "non-tf32 path that does not exist yet)",
                attn_dtype_name((attn_dtype)p->dtype));
    return ATTN_STATUS_UNSUPPORTED;
  }
  if (p->operation != ATTN_OPERATION_FLASH_ATTENTION) {
    attn_format(why, why_size,
                "operation=scaled_dot_product_attention: the cuda kernels never materialise the "
                "probabilities; use flash_attention (same function) or cudnn");
    return ATTN_STATUS_UNSUPPORTED;
  }
  if (p->head_dim % 8 != 0 || p->head_dim_v % 8 != 0) {
    attn_format(why, why_size,
                "head_dim=%lld, head_dim_v=%lld: the cuda kernels need multiples of 8 "
                "(16-byte copies)",
                (long long)p->head_dim, (long long)p->head_dim_v);
    return ATTN_STATUS_UNSUPPORTED;
  }
  if (p->head_dim > 256 || p->head_dim_v > 256) {
    attn_format(why, why_size, "head_dim=%lld, head_dim_v=%lld: the cuda kernels stop at 256",
                (long long)p->head_dim, (long long)p->head_dim_v);
    return ATTN_STATUS_UNSUPPORTED;
  }
  const attn_status fits = grid_fits(p, why, why_size);
  if (fits != ATTN_STATUS_OK) return fits;
  int cc = 0;
  size_t smem = 0;
  char dev_why[512] = "";
  if (attn_cuda_device_info(p->device_index, &cc, &smem, dev_why, sizeof dev_why) !=
      ATTN_STATUS_OK) {
    attn_format(why, why_size, "no usable CUDA device: %s", dev_why);
    return ATTN_STATUS_UNSUPPORTED;
  }
  if (cc < 80) {
    attn_format(why, why_size,
                "device %d has compute capability %d.%d: the cuda kernels need 8.0 or newer",
                (int)p->device_index, cc / 10, cc % 10);
    return ATTN_STATUS_UNSUPPORTED;
  }
  int kd = attn_cuda_kernel_dim((int)p->head_dim, (int)p->head_dim_v);
  size_t need = attn_cuda_smem_bytes(kd, 1);
  size_t need_fwd = attn_cuda_smem_bytes(kd, 0);
  if (need_fwd > need) need = need_fwd;
  if (need > smem) {
    attn_format(why, why_size,
                "head dim %d needs %zu bytes of shared memory per block; device %d offers %zu", kd,
                need, (int)p->device_index, smem);
    return ATTN_STATUS_UNSUPPORTED;
  }
  return ATTN_STATUS_OK;
}

/* A window bound for the kernels: one wider than Tq + Tk bounds nothing and becomes -1 (unbounded),
 * so every bound fits 32 bits. */
static int32_t window_bound(const attn_problem *p, int64_t w) {
  return w < 0 || w >= p->seqlen_q + p->seqlen_k ? -1 : (int32_t)w;
}

/* Where a run sits in a larger problem (attn_positions: one piece per axis on a dense problem,
 * which plan.c makes sure of for this implementation): the Philox counters' bases and, with an
 * offset, the band's and ALiBi's diagonal i + offset - j, at which the window bounds are taken
 * (one that hides no key of the run is unbounded). */
typedef struct cuda_place {
  int32_t offset_given, offset, window_left, window_right;
  uint32_t b0, h0, i0, j0;
} cuda_place;

static attn_status place_run(const attn_run *run, cuda_place *pl) {
  const attn_problem *p = run->problem;
  const attn_positions *pos = run->positions;
  memset(pl, 0, sizeof *pl);
  pl->window_left = window_bound(p, p->window_left);
  pl->window_right = window_bound(p, p->window_right);
  if (pos == NULL) return ATTN_STATUS_OK;
  const int64_t i0 = pos->rows.global[0], j0 = pos->cols.global[0];
  if (p->dropout_p > 0.0 && j0 % 4 != 0) {
    attn_format(run->why, run->why_size,
                "positions.cols.global[0]=%lld with dropout: the cuda kernels share one Philox "
                "call among 4 keys, so a placed run's first key sits at a multiple of 4",
                (long long)j0);
    return ATTN_STATUS_UNSUPPORTED;
  }
  pl->b0 = (uint32_t)pos->batch0, pl->h0 = (uint32_t)pos->head0;
  pl->i0 = (uint32_t)i0, pl->j0 = (uint32_t)j0;
  if (!pos->has_offset) return ATTN_STATUS_OK;
  const int64_t o = attn_position_offset(pos, 0, 0);
  if (o > ATTN_CUDA_MAX_LEN || o < -ATTN_CUDA_MAX_LEN) {
    attn_format(run->why, run->why_size,
                "positions: the offset %lld of the placed run's diagonal is beyond the cuda "
                "kernels' 2^30",
                (long long)o);
    return ATTN_STATUS_UNSUPPORTED;
  }
  pl->offset_given = 1, pl->offset = (int32_t)o;
  /* row i sees keys [i + o - left, i + o + right]: a left bound of at least Tq - 1 + o, or a right
   * one of at least Tk - 1 - o, hides nothing (below 2^31: both lengths and o are within 2^30) */
  const int64_t wl = p->window_left, wr = p->window_right;
  pl->window_left = wl < 0 || wl >= p->seqlen_q - 1 + o ? -1 : (int32_t)wl;
  pl->window_right = wr < 0 || wr >= p->seqlen_k - 1 - o ? -1 : (int32_t)wr;
  return ATTN_STATUS_OK;
}

/* The problem's sizes and function as the kernels see them (what fill_params sets before the
 * tensors): enough for the kernels' own rules on what they run. */
static void problem_params(const attn_problem *p, attn_cuda_params *k) {
  memset(k, 0, sizeof *k);
  k->device_index = p->device_index;
  k->batch = (int32_t)p->batch, k->seqlen_q = (int32_t)p->seqlen_q,
  k->seqlen_k = (int32_t)p->seqlen_k;
  k->heads_q = (int32_t)p->heads_q, k->heads_kv = (int32_t)p->heads_kv;
  k->group = (int32_t)(p->heads_q / p->heads_kv);
  k->d = (int32_t)p->head_dim, k->dv = (int32_t)p->head_dim_v;
  k->total_q = p->total_q, k->total_k = p->total_k;
  k->rows_q = rows_q(p);
  k->varlen = p->varlen == ATTN_VARLEN_PACKED   ? ATTN_CUDA_VARLEN_PACKED
              : p->varlen == ATTN_VARLEN_PADDED ? ATTN_CUDA_VARLEN_PADDED
                                                : ATTN_CUDA_VARLEN_NONE;
  k->num_sinks = (int32_t)p->num_sinks;
  k->sinks_shared = p->sinks_shared;
  k->scale = (float)p->scale;
  k->softcap = (float)p->softcap;
  k->window_left = window_bound(p, p->window_left);
  k->window_right = window_bound(p, p->window_right);
  k->align_bottom_right = p->align == ATTN_ALIGN_BOTTOM_RIGHT;
  k->dropout_p = (float)p->dropout_p;
  k->drop_threshold = attn_dropout_threshold(p->dropout_p);
  k->keep_scale = (float)(1.0 / (1.0 - p->dropout_p));
  k->elementwise_kinds = (p->has_bias ? ATTN_CUDA_FEAT_BIAS : 0) |
                         (p->has_mask ? ATTN_CUDA_FEAT_MASK : 0) |
                         (p->alibi != ATTN_ALIBI_NONE ? ATTN_CUDA_FEAT_ALIBI : 0) |
                         (p->softcap > 0.0 ? ATTN_CUDA_FEAT_SOFTCAP : 0) |
                         (p->has_segment_ids ? ATTN_CUDA_FEAT_SEGMENTS : 0);
  k->elementwise = k->elementwise_kinds != 0;
  k->fp8 = p->dtype == ATTN_DTYPE_F8E4M3;
  const attn_dtype out = attn_out_dtype(p);
  k->out_elem = out == ATTN_DTYPE_F32    ? ATTN_CUDA_ELEM_F32
                : out == ATTN_DTYPE_BF16 ? ATTN_CUDA_ELEM_BF16
                                         : ATTN_CUDA_ELEM_F16;
}

/* Whether the Hopper forward (sm90/) is offered for the problem: built, a compute capability 9.0
 * device (its machine code is sm_90a's), and a problem whose features it has. */
static int sm90_offered(const attn_problem *p) {
  if (p->page_size > 0 || !attn_cuda_sm90_built()) return 0;
  int cc = 0;
  size_t smem = 0;
  char why[256];
  if (attn_cuda_device_info(p->device_index, &cc, &smem, why, sizeof why) != ATTN_STATUS_OK ||
      cc != 90)
    return 0;
  attn_cuda_params k;
  problem_params(p, &k);
  return attn_cuda_sm90_unsupported(&k) == NULL;
}

/* Configurations: the backward pass's schedule (the forward pass is the same in both).
 * 0 "deterministic": dK/dV and dQ in two kernels, no atomics, identical bits on every run.
 * 1 "atomic": FlashAttention-2's single kernel adding dQ into an f32 workspace with atomics;
 *   fewer products, but the last bits of dq vary from run to run. */
#define CUDA_CONFIG_ATOMIC 1
/* 2.. "splitkv", "splitkv_half", "splitkv_waves2" (decode-shaped dense problems): the forward pass
 * on the split-KV decode kernel with its key splits chosen for one full wave of resident CTAs (the
 * heuristic), half a wave (longer splits: less per-CTA overhead and merging where the keys are
 * few) or two, for the executor to time; the backward pass as "deterministic". A paged problem has
 * these three only, from index 0. The table holds half waves. One wave is the default: on the H100
 * it was the fastest in 29 of the 43 decode rows of bench/RESULTS.md and within 1.5% in all but
 * one (Tq = 4 at B = 1, Tk = 8192: 11% behind half a wave). */
#define CUDA_CONFIG_SPLITKV 2
static const int splitkv_half_waves[] = {2, 1, 4};
static const char *const splitkv_names[] = {"splitkv", "splitkv_half", "splitkv_waves2"};
#define N_SPLITKV 3

static int is_splitkv(const attn_problem *p, int32_t config) {
  return p->page_size > 0 || (decode_shaped(p) && config >= CUDA_CONFIG_SPLITKV &&
                              config < CUDA_CONFIG_SPLITKV + N_SPLITKV);
}

/* The index of a splitkv configuration in the tables above. */
static int splitkv_index(const attn_problem *p, int32_t config) {
  int32_t i = p->page_size > 0 ? config : config - CUDA_CONFIG_SPLITKV;
  return i >= 0 && i < N_SPLITKV ? i : 0;
}

/* The keys a sequence's rows can see: seqlen_k or, with both window bounds, their width. */
static int64_t splitkv_keys(const attn_problem *p) {
  int64_t keys = p->seqlen_k;
  const int32_t wl = window_bound(p, p->window_left), wr = window_bound(p, p->window_right);
  if (wl >= 0 && wr >= 0 && (int64_t)wl + wr + p->seqlen_q < keys)
    keys = (int64_t)wl + wr + p->seqlen_q;
  return keys;
}
/* The split count of a splitkv configuration (workspace and run agree through this one call):
 * from splitkv_keys and the plan's data paths (variant: ATTN_CUDA_DECODE's flags), which with the
 * keys decide the KV heads per CTA (attn_cuda_decode_heads: several make fewer, larger CTAs). */
static int splitkv_splits(const attn_problem *p, int32_t config, int32_t variant) {
  const int chunks = attn_cuda_decode_row_chunks((int)(p->heads_q / p->heads_kv), (int)p->seqlen_q);
  const int64_t keys = splitkv_keys(p);
  return attn_cuda_decode_splits(p->device_index, (int)p->batch, (int)p->heads_kv, chunks,
                                 (int)keys, (int)p->head_dim, (int)p->head_dim_v,
                                 splitkv_half_waves[splitkv_index(p, config)], (int)variant);
}

/* An f8e4m3 problem's configurations and the kernel's variant of each (ATTN_CUDA_FP8_*): the
 * sm90 fp8 forward with its two consumer warpgroups free-running ("sm90_fp8", the default) or
 * taking turns to issue their products ("sm90_fp8_pingpong") on 128-key blocks and, at D = 128
 * only (at 256 S, O and P would not fit the registers), free-running on 192-key blocks
 * ("sm90_fp8_n192": V^T's last 64 keys of a block padded to a whole panel), for the executor to
 * time; all deterministic (no atomics). On an H200 (bench/RESULTS.md) the 192-key blocks were
 * 0.4-0.9% faster than 128-key ones by attn bench at T = 8192; the packed half panel and the
 * 192-key ping-pong, never faster, are not offered. */
static const struct {
  const char *name;
  int32_t variant;
} fp8_configs[] = {
    {"sm90_fp8", 0},
    {"sm90_fp8_pingpong", ATTN_CUDA_FP8_PINGPONG},
    {"sm90_fp8_n192", ATTN_CUDA_FP8_WIDE},
};

static int32_t fp8_num_configs(const attn_problem *problem) {
  return problem->head_dim == 128 ? (int32_t)(sizeof fp8_configs / sizeof *fp8_configs) : 2;
}

static int32_t fp8_config_index(const attn_problem *problem, int32_t config) {
  return config > 0 && config < fp8_num_configs(problem) ? config : 0;
}

/* The last two, "sm90" and "sm90_deterministic": the Hopper forward (sm90/), then the Hopper
 * backward where it takes the problem, else the atomic one (both need the dq workspace) or, in
 * the second, the deterministic one; offered where sm90_offered says. */
static int32_t cuda_num_configs(const attn_problem *problem) {
  if (problem->dtype == ATTN_DTYPE_F8E4M3) return fp8_num_configs(problem);
  if (problem->page_size > 0) return N_SPLITKV;
  return (decode_shaped(problem) ? CUDA_CONFIG_SPLITKV + N_SPLITKV : 2) + 2 * sm90_offered(problem);
}

/* What cuda_plan_init reads from the environment for a plan, and what follows from it and the
 * problem alone (its state). */
typedef struct cuda_plan_state {
  int32_t decode_paths;  /* splitkv: ATTN_CUDA_DECODE's flags (attn_cuda_decode_variant) */
  int32_t decode_splits; /* splitkv: its split count (splitkv_splits), asked of the device once */
  int32_t decode_heads;  /* splitkv: KV heads per CTA (attn_cuda_decode_heads) */
  int32_t sm90_sched;    /* sm90: ATTN_CUDA_SM90_SCHED_* (sm90_sched_from_env) */
} cuda_plan_state;

static int is_sm90(const attn_problem *p, int32_t config) {
  return config >= 2 && !is_splitkv(p, config) && sm90_offered(p);
}

static int is_sm90_deterministic(const attn_problem *p, int32_t config) {
  return is_sm90(p, config) && config == cuda_num_configs(p) - 1;
}

static void cuda_config_name(const attn_problem *problem, int32_t config, char *buf, size_t size) {
  if (problem->dtype == ATTN_DTYPE_F8E4M3) {
    attn_format(buf, size, "%s", fp8_configs[fp8_config_index(problem, config)].name);
    return;
  }
  if (is_splitkv(problem, config)) {
    attn_format(buf, size, "%s", splitkv_names[splitkv_index(problem, config)]);
    return;
  }
  if (is_sm90(problem, config)) {
    attn_format(buf, size, is_sm90_deterministic(problem, config) ? "sm90_deterministic" : "sm90");
    return;
  }
  attn_format(buf, size, "%s", config == CUDA_CONFIG_ATOMIC ? "atomic" : "deterministic");
}

/* Whether a configuration repeats its bits: not "atomic" or "sm90" (dq accumulated with
 * atomics), and not when dbias is summed over broadcast dims of the bias, which every
 * configuration does with atomics (the problem does not say whether dbias is asked for, so this
 * answers for the worst). "sm90_deterministic" orders its dq additions. */
static int cuda_config_deterministic(const attn_problem *p, int32_t config) {
  int broadcast_bias =
      p->has_bias && (p->bias_shape[0] != p->batch || p->bias_shape[1] != p->heads_q ||
                      p->bias_shape[2] != p->seqlen_q || p->bias_shape[3] != p->seqlen_k);
  if (is_splitkv(p, config) || p->dtype == ATTN_DTYPE_F8E4M3)
    return 1; /* splits merge in a fixed order; the fp8 forward has no atomics */
  return config != CUDA_CONFIG_ATOMIC &&
         (!is_sm90(p, config) || is_sm90_deterministic(p, config)) && !broadcast_bias;
}

/* Decode-shaped problems (paged or dense): "splitkv", whose GQA-packed rows read K and V once where
 * the others' 64- or 128-row tiles would be mostly empty; otherwise "sm90" where it is offered
 * (1.6x to 1.8x the sm80 forward on an H100, dev/cuda/fwd_hopper.cu), else "deterministic". */
static int32_t cuda_default_config(const attn_problem *problem) {
  if (problem->page_size > 0 || problem->dtype == ATTN_DTYPE_F8E4M3) return 0;
  if (decode_shaped(problem)) return CUDA_CONFIG_SPLITKV;
  return sm90_offered(problem) ? cuda_num_configs(problem) - 2 : 0;
}

/* The f32 dq accumulator of the atomic and sm90 configurations (none in the others): [Hq, rows_q,
 * D], or the sm90 backward's tiles where those are larger (the sm90 configurations run the
 * problems the sm90 backward lacks on the sm80 kernels). */
static size_t dq_accum_bytes(const attn_problem *p, int32_t config) {
  if (config != CUDA_CONFIG_ATOMIC && !is_sm90(p, config)) return 0;
  int64_t floats = p->heads_q * rows_q(p) * p->head_dim;
  const int64_t tiles = ATTN_CUDA_SM90_DQ_FLOATS(p->heads_q, p->batch, p->seqlen_q, p->head_dim);
  if (is_sm90(p, config) && tiles > floats) floats = tiles;
  return align_up((size_t)floats * sizeof(float));
}

/* Backward: Delta [Hq, rows_q] f32, then the dense f32 dbias accumulator when there is a bias,
 * then dq_accum_bytes, then ("sm90_deterministic") the counters that order the additions into
 * the tiles. */
static size_t cuda_workspace_size(const attn_problem *p, int32_t config, const void *state,
                                  int backward) {
  if (p->dtype == ATTN_DTYPE_F8E4M3) { /* the forward's V transposed (no backward) */
    attn_cuda_params k;
    problem_params(p, &k);
    return backward ? 0 : align_up(attn_cuda_sm90_fp8_workspace(&k));
  }
  if (!backward && is_splitkv(p, config)) { /* the splits' partial results */
    /* the split count cuda_plan_init worked out (a splitkv plan always has its state) */
    const cuda_plan_state *plan = state;
    const int chunks =
        attn_cuda_decode_row_chunks((int)(p->heads_q / p->heads_kv), (int)p->seqlen_q);
    return attn_cuda_decode_workspace((int)p->batch, (int)p->heads_kv, chunks, plan->decode_splits,
                                      (int)p->head_dim_v);
  }
  if (!backward) return 0;
  size_t bytes = align_up((size_t)(p->heads_q * rows_q(p)) * sizeof(float));
  if (p->has_bias) bytes += align_up((size_t)attn_role_numel(p, ATTN_ROLE_BIAS) * sizeof(float));
  bytes += dq_accum_bytes(p, config);
  if (is_sm90_deterministic(p, config))
    bytes += align_up((size_t)ATTN_CUDA_SM90_DQ_SLICES(p->heads_q, p->batch, p->seqlen_q) *
                      sizeof(int32_t));
  return bytes;
}

/* ---- from an attn_run to the kernels' params -------------------------------------------------- */

typedef struct token_strides {
  int64_t b, r, h;
} token_strides;

/* Strides (batch, row, head) of a token tensor in the kernels' addressing, after checking what the
 * 16-byte copies need: contiguous last dimension, other strides and the base 16-byte aligned. */
static int token_layout(const attn_problem *p, const attn_tensor *t, const char *name,
                        int64_t heads, token_strides *out, char *why, size_t why_size) {
  int64_t shape[ATTN_MAX_DIMS];
  attn_role role = ATTN_ROLE_Q; /* any token role: only the number of dims matters here */
  int ndim = attn_role_shape(p, role, shape);
  int64_t sb, sr, sh, sd;
  if (ndim == 3)
    sb = 0, sr = t->stride[0], sh = t->stride[1], sd = t->stride[2];
  else
    sb = t->stride[0], sr = t->stride[1], sh = t->stride[2], sd = t->stride[3];
  if (heads == 1) sh = 0;
  if (ndim == 4 && p->batch == 1) sb = 0;
  if (sd != 1) {
    attn_format(why, why_size,
                "%s.stride[%d]=%lld: the cuda kernels need a contiguous last dimension", name,
                ndim - 1, (long long)sd);
    return 0;
  }
  if (sb % 8 != 0 || sr % 8 != 0 || sh % 8 != 0 || ((uintptr_t)t->data % 16) != 0) {
    attn_format(why, why_size,
                "%s: the cuda kernels need 16-byte aligned data and strides that are "
                "multiples of 8 elements",
                name);
    return 0;
  }
  out->b = sb, out->r = sr, out->h = sh;
  return 1;
}

static int64_t bstride(const int64_t shape[4], const int64_t stride[4], int d) {
  return shape[d] == 1 ? 0 : stride[d];
}

/* ALiBi slopes ([Hq] or [B, Hq]) and sinks ([Hq, S] or shared [S]) as pointer and strides: the
 * one place both kernels' params (attn_cuda_params, attn_cuda_decode_params) take them from. */
static void alibi_sinks_layout(const attn_problem *p, const attn_inputs *in, const float **alibi,
                               int64_t *alibi_b, int64_t *alibi_h, const float **sinks,
                               int32_t *num_sinks, int64_t *sinks_h, int64_t *sinks_t) {
  if (p->alibi != ATTN_ALIBI_NONE) {
    *alibi = (const float *)in->alibi_slopes.data;
    if (p->alibi == ATTN_ALIBI_PER_BATCH_HEAD)
      *alibi_b = in->alibi_slopes.stride[0], *alibi_h = in->alibi_slopes.stride[1];
    else
      *alibi_b = 0, *alibi_h = in->alibi_slopes.stride[0];
  }
  if (p->num_sinks > 0) {
    *sinks = (const float *)in->sinks.data;
    *num_sinks = (int32_t)p->num_sinks;
    if (p->sinks_shared)
      *sinks_h = 0, *sinks_t = in->sinks.stride[0];
    else
      *sinks_h = in->sinks.stride[0], *sinks_t = in->sinks.stride[1];
  }
}

/* The fp8 forward's part of the params: the descale factors ([1] each: strides 0; [B, Hkv]: the
 * caller's), the schedule of the run's configuration, and V^T's place in the workspace. */
static attn_status fill_fp8_params(const attn_run *run, attn_cuda_params *k) {
  const attn_problem *p = run->problem;
  const attn_inputs *in = run->inputs;
  const attn_tensor *f[3] = {&in->q_descale, &in->k_descale, &in->v_descale};
  const float **dst[3] = {&k->q_descale, &k->k_descale, &k->v_descale};
  if (p->descale != ATTN_DESCALE_NONE)
    for (int i = 0; i < 3; ++i) {
      *dst[i] = (const float *)f[i]->data;
      const int per_bg = p->descale == ATTN_DESCALE_PER_BATCH_KV_HEAD;
      k->descale_b[i] = per_bg && p->batch > 1 ? f[i]->stride[0] : 0;
      k->descale_g[i] = per_bg && p->heads_kv > 1 ? f[i]->stride[1] : 0;
    }
  k->fp8 = 1 + fp8_configs[fp8_config_index(p, run->config)].variant;
  const size_t need = attn_cuda_sm90_fp8_workspace(k);
  if (run->workspace == NULL || run->workspace_size < need) {
    attn_format(run->why, run->why_size,
                "the fp8 forward's workspace (%zu bytes given) is smaller than V transposed needs "
                "(%zu)",
                run->workspace_size, need);
    return ATTN_STATUS_INTERNAL;
  }
  k->v_t = run->workspace;
  k->vt_cols = attn_cuda_sm90_fp8_vt_columns(k);
  return ATTN_STATUS_OK;
}

static attn_status fill_params(const attn_run *run, int backward, attn_cuda_params *k) {
  const attn_problem *p = run->problem;
  const attn_inputs *in = run->inputs;
  const attn_outputs *out = run->outputs;
  char *why = run->why;
  size_t ws = run->why_size;
  problem_params(p, k);
  cuda_place pl;
  const attn_status placed = place_run(run, &pl);
  if (placed != ATTN_STATUS_OK) return placed;
  k->offset_given = pl.offset_given, k->offset = pl.offset;
  k->window_left = pl.window_left, k->window_right = pl.window_right;
  k->pos_b0 = pl.b0, k->pos_h0 = pl.h0, k->pos_i0 = pl.i0, k->pos_j0 = pl.j0;
  k->use_sm90 = !k->fp8 && is_sm90(p, run->config);
  if (k->use_sm90 && run->state != NULL)
    k->sm90_sched = ((const cuda_plan_state *)run->state)->sm90_sched;

  token_strides s;
  if (!token_layout(p, &in->q, "q", p->heads_q, &s, why, ws)) return ATTN_STATUS_UNSUPPORTED;
  k->q = in->q.data, k->q_b = s.b, k->q_r = s.r, k->q_h = s.h;
  if (!token_layout(p, &in->k, "k", p->heads_kv, &s, why, ws)) return ATTN_STATUS_UNSUPPORTED;
  k->k = in->k.data, k->k_b = s.b, k->k_r = s.r, k->k_h = s.h;
  if (!token_layout(p, &in->v, "v", p->heads_kv, &s, why, ws)) return ATTN_STATUS_UNSUPPORTED;
  k->v = in->v.data, k->v_b = s.b, k->v_r = s.r, k->v_h = s.h;
  if (!token_layout(p, &out->out, "out", p->heads_q, &s, why, ws)) return ATTN_STATUS_UNSUPPORTED;
  k->out = out->out.data, k->o_b = s.b, k->o_r = s.r, k->o_h = s.h;

  if (out->lse.data != NULL) {
    k->lse = (float *)out->lse.data;
    if (p->varlen == ATTN_VARLEN_PACKED)
      k->lse_b = 0, k->lse_h = out->lse.stride[0], k->lse_r = out->lse.stride[1];
    else
      k->lse_b = out->lse.stride[0], k->lse_h = out->lse.stride[1], k->lse_r = out->lse.stride[2];
  }

  if (p->has_bias) {
    const int64_t *sh = p->bias_shape;
    k->bias = in->bias.data;
    for (int d = 0; d < 4; ++d)
      k->bias_s[d] = bstride(sh, in->bias.stride, d), k->bias_shape[d] = sh[d];
    k->bias_elem = p->bias_dtype == ATTN_DTYPE_F32    ? ATTN_CUDA_ELEM_F32
                   : p->bias_dtype == ATTN_DTYPE_BF16 ? ATTN_CUDA_ELEM_BF16
                                                      : ATTN_CUDA_ELEM_F16;
    k->bias_head_mode = sh[1] == p->heads_q ? 1 : sh[1] == p->heads_kv ? 2 : 0;
  }
  if (p->has_mask) {
    k->mask = (const uint8_t *)in->mask.data;
    for (int d = 0; d < 4; ++d) k->mask_s[d] = bstride(p->mask_shape, in->mask.stride, d);
  }
  alibi_sinks_layout(p, in, &k->alibi, &k->alibi_b, &k->alibi_h, &k->sinks, &k->num_sinks,
                     &k->sinks_h, &k->sinks_t);
  if (p->has_segment_ids) {
    k->q_seg = (const int32_t *)in->q_segment_ids.data;
    k->kv_seg = (const int32_t *)in->kv_segment_ids.data;
    k->qseg_b = in->q_segment_ids.stride[0], k->qseg_r = in->q_segment_ids.stride[1];
    k->kseg_b = in->kv_segment_ids.stride[0], k->kseg_r = in->kv_segment_ids.stride[1];
  }
  k->cu_q = in->cu_seqlens_q, k->cu_k = in->cu_seqlens_k;
  k->seqlens_q = in->seqlens_q, k->seqlens_k = in->seqlens_k;
  k->seed = in->dropout_seed;
  if (k->fp8) {
    attn_status st = fill_fp8_params(run, k);
    if (st != ATTN_STATUS_OK) return st;
  }

  if (backward) {
    const attn_grads *g = run->grads;
    if (!token_layout(p, run->dout, "dout", p->heads_q, &s, why, ws))
      return ATTN_STATUS_UNSUPPORTED;
    k->dout = run->dout->data, k->do_b = s.b, k->do_r = s.r, k->do_h = s.h;
    if (!token_layout(p, &g->dq, "dq", p->heads_q, &s, why, ws)) return ATTN_STATUS_UNSUPPORTED;
    k->dq_out = g->dq.data, k->dq_b = s.b, k->dq_r = s.r, k->dq_h = s.h;
    if (!token_layout(p, &g->dk, "dk", p->heads_kv, &s, why, ws)) return ATTN_STATUS_UNSUPPORTED;
    k->dk_out = g->dk.data, k->dk_b = s.b, k->dk_r = s.r, k->dk_h = s.h;
    if (!token_layout(p, &g->dv, "dv", p->heads_kv, &s, why, ws)) return ATTN_STATUS_UNSUPPORTED;
    k->dv_out = g->dv.data, k->dv_b = s.b, k->dv_r = s.r, k->dv_h = s.h;
    char *w = (char *)run->workspace;
    k->delta = (float *)w;
    w += align_up((size_t)(p->heads_q * rows_q(p)) * sizeof(float));
    if (p->has_bias && g->dbias.data != NULL) {
      k->dbias = g->dbias.data;
      for (int d = 0; d < 4; ++d) k->dbias_s[d] = g->dbias.stride[d];
      k->dbias_accum = (float *)w;
    }
    if (p->has_bias) w += align_up((size_t)attn_role_numel(p, ATTN_ROLE_BIAS) * sizeof(float));
    if (run->config == CUDA_CONFIG_ATOMIC || k->use_sm90) {
      k->dq_accum = (float *)w;
      if (is_sm90_deterministic(p, run->config)) /* the counters follow the accumulator */
        k->dq_semaphore = (int32_t *)(w + dq_accum_bytes(p, run->config));
    }
    if (p->num_sinks > 0 && g->dsinks.data != NULL) {
      k->dsinks = (float *)g->dsinks.data;
      if (p->sinks_shared)
        k->dsinks_h = 0, k->dsinks_t = g->dsinks.stride[0];
      else
        k->dsinks_h = g->dsinks.stride[0], k->dsinks_t = g->dsinks.stride[1];
    }
  }
  return ATTN_STATUS_OK;
}

/* (page or batch, row, head) strides of k or v for the decode kernel, with the 16-byte rule of
 * token_layout: a paged pool [N, P, Hkv, W] keeps its page stride even with one sequence. */
static int kv_layout(const attn_tensor *t, const char *name, int64_t *s0, int64_t *s1, int64_t *s2,
                     char *why, size_t why_size) {
  if (t->stride[3] != 1) {
    attn_format(why, why_size,
                "%s.stride[3]=%lld: the cuda kernels need a contiguous last dimension", name,
                (long long)t->stride[3]);
    return 0;
  }
  if (t->stride[0] % 8 != 0 || t->stride[1] % 8 != 0 || t->stride[2] % 8 != 0 ||
      ((uintptr_t)t->data % 16) != 0) {
    attn_format(why, why_size,
                "%s: the cuda kernels need 16-byte aligned data and strides that are multiples of "
                "8 elements",
                name);
    return 0;
  }
  *s0 = t->stride[0], *s1 = t->stride[1], *s2 = t->stride[2];
  return 1;
}

/* The decode kernel's params from a run (dense or paged). */
static attn_status fill_decode_params(const attn_run *run, attn_cuda_decode_params *k) {
  const attn_problem *p = run->problem;
  const attn_inputs *in = run->inputs;
  const attn_outputs *out = run->outputs;
  char *why = run->why;
  size_t ws = run->why_size;
  memset(k, 0, sizeof *k);
  k->device_index = p->device_index;
  k->batch = (int32_t)p->batch, k->seqlen_q = (int32_t)p->seqlen_q;
  k->seqlen_k = (int32_t)p->seqlen_k;
  k->heads_q = (int32_t)p->heads_q, k->heads_kv = (int32_t)p->heads_kv;
  k->group = (int32_t)(p->heads_q / p->heads_kv);
  k->d = (int32_t)p->head_dim, k->dv = (int32_t)p->head_dim_v;
  token_strides s;
  if (!token_layout(p, &in->q, "q", p->heads_q, &s, why, ws)) return ATTN_STATUS_UNSUPPORTED;
  k->q = in->q.data, k->q_b = s.b, k->q_r = s.r, k->q_h = s.h;
  if (!token_layout(p, &out->out, "out", p->heads_q, &s, why, ws)) return ATTN_STATUS_UNSUPPORTED;
  k->out = out->out.data, k->o_b = s.b, k->o_r = s.r, k->o_h = s.h;
  if (!kv_layout(&in->k, "k", &k->k_b, &k->k_r, &k->k_h, why, ws) ||
      !kv_layout(&in->v, "v", &k->v_b, &k->v_r, &k->v_h, why, ws))
    return ATTN_STATUS_UNSUPPORTED;
  k->k = in->k.data, k->v = in->v.data;
  if (out->lse.data != NULL) {
    k->lse = (float *)out->lse.data;
    k->lse_b = out->lse.stride[0], k->lse_h = out->lse.stride[1], k->lse_r = out->lse.stride[2];
  }
  if (p->page_size > 0) {
    k->block_table = (const int32_t *)in->block_table.data;
    k->bt_b = in->block_table.stride[0], k->bt_p = in->block_table.stride[1];
    k->page_size = (int32_t)p->page_size;
    k->num_pages = (int32_t)attn_paged_num_pages(p);
    k->cache_seqlens = in->cache_seqlens;
    k->seqlen_new = (int32_t)p->seqlen_new;
    if (p->seqlen_new > 0) {
      /* the append copies 16 bytes at a time, like the reads */
      if (!kv_layout(&in->k_new, "k_new", &k->kn_b, &k->kn_r, &k->kn_h, why, ws) ||
          !kv_layout(&in->v_new, "v_new", &k->vn_b, &k->vn_r, &k->vn_h, why, ws))
        return ATTN_STATUS_UNSUPPORTED;
      k->k_new = in->k_new.data, k->v_new = in->v_new.data;
    }
  }
  alibi_sinks_layout(p, in, &k->alibi, &k->alibi_b, &k->alibi_h, &k->sinks, &k->num_sinks,
                     &k->sinks_h, &k->sinks_t);
  k->scale = (float)p->scale;
  k->softcap = (float)p->softcap;
  cuda_place pl;
  const attn_status placed = place_run(run, &pl);
  if (placed != ATTN_STATUS_OK) return placed;
  k->window_left = pl.window_left, k->window_right = pl.window_right;
  k->align_bottom_right = p->align == ATTN_ALIGN_BOTTOM_RIGHT;
  k->offset_given = pl.offset_given, k->offset = pl.offset;
  const int chunks = attn_cuda_decode_row_chunks(k->group, k->seqlen_q);
  const cuda_plan_state *plan = run->state; /* a splitkv plan always has one */
  k->variant = plan->decode_paths;
  k->splits = plan->decode_splits;
  k->heads = plan->decode_heads;
  /* the workspace was sized for this split count (cuda_workspace_size) */
  if (run->workspace_size <
      attn_cuda_decode_workspace(k->batch, k->heads_kv, chunks, k->splits, k->dv)) {
    attn_format(why, ws, "the decode kernel's workspace is smaller than its split count needs");
    return ATTN_STATUS_INTERNAL;
  }
  k->partials = (float *)run->workspace;
  return ATTN_STATUS_OK;
}

/* ATTN_CUDA_SM90_SCHED=grid|persistent: the sm90 forward's tile scheduler, forced (for tests and
 * measurements: both must stay right whichever the measured choice takes); unset or anything
 * else: ATTN_CUDA_SM90_SCHED_AUTO, the choice sm90_launch.cu measured. */
static int32_t sm90_sched_from_env(void) {
  const char *e = getenv("ATTN_CUDA_SM90_SCHED");
  if (e == NULL) return ATTN_CUDA_SM90_SCHED_AUTO;
  if (strcmp(e, "grid") == 0) return ATTN_CUDA_SM90_SCHED_GRID;
  if (strcmp(e, "persistent") == 0) return ATTN_CUDA_SM90_SCHED_PERSISTENT;
  return ATTN_CUDA_SM90_SCHED_AUTO;
}

/* A splitkv or sm90 plan's state: the switches read from the environment once, when the plan is
 * made, rather than at every call. Other plans have none. */
static attn_status cuda_plan_init(const attn_problem *problem, int32_t config, void **state,
                                  char *why, size_t why_size) {
  *state = NULL;
  const int splitkv = is_splitkv(problem, config);
  if (!splitkv && !is_sm90(problem, config)) return ATTN_STATUS_OK;
  cuda_plan_state *st = malloc(sizeof *st);
  if (st == NULL) {
    attn_format(why, why_size, "out of memory for the plan's state");
    return ATTN_STATUS_OUT_OF_MEMORY;
  }
  st->decode_paths = splitkv ? (int32_t)attn_cuda_decode_variant() : 0;
  st->decode_splits = splitkv ? splitkv_splits(problem, config, st->decode_paths) : 0;
  st->decode_heads =
      splitkv ? attn_cuda_decode_heads(problem->device_index, (int)problem->batch,
                                       (int)problem->heads_kv, (int)splitkv_keys(problem),
                                       (int)problem->head_dim, (int)problem->head_dim_v,
                                       st->decode_paths)
              : 0;
  st->sm90_sched = splitkv ? ATTN_CUDA_SM90_SCHED_AUTO : sm90_sched_from_env();
  *state = st;
  return ATTN_STATUS_OK;
}

static void cuda_plan_fini(void *state) { free(state); }

static attn_status cuda_forward(const attn_run *run) {
  if (run->problem->dtype != ATTN_DTYPE_F8E4M3 && is_splitkv(run->problem, run->config)) {
    attn_cuda_decode_params d;
    attn_status st = fill_decode_params(run, &d);
    if (st != ATTN_STATUS_OK) return st;
    return attn_cuda_decode_forward(&d, run->problem->dtype == ATTN_DTYPE_BF16, run->stream,
                                    run->why, run->why_size);
  }
  attn_cuda_params k;
  attn_status st = fill_params(run, 0, &k);
  if (st != ATTN_STATUS_OK) return st;
  return attn_cuda_forward(&k, run->problem->dtype == ATTN_DTYPE_BF16, run->stream, run->why,
                           run->why_size);
}

static attn_status cuda_backward(const attn_run *run) {
  attn_cuda_params k;
  attn_status st = fill_params(run, 1, &k);
  if (st != ATTN_STATUS_OK) return st;
  return attn_cuda_backward(&k, run->problem->dtype == ATTN_DTYPE_BF16, run->stream, run->why,
                            run->why_size);
}

const attn_impl attn_cuda_impl = {
    .name = "cuda",
    .device = ATTN_DEVICE_CUDA,
    .version = 4,
    .supports = cuda_supports,
    .num_configs = cuda_num_configs,
    .config_name = cuda_config_name,
    .default_config = cuda_default_config,
    .workspace_size = cuda_workspace_size,
    .plan_init = cuda_plan_init,
    .plan_fini = cuda_plan_fini,
    .forward = cuda_forward,
    .backward = cuda_backward,
    .config_deterministic = cuda_config_deterministic,
    .honours_positions = ATTN_POSITIONS_ONE_PIECE,
};

/* The module libattn_cuda.so (src/module/module.h): this implementation and the CUDA runtime
 * services. src/module/entry.c exports it; libattn_gpu.a links it in directly. */
static const attn_impl *const cuda_module_impls[] = {&attn_cuda_impl};
extern const attn_dist_device_ops attn_cuda_dist_ops; /* dist_ops.cu */
static const attn_module_table cuda_module_table = {
    ATTN_MODULE_TABLE_HEADER, "cuda", cuda_module_impls,  1,
    &attn_gpu_runtime_ops,    NULL,   &attn_cuda_dist_ops};
const attn_module_table *attn_cuda_module(void);
const attn_module_table *attn_cuda_module(void) { return &cuda_module_table; }
