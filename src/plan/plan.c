/*
 * src/plan/plan.c - plans: validate the problem, select an implementation through the registry,
 * and run it with validated data and a workspace.
 *
 * The path of a call: attn_plan_create -> attn_validate_problem -> attn_exec_select (the executor's
 * chain in select.c: explicit choice, caches, autotuning, heuristics) -> impl->plan_init;
 * attn_plan_forward -> attn_validate_forward -> workspace -> impl->forward.
 */
#include "plan/plan.h"

#include "core/ctx.h"
#include "core/gpu.h"
#include "core/saturate.h"
#include "plan/exec.h"
#include "plan/registry.h"
#include "plan/validate.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Implementations get 64-byte-aligned workspace; the plan asks for this much slack to align it. */
#define ATTN_WORKSPACE_ALIGN 64

struct attn_plan {
  attn_ctx *ctx;
  attn_problem problem; /* validated and resolved */
  const attn_impl *impl;
  int32_t config;
  char config_name[128];
  void *state;  /* impl->plan_init's */
  void *stream; /* borrowed */
  attn_dtype round_to;
  int has_positions; /* attn_plan_set_positions: this plan's problem is a block of a larger one */
  attn_positions positions;
  void (*progress)(void *arg); /* attn_plan_set_progress */
  void *progress_arg;
  void *owned_workspace; /* for callers that pass no workspace */
  size_t owned_workspace_size;
  /* PLAN_ALIVE from creation until attn_plan_destroy clears it. Using a destroyed plan is undefined
   * (attn.h); this catches the common case, a plan passed again soon after destroy, cheaply and
   * best-effort: the allocator reuses the first bytes of freed memory, not the last, and only
   * until the memory is handed out again. */
  uint64_t magic;
};

#define PLAN_ALIVE 0x6174746e706c616eull /* "attnplan" */
#define PLAN_DEAD 0x646561647061746eull  /* anything but PLAN_ALIVE */

/* A plan made by attn_plan_create and not yet destroyed (best-effort for the second part). */
static int plan_alive(const attn_plan *plan) { return plan != NULL && plan->magic == PLAN_ALIVE; }

/* OK when impl runs on the problem's device and supports it; else UNSUPPORTED with why. */
static attn_status impl_supports(const attn_impl *impl, const attn_problem *p, char *why,
                                 size_t why_size) {
  if (impl->device != p->device) {
    attn_device_mismatch(impl->device, p, why, why_size);
    return ATTN_STATUS_UNSUPPORTED;
  }
  why[0] = '\0';
  return impl->supports(p, why, why_size);
}

/* The named implementation, when it can run the problem (attn_impl_supports). Plans select
 * through the executor (select.c) instead. */
static attn_status select_impl(attn_ctx *ctx, const attn_problem *p, const char *name,
                               const attn_impl **chosen) {
  char why[ATTN_MESSAGE_SIZE];
  const attn_impl *impl = attn_registry_find(name);
  if (impl == NULL)
    return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                     "name=\"%s\" is not a registered implementation (attn_impl_name lists them)",
                     name);
  if (impl_supports(impl, p, why, sizeof why) != ATTN_STATUS_OK)
    return attn_fail(ctx, ATTN_STATUS_UNSUPPORTED, "%s: %s", impl->name, why);
  *chosen = impl;
  return ATTN_STATUS_OK;
}

attn_status attn_impl_supports(attn_ctx *ctx, const char *name, const attn_problem *problem) {
  if (ctx == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  attn_problem p;
  attn_status status = attn_validate_problem(ctx, problem, &p);
  if (status != ATTN_STATUS_OK) return status;
  if (name == NULL) return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "name is NULL");
  const attn_impl *impl = NULL;
  status = select_impl(ctx, &p, name, &impl);
  return status == ATTN_STATUS_OK ? attn_succeed(ctx) : status;
}

