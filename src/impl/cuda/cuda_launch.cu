/*
 * src/impl/cuda/cuda_launch.cu - the extern "C" launchers of cuda_launch.h: device queries, the
 * dispatch from (dtype, head dimension) to the instantiated kernels (one generated file each,
 * cuda_inst_*.cu), and the small kernels around them: rows outside every sequence, Delta, dsinks,
 * and the dbias conversion.
 */
#include "impl/cuda/cuda_launch.h"

#include "impl/cuda/cuda_check.cuh"
#include "impl/cuda/cuda_common.cuh"
#include "impl/cuda/cuda_traits.h"

namespace attn_cuda {

/* Defined in cuda_fwd.cuh / cuda_bwd.cuh and instantiated once per (dtype, head dimension) in the
 * generated cuda_inst_*.cu files, so they compile in parallel. */
template <typename T, int kD>
attn_status run_fwd(const attn_cuda_params &p, cudaStream_t stream, char *why, size_t why_size);
template <typename T, int kD>
attn_status run_bwd(const attn_cuda_params &p, cudaStream_t stream, char *why, size_t why_size);

/* Zeroes rows of a token tensor [.., H, W] that belong to no sequence (padded rows past a
 * sequence's length; packed rows past cu_seqlens[B]) and sets their lse to -inf when lse is given.
 * One block per row. */
__global__ void zero_outside_kernel(const __grid_constant__ attn_cuda_params p, uint16_t *t,
                                    int64_t tb, int64_t tr, int64_t th, int heads, int width,
                                    int q_side, float *lse, int64_t lb, int64_t lh, int64_t lr) {
  const int per_batch = q_side ? p.seqlen_q : p.seqlen_k;
  const int64_t rows = p.varlen == ATTN_CUDA_VARLEN_PACKED ? (q_side ? p.total_q : p.total_k)
                                                           : (int64_t)p.batch * per_batch;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    int64_t off, b = 0, i = row;
    if (p.varlen == ATTN_CUDA_VARLEN_PACKED) {
      const int32_t *cu = q_side ? p.cu_q : p.cu_k;
      int64_t end = min((int64_t)max(cu[p.batch], 0), rows);
      if (row < end) continue;
      off = row * tr;
    } else {
      b = row / per_batch, i = row % per_batch;
      const int32_t *lens = q_side ? p.seqlens_q : p.seqlens_k;
      if (i < lens[b]) continue;
      off = b * tb + i * tr;
    }
    for (int e = threadIdx.x; e < heads * width; e += blockDim.x)
      t[off + (e / width) * th + e % width] = 0;
    if (lse != nullptr)
      for (int h = threadIdx.x; h < heads; h += blockDim.x) lse[b * lb + h * lh + i * lr] = -INFINITY;
  }
}

/* Where head h of row `row` (of rows_q: packed rows, or batch-major padded ones) starts in out
 * (*oo) and dout (*od), in elements. */
__device__ __forceinline__ void delta_offsets(const attn_cuda_params &p, int64_t row, int h, int64_t *oo,
                                              int64_t *od) {
  if (p.varlen == ATTN_CUDA_VARLEN_PACKED) {
    *oo = row * p.o_r + h * p.o_h;
    *od = row * p.do_r + h * p.do_h;
  } else {
    int64_t b = row / p.seqlen_q, i = row % p.seqlen_q;
    *oo = b * p.o_b + i * p.o_r + h * p.o_h;
    *od = b * p.do_b + i * p.do_r + h * p.do_h;
  }
}

/* Delta[h, row] = dot(dout[row, h, :], out[row, h, :]) in f32; one warp per (row, head). */
__global__ void delta_kernel(const __grid_constant__ attn_cuda_params p, int elem) {
  const int lane = threadIdx.x & 31;
  const int64_t items = p.rows_q * p.heads_q;
  for (int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; w < items;
       w += (gridDim.x * (int64_t)blockDim.x) >> 5) {
    const int64_t row = w / p.heads_q;
    const int h = (int)(w % p.heads_q);
    int64_t oo, od;
    delta_offsets(p, row, h, &oo, &od);
    float sum = 0.f;
    for (int d = lane; d < p.dv; d += 32) sum += load_any(p.out, elem, oo + d) * load_any(p.dout, elem, od + d);
    for (int s = 16; s > 0; s >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, s);
    if (lane == 0) p.delta[h * p.rows_q + row] = sum;
  }
}

