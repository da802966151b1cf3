/*
 * tests/test_api.c - the contract of attn.h, exercised through the public API only: status strings,
 * version, NULL handling, dtype queries, the bf16/f16 conversions (every pattern, and random f32
 * values against round-to-nearest-even by definition), the tensor shapes of a problem, logging,
 * every invalid input of SPEC.md "Errors" (refused with INVALID_ARGUMENT, a message naming the
 * argument, and nothing written), the valid edge problems (empty, no keys, caller workspace, the
 * conveniences against the plan path), and a broadcast 1-D input.
 *
 * Every refusal is checked the same way: all buffers of the run (inputs and outputs) are filled
 * first, snapshotted, and compared byte for byte afterwards, so a call that did some work before
 * refusing fails the test.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- helpers ---------------------------------------------------------------------------- */

/* Whether msg contains word with no identifier character just before or after it. */
static int has_word(const char *msg, const char *word) {
  size_t n = strlen(word);
  for (const char *at = strstr(msg, word); at != NULL; at = strstr(at + 1, word)) {
    int left_ok = at == msg || !(isalnum((unsigned char)at[-1]) || at[-1] == '_');
    int right_ok = !(isalnum((unsigned char)at[n]) || at[n] == '_');
    if (left_ok && right_ok) return 1;
  }
  return 0;
}

/* ---- the fixture: a small valid problem and a buffer for every tensor role ---------------- */

enum {
  B_Q,
  B_K,
  B_V,
  B_BIAS,
  B_MASK,
  B_ALIBI,
  B_SINKS,
  B_QSEG,
  B_KVSEG,
  B_OUT,
  B_LSE,
  B_PROBS,
  B_DOUT,
  B_DQ,
  B_DK,
  B_DV,
  B_DBIAS,
  B_DSINKS,
  B_COUNT
};

/* Each buffer holds CAP doubles: more than any tensor of the (mutated) problems below needs, so a
 * problem the library wrongly accepts cannot write outside them. */
#define CAP 8192
#define SENTINEL 0xA5

typedef struct fixture {
  attn_problem p;
  unsigned char *buf[B_COUNT];
  unsigned char *snap[B_COUNT];
  int32_t cu_q[4], cu_k[4], lens_q[3], lens_k[3];
  attn_inputs in;
  attn_outputs out;
  attn_tensor dout;
  attn_grads g;
} fixture;

static attn_problem base_problem(void) {
  attn_problem p;
  attn_problem_init(&p);
  p.batch = 2, p.seqlen_q = 3, p.seqlen_k = 5, p.heads_q = 4, p.heads_kv = 2, p.head_dim = 3;
  return p;
}

/* Fills the fixture: random finite inputs (mask all 1, segment ids 0), sentinel outputs. */
static void fixture_fill(fixture *f, tu_rng *rng) {
  for (int b = 0; b < B_COUNT; ++b) {
    if (b <= B_KVSEG || b == B_DOUT) {
      float *x = (float *)f->buf[b];
      for (int i = 0; i < CAP * 2; ++i) x[i] = (float)tu_uniform(rng, -1, 1);
    } else {
      memset(f->buf[b], SENTINEL, CAP * sizeof(double));
    }
  }
  memset(f->buf[B_MASK], 1, CAP * sizeof(double));
  memset(f->buf[B_QSEG], 0, CAP * sizeof(double));
  memset(f->buf[B_KVSEG], 0, CAP * sizeof(double));
}

static void fixture_init(fixture *f, tu_rng *rng) {
  memset(f, 0, sizeof *f);
  f->p = base_problem();
  for (int b = 0; b < B_COUNT; ++b) {
    f->buf[b] = malloc(CAP * sizeof(double));
    f->snap[b] = malloc(CAP * sizeof(double));
    if (f->buf[b] == NULL || f->snap[b] == NULL) {
      fprintf(stderr, "out of memory\n");
      exit(2);
    }
  }
  fixture_fill(f, rng);
  static const int32_t cu_q[] = {0, 3, 5}, cu_k[] = {0, 4, 9};
  memcpy(f->cu_q, cu_q, sizeof cu_q);
  memcpy(f->cu_k, cu_k, sizeof cu_k);
  f->lens_q[0] = 3, f->lens_q[1] = 1, f->lens_k[0] = 5, f->lens_k[1] = 2;
  attn_inputs_init(&f->in);
  f->in.q = attn_tensor_dense(f->buf[B_Q]);
  f->in.k = attn_tensor_dense(f->buf[B_K]);
  f->in.v = attn_tensor_dense(f->buf[B_V]);
  f->in.bias = attn_tensor_dense(f->buf[B_BIAS]);
  f->in.mask = attn_tensor_dense(f->buf[B_MASK]);
  f->in.alibi_slopes = attn_tensor_dense(f->buf[B_ALIBI]);
  f->in.sinks = attn_tensor_dense(f->buf[B_SINKS]);
  f->in.q_segment_ids = attn_tensor_dense(f->buf[B_QSEG]);
  f->in.kv_segment_ids = attn_tensor_dense(f->buf[B_KVSEG]);
  f->in.cu_seqlens_q = f->cu_q;
  f->in.cu_seqlens_k = f->cu_k;
  f->in.seqlens_q = f->lens_q;
  f->in.seqlens_k = f->lens_k;
  f->in.dropout_seed = 42;
  attn_outputs_init(&f->out);
  f->out.out = attn_tensor_dense(f->buf[B_OUT]);
  f->out.lse = attn_tensor_dense(f->buf[B_LSE]);
  f->dout = attn_tensor_dense(f->buf[B_DOUT]);
  attn_grads_init(&f->g);
  f->g.dq = attn_tensor_dense(f->buf[B_DQ]);
  f->g.dk = attn_tensor_dense(f->buf[B_DK]);
  f->g.dv = attn_tensor_dense(f->buf[B_DV]);
}

static void fixture_free(fixture *f) {
  for (int b = 0; b < B_COUNT; ++b) free(f->buf[b]), free(f->snap[b]);
}

static void snapshot(fixture *f) {
  for (int b = 0; b < B_COUNT; ++b) memcpy(f->snap[b], f->buf[b], CAP * sizeof(double));
}

/* The name of the first buffer that changed since the snapshot, or NULL. */
static const char *changed(const fixture *f) {
  static const char *const names[B_COUNT] = {"q",   "k",     "v",    "bias", "mask", "alibi",
                                             "sinks", "qseg", "kvseg", "out",  "lse",  "probs",
                                             "dout", "dq",    "dk",   "dv",   "dbias", "dsinks"};
  for (int b = 0; b < B_COUNT; ++b)
    if (memcmp(f->snap[b], f->buf[b], CAP * sizeof(double)) != 0) return names[b];
  return NULL;
}

/* Checks a refusal: INVALID_ARGUMENT, every word of `words` (NULL-terminated) in the message, and
 * no buffer touched. */
static void expect_refused(attn_ctx *ctx, fixture *f, attn_status st, const char *what,
                           const char *const *words) {
  const char *msg = attn_ctx_last_error(ctx);
  int words_ok = 1;
  const char *missing = "";
  for (const char *const *w = words; *w != NULL; ++w) {
    /* A bare name ("q", "dk") must appear as a whole word, so "dq" does not pass for "q"; a phrase
     * or "name=value" is searched as is. */
    int phrase = strpbrk(*w, " =[") != NULL;
    if (phrase ? strstr(msg, *w) == NULL : !has_word(msg, *w)) words_ok = 0, missing = *w;
  }
  const char *touched = changed(f);
  tu_check(st == ATTN_STATUS_INVALID_ARGUMENT && words_ok && touched == NULL &&
               attn_ctx_last_status(ctx) == ATTN_STATUS_INVALID_ARGUMENT,
           "%s: refused with %s, message \"%s\"%s%s%s%s", what, attn_status_string(st), msg,
           words_ok ? "" : " MISSING \"", words_ok ? "" : missing, words_ok ? "" : "\"",
           touched == NULL ? "" : " WROTE a buffer");
  if (touched != NULL) printf("  buffer changed: %s\n", touched);
}

#define WORDS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* A problem-level error: plan creation, attn_forward and attn_backward all refuse it. */
static void refuse_problem(attn_ctx *ctx, fixture *f, const attn_problem *p, const char *what,
                           const char *const *words) {
  char label[256];
  snapshot(f);
  attn_plan *plan = (attn_plan *)&plan; /* must be set to NULL on failure */
  attn_status st = attn_plan_create(ctx, p, NULL, &plan);
  snprintf(label, sizeof label, "%s (attn_plan_create)", what);
  expect_refused(ctx, f, st, label, words);
  tu_check(plan == NULL, "%s: attn_plan_create sets *plan = NULL on failure", what);
  if (st == ATTN_STATUS_OK && plan != NULL && plan != (attn_plan *)&plan) attn_plan_destroy(plan);

  st = attn_forward(ctx, p, &f->in, &f->out);
  snprintf(label, sizeof label, "%s (attn_forward)", what);
  expect_refused(ctx, f, st, label, words);
  st = attn_backward(ctx, p, &f->in, &f->out, &f->dout, &f->g);
  snprintf(label, sizeof label, "%s (attn_backward)", what);
  expect_refused(ctx, f, st, label, words);
}

