/*
 * tools/harness.c - data, oracle comparison and timing shared by the attn command's subcommands.
 *
 * A GPU problem runs through the same code as a CPU one: its data is made on the host and mirrored
 * to the device (core/gpu.h, the services the tuner uses too), each pass waits for the device, and
 * the outputs come back to the host to be compared. Failures of the harness itself (memory, copies)
 * are recorded in the context like the library's, so the tool reads every message in one place.
 */
#define _POSIX_C_SOURCE 200809L
#include "harness.h"

#include "capacity.h"

#include "core/ctx.h"
#include "core/dtype.h"
#include "core/tensors.h"
#include "impl/ref/ref_rows.h"
#include "plan/validate.h"
/* SPEC.md's tolerance rule, the tests' own: a header of static inline functions, no test code. */
#include "../tests/tolerance.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

_Static_assert(sizeof(((h_buffers *)0)->role) / sizeof(void *) == ATTN_ROLE_COUNT,
               "h_buffers has one buffer per attn_role");

static int input_role(attn_role r) {
  return r <= ATTN_ROLE_KV_SEGMENT_IDS || r == ATTN_ROLE_DOUT || r == ATTN_ROLE_BLOCK_TABLE ||
         r == ATTN_ROLE_K_NEW || r == ATTN_ROLE_V_NEW || r == ATTN_ROLE_Q_DESCALE ||
         r == ATTN_ROLE_K_DESCALE || r == ATTN_ROLE_V_DESCALE;
}

static double uniform(uint64_t *state) {
  *state = *state * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(*state >> 11) * (1.0 / 9007199254740992.0);
}

/* Bytes of a role's buffer: at least one element, so that an empty tensor still has an address. */
static size_t role_bytes(const attn_problem *p, attn_role role) {
  int64_t n = attn_role_numel(p, role);
  return (size_t)(n > 0 ? n : 1) * attn_dtype_size(attn_role_dtype(p, role));
}

/* The i-th sequence-length array of b (cu_seqlens_q, cu_seqlens_k, seqlens_q, seqlens_k) and its
 * element count, so that copying, uploading and freeing them is one loop each. */
enum { LENGTH_ARRAYS = 5 };
static int32_t **length_array(h_buffers *b, int i, int64_t batch, int64_t *count) {
  int32_t **arrays[LENGTH_ARRAYS] = {&b->cu_seqlens_q, &b->cu_seqlens_k, &b->seqlens_q,
                                     &b->seqlens_k, &b->cache_seqlens};
  *count = i < 2 ? batch + 1 : batch;
  return arrays[i];
}

/* Points the tensors and sequence lengths of d's run at the buffers of b (host or device). */
static void bind(h_data *d, const h_buffers *b) {
  for (int r = 0; r < ATTN_ROLE_COUNT; ++r)
    if (b->role[r] != NULL)
      *attn_role_field((attn_role)r, &d->in, &d->out, &d->dout, &d->grads) =
          attn_tensor_dense(b->role[r]);
  d->in.cu_seqlens_q = b->cu_seqlens_q;
  d->in.cu_seqlens_k = b->cu_seqlens_k;
  d->in.seqlens_q = b->seqlens_q;
  d->in.seqlens_k = b->seqlens_k;
  d->in.cache_seqlens = b->cache_seqlens;
}

/* Zeroed host buffers for every tensor a run of d's problem has. 0 on allocation failure. */
static int alloc_roles(h_data *d, int backward) {
  for (int r = 0; r < ATTN_ROLE_COUNT; ++r) {
    attn_role role = (attn_role)r;
    if (!attn_role_needed(&d->problem, role, backward)) continue;
    d->host.role[r] = calloc(1, role_bytes(&d->problem, role));
    if (d->host.role[r] == NULL) return 0;
  }
  return 1;
}

/* A device copy of bytes of host memory; *dev is set (and freed with the data) even when the copy
 * fails. */
static attn_status copy_to_device(attn_ctx *ctx, const h_data *d, void **dev, const void *host,
                                  size_t bytes) {
  char why[512] = "";
  attn_status st = d->gpu->alloc(d->problem.device_index, bytes, dev, why, sizeof why);
  if (st == ATTN_STATUS_OK)
    st = d->gpu->upload(d->problem.device_index, *dev, host, bytes, why, sizeof why);
  return st == ATTN_STATUS_OK ? st : attn_fail(ctx, st, "%s", why);
}

/* Gives every host buffer of d (a GPU problem's) a copy on its device, and binds the run to them:
 * the implementations read the inputs and the sequence lengths there and write the outputs there. */
static attn_status mirror_to_device(attn_ctx *ctx, h_data *d) {
  char why[512] = "";
  if (!h_device_usable(&d->problem, why, sizeof why))
    return attn_fail(ctx, ATTN_STATUS_UNSUPPORTED, "%s", why);
  d->gpu = attn_gpu();
  attn_status st = ATTN_STATUS_OK;
  for (int r = 0; r < ATTN_ROLE_COUNT && st == ATTN_STATUS_OK; ++r)
    if (d->host.role[r] != NULL)
      st = copy_to_device(ctx, d, &d->device.role[r], d->host.role[r],
                          role_bytes(&d->problem, (attn_role)r));
  for (int i = 0; i < LENGTH_ARRAYS && st == ATTN_STATUS_OK; ++i) {
    int64_t n;
    const int32_t *host = *length_array(&d->host, i, d->problem.batch, &n);
    if (host == NULL) continue;
    void *copy = NULL;
    st = copy_to_device(ctx, d, &copy, host, (size_t)(n > 0 ? n : 1) * sizeof *host);
    *length_array(&d->device, i, d->problem.batch, &n) = copy;
  }
  if (st == ATTN_STATUS_OK) bind(d, &d->device);
  return st;
}

/* A paged cache's lengths (every sequence full) and block table: each sequence's pages distinct
 * and shuffled through the pool, as in an engine that has run a while. 0 on allocation failure. */
static int make_paged_cache(h_data *d, uint64_t *state) {
  const attn_problem *p = &d->problem;
  const int64_t B = p->batch, max_pages = attn_paged_max_pages(p), pool = attn_paged_num_pages(p);
  d->host.cache_seqlens = malloc((size_t)B * sizeof(int32_t));
  int32_t *order = malloc((size_t)(pool > 0 ? pool : 1) * sizeof *order);
  if (d->host.cache_seqlens == NULL || order == NULL) {
    free(order);
    return 0;
  }
  for (int64_t b = 0; b < B; ++b) d->host.cache_seqlens[b] = (int32_t)(p->seqlen_k - p->seqlen_new);
  for (int64_t i = 0; i < pool; ++i) order[i] = (int32_t)i;
  for (int64_t i = pool - 1; i > 0; --i) { /* Fisher-Yates */
    int64_t j = (int64_t)(uniform(state) * (double)(i + 1));
    int32_t t = order[i];
    order[i] = order[j], order[j] = t;
  }
  int32_t *table = d->host.role[ATTN_ROLE_BLOCK_TABLE];
  for (int64_t e = 0; e < B * max_pages; ++e) table[e] = pool > 0 ? order[e % pool] : -1;
  free(order);
  return 1;
}

