/*
 * tests/test_golden.c - every registered implementation against the golden vectors of
 * ../shared/golden, which code outside this project computed in float64 (see its README.md).
 *
 * Usage: test_golden [folder]   (CTest passes ATTN_GOLDEN_DIR; the default is ../shared/golden)
 *
 * For each case folder (one with a case.txt) and each implementation that supports the case, the
 * forward (out, lse) and backward (dq, dk, dv, and dbias / dsinks when the case has them) passes
 * are compared with the expected arrays under SPEC.md's rule (tests/tolerance.h):
 *   - f32 inputs on every implementation: max|a - r| <= 1e-4 * max(1, max|r|);
 *   - f16 and bf16 inputs (every input value of a case is exactly representable in both): the error
 *     must be at most 2x (3x for gradients) the error of the naive same-dtype computation, which is
 *     the reference plan run again after attn_plan_set_rounding(plan, dtype), plus 1e-3 * max|r|;
 *   - lse must be -inf exactly where the expected one is (fully masked and padded rows), and no
 *     output may hold a NaN. Outputs are pre-filled with NaN, so an element an implementation
 *     forgets to write fails too.
 * Each case is also run once with operation = scaled_dot_product_attention on the reference (f32)
 * against the same vectors, with the probabilities requested: without dropout every row of them
 * must sum to 1 - sum_t exp(sink_t - lse) (1 without sinks, 0 on fully masked rows), and entries
 * outside a varlen sequence must be 0.
 *
 * One line per case x implementation x dtype x operation; the program fails on any failure and
 * when the folder holds no case, so a wrong path cannot pass.
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"
#include "core/dtype.h"
#include "core/tensors.h"
#include "plan/plan.h"
#include "testutil.h"

#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BATCH 64
#define MAX_FILES 32
#define PATH_SIZE 1024

/* One golden case: the problem (in f32), its inputs as f32 buffers and the expected f64 arrays. */
typedef struct gcase {
  char name[128];
  char dir[PATH_SIZE];
  attn_problem p;
  int32_t cu_q[MAX_BATCH + 1], cu_k[MAX_BATCH + 1], len_q[MAX_BATCH], len_k[MAX_BATCH];
  uint64_t seed;
  int n_cu_q, n_cu_k, n_len_q, n_len_k;
  int alibi_dims, sinks_dims, bias_dims, mask_dims;
  int64_t alibi_shape[2], sinks_shape[2];
  char files[MAX_FILES][64];
  int n_files;
  /* inputs (f32, or u8 / i32) */
  tu_buf q, k, v, dout, bias, mask, alibi, sinks, qseg, kvseg;
  /* expected */
  double *out, *lse, *dq, *dk, *dv, *dbias, *dsinks;
} gcase;

/* Results of one run. */
typedef struct gres {
  tu_buf out, lse, probs, dq, dk, dv, dbias, dsinks;
} gres;

/* ---- small helpers ------------------------------------------------------------------------- */

static int has_file(const gcase *c, const char *name) {
  for (int i = 0; i < c->n_files; ++i)
    if (strcmp(c->files[i], name) == 0) return 1;
  return 0;
}

/* A buffer of n elements of dtype filled with NaN (or zero for integer types). */
static tu_buf nan_buf(attn_dtype dtype, int64_t n) {
  tu_buf b = tu_buf_new(dtype, n);
  if (dtype != ATTN_DTYPE_U8 && dtype != ATTN_DTYPE_I32)
    for (int64_t i = 0; i < n; ++i) tu_set(&b, i, NAN);
  return b;
}

static void gres_free(gres *r) {
  tu_buf *all[] = {&r->out, &r->lse, &r->probs, &r->dq, &r->dk, &r->dv, &r->dbias, &r->dsinks};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
    if (all[i]->data != NULL) tu_buf_free(all[i]);
}

static void gcase_free(gcase *c) {
  tu_buf *bufs[] = {&c->q,    &c->k,     &c->v,     &c->dout, &c->bias,
                    &c->mask, &c->alibi, &c->sinks, &c->qseg, &c->kvseg};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; ++i)
    if (bufs[i]->data != NULL) tu_buf_free(bufs[i]);
  double *arrays[] = {c->out, c->lse, c->dq, c->dk, c->dv, c->dbias, c->dsinks};
  for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; ++i) free(arrays[i]);
}

/* Reads dir/name, which must hold exactly n elements of elem_size bytes. */
static void *load_array(const gcase *c, const char *name, size_t elem_size, int64_t n, char *why,
                        size_t why_size) {
  char path[PATH_SIZE + 80];
  snprintf(path, sizeof path, "%s/%s", c->dir, name);
  size_t size;
  void *data = tu_read_file(path, &size);
  if (data == NULL && n > 0) {
    snprintf(why, why_size, "cannot read %s", path);
    return NULL;
  }
  if (size != (size_t)n * elem_size) {
    snprintf(why, why_size, "%s holds %zu bytes, expected %lld elements of %zu bytes", path, size,
             (long long)n, elem_size);
    free(data);
    return NULL;
  }
  if (data == NULL) data = calloc(1, 1);
  return data;
}

