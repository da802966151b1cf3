/*
 * tests/test_fp8.c - the f8e4m3 forward (docs/FP8.md): the e4m3 codec, the public form (problem
 * strings, validation, tensor shapes, the refused backward), and ref and cpu against the f64
 * reference.
 *
 * The grid goes through the attn tool's oracle (tools/harness.c, what `attn check` runs): e4m3
 * inputs and descale factors drawn from the printed seed, the f64 reference on the decoded values,
 * and the rule of tests/tolerance.h (tol_bound_fp8: 2 x err(naive) + 2^-6 x max|r| for out, with
 * naive the reference rounding P to e4m3 as FlashAttention-3 does). Sizes are odd (1, 3, 17, 63,
 * 65, 127, 129, 1000), every forward feature runs alone and with the others, the descale factors
 * are absent, one per tensor or one per (batch entry, KV head), out is bf16, f16 or f32, and cpu
 * runs on each instruction-set path it has (ATTN_CPU_ISA) with its smallest and largest blocks.
 *
 * Two cases build their data by hand and are compared here with the f64 reference run on the
 * decoded values times their factors: saturating values (+-448 and values rounded to it), and the
 * NaN pattern in one element of k and of v, which must reach exactly the rows (and for v the
 * column) that see it. No golden case holds fp8 (no independent oracle here has it); the f64
 * reference on the decoded values is the oracle.
 *
 * Usage: test_fp8 [filter]   runs only grid cases whose problem string contains filter.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "core/dtype.h"
#include "core/tensors.h"
#include "harness.h"
#include "plan/plan.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the e4m3 codec -------------------------------------------------------------------------- */

