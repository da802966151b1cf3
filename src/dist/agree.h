/*
 * src/dist/agree.h - the agreement check's wire format: the record each rank contributes to plan
 * creation's allgather (attn_dist_plan_create), and the verdict every rank reaches from the table
 * of every rank's record.
 *
 * A record is plain bytes on the wire: int64 fields in the sender's byte order and a message. What
 * arrives from a peer is untrusted: another libattn build (other fields), another byte order, or a
 * corrupt transfer must give a clear failure on every rank, never a read past a record or a status
 * outside attn_status. The magic and the version catch the first two. Fuzzed by
 * tests/fuzz/fuzz_dist.c.
 */
#ifndef ATTN_DIST_AGREE_H
#define ATTN_DIST_AGREE_H

#include "attn.h"
#include "attn_dist.h"

#include <stdint.h>

/* "attnDIST" read as a little-endian int64; a peer of the other byte order sends it reversed. */
#define ATTN_DIST_RECORD_MAGIC 0x5453494464747461LL
/* Bumped whenever the record's fields change (agree.c's RECORD_FIELDS). */
#define ATTN_DIST_RECORD_VERSION 2
/* The problem and spec fields a record carries (agree.c checks the count). */
#define ATTN_DIST_RECORD_FIELDS 51
#define ATTN_DIST_RECORD_MESSAGE 512

typedef struct attn_dist_record {
  int64_t magic;   /* ATTN_DIST_RECORD_MAGIC */
  int64_t version; /* ATTN_DIST_RECORD_VERSION */
  int64_t status;  /* the rank's local verdict on its arguments (an attn_status) */
  int64_t value[ATTN_DIST_RECORD_FIELDS]; /* the problem and spec as given, doubles by their bits */
  char message[ATTN_DIST_RECORD_MESSAGE]; /* the local verdict's message; "" when OK */
} attn_dist_record;

/* This rank's record: its verdict (status, message: may be NULL) and the problem and spec as the
 * caller gave them (unvalidated: the fields are only compared). */
void attn_dist_record_fill(attn_dist_record *record, attn_status status, const char *message,
                           const attn_problem *problem, const attn_dist_spec *spec);

/* The name of value[index] ("problem.head_dim"); "" out of range. */
const char *attn_dist_record_field_name(int index);

/* The verdict on n gathered records (rank order), the same on every rank that holds the same table:
 * OK when every record is this build's, every rank accepted its arguments, and every field equals
 * rank 0's; else a failure status in ctx with a message naming the rank (a record of another build,
 * a refusal, with the rank's own message) or the field and the ranks that differ. Reads nothing
 * outside the n records, whatever their bytes. */
attn_status attn_dist_agree(attn_ctx *ctx, const attn_dist_record *all, int32_t n);

#endif /* ATTN_DIST_AGREE_H */
