/*
 * tools/harness.c - data, oracle comparison and timing shared by the attn command's subcommands.
 *
 * A GPU problem runs through the same code as a CPU one: its data is made on the host and mirrored
 * to the device (core/gpu.h, the services the tuner uses too), each pass waits for the device, and
 * the outputs come back to the host to be compared. Failures of the harness itself (memory, copies)
 * are recorded in the context like the library's, so the tool reads every message in one place.
 */
#define _POSIX_C_SOURCE 200809L
#include "harness.h"

#include "core/ctx.h"
#include "core/dtype.h"
#include "core/tensors.h"
#include "plan/plan.h"
/* SPEC.md's tolerance rule, the tests' own: a header of static inline functions, no test code. */
#include "../tests/tolerance.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

_Static_assert(sizeof(((h_buffers *)0)->role) / sizeof(void *) == ATTN_ROLE_COUNT,
               "h_buffers has one buffer per attn_role");

static int input_role(attn_role r) {
  return r <= ATTN_ROLE_KV_SEGMENT_IDS || r == ATTN_ROLE_DOUT || r == ATTN_ROLE_BLOCK_TABLE ||
         r == ATTN_ROLE_K_NEW || r == ATTN_ROLE_V_NEW;
}

static double uniform(uint64_t *state) {
  *state = *state * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(*state >> 11) * (1.0 / 9007199254740992.0);
}

/* Bytes of a role's buffer: at least one element, so that an empty tensor still has an address. */
static size_t role_bytes(const attn_problem *p, attn_role role) {
  int64_t n = attn_role_numel(p, role);
  return (size_t)(n > 0 ? n : 1) * attn_dtype_size(attn_role_dtype(p, role));
}

/* The i-th sequence-length array of b (cu_seqlens_q, cu_seqlens_k, seqlens_q, seqlens_k) and its
 * element count, so that copying, uploading and freeing them is one loop each. */
enum { LENGTH_ARRAYS = 5 };
static int32_t **length_array(h_buffers *b, int i, int64_t batch, int64_t *count) {
  int32_t **arrays[LENGTH_ARRAYS] = {&b->cu_seqlens_q, &b->cu_seqlens_k, &b->seqlens_q,
                                     &b->seqlens_k, &b->cache_seqlens};
  *count = i < 2 ? batch + 1 : batch;
  return arrays[i];
}

/* Points the tensors and sequence lengths of d's run at the buffers of b (host or device). */
static void bind(h_data *d, const h_buffers *b) {
  for (int r = 0; r < ATTN_ROLE_COUNT; ++r)
    if (b->role[r] != NULL)
      *attn_role_field((attn_role)r, &d->in, &d->out, &d->dout, &d->grads) =
          attn_tensor_dense(b->role[r]);
  d->in.cu_seqlens_q = b->cu_seqlens_q;
  d->in.cu_seqlens_k = b->cu_seqlens_k;
  d->in.seqlens_q = b->seqlens_q;
  d->in.seqlens_k = b->seqlens_k;
  d->in.cache_seqlens = b->cache_seqlens;
}

/* Zeroed host buffers for every tensor a run of d's problem has. 0 on allocation failure. */
static int alloc_roles(h_data *d, int backward) {
  for (int r = 0; r < ATTN_ROLE_COUNT; ++r) {
    attn_role role = (attn_role)r;
    if (!attn_role_needed(&d->problem, role, backward)) continue;
    d->host.role[r] = calloc(1, role_bytes(&d->problem, role));
    if (d->host.role[r] == NULL) return 0;
  }
  return 1;
}

/* A device copy of bytes of host memory; *dev is set (and freed with the data) even when the copy
 * fails. */
static attn_status copy_to_device(attn_ctx *ctx, const h_data *d, void **dev, const void *host,
                                  size_t bytes) {
  char why[512] = "";
  attn_status st = d->gpu->alloc(d->problem.device_index, bytes, dev, why, sizeof why);
  if (st == ATTN_STATUS_OK)
    st = d->gpu->upload(d->problem.device_index, *dev, host, bytes, why, sizeof why);
  return st == ATTN_STATUS_OK ? st : attn_fail(ctx, st, "%s", why);
}

/* Gives every host buffer of d (a GPU problem's) a copy on its device, and binds the run to them:
 * the implementations read the inputs and the sequence lengths there and write the outputs there. */
