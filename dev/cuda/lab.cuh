/*
 * dev/cuda/lab.cuh - what the kernel labs (fwd_tiles.cu, bwd_tiles.cu, fwd_hopper.cu) share: a fatal check of
 * CUDA calls, seeded bf16 / f16 inputs in [-1, 1), the median time of a launch, and the largest
 * difference between two results.
 */
#ifndef ATTN_DEV_CUDA_LAB_CUH
#define ATTN_DEV_CUDA_LAB_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

typedef __nv_bfloat16 bf;

#define CU(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      printf("%s: %s\n", #x, cudaGetErrorString(e_));                                              \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

/* n values in [-1, 1) from a hash of (index, seed); T is bf16 or f16. */
template <typename T> __global__ void fill(T *x, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    x[i] = T((h & 0xffff) / 32768.f - 1.f);
  }
}

__global__ void maxdiff(const bf *a, const bf *b, size_t n, float *out) {
  float m = 0.f;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    m = fmaxf(m, fabsf(__bfloat162float(a[i]) - __bfloat162float(b[i])));
  atomicMax(reinterpret_cast<int *>(out), __float_as_int(m));
}

/* Median milliseconds of launch() (one kernel call on the default stream) over 10 CUDA-event
 * timings after 3 untimed calls. */
template <typename F> float median_ms(F launch) {
  std::vector<float> ms;
  cudaEvent_t a, b;
  CU(cudaEventCreate(&a));
  CU(cudaEventCreate(&b));
  for (int r = 0; r < 13; ++r) {
    CU(cudaEventRecord(a));
    launch();
    CU(cudaEventRecord(b));
    CU(cudaEventSynchronize(b));
    float t;
    CU(cudaEventElapsedTime(&t, a, b));
    if (r >= 3) ms.push_back(t);
  }
  CU(cudaEventDestroy(a));
  CU(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

/* max |a - b| over n elements (0 when a and b are the same buffer). */
static float diff(const bf *a, const bf *b, size_t n) {
  if (a == b) return 0.f;
  float *d, md;
  CU(cudaMalloc(&d, 4));
  CU(cudaMemset(d, 0, 4));
  maxdiff<<<1024, 256>>>(a, b, n, d);
  CU(cudaMemcpy(&md, d, 4, cudaMemcpyDeviceToHost));
  CU(cudaFree(d));
  return md;
}

#endif /* ATTN_DEV_CUDA_LAB_CUH */
