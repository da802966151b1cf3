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

/* Places the plan's problem inside a larger one (impl/impl.h, attn_positions) for its later runs;
 * NULL forgets it. For the distributed layer (src/dist), which runs the blocks of a sharded
 * problem as plans of their own. UNSUPPORTED when the plan's implementation does not honour
 * positions (impl->honours_positions == ATTN_POSITIONS_NONE), or not in this form
 * (ATTN_POSITIONS_ONE_PIECE: more than one piece per axis, partial results, varlen). The
 * positions are copied. */
struct attn_positions;
attn_status attn_plan_set_positions(attn_plan *plan, const struct attn_positions *positions);

/* A function the plan's implementation may call now and then from the calling thread while a run
 * computes (attn_run.progress), and its argument; NULL: none. For the distributed layer, whose
 * transfers in flight move on only inside MPI calls on most MPI builds. */
void attn_plan_set_progress(attn_plan *plan, void (*progress)(void *arg), void *arg);

#endif /* ATTN_PLAN_PLAN_H */
