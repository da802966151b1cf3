/*
 * tests/modules/fake_module.c - stand-ins for the GPU modules, for tests/modules/test_modules.sh:
 * the loader's paths can then be tested on any machine. Built as libattn_cuda.so in several
 * folders, one per defect (FAKE_DEFECT): none (a module whose implementation "fakegpu" runs
 * nothing), a wrong ABI, a wrong name, and (linked to a library that is not on any search path)
 * a missing dependency, which is what a machine without CUDA shows for the real module.
 */
#include "module/module.h"

#include <stdio.h>

#ifdef FAKE_NEEDS_DEP
int fake_dep_value(void); /* in libattn_fake_dep.so, which the test hides */
#endif

static attn_status fake_supports(const attn_problem *p, char *why, size_t why_size) {
  (void)p;
#ifdef FAKE_NEEDS_DEP
  snprintf(why, why_size, "fake module %d", fake_dep_value());
#else
  snprintf(why, why_size, "the fake module of tests/modules runs nothing");
#endif
  return ATTN_STATUS_UNSUPPORTED;
}
static int32_t fake_num_configs(const attn_problem *p) {
  (void)p;
  return 1;
}
static void fake_config_name(const attn_problem *p, int32_t c, char *buf, size_t size) {
  (void)p, (void)c;
  snprintf(buf, size, "default");
}
static int32_t fake_default_config(const attn_problem *p) {
  (void)p;
  return 0;
}
static size_t fake_workspace(const attn_problem *p, int32_t c, const void *st, int backward) {
  (void)p, (void)c, (void)st, (void)backward;
  return 0;
}
static attn_status fake_run(const attn_run *run) {
  (void)run;
  return ATTN_STATUS_UNSUPPORTED;
}

static const attn_impl fake_impl = {
    .name = "fakegpu",
    .device = ATTN_DEVICE_CUDA,
    .version = 1,
    .supports = fake_supports,
    .num_configs = fake_num_configs,
    .config_name = fake_config_name,
    .default_config = fake_default_config,
    .workspace_size = fake_workspace,
    .forward = fake_run,
    .backward = fake_run,
};
static const attn_impl *const fake_impls[] = {&fake_impl};

#if defined(FAKE_BAD_ABI)
#define FAKE_ABI 999
#else
#define FAKE_ABI ATTN_MODULE_ABI
#endif
#if defined(FAKE_BAD_NAME)
#define FAKE_NAME "cudnn"
#else
#define FAKE_NAME "cuda"
#endif

static const attn_module_table fake_table = {FAKE_ABI,
                                             sizeof(attn_problem),
                                             sizeof(attn_impl),
                                             sizeof(attn_run),
                                             sizeof(attn_gpu_ops),
                                             FAKE_NAME,
                                             fake_impls,
                                             1,
                                             NULL,
                                             NULL,
                                             NULL};

__attribute__((visibility("default"))) const attn_module_table *attn_module_entry_v3(void);
const attn_module_table *attn_module_entry_v3(void) { return &fake_table; }
