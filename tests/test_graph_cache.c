/*
 * tests/test_graph_cache.c - the bookkeeping of the cuDNN graph cache
 * (src/impl/cudnn/graph_cache.c) with fake graphs, so it runs on any machine: hits and misses by
 * key (keys differing in one word, or in length, are different), least-recently-used eviction at
 * the bound, an evicted value kept alive while a holder has it and freed exactly once at its last
 * release, capacity 0 (nothing shared), a shrinking bound, a racing duplicate insert, and 8 threads
 * hammering a small cache (every value is freed exactly once and never while held; checked by a
 * live flag in each fake).
 *
 * The GPU side (a second cuDNN plan of a shape is a hit and takes microseconds; an evicted graph
 * still runs for its plan) is in test_cudnn.c.
 */
#include "impl/cudnn/graph_cache.h"
#include "testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A fake graph: its key's first word, and whether it is still allocated. */
typedef struct fake_graph {
  int64_t id;
  int live;
} fake_graph;

static pthread_mutex_t freed_lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t freed_count;
static int freed_twice;

static void free_fake(void *value, void *arg) {
  (void)arg;
  fake_graph *g = value;
  pthread_mutex_lock(&freed_lock);
  if (!g->live) freed_twice = 1;
  g->live = 0; /* kept allocated (leaked on purpose until the end) so a double free is seen */
  freed_count++;
  pthread_mutex_unlock(&freed_lock);
}

static fake_graph pool[20000]; /* 8 threads x 2000 lookups at most, and test_basics */
static int npool;

static fake_graph *new_fake(int64_t id) {
  fake_graph *g = &pool[npool++];
  g->id = id;
  g->live = 1;
  return g;
}

static void make_key(int64_t key[8], int64_t id) {
  for (int i = 0; i < 8; ++i) key[i] = id * 1000 + i;
}

/* Looks id up and inserts a fresh fake on a miss: what a plan does. */
static gc_entry *get(gc_cache *c, int64_t id, int *was_hit) {
  int64_t key[8];
  make_key(key, id);
  gc_entry *e = gc_acquire(c, key, 8);
  *was_hit = e != NULL;
  if (e == NULL) e = gc_insert(c, key, 8, new_fake(id));
  return e;
}

static void test_basics(void) {
  gc_cache c;
  tu_check(gc_init(&c, 2, free_fake, NULL) == 0, "init");
  int hit;
  freed_count = 0;
  gc_entry *a = get(&c, 1, &hit);
  tu_check(!hit && a != NULL && ((fake_graph *)gc_value(a))->id == 1, "first lookup misses");
  gc_entry *a2 = get(&c, 1, &hit);
  tu_check(hit && a2 == a, "second lookup of the same key hits the same entry");
  gc_release(&c, a2);

  /* keys differing in one word, or only in length, are different */
  int64_t key[8];
  make_key(key, 1);
  key[7] ^= 1;
  tu_check(gc_acquire(&c, key, 8) == NULL, "a key differing in its last word misses");
  make_key(key, 1);
  tu_check(gc_acquire(&c, key, 7) == NULL, "a prefix of a key misses");
  tu_check(gc_acquire(&c, key, GC_MAX_KEY_WORDS + 1) == NULL, "an over-long key is refused");

  /* b, then c: the bound (2) pushes out the least recently used one, a, still held */
  gc_entry *b = get(&c, 2, &hit);
  gc_release(&c, b);
  gc_entry *cc = get(&c, 3, &hit);
  gc_release(&c, cc);
  gc_stats s = gc_get_stats(&c);
  tu_check(s.entries == 2 && s.evictions == 1 && s.detached == 1 && freed_count == 0,
           "the oldest entry is evicted but not freed while held (entries=%zu evictions=%llu "
           "detached=%zu freed=%lld)",
           s.entries, (unsigned long long)s.evictions, s.detached, (long long)freed_count);
  fake_graph *fa = gc_value(a);
  tu_check(fa->live && fa->id == 1, "an evicted value stays valid for its holder");
  make_key(key, 1);
  tu_check(gc_acquire(&c, key, 8) == NULL, "an evicted key misses");
  gc_release(&c, a);
  tu_check(freed_count == 1 && !fa->live, "the evicted value is freed at its last release");

  /* using b makes c the oldest: d evicts c, which nobody holds, so it is freed at once */
  gc_release(&c, get(&c, 2, &hit));
  tu_check(hit, "b still cached");
  gc_release(&c, get(&c, 4, &hit));
  gc_release(&c, get(&c, 2, &hit));
  tu_check(hit, "recently used b survives the insertion of d");
  gc_release(&c, get(&c, 3, &hit));
  tu_check(!hit, "least recently used c was evicted");
  tu_check(freed_count == 3, "unheld evicted values are freed at once (freed=%lld)",
           (long long)freed_count);

  /* shrinking the bound evicts at once; growing it again keeps nothing that was evicted */
  gc_set_capacity(&c, 0);
  s = gc_get_stats(&c);
  tu_check(s.entries == 0 && s.detached == 0 && freed_count == 5, "capacity 0 empties the index");
  gc_entry *e = get(&c, 5, &hit);
  tu_check(e != NULL && ((fake_graph *)gc_value(e))->live, "capacity 0: the inserter still gets "
                                                           "its value");
  gc_entry *e2 = get(&c, 5, &hit);
  tu_check(!hit && e2 != e, "capacity 0: nothing is shared");
  gc_release(&c, e);
  gc_release(&c, e2);
  s = gc_get_stats(&c);
  tu_check(freed_count == 7 && s.detached == 0 && s.frees == 7,
           "capacity 0: each value freed at its release (freed=%lld frees=%llu)",
           (long long)freed_count, (unsigned long long)s.frees);

  /* a racing duplicate: the second inserter gets the first one's entry, its own value freed */
  gc_set_capacity(&c, 4);
  make_key(key, 9);
  fake_graph *first = new_fake(9), *second = new_fake(9);
  gc_entry *x = gc_insert(&c, key, 8, first);
  gc_entry *y = gc_insert(&c, key, 8, second);
  tu_check(x == y && gc_value(y) == first && !second->live && first->live &&
               gc_get_stats(&c).races == 1,
           "a duplicate insert shares the first value, frees its own and is counted");
  gc_release(&c, x);
  gc_release(&c, y);
  s = gc_get_stats(&c);
  tu_check(s.entries == 1 && s.detached == 0, "the shared entry stays cached");
  gc_destroy(&c);
  tu_check(!first->live && !freed_twice, "destroy frees what is cached, nothing twice");
}