/* A control: the problem is valid and runs forward (so that a refusal of a mutation of it is due to
 * the mutation). Refills the fixture afterwards. */
static void expect_valid(attn_ctx *ctx, fixture *f, tu_rng *rng, const attn_problem *p,
                         const char *what) {
  attn_status st = attn_forward(ctx, p, &f->in, &f->out);
  tu_check(st == ATTN_STATUS_OK, "control %s runs: %s", what, attn_ctx_last_error(ctx));
  fixture_fill(f, rng);
}

/* A run-level error, forward pass: a plan for p is made and then refuses the run. */
static void refuse_forward(attn_ctx *ctx, fixture *f, const attn_problem *p, const attn_inputs *in,
                           const attn_outputs *out, const char *what, const char *const *words) {
  attn_plan *plan = NULL;
  attn_status st = attn_plan_create(ctx, p, NULL, &plan);
  if (st != ATTN_STATUS_OK) {
    tu_check(0, "%s: the plan of the valid problem was refused: %s", what, attn_ctx_last_error(ctx));
    return;
  }
  snapshot(f);
  st = attn_plan_forward(plan, in, NULL, 0, out);
  expect_refused(ctx, f, st, what, words);
  attn_plan_destroy(plan);
}

static void refuse_backward(attn_ctx *ctx, fixture *f, const attn_problem *p, const attn_inputs *in,
                            const attn_outputs *fwd, const attn_tensor *dout, const attn_grads *g,
                            const char *what, const char *const *words) {
  attn_plan *plan = NULL;
  attn_status st = attn_plan_create(ctx, p, NULL, &plan);
  if (st != ATTN_STATUS_OK) {
    tu_check(0, "%s: the plan of the valid problem was refused: %s", what, attn_ctx_last_error(ctx));
    return;
  }
  snapshot(f);
  st = attn_plan_backward(plan, in, fwd, dout, NULL, 0, g);
  expect_refused(ctx, f, st, what, words);
  attn_plan_destroy(plan);
}

/* ---- status, version, NULL handling, dtypes ------------------------------------------------ */

static void test_status_strings(void) {
  for (int s = 0; s < ATTN_STATUS_COUNT; ++s) {
    const char *text = attn_status_string((attn_status)s);
    int distinct = 1;
    for (int t = 0; t < s; ++t)
      if (strcmp(text, attn_status_string((attn_status)t)) == 0) distinct = 0;
    tu_check(text != NULL && text[0] != '\0' && strcmp(text, "unknown status") != 0 && distinct,
             "attn_status_string(%d) = \"%s\" is non-empty and distinct", s, text ? text : "(null)");
  }
  tu_check(strcmp(attn_status_string(ATTN_STATUS_COUNT), "unknown status") == 0,
           "attn_status_string(COUNT) = \"unknown status\"");
  tu_check(strcmp(attn_status_string((attn_status)-1), "unknown status") == 0,
           "attn_status_string(-1) = \"unknown status\"");
  tu_check(strcmp(attn_status_string((attn_status)1000), "unknown status") == 0,
           "attn_status_string(1000) = \"unknown status\"");
  tu_check(ATTN_STATUS_OK == 0, "ATTN_STATUS_OK == 0");
}

static void test_version(void) {
  char want[64];
  snprintf(want, sizeof want, "%d.%d.%d", ATTN_VERSION_MAJOR, ATTN_VERSION_MINOR, ATTN_VERSION_PATCH);
  tu_check(attn_version() == ATTN_VERSION, "attn_version() = %d, ATTN_VERSION = %d",
           (int)attn_version(), ATTN_VERSION);
  tu_check(ATTN_VERSION == ATTN_VERSION_MAJOR * 10000 + ATTN_VERSION_MINOR * 100 + ATTN_VERSION_PATCH,
           "ATTN_VERSION orders major, minor, patch");
  const char *vs = attn_version_string();
  tu_check(vs != NULL && strcmp(vs, want) == 0, "attn_version_string() = \"%s\", want \"%s\"",
           vs ? vs : "(null)", want);
}

static void test_null_handling(void) {
  attn_ctx_destroy(NULL);
  attn_plan_destroy(NULL);
  tu_check(1, "attn_ctx_destroy(NULL), attn_plan_destroy(NULL) return");
  const char *m = attn_ctx_last_error(NULL);
  tu_check(m != NULL, "attn_ctx_last_error(NULL) is non-NULL (\"%s\")", m ? m : "(null)");
  tu_check(attn_ctx_create(NULL) != ATTN_STATUS_OK, "attn_ctx_create(NULL) is refused, not a crash");
  attn_problem p = base_problem();
  attn_plan *plan = NULL;
  tu_check(attn_plan_create(NULL, &p, NULL, &plan) == ATTN_STATUS_INVALID_ARGUMENT && plan == NULL,
           "attn_plan_create with a NULL ctx is INVALID_ARGUMENT");
  attn_inputs in;
  attn_outputs out;
  attn_inputs_init(&in);
  attn_outputs_init(&out);
  tu_check(attn_forward(NULL, &p, &in, &out) == ATTN_STATUS_INVALID_ARGUMENT,
           "attn_forward with a NULL ctx is INVALID_ARGUMENT");
  tu_check(attn_plan_forward(NULL, &in, NULL, 0, &out) == ATTN_STATUS_INVALID_ARGUMENT,
           "attn_plan_forward with a NULL plan is INVALID_ARGUMENT");
  attn_tensor dout = attn_tensor_dense(NULL);
  attn_grads g;
  attn_grads_init(&g);
  tu_check(attn_plan_backward(NULL, &in, &out, &dout, NULL, 0, &g) == ATTN_STATUS_INVALID_ARGUMENT,
           "attn_plan_backward with a NULL plan is INVALID_ARGUMENT");
  size_t fw = 1, bw = 1;
  tu_check(attn_plan_workspace_size(NULL, &fw, &bw) == ATTN_STATUS_INVALID_ARGUMENT,
           "attn_plan_workspace_size(NULL) is INVALID_ARGUMENT");
  tu_check(attn_plan_impl_name(NULL) != NULL && attn_plan_config_name(NULL) != NULL,
           "attn_plan_impl_name/config_name(NULL) are non-NULL");
}

static void test_dtypes(void) {
  static const struct {
    attn_dtype d;
    size_t size;
    const char *name;
  } want[] = {{ATTN_DTYPE_F32, 4, "f32"}, {ATTN_DTYPE_F16, 2, "f16"}, {ATTN_DTYPE_BF16, 2, "bf16"},
              {ATTN_DTYPE_F64, 8, "f64"}, {ATTN_DTYPE_U8, 1, "u8"},   {ATTN_DTYPE_I32, 4, "i32"}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; ++i)
    tu_check(attn_dtype_size(want[i].d) == want[i].size && strcmp(attn_dtype_name(want[i].d), want[i].name) == 0,
             "dtype %d: size %zu name \"%s\"", (int)want[i].d, attn_dtype_size(want[i].d),
             attn_dtype_name(want[i].d));
  tu_check(attn_dtype_size(ATTN_DTYPE_COUNT) == 0 && strcmp(attn_dtype_name(ATTN_DTYPE_COUNT), "unknown") == 0,
           "dtype COUNT: size 0, name \"unknown\"");
  tu_check(attn_dtype_size((attn_dtype)-1) == 0 && strcmp(attn_dtype_name((attn_dtype)-1), "unknown") == 0,
           "dtype -1: size 0, name \"unknown\"");
}

/* ---- conversions ------------------------------------------------------------------------- */

