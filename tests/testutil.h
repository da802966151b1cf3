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

/* ---- error measures ---- */
/* The difference of a (any dtype) from r (f64 array of n), as tol_compare (tolerance.h). */
tol_err tu_compare(const tu_buf *a, const double *r, int64_t n);

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
