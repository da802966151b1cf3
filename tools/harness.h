/*
 * tools/harness.h - what `attn bench`, `attn check` and `attn tune` share: random data of a
 * problem's shape, on the host and for a GPU problem on the device too, the f64 oracle, the
 * tolerance rule of SPEC.md, and timing.
 *
 * Every comparison is against the reference run in f64 on the host, on the same (rounded) inputs,
 * once per problem and pass (h_oracle), under the tests' rule, tests/tolerance.h: f32: max|a - r| <= 1e-4 * max(1, max|r|); f16/bf16:
 * max|a - r| <= k * err(naive) + 1e-3 * max|r| with k = 2 for the forward pass and 3 for
 * gradients, naive = the reference at the problem's dtype rounding scores and P to it.
 */
#ifndef ATTN_TOOLS_HARNESS_H
#define ATTN_TOOLS_HARNESS_H

#include "attn.h"
#include "core/gpu.h"

#include <stddef.h>
#include <stdint.h>

/* The buffers of one run, in host or in device memory: one per attn_role (NULL where the run has no
 * such tensor), and the sequence lengths of a varlen problem (cu_seqlens when packed, seqlens when
 * padded; NULL otherwise) or of a paged cache (cache_seqlens: every sequence full, seqlen_k -
 * seqlen_new; its block table gives each sequence distinct pages in shuffled order). */
typedef struct h_buffers {
  void *role[24]; /* indexed by attn_role */
  int32_t *cu_seqlens_q, *cu_seqlens_k, *seqlens_q, *seqlens_k, *cache_seqlens;
} h_buffers;

/* The data of one run: inputs, and outputs for forward and (optionally) backward. host always holds
 * the data. For a GPU problem every host buffer has a copy in device, and the tensors of in, out,
 * dout and grads point at the copies, since GPU implementations read and write device memory
 * only; h_data_download brings the outputs back to host. */
typedef struct h_data {
  attn_problem problem;
  h_buffers host;
  h_buffers device;        /* all NULL for a CPU problem */
  const attn_gpu_ops *gpu; /* NULL for a CPU problem */
  attn_inputs in;
  attn_outputs out;
  attn_tensor dout;
  attn_grads grads;
} h_data;

/* Allocates and fills data for a problem: inputs drawn from seed and rounded to their dtype on the
 * host (the same seed gives the same values on every device), outputs zero; for a GPU problem, all
 * of it copied to the device. A failure is recorded in ctx (its last error) and returned; d is then
 * freed. */
attn_status h_data_make(attn_ctx *ctx, h_data *d, const attn_problem *problem, uint64_t seed,
                        int backward);
/* Copies the outputs (and gradients) of a GPU run from the device to d->host; nothing to do for a
 * CPU problem. A failure is recorded in ctx. */
attn_status h_data_download(attn_ctx *ctx, h_data *d);
void h_data_free(h_data *d);

/* Whether the problem's device can run it: 1 for a CPU problem and for a GPU one whose device is
 * present; else 0 with the reason in why (no CUDA runtime in this build, no GPU, device_index too
 * large). */
int h_device_usable(const attn_problem *problem, char *why, size_t why_size);
/* How many GPUs are usable: 0, with the reason in why, without the CUDA runtime or a device. */
int32_t h_gpu_count(char *why, size_t why_size);

/* The f64 oracle of one problem and pass, made once and shared by every implementation x
 * configuration the tool compares and times: the run's data (inputs drawn from the seed, mirrored
 * to a GPU problem's device) and the reference's results on the checked rows, evaluated on every
 * CPU of the host (src/impl/ref/ref_rows.h), and for f16/bf16 the naive same-dtype results that
 * the tolerance rule needs.
 *
 * Which rows are checked: every row, or, for a problem whose reference would cost more than
 * H_FULL_CHECK_WORK multiply-adds (or when asked), a sample drawn from the seed: query rows
 * (head, token) for out, lse and dq, always including the first and last rows of the first and
 * last batch entries and rows at tile boundaries (16, 32, 64, 128) besides random ones; and for dk
 * and dv, the key rows of one or two (batch entry, kv head) slices, whose reference needs every
 * query row of the slice (H_SLICE_WORK bounds that work; past 4 times it dk and dv go unchecked,
 * and the oracle says so). */
