/*
 * src/plan/problem_string.c - the one text form of a problem: written for cache keys, log lines and
 * events, read by the `attn` command and tests. attn.h lists the tokens.
 *
 * Writing is canonical (fixed token order, defaults left out, numbers in their shortest exact
 * form), so two problems that differ only in how a default was spelled in the struct still give
 * different strings; attn_problem_key() first brings a resolved problem to one spelling, so that
 * equal computations give equal cache keys.
 */
#include "plan/exec.h"

#include "core/ctx.h"
#include "core/dtype.h"
#include "core/tensors.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct writer {
  char *buf;
  size_t size;
  size_t len; /* length of the whole string, even past size */
} writer;

static void put(writer *w, const char *fmt, ...) ATTN_PRINTF(2, 3);
static void put(writer *w, const char *fmt, ...) {
  char tmp[256];
  va_list args;
  va_start(args, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, args);
  va_end(args);
  if (n <= 0) return;
  const char *sep = w->len > 0 ? " " : "";
  for (const char *s = sep; *s; ++s, ++w->len)
    if (w->len + 1 < w->size) w->buf[w->len] = *s;
  for (int i = 0; i < n && i < (int)sizeof tmp - 1; ++i, ++w->len)
    if (w->len + 1 < w->size) w->buf[w->len] = tmp[i];
}

/* The shortest %g form that reads back as the same double. */
static void format_double(double v, char *buf, size_t size) {
  for (int digits = 6; digits <= 17; ++digits) {
    snprintf(buf, size, "%.*g", digits, v);
    if (strtod(buf, NULL) == v) return;
  }
}

static const char *dtype_token(int32_t dtype) { return attn_dtype_name((attn_dtype)dtype); }

size_t attn_problem_to_string(const attn_problem *p, char *buf, size_t size) {
  writer w = {buf, size, 0};
  if (p == NULL) {
    if (buf != NULL && size > 0) buf[0] = '\0';
    return 0;
  }
  char num[64];
  put(&w, "b%lld hq%lld hkv%lld sq%lld sk%lld d%lld", (long long)p->batch, (long long)p->heads_q,
      (long long)p->heads_kv, (long long)p->seqlen_q, (long long)p->seqlen_k,
      (long long)p->head_dim);
  if (p->head_dim_v != 0) put(&w, "dv%lld", (long long)p->head_dim_v);
  put(&w, "%s", dtype_token(p->dtype));
  if (p->causal) put(&w, "causal");
  if (p->window_left != -1 || p->window_right != -1)
    put(&w, "window=%lld,%lld", (long long)p->window_left, (long long)p->window_right);
  if (p->align == ATTN_ALIGN_TOP_LEFT) put(&w, "align=tl");
  if (p->scale != 0.0) {
    format_double(p->scale, num, sizeof num);
    put(&w, "scale=%s", num);
  }
  if (p->softcap != 0.0) {
    format_double(p->softcap, num, sizeof num);
    put(&w, "softcap=%s", num);
  }
  if (p->dropout_p != 0.0) {
    format_double(p->dropout_p, num, sizeof num);
    put(&w, "dropout=%s", num);
  }
  if (p->has_bias) {
    if (p->bias_dtype != ATTN_DTYPE_F32)
      put(&w, "bias=%lldx%lldx%lldx%lld:%s", (long long)p->bias_shape[0],
          (long long)p->bias_shape[1], (long long)p->bias_shape[2], (long long)p->bias_shape[3],
          dtype_token(p->bias_dtype));
    else
      put(&w, "bias=%lldx%lldx%lldx%lld", (long long)p->bias_shape[0], (long long)p->bias_shape[1],
          (long long)p->bias_shape[2], (long long)p->bias_shape[3]);
  }
  if (p->has_mask)
    put(&w, "mask=%lldx%lldx%lldx%lld", (long long)p->mask_shape[0], (long long)p->mask_shape[1],
        (long long)p->mask_shape[2], (long long)p->mask_shape[3]);
  if (p->alibi == ATTN_ALIBI_PER_HEAD) put(&w, "alibi=h");
  if (p->alibi == ATTN_ALIBI_PER_BATCH_HEAD) put(&w, "alibi=bh");
  if (p->alibi != ATTN_ALIBI_NONE && p->alibi != ATTN_ALIBI_PER_HEAD &&
      p->alibi != ATTN_ALIBI_PER_BATCH_HEAD)
    put(&w, "alibi=%d", (int)p->alibi);
  if (p->num_sinks != 0 || p->sinks_shared)
    put(&w, "sinks=%lld%s", (long long)p->num_sinks, p->sinks_shared ? ":shared" : "");
  if (p->has_segment_ids) put(&w, "segments");
  if (p->varlen == ATTN_VARLEN_PACKED)
    put(&w, "varlen=packed:%lld,%lld", (long long)p->total_q, (long long)p->total_k);
  else if (p->varlen == ATTN_VARLEN_PADDED)
    put(&w, "varlen=padded");
  else if (p->varlen != ATTN_VARLEN_NONE)
    put(&w, "varlen=%d", (int)p->varlen);
  if (p->page_size != 0 || p->num_pages != 0 || p->max_pages_per_seq != 0) {
    if (p->max_pages_per_seq != 0)
      put(&w, "paged=%lld,%lld,%lld", (long long)p->page_size, (long long)p->num_pages,
          (long long)p->max_pages_per_seq);
    else if (p->num_pages != 0)
      put(&w, "paged=%lld,%lld", (long long)p->page_size, (long long)p->num_pages);
    else
      put(&w, "paged=%lld", (long long)p->page_size);
  }
  if (p->seqlen_new != 0) put(&w, "new=%lld", (long long)p->seqlen_new);
  if (p->out_dtype != -1) put(&w, "out=%s", dtype_token(p->out_dtype));
  if (p->descale == ATTN_DESCALE_TENSOR) put(&w, "descale=tensor");
  else if (p->descale == ATTN_DESCALE_PER_BATCH_KV_HEAD) put(&w, "descale=bhkv");
  else if (p->descale != ATTN_DESCALE_NONE) put(&w, "descale=%d", (int)p->descale);
  if (p->operation == ATTN_OPERATION_SCALED_DOT_PRODUCT_ATTENTION)
    put(&w, "op=sdpa");
  else if (p->operation != ATTN_OPERATION_FLASH_ATTENTION)
    put(&w, "op=%d", (int)p->operation);
  if (p->device == ATTN_DEVICE_CUDA)
    put(&w, p->device_index != 0 ? "device=cuda:%d" : "device=cuda", (int)p->device_index);
  else if (p->device != ATTN_DEVICE_CPU)
    put(&w, "device=%d:%d", (int)p->device, (int)p->device_index);
  if (buf != NULL && size > 0) buf[w.len < size ? w.len : size - 1] = '\0';
  return w.len;
}

