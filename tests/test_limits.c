/*
 * tests/test_limits.c - problems at the edges of what validation admits (issue 19), and the
 * problem-string refusals that used to slip through (issue 11).
 *
 * Workspace queries of huge problems: validation admits tensors of up to 2^56 elements, so a
 * workspace formula multiplying a head dim by itself, or a length by a head dim and a block size,
 * can pass 2^64. The query must then report SIZE_MAX (which no allocation satisfies), never a
 * wrapped small size that a caller would allocate and the kernels overrun; a problem that is huge
 * but countable must keep its exact size.
 *
 * Problem strings: a field set twice is refused naming both tokens; scale=nan and scale=inf parse
 * as numbers and are refused by validation with SPEC's rule; a malformed key=value names its form.
 */
#include "testutil.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* A plan of exactly impl/config, without the executor's tuning (one candidate). */
static attn_status plan_exact(attn_ctx *ctx, const attn_problem *p, const char *impl,
                              const char *config, attn_plan **plan) {
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = impl;
  sel.config = config;
  return attn_plan_create(ctx, p, &sel, plan);
}

/* Every configuration of impl for the problem reports SIZE_MAX for both passes. */
static void expect_saturated(attn_ctx *ctx, const char *text, const char *impl) {
  attn_problem p;
  attn_status st = attn_problem_parse(ctx, text, &p);
  tu_check(st == ATTN_STATUS_OK, "parse \"%s\" (%s)", text, attn_ctx_last_error(ctx));
  int32_t configs = 0;
  st = attn_impl_config_count(ctx, impl, &p, &configs);
  tu_check(st == ATTN_STATUS_OK && configs > 0, "%s supports \"%s\" (%s)", impl, text,
           attn_ctx_last_error(ctx));
  for (int32_t c = 0; c < configs; ++c) {
    char config[128];
    attn_impl_config_name(ctx, impl, &p, c, config, sizeof config);
    attn_plan *plan = NULL;
    st = plan_exact(ctx, &p, impl, config, &plan);
    tu_check(st == ATTN_STATUS_OK, "%s %s plans \"%s\" (%s)", impl, config, text,
             attn_ctx_last_error(ctx));
    if (st != ATTN_STATUS_OK) continue;
    size_t forward = 0, backward = 0;
    st = attn_plan_workspace_size(plan, &forward, &backward);
    tu_check(st == ATTN_STATUS_OK && forward == SIZE_MAX && backward == SIZE_MAX,
             "%s %s \"%s\": workspace saturates (forward %zu, backward %zu, want %zu)", impl,
             config, text, forward, backward, (size_t)SIZE_MAX);
    attn_plan_destroy(plan);
  }
}

static void test_workspace_saturates(attn_ctx *ctx) {
  /* head_dim 2^40: the cpu's gemm scratch is ~2 * D * D bytes per thread, about 2^82. */
  expect_saturated(ctx, "b1 hq1 sq1 sk1 d1099511627776", "cpu");
  /* head_dim 2^55 with 2 key rows: the packed K block alone is bk * D floats, past 2^63. */
  expect_saturated(ctx, "b1 hq1 sq1 sk2 d36028797018963968 bf16", "cpu");
}

/* A huge but countable workspace keeps its exact size: the reference's backward keeps K and V in
 * f64 (rows_k * Hkv * (D + Dv) doubles), plus two query rows and an output row. */
static void test_workspace_exact(attn_ctx *ctx) {
  const char *text = "b1 hq1 sq1 sk1099511627776 d64 f64";
  attn_problem p;
  attn_problem_parse(ctx, text, &p);
  attn_plan *plan = NULL;
  attn_status st = plan_exact(ctx, &p, "ref", NULL, &plan);
  tu_check(st == ATTN_STATUS_OK, "ref plans \"%s\" (%s)", text, attn_ctx_last_error(ctx));
  if (st != ATTN_STATUS_OK) return;
  size_t forward = 0, backward = 0;
  attn_plan_workspace_size(plan, &forward, &backward);
  const uint64_t tk = (uint64_t)1 << 40, d = 64, align = 64;
  const uint64_t want_forward = (tk + d + d) * 8 + tk + align;
  const uint64_t want_backward = (tk * (d + d) + 2 * d + d) * 8 + align;
  tu_check(forward == want_forward && backward == want_backward,
           "ref \"%s\": exact workspace (forward %zu want %llu, backward %zu want %llu)", text,
           forward, (unsigned long long)want_forward, backward, (unsigned long long)want_backward);
  attn_plan_destroy(plan);
}

