/*
 * src/core/device.h - what the library knows about the machine: the CPU's model and instruction
 * sets, and the fingerprint that keys tuned configurations to the hardware that measured them.
 */
#ifndef ATTN_CORE_DEVICE_H
#define ATTN_CORE_DEVICE_H

#include "attn.h"

#include <stddef.h>

/* Instruction sets that change which kernel is fastest; one bit each. */
enum {
  ATTN_CPU_SSE42 = 1 << 0,
  ATTN_CPU_AVX = 1 << 1,
  ATTN_CPU_AVX2 = 1 << 2,
  ATTN_CPU_FMA = 1 << 3,
  ATTN_CPU_F16C = 1 << 4,
  ATTN_CPU_AVX512F = 1 << 5,
  ATTN_CPU_AVX512BW = 1 << 6,
  ATTN_CPU_AVX512VL = 1 << 7,
  ATTN_CPU_AVX512BF16 = 1 << 8,
  ATTN_CPU_AVX512FP16 = 1 << 9,
  ATTN_CPU_AMX_BF16 = 1 << 10,
  ATTN_CPU_NEON = 1 << 11,
  ATTN_CPU_SVE = 1 << 12,
  ATTN_CPU_AVX512DQ = 1 << 13,
  ATTN_CPU_AMX_TILE = 1 << 14
};

/* The AMX bits: usable only once the OS has granted this process the tile data state. */
#define ATTN_CPU_AMX_ANY (ATTN_CPU_AMX_TILE | ATTN_CPU_AMX_BF16)

typedef struct attn_cpu_info {
  char model[128];         /* brand string, e.g. "AMD EPYC 9654 96-Core Processor"; "unknown" */
  unsigned features;       /* ATTN_CPU_* bits the CPU has and the OS saves the state of (XCR0) */
  char feature_names[256]; /* the set bits as a comma-separated list, e.g. "avx,avx2,fma" */
  int logical_cpus;        /* online logical CPUs (>= 1) */
} attn_cpu_info;

/* The CPU of this machine, detected once (thread safe). */
const attn_cpu_info *attn_cpu_info_get(void);

/* Whether this process may run instructions of every set in `features` (ATTN_CPU_* bits): the CPU
 * has them, the OS saves their register state (XCR0: YMM for AVX, opmask and ZMM for AVX-512, tile
 * state for AMX) and, for AMX bits, Linux has granted the process the tile data state (asked once,
 * on the first such query: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)). The one test a
 * kernel choice makes; the same answer under every compiler (it reads cpuid and xgetbv itself).
 * 0 for an empty set. Thread safe. */
int attn_cpu_can_run(unsigned features);

/* A one-line fingerprint of the device a problem runs on, with no tab or newline:
 * "cpu <model> [features] x<logical cpus>" for the CPU, "cuda <name> sm_XY <n>SM driver <v>" for a
 * GPU (attn_gpu()->fingerprint; "cuda unknown" in a build without the CUDA runtime). */
void attn_device_fingerprint(int32_t device, int32_t device_index, char *buf, size_t size);

#endif /* ATTN_CORE_DEVICE_H */
