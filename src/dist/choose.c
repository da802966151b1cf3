/*
 * src/dist/choose.c - strategy AUTO: the ring or all-to-all, picked by measuring on the mesh.
 *
 * The executor's chain, for a sequence-split problem both strategies can run: the context's memory
 * cache, then the cache file, then (when the policy autotunes on a miss) both strategies timed on
 * scratch shards by every rank (in the problem's memory, host or GPU), then the heuristic (the
 * ring). The cache key holds what decides the
 * answer: the device fingerprint, the block implementation, the pass, the threads, the problem and
 * the mesh (axes, layout, ranks), so a result measured on 2 ranks is never used for 4. Every rank
 * must take the same strategy, so the ranks agree through one allgather of their cache answers and
 * one of their timings (the slowest rank's time counts).
 */
#include "dist/dist.h"

#include "core/ctx.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/gpu.h"
#include "plan/exec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *strategy_name(int32_t s) {
  return s == ATTN_DIST_STRATEGY_ALL_TO_ALL ? "alltoall" : "ring";
}

/* "fingerprint \t dist:1,<impl> \t pass \t threads \t problem mesh=seq4:zigzag,batch2 ranks=8" */
static void make_key(attn_dist_plan *plan, const attn_policy *policy, char *key, size_t size) {
  char fp[512], problem[1024], mesh[256] = "";
  attn_device_fingerprint(plan->global.device, plan->global.device_index, fp, sizeof fp);
  attn_problem_key(&plan->global, problem, sizeof problem);
  static const char *const dims[] = {"none", "batch", "heads", "seq"};
  int32_t ranks = 1;
  for (int a = 0; a < plan->spec.num_axes; ++a) {
    size_t used = strlen(mesh);
    snprintf(mesh + used, sizeof mesh - used, "%s%s%d", a ? "," : "", dims[plan->spec.axis_dim[a]],
             (int)plan->spec.axis_size[a]);
    ranks *= plan->spec.axis_size[a];
  }
  attn_format(key, size, "%s\tdist:1,%s\t%s\tt%d\t%s mesh=%s:%s ranks=%d", fp,
              attn_plan_impl_name(plan->block_plan), policy->tune_backward ? "fwd+bwd" : "fwd",
              (int)plan->ctx->num_threads, problem, mesh,
              plan->layout == ATTN_DIST_LAYOUT_ZIGZAG ? "zigzag" : "contiguous", (int)ranks);
}

/* ---- scratch shards -------------------------------------------------------------------------- */

/* The tensors of one rank's shard, in the problem's memory: host, or the GPU of a CUDA problem
 * (made on the host, uploaded). */
typedef struct shards {
  void *mem[16];
  int count;
  int device; /* -1: host memory; else the GPU's index */
  attn_inputs in;
  attn_outputs out;
  attn_tensor dout;
  attn_grads grads;
} shards;

static void *scratch_tensor(shards *s, attn_dtype dt, int64_t n, double value, int random) {
  const size_t es = attn_dtype_size(dt), bytes = (size_t)(n > 0 ? n : 1) * es;
  void *p = malloc(bytes);
  if (p == NULL) return NULL;
  uint32_t state = 12345u + (uint32_t)s->count;
  for (int64_t i = 0; i < n; ++i) {
    state = state * 1664525u + 1013904223u;
    const double v = random ? ((double)(state >> 8) / 16777216.0 - 0.5) : value;
    attn_store(p, dt, i, v);
  }
  if (s->device >= 0) {
    const attn_gpu_ops *gpu = attn_gpu();
    void *d = NULL;
    char why[256];
    const int ok = gpu != NULL && gpu->alloc(s->device, bytes, &d, why, sizeof why) ==
                                      ATTN_STATUS_OK;
    if (ok && gpu->upload(s->device, d, p, bytes, why, sizeof why) != ATTN_STATUS_OK)
      gpu->release(s->device, d), d = NULL;
    free(p);
    p = ok ? d : NULL;
    if (p == NULL) return NULL;
  }
  s->mem[s->count++] = p;
  return p;
}