#define H_FULL_CHECK_WORK (1LL << 31) /* about 2 s of the reference on one core */
#define H_SLICE_WORK (1LL << 34)      /* two slices within it; one alone may take 4 times that */
#define H_SAMPLE_ROWS 256 /* query rows sampled by default; half as many keys per slice */

typedef struct h_oracle h_oracle;

/* What an oracle checks. Rows count (head, token) pairs: Hq x the token rows of q for query rows,
 * Hkv x those of k for key rows. */
typedef struct h_rows {
  int sampled; /* 0: every row */
  int64_t query_checked, query_total;
  int64_t key_checked, key_total; /* 0 and 0 for a forward-only oracle */
  uint64_t seed;
  int keys_skipped; /* backward, sampled: no slice was cheap enough to check dk, dv */
} h_rows;

/* Makes the oracle of the problem: sample_rows 0 checks every row, N > 0 samples N query rows
 * (N / 2 keys per slice) whenever there are more, H_SAMPLE_AUTO samples H_SAMPLE_ROWS when the
 * problem is large (above). Failures (memory, the device, the reference) are recorded in ctx and
 * returned; *oracle is then NULL. */
#define H_SAMPLE_AUTO (-1)
attn_status h_oracle_make(attn_ctx *ctx, const attn_problem *problem, int backward, uint64_t seed,
                          int64_t sample_rows, h_oracle **oracle);
const h_rows *h_oracle_rows(const h_oracle *oracle);
/* "every row", or "256 of 65536 query rows and 130 of 131072 key rows (sampled, seed 1)", with a
 * note when dk and dv went unchecked. */
void h_oracle_describe(const h_oracle *oracle, char *text, size_t size);
void h_oracle_free(h_oracle *oracle);
/* The checked rows, for tests: query rows as token * Hq + head (ascending), key rows as key token *
 * Hkv + kv head (by slice): each the row's index in the dense out/dq or dk/dv tensors. */
int64_t h_oracle_query_ids(const h_oracle *oracle, const int64_t **ids);
int64_t h_oracle_key_ids(const h_oracle *oracle, const int64_t **ids);

/* One implementation and configuration compared with the oracle. */
typedef struct h_check {
  double err[5];      /* max |a - r| of out, lse, dq, dk, dv; infinite at a NaN or a wrong inf */
  double ref[5];      /* max |r| of each */
  double tol[5];      /* its allowed error */
  int compared;       /* how many of the five were compared (in that order) */
  int ok;             /* every compared one within its tolerance */
  attn_status status; /* of running it; the message in the context */
  char worst[64];     /* the output furthest past (or closest to) its tolerance */
} h_check;

/* Runs impl/config (forward, and backward when the oracle has it) on the oracle's data, its
 * outputs zeroed first, and compares the checked rows with the oracle. ctx receives the errors of
 * failed calls. */
h_check h_check_run(attn_ctx *ctx, h_oracle *oracle, const char *impl, const char *config);

/* Median microseconds of a pass (forward, or forward + backward) of impl/config on the oracle's
 * data after warmup runs, over at least reps runs and min_seconds; on a GPU a run ends when the
 * device has finished it. status: of making and running the plan, its message in ctx. */
attn_status h_time(attn_ctx *ctx, h_oracle *oracle, const char *impl, const char *config,
                   int warmup, int reps, double min_seconds, double *median_us, int *runs);

/* Floating-point operations of a pass under FlashAttention's convention: 2 * B * Hq * Tq * Tk *
 * (D + Dv) over the visible (i, j) pairs for the forward pass; forward + backward counts 3.5 times
 * that (the backward pass is 2.5 forwards). */
double h_flops(const attn_problem *problem, int backward);

/* Bytes of K and V a forward pass must read: each (sequence, KV head) reads the keys some query
 * row sees (the union of the rows' windows; every sequence of the harness is full) once, D + Dv
 * elements each. What a decode problem's rate is counted in. */
double h_kv_bytes(const attn_problem *problem);

#endif /* ATTN_TOOLS_HARNESS_H */
