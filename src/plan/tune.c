/*
 * src/plan/tune.c - measuring a candidate: scratch data of the problem's shape, warm-up, timed runs
 * with an early stop, the median.
 *
 * The tuner allocates its own inputs (never the caller's: a plan is made before any data exists,
 * as with FFTW_MEASURE) and fills them with seeded values in [-1, 1), a mask that keeps most keys,
 * one segment, and sequences of the full lengths, so every candidate runs the same work. It runs
 * each candidate through an ordinary plan, so what is timed is exactly what attn_plan_forward runs.
 * For a GPU problem the data, the sequence lengths and each candidate's workspace live in device
 * memory (core/gpu.h), and a timed run ends when the device has finished its work.
 */
#define _POSIX_C_SOURCE 200809L
#include "plan/exec.h"

#include "core/ctx.h"
#include "core/dtype.h"
#include "core/gpu.h"
#include "core/tensors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct attn_scratch {
  void *data[ATTN_ROLE_COUNT];
  int32_t *cu_q, *cu_k, *len_q, *len_k;
  int32_t *cache_len; /* a paged cache's lengths: every sequence full */
  const attn_gpu_ops *gpu; /* non-NULL: every buffer above is device memory of device_index */
  int32_t device_index;
  attn_inputs inputs;
  attn_outputs outputs;
  attn_tensor dout;
  attn_grads grads;
};

/* Lengths of B sequences sharing total rows, each at most max (validation refuses the rest). */
static int32_t *even_cu_seqlens(int64_t batch, int64_t total) {
  int32_t *cu = malloc((size_t)(batch + 1) * sizeof *cu);
  if (cu == NULL) return NULL;
  cu[0] = 0;
  for (int64_t b = 0; b < batch; ++b)
    cu[b + 1] = cu[b] + (int32_t)(total / batch + (b < total % batch ? 1 : 0));
  return cu;
}

static int32_t *full_seqlens(int64_t batch, int64_t len) {
  int32_t *s = malloc((size_t)batch * sizeof *s);
  if (s == NULL) return NULL;
  for (int64_t b = 0; b < batch; ++b) s[b] = (int32_t)len;
  return s;
}

/* Replaces the host buffer *buf (bytes, filled) by a device copy; the host buffer is freed either
 * way, and *buf is NULL when the copy failed. */
static attn_status to_device(const attn_scratch *s, void **buf, size_t bytes, char *why,
                             size_t why_size) {
  void *dev = NULL;
  attn_status status = s->gpu->alloc(s->device_index, bytes, &dev, why, why_size);
  if (status == ATTN_STATUS_OK)
    status = s->gpu->upload(s->device_index, dev, *buf, bytes, why, why_size);
  if (status != ATTN_STATUS_OK) {
    s->gpu->release(s->device_index, dev);
    dev = NULL;
  }
  free(*buf);
  *buf = dev;
  return status;
}

