/*
 * src/impl/cudnn/cudnn.c - the "cudnn" implementation: scaled dot-product attention, forward and
 * backward, run by cuDNN's fused flash-attention engines on an NVIDIA GPU (bf16 and f16 inputs;
 * e4m3 inputs forward only, where cuDNN writes a bf16 or f16 out: fp8_supported, docs/FP8.md).
 *
 * What it runs is exactly what cuDNN's fused SDPA graphs express (cudnn_graph.c builds them):
 * causal masks and windows aligned bottom-right or top-left, an additive bias (with its gradient),
 * ALiBi under a causal mask, padded variable lengths, grouped-query heads, any softmax scale, and
 * the log-sum-exp, and decode (one query per sequence) over a paged KV cache (cuDNN's paged cache
 * load, 9.5+: docs/DECODE.md). Everything else is UNSUPPORTED with the reason, so the plan falls
 * back: dropout (cuDNN's generator cannot reproduce SPEC.md's Philox bits), sinks, soft cap, u8
 * masks, segment ids, packed varlen, f32 and f64, and a paged call that appends k_new/v_new or has
 * more than one query.
 *
 * Two configurations of the backward pass: "atomic" (the default, what cuDNN runs unless asked
 * otherwise, whose dq varies in its last bits from run to run) and "deterministic"
 * (cudnn-frontend's set_deterministic_algorithm(true)); the section "configurations" says how each
 * is built, and config_deterministic declares only the second to a deterministic policy.
 *
 * Graph building is slow (heuristics, sometimes run-time compilation: 85-90 ms a graph on an H200),
 * so a plan takes its graphs in plan_init for the dense layout and one more per strided layout it
 * meets, from the process-wide cache of cudnn_cache.c: the second plan of a shape builds nothing.
 * cuDNN's version and the GPU's compute capability are checked at run time: a library or a GPU
 * too old is UNSUPPORTED, never a crash.
 *
 * Devices and streams: the problem's device_index is made current for each call and restored
 * after; work is queued on the plan's stream and nothing here synchronises.
 */
#include "core/ctx.h"
#include "core/dtype.h"
#include "core/tensors.h"
#include "impl/cudnn/cudnn_graph.h"
#include "impl/impl.h"
#include "module/gpu_runtime.h"
#include "module/module.h"

#include <cuda_runtime_api.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Oldest cuDNN whose fused SDPA graphs this file builds. */
#define ATTN_CUDNN_MIN_VERSION 90000
/* Graphs a plan keeps for strided layouts besides the dense one. */
#define ATTN_CUDNN_LAYOUTS 4
/* Alignment of the pieces the implementation places in the workspace. */
#define ATTN_CUDNN_ALIGN 256

/* ---- errors: one macro for every CUDA runtime call ---------------------------------------------- */

static int cuda_check(cg_err *err, cudaError_t e, const char *expr, const char *file, int line) {
  if (e == cudaSuccess) return 0;
  if (err->status == ATTN_STATUS_OK) {
    err->status = e == cudaErrorMemoryAllocation ? ATTN_STATUS_OUT_OF_MEMORY
                  : (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
                      ? ATTN_STATUS_UNSUPPORTED
                      : ATTN_STATUS_DEVICE_ERROR;
    attn_format(err->why, err->why_size, "%s failed: %s (%s:%d)", expr, cudaGetErrorString(e), file,
                line);
  }
  return 1;
}

#define ATTN_CUDA_CHECK(err, expr)                                                                 \
  ((err)->status != ATTN_STATUS_OK ? 1 : cuda_check((err), (expr), #expr, __FILE__, __LINE__))

/* ---- what cuDNN can run -------------------------------------------------------------------------- */

/* The window after folding causal in, and whether the alignment can be taken as top-left (it is
 * the same mask when Tq == Tk without varlen; a paged cache has a length per sequence, like
 * varlen). */
static int effective_top_left(const attn_problem *p) {
  if (p->align == ATTN_ALIGN_TOP_LEFT) return 1;
  return p->varlen == ATTN_VARLEN_NONE && p->page_size == 0 && p->seqlen_q == p->seqlen_k;
}

static int has_band(const attn_problem *p) { return p->window_left >= 0 || p->window_right >= 0; }

/* Whether some query row sees no key: Tq > Tk under a bottom-right band, or a left window bound
 * that falls past the last key. cuDNN's fused graphs take such rows only with a padding mask, and
 * then write them as SPEC.md wants (out 0, lse -inf, zero gradients: checked by test_cudnn), so
 * the problem runs with a padding mask at the full lengths. */
static int rows_without_keys(const attn_problem *p) {
  if (p->varlen != ATTN_VARLEN_NONE || p->page_size > 0 || p->seqlen_q <= p->seqlen_k) return 0;
  return (has_band(p) && !effective_top_left(p)) || p->window_left >= 0;
}

/* Compute capability of the problem's GPU as 10 * major + minor, or 0 with why filled. */
static int device_sm(int32_t index, char *why, size_t why_size) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    attn_format(why, why_size, "no CUDA device is usable (%s)",
                e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    return 0;
  }
  if (index >= count) {
    attn_format(why, why_size, "device_index=%d but only %d CUDA devices are present", (int)index,
                count);
    return 0;
  }
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index) != cudaSuccess) {
    attn_format(why, why_size, "cannot read the compute capability of device %d", (int)index);
    return 0;
  }
  return major * 10 + minor;
}

#define NO(...)                                                                                    \
  do {                                                                                             \
    attn_format(why, why_size, __VA_ARGS__);                                                       \
    return ATTN_STATUS_UNSUPPORTED;                                                                \
  } while (0)

/* The rules of cuDNN's fp8 (e4m3) forward graph, on top of the others: cudnn-frontend's support
 * checks of its fp8 SDPA node (validate_sdpa_support_surface, for FP8_E4M3; before v1.14 the node
 * sdpa_fp8.h) and what docs/FP8.md asks. sm 0: the GPU is not known yet (only its rules wait). */
static attn_status fp8_supported(const attn_problem *p, int version, int sm, char *why,
                                 size_t why_size) {
  attn_dtype out = attn_out_dtype(p);
  if (p->descale == ATTN_DESCALE_PER_BATCH_KV_HEAD)
    NO("descale=bhkv: cuDNN's fp8 attention takes one descale factor per tensor (descale=tensor), "
       "not one per (batch, KV head)");
  if (out != ATTN_DTYPE_BF16 && out != ATTN_DTYPE_F16)
    NO("out_dtype=%s: cuDNN's fp8 attention writes out in bf16 or f16 (or e4m3, which docs/FP8.md "
       "does not take)",
       attn_dtype_name(out));
  if (p->has_bias) NO("has_bias=1: cuDNN's fp8 attention takes no bias");
  if (p->alibi) NO("alibi: cuDNN's fp8 attention takes no ALiBi");
  if (p->window_left >= 0 || p->window_right > 0)
    NO("window_left=%lld, window_right=%lld: cuDNN's fp8 attention masks causally only (no "
       "sliding window)",
       (long long)p->window_left, (long long)p->window_right);
  if (p->page_size > 0)
    NO("page_size=%lld: cuDNN's fp8 attention does not read a paged KV cache here",
       (long long)p->page_size);
  if (p->head_dim % 16 != 0 || p->head_dim_v % 16 != 0)
    NO("head_dim=%lld, head_dim_v=%lld: cuDNN's fp8 attention needs multiples of 16",
       (long long)p->head_dim, (long long)p->head_dim_v);
  if (CUDNN_VERSION < 90100)
    NO("dtype=f8e4m3: this library was built against cuDNN %d's headers; fp8 attention needs 9.1 "
       "or newer",
       CUDNN_VERSION);
  if (version < 90100)
    NO("cuDNN %d has no fp8 attention (dtype=f8e4m3): it needs cuDNN 9.1 or newer", version);
  if (sm == 0) return ATTN_STATUS_OK;
  if (sm < 90) NO("sm%d: cuDNN's fp8 attention needs Hopper (sm90) or newer", sm);
  /* cudnn-frontend refuses a bf16 or f16 out elsewhere; cuDNN's Hopper fp8 kernels write out in
   * e4m3 only, whose 3 mantissa bits (up to 6% an element) break docs/FP8.md's bound. */
  if (sm < 100 || version < 91300)
    NO("out_dtype=%s on sm%d with cuDNN %d: cuDNN's fp8 attention writes a bf16 or f16 out only on "
       "Blackwell (sm100 or newer) with cuDNN 9.13 or newer; elsewhere its out is e4m3, too coarse "
       "for docs/FP8.md's bound",
       attn_dtype_name(out), sm, version);
  int d192 = p->head_dim == 192 && p->head_dim_v == 128 && version >= 91900;
  if ((p->head_dim > 128 && !d192) || p->head_dim_v > 128)
    NO("head_dim=%lld, head_dim_v=%lld: cuDNN's fp8 attention on sm%d takes head dims up to 128 "
       "(and 192 with 128 from cuDNN 9.19)",
       (long long)p->head_dim, (long long)p->head_dim_v, sm);
  if (p->window_right == 0 && !effective_top_left(p) && version < 90700)
    NO("cuDNN %d's fp8 attention has no bottom-right causal mask (9.7 or newer)", version);
  return ATTN_STATUS_OK;
}

