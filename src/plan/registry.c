/*
 * src/plan/registry.c - THE list of implementations. Adding one is a line here (or in a module's
 * table, for implementations that need a GPU stack), its folder under src/impl/, and a line in
 * CMakeLists.txt; tests, benchmarks and tools reach it through this list.
 *
 * Order is preference: a plan without constraints takes the first that supports its problem.
 * Fast implementations come first; the reference, which supports everything, is always last.
 * The GPU implementations come from the modules loaded at run time (src/module/loader.c: cudnn,
 * then cuda), ahead of the ones built into the library.
 */
#include "plan/registry.h"

#include "module/module.h"

#include <pthread.h>
#include <string.h>

extern const attn_impl attn_cpu_impl;
extern const attn_impl attn_ref_impl;

static const attn_impl *const builtin[] = {
    &attn_cpu_impl, /* src/impl/cpu: tiled, vectorised, threaded flash attention on CPUs */
    &attn_ref_impl, /* src/impl/ref: the spec in code; always present, always last */
};
enum { BUILTIN_COUNT = sizeof builtin / sizeof builtin[0], MAX_IMPLS = 32 };

/* The modules' implementations followed by the built-in ones, made once. */
static const attn_impl *registry[MAX_IMPLS];
static int32_t registry_count = 0;
static pthread_once_t registry_once = PTHREAD_ONCE_INIT;

static void build_registry(void) {
  int32_t n = 0;
  const attn_impl *const *gpu = attn_module_impls(&n);
  for (int32_t i = 0; i < n && registry_count < MAX_IMPLS - BUILTIN_COUNT; ++i)
    registry[registry_count++] = gpu[i];
  for (int32_t i = 0; i < BUILTIN_COUNT; ++i) registry[registry_count++] = builtin[i];
}

/* A list a test installed in place of the real one (attn_registry_set_for_testing), or NULL. */
static const attn_impl *const *testing_list = NULL;
static int32_t testing_count = 0;

void attn_registry_set_for_testing(const attn_impl *const *list, int32_t count) {
  testing_list = count > 0 ? list : NULL;
  testing_count = count > 0 ? count : 0;
}

const attn_impl *const *attn_registry(int32_t *count) {
  if (testing_list != NULL) {
    *count = testing_count;
    return testing_list;
  }
  pthread_once(&registry_once, build_registry);
  *count = registry_count;
  return registry;
}

const attn_impl *attn_registry_find(const char *name) {
  if (name == NULL) return NULL;
  int32_t count;
  const attn_impl *const *list = attn_registry(&count);
  for (int32_t i = 0; i < count; ++i)
    if (strcmp(list[i]->name, name) == 0) return list[i];
  return NULL;
}

int32_t attn_impl_count(void) {
  int32_t count;
  attn_registry(&count);
  return count;
}

const char *attn_impl_name(int32_t index) {
  int32_t count;
  const attn_impl *const *list = attn_registry(&count);
  return index >= 0 && index < count ? list[index]->name : NULL;
}