static float f32_of_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint32_t bits_of_f32(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* IEEE binary16 decoded by its definition, independently of the library. */
static double f16_value(uint16_t h) {
  int sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
  return sign ? -v : v;
}

static double bf16_value(uint16_t h) { return (double)f32_of_bits((uint32_t)h << 16); }

/* Whether h is x rounded to nearest, ties to even, among the finite patterns of a 16-bit format
 * (or its infinity past the largest finite value plus half an ulp): compared with both neighbours
 * of h in magnitude. */
static int nearest_even(double (*value)(uint16_t), uint16_t h, float x, uint16_t inf_bits) {
  double ax = fabs((double)x);
  uint16_t mag = h & 0x7fff;
  if (((h >> 15) != 0) != (signbit(x) != 0)) return 0;
  if (mag == inf_bits) { /* overflow: x must be at least max + ulp / 2 */
    double max = value((uint16_t)(inf_bits - 1)), below = value((uint16_t)(inf_bits - 2));
    return ax >= max + (max - below) / 2;
  }
  double d = fabs(ax - value(mag));
  if (mag > 0 && fabs(ax - value((uint16_t)(mag - 1))) < d) return 0;
  double up = fabs(ax - value((uint16_t)(mag + 1)));
  if (mag + 1 < inf_bits && up < d) return 0;
  if ((mag > 0 && fabs(ax - value((uint16_t)(mag - 1))) == d) || up == d) return (mag & 1) == 0;
  return 1;
}

static void test_conversions(tu_rng *rng) {
  /* known values: exact ones, the ties of round-to-nearest-even, overflow, NaN */
  tu_check(attn_f32_to_bf16(1.0f) == 0x3f80 && attn_f32_to_bf16(-2.0f) == 0xc000 &&
               attn_bf16_to_f32(0x3f80) == 1.0f && attn_bf16_to_f32(0xc0a0) == -5.0f,
           "bf16: exact values");
  tu_check(attn_f32_to_bf16(f32_of_bits(0x3f808000u)) == 0x3f80 &&
               attn_f32_to_bf16(f32_of_bits(0x3f818000u)) == 0x3f82 &&
               attn_f32_to_bf16(f32_of_bits(0x3f808001u)) == 0x3f81,
           "bf16: a tie rounds to the even neighbour, past the tie rounds up");
  tu_check(attn_f32_to_bf16(f32_of_bits(0x7f7fffffu)) == 0x7f80 &&
               attn_f32_to_bf16(INFINITY) == 0x7f80 && attn_f32_to_bf16(-INFINITY) == 0xff80,
           "bf16: the largest f32 rounds to infinity");
  tu_check(isnan(attn_bf16_to_f32(attn_f32_to_bf16(NAN))) &&
               isnan(attn_bf16_to_f32(attn_f32_to_bf16(f32_of_bits(0x7f800001u)))),
           "bf16: NaN stays NaN (also one whose payload would truncate to infinity)");
  tu_check(attn_f32_to_f16(1.0f) == 0x3c00 && attn_f32_to_f16(65504.0f) == 0x7bff &&
               attn_f32_to_f16(-0.5f) == 0xb800 && attn_f16_to_f32(0x3c01) == 1.0f + 0x1p-10f,
           "f16: exact values");
  tu_check(attn_f32_to_f16(65520.0f) == 0x7c00 && attn_f32_to_f16(65519.0f) == 0x7bff &&
               attn_f32_to_f16(1e10f) == 0x7c00 && attn_f32_to_f16(-1e10f) == 0xfc00,
           "f16: 65520 (the tie past the largest finite value) and beyond overflow to infinity");
  tu_check(attn_f32_to_f16(0x1p-24f) == 0x0001 && attn_f32_to_f16(0x1p-25f) == 0x0000 &&
               attn_f32_to_f16(0x3p-25f) == 0x0002 && attn_f16_to_f32(0x0001) == 0x1p-24f &&
               attn_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00 &&
               attn_f32_to_f16(1.0f + 0x3p-11f) == 0x3c02,
           "f16: subnormals and ties round to nearest even");
  tu_check(isnan(attn_f16_to_f32(attn_f32_to_f16(NAN))), "f16: NaN stays NaN");

  /* every 16-bit pattern decodes to its definition and encodes back to itself */
  int bad_bf16 = -1, bad_f16 = -1;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    uint16_t b = (uint16_t)h;
    float fb = attn_bf16_to_f32(b), fh = attn_f16_to_f32(b);
    if (!isnan(fb) && (attn_f32_to_bf16(fb) != b || (double)fb != bf16_value(b)) && bad_bf16 < 0)
      bad_bf16 = (int)h;
    int h_nan = ((h >> 10) & 0x1f) == 31 && (h & 0x3ff) != 0;
    if (!h_nan && (attn_f32_to_f16(fh) != b || (double)fh != f16_value(b)) && bad_f16 < 0)
      bad_f16 = (int)h;
  }
  tu_check(bad_bf16 < 0, "bf16: all 65536 patterns decode exactly and round-trip (first bad: %d)",
           bad_bf16);
  tu_check(bad_f16 < 0, "f16: all 65536 patterns decode exactly and round-trip (first bad: %d)",
           bad_f16);

  /* random f32 values over every exponent: each rounds to its nearest pattern, ties to even */
  int bad = 0;
  float first_bad = 0.0f;
  for (int i = 0; i < 200000 && bad == 0; ++i) {
    uint32_t u = (uint32_t)tu_int(rng, 0, 0xffffffffLL);
    if (i % 4 == 0) u &= 0xffff8000u, u |= 0x8000u * (uint32_t)(i % 8 == 0); /* exact ties */
    float x = f32_of_bits(u);
    if (isnan(x) || isinf(x)) continue;
    if (!nearest_even(bf16_value, attn_f32_to_bf16(x), x, 0x7f80) ||
        (fabsf(x) < 1e6f && !nearest_even(f16_value, attn_f32_to_f16(x), x, 0x7c00)) ||
        (fabsf(x) >= 1e6f && (attn_f32_to_f16(x) & 0x7fff) != 0x7c00))
      bad = 1, first_bad = x;
  }
  tu_check(!bad, "random f32 values round to the nearest bf16 and f16, ties to even (first bad: "
                 "%a, bits %08x)",
           first_bad, (unsigned)bits_of_f32(first_bad));
}

/* ---- tensor shapes of a problem ------------------------------------------------------------- */

static void test_tensor_shapes(attn_ctx *ctx) {
  attn_problem p;
  attn_problem_init(&p);
  p.dtype = ATTN_DTYPE_BF16;
  p.batch = 2, p.seqlen_q = 5, p.seqlen_k = 7, p.heads_q = 6, p.heads_kv = 2, p.head_dim = 8;
  p.head_dim_v = 4;
  static const struct {
    attn_role role;
    int32_t ndim;
    int64_t shape[4];
    attn_dtype dtype;
  } want[] = {
      {ATTN_ROLE_Q, 4, {2, 5, 6, 8}, ATTN_DTYPE_BF16},
      {ATTN_ROLE_K, 4, {2, 7, 2, 8}, ATTN_DTYPE_BF16},
      {ATTN_ROLE_V, 4, {2, 7, 2, 4}, ATTN_DTYPE_BF16},
      {ATTN_ROLE_OUT, 4, {2, 5, 6, 4}, ATTN_DTYPE_BF16},
      {ATTN_ROLE_LSE, 3, {2, 6, 5, 1}, ATTN_DTYPE_F32}, /* f32 for a bf16 problem */
      {ATTN_ROLE_DOUT, 4, {2, 5, 6, 4}, ATTN_DTYPE_BF16},
      {ATTN_ROLE_DQ, 4, {2, 5, 6, 8}, ATTN_DTYPE_BF16},
      {ATTN_ROLE_DK, 4, {2, 7, 2, 8}, ATTN_DTYPE_BF16},
      {ATTN_ROLE_DV, 4, {2, 7, 2, 4}, ATTN_DTYPE_BF16},
      {ATTN_ROLE_BIAS, 0, {1, 1, 1, 1}, ATTN_DTYPE_F32}, /* unused: no has_bias */
      {ATTN_ROLE_PROBS, 0, {1, 1, 1, 1}, ATTN_DTYPE_BF16}, /* unused: the flash operation */
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; ++i) {
    int32_t ndim = -1;
    int64_t shape[4] = {-1, -1, -1, -1}, numel = -1, expect = want[i].ndim == 0 ? 0 : 1;
    attn_dtype dtype = ATTN_DTYPE_COUNT;
    attn_status s = attn_problem_tensor(ctx, &p, want[i].role, &ndim, shape, &numel, &dtype);
    for (int d = 0; d < want[i].ndim; ++d) expect *= want[i].shape[d];
    tu_check(s == ATTN_STATUS_OK && ndim == want[i].ndim &&
                 memcmp(shape, want[i].shape, sizeof shape) == 0 && numel == expect &&
                 attn_problem_numel(&p, want[i].role) == expect && dtype == want[i].dtype,
             "tensor %s of a bf16 GQA problem: ndim %d shape [%lld, %lld, %lld, %lld] numel %lld "
             "dtype %s (want ndim %d, numel %lld, %s)",
             attn_role_name(want[i].role), ndim, (long long)shape[0], (long long)shape[1],
             (long long)shape[2], (long long)shape[3], (long long)numel, attn_dtype_name(dtype),
             want[i].ndim, (long long)expect, attn_dtype_name(want[i].dtype));
  }
  /* a bias, the SDPA probabilities, packed varlen */
  p.has_bias = 1, p.bias_dtype = ATTN_DTYPE_BF16;
  p.bias_shape[0] = 1, p.bias_shape[1] = 6, p.bias_shape[2] = 5, p.bias_shape[3] = 7;
  p.operation = ATTN_OPERATION_SCALED_DOT_PRODUCT_ATTENTION;
  tu_check(attn_problem_numel(&p, ATTN_ROLE_BIAS) == 210 &&
               attn_problem_numel(&p, ATTN_ROLE_DBIAS) == 210 &&
               attn_problem_numel(&p, ATTN_ROLE_PROBS) == 2 * 6 * 5 * 7,
           "bias [1, 6, 5, 7] and the probabilities [2, 6, 5, 7] counted");
  attn_problem_init(&p);
  p.batch = 3, p.seqlen_q = 9, p.seqlen_k = 11, p.heads_q = 4, p.heads_kv = 4, p.head_dim = 16;
  p.varlen = ATTN_VARLEN_PACKED, p.total_q = 20, p.total_k = 25;
  int32_t ndim = 0;
  int64_t shape[4];
  attn_status s = attn_problem_tensor(ctx, &p, ATTN_ROLE_Q, &ndim, shape, NULL, NULL);
  tu_check(s == ATTN_STATUS_OK && ndim == 3 && shape[0] == 20 && shape[1] == 4 &&
               shape[2] == 16 && shape[3] == 1 && attn_problem_numel(&p, ATTN_ROLE_LSE) == 4 * 20,
           "packed varlen: q is [total_q, Hq, D], lse [Hq, total_q]");
  /* refusals */
  p.heads_q = 6;
  s = attn_problem_tensor(ctx, &p, ATTN_ROLE_Q, NULL, NULL, NULL, NULL);
  tu_check(s == ATTN_STATUS_INVALID_ARGUMENT && has_word(attn_ctx_last_error(ctx), "heads_q") &&
               attn_problem_numel(&p, ATTN_ROLE_Q) == -1,
           "an invalid problem is refused naming the rule (%s)", attn_ctx_last_error(ctx));
  p.heads_q = 4;
  s = attn_problem_tensor(ctx, &p, ATTN_ROLE_COUNT, NULL, NULL, NULL, NULL);
  tu_check(s == ATTN_STATUS_INVALID_ARGUMENT && has_word(attn_ctx_last_error(ctx), "role") &&
               attn_problem_numel(&p, (attn_role)-1) == -1 &&
               attn_problem_numel(NULL, ATTN_ROLE_Q) == -1,
           "a role outside the enum is refused (%s)", attn_ctx_last_error(ctx));
  tu_check(attn_problem_tensor(ctx, &p, ATTN_ROLE_Q, NULL, NULL, NULL, NULL) == ATTN_STATUS_OK &&
               attn_ctx_last_error(ctx)[0] == '\0',
           "a successful query clears the last error");
  tu_check(strcmp(attn_role_name(ATTN_ROLE_ALIBI), "alibi_slopes") == 0 &&
               strcmp(attn_role_name(ATTN_ROLE_DSINKS), "dsinks") == 0 &&
               strcmp(attn_role_name(ATTN_ROLE_COUNT), "unknown") == 0,
           "role names are the struct fields'");
}

