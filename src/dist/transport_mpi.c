/*
 * src/dist/transport_mpi.c - the MPI transport (src/dist/transport.h), built as the run-time
 * module libattn_mpi.so, which links libmpi; libattn loads it when a plan asks for MPI.
 *
 * The plan's communicator is a duplicate of the caller's (MPI_Comm_dup), so the plan's tags never
 * match the caller's messages, with MPI_ERRORS_RETURN so a failed peer gives an error code rather
 * than MPI's default abort of the job. Waits poll MPI_Test (which also drives MPI's progress) and
 * give up after the timeout: MPI itself has no bounded wait.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep */
#include "dist/transport.h"

#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(__GNUC__)
#define MPI_TRANSPORT_EXPORT __attribute__((visibility("default")))
#else
#define MPI_TRANSPORT_EXPORT
#endif

typedef struct mpi_self {
  MPI_Comm comm; /* the plan's own duplicate (or a split of it) */
  int rank, size;
} mpi_self;

static double now_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* MPI's text for an error code, after what failed. */
static int32_t mpi_fail(int code, const char *what, char *why, size_t why_size) {
  char text[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS)
    snprintf(text, sizeof text, "code %d", code);
  snprintf(why, why_size, "%s failed: %s", what, text);
  return ATTN_STATUS_IO_ERROR;
}

/* Polls one request until it completes or timeout_s passes. MPI_Test is what moves a large
 * transfer (shared-memory rendezvous protocols copy a piece per call), so the loop never sleeps:
 * a 20 us sleep between polls (which the kernel rounds up to 60-80 us) made a 23 MB ring step
 * take ~150 ms instead of 5 on a 16-core host. After a short spin it yields instead, which costs
 * nothing on a core of its own and leaves the core to the ranks that share it (oversubscribed
 * runs). */
static int32_t wait_request(MPI_Request *request, double timeout_s, const char *what, char *why,
                            size_t why_size) {
  const double start = now_seconds();
  for (long polls = 0;; ++polls) {
    int done = 0;
    int code = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (code != MPI_SUCCESS) return mpi_fail(code, what, why, why_size);
    if (done) return ATTN_STATUS_OK;
    if (polls > 1000) {
      if (now_seconds() - start > timeout_s) {
        snprintf(why, why_size,
                 "%s did not complete within %.0f s (a peer failed or is not in "
                 "the same call)",
                 what, timeout_s);
        return ATTN_STATUS_IO_ERROR;
      }
      sched_yield();
    }
  }
}

static int32_t mpi_create(void *comm, void **self, char *why, size_t why_size) {
  *self = NULL;
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    snprintf(why, why_size, "MPI is not initialised: call MPI_Init before making the plan");
    return ATTN_STATUS_INVALID_ARGUMENT;
  }
  mpi_self *s = calloc(1, sizeof *s);
  if (s == NULL) {
    snprintf(why, why_size, "out of memory");
    return ATTN_STATUS_OUT_OF_MEMORY;
  }
  int code = MPI_Comm_dup(*(MPI_Comm *)comm, &s->comm);
  if (code != MPI_SUCCESS) {
    free(s);
    return mpi_fail(code, "MPI_Comm_dup", why, why_size);
  }
  MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(s->comm, &s->rank);
  MPI_Comm_size(s->comm, &s->size);
  *self = s;
  return ATTN_STATUS_OK;
}

static void mpi_destroy(void *self) {
  mpi_self *s = self;
  if (s == NULL) return;
  MPI_Comm_free(&s->comm);
  free(s);
}

static int32_t mpi_rank(void *self) { return ((mpi_self *)self)->rank; }
static int32_t mpi_size(void *self) { return ((mpi_self *)self)->size; }