attn_status attn_scratch_create(const attn_problem *p, int backward, attn_scratch **out, char *why,
                                size_t why_size) {
  *out = NULL;
  attn_status status = ATTN_STATUS_OK;
  attn_scratch *s = calloc(1, sizeof *s);
  if (s == NULL) goto oom;
  if (p->device != ATTN_DEVICE_CPU) {
    s->gpu = attn_gpu();
    s->device_index = p->device_index;
    if (s->gpu == NULL) {
      attn_scratch_destroy(s);
      attn_format(why, why_size,
                  "timing a GPU problem needs the CUDA runtime of a GPU module, and none loaded "
                  "(attn_module_info says why)");
      return ATTN_STATUS_UNSUPPORTED;
    }
  }
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (int r = 0; r < ATTN_ROLE_COUNT; ++r) {
    attn_role role = (attn_role)r;
    if (!attn_role_needed(p, role, backward)) continue;
    attn_tensor *slot = attn_role_field(role, &s->inputs, &s->outputs, &s->dout, &s->grads);
    int64_t n = attn_role_numel(p, role);
    attn_dtype dtype = attn_role_dtype(p, role);
    size_t bytes = (size_t)(n > 0 ? n : 1) * attn_dtype_size(dtype);
    s->data[r] = malloc(bytes);
    if (s->data[r] == NULL) goto oom;
    for (int64_t i = 0; i < n; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      double u = (double)(state >> 11) * (1.0 / 9007199254740992.0); /* [0, 1) */
      /* attn_store writes floating types only: the mask and segment ids are written here. */
      if (role == ATTN_ROLE_MASK)
        ((uint8_t *)s->data[r])[i] = u < 0.9; /* keeps most keys */
      else if (role == ATTN_ROLE_BLOCK_TABLE) /* each sequence its own pages, as an engine's */
        ((int32_t *)s->data[r])[i] = (int32_t)(i % attn_paged_num_pages(p));
      else if (dtype == ATTN_DTYPE_I32)
        ((int32_t *)s->data[r])[i] = 0; /* one segment */
      else if (role == ATTN_ROLE_Q_DESCALE || role == ATTN_ROLE_K_DESCALE ||
               role == ATTN_ROLE_V_DESCALE) /* a quantiser's factors are positive */
        attn_store(s->data[r], dtype, i, 0.5 + u);
      else
        attn_store(s->data[r], dtype, i, role == ATTN_ROLE_ALIBI ? 0.5 * u : 2.0 * u - 1.0);
    }
    if (s->gpu != NULL &&
        (status = to_device(s, &s->data[r], bytes, why, why_size)) != ATTN_STATUS_OK)
      goto fail;
    *slot = attn_tensor_dense(s->data[r]);
  }
  if (p->varlen != ATTN_VARLEN_NONE) {
    const int packed = p->varlen == ATTN_VARLEN_PACKED;
    int32_t **q = packed ? &s->cu_q : &s->len_q, **k = packed ? &s->cu_k : &s->len_k;
    *q = packed ? even_cu_seqlens(p->batch, p->total_q) : full_seqlens(p->batch, p->seqlen_q);
    *k = packed ? even_cu_seqlens(p->batch, p->total_k) : full_seqlens(p->batch, p->seqlen_k);
    if (*q == NULL || *k == NULL) goto oom;
    const size_t bytes = (size_t)(p->batch + packed) * sizeof(int32_t);
    if (s->gpu != NULL &&
        ((status = to_device(s, (void **)q, bytes, why, why_size)) != ATTN_STATUS_OK ||
         (status = to_device(s, (void **)k, bytes, why, why_size)) != ATTN_STATUS_OK))
      goto fail;
    if (packed)
      s->inputs.cu_seqlens_q = s->cu_q, s->inputs.cu_seqlens_k = s->cu_k;
    else
      s->inputs.seqlens_q = s->len_q, s->inputs.seqlens_k = s->len_k;
  }
  if (p->page_size > 0) {
    if ((s->cache_len = full_seqlens(p->batch, p->seqlen_k - p->seqlen_new)) == NULL) goto oom;
    if (s->gpu != NULL &&
        (status = to_device(s, (void **)&s->cache_len, (size_t)p->batch * sizeof(int32_t), why,
                            why_size)) != ATTN_STATUS_OK)
      goto fail;
    s->inputs.cache_seqlens = s->cache_len;
  }
  s->inputs.dropout_seed = 1234;
  *out = s;
  return ATTN_STATUS_OK;
oom:
  attn_format(why, why_size, "out of memory allocating the tuner's scratch data");
  status = ATTN_STATUS_OUT_OF_MEMORY;
fail: /* why says what failed */
  attn_scratch_destroy(s);
  return status;
}

static void release(const attn_scratch *s, void *buf) {
  if (s->gpu != NULL)
    s->gpu->release(s->device_index, buf);
  else
    free(buf);
}

void attn_scratch_destroy(attn_scratch *s) {
  if (s == NULL) return;
  for (int r = 0; r < ATTN_ROLE_COUNT; ++r) release(s, s->data[r]);
  release(s, s->cu_q);
  release(s, s->cu_k);
  release(s, s->len_q);
  release(s, s->len_k);
  release(s, s->cache_len);
  free(s);
}

/* ---- timing ---------------------------------------------------------------------------------- */

static attn_tune_timer_fn timer_fn = NULL;
static void *timer_user = NULL;

void attn_tune_set_timer_for_testing(attn_tune_timer_fn fn, void *user) {
  timer_fn = fn;
  timer_user = user;
}