void attn_problem_key(const attn_problem *resolved, char *buf, size_t size) {
  attn_problem p = *resolved;
  /* One spelling per computation: causal is window right = 0 (SPEC.md); defaults left out. */
  if (p.window_right == 0) p.causal = 1;
  if (p.causal && p.window_left == -1) p.window_right = -1;
  if (p.head_dim_v == p.head_dim) p.head_dim_v = 0;
  if (p.scale == 1.0 / sqrt((double)p.head_dim)) p.scale = 0.0;
  if (p.varlen != ATTN_VARLEN_PACKED) p.total_q = p.total_k = 0;
  if (!p.has_bias) {
    p.bias_dtype = ATTN_DTYPE_F32;
    memset(p.bias_shape, 0, sizeof p.bias_shape);
  }
  if (!p.has_mask) memset(p.mask_shape, 0, sizeof p.mask_shape);
  if (p.num_sinks == 0) p.sinks_shared = 0;
  attn_problem default_out = p;
  default_out.out_dtype = -1;
  if (attn_out_dtype(&p) == attn_out_dtype(&default_out)) p.out_dtype = -1; /* spelled out */
  /* A paged cache's pool and table sizes left out when they are the defaults they resolved from. */
  if (p.page_size > 0) {
    attn_problem bare = p;
    bare.num_pages = bare.max_pages_per_seq = 0;
    const int64_t max_pages = attn_paged_max_pages(&bare);
    bare.max_pages_per_seq = p.max_pages_per_seq;
    if (p.num_pages == attn_paged_num_pages(&bare) && p.max_pages_per_seq == max_pages) {
      p.num_pages = 0;
      p.max_pages_per_seq = 0;
    } else if (p.max_pages_per_seq == max_pages) {
      p.max_pages_per_seq = 0;
    }
  }
  attn_problem_to_string(&p, buf, size);
}

/* ---- parsing ------------------------------------------------------------------------------- */