/* The problem-level rules (no GPU or library needed). sm 0: the GPU is not known yet, so only the
 * rules of every GPU apply. */
static attn_status problem_supported(const attn_problem *p, int version, int sm, char *why,
                                     size_t why_size) {
  if (p->dtype == ATTN_DTYPE_F8E4M3) {
    attn_status s = fp8_supported(p, version, sm, why, why_size);
    if (s != ATTN_STATUS_OK) return s;
  } else if (p->dtype != ATTN_DTYPE_BF16 && p->dtype != ATTN_DTYPE_F16) {
    NO("dtype=%s: cuDNN's fused attention takes bf16, f16 or f8e4m3 inputs",
       attn_dtype_name((attn_dtype)p->dtype));
  }
  if (p->dropout_p > 0.0)
    NO("dropout_p=%g: cuDNN's random generator cannot reproduce the Philox dropout of SPEC.md",
       p->dropout_p);
  if (p->num_sinks > 0) NO("num_sinks=%lld: sinks are not supported", (long long)p->num_sinks);
  if (p->softcap > 0.0) NO("softcap=%g: the soft cap is not supported", p->softcap);
  if (p->has_mask) NO("has_mask=1: u8 masks are not supported (pass an additive bias instead)");
  if (p->has_segment_ids) NO("has_segment_ids=1: segment ids are not supported");
  if (p->varlen == ATTN_VARLEN_PACKED)
    NO("varlen=packed: packed sequences are not supported (use varlen=padded)");
  if (p->alibi == ATTN_ALIBI_PER_BATCH_HEAD)
    NO("alibi=per_batch_head: only per-head ALiBi slopes [Hq] are supported");
  if (p->seqlen_k == 0 && p->seqlen_q > 0) NO("seqlen_k=0: rows without any key are not supported");
  if (p->seqlen_q == 1 && p->seqlen_k == 1) NO("seqlen_q=1 and seqlen_k=1 is not supported");
  if (p->head_dim % 8 != 0 || p->head_dim_v % 8 != 0)
    NO("head_dim=%lld, head_dim_v=%lld: both must be multiples of 8", (long long)p->head_dim,
       (long long)p->head_dim_v);
  /* fp8's bound on a known GPU is fp8_supported's (192 with Dv = 128 on Blackwell) */
  int64_t max_d = sm == 0 || (sm >= 90 && sm < 100) || p->dtype == ATTN_DTYPE_F8E4M3 ? 256 : 128;
  if ((p->head_dim > max_d || p->head_dim_v > max_d) && sm == 0)
    NO("head_dim=%lld, head_dim_v=%lld: at most %lld", (long long)p->head_dim,
       (long long)p->head_dim_v, (long long)max_d);
  if (p->head_dim > max_d || p->head_dim_v > max_d)
    NO("head_dim=%lld, head_dim_v=%lld: at most %lld on sm%d", (long long)p->head_dim,
       (long long)p->head_dim_v, (long long)max_d, sm);
  if (p->seqlen_q > INT32_MAX || p->seqlen_k > INT32_MAX)
    NO("sequence lengths beyond 2^31 are not supported");

  int top_left = effective_top_left(p);
  if (has_band(p) && !top_left && (p->has_bias || p->alibi))
    NO("a causal mask or window aligned bottom-right (where that is not top-left: seqlen_q != "
       "seqlen_k, varlen or a paged cache) does not combine with a bias or ALiBi in cuDNN");
  if (p->alibi) {
    if (p->window_right != 0 || p->window_left >= 0 || !top_left)
      NO("alibi: cuDNN adds ALiBi only under a plain causal mask aligned top-left (or Tq == Tk)");
  }
  if (p->has_bias) {
    if (p->bias_dtype != p->dtype)
      NO("bias_dtype=%s: the bias must have the inputs' dtype (%s)",
         attn_dtype_name((attn_dtype)p->bias_dtype), attn_dtype_name((attn_dtype)p->dtype));
    if (p->bias_shape[1] != 1 && p->bias_shape[1] != p->heads_q)
      NO("bias_shape[1]=%lld: a bias per KV head is not supported (use Hq or 1)",
         (long long)p->bias_shape[1]);
    if (p->bias_shape[2] != p->seqlen_q || p->bias_shape[3] != p->seqlen_k)
      NO("bias_shape=[%lld, %lld, %lld, %lld]: the bias must span [.., .., Tq, Tk]",
         (long long)p->bias_shape[0], (long long)p->bias_shape[1], (long long)p->bias_shape[2],
         (long long)p->bias_shape[3]);
  }

  if (p->page_size > 0) {
    /* A paged problem is padded varlen whose keys come through the block table (DECODE.md), so
     * the rules above, with top-left taken only from align, are its rules too; these are the
     * paged cache load's own. */
    if (p->seqlen_new > 0)
      NO("seqlen_new=%lld: cuDNN's paged attention reads the cache but does not append k_new and "
         "v_new to it (append before the call, or use an implementation that appends)",
         (long long)p->seqlen_new);
    /* Measured by tests/test_paged.c (cuDNN 9.19, H100): with one query per sequence every case
     * is right, NaN in the unused rows of a sequence's last page included; with more, cuDNN runs
     * other kernels, which multiply those rows by their zero probabilities (NaN there made the
     * whole output NaN) and leave the rows of a sequence without keys unwritten. */
    if (p->seqlen_q > 1)
      NO("seqlen_q=%lld with a paged cache: cuDNN's paged attention is taken for decode only "
         "(seqlen_q=1); with more queries its kernels let the unused rows of a sequence's last "
         "page reach the output and write nothing for a sequence without keys",
         (long long)p->seqlen_q);
    if ((p->page_size & (p->page_size - 1)) != 0)
      NO("page_size=%lld: cuDNN's paged cache load takes page sizes that are powers of two",
         (long long)p->page_size);
    if (CUDNN_VERSION < 90500)
      NO("page_size=%lld: this library was built against cuDNN %d's headers, which have no paged "
         "cache load (cuDNN 9.5 or newer)",
         (long long)p->page_size, CUDNN_VERSION);
    if (version < 90500)
      NO("cuDNN %d has no paged attention (page_size=%lld): it needs cuDNN 9.5 or newer", version,
         (long long)p->page_size);
    if (version < 91000 && (p->head_dim > 128 || p->head_dim_v > 128))
      NO("head_dim=%lld, head_dim_v=%lld: cuDNN %d's paged attention takes head dims up to 128 "
         "(9.10 or newer: up to the dense limit)",
         (long long)p->head_dim, (long long)p->head_dim_v, version);
  }
  if (version < ATTN_CUDNN_MIN_VERSION)
    NO("cuDNN %d is too old: the fused attention graphs need %d or newer", version,
       ATTN_CUDNN_MIN_VERSION);
  if (version == 91000 || version == 91001)
    NO("cuDNN %d has known fused-attention bugs: use 9.10.2 or newer", version);
  if (version < 90600 && has_band(p) && !top_left &&
      (p->seqlen_q % 64 != 0 || p->seqlen_k % 64 != 0))
    NO("cuDNN %d needs sequence lengths that are multiples of 64 for bottom-right masks", version);
  if (version < 91002 && p->window_left >= 0 && (p->window_right != 0 || p->has_bias))
    NO("cuDNN %d supports a window's left bound only with a causal right bound and no bias",
       version);
  if (version == 91400 && p->window_left >= 0 && p->window_right != 0 && p->seqlen_k > 1024)
    NO("cuDNN 9.14.0 has a known bug with non-causal sliding windows over more than 1024 keys");
  return ATTN_STATUS_OK;
}

