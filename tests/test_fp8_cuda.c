/*
 * tests/test_fp8_cuda.c - the cuda implementation's fp8 (e4m3) forward, the sm90 kernel of
 * src/impl/cuda/sm90/sm90_fwd_fp8.cuh, against the f64 reference under docs/FP8.md's rule.
 *
 * Like tests/test_fp8.c (ref and cpu), the grid goes through the attn tool's oracle
 * (tools/harness.c): e4m3 data and positive descale factors drawn from the printed seed, the f64
 * reference on the decoded values, tol_bound_fp8 (2 x err(naive) + 2^-6 max|r| for out, naive
 * rounding P to e4m3 at the 2^8 scale). Each problem runs under every configuration cuda offers
 * for it (attn_impl_config_count: sm90_fp8 and sm90_fp8_pingpong, at D = 128 also sm90_fp8_n192,
 * 192-key blocks, which the count is checked to include). Sizes are odd (T not a multiple of the 128-key block, 1, 3, 17, 65, 129,
 * 1000), with GQA and MQA, D = 128 and 256; every feature the kernel has (causal in both
 * alignments, windows, sinks, padded and packed varlen) alone and combined, rows that see no key
 * (bottom-right causal with Tq > Tk: zeros, lse -inf), problems without keys, descale none /
 * tensor / bhkv, out bf16, f16 and f32. Then the problems the kernel refuses must be refused with the reason naming the feature.
 *
 * A GPU test (label gpu): exit 77 without a CUDA device; on a device other than compute capability
 * 9.0 it checks only that cuda refuses fp8 with the reason.
 *
 * Usage: test_fp8_cuda [filter]   runs only grid cases whose problem string contains filter.
 */
#include "attn.h"
#include "harness.h"
#include "testutil.h"

#include <stdio.h>
#include <string.h>

/* How many configurations cuda offers for an fp8 problem of head dim d (cuda.c's fp8_configs):
 * the test fails when one goes missing, and a new one is run without an edit here. */
static int32_t expected_configs(int64_t d) { return d == 128 ? 3 : 2; }

/* Runs every configuration cuda offers for one problem string against the oracle. A problem of
 * many query rows must have some nonzero output (a factor never read gives zeros, and zeros match
 * zeros). */
static void check_problem(attn_ctx *ctx, const char *text, uint64_t seed, int expect_nonzero) {
  attn_problem p;
  if (attn_problem_parse(ctx, text, &p) != ATTN_STATUS_OK) {
    tu_check(0, "%s: does not parse: %s", text, attn_ctx_last_error(ctx));
    return;
  }
  h_oracle *oracle = NULL;
  if (h_oracle_make(ctx, &p, 0, seed, 0, &oracle) != ATTN_STATUS_OK) {
    tu_check(0, "%s: no oracle: %s", text, attn_ctx_last_error(ctx));
    return;
  }
  int32_t count = 0;
  attn_status st = attn_impl_config_count(ctx, "cuda", &p, &count);
  tu_check(st == ATTN_STATUS_OK && count == expected_configs(p.head_dim),
           "%s: cuda offers %d configurations (%d expected): %s", text, (int)count,
           (int)expected_configs(p.head_dim), attn_status_string(st));
  for (int32_t c = 0; st == ATTN_STATUS_OK && c < count; ++c) {
    char config[64] = "";
    if (attn_impl_config_name(ctx, "cuda", &p, c, config, sizeof config) != ATTN_STATUS_OK) {
      tu_check(0, "%s: cuda configuration %d has no name: %s", text, (int)c,
               attn_ctx_last_error(ctx));
      continue;
    }
    h_check r = h_check_run(ctx, oracle, "cuda", config);
    if (r.status != ATTN_STATUS_OK) {
      tu_check(0, "%s: cuda %s: %s", text, config, attn_ctx_last_error(ctx));
      continue;
    }
    tu_check(r.ok && (r.ref[0] > 0.0 || !expect_nonzero),
             "%s: cuda %s out %.2e/%.2e (max|r| %.2e) lse %.2e/%.2e", text, config, r.err[0],
             r.tol[0], r.ref[0], r.err[1], r.tol[1]);
  }
  h_oracle_free(oracle);
}

/* B, Hq, Hkv, Tq, Tk, D */
static const int64_t grid_sizes[][6] = {
    {1, 1, 1, 1, 1, 128},     {2, 4, 2, 17, 63, 128},   {1, 2, 1, 129, 127, 128},
    {2, 8, 1, 3, 1000, 128},  {1, 2, 2, 1000, 65, 128}, {3, 6, 3, 65, 129, 256},
    {1, 4, 2, 300, 257, 256}, {2, 4, 2, 200, 385, 128}, /* 385: 192-key blocks 2 and a key */
};

/* each alone, then together (%B, %Q, %K: batch, Tq, Tk) */
static const char *const grid_features[] = {
    "",
    "causal",
    "causal align=tl",
    "window=16,3",
    "window=40,0 align=tl",
    "sinks=3",
    "sinks=2:shared",
    "varlen=padded",
    "varlen=packed:%BQ,%BK",
    "causal sinks=2 varlen=padded",
    "window=40,0 sinks=1 varlen=packed:%BQ,%BK",
};

