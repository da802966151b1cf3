/*
 * tests/test_executor.c - the executor's chain through the public API: explicit choice, memory
 * cache, cache file, autotune, heuristics; the caller's configuration on every path; filters and
 * mechanism names; the canonical problem string. Fake implementations (fake_impls.h) and injected
 * timings make every expectation exact; one part measures for real with spinning fakes.
 */
#include "fake_impls.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- events and logs ------------------------------------------------------------------------- */

typedef struct recorder {
  int kinds[ATTN_EVENT_KIND_COUNT];
  int candidates_seen;
  char last_impl[128], last_config[128], last_message[1024];
  int warnings;
  char last_warning[1024];
} recorder;

static void on_event(void *user, const attn_event *ev) {
  recorder *r = user;
  if (ev->kind >= 0 && ev->kind < ATTN_EVENT_KIND_COUNT) r->kinds[ev->kind]++;
  if (ev->kind == ATTN_EVENT_KIND_TUNE_CANDIDATE) r->candidates_seen++;
  snprintf(r->last_impl, sizeof r->last_impl, "%s", ev->impl);
  snprintf(r->last_config, sizeof r->last_config, "%s", ev->config);
  snprintf(r->last_message, sizeof r->last_message, "%s", ev->message);
}

static void on_log(void *user, attn_log_level level, const char *message) {
  recorder *r = user;
  if (level == ATTN_LOG_LEVEL_WARNING) {
    r->warnings++;
    snprintf(r->last_warning, sizeof r->last_warning, "%s", message);
  }
}

static char tmpdir[256];

static void path_in_tmp(char *buf, size_t size, const char *name) {
  snprintf(buf, size, "%s/%s", tmpdir, name);
}

/* A context with a cache file in the test's folder and the given miss behaviour. */
static attn_ctx *make_ctx(const char *cache_name, int on_miss, recorder *rec) {
  attn_ctx *ctx;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) exit(2);
  attn_policy pol;
  attn_policy_init(&pol);
  char path[512] = "";
  if (cache_name != NULL) path_in_tmp(path, sizeof path, cache_name);
  pol.cache_path = path;
  pol.on_miss = on_miss;
  pol.warmup_iters = 1;
  pol.measure_iters = 5;
  if (attn_ctx_set_policy(ctx, &pol) != ATTN_STATUS_OK) exit(2);
  if (rec != NULL) {
    memset(rec, 0, sizeof *rec);
    attn_ctx_set_event_callback(ctx, on_event, rec);
    attn_ctx_set_log_callback(ctx, on_log, rec, ATTN_LOG_LEVEL_WARNING);
  }
  return ctx;
}

static attn_problem small_problem(int64_t seqlen) {
  attn_problem p;
  attn_problem_init(&p);
  p.batch = 1, p.heads_q = 2, p.heads_kv = 1, p.seqlen_q = seqlen, p.seqlen_k = seqlen;
  p.head_dim = 8;
  return p;
}

/* Makes a plan and returns "impl/config" in buf; "" on failure (status in *status). */
static attn_status plan_pick(attn_ctx *ctx, const attn_problem *p, const attn_select *sel,
                             char *buf, size_t size) {
  attn_plan *plan = NULL;
  attn_status status = attn_plan_create(ctx, p, sel, &plan);
  if (status == ATTN_STATUS_OK)
    snprintf(buf, size, "%s/%s", attn_plan_impl_name(plan), attn_plan_config_name(plan));
  else
    snprintf(buf, size, "(status %d: %s)", (int)status, attn_ctx_last_error(ctx));
  attn_plan_destroy(plan);
  return status;
}

static int file_exists(const char *name) {
  char path[512];
  path_in_tmp(path, sizeof path, name);
  struct stat st;
  return stat(path, &st) == 0;
}

static char *slurp(const char *name) {
  char path[512];
  path_in_tmp(path, sizeof path, name);
  size_t size;
  char *raw = tu_read_file(path, &size); /* not NUL-terminated */
  if (raw == NULL) return NULL;
  char *text = malloc(size + 1);
  memcpy(text, raw, size);
  text[size] = '\0';
  free(raw);
  return text;
}

