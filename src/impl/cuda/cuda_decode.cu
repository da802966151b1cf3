/*
 * src/impl/cuda/cuda_decode.cu - split-KV decode (flash-decoding) for dense and paged KV caches.
 *
 * Decode reads every visible K and V row once and does little arithmetic with it, so the kernels
 * are built to keep as many bytes in flight as the memory system needs, and to do the arithmetic
 * where it costs nothing:
 *   - a CTA (4 warps) takes one (sequence b, KV head g, chunk of up to 16 query rows, key split)
 *     (or G KV heads, below);
 *     the rows are the Hq/Hkv query heads times Tq queries of head g (GQA packing): they are the
 *     16 rows of one tensor-core tile, so each K and V row is read from memory once for all of
 *     them and Tq = 4 costs what Tq = 1 does;
 *   - the split's keys stream through shared memory in tiles of 64 rows, two or three tiles in
 *     flight (a CTA keeps 64-96 KiB requested; two CTAs per SM at D = 128). On sm_90 each row of
 *     K or V is one cp.async.bulk (256 bytes at D = 128) issued by one thread, completing on the
 *     stage's mbarrier: 128 copies per tile instead of 2048 16-byte cp.async, the copy engine
 *     doing the gather, and the next tile issued before the current one is awaited. Elsewhere
 *     16-byte cp.async, a row per 8 to 32 consecutive threads. A paged cache is gathered row by
 *     row through the block table, so any page size works (bulk copies took paged 16 on the
 *     H100 from 80% to 92% of the copy rate at B = 64, Tk = 8192: bench/RESULTS.md);
 *   - on sm_90 at D = Dv = 128 a CTA of 8 warps may take 2 or 4 KV heads of the key range
 *     instead (Shape's G; planned_heads picks it from the call's keys): each key's G rows arrive
 *     as one copy of G x 256 bytes. On the H200 the rate followed the bytes per copy, not where
 *     they lie (a head-major cache, each CTA's tiles contiguous, ran as fast as the usual
 *     layout): 4 heads took B * Tk >= 64k from 75-88% to 83-102% of the copy rate;
 *   - each warp owns 16 keys of a tile: S = Q K^T and O += P V on mma.sync (m16n8k16, f32
 *     accumulation, P rounded to the input type as in the main forward kernel), an online softmax
 *     per row in registers; the warps' (m, l, O) merge in shared memory in a fixed order;
 *   - the warps' (m, l, O) are merged a row's weights at a time (one thread per row), then four
 *     columns per thread; with one split the CTA writes out and lse itself; otherwise each split
 *     writes its partial (m, l, unnormalised O) and the partials are merged through their maxima
 *     (the lse merge of flash-decoding), the sinks added once, out and lse written:
 *     on sm_90, where 2 to 16 splits' CTAs all fit on the device at once, by the splits of one
 *     (sequence, KV head, row chunk) as one thread-block cluster, through distributed shared
 *     memory (no workspace round trip); on sm_90 with more splits whose CTAs all fit at once, by
 *     the split kernel itself, launched cooperatively, after a grid barrier (one CTA per row);
 *     otherwise by a second kernel, one CTA per row. Every sum runs in a fixed order, so the bits
 *     repeat;
 *   - on sm_90 the split kernel is a programmatic dependent of the stream's previous kernel (its
 *     launch, and its shared memory and barriers' set-up, overlap that kernel's tail; it waits for
 *     it before touching global memory), and the merge kernel one of the split kernel;
 *   - the key range of a sequence is the union of its rows' windows, so pages wholly outside a
 *     sliding window are never read; sequences of length 0 give out = 0, lse = -inf (or the
 *     sinks'); lengths and page numbers read from device memory are clamped to the tensors;
 *   - with seqlen_new > 0 a first kernel copies k_new / v_new into their pages.
 * Head dims: kernels for 64, 128 and 256; D and Dv (multiples of 8) below the kernel's are zero
 * padded in shared memory. Features: GQA/MQA, causal, sliding windows, soft cap, ALiBi, sinks,
 * lse; f16 and bf16.
 */
#include "impl/cuda/cuda_check.cuh"
#include "impl/cuda/cuda_common.cuh"
#include "impl/cuda/cuda_decode.h"
#include "impl/cuda/cuda_mbarrier.cuh"

#include <atomic>
#include <cooperative_groups.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

