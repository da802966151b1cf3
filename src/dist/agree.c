/*
 * src/dist/agree.c - the agreement check's records and verdict (agree.h).
 *
 * Every rank compares the same gathered table the same way, in the same order (the records' format
 * first, then the ranks' own verdicts, then field by field), so every rank returns the same status
 * and message: no rank goes on to a collective its peers will not join.
 */
#include "dist/agree.h"

#include "core/ctx.h"

#include <stdio.h>
#include <string.h>

/* One rank's view, compared field by field across the ranks. Values are int64 (doubles by their
 * bits), so a field either matches exactly or names itself. */
/* clang-format off */
#define RECORD_FIELDS(X)                                                                           \
  X("problem.operation", p->operation)                                                             \
  X("problem.dtype", p->dtype)                                                                     \
  X("problem.device", p->device)                                                                   \
  X("problem.batch", p->batch)                                                                     \
  X("problem.seqlen_q", p->seqlen_q)                                                               \
  X("problem.seqlen_k", p->seqlen_k)                                                               \
  X("problem.heads_q", p->heads_q)                                                                 \
  X("problem.heads_kv", p->heads_kv)                                                               \
  X("problem.head_dim", p->head_dim)                                                               \
  X("problem.head_dim_v", p->head_dim_v)                                                           \
  X("problem.scale", bits(p->scale))                                                               \
  X("problem.causal", p->causal)                                                                   \
  X("problem.align", p->align)                                                                     \
  X("problem.window_left", p->window_left)                                                         \
  X("problem.window_right", p->window_right)                                                       \
  X("problem.softcap", bits(p->softcap))                                                           \
  X("problem.dropout_p", bits(p->dropout_p))                                                       \
  X("problem.has_bias", p->has_bias)                                                               \
  X("problem.bias_dtype", p->bias_dtype)                                                           \
  X("problem.bias_shape[0]", p->bias_shape[0])                                                     \
  X("problem.bias_shape[1]", p->bias_shape[1])                                                     \
  X("problem.bias_shape[2]", p->bias_shape[2])                                                     \
  X("problem.bias_shape[3]", p->bias_shape[3])                                                     \
  X("problem.has_mask", p->has_mask)                                                               \
  X("problem.mask_shape[0]", p->mask_shape[0])                                                     \
  X("problem.mask_shape[1]", p->mask_shape[1])                                                     \
  X("problem.mask_shape[2]", p->mask_shape[2])                                                     \
  X("problem.mask_shape[3]", p->mask_shape[3])                                                     \
  X("problem.alibi", p->alibi)                                                                     \
  X("problem.num_sinks", p->num_sinks)                                                             \
  X("problem.sinks_shared", p->sinks_shared)                                                       \
  X("problem.has_segment_ids", p->has_segment_ids)                                                 \
  X("problem.varlen", p->varlen)                                                                   \
  X("problem.total_q", p->total_q)                                                                 \
  X("problem.total_k", p->total_k)                                                                 \
  X("problem.page_size", p->page_size)                                                             \
  X("problem.num_pages", p->num_pages)                                                             \
  X("problem.max_pages_per_seq", p->max_pages_per_seq)                                             \
  X("problem.seqlen_new", p->seqlen_new)                                                           \
  X("spec.num_axes", s->num_axes)                                                                  \
  X("spec.axis_size[0]", s->axis_size[0])                                                          \
  X("spec.axis_size[1]", s->axis_size[1])                                                          \
  X("spec.axis_size[2]", s->axis_size[2])                                                          \
  X("spec.axis_size[3]", s->axis_size[3])                                                          \
  X("spec.axis_dim[0]", s->axis_dim[0])                                                            \
  X("spec.axis_dim[1]", s->axis_dim[1])                                                            \
  X("spec.axis_dim[2]", s->axis_dim[2])                                                            \
  X("spec.axis_dim[3]", s->axis_dim[3])                                                            \
  X("spec.strategy", s->strategy)                                                                  \
  X("spec.layout", s->layout)                                                                      \
  X("spec.timeout_seconds", bits(s->timeout_seconds))
/* clang-format on */

static int64_t bits(double d) {
  int64_t i;
  memcpy(&i, &d, sizeof i);
  return i;
}