/* splitmix64's finaliser: a well-mixed 64-bit value from any input. */
static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Draws the values of an input tensor: blocks of 2^16 elements, each from its own stream of
 * (seed, role, block), so that the threads fill a decode problem's gigabytes of k and v in
 * seconds, and the values depend on neither the thread count nor the device. */
enum { FILL_BLOCK = 1 << 16 };
static void fill_input(h_data *d, attn_role role, uint64_t seed) {
  void *buf = d->host.role[role];
  int64_t n = attn_role_numel(&d->problem, role);
  attn_dtype dtype = attn_role_dtype(&d->problem, role);
  const int64_t blocks = (n + FILL_BLOCK - 1) / FILL_BLOCK;
#pragma omp parallel for schedule(dynamic)
  for (int64_t block = 0; block < blocks; ++block) {
    uint64_t state = mix64(mix64(seed) ^ mix64(((uint64_t)role << 48) + (uint64_t)block));
    int64_t end = (block + 1) * FILL_BLOCK < n ? (block + 1) * FILL_BLOCK : n;
    for (int64_t i = block * FILL_BLOCK; i < end; ++i) {
      double u = uniform(&state);
      if (role == ATTN_ROLE_MASK)
        ((uint8_t *)buf)[i] = u < 0.8;
      else if (dtype == ATTN_DTYPE_I32)
        ((int32_t *)buf)[i] = (int32_t)(u * 3.0) - (u < 0.05);
      else if (role == ATTN_ROLE_ALIBI)
        attn_store(buf, dtype, i, 0.05 + 0.5 * u);
      else if (role == ATTN_ROLE_Q_DESCALE || role == ATTN_ROLE_K_DESCALE ||
               role == ATTN_ROLE_V_DESCALE) /* positive, as a quantiser's */
        attn_store(buf, dtype, i, 0.5 + u);
      else
        attn_store(buf, dtype, i, 2.0 * u - 1.0);
    }
  }
}

attn_status h_data_make(attn_ctx *ctx, h_data *d, const attn_problem *problem, uint64_t seed,
                        int backward) {
  memset(d, 0, sizeof *d);
  d->problem = *problem;
  const attn_problem *p = &d->problem;
  /* Refused before allocating: calloc of more than the machine has can succeed (overcommit), and
   * filling it then grinds for minutes or is killed. */
  char why[512];
  if (!h_fits(p, h_need_of(p, backward, H_USE_RUN), "the tensors of a run", why, sizeof why))
    return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "%s", why);
  if (!alloc_roles(d, backward)) goto oom;
  for (int r = 0; r < ATTN_ROLE_COUNT; ++r)
    if (d->host.role[r] != NULL && input_role((attn_role)r)) fill_input(d, (attn_role)r, seed);
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1; /* the varlen lengths' stream */
  int64_t B = p->batch;
  h_buffers *h = &d->host;
  if (p->varlen == ATTN_VARLEN_PACKED) {
    h->cu_seqlens_q = malloc((size_t)(B + 1) * sizeof *h->cu_seqlens_q);
    h->cu_seqlens_k = malloc((size_t)(B + 1) * sizeof *h->cu_seqlens_k);
    if (h->cu_seqlens_q == NULL || h->cu_seqlens_k == NULL) goto oom;
    h->cu_seqlens_q[0] = h->cu_seqlens_k[0] = 0;
    /* An even split of the totals, remainders first, each at most the longest a sequence may be
     * (seqlen_q, seqlen_k): the rows past them stay unused, as the contract allows. */
    for (int64_t b = 0; b < B; ++b) {
      int64_t lq = p->total_q / B + (b < p->total_q % B), lk = p->total_k / B + (b < p->total_k % B);
      h->cu_seqlens_q[b + 1] = h->cu_seqlens_q[b] + (int32_t)(lq < p->seqlen_q ? lq : p->seqlen_q);
      h->cu_seqlens_k[b + 1] = h->cu_seqlens_k[b] + (int32_t)(lk < p->seqlen_k ? lk : p->seqlen_k);
    }
  } else if (p->varlen == ATTN_VARLEN_PADDED) {
    h->seqlens_q = malloc((size_t)B * sizeof *h->seqlens_q);
    h->seqlens_k = malloc((size_t)B * sizeof *h->seqlens_k);
    if (h->seqlens_q == NULL || h->seqlens_k == NULL) goto oom;
    for (int64_t b = 0; b < B; ++b) { /* varied lengths, the first batch entry full */
      h->seqlens_q[b] =
          (int32_t)(b == 0 ? p->seqlen_q : (int64_t)(uniform(&state) * (double)(p->seqlen_q + 1)));
      h->seqlens_k[b] =
          (int32_t)(b == 0 ? p->seqlen_k : (int64_t)(uniform(&state) * (double)(p->seqlen_k + 1)));
    }
  }
  if (p->page_size > 0 && !make_paged_cache(d, &state)) goto oom;
  bind(d, &d->host);
  d->in.dropout_seed = seed;
  if (p->device != ATTN_DEVICE_CPU) {
    attn_status st = mirror_to_device(ctx, d);
    if (st != ATTN_STATUS_OK) h_data_free(d);
    return st;
  }
  return ATTN_STATUS_OK;
oom:
  h_data_free(d);
  return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory allocating the data of a run");
}

attn_status h_data_download(attn_ctx *ctx, h_data *d) {
  if (d->gpu == NULL) return ATTN_STATUS_OK;
  for (int r = 0; r < ATTN_ROLE_COUNT; ++r) {
    if (d->device.role[r] == NULL || input_role((attn_role)r)) continue;
    char why[512] = "";
    attn_status st = d->gpu->download(d->problem.device_index, d->host.role[r], d->device.role[r],
                                      role_bytes(&d->problem, (attn_role)r), why, sizeof why);
    if (st != ATTN_STATUS_OK) return attn_fail(ctx, st, "%s", why);
  }
  return ATTN_STATUS_OK;
}

void h_data_free(h_data *d) {
  for (int r = 0; r < ATTN_ROLE_COUNT; ++r) {
    free(d->host.role[r]);
    if (d->gpu != NULL) d->gpu->release(d->problem.device_index, d->device.role[r]);
  }
  for (int i = 0; i < LENGTH_ARRAYS; ++i) {
    int64_t n;
    free(*length_array(&d->host, i, d->problem.batch, &n));
    if (d->gpu != NULL)
      d->gpu->release(d->problem.device_index, *length_array(&d->device, i, d->problem.batch, &n));
  }
  memset(d, 0, sizeof *d);
}

int32_t h_gpu_count(char *why, size_t why_size) {
  const attn_gpu_ops *gpu = attn_gpu();
  if (gpu == NULL) {
    snprintf(why, why_size,
             "no GPU module loaded (libattn_cuda.so, libattn_cudnn.so: the \"gpu modules\" "
             "lines of `attn info` say why)");
    return 0;
  }
  int32_t count = 0;
  char reason[256] = "";
  if (gpu->device_count(&count, reason, sizeof reason) != ATTN_STATUS_OK || count <= 0) {
    snprintf(why, why_size, "no CUDA device is usable (%s)", reason[0] ? reason : "none found");
    return 0;
  }
  return count;
}