namespace attn_cuda_decode {

using attn_cuda::Elem;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = ATTN_CUDA_DECODE_ROWS; /* one m16 tile */
constexpr int kBN = 64;                      /* keys per tile: 16 per warp */
/* The shortest split the heuristic makes: two tiles, so a CTA's pipeline has work to overlap.
 * Shorter splits cost more in ramp and merge than their parallelism gains (H100, B = 1, Tk = 8192,
 * paged 16: 33 splits of 256 keys 25.7 us, 64 of 128 keys 32.2 us). */
constexpr int kMinSplitKeys = 2 * kBN;
/* The most splits it makes (a bound on the workspace; more would each stream less than a tile). */
constexpr int kMaxSplits = 1024;
/* The most splits merged inside one thread-block cluster (sm_90: 16 with the non-portable opt-in),
 * which replaces the merge kernel: see split_kernel's epilogue. */
constexpr int kMaxClusterSplits = 16;
/* A split's partial result per row: [m, l, 2 unused, O[Dv]], so that O starts on 16 bytes and
 * the merge reads four columns per load. */
constexpr int kPartHead = 4;
/* Splits whose partials the merge requests at once per thread (their loads in flight together). */
constexpr int kMergeBatch = 16;

/* How the kernels move data, for measuring the choices side by side (ATTN_CUDA_DECODE, a comma-
 * separated list of the tokens below, read when a plan is made: attn_cuda_decode_variant; the flags
 * travel in attn_cuda_decode_params.variant; docs/DECODE.md has the measurements). 0 is the
 * defaults, the fastest measured; sm_90's paths apply only where the kernel was compiled for sm_90
 * and runs on it. */
enum VariantFlag : int {
  kVarCpAsync = 1 << 0,      /* "cpasync": 16-byte cp.async instead of cp.async.bulk rows */
  kVarLateIssue = 1 << 1,    /* "lateissue": bulk copies of a tile issued after the current one is
                                awaited, not before */
  kVarNoCluster = 1 << 2,    /* "nocluster": the merge kernel (or the grid's merge) where a cluster
                                would merge */
  kVarMergeChunk = 1 << 3,   /* "mergechunk" / "mergewide": the merge kernel with one CTA per
                                row chunk, its rows four at a time, or one CTA per row over
                                columns and splits, instead of the choice by work items
                                (chunk_merge_pays) */
  kVarWaitFirst = 1 << 4,    /* "waitfirst": the split kernel waits for the previous kernel before
                                setting up its shared memory and barriers, not after */
  kVarMergeKernel = 1 << 5,  /* "mergekernel": the merge kernel where the split CTAs fit at once
                                and would merge their own splits after a grid barrier */
  kVarTableByStage = 1 << 6, /* "tablebystage": a stage's block-table entries read just before its
                                copies, stage after stage, not all the first stages' at once */
  kVarEpilogueFlat = 1 << 7, /* "epilogueflat": the split's warps merged element by element, each
                                thread redoing its row's weights, not a row's weights once and
                                four columns per thread */
  kVarHeads2 = 1 << 8,       /* "heads1", "heads2", "heads4", "heads8": a CTA takes 1, 2, 4 or 8
                                KV heads of a key range (each key's rows of those heads one copy of
                                G x 256 bytes at D = 128; see Shape), instead of the number
                                planned_heads picks */
  kVarHeads4 = 1 << 9,
  kVarHeads8 = 1 << 10,
  kVarHeads1 = 1 << 11,
  kVarMergeWide = 1 << 12,
  kVarTanhExp = 1 << 13,     /* "tanhexp": the soft cap's tanh from one exponential and a
                                reciprocal (tanh_exp), not the special-function unit's tanh */
};
struct VariantToken {
  const char *name;
  int flag;
};
constexpr VariantToken kVariantTokens[] = {
    {"cpasync", kVarCpAsync},           {"lateissue", kVarLateIssue},       {"nocluster", kVarNoCluster},
    {"mergechunk", kVarMergeChunk},     {"waitfirst", kVarWaitFirst},       {"mergekernel", kVarMergeKernel},
    {"tablebystage", kVarTableByStage}, {"epilogueflat", kVarEpilogueFlat}, {"heads2", kVarHeads2},
    {"heads4", kVarHeads4},             {"heads8", kVarHeads8},             {"heads1", kVarHeads1},
    {"mergewide", kVarMergeWide},       {"tanhexp", kVarTanhExp},
};

/* The KV heads per CTA a variant asks for (the largest token given); 0: none, planned_heads picks. */
constexpr int requested_heads(int flags) {
  return flags & kVarHeads8 ? 8 : flags & kVarHeads4 ? 4 : flags & kVarHeads2 ? 2 : flags & kVarHeads1 ? 1 : 0;
}

/* planned_heads's choice without a token, by the keys of the whole call (batch x the keys a
 * sequence's rows can see), from the H200 (bench/RESULTS.md "A CTA over several KV heads"): 4
 * heads per CTA took every row of B * Tk >= 64k to 83-102% of the copy rate (1.06-1.20x faster
 * than 1 head, 1.01-1.06x than 2), 2 heads the B = 1 rows of 8k and 32k keys (1.02-1.12x faster
 * than 1, where 4 make too few CTAs or too short splits); below 8k keys (a 4k window at B = 1)
 * one head stays (2 were 2% slower there). */
constexpr int64_t kHeads4Keys = 65536, kHeads2Keys = 8192;

struct Variant {
  bool bulk, early_issue, cluster, grid_merge;
  int merge_form; /* kVarMergeChunk, kVarMergeWide, or 0: chunk_merge_pays decides */
  explicit Variant(int flags)
      : bulk(!(flags & kVarCpAsync)), early_issue(!(flags & kVarLateIssue)), cluster(!(flags & kVarNoCluster)),
        grid_merge(!(flags & kVarMergeKernel)), merge_form(flags & (kVarMergeChunk | kVarMergeWide)) {}
};

/* Per head-dim kernel and KV heads per CTA (G): warps, keys per tile, stages in flight and CTAs
 * per SM (registers are bounded for that many; shared memory allows it on sm_90: 2 x 107 KiB at
 * KD = 128, G = 1, so up to 6 tiles of 32 KiB requested per SM; with bulk copies that reaches
 * 91-97% of the H100's copy rate on dense caches of B * Tk >= 64k keys and 86-93% with 16-row
 * pages, bench/RESULTS.md).
 * G > 1 (KD = 128 only, "heads2/4/8"): one CTA of 8 warps takes G KV heads whose rows lie side by
 * side in memory ([.., Hkv, D] with D = Dv = 128), kWarps / G warps per head, each warp 16 keys of
 * a tile, so a tile has 16 * 8 / G keys; each key's G rows of K (and of V) are one copy of G x 256
 * bytes into a shared row of G heads (+16 bytes: ldmatrix stays conflict-free). One CTA per SM,
 * the same 8 warps and (G = 2, 4) the same 192 KiB of tiles in flight per SM as two CTAs of G = 1:
 * only the size of each copy changes (the DRAM sees G x 256-byte pieces of each 2 KiB key row at
 * once rather than 256-byte ones from G CTAs at different times). G = 8 takes whole key rows but
 * keeps two stages (its 8 heads' queries take 34 KiB). */
template <int KD, int G = 1> struct Shape {
  static_assert(G == 1 || KD == 128, "several KV heads per CTA only at head dim 128");
  static constexpr int kWarps = G == 1 ? attn_cuda_decode::kWarps : 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kHeadWarps = kWarps / G; /* warps per KV head */
  static constexpr int kBN = 16 * kHeadWarps;   /* keys per tile */
  static constexpr int kStages = KD >= 256 || G >= 8 ? 2 : 3;
  static constexpr int kPitch = KD + 8; /* elements per shared row of q: +16 bytes, ldmatrix conflict-free */
  static constexpr int kRowPitch = G * KD + 8; /* ... of K and V: G heads side by side */
  static constexpr int kMinBlocks = G > 1 ? 1 : KD >= 256 ? 1 : KD >= 128 ? 2 : 4;
  static constexpr int kTile = kBN * kRowPitch; /* elements of one K or V tile */
  /* q (G heads' rows), the stages, the warps' (m, l), the stages' mbarriers (bulk copies) */
  static constexpr size_t kSmem = 2 * ((size_t)G * kRows * kPitch + (size_t)kStages * 2 * kTile) +
                                  sizeof(float) * kWarps * kRows * 2 + sizeof(uint64_t) * kStages;
  /* after the loop the tiles' space holds the warps' O (f32, rows kOwPitch floats apart: 8 mod
   * 32, so the 8 rows of a warp's store fall in distinct banks), then the CTA's merged partial
   * [kRows][m, l, -, -, O[KD]] that the other CTAs of a cluster read (G = 1), then the rows'
   * weights [G * kRows][kHeadWarps] and (M, L) [G * kRows] */
  static constexpr int kOwPitch = KD + 8;
  static constexpr size_t kOwFloats = (size_t)kWarps * kRows * kOwPitch;
  static_assert(sizeof(float) * (kOwFloats + (size_t)kRows * (KD + kPartHead) + (size_t)G * kRows * (kHeadWarps + 2)) <=
                    2 * (size_t)kStages * 2 * kTile,
                "o_w, the partial and the weights fit");
  static_assert(kSmem <= 227 * 1024, "one CTA's shared memory fits sm_90's");
  static_assert(2 * kBN <= kThreads, "bulk copies: one K or V row per thread");
};

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Waits for the grid this one is a programmatic dependent of (sm_90; elsewhere kernels are
 * ordered by the stream and this does nothing). */
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

#ifdef ATTN_CUDA_DECODE_TIMELINE
/* dev/cuda/decode_timeline.cu: each CTA's thread 0 stamps %globaltimer at its events and stores
 * them, with its SM, in a ring of kTlCalls calls (params.timeline_call picks the slot), for the
 * CTAs' timeline of a call. Never in the library's build. */
constexpr int kTlCalls = 32, kTlCtas = 2048, kTlEvents = 8;
__device__ unsigned long long g_tl_split[kTlCalls][kTlCtas][kTlEvents];
__device__ unsigned long long g_tl_merge[kTlCalls][kTlCtas][kTlEvents];
__device__ __forceinline__ unsigned long long tl_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void tl_store(unsigned long long (*ring)[kTlCtas][kTlEvents], int call,
                                         const unsigned long long *tl, long long cycles) {
  const int cta = (int)(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
  if (threadIdx.x != 0 || cta >= kTlCtas) return;
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  unsigned long long *dst = ring[call % kTlCalls][cta];
  for (int e = 0; e < kTlEvents - 2; ++e) dst[e] = tl[e];
  dst[kTlEvents - 2] = (unsigned long long)cycles; /* SM clocks from start to exit: the clock rate */
  dst[kTlEvents - 1] = smid;
}
#define TL_DECLARE                                                                                           \
  unsigned long long tl[kTlEvents] = {};                                                                     \
  const long long tl_clock0 = clock64()
#define TL_STAMP(i) (tl[i] = tl_now())
#define TL_STORE(ring) tl_store(ring, p.timeline_call, tl, clock64() - tl_clock0)
#else
#define TL_DECLARE
#define TL_STAMP(i) ((void)0)
#define TL_STORE(ring) ((void)0)
#endif

/* Keys of sequence b: the cache plus the appended rows (paged), else seqlen_k; clamped to the
 * tensors (device memory the plan could not check). */
__device__ __forceinline__ int seq_len(const attn_cuda_decode_params &p, int b) {
  if (p.block_table == nullptr) return p.seqlen_k;
  return min(max(p.cache_seqlens[b], 0) + p.seqlen_new, p.seqlen_k);
}

/* Key j of a paged sequence: its column of the block table and its row in that page. Page sizes
 * that are powers of two (all the engines') take a shift and a mask instead of two divisions,
 * which a CTA would otherwise pay for every row it copies. */
struct PageOf {
  int shift; /* log2(page_size), or -1 */
  int size;
  __device__ __forceinline__ explicit PageOf(int page_size) : size(page_size) {
    shift = (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1;
  }
  __device__ __forceinline__ int column(int j) const { return shift >= 0 ? j >> shift : j / size; }
  __device__ __forceinline__ int row(int j) const { return shift >= 0 ? j & (size - 1) : j % size; }
};

/* The pool page of key j of sequence b (the block table's entry, clamped to the pool). */
__device__ __forceinline__ int page_of(const attn_cuda_decode_params &p, const PageOf &po, int b, int j) {
  const int page = __ldg(p.block_table + (int64_t)b * p.bt_b + (int64_t)po.column(j) * p.bt_p);
  return min(max(page, 0), p.num_pages - 1);
}

/* Element offsets of (key j, head g, element 0) of sequence b in k and in v; page: key j's pool
 * page (paged caches). */
__device__ __forceinline__ void key_offsets(const attn_cuda_decode_params &p, const PageOf &po, int b,
                                            int j, int g, int page, int64_t &koff, int64_t &voff) {
  if (p.block_table == nullptr) {
    koff = (int64_t)b * p.k_b + (int64_t)j * p.k_r + (int64_t)g * p.k_h;
    voff = (int64_t)b * p.v_b + (int64_t)j * p.v_r + (int64_t)g * p.v_h;
    return;
  }
  const int r = po.row(j);
  koff = (int64_t)page * p.k_b + (int64_t)r * p.k_r + (int64_t)g * p.k_h;
  voff = (int64_t)page * p.v_b + (int64_t)r * p.v_r + (int64_t)g * p.v_h;
}

/* tanh from one exponential and a reciprocal ("tanhexp"): |error| below 1e-6, a fifth of tanhf's
 * instructions, but two special-function operations and four more in a chain, on each tile's
 * critical path in this memory-bound loop; the default is attn_cuda::tanh_sfu, one instruction
 * (bench/RESULTS.md, "The decode soft cap by tanh.approx": 96.5-98.7% of the plain rate against
 * 90.6-94.5%). Nothing recomputes the decode kernels' P (the paged backward is refused). */
__device__ __forceinline__ float tanh_exp(float y) {
  const float e = __expf(2.0f * fabsf(y)); /* +inf for large |y|: the result is then 1 */
  return copysignf(1.0f - __fdividef(2.0f, e + 1.0f), y);
}

/* Writes k_new, v_new into their pages, 16 bytes per copy: grid (B, seqlen_new). */
template <typename T> __global__ void append_kernel(attn_cuda_decode_params p) {
  const int b = blockIdx.x, t = blockIdx.y;
  const int j = max(p.cache_seqlens[b], 0) + t;
  if (j >= p.seqlen_k) return; /* a length past the cache: nothing to write that a read could see */
  int64_t koff, voff;
  T *k = const_cast<T *>(static_cast<const T *>(p.k));
  T *v = const_cast<T *>(static_cast<const T *>(p.v));
  const T *kn = static_cast<const T *>(p.k_new), *vn = static_cast<const T *>(p.v_new);
  const int kc = p.d / 8, vc = p.dv / 8;
  const PageOf po(p.page_size);
  const int page = page_of(p, po, b, j);
  for (int e = threadIdx.x; e < p.heads_kv * (kc + vc); e += blockDim.x) {
    const bool is_k = e < p.heads_kv * kc;
    const int c = is_k ? e : e - p.heads_kv * kc, per = is_k ? kc : vc;
    const int g = c / per, col = c % per * 8;
    key_offsets(p, po, b, j, g, page, koff, voff);
    if (is_k)
      *reinterpret_cast<uint4 *>(k + koff + col) = *reinterpret_cast<const uint4 *>(
          kn + (int64_t)b * p.kn_b + (int64_t)t * p.kn_r + (int64_t)g * p.kn_h + col);
    else
      *reinterpret_cast<uint4 *>(v + voff + col) = *reinterpret_cast<const uint4 *>(
          vn + (int64_t)b * p.vn_b + (int64_t)t * p.vn_r + (int64_t)g * p.vn_h + col);
  }
}

/* Row rr of KV head g's rows (rr < group * Tq): query head and query index. */
__device__ __forceinline__ void row_head(const attn_cuda_decode_params &p, int g, int rr, int &h,
                                         int &i) {
  h = g * p.group + rr / p.seqlen_q, i = rr % p.seqlen_q;
}

/* The end of a row of query head h: from the maximum M and sum L of its exponentials over the keys,
 * with the sinks added, the factor of its unnormalised O (0 when nothing, not even a sink, is
 * seen) and its lse. */
struct RowEnd {
  float scale, lse;
};
__device__ __forceinline__ RowEnd row_end(const attn_cuda_decode_params &p, int h, float M, float L) {
  float Ms = M;
  for (int t = 0; t < p.num_sinks; ++t)
    Ms = fmaxf(Ms, p.sinks[(int64_t)h * p.sinks_h + (int64_t)t * p.sinks_t]);
  if (Ms == -INFINITY) return {0.0f, -INFINITY};
  const float f = M == -INFINITY ? 0.0f : __expf(M - Ms);
  float Ls = L * f;
  for (int t = 0; t < p.num_sinks; ++t) Ls += __expf(p.sinks[(int64_t)h * p.sinks_h + (int64_t)t * p.sinks_t] - Ms);
  return {f / Ls, Ms + logf(Ls)};
}

/* Writes column c of out[b, i, h] (c < Dv) or, c == Dv, lse[b, h, i], from the row's M, L and
 * unnormalised O[c]. */
template <typename T>
__device__ __forceinline__ void finish(const attn_cuda_decode_params &p, int b, int h, int i, int c,
                                       float M, float L, float O) {
  const RowEnd e = row_end(p, h, M, L);
  if (c < p.dv) {
    T *out = static_cast<T *>(p.out);
    out[(int64_t)b * p.o_b + (int64_t)i * p.o_r + (int64_t)h * p.o_h + c] = from_float<T>(O * e.scale);
  } else if (p.lse != nullptr) {
    p.lse[(int64_t)b * p.lse_b + (int64_t)h * p.lse_h + (int64_t)i * p.lse_r] = e.lse;
  }
}

/* The splits of one (sequence, KV head, row chunk) are one cluster: after every CTA has put its
 * partial (part: [kRows][m, l, -, -, O[Dv]] in its shared memory) the cluster's CTAs read each
 * other's through distributed shared memory, CTA `rank` taking every (cluster size)-th output
 * element, and merge the splits through their maxima in rank order (split order: the same bits
 * each run). This replaces the merge kernel: no second launch, no round trip of the partials
 * through L2, no workspace. Every CTA of the cluster must arrive here (no early exit above). */
template <typename T>
__device__ __forceinline__ void merge_cluster(const attn_cuda_decode_params &p, int b, int g, int first,
                                              int nrows, float *part) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync(); /* every split's partial is written (release / acquire across the cluster) */
  const int splits = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
  const int stride = p.dv + kPartHead;
  for (int e = rank * kThreads + (int)threadIdx.x; e < nrows * (p.dv + 1); e += splits * kThreads) {
    const int r = e / (p.dv + 1), c = e % (p.dv + 1);
    /* every split's (m, l, O[c]) requested at once: one latency of distributed shared memory, not
     * one per split */
    float ms[kMaxClusterSplits], ls[kMaxClusterSplits], os[kMaxClusterSplits];
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      ms[s] = -INFINITY, ls[s] = 0.0f, os[s] = 0.0f;
      if (s < splits) {
        const float *ps = cluster.map_shared_rank(part, s) + r * stride;
        ms[s] = ps[0], ls[s] = ps[1];
        if (c < p.dv) os[s] = ps[kPartHead + c];
      }
    }
    float M = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) M = fmaxf(M, ms[s]);
    float L = 0.0f, O = 0.0f;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      if (ms[s] == -INFINITY) continue; /* an empty split, or past the cluster */
      const float w = __expf(ms[s] - M);
      L += w * ls[s];
      O += w * os[s];
    }
    int h, i;
    row_head(p, g, first + r, h, i);
    finish<T>(p, b, h, i, c, M, L, O);
  }
  cluster.sync(); /* no CTA leaves (and frees its shared memory) while another still reads it */