/* An f32 / u8 / i32 input file as a tu_buf of that dtype. */
static int load_input(const gcase *c, const char *name, attn_dtype dtype, int64_t n, tu_buf *out,
                      char *why, size_t why_size) {
  void *data = load_array(c, name, attn_dtype_size(dtype), n, why, why_size);
  if (data == NULL) return 0;
  *out = tu_buf_new(dtype, n);
  if (n > 0) memcpy(out->data, data, (size_t)n * attn_dtype_size(dtype));
  free(data);
  return 1;
}

static int load_expected(const gcase *c, const char *name, int64_t n, double **out, char *why,
                         size_t why_size) {
  *out = load_array(c, name, sizeof(double), n, why, why_size);
  return *out != NULL;
}

/* ---- case.txt ------------------------------------------------------------------------------- */

static int parse_ints(char *rest, int64_t *values, int max) {
  int n = 0;
  for (char *tok = strtok(rest, " \t"); tok != NULL; tok = strtok(NULL, " \t")) {
    if (n == max) return -1;
    char *end;
    values[n++] = strtoll(tok, &end, 10);
    if (*end != '\0') return -1;
  }
  return n;
}

/* Parses case.txt into c->p and the lengths; 0 with a reason on anything it does not understand,
 * so a new key in the golden folder is noticed rather than ignored. */