int h_device_usable(const attn_problem *problem, char *why, size_t why_size) {
  if (problem->device == ATTN_DEVICE_CPU) return 1;
  int32_t count = h_gpu_count(why, why_size);
  if (count == 0) return 0;
  if (problem->device_index >= count) {
    char last[32] = "";
    if (count > 1) snprintf(last, sizeof last, " to cuda:%d", (int)count - 1);
    snprintf(why, why_size, "there is no cuda:%d: this machine has %d CUDA device%s (cuda:0%s)",
             (int)problem->device_index, (int)count, count == 1 ? "" : "s", last);
    return 0;
  }
  return 1;
}

/* A plan of exactly impl/config (NULL config: its default) for d's problem, and the workspace a GPU
 * plan must be given, in device memory; a CPU plan given none allocates its own once. */
typedef struct plan_run {
  attn_plan *plan;
  void *workspace;
  size_t workspace_size;
} plan_run;

static attn_status plan_open(attn_ctx *ctx, const h_data *d, const char *impl, const char *config,
                             int backward, plan_run *r) {
  memset(r, 0, sizeof *r);
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = impl;
  sel.config = config;
  attn_status st = attn_plan_create(ctx, &d->problem, &sel, &r->plan);
  if (st != ATTN_STATUS_OK) return st;
  size_t forward = 0, both = 0;
  st = attn_plan_workspace_size(r->plan, &forward, &both);
  size_t need = backward && both > forward ? both : forward;
  /* Said once, truthfully, rather than left to a failed (or, overcommitted, grinding) allocation:
   * SIZE_MAX is the library's saturated answer for a workspace no size_t can count. */
  double host = h_host_available();
  char needed[64], have[64];
  h_format_bytes((double)need, needed, sizeof needed);
  h_format_bytes(host, have, sizeof have);
  if (st == ATTN_STATUS_OK && need == SIZE_MAX)
    st = attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "%s needs more workspace than a size_t counts",
                   impl);
  else if (st == ATTN_STATUS_OK && d->gpu == NULL && host > 0.0 && (double)need > host)
    st = attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY,
                   "%s needs %s of workspace, more than the %s of host memory available", impl,
                   needed, have);
  if (st != ATTN_STATUS_OK || d->gpu == NULL) return st; /* a CPU plan allocates its own */
  r->workspace_size = need;
  if (st == ATTN_STATUS_OK && r->workspace_size > 0) {
    char why[512] = "";
    st = d->gpu->alloc(d->problem.device_index, r->workspace_size, &r->workspace, why, sizeof why);
    if (st != ATTN_STATUS_OK) attn_fail(ctx, st, "%s", why);
  }
  return st;
}

/* One pass of the plan on the data: forward, then backward when asked. On a GPU the pass ends when
 * the device has finished it, so that a time measures the work and a failing kernel is reported
 * here, by the implementation that ran it. */
static attn_status plan_pass(attn_ctx *ctx, const plan_run *r, h_data *d, int backward) {
  attn_status st = attn_plan_forward(r->plan, &d->in, r->workspace, r->workspace_size, &d->out);
  if (st == ATTN_STATUS_OK && backward)
    st = attn_plan_backward(r->plan, &d->in, &d->out, &d->dout, r->workspace, r->workspace_size,
                            &d->grads);
  if (st == ATTN_STATUS_OK && d->gpu != NULL) {
    char why[512] = "";
    st = d->gpu->synchronize(d->problem.device_index, why, sizeof why);
    if (st != ATTN_STATUS_OK) attn_fail(ctx, st, "%s", why);
  }
  return st;
}

static void plan_close(plan_run *r, const h_data *d) {
  if (r->workspace != NULL) d->gpu->release(d->problem.device_index, r->workspace);
  attn_plan_destroy(r->plan);
  memset(r, 0, sizeof *r);
}

/* Runs exactly impl/config once on the data and brings its outputs to d->host. */
static attn_status run_exact(attn_ctx *ctx, h_data *d, const char *impl, const char *config,
                             int backward) {
  plan_run r;
  attn_status st = plan_open(ctx, d, impl, config, backward, &r);
  if (st == ATTN_STATUS_OK) st = plan_pass(ctx, &r, d, backward);
  if (st == ATTN_STATUS_OK) st = h_data_download(ctx, d);
  plan_close(&r, d);
  return st;
}

/* Zeroes the outputs of d (and of its device copy), so that every run starts from the state a
 * fresh allocation had and a row a candidate leaves unwritten cannot show an earlier one's. */
static attn_status zero_outputs(attn_ctx *ctx, h_data *d) {
  for (int r = 0; r < ATTN_ROLE_COUNT; ++r) {
    if (d->host.role[r] == NULL || input_role((attn_role)r)) continue;
    size_t bytes = role_bytes(&d->problem, (attn_role)r);
    memset(d->host.role[r], 0, bytes);
    if (d->gpu == NULL) continue;
    char why[512] = "";
    attn_status st = d->gpu->upload(d->problem.device_index, d->device.role[r], d->host.role[r],
                                    bytes, why, sizeof why);
    if (st != ATTN_STATUS_OK) return attn_fail(ctx, st, "%s", why);
  }
  return ATTN_STATUS_OK;
}

/* ---- the oracle -------------------------------------------------------------------------------- */

/* The keys of one batch entry and kv head whose dk and dv are checked: keys j of the entry (key
 * token token0 + j), and the query rows that reach them, all of the entry's rows of the group's
 * query heads. For packed varlen, the rows past every sequence form one more slice, b = batch,
 * that no query row reaches: their gradients are 0. */
typedef struct key_slice {
  int64_t b, g, token0;
  int64_t *keys, count;
  int64_t first; /* index of its first key in the oracle's dk and dv rows */
} key_slice;

/* The results of one run of the reference on the checked rows: full-size out, lse and dq (only the
 * checked rows written; the key gradients read the forward's rows there), and dk, dv of the
 * checked key rows, [checked, D] and [checked, Dv]. */
typedef struct ref_results {
  void *out, *lse, *dq;
  double *dk, *dv;
} ref_results;

/* The reference's runs: ORACLE in f64; NAIVE in the dtype, rounded as the dtype's kernel would;
 * AT_DTYPE in the dtype without rounding inside (what rounding the outputs alone costs); FED in
 * f64, the backward only, given the checked implementation's own out and lse (made per check:
 * tol_naive_error's fed). */
enum { ORACLE, NAIVE, AT_DTYPE, FED, RUNS };

/* Whether run `which` keeps its results in f64 (else in the problem's dtype). */
static int in_f64(int which) { return which == ORACLE || which == FED; }

struct h_oracle {
  h_data data;
  int backward;
  attn_problem resolved; /* the problem on the host, validated and resolved: what ref runs */
  attn_inputs in;        /* data's host inputs, resolved */
  attn_tensor dout;
  attn_dtype dtype;
  attn_dtype out_dtype;  /* of out (attn_out_dtype): the dtype, or an f8e4m3 problem's bf16 .. */
  int low;               /* f16/bf16/f8e4m3: the naive run sets the tolerance */
  ref_results res[RUNS]; /* by run (ORACLE, NAIVE, AT_DTYPE) */
  int64_t *query_ids, nquery;
  key_slice *slices;
  int nslices;
  int64_t *key_ids, nkeys;
  double naive_err[5]; /* f16/bf16: err(naive) of the rule on the checked rows, per output */
  tol_extent extent;   /* what the problem's values add to the rule (tolerance.h) */
  h_rows rows;
};

