/*
 * src/core/ctx.h - the context object and the one way the library reports errors and logs.
 *
 * Every fallible path ends in attn_fail(), which records the status and a message naming the
 * argument and the rule in the context, and forwards it to the log callback when one is installed.
 */
#ifndef ATTN_CORE_CTX_H
#define ATTN_CORE_CTX_H

#include "attn.h"

#include <stdarg.h>

#define ATTN_MESSAGE_SIZE 1024

struct attn_ctx {
  attn_status last_status;
  char last_error[ATTN_MESSAGE_SIZE];
  attn_log_fn log_fn;
  void *log_user;
  attn_log_level log_max;
  int32_t num_threads;
  struct attn_exec *exec; /* the executor's policy, event callback and caches (plan/exec.h); made
                             on first use, freed by attn_ctx_destroy through attn_ctx_exec_free */
};

/* Set by the plan layer: frees a context's executor state. */
void attn_ctx_exec_free(struct attn_exec *exec);

#if defined(__GNUC__)
#define ATTN_PRINTF(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define ATTN_PRINTF(fmt_index, first_arg)
#endif

/* Records status and message in ctx (which may be NULL) and returns status. */
attn_status attn_fail(attn_ctx *ctx, attn_status status, const char *fmt, ...) ATTN_PRINTF(3, 4);
/* Clears the last error and returns ATTN_STATUS_OK. */
attn_status attn_succeed(attn_ctx *ctx);
/* Sends a message to the log callback when one is installed for that level. */
void attn_log(attn_ctx *ctx, attn_log_level level, const char *fmt, ...) ATTN_PRINTF(3, 4);

/* snprintf that tolerates a NULL or zero-size buffer; for implementations' "why" messages. */
void attn_format(char *buf, size_t size, const char *fmt, ...) ATTN_PRINTF(3, 4);

#endif /* ATTN_CORE_CTX_H */
