/*
 * src/plan/registry.h - the list of implementations compiled into the library.
 */
#ifndef ATTN_PLAN_REGISTRY_H
#define ATTN_PLAN_REGISTRY_H

#include "impl/impl.h"

/* The implementations in order of preference; the reference is last. */
const attn_impl *const *attn_registry(int32_t *count);
/* The implementation of that name, or NULL. */
const attn_impl *attn_registry_find(const char *name);

#endif /* ATTN_PLAN_REGISTRY_H */
