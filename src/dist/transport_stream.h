/*
 * src/dist/transport_stream.h - what the stream-ordered transports share: the NCCL module
 * (transport_nccl.c) and the tests' loopback module (tests/dist_gpu/transport_loopback.c), which
 * stands in for it on a machine of one GPU and must behave the same towards the library. Both
 * enqueue their transfers on the plan's stream, make a request of an event recorded after them,
 * and complete it by polling that event against the clock; both fill the same table.
 * Header-only (static functions), so each module stays one translation unit linking only its own
 * libraries; it needs the CUDA runtime's header, never libattn's internals.
 */
#ifndef ATTN_DIST_TRANSPORT_STREAM_H
#define ATTN_DIST_TRANSPORT_STREAM_H

#include "dist/transport.h"

#include <cuda_runtime_api.h>
#include <time.h>

static inline double stream_transport_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* An event recorded on the stream after what it holds so far: the request of those operations.
 * On failure no event is left behind. */
static inline cudaError_t stream_transport_mark(cudaStream_t stream, cudaEvent_t *event) {
  cudaError_t e = cudaEventCreateWithFlags(event, cudaEventDisableTiming);
  if (e != cudaSuccess) return e;
  e = cudaEventRecord(*event, stream);
  if (e != cudaSuccess) cudaEventDestroy(*event);
  return e;
}

typedef enum stream_transport_poll_result {
  STREAM_TRANSPORT_DONE = 0,
  STREAM_TRANSPORT_CUDA_ERROR, /* the event's query failed: *error says how */
  STREAM_TRANSPORT_PEER_ERROR, /* `failed` said so (NCCL's asynchronous error) */
  STREAM_TRANSPORT_TIMED_OUT,
} stream_transport_poll_result;

/* Polls the event until it completes, `failed(arg)` (NULL: never) reports a failure, or
 * timeout_s seconds pass. The first thousand polls spin (a short transfer completes without a
 * sleep or a clock read); then each poll sleeps 20 us, so a long wait costs no core. */
static inline stream_transport_poll_result stream_transport_poll(cudaEvent_t event,
                                                                 double timeout_s,
                                                                 int (*failed)(void *arg),
                                                                 void *arg, cudaError_t *error) {
  const double start = stream_transport_now();
  for (long polls = 0;; ++polls) {
    const cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return STREAM_TRANSPORT_DONE;
    if (e != cudaErrorNotReady) {
      *error = e;
      return STREAM_TRANSPORT_CUDA_ERROR;
    }
    if (failed != NULL && failed(arg)) return STREAM_TRANSPORT_PEER_ERROR;
    if (polls > 1000) {
      if (stream_transport_now() - start > timeout_s) return STREAM_TRANSPORT_TIMED_OUT;
      const struct timespec pause = {0, 20000};
      nanosleep(&pause, NULL);
    }
  }
}

/* The table of a stream-ordered transport, from the module's functions named t_<entry>: every
 * entry of attn_transport_ops, data moved by shift (isend and irecv for lone transfers) and
 * nothing to progress by hand (the GPU moves the data on its own). */
#define STREAM_TRANSPORT_OPS(NAME)                                                                 \
  {                                                                                                \
    .abi = ATTN_TRANSPORT_ABI, .name = NAME, .create = t_create, .destroy = t_destroy,             \
    .rank = t_rank, .size = t_size, .split = t_split, .isend = t_isend, .irecv = t_irecv,          \
    .shift = t_shift, .progress = NULL, .wait = t_wait, .allgather = t_allgather,                  \
    .alltoall = t_alltoall, .allreduce_sum = t_allreduce_sum, .set_stream = t_set_stream,          \
  }

#endif /* ATTN_DIST_TRANSPORT_STREAM_H */