#else
  (void)p, (void)b, (void)g, (void)first, (void)nrows, (void)part;
  __trap(); /* launch_split asks for the cluster merge only of a kernel compiled for sm_90 */
#endif
}

/* Adds splits first, first + step, ... (< splits) of one row's partials (row: split 0's, the next
 * split sstride floats on) to a running (M, L, O) of four columns (quad q4), in that order:
 * kMergeBatch splits' (m, l) and O loaded at once (one round trip to L2 per batch, not one per
 * split), then summed through a running maximum. The same bits each run. The partials are read
 * through L2 (.cg): the split kernel, still finishing when the merge kernel was launched, wrote
 * them. */
__device__ __forceinline__ void merge_partials(const float *row, int64_t sstride, int first, int step, int splits,
                                               int q4, float &M, float &L, float4 &O) {
  for (int s0 = first; s0 < splits; s0 += step * kMergeBatch) {
    float2 ml[kMergeBatch];
    float4 o[kMergeBatch];
#pragma unroll
    for (int u = 0; u < kMergeBatch; ++u) {
      const int s = s0 + u * step;
      ml[u] = make_float2(-INFINITY, 0.0f), o[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (s < splits) {
        const float *ps = row + (int64_t)s * sstride;
        ml[u] = __ldcg(reinterpret_cast<const float2 *>(ps));
        o[u] = __ldcg(reinterpret_cast<const float4 *>(ps + kPartHead) + q4);
      }
    }
    float Mn = M;
#pragma unroll
    for (int u = 0; u < kMergeBatch; ++u) Mn = fmaxf(Mn, ml[u].x);
    if (Mn == -INFINITY) continue; /* no key seen so far */
    const float a = __expf(M - Mn);  /* M = -inf: 0 */
    L *= a, O.x *= a, O.y *= a, O.z *= a, O.w *= a;
#pragma unroll
    for (int u = 0; u < kMergeBatch; ++u) {
      if (ml[u].x == -INFINITY) continue; /* an empty split, or past the last */
      const float w = __expf(ml[u].x - Mn);
      L += w * ml[u].y;
      O.x += w * o[u].x, O.y += w * o[u].y, O.z += w * o[u].z, O.w += w * o[u].w;
    }
    M = Mn;
  }
}

/* Writes columns 4 q4 .. 4 q4 + 3 of out[b, i, h] (and, q4 = 0, lse[b, h, i]) from the row's
 * merged M, L and unnormalised O. */
template <typename T>
__device__ __forceinline__ void finish_quad(const attn_cuda_decode_params &p, int b, int h, int i, int q4, float M,
                                            float L, float4 O) {
  const RowEnd e = row_end(p, h, M, L);
  T *out = static_cast<T *>(p.out) + (int64_t)b * p.o_b + (int64_t)i * p.o_r + (int64_t)h * p.o_h + 4 * q4;
  out[0] = from_float<T>(O.x * e.scale), out[1] = from_float<T>(O.y * e.scale);
  out[2] = from_float<T>(O.z * e.scale), out[3] = from_float<T>(O.w * e.scale);
  if (q4 == 0 && p.lse != nullptr) p.lse[(int64_t)b * p.lse_b + (int64_t)h * p.lse_h + (int64_t)i * p.lse_r] = e.lse;
}

/* Merges the splits' partials of work item `item` (sequence, KV head, row chunk) from the
 * workspace and writes its rows' out and lse, with the kThreads threads of the calling CTA: each
 * thread four columns of a row, the rows in passes of kThreads / (Dv / 4). */
template <typename T>
__device__ __forceinline__ void merge_splits(const attn_cuda_decode_params &p, int item, int row_chunks) {
  const int g = item / row_chunks % p.heads_kv, chunk = item % row_chunks, b = item / (row_chunks * p.heads_kv);
  const int first = chunk * kRows, nrows = min(kRows, p.group * p.seqlen_q - first);
  const int quads = p.dv / 4, per_pass = kThreads / quads; /* Dv <= 256: per_pass >= 2 */
  const int q4 = (int)threadIdx.x % quads;
  if ((int)threadIdx.x >= per_pass * quads) return;
  const int stride = p.dv + kPartHead;
  const int64_t sstride = (int64_t)kRows * stride;
  const float *base = p.partials + (int64_t)item * p.splits * sstride;
  for (int r = (int)threadIdx.x / quads; r < nrows; r += per_pass) {
    float M = -INFINITY, L = 0.0f;
    float4 O = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    merge_partials(base + (int64_t)r * stride, sstride, 0, 1, p.splits, q4, M, L, O);
    int h, i;
    row_head(p, g, first + r, h, i);
    finish_quad<T>(p, b, h, i, q4, M, L, O);
  }
}

/* Merges the splits of row r of work item `item` with the kThreads threads of the calling CTA: they
 * form `groups` groups of Dv / 4, each thread four columns, group k taking splits k, k + groups,
 * ... (at Dv = 128, 64 splits in one round of loads); then group 0 combines the groups' (m, l, O)
 * from shared memory (o_s: kThreads float4, [group][quad]; ml_s: kThreads float2, [group]) in
 * group order (the same bits each run). Every thread of the CTA must call it (a barrier inside). */
template <typename T>
__device__ __forceinline__ void merge_row_wide(const attn_cuda_decode_params &p, int item, int row_chunks, int r,
                                               float4 *o_s, float2 *ml_s) {
  const int g = item / row_chunks % p.heads_kv, chunk = item % row_chunks, b = item / (row_chunks * p.heads_kv);
  const int quads = p.dv / 4, groups = kThreads / quads; /* Dv <= 256: groups >= 2 */
  const int q4 = (int)threadIdx.x % quads, gi = (int)threadIdx.x / quads;
  const int stride = p.dv + kPartHead;
  const int64_t sstride = (int64_t)kRows * stride;
  if (gi < groups) {
    float M = -INFINITY, L = 0.0f;
    float4 O = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    merge_partials(p.partials + (int64_t)item * p.splits * sstride + (int64_t)r * stride, sstride, gi, groups,
                   p.splits, q4, M, L, O);
    o_s[gi * quads + q4] = O;
    if (q4 == 0) ml_s[gi] = make_float2(M, L);
  }
  __syncthreads();
  if (gi != 0) return;
  float M = -INFINITY, L = 0.0f;
  float4 O = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int k = 0; k < groups; ++k) M = fmaxf(M, ml_s[k].x);
  for (int k = 0; k < groups; ++k) {
    if (ml_s[k].x == -INFINITY) continue; /* a group without a seen key */
    const float w = __expf(ml_s[k].x - M);
    const float4 ok = o_s[k * quads + q4];
    L += w * ml_s[k].y;
    O.x += w * ok.x, O.y += w * ok.y, O.z += w * ok.z, O.w += w * ok.w;
  }
  int h, i;
  row_head(p, g, chunk * kRows + r, h, i);
  finish_quad<T>(p, b, h, i, q4, M, L, O);
}


