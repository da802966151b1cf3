/*
 * src/dist/transport_nccl.c - the NCCL transport (src/dist/transport.h), built as the run-time
 * module libattn_nccl.so, which links libnccl and the CUDA runtime; libattn loads it when a plan
 * asks for NCCL. One GPU per rank: the caller selects the device (cudaSetDevice) before making the
 * plan, as for its own NCCL communicator.
 *
 * The plan's communicator is split off the caller's (ncclCommSplit, collective), so the plan's
 * operations never interleave with the caller's. Every operation is enqueued on the plan's stream
 * (attn_dist_plan_set_stream; NULL = the legacy default stream) and completes when an event
 * recorded after it completes. Waits poll the event and NCCL's asynchronous error
 * (ncclCommGetAsyncError) and give up after the timeout by aborting the communicator
 * (ncclCommAbort), which releases the stream instead of leaving a kernel waiting for a peer that
 * is gone: the plan then refuses further runs.
 *
 * Memory: point-to-point transfers, shift and alltoall move memory on the device; allgather and
 * allreduce_sum take host memory (the plan's agreement check and the dsinks/dbias sums are small)
 * and stage it through device buffers.
 *
 * Status: batch and head splits, the device ring (ring.c), the all-to-all (ulysses.c, its
 * reordering on the GPU) and both on two sequence axes run over it (docs/DISTRIBUTED.md, "On
 * GPUs"). tests/test_dist_gpu.c runs the same cases over it on 2 GPUs and over the loopback test
 * transport on one.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep */
#include "dist/transport_stream.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

#if defined(__GNUC__)
#define NCCL_TRANSPORT_EXPORT __attribute__((visibility("default")))
#else
#define NCCL_TRANSPORT_EXPORT
#endif

typedef struct nccl_self {
  ncclComm_t comm; /* the plan's own (a split of the caller's) */
  int rank, size;
  cudaStream_t stream; /* borrowed; NULL = default stream */
  int aborted;         /* a wait timed out or NCCL failed: the communicator is gone */
} nccl_self;

typedef struct nccl_request {
  cudaEvent_t done;
} nccl_request;

static int32_t nccl_fail(ncclResult_t r, const char *what, char *why, size_t why_size) {
  snprintf(why, why_size, "%s failed: %s", what, ncclGetErrorString(r));
  return ATTN_STATUS_IO_ERROR;
}

static int32_t cuda_fail(cudaError_t e, const char *what, char *why, size_t why_size) {
  snprintf(why, why_size, "%s failed: %s", what, cudaGetErrorString(e));
  return ATTN_STATUS_DEVICE_ERROR;
}

#define NCCL_TRY(call, what)                                                                       \
  do {                                                                                             \
    ncclResult_t r_ = (call);                                                                      \
    if (r_ != ncclSuccess) return nccl_fail(r_, what, why, why_size);                              \
  } while (0)
#define CUDA_TRY(call, what)                                                                       \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) return cuda_fail(e_, what, why, why_size);                              \
  } while (0)

/* Records an event after what was enqueued on the stream: the request of those operations. */
static int32_t make_request(nccl_self *s, void **request, char *why, size_t why_size) {
  nccl_request *r = malloc(sizeof *r);
  if (r == NULL) {
    snprintf(why, why_size, "out of memory");
    return ATTN_STATUS_OUT_OF_MEMORY;
  }
  cudaError_t e = stream_transport_mark(s->stream, &r->done);
  if (e != cudaSuccess) {
    free(r);
    return cuda_fail(e, "cudaEventRecord", why, why_size);
  }
  *request = r;
  return ATTN_STATUS_OK;
}

/* NCCL's asynchronous error, checked between polls of an event. */
typedef struct async_check {
  nccl_self *s;
  ncclResult_t error;
} async_check;

static int async_failed(void *arg) {
  async_check *a = arg;
  ncclResult_t async = ncclSuccess;
  ncclCommGetAsyncError(a->s->comm, &async);
  a->error = async;
  return async != ncclSuccess && async != ncclInProgress;
}

