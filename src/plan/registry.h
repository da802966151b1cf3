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

/* Tests only: replaces the list with count implementations (NULL or 0 restores the real list), so
 * the executor can be driven with fake implementations that never enter the real registry. Not
 * thread safe: call it before any other thread uses the library. */
void attn_registry_set_for_testing(const attn_impl *const *list, int32_t count);

#endif /* ATTN_PLAN_REGISTRY_H */