/* The rows of the split kernel's work items, merged by the CTAs of a cooperative grid once every
 * split's partial is in the workspace (kMergeGrid): a grid barrier, then CTA c merges rows c,
 * c + CTAs, ... (merge_row_wide: the same sums in the same order as the merge kernel's). No second
 * kernel: its launch, its wait for this grid and the gap before the next call's kernel go. */
template <typename T>
__device__ __forceinline__ void merge_grid(const attn_cuda_decode_params &p, int row_chunks, float4 *o_s,
                                           float2 *ml_s) {
  namespace cg = cooperative_groups;
  cg::this_grid().sync(); /* every partial written and visible */
  const int ctas = (int)(gridDim.x * gridDim.y * gridDim.z);
  const int cta = (int)(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
  const int rows = p.batch * p.heads_kv * row_chunks * kRows;
  for (int w = cta; w < rows; w += ctas) {
    const int item = w / kRows, r = w % kRows;
    if (r >= min(kRows, p.group * p.seqlen_q - item % row_chunks * kRows)) continue; /* no such row */
    merge_row_wide<T>(p, item, row_chunks, r, o_s, ml_s);
    __syncthreads(); /* o_s and ml_s free for the next row */
  }
}

/* How the split kernel's splits are merged: */
enum Merge {
  kMergeNone = 0,    /* one split: it writes out and lse itself */
  kMergeKernel = 1,  /* partials to the workspace, merge_kernel after */
  kMergeCluster = 2, /* the grid's x dimension (the splits) is a cluster: distributed shared memory */
  kMergeGrid = 3,    /* partials to the workspace, then (a cooperative launch) a grid barrier and
                        the CTAs merge the rows between them: merge_grid */
};

/* One (key split, KV heads x row chunk, sequence): grid (splits, Hkv / G * row_chunks, B), G KV
 * heads per CTA (Shape). kBulk: K and V rows arrive by cp.async.bulk (sm_90), each of the first
 * 2 kBN threads one row of K (threads 0 .. kBN - 1) or V of a tile (G heads' rows of a key at
 * once), completing on the stage's mbarrier; else by 16-byte cp.async, each row by G KD / 8
 * consecutive threads. merge: a Merge (not kMergeCluster when G > 1). early_issue (bulk): each
 * iteration issues the next tile's copies before waiting for its own tile. */
template <typename T, int KD, bool kBulk, int G = 1>
__global__ void __launch_bounds__(Shape<KD, G>::kThreads, Shape<KD, G>::kMinBlocks)
    split_kernel(const attn_cuda_decode_params p, int row_chunks, int merge, int early_issue) {
  using S = Shape<KD, G>;
  constexpr int kPitch = S::kPitch, kRowPitch = S::kRowPitch, kStages = S::kStages, kTile = S::kTile;
  constexpr int kCtaWarps = S::kWarps, kCtaThreads = S::kThreads, kHeadWarps = S::kHeadWarps, kBN = S::kBN;
  constexpr uint32_t kPitchB = kPitch * sizeof(T), kRowPitchB = kRowPitch * sizeof(T);
  /* 16-byte copies per row of K or V (G heads); rows per pass */
  constexpr int kChunks = G * KD / 8, kStep = kCtaThreads / kChunks;
  /* rows of a tile per thread (and their block-table entries) */
  constexpr int kPasses = kBulk ? 1 : kBN / kStep;
  static_assert(kBulk || kBN % kStep == 0, "cp.async: whole passes");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *q_s = reinterpret_cast<T *>(smem_raw);                          /* [G][kRows][kPitch] */
  T *kv_s = q_s + G * kRows * kPitch;                                /* [kStages][K, V][kBN][kRowPitch] */
  float *ml_s = reinterpret_cast<float *>(kv_s + kStages * 2 * kTile); /* [kCtaWarps][kRows][m, l] */
  const uint32_t bars = attn_cuda::smem_u32(ml_s + kCtaWarps * kRows * 2); /* [kStages] mbarriers */
  float *o_w = reinterpret_cast<float *>(kv_s); /* after the loop: [kCtaWarps][kRows][kOwPitch] */

  TL_DECLARE;
  TL_STAMP(0); /* the CTA starts */
  const bool wait_late = (p.variant & kVarWaitFirst) == 0;
  /* Launched as a programmatic dependent of whatever ran before on the stream (the previous
   * call's kernels, an append, or the caller's), so that its launch and the placement of its CTAs
   * overlap that kernel's tail: nothing in global memory is touched before that kernel has
   * finished and its writes are visible (q, K, V, the lengths and the table may be its outputs;
   * out may be its input). Shared memory and the barriers are set up before the wait, in that
   * kernel's shadow ("waitfirst": after). */
  if (!wait_late) griddep_wait();
  const int split = blockIdx.x, b = blockIdx.z;
  /* the CTA's KV heads g0 .. g0 + G - 1; this warp's head g (its G-th of the warps) and its
   * 16 keys of a tile (wk) */
  const int g0 = (int)blockIdx.y / row_chunks * G, chunk = (int)blockIdx.y % row_chunks;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int head_of_warp = warp / kHeadWarps, wk = warp % kHeadWarps, g = g0 + head_of_warp;
  const int D = p.d, Dv = p.dv, Tq = p.seqlen_q;
  const int first = chunk * kRows, nrows = min(kRows, p.group * Tq - first);

  /* columns past D or Dv are never copied: they must hold zeros (finite products) */
  if (D < KD || Dv < KD) {
    uint4 *s4 = reinterpret_cast<uint4 *>(smem_raw);
    const int n16 = (int)(sizeof(T) * (G * kRows * kPitch + kStages * 2 * kTile) / 16);
    for (int e = tid; e < n16; e += kCtaThreads) s4[e] = make_uint4(0, 0, 0, 0);
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kBulk) {
    if (tid < kStages) attn_cuda::mbar_init(bars + 8 * tid, 1); /* one arrival: thread 0's expect_tx */
    /* the barriers' initialisation visible to the copy engine */
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
#endif
  if (kBulk || D < KD || Dv < KD) __syncthreads();
  if (wait_late) griddep_wait();
  TL_STAMP(1); /* the previous kernel is done */

  /* the keys the rows can see (the union of their windows), this split's part in whole tiles */
  const int len = seq_len(p, b);
  const int o = p.offset_given ? p.offset : p.align_bottom_right ? len - Tq : 0;
  const int lo = p.window_left >= 0 ? min(len, max(0, o - p.window_left)) : 0;
  int hi = p.window_right >= 0 ? min(len, max(0, o + Tq + p.window_right)) : len;
  if (hi < lo) hi = lo;
  const int per = ((hi - lo + p.splits - 1) / p.splits + kBN - 1) / kBN * kBN;
  const int k0 = min(hi, lo + split * per), k1 = min(hi, k0 + per);
  const int ntiles = (k1 - k0 + kBN - 1) / kBN;

  /* this thread copies column chunk `col` of rows r0, r0 + kStep, ... (cp.async) or, bulk, row r0
   * of K (threads 0 .. kBN - 1) or V (kBN .. 2 kBN - 1); a row is G heads' rows of a key */
  const int r0 = kBulk ? tid % kBN : tid / kChunks, col = kBulk ? 0 : tid % kChunks * 8;
  const T *q = static_cast<const T *>(p.q);
  const T *kp = static_cast<const T *>(p.k), *vp = static_cast<const T *>(p.v);
  {
    constexpr int kQChunks = KD / 8, kQStep = kCtaThreads / kQChunks;
    const int qr0 = tid / kQChunks, qcol = tid % kQChunks * 8;
    if (qcol < D) {
#pragma unroll
      for (int r = qr0; r < G * kRows; r += kQStep) { /* head r / kRows's row r % kRows */
        const int rr = r % kRows;
        const bool ok = rr < nrows;
        int h, i;
        row_head(p, g0 + r / kRows, first + (ok ? rr : 0), h, i);
        attn_cuda::cp_async16(q_s + r * kPitch + qcol,
                              q + (int64_t)b * p.q_b + (int64_t)i * p.q_r + (int64_t)h * p.q_h + qcol, ok);
      }
    }
  }
  attn_cuda::cp_async_commit();

  /* Paged: the pool pages of this thread's rows of the next tile to copy, read from the block
   * table one tile ahead (in the shadow of a tile's arithmetic), so a copy never waits for its
   * table entry. (Every row reads its own entry, most of them L1 hits: copying the entry of the
   * row kStep before when both share a page made each read wait for the previous one to land,
   * and cost paged 16 and 64 13% on the H100.) */
  const PageOf po(p.page_size > 0 ? p.page_size : 1);
  int pages[kPasses] = {}; /* the next tile to issue's */
  auto fetch_pages = [&](int t, int(&pg)[kPasses]) {
    if (p.block_table == nullptr) return;
#pragma unroll
    for (int it = 0; it < kPasses; ++it) {
      const int j = k0 + t * kBN + r0 + it * kStep;
      pg[it] = j < k1 ? page_of(p, po, b, j) : 0;
    }
  };
  auto load_tile = [&](int t, int stage, const int(&pg)[kPasses]) {
    T *ks = kv_s + stage * 2 * kTile, *vs = ks + kTile;
    const int base = k0 + t * kBN;
    if constexpr (kBulk) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      const uint32_t bar = bars + 8 * stage;
      const bool is_k = tid < kBN;
      if (tid == 0)
        attn_cuda::mbar_expect_tx(bar, (uint32_t)(min(kBN, k1 - base) * G * (D + Dv) * (int)sizeof(T)));
      if (tid >= 2 * kBN) return; /* G > 1: more threads than rows */
      const int j = base + r0;
      T *dst = (is_k ? ks : vs) + r0 * kRowPitch;
      if (j < k1) {
        int64_t koff, voff;
        key_offsets(p, po, b, j, g0, pg[0], koff, voff); /* G > 1: heads g0 .. g0 + G - 1 side by side */
        attn_cuda::bulk_load(attn_cuda::smem_u32(dst), is_k ? kp + koff : vp + voff,
                             (uint32_t)(G * (is_k ? D : Dv) * sizeof(T)), bar);
      } else { /* past the split: zeros (a probability of 0 times stale V could be NaN) */
        uint4 *d4 = reinterpret_cast<uint4 *>(dst);
#pragma unroll
        for (int c = 0; c < G * KD / 8; ++c) d4[c] = make_uint4(0, 0, 0, 0);
      }
#else
      (void)ks, (void)vs, (void)base;
      __trap(); /* launch_split takes bulk copies only for a kernel compiled for sm_90 */
#endif
    } else {
#pragma unroll
      for (int it = 0; it < kPasses; ++it) {
        const int r = r0 + it * kStep, j = base + r;
        const bool ok = j < k1; /* rows past the split are zero-filled, never read */
        int64_t koff = 0, voff = 0;
        if (ok) key_offsets(p, po, b, j, g0, pg[it], koff, voff);
        /* G > 1 only where D = Dv = KD: the G heads' rows are one run of G D elements */
        if (col < G * D) attn_cuda::cp_async16(ks + r * kRowPitch + col, kp + koff + col, ok);
        if (col < G * Dv) attn_cuda::cp_async16(vs + r * kRowPitch + col, vp + voff + col, ok);
      }
    }
  };
  if (!(p.variant & kVarTableByStage)) {
    /* the entries of every stage's rows requested at once, then the copies: one round trip to
     * the table before the first copy instead of one per stage ("tablebystage") */
    int ahead[kStages][kPasses] = {};
#pragma unroll
    for (int s = 0; s < kStages; ++s) fetch_pages(s, ahead[s]);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < ntiles) load_tile(s, s, ahead[s]);
      if constexpr (!kBulk) attn_cuda::cp_async_commit();
    }
#pragma unroll
    for (int it = 0; it < kPasses; ++it) pages[it] = ahead[kStages - 1][it];
  } else {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < ntiles) fetch_pages(s, pages), load_tile(s, s, pages);
      if constexpr (!kBulk) attn_cuda::cp_async_commit();
    }
    fetch_pages(kStages - 1, pages);
  }
  if constexpr (kBulk) attn_cuda::cp_async_wait_all(); /* q (the tiles complete on their barriers) */

  /* the two rows of this lane's C fragments (lane / 4 and lane / 4 + 8): diagonal and slope */
  int diag[2];
  float slope[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    int h, i;
    row_head(p, g, first + min((lane >> 2) + 8 * hf, nrows - 1), h, i);
    diag[hf] = i + o;
    slope[hf] = p.alibi != nullptr ? p.alibi[(int64_t)b * p.alibi_b + (int64_t)h * p.alibi_h] : 0.0f;
  }

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float oacc[1][KD / 8][4];
#pragma unroll
  for (int nt = 0; nt < KD / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) oacc[0][nt][e] = 0.0f;

  const uint32_t qa = attn_cuda::smem_u32(q_s + head_of_warp * kRows * kPitch) + attn_cuda::lane_a<T, kPitchB>(lane);
  const float inv_cap = p.softcap > 0.0f ? 1.0f / p.softcap : 0.0f;
  const bool cap_by_exp = (p.variant & kVarTanhExp) != 0;
  for (int t = 0; t < ntiles; ++t) {
    if constexpr (kBulk) {
      /* Each thread waits on the tile's barrier itself, which makes the copies visible to it: the
       * barrier below only frees tile t - 1's stage, so tile t + kStages - 1 can be issued into it
       * first and fly while this one is awaited (a CTA of a few tiles then has kStages of them in
       * flight from its start, not kStages - 1). Zeroed rows past the split were stored at least
       * one barrier before their tile is used. */
      if (early_issue) {
        __syncthreads(); /* tile t - 1's stage is free */
        if (t + kStages - 1 < ntiles) load_tile(t + kStages - 1, (t + kStages - 1) % kStages, pages);
      }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      attn_cuda::mbar_wait(bars + 8 * (t % kStages), (uint32_t)(t / kStages) & 1u); /* tile t landed */
#endif
      if (t == 0) TL_STAMP(2);
      if (!early_issue) {
        __syncthreads();
        if (t + kStages - 1 < ntiles) load_tile(t + kStages - 1, (t + kStages - 1) % kStages, pages);
      }
    } else {
      cp_async_wait<kStages - 2>(); /* tile t (and q) landed for this thread's copies */
      __syncthreads();              /* ... for everyone's; and tile t - 1's stage is free again */
      if (t == 0) TL_STAMP(2);
      if (t + kStages - 1 < ntiles) load_tile(t + kStages - 1, (t + kStages - 1) % kStages, pages);
      attn_cuda::cp_async_commit();
    }
    if (t + kStages < ntiles) fetch_pages(t + kStages, pages); /* its loads land during this tile */

    /* this warp's head's columns of the tile */
    const T *ks = kv_s + (t % kStages) * 2 * kTile + head_of_warp * KD, *vs = ks + kTile;
    /* S = Q K^T for this warp's 16 keys */
    float sacc[1][2][4] = {};
    const uint32_t kb = attn_cuda::smem_u32(ks + wk * 16 * kRowPitch) + attn_cuda::lane_b<T, kRowPitchB>(lane);
#pragma unroll
    for (int kk = 0; kk < KD / 16; ++kk)
      if (kk * 16 < D) attn_cuda::mma_abt<T, 1, 16, kPitchB, kRowPitchB>(sacc, qa + kk * 32, kb + kk * 32);
    /* logits, masks, online softmax; rows 8-15 only when the chunk has them (Hq/Hkv x Tq <= 8:
     * their probabilities stay 0, so their products add nothing) */
    const int jbase = k0 + t * kBN + wk * 16 + (lane & 3) * 2;
    const int halves = nrows > 8 ? 2 : 1;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int hf = e >> 1, j = jbase + nt * 8 + (e & 1);
        if (hf >= halves) {
          sacc[0][nt][e] = 0.0f;
          continue;
        }
        float x = sacc[0][nt][e] * p.scale;
        if (p.alibi != nullptr) x -= slope[hf] * fabsf((float)(diag[hf] - j));
        if (p.softcap > 0.0f) x = p.softcap * (cap_by_exp ? tanh_exp(x * inv_cap) : attn_cuda::tanh_sfu(x * inv_cap));
        const bool seen = j < k1 && (p.window_left < 0 || j >= diag[hf] - p.window_left) &&
                          (p.window_right < 0 || j <= diag[hf] + p.window_right);
        x = seen ? x : -INFINITY;
        sacc[0][nt][e] = x;
        mx[hf] = fmaxf(mx[hf], x);
      }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      if (hf >= halves) continue;
      const float m_new = fmaxf(m[hf], attn_cuda::quad_max(mx[hf]));
      const float alpha = m_new == -INFINITY ? 1.0f : __expf(m[hf] - m_new); /* m = -inf: 0 */
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 2 * hf; e < 2 * hf + 2; ++e) {
          const float pr = m_new == -INFINITY ? 0.0f : __expf(sacc[0][nt][e] - m_new);
          sacc[0][nt][e] = pr;
          sum += pr;
        }
      l[hf] = l[hf] * alpha + sum;
      /* O rescaled only where the row's maximum moved, which after a split's first tiles is rare:
       * 2 KD / 8 multiplies per thread and half, most of a tile's arithmetic besides the products
       * and the softmax, done while the tile holds its stage (Tq = 4's 16 rows take both halves) */
      if (m_new != m[hf]) {
#pragma unroll
        for (int nt = 0; nt < KD / 8; ++nt) oacc[0][nt][2 * hf] *= alpha, oacc[0][nt][2 * hf + 1] *= alpha;
      }
      m[hf] = m_new;
    }
    /* O += P V: P (16 rows x this warp's 16 keys) is an A fragment already */
    uint32_t fa[1][4];
    attn_cuda::pack_a<T, 2>(fa[0], sacc[0], 0);
    const uint32_t vb = attn_cuda::smem_u32(vs + wk * 16 * kRowPitch) + attn_cuda::lane_bt<T, kRowPitchB>(lane);
    attn_cuda::mma_ab_regs<T, 1, KD, kRowPitchB>(oacc, fa, vb, (Dv + 15) / 16);
  }
  if constexpr (!kBulk) attn_cuda::cp_async_wait_all();
  TL_STAMP(3); /* the last tile is done */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  /* the merge kernel (launched as a programmatic dependent) may be scheduled now: its launch
   * overlaps these epilogues, and it waits for this grid's results before reading them */
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  __syncthreads(); /* the tiles' space becomes o_w */

  /* the warps' (m, l, O) to shared memory (O's rows kOwPitch floats apart: the 8 rows of a store
   * in distinct banks) */
  constexpr int kOwPitch = S::kOwPitch;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = (lane >> 2) + 8 * hf;
    const float lr = attn_cuda::quad_sum(l[hf]);
    if ((lane & 3) == 0) ml_s[(warp * kRows + r) * 2] = m[hf], ml_s[(warp * kRows + r) * 2 + 1] = lr;
    float *orow = o_w + (warp * kRows + r) * kOwPitch + (lane & 3) * 2;