static int parse_case(gcase *c, char *why, size_t why_size) {
  char path[PATH_SIZE + 16];
  snprintf(path, sizeof path, "%s/case.txt", c->dir);
  size_t size;
  char *text = tu_read_file(path, &size);
  if (text == NULL) {
    snprintf(why, why_size, "cannot read %s", path);
    return 0;
  }
  char *copy = malloc(size + 1);
  memcpy(copy, text, size);
  copy[size] = '\0';
  free(text);

  attn_problem *p = &c->p;
  attn_problem_init(p);
  int ok = 1;
  int seen_sizes = 0;
  char *save_line = NULL;
  for (char *line = strtok_r(copy, "\n", &save_line); line != NULL && ok;
       line = strtok_r(NULL, "\n", &save_line)) {
    size_t len = strlen(line);
    while (len > 0 && (line[len - 1] == '\r' || line[len - 1] == ' ')) line[--len] = '\0';
    if (len == 0) continue;
    char *rest = strchr(line, ' ');
    if (rest != NULL)
      *rest++ = '\0';
    else
      rest = line + len;
    const char *key = line;
    int64_t v[MAX_BATCH + 1];
    int n;
#define INT_KEY(k, field)                                                                          \
  if (strcmp(key, k) == 0) {                                                                       \
    field = strtoll(rest, NULL, 10);                                                               \
    seen_sizes++;                                                                                  \
    continue;                                                                                      \
  }
    INT_KEY("B", p->batch)
    INT_KEY("Tq", p->seqlen_q)
    INT_KEY("Tk", p->seqlen_k)
    INT_KEY("Hq", p->heads_q)
    INT_KEY("Hkv", p->heads_kv)
    INT_KEY("D", p->head_dim)
    INT_KEY("Dv", p->head_dim_v)
#undef INT_KEY
    if (strcmp(key, "name") == 0) {
      snprintf(c->name, sizeof c->name, "%s", rest);
    } else if (strcmp(key, "oracles") == 0) {
      /* informational */
    } else if (strcmp(key, "scale") == 0) {
      p->scale = strtod(rest, NULL);
    } else if (strcmp(key, "causal") == 0) {
      p->causal = (int32_t)strtol(rest, NULL, 10);
    } else if (strcmp(key, "align") == 0) {
      if (strcmp(rest, "bottom_right") == 0)
        p->align = ATTN_ALIGN_BOTTOM_RIGHT;
      else if (strcmp(rest, "top_left") == 0)
        p->align = ATTN_ALIGN_TOP_LEFT;
      else
        ok = 0, snprintf(why, why_size, "align %s is not bottom_right or top_left", rest);
    } else if (strcmp(key, "window_left") == 0) {
      p->window_left = strtoll(rest, NULL, 10);
    } else if (strcmp(key, "window_right") == 0) {
      p->window_right = strtoll(rest, NULL, 10);
    } else if (strcmp(key, "softcap") == 0) {
      p->softcap = strtod(rest, NULL);
    } else if (strcmp(key, "dropout_p") == 0) {
      p->dropout_p = strtod(rest, NULL);
    } else if (strcmp(key, "dropout_seed") == 0) {
      c->seed = strtoull(rest, NULL, 10);
    } else if (strcmp(key, "varlen") == 0) {
      if (strcmp(rest, "none") == 0)
        p->varlen = ATTN_VARLEN_NONE;
      else if (strcmp(rest, "packed") == 0)
        p->varlen = ATTN_VARLEN_PACKED;
      else if (strcmp(rest, "padded") == 0)
        p->varlen = ATTN_VARLEN_PADDED;
      else
        ok = 0, snprintf(why, why_size, "varlen %s is not none, packed or padded", rest);
    } else if (strcmp(key, "cu_seqlens_q") == 0 || strcmp(key, "cu_seqlens_k") == 0 ||
               strcmp(key, "seqlens_q") == 0 || strcmp(key, "seqlens_k") == 0) {
      int is_cu = key[0] == 'c', is_q = key[strlen(key) - 1] == 'q';
      int32_t *dst = is_cu ? (is_q ? c->cu_q : c->cu_k) : (is_q ? c->len_q : c->len_k);
      int *count = is_cu ? (is_q ? &c->n_cu_q : &c->n_cu_k) : (is_q ? &c->n_len_q : &c->n_len_k);
      n = parse_ints(rest, v, is_cu ? MAX_BATCH + 1 : MAX_BATCH);
      if (n < 0) {
        ok = 0, snprintf(why, why_size, "%s: bad or too many values", key);
        continue;
      }
      for (int i = 0; i < n; ++i) dst[i] = (int32_t)v[i];
      *count = n;
    } else if (strcmp(key, "bias_shape") == 0 || strcmp(key, "mask_shape") == 0) {
      int is_bias = key[0] == 'b';
      n = parse_ints(rest, v, 4);
      if (n != 4) {
        ok = 0, snprintf(why, why_size, "%s needs 4 values", key);
        continue;
      }
      for (int d = 0; d < 4; ++d) (is_bias ? p->bias_shape : p->mask_shape)[d] = v[d];
      if (is_bias)
        p->has_bias = 1, c->bias_dims = 4;
      else
        p->has_mask = 1, c->mask_dims = 4;
    } else if (strcmp(key, "alibi_shape") == 0) {
      n = parse_ints(rest, v, 2);
      if (n < 1) {
        ok = 0, snprintf(why, why_size, "alibi_shape needs 1 or 2 values");
        continue;
      }
      c->alibi_dims = n;
      c->alibi_shape[0] = v[0];
      c->alibi_shape[1] = n > 1 ? v[1] : 0;
      p->alibi = n == 1 ? ATTN_ALIBI_PER_HEAD : ATTN_ALIBI_PER_BATCH_HEAD;
    } else if (strcmp(key, "sinks_shape") == 0) {
      n = parse_ints(rest, v, 2);
      if (n < 1) {
        ok = 0, snprintf(why, why_size, "sinks_shape needs 1 or 2 values");
        continue;
      }
      c->sinks_dims = n;
      c->sinks_shape[0] = v[0];
      c->sinks_shape[1] = n > 1 ? v[1] : 0;
      p->sinks_shared = n == 1;
      p->num_sinks = n == 1 ? v[0] : v[1];
    } else if (strcmp(key, "files") == 0) {
      for (char *tok = strtok(rest, " \t"); tok != NULL; tok = strtok(NULL, " \t")) {
        if (c->n_files == MAX_FILES) {
          ok = 0, snprintf(why, why_size, "too many files");
          break;
        }
        snprintf(c->files[c->n_files++], sizeof c->files[0], "%s", tok);
      }
    } else {
      ok = 0, snprintf(why, why_size, "unknown key \"%s\" in %s", key, path);
    }
  }
  free(copy);
  if (!ok) return 0;
  if (seen_sizes != 7) {
    snprintf(why, why_size, "case.txt lacks some of B Tq Tk Hq Hkv D Dv");
    return 0;
  }
  if (c->name[0] == '\0') snprintf(c->name, sizeof c->name, "%s", strrchr(c->dir, '/') + 1);
  if (p->batch < 1 || p->batch > MAX_BATCH) {
    snprintf(why, why_size, "B=%lld outside 1..%d", (long long)p->batch, MAX_BATCH);
    return 0;
  }
  int64_t B = p->batch;
  if (p->varlen == ATTN_VARLEN_PACKED) {
    if (c->n_cu_q != B + 1 || c->n_cu_k != B + 1) {
      snprintf(why, why_size, "packed varlen needs cu_seqlens_q/k of B+1=%lld values",
               (long long)B + 1);
      return 0;
    }
    p->total_q = c->cu_q[B];
    p->total_k = c->cu_k[B];
  } else if (p->varlen == ATTN_VARLEN_PADDED) {
    if (c->n_len_q != B || c->n_len_k != B) {
      snprintf(why, why_size, "padded varlen needs seqlens_q/k of B=%lld values", (long long)B);
      return 0;
    }
  }
  if (c->alibi_dims > 0) {
    int good = c->alibi_dims == 1 ? c->alibi_shape[0] == p->heads_q
                                  : (c->alibi_shape[0] == B && c->alibi_shape[1] == p->heads_q);
    if (!good) {
      snprintf(why, why_size, "alibi_shape is neither [Hq] nor [B, Hq]");
      return 0;
    }
  }
  if (c->sinks_dims == 2 && c->sinks_shape[0] != p->heads_q) {
    snprintf(why, why_size, "sinks_shape [%lld, S] is not [Hq, S]", (long long)c->sinks_shape[0]);
    return 0;
  }
  p->has_segment_ids = has_file(c, "q_segment_ids.i32");
  return 1;
}