static void free_shards(shards *s) {
  const attn_gpu_ops *gpu = s->device >= 0 ? attn_gpu() : NULL;
  for (int i = 0; i < s->count; ++i) {
    if (s->device < 0)
      free(s->mem[i]);
    else if (gpu != NULL)
      gpu->release(s->device, s->mem[i]);
  }
  s->count = 0;
}

/* Local shards of the plan's problem with small random values (masks keep everything, segment
 * ids are one segment). */
static int make_shards(const attn_dist_plan *plan, shards *s) {
  const attn_problem *l = &plan->local;
  const attn_dtype dt = (attn_dtype)l->dtype, st = attn_stat_dtype(dt);
  const int64_t B = l->batch, Tq = l->seqlen_q, Tk = l->seqlen_k, Hq = l->heads_q,
                Hkv = l->heads_kv;
  const int64_t D = l->head_dim, Dv = l->head_dim_v;
  memset(s, 0, sizeof *s);
  s->device = l->device == ATTN_DEVICE_CPU ? -1 : l->device_index;
  attn_inputs_init(&s->in);
  attn_outputs_init(&s->out);
  attn_grads_init(&s->grads);
  void *q = scratch_tensor(s, dt, B * Tq * Hq * D, 0, 1),
       *k = scratch_tensor(s, dt, B * Tk * Hkv * D, 0, 1);
  void *v = scratch_tensor(s, dt, B * Tk * Hkv * Dv, 0, 1),
       *out = scratch_tensor(s, dt, B * Tq * Hq * Dv, 0, 0);
  void *lse = scratch_tensor(s, st, B * Hq * Tq, 0, 0),
       *dout = scratch_tensor(s, dt, B * Tq * Hq * Dv, 0, 1);
  void *dq = scratch_tensor(s, dt, B * Tq * Hq * D, 0, 0),
       *dk = scratch_tensor(s, dt, B * Tk * Hkv * D, 0, 0);
  void *dv = scratch_tensor(s, dt, B * Tk * Hkv * Dv, 0, 0);
  if (dv == NULL || q == NULL || k == NULL || v == NULL || out == NULL || lse == NULL ||
      dout == NULL || dq == NULL || dk == NULL)
    return 0;
  s->in.q = attn_tensor_dense(q), s->in.k = attn_tensor_dense(k), s->in.v = attn_tensor_dense(v);
  s->out.out = attn_tensor_dense(out), s->out.lse = attn_tensor_dense(lse);
  s->dout = attn_tensor_dense(dout);
  s->grads.dq = attn_tensor_dense(dq), s->grads.dk = attn_tensor_dense(dk),
  s->grads.dv = attn_tensor_dense(dv);
  if (l->has_bias) {
    const int64_t *b = l->bias_shape;
    void *p = scratch_tensor(s, (attn_dtype)l->bias_dtype, b[0] * b[1] * b[2] * b[3], 0, 1);
    if (p == NULL) return 0;
    s->in.bias = attn_tensor_dense(p);
  }
  if (l->has_mask) {
    const int64_t *m = l->mask_shape;
    void *p = scratch_tensor(s, ATTN_DTYPE_U8, m[0] * m[1] * m[2] * m[3], 1, 0);
    if (p == NULL) return 0;
    s->in.mask = attn_tensor_dense(p);
  }
  if (l->alibi != ATTN_ALIBI_NONE) {
    void *p = scratch_tensor(s, st, (l->alibi == ATTN_ALIBI_PER_BATCH_HEAD ? B : 1) * Hq, 0.1, 0);
    if (p == NULL) return 0;
    s->in.alibi_slopes = attn_tensor_dense(p);
  }
  if (l->num_sinks > 0) {
    void *p = scratch_tensor(s, st, (l->sinks_shared ? 1 : Hq) * l->num_sinks, 0, 1);
    if (p == NULL) return 0;
    s->in.sinks = attn_tensor_dense(p);
  }
  if (l->has_segment_ids) {
    void *a = scratch_tensor(s, ATTN_DTYPE_I32, B * Tq, 0, 0),
         *b = scratch_tensor(s, ATTN_DTYPE_I32, B * Tk, 0, 0);
    if (a == NULL || b == NULL) return 0;
    s->in.q_segment_ids = attn_tensor_dense(a), s->in.kv_segment_ids = attn_tensor_dense(b);
  }
  return 1;
}

