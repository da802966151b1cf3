/*
 * tests/fuzz/fuzz_dist.c - libFuzzer harness of the distributed layer's wire format: the agreement
 * records every rank sends in attn_dist_plan_create's allgather, and the verdict each rank reaches
 * from the gathered table (src/dist/agree.h; issue 19).
 *
 * Each input describes a table of n records as they could arrive from n ranks: a problem string
 * (parsed as `attn` does; paged problems too) and a spec fill this rank's record, every rank starts
 * as a copy of it, then the rest of the input patches bytes of any record (another build's magic or
 * version, a refusal whose message has no NUL, a field that differs, a status no rank sends). The
 * verdict must never read outside the table (ASan), must be OK exactly when every record is this
 * build's, every status is OK and every field equals rank 0's, and otherwise must name what an
 * independent reading of the table finds first (the rank of a foreign or corrupt record, the rank
 * that refused with its status, or the first field that differs), with a status of attn_status
 * and a message of printable text. A second verdict on a copy must be the same (no state, no read
 * of anything but the table). Any violation aborts with the input saved.
 *
 * Bounded in the test suite (CTest `fuzz_dist`), longer by hand: docs/TESTING.md "Fuzzing".
 */
#include "attn.h"
#include "attn_dist.h"
#include "dist/agree.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RANKS 8
#define MAX_TEXT 256

static attn_ctx *ctx;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) abort();
  return 0;
}

/* The input, read from the front; past its end every byte is 0. */
typedef struct reader {
  const uint8_t *data;
  size_t size, at;
} reader;

static uint8_t next(reader *r) { return r->at < r->size ? r->data[r->at++] : 0; }

/* The spec from 10 bytes, any values (the record carries them unvalidated). */
static attn_dist_spec read_spec(reader *in) {
  attn_dist_spec s;
  attn_dist_spec_init(&s);
  s.num_axes = 1 + next(in) % ATTN_DIST_MAX_AXES;
  for (int a = 0; a < ATTN_DIST_MAX_AXES; ++a) {
    const uint8_t b = next(in);
    s.axis_size[a] = b % 16, s.axis_dim[a] = (b >> 4) % (ATTN_DIST_DIM_COUNT + 1);
  }
  s.strategy = next(in) % (ATTN_DIST_STRATEGY_COUNT + 1);
  s.layout = next(in) % (ATTN_DIST_LAYOUT_COUNT + 1);
  s.timeout_seconds = (double)next(in) - 8.0;
  return s;
}

/* What a reading of the table finds first, in the verdict's order; OK when nothing. */
typedef struct expected {
  attn_status status;
  char prefix[160]; /* the message starts with it */
} expected;

static expected expect(const attn_dist_record *all, int32_t n) {
  expected e = {ATTN_STATUS_OK, ""};
  for (int32_t r = 0; r < n; ++r) {
    const attn_dist_record *a = &all[r];
    if (a->magic != ATTN_DIST_RECORD_MAGIC || a->version != ATTN_DIST_RECORD_VERSION) {
      e.status = ATTN_STATUS_INVALID_ARGUMENT;
      snprintf(e.prefix, sizeof e.prefix, "rank %d's agreement record is not", (int)r);
      return e;
    }
    if (a->status < ATTN_STATUS_OK || a->status >= ATTN_STATUS_COUNT) {
      e.status = ATTN_STATUS_IO_ERROR;
      snprintf(e.prefix, sizeof e.prefix, "rank %d's agreement record holds status", (int)r);
      return e;
    }
  }
  for (int32_t r = 0; r < n; ++r)
    if (all[r].status != ATTN_STATUS_OK) {
      e.status = (attn_status)all[r].status;
      snprintf(e.prefix, sizeof e.prefix, "rank %d refused the problem: ", (int)r);
      return e;
    }
  /* The first field that differs, named */
  for (int f = 0; f < ATTN_DIST_RECORD_FIELDS; ++f)
    for (int32_t r = 1; r < n; ++r)
      if (all[r].value[f] != all[0].value[f]) {
        e.status = ATTN_STATUS_INVALID_ARGUMENT;
        snprintf(e.prefix, sizeof e.prefix, "%s differs between ranks: rank 0 has %lld, rank(s) %d",
                 attn_dist_record_field_name(f), (long long)all[0].value[f], (int)r);
        return e;
      }
  return e;
}

static void fail(const char *what, attn_status got, const char *message, const expected *e) {
  fprintf(stderr, "fuzz_dist: %s: got status %d \"%s\", expected status %d \"%s...\"\n", what,
          (int)got, message, (int)e->status, e->prefix);
  abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  reader in = {data, size, 0};
  const int32_t n = 1 + next(&in) % MAX_RANKS;
  char text[MAX_TEXT];
  size_t len = 0;
  while (in.at < in.size && in.data[in.at] != '\n' && len + 1 < sizeof text)
    text[len++] = (char)in.data[in.at++];
  text[len] = '\0';
  (void)next(&in); /* the newline */
  attn_problem p;
  if (attn_problem_parse(ctx, text, &p) != ATTN_STATUS_OK) attn_problem_init(&p);
  const attn_dist_spec spec = read_spec(&in);
  const attn_status local = (attn_status)(next(&in) % ATTN_STATUS_COUNT);

  /* Exactly n records, so that ASan sees any read past the last one. */
  attn_dist_record *all = malloc((size_t)n * sizeof *all);
  if (all == NULL) abort();
  attn_dist_record_fill(&all[0], local, local == ATTN_STATUS_OK ? "" : "the local check's reason",
                        &p, &spec);
  for (int32_t r = 1; r < n; ++r) all[r] = all[0];
  if (local != ATTN_STATUS_OK) all[0].status = ATTN_STATUS_OK; /* rank 0 accepts, the others not */
  /* Patches: rank, offset (2 bytes), length, bytes. */
  while (in.at + 4 <= in.size) {
    const int32_t r = next(&in) % n;
    size_t offset = (size_t)next(&in);
    offset = (offset | (size_t)next(&in) << 8) % sizeof *all;
    size_t count = next(&in) % 64;
    if (count > sizeof *all - offset) count = sizeof *all - offset;
    for (size_t b = 0; b < count; ++b) ((uint8_t *)&all[r])[offset + b] = next(&in);
  }

  const expected e = expect(all, n);
  attn_status got = attn_dist_agree(ctx, all, n);
  char message[1024];
  snprintf(message, sizeof message, "%s", got == ATTN_STATUS_OK ? "" : attn_ctx_last_error(ctx));
  if (got != e.status) fail("the verdict's status", got, message, &e);
  if (got != ATTN_STATUS_OK) {
    if (message[0] == '\0') fail("an empty message", got, message, &e);
    for (const char *c = message; *c != '\0'; ++c)
      if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e)
        fail("a message that is not printable text", got, message, &e);
    if (strncmp(message, e.prefix, strlen(e.prefix)) != 0) fail("the message", got, message, &e);
  }
  /* The same verdict from a copy: nothing but the table decides it. */
  attn_dist_record *copy = malloc((size_t)n * sizeof *copy);
  if (copy == NULL) abort();
  memcpy(copy, all, (size_t)n * sizeof *copy);
  free(all);
  attn_status again = attn_dist_agree(ctx, copy, n);
  if (again != got || (got != ATTN_STATUS_OK && strcmp(attn_ctx_last_error(ctx), message) != 0))
    fail("a second verdict on a copy of the table", again, attn_ctx_last_error(ctx), &e);
  free(copy);
  return 0;
}
