/*
 * src/impl/cudnn/graph_cache.h - a bounded, thread-safe cache of built objects shared by plans,
 * with reference counts: the bookkeeping of the cuDNN graph cache (cudnn.c), kept free of cuDNN
 * and CUDA types so that it is tested on any machine with fake values (tests/test_graph_cache.c).
 *
 * Keys are arrays of int64 words compared word for word (the caller serialises everything the value
 * depends on, so no padding byte ever takes part). A lookup that hits takes a reference; each
 * reference is given back with gc_release. At most `capacity` entries stay in the index, least
 * recently used first out; an entry pushed out while plans still hold it leaves the index at once
 * but its value is freed only when the last reference is given back, so a live plan never sees its
 * graph disappear. Capacity 0 keeps nothing: every value lives exactly as long as its holders.
 */
#ifndef ATTN_IMPL_CUDNN_GRAPH_CACHE_H
#define ATTN_IMPL_CUDNN_GRAPH_CACHE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* Longest key, in int64 words. */
#define GC_MAX_KEY_WORDS 128

typedef struct gc_entry gc_entry;

/* Frees a value once it is out of the index and unreferenced. Called without the cache's lock. */
typedef void (*gc_free_fn)(void *value, void *arg);

typedef struct gc_stats {
  uint64_t hits, misses; /* lookups (gc_acquire) that found / did not find their key */
  uint64_t inserts;      /* values added */
  uint64_t races;        /* inserts that found their key added by another thread meanwhile */
  uint64_t evictions;    /* entries pushed out of the index by the bound */
  uint64_t frees;        /* values freed */
  size_t entries;        /* entries in the index now */
  size_t detached;       /* entries out of the index but still referenced */
  size_t capacity;
} gc_stats;

typedef struct gc_cache {
  pthread_mutex_t lock;
  gc_entry *newest, *oldest; /* the index, in order of use */
  size_t capacity;
  gc_free_fn free_value;
  void *free_arg;
  gc_stats stats;
} gc_cache;

/* Prepares an empty cache. Nonzero when the mutex cannot be made. */
int gc_init(gc_cache *c, size_t capacity, gc_free_fn free_value, void *free_arg);
/* Frees every entry of the index that nobody holds and the mutex; entries still held are left to
 * their holders' gc_release, which must then not be called (tests only: the process-wide cache of
 * cudnn.c lives as long as the process). */
void gc_destroy(gc_cache *c);

/* The entry of key, with a reference taken, or NULL (a miss). */
gc_entry *gc_acquire(gc_cache *c, const int64_t *key, int nwords);
/* Adds value under key and returns its entry with a reference taken. If another thread added the
 * key first, value is freed (free_value) and that entry is returned instead. NULL, with value
 * untouched and still the caller's, when out of memory or when nwords is out of range. */
gc_entry *gc_insert(gc_cache *c, const int64_t *key, int nwords, void *value);
void *gc_value(const gc_entry *e);
/* Gives back a reference; NULL is ignored. */
void gc_release(gc_cache *c, gc_entry *e);

/* Changes the bound, evicting at once what no longer fits. */
void gc_set_capacity(gc_cache *c, size_t capacity);
gc_stats gc_get_stats(gc_cache *c);

#endif /* ATTN_IMPL_CUDNN_GRAPH_CACHE_H */
