/*
 * tests/test_device.c - the instruction-set detection (src/core/device.c) against the kernel's own
 * view, and the cpu implementation's kernel choice against the detection.
 *
 * device.c reads cpuid and xgetbv itself, so it gives the same answer under every compiler; Linux
 * lists in /proc/cpuinfo the sets the CPU has and the kernel enabled (it clears the AVX-512 flags
 * when it does not save their state). Each set Linux lists must be detected; each of the long-known
 * sets detected must be listed (a newer set may be missing from an older kernel's list). Then the
 * "cpu" kernel table must be the best the detection allows, and ATTN_CPU_ISA may only lower it.
 * Exit 77 (skipped) for the /proc/cpuinfo part where there is no such file or no x86 CPU.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "core/device.h"
#include "impl/cpu/cpu.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* " flag1 flag2 ... " of the first "flags" line, or "" when there is none. */
static void cpuinfo_flags(char *buf, size_t size) {
  buf[0] = '\0';
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f == NULL) return;
  char line[8192];
  while (fgets(line, sizeof line, f) != NULL) {
    if (strncmp(line, "flags", 5) != 0) continue;
    char *colon = strchr(line, ':');
    if (colon == NULL) continue;
    line[strcspn(line, "\n")] = '\0';
    snprintf(buf, size, "%s ", colon + 1);
    break;
  }
  fclose(f);
}

static int has_flag(const char *flags, const char *name) {
  char key[64];
  snprintf(key, sizeof key, " %s ", name);
  return strstr(flags, key) != NULL;
}

int main(void) {
  const attn_cpu_info *cpu = attn_cpu_info_get();
  printf("cpu: %s [%s] x%d\n", cpu->model, cpu->feature_names, cpu->logical_cpus);
  tu_check(attn_cpu_can_run(0) == 0, "attn_cpu_can_run(empty set) is 0");
  tu_check(cpu->logical_cpus >= 1, "at least one logical CPU (%d)", cpu->logical_cpus);

  /* can_run never says yes to a set the detection lacks */
  static const unsigned bits[] = {ATTN_CPU_AVX2,     ATTN_CPU_FMA,       ATTN_CPU_F16C,
                                  ATTN_CPU_AVX512F,  ATTN_CPU_AVX512BW,  ATTN_CPU_AVX512VL,
                                  ATTN_CPU_AVX512DQ, ATTN_CPU_AVX512BF16};
  for (size_t i = 0; i < sizeof bits / sizeof bits[0]; ++i)
    tu_check(attn_cpu_can_run(bits[i]) == ((cpu->features & bits[i]) != 0),
             "attn_cpu_can_run(0x%x) agrees with the detected features", bits[i]);

  /* The cpu implementation's default table is the best the detection allows. */
  unsigned avx2 = ATTN_CPU_AVX2 | ATTN_CPU_FMA | ATTN_CPU_F16C;
  unsigned avx512 =
      avx2 | ATTN_CPU_AVX512F | ATTN_CPU_AVX512BW | ATTN_CPU_AVX512VL | ATTN_CPU_AVX512DQ;
  const char *want = "generic";
#if defined(__x86_64__) || defined(__i386__)
  if (attn_cpu_can_run(avx512))
    want = "avx512";
  else if (attn_cpu_can_run(avx2))
    want = "avx2";
#endif
  const char *want_bf16 = want;
#if defined(__x86_64__) || defined(__i386__)
  if (attn_cpu_can_run(avx512 | ATTN_CPU_AVX512BF16)) want_bf16 = "avx512bf16";
  /* AMX tiles where the processor has them and Linux grants them (kernels_amx.c) */
  if (strcmp(want_bf16, "avx512bf16") == 0 && attn_cpu_can_run(ATTN_CPU_AMX_ANY)) want_bf16 = "amx";
#endif
  unsetenv("ATTN_CPU_ISA");
  tu_check(strcmp(attn_cpu_isa_name(ATTN_DTYPE_F32), want) == 0,
           "f32 problems run the %s kernels (%s chosen)", want, attn_cpu_isa_name(ATTN_DTYPE_F32));
  tu_check(strcmp(attn_cpu_isa_name(ATTN_DTYPE_BF16), want_bf16) == 0,
           "bf16 problems run the %s kernels (%s chosen)", want_bf16,
           attn_cpu_isa_name(ATTN_DTYPE_BF16));
  /* ATTN_CPU_ISA lowers, never raises */
  static const char *order[] = {"generic", "avx2", "avx512"};
  int best_rank = strcmp(want, "avx512") == 0 ? 2 : strcmp(want, "avx2") == 0 ? 1 : 0;
  for (int r = 0; r < 3; ++r) {
    setenv("ATTN_CPU_ISA", order[r], 1);
    const char *expect = order[r <= best_rank ? r : best_rank];
    const char *got = attn_cpu_isa_name(ATTN_DTYPE_F32);
    tu_check(strcmp(got, expect) == 0, "ATTN_CPU_ISA=%s runs the %s kernels here (%s chosen)",
             order[r], expect, got);
  }
  unsetenv("ATTN_CPU_ISA");

  char flags[8192];
  cpuinfo_flags(flags, sizeof flags);
#if defined(__x86_64__) || defined(__i386__)
  if (flags[0] == '\0') {
    printf("no flags line in /proc/cpuinfo: the comparison with the kernel's view is skipped\n");
    int failed = tu_failures();
    tu_finish();
    return failed ? 1 : 77;
  }
  /* Linux's names; `known` when every kernel that runs this test lists the set it knows. */
  static const struct {
    unsigned bit;
    const char *flag;
    int known;
  } sets[] = {{ATTN_CPU_SSE42, "sse4_2", 1},
              {ATTN_CPU_AVX, "avx", 1},
              {ATTN_CPU_AVX2, "avx2", 1},
              {ATTN_CPU_FMA, "fma", 1},
              {ATTN_CPU_F16C, "f16c", 1},
              {ATTN_CPU_AVX512F, "avx512f", 1},
              {ATTN_CPU_AVX512DQ, "avx512dq", 1},
              {ATTN_CPU_AVX512BW, "avx512bw", 1},
              {ATTN_CPU_AVX512VL, "avx512vl", 1},
              {ATTN_CPU_AVX512BF16, "avx512_bf16", 0},
              {ATTN_CPU_AVX512FP16, "avx512_fp16", 0},
              {ATTN_CPU_AMX_TILE, "amx_tile", 0},
              {ATTN_CPU_AMX_BF16, "amx_bf16", 0}};
  for (size_t i = 0; i < sizeof sets / sizeof sets[0]; ++i) {
    int listed = has_flag(flags, sets[i].flag);
    int detected = (cpu->features & sets[i].bit) != 0;
    if (listed)
      tu_check(detected, "%s: listed by Linux and detected", sets[i].flag);
    else if (sets[i].known)
      tu_check(!detected, "%s: not listed by Linux and not detected", sets[i].flag);
  }
  /* AMX: Linux lists it only when it manages the tile state, so the permission must be granted. */
  if (has_flag(flags, "amx_tile"))
    tu_check(attn_cpu_can_run(ATTN_CPU_AMX_TILE),
             "amx_tile listed: the tile data permission is granted (arch_prctl)");
  else
    tu_check(!attn_cpu_can_run(ATTN_CPU_AMX_TILE), "no amx_tile: AMX kernels are never chosen");
#else
  (void)has_flag;
#endif
  return tu_finish();
}