/* Which roles the case carries as input files, with their file names. */
static const struct {
  attn_role role;
  const char *file;
  size_t offset;
} input_files[] = {
    {ATTN_ROLE_Q, "q.f32", offsetof(gcase, q)},
    {ATTN_ROLE_K, "k.f32", offsetof(gcase, k)},
    {ATTN_ROLE_V, "v.f32", offsetof(gcase, v)},
    {ATTN_ROLE_DOUT, "dout.f32", offsetof(gcase, dout)},
    {ATTN_ROLE_BIAS, "bias.f32", offsetof(gcase, bias)},
    {ATTN_ROLE_MASK, "mask.u8", offsetof(gcase, mask)},
    {ATTN_ROLE_ALIBI, "alibi.f32", offsetof(gcase, alibi)},
    {ATTN_ROLE_SINKS, "sinks.f32", offsetof(gcase, sinks)},
    {ATTN_ROLE_Q_SEGMENT_IDS, "q_segment_ids.i32", offsetof(gcase, qseg)},
    {ATTN_ROLE_KV_SEGMENT_IDS, "kv_segment_ids.i32", offsetof(gcase, kvseg)},
};

static const struct {
  attn_role role;
  const char *file;
  size_t offset;
} expected_files[] = {
    {ATTN_ROLE_OUT, "out.f64", offsetof(gcase, out)},
    {ATTN_ROLE_LSE, "lse.f64", offsetof(gcase, lse)},
    {ATTN_ROLE_DQ, "dq.f64", offsetof(gcase, dq)},
    {ATTN_ROLE_DK, "dk.f64", offsetof(gcase, dk)},
    {ATTN_ROLE_DV, "dv.f64", offsetof(gcase, dv)},
    {ATTN_ROLE_DBIAS, "dbias.f64", offsetof(gcase, dbias)},
    {ATTN_ROLE_DSINKS, "dsinks.f64", offsetof(gcase, dsinks)},
};

/* Loads every array the case lists; each must have the size its problem gives it. */
static int load_case(gcase *c, char *why, size_t why_size) {
  attn_problem *p = &c->p;
  for (int f = 0; f < c->n_files; ++f) {
    int known = 0;
    for (size_t i = 0; i < sizeof input_files / sizeof input_files[0]; ++i)
      known |= strcmp(c->files[f], input_files[i].file) == 0;
    for (size_t i = 0; i < sizeof expected_files / sizeof expected_files[0]; ++i)
      known |= strcmp(c->files[f], expected_files[i].file) == 0;
    if (!known) {
      snprintf(why, why_size, "files lists %s, which this test does not know", c->files[f]);
      return 0;
    }
  }
  for (size_t i = 0; i < sizeof input_files / sizeof input_files[0]; ++i) {
    attn_role role = input_files[i].role;
    int used = attn_role_used(p, role);
    if (used != has_file(c, input_files[i].file)) {
      snprintf(why, why_size, "%s is %s but the case %s it", input_files[i].file,
               used ? "missing" : "present", used ? "uses" : "does not use");
      return 0;
    }
    if (!used) continue;
    attn_dtype dtype = attn_role_dtype(p, role); /* f32 problem: f32, u8 or i32 */
    tu_buf *dst = (tu_buf *)((char *)c + input_files[i].offset);
    if (!load_input(c, input_files[i].file, dtype, attn_role_numel(p, role), dst, why, why_size))
      return 0;
  }
  for (size_t i = 0; i < sizeof expected_files / sizeof expected_files[0]; ++i) {
    attn_role role = expected_files[i].role;
    double **dst = (double **)((char *)c + expected_files[i].offset);
    if (!attn_role_used(p, role)) continue;
    if (!has_file(c, expected_files[i].file)) {
      /* dbias / dsinks are optional outputs; everything else must be there */
      if (role == ATTN_ROLE_DBIAS || role == ATTN_ROLE_DSINKS) continue;
      snprintf(why, why_size, "%s is missing", expected_files[i].file);
      return 0;
    }
    if (!load_expected(c, expected_files[i].file, attn_role_numel(p, role), dst, why, why_size))
      return 0;
  }
  /* The f16 / bf16 runs rely on every input being exactly representable in both. */
  tu_buf *floats[] = {&c->q, &c->k, &c->v, &c->dout, &c->bias};
  for (size_t i = 0; i < sizeof floats / sizeof floats[0]; ++i) {
    for (int64_t e = 0; e < floats[i]->n; ++e) {
      double x = tu_get(floats[i], e);
      if (attn_round_to(ATTN_DTYPE_F16, x) != x || attn_round_to(ATTN_DTYPE_BF16, x) != x) {
        snprintf(why, why_size, "input value %.9g (element %lld) is not exact in f16 and bf16", x,
                 (long long)e);
        return 0;
      }
    }
  }
  return 1;
}