static attn_status cudnn_supports(const attn_problem *p, char *why, size_t why_size) {
  /* The cheap problem rules first, so a CPU-style problem never wakes the GPU. */
  attn_status s = problem_supported(p, 99999, 0, why, why_size);
  if (s != ATTN_STATUS_OK) return s;
  int sm = device_sm(p->device_index, why, why_size);
  if (sm == 0) return ATTN_STATUS_UNSUPPORTED;
  if (sm < 80) NO("sm%d: cuDNN's fused attention needs compute capability 8.0 or newer", sm);
  return problem_supported(p, (int)cudnnGetVersion(), sm, why, why_size);
}

/* ---- configurations ------------------------------------------------------------------------------ */

/* The backward pass's schedule (the forward graph is the same in both):
 * 0 "atomic", the default: the graph cuDNN runs unless asked otherwise. dQ is added into an f32
 *   accumulator in the workspace by the CTAs of every key block (cg_dq_accumulated; it is why the
 *   accumulator had to be zeroed before cuDNN 9.6), so the order of the additions, and the last
 *   bits of dq, vary from run to run. cuDNN's SDPA backward is deterministic only on request:
 *   cudnn-frontend 1.5 added the request (release notes: "SDPA bprop attributes can choose
 *   deterministic algorithm"), its Python binding says "Whether to always use deterministic
 *   algorithm. Default is False." (python/pygraph/sdpa.cpp), and llm.c measured differing bits
 *   without it on cuDNN 9.2 (github.com/karpathy/llm.c/pull/652).
 * 1 "deterministic": what cudnn-frontend's set_deterministic_algorithm(true) (of
 *   SDPA_backward_attributes) is lowered to, in
 *   include/cudnn_frontend/node/scaled_dot_product_flash_attention.h. The backend has no attribute,
 *   knob or behaviour note for it; instead (a) on every GPU the graph writes dQ by its own product
 *   over a dS kept in the workspace (use_dp_workspace, the graph dbias needs too; cudnn-frontend
 *   estimates it at B * Hq * Tq * Tk * 2 bytes), and (b) on Blackwell (sm10x), from cuDNN 9.18,
 *   the heuristics are skipped for an engine and knobs named by index
 *   (override_heuristics_query; cudnn_graph.c: pinned_engine). Where cuDNN has no such engine,
 *   plan_init refuses it.
 * A paged problem and an fp8 one have no backward pass, so they have one configuration, "paged"
 * or "fp8" (number 0: its forward graph is the one both others share), and the executor times no
 * duplicate. */
enum { CUDNN_CONFIG_ATOMIC = 0, CUDNN_CONFIG_DETERMINISTIC = 1 };

static int forward_only(const attn_problem *p) {
  return p->page_size > 0 || p->dtype == ATTN_DTYPE_F8E4M3;
}

static int32_t cudnn_num_configs(const attn_problem *p) { return forward_only(p) ? 1 : 2; }

static void cudnn_config_name(const attn_problem *p, int32_t config, char *buf, size_t size) {
  attn_format(buf, size, "%s",
              p->page_size > 0                       ? "paged"
              : p->dtype == ATTN_DTYPE_F8E4M3        ? "fp8"
              : config == CUDNN_CONFIG_DETERMINISTIC ? "deterministic"
                                                     : "atomic");
}

static int32_t cudnn_default_config(const attn_problem *p) {
  (void)p;
  return CUDNN_CONFIG_ATOMIC;
}

/* Nonzero, with the reason in why, where cuDNN has no deterministic backward for p. These are
 * cudnn-frontend's rules (CompositeSDPABackwardNode::pre_validate_node): on Blackwell (sm10x) only
 * from cuDNN 9.18 and only without dbias, dropout or ALiBi; a bias is refused there since the
 * problem does not say whether dbias will be asked for. */
static int deterministic_refused(const attn_problem *p, int version, int sm, char *why,
                                 size_t why_size) {
  if (sm / 10 != 10) return 0;
  if (version < 91800) {
    attn_format(why, why_size,
                "config deterministic: cuDNN %d has no deterministic attention backward on sm%d "
                "(Blackwell): it needs cuDNN 9.18 or newer",
                version, sm);
    return 1;
  }
  if (p->has_bias || p->alibi) {
    attn_format(why, why_size,
                "config deterministic: cuDNN's deterministic attention backward on sm%d "
                "(Blackwell) takes no %s",
                sm, p->has_bias ? "bias (dbias)" : "ALiBi");
    return 1;
  }
  return 0;
}

/* Whether a configuration repeats its bits: "atomic" never; "deterministic" where cuDNN has it
 * (plan_init refuses it elsewhere), except when dbias is summed over broadcast dimensions of the
 * bias, an order cuDNN does not document (the problem does not say whether dbias will be asked for,
 * so this answers for the worst, as the cuda implementation does). */
static int cudnn_config_deterministic(const attn_problem *p, int32_t config) {
  if (config != CUDNN_CONFIG_DETERMINISTIC) return 0;
  if (p->has_bias && (p->bias_shape[0] != p->batch || p->bias_shape[1] != p->heads_q)) return 0;
  char why[ATTN_MESSAGE_SIZE];
  int sm = device_sm(p->device_index, why, sizeof why);
  return sm != 0 && !deterministic_refused(p, (int)cudnnGetVersion(), sm, why, sizeof why);
}

static size_t align_up(size_t n) {
  return (n + ATTN_CUDNN_ALIGN - 1) & ~(size_t)(ATTN_CUDNN_ALIGN - 1);
}

/* The implementation's own pieces of the workspace, after cuDNN's. */
static size_t stats_bytes(const attn_problem *p) {
  return align_up((size_t)(p->batch * p->heads_q * p->seqlen_q) * sizeof(float));
}
/* The f32 dQ accumulator: only the atomic configuration's backward graph has one. */
static size_t dq_accum_bytes(const attn_problem *p, int32_t config) {
  if (config == CUDNN_CONFIG_DETERMINISTIC) return 0;
  return align_up((size_t)(p->batch * p->heads_q * p->seqlen_q * p->head_dim) * sizeof(float));
}
static size_t seqlen_bytes(const attn_problem *p) {
  return align_up((size_t)p->batch * sizeof(int32_t));
}