attn_status attn_plan_create(attn_ctx *ctx, const attn_problem *problem, const attn_select *select,
                             attn_plan **plan) {
  if (ctx == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  if (plan == NULL) return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, "plan is NULL");
  *plan = NULL;
  attn_problem p;
  attn_status status = attn_validate_problem(ctx, problem, &p);
  if (status != ATTN_STATUS_OK) return status;
  const attn_impl *impl = NULL;
  int32_t config = 0;
  status = attn_exec_select(ctx, &p, select, &impl, &config);
  if (status != ATTN_STATUS_OK) return status;
  return attn_plan_create_exact(ctx, &p, impl, config, plan);
}

attn_status attn_plan_create_exact(attn_ctx *ctx, const attn_problem *p, const attn_impl *impl,
                                   int32_t config, attn_plan **plan) {
  *plan = NULL;
  attn_plan *made = calloc(1, sizeof *made);
  if (made == NULL) return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory making a plan");
  made->ctx = ctx;
  made->problem = *p;
  made->impl = impl;
  made->config = config;
  made->round_to = ATTN_DTYPE_F64;
  made->magic = PLAN_ALIVE;
  impl->config_name(p, config, made->config_name, sizeof made->config_name);
  if (impl->plan_init != NULL) {
    char why[ATTN_MESSAGE_SIZE] = "";
    attn_status status = impl->plan_init(p, config, &made->state, why, sizeof why);
    if (status != ATTN_STATUS_OK) {
      free(made);
      return attn_fail(ctx, status, "%s: %s", impl->name, why);
    }
  }
  attn_log(ctx, ATTN_LOG_LEVEL_DEBUG, "plan: %s config %s", impl->name, made->config_name);
  *plan = made;
  return attn_succeed(ctx);
}

void attn_plan_destroy(attn_plan *plan) {
  if (!plan_alive(plan)) return; /* NULL, or destroyed already: never freed twice (best-effort) */
  if (plan->impl->plan_fini != NULL) plan->impl->plan_fini(plan->state);
  free(plan->owned_workspace);
  /* volatile: a store just before free is dead to the optimiser, which would drop it */
  *(volatile uint64_t *)&plan->magic = PLAN_DEAD;
  free(plan);
}

/* The implementation's size plus the alignment slack; SIZE_MAX stays SIZE_MAX (core/saturate.h),
 * so that a workspace too large to count is never reported as a small wrapped size. */
static size_t padded_workspace(const attn_plan *plan, int backward) {
  size_t bytes = plan->impl->workspace_size(&plan->problem, plan->config, plan->state, backward);
  return bytes == 0 ? 0 : attn_sat_add_size(bytes, ATTN_WORKSPACE_ALIGN);
}

attn_status attn_plan_workspace_size(const attn_plan *plan, size_t *forward_bytes,
                                     size_t *backward_bytes) {
  if (!plan_alive(plan)) return ATTN_STATUS_INVALID_ARGUMENT;
  if (forward_bytes != NULL) *forward_bytes = padded_workspace(plan, 0);
  if (backward_bytes != NULL) *backward_bytes = padded_workspace(plan, 1);
  return attn_succeed(plan->ctx);
}

const char *attn_plan_impl_name(const attn_plan *plan) {
  return !plan_alive(plan) ? "" : plan->impl->name;
}

const char *attn_plan_config_name(const attn_plan *plan) {
  return !plan_alive(plan) ? "" : plan->config_name;
}

attn_status attn_plan_set_stream(attn_plan *plan, void *stream) {
  if (!plan_alive(plan)) return ATTN_STATUS_INVALID_ARGUMENT;
  plan->stream = stream;
  return attn_succeed(plan->ctx);
}

void attn_plan_set_rounding(attn_plan *plan, attn_dtype dtype) {
  if (plan_alive(plan)) plan->round_to = dtype;
}

void attn_plan_set_progress(attn_plan *plan, void (*progress)(void *arg), void *arg) {
  if (!plan_alive(plan)) return;
  plan->progress = progress;
  plan->progress_arg = arg;
}

