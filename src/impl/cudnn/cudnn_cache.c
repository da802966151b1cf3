/*
 * src/impl/cudnn/cudnn_cache.c - graphs shared by plans (the process-wide cache of cudnn_graph.h)
 * and the pool of run handles.
 *
 * The bookkeeping (bound, order of use, reference counts) is graph_cache.c's; this file gives it
 * its keys (the device and every field of the spec), its values (a built graph, or the reason one
 * could not be built) and the cuDNN handles graphs are built with.
 *
 * Locks: `build_lock` is held for a whole build, so a second plan of the same spec made at the same
 * time waits and then finds the first one's graph instead of building it again; lookups that hit
 * take the cache's own lock only. Order: build_lock, then the cache's lock (never the reverse).
 */
#include "impl/cudnn/cudnn_graph.h"
#include "impl/cudnn/graph_cache.h"

#include "core/ctx.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Graphs kept when $ATTN_CUDNN_GRAPH_CACHE does not say. A graph holds a few megabytes of host
 * memory in cuDNN (descriptors, the engine's compiled kernels). */
#define CG_CACHE_DEFAULT 64
/* Idle run handles kept for later runs, over all devices; more are destroyed. */
#define CG_IDLE_HANDLES 32

/* A cached value: a built graph, or why it could not be built. */
typedef struct cg_built {
  int device;      /* where it was built */
  cg_graph *graph; /* NULL when the build was refused */
  attn_status status;
  char why[ATTN_MESSAGE_SIZE];
} cg_built;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int cache_ready; /* gc_init succeeded; without it nothing is shared */
static gc_cache cache;
static uint64_t builds;
static pthread_mutex_t build_lock = PTHREAD_MUTEX_INITIALIZER;
static cudnnHandle_t *build_handles; /* [nbuild_handles], by device; under build_lock */
static int nbuild_handles;

/* Frees a cached value with its device current (the last reference may be given back, or the
 * value evicted, by a plan of another device), then restores the caller's device. */
static void free_built(void *value, void *arg) {
  (void)arg;
  cg_built *b = value;
  if (b->graph != NULL) {
    int previous = -1;
    cudaGetDevice(&previous);
    if (previous != b->device) cudaSetDevice(b->device);
    attn_cudnn_graph_free(b->graph);
    if (previous >= 0 && previous != b->device) cudaSetDevice(previous);
  }
  free(b);
}

/* The bound: $ATTN_CUDNN_GRAPH_CACHE when it is a whole number (0 to 1000000), else the default
 * (the library never prints, so a bad value is ignored rather than reported). */
static size_t capacity_from_env(void) {
  const char *env = getenv("ATTN_CUDNN_GRAPH_CACHE");
  if (env == NULL || env[0] == '\0') return CG_CACHE_DEFAULT;
  char *end;
  unsigned long long n = strtoull(env, &end, 10);
  if (*end != '\0' || env[0] == '-' || n > 1000000) return CG_CACHE_DEFAULT;
  return (size_t)n;
}

static void init_cache(void) {
  cache_ready = gc_init(&cache, capacity_from_env(), free_built, NULL) == 0;
}

/* ---- keys ------------------------------------------------------------------------------------ */

/* Every field of cg_spec must be in the key, or two specs that build different graphs would share
 * one. This size is the fields listed in spec_key on an LP64 machine: a field added to cg_spec
 * changes it and stops the build here until spec_key has it too. */
_Static_assert(sizeof(cg_spec) == 576, "cg_spec changed: add the new field to spec_key");

static void put_layout(int64_t *key, int *n, const int64_t s[4]) {
  for (int i = 0; i < 4; ++i) key[(*n)++] = s[i];
}

static int spec_key(int device, const cg_spec *s, int64_t key[GC_MAX_KEY_WORDS]) {
  int n = 0;
  int32_t scale_bits;
  memcpy(&scale_bits, &s->scale, sizeof scale_bits);
  key[n++] = device;
  key[n++] = s->backward, key[n++] = s->with_dbias, key[n++] = s->deterministic;
  key[n++] = s->dtype, key[n++] = s->out_dtype;
  key[n++] = s->b, key[n++] = s->hq, key[n++] = s->hkv, key[n++] = s->tq, key[n++] = s->tk;
  key[n++] = s->d, key[n++] = s->dv;
  key[n++] = scale_bits;
  key[n++] = s->has_bias;
  for (int i = 0; i < 4; ++i) key[n++] = s->bias_dims[i];
  key[n++] = s->padded, key[n++] = s->full_padding, key[n++] = s->top_left;
  key[n++] = s->left, key[n++] = s->right;
  key[n++] = s->alibi, key[n++] = s->alibi_stride;
  key[n++] = s->page_size, key[n++] = s->num_pages;
  key[n++] = s->version, key[n++] = s->sm;
  const cg_layout *l = &s->st;
  put_layout(key, &n, l->q), put_layout(key, &n, l->k), put_layout(key, &n, l->v);
  put_layout(key, &n, l->o), put_layout(key, &n, l->lse), put_layout(key, &n, l->dout);
  put_layout(key, &n, l->dq), put_layout(key, &n, l->dk), put_layout(key, &n, l->dv);
  put_layout(key, &n, l->bias), put_layout(key, &n, l->dbias), put_layout(key, &n, l->table);
  return n;
}

/* ---- shared graphs --------------------------------------------------------------------------- */

/* The cache's build handle of device (made current by the caller), created on first use; under
 * build_lock. Never destroyed: graphs built with it may live until the process ends. */
static cudnnHandle_t build_handle(int device, cg_err *err) {
  if (device >= nbuild_handles) {
    int n = device + 1;
    cudnnHandle_t *grown = realloc(build_handles, (size_t)n * sizeof *grown);
    if (grown == NULL) {
      err->status = ATTN_STATUS_OUT_OF_MEMORY;
      attn_format(err->why, err->why_size, "out of memory");
      return NULL;
    }
    for (int i = nbuild_handles; i < n; ++i) grown[i] = NULL;
    build_handles = grown;
    nbuild_handles = n;
  }
  if (build_handles[device] == NULL) ATTN_CUDNN_CHECK(err, cudnnCreate(&build_handles[device]));
  return build_handles[device];
}

/* The reference e, or NULL with err filled from a cached refusal (the reference is then given
 * back). */
static cg_shared *use(gc_entry *e, cg_err *err) {
  const cg_built *b = gc_value(e);
  if (b->graph != NULL) return e;
  err->status = b->status;
  attn_format(err->why, err->why_size, "%s", b->why);
  gc_release(&cache, e);
  return NULL;
}

cg_shared *attn_cudnn_graph_get(int device, const cg_spec *spec, cg_err *err) {
  pthread_once(&once, init_cache);
  if (!cache_ready) {
    err->status = ATTN_STATUS_INTERNAL;
    attn_format(err->why, err->why_size, "the cuDNN graph cache's mutex could not be created");
    return NULL;
  }
  int64_t key[GC_MAX_KEY_WORDS];
  int nwords = spec_key(device, spec, key);
  gc_entry *e = gc_acquire(&cache, key, nwords);
  if (e != NULL) return use(e, err);

  pthread_mutex_lock(&build_lock);
  /* Another thread may have built it while this one waited for the lock. */
  e = gc_acquire(&cache, key, nwords);
  if (e != NULL) {
    pthread_mutex_unlock(&build_lock);
    return use(e, err);
  }
  cg_built *b = calloc(1, sizeof *b);
  if (b == NULL) {
    pthread_mutex_unlock(&build_lock);
    err->status = ATTN_STATUS_OUT_OF_MEMORY;
    attn_format(err->why, err->why_size, "out of memory");
    return NULL;
  }
  b->device = device;
  cg_err build_err = {ATTN_STATUS_OK, b->why, sizeof b->why};
  cudnnHandle_t handle = build_handle(device, &build_err);
  if (handle != NULL) b->graph = attn_cudnn_graph_build(handle, spec, &build_err);
  builds++;
  b->status = build_err.status;
  /* Only a refusal is a property of the spec; out of memory or a device error may pass. With
   * capacity 0 the entry leaves the index at once and lives as long as this reference. */
  if (b->graph != NULL || b->status == ATTN_STATUS_UNSUPPORTED)
    e = gc_insert(&cache, key, nwords, b);
  pthread_mutex_unlock(&build_lock);
  if (e != NULL) return use(e, err);
  err->status = b->graph != NULL ? ATTN_STATUS_OUT_OF_MEMORY : b->status;
  attn_format(err->why, err->why_size, "%s", b->graph != NULL ? "out of memory" : b->why);
  free_built(b, NULL);
  return NULL;
}

cg_graph *attn_cudnn_shared_graph(const cg_shared *e) {
  return ((const cg_built *)gc_value(e))->graph;
}

void attn_cudnn_graph_put(cg_shared *e) {
  if (e != NULL) gc_release(&cache, e);
}

void attn_cudnn_graph_cache_stats(attn_cudnn_cache_stats *out) {
  pthread_once(&once, init_cache);
  memset(out, 0, sizeof *out);
  if (!cache_ready) return;
  gc_stats s = gc_get_stats(&cache);
  out->hits = s.hits;
  out->misses = s.misses;
  out->evictions = s.evictions;
  out->frees = s.frees;
  out->entries = s.entries;
  out->detached = s.detached;
  out->capacity = s.capacity;
  pthread_mutex_lock(&build_lock);
  out->builds = builds;
  pthread_mutex_unlock(&build_lock);
}

void attn_cudnn_graph_cache_set_capacity(size_t capacity) {
  pthread_once(&once, init_cache);
  if (cache_ready) gc_set_capacity(&cache, capacity);
}

/* ---- run handles ----------------------------------------------------------------------------- */

static pthread_mutex_t handle_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  int device;
  cudnnHandle_t handle;
} idle[CG_IDLE_HANDLES];
static int nidle;

cudnnHandle_t attn_cudnn_handle_take(int device, cg_err *err) {
  cudnnHandle_t h = NULL;
  pthread_mutex_lock(&handle_lock);
  for (int i = nidle - 1; i >= 0; --i)
    if (idle[i].device == device) {
      h = idle[i].handle;
      idle[i] = idle[--nidle];
      break;
    }
  pthread_mutex_unlock(&handle_lock);
  if (h == NULL) ATTN_CUDNN_CHECK(err, cudnnCreate(&h));
  return h;
}

void attn_cudnn_handle_give(int device, cudnnHandle_t h) {
  if (h == NULL) return;
  int kept = 0;
  pthread_mutex_lock(&handle_lock);
  if (nidle < CG_IDLE_HANDLES) {
    idle[nidle].device = device;
    idle[nidle].handle = h;
    nidle++;
    kept = 1;
  }
  pthread_mutex_unlock(&handle_lock);
  /* A run handle never built a graph, so no cached graph depends on it. */
  if (!kept) cudnnDestroy(h);
}
