/*
 * src/core/gpu.h - the few CUDA runtime services the core needs outside the implementations:
 * device buffers, copies and a synchronisation, so the tuner (src/plan/tune.c) can time GPU
 * candidates on scratch data of its own and the attn tool (tools/harness.c) can check and time GPU
 * problems, the number of GPUs, and the GPU's fingerprint, which keys the configuration cache
 * (device.c). One table, so that the core compiles and links without CUDA.
 */
#ifndef ATTN_CORE_GPU_H
#define ATTN_CORE_GPU_H

#include "attn.h"

#include <stddef.h>
#include <stdint.h>

typedef struct attn_gpu_ops {
  /* bytes of device memory on GPU device_index; *ptr = NULL on failure */
  attn_status (*alloc)(int32_t device_index, size_t bytes, void **ptr, char *why, size_t why_size);
  void (*release)(int32_t device_index, void *ptr); /* NULL is ignored */
  /* host src -> device dst */
  attn_status (*upload)(int32_t device_index, void *dst, const void *src, size_t bytes, char *why,
                        size_t why_size);
  /* device src -> host dst */
  attn_status (*download)(int32_t device_index, void *dst, const void *src, size_t bytes, char *why,
                          size_t why_size);
  /* waits until every piece of work queued on the device has finished */
  attn_status (*synchronize)(int32_t device_index, char *why, size_t why_size);
  /* name, compute capability, multiprocessors and driver, on one line */
  void (*fingerprint)(int32_t device_index, char *buf, size_t size);
  /* how many GPUs this process sees; *count = 0 and the runtime's reason in why when there is no
   * driver or no device (DEVICE_ERROR) */
  attn_status (*device_count)(int32_t *count, char *why, size_t why_size);
} attn_gpu_ops;

/* The services of the first GPU module that loaded (src/module), or NULL when none did. */
const attn_gpu_ops *attn_gpu(void);

#endif /* ATTN_CORE_GPU_H */
