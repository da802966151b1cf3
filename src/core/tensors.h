/*
 * src/core/tensors.h - one table of every tensor a problem uses: its name, logical shape, dtype and
 * dense strides, and the geometry of each batch entry (varlen offsets and lengths).
 *
 * Validation, the plan's stride resolution, implementations and tests all read shapes from here,
 * so a layout is written down once.
 */
#ifndef ATTN_CORE_TENSORS_H
#define ATTN_CORE_TENSORS_H

#include "attn.h"

/* attn_role and attn_role_name are public (attn.h). */

/* Whether the problem uses this tensor at all (bias only with has_bias, and so on). */
int attn_role_used(const attn_problem *problem, attn_role role);

/* The field of a run's structs that holds the role's tensor. */
attn_tensor *attn_role_field(attn_role role, attn_inputs *inputs, attn_outputs *outputs,
                             attn_tensor *dout, attn_grads *grads);

/* Whether a plain run of the problem, forward or (backward != 0) forward + backward, has a tensor
 * for the role: the problem uses it, it is not an optional output (probs, dbias, dsinks), and it is
 * not one of the backward pass's (dout, dq, dk, dv) in a forward run. What the tuner and the tools
 * allocate. */
int attn_role_needed(const attn_problem *problem, attn_role role, int backward);

/* Logical shape of the tensor for the problem; returns the number of dimensions (1..4). */
int attn_role_shape(const attn_problem *problem, attn_role role, int64_t shape[ATTN_MAX_DIMS]);

/* Element type of the tensor for the problem. */
attn_dtype attn_role_dtype(const attn_problem *problem, attn_role role);

/* Number of elements of the tensor (the product of its shape). */
int64_t attn_role_numel(const attn_problem *problem, attn_role role);

/* A copy of t whose strides are explicit: all-zero strides become the dense strides of the role's
 * shape. Implementations only ever see resolved tensors. */
attn_tensor attn_role_resolve(const attn_problem *problem, attn_role role, attn_tensor t);

/* Where batch entry b sits: the first row of its q and k in the tensors (nonzero only for packed
 * varlen), and its real lengths (Tq, Tk unless varlen; cache_seqlens[b] + seqlen_new for a paged
 * cache, whose keys are then addressed through attn_paged_offset, not k_row0). */
typedef struct attn_seq {
  int64_t q_row0, k_row0;
  int64_t len_q, len_k;
} attn_seq;

/* Geometry of batch entry b; inputs must be validated (cu_seqlens / seqlens readable). */
attn_seq attn_seq_of(const attn_problem *problem, const attn_inputs *inputs, int64_t b);

/* Paged caches (docs/DECODE.md): the columns of block_table and the pages of the pool, with the
 * defaults of a problem field left at 0 made explicit (the problem need not be resolved). */
int64_t attn_paged_max_pages(const attn_problem *problem);
int64_t attn_paged_num_pages(const attn_problem *problem);

/* Offset in elements of (key j, head, element 0) of sequence b in the paged pool t (k or v): row
 * j % page_size of page block_table[b, j / page_size]. inputs resolved and validated. */
static inline int64_t attn_paged_offset(const attn_problem *problem, const attn_inputs *inputs,
                                        const attn_tensor *t, int64_t b, int64_t j, int64_t head) {
  const attn_tensor *bt = &inputs->block_table;
  const int64_t page =
      ((const int32_t *)bt->data)[b * bt->stride[0] + (j / problem->page_size) * bt->stride[1]];
  return page * t->stride[0] + (j % problem->page_size) * t->stride[1] + head * t->stride[2];
}

/* Writes k_new and v_new into the pages of k and v at rows cache_seqlens[b] .. of each sequence
 * (host memory; CPU implementations call it first in their forward pass). A no-op without
 * seqlen_new. inputs resolved and validated. */
void attn_paged_append(const attn_problem *problem, const attn_inputs *inputs);

/* Descale factor of an f8e4m3 tensor (q_descale, k_descale or v_descale: t) for batch entry b and
 * KV head g, f32 in host memory; 1 without descale (docs/FP8.md). t resolved. */
static inline float attn_descale_of(const attn_problem *problem, const attn_tensor *t, int64_t b,
                                    int64_t g) {
  if (problem->descale == ATTN_DESCALE_NONE) return 1.0f;
  if (problem->descale == ATTN_DESCALE_TENSOR) return ((const float *)t->data)[0];
  return ((const float *)t->data)[b * t->stride[0] + g * t->stride[1]];
}

/* The alignment offset o of SPEC.md for a sequence: Tk - Tq (bottom-right) or 0 (top-left). */
static inline int64_t attn_align_offset(const attn_problem *problem, const attn_seq *seq) {
  return problem->align == ATTN_ALIGN_BOTTOM_RIGHT ? seq->len_k - seq->len_q : 0;
}

#endif /* ATTN_CORE_TENSORS_H */
