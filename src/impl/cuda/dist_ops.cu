/*
 * src/impl/cuda/dist_ops.cu - the ring's device operations (src/dist/device.h): streams, events,
 * strided copies and the element-wise kernels that merge partial results and sum gradients. The
 * cuda module's table hands them to the distributed layer (attn_module_table.dist).
 *
 * The kernels are memory-bound and simple: one thread per element (grid-stride loops), f32
 * arithmetic, one pass over their data. They are a small fraction of a ring step (O(T H Dv) work
 * against the O(T^2 H D) of a block).
 */
#include "dist/device.h"

extern "C" {
#include "core/ctx.h"
}

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>

namespace {

/* Makes device current for the call and puts the caller's back on scope exit. */
struct device_scope {
  int prev = -1;
  cudaError_t err = cudaSuccess;
  explicit device_scope(int32_t device) {
    err = cudaGetDevice(&prev);
    if (err == cudaSuccess && prev != device) err = cudaSetDevice(device);
  }
  ~device_scope() {
    int now = -1;
    if (prev >= 0 && cudaGetDevice(&now) == cudaSuccess && now != prev) (void)cudaSetDevice(prev);
  }
};

attn_status fail(cudaError_t err, const char *what, char *why, size_t why_size) {
  attn_format(why, why_size, "%s failed: %s (%s)", what, cudaGetErrorString(err),
              cudaGetErrorName(err));
  return err == cudaErrorMemoryAllocation ? ATTN_STATUS_OUT_OF_MEMORY : ATTN_STATUS_DEVICE_ERROR;
}

/* The status of the launch just made. */
attn_status launched(const char *what, char *why, size_t why_size) {
  cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? ATTN_STATUS_OK : fail(err, what, why, why_size);
}

__device__ float load(const void *p, int32_t dtype, int64_t i) {
  switch (dtype) {
  case ATTN_DTYPE_F16: return __half2float(static_cast<const __half *>(p)[i]);
  case ATTN_DTYPE_BF16: return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
  default: return static_cast<const float *>(p)[i];
  }
}

__device__ void store(void *p, int32_t dtype, int64_t i, float x) {
  switch (dtype) {
  case ATTN_DTYPE_F16: static_cast<__half *>(p)[i] = __float2half_rn(x); break;
  case ATTN_DTYPE_BF16: static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(x); break;
  default: static_cast<float *>(p)[i] = x; break;
  }
}

/* Enough blocks of 256 threads for n elements, capped (the loops stride over the rest). */
unsigned grid_for(int64_t n) {
  int64_t blocks = (n + 255) / 256;
  if (blocks > 65536) blocks = 65536;
  return blocks < 1 ? 1u : (unsigned)blocks;
}

struct dims4 {
  int64_t shape[4], dst[4], src[4];
};

template <typename T> __global__ void copy_kernel(T *dst, const T *src, dims4 d, int64_t n) {
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
       e += (int64_t)gridDim.x * blockDim.x) {
    int64_t rest = e, to = 0, from = 0;
    for (int k = 3; k >= 0; --k) {
      const int64_t i = rest % d.shape[k];
      rest /= d.shape[k];
      to += i * d.dst[k], from += i * d.src[k];
    }
    dst[to] = src[from];
  }
}

__global__ void fill_kernel(float *dst, int64_t n, float value) {
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
       e += (int64_t)gridDim.x * blockDim.x)
    dst[e] = value;
}

/* One thread per (b, h, i, d) of the block. Each of a row's Dv threads recomputes the row's
 * weights from the old lse (cheap); a row's threads may sit in different thread blocks, so the new
 * lse is written by a second kernel (merge_lse_kernel), launched after this one on the stream. */
__global__ void merge_out_kernel(int32_t dtype, float *acc_out, const float *acc_lse,
                                 const void *out_blk, const float *lse_blk, int64_t B, int64_t H,
                                 int64_t T, int64_t row0, int64_t rows, int64_t Dv) {
  const int64_t n = B * rows * H * Dv;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t d = e % Dv, h = (e / Dv) % H, i = (e / (Dv * H)) % rows, b = e / (Dv * H * rows);
    const float l = lse_blk[(b * H + h) * rows + i];
    if (l == -INFINITY) continue; /* nothing of this row visible in the block */
    const float L = acc_lse[(b * H + h) * T + row0 + i];
    const float m = fmaxf(L, l);
    const float total = m + logf(expf(L - m) + expf(l - m));
    float *acc = &acc_out[((b * T + row0 + i) * H + h) * Dv + d];
    *acc = *acc * expf(L - total) + load(out_blk, dtype, e) * expf(l - total);
  }
}