static void test_codec(void) {
  /* every pattern decodes to the value of OCP E4M3FN's table and encodes back to itself */
  int exact = 1, table = 1;
  for (int bits = 0; bits < 256; ++bits) {
    const float v = attn_f8e4m3_to_f32((uint8_t)bits);
    const int e = (bits >> 3) & 15, m = bits & 7;
    const double want = (e == 15 && m == 7) ? NAN
                        : e == 0            ? m * 0x1p-9
                                            : ldexp(1.0 + m / 8.0, e - 7);
    const double signed_want = (bits & 0x80) ? -want : want;
    if (isnan(want) ? !isnan(v) : (double)v != signed_want) table = 0;
    const uint8_t back = attn_f32_to_f8e4m3(v);
    if (isnan(want) ? back != (uint8_t)(bits | 0x7f) : back != bits)
      exact = 0;
  }
  tu_check(table, "codec: the 256 patterns decode to E4M3FN's values (0x7e = 448, 0x01 = 2^-9, "
                  "S.1111.111 = NaN)");
  tu_check(exact, "codec: every pattern encodes back to itself (NaN to 0x7f with its sign)");
  struct {
    float in;
    uint8_t out;
    const char *why;
  } cases[] = {
      {1.0625f, 0x38, "1 + 1/16 ties to even: 1"},
      {1.1875f, 0x3a, "1 + 3/16 ties to even: 1.25"},
      {1.07f, 0x39, "above the tie: 1.125"},
      {0x1p-10f, 0x00, "2^-10 ties to even: 0"},
      {3 * 0x1p-10f, 0x02, "3 * 2^-10 ties to even: 2^-8 (subnormal 2)"},
      {15 * 0x1p-10f, 0x08, "15 * 2^-10 rounds up to the smallest normal 2^-6"},
      {-0.0f, 0x80, "-0 keeps its sign"},
      {460.0f, 0x7e, "460 rounds to 448"},
      {1000.0f, 0x7e, "1000 saturates to 448"},
      {-INFINITY, 0xfe, "-inf saturates to -448"},
      {240.0f, 0x77, "240 is exact"},
      {-0.3f, 0xaa, "-0.3 rounds to -0.3125"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; ++i) {
    const uint8_t got = attn_f32_to_f8e4m3(cases[i].in);
    tu_check(got == cases[i].out, "codec: %s (0x%02x, got 0x%02x)", cases[i].why,
             (unsigned)cases[i].out, (unsigned)got);
  }
  tu_check(attn_f32_to_f8e4m3(NAN) == 0x7f && isnan(attn_f8e4m3_to_f32(0xff)),
           "codec: NaN encodes as 0x7f, 0xff decodes to NaN");
  tu_check(attn_dtype_size(ATTN_DTYPE_F8E4M3) == 1 &&
               strcmp(attn_dtype_name(ATTN_DTYPE_F8E4M3), "f8e4m3") == 0,
           "dtype: f8e4m3 is 1 byte, named \"f8e4m3\"");
}

/* ---- the public form ------------------------------------------------------------------------- */

static int parses_to(attn_ctx *ctx, const char *text, const char *want) {
  attn_problem p;
  if (attn_problem_parse(ctx, text, &p) != ATTN_STATUS_OK) return 0;
  char buf[512];
  attn_problem_to_string(&p, buf, sizeof buf);
  attn_problem again;
  if (attn_problem_parse(ctx, buf, &again) != ATTN_STATUS_OK) return 0;
  return strcmp(buf, want) == 0 && again.dtype == p.dtype && again.out_dtype == p.out_dtype &&
         again.descale == p.descale;
}

/* Whether the problem string is refused by plan creation with status and a message holding want. */
static int refused(attn_ctx *ctx, const char *text, attn_status status, const char *want) {
  attn_problem p;
  if (attn_problem_parse(ctx, text, &p) != ATTN_STATUS_OK) return 0;
  attn_plan *plan = NULL;
  attn_status s = attn_plan_create(ctx, &p, NULL, &plan);
  attn_plan_destroy(plan);
  const int ok = s == status && strstr(attn_ctx_last_error(ctx), want) != NULL;
  if (!ok) printf("  \"%s\": status %d, message \"%s\"\n", text, (int)s, attn_ctx_last_error(ctx));
  return ok;
}

static void test_api(attn_ctx *ctx) {
  tu_check(parses_to(ctx, "hq2 sq3 d8 fp8", "b1 hq2 hkv2 sq3 sk3 d8 f8e4m3") &&
               parses_to(ctx, "hq2 sq3 d8 e4m3 descale=bhkv out=f32",
                         "b1 hq2 hkv2 sq3 sk3 d8 f8e4m3 out=f32 descale=bhkv") &&
               parses_to(ctx, "hq2 sq3 d8 dtype=f8e4m3 descale=tensor out=bf16",
                         "b1 hq2 hkv2 sq3 sk3 d8 f8e4m3 out=bf16 descale=tensor"),
           "problem strings: fp8 and e4m3 read as f8e4m3; out= and descale= round-trip");
  attn_problem p;
  tu_check(attn_problem_parse(ctx, "hq2 sq3 d8 fp8 descale=bh", &p) ==
                   ATTN_STATUS_INVALID_ARGUMENT &&
               strstr(attn_ctx_last_error(ctx), "descale=tensor") != NULL,
           "problem strings: an unknown descale value names the forms");

  tu_check(refused(ctx, "hq2 sq3 d8 bf16 descale=tensor", ATTN_STATUS_INVALID_ARGUMENT,
                   "descale factors belong to f8e4m3 inputs only"),
           "validation: descale on a bf16 problem is refused");
  tu_check(refused(ctx, "hq2 sq3 d8 bf16 out=f32", ATTN_STATUS_INVALID_ARGUMENT,
                   "only an f8e4m3 problem writes another"),
           "validation: out_dtype other than dtype on a bf16 problem is refused");
  tu_check(refused(ctx, "hq2 sq3 d8 fp8 out=f8e4m3", ATTN_STATUS_INVALID_ARGUMENT,
                   "out must be bf16 (the default, -1), f16 or f32") &&
               refused(ctx, "hq2 sq3 d8 fp8 out=f64", ATTN_STATUS_INVALID_ARGUMENT,
                       "out must be bf16 (the default, -1), f16 or f32"),
           "validation: an fp8 out of f8e4m3 or f64 is refused, naming the rule");

  /* shapes and dtypes of the descale roles and of out */
  attn_problem_parse(ctx, "b3 hq4 hkv2 sq5 d8 fp8 descale=bhkv out=f16", &p);
  int32_t ndim;
  int64_t shape[ATTN_MAX_DIMS], numel;
  attn_dtype dt, out_dt;
  attn_problem_tensor(ctx, &p, ATTN_ROLE_K_DESCALE, &ndim, shape, &numel, &dt);
  attn_problem_tensor(ctx, &p, ATTN_ROLE_OUT, NULL, NULL, NULL, &out_dt);
  tu_check(ndim == 2 && shape[0] == 3 && shape[1] == 2 && dt == ATTN_DTYPE_F32 &&
               out_dt == ATTN_DTYPE_F16 &&
               strcmp(attn_role_name(ATTN_ROLE_V_DESCALE), "v_descale") == 0,
           "tensors: descale=bhkv is f32 [B, Hkv]; out is the problem's out_dtype");
  p.descale = ATTN_DESCALE_TENSOR;
  attn_problem_tensor(ctx, &p, ATTN_ROLE_Q_DESCALE, &ndim, shape, &numel, &dt);
  tu_check(ndim == 1 && numel == 1, "tensors: descale=tensor is f32 [1]");
  p.descale = ATTN_DESCALE_NONE;
  tu_check(attn_problem_numel(&p, ATTN_ROLE_Q_DESCALE) == 0 &&
               attn_problem_numel(&p, ATTN_ROLE_OUT) == 3 * 5 * 4 * 8,
           "tensors: without descale the factors are not used");

  /* a run: a missing factor is refused by name; the backward is UNSUPPORTED with the reason */
  attn_problem_parse(ctx, "b1 hq1 sq2 d4 fp8 descale=tensor", &p);
  uint8_t q[8] = {0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38};
  uint16_t out[8], dq[8];
  float lse[2], one = 1.0f;
  tu_args a;
  tu_args_dense(&a, q, q, q, out, lse, out, dq, dq, dq);
  a.in.q_descale = attn_tensor_dense(&one), a.in.v_descale = attn_tensor_dense(&one);
  attn_plan *plan = NULL;
  attn_status s = attn_plan_create(ctx, &p, NULL, &plan);
  attn_status f = s == ATTN_STATUS_OK ? attn_plan_forward(plan, &a.in, NULL, 0, &a.out) : s;
  tu_check(f == ATTN_STATUS_INVALID_ARGUMENT &&
               strstr(attn_ctx_last_error(ctx), "k_descale.data is NULL") != NULL,
           "run: a missing k_descale is refused by name (%s)", attn_ctx_last_error(ctx));
  a.in.k_descale = attn_tensor_dense(&one);
  f = s == ATTN_STATUS_OK ? attn_plan_forward(plan, &a.in, NULL, 0, &a.out) : s;
  tu_check(f == ATTN_STATUS_OK && attn_bf16_to_f32(out[0]) == 1.0f,
           "run: ones in, ones out (%s)", attn_plan_impl_name(plan));
  attn_status b = s == ATTN_STATUS_OK
                      ? attn_plan_backward(plan, &a.in, &a.out, &a.dout, NULL, 0, &a.grads)
                      : s;
  tu_check(b == ATTN_STATUS_UNSUPPORTED &&
               strstr(attn_ctx_last_error(ctx), "backward of an f8e4m3 problem") != NULL,
           "run: the backward is UNSUPPORTED, saying why");
  attn_plan_destroy(plan);
}

/* The naive run that sets the tolerance rounds P as FlashAttention-3 does: p = exp(x - m) times
 * 2^8 to e4m3, back to the value, Z from the unrounded p. One query, keys x = (1, 0.5): p = (1,
 * e^-0.5), 256 e^-0.5 = 155.3 rounds to 160 (e4m3's step is 16 there), so out = (v0 + 0.625 v1) /
 * (1 + e^-0.5). The 2^8 is a power of two, so it changes only what falls below e4m3's normal range
 * (2^-6): the second row (q = 9, x = (9, 4.5)) has p = e^-4.5 = 0.0111, whose 2^8 multiple 2.84
 * rounds to 2.75 (0.01074), while unscaled it is a subnormal and rounds to 6 x 2^-9 (0.01172). */
static void test_naive(attn_ctx *ctx) {
  attn_problem p;
  attn_problem_parse(ctx, "b1 hq1 sq2 sk2 d1 fp8 scale=1 out=f32", &p);
  const uint8_t q[2] = {attn_f32_to_f8e4m3(1.0f), attn_f32_to_f8e4m3(9.0f)};
  const uint8_t k[2] = {attn_f32_to_f8e4m3(1.0f), attn_f32_to_f8e4m3(0.5f)};
  const uint8_t v[2] = {attn_f32_to_f8e4m3(1.0f), attn_f32_to_f8e4m3(-1.0f)};
  float out[2] = {0, 0}, lse[2];
  tu_args a;
  tu_args_dense(&a, (void *)q, (void *)k, (void *)v, out, lse, NULL, NULL, NULL, NULL);
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = "ref";
  attn_plan *plan = NULL;
  attn_status s = attn_plan_create(ctx, &p, &sel, &plan);
  if (s == ATTN_STATUS_OK) {
    attn_plan_set_rounding(plan, ATTN_DTYPE_F8E4M3);
    s = attn_plan_forward(plan, &a.in, NULL, 0, &a.out);
  }
  attn_plan_destroy(plan);
  const double p0 = exp(-0.5), p1 = exp(-4.5);
  const double want0 = (1.0 - 160.0 / 256.0) / (1.0 + p0);
  const double want1 = (1.0 - 2.75 / 256.0) / (1.0 + p1);
  tu_check(s == ATTN_STATUS_OK && fabs(out[0] - want0) < 1e-6 && fabs(out[1] - want1) < 1e-6,
           "naive: P is rounded as 2^8 p in e4m3 (out %.7f %.7f, want %.7f %.7f)", out[0], out[1],
           want0, want1);
}

/* ---- the grid, through the attn tool's oracle ------------------------------------------------ */

static const char *const cpu_isas[] = {"generic", "avx2", NULL /* the best */};

/* Checks ref and cpu on one problem string; the oracle is made once per problem. A problem of many
 * query rows must have some nonzero output (descale factors that never reached a run read as 0,
 * and a check of zeros against zeros passes). */
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
  struct {
    const char *impl, *config, *isa;
  } runs[] = {{"ref", NULL, NULL},
              {"cpu", "bq32_bk64", cpu_isas[0]},
              {"cpu", "bq128_bk256", cpu_isas[1]},
              {"cpu", "bq32_bk64", cpu_isas[2]},
              {"cpu", NULL, cpu_isas[2]}};
  /* cpu never forms the probabilities (op=sdpa): said, not failed; ref runs every problem */
  const int cpu_runs = attn_impl_supports(ctx, "cpu", &p) == ATTN_STATUS_OK;
  if (!cpu_runs) printf("skip %s: %s\n", text, attn_ctx_last_error(ctx));
  for (size_t r = 0; r < sizeof runs / sizeof *runs; ++r) {
    if (!cpu_runs && strcmp(runs[r].impl, "cpu") == 0) continue;
    if (runs[r].isa != NULL) setenv("ATTN_CPU_ISA", runs[r].isa, 1);
    else unsetenv("ATTN_CPU_ISA");
    h_check c = h_check_run(ctx, oracle, runs[r].impl, runs[r].config);
    unsetenv("ATTN_CPU_ISA");
    if (c.status != ATTN_STATUS_OK) {
      tu_check(0, "%s: %s %s: %s", text, runs[r].impl, runs[r].config ? runs[r].config : "",
               attn_ctx_last_error(ctx));
      continue;
    }
    tu_check(c.ok && (c.ref[0] > 0.0 || !expect_nonzero),
             "%s: %s %s%s%s out %.2e/%.2e (max|r| %.2e) lse %.2e/%.2e", text, runs[r].impl,
             runs[r].config ? runs[r].config : "default", runs[r].isa ? " isa=" : "",
             runs[r].isa ? runs[r].isa : "", c.err[0], c.tol[0], c.ref[0], c.err[1], c.tol[1]);
  }
  h_oracle_free(oracle);
}

