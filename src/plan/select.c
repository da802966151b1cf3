/*
 * src/plan/select.c - the executor: how attn_plan_create picks an implementation and configuration.
 *
 * The chain (attn.h, "Executor"), modelled on FFTW's planner with wisdom and cuDNN's plan cache:
 *   candidates -> explicit choice -> memory cache -> cache file -> autotune -> heuristics.
 * It fixes three defects of ejKernel's executor: user choices and heuristic guesses are never
 * written to the cache file as if measured (only autotune results are); a user's configuration is
 * honoured on every path, because it restricts the candidates before any cache or heuristic is
 * consulted; and the cache file is re-read whenever it changes, not once per process.
 *
 * Keys hold everything that changes which candidate wins: the device fingerprint, the candidate
 * implementations with their versions (so a new or changed implementation invalidates old results
 * instead of hiding behind them), the pass timed, the thread setting and the canonical problem.
 */
#define _POSIX_C_SOURCE 200809L
#include "plan/exec.h"

#include "core/ctx.h"
#include "core/device.h"
#include "core/dtype.h"
#include "plan/registry.h"
#include "plan/validate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- per-context state, policy, events ------------------------------------------------------- */

attn_exec *attn_exec_get(attn_ctx *ctx) {
  if (ctx->exec == NULL) {
    attn_exec *e = calloc(1, sizeof *e);
    if (e == NULL) return NULL;
    attn_policy_init(&e->policy);
    ctx->exec = e;
  }
  return ctx->exec;
}

void attn_exec_destroy(attn_exec *e) {
  if (e == NULL) return;
  attn_cache_table_free(&e->memory);
  attn_cache_file_free(&e->disk);
  free(e);
}

void attn_ctx_exec_free(struct attn_exec *exec) { attn_exec_destroy(exec); }

void attn_policy_init(attn_policy *p) {
  if (p == NULL) return;
  memset(p, 0, sizeof *p);
  p->allow_autotune = 1;
  p->on_miss = ATTN_ON_MISS_HEURISTICS;
  p->tune_backward = 0;
  p->warmup_iters = 5;
  p->measure_iters = 100;
  p->max_seconds = 2.0;
  p->persist = 1;
  p->cache_path = NULL;
  /* A switch for deployments (like BLIS's configuration variable): ATTN_AUTOTUNE=1 measures on a
   * miss, ATTN_AUTOTUNE=0 forbids measuring. */
  const char *env = getenv("ATTN_AUTOTUNE");
  if (env != NULL && strcmp(env, "1") == 0) p->on_miss = ATTN_ON_MISS_AUTOTUNE;
  if (env != NULL && strcmp(env, "0") == 0) p->allow_autotune = 0;
}

#define INVALID(...) attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, __VA_ARGS__)