static void expand(const char *feature, const int64_t *s, char *buf, size_t size) {
  size_t at = 0;
  for (const char *c = feature; *c && at + 24 < size; ++c) {
    if (*c == '%' && c[1]) {
      /* %BQ, %BK: B x Tq, B x Tk (packed varlen's rows); %B alone is not used */
      const int64_t v = c[2] == 'Q' ? s[0] * s[3] : s[0] * s[4];
      at += (size_t)snprintf(buf + at, size - at, "%lld", (long long)v);
      c += 2;
    } else {
      buf[at++] = *c;
    }
  }
  buf[at] = '\0';
}

static void test_grid(attn_ctx *ctx, uint64_t seed, const char *filter) {
  static const char *const descales[] = {"", " descale=tensor", " descale=bhkv"};
  static const char *const outs[] = {"", " out=f32", " out=f16", ""};
  int n = 0;
  for (size_t si = 0; si < sizeof grid_sizes / sizeof *grid_sizes; ++si)
    for (size_t fi = 0; fi < sizeof grid_features / sizeof *grid_features; ++fi, ++n) {
      const int64_t *s = grid_sizes[si];
      char feature[160], text[400];
      expand(grid_features[fi], s, feature, sizeof feature);
      snprintf(text, sizeof text, "b%lld hq%lld hkv%lld sq%lld sk%lld d%lld fp8 %s%s%s device=cuda",
               (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3], (long long)s[4],
               (long long)s[5], feature, descales[n % 3], outs[(n / 3) % 4]);
      if (filter != NULL && strstr(text, filter) == NULL) continue;
      check_problem(ctx, text, seed + (uint64_t)n, s[0] * s[3] >= 17);
    }
}

/* Problems without keys (every row sees nothing: out 0, lse -inf; with sinks, out 0 and lse their
 * log-sum-exp) and sequences without rows or keys. */
static void test_empty(attn_ctx *ctx, uint64_t seed) {
  static const char *const problems[] = {
      "b2 hq4 hkv2 sq17 sk0 d128 fp8 device=cuda",
      "b2 hq4 hkv2 sq17 sk0 d128 fp8 sinks=2 descale=tensor out=f32 device=cuda",
      "b3 hq4 hkv2 sq17 sk40 d128 fp8 causal varlen=padded descale=bhkv device=cuda",
  };
  for (size_t i = 0; i < sizeof problems / sizeof *problems; ++i)
    check_problem(ctx, problems[i], seed + 1000 + i, 0);
}

/* What the kernel lacks: cuda must refuse it with a reason that names it. */
static void test_refused(attn_ctx *ctx) {
  static const struct {
    const char *extra, *reason;
  } cases[] = {
      {"d128 softcap=5", "soft cap"},      {"d128 alibi=h", "ALiBi"},
      {"d128 bias=1x1x65x129", "bias"},    {"d128 mask=2x1x65x129", "mask"},
      {"d128 segments", "segment ids"},    {"d128 dropout=0.25", "dropout"},
      {"d64", "head dims 128 and 256"},    {"d128 dv64", "Dv = D"},
      {"d128 op=sdpa", "flash_attention"}, {"d128 paged=16 new=1", "paged"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; ++i) {
    char text[256];
    snprintf(text, sizeof text, "b2 hq4 hkv2 sq65 sk129 %s fp8 device=cuda", cases[i].extra);
    attn_problem p;
    if (attn_problem_parse(ctx, text, &p) != ATTN_STATUS_OK) {
      tu_check(0, "%s: does not parse: %s", text, attn_ctx_last_error(ctx));
      continue;
    }
    attn_status st = attn_impl_supports(ctx, "cuda", &p);
    const char *why = attn_ctx_last_error(ctx);
    tu_check(st == ATTN_STATUS_UNSUPPORTED && strstr(why, cases[i].reason) != NULL,
             "%s: cuda refuses it naming \"%s\": %s: %s", text, cases[i].reason,
             attn_status_string(st), why);
  }
}

int main(int argc, char **argv) {
  const char *filter = argc > 1 ? argv[1] : NULL;
  char why[512] = "";
  if (h_gpu_count(why, sizeof why) <= 0) {
    printf("skip: %s\n", why);
    return 77;
  }
  const uint64_t seed = tu_seed("test_fp8_cuda");
  attn_ctx *ctx = NULL;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) return 1;
  attn_problem p;
  attn_status st = attn_problem_parse(ctx, "b1 hq2 hkv2 sq65 sk65 d128 fp8 device=cuda", &p);
  if (st == ATTN_STATUS_OK) st = attn_impl_supports(ctx, "cuda", &p);
  if (st != ATTN_STATUS_OK) { /* not a Hopper device (or no sm90 build): the refusal says why */
    const char *msg = attn_ctx_last_error(ctx);
    tu_check(st == ATTN_STATUS_UNSUPPORTED &&
                 (strstr(msg, "9.0") != NULL || strstr(msg, "sm90") != NULL),
             "cuda refuses fp8 off compute capability 9.0 with the reason: %s", msg);
    attn_ctx_destroy(ctx);
    return tu_finish();
  }
  test_refused(ctx);
  if (filter == NULL) test_empty(ctx, seed);
  test_grid(ctx, seed, filter);
  attn_ctx_destroy(ctx);
  return tu_finish();
}