__global__ void merge_lse_kernel(float *acc_lse, const float *lse_blk, int64_t B, int64_t H,
                                 int64_t T, int64_t row0, int64_t rows) {
  const int64_t n = B * H * rows;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = e % rows, bh = e / rows;
    const float l = lse_blk[e];
    if (l == -INFINITY) continue;
    float *L = &acc_lse[bh * T + row0 + i];
    const float m = fmaxf(*L, l);
    *L = m + logf(expf(*L - m) + expf(l - m));
  }
}

__global__ void accumulate_kernel(float *acc, int64_t T, int64_t row0, const void *blk,
                                  int32_t dtype, int64_t B, int64_t rows, int64_t width) {
  const int64_t n = B * rows * width;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t w = e % width, i = (e / width) % rows, b = e / (width * rows);
    acc[(b * T + row0 + i) * width + w] += load(blk, dtype, e);
  }
}

__global__ void add_kernel(float *dst, const float *src, int64_t n) {
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
       e += (int64_t)gridDim.x * blockDim.x)
    dst[e] += src[e];
}

__global__ void store_kernel(void *dst, int32_t dtype, dims4 d, const float *acc, int64_t n) {
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
       e += (int64_t)gridDim.x * blockDim.x) {
    int64_t rest = e, to = 0;
    for (int k = 3; k >= 0; --k) {
      to += (rest % d.shape[k]) * d.dst[k];
      rest /= d.shape[k];
    }
    store(dst, dtype, to, acc[e]);
  }
}

/* ---- the table's functions ------------------------------------------------------------------- */

attn_status stream_create(int32_t device, void **stream, char *why, size_t why_size) {
  device_scope scope(device);
  cudaStream_t s = nullptr;
  cudaError_t err = scope.err;
  /* Non-blocking: the legacy default stream, where a caller's work may run, must not serialise
   * the ring's transfers behind its blocks. */
  if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  *stream = s;
  return err == cudaSuccess ? ATTN_STATUS_OK : fail(err, "cudaStreamCreate", why, why_size);
}

void stream_destroy(int32_t device, void *stream) {
  if (stream == nullptr) return;
  device_scope scope(device);
  (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

attn_status event_create(int32_t device, void **event, char *why, size_t why_size) {
  device_scope scope(device);
  cudaEvent_t e = nullptr;
  cudaError_t err = scope.err;
  if (err == cudaSuccess) err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  *event = e;
  return err == cudaSuccess ? ATTN_STATUS_OK : fail(err, "cudaEventCreate", why, why_size);
}

void event_destroy(int32_t device, void *event) {
  if (event == nullptr) return;
  device_scope scope(device);
  (void)cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

attn_status record(int32_t device, void *event, void *stream, char *why, size_t why_size) {
  device_scope scope(device);
  cudaError_t err = scope.err;
  if (err == cudaSuccess)
    err = cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream));
  return err == cudaSuccess ? ATTN_STATUS_OK : fail(err, "cudaEventRecord", why, why_size);
}

attn_status stream_wait(int32_t device, void *stream, void *event, char *why, size_t why_size) {
  device_scope scope(device);
  cudaError_t err = scope.err;
  if (err == cudaSuccess)
    err =
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0);
  return err == cudaSuccess ? ATTN_STATUS_OK : fail(err, "cudaStreamWaitEvent", why, why_size);
}

attn_status stream_sync(int32_t device, void *stream, char *why, size_t why_size) {
  device_scope scope(device);
  cudaError_t err = scope.err;
  if (err == cudaSuccess) err = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  return err == cudaSuccess ? ATTN_STATUS_OK : fail(err, "cudaStreamSynchronize", why, why_size);
}

