/* examples/hello.c - causal grouped-query attention on the CPU; the README's example. */
#include <attn.h>
#include <stdio.h>

enum { B = 1, T = 4, HQ = 4, HKV = 2, D = 8 };
static float q[B * T * HQ * D], k[B * T * HKV * D], v[B * T * HKV * D]; /* [B, T, H, D] */
static float out[B * T * HQ * D], lse[B * HQ * T];                      /* lse: [B, HQ, T] */

int main(void) {
  for (int i = 0; i < B * T * HQ * D; ++i) q[i] = (float)(i % 7) / 7.0f;
  for (int i = 0; i < B * T * HKV * D; ++i) k[i] = (float)(i % 5) / 5.0f, v[i] = (float)(i % 3 + 1);
  attn_ctx *ctx;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) return 1;
  attn_problem p;
  attn_problem_init(&p); /* f32 on the CPU, scale 1/sqrt(D), no mask */
  p.batch = B, p.seqlen_q = T, p.seqlen_k = T, p.heads_q = HQ, p.heads_kv = HKV, p.head_dim = D;
  p.causal = 1; /* and 4 query heads share 2 key/value heads (GQA) */
  attn_inputs in;
  attn_inputs_init(&in);
  in.q = attn_tensor_dense(q), in.k = attn_tensor_dense(k), in.v = attn_tensor_dense(v);
  attn_outputs o;
  attn_outputs_init(&o);
  o.out = attn_tensor_dense(out), o.lse = attn_tensor_dense(lse);
  attn_status status = attn_forward(ctx, &p, &in, &o);
  if (status == ATTN_STATUS_OK)
    printf("out[0] = %.6f, lse[0] = %.6f\n", out[0], lse[0]);
  else
    printf("attn_forward: %s: %s\n", attn_status_string(status), attn_ctx_last_error(ctx));
  attn_ctx_destroy(ctx);
  return status == ATTN_STATUS_OK ? 0 : 1;
}