/* The sizes of the grid: B, Hq, Hkv, Tq, Tk, D, Dv (0 = D). */
static const int64_t grid_sizes[][7] = {
    {1, 1, 1, 1, 1, 8, 0},    {2, 4, 2, 17, 63, 64, 0},   {3, 6, 3, 65, 129, 72, 40},
    {1, 2, 1, 129, 127, 128, 0}, {2, 8, 1, 3, 1000, 96, 0}, {1, 2, 2, 1000, 65, 32, 0},
};

/* The features, each alone and then all together (%B, %H, %Q, %K: batch, kv heads, Tq, Tk). */
static const char *const grid_features[] = {
    "",
    "causal",
    "causal align=tl",
    "window=16,3",
    "softcap=5",
    "sinks=3",
    "sinks=2:shared",
    "alibi=h",
    "alibi=bh",
    "dropout=0.25",
    "bias=%Bx%Hx%Qx%K",
    "bias=1x1x%Qx%K:bf16",
    "mask=%Bx1x%Qx%K",
    "segments",
    "varlen=padded",
    "varlen=packed",
    "paged=16 new=1",
    "op=sdpa",
    "causal softcap=20 sinks=2 alibi=bh dropout=0.1 bias=1x%Hx%Qx%K mask=%Bx1x%Qx%K segments",
    "window=40,0 sinks=1 alibi=h varlen=padded dropout=0.2",
};