#pragma unroll
    for (int nt = 0; nt < KD / 8; ++nt)
      *reinterpret_cast<float2 *>(orow + nt * 8) = make_float2(oacc[0][nt][2 * hf], oacc[0][nt][2 * hf + 1]);
  }
  __syncthreads();

  /* each head's warps merged in warp order; one split: the result, else this split's partial
   * [m, l, -, -, O[Dv]] per head, in the workspace or (kMergeCluster, G = 1) in shared memory
   * after o_w. Rows R = 0 .. G kRows - 1 of the CTA: row R % kRows of head g0 + R / kRows, whose
   * warps are R / kRows * kHeadWarps + 0 .. kHeadWarps - 1. */
  const int stride = Dv + kPartHead;
  auto part_of = [&](int hr) -> float * {
    const int item = (b * p.heads_kv + g0 + hr) * row_chunks + chunk;
    return merge == kMergeNone      ? nullptr
           : merge == kMergeCluster ? o_w + S::kOwFloats
                                    : p.partials + ((int64_t)item * p.splits + split) * kRows * stride;
  };
  auto ml_at = [&](int hr, int k, int r) -> float * { return ml_s + ((hr * kHeadWarps + k) * kRows + r) * 2; };
  if (p.variant & kVarEpilogueFlat) {
    /* every (row, column) element on its own, each thread redoing its row's weights */
    for (int e = tid; e < G * nrows * (Dv + 1); e += kCtaThreads) {
      const int hr = e / (nrows * (Dv + 1)), r = e / (Dv + 1) % nrows, c = e % (Dv + 1);
      float M = -INFINITY;
#pragma unroll
      for (int k = 0; k < kHeadWarps; ++k) M = fmaxf(M, ml_at(hr, k, r)[0]);
      float L = 0.0f, O = 0.0f;
#pragma unroll
      for (int k = 0; k < kHeadWarps; ++k) {
        const float mw = ml_at(hr, k, r)[0];
        if (mw == -INFINITY) continue;
        const float wt = __expf(mw - M);
        L += wt * ml_at(hr, k, r)[1];
        if (c < Dv) O += wt * o_w[((hr * kHeadWarps + k) * kRows + r) * kOwPitch + c];
      }
      float *part = part_of(hr);
      if (merge == kMergeNone) {
        int h, i;
        row_head(p, g0 + hr, first + r, h, i);
        finish<T>(p, b, h, i, c, M, L, O);
      } else if (c < Dv) {
        part[r * stride + kPartHead + c] = O;
      } else {
        part[r * stride] = M, part[r * stride + 1] = L;
      }
    }
  } else {
    /* a row's weights once, by one thread: its maximum M over its head's warps, each warp's
     * weight exp(m_w - M) (0 for a warp that saw no key of the row) and L; then each thread four
     * columns of a row at a time (float4 loads and stores), the rows in passes. The same sums in
     * the same order as the flat loop above. */
    float *wt_s = o_w + S::kOwFloats + kRows * (KD + kPartHead); /* [G kRows][kHeadWarps] */
    float2 *row_s = reinterpret_cast<float2 *>(wt_s + G * kRows * kHeadWarps); /* [G kRows] (M, L) */
    if (tid < G * kRows && tid % kRows < nrows) {
      const int hr = tid / kRows, r = tid % kRows;
      float M = -INFINITY, L = 0.0f;
#pragma unroll
      for (int k = 0; k < kHeadWarps; ++k) M = fmaxf(M, ml_at(hr, k, r)[0]);
#pragma unroll
      for (int k = 0; k < kHeadWarps; ++k) {
        const float mw = ml_at(hr, k, r)[0];
        const float wt = mw == -INFINITY ? 0.0f : __expf(mw - M);
        if (mw != -INFINITY) L += wt * ml_at(hr, k, r)[1];
        wt_s[tid * kHeadWarps + k] = wt;
      }
      row_s[tid] = make_float2(M, L);
      if (merge != kMergeNone) {
        float *part = part_of(hr);
        part[r * stride] = M, part[r * stride + 1] = L;
      }
    }
    __syncthreads();
    const int quads = Dv / 4, per_pass = kCtaThreads / quads, q4 = tid % quads; /* Dv <= 256: per_pass >= 2 */
    for (int R = tid < per_pass * quads ? tid / quads : G * kRows; R < G * kRows; R += per_pass) {
      const int hr = R / kRows, r = R % kRows;
      if (r >= nrows) continue;
      float4 O = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int k = 0; k < kHeadWarps; ++k) {
        if (ml_at(hr, k, r)[0] == -INFINITY) continue;
        const float wt = wt_s[R * kHeadWarps + k];
        const float4 ow =
            *reinterpret_cast<const float4 *>(o_w + ((hr * kHeadWarps + k) * kRows + r) * kOwPitch + 4 * q4);
        O.x += wt * ow.x, O.y += wt * ow.y, O.z += wt * ow.z, O.w += wt * ow.w;
      }
      if (merge == kMergeNone) {
        int h, i;
        row_head(p, g0 + hr, first + r, h, i);
        finish_quad<T>(p, b, h, i, q4, row_s[R].x, row_s[R].y, O);
      } else {
        *reinterpret_cast<float4 *>(part_of(hr) + r * stride + kPartHead + 4 * q4) = O;
      }
    }
  }
  TL_STAMP(4); /* the partial (or the result) is written */
  if (G == 1 && merge == kMergeCluster) merge_cluster<T>(p, b, g0, first, nrows, part_of(0));
  if (merge == kMergeGrid) merge_grid<T>(p, row_chunks, reinterpret_cast<float4 *>(o_w),
                                         reinterpret_cast<float2 *>(o_w) + 2 * kThreads);
  TL_STAMP(5);
  TL_STORE(g_tl_split);
}

