/*
 * tests/fake_impls.h - fake implementations for the executor's tests, installed with
 * attn_registry_set_for_testing so they never enter the real registry. Header-only: included by
 * test_executor.c and test_cache.c.
 *
 *   cpu_fake   configurations tile16, tile32 (default), tile64; each run spins for the time in
 *              fake_spin_us[config] so real autotuning has a known winner; supports head_dim <= 64
 *   fake2      configurations tile32, tile64 (default); supports every problem
 *   cudnn_fake platform cuDNN by its name (device CPU, so it can run here); one configuration
 *   ref        the real reference, last as always
 */
#ifndef ATTN_TEST_FAKE_IMPLS_H
#define ATTN_TEST_FAKE_IMPLS_H

#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "impl/impl.h"
#include "plan/exec.h"
#include "plan/registry.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

extern const attn_impl attn_ref_impl;

static double fake_spin_us[3] = {0.0, 0.0, 0.0}; /* cpu_fake's run time per configuration */
static int fake_forward_calls[3], fake_backward_calls[3];

static inline void fake_spin(double us) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do clock_gettime(CLOCK_MONOTONIC, &t);
  while ((double)(t.tv_sec - t0.tv_sec) * 1e6 + (double)(t.tv_nsec - t0.tv_nsec) * 1e-3 < us);
}

static attn_status fake_supports_d64(const attn_problem *p, char *why, size_t n) {
  if (p->head_dim <= 64) return ATTN_STATUS_OK;
  snprintf(why, n, "head_dim=%lld is more than 64", (long long)p->head_dim);
  return ATTN_STATUS_UNSUPPORTED;
}
static attn_status fake_supports_all(const attn_problem *p, char *why, size_t n) {
  (void)p, (void)why, (void)n;
  return ATTN_STATUS_OK;
}
static int32_t fake_three(const attn_problem *p) { return (void)p, 3; }
static int32_t fake_two(const attn_problem *p) { return (void)p, 2; }
static int32_t fake_one(const attn_problem *p) { return (void)p, 1; }
static void fake_tile_name(const attn_problem *p, int32_t c, char *buf, size_t n) {
  (void)p;
  snprintf(buf, n, "tile%d", 16 << c);
}
static void fake2_tile_name(const attn_problem *p, int32_t c, char *buf, size_t n) {
  (void)p;
  snprintf(buf, n, "tile%d", 32 << c);
}
/* fake2's tile64 (config 1) accumulates with atomics, as it were: not deterministic. */
static int fake2_deterministic(const attn_problem *p, int32_t c) { return (void)p, c != 1; }
static void fake_default_name(const attn_problem *p, int32_t c, char *buf, size_t n) {
  (void)p, (void)c;
  snprintf(buf, n, "default");
}
static int32_t fake_default_1(const attn_problem *p) { return (void)p, 1; }
static int32_t fake_default_0(const attn_problem *p) { return (void)p, 0; }
static size_t fake_no_workspace(const attn_problem *p, int32_t c, const void *state, int backward) {
  (void)state;
  return (void)p, (void)c, (void)backward, 0;
}
static attn_status fake_forward(const attn_run *run) {
  fake_forward_calls[run->config]++;
  fake_spin(fake_spin_us[run->config]);
  return ATTN_STATUS_OK;
}
static attn_status fake_backward(const attn_run *run) {
  fake_backward_calls[run->config]++;
  fake_spin(fake_spin_us[run->config]);
  return ATTN_STATUS_OK;
}
static attn_status fake_noop(const attn_run *run) { return (void)run, ATTN_STATUS_OK; }

static attn_impl fake_cpu = {"cpu_fake",
                             ATTN_DEVICE_CPU,
                             1,
                             fake_supports_d64,
                             fake_three,
                             fake_tile_name,
                             fake_default_1,
                             fake_no_workspace,
                             NULL,
                             NULL,
                             fake_forward,
                             fake_backward,
                             NULL,
                             0};
static attn_impl fake_2 = {"fake2",
                           ATTN_DEVICE_CPU,
                           1,
                           fake_supports_all,
                           fake_two,
                           fake2_tile_name,
                           fake_default_1,
                           fake_no_workspace,
                           NULL,
                           NULL,
                           fake_noop,
                           fake_noop,
                           fake2_deterministic,
                           0};
static attn_impl fake_cudnn = {"cudnn_fake",
                               ATTN_DEVICE_CPU,
                               1,
                               fake_supports_all,
                               fake_one,
                               fake_default_name,
                               fake_default_0,
                               fake_no_workspace,
                               NULL,
                               NULL,
                               fake_noop,
                               fake_noop,
                               NULL,
                               0};

static const attn_impl *const fake_registry[] = {&fake_cpu, &fake_2, &fake_cudnn, &attn_ref_impl};

static inline void fake_install(void) { attn_registry_set_for_testing(fake_registry, 4); }
static inline void fake_uninstall(void) { attn_registry_set_for_testing(NULL, 0); }

/* Injected timings: "impl/config" -> microseconds; unknown candidates take 1000 us. */
typedef struct fake_timing {
  const char *candidate;
  double us;
} fake_timing;
static const fake_timing *fake_timings;
static int fake_timer_calls;

static double fake_timer(void *user, const char *impl, const char *config, const char *problem) {
  (void)user, (void)problem;
  char name[256];
  snprintf(name, sizeof name, "%s/%s", impl, config);
  fake_timer_calls++;
  for (const fake_timing *t = fake_timings; t != NULL && t->candidate != NULL; ++t)
    if (strcmp(t->candidate, name) == 0) return t->us;
  return 1000.0;
}

/* Uses these timings for every candidate (NULL: measure for real). */
static inline void fake_inject(const fake_timing *timings) {
  fake_timings = timings;
  fake_timer_calls = 0;
  attn_tune_set_timer_for_testing(timings != NULL ? fake_timer : NULL, NULL);
}

#endif /* ATTN_TEST_FAKE_IMPLS_H */