/* ---- running ---------------------------------------------------------------------------------- */

/* The case's problem in another dtype and operation; bias comes in the problem's dtype. */
static attn_problem problem_as(const gcase *c, attn_dtype dtype, attn_operation op) {
  attn_problem p = c->p;
  p.dtype = dtype;
  p.bias_dtype = dtype;
  p.operation = op;
  return p;
}

/* Inputs of the case converted to the problem's dtypes; *bufs holds what was made. */
typedef struct ginputs {
  attn_inputs in;
  attn_tensor dout;
  tu_buf q, k, v, dout_buf, bias;
} ginputs;

static void ginputs_make(const gcase *c, const attn_problem *p, ginputs *g) {
  attn_dtype dt = (attn_dtype)p->dtype;
  memset(g, 0, sizeof *g);
  g->q = tu_buf_convert(&c->q, dt);
  g->k = tu_buf_convert(&c->k, dt);
  g->v = tu_buf_convert(&c->v, dt);
  g->dout_buf = tu_buf_convert(&c->dout, dt);
  attn_inputs_init(&g->in);
  g->in.q = tu_tensor(&g->q);
  g->in.k = tu_tensor(&g->k);
  g->in.v = tu_tensor(&g->v);
  g->dout = tu_tensor(&g->dout_buf);
  if (p->has_bias) {
    g->bias = tu_buf_convert(&c->bias, (attn_dtype)p->bias_dtype);
    g->in.bias = tu_tensor(&g->bias);
  }
  if (p->has_mask) g->in.mask = tu_tensor(&c->mask);
  if (p->alibi != ATTN_ALIBI_NONE) g->in.alibi_slopes = tu_tensor(&c->alibi);
  if (p->num_sinks > 0) g->in.sinks = tu_tensor(&c->sinks);
  if (p->has_segment_ids) {
    g->in.q_segment_ids = tu_tensor(&c->qseg);
    g->in.kv_segment_ids = tu_tensor(&c->kvseg);
  }
  if (p->varlen == ATTN_VARLEN_PACKED) {
    g->in.cu_seqlens_q = c->cu_q;
    g->in.cu_seqlens_k = c->cu_k;
  } else if (p->varlen == ATTN_VARLEN_PADDED) {
    g->in.seqlens_q = c->len_q;
    g->in.seqlens_k = c->len_k;
  }
  g->in.dropout_seed = c->seed;
}

static void ginputs_free(ginputs *g) {
  tu_buf *all[] = {&g->q, &g->k, &g->v, &g->dout_buf, &g->bias};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i)
    if (all[i]->data != NULL) tu_buf_free(all[i]);
}