/* delta_kernel for 16-bit out and dout whose rows allow 16-byte loads (delta_vec_lanes): kLanes
 * threads per (row, head), 8 elements each, a warp over 32 / kLanes of them at once; the per-element
 * 2-byte loads of delta_kernel took several times the bytes' time. */
template <typename T, int kLanes> __global__ void delta_vec_kernel(const __grid_constant__ attn_cuda_params p) {
  const int sub = threadIdx.x % kLanes;
  const int64_t items = p.rows_q * p.heads_q, per_warp = 32 / kLanes;
  const int64_t warp = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5, warps = (gridDim.x * (int64_t)blockDim.x) >> 5;
  for (int64_t w0 = warp * per_warp; w0 < items; w0 += warps * per_warp) {
    const int64_t w = w0 + (threadIdx.x & 31) / kLanes; /* every lane reaches the shuffles below */
    float sum = 0.f;
    if (w < items) {
      const int64_t row = w / p.heads_q;
      const int h = (int)(w % p.heads_q);
      int64_t oo, od;
      delta_offsets(p, row, h, &oo, &od);
      const uint4 o = *reinterpret_cast<const uint4 *>(static_cast<const T *>(p.out) + oo + sub * 8);
      const uint4 d = *reinterpret_cast<const uint4 *>(static_cast<const T *>(p.dout) + od + sub * 8);
      const uint32_t ow[4] = {o.x, o.y, o.z, o.w}, dw[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const T *a = reinterpret_cast<const T *>(&ow[e]), *c = reinterpret_cast<const T *>(&dw[e]);
        sum = fmaf((float)a[0], (float)c[0], sum);
        sum = fmaf((float)a[1], (float)c[1], sum);
      }
    }
#pragma unroll
    for (int s = kLanes / 2; s > 0; s >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, s);
    if (w < items && sub == 0) {
      const int64_t row = w / p.heads_q;
      p.delta[(w % p.heads_q) * p.rows_q + row] = sum;
    }
  }
}

/* Threads per (row, head) of delta_vec_kernel for p (dv / 8: 1 to 32, a power of two), or 0 where
 * it does not apply (out or dout not 16-byte aligned, a stride not a multiple of 8 elements). */
static int delta_vec_lanes(const attn_cuda_params &p) {
  const int lanes = p.dv / 8;
  if (p.dv % 8 != 0 || lanes < 1 || lanes > 32 || (lanes & (lanes - 1)) != 0) return 0;
  if (reinterpret_cast<uintptr_t>(p.out) % 16 != 0 || reinterpret_cast<uintptr_t>(p.dout) % 16 != 0) return 0;
  const int64_t strides[6] = {p.o_r, p.o_h, p.o_b, p.do_r, p.do_h, p.do_b};
  for (int64_t st : strides)
    if (st % 8 != 0) return 0;
  return lanes;
}

template <typename T>
static void launch_delta_vec(const attn_cuda_params &p, int lanes, cudaStream_t s) {
  const int64_t warps = (p.rows_q * p.heads_q + 32 / lanes - 1) / (32 / lanes);
  const int grid = (int)(warps / 8 + 1 > 65535 ? 65535 : warps / 8 + 1);
  switch (lanes) {
  case 1: delta_vec_kernel<T, 1><<<grid, 256, 0, s>>>(p); break;
  case 2: delta_vec_kernel<T, 2><<<grid, 256, 0, s>>>(p); break;
  case 4: delta_vec_kernel<T, 4><<<grid, 256, 0, s>>>(p); break;
  case 8: delta_vec_kernel<T, 8><<<grid, 256, 0, s>>>(p); break;
  case 16: delta_vec_kernel<T, 16><<<grid, 256, 0, s>>>(p); break;
  default: delta_vec_kernel<T, 32><<<grid, 256, 0, s>>>(p); break;
  }
}

/* dsinks[h, t] = -sum_{b, i} exp(a_t - lse_i) Delta_i (over every head for shared sinks). One block
 * per output element; a fixed per-thread order and tree make it deterministic. */
