/*
 * tests/tolerance.h - SPEC.md's rule ("Testing") for comparing an implementation's result with the
 * f64 reference, written once: for the tests (test_compare, test_golden, and test_cuda / test_cudnn
 * through gputest.c) and for the `attn` tool's check before a benchmark (tools/harness.c). The tool
 * links no test code, so the rule is static inline functions of plain values in this header alone.
 *
 *   f32:      max|a - r| <= 1e-4 * max(1, max|r|)
 *   f16/bf16: max|a - r| <= k * err(naive) + 1e-3 * max|r| (+ FLT_MIN), k = 2 for the forward
 *             pass (out, lse) and 3 for gradients
 *   f8e4m3:   out: max|a - r| <= 2 * err(naive) + 2^-6 * max|r|; lse: 2 * err(naive) + 1e-3 *
 *             max(1, max|r|) (forward only; docs/FP8.md derives it)
 *
 * and, where the caller measures them (tol_extent: the attn tool and the fuzzers, whose problems
 * reach any scale), the rule's intent past its letter for problems whose own values put the letter
 * out of reach of every computation in the dtype: logits too large for f32 to hold to 1e-4, sums
 * whose partial sums bf16 instructions flush, tensors too small for the naive run's error to be a
 * measure (docs/NUMERICS.md, "What a problem's values add to the rule").
 *
 * where the inputs are rounded to the dtype and the same values are fed to the reference, and naive
 * is the reference run at the problem's dtype with its scores and P rounded to it as well
 * (attn_plan_set_rounding), the computation a careful same-dtype kernel does (FlashAttention's
 * rule). No element may be NaN, nor an infinity the reference lacks (lse is -inf exactly on fully
 * masked rows): a comparison counts those apart, and any one fails the check whatever the bound.
 */
#ifndef ATTN_TESTS_TOLERANCE_H
#define ATTN_TESTS_TOLERANCE_H

#include "attn.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

/* What a result is: the forward pass's (out, lse) or a gradient (dq, dk, dv, dbias, dsinks), whose
 * longer chain of roundings earns the larger factor. TOL_LSE is lse told apart from out, for an
 * extent (below): a logit's rounding error is absolute in lse, relative in the others; without an
 * extent it is TOL_FORWARD. */
typedef enum tol_pass { TOL_FORWARD, TOL_GRADIENT, TOL_LSE } tol_pass;

/* ---- the difference of a result a from the reference r ---- */
typedef struct tol_err {
  double max_abs;    /* max |a - r| over the elements where both are finite */
  double max_ref;    /* max |r| over the finite elements of r */
  int64_t where;     /* the first non-finite mismatch if any, else the largest error; -1: none */
  int64_t nonfinite; /* elements where either is NaN, or one is an infinity the other is not */
} tol_err;

static inline tol_err tol_err_init(void) {
  tol_err e = {0.0, 0.0, -1, 0};
  return e;
}

/* Adds element i, a against r, to e. Equal infinities are equal. */
static inline void tol_err_add(tol_err *e, int64_t i, double a, double r) {
  if (isfinite(r) && fabs(r) > e->max_ref) e->max_ref = fabs(r);
  if (!isfinite(a) || !isfinite(r)) {
    if (!(a == r) && e->nonfinite++ == 0) e->where = i;
    return;
  }
  double d = fabs(a - r);
  if (e->nonfinite == 0 && (d > e->max_abs || e->where < 0)) e->where = i;
  if (d > e->max_abs) e->max_abs = d;
}

/* The difference of n values a from n values r. */
static inline tol_err tol_compare(const double *a, const double *r, int64_t n) {
  tol_err e = tol_err_init();
  for (int64_t i = 0; i < n; ++i) tol_err_add(&e, i, a[i], r[i]);
  return e;
}

/* ---- the bound ---- */

