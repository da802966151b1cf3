/*
 * tools/harness.h - what `attn bench`, `attn check` and `attn tune` share: random data of a
 * problem's shape, the f64 oracle, the tolerance rule of SPEC.md, and timing.
 *
 * Every comparison is against the reference run in f64 on the same (rounded) inputs. The rule:
 * f32: max|a - r| <= 1e-4 * max(1, max|r|); f16/bf16: max|a - r| <= k * err(naive) + 1e-3 * max|r|
 * with k = 2 for the forward pass and 3 for gradients, naive = the reference at the problem's dtype
 * rounding scores and P to it.
 */
#ifndef ATTN_TOOLS_HARNESS_H
#define ATTN_TOOLS_HARNESS_H

#include "attn.h"

#include <stdint.h>

/* The data of one run: inputs, and outputs for forward and (optionally) backward. */
typedef struct h_data {
  attn_problem problem;
  void *buf[18]; /* one per attn_role */
  int32_t *cu_q, *cu_k, *len_q, *len_k;
  attn_inputs in;
  attn_outputs out;
  attn_tensor dout;
  attn_grads grads;
} h_data;

/* Allocates and fills data for a problem (inputs drawn from seed, rounded to their dtype). 0 on
 * allocation failure. */
int h_data_make(h_data *d, const attn_problem *problem, uint64_t seed, int backward);
/* The same inputs converted to dtype (f64 for the oracle), with fresh outputs. */
int h_data_convert(h_data *dst, const h_data *src, attn_dtype dtype, int backward);
void h_data_free(h_data *d);

/* One implementation and configuration compared with the oracle. */
typedef struct h_check {
  double err[5];      /* max |a - r| of out, lse, dq, dk, dv */
  double ref[5];      /* max |r| of each */
  double tol[5];      /* its allowed error */
  int compared;       /* how many of the five were compared */
  int ok;             /* every compared one within its tolerance */
  attn_status status; /* of running it; the message in the context */
  char worst[64];     /* the output furthest past (or closest to) its tolerance */
} h_check;

/* Runs impl/config (forward, and backward when asked) on the problem and compares it with the
 * oracle. ctx receives the errors of failed calls. */
h_check h_check_run(attn_ctx *ctx, const attn_problem *problem, const char *impl,
                    const char *config, int backward, uint64_t seed);

/* Median microseconds of a pass (forward, or forward + backward) of impl/config after warmup runs,
 * over at least reps runs and min_seconds. status: of making and running the plan. */
attn_status h_time(attn_ctx *ctx, const attn_problem *problem, const char *impl, const char *config,
                   int backward, int warmup, int reps, double min_seconds, uint64_t seed,
                   double *median_us, int *runs);

/* Floating-point operations of a pass under FlashAttention's convention: 2 * B * Hq * Tq * Tk *
 * (D + Dv) over the visible (i, j) pairs for the forward pass; forward + backward counts 3.5 times
 * that (the backward pass is 2.5 forwards). */
double h_flops(const attn_problem *problem, int backward);

#endif /* ATTN_TOOLS_HARNESS_H */