#define BAD(...) attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT, __VA_ARGS__)

/* A whole decimal integer (optionally negative); 0 on anything else. */
static int parse_int(const char *s, size_t n, int64_t *out) {
  char tmp[32];
  if (n == 0 || n >= sizeof tmp) return 0;
  memcpy(tmp, s, n);
  tmp[n] = '\0';
  char *end;
  errno = 0;
  long long v = strtoll(tmp, &end, 10);
  if (errno != 0 || *end != '\0' || end == tmp) return 0;
  *out = v;
  return 1;
}

/* A number as strtod reads it, "nan" and "inf" included: validation, not the parser, refuses a
 * value by the rule it breaks (SPEC.md "Errors"), so scale=nan gets "scale must be finite". A
 * number too large for a double reads as inf, for the same reason; one so small that it reads as 0
 * is refused (underflows_to_zero says so), since 0 means "the default" for scale and "off" for
 * softcap. */
static int parse_double(const char *s, size_t n, double *out) {
  char tmp[64];
  if (n == 0 || n >= sizeof tmp) return 0;
  memcpy(tmp, s, n);
  tmp[n] = '\0';
  char *end;
  errno = 0;
  double v = strtod(tmp, &end);
  if (*end != '\0' || end == tmp || (errno == ERANGE && v == 0.0)) return 0;
  *out = v;
  return 1;
}

/* Whether the text is a number whose only fault is reading as 0 (e.g. 1e-400). */
static int underflows_to_zero(const char *s, size_t n) {
  char tmp[64];
  if (n == 0 || n >= sizeof tmp) return 0;
  memcpy(tmp, s, n);
  tmp[n] = '\0';
  char *end;
  errno = 0;
  double v = strtod(tmp, &end);
  return *end == '\0' && end != tmp && errno == ERANGE && v == 0.0;
}

static int token_is(const char *tok, size_t n, const char *word) {
  return strlen(word) == n && strncmp(tok, word, n) == 0;
}

static int parse_dtype(const char *s, size_t n, int32_t *out) {
  /* the names fp8 formats go by elsewhere (FlashAttention-3's "fp8", OCP's "E4M3") */
  if (token_is(s, n, "fp8") || token_is(s, n, "e4m3")) {
    *out = ATTN_DTYPE_F8E4M3;
    return 1;
  }
  for (int d = 0; d < ATTN_DTYPE_COUNT; ++d) {
    const char *name = attn_dtype_name((attn_dtype)d);
    if (strlen(name) == n && strncmp(s, name, n) == 0) {
      *out = d;
      return 1;
    }
  }
  return 0;
}

/* Up to max comma-separated integers; returns how many, 0 when the text is not such a list. */
static int parse_int_list(const char *s, size_t n, int64_t *out, int max) {
  size_t at = 0;
  for (int count = 0; count < max; ++count) {
    size_t start = at;
    while (at < n && s[at] != ',') ++at;
    if (!parse_int(s + start, at - start, &out[count])) return 0;
    if (at == n) return count + 1;
    ++at; /* the ',' */
  }
  return 0; /* more than max */
}

/* "AxBxCxD" into four sizes. */
static int parse_shape(const char *s, size_t n, int64_t shape[4]) {
  size_t at = 0;
  for (int d = 0; d < 4; ++d) {
    size_t start = at;
    while (at < n && s[at] != 'x') ++at;
    if (!parse_int(s + start, at - start, &shape[d])) return 0;
    if (d < 3) {
      if (at >= n) return 0;
      ++at; /* the 'x' */
    }
  }
  return at == n;
}

/* The fields a token sets; each may be set by one token only. */
typedef enum field {
  F_BATCH, F_HEADS_Q, F_HEADS_KV, F_SEQLEN_Q, F_SEQLEN_K, F_HEAD_DIM, F_HEAD_DIM_V, F_DTYPE,
  F_CAUSAL, F_WINDOW, F_ALIGN, F_SCALE, F_SOFTCAP, F_DROPOUT, F_BIAS, F_MASK, F_ALIBI, F_SINKS,
  F_SEGMENTS, F_VARLEN, F_OPERATION, F_DEVICE, F_OUT_DTYPE, F_DESCALE, F_COUNT
} field;

