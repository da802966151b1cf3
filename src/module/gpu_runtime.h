/*
 * src/module/gpu_runtime.h - the GPU services (core/gpu.h) on the CUDA runtime, for the modules'
 * tables; defined in gpu_runtime.c, which only modules compile.
 */
#ifndef ATTN_MODULE_GPU_RUNTIME_H
#define ATTN_MODULE_GPU_RUNTIME_H

#include "core/gpu.h"

extern const attn_gpu_ops attn_gpu_runtime_ops;

#endif /* ATTN_MODULE_GPU_RUNTIME_H */
