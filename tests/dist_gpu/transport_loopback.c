/*
 * tests/dist_gpu/transport_loopback.c - a transport (src/dist/transport.h) for tests only: n ranks
 * are n threads of one process sharing one GPU, so the distributed GPU path runs on a machine of
 * one GPU, where NCCL refuses two ranks. Built as libattn_test_loopback.so and loaded through the
 * same module search as the real transports; never installed.
 *
 * What NCCL does on the device, this does with the CUDA runtime: shift is a cudaMemcpyAsync on the
 * sender's stream into the receiver's buffer, after the receiver's "ready" event (recorded on its
 * stream when it called shift, so its own earlier work on that buffer is done) and completing, for
 * the receiver, at the sender's "done" event; the request is an event on the caller's stream, as
 * in transport_nccl.c, so the library sees the same stream-ordered behaviour. The host meets its
 * peers at barriers (bounded by the timeout), which is what makes a rank's buffers known to the
 * others. allgather and allreduce_sum take host memory, alltoall device memory.
 */
#define _POSIX_C_SOURCE 200809L
#include "dist/transport_stream.h"
#include "loopback.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

typedef struct lb_self {
  loopback_group *g;
  int rank;
  cudaStream_t stream;
  cudaEvent_t ready, done;
} lb_self;

/* Bounds every meeting of the ranks (the transport table's host collectives take the plan's
 * timeout; shift takes none): a rank that failed alone makes its peers fail, not hang. */
static const double barrier_timeout_s = 60.0;

static int32_t cuda_fail(cudaError_t e, const char *what, char *why, size_t why_size) {
  snprintf(why, why_size, "%s failed: %s", what, cudaGetErrorString(e));
  return ATTN_STATUS_DEVICE_ERROR;
}

/* Every member of the group arrives before any leaves; IO_ERROR after the timeout. */
static int32_t barrier(lb_self *s, char *why, size_t why_size) {
  loopback_group *g = s->g;
  pthread_mutex_lock(&g->lock);
  const unsigned long gen = g->generation;
  if (++g->arrived == g->size) {
    g->arrived = 0;
    ++g->generation;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->lock);
    return ATTN_STATUS_OK;
  }
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += (time_t)barrier_timeout_s;
  int rc = 0;
  while (g->generation == gen && rc != ETIMEDOUT)
    rc = pthread_cond_timedwait(&g->cond, &g->lock, &until);
  const int ok = g->generation != gen;
  pthread_mutex_unlock(&g->lock);
  if (ok) return ATTN_STATUS_OK;
  snprintf(why, why_size, "loopback rank %d: a peer did not arrive within %.0f s", s->rank,
           barrier_timeout_s);
  return ATTN_STATUS_IO_ERROR;
}

static int32_t make_self(loopback_group *g, int rank, cudaStream_t stream, void **out, char *why,
                         size_t why_size) {
  lb_self *s = calloc(1, sizeof *s);
  if (s == NULL) {
    snprintf(why, why_size, "out of memory");
    return ATTN_STATUS_OUT_OF_MEMORY;
  }
  s->g = g, s->rank = rank, s->stream = stream;
  cudaError_t e = cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    free(s);
    return cuda_fail(e, "cudaEventCreate", why, why_size);
  }
  pthread_mutex_lock(&g->lock);
  ++g->refs;
  pthread_mutex_unlock(&g->lock);
  *out = s;
  return ATTN_STATUS_OK;
}

static int32_t t_create(void *comm, void **self, char *why, size_t why_size) {
  const loopback_comm *c = comm;
  *self = NULL;
  if (c->group == NULL || c->rank < 0 || c->rank >= c->group->size ||
      c->group->size > LOOPBACK_MAX_RANKS) {
    snprintf(why, why_size, "not a loopback communicator (rank %d)", c->rank);
    return ATTN_STATUS_INVALID_ARGUMENT;
  }
  return make_self(c->group, c->rank, NULL, self, why, why_size);
}

static void t_destroy(void *self) {
  lb_self *s = self;
  if (s == NULL) return;
  cudaEventDestroy(s->ready);
  cudaEventDestroy(s->done);
  loopback_group *g = s->g;
  pthread_mutex_lock(&g->lock);
  const int last = --g->refs == 0 && !g->owned_by_test;
  pthread_mutex_unlock(&g->lock);
  if (last) {
    pthread_mutex_destroy(&g->lock);
    pthread_cond_destroy(&g->cond);
    free(g);
  }
  free(s);
}

static int32_t t_rank(void *self) { return ((lb_self *)self)->rank; }
static int32_t t_size(void *self) { return ((lb_self *)self)->g->size; }