/* parse must fail with a message containing every one of the words. */
static void expect_refused(attn_ctx *ctx, const char *text, const char *word1, const char *word2) {
  attn_problem p;
  attn_status st = attn_problem_parse(ctx, text, &p);
  const char *msg = attn_ctx_last_error(ctx);
  tu_check(st == ATTN_STATUS_INVALID_ARGUMENT && strstr(msg, word1) != NULL &&
               (word2 == NULL || strstr(msg, word2) != NULL),
           "parse refuses \"%s\" naming \"%s\"%s%s: \"%s\"", text, word1, word2 ? " and " : "",
           word2 ? word2 : "", msg);
}

static void test_parse_refusals(attn_ctx *ctx) {
  expect_refused(ctx, "b1 b2 hq1 sq4 d8", "\"b1\" and \"b2\"", "batch");
  expect_refused(ctx, "hq1 sq4 d8 bf16 f16", "\"bf16\" and \"f16\"", "dtype");
  expect_refused(ctx, "hq1 sq4 d8 f16 dtype=bf16", "\"f16\" and \"dtype=bf16\"", NULL);
  expect_refused(ctx, "h2 hq2 sq4 d8", "\"h2\" and \"hq2\"", "heads_q");
  expect_refused(ctx, "hq1 s4 sk8 d8", "\"s4\" and \"sk8\"", "seqlen_k");
  expect_refused(ctx, "hq1 sq4 d8 causal causal", "\"causal\" and \"causal\"", NULL);
  expect_refused(ctx, "hq1 sq4 d8 scale=1 scale=2", "\"scale=1\" and \"scale=2\"", NULL);
  expect_refused(ctx, "hq1 sq4 d8 window=5", "window=5", "window=L,R");
  expect_refused(ctx, "hq1 sq4 d8 device=gpu", "device=gpu", "device=cuda:N");
  expect_refused(ctx, "hq1 sq4 d8 alibi=x", "alibi=x", "alibi=bh");
  expect_refused(ctx, "b1.5 hq1 sq4 d8", "b1.5", "whole number");
  /* 1e-400 would read as 0, which means "the default scale": refused rather than reinterpreted */
  expect_refused(ctx, "hq1 sq4 d8 scale=1e-400", "scale=1e-400", "read as 0");
}

/* nan and inf are numbers to the parser; validation refuses them by SPEC's rule for the field. */
static void test_nonfinite_fields(attn_ctx *ctx) {
  static const struct {
    const char *text, *rule;
  } cases[] = {
      {"hq1 sq4 d8 scale=nan", "scale=nan must be finite"},
      {"hq1 sq4 d8 scale=inf", "scale=inf must be finite"},
      {"hq1 sq4 d8 scale=-inf", "scale=-inf must be finite"},
      {"hq1 sq4 d8 scale=1e999", "scale=inf must be finite"},
      {"hq1 sq4 d8 softcap=inf", "softcap=inf must be finite"},
      {"hq1 sq4 d8 softcap=nan", "softcap=nan must be finite"},
      {"hq1 sq4 d8 dropout=nan", "dropout_p=nan must be in [0, 1)"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    attn_problem p;
    attn_status st = attn_problem_parse(ctx, cases[i].text, &p);
    tu_check(st == ATTN_STATUS_OK, "\"%s\" parses (%s)", cases[i].text, attn_ctx_last_error(ctx));
    if (st != ATTN_STATUS_OK) continue;
    attn_plan *plan = NULL;
    st = plan_exact(ctx, &p, "ref", NULL, &plan);
    tu_check(st == ATTN_STATUS_INVALID_ARGUMENT &&
                 strstr(attn_ctx_last_error(ctx), cases[i].rule) != NULL,
             "\"%s\" is refused by validation with \"%s\": \"%s\"", cases[i].text, cases[i].rule,
             attn_ctx_last_error(ctx));
    attn_plan_destroy(plan);
  }
}

int main(void) {
  attn_ctx *ctx = NULL;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) {
    tu_check(0, "attn_ctx_create");
    return tu_finish();
  }
  /* Plans here are exact (one candidate), so no policy could make them tune huge scratch data. */
  test_workspace_saturates(ctx);
  test_workspace_exact(ctx);
  test_parse_refusals(ctx);
  test_nonfinite_fields(ctx);
  attn_ctx_destroy(ctx);
  return tu_finish();
}