static attn_status mirror_to_device(attn_ctx *ctx, h_data *d) {
  char why[512] = "";
  if (!h_device_usable(&d->problem, why, sizeof why))
    return attn_fail(ctx, ATTN_STATUS_UNSUPPORTED, "%s", why);
  d->gpu = attn_gpu();
  attn_status st = ATTN_STATUS_OK;
  for (int r = 0; r < ATTN_ROLE_COUNT && st == ATTN_STATUS_OK; ++r)
    if (d->host.role[r] != NULL)
      st = copy_to_device(ctx, d, &d->device.role[r], d->host.role[r],
                          role_bytes(&d->problem, (attn_role)r));
  for (int i = 0; i < LENGTH_ARRAYS && st == ATTN_STATUS_OK; ++i) {
    int64_t n;
    const int32_t *host = *length_array(&d->host, i, d->problem.batch, &n);
    if (host == NULL) continue;
    void *copy = NULL;
    st = copy_to_device(ctx, d, &copy, host, (size_t)(n > 0 ? n : 1) * sizeof *host);
    *length_array(&d->device, i, d->problem.batch, &n) = copy;
  }
  if (st == ATTN_STATUS_OK) bind(d, &d->device);
  return st;
}

/* A paged cache's lengths (every sequence full) and block table: each sequence's pages distinct
 * and shuffled through the pool, as in an engine that has run a while. 0 on allocation failure. */
static int make_paged_cache(h_data *d, uint64_t *state) {
  const attn_problem *p = &d->problem;
  const int64_t B = p->batch, max_pages = attn_paged_max_pages(p), pool = attn_paged_num_pages(p);
  d->host.cache_seqlens = malloc((size_t)B * sizeof(int32_t));
  int32_t *order = malloc((size_t)(pool > 0 ? pool : 1) * sizeof *order);
  if (d->host.cache_seqlens == NULL || order == NULL) {
    free(order);
    return 0;
  }
  for (int64_t b = 0; b < B; ++b) d->host.cache_seqlens[b] = (int32_t)(p->seqlen_k - p->seqlen_new);
  for (int64_t i = 0; i < pool; ++i) order[i] = (int32_t)i;
  for (int64_t i = pool - 1; i > 0; --i) { /* Fisher-Yates */
    int64_t j = (int64_t)(uniform(state) * (double)(i + 1));
    int32_t t = order[i];
    order[i] = order[j], order[j] = t;
  }
  int32_t *table = d->host.role[ATTN_ROLE_BLOCK_TABLE];
  for (int64_t e = 0; e < B * max_pages; ++e) table[e] = pool > 0 ? order[e % pool] : -1;
  free(order);
  return 1;
}

attn_status h_data_make(attn_ctx *ctx, h_data *d, const attn_problem *problem, uint64_t seed,
                        int backward) {
  memset(d, 0, sizeof *d);
  d->problem = *problem;
  const attn_problem *p = &d->problem;
  if (!alloc_roles(d, backward)) goto oom;
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int r = 0; r < ATTN_ROLE_COUNT; ++r) {
    attn_role role = (attn_role)r;
    void *buf = d->host.role[r];
    if (buf == NULL || !input_role(role)) continue;
    int64_t n = attn_role_numel(p, role);
    attn_dtype dtype = attn_role_dtype(p, role);
    for (int64_t i = 0; i < n; ++i) {
      double u = uniform(&state);
      if (role == ATTN_ROLE_MASK)
        ((uint8_t *)buf)[i] = u < 0.8;
      else if (dtype == ATTN_DTYPE_I32)
        ((int32_t *)buf)[i] = (int32_t)(u * 3.0) - (u < 0.05);
      else if (role == ATTN_ROLE_ALIBI)
        attn_store(buf, dtype, i, 0.05 + 0.5 * u);
      else
        attn_store(buf, dtype, i, 2.0 * u - 1.0);
    }
  }
  int64_t B = p->batch;
  h_buffers *h = &d->host;
  if (p->varlen == ATTN_VARLEN_PACKED) {
    h->cu_seqlens_q = malloc((size_t)(B + 1) * sizeof *h->cu_seqlens_q);
    h->cu_seqlens_k = malloc((size_t)(B + 1) * sizeof *h->cu_seqlens_k);
    if (h->cu_seqlens_q == NULL || h->cu_seqlens_k == NULL) goto oom;
    h->cu_seqlens_q[0] = h->cu_seqlens_k[0] = 0;
    for (int64_t b = 0; b < B; ++b) { /* even split of the totals, remainders first */
      h->cu_seqlens_q[b + 1] =
          h->cu_seqlens_q[b] + (int32_t)(p->total_q / B + (b < p->total_q % B));
      h->cu_seqlens_k[b + 1] =
          h->cu_seqlens_k[b] + (int32_t)(p->total_k / B + (b < p->total_k % B));
    }
  } else if (p->varlen == ATTN_VARLEN_PADDED) {
    h->seqlens_q = malloc((size_t)B * sizeof *h->seqlens_q);
    h->seqlens_k = malloc((size_t)B * sizeof *h->seqlens_k);
    if (h->seqlens_q == NULL || h->seqlens_k == NULL) goto oom;
    for (int64_t b = 0; b < B; ++b) { /* varied lengths, the first batch entry full */
      h->seqlens_q[b] =
          (int32_t)(b == 0 ? p->seqlen_q : (int64_t)(uniform(&state) * (double)(p->seqlen_q + 1)));
      h->seqlens_k[b] =
          (int32_t)(b == 0 ? p->seqlen_k : (int64_t)(uniform(&state) * (double)(p->seqlen_k + 1)));
    }
  }
  if (p->page_size > 0 && !make_paged_cache(d, &state)) goto oom;
  bind(d, &d->host);
  d->in.dropout_seed = seed;
  if (p->device != ATTN_DEVICE_CPU) {
    attn_status st = mirror_to_device(ctx, d);
    if (st != ATTN_STATUS_OK) h_data_free(d);
    return st;
  }
  return ATTN_STATUS_OK;