/* All-zero strides mean dense, so a 1-D input broadcast along its only dimension marks its strides
 * explicit with a nonzero entry past its last dimension (attn.h, "Strides"): ALiBi slopes [Hq]
 * read as {0, 1, 0, 0} give what slopes written out for every head give. */
static void test_broadcast_strides(attn_ctx *ctx, tu_rng *rng) {
  enum { T = 9, H = 3, D = 8 };
  float q[T * H * D], k[T * H * D], v[T * H * D], out_b[T * H * D], out_d[T * H * D];
  float one_slope = 0.25f, slopes[H] = {0.25f, 0.25f, 0.25f};
  for (int i = 0; i < T * H * D; ++i)
    q[i] = (float)tu_uniform(rng, -1, 1), k[i] = (float)tu_uniform(rng, -1, 1),
    v[i] = (float)tu_uniform(rng, -1, 1);
  attn_problem p;
  attn_problem_init(&p);
  p.batch = 1, p.seqlen_q = T, p.seqlen_k = T, p.heads_q = H, p.heads_kv = H, p.head_dim = D;
  p.causal = 1, p.alibi = ATTN_ALIBI_PER_HEAD;
  attn_inputs in;
  attn_inputs_init(&in);
  in.q = attn_tensor_dense(q), in.k = attn_tensor_dense(k), in.v = attn_tensor_dense(v);
  in.alibi_slopes = attn_tensor_dense(slopes);
  attn_outputs o;
  attn_outputs_init(&o);
  o.out = attn_tensor_dense(out_d);
  attn_status s1 = attn_forward(ctx, &p, &in, &o);
  in.alibi_slopes.data = &one_slope;
  in.alibi_slopes.stride[0] = 0, in.alibi_slopes.stride[1] = 1;
  o.out = attn_tensor_dense(out_b);
  attn_status s2 = attn_forward(ctx, &p, &in, &o);
  tu_check(s1 == ATTN_STATUS_OK && s2 == ATTN_STATUS_OK && memcmp(out_b, out_d, sizeof out_b) == 0,
           "one ALiBi slope broadcast over the heads with strides {0, 1, 0, 0} (%s)",
           attn_ctx_last_error(ctx));
}

/* ---- logging ------------------------------------------------------------------------------- */

typedef struct log_record {
  int calls;
  attn_log_level level;
  char message[1024];
} log_record;

static void log_sink(void *user, attn_log_level level, const char *message) {
  log_record *r = user;
  r->calls++;
  r->level = level;
  snprintf(r->message, sizeof r->message, "%s", message);
}

/* Runs a failing plan creation with stdout and stderr redirected to a file; returns the number of
 * bytes the library wrote there (-1 when redirection failed). */
static long failing_call_output(attn_ctx *ctx) {
  fflush(stdout);
  fflush(stderr);
  FILE *tmp = tmpfile();
  if (tmp == NULL) return -1;
  int saved_out = dup(1), saved_err = dup(2);
  if (saved_out < 0 || saved_err < 0) return -1;
  dup2(fileno(tmp), 1);
  dup2(fileno(tmp), 2);
  attn_problem p = base_problem();
  p.heads_q = 6, p.heads_kv = 4;
  attn_plan *plan = NULL;
  attn_status st = attn_plan_create(ctx, &p, NULL, &plan);
  fflush(stdout);
  fflush(stderr);
  dup2(saved_out, 1);
  dup2(saved_err, 2);
  close(saved_out);
  close(saved_err);
  fseek(tmp, 0, SEEK_END);
  long size = ftell(tmp);
  fclose(tmp);
  return st == ATTN_STATUS_INVALID_ARGUMENT ? size : -2;
}

static void test_logging(void) {
  attn_ctx *ctx = NULL;
  attn_ctx_create(&ctx);
  long printed = failing_call_output(ctx);
  tu_check(printed == 0, "a failure without a log callback prints nothing (%ld bytes)", printed);

  log_record rec = {0, ATTN_LOG_LEVEL_COUNT, ""};
  tu_check(attn_ctx_set_log_callback(ctx, log_sink, &rec, ATTN_LOG_LEVEL_ERROR) == ATTN_STATUS_OK,
           "attn_ctx_set_log_callback installs a callback");
  attn_problem p = base_problem();
  p.heads_q = 6, p.heads_kv = 4;
  attn_plan *plan = NULL;
  attn_plan_create(ctx, &p, NULL, &plan);
  tu_check(rec.calls >= 1 && rec.level == ATTN_LOG_LEVEL_ERROR &&
               strstr(rec.message, "heads_q=6 is not a multiple of heads_kv=4") != NULL,
           "the callback receives the failure at level ERROR: %d call(s), \"%s\"", rec.calls,
           rec.message);
  printed = failing_call_output(ctx);
  tu_check(printed == 0, "a failure with a log callback still prints nothing (%ld bytes)", printed);

  int before = rec.calls;
  attn_ctx_set_log_callback(ctx, NULL, NULL, ATTN_LOG_LEVEL_ERROR);
  attn_plan_create(ctx, &p, NULL, &plan);
  tu_check(rec.calls == before, "fn = NULL silences the callback");
  tu_check(attn_ctx_set_log_callback(ctx, log_sink, &rec, ATTN_LOG_LEVEL_COUNT) ==
               ATTN_STATUS_INVALID_ARGUMENT,
           "an out-of-range log level is refused");
  attn_ctx_destroy(ctx);
}

/* ---- invalid problems ---------------------------------------------------------------------- */