/* feature with its size placeholders filled in */
static void expand(const char *feature, const int64_t *s, char *buf, size_t size) {
  size_t at = 0;
  for (const char *c = feature; *c && at + 24 < size; ++c) {
    if (*c == '%' && c[1]) {
      const int64_t v = c[1] == 'B' ? s[0] : c[1] == 'H' ? s[2] : c[1] == 'Q' ? s[3] : s[4];
      at += (size_t)snprintf(buf + at, size - at, "%lld", (long long)v);
      ++c;
    } else {
      buf[at++] = *c;
    }
  }
  buf[at] = '\0';
}

static void test_grid(attn_ctx *ctx, uint64_t seed, const char *filter) {
  static const char *const descales[] = {"", " descale=tensor", " descale=bhkv"};
  static const char *const outs[] = {"", " out=f32", "", " out=f16"};
  int n = 0;
  for (size_t si = 0; si < sizeof grid_sizes / sizeof *grid_sizes; ++si)
    for (size_t fi = 0; fi < sizeof grid_features / sizeof *grid_features; ++fi, ++n) {
      const int64_t *s = grid_sizes[si];
      char feature[256], text[512], extra[96] = "";
      expand(grid_features[fi], s, feature, sizeof feature);
      /* packed varlen: every row of the tensors, the harness draws the lengths */
      if (strstr(feature, "varlen=packed") != NULL)
        snprintf(extra, sizeof extra, ":%lld,%lld", (long long)(s[0] * s[3]),
                 (long long)(s[0] * s[4]));
      char dv[32] = "";
      if (s[6] != 0) snprintf(dv, sizeof dv, " dv%lld", (long long)s[6]);
      snprintf(text, sizeof text, "b%lld hq%lld hkv%lld sq%lld sk%lld d%lld%s fp8 %s%s%s%s",
               (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3],
               (long long)s[4], (long long)s[5], dv, feature, extra, descales[n % 3], outs[n % 4]);
      if (filter != NULL && strstr(text, filter) == NULL) continue;
      check_problem(ctx, text, seed + (uint64_t)n, s[0] * s[3] >= 17);
    }
}

