/*
 * src/module/gpu_runtime.c - the CUDA runtime services of core/gpu.h, compiled into each GPU
 * module (both link the CUDA runtime); the core reaches them through attn_gpu(), which returns the
 * table of the first module that loaded. Every call makes device_index current and restores the
 * caller's device, like the implementations do.
 */
#include "module/gpu_runtime.h"

#include "core/ctx.h"

#include <cuda_runtime_api.h>

/* Makes device index current; *prev gets the caller's (restore_device puts it back). */
static cudaError_t use_device(int32_t index, int *prev) {
  cudaError_t err = cudaGetDevice(prev);
  if (err == cudaSuccess && *prev != index) err = cudaSetDevice(index);
  return err;
}

static void restore_device(int32_t index, int prev) {
  if (prev != index) (void)cudaSetDevice(prev);
}

static attn_status failure(cudaError_t err, const char *what, int32_t index, char *why,
                           size_t why_size) {
  attn_format(why, why_size, "%s on device %d failed: %s (%s)", what, (int)index,
              cudaGetErrorString(err), cudaGetErrorName(err));
  return err == cudaErrorMemoryAllocation ? ATTN_STATUS_OUT_OF_MEMORY : ATTN_STATUS_DEVICE_ERROR;
}

static attn_status gpu_alloc(int32_t index, size_t bytes, void **ptr, char *why, size_t why_size) {
  int prev = (int)index;
  *ptr = NULL;
  cudaError_t err = use_device(index, &prev);
  if (err == cudaSuccess) err = cudaMalloc(ptr, bytes);
  restore_device(index, prev);
  if (err != cudaSuccess) {
    *ptr = NULL;
    return failure(err, "cudaMalloc", index, why, why_size);
  }
  return ATTN_STATUS_OK;
}

static void gpu_release(int32_t index, void *ptr) {
  if (ptr == NULL) return;
  int prev = (int)index;
  if (use_device(index, &prev) == cudaSuccess) (void)cudaFree(ptr);
  restore_device(index, prev);
}

/* One cudaMemcpy in the direction kind; upload and download are the two directions. */
static attn_status copy(int32_t index, void *dst, const void *src, size_t bytes,
                        enum cudaMemcpyKind kind, char *why, size_t why_size) {
  int prev = (int)index;
  cudaError_t err = use_device(index, &prev);
  if (err == cudaSuccess) err = cudaMemcpy(dst, src, bytes, kind);
  restore_device(index, prev);
  return err == cudaSuccess ? ATTN_STATUS_OK : failure(err, "cudaMemcpy", index, why, why_size);
}

static attn_status gpu_upload(int32_t index, void *dst, const void *src, size_t bytes, char *why,
                              size_t why_size) {
  return copy(index, dst, src, bytes, cudaMemcpyHostToDevice, why, why_size);
}

static attn_status gpu_download(int32_t index, void *dst, const void *src, size_t bytes, char *why,
                                size_t why_size) {
  return copy(index, dst, src, bytes, cudaMemcpyDeviceToHost, why, why_size);
}

static attn_status gpu_synchronize(int32_t index, char *why, size_t why_size) {
  int prev = (int)index;
  cudaError_t err = use_device(index, &prev);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  restore_device(index, prev);
  return err == cudaSuccess ? ATTN_STATUS_OK
                            : failure(err, "cudaDeviceSynchronize", index, why, why_size);
}

static void gpu_fingerprint(int32_t index, char *buf, size_t size) {
  struct cudaDeviceProp prop;
  int driver = 0;
  if (cudaGetDeviceProperties(&prop, (int)index) != cudaSuccess) {
    (void)cudaGetLastError(); /* clear the sticky error the query left */
    attn_format(buf, size, "device %d unavailable", (int)index);
    return;
  }
  (void)cudaDriverGetVersion(&driver);
  attn_format(buf, size, "%s sm_%d%d %dSM driver %d", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, driver);
}

static attn_status gpu_device_count(int32_t *count, char *why, size_t why_size) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError(); /* clear the error the query left, as gpu_fingerprint does */
    *count = 0;
    attn_format(why, why_size, "cudaGetDeviceCount failed: %s (%s)", cudaGetErrorString(err),
                cudaGetErrorName(err));
    return ATTN_STATUS_DEVICE_ERROR;
  }
  *count = (int32_t)n;
  return ATTN_STATUS_OK;
}

/* By field name, so a field added to the table cannot shift the others. */
const attn_gpu_ops attn_gpu_runtime_ops = {
    .alloc = gpu_alloc,
    .release = gpu_release,
    .upload = gpu_upload,
    .download = gpu_download,
    .synchronize = gpu_synchronize,
    .fingerprint = gpu_fingerprint,
    .device_count = gpu_device_count,
};