static const char *const field_names[F_COUNT] = {
    "batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim", "head_dim_v", "dtype",
    "causal", "the window", "align", "scale", "softcap", "dropout_p", "the bias", "the mask",
    "alibi", "the sinks", "segment ids", "varlen", "the operation", "the device", "out_dtype",
    "descale"};

/* The token that set each field so far (NULL: none). */
typedef struct claims {
  const char *tok[F_COUNT];
  size_t len[F_COUNT];
} claims;

/* Records that tok sets f; INVALID_ARGUMENT naming both tokens when another one already did, since
 * which of "b1 b2" was meant is a guess the parser should not make. */
static attn_status claim(attn_ctx *ctx, claims *c, field f, const char *tok, size_t n) {
  if (c->tok[f] != NULL)
    return BAD("problem string tokens \"%.*s\" and \"%.*s\" both set %s: give it once",
               (int)(c->len[f] < 100 ? c->len[f] : 100), c->tok[f], (int)(n < 100 ? n : 100), tok,
               field_names[f]);
  c->tok[f] = tok;
  c->len[f] = n;
  return ATTN_STATUS_OK;
}

/* The size tokens, letters then a whole number: the fields each sets. */
static const struct size_key {
  const char *letters;
  field first, second; /* second == first when it sets one field */
} size_keys[] = {
    {"b", F_BATCH, F_BATCH},          {"hq", F_HEADS_Q, F_HEADS_Q},
    {"hkv", F_HEADS_KV, F_HEADS_KV},  {"h", F_HEADS_Q, F_HEADS_KV},
    {"sq", F_SEQLEN_Q, F_SEQLEN_Q},   {"sk", F_SEQLEN_K, F_SEQLEN_K},
    {"s", F_SEQLEN_Q, F_SEQLEN_K},    {"d", F_HEAD_DIM, F_HEAD_DIM},
    {"dv", F_HEAD_DIM_V, F_HEAD_DIM_V},
};

/* The key=value tokens: the field each sets and the form its value must have. */
static const struct value_key {
  const char *key;
  field f;
  const char *form;
} value_keys[] = {
    {"window", F_WINDOW, "window=L,R: two whole numbers, the keys visible left and right of the "
                         "diagonal (-1 = unbounded), e.g. window=256,0"},
    {"align", F_ALIGN, "align=tl (top-left) or align=br (bottom-right, the default)"},
    {"scale", F_SCALE, "scale=S, a number (0 = 1/sqrt(head_dim))"},
    {"softcap", F_SOFTCAP, "softcap=C, a number (0 = off)"},
    {"dropout", F_DROPOUT, "dropout=P, a number in [0, 1)"},
    {"bias", F_BIAS, "bias=BxHxTqxTk or bias=BxHxTqxTk:DTYPE (f32, f16, bf16 or f64), four whole "
                     "numbers"},
    {"mask", F_MASK, "mask=BxHxTqxTk, four whole numbers"},
    {"alibi", F_ALIBI, "alibi=h (a slope per head) or alibi=bh (per batch entry and head)"},
    {"sinks", F_SINKS, "sinks=S or sinks=S:shared, S a whole number"},
    {"varlen", F_VARLEN, "varlen=packed:TQ,TK (the total query and key rows) or varlen=padded"},
    {"op", F_OPERATION, "op=sdpa or op=flash"},
    {"device", F_DEVICE, "device=cpu, device=cuda or device=cuda:N, N >= 0"},
    {"dtype", F_DTYPE, "dtype=f32, dtype=f16, dtype=bf16, dtype=f64 or dtype=f8e4m3"},
    {"out", F_OUT_DTYPE, "out=DTYPE (f32, f16 or bf16): the dtype of out"},
    {"descale", F_DESCALE, "descale=tensor (one factor per tensor) or descale=bhkv (per batch "
                           "entry and KV head)"},
};

#define TRY_CLAIM(f)                                                                               \
  do {                                                                                             \
    attn_status claimed_ = claim(ctx, &c, (f), tok, n);                                            \
    if (claimed_ != ATTN_STATUS_OK) return claimed_;                                               \
  } while (0)