/* An fp8 graph's f32 [1] tensors (CG_UID_DESCALE_Q .. CG_UID_AMAX_O), one per 16 bytes (the
 * alignment the graph declares), in this order. */
enum {
  FP8_DESCALE_Q,
  FP8_DESCALE_K,
  FP8_DESCALE_V,
  FP8_SCALE_S,
  FP8_DESCALE_S,
  FP8_SCALE_O,
  FP8_AMAX_S,
  FP8_AMAX_O,
  FP8_SLOTS
};
#define FP8_SLOT_BYTES 16
static size_t fp8_bytes(const attn_problem *p) {
  return p->dtype == ATTN_DTYPE_F8E4M3 ? align_up(FP8_SLOTS * FP8_SLOT_BYTES) : 0;
}

/* ---- plan state ---------------------------------------------------------------------------------- */

typedef struct layout_graphs {
  cg_layout layout;
  cg_shared *shared; /* the plan's reference to the cached graph */
  cg_graph *graph;
} layout_graphs;

typedef struct cudnn_state {
  attn_problem problem;
  cg_spec base;   /* the spec of the dense layout */
  int32_t config; /* CUDNN_CONFIG_* */
  int version, sm;
  /* graphs per pass: [0] forward, [1] backward, [2] backward with dbias; slot 0 is dense */
  layout_graphs graphs[3][1 + ATTN_CUDNN_LAYOUTS];
  int ngraphs[3];
  char why_not[3][ATTN_MESSAGE_SIZE]; /* why a pass could not be built, "" when it could */
  size_t plan_ws[3];                  /* cuDNN's workspace of the dense graph of each pass */
  int32_t *full_q, *full_kv;          /* host [B] of Tq and Tk for the full-padding workaround */
} cudnn_state;

/* cuDNN's [b, h, s, d] strides of a library tensor [B, T, H, D]. */
static void bhsd(const attn_tensor *t, int64_t out[4]) {
  out[0] = t->stride[0];
  out[1] = t->stride[2];
  out[2] = t->stride[1];
  out[3] = t->stride[3];
}

/* lse [B, Hq, Tq] as [b, h, s, 1]. */
static void lse_strides(const attn_tensor *t, int64_t out[4]) {
  out[0] = t->stride[0];
  out[1] = t->stride[1];
  out[2] = t->stride[2];
  out[3] = 1;
}

/* A bias stride of a size-1 dimension is meaningless; give it the value a dense tensor would have
 * so that equal layouts compare equal and cuDNN sees an ordinary tensor. */
static void bias_strides(const attn_problem *p, const attn_tensor *t, int64_t out[4]) {
  int64_t inner = 1;
  for (int d = 3; d >= 0; --d) {
    out[d] = p->bias_shape[d] == 1 ? inner : t->stride[d];
    inner = out[d] * p->bias_shape[d];
  }
}

/* The block table [B, M] as cuDNN's page table [b, 1, column, 1] (the size-1 dimensions take the
 * strides cudnn-frontend's samples give them). */
static void table_strides(const attn_tensor *t, int64_t out[4]) {
  out[0] = t->stride[0];
  out[1] = t->stride[0];
  out[2] = t->stride[1];
  out[3] = t->stride[1];
}

static attn_tensor dense(const attn_problem *p, attn_role role) {
  attn_tensor t = {NULL, {0, 0, 0, 0}};
  return attn_role_resolve(p, role, t);
}

static void dense_layout(const attn_problem *p, cg_layout *l) {
  memset(l, 0, sizeof *l);
  attn_tensor t;
  t = dense(p, ATTN_ROLE_Q), bhsd(&t, l->q), bhsd(&t, l->dq);
  t = dense(p, ATTN_ROLE_K), bhsd(&t, l->k), bhsd(&t, l->dk);
  t = dense(p, ATTN_ROLE_V), bhsd(&t, l->v), bhsd(&t, l->dv);
  t = dense(p, ATTN_ROLE_OUT), bhsd(&t, l->o), bhsd(&t, l->dout);
  t = dense(p, ATTN_ROLE_LSE), lse_strides(&t, l->lse);
  if (p->has_bias) {
    t = dense(p, ATTN_ROLE_BIAS);
    bias_strides(p, &t, l->bias);
    memcpy(l->dbias, l->bias, sizeof l->bias);
  }
  if (p->page_size > 0) t = dense(p, ATTN_ROLE_BLOCK_TABLE), table_strides(&t, l->table);
}

static void base_spec(const attn_problem *p, int version, int sm, cg_spec *s) {
  memset(s, 0, sizeof *s);
  s->dtype = p->dtype;
  s->out_dtype = attn_out_dtype(p);
  s->b = p->batch;
  s->hq = p->heads_q;
  s->hkv = p->heads_kv;
  s->tq = p->seqlen_q;
  s->tk = p->seqlen_k;
  s->d = p->head_dim;
  s->dv = p->head_dim_v;
  s->scale = (float)p->scale;
  s->has_bias = p->has_bias;
  if (p->has_bias) memcpy(s->bias_dims, p->bias_shape, sizeof s->bias_dims);
  /* a paged cache always runs with the padding mask: its lengths are cache_seqlens */
  s->padded = p->varlen == ATTN_VARLEN_PADDED || p->page_size > 0;
  s->top_left = effective_top_left(p);
  s->left = p->window_left;
  s->right = p->window_right;
  s->alibi = p->alibi == ATTN_ALIBI_PER_HEAD;
  s->alibi_stride = 1;
  if (p->page_size > 0) s->page_size = p->page_size, s->num_pages = attn_paged_num_pages(p);
  s->version = version;
  s->sm = sm;
  dense_layout(p, &s->st);
}

/* The spec of one pass. A padding mask at the full lengths is added for rows without keys, and to
 * the backward pass of cuDNN <= 9.15 over a key length that is not a multiple of 128
 * (cudnn-frontend applies the same workaround). */
static cg_spec pass_spec(const cudnn_state *st, int pass) {
  cg_spec s = st->base;
  s.backward = pass > 0;
  s.with_dbias = pass == 2;
  if (!s.padded &&
      (rows_without_keys(&st->problem) || (s.backward && s.version <= 91500 && s.tk % 128 != 0))) {
    s.padded = 1;
    s.full_padding = 1;
  }
  return s;
}

/* Makes the problem's device current, remembering the previous one. */
static int enter_device(const attn_problem *p, int *previous, cg_err *err) {
  *previous = -1;
  if (ATTN_CUDA_CHECK(err, cudaGetDevice(previous))) return 1;
  if (*previous != p->device_index && ATTN_CUDA_CHECK(err, cudaSetDevice(p->device_index)))
    return 1;
  return 0;
}

static void leave_device(const attn_problem *p, int previous) {
  if (previous >= 0 && previous != p->device_index) cudaSetDevice(previous);
}

static void free_state(cudnn_state *st) {
  if (st == NULL) return;
  for (int pass = 0; pass < 3; ++pass)
    for (int i = 0; i < st->ngraphs[pass]; ++i) attn_cudnn_graph_put(st->graphs[pass][i].shared);
  free(st->full_q);
  free(st->full_kv);
  free(st);
}

static size_t forward_workspace(const attn_problem *p, size_t plan_ws) {
  return align_up(plan_ws) + stats_bytes(p) + 2 * seqlen_bytes(p) + fp8_bytes(p);
}

