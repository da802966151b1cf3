/*
 * src/impl/ref/ref_rows.h - the reference on chosen rows, for the attn tool's oracle.
 *
 * `attn bench` and `attn check` (tools/harness.c) compare every implementation with the reference
 * in f64. Running the whole reference once per candidate, on one thread, took an hour for one
 * large problem; these entry points let the harness evaluate the reference once per problem, on
 * as many threads as it likes (each call touches only its own row and its own scratch), and, for a
 * large problem, on a seeded sample of rows only. Each computes exactly what the whole pass
 * (attn_ref_impl) computes for those rows: the same row functions of ref.c run them.
 *
 * run is a plan's kind of run (a resolved problem, resolved tensors; workspace unused) whose inputs
 * are read in their own dtypes, and whose results (out, lse, dq) are in results_dtype: the problem's
 * dtype for the naive computation (run->round_to set), or ATTN_DTYPE_F64 for the oracle, lse then
 * in f64 too. Query rows are named by head and token, the row of the token tensors (q, out, dq):
 * b * Tq + i dense, the packed row for packed varlen; rows outside every sequence get their
 * defined value (out 0, lse -inf, dq 0). scratch holds attn_ref_row_scratch_size bytes,
 * 8-byte aligned.
 */
#ifndef ATTN_IMPL_REF_REF_ROWS_H
#define ATTN_IMPL_REF_REF_ROWS_H

#include "impl/impl.h"

#include <stddef.h>
#include <stdint.h>

size_t attn_ref_row_scratch_size(const attn_problem *problem);

/* Writes out and lse of query row (head, token) to run->outputs. */
void attn_ref_forward_row(const attn_run *run, attn_dtype results_dtype, int64_t head,
                          int64_t token, void *scratch);

/* Writes dq of query row (head, token) to run->grads, from the row's out and lse in run->outputs
 * (in results_dtype: attn_ref_forward_row's). */
void attn_ref_dq_row(const attn_run *run, attn_dtype results_dtype, int64_t head, int64_t token,
                     void *scratch);

/* Adds what query row (head, token) contributes to the gradients of keys[0..count) of its sequence
 * (key j of the row's batch entry; the kv head is the row's) to dk [count, D] and dv [count, Dv],
 * in list order, from the row's out and lse in run->outputs. A key's dk and dv are the sum of these
 * over every query row of its batch entry and the query heads of its kv head. */
void attn_ref_key_grads_row(const attn_run *run, attn_dtype results_dtype, int64_t head,
                            int64_t token, const int64_t *keys, int64_t count, double *dk,
                            double *dv, void *scratch);

#endif /* ATTN_IMPL_REF_REF_ROWS_H */