attn_status attn_problem_parse(attn_ctx *ctx, const char *text, attn_problem *problem) {
  if (ctx == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  if (text == NULL) return BAD("text is NULL: a problem string is required");
  if (problem == NULL) return BAD("problem is NULL");
  attn_problem p;
  attn_problem_init(&p);
  claims c;
  memset(&c, 0, sizeof c);
  const char *s = text;
  while (*s) {
    while (*s && isspace((unsigned char)*s)) ++s;
    if (!*s) break;
    const char *tok = s;
    while (*s && !isspace((unsigned char)*s)) ++s;
    size_t n = (size_t)(s - tok);
    const int shown = (int)(n < 200 ? n : 200);
    const char *eq = memchr(tok, '=', n);
    int ok = 1;
    int32_t dt;
    if (eq == NULL) {
      /* sizes: letters then digits */
      size_t letters = 0;
      while (letters < n && isalpha((unsigned char)tok[letters])) ++letters;
      const struct size_key *size = NULL;
      for (size_t k = 0; k < sizeof size_keys / sizeof *size_keys; ++k)
        if (token_is(tok, letters, size_keys[k].letters)) size = &size_keys[k];
      int64_t v = 0;
      if (parse_dtype(tok, n, &dt)) {
        TRY_CLAIM(F_DTYPE);
        p.dtype = dt;
      } else if (token_is(tok, n, "causal")) {
        TRY_CLAIM(F_CAUSAL);
        p.causal = 1;
      } else if (token_is(tok, n, "segments")) {
        TRY_CLAIM(F_SEGMENTS);
        p.has_segment_ids = 1;
      } else if (size != NULL) {
        if (!parse_int(tok + letters, n - letters, &v))
          return BAD("problem string token \"%.*s\": %s needs a whole number, as in %s4", shown,
                     tok, size->letters, size->letters);
        TRY_CLAIM(size->first);
        if (size->second != size->first) TRY_CLAIM(size->second);
        int64_t *fields[F_COUNT] = {[F_BATCH] = &p.batch,       [F_HEADS_Q] = &p.heads_q,
                                    [F_HEADS_KV] = &p.heads_kv, [F_SEQLEN_Q] = &p.seqlen_q,
                                    [F_SEQLEN_K] = &p.seqlen_k, [F_HEAD_DIM] = &p.head_dim,
                                    [F_HEAD_DIM_V] = &p.head_dim_v};
        *fields[size->first] = *fields[size->second] = v;
      } else {
        ok = 0;
      }
    } else {
      size_t kn = (size_t)(eq - tok);
      const char *val = eq + 1;
      size_t vn = n - kn - 1;
      const char *colon = memchr(val, ':', vn);
      size_t head = colon ? (size_t)(colon - val) : vn;
      /* The field the key sets, claimed before its value is read; unknown keys are said below. */
      const struct value_key *key = NULL;
      for (size_t k = 0; k < sizeof value_keys / sizeof *value_keys; ++k)
        if (token_is(tok, kn, value_keys[k].key)) key = &value_keys[k];
      if (key != NULL) TRY_CLAIM(key->f);
      if (token_is(tok, kn, "window")) {
        const char *comma = memchr(val, ',', vn);
        ok = comma != NULL && parse_int(val, (size_t)(comma - val), &p.window_left) &&
             parse_int(comma + 1, vn - (size_t)(comma - val) - 1, &p.window_right);
      } else if (token_is(tok, kn, "align")) {
        if (token_is(val, vn, "tl"))
          p.align = ATTN_ALIGN_TOP_LEFT;
        else if (token_is(val, vn, "br"))
          p.align = ATTN_ALIGN_BOTTOM_RIGHT;
        else
          ok = 0;
      } else if (token_is(tok, kn, "scale")) {
        ok = parse_double(val, vn, &p.scale);
      } else if (token_is(tok, kn, "softcap")) {
        ok = parse_double(val, vn, &p.softcap);
      } else if (token_is(tok, kn, "dropout")) {
        ok = parse_double(val, vn, &p.dropout_p);
      } else if (token_is(tok, kn, "bias")) {
        p.has_bias = 1;
        ok = parse_shape(val, head, p.bias_shape) &&
             (colon == NULL || parse_dtype(colon + 1, vn - head - 1, &p.bias_dtype));
      } else if (token_is(tok, kn, "mask")) {
        p.has_mask = 1;
        ok = parse_shape(val, vn, p.mask_shape);
      } else if (token_is(tok, kn, "alibi")) {
        if (token_is(val, vn, "h"))
          p.alibi = ATTN_ALIBI_PER_HEAD;
        else if (token_is(val, vn, "bh"))
          p.alibi = ATTN_ALIBI_PER_BATCH_HEAD;
        else
          ok = 0;
      } else if (token_is(tok, kn, "sinks")) {
        ok = parse_int(val, head, &p.num_sinks) &&
             (colon == NULL || token_is(colon + 1, vn - head - 1, "shared"));
        p.sinks_shared = colon != NULL;
      } else if (token_is(tok, kn, "varlen")) {
        if (token_is(val, vn, "padded")) {
          p.varlen = ATTN_VARLEN_PADDED;
        } else if (token_is(val, head, "packed") && colon != NULL) {
          const char *rest = colon + 1;
          size_t rn = vn - head - 1;
          const char *comma = memchr(rest, ',', rn);
          p.varlen = ATTN_VARLEN_PACKED;
          ok = comma != NULL && parse_int(rest, (size_t)(comma - rest), &p.total_q) &&
               parse_int(comma + 1, rn - (size_t)(comma - rest) - 1, &p.total_k);
        } else {
          ok = 0;
        }
      } else if (token_is(tok, kn, "paged")) {
        /* <page_size>[,<num_pages>[,<max_pages_per_seq>]] */
        int64_t parts[3] = {0, 0, 0};
        ok = parse_int_list(val, vn, parts, 3) > 0;
        p.page_size = parts[0], p.num_pages = parts[1], p.max_pages_per_seq = parts[2];
      } else if (token_is(tok, kn, "new")) {
        ok = parse_int(val, vn, &p.seqlen_new);
      } else if (token_is(tok, kn, "op")) {
        if (token_is(val, vn, "sdpa"))
          p.operation = ATTN_OPERATION_SCALED_DOT_PRODUCT_ATTENTION;
        else if (token_is(val, vn, "flash"))
          p.operation = ATTN_OPERATION_FLASH_ATTENTION;
        else
          ok = 0;
      } else if (token_is(tok, kn, "device")) {
        int64_t index = 0;
        if (token_is(val, head, "cpu"))
          p.device = ATTN_DEVICE_CPU;
        else if (token_is(val, head, "cuda"))
          p.device = ATTN_DEVICE_CUDA;
        else
          ok = 0;
        if (ok && colon != NULL)
          ok = parse_int(colon + 1, vn - head - 1, &index) && index >= 0 && index <= INT32_MAX;
        p.device_index = (int32_t)index;
      } else if (token_is(tok, kn, "dtype")) {
        ok = parse_dtype(val, vn, &p.dtype);
      } else if (token_is(tok, kn, "out")) {
        ok = parse_dtype(val, vn, &p.out_dtype);
      } else if (token_is(tok, kn, "descale")) {
        if (token_is(val, vn, "tensor"))
          p.descale = ATTN_DESCALE_TENSOR;
        else if (token_is(val, vn, "bhkv"))
          p.descale = ATTN_DESCALE_PER_BATCH_KV_HEAD;
        else
          ok = 0;
      } else {
        ok = 0;
      }
      const int number =
          key != NULL && (key->f == F_SCALE || key->f == F_SOFTCAP || key->f == F_DROPOUT);
      if (!ok && number && underflows_to_zero(val, vn))
        return BAD("problem string token \"%.*s\": the number is too small for a double and "
                   "would read as 0 (write 0 for the default)",
                   shown, tok);
      if (!ok && key != NULL)
        return BAD("problem string token \"%.*s\" is not understood: expected %s", shown, tok,
                   key->form);
    }
    if (!ok)
      return BAD("problem string token \"%.*s\" is not understood (expected e.g. \"b4 hq32 hkv8 "
                 "sq4096 sk4096 d128 bf16 causal window=256,0 softcap=30 sinks=4\"; attn.h lists "
                 "every token)",
                 shown, tok);
  }
  if (c.tok[F_HEADS_Q] == NULL)
    return BAD("problem string \"%s\" has no hq<heads> token (heads_q is required)", text);
  if (c.tok[F_SEQLEN_Q] == NULL)
    return BAD("problem string \"%s\" has no sq<length> token (seqlen_q is required)", text);
  if (c.tok[F_HEAD_DIM] == NULL)
    return BAD("problem string \"%s\" has no d<dim> token (head_dim is required)", text);
  if (c.tok[F_BATCH] == NULL) p.batch = 1;
  if (c.tok[F_HEADS_KV] == NULL) p.heads_kv = p.heads_q;
  if (c.tok[F_SEQLEN_K] == NULL) p.seqlen_k = p.seqlen_q;
  *problem = p;
  return attn_succeed(ctx);
}