/* Median seconds of a run (forward, or forward + backward) of the plan as it stands, until its
 * GPU work is done; < 0 when a run failed (every rank still takes part in the same number of
 * runs, so nobody waits). */
static double time_runs(attn_dist_plan *plan, shards *s, int backward, int runs) {
  double times[8];
  int ok = 1;
  char why[256];
  for (int r = 0; r <= runs && r < 8; ++r) {
    const double t0 = attn_dist_now();
    ok &= attn_dist_plan_forward(plan, &s->in, &s->out) == ATTN_STATUS_OK;
    if (backward)
      ok &= attn_dist_plan_backward(plan, &s->in, &s->out, &s->dout, &s->grads) == ATTN_STATUS_OK;
    if (s->device >= 0 && plan->dev != NULL)
      ok &= plan->dev->stream_sync(s->device, plan->stream, why, sizeof why) == ATTN_STATUS_OK;
    times[r] = attn_dist_now() - t0;
    if (!ok || plan->broken) return -1.0;
  }
  /* times[0] was the warm-up (scratch allocation); the median of the rest, runs <= 7. */
  for (int i = 1; i <= runs; ++i)
    for (int j = i + 1; j <= runs; ++j)
      if (times[j] < times[i]) {
        double t = times[i];
        times[i] = times[j], times[j] = t;
      }
  return times[1 + (runs - 1) / 2];
}