/* Forward and backward on a plan; outputs are pre-filled with NaN. 0 with a reason on failure. */
static int run_plan(attn_ctx *ctx, attn_plan *plan, const gcase *c, const attn_problem *p,
                    const ginputs *g, int want_probs, gres *r, char *why, size_t why_size) {
  memset(r, 0, sizeof *r);
  r->out = nan_buf(attn_role_dtype(p, ATTN_ROLE_OUT), attn_role_numel(p, ATTN_ROLE_OUT));
  r->lse = nan_buf(attn_role_dtype(p, ATTN_ROLE_LSE), attn_role_numel(p, ATTN_ROLE_LSE));
  r->dq = nan_buf(attn_role_dtype(p, ATTN_ROLE_DQ), attn_role_numel(p, ATTN_ROLE_DQ));
  r->dk = nan_buf(attn_role_dtype(p, ATTN_ROLE_DK), attn_role_numel(p, ATTN_ROLE_DK));
  r->dv = nan_buf(attn_role_dtype(p, ATTN_ROLE_DV), attn_role_numel(p, ATTN_ROLE_DV));
  attn_outputs outs;
  attn_outputs_init(&outs);
  outs.out = tu_tensor(&r->out);
  outs.lse = tu_tensor(&r->lse);
  if (want_probs) {
    r->probs = nan_buf(attn_role_dtype(p, ATTN_ROLE_PROBS), attn_role_numel(p, ATTN_ROLE_PROBS));
    outs.probs = tu_tensor(&r->probs);
  }
  attn_grads grads;
  attn_grads_init(&grads);
  grads.dq = tu_tensor(&r->dq);
  grads.dk = tu_tensor(&r->dk);
  grads.dv = tu_tensor(&r->dv);
  if (c->dbias != NULL) {
    r->dbias = nan_buf(attn_role_dtype(p, ATTN_ROLE_DBIAS), attn_role_numel(p, ATTN_ROLE_DBIAS));
    grads.dbias = tu_tensor(&r->dbias);
  }
  if (c->dsinks != NULL) {
    r->dsinks = nan_buf(attn_role_dtype(p, ATTN_ROLE_DSINKS), attn_role_numel(p, ATTN_ROLE_DSINKS));
    grads.dsinks = tu_tensor(&r->dsinks);
  }
  attn_status st = attn_plan_forward(plan, &g->in, NULL, 0, &outs);
  if (st != ATTN_STATUS_OK) {
    snprintf(why, why_size, "forward: %s: %s", attn_status_string(st), attn_ctx_last_error(ctx));
    return 0;
  }
  st = attn_plan_backward(plan, &g->in, &outs, &g->dout, NULL, 0, &grads);
  if (st != ATTN_STATUS_OK) {
    snprintf(why, why_size, "backward: %s: %s", attn_status_string(st), attn_ctx_last_error(ctx));
    return 0;
  }
  return 1;
}

/* ---- checking ------------------------------------------------------------------------------- */

typedef struct report {
  char text[1024];
  size_t used;
  int ok;
} report;

static void report_add(report *rep, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  int n = vsnprintf(rep->text + rep->used, sizeof rep->text - rep->used, fmt, args);
  va_end(args);
  if (n > 0) {
    rep->used += (size_t)n;
    if (rep->used >= sizeof rep->text) rep->used = sizeof rep->text - 1;
  }
}

/* Compares one tensor of a problem of dtype with SPEC.md's rule (tolerance.h); naive, the naive
 * same-dtype run, is NULL for f32. Appends "name err/bound" to the report. */
static void check_tensor(report *rep, const char *name, attn_dtype dtype, tol_pass pass,
                         const tu_buf *a, const double *r, const tu_buf *naive) {
  if (r == NULL || a->data == NULL) return;
  tol_err e = tu_compare(a, r, a->n);
  double naive_err = 0.0; /* the f32 rule needs none */
  if (naive != NULL) {
    tol_err en = tu_compare(naive, r, naive->n);
    naive_err = tol_naive_error(&en, NULL, NULL);
    if (en.nonfinite != 0) {
      report_add(rep, " %s: the naive run has %lld NaN/inf mismatches;", name,
                 (long long)en.nonfinite);
      rep->ok = 0;
    }
  }
  double bound = tol_bound(dtype, pass, e.max_ref, naive_err, NULL);
  int ok = tol_ok(&e, bound);
  report_add(rep, " %s %.2e/%.2e", name, e.max_abs, bound);
  if (e.nonfinite != 0) /* where: the first of them */
    report_add(rep, " (%lld NaN or wrong inf, first at %lld: got %g want %g)",
               (long long)e.nonfinite, (long long)e.where, tu_get(a, e.where), r[e.where]);
  else if (!ok)
    report_add(rep, " (at %lld: got %.9g want %.9g)", (long long)e.where, tu_get(a, e.where),
               r[e.where]);
  if (!ok) rep->ok = 0;
}

static void check_all(report *rep, const gcase *c, attn_dtype dtype, const gres *r,
                      const gres *naive) {
  check_tensor(rep, "out", dtype, TOL_FORWARD, &r->out, c->out, naive ? &naive->out : NULL);
  check_tensor(rep, "lse", dtype, TOL_FORWARD, &r->lse, c->lse, naive ? &naive->lse : NULL);
  check_tensor(rep, "dq", dtype, TOL_GRADIENT, &r->dq, c->dq, naive ? &naive->dq : NULL);
  check_tensor(rep, "dk", dtype, TOL_GRADIENT, &r->dk, c->dk, naive ? &naive->dk : NULL);
  check_tensor(rep, "dv", dtype, TOL_GRADIENT, &r->dv, c->dv, naive ? &naive->dv : NULL);
  check_tensor(rep, "dbias", dtype, TOL_GRADIENT, &r->dbias, c->dbias,
               naive ? &naive->dbias : NULL);
  check_tensor(rep, "dsinks", dtype, TOL_GRADIENT, &r->dsinks, c->dsinks,
               naive ? &naive->dsinks : NULL);
}

