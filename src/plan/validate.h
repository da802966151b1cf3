/*
 * src/plan/validate.h - every rule of SPEC.md "Errors", checked before any work.
 *
 * The problem is checked when a plan is made; the data of a run (pointers, strides, varlen lengths,
 * aliasing) when it runs. Each failure is INVALID_ARGUMENT with a message that starts with the
 * argument and its value and states the rule, e.g. "heads_q=6 is not a multiple of heads_kv=4".
 */
#ifndef ATTN_PLAN_VALIDATE_H
#define ATTN_PLAN_VALIDATE_H

#include "attn.h"

#include <stddef.h>

/* Checks the problem and writes into *resolved a copy with defaults made explicit: head_dim_v,
 * scale, and causal folded into window_right = 0. */
attn_status attn_validate_problem(attn_ctx *ctx, const attn_problem *problem,
                                  attn_problem *resolved /* out */);

/* Checks a forward run's data for a resolved problem and writes copies with explicit strides. */
attn_status attn_validate_forward(attn_ctx *ctx, const attn_problem *problem,
                                  const attn_inputs *inputs, const attn_outputs *outputs,
                                  attn_inputs *inputs_resolved, attn_outputs *outputs_resolved);

/* UNSUPPORTED, with the reason, for a problem that has no backward pass (a paged KV cache); OK
 * otherwise. Every caller that would compute gradients asks: plans and the attn tool's oracle. */
attn_status attn_validate_has_backward(attn_ctx *ctx, const attn_problem *problem);

/* Likewise for a backward run. */
attn_status attn_validate_backward(attn_ctx *ctx, const attn_problem *problem,
                                   const attn_inputs *inputs, const attn_outputs *forward,
                                   const attn_tensor *dout, const attn_grads *grads,
                                   attn_inputs *inputs_resolved, attn_outputs *forward_resolved,
                                   attn_tensor *dout_resolved, attn_grads *grads_resolved);

/* Why an implementation of impl_device cannot run a problem on another device, in the device names
 * of problem strings: "runs on the cpu, the problem's tensors are on cuda:1". */
void attn_device_mismatch(int32_t impl_device, const attn_problem *problem, char *why,
                          size_t why_size);

#endif /* ATTN_PLAN_VALIDATE_H */