/* ---- threads --------------------------------------------------------------------------------- */

typedef struct worker {
  gc_cache *cache;
  tu_rng rng;
  int bad; /* a held value found freed, or with the wrong id */
} worker;

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;

static void *work(void *arg) {
  worker *w = arg;
  gc_entry *held[4] = {NULL};
  int64_t held_id[4] = {0};
  for (int i = 0; i < 2000; ++i) {
    int slot = (int)tu_int(&w->rng, 0, 3);
    if (held[slot] != NULL) {
      fake_graph *g = gc_value(held[slot]);
      if (!g->live || g->id != held_id[slot]) w->bad = 1;
      gc_release(w->cache, held[slot]);
      held[slot] = NULL;
    }
    int64_t id = tu_int(&w->rng, 0, 11), key[8];
    make_key(key, id);
    gc_entry *e = gc_acquire(w->cache, key, 8);
    if (e == NULL) {
      pthread_mutex_lock(&pool_lock);
      fake_graph *g = new_fake(id);
      pthread_mutex_unlock(&pool_lock);
      e = gc_insert(w->cache, key, 8, g);
    }
    held[slot] = e;
    held_id[slot] = id;
  }
  for (int slot = 0; slot < 4; ++slot) {
    if (held[slot] == NULL) continue;
    fake_graph *g = gc_value(held[slot]);
    if (!g->live || g->id != held_id[slot]) w->bad = 1;
    gc_release(w->cache, held[slot]);
  }
  return NULL;
}

static void test_threads(uint64_t seed) {
  gc_cache c;
  gc_init(&c, 4, free_fake, NULL);
  npool = 0;
  freed_count = 0;
  freed_twice = 0;
  enum { NTHREADS = 8 };
  pthread_t t[NTHREADS];
  worker w[NTHREADS];
  for (int i = 0; i < NTHREADS; ++i) {
    w[i].cache = &c;
    w[i].rng = tu_rng_make(seed + (uint64_t)i);
    w[i].bad = 0;
    pthread_create(&t[i], NULL, work, &w[i]);
  }
  int bad = 0;
  for (int i = 0; i < NTHREADS; ++i) {
    pthread_join(t[i], NULL);
    bad |= w[i].bad;
  }
  gc_stats s = gc_get_stats(&c);
  tu_check(!bad, "threads: no held value was ever freed or swapped");
  tu_check(s.entries <= 4 && s.detached == 0, "threads: the bound holds and nothing is left held");
  tu_check(s.hits + s.misses == (uint64_t)NTHREADS * 2000,
           "threads: every lookup counted (hits=%llu misses=%llu)", (unsigned long long)s.hits,
           (unsigned long long)s.misses);
  int64_t values = npool;
  gc_destroy(&c);
  tu_check(freed_count == values && !freed_twice,
           "threads: each of %lld values freed exactly once (freed=%lld)", (long long)values,
           (long long)freed_count);
}

int main(void) {
  uint64_t seed = tu_seed("test_graph_cache");
  test_basics();
  test_threads(seed);
  return tu_finish();
}
