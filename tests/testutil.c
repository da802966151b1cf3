/*
 * tests/testutil.c - shared test helpers; see testutil.h.
 */
#define _XOPEN_SOURCE 700 /* erand48, clock_gettime */
#include "testutil.h"

#include "core/dtype.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int passed_count, failed_count;

uint64_t tu_seed(const char *program) {
  const char *env = getenv("ATTN_TEST_SEED");
  uint64_t seed;
  if (env != NULL && *env != '\0') {
    seed = strtoull(env, NULL, 10);
  } else {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    seed = ((uint64_t)ts.tv_sec * 1000003u) ^ (uint64_t)ts.tv_nsec;
    seed %= 1000000000u;
  }
  printf("%s: seed=%llu (replay with ATTN_TEST_SEED=%llu)\n", program, (unsigned long long)seed,
         (unsigned long long)seed);
  fflush(stdout);
  return seed;
}

tu_rng tu_rng_make(uint64_t seed) {
  tu_rng r;
  r.state[0] = (unsigned short)(seed ^ 0x330e);
  r.state[1] = (unsigned short)(seed >> 16);
  r.state[2] = (unsigned short)((seed >> 32) ^ (seed >> 48));
  return r;
}

double tu_uniform(tu_rng *rng, double lo, double hi) {
  return lo + (hi - lo) * erand48(rng->state);
}

int64_t tu_int(tu_rng *rng, int64_t lo, int64_t hi) {
  int64_t v = lo + (int64_t)(erand48(rng->state) * (double)(hi - lo + 1));
  return v > hi ? hi : v;
}

tu_buf tu_buf_new(attn_dtype dtype, int64_t n) {
  tu_buf b = {NULL, dtype, n};
  size_t bytes = (size_t)(n > 0 ? n : 1) * attn_dtype_size(dtype);
  b.data = calloc(1, bytes);
  if (b.data == NULL) {
    fprintf(stderr, "test: out of memory allocating %zu bytes\n", bytes);
    exit(2);
  }
  return b;
}

void tu_buf_free(tu_buf *b) {
  free(b->data);
  b->data = NULL;
  b->n = 0;
}

double tu_get(const tu_buf *b, int64_t i) { return attn_load(b->data, b->dtype, i); }

void tu_set(tu_buf *b, int64_t i, double value) { attn_store(b->data, b->dtype, i, value); }

void tu_fill_uniform(tu_buf *b, tu_rng *rng, double lo, double hi) {
  for (int64_t i = 0; i < b->n; ++i) tu_set(b, i, tu_uniform(rng, lo, hi));
}

tu_buf tu_buf_convert(const tu_buf *b, attn_dtype dtype) {
  tu_buf c = tu_buf_new(dtype, b->n);
  for (int64_t i = 0; i < b->n; ++i) tu_set(&c, i, tu_get(b, i));
  return c;
}

attn_tensor tu_tensor(const tu_buf *b) { return attn_tensor_dense(b->n > 0 ? b->data : NULL); }

tu_buf tu_box4(const tu_buf *g, const int64_t gs[4], const int64_t at[4], const int64_t n[4],
               const int64_t *const map[4]) {
  tu_buf out = tu_buf_new(g->dtype, n[0] * n[1] * n[2] * n[3]);
  int64_t i[4], e = 0;
  for (i[0] = 0; i[0] < n[0]; ++i[0])
    for (i[1] = 0; i[1] < n[1]; ++i[1])
      for (i[2] = 0; i[2] < n[2]; ++i[2])
        for (i[3] = 0; i[3] < n[3]; ++i[3]) {
          int64_t x[4];
          for (int d = 0; d < 4; ++d)
            x[d] = map != NULL && map[d] != NULL ? map[d][i[d]] : (at != NULL ? at[d] : 0) + i[d];
          tu_set(&out, e++, tu_get(g, ((x[0] * gs[1] + x[1]) * gs[2] + x[2]) * gs[3] + x[3]));
        }
  return out;
}

void tu_args_dense(tu_args *a, void *q, void *k, void *v, void *out, void *lse, void *dout,
                   void *dq, void *dk, void *dv) {
  attn_inputs_init(&a->in);
  attn_outputs_init(&a->out);
  attn_grads_init(&a->grads);
  a->dout = attn_tensor_dense(NULL);
  void *const at[9] = {q, k, v, out, lse, dout, dq, dk, dv};
  attn_tensor *const to[9] = {&a->in.q, &a->in.k,     &a->in.v,     &a->out.out, &a->out.lse,
                              &a->dout, &a->grads.dq, &a->grads.dk, &a->grads.dv};
  for (int i = 0; i < 9; ++i)
    if (at[i] != NULL) *to[i] = attn_tensor_dense(at[i]);
}

static void *buf_data(const tu_buf *b) { return b != NULL ? tu_tensor(b).data : NULL; }

void tu_args_bufs(tu_args *a, const tu_buf *q, const tu_buf *k, const tu_buf *v, const tu_buf *out,
                  const tu_buf *lse, const tu_buf *dout, const tu_buf *dq, const tu_buf *dk,
                  const tu_buf *dv) {
  tu_args_dense(a, buf_data(q), buf_data(k), buf_data(v), buf_data(out), buf_data(lse),
                buf_data(dout), buf_data(dq), buf_data(dk), buf_data(dv));
}

double tu_max_error(const tu_buf *got, const tu_buf *want, double *scale) {
  double err = 0;
  *scale = 1;
  for (int64_t i = 0; i < want->n; ++i) {
    const double x = tu_get(got, i), y = tu_get(want, i);
    if (isfinite(y) && fabs(y) > *scale) *scale = fabs(y);
    const double e = (isinf(x) || isinf(y)) ? (x == y ? 0 : INFINITY) : fabs(x - y);
    if (!(e <= err)) err = e;
  }
  return err;
}

tol_err tu_compare(const tu_buf *a, const double *r, int64_t n) {
  tol_err e = tol_err_init();
  for (int64_t i = 0; i < n; ++i) tol_err_add(&e, i, tu_get(a, i), r[i]);
  return e;
}

void tu_check(int ok, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  printf("%s ", ok ? "PASS" : "FAIL");
  vprintf(fmt, args);
  printf("\n");
  va_end(args);
  fflush(stdout);
  if (ok)
    passed_count++;
  else
    failed_count++;
}

int tu_failures(void) { return failed_count; }

int tu_finish(void) {
  printf("%d passed, %d failed\n", passed_count, failed_count);
  return failed_count == 0 ? 0 : 1;
}

void *tu_read_file(const char *path, size_t *size) {
  *size = 0;
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  if (fseek(f, 0, SEEK_END) != 0) {
    fclose(f);
    return NULL;
  }
  long len = ftell(f);
  rewind(f);
  char *data = malloc(len > 0 ? (size_t)len + 1 : 1);
  if (data != NULL && len > 0 && fread(data, 1, (size_t)len, f) != (size_t)len) {
    free(data);
    data = NULL;
  }
  fclose(f);
  if (data == NULL) return NULL;
  *size = (size_t)(len > 0 ? len : 0);
  data[*size] = '\0'; /* so text files can be read as strings */
  return data;
}