/* ids: a growable array of row ids. */
typedef struct id_list {
  int64_t *v, n, cap;
} id_list;

static int id_push(id_list *l, int64_t id) {
  if (l->n == l->cap) {
    int64_t cap = l->cap ? 2 * l->cap : 64;
    int64_t *more = realloc(l->v, (size_t)cap * sizeof *more);
    if (more == NULL) return 0;
    l->v = more, l->cap = cap;
  }
  l->v[l->n++] = id;
  return 1;
}

static int compare_id(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static void id_sort_unique(id_list *l) {
  if (l->n == 0) return;
  qsort(l->v, (size_t)l->n, sizeof *l->v, compare_id);
  int64_t kept = 1;
  for (int64_t i = 1; i < l->n; ++i)
    if (l->v[i] != l->v[kept - 1]) l->v[kept++] = l->v[i];
  l->n = kept;
}

/* Rows of one sequence where kernels change behaviour: the first and last, the first past its end
 * (a padded row), the last of the tensor, and both sides of the tile boundaries of 16, 32, 64 and
 * 128 rows at the start and at the last tile. Positions in [0, cap) of a sequence of len rows. */
static int edge_rows(int64_t len, int64_t cap, int64_t rows[32]) {
  int n = 0;
  const int64_t fixed[6] = {0, 1, len - 2, len - 1, len, cap - 1};
  for (int i = 0; i < 6; ++i) rows[n++] = fixed[i];
  for (int64_t tile = 16; tile <= 128; tile *= 2) {
    int64_t last = len > 0 ? (len - 1) / tile * tile : 0;
    rows[n++] = tile - 1, rows[n++] = tile, rows[n++] = last - 1, rows[n++] = last;
  }
  int kept = 0;
  for (int i = 0; i < n; ++i)
    if (rows[i] >= 0 && rows[i] < cap) rows[kept++] = rows[i];
  return kept;
}

/* Token rows of batch entry b in the q (or k) tensor: the first, the real length, and how many
 * tensor rows it has (Tq dense, its length packed). */
static void entry_rows(const attn_problem *p, const attn_inputs *in, int64_t b, int keys,
                       int64_t *token0, int64_t *len, int64_t *cap) {
  attn_seq s = attn_seq_of(p, in, b);
  int packed = p->varlen == ATTN_VARLEN_PACKED;
  *token0 = packed ? (keys ? s.k_row0 : s.q_row0) : b * (keys ? p->seqlen_k : p->seqlen_q);
  *len = keys ? s.len_k : s.len_q;
  *cap = packed ? *len : (keys ? p->seqlen_k : p->seqlen_q);
}

static int64_t token_rows(const attn_problem *p, int keys) {
  if (p->varlen == ATTN_VARLEN_PACKED) return keys ? p->total_k : p->total_q;
  return p->batch * (keys ? p->seqlen_k : p->seqlen_q);
}

static int64_t draw(uint64_t *state, int64_t n) {
  int64_t v = (int64_t)(uniform(state) * (double)n);
  return v < n ? v : n - 1;
}

/* The query rows to check: every one, or the edge rows of the first, the last and a random batch
 * entry (heads first, last and random), then random rows up to want. */
static int choose_query_rows(h_oracle *o, int64_t want, uint64_t *state, id_list *ids) {
  const attn_problem *p = &o->resolved;
  int64_t hq = p->heads_q, total = token_rows(p, 0) * hq;
  if (!o->rows.sampled) {
    for (int64_t id = 0; id < total; ++id)
      if (!id_push(ids, id)) return 0;
    return 1;
  }
  const int64_t entries[3] = {0, p->batch - 1, draw(state, p->batch)};
  const int64_t heads[3] = {0, hq - 1, draw(state, hq)};
  for (int e = 0; e < 3; ++e) {
    int64_t token0, len, cap, rows[32];
    entry_rows(p, &o->in, entries[e], 0, &token0, &len, &cap);
    int n = edge_rows(len, cap, rows);
    for (int i = 0; i < n; ++i)
      if (!id_push(ids, (token0 + rows[i]) * hq + heads[e])) return 0;
  }
  if (p->varlen == ATTN_VARLEN_PACKED && p->total_q > o->in.cu_seqlens_q[p->batch])
    if (!id_push(ids, (p->total_q - 1) * hq + hq - 1)) return 0; /* a row past every sequence */
  id_sort_unique(ids);
  /* Each round draws as many rows as are missing: duplicates only leave some missing, so the
   * sample ends at exactly want rows (or the edge rows, if they are more). */
  for (int round = 0; ids->n < want && round < 64; ++round) {
    for (int64_t missing = want - ids->n; missing > 0; --missing)
      if (!id_push(ids, draw(state, total))) return 0;
    id_sort_unique(ids);
  }
  return 1;
}

/* Multiply-adds of the reference's forward over every query row of a slice. */
static double slice_work(const attn_problem *p, int64_t len_q, int64_t len_k) {
  return (double)(p->heads_q / p->heads_kv) * (double)len_q * (double)len_k *
         (double)(p->head_dim + p->head_dim_v);
}

/* The key slices to check: all of them; or the last (batch entry, kv head) and, if the work
 * allows, a random second one, with their edge keys and random ones up to want each. */
static int choose_key_slices(h_oracle *o, int64_t want, uint64_t *state) {
  const attn_problem *p = &o->resolved;
  int packed_rest = p->varlen == ATTN_VARLEN_PACKED && p->total_k > o->in.cu_seqlens_k[p->batch];
  /* No key rows at all (Tk = 0): nothing to check, and no slice per (batch, kv head) to keep,
   * however many of those the problem has. */
  if (token_rows(p, 1) == 0 && !packed_rest) return 1;
  int64_t max_slices = o->rows.sampled ? 3 : (p->batch + 1) * p->heads_kv;
  o->slices = calloc((size_t)max_slices, sizeof *o->slices);
  if (o->slices == NULL) return 0;
  /* Slices by index b * Hkv + g: sampled, the last one, then a random other one. */
  const int64_t all = p->batch * p->heads_kv;
  const int64_t picks[2] = {all - 1, all > 1 ? draw(state, all - 1) : 0};
  int64_t count = o->rows.sampled ? (all > 1 ? 2 : 1) : all;
  double work = 0.0;
  for (int64_t n = 0; n < count; ++n) {
    int64_t index = o->rows.sampled ? picks[n] : n;
    int64_t b = index / p->heads_kv, g = index % p->heads_kv;
    int64_t qtoken0, len_q, qcap;
    entry_rows(p, &o->in, b, 0, &qtoken0, &len_q, &qcap);
    key_slice *s = &o->slices[o->nslices];
    int64_t len_k, cap;
    entry_rows(p, &o->in, b, 1, &s->token0, &len_k, &cap);
    if (o->rows.sampled) { /* the first slice up to 4 x H_SLICE_WORK, both within 1 x */
      double w = slice_work(p, len_q, len_k);
      if (n == 0 ? w > 4.0 * (double)H_SLICE_WORK : work + w > (double)H_SLICE_WORK) break;
      work += w;
    }
    s->b = b, s->g = g;
    id_list keys = {NULL, 0, 0};
    if (!o->rows.sampled || cap <= want) {
      for (int64_t j = 0; j < cap; ++j)
        if (!id_push(&keys, j)) return free(keys.v), 0;
    } else {
      int64_t rows[32];
      int e = edge_rows(len_k, cap, rows);
      for (int i = 0; i < e; ++i)
        if (!id_push(&keys, rows[i])) return free(keys.v), 0;
      id_sort_unique(&keys);
      for (int round = 0; keys.n < want && round < 64; ++round) { /* as for query rows */
        for (int64_t missing = want - keys.n; missing > 0; --missing)
          if (!id_push(&keys, draw(state, cap))) return free(keys.v), 0;
        id_sort_unique(&keys);
      }
    }
    s->keys = keys.v, s->count = keys.n;
    o->nslices++;
  }
  if (o->rows.sampled && o->nslices == 0) o->rows.keys_skipped = 1;
  /* Rows of k past every sequence (packed): all of them for every kv head, or the last one. */
  for (int64_t g = o->rows.sampled ? p->heads_kv - 1 : 0; packed_rest && g < p->heads_kv; ++g) {
    if (o->rows.keys_skipped) break;
    key_slice *s = &o->slices[o->nslices];
    int64_t rest = p->total_k - o->in.cu_seqlens_k[p->batch];
    s->b = p->batch, s->g = g, s->token0 = o->in.cu_seqlens_k[p->batch];
    s->count = o->rows.sampled ? 1 : rest;
    s->keys = malloc((size_t)s->count * sizeof *s->keys);
    if (s->keys == NULL) return 0;
    for (int64_t j = 0; j < s->count; ++j) s->keys[j] = o->rows.sampled ? rest - 1 : j;
    o->nslices++;
  }
  return 1;
}

/* The key ids (token * Hkv + kv head) of the slices, in slice order, and each slice's first. */
static int list_key_ids(h_oracle *o) {
  const attn_problem *p = &o->resolved;
  int64_t n = 0;
  for (int s = 0; s < o->nslices; ++s) n += o->slices[s].count;
  o->key_ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *o->key_ids);
  if (o->key_ids == NULL) return 0;
  o->nkeys = n;
  int64_t at = 0;
  for (int s = 0; s < o->nslices; ++s) {
    key_slice *k = &o->slices[s];
    k->first = at;
    for (int64_t j = 0; j < k->count; ++j)
      o->key_ids[at++] = (k->token0 + k->keys[j]) * p->heads_kv + k->g;
  }
  return 1;
}

