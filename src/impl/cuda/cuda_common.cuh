/*
 * src/impl/cuda/cuda_common.cuh - device building blocks shared by the forward and backward kernels:
 * tensor-core instructions (mma.sync m16n8k16 with f32 accumulation, ldmatrix, cp.async), shared
 * memory tile loads, sequence geometry, and the element-wise function of SPEC.md (visibility, bias,
 * ALiBi, soft cap, dropout).
 *
 * Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"): lane = 4 * g + t. A (16x16):
 * a0 = (row g, cols 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..). B (16x8,
 * "col"): b0 = (k 2t..2t+1, col g), b1 = (k 2t+8.., col g). C (16x8 f32): c0,c1 = (g, 2t..2t+1),
 * c2,c3 = (g+8, 2t..2t+1). A C tile of two adjacent n-tiles is exactly an A fragment, which is how
 * probabilities feed the next product without leaving registers.
 *
 * Shared memory tiles are row-major with rows padded by 16 bytes: eight ldmatrix rows then fall in
 * eight distinct 16-byte bank groups, so ldmatrix and cp.async are free of bank conflicts without
 * a swizzle (the padding costs 6% of shared memory at D = 128).
 */
#ifndef ATTN_IMPL_CUDA_CUDA_COMMON_CUH
#define ATTN_IMPL_CUDA_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#define ATTN_HOST_DEVICE __host__ __device__
#include "core/philox.h"
#include "impl/cuda/cuda_params.h"

namespace attn_cuda {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

/* ---- element types ------------------------------------------------------------------------- */

template <typename T> struct Elem;

template <> struct Elem<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
  }
  static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0,
                                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <> struct Elem<__half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
  }
  static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0,
                                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

/* A 16-bit input of any of the bias dtypes as f32. */
__device__ __forceinline__ float load_any(const void *base, int elem, int64_t off) {
  if (elem == ATTN_CUDA_ELEM_F32) return static_cast<const float *>(base)[off];
  if (elem == ATTN_CUDA_ELEM_BF16)
    return __bfloat162float(static_cast<const __nv_bfloat16 *>(base)[off]);
  return __half2float(static_cast<const __half *>(base)[off]);
}

__device__ __forceinline__ void store_any(void *base, int elem, int64_t off, float x) {
  if (elem == ATTN_CUDA_ELEM_F32) static_cast<float *>(base)[off] = x;
  else if (elem == ATTN_CUDA_ELEM_BF16)
    static_cast<__nv_bfloat16 *>(base)[off] = __float2bfloat16_rn(x);
  else static_cast<__half *>(base)[off] = __float2half_rn(x);
}