oom:
  h_data_free(d);
  return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory allocating the data of a run");
}

attn_status h_data_download(attn_ctx *ctx, h_data *d) {
  if (d->gpu == NULL) return ATTN_STATUS_OK;
  for (int r = 0; r < ATTN_ROLE_COUNT; ++r) {
    if (d->device.role[r] == NULL || input_role((attn_role)r)) continue;
    char why[512] = "";
    attn_status st = d->gpu->download(d->problem.device_index, d->host.role[r], d->device.role[r],
                                      role_bytes(&d->problem, (attn_role)r), why, sizeof why);
    if (st != ATTN_STATUS_OK) return attn_fail(ctx, st, "%s", why);
  }
  return ATTN_STATUS_OK;
}

int h_data_convert(h_data *dst, const h_data *src, attn_dtype dtype, int backward) {
  memset(dst, 0, sizeof *dst);
  dst->problem = src->problem;
  dst->problem.dtype = dtype;
  dst->problem.device = ATTN_DEVICE_CPU;
  dst->problem.device_index = 0;
  if (dst->problem.has_bias && dtype == ATTN_DTYPE_F64) dst->problem.bias_dtype = ATTN_DTYPE_F64;
  if (!alloc_roles(dst, backward)) return 0;
  for (int r = 0; r < ATTN_ROLE_COUNT; ++r) {
    attn_role role = (attn_role)r;
    if (dst->host.role[r] == NULL || src->host.role[r] == NULL || !input_role(role)) continue;
    int64_t n = attn_role_numel(&src->problem, role);
    attn_dtype from = attn_role_dtype(&src->problem, role),
               to = attn_role_dtype(&dst->problem, role);
    if (from == to) {
      memcpy(dst->host.role[r], src->host.role[r], (size_t)n * attn_dtype_size(from));
      continue;
    }
    for (int64_t i = 0; i < n; ++i)
      attn_store(dst->host.role[r], to, i, attn_load(src->host.role[r], from, i));
  }
  h_buffers from_host = src->host; /* a copy, since length_array takes writable buffers */
  for (int i = 0; i < LENGTH_ARRAYS; ++i) {
    int64_t n;
    const int32_t *from = *length_array(&from_host, i, src->problem.batch, &n);
    int32_t **to = length_array(&dst->host, i, src->problem.batch, &n);
    if (from == NULL) continue;
    *to = malloc((size_t)(n > 0 ? n : 1) * sizeof *from);
    if (*to == NULL) return 0;
    memcpy(*to, from, (size_t)n * sizeof *from);
  }
  bind(dst, &dst->host);
  dst->in.dropout_seed = src->in.dropout_seed;
  return 1;
}

void h_data_free(h_data *d) {
  for (int r = 0; r < ATTN_ROLE_COUNT; ++r) {
    free(d->host.role[r]);
    if (d->gpu != NULL) d->gpu->release(d->problem.device_index, d->device.role[r]);
  }
  for (int i = 0; i < LENGTH_ARRAYS; ++i) {
    int64_t n;
    free(*length_array(&d->host, i, d->problem.batch, &n));
    if (d->gpu != NULL)
      d->gpu->release(d->problem.device_index, *length_array(&d->device, i, d->problem.batch, &n));
  }
  memset(d, 0, sizeof *d);
}