/* The run of the reference on the oracle's inputs whose results go to res (in results_dtype). */
typedef struct ref_run {
  attn_run run;
  attn_outputs out;
  attn_grads grads;
  attn_dtype results;
} ref_run;

static void ref_run_init(ref_run *r, const h_oracle *o, int which) {
  const attn_problem *p = &o->resolved;
  memset(r, 0, sizeof *r);
  r->results = in_f64(which) ? ATTN_DTYPE_F64 : o->out_dtype;
  r->out.out = attn_role_resolve(p, ATTN_ROLE_OUT, attn_tensor_dense(o->res[which].out));
  r->out.lse = attn_role_resolve(p, ATTN_ROLE_LSE, attn_tensor_dense(o->res[which].lse));
  r->grads.dq = attn_role_resolve(p, ATTN_ROLE_DQ, attn_tensor_dense(o->res[which].dq));
  r->run.problem = p;
  r->run.inputs = &o->in;
  r->run.outputs = &r->out;
  r->run.dout = &o->dout;
  r->run.grads = &r->grads;
  r->run.round_to = which == NAIVE ? o->dtype : ATTN_DTYPE_F64;
}

#ifdef _OPENMP
#include <omp.h>
static int max_threads(void) { return omp_get_max_threads(); }
static int thread_index(void) { return omp_get_thread_num(); }
#else
static int max_threads(void) { return 1; }
static int thread_index(void) { return 0; }
#endif

/* Evaluates runs w0 .. w1 - 1 of the reference on the oracle's rows, on every thread: the forward
 * of the checked query rows and of every query row of the key slices (none when forward_ids is
 * NULL: the runs' out and lse are given), dq of the checked rows, then each slice's keys, whose
 * sums over the threads' partial sums are taken in thread order (a static schedule), so the
 * results do not depend on timing. */
static attn_status evaluate(attn_ctx *ctx, h_oracle *o, const id_list *forward_ids, int w0,
                            int w1) {
  const attn_problem *p = &o->resolved;
  const int runs = w1 - w0, threads = max_threads();
  const int64_t hq = p->heads_q, group = p->heads_q / p->heads_kv;
  const int64_t d = p->head_dim, dv = p->head_dim_v;
  int64_t max_keys = 0;
  for (int s = 0; s < o->nslices; ++s)
    if (o->slices[s].count > max_keys) max_keys = o->slices[s].count;
  size_t scratch_size = (attn_ref_row_scratch_size(p) + 63) / 64 * 64;
  size_t acc_doubles = o->backward ? (size_t)(max_keys * (d + dv) * runs) : 0;
  char *scratch = malloc((size_t)threads * scratch_size);
  double *acc = malloc((size_t)threads * (acc_doubles > 0 ? acc_doubles : 1) * sizeof(double));
  if (scratch == NULL || acc == NULL) {
    free(scratch), free(acc);
    return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY,
                     "out of memory for the reference's scratch (%d threads)", threads);
  }
  ref_run r[RUNS];
  for (int w = w0; w < w1; ++w) ref_run_init(&r[w], o, w);

  const int64_t nforward = forward_ids != NULL ? forward_ids->n : 0;
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t n = 0; n < nforward; ++n) {
    void *mine = scratch + (size_t)thread_index() * scratch_size;
    int64_t id = forward_ids->v[n];
    for (int w = w0; w < w1; ++w)
      attn_ref_forward_row(&r[w].run, r[w].results, id % hq, id / hq, mine);
  }
  if (o->backward) {
    const int64_t nquery = o->nquery;
#pragma omp parallel for schedule(dynamic, 4)
    for (int64_t n = 0; n < nquery; ++n) {
      void *mine = scratch + (size_t)thread_index() * scratch_size;
      int64_t id = o->query_ids[n];
      for (int w = w0; w < w1; ++w)
        attn_ref_dq_row(&r[w].run, r[w].results, id % hq, id / hq, mine);
    }
  }
  for (int s = 0; o->backward && s < o->nslices; ++s) {
    const key_slice *k = &o->slices[s];
    int64_t token0 = 0, len_q = 0, cap;
    if (k->b < p->batch) entry_rows(p, &o->in, k->b, 0, &token0, &len_q, &cap);
    const int64_t rows = group * len_q, per_run = k->count * (d + dv);
#pragma omp parallel
    {
      double *mine = acc + (size_t)thread_index() * acc_doubles;
      void *space = scratch + (size_t)thread_index() * scratch_size;
      memset(mine, 0, (size_t)(per_run * runs) * sizeof *mine);
#pragma omp for schedule(static)
      for (int64_t n = 0; n < rows; ++n) {
        int64_t h = k->g * group + n / len_q, token = token0 + n % len_q;
        for (int w = w0; w < w1; ++w)
          attn_ref_key_grads_row(&r[w].run, r[w].results, h, token, k->keys, k->count,
                                 mine + (w - w0) * per_run,
                                 mine + (w - w0) * per_run + k->count * d, space);
      }
    }
    for (int w = w0; w < w1; ++w) {
      double *dk = o->res[w].dk + k->first * d, *dvs = o->res[w].dv + k->first * dv;
      for (int t = 0; t < threads; ++t) {
        const double *part = acc + (size_t)t * acc_doubles + (w - w0) * per_run;
        for (int64_t e = 0; e < k->count * d; ++e) dk[e] += part[e];
        for (int64_t e = 0; e < k->count * dv; ++e) dvs[e] += part[k->count * d + e];
      }
      /* The whole reference stores its f64 sums in the output dtype; the runs at it are so. */
      if (!in_f64(w)) {
        for (int64_t e = 0; e < k->count * d; ++e) dk[e] = attn_round_to(o->dtype, dk[e]);
        for (int64_t e = 0; e < k->count * dv; ++e) dvs[e] = attn_round_to(o->dtype, dvs[e]);
      }
    }
  }
  free(scratch);
  free(acc);
  return ATTN_STATUS_OK;
}