/* ---- hand-made data: saturation and NaN ------------------------------------------------------ */

/* A dense fp8 problem's inputs: q, k, v and their descale tensors (per batch entry and KV head). */
typedef struct fp8_data {
  tu_buf x[3], descale[3]; /* q, k, v */
} fp8_data;

static fp8_data data_new(const attn_problem *p) {
  fp8_data d;
  for (int t = 0; t < 3; ++t) {
    d.x[t] = tu_buf_new(ATTN_DTYPE_F8E4M3, attn_problem_numel(p, (attn_role)(ATTN_ROLE_Q + t)));
    d.descale[t] =
        tu_buf_new(ATTN_DTYPE_F32, attn_problem_numel(p, (attn_role)(ATTN_ROLE_Q_DESCALE + t)));
  }
  return d;
}

static void data_free(fp8_data *d) {
  for (int t = 0; t < 3; ++t) tu_buf_free(&d->x[t]), tu_buf_free(&d->descale[t]);
}

/* Element e of tensor t (0 q, 1 k, 2 v; dense [B, T, H, W]) decoded, times its factor: exact in
 * f64 (4 significant bits times 24). */
static double decoded(const attn_problem *p, const fp8_data *d, int t, int64_t e) {
  const int64_t heads = t == 0 ? p->heads_q : p->heads_kv;
  const int64_t width = t == 2 && p->head_dim_v > 0 ? p->head_dim_v : p->head_dim;
  const int64_t tokens = t == 0 ? p->seqlen_q : p->seqlen_k;
  const int64_t b = e / (tokens * heads * width), h = e / width % heads;
  const int64_t g = t == 0 ? h / (p->heads_q / p->heads_kv) : h;
  return tu_get(&d->x[t], e) * tu_get(&d->descale[t], b * p->heads_kv + g);
}