attn_status attn_ctx_set_policy(attn_ctx *ctx, const attn_policy *policy) {
  if (ctx == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  if (policy == NULL) return INVALID("policy is NULL");
  const attn_policy *p = policy;
  if (p->allow_autotune != 0 && p->allow_autotune != 1)
    return INVALID("policy.allow_autotune=%d must be 0 or 1", (int)p->allow_autotune);
  if (p->on_miss < 0 || p->on_miss >= ATTN_ON_MISS_COUNT)
    return INVALID("policy.on_miss=%d is not an attn_on_miss (0..%d)", (int)p->on_miss,
                   ATTN_ON_MISS_COUNT - 1);
  if (p->tune_backward != 0 && p->tune_backward != 1)
    return INVALID("policy.tune_backward=%d must be 0 or 1", (int)p->tune_backward);
  if (p->warmup_iters < 0)
    return INVALID("policy.warmup_iters=%d must be >= 0", (int)p->warmup_iters);
  if (p->measure_iters < 1)
    return INVALID("policy.measure_iters=%d must be >= 1", (int)p->measure_iters);
  if (!(p->max_seconds > 0.0) || !isfinite(p->max_seconds))
    return INVALID("policy.max_seconds=%g must be finite and > 0", p->max_seconds);
  if (p->persist != 0 && p->persist != 1)
    return INVALID("policy.persist=%d must be 0 or 1", (int)p->persist);
  attn_exec *e = attn_exec_get(ctx);
  if (e == NULL) return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory");
  size_t n = p->cache_path != NULL ? strlen(p->cache_path) : 0;
  if (n >= sizeof e->cache_path)
    return INVALID("policy.cache_path is %zu characters long: at most %zu are allowed", n,
                   sizeof e->cache_path - 1);
  const char *path = p->cache_path;
  e->policy = *p;
  if (path != NULL) {
    memmove(e->cache_path, path, n); /* path may be the buffer itself */
    e->cache_path[n] = '\0';
    e->policy.cache_path = e->cache_path;
  }
  return attn_succeed(ctx);
}

attn_status attn_ctx_get_policy(const attn_ctx *ctx, attn_policy *policy) {
  if (ctx == NULL || policy == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  if (ctx->exec == NULL)
    attn_policy_init(policy);
  else
    *policy = ctx->exec->policy;
  return ATTN_STATUS_OK;
}

attn_status attn_ctx_set_event_callback(attn_ctx *ctx, attn_event_fn fn, void *user) {
  if (ctx == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  attn_exec *e = attn_exec_get(ctx);
  if (e == NULL) return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory");
  e->event_fn = fn;
  e->event_user = user;
  return attn_succeed(ctx);
}

/* Sends one event to the callback (when installed). */
static void emit(attn_ctx *ctx, attn_event_kind kind, const char *problem, const char *impl,
                 const char *config, double time_us, attn_status status, int32_t index,
                 int32_t count, const char *message) {
  attn_exec *e = ctx->exec;
  if (e == NULL || e->event_fn == NULL) return;
  attn_event ev;
  memset(&ev, 0, sizeof ev);
  ev.kind = kind;
  ev.problem = problem ? problem : "";
  ev.impl = impl ? impl : "";
  ev.config = config ? config : "";
  ev.time_us = time_us;
  ev.status = status;
  ev.index = index;
  ev.count = count;
  ev.message = message ? message : "";
  e->event_fn(e->event_user, &ev);
}

void attn_exec_report_failure(attn_ctx *ctx, attn_status status, const char *message) {
  if (ctx == NULL) return;
  attn_log(ctx, ATTN_LOG_LEVEL_WARNING, "%s", message);
  attn_exec *e = attn_exec_get(ctx);
  if (e == NULL) return;
  snprintf(e->last_failure, sizeof e->last_failure, "%s", message);
  emit(ctx, ATTN_EVENT_KIND_FAILURE, "", "", "", 0.0, status, 0, 0, message);
}

void attn_exec_cache_path(attn_ctx *ctx, char *buf, size_t size) {
  attn_exec *e = attn_exec_get(ctx);
  const char *path = e != NULL ? e->policy.cache_path : NULL;
  buf[0] = '\0';
  if (path != NULL) {
    attn_format(buf, size, "%s", path);
    return;
  }
  const char *env = getenv("ATTN_CACHE_PATH");
  if (env != NULL) {
    attn_format(buf, size, "%s", env);
    return;
  }
  const char *xdg = getenv("XDG_CACHE_HOME");
  if (xdg != NULL && xdg[0] == '/') { /* the XDG spec ignores relative values */
    attn_format(buf, size, "%s/libattn/cache.txt", xdg);
    return;
  }
  const char *home = getenv("HOME");
  if (home != NULL && home[0] != '\0') attn_format(buf, size, "%s/.cache/libattn/cache.txt", home);
}

/* ---- platforms and mechanism names ----------------------------------------------------------- */

const char *attn_platform_name(attn_platform platform) {
  switch (platform) {
  case ATTN_PLATFORM_AUTO: return "auto";
  case ATTN_PLATFORM_REF: return "ref";
  case ATTN_PLATFORM_CPU: return "cpu";
  case ATTN_PLATFORM_CUDA: return "cuda";
  case ATTN_PLATFORM_CUDNN: return "cudnn";
  case ATTN_PLATFORM_COUNT: break;
  }
  return "unknown";
}

attn_platform attn_impl_platform_of(const attn_impl *impl) {
  /* Implementations are named after their platform ("cpu", "cuda_fa2", "cudnn"); the longest
   * prefix decides, so "cudnn" is not taken for "cuda". */
  static const struct {
    const char *prefix;
    attn_platform platform;
  } prefixes[] = {{"cudnn", ATTN_PLATFORM_CUDNN},
                  {"cuda", ATTN_PLATFORM_CUDA},
                  {"cpu", ATTN_PLATFORM_CPU},
                  {"ref", ATTN_PLATFORM_REF}};
  for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; ++i)
    if (strncmp(impl->name, prefixes[i].prefix, strlen(prefixes[i].prefix)) == 0)
      return prefixes[i].platform;
  return impl->device == ATTN_DEVICE_CUDA ? ATTN_PLATFORM_CUDA : ATTN_PLATFORM_CPU;
}

attn_status attn_select_mechanism(attn_ctx *ctx, const char *name, attn_problem *problem,
                                  attn_select *select) {
  if (ctx == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  if (name == NULL) return INVALID("name is NULL: a mechanism name is required");
  if (select == NULL) return INVALID("select is NULL");
  int op = -1;
  attn_platform platform;
  if (strcmp(name, "vanilla") == 0)
    platform = ATTN_PLATFORM_REF;
  else if (strcmp(name, "sdpa") == 0)
    op = ATTN_OPERATION_SCALED_DOT_PRODUCT_ATTENTION, platform = ATTN_PLATFORM_AUTO;
  else if (strcmp(name, "flash") == 0)
    op = ATTN_OPERATION_FLASH_ATTENTION, platform = ATTN_PLATFORM_AUTO;
  else if (strcmp(name, "cudnn") == 0)
    platform = ATTN_PLATFORM_CUDNN;
  else if (strcmp(name, "ref") == 0)
    platform = ATTN_PLATFORM_REF;
  else if (strcmp(name, "cpu") == 0)
    platform = ATTN_PLATFORM_CPU;
  else if (strcmp(name, "cuda") == 0)
    platform = ATTN_PLATFORM_CUDA;
  else if (strcmp(name, "auto") == 0)
    platform = ATTN_PLATFORM_AUTO;
  else
    return INVALID("name=\"%s\" is not a mechanism: use vanilla, sdpa, flash, cudnn, or a platform "
                   "(auto, ref, cpu, cuda)",
                   name);
  if (op >= 0) {
    if (problem == NULL)
      return INVALID("problem is NULL: mechanism \"%s\" sets problem->operation", name);
    problem->operation = op;
  }
  select->platform = platform;
  return attn_succeed(ctx);
}

/* ---- registry queries -------------------------------------------------------------------------- */

static const attn_impl *impl_at(int32_t index) {
  int32_t count;
  const attn_impl *const *list = attn_registry(&count);
  return index >= 0 && index < count ? list[index] : NULL;
}

int32_t attn_impl_platform(int32_t index) {
  const attn_impl *impl = impl_at(index);
  return impl ? (int32_t)attn_impl_platform_of(impl) : -1;
}

int32_t attn_impl_device(int32_t index) {
  const attn_impl *impl = impl_at(index);
  return impl ? impl->device : -1;
}

int32_t attn_impl_version(int32_t index) {
  const attn_impl *impl = impl_at(index);
  return impl ? impl->version : -1;
}

/* The named implementation and the resolved problem, when it can run it. */
static attn_status find_supporting(attn_ctx *ctx, const char *name, const attn_problem *problem,
                                   const attn_impl **impl, attn_problem *resolved) {
  attn_status status = attn_validate_problem(ctx, problem, resolved);
  if (status != ATTN_STATUS_OK) return status;
  if (name == NULL) return INVALID("name is NULL: an implementation name is required");
  *impl = attn_registry_find(name);
  if (*impl == NULL)
    return INVALID("name=\"%s\" is not a registered implementation (attn_impl_name lists them)",
                   name);
  char why[ATTN_MESSAGE_SIZE] = "";
  if ((*impl)->device != resolved->device) {
    attn_device_mismatch((*impl)->device, resolved, why, sizeof why);
    return attn_fail(ctx, ATTN_STATUS_UNSUPPORTED, "%s: %s", name, why);
  }
  if ((*impl)->supports(resolved, why, sizeof why) != ATTN_STATUS_OK)
    return attn_fail(ctx, ATTN_STATUS_UNSUPPORTED, "%s: %s", name, why);
  return ATTN_STATUS_OK;
}

attn_status attn_impl_config_count(attn_ctx *ctx, const char *name, const attn_problem *problem,
                                   int32_t *count) {
  if (ctx == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  if (count == NULL) return INVALID("count is NULL");
  const attn_impl *impl;
  attn_problem p;
  attn_status status = find_supporting(ctx, name, problem, &impl, &p);
  if (status != ATTN_STATUS_OK) return status;
  *count = impl->num_configs(&p);
  return attn_succeed(ctx);
}

attn_status attn_impl_config_name(attn_ctx *ctx, const char *name, const attn_problem *problem,
                                  int32_t index, char *buf, size_t size) {
  if (ctx == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  if (buf == NULL || size == 0) return INVALID("buf is NULL or size is 0");
  const attn_impl *impl;
  attn_problem p;
  attn_status status = find_supporting(ctx, name, problem, &impl, &p);
  if (status != ATTN_STATUS_OK) return status;
  int32_t n = impl->num_configs(&p);
  if (index < 0 || index >= n)
    return INVALID("index=%d is out of range: %s has %d configurations for this problem",
                   (int)index, name, (int)n);
  impl->config_name(&p, index, buf, size);
  return attn_succeed(ctx);
}

attn_status attn_impl_config_default(attn_ctx *ctx, const char *name, const attn_problem *problem,
                                     char *buf, size_t size) {
  if (ctx == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  if (buf == NULL || size == 0) return INVALID("buf is NULL or size is 0");
  const attn_impl *impl;
  attn_problem p;
  attn_status status = find_supporting(ctx, name, problem, &impl, &p);
  if (status != ATTN_STATUS_OK) return status;
  impl->config_name(&p, impl->default_config(&p), buf, size);
  return attn_succeed(ctx);
}

/* ---- the chain ------------------------------------------------------------------------------- */

typedef struct candidate {
  const attn_impl *impl;
  int32_t config;
  char name[ATTN_NAME_SIZE];
} candidate;

typedef struct candidates {
  candidate *items;
  int32_t count;
  int user_impl, user_config; /* which parts the caller chose */
} candidates;

/* Appends "; impl: why" to a list of reasons. */
static void add_reason(char *reasons, size_t size, const char *impl, const char *why) {
  size_t used = strlen(reasons);
  if (used + 1 < size)
    snprintf(reasons + used, size - used, "%s%s: %s", used ? "; " : "", impl, why);
}

/* Every (implementation, configuration) that matches select and supports the problem. */
static attn_status gather(attn_ctx *ctx, const attn_problem *p, const attn_select *sel,
                          int deterministic, candidates *out) {
  memset(out, 0, sizeof *out);
  const char *want_impl = sel ? sel->impl : NULL;
  const char *want_config = sel ? sel->config : NULL;
  int32_t platform = sel ? sel->platform : ATTN_PLATFORM_AUTO;
  int32_t backend = sel ? sel->backend : ATTN_BACKEND_ANY;
  if (platform < 0 || platform >= ATTN_PLATFORM_COUNT)
    return INVALID("select.platform=%d is not an attn_platform (0..%d)", (int)platform,
                   ATTN_PLATFORM_COUNT - 1);
  if (backend < 0 || backend >= ATTN_BACKEND_COUNT)
    return INVALID("select.backend=%d is not an attn_backend (0..%d)", (int)backend,
                   ATTN_BACKEND_COUNT - 1);
  if (want_impl != NULL && attn_registry_find(want_impl) == NULL)
    return INVALID("select.impl=\"%s\" is not a registered implementation (attn_impl_name lists "
                   "them)",
                   want_impl);
  out->user_impl = want_impl != NULL;
  out->user_config = want_config != NULL;

  int32_t count;
  const attn_impl *const *list = attn_registry(&count);
  int32_t total = 0;
  for (int32_t i = 0; i < count; ++i) total += list[i]->num_configs(p);
  out->items = calloc((size_t)(total > 0 ? total : 1), sizeof *out->items);
  if (out->items == NULL) return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory");

  char reasons[ATTN_MESSAGE_SIZE] = "";
  char why[ATTN_MESSAGE_SIZE];
  int config_missing = 0;
  for (int32_t i = 0; i < count; ++i) {
    const attn_impl *impl = list[i];
    if (want_impl != NULL && strcmp(impl->name, want_impl) != 0) continue;
    attn_platform plat = attn_impl_platform_of(impl);
    if (platform != ATTN_PLATFORM_AUTO && (int32_t)plat != platform) {
      attn_format(why, sizeof why, "platform %s is not select.platform=%s",
                  attn_platform_name(plat), attn_platform_name((attn_platform)platform));
      add_reason(reasons, sizeof reasons, impl->name, why);
      continue;
    }
    int gpu = impl->device == ATTN_DEVICE_CUDA;
    if ((backend == ATTN_BACKEND_CPU && gpu) || (backend == ATTN_BACKEND_GPU && !gpu)) {
      attn_format(why, sizeof why, "runs on the %s, not select.backend=%s", gpu ? "GPU" : "CPU",
                  backend == ATTN_BACKEND_CPU ? "cpu" : "gpu");
      add_reason(reasons, sizeof reasons, impl->name, why);
      continue;
    }
    if (impl->device != p->device) {
      attn_device_mismatch(impl->device, p, why, sizeof why);
      add_reason(reasons, sizeof reasons, impl->name, why);
      continue;
    }
    why[0] = '\0';
    if (impl->supports(p, why, sizeof why) != ATTN_STATUS_OK) {
      add_reason(reasons, sizeof reasons, impl->name, why);
      continue;
    }
    int32_t n = impl->num_configs(p), matched = 0, nondeterministic = 0;
    for (int32_t c = 0; c < n; ++c) {
      candidate *cand = &out->items[out->count];
      impl->config_name(p, c, cand->name, sizeof cand->name);
      if (want_config != NULL && strcmp(cand->name, want_config) != 0) continue;
      if (deterministic && want_config == NULL && impl->config_deterministic != NULL &&
          !impl->config_deterministic(p, c)) {
        ++nondeterministic; /* the policy asks for repeatable bits; the caller named none */
        continue;
      }
      cand->impl = impl;
      cand->config = c;
      ++out->count;
      ++matched;
    }
    if (!matched && nondeterministic > 0) {
      add_reason(reasons, sizeof reasons, impl->name,
                 "has only non-deterministic configurations (policy.deterministic=1)");
    } else if (!matched) {
      config_missing = 1;
      attn_format(why, sizeof why, "has no configuration \"%s\" for this problem", want_config);
      add_reason(reasons, sizeof reasons, impl->name, why);
    }
  }
  if (out->count > 0) return ATTN_STATUS_OK;
  if (want_impl != NULL && config_missing)
    return INVALID("select.config=\"%s\" is not a configuration of %s for this problem",
                   want_config, want_impl);
  if (config_missing)
    return INVALID("select.config=\"%s\" is not a configuration of any implementation that "
                   "supports the problem (%s)",
                   want_config, reasons);
  if (want_impl != NULL) return attn_fail(ctx, ATTN_STATUS_UNSUPPORTED, "%s", reasons);
  return attn_fail(ctx, ATTN_STATUS_UNSUPPORTED, "no implementation supports the problem (%s)",
                   reasons[0] ? reasons : "none is registered");
}

/* "fingerprint\tcandidates\tpass\tthreads\tproblem" */
static void make_key(attn_ctx *ctx, const attn_problem *p, const candidates *c,
                     const attn_policy *policy, const char *problem, char *key, size_t size) {
  char fp[512], impls[512] = "";
  attn_device_fingerprint(p->device, p->device_index, fp, sizeof fp);
  const attn_impl *last = NULL;
  for (int32_t i = 0; i < c->count; ++i) {
    if (c->items[i].impl == last) continue;
    last = c->items[i].impl;
    size_t used = strlen(impls);
    snprintf(impls + used, sizeof impls - used, "%s%s:%d", used ? "," : "", last->name,
             (int)last->version);
  }
  if (c->user_config) {
    size_t used = strlen(impls);
    snprintf(impls + used, sizeof impls - used, "|config=%s", c->items[0].name);
  }
  /* A deterministic policy times fewer candidates, so its result is kept under its own key. */
  attn_format(key, size, "%s\t%s\t%s%s\tt%d\t%s", fp, impls,
              policy->tune_backward ? "fwd+bwd" : "fwd", policy->deterministic ? "+det" : "",
              (int)ctx->num_threads, problem);
}

/* The candidate a cache entry names, if it is still one (same implementation version). */
static const candidate *match_entry(const candidates *c, const attn_cache_entry *e) {
  if (e == NULL) return NULL;
  for (int32_t i = 0; i < c->count; ++i)
    if (strcmp(c->items[i].impl->name, e->impl) == 0 &&
        c->items[i].impl->version == e->impl_version && strcmp(c->items[i].name, e->config) == 0)
      return &c->items[i];
  return NULL;
}

/* Times every candidate; the fastest successful one, or NULL when none ran. */
static const candidate *autotune(attn_ctx *ctx, attn_exec *e, const attn_problem *p,
                                 const candidates *c, const char *problem, double *best_us) {
  char msg[ATTN_MESSAGE_SIZE];
  attn_format(msg, sizeof msg, "autotuning %d candidates (%s)", (int)c->count,
              e->policy.tune_backward ? "forward + backward" : "forward");
  attn_log(ctx, ATTN_LOG_LEVEL_INFO, "%s: %s", problem, msg);
  emit(ctx, ATTN_EVENT_KIND_TUNE_START, problem, "", "", 0.0, ATTN_STATUS_OK, 0, c->count, msg);
  attn_scratch *scratch = NULL;
  double probe;
  int injected = attn_tune_injected(NULL, NULL, problem, &probe);
  if (!injected) {
    /* (a GPU problem's scratch is device memory; UNSUPPORTED in a build without CUDA) */
    attn_status status = attn_scratch_create(p, e->policy.tune_backward && attn_has_backward(p),
                                              &scratch, msg, sizeof msg);
    if (status != ATTN_STATUS_OK) {
      attn_exec_report_failure(ctx, status, msg);
      return NULL;
    }
  }
  const candidate *best = NULL;
  for (int32_t i = 0; i < c->count; ++i) {
    const candidate *cand = &c->items[i];
    double us = 0.0;
    int32_t runs = 1;
    attn_status status = ATTN_STATUS_OK;
    char why[ATTN_MESSAGE_SIZE] = "";
    if (injected) {
      attn_tune_injected(cand->impl->name, cand->name, problem, &us);
      if (!(us >= 0.0)) {
        status = ATTN_STATUS_INTERNAL;
        attn_format(why, sizeof why, "the injected timing says it failed");
      }
    } else {
      status = attn_tune_measure(ctx, p, cand->impl, cand->config, &e->policy, scratch,
                                 best != NULL ? 5.0 * *best_us : 0.0, &us, &runs, why, sizeof why);
    }
    if (status == ATTN_STATUS_OK) {
      attn_format(msg, sizeof msg, "%s %s: %.3f us (median of %d runs)", cand->impl->name,
                  cand->name, us, (int)runs);
      if (best == NULL || us < *best_us) {
        best = cand;
        *best_us = us;
      }
    } else {
      attn_format(msg, sizeof msg, "%s %s failed: %s", cand->impl->name, cand->name, why);
    }
    attn_log(ctx, status == ATTN_STATUS_OK ? ATTN_LOG_LEVEL_DEBUG : ATTN_LOG_LEVEL_WARNING,
             "%s: %s", problem, msg);
    emit(ctx, ATTN_EVENT_KIND_TUNE_CANDIDATE, problem, cand->impl->name, cand->name, us, status, i,
         c->count, msg);
  }
  attn_scratch_destroy(scratch);
  if (best == NULL) {
    attn_format(msg, sizeof msg, "%s: every candidate failed to run; using heuristics", problem);
    attn_exec_report_failure(ctx, ATTN_STATUS_INTERNAL, msg);
    return NULL;
  }
  attn_format(msg, sizeof msg, "autotuned: %s %s (%.3f us)", best->impl->name, best->name,
              *best_us);
  attn_log(ctx, ATTN_LOG_LEVEL_INFO, "%s: %s", problem, msg);
  emit(ctx, ATTN_EVENT_KIND_TUNE_FINISH, problem, best->impl->name, best->name, *best_us,
       ATTN_STATUS_OK, 0, c->count, msg);
  return best;
}

/* The candidate of impl with its default configuration, or NULL when the policy left that one
 * out (or the default is out of range). */
static const candidate *default_of(const attn_problem *p, const candidates *c,
                                   const attn_impl *impl) {
  int32_t want = impl->default_config(p);
  for (int32_t i = 0; i < c->count; ++i)
    if (c->items[i].impl == impl && c->items[i].config == want) return &c->items[i];
  return NULL;
}

/* The caller's configuration; else the first implementation in registry order (cuDNN first for
 * scaled_dot_product_attention on platform AUTO: the vendor primitive is the natural engine of
 * that operation) whose default configuration is a candidate. An implementation whose default
 * the deterministic policy filtered out comes after those: its remaining configurations are
 * fallbacks, not its recommendation (cuDNN's deterministic backward keeps dS of every query and
 * key in its workspace, B * Hq * Tq * Tk * 2 bytes). Failing all that, the first candidate. */
static const candidate *heuristic(const attn_problem *p, const attn_select *sel,
                                  const candidates *c) {
  if (c->user_config) return &c->items[0];
  if (p->operation == ATTN_OPERATION_SCALED_DOT_PRODUCT_ATTENTION &&
      (sel == NULL || sel->platform == ATTN_PLATFORM_AUTO))
    for (int32_t i = 0; i < c->count; ++i)
      if (attn_impl_platform_of(c->items[i].impl) == ATTN_PLATFORM_CUDNN) {
        const candidate *d = default_of(p, c, c->items[i].impl);
        if (d != NULL) return d;
        break;
      }
  for (int32_t i = 0; i < c->count; ++i) {
    if (i > 0 && c->items[i].impl == c->items[i - 1].impl) continue;
    const candidate *d = default_of(p, c, c->items[i].impl);
    if (d != NULL) return d;
  }
  return &c->items[0];
}

attn_status attn_exec_select(attn_ctx *ctx, const attn_problem *p, const attn_select *sel,
                             const attn_impl **impl, int32_t *config) {
  attn_exec *e = attn_exec_get(ctx);
  if (e == NULL) return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory");
  candidates c;
  attn_status status = gather(ctx, p, sel, e->policy.deterministic, &c);
  if (status != ATTN_STATUS_OK) {
    free(c.items);
    return status;
  }
  char problem[1024], msg[ATTN_MESSAGE_SIZE];
  attn_problem_key(p, problem, sizeof problem);
  const candidate *pick = NULL;
  double us = 0.0;
  attn_event_kind kind;

  if (c.count == 1) {
    /* Nothing to choose: the caller's constraints, or the registry, leave one candidate. */
    pick = &c.items[0];
    kind = (c.user_impl || c.user_config) ? ATTN_EVENT_KIND_OVERRIDE : ATTN_EVENT_KIND_HEURISTIC;
    attn_format(msg, sizeof msg, "%s: %s %s",
                kind == ATTN_EVENT_KIND_OVERRIDE ? "caller's choice" : "the only candidate",
                pick->impl->name, pick->name);
  } else {
    char key[ATTN_KEY_SIZE], path[4096];
    make_key(ctx, p, &c, &e->policy, problem, key, sizeof key);
    const attn_cache_entry *hit = attn_cache_table_find(&e->memory, key);
    pick = match_entry(&c, hit);
    if (pick != NULL) {
      kind = ATTN_EVENT_KIND_CACHE_HIT_MEMORY;
      us = hit->time_us;
      attn_format(msg, sizeof msg, "cache hit (memory): %s %s", pick->impl->name, pick->name);
    }
    attn_exec_cache_path(ctx, path, sizeof path);
    if (pick == NULL && path[0] != '\0') {
      attn_cache_file_refresh(ctx, &e->disk, path);
      hit = attn_cache_table_find(&e->disk.table, key);
      pick = match_entry(&c, hit);
      if (pick != NULL) {
        kind = ATTN_EVENT_KIND_CACHE_HIT_DISK;
        us = hit->time_us;
        attn_cache_table_put(&e->memory, hit); /* promoted: the next plan need not stat the file */
        attn_format(msg, sizeof msg, "cache hit (%s): %s %s", path, pick->impl->name, pick->name);
      }
    }
    if (pick == NULL && e->policy.allow_autotune && e->policy.on_miss == ATTN_ON_MISS_AUTOTUNE) {
      pick = autotune(ctx, e, p, &c, problem, &us);
      if (pick != NULL) {
        kind = ATTN_EVENT_KIND_TUNE_FINISH; /* already reported */
        attn_cache_entry entry;
        memset(&entry, 0, sizeof entry);
        entry.key = key;
        snprintf(entry.impl, sizeof entry.impl, "%s", pick->impl->name);
        entry.impl_version = pick->impl->version;
        snprintf(entry.config, sizeof entry.config, "%s", pick->name);
        entry.time_us = us;
        attn_cache_table_put(&e->memory, &entry);
        if (e->policy.persist && path[0] != '\0') {
          attn_cache_table one = {&entry, 1, 1};
          attn_cache_write(ctx, path, &one); /* a failure is reported and survived */
        }
      }
    }
    if (pick == NULL) {
      pick = heuristic(p, sel, &c);
      kind = ATTN_EVENT_KIND_HEURISTIC;
      attn_format(msg, sizeof msg, "heuristic: %s %s", pick->impl->name, pick->name);
    }
  }
  if (kind != ATTN_EVENT_KIND_TUNE_FINISH) {
    attn_log(ctx, ATTN_LOG_LEVEL_DEBUG, "%s: %s", problem, msg);
    emit(ctx, kind, problem, pick->impl->name, pick->name, us, ATTN_STATUS_OK, 0, c.count, msg);
  }
  *impl = pick->impl;
  *config = pick->config;
  free(c.items);
  return ATTN_STATUS_OK;
}

/* ---- the cache's public calls ---------------------------------------------------------------- */

attn_status attn_cache_get_path(attn_ctx *ctx, char *buf, size_t size) {
  if (ctx == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  if (buf == NULL || size == 0) return INVALID("buf is NULL or size is 0");
  if (attn_exec_get(ctx) == NULL) return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory");
  attn_exec_cache_path(ctx, buf, size);
  return attn_succeed(ctx);
}

attn_status attn_cache_count(attn_ctx *ctx, int64_t *memory, int64_t *disk) {
  if (ctx == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  attn_exec *e = attn_exec_get(ctx);
  if (e == NULL) return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory");
  if (memory != NULL) *memory = e->memory.count;
  if (disk != NULL) {
    char path[4096];
    attn_exec_cache_path(ctx, path, sizeof path);
    *disk = 0;
    if (path[0] != '\0') {
      attn_cache_file_refresh(ctx, &e->disk, path);
      *disk = e->disk.table.count;
    }
  }
  return attn_succeed(ctx);
}

attn_status attn_cache_clear(attn_ctx *ctx) {
  if (ctx == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  if (ctx->exec != NULL) attn_cache_table_free(&ctx->exec->memory);
  return attn_succeed(ctx);
}

attn_status attn_cache_import(attn_ctx *ctx, const char *path) {
  if (ctx == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  if (path == NULL || path[0] == '\0')
    return INVALID("path is NULL or empty: a cache file is required");
  attn_exec *e = attn_exec_get(ctx);
  if (e == NULL) return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory");
  attn_cache_table t = {0};
  attn_status status = attn_cache_read(ctx, path, 1, &t);
  for (int64_t i = 0; status == ATTN_STATUS_OK && i < t.count; ++i)
    if (!attn_cache_table_put(&e->memory, &t.items[i])) status = ATTN_STATUS_OUT_OF_MEMORY;
  attn_cache_table_free(&t);
  if (status != ATTN_STATUS_OK)
    return attn_fail(ctx, status, "%s",
                     status == ATTN_STATUS_OUT_OF_MEMORY ? "out of memory" : e->last_failure);
  return attn_succeed(ctx);
}

attn_status attn_cache_export(attn_ctx *ctx, const char *path) {
  if (ctx == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  if (path == NULL || path[0] == '\0')
    return INVALID("path is NULL or empty: a cache file is required");
  attn_exec *e = attn_exec_get(ctx);
  if (e == NULL) return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory");
  char own[4096];
  attn_exec_cache_path(ctx, own, sizeof own);
  attn_cache_table all = {0};
  int ok = 1;
  if (own[0] != '\0' && strcmp(own, path) != 0) {
    attn_cache_file_refresh(ctx, &e->disk, own);
    for (int64_t i = 0; ok && i < e->disk.table.count; ++i)
      ok = attn_cache_table_put(&all, &e->disk.table.items[i]);
  }
  for (int64_t i = 0; ok && i < e->memory.count; ++i)
    ok = attn_cache_table_put(&all, &e->memory.items[i]);
  attn_status status = ok ? attn_cache_write(ctx, path, &all)
                          : attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory");
  attn_cache_table_free(&all);
  return status == ATTN_STATUS_OK ? attn_succeed(ctx) : status;
}