static const attn_role compared_roles[5] = {ATTN_ROLE_OUT, ATTN_ROLE_LSE, ATTN_ROLE_DQ,
                                            ATTN_ROLE_DK, ATTN_ROLE_DV};
static const char *const compared_names[5] = {"out", "lse", "dq", "dk", "dv"};

/* Index of lse[head, token] in a dense lse: [B, Hq, Tq], or [Hq, total_q] packed. */
static int64_t lse_index(const attn_problem *p, int64_t head, int64_t token) {
  if (p->varlen == ATTN_VARLEN_PACKED) return head * p->total_q + token;
  return (token / p->seqlen_q * p->heads_q + head) * p->seqlen_q + token % p->seqlen_q;
}

/* The difference, over the checked rows, of output `which` (0..4 as compared_roles) of the
 * candidate's host data from the results r of a reference run (in dtype r_dtype). */
static tol_err compare_rows(const h_oracle *o, int which, const void *a, attn_dtype a_dtype,
                            const ref_results *r, attn_dtype r_dtype) {
  const attn_problem *p = &o->resolved;
  tol_err e = tol_err_init();
  if (which == 1) {
    for (int64_t n = 0; n < o->nquery; ++n) {
      int64_t id = o->query_ids[n], at = lse_index(p, id % p->heads_q, id / p->heads_q);
      tol_err_add(&e, at, attn_load(a, a_dtype, at),
                  attn_load(r->lse, attn_stat_dtype(r_dtype), at));
    }
  } else if (which == 0 || which == 2) {
    int64_t width = which == 0 ? p->head_dim_v : p->head_dim;
    const void *ref = which == 0 ? r->out : r->dq;
    for (int64_t n = 0; n < o->nquery; ++n)
      for (int64_t d = 0; d < width; ++d) {
        int64_t at = o->query_ids[n] * width + d;
        tol_err_add(&e, at, attn_load(a, a_dtype, at), attn_load(ref, r_dtype, at));
      }
  } else {
    int64_t width = which == 3 ? p->head_dim : p->head_dim_v;
    const double *ref = which == 3 ? r->dk : r->dv;
    for (int64_t n = 0; n < o->nkeys; ++n)
      for (int64_t d = 0; d < width; ++d) {
        int64_t at = o->key_ids[n] * width + d;
        tol_err_add(&e, at, attn_load(a, a_dtype, at), ref[n * width + d]);
      }
  }
  return e;
}

/* err(naive) of the tolerance rule for each output: the naive and the at-dtype runs against the
 * oracle (tol_naive_error). */
static tol_err run_error(const h_oracle *o, int which, int output) {
  const attn_problem *p = &o->resolved;
  const ref_results *run = &o->res[which], *exact = &o->res[ORACLE];
  const attn_dtype dt = in_f64(which) ? ATTN_DTYPE_F64 : o->out_dtype;
  switch (output) {
  case 0: return compare_rows(o, 0, run->out, dt, exact, ATTN_DTYPE_F64);
  case 1: return compare_rows(o, 1, run->lse, attn_stat_dtype(dt), exact, ATTN_DTYPE_F64);
  case 2: return compare_rows(o, 2, run->dq, dt, exact, ATTN_DTYPE_F64);
  case 3: return tol_compare(run->dk, exact->dk, o->nkeys * p->head_dim);
  default: return tol_compare(run->dv, exact->dv, o->nkeys * p->head_dim_v);
  }
}

static void measure_naive(h_oracle *o) {
  for (int i = 0; i < (o->backward ? 5 : 2); ++i) {
    tol_err naive = run_error(o, NAIVE, i), at_dtype = run_error(o, AT_DTYPE, i);
    o->naive_err[i] = tol_naive_error(&naive, &at_dtype, NULL);
  }
}

static int alloc_results(h_oracle *o, int which) {
  const attn_problem *p = &o->resolved;
  attn_dtype t = in_f64(which) ? ATTN_DTYPE_F64 : o->out_dtype;
  ref_results *r = &o->res[which];
  r->out = calloc((size_t)attn_role_numel(p, ATTN_ROLE_OUT), attn_dtype_size(t));
  r->lse = calloc((size_t)attn_role_numel(p, ATTN_ROLE_LSE), attn_dtype_size(attn_stat_dtype(t)));
  if (r->out == NULL || r->lse == NULL) return 0;
  if (!o->backward) return 1;
  size_t keys = (size_t)(o->nkeys > 0 ? o->nkeys : 1);
  r->dq = calloc((size_t)attn_role_numel(p, ATTN_ROLE_DQ), attn_dtype_size(t));
  r->dk = calloc(keys * (size_t)p->head_dim, sizeof(double));
  r->dv = calloc(keys * (size_t)p->head_dim_v, sizeof(double));
  return r->dq != NULL && r->dk != NULL && r->dv != NULL;
}

/* The data's host inputs as a plan would pass them to ref: every tensor with explicit strides. */
static void resolve_inputs(h_oracle *o) {
  h_data view = o->data; /* a copy: binding it to the host leaves the data's device binding */
  bind(&view, &view.host);
  o->in = view.in;
  o->dout = view.dout;
  attn_outputs unused_out;
  attn_grads unused_grads;
  for (int r = 0; r < ATTN_ROLE_COUNT; ++r) {
    attn_role role = (attn_role)r;
    if (!input_role(role) || o->data.host.role[r] == NULL) continue;
    attn_tensor *t = attn_role_field(role, &o->in, &unused_out, &o->dout, &unused_grads);
    *t = attn_role_resolve(&o->resolved, role, *t);
  }
}

/* The largest magnitude among the host values of an input role; 0 where the problem has none. On
 * every thread, as the data were drawn: a decode problem's k holds gigabytes. */
static double role_max_abs(const h_data *d, attn_role role) {
  const void *buf = d->host.role[role];
  if (buf == NULL) return 0.0;
  const attn_dtype dtype = attn_role_dtype(&d->problem, role);
  const int64_t n = attn_role_numel(&d->problem, role);
  double m = 0.0;
#pragma omp parallel for reduction(max : m)
  for (int64_t i = 0; i < n; ++i) {
    double v = fabs(attn_load(buf, dtype, i));
    if (v > m) m = v;
  }
  return m;
}

