/*
 * tools/harness.c - data, oracle comparison and timing shared by the attn command's subcommands.
 */
#define _POSIX_C_SOURCE 200809L
#include "harness.h"

#include "core/dtype.h"
#include "core/tensors.h"
#include "plan/plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int input_role(attn_role r) { return r <= ATTN_ROLE_KV_SEGMENT_IDS || r == ATTN_ROLE_DOUT; }

static double uniform(uint64_t *state) {
  *state = *state * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(*state >> 11) * (1.0 / 9007199254740992.0);
}

static int alloc_roles(h_data *d, int backward) {
  for (int r = 0; r < ATTN_ROLE_COUNT; ++r) {
    attn_role role = (attn_role)r;
    if (!attn_role_needed(&d->problem, role, backward)) continue;
    attn_tensor *t = attn_role_field(role, &d->in, &d->out, &d->dout, &d->grads);
    int64_t n = attn_role_numel(&d->problem, role);
    d->buf[r] =
        calloc((size_t)(n > 0 ? n : 1), attn_dtype_size(attn_role_dtype(&d->problem, role)));
    if (d->buf[r] == NULL) return 0;
    *t = attn_tensor_dense(d->buf[r]);
  }
  return 1;
}

static int32_t *copy_i32(const int32_t *src, int64_t n) {
  if (src == NULL) return NULL;
  int32_t *dst = malloc((size_t)n * sizeof *dst);
  if (dst != NULL) memcpy(dst, src, (size_t)n * sizeof *dst);
  return dst;
}

static void bind_lengths(h_data *d) {
  d->in.cu_seqlens_q = d->cu_q;
  d->in.cu_seqlens_k = d->cu_k;
  d->in.seqlens_q = d->len_q;
  d->in.seqlens_k = d->len_k;
}

int h_data_make(h_data *d, const attn_problem *problem, uint64_t seed, int backward) {
  memset(d, 0, sizeof *d);
  d->problem = *problem;
  const attn_problem *p = &d->problem;
  if (!alloc_roles(d, backward)) return 0;
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int r = 0; r < ATTN_ROLE_COUNT; ++r) {
    attn_role role = (attn_role)r;
    if (d->buf[r] == NULL || !input_role(role)) continue;
    int64_t n = attn_role_numel(p, role);
    attn_dtype dtype = attn_role_dtype(p, role);
    for (int64_t i = 0; i < n; ++i) {
      double u = uniform(&state);
      if (role == ATTN_ROLE_MASK)
        ((uint8_t *)d->buf[r])[i] = u < 0.8;
      else if (dtype == ATTN_DTYPE_I32)
        ((int32_t *)d->buf[r])[i] = (int32_t)(u * 3.0) - (u < 0.05);
      else if (role == ATTN_ROLE_ALIBI)
        attn_store(d->buf[r], dtype, i, 0.05 + 0.5 * u);
      else
        attn_store(d->buf[r], dtype, i, 2.0 * u - 1.0);
    }
  }
  int64_t B = p->batch;
  if (p->varlen == ATTN_VARLEN_PACKED) {
    d->cu_q = malloc((size_t)(B + 1) * sizeof *d->cu_q);
    d->cu_k = malloc((size_t)(B + 1) * sizeof *d->cu_k);
    if (d->cu_q == NULL || d->cu_k == NULL) return 0;
    d->cu_q[0] = d->cu_k[0] = 0;
    for (int64_t b = 0; b < B; ++b) { /* even split of the totals, remainders first */
      d->cu_q[b + 1] = d->cu_q[b] + (int32_t)(p->total_q / B + (b < p->total_q % B));
      d->cu_k[b + 1] = d->cu_k[b] + (int32_t)(p->total_k / B + (b < p->total_k % B));
    }
  } else if (p->varlen == ATTN_VARLEN_PADDED) {
    d->len_q = malloc((size_t)B * sizeof *d->len_q);
    d->len_k = malloc((size_t)B * sizeof *d->len_k);
    if (d->len_q == NULL || d->len_k == NULL) return 0;
    for (int64_t b = 0; b < B; ++b) { /* varied lengths, the first batch entry full */
      d->len_q[b] =
          (int32_t)(b == 0 ? p->seqlen_q : (int64_t)(uniform(&state) * (double)(p->seqlen_q + 1)));
      d->len_k[b] =
          (int32_t)(b == 0 ? p->seqlen_k : (int64_t)(uniform(&state) * (double)(p->seqlen_k + 1)));
    }
  }
  bind_lengths(d);
  d->in.dropout_seed = seed;
  return 1;
}

