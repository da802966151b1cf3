/*
 * src/plan/registry.c - THE list of implementations. Adding one is a line here, its folder under
 * src/impl/, and a line in CMakeLists.txt; tests, benchmarks and tools reach it through this list.
 *
 * Order is preference: a plan without constraints takes the first that supports its problem.
 * Fast implementations come first; the reference, which supports everything, is always last.
 */
#include "plan/registry.h"

#include <string.h>

extern const attn_impl attn_ref_impl;

static const attn_impl *const registry[] = {
    &attn_ref_impl, /* src/impl/ref: the spec in code; always present, always last */
};

const attn_impl *const *attn_registry(int32_t *count) {
  *count = (int32_t)(sizeof registry / sizeof registry[0]);
  return registry;
}

const attn_impl *attn_registry_find(const char *name) {
  if (name == NULL) return NULL;
  for (size_t i = 0; i < sizeof registry / sizeof registry[0]; ++i)
    if (strcmp(registry[i]->name, name) == 0) return registry[i];
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
