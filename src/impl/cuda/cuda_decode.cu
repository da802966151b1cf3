/*
 * src/impl/cuda/cuda_decode.cu - split-KV decode (flash-decoding) for dense and paged KV caches.
 *
 * Decode reads every visible K and V row once and does little arithmetic with it, so the kernels
 * are built to keep the memory system busy, not the tensor cores:
 *   - a CTA (4 warps) takes one (sequence b, KV head g, chunk of up to 16 query rows, key split);
 *     the rows are the Hq/Hkv query heads times Tq queries of head g (GQA packing), held in shared
 *     memory as f32, so each K and V row is read from memory once for all of them;
 *   - the split's keys go to the warps 32 at a time: for scores a lane owns a key (its row read
 *     with 16-byte loads, its addresses computed once: block table and page for a paged cache) and
 *     holds that key's score for every row; an online softmax per warp (max and sum by shuffles);
 *     for P V a lane owns Dv/32 columns and walks the tile's 32 keys, P read from shared memory;
 *   - the warps' (m, l, O) merge in shared memory, and each CTA writes its split's partial result;
 *     a second kernel merges the splits through their maxima, adds the sinks once, and writes out
 *     (the dtype) and lse (f32);
 *   - the key range of a sequence is the union of its rows' windows, so pages wholly outside a
 *     sliding window are never read; sequences of length 0 give out = 0, lse = -inf (or the sinks');
 *   - with seqlen_new > 0 a first kernel writes k_new / v_new into their pages.
 * The number of splits is chosen from the SM count (eight CTAs per SM where the keys allow).
 * Features: GQA/MQA, causal, sliding windows, soft cap, ALiBi, sinks, lse; f16 and bf16; D and Dv
 * multiples of 8 up to 256.
 */
#include "impl/cuda/cuda_check.cuh"
#include "impl/cuda/cuda_decode.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace attn_cuda_decode {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = ATTN_CUDA_DECODE_ROWS;

template <typename T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <> __device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

/* n (4 or 8) consecutive elements as floats; p aligned to n * 2 bytes. */
template <typename T, int N> __device__ __forceinline__ void load_n(const T *p, float *out) {
  if constexpr (N == 8) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4 *>(p));
    const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = to_float(e[i]);
  } else {
    const uint2 raw = __ldg(reinterpret_cast<const uint2 *>(p));
    const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = to_float(e[i]);
  }
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

/* Keys of sequence b: the cache plus the appended rows (paged), else seqlen_k. */
__device__ __forceinline__ int seq_len(const attn_cuda_decode_params &p, int b) {
  return p.block_table != nullptr ? p.cache_seqlens[b] + p.seqlen_new : p.seqlen_k;
}

/* Element offset of (key j, head g, element 0) of sequence b in k (is_v = 0) or v. */
__device__ __forceinline__ int64_t key_offset(const attn_cuda_decode_params &p, int b, int j, int g,
                                              int is_v) {
  const int64_t sb = is_v ? p.v_b : p.k_b, sr = is_v ? p.v_r : p.k_r, sh = is_v ? p.v_h : p.k_h;
  if (p.block_table == nullptr) return (int64_t)b * sb + (int64_t)j * sr + (int64_t)g * sh;
  const int page = p.block_table[(int64_t)b * p.bt_b + (int64_t)(j / p.page_size) * p.bt_p];
  return (int64_t)page * sb + (int64_t)(j % p.page_size) * sr + (int64_t)g * sh;
}