static int32_t t_split(void *self, int32_t color, int32_t key, void **sub, char *why,
                       size_t why_size) {
  lb_self *s = self;
  loopback_group *g = s->g;
  *sub = NULL;
  g->slot[s->rank].color = color, g->slot[s->rank].key = key, g->slot[s->rank].sub = NULL;
  int32_t status = barrier(s, why, why_size);
  if (status != ATTN_STATUS_OK) return status;
  /* My place among the members of my color, ordered by (key, rank); the first member makes the
   * group and publishes it. */
  int place = 0, count = 0, first = -1;
  for (int r = 0; r < g->size; ++r) {
    if (g->slot[r].color != color) continue;
    if (first < 0) first = r;
    ++count;
    if (g->slot[r].key < key || (g->slot[r].key == key && r < s->rank)) ++place;
  }
  if (first == s->rank) {
    loopback_group *made = calloc(1, sizeof *made);
    if (made != NULL) {
      loopback_group_init(made, count);
      made->owned_by_test = 0;
    }
    g->slot[s->rank].sub = made;
  }
  status = barrier(s, why, why_size);
  if (status != ATTN_STATUS_OK) return status;
  loopback_group *made = g->slot[first].sub;
  /* The slots are read; a third meeting lets them be reused. */
  status = barrier(s, why, why_size);
  if (status != ATTN_STATUS_OK) return status;
  if (made == NULL) {
    snprintf(why, why_size, "out of memory splitting a loopback communicator");
    return ATTN_STATUS_OUT_OF_MEMORY;
  }
  return make_self(made, place, s->stream, sub, why, why_size);
}

static int32_t t_isend(void *self, const void *buf, size_t bytes, int32_t peer, int32_t tag,
                       void **request, char *why, size_t why_size) {
  (void)self, (void)buf, (void)bytes, (void)peer, (void)tag;
  *request = NULL;
  snprintf(why, why_size, "the loopback transport moves data with shift only");
  return ATTN_STATUS_UNSUPPORTED;
}

static int32_t t_irecv(void *self, void *buf, size_t bytes, int32_t peer, int32_t tag,
                       void **request, char *why, size_t why_size) {
  return t_isend(self, buf, bytes, peer, tag, request, why, why_size);
}

/* The request: an event after what was enqueued on the caller's stream (as NCCL's). */
static int32_t make_request(lb_self *s, void **request, char *why, size_t why_size) {
  cudaEvent_t ev;
  cudaError_t e = stream_transport_mark(s->stream, &ev);
  if (e != cudaSuccess) return cuda_fail(e, "cudaEventRecord", why, why_size);
  *request = (void *)ev;
  return ATTN_STATUS_OK;
}

static int32_t t_shift(void *self, const void *send_buf, int32_t to, void *recv_buf, int32_t from,
                       size_t bytes, int32_t tag, void **request, char *why, size_t why_size) {
  lb_self *s = self;
  loopback_group *g = s->g;
  (void)tag;
  *request = NULL;
  loopback_slot *mine = &g->slot[s->rank];
  cudaError_t e = cudaEventRecord(s->ready, s->stream);
  mine->recv = recv_buf, mine->bytes = bytes, mine->ready = (void *)s->ready;
  /* Every rank meets its peers even after a local failure, so none waits for it in vain. */
  int32_t status = barrier(s, why, why_size);
  if (status != ATTN_STATUS_OK) return status;
  const loopback_slot *dest = &g->slot[to];
  const int sizes_agree = dest->bytes == bytes;
  if (e == cudaSuccess && sizes_agree)
    e = cudaStreamWaitEvent(s->stream, (cudaEvent_t)dest->ready, 0);
  if (e == cudaSuccess && sizes_agree)
    e = cudaMemcpyAsync(dest->recv, send_buf, bytes, cudaMemcpyDeviceToDevice, s->stream);
  if (e == cudaSuccess) e = cudaEventRecord(s->done, s->stream);
  mine->done = (void *)s->done;
  status = barrier(s, why, why_size);
  if (status != ATTN_STATUS_OK) return status;
  if (e == cudaSuccess) e = cudaStreamWaitEvent(s->stream, (cudaEvent_t)g->slot[from].done, 0);
  /* A third meeting: no rank leaves (and may destroy or re-record its events) before every rank
   * has made its stream wait on them. Without it the last rank of a ring could wait on an event
   * its peer had already destroyed ("context is destroyed", seen once on an H100). */
  status = barrier(s, why, why_size);
  if (status != ATTN_STATUS_OK) return status;
  if (e != cudaSuccess) return cuda_fail(e, "a loopback shift", why, why_size);
  if (!sizes_agree) {
    snprintf(why, why_size, "loopback rank %d sends %zu bytes, rank %d receives %zu", s->rank,
             bytes, (int)to, dest->bytes);
    return ATTN_STATUS_INVALID_ARGUMENT;
  }
  return make_request(s, request, why, why_size);
}

