/*
 * tests/gputest.h - what the two GPU tests (test_cuda.c, test_cudnn.c) share on top of testutil.h:
 * a fatal check of CUDA runtime calls, problems on the device, the refusal check, a plan's
 * workspace and stream, device copies of host buffers, SPEC.md's low-precision comparison, the log
 * of an autotuning, and how a program without a device ends.
 *
 * It calls the CUDA runtime, so tests/CMakeLists.txt builds it only where the CUDA toolkit was
 * found and links it into those two tests only (its name is not test_*.c, so it is not a test).
 */
#ifndef ATTN_GPUTEST_H
#define ATTN_GPUTEST_H

#include "attn.h"
#include "testutil.h"

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* A CUDA runtime call that must succeed. A failure prints "FATAL <call>: <error> (<file>:<line>)"
 * and ends the program with 1: after a failed allocation or copy (or an earlier kernel's fault,
 * which the next call reports) no later check could be trusted. */
#define TU_CUDA_CHECK(expr)                                                                        \
  do {                                                                                             \
    cudaError_t e_ = (expr);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      printf("FATAL %s: %s (%s:%d)\n", #expr, cudaGetErrorString(e_), __FILE__, __LINE__);         \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

/* A problem on the device (problem.device = ATTN_DEVICE_CUDA) with the given dtype and sizes; every
 * other field keeps attn_problem_init's default. */
attn_problem tu_gpu_problem(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                            int64_t heads_kv, int64_t head_dim, attn_dtype dtype);

/* One check: implementation `impl` refuses p as UNSUPPORTED with a reason (the context's last
 * error) that contains keyword, so a user learns which feature is missing. name labels the check. */
void tu_gpu_expect_unsupported(attn_ctx *ctx, const char *impl, const char *name, attn_problem p,
                               const char *keyword);

/* What a plan needs to run on the device: one workspace large enough for its forward and its
 * backward pass, and a stream of its own, set on the plan by tu_gpu_exec_create. */
typedef struct tu_gpu_exec {
  void *workspace; /* NULL when the plan needs none */
  size_t workspace_size;
  cudaStream_t stream;
} tu_gpu_exec;

tu_gpu_exec tu_gpu_exec_create(attn_plan *plan);
void tu_gpu_exec_destroy(tu_gpu_exec *exec);

/* Device memory of `bytes` bytes (at least one, so the pointer is never NULL) holding a copy of
 * host, or, when host is NULL, 0xff in every byte: NaN in every float format, so an element an
 * implementation forgets to write fails the comparison. Freed with cudaFree. */
void *tu_gpu_upload(const void *host, size_t bytes);

/* A host copy of n elements of dtype at device (nothing is read when n is 0). */
tu_buf tu_gpu_fetch(const void *device, attn_dtype dtype, int64_t n);

/* One check, SPEC.md's rule for a low-precision result (tolerance.h: tol_bound_low_precision, the
 * factor set by pass): got (whose first naive->n elements count) is within 2x or 3x the error of
 * the naive same-dtype computation + 1e-3 x max|exact|, and has no NaN or infinity where exact has
 * none. naive_alt, when not NULL, is the reference at the dtype without rounding inside, and
 * naive_fed (gradients; NULL otherwise) the f64 reference's backward given the implementation's
 * own out and lse: the bound takes the largest of their errors (tol_naive_error says why;
 * test_cuda runs both). The line names the case and the tensor, the errors, and the worst
 * element. */
void tu_gpu_check_close(const char *name, const char *what, tol_pass pass, const tu_buf *got,
                        const tu_buf *naive, const tu_buf *naive_alt, const tu_buf *naive_fed,
                        const double *exact);

/* What the executor reported while it made a plan (attn_ctx_set_event_callback(ctx,
 * tu_gpu_on_tune_event, &log), log zeroed first): the tunings, each candidate timed or failed, the
 * winner, and the memory-cache hits. */
typedef struct tu_tune_log {
  int starts, finishes, measured, failed, memory_hits;
  char impl[32], config[32]; /* the winner */
  int ncandidates;           /* the first 16 candidates, in the order they were timed */
  struct {
    char impl[32];
    int measured; /* 1: timed; 0: failed */
  } candidate[16];
} tu_tune_log;

void tu_gpu_on_tune_event(void *user, const attn_event *e);

/* How many candidates of implementation impl the log saw timed. */
int tu_tune_log_measured(const tu_tune_log *log, const char *impl);

/* Whether a CUDA device is present. With one, prints "device 0: <name>, sm<XY>, <N> SMs" and
 * returns 1; without, prints "SKIP: no CUDA device (<why>)" and returns 0. */
int tu_gpu_found(void);

/* How a program that found no device ends: prints the tally of the checks that ran without one and
 * returns 77 ("skipped" to CTest) when they all passed, else 1. */
int tu_gpu_skipped(void);

#endif /* ATTN_GPUTEST_H */
