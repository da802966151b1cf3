/*
 * tests/test_band.cu - the cuda kernels' band helpers, run on the host (no GPU needed, so CI runs
 * it wherever the CUDA toolkit builds the kernels). The sm90 kernels hide an edge block's scores by
 * ranges instead of asking visible_band score by score: the forward by each row's visible keys
 * (visible_band_keys), the backward by each key's visible rows (visible_band_queries). Each range
 * must hold exactly the scores that SPEC.md's band and lengths let through, and visible_band
 * itself must agree: every (row, key) of every small problem (lengths 0-9, causal offsets
 * -11..11, windows from 0 up, none, or huge), and rows and keys near the largest lengths and
 * offsets the host passes (2^30).
 */
#include "impl/cuda/cuda_common.cuh"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

using namespace attn_cuda;

static long long checks = 0, failures = 0;

/* SPEC.md: row i sees key j within the lengths, j >= i + o - window_left (a window_left >= 0)
 * and j <= i + o + window_right (a window_right >= 0), in int64 so that nothing overflows. */
static bool spec_visible(const attn_cuda_params &p, const Head &r, int64_t i, int64_t j) {
  if (i < 0 || j < 0 || i >= r.len_q || j >= r.len_k) return false;
  const int64_t diag = i + r.o;
  if (p.window_left >= 0 && j < diag - p.window_left) return false;
  if (p.window_right >= 0 && j > diag + p.window_right) return false;
  return true;
}

static void expect(bool got, bool want, const char *what, const attn_cuda_params &p, const Head &r, int64_t i,
                   int64_t j) {
  ++checks;
  if (got == want) return;
  if (failures++ < 20)
    printf("FAIL %s: len_q=%d len_k=%d o=%d window=(%d,%d) row %lld key %lld: %s, SPEC says %s\n", what, r.len_q,
           r.len_k, r.o, p.window_left, p.window_right, (long long)i, (long long)j, got ? "visible" : "hidden",
           want ? "visible" : "hidden");
}

/* Whether visible_band's int arithmetic (i + o, then -window_left or +window_right) holds row i:
 * it does for every row of a problem the host lets through below 2^30 rows unless its window
 * reaches past about 2^31 - 2^30 (then the ranges, in int64, still hold). */
static bool in_int_range(const attn_cuda_params &p, const Head &r, int64_t i) {
  const int64_t diag = i + r.o;
  return diag - (p.window_left > 0 ? p.window_left : 0) >= INT_MIN &&
         diag + (p.window_right > 0 ? p.window_right : 0) <= INT_MAX;
}

/* Rows [i0, i1) and keys [j0, j1) of one problem: visible_band, and the two ranges, against SPEC. */
static void check_problem(const attn_cuda_params &p, const Head &r, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  for (int64_t i = i0; i < i1; ++i) {
    int lo, hi;
    visible_band_keys(p, r, (int)i, lo, hi);
    const bool band_holds = i >= r.len_q || in_int_range(p, r, i);
    for (int64_t j = j0; j < j1; ++j) {
      const bool want = spec_visible(p, r, i, j);
      expect(j >= lo && j < hi, want, "visible_band_keys", p, r, i, j);
      if (band_holds) expect(visible_band(p, r, (int)i, (int)j), want, "visible_band", p, r, i, j);
    }
  }
  for (int64_t j = j0; j < j1; ++j) {
    int lo, hi;
    visible_band_queries(p, r, (int)j, lo, hi);
    for (int64_t i = i0; i < i1; ++i) expect(i >= lo && i < hi, spec_visible(p, r, i, j), "visible_band_queries", p, r, i, j);
  }
}

/* The head of a problem with lengths lq, lk and causal offset o; p takes the window. */
static Head problem(attn_cuda_params &p, int lq, int lk, int o, int wl, int wr) {
  Head r;
  memset(&r, 0, sizeof r);
  r.len_q = lq, r.len_k = lk, r.o = o;
  p.window_left = wl, p.window_right = wr;
  return r;
}

int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);
  attn_cuda_params p;
  memset(&p, 0, sizeof p);
  /* -1: no bound on that side; 1 << 30: larger than any small problem */
  const int windows[] = {-1, 0, 1, 2, 3, 5, 8, 13, 1 << 30};
  for (int lq = 0; lq < 10; ++lq)
    for (int lk = 0; lk < 10; ++lk)
      for (int o = -11; o <= 11; ++o)
        for (int wl : windows)
          for (int wr : windows) {
            const Head r = problem(p, lq, lk, o, wl, wr);
            /* the kernels ask about rows and keys past the lengths too (a tile's last block) */
            check_problem(p, r, 0, lq + 3, 0, lk + 3);
          }
  /* Near the host's bounds (cuda.c: lengths and offsets below 2^30, windows of Tq + Tk or more
   * made unbounded): the first and last rows and keys of the largest problems, and the rows
   * around the window's edges. The ranges compute in int64 and must hold everywhere;
   * visible_band in int, checked where that holds (in_int_range). */
  const int big = 1 << 30;
  const int lens[] = {1, 1000, big - 1, big};
  const int offsets[] = {0, 1, -1, big - 1, -(big - 1), 12345, -12345};
  const int big_windows[] = {-1, 0, 7, 1000, big - 1};
  for (int lq : lens)
    for (int lk : lens)
      for (int o : offsets)
        for (int wl : big_windows)
          for (int wr : big_windows) {
            const Head r = problem(p, lq, lk, o, wl, wr);
            const int64_t ends_q[] = {0, (int64_t)lq - 3}, ends_k[] = {0, (int64_t)lk - 3};
            for (int64_t iq : ends_q)
              for (int64_t jk : ends_k) {
                const int64_t i0 = iq < 0 ? 0 : iq, j0 = jk < 0 ? 0 : jk;
                check_problem(p, r, i0, i0 + 6, j0, j0 + 6);
              }
            /* the rows around the diagonal of the key range's ends, where the window's edges are */
            for (int64_t jk : ends_k) {
              const int64_t j0 = jk < 0 ? 0 : jk, d = j0 - o;
              for (int64_t di : {(int64_t)0, (int64_t)-wl, (int64_t)wr}) {
                const int64_t i0 = d + di - 3;
                if (i0 + 6 <= 0 || i0 >= lq + 3) continue;
                check_problem(p, r, i0 < 0 ? 0 : i0, i0 + 6 > lq + 3 ? lq + 3 : i0 + 6, j0, j0 + 6);
              }
            }
          }
  printf("%lld checks passed, %lld failed\n", checks - failures, failures);
  return failures != 0;
}