static size_t backward_workspace(const attn_problem *p, int32_t config, size_t plan_ws) {
  return align_up(plan_ws) + stats_bytes(p) + dq_accum_bytes(p, config) + 2 * seqlen_bytes(p);
}

static attn_status cudnn_plan_init(const attn_problem *p, int32_t config, void **state, char *why,
                                   size_t why_size) {
  *state = NULL;
  cudnn_state *st = calloc(1, sizeof *st);
  if (st == NULL) NO("out of memory");
  st->problem = *p;
  st->config = config;
  cg_err err = {ATTN_STATUS_OK, why, why_size};
  int previous;
  if (enter_device(p, &previous, &err)) {
    free_state(st);
    return err.status;
  }
  st->version = (int)cudnnGetVersion();
  st->sm = device_sm(p->device_index, why, why_size);
  if (config == CUDNN_CONFIG_DETERMINISTIC &&
      deterministic_refused(p, st->version, st->sm, why, why_size)) {
    leave_device(p, previous);
    free_state(st);
    return ATTN_STATUS_UNSUPPORTED;
  }
  base_spec(p, st->version, st->sm, &st->base);
  st->base.deterministic = config == CUDNN_CONFIG_DETERMINISTIC;
  st->full_q = malloc((size_t)p->batch * sizeof(int32_t));
  st->full_kv = malloc((size_t)p->batch * sizeof(int32_t));
  if (err.status == ATTN_STATUS_OK && (st->full_q == NULL || st->full_kv == NULL)) {
    err.status = ATTN_STATUS_OUT_OF_MEMORY;
    attn_format(why, why_size, "out of memory");
  }
  if (err.status == ATTN_STATUS_OK) {
    for (int64_t b = 0; b < p->batch; ++b) {
      st->full_q[b] = (int32_t)p->seqlen_q;
      st->full_kv[b] = (int32_t)p->seqlen_k;
    }
  }
  /* The forward graph must build; a backward graph that does not is reported when it is asked
   * for, so that forward-only users keep the plan. */
  /* An empty problem (Tq = 0) runs no graph: cuDNN cannot build one without rows. A paged cache
   * and fp8 have only the forward pass. */
  int passes = p->seqlen_q == 0 ? 0 : forward_only(p) ? 1 : p->has_bias ? 3 : 2;
  for (int pass = 0; pass < passes && err.status == ATTN_STATUS_OK; ++pass) {
    cg_spec spec = pass_spec(st, pass);
    char pass_why[ATTN_MESSAGE_SIZE] = "";
    cg_err perr = {ATTN_STATUS_OK, pass_why, sizeof pass_why};
    cg_shared *shared = attn_cudnn_graph_get(p->device_index, &spec, &perr);
    if (shared == NULL) {
      if (pass == 0) {
        err.status = perr.status;
        attn_format(why, why_size, "%s", pass_why);
      } else {
        attn_format(st->why_not[pass], sizeof st->why_not[pass], "%s", pass_why);
      }
      continue;
    }
    cg_graph *g = attn_cudnn_shared_graph(shared);
    st->graphs[pass][0].layout = spec.st;
    st->graphs[pass][0].shared = shared;
    st->graphs[pass][0].graph = g;
    st->ngraphs[pass] = 1;
    st->plan_ws[pass] = attn_cudnn_graph_workspace(g);
  }
  leave_device(p, previous);
  if (err.status != ATTN_STATUS_OK) {
    free_state(st);
    return err.status;
  }
  *state = st;
  return ATTN_STATUS_OK;
}

static void cudnn_plan_fini(void *state) {
  cudnn_state *st = state;
  if (st == NULL) return;
  int device = st->problem.device_index, previous = -1;
  cudaGetDevice(&previous);
  if (previous != device) cudaSetDevice(device);
  free_state(st);
  if (previous >= 0 && previous != device) cudaSetDevice(previous);
}

/* cuDNN's own workspace for the dense graphs plan_init built, then the implementation's pieces. */
static size_t cudnn_workspace_size(const attn_problem *p, int32_t config, const void *state,
                                   int backward) {
  const cudnn_state *st = state;
  if (!backward) return forward_workspace(p, st->plan_ws[0]);
  if (forward_only(p)) return 0; /* a paged cache and fp8 have no backward pass */
  return backward_workspace(p, config,
                            st->plan_ws[1] > st->plan_ws[2] ? st->plan_ws[1] : st->plan_ws[2]);
}

/* ---- running ------------------------------------------------------------------------------------- */

/* The graph of a pass for the run's layout: the dense one, one the plan used before, or one from
 * the cache (built now when no plan had it). */
static cg_graph *graph_for(cudnn_state *st, int pass, const cg_layout *layout,
                           size_t workspace_size, cg_err *err) {
  if (st->why_not[pass][0] != '\0') {
    err->status = ATTN_STATUS_UNSUPPORTED;
    attn_format(err->why, err->why_size, "%s", st->why_not[pass]);
    return NULL;
  }
  for (int i = 0; i < st->ngraphs[pass]; ++i)
    if (memcmp(&st->graphs[pass][i].layout, layout, sizeof *layout) == 0)
      return st->graphs[pass][i].graph;
  cg_spec spec = pass_spec(st, pass);
  spec.st = *layout;
  cg_shared *shared = attn_cudnn_graph_get(st->problem.device_index, &spec, err);
  if (shared == NULL) return NULL;
  cg_graph *g = attn_cudnn_shared_graph(shared);
  size_t own = pass == 0 ? forward_workspace(&st->problem, 0)
                         : backward_workspace(&st->problem, st->config, 0);
  if (align_up(attn_cudnn_graph_workspace(g)) + own > workspace_size) {
    err->status = ATTN_STATUS_UNSUPPORTED;
    attn_format(err->why, err->why_size,
                "this strided layout needs %zu bytes of workspace, more than the %zu reported for "
                "the dense layout",
                align_up(attn_cudnn_graph_workspace(g)) + own, workspace_size);
    attn_cudnn_graph_put(shared);
    return NULL;
  }
  int n = st->ngraphs[pass];
  if (n == 1 + ATTN_CUDNN_LAYOUTS) { /* replace the oldest strided graph */
    attn_cudnn_graph_put(st->graphs[pass][1].shared);
    memmove(&st->graphs[pass][1], &st->graphs[pass][2],
            (size_t)(ATTN_CUDNN_LAYOUTS - 1) * sizeof st->graphs[pass][0]);
    n--;
  }
  st->graphs[pass][n].layout = *layout;
  st->graphs[pass][n].shared = shared;
  st->graphs[pass][n].graph = g;
  st->ngraphs[pass] = n + 1;
  return g;
}

/* What check_tensor asks of a tensor. */
enum {
  LAST_CONTIGUOUS = 1, /* stride of the last dimension is 1 */
  STRIDES_16B = 2,     /* every other stride is a non-negative multiple of 16 bytes */
};

/* The fused kernels read 16-byte vectors of Q, K, V, O and their gradients: the last dimension
 * must be contiguous and every other stride and every pointer a multiple of 16 bytes. The bias,
 * lse and the small vectors need an aligned pointer only (cuDNN judges their strides itself when
 * it builds the graph). */
