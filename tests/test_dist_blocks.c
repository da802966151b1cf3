/*
 * tests/test_dist_blocks.c - the ring's blocks against the mask, key by key, without running any
 * attention: for ring sizes 2..4, both layouts, causal with both alignments, Tq != Tk, windows
 * that cut through chunks and odd chunk lengths, every step of every rank:
 *   - device blocks (src/dist/ring.c, step_blocks and block_runs_unplaced): each unplaced call's
 *     own mask, that of a plan of its shape (unmasked when `full`, otherwise the problem's window
 *     and alignment at the local offset), is the global mask on its rows and keys; a placed call
 *     is one pair of chunks (the cuda kernels take one piece of positions per axis); the calls of
 *     a step together cover every visible (row, key) pair exactly once;
 *   - host blocks (placed at global positions): every visible pair lies in exactly one block;
 *   - nothing is visible after the ring's last step;
 *   - the zigzag layout of a causal mask with Tq == Tk (and any problem without a mask) runs one
 *     unplaced call per step on the device, a contiguous one at most one, and under
 *     ATTN_DIST_RING_BLOCKS=pairs one call per visible pair of chunks;
 *   - with ALiBi or dropout (which read positions beyond the mask) every device call is a placed
 *     pair.
 * A wrong hull (a cut pair at another offset, a hidden pair that the call's mask shows, a pair
 * counted twice, a placed call of two chunks) fails here. The plan is made by hand: only the
 * fields the ring's geometry reads.
 */
#include "dist/dist.h"
#include "plan/validate.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct geometry {
  int n, layout, causal, align;
  int64_t nq, nk; /* chunk lengths */
  int64_t wl, wr; /* window (-1 unbounded), before causal is folded in */
  int alibi;      /* per-head ALiBi: the device places every call */
} geometry;

static int make_plan(attn_ctx *ctx, const geometry *ge, int32_t r, attn_dist_plan *plan) {
  memset(plan, 0, sizeof *plan);
  const int chunks = ge->layout == ATTN_DIST_LAYOUT_ZIGZAG ? 2 : 1;
  attn_problem p;
  attn_problem_init(&p);
  p.dtype = ATTN_DTYPE_F32, p.device = ATTN_DEVICE_CPU;
  p.batch = 1, p.heads_q = p.heads_kv = 1, p.head_dim = 8;
  p.seqlen_q = ge->nq * chunks * ge->n, p.seqlen_k = ge->nk * chunks * ge->n;
  p.causal = ge->causal, p.align = ge->align;
  p.window_left = ge->wl, p.window_right = ge->wr;
  p.alibi = ge->alibi ? ATTN_ALIBI_PER_HEAD : ATTN_ALIBI_NONE;
  if (attn_validate_problem(ctx, &p, &plan->global) != ATTN_STATUS_OK) return 0;
  plan->ctx = ctx;
  plan->ring_local = plan->global;
  plan->ring_local.seqlen_q = p.seqlen_q / ge->n, plan->ring_local.seqlen_k = p.seqlen_k / ge->n;
  plan->ns = plan->ring_n = ge->n, plan->ring_r = plan->seq_rank = r;
  plan->layout = ge->layout, plan->chunks = chunks;
  return 1;
}

/* Whether global key k is visible to global row q. */
static int sees(const attn_problem *G, int64_t q, int64_t k) {
  const int64_t o = G->align == ATTN_ALIGN_BOTTOM_RIGHT ? G->seqlen_k - G->seqlen_q : 0;
  if (G->window_left >= 0 && k < q + o - G->window_left) return 0;
  if (G->window_right >= 0 && k > q + o + G->window_right) return 0;
  return 1;
}

/* Whether a call of rows x keys (unmasked when full) shows its key j to its row i. */
static int call_sees(const attn_problem *G, int64_t rows, int64_t keys, int full, int64_t i,
                     int64_t j) {
  if (full) return 1;
  const int64_t L = G->align == ATTN_ALIGN_BOTTOM_RIGHT ? keys - rows : 0;
  if (G->window_left >= 0 && j < i + L - G->window_left) return 0;
  if (G->window_right >= 0 && j > i + L + G->window_right) return 0;
  return 1;
}

