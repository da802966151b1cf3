/*
 * src/impl/cuda/cuda_check.cuh - the one way CUDA errors become statuses in src/impl/cuda: every
 * runtime call goes through ATTN_CUDA_CHECK, which records the expression, file and line in `why`
 * and returns DEVICE_ERROR from the enclosing function (whose `why` and `why_size` are in scope).
 */
#ifndef ATTN_IMPL_CUDA_CUDA_CHECK_CUH
#define ATTN_IMPL_CUDA_CUDA_CHECK_CUH

#include "attn.h"

#include <cuda_runtime.h>
#include <stdio.h>

static inline attn_status attn_cuda_fail(char *why, size_t why_size, cudaError_t err,
                                         const char *expr, const char *file, int line) {
  if (why != NULL && why_size > 0)
    snprintf(why, why_size, "%s failed: %s (%s) at %s:%d", expr, cudaGetErrorString(err),
             cudaGetErrorName(err), file, line);
  return ATTN_STATUS_DEVICE_ERROR;
}

#define ATTN_CUDA_CHECK(expr)                                                                      \
  do {                                                                                             \
    cudaError_t attn_err_ = (expr);                                                                \
    if (attn_err_ != cudaSuccess)                                                                  \
      return attn_cuda_fail(why, why_size, attn_err_, #expr, __FILE__, __LINE__);                  \
  } while (0)

#endif /* ATTN_IMPL_CUDA_CUDA_CHECK_CUH */
