/*
 * tests/dist_gpu/loopback.h - the loopback transport's communicator, shared by the test that makes
 * it and the module that runs it (transport_loopback.c, libattn_test_loopback.so; tests only,
 * never installed). n ranks are n threads of one process; a plan is given a pointer to its rank's
 * loopback_comm as the `comm` of attn_dist_plan_create, with transport
 * ATTN_DIST_TRANSPORT_TEST_LOOPBACK (src/dist/transport.h).
 */
#ifndef ATTN_TEST_LOOPBACK_H
#define ATTN_TEST_LOOPBACK_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define LOOPBACK_MAX_RANKS 16

/* What a rank publishes for its peers during one collective call. */
typedef struct loopback_slot {
  const void *send;
  void *recv;
  size_t bytes;
  void *ready; /* cudaEvent_t: the rank's receive buffer may be written after it */
  void *done;  /* cudaEvent_t: the rank's send has been copied after it */
  int32_t color, key;
  void *sub; /* split: the new group, published by its first member */
} loopback_slot;

/* One communicator: `size` threads meeting at barriers. */
typedef struct loopback_group {
  int size;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int arrived;
  unsigned long generation;
  int refs; /* transports using it; the last to go frees a group made by split */
  int owned_by_test;
  loopback_slot slot[LOOPBACK_MAX_RANKS];
} loopback_group;

typedef struct loopback_comm {
  loopback_group *group;
  int rank;
} loopback_comm;

/* The test's world of n ranks (static storage or its own allocation). */
static inline void loopback_group_init(loopback_group *g, int size) {
  g->size = size;
  pthread_mutex_init(&g->lock, NULL);
  pthread_cond_init(&g->cond, NULL);
  g->arrived = 0;
  g->generation = 0;
  g->refs = 0;
  g->owned_by_test = 1;
}

#endif /* ATTN_TEST_LOOPBACK_H */