static void test_invalid_problems(attn_ctx *ctx, fixture *f, tu_rng *rng) {
  attn_problem p0 = base_problem(), p;
  expect_valid(ctx, f, rng, &p0, "base b2 hq4 hkv2 sq3 sk5 d3");

  /* NULL problem, NULL plan pointer. */
  snapshot(f);
  attn_plan *plan = NULL;
  expect_refused(ctx, f, attn_plan_create(ctx, NULL, NULL, &plan), "problem NULL",
                 WORDS("problem"));
  expect_refused(ctx, f, attn_plan_create(ctx, &p0, NULL, NULL), "plan pointer NULL",
                 WORDS("plan"));
  expect_refused(ctx, f, attn_forward(ctx, NULL, &f->in, &f->out), "problem NULL (attn_forward)",
                 WORDS("problem"));

  /* Sizes below their minimum. */
  static const struct {
    const char *field;
    size_t offset;
    int64_t value;
  } sizes[] = {
      {"batch", offsetof(attn_problem, batch), 0},
      {"batch", offsetof(attn_problem, batch), -1},
      {"seqlen_q", offsetof(attn_problem, seqlen_q), -1},
      {"seqlen_k", offsetof(attn_problem, seqlen_k), -1},
      {"heads_q", offsetof(attn_problem, heads_q), 0},
      {"heads_kv", offsetof(attn_problem, heads_kv), 0},
      {"head_dim", offsetof(attn_problem, head_dim), 0},
      {"head_dim", offsetof(attn_problem, head_dim), -3},
      {"head_dim_v", offsetof(attn_problem, head_dim_v), -1},
  };
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
    char label[96], field_value[64];
    p = p0;
    memcpy((char *)&p + sizes[i].offset, &sizes[i].value, sizeof(int64_t));
    snprintf(label, sizeof label, "%s=%lld", sizes[i].field, (long long)sizes[i].value);
    snprintf(field_value, sizeof field_value, "%s=%lld", sizes[i].field, (long long)sizes[i].value);
    refuse_problem(ctx, f, &p, label, WORDS(sizes[i].field, field_value));
  }

  p = p0;
  p.heads_q = 6, p.heads_kv = 4;
  refuse_problem(ctx, f, &p, "heads_q % heads_kv", WORDS("heads_q=6 is not a multiple of heads_kv=4"));

  p = p0, p.dropout_p = -0.25;
  refuse_problem(ctx, f, &p, "dropout_p=-0.25", WORDS("dropout_p", "dropout_p=-0.25"));
  p = p0, p.dropout_p = 1.0;
  refuse_problem(ctx, f, &p, "dropout_p=1", WORDS("dropout_p=1 must be in [0, 1)"));
  p = p0, p.dropout_p = NAN;
  refuse_problem(ctx, f, &p, "dropout_p=NaN", WORDS("dropout_p"));

  p = p0, p.window_left = -2;
  refuse_problem(ctx, f, &p, "window_left=-2", WORDS("window_left", "window_left=-2"));
  p = p0, p.window_right = -2;
  refuse_problem(ctx, f, &p, "window_right=-2", WORDS("window_right", "window_right=-2"));

  p = p0, p.softcap = -1.0;
  refuse_problem(ctx, f, &p, "softcap=-1", WORDS("softcap", "softcap=-1"));
  p = p0, p.softcap = INFINITY;
  refuse_problem(ctx, f, &p, "softcap=inf", WORDS("softcap"));
  p = p0, p.softcap = NAN;
  refuse_problem(ctx, f, &p, "softcap=NaN", WORDS("softcap"));
  p = p0, p.scale = NAN;
  refuse_problem(ctx, f, &p, "scale=NaN", WORDS("scale"));
  p = p0, p.scale = INFINITY;
  refuse_problem(ctx, f, &p, "scale=inf", WORDS("scale"));
  p = p0, p.scale = -INFINITY;
  refuse_problem(ctx, f, &p, "scale=-inf", WORDS("scale"));

  /* Enumerations out of range. */
  p = p0, p.operation = ATTN_OPERATION_COUNT;
  refuse_problem(ctx, f, &p, "operation=COUNT", WORDS("operation", "operation=2"));
  p = p0, p.operation = -1;
  refuse_problem(ctx, f, &p, "operation=-1", WORDS("operation", "operation=-1"));
  p = p0, p.dtype = ATTN_DTYPE_U8;
  refuse_problem(ctx, f, &p, "dtype=u8", WORDS("dtype"));
  p = p0, p.dtype = ATTN_DTYPE_I32;
  refuse_problem(ctx, f, &p, "dtype=i32", WORDS("dtype"));
  p = p0, p.dtype = ATTN_DTYPE_COUNT;
  refuse_problem(ctx, f, &p, "dtype=COUNT", WORDS("dtype"));
  p = p0, p.align = ATTN_ALIGN_COUNT;
  refuse_problem(ctx, f, &p, "align=COUNT", WORDS("align", "align=2"));
  p = p0, p.alibi = ATTN_ALIBI_COUNT;
  refuse_problem(ctx, f, &p, "alibi=COUNT", WORDS("alibi", "alibi=3"));
  p = p0, p.varlen = ATTN_VARLEN_COUNT;
  refuse_problem(ctx, f, &p, "varlen=COUNT", WORDS("varlen", "varlen=3"));
  p = p0, p.device = ATTN_DEVICE_COUNT;
  refuse_problem(ctx, f, &p, "device=COUNT", WORDS("device", "device=2"));
  p = p0, p.device = -1;
  refuse_problem(ctx, f, &p, "device=-1", WORDS("device", "device=-1"));

  /* Flags other than 0 and 1. */
  static const struct {
    const char *field;
    size_t offset;
  } flags[] = {
      {"causal", offsetof(attn_problem, causal)},
      {"has_bias", offsetof(attn_problem, has_bias)},
      {"has_mask", offsetof(attn_problem, has_mask)},
      {"sinks_shared", offsetof(attn_problem, sinks_shared)},
      {"has_segment_ids", offsetof(attn_problem, has_segment_ids)},
  };
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; ++i)
    for (int32_t value = -1; value <= 2; value += 3) {
      char label[96], field_value[64];
      p = p0;
      memcpy((char *)&p + flags[i].offset, &value, sizeof value);
      snprintf(label, sizeof label, "%s=%d", flags[i].field, (int)value);
      snprintf(field_value, sizeof field_value, "%s=%d", flags[i].field, (int)value);
      refuse_problem(ctx, f, &p, label, WORDS(flags[i].field, field_value));
    }

  /* Bias: dtype and each dim's broadcast. bias [B=2, Hq=4 | Hkv=2, Tq=3, Tk=5]. */
  attn_problem pb = p0;
  pb.has_bias = 1;
  pb.bias_shape[0] = 2, pb.bias_shape[1] = 4, pb.bias_shape[2] = 3, pb.bias_shape[3] = 5;
  expect_valid(ctx, f, rng, &pb, "bias full");
  p = pb, p.bias_shape[1] = 2;
  expect_valid(ctx, f, rng, &p, "bias with heads_kv heads");
  p = pb, p.bias_shape[0] = 1, p.bias_shape[1] = 1, p.bias_shape[2] = 1, p.bias_shape[3] = 1;
  expect_valid(ctx, f, rng, &p, "bias [1,1,1,1]");
  p = pb, p.bias_dtype = ATTN_DTYPE_U8;
  refuse_problem(ctx, f, &p, "bias_dtype=u8", WORDS("bias_dtype"));
  p = pb, p.bias_dtype = ATTN_DTYPE_F64;
  refuse_problem(ctx, f, &p, "bias_dtype=f64 with an f32 problem", WORDS("bias_dtype"));
  p = pb, p.bias_dtype = ATTN_DTYPE_COUNT;
  refuse_problem(ctx, f, &p, "bias_dtype=COUNT", WORDS("bias_dtype"));
  static const int64_t bad_bias[4] = {3, 3, 2, 4}, bad_mask[4] = {3, 2, 4, 6};
  for (int d = 0; d < 4; ++d) {
    char label[64], needle[64];
    p = pb, p.bias_shape[d] = bad_bias[d];
    snprintf(label, sizeof label, "bias_shape[%d]=%lld", d, (long long)bad_bias[d]);
    snprintf(needle, sizeof needle, "bias_shape[%d]=%lld does not broadcast", d, (long long)bad_bias[d]);
    refuse_problem(ctx, f, &p, label, WORDS(needle));
    p = pb, p.bias_shape[d] = 0;
    snprintf(label, sizeof label, "bias_shape[%d]=0", d);
    snprintf(needle, sizeof needle, "bias_shape[%d]=0", d);
    refuse_problem(ctx, f, &p, label, WORDS(needle));
  }

  /* Mask: each dim's broadcast; the head dim admits Hq or 1, not Hkv. */
  attn_problem pm = p0;
  pm.has_mask = 1;
  pm.mask_shape[0] = 2, pm.mask_shape[1] = 4, pm.mask_shape[2] = 3, pm.mask_shape[3] = 5;
  expect_valid(ctx, f, rng, &pm, "mask full");
  for (int d = 0; d < 4; ++d) {
    char label[64], needle[64];
    p = pm, p.mask_shape[d] = bad_mask[d];
    snprintf(label, sizeof label, "mask_shape[%d]=%lld", d, (long long)bad_mask[d]);
    snprintf(needle, sizeof needle, "mask_shape[%d]=%lld does not broadcast", d, (long long)bad_mask[d]);
    refuse_problem(ctx, f, &p, label, WORDS(needle));
  }

  /* Sinks: a negative count. */
  p = p0, p.num_sinks = -1;
  refuse_problem(ctx, f, &p, "num_sinks=-1", WORDS("num_sinks", "num_sinks=-1"));
}

/* ---- invalid data of a run ----------------------------------------------------------------- */