static int check_tensor(const char *name, const attn_tensor *t, int ndim, size_t es, int rules,
                        cg_err *err) {
  if (t->data == NULL) return 0;
  if (((uintptr_t)t->data & 15) != 0) {
    err->status = ATTN_STATUS_UNSUPPORTED;
    attn_format(err->why, err->why_size, "%s.data is not 16-byte aligned", name);
    return 1;
  }
  for (int d = 0; d < ndim; ++d) {
    int64_t s = t->stride[d];
    int last = d == ndim - 1;
    if (last && (rules & LAST_CONTIGUOUS) && s != 1) {
      err->status = ATTN_STATUS_UNSUPPORTED;
      attn_format(err->why, err->why_size,
                  "%s.stride[%d]=%lld: the last dimension must be contiguous", name, d,
                  (long long)s);
      return 1;
    }
    if (!last && (rules & STRIDES_16B) && ((s * (int64_t)es) % 16 != 0 || s < 0)) {
      err->status = ATTN_STATUS_UNSUPPORTED;
      attn_format(err->why, err->why_size,
                  "%s.stride[%d]=%lld: strides must be non-negative multiples of 16 bytes", name, d,
                  (long long)s);
      return 1;
    }
  }
  return 0;
}

#define QKV_RULES (LAST_CONTIGUOUS | STRIDES_16B)

/* Writes zeros over a [B, T, H, D] tensor whose last dimension is contiguous. */
static void zero_bthd(const attn_tensor *t, const int64_t shape[4], size_t es, cudaStream_t stream,
                      cg_err *err) {
  int64_t n = shape[0] * shape[1] * shape[2] * shape[3];
  if (n == 0) return;
  /* One memset when the tensor fills a contiguous range (any dense order of its dimensions). */
  int64_t span = 1;
  for (int d = 0; d < 4; ++d) span += (shape[d] - 1) * t->stride[d];
  if (span == n) {
    ATTN_CUDA_CHECK(err, cudaMemsetAsync(t->data, 0, (size_t)n * es, stream));
    return;
  }
  for (int64_t b = 0; b < shape[0]; ++b)
    for (int64_t h = 0; h < shape[2]; ++h) {
      char *base = (char *)t->data + (size_t)(b * t->stride[0] + h * t->stride[2]) * es;
      ATTN_CUDA_CHECK(err, cudaMemset2DAsync(base, (size_t)t->stride[1] * es, 0,
                                             (size_t)shape[3] * es, (size_t)shape[1], stream));
    }
}

/* cuMemsetD2D32Async (32-bit words over a 2-D range, queued on a stream), reached through the
 * runtime so that the library does not link the driver; NULL with err filled where the driver has
 * none. */
typedef int (*memset_d2d32_fn)(unsigned long long dst, size_t pitch, unsigned int value,
                               size_t width, size_t height, cudaStream_t stream);

static memset_d2d32_fn driver_memset_d2d32(cg_err *err) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult found;
  if (ATTN_CUDA_CHECK(err, cudaGetDriverEntryPointByVersion("cuMemsetD2D32Async", &fn, 12000,
                                                            cudaEnableDefault, &found)))
    return NULL;
  if (fn == NULL || found != cudaDriverEntryPointSuccess) {
    err->status = ATTN_STATUS_UNSUPPORTED;
    attn_format(err->why, err->why_size, "the CUDA driver has no cuMemsetD2D32Async");
    return NULL;
  }
  memset_d2d32_fn memset_d2d32;
  memcpy(&memset_d2d32, &fn, sizeof memset_d2d32); /* ISO C has no object-to-function cast */
  return memset_d2d32;
}

static void memset_failed(cg_err *err, int r, int line) {
  err->status = ATTN_STATUS_DEVICE_ERROR;
  attn_format(err->why, err->why_size, "cuMemsetD2D32Async failed with CUresult %d (%s:%d)", r,
              __FILE__, line);
}

/* Writes -inf over lse [B, Hq, Tq]. */
static void fill_lse_neg_inf(const attn_problem *p, const attn_tensor *t, cudaStream_t stream,
                             cg_err *err) {
  memset_d2d32_fn memset_d2d32 = driver_memset_d2d32(err);
  if (memset_d2d32 == NULL) return;
  const unsigned int neg_inf = 0xff800000u;
  /* rows of Tq floats at stride[2] = 1, one 2-D fill per batch over heads */
  for (int64_t b = 0; b < p->batch; ++b) {
    unsigned long long base = (unsigned long long)(uintptr_t)((float *)t->data + b * t->stride[0]);
    int r;
    if (t->stride[2] == 1)
      r = memset_d2d32(base, (size_t)t->stride[1] * sizeof(float), neg_inf, (size_t)p->seqlen_q,
                       (size_t)p->heads_q, stream);
    else
      r = 0;
    for (int64_t h = 0; r == 0 && t->stride[2] != 1 && h < p->heads_q; ++h)
      r = memset_d2d32(base + (unsigned long long)(h * t->stride[1]) * sizeof(float),
                       (size_t)t->stride[2] * sizeof(float), neg_inf, 1, (size_t)p->seqlen_q,
                       stream);
    if (r != 0) {
      memset_failed(err, r, __LINE__);
      return;
    }
  }
}

/* Writes n copies of the 32-bit value at dst: a memset, not a copy from the host, so a call stays
 * capturable in a CUDA graph and waits for nothing. */
static void fill_i32(void *dst, int32_t value, int64_t n, cudaStream_t stream, cg_err *err) {
  memset_d2d32_fn memset_d2d32 = driver_memset_d2d32(err);
  if (memset_d2d32 == NULL || n == 0) return;
  unsigned int bits;
  memcpy(&bits, &value, sizeof bits);
  int r = memset_d2d32((unsigned long long)(uintptr_t)dst, (size_t)n * sizeof(int32_t), bits,
                       (size_t)n, 1, stream);
  if (r != 0) memset_failed(err, r, __LINE__);
}

/* Shared by both passes: the bound pointers and the part of the workspace after cuDNN's. */
static void bind_common(const attn_run *run, const cg_graph *g, void *ptrs[], char **own) {
  const attn_inputs *in = run->inputs;
  ptrs[CG_UID_Q] = in->q.data;
  ptrs[CG_UID_K] = in->k.data;
  ptrs[CG_UID_V] = in->v.data;
  ptrs[CG_UID_BIAS] = in->bias.data;
  ptrs[CG_UID_ALIBI] = in->alibi_slopes.data;
  ptrs[CG_UID_SEQ_Q] = (void *)in->seqlens_q;
  ptrs[CG_UID_SEQ_KV] = (void *)in->seqlens_k;
  *own = (char *)run->workspace + align_up(attn_cudnn_graph_workspace(g));
}

/* Binds the full-length seq_len tensors of a graph with spec->full_padding: [B] copies of Tq and Tk
 * placed at seq in the workspace. Pageable copies are staged before cudaMemcpyAsync returns, so the
 * host arrays of the state may be reused at once. */
static void bind_full_lengths(const cudnn_state *st, char *seq, void *ptrs[], cudaStream_t stream,
                              cg_err *err) {
  const attn_problem *p = &st->problem;
  ATTN_CUDA_CHECK(err, cudaMemcpyAsync(seq, st->full_q, (size_t)p->batch * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, stream));
  ATTN_CUDA_CHECK(err, cudaMemcpyAsync(seq + seqlen_bytes(p), st->full_kv,
                                       (size_t)p->batch * sizeof(int32_t), cudaMemcpyHostToDevice,
                                       stream));
  ptrs[CG_UID_SEQ_Q] = seq;
  ptrs[CG_UID_SEQ_KV] = seq + seqlen_bytes(p);
}

static void fill_f32(void *dst, float value, cudaStream_t stream, cg_err *err) {
  int32_t bits;
  memcpy(&bits, &value, sizeof bits);
  fill_i32(dst, bits, 1, stream, err);
}

_Static_assert(CG_UID_AMAX_O - CG_UID_DESCALE_Q == FP8_AMAX_O && FP8_AMAX_O + 1 == FP8_SLOTS,
               "the fp8 slots follow the order of their uids");

