/*
 * src/core/device.c - CPU model and instruction sets (cpuid and xgetbv on x86, /proc/cpuinfo
 * elsewhere), the one test kernel choices make (attn_cpu_can_run), and the device fingerprint that
 * keys the configuration cache.
 *
 * cpuid and xgetbv are read directly (<cpuid.h>, one inline xgetbv) rather than through the
 * compilers' __builtin_cpu_supports, whose feature names differ between GCC and Clang versions and
 * which does not say whether the OS saves the AVX-512 or AMX state.
 *
 * A tuned configuration is only valid on hardware like the one that measured it, so the
 * fingerprint holds everything that changes which kernel wins: the model, the instruction sets the
 * process may use, and the number of logical CPUs.
 */
#define _GNU_SOURCE
#include "core/device.h"

#include "core/ctx.h"
#include "core/gpu.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#if defined(__linux__)
#include <sys/syscall.h>
#endif

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
/* cpuid leaf 1, ECX */
#define CPUID1_ECX_SSE42 (1u << 20)
#define CPUID1_ECX_FMA (1u << 12)
#define CPUID1_ECX_OSXSAVE (1u << 27) /* the OS enabled XSAVE: xgetbv may be executed */
#define CPUID1_ECX_AVX (1u << 28)
#define CPUID1_ECX_F16C (1u << 29)
/* cpuid leaf 7 subleaf 0, EBX and EDX; subleaf 1, EAX */
#define CPUID7_EBX_AVX2 (1u << 5)
#define CPUID7_EBX_AVX512F (1u << 16)
#define CPUID7_EBX_AVX512DQ (1u << 17)
#define CPUID7_EBX_AVX512BW (1u << 30)
#define CPUID7_EBX_AVX512VL (1u << 31)
#define CPUID7_EDX_AMX_BF16 (1u << 22)
#define CPUID7_EDX_AVX512FP16 (1u << 23)
#define CPUID7_EDX_AMX_TILE (1u << 24)
#define CPUID7_1_EAX_AVX512BF16 (1u << 5)
/* XCR0: the register state the OS saves on a context switch. An instruction set is usable only if
 * its state is saved, whatever cpuid says (a kernel or hypervisor may leave AVX-512 off). */
#define XCR0_YMM 0x6ull                          /* SSE and AVX (upper halves of YMM) */
#define XCR0_ZMM 0xe6ull                         /* ... and opmask, ZMM_Hi256 and Hi16_ZMM */
#define XCR0_TILES ((1ull << 17) | (1ull << 18)) /* XTILECFG and XTILEDATA */

/* xgetbv(0) by its opcode's mnemonic: GCC and Clang both take this, without -mxsave. */
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
  if (c & CPUID1_ECX_SSE42) f |= ATTN_CPU_SSE42;
  unsigned long long xcr0 = (c & CPUID1_ECX_OSXSAVE) ? xgetbv0() : 0;
  int ymm = (xcr0 & XCR0_YMM) == XCR0_YMM;
  int zmm = (xcr0 & XCR0_ZMM) == XCR0_ZMM;
  int tiles = (xcr0 & XCR0_TILES) == XCR0_TILES;
  if (ymm && (c & CPUID1_ECX_AVX)) f |= ATTN_CPU_AVX;
  if (ymm && (c & CPUID1_ECX_FMA)) f |= ATTN_CPU_FMA;
  if (ymm && (c & CPUID1_ECX_F16C)) f |= ATTN_CPU_F16C;
  if (__get_cpuid_max(0, NULL) >= 7) {
    unsigned max7;
    __cpuid_count(7, 0, max7, b, c, d);
    if (ymm && (b & CPUID7_EBX_AVX2)) f |= ATTN_CPU_AVX2;
    if (zmm && (b & CPUID7_EBX_AVX512F)) f |= ATTN_CPU_AVX512F;
    if (zmm && (b & CPUID7_EBX_AVX512DQ)) f |= ATTN_CPU_AVX512DQ;
    if (zmm && (b & CPUID7_EBX_AVX512BW)) f |= ATTN_CPU_AVX512BW;
    if (zmm && (b & CPUID7_EBX_AVX512VL)) f |= ATTN_CPU_AVX512VL;
    if (zmm && (d & CPUID7_EDX_AVX512FP16)) f |= ATTN_CPU_AVX512FP16;
    if (tiles && (d & CPUID7_EDX_AMX_TILE)) f |= ATTN_CPU_AMX_TILE;
    if (tiles && (d & CPUID7_EDX_AMX_BF16)) f |= ATTN_CPU_AMX_BF16;
    if (max7 >= 1) { /* EAX of subleaf 0 is the highest subleaf */
      unsigned a1, b1, c1, d1;
      __cpuid_count(7, 1, a1, b1, c1, d1);
      (void)b1, (void)c1, (void)d1;
      if (zmm && (a1 & CPUID7_1_EAX_AVX512BF16)) f |= ATTN_CPU_AVX512BF16;
    }
  }
  info->features = f;
}
#endif

/* AMX tile data is a dynamically enabled state on Linux (5.16 on): XCR0 has its bits, but the first
 * tile instruction of a process that has not asked for it faults (SIGILL). The request is made only
 * when a kernel choice asks for AMX, never at detection: granting it enlarges the signal frames of
 * the whole process, which a library should not impose on programs that never run AMX code. */
#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int amx_granted;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void request_amx(void) {
#if defined(ATTN_X86) && defined(__linux__) && defined(SYS_arch_prctl)
  /* A refusal (older kernel: EINVAL) is an answer, not an error of the caller's. */
  int saved_errno = errno;
  unsigned long permitted = 0;
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 &&
      syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &permitted) == 0 &&
      (permitted & (1ul << XFEATURE_XTILEDATA)) != 0)
    amx_granted = 1;
  errno = saved_errno;
#endif
}

int attn_cpu_can_run(unsigned features) {
  if (features == 0) return 0;
  if ((attn_cpu_info_get()->features & features) != features) return 0;
  if (features & ATTN_CPU_AMX_ANY) {
    pthread_once(&amx_once, request_amx);
    if (!amx_granted) return 0;
  }
  return 1;
}

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
               {ATTN_CPU_AVX512DQ, "avx512dq"},
               {ATTN_CPU_AVX512BW, "avx512bw"},
               {ATTN_CPU_AVX512VL, "avx512vl"},
               {ATTN_CPU_AVX512BF16, "avx512bf16"},
               {ATTN_CPU_AVX512FP16, "avx512fp16"},
               {ATTN_CPU_AMX_TILE, "amx-tile"},
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