/* What the problem's values add to the tolerance rule (tol_extent_make): its logits' bound from
 * the data, ALiBi distances within the longest sequences, and the longest gradient sum (dq over
 * the keys and sinks, dk and dv over a group's query rows). */
static tol_extent measure_extent(const h_oracle *o) {
  const attn_problem *p = &o->resolved;
  const h_data *d = &o->data;
  const int packed = p->varlen == ATTN_VARLEN_PACKED;
  const int64_t tq = packed && p->total_q > p->seqlen_q ? p->total_q : p->seqlen_q;
  const int64_t tk = packed && p->total_k > p->seqlen_k ? p->total_k : p->seqlen_k;
  const int64_t rows = tq * (p->heads_q / p->heads_kv), keys = tk + p->num_sinks;
  double max_k = role_max_abs(d, ATTN_ROLE_K), max_k_new = role_max_abs(d, ATTN_ROLE_K_NEW);
  return tol_extent_make(o->dtype, p->scale, p->softcap, p->head_dim, role_max_abs(d, ATTN_ROLE_Q),
                         max_k > max_k_new ? max_k : max_k_new, role_max_abs(d, ATTN_ROLE_BIAS),
                         role_max_abs(d, ATTN_ROLE_ALIBI), tq + tk, rows > keys ? rows : keys);
}

attn_status h_oracle_make(attn_ctx *ctx, const attn_problem *problem, int backward, uint64_t seed,
                          int64_t sample_rows, h_oracle **oracle) {
  *oracle = NULL;
  /* The reference's gradients read a dense cache: a problem without a backward has no oracle of
   * one (its rows would be read out of bounds), the same refusal as a plan's. */
  if (backward) {
    attn_status has = attn_validate_has_backward(ctx, problem);
    if (has != ATTN_STATUS_OK) return has;
  }
  h_oracle *o = calloc(1, sizeof *o);
  if (o == NULL) return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory for the oracle");
  attn_status st = h_data_make(ctx, &o->data, problem, seed, backward);
  if (st != ATTN_STATUS_OK) return free(o), st;
  o->backward = backward;
  attn_problem host = *problem;
  host.device = ATTN_DEVICE_CPU, host.device_index = 0;
  st = attn_validate_problem(ctx, &host, &o->resolved);
  if (st != ATTN_STATUS_OK) return h_oracle_free(o), st;
  const attn_problem *p = &o->resolved;
  o->dtype = (attn_dtype)p->dtype;
  o->out_dtype = attn_out_dtype(p);
  o->low = o->dtype == ATTN_DTYPE_F16 || o->dtype == ATTN_DTYPE_BF16 ||
           o->dtype == ATTN_DTYPE_F8E4M3;
  o->extent = measure_extent(o);
  resolve_inputs(o);
  /* A paged problem's new rows go into the cache first, as every implementation's run does (with
   * the same values): the oracle's rows read the cache the runs attend to. */
  attn_paged_append(p, &o->in);

  int64_t query_total = token_rows(p, 0) * p->heads_q;
  double work = (double)query_total * (double)p->seqlen_k * (double)(p->head_dim + p->head_dim_v);
  int64_t want = sample_rows == H_SAMPLE_AUTO
                     ? (work > (double)H_FULL_CHECK_WORK ? H_SAMPLE_ROWS : 0)
                     : sample_rows;
  o->rows.sampled = want > 0 && want < query_total;
  o->rows.seed = seed;
  uint64_t state = seed * 0x2545f4914f6cdd1dull + 7; /* apart from the inputs' stream */
  id_list query = {NULL, 0, 0}, forward = {NULL, 0, 0};
  int made =
      choose_query_rows(o, want, &state, &query) &&
      (!backward || (choose_key_slices(o, want / 2 > 0 ? want / 2 : 1, &state) && list_key_ids(o)));
  o->query_ids = query.v, o->nquery = query.n;
  /* The forward runs on the checked rows and on every query row of the key slices. */
  for (int64_t n = 0; made && n < query.n; ++n) made = id_push(&forward, query.v[n]);
  for (int s = 0; made && backward && o->rows.sampled && s < o->nslices; ++s) {
    const key_slice *k = &o->slices[s];
    if (k->b >= p->batch) continue;
    int64_t token0, len_q, cap, group = p->heads_q / p->heads_kv;
    entry_rows(p, &o->in, k->b, 0, &token0, &len_q, &cap);
    for (int64_t h = k->g * group; made && h < (k->g + 1) * group; ++h)
      for (int64_t i = 0; made && i < len_q; ++i)
        made = id_push(&forward, (token0 + i) * p->heads_q + h);
  }
  if (made) id_sort_unique(&forward);
  made = made && alloc_results(o, ORACLE) &&
         (!o->low || (alloc_results(o, NAIVE) && alloc_results(o, AT_DTYPE) &&
                      (!backward || alloc_results(o, FED))));
  if (!made) {
    free(forward.v);
    h_oracle_free(o);
    return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory for the reference's results");
  }
  o->rows.query_checked = o->nquery;
  o->rows.query_total = query_total;
  o->rows.key_checked = backward ? o->nkeys : 0;
  o->rows.key_total = backward ? token_rows(p, 1) * p->heads_kv : 0;
  /* A sample whose edge rows are all there is was no sample. */
  if (o->nquery == query_total && o->rows.key_checked == o->rows.key_total) o->rows.sampled = 0;
  st = evaluate(ctx, o, &forward, ORACLE, o->low ? FED : NAIVE);
  free(forward.v);
  if (st != ATTN_STATUS_OK) return h_oracle_free(o), st;
  if (o->low) measure_naive(o);
  *oracle = o;
  return attn_succeed(ctx);
}

const h_rows *h_oracle_rows(const h_oracle *o) { return &o->rows; }

int64_t h_oracle_query_ids(const h_oracle *o, const int64_t **ids) {
  *ids = o->query_ids;
  return o->nquery;
}

int64_t h_oracle_key_ids(const h_oracle *o, const int64_t **ids) {
  *ids = o->key_ids;
  return o->nkeys;
}

void h_oracle_describe(const h_oracle *o, char *text, size_t size) {
  const h_rows *r = &o->rows;
  if (!r->sampled) {
    snprintf(text, size, "every row");
    return;
  }
  int n = snprintf(text, size, "%lld of %lld query rows", (long long)r->query_checked,
                   (long long)r->query_total);
  if (n < 0 || (size_t)n >= size) return;
  if (o->backward && !r->keys_skipped)
    n += snprintf(text + n, size - (size_t)n, " and %lld of %lld key rows",
                  (long long)r->key_checked, (long long)r->key_total);
  if (n < 0 || (size_t)n >= size) return;
  n += snprintf(text + n, size - (size_t)n, " (sampled, seed %llu)", (unsigned long long)r->seed);
  if (n >= 0 && (size_t)n < size && o->backward && r->keys_skipped)
    snprintf(text + n, size - (size_t)n,
             "; dk and dv unchecked: the reference of one batch entry's keys needs all %lld of its "
             "query rows, more than %.0e multiply-adds",
             (long long)(o->resolved.seqlen_q * (o->resolved.heads_q / o->resolved.heads_kv)),
             4.0 * (double)H_SLICE_WORK);
}