int h_data_convert(h_data *dst, const h_data *src, attn_dtype dtype, int backward) {
  memset(dst, 0, sizeof *dst);
  dst->problem = src->problem;
  dst->problem.dtype = dtype;
  if (dst->problem.has_bias && dtype == ATTN_DTYPE_F64) dst->problem.bias_dtype = ATTN_DTYPE_F64;
  if (!alloc_roles(dst, backward)) return 0;
  for (int r = 0; r < ATTN_ROLE_COUNT; ++r) {
    attn_role role = (attn_role)r;
    if (dst->buf[r] == NULL || src->buf[r] == NULL || !input_role(role)) continue;
    int64_t n = attn_role_numel(&src->problem, role);
    attn_dtype from = attn_role_dtype(&src->problem, role),
               to = attn_role_dtype(&dst->problem, role);
    if (from == to) {
      memcpy(dst->buf[r], src->buf[r], (size_t)n * attn_dtype_size(from));
      continue;
    }
    for (int64_t i = 0; i < n; ++i) attn_store(dst->buf[r], to, i, attn_load(src->buf[r], from, i));
  }
  int64_t B = src->problem.batch;
  dst->cu_q = copy_i32(src->cu_q, B + 1);
  dst->cu_k = copy_i32(src->cu_k, B + 1);
  dst->len_q = copy_i32(src->len_q, B);
  dst->len_k = copy_i32(src->len_k, B);
  bind_lengths(dst);
  dst->in.dropout_seed = src->in.dropout_seed;
  return 1;
}

void h_data_free(h_data *d) {
  for (int r = 0; r < ATTN_ROLE_COUNT; ++r) free(d->buf[r]);
  free(d->cu_q);
  free(d->cu_k);
  free(d->len_q);
  free(d->len_k);
  memset(d, 0, sizeof *d);
}

/* Runs a plan on the data: forward, then backward when asked. */
static attn_status run(attn_plan *plan, h_data *d, int backward) {
  attn_status st = attn_plan_forward(plan, &d->in, NULL, 0, &d->out);
  if (st != ATTN_STATUS_OK || !backward) return st;
  return attn_plan_backward(plan, &d->in, &d->out, &d->dout, NULL, 0, &d->grads);
}

/* Makes a plan for exactly impl/config (NULL config = its default) and runs it. */
static attn_status run_exact(attn_ctx *ctx, h_data *d, const char *impl, const char *config,
                             int backward, attn_dtype rounding) {
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = impl;
  sel.config = config;
  attn_plan *plan = NULL;
  attn_status st = attn_plan_create(ctx, &d->problem, &sel, &plan);
  if (st != ATTN_STATUS_OK) return st;
  if (rounding != ATTN_DTYPE_F64) attn_plan_set_rounding(plan, rounding);
  st = run(plan, d, backward);
  attn_plan_destroy(plan);
  return st;
}

static const attn_role compared_roles[5] = {ATTN_ROLE_OUT, ATTN_ROLE_LSE, ATTN_ROLE_DQ,
                                            ATTN_ROLE_DK, ATTN_ROLE_DV};
static const char *const compared_names[5] = {"out", "lse", "dq", "dk", "dv"};

/* max |a - r| and max |r| of a role (equal infinities, as -inf lse of masked rows, are equal). */
static void compare(const h_data *a, const h_data *r, attn_role role, double *err, double *ref) {
  int64_t n = attn_role_numel(&a->problem, role);
  attn_dtype ta = attn_role_dtype(&a->problem, role), tr = attn_role_dtype(&r->problem, role);
  *err = 0.0;
  *ref = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    double x = attn_load(a->buf[role], ta, i), y = attn_load(r->buf[role], tr, i);
    if (isfinite(y) && fabs(y) > *ref) *ref = fabs(y);
    double e = (x == y) ? 0.0 : fabs(x - y);
    if (isnan(e)) e = INFINITY;
    if (e > *err) *err = e;
  }
}