/* Replaces the first occurrence of `from` by `to` in the cache file (same length or not). */
static int edit_file(const char *name, const char *from, const char *to) {
  char *text = slurp(name);
  if (text == NULL) return 0;
  char *at = strstr(text, from);
  if (at == NULL) {
    free(text);
    return 0;
  }
  size_t n = strlen(text) + strlen(to) + 1;
  char *out = malloc(n);
  snprintf(out, n, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
  /* A new inode and a later mtime, as a real writer's rename gives. */
  char path[512], tmp[600];
  path_in_tmp(path, sizeof path, name);
  snprintf(tmp, sizeof tmp, "%s.edit", path);
  FILE *f = fopen(tmp, "wb");
  fputs(out, f);
  fclose(f);
  rename(tmp, path);
  free(text);
  free(out);
  return 1;
}

/* ---- problem strings ------------------------------------------------------------------------- */

static void test_problem_strings(tu_rng *rng) {
  attn_ctx *ctx;
  attn_ctx_create(&ctx);
  static const char *canonical[] = {
      "b4 hq32 hkv8 sq4096 sk4096 d128 bf16 causal window=256,0 softcap=30 sinks=4",
      "b1 hq1 hkv1 sq0 sk0 d1 f32",
      "b2 hq6 hkv3 sq17 sk63 d64 dv32 f16 window=-1,5 align=tl scale=0.125 dropout=0.1",
      "b3 hq4 hkv2 sq5 sk7 d8 f64 bias=3x2x5x7:f64 mask=1x4x1x7 alibi=bh sinks=2:shared segments",
      "b2 hq4 hkv4 sq9 sk11 d16 bf16 bias=1x1x9x11 alibi=h varlen=packed:13,17 op=sdpa",
      "b2 hq4 hkv4 sq9 sk11 d16 f32 varlen=padded device=cuda:1",
      "b1 hq2 hkv2 sq3 sk3 d4 f32 softcap=0.30000000000000004 device=cuda",
  };
  for (size_t i = 0; i < sizeof canonical / sizeof canonical[0]; ++i) {
    attn_problem p;
    attn_status st = attn_problem_parse(ctx, canonical[i], &p);
    char back[1024];
    size_t n = attn_problem_to_string(&p, back, sizeof back);
    tu_check(st == ATTN_STATUS_OK && strcmp(back, canonical[i]) == 0 && n == strlen(back),
             "problem string round trip: \"%s\" -> \"%s\" (%s)", canonical[i], back,
             attn_ctx_last_error(ctx));
  }
  /* Random problems: to_string then parse gives back every field. */
  int mismatches = 0;
  for (int t = 0; t < 300; ++t) {
    attn_problem p;
    attn_problem_init(&p);
    p.operation = (int32_t)tu_int(rng, 0, 1);
    p.dtype = (int32_t)tu_int(rng, 0, 3);
    p.batch = tu_int(rng, 1, 9), p.heads_kv = tu_int(rng, 1, 4);
    p.heads_q = p.heads_kv * tu_int(rng, 1, 4);
    p.seqlen_q = tu_int(rng, 0, 5000), p.seqlen_k = tu_int(rng, 0, 5000);
    p.head_dim = tu_int(rng, 1, 256), p.head_dim_v = tu_int(rng, 0, 1) ? tu_int(rng, 1, 256) : 0;
    p.scale = tu_int(rng, 0, 1) ? tu_uniform(rng, 0.01, 2.0) : 0.0;
    p.causal = (int32_t)tu_int(rng, 0, 1);
    p.align = (int32_t)tu_int(rng, 0, 1);
    p.window_left = tu_int(rng, -1, 300), p.window_right = tu_int(rng, -1, 300);
    p.softcap = tu_int(rng, 0, 1) ? tu_uniform(rng, 1.0, 50.0) : 0.0;
    p.dropout_p = tu_int(rng, 0, 1) ? tu_uniform(rng, 0.0, 0.9) : 0.0;
    p.has_bias = (int32_t)tu_int(rng, 0, 1);
    if (p.has_bias) {
      p.bias_dtype = (int32_t)tu_int(rng, 0, 2);
      for (int d = 0; d < 4; ++d) p.bias_shape[d] = tu_int(rng, 1, 99);
    }
    p.has_mask = (int32_t)tu_int(rng, 0, 1);
    if (p.has_mask)
      for (int d = 0; d < 4; ++d) p.mask_shape[d] = tu_int(rng, 1, 99);
    p.alibi = (int32_t)tu_int(rng, 0, 2);
    p.num_sinks = tu_int(rng, 0, 3);
    p.sinks_shared = p.num_sinks > 0 ? (int32_t)tu_int(rng, 0, 1) : 0;
    p.has_segment_ids = (int32_t)tu_int(rng, 0, 1);
    p.varlen = (int32_t)tu_int(rng, 0, 2);
    if (p.varlen == ATTN_VARLEN_PACKED)
      p.total_q = tu_int(rng, 0, 999), p.total_k = tu_int(rng, 0, 999);
    p.device = (int32_t)tu_int(rng, 0, 1);
    p.device_index = p.device ? (int32_t)tu_int(rng, 0, 3) : 0;
    char text[1024], again[1024];
    attn_problem_to_string(&p, text, sizeof text);
    attn_problem q;
    attn_status st = attn_problem_parse(ctx, text, &q);
    attn_problem_to_string(&q, again, sizeof again);
    int same = st == ATTN_STATUS_OK && strcmp(text, again) == 0 && q.batch == p.batch &&
               q.heads_q == p.heads_q && q.heads_kv == p.heads_kv && q.seqlen_q == p.seqlen_q &&
               q.seqlen_k == p.seqlen_k && q.head_dim == p.head_dim &&
               q.head_dim_v == p.head_dim_v && q.scale == p.scale && q.softcap == p.softcap &&
               q.dropout_p == p.dropout_p && q.window_left == p.window_left &&
               q.window_right == p.window_right && q.causal == p.causal && q.align == p.align &&
               q.dtype == p.dtype && q.operation == p.operation && q.has_bias == p.has_bias &&
               q.bias_dtype == p.bias_dtype && q.has_mask == p.has_mask && q.alibi == p.alibi &&
               q.num_sinks == p.num_sinks && q.sinks_shared == p.sinks_shared &&
               q.has_segment_ids == p.has_segment_ids && q.varlen == p.varlen &&
               q.total_q == p.total_q && q.total_k == p.total_k && q.device == p.device &&
               q.device_index == p.device_index &&
               memcmp(q.bias_shape, p.bias_shape, sizeof p.bias_shape) == 0 &&
               memcmp(q.mask_shape, p.mask_shape, sizeof p.mask_shape) == 0;
    if (!same && mismatches++ < 3)
      tu_check(0, "random problem round trip: \"%s\" -> \"%s\" (%s)", text, again,
               attn_ctx_last_error(ctx));
  }
  tu_check(mismatches == 0, "300 random problems survive to_string -> parse (%d mismatches)",
           mismatches);

  /* Defaults of the parser, and its refusals naming the token. */
  attn_problem p;
  attn_status st = attn_problem_parse(ctx, "  hq4   sq10 d16  ", &p);
  tu_check(st == ATTN_STATUS_OK && p.batch == 1 && p.heads_kv == 4 && p.seqlen_k == 10 &&
               p.dtype == ATTN_DTYPE_F32,
           "parse defaults: b1, hkv = hq, sk = sq, f32");
  static const char *bad[] = {"hq4 sq10 d16 bogus",     "hq4 sq10 d16 window=3",
                              "hq4 sq10 d16 b",         "hq4 sq10 d16 bias=1x2x3",
                              "hq4 sq10 d16 scale=abc", "hq4 sq10 d16 sinks=2:private",
                              "hq4 sq10 d16 op=fast"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    st = attn_problem_parse(ctx, bad[i], &p);
    const char *tok = strrchr(bad[i], ' ') + 1;
    tu_check(st == ATTN_STATUS_INVALID_ARGUMENT && strstr(attn_ctx_last_error(ctx), tok) != NULL,
             "parse refuses \"%s\" naming the token: \"%s\"", bad[i], attn_ctx_last_error(ctx));
  }
  st = attn_problem_parse(ctx, "b2 sq10 d16", &p);
  tu_check(st == ATTN_STATUS_INVALID_ARGUMENT && strstr(attn_ctx_last_error(ctx), "hq") != NULL,
           "parse refuses a string without heads: \"%s\"", attn_ctx_last_error(ctx));
  char small[8];
  size_t need = attn_problem_to_string(&p, small, sizeof small);
  tu_check(strlen(small) == 7 && need > 7, "to_string truncates like snprintf (%zu needed)", need);
  tu_check(attn_problem_to_string(NULL, NULL, 0) == 0, "to_string(NULL) is empty");
  attn_ctx_destroy(ctx);
}

/* Equal computations spelled differently share cache entries; different ones do not. */
static void test_key_canonical(void) {
  attn_problem a = small_problem(16), b = small_problem(16);
  a.causal = 1;
  b.window_right = 0; /* the same visibility as causal (SPEC.md) */
  b.scale = 1.0 / sqrt(8.0);
  b.head_dim_v = 8;
  fake_inject((const fake_timing[]){{"fake2/tile64", 1.0}, {NULL, 0}});
  recorder rec;
  attn_ctx *ctx = make_ctx(NULL, ATTN_ON_MISS_AUTOTUNE, &rec);
  attn_policy pol;
  attn_ctx_get_policy(ctx, &pol);
  pol.cache_path = "";
  attn_ctx_set_policy(ctx, &pol);
  char pick[256];
  plan_pick(ctx, &a, NULL, pick, sizeof pick);
  int tuned = rec.kinds[ATTN_EVENT_KIND_TUNE_FINISH];
  plan_pick(ctx, &b, NULL, pick, sizeof pick);
  tu_check(
      tuned == 1 && rec.kinds[ATTN_EVENT_KIND_TUNE_FINISH] == 1 &&
          rec.kinds[ATTN_EVENT_KIND_CACHE_HIT_MEMORY] == 1 && strcmp(pick, "fake2/tile64") == 0,
      "causal and window=-1,0 with explicit default scale and dv share one cache entry (%s)", pick);
  b.window_left = 3;
  plan_pick(ctx, &b, NULL, pick, sizeof pick);
  tu_check(rec.kinds[ATTN_EVENT_KIND_TUNE_FINISH] == 2, "a different window is another entry");
  attn_ctx_destroy(ctx);
  fake_inject(NULL);
}

/* ---- the chain ------------------------------------------------------------------------------- */

static const fake_timing timings_a[] = {{"cpu_fake/tile16", 50.0}, {"cpu_fake/tile32", 40.0},
                                        {"cpu_fake/tile64", 60.0}, {"fake2/tile32", 45.0},
                                        {"fake2/tile64", 20.0},    {"cudnn_fake/default", 30.0},
                                        {"ref/default", 900.0},    {NULL, 0}};
/* The same with the winner failing (a negative time): the runner-up must win. */
static const fake_timing timings_fail[] = {{"cpu_fake/tile16", 50.0}, {"cpu_fake/tile32", 40.0},
                                           {"cpu_fake/tile64", 60.0}, {"fake2/tile32", 45.0},
                                           {"fake2/tile64", -1.0},    {"cudnn_fake/default", 30.0},
                                           {"ref/default", 900.0},    {NULL, 0}};

static void test_heuristics(void) {
  recorder rec;
  attn_ctx *ctx = make_ctx("heur.txt", ATTN_ON_MISS_HEURISTICS, &rec);
  fake_inject(timings_a);
  attn_problem p = small_problem(16);
  char pick[256];
  attn_status st = plan_pick(ctx, &p, NULL, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_OK && strcmp(pick, "cpu_fake/tile32") == 0,
           "heuristics (on_miss=heuristics): the first supporting implementation and its default "
           "configuration: %s",
           pick);
  tu_check(rec.kinds[ATTN_EVENT_KIND_HEURISTIC] == 1 && fake_timer_calls == 0,
           "a heuristic pick is reported as such and times nothing");
  tu_check(!file_exists("heur.txt"), "a heuristic pick is never written to the cache file");
  int64_t mem = -1;
  attn_cache_count(ctx, &mem, NULL);
  tu_check(mem == 0, "a heuristic pick is not kept in the memory cache either (%lld)",
           (long long)mem);

  /* allow_autotune = 0 overrides on_miss = autotune. */
  attn_policy pol;
  attn_ctx_get_policy(ctx, &pol);
  pol.on_miss = ATTN_ON_MISS_AUTOTUNE;
  pol.allow_autotune = 0;
  attn_ctx_set_policy(ctx, &pol);
  st = plan_pick(ctx, &p, NULL, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_OK && strcmp(pick, "cpu_fake/tile32") == 0 && fake_timer_calls == 0,
           "allow_autotune=0: heuristics even when on_miss=autotune (%s)", pick);

  /* The first supporting one: cpu_fake refuses head_dim 128, so fake2 and its default. */
  p.head_dim = 128;
  st = plan_pick(ctx, &p, NULL, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_OK && strcmp(pick, "fake2/tile64") == 0,
           "heuristics skip an implementation that does not support the problem: %s", pick);

  /* Under the deterministic policy fake2's default (tile64) is out: the next implementation
   * whose default is still a candidate comes before fake2's leftover tile32. */
  pol.deterministic = 1;
  attn_ctx_set_policy(ctx, &pol);
  st = plan_pick(ctx, &p, NULL, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_OK && strcmp(pick, "cudnn_fake/default") == 0,
           "deterministic heuristics: an implementation whose default was filtered out comes "
           "after those whose default remains: %s",
           pick);
  attn_select only2;
  attn_select_init(&only2);
  only2.impl = "fake2";
  st = plan_pick(ctx, &p, &only2, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_OK && strcmp(pick, "fake2/tile32") == 0,
           "deterministic heuristics: alone, the filtered implementation's leftover is taken: %s",
           pick);
  pol.deterministic = 0;
  attn_ctx_set_policy(ctx, &pol);

  /* scaled_dot_product_attention prefers cuDNN on platform auto. */
  p.head_dim = 8;
  p.operation = ATTN_OPERATION_SCALED_DOT_PRODUCT_ATTENTION;
  st = plan_pick(ctx, &p, NULL, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_OK && strcmp(pick, "cudnn_fake/default") == 0,
           "sdpa heuristics prefer the cuDNN platform: %s", pick);
  attn_ctx_destroy(ctx);
  fake_inject(NULL);
}

static void test_autotune_and_caches(void) {
  recorder rec;
  attn_ctx *ctx = make_ctx("chain.txt", ATTN_ON_MISS_AUTOTUNE, &rec);
  fake_inject(timings_a);
  attn_problem p = small_problem(16);
  char pick[256];
  attn_status st = plan_pick(ctx, &p, NULL, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_OK && strcmp(pick, "fake2/tile64") == 0,
           "autotune picks the fastest of the injected timings (fake2/tile64, 20 us): %s", pick);
  tu_check(rec.kinds[ATTN_EVENT_KIND_TUNE_START] == 1 && rec.candidates_seen == 7 &&
               rec.kinds[ATTN_EVENT_KIND_TUNE_FINISH] == 1 && fake_timer_calls == 7,
           "autotune reports start, each of the 7 candidates, and finish (%d candidate events)",
           rec.candidates_seen);
  char *text = slurp("chain.txt");
  tu_check(text != NULL && strncmp(text, "libattn-cache 1\n", 16) == 0 &&
               strstr(text, "\tfake2\t1\ttile64\t20\n") != NULL,
           "the measured result is written to the cache file");
  free(text);

  /* Memory before anything else: no timing, no file read needed. */
  fake_timer_calls = 0;
  st = plan_pick(ctx, &p, NULL, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_OK && strcmp(pick, "fake2/tile64") == 0 &&
               rec.kinds[ATTN_EVENT_KIND_CACHE_HIT_MEMORY] == 1 && fake_timer_calls == 0,
           "the second plan is a memory hit: %s", pick);

  /* Memory wins over the file: the file now says cpu_fake/tile16. */
  tu_check(edit_file("chain.txt", "\tfake2\t1\ttile64\t", "\tcpu_fake\t1\ttile16\t"),
           "the cache file can be edited by another writer");
  st = plan_pick(ctx, &p, NULL, pick, sizeof pick);
  tu_check(strcmp(pick, "fake2/tile64") == 0 && rec.kinds[ATTN_EVENT_KIND_CACHE_HIT_MEMORY] == 2,
           "memory is consulted before the file: %s", pick);

  /* Without the memory entry the file answers, and its answer is promoted to memory. */
  attn_cache_clear(ctx);
  st = plan_pick(ctx, &p, NULL, pick, sizeof pick);
  tu_check(strcmp(pick, "cpu_fake/tile16") == 0 && rec.kinds[ATTN_EVENT_KIND_CACHE_HIT_DISK] == 1 &&
               fake_timer_calls == 0,
           "after clearing memory the file is read (it changed since last read): %s", pick);
  int64_t mem = 0, disk = 0;
  attn_cache_count(ctx, &mem, &disk);
  tu_check(mem == 1 && disk == 1, "the disk hit is promoted to memory (memory %lld, file %lld)",
           (long long)mem, (long long)disk);
  char path[512];
  path_in_tmp(path, sizeof path, "chain.txt");
  unlink(path);
  st = plan_pick(ctx, &p, NULL, pick, sizeof pick);
  tu_check(strcmp(pick, "cpu_fake/tile16") == 0 && rec.kinds[ATTN_EVENT_KIND_CACHE_HIT_MEMORY] == 3,
           "the promoted entry answers from memory once the file is gone: %s", pick);

  /* A second context sees what the first one tunes later: the file is re-read when it changes. */
  recorder rec2;
  attn_ctx *other = make_ctx("chain.txt", ATTN_ON_MISS_HEURISTICS, &rec2);
  attn_problem q = small_problem(32);
  st = plan_pick(other, &q, NULL, pick, sizeof pick);
  tu_check(strcmp(pick, "cpu_fake/tile32") == 0 && rec2.kinds[ATTN_EVENT_KIND_HEURISTIC] == 1,
           "another context: a miss gives the heuristic pick: %s", pick);
  st = plan_pick(ctx, &q, NULL, pick, sizeof pick); /* tunes and writes */
  st = plan_pick(other, &q, NULL, pick, sizeof pick);
  tu_check(strcmp(pick, "fake2/tile64") == 0 && rec2.kinds[ATTN_EVENT_KIND_CACHE_HIT_DISK] == 1,
           "the other context re-reads the changed file and hits: %s", pick);
  attn_ctx_destroy(other);

  /* Failed candidates never win. */
  attn_cache_clear(ctx);
  fake_inject(timings_fail);
  attn_problem r = small_problem(48);
  st = plan_pick(ctx, &r, NULL, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_OK && strcmp(pick, "cudnn_fake/default") == 0,
           "a failed candidate is skipped; the fastest successful one wins: %s", pick);
  attn_ctx_destroy(ctx);
  fake_inject(NULL);
}

/* policy.deterministic: only configurations declared deterministic are candidates, unless the
 * caller names one; its results are cached under their own key. fake2/tile64 (20 us, the fastest
 * of timings_a) is declared non-deterministic. */
static void test_determinism(void) {
  recorder rec;
  attn_ctx *ctx = make_ctx("det.txt", ATTN_ON_MISS_AUTOTUNE, &rec);
  fake_inject(timings_a);
  attn_policy pol;
  attn_ctx_get_policy(ctx, &pol);
  tu_check(pol.deterministic == 0, "policy.deterministic is 0 by default");
  pol.deterministic = 1;
  attn_ctx_set_policy(ctx, &pol);
  attn_problem p = small_problem(16);
  char pick[256];
  attn_status st = plan_pick(ctx, &p, NULL, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_OK && strcmp(pick, "cudnn_fake/default") == 0 &&
               rec.candidates_seen == 6,
           "deterministic: autotune skips the non-deterministic fake2/tile64 and picks the fastest "
           "of the other 6 (cudnn_fake/default, 30 us): %s (%d candidates)",
           pick, rec.candidates_seen);
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = "fake2";
  sel.config = "tile64";
  st = plan_pick(ctx, &p, &sel, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_OK && strcmp(pick, "fake2/tile64") == 0,
           "deterministic: a configuration the caller names is honoured: %s", pick);
  sel.config = NULL;
  st = plan_pick(ctx, &p, &sel, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_OK && strcmp(pick, "fake2/tile32") == 0,
           "deterministic: fake2 alone leaves its deterministic tile32: %s", pick);
  attn_ctx *other = make_ctx("det.txt", ATTN_ON_MISS_AUTOTUNE, &rec);
  st = plan_pick(other, &p, NULL, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_OK && strcmp(pick, "fake2/tile64") == 0,
           "a default policy sharing the cache file does not take the deterministic result: %s",
           pick);
  attn_ctx_destroy(other);
  attn_ctx_destroy(ctx);
  fake_inject(NULL);
}

static void test_explicit_choice(void) {
  recorder rec;
  attn_ctx *ctx = make_ctx("explicit.txt", ATTN_ON_MISS_AUTOTUNE, &rec);
  fake_inject(timings_a);
  attn_problem p = small_problem(16);
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = "cpu_fake";
  sel.config = "tile64";
  char pick[256];
  attn_status st = plan_pick(ctx, &p, &sel, pick, sizeof pick);
  int64_t mem = -1;
  attn_cache_count(ctx, &mem, NULL);
  tu_check(st == ATTN_STATUS_OK && strcmp(pick, "cpu_fake/tile64") == 0 &&
               rec.kinds[ATTN_EVENT_KIND_OVERRIDE] == 1 && fake_timer_calls == 0,
           "an explicit implementation and configuration win and time nothing: %s", pick);
  tu_check(mem == 0 && !file_exists("explicit.txt"),
           "an explicit choice is neither cached in memory nor written to the file");
  /* ... even when the caches hold another answer for the problem. */
  plan_pick(ctx, &p, NULL, pick, sizeof pick); /* tunes: fake2/tile64 */
  st = plan_pick(ctx, &p, &sel, pick, sizeof pick);
  tu_check(strcmp(pick, "cpu_fake/tile64") == 0 && rec.kinds[ATTN_EVENT_KIND_OVERRIDE] == 2,
           "an explicit choice wins over a cached result: %s", pick);
  char *text = slurp("explicit.txt");
  tu_check(text != NULL && strstr(text, "cpu_fake\t1\ttile64") == NULL,
           "the file holds only the measured result, not the explicit choice");
  free(text);
  attn_ctx_destroy(ctx);
  fake_inject(NULL);
}

/* The caller's configuration (without an implementation) on every path. */
static void test_config_every_path(void) {
  recorder rec;
  attn_ctx *ctx = make_ctx("config.txt", ATTN_ON_MISS_HEURISTICS, &rec);
  fake_inject(timings_a);
  attn_problem p = small_problem(16);
  attn_select sel;
  attn_select_init(&sel);
  sel.config = "tile16"; /* only cpu_fake has it, and it is not its default */
  char pick[256];
  plan_pick(ctx, &p, &sel, pick, sizeof pick);
  tu_check(strcmp(pick, "cpu_fake/tile16") == 0, "config on the override path: %s", pick);
  sel.config = "tile64"; /* cpu_fake (default tile32) and fake2 have it */
  plan_pick(ctx, &p, &sel, pick, sizeof pick);
  tu_check(strcmp(pick, "cpu_fake/tile64") == 0 && rec.kinds[ATTN_EVENT_KIND_HEURISTIC] == 1,
           "config on the heuristics path (not the implementation's default): %s", pick);

  attn_policy pol;
  attn_ctx_get_policy(ctx, &pol);
  pol.on_miss = ATTN_ON_MISS_AUTOTUNE;
  attn_ctx_set_policy(ctx, &pol);
  /* Unconstrained first: fake2/tile64 wins overall; then tile32 is asked for. */
  plan_pick(ctx, &p, NULL, pick, sizeof pick);
  sel.config = "tile32";
  plan_pick(ctx, &p, &sel, pick, sizeof pick);
  tu_check(strcmp(pick, "cpu_fake/tile32") == 0 && rec.kinds[ATTN_EVENT_KIND_TUNE_FINISH] == 2,
           "config on the autotune path: the fastest tile32 (40 us vs 45 us), not the cached "
           "overall winner: %s",
           pick);
  plan_pick(ctx, &p, &sel, pick, sizeof pick);
  tu_check(strcmp(pick, "cpu_fake/tile32") == 0 && rec.kinds[ATTN_EVENT_KIND_CACHE_HIT_MEMORY] == 1,
           "config on the memory path: %s", pick);
  attn_cache_clear(ctx);
  plan_pick(ctx, &p, &sel, pick, sizeof pick);
  tu_check(strcmp(pick, "cpu_fake/tile32") == 0 && rec.kinds[ATTN_EVENT_KIND_CACHE_HIT_DISK] == 1,
           "config on the disk path: %s", pick);
  /* An implementation without configuration: its configurations are the candidates. */
  attn_select_init(&sel);
  sel.impl = "cpu_fake";
  attn_problem q = small_problem(24);
  plan_pick(ctx, &q, &sel, pick, sizeof pick);
  tu_check(strcmp(pick, "cpu_fake/tile32") == 0, "select.impl alone tunes its configurations: %s",
           pick);
  attn_ctx_destroy(ctx);
  fake_inject(NULL);
}

static void test_filters(void) {
  recorder rec;
  attn_ctx *ctx = make_ctx(NULL, ATTN_ON_MISS_HEURISTICS, &rec);
  attn_problem p = small_problem(16);
  attn_select sel;
  attn_select_init(&sel);
  char pick[256];
  sel.platform = ATTN_PLATFORM_REF;
  attn_status st = plan_pick(ctx, &p, &sel, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_OK && strcmp(pick, "ref/default") == 0, "platform ref: %s", pick);
  sel.platform = ATTN_PLATFORM_CUDNN;
  st = plan_pick(ctx, &p, &sel, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_OK && strcmp(pick, "cudnn_fake/default") == 0, "platform cudnn: %s",
           pick);
  sel.platform = ATTN_PLATFORM_CUDA;
  st = plan_pick(ctx, &p, &sel, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_UNSUPPORTED &&
               strstr(attn_ctx_last_error(ctx), "select.platform=cuda"),
           "platform cuda with no CUDA implementation: UNSUPPORTED naming the filter: %s",
           attn_ctx_last_error(ctx));
  sel.platform = ATTN_PLATFORM_AUTO;
  sel.backend = ATTN_BACKEND_GPU;
  st = plan_pick(ctx, &p, &sel, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_UNSUPPORTED && strstr(attn_ctx_last_error(ctx), "select.backend=gpu"),
           "backend gpu on a CPU-only registry: UNSUPPORTED: %s", attn_ctx_last_error(ctx));
  sel.backend = 7;
  st = plan_pick(ctx, &p, &sel, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_INVALID_ARGUMENT &&
               strstr(attn_ctx_last_error(ctx), "select.backend=7"),
           "an out-of-range backend is INVALID_ARGUMENT naming it");
  attn_select_init(&sel);
  sel.platform = -1;
  st = plan_pick(ctx, &p, &sel, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_INVALID_ARGUMENT &&
               strstr(attn_ctx_last_error(ctx), "select.platform"),
           "an out-of-range platform is INVALID_ARGUMENT naming it");

  /* EasyDeL names. */
  attn_select_init(&sel);
  st = attn_select_mechanism(ctx, "vanilla", &p, &sel);
  plan_pick(ctx, &p, &sel, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_OK && strcmp(pick, "ref/default") == 0,
           "\"vanilla\" is the reference: %s", pick);
  attn_select_init(&sel);
  st = attn_select_mechanism(ctx, "sdpa", &p, &sel);
  plan_pick(ctx, &p, &sel, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_OK && p.operation == ATTN_OPERATION_SCALED_DOT_PRODUCT_ATTENTION &&
               strcmp(pick, "cudnn_fake/default") == 0,
           "\"sdpa\" sets the operation and prefers cuDNN: %s", pick);
  st = attn_select_mechanism(ctx, "flash", &p, &sel);
  plan_pick(ctx, &p, &sel, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_OK && p.operation == ATTN_OPERATION_FLASH_ATTENTION &&
               strcmp(pick, "cpu_fake/tile32") == 0,
           "\"flash\" sets flash_attention on any platform: %s", pick);
  st = attn_select_mechanism(ctx, "cudnn", &p, &sel);
  tu_check(st == ATTN_STATUS_OK && sel.platform == ATTN_PLATFORM_CUDNN,
           "\"cudnn\" is platform cudnn");
  st = attn_select_mechanism(ctx, "turbo", &p, &sel);
  tu_check(st == ATTN_STATUS_INVALID_ARGUMENT && strstr(attn_ctx_last_error(ctx), "turbo"),
           "an unknown mechanism is INVALID_ARGUMENT naming it: %s", attn_ctx_last_error(ctx));

  /* Configuration listing through the public API. */
  int32_t n = 0;
  char name[64], def[64];
  st = attn_impl_config_count(ctx, "cpu_fake", &p, &n);
  attn_impl_config_name(ctx, "cpu_fake", &p, 2, name, sizeof name);
  attn_impl_config_default(ctx, "cpu_fake", &p, def, sizeof def);
  tu_check(st == ATTN_STATUS_OK && n == 3 && strcmp(name, "tile64") == 0 &&
               strcmp(def, "tile32") == 0,
           "config listing: %d configurations, [2] = %s, default %s", (int)n, name, def);
  st = attn_impl_config_name(ctx, "cpu_fake", &p, 3, name, sizeof name);
  tu_check(st == ATTN_STATUS_INVALID_ARGUMENT && strstr(attn_ctx_last_error(ctx), "index=3"),
           "a configuration index out of range is refused naming it");
  p.head_dim = 128;
  st = attn_impl_config_count(ctx, "cpu_fake", &p, &n);
  tu_check(st == ATTN_STATUS_UNSUPPORTED && strstr(attn_ctx_last_error(ctx), "head_dim=128"),
           "configurations of an implementation that cannot run the problem: UNSUPPORTED with why");
  tu_check(attn_impl_platform(0) == ATTN_PLATFORM_CPU &&
               attn_impl_platform(2) == ATTN_PLATFORM_CUDNN &&
               attn_impl_platform(3) == ATTN_PLATFORM_REF && attn_impl_platform(4) == -1 &&
               attn_impl_version(0) == 1 && attn_impl_device(3) == ATTN_DEVICE_CPU,
           "platform, version and device of each implementation");
  attn_ctx_destroy(ctx);
}

/* A changed implementation version invalidates its results. */
static void test_versions(void) {
  recorder rec;
  attn_ctx *ctx = make_ctx("versions.txt", ATTN_ON_MISS_AUTOTUNE, &rec);
  fake_inject((const fake_timing[]){{"cpu_fake/tile64", 5.0}, {NULL, 0}});
  attn_problem p = small_problem(16);
  char pick[256];
  plan_pick(ctx, &p, NULL, pick, sizeof pick);
  tu_check(strcmp(pick, "cpu_fake/tile64") == 0, "tuned: %s", pick);
  attn_policy pol;
  attn_ctx_get_policy(ctx, &pol);
  pol.on_miss = ATTN_ON_MISS_HEURISTICS;
  attn_ctx_set_policy(ctx, &pol);
  fake_cpu.version = 2;
  plan_pick(ctx, &p, NULL, pick, sizeof pick);
  tu_check(strcmp(pick, "cpu_fake/tile32") == 0 && rec.kinds[ATTN_EVENT_KIND_HEURISTIC] == 1,
           "after cpu_fake's version changes its cached result is ignored (memory and file): %s",
           pick);
  fake_cpu.version = 1;
  /* An entry whose key matches but whose implementation version is stale is ignored too. */
  attn_cache_clear(ctx);
  tu_check(edit_file("versions.txt", "\tcpu_fake\t1\ttile64\t", "\tcpu_fake\t7\ttile64\t"),
           "the entry's version can be edited");
  plan_pick(ctx, &p, NULL, pick, sizeof pick);
  tu_check(strcmp(pick, "cpu_fake/tile32") == 0 && rec.kinds[ATTN_EVENT_KIND_HEURISTIC] == 2,
           "an entry naming another version of the implementation is ignored: %s", pick);
  attn_ctx_destroy(ctx);
  fake_inject(NULL);
}

/* Real measuring: cpu_fake's configurations spin 1500, 100 and 600 us. */
static void test_real_timing(void) {
  recorder rec;
  attn_ctx *ctx = make_ctx("real.txt", ATTN_ON_MISS_AUTOTUNE, &rec);
  fake_spin_us[0] = 1500.0, fake_spin_us[1] = 100.0, fake_spin_us[2] = 600.0;
  memset(fake_forward_calls, 0, sizeof fake_forward_calls);
  memset(fake_backward_calls, 0, sizeof fake_backward_calls);
  attn_policy pol;
  attn_ctx_get_policy(ctx, &pol);
  pol.measure_iters = 100;
  pol.warmup_iters = 2;
  attn_ctx_set_policy(ctx, &pol);
  attn_problem p = small_problem(16);
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = "cpu_fake";
  char pick[256];
  attn_status st = plan_pick(ctx, &p, &sel, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_OK && strcmp(pick, "cpu_fake/tile32") == 0,
           "measured autotune picks the 100 us configuration: %s", pick);
  tu_check(fake_forward_calls[0] >= 12 && fake_forward_calls[0] < 102 &&
               fake_backward_calls[0] == 0,
           "warm-up plus an early stop once the median settles (%d forward runs of tile16, limit "
           "100 + 2), forward only",
           fake_forward_calls[0]);
  tu_check(fake_forward_calls[2] == 2,
           "a candidate 5x slower than the best so far (600 vs 100 us) stops after one warm-up "
           "and one timed run (%d runs)",
           fake_forward_calls[2]);
  pol.tune_backward = 1;
  pol.measure_iters = 3;
  pol.warmup_iters = 0;
  attn_ctx_set_policy(ctx, &pol);
  plan_pick(ctx, &p, &sel, pick, sizeof pick);
  tu_check(strcmp(pick, "cpu_fake/tile32") == 0 && fake_backward_calls[0] == 3 &&
               rec.kinds[ATTN_EVENT_KIND_TUNE_FINISH] == 2,
           "tune_backward times forward + backward under its own key (%d backward runs)",
           fake_backward_calls[0]);
  /* A budget stops a slow candidate after one timed run. */
  pol.tune_backward = 0;
  pol.measure_iters = 100;
  pol.warmup_iters = 5;
  pol.max_seconds = 0.001;
  attn_ctx_set_policy(ctx, &pol);
  memset(fake_forward_calls, 0, sizeof fake_forward_calls);
  attn_problem q = small_problem(40);
  plan_pick(ctx, &q, &sel, pick, sizeof pick);
  tu_check(fake_forward_calls[0] == 2 && strcmp(pick, "cpu_fake/tile32") == 0,
           "max_seconds stops a 1500 us candidate after one warm-up and one timed run (%d runs)",
           fake_forward_calls[0]);
  memset(fake_spin_us, 0, sizeof fake_spin_us);

  /* The real reference (through the real registry, named, since other implementations may be
   * registered beside it) tunes as the only candidate: nothing to time. */
  fake_uninstall();
  attn_problem r = small_problem(5);
  attn_select ref_only;
  attn_select_init(&ref_only);
  ref_only.impl = "ref";
  st = plan_pick(ctx, &r, &ref_only, pick, sizeof pick);
  tu_check(st == ATTN_STATUS_OK && rec.kinds[ATTN_EVENT_KIND_TUNE_START] == 3,
           "a lone candidate is taken without timing: %s", pick);
  fake_install();
  attn_ctx_destroy(ctx);
}

/* The tuner's scratch data is valid for every feature: the reference, measured for real on it,
 * never fails (a failed candidate would be reported with its validation message). */
typedef struct failure_count {
  int failed, measured;
  char why[1024];
} failure_count;

static void count_candidates(void *user, const attn_event *ev) {
  failure_count *f = user;
  if (ev->kind != ATTN_EVENT_KIND_TUNE_CANDIDATE) return;
  f->measured++;
  if (ev->status != ATTN_STATUS_OK) {
    f->failed++;
    snprintf(f->why, sizeof f->why, "%s", ev->message);
  }
}

static void test_scratch_features(void) {
  static const char *problems[] = {
      "b2 hq4 hkv2 sq7 sk9 d8 f32 causal window=3,0 softcap=5 dropout=0.2",
      "b2 hq4 hkv2 sq7 sk9 d8 dv4 bf16 bias=2x2x7x9 mask=1x4x7x9 alibi=bh sinks=2",
      "b2 hq2 hkv1 sq6 sk6 d8 f16 segments sinks=1:shared alibi=h bias=1x1x1x6:bf16",
      "b3 hq2 hkv2 sq5 sk7 d8 f32 varlen=packed:13,17 op=sdpa",
      "b3 hq2 hkv2 sq5 sk7 d8 f64 varlen=padded bias=3x2x5x7:f64",
  };
  attn_ctx *ctx = make_ctx(NULL, ATTN_ON_MISS_AUTOTUNE, NULL);
  failure_count f;
  memset(&f, 0, sizeof f);
  attn_ctx_set_event_callback(ctx, count_candidates, &f);
  attn_policy pol;
  attn_ctx_get_policy(ctx, &pol);
  pol.cache_path = "";
  pol.warmup_iters = 0;
  pol.measure_iters = 1;
  for (int backward = 0; backward <= 1; ++backward) {
    pol.tune_backward = backward;
    attn_ctx_set_policy(ctx, &pol);
    for (size_t i = 0; i < sizeof problems / sizeof problems[0]; ++i) {
      attn_problem p;
      attn_problem_parse(ctx, problems[i], &p);
      char pick[256];
      attn_status st = plan_pick(ctx, &p, NULL, pick, sizeof pick);
      if (st != ATTN_STATUS_OK) tu_check(0, "tuning \"%s\": %s", problems[i], pick);
    }
  }
  tu_check(f.measured == 2 * 5 * 7 && f.failed == 0,
           "real tuning on scratch data of every feature, forward and backward: %d candidates "
           "measured, %d failed%s%s",
           f.measured, f.failed, f.failed ? ": " : "", f.why);
  attn_ctx_destroy(ctx);
}

static void test_policy_checks(void) {
  attn_ctx *ctx;
  attn_ctx_create(&ctx);
  attn_policy pol;
  attn_policy_init(&pol);
  tu_check(pol.allow_autotune == 1 && pol.warmup_iters == 5 && pol.measure_iters == 100 &&
               pol.persist == 1 && pol.cache_path == NULL && pol.tune_backward == 0,
           "policy defaults: autotune allowed, warm-up 5, 100 runs, persist, default path");
  static const struct {
    const char *field;
    int which;
  } cases[] = {{"policy.allow_autotune", 0}, {"policy.on_miss", 1},     {"policy.warmup_iters", 2},
               {"policy.measure_iters", 3},  {"policy.max_seconds", 4}, {"policy.persist", 5},
               {"policy.tune_backward", 6}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    attn_policy bad;
    attn_policy_init(&bad);
    switch (cases[i].which) {
    case 0: bad.allow_autotune = 2; break;
    case 1: bad.on_miss = 9; break;
    case 2: bad.warmup_iters = -1; break;
    case 3: bad.measure_iters = 0; break;
    case 4: bad.max_seconds = 0.0; break;
    case 5: bad.persist = -3; break;
    case 6: bad.tune_backward = 5; break;
    }
    attn_status st = attn_ctx_set_policy(ctx, &bad);
    tu_check(st == ATTN_STATUS_INVALID_ARGUMENT && strstr(attn_ctx_last_error(ctx), cases[i].field),
             "a bad %s is refused naming it: \"%s\"", cases[i].field, attn_ctx_last_error(ctx));
  }
  /* The path resolution: explicit, then ATTN_CACHE_PATH, XDG_CACHE_HOME, HOME. */
  char path[512];
  setenv("ATTN_CACHE_PATH", "/env/cache.txt", 1);
  attn_cache_get_path(ctx, path, sizeof path);
  tu_check(strcmp(path, "/env/cache.txt") == 0, "ATTN_CACHE_PATH: %s", path);
  unsetenv("ATTN_CACHE_PATH");
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  attn_cache_get_path(ctx, path, sizeof path);
  tu_check(strcmp(path, "/xdg/libattn/cache.txt") == 0, "XDG_CACHE_HOME: %s", path);
  unsetenv("XDG_CACHE_HOME");
  setenv("HOME", "/home/someone", 1);
  attn_cache_get_path(ctx, path, sizeof path);
  tu_check(strcmp(path, "/home/someone/.cache/libattn/cache.txt") == 0, "HOME: %s", path);
  attn_policy_init(&pol);
  char mine[] = "/explicit/cache.txt";
  pol.cache_path = mine;
  attn_ctx_set_policy(ctx, &pol);
  mine[1] = 'X'; /* the context keeps its own copy */
  attn_cache_get_path(ctx, path, sizeof path);
  tu_check(strcmp(path, "/explicit/cache.txt") == 0, "policy.cache_path is copied: %s", path);
  attn_ctx_destroy(ctx);
}

int main(void) {
  uint64_t seed = tu_seed("test_executor");
  tu_rng rng = tu_rng_make(seed);
  snprintf(tmpdir, sizeof tmpdir, "/tmp/attn_test_executor_XXXXXX");
  if (mkdtemp(tmpdir) == NULL) return 2;
  unsetenv("ATTN_AUTOTUNE");
  test_problem_strings(&rng);
  fake_install();
  test_key_canonical();
  test_heuristics();
  test_autotune_and_caches();
  test_explicit_choice();
  test_determinism();
  test_config_every_path();
  test_filters();
  test_versions();
  test_real_timing();
  test_scratch_features();
  fake_uninstall();
  test_policy_checks();
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) printf("could not remove %s\n", tmpdir);
  return tu_finish();
}
