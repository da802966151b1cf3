/*
 * src/plan/problem.c - the _init functions of the public plain-data structs, and the public query
 * of each tensor's shape (the tensor-role table of src/core/tensors.c on a validated problem).
 */
#include "attn.h"
#include "core/ctx.h"
#include "core/tensors.h"
#include "plan/validate.h"

#include <string.h>

void attn_problem_init(attn_problem *p) {
  if (p == NULL) return;
  memset(p, 0, sizeof *p);
  p->operation = ATTN_OPERATION_FLASH_ATTENTION;
  p->dtype = ATTN_DTYPE_F32;
  p->device = ATTN_DEVICE_CPU;
  p->align = ATTN_ALIGN_BOTTOM_RIGHT;
  p->window_left = -1;
  p->window_right = -1;
  p->bias_dtype = ATTN_DTYPE_F32;
  p->alibi = ATTN_ALIBI_NONE;
  p->varlen = ATTN_VARLEN_NONE;
  p->out_dtype = -1; /* the problem's dtype (bf16 for f8e4m3) */
  p->descale = ATTN_DESCALE_NONE;
}

attn_tensor attn_tensor_dense(void *data) {
  attn_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  return t;
}

void attn_inputs_init(attn_inputs *in) {
  if (in != NULL) memset(in, 0, sizeof *in);
}

void attn_outputs_init(attn_outputs *out) {
  if (out != NULL) memset(out, 0, sizeof *out);
}

void attn_grads_init(attn_grads *g) {
  if (g != NULL) memset(g, 0, sizeof *g);
}

void attn_select_init(attn_select *s) {
  if (s != NULL) memset(s, 0, sizeof *s);
}

attn_status attn_problem_tensor(attn_ctx *ctx, const attn_problem *problem, attn_role role,
                                int32_t *ndim, int64_t shape[ATTN_MAX_DIMS], int64_t *numel,
                                attn_dtype *dtype) {
  attn_problem p;
  attn_status status = attn_validate_problem(ctx, problem, &p);
  if (status != ATTN_STATUS_OK) return status;
  if ((unsigned)role >= ATTN_ROLE_COUNT)
    return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                     "role=%d is not an attn_role (0 to %d)", (int)role, ATTN_ROLE_COUNT - 1);
  int64_t dims[ATTN_MAX_DIMS] = {1, 1, 1, 1};
  int n = 0;
  if (attn_role_used(&p, role)) n = attn_role_shape(&p, role, dims);
  int64_t count = n == 0 ? 0 : 1;
  for (int d = 0; d < n; ++d) count *= dims[d];
  if (ndim != NULL) *ndim = n;
  if (shape != NULL)
    for (int d = 0; d < ATTN_MAX_DIMS; ++d) shape[d] = d < n ? dims[d] : 1;
  if (numel != NULL) *numel = count;
  if (dtype != NULL) *dtype = attn_role_dtype(&p, role);
  return attn_succeed(ctx);
}

int64_t attn_problem_numel(const attn_problem *problem, attn_role role) {
  int64_t numel = -1;
  if (attn_problem_tensor(NULL, problem, role, NULL, NULL, &numel, NULL) != ATTN_STATUS_OK)
    return -1;
  return numel;
}
