/*
 * tests/test_cache.c - the persistent configuration cache under stress: 8 processes tuning into
 * one file at once lose no entry; a process killed while writing leaves a readable file; corrupt,
 * truncated, foreign-version, unreadable and unwritable files are survived with a logged message
 * and the right status; import and export.
 *
 * Timings are injected (fake_impls.h), so every process "tunes" instantly and the test measures
 * the file handling alone.
 */
#define _DEFAULT_SOURCE
#include "fake_impls.h"
#include "testutil.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const fake_timing timings[] = {{"fake2/tile64", 20.0}, {NULL, 0}};

typedef struct logbook {
  int warnings, failures;
  int last_failure_status;
  char last[1024];
} logbook;

static void on_log(void *user, attn_log_level level, const char *message) {
  logbook *b = user;
  if (level == ATTN_LOG_LEVEL_WARNING) {
    b->warnings++;
    snprintf(b->last, sizeof b->last, "%s", message);
  }
}

static void on_event(void *user, const attn_event *ev) {
  logbook *b = user;
  if (ev->kind == ATTN_EVENT_KIND_FAILURE) {
    b->failures++;
    b->last_failure_status = ev->status;
  }
}

static char tmpdir[256];

static void tmp_path(char *buf, size_t size, const char *name) {
  snprintf(buf, size, "%s/%s", tmpdir, name);
}

static attn_ctx *make_ctx(const char *path, logbook *book) {
  attn_ctx *ctx;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) exit(2);
  attn_policy pol;
  attn_policy_init(&pol);
  pol.cache_path = path;
  pol.on_miss = ATTN_ON_MISS_AUTOTUNE;
  attn_ctx_set_policy(ctx, &pol);
  if (book != NULL) {
    memset(book, 0, sizeof *book);
    attn_ctx_set_log_callback(ctx, on_log, book, ATTN_LOG_LEVEL_WARNING);
    attn_ctx_set_event_callback(ctx, on_event, book);
  }
  return ctx;
}

static attn_problem problem_of(int64_t seqlen) {
  attn_problem p;
  attn_problem_init(&p);
  p.batch = 1, p.heads_q = 2, p.heads_kv = 2, p.seqlen_q = seqlen, p.seqlen_k = seqlen;
  p.head_dim = 8;
  return p;
}

static attn_status pick(attn_ctx *ctx, int64_t seqlen, char *buf, size_t size) {
  attn_problem p = problem_of(seqlen);
  attn_plan *plan = NULL;
  attn_status st = attn_plan_create(ctx, &p, NULL, &plan);
  snprintf(buf, size, "%s/%s", plan ? attn_plan_impl_name(plan) : "-",
           plan ? attn_plan_config_name(plan) : "-");
  attn_plan_destroy(plan);
  return st;
}

/* The file's bytes, NUL-terminated (tu_read_file does not terminate them). */
static char *read_text(const char *path, size_t *size) {
  char *raw = tu_read_file(path, size);
  if (raw == NULL) return NULL;
  char *text = malloc(*size + 1);
  memcpy(text, raw, *size);
  text[*size] = '\0';
  free(raw);
  return text;
}

static void write_text(const char *path, const char *text, size_t n) {
  FILE *f = fopen(path, "wb");
  if (f == NULL) exit(2);
  fwrite(text, 1, n, f);
  fclose(f);
}

/* Entries of a cache file, and whether it parsed without a message (-1: not a cache file). */
static int64_t count_entries(const char *path, int *clean) {
  logbook book;
  attn_ctx *ctx = make_ctx(path, &book);
  int64_t disk = -1;
  attn_cache_count(ctx, NULL, &disk);
  *clean = book.warnings == 0;
  attn_ctx_destroy(ctx);
  return disk;
}

/* ---- damaged files ---------------------------------------------------------------------------- */