/* Writes k_new, v_new into their pages: grid (B, seqlen_new). */
template <typename T> __global__ void append_kernel(attn_cuda_decode_params p) {
  const int b = blockIdx.x, t = blockIdx.y;
  const int j = p.cache_seqlens[b] + t;
  T *k = const_cast<T *>(static_cast<const T *>(p.k));
  T *v = const_cast<T *>(static_cast<const T *>(p.v));
  const T *kn = static_cast<const T *>(p.k_new), *vn = static_cast<const T *>(p.v_new);
  for (int e = threadIdx.x; e < p.heads_kv * p.d; e += blockDim.x) {
    const int g = e / p.d, d = e % p.d;
    k[key_offset(p, b, j, g, 0) + d] = kn[(int64_t)b * p.kn_b + (int64_t)t * p.kn_r + (int64_t)g * p.kn_h + d];
  }
  for (int e = threadIdx.x; e < p.heads_kv * p.dv; e += blockDim.x) {
    const int g = e / p.dv, d = e % p.dv;
    v[key_offset(p, b, j, g, 1) + d] = vn[(int64_t)b * p.vn_b + (int64_t)t * p.vn_r + (int64_t)g * p.vn_h + d];
  }
}

/* The rows of a CTA: row r of the chunk is row first + r of the group * Tq rows of its KV head,
 * (head g * group + (first + r) / Tq, query (first + r) % Tq). */
struct RowMap {
  int nrows; /* rows of this chunk (<= kRows) */
  int first;
};

/* One (key split, KV head x row chunk, sequence): grid (splits, Hkv * row_chunks, B). DVL: Dv
 * columns per lane (4: Dv <= 128, 8: Dv <= 256); ROWS: the register arrays' rows (4, 8 or 16, at
 * least the chunk's), so the common Hq/Hkv = 4, Tq = 1 keeps few registers per row. */
template <typename T, int DVL, int ROWS>
__global__ void __launch_bounds__(kThreads) split_kernel(attn_cuda_decode_params p, int row_chunks) {
  extern __shared__ float smem[];
  const int split = blockIdx.x, b = blockIdx.z;
  const int g = blockIdx.y / row_chunks, chunk = blockIdx.y % row_chunks;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int D = p.d, Dv = p.dv, Tq = p.seqlen_q;
  const int rows_total = p.group * Tq;
  RowMap rm;
  rm.first = chunk * kRows;
  rm.nrows = min(kRows, rows_total - rm.first);

  float *q_s = smem;                                /* [kRows][D] */
  float *p_s = q_s + kRows * D;                     /* [kWarps][kRows][32] */
  float *o_s = p_s + kWarps * kRows * 32;           /* [kRows][Dv] */
  float *ml_s = o_s + kRows * Dv;                   /* [kWarps][kRows][2] */

  const int len = seq_len(p, b);
  const int o = p.align_bottom_right ? len - Tq : 0;
  int lo = p.window_left >= 0 ? max(0, o - p.window_left) : 0;
  int hi = p.window_right >= 0 ? min(len, o + Tq - 1 + p.window_right + 1) : len;
  if (hi < lo) hi = lo;
  const int per = ((hi - lo + p.splits - 1) / p.splits + 31) / 32 * 32;
  const int k0 = min(hi, lo + split * per), k1 = min(hi, k0 + per);

  /* q rows, scaled, as f32; o_s zeroed */
  const T *q = static_cast<const T *>(p.q);
  for (int e = threadIdx.x; e < kRows * D; e += kThreads) {
    const int r = e / D, d = e % D;
    float x = 0.0f;
    if (r < rm.nrows) {
      const int rr = rm.first + r, h = g * p.group + rr / Tq, i = rr % Tq;
      x = p.scale * to_float(q[(int64_t)b * p.q_b + (int64_t)i * p.q_r + (int64_t)h * p.q_h + d]);
    }
    q_s[e] = x;
  }
  for (int e = threadIdx.x; e < kRows * Dv; e += kThreads) o_s[e] = 0.0f;
  __syncthreads();

  /* per row, in every lane: running max and sum; per lane: its Dv columns of O */
  float m[ROWS], l[ROWS], acc[ROWS][DVL];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    m[r] = -INFINITY, l[r] = 0.0f;
#pragma unroll
    for (int e = 0; e < DVL; ++e) acc[r][e] = 0.0f;
  }

  const T *kp = static_cast<const T *>(p.k), *vp = static_cast<const T *>(p.v);
  float *pw = p_s + warp * kRows * 32;
  for (int tile = k0 + warp * 32; tile < k1; tile += kWarps * 32) {
    const int j = tile + lane;
    const bool valid = j < k1;
    const int64_t koff = valid ? key_offset(p, b, j, g, 0) : 0;
    const int64_t voff = valid ? key_offset(p, b, j, g, 1) : 0;
    float s[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) s[r] = 0.0f;
    if (valid) {
      /* 64 bytes of the key per step, four 16-byte loads issued before any is used, so each lane
       * keeps several requests in flight (decode is bound by memory latency times parallelism) */
      for (int d0 = 0; d0 < D; d0 += 32) {
        uint4 raw[4];
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (d0 + 8 * u < D) raw[u] = __ldg(reinterpret_cast<const uint4 *>(kp + koff + d0 + 8 * u));
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int d = d0 + 8 * u;
          if (d >= D) break;
          const T *e = reinterpret_cast<const T *>(&raw[u]);
          float kf[8];
#pragma unroll
          for (int i = 0; i < 8; ++i) kf[i] = to_float(e[i]);
#pragma unroll
          for (int r = 0; r < ROWS; ++r) {
            if (r < rm.nrows) {
              const float4 qa = *reinterpret_cast<const float4 *>(q_s + r * D + d);
              const float4 qb = *reinterpret_cast<const float4 *>(q_s + r * D + d + 4);
              s[r] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] +
                      qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
            }
          }
        }
      }
    }
    /* logits, masks, online softmax; P of this tile to shared memory */
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      if (r >= rm.nrows) continue; /* (not break: the loop must unroll to keep s, m, l in registers) */
      const int rr = rm.first + r, h = g * p.group + rr / Tq, diag = rr % Tq + o;
      float x = s[r];
      if (p.alibi != nullptr)
        x -= p.alibi[(int64_t)b * p.alibi_b + (int64_t)h * p.alibi_h] * fabsf((float)(diag - j));
      if (p.softcap > 0.0f) x = p.softcap * tanhf(x / p.softcap);
      const bool seen = valid && (p.window_left < 0 || j >= diag - p.window_left) &&
                        (p.window_right < 0 || j <= diag + p.window_right);
      x = seen ? x : -INFINITY;
      const float m_new = fmaxf(m[r], warp_max(x));
      float prob = 0.0f, alpha = 1.0f;
      if (m_new != -INFINITY) {
        prob = __expf(x - m_new);
        alpha = m[r] == -INFINITY ? 0.0f : __expf(m[r] - m_new);
      }
      l[r] = l[r] * alpha + warp_sum(prob);
      m[r] = m_new;