/* The expected lse of (b, h, i), sequence-relative i; NAN when the row does not exist (packed
 * rows past the sequence). */
static double expected_lse(const gcase *c, int64_t b, int64_t h, int64_t i) {
  const attn_problem *p = &c->p;
  if (p->varlen == ATTN_VARLEN_PACKED) {
    int64_t len = c->cu_q[b + 1] - c->cu_q[b];
    if (i >= len) return NAN;
    return c->lse[h * p->total_q + c->cu_q[b] + i];
  }
  return c->lse[(b * p->heads_q + h) * p->seqlen_q + i];
}

/* Probabilities of the SDPA run: entries in [0, 1/(1-p)], zero outside each varlen sequence, and
 * without dropout each row sums to 1 - sum_t exp(sink_t - lse), or 0 on a fully masked row. */
static void check_probs(report *rep, const gcase *c, const tu_buf *probs) {
  const attn_problem *p = &c->p;
  int64_t B = p->batch, H = p->heads_q, Tq = p->seqlen_q, Tk = p->seqlen_k;
  double worst_sum = 0.0, top = 1.0 / (1.0 - p->dropout_p) * (1.0 + 1e-6);
  int64_t bad = 0, first_bad = -1, rows_checked = 0;
  for (int64_t b = 0; b < B; ++b) {
    int64_t len_k = Tk;
    if (p->varlen == ATTN_VARLEN_PACKED) len_k = c->cu_k[b + 1] - c->cu_k[b];
    if (p->varlen == ATTN_VARLEN_PADDED) len_k = c->len_k[b];
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < Tq; ++i) {
        double lse = expected_lse(c, b, h, i);
        int64_t row = ((b * H + h) * Tq + i) * Tk;
        double sum = 0.0;
        for (int64_t j = 0; j < Tk; ++j) {
          double x = tu_get(probs, row + j);
          int outside = isnan(lse) || j >= len_k;
          if (!(x >= 0.0 && x <= top) || (outside && x != 0.0)) {
            if (first_bad < 0) first_bad = row + j;
            bad++;
          }
          if (!isnan(x)) sum += x;
        }
        if (p->dropout_p > 0.0) continue;
        double want = 0.0;
        if (!isnan(lse) && isfinite(lse)) {
          want = 1.0;
          for (int64_t t = 0; t < p->num_sinks; ++t) {
            double a = tu_get(&c->sinks, p->sinks_shared ? t : h * p->num_sinks + t);
            want -= exp(a - lse);
          }
        }
        double d = fabs(sum - want);
        if (d > worst_sum) worst_sum = d;
        rows_checked++;
      }
    }
  }
  int ok = bad == 0 && worst_sum <= 1e-5;
  if (p->dropout_p > 0.0)
    report_add(rep, " probs in range (dropout: row sums not checked)");
  else
    report_add(rep, " probs rowsum %.2e/1.0e-05 over %lld rows", worst_sum,
               (long long)rows_checked);
  if (bad != 0)
    report_add(rep,
               " (%lld entries out of range or nonzero outside the sequence, first at %lld: %g)",
               (long long)bad, (long long)first_bad, tu_get(probs, first_bad));
  if (!ok) rep->ok = 0;
}

/* ---- one case ---------------------------------------------------------------------------------- */

static const char *op_name(attn_operation op) {
  return op == ATTN_OPERATION_FLASH_ATTENTION ? "flash" : "sdpa";
}