/* Merges the splits: grid (B * Hkv * row_chunks) of one CTA per work item, or (wide) (B * Hkv *
 * row_chunks, kRows) of one CTA per row; kThreads threads. On sm_90 it may start before the split
 * kernel has finished (programmatic dependent launch) and waits for its results first. */
template <typename T>
__global__ void __launch_bounds__(kThreads) merge_kernel(const attn_cuda_decode_params p, int row_chunks, int wide) {
  __shared__ float4 o_s[kThreads]; /* merge_row_wide's */
  __shared__ float2 ml_s[kThreads];
  const int item = (int)blockIdx.x, r = (int)blockIdx.y;
  if (wide && r >= min(kRows, p.group * p.seqlen_q - item % row_chunks * kRows)) return; /* no row: no wait */
  TL_DECLARE;
  TL_STAMP(0);
  griddep_wait();
  TL_STAMP(1);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  /* the next kernel (a programmatic dependent: the next call's split kernel) may be placed now;
   * it waits for this grid to finish before it reads or writes anything */
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  if (wide) merge_row_wide<T>(p, item, row_chunks, r, o_s, ml_s);
  else merge_splits<T>(p, item, row_chunks);
  TL_STAMP(2);
  TL_STORE(g_tl_merge);
}

/* The kernel dim of a problem: the smallest of 64, 128, 256 that holds D and Dv. */
int kernel_dim(int d, int dv) {
  const int w = d > dv ? d : dv;
  return w <= 64 ? 64 : w <= 128 ? 128 : 256;
}

