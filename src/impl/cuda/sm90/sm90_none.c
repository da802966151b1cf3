/*
 * src/impl/cuda/sm90/sm90_none.c - what stands in for sm90_launch.cu in a build whose CUDA toolkit
 * cannot target sm_90a (before CUDA 12.0): no Hopper forward or backward, and the reason.
 */
#include "impl/cuda/cuda_launch.h"

#include <stdio.h>

static const char no_sm90[] =
    "this build has no sm90 kernels: its CUDA toolkit cannot target sm_90a";

int attn_cuda_sm90_built(void) { return 0; }

const char *attn_cuda_sm90_unsupported(const attn_cuda_params *p) {
  (void)p;
  return no_sm90;
}

const char *attn_cuda_sm90_bwd_unsupported(const attn_cuda_params *p) {
  (void)p;
  return no_sm90;
}

attn_status attn_cuda_sm90_backward(const attn_cuda_params *p, int is_bf16, void *stream, char *why,
                                    size_t why_size) {
  (void)p, (void)is_bf16, (void)stream;
  if (why != NULL && why_size > 0) snprintf(why, why_size, "%s", no_sm90);
  return ATTN_STATUS_UNSUPPORTED;
}

const char *attn_cuda_sm90_fp8_unsupported(const attn_cuda_params *p) {
  (void)p;
  return no_sm90;
}

size_t attn_cuda_sm90_fp8_workspace(const attn_cuda_params *p) {
  (void)p;
  return 0;
}

int64_t attn_cuda_sm90_fp8_vt_columns(const attn_cuda_params *p) {
  (void)p;
  return 0;
}

attn_status attn_cuda_sm90_fp8_forward(const attn_cuda_params *p, int variant, void *stream,
                                       char *why, size_t why_size) {
  (void)p, (void)variant, (void)stream;
  if (why != NULL && why_size > 0) snprintf(why, why_size, "%s", no_sm90);
  return ATTN_STATUS_UNSUPPORTED;
}

attn_status attn_cuda_sm90_forward(const attn_cuda_params *p, int is_bf16, void *stream, char *why,
                                   size_t why_size) {
  (void)p, (void)is_bf16, (void)stream;
  if (why != NULL && why_size > 0) snprintf(why, why_size, "%s", no_sm90);
  return ATTN_STATUS_UNSUPPORTED;
}