#pragma unroll
      for (int e = 0; e < DVL; ++e) acc[r][e] *= alpha;
      pw[r * 32 + lane] = prob;
    }
    __syncwarp();
    /* O += P V: a lane owns columns [lane * DVL, lane * DVL + DVL) */
    const int nk = min(32, k1 - tile);
    const int col = lane * DVL;
    for (int j0 = 0; j0 < nk; j0 += 4) { /* four keys' loads in flight, then their products */
      float vf[4][DVL];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t vo = __shfl_sync(0xffffffffu, voff, (j0 + u) & 31);
        if (col < Dv && j0 + u < nk) load_n<T, DVL>(vp + vo + col, vf[u]);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (col >= Dv || j0 + u >= nk) break;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          if (r < rm.nrows) {
            const float pr = pw[r * 32 + j0 + u];
#pragma unroll
            for (int e = 0; e < DVL; ++e) acc[r][e] += pr * vf[u][e];
          }
        }
      }
    }
    __syncwarp();
  }

  /* merge the warps: M = max of their m; warp by warp (a fixed order, so the bits repeat), each
   * adds its O scaled by exp(m_w - M) into o_s */
  if (lane == 0)
    for (int r = 0; r < kRows; ++r) {
      float mr = -INFINITY, lr = 0.0f;
#pragma unroll
      for (int u = 0; u < ROWS; ++u)
        if (u == r) mr = m[u], lr = l[u];
      ml_s[(warp * kRows + r) * 2] = mr;
      ml_s[(warp * kRows + r) * 2 + 1] = lr;
    }
  __syncthreads();
  for (int w = 0; w < kWarps; ++w) {
    if (warp == w) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        if (r >= rm.nrows) continue;
        float M = -INFINITY;
        for (int u = 0; u < kWarps; ++u) M = fmaxf(M, ml_s[(u * kRows + r) * 2]);
        const float wgt = m[r] == -INFINITY ? 0.0f : __expf(m[r] - M);
        const int col = lane * DVL;
        if (col < Dv && wgt != 0.0f)
#pragma unroll
          for (int e = 0; e < DVL; ++e) o_s[r * Dv + col + e] += acc[r][e] * wgt;
      }
    }
    __syncthreads();
  }
  /* the split's partial: per row [m, l, O[Dv]] */
  const int stride = Dv + 2;
  float *part = p.partials +
                ((((int64_t)b * p.heads_kv + g) * row_chunks + chunk) * p.splits + split) * kRows * stride;
  for (int e = threadIdx.x; e < rm.nrows * stride; e += kThreads) {
    const int r = e / stride, c = e % stride;
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, ml_s[(w * kRows + r) * 2]);
    float val;
    if (c == 0) {
      val = M;
    } else if (c == 1) {
      val = 0.0f;
      for (int w = 0; w < kWarps; ++w) {
        const float mw = ml_s[(w * kRows + r) * 2];
        if (mw != -INFINITY) val += ml_s[(w * kRows + r) * 2 + 1] * __expf(mw - M);
      }
    } else {
      val = o_s[r * Dv + c - 2];
    }
    part[e] = val;
  }
}