int32_t h_gpu_count(char *why, size_t why_size) {
  const attn_gpu_ops *gpu = attn_gpu();
  if (gpu == NULL) {
    snprintf(why, why_size,
             "no GPU module loaded (libattn_cuda.so, libattn_cudnn.so: the \"gpu modules\" "
             "lines of `attn info` say why)");
    return 0;
  }
  int32_t count = 0;
  char reason[256] = "";
  if (gpu->device_count(&count, reason, sizeof reason) != ATTN_STATUS_OK || count <= 0) {
    snprintf(why, why_size, "no CUDA device is usable (%s)", reason[0] ? reason : "none found");
    return 0;
  }
  return count;
}

int h_device_usable(const attn_problem *problem, char *why, size_t why_size) {
  if (problem->device == ATTN_DEVICE_CPU) return 1;
  int32_t count = h_gpu_count(why, why_size);
  if (count == 0) return 0;
  if (problem->device_index >= count) {
    snprintf(why, why_size, "device_index=%d but only %d CUDA device%s present",
             (int)problem->device_index, (int)count, count == 1 ? " is" : "s are");
    return 0;
  }
  return 1;
}

/* A plan of exactly impl/config (NULL config: its default) for d's problem, and the workspace a GPU
 * plan must be given, in device memory; a CPU plan given none allocates its own once. */
typedef struct plan_run {
  attn_plan *plan;
  void *workspace;
  size_t workspace_size;
} plan_run;

static attn_status plan_open(attn_ctx *ctx, const h_data *d, const char *impl, const char *config,
                             int backward, plan_run *r) {
  memset(r, 0, sizeof *r);
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = impl;
  sel.config = config;
  attn_status st = attn_plan_create(ctx, &d->problem, &sel, &r->plan);
  if (st != ATTN_STATUS_OK || d->gpu == NULL) return st;
  size_t forward = 0, both = 0;
  st = attn_plan_workspace_size(r->plan, &forward, &both);
  r->workspace_size = backward && both > forward ? both : forward;
  if (st == ATTN_STATUS_OK && r->workspace_size > 0) {
    char why[512] = "";
    st = d->gpu->alloc(d->problem.device_index, r->workspace_size, &r->workspace, why, sizeof why);
    if (st != ATTN_STATUS_OK) attn_fail(ctx, st, "%s", why);
  }
  return st;
}

/* One pass of the plan on the data: forward, then backward when asked. On a GPU the pass ends when
 * the device has finished it, so that a time measures the work and a failing kernel is reported
 * here, by the implementation that ran it. */
static attn_status plan_pass(attn_ctx *ctx, const plan_run *r, h_data *d, int backward) {
  attn_status st = attn_plan_forward(r->plan, &d->in, r->workspace, r->workspace_size, &d->out);
  if (st == ATTN_STATUS_OK && backward)
    st = attn_plan_backward(r->plan, &d->in, &d->out, &d->dout, r->workspace, r->workspace_size,
                            &d->grads);
  if (st == ATTN_STATUS_OK && d->gpu != NULL) {
    char why[512] = "";
    st = d->gpu->synchronize(d->problem.device_index, why, sizeof why);
    if (st != ATTN_STATUS_OK) attn_fail(ctx, st, "%s", why);
  }
  return st;
}

static void plan_close(plan_run *r, const h_data *d) {
  if (r->workspace != NULL) d->gpu->release(d->problem.device_index, r->workspace);
  attn_plan_destroy(r->plan);
  memset(r, 0, sizeof *r);
}

/* Runs exactly impl/config once on the data and brings its outputs to d->host. */
static attn_status run_exact(attn_ctx *ctx, h_data *d, const char *impl, const char *config,
                             int backward, attn_dtype rounding) {
  plan_run r;
  attn_status st = plan_open(ctx, d, impl, config, backward, &r);
  if (st == ATTN_STATUS_OK && rounding != ATTN_DTYPE_F64) attn_plan_set_rounding(r.plan, rounding);
  if (st == ATTN_STATUS_OK) st = plan_pass(ctx, &r, d, backward);
  if (st == ATTN_STATUS_OK) st = h_data_download(ctx, d);
  plan_close(&r, d);
  return st;
}

static const attn_role compared_roles[5] = {ATTN_ROLE_OUT, ATTN_ROLE_LSE, ATTN_ROLE_DQ,
                                            ATTN_ROLE_DK, ATTN_ROLE_DV};
static const char *const compared_names[5] = {"out", "lse", "dq", "dk", "dv"};