attn_status attn_dist_choose_strategy(attn_dist_plan *plan, const attn_select *select) {
  attn_ctx *ctx = plan->ctx;
  attn_exec *e = attn_exec_get(ctx);
  if (e == NULL) return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory");
  const attn_policy *policy = &e->policy;
  char why[512] = "";

  /* The key names the block implementation, so the ring's plan is made first. */
  attn_dist_set_strategy(plan, ATTN_DIST_STRATEGY_RING);
  attn_status status = attn_dist_make_sub_plans(plan, select);
  if (status != ATTN_STATUS_OK) return status;
  char key[ATTN_KEY_SIZE], path[4096];
  make_key(plan, policy, key, sizeof key);
  int32_t mine = 0; /* 0: no answer; else the cached strategy */
  const attn_cache_entry *hit = attn_cache_table_find(&e->memory, key);
  attn_exec_cache_path(ctx, path, sizeof path);
  if (hit == NULL && path[0] != '\0') {
    attn_cache_file_refresh(ctx, &e->disk, path);
    hit = attn_cache_table_find(&e->disk.table, key);
    if (hit != NULL) attn_cache_table_put(&e->memory, hit);
  }
  if (hit != NULL)
    mine = strcmp(hit->config, "alltoall") == 0 ? ATTN_DIST_STRATEGY_ALL_TO_ALL
                                                : ATTN_DIST_STRATEGY_RING;

  int32_t *answers = calloc((size_t)plan->ops->size(plan->world), sizeof *answers);
  if (answers == NULL) return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory");
  status = (attn_status)plan->ops->allgather(plan->world, &mine, answers, sizeof mine,
                                             plan->spec.timeout_seconds, why, sizeof why);
  int32_t agreed = answers[0];
  for (int32_t r = 1; r < plan->ops->size(plan->world); ++r)
    if (answers[r] != agreed) agreed = 0;
  free(answers);
  if (status != ATTN_STATUS_OK) {
    plan->broken = 1;
    return attn_fail(ctx, status, "the strategy's cache check: %s", why);
  }
  if (agreed != 0) {
    attn_log(ctx, ATTN_LOG_LEVEL_INFO, "dist: cache hit: strategy %s", strategy_name(agreed));
  } else if (policy->allow_autotune && policy->on_miss == ATTN_ON_MISS_AUTOTUNE) {
    /* Both strategies on scratch shards; every rank runs both, whatever its own times. */
    shards s;
    int have = make_shards(plan, &s);
    double t[2] = {-1.0, -1.0};
    if (have) t[0] = time_runs(plan, &s, policy->tune_backward, 3);
    attn_dist_free_sub_plans(plan);
    attn_dist_set_strategy(plan, ATTN_DIST_STRATEGY_ALL_TO_ALL);
    status = attn_dist_make_sub_plans(plan, select);
    if (status == ATTN_STATUS_OK && have) t[1] = time_runs(plan, &s, policy->tune_backward, 3);
    free_shards(&s);
    /* The slowest rank's time decides; a failure anywhere (< 0) rules that strategy out. */
    const int32_t n = plan->ops->size(plan->world);
    double *all = calloc((size_t)n * 2, sizeof *all);
    if (all == NULL) return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory");
    attn_status gs = (attn_status)plan->ops->allgather(plan->world, t, all, sizeof t,
                                                       plan->spec.timeout_seconds, why, sizeof why);
    double worst[2] = {0.0, 0.0};
    for (int32_t r = 0; r < n; ++r)
      for (int k = 0; k < 2; ++k)
        worst[k] = all[2 * r + k] < 0 || worst[k] < 0 ? -1.0 : fmax(worst[k], all[2 * r + k]);
    free(all);
    if (gs != ATTN_STATUS_OK) {
      plan->broken = 1;
      return attn_fail(ctx, gs, "the strategy's timing exchange: %s", why);
    }
    if (worst[0] >= 0 || worst[1] >= 0) {
      agreed = worst[1] >= 0 && (worst[0] < 0 || worst[1] < worst[0])
                   ? ATTN_DIST_STRATEGY_ALL_TO_ALL
                   : ATTN_DIST_STRATEGY_RING;
      attn_log(ctx, ATTN_LOG_LEVEL_INFO, "dist: autotuned: ring %.3f ms, all-to-all %.3f ms: %s",
               1e3 * worst[0], 1e3 * worst[1], strategy_name(agreed));
      attn_cache_entry entry;
      memset(&entry, 0, sizeof entry);
      entry.key = key;
      snprintf(entry.impl, sizeof entry.impl, "dist");
      entry.impl_version = 1;
      snprintf(entry.config, sizeof entry.config, "%s", strategy_name(agreed));
      entry.time_us = 1e6 * worst[agreed == ATTN_DIST_STRATEGY_ALL_TO_ALL ? 1 : 0];
      attn_cache_table_put(&e->memory, &entry);
      /* One writer per cache file is enough; the others' files are theirs (other hosts). The
       * file is locked and merged, so ranks sharing one lose nothing either way. */
      if (policy->persist && path[0] != '\0') {
        attn_cache_table one = {&entry, 1, 1};
        attn_cache_write(ctx, path, &one);
      }
    }
    if (status != ATTN_STATUS_OK)
      attn_succeed(ctx); /* the all-to-all plan failing only rules it out */
    /* A measuring run whose transfer failed leaves the peers' state unknown: no plan is handed
     * back broken (every rank's exchange failed or timed out alike). */
    if (plan->broken) {
      char cause[512];
      snprintf(cause, sizeof cause, "%s", attn_ctx_last_error(ctx));
      return attn_fail(ctx, ATTN_STATUS_IO_ERROR,
                       "strategy AUTO: a measuring run's transfer failed, the peers' state is "
                       "unknown (%s)",
                       cause);
    }
  }
  if (agreed == 0) agreed = ATTN_DIST_STRATEGY_RING; /* heuristic */
  if (plan->strategy != agreed) {
    attn_dist_free_sub_plans(plan);
    attn_dist_set_strategy(plan, agreed);
    status = attn_dist_make_sub_plans(plan, select);
    if (status != ATTN_STATUS_OK) return status;
  }
  /* The memory of the strategy not taken (the measuring runs made it) */
  if (agreed == ATTN_DIST_STRATEGY_RING)
    attn_dist_ulysses_release(plan);
  else
    attn_dist_device_release(plan);
  memset(&plan->stats, 0, sizeof plan->stats);
  return ATTN_STATUS_OK;
}