static void test_damaged(void) {
  char path[1024], pk[256];
  size_t size;

  /* Corrupt: binary garbage. */
  tmp_path(path, sizeof path, "corrupt.txt");
  static const char garbage[] = "\x7f"
                                "ELF\x02\x01\x01\0\0\0garbage\n\xff\xfe";
  write_text(path, garbage, sizeof garbage - 1);
  logbook book;
  attn_ctx *ctx = make_ctx(path, &book);
  attn_status st = pick(ctx, 16, pk, sizeof pk);
  tu_check(st == ATTN_STATUS_OK && strcmp(pk, "fake2/tile64") == 0,
           "a corrupt cache file: the plan is still made (tuned: %s)", pk);
  tu_check(book.warnings >= 2 && book.failures >= 2 && strstr(book.last, "not overwriting") != NULL,
           "... with a logged warning and FAILURE events, and it is not overwritten: \"%s\"",
           book.last);
  char *text = read_text(path, &size);
  tu_check(text != NULL && size == sizeof garbage - 1 && memcmp(text, garbage, size) == 0,
           "the corrupt file is left as it was (it may not be ours)");
  free(text);
  st = attn_cache_import(ctx, path);
  tu_check(st == ATTN_STATUS_INVALID_ARGUMENT &&
               strstr(attn_ctx_last_error(ctx), "corrupt") != NULL,
           "importing a corrupt file is INVALID_ARGUMENT: \"%s\"", attn_ctx_last_error(ctx));
  attn_ctx_destroy(ctx);

  /* Foreign format version. */
  tmp_path(path, sizeof path, "foreign.txt");
  static const char foreign[] = "libattn-cache 99\nsomething\tfrom\tthe\tfuture\n";
  write_text(path, foreign, sizeof foreign - 1);
  ctx = make_ctx(path, &book);
  st = pick(ctx, 16, pk, sizeof pk);
  tu_check(st == ATTN_STATUS_OK && strstr(book.last, "not overwriting") != NULL &&
               book.warnings >= 2,
           "a foreign-version file is ignored and kept: \"%s\"", book.last);
  text = read_text(path, &size);
  tu_check(text != NULL && strcmp(text, foreign) == 0, "the foreign-version file is unchanged");
  free(text);
  attn_ctx_destroy(ctx);

  /* Truncated: a good file cut in its last line. */
  tmp_path(path, sizeof path, "truncated.txt");
  unlink(path);
  ctx = make_ctx(path, NULL);
  pick(ctx, 16, pk, sizeof pk);
  pick(ctx, 32, pk, sizeof pk);
  attn_ctx_destroy(ctx);
  text = read_text(path, &size);
  tu_check(text != NULL && size > 10, "two entries written (%zu bytes)", size);
  write_text(path, text, size - 7); /* the second entry loses its end */
  free(text);
  ctx = make_ctx(path, &book);
  attn_policy pol;
  attn_ctx_get_policy(ctx, &pol);
  pol.on_miss = ATTN_ON_MISS_HEURISTICS;
  attn_ctx_set_policy(ctx, &pol);
  int64_t disk = 0;
  attn_cache_count(ctx, NULL, &disk);
  tu_check(disk == 1 && book.warnings == 1 && strstr(book.last, "truncated") != NULL,
           "a truncated file keeps its complete entries (%lld) and logs: \"%s\"", (long long)disk,
           book.last);
  st = pick(ctx, 16, pk, sizeof pk);
  tu_check(st == ATTN_STATUS_OK && strcmp(pk, "fake2/tile64") == 0,
           "the complete entry of a truncated file still answers: %s", pk);
  pol.on_miss = ATTN_ON_MISS_AUTOTUNE;
  attn_ctx_set_policy(ctx, &pol);
  pick(ctx, 48, pk, sizeof pk); /* a write drops the torn line */
  attn_ctx_destroy(ctx);
  int clean = 0;
  disk = count_entries(path, &clean);
  tu_check(disk == 2 && clean, "the next write drops the torn line and keeps the rest (%lld, %s)",
           (long long)disk, clean ? "clean" : "still damaged");

  /* Empty file: an empty cache. */
  tmp_path(path, sizeof path, "empty.txt");
  write_text(path, "", 0);
  ctx = make_ctx(path, &book);
  st = pick(ctx, 16, pk, sizeof pk);
  attn_ctx_destroy(ctx);
  disk = count_entries(path, &clean);
  tu_check(st == ATTN_STATUS_OK && book.warnings == 0 && disk == 1 && clean,
           "an empty file is an empty cache and is written (%lld entries)", (long long)disk);

  /* Unreadable: the path is a folder. */
  tmp_path(path, sizeof path, "folder.txt");
  mkdir(path, 0755);
  ctx = make_ctx(path, &book);
  st = pick(ctx, 16, pk, sizeof pk);
  tu_check(st == ATTN_STATUS_OK && book.warnings >= 1 && book.failures >= 1,
           "a cache path that is a folder: plan made, logged: \"%s\"", book.last);
  attn_ctx_destroy(ctx);

  /* Unwritable: the folder cannot exist (its parent is a file), so even root cannot write. */
  char blocker[512];
  tmp_path(blocker, sizeof blocker, "plainfile");
  write_text(blocker, "x", 1);
  snprintf(path, sizeof path, "%s/sub/cache.txt", blocker);
  ctx = make_ctx(path, &book);
  st = pick(ctx, 16, pk, sizeof pk);
  tu_check(
      st == ATTN_STATUS_OK && strcmp(pk, "fake2/tile64") == 0 && book.failures == 1 &&
          book.last_failure_status == ATTN_STATUS_IO_ERROR && strstr(book.last, "memory only"),
      "an unwritable cache: the tuned plan is made, an IO_ERROR FAILURE event and a log: \"%s\"",
      book.last);
  int64_t mem = 0;
  attn_cache_count(ctx, &mem, NULL);
  tu_check(mem == 1, "... and the result is kept in memory (%lld)", (long long)mem);
  st = attn_cache_export(ctx, path);
  tu_check(st == ATTN_STATUS_IO_ERROR && strstr(attn_ctx_last_error(ctx), "sub/cache.txt") != NULL,
           "exporting to an unwritable path is IO_ERROR naming it: \"%s\"",
           attn_ctx_last_error(ctx));
  st = attn_cache_import(ctx, path);
  tu_check(st == ATTN_STATUS_IO_ERROR, "importing a missing file is IO_ERROR: \"%s\"",
           attn_ctx_last_error(ctx));
  attn_ctx_destroy(ctx);
}