__global__ void dsinks_kernel(const __grid_constant__ attn_cuda_params p, int shared) {
  __shared__ float part[256];
  const int t = shared ? blockIdx.x : blockIdx.x % p.num_sinks;
  const int h_lo = shared ? 0 : blockIdx.x / p.num_sinks, h_hi = shared ? p.heads_q : h_lo + 1;
  float sum = 0.f;
  for (int h = h_lo; h < h_hi; ++h) {
    const float a = p.sinks[h * p.sinks_h + t * p.sinks_t];
    for (int b = 0; b < p.batch; ++b) {
      const Seq s = seq_of(p, b);
      for (int i = threadIdx.x; i < s.len_q; i += blockDim.x) {
        float l = p.lse[b * p.lse_b + h * p.lse_h + (s.q0 + i) * p.lse_r];
        if (l == -INFINITY) continue;
        int64_t row = p.varlen == ATTN_CUDA_VARLEN_PACKED ? s.q0 + i : (int64_t)b * p.seqlen_q + i;
        sum += expf(a - l) * p.delta[h * p.rows_q + row];
      }
    }
  }
  part[threadIdx.x] = sum;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) p.dsinks[(shared ? 0 : h_lo) * p.dsinks_h + t * p.dsinks_t] = -part[0];
}

/* dbias (its dtype and strides) from the dense f32 accumulator. */
__global__ void dbias_convert_kernel(const __grid_constant__ attn_cuda_params p, int64_t n) {
  const int64_t *s = p.bias_shape;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += gridDim.x * (int64_t)blockDim.x) {
    int64_t j = e % s[3], rest = e / s[3];
    int64_t i = rest % s[2];
    rest /= s[2];
    int64_t h = rest % s[1], b = rest / s[1];
    store_any(p.dbias, p.bias_elem, b * p.dbias_s[0] + h * p.dbias_s[1] + i * p.dbias_s[2] + j * p.dbias_s[3],
              p.dbias_accum[e]);
  }
}

template <typename T> attn_status dispatch(const attn_cuda_params &p, int backward, cudaStream_t s,
                                           char *why, size_t why_size) {
  switch (attn_cuda_kernel_dim(p.d, p.dv)) {
  case 32: return backward ? run_bwd<T, 32>(p, s, why, why_size) : run_fwd<T, 32>(p, s, why, why_size);
  case 64: return backward ? run_bwd<T, 64>(p, s, why, why_size) : run_fwd<T, 64>(p, s, why, why_size);
  case 96: return backward ? run_bwd<T, 96>(p, s, why, why_size) : run_fwd<T, 96>(p, s, why, why_size);
  case 128: return backward ? run_bwd<T, 128>(p, s, why, why_size) : run_fwd<T, 128>(p, s, why, why_size);
  case 192: return backward ? run_bwd<T, 192>(p, s, why, why_size) : run_fwd<T, 192>(p, s, why, why_size);
  case 256: return backward ? run_bwd<T, 256>(p, s, why, why_size) : run_fwd<T, 256>(p, s, why, why_size);
  default:
    snprintf(why, why_size, "head_dim=%d, head_dim_v=%d: no kernel", (int)p.d, (int)p.dv);
    return ATTN_STATUS_UNSUPPORTED;
  }
}

template <typename T> size_t smem_of(int kd, int backward) {
  switch (kd) {
#define ATTN_SMEM_CASE(D)                                                                          \
  case D:                                                                                          \
    if (!backward)                                                                                 \
      return max(FwdCfg<T, D, FwdTraits<D>::kNW, FwdTraits<D>::kMT, FwdTraits<D>::kBN>::kSmem,     \
                 FwdCfg<T, D, FastFwdTraits<D>::kNW, FastFwdTraits<D>::kMT,                        \
                        FastFwdTraits<D>::kBN>::kSmem);                                            \
    return max(max(DkvCfg<T, D, BwdTraits<D>::kNW, BwdTraits<D>::kBN, BwdTraits<D>::kBM>::kSmem,   \
                   max(DkvCfg<T, D, BwdTraits<D>::kNWa, BwdTraits<D>::kBNa, BwdTraits<D>::kBM>::kSmem, \
                       DkvCfg<T, D, BwdTraits<D>::kNWa, BwdTraits<D>::kBNa, BwdTraits<D>::kBMa>::kSmem)), \
               max(DqCfg<T, D, BwdTraits<D>::kNWq, BwdTraits<D>::kBNq>::kSmem,                    \
                   DqCfg<T, D, BwdTraits<D>::kNWq, BwdTraits<D>::kBNqf, BwdTraits<D>::kMTqf>::kSmem));
    ATTN_SMEM_CASE(32)
    ATTN_SMEM_CASE(64)
    ATTN_SMEM_CASE(96)
    ATTN_SMEM_CASE(128)
    ATTN_SMEM_CASE(192)
    ATTN_SMEM_CASE(256)
#undef ATTN_SMEM_CASE
  default: return 0;
  }
}