/* Polls the event and NCCL's error until done, failed or timed out (then the communicator is
 * aborted so no kernel keeps waiting for a peer). */
static int32_t wait_event(nccl_self *s, cudaEvent_t ev, double timeout_s, const char *what,
                          char *why, size_t why_size) {
  async_check check = {s, ncclSuccess};
  cudaError_t e = cudaSuccess;
  switch (stream_transport_poll(ev, timeout_s, async_failed, &check, &e)) {
  case STREAM_TRANSPORT_DONE: return ATTN_STATUS_OK;
  case STREAM_TRANSPORT_CUDA_ERROR: return cuda_fail(e, what, why, why_size);
  case STREAM_TRANSPORT_PEER_ERROR:
    ncclCommAbort(s->comm);
    s->aborted = 1;
    return nccl_fail(check.error, what, why, why_size);
  case STREAM_TRANSPORT_TIMED_OUT: break;
  }
  ncclCommAbort(s->comm);
  s->aborted = 1;
  snprintf(why, why_size,
           "%s did not complete within %.0f s (a peer failed or is not in "
           "the same call); the plan's communicator was aborted",
           what, timeout_s);
  return ATTN_STATUS_IO_ERROR;
}

static int32_t check_alive(nccl_self *s, char *why, size_t why_size) {
  if (!s->aborted) return ATTN_STATUS_OK;
  snprintf(why, why_size, "the plan's NCCL communicator was aborted after an earlier failure");
  return ATTN_STATUS_IO_ERROR;
}

static int32_t t_create(void *comm, void **self, char *why, size_t why_size) {
  *self = NULL;
  nccl_self *s = calloc(1, sizeof *s);
  if (s == NULL) {
    snprintf(why, why_size, "out of memory");
    return ATTN_STATUS_OUT_OF_MEMORY;
  }
  ncclComm_t user = *(ncclComm_t *)comm;
  int rank = 0;
  ncclResult_t r = ncclCommUserRank(user, &rank);
  if (r == ncclSuccess) r = ncclCommSplit(user, 0, rank, &s->comm, NULL);
  if (r == ncclSuccess) r = ncclCommUserRank(s->comm, &s->rank);
  if (r == ncclSuccess) r = ncclCommCount(s->comm, &s->size);
  if (r != ncclSuccess) {
    free(s);
    return nccl_fail(r, "ncclCommSplit of the caller's communicator", why, why_size);
  }
  *self = s;
  return ATTN_STATUS_OK;
}

static void t_destroy(void *self) {
  nccl_self *s = self;
  if (s == NULL) return;
  if (!s->aborted) ncclCommDestroy(s->comm);
  free(s);
}

static int32_t t_rank(void *self) { return ((nccl_self *)self)->rank; }
static int32_t t_size(void *self) { return ((nccl_self *)self)->size; }

static int32_t t_split(void *self, int32_t color, int32_t key, void **sub, char *why,
                       size_t why_size) {
  nccl_self *s = self;
  *sub = NULL;
  int32_t status = check_alive(s, why, why_size);
  if (status != ATTN_STATUS_OK) return status;
  nccl_self *t = calloc(1, sizeof *t);
  if (t == NULL) {
    snprintf(why, why_size, "out of memory");
    return ATTN_STATUS_OUT_OF_MEMORY;
  }
  ncclResult_t r = ncclCommSplit(s->comm, color, key, &t->comm, NULL);
  if (r == ncclSuccess) r = ncclCommUserRank(t->comm, &t->rank);
  if (r == ncclSuccess) r = ncclCommCount(t->comm, &t->size);
  if (r != ncclSuccess) {
    free(t);
    return nccl_fail(r, "ncclCommSplit", why, why_size);
  }
  t->stream = s->stream;
  *sub = t;
  return ATTN_STATUS_OK;
}

