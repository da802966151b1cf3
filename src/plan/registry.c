/*
 * src/plan/registry.c - THE list of implementations. Adding one is a line here, its folder under
 * src/impl/, and a line in CMakeLists.txt; tests, benchmarks and tools reach it through this list.
 *
 * Order is preference: a plan without constraints takes the first that supports its problem.
 * Fast implementations come first; the reference, which supports everything, is always last.
 */
#include "plan/registry.h"

#include <string.h>

extern const attn_impl attn_cpu_impl;
extern const attn_impl attn_ref_impl;
#ifdef ATTN_HAVE_CUDNN
extern const attn_impl attn_cudnn_impl;
#endif
#ifdef ATTN_HAVE_CUDA_IMPL
extern const attn_impl attn_cuda_impl;
#endif

static const attn_impl *const registry[] = {
#ifdef ATTN_HAVE_CUDNN
    &attn_cudnn_impl, /* src/impl/cudnn: cuDNN's fused attention on CUDA devices (bf16, f16) */
#endif
#ifdef ATTN_HAVE_CUDA_IMPL
    &attn_cuda_impl, /* src/impl/cuda: libattn's tensor-core flash attention (sm_80, sm_90) */
#endif
    &attn_cpu_impl, /* src/impl/cpu: tiled, vectorised, threaded flash attention on CPUs */
    &attn_ref_impl, /* src/impl/ref: the spec in code; always present, always last */
};

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
  *count = (int32_t)(sizeof registry / sizeof registry[0]);
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