/* Makes device `index` current for the call and restores the caller's device afterwards. */
struct DeviceGuard {
  int prev = -1;
  bool changed = false;
  ~DeviceGuard() {
    if (changed) (void)cudaSetDevice(prev);
  }
};

static int grid_for(int64_t work, int64_t per_block) {
  int64_t g = (work + per_block - 1) / per_block;
  return (int)(g < 1 ? 1 : g > 65535 ? 65535 : g);
}

} // namespace attn_cuda

using namespace attn_cuda;

extern "C" int attn_cuda_kernel_dim(int d, int dv) {
  int m = d > dv ? d : dv;
  static const int dims[] = {32, 64, 96, 128, 192, 256};
  for (int k : dims)
    if (m <= k) return k;
  return 0;
}

extern "C" size_t attn_cuda_smem_bytes(int kernel_dim, int backward) {
  return smem_of<__nv_bfloat16>(kernel_dim, backward);
}

extern "C" attn_status attn_cuda_device_info(int index, int *cc, size_t *smem_optin, char *why,
                                             size_t why_size) {
  int count = 0;
  ATTN_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (index >= count) {
    snprintf(why, why_size, "device_index=%d: only %d CUDA device(s) are present", index, count);
    return ATTN_STATUS_UNSUPPORTED;
  }
  int major = 0, minor = 0, smem = 0;
  ATTN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index));
  ATTN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index));
  ATTN_CUDA_CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, index));
  *cc = major * 10 + minor;
  *smem_optin = (size_t)smem;
  return ATTN_STATUS_OK;
}

static attn_status set_device(const attn_cuda_params *p, DeviceGuard &guard, char *why, size_t why_size) {
  ATTN_CUDA_CHECK(cudaGetDevice(&guard.prev));
  if (guard.prev != p->device_index) {
    ATTN_CUDA_CHECK(cudaSetDevice(p->device_index));
    guard.changed = true;
  }
  return ATTN_STATUS_OK;
}

extern "C" attn_status attn_cuda_forward(const attn_cuda_params *p, int is_bf16, void *stream,
                                         char *why, size_t why_size) {
  DeviceGuard guard;
  attn_status st = set_device(p, guard, why, why_size);
  if (st != ATTN_STATUS_OK) return st;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p->varlen != ATTN_CUDA_VARLEN_NONE) {
    int64_t rows = p->varlen == ATTN_CUDA_VARLEN_PACKED ? p->total_q : (int64_t)p->batch * p->seqlen_q;
    if (rows > 0) {
      const int u = p->out_elem == ATTN_CUDA_ELEM_F32 ? 2 : 1; /* out's elements in 16-bit units */
      zero_outside_kernel<<<grid_for(rows, 1), 128, 0, s>>>(*p, static_cast<uint16_t *>(p->out), p->o_b * u,
                                                           p->o_r * u, p->o_h * u, p->heads_q, p->dv * u, 1,
                                                           p->lse, p->lse_b, p->lse_h, p->lse_r);
      ATTN_CUDA_CHECK(cudaGetLastError());
    }
  }
  if (p->seqlen_q == 0) return ATTN_STATUS_OK;
  if (p->fp8) return attn_cuda_sm90_fp8_forward(p, p->fp8 - 1, stream, why, why_size); /* any length */
  /* no keys: the sm80 kernel writes the zeros (the copy engine's maps need a length) */
  if (p->use_sm90 && p->seqlen_k > 0) return attn_cuda_sm90_forward(p, is_bf16, stream, why, why_size);
  return is_bf16 ? dispatch<__nv_bfloat16>(*p, 0, s, why, why_size) : dispatch<__half>(*p, 0, s, why, why_size);
}

