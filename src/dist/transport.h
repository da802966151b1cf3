/*
 * src/dist/transport.h - the one small interface the distributed algorithms talk through.
 *
 * Each algorithm (src/dist/ring.c, ...) is written once against this table; a transport (MPI for
 * CPU tensors in transport_mpi.c, NCCL for CUDA tensors) fills it. A transport lives in a run-time
 * module linked against its communication library, so libattn itself never needs libmpi or
 * libnccl: src/dist/transports.c (the one registration point) loads the module and calls its entry
 * function, which returns the table. The module includes only this header and attn.h.
 *
 * Conventions: functions return an attn_status (as int32_t); a failure writes a message into
 * why[why_size]. Point-to-point transfers, shift and alltoall move memory on the tensors' device;
 * allgather and allreduce_sum take host memory (small: the plan's agreement check, dsinks, dbias). Every wait is bounded by a timeout in seconds, so a peer that died or went to a
 * different call gives IO_ERROR, never a hang. Point-to-point calls are nonblocking and complete in
 * wait(); requests are opaque handles made by isend/irecv and released by wait (also on failure).
 */
#ifndef ATTN_DIST_TRANSPORT_H
#define ATTN_DIST_TRANSPORT_H

#include "attn.h"

#include <stddef.h>
#include <stdint.h>

/* Bumped whenever the table below changes; the loader refuses a module of another version. */
#define ATTN_TRANSPORT_ABI 1

/* A transport for the project's tests only (tests/dist_gpu/transport_loopback.c,
 * libattn_test_loopback.so, never installed): the ranks are threads of one process sharing a GPU,
 * so the GPU path of the distributed layer runs on a machine of one GPU. Not in the public enum. */
#define ATTN_DIST_TRANSPORT_TEST_LOOPBACK 1000

/* Element types of allreduce. */
typedef enum attn_transport_type {
  ATTN_TRANSPORT_F32 = 0,
  ATTN_TRANSPORT_F64 = 1,
} attn_transport_type;

typedef struct attn_transport_ops {
  int32_t abi;      /* ATTN_TRANSPORT_ABI */
  const char *name; /* "mpi", "nccl" */
  /* Makes the transport's communicator from the caller's (comm points to an MPI_Comm or an
   * ncclComm_t; borrowed). Collective over the caller's communicator. */
  int32_t (*create)(void *comm, void **self, char *why, size_t why_size);
  /* Frees it; collective for transports whose communicator needs it. NULL is harmless. */
  void (*destroy)(void *self);
  int32_t (*rank)(void *self);
  int32_t (*size)(void *self);
  /* A communicator of the ranks that give the same color, ordered by key (MPI_Comm_split).
   * Collective. */
  int32_t (*split)(void *self, int32_t color, int32_t key, void **sub, char *why, size_t why_size);
  /* Nonblocking point-to-point transfer of `bytes` bytes with a peer (a rank of self). The buffer
   * must stay untouched until wait() returns. */
  int32_t (*isend)(void *self, const void *buf, size_t bytes, int32_t peer, int32_t tag,
                   void **request, char *why, size_t why_size);
  int32_t (*irecv)(void *self, void *buf, size_t bytes, int32_t peer, int32_t tag, void **request,
                   char *why, size_t why_size);
  /* Optional (NULL: the algorithms post irecv then isend): sends send_buf to rank `to` while
   * receiving recv_buf from rank `from`, as one operation, with one request. NCCL needs it: its
   * point-to-point operations must be grouped to make a ring without deadlock. */
  int32_t (*shift)(void *self, const void *send_buf, int32_t to, void *recv_buf, int32_t from,
                   size_t bytes, int32_t tag, void **request, char *why, size_t why_size);
  /* Optional (NULL: nothing to do): lets the library move a request along without waiting, for
   * MPI builds whose large transfers progress only inside MPI calls. The request stays valid. */
  void (*progress)(void *self, void *request);
  /* Completes and releases a request; IO_ERROR after timeout_s seconds without completion. */
  int32_t (*wait)(void *self, void *request, double timeout_s, char *why, size_t why_size);
  /* Every rank's `bytes` bytes of send, concatenated in rank order into recv. Collective. */
  int32_t (*allgather)(void *self, const void *send, void *recv, size_t bytes, double timeout_s,
                       char *why, size_t why_size);
  /* Block j of send (`bytes` bytes at send + j * bytes) goes to rank j; block i of recv comes
   * from rank i (MPI_Alltoall). Collective. */
  int32_t (*alltoall)(void *self, const void *send, void *recv, size_t bytes, double timeout_s,
                      char *why, size_t why_size);
  /* Element-wise sum over the ranks, in place. Collective. */
  int32_t (*allreduce_sum)(void *self, void *buf, size_t count, int32_t type, double timeout_s,
                           char *why, size_t why_size);
  /* Sets the stream GPU transfers are ordered on (NCCL); NULL where it does not apply. */
  int32_t (*set_stream)(void *self, void *stream);
} attn_transport_ops;

/* The entry function each transport module exports, by this name: "attn_transport_<name>_entry". */
typedef const attn_transport_ops *(*attn_transport_entry_fn)(void);

#endif /* ATTN_DIST_TRANSPORT_H */