/* err(naive) of the rule: the largest error among the reference runs that do what a careful
 * same-dtype computation must (docs/NUMERICS.md, "Tolerance of low-precision results"), each NULL
 * where the caller has not made it; only finite differences count (a non-finite run raises no
 * bound):
 *   rounded    the naive run: the reference at the dtype, its scores and P rounded to it
 *              (attn_plan_set_rounding), its backward reading its own rounded out (SPEC's rule);
 *   unrounded  the reference at the dtype without rounding inside: what rounding the outputs
 *              alone costs, which no implementation avoids;
 *   fed        (gradients) the f64 reference's backward given the implementation's own forward
 *              outputs (out in the dtype, lse): the error those inputs make unavoidable. A
 *              gradient that reads out through Delta = dout . out sums the effect of out's
 *              rounding over rows (dsinks over every row of a head; dq of a single row), and
 *              which way each element of out rounds is a coin toss between any two computations:
 *              the naive runs' own draws do not bound the implementation's (test_cuda's "sinks 1"
 *              dsinks failed in 2 of 11 runs; an exact backward fed such an out fails 2.5% of
 *              draws against the first two alone). */
static inline double tol_naive_error(const tol_err *rounded, const tol_err *unrounded,
                                     const tol_err *fed) {
  double err = rounded->max_abs;
  if (unrounded != NULL && unrounded->max_abs > err) err = unrounded->max_abs;
  if (fed != NULL && fed->max_abs > err) err = fed->max_abs;
  return err;
}

/* ---- what a problem's own values add (docs/NUMERICS.md, "What a problem's values add") ---- */

/* Measured on the problem and its data by the caller (tol_extent_make); a NULL extent is the letter. */
typedef struct tol_extent {
  double logits; /* the logits' condition: an upper bound of |x| before the soft cap, times the
                  * cap's amplification 1 + 2 / cap (0 without a cap: 1) */
  double unit;   /* the dtype's unit roundoff u: 2^-53 f64, 2^-24 f32, 2^-11 f16, 2^-8 bf16 */
  double flush;  /* the most a flushed denormal partial sum can hide in a gradient:
                  * FLT_MIN x max(1, |scale|) x the longest sum's terms */
} tol_extent;

/* The extent of a problem of dtype with softmax scale and soft cap (0: none), head dim D, whose
 * q, k (new rows included), bias and ALiBi slopes are at most max_q, max_k, max_bias and
 * max_slope in magnitude (0 where absent), ALiBi distances at most span, and whose longest
 * gradient sum has terms terms. |x| <= |scale| D max_q max_k + max_bias + max_slope span: the
 * bound holds whatever the data, and is loose only by how much of D's products cancel. */
static inline tol_extent tol_extent_make(attn_dtype dtype, double scale, double softcap,
                                         int64_t head_dim, double max_q, double max_k,
                                         double max_bias, double max_slope, int64_t span,
                                         int64_t terms) {
  tol_extent x;
  double logits = fabs(scale) * (double)head_dim * max_q * max_k + max_bias +
                  max_slope * (double)span;
  x.logits = logits * (softcap > 0.0 ? 1.0 + 2.0 / softcap : 1.0);
  x.unit = dtype == ATTN_DTYPE_F8E4M3 ? 0x1p-24 /* an fp8 problem's logits are f32 sums */
           : dtype == ATTN_DTYPE_BF16  ? 0x1p-8
           : dtype == ATTN_DTYPE_F16 ? 0x1p-11
           : dtype == ATTN_DTYPE_F64 ? 0x1p-53
                                     : 0x1p-24;
  x.flush = (double)FLT_MIN * (fabs(scale) > 1.0 ? fabs(scale) : 1.0) * (double)terms;
  return x;
}

/* The rule for f32 results: 1e-4 relative, or, past logits of about 400, the error of holding
 * them in f32. A logit x is rounded by |x| u in the forward and again in the backward's
 * recomputation; lse takes that error as it is, and P = exp(x - lse) as a relative error into
 * every other output; under a soft cap, the derivative 1 - tanh^2(x / cap) takes it 2 / cap times
 * over (NUMERICS.md measures both: 1.4 |lse| u on dv at scale=3000). */
static inline double tol_bound_f32(tol_pass pass, double max_ref, const tol_extent *x) {
  const double magnitude = max_ref > 1.0 ? max_ref : 1.0, fixed = 1e-4 * magnitude;
  if (x == NULL) return fixed;
  const double held = 2.0 * x->unit * x->logits * (pass == TOL_LSE ? 1.0 : magnitude);
  return held > fixed ? held : fixed;
}