static void test_invalid_runs(attn_ctx *ctx, fixture *f, tu_rng *rng) {
  attn_problem p0 = base_problem();
  attn_inputs in;
  attn_outputs out;
  attn_tensor dout;
  attn_grads g;

  /* NULL structs. */
  refuse_forward(ctx, f, &p0, NULL, &f->out, "forward inputs NULL", WORDS("inputs"));
  refuse_forward(ctx, f, &p0, &f->in, NULL, "forward outputs NULL", WORDS("outputs"));
  refuse_backward(ctx, f, &p0, NULL, &f->out, &f->dout, &f->g, "backward inputs NULL",
                  WORDS("inputs"));
  refuse_backward(ctx, f, &p0, &f->in, NULL, &f->dout, &f->g, "backward forward NULL",
                  WORDS("forward"));
  refuse_backward(ctx, f, &p0, &f->in, &f->out, NULL, &f->g, "backward dout NULL", WORDS("dout"));
  refuse_backward(ctx, f, &p0, &f->in, &f->out, &f->dout, NULL, "backward grads NULL",
                  WORDS("grads"));

  /* Required data pointers. */
  const char *fwd_names[] = {"q", "k", "v", "out"};
  for (int i = 0; i < 4; ++i) {
    char label[64], needle[64];
    in = f->in, out = f->out;
    attn_tensor *t = i == 0 ? &in.q : i == 1 ? &in.k : i == 2 ? &in.v : &out.out;
    t->data = NULL;
    snprintf(label, sizeof label, "forward %s.data NULL", fwd_names[i]);
    snprintf(needle, sizeof needle, "%s.data", fwd_names[i]);
    refuse_forward(ctx, f, &p0, &in, &out, label, WORDS(needle));
  }
  const char *bwd_names[] = {"q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv"};
  for (int i = 0; i < 9; ++i) {
    char label[64], needle[64];
    in = f->in, out = f->out, dout = f->dout, g = f->g;
    attn_tensor *ts[] = {&in.q, &in.k, &in.v, &out.out, &out.lse, &dout, &g.dq, &g.dk, &g.dv};
    ts[i]->data = NULL;
    snprintf(label, sizeof label, "backward %s.data NULL", bwd_names[i]);
    snprintf(needle, sizeof needle, "%s.data", bwd_names[i]);
    refuse_backward(ctx, f, &p0, &in, &out, &dout, &g, label, WORDS(needle));
  }

  /* Optional inputs the problem uses are required too. */
  attn_problem p = p0;
  p.has_bias = 1;
  p.bias_shape[0] = 2, p.bias_shape[1] = 4, p.bias_shape[2] = 3, p.bias_shape[3] = 5;
  in = f->in, in.bias.data = NULL;
  refuse_forward(ctx, f, &p, &in, &f->out, "bias.data NULL with has_bias", WORDS("bias.data"));
  p = p0, p.num_sinks = 2;
  in = f->in, in.sinks.data = NULL;
  refuse_forward(ctx, f, &p, &in, &f->out, "sinks.data NULL with num_sinks", WORDS("sinks.data"));

  /* Packed varlen: B = 2, total_q = 5, total_k = 9, max lengths 3 and 5. */
  attn_problem pk = p0;
  pk.varlen = ATTN_VARLEN_PACKED, pk.total_q = 5, pk.total_k = 9;
  expect_valid(ctx, f, rng, &pk, "packed varlen cu_q {0,3,5} cu_k {0,4,9}");
  static const struct {
    int which; /* 0 = q, 1 = k */
    int32_t cu[3];
    const char *needle, *rule;
  } bad_cu[] = {
      {0, {1, 3, 5}, "cu_seqlens_q[0]=1", "0"},           /* does not start at 0 */
      {1, {-1, 4, 9}, "cu_seqlens_k[0]=-1", "0"},         /* negative start */
      {0, {0, 3, 2}, "cu_seqlens_q[2]=2", "cu_seqlens_q"}, /* decreasing */
      {1, {0, 5, 4}, "cu_seqlens_k[2]=4", "cu_seqlens_k"}, /* decreasing */
      {0, {0, 3, 6}, "cu_seqlens_q", "total_q"},          /* exceeds total_q = 5 */
      {1, {0, 5, 10}, "cu_seqlens_k", "total_k"},         /* exceeds total_k = 9 */
      {1, {0, 4, 8}, "", ""},                             /* ends below total_k: valid */
      {0, {0, 4, 5}, "cu_seqlens_q", "seqlen_q"},         /* sequence 0 longer than seqlen_q = 3 */
      {1, {0, 6, 9}, "cu_seqlens_k", "seqlen_k"},         /* sequence 0 longer than seqlen_k = 5 */
  };
  for (size_t i = 0; i < sizeof bad_cu / sizeof bad_cu[0]; ++i) {
    int32_t cu[3];
    memcpy(cu, bad_cu[i].cu, sizeof cu);
    in = f->in;
    if (bad_cu[i].which == 0) in.cu_seqlens_q = cu;
    else in.cu_seqlens_k = cu;
    char label[96];
    snprintf(label, sizeof label, "%s = {%d, %d, %d}", bad_cu[i].which ? "cu_seqlens_k" : "cu_seqlens_q",
             (int)cu[0], (int)cu[1], (int)cu[2]);
    if (bad_cu[i].needle[0] == '\0') { /* ending below the total is allowed: a control */
      attn_status st = attn_forward(ctx, &pk, &in, &f->out);
      tu_check(st == ATTN_STATUS_OK, "control %s (ending below total_k) runs: %s", label,
               attn_ctx_last_error(ctx));
      fixture_fill(f, rng);
      continue;
    }
    refuse_forward(ctx, f, &pk, &in, &f->out, label, WORDS(bad_cu[i].needle, bad_cu[i].rule));
    refuse_backward(ctx, f, &pk, &in, &f->out, &f->dout, &f->g, label,
                    WORDS(bad_cu[i].needle, bad_cu[i].rule));
  }
  in = f->in, in.cu_seqlens_q = NULL;
  refuse_forward(ctx, f, &pk, &in, &f->out, "cu_seqlens_q NULL", WORDS("cu_seqlens_q"));
  in = f->in, in.cu_seqlens_k = NULL;
  refuse_backward(ctx, f, &pk, &in, &f->out, &f->dout, &f->g, "cu_seqlens_k NULL",
                  WORDS("cu_seqlens_k"));

  /* Padded varlen: seqlens in 0..Tq, 0..Tk. */
  attn_problem pd = p0;
  pd.varlen = ATTN_VARLEN_PADDED;
  expect_valid(ctx, f, rng, &pd, "padded varlen lens_q {3,1} lens_k {5,2}");
  {
    int32_t lq[2] = {3, 4}, lk[2] = {-1, 2}, lk2[2] = {5, 6};
    in = f->in, in.seqlens_q = lq;
    refuse_forward(ctx, f, &pd, &in, &f->out, "seqlens_q = {3, 4} > seqlen_q", WORDS("seqlens_q[1]=4"));
    in = f->in, in.seqlens_k = lk;
    refuse_forward(ctx, f, &pd, &in, &f->out, "seqlens_k = {-1, 2}", WORDS("seqlens_k[0]=-1"));
    in = f->in, in.seqlens_k = lk2;
    refuse_backward(ctx, f, &pd, &in, &f->out, &f->dout, &f->g, "seqlens_k = {5, 6} > seqlen_k",
                    WORDS("seqlens_k[1]=6"));
    in = f->in, in.seqlens_q = NULL;
    refuse_forward(ctx, f, &pd, &in, &f->out, "seqlens_q NULL", WORDS("seqlens_q"));
    in = f->in, in.seqlens_k = NULL;
    refuse_backward(ctx, f, &pd, &in, &f->out, &f->dout, &f->g, "seqlens_k NULL", WORDS("seqlens_k"));
  }

  /* Optional outputs the problem cannot produce. */
  g = f->g, g.dbias = attn_tensor_dense(f->buf[B_DBIAS]);
  refuse_backward(ctx, f, &p0, &f->in, &f->out, &f->dout, &g, "dbias without bias", WORDS("dbias"));
  g = f->g, g.dsinks = attn_tensor_dense(f->buf[B_DSINKS]);
  refuse_backward(ctx, f, &p0, &f->in, &f->out, &f->dout, &g, "dsinks without sinks", WORDS("dsinks"));
  out = f->out, out.probs = attn_tensor_dense(f->buf[B_PROBS]);
  refuse_forward(ctx, f, &p0, &f->in, &out, "probs with flash_attention", WORDS("probs"));

  /* Aliasing. p0 has Dv = D and out has q's shape when Hq = Hkv... here out is [2,3,4,3] like q. */
  out = f->out, out.out = attn_tensor_dense(f->buf[B_Q]);
  refuse_forward(ctx, f, &p0, &f->in, &out, "out == q buffer", WORDS("out", "q"));
  out = f->out, out.lse = attn_tensor_dense(f->buf[B_OUT]);
  refuse_forward(ctx, f, &p0, &f->in, &out, "lse inside out", WORDS("lse", "out"));
  out = f->out, out.out = attn_tensor_dense(f->buf[B_K] + 4 * sizeof(float));
  refuse_forward(ctx, f, &p0, &f->in, &out, "out overlapping k at an offset", WORDS("out", "k"));
  g = f->g, g.dk = attn_tensor_dense(f->buf[B_DQ]);
  refuse_backward(ctx, f, &p0, &f->in, &f->out, &f->dout, &g, "dq and dk on one buffer",
                  WORDS("dq", "dk"));
  g = f->g, g.dv = attn_tensor_dense(f->buf[B_DOUT]);
  refuse_backward(ctx, f, &p0, &f->in, &f->out, &f->dout, &g, "dv == dout buffer", WORDS("dv", "dout"));
  g = f->g, g.dq = attn_tensor_dense(f->buf[B_OUT]);
  refuse_backward(ctx, f, &p0, &f->in, &f->out, &f->dout, &g, "dq == out buffer (an input of backward)",
                  WORDS("dq", "out"));

  /* An output with a zero stride (broadcast) on a dimension of size > 1. */
  out = f->out;
  out.out.stride[0] = 3 * 4 * 3, out.out.stride[1] = 4 * 3, out.out.stride[2] = 0, out.out.stride[3] = 1;
  refuse_forward(ctx, f, &p0, &f->in, &out, "out.stride[2] = 0", WORDS("out"));
  g = f->g;
  g.dk.stride[0] = 0, g.dk.stride[1] = 2 * 3, g.dk.stride[2] = 3, g.dk.stride[3] = 1;
  refuse_backward(ctx, f, &p0, &f->in, &f->out, &f->dout, &g, "dk.stride[0] = 0", WORDS("dk"));

  /* Workspace too small, and an unknown selection. */
  {
    attn_plan *plan = NULL;
    attn_plan_create(ctx, &p0, NULL, &plan);
    size_t fw = 0, bw = 0;
    attn_plan_workspace_size(plan, &fw, &bw);
    unsigned char *ws = malloc((fw > bw ? fw : bw) + 1);
    if (fw > 0) {
      snapshot(f);
      attn_status st = attn_plan_forward(plan, &f->in, ws, fw - 1, &f->out);
      expect_refused(ctx, f, st, "forward workspace one byte short", WORDS("workspace_size"));
    } else {
      printf("note: the forward pass needs no workspace; 'too small' is not testable forward\n");
    }
    if (bw > 0) {
      snapshot(f);
      attn_status st = attn_plan_backward(plan, &f->in, &f->out, &f->dout, ws, bw - 1, &f->g);
      expect_refused(ctx, f, st, "backward workspace one byte short", WORDS("workspace_size"));
    } else {
      printf("note: the backward pass needs no workspace; 'too small' is not testable backward\n");
    }
    free(ws);
    attn_plan_destroy(plan);
  }
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = "no-such-impl";
  attn_plan *plan = (attn_plan *)&plan;
  snapshot(f);
  expect_refused(ctx, f, attn_plan_create(ctx, &p0, &sel, &plan), "select.impl unknown",
                 WORDS("select.impl", "no-such-impl"));
  tu_check(plan == NULL, "unknown select.impl leaves *plan = NULL");
  attn_select_init(&sel);
  sel.config = "no-such-config";
  expect_refused(ctx, f, attn_plan_create(ctx, &p0, &sel, &plan), "select.config unknown",
                 WORDS("select.config", "no-such-config"));
  sel.impl = "ref";
  expect_refused(ctx, f, attn_plan_create(ctx, &p0, &sel, &plan), "select.config unknown for ref",
                 WORDS("select.config", "no-such-config"));
  tu_check(attn_impl_supports(ctx, "no-such-impl", &p0) == ATTN_STATUS_INVALID_ARGUMENT,
           "attn_impl_supports of an unknown name is INVALID_ARGUMENT");
  tu_check(attn_impl_supports(ctx, "ref", &p0) == ATTN_STATUS_OK, "attn_impl_supports(ref) is OK");
}

