/*
 * src/plan/plan.h - internal hooks into plans, for tests only.
 */
#ifndef ATTN_PLAN_PLAN_H
#define ATTN_PLAN_PLAN_H

#include "attn.h"

/* Makes the plan's implementation round scores and probabilities to `dtype`: the naive same-dtype
 * computation that SPEC.md's low-precision tolerance is measured against. Only the reference honours
 * it; ATTN_DTYPE_F64 turns it off. */
void attn_plan_set_rounding(attn_plan *plan, attn_dtype dtype);

#endif /* ATTN_PLAN_PLAN_H */