static int32_t t_wait(void *self, void *request, double timeout_s, char *why, size_t why_size) {
  (void)self;
  if (request == NULL) return ATTN_STATUS_OK;
  cudaEvent_t ev = (cudaEvent_t)request;
  cudaError_t e = cudaSuccess;
  int32_t status = ATTN_STATUS_OK;
  switch (stream_transport_poll(ev, timeout_s, NULL, NULL, &e)) {
  case STREAM_TRANSPORT_DONE:
  case STREAM_TRANSPORT_PEER_ERROR: /* no peer check here */ break;
  case STREAM_TRANSPORT_CUDA_ERROR:
    status = cuda_fail(e, "a loopback transfer", why, why_size);
    break;
  case STREAM_TRANSPORT_TIMED_OUT:
    snprintf(why, why_size, "a loopback transfer did not complete within %.0f s", timeout_s);
    status = ATTN_STATUS_IO_ERROR;
    break;
  }
  cudaEventDestroy(ev);
  return status;
}

static int32_t t_allgather(void *self, const void *send, void *recv, size_t bytes, double timeout_s,
                           char *why, size_t why_size) {
  lb_self *s = self;
  (void)timeout_s;
  s->g->slot[s->rank].send = send;
  int32_t status = barrier(s, why, why_size);
  if (status != ATTN_STATUS_OK) return status;
  for (int r = 0; r < s->g->size; ++r)
    memcpy((char *)recv + (size_t)r * bytes, s->g->slot[r].send, bytes);
  return barrier(s, why, why_size);
}

static int32_t t_alltoall(void *self, const void *send, void *recv, size_t bytes, double timeout_s,
                          char *why, size_t why_size) {
  lb_self *s = self;
  (void)timeout_s;
  s->g->slot[s->rank].recv = recv;
  cudaError_t e = cudaStreamSynchronize(s->stream); /* send is complete */
  int32_t status = barrier(s, why, why_size);
  if (status != ATTN_STATUS_OK) return status;
  for (int j = 0; j < s->g->size && e == cudaSuccess; ++j)
    e = cudaMemcpyAsync((char *)s->g->slot[j].recv + (size_t)s->rank * bytes,
                        (const char *)send + (size_t)j * bytes, bytes, cudaMemcpyDeviceToDevice,
                        s->stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s->stream);
  status = barrier(s, why, why_size);
  if (status != ATTN_STATUS_OK) return status;
  return e == cudaSuccess ? ATTN_STATUS_OK : cuda_fail(e, "a loopback alltoall", why, why_size);
}

static int32_t t_allreduce_sum(void *self, void *buf, size_t count, int32_t type, double timeout_s,
                               char *why, size_t why_size) {
  lb_self *s = self;
  (void)timeout_s;
  double *sum = calloc(count + 1, sizeof *sum);
  s->g->slot[s->rank].send = buf;
  int32_t status = barrier(s, why, why_size);
  if (status != ATTN_STATUS_OK) {
    free(sum);
    return status;
  }
  for (int r = 0; r < s->g->size && sum != NULL; ++r)
    for (size_t i = 0; i < count; ++i)
      sum[i] += type == ATTN_TRANSPORT_F64 ? ((const double *)s->g->slot[r].send)[i]
                                           : (double)((const float *)s->g->slot[r].send)[i];
  status = barrier(s, why, why_size); /* every rank has read every buffer */
  if (status == ATTN_STATUS_OK && sum == NULL) {
    snprintf(why, why_size, "out of memory");
    status = ATTN_STATUS_OUT_OF_MEMORY;
  }
  for (size_t i = 0; status == ATTN_STATUS_OK && i < count; ++i) {
    if (type == ATTN_TRANSPORT_F64)
      ((double *)buf)[i] = sum[i];
    else
      ((float *)buf)[i] = (float)sum[i];
  }
  free(sum);
  return status;
}

static int32_t t_set_stream(void *self, void *stream) {
  ((lb_self *)self)->stream = (cudaStream_t)stream;
  return ATTN_STATUS_OK;
}

static const attn_transport_ops loopback_ops = STREAM_TRANSPORT_OPS("loopback");

EXPORT const attn_transport_ops *attn_transport_loopback_entry(void);
const attn_transport_ops *attn_transport_loopback_entry(void) { return &loopback_ops; }
