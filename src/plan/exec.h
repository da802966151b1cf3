/*
 * src/plan/exec.h - the executor inside the library: the selection chain of attn_plan_create
 * (explicit choice -> memory cache -> cache file -> autotune -> heuristics), its per-context state,
 * and the hooks tests use to drive it deterministically.
 *
 * Files: select.c (the chain, policy, events), cache.c (cache tables and the file), tune.c
 * (scratch data and timing), problem_string.c (the canonical problem string).
 */
#ifndef ATTN_PLAN_EXEC_H
#define ATTN_PLAN_EXEC_H

#include "attn.h"
#include "impl/impl.h"

#include <stddef.h>
#include <stdint.h>

#define ATTN_KEY_SIZE 2048
#define ATTN_NAME_SIZE 128

/* ---- the cache's tables (cache.c) ------------------------------------------------------------ */

/* One measured result: for the problem and conditions in key, impl/config won at time_us. */
typedef struct attn_cache_entry {
  char *key; /* "fingerprint\tcandidates\tpass\tthreads\tproblem" (see select.c make_key) */
  char impl[ATTN_NAME_SIZE];
  int32_t impl_version;
  char config[ATTN_NAME_SIZE];
  double time_us;
} attn_cache_entry;

typedef struct attn_cache_table {
  attn_cache_entry *items;
  int64_t count, capacity;
} attn_cache_table;

const attn_cache_entry *attn_cache_table_find(const attn_cache_table *t, const char *key);
/* Inserts or replaces the entry of that key (copied). 0 on allocation failure. */
int attn_cache_table_put(attn_cache_table *t, const attn_cache_entry *e);
void attn_cache_table_free(attn_cache_table *t);

/* The cache file as last read, and when (its identity changes whenever a writer renames a new one
 * over it, so a changed file is re-read). */
typedef struct attn_cache_file {
  char *path; /* NULL: not read yet */
  int exists;
  int64_t mtime_ns, size, inode, dev;
  attn_cache_table table;
} attn_cache_file;

/* Re-reads path into f when it changed since the last read (or f was for another path). Problems
 * are logged on ctx and reported as FAILURE events; the status is OK for an absent file, IO_ERROR
 * when unreadable, INVALID_ARGUMENT when not a cache file of this format (f then holds nothing). */
attn_status attn_cache_file_refresh(attn_ctx *ctx, attn_cache_file *f, const char *path);
void attn_cache_file_free(attn_cache_file *f);
/* Reads the entries of the file at path into t (merging). Statuses as attn_cache_file_refresh;
 * an absent file gives IO_ERROR when must_exist. */
attn_status attn_cache_read(attn_ctx *ctx, const char *path, int must_exist, attn_cache_table *t);
/* Merges t into the file at path under its lock, atomically. OK, or IO_ERROR / INVALID_ARGUMENT
 * (the file is not ours) with the reason logged and in ctx's last error. */
attn_status attn_cache_write(attn_ctx *ctx, const char *path, const attn_cache_table *t);

/* Test hook: called with "tmp-written" after the temporary file is complete and synced and before
 * it is renamed over the cache file (a test SIGKILLs the process there). NULL = none. */
void attn_cache_set_write_hook_for_testing(void (*hook)(const char *stage));

/* ---- the executor's per-context state (select.c) ---------------------------------------------- */

typedef struct attn_exec {
  attn_policy policy;
  /* policy.cache_path's copy. A fixed buffer, so the pointer attn_ctx_get_policy hands out stays
   * valid when that policy is modified and set again (get -> change -> set is the natural use). */
  char cache_path[4096];
  attn_event_fn event_fn;
  void *event_user;
  attn_cache_table memory;
  attn_cache_file disk;
  char last_failure[1024]; /* the message of the last attn_exec_report_failure */
} attn_exec;

/* Logs message at WARNING and reports it as a FAILURE event (a problem that was survived). */
void attn_exec_report_failure(attn_ctx *ctx, attn_status status, const char *message);

/* The context's executor state, made on first use; NULL only when out of memory. */
attn_exec *attn_exec_get(attn_ctx *ctx);
void attn_exec_destroy(attn_exec *exec);

/* The chain: chooses impl and config for a validated, resolved problem. */
attn_status attn_exec_select(attn_ctx *ctx, const attn_problem *resolved, const attn_select *select,
                             const attn_impl **impl /* out */, int32_t *config /* out */);

/* The cache file the context's policy resolves to, into buf; "" when none. */
void attn_exec_cache_path(attn_ctx *ctx, char *buf, size_t size);

/* Platform of an implementation: its name's prefix (cudnn, cuda, cpu, ref), else its device. */
attn_platform attn_impl_platform_of(const attn_impl *impl);

/* Canonical string of a resolved problem for keys: equal computations give equal strings. */
void attn_problem_key(const attn_problem *resolved, char *buf, size_t size);

/* ---- timing (tune.c) -------------------------------------------------------------------------- */

/* Scratch inputs and outputs of a problem's shape, allocated and filled by the tuner. */
typedef struct attn_scratch attn_scratch;
attn_status attn_scratch_create(const attn_problem *resolved, int backward, attn_scratch **s,
                                char *why, size_t why_size);
void attn_scratch_destroy(attn_scratch *s);

/* Median microseconds per run (forward, or forward + backward) of impl/config on the scratch data,
 * measured under the policy. cutoff_us > 0: a run slower than that ends the warm-up or the
 * measuring at once (the executor passes 5x the best median so far: such a candidate cannot win,
 * and the reference need not be run 100 times). A failure returns its status with the reason in
 * why. */
attn_status attn_tune_measure(attn_ctx *ctx, const attn_problem *resolved, const attn_impl *impl,
                              int32_t config, const attn_policy *policy, attn_scratch *scratch,
                              double cutoff_us, double *median_us, int32_t *runs, char *why,
                              size_t why_size);

/* Test hook: when set, the tuner asks fn for each candidate's time instead of running it (a
 * negative time makes the candidate fail). NULL restores measuring. */
typedef double (*attn_tune_timer_fn)(void *user, const char *impl, const char *config,
                                     const char *problem);
void attn_tune_set_timer_for_testing(attn_tune_timer_fn fn, void *user);
/* Whether a timer hook is set, and (when impl is not NULL) its answer for the candidate. */
int attn_tune_injected(const char *impl, const char *config, const char *problem, double *us);

/* ---- plans made for an exact choice (plan.c) -------------------------------------------------- */

/* A plan for a resolved problem with impl and config already chosen; used by the tuner. */
attn_status attn_plan_create_exact(attn_ctx *ctx, const attn_problem *resolved,
                                   const attn_impl *impl, int32_t config, attn_plan **plan);

#endif /* ATTN_PLAN_EXEC_H */
