/*
 * src/core/ctx.c - contexts, the status table's strings, the version, logging and error recording.
 */
#include "core/ctx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ATTN_STR_(x) #x
#define ATTN_STR(x) ATTN_STR_(x)

int32_t attn_version(void) { return ATTN_VERSION; }

const char *attn_version_string(void) {
  return ATTN_STR(ATTN_VERSION_MAJOR) "." ATTN_STR(ATTN_VERSION_MINOR) "." ATTN_STR(
      ATTN_VERSION_PATCH);
}

const char *attn_status_string(attn_status status) {
  switch (status) {
#define ATTN_STATUS_CASE_(name, code, text)                                                        \
  case ATTN_STATUS_##name:                                                                         \
    return text;
    ATTN_STATUS_MAP(ATTN_STATUS_CASE_)
#undef ATTN_STATUS_CASE_
  case ATTN_STATUS_COUNT:
    break;
  }
  return "unknown status";
}

attn_status attn_ctx_create(attn_ctx **ctx) {
  if (ctx == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  *ctx = calloc(1, sizeof **ctx);
  if (*ctx == NULL) return ATTN_STATUS_OUT_OF_MEMORY;
  (*ctx)->log_max = ATTN_LOG_LEVEL_ERROR;
  return ATTN_STATUS_OK;
}

void attn_ctx_destroy(attn_ctx *ctx) {
  if (ctx == NULL) return;
  attn_ctx_exec_free(ctx->exec);
  free(ctx);
}

const char *attn_ctx_last_error(const attn_ctx *ctx) {
  if (ctx == NULL) return "ctx is NULL: no context to report on";
  return ctx->last_error;
}

attn_status attn_ctx_last_status(const attn_ctx *ctx) {
  return ctx == NULL ? ATTN_STATUS_INVALID_ARGUMENT : ctx->last_status;
}

attn_status attn_ctx_set_log_callback(attn_ctx *ctx, attn_log_fn fn, void *user,
                                      attn_log_level max_level) {
  if (ctx == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  if ((int)max_level < 0 || max_level >= ATTN_LOG_LEVEL_COUNT)
    return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                     "max_level=%d is not an attn_log_level (0..%d)", (int)max_level,
                     ATTN_LOG_LEVEL_COUNT - 1);
  ctx->log_fn = fn;
  ctx->log_user = user;
  ctx->log_max = max_level;
  return attn_succeed(ctx);
}

attn_status attn_ctx_set_num_threads(attn_ctx *ctx, int32_t num_threads) {
  if (ctx == NULL) return ATTN_STATUS_INVALID_ARGUMENT;
  if (num_threads < 0)
    return attn_fail(ctx, ATTN_STATUS_INVALID_ARGUMENT,
                     "num_threads=%d must be >= 0 (0 = the implementation's choice)",
                     (int)num_threads);
  ctx->num_threads = num_threads;
  return attn_succeed(ctx);
}

static void attn_vlog(attn_ctx *ctx, attn_log_level level, const char *fmt, va_list args) {
  if (ctx == NULL || ctx->log_fn == NULL || level > ctx->log_max) return;
  char message[ATTN_MESSAGE_SIZE];
  vsnprintf(message, sizeof message, fmt, args);
  ctx->log_fn(ctx->log_user, level, message);
}

void attn_log(attn_ctx *ctx, attn_log_level level, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  attn_vlog(ctx, level, fmt, args);
  va_end(args);
}

attn_status attn_fail(attn_ctx *ctx, attn_status status, const char *fmt, ...) {
  if (ctx == NULL) return status;
  va_list args;
  va_start(args, fmt);
  vsnprintf(ctx->last_error, sizeof ctx->last_error, fmt, args);
  va_end(args);
  ctx->last_status = status;
  attn_log(ctx, ATTN_LOG_LEVEL_ERROR, "%s: %s", attn_status_string(status), ctx->last_error);
  return status;
}

attn_status attn_succeed(attn_ctx *ctx) {
  if (ctx != NULL) {
    ctx->last_status = ATTN_STATUS_OK;
    ctx->last_error[0] = '\0';
  }
  return ATTN_STATUS_OK;
}