static void test_import_export(void) {
  char a[512], b[512], pk[256];
  tmp_path(a, sizeof a, "export_src.txt");
  tmp_path(b, sizeof b, "export_dst.txt");
  attn_ctx *ctx = make_ctx(a, NULL);
  pick(ctx, 16, pk, sizeof pk);
  pick(ctx, 32, pk, sizeof pk);
  attn_status st = attn_cache_export(ctx, b);
  attn_ctx_destroy(ctx);
  int clean;
  int64_t n = count_entries(b, &clean);
  tu_check(st == ATTN_STATUS_OK && n == 2 && clean, "export writes the context's entries (%lld)",
           (long long)n);
  /* A context with no cache file imports them and hits in memory. */
  logbook book;
  ctx = make_ctx("", &book);
  attn_policy pol;
  attn_ctx_get_policy(ctx, &pol);
  pol.on_miss = ATTN_ON_MISS_HEURISTICS;
  attn_ctx_set_policy(ctx, &pol);
  st = attn_cache_import(ctx, b);
  int64_t mem = 0;
  attn_cache_count(ctx, &mem, NULL);
  pick(ctx, 32, pk, sizeof pk);
  tu_check(st == ATTN_STATUS_OK && mem == 2 && strcmp(pk, "fake2/tile64") == 0,
           "import fills the memory cache, which answers (%lld entries, %s)", (long long)mem, pk);
  attn_ctx_destroy(ctx);
}

/* ---- concurrency ------------------------------------------------------------------------------ */

#define WRITERS 8
#define PROBLEMS_EACH 6