int attn_tune_injected(const char *impl, const char *config, const char *problem, double *us) {
  if (timer_fn == NULL) return 0;
  if (impl != NULL) *us = timer_fn(timer_user, impl, config, problem);
  return 1;
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

static double median_of(const double *times, int n, double *sorted) {
  memcpy(sorted, times, (size_t)n * sizeof *sorted);
  qsort(sorted, (size_t)n, sizeof *sorted, compare_double);
  return n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}

/* One run: forward, or forward then backward; on a GPU, until the device has finished it. The
 * workspace is the scratch's device buffer on a GPU, NULL (the plan's own) on the CPU. */
static attn_status run_once(attn_plan *plan, attn_scratch *s, int backward, void *workspace,
                            size_t workspace_size, char *why, size_t why_size) {
  attn_status status = attn_plan_forward(plan, &s->inputs, workspace, workspace_size, &s->outputs);
  if (status == ATTN_STATUS_OK && backward)
    status = attn_plan_backward(plan, &s->inputs, &s->outputs, &s->dout, workspace, workspace_size,
                                &s->grads);
  if (status == ATTN_STATUS_OK && s->gpu != NULL)
    status = s->gpu->synchronize(s->device_index, why, why_size);
  return status;
}

attn_status attn_tune_measure(attn_ctx *ctx, const attn_problem *p, const attn_impl *impl,
                              int32_t config, const attn_policy *policy, attn_scratch *scratch,
                              double cutoff_us, double *median_us, int32_t *runs, char *why,
                              size_t why_size) {
  *median_us = 0.0;
  *runs = 0;
  if (why_size > 0) why[0] = '\0';
  /* A private context: a failing candidate must not overwrite the caller's last error or reach its
   * log as an error, since the executor survives it. */
  attn_ctx *tctx = NULL;
  attn_status status = attn_ctx_create(&tctx);
  if (status != ATTN_STATUS_OK) {
    attn_format(why, why_size, "out of memory");
    return status;
  }
  tctx->num_threads = ctx->num_threads;
  /* A paged cache or an f8e4m3 problem has no backward pass (docs/DECODE.md, docs/FP8.md): its
   * forward is what a training policy gets timed. */
  const int backward = policy->tune_backward && attn_has_backward(p);
  attn_plan *plan = NULL;
  status = attn_plan_create_exact(tctx, p, impl, config, &plan);
  /* A GPU plan runs on the caller's device workspace: the tuner's, sized for this candidate. */
  void *workspace = NULL;
  size_t workspace_size = 0;
  if (status == ATTN_STATUS_OK && scratch->gpu != NULL) {
    size_t fwd = 0, bwd = 0;
    status = attn_plan_workspace_size(plan, &fwd, &bwd);
    workspace_size = backward && bwd > fwd ? bwd : fwd;
    if (status == ATTN_STATUS_OK && workspace_size > 0)
      status =
          scratch->gpu->alloc(scratch->device_index, workspace_size, &workspace, why, why_size);
  }
  int n_max = policy->measure_iters > 0 ? policy->measure_iters : 1;
  double *times = malloc(2 * (size_t)n_max * sizeof *times);
  if (status == ATTN_STATUS_OK && times == NULL) status = ATTN_STATUS_OUT_OF_MEMORY;
  double start = now_us();
  double budget_us = policy->max_seconds * 1e6;
  for (int i = 0; status == ATTN_STATUS_OK && i < policy->warmup_iters; ++i) {
    double t0 = now_us();
    status =
        run_once(plan, scratch, backward, workspace, workspace_size, why, why_size);
    double t1 = now_us();
    if (t1 - start > budget_us || (cutoff_us > 0.0 && t1 - t0 > cutoff_us)) break;
  }
  int n = 0;
  double last_median = -1.0;
  while (status == ATTN_STATUS_OK && n < n_max) {
    double t0 = now_us();
    status =
        run_once(plan, scratch, backward, workspace, workspace_size, why, why_size);
    double t1 = now_us();
    if (status != ATTN_STATUS_OK) break;
    times[n++] = t1 - t0;
    if (t1 - start > budget_us) break;
    /* A run this much slower than the best candidate so far cannot win: stop measuring it. */
    if (cutoff_us > 0.0 && t1 - t0 > cutoff_us) break;
    /* Early stop: after 10 runs, every 5 runs, stop once the median moved by less than 1%. */
    if (n >= 10 && n % 5 == 0) {
      double m = median_of(times, n, times + n_max);
      if (last_median > 0.0 && fabs(m - last_median) <= 0.01 * m) break;
      last_median = m;
    }
  }
  if (status == ATTN_STATUS_OK) {
    *median_us = median_of(times, n, times + n_max);
    *runs = n;
  } else if (tctx->last_error[0]) {
    attn_format(why, why_size, "%s", tctx->last_error);
  } else if (why[0] == '\0') {
    attn_format(why, why_size, "%s", attn_status_string(status));
  }
  if (workspace != NULL) scratch->gpu->release(scratch->device_index, workspace);
  free(times);
  attn_plan_destroy(plan);
  attn_ctx_destroy(tctx);
  return status;
}