h_check h_check_run(attn_ctx *ctx, const attn_problem *problem, const char *impl,
                    const char *config, int backward, uint64_t seed) {
  h_check c;
  memset(&c, 0, sizeof c);
  h_data data, oracle, naive;
  memset(&naive, 0, sizeof naive);
  attn_dtype dtype = (attn_dtype)problem->dtype;
  int low = dtype == ATTN_DTYPE_F16 || dtype == ATTN_DTYPE_BF16;
  if (!h_data_make(&data, problem, seed, backward) ||
      !h_data_convert(&oracle, &data, ATTN_DTYPE_F64, backward) ||
      (low && !h_data_convert(&naive, &data, dtype, backward))) {
    c.status = ATTN_STATUS_OUT_OF_MEMORY;
    goto done;
  }
  c.status = run_exact(ctx, &oracle, "ref", NULL, backward, ATTN_DTYPE_F64);
  if (c.status == ATTN_STATUS_OK && low)
    c.status = run_exact(ctx, &naive, "ref", NULL, backward, dtype);
  if (c.status != ATTN_STATUS_OK) {
    snprintf(c.worst, sizeof c.worst, "reference");
    goto done;
  }
  c.status = run_exact(ctx, &data, impl, config, backward, ATTN_DTYPE_F64);
  if (c.status != ATTN_STATUS_OK) goto done;
  c.ok = 1;
  double worst = -1.0;
  for (int i = 0; i < (backward ? 5 : 2); ++i) {
    attn_role role = compared_roles[i];
    compare(&data, &oracle, role, &c.err[i], &c.ref[i]);
    if (low) {
      double naive_err, unused;
      compare(&naive, &oracle, role, &naive_err, &unused);
      c.tol[i] = (i < 2 ? 2.0 : 3.0) * naive_err + 1e-3 * c.ref[i];
    } else {
      c.tol[i] = 1e-4 * fmax(1.0, c.ref[i]);
    }
    c.compared++;
    double ratio = c.tol[i] > 0 ? c.err[i] / c.tol[i] : (c.err[i] > 0 ? INFINITY : 0.0);
    if (!(c.err[i] <= c.tol[i])) c.ok = 0;
    if (ratio > worst) {
      worst = ratio;
      snprintf(c.worst, sizeof c.worst, "%s", compared_names[i]);
    }
  }
done:
  h_data_free(&data);
  h_data_free(&oracle);
  h_data_free(&naive);
  return c;
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

attn_status h_time(attn_ctx *ctx, const attn_problem *problem, const char *impl, const char *config,
                   int backward, int warmup, int reps, double min_seconds, uint64_t seed,
                   double *median_us, int *runs) {
  *median_us = 0.0;
  *runs = 0;
  h_data d;
  if (!h_data_make(&d, problem, seed, backward)) return ATTN_STATUS_OUT_OF_MEMORY;
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = impl;
  sel.config = config;
  attn_plan *plan = NULL;
  attn_status st = attn_plan_create(ctx, &d.problem, &sel, &plan);
  for (int i = 0; st == ATTN_STATUS_OK && i < warmup; ++i) st = run(plan, &d, backward);
  int cap = reps > 16 ? reps : 16, n = 0;
  double *times = malloc((size_t)cap * sizeof *times);
  if (times == NULL) st = ATTN_STATUS_OUT_OF_MEMORY;
  double start = now_us();
  while (st == ATTN_STATUS_OK && (n < reps || now_us() - start < min_seconds * 1e6)) {
    if (n == cap) {
      double *more = realloc(times, 2 * (size_t)cap * sizeof *times);
      if (more == NULL) {
        st = ATTN_STATUS_OUT_OF_MEMORY;
        break;
      }
      times = more;
      cap *= 2;
    }
    double t0 = now_us();
    st = run(plan, &d, backward);
    times[n++] = now_us() - t0;
  }
  if (st == ATTN_STATUS_OK && n > 0) {
    qsort(times, (size_t)n, sizeof *times, compare_double);
    *median_us = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
    *runs = n;
  }
  free(times);
  attn_plan_destroy(plan);
  h_data_free(&d);
  return st;
}

double h_flops(const attn_problem *p, int backward) {
  /* Visible (i, j) pairs of one (b, h) under causal/window masks, bottom-right or top-left. */
  int64_t tq = p->seqlen_q, tk = p->seqlen_k;
  int64_t o = p->align == ATTN_ALIGN_BOTTOM_RIGHT ? tk - tq : 0;
  int64_t left = p->window_left, right = p->causal ? 0 : p->window_right;
  double pairs = 0.0;
  for (int64_t i = 0; i < tq; ++i) {
    int64_t lo = left < 0 ? 0 : i + o - left, hi = right < 0 ? tk - 1 : i + o + right;
    if (lo < 0) lo = 0;
    if (hi > tk - 1) hi = tk - 1;
    if (hi >= lo) pairs += (double)(hi - lo + 1);
  }
  int64_t dv = p->head_dim_v > 0 ? p->head_dim_v : p->head_dim;
  double fwd = 2.0 * (double)p->batch * (double)p->heads_q * pairs * (double)(p->head_dim + dv);
  return backward ? 3.5 * fwd : fwd;
}