/* Fills an fp8 graph's factors in the workspace at slots and binds them and the amax outputs:
 * descale_q, _k, _v copied from the caller's [1] tensors (descale=tensor) or 1 (none), P's scale
 * and its inverse, and scale_o = 1. Device copies and memsets only, so the call waits for nothing
 * and stays capturable in a CUDA graph. */
static void bind_fp8(const attn_run *run, char *slots, void *ptrs[], cudaStream_t stream,
                     cg_err *err) {
  const attn_inputs *in = run->inputs;
  const attn_tensor *given[3] = {&in->q_descale, &in->k_descale, &in->v_descale};
  for (int t = 0; t < 3; ++t) {
    char *dst = slots + (FP8_DESCALE_Q + t) * FP8_SLOT_BYTES;
    if (run->problem->descale == ATTN_DESCALE_TENSOR)
      ATTN_CUDA_CHECK(err, cudaMemcpyAsync(dst, given[t]->data, sizeof(float),
                                           cudaMemcpyDeviceToDevice, stream));
    else
      fill_f32(dst, 1.0f, stream, err);
  }
  fill_f32(slots + FP8_SCALE_S * FP8_SLOT_BYTES, CG_FP8_P_SCALE, stream, err);
  fill_f32(slots + FP8_DESCALE_S * FP8_SLOT_BYTES, 1.0f / CG_FP8_P_SCALE, stream, err);
  fill_f32(slots + FP8_SCALE_O * FP8_SLOT_BYTES, 1.0f, stream, err);
  for (int i = 0; i < FP8_SLOTS; ++i) ptrs[CG_UID_DESCALE_Q + i] = slots + i * FP8_SLOT_BYTES;
}

static int check_inputs(const attn_run *run, cg_err *err) {
  const attn_problem *p = run->problem;
  const attn_inputs *in = run->inputs;
  size_t es = attn_dtype_size((attn_dtype)p->dtype);
  if (p->page_size > 0 &&
      (check_tensor("block_table", &in->block_table, 2, 4, 0, err) ||
       check_tensor("cache_seqlens", &(attn_tensor){(void *)in->cache_seqlens, {1, 0, 0, 0}}, 1, 4,
                    0, err)))
    return 1;
  return check_tensor("q", &in->q, 4, es, QKV_RULES, err) ||
         check_tensor("k", &in->k, 4, es, QKV_RULES, err) ||
         check_tensor("v", &in->v, 4, es, QKV_RULES, err) ||
         (p->has_bias && check_tensor("bias", &in->bias, 4, es, LAST_CONTIGUOUS, err)) ||
         (p->alibi && check_tensor("alibi_slopes", &in->alibi_slopes, 1, 4, 0, err)) ||
         (p->varlen == ATTN_VARLEN_PADDED &&
          (check_tensor("seqlens_q", &(attn_tensor){(void *)in->seqlens_q, {1, 0, 0, 0}}, 1, 4, 0,
                        err) ||
           check_tensor("seqlens_k", &(attn_tensor){(void *)in->seqlens_k, {1, 0, 0, 0}}, 1, 4, 0,
                        err)));
}

static void input_layout(const attn_run *run, cg_layout *l) {
  const attn_problem *p = run->problem;
  const attn_inputs *in = run->inputs;
  memset(l, 0, sizeof *l);
  bhsd(&in->q, l->q);
  bhsd(&in->k, l->k);
  bhsd(&in->v, l->v);
  if (p->has_bias) bias_strides(p, &in->bias, l->bias);
  if (p->page_size > 0) table_strides(&in->block_table, l->table);
}

static attn_status cudnn_forward(const attn_run *run) {
  const attn_problem *p = run->problem;
  cudnn_state *st = run->state;
  cg_err err = {ATTN_STATUS_OK, run->why, run->why_size};
  if (p->seqlen_q == 0) return ATTN_STATUS_OK; /* an empty problem: nothing to write */
  if (run->outputs->probs.data != NULL) {
    attn_format(run->why, run->why_size,
                "probs: cuDNN's fused kernels never form the probabilities (ask another "
                "implementation)");
    return ATTN_STATUS_UNSUPPORTED;
  }
  size_t es = attn_dtype_size(attn_out_dtype(p)); /* of out; q, k, v are checked by theirs */
  const attn_outputs *out = run->outputs;
  if (check_inputs(run, &err) || check_tensor("out", &out->out, 4, es, QKV_RULES, &err) ||
      check_tensor("lse", &out->lse, 3, 4, 0, &err))
    return err.status;
  cg_layout layout;
  input_layout(run, &layout);
  bhsd(&out->out, layout.o);
  attn_tensor lse_scratch = dense(p, ATTN_ROLE_LSE);
  const attn_tensor *lse = out->lse.data != NULL ? &out->lse : &lse_scratch;
  lse_strides(lse, layout.lse);

  int previous;
  if (enter_device(p, &previous, &err)) return err.status;
  cg_graph *g = graph_for(st, 0, &layout, run->workspace_size, &err);
  /* A handle per run, from the pool (cudnn_cache.c), not per plan: a plan then costs no
   * cudnnCreate, and plans that are not running hold none. */
  cudnnHandle_t handle = g != NULL ? attn_cudnn_handle_take(p->device_index, &err) : NULL;
  if (handle != NULL) {
    void *ptrs[CG_UID_COUNT] = {0};
    char *own;
    bind_common(run, g, ptrs, &own);
    lse_scratch.data = own;
    ptrs[CG_UID_O] = out->out.data;
    ptrs[CG_UID_STATS] = lse->data;
    cudaStream_t stream = (cudaStream_t)run->stream;
    ATTN_CUDNN_CHECK(&err, cudnnSetStream(handle, stream));
    if (attn_cudnn_graph_spec(g)->full_padding)
      bind_full_lengths(st, own + stats_bytes(p), ptrs, stream, &err);
    if (p->dtype == ATTN_DTYPE_F8E4M3)
      bind_fp8(run, own + stats_bytes(p) + 2 * seqlen_bytes(p), ptrs, stream, &err);
    if (p->page_size > 0) {
      /* Every sequence has Tq queries and cache_seqlens[b] keys, read in place from the
       * caller's device memory; the queries' [B] copies of Tq go in the workspace. */
      char *seq_q = own + stats_bytes(p);
      fill_i32(seq_q, (int32_t)p->seqlen_q, p->batch, stream, &err);
      ptrs[CG_UID_SEQ_Q] = seq_q;
      ptrs[CG_UID_SEQ_KV] = (void *)run->inputs->cache_seqlens;
      ptrs[CG_UID_PAGE_TABLE] = run->inputs->block_table.data;
    }
    if (p->varlen == ATTN_VARLEN_PADDED) {
      /* Rows past seqlens_q[b] are the library's to write: out 0 and lse -inf. */
      int64_t shape[4];
      attn_role_shape(p, ATTN_ROLE_OUT, shape);
      zero_bthd(&out->out, shape, es, stream, &err);
      if (out->lse.data != NULL && err.status == ATTN_STATUS_OK)
        fill_lse_neg_inf(p, &out->lse, stream, &err);
    }
    if (err.status == ATTN_STATUS_OK)
      attn_cudnn_graph_execute(g, handle, ptrs, run->workspace, &err);
    attn_cudnn_handle_give(p->device_index, handle);
  }
  leave_device(p, previous);
  return err.status;
}