#define RECORD_COUNT_ONE(name, value) +1
_Static_assert(0 RECORD_FIELDS(RECORD_COUNT_ONE) == ATTN_DIST_RECORD_FIELDS,
               "ATTN_DIST_RECORD_FIELDS must count RECORD_FIELDS (and the version must change)");

void attn_dist_record_fill(attn_dist_record *r, attn_status status, const char *message,
                           const attn_problem *p, const attn_dist_spec *s) {
  memset(r, 0, sizeof *r);
  r->magic = ATTN_DIST_RECORD_MAGIC;
  r->version = ATTN_DIST_RECORD_VERSION;
  r->status = status;
  snprintf(r->message, sizeof r->message, "%s", message != NULL ? message : "");
  int k = 0;
#define RECORD_FILL_ONE(name, v) r->value[k++] = (int64_t)(v);
  RECORD_FIELDS(RECORD_FILL_ONE)
#undef RECORD_FILL_ONE
}

const char *attn_dist_record_field_name(int index) {
  if (index < 0 || index >= ATTN_DIST_RECORD_FIELDS) return "";
  static const char *const names[] = {
#define RECORD_NAME_ONE(name, v) name,
      RECORD_FIELDS(RECORD_NAME_ONE)
#undef RECORD_NAME_ONE
  };
  return names[index];
}

/* Writes "1, 3" (the ranks whose value of field differs from rank 0's; at most a few) into buf. */
static void differing_ranks(const attn_dist_record *all, int32_t n, int field, char *buf,
                            size_t size) {
  size_t used = 0;
  int listed = 0;
  buf[0] = '\0';
  for (int32_t r = 1; r < n && used + 16 < size; ++r) {
    if (all[r].value[field] == all[0].value[field]) continue;
    if (listed == 8) {
      snprintf(buf + used, size - used, ", ...");
      break;
    }
    used += (size_t)snprintf(buf + used, size - used, "%s%d", listed ? ", " : "", (int)r);
    ++listed;
  }
}

/* A peer's message as text: at most the record's bytes (a peer's may lack its NUL), anything but
 * printable ASCII shown as '?'. */
static void peer_message(const attn_dist_record *r, char *text, size_t size) {
  size_t n = 0;
  for (; n + 1 < size && n < sizeof r->message && r->message[n] != '\0'; ++n) {
    const unsigned char c = (unsigned char)r->message[n];
    text[n] = c >= 0x20 && c < 0x7f ? (char)c : '?';
  }
  text[n] = '\0';
}

attn_status attn_dist_agree(attn_ctx *ctx, const attn_dist_record *all, int32_t n) {
  for (int32_t r = 0; r < n; ++r) {
    const attn_dist_record *a = &all[r];
    if (a->magic != ATTN_DIST_RECORD_MAGIC || a->version != ATTN_DIST_RECORD_VERSION)
      return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                       "rank %d's agreement record is not this libattn's (magic %#llx, version "
                       "%lld; here %#llx, version %d): every rank must run the same libattn "
                       "build on machines of the same byte order",
                       (int)r, (unsigned long long)a->magic, (long long)a->version,
                       (unsigned long long)ATTN_DIST_RECORD_MAGIC, ATTN_DIST_RECORD_VERSION);
    if (a->status < 0 || a->status >= ATTN_STATUS_COUNT)
      return attn_fail(ctx, ATTN_STATUS_IO_ERROR,
                       "rank %d's agreement record holds status %lld, which no rank sends: the "
                       "transfer was corrupted",
                       (int)r, (long long)a->status);
  }
  for (int32_t r = 0; r < n; ++r)
    if (all[r].status != ATTN_STATUS_OK) {
      char text[ATTN_DIST_RECORD_MESSAGE];
      peer_message(&all[r], text, sizeof text);
      return attn_fail(ctx, (attn_status)all[r].status, "rank %d refused the problem: %s", (int)r,
                       text[0] != '\0' ? text : "(no message)");
    }
  for (int f = 0; f < ATTN_DIST_RECORD_FIELDS; ++f) {
    char ranks[128];
    differing_ranks(all, n, f, ranks, sizeof ranks);
    if (ranks[0] != '\0')
      return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                       "%s differs between ranks: rank 0 has %lld, rank(s) %s another value; "
                       "every rank must describe the same global problem and spec",
                       attn_dist_record_field_name(f), (long long)all[0].value[f], ranks);
  }
  return ATTN_STATUS_OK;
}