static int64_t global_row(attn_dist_plan *plan, int64_t T, int64_t len, int32_t r, int64_t i) {
  return attn_dist_chunk_start(plan, T, r, (int32_t)(i / len)) + i % len;
}

/* Every step of every rank of one geometry, device and host; counts the device's calls (all, the
 * most in a step, the placed ones). */
static void check_geometry(attn_ctx *ctx, const geometry *ge, const char *name, int *calls,
                           int *max_calls, int *placed) {
  attn_dist_plan plan;
  *calls = *max_calls = *placed = 0;
  if (!make_plan(ctx, ge, 0, &plan)) {
    tu_check(0, "%s: the problem is valid (%s)", name, attn_ctx_last_error(ctx));
    return;
  }
  const attn_problem *G = &plan.global;
  const int64_t Tq = plan.ring_local.seqlen_q, Tk = plan.ring_local.seqlen_k;
  unsigned char *cover = malloc((size_t)(Tq * Tk));
  int ok = 1;
  for (int32_t r = 0; r < ge->n && ok; ++r) {
    make_plan(ctx, ge, r, &plan);
    for (int32_t s = 0; s < ge->n && ok; ++s) {
      const int32_t src = ((r - s) % ge->n + ge->n) % ge->n;
      for (int device = 0; device <= 1 && ok; ++device) {
        attn_dist_block blocks[4];
        const int nb = attn_dist_ring_step_blocks(&plan, device, r, s, blocks);
        if (device && nb > *max_calls) *max_calls = nb;
        if (device) *calls += nb;
        memset(cover, 0, (size_t)(Tq * Tk));
        for (int b = 0; b < nb; ++b) {
          const attn_dist_block *k = &blocks[b];
          const int64_t rows = k->na * ge->nq, keys = k->nc * ge->nk;
          if (device && k->placed) {
            ++*placed;
            if (k->na != 1 || k->nc != 1 || k->full) {
              tu_check(0, "%s rank %d step %d: placed call %d is %d x %d chunks (full %d)", name,
                       (int)r, (int)s, b, (int)k->na, (int)k->nc, k->full);
              ok = 0;
            }
          }
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = 0; j < keys; ++j) {
              const int64_t li = k->a0 * ge->nq + i, lj = k->c0 * ge->nk + j;
              const int64_t gq = global_row(&plan, G->seqlen_q, ge->nq, r, li);
              const int64_t gk = global_row(&plan, G->seqlen_k, ge->nk, k->src, lj);
              const int shown =
                  device && !k->placed ? call_sees(G, rows, keys, k->full, i, j) : sees(G, gq, gk);
              if (device && shown && !sees(G, gq, gk)) {
                tu_check(0,
                         "%s rank %d step %d: call %d shows global key %lld to row %lld, "
                         "which the mask hides",
                         name, (int)r, (int)s, b, (long long)gk, (long long)gq);
                ok = 0;
              }
              cover[li * Tk + lj] += (unsigned char)shown;
            }
        }
        for (int64_t i = 0; i < Tq && ok; ++i)
          for (int64_t j = 0; j < Tk && ok; ++j) {
            const int want = sees(G, global_row(&plan, G->seqlen_q, ge->nq, r, i),
                                  global_row(&plan, G->seqlen_k, ge->nk, src, j));
            if (cover[i * Tk + j] != want) {
              tu_check(0,
                       "%s rank %d step %d (%s): local row %lld, key %lld of rank %d is "
                       "covered %d times, the mask %s it",
                       name, (int)r, (int)s, device ? "device" : "host", (long long)i, (long long)j,
                       (int)src, (int)cover[i * Tk + j], want ? "shows" : "hides");
              ok = 0;
            }
          }
      }
    }
  }
  free(cover);
  tu_check(ok, "%s: every call's mask is the global one, every visible pair covered once", name);
}