static int32_t mpi_split(void *self, int32_t color, int32_t key, void **sub, char *why,
                         size_t why_size) {
  mpi_self *s = self;
  *sub = NULL;
  mpi_self *t = calloc(1, sizeof *t);
  if (t == NULL) {
    snprintf(why, why_size, "out of memory");
    return ATTN_STATUS_OUT_OF_MEMORY;
  }
  int code = MPI_Comm_split(s->comm, color, key, &t->comm);
  if (code != MPI_SUCCESS) {
    free(t);
    return mpi_fail(code, "MPI_Comm_split", why, why_size);
  }
  MPI_Comm_set_errhandler(t->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(t->comm, &t->rank);
  MPI_Comm_size(t->comm, &t->size);
  *sub = t;
  return ATTN_STATUS_OK;
}

/* Messages larger than INT_MAX bytes go as MPI_DOUBLE-sized or larger units: the ring's blocks
 * are always whole elements of 4 or 8 bytes, but a count of bytes may pass 2^31 on long sequences. */
static int32_t count_of(size_t bytes, MPI_Datatype *type, int *count, char *why, size_t why_size) {
  if (bytes <= (size_t)0x7fffffff) {
    *type = MPI_BYTE, *count = (int)bytes;
  } else if (bytes % 8 == 0 && bytes / 8 <= (size_t)0x7fffffff) {
    *type = MPI_DOUBLE, *count = (int)(bytes / 8);
  } else {
    snprintf(why, why_size, "a message of %zu bytes is too large for one MPI call", bytes);
    return ATTN_STATUS_UNSUPPORTED;
  }
  return ATTN_STATUS_OK;
}

/* Posts one nonblocking send (recv = 0; buf is only read) or receive; *request is the handle that
 * mpi_wait frees. */
static int32_t post(void *self, void *buf, size_t bytes, int32_t peer, int32_t tag, int recv,
                    void **request, char *why, size_t why_size) {
  mpi_self *s = self;
  MPI_Datatype type;
  int count;
  *request = NULL;
  int32_t status = count_of(bytes, &type, &count, why, why_size);
  if (status != ATTN_STATUS_OK) return status;
  MPI_Request *r = malloc(sizeof *r);
  if (r == NULL) return ATTN_STATUS_OUT_OF_MEMORY;
  int code = recv ? MPI_Irecv(buf, count, type, peer, tag, s->comm, r)
                  : MPI_Isend(buf, count, type, peer, tag, s->comm, r);
  if (code != MPI_SUCCESS) {
    free(r);
    return mpi_fail(code, recv ? "MPI_Irecv" : "MPI_Isend", why, why_size);
  }
  *request = r;
  return ATTN_STATUS_OK;
}

static int32_t mpi_isend(void *self, const void *buf, size_t bytes, int32_t peer, int32_t tag,
                         void **request, char *why, size_t why_size) {
  return post(self, (void *)buf, bytes, peer, tag, 0, request, why, why_size);
}

static int32_t mpi_irecv(void *self, void *buf, size_t bytes, int32_t peer, int32_t tag,
                         void **request, char *why, size_t why_size) {
  return post(self, buf, bytes, peer, tag, 1, request, why, why_size);
}

static void mpi_progress(void *self, void *request) {
  (void)self;
  if (request == NULL) return;
  int done = 0;
  /* A completed request becomes MPI_REQUEST_NULL, which the later wait sees as complete. */
  MPI_Test((MPI_Request *)request, &done, MPI_STATUS_IGNORE);
}

static int32_t mpi_wait(void *self, void *request, double timeout_s, char *why, size_t why_size) {
  (void)self;
  if (request == NULL) return ATTN_STATUS_OK;
  MPI_Request *r = request;
  int32_t status = wait_request(r, timeout_s, "a point-to-point transfer", why, why_size);
  /* A request that timed out stays with MPI (it may still complete); only our handle goes. */
  free(r);
  return status;
}

/* One nonblocking collective of `bytes` from each rank (an all-to-all sends `bytes` to each),
 * waited for at most timeout_s. */
static int32_t collective(void *self, const void *send, void *recv, size_t bytes, int alltoall,
                          double timeout_s, char *why, size_t why_size) {
  mpi_self *s = self;
  MPI_Datatype type;
  int count;
  int32_t status = count_of(bytes, &type, &count, why, why_size);
  if (status != ATTN_STATUS_OK) return status;
  MPI_Request r;
  int code = alltoall ? MPI_Ialltoall(send, count, type, recv, count, type, s->comm, &r)
                      : MPI_Iallgather(send, count, type, recv, count, type, s->comm, &r);
  if (code != MPI_SUCCESS)
    return mpi_fail(code, alltoall ? "MPI_Ialltoall" : "MPI_Iallgather", why, why_size);
  return wait_request(&r, timeout_s, alltoall ? "an all-to-all" : "an allgather", why, why_size);
}

static int32_t mpi_allgather(void *self, const void *send, void *recv, size_t bytes,
                             double timeout_s, char *why, size_t why_size) {
  return collective(self, send, recv, bytes, 0, timeout_s, why, why_size);
}

static int32_t mpi_alltoall(void *self, const void *send, void *recv, size_t bytes,
                            double timeout_s, char *why, size_t why_size) {
  return collective(self, send, recv, bytes, 1, timeout_s, why, why_size);
}

static int32_t mpi_allreduce_sum(void *self, void *buf, size_t count, int32_t type,
                                 double timeout_s, char *why, size_t why_size) {
  mpi_self *s = self;
  if (count > (size_t)0x7fffffff) {
    snprintf(why, why_size, "an allreduce of %zu elements is too large for one MPI call", count);
    return ATTN_STATUS_UNSUPPORTED;
  }
  MPI_Request r;
  int code =
      MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count,
                     type == ATTN_TRANSPORT_F64 ? MPI_DOUBLE : MPI_FLOAT, MPI_SUM, s->comm, &r);
  if (code != MPI_SUCCESS) return mpi_fail(code, "MPI_Iallreduce", why, why_size);
  return wait_request(&r, timeout_s, "an allreduce", why, why_size);
}

static const attn_transport_ops mpi_ops = {
    .abi = ATTN_TRANSPORT_ABI,
    .name = "mpi",
    .create = mpi_create,
    .destroy = mpi_destroy,
    .rank = mpi_rank,
    .size = mpi_size,
    .split = mpi_split,
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .shift = NULL, /* MPI pairs an Irecv and an Isend without deadlock */
    .progress = mpi_progress,
    .wait = mpi_wait,
    .allgather = mpi_allgather,
    .alltoall = mpi_alltoall,
    .allreduce_sum = mpi_allreduce_sum,
    .set_stream = NULL,
};

MPI_TRANSPORT_EXPORT const attn_transport_ops *attn_transport_mpi_entry(void);
const attn_transport_ops *attn_transport_mpi_entry(void) { return &mpi_ops; }
