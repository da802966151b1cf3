/*
 * tests/testutil.h - what every test program shares: a seeded random source (the seed is printed
 * and can be replayed with ATTN_TEST_SEED), typed buffers, the difference of a buffer from the
 * reference (SPEC.md's tolerance rule itself is tolerance.h), and the pass/fail tally that ends
 * each program with "N passed, N failed".
 */
#ifndef ATTN_TESTUTIL_H
#define ATTN_TESTUTIL_H

#include "attn.h"
#include "tolerance.h"

#include <stddef.h>
#include <stdint.h>

/* ---- random numbers: POSIX erand48, seeded once per program ---- */
typedef struct tu_rng {
  unsigned short state[3];
} tu_rng;

/* The program's seed: ATTN_TEST_SEED when set, else drawn from the clock; printed as "seed=N". */
uint64_t tu_seed(const char *program);
tu_rng tu_rng_make(uint64_t seed);
double tu_uniform(tu_rng *rng, double lo, double hi); /* [lo, hi) */
int64_t tu_int(tu_rng *rng, int64_t lo, int64_t hi);  /* [lo, hi] */

/* ---- typed buffers ---- */
typedef struct tu_buf {
  void *data;
  attn_dtype dtype;
  int64_t n;
} tu_buf;

tu_buf tu_buf_new(attn_dtype dtype, int64_t n); /* zero-filled; aborts the test on OOM */
void tu_buf_free(tu_buf *b);
double tu_get(const tu_buf *b, int64_t i);
void tu_set(tu_buf *b, int64_t i, double value); /* rounded to the buffer's dtype */
/* Fills with uniform values in [lo, hi) rounded to the dtype. */
void tu_fill_uniform(tu_buf *b, tu_rng *rng, double lo, double hi);
/* A copy converted to dtype (values rounded). */
tu_buf tu_buf_convert(const tu_buf *b, attn_dtype dtype);
attn_tensor tu_tensor(const tu_buf *b); /* dense tensor over the buffer; NULL data if n == 0 */

/* The box of a dense 4-d tensor g of shape gs, of shape n, whose element i along dim d is g's
 * element map[d][i] when map and map[d] are given, else at[d] + i (at NULL: i). */
tu_buf tu_box4(const tu_buf *g, const int64_t gs[4], const int64_t at[4], const int64_t n[4],
               const int64_t *const map[4]);

/* ---- the arguments of one forward and backward ---- */
typedef struct tu_args {
  attn_inputs in;
  attn_outputs out;
  attn_grads grads;
  attn_tensor dout;
} tu_args;
/* Initialised, with each tensor given dense at its address (host or device memory; NULL leaves
 * it unset); the caller adds the rest (bias, sinks, lengths, seeds). */
void tu_args_dense(tu_args *a, void *q, void *k, void *v, void *out, void *lse, void *dout,
                   void *dq, void *dk, void *dv);
/* The same over host buffers (tu_tensor: a buffer of no elements gives an unset tensor). */
void tu_args_bufs(tu_args *a, const tu_buf *q, const tu_buf *k, const tu_buf *v, const tu_buf *out,
                  const tu_buf *lse, const tu_buf *dout, const tu_buf *dq, const tu_buf *dk,
                  const tu_buf *dv);

/* ---- error measures ---- */
/* The difference of a (any dtype) from r (f64 array of n), as tol_compare (tolerance.h). */
tol_err tu_compare(const tu_buf *a, const double *r, int64_t n);
/* The largest |got - want| (infinite where one side is infinite and they differ), and in *scale
 * the largest finite |want|, at least 1: a tolerance for results of one implementation computed
 * in another order (the distributed tests) is relative to it. */
double tu_max_error(const tu_buf *got, const tu_buf *want, double *scale);

/* ---- tally ---- */
void tu_check(int ok, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
int tu_failures(void);
/* Prints "N passed, N failed" and returns the exit code (0 when nothing failed). */
int tu_finish(void);

/* Reads a whole file into malloc'd memory with a NUL byte after its *size bytes (so a text file
 * is a string); returns NULL (and *size = 0) when it cannot. */
void *tu_read_file(const char *path, size_t *size);

#endif /* ATTN_TESTUTIL_H */