attn_status copy(int32_t device, void *dst, const int64_t dst_stride[4], const void *src,
                 const int64_t src_stride[4], const int64_t shape[4], size_t es, void *stream,
                 char *why, size_t why_size) {
  device_scope scope(device);
  if (scope.err != cudaSuccess) return fail(scope.err, "cudaSetDevice", why, why_size);
  dims4 d;
  int64_t n = 1;
  for (int k = 0; k < 4; ++k)
    d.shape[k] = shape[k], d.dst[k] = dst_stride[k], d.src[k] = src_stride[k], n *= shape[k];
  if (n == 0) return ATTN_STATUS_OK;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (es) {
  case 1: /* boolean masks (the all-to-all's rows of a mask) */
    copy_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<uint8_t *>(dst),
                                            static_cast<const uint8_t *>(src), d, n);
    break;
  case 2:
    copy_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<uint16_t *>(dst),
                                            static_cast<const uint16_t *>(src), d, n);
    break;
  case 4:
    copy_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<uint32_t *>(dst),
                                            static_cast<const uint32_t *>(src), d, n);
    break;
  case 8:
    copy_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<uint64_t *>(dst),
                                            static_cast<const uint64_t *>(src), d, n);
    break;
  default:
    attn_format(why, why_size, "copy of %zu-byte elements: 1, 2, 4 or 8 are supported", es);
    return ATTN_STATUS_INVALID_ARGUMENT;
  }
  return launched("the ring's copy kernel", why, why_size);
}

attn_status fill(int32_t device, float *dst, int64_t n, float value, void *stream, char *why,
                 size_t why_size) {
  device_scope scope(device);
  if (scope.err != cudaSuccess) return fail(scope.err, "cudaSetDevice", why, why_size);
  if (n == 0) return ATTN_STATUS_OK;
  fill_kernel<<<grid_for(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(dst, n, value);
  return launched("the ring's fill kernel", why, why_size);
}

attn_status merge(int32_t device, int32_t dtype, float *acc_out, float *acc_lse,
                  const void *out_blk, const float *lse_blk, int64_t B, int64_t H, int64_t T,
                  int64_t row0, int64_t rows, int64_t Dv, void *stream, char *why,
                  size_t why_size) {
  device_scope scope(device);
  if (scope.err != cudaSuccess) return fail(scope.err, "cudaSetDevice", why, why_size);
  const int64_t n = B * rows * H * Dv;
  if (n == 0) return ATTN_STATUS_OK;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  /* Outputs first (they read the old lse), then the lse, in stream order. */
  merge_out_kernel<<<grid_for(n), 256, 0, s>>>(dtype, acc_out, acc_lse, out_blk, lse_blk, B, H, T,
                                               row0, rows, Dv);
  attn_status status = launched("the ring's merge kernel", why, why_size);
  if (status != ATTN_STATUS_OK) return status;
  merge_lse_kernel<<<grid_for(B * H * rows), 256, 0, s>>>(acc_lse, lse_blk, B, H, T, row0, rows);
  return launched("the ring's lse merge kernel", why, why_size);
}

attn_status accumulate(int32_t device, float *acc, int64_t T, int64_t row0, const void *blk,
                       int32_t dtype, int64_t B, int64_t rows, int64_t width, void *stream,
                       char *why, size_t why_size) {
  device_scope scope(device);
  if (scope.err != cudaSuccess) return fail(scope.err, "cudaSetDevice", why, why_size);
  const int64_t n = B * rows * width;
  if (n == 0) return ATTN_STATUS_OK;
  accumulate_kernel<<<grid_for(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      acc, T, row0, blk, dtype, B, rows, width);
  return launched("the ring's accumulate kernel", why, why_size);
}

attn_status add(int32_t device, float *dst, const float *src, int64_t n, void *stream, char *why,
                size_t why_size) {
  device_scope scope(device);
  if (scope.err != cudaSuccess) return fail(scope.err, "cudaSetDevice", why, why_size);
  if (n == 0) return ATTN_STATUS_OK;
  add_kernel<<<grid_for(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(dst, src, n);
  return launched("the ring's add kernel", why, why_size);
}

attn_status store_acc(int32_t device, void *dst, int32_t dtype, const int64_t dst_stride[4],
                      const float *acc, const int64_t shape[4], void *stream, char *why,
                      size_t why_size) {
  device_scope scope(device);
  if (scope.err != cudaSuccess) return fail(scope.err, "cudaSetDevice", why, why_size);
  dims4 d;
  int64_t n = 1;
  for (int k = 0; k < 4; ++k)
    d.shape[k] = shape[k], d.dst[k] = dst_stride[k], d.src[k] = 0, n *= shape[k];
  if (n == 0) return ATTN_STATUS_OK;
  store_kernel<<<grid_for(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(dst, dtype, d, acc, n);
  return launched("the ring's store kernel", why, why_size);
}

} // namespace

extern "C" const attn_dist_device_ops attn_cuda_dist_ops = {
    stream_create, stream_destroy, event_create, event_destroy, record, stream_wait, stream_sync,
    copy,          fill,           merge,        accumulate,    add,    store_acc,
};