/* out and lse of impl on the problem (rounding: the naive run's, or F64), or of the f64 problem on
 * the decoded values when impl is NULL. */
static int forward(attn_ctx *ctx, const attn_problem *p, const fp8_data *d, const char *impl,
                   attn_dtype rounding, tu_buf *out, tu_buf *lse) {
  attn_problem run = *p;
  tu_buf x64[3];
  tu_args a;
  if (impl == NULL) {
    run.dtype = ATTN_DTYPE_F64, run.descale = ATTN_DESCALE_NONE, run.out_dtype = -1;
    for (int t = 0; t < 3; ++t) {
      x64[t] = tu_buf_new(ATTN_DTYPE_F64, d->x[t].n);
      for (int64_t e = 0; e < d->x[t].n; ++e) tu_set(&x64[t], e, decoded(p, d, t, e));
    }
  }
  const int exact = impl == NULL;
  *out = tu_buf_new(exact ? ATTN_DTYPE_F64 : ATTN_DTYPE_BF16, attn_problem_numel(p, ATTN_ROLE_OUT));
  *lse = tu_buf_new(exact ? ATTN_DTYPE_F64 : ATTN_DTYPE_F32, attn_problem_numel(p, ATTN_ROLE_LSE));
  const tu_buf *in = impl == NULL ? x64 : d->x;
  tu_args_bufs(&a, &in[0], &in[1], &in[2], out, lse, NULL, NULL, NULL, NULL);
  if (impl != NULL) {
    a.in.q_descale = tu_tensor(&d->descale[0]);
    a.in.k_descale = tu_tensor(&d->descale[1]);
    a.in.v_descale = tu_tensor(&d->descale[2]);
  }
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = impl == NULL ? "ref" : impl;
  attn_plan *plan = NULL;
  attn_status s = attn_plan_create(ctx, &run, &sel, &plan);
  if (s == ATTN_STATUS_OK) {
    attn_plan_set_rounding(plan, rounding);
    s = attn_plan_forward(plan, &a.in, NULL, 0, &a.out);
  }
  attn_plan_destroy(plan);
  if (impl == NULL)
    for (int t = 0; t < 3; ++t) tu_buf_free(&x64[t]);
  if (s != ATTN_STATUS_OK) printf("  %s: %s\n", sel.impl, attn_ctx_last_error(ctx));
  return s == ATTN_STATUS_OK;
}