/* ---- instructions --------------------------------------------------------------------------- */

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm4(uint32_t r[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

__device__ __forceinline__ void ldsm4t(uint32_t r[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

/* The same on a shared-window address: a per-thread base plus a compile-time offset, so the offset
 * becomes the instruction's immediate and no address register per fragment stays live. */
__device__ __forceinline__ void ldsm4(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm4t(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/* 16 bytes global -> shared, asynchronously; zero-filled when !valid (nothing is read then). */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
  cp_async16(smem_u32(dst), src, valid);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

/* ---- products of shared-memory tiles -----------------------------------------------------------
 *
 * Every kernel's matrix products are one of two kinds, each taken one 16-wide k slice at a time
 * (the callers unroll over slices and skip the zero-padded ones). Shared tiles are row-major with
 * a row pitch of kPitch bytes; a lane passes its own ldmatrix address, made from the tile's start
 * plus one of the lane offsets below, so every fragment address is that register plus a
 * compile-time offset (the instruction's immediate). */

/* This lane's ldmatrix.x4 row in a tile read as an A fragment (16 rows x 16 columns). */
template <typename T, uint32_t kPitch> __device__ __forceinline__ uint32_t lane_a(int lane) {
  return (lane & 15) * kPitch + (lane >> 4) * 8 * sizeof(T);
}
/* ... read transposed as an A fragment (16 rows of the tile = the k dim, 16 columns = the rows). */
template <typename T, uint32_t kPitch> __device__ __forceinline__ uint32_t lane_at(int lane) {
  return ((lane & 7) + ((lane >> 4) & 1) * 8) * kPitch + ((lane >> 3) & 1) * 8 * sizeof(T);
}
/* ... read as two B fragments (16 rows of the tile = 16 n columns of B, 16 k columns). */
template <typename T, uint32_t kPitch> __device__ __forceinline__ uint32_t lane_b(int lane) {
  return ((lane & 7) + (lane >> 4) * 8) * kPitch + ((lane >> 3) & 1) * 8 * sizeof(T);
}
/* ... read transposed as two B fragments (16 rows of the tile = the k dim, 16 n columns). */
template <typename T, uint32_t kPitch> __device__ __forceinline__ uint32_t lane_bt(int lane) {
  return ((lane & 7) + ((lane >> 3) & 1) * 8) * kPitch + (lane >> 4) * 8 * sizeof(T);
}

/* acc[m][n] += A B^T over one k slice: A is kMT m-tiles (16 rows each, kPitchA apart) at this
 * lane's address a, B is kN rows at b. Each B fragment feeds kMT mma. (S = Q K^T, dP = dO V^T,
 * and their transposes.) */
template <typename T, int kMT, int kN, uint32_t kPitchA, uint32_t kPitchB>
__device__ __forceinline__ void mma_abt(float (&acc)[kMT][kN / 8][4], uint32_t a, uint32_t b) {
  uint32_t fa[kMT][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) ldsm4(fa[mt], a + mt * 16 * kPitchA);
#pragma unroll
  for (int nn = 0; nn < kN / 16; ++nn) {
    uint32_t fb[4];
    ldsm4(fb, b + nn * 16 * kPitchB);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      Elem<T>::mma(acc[mt][2 * nn], fa[mt], fb[0], fb[1]);
      Elem<T>::mma(acc[mt][2 * nn + 1], fa[mt], fb[2], fb[3]);
    }
  }
}

/* acc[m][n] += A B over one k slice: A is kMT fragments already in registers (probabilities or
 * dS, rounded to T), B is the slice's 16 rows of a [k][n] tile read transposed at this lane's
 * address b, columns 16 * dd for dd < n_valid (the zero-padded ones are skipped). (O += P V,
 * dQ += dS K.) */
template <typename T, int kMT, int kN, uint32_t kPitchB>
__device__ __forceinline__ void mma_ab_regs(float (&acc)[kMT][kN / 8][4], const uint32_t (&fa)[kMT][4],
                                            uint32_t b, int n_valid) {
#pragma unroll
  for (int dd = 0; dd < kN / 16; ++dd) {
    if (dd < n_valid) {
      uint32_t fb[4];
      ldsm4t(fb, b + dd * 16 * sizeof(T));
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        Elem<T>::mma(acc[mt][2 * dd], fa[mt], fb[0], fb[1]);
        Elem<T>::mma(acc[mt][2 * dd + 1], fa[mt], fb[2], fb[3]);
      }
    }
  }
}

/* acc[m][n] += A B over one k slice, A from shared memory too: kMT m-tiles at this lane's address a,
 * read as stored (kTransA = false: rows kPitchA apart) or transposed (the tile holds A^T). (dV +=
 * P^T dO, dK += dS^T Q, and the atomic dQ += dS K.) */
template <typename T, int kMT, int kN, uint32_t kPitchA, uint32_t kPitchB, bool kTransA = false>
__device__ __forceinline__ void mma_ab(float (&acc)[kMT][kN / 8][4], uint32_t a, uint32_t b, int n_valid) {
  uint32_t fa[kMT][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    if constexpr (kTransA) ldsm4t(fa[mt], a + mt * 16 * sizeof(T));
    else ldsm4(fa[mt], a + mt * 16 * kPitchA);
  }
  mma_ab_regs<T, kMT, kN, kPitchB>(acc, fa, b, n_valid);
}

/* The A fragment of key slice kk from the f32 C fragments of two adjacent n-tiles, rounded to T
 * (the C layout of n-tiles 2kk, 2kk + 1 is exactly an A fragment). */
template <typename T, int kNT>
__device__ __forceinline__ void pack_a(uint32_t (&fa)[4], const float (&c)[kNT][4], int kk) {
  fa[0] = Elem<T>::pack(c[2 * kk][0], c[2 * kk][1]);
  fa[1] = Elem<T>::pack(c[2 * kk][2], c[2 * kk][3]);
  fa[2] = Elem<T>::pack(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  fa[3] = Elem<T>::pack(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

/* Stores a warp's f32 accumulators (kMT m-tiles of C fragments, kNT n-tiles of 8 columns) as rows
 * of T, each row times its factor: element (r, c) of the warp's tile goes to g[r * row_stride + c].
 * Rows r >= rows_left are past the sequence and skipped, and with kCheckWidth so are columns
 * c >= width_left (the zero padding of a smaller head dim). The forward's O, the dQ kernel's dQ
 * and the dK/dV kernel's dK and dV. */
template <typename T, int kMT, int kNT, bool kCheckWidth>
__device__ __forceinline__ void store_rows(T *g, int64_t row_stride, const float (&acc)[kMT][kNT][4],
                                           const float (&factor)[kMT][2], int lane, int rows_left,
                                           int width_left) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = mt * 16 + (lane >> 2) + hf * 8;
      if (r >= rows_left) continue;
      T *row = g + r * row_stride;
      const float f = factor[mt][hf];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const int c = nt * 8 + (lane & 3) * 2;
        if (kCheckWidth && c >= width_left) continue;
        *reinterpret_cast<uint32_t *>(row + c) = Elem<T>::pack(acc[mt][nt][2 * hf] * f, acc[mt][nt][2 * hf + 1] * f);
      }
    }
}

/* Loads rows [0, kRows) x columns [0, kD) of a token tensor into a padded shared tile. Rows at or
 * past rows_valid and columns at or past width are zero, so padding never feeds NaN into a
 * product. `fallback` is any valid address (never read). */
template <int kRows, int kD, int kThreads, typename T>
__device__ __forceinline__ void load_tile(T *s, const T *g, int64_t row_stride, int rows_valid,
                                          int width, const void *fallback, int tid) {
  constexpr int kChunks = kD / 8, kTotal = kRows * kChunks, kS = kD + 8;
#pragma unroll
  for (int it = 0; it < (kTotal + kThreads - 1) / kThreads; ++it) {
    int c = tid + it * kThreads;
    if (kTotal % kThreads != 0 && c >= kTotal) break;
    int r = c / kChunks, ch = c % kChunks;
    bool ok = r < rows_valid && ch * 8 < width;
    const void *src = ok ? static_cast<const void *>(g + r * row_stride + ch * 8) : fallback;
    cp_async16(s + r * kS + ch * 8, src, ok);
  }
}

/* Copies [kRows, kD] tiles of a token tensor into padded shared tiles (rows kD + 8 elements) like
 * load_tile, with this thread's offsets computed once: when a pass of kThreads copies covers whole
 * rows, the thread always copies column chunk `ch` of rows r0, r0 + kStep, ... (an add per row);
 * otherwise it falls back to load_tile. Rows at or past rows_valid and columns at or past width are
 * zero; `g` (the tile's first row) is the address given to the skipped copies, never read. */
template <int kRows, int kD, int kThreads, typename T> struct TileCopy {
  static constexpr int kChunks = kD / 8, kS = kD + 8;
  static constexpr bool kWhole = kThreads % kChunks == 0 && kRows % (kThreads / kChunks) == 0;
  static constexpr int kStep = kWhole ? kThreads / kChunks : 1, kPasses = kRows / kStep;
  int r0, col, tid;
  int64_t goff;
  uint32_t soff;
  __device__ __forceinline__ TileCopy(int tid_, int64_t row_stride) : tid(tid_) {
    r0 = tid / kChunks, col = (tid % kChunks) * 8;
    goff = r0 * row_stride + col;
    soff = (uint32_t)((r0 * kS + col) * sizeof(T));
  }
  __device__ __forceinline__ void operator()(uint32_t s, T *s_ptr, const T *g, int64_t row_stride,
                                             int rows_valid, int width) const {
    if constexpr (kWhole) {
      const T *src = g + goff;
      if (rows_valid >= kRows && width >= kD) { /* the common whole tile: no test per row */
#pragma unroll
        for (int it = 0; it < kPasses; ++it) {
          cp_async16(s + soff + (uint32_t)(it * kStep * kS * sizeof(T)), src, true);
          src += kStep * row_stride;
        }
      } else {
        const int rows_left = col < width ? rows_valid - r0 : 0;
#pragma unroll
        for (int it = 0; it < kPasses; ++it) {
          const bool ok = it * kStep < rows_left;
          cp_async16(s + soff + (uint32_t)(it * kStep * kS * sizeof(T)), ok ? src : g, ok);
          src += kStep * row_stride;
        }
      }
    } else {
      load_tile<kRows, kD, kThreads>(s_ptr, g, row_stride, rows_valid, width, g, tid);
    }
  }
};

/* One TileCopy where the tile is copied once (its offsets computed on the spot). */
template <int kRows, int kD, int kThreads, typename T>
__device__ __forceinline__ void copy_tile(T *s, const T *g, int64_t row_stride, int rows_valid, int width,
                                          int tid) {
  TileCopy<kRows, kD, kThreads, T>(tid, row_stride)(smem_u32(s), s, g, row_stride, rows_valid, width);
}

/* 2^x on the special-function unit (-inf -> 0); what exp2f becomes under --use_fast_math. */
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/* 1 / x on the special-function unit (relative error 2^-23). */
__device__ __forceinline__ float rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/* tanh on the special-function unit (sm_75 and up; relative error about 2^-11, PTX ISA): one
 * instruction. A capped logit cap * tanh(y) is then within 2^-11 of itself, a quarter of what
 * rounding the score to 16 bits costs the naive computation of SPEC's tolerance rule (2^-9), so
 * the 16-bit forwards whose cap bounds their speed take it: the decode kernels, and the sm90
 * forward's kCapTanh. Not for a derivative (1 - t * t loses everything once |t| is near 1). */
__device__ __forceinline__ float tanh_sfu(float y) {
  float t;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(t) : "f"(y));
  return t;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

__host__ __device__ __forceinline__ int floor_div(int a, int b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

/* ---- geometry --------------------------------------------------------------------------------- */

/* Batch entry b: its first q and k rows in the tensors (packed varlen) and its real lengths. The
 * lengths live on the device and were not validated, so they are clamped to the tensors here. */
struct Seq {
  int64_t q0, k0;
  int len_q, len_k;
};

__device__ __forceinline__ Seq seq_of(const attn_cuda_params &p, int b) {
  Seq s{0, 0, p.seqlen_q, p.seqlen_k};
  if (p.varlen == ATTN_CUDA_VARLEN_PACKED) {
    const int64_t q0 = min(max((int64_t)p.cu_q[b], (int64_t)0), p.total_q);
    const int64_t q1 = min(max((int64_t)p.cu_q[b + 1], q0), p.total_q);
    const int64_t k0 = min(max((int64_t)p.cu_k[b], (int64_t)0), p.total_k);
    const int64_t k1 = min(max((int64_t)p.cu_k[b + 1], k0), p.total_k);
    s.q0 = q0, s.k0 = k0;
    s.len_q = (int)min(q1 - q0, (int64_t)p.seqlen_q);
    s.len_k = (int)min(k1 - k0, (int64_t)p.seqlen_k);
  } else if (p.varlen == ATTN_CUDA_VARLEN_PADDED) {
    s.len_q = min(max(p.seqlens_q[b], 0), p.seqlen_q);
    s.len_k = min(max(p.seqlens_k[b], 0), p.seqlen_k);
  }
  return s;
}

/* What one (batch, query head) shares: the KV head, the lengths and the alignment offset o. */
struct Head {
  int b, h, g, len_q, len_k, o;
};

__device__ __forceinline__ Head head_of(const attn_cuda_params &p, const Seq &s, int b, int h) {
  Head r;
  r.b = b, r.h = h, r.g = h / p.group, r.len_q = s.len_q, r.len_k = s.len_k;
  r.o = p.offset_given ? p.offset : p.align_bottom_right ? s.len_k - s.len_q : 0;
  return r;
}

/* Key blocks [lo, hi) that rows [m0, m_last] can see through the causal / window band. */
__device__ __forceinline__ void key_block_range(const attn_cuda_params &p, const Head &r, int m0,
                                                int m_last, int kBN, int &lo, int &hi) {
  lo = 0, hi = (r.len_k + kBN - 1) / kBN;
  if (p.window_left >= 0) lo = max(0, floor_div(m0 + r.o - p.window_left, kBN));
  if (p.window_right >= 0) hi = min(hi, floor_div(m_last + r.o + p.window_right, kBN) + 1);
}

/* Query blocks [lo, hi) whose rows can see keys [n0, n_last]. */
__device__ __forceinline__ void query_block_range(const attn_cuda_params &p, const Head &r, int n0,
                                                  int n_last, int kBM, int &lo, int &hi) {
  lo = 0, hi = (r.len_q + kBM - 1) / kBM;
  if (p.window_right >= 0) lo = max(0, floor_div(n0 - r.o - p.window_right, kBM));
  if (p.window_left >= 0) hi = min(hi, floor_div(n_last - r.o + p.window_left, kBM) + 1);
}

/* Whether every (i, j) of rows [m0, m_last] and keys [n0, n0 + kBN) is visible under the band and
 * the key length (masks and segment ids aside): such a tile needs no element-wise test. */
__device__ __forceinline__ bool band_full(const attn_cuda_params &p, const Head &r, int m0,
                                          int m_last, int n0, int kBN) {
  if (n0 + kBN > r.len_k) return false;
  if (p.window_left >= 0 && n0 < m_last + r.o - p.window_left) return false;
  if (p.window_right >= 0 && n0 + kBN - 1 > m0 + r.o + p.window_right) return false;
  return true;
}

/* Key blocks [lo, hi) of [n_lo, n_hi) that band_full calls fully visible from rows [m0, m_last]:
 * one contiguous run (the band's edges are monotone), empty when lo == hi. */
__device__ __forceinline__ void full_block_range(const attn_cuda_params &p, const Head &r, int m0,
                                                 int m_last, int kBN, int n_lo, int n_hi, int &lo,
                                                 int &hi) {
  lo = n_lo, hi = min(n_hi, r.len_k / kBN);
  if (p.window_left >= 0) lo = max(lo, -floor_div(-(m_last + r.o - p.window_left), kBN));
  if (p.window_right >= 0) hi = min(hi, floor_div(m0 + r.o + p.window_right + 1, kBN));
  if (hi < lo) hi = lo;
}

/* ---- the function of SPEC.md, one element ---------------------------------------------------- */

/* Step 3: whether key j is visible from row i (in-sequence positions). */
__device__ __forceinline__ bool visible(const attn_cuda_params &p, const Head &r, int i, int j) {
  if (i >= r.len_q || j >= r.len_k) return false;
  int diag = i + r.o;
  if (p.window_left >= 0 && j < diag - p.window_left) return false;
  if (p.window_right >= 0 && j > diag + p.window_right) return false;
  if (p.mask != nullptr &&
      p.mask[r.b * p.mask_s[0] + r.h * p.mask_s[1] + i * p.mask_s[2] + j * p.mask_s[3]] == 0)
    return false;
  if (p.q_seg != nullptr) {
    int qs = p.q_seg[r.b * p.qseg_b + i * p.qseg_r];
    int ks = p.kv_seg[r.b * p.kseg_b + j * p.kseg_r];
    if (qs < 0 || qs != ks) return false;
  }
  return true;
}

/* Step 3 for a run without masks or segment ids: the band and the lengths only. */
__host__ __device__ __forceinline__ bool visible_band(const attn_cuda_params &p, const Head &r, int i, int j) {
  if (i >= r.len_q || j >= r.len_k) return false;
  int diag = i + r.o;
  if (p.window_left >= 0 && j < diag - p.window_left) return false;
  if (p.window_right >= 0 && j > diag + p.window_right) return false;
  return true;
}

/* visible_band's keys of row i as one range: j is visible iff lo <= j < hi (the band's edges are
 * monotone in j). A kernel that tests a row's many keys compares each with two bounds this way
 * instead of evaluating the band per element (fewer live registers in the sm90 fp8 forward). */
__host__ __device__ __forceinline__ void visible_band_keys(const attn_cuda_params &p, const Head &r,
                                                           int i, int &lo, int &hi) {
  const int64_t diag = (int64_t)i + r.o;
  int64_t l = 0, h = i < r.len_q ? r.len_k : 0;
  if (p.window_left >= 0 && diag - p.window_left > l) l = diag - p.window_left;
  if (p.window_right >= 0 && diag + p.window_right + 1 < h) h = diag + p.window_right + 1;
  lo = (int)l, hi = (int)(h > l ? h : l);
}

/* visible_band's rows that see key j as one range: i sees j iff lo <= i < hi (the transposed
 * form of visible_band_keys, for a kernel whose thread holds a few keys of many rows: the sm90
 * backward tests each score with two comparisons instead of evaluating the band, and without the
 * branches that kept its exponentials from being pipelined). */
__host__ __device__ __forceinline__ void visible_band_queries(const attn_cuda_params &p, const Head &r,
                                                              int j, int &lo, int &hi) {
  int64_t l = 0, h = j < r.len_k ? r.len_q : 0;
  /* j >= i + o - window_left and j <= i + o + window_right */
  if (p.window_right >= 0 && (int64_t)j - r.o - p.window_right > l) l = (int64_t)j - r.o - p.window_right;
  if (p.window_left >= 0 && (int64_t)j - r.o + p.window_left + 1 < h) h = (int64_t)j - r.o + p.window_left + 1;
  lo = (int)l, hi = (int)(h > l ? h : l);
}

/* Whether a run needs the feature kernels: any per-element function, dropout, sinks, or head
 * dims below the kernel's (zero-padded columns). */
__host__ __device__ __forceinline__ bool needs_features(const attn_cuda_params &p, int kd) {
  return p.elementwise || p.dropout_p > 0.f || p.num_sinks > 0 || p.d != kd || p.dv != kd ||
         p.dbias != nullptr || p.dsinks != nullptr;
}

/* min(a, 0) keeping NaN (fminf would drop it): the exponent of P = exp(x - lse), at most 1 also
 * where the f32 lse of logits of 1e25 is off by 1e18 and P would be infinite (issue 19). */
__device__ __forceinline__ float at_most_zero(float a) { return a > 0.f ? 0.f : a; }

/* The soft cap's derivative 1 - tanh^2(y) as 4u / (1 + u)^2 with u = exp(-2|y|): 1 - t * t cancels
 * once tanh(y) is near +-1 (not one correct digit in f32 at |y| = 10; issue 19). */
__device__ __forceinline__ float softcap_slope(float y) {
  const float u = expf(-2.f * fabsf(y));
  return 4.f * u / ((1.f + u) * (1.f + u));
}

/* Steps 1-2: the logit of a visible key from the raw dot product; *y gets the soft cap's argument
 * x_pre / cap (its derivative is softcap_slope(*y)). */
__device__ __forceinline__ float logit(const attn_cuda_params &p, const Head &r, int i, int j,
                                       float dot, float *y) {
  float x = dot * p.scale;
  if (p.bias != nullptr) {
    int head = p.bias_head_mode == 2 ? r.g : r.h;
    x += load_any(p.bias, p.bias_elem,
                  r.b * p.bias_s[0] + head * p.bias_s[1] + i * p.bias_s[2] + j * p.bias_s[3]);
  }
  if (p.alibi != nullptr) x -= p.alibi[r.b * p.alibi_b + r.h * p.alibi_h] * fabsf((float)(i + r.o - j));
  if (p.softcap > 0.f) {
    *y = x / p.softcap;
    x = p.softcap * tanhf(*y);
  }
  return x;
}

/* Steps 4-5: the sinks of query head h as a row's starting point, counted once: their max (log2
 * units) and the sum of exp(a_t - max); -inf and 0 without sinks. */
__device__ __forceinline__ void sink_stats(const attn_cuda_params &p, int h, float &max_log2, float &sum) {
  const float *sk = p.sinks + h * p.sinks_h;
  float mx = -INFINITY;
  for (int t = 0; t < p.num_sinks; ++t) mx = fmaxf(mx, sk[t * p.sinks_t]);
  sum = 0.f;
  if (mx != -INFINITY)
    for (int t = 0; t < p.num_sinks; ++t) sum += exp2f((sk[t * p.sinks_t] - mx) * kLog2e);
  max_log2 = mx * kLog2e;
}

/* Step 6: the four Philox words of (b, h, i, j >> 2), at the run's place in a larger problem
 * (pos_*: 0 for a problem of its own; pos_j0 % 4 == 0 keeps j's group of four). */
__device__ __forceinline__ void philox_words(const attn_cuda_params &p, int b, int h, int i, int j,
                                             uint32_t r[4]) {
  const uint32_t key[2] = {(uint32_t)p.seed, (uint32_t)(p.seed >> 32)};
  const uint32_t ctr[4] = {(uint32_t)i + p.pos_i0, ((uint32_t)j + p.pos_j0) >> 2, (uint32_t)h + p.pos_h0,
                           (uint32_t)b + p.pos_b0};
  attn_philox4x32_10(ctr, key, r);
}

/* ---- what the feature-free kernels take ------------------------------------------------------ */

/* The soft cap of the feature-free kernels (kCap), from the raw dot product: y = x_pre / cap,
 * u = e^(-2|y|), tanh(y) = sign(y) (1 - u) / (1 + u), two special-function instructions (ex2,
 * rcp) in place of tanhf's full-precision path and an IEEE division per score. u is within ~2^-22
 * relative, so tanh within ~1.2e-7 absolute and the logit within cap * 1.2e-7 wherever y is
 * (P within that, relative, plus a few ulps); caps above kMaxCap (no model's: Gemma's is 50) take
 * the feature kernels' tanhf, so the error stays ~2.5e-4, an eighth of bf16's rounding of P. The
 * derivative 1 - tanh^2 = 4u / (1 + u)^2 reuses u and has no cancellation near |tanh| = 1
 * (issue 19). A tiny cap's scale / cap is held to FLT_MAX, so a zero dot product stays 0. */
struct SoftCap {
  static constexpr float kMaxCap = 1024.f;
  float in, out; /* y = dot * in (scale / cap); the logit in log2 units = tanh(y) * out */
  __device__ __forceinline__ explicit SoftCap(const attn_cuda_params &p)
      : in(copysignf(fminf(fabsf(p.scale / p.softcap), 3.40282347e38f), p.scale)), out(p.softcap * kLog2e) {}
  /* the capped logit in log2 units; *slope (when asked) gets d tanh(y) / dy. out (1 - u) is one
   * FMA; eight instructions in all, two of them on the special-function unit. */
  __device__ __forceinline__ float logit2(float dot, float *slope = nullptr) const {
    const float y = dot * in;
    const float u = ex2(fabsf(y) * (-2.f * kLog2e));
    const float r = rcp(1.f + u);
    if (slope != nullptr) *slope = 4.f * u * r * r;
    return copysignf(fmaf(-u, out, out), y) * r;
  }
  /* tanh(y) by tanh_sfu, as the 16-bit sm90 forwards' kCapTanh computes their logits (so that P
   * recomputed from their lse sees the same logit), and *slope = d tanh(y) / dy = u (1 + |tanh|)^2
   * (u as in logit2: 1 + |tanh| = 2 / (1 + u)), relative error 2^-10 where tanh's is 2^-11, with
   * no cancellation near |tanh| = 1. Two special-function ops, four FP32 ones; the logit in log2
   * units is the result times out. */
  __device__ __forceinline__ float tanh2(float dot, float *slope) const {
    const float y = dot * in;
    const float t = tanh_sfu(y);
    const float u = ex2(fabsf(y) * (-2.f * kLog2e));
    const float w = 1.f + fabsf(t);
    *slope = u * w * w;
    return t;
  }
};

/* Whether a run needs the sm80 kernels with every feature compiled in (kFeat): a per-element
 * function other than the soft cap (bias, mask, ALiBi, segment ids: the pointers the feature
 * kernels test), a cap above SoftCap::kMaxCap, dropout, dbias, or head dims below the kernel's
 * (zero-padded columns). The feature-free kernels take the rest: sinks only seed each row's max
 * and sum in the forward (the backward recomputes P from lse, which has them, and dsinks is a
 * kernel of its own), and the soft cap has their kCap copy. Routing those two to the feature
 * kernels (one m-tile per warp, a test and a call per element, tanhf and a division per score)
 * cost 2.3x and 10x the plain run's time on an H100 (issue 13). needs_features stays the sm90
 * forward's test. */
__host__ __device__ __forceinline__ bool needs_generic(const attn_cuda_params &p, int kd) {
  return p.bias != nullptr || p.mask != nullptr || p.alibi != nullptr || p.q_seg != nullptr ||
         p.softcap > SoftCap::kMaxCap || p.dropout_p > 0.f || p.d != kd || p.dv != kd || p.dbias != nullptr;
}

} // namespace attn_cuda

#endif /* ATTN_IMPL_CUDA_CUDA_COMMON_CUH */