int main(void) {
  attn_ctx *ctx;
  attn_ctx_create(&ctx);
  const int Z = ATTN_DIST_LAYOUT_ZIGZAG, C = ATTN_DIST_LAYOUT_CONTIGUOUS;
  const int TL = ATTN_ALIGN_TOP_LEFT, BR = ATTN_ALIGN_BOTTOM_RIGHT;
  int geometries = 0, unplaced = 0;
  char name[160];
  const int64_t lens[][2] = {{5, 5}, {3, 7}, {7, 3}, {4, 6}};
  const int64_t windows[][2] = {{-1, -1}, {0, -1}, {2, -1}, {5, -1}, {11, -1},
                                {-1, 0},  {-1, 3}, {3, 2},  {0, 0},  {9, 4}};
  for (int n = 2; n <= 4; ++n)
    for (int layout = 0; layout < 2; ++layout)
      for (int causal = 0; causal <= 1; ++causal)
        for (int align = 0; align < 2; ++align)
          for (size_t li = 0; li < sizeof lens / sizeof lens[0]; ++li)
            for (size_t wi = 0; wi < sizeof windows / sizeof windows[0]; ++wi) {
              if (causal && windows[wi][1] >= 0) continue; /* causal sets window_right 0 */
              for (int alibi = 0; alibi <= 1; ++alibi) {
                const geometry ge = {n,           layout ? Z : C, causal,         align ? BR : TL,
                                     lens[li][0], lens[li][1],    windows[wi][0], windows[wi][1],
                                     alibi};
                snprintf(name, sizeof name,
                         "n=%d %s causal=%d %s nq=%lld nk=%lld window %lld/%lld%s", n,
                         layout ? "zigzag" : "contiguous", causal,
                         align ? "bottom-right" : "top-left", (long long)ge.nq, (long long)ge.nk,
                         (long long)ge.wl, (long long)ge.wr, alibi ? " ALiBi" : "");
                int all = 0, calls = 0, placed = 0;
                check_geometry(ctx, &ge, name, &all, &calls, &placed);
                ++geometries, unplaced += placed == 0;
                const int no_mask = !causal && ge.wl < 0 && ge.wr < 0;
                const int square_causal = causal && ge.wl < 0 && ge.nq == ge.nk;
                if (alibi) /* every call placed: the kernels see the distances as global */
                  tu_check(placed == all, "%s: the device places every call (%d of %d)", name,
                           placed, all);
                else if (no_mask || square_causal) /* the device ring's promise */
                  tu_check(placed == 0 && calls == 1,
                           "%s: one unplaced call per step on the device (%d, %d placed)", name,
                           calls, placed);
              }
            }
  printf("%d geometries, %d without placed calls on the device ring\n", geometries, unplaced);

  /* ATTN_DIST_RING_BLOCKS=pairs: the calls before the hull, one per visible pair of chunks. */
  const geometry zz = {2, Z, 1, TL, 6, 6, -1, -1, 0};
  attn_dist_plan plan;
  make_plan(ctx, &zz, 1, &plan);
  plan.ring_pairs = 1;
  attn_dist_block blocks[4];
  const int diagonal = attn_dist_ring_step_blocks(&plan, 1, 1, 0, blocks);
  const int other = attn_dist_ring_step_blocks(&plan, 1, 1, 1, blocks);
  tu_check(diagonal == 3 && other == 2, "pairs: a causal zigzag step is 3 and 2 calls (%d, %d)",
           diagonal, other);
  plan.ring_pairs = 0;
  tu_check(attn_dist_ring_step_blocks(&plan, 1, 1, 0, blocks) == 1 && blocks[0].na == 2 &&
               blocks[0].nc == 2 && !blocks[0].full,
           "hull: the diagonal step of a causal zigzag ring is one causal call of 2 x 2 chunks");
  tu_check(attn_dist_ring_step_blocks(&plan, 1, 1, 1, blocks) == 1 && blocks[0].na == 2 &&
               blocks[0].nc == 1 && blocks[0].full,
           "hull: keys from an earlier rank are one unmasked call of both query chunks");
  attn_ctx_destroy(ctx);
  return tu_finish();
}