/* The finite difference of a from r, and in *pattern how many elements are NaN on one side only. */
static tol_err compare_nan_aware(const tu_buf *a, const tu_buf *r, int64_t *pattern) {
  tol_err e = tol_err_init();
  *pattern = 0;
  for (int64_t i = 0; i < r->n; ++i) {
    const double av = tu_get(a, i), rv = tu_get(r, i);
    if (isnan(av) || isnan(rv)) {
      *pattern += isnan(av) != isnan(rv);
      continue;
    }
    tol_err_add(&e, i, av, rv);
  }
  return e;
}

/* ref and cpu on hand-made data, against the f64 reference: NaN exactly where it has NaN, the
 * finite elements within tol_bound_fp8 (err(naive) measured on the finite elements). */
static void check_data(attn_ctx *ctx, const char *name, const attn_problem *p, const fp8_data *d,
                       int64_t want_nan_out, int64_t want_nan_lse) {
  tu_buf r_out, r_lse, n_out, n_lse, t_out, t_lse;
  if (!forward(ctx, p, d, NULL, ATTN_DTYPE_F64, &r_out, &r_lse) ||
      !forward(ctx, p, d, "ref", ATTN_DTYPE_F8E4M3, &n_out, &n_lse) ||
      !forward(ctx, p, d, "ref", ATTN_DTYPE_F64, &t_out, &t_lse)) {
    tu_check(0, "%s: the reference runs", name);
    return;
  }
  int64_t nan_out = 0, nan_lse = 0, unused;
  for (int64_t i = 0; i < r_out.n; ++i) nan_out += isnan(tu_get(&r_out, i));
  for (int64_t i = 0; i < r_lse.n; ++i) nan_lse += isnan(tu_get(&r_lse, i));
  tu_check(nan_out == want_nan_out && nan_lse == want_nan_lse,
           "%s: the f64 reference has NaN in %lld out and %lld lse elements (want %lld, %lld)",
           name, (long long)nan_out, (long long)nan_lse, (long long)want_nan_out,
           (long long)want_nan_lse);
  tol_err naive_o = compare_nan_aware(&n_out, &r_out, &unused),
          naive_l = compare_nan_aware(&n_lse, &r_lse, &unused),
          at_o = compare_nan_aware(&t_out, &r_out, &unused),
          at_l = compare_nan_aware(&t_lse, &r_lse, &unused);
  const double naive_out = tol_naive_error(&naive_o, &at_o, NULL),
               naive_lse = tol_naive_error(&naive_l, &at_l, NULL);
  static const char *const isas[] = {"generic", "avx2", "avx512", NULL};
  for (int i = -1; i < 4; ++i) { /* -1: ref itself; then cpu on each path */
    const char *impl = i < 0 ? "ref" : "cpu";
    if (i >= 0 && isas[i] != NULL) setenv("ATTN_CPU_ISA", isas[i], 1);
    tu_buf a_out, a_lse;
    const int ran = forward(ctx, p, d, impl, ATTN_DTYPE_F64, &a_out, &a_lse);
    unsetenv("ATTN_CPU_ISA");
    if (!ran) {
      tu_check(0, "%s: %s runs", name, impl);
      continue;
    }
    int64_t pattern_out, pattern_lse;
    tol_err eo = compare_nan_aware(&a_out, &r_out, &pattern_out);
    tol_err el = compare_nan_aware(&a_lse, &r_lse, &pattern_lse);
    const double bo = tol_bound(ATTN_DTYPE_F8E4M3, TOL_FORWARD, eo.max_ref, naive_out, NULL);
    const double bl = tol_bound(ATTN_DTYPE_F8E4M3, TOL_LSE, el.max_ref, naive_lse, NULL);
    tu_check(pattern_out == 0 && pattern_lse == 0 && tol_ok(&eo, bo) && tol_ok(&el, bl),
             "%s: %s%s%s NaN where the reference's are (%lld, %lld elsewhere), out %.2e/%.2e "
             "lse %.2e/%.2e",
             name, impl, i >= 0 ? " isa=" : "", i >= 0 ? (isas[i] ? isas[i] : "best") : "",
             (long long)pattern_out, (long long)pattern_lse, eo.max_abs, bo, el.max_abs, bl);
    tu_buf_free(&a_out), tu_buf_free(&a_lse);
  }
  tu_buf_free(&r_out), tu_buf_free(&r_lse), tu_buf_free(&n_out), tu_buf_free(&n_lse);
  tu_buf_free(&t_out), tu_buf_free(&t_lse);
}