/* A lone send or receive is its own group: pairing one with the other on the same stream
 * deadlocks a ring (each rank's receive waits for a send queued behind its peer's receive), which
 * is why the algorithms move data with shift(). */
static int32_t t_isend(void *self, const void *buf, size_t bytes, int32_t peer, int32_t tag,
                       void **request, char *why, size_t why_size) {
  nccl_self *s = self;
  (void)tag; /* NCCL matches point-to-point operations by issue order, not tags */
  *request = NULL;
  int32_t status = check_alive(s, why, why_size);
  if (status != ATTN_STATUS_OK) return status;
  NCCL_TRY(ncclSend(buf, bytes, ncclUint8, peer, s->comm, s->stream), "ncclSend");
  return make_request(s, request, why, why_size);
}

static int32_t t_irecv(void *self, void *buf, size_t bytes, int32_t peer, int32_t tag,
                       void **request, char *why, size_t why_size) {
  nccl_self *s = self;
  (void)tag;
  *request = NULL;
  int32_t status = check_alive(s, why, why_size);
  if (status != ATTN_STATUS_OK) return status;
  NCCL_TRY(ncclRecv(buf, bytes, ncclUint8, peer, s->comm, s->stream), "ncclRecv");
  return make_request(s, request, why, why_size);
}

static int32_t t_shift(void *self, const void *send_buf, int32_t to, void *recv_buf, int32_t from,
                       size_t bytes, int32_t tag, void **request, char *why, size_t why_size) {
  nccl_self *s = self;
  (void)tag;
  *request = NULL;
  int32_t status = check_alive(s, why, why_size);
  if (status != ATTN_STATUS_OK) return status;
  NCCL_TRY(ncclGroupStart(), "ncclGroupStart");
  ncclResult_t r = ncclRecv(recv_buf, bytes, ncclUint8, from, s->comm, s->stream);
  if (r == ncclSuccess) r = ncclSend(send_buf, bytes, ncclUint8, to, s->comm, s->stream);
  ncclResult_t end = ncclGroupEnd();
  if (r != ncclSuccess) return nccl_fail(r, "ncclSend/ncclRecv", why, why_size);
  if (end != ncclSuccess) return nccl_fail(end, "ncclGroupEnd", why, why_size);
  return make_request(s, request, why, why_size);
}

static int32_t t_wait(void *self, void *request, double timeout_s, char *why, size_t why_size) {
  nccl_self *s = self;
  if (request == NULL) return ATTN_STATUS_OK;
  nccl_request *r = request;
  int32_t status = wait_event(s, r->done, timeout_s, "a point-to-point transfer", why, why_size);
  cudaEventDestroy(r->done);
  free(r);
  return status;
}

/* Runs a collective on device copies of host buffers: in (in_bytes) -> out (out_bytes). */
typedef ncclResult_t (*collective_fn)(nccl_self *s, const void *dsend, void *drecv, void *arg);

static int32_t staged(nccl_self *s, const void *in, size_t in_bytes, void *out, size_t out_bytes,
                      collective_fn fn, void *arg, double timeout_s, const char *what, char *why,
                      size_t why_size) {
  int32_t status = check_alive(s, why, why_size);
  if (status != ATTN_STATUS_OK) return status;
  void *dsend = NULL, *drecv = NULL;
  CUDA_TRY(cudaMalloc(&dsend, in_bytes + 1), "cudaMalloc");
  cudaError_t e = cudaMalloc(&drecv, out_bytes + 1);
  if (e == cudaSuccess) e = cudaMemcpyAsync(dsend, in, in_bytes, cudaMemcpyHostToDevice, s->stream);
  if (e != cudaSuccess) {
    cudaFree(dsend);
    cudaFree(drecv);
    return cuda_fail(e, what, why, why_size);
  }
  ncclResult_t r = fn(s, dsend, drecv, arg);
  if (r != ncclSuccess) {
    status = nccl_fail(r, what, why, why_size);
  } else {
    cudaEvent_t ev;
    e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(ev, s->stream);
    if (e != cudaSuccess) {
      status = cuda_fail(e, what, why, why_size);
    } else {
      status = wait_event(s, ev, timeout_s, what, why, why_size);
      cudaEventDestroy(ev);
    }
    if (status == ATTN_STATUS_OK) {
      e = cudaMemcpy(out, drecv, out_bytes, cudaMemcpyDeviceToHost);
      if (e != cudaSuccess) status = cuda_fail(e, what, why, why_size);
    }
  }
  cudaFree(dsend);
  cudaFree(drecv);
  return status;
}

