/*
 * tests/fuzz/fuzz_cache.c - libFuzzer harness of the cache-file importer (src/plan/cache.c) through
 * the public calls (issue 19).
 *
 * Each input is written as a cache file and imported into a fresh context (attn_cache_import):
 * it must never crash, leak or read outside the file, whatever the bytes (NUL bytes, torn lines,
 * other format versions, fields of any length). When the import keeps entries, exporting them
 * (attn_cache_export: lock, merge, atomic replace) and importing the export into another context
 * must give back the same number of entries, so what the importer accepts the writer can write.
 *
 * Bounded in the test suite (CTest `fuzz_cache`), longer by hand: docs/TESTING.md "Fuzzing".
 */
#define _POSIX_C_SOURCE 200809L
#include "attn.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64], input_path[96], export_path[96];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void cleanup(void) {
  char path[128];
  unlink(input_path), unlink(export_path);
  snprintf(path, sizeof path, "%s.lock", export_path), unlink(path);
  snprintf(path, sizeof path, "%s.tmp", export_path), unlink(path);
  rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/attn-fuzz-XXXXXX", tmp != NULL && strlen(tmp) < 40 ? tmp : "/tmp");
  if (mkdtemp(dir) == NULL) abort();
  snprintf(input_path, sizeof input_path, "%s/input.txt", dir);
  snprintf(export_path, sizeof export_path, "%s/export.txt", dir);
  atexit(cleanup);
  return 0;
}

/* A context with no cache file of its own and no timing. */
static attn_ctx *new_ctx(void) {
  attn_ctx *ctx;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) abort();
  attn_policy policy;
  attn_policy_init(&policy);
  policy.allow_autotune = 0, policy.cache_path = "";
  if (attn_ctx_set_policy(ctx, &policy) != ATTN_STATUS_OK) abort();
  return ctx;
}

static void write_file(const char *path, const uint8_t *data, size_t size) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) abort();
  size_t done = 0;
  while (done < size) {
    ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) abort();
    done += (size_t)n;
  }
  close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  write_file(input_path, data, size);
  attn_ctx *ctx = new_ctx();
  attn_status st = attn_cache_import(ctx, input_path);
  int64_t entries = 0;
  if (attn_cache_count(ctx, &entries, NULL) != ATTN_STATUS_OK) abort();
  if (st != ATTN_STATUS_OK && entries != 0) {
    fprintf(stderr, "a refused import (%s) kept %lld entries\n", attn_ctx_last_error(ctx),
            (long long)entries);
    abort();
  }
  if (entries > 0) {
    unlink(export_path);
    if (attn_cache_export(ctx, export_path) != ATTN_STATUS_OK) {
      fprintf(stderr, "%lld imported entries cannot be exported: %s\n", (long long)entries,
              attn_ctx_last_error(ctx));
      abort();
    }
    attn_ctx *again = new_ctx();
    int64_t reread = 0;
    if (attn_cache_import(again, export_path) != ATTN_STATUS_OK ||
        attn_cache_count(again, &reread, NULL) != ATTN_STATUS_OK || reread != entries) {
      fprintf(stderr, "%lld entries exported, %lld imported back: %s\n", (long long)entries,
              (long long)reread, attn_ctx_last_error(again));
      abort();
    }
    attn_ctx_destroy(again);
  }
  attn_ctx_destroy(ctx);
  return 0;
}
