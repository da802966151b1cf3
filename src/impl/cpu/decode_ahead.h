/*
 * src/impl/cpu/decode_ahead.h - the cpu decode path's requests of the rows ahead (cpu.h's
 * attn_cpu_decode_block.ahead), shared by decode.c's key-by-key block loop and the bf16 loops of
 * kernels_avx512bf16.c: one place that walks the spans in address order and spreads the line
 * requests (prefetcht0) evenly over the steps of a phase.
 *
 * Included by one .c file each; everything here is static.
 */
#ifndef ATTN_IMPL_CPU_DECODE_AHEAD_H
#define ATTN_IMPL_CPU_DECODE_AHEAD_H

#include "impl/cpu/cpu.h"

#include <stddef.h>
#include <stdint.h>

/* A cursor over spans of whole lines: one span per key when a key's heads are neighbours (the
 * usual layout), else one per head's row; each step requests its quota from the current span with
 * one comparison a line. */
typedef struct ahead_cursor {
  const attn_cpu_decode_block *a;
  int seg;
  int64_t row, head;    /* the next span's */
  const char *at, *end; /* the current span: lines [at, end) still to request */
  int64_t quota;        /* lines a step */
} ahead_cursor;

/* A cursor over a's rows ahead, their lines spread over `steps` requests. */
static inline void ahead_start(ahead_cursor *c, const attn_cpu_decode_block *a, int64_t steps) {
  c->a = a, c->seg = 0, c->row = 0, c->head = 0, c->at = c->end = NULL;
  int64_t lines = 0;
  for (int s = 0; s < 2; ++s)
    lines += a->ahead[s].n * a->heads * (int64_t)((a->ahead[s].row_bytes + 63) / 64);
  c->quota = steps > 0 ? (lines + steps - 1) / steps : lines;
}

/* Moves to the next span; 0 when there is none. */
static inline int ahead_next_span(ahead_cursor *c) {
  const attn_cpu_decode_block *a = c->a;
  for (; c->seg < 2; ++c->seg, c->row = 0, c->head = 0) {
    if (c->row >= a->ahead[c->seg].n) continue;
    const size_t hb = a->ahead[c->seg].head_bytes, rb = a->ahead[c->seg].row_bytes;
    const char *row = a->ahead[c->seg].rows[c->row] + (size_t)c->head * hb;
    size_t bytes = rb;
    if (hb == rb) /* heads are neighbours: the whole key */
      bytes = (size_t)(a->heads - c->head) * rb, ++c->row;
    else if (++c->head == a->heads)
      c->head = 0, ++c->row;
    c->at = (const char *)((uintptr_t)row & ~(uintptr_t)63);
    c->end = row + bytes;
    return 1;
  }
  return 0;
}

/* Requests count lines (-1: all the rest): a run of requests per span, one comparison a line. */
static inline void request_ahead(ahead_cursor *c, int64_t count) {
  if (count < 0) count = INT64_MAX;
  while (count > 0) {
    if (c->at >= c->end && !ahead_next_span(c)) return;
    const int64_t left = (c->end - c->at + 63) / 64, n = left < count ? left : count;
#if defined(__GNUC__)
    for (int64_t i = 0; i < n; ++i) __builtin_prefetch(c->at + 64 * i, 0, 3);
#endif
    c->at += 64 * n, count -= n;
  }
}

#endif /* ATTN_IMPL_CPU_DECODE_AHEAD_H */
