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
#include "core/tensors.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
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

static int parse_double(const char *s, size_t n, double *out) {
  char tmp[64];
  if (n == 0 || n >= sizeof tmp) return 0;
  memcpy(tmp, s, n);
  tmp[n] = '\0';
  char *end;
  errno = 0;
  double v = strtod(tmp, &end);
  if (errno != 0 || *end != '\0' || end == tmp || !isfinite(v)) return 0;
  *out = v;
  return 1;
}

static int parse_dtype(const char *s, size_t n, int32_t *out) {
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

static int token_is(const char *tok, size_t n, const char *word) {
  return strlen(word) == n && strncmp(tok, word, n) == 0;
}

attn_status attn_problem_parse(attn_ctx *ctx, const char *text, attn_problem *problem) {
  if (ctx == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  if (text == NULL) return BAD("text is NULL: a problem string is required");
  if (problem == NULL) return BAD("problem is NULL");
  attn_problem p;
  attn_problem_init(&p);
  int have_b = 0, have_hq = 0, have_hkv = 0, have_sq = 0, have_sk = 0, have_d = 0;
  const char *s = text;
  while (*s) {
    while (*s && isspace((unsigned char)*s)) ++s;
    if (!*s) break;
    const char *tok = s;
    while (*s && !isspace((unsigned char)*s)) ++s;
    size_t n = (size_t)(s - tok);
    const char *eq = memchr(tok, '=', n);
    int ok = 1;
    int32_t dt;
    if (eq == NULL) {
      /* sizes: letters then digits */
      size_t letters = 0;
      while (letters < n && isalpha((unsigned char)tok[letters])) ++letters;
      int64_t v = 0;
      if (parse_dtype(tok, n, &dt)) {
        p.dtype = dt;
      } else if (token_is(tok, n, "causal")) {
        p.causal = 1;
      } else if (token_is(tok, n, "segments")) {
        p.has_segment_ids = 1;
      } else if (letters > 0 && letters < n && parse_int(tok + letters, n - letters, &v)) {
        if (token_is(tok, letters, "b"))
          p.batch = v, have_b = 1;
        else if (token_is(tok, letters, "hq"))
          p.heads_q = v, have_hq = 1;
        else if (token_is(tok, letters, "hkv"))
          p.heads_kv = v, have_hkv = 1;
        else if (token_is(tok, letters, "h"))
          p.heads_q = p.heads_kv = v, have_hq = have_hkv = 1;
        else if (token_is(tok, letters, "sq"))
          p.seqlen_q = v, have_sq = 1;
        else if (token_is(tok, letters, "sk"))
          p.seqlen_k = v, have_sk = 1;
        else if (token_is(tok, letters, "s"))
          p.seqlen_q = p.seqlen_k = v, have_sq = have_sk = 1;
        else if (token_is(tok, letters, "d"))
          p.head_dim = v, have_d = 1;
        else if (token_is(tok, letters, "dv"))
          p.head_dim_v = v;
        else
          ok = 0;
      } else {
        ok = 0;
      }
    } else {
      size_t kn = (size_t)(eq - tok);
      const char *val = eq + 1;
      size_t vn = n - kn - 1;
      const char *colon = memchr(val, ':', vn);
      size_t head = colon ? (size_t)(colon - val) : vn;
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
        if (ok && colon != NULL) ok = parse_int(colon + 1, vn - head - 1, &index) && index >= 0;
        p.device_index = (int32_t)index;
      } else if (token_is(tok, kn, "dtype")) {
        ok = parse_dtype(val, vn, &p.dtype);
      } else {
        ok = 0;
      }
    }
    if (!ok)
      return BAD("problem string token \"%.*s\" is not understood (expected e.g. \"b4 hq32 hkv8 "
                 "sq4096 sk4096 d128 bf16 causal window=256,0 softcap=30 sinks=4\"; attn.h lists "
                 "every token)",
                 (int)(n < 200 ? n : 200), tok);
  }
  if (!have_hq)
    return BAD("problem string \"%s\" has no hq<heads> token (heads_q is required)", text);
  if (!have_sq)
    return BAD("problem string \"%s\" has no sq<length> token (seqlen_q is required)", text);
  if (!have_d) return BAD("problem string \"%s\" has no d<dim> token (head_dim is required)", text);
  if (!have_b) p.batch = 1;
  if (!have_hkv) p.heads_kv = p.heads_q;
  if (!have_sk) p.seqlen_k = p.seqlen_q;
  *problem = p;
  return attn_succeed(ctx);
}