size_t smem_bytes(int kd, int heads) {
  if (kd == 128)
    return heads == 8   ? Shape<128, 8>::kSmem
           : heads == 4 ? Shape<128, 4>::kSmem
           : heads == 2 ? Shape<128, 2>::kSmem
                        : Shape<128>::kSmem;
  return kd == 64 ? Shape<64>::kSmem : Shape<256>::kSmem;
}
int min_blocks(int kd, int heads) {
  if (heads > 1) return Shape<128, 2>::kMinBlocks; /* one CTA per SM for every G > 1 */
  return kd == 64 ? Shape<64>::kMinBlocks : kd == 128 ? Shape<128>::kMinBlocks : Shape<256>::kMinBlocks;
}

/* The KV heads per CTA (Shape's G) the split kernel takes for a problem of `batch` sequences whose
 * rows see `keys` keys, head dims d, dv, hkv KV heads, on device `index` under the variant's
 * flags: what "heads1/2/4/8" asks for, else the choice by the call's keys above; then the largest
 * power of two at most that which divides Hkv; 1 unless D = Dv = 128 on sm_90 or later (its
 * shared memory is sm_90's). The plan makes its split count and params.heads from this one
 * answer (attn_cuda_decode_heads); the launch also needs each key's G heads side by side in k
 * and v (heads_per_cta) and takes G = 1 when they are not, with the same split count. */
int planned_heads(int index, int batch, int hkv, int keys, int d, int dv, int flags) {
  int want = requested_heads(flags);
  if (want == 0) {
    const int64_t total = (int64_t)batch * keys;
    want = total >= kHeads4Keys ? 4 : total >= kHeads2Keys ? 2 : 1;
  }
  while (want > 1 && hkv % want != 0) want /= 2;
  if (want == 1 || d != 128 || dv != 128) return 1;
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  return major >= 9 ? want : 1;
}

/* CTAs of the split kernel of head dim kd with `heads` KV heads per CTA that device `index` holds
 * at once: its SMs times the CTAs per SM that the registers (launch bounds) and shared memory (1
 * KiB of it reserved per CTA by the driver) allow; 0 when the device cannot be asked. */
int64_t resident_slots(int index, int kd, int heads) {
  int sms = 0, smem_sm = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, index) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, index) != cudaSuccess ||
      sms < 1) {
    (void)cudaGetLastError();
    return 0;
  }
  int resident = (int)((size_t)smem_sm / (smem_bytes(kd, heads) + 1024));
  if (resident > min_blocks(kd, heads)) resident = min_blocks(kd, heads);
  if (resident < 1) resident = 1;
  return (int64_t)resident * sms;
}

/* The largest cluster of split CTAs device `index` can run (0: none; sm_90 and later), asked once
 * per device and kernel: kMaxClusterSplits where the occupancy calculator places such a cluster,
 * else the portable 8, else 0. */
template <typename T, int KD, bool kBulk> int cluster_limit(int index, int major) {
  static std::atomic<int> known[64]; /* limit + 1 per device; 0: not asked yet */
  std::atomic<int> &slot = known[index & 63];
  const int k = slot.load(std::memory_order_relaxed);
  if (k > 0) return k - 1;
  int limit = 0;
  if (major >= 9 && cudaFuncSetAttribute(split_kernel<T, KD, kBulk>,
                                         cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) {
    for (int size = kMaxClusterSplits; size >= 8 && limit == 0; size /= 2) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(size), cfg.blockDim = dim3(kThreads), cfg.dynamicSmemBytes = Shape<KD>::kSmem;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeClusterDimension;
      attr[0].val.clusterDim.x = size, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
      cfg.attrs = attr, cfg.numAttrs = 1;
      int clusters = 0;
      if (cudaOccupancyMaxActiveClusters(&clusters, split_kernel<T, KD, kBulk>, &cfg) == cudaSuccess &&
          clusters > 0)
        limit = size;
    }
  }
  (void)cudaGetLastError(); /* a refused attribute or query: no clusters, not an error */
  slot.store(limit + 1, std::memory_order_relaxed);
  return limit;
}

/* Launches the split kernel (bulk copies or cp.async, G KV heads per CTA); *merge: how its splits
 * are merged (the caller launches the merge kernel for kMergeKernel). */
template <typename T, int KD, bool kBulk, int G>
attn_status launch_split(const attn_cuda_decode_params *p, dim3 grid, cudaStream_t stream, int row_chunks,
                         int major, const Variant &variant, Merge *merge, char *why, size_t why_size) {
  using S = Shape<KD, G>;
  /* shared memory above 48 KiB is opted into once per device (the attribute is the device's) */
  static std::atomic<uint64_t> opted{0};
  const uint64_t bit = (uint64_t)1 << (p->device_index & 63);
  if ((opted.load(std::memory_order_relaxed) & bit) == 0) {
    ATTN_CUDA_CHECK(cudaFuncSetAttribute(split_kernel<T, KD, kBulk, G>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)S::kSmem));
    opted.fetch_or(bit, std::memory_order_relaxed);
  }
  /* sm_90: a programmatic dependent of the stream's previous kernel; and with 2 to 16 splits whose
   * CTAs all fit on the device at once, one cluster per (sequence, KV head, row chunk) that merges
   * its splits itself. (H100, bench/RESULTS.md: B = 16, Tk = 2048, 2 splits in one wave: 60 us
   * against 67 us with the merge kernel; but 4 splits in two waves: 89 us against 71, since a
   * cluster's CTAs hold their SMs until the slowest of them is done, and are placed together.)
   * More splits in one wave merge in the split kernel after a grid barrier (below): on the H200
   * at B = 1 as fast as the merge kernel (16.9 us at Tk = 8192), 2% faster with the per-element
   * epilogue of before, and one kernel less per call. (G > 1: no cluster merge; the partials of
   * a CTA's G heads go through the workspace.) */
  const bool fits = (int64_t)grid.x * grid.y * grid.z <= resident_slots(p->device_index, KD, G);
  *merge = p->splits == 1 ? kMergeNone
           : G == 1 && variant.cluster && major >= 9 && fits &&
                   p->splits <= cluster_limit<T, KD, kBulk>(p->device_index, major)
               ? kMergeCluster
               : kMergeKernel;
  if (major >= 9) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = dim3(S::kThreads), cfg.dynamicSmemBytes = S::kSmem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    attr[1].id = cudaLaunchAttributeClusterDimension;
    attr[1].val.clusterDim.x = (unsigned)p->splits, attr[1].val.clusterDim.y = 1, attr[1].val.clusterDim.z = 1;
    cfg.attrs = attr, cfg.numAttrs = *merge == kMergeCluster ? 2 : 1;
    if (*merge == kMergeKernel && variant.grid_merge && fits) {
      /* one cooperative grid that merges its own splits (a refused launch, e.g. cooperative with
       * a programmatic dependency, changes nothing: the merge kernel then runs as before) */
      attr[1].id = cudaLaunchAttributeCooperative;
      attr[1].val.cooperative = 1;
      cfg.numAttrs = 2;
      if (cudaLaunchKernelEx(&cfg, split_kernel<T, KD, kBulk, G>, *p, row_chunks, (int)kMergeGrid,
                             variant.early_issue ? 1 : 0) == cudaSuccess) {
        *merge = kMergeGrid;
        return ATTN_STATUS_OK;
      }
      (void)cudaGetLastError();
      cfg.numAttrs = 1;
    }
    ATTN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, split_kernel<T, KD, kBulk, G>, *p, row_chunks, (int)*merge,
                                       variant.early_issue ? 1 : 0));
    return ATTN_STATUS_OK;
  }
  split_kernel<T, KD, kBulk, G><<<grid, S::kThreads, S::kSmem, stream>>>(*p, row_chunks, (int)*merge, 0);
  ATTN_CUDA_CHECK(cudaGetLastError());
  return ATTN_STATUS_OK;
}

/* The split kernel of head dim KD, with bulk copies where they run (sm_90 machine code on an sm_90
 * device, and the variant asks for them). */