/* ---- interleaved, non-overlapping outputs ---------------------------------------------------- */

/* dq, dk, dv as views into one [B, T, 3, H, D] buffer are accepted and equal the dense result. */
static void test_interleaved_grads(attn_ctx *ctx, tu_rng *rng) {
  const int64_t B = 2, T = 5, H = 2, D = 3;
  attn_problem p;
  attn_problem_init(&p);
  p.batch = B, p.seqlen_q = T, p.seqlen_k = T, p.heads_q = H, p.heads_kv = H, p.head_dim = D;
  int64_t n = B * T * H * D;
  tu_buf q = tu_buf_new(ATTN_DTYPE_F32, n), k = tu_buf_new(ATTN_DTYPE_F32, n),
         v = tu_buf_new(ATTN_DTYPE_F32, n), o = tu_buf_new(ATTN_DTYPE_F32, n),
         lse = tu_buf_new(ATTN_DTYPE_F32, B * H * T), dout = tu_buf_new(ATTN_DTYPE_F32, n),
         dq = tu_buf_new(ATTN_DTYPE_F32, n), dk = tu_buf_new(ATTN_DTYPE_F32, n),
         dv = tu_buf_new(ATTN_DTYPE_F32, n), dqkv = tu_buf_new(ATTN_DTYPE_F32, 3 * n);
  tu_fill_uniform(&q, rng, -1, 1);
  tu_fill_uniform(&k, rng, -1, 1);
  tu_fill_uniform(&v, rng, -1, 1);
  tu_fill_uniform(&dout, rng, -1, 1);
  attn_inputs in;
  attn_inputs_init(&in);
  in.q = tu_tensor(&q), in.k = tu_tensor(&k), in.v = tu_tensor(&v);
  attn_outputs out;
  attn_outputs_init(&out);
  out.out = tu_tensor(&o), out.lse = tu_tensor(&lse);
  attn_tensor dt = tu_tensor(&dout);
  attn_status st = attn_forward(ctx, &p, &in, &out);
  attn_grads g;
  attn_grads_init(&g);
  g.dq = tu_tensor(&dq), g.dk = tu_tensor(&dk), g.dv = tu_tensor(&dv);
  if (st == ATTN_STATUS_OK) st = attn_backward(ctx, &p, &in, &out, &dt, &g);
  tu_check(st == ATTN_STATUS_OK, "dense backward b2 t5 h2 d3 runs: %s", attn_ctx_last_error(ctx));

  attn_grads gi;
  attn_grads_init(&gi);
  float *base = dqkv.data;
  attn_tensor *views[3] = {&gi.dq, &gi.dk, &gi.dv};
  for (int w = 0; w < 3; ++w) {
    views[w]->data = base + w * H * D;
    views[w]->stride[0] = T * 3 * H * D;
    views[w]->stride[1] = 3 * H * D;
    views[w]->stride[2] = D;
    views[w]->stride[3] = 1;
  }
  st = attn_backward(ctx, &p, &in, &out, &dt, &gi);
  tu_check(st == ATTN_STATUS_OK, "dq, dk, dv interleaved in one [B,T,3,H,D] buffer are accepted: %s",
           attn_ctx_last_error(ctx));
  if (st == ATTN_STATUS_OK) {
    int same = 1;
    const float *dense[3] = {dq.data, dk.data, dv.data};
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int w = 0; w < 3; ++w)
          for (int64_t hd = 0; hd < H * D; ++hd)
            same &= memcmp(&base[((b * T + t) * 3 + w) * H * D + hd], &dense[w][(b * T + t) * H * D + hd],
                           sizeof(float)) == 0;
    tu_check(same, "interleaved gradients equal the dense ones bit for bit");
  }
  tu_buf *all[] = {&q, &k, &v, &o, &lse, &dout, &dq, &dk, &dv, &dqkv};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) tu_buf_free(all[i]);
}

/* ---- valid edge problems --------------------------------------------------------------------- */