/* Merges the splits of one (sequence, KV head, row chunk): grid B * Hkv * row_chunks. */
template <typename T> __global__ void merge_kernel(attn_cuda_decode_params p, int row_chunks) {
  const int item = blockIdx.x;
  const int b = item / (p.heads_kv * row_chunks), g = item / row_chunks % p.heads_kv,
            chunk = item % row_chunks;
  const int Tq = p.seqlen_q, Dv = p.dv, stride = Dv + 2;
  const int first = chunk * kRows, nrows = min(kRows, p.group * Tq - first);
  const float *base = p.partials + (int64_t)item * p.splits * kRows * stride;
  T *out = static_cast<T *>(p.out);
  for (int e = threadIdx.x; e < nrows * (Dv + 1); e += blockDim.x) {
    const int r = e / (Dv + 1), c = e % (Dv + 1); /* c == Dv: the row's lse */
    const int rr = first + r, h = g * p.group + rr / Tq, i = rr % Tq;
    float M = -INFINITY;
    for (int s = 0; s < p.splits; ++s) M = fmaxf(M, base[((int64_t)s * kRows + r) * stride]);
    for (int t = 0; t < p.num_sinks; ++t)
      M = fmaxf(M, p.sinks[(int64_t)h * p.sinks_h + (int64_t)t * p.sinks_t]);
    float L = 0.0f, O = 0.0f;
    if (M != -INFINITY) {
      for (int s = 0; s < p.splits; ++s) {
        const float *part = base + ((int64_t)s * kRows + r) * stride;
        if (part[0] == -INFINITY) continue;
        const float w = __expf(part[0] - M);
        L += w * part[1];
        if (c < Dv) O += w * part[2 + c];
      }
      for (int t = 0; t < p.num_sinks; ++t)
        L += __expf(p.sinks[(int64_t)h * p.sinks_h + (int64_t)t * p.sinks_t] - M);
    }
    if (c < Dv) {
      out[(int64_t)b * p.o_b + (int64_t)i * p.o_r + (int64_t)h * p.o_h + c] =
          from_float<T>(M == -INFINITY ? 0.0f : O / L);
    } else if (p.lse != nullptr) {
      p.lse[(int64_t)b * p.lse_b + (int64_t)h * p.lse_h + (int64_t)i * p.lse_r] =
          M == -INFINITY ? -INFINITY : M + logf(L);
    }
  }
}