template <typename T, int KD>
attn_status launch_split_dim(const attn_cuda_decode_params *p, cudaStream_t stream, int row_chunks, int major,
                             int heads, const Variant &variant, Merge *merge, char *why, size_t why_size) {
  /* The sm_90 paths (programmatic launch, clusters, bulk copies) are in the kernel only when it
   * was compiled for sm_90 or later: a build for older targets alone, run on a Hopper GPU through
   * its PTX, takes the plain launch. (The image the driver picks depends on the device, hence one
   * answer per device.) */
  static std::atomic<int> ptx_version[64];
  int ptx = ptx_version[p->device_index & 63].load(std::memory_order_relaxed);
  if (ptx == 0) {
    cudaFuncAttributes fa;
    ATTN_CUDA_CHECK(cudaFuncGetAttributes(&fa, split_kernel<T, KD, false>));
    ptx = fa.ptxVersion;
    ptx_version[p->device_index & 63].store(ptx, std::memory_order_relaxed);
  }
  if (ptx < 90 && major >= 9) major = 8;
  if (KD != 128 || major < 9) heads = 1; /* G > 1: sm_90 only, where its shared memory fits */
  const dim3 grid(p->splits, p->heads_kv / heads * row_chunks, p->batch);
  if constexpr (KD == 128) {
    if (heads > 1) {
#define ATTN_DECODE_LAUNCH_G(G_)                                                                             \
  return variant.bulk                                                                                        \
             ? launch_split<T, KD, true, G_>(p, grid, stream, row_chunks, major, variant, merge, why, why_size)  \
             : launch_split<T, KD, false, G_>(p, grid, stream, row_chunks, major, variant, merge, why, why_size)
      if (heads == 8) ATTN_DECODE_LAUNCH_G(8);
      if (heads == 4) ATTN_DECODE_LAUNCH_G(4);
      ATTN_DECODE_LAUNCH_G(2);
#undef ATTN_DECODE_LAUNCH_G
    }
  }
  if (major >= 9 && variant.bulk)
    return launch_split<T, KD, true, 1>(p, grid, stream, row_chunks, major, variant, merge, why, why_size);
  return launch_split<T, KD, false, 1>(p, grid, stream, row_chunks, major, variant, merge, why, why_size);
}

/* The KV heads per CTA for this call: the plan's (params.heads), where each key's heads lie side
 * by side in k and v (head strides D and Dv); else 1 (the split count the plan made for G still
 * holds: only the waves' fill differs). */
int heads_per_cta(const attn_cuda_decode_params *p) {
  const int heads = p->heads;
  const bool fits = (heads == 2 || heads == 4 || heads == 8) && p->heads_kv % heads == 0 && p->d == 128 &&
                    p->dv == 128;
  return fits && p->k_h == p->d && p->v_h == p->dv ? heads : 1;
}

/* Whether the merge kernel takes one CTA per work item (its rows four at a time, each thread every
 * split of four columns) rather than one per row (its threads over columns and splits): where the
 * items alone fill half the SMs. Then the per-row form's CTAs (16 per item at Tq = 4) only queue
 * behind one another; with few items, the per-item form runs a chunk's rows and splits one after
 * another. Measured on the H200 (bench/RESULTS.md, "The merge kernel's form"), us per call, paged
 * 16, per row / per item: B = 16 (128 items), Tk = 2048 Tq 1 54.0 / 49.4, Tq 4 75.1 / 61.7; Tk =
 * 8192 155.5 / 150.6, 196.0 / 181.6; B = 32, Tk = 8192 293 / 281, 372 / 336; B = 1 (8 items, the
 * merge kernel forced) 17.0 / 18.6, 19.5 / 34.0. */
bool chunk_merge_pays(int index, int items) {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, index) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return 2 * items >= sms;
}

template <typename T>
attn_status launch(const attn_cuda_decode_params *p, cudaStream_t stream, char *why, size_t why_size) {
  const int row_chunks = attn_cuda_decode_row_chunks(p->group, p->seqlen_q);
  if (p->block_table != nullptr && p->seqlen_new > 0) {
    append_kernel<T><<<dim3(p->batch, p->seqlen_new), 128, 0, stream>>>(*p);
    ATTN_CUDA_CHECK(cudaGetLastError());
  }
  if (p->splits > kMaxSplits) {
    snprintf(why, why_size, "decode: %d key splits, more than the kernel's %d", p->splits, kMaxSplits);
    return ATTN_STATUS_INTERNAL;
  }
  if (p->dv % 8 != 0) { /* cuda.c takes Dv in multiples of 8; the merge reads 4 columns at a time */
    snprintf(why, why_size, "decode: head_dim_v=%d is not a multiple of 8", p->dv);
    return ATTN_STATUS_INTERNAL;
  }
  int major = 0;
  ATTN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, p->device_index));
  const int kd = kernel_dim(p->d, p->dv);
  const Variant variant(p->variant);
  Merge merge = kMergeNone;
  attn_status st =
      kd == 64 ? launch_split_dim<T, 64>(p, stream, row_chunks, major, 1, variant, &merge, why, why_size)
      : kd == 128
          ? launch_split_dim<T, 128>(p, stream, row_chunks, major, heads_per_cta(p), variant, &merge, why, why_size)
          : launch_split_dim<T, 256>(p, stream, row_chunks, major, 1, variant, &merge, why, why_size);
  if (st != ATTN_STATUS_OK || merge != kMergeKernel) return st;
  const int wide = variant.merge_form == kVarMergeWide ? 1
                   : variant.merge_form == kVarMergeChunk
                       ? 0
                       : !chunk_merge_pays(p->device_index, p->batch * p->heads_kv * row_chunks);
  const dim3 mgrid(p->batch * p->heads_kv * row_chunks, wide ? kRows : 1);
  if (major >= 9) { /* programmatic dependent launch: the merge's launch overlaps the splits' tail */
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = mgrid, cfg.blockDim = dim3(kThreads), cfg.dynamicSmemBytes = 0, cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr, cfg.numAttrs = 1;
    if (cudaLaunchKernelEx(&cfg, merge_kernel<T>, *p, row_chunks, wide) == cudaSuccess) return ATTN_STATUS_OK;
    (void)cudaGetLastError(); /* not taken here: the ordinary launch below */
  }
  merge_kernel<T><<<mgrid, kThreads, 0, stream>>>(*p, row_chunks, wide);
  ATTN_CUDA_CHECK(cudaGetLastError());
  return ATTN_STATUS_OK;
}

} // namespace attn_cuda_decode

extern "C" int attn_cuda_decode_variant(void) {
  using namespace attn_cuda_decode;
  const char *e = getenv("ATTN_CUDA_DECODE");
  int flags = 0;
  while (e != nullptr && *e != '\0') { /* whole tokens only: "nocluster" is not "cluster" */
    const char *end = strchr(e, ',');
    const size_t n = end != nullptr ? (size_t)(end - e) : strlen(e);
    for (const VariantToken &t : kVariantTokens)
      if (strlen(t.name) == n && strncmp(e, t.name, n) == 0) flags |= t.flag;
    e = end != nullptr ? end + 1 : nullptr;
  }
  return flags;
}

extern "C" int attn_cuda_decode_row_chunks(int group, int seqlen_q) {
  return (group * seqlen_q + ATTN_CUDA_DECODE_ROWS - 1) / ATTN_CUDA_DECODE_ROWS;
}

extern "C" int attn_cuda_decode_splits(int index, int batch, int heads_kv, int row_chunks,
                                       int keys, int d, int dv, int half_waves, int variant) {
  using namespace attn_cuda_decode;
  const int heads = planned_heads(index, batch, heads_kv, keys, d, dv, variant);
  const int64_t slots = resident_slots(index, kernel_dim(d, dv), heads);
  if (slots == 0) return 1;
  /* the most splits that keep the CTAs within half_waves / 2 full waves (whole waves: a partial
   * last wave would leave SMs idle while it runs), none shorter than kMinSplitKeys */
  const int64_t ctas = (int64_t)batch * (heads_kv / heads) * row_chunks;
  int64_t want = (int64_t)(half_waves > 0 ? half_waves : 2) * slots / (2 * ctas);
  /* With several heads a CTA fills its SM alone (min_blocks), so no second CTA streams while one
   * starts or ends: where that wave gives each row group 2 to 8 splits, two waves' worth run
   * faster. Not at 1 (splitting would add a merge) nor past 8 (the splits are short already).
   * Measured on the H200 (bench/RESULTS.md, "Two waves for the several-head kernel"), splitkv,
   * us, one wave / two: B = 16, Tk = 2048 / 8192 / 32768: 72 / 50, 168 / 144, 533 / 513; B = 64,
   * Tk = 8192 (1 split): 497 / 531; B = 1, Tk = 32768 (33 splits): 42 / 47. */
  if (heads > 1 && want >= 2 && want <= 8) want *= 2;
  int64_t most = (keys + kMinSplitKeys - 1) / kMinSplitKeys;
  if (want > most) want = most;
  if (want > kMaxSplits) want = kMaxSplits;
  return (int)(want < 1 ? 1 : want);
}

extern "C" int attn_cuda_decode_heads(int index, int batch, int heads_kv, int keys, int d, int dv,
                                      int variant) {
  return attn_cuda_decode::planned_heads(index, batch, heads_kv, keys, d, dv, variant);
}

extern "C" size_t attn_cuda_decode_workspace(int batch, int heads_kv, int row_chunks, int splits,
                                             int dv) {
  if (splits <= 1) return 0; /* one split writes the result itself */
  /* the partials [item][split][row][m, l, -, -, O[Dv]] */
  return sizeof(float) * (size_t)batch * heads_kv * row_chunks * splits * ATTN_CUDA_DECODE_ROWS *
         (size_t)(dv + attn_cuda_decode::kPartHead);
}

extern "C" attn_status attn_cuda_decode_forward(const attn_cuda_decode_params *p, int is_bf16,
                                                void *stream, char *why, size_t why_size) {
  int prev = -1;
  ATTN_CUDA_CHECK(cudaGetDevice(&prev));
  if (prev != p->device_index) ATTN_CUDA_CHECK(cudaSetDevice(p->device_index));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  attn_status st = is_bf16 ? attn_cuda_decode::launch<__nv_bfloat16>(p, s, why, why_size)
                           : attn_cuda_decode::launch<__half>(p, s, why, why_size);
  if (prev != p->device_index) (void)cudaSetDevice(prev);
  return st;
}