/* Runs the case on one implementation, dtype and operation and prints one line. */
static void run_one(attn_ctx *ctx, const gcase *c, const char *impl, attn_dtype dt,
                    attn_operation op) {
  attn_problem p = problem_as(c, dt, op);
  const char *dname = attn_dtype_name(dt);
  int is_ref = strcmp(impl, "ref") == 0;
  attn_status st = attn_impl_supports(ctx, impl, &p);
  if (st == ATTN_STATUS_UNSUPPORTED && !is_ref) {
    printf("SKIP golden %s %s %s %s: %s\n", c->name, impl, dname, op_name(op),
           attn_ctx_last_error(ctx));
    return;
  }
  if (st != ATTN_STATUS_OK) {
    tu_check(0, "golden %s %s %s %s: attn_impl_supports: %s: %s", c->name, impl, dname, op_name(op),
             attn_status_string(st), attn_ctx_last_error(ctx));
    return;
  }
  attn_select sel;
  attn_select_init(&sel);
  sel.impl = impl;
  attn_plan *plan = NULL;
  st = attn_plan_create(ctx, &p, &sel, &plan);
  if (st != ATTN_STATUS_OK) {
    tu_check(0, "golden %s %s %s %s: attn_plan_create: %s: %s", c->name, impl, dname, op_name(op),
             attn_status_string(st), attn_ctx_last_error(ctx));
    return;
  }
  ginputs g;
  ginputs_make(c, &p, &g);
  int want_probs = op == ATTN_OPERATION_SCALED_DOT_PRODUCT_ATTENTION;
  gres r, naive;
  memset(&naive, 0, sizeof naive);
  char why[1200] = "";
  report rep = {"", 0, 1};
  int ok = run_plan(ctx, plan, c, &p, &g, want_probs, &r, why, sizeof why);
  int low = dt == ATTN_DTYPE_F16 || dt == ATTN_DTYPE_BF16;
  if (ok && low) {
    /* The naive same-dtype computation: the reference with scores and P rounded to dt. For the
     * reference this is the same plan run again. */
    attn_plan *ref_plan = plan;
    if (!is_ref) {
      sel.impl = "ref";
      st = attn_plan_create(ctx, &p, &sel, &ref_plan);
      if (st != ATTN_STATUS_OK) {
        snprintf(why, sizeof why, "reference plan for the naive run: %s", attn_ctx_last_error(ctx));
        ok = 0;
        ref_plan = NULL;
      }
    }
    if (ref_plan != NULL) {
      attn_plan_set_rounding(ref_plan, dt);
      ok = run_plan(ctx, ref_plan, c, &p, &g, 0, &naive, why, sizeof why);
      attn_plan_set_rounding(ref_plan, ATTN_DTYPE_F64);
      if (ref_plan != plan) attn_plan_destroy(ref_plan);
    }
  }
  if (ok) {
    check_all(&rep, c, dt, &r, low ? &naive : NULL);
    if (want_probs) check_probs(&rep, c, &r.probs);
    tu_check(rep.ok, "golden %s %s %s %s:%s", c->name, impl, dname, op_name(op), rep.text);
  } else {
    tu_check(0, "golden %s %s %s %s: %s", c->name, impl, dname, op_name(op), why);
  }
  gres_free(&r);
  gres_free(&naive);
  ginputs_free(&g);
  attn_plan_destroy(plan);
}

static int compare_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
  const char *root = argc > 1 ? argv[1] : "../shared/golden";
  printf("test_golden: cases from %s\n", root);
  attn_ctx *ctx = NULL;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) {
    printf("FAIL cannot create a context\n");
    return 1;
  }

  /* Every subfolder with a case.txt, in name order. */
  DIR *dir = opendir(root);
  char **names = NULL;
  size_t count = 0, cap = 0;
  if (dir != NULL) {
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
      if (e->d_name[0] == '.') continue;
      char path[PATH_SIZE];
      snprintf(path, sizeof path, "%s/%s/case.txt", root, e->d_name);
      FILE *f = fopen(path, "rb");
      if (f == NULL) continue;
      fclose(f);
      if (count == cap) {
        cap = cap ? 2 * cap : 64;
        names = realloc(names, cap * sizeof *names);
      }
      names[count] = malloc(strlen(e->d_name) + 1);
      strcpy(names[count++], e->d_name);
    }
    closedir(dir);
  }
  tu_check(count > 0, "golden folder %s holds %zu cases (a folder with none fails)", root, count);
  if (count > 1) qsort(names, count, sizeof *names, compare_names);

  const attn_dtype dtypes[] = {ATTN_DTYPE_F32, ATTN_DTYPE_F16, ATTN_DTYPE_BF16};
  for (size_t n = 0; n < count; ++n) {
    gcase *c = calloc(1, sizeof *c);
    snprintf(c->dir, sizeof c->dir, "%s/%s", root, names[n]);
    char why[PATH_SIZE + 256] = "";
    if (!parse_case(c, why, sizeof why) || !load_case(c, why, sizeof why)) {
      tu_check(0, "golden %s: %s", names[n], why);
      gcase_free(c);
      free(c);
      continue;
    }
    for (int32_t i = 0; i < attn_impl_count(); ++i) {
      const char *impl = attn_impl_name(i);
      /* f32 on every implementation; f16 and bf16 where supported (the reference always). */
      for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; ++d)
        run_one(ctx, c, impl, dtypes[d], ATTN_OPERATION_FLASH_ATTENTION);
      if (strcmp(impl, "ref") == 0)
        run_one(ctx, c, impl, ATTN_DTYPE_F32, ATTN_OPERATION_SCALED_DOT_PRODUCT_ATTENTION);
    }
    gcase_free(c);
    free(c);
  }
  for (size_t n = 0; n < count; ++n) free(names[n]);
  free(names);
  attn_ctx_destroy(ctx);
  return tu_finish();
}
