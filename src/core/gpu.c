/*
 * src/core/gpu.c - attn_gpu(): the CUDA runtime services of gpu.h, which live in the GPU modules
 * (src/module/gpu_runtime.c) so that the core links no CUDA library. NULL when no module loaded.
 */
#include "core/gpu.h"

#include "module/module.h"

const attn_gpu_ops *attn_gpu(void) { return attn_module_gpu(); }
