/*
 * tests/fuzz/fuzz_problem.c - libFuzzer harness of the problem-string parser, plan creation and a
 * small run (issue 19).
 *
 * Each input is a problem string. The parser must never crash and must agree with the writer:
 * writing the parsed problem and parsing that again gives the same string. A parsed problem goes
 * to validation (attn_impl_supports) for ref and cpu; a valid CPU problem small enough to run in
 * a few milliseconds is run by each (forward, and backward for inputs of odd length) on random
 * data and compared with the f64 oracle under SPEC's tolerance with what the problem's values add
 * to it (tools/harness.c, as `attn check` does; docs/NUMERICS.md). A crash, a sanitizer report, a
 * leak, a round-trip mismatch or a wrong answer stops the fuzzer with the input saved
 * (crash-<hash>). ATTN_FUZZ_REPORT_ONLY=1 prints wrong answers and goes on (a long run that should
 * count crashes past a tolerance finding).
 *
 * Bounded in the test suite (CTest `fuzz_problem`), longer by hand: docs/TESTING.md "Fuzzing".
 */
#include "attn.h"
#include "harness.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TEXT 1024

static attn_ctx *ctx;
static int report_only; /* ATTN_FUZZ_REPORT_ONLY=1: a wrong answer is printed, not fatal */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) abort();
  /* No cache file and no timing: plans come from the explicit choice, runs stay deterministic. */
  attn_policy policy;
  attn_policy_init(&policy);
  policy.allow_autotune = 0, policy.persist = 0, policy.cache_path = "";
  if (attn_ctx_set_policy(ctx, &policy) != ATTN_STATUS_OK) abort();
  attn_ctx_set_num_threads(ctx, 1);
  const char *env = getenv("ATTN_FUZZ_REPORT_ONLY");
  report_only = env != NULL && strcmp(env, "1") == 0;
  return 0;
}

/* Whether a valid problem runs in a few milliseconds: every tensor and the score matrix small.
 * Every role's tensor counts too (attn_problem_numel), so that a paged problem's pool of pages
 * (num_pages x page_size rows, whatever seqlen_k) or a large bias is held to the same budget, and
 * so do the heads: the oracle keeps per-(batch, head) bookkeeping even for Tq = Tk = 0. */
static int small_enough(const attn_problem *p) {
  int64_t elements = 0;
  for (int r = 0; r < ATTN_ROLE_COUNT; ++r) {
    const int64_t n = attn_problem_numel(p, (attn_role)r);
    if (n < 0 || n > (1 << 17) || (elements += n) > (1 << 17)) return 0;
  }
  double B = (double)p->batch, Tq = (double)p->seqlen_q, Tk = (double)p->seqlen_k;
  double Hq = (double)p->heads_q, Hkv = (double)p->heads_kv, D = (double)p->head_dim;
  double Dv = p->head_dim_v > 0 ? (double)p->head_dim_v : D;
  if (p->varlen == ATTN_VARLEN_PACKED) {
    if ((double)p->total_q > 4096 || (double)p->total_k > 4096) return 0;
    Tq = Tq > (double)p->total_q ? Tq : (double)p->total_q;
    Tk = Tk > (double)p->total_k ? Tk : (double)p->total_k;
  }
  double W = D > Dv ? D : Dv;
  return p->device == ATTN_DEVICE_CPU && B * Hq <= 1 << 15 && B * Tq * Hq * W <= 1 << 14 &&
         B * Tk * Hkv * W <= 1 << 14 && B * Hq * Tq * Tk <= 1 << 15 && W <= 512 &&
         p->num_sinks <= 64;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size >= MAX_TEXT) return 0;
  char text[MAX_TEXT];
  memcpy(text, data, size);
  text[size] = '\0';
  attn_problem p;
  if (attn_problem_parse(ctx, text, &p) != ATTN_STATUS_OK) return 0;

  /* The writer and the parser agree: parse(write(p)) writes the same string. */
  char once[2 * MAX_TEXT], twice[2 * MAX_TEXT];
  size_t n = attn_problem_to_string(&p, once, sizeof once);
  if (n < sizeof once) {
    attn_problem again;
    if (attn_problem_parse(ctx, once, &again) != ATTN_STATUS_OK) {
      fprintf(stderr, "\"%s\" parses, but its canonical form \"%s\" does not: %s\n", text, once,
              attn_ctx_last_error(ctx));
      abort();
    }
    attn_problem_to_string(&again, twice, sizeof twice);
    if (strcmp(once, twice) != 0) {
      fprintf(stderr, "\"%s\": written \"%s\", parsed and written again \"%s\"\n", text, once,
              twice);
      abort();
    }
  }

  static const char *impls[] = {"ref", "cpu"};
  if (!small_enough(&p)) return 0;
  const int backward = (int)(size & 1);
  h_oracle *oracle = NULL; /* the f64 reference, every row, made once for both */
  for (int i = 0; i < 2; ++i) {
    if (attn_impl_supports(ctx, impls[i], &p) != ATTN_STATUS_OK) continue;
    if (oracle == NULL && h_oracle_make(ctx, &p, backward, 1, 0, &oracle) != ATTN_STATUS_OK) break;
    h_check check = h_check_run(ctx, oracle, impls[i], NULL);
    if (check.status == ATTN_STATUS_OK && !check.ok) {
      fprintf(stderr, "\"%s\" on %s%s: %s past the tolerance rule\n", once, impls[i],
              backward ? " (forward + backward)" : "", check.worst);
      if (!report_only) abort();
    }
  }
  h_oracle_free(oracle);
  return 0;
}
