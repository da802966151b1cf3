/*
 * src/core/device.c - CPU model and instruction sets (cpuid on x86, /proc/cpuinfo and auxv
 * elsewhere), and the device fingerprint that keys the configuration cache.
 *
 * A tuned configuration is only valid on hardware like the one that measured it, so the
 * fingerprint holds everything that changes which kernel wins: the model, the instruction sets the
 * process may use, and the number of logical CPUs.
 */
#define _GNU_SOURCE
#include "core/device.h"

#include "core/ctx.h"
#include "core/gpu.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define ATTN_X86 1
#endif

static attn_cpu_info cpu_info;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

/* Trims spaces at both ends and squeezes runs of spaces (brand strings are padded). */
static void squeeze(char *s) {
  char *w = s;
  int space = 1;
  for (char *r = s; *r; ++r) {
    char c = (*r == '\t' || *r == '\n' || *r == '\r') ? ' ' : *r;
    if (c == ' ' && space) continue;
    space = c == ' ';
    *w++ = c;
  }
  if (w > s && w[-1] == ' ') --w;
  *w = '\0';
}

/* The value of the first "key : value" line of /proc/cpuinfo whose key is key; 0 if none. */
static int cpuinfo_field(const char *key, char *buf, size_t size) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f == NULL) return 0;
  char line[4096];
  int found = 0;
  size_t n = strlen(key);
  while (!found && fgets(line, sizeof line, f) != NULL) {
    if (strncmp(line, key, n) != 0) continue;
    char *colon = strchr(line, ':');
    if (colon == NULL) continue;
    snprintf(buf, size, "%s", colon + 1);
    squeeze(buf);
    found = 1;
  }
  fclose(f);
  return found;
}

#ifdef ATTN_X86
static unsigned long long xgetbv0(void) {
  unsigned eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return ((unsigned long long)edx << 32) | eax;
}

static void detect_x86(attn_cpu_info *info) {
  unsigned a, b, c, d;
  unsigned max_ext = __get_cpuid_max(0x80000000u, NULL);
  if (max_ext >= 0x80000004u) {
    unsigned regs[12];
    for (unsigned i = 0; i < 3; ++i)
      __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2],
                  &regs[4 * i + 3]);
    memcpy(info->model, regs, sizeof regs);
    info->model[sizeof regs] = '\0';
    squeeze(info->model);
  }
  if (!__get_cpuid(1, &a, &b, &c, &d)) return;
  unsigned f = 0;
  if (c & bit_SSE4_2) f |= ATTN_CPU_SSE42;
  int osxsave = (c & bit_OSXSAVE) != 0;
  unsigned long long xcr0 = osxsave ? xgetbv0() : 0;
  int ymm = (xcr0 & 0x6) == 0x6;           /* the OS saves XMM and YMM state */
  int zmm = (xcr0 & 0xe6) == 0xe6;         /* ... and opmask and ZMM state */
  int tiles = (xcr0 & 0x60000) == 0x60000; /* ... and AMX tile state */
  if (ymm && (c & bit_AVX)) f |= ATTN_CPU_AVX;
  if (ymm && (c & bit_FMA)) f |= ATTN_CPU_FMA;
  if (ymm && (c & bit_F16C)) f |= ATTN_CPU_F16C;
  if (__get_cpuid_max(0, NULL) >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    if (ymm && (b & bit_AVX2)) f |= ATTN_CPU_AVX2;
    if (zmm && (b & bit_AVX512F)) f |= ATTN_CPU_AVX512F;
    if (zmm && (b & bit_AVX512BW)) f |= ATTN_CPU_AVX512BW;
    if (zmm && (b & bit_AVX512VL)) f |= ATTN_CPU_AVX512VL;
    if (zmm && (d & (1u << 23))) f |= ATTN_CPU_AVX512FP16;
    if (tiles && (d & (1u << 22))) f |= ATTN_CPU_AMX_BF16;
    unsigned a1, b1, c1, d1;
    __cpuid_count(7, 1, a1, b1, c1, d1);
    (void)b1, (void)c1, (void)d1;
    if (zmm && (a1 & (1u << 5))) f |= ATTN_CPU_AVX512BF16;
  }
  info->features = f;
}
#endif

static void detect(void) {
  attn_cpu_info *info = &cpu_info;
  snprintf(info->model, sizeof info->model, "unknown");
#ifdef ATTN_X86
  detect_x86(info);
#else
  /* Other architectures: the model and flags as the kernel reports them. */
  char flags[4096] = "";
  if (!cpuinfo_field("model name", info->model, sizeof info->model))
    cpuinfo_field("CPU part", info->model, sizeof info->model);
  if (cpuinfo_field("Features", flags, sizeof flags)) {
    if (strstr(flags, "asimd") != NULL) info->features |= ATTN_CPU_NEON;
    if (strstr(flags, " sve") != NULL || strncmp(flags, "sve", 3) == 0)
      info->features |= ATTN_CPU_SVE;
  }
#endif
  if (strcmp(info->model, "unknown") == 0 || info->model[0] == '\0')
    if (!cpuinfo_field("model name", info->model, sizeof info->model))
      snprintf(info->model, sizeof info->model, "unknown");
  static const struct {
    unsigned bit;
    const char *name;
  } names[] = {{ATTN_CPU_SSE42, "sse4.2"},
               {ATTN_CPU_AVX, "avx"},
               {ATTN_CPU_AVX2, "avx2"},
               {ATTN_CPU_FMA, "fma"},
               {ATTN_CPU_F16C, "f16c"},
               {ATTN_CPU_AVX512F, "avx512f"},
               {ATTN_CPU_AVX512BW, "avx512bw"},
               {ATTN_CPU_AVX512VL, "avx512vl"},
               {ATTN_CPU_AVX512BF16, "avx512bf16"},
               {ATTN_CPU_AVX512FP16, "avx512fp16"},
               {ATTN_CPU_AMX_BF16, "amx-bf16"},
               {ATTN_CPU_NEON, "neon"},
               {ATTN_CPU_SVE, "sve"}};
  size_t used = 0;
  info->feature_names[0] = '\0';
  for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i) {
    if (!(info->features & names[i].bit)) continue;
    int n = snprintf(info->feature_names + used, sizeof info->feature_names - used, "%s%s",
                     used ? "," : "", names[i].name);
    if (n < 0 || used + (size_t)n >= sizeof info->feature_names) break;
    used += (size_t)n;
  }
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  info->logical_cpus = cpus > 0 ? (int)cpus : 1;
}

const attn_cpu_info *attn_cpu_info_get(void) {
  pthread_once(&cpu_once, detect);
  return &cpu_info;
}

void attn_device_fingerprint(int32_t device, int32_t device_index, char *buf, size_t size) {
  if (device == ATTN_DEVICE_CUDA) {
    char gpu[256] = "unknown";
    const attn_gpu_ops *ops = attn_gpu();
    if (ops != NULL) ops->fingerprint(device_index, gpu, sizeof gpu);
    squeeze(gpu);
    attn_format(buf, size, "cuda %s", gpu);
    return;
  }
  const attn_cpu_info *cpu = attn_cpu_info_get();
  attn_format(buf, size, "cpu %s [%s] x%d", cpu->model, cpu->feature_names, cpu->logical_cpus);
}