static attn_status cudnn_backward(const attn_run *run) {
  const attn_problem *p = run->problem;
  cudnn_state *st = run->state;
  cg_err err = {ATTN_STATUS_OK, run->why, run->why_size};
  size_t es = attn_dtype_size((attn_dtype)p->dtype);
  if (p->seqlen_q == 0) {
    /* No query: every key's gradient is zero. */
    if (check_tensor("dk", &run->grads->dk, 4, es, QKV_RULES, &err) ||
        check_tensor("dv", &run->grads->dv, 4, es, QKV_RULES, &err))
      return err.status;
    int previous;
    if (enter_device(p, &previous, &err)) return err.status;
    int64_t shape[4];
    attn_role_shape(p, ATTN_ROLE_DK, shape);
    zero_bthd(&run->grads->dk, shape, es, (cudaStream_t)run->stream, &err);
    attn_role_shape(p, ATTN_ROLE_DV, shape);
    zero_bthd(&run->grads->dv, shape, es, (cudaStream_t)run->stream, &err);
    leave_device(p, previous);
    return err.status;
  }
  const attn_outputs *fwd = run->outputs;
  const attn_grads *gr = run->grads;
  if (check_inputs(run, &err) || check_tensor("out", &fwd->out, 4, es, QKV_RULES, &err) ||
      check_tensor("lse", &fwd->lse, 3, 4, 0, &err) ||
      check_tensor("dout", run->dout, 4, es, QKV_RULES, &err) ||
      check_tensor("dq", &gr->dq, 4, es, QKV_RULES, &err) ||
      check_tensor("dk", &gr->dk, 4, es, QKV_RULES, &err) ||
      check_tensor("dv", &gr->dv, 4, es, QKV_RULES, &err) ||
      (p->has_bias && check_tensor("dbias", &gr->dbias, 4, es, LAST_CONTIGUOUS, &err)))
    return err.status;
  int pass = gr->dbias.data != NULL ? 2 : 1;
  cg_layout layout;
  input_layout(run, &layout);
  bhsd(&fwd->out, layout.o);
  lse_strides(&fwd->lse, layout.lse);
  bhsd(run->dout, layout.dout);
  bhsd(&gr->dq, layout.dq);
  bhsd(&gr->dk, layout.dk);
  bhsd(&gr->dv, layout.dv);
  if (pass == 2) bias_strides(p, &gr->dbias, layout.dbias);

  int previous;
  if (enter_device(p, &previous, &err)) return err.status;
  cg_graph *g = graph_for(st, pass, &layout, run->workspace_size, &err);
  cudnnHandle_t handle = g != NULL ? attn_cudnn_handle_take(p->device_index, &err) : NULL;
  if (handle != NULL) {
    const cg_spec *spec = attn_cudnn_graph_spec(g);
    void *ptrs[CG_UID_COUNT] = {0};
    char *own;
    bind_common(run, g, ptrs, &own);
    ptrs[CG_UID_O] = fwd->out.data;
    ptrs[CG_UID_STATS] = fwd->lse.data;
    ptrs[CG_UID_DO] = run->dout->data;
    ptrs[CG_UID_DQ] = gr->dq.data;
    ptrs[CG_UID_DK] = gr->dk.data;
    ptrs[CG_UID_DV] = gr->dv.data;
    ptrs[CG_UID_DBIAS] = gr->dbias.data;
    ptrs[CG_UID_SOFTMAX_SUM] = own;
    ptrs[CG_UID_DQ_ACCUM] = cg_dq_accumulated(spec) ? own + stats_bytes(p) : NULL;
    char *seq = own + stats_bytes(p) + dq_accum_bytes(p, run->config);
    cudaStream_t stream = (cudaStream_t)run->stream;
    ATTN_CUDNN_CHECK(&err, cudnnSetStream(handle, stream));
    if (spec->full_padding) bind_full_lengths(st, seq, ptrs, stream, &err);
    if (spec->version < 90600 && cg_dq_accumulated(spec))
      ATTN_CUDA_CHECK(
          &err, cudaMemsetAsync(ptrs[CG_UID_DQ_ACCUM], 0, dq_accum_bytes(p, run->config), stream));
    if (p->varlen == ATTN_VARLEN_PADDED) {
      /* Gradients of padded rows are zero by definition; the kernels may skip those rows. */
      int64_t shape[4];
      attn_role_shape(p, ATTN_ROLE_DQ, shape);
      zero_bthd(&gr->dq, shape, es, stream, &err);
      attn_role_shape(p, ATTN_ROLE_DK, shape);
      zero_bthd(&gr->dk, shape, es, stream, &err);
      attn_role_shape(p, ATTN_ROLE_DV, shape);
      zero_bthd(&gr->dv, shape, es, stream, &err);
    }
    if (err.status == ATTN_STATUS_OK)
      attn_cudnn_graph_execute(g, handle, ptrs, run->workspace, &err);
    attn_cudnn_handle_give(p->device_index, handle);
  }
  leave_device(p, previous);
  return err.status;
}

const attn_impl attn_cudnn_impl = {
    .name = "cudnn",
    .device = ATTN_DEVICE_CUDA,
    .version = 2, /* 2: the "atomic" and "deterministic" configurations */
    .supports = cudnn_supports,
    .num_configs = cudnn_num_configs,
    .config_name = cudnn_config_name,
    .default_config = cudnn_default_config,
    .workspace_size = cudnn_workspace_size,
    .plan_init = cudnn_plan_init,
    .plan_fini = cudnn_plan_fini,
    .forward = cudnn_forward,
    .backward = cudnn_backward,
    .config_deterministic = cudnn_config_deterministic,
};

/* The module libattn_cudnn.so (src/module/module.h): this implementation, the CUDA runtime
 * services and the graph cache's counters for test_cudnn. src/module/entry.c exports it;
 * libattn_gpu.a links it in directly. */
static const attn_impl *const cudnn_module_impls[] = {&attn_cudnn_impl};
/* The test hook probe_forward (cudnn_graph.h): plan_init, workspace and forward, without
 * cudnn_supports. */
static attn_status probe_forward(const attn_problem *p, const attn_inputs *inputs,
                                 const attn_outputs *outputs, char *why, size_t why_size) {
  void *state = NULL;
  attn_status s = cudnn_plan_init(p, CUDNN_CONFIG_ATOMIC, &state, why, why_size);
  if (s == ATTN_STATUS_OK && outputs != NULL) {
    cg_err err = {ATTN_STATUS_OK, why, why_size};
    size_t size = cudnn_workspace_size(p, CUDNN_CONFIG_ATOMIC, state, 0);
    void *workspace = NULL;
    int previous;
    if (!enter_device(p, &previous, &err)) {
      if (!ATTN_CUDA_CHECK(&err, cudaMalloc(&workspace, size))) {
        attn_run run;
        memset(&run, 0, sizeof run);
        run.problem = p, run.config = CUDNN_CONFIG_ATOMIC, run.inputs = inputs;
        run.outputs = outputs, run.workspace = workspace, run.workspace_size = size;
        run.state = state, run.round_to = ATTN_DTYPE_F64, run.why = why, run.why_size = why_size;
        err.status = cudnn_forward(&run);
        if (err.status == ATTN_STATUS_OK) ATTN_CUDA_CHECK(&err, cudaDeviceSynchronize());
        cudaFree(workspace);
      }
      leave_device(p, previous);
    }
    s = err.status;
  }
  cudnn_plan_fini(state);
  return s;
}

static const attn_cudnn_test_hooks cudnn_test_hooks = {
    attn_cudnn_graph_cache_stats, attn_cudnn_graph_cache_set_capacity, probe_forward};
static const attn_module_table cudnn_module_table = {ATTN_MODULE_TABLE_HEADER, "cudnn",
                                                     cudnn_module_impls,       1,
                                                     &attn_gpu_runtime_ops,    &cudnn_test_hooks,
                                                     NULL};
const attn_module_table *attn_cudnn_module(void);
const attn_module_table *attn_cudnn_module(void) { return &cudnn_module_table; }
