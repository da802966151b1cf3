/*
 * src/impl/cuda/cuda_launch.h - the extern "C" launchers of the CUDA kernels, called by cuda.c.
 *
 * Plain C: no CUDA type appears; the stream is a cudaStream_t passed as void *. Each launcher
 * returns ATTN_STATUS_OK or DEVICE_ERROR / UNSUPPORTED with the message (the failing CUDA call,
 * its file and line) written into why.
 */
#ifndef ATTN_IMPL_CUDA_CUDA_LAUNCH_H
#define ATTN_IMPL_CUDA_CUDA_LAUNCH_H

#include "attn.h"
#include "impl/cuda/cuda_params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The head dimension the kernels are compiled for that serves max(D, Dv): 32, 64, 96, 128, 192 or
 * 256; 0 when none does. */
int attn_cuda_kernel_dim(int d, int dv);

/* Compute capability (major * 10 + minor) and the opt-in shared memory per block of device
 * `index`; DEVICE_ERROR or UNSUPPORTED with the reason when there is no usable device. */
attn_status attn_cuda_device_info(int index, int *cc, size_t *smem_optin, char *why,
                                  size_t why_size);

/* Dynamic shared memory the kernels of a pass need at a kernel head dimension. */
size_t attn_cuda_smem_bytes(int kernel_dim, int backward);

/* The Hopper forward (src/impl/cuda/sm90, machine code for sm_90a only, so compute capability 9.0
 * only): whether this build has it (sm90_none.c stands in when the toolkit lacks sm_90a), and why
 * it cannot run p (a sentence) or NULL when it can. Its launcher is attn_cuda_forward with
 * p->use_sm90 set; attn_cuda_sm90_forward is that launcher's part, called on the right device. */
int attn_cuda_sm90_built(void);
const char *attn_cuda_sm90_unsupported(const attn_cuda_params *p);
attn_status attn_cuda_sm90_forward(const attn_cuda_params *p, int is_bf16, void *stream, char *why,
                                   size_t why_size);
/* The Hopper fp8 forward (sm90/sm90_fwd_fp8.cuh, p->fp8 set): why it cannot run p (NULL when it
 * can), the workspace it needs (V transposed) and that tensor's columns (p->vt_cols). Its launcher
 * is attn_cuda_forward with p->fp8 set; variant (ATTN_CUDA_FP8_*) picks the schedule and the key
 * block. */
const char *attn_cuda_sm90_fp8_unsupported(const attn_cuda_params *p);
size_t attn_cuda_sm90_fp8_workspace(const attn_cuda_params *p);
int64_t attn_cuda_sm90_fp8_vt_columns(const attn_cuda_params *p);
attn_status attn_cuda_sm90_fp8_forward(const attn_cuda_params *p, int variant, void *stream,
                                       char *why, size_t why_size);
/* The Hopper backward (sm90/sm90_bwd.cuh): why it cannot run p, or NULL when it can (D = 64 and
 * 128 with Dv = D, varlen, the soft cap, ALiBi and sinks; no dropout, bias, masks or segment ids;
 * the f32 dq workspace); attn_cuda_backward with p->use_sm90 set runs it there and elsewhere the
 * atomic sm80 backward, or the deterministic one when p->dq_semaphore is set. */
const char *attn_cuda_sm90_bwd_unsupported(const attn_cuda_params *p);
attn_status attn_cuda_sm90_backward(const attn_cuda_params *p, int is_bf16, void *stream, char *why,
                                    size_t why_size);

/* The forward pass: out, lse. is_bf16 selects bf16 (else f16) inputs; with p->fp8, e4m3 inputs on
 * the sm90 fp8 forward (its variant p->fp8 - 1). */
attn_status attn_cuda_forward(const attn_cuda_params *p, int is_bf16, void *stream, char *why,
                              size_t why_size);

/* The backward pass: dq, dk, dv (and dbias, dsinks when asked); uses p->delta and p->dbias_accum
 * in the caller's workspace. */
attn_status attn_cuda_backward(const attn_cuda_params *p, int is_bf16, void *stream, char *why,
                               size_t why_size);

#ifdef __cplusplus
}
#endif

#endif /* ATTN_IMPL_CUDA_CUDA_LAUNCH_H */