static void test_concurrent_writers(void) {
  char path[512];
  tmp_path(path, sizeof path, "shared.txt");
  int go[2];
  if (pipe(go) != 0) exit(2);
  pid_t kids[WRITERS];
  for (int w = 0; w < WRITERS; ++w) {
    kids[w] = fork();
    if (kids[w] == 0) {
      close(go[1]);
      char c;
      if (read(go[0], &c, 1) < 0) _exit(3); /* start together */
      attn_ctx *ctx = make_ctx(path, NULL);
      int bad = 0;
      for (int i = 0; i < PROBLEMS_EACH; ++i) {
        char pk[256];
        if (pick(ctx, 1000 + w * 100 + i, pk, sizeof pk) != ATTN_STATUS_OK) bad = 1;
      }
      attn_ctx_destroy(ctx);
      _exit(bad);
    }
  }
  close(go[0]);
  close(go[1]); /* EOF releases every child at once */
  int failed = 0;
  for (int w = 0; w < WRITERS; ++w) {
    int status;
    waitpid(kids[w], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed++;
  }
  int clean;
  int64_t n = count_entries(path, &clean);
  tu_check(failed == 0 && n == WRITERS * PROBLEMS_EACH && clean,
           "%d processes tuning %d problems each into one file at once: %lld entries of %d, %s",
           WRITERS, PROBLEMS_EACH, (long long)n, WRITERS * PROBLEMS_EACH,
           clean ? "no damaged line" : "DAMAGED");
  /* Every problem answers from the file in a fresh context. */
  logbook book;
  attn_ctx *ctx = make_ctx(path, &book);
  attn_policy pol;
  attn_ctx_get_policy(ctx, &pol);
  pol.on_miss = ATTN_ON_MISS_HEURISTICS;
  attn_ctx_set_policy(ctx, &pol);
  int hits = 0;
  for (int w = 0; w < WRITERS; ++w)
    for (int i = 0; i < PROBLEMS_EACH; ++i) {
      char pk[256];
      pick(ctx, 1000 + w * 100 + i, pk, sizeof pk);
      hits += strcmp(pk, "fake2/tile64") == 0;
    }
  tu_check(hits == WRITERS * PROBLEMS_EACH, "each of them is found in the file (%d)", hits);
  attn_ctx_destroy(ctx);
}

/* ---- killed writers ------------------------------------------------------------------------- */

static int hook_fd = -1;

static void pause_hook(const char *stage) {
  if (strcmp(stage, "tmp-written") != 0) return;
  char c = 'p';
  if (write(hook_fd, &c, 1) < 0) _exit(4);
  for (;;) pause(); /* the parent kills us here, between writing the temporary file and renaming */
}

static void test_killed_writer(void) {
  char path[512];
  tmp_path(path, sizeof path, "killed.txt");
  attn_ctx *ctx = make_ctx(path, NULL);
  char pk[256];
  pick(ctx, 16, pk, sizeof pk); /* one entry before */
  attn_ctx_destroy(ctx);
  size_t before_size;
  char *before = read_text(path, &before_size);

  int ready[2];
  if (pipe(ready) != 0) exit(2);
  pid_t kid = fork();
  if (kid == 0) {
    close(ready[0]);
    hook_fd = ready[1];
    attn_cache_set_write_hook_for_testing(pause_hook);
    attn_ctx *c = make_ctx(path, NULL);
    pick(c, 32, pk, sizeof pk);
    _exit(5); /* not reached */
  }
  close(ready[1]);
  char c;
  ssize_t got = read(ready[0], &c, 1);
  close(ready[0]);
  kill(kid, SIGKILL);
  int status;
  waitpid(kid, &status, 0);
  tu_check(got == 1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
           "a writer is killed after writing its temporary file, before the rename");
  size_t after_size;
  char *after = read_text(path, &after_size);
  tu_check(after != NULL && after_size == before_size && memcmp(before, after, after_size) == 0,
           "the cache file is exactly the one before the killed write");
  free(before);
  free(after);
  /* The lock died with the process: the next writer proceeds and merges. */
  ctx = make_ctx(path, NULL);
  pick(ctx, 32, pk, sizeof pk);
  attn_ctx_destroy(ctx);
  int clean;
  int64_t n = count_entries(path, &clean);
  tu_check(n == 2 && clean, "the next writer takes the lock and writes (%lld entries)",
           (long long)n);

  /* Kill writers at arbitrary moments: the file always parses cleanly. */
  uint64_t seed = tu_seed("test_cache kill loop");
  tu_rng rng = tu_rng_make(seed);
  int damaged = 0, rounds = 12;
  int64_t last = n;
  for (int round = 0; round < rounds; ++round) {
    pid_t k = fork();
    if (k == 0) {
      attn_ctx *cc = make_ctx(path, NULL);
      for (int i = 0;; ++i) pick(cc, 5000 + round * 1000 + i, pk, sizeof pk);
    }
    usleep((useconds_t)tu_int(&rng, 200, 5000));
    kill(k, SIGKILL);
    waitpid(k, &status, 0);
    int64_t now = count_entries(path, &clean);
    if (!clean || now < last) damaged++;
    last = now;
  }
  tu_check(damaged == 0,
           "%d writers killed at random moments: the file parses cleanly and never "
           "loses entries (%lld entries at the end)",
           rounds, (long long)last);
}

int main(void) {
  tu_seed("test_cache");
  snprintf(tmpdir, sizeof tmpdir, "/tmp/attn_test_cache_XXXXXX");
  if (mkdtemp(tmpdir) == NULL) return 2;
  unsetenv("ATTN_AUTOTUNE");
  fake_install();
  fake_inject(timings);
  test_damaged();
  test_import_export();
  test_concurrent_writers();
  test_killed_writer();
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) printf("could not remove %s\n", tmpdir);
  return tu_finish();
}