static ncclResult_t run_allgather(nccl_self *s, const void *dsend, void *drecv, void *arg) {
  return ncclAllGather(dsend, drecv, *(size_t *)arg, ncclUint8, s->comm, s->stream);
}

static int32_t t_allgather(void *self, const void *send, void *recv, size_t bytes, double timeout_s,
                           char *why, size_t why_size) {
  nccl_self *s = self;
  return staged(s, send, bytes, recv, bytes * (size_t)s->size, run_allgather, &bytes, timeout_s,
                "an allgather", why, why_size);
}

typedef struct reduce_arg {
  size_t count;
  ncclDataType_t type;
} reduce_arg;

static ncclResult_t run_allreduce(nccl_self *s, const void *dsend, void *drecv, void *arg) {
  const reduce_arg *a = arg;
  return ncclAllReduce(dsend, drecv, a->count, a->type, ncclSum, s->comm, s->stream);
}

static int32_t t_allreduce_sum(void *self, void *buf, size_t count, int32_t type, double timeout_s,
                               char *why, size_t why_size) {
  nccl_self *s = self;
  reduce_arg a = {count, type == ATTN_TRANSPORT_F64 ? ncclFloat64 : ncclFloat32};
  const size_t bytes = count * (type == ATTN_TRANSPORT_F64 ? 8 : 4);
  return staged(s, buf, bytes, buf, bytes, run_allreduce, &a, timeout_s, "an allreduce", why,
                why_size);
}

static int32_t t_alltoall(void *self, const void *send, void *recv, size_t bytes, double timeout_s,
                          char *why, size_t why_size) {
  nccl_self *s = self;
  int32_t status = check_alive(s, why, why_size);
  if (status != ATTN_STATUS_OK) return status;
  NCCL_TRY(ncclGroupStart(), "ncclGroupStart");
  ncclResult_t r = ncclSuccess;
  for (int j = 0; j < s->size && r == ncclSuccess; ++j) {
    r = ncclSend((const char *)send + (size_t)j * bytes, bytes, ncclUint8, j, s->comm, s->stream);
    if (r == ncclSuccess)
      r = ncclRecv((char *)recv + (size_t)j * bytes, bytes, ncclUint8, j, s->comm, s->stream);
  }
  ncclResult_t end = ncclGroupEnd();
  if (r != ncclSuccess) return nccl_fail(r, "all-to-all ncclSend/ncclRecv", why, why_size);
  if (end != ncclSuccess) return nccl_fail(end, "ncclGroupEnd", why, why_size);
  void *request = NULL;
  status = make_request(s, &request, why, why_size);
  if (status != ATTN_STATUS_OK) return status;
  nccl_request *req = request;
  status = wait_event(s, req->done, timeout_s, "an all-to-all", why, why_size);
  cudaEventDestroy(req->done);
  free(req);
  return status;
}

static int32_t t_set_stream(void *self, void *stream) {
  ((nccl_self *)self)->stream = (cudaStream_t)stream;
  return ATTN_STATUS_OK;
}

/* NCCL progresses on its own kernels. */
static const attn_transport_ops nccl_ops = STREAM_TRANSPORT_OPS("nccl");

NCCL_TRANSPORT_EXPORT const attn_transport_ops *attn_transport_nccl_entry(void);
const attn_transport_ops *attn_transport_nccl_entry(void) { return &nccl_ops; }
