/*
 * src/plan/problem.c - the _init functions of the public plain-data structs.
 */
#include "attn.h"

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