void h_oracle_free(h_oracle *o) {
  if (o == NULL) return;
  h_data_free(&o->data);
  for (int w = 0; w < RUNS; ++w) {
    free(o->res[w].out), free(o->res[w].lse), free(o->res[w].dq);
    free(o->res[w].dk), free(o->res[w].dv);
  }
  for (int s = 0; s < o->nslices; ++s) free(o->slices[s].keys);
  free(o->slices);
  free(o->query_ids);
  free(o->key_ids);
  free(o);
}

/* The FED run on the checked rows: the f64 backward given the candidate's out and lse (d's host
 * outputs after its run). 0 when it could not run (its bound then goes without it). */
static int evaluate_fed(attn_ctx *ctx, h_oracle *o) {
  const attn_problem *p = &o->resolved;
  const h_data *d = &o->data;
  ref_results *fed = &o->res[FED];
  const attn_role roles[2] = {ATTN_ROLE_OUT, ATTN_ROLE_LSE};
  void *into[2] = {fed->out, fed->lse};
  for (int r = 0; r < 2; ++r) {
    const attn_dtype from = attn_role_dtype(&d->problem, roles[r]);
    const int64_t n = attn_role_numel(p, roles[r]);
    for (int64_t e = 0; e < n; ++e)
      ((double *)into[r])[e] = attn_load(d->host.role[roles[r]], from, e);
  }
  memset(fed->dq, 0, (size_t)attn_role_numel(p, ATTN_ROLE_DQ) * sizeof(double));
  const size_t keys = (size_t)(o->nkeys > 0 ? o->nkeys : 1);
  memset(fed->dk, 0, keys * (size_t)p->head_dim * sizeof(double));
  memset(fed->dv, 0, keys * (size_t)p->head_dim_v * sizeof(double));
  return evaluate(ctx, o, NULL, FED, FED + 1) == ATTN_STATUS_OK;
}

h_check h_check_run(attn_ctx *ctx, h_oracle *o, const char *impl, const char *config) {
  h_check c;
  memset(&c, 0, sizeof c);
  h_data *d = &o->data;
  c.status = zero_outputs(ctx, d);
  if (c.status == ATTN_STATUS_OK) c.status = run_exact(ctx, d, impl, config, o->backward);
  if (c.status != ATTN_STATUS_OK) return c;
  c.ok = 1;
  double worst = -1.0;
  int outputs = !o->backward ? 2 : o->rows.keys_skipped ? 3 : 5;
  /* Gradients of f16/bf16: also the error the candidate's own out and lse make unavoidable. */
  const int fed = o->low && o->backward && evaluate_fed(ctx, o);
  for (int i = 0; i < outputs; ++i) {
    attn_role role = compared_roles[i];
    attn_dtype a_dtype = attn_role_dtype(&d->problem, role);
    tol_err e = compare_rows(o, i, d->host.role[role], a_dtype, &o->res[ORACLE], ATTN_DTYPE_F64);
    double naive_err = o->naive_err[i]; /* 0 for f32, whose rule needs none */
    if (fed && i >= 2) {
      tol_err naive = tol_err_init(), from_fed = run_error(o, FED, i);
      naive.max_abs = naive_err;
      naive_err = tol_naive_error(&naive, NULL, &from_fed);
    }
    c.err[i] = e.nonfinite != 0 ? INFINITY : e.max_abs;
    c.ref[i] = e.max_ref;
    const tol_pass pass = i == 0 ? TOL_FORWARD : i == 1 ? TOL_LSE : TOL_GRADIENT;
    c.tol[i] = tol_bound(o->dtype, pass, c.ref[i], naive_err, &o->extent);
    c.compared++;
    double ratio = c.tol[i] > 0 ? c.err[i] / c.tol[i] : (c.err[i] > 0 ? INFINITY : 0.0);
    if (!tol_ok(&e, c.tol[i])) c.ok = 0;
    if (ratio > worst) {
      worst = ratio;
      snprintf(c.worst, sizeof c.worst, "%s", compared_names[i]);
    }
  }
  return c;
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

attn_status h_time(attn_ctx *ctx, h_oracle *o, const char *impl, const char *config, int warmup,
                   int reps, double min_seconds, double *median_us, int *runs) {
  *median_us = 0.0;
  *runs = 0;
  h_data *d = &o->data;
  const int backward = o->backward;
  plan_run r;
  attn_status st = plan_open(ctx, d, impl, config, backward, &r);
  for (int i = 0; st == ATTN_STATUS_OK && i < warmup; ++i) st = plan_pass(ctx, &r, d, backward);
  int cap = reps > 16 ? reps : 16, n = 0;
  double *times = malloc((size_t)cap * sizeof *times);
  if (st == ATTN_STATUS_OK && times == NULL)
    st = attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory for the timings");
  double start = now_us();
  while (st == ATTN_STATUS_OK && (n < reps || now_us() - start < min_seconds * 1e6)) {
    if (n == cap) {
      double *more = realloc(times, 2 * (size_t)cap * sizeof *times);
      if (more == NULL) {
        st = attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory for the timings");
        break;
      }
      times = more;
      cap *= 2;
    }
    double t0 = now_us();
    st = plan_pass(ctx, &r, d, backward);
    times[n++] = now_us() - t0;
  }
  if (st == ATTN_STATUS_OK && n > 0) {
    qsort(times, (size_t)n, sizeof *times, compare_double);
    *median_us = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
    *runs = n;
  }
  free(times);
  plan_close(&r, d);
  return st;
}

double h_flops(const attn_problem *p, int backward) {
  /* Visible (i, j) pairs of one (b, h) under causal/window masks, bottom-right or top-left. */
  int64_t tq = p->seqlen_q, tk = p->seqlen_k;
  int64_t o = p->align == ATTN_ALIGN_BOTTOM_RIGHT ? tk - tq : 0;
  int64_t left = p->window_left, right = p->causal ? 0 : p->window_right;
  double pairs = 0.0;
  for (int64_t i = 0; i < tq; ++i) {
    int64_t lo = left < 0 ? 0 : i + o - left, hi = right < 0 ? tk - 1 : i + o + right;
    if (lo < 0) lo = 0;
    if (hi > tk - 1) hi = tk - 1;
    if (hi >= lo) pairs += (double)(hi - lo + 1);
  }
  int64_t dv = p->head_dim_v > 0 ? p->head_dim_v : p->head_dim;
  double fwd = 2.0 * (double)p->batch * (double)p->heads_q * pairs * (double)(p->head_dim + dv);
  return backward ? 3.5 * fwd : fwd;
}

double h_kv_bytes(const attn_problem *p) {
  const int64_t tq = p->seqlen_q, tk = p->seqlen_k;
  const int64_t o = p->align == ATTN_ALIGN_BOTTOM_RIGHT ? tk - tq : 0;
  const int64_t left = p->window_left, right = p->causal ? 0 : p->window_right;
  int64_t lo = left < 0 ? 0 : o - left, hi = right < 0 ? tk : o + tq - 1 + right + 1;
  if (lo < 0) lo = 0;
  if (hi > tk) hi = tk;
  const int64_t keys = hi > lo ? hi - lo : 0;
  const int64_t dv = p->head_dim_v > 0 ? p->head_dim_v : p->head_dim;
  return (double)p->batch * (double)p->heads_kv * (double)keys * (double)(p->head_dim + dv) *
         (double)attn_dtype_size((attn_dtype)p->dtype);
}
