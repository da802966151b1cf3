/*
 * tests/gputest.c - the GPU tests' shared helpers; see gputest.h.
 */
#include "gputest.h"

#include <string.h>

attn_problem tu_gpu_problem(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                            int64_t heads_kv, int64_t head_dim, attn_dtype dtype) {
  attn_problem p;
  attn_problem_init(&p);
  p.dtype = dtype;
  p.device = ATTN_DEVICE_CUDA;
  p.batch = batch, p.seqlen_q = seqlen_q, p.seqlen_k = seqlen_k;
  p.heads_q = heads_q, p.heads_kv = heads_kv, p.head_dim = head_dim;
  return p;
}

void tu_gpu_expect_unsupported(attn_ctx *ctx, const char *impl, const char *name, attn_problem p,
                               const char *keyword) {
  attn_status s = attn_impl_supports(ctx, impl, &p);
  const char *msg = attn_ctx_last_error(ctx);
  tu_check(s == ATTN_STATUS_UNSUPPORTED && strstr(msg, keyword) != NULL,
           "unsupported %s: %s, \"%s\" (expected a reason naming \"%s\")", name,
           attn_status_string(s), msg, keyword);
}

tu_gpu_exec tu_gpu_exec_create(attn_plan *plan) {
  tu_gpu_exec exec = {NULL, 0, NULL};
  size_t fw = 0, bw = 0;
  attn_plan_workspace_size(plan, &fw, &bw);
  exec.workspace_size = fw > bw ? fw : bw;
  if (exec.workspace_size > 0) TU_CUDA_CHECK(cudaMalloc(&exec.workspace, exec.workspace_size));
  TU_CUDA_CHECK(cudaStreamCreate(&exec.stream));
  attn_plan_set_stream(plan, exec.stream);
  return exec;
}

void tu_gpu_exec_destroy(tu_gpu_exec *exec) {
  if (exec->workspace != NULL) TU_CUDA_CHECK(cudaFree(exec->workspace));
  if (exec->stream != NULL) TU_CUDA_CHECK(cudaStreamDestroy(exec->stream));
  exec->workspace = NULL, exec->stream = NULL;
}

void *tu_gpu_upload(const void *host, size_t bytes) {
  if (bytes == 0) bytes = 1;
  void *device = NULL;
  TU_CUDA_CHECK(cudaMalloc(&device, bytes));
  if (host != NULL) TU_CUDA_CHECK(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice));
  else TU_CUDA_CHECK(cudaMemset(device, 0xff, bytes));
  return device;
}

tu_buf tu_gpu_fetch(const void *device, attn_dtype dtype, int64_t n) {
  tu_buf h = tu_buf_new(dtype, n);
  if (n > 0)
    TU_CUDA_CHECK(cudaMemcpy(h.data, device, (size_t)n * attn_dtype_size(dtype),
                             cudaMemcpyDeviceToHost));
  return h;
}

void tu_gpu_check_close(const char *name, const char *what, tol_pass pass, const tu_buf *got,
                        const tu_buf *naive, const tu_buf *naive_alt, const tu_buf *naive_fed,
                        const double *exact) {
  int64_t n = naive->n;
  if (got->n < n) { /* the implementation was not asked for it, or its run stopped early */
    tu_check(0, "%s %s: not computed", name, what);
    return;
  }
  tol_err eg = tu_compare(got, exact, n), en = tu_compare(naive, exact, n), ea = tol_err_init();
  tol_err ef = tol_err_init();
  if (naive_alt != NULL) ea = tu_compare(naive_alt, exact, n);
  if (naive_fed != NULL && naive_fed->n >= n) ef = tu_compare(naive_fed, exact, n);
  double naive_err = tol_naive_error(&en, naive_alt != NULL ? &ea : NULL,
                                     naive_fed != NULL && naive_fed->n >= n ? &ef : NULL);
  double tol = tol_bound_low_precision(pass, eg.max_ref, naive_err, NULL);
  double at = eg.where >= 0 ? tu_get(got, eg.where) : 0.0;
  double want = eg.where >= 0 ? exact[eg.where] : 0.0;
  tu_check(tol_ok(&eg, tol),
           "%-44s %-6s err %.3g (naive %.3g, tol %.3g, max|r| %.3g, bad %lld) at %lld: %g vs %g",
           name, what, eg.max_abs, naive_err, tol, eg.max_ref, (long long)eg.nonfinite,
           (long long)eg.where, at, want);
}

void tu_gpu_on_tune_event(void *user, const attn_event *e) {
  tu_tune_log *log = user;
  if (e->kind == ATTN_EVENT_KIND_TUNE_START) ++log->starts;
  if (e->kind == ATTN_EVENT_KIND_TUNE_CANDIDATE) {
    int measured = e->status == ATTN_STATUS_OK && e->time_us > 0.0;
    if (measured) ++log->measured;
    else ++log->failed;
    if (log->ncandidates < (int)(sizeof log->candidate / sizeof log->candidate[0])) {
      snprintf(log->candidate[log->ncandidates].impl, sizeof log->candidate[0].impl, "%s", e->impl);
      log->candidate[log->ncandidates++].measured = measured;
    }
  }
  if (e->kind == ATTN_EVENT_KIND_TUNE_FINISH) {
    ++log->finishes;
    snprintf(log->impl, sizeof log->impl, "%s", e->impl);
    snprintf(log->config, sizeof log->config, "%s", e->config);
  }
  if (e->kind == ATTN_EVENT_KIND_CACHE_HIT_MEMORY) ++log->memory_hits;
}

int tu_tune_log_measured(const tu_tune_log *log, const char *impl) {
  int n = 0;
  for (int i = 0; i < log->ncandidates; ++i)
    n += log->candidate[i].measured && strcmp(log->candidate[i].impl, impl) == 0;
  return n;
}

int tu_gpu_found(void) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    printf("SKIP: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none");
    return 0;
  }
  struct cudaDeviceProp prop;
  TU_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  printf("device 0: %s, sm%d%d, %d SMs\n", prop.name, prop.major, prop.minor,
         prop.multiProcessorCount);
  return 1;
}

int tu_gpu_skipped(void) {
  int failed = tu_failures();
  tu_finish();
  return failed ? 1 : 77;
}