attn_status attn_plan_set_positions(attn_plan *plan, const attn_positions *positions) {
  if (plan == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  if (positions == NULL) {
    plan->has_positions = 0;
    return attn_succeed(plan->ctx);
  }
  if (!plan->impl->honours_positions)
    return attn_fail(plan->ctx, ATTN_STATUS_UNSUPPORTED,
                     "%s: does not run a block of a larger problem (global dropout counters and "
                     "alignment offsets); the distributed layer needs one that does",
                     plan->impl->name);
  /* A varlen problem's rows and keys count from each sequence's start, so it takes only the
   * batch and head offsets (the all-to-all's whole sequences of some heads). */
  const int rows_placed = positions->has_offset || positions->rows.global[0] != 0 ||
                          positions->cols.global[0] != 0 || positions->rows.pieces > 1 ||
                          positions->cols.pieces > 1;
  if (plan->impl->honours_positions == ATTN_POSITIONS_ONE_PIECE &&
      (positions->rows.pieces > 1 || positions->cols.pieces > 1 || positions->partial ||
       (plan->problem.varlen != ATTN_VARLEN_NONE && rows_placed)))
    return attn_fail(plan->ctx, ATTN_STATUS_UNSUPPORTED,
                     "%s: runs a block of a larger problem at one piece of global positions per "
                     "axis (rows.pieces=%d, cols.pieces=%d), on a dense problem (a varlen one at "
                     "batch and head offsets only), its results in the problem's dtype "
                     "(partial=%d)",
                     plan->impl->name, (int)positions->rows.pieces, (int)positions->cols.pieces,
                     (int)positions->partial);
  if (positions->partial && plan->problem.varlen != ATTN_VARLEN_NONE)
    return attn_fail(
        plan->ctx, ATTN_STATUS_INVALID_ARGUMENT,
        "positions.partial: partial results in f32 need a dense problem (varlen none)");
  const attn_position_axis *axes[2] = {&positions->rows, &positions->cols};
  const char *names[2] = {"rows", "cols"};
  const int64_t lens[2] = {plan->problem.seqlen_q, plan->problem.seqlen_k};
  for (int x = 0; x < 2; ++x) {
    const attn_position_axis *a = axes[x];
    if (a->pieces < 0 || a->pieces > ATTN_POSITION_PIECES)
      return attn_fail(plan->ctx, ATTN_STATUS_INVALID_ARGUMENT,
                       "positions.%s.pieces=%d is not in 0..%d", names[x], (int)a->pieces,
                       ATTN_POSITION_PIECES);
    if (a->pieces > 1 && (!positions->has_offset || plan->problem.varlen != ATTN_VARLEN_NONE))
      return attn_fail(plan->ctx, ATTN_STATUS_INVALID_ARGUMENT,
                       "positions.%s: %d pieces need has_offset and a dense problem (varlen none)",
                       names[x], (int)a->pieces);
    for (int32_t k = 0; k < attn_position_pieces(a); ++k) {
      const int64_t lo = k == 0 ? 0 : a->start[k - 1] + 1;
      if ((k == 0 && a->start[0] != 0) || a->start[k] < lo || (k > 0 && a->start[k] >= lens[x]) ||
          a->global[k] < 0)
        return attn_fail(plan->ctx, ATTN_STATUS_INVALID_ARGUMENT,
                         "positions.%s piece %d (start %lld, global %lld): pieces start at 0, "
                         "then at increasing local indices below the length %lld, at global "
                         "positions >= 0",
                         names[x], (int)k, (long long)a->start[k], (long long)a->global[k],
                         (long long)lens[x]);
    }
  }
  plan->positions = *positions;
  plan->has_positions = 1;
  return attn_succeed(plan->ctx);
}

/* Points run->workspace at 64-byte-aligned memory of the size the pass needs: the caller's, or the
 * plan's own for a CPU caller that passed none. */
static attn_status bind_workspace(attn_plan *plan, int backward, void *workspace, size_t size,
                                  attn_run *run) {
  size_t need = padded_workspace(plan, backward);
  run->workspace = NULL;
  run->workspace_size = 0;
  if (need == 0) return ATTN_STATUS_OK;
  if (workspace == NULL) {
    if (plan->problem.device != ATTN_DEVICE_CPU)
      return attn_fail(plan->ctx, ATTN_STATUS_INVALID_ARGUMENT,
                       "workspace is NULL: a GPU plan needs %zu bytes of device workspace", need);
    if (plan->owned_workspace_size < need) {
      free(plan->owned_workspace);
      plan->owned_workspace_size = 0;
      plan->owned_workspace = malloc(need);
      if (plan->owned_workspace == NULL)
        return attn_fail(plan->ctx, ATTN_STATUS_OUT_OF_MEMORY,
                         "out of memory allocating %zu bytes of workspace", need);
      plan->owned_workspace_size = need;
    }
    workspace = plan->owned_workspace;
  } else if (size < need) {
    return attn_fail(plan->ctx, ATTN_STATUS_INVALID_ARGUMENT,
                     "workspace_size=%zu is less than the %zu bytes attn_plan_workspace_size reports",
                     size, need);
  }
  uintptr_t at = ((uintptr_t)workspace + ATTN_WORKSPACE_ALIGN - 1) & ~(uintptr_t)(ATTN_WORKSPACE_ALIGN - 1);
  run->workspace = (void *)at;
  run->workspace_size = need - ATTN_WORKSPACE_ALIGN;
  return ATTN_STATUS_OK;
}

static attn_run make_run(attn_plan *plan, char *why, size_t why_size) {
  attn_run run;
  memset(&run, 0, sizeof run);
  run.problem = &plan->problem;
  run.config = plan->config;
  run.stream = plan->stream;
  run.state = plan->state;
  run.num_threads = plan->ctx->num_threads;
  run.round_to = plan->round_to;
  run.positions = plan->has_positions ? &plan->positions : NULL;
  run.progress = plan->progress;
  run.progress_arg = plan->progress_arg;
  run.why = why;
  run.why_size = why_size;
  why[0] = '\0';
  return run;
}

static attn_status finish_run(attn_plan *plan, attn_status status, const char *why) {
  if (status == ATTN_STATUS_OK) return attn_succeed(plan->ctx);
  return attn_fail(plan->ctx, status, "%s: %s", plan->impl->name, why[0] ? why : "failed");
}

attn_status attn_plan_forward(attn_plan *plan, const attn_inputs *inputs, void *workspace,
                              size_t workspace_size, const attn_outputs *outputs) {
  if (!plan_alive(plan)) return ATTN_STATUS_INVALID_ARGUMENT;
  attn_inputs in;
  attn_outputs out;
  attn_status status = attn_validate_forward(plan->ctx, &plan->problem, inputs, outputs, &in, &out);
  if (status != ATTN_STATUS_OK) return status;
  char why[ATTN_MESSAGE_SIZE];
  attn_run run = make_run(plan, why, sizeof why);
  status = bind_workspace(plan, 0, workspace, workspace_size, &run);
  if (status != ATTN_STATUS_OK) return status;
  run.inputs = &in;
  run.outputs = &out;
  return finish_run(plan, plan->impl->forward(&run), why);
}

attn_status attn_plan_backward(attn_plan *plan, const attn_inputs *inputs,
                               const attn_outputs *forward, const attn_tensor *dout, void *workspace,
                               size_t workspace_size, const attn_grads *grads) {
  if (!plan_alive(plan)) return ATTN_STATUS_INVALID_ARGUMENT;
  attn_status has = attn_validate_has_backward(plan->ctx, &plan->problem);
  if (has != ATTN_STATUS_OK) return has;
  attn_inputs in;
  attn_outputs fwd;
  attn_tensor dout_r;
  attn_grads g;
  attn_status status = attn_validate_backward(plan->ctx, &plan->problem, inputs, forward, dout,
                                              grads, &in, &fwd, &dout_r, &g);
  if (status != ATTN_STATUS_OK) return status;
  char why[ATTN_MESSAGE_SIZE];
  attn_run run = make_run(plan, why, sizeof why);
  status = bind_workspace(plan, 1, workspace, workspace_size, &run);
  if (status != ATTN_STATUS_OK) return status;
  run.inputs = &in;
  run.outputs = &fwd;
  run.dout = &dout_r;
  run.grads = &g;
  return finish_run(plan, plan->impl->backward(&run), why);
}

/* The one-call conveniences' workspace: none on the CPU (the plan keeps its own there), else device
 * memory of the size the pass needs, released by one_call_release once the device is done. */
static attn_status one_call_workspace(attn_plan *plan, int backward, void **ws, size_t *size) {
  *ws = NULL, *size = 0;
  size_t need = padded_workspace(plan, backward);
  if (need == 0 || plan->problem.device == ATTN_DEVICE_CPU) return ATTN_STATUS_OK;
  const attn_gpu_ops *gpu = attn_gpu();
  char why[ATTN_MESSAGE_SIZE];
  if (gpu == NULL)
    return attn_fail(plan->ctx, ATTN_STATUS_UNSUPPORTED,
                     "no GPU module is loaded to allocate the %zu bytes of device workspace", need);
  attn_status status = gpu->alloc((int32_t)plan->problem.device_index, need, ws, why, sizeof why);
  if (status != ATTN_STATUS_OK)
    return attn_fail(plan->ctx, status, "allocating %zu bytes of device workspace: %s", need, why);
  *size = need;
  return ATTN_STATUS_OK;
}

/* Waits for the pass (the workspace may not be freed under it), then frees the workspace; a fault
 * the wait reports becomes the call's status when the pass itself succeeded. */
static attn_status one_call_release(attn_plan *plan, void *ws, attn_status status) {
  if (ws == NULL) return status;
  const attn_gpu_ops *gpu = attn_gpu();
  char why[ATTN_MESSAGE_SIZE];
  attn_status synced = gpu->synchronize((int32_t)plan->problem.device_index, why, sizeof why);
  gpu->release((int32_t)plan->problem.device_index, ws);
  if (status == ATTN_STATUS_OK && synced != ATTN_STATUS_OK)
    return attn_fail(plan->ctx, synced, "waiting for the device: %s", why);
  return status;
}

attn_status attn_forward(attn_ctx *ctx, const attn_problem *problem, const attn_inputs *inputs,
                         const attn_outputs *outputs) {
  attn_plan *plan;
  attn_status status = attn_plan_create(ctx, problem, NULL, &plan);
  if (status != ATTN_STATUS_OK) return status;
  void *ws;
  size_t size;
  status = one_call_workspace(plan, 0, &ws, &size);
  if (status == ATTN_STATUS_OK) status = attn_plan_forward(plan, inputs, ws, size, outputs);
  status = one_call_release(plan, ws, status);
  attn_plan_destroy(plan);
  return status;
}

attn_status attn_backward(attn_ctx *ctx, const attn_problem *problem, const attn_inputs *inputs,
                          const attn_outputs *forward, const attn_tensor *dout,
                          const attn_grads *grads) {
  attn_plan *plan;
  attn_status status = attn_plan_create(ctx, problem, NULL, &plan);
  if (status != ATTN_STATUS_OK) return status;
  void *ws;
  size_t size;
  status = one_call_workspace(plan, 1, &ws, &size);
  if (status == ATTN_STATUS_OK)
    status = attn_plan_backward(plan, inputs, forward, dout, ws, size, grads);
  status = one_call_release(plan, ws, status);
  attn_plan_destroy(plan);
  return status;
}