static void test_edges(attn_ctx *ctx, fixture *f, tu_rng *rng) {
  /* Tq = 0: nothing to write forward; backward writes zero dk, dv. */
  attn_problem p = base_problem();
  p.seqlen_q = 0;
  fixture_fill(f, rng);
  snapshot(f);
  attn_status st = attn_forward(ctx, &p, &f->in, &f->out);
  tu_check(st == ATTN_STATUS_OK && changed(f) == NULL, "Tq = 0 forward runs and writes nothing: %s",
           attn_ctx_last_error(ctx));
  st = attn_backward(ctx, &p, &f->in, &f->out, &f->dout, &f->g);
  {
    int zero = 1;
    const float *dk = (const float *)f->buf[B_DK], *dv = (const float *)f->buf[B_DV];
    for (int64_t i = 0; i < 2 * 5 * 2 * 3; ++i) zero &= dk[i] == 0.0f && dv[i] == 0.0f;
    tu_check(st == ATTN_STATUS_OK && zero, "Tq = 0 backward runs and writes dk = dv = 0: %s",
             attn_ctx_last_error(ctx));
  }
  /* Tq = 0 with NULL q, out (no elements, so not required). */
  {
    attn_inputs in = f->in;
    attn_outputs out = f->out;
    in.q.data = NULL, out.out.data = NULL, out.lse.data = NULL;
    st = attn_forward(ctx, &p, &in, &out);
    tu_check(st == ATTN_STATUS_OK, "Tq = 0 forward accepts NULL q, out (no elements): %s",
             attn_ctx_last_error(ctx));
  }

  /* Tk = 0: every row fully masked: out = 0, lse = -inf; backward dq = 0. */
  p = base_problem();
  p.seqlen_k = 0;
  fixture_fill(f, rng);
  st = attn_forward(ctx, &p, &f->in, &f->out);
  {
    int ok = st == ATTN_STATUS_OK;
    const float *o = (const float *)f->buf[B_OUT], *lse = (const float *)f->buf[B_LSE];
    for (int64_t i = 0; i < 2 * 3 * 4 * 3; ++i) ok &= o[i] == 0.0f;
    for (int64_t i = 0; i < 2 * 4 * 3; ++i) ok &= isinf(lse[i]) && lse[i] < 0;
    tu_check(ok, "Tk = 0: out = 0 and lse = -inf: %s", attn_ctx_last_error(ctx));
    st = attn_backward(ctx, &p, &f->in, &f->out, &f->dout, &f->g);
    const float *dq = (const float *)f->buf[B_DQ];
    ok = st == ATTN_STATUS_OK;
    for (int64_t i = 0; i < 2 * 3 * 4 * 3; ++i) ok &= dq[i] == 0.0f;
    tu_check(ok, "Tk = 0 backward: dq = 0: %s", attn_ctx_last_error(ctx));
  }

  /* A plan given its own workspace, against the plan's own allocation and the conveniences. */
  p = base_problem();
  p.causal = 1, p.num_sinks = 2, p.dropout_p = 0.2;
  p.has_bias = 1;
  p.bias_shape[0] = 1, p.bias_shape[1] = 2, p.bias_shape[2] = 3, p.bias_shape[3] = 5;
  fixture_fill(f, rng);
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = "ref";
  attn_plan *plan = NULL;
  st = attn_plan_create(ctx, &p, &sel, &plan);
  tu_check(st == ATTN_STATUS_OK && plan != NULL && strcmp(attn_plan_impl_name(plan), "ref") == 0,
           "a plan selecting \"ref\" reports attn_plan_impl_name = \"%s\": %s",
           plan ? attn_plan_impl_name(plan) : "(none)", attn_ctx_last_error(ctx));
  attn_plan_destroy(plan);
  /* The conveniences make a plan with no selection: compare with such a plan. */
  plan = NULL;
  st = attn_plan_create(ctx, &p, NULL, &plan);
  tu_check(st == ATTN_STATUS_OK && plan != NULL, "default plan for a featured problem (%s): %s",
           plan ? attn_plan_impl_name(plan) : "(none)", attn_ctx_last_error(ctx));
  if (plan == NULL) return;
  tu_check(attn_plan_config_name(plan) != NULL, "attn_plan_config_name = \"%s\"",
           attn_plan_config_name(plan));
  tu_check(attn_ctx_last_error(ctx)[0] == '\0' && attn_ctx_last_status(ctx) == ATTN_STATUS_OK,
           "a successful call clears the last error");
  size_t fw = 0, bw = 0;
  st = attn_plan_workspace_size(plan, &fw, &bw);
  tu_check(st == ATTN_STATUS_OK, "attn_plan_workspace_size: forward %zu, backward %zu bytes", fw, bw);
  tu_check(attn_plan_workspace_size(plan, NULL, NULL) == ATTN_STATUS_OK,
           "attn_plan_workspace_size accepts NULL outputs");

  enum { NO = 2 * 3 * 4 * 3, NL = 2 * 4 * 3, NK = 2 * 5 * 2 * 3 };
  float o_a[NO], l_a[NL], dq_a[NO], dk_a[NK], dv_a[NK];
  float o_b[NO], l_b[NL], dq_b[NO], dk_b[NK], dv_b[NK];
  float dbias_a[1 * 2 * 3 * 5], dbias_b[1 * 2 * 3 * 5], ds_a[4 * 2], ds_b[4 * 2];
  attn_grads ga = f->g, gb = f->g;
  ga.dbias = attn_tensor_dense(dbias_a), ga.dsinks = attn_tensor_dense(ds_a);
  gb.dbias = attn_tensor_dense(dbias_b), gb.dsinks = attn_tensor_dense(ds_b);

  /* (a) the plan with the caller's workspace */
  size_t wsz = (fw > bw ? fw : bw);
  unsigned char *ws = malloc(wsz + 1);
  st = attn_plan_forward(plan, &f->in, wsz ? ws : NULL, fw, &f->out);
  tu_check(st == ATTN_STATUS_OK, "forward with the caller's workspace (%zu bytes): %s", fw,
           attn_ctx_last_error(ctx));
  memcpy(o_a, f->buf[B_OUT], sizeof o_a);
  memcpy(l_a, f->buf[B_LSE], sizeof l_a);
  st = attn_plan_backward(plan, &f->in, &f->out, &f->dout, wsz ? ws : NULL, bw, &ga);
  tu_check(st == ATTN_STATUS_OK, "backward with the caller's workspace (%zu bytes): %s", bw,
           attn_ctx_last_error(ctx));
  memcpy(dq_a, f->buf[B_DQ], sizeof dq_a);
  memcpy(dk_a, f->buf[B_DK], sizeof dk_a);
  memcpy(dv_a, f->buf[B_DV], sizeof dv_a);
  int finite = 1;
  for (int i = 0; i < NO; ++i) finite &= isfinite(o_a[i]) && isfinite(dq_a[i]);
  for (int i = 0; i < NK; ++i) finite &= isfinite(dk_a[i]) && isfinite(dv_a[i]);
  tu_check(finite, "causal + sinks + dropout + bias results are finite");

  /* (b) the conveniences, on sentinel-filled outputs */
  memset(f->buf[B_OUT], SENTINEL, sizeof o_a);
  memset(f->buf[B_LSE], SENTINEL, sizeof l_a);
  st = attn_forward(ctx, &p, &f->in, &f->out);
  memcpy(o_b, f->buf[B_OUT], sizeof o_b);
  memcpy(l_b, f->buf[B_LSE], sizeof l_b);
  tu_check(st == ATTN_STATUS_OK && memcmp(o_a, o_b, sizeof o_a) == 0 && memcmp(l_a, l_b, sizeof l_a) == 0,
           "attn_forward equals the plan path bit for bit: %s", attn_ctx_last_error(ctx));
  memset(f->buf[B_DQ], SENTINEL, sizeof dq_a);
  memset(f->buf[B_DK], SENTINEL, sizeof dk_a);
  memset(f->buf[B_DV], SENTINEL, sizeof dv_a);
  st = attn_backward(ctx, &p, &f->in, &f->out, &f->dout, &gb);
  memcpy(dq_b, f->buf[B_DQ], sizeof dq_b);
  memcpy(dk_b, f->buf[B_DK], sizeof dk_b);
  memcpy(dv_b, f->buf[B_DV], sizeof dv_b);
  tu_check(st == ATTN_STATUS_OK && memcmp(dq_a, dq_b, sizeof dq_a) == 0 &&
               memcmp(dk_a, dk_b, sizeof dk_a) == 0 && memcmp(dv_a, dv_b, sizeof dv_a) == 0 &&
               memcmp(dbias_a, dbias_b, sizeof dbias_a) == 0 && memcmp(ds_a, ds_b, sizeof ds_a) == 0,
           "attn_backward equals the plan path bit for bit: %s", attn_ctx_last_error(ctx));

  /* (c) the same plan with its own allocation (NULL workspace), run twice: deterministic */
  for (int rep = 0; rep < 2; ++rep) {
    memset(f->buf[B_OUT], SENTINEL, sizeof o_a);
    st = attn_plan_forward(plan, &f->in, NULL, 0, &f->out);
    tu_check(st == ATTN_STATUS_OK && memcmp(o_a, f->buf[B_OUT], sizeof o_a) == 0,
             "forward with the plan's own workspace (run %d) equals the caller-workspace run", rep);
  }
  free(ws);
  attn_plan_destroy(plan);
}

static void test_registry(attn_ctx *ctx) {
  int32_t n = attn_impl_count();
  tu_check(n >= 1, "attn_impl_count() = %d >= 1", (int)n);
  const char *last = attn_impl_name(n - 1);
  tu_check(last != NULL && strcmp(last, "ref") == 0, "the last implementation is \"%s\", want \"ref\"",
           last ? last : "(null)");
  tu_check(attn_impl_name(n) == NULL && attn_impl_name(-1) == NULL,
           "attn_impl_name outside 0..count-1 is NULL");
  for (int32_t i = 0; i < n; ++i) {
    const char *name = attn_impl_name(i);
    int unique = 1;
    for (int32_t j = 0; j < i; ++j) unique &= strcmp(name, attn_impl_name(j)) != 0;
    tu_check(name != NULL && name[0] != '\0' && unique, "implementation %d: \"%s\"", (int)i,
             name ? name : "(null)");
  }
  /* The default plan of a CPU f32 problem: the first implementation that supports it. */
  attn_problem p = base_problem();
  attn_plan *plan = NULL;
  attn_plan_create(ctx, &p, NULL, &plan);
  const char *first = NULL;
  for (int32_t i = 0; i < n && first == NULL; ++i)
    if (attn_impl_supports(ctx, attn_impl_name(i), &p) == ATTN_STATUS_OK) first = attn_impl_name(i);
  tu_check(plan != NULL && first != NULL && strcmp(attn_plan_impl_name(plan), first) == 0,
           "the default plan takes the first supporting implementation (\"%s\")",
           plan ? attn_plan_impl_name(plan) : "(none)");
  attn_plan_destroy(plan);
  /* A CUDA problem in a CPU-only build: unsupported by ref, with a reason. */
  p.device = ATTN_DEVICE_CUDA;
  tu_check(attn_impl_supports(ctx, "ref", &p) == ATTN_STATUS_UNSUPPORTED &&
               attn_ctx_last_error(ctx)[0] != '\0',
           "ref is UNSUPPORTED for a CUDA problem, with a reason: \"%s\"", attn_ctx_last_error(ctx));
}

int main(void) {
  uint64_t seed = tu_seed("test_api");
  tu_rng rng = tu_rng_make(seed);
  test_status_strings();
  test_version();
  test_null_handling();
  test_dtypes();
  test_conversions(&rng);
  test_logging();

  attn_ctx *ctx = NULL;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK || ctx == NULL) {
    tu_check(0, "attn_ctx_create");
    return tu_finish();
  }
  tu_check(attn_ctx_last_error(ctx) != NULL && attn_ctx_last_error(ctx)[0] == '\0',
           "a new context has an empty last error");
  fixture f;
  fixture_init(&f, &rng);
  test_invalid_problems(ctx, &f, &rng);
  test_invalid_runs(ctx, &f, &rng);
  test_interleaved_grads(ctx, &rng);
  test_edges(ctx, &f, &rng);
  test_registry(ctx);
  test_tensor_shapes(ctx);
  test_broadcast_strides(ctx, &rng);
  fixture_free(&f);
  attn_ctx_destroy(ctx);
  return tu_finish();
}