/* The difference of a role of a from the same role of r (tolerance.h). */
static tol_err compare(const h_data *a, const h_data *r, attn_role role) {
  int64_t n = attn_role_numel(&a->problem, role);
  attn_dtype ta = attn_role_dtype(&a->problem, role), tr = attn_role_dtype(&r->problem, role);
  tol_err e = tol_err_init();
  for (int64_t i = 0; i < n; ++i)
    tol_err_add(&e, i, attn_load(a->host.role[role], ta, i), attn_load(r->host.role[role], tr, i));
  return e;
}

h_check h_check_run(attn_ctx *ctx, const attn_problem *problem, const char *impl,
                    const char *config, int backward, uint64_t seed) {
  h_check c;
  memset(&c, 0, sizeof c);
  h_data data, oracle, naive;
  memset(&oracle, 0, sizeof oracle);
  memset(&naive, 0, sizeof naive);
  attn_dtype dtype = (attn_dtype)problem->dtype;
  int low = dtype == ATTN_DTYPE_F16 || dtype == ATTN_DTYPE_BF16;
  c.status = h_data_make(ctx, &data, problem, seed, backward);
  if (c.status != ATTN_STATUS_OK) goto done;
  /* The reference runs on the host, from the host copy of the inputs the implementation reads. */
  if (!h_data_convert(&oracle, &data, ATTN_DTYPE_F64, backward) ||
      (low && !h_data_convert(&naive, &data, dtype, backward))) {
    c.status = attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY,
                         "out of memory allocating the reference's copy of the data");
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
    tol_err e = compare(&data, &oracle, role);
    double naive_err = 0.0; /* the f32 rule needs none */
    if (low) {
      tol_err en = compare(&naive, &oracle, role);
      naive_err = tol_naive_error(&en, NULL);
    }
    c.err[i] = e.nonfinite != 0 ? INFINITY : e.max_abs;
    c.ref[i] = e.max_ref;
    c.tol[i] = tol_bound(dtype, i < 2 ? TOL_FORWARD : TOL_GRADIENT, c.ref[i], naive_err);
    c.compared++;
    double ratio = c.tol[i] > 0 ? c.err[i] / c.tol[i] : (c.err[i] > 0 ? INFINITY : 0.0);
    if (!tol_ok(&e, c.tol[i])) c.ok = 0;
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
  attn_status st = h_data_make(ctx, &d, problem, seed, backward);
  if (st != ATTN_STATUS_OK) return st;
  plan_run r;
  st = plan_open(ctx, &d, impl, config, backward, &r);
  for (int i = 0; st == ATTN_STATUS_OK && i < warmup; ++i) st = plan_pass(ctx, &r, &d, backward);
  int cap = reps > 16 ? reps : 16, n = 0;
  double *times = malloc((size_t)cap * sizeof *times);
  if (st == ATTN_STATUS_OK && times == NULL)
    st = attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory for the timings");
  double start = now_us();
  while (st == ATTN_STATUS_OK && (n < reps || now_us() - start < min_seconds * 1e6)) {
    if (n == cap) {
      double *more = realloc(times, 2 * (size_t)cap * sizeof *times);
      if (more == NULL) {
        st = attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory for the timings");
        break;
      }
      times = more;
      cap *= 2;
    }
    double t0 = now_us();
    st = plan_pass(ctx, &r, &d, backward);
    times[n++] = now_us() - t0;
  }
  if (st == ATTN_STATUS_OK && n > 0) {
    qsort(times, (size_t)n, sizeof *times, compare_double);
    *median_us = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
    *runs = n;
  }
  free(times);
  plan_close(&r, &d);
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

double h_kv_bytes(const attn_problem *p) {
  const int64_t tq = p->seqlen_q, tk = p->seqlen_k;
  const int64_t o = p->align == ATTN_ALIGN_BOTTOM_RIGHT ? tk - tq : 0;
  const int64_t left = p->window_left, right = p->causal ? 0 : p->window_right;
  int64_t lo = left < 0 ? 0 : o - left, hi = right < 0 ? tk : o + tq - 1 + right + 1;
  if (lo < 0) lo = 0;
  if (hi > tk) hi = tk;
  const int64_t keys = hi > lo ? hi - lo : 0;
  const int64_t dv = p->head_dim_v > 0 ? p->head_dim_v : p->head_dim;
  return (double)p->batch * (double)p->heads_kv * (double)keys * (double)(p->head_dim + dv) *
         (double)attn_dtype_size((attn_dtype)p->dtype);
}