size_t smem_bytes(int d, int dv) {
  return sizeof(float) * ((size_t)kRows * d + (size_t)kWarps * kRows * 32 + (size_t)kRows * dv +
                          (size_t)kWarps * kRows * 2);
}

template <typename T, int DVL, int ROWS>
attn_status launch_split(const attn_cuda_decode_params *p, dim3 grid, size_t smem, cudaStream_t stream,
                         int row_chunks, char *why, size_t why_size) {
  ATTN_CUDA_CHECK(cudaFuncSetAttribute(split_kernel<T, DVL, ROWS>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  split_kernel<T, DVL, ROWS><<<grid, kThreads, smem, stream>>>(*p, row_chunks);
  ATTN_CUDA_CHECK(cudaGetLastError());
  return ATTN_STATUS_OK;
}

template <typename T>
attn_status launch(const attn_cuda_decode_params *p, cudaStream_t stream, char *why, size_t why_size) {
  const int row_chunks = attn_cuda_decode_row_chunks(p->group, p->seqlen_q);
  if (p->block_table != nullptr && p->seqlen_new > 0) {
    append_kernel<T><<<dim3(p->batch, p->seqlen_new), 128, 0, stream>>>(*p);
    ATTN_CUDA_CHECK(cudaGetLastError());
  }
  const size_t smem = smem_bytes(p->d, p->dv);
  const dim3 grid(p->splits, p->heads_kv * row_chunks, p->batch);
  const int rows = p->group * p->seqlen_q;
  attn_status st = ATTN_STATUS_OK;
  if (p->dv <= 128)
    st = rows <= 4 ? launch_split<T, 4, 4>(p, grid, smem, stream, row_chunks, why, why_size)
       : rows <= 8 ? launch_split<T, 4, 8>(p, grid, smem, stream, row_chunks, why, why_size)
                   : launch_split<T, 4, 16>(p, grid, smem, stream, row_chunks, why, why_size);
  else
    st = rows <= 4 ? launch_split<T, 8, 4>(p, grid, smem, stream, row_chunks, why, why_size)
       : rows <= 8 ? launch_split<T, 8, 8>(p, grid, smem, stream, row_chunks, why, why_size)
                   : launch_split<T, 8, 16>(p, grid, smem, stream, row_chunks, why, why_size);
  if (st != ATTN_STATUS_OK) return st;
  merge_kernel<T><<<p->batch * p->heads_kv * row_chunks, 128, 0, stream>>>(*p, row_chunks);
  ATTN_CUDA_CHECK(cudaGetLastError());
  return ATTN_STATUS_OK;
}

} // namespace attn_cuda_decode

extern "C" int attn_cuda_decode_row_chunks(int group, int seqlen_q) {
  return (group * seqlen_q + ATTN_CUDA_DECODE_ROWS - 1) / ATTN_CUDA_DECODE_ROWS;
}

extern "C" int attn_cuda_decode_splits(int index, int batch, int heads_kv, int row_chunks,
                                       int seqlen_k, int ctas_per_sm) {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, index) != cudaSuccess || sms < 1) {
    (void)cudaGetLastError();
    return 1;
  }
  /* eight CTAs (32 warps) per SM keep enough loads in flight to cover the memory latency; a split
   * of fewer than 128 keys (4 tiles of 32) would cost more to merge than it saves */
  const int64_t ctas = (int64_t)batch * heads_kv * row_chunks;
  int64_t want = ((int64_t)(ctas_per_sm > 0 ? ctas_per_sm : 8) * sms + ctas - 1) / ctas;
  int64_t most = seqlen_k / 128;
  if (most < 1) most = 1;
  if (want > most) want = most;
  if (want > 1024) want = 1024;
  return (int)(want < 1 ? 1 : want);
}

extern "C" size_t attn_cuda_decode_workspace(int batch, int heads_kv, int row_chunks, int splits,
                                             int dv) {
  return sizeof(float) * (size_t)batch * heads_kv * row_chunks * splits * ATTN_CUDA_DECODE_ROWS *
         (size_t)(dv + 2);
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