/* What is below f32's normal range is not the kernel's numerics: bf16 instructions treat denormal
 * inputs as zero and flush denormal results, whatever the floating-point mode (AVX512-BF16's
 * vcvtneps2bf16 and vdpbf16ps), and vector exps flush below FLT_MIN. A difference under it passes
 * (docs/NUMERICS.md: a bf16 gradient of 1e-39 under softcap=0.001 is 0 on those paths). */
#define TOL_DENORMAL_FLOOR ((double)FLT_MIN)

/* The rule for f16 and bf16 results. With an extent: at least one rounding of the dtype relative
 * for the results stored in it (the naive run's largest error over a tensor of a few elements is
 * a noisy draw, and 1e-3 is less than one bf16 rounding; lse is f32), and the denormal floor
 * scaled to what flushing can lose in a sum (bf16 instructions flush partial sums, and the kernels
 * apply the scale after the sum). */
static inline double tol_bound_low_precision(tol_pass pass, double max_ref, double naive_err,
                                             const tol_extent *x) {
  double relative = 1e-3, floor = TOL_DENORMAL_FLOOR;
  if (x != NULL && pass != TOL_LSE && x->unit > relative) relative = x->unit;
  if (x != NULL && x->flush > floor) floor = x->flush;
  return (pass == TOL_GRADIENT ? 3.0 : 2.0) * naive_err + relative * max_ref + floor;
}

/* The rule for an f8e4m3 problem's forward results (docs/FP8.md, "Tolerance"): SPEC's rule with
 * e4m3's unit roundoff in its absolute term. SPEC's 1e-3 is about a quarter of bf16's unit
 * roundoff 2^-8 (2^-10 = 9.8e-4); P V multiplies P rounded to e4m3 (3 mantissa bits, u = 2^-4),
 * so the term is a quarter of that, 2^-6 relative. A kernel whose f32 scores differ from the
 * naive run's in their last bits (another summation order; Hopper's fp8 MMA keeps fewer bits than
 * f32 as it accumulates) rounds some of P's elements to the other e4m3 neighbour, 2^-3 of the
 * element each, and where few keys are visible those flips do not average out: the naive run's
 * own draw is no bound there. lse never sees P's rounding (Z sums the unrounded values) and keeps
 * the f16/bf16 rule's term. With an extent, the logits' f32 term of tol_bound_f32 joins lse's. */
static inline double tol_bound_fp8(tol_pass pass, double max_ref, double naive_err,
                                   const tol_extent *x) {
  if (pass == TOL_LSE) {
    const double fixed = 2.0 * naive_err + 1e-3 * (max_ref > 1.0 ? max_ref : 1.0);
    const double held = x != NULL ? 2.0 * x->unit * x->logits : 0.0;
    return fixed + held;
  }
  return 2.0 * naive_err + 0x1p-6 * max_ref + TOL_DENORMAL_FLOOR;
}

/* The largest max|a - r| allowed to a result of a problem of dtype (f16 and bf16: the low-precision
 * rule, which needs naive_err; any other: the f32 rule, which ignores it). extent: NULL for the
 * rule's letter, else what the problem's values add. */
static inline double tol_bound(attn_dtype dtype, tol_pass pass, double max_ref, double naive_err,
                               const tol_extent *extent) {
  if (dtype == ATTN_DTYPE_F16 || dtype == ATTN_DTYPE_BF16)
    return tol_bound_low_precision(pass, max_ref, naive_err, extent);
  if (dtype == ATTN_DTYPE_F8E4M3) return tol_bound_fp8(pass, max_ref, naive_err, extent);
  return tol_bound_f32(pass, max_ref, extent);
}

/* Whether a result whose difference is e passes under bound. */
static inline int tol_ok(const tol_err *e, double bound) {
  return e->nonfinite == 0 && e->max_abs <= bound;
}

#endif /* ATTN_TESTS_TOLERANCE_H */
