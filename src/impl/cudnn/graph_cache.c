/*
 * src/impl/cudnn/graph_cache.c - the bounded, reference-counted cache of graph_cache.h.
 *
 * The index is a doubly linked list in order of use, searched linearly: it holds tens of entries
 * and a lookup compares a hash before the key, so a hit costs well under a microsecond next to the
 * ~100 ms of the cuDNN build it saves. Values are freed outside the lock (freeing a cuDNN plan is
 * not instant and must not hold up other plans' lookups).
 */
#include "impl/cudnn/graph_cache.h"

#include <stdlib.h>
#include <string.h>

struct gc_entry {
  gc_entry *newer, *older; /* neighbours in the index (NULL out of it) */
  uint64_t hash;
  int nwords;
  int in_index;
  size_t refs;
  void *value;
  int64_t key[GC_MAX_KEY_WORDS];
};

/* FNV-1a over the key's words. */
static uint64_t key_hash(const int64_t *key, int nwords) {
  uint64_t h = 1469598103934665603u;
  for (int i = 0; i < nwords; ++i) {
    uint64_t w = (uint64_t)key[i];
    for (int b = 0; b < 8; ++b, w >>= 8) h = (h ^ (w & 0xff)) * 1099511628211u;
  }
  return h;
}

int gc_init(gc_cache *c, size_t capacity, gc_free_fn free_value, void *free_arg) {
  memset(c, 0, sizeof *c);
  c->capacity = capacity;
  c->stats.capacity = capacity;
  c->free_value = free_value;
  c->free_arg = free_arg;
  return pthread_mutex_init(&c->lock, NULL);
}

static void unlink_entry(gc_cache *c, gc_entry *e) {
  if (e->newer != NULL)
    e->newer->older = e->older;
  else
    c->newest = e->older;
  if (e->older != NULL)
    e->older->newer = e->newer;
  else
    c->oldest = e->newer;
  e->newer = e->older = NULL;
}

static void push_newest(gc_cache *c, gc_entry *e) {
  e->older = c->newest;
  e->newer = NULL;
  if (c->newest != NULL) c->newest->newer = e;
  c->newest = e;
  if (c->oldest == NULL) c->oldest = e;
}

/* Pushes the oldest entries out of the index until it fits the bound. Entries nobody holds are
 * chained through `older` onto *to_free for the caller to free after unlocking. */
static void evict_over_capacity(gc_cache *c, gc_entry **to_free) {
  while (c->stats.entries > c->capacity && c->oldest != NULL) {
    gc_entry *e = c->oldest;
    unlink_entry(c, e);
    e->in_index = 0;
    c->stats.entries--;
    c->stats.evictions++;
    if (e->refs == 0) {
      e->older = *to_free;
      *to_free = e;
      c->stats.frees++;
    } else {
      c->stats.detached++;
    }
  }
}

static void free_chain(gc_cache *c, gc_entry *e) {
  while (e != NULL) {
    gc_entry *next = e->older;
    if (c->free_value != NULL) c->free_value(e->value, c->free_arg);
    free(e);
    e = next;
  }
}

static gc_entry *find(gc_cache *c, const int64_t *key, int nwords, uint64_t hash) {
  for (gc_entry *e = c->newest; e != NULL; e = e->older)
    if (e->hash == hash && e->nwords == nwords &&
        memcmp(e->key, key, (size_t)nwords * sizeof key[0]) == 0)
      return e;
  return NULL;
}

gc_entry *gc_acquire(gc_cache *c, const int64_t *key, int nwords) {
  if (nwords < 0 || nwords > GC_MAX_KEY_WORDS) return NULL;
  uint64_t hash = key_hash(key, nwords);
  pthread_mutex_lock(&c->lock);
  gc_entry *e = find(c, key, nwords, hash);
  if (e != NULL) {
    e->refs++;
    unlink_entry(c, e);
    push_newest(c, e);
    c->stats.hits++;
  } else {
    c->stats.misses++;
  }
  pthread_mutex_unlock(&c->lock);
  return e;
}

gc_entry *gc_insert(gc_cache *c, const int64_t *key, int nwords, void *value) {
  if (nwords < 0 || nwords > GC_MAX_KEY_WORDS) return NULL;
  uint64_t hash = key_hash(key, nwords);
  gc_entry *fresh = calloc(1, sizeof *fresh);
  if (fresh == NULL) return NULL;
  fresh->hash = hash;
  fresh->nwords = nwords;
  fresh->refs = 1;
  fresh->value = value;
  memcpy(fresh->key, key, (size_t)nwords * sizeof key[0]);

  gc_entry *to_free = NULL;
  pthread_mutex_lock(&c->lock);
  gc_entry *e = find(c, key, nwords, hash);
  if (e != NULL) { /* another thread built the same key first: share its value */
    e->refs++;
    unlink_entry(c, e);
    push_newest(c, e);
    c->stats.races++;
  } else {
    e = fresh;
    fresh = NULL;
    e->in_index = 1;
    push_newest(c, e);
    c->stats.entries++;
    c->stats.inserts++;
    evict_over_capacity(c, &to_free);
  }
  pthread_mutex_unlock(&c->lock);
  if (fresh != NULL) {
    if (c->free_value != NULL) c->free_value(value, c->free_arg);
    free(fresh);
  }
  free_chain(c, to_free);
  return e;
}

void *gc_value(const gc_entry *e) { return e->value; }

void gc_release(gc_cache *c, gc_entry *e) {
  if (e == NULL) return;
  int last = 0;
  pthread_mutex_lock(&c->lock);
  if (--e->refs == 0 && !e->in_index) {
    c->stats.detached--;
    c->stats.frees++;
    last = 1;
  }
  pthread_mutex_unlock(&c->lock);
  if (last) {
    e->older = NULL;
    free_chain(c, e);
  }
}

void gc_set_capacity(gc_cache *c, size_t capacity) {
  gc_entry *to_free = NULL;
  pthread_mutex_lock(&c->lock);
  c->capacity = capacity;
  c->stats.capacity = capacity;
  evict_over_capacity(c, &to_free);
  pthread_mutex_unlock(&c->lock);
  free_chain(c, to_free);
}

gc_stats gc_get_stats(gc_cache *c) {
  pthread_mutex_lock(&c->lock);
  gc_stats s = c->stats;
  pthread_mutex_unlock(&c->lock);
  return s;
}

void gc_destroy(gc_cache *c) {
  gc_entry *to_free = NULL;
  pthread_mutex_lock(&c->lock);
  for (gc_entry *e = c->oldest, *next; e != NULL; e = next) {
    next = e->newer;
    unlink_entry(c, e);
    e->in_index = 0;
    if (e->refs == 0) {
      e->older = to_free;
      to_free = e;
    }
  }
  pthread_mutex_unlock(&c->lock);
  free_chain(c, to_free);
  pthread_mutex_destroy(&c->lock);
}