/* Values over all of e4m3's range, a tenth of them at +-448 or past it (rounded to 448 on the
 * way in), with factors that bring the logits to ordinary sizes: the data of a per-tensor
 * quantiser that used the whole range. */
static void test_saturating(attn_ctx *ctx, tu_rng *rng) {
  attn_problem p;
  attn_problem_parse(ctx, "b2 hq4 hkv2 sq33 sk47 d40 fp8 causal descale=bhkv", &p);
  fp8_data d = data_new(&p);
  int64_t at_max = 0;
  for (int t = 0; t < 3; ++t) {
    for (int64_t e = 0; e < d.x[t].n; ++e) {
      const double u = tu_uniform(rng, 0.0, 1.0), sign = tu_uniform(rng, 0.0, 1.0) < 0.5 ? -1 : 1;
      tu_set(&d.x[t], e, u < 0.05 ? sign * 448.0 : u < 0.1 ? sign * 1000.0 : sign * 448.0 * u);
      at_max += fabs(tu_get(&d.x[t], e)) == 448.0;
    }
    for (int64_t e = 0; e < d.descale[t].n; ++e)
      tu_set(&d.descale[t], e, tu_uniform(rng, 0.5, 1.0) / 448.0);
  }
  tu_check(at_max > 0,
           "saturating: %lld elements at +-448 (1000 saturated on the way in)", (long long)at_max);
  check_data(ctx, "saturating", &p, &d, 0, 0);
  data_free(&d);
}

/* One NaN in k (key 5 of batch entry 0, KV head 0) and one in v (key 2 of batch entry 1, KV head
 * 1, column 0): causal rows i >= 5 of the query heads of KV head 0 in entry 0 are NaN in out and
 * lse; rows i >= 2 of KV head 1's query heads in entry 1 are NaN in out column 0 only. */
static void test_nan(attn_ctx *ctx, tu_rng *rng) {
  attn_problem p;
  attn_problem_parse(ctx, "b2 hq4 hkv2 sq17 sk17 d24 fp8 causal descale=bhkv", &p);
  fp8_data d = data_new(&p);
  for (int t = 0; t < 3; ++t) {
    tu_fill_uniform(&d.x[t], rng, -8.0, 8.0);
    tu_fill_uniform(&d.descale[t], rng, 0.05, 0.2);
  }
  const int64_t T = 17, Hkv = 2, D = 24, group = 2;
  ((uint8_t *)d.x[1].data)[((0 * T + 5) * Hkv + 0) * D + 7] = 0x7f;
  ((uint8_t *)d.x[2].data)[((1 * T + 2) * Hkv + 1) * D + 0] = 0xff;
  const int64_t k_rows = (T - 5) * group, v_rows = (T - 2) * group;
  check_data(ctx, "nan", &p, &d, k_rows * D + v_rows, k_rows);
  data_free(&d);
}

int main(int argc, char **argv) {
  const char *filter = argc > 1 ? argv[1] : NULL;
  const uint64_t seed = tu_seed("test_fp8");
  tu_rng rng = tu_rng_make(seed);
  attn_ctx *ctx = NULL;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) return 1;
  if (filter == NULL) {
    test_codec();
    test_api(ctx);
    test_naive(ctx);
    test_saturating(ctx, &rng);
    test_nan(ctx, &rng);
  }
  test_grid(ctx, seed, filter);
  attn_ctx_destroy(ctx);
  return tu_finish();
}