extern "C" attn_status attn_cuda_backward(const attn_cuda_params *p, int is_bf16, void *stream,
                                          char *why, size_t why_size) {
  DeviceGuard guard;
  attn_status st = set_device(p, guard, why, why_size);
  if (st != ATTN_STATUS_OK) return st;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int elem = is_bf16 ? ATTN_CUDA_ELEM_BF16 : ATTN_CUDA_ELEM_F16;
  if (p->rows_q > 0) {
    const int lanes = delta_vec_lanes(*p);
    if (lanes == 0) delta_kernel<<<grid_for(p->rows_q * p->heads_q, 8), 256, 0, s>>>(*p, elem);
    else if (is_bf16) launch_delta_vec<__nv_bfloat16>(*p, lanes, s);
    else launch_delta_vec<__half>(*p, lanes, s);
    ATTN_CUDA_CHECK(cudaGetLastError());
  }
  int64_t n_bias = p->bias_shape[0] * p->bias_shape[1] * p->bias_shape[2] * p->bias_shape[3];
  if (p->dbias_accum != nullptr && n_bias > 0)
    ATTN_CUDA_CHECK(cudaMemsetAsync(p->dbias_accum, 0, (size_t)n_bias * sizeof(float), s));
  if (p->varlen != ATTN_CUDA_VARLEN_NONE) {
    int64_t rq = p->varlen == ATTN_CUDA_VARLEN_PACKED ? p->total_q : (int64_t)p->batch * p->seqlen_q;
    int64_t rk = p->varlen == ATTN_CUDA_VARLEN_PACKED ? p->total_k : (int64_t)p->batch * p->seqlen_k;
    if (rq > 0) {
      zero_outside_kernel<<<grid_for(rq, 1), 128, 0, s>>>(*p, static_cast<uint16_t *>(p->dq_out), p->dq_b, p->dq_r,
                                                         p->dq_h, p->heads_q, p->d, 1, nullptr, 0, 0, 0);
      ATTN_CUDA_CHECK(cudaGetLastError());
    }
    if (rk > 0) {
      zero_outside_kernel<<<grid_for(rk, 1), 128, 0, s>>>(*p, static_cast<uint16_t *>(p->dk_out), p->dk_b, p->dk_r,
                                                         p->dk_h, p->heads_kv, p->d, 0, nullptr, 0, 0, 0);
      ATTN_CUDA_CHECK(cudaGetLastError());
      zero_outside_kernel<<<grid_for(rk, 1), 128, 0, s>>>(*p, static_cast<uint16_t *>(p->dv_out), p->dv_b, p->dv_r,
                                                         p->dv_h, p->heads_kv, p->dv, 0, nullptr, 0, 0, 0);
      ATTN_CUDA_CHECK(cudaGetLastError());
    }
  }
  if (p->use_sm90 && p->seqlen_q > 0 && p->seqlen_k > 0 && attn_cuda_sm90_bwd_unsupported(p) == nullptr) {
    st = attn_cuda_sm90_backward(p, is_bf16, stream, why, why_size);
    if (st != ATTN_STATUS_OK) return st;
  } else if (p->seqlen_q > 0 || p->seqlen_k > 0) {
    /* use_sm90 with dq_accum: the atomic backward; with the counters too ("sm90_deterministic"):
     * the deterministic one, which takes no dq_accum */
    attn_cuda_params q = *p;
    if (q.dq_semaphore != nullptr) q.dq_accum = nullptr, q.dq_semaphore = nullptr;
    st = is_bf16 ? dispatch<__nv_bfloat16>(q, 1, s, why, why_size) : dispatch<__half>(q, 1, s, why, why_size);
    if (st != ATTN_STATUS_OK) return st;
  }
  if (p->dbias != nullptr && n_bias > 0) {
    dbias_convert_kernel<<<grid_for(n_bias, 256), 256, 0, s>>>(*p, n_bias);
    ATTN_CUDA_CHECK(cudaGetLastError());
  }
  if (p->dsinks != nullptr) {
    int blocks = p->sinks_shared ? p->num_sinks : p->heads_q * p->num_sinks;
    dsinks_kernel<<<blocks, 256, 0, s>>>(*p, p->sinks_shared);
    ATTN_CUDA_CHECK(cudaGetLastError());
  }
  return ATTN_STATUS_OK;
}
